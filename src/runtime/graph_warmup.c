/* graph_warmup.c — see graph_warmup.h. */
#include "runtime/graph_warmup.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Largest n whose uniform step (n sequences of 1 + k tokens) the engine can form: n sequences
 * within max_seqs, n · (1 + k) tokens within the step's budget (beyond it the scheduler trims
 * drafts), n sequences of 1 + k positions within the KV pool and a table row (a real sequence
 * that feeds 1 + k tokens holds at least as many positions). */
static int formable(const ds_runner *r, const ds_kv_blocks *kv) {
    const int per = 1 + r->k;
    const int blocks = ds_kv_blocks_for_tokens(kv, per); /* per scratch sequence */
    if (blocks > kv->max_blocks_per_seq) return 0;
    int n = r->max_seqs;
    if (kv->n_seqs < n) n = kv->n_seqs;
    if (r->max_tokens / per < n) n = r->max_tokens / per;
    if (kv->n_blocks / blocks < n) n = kv->n_blocks / blocks;
    return n;
}

/* Runs the step of n scratch sequences (graph_warmup.h) through ds_runner_step_graphed; with
 * k_next (speculative), then the draft passes serving runs after it (ds_runner_draft: each
 * sequence as if it had emitted its token, k_next[i] = k). */
static ds_status warm_one(ds_runner *r, ds_kv_blocks *kv, int n, ds_sched_seq *seqs,
                          ds_sched_item *items, const int32_t *tok0, int32_t *k_next,
                          int *graphed, ds_error *why, ds_error *err) {
    const int k = r->k;
    for (int i = 0; i < n; i++) {
        seqs[i] = (ds_sched_seq){.n_tokens = 1, .n_computed = 0, .max_tokens = 1 + k, .slot = i,
                                 .spec = k > 0, .n_draft = k, .tokens = tok0,
                                 .state = DS_SCHED_RUNNING, .plan_index = i};
        const bool ok = ds_kv_blocks_append(kv, i, 1 + k);
        DS_ASSERT(ok); /* formable() counted the blocks of an empty pool */
        items[i] = (ds_sched_item){.seq = &seqs[i], .n_tokens = 1, .n_draft = k,
                                   .wants_logits = true, .fresh_slot = true};
    }
    ds_sched_plan plan = {.n_items = n, .items = items, .n_tokens = n * (1 + k), .n_out = n};
    ds_status st = ds_runner_step_graphed(r, &plan, kv, graphed, why, err);
    if (st == DS_OK && k_next) {
        for (int i = 0; i < n; i++) {
            seqs[i].n_computed = 1;
            k_next[i] = k;
        }
        st = ds_runner_draft(r, &plan, kv, k_next, err);
        if (st == DS_OK) st = r->model->be->ops->synchronize(r->model->be, err);
    }
    /* in reverse: the pool's free stack (LIFO) is left exactly as it was */
    for (int i = n - 1; i >= 0; i--) ds_kv_blocks_release(kv, i);
    return st;
}

/* One sampled verification of n scratch sequences (k drafts each: token 0 at position 0, as
 * warm_one's) through ds_runner_step_ahead, serving's path for it: recorded under the sampled
 * verification's key, with its acceptance and draft passes. *graphed as warm_one's; *ran false
 * when the pool lacks the blocks for it (nothing ran). */
static ds_status warm_sampled(ds_runner *r, ds_kv_blocks *kv, int n, ds_sched_seq *seqs,
                              ds_sched_item *items, const int32_t *tok0, int32_t *k_ahead,
                              ds_spec_sampling *samp, int *graphed, bool *ran, ds_error *err) {
    *ran = false;
    const int k = r->k;
    for (int i = 0; i < n; i++) {
        seqs[i] = (ds_sched_seq){.n_tokens = 1, .n_computed = 0, .max_tokens = 2 + 2 * k,
                                 .slot = i, .spec = true, .n_draft = k, .tokens = tok0,
                                 .state = DS_SCHED_RUNNING, .plan_index = i};
        /* the verification's positions and its draft passes' (as if every draft was taken) */
        if (!ds_kv_blocks_append(kv, i, 1 + 2 * k)) {
            while (--i >= 0) ds_kv_blocks_release(kv, i);
            return DS_OK;
        }
        items[i] = (ds_sched_item){.seq = &seqs[i], .n_tokens = 1, .n_draft = k,
                                   .wants_logits = true, .fresh_slot = true};
        k_ahead[i] = k;
        samp[i] = (ds_spec_sampling){.temperature = 1.0f, .top_p = 1.0f};
    }
    ds_sched_plan plan = {.n_items = n, .items = items, .n_tokens = n * (1 + k), .n_out = n};
    *ran = true;
    ds_runner_set_sampling(r, samp, n);
    bool drafted = false;
    ds_status st = ds_runner_step_ahead(r, &plan, kv, NULL, NULL, NULL, k_ahead, &drafted,
                                        graphed, err);
    ds_runner_set_sampling(r, NULL, 0);
    if (st == DS_OK) st = r->model->be->ops->synchronize(r->model->be, err);
    for (int i = n - 1; i >= 0; i--) ds_kv_blocks_release(kv, i);
    return st;
}

