/* engine_spec.c — the engine's speculative steps (opts.num_speculative_tokens = k > 0;
 * runtime/spec.h, runner.h). A step is
 *   ds_runner_verify(plan)             decodes feed [last token, drafts]; argmax ids of every row
 *                                      (all-greedy decodes with one draft count: from a step
 *                                      graph per shape, ds_runner_step_graphed_bans; rows below
 *                                      min_tokens ban their EOS / stop ids there)
 *   per sequence that wants logits: ds_spec_verify (accept drafts, correction/bonus token),
 *     ds_runner_commit (GDN state of the last accepted token), push the 1..k+1 tokens
 *   ds_runner_draft                    the MTP over the step's rows, k drafts per sequence
 * (runtime/spec.h). All-greedy decode verifications go the device way instead (run_ahead):
 *   ds_runner_queue_ahead(plan)        verify, accept on the device, mark, draft: nothing waits
 *   then, while the batch goes on unchanged (chain_next: nothing waits for this loop, every item
 *   drafts and is past min_tokens, KV blocks reserved two steps ahead):
 *     ds_runner_chain_verify           the NEXT verification, queued before this one is read
 *     ds_runner_wait_ahead             this one's ids and counts
 *     ds_runner_chain_drafts           the next one's draft passes
 *     accept this one on the host      (accept_step, from the step's one host copy: the drafts
 *                                      it verified, its ids, the device's counts), and repeat
 *   so the device never idles for the host's acceptance (runner.h "chained steps"). When an item
 *   finishes, the queued step's work for it is dropped and the loop returns to the scheduler. */
#include <pthread.h>
#include <stdio.h>

#include "runtime/engine_internal.h"
#include "runtime/request.h"
#include "runtime/runner.h"
#include "runtime/scheduler.h"

/* Records the tokens one verification emitted (already accepted by the sampler) and pushes them;
 * ends r when it finished (or its channel failed). */
static void emit_tokens(ds_engine *e, ds_request *r, const int32_t *toks,
                        const ds_sample_result *res, const ds_spec_result *vr) {
    for (int t = 0; t < vr->n_emitted; t++) {
        DS_ASSERT(r->n_generated < r->max_new);
        r->tokens[r->n_prompt + r->n_generated] = toks[t];
        r->n_generated++;
        e->counters.generation_tokens++;
        if (!r->counted_prompt) {
            e->counters.prompt_tokens += (uint64_t)r->n_prompt;
            r->counted_prompt = true;
        }
        if (!ds_request_push_token(r, &res[t])) {
            ds_engine_end_request(e, r, DS_FINISH_NONE, -1);
            return;
        }
    }
    if (vr->reason != DS_FINISH_NONE) ds_engine_end_request(e, r, vr->reason, vr->stop_token);
}

/* A verification whose every item is a decode (one known token + its drafts) decided on the
 * device: ds_runner_step_graphed_bans's plan (it checks that the draft counts agree). Greedy
 * items decide from the argmax ids alone; an item below min_tokens qualifies when the runner
 * bans ids on the device (greedy, no penalties, no logprobs). With the runner's dev_sample,
 * sampled items whose processed distribution the device knows (ds_spec_sample_suffices)
 * qualify too: then the whole verification samples on the device (spec_sample; its greedy
 * items take the argmax there), which bans nothing, so no row may need a ban. Fills
 * e->ban_keys per verification row (item i's 1 + n_draft rows after those of the items before
 * it): row j decides output token n_generated + j, so it bans (key = the request's serial)
 * while that is below min_tokens; e->ban_item, its item; e->samp per item, and tells the
 * runner which kind of verification this is (ds_runner_set_sampling). */
static bool spec_graph_plan(ds_engine *e, const ds_sched_plan *plan) {
    const bool bans = ds_runner_device_bans(&e->runner);
    ds_runner_set_sampling(&e->runner, NULL, 0); /* until this plan qualifies */
    int row = 0, n_sampled = 0;
    bool banned = false;
    for (int i = 0; i < plan->n_items; i++) {
        const ds_sched_item *it = &plan->items[i];
        const ds_request *r = it->seq->owner;
        const ds_sampler *smp = &r->sampler;
        if (it->n_tokens != 1 || !it->wants_logits) return false;
        const bool sample = e->runner.dev_sample && ds_spec_sample_suffices(smp, r->n_generated);
        if (!sample && !ds_spec_argmax_suffices(smp, r->n_generated) &&
            (!bans || !ds_spec_argmax_banned_suffices(smp)))
            return false;
        n_sampled += sample;
        e->samp[i] = ds_spec_sampling_of(smp);
        const bool has_bans = smp->n_eos + smp->params.n_stop_token_ids > 0;
        for (int j = 0; j <= it->n_draft; j++, row++) {
            const bool below = r->n_generated + j < smp->params.min_tokens;
            e->ban_keys[row] = below && has_bans ? r->serial : 0;
            e->ban_item[row] = i;
            banned = banned || e->ban_keys[row] != 0;
        }
    }
    if (plan->n_items == 0 || (n_sampled > 0 && banned)) return false;
    ds_runner_set_sampling(&e->runner, n_sampled > 0 ? e->samp : NULL, plan->n_items);
    return true;
}

