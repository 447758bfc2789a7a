/* forward.c — the Qwen3.5 decoder, written once in terms of backend ops.
 *
 *   h = embed[ids]
 *   for each layer:  h += Mixer(RMSNorm_in(h));  h += FFN(RMSNorm_post(h))
 *   logits = lm_head(RMSNorm_final(h))     (only for the rows the batch asks for)
 *
 * The residual add of each sub-block is fused with the RMSNorm that follows it
 * (add_rmsnorm), so every norm after the first reads h once and writes h + normed once. */
#include "model/model.h"

#include <stdlib.h>

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

ds_status ds_model_init(ds_model *m, ds_backend *be, const ds_config *cfg,
                        const ds_model_weights *host, int max_tokens, int max_out, ds_error *err) {
    DS_ASSERT(max_tokens > 0 && max_out > 0 && max_out <= max_tokens);
    *m = (ds_model){.cfg = *cfg, .be = be, .max_tokens = max_tokens, .max_out = max_out};
    ds_status st = be->ops->prepare_weights(be, cfg, host, &m->w, err);
    if (st != DS_OK) return st;

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
        (st = alloc_act(m, &s->logits, max_out, cfg->vocab, DS_DTYPE_F32, err))) {
        ds_model_free(m);
        return st;
    }
    return DS_OK;
}

void ds_model_free(ds_model *m) {
    if (!m->be) return;
    ds_tensor *bufs[] = {&m->s.resid, &m->s.normed, &m->s.proj,  &m->s.core,
                         &m->s.delta, &m->s.out_h,  &m->s.logits};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
        if (bufs[i]->data) m->be->ops->free(m->be, bufs[i]->data);
    m->be->ops->release_weights(m->be, &m->w);
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

/* Row-prefix view: the first `rows` rows of a scratch buffer, `cols` columns wide. The scratch
 * buffers are allocated wider than some uses need; a narrower view keeps rows contiguous. */
static ds_tensor rows_view(const ds_tensor *buf, int64_t rows, int64_t cols) {
    DS_ASSERT(rows <= buf->ne[0] && rows * cols <= buf->ne[0] * buf->ne[1]);
    return ds_view2d(buf->data, buf->dtype, rows, cols);
}

static void ffn_forward(ds_model *m, const ds_layer_weights *L, int64_t T) {
    const ds_backend_ops *op = m->be->ops;
    const ds_config *c = &m->cfg;
    ds_tensor x = rows_view(&m->s.normed, T, c->hidden);
    ds_tensor y = rows_view(&m->s.delta, T, c->hidden);
    if (c->is_moe) {
        op->moe(m->be, c, &L->moe, &x, &y);
        return;
    }
    ds_tensor gu = rows_view(&m->s.proj, T, 2 * (int64_t)c->mlp_inter); /* [T, 2I] gate|up */
    ds_tensor a = rows_view(&m->s.core, T, c->mlp_inter);               /* [T, I] */
    op->linear(m->be, &x, &L->mlp.gate_up, &gu);
    op->silu_mul(m->be, &gu, &a);
    op->linear(m->be, &a, &L->mlp.down, &y);
}

static void mixer_forward(ds_model *m, ds_cache *cache, int layer, const ds_layer_weights *L,
                          int64_t T) {
    const ds_backend_ops *op = m->be->ops;
    const ds_config *c = &m->cfg;
    ds_tensor x = rows_view(&m->s.normed, T, c->hidden);
    ds_tensor y = rows_view(&m->s.delta, T, c->hidden);
    if (L->type == DS_LAYER_LINEAR_ATTN) {
        ds_tensor proj = rows_view(&m->s.proj, T, L->gdn.in_proj.n_out); /* [T, qkv|z|b|a] */
        ds_tensor o = rows_view(&m->s.core, T, (int64_t)c->gdn_v_heads * c->gdn_v_dim);
        op->linear(m->be, &x, &L->gdn.in_proj, &proj);
        op->gdn(m->be, cache, layer, c, &L->gdn, &proj, &o);
        op->linear(m->be, &o, &L->gdn.out, &y);
    } else {
        ds_tensor qkv = rows_view(&m->s.proj, T, L->attn.qkv.n_out); /* [T, q|gate, k, v] */
        ds_tensor o = rows_view(&m->s.core, T, (int64_t)c->n_heads * c->head_dim);
        op->linear(m->be, &x, &L->attn.qkv, &qkv);
        op->attention(m->be, cache, layer, c, &L->attn, &qkv, &o);
        op->linear(m->be, &o, &L->attn.o, &y);
    }
}

ds_status ds_model_forward(ds_model *m, ds_cache *cache, const ds_batch *b, ds_error *err) {
    const ds_backend_ops *op = m->be->ops;
    const ds_config *c = &m->cfg;
    const int64_t T = b->n_tokens;
    if (T <= 0 || T > m->max_tokens || b->n_out < 0 || b->n_out > m->max_out)
        return ds_error_set(err, DS_ERR_INVALID_ARG,
                            "batch of %lld tokens / %d outputs exceeds the model's step size "
                            "(%d tokens / %d outputs)",
                            (long long)T, b->n_out, m->max_tokens, m->max_out);
    const float eps = (float)c->rms_eps;
    op->set_batch(m->be, b);

    ds_tensor h = rows_view(&m->s.resid, T, c->hidden);
    ds_tensor xn = rows_view(&m->s.normed, T, c->hidden);
    ds_tensor d = rows_view(&m->s.delta, T, c->hidden);
    op->embed(m->be, &m->w.embed, &h);
    op->rmsnorm(m->be, &h, &m->w.layers[0].input_norm, eps, &xn);

    for (int l = 0; l < c->n_layers; l++) {
        const ds_layer_weights *L = &m->w.layers[l];
        mixer_forward(m, cache, l, L, T);
        op->add_rmsnorm(m->be, &h, &d, &L->post_norm, eps, &xn);
        ffn_forward(m, L, T);
        const ds_tensor *next_norm =
            l + 1 < c->n_layers ? &m->w.layers[l + 1].input_norm : &m->w.final_norm;
        op->add_rmsnorm(m->be, &h, &d, next_norm, eps, &xn);
    }
    if (b->n_out > 0) {
        ds_tensor oh = rows_view(&m->s.out_h, b->n_out, c->hidden);
        ds_tensor lg = rows_view(&m->s.logits, b->n_out, c->vocab);
        op->gather_rows(m->be, &xn, &oh);
        op->logits(m->be, &oh, &m->w.lm_head, &lg);
    }
    return DS_OK;
}
