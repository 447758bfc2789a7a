/* cuda_gemv_tc.cu — out[R, N] = x[R, K] · Wᵀ for R ≤ 8 rows on tensor cores (DS_OPT_TC_GEMV).
 *
 * Why: the CUDA-core GEMV (cuda_gemv.cu) converts and multiplies every weight with every input
 * row on the FMA pipes; at R = 8 that is ~150 instructions per 16-byte weight chunk, and the
 * batch-8 projections ran at 2.0 TB/s, issue-bound, against 3.3 TB/s at R = 1 (s5-run1, ncu).
 * One mma.sync m16n8k16 does 16 rows × 8 inputs × 16 k, so the weights stream at the same rate
 * whatever R is.
 *
 * Layout. A block owns 16 output rows and one K range (its split); its 8 warps take contiguous
 * eighths of that range. Lane (g = lane / 4, t = lane % 4) loads 16 bytes — 8 consecutive k —
 * of weight rows g and g + 8 and of input row g, at physical k = kb + 8t (+ 32 per unrolled
 * step), so 4 lanes read 64 contiguous bytes of a row. The k order inside each 32-wide step is
 * permuted, the same way for W and x (a dot product does not care): for the two mma of a step
 * (s = 0, 1) logical k {2t, 2t+1} ↔ physical 8t + 4s + {0, 1} and logical {2t+8, 2t+9} ↔
 * physical 8t + 4s + {2, 3}, which is exactly 32-bit words 2s and 2s+1 of each lane's 16 bytes:
 * the fragments are the loaded registers, no shuffles. Input rows ≥ R are the mma's padding
 * columns (row 0's values, results dropped).
 *
 * The fp32 partial sums of the 8 warps meet in shared memory and are added in warp order; a
 * split K adds its splits in split order in the last block to finish (as gemv_kernel), so the
 * result is deterministic and does not depend on R (every output row is computed the same way
 * alone or in a batch: speculative verification stays token-identical to plain decoding). */
#include "cuda_argmax.cuh"
#include "cuda_gemv.cuh"
#include "cuda_launch.cuh"
#include "cuda_mma.cuh"

#define TC_WARPS 8
#define TC_UNROLL 4 /* 32-wide k steps in flight per lane: 3 × 16-byte loads each */

static __device__ __forceinline__ uint32_t word(const uint4 &v, int i) {
    return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w;
}

/* The block's 16 output rows n0.. × the R input rows over k in [k0, k1): each warp's fp32
 * partial sums into red[warp][row][input row] (not synchronised). */
