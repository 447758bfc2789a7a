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

/* The mixer's input projection proj = x · Wᵀ, where x = normed holds RMSNorm_in(h) — or, when
 * norm_pending, does not yet: then the projection computes it from h (linear_rmsnorm). */
static void input_projection(ds_model *m, const ds_layer_weights *L, bool norm_pending,
                             ds_tensor *x, const ds_linear *w, ds_tensor *proj) {
    const ds_backend_ops *op = m->be->ops;
    if (!norm_pending) {
        op->linear(m->be, x, w, proj);
        return;
    }
    ds_tensor h = rows_view(&m->s.resid, x->ne[0], m->cfg.hidden);
    op->linear_rmsnorm(m->be, &h, &L->input_norm, (float)m->cfg.rms_eps, x, w, proj);
}

static void mixer_forward(ds_model *m, ds_cache *cache, int layer, const ds_layer_weights *L,
                          int64_t T, bool norm_pending) {
    const ds_backend_ops *op = m->be->ops;
    const ds_config *c = &m->cfg;
    ds_tensor x = rows_view(&m->s.normed, T, c->hidden);
    ds_tensor y = rows_view(&m->s.delta, T, c->hidden);
    if (L->type == DS_LAYER_LINEAR_ATTN) {
        ds_tensor proj = rows_view(&m->s.proj, T, L->gdn.in_proj.n_out); /* [T, qkv|z|b|a] */
        ds_tensor o = rows_view(&m->s.core, T, (int64_t)c->gdn_v_heads * c->gdn_v_dim);
        input_projection(m, L, norm_pending, &x, &L->gdn.in_proj, &proj);
        op->gdn(m->be, cache, layer, c, &L->gdn, &proj, &o);
        op->linear(m->be, &o, &L->gdn.out, &y);
    } else {
        ds_tensor qkv = rows_view(&m->s.proj, T, L->attn.qkv.n_out); /* [T, q|gate, k, v] */
        ds_tensor o = rows_view(&m->s.core, T, (int64_t)c->n_heads * c->head_dim);
        input_projection(m, L, norm_pending, &x, &L->attn.qkv, &qkv);
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

    /* xn does not hold RMSNorm_in(h) yet: the backend left it to the next layer's input
     * projection (moe_sublayer, may_defer_norm) */
    bool norm_pending = false;
    for (int l = 0; l < c->n_layers; l++) {
        const ds_layer_weights *L = &m->w.layers[l];
        mixer_forward(m, cache, l, L, T, norm_pending);
        norm_pending = false;
        if (m->allreduce) m->allreduce(m->allreduce_ctx, &d); /* tensor parallel: Σ ranks */
        const ds_tensor *next_norm =
            l + 1 < c->n_layers ? &m->w.layers[l + 1].input_norm : &m->w.final_norm;
        if (c->is_moe && op->moe_sublayer && !m->allreduce) {
            /* the add + norm, the MoE block and the add + norm after it, fused where the
             * backend can (the first add + norm into the router launch; the last one into
             * the next layer's input projection — not after the last layer, whose norm the
             * lm_head reads) */
            const bool may_defer = op->linear_rmsnorm && l + 1 < c->n_layers;
            norm_pending = op->moe_sublayer(m->be, c, &L->moe, &h, &d, &L->post_norm, next_norm,
                                            eps, &xn, may_defer);
            continue;
        }
        op->add_rmsnorm(m->be, &h, &d, &L->post_norm, eps, &xn);
        if (c->is_moe && op->moe_add_rmsnorm && !m->allreduce) {
            /* the block's residual add + norm fused into the MoE's last kernel */
            op->moe_add_rmsnorm(m->be, c, &L->moe, &xn, &d, &h, next_norm, eps, &xn);
            continue;
        }
        ffn_forward(m, L, T);
        if (m->allreduce) m->allreduce(m->allreduce_ctx, &d);
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
