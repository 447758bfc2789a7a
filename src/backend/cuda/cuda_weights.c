/* cuda_weights.c — prepare_weights / release_weights: host weights → one device arena.
 *
 * Two passes over the same walk: the first only sums sizes (so one cudaMalloc holds every
 * weight), the second converts and copies. Conventions of the device copy:
 *  - matrices become bf16; every ds_linear becomes ONE part [n_out, n_in] (its parts stacked in
 *    order), so GDN in_proj (qkv|z|b|a), attention q|k|v and gate|up are one GEMV each;
 *  - norm vectors, the GDN conv weight, neg_exp_A, dt_bias stay F32 (weights.h);
 *  - MoE: router [E, H] | shared gate_up [2Is, H] | shared gate [1, H] are contiguous (one
 *    GEMV computes all three), experts are contiguous gate_up [E, 2I, H] and down [E, H, I];
 *    experts[e] are views into them;
 *  - a tied lm_head is a view of the device embedding.
 * Host → device goes through two pinned staging buffers (convert into one while the other's
 * copy runs). Progress is shown on stderr when it is a terminal.
 *
 * Dummy weights (cuda_dummy.c) take the same walk over placeholder host weights whose data
 * points to a ds_cuda_gen descriptor: the copy pass then fills each tensor on the device with
 * a seeded counter-based generator (ds_cuda_fill_uniform, counter = byte offset in the arena),
 * so the layout is identical to a loaded checkpoint's and no host memory is touched. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backend/cuda/cuda_host.h"

#define STAGE_BYTES ((size_t)64 << 20)
#define ALIGN_BYTES 256

typedef struct wpriv {
    void *arena;
    size_t arena_bytes;
    ds_layer_weights *layers;
    ds_mtp_weights *mtp;
    ds_mlp_weights **experts; /* [n_expert_arrays] host arrays of views */
    int n_expert_arrays;
} wpriv;

typedef struct wbuild {
    ds_cuda_ctx *ctx;
    int copy;        /* 0: sizing pass, 1: copy pass */
    size_t off;      /* running offset in the arena */
    char *arena;
    void *stage[2];
    cudaEvent_t ev[2];
    int flip;
    size_t total, done, next_report;
    int progress;
    int gen;         /* dummy weights: fill on the device instead of copying */
    size_t zeros;    /* bytes of wb_zero padding so far: not counted in the dummy generator's
                      * counter, so padding leaves every dummy weight's value as it was (where
                      * it is a multiple of ALIGN_BYTES, as at H % 128 == 0: real shapes) */
    uint64_t seed;
    ds_status st;
    ds_error *err;
} wbuild;

static int wb_failed(wbuild *b) { return b->st != DS_OK; }

static void wb_align(wbuild *b) { b->off = (b->off + ALIGN_BYTES - 1) & ~(size_t)(ALIGN_BYTES - 1); }

/* Device address at the current offset (in the sizing pass, an offset from a null base; the
 * views built then are overwritten by the copy pass). */
static void *wb_ptr(wbuild *b) { return (void *)((uintptr_t)b->arena + b->off); }

static void wb_report(wbuild *b, int final) {
    if (!b->progress) return;
    if (!final && b->done < b->next_report) return;
    if (b->gen) DS_CU(b->ctx, cudaStreamSynchronize(b->ctx->stream)); /* show what is done */
    fprintf(stderr, "\rdeltaserve: %s %6.2f / %.2f GB",
            b->gen ? "generating dummy weights on the GPU" : "copying weights to the GPU",
            (double)b->done / 1e9, (double)b->total / 1e9);
    if (final) fputc('\n', stderr);
    fflush(stderr);
    b->next_report = b->done + ((size_t)512 << 20);
}

