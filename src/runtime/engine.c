/* engine.c — the engine thread: intake of submissions and cancellations, one batched forward
 * step per loop over everything the scheduler planned, sampling, events out.
 *
 * One loop:
 *   take the submission queue (engine mutex), queue the requests in the scheduler
 *   cancelled requests: out of the scheduler, caches freed at once
 *   plan = ds_scheduler_schedule()     decodes first, then prefill chunks (scheduler.c: policy)
 *   ds_runner_step(plan)               one ds_batch, one forward, one logits download (runner.c)
 *   per sequence that wants logits: sample, accept, push the token, check finish
 *   publish the stats, then deliver the final events of the requests that ended
 *
 * With speculative decoding (opts.num_speculative_tokens = k > 0) steps are engine_spec.c's.
 *
 * A step that is pure greedy decode (every item feeds one token, wants only its argmax: greedy,
 * no penalties, no logprobs) runs through ds_runner_step_greedy_bans when the runner offers it
 * (a backend with fused argmax_logits, graphs when it has them; DS_SERVE_GRAPHS=0 turns it
 * off): only the ids come back, and the sampler just accepts them. Items below their
 * min_tokens join it with their EOS / stop ids banned on the device when the runner can
 * (DS_OPT_DEVICE_MASKS, catalogue item 6; key = the request's serial while it is below
 * min_tokens), else the step takes the logits path.
 *
 * Sequences whose chunk ends mid-prompt get no logits row. The engine sleeps on its condvar
 * when it has nothing to run. Because the stats are published before final events are
 * delivered, a client that saw its request end also sees its caches freed in the stats. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/engine.h"
#include "runtime/engine_internal.h"
#include "runtime/kv_blocks.h"
#include "runtime/request.h"
#include "runtime/runner.h"
#include "runtime/scheduler.h"
#include "runtime/state_slots.h"

_Static_assert(DS_RUNNER_MAX_BANS >= DS_SAMPLER_MAX_EOS + DS_SAMPLING_MAX_STOP_IDS,
               "a greedy row's ban list holds every EOS id and stop_token_id");


void ds_engine_opts_default(ds_engine_opts *o) {
    *o = (ds_engine_opts){
        .max_num_seqs = 16,
        .max_model_len = 4096,
        .max_num_batched_tokens = 2048,
        .max_queue = 256,
        .block_size = 16,
        .num_kv_blocks = 0,
        .num_speculative_tokens = 0,
        .warmup_graphs = DS_GRAPH_WARMUP_ALL,
        .prefix_caching = true,
    };
}

/* ---- finishing requests --------------------------------------------------------------------- */

/* engine_internal.h */
void ds_engine_end_request(ds_engine *e, ds_request *r, ds_finish_reason reason, int stop_token) {
    /* a normal finish leaves its caches to the prefix cache (scheduler.h) */
    if (reason != DS_FINISH_NONE && !r->caches_ahead) ds_scheduler_retire(&e->sched, &r->seq);
    else ds_scheduler_remove(&e->sched, &r->seq);
    r->end_reason = reason;
    r->end_stop_token = stop_token;
    r->next_done = e->done;
    e->done = r;
    if (reason == DS_FINISH_NONE) e->counters.requests_aborted++;
    else e->counters.requests_finished++;
}

static void deliver_done(ds_engine *e) {
    while (e->done) {
        ds_request *r = e->done;
        e->done = r->next_done;
        ds_request_finish(r, r->end_reason, r->end_stop_token); /* r may be freed here */
    }
}

void ds_engine_publish_stats(ds_engine *e) {
    pthread_mutex_lock(&e->mu);
    ds_engine_stats *p = &e->pub;
    *p = e->counters;
    p->running = ds_scheduler_n_running(&e->sched);
    p->waiting = ds_scheduler_n_waiting(&e->sched);
    p->kv_blocks_total = e->kv.n_blocks;
    p->prefix_entries = e->sched.pc.n;
    p->prefix_blocks = ds_scheduler_prefix_blocks(&e->sched);
    p->kv_blocks_used = ds_kv_blocks_n_used(&e->kv) - p->prefix_blocks;
    p->slots_total = e->slots.n_slots;
    p->slots_used = ds_state_slots_n_used(&e->slots) - p->prefix_entries;
    p->prefix_queries = e->sched.prefix_queries;
    p->prefix_hits = e->sched.prefix_hits;
    p->prefix_stored = e->sched.prefix_stored;
    p->prefix_evicted = e->sched.prefix_evicted;
    p->preemptions = e->sched.n_preemptions;
    ds_graph_count(&e->runner, &p->graph_shapes_captured, &p->graph_shapes_eager);
    pthread_mutex_unlock(&e->mu);
}

