/* runner.c — the runner's state and batches, plain and greedy steps (with their ban table),
 * and the step graphs every kind of step replays; the speculative steps are runner_spec.c. */
#include "runtime/runner.h"
#include "runtime/runner_internal.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "core/env.h"
#include "runtime/step_graph.h"
#include "runtime/spec.h"

/* Graph keys: "SRVG" | runner number | sequence count. The runner number keeps two runners on
 * one backend (several engines in a process) from replaying each other's recordings. */
static atomic_uint g_runner_serial;

/* bans_id of the runner that called set_argmax_bans last, on any backend (0: none yet). A
 * backend holds one ban table, so a runner trusts the table it uploaded only while nobody
 * else uploaded since; otherwise it uploads its own again (bans_sync). */
static atomic_uint g_bans_setter;
static atomic_uint g_bans_serial; /* bans_id of the last runner created */

/* greedy_mode 3: greedy ids-only steps with the lm_head and the argmax unfused (logits written,
 * then op->argmax; eager, no graphs): DS_OPT_FUSED_ARGMAX=0 on a backend with argmax_logits,
 * the ablation's "before" of catalogue items 7-8 (deltaserve bench does the same). */
#define GREEDY_UNFUSED 3

/* Catalogue item 6: rows below min_tokens stay on the fused path, their ids banned there, when
 * the runner has one (fused) and the backend a ban table. The host side of the table has a row
 * per output row of a step: max_out (max_seqs, or a verification's max_seqs · (k + 1)).
 * Returns false only when out of memory. */
static bool bans_init(ds_runner *r, bool fused) {
    const ds_backend_ops *op = r->model->be->ops;
    r->device_bans = fused && op->set_argmax_bans && ds_env_switch("DS_OPT_DEVICE_MASKS", true);
    if (!r->device_bans) return true;
    const size_t rows = (size_t)r->max_out;
    r->ban_keys = calloc(rows, sizeof(uint64_t));
    r->ban_table = malloc(rows * DS_RUNNER_MAX_BANS * sizeof(int32_t));
    r->ban_count = calloc(rows, sizeof(int));
    return r->ban_keys && r->ban_table && r->ban_count;
}

/* Greedy decode steps: on when the backend has argmax_logits (or forced), unless
 * DS_SERVE_GRAPHS=0. Returns false only when out of memory. */
static bool greedy_init(ds_runner *r) {
    const ds_backend_ops *op = r->model->be->ops;
    const char *env = getenv("DS_SERVE_GRAPHS");
    if (env && !strcmp(env, "0")) return true;
    if (env && !strcmp(env, "force")) r->greedy_mode = 2;
    else if (op->argmax_logits) r->greedy_mode = 1;
    else return true;
    if (!ds_env_switch("DS_OPT_FUSED_ARGMAX", true)) r->greedy_mode = GREEDY_UNFUSED; /* still ids only */
    r->gids = calloc((size_t)r->max_seqs, sizeof(int32_t));
    r->graph_state = calloc((size_t)r->max_seqs + 1, 1);
    const unsigned serial = atomic_fetch_add(&g_runner_serial, 1u) & 0xffffu;
    r->graph_tag = (UINT64_C(0x53525647) << 32) | ((uint64_t)serial << 16);
    DS_ASSERT(r->max_seqs < (1 << 16));
    const bool fused = op->argmax_logits != NULL && r->greedy_mode != GREEDY_UNFUSED;
    return bans_init(r, fused) && r->gids && r->graph_state;
}

ds_status ds_runner_init(ds_runner *r, ds_model *m, int max_seqs, int max_tokens, int n_blocks,
                         int block_size, int max_blocks, ds_error *err) {
    return ds_runner_init_spec(r, m, max_seqs, max_tokens, n_blocks, block_size, max_blocks, 0,
                               err);
}

