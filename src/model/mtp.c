/* mtp.c — the Qwen3.5 multi-token-prediction (MTP) head, written once in terms of backend ops.
 *
 * vLLM's qwen3_5_mtp.py semantics (shared/docs/qwen35.md, "MTP head"): at position t, with h_t
 * the target's final-normed hidden state and token t+1 known,
 *   x = fc([RMSNorm_emb(embed(t+1)) ; RMSNorm_hid(h_t)])      (embedding first, Linear 2H → H)
 *   x = decoder layer(x)     full gated attention at RoPE position t over the MTP's own KV
 *                            cache, then the model's FFN type (MoE or dense), pre-norm residual
 *   out = mtp.norm(x);  logits = lm_head(out)                 (the shared lm_head)
 * which drafts token t+2. A further draft step feeds `out` back as h and the draft as the token.
 *
 * The MTP layer is cache layer cfg->n_layers (ds_cache numbers MTP layers after the model's), so
 * it has its own KV pool indexed by the same block tables as the target's attention layers:
 * each sequence's MTP KV at position p lives where its target KV for p lives, in another pool. */
#include "model/model.h"

static ds_tensor rows_of(const ds_tensor *buf, int64_t rows, int64_t cols) {
    DS_ASSERT(rows <= buf->ne[0] && rows * cols <= buf->ne[0] * buf->ne[1]);
    return ds_view2d(buf->data, buf->dtype, rows, cols);
}

bool ds_model_has_mtp(const ds_model *m) {
    return m->w.mtp != NULL && m->cfg.n_mtp_layers >= 1 && m->mtp.cat.data != NULL;
}

static ds_status alloc_rows(ds_model *m, ds_tensor *t, int64_t rows, int64_t cols, ds_error *err) {
    const ds_dtype dt = m->be->ops->act_dtype;
    size_t bytes = (size_t)rows * (size_t)cols * ds_dtype_size(dt);
    void *p = m->be->ops->alloc(m->be, bytes);
    if (!p)
        return ds_error_set(err, DS_ERR_NOMEM, "cannot allocate %zu bytes of MTP activations",
                            bytes);
    *t = ds_view2d(p, dt, rows, cols);
    return DS_OK;
}

ds_status ds_mtp_scratch_alloc(ds_model *m, ds_error *err) {
    m->mtp = (ds_mtp_scratch){0};
    if (!m->w.mtp) return DS_OK;
    const int64_t H = m->cfg.hidden;
    ds_status st;
    if ((st = alloc_rows(m, &m->mtp.e_n, m->max_tokens, H, err)) ||
        (st = alloc_rows(m, &m->mtp.h_n, m->max_tokens, H, err)) ||
        (st = alloc_rows(m, &m->mtp.cat, m->max_tokens, 2 * H, err)) ||
        (st = alloc_rows(m, &m->mtp.out_h, m->max_out, H, err))) {
        ds_mtp_scratch_free(m);
        return st;
    }
    return DS_OK;
}

void ds_mtp_scratch_free(ds_model *m) {
    ds_tensor *bufs[] = {&m->mtp.e_n, &m->mtp.h_n, &m->mtp.cat, &m->mtp.out_h};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
        if (bufs[i]->data) m->be->ops->free(m->be, bufs[i]->data);
    m->mtp = (ds_mtp_scratch){0};
}

