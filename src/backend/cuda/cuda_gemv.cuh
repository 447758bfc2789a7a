/* cuda_gemv.cuh — the bandwidth-bound warp GEMV core shared by the linear GEMV and the MoE
 * expert kernels.
 *
 * One warp computes ROWS consecutive output rows for R input rows over a K range. Each lane
 * streams 16-byte chunks (8 bf16) of the weight rows: lane l covers k = k0 + 8l + 256j, so a
 * warp reads 512 contiguous bytes of every row per step, and UNROLL steps of ROWS rows are in
 * flight before the first FMA (UNROLL·ROWS 16-byte loads per lane). Each weight chunk is
 * multiplied with all R input rows, so the weight is streamed exactly once for the R rows. */
#ifndef DS_CUDA_GEMV_CUH
#define DS_CUDA_GEMV_CUH

#include "cuda_common.cuh"

#define GEMV_WARPS 8 /* warps of a GEMV block (gemv_kernel, gemv_add_norm_kernel, the argmax) */

/* x source: plain rows x + r·ldx (bf16). */
template <int R>
struct XRows {
    const bf16 *base[R];
    __device__ __forceinline__ void load(int r, int64_t k, float f[8]) const {
        unpack8(ld_cached16(base[r] + k), f);
    }
};

/* x source: SiLU(g) ⊙ u computed on the fly from gate_up rows [2I] (g at k, u at I + k). */
template <int R>
struct XSiluMul {
    const bf16 *base[R];
    int64_t I;
    __device__ __forceinline__ void load(int r, int64_t k, float f[8]) const {
        float g[8], u[8];
        unpack8(ld_cached16(base[r] + k), g);
        unpack8(ld_cached16(base[r] + I + k), u);
#pragma unroll
        for (int i = 0; i < 8; i++) f[i] = silu_f(g[i]) * u[i];
    }
};

/* x source: bf16 rows in shared memory, row r at base + r·ld (16-byte aligned). */
struct XSharedBF16 {
    const bf16 *base;
    int64_t ld;
    __device__ __forceinline__ void load(int r, int64_t k, float f[8]) const {
        unpack8(*reinterpret_cast<const uint4 *>(base + r * ld + k), f);
    }
};

/* x source: fp32 rows in shared memory, row r at base + r·ld (16-byte aligned). */
struct XSharedF32 {
    const float *base;
    int64_t ld;
    __device__ __forceinline__ void load(int r, int64_t k, float f[8]) const {
        const float4 a = *reinterpret_cast<const float4 *>(base + r * ld + k);
        const float4 b = *reinterpret_cast<const float4 *>(base + r * ld + k + 4);
        f[0] = a.x, f[1] = a.y, f[2] = a.z, f[3] = a.w, f[4] = b.x, f[5] = b.y, f[6] = b.z, f[7] = b.w;
    }
};

/* One step of a warp's weight stream: UNROLL chunks of 256 columns of ROWS rows, from column
 * kb (this lane's first) on; 16 bytes per row and chunk per lane. */
template <int ROWS, int UNROLL>
struct WBatch {
    uint4 w[UNROLL][ROWS];
};

/* Row pointers of rows n0.. (rows ≥ nvalid clamped to a valid row; their results are discarded
 * by the caller). */
template <int ROWS>
static __device__ __forceinline__ void gemv_rows(const bf16 *__restrict__ W, int64_t K, int64_t n0,
                                                 int64_t nvalid, const bf16 *wrow[ROWS]) {
#pragma unroll
    for (int rr = 0; rr < ROWS; rr++) {
        int64_t n = n0 + rr < nvalid ? n0 + rr : nvalid - 1;
        wrow[rr] = W + n * K;
    }
}

template <int ROWS, int UNROLL, bool STREAM>
static __device__ __forceinline__ void wbatch_load(const bf16 *const wrow[ROWS], int64_t kb,
                                                   int64_t k1, WBatch<ROWS, UNROLL> &b) {
#pragma unroll
    for (int u = 0; u < UNROLL; u++) {
        const int64_t k = kb + u * 256;
#pragma unroll
        for (int rr = 0; rr < ROWS; rr++) {
            if (k < k1) {
                b.w[u][rr] = STREAM ? ld_stream16(wrow[rr] + k) : ld_cached16(wrow[rr] + k);
            } else {
                b.w[u][rr] = make_uint4(0, 0, 0, 0);
            }
        }
    }
}

