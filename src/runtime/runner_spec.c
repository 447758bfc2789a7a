/* runner_spec.c — the runner's speculative steps (runner.h): acceptance on the device set up
 * (token-buffer regions, the two halves of chained steps, sampled verifications), the host's
 * verification and commit, the MTP draft passes, and the steps chained behind a verification
 * in flight. The batches and the step graphs they replay are runner.c's. */
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "core/env.h"
#include "runtime/runner.h"
#include "runtime/runner_internal.h"
#include "runtime/spec.h"
#include "runtime/step_graph.h"

static atomic_uint g_samp_setter; /* bans_id of the runner that set a sampling table last */

/* Acceptance on the device (runner.h ds_runner_step_ahead): on with device drafts when the
 * backend has spec_accept, the lm_head + argmax run fused (DS_OPT_FUSED_ARGMAX: the ids can
 * stay on the device), the token buffer has room after the drafts' k·S entries for S·(k+1)
 * ids, S counts and S·(k+1) next tokens, and DS_OPT_SPEC_DEVICE_ACCEPT allows: by default only
 * where verifications run from step graphs (a device backend, whose host work can overlap the
 * device's: the CPU backend finishes every op before the host goes on, so there is nothing to
 * overlap), with =1 on any backend (the tests), with =0 nowhere. A verification whose shape has
 * no graph then runs fused eagerly. Returns false only when out of memory. */
bool dev_accept_init(ds_runner *r) {
    const ds_backend_ops *op = r->model->be->ops;
    const int64_t S = r->max_seqs, K1 = r->k + 1;
    /* token buffer: the drafts' k·S entries, S·(k+1) ids, S counts, S·(k+1) next tokens — one
     * region each: the ops that read a verification's ids and counts (spec_accept, its
     * copy_tokens) run right behind it, before the next one writes them, so two in flight
     * need halves only on the host (the copies) and in the shift table (two halves of 2·S
     * entries: a chained verification's draft pass 0 reads the shift the one before wrote
     * after that one's successor wrote its own) */
    const int64_t end = r->k * S + 2 * S * K1 + S;
    const bool wanted = ds_env_switch("DS_OPT_SPEC_DEVICE_ACCEPT", graph_off_reason(r) == NULL);
    r->dev_accept = wanted && op->spec_accept != NULL && op->argmax_logits != NULL &&
                    ds_env_switch("DS_OPT_FUSED_ARGMAX", true) && end <= DS_TOKEN_BUF &&
                    4 * S <= DS_SHIFT_TABLE;
    if (!r->dev_accept) return true;
    r->ids_at = (int)(r->k * S);
    r->m_at = (int)(r->ids_at + S * K1);
    r->next_at = (int)(r->m_at + S);
    r->chain = ds_env_switch("DS_OPT_SPEC_ASYNC", true);
    const size_t snap = (size_t)r->next_at; /* a step's copy_tokens: drafts, ids, counts */
    for (int h = 0; h < 2; h++) {
        r->tb_h[h] = calloc(snap, sizeof(int32_t));
        r->land_slot[h] = malloc((size_t)S * sizeof(int32_t));
        r->land_k[h] = malloc((size_t)S * sizeof(int32_t));
        if (!r->tb_h[h] || !r->land_slot[h] || !r->land_k[h]) return false;
    }
    r->row0_h[1] = malloc((size_t)S * sizeof(int32_t));
    r->pshift = malloc((size_t)S * sizeof(int32_t));
    r->oshift = malloc((size_t)S * sizeof(int32_t));
    r->vshift = malloc((size_t)S * sizeof(int32_t));
    r->last_row = malloc((size_t)S * sizeof(int32_t));
    r->ahead_pos = calloc((size_t)S, sizeof(int32_t));
    /* sampled verifications: every row's logits, then spec_sample (the table holds one row
     * per sequence of a step) */
    r->dev_sample = op->spec_sample != NULL && op->set_spec_sampling != NULL &&
                    S <= DS_SPEC_SAMPLING_MAX && ds_env_switch("DS_OPT_SPEC_DEVICE_SAMPLE", true);
    if (r->dev_sample) r->samp = malloc((size_t)S * sizeof(ds_spec_sampling));
    return r->row0_h[1] && r->pshift && r->oshift && r->vshift && r->last_row && r->ahead_pos &&
           (!r->dev_sample || r->samp);
}