/* Every request the scheduler holds that the client cancelled (or all of them). */
static void abort_requests(ds_engine *e, bool all) {
    ds_sched_queue *queues[2] = {&e->sched.running, &e->sched.waiting};
    for (int k = 0; k < 2; k++) {
        for (ds_sched_seq *q = queues[k]->head, *next; q; q = next) {
            next = q->next;
            ds_request *r = q->owner;
            if (all || atomic_load(&r->cancel)) ds_engine_end_request(e, r, DS_FINISH_NONE, -1);
        }
    }
}

/* ---- one step ------------------------------------------------------------------------------- */

/* Records and pushes the next token of r (already accepted by its sampler); ends r when it
 * finished. */
static void push_sampled(ds_engine *e, ds_request *r, const ds_sample_result *res_in) {
    const ds_sample_result res = *res_in;
    DS_ASSERT(r->n_generated < r->max_new);
    r->tokens[r->n_prompt + r->n_generated] = res.token;
    r->n_generated++;
    e->counters.generation_tokens++;
    /* Prompt tokens count once per request, when its prompt was first fully processed
     * (recomputation after a preemption is not counted again). */
    if (!r->counted_prompt) {
        e->counters.prompt_tokens += (uint64_t)r->n_prompt;
        r->counted_prompt = true;
    }
    if (!ds_request_push_token(r, &res)) {
        ds_engine_end_request(e, r, DS_FINISH_NONE, -1);
        return;
    }
    int stop_token = -1;
    ds_finish_reason reason = ds_sampler_finish_reason(&r->sampler, res.token, r->n_generated,
                                                       &stop_token);
    if (reason != DS_FINISH_NONE) ds_engine_end_request(e, r, reason, stop_token);
}

/* Samples, records and pushes the next token of r from its logits row ([V], clobbered); ends r
 * when it finished (or when sampling failed). */
static void sample_one(ds_engine *e, ds_request *r, float *row) {
    ds_error err = {0};
    ds_sample_result res;
    if (ds_sampler_sample(&r->sampler, row, r->n_generated, &res, &err) != DS_OK ||
        ds_sampler_accept(&r->sampler, res.token, &err) != DS_OK) {
        ds_engine_end_request(e, r, DS_FINISH_NONE, -1);
        return;
    }
    push_sampled(e, r, &res);
}

/* A plan the greedy decode path can run: every item feeds one token and wants logits, and its
 * next token is the plain argmax (greedy, no penalties, no logprobs, min_tokens reached), or
 * the argmax without its banned ids when it is below min_tokens and the runner bans ids on the
 * device. Fills e->ban_keys: the request's serial for an item whose ids must be banned, else 0. */
static bool greedy_plan(ds_engine *e, const ds_sched_plan *plan) {
    const bool bans = ds_runner_device_bans(&e->runner);
    for (int i = 0; i < plan->n_items; i++) {
        const ds_sched_item *it = &plan->items[i];
        const ds_request *r = it->seq->owner;
        if (it->n_tokens != 1 || it->n_draft != 0 || !it->wants_logits) return false;
        e->ban_keys[i] = 0;
        if (ds_spec_argmax_suffices(&r->sampler, r->n_generated)) continue;
        if (!bans || !ds_spec_argmax_banned_suffices(&r->sampler)) return false;
        const ds_sampler *smp = &r->sampler;
        if (smp->n_eos + smp->params.n_stop_token_ids > 0) e->ban_keys[i] = r->serial;
    }
    return plan->n_items > 0;
}

/* ds_runner_ban_fn: the ids request `item` bans below its min_tokens. */
static int fill_bans(void *ctx, int item, int32_t *ids, int cap) {
    const ds_sched_plan *plan = ctx;
    const ds_request *r = plan->items[item].seq->owner;
    return ds_spec_min_tokens_bans(&r->sampler, ids, cap);
}

