/* spec_session.c — speculative decoding of one sequence in a ds_session (spec.h): prefill with
 * the MTP filled over the prompt, then verify / accept / roll back / draft steps. */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "runtime/spec.h"

#include <stdatomic.h>

#include "core/env.h"
#include "runtime/step_graph.h"

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

ds_status ds_spec_gen_init(ds_spec_gen *g, ds_session *s, int slot, int k, ds_sampler *sampler,
                           ds_error *err) {
    *g = (ds_spec_gen){.sess = s, .slot = slot, .k = k, .sampler = sampler, .stop_token = -1};
    ds_model *m = s->model;
    if (k < 1 || k > DS_SPEC_MAX_K)
        return ds_error_set(err, DS_ERR_INVALID_ARG,
                            "--num-speculative-tokens must be in [1, %d], got %d", DS_SPEC_MAX_K,
                            k);
    if (!ds_model_has_mtp(m))
        return ds_error_set(err, DS_ERR_UNSUPPORTED,
                            "speculative decoding needs an MTP head: the checkpoint has no mtp.* "
                            "tensors or its config sets no mtp_num_hidden_layers");
    if (!m->be->ops->concat)
        return ds_error_set(err, DS_ERR_UNSUPPORTED,
                            "the %s backend does not implement the MTP head yet", m->be->ops->name);
    if (slot < 0 || slot >= s->n_slots || s->n_spec < k || m->max_out < k + 1 ||
        m->max_tokens < k + 1)
        return ds_error_set(err, DS_ERR_INVALID_ARG,
                            "session/model not set up for %d draft tokens (session n_spec %d, "
                            "model max_out %d)",
                            k, s->n_spec, m->max_out);
    const size_t V = (size_t)m->cfg.vocab, K1 = (size_t)k + 1, T = (size_t)m->max_tokens;
    g->logits = malloc(K1 * V * sizeof(float));
    g->ids = malloc(K1 * sizeof(int32_t));
    g->tokens = malloc(T * sizeof(int32_t));
    g->next = malloc(T * sizeof(int32_t));
    g->out_slots = malloc(K1 * sizeof(int32_t));
    static atomic_uint serial;
    const ds_backend_ops *op = m->be->ops;
    g->graph_tag = (UINT64_C(0x53504543) << 32) |
                   ((uint64_t)(atomic_fetch_add(&serial, 1u) & 0xffffu) << 16);
    g->graphs = op->argmax_logits && op->graph_begin && op->graph_end && op->graph_launch &&
                ds_env_switch("DS_OPT_SPEC_GRAPHS", true) &&
                ds_env_switch("DS_OPT_FUSED_ARGMAX", true);
    g->dev_drafts = ds_spec_device_drafts(m, k, 1);
    if (!g->logits || !g->ids || !g->tokens || !g->next || !g->out_slots) {
        ds_spec_gen_free(g);
        return ds_error_set(err, DS_ERR_NOMEM, "speculative decoding: out of memory");
    }
    return DS_OK;
}

void ds_spec_gen_free(ds_spec_gen *g) {
    free(g->logits);
    free(g->ids);
    free(g->tokens);
    free(g->next);
    free(g->out_slots);
    g->logits = NULL;
    g->ids = g->tokens = g->next = g->out_slots = NULL;
}

/* A batch of one sequence: rows [0, T) at positions pos0.. of the slot. */
static ds_batch one_seq_batch(ds_spec_gen *g, const int32_t *tokens, int T, int pos0,
                              const int32_t *seq_start, const int32_t *seq_slot,
                              const int32_t *seq_n_past) {
    ds_session *s = g->sess;
    DS_ASSERT(T >= 1 && T <= s->model->max_tokens &&
              (int64_t)pos0 + T <= (int64_t)s->blocks_per_seq * s->block_size);
    for (int i = 0; i < T; i++) s->positions[i] = pos0 + i;
    return (ds_batch){
        .n_tokens = T,
        .n_seqs = 1,
        .tokens = tokens,
        .positions = s->positions,
        .seq_start = seq_start,
        .seq_slot = seq_slot,
        .seq_n_past = seq_n_past,
        .block_table = s->block_table + (size_t)g->slot * (size_t)s->blocks_per_seq,
        .max_blocks = s->blocks_per_seq,
        .n_out = 0,
        .out_rows = s->out_rows,
    };
}