template <int R, int ROWS, int UNROLL, class XS>
static __device__ __forceinline__ void wbatch_fma(const WBatch<ROWS, UNROLL> &b, const XS &xs,
                                                  int64_t kb, int64_t k1, float acc[ROWS][R]) {
#pragma unroll
    for (int u = 0; u < UNROLL; u++) {
        const int64_t k = kb + u * 256;
        if (k < k1) {
            float xf[R][8];
#pragma unroll
            for (int r = 0; r < R; r++) xs.load(r, k, xf[r]);
#pragma unroll
            for (int rr = 0; rr < ROWS; rr++) {
                float wf[8];
                unpack8(b.w[u][rr], wf);
#pragma unroll
                for (int r = 0; r < R; r++) {
                    float s = acc[rr][r];
#pragma unroll
                    for (int i = 0; i < 8; i++) s = fmaf(wf[i], xf[r][i], s);
                    acc[rr][r] = s;
                }
            }
        }
    }
}

/* acc[rr][r] += Σ_{k in [k0,k1)} W[n0+rr, k] · x_r[k] for this lane's chunks (not reduced).
 * Rows n0+rr ≥ nvalid are clamped to a valid row (their results are discarded by the caller).
 * FIRST: *first is the batch at this lane's first column, already loaded (gemv_kernel loads it
 * before its dependency wait); the sums are the same either way. */
template <int R, int ROWS, int UNROLL, bool STREAM, class XS, bool FIRST = false>
static __device__ __forceinline__ void gemv_warp_partial(const bf16 *__restrict__ W, int64_t K,
                                                         int64_t n0, int64_t nvalid, const XS &xs,
                                                         int64_t k0, int64_t k1,
                                                         float acc[ROWS][R],
                                                         const WBatch<ROWS, UNROLL> *first = nullptr) {
    const int lane = threadIdx.x & 31;
    const bf16 *wrow[ROWS];
    gemv_rows<ROWS>(W, K, n0, nvalid, wrow);
    int64_t kb = k0 + lane * 8;
    if (FIRST) { /* compile-time, so `first` stays in registers */
        if (kb < k1) wbatch_fma<R, ROWS, UNROLL>(*first, xs, kb, k1, acc);
        kb += 256 * UNROLL;
    }
    for (; kb < k1; kb += 256 * UNROLL) {
        WBatch<ROWS, UNROLL> b;
        wbatch_load<ROWS, UNROLL, STREAM>(wrow, kb, k1, b);
        wbatch_fma<R, ROWS, UNROLL>(b, xs, kb, k1, acc);
    }
}

template <int R, int ROWS>
static __device__ __forceinline__ void gemv_warp_reduce(float acc[ROWS][R]) {
#pragma unroll
    for (int rr = 0; rr < ROWS; rr++)
#pragma unroll
        for (int r = 0; r < R; r++) acc[rr][r] = warp_sum(acc[rr][r]);
}

/* A GEMV kernel's warp before its PDL wait (ctx->gemv_preload, DS_CUDA_GEMV_PRELOAD): its first
 * batch of weights into registers, so that a block resident while its predecessor finishes (a
 * norm, the GDN, a combine) has its first DRAM round trip behind it when the input becomes
 * readable. Returns whether *first holds it (preload and the warp has rows). */
template <int ROWS, int UNROLL>
static __device__ __forceinline__ bool gemv_preload(const bf16 *__restrict__ W, int64_t K, int64_t n0,
                                                    int64_t N, int64_t k0, int64_t k1, int lane,
                                                    int preload, WBatch<ROWS, UNROLL> &first) {
    const bool pre = preload && n0 < N;
    if (pre) {
        const bf16 *wrow[ROWS];
        gemv_rows<ROWS>(W, K, n0, N, wrow);
        wbatch_load<ROWS, UNROLL, true>(wrow, k0 + lane * 8, k1, first);
    }
    return pre;
}

/* After the wait: the warp's sums acc[rr][r] over [k0, k1) of rows n0.. with input xs, reduced
 * across the warp (every lane holds them); pre / first from gemv_preload. */
template <int R, int ROWS, int UNROLL, class XS>
static __device__ __forceinline__ void gemv_warp_sums(const bf16 *__restrict__ W, int64_t K, int64_t n0,
                                                      int64_t N, const XS &xs, int64_t k0, int64_t k1,
                                                      bool pre, const WBatch<ROWS, UNROLL> &first,
                                                      float acc[ROWS][R]) {
#pragma unroll
    for (int rr = 0; rr < ROWS; rr++)
#pragma unroll
        for (int r = 0; r < R; r++) acc[rr][r] = 0.f;
    if (pre) gemv_warp_partial<R, ROWS, UNROLL, true, XS, true>(W, K, n0, N, xs, k0, k1, acc, &first);
    else if (n0 < N) gemv_warp_partial<R, ROWS, UNROLL, true>(W, K, n0, N, xs, k0, k1, acc);
    gemv_warp_reduce<R, ROWS>(acc);
}

