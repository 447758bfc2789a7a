/* tp_shard.c — the slice of the model one tensor-parallel rank holds (see tp.h for the split).
 *
 * Head/channel bookkeeping for rank r of N:
 *   attention  query heads [q0, q0 + nh/N), q0 = r·nh/N; kv heads [q0/(nh/nkv), +max(nkv/N, 1))
 *              — with nkv < N several ranks keep the same kv head (replicated), which is what
 *              their query heads read in the unsharded GQA mapping h → h/(nh/nkv)
 *   GDN        value heads [v0, v0 + Hv/N); key heads [v0/(Hv/Hk), +max(Hk/N, 1)) by the same
 *              argument (value head j reads key head j/(Hv/Hk))
 *   FFN        intermediate [r·I/N, (r+1)·I/N) of every MLP / expert / shared expert
 *   lm_head    vocab rows [r·V/N, (r+1)·V/N)
 * Row slices that are one contiguous range per source part stay views into the host weights;
 * anything else (several ranges inside one part, column slices) is copied in the source dtype. */
#include <stdlib.h>
#include <string.h>

#include "parallel/tp.h"

/* ---- config ---------------------------------------------------------------------------------- */

static ds_status check_div(int n, int value, const char *field, ds_error *err) {
    if (value % n != 0)
        return ds_error_set(err, DS_ERR_INVALID_ARG,
                            "--tensor-parallel-size %d does not divide %s (%d)", n, field, value);
    return DS_OK;
}

/* A head count that may also be smaller than n (then replicated): n must divide it, or it
 * must divide n. */
static ds_status check_heads(int n, int value, const char *field, ds_error *err) {
    if (value <= 0 || (value % n != 0 && n % value != 0))
        return ds_error_set(err, DS_ERR_INVALID_ARG,
                            "--tensor-parallel-size %d: %s (%d) is neither a multiple nor a "
                            "divisor of it",
                            n, field, value);
    return DS_OK;
}

static int heads_per_rank(int heads, int n) { return heads >= n ? heads / n : 1; }

ds_status ds_tp_config_shard(const ds_config *cfg, int rank, int n, ds_config *out,
                             int64_t *vocab_off, ds_error *err) {
    if (n < 1 || n > DS_TP_MAX_RANKS)
        return ds_error_set(err, DS_ERR_INVALID_ARG,
                            "--tensor-parallel-size %d is out of range (1..%d)", n,
                            DS_TP_MAX_RANKS);
    DS_ASSERT(rank >= 0 && rank < n);
    bool has_attn = false, has_gdn = false;
    for (int l = 0; l < cfg->n_layers; l++) {
        has_attn |= cfg->layer_types[l] == DS_LAYER_FULL_ATTN;
        has_gdn |= cfg->layer_types[l] == DS_LAYER_LINEAR_ATTN;
    }
    ds_status st = DS_OK;
    if (has_attn && ((st = check_div(n, cfg->n_heads, "num_attention_heads", err)) ||
                     (st = check_heads(n, cfg->n_kv_heads, "num_key_value_heads", err))))
        return st;
    if (has_gdn && ((st = check_div(n, cfg->gdn_v_heads, "linear_num_value_heads", err)) ||
                    (st = check_heads(n, cfg->gdn_k_heads, "linear_num_key_heads", err))))
        return st;
    if (cfg->is_moe) {
        if ((st = check_div(n, cfg->moe_inter, "moe_intermediate_size", err))) return st;
        if (cfg->shared_inter > 0 &&
            (st = check_div(n, cfg->shared_inter, "shared_expert_intermediate_size", err)))
            return st;
    } else if ((st = check_div(n, cfg->mlp_inter, "intermediate_size", err))) {
        return st;
    }
    if (cfg->vocab < n)
        return ds_error_set(err, DS_ERR_INVALID_ARG,
                            "--tensor-parallel-size %d exceeds vocab_size (%d)", n, cfg->vocab);
    *out = *cfg;
    out->n_heads = cfg->n_heads / n;
    out->n_kv_heads = heads_per_rank(cfg->n_kv_heads, n);
    out->gdn_v_heads = cfg->gdn_v_heads / n;
    out->gdn_k_heads = heads_per_rank(cfg->gdn_k_heads, n);
    out->moe_inter = cfg->moe_inter / n;
    out->shared_inter = cfg->shared_inter / n;
    out->mlp_inter = cfg->mlp_inter / n;
    const int64_t v0 = (int64_t)cfg->vocab * rank / n, v1 = (int64_t)cfg->vocab * (rank + 1) / n;
    out->vocab = (int)(v1 - v0);
    out->n_mtp_layers = 0; /* the MTP head is not sharded: no MTP KV pool on the ranks */
    *vocab_off = v0;
    return DS_OK;
}