static __device__ __forceinline__ void tc_block_products(const bf16 *__restrict__ W, int64_t N, int64_t K,
                                                         const bf16 *__restrict__ x, int64_t ldx, int R,
                                                         int64_t n0, int64_t k0, int64_t k1,
                                                         int tail_batched, float red[TC_WARPS][16][8]) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const int64_t kw = (k1 - k0) / TC_WARPS; /* a multiple of 32 (K % 256 == 0) */
    const int64_t kb0 = k0 + warp * kw, kb1 = kb0 + kw;
    const int64_t ra = n0 + g < N ? n0 + g : N - 1, rb = n0 + g + 8 < N ? n0 + g + 8 : N - 1;
    const bf16 *wa = W + ra * K + 8 * t, *wb = W + rb * K + 8 * t;
    const bf16 *xr = x + (g < R ? g : 0) * ldx + 8 * t;
    float c[4] = {0.f, 0.f, 0.f, 0.f};
    /* Every step of a batch is loaded before any is multiplied, the last batch too (predicated,
     * warp-uniform): a warp whose range is shorter than a batch (split K, K = 2048: 64 k per
     * warp) then pays one memory round trip instead of one per 32-wide step (s5-run3, ncu: the
     * router | shared gate_up launch ran at 0.9 TB/s with one-step-at-a-time tails). The mma
     * order along k is unchanged, so the results are too. tail_batched = 0 (knob
     * DS_CUDA_TC_TAIL=0, for before/after runs) walks a short tail one step at a time. */
    int64_t kb = kb0;
    for (; kb < kb1; kb += 32 * TC_UNROLL) {
        if (!tail_batched && kb + 32 * TC_UNROLL > kb1) break;
        uint4 va[TC_UNROLL], vb[TC_UNROLL], vx[TC_UNROLL];
#pragma unroll
        for (int u = 0; u < TC_UNROLL; u++)
            if (kb + 32 * u < kb1) {
                va[u] = ld_stream16(wa + kb + 32 * u);
                vb[u] = ld_stream16(wb + kb + 32 * u);
                vx[u] = ld_cached16(xr + kb + 32 * u);
            }
#pragma unroll
        for (int u = 0; u < TC_UNROLL; u++)
            if (kb + 32 * u < kb1)
#pragma unroll
                for (int s = 0; s < 2; s++)
                    mma_bf16_16816(c, word(va[u], 2 * s), word(vb[u], 2 * s), word(va[u], 2 * s + 1),
                                   word(vb[u], 2 * s + 1), word(vx[u], 2 * s), word(vx[u], 2 * s + 1));
    }
    for (; kb < kb1; kb += 32) { /* tail_batched = 0 only */
        const uint4 va = ld_stream16(wa + kb), vb = ld_stream16(wb + kb), vx = ld_cached16(xr + kb);
#pragma unroll
        for (int s = 0; s < 2; s++)
            mma_bf16_16816(c, word(va, 2 * s), word(vb, 2 * s), word(va, 2 * s + 1), word(vb, 2 * s + 1),
                           word(vx, 2 * s), word(vx, 2 * s + 1));
    }
    /* c0, c1: row g, inputs 2t, 2t+1; c2, c3: row g + 8, the same inputs */
    red[warp][g][2 * t] = c[0];
    red[warp][g][2 * t + 1] = c[1];
    red[warp][g + 8][2 * t] = c[2];
    red[warp][g + 8][2 * t + 1] = c[3];
}

/* Threads 0..127 after tc_block_products and a barrier: output row tid / 8, input row tid % 8,
 * the warps' partials added in warp order. */
static __device__ __forceinline__ float tc_block_sum(const float red[TC_WARPS][16][8]) {
    const int row = threadIdx.x >> 3, r = threadIdx.x & 7;
    float v = 0.f;
#pragma unroll
    for (int w = 0; w < TC_WARPS; w++) v += red[w][row][r];
    return v;
}

template <typename OutT>
__global__ void __launch_bounds__(TC_WARPS * 32)
    gemv_tc_kernel(const bf16 *__restrict__ W, int64_t N, int64_t K, const bf16 *__restrict__ x,
                   int64_t ldx, int R, OutT *__restrict__ out, int64_t ldo, int64_t k_per_split,
                   float *__restrict__ ws, int *__restrict__ counters, int tail_batched) {
    __shared__ float red[TC_WARPS][16][8]; /* [warp][row][input row] */
    __shared__ int is_last;
    pdl_enter(); /* cuda_launch.cuh: before any access */
    const int64_t n0 = (int64_t)blockIdx.x * 16;
    const int64_t k0 = (int64_t)blockIdx.y * k_per_split;
    const int64_t k1 = k0 + k_per_split < K ? k0 + k_per_split : K;
    tc_block_products(W, N, K, x, ldx, R, n0, k0, k1, tail_batched, red);
    __syncthreads();
    const int row = threadIdx.x >> 3, r = threadIdx.x & 7; /* threads 0..127: one output each */
    const float v = threadIdx.x < 128 ? tc_block_sum(red) : 0.f;
    const bool mine = threadIdx.x < 128 && r < R && n0 + row < N;
    if (gridDim.y == 1) {
        if (mine) store_out(out + r * ldo + n0 + row, v);
        return;
    }
    /* split K: partials ws[split][r][n], the last block of this row tile adds them in order */
    if (mine) ws[((int64_t)blockIdx.y * R + r) * N + n0 + row] = v;
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) is_last = atomicAdd(&counters[blockIdx.x], 1) == (int)gridDim.y - 1;
    __syncthreads();
    if (!is_last) return;
    __threadfence();
    if (mine) {
        float s = 0.f;
        for (int sp = 0; sp < (int)gridDim.y; sp++) s += __ldcg(&ws[((int64_t)sp * R + r) * N + n0 + row]);
        store_out(out + r * ldo + n0 + row, s);
    }
    if (threadIdx.x == 0) counters[blockIdx.x] = 0; /* clean for the next launch or replay */
}

