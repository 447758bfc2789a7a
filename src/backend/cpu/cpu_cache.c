/* cpu_cache.c — KV pools for attention layers, conv history + recurrent state for GDN layers.
 *
 * Model layer i maps to attention pool or GDN pool pool_of_layer[i] from cfg->layer_types;
 * MTP layers (indices n_layers .. n_layers + n_mtp_layers - 1) are full attention and get their
 * own KV pools. */
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/cpu_internal.h"

/* a·b·c·... in size_t with overflow detection (sizes come from config.json and CLI args). */
static bool mul_size(size_t *acc, int64_t v) {
    if (v < 0) return false;
    if (v != 0 && *acc > SIZE_MAX / (size_t)v) return false;
    *acc *= (size_t)v;
    return true;
}

static size_t conv_slot_floats(const ds_cache *c) {
    return (size_t)c->conv_dim * (size_t)c->conv_hist;
}
static size_t state_slot_floats(const ds_cache *c) {
    return (size_t)c->gdn_v_heads * (size_t)c->gdn_k_dim * (size_t)c->gdn_v_dim;
}

ds_status ds_cpu_cache_create(ds_backend *be, const ds_config *cfg, const ds_cache_desc *desc,
                              ds_cache **out, ds_error *err) {
    (void)be;
    *out = NULL;
    if (desc->n_slots <= 0 || desc->n_blocks < 0 || desc->block_size <= 0)
        return ds_error_set(
            err, DS_ERR_INVALID_ARG,
            "cache: need n_slots > 0, n_blocks >= 0, block_size > 0 (got %d, %d, %d)",
            desc->n_slots, desc->n_blocks, desc->block_size);
    int n_layers = cfg->n_layers + cfg->n_mtp_layers;
    if (cfg->n_layers <= 0 || cfg->n_layers > DS_MAX_LAYERS || cfg->n_mtp_layers < 0 ||
        n_layers > DS_CPU_MAX_CACHE_LAYERS)
        return ds_error_set(err, DS_ERR_INVALID_ARG, "cache: bad layer counts (%d layers, %d mtp)",
                            cfg->n_layers, cfg->n_mtp_layers);

    ds_cache *c = calloc(1, sizeof *c);
    if (!c) return ds_error_set(err, DS_ERR_NOMEM, "cache: out of memory");
    c->desc = *desc;
    c->n_layers = n_layers;
    for (int i = 0; i < n_layers; i++) {
        bool attn = i >= cfg->n_layers || cfg->layer_types[i] == DS_LAYER_FULL_ATTN;
        c->is_attn[i] = attn;
        c->pool_of_layer[i] = attn ? c->n_attn++ : c->n_gdn++;
    }
    if (c->n_attn > 0 && (cfg->n_kv_heads <= 0 || cfg->head_dim <= 0)) {
        free(c);
        return ds_error_set(err, DS_ERR_INVALID_ARG,
                            "cache: attention layers need n_kv_heads, head_dim > 0");
    }
    if (c->n_gdn > 0 && (cfg->gdn_k_heads <= 0 || cfg->gdn_v_heads <= 0 || cfg->gdn_k_dim <= 0 ||
                         cfg->gdn_v_dim <= 0 || cfg->gdn_conv_kernel <= 0)) {
        free(c);
        return ds_error_set(err, DS_ERR_INVALID_ARG,
                            "cache: linear-attention layers need positive GDN sizes");
    }
    c->n_kv_heads = cfg->n_kv_heads;
    c->head_dim = cfg->head_dim;
    c->conv_dim = c->n_gdn ? ds_config_gdn_conv_dim(cfg) : 0;
    c->conv_hist = c->n_gdn ? cfg->gdn_conv_kernel - 1 : 0;
    c->gdn_v_heads = cfg->gdn_v_heads;
    c->gdn_k_dim = cfg->gdn_k_dim;
    c->gdn_v_dim = cfg->gdn_v_dim;

    size_t kv_bytes = sizeof(float), conv_bytes = sizeof(float), state_bytes = sizeof(float);
    bool ok = mul_size(&kv_bytes, desc->n_blocks) && mul_size(&kv_bytes, desc->block_size) &&
              mul_size(&kv_bytes, cfg->n_kv_heads) && mul_size(&kv_bytes, cfg->head_dim) &&
              mul_size(&conv_bytes, desc->n_slots) && mul_size(&conv_bytes, c->conv_dim) &&
              mul_size(&conv_bytes, c->conv_hist) && mul_size(&state_bytes, desc->n_slots) &&
              mul_size(&state_bytes, cfg->gdn_v_heads) && mul_size(&state_bytes, cfg->gdn_k_dim) &&
              mul_size(&state_bytes, cfg->gdn_v_dim);
    if (!ok) {
        free(c);
        return ds_error_set(err, DS_ERR_INVALID_ARG, "cache: sizes overflow");
    }

    c->k = calloc((size_t)c->n_attn + 1, sizeof *c->k);
    c->v = calloc((size_t)c->n_attn + 1, sizeof *c->v);
    c->conv = calloc((size_t)c->n_gdn + 1, sizeof *c->conv);
    c->state = calloc((size_t)c->n_gdn + 1, sizeof *c->state);
    if (!c->k || !c->v || !c->conv || !c->state) {
        ds_cpu_cache_free(be, c);
        return ds_error_set(err, DS_ERR_NOMEM, "cache: out of memory");
    }
    for (int i = 0; i < c->n_attn; i++) {
        c->k[i] = ds_cpu_aligned_alloc(kv_bytes);
        c->v[i] = ds_cpu_aligned_alloc(kv_bytes);
        if (!c->k[i] || !c->v[i]) {
            ds_cpu_cache_free(be, c);
            return ds_error_set(err, DS_ERR_NOMEM, "cache: cannot allocate %zu-byte KV pool",
                                kv_bytes);
        }
    }
    for (int i = 0; i < c->n_gdn; i++) {
        c->conv[i] = ds_cpu_aligned_alloc(conv_bytes);
        c->state[i] = ds_cpu_aligned_alloc(state_bytes);
        if (!c->conv[i] || !c->state[i]) {
            ds_cpu_cache_free(be, c);
            return ds_error_set(err, DS_ERR_NOMEM, "cache: cannot allocate %zu-byte GDN state pool",
                                state_bytes);
        }
    }
    *out = c;
    return DS_OK;
}