/* Appends the n elements of src (F32/BF16/F16) converted to dst_dt (BF16 or F32). */
static void wb_put(wbuild *b, const ds_tensor *src, ds_dtype dst_dt, const char *what) {
    if (wb_failed(b)) return;
    if (src->dtype != DS_DTYPE_F32 && src->dtype != DS_DTYPE_BF16 && src->dtype != DS_DTYPE_F16) {
        b->st = ds_error_set(b->err, DS_ERR_UNSUPPORTED, "CUDA weights: %s has dtype %s", what,
                             ds_dtype_name(src->dtype));
        return;
    }
    if (!src->data) {
        b->st = ds_error_set(b->err, DS_ERR_FORMAT, "CUDA weights: %s has no data", what);
        return;
    }
    const size_t n = (size_t)ds_tensor_numel(src);
    const size_t dsz = ds_dtype_size(dst_dt);
    if (!b->copy) {
        b->off += n * dsz;
        return;
    }
    if (b->gen) {
        const ds_cuda_gen *g = src->data;
        float lo = g->lo, hi = g->hi;
        if (g->matrix) { /* std 1/sqrt(fan_in): uniform ±sqrt(3/fan_in), fan_in = last dim */
            const float a = sqrtf(3.0f / (float)src->ne[src->ndim - 1]);
            lo = -a;
            hi = a;
        }
        ds_cuda_fill_uniform(b->ctx, b->arena + b->off, dst_dt == DS_DTYPE_BF16, n, b->seed,
                             (uint64_t)(b->off - b->zeros), lo, hi);
        b->done += n * dsz;
        wb_report(b, 0);
        if (b->ctx->failed)
            b->st = ds_error_set(b->err, DS_ERR_DEVICE, "CUDA weights: %s", b->ctx->errmsg);
        b->off += n * dsz;
        return;
    }
    const size_t per = STAGE_BYTES / dsz;
    for (size_t i0 = 0; i0 < n; i0 += per) {
        const size_t m = n - i0 < per ? n - i0 : per;
        const int f = b->flip;
        if (DS_CU(b->ctx, cudaEventSynchronize(b->ev[f]))) break;
        void *buf = b->stage[f];
        if (src->dtype == dst_dt) {
            memcpy(buf, (const char *)src->data + i0 * dsz, m * dsz);
        } else if (dst_dt == DS_DTYPE_BF16) {
            uint16_t *o = buf;
            if (src->dtype == DS_DTYPE_F32)
                for (size_t i = 0; i < m; i++) o[i] = ds_f32_to_bf16(((const float *)src->data)[i0 + i]);
            else
                for (size_t i = 0; i < m; i++)
                    o[i] = ds_f32_to_bf16(ds_f16_to_f32(((const uint16_t *)src->data)[i0 + i]));
        } else {
            float *o = buf;
            for (size_t i = 0; i < m; i++) o[i] = ds_tensor_get_f32(src, (int64_t)(i0 + i));
        }
        if (DS_CU(b->ctx, cudaMemcpyAsync(b->arena + b->off + i0 * dsz, buf, m * dsz,
                                          cudaMemcpyHostToDevice, b->ctx->stream)) ||
            DS_CU(b->ctx, cudaEventRecord(b->ev[f], b->ctx->stream)))
            break;
        b->flip ^= 1;
        b->done += m * dsz;
        wb_report(b, 0);
    }
    if (b->ctx->failed)
        b->st = ds_error_set(b->err, DS_ERR_DEVICE, "CUDA weights: %s", b->ctx->errmsg);
    b->off += n * dsz;
}

/* Appends `bytes` of zeros (padding rows a kernel may read but whose results nobody uses). */
static void wb_zero(wbuild *b, size_t bytes) {
    if (wb_failed(b) || bytes == 0) return;
    if (b->copy && DS_CU(b->ctx, cudaMemsetAsync(b->arena + b->off, 0, bytes, b->ctx->stream)))
        b->st = ds_error_set(b->err, DS_ERR_DEVICE, "CUDA weights: %s", b->ctx->errmsg);
    b->off += bytes;
    b->zeros += bytes;
}

