/* loader.c — name mapping, shape checks and load-time conversions (see loader.h). */
#include "model/loader.h"

#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/checkpoint.h"
#include "model/safetensors.h"

/* Everything a loaded ds_model_weights owns: the mapped checkpoint and every malloc. */
typedef struct ld_owner {
    ds_checkpoint *ck;
    void **allocs;
    int n_allocs, cap_allocs;
} ld_owner;

typedef struct ld_ctx {
    const ds_config *cfg;
    const char *dir;
    const char *prefix; /* "model.language_model." or "model." */
    ld_owner *own;
    ds_error *err;
    char name[512]; /* scratch for the tensor name being built */
} ld_ctx;

/* Returns from the enclosing function on the first failure. */
#define TRY(expr)                                                                                  \
    do {                                                                                           \
        ds_status try_st_ = (expr);                                                                \
        if (try_st_ != DS_OK) return try_st_;                                                      \
    } while (0)

typedef enum ld_xform {
    LD_PLAIN,    /* w */
    LD_PLUS_ONE, /* 1 + w (zero-centred RMSNorm) */
    LD_NEG_EXP,  /* -exp(w) (A_log) */
} ld_xform;

static void *ld_alloc(ld_ctx *c, size_t bytes) {
    ld_owner *o = c->own;
    if (o->n_allocs == o->cap_allocs) {
        int cap = o->cap_allocs ? 2 * o->cap_allocs : 64;
        void **p = realloc(o->allocs, (size_t)cap * sizeof *p);
        if (!p) return NULL;
        o->allocs = p;
        o->cap_allocs = cap;
    }
    /* 64-byte alignment so SIMD and device copies never see a misaligned host buffer */
    void *p = NULL;
    if (posix_memalign(&p, 64, bytes ? bytes : 1) != 0) return NULL;
    memset(p, 0, bytes);
    o->allocs[o->n_allocs++] = p;
    return p;
}

__attribute__((format(printf, 2, 3))) static const char *ld_name(ld_ctx *c, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(c->name, sizeof c->name, fmt, ap);
    va_end(ap);
    DS_ASSERT(n > 0 && (size_t)n < sizeof c->name);
    return c->name;
}

/* Finds `name` and checks its shape against want[ndim]. */
static ds_status ld_find(ld_ctx *c, const char *name, int ndim, const int64_t *want,
                         const ds_st_tensor **out) {
    char ws[160], hs[160];
    const ds_st_tensor *t = ds_checkpoint_find(c->own->ck, name);
    if (!t)
        return ds_error_set(c->err, DS_ERR_FORMAT,
                            "%s: tensor '%s' is missing from the checkpoint (expected shape %s)",
                            c->dir, name, ds_st_shape_str(want, ndim, ws, sizeof ws));
    bool ok = t->ndim == ndim;
    for (int i = 0; ok && i < ndim; i++) ok = t->shape[i] == want[i];
    if (!ok)
        return ds_error_set(c->err, DS_ERR_FORMAT, "%s: tensor '%s' has shape %s, expected %s",
                            t->origin, name, ds_st_shape_str(t->shape, t->ndim, hs, sizeof hs),
                            ds_st_shape_str(want, ndim, ws, sizeof ws));
    *out = t;
    return DS_OK;
}

/* A view of a large matrix in its checkpoint dtype. */
static ds_status ld_view(ld_ctx *c, const char *name, int ndim, const int64_t *want,
                         ds_tensor *out) {
    const ds_st_tensor *t;
    ds_status st = ld_find(c, name, ndim, want, &t);
    if (st == DS_OK) st = ds_st_tensor_view(t, out, c->err);
    if (st != DS_OK) return st;
    /* Writers order tensors so every offset is aligned; should one not be, copy rather than
     * hand backends a pointer they cannot load from. */
    if ((uintptr_t)out->data % ds_dtype_size(out->dtype) != 0) {
        void *p = ld_alloc(c, t->nbytes);
        if (!p)
            return ds_error_set(c->err, DS_ERR_NOMEM, "%s: out of memory copying '%s'", c->dir,
                                name);
        memcpy(p, t->data, t->nbytes);
        out->data = p;
    }
    return DS_OK;
}