/* One greedy decode step (runner.h: fused argmax, step graphs, banned ids): only the ids come
 * back. False, having run nothing, when the runner cannot ban ids after all (the caller runs
 * the plan through the logits path). */
static bool run_step_greedy(ds_engine *e, const ds_sched_plan *plan) {
    ds_error err = {0};
    const int32_t *ids = NULL; /* [plan->n_items] */
    ds_status st = ds_runner_step_greedy_bans(&e->runner, plan, &e->kv, e->ban_keys, fill_bans,
                                              (void *)plan, &ids, &err);
    e->counters.ban_uploads = e->runner.ban_uploads;
    if (st == DS_OK && !ids) return false;
    e->counters.steps++;
    e->counters.greedy_steps++;
    for (int i = 0; i < plan->n_items; i++) {
        ds_request *r = plan->items[i].seq->owner;
        if (st != DS_OK) { /* device failure: the step's requests cannot continue */
            ds_engine_end_request(e, r, DS_FINISH_NONE, -1);
            continue;
        }
        ds_sched_seq_advance(&r->seq, 1, true);
        ds_sample_result res;
        memset(&res, 0, sizeof res);
        res.token = ids[i];
        /* a banned id here means the device argmax fell back (no finite logit left) */
        if (ids[i] < 0 || ids[i] >= e->vocab ||
            ds_sampler_min_tokens_banned(&r->sampler, ids[i], r->n_generated) ||
            ds_sampler_accept(&r->sampler, res.token, &err) != DS_OK) {
            ds_engine_end_request(e, r, DS_FINISH_NONE, -1);
            continue;
        }
        push_sampled(e, r, &res);
    }
    return true;
}

static void run_step(ds_engine *e) {
    if (e->k > 0) {
        ds_engine_run_step_spec(e);
        return;
    }
    const ds_sched_plan *plan = ds_scheduler_schedule(&e->sched);
    if (plan->n_items == 0) {
        /* Nothing can run although sequences wait: impossible, since a sequence alone always
         * fits (submit refuses the others) and nothing is running. */
        DS_ASSERT(ds_scheduler_n_running(&e->sched) + ds_scheduler_n_waiting(&e->sched) == 0);
        return;
    }
    if (ds_runner_greedy_ready(&e->runner) && greedy_plan(e, plan) && run_step_greedy(e, plan))
        return;
    ds_error err = {0};
    float *logits = NULL; /* [plan->n_out, V] */
    ds_status st = ds_runner_step(&e->runner, plan, &e->kv, &logits, &err);
    e->counters.steps++;
    int k = 0; /* logits row of the next sequence that wants one (out_rows order = plan order) */
    for (int i = 0; i < plan->n_items; i++) {
        const ds_sched_item *it = &plan->items[i];
        ds_request *r = it->seq->owner;
        if (st != DS_OK) { /* device failure: the step's requests cannot continue */
            ds_engine_end_request(e, r, DS_FINISH_NONE, -1);
            continue;
        }
        ds_sched_seq_advance(&r->seq, it->n_tokens, it->wants_logits);
        if (!it->wants_logits) continue;
        float *row = logits + (size_t)k++ * (size_t)e->vocab;
        sample_one(e, r, row);
    }
}

/* ---- the thread ----------------------------------------------------------------------------- */

static bool has_work(const ds_engine *e) {
    return ds_scheduler_n_running(&e->sched) + ds_scheduler_n_waiting(&e->sched) > 0;
}

static void *engine_main(void *arg) {
    ds_engine *e = arg;
    for (;;) {
        pthread_mutex_lock(&e->mu);
        while (!e->stopping && !e->sub_head && !e->wake && !has_work(e))
            pthread_cond_wait(&e->cv, &e->mu);
        ds_request *subs = e->sub_head;
        e->sub_head = e->sub_tail = NULL;
        e->pub.waiting += e->n_sub; /* until the next publish, so the queue bound holds */
        e->n_sub = 0;
        e->wake = false;
        bool stopping = e->stopping;
        pthread_mutex_unlock(&e->mu);

        for (ds_request *r = subs, *next; r; r = next) {
            next = r->next_sub;
            r->serial = ++e->n_serial;
            ds_scheduler_add(&e->sched, &r->seq);
        }
        abort_requests(e, stopping); /* cancelled ones (all when stopping) free their caches now */
        if (!stopping && has_work(e)) run_step(e);
        ds_engine_publish_stats(e);
        deliver_done(e);
        if (stopping) break;
    }
    return NULL;
}