/* One draft pass of this generator: from a graph (key graph_tag | key_low, state *state) when
 * the generator records graphs and state is not NULL, else eagerly. */
static ds_status gen_pass(ds_spec_gen *g, const ds_batch *b, const ds_tensor *hidden, int32_t *ids,
                          int keep, uint64_t key_low, signed char *state, ds_error *err) {
    ds_model *m = g->sess->model;
    ds_spec_draft_pass p = {m, g->sess->cache, b, hidden, ids, keep};
    if (!g->graphs || keep < 0 || !state) return ds_spec_draft_pass_run(&p, err);
    return ds_step_graph_run(m->be, g->graph_tag | key_low, state, b, ds_spec_draft_pass_run, &p,
                             NULL, err);
}

/* Drafts for the next step (step 4 of spec.h). The target batch `tb` (rows at positions
 * tb->positions, its final-normed hidden rows still in m->s.normed) is re-run through the MTP
 * with next[] as the tokens; row `last` is the last accepted position, whose output drafts the
 * first token. n_past is already the position of g->pending. With the device chain (spec.h
 * "draft passes"; not with a test hook, which rewrites the drafts on the host) pass j keeps its
 * draft at token-buffer entry j and writes its host copy to drafts[j] at the next synchronize:
 * nothing here waits for the device. */
static ds_status draft(ds_spec_gen *g, ds_batch *tb, int last, ds_error *err) {
    ds_session *s = g->sess;
    ds_model *m = s->model;
    const ds_backend_ops *op = m->be->ops;
    const int remaining = g->sampler->params.max_tokens - g->n_generated;
    const int k_next = g->k < remaining - 1 ? g->k : remaining - 1;
    const bool dev = g->dev_drafts && !g->hook;
    g->n_draft = 0;
    g->drafts_on_dev = false;
    if (k_next <= 0) return DS_OK; /* at most one more token: nothing left to draft */
    double t0 = now_s();
    ds_batch mb = *tb;
    mb.tokens = g->next;
    mb.token_src = NULL;
    mb.state_out_slots = NULL;
    mb.n_out = 1;
    s->out_rows[0] = last;
    mb.out_rows = s->out_rows;
    /* pass 0 over the verified rows: graphed for the verification shapes (1 + d rows, not the
     * prompt's last chunk) */
    const bool verified = tb->n_tokens <= DS_SPEC_MAX_K + 1 && tb->state_out_slots != NULL;
    ds_status st = gen_pass(g, &mb, &m->s.normed, &g->drafts[0], dev ? 0 : -1,
                            UINT64_C(0x100) | (uint64_t)tb->n_tokens,
                            verified ? &g->pass0_state[tb->n_tokens] : NULL, err);
    if (st != DS_OK) return st;
    const int c = s->n_past[g->slot];
    int32_t seq_start[2] = {0, 1}, seq_n_past, src;
    for (int j = 1; j < k_next; j++) {
        /* MTP position c+j-1, token = draft j-1 (at position c+j), hidden = its own output */
        seq_n_past = c + j - 1;
        ds_batch db = one_seq_batch(g, &g->drafts[j - 1], 1, c + j - 1, seq_start,
                                    &s->gdn_cur[g->slot], &seq_n_past);
        src = j - 1;
        if (dev) db.token_src = &src;
        db.n_out = 1;
        s->out_rows[0] = 0;
        ds_tensor hid = ds_view2d(m->mtp.out_h.data, m->mtp.out_h.dtype, 1, m->cfg.hidden);
        st = gen_pass(g, &db, &hid, &g->drafts[j], dev ? j : -1, UINT64_C(0x200) | (uint64_t)j,
                      &g->passj_state[j], err);
        if (st != DS_OK) return st;
    }
    g->n_draft = k_next;
    g->drafts_on_dev = dev;
    if (!dev) {
        if (g->hook) g->hook(g->hook_ctx, g->n_generated, k_next, g->drafts);
        st = op->synchronize(m->be, err);
    }
    g->t_draft += now_s() - t0;
    return st;
}