/* The fused lm_head + argmax of multi-sequence steps (cuda_argmax.cuh): the values of
 * gemv_tc_kernel without a split (the logits op takes the same kernel for these steps, see
 * ds_cuda_lm_head_tc), then per input row the best of the block's 16 candidate rows — and the
 * best that skips banned ids — as the block's partials; the last block merges them. The
 * CUDA-core kernel at 8 rows is issue-bound (s7-run3 ncu: 445 µs for the 35B-A3B lm_head at
 * batch 8 against 244 µs at batch 1). */
__global__ void __launch_bounds__(TC_WARPS * 32)
    gemv_tc_argmax_kernel(const bf16 *__restrict__ W, int64_t N, int64_t K, const bf16 *__restrict__ x,
                          int64_t ldx, int R, float *__restrict__ pv, int32_t *__restrict__ pi,
                          int64_t masked_off, int *__restrict__ counter, int32_t *__restrict__ ids,
                          const int32_t *__restrict__ bans, int row0, int tail_batched,
                          unsigned long long *__restrict__ keys) {
    __shared__ float red[TC_WARPS][16][8];
    __shared__ float sv[2][4][8]; /* [plain | masked][warp 0..3][input row] */
    __shared__ int si[2][4][8];
    __shared__ unsigned ban_bits[8];
    __shared__ int is_last;
    pdl_enter(); /* cuda_launch.cuh: before any access */
    const int64_t n0 = (int64_t)blockIdx.x * 16;
    tc_block_products(W, N, K, x, ldx, R, n0, 0, K, tail_batched, red);
    const ArgmaxBans b = argmax_bans(bans, row0, R); /* the same in every thread */
    if (b.masked) argmax_ban_bits(bans, row0, b, n0, 16, ban_bits); /* has barriers */
    else __syncthreads();
    if (threadIdx.x < 128) { /* output row tid / 8, input row tid % 8: a warp holds 4 rows */
        const int row = threadIdx.x >> 3, r = threadIdx.x & 7, warp = threadIdx.x >> 5;
        const float v = tc_block_sum(red);
        const bool valid = r < R && n0 + row < N;
        float bv = -INFINITY, mv = -INFINITY;
        int bi = 0x7fffffff, mi = 0x7fffffff;
        if (valid) {
            amax_merge(bv, bi, v, (int)(n0 + row));
            const unsigned bits = b.masked && r < b.n_banned_rows ? ban_bits[r] : 0u;
            if (!((bits >> row) & 1u)) amax_merge(mv, mi, v, (int)(n0 + row));
        }
#pragma unroll
        for (int o = 8; o < 32; o <<= 1) { /* the lanes of the same input row */
            amax_merge(bv, bi, __shfl_xor_sync(0xffffffffu, bv, o), __shfl_xor_sync(0xffffffffu, bi, o));
            amax_merge(mv, mi, __shfl_xor_sync(0xffffffffu, mv, o), __shfl_xor_sync(0xffffffffu, mi, o));
        }
        if ((threadIdx.x & 31) < 8) {
            sv[0][warp][r] = bv;
            si[0][warp][r] = bi;
            sv[1][warp][r] = mv;
            si[1][warp][r] = mi;
        }
    }
    __syncthreads();
    if (keys) { /* ctx->amax_atomic: cuda_argmax.cuh */
        argmax_block_keys(&sv[0][0][0], &si[0][0][0], 4, 8, R, b.masked, keys);
        if (argmax_last_block(counter, &is_last)) argmax_finish_keys(keys, R, b, ids);
    } else {
        argmax_block_partials(&sv[0][0][0], &si[0][0][0], 4, 8, R, b.masked, pv, pi, masked_off);
        if (argmax_last_block(counter, &is_last)) argmax_merge_partials(pv, pi, masked_off, R, b, ids);
    }
}

