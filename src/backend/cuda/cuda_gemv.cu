/* cuda_gemv.cu — out[R, N] = x[R, K] · Wᵀ: a bandwidth-bound GEMV for R ≤ 8 rows (decode) and
 * cuBLASLt bf16 GEMM with fp32 accumulation for more rows (prefill); and the fused lm_head +
 * argmax for greedy decode (the same GEMV with a (max, index) epilogue, no logits written).
 *
 * GEMV grid: blockIdx.x covers 8 warps × ROWS output rows; blockIdx.y splits K when there are
 * too few row blocks to fill the chip (narrow N). Split-K is deterministic: each split writes
 * fp32 partials, the last block to arrive (per-tile counter) sums them in split order and
 * resets the counter to 0, so the next launch (or a graph replay) finds it clean. */
#include <math.h>

#include "cuda_argmax.cuh"
#include "cuda_gemv.cuh"
#include "cuda_launch.cuh"

/* PRE2: the warp's second batch of weights is loaded before the wait too (ctx->gemv_preload 2,
 * launches whose warps have at most two batches: then every weight of the launch is in
 * registers before its predecessor ends — the output projections, whose predecessor, the GDN or
 * the attention's last launch, leaves most SMs idle for microseconds). Same chunks in the same
 * order: the same sums as without. */
template <int R, int ROWS, int UNROLL, typename OutT, bool PRE2 = false>
__global__ void __launch_bounds__(GEMV_WARPS * 32)
    gemv_kernel(const bf16 *__restrict__ W, int64_t N, int64_t K, const bf16 *__restrict__ x,
                int64_t ldx, OutT *__restrict__ out, int64_t ldo, int64_t k_per_split,
                float *__restrict__ ws, int *__restrict__ counters, int pf_bytes, int preload) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int64_t n0 = ((int64_t)blockIdx.x * GEMV_WARPS + warp) * ROWS;
    const int64_t k0 = (int64_t)blockIdx.y * k_per_split;
    const int64_t k1 = k0 + k_per_split < K ? k0 + k_per_split : K;
    /* weights only, while the predecessor finishes (cuda_launch.cuh) */
    if (pf_bytes > 0 && lane < ROWS && n0 + lane < N) {
        const int64_t span = (k1 - k0) * 2; /* the last split may be shorter */
        prefetch_l2(W + (n0 + lane) * K + k0, (uint32_t)(pf_bytes < span ? pf_bytes : span));
    }
    WBatch<ROWS, UNROLL> first; /* the first weights before the wait (gemv_preload) */
    const bool pre = gemv_preload<ROWS, UNROLL>(W, K, n0, N, k0, k1, lane, preload, first);
    WBatch<ROWS, UNROLL> second;
    const int64_t kb2 = k0 + lane * 8 + 256 * UNROLL; /* this lane's column in the second batch */
    if (PRE2 && pre) {
        const bf16 *wrow[ROWS];
        gemv_rows<ROWS>(W, K, n0, N, wrow);
        wbatch_load<ROWS, UNROLL, true>(wrow, kb2, k1, second);
    }
    pdl_enter();
    XRows<R> xs;
#pragma unroll
    for (int r = 0; r < R; r++) xs.base[r] = x + r * ldx;
    float acc[ROWS][R];
    if (PRE2 && pre) {
#pragma unroll
        for (int rr = 0; rr < ROWS; rr++)
#pragma unroll
            for (int r = 0; r < R; r++) acc[rr][r] = 0.f;
        wbatch_fma<R, ROWS, UNROLL>(first, xs, kb2 - 256 * UNROLL, k1, acc);
        if (kb2 < k1) wbatch_fma<R, ROWS, UNROLL>(second, xs, kb2, k1, acc);
        if (kb2 + 256 * UNROLL < k1) /* more than two batches: the rest as usual */
            gemv_warp_partial<R, ROWS, UNROLL, true>(W, K, n0, N, xs, kb2 + 256 * UNROLL - lane * 8, k1, acc);
        gemv_warp_reduce<R, ROWS>(acc);
    } else {
        gemv_warp_sums<R, ROWS, UNROLL>(W, K, n0, N, xs, k0, k1, pre, first, acc);
    }

    gemv_block_store<R, ROWS>(acc, n0, N, out, ldo, ws, counters);
}