ds_status ds_spec_gen_prefill(ds_spec_gen *g, const int32_t *prompt, int n_prompt,
                              int32_t *tokens, ds_sample_result *res, int *n_out, ds_error *err) {
    ds_session *s = g->sess;
    ds_model *m = s->model;
    const ds_backend_ops *op = m->be->ops;
    const size_t V = (size_t)m->cfg.vocab;
    *n_out = 0;
    if (n_prompt <= 0) return ds_error_set(err, DS_ERR_INVALID_ARG, "nothing to feed");
    if ((int64_t)n_prompt + g->sampler->params.max_tokens > s->max_len)
        return ds_error_set(err, DS_ERR_INVALID_ARG,
                            "prompt of %d tokens + %d new exceeds the context length %d",
                            n_prompt, g->sampler->params.max_tokens, s->max_len);
    ds_session_reset(s, g->slot);
    g->n_generated = 0;
    g->n_draft = 0;
    g->finished = false;
    g->reason = DS_FINISH_NONE;
    g->stop_token = -1;
    int32_t seq_start[2], seq_slot, seq_n_past;
    ds_status st;
    for (int done = 0; done < n_prompt;) {
        /* the same chunks as ds_session_feed, so plain and speculative runs compute alike */
        const int T = n_prompt - done < m->max_tokens ? n_prompt - done : m->max_tokens;
        const bool last_chunk = done + T == n_prompt;
        seq_start[0] = 0;
        seq_start[1] = T;
        seq_slot = s->gdn_cur[g->slot];
        seq_n_past = done;
        memcpy(g->tokens, prompt + done, (size_t)T * sizeof(int32_t));
        ds_batch b = one_seq_batch(g, g->tokens, T, done, seq_start, &seq_slot, &seq_n_past);
        b.n_out = last_chunk ? 1 : 0;
        s->out_rows[0] = T - 1;
        if ((st = ds_model_forward(m, s->cache, &b, err)) != DS_OK) return st;
        s->n_past[g->slot] = done + T;
        /* token t+1 of every row: the next prompt token, or (last row of the prompt) the first
         * sampled one */
        for (int i = 0; i + 1 < T; i++) g->next[i] = prompt[done + i + 1];
        if (!last_chunk) {
            g->next[T - 1] = prompt[done + T];
            ds_batch mb = b;
            mb.tokens = g->next;
            mb.n_out = 0;
            double t0 = now_s();
            if ((st = ds_mtp_forward(m, s->cache, &mb, &m->s.normed, true, err)) != DS_OK) return st;
            g->t_draft += now_s() - t0;
            done += T;
            continue;
        }
        op->download(m->be, g->logits, m->s.logits.data, V * sizeof(float));
        if ((st = op->synchronize(m->be, err)) != DS_OK) return st;
        if ((st = ds_sampler_sample(g->sampler, g->logits, 0, &res[0], err)) != DS_OK ||
            (st = ds_sampler_accept(g->sampler, res[0].token, err)) != DS_OK)
            return st;
        tokens[0] = res[0].token;
        *n_out = 1;
        g->n_generated = 1;
        g->pending = res[0].token;
        g->reason = ds_sampler_finish_reason(g->sampler, res[0].token, 1, &g->stop_token);
        if (g->reason != DS_FINISH_NONE) {
            g->finished = true;
            return DS_OK;
        }
        g->next[T - 1] = g->pending;
        return draft(g, &b, T - 1, err);
    }
    return DS_OK;
}

/* The work of a greedy verification (ds_step_fn): the target forward with the lm_head fused
 * with the argmax over all n + 1 rows into g->ids (b->n_out = 0: the forward stops at the final
 * norm, whose rows are all needed; they stay in m->s.normed for the draft). */
typedef struct verify_step {
    ds_spec_gen *g;
    const ds_batch *b;
} verify_step;

static ds_status verify_fused_step(void *ctx, ds_error *err) {
    verify_step *v = ctx;
    ds_model *m = v->g->sess->model;
    ds_status st = ds_model_forward(m, v->g->sess->cache, v->b, err);
    if (st != DS_OK) return st;
    ds_tensor xn = ds_view2d(m->s.normed.data, m->s.normed.dtype, v->b->n_tokens, m->cfg.hidden);
    m->be->ops->argmax_logits(m->be, &xn, &m->w.lm_head, v->g->ids, -1);
    return DS_OK;
}

/* verify_fused_step replayed from this draft count's graph, captured at its first use, or eager
 * when the backend cannot capture it. */
