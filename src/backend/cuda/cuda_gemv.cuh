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

/* Split-K plan of a GEMV launch with bx row blocks: split K when they cannot fill two blocks per
 * SM, into at most 16 splits of ≥ 512 (K ≥ 1024), each a multiple of 256 wide (*kps), within the
 * partials workspace and the tile counters; returns the split count. R enters only through the
 * workspace bound (splits · R · N floats), which Qwen3.5's decode shapes stay far below, so a
 * row's sums do not depend on the step's row count there. */
static inline int64_t gemv_split_k(const ds_cuda_ctx *ctx, int64_t bx, int64_t N, int64_t K, int R,
                                   int64_t *kps) {
    int64_t splits = 1;
    const int64_t target = 2 * (int64_t)ctx->sm_count;
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

template <typename T> static __device__ __forceinline__ void store_out(T *p, float v);
template <> __device__ __forceinline__ void store_out<float>(float *p, float v) { *p = v; }
template <> __device__ __forceinline__ void store_out<bf16>(bf16 *p, float v) {
    *p = __float2bfloat16_rn(v);
}

#endif