/* Bytes of each weight row (from its split's start) a GEMV block prefetches into L2 before it
 * waits for its predecessor: the whole row range when the matrix fits the prefetch budget, a
 * proportional head of it otherwise; none when prefetch is off or the grid is so large that
 * most blocks start long after the predecessor ended (nothing left to overlap). */
static int gemv_prefetch_bytes(const ds_cuda_ctx *ctx, int64_t N, int64_t K, int64_t kps,
                               int64_t blocks) {
    if (!ds_prefetch_on(ctx) || blocks > 8 * (int64_t)ctx->sm_count) return 0;
    const double total = (double)N * (double)K * 2.0;
    const double frac = total <= DS_CUDA_PREFETCH_BUDGET ? 1.0 : DS_CUDA_PREFETCH_BUDGET / total;
    const int64_t bytes = (int64_t)((double)kps * 2.0 * frac) & ~(int64_t)15;
    return bytes > (1 << 20) ? (1 << 20) : (int)bytes;
}

template <int R, int ROWS, int UNROLL, typename OutT>
static void launch_gemv(ds_cuda_ctx *ctx, dim3 grid, const bf16 *W, int64_t N, int64_t K,
                        const bf16 *x, int64_t ldx, OutT *out, int64_t ldo, int64_t kps) {
    const int pf = gemv_prefetch_bytes(ctx, N, K, kps, (int64_t)grid.x * grid.y);
    /* both batches before the wait (gemv_kernel PRE2) for one input row when a warp has two */
    /* (instantiated for R = 1 only) */
    if constexpr (R == 1) {
        if (ctx->gemv_preload == 2 && kps > 256 * UNROLL && kps <= 2 * 256 * UNROLL) {
            ds_launch(ctx, gemv_kernel<R, ROWS, UNROLL, OutT, true>, grid, GEMV_WARPS * 32, 0, W, N, K,
                      x, ldx, out, ldo, kps, ctx->d_splitk_ws, ctx->d_splitk_cnt, pf, 1);
            return;
        }
    }
    ds_launch(ctx, gemv_kernel<R, ROWS, UNROLL, OutT>, grid, GEMV_WARPS * 32, 0, W, N, K, x, ldx, out,
              ldo, kps, ctx->d_splitk_ws, ctx->d_splitk_cnt, pf, ctx->gemv_preload);
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
    /* Tensor cores for steps of two or more sequences; a one-sequence step (batch-1 decode, its
     * speculative verification with 1 + k rows, its draft passes) stays on the CUDA cores, which
     * stream one row faster: tensor cores cost 3.031 vs 2.878 ms per batch-1 step (s6-run1
     * ablation rows 7-8). Decided per step, not per row count, so that a batch-1 verification
     * row is computed exactly as the plain decode row it must reproduce (greedy speculation
     * token-identical to plain decoding); DS_CUDA_TC_ONE_SEQ=1 takes tensor cores for those too. */
    const bool tc = ctx->opt.tc_gemv && (ctx->batch.n_seqs > 1 || ctx->tc_one_seq);
    if (tc && ds_cuda_gemv_tc(ctx, W, N, K, x, ldx, R, out, ldo, out_f32)) return;
    ds_cuda_gemv_cores(ctx, W, N, K, x, ldx, R, out, ldo, out_f32);
}

extern "C" void ds_cuda_gemv_cores(ds_cuda_ctx *ctx, const void *W, int64_t N, int64_t K,
                                   const void *x, int64_t ldx, int R, void *out, int64_t ldo,
                                   int out_f32) {
    if (N <= 0 || R <= 0) return;
    const GemvPlan p = gemv_plan(ctx, N, K, R);
    const int rows = p.rows, splits = (int)p.splits;
    const int64_t kps = p.kps;
    dim3 grid((unsigned)p.bx, (unsigned)p.splits);
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
    DS_CU_LAUNCHED2(ctx, splits > 1 ? "gemv_kernel (split-K)" : "gemv_kernel", N, K);
}