static void reset_all_slots(ds_runner *r) {
    ds_backend *be = r->model->be;
    const int n_slots = r->max_seqs * (r->k > 0 ? r->k + 2 : 1); /* as ds_runner_init_spec */
    for (int s = 0; s < n_slots; s++) be->ops->cache_reset_slot(be, r->cache, s);
}

ds_status ds_graph_warmup(ds_runner *r, ds_kv_blocks *kv, int limit, ds_graph_report *rep,
                          ds_error *err) {
    *rep = (ds_graph_report){.k = r->k, .max_seqs = r->max_seqs, .limit = limit};
    const double t0 = now_s();
    rep->n_formable = formable(r, kv);
    ds_error why = {0};
    ds_status st = ds_runner_step_graphed(r, NULL, kv, NULL, &why, err);
    if (st != DS_OK) return st;
    if (why.msg[0]) {
        rep->off = true;
        snprintf(rep->off_why, sizeof rep->off_why, "%s", why.msg);
        return DS_OK;
    }
    if (ds_kv_blocks_n_used(kv) > 0)
        return ds_error_set(err, DS_ERR_INVALID_ARG,
                            "graph warmup: %d KV blocks are held by sequences; the warmup runs "
                            "on scratch sequences before the engine takes requests",
                            ds_kv_blocks_n_used(kv));
    int n_run = rep->n_formable;
    if (limit >= 0 && limit < n_run) n_run = limit;
    if (n_run > DS_GRAPH_WARMUP_MAX) n_run = DS_GRAPH_WARMUP_MAX;
    if (n_run == 0) return DS_OK;

    rep->eager = calloc((size_t)n_run, sizeof *rep->eager);
    ds_sched_seq *seqs = calloc((size_t)n_run, sizeof *seqs);
    ds_sched_item *items = calloc((size_t)n_run, sizeof *items);
    if (!rep->eager || !seqs || !items) {
        free(seqs);
        free(items);
        ds_graph_report_free(rep);
        return ds_error_set(err, DS_ERR_NOMEM, "graph warmup: out of memory");
    }
    const int32_t tok0 = 0; /* every scratch sequence: token 0 at position 0 */
    for (int n = 1; n <= n_run && st == DS_OK; n++) {
        int graphed = 0;
        why = (ds_error){0};
        st = warm_one(r, kv, n, seqs, items, &tok0, NULL, &graphed, &why, err);
        if (st != DS_OK) break;
        rep->n_run = n;
        if (graphed == 1) {
            rep->n_captured++;
            continue;
        }
        ds_graph_shape *s = &rep->eager[rep->n_eager++];
        s->n_seqs = n;
        s->n_tokens = n * (1 + r->k);
        snprintf(s->why, sizeof s->why, "%s",
                 why.msg[0] ? why.msg : "its recording failed at an earlier step");
    }
    /* speculative: the draft passes after each verification shape (pass 0 over the verified
     * rows, passes 1..k-1 of n sequences), after all verifications, which keep the graphs
     * first when the backend's table runs out */
    if (st == DS_OK && r->k > 0 && r->dev_drafts) {
        int32_t *k_next = calloc((size_t)rep->n_run, sizeof(int32_t));
        if (!k_next) st = ds_error_set(err, DS_ERR_NOMEM, "graph warmup: out of memory");
        for (int n = 1; n <= rep->n_run && st == DS_OK; n++) {
            int graphed = 0;
            why = (ds_error){0};
            st = warm_one(r, kv, n, seqs, items, &tok0, k_next, &graphed, &why, err);
        }
        free(k_next);
        ds_graph_count_drafts(r, &rep->n_draft_captured, &rep->n_draft_eager);
        rep->n_draft_run = rep->n_run * r->k;
    }
    if (st == DS_OK && r->k > 0 && r->dev_sample) {
        int32_t *k_ahead = calloc((size_t)rep->n_run, sizeof(int32_t));
        ds_spec_sampling *samp = calloc((size_t)rep->n_run, sizeof *samp);
        if (!k_ahead || !samp) st = ds_error_set(err, DS_ERR_NOMEM, "graph warmup: out of memory");
        for (int n = 1; n <= rep->n_run && st == DS_OK; n++) {
            int graphed = 0;
            bool ran = false;
            st = warm_sampled(r, kv, n, seqs, items, &tok0, k_ahead, samp, &graphed, &ran, err);
            if (!ran) break; /* the pool is too small for n sequences ahead */
            rep->n_sampled_run = n;
            rep->n_sampled_captured += graphed == 1;
        }
        free(k_ahead);
        free(samp);
    }
    free(seqs);
    free(items);
    /* the scratch steps' recurrent states must not reach the first real sequences */
    reset_all_slots(r);
    ds_error sync_err = {0};
    ds_status sync = r->model->be->ops->synchronize(r->model->be, &sync_err);
    if (st == DS_OK && sync != DS_OK) {
        st = sync;
        *err = sync_err;
    }
    rep->seconds = now_s() - t0;
    return st;
}