/* ---- public API ----------------------------------------------------------------------------- */

void ds_engine_poke_cancel(ds_engine *e) {
    pthread_mutex_lock(&e->mu);
    e->wake = true;
    pthread_cond_signal(&e->cv);
    pthread_mutex_unlock(&e->mu);
}

static ds_status check_spec_opts(const ds_model *m, const ds_engine_opts *o, ds_error *err) {
    const int k = o->num_speculative_tokens;
    if (k < 0 || k > DS_SPEC_MAX_K)
        return ds_error_set(err, DS_ERR_INVALID_ARG,
                            "num_speculative_tokens must be in [0, %d], got %d", DS_SPEC_MAX_K, k);
    if (k == 0) return DS_OK;
    if (!ds_model_has_mtp(m))
        return ds_error_set(err, DS_ERR_UNSUPPORTED,
                            "num_speculative_tokens %d needs an MTP head: the checkpoint has no "
                            "mtp.* tensors or its config sets no mtp_num_hidden_layers",
                            k);
    if (!m->be->ops->concat)
        return ds_error_set(err, DS_ERR_UNSUPPORTED,
                            "the %s backend does not implement the MTP head yet", m->be->ops->name);
    if ((int64_t)o->max_num_seqs * (k + 1) > m->max_out)
        return ds_error_set(err, DS_ERR_INVALID_ARG,
                            "speculative decoding with %d draft tokens needs logits rows for "
                            "max_num_seqs x %d = %d rows; the model was initialised for %d",
                            k, k + 1, o->max_num_seqs * (k + 1), m->max_out);
    return DS_OK;
}

static ds_status check_opts(const ds_model *m, const ds_engine_opts *o, ds_error *err) {
    if (o->max_num_seqs < 1 || o->max_model_len < 1 || o->max_num_batched_tokens < 1 ||
        o->max_queue < 1 || o->block_size < 1 || o->num_kv_blocks < 0)
        return ds_error_set(err, DS_ERR_INVALID_ARG,
                            "engine options: max_num_seqs (%d), max_model_len (%d), "
                            "max_num_batched_tokens (%d), max_queue (%d), block_size (%d) must be "
                            ">= 1 and num_kv_blocks (%d) >= 0",
                            o->max_num_seqs, o->max_model_len, o->max_num_batched_tokens,
                            o->max_queue, o->block_size, o->num_kv_blocks);
    if (o->max_num_batched_tokens < o->max_num_seqs)
        return ds_error_set(err, DS_ERR_INVALID_ARG,
                            "max_num_batched_tokens (%d) must be >= max_num_seqs (%d), or a step "
                            "cannot hold every running decode",
                            o->max_num_batched_tokens, o->max_num_seqs);
    if (o->max_num_batched_tokens > m->max_tokens || o->max_num_seqs > m->max_out)
        return ds_error_set(err, DS_ERR_INVALID_ARG,
                            "the model was initialised for steps of %d tokens / %d logits rows; "
                            "the engine needs max_num_batched_tokens %d / max_num_seqs %d",
                            m->max_tokens, m->max_out, o->max_num_batched_tokens,
                            o->max_num_seqs);
    if (m->cfg.max_position > 0 && o->max_model_len > m->cfg.max_position)
        return ds_error_set(err, DS_ERR_INVALID_ARG,
                            "max_model_len %d exceeds the model's max_position_embeddings %d",
                            o->max_model_len, m->cfg.max_position);
    return check_spec_opts(m, o, err);
}

static void engine_free_parts(ds_engine *e) {
    ds_runner_free(&e->runner);
    ds_graph_report_free(&e->warmup);
    ds_scheduler_free(&e->sched);
    ds_kv_blocks_free(&e->kv);
    ds_state_slots_free(&e->slots);
    free(e->k_next);
    free(e->k_ahead);
    for (int h = 0; h < 2; h++) {
        free(e->chain_plan[h].items);
        free(e->chain_k[h]);
    }
    free(e->chain_ahead);
    free(e->ban_keys);
    free(e->ban_item);
    free(e->samp);
    pthread_mutex_destroy(&e->mu);
    pthread_cond_destroy(&e->cv);
    free(e);
}

