/* cuda_backend.c — the CUDA backend's context: creation, memory, synchronisation, the batch
 * upload, and the op table (ops live in cuda_ops.c, weights in cuda_weights.c, caches in
 * cuda_cache.c, kernels in cuda_*.cu).
 *
 * One stream per backend; ops only enqueue work on it. Errors are sticky: the first failing
 * CUDA/cuBLASLt call or launch is recorded with file:line and returned by synchronize(). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "backend/cuda/cuda_host.h"
#include "backend/cuda/cuda_internal.h"

int ds_cuda_check(ds_cuda_ctx *ctx, cudaError_t e, const char *what, const char *file, int line) {
    if (e == cudaSuccess) return 0;
    if (!ctx->failed) {
        ctx->failed = 1;
        snprintf(ctx->errmsg, sizeof ctx->errmsg, "%s:%d: %s: %s (%s)", file, line, what,
                 cudaGetErrorName(e), cudaGetErrorString(e));
    }
    return 1;
}

int ds_cuda_check_lt(ds_cuda_ctx *ctx, cublasStatus_t s, const char *what, const char *file,
                     int line) {
    if (s == CUBLAS_STATUS_SUCCESS) return 0;
    if (!ctx->failed) {
        ctx->failed = 1;
        snprintf(ctx->errmsg, sizeof ctx->errmsg, "%s:%d: %s: cuBLAS status %d", file, line, what,
                 (int)s);
    }
    return 1;
}

ds_cuda_ctx *ds_cuda_ctx_of(ds_backend *be) { return (ds_cuda_ctx *)be->impl; }

/* ---- lifetime ---------------------------------------------------------------------------- */

static void cu_destroy(ds_backend *be) {
    if (!be) return;
    ds_cuda_ctx *c = ds_cuda_ctx_of(be);
    if (c) {
        if (c->stream) cudaStreamSynchronize(c->stream);
        for (int i = 0; i < DS_CUDA_LT_CACHE; i++) {
            ds_cuda_lt_plan *p = &c->lt_plans[i];
            if (!p->used) continue;
            cublasLtMatmulDescDestroy(p->op);
            cublasLtMatrixLayoutDestroy(p->a);
            cublasLtMatrixLayoutDestroy(p->b);
            cublasLtMatrixLayoutDestroy(p->c);
        }
        if (c->lt) cublasLtDestroy(c->lt);
        cudaFree(c->d_lt_ws);
        cudaFree(c->d_splitk_ws);
        cudaFree(c->d_splitk_cnt);
        cudaFree(c->d_meta);
        cudaFree(c->d_ids);
        cudaFree(c->d_moe_scratch);
        for (int i = 0; i < 2; i++) {
            if (c->h_meta[i]) cudaFreeHost(c->h_meta[i]);
            if (c->meta_done[i]) cudaEventDestroy(c->meta_done[i]);
        }
        if (c->h_ids) cudaFreeHost(c->h_ids);
        if (c->stream) cudaStreamDestroy(c->stream);
        free(c);
    }
    free(be);
}

/* ---- memory ------------------------------------------------------------------------------- */

static void *cu_alloc(ds_backend *be, size_t bytes) {
    ds_cuda_ctx *c = ds_cuda_ctx_of(be);
    void *p = NULL;
    if (cudaMalloc(&p, bytes ? bytes : 1) != cudaSuccess) {
        (void)cudaGetLastError(); /* an OOM is reported by NULL, not as a sticky device error */
        return NULL;
    }
    if (DS_CU(c, cudaMemsetAsync(p, 0, bytes, c->stream))) {
        cudaFree(p);
        return NULL;
    }
    return p;
}

static void cu_free(ds_backend *be, void *p) {
    if (!p) return;
    ds_cuda_ctx *c = ds_cuda_ctx_of(be);
    DS_CU(c, cudaFree(p)); /* cudaFree waits for the device: never inside a step */
}

/* upload/download return with the host buffer reusable (they wait for the stream). */
static void cu_upload(ds_backend *be, void *dst, const void *src, size_t bytes) {
    ds_cuda_ctx *c = ds_cuda_ctx_of(be);
    if (!bytes) return;
    DS_CU(c, cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, c->stream));
    DS_CU(c, cudaStreamSynchronize(c->stream));
}

static void cu_download(ds_backend *be, void *dst, const void *src, size_t bytes) {
    ds_cuda_ctx *c = ds_cuda_ctx_of(be);
    if (!bytes) return;
    DS_CU(c, cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, c->stream));
    DS_CU(c, cudaStreamSynchronize(c->stream));
}

static ds_status cu_synchronize(ds_backend *be, ds_error *err) {
    ds_cuda_ctx *c = ds_cuda_ctx_of(be);
    DS_CU(c, cudaStreamSynchronize(c->stream));
    if (c->failed) return ds_error_set(err, DS_ERR_DEVICE, "CUDA backend: %s", c->errmsg);
    return DS_OK;
}