void ds_runner_set_sampling(ds_runner *r, const ds_spec_sampling *items, int n) {
    r->sampled = items != NULL;
    if (!items) return;
    DS_ASSERT(r->dev_sample && n > 0 && n <= r->max_seqs);
    const bool same = atomic_load(&g_samp_setter) == r->bans_id && n <= r->samp_n &&
                      memcmp(r->samp, items, (size_t)n * sizeof *items) == 0;
    if (same) return;
    ds_backend *be = r->model->be;
    memcpy(r->samp, items, (size_t)n * sizeof *items);
    r->samp_n = n;
    be->ops->set_spec_sampling(be, items, n);
    r->samp_uploads++;
    atomic_store(&g_samp_setter, r->bans_id);
}

/* Makes half h current: where the host reads the next verification's ids and counts (half
 * h's copy of the token buffer, at the device offsets), its rows, and its shift-table half
 * (runner.h). */
void use_half(ds_runner *r, int h) {
    r->vpar = h;
    r->ids = r->tb_h[h] + r->ids_at;
    r->dev_m = r->tb_h[h] + r->m_at;
    r->row0 = r->row0_h[h];
    r->shift_at = h * 2 * r->max_seqs;
}

/* Drafts of a device-chained draft call into r->drafts, where host acceptance reads them: from
 * src, a host copy of the token buffer's draft region; n places, place p = slot[p]'s kp[p]
 * drafts. */
static void drafts_land_from(ds_runner *r, const int32_t *src, const int32_t *slot,
                             const int32_t *kp, int n) {
    for (int p = 0; p < n; p++)
        for (int j = 0; j < kp[p]; j++)
            r->drafts[(size_t)slot[p] * (size_t)r->k + (size_t)j] = src[draft_entry(r, j, p)];
}

/* A step whose acceptance is the host's: queues the host copy of the last draft call's drafts
 * (one copy_tokens of the draft region) to come with the step's synchronize. */
void drafts_fetch(ds_runner *r) {
    ds_backend *be = r->model->be;
    if (r->dev_drafts && r->d_unlanded > 0)
        be->ops->copy_tokens(be, 0, r->k * r->max_seqs, r->dh);
}

/* After that synchronize: the fetched drafts into r->drafts. */
void drafts_land(ds_runner *r) {
    drafts_land_from(r, r->dh, r->dslot, r->dkp, r->d_unlanded);
    r->d_unlanded = 0;
}

/* A verification accepted on the device takes over the landing of the last draft call (the
 * drafts it verifies): its one host copy (copy_tokens from entry 0) holds them, and the call
 * after it will overwrite dslot / dkp, so they are kept with its half h until it is read. */
void land_take(ds_runner *r, int h) {
    r->land_n[h] = r->d_unlanded;
    memcpy(r->land_slot[h], r->dslot, (size_t)r->d_unlanded * sizeof(int32_t));
    memcpy(r->land_k[h], r->dkp, (size_t)r->d_unlanded * sizeof(int32_t));
    r->d_unlanded = 0;
}

/* The tail of a verification accepted on the device (current half): spec_accept, then the
 * step's one device → host copy — the draft region, the ids and the counts, into the half's
 * host copy (runner.h) — and the half joins those in flight. */
void accept_on_device(ds_runner *r) {
    ds_backend *be = r->model->be;
    be->ops->spec_accept(be, r->ids_at, r->next_at, r->m_at, r->shift_at);
    be->ops->copy_tokens(be, 0, r->next_at, r->tb_h[r->vpar]);
    DS_ASSERT(r->n_fly < 2);
    r->fly[r->n_fly++] = r->vpar;
}

/* ---- the host's verification ----------------------------------------------------------------- */

