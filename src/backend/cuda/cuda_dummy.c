/* cuda_dummy.c — dummy_weights on the device: seeded random weights of realistic scale created
 * directly in the prepared layout (concatenated linears, contiguous experts, F32 small tensors),
 * so full-size shapes (Qwen3.5-35B-A3B: ~70 GB) are benchmarked without host weights.
 *
 * The distributions follow src/model/dummy_weights.c: matrices uniform with std 1/sqrt(fan_in),
 * norms 1 ± 0.1, GDN conv ±0.5, neg_exp_A in [−16, −1], dt_bias in [−4, 0]. The values
 * differ from the host generator's (a counter-based hash per arena byte offset here, a
 * sequential splitmix64 stream there): same seed, same device values, every run.
 *
 * How: placeholder host weights with the model's shapes, whose tensors point to ds_cuda_gen
 * descriptors instead of data, go through prepare_weights' walk (ds_cuda_build_weights), which
 * fills each tensor on the device. The placeholders are host structs only (a few MB for 40
 * layers × 256 experts) and are freed before returning. */
#include <stdlib.h>

#include "backend/cuda/cuda_host.h"

static ds_cuda_gen g_matrix = {1, 0.f, 0.f};
static ds_cuda_gen g_embed = {1, 0.f, 0.f}; /* a distinct object: lm_head is tied iff it points here */
static ds_cuda_gen g_norm = {0, 0.9f, 1.1f};
static ds_cuda_gen g_conv = {0, -0.5f, 0.5f};
static ds_cuda_gen g_neg_exp_a = {0, -16.0f, -1.0f}; /* A = exp(A_log) in [1, 16] */
static ds_cuda_gen g_dt_bias = {0, -4.0f, 0.0f};

static ds_tensor ph_matrix(int64_t rows, int64_t cols, ds_cuda_gen *g) {
    ds_tensor t = {.data = g, .dtype = DS_DTYPE_BF16, .ndim = 2, .ne = {rows, cols, 1, 1}};
    return t;
}

static ds_tensor ph_vec(int64_t n, ds_cuda_gen *g) {
    ds_tensor t = {.data = g, .dtype = DS_DTYPE_F32, .ndim = 1, .ne = {n, 1, 1, 1}};
    return t;
}

static ds_linear ph_linear(int n_parts, const int64_t *rows, int64_t cols) {
    ds_linear l = {.n_parts = n_parts, .n_in = cols};
    for (int p = 0; p < n_parts; p++) {
        l.parts[p] = ph_matrix(rows[p], cols, &g_matrix);
        l.n_out += rows[p];
    }
    return l;
}

static ds_mlp_weights ph_mlp(int64_t hidden, int64_t inter) {
    const int64_t gu[2] = {inter, inter}, down[1] = {hidden};
    ds_mlp_weights m = {.gate_up = ph_linear(2, gu, hidden), .down = ph_linear(1, down, inter)};
    return m;
}

static void ph_layer(const ds_config *c, ds_layer_type type, ds_layer_weights *L) {
    const int64_t H = c->hidden;
    L->type = type;
    L->input_norm = ph_vec(H, &g_norm);
    L->post_norm = ph_vec(H, &g_norm);
    if (type == DS_LAYER_FULL_ATTN) {
        const int64_t hd = c->head_dim;
        const int64_t qkv[3] = {(int64_t)c->n_heads * hd * (c->attn_output_gate ? 2 : 1),
                                (int64_t)c->n_kv_heads * hd, (int64_t)c->n_kv_heads * hd};
        const int64_t out[1] = {H};
        L->attn.qkv = ph_linear(3, qkv, H);
        L->attn.q_norm = ph_vec(hd, &g_norm);
        L->attn.k_norm = ph_vec(hd, &g_norm);
        L->attn.o = ph_linear(1, out, (int64_t)c->n_heads * hd);
    } else {
        const int64_t conv = ds_config_gdn_conv_dim(c), Hv = c->gdn_v_heads;
        const int64_t in[4] = {conv, Hv * c->gdn_v_dim, Hv, Hv}, out[1] = {H};
        ds_gdn_weights *g = &L->gdn;
        g->in_proj = ph_linear(4, in, H);
        g->conv = ph_vec(conv * c->gdn_conv_kernel, &g_conv);
        g->conv.ndim = 2;
        g->conv.ne[0] = conv;
        g->conv.ne[1] = c->gdn_conv_kernel;
        g->neg_exp_A = ph_vec(Hv, &g_neg_exp_a);
        g->dt_bias = ph_vec(Hv, &g_dt_bias);
        g->norm = ph_vec(c->gdn_v_dim, &g_norm);
        g->out = ph_linear(1, out, Hv * c->gdn_v_dim);
    }
    if (!c->is_moe) {
        L->mlp = ph_mlp(H, c->mlp_inter);
        return;
    }
    ds_moe_weights *m = &L->moe;
    m->router = ph_matrix(c->n_experts, H, &g_matrix);
    m->n_experts = c->n_experts;
    m->experts = ds_xcalloc((size_t)(c->n_experts > 0 ? c->n_experts : 1), sizeof *m->experts);
    for (int e = 0; e < c->n_experts; e++) m->experts[e] = ph_mlp(H, c->moe_inter);
    m->has_shared = c->shared_inter > 0;
    if (m->has_shared) {
        m->shared = ph_mlp(H, c->shared_inter);
        m->shared_gate = ph_matrix(1, H, &g_matrix);
    }
}

static void ph_free(ds_model_weights *w) {
    for (int l = 0; l < w->n_layers; l++) free(w->layers[l].moe.experts);
    free(w->layers);
    if (w->mtp) free(w->mtp->layer.moe.experts);
    free(w->mtp);
}

ds_status ds_cuda_dummy_weights(ds_backend *be, const ds_config *cfg, uint64_t seed,
                                ds_model_weights *out, ds_error *err) {
    if (cfg->n_layers <= 0 || cfg->hidden <= 0 || cfg->vocab <= 0)
        return ds_error_set(err, DS_ERR_INVALID_ARG, "dummy weights: empty config");
    ds_model_weights ph = {0};
    const int64_t H = cfg->hidden, V = cfg->vocab;
    ph.n_layers = cfg->n_layers;
    ph.embed = ph_matrix(V, H, &g_embed);
    ph.final_norm = ph_vec(H, &g_norm);
    if (cfg->tie_embeddings) {
        ph.lm_head = (ds_linear){.n_parts = 1, .parts = {ph.embed}, .n_out = V, .n_in = H};
    } else {
        const int64_t rows[1] = {V};
        ph.lm_head = ph_linear(1, rows, H);
    }
    ph.layers = ds_xcalloc((size_t)cfg->n_layers, sizeof *ph.layers);
    for (int l = 0; l < cfg->n_layers; l++) ph_layer(cfg, cfg->layer_types[l], &ph.layers[l]);
    if (cfg->n_mtp_layers > 0) {
        ph.mtp = ds_xcalloc(1, sizeof *ph.mtp);
        const int64_t rows[1] = {H};
        ph.mtp->fc = ph_linear(1, rows, 2 * H);
        ph.mtp->norm_embedding = ph_vec(H, &g_norm);
        ph.mtp->norm_hidden = ph_vec(H, &g_norm);
        ph.mtp->final_norm = ph_vec(H, &g_norm);
        ph_layer(cfg, DS_LAYER_FULL_ATTN, &ph.mtp->layer);
    }
    const ds_status st =
        ds_cuda_build_weights(be, cfg, &ph, 1, seed * 0x2545f4914f6cdd1dull + 1, out, err);
    ph_free(&ph);
    return st;
}