ds_status ds_engine_create(ds_model *model, const ds_engine_opts *opts, ds_engine **out,
                           ds_error *err) {
    *out = NULL;
    if (!model || !model->be || !opts)
        return ds_error_set(err, DS_ERR_INVALID_ARG, "engine: model and options are required");
    ds_status st = check_opts(model, opts, err);
    if (st != DS_OK) return st;

    const ds_engine_opts *o = opts;
    int64_t max_blocks = ((int64_t)o->max_model_len + o->block_size - 1) / o->block_size;
    int64_t n_blocks = o->num_kv_blocks > 0 ? o->num_kv_blocks : max_blocks * o->max_num_seqs;
    if (n_blocks > INT32_MAX)
        return ds_error_set(err, DS_ERR_INVALID_ARG,
                            "KV pool of %lld blocks is too large (max_num_seqs %d x max_model_len "
                            "%d / block_size %d)",
                            (long long)n_blocks, o->max_num_seqs, o->max_model_len, o->block_size);

    ds_engine *e = calloc(1, sizeof *e);
    if (!e) return ds_error_set(err, DS_ERR_NOMEM, "engine: out of memory");
    e->model = model;
    e->o = *o;
    e->o.num_kv_blocks = (int)n_blocks;
    e->vocab = model->cfg.vocab;
    pthread_mutex_init(&e->mu, NULL);
    pthread_cond_init(&e->cv, NULL);
    ds_kv_blocks_init(&e->kv, (int)n_blocks, o->block_size, o->max_num_seqs, (int)max_blocks);
    ds_state_slots_init(&e->slots, o->max_num_seqs);
    ds_scheduler_init(&e->sched, o->max_num_seqs, o->max_num_batched_tokens, &e->kv, &e->slots);
    e->k = o->num_speculative_tokens;
    ds_scheduler_set_spec(&e->sched, e->k);
    ds_scheduler_set_prefix_caching(&e->sched, o->prefix_caching);
    e->counters.num_speculative_tokens = e->k;
    e->k_next = ds_xcalloc((size_t)o->max_num_seqs, sizeof(int32_t));
    e->k_ahead = ds_xcalloc((size_t)o->max_num_seqs, sizeof(int32_t));
    for (int h = 0; e->k > 0 && h < 2; h++) {
        e->chain_plan[h].items = ds_xcalloc((size_t)o->max_num_seqs, sizeof(ds_sched_item));
        e->chain_k[h] = ds_xcalloc((size_t)o->max_num_seqs, sizeof(int32_t));
    }
    if (e->k > 0) e->chain_ahead = ds_xcalloc((size_t)o->max_num_seqs, sizeof(int32_t));
    const size_t rows = (size_t)o->max_num_seqs * (size_t)(e->k + 1); /* a step's output rows */
    e->ban_keys = ds_xcalloc(rows, sizeof(uint64_t));
    e->ban_item = ds_xcalloc(rows, sizeof(int32_t));
    e->samp = ds_xcalloc((size_t)o->max_num_seqs, sizeof(ds_spec_sampling));

    st = ds_runner_init_spec(&e->runner, model, o->max_num_seqs, o->max_num_batched_tokens,
                             (int)n_blocks, o->block_size, (int)max_blocks, e->k, err);
    if (st != DS_OK) {
        engine_free_parts(e);
        return st;
    }
    /* every step shape recorded before the first request (graph_warmup.h) */
    st = ds_graph_warmup(&e->runner, &e->kv, o->warmup_graphs, &e->warmup, err);
    if (st != DS_OK) {
        engine_free_parts(e);
        return st;
    }
    ds_engine_publish_stats(e);
    if (pthread_create(&e->thread, NULL, engine_main, e) != 0) {
        engine_free_parts(e);
        return ds_error_set(err, DS_ERR_INTERNAL, "engine: cannot start the engine thread");
    }
    *out = e;
    return DS_OK;
}