/* Whether the device alone decides rows n_generated.. of r in the verifications the runner
 * queues now (greedy: the argmax ids; sampled verifications: spec_sample too). */
static bool device_decides(const ds_engine *e, const ds_request *r, int n_generated) {
    return ds_spec_argmax_suffices(&r->sampler, n_generated) ||
           (e->runner.sampled && ds_spec_sample_suffices(&r->sampler, n_generated));
}

typedef struct spec_bans_ctx {
    const ds_engine *e;
    const ds_sched_plan *plan; /* the verification spec_graph_plan filled e->ban_item for */
} spec_bans_ctx;

/* ds_runner_ban_fn of a verification: the ids the request of row `row` bans below min_tokens. */
static int fill_spec_bans(void *ctx, int row, int32_t *ids, int cap) {
    const spec_bans_ctx *c = ctx;
    const ds_request *r = c->plan->items[c->e->ban_item[row]].seq->owner;
    return ds_spec_min_tokens_bans(&r->sampler, ids, cap);
}

/* Drafts for a sequence that may emit left + 1 more tokens: at most k, none when left ≤ 0. */
static int drafts_allowed(const ds_engine *e, int left) {
    return left <= 0 ? 0 : left < e->k ? left : e->k;
}

/* Host acceptance of one verification (plan; st its status): per item, ds_spec_verify from
 * the view's ids (or from logits), the runner's commit, the scheduler's advance, the tokens out,
 * and e->k_next = its drafts for the next step. drafted: accepted on the device and drafted
 * already (k_drafted drafts per item), its count checked against the device's. Items whose
 * request ended since the step was queued (a chained step's, runner.h "chained steps") are
 * skipped: what the device did for them is dropped. next_queued: the verification after this one
 * is in flight already (chained). */
static void accept_step(ds_engine *e, const ds_sched_plan *plan, ds_status st,
                        const ds_runner_view *v, int fused, bool drafted,
                        const int32_t *k_drafted, bool next_queued) {
    ds_runner *rn = &e->runner;
    ds_error err = {0};
    int32_t toks[DS_SPEC_MAX_K + 1];
    ds_sample_result res[DS_SPEC_MAX_K + 1];
    for (int i = 0; i < plan->n_items; i++) {
        const ds_sched_item *it = &plan->items[i];
        ds_request *r = it->seq->owner;
        e->k_next[i] = 0;
        if (r->seq.state != DS_SCHED_RUNNING) continue; /* ended while the step was queued */
        if (st != DS_OK) { /* device failure: the step's requests cannot continue */
            ds_engine_end_request(e, r, DS_FINISH_NONE, -1);
            continue;
        }
        if (!it->wants_logits) {
            ds_sched_seq_advance(&r->seq, it->n_tokens, false);
            continue;
        }
        const int row = v->row0[i], n_rows = 1 + it->n_draft;
        /* a fused step took only items whose ids suffice (rows below min_tokens banned) */
        const bool fast = fused || drafted || ds_spec_argmax_suffices(&r->sampler, r->n_generated);
        float *logits = fast ? NULL : ds_runner_logits(rn, row, n_rows, &err);
        ds_spec_result vr;
        if ((!fast && !logits) ||
            ds_spec_verify(&r->sampler, r->n_generated, ds_runner_drafts(rn, r->seq.slot),
                           it->n_draft, fast ? v->ids + row : NULL, logits, e->vocab, toks, res,
                           &vr, &err) != DS_OK) {
            ds_engine_end_request(e, r, DS_FINISH_NONE, -1);
            continue;
        }
        if (drafted && vr.reason == DS_FINISH_NONE && vr.n_emitted != v->dev_m[i]) {
            /* the device's acceptance placed its drafts for another count: never expected */
            fprintf(stderr, "deltaserve: speculative step: the device accepted %d tokens where "
                    "the host accepted %d; request ended\n", v->dev_m[i], vr.n_emitted);
            ds_engine_end_request(e, r, DS_FINISH_NONE, -1);
            continue;
        }
        /* a finish the host saw before the device's count (a stop token the device accepted
         * past): the chained verification already queued reads the state after the device's
         * count and writes its spares over every other place of the ring, the host's included
         * (caught by test_prefix_cache test_spec_conversations), so the caches are not kept */
        if (drafted && next_queued && vr.n_emitted != v->dev_m[i]) r->caches_ahead = true;
        ds_spec_stats_add(&e->counters.spec, it->n_draft, vr.n_accepted);
        ds_runner_commit(rn, plan, i, vr.n_emitted);
        ds_sched_seq_advance_spec(&r->seq, it->n_tokens, vr.n_emitted);
        emit_tokens(e, r, toks, res, &vr);
        if (r->seq.state == DS_SCHED_RUNNING && r->seq.spec) {
            int left = r->seq.max_tokens - r->seq.n_tokens; /* tokens it may still emit − 1 */
            e->k_next[i] = drafted ? k_drafted[i] : drafts_allowed(e, left);
        }
    }
}