static ds_status ld_view2(ld_ctx *c, const char *name, int64_t rows, int64_t cols, ds_tensor *out) {
    const int64_t want[2] = {rows, cols};
    return ld_view(c, name, 2, want, out);
}

/* A small vector [n] converted to owned F32. */
static ds_status ld_vec_f32(ld_ctx *c, const char *name, int64_t n, ld_xform conv, ds_tensor *out) {
    const ds_st_tensor *t;
    ds_status st = ld_find(c, name, 1, &n, &t);
    if (st != DS_OK) return st;
    ds_tensor view;
    if ((st = ds_st_tensor_view(t, &view, c->err)) != DS_OK) return st;
    float *p = ld_alloc(c, (size_t)n * sizeof *p);
    if (!p) return ds_error_set(c->err, DS_ERR_NOMEM, "%s: out of memory", c->dir);
    for (int64_t i = 0; i < n; i++) {
        float w = ds_st_tensor_get_f32(t, i);
        p[i] = conv == LD_PLUS_ONE ? 1.0f + w : conv == LD_NEG_EXP ? -expf(w) : w;
    }
    *out = (ds_tensor){p, DS_DTYPE_F32, 1, {n, 1, 1, 1}};
    return DS_OK;
}

static void ld_lin_push(ds_linear *l, ds_tensor t) {
    DS_ASSERT(l->n_parts < DS_LINEAR_MAX_PARTS && t.ndim == 2);
    DS_ASSERT(l->n_parts == 0 || l->n_in == t.ne[1]);
    l->parts[l->n_parts++] = t;
    l->n_out += t.ne[0];
    l->n_in = t.ne[1];
}

static ds_status ld_lin1(ld_ctx *c, const char *name, int64_t rows, int64_t cols, ds_linear *l) {
    ds_tensor t;
    ds_status st = ld_view2(c, name, rows, cols, &t);
    if (st == DS_OK) ld_lin_push(l, t);
    return st;
}

/* SwiGLU MLP under base ("...mlp." or "...mlp.shared_expert." or "...mlp.experts.e."). */
static ds_status ld_mlp(ld_ctx *c, const char *base, int64_t inter, ds_mlp_weights *m) {
    const int64_t H = c->cfg->hidden;
    TRY(ld_lin1(c, ld_name(c, "%sgate_proj.weight", base), inter, H, &m->gate_up));
    TRY(ld_lin1(c, ld_name(c, "%sup_proj.weight", base), inter, H, &m->gate_up));
    TRY(ld_lin1(c, ld_name(c, "%sdown_proj.weight", base), H, inter, &m->down));
    return DS_OK;
}