/* Split-K plan of a GEMV launch with bx row blocks: split K when they cannot fill per_sm
 * blocks per SM (ctx->splitk_per_sm or ctx->tc_splitk_per_sm; 0: never), into at most 16
 * splits of ≥ 512 (K ≥ 1024), each a multiple of 256 wide (*kps), within the partials
 * workspace and the tile counters; returns the split count. R enters only through the
 * workspace bound (splits · R · N floats), which Qwen3.5's decode shapes stay far below, so a
 * row's sums do not depend on the step's row count there. */
static inline int64_t gemv_split_k(const ds_cuda_ctx *ctx, int per_sm, int64_t bx, int64_t N, int64_t K,
                                   int R, int64_t *kps) {
    int64_t splits = 1;
    const int64_t target = (int64_t)per_sm * ctx->sm_count;
    if (bx < target && K >= 1024) {
        splits = DS_DIV_UP(target, bx);
        if (splits > K / 512) splits = K / 512;
        if (splits > 16) splits = 16;
        while (splits > 1 && (splits * R * N > DS_CUDA_SPLITK_WS_FLOATS || bx > DS_CUDA_SPLITK_COUNTERS))
            splits--;
    }
    *kps = K;
    if (splits > 1) {
        *kps = DS_DIV_UP(DS_DIV_UP(K, splits), 256) * 256;
        splits = DS_DIV_UP(K, *kps);
    }
    return splits;
}

/* Launch plan of the CUDA-core GEMV (gemv_kernel, and gemv_add_norm_kernel, which must sum in
 * the same order): rows per warp (ctx->gemv_rows: 4, or 2 or 1), row blocks, K splits. A matrix
 * too narrow to fill the chip at 4 rows a warp (split K) takes 1 row a warp unsplit when that
 * gives a block per SM and each warp's row is one batch of loads (K ≤ 2048 at UNROLL 8)
 * (ctx->gemv_narrow, DS_CUDA_GEMV_NARROW): the same bytes in flight a warp, no partials and no
 * last-block sum. ncu s11-run6: the 35B-A3B router (1281 × 2048) 5.63 vs 6.97 µs; the 2048 ×
 * 4096 out_proj, two batches a warp, 9.38 vs 8.73 µs — hence the K bound. */
struct GemvPlan {
    int rows;
    int64_t bx, splits, kps;
};

static inline GemvPlan gemv_plan(const ds_cuda_ctx *ctx, int64_t N, int64_t K, int R) {
    GemvPlan p;
    p.rows = ctx->gemv_rows == 1 || ctx->gemv_rows == 4 ? ctx->gemv_rows : 2;
    p.bx = DS_DIV_UP(N, (int64_t)GEMV_WARPS * p.rows);
    p.splits = gemv_split_k(ctx, ctx->splitk_per_sm, p.bx, N, K, R, &p.kps);
    const int64_t bx1 = DS_DIV_UP(N, (int64_t)GEMV_WARPS);
    if (ctx->gemv_narrow && p.splits > 1 && p.rows != 1 && bx1 >= ctx->sm_count && K <= 256 * 8) {
        p.rows = 1;
        p.bx = bx1;
        p.splits = 1;
        p.kps = K;
    }
    return p;
}

template <typename T> static __device__ __forceinline__ void store_out(T *p, float v);
template <> __device__ __forceinline__ void store_out<float>(float *p, float v) { *p = v; }
template <> __device__ __forceinline__ void store_out<bf16>(bf16 *p, float v) {
    *p = __float2bfloat16_rn(v);
}

/* The end of a GEMV block whose warps hold reduced sums acc (rows n0.., R input rows). One
 * K split (gridDim.y == 1): lane 0 of each warp stores its rows. Split-K: each split writes fp32
 * partials ws[split][r][n]; the last block of the row tile to arrive (per-tile counter) sums
 * them in split order (deterministic) and resets the counter to 0, so the next launch (or a
 * graph replay) finds it clean. */
template <int R, int ROWS, typename OutT>
static __device__ __forceinline__ void gemv_block_store(const float acc[ROWS][R], int64_t n0, int64_t N,
                                                        OutT *__restrict__ out, int64_t ldo,
                                                        float *__restrict__ ws, int *__restrict__ counters) {
    const int lane = threadIdx.x & 31;
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
    /* the last block: one output per thread */
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

#endif