ds_status ds_runner_verify(ds_runner *r, const ds_sched_plan *plan, const ds_kv_blocks *kv,
                           ds_error *err) {
    DS_ASSERT(plan->n_items > 0 && plan->n_items <= r->max_seqs && r->k > 0);
    ds_model *m = r->model;
    const ds_backend_ops *op = m->be->ops;
    r->batch = build_batch(r, plan, kv, NULL);
    r->n_out = r->batch.n_out;
    ds_status st = ds_model_forward(m, r->cache, &r->batch, err);
    if (st != DS_OK) return st;
    if (r->n_out > 0) {
        /* greedy decisions need only these ids: no logits leave the device (catalogue 7-9) */
        ds_tensor lg = ds_view2d(m->s.logits.data, DS_DTYPE_F32, r->n_out, r->vocab);
        op->argmax(m->be, &lg, r->ids);
    }
    drafts_fetch(r);
    if ((st = runner_sync(r, err)) != DS_OK) return st;
    drafts_land(r);
    return DS_OK;
}

float *ds_runner_logits(ds_runner *r, int row, int n, ds_error *err) {
    DS_ASSERT(row >= 0 && n >= 1 && row + n <= r->n_out);
    ds_model *m = r->model;
    const size_t V = (size_t)r->vocab;
    m->be->ops->download(m->be, r->logits + (size_t)row * V,
                         (const float *)m->s.logits.data + (size_t)row * V,
                         (size_t)n * V * sizeof(float));
    if (runner_sync(r, err) != DS_OK) return NULL;
    return r->logits + (size_t)row * V;
}

void ds_runner_commit(ds_runner *r, const ds_sched_plan *plan, int i, int n_emitted) {
    const ds_sched_item *it = &plan->items[i];
    if (r->k == 0 || it->n_draft == 0) return; /* in place: nothing to swap */
    DS_ASSERT(n_emitted >= 1 && n_emitted <= it->n_draft + 1);
    /* the state after the last accepted token went n_emitted places on (build_batch) */
    int32_t *cur = &r->gdn_cur[it->seq->slot];
    *cur = ring_fwd(r, *cur, n_emitted);
}

/* ---- draft passes (spec.h) -------------------------------------------------------------------- */

/* One draft pass (spec.h): from its step graph when state_idx ≥ 0 (then keyed by the region's
 * index), else eagerly. */
static ds_status draft_pass(ds_runner *r, const ds_batch *b, const ds_tensor *hidden, int32_t *ids,
                            int keep, long state_idx, ds_error *err) {
    ds_spec_draft_pass p = {r->model, r->cache, b, hidden, ids, keep};
    if (state_idx < 0) return ds_spec_draft_pass_run(&p, err);
    return ds_step_graph_run(r->model->be, r->graph_tag | (uint64_t)state_idx,
                             &r->graph_state[state_idx], b, ds_spec_draft_pass_run, &p, NULL, err);
}

/* ds_runner_draft's passes (ahead = false: after the host accepted and every item was
 * advanced), or ds_runner_step_ahead's (ahead = true: right after spec_accept, items not yet
 * advanced, each verified row's next token at token-buffer entry next_at + row, positions as if
 * every draft was accepted and lowered on the device). With dev_accept every pass carries
 * pos_shift / out_shift (−1 entries unless ahead), so both kinds replay the same graphs. After
 * a chained verification (r->ahead_pos nonzero) pass 0 is lowered as the verification was, and
 * the positions of passes j ≥ 1 are ahead by both guesses, lowered by spec_accept's
 * cumulative shift. */