/* ---- weights --------------------------------------------------------------------------------- */

typedef struct row_range {
    int64_t start, count; /* rows of the linear's concatenated output */
} row_range;

static void *shard_alloc(ds_tp_shard *s, size_t bytes, ds_error *err) {
    if (s->n_allocs == s->cap_allocs) {
        int cap = s->cap_allocs ? 2 * s->cap_allocs : 64;
        void **p = realloc(s->allocs, (size_t)cap * sizeof *p);
        if (!p) {
            ds_error_set(err, DS_ERR_NOMEM, "tensor parallel: out of memory");
            return NULL;
        }
        s->allocs = p;
        s->cap_allocs = cap;
    }
    void *p = calloc(1, bytes ? bytes : 1);
    if (!p) {
        ds_error_set(err, DS_ERR_NOMEM, "tensor parallel: cannot allocate %zu bytes of weights",
                     bytes);
        return NULL;
    }
    s->allocs[s->n_allocs++] = p;
    return p;
}

/* The part holding global row `row` of l and the row's index inside it. */
static int part_of_row(const ds_linear *l, int64_t row, int64_t *local) {
    for (int p = 0; p < l->n_parts; p++) {
        if (row < l->parts[p].ne[0]) {
            *local = row;
            return p;
        }
        row -= l->parts[p].ne[0];
    }
    DS_ASSERT(!"row outside the linear");
    return -1;
}

static ds_tensor rows_view(const ds_tensor *t, int64_t row0, int64_t rows) {
    DS_ASSERT(t->ndim == 2 && row0 >= 0 && row0 + rows <= t->ne[0]);
    size_t row_bytes = (size_t)t->ne[1] * ds_dtype_size(t->dtype);
    return (ds_tensor){(char *)t->data + (size_t)row0 * row_bytes, t->dtype, 2,
                       {rows, t->ne[1], 1, 1}};
}

/* out = the rows `rg` of src, in order. */
static ds_status lin_rows(ds_tp_shard *s, const ds_linear *src, const row_range *rg, int n_rg,
                          ds_linear *out, ds_error *err) {
    *out = (ds_linear){.n_in = src->n_in};
    bool views = n_rg <= DS_LINEAR_MAX_PARTS;
    for (int i = 0; i < n_rg && views; i++) {
        int64_t a, b;
        int pa = part_of_row(src, rg[i].start, &a);
        int pb = part_of_row(src, rg[i].start + rg[i].count - 1, &b);
        views = pa == pb;
    }
    if (views) {
        for (int i = 0; i < n_rg; i++) {
            int64_t local;
            int p = part_of_row(src, rg[i].start, &local);
            out->parts[out->n_parts++] = rows_view(&src->parts[p], local, rg[i].count);
            out->n_out += rg[i].count;
        }
        return DS_OK;
    }
    /* one fused copy; mixed part dtypes would need a conversion no checkpoint has asked for */
    const ds_dtype dt = src->parts[0].dtype;
    for (int p = 1; p < src->n_parts; p++)
        if (src->parts[p].dtype != dt)
            return ds_error_set(err, DS_ERR_UNSUPPORTED,
                                "tensor parallel: a projection mixes %s and %s parts",
                                ds_dtype_name(dt), ds_dtype_name(src->parts[p].dtype));
    int64_t rows = 0;
    for (int i = 0; i < n_rg; i++) rows += rg[i].count;
    const size_t row_bytes = (size_t)src->n_in * ds_dtype_size(dt);
    char *dst = shard_alloc(s, (size_t)rows * row_bytes, err);
    if (!dst) return DS_ERR_NOMEM;
    out->parts[0] = (ds_tensor){dst, dt, 2, {rows, src->n_in, 1, 1}};
    out->n_parts = 1;
    out->n_out = rows;
    for (int i = 0; i < n_rg; i++)
        for (int64_t r = rg[i].start; r < rg[i].start + rg[i].count; r++) {
            int64_t local;
            int p = part_of_row(src, r, &local);
            memcpy(dst, (const char *)src->parts[p].data + (size_t)local * row_bytes, row_bytes);
            dst += row_bytes;
        }
    return DS_OK;
}