/* ---- fused lm_head + argmax (greedy decode) ------------------------------------------------ */

/* Each block computes the dot products of GEMV_WARPS·ROWS weight rows a tile exactly as
 * gemv_kernel does (same chunking and reduction order, so the values equal the CUDA-core logits
 * path), keeps the best (value, row) per input row — and, for rows with banned ids, the best
 * that skips them (cuda_argmax.cuh) — over its tiles blockIdx.x, + gridDim.x, … (one each
 * unless ctx->amax_tiles shrinks the grid: each block's epilogue — its barriers, fence and
 * ticket — is then paid once for several tiles), and hands them on by atomicMax on one 64-bit
 * key per input row (ctx->amax_atomic, the default since session 20) or as partials that the
 * last block to finish merges. Keys vs partials: batch 1 / 4 / 8 2.933 / 5.548 / 8.383 vs
 * 2.940 / 5.571 / 8.419 ms (H100, s20-run1; 4 tiles a block 2.929 / 5.536 / 8.373, within
 * noise of 1). */
template <int R, int ROWS, int UNROLL>
__global__ void __launch_bounds__(GEMV_WARPS * 32)
    gemv_argmax_kernel(const bf16 *__restrict__ W, int64_t N, int64_t K, const bf16 *__restrict__ x,
                       int64_t ldx, float *__restrict__ pv, int32_t *__restrict__ pi,
                       int64_t masked_off, int *__restrict__ counter, int32_t *__restrict__ ids,
                       const int32_t *__restrict__ bans, int row0, int pf_bytes,
                       unsigned long long *__restrict__ keys) {
    constexpr int SPAN = GEMV_WARPS * ROWS; /* candidate rows of one tile */
    static_assert(SPAN <= 32, "one 32-bit ban mask per input row and tile");
    __shared__ float sv[2][GEMV_WARPS][R];
    __shared__ int si[2][GEMV_WARPS][R];
    __shared__ unsigned ban_bits[R];
    __shared__ int is_last;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int64_t tiles = DS_DIV_UP(N, (int64_t)SPAN);
    {
        const int64_t n0 = ((int64_t)blockIdx.x * GEMV_WARPS + warp) * ROWS;
        if (pf_bytes > 0 && lane < ROWS && n0 + lane < N) prefetch_l2(W + (n0 + lane) * K, (uint32_t)pf_bytes);
    }
    pdl_enter(); /* cuda_launch.cuh */
    XRows<R> xs;
#pragma unroll
    for (int r = 0; r < R; r++) xs.base[r] = x + r * ldx;
    const ArgmaxBans b = argmax_bans(bans, row0, R); /* the same in every thread */
    if (lane == 0) { /* the warp's running bests over its rows of every tile (shared: registers
                        held across the tile loop cost the 8-row kernels spills) */
#pragma unroll
        for (int r = 0; r < R; r++) {
            sv[0][warp][r] = sv[1][warp][r] = -INFINITY;
            si[0][warp][r] = si[1][warp][r] = 0x7fffffff;
        }
    }
    for (int64_t tile = blockIdx.x; tile < tiles; tile += gridDim.x) { /* uniform: barriers inside */
        const int64_t n0 = (tile * GEMV_WARPS + warp) * ROWS;
        float acc[ROWS][R];
#pragma unroll
        for (int rr = 0; rr < ROWS; rr++)
#pragma unroll
            for (int r = 0; r < R; r++) acc[rr][r] = 0.f;
        if (n0 < N) gemv_warp_partial<R, ROWS, UNROLL, true>(W, K, n0, N, xs, 0, K, acc);
        gemv_warp_reduce<R, ROWS>(acc);
        if (b.masked) argmax_ban_bits(bans, row0, b, tile * SPAN, SPAN, ban_bits);
        if (lane == 0) {
#pragma unroll
            for (int r = 0; r < R; r++) {
                const unsigned bits = b.masked && r < b.n_banned_rows ? ban_bits[r] : 0u;
                float bv = sv[0][warp][r], mv = sv[1][warp][r];
                int bi = si[0][warp][r], mi = si[1][warp][r];
#pragma unroll
                for (int rr = 0; rr < ROWS; rr++) {
                    if (n0 + rr >= N) continue;
                    amax_merge(bv, bi, acc[rr][r], (int)(n0 + rr));
                    if (!((bits >> (warp * ROWS + rr)) & 1u)) amax_merge(mv, mi, acc[rr][r], (int)(n0 + rr));
                }
                sv[0][warp][r] = bv;
                si[0][warp][r] = bi;
                sv[1][warp][r] = mv;
                si[1][warp][r] = mi;
            }
        }
        if (b.masked) __syncthreads(); /* ban_bits is rewritten by the next tile */
    }
    __syncthreads();
    if (keys) {
        argmax_block_keys(&sv[0][0][0], &si[0][0][0], GEMV_WARPS, R, R, b.masked, keys);
        if (argmax_last_block(counter, &is_last)) argmax_finish_keys(keys, R, b, ids);
    } else {
        argmax_block_partials(&sv[0][0][0], &si[0][0][0], GEMV_WARPS, R, R, b.masked, pv, pi, masked_off);
        if (argmax_last_block(counter, &is_last)) argmax_merge_partials(pv, pi, masked_off, R, b, ids);
    }
}