ds_status ds_runner_init_spec(ds_runner *r, ds_model *m, int max_seqs, int max_tokens,
                              int n_blocks, int block_size, int max_blocks, int k, ds_error *err) {
    *r = (ds_runner){.model = m, .max_seqs = max_seqs, .max_tokens = max_tokens,
                     .max_blocks = max_blocks, .block_size = block_size, .vocab = m->cfg.vocab,
                     .k = k, .max_out = max_seqs * (k + 1)};
    do r->bans_id = atomic_fetch_add(&g_bans_serial, 1u) + 1u;
    while (r->bans_id == 0); /* 0 means "nobody" in g_bans_setter */
    DS_ASSERT(max_seqs > 0 && max_tokens >= max_seqs && max_blocks > 0 && k >= 0);
    DS_ASSERT(max_tokens <= m->max_tokens && r->max_out <= m->max_out);
    const size_t S = (size_t)max_seqs, T = (size_t)max_tokens, O = (size_t)r->max_out;
    r->tokens = malloc(T * sizeof(int32_t));
    r->positions = malloc(T * sizeof(int32_t));
    r->seq_start = malloc((S + 1) * sizeof(int32_t));
    r->seq_slot = malloc(S * sizeof(int32_t));
    r->seq_n_past = malloc(S * sizeof(int32_t));
    r->block_table = calloc(S * (size_t)max_blocks, sizeof(int32_t));
    r->out_rows = malloc(O * sizeof(int32_t));
    r->logits = malloc(O * (size_t)r->vocab * sizeof(float));
    bool ok = r->tokens && r->positions && r->seq_start && r->seq_slot && r->seq_n_past &&
              r->block_table && r->out_rows && r->logits;
    if (ok && k > 0) {
        const size_t K = (size_t)k;
        r->gdn_cur = malloc(S * sizeof(int32_t));
        r->drafts = calloc(S * K, sizeof(int32_t));
        r->state_out = malloc(T * sizeof(int32_t));
        r->next = malloc(T * sizeof(int32_t));
        r->ids = r->ids_h0 = malloc(O * sizeof(int32_t));
        r->row0 = r->row0_h[0] = malloc(S * sizeof(int32_t));
        r->d_order = malloc(S * sizeof(int32_t));
        r->d_k = malloc(S * sizeof(int32_t));
        r->d_tokens = malloc(S * sizeof(int32_t));
        r->d_pos = malloc(S * sizeof(int32_t));
        r->d_start = malloc((S + 1) * sizeof(int32_t));
        r->d_slot = malloc(S * sizeof(int32_t));
        r->d_past = malloc(S * sizeof(int32_t));
        r->d_table = calloc(S * (size_t)max_blocks, sizeof(int32_t));
        ok = r->gdn_cur && r->drafts && r->state_out && r->next && r->ids && r->row0 &&
             r->d_order && r->d_k && r->d_tokens && r->d_pos && r->d_start && r->d_slot &&
             r->d_past && r->d_table;
        r->dev_drafts = ds_spec_device_drafts(m, k, max_seqs);
        if (ok && r->dev_drafts) {
            r->dh = calloc(K * S, sizeof(int32_t));
            r->token_src = malloc(T * sizeof(int32_t));
            r->dslot = malloc(S * sizeof(int32_t));
            r->dkp = malloc(S * sizeof(int32_t));
            r->slot_dgen = calloc(S, sizeof(uint32_t));
            r->slot_place = calloc(S, sizeof(int32_t));
            ok = r->dh && r->token_src && r->dslot && r->dkp && r->slot_dgen && r->slot_place;
        }
        if (ok && r->dev_drafts) ok = dev_accept_init(r);
        if (ok && r->dev_accept) use_half(r, 0);
        for (int i = 0; ok && i < max_seqs; i++) r->gdn_cur[i] = i * (k + 2);
    }
    if (ok && k == 0) ok = greedy_init(r);
    /* verifications are fused exactly when they run through step graphs (ds_runner_step_graphed) */
    if (ok && k > 0) ok = bans_init(r, graph_off_reason(r) == NULL);
    if (!ok) {
        ds_runner_free(r);
        return ds_error_set(err, DS_ERR_NOMEM, "runner: out of memory for the step buffers "
                            "(%d sequences x %d KV blocks, %d logits rows of %d)",
                            max_seqs, max_blocks, (int)O, m->cfg.vocab);
    }
    /* Speculative: k + 2 GDN state slots per sequence (current + k + 1 spares). */
    ds_cache_desc desc = {.n_slots = max_seqs * (k > 0 ? k + 2 : 1), .n_blocks = n_blocks,
                          .block_size = block_size};
    ds_status st = m->be->ops->cache_create(m->be, &m->cfg, &desc, &r->cache, err);
    if (st != DS_OK) {
        r->cache = NULL;
        ds_runner_free(r);
        return st;
    }
    return DS_OK;
}