/* out = columns [c0, c0 + cols) of every part of src (row-parallel input slice). */
static ds_status lin_cols(ds_tp_shard *s, const ds_linear *src, int64_t c0, int64_t cols,
                          ds_linear *out, ds_error *err) {
    DS_ASSERT(c0 >= 0 && c0 + cols <= src->n_in);
    *out = (ds_linear){.n_parts = src->n_parts, .n_out = src->n_out, .n_in = cols};
    for (int p = 0; p < src->n_parts; p++) {
        const ds_tensor *t = &src->parts[p];
        const size_t es = ds_dtype_size(t->dtype);
        char *dst = shard_alloc(s, (size_t)t->ne[0] * (size_t)cols * es, err);
        if (!dst) return DS_ERR_NOMEM;
        for (int64_t r = 0; r < t->ne[0]; r++)
            memcpy(dst + (size_t)r * (size_t)cols * es,
                   (const char *)t->data + ((size_t)r * (size_t)t->ne[1] + (size_t)c0) * es,
                   (size_t)cols * es);
        out->parts[p] = (ds_tensor){dst, t->dtype, 2, {t->ne[0], cols, 1, 1}};
    }
    return DS_OK;
}

/* F32 vector [n] → elements [i0, i0 + cnt) (a view). */
static ds_tensor vec_slice(const ds_tensor *t, int64_t i0, int64_t cnt) {
    DS_ASSERT(t->dtype == DS_DTYPE_F32 && i0 + cnt <= ds_tensor_numel(t));
    return (ds_tensor){(float *)t->data + i0, DS_DTYPE_F32, 1, {cnt, 1, 1, 1}};
}

typedef struct rank_ctx {
    ds_tp_shard *s;
    const ds_config *cfg; /* full */
    int r, n;
    ds_error *err;
} rank_ctx;

static ds_status shard_mlp(rank_ctx *c, const ds_mlp_weights *src, ds_mlp_weights *dst) {
    const int64_t I = src->gate_up.n_out / 2;
    const int64_t i0 = I * c->r / c->n, cnt = I / c->n;
    row_range rg[2] = {{i0, cnt}, {I + i0, cnt}}; /* gate rows, up rows */
    ds_status st = lin_rows(c->s, &src->gate_up, rg, 2, &dst->gate_up, c->err);
    if (st == DS_OK) st = lin_cols(c->s, &src->down, i0, cnt, &dst->down, c->err);
    return st;
}

static ds_status shard_moe(rank_ctx *c, const ds_moe_weights *src, ds_moe_weights *dst) {
    *dst = *src; /* router, shared gate: replicated */
    dst->experts = shard_alloc(c->s, (size_t)src->n_experts * sizeof *dst->experts, c->err);
    if (!dst->experts) return DS_ERR_NOMEM;
    ds_status st;
    for (int e = 0; e < src->n_experts; e++)
        if ((st = shard_mlp(c, &src->experts[e], &dst->experts[e]))) return st;
    if (src->has_shared) return shard_mlp(c, &src->shared, &dst->shared);
    return DS_OK;
}

static ds_status shard_attn(rank_ctx *c, const ds_attn_weights *src, ds_attn_weights *dst) {
    const ds_config *f = c->cfg, *p = &c->s->cfg;
    const int64_t hd = f->head_dim, qh = hd * (f->attn_output_gate ? 2 : 1);
    const int64_t q0 = (int64_t)f->n_heads * c->r / c->n;
    const int64_t kv0 = q0 / (f->n_heads / f->n_kv_heads);
    const int64_t q_rows = f->n_heads * qh, kv_rows = f->n_kv_heads * hd;
    row_range rg[3] = {{q0 * qh, p->n_heads * qh},                       /* q|gate per head */
                       {q_rows + kv0 * hd, p->n_kv_heads * hd},          /* k */
                       {q_rows + kv_rows + kv0 * hd, p->n_kv_heads * hd}}; /* v */
    *dst = *src; /* q_norm, k_norm: per head dim, shared */
    ds_status st = lin_rows(c->s, &src->qkv, rg, 3, &dst->qkv, c->err);
    if (st == DS_OK) st = lin_cols(c->s, &src->o, q0 * hd, p->n_heads * hd, &dst->o, c->err);
    return st;
}