static ds_status verify_graphed(ds_spec_gen *g, ds_batch *b, int n, ds_error *err) {
    b->n_out = 0;
    verify_step v = {g, b};
    return ds_step_graph_run(g->sess->model->be, g->graph_tag | (uint64_t)(n + 1),
                             &g->graph_state[n], b, verify_fused_step, &v, NULL, err);
}

ds_status ds_spec_gen_step(ds_spec_gen *g, int32_t *tokens, ds_sample_result *res, int *n_out,
                           ds_error *err) {
    ds_session *s = g->sess;
    ds_model *m = s->model;
    const ds_backend_ops *op = m->be->ops;
    const int V = m->cfg.vocab;
    *n_out = 0;
    DS_ASSERT(!g->finished && g->n_generated >= 1);
    double t0 = now_s();
    const int n = g->n_draft, c = s->n_past[g->slot];
    /* 1. verify [pending, d1..dn] at positions c..c+n, states after each token into spares */
    g->tokens[0] = g->pending;
    memcpy(g->tokens + 1, g->drafts, (size_t)n * sizeof(int32_t));
    int32_t spares[DS_SPEC_MAX_K + 2];
    int n_spares = ds_session_spare_slots(s, g->slot, spares);
    DS_ASSERT(n_spares >= n + 1);
    memcpy(g->out_slots, spares, (size_t)(n + 1) * sizeof(int32_t));
    int32_t seq_start[2] = {0, n + 1}, seq_slot = s->gdn_cur[g->slot], seq_n_past = c;
    ds_batch b = one_seq_batch(g, g->tokens, n + 1, c, seq_start, &seq_slot, &seq_n_past);
    for (int i = 0; i <= n; i++) s->out_rows[i] = i;
    b.n_out = n + 1;
    b.state_out_slots = g->out_slots;
    /* device-chained drafts: draft i is token-buffer entry i (their host copies in drafts land at
     * the synchronize below) */
    int32_t src[DS_SPEC_MAX_K + 1];
    if (g->drafts_on_dev) {
        src[0] = -1;
        for (int i = 1; i <= n; i++) src[i] = i - 1;
        b.token_src = src;
    }
    const bool fast = ds_spec_argmax_suffices(g->sampler, g->n_generated);
    ds_status st;
    if (fast && g->graphs) {
        /* greedy verification from pre-sampled ids (catalogue 9): lm_head fused with the argmax
         * over all n + 1 rows, no logits; the step replayed from a graph per draft count n */
        if ((st = verify_graphed(g, &b, n, err)) != DS_OK) return st;
    } else {
        if ((st = ds_model_forward(m, s->cache, &b, err)) != DS_OK) return st;
        ds_tensor lg = ds_view2d(m->s.logits.data, DS_DTYPE_F32, n + 1, V);
        if (fast)
            op->argmax(m->be, &lg, g->ids); /* greedy: only the ids leave the device */
        else
            op->download(m->be, g->logits, m->s.logits.data,
                         (size_t)(n + 1) * (size_t)V * sizeof(float));
    }

    /* 2. accept */
    if ((st = op->synchronize(m->be, err)) != DS_OK) return st;
    ds_spec_result r;
    st = ds_spec_verify(g->sampler, g->n_generated, g->drafts, n, fast ? g->ids : NULL,
                        fast ? NULL : g->logits, V, tokens, res, &r, err);
    if (st != DS_OK) return st;
    ds_spec_stats_add(&g->stats, n, r.n_accepted);

    /* 3. roll back: pending + the accepted drafts are in the caches; the state after the last
     * of them (row n_emitted - 1) becomes current */
    const int emitted = r.n_emitted;
    s->gdn_cur[g->slot] = g->out_slots[emitted - 1];
    s->n_past[g->slot] = c + emitted;
    g->n_generated += emitted;
    g->pending = tokens[emitted - 1];
    *n_out = emitted;
    g->t_verify += now_s() - t0;
    if (r.reason != DS_FINISH_NONE) {
        g->finished = true;
        g->reason = r.reason;
        g->stop_token = r.stop_token;
        g->n_draft = 0;
        return DS_OK;
    }

    /* 4. draft: row i's token t+1 is the accepted draft / the bonus; rows past the accepted
     * ones get the bonus too (their MTP KV is rewritten before anything reads it) */
    for (int i = 0; i <= n; i++) g->next[i] = i + 1 < emitted ? g->drafts[i] : g->pending;
    return draft(g, &b, emitted - 1, err);
}