static ds_status ld_moe(ld_ctx *c, const char *lp, ds_moe_weights *m) {
    const ds_config *cfg = c->cfg;
    const int64_t H = cfg->hidden, E = cfg->n_experts, I = cfg->moe_inter;
    TRY(ld_view2(c, ld_name(c, "%smlp.gate.weight", lp), E, H, &m->router));
    m->n_experts = (int)E;
    m->experts = ld_alloc(c, (size_t)E * sizeof *m->experts);
    if (!m->experts) return ds_error_set(c->err, DS_ERR_NOMEM, "%s: out of memory", c->dir);

    if (ds_checkpoint_find(c->own->ck, ld_name(c, "%smlp.experts.gate_up_proj", lp))) {
        /* Fused layout: expert e's [gate; up] is rows [e·2I, (e+1)·2I) of the flattened tensor,
         * first I rows gate then I rows up — exactly one [2I, H] part. */
        ds_tensor gu, dn;
        const int64_t wgu[3] = {E, 2 * I, H}, wdn[3] = {E, H, I};
        TRY(ld_view(c, ld_name(c, "%smlp.experts.gate_up_proj", lp), 3, wgu, &gu));
        TRY(ld_view(c, ld_name(c, "%smlp.experts.down_proj", lp), 3, wdn, &dn));
        const size_t gu_stride = (size_t)(2 * I * H) * ds_dtype_size(gu.dtype);
        const size_t dn_stride = (size_t)(H * I) * ds_dtype_size(dn.dtype);
        for (int64_t e = 0; e < E; e++) {
            ds_mlp_weights *x = &m->experts[e];
            ds_tensor gu_e = {
                (char *)gu.data + (size_t)e * gu_stride, gu.dtype, 2, {2 * I, H, 1, 1}};
            ds_tensor dn_e = {(char *)dn.data + (size_t)e * dn_stride, dn.dtype, 2, {H, I, 1, 1}};
            ld_lin_push(&x->gate_up, gu_e);
            ld_lin_push(&x->down, dn_e);
        }
    } else {
        char base[256];
        for (int64_t e = 0; e < E; e++) {
            snprintf(base, sizeof base, "%smlp.experts.%lld.", lp, (long long)e);
            TRY(ld_mlp(c, base, I, &m->experts[e]));
        }
    }

    if (cfg->shared_inter > 0) {
        char base[256];
        snprintf(base, sizeof base, "%smlp.shared_expert.", lp);
        TRY(ld_mlp(c, base, cfg->shared_inter, &m->shared));
        TRY(ld_view2(c, ld_name(c, "%smlp.shared_expert_gate.weight", lp), 1, H, &m->shared_gate));
        m->has_shared = true;
    } else if (ds_checkpoint_find(c->own->ck,
                                  ld_name(c, "%smlp.shared_expert.gate_proj.weight", lp))) {
        return ds_error_set(c->err, DS_ERR_FORMAT,
                            "%s: the checkpoint has '%s' but the config has no "
                            "shared_expert_intermediate_size",
                            c->dir, c->name);
    }
    return DS_OK;
}

static ds_status ld_attn(ld_ctx *c, const char *lp, ds_attn_weights *a) {
    const ds_config *cfg = c->cfg;
    const int64_t H = cfg->hidden, hd = cfg->head_dim;
    const int64_t q_rows = (int64_t)cfg->n_heads * hd * (cfg->attn_output_gate ? 2 : 1);
    const int64_t kv_rows = (int64_t)cfg->n_kv_heads * hd;
    const int64_t o_cols = (int64_t)cfg->n_heads * hd;
    TRY(ld_lin1(c, ld_name(c, "%sself_attn.q_proj.weight", lp), q_rows, H, &a->qkv));
    TRY(ld_lin1(c, ld_name(c, "%sself_attn.k_proj.weight", lp), kv_rows, H, &a->qkv));
    TRY(ld_lin1(c, ld_name(c, "%sself_attn.v_proj.weight", lp), kv_rows, H, &a->qkv));
    TRY(ld_lin1(c, ld_name(c, "%sself_attn.o_proj.weight", lp), H, o_cols, &a->o));
    TRY(ld_vec_f32(c, ld_name(c, "%sself_attn.q_norm.weight", lp), hd, LD_PLUS_ONE, &a->q_norm));
    TRY(ld_vec_f32(c, ld_name(c, "%sself_attn.k_norm.weight", lp), hd, LD_PLUS_ONE, &a->k_norm));
    return DS_OK;
}

/* conv1d.weight [conv_dim, 1, K] as saved by nn.Conv1d (or already squeezed [conv_dim, K]). */
static ds_status ld_conv1d(ld_ctx *c, const char *name, int64_t C, int64_t K, ds_tensor *out) {
    const ds_st_tensor *t = ds_checkpoint_find(c->own->ck, name);
    const int64_t want3[3] = {C, 1, K};
    if (!(t && t->ndim == 2 && t->shape[0] == C && t->shape[1] == K)) {
        ds_status st = ld_find(c, name, 3, want3, &t);
        if (st != DS_OK) return st;
    }
    ds_tensor view;
    ds_status st = ds_st_tensor_view(t, &view, c->err);
    if (st != DS_OK) return st;
    float *p = ld_alloc(c, (size_t)(C * K) * sizeof *p);
    if (!p) return ds_error_set(c->err, DS_ERR_NOMEM, "%s: out of memory", c->dir);
    for (int64_t i = 0; i < C * K; i++) p[i] = ds_st_tensor_get_f32(t, i);
    *out = (ds_tensor){p, DS_DTYPE_F32, 2, {C, K, 1, 1}};
    return DS_OK;
}