/* A standalone tensor (same shape) in dtype dt. */
static ds_tensor wb_tensor(wbuild *b, const ds_tensor *src, ds_dtype dt, const char *what) {
    wb_align(b);
    ds_tensor t = *src;
    t.dtype = dt;
    t.data = wb_ptr(b);
    wb_put(b, src, dt, what);
    return t;
}

static ds_tensor wb_f32(wbuild *b, const ds_tensor *src, const char *what) {
    return wb_tensor(b, src, DS_DTYPE_F32, what);
}

/* Appends the parts of l (rows stacked) without alignment; checks their shapes. */
static void wb_put_linear(wbuild *b, const ds_linear *l, const char *what) {
    if (wb_failed(b)) return;
    int64_t rows = 0;
    for (int p = 0; p < l->n_parts; p++) {
        const ds_tensor *t = &l->parts[p];
        if (t->ndim != 2 || t->ne[1] != l->n_in) {
            b->st = ds_error_set(b->err, DS_ERR_FORMAT,
                                 "CUDA weights: %s part %d is not [*, %lld]", what, p,
                                 (long long)l->n_in);
            return;
        }
        rows += t->ne[0];
        wb_put(b, t, DS_DTYPE_BF16, what);
    }
    if (rows != l->n_out)
        b->st = ds_error_set(b->err, DS_ERR_FORMAT, "CUDA weights: %s parts have %lld rows, not %lld",
                             what, (long long)rows, (long long)l->n_out);
}

static ds_linear linear_view(void *data, int64_t n_out, int64_t n_in) {
    ds_linear l = {.n_parts = 1, .n_out = n_out, .n_in = n_in};
    l.parts[0] = (ds_tensor){.data = data, .dtype = DS_DTYPE_BF16, .ndim = 2, .ne = {n_out, n_in}};
    return l;
}

/* One fused bf16 matrix [n_out, n_in]. */
static ds_linear wb_linear(wbuild *b, const ds_linear *l, const char *what) {
    wb_align(b);
    void *p = wb_ptr(b);
    wb_put_linear(b, l, what);
    return linear_view(p, l->n_out, l->n_in);
}

static void wb_moe(wbuild *b, const ds_moe_weights *h, ds_moe_weights *o, const char *what) {
    const int E = h->n_experts;
    o->n_experts = E;
    o->has_shared = h->has_shared;
    if (E <= 0 || !h->experts) {
        b->st = ds_error_set(b->err, DS_ERR_FORMAT, "CUDA weights: %s has no experts", what);
        return;
    }
    const int64_t H = h->router.ndim == 2 ? h->router.ne[1] : 0;
    const int64_t I = h->experts[0].gate_up.n_out / 2;
    if (h->router.ndim != 2 || h->router.ne[0] != E) {
        b->st = ds_error_set(b->err, DS_ERR_FORMAT, "CUDA weights: %s router is not [%d, H]", what, E);
        return;
    }
    /* router | shared gate_up | shared gate */
    wb_align(b);
    void *base = wb_ptr(b);
    o->router = (ds_tensor){.data = base, .dtype = DS_DTYPE_BF16, .ndim = 2, .ne = {E, H}};
    wb_put(b, &h->router, DS_DTYPE_BF16, what);
    if (h->has_shared) {
        const ds_linear *sg = &h->shared.gate_up;
        if (sg->n_in != H || ds_tensor_numel(&h->shared_gate) != H) {
            b->st = ds_error_set(b->err, DS_ERR_FORMAT, "CUDA weights: %s shared expert shapes", what);
            return;
        }
        o->shared.gate_up = linear_view(wb_ptr(b), sg->n_out, H);
        wb_put_linear(b, sg, what);
        o->shared_gate = (ds_tensor){.data = wb_ptr(b), .dtype = DS_DTYPE_BF16, .ndim = 2, .ne = {1, H}};
        wb_put(b, &h->shared_gate, DS_DTYPE_BF16, what);
    }
    /* zero rows up to the 8-aligned count, so that the prefill router GEMM may cover them all
     * in one cuBLASLt call (ctx->router_pad): what is laid out since base, up to in_rows rows */
    const int Is = h->has_shared ? (int)(h->shared.gate_up.n_out / 2) : 0;
    const size_t laid = (size_t)((char *)wb_ptr(b) - (char *)base);
    wb_zero(b, (size_t)ds_cuda_moe_in_rows(E, Is) * (size_t)H * 2 - laid);
    /* experts: gate_up [E, 2I, H] then down [E, H, I] */
    wb_align(b);
    for (int e = 0; e < E && !wb_failed(b); e++) {
        const ds_mlp_weights *x = &h->experts[e];
        if (x->gate_up.n_out != 2 * I || x->gate_up.n_in != H || x->down.n_out != H ||
            x->down.n_in != I) {
            b->st = ds_error_set(b->err, DS_ERR_FORMAT, "CUDA weights: %s expert %d shapes differ",
                                 what, e);
            return;
        }
        o->experts[e].gate_up = linear_view(wb_ptr(b), 2 * I, H);
        wb_put_linear(b, &x->gate_up, what);
    }
    wb_align(b);
    for (int e = 0; e < E && !wb_failed(b); e++) {
        o->experts[e].down = linear_view(wb_ptr(b), H, I);
        wb_put_linear(b, &h->experts[e].down, what);
    }
    if (h->has_shared) o->shared.down = wb_linear(b, &h->shared.down, what);
}