ds_status ds_mtp_forward(ds_model *m, ds_cache *cache, const ds_batch *b, const ds_tensor *hidden,
                         bool logits, ds_error *err) {
    const ds_backend_ops *op = m->be->ops;
    const ds_config *c = &m->cfg;
    if (!ds_model_has_mtp(m))
        return ds_error_set(err, DS_ERR_UNSUPPORTED,
                            "the model has no MTP head (no mtp.* tensors or "
                            "mtp_num_hidden_layers = 0): speculative decoding needs one");
    if (!op->concat)
        return ds_error_set(err, DS_ERR_UNSUPPORTED,
                            "the %s backend does not implement the MTP head (no concat op)",
                            op->name);
    const int64_t T = b->n_tokens, H = c->hidden;
    if (T <= 0 || T > m->max_tokens || b->n_out < 0 || b->n_out > m->max_out)
        return ds_error_set(err, DS_ERR_INVALID_ARG,
                            "MTP batch of %lld tokens / %d outputs exceeds the model's step size "
                            "(%d tokens / %d outputs)",
                            (long long)T, b->n_out, m->max_tokens, m->max_out);
    DS_ASSERT(hidden->dtype == op->act_dtype && hidden->ne[hidden->ndim - 1] == H &&
              ds_tensor_numel(hidden) >= T * H);
    const ds_mtp_weights *w = m->w.mtp;
    const ds_layer_weights *L = &w->layer;
    const float eps = (float)c->rms_eps;
    op->set_batch(m->be, b);

    ds_tensor hin = ds_view2d(hidden->data, hidden->dtype, T, H);
    ds_tensor raw = rows_of(&m->s.delta, T, H);     /* embed(token t+1) */
    ds_tensor e_n = rows_of(&m->mtp.e_n, T, H);
    ds_tensor h_n = rows_of(&m->mtp.h_n, T, H);
    ds_tensor cat = rows_of(&m->mtp.cat, T, 2 * H);
    ds_tensor x = rows_of(&m->s.resid, T, H);       /* the MTP layer's residual stream */
    ds_tensor xn = rows_of(&m->s.normed, T, H);
    ds_tensor d = rows_of(&m->s.delta, T, H);
    /* hidden may alias m->s.normed or m->mtp.out_h: it is read (into h_n) before either is
     * written */
    op->rmsnorm(m->be, &hin, &w->norm_hidden, eps, &h_n);
    op->embed(m->be, &m->w.embed, &raw);
    op->rmsnorm(m->be, &raw, &w->norm_embedding, eps, &e_n);
    op->concat(m->be, &e_n, &h_n, &cat);
    op->linear(m->be, &cat, &w->fc, &x);

    /* the decoder layer: x += attn(RMSNorm_in(x)); x += FFN(RMSNorm_post(x)) */
    op->rmsnorm(m->be, &x, &L->input_norm, eps, &xn);
    {
        ds_tensor qkv = rows_of(&m->s.proj, T, L->attn.qkv.n_out);
        ds_tensor o = rows_of(&m->s.core, T, (int64_t)c->n_heads * c->head_dim);
        op->linear(m->be, &xn, &L->attn.qkv, &qkv);
        op->attention(m->be, cache, c->n_layers, c, &L->attn, &qkv, &o);
        op->linear(m->be, &o, &L->attn.o, &d);
    }
    op->add_rmsnorm(m->be, &x, &d, &L->post_norm, eps, &xn);
    if (c->is_moe) {
        op->moe(m->be, c, &L->moe, &xn, &d);
    } else {
        ds_tensor gu = rows_of(&m->s.proj, T, 2 * (int64_t)c->mlp_inter);
        ds_tensor a = rows_of(&m->s.core, T, c->mlp_inter);
        op->linear(m->be, &xn, &L->mlp.gate_up, &gu);
        op->silu_mul(m->be, &gu, &a);
        op->linear(m->be, &a, &L->mlp.down, &d);
    }
    op->add_rmsnorm(m->be, &x, &d, &w->final_norm, eps, &xn);

    if (b->n_out > 0) {
        ds_tensor oh = rows_of(&m->mtp.out_h, b->n_out, H);
        ds_tensor lg = rows_of(&m->s.logits, b->n_out, c->vocab);
        op->gather_rows(m->be, &xn, &oh);
        if (logits) op->logits(m->be, &oh, &m->w.lm_head, &lg);
    }
    return DS_OK;
}
