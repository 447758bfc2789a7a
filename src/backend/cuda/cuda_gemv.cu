/* cuda_gemv.cu — out[R, N] = x[R, K] · Wᵀ: a bandwidth-bound GEMV for R ≤ 8 rows (decode) and
 * cuBLASLt bf16 GEMM with fp32 accumulation for more rows (prefill).
 *
 * GEMV grid: blockIdx.x covers 8 warps × ROWS output rows; blockIdx.y splits K when there are
 * too few row blocks to fill the chip (narrow N). Split-K is deterministic: each split writes
 * fp32 partials, the last block to arrive (per-tile counter) sums them in split order and
 * resets the counter to 0, so the next launch (or a graph replay) finds it clean. */
#include "cuda_gemv.cuh"

#define GEMV_WARPS 8

template <int R, int ROWS, int UNROLL, typename OutT>
__global__ void __launch_bounds__(GEMV_WARPS * 32)
    gemv_kernel(const bf16 *__restrict__ W, int64_t N, int64_t K, const bf16 *__restrict__ x,
                int64_t ldx, OutT *__restrict__ out, int64_t ldo, int64_t k_per_split,
                float *__restrict__ ws, int *__restrict__ counters) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int64_t n0 = ((int64_t)blockIdx.x * GEMV_WARPS + warp) * ROWS;
    const int64_t k0 = (int64_t)blockIdx.y * k_per_split;
    const int64_t k1 = k0 + k_per_split < K ? k0 + k_per_split : K;
    XRows<R> xs;
#pragma unroll
    for (int r = 0; r < R; r++) xs.base[r] = x + r * ldx;

    float acc[ROWS][R];
#pragma unroll
    for (int rr = 0; rr < ROWS; rr++)
#pragma unroll
        for (int r = 0; r < R; r++) acc[rr][r] = 0.f;
    if (n0 < N) gemv_warp_partial<R, ROWS, UNROLL, true>(W, K, n0, N, xs, k0, k1, acc);
    gemv_warp_reduce<R, ROWS>(acc);

    if (gridDim.y == 1) {
        if (lane == 0 && n0 < N) {
#pragma unroll
            for (int rr = 0; rr < ROWS; rr++)
                if (n0 + rr < N)
#pragma unroll
                    for (int r = 0; r < R; r++) store_out(out + r * ldo + n0 + rr, acc[rr][r]);
        }
        return;
    }

    /* split-K: partials ws[split][r][n] */
    if (lane == 0 && n0 < N) {
#pragma unroll
        for (int rr = 0; rr < ROWS; rr++)
            if (n0 + rr < N)
#pragma unroll
                for (int r = 0; r < R; r++)
                    ws[((int64_t)blockIdx.y * R + r) * N + n0 + rr] = acc[rr][r];
    }
    __threadfence();
    __syncthreads();
    __shared__ int is_last;
    if (threadIdx.x == 0) {
        int prev = atomicAdd(&counters[blockIdx.x], 1);
        is_last = (prev == (int)gridDim.y - 1);
    }
    __syncthreads();
    if (!is_last) return;
    __threadfence();
    /* the last block: sum the splits in order (deterministic), one output per thread */
    const int64_t nb0 = (int64_t)blockIdx.x * GEMV_WARPS * ROWS;
    for (int i = threadIdx.x; i < GEMV_WARPS * ROWS * R; i += blockDim.x) {
        const int64_t n = nb0 + i % (GEMV_WARPS * ROWS);
        const int r = i / (GEMV_WARPS * ROWS);
        if (n >= N) continue;
        float s = 0.f;
        for (int sp = 0; sp < (int)gridDim.y; sp++) s += __ldcg(&ws[((int64_t)sp * R + r) * N + n]);
        store_out(out + r * ldo + n, s);
    }
    if (threadIdx.x == 0) counters[blockIdx.x] = 0;
}

template <int R, int ROWS, int UNROLL, typename OutT>
static void launch_gemv(ds_cuda_ctx *ctx, dim3 grid, const bf16 *W, int64_t N, int64_t K,
                        const bf16 *x, int64_t ldx, OutT *out, int64_t ldo, int64_t kps) {
    gemv_kernel<R, ROWS, UNROLL, OutT><<<grid, GEMV_WARPS * 32, 0, ctx->stream>>>(
        W, N, K, x, ldx, out, ldo, kps, ctx->d_splitk_ws, ctx->d_splitk_cnt);
}

