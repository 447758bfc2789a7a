/* cuda_cache.c — device caches: a paged bf16 KV pool per attention layer (model layers, then
 * MTP layers numbered n_layers + i, as on the CPU backend) and fp32 GDN state + conv history
 * per slot. Also the per-cache attention workspace (decode split partials) and the RoPE
 * inverse frequencies, computed on the host exactly like the CPU backend so both backends
 * rotate by the same float32 angles. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "backend/cuda/cuda_host.h"

static ds_status cache_alloc(ds_cuda_ctx *ctx, void **p, size_t bytes, const char *what,
                             ds_error *err) {
    if (bytes == 0) {
        *p = NULL;
        return DS_OK;
    }
    if (cudaMalloc(p, bytes) != cudaSuccess) {
        (void)cudaGetLastError();
        *p = NULL;
        return ds_error_set(err, DS_ERR_NOMEM, "CUDA cache: cannot allocate %.2f GiB for %s",
                            (double)bytes / (1 << 30), what);
    }
    if (DS_CU(ctx, cudaMemsetAsync(*p, 0, bytes, ctx->stream)))
        return ds_error_set(err, DS_ERR_DEVICE, "CUDA cache: %s", ctx->errmsg);
    return DS_OK;
}

/* a·b·… in size_t with overflow detection (sizes come from config.json and CLI args) */
static int mul_ok(size_t *acc, int64_t v) {
    if (v < 0 || (v != 0 && *acc > SIZE_MAX / (size_t)v)) return 0;
    *acc *= (size_t)v;
    return 1;
}