static ds_status ld_gdn(ld_ctx *c, const char *lp, ds_gdn_weights *g) {
    const ds_config *cfg = c->cfg;
    const int64_t H = cfg->hidden, Hv = cfg->gdn_v_heads, dv = cfg->gdn_v_dim;
    const int64_t C = ds_config_gdn_conv_dim(cfg);
    const int K = cfg->gdn_conv_kernel;
    TRY(ld_lin1(c, ld_name(c, "%slinear_attn.in_proj_qkv.weight", lp), C, H, &g->in_proj));
    TRY(ld_lin1(c, ld_name(c, "%slinear_attn.in_proj_z.weight", lp), Hv * dv, H, &g->in_proj));
    TRY(ld_lin1(c, ld_name(c, "%slinear_attn.in_proj_b.weight", lp), Hv, H, &g->in_proj));
    TRY(ld_lin1(c, ld_name(c, "%slinear_attn.in_proj_a.weight", lp), Hv, H, &g->in_proj));
    TRY(ld_conv1d(c, ld_name(c, "%slinear_attn.conv1d.weight", lp), C, K, &g->conv));
    TRY(ld_vec_f32(c, ld_name(c, "%slinear_attn.A_log", lp), Hv, LD_NEG_EXP, &g->neg_exp_A));
    TRY(ld_vec_f32(c, ld_name(c, "%slinear_attn.dt_bias", lp), Hv, LD_PLAIN, &g->dt_bias));
    TRY(ld_vec_f32(c, ld_name(c, "%slinear_attn.norm.weight", lp), dv, LD_PLAIN, &g->norm));
    TRY(ld_lin1(c, ld_name(c, "%slinear_attn.out_proj.weight", lp), H, Hv * dv, &g->out));
    return DS_OK;
}

/* One decoder layer under lp ("model.layers.3." or "mtp.layers.0."). */
static ds_status ld_layer(ld_ctx *c, const char *lp, ds_layer_type type, ds_layer_weights *lw) {
    const int64_t H = c->cfg->hidden;
    lw->type = type;
    TRY(ld_vec_f32(c, ld_name(c, "%sinput_layernorm.weight", lp), H, LD_PLUS_ONE, &lw->input_norm));
    TRY(ld_vec_f32(c, ld_name(c, "%spost_attention_layernorm.weight", lp), H, LD_PLUS_ONE,
                   &lw->post_norm));
    TRY(type == DS_LAYER_FULL_ATTN ? ld_attn(c, lp, &lw->attn) : ld_gdn(c, lp, &lw->gdn));
    if (c->cfg->is_moe) return ld_moe(c, lp, &lw->moe);
    char base[256];
    snprintf(base, sizeof base, "%smlp.", lp);
    return ld_mlp(c, base, c->cfg->mlp_inter, &lw->mlp);
}

static ds_status ld_mtp(ld_ctx *c, ds_model_weights *w) {
    const int64_t H = c->cfg->hidden;
    ds_mtp_weights *m = ld_alloc(c, sizeof *m);
    if (!m) return ds_error_set(c->err, DS_ERR_NOMEM, "%s: out of memory", c->dir);
    w->mtp = m;
    TRY(ld_lin1(c, "mtp.fc.weight", H, 2 * H, &m->fc));
    TRY(ld_vec_f32(c, "mtp.pre_fc_norm_embedding.weight", H, LD_PLUS_ONE, &m->norm_embedding));
    TRY(ld_vec_f32(c, "mtp.pre_fc_norm_hidden.weight", H, LD_PLUS_ONE, &m->norm_hidden));
    TRY(ld_vec_f32(c, "mtp.norm.weight", H, LD_PLUS_ONE, &m->final_norm));
    return ld_layer(c, "mtp.layers.0.", DS_LAYER_FULL_ATTN, &m->layer);
}