void ds_runner_free(ds_runner *r) {
    if (r->ban_rows > 0) {
        /* leave no bans behind for the backend's next user (bench, a later runner); whoever
         * uploaded since now finds the setter changed and uploads its table again */
        r->model->be->ops->set_argmax_bans(r->model->be, NULL, 0, 0);
        atomic_store(&g_bans_setter, r->bans_id);
    }
    if (r->cache) r->model->be->ops->cache_free(r->model->be, r->cache);
    void *bufs[] = {r->tokens,   r->positions, r->seq_start, r->seq_slot, r->seq_n_past,
                    r->block_table, r->out_rows, r->logits, r->gdn_cur,  r->drafts,
                    r->state_out, r->next,     r->ids_h0,    r->row0_h[0], r->d_order,
                    r->d_k,      r->d_tokens,  r->d_pos,     r->d_start,  r->d_slot,
                    r->d_past,   r->d_table,   r->gids,      r->graph_state, r->ban_keys,
                    r->ban_table, r->ban_count, r->dh,   r->token_src, r->dslot, r->dkp,
                    r->slot_dgen, r->slot_place, r->tb_h[0], r->tb_h[1], r->pshift,
                    r->oshift, r->land_slot[0], r->land_slot[1], r->land_k[0], r->land_k[1],
                    r->row0_h[1], r->vshift, r->last_row, r->ahead_pos, r->samp};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) free(bufs[i]);
    *r = (ds_runner){0};
}

/* Token-buffer entry (and dh index) of draft j of place p (runner.h). */
int draft_entry(const ds_runner *r, int j, int p) { return j * r->max_seqs + p; }

/* GDN slot `by` places after `slot` on its sequence's ring: a sequence slot owns the k + 2
 * state slots q·(k + 2) .. q·(k + 2) + k + 1 and uses them in this order, so the slot after m
 * emitted tokens is the current one m places on (ds_runner_commit), and the device can lower
 * a slot named for the case where every draft was accepted by the drafts rejected
 * (ds_batch.slot_ring). */
int32_t ring_fwd(const ds_runner *r, int32_t slot, int by) {
    return ds_slot_ring_back(slot, r->k + 2, -by);
}

/* Fills the staging buffers from the plan; returns the batch that points at them. Sequence i
 * of the batch is plan item i: its tokens [n_computed, n_computed + n) at positions
 * n_computed.., then its drafts (speculative), its block-table row, and logits rows for its last
 * known token (and each draft) if it wants them. */