static void wb_layer(wbuild *b, const ds_config *cfg, const ds_layer_weights *h,
                     ds_layer_weights *o, const char *what) {
    o->type = h->type;
    o->input_norm = wb_f32(b, &h->input_norm, what);
    o->post_norm = wb_f32(b, &h->post_norm, what);
    if (h->type == DS_LAYER_FULL_ATTN) {
        o->attn.qkv = wb_linear(b, &h->attn.qkv, what);
        o->attn.q_norm = wb_f32(b, &h->attn.q_norm, what);
        o->attn.k_norm = wb_f32(b, &h->attn.k_norm, what);
        o->attn.o = wb_linear(b, &h->attn.o, what);
    } else {
        o->gdn.in_proj = wb_linear(b, &h->gdn.in_proj, what);
        o->gdn.conv = wb_f32(b, &h->gdn.conv, what);
        o->gdn.neg_exp_A = wb_f32(b, &h->gdn.neg_exp_A, what);
        o->gdn.dt_bias = wb_f32(b, &h->gdn.dt_bias, what);
        o->gdn.norm = wb_f32(b, &h->gdn.norm, what);
        o->gdn.out = wb_linear(b, &h->gdn.out, what);
    }
    if (cfg->is_moe) {
        wb_moe(b, &h->moe, &o->moe, what);
    } else {
        o->mlp.gate_up = wb_linear(b, &h->mlp.gate_up, what);
        o->mlp.down = wb_linear(b, &h->mlp.down, what);
    }
}

static void wb_model(wbuild *b, const ds_config *cfg, const ds_model_weights *h,
                     ds_model_weights *o) {
    o->embed = wb_tensor(b, &h->embed, DS_DTYPE_BF16, "embed_tokens");
    o->final_norm = wb_f32(b, &h->final_norm, "final norm");
    const int tied = h->lm_head.n_parts == 1 && h->lm_head.parts[0].data == h->embed.data;
    if (tied)
        o->lm_head = linear_view(o->embed.data, h->embed.ne[0], h->embed.ne[1]);
    else
        o->lm_head = wb_linear(b, &h->lm_head, "lm_head");
    o->n_layers = h->n_layers;
    char what[64];
    for (int i = 0; i < h->n_layers && !wb_failed(b); i++) {
        snprintf(what, sizeof what, "layer %d", i);
        wb_layer(b, cfg, &h->layers[i], &o->layers[i], what);
    }
    if (h->mtp && !wb_failed(b)) {
        o->mtp->fc = wb_linear(b, &h->mtp->fc, "mtp.fc");
        o->mtp->norm_embedding = wb_f32(b, &h->mtp->norm_embedding, "mtp norm");
        o->mtp->norm_hidden = wb_f32(b, &h->mtp->norm_hidden, "mtp norm");
        o->mtp->final_norm = wb_f32(b, &h->mtp->final_norm, "mtp norm");
        wb_layer(b, cfg, &h->mtp->layer, &o->mtp->layer, "mtp layer");
    }
}