/* ---- batch ------------------------------------------------------------------------------- */

/* Packs the host arrays into pinned staging and uploads them with one async copy. Two staging
 * buffers alternate; before refilling one we wait for its previous upload (issued a step ago,
 * normally long finished), so the host never overwrites bytes a pending copy still reads. */
static void cu_set_batch(ds_backend *be, const ds_batch *b) {
    ds_cuda_ctx *c = ds_cuda_ctx_of(be);
    const int T = b->n_tokens, S = b->n_seqs, mb = b->max_blocks, no = b->n_out;
    DS_ASSERT(T >= 0 && T <= DS_CUDA_MAX_TOKENS);
    DS_ASSERT(S >= 0 && S <= DS_CUDA_MAX_SEQS);
    DS_ASSERT(no >= 0 && no <= DS_CUDA_MAX_TOKENS);
    DS_ASSERT(mb >= 0);
    const int64_t total = 3 * (int64_t)T + (S + 1) + 2 * (int64_t)S + no + (int64_t)S * mb;
    DS_ASSERT(total <= DS_CUDA_META_INTS);

    const int f = c->meta_flip;
    DS_CU(c, cudaEventSynchronize(c->meta_done[f]));
    int32_t *h = c->h_meta[f];
    int64_t o = 0;
    const int64_t o_tokens = o; o += T;
    const int64_t o_pos = o; o += T;
    const int64_t o_start = o; o += S + 1;
    const int64_t o_slot = o; o += S;
    const int64_t o_past = o; o += S;
    const int64_t o_out = o; o += no;
    const int64_t o_tokseq = o; o += T;
    const int64_t o_bt = o; o += (int64_t)S * mb;

    if (T) {
        memcpy(h + o_tokens, b->tokens, sizeof(int32_t) * (size_t)T);
        memcpy(h + o_pos, b->positions, sizeof(int32_t) * (size_t)T);
    }
    memcpy(h + o_start, b->seq_start, sizeof(int32_t) * (size_t)(S + 1));
    if (S) {
        memcpy(h + o_slot, b->seq_slot, sizeof(int32_t) * (size_t)S);
        memcpy(h + o_past, b->seq_n_past, sizeof(int32_t) * (size_t)S);
    }
    if (no) memcpy(h + o_out, b->out_rows, sizeof(int32_t) * (size_t)no);
    if (S && mb) memcpy(h + o_bt, b->block_table, sizeof(int32_t) * (size_t)S * (size_t)mb);
    int max_tok = 0, max_ctx = 0;
    DS_ASSERT(b->seq_start[0] == 0 && b->seq_start[S] == T);
    for (int s = 0; s < S; s++) {
        const int n = b->seq_start[s + 1] - b->seq_start[s];
        DS_ASSERT(n >= 0);
        for (int t = b->seq_start[s]; t < b->seq_start[s + 1]; t++) h[o_tokseq + t] = s;
        if (n > max_tok) max_tok = n;
        if (b->seq_n_past[s] + n > max_ctx) max_ctx = b->seq_n_past[s] + n;
    }
    for (int r = 0; r < no; r++) DS_ASSERT(b->out_rows[r] >= 0 && b->out_rows[r] < T);

    if (total > 0)
        DS_CU(c, cudaMemcpyAsync(c->d_meta, h, sizeof(int32_t) * (size_t)total,
                                 cudaMemcpyHostToDevice, c->stream));
    DS_CU(c, cudaEventRecord(c->meta_done[f], c->stream));
    c->meta_flip ^= 1;

    ds_cuda_batch *d = &c->batch;
    d->n_tokens = T;
    d->n_seqs = S;
    d->max_blocks = mb;
    d->n_out = no;
    d->tokens = c->d_meta + o_tokens;
    d->positions = c->d_meta + o_pos;
    d->seq_start = c->d_meta + o_start;
    d->seq_slot = c->d_meta + o_slot;
    d->n_past = c->d_meta + o_past;
    d->out_rows = c->d_meta + o_out;
    d->tok_seq = c->d_meta + o_tokseq;
    d->block_table = c->d_meta + o_bt;
    c->info.max_seq_tokens = max_tok;
    c->info.max_ctx = max_ctx;
    c->h_cur = h;
    c->h_positions_off = (int)o_pos;
    c->h_seq_start_off = (int)o_start;
    c->h_seq_slot_off = (int)o_slot;
    c->h_block_table_off = (int)o_bt;
    c->h_tok_seq_off = (int)o_tokseq;
}

/* ---- op table ----------------------------------------------------------------------------- */