ds_batch build_batch(ds_runner *r, const ds_sched_plan *plan, const ds_kv_blocks *kv,
                            const int32_t *ahead) {
    ds_backend *be = r->model->be;
    const bool spec = r->k > 0;
    int T = 0, n_out = 0;
    bool any_dev = false;
    for (int i = 0; i < plan->n_items; i++) {
        const ds_sched_item *it = &plan->items[i];
        const ds_sched_seq *q = it->seq;
        const int n = it->n_tokens + it->n_draft;
        DS_ASSERT(it->n_draft == 0 || (spec && it->n_draft <= r->k));
        /* chained (runner.h): positions and ring places as if the verification in flight
         * accepted every draft; the device lowers them */
        const int a = ahead ? ahead[i] : 0;
        DS_ASSERT(!ahead || (a >= 1 && it->n_tokens == 1 && it->n_draft > 0 && !it->fresh_slot));
        const int32_t gdn = spec ? ring_fwd(r, r->gdn_cur[q->slot], a) : q->slot;
        const int c0 = q->n_computed + a;
        /* A slot keeps the recurrent state of its previous owner until cleared. */
        if (it->fresh_slot) be->ops->cache_reset_slot(be, r->cache, gdn);
        r->seq_start[i] = T;
        r->seq_slot[i] = gdn;
        r->seq_n_past[i] = c0;
        memcpy(r->tokens + T, q->tokens + q->n_computed, (size_t)it->n_tokens * sizeof(int32_t));
        if (it->n_draft > 0)
            memcpy(r->tokens + T + it->n_tokens, ds_runner_drafts(r, q->slot),
                   (size_t)it->n_draft * sizeof(int32_t));
        if (r->dev_drafts) {
            /* drafts of the last draft call are still in the token buffer: fed from there (their
             * host copies in drafts are stale until drafts_land) */
            const bool on_dev = it->n_draft > 0 && r->dgen != 0 && r->slot_dgen[q->slot] == r->dgen;
            for (int j = 0; j < n; j++) {
                const int jd = j - it->n_tokens; /* draft index */
                r->token_src[T + j] = on_dev && jd >= 0 ? draft_entry(r, jd, r->slot_place[q->slot]) : -1;
            }
            /* chained: the bonus token is spec_accept's next token of the last row */
            if (ahead) r->token_src[T] = r->next_at + r->last_row[i];
            any_dev = any_dev || on_dev || ahead;
        }
        /* V(N)'s own shift: the other half (ds_runner_chain_verify made the new one current) */
        if (r->chain) r->vshift[i] = ahead ? (r->vpar ^ 1) * 2 * r->max_seqs + 2 * i : -1;
        for (int j = 0; j < n; j++) r->positions[T + j] = c0 + j;
        /* Only the blocks the sequence holds: the rest of the row is never read. */
        int held = ds_kv_blocks_held(kv, q->slot);
        DS_ASSERT(held <= r->max_blocks && (int64_t)held * r->block_size >= (int64_t)c0 + n);
        memcpy(r->block_table + (size_t)i * (size_t)r->max_blocks, ds_kv_blocks_table(kv, q->slot),
               (size_t)held * sizeof(int32_t));
        if (spec) {
            /* a verification keeps the state after each of its last known token and drafts in
             * the spares; everything else updates its slot in place */
            for (int j = 0; j < n; j++) r->state_out[T + j] = -1;
            if (it->n_draft > 0) /* the ring's places after the current slot, in order */
                for (int j = 0; j <= it->n_draft; j++)
                    r->state_out[T + it->n_tokens - 1 + j] = ring_fwd(r, gdn, 1 + j);
            r->row0[i] = it->wants_logits ? n_out : -1;
            if (it->wants_logits)
                for (int j = 0; j <= it->n_draft; j++)
                    r->out_rows[n_out++] = T + it->n_tokens - 1 + j;
        } else if (it->wants_logits) {
            r->out_rows[n_out++] = T + n - 1;
        }
        T += n;
        if (r->chain) r->last_row[i] = T - 1;
    }
    r->seq_start[plan->n_items] = T;
    DS_ASSERT(T == plan->n_tokens && T <= r->max_tokens && n_out <= r->max_out);
    DS_ASSERT(spec || n_out == plan->n_out);
    return (ds_batch){
        .n_tokens = T,
        .n_seqs = plan->n_items,
        .tokens = r->tokens,
        .positions = r->positions,
        .seq_start = r->seq_start,
        .seq_slot = r->seq_slot,
        .seq_n_past = r->seq_n_past,
        .block_table = r->block_table,
        .max_blocks = r->max_blocks,
        .n_out = n_out,
        .out_rows = r->out_rows,
        .state_out_slots = spec ? r->state_out : NULL,
        .token_src = any_dev ? r->token_src : NULL,
        /* with chained steps every verification carries them (−1s unless chained), so a
         * chained one replays the same graphs */
        .pos_shift = spec && r->chain ? r->vshift : NULL,
        .slot_ring = spec && r->chain ? r->k + 2 : 0,
    };
}

ds_status runner_sync(ds_runner *r, ds_error *err) {
    return r->model->be->ops->synchronize(r->model->be, err);
}

ds_status ds_runner_step(ds_runner *r, const ds_sched_plan *plan, const ds_kv_blocks *kv,
                         float **logits, ds_error *err) {
    DS_ASSERT(plan->n_items > 0 && plan->n_items <= r->max_seqs && r->k == 0);
    ds_model *m = r->model;
    const ds_backend_ops *op = m->be->ops;
    ds_batch b = build_batch(r, plan, kv, NULL);
    ds_status st = ds_model_forward(m, r->cache, &b, err);
    if (st != DS_OK) return st;
    if (b.n_out > 0)
        op->download(m->be, r->logits, m->s.logits.data,
                     (size_t)b.n_out * (size_t)r->vocab * sizeof(float));
    st = op->synchronize(m->be, err);
    if (st != DS_OK) return st;
    *logits = r->logits;
    return DS_OK;
}

/* The work of a greedy step or a greedy verification (ds_step_fn, ctx a greedy_step): the
 * forward (b->n_out = 0: it stops at the final norm, one row per token) and the lm_head fused
 * with the argmax over every row into ids: r->gids for a decode step (a token per sequence),
 * r->ids for a verification (item i's 1 + n_draft rows start at r->row0[i], the rows
 * ds_runner_verify would give; the MTP draft reads the normed rows next). */