ds_status draft_passes(ds_runner *r, const ds_sched_plan *plan, const ds_kv_blocks *kv,
                              const int32_t *k_next, bool ahead, ds_error *err) {
    DS_ASSERT(r->k > 0 && (!ahead || r->dev_accept));
    ds_model *m = r->model;
    const int H = m->cfg.hidden, S = r->max_seqs;
    const bool dev = r->dev_drafts, shifts = r->dev_accept;
    ds_batch mb = r->batch;
    /* row t's token t+1: ahead, spec_accept's; else from the sequence's tokens as they are now
     * (prompt, sampled and accepted tokens); rows past the last accepted one get the last token:
     * their MTP KV is rewritten before any query reads it */
    int n_d = 0, max_k = 0;
    for (int i = 0; i < plan->n_items; i++) {
        const ds_sched_seq *q = plan->items[i].seq;
        const int c0 = r->seq_n_past[i];
        for (int t = r->seq_start[i]; t < r->seq_start[i + 1]; t++) {
            int idx = c0 + (t - r->seq_start[i]) + 1;
            r->next[t] = ahead ? 0 : q->tokens[idx < q->n_tokens ? idx : q->n_tokens - 1];
            if (ahead) r->token_src[t] = r->next_at + t;
        }
        /* pass 0 feeds the verified rows where they are: lowered as the verification was */
        if (shifts) r->pshift[i] = ahead && r->chain ? r->vshift[i] : -1;
        DS_ASSERT(k_next[i] >= 0 && k_next[i] <= r->k);
        r->d_k[i] = k_next[i];
        if (k_next[i] > 0) {
            /* insertion by k_next descending (stable): each draft step's sequences are a prefix */
            int p = n_d++;
            while (p > 0 && r->d_k[r->d_order[p - 1]] < k_next[i]) {
                r->d_order[p] = r->d_order[p - 1];
                p--;
            }
            r->d_order[p] = i;
            if (k_next[i] > max_k) max_k = k_next[i];
        }
    }
    int32_t *out_rows = r->out_rows; /* the verification's rows are no longer needed */
    for (int p = 0; p < n_d; p++) {
        int i = r->d_order[p];
        const ds_sched_seq *q = plan->items[i].seq;
        /* the last accepted row; ahead, the last row lowered by the rejected drafts */
        int row = ahead ? r->seq_start[i + 1] - 1
                        : r->seq_start[i] + (q->n_computed - 1 - r->seq_n_past[i]);
        DS_ASSERT(row >= r->seq_start[i] && row < r->seq_start[i + 1]);
        out_rows[p] = row;
        if (shifts) r->oshift[p] = ahead ? r->shift_at + 2 * i : -1; /* its own shift */
    }
    /* graphs of the passes: the serving graphs' conditions; for pass 0 also every item drafting
     * after a verification of one known token + d drafts (the verification graph's shape) */
    const int n = plan->n_items, K1 = r->k + 1;
    const size_t region = ((size_t)S + 1) * (size_t)K1;
    const bool graphs = dev && graph_off_reason(r) == NULL && spec_graphs_ready(r);
    long idx0 = -1;
    if (graphs && n_d == n) {
        const int d = plan->items[0].n_draft;
        bool uniform = true;
        for (int i = 0; i < n; i++)
            uniform = uniform && plan->items[i].n_tokens == 1 && plan->items[i].n_draft == d;
        if (uniform) idx0 = (long)(region + (size_t)n * (size_t)K1 + (size_t)d);
    }
    /* the previous call's drafts were landed, or handed to the verification that verified them
     * (land_take), before this call rewrites dslot / dkp */
    DS_ASSERT(r->d_unlanded == 0);

    mb.tokens = r->next;
    mb.token_src = ahead ? r->token_src : NULL;
    mb.state_out_slots = NULL;
    mb.slot_ring = 0; /* the MTP has no GDN state */
    mb.n_out = n_d;
    mb.out_rows = out_rows;
    mb.pos_shift = shifts ? r->pshift : NULL;
    mb.out_shift = shifts ? r->oshift : NULL;
    if (n_d == 0) {
        ds_status st = ds_mtp_forward(m, r->cache, &mb, &m->s.normed, false, err);
        return st != DS_OK || ahead ? st : runner_sync(r, err);
    }
    const int e0 = draft_entry(r, 0, 0);
    /* device chain: the ids stay in the token buffer (no host copy: runner.h) */
    ds_status st = draft_pass(r, &mb, &m->s.normed, dev ? NULL : r->d_tokens, dev ? e0 : -1,
                              idx0, err);
    if (st != DS_OK) return st;
    if (!dev)
        for (int p = 0; p < n_d; p++)
            r->drafts[(size_t)plan->items[r->d_order[p]].seq->slot * (size_t)r->k] = r->d_tokens[p];

    /* draft step j: each sequence with k_next > j at MTP position c' + j − 1 (c' = its n_computed,
     * the position of its last emitted token), token = its draft j − 1, hidden = its MTP output
     * row of step j − 1 */
    for (int j = 1; j < max_k; j++) {
        int nj = 0;
        while (nj < n_d && r->d_k[r->d_order[nj]] > j) nj++;
        DS_ASSERT(nj > 0);
        for (int p = 0; p < nj; p++) {
            const ds_sched_item *it = &plan->items[r->d_order[p]];
            const ds_sched_seq *q = it->seq;
            /* ahead: not yet advanced, so as if all its drafts were accepted (lowered by the
             * device by the drafts rejected: after a chained verification, by both steps') */
            const int i = r->d_order[p];
            const int32_t pos = q->n_computed + (ahead ? r->ahead_pos[i] + it->n_draft + 1 : 0) +
                                j - 1;
            if (shifts) r->pshift[p] = ahead ? r->shift_at + 2 * i + 1 : -1;
            int held = ds_kv_blocks_held(kv, q->slot);
            DS_ASSERT((int64_t)held * r->block_size > pos && held <= r->max_blocks);
            /* device chain: draft j − 1 of place p is token-buffer entry (j − 1)·S + p */
            r->d_tokens[p] = dev ? 0 : ds_runner_drafts(r, q->slot)[j - 1];
            if (dev) r->token_src[p] = draft_entry(r, j - 1, p);
            r->d_pos[p] = pos;
            r->d_past[p] = pos;
            r->d_start[p] = p;
            r->d_slot[p] = r->gdn_cur[q->slot];
            out_rows[p] = p;
            memcpy(r->d_table + (size_t)p * (size_t)r->max_blocks, ds_kv_blocks_table(kv, q->slot),
                   (size_t)held * sizeof(int32_t));
        }
        r->d_start[nj] = nj;
        ds_batch db = {.n_tokens = nj, .n_seqs = nj, .tokens = r->d_tokens, .positions = r->d_pos,
                       .seq_start = r->d_start, .seq_slot = r->d_slot, .seq_n_past = r->d_past,
                       .block_table = r->d_table, .max_blocks = r->max_blocks, .n_out = nj,
                       .out_rows = out_rows, .token_src = dev ? r->token_src : NULL,
                       .pos_shift = shifts ? r->pshift : NULL,
                       .out_shift = shifts ? r->oshift : NULL};
        if (shifts)
            for (int p = 0; p < nj; p++) r->oshift[p] = -1;
        ds_tensor hid = ds_view2d(m->mtp.out_h.data, m->mtp.out_h.dtype, nj, H);
        const long idxj = graphs ? (long)(2 * region + (size_t)nj * (size_t)K1 + (size_t)j) : -1;
        const int ej = draft_entry(r, j, 0);
        st = draft_pass(r, &db, &hid, dev ? NULL : r->d_tokens, dev ? ej : -1, idxj, err);
        if (st != DS_OK) return st;
        if (!dev)
            for (int p = 0; p < nj; p++)
                r->drafts[(size_t)plan->items[r->d_order[p]].seq->slot * (size_t)r->k + (size_t)j] =
                    r->d_tokens[p];
    }
    if (!dev) return runner_sync(r, err);
    /* device chain: nothing waits here; the next verification feeds the drafts from the token
     * buffer, and they reach the host with its one copy (land_take) or drafts_fetch */
    r->dgen++;
    if (r->dgen == 0) r->dgen = 1; /* 0 means "no call yet" */
    for (int p = 0; p < n_d; p++) {
        const int slot = plan->items[r->d_order[p]].seq->slot;
        r->dslot[p] = slot;
        r->dkp[p] = r->d_k[r->d_order[p]];
        r->slot_dgen[slot] = r->dgen;
        r->slot_place[slot] = p;
    }
    r->d_unlanded = n_d;
    return DS_OK;
}