/* True when nothing waits for the engine thread's loop (submissions, cancels, stop): only then
 * may a batch go on in chained steps, which stay inside run_step. */
static bool engine_idle(ds_engine *e) {
    pthread_mutex_lock(&e->mu);
    const bool idle = !e->sub_head && !e->wake && !e->stopping;
    pthread_mutex_unlock(&e->mu);
    return idle;
}

/* Whether the verification after `cur` (in flight, not yet accepted; kd_cur[i] drafts per item
 * from its passes) may be queued now, as nxt with draft counts kd_nxt for the step after it
 * (runner.h "chained steps"): the engine is idle, every item still runs, drafts and is past
 * min_tokens for every row the next verification decides (so the ids alone decide, nothing
 * banned), the step fits max_num_batched_tokens, and its KV blocks can cover every position
 * the chained verification and its draft passes may write (reserved here). Fills nxt, kd_nxt
 * and e->chain_ahead. */
static bool chain_next(ds_engine *e, const ds_sched_plan *cur, const int32_t *kd_cur,
                       ds_sched_plan *nxt, int32_t *kd_nxt) {
    if (!e->runner.chain || !engine_idle(e)) return false;
    for (int i = 0; i < cur->n_items; i++) {
        const ds_sched_item *it = &cur->items[i];
        const ds_sched_seq *q = it->seq;
        const ds_request *r = q->owner;
        /* its next rows decide tokens n_generated + 1 + j at least */
        if (q->state != DS_SCHED_RUNNING || !q->spec || it->n_tokens != 1 || it->n_draft < 1 ||
            kd_cur[i] < 1 || !device_decides(e, r, r->n_generated + 1))
            return false;
    }
    /* the step's token budget (the scheduler cut cur's drafts to it; its passes drafted more) */
    int n_tokens = 0;
    for (int i = 0; i < cur->n_items; i++) n_tokens += 1 + kd_cur[i];
    if (n_tokens > e->o.max_num_batched_tokens) return false;
    for (int i = 0; i < cur->n_items; i++) {
        const ds_sched_item *it = &cur->items[i];
        ds_sched_seq *q = it->seq;
        const int a = it->n_draft + 1; /* positions ahead if cur accepts everything */
        /* as ds_runner_step_ahead's k_ahead, one step further */
        const int left = q->max_tokens - (q->n_tokens + a + kd_cur[i] + 1);
        kd_nxt[i] = drafts_allowed(e, left);
        const int64_t last = (int64_t)q->n_computed + a + kd_cur[i] +
                             (kd_nxt[i] > 1 ? kd_nxt[i] - 1 : 0); /* last position written */
        if (!ds_kv_blocks_append(&e->kv, q->slot, last + 1)) return false;
        e->chain_ahead[i] = a;
        nxt->items[i] = (ds_sched_item){.seq = q, .n_tokens = 1, .n_draft = kd_cur[i],
                                        .wants_logits = true, .fresh_slot = false};
    }
    nxt->n_items = cur->n_items;
    nxt->n_tokens = n_tokens;
    nxt->n_out = cur->n_items;
    nxt->n_preempted = 0;
    return true;
}

/* A verification accepted on the device is in flight (ds_runner_queue_ahead: plan, k_ahead
 * drafts per item). While its batch can go on unchanged (chain_next), the next verification is
 * queued before this one is read; then this one is waited for and accepted on the host, and the
 * chained one becomes the one in flight. Otherwise this one is waited for and accepted, and the
 * engine's loop resumes (the scheduler plans the next step). */