static ds_status greedy_fused_step(void *ctx, ds_error *err) {
    greedy_step *g = ctx;
    ds_model *m = g->r->model;
    /* logits rows would be a second lm_head pass nobody reads (and a graph shape of their own) */
    DS_ASSERT(g->b->n_out == 0);
    ds_status st = ds_model_forward(m, g->r->cache, g->b, err);
    if (st != DS_OK) return st;
    ds_tensor xn = ds_view2d(m->s.normed.data, m->s.normed.dtype, g->b->n_tokens, m->cfg.hidden);
    m->be->ops->argmax_logits(m->be, &xn, &m->w.lm_head, g->ids, g->keep);
    return DS_OK;
}

/* The work of a sampled verification (ds_step_fn; ds_runner_set_sampling): the forward with a
 * logits row for every row (b->out_rows the identity), then spec_sample's target ids into the
 * token buffer at g->keep, where spec_accept reads them as it reads the fused head's argmax. */
static ds_status sampled_verify_step(void *ctx, ds_error *err) {
    greedy_step *g = ctx;
    ds_model *m = g->r->model;
    DS_ASSERT(g->b->n_out == g->b->n_tokens && g->keep >= 0 && !g->ids);
    ds_status st = ds_model_forward(m, g->r->cache, g->b, err);
    if (st != DS_OK) return st;
    ds_tensor lg = ds_view2d(m->s.logits.data, DS_DTYPE_F32, g->b->n_out, m->cfg.vocab);
    m->be->ops->spec_sample(m->be, &lg, g->keep);
    return DS_OK;
}

/* Forward of a greedy decode batch and the next tokens into r->gids: fused lm_head + argmax
 * replayed from this batch size's graph (captured at its first step; eager when it cannot be)
 * when the backend can, else the logits and an argmax over them. */
static ds_status greedy_forward(ds_runner *r, ds_batch *b, ds_error *err) {
    ds_model *m = r->model;
    ds_backend *be = m->be;
    const ds_backend_ops *op = be->ops;
    const int n = b->n_seqs;
    const bool fused = op->argmax_logits != NULL && r->greedy_mode != GREEDY_UNFUSED;
    if (fused) {
        b->n_out = 0;
        greedy_step g = {r, b, r->gids, -1};
        return ds_step_graph_run(be, r->graph_tag | (uint64_t)n, &r->graph_state[n], b,
                                 greedy_fused_step, &g, NULL, err);
    }
    ds_status st = ds_model_forward(m, r->cache, b, err);
    if (st != DS_OK) return st;
    ds_tensor lg = ds_view2d(m->s.logits.data, DS_DTYPE_F32, n, r->vocab);
    op->argmax(be, &lg, r->gids);
    return DS_OK;
}

/* Makes the backend's ban table the one the n output rows of this fused greedy step (a decode
 * step's items, or a verification's rows) need: row i bans fill(i)'s ids when keys[i] != 0
 * (keys NULL: no row). Nothing is built or uploaded when the rows' keys equal those of this
 * runner's last upload and no other runner uploaded since (then the table on the backend is
 * still that one), or when the step needs no bans and nobody ever uploaded any. Returns false
 * when the backend refused the table (it is empty then). */
bool bans_sync(ds_runner *r, int n, const uint64_t *keys, ds_runner_ban_fn fill,
                      void *ctx) {
    ds_backend *be = r->model->be;
    if (!be->ops->set_argmax_bans) return true; /* then no bans exist on this backend */
    DS_ASSERT(n <= r->max_out);
    int rows = 0; /* up to the last banned row */
    if (keys)
        for (int i = 0; i < n; i++)
            if (keys[i]) rows = i + 1;
    DS_ASSERT(rows == 0 || (r->device_bans && fill));
    const unsigned last = atomic_load(&g_bans_setter);
    if (rows == 0 && last == 0) return true;
    bool same = last == r->bans_id && rows == r->ban_rows;
    for (int i = 0; same && i < rows; i++) same = keys[i] == r->ban_keys[i];
    if (same) return true;

    /* rows at stride DS_RUNNER_MAX_BANS, then packed to [rows, n_ban] (-1 padded) in place:
     * row i moves to i·n_ban ≤ i·DS_RUNNER_MAX_BANS, never over a row not yet moved */
    int32_t *tab = r->ban_table;
    int n_ban = 0;
    for (int i = 0; i < rows; i++) {
        int c = keys[i] ? fill(ctx, i, tab + (size_t)i * DS_RUNNER_MAX_BANS, DS_RUNNER_MAX_BANS)
                        : 0;
        DS_ASSERT(c >= 0 && c <= DS_RUNNER_MAX_BANS);
        r->ban_count[i] = c;
        if (c > n_ban) n_ban = c;
    }
    for (int i = 0; i < rows; i++) {
        int32_t *dst = tab + (size_t)i * (size_t)n_ban;
        memmove(dst, tab + (size_t)i * DS_RUNNER_MAX_BANS, (size_t)r->ban_count[i] * sizeof(int32_t));
        for (int j = r->ban_count[i]; j < n_ban; j++) dst[j] = -1;
    }
    const bool ok = be->ops->set_argmax_bans(be, tab, n_ban > 0 ? rows : 0, n_ban);
    r->ban_uploads++;
    atomic_store(&g_bans_setter, r->bans_id);
    r->ban_rows = ok ? rows : 0;
    if (ok && rows > 0) memcpy(r->ban_keys, keys, (size_t)rows * sizeof(uint64_t));
    return ok;
}