ds_status ds_runner_draft(ds_runner *r, const ds_sched_plan *plan, const ds_kv_blocks *kv,
                          const int32_t *k_next, ds_error *err) {
    return draft_passes(r, plan, kv, k_next, false, err);
}

/* ---- steps accepted on the device, chained steps (runner.h) ----------------------------------- */

ds_status ds_runner_wait_ahead(ds_runner *r, ds_error *err) {
    ds_backend *be = r->model->be;
    DS_ASSERT(r->n_fly > 0);
    ds_status st = be->ops->wait_mark ? be->ops->wait_mark(be, err) : runner_sync(r, err);
    if (st != DS_OK) return st;
    /* the oldest in flight is read: the drafts it verified into r->drafts */
    const int h = r->fly[0];
    r->fly[0] = r->fly[1];
    r->n_fly--;
    drafts_land_from(r, r->tb_h[h], r->land_slot[h], r->land_k[h], r->land_n[h]);
    r->land_n[h] = 0;
    return DS_OK;
}

void ds_runner_drop_inflight(ds_runner *r) {
    ds_error ignored = {0};
    if (r->n_fly > 0) (void)runner_sync(r, &ignored); /* let the queued work finish */
    r->n_fly = 0;
    r->land_n[0] = r->land_n[1] = 0;
    /* the drafts of the last call reach no host copy now: its sequences were ended */
    r->d_unlanded = 0;
}