template <int ROWS, int UNROLL, typename OutT>
static void dispatch_r(ds_cuda_ctx *ctx, dim3 grid, const bf16 *W, int64_t N, int64_t K,
                       const bf16 *x, int64_t ldx, int R, OutT *out, int64_t ldo, int64_t kps) {
    switch (R) {
    case 1: launch_gemv<1, ROWS, UNROLL>(ctx, grid, W, N, K, x, ldx, out, ldo, kps); break;
    case 2: launch_gemv<2, ROWS, UNROLL>(ctx, grid, W, N, K, x, ldx, out, ldo, kps); break;
    case 3: launch_gemv<3, ROWS, UNROLL>(ctx, grid, W, N, K, x, ldx, out, ldo, kps); break;
    case 4: launch_gemv<4, ROWS, UNROLL>(ctx, grid, W, N, K, x, ldx, out, ldo, kps); break;
    case 5: launch_gemv<5, ROWS, UNROLL>(ctx, grid, W, N, K, x, ldx, out, ldo, kps); break;
    case 6: launch_gemv<6, ROWS, UNROLL>(ctx, grid, W, N, K, x, ldx, out, ldo, kps); break;
    case 7: launch_gemv<7, ROWS, UNROLL>(ctx, grid, W, N, K, x, ldx, out, ldo, kps); break;
    default: launch_gemv<8, ROWS, UNROLL>(ctx, grid, W, N, K, x, ldx, out, ldo, kps); break;
    }
}

extern "C" void ds_cuda_gemv(ds_cuda_ctx *ctx, const void *W, int64_t N, int64_t K,
                             const void *x, int64_t ldx, int R, void *out, int64_t ldo,
                             int out_f32) {
    if (N <= 0 || R <= 0) return;
    const int rows = ctx->gemv_rows == 1 || ctx->gemv_rows == 4 ? ctx->gemv_rows : 2;
    const int64_t rows_per_block = (int64_t)GEMV_WARPS * rows;
    const int64_t bx = DS_DIV_UP(N, rows_per_block);
    /* split K when the row blocks cannot fill two waves of one block per SM */
    int64_t splits = 1;
    const int64_t target = 2 * (int64_t)ctx->sm_count;
    if (bx < target && K >= 1024) {
        splits = DS_DIV_UP(target, bx);
        if (splits > K / 512) splits = K / 512;
        if (splits > 16) splits = 16;
        while (splits > 1 && (splits * R * N > DS_CUDA_SPLITK_WS_FLOATS || bx > DS_CUDA_SPLITK_COUNTERS))
            splits--;
    }
    int64_t kps = K;
    if (splits > 1) {
        kps = DS_DIV_UP(DS_DIV_UP(K, splits), 256) * 256;
        splits = DS_DIV_UP(K, kps);
    }
    dim3 grid((unsigned)bx, (unsigned)splits);
    const bf16 *Wb = (const bf16 *)W, *xb = (const bf16 *)x;
    if (out_f32) {
        float *o = (float *)out;
        if (rows == 1) dispatch_r<1, 8>(ctx, grid, Wb, N, K, xb, ldx, R, o, ldo, kps);
        else if (rows == 4) dispatch_r<4, 2>(ctx, grid, Wb, N, K, xb, ldx, R, o, ldo, kps);
        else dispatch_r<2, 4>(ctx, grid, Wb, N, K, xb, ldx, R, o, ldo, kps);
    } else {
        bf16 *o = (bf16 *)out;
        if (rows == 1) dispatch_r<1, 8>(ctx, grid, Wb, N, K, xb, ldx, R, o, ldo, kps);
        else if (rows == 4) dispatch_r<4, 2>(ctx, grid, Wb, N, K, xb, ldx, R, o, ldo, kps);
        else dispatch_r<2, 4>(ctx, grid, Wb, N, K, xb, ldx, R, o, ldo, kps);
    }
    DS_CU_LAUNCHED(ctx, "gemv_kernel");
}

/* ---- cuBLASLt ---------------------------------------------------------------------------- */

static uint32_t lt_align(const void *p, int64_t pitch_bytes) {
    uint64_t v = (uint64_t)(uintptr_t)p | (uint64_t)pitch_bytes | 256u;
    return (uint32_t)(v & (~v + 1)); /* lowest set bit, at most 256 */
}

/* Row-major out[R, N] = x[R, K] · W[N, K]ᵀ is, in cuBLASLt's column-major terms,
 * D (N×R, ld ldo) = op(A)·B with A = W stored K×N (ld K), op(A) = Aᵀ, B = x stored K×R (ld ldx). */
