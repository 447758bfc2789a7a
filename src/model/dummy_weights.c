#include "model/dummy_weights.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* Every allocation is recorded so one free releases the whole model. */
typedef struct dummy_owner {
    void **blocks;
    size_t n, cap;
    bool failed;
    uint64_t rng;
} dummy_owner;

static void *owner_alloc(dummy_owner *o, size_t bytes) {
    if (o->failed) return NULL;
    if (o->n == o->cap) {
        size_t cap = o->cap ? o->cap * 2 : 64;
        void **grown = realloc(o->blocks, cap * sizeof *grown);
        if (!grown) {
            o->failed = true;
            return NULL;
        }
        o->blocks = grown;
        o->cap = cap;
    }
    void *p = malloc(bytes ? bytes : 1);
    if (!p) {
        o->failed = true;
        return NULL;
    }
    o->blocks[o->n++] = p;
    return p;
}

/* splitmix64 → uniform [-1, 1) */
static float next_uniform(dummy_owner *o) {
    uint64_t z = (o->rng += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    return (float)((double)(z >> 40) * (1.0 / 8388608.0) - 1.0);
}

/* BF16 [rows, cols] with std 1/sqrt(cols) (uniform ±sqrt(3/cols)). */
static ds_tensor rand_matrix(dummy_owner *o, int64_t rows, int64_t cols) {
    ds_tensor t = {NULL, DS_DTYPE_BF16, 2, {rows, cols, 1, 1}};
    uint16_t *d = owner_alloc(o, (size_t)rows * (size_t)cols * 2);
    if (!d) return t;
    float a = sqrtf(3.0f / (float)cols);
    for (int64_t i = 0; i < rows * cols; i++) d[i] = ds_f32_to_bf16(a * next_uniform(o));
    t.data = d;
    return t;
}

/* F32 [n] uniform in [lo, hi). */
static ds_tensor rand_vec(dummy_owner *o, int64_t n, float lo, float hi) {
    ds_tensor t = {NULL, DS_DTYPE_F32, 1, {n, 1, 1, 1}};
    float *d = owner_alloc(o, (size_t)n * sizeof(float));
    if (!d) return t;
    for (int64_t i = 0; i < n; i++) d[i] = lo + (hi - lo) * 0.5f * (next_uniform(o) + 1.0f);
    t.data = d;
    return t;
}

static ds_linear rand_linear(dummy_owner *o, int n_parts, const int64_t *rows, int64_t cols) {
    ds_linear l = {.n_parts = n_parts, .n_in = cols};
    for (int p = 0; p < n_parts; p++) {
        l.parts[p] = rand_matrix(o, rows[p], cols);
        l.n_out += rows[p];
    }
    return l;
}

static ds_mlp_weights rand_mlp(dummy_owner *o, int64_t hidden, int64_t inter) {
    int64_t gu[2] = {inter, inter}, down[1] = {hidden};
    ds_mlp_weights m = {.gate_up = rand_linear(o, 2, gu, hidden),
                        .down = rand_linear(o, 1, down, inter)};
    return m;
}

static void rand_ffn(dummy_owner *o, const ds_config *c, ds_layer_weights *L) {
    const int64_t H = c->hidden;
    if (!c->is_moe) {
        L->mlp = rand_mlp(o, H, c->mlp_inter);
        return;
    }
    ds_moe_weights *m = &L->moe;
    m->router = rand_matrix(o, c->n_experts, H);
    m->n_experts = c->n_experts;
    m->experts = owner_alloc(o, sizeof(ds_mlp_weights) * (size_t)c->n_experts);
    if (!m->experts) return;
    for (int e = 0; e < c->n_experts; e++) m->experts[e] = rand_mlp(o, H, c->moe_inter);
    m->has_shared = c->shared_inter > 0;
    if (m->has_shared) {
        m->shared = rand_mlp(o, H, c->shared_inter);
        m->shared_gate = rand_matrix(o, 1, H);
    }
}

static void rand_attention(dummy_owner *o, const ds_config *c, ds_attn_weights *a) {
    const int64_t H = c->hidden, hd = c->head_dim;
    int64_t qkv[3] = {(int64_t)c->n_heads * hd * (c->attn_output_gate ? 2 : 1),
                      (int64_t)c->n_kv_heads * hd, (int64_t)c->n_kv_heads * hd};
    int64_t out[1] = {H};
    a->qkv = rand_linear(o, 3, qkv, H);
    a->q_norm = rand_vec(o, hd, 0.9f, 1.1f);
    a->k_norm = rand_vec(o, hd, 0.9f, 1.1f);
    a->o = rand_linear(o, 1, out, (int64_t)c->n_heads * hd);
}

static void rand_layer(dummy_owner *o, const ds_config *c, ds_layer_type type,
                       ds_layer_weights *L) {
    const int64_t H = c->hidden;
    L->type = type;
    L->input_norm = rand_vec(o, H, 0.9f, 1.1f);
    L->post_norm = rand_vec(o, H, 0.9f, 1.1f);
    if (type == DS_LAYER_FULL_ATTN) {
        rand_attention(o, c, &L->attn);
    } else {
        const int64_t conv = ds_config_gdn_conv_dim(c), Hv = c->gdn_v_heads;
        int64_t in[4] = {conv, Hv * c->gdn_v_dim, Hv, Hv}, out[1] = {H};
        ds_gdn_weights *g = &L->gdn;
        g->in_proj = rand_linear(o, 4, in, H);
        g->conv = rand_vec(o, conv * c->gdn_conv_kernel, -0.5f, 0.5f);
        g->conv.ndim = 2;
        g->conv.ne[0] = conv;
        g->conv.ne[1] = c->gdn_conv_kernel;
        /* A = exp(A_log) in [1, 16] as Qwen3.5 initialises it: neg_exp_A in [-16, -1] */
        g->neg_exp_A = rand_vec(o, Hv, -16.0f, -1.0f);
        g->dt_bias = rand_vec(o, Hv, -4.0f, 0.0f);
        g->norm = rand_vec(o, c->gdn_v_dim, 0.9f, 1.1f);
        g->out = rand_linear(o, 1, out, Hv * c->gdn_v_dim);
    }
    rand_ffn(o, c, L);
}

ds_status ds_dummy_weights_create(const ds_config *cfg, uint64_t seed, ds_model_weights *w,
                                  ds_error *err) {
    *w = (ds_model_weights){0};
    dummy_owner *o = calloc(1, sizeof *o);
    if (!o) return ds_error_set(err, DS_ERR_NOMEM, "dummy weights: out of memory");
    o->rng = seed * 0x2545f4914f6cdd1dull + 1;
    const int64_t H = cfg->hidden, V = cfg->vocab;
    w->owner = o;
    w->n_layers = cfg->n_layers;
    w->embed = rand_matrix(o, V, H);
    w->final_norm = rand_vec(o, H, 0.9f, 1.1f);
    if (cfg->tie_embeddings) {
        w->lm_head = (ds_linear){.n_parts = 1, .parts = {w->embed}, .n_out = V, .n_in = H};
    } else {
        int64_t rows[1] = {V};
        w->lm_head = rand_linear(o, 1, rows, H);
    }
    w->layers = owner_alloc(o, sizeof(ds_layer_weights) * (size_t)cfg->n_layers);
    if (w->layers) {
        memset(w->layers, 0, sizeof(ds_layer_weights) * (size_t)cfg->n_layers);
        for (int l = 0; l < cfg->n_layers && !o->failed; l++)
            rand_layer(o, cfg, cfg->layer_types[l], &w->layers[l]);
    }
    if (cfg->n_mtp_layers > 0 && !o->failed) {
        w->mtp = owner_alloc(o, sizeof(ds_mtp_weights));
        if (w->mtp) {
            memset(w->mtp, 0, sizeof *w->mtp);
            int64_t rows[1] = {H};
            w->mtp->fc = rand_linear(o, 1, rows, 2 * H);
            w->mtp->norm_embedding = rand_vec(o, H, 0.9f, 1.1f);
            w->mtp->norm_hidden = rand_vec(o, H, 0.9f, 1.1f);
            w->mtp->final_norm = rand_vec(o, H, 0.9f, 1.1f);
            rand_layer(o, cfg, DS_LAYER_FULL_ATTN, &w->mtp->layer);
        }
    }
    if (o->failed) {
        ds_dummy_weights_free(w);
        return ds_error_set(err, DS_ERR_NOMEM, "dummy weights: out of host memory");
    }
    return DS_OK;
}

void ds_dummy_weights_free(ds_model_weights *w) {
    dummy_owner *o = w->owner;
    if (o) {
        for (size_t i = 0; i < o->n; i++) free(o->blocks[i]);
        free(o->blocks);
        free(o);
    }
    *w = (ds_model_weights){0};
}