ds_status ds_runner_chain_verify(ds_runner *r, const ds_sched_plan *plan, const ds_kv_blocks *kv,
                                 const int32_t *ahead, ds_error *err) {
    const int n = plan->n_items;
    DS_ASSERT(r->chain && n > 0 && n <= r->max_seqs && ahead);
    ds_backend *be = r->model->be;
    const int d = plan->items[0].n_draft;
    bool uniform = true;
    for (int i = 0; i < n; i++) {
        const ds_sched_item *it = &plan->items[i];
        DS_ASSERT(it->n_tokens == 1 && it->wants_logits && it->n_draft >= 1 && ahead[i] >= 1);
        uniform = uniform && it->n_draft == d;
    }
    /* no bans: the engine chains only steps whose rows are past min_tokens (the table may
     * still hold an earlier step's; clearing it is queued behind the step in flight) */
    if (!bans_sync(r, plan->n_tokens, NULL, NULL, NULL))
        return ds_error_set(err, DS_ERR_INTERNAL, "runner: the backend refused an empty ban table");
    memcpy(r->ahead_pos, ahead, (size_t)n * sizeof(int32_t));
    use_half(r, r->vpar ^ 1); /* V(N)'s ids, rows and counts stay readable in the other half */
    land_take(r, r->vpar);    /* V(N)'s draft passes: the drafts verified now */
    r->batch = build_batch(r, plan, kv, ahead);
    r->n_out = 0;
    ds_batch b = r->batch;
    const ds_step_fn fn = verify_step_fn(r, &b); /* the fused head, or logits + spec_sample */
    greedy_step g = {r, &b, NULL, r->ids_at}; /* ids on the device: accept_on_device copies */
    const bool graphs = uniform && graph_off_reason(r) == NULL && spec_graphs_ready(r);
    const size_t idx = verify_graph_idx(r, n, d);
    ds_status st = graphs ? ds_step_graph_run(be, r->graph_tag | (uint64_t)idx,
                                              &r->graph_state[idx], &b, fn, &g, NULL, err)
                          : fn(&g, err);
    if (st != DS_OK) return st;
    accept_on_device(r);
    return DS_OK;
}

ds_status ds_runner_chain_drafts(ds_runner *r, const ds_sched_plan *plan, const ds_kv_blocks *kv,
                                 const int32_t *k_ahead, ds_error *err) {
    DS_ASSERT(r->chain);
    ds_backend *be = r->model->be;
    if (be->ops->mark) be->ops->mark(be); /* after the chained verification's spec_accept */
    return draft_passes(r, plan, kv, k_ahead, true, err);
}