static ds_cuda_lt_plan *lt_plan(ds_cuda_ctx *ctx, int64_t N, int64_t K, int64_t ldx, int R,
                                int64_t ldo, int out_f32, const uint32_t align[3]) {
    const int ctype = out_f32 ? CUDA_R_32F : CUDA_R_16BF;
    for (int i = 0; i < DS_CUDA_LT_CACHE; i++) {
        ds_cuda_lt_plan *p = &ctx->lt_plans[i];
        if (p->used && p->m == N && p->n == R && p->k == K && p->lda == K && p->ldb == ldx &&
            p->ldc == ldo && p->ctype == ctype && p->align[0] == align[0] &&
            p->align[1] == align[1] && p->align[2] == align[2])
            return p;
    }
    ds_cuda_lt_plan *p = &ctx->lt_plans[ctx->lt_next];
    ctx->lt_next = (ctx->lt_next + 1) % DS_CUDA_LT_CACHE;
    if (p->used) {
        cublasLtMatmulDescDestroy(p->op);
        cublasLtMatrixLayoutDestroy(p->a);
        cublasLtMatrixLayoutDestroy(p->b);
        cublasLtMatrixLayoutDestroy(p->c);
        p->used = 0;
    }
    p->m = N; p->n = R; p->k = K; p->lda = K; p->ldb = ldx; p->ldc = ldo; p->ctype = ctype;
    for (int i = 0; i < 3; i++) p->align[i] = align[i];
    if (DS_LT(ctx, cublasLtMatmulDescCreate(&p->op, CUBLAS_COMPUTE_32F, CUDA_R_32F))) return NULL;
    cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
    int bad = 0;
    bad |= DS_LT(ctx, cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
    bad |= DS_LT(ctx, cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
    bad |= DS_LT(ctx, cublasLtMatrixLayoutCreate(&p->a, CUDA_R_16BF, (uint64_t)K, (uint64_t)N, K));
    bad |= DS_LT(ctx, cublasLtMatrixLayoutCreate(&p->b, CUDA_R_16BF, (uint64_t)K, (uint64_t)R, ldx));
    bad |= DS_LT(ctx, cublasLtMatrixLayoutCreate(&p->c, (cudaDataType_t)ctype, (uint64_t)N, (uint64_t)R, ldo));
    cublasLtMatmulPreference_t pref;
    bad |= DS_LT(ctx, cublasLtMatmulPreferenceCreate(&pref));
    size_t wsb = DS_CUDA_LT_WS_BYTES;
    bad |= DS_LT(ctx, cublasLtMatmulPreferenceSetAttribute(
                          pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &wsb, sizeof wsb));
    /* the heuristic otherwise assumes 256-byte aligned operands (e.g. a part's column offset
     * in a multi-part output, or an fp32 output with an odd row length, are less aligned) */
    bad |= DS_LT(ctx, cublasLtMatmulPreferenceSetAttribute(
                          pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &align[0], sizeof align[0]));
    bad |= DS_LT(ctx, cublasLtMatmulPreferenceSetAttribute(
                          pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &align[1], sizeof align[1]));
    bad |= DS_LT(ctx, cublasLtMatmulPreferenceSetAttribute(
                          pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &align[2], sizeof align[2]));
    bad |= DS_LT(ctx, cublasLtMatmulPreferenceSetAttribute(
                          pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &align[2], sizeof align[2]));
    cublasLtMatmulHeuristicResult_t res;
    int nres = 0;
    bad |= DS_LT(ctx, cublasLtMatmulAlgoGetHeuristic(ctx->lt, p->op, p->a, p->b, p->c, p->c, pref,
                                                     1, &res, &nres));
    cublasLtMatmulPreferenceDestroy(pref);
    if (bad || nres < 1) {
        if (!bad) ds_cuda_check_lt(ctx, CUBLAS_STATUS_NOT_SUPPORTED, "no cuBLASLt algorithm",
                                   __FILE__, __LINE__);
        return NULL; /* descriptors leak only on this error path; the backend is failed anyway */
    }
    p->algo = res.algo;
    p->used = 1;
    return p;
}

extern "C" void ds_cuda_gemm_lt(ds_cuda_ctx *ctx, const void *W, int64_t N, int64_t K,
                                const void *x, int64_t ldx, int R, void *out, int64_t ldo,
                                int out_f32) {
    if (N <= 0 || R <= 0) return;
    /* alignment each operand really has: its address and its row pitch */
    const uint32_t align[3] = {lt_align(W, K * 2), lt_align(x, ldx * 2),
                               lt_align(out, ldo * (out_f32 ? 4 : 2))};
    ds_cuda_lt_plan *p = lt_plan(ctx, N, K, ldx, R, ldo, out_f32, align);
    if (!p) return;
    const float alpha = 1.f, beta = 0.f;
    DS_LT(ctx, cublasLtMatmul(ctx->lt, p->op, &alpha, W, p->a, x, p->b, &beta, out, p->c, out,
                              p->c, &p->algo, ctx->d_lt_ws, DS_CUDA_LT_WS_BYTES, ctx->stream));
}