static ds_status ld_all(ld_ctx *c, ds_model_weights *w) {
    const ds_config *cfg = c->cfg;
    const int64_t H = cfg->hidden, V = cfg->vocab;
    static const char *const prefixes[] = {"model.language_model.", "model."};
    for (int i = 0; i < 2 && !c->prefix; i++)
        if (ds_checkpoint_find(c->own->ck, ld_name(c, "%sembed_tokens.weight", prefixes[i])))
            c->prefix = prefixes[i];
    if (!c->prefix)
        return ds_error_set(c->err, DS_ERR_FORMAT,
                            "%s: no embedding table: neither "
                            "'model.language_model.embed_tokens.weight' nor "
                            "'model.embed_tokens.weight' is in the checkpoint",
                            c->dir);
    TRY(ld_view2(c, ld_name(c, "%sembed_tokens.weight", c->prefix), V, H, &w->embed));
    TRY(ld_vec_f32(c, ld_name(c, "%snorm.weight", c->prefix), H, LD_PLUS_ONE, &w->final_norm));
    /* tied: lm_head is the embedding (an lm_head.weight in the file is ignored, as transformers
     * ties over it) */
    if (cfg->tie_embeddings)
        ld_lin_push(&w->lm_head, w->embed);
    else
        TRY(ld_lin1(c, "lm_head.weight", V, H, &w->lm_head));

    w->n_layers = cfg->n_layers;
    w->layers = ld_alloc(c, (size_t)cfg->n_layers * sizeof *w->layers);
    if (!w->layers) return ds_error_set(c->err, DS_ERR_NOMEM, "%s: out of memory", c->dir);
    for (int i = 0; i < cfg->n_layers; i++) {
        char lp[128];
        snprintf(lp, sizeof lp, "%slayers.%d.", c->prefix, i);
        TRY(ld_layer(c, lp, cfg->layer_types[i], &w->layers[i]));
    }
    if (ds_checkpoint_has_prefix(c->own->ck, "mtp.")) return ld_mtp(c, w);
    return DS_OK;
}

void ds_model_weights_free(ds_model_weights *w) {
    if (!w) return;
    ld_owner *o = w->owner;
    if (o) {
        for (int i = o->n_allocs - 1; i >= 0; i--) free(o->allocs[i]);
        free(o->allocs);
        ds_checkpoint_close(o->ck);
        free(o);
    }
    *w = (ds_model_weights){0};
}

ds_status ds_model_load_weights(const char *dir, const ds_config *cfg, ds_model_weights *w,
                                ds_error *err) {
    *w = (ds_model_weights){0};
    ld_owner *o = calloc(1, sizeof *o);
    if (!o) return ds_error_set(err, DS_ERR_NOMEM, "%s: out of memory", dir);
    w->owner = o;
    ds_status st = ds_checkpoint_open(dir, &o->ck, err);
    if (st == DS_OK) {
        ld_ctx *c = calloc(1, sizeof *c);
        if (!c) {
            st = ds_error_set(err, DS_ERR_NOMEM, "%s: out of memory", dir);
        } else {
            c->cfg = cfg;
            c->dir = dir;
            c->own = o;
            c->err = err;
            st = ld_all(c, w);
            free(c);
        }
    }
    if (st != DS_OK) ds_model_weights_free(w);
    return st;
}

ds_status ds_model_load(const char *dir, ds_config *cfg, ds_model_weights *w, ds_error *err) {
    *w = (ds_model_weights){0};
    ds_status st = ds_config_load(dir, cfg, err);
    if (st != DS_OK) return st;
    return ds_model_load_weights(dir, cfg, w, err);
}