template <int ROWS, int UNROLL>
static void launch_argmax(ds_cuda_ctx *ctx, unsigned bx, const bf16 *W, int64_t N, int64_t K,
                          const bf16 *x, int64_t ldx, int R, int32_t *ids, int row0) {
    float *pv = ctx->d_amax_v;
    int32_t *pi = ctx->d_amax_i;
    const int64_t moff = (int64_t)DS_CUDA_AMAX_BLOCKS * 8; /* the masked partials follow */
    int *cnt = ctx->d_amax_cnt;
    const int32_t *bans = ctx->d_bans;
    const int pf = gemv_prefetch_bytes(ctx, N, K, K, bx);
    unsigned long long *keys = ctx->amax_atomic ? ctx->d_amax_key : NULL;
    switch (R) {
#define AMAX_CASE(RR)                                                                             \
    case RR:                                                                                      \
        ds_launch(ctx, gemv_argmax_kernel<RR, ROWS, UNROLL>, bx, GEMV_WARPS * 32, 0, W, N, K, x,  \
                  ldx, pv, pi, moff, cnt, ids, bans, row0, pf, keys);                             \
        break;
        AMAX_CASE(1) AMAX_CASE(2) AMAX_CASE(3) AMAX_CASE(4)
        AMAX_CASE(5) AMAX_CASE(6) AMAX_CASE(7) AMAX_CASE(8)
#undef AMAX_CASE
    default: break;
    }
}

