/* model.h — the Qwen3.5 text model bound to a backend: prepared weights plus the activation
 * scratch one step needs. The forward pass (forward.c) is written once against backend.h. */
#ifndef DS_MODEL_H
#define DS_MODEL_H

#include "backend/backend.h"
#include "model/config.h"
#include "model/weights.h"

typedef struct ds_model_scratch {
    /* All activations in backend memory, dtype be->ops->act_dtype, sized for max_tokens rows. */
    ds_tensor resid;  /* [T, H]   residual stream h */
    ds_tensor normed; /* [T, H]   RMSNorm(h), input of the next mixer/FFN */
    ds_tensor proj;   /* [T, P]   mixer input projections (P = max over layer kinds) */
    ds_tensor core;   /* [T, C]   mixer core output before out_proj / FFN hidden (C = max) */
    ds_tensor delta;  /* [T, H]   mixer or FFN output, added to the residual */
    ds_tensor out_h;  /* [R, H]   final-normed hidden rows that need logits */
    ds_tensor logits; /* F32 [R, V] */
} ds_model_scratch;

/* The MTP head's own activations (allocated when the weights carry an MTP head). */
typedef struct ds_mtp_scratch {
    ds_tensor e_n;   /* [T, H]  RMSNorm_emb(embed(token t+1)) */
    ds_tensor h_n;   /* [T, H]  RMSNorm_hid(h_t) */
    ds_tensor cat;   /* [T, 2H] [e_n | h_n], the fc input */
    ds_tensor out_h; /* [R, H]  mtp.norm output of the rows that asked for logits: the hidden
                        input of the next draft step */
} ds_mtp_scratch;

typedef struct ds_model {
    ds_config cfg;
    ds_backend *be;
    ds_model_weights w; /* backend-prepared weights */
    int max_tokens;     /* rows per step the scratch holds */
    int max_out;        /* logit rows per step */
    ds_model_scratch s;
    ds_model_weights *dummy_host; /* host dummy weights this model owns (else NULL) */
    ds_mtp_scratch mtp;           /* zeroed when the model has no MTP head */
    /* Tensor parallelism (parallel/tp.h). When set, the forward calls allreduce(ctx, delta) on
     * the [T, H] output of every row-parallel block (attention o_proj, GDN out_proj, MLP down,
     * whole MoE block) before the residual add: on one rank of N that output is a partial sum,
     * and the callback must leave the full sum there, identical on every rank. NULL (what
     * ds_model_init sets) = one rank, unchanged behaviour. Not applied by ds_mtp_forward. */
    void (*allreduce)(void *ctx, ds_tensor *x);
    void *allreduce_ctx;
} ds_model;

/* Binds host weights to a backend (prepare_weights) and allocates scratch for steps of up to
 * max_tokens tokens of which up to max_out need logits. The host weights must outlive the
 * model on backends that alias them (CPU). */
ds_status ds_model_init(ds_model *m, ds_backend *be, const ds_config *cfg,
                        const ds_model_weights *host, int max_tokens, int max_out, ds_error *err);
/* Same with seeded random weights of realistic scale (--dummy-weights): created on the device
 * when the backend can (ops->dummy_weights), else on the host and prepared. */
ds_status ds_model_init_dummy(ds_model *m, ds_backend *be, const ds_config *cfg, uint64_t seed,
                              int max_tokens, int max_out, ds_error *err);
void ds_model_free(ds_model *m);

/* One forward step over the batch. On return m->s.logits holds F32 [b->n_out, V] logits (backend
 * memory) for the rows b->out_rows, and m->s.out_h their final-normed hidden states. */
ds_status ds_model_forward(ds_model *m, ds_cache *cache, const ds_batch *b, ds_error *err);

/* ---- MTP head (mtp.c) --------------------------------------------------------------------- *
 *
 * One step of the multi-token-prediction head over a batch laid out like a target batch: row t
 * of the batch is position positions[t] of its sequence, tokens[t] is the token at the NEXT
 * position (t+1), hidden [T, H] (backend memory, activation dtype) is h_t: the target model's
 * final-normed hidden state at that position, or for a further draft step the MTP's own
 * post-norm output.
 *   x = fc([RMSNorm_emb(embed(tokens)) ; RMSNorm_hid(hidden)])
 *   x += attn(RMSNorm_in(x))   (gated full attention, its own paged KV: cache layer n_layers,
 *                               RoPE at positions, block tables of the batch)
 *   x += FFN(RMSNorm_post(x));  out = mtp.norm(x)
 * On return m->mtp.out_h [b->n_out, H] holds the post-norm rows b->out_rows and, when logits
 * is true, m->s.logits F32 [b->n_out, V] their logits (shared lm_head); without them the caller
 * runs the head itself (argmax_logits over out_h: the greedy drafts of spec.h). GDN state is
 * not touched (seq_slot is ignored). hidden may be m->s.normed (the target's output of the
 * previous forward) or m->mtp.out_h.
 * DS_ERR_UNSUPPORTED when the model has no MTP head or the backend lacks `concat`. */
bool ds_model_has_mtp(const ds_model *m);
ds_status ds_mtp_forward(ds_model *m, ds_cache *cache, const ds_batch *b, const ds_tensor *hidden,
                         bool logits, ds_error *err);
/* Scratch of the MTP head; called by ds_model_init / ds_model_free. */
ds_status ds_mtp_scratch_alloc(ds_model *m, ds_error *err);
void ds_mtp_scratch_free(ds_model *m);

/* Cache sized for this model (n_slots sequences, max_len tokens each). */
ds_status ds_model_cache_create(ds_model *m, int n_slots, int max_len, int block_size,
                                ds_cache **out, ds_error *err);

/* Helpers for 2-D tensor views. */
static inline ds_tensor ds_view2d(void *data, ds_dtype dt, int64_t rows, int64_t cols) {
    ds_tensor t = {data, dt, 2, {rows, cols, 1, 1}};
    return t;
}

#endif
