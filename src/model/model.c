/* model.c — binding a model to a backend: weights (from a checkpoint or dummy), activation
 * scratch sized once for the largest step, caches. */
#include "model/model.h"

#include <stdlib.h>

#include "model/dummy_weights.h"

static int64_t max64(int64_t a, int64_t b) { return a > b ? a : b; }

/* Widest mixer/FFN projection and core output over the layer kinds this config has. */
static void scratch_widths(const ds_config *c, int64_t *proj_w, int64_t *core_w) {
    int64_t p = 0, k = 0;
    const int64_t gdn_proj = ds_config_gdn_conv_dim(c) + (int64_t)c->gdn_v_heads * c->gdn_v_dim +
                             2 * (int64_t)c->gdn_v_heads;
    const int64_t attn_proj = (int64_t)c->n_heads * c->head_dim * 2 +
                              2 * (int64_t)c->n_kv_heads * c->head_dim;
    p = max64(gdn_proj, attn_proj);
    k = max64((int64_t)c->gdn_v_heads * c->gdn_v_dim, (int64_t)c->n_heads * c->head_dim);
    if (!c->is_moe) {
        p = max64(p, 2 * (int64_t)c->mlp_inter); /* gate|up */
        k = max64(k, c->mlp_inter);
    }
    *proj_w = p;
    *core_w = k;
}

static ds_status alloc_act(ds_model *m, ds_tensor *t, int64_t rows, int64_t cols, ds_dtype dt,
                           ds_error *err) {
    size_t bytes = (size_t)rows * (size_t)cols * ds_dtype_size(dt);
    void *p = m->be->ops->alloc(m->be, bytes);
    if (!p)
        return ds_error_set(err, DS_ERR_NOMEM, "cannot allocate %zu bytes of activations", bytes);
    *t = ds_view2d(p, dt, rows, cols);
    return DS_OK;
}

/* Allocates the scratch once weights are in place. */
static ds_status model_alloc_scratch(ds_model *m, ds_error *err) {
    ds_status st;
    const ds_config *cfg = &m->cfg;
    const ds_backend *be = m->be;
    const int max_tokens = m->max_tokens, max_out = m->max_out;

    const ds_dtype act = be->ops->act_dtype;
    int64_t proj_w, core_w;
    scratch_widths(cfg, &proj_w, &core_w);
    ds_model_scratch *s = &m->s;
    if ((st = alloc_act(m, &s->resid, max_tokens, cfg->hidden, act, err)) ||
        (st = alloc_act(m, &s->normed, max_tokens, cfg->hidden, act, err)) ||
        (st = alloc_act(m, &s->proj, max_tokens, proj_w, act, err)) ||
        (st = alloc_act(m, &s->core, max_tokens, core_w, act, err)) ||
        (st = alloc_act(m, &s->delta, max_tokens, cfg->hidden, act, err)) ||
        (st = alloc_act(m, &s->out_h, max_out, cfg->hidden, act, err)) ||
        (st = alloc_act(m, &s->logits, max_out, cfg->vocab, DS_DTYPE_F32, err)) ||
        (st = ds_mtp_scratch_alloc(m, err))) {
        ds_model_free(m);
        return st;
    }
    return DS_OK;
}

ds_status ds_model_init(ds_model *m, ds_backend *be, const ds_config *cfg,
                        const ds_model_weights *host, int max_tokens, int max_out, ds_error *err) {
    DS_ASSERT(max_tokens > 0 && max_out > 0 && max_out <= max_tokens);
    *m = (ds_model){.cfg = *cfg, .be = be, .max_tokens = max_tokens, .max_out = max_out};
    ds_status st = be->ops->prepare_weights(be, cfg, host, &m->w, err);
    if (st != DS_OK) {
        *m = (ds_model){0};
        return st;
    }
    return model_alloc_scratch(m, err);
}

ds_status ds_model_init_dummy(ds_model *m, ds_backend *be, const ds_config *cfg, uint64_t seed,
                              int max_tokens, int max_out, ds_error *err) {
    DS_ASSERT(max_tokens > 0 && max_out > 0 && max_out <= max_tokens);
    *m = (ds_model){.cfg = *cfg, .be = be, .max_tokens = max_tokens, .max_out = max_out};
    ds_status st;
    if (be->ops->dummy_weights) {
        st = be->ops->dummy_weights(be, cfg, seed, &m->w, err);
    } else {
        /* Host weights the backend prepares (and, on the CPU, aliases): kept in the model. */
        m->dummy_host = ds_xcalloc(1, sizeof *m->dummy_host);
        st = ds_dummy_weights_create(cfg, seed, m->dummy_host, err);
        if (st == DS_OK) st = be->ops->prepare_weights(be, cfg, m->dummy_host, &m->w, err);
        if (st != DS_OK) {
            ds_dummy_weights_free(m->dummy_host);
            free(m->dummy_host);
        }
    }
    if (st != DS_OK) {
        *m = (ds_model){0};
        return st;
    }
    return model_alloc_scratch(m, err);
}

void ds_model_free(ds_model *m) {
    if (!m->be) return;
    ds_mtp_scratch_free(m);
    ds_tensor *bufs[] = {&m->s.resid, &m->s.normed, &m->s.proj,  &m->s.core,
                         &m->s.delta, &m->s.out_h,  &m->s.logits};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
        if (bufs[i]->data) m->be->ops->free(m->be, bufs[i]->data);
    m->be->ops->release_weights(m->be, &m->w);
    if (m->dummy_host) {
        ds_dummy_weights_free(m->dummy_host);
        free(m->dummy_host);
    }
    *m = (ds_model){0};
}

ds_status ds_model_cache_create(ds_model *m, int n_slots, int max_len, int block_size,
                                ds_cache **out, ds_error *err) {
    if (n_slots <= 0 || max_len <= 0 || block_size <= 0)
        return ds_error_set(err, DS_ERR_INVALID_ARG, "cache sizes must be positive");
    int blocks_per_seq = (max_len + block_size - 1) / block_size;
    ds_cache_desc d = {.n_slots = n_slots, .n_blocks = n_slots * blocks_per_seq,
                       .block_size = block_size};
    return m->be->ops->cache_create(m->be, &m->cfg, &d, out, err);
}