static const ds_backend_ops cuda_ops = {
    .name = "cuda",
    .act_dtype = DS_DTYPE_BF16,
    .destroy = cu_destroy,
    .alloc = cu_alloc,
    .free = cu_free,
    .upload = cu_upload,
    .download = cu_download,
    .synchronize = cu_synchronize,
    .prepare_weights = ds_cuda_prepare_weights,
    .release_weights = ds_cuda_release_weights,
    .cache_create = ds_cuda_cache_create,
    .cache_free = ds_cuda_cache_free,
    .cache_reset_slot = ds_cuda_cache_reset_slot,
    .set_batch = cu_set_batch,
    .embed = ds_cuda_op_embed,
    .rmsnorm = ds_cuda_op_rmsnorm,
    .add_rmsnorm = ds_cuda_op_add_rmsnorm,
    .linear = ds_cuda_op_linear,
    .silu_mul = ds_cuda_op_silu_mul,
    .gather_rows = ds_cuda_op_gather_rows,
    .attention = ds_cuda_op_attention,
    .gdn = ds_cuda_op_gdn,
    .moe = ds_cuda_op_moe,
    .logits = ds_cuda_op_logits,
    .argmax = ds_cuda_op_argmax,
};

#define CREATE_CHECK(call)                                                                      \
    do {                                                                                        \
        cudaError_t e_ = (call);                                                                \
        if (e_ != cudaSuccess) {                                                                \
            st = ds_error_set(err,                                                              \
                              e_ == cudaErrorMemoryAllocation ? DS_ERR_NOMEM : DS_ERR_DEVICE,   \
                              "CUDA backend: %s failed at %s:%d: %s", #call, __FILE__, __LINE__, \
                              cudaGetErrorString(e_));                                          \
            goto fail;                                                                          \
        }                                                                                       \
    } while (0)

ds_status ds_backend_cuda_create(int device, ds_backend **out, ds_error *err) {
    *out = NULL;
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess || n == 0) {
        (void)cudaGetLastError();
        return ds_error_set(err, DS_ERR_UNSUPPORTED, "no CUDA device available (%s)",
                            e != cudaSuccess ? cudaGetErrorString(e) : "0 devices");
    }
    if (device < 0 || device >= n)
        return ds_error_set(err, DS_ERR_INVALID_ARG, "CUDA device %d does not exist (%d present)",
                            device, n);
    ds_status st = DS_OK;
    ds_backend *be = ds_xcalloc(1, sizeof *be);
    ds_cuda_ctx *c = ds_xcalloc(1, sizeof *c);
    be->ops = &cuda_ops;
    be->impl = c;
    c->device = device;
    {
        const char *rows = getenv("DS_CUDA_GEMV_ROWS"); /* measurement knob, see cuda_notes.md */
        c->gemv_rows = rows ? atoi(rows) : 2;
    }
    CREATE_CHECK(cudaSetDevice(device));
    struct cudaDeviceProp prop;
    CREATE_CHECK(cudaGetDeviceProperties(&prop, device));
    c->sm_count = prop.multiProcessorCount;
    c->smem_optin = prop.sharedMemPerBlockOptin;
    CREATE_CHECK(cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking));
    for (int i = 0; i < 2; i++) {
        CREATE_CHECK(cudaHostAlloc((void **)&c->h_meta[i], sizeof(int32_t) * DS_CUDA_META_INTS,
                                   cudaHostAllocDefault));
        CREATE_CHECK(cudaEventCreateWithFlags(&c->meta_done[i], cudaEventDisableTiming));
    }
    CREATE_CHECK(cudaMalloc((void **)&c->d_meta, sizeof(int32_t) * DS_CUDA_META_INTS));
    CREATE_CHECK(cudaMalloc((void **)&c->d_splitk_ws, sizeof(float) * DS_CUDA_SPLITK_WS_FLOATS));
    CREATE_CHECK(cudaMalloc((void **)&c->d_splitk_cnt, sizeof(int) * DS_CUDA_SPLITK_COUNTERS));
    CREATE_CHECK(cudaMemset(c->d_splitk_cnt, 0, sizeof(int) * DS_CUDA_SPLITK_COUNTERS));
    CREATE_CHECK(cudaMalloc(&c->d_lt_ws, DS_CUDA_LT_WS_BYTES));
    CREATE_CHECK(cudaMalloc((void **)&c->d_ids, sizeof(int32_t) * DS_CUDA_MAX_TOKENS));
    CREATE_CHECK(cudaHostAlloc((void **)&c->h_ids, sizeof(int32_t) * DS_CUDA_MAX_TOKENS,
                               cudaHostAllocDefault));
    {
        cublasStatus_t s = cublasLtCreate(&c->lt);
        if (s != CUBLAS_STATUS_SUCCESS) {
            st = ds_error_set(err, DS_ERR_DEVICE,
                              "CUDA backend: cublasLtCreate failed (status %d)", (int)s);
            goto fail;
        }
    }
    CREATE_CHECK(cudaDeviceSynchronize());
    *out = be;
    return DS_OK;
fail:
    (void)cudaGetLastError();
    cu_destroy(be);
    return st;
}