ds_status ds_runner_step_greedy(ds_runner *r, const ds_sched_plan *plan, const ds_kv_blocks *kv,
                                const int32_t **ids, ds_error *err) {
    return ds_runner_step_greedy_bans(r, plan, kv, NULL, NULL, NULL, ids, err);
}

ds_status ds_runner_step_greedy_bans(ds_runner *r, const ds_sched_plan *plan,
                                     const ds_kv_blocks *kv, const uint64_t *keys,
                                     ds_runner_ban_fn fill, void *ctx, const int32_t **ids,
                                     ds_error *err) {
    DS_ASSERT(r->greedy_mode && r->k == 0 && plan->n_items > 0 && plan->n_items <= r->max_seqs);
    const ds_backend_ops *op = r->model->be->ops;
    for (int i = 0; keys && !r->device_bans && i < plan->n_items; i++) DS_ASSERT(keys[i] == 0);
    if (op->argmax_logits && r->greedy_mode != GREEDY_UNFUSED &&
        !bans_sync(r, plan->n_items, keys, fill, ctx)) {
        r->device_bans = false; /* refused: too large for it */
        *ids = NULL;
        return DS_OK;
    }
    ds_batch b = build_batch(r, plan, kv, NULL);
    DS_ASSERT(b.n_tokens == b.n_seqs && b.n_out == b.n_seqs); /* one token, one row each */
    ds_status st = greedy_forward(r, &b, err);
    if (st != DS_OK) return st;
    if ((st = r->model->be->ops->synchronize(r->model->be, err)) != DS_OK) return st;
    *ids = r->gids;
    return DS_OK;
}

/* ---- serving steps through step graphs, saying why when not (runtime/graph_warmup.h) -------- */

/* Why r records no graphs of its serving steps; NULL when it does. */
const char *graph_off_reason(const ds_runner *r) {
    const ds_backend_ops *op = r->model->be->ops;
    if (!op->graph_begin || !op->graph_end || !op->graph_launch)
        return "the backend records no step graphs";
    if (!op->argmax_logits) return "the backend has no fused lm_head + argmax (argmax_logits)";
    if (r->k == 0) {
        if (r->greedy_mode == 0) return "DS_SERVE_GRAPHS=0: greedy steps take the logits path";
        if (r->greedy_mode == GREEDY_UNFUSED)
            return "DS_OPT_FUSED_ARGMAX=0: greedy steps run the lm_head and the argmax unfused, "
                   "eagerly";
        return NULL;
    }
    const char *env = getenv("DS_SERVE_GRAPHS");
    if (env && !strcmp(env, "0")) return "DS_SERVE_GRAPHS=0";
    if (!ds_env_switch("DS_OPT_FUSED_ARGMAX", true))
        return "DS_OPT_FUSED_ARGMAX=0: verification takes the logits and a separate argmax";
    if (!ds_env_switch("DS_OPT_SPEC_GRAPHS", true)) return "DS_OPT_SPEC_GRAPHS=0";
    return NULL;
}

/* Graph states and key tag of a speculative runner, made at first use: four regions of
 * ds_runner_spec_graph_states / 4 states, each indexed n · (k + 1) + d for n sequences: the
 * verifications with d drafts each, the draft passes 0 over them (d drafts verified), the
 * draft passes j = d ≥ 1 of n sequences, and the sampled verifications with d drafts each. */