void ds_graph_report_free(ds_graph_report *rep) {
    free(rep->eager);
    rep->eager = NULL;
    rep->n_eager = 0;
}

void ds_graph_report_print(const ds_graph_report *rep, const char *prefix, FILE *f) {
    const char *what = rep->k > 0 ? "verification" : "decode";
    if (rep->off) {
        fprintf(f, "%sstep graphs: off (%s): every step runs eagerly\n", prefix, rep->off_why);
        return;
    }
    if (rep->n_run == 0) {
        fprintf(f, "%sstep graphs: no warmup (%s): %s shapes are recorded at their first step\n",
                prefix, rep->limit == 0 ? "warmup off" : "no shape can form", what);
        return;
    }
    fprintf(f, "%sstep graphs: %d of %d %s shapes recorded in %.2f s (n = 1..%d sequences x %d "
               "token%s)",
            prefix, rep->n_captured, rep->n_run, what, rep->seconds, rep->n_run, 1 + rep->k,
            rep->k > 0 ? "s" : "");
    if (rep->n_eager == 0) fprintf(f, "; none fell back to eager\n");
    else fprintf(f, "; %d run EAGERLY:\n", rep->n_eager);
    for (int i = 0; i < rep->n_eager; i++)
        fprintf(f, "%s  eager: %d sequences (%d tokens): %s\n", prefix, rep->eager[i].n_seqs,
                rep->eager[i].n_tokens, rep->eager[i].why);
    if (rep->n_draft_run > 0)
        fprintf(f, "%sstep graphs: %d of %d draft passes recorded (n = 1..%d sequences x %d "
                   "passes)%s\n",
                prefix, rep->n_draft_captured, rep->n_draft_run, rep->n_run, rep->k,
                rep->n_draft_captured == rep->n_draft_run ? "" : "; the others run eagerly");
    if (rep->n_sampled_run > 0)
        fprintf(f, "%sstep graphs: %d of %d sampled verification shapes recorded (n = 1..%d "
                   "sequences)%s\n",
                prefix, rep->n_sampled_captured, rep->n_sampled_run, rep->n_sampled_run,
                rep->n_sampled_captured == rep->n_sampled_run ? "" : "; the others run eagerly");
    if (rep->n_run < rep->n_formable)
        fprintf(f, "%sstep graphs: n = %d..%d left to their first step (%s)\n", prefix,
                rep->n_run + 1, rep->n_formable,
                rep->limit >= 0 && rep->limit == rep->n_run ? "the warmup's limit"
                                                            : "the backend keeps 64 graphs");
    if (rep->n_formable < rep->max_seqs)
        fprintf(f, "%sstep graphs: n = %d..%d never form a step of %d tokens per sequence (token "
                   "budget or KV pool)\n",
                prefix, rep->n_formable + 1, rep->max_seqs, 1 + rep->k);
}

void ds_graph_count_drafts(const ds_runner *r, int *captured, int *eager) {
    *captured = *eager = 0;
    if (!r->graph_state || r->k == 0) return;
    const size_t region = ds_runner_spec_graph_region(r); /* draft passes: regions 1 and 2 */
    for (size_t i = region; i < 3 * region; i++) {
        if (r->graph_state[i] > 0) (*captured)++;
        else if (r->graph_state[i] < 0) (*eager)++;
    }
}

void ds_graph_count(const ds_runner *r, int *captured, int *eager) {
    *captured = *eager = 0;
    if (!r->graph_state) return;
    /* the layouts of runner.h ds_runner_step_graphed (speculative: verifications and both
     * kinds of draft pass) */
    const size_t n = r->k > 0 ? ds_runner_spec_graph_states(r) : (size_t)r->max_seqs + 1;
    for (size_t i = 0; i < n; i++) {
        if (r->graph_state[i] > 0) (*captured)++;
        else if (r->graph_state[i] < 0) (*eager)++;
    }
}
