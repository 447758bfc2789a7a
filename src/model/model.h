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

typedef struct ds_model {
    ds_config cfg;
    ds_backend *be;
    ds_model_weights w; /* backend-prepared weights */
    int max_tokens;     /* rows per step the scratch holds */
    int max_out;        /* logit rows per step */
    ds_model_scratch s;
    ds_model_weights *dummy_host; /* host dummy weights this model owns (else NULL) */
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

/* Cache sized for this model (n_slots sequences, max_len tokens each). */
ds_status ds_model_cache_create(ds_model *m, int n_slots, int max_len, int block_size,
                                ds_cache **out, ds_error *err);

/* Helpers for 2-D tensor views. */
static inline ds_tensor ds_view2d(void *data, ds_dtype dt, int64_t rows, int64_t cols) {
    ds_tensor t = {data, dt, 2, {rows, cols, 1, 1}};
    return t;
}

#endif