/* Returns false (nothing launched) when the shape is not one this kernel serves: K a multiple of
 * 256 (each warp's eighth of a split a whole number of 32-wide steps), R in 1..8. */
extern "C" int ds_cuda_gemv_tc(ds_cuda_ctx *ctx, const void *W, int64_t N, int64_t K, const void *x,
                               int64_t ldx, int R, void *out, int64_t ldo, int out_f32) {
    if (R < 1 || R > 8 || K % 256 != 0 || N <= 0) return 0;
    const int64_t bx = DS_DIV_UP(N, (int64_t)16);
    int64_t kps;
    const int64_t splits = gemv_split_k(ctx, ctx->tc_splitk_per_sm, bx, N, K, R, &kps);
    dim3 grid((unsigned)bx, (unsigned)splits);
    if (out_f32)
        ds_launch(ctx, gemv_tc_kernel<float>, grid, TC_WARPS * 32, 0, (const bf16 *)W, N, K,
                  (const bf16 *)x, ldx, R, (float *)out, ldo, kps, ctx->d_splitk_ws, ctx->d_splitk_cnt, ctx->tc_tail);
    else
        ds_launch(ctx, gemv_tc_kernel<bf16>, grid, TC_WARPS * 32, 0, (const bf16 *)W, N, K,
                  (const bf16 *)x, ldx, R, (bf16 *)out, ldo, kps, ctx->d_splitk_ws, ctx->d_splitk_cnt, ctx->tc_tail);
    DS_CU_LAUNCHED2(ctx, splits > 1 ? "gemv_tc_kernel (split-K)" : "gemv_tc_kernel", N, K);
    return 1;
}

/* Whether the lm_head of this step runs on tensor cores, its logits and its fused argmax alike
 * (so that greedy ids from either path agree): a multi-sequence step by ds_cuda_gemv's rule, K a
 * multiple of 256, enough 16-row blocks that the logits GEMV does not split K (the argmax kernel
 * never does), R ≤ 8 per launch. */
extern "C" int ds_cuda_lm_head_tc(const ds_cuda_ctx *ctx, int64_t N, int64_t K) {
    if (!ctx->lm_head_tc || !ctx->opt.tc_gemv || !(ctx->batch.n_seqs > 1 || ctx->tc_one_seq) || K % 256 != 0)
        return 0;
    const int64_t bx = DS_DIV_UP(N, (int64_t)16);
    int64_t kps; /* the split count only falls as R grows: unsplit at R = 1 is unsplit for all */
    return bx <= DS_CUDA_AMAX_BLOCKS && gemv_split_k(ctx, ctx->tc_splitk_per_sm, bx, N, K, 1, &kps) == 1;
}

/* ids[r] for input rows [0, R ≤ 8) of batch rows row0.. (ds_cuda_lm_head_tc holds). */
extern "C" void ds_cuda_argmax_gemv_tc(ds_cuda_ctx *ctx, const void *W, int64_t N, int64_t K,
                                       const void *x, int64_t ldx, int R, int32_t *ids, int row0) {
    const int64_t moff = (int64_t)DS_CUDA_AMAX_BLOCKS * 8; /* the masked partials follow */
    ds_launch(ctx, gemv_tc_argmax_kernel, (unsigned)DS_DIV_UP(N, (int64_t)16), TC_WARPS * 32, 0,
              (const bf16 *)W, N, K, (const bf16 *)x, ldx, R, ctx->d_amax_v, ctx->d_amax_i, moff,
              ctx->d_amax_cnt, ids, (const int32_t *)ctx->d_bans, row0, ctx->tc_tail,
              ctx->amax_atomic ? ctx->d_amax_key : (unsigned long long *)NULL);
    DS_CU_LAUNCHED2(ctx, "gemv_tc_argmax_kernel", N, K);
}