bool spec_graphs_ready(ds_runner *r) {
    if (r->graph_state) return true;
    const size_t n_states = ds_runner_spec_graph_states(r);
    DS_ASSERT(n_states < ((size_t)1 << 16));
    r->graph_state = calloc(n_states, 1);
    if (!r->graph_state) return false;
    const unsigned serial = atomic_fetch_add(&g_runner_serial, 1u) & 0xffffu;
    r->graph_tag = (UINT64_C(0x53525653) << 32) | ((uint64_t)serial << 16); /* "SRVS" */
    return true;
}

ds_status ds_runner_step_graphed(ds_runner *r, const ds_sched_plan *plan, const ds_kv_blocks *kv,
                                 int *graphed, ds_error *why, ds_error *err) {
    return ds_runner_step_graphed_bans(r, plan, kv, NULL, NULL, NULL, graphed, why, err);
}

/* ds_runner_step_graphed_bans, and with k_ahead ds_runner_step_ahead (*drafted: whether it
 * accepted on the device and drafted). */
/* Index in r->graph_state (and r's graph keys) of the verification of n items with d drafts
 * each (runner.h ds_runner_spec_graph_states); both halves replay it (the device keeps one
 * region of ids). */
size_t verify_graph_idx(const ds_runner *r, int n, int d) {
    const size_t sampled = r->sampled ? 3 * ds_runner_spec_graph_region(r) : 0;
    return sampled + (size_t)n * (size_t)(r->k + 1) + (size_t)d;
}

/* The step function of a verification accepted on the device, and its batch's output rows:
 * sampled (every row's logits) or greedy (none: the fused head reads the normed rows). */
ds_step_fn verify_step_fn(const ds_runner *r, ds_batch *b) {
    DS_ASSERT(!r->sampled || b->n_out == b->n_tokens);
    if (r->sampled) return sampled_verify_step;
    b->n_out = 0; /* the forward stops at the final norm */
    return greedy_fused_step;
}