void ds_cuda_release_weights(ds_backend *be, ds_model_weights *w) {
    ds_cuda_ctx *ctx = ds_cuda_ctx_of(be);
    wpriv *p = w->owner;
    if (p) {
        DS_CU(ctx, cudaStreamSynchronize(ctx->stream));
        ds_cuda_graphs_free(ctx); /* graphs read these weights */
        cudaFree(p->arena);
        for (int i = 0; i < p->n_expert_arrays; i++) free(p->experts[i]);
        free(p->experts);
        free(p->layers);
        free(p->mtp);
        free(p);
    }
    memset(w, 0, sizeof *w);
}

/* Host-side arrays of the output (layers, expert views, MTP). */
static wpriv *alloc_views(const ds_config *cfg, const ds_model_weights *h, ds_model_weights *o) {
    wpriv *p = ds_xcalloc(1, sizeof *p);
    p->layers = ds_xcalloc((size_t)(h->n_layers > 0 ? h->n_layers : 1), sizeof *p->layers);
    p->experts = ds_xcalloc((size_t)h->n_layers + 1, sizeof *p->experts);
    o->layers = p->layers;
    if (h->mtp) {
        p->mtp = ds_xcalloc(1, sizeof *p->mtp);
        o->mtp = p->mtp;
    }
    if (cfg->is_moe) {
        for (int i = 0; i <= h->n_layers; i++) {
            const ds_moe_weights *hm = i < h->n_layers ? &h->layers[i].moe
                                                       : (h->mtp ? &h->mtp->layer.moe : NULL);
            ds_moe_weights *om = i < h->n_layers ? &o->layers[i].moe
                                                 : (h->mtp ? &o->mtp->layer.moe : NULL);
            if (!hm) continue;
            const int E = hm->n_experts > 0 ? hm->n_experts : 1;
            p->experts[p->n_expert_arrays++] = om->experts = ds_xcalloc((size_t)E, sizeof(ds_mlp_weights));
        }
    }
    o->owner = p;
    return p;
}

ds_status ds_cuda_prepare_weights(ds_backend *be, const ds_config *cfg,
                                  const ds_model_weights *host, ds_model_weights *out,
                                  ds_error *err) {
    return ds_cuda_build_weights(be, cfg, host, 0, 0, out, err);
}