void ds_cpu_cache_free(ds_backend *be, ds_cache *c) {
    (void)be;
    if (!c) return;
    for (int i = 0; c->k && i < c->n_attn; i++) ds_cpu_aligned_free(c->k[i]);
    for (int i = 0; c->v && i < c->n_attn; i++) ds_cpu_aligned_free(c->v[i]);
    for (int i = 0; c->conv && i < c->n_gdn; i++) ds_cpu_aligned_free(c->conv[i]);
    for (int i = 0; c->state && i < c->n_gdn; i++) ds_cpu_aligned_free(c->state[i]);
    free(c->k);
    free(c->v);
    free(c->conv);
    free(c->state);
    free(c);
}

void ds_cpu_cache_reset_slot(ds_backend *be, ds_cache *c, int slot) {
    (void)be;
    DS_ASSERT(slot >= 0 && slot < c->desc.n_slots);
    for (int i = 0; i < c->n_gdn; i++) {
        memset(c->conv[i] + (size_t)slot * conv_slot_floats(c), 0,
               conv_slot_floats(c) * sizeof(float));
        memset(c->state[i] + (size_t)slot * state_slot_floats(c), 0,
               state_slot_floats(c) * sizeof(float));
    }
}

/* ---- views (cpu_backend.h) ------------------------------------------------------------------- */

static int pool_index(const ds_cache *c, int layer, bool attn) {
    if (layer < 0 || layer >= c->n_layers || c->is_attn[layer] != attn) return -1;
    return c->pool_of_layer[layer];
}

float *ds_cpu_cache_gdn_state(ds_cache *c, int layer, int slot) {
    int p = pool_index(c, layer, false);
    if (p < 0 || slot < 0 || slot >= c->desc.n_slots) return NULL;
    return c->state[p] + (size_t)slot * state_slot_floats(c);
}

float *ds_cpu_cache_gdn_conv(ds_cache *c, int layer, int slot) {
    int p = pool_index(c, layer, false);
    if (p < 0 || slot < 0 || slot >= c->desc.n_slots) return NULL;
    return c->conv[p] + (size_t)slot * conv_slot_floats(c);
}

float *ds_cpu_cache_k(ds_cache *c, int layer) {
    int p = pool_index(c, layer, true);
    return p < 0 ? NULL : c->k[p];
}

float *ds_cpu_cache_v(ds_cache *c, int layer) {
    int p = pool_index(c, layer, true);
    return p < 0 ? NULL : c->v[p];
}