extern "C" void ds_cuda_argmax_gemv(ds_cuda_ctx *ctx, const void *W, int64_t N, int64_t K,
                                    const void *x, int64_t ldx, int R, int32_t *d_ids) {
    if (N <= 0 || R <= 0) return;
    /* the same kernel as the logits path (ds_cuda_lm_head_tc: tensor cores for multi-sequence
     * steps), the same rows-per-warp variant as ds_cuda_gemv_cores, so the values match */
    const int rows = ctx->gemv_rows == 1 || ctx->gemv_rows == 4 ? ctx->gemv_rows : 2;
    const int64_t tiles = DS_DIV_UP(N, (int64_t)GEMV_WARPS * rows);
    /* blocks: one a tile, or a tile per amax_tiles (DS_CUDA_AMAX_TILES) */
    const int64_t bx = ctx->amax_tiles > 1 ? DS_DIV_UP(tiles, (int64_t)ctx->amax_tiles) : tiles;
    if (bx > DS_CUDA_AMAX_BLOCKS) {
        ds_cuda_check(ctx, cudaErrorInvalidValue, "argmax_gemv: vocabulary too large", __FILE__,
                      __LINE__);
        return;
    }
    const bf16 *Wb = (const bf16 *)W, *xb = (const bf16 *)x;
    const int tc = ds_cuda_lm_head_tc(ctx, N, K);
    for (int r0 = 0; r0 < R; r0 += 8) { /* chunks of 8 rows run one after the other */
        const int n = R - r0 < 8 ? R - r0 : 8;
        const bf16 *xr = xb + (int64_t)r0 * ldx;
        if (tc) {
            ds_cuda_argmax_gemv_tc(ctx, W, N, K, xr, ldx, n, d_ids + r0, r0);
            continue;
        }
        if (rows == 1) launch_argmax<1, 8>(ctx, (unsigned)bx, Wb, N, K, xr, ldx, n, d_ids + r0, r0);
        else if (rows == 4) launch_argmax<4, 2>(ctx, (unsigned)bx, Wb, N, K, xr, ldx, n, d_ids + r0, r0);
        else launch_argmax<2, 4>(ctx, (unsigned)bx, Wb, N, K, xr, ldx, n, d_ids + r0, r0);
        DS_CU_LAUNCHED2(ctx, "gemv_argmax_kernel", N, K);
    }
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
    /* the heuristic's first choice: timing its first 8 on the real operands (s7-run1) found
     * the prefill GEMMs within 10-20 % of the best (in_proj 70.8 vs 68.5 us, router 91 vs
     * 76 us), prefill 1024 tokens 78.09 vs 78.29 ms: not worth a choice that varies by run */
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

static void gemm_lt_one(ds_cuda_ctx *ctx, const void *W, int64_t N, int64_t K, const void *x,
                        int64_t ldx, int R, void *out, int64_t ldo, int out_f32) {
    /* alignment each operand really has: its address and its row pitch */
    const uint32_t align[3] = {lt_align(W, K * 2), lt_align(x, ldx * 2),
                               lt_align(out, ldo * (out_f32 ? 4 : 2))};
    ds_cuda_lt_plan *p = lt_plan(ctx, N, K, ldx, R, ldo, out_f32, align);
    if (!p) return;
    const float alpha = 1.f, beta = 0.f;
    DS_LT(ctx, cublasLtMatmul(ctx->lt, p->op, &alpha, W, p->a, x, p->b, &beta, out, p->c, out,
                              p->c, &p->algo, ctx->d_lt_ws, DS_CUDA_LT_WS_BYTES, ctx->stream));
    DS_CU_LAUNCHED2(ctx, "cublasLt gemm", N, K); /* counted as one kernel */
}

extern "C" void ds_cuda_gemm_lt(ds_cuda_ctx *ctx, const void *W, int64_t N, int64_t K,
                                const void *x, int64_t ldx, int R, void *out, int64_t ldo,
                                int out_f32) {
    if (N <= 0 || R <= 0) return;
    if (ctx->lt_split && N > 8 && N % 8 != 0) {
        /* the 8-aligned rows, then the rest (ctx->lt_split, DS_CUDA_LT_SPLIT): for a row count
         * that is not a multiple of 8 the heuristic picked a cutlass sm75 kernel for the whole
         * (the prefill router GEMM, router | shared gate_up | shared gate, 1281 rows at
         * 35B-A3B: 67 µs a layer at T = 1024, s9-run5; split, prefill 51.87 vs 54.71 ms, s9-run8) */
        const int64_t Na = N - N % 8;
        gemm_lt_one(ctx, W, Na, K, x, ldx, R, out, ldo, out_f32);
        gemm_lt_one(ctx, (const bf16 *)W + Na * K, N - Na, K, x, ldx, R,
                    (char *)out + (size_t)Na * (out_f32 ? 4 : 2), ldo, out_f32);
        return;
    }
    gemm_lt_one(ctx, W, N, K, x, ldx, R, out, ldo, out_f32);
}