void ds_engine_destroy(ds_engine *e) {
    if (!e) return;
    pthread_mutex_lock(&e->mu);
    e->stopping = true;
    pthread_cond_signal(&e->cv);
    pthread_mutex_unlock(&e->mu);
    pthread_join(e->thread, NULL);
    DS_ASSERT(!e->sub_head && !e->done && !has_work(e));
    engine_free_parts(e);
}

static ds_status reject(ds_engine *e, ds_status st) {
    pthread_mutex_lock(&e->mu);
    e->rejected++;
    pthread_mutex_unlock(&e->mu);
    return st;
}

ds_status ds_engine_submit(ds_engine *e, const ds_request_desc *d, ds_request **out,
                           ds_error *err) {
    if (out) *out = NULL;
    if (!e || !d || !out)
        return ds_error_set(err, DS_ERR_INVALID_ARG,
                            "submit: engine, request and output are required");
    const int V = e->vocab;
    ds_status st = ds_sampling_params_validate(&d->params, V, err);
    if (st != DS_OK) return reject(e, st);
    if (d->n_prompt <= 0 || !d->prompt)
        return reject(e, ds_error_set(err, DS_ERR_INVALID_ARG, "prompt is empty"));
    const int64_t total = (int64_t)d->n_prompt + d->params.max_tokens;
    if (total > e->o.max_model_len)
        return reject(e, ds_error_set(err, DS_ERR_INVALID_ARG,
                                      "this model's maximum context length is %d tokens, but %lld "
                                      "tokens were requested (%d in the prompt, %d in max_tokens); "
                                      "reduce the prompt or max_tokens",
                                      e->o.max_model_len, (long long)total, d->n_prompt,
                                      d->params.max_tokens));
    if (!ds_scheduler_fits(&e->sched, total - 1))
        return reject(e, ds_error_set(err, DS_ERR_INVALID_ARG,
                                      "request needs %d KV blocks of %d tokens (%d in the prompt, "
                                      "%d in max_tokens) but the KV pool has %d",
                                      ds_kv_blocks_for_tokens(&e->kv, total - 1), e->o.block_size,
                                      d->n_prompt, d->params.max_tokens, e->kv.n_blocks));
    ds_sampler sampler;
    st = ds_sampler_init(&sampler, &d->params, V, e->model->cfg.eos_ids, e->model->cfg.n_eos, err);
    if (st == DS_OK) st = ds_sampler_add_prompt(&sampler, d->prompt, d->n_prompt, err);
    if (st != DS_OK) {
        ds_sampler_free(&sampler);
        return reject(e, st);
    }
    ds_request *r = ds_request_create(e, d->prompt, d->n_prompt, &sampler);
    if (!r) {
        ds_sampler_free(&sampler);
        return reject(e, ds_error_set(err, DS_ERR_NOMEM, "submit: out of memory for a request of "
                                      "%lld tokens", (long long)total));
    }
    /* (the engine thread has not seen r yet) */
    r->seq.spec = e->k > 0 && ds_spec_request_ok(&d->params);

    pthread_mutex_lock(&e->mu);
    int waiting = e->pub.waiting + e->n_sub;
    bool busy = e->stopping || waiting >= e->o.max_queue;
    if (busy) {
        e->rejected++;
    } else {
        if (e->sub_tail) e->sub_tail->next_sub = r;
        else e->sub_head = r;
        e->sub_tail = r;
        e->n_sub++;
        pthread_cond_signal(&e->cv);
    }
    bool stopping = e->stopping;
    pthread_mutex_unlock(&e->mu);
    if (busy) {
        ds_request_unref(r);
        ds_request_unref(r);
        return stopping ? ds_error_set(err, DS_ERR_BUSY, "the engine is shutting down")
                        : ds_error_set(err, DS_ERR_BUSY,
                                       "the request queue is full (%d waiting, max_queue %d)",
                                       waiting, e->o.max_queue);
    }
    *out = r;
    return DS_OK;
}

void ds_engine_get_stats(ds_engine *e, ds_engine_stats *s) {
    pthread_mutex_lock(&e->mu);
    *s = e->pub;
    s->waiting += e->n_sub;
    s->requests_rejected = e->rejected;
    pthread_mutex_unlock(&e->mu);
}

const ds_graph_report *ds_engine_graph_report(const ds_engine *e) { return &e->warmup; }