ds_status ds_cuda_build_weights(ds_backend *be, const ds_config *cfg, const ds_model_weights *host,
                                int gen, uint64_t seed, ds_model_weights *out, ds_error *err) {
    ds_cuda_ctx *ctx = ds_cuda_ctx_of(be);
    memset(out, 0, sizeof *out);
    if (host->n_layers != cfg->n_layers || !host->layers)
        return ds_error_set(err, DS_ERR_FORMAT, "CUDA weights: %d layers for a %d-layer config",
                            host->n_layers, cfg->n_layers);
    if (ctx->capturing)
        return ds_error_set(err, DS_ERR_INTERNAL, "CUDA weights: inside a graph capture");
    wpriv *p = alloc_views(cfg, host, out);
    wbuild b = {.ctx = ctx, .err = err, .st = DS_OK, .gen = gen, .seed = seed};

    /* pass 1: sizes */
    wb_model(&b, cfg, host, out);
    if (b.st) goto fail;
    wb_align(&b);
    const size_t total = b.off;
    if (cudaMalloc(&p->arena, total) != cudaSuccess) {
        (void)cudaGetLastError();
        p->arena = NULL;
        b.st = ds_error_set(err, DS_ERR_NOMEM, "CUDA weights: cannot allocate %.2f GB on the GPU",
                            (double)total / 1e9);
        goto fail;
    }
    p->arena_bytes = total;

    /* pass 2: convert + copy (or generate) */
    for (int i = 0; i < 2 && !gen; i++) {
        if (cudaHostAlloc(&b.stage[i], STAGE_BYTES, cudaHostAllocDefault) != cudaSuccess ||
            cudaEventCreateWithFlags(&b.ev[i], cudaEventDisableTiming) != cudaSuccess) {
            (void)cudaGetLastError();
            b.st = ds_error_set(err, DS_ERR_NOMEM, "CUDA weights: cannot allocate pinned staging");
            break;
        }
    }
    if (!b.st) {
        b.copy = 1;
        b.off = 0;
        b.zeros = 0;
        b.arena = p->arena;
        b.total = total;
        b.progress = isatty(STDERR_FILENO) && total > ((size_t)1 << 30);
        wb_model(&b, cfg, host, out);
        DS_CU(ctx, cudaStreamSynchronize(ctx->stream));
        wb_report(&b, 1);
        if (!b.st && ctx->failed)
            b.st = ds_error_set(err, DS_ERR_DEVICE, "CUDA weights: %s", ctx->errmsg);
    }
    for (int i = 0; i < 2; i++) {
        if (b.stage[i]) cudaFreeHost(b.stage[i]);
        if (b.ev[i]) cudaEventDestroy(b.ev[i]);
    }
    if (b.st) goto fail;

    /* MoE scratch for this model's shape (all MoE layers, MTP included, share one shape) */
    if (cfg->is_moe && host->n_layers > 0) {
        const ds_moe_weights *m = &out->layers[0].moe;
        const int64_t H = m->router.ne[1];
        const int64_t I = m->experts[0].gate_up.n_out / 2;
        const int64_t Is = m->has_shared ? m->shared.gate_up.n_out / 2 : 0;
        const size_t need = ds_cuda_moe_scratch_bytes((int)H, m->n_experts, cfg->top_k, (int)I, (int)Is);
        if (need > ctx->moe_scratch_bytes) {
            cudaFree(ctx->d_moe_scratch);
            ctx->d_moe_scratch = NULL;
            ctx->moe_scratch_bytes = 0;
            if (cudaMalloc(&ctx->d_moe_scratch, need) != cudaSuccess) {
                (void)cudaGetLastError();
                ctx->d_moe_scratch = NULL;
                b.st = ds_error_set(err, DS_ERR_NOMEM,
                                    "CUDA weights: cannot allocate %.2f GB of MoE scratch",
                                    (double)need / 1e9);
                goto fail;
            }
            ctx->moe_scratch_bytes = need;
        }
    }
    /* scratch of the GDN prefill form (cuda_gdn_prefill.cu) when it is built for this shape;
     * without it prefill runs the fused kernel */
    const size_t gdn_need = cfg->gdn_v_heads > 0
                                ? ds_cuda_gdn_prefill_scratch_bytes(cfg->gdn_k_heads, cfg->gdn_v_heads,
                                                                    cfg->gdn_k_dim, cfg->gdn_v_dim,
                                                                    cfg->gdn_conv_kernel)
                                : 0;
    if (gdn_need > ctx->gdn_scratch_bytes) {
        cudaFree(ctx->d_gdn_scratch);
        ctx->d_gdn_scratch = NULL;
        ctx->gdn_scratch_bytes = 0;
        if (cudaMalloc(&ctx->d_gdn_scratch, gdn_need) != cudaSuccess) {
            (void)cudaGetLastError();
            ctx->d_gdn_scratch = NULL;
            b.st = ds_error_set(err, DS_ERR_NOMEM, "CUDA weights: cannot allocate %.2f GB of GDN scratch",
                                (double)gdn_need / 1e9);
            goto fail;
        }
        ctx->gdn_scratch_bytes = gdn_need;
    }
    return DS_OK;
fail:
    ds_cuda_release_weights(be, out);
    return b.st;
}