static void run_ahead(ds_engine *e, const ds_sched_plan *plan, int fused) {
    ds_runner *rn = &e->runner;
    const ds_sched_plan *cur = plan;
    const int32_t *kd_cur = e->k_ahead;
    bool chained = false; /* cur was chained */
    for (int h = 0;; h ^= 1) {
        const ds_runner_view v = ds_runner_view_of(rn); /* cur's, before a chain flips halves */
        ds_sched_plan *nxt = &e->chain_plan[h];
        int32_t *kd_nxt = e->chain_k[h];
        const bool chain = chain_next(e, cur, kd_cur, nxt, kd_nxt);
        ds_error err = {0};
        ds_status st = DS_OK;
        if (chain) st = ds_runner_chain_verify(rn, nxt, &e->kv, e->chain_ahead, &err);
        if (st == DS_OK) st = ds_runner_wait_ahead(rn, &err); /* cur's results */
        if (st == DS_OK && chain) st = ds_runner_chain_drafts(rn, nxt, &e->kv, kd_nxt, &err);
        if (st != DS_OK) fprintf(stderr, "deltaserve: speculative step: %s\n", err.msg);
        e->counters.steps++;
        e->counters.ban_uploads = rn->ban_uploads;
        if (st == DS_OK) {
            if (rn->sampled) e->counters.spec_sampled_steps++;
            else e->counters.spec_fused_steps++;
            e->counters.spec_device_accepts++;
            if (chained) e->counters.spec_chained_steps++;
        }
        accept_step(e, cur, st, &v, fused, true, kd_cur, chain && st == DS_OK);
        for (int i = 0; i < cur->n_items; i++)
            if (e->k_next[i] > 0) ds_sched_seq_set_drafts(cur->items[i].seq, e->k_next[i]);
        if (st != DS_OK) { /* the chained step's requests are the same: ended above */
            ds_runner_drop_inflight(rn);
            return;
        }
        if (!chain) return;
        ds_engine_publish_stats(e);
        cur = nxt;
        kd_cur = kd_nxt;
        chained = true;
        fused = 1;
    }
}

/* One speculative step (see the top of this file). */
void ds_engine_run_step_spec(ds_engine *e) {
    const ds_sched_plan *plan = ds_scheduler_schedule(&e->sched);
    if (plan->n_items == 0) {
        DS_ASSERT(ds_scheduler_n_running(&e->sched) + ds_scheduler_n_waiting(&e->sched) == 0);
        return;
    }
    ds_error err = {0};
    ds_runner *rn = &e->runner;
    /* all-greedy verifications replay a graph per shape (runner.h ds_runner_step_graphed_bans);
     * fused: their ids are the argmax with each row's bans, and no logits exist */
    int fused = 0;
    bool drafted = false; /* accepted on the device and drafted already (runner.h) */
    spec_bans_ctx bctx = {e, plan};
    ds_status st;
    if (spec_graph_plan(e, plan)) {
        /* drafts each item may take if all of its drafts are accepted now (its draft passes
         * run before the host knows how many were) */
        for (int i = 0; i < plan->n_items; i++) {
            const ds_sched_seq *q = plan->items[i].seq;
            const int left = q->max_tokens - (q->n_tokens + plan->items[i].n_draft + 1);
            e->k_ahead[i] = q->spec ? drafts_allowed(e, left) : 0;
        }
        st = ds_runner_queue_ahead(rn, plan, &e->kv, e->ban_keys, fill_spec_bans, &bctx,
                                   e->k_ahead, &drafted, &fused, &err);
        if (st == DS_OK && drafted) {
            run_ahead(e, plan, fused); /* waits, accepts, and goes on while it can */
            return;
        }
        if (st != DS_OK) ds_runner_drop_inflight(rn);
    } else {
        st = ds_runner_verify(rn, plan, &e->kv, &err);
    }
    e->counters.steps++;
    e->counters.ban_uploads = rn->ban_uploads;
    if (st == DS_OK && fused) e->counters.spec_fused_steps++;
    const ds_runner_view v = ds_runner_view_of(rn);
    accept_step(e, plan, st, &v, fused, false, NULL, false);
    if (st != DS_OK) return;
    /* drafts for the next step; also fills the MTP's KV over every row this step fed */
    if (ds_runner_draft(rn, plan, &e->kv, e->k_next, &err) != DS_OK) {
        for (int i = 0; i < plan->n_items; i++) {
            ds_request *r = plan->items[i].seq->owner;
            if (r->seq.state != DS_SCHED_NONE) ds_engine_end_request(e, r, DS_FINISH_NONE, -1);
        }
        return;
    }
    for (int i = 0; i < plan->n_items; i++)
        if (e->k_next[i] > 0) ds_sched_seq_set_drafts(plan->items[i].seq, e->k_next[i]);
}