static ds_status graphed_step(ds_runner *r, const ds_sched_plan *plan, const ds_kv_blocks *kv,
                              const uint64_t *keys, ds_runner_ban_fn fill, void *ctx,
                              const int32_t *k_ahead, bool wait, bool *drafted, int *graphed,
                              ds_error *why, ds_error *err) {
    ds_backend *be = r->model->be;
    *drafted = false;
    /* accept on the device and draft right behind (ds_runner_step_ahead) */
    const bool ahead = r->k > 0 && k_ahead && r->dev_accept;
    DS_ASSERT(!keys || r->k > 0); /* decode steps ban through ds_runner_step_greedy_bans */
    DS_ASSERT(!r->sampled || ahead); /* sampled steps are accepted on the device (no bans) */
    int unused;
    if (!graphed) graphed = &unused;
    *graphed = 0;
    const char *off = graph_off_reason(r);
    if (!plan) {
        if (off && why) ds_error_set(why, DS_ERR_UNSUPPORTED, "%s", off);
        return DS_OK;
    }
    const int n = plan->n_items;
    DS_ASSERT(n > 0 && n <= r->max_seqs);
    greedy_step g = {r, NULL, r->gids, -1};
    ds_batch b;
    size_t idx; /* of the shape in r->graph_state and r's graph keys */
    bool eager = false;
    if (r->k == 0) {
        DS_ASSERT(r->greedy_mode);
        if (off) {
            if (why) ds_error_set(why, DS_ERR_UNSUPPORTED, "%s", off);
            const int32_t *ids;
            return ds_runner_step_greedy(r, plan, kv, &ids, err);
        }
        b = build_batch(r, plan, kv, NULL);
        DS_ASSERT(b.n_tokens == n && b.n_out == n); /* one token, one row each */
        idx = (size_t)n;
    } else {
        const int d = plan->items[0].n_draft;
        bool uniform = true;
        for (int i = 0; i < n; i++) {
            const ds_sched_item *it = &plan->items[i];
            uniform = uniform && it->n_tokens == 1 && it->wants_logits && it->n_draft == d;
        }
        if (!off && !uniform) off = "a verification whose items feed different token counts";
        /* accepted on the device, a verification with no graph runs fused eagerly (the engine
         * gave only items that each feed one known token and decide from the ids) */
        eager = off && ahead;
        if (off && !eager) {
            if (why) ds_error_set(why, DS_ERR_UNSUPPORTED, "%s", off);
            return ds_runner_verify(r, plan, kv, err);
        }
        if (!eager && !spec_graphs_ready(r))
            return ds_error_set(err, DS_ERR_NOMEM, "runner: out of memory for graph states");
        /* the fused argmax reads the table from a fixed device address at every run, so a
         * recorded graph replays with whatever table is current: no recording per table */
        if (keys && !bans_sync(r, plan->n_tokens, keys, fill, ctx)) {
            r->device_bans = false; /* refused: too large for it (as k = 0: off from now on) */
            if (why) ds_error_set(why, DS_ERR_UNSUPPORTED, "the backend refused the ban table");
            return ds_runner_verify(r, plan, kv, err);
        }
        r->batch = build_batch(r, plan, kv, NULL);
        r->n_out = 0; /* no logits rows: ds_runner_logits must not be asked for this step */
        b = r->batch;
        idx = verify_graph_idx(r, n, d);
        /* with dev_accept every verification keeps its ids on the device only (one graph per
         * shape serves both kinds of step; the host copy is the step's copy_tokens) */
        g.ids = r->dev_accept ? NULL : r->ids;
        g.keep = r->dev_accept ? r->ids_at : -1;
    }
    ds_step_fn fn = greedy_fused_step;
    if (r->k > 0) fn = verify_step_fn(r, &b);
    else b.n_out = 0;
    g.b = &b;
    DS_ASSERT(!ahead || r->n_fly == 0); /* a first step: nothing in flight */
    if (ahead) land_take(r, r->vpar); /* the drafts verified now come with its copy */
    ds_status st = eager ? fn(&g, err)
                         : ds_step_graph_run(be, r->graph_tag | (uint64_t)idx,
                                             &r->graph_state[idx], &b, fn, &g, why, err);
    *graphed = eager ? 0 : r->graph_state[idx];
    if (st == DS_OK && ahead) {
        /* the backend's batch is still the verification's: accept on the device (with the
         * step's one host copy), mark, queue the draft passes, and wait only for the mark: the
         * ids and the counts arrive while the device still drafts */
        const ds_backend_ops *op = be->ops;
        accept_on_device(r);
        if (op->mark) op->mark(be);
        memset(r->ahead_pos, 0, (size_t)n * sizeof(int32_t)); /* not chained */
        st = draft_passes(r, plan, kv, k_ahead, true, err);
        if (st == DS_OK && wait) st = ds_runner_wait_ahead(r, err);
        *drafted = st == DS_OK;
        return st;
    }
    if (st == DS_OK && r->k > 0) {
        if (r->dev_accept) be->ops->copy_tokens(be, r->ids_at, b.n_tokens, r->ids);
        drafts_fetch(r);
    }
    if (st == DS_OK) st = runner_sync(r, err);
    if (st == DS_OK && r->k > 0) drafts_land(r);
    return st;
}

ds_status ds_runner_step_graphed_bans(ds_runner *r, const ds_sched_plan *plan,
                                      const ds_kv_blocks *kv, const uint64_t *keys,
                                      ds_runner_ban_fn fill, void *ctx, int *graphed,
                                      ds_error *why, ds_error *err) {
    bool drafted;
    return graphed_step(r, plan, kv, keys, fill, ctx, NULL, true, &drafted, graphed, why, err);
}

ds_status ds_runner_step_ahead(ds_runner *r, const ds_sched_plan *plan, const ds_kv_blocks *kv,
                               const uint64_t *keys, ds_runner_ban_fn fill, void *ctx,
                               const int32_t *k_ahead, bool *drafted, int *graphed,
                               ds_error *err) {
    DS_ASSERT(r->k > 0 && plan && k_ahead);
    return graphed_step(r, plan, kv, keys, fill, ctx, k_ahead, true, drafted, graphed, NULL, err);
}

ds_status ds_runner_queue_ahead(ds_runner *r, const ds_sched_plan *plan, const ds_kv_blocks *kv,
                                const uint64_t *keys, ds_runner_ban_fn fill, void *ctx,
                                const int32_t *k_ahead, bool *drafted, int *graphed,
                                ds_error *err) {
    DS_ASSERT(r->k > 0 && plan && k_ahead);
    return graphed_step(r, plan, kv, keys, fill, ctx, k_ahead, false, drafted, graphed, NULL,
                        err);
}