static ds_status shard_gdn(rank_ctx *c, const ds_gdn_weights *src, ds_gdn_weights *dst) {
    const ds_config *f = c->cfg, *p = &c->s->cfg;
    const int64_t dk = f->gdn_k_dim, dv = f->gdn_v_dim, Hk = f->gdn_k_heads, Hv = f->gdn_v_heads;
    const int64_t v0 = Hv * c->r / c->n, nv = p->gdn_v_heads;
    const int64_t k0 = v0 / (Hv / Hk), nk = p->gdn_k_heads;
    const int64_t C = ds_config_gdn_conv_dim(f);
    /* channels of the conv input q | k | v, then z, b, a */
    row_range rg[6] = {{k0 * dk, nk * dk},
                       {Hk * dk + k0 * dk, nk * dk},
                       {2 * Hk * dk + v0 * dv, nv * dv},
                       {C + v0 * dv, nv * dv},
                       {C + Hv * dv + v0, nv},
                       {C + Hv * dv + Hv + v0, nv}};
    *dst = *src; /* norm: per value-head dim, shared */
    ds_status st = lin_rows(c->s, &src->in_proj, rg, 6, &dst->in_proj, c->err);
    if (st != DS_OK) return st;
    /* conv weight F32 [C, K]: the rank's q, k, v channels */
    const int64_t K = src->conv.ne[1], Cr = ds_config_gdn_conv_dim(p);
    DS_ASSERT(src->conv.dtype == DS_DTYPE_F32 && src->conv.ne[0] == C);
    float *conv = shard_alloc(c->s, (size_t)(Cr * K) * sizeof(float), c->err);
    if (!conv) return DS_ERR_NOMEM;
    float *o = conv;
    for (int i = 0; i < 3; i++) {
        memcpy(o, (const float *)src->conv.data + rg[i].start * K,
               (size_t)(rg[i].count * K) * sizeof(float));
        o += rg[i].count * K;
    }
    dst->conv = (ds_tensor){conv, DS_DTYPE_F32, 2, {Cr, K, 1, 1}};
    dst->neg_exp_A = vec_slice(&src->neg_exp_A, v0, nv);
    dst->dt_bias = vec_slice(&src->dt_bias, v0, nv);
    return lin_cols(c->s, &src->out, v0 * dv, nv * dv, &dst->out, c->err);
}

static ds_status shard_layer(rank_ctx *c, const ds_layer_weights *src, ds_layer_weights *dst) {
    *dst = *src; /* type, input/post norms */
    ds_status st = src->type == DS_LAYER_FULL_ATTN ? shard_attn(c, &src->attn, &dst->attn)
                                                   : shard_gdn(c, &src->gdn, &dst->gdn);
    if (st != DS_OK) return st;
    return c->cfg->is_moe ? shard_moe(c, &src->moe, &dst->moe)
                          : shard_mlp(c, &src->mlp, &dst->mlp);
}

ds_status ds_tp_shard_init(ds_tp_shard *s, const ds_config *cfg, const ds_model_weights *host,
                           int rank, int n, ds_error *err) {
    *s = (ds_tp_shard){0};
    ds_status st = ds_tp_config_shard(cfg, rank, n, &s->cfg, &s->vocab_off, err);
    if (st != DS_OK) return st;
    rank_ctx c = {.s = s, .cfg = cfg, .r = rank, .n = n, .err = err};
    s->w.embed = host->embed; /* replicated */
    s->w.final_norm = host->final_norm;
    row_range vr = {s->vocab_off, s->cfg.vocab};
    st = lin_rows(s, &host->lm_head, &vr, 1, &s->w.lm_head, err);
    s->w.n_layers = host->n_layers;
    if (st == DS_OK) {
        s->w.layers = shard_alloc(s, (size_t)host->n_layers * sizeof *s->w.layers, err);
        if (!s->w.layers) st = DS_ERR_NOMEM;
    }
    for (int l = 0; st == DS_OK && l < host->n_layers; l++)
        st = shard_layer(&c, &host->layers[l], &s->w.layers[l]);
    if (st != DS_OK) ds_tp_shard_free(s);
    return st;
}

void ds_tp_shard_free(ds_tp_shard *s) {
    for (int i = s->n_allocs - 1; i >= 0; i--) free(s->allocs[i]);
    free(s->allocs);
    *s = (ds_tp_shard){0};
}