ds_status ds_cuda_cache_create(ds_backend *be, const ds_config *cfg, const ds_cache_desc *desc,
                               ds_cache **out, ds_error *err) {
    ds_cuda_ctx *ctx = ds_cuda_ctx_of(be);
    *out = NULL;
    if (desc->n_slots <= 0 || desc->n_blocks < 0 || desc->block_size <= 0)
        return ds_error_set(err, DS_ERR_INVALID_ARG,
                            "cache: need n_slots > 0, n_blocks >= 0, block_size > 0 (got %d, %d, %d)",
                            desc->n_slots, desc->n_blocks, desc->block_size);
    const int n_layers = cfg->n_layers + cfg->n_mtp_layers;
    if (cfg->n_layers <= 0 || cfg->n_layers > DS_MAX_LAYERS || cfg->n_mtp_layers < 0 ||
        n_layers > DS_CUDA_MAX_CACHE_LAYERS)
        return ds_error_set(err, DS_ERR_INVALID_ARG, "cache: bad layer counts (%d layers, %d mtp)",
                            cfg->n_layers, cfg->n_mtp_layers);
    ds_cache *c = ds_xcalloc(1, sizeof *c);
    c->n_slots = desc->n_slots;
    c->n_blocks = desc->n_blocks;
    c->block_size = desc->block_size;
    c->n_layers = n_layers;
    for (int i = 0; i < n_layers; i++) {
        const int attn = i >= cfg->n_layers || cfg->layer_types[i] == DS_LAYER_FULL_ATTN;
        c->attn_index[i] = attn ? c->n_attn++ : -1;
        c->gdn_index[i] = attn ? -1 : c->n_gdn++;
    }
    c->nkv = cfg->n_kv_heads;
    c->hd = cfg->head_dim;
    ds_status st = DS_OK;

    size_t kv = 1;
    int ok = mul_ok(&kv, desc->n_blocks) && mul_ok(&kv, desc->block_size) &&
             mul_ok(&kv, cfg->n_kv_heads) && mul_ok(&kv, cfg->head_dim);
    c->kv_pool_elems = kv;
    size_t kv_bytes = kv;
    ok = ok && mul_ok(&kv_bytes, 2 * 2) && mul_ok(&kv_bytes, c->n_attn); /* K+V, bf16 */

    const int64_t conv_ch = 2 * (int64_t)cfg->gdn_k_dim + cfg->gdn_v_dim;
    c->state_layer_floats = (int64_t)cfg->gdn_v_heads * cfg->gdn_k_dim * cfg->gdn_v_dim;
    c->conv_layer_floats = (int64_t)cfg->gdn_v_heads * conv_ch * (cfg->gdn_conv_kernel - 1);
    size_t state_bytes = sizeof(float), conv_bytes = sizeof(float);
    ok = ok && mul_ok(&state_bytes, desc->n_slots) && mul_ok(&state_bytes, c->n_gdn) &&
         mul_ok(&state_bytes, c->state_layer_floats) && mul_ok(&conv_bytes, desc->n_slots) &&
         mul_ok(&conv_bytes, c->n_gdn) && mul_ok(&conv_bytes, c->conv_layer_floats);
    if (!ok) {
        free(c);
        return ds_error_set(err, DS_ERR_INVALID_ARG, "cache: sizes overflow");
    }
    if ((st = cache_alloc(ctx, &c->kv, kv_bytes, "the KV cache", err)) ||
        (st = cache_alloc(ctx, (void **)&c->state, c->n_gdn ? state_bytes : 0, "GDN states", err)) ||
        (st = cache_alloc(ctx, (void **)&c->conv, c->n_gdn ? conv_bytes : 0, "GDN conv history", err)))
        goto fail;

    if (c->n_attn > 0) {
        const int rot = cfg->rot_dim;
        const int half = rot / 2 > 0 ? rot / 2 : 1;
        float *inv = ds_xmalloc(sizeof(float) * (size_t)half);
        /* float32, as PyTorch builds it (and as the CPU backend does) */
        for (int i = 0; i < rot / 2; i++)
            inv[i] = 1.0f / powf((float)cfg->rope_theta, (float)(2 * i) / (float)rot);
        st = cache_alloc(ctx, (void **)&c->inv_freq, sizeof(float) * (size_t)half, "RoPE table", err);
        if (st == DS_OK) {
            DS_CU(ctx, cudaMemcpyAsync(c->inv_freq, inv, sizeof(float) * (size_t)half,
                                       cudaMemcpyHostToDevice, ctx->stream));
            DS_CU(ctx, cudaStreamSynchronize(ctx->stream));
        }
        free(inv);
        if (st) goto fail;
        c->attn_ws_rows = DS_CUDA_ATTN_SPLIT_ROWS * cfg->n_heads;
        st = cache_alloc(ctx, (void **)&c->attn_ws,
                         sizeof(float) * (size_t)c->attn_ws_rows * (size_t)(cfg->head_dim + 2),
                         "attention workspace", err);
        if (st) goto fail;
    }
    if (ctx->failed) {
        st = ds_error_set(err, DS_ERR_DEVICE, "CUDA cache: %s", ctx->errmsg);
        goto fail;
    }
    *out = c;
    return DS_OK;
fail:
    ds_cuda_cache_free(be, c);
    return st;
}

void ds_cuda_cache_free(ds_backend *be, ds_cache *c) {
    if (!c) return;
    ds_cuda_ctx *ctx = ds_cuda_ctx_of(be);
    DS_CU(ctx, cudaStreamSynchronize(ctx->stream));
    ds_cuda_graphs_free(ctx); /* graphs read and write this cache */
    cudaFree(c->kv);
    cudaFree(c->state);
    cudaFree(c->conv);
    cudaFree(c->inv_freq);
    cudaFree(c->attn_ws);
    free(c);
}

void ds_cuda_cache_reset_slot(ds_backend *be, ds_cache *c, int slot) {
    ds_cuda_ctx *ctx = ds_cuda_ctx_of(be);
    DS_ASSERT(slot >= 0 && slot < c->n_slots);
    if (!c->n_gdn) return;
    const size_t sf = (size_t)c->n_gdn * (size_t)c->state_layer_floats;
    const size_t cf = (size_t)c->n_gdn * (size_t)c->conv_layer_floats;
    DS_CU(ctx, cudaMemsetAsync(c->state + (size_t)slot * sf, 0, sf * sizeof(float), ctx->stream));
    DS_CU(ctx, cudaMemsetAsync(c->conv + (size_t)slot * cf, 0, cf * sizeof(float), ctx->stream));
}
