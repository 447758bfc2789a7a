/* cuda_norm.cuh — the residual add + RMSNorm of one row, shared by the add_rmsnorm kernel and
 * the kernels that fuse it into their epilogue (the MoE combine), so that fused and unfused
 * paths do the same arithmetic in the same order and give identical bits. */
#ifndef DS_CUDA_NORM_CUH
#define DS_CUDA_NORM_CUH

#include "cuda_common.cuh"

#define DS_NORM_THREADS 256 /* the block size every caller uses (fixes the reduction order) */

/* Rows up to DS_NORM_THREADS · 8 · DS_NORM_REG_CHUNKS values (4096) keep each thread's chunks
 * in registers between the two passes (no re-read of the row just written), and take their
 * norm weights from a NormW loaded before the kernel's PDL wait. */
#define DS_NORM_REG_CHUNKS 2

/* This thread's chunks (v = threadIdx.x + j·blockDim.x) of the fp32 norm weights w[D]. Weights
 * only: may be loaded before pdl_enter (cuda_launch.cuh); rows longer than the register path,
 * or use = 0 (ctx->norm_regs, DS_CUDA_NORM_REGS=0: the two passes over memory, for before/after
 * runs), read w in the second pass instead (nothing is loaded here). */
struct NormW {
    float4 w[DS_NORM_REG_CHUNKS][2];
};

static __device__ __forceinline__ NormW norm_w_load(const float *__restrict__ w, int64_t D, int use) {
    NormW n;
    const int64_t nv = D / 8;
    const bool regs = use && D % 8 == 0 && nv <= (int64_t)DS_NORM_REG_CHUNKS * blockDim.x;
#pragma unroll
    for (int j = 0; j < DS_NORM_REG_CHUNKS; j++) {
        const int64_t v = threadIdx.x + (int64_t)j * blockDim.x;
        if (regs && v < nv) {
            n.w[j][0] = __ldg(reinterpret_cast<const float4 *>(w + v * 8));
            n.w[j][1] = __ldg(reinterpret_cast<const float4 *>(w + v * 8 + 4));
        } else {
            n.w[j][0] = n.w[j][1] = make_float4(0.f, 0.f, 0.f, 0.f);
        }
    }
    return n;
}

/* f ← f · inv · w over this thread's chunk j of the norm weights held in nw (the register
 * path's scaling, shared by rmsnorm_row and add_norm_rows so that both give the same bits). */
static __device__ __forceinline__ void norm_scale8(float f[8], float inv, const NormW &nw, int j) {
    const float wj[8] = {nw.w[j][0].x, nw.w[j][0].y, nw.w[j][0].z, nw.w[j][0].w,
                         nw.w[j][1].x, nw.w[j][1].y, nw.w[j][1].z, nw.w[j][1].w};
#pragma unroll
    for (int i = 0; i < 8; i++) f[i] = f[i] * inv * wj[i];
}

/* One block, one row of D (D % 8 == 0) values: orow = s · rsqrt(mean(s²) + eps) · w, where
 * chunk_sum(v, f, first) gives the 8 values of chunk v (columns 8v..8v+7) of the row s as fp32
 * — first: the first pass, which may also store them; !first: the same values again, for the
 * memory path's second pass — and store_out(v, p) stores chunk v of the normed row (packed
 * bf16). `red` is shared scratch of ≥ 32 floats; nw = norm_w_load(w, D, use_regs). Rows up to
 * DS_NORM_REG_CHUNKS · 8 values a thread keep s in registers between the two passes (with
 * use_regs); longer rows make two passes over memory. Both add the same values in the same
 * order: the same bits. */
template <class SumFn, class OutFn>
static __device__ __forceinline__ void rmsnorm_row(SumFn chunk_sum, OutFn store_out,
                                                   const float *__restrict__ w, const NormW &nw,
                                                   float eps, int64_t D, float *red, int use_regs) {
    const int64_t nv = D / 8;
    float ss = 0.f;
    if (use_regs && nv <= (int64_t)DS_NORM_REG_CHUNKS * blockDim.x) {
        float f[DS_NORM_REG_CHUNKS][8];
#pragma unroll
        for (int j = 0; j < DS_NORM_REG_CHUNKS; j++) {
            const int64_t v = threadIdx.x + (int64_t)j * blockDim.x;
            if (v >= nv) continue;
            chunk_sum(v, f[j], true);
#pragma unroll
            for (int i = 0; i < 8; i++) ss += f[j][i] * f[j][i];
        }
        const float inv = rsqrtf(block_sum(ss, red) / (float)D + eps);
#pragma unroll
        for (int j = 0; j < DS_NORM_REG_CHUNKS; j++) {
            const int64_t v = threadIdx.x + (int64_t)j * blockDim.x;
            if (v >= nv) continue;
            norm_scale8(f[j], inv, nw, j);
            store_out(v, pack8(f[j]));
        }
        return;
    }
    for (int64_t v = threadIdx.x; v < nv; v += blockDim.x) {
        float f[8];
        chunk_sum(v, f, true);
#pragma unroll
        for (int i = 0; i < 8; i++) ss += f[i] * f[i];
    }
    const float inv = rsqrtf(block_sum(ss, red) / (float)D + eps);
    for (int64_t v = threadIdx.x; v < nv; v += blockDim.x) {
        float f[8];
        chunk_sum(v, f, false);
#pragma unroll
        for (int i = 0; i < 8; i++) f[i] = f[i] * inv * w[v * 8 + i];
        store_out(v, pack8(f));
    }
}

/* f ← the 8 values of a + b, each rounded to bf16 (the reference's bf16 residual stream). */
static __device__ __forceinline__ void add_rounded8(float f[8], const float d[8]) {
#pragma unroll
    for (int i = 0; i < 8; i++) f[i] += d[i];
    unpack8(pack8(f), f);
}

/* rmsnorm_row over the residual row xr [D] bf16. ADD: xr ← xr (+ pre, rounded, when pre is not
 * NULL: a residual add folded in from before) + delta, rounded, where load_delta(v, d) gives the
 * 8 delta values of chunk v already rounded to bf16 as the unfused path stores them; the sum is
 * written back to xr. Then orow = rmsnorm(xr) · w. */
template <bool ADD, class DeltaFn>
static __device__ __forceinline__ void add_rmsnorm_row(bf16 *xr, const bf16 *pre, DeltaFn load_delta,
                                                       const float *__restrict__ w, const NormW &nw,
                                                       float eps, int64_t D, bf16 *orow, float *red,
                                                       int use_regs) {
    rmsnorm_row(
        [&](int64_t v, float f[8], bool first) {
            unpack8(*reinterpret_cast<const uint4 *>(xr + v * 8), f);
            if (!ADD || !first) return; /* the second pass reads back the stored sum */
            float d[8];
            if (pre) {
                unpack8(*reinterpret_cast<const uint4 *>(pre + v * 8), d);
                add_rounded8(f, d);
            }
            load_delta(v, d);
            add_rounded8(f, d);
            *reinterpret_cast<uint4 *>(xr + v * 8) = pack8(f);
        },
        [&](int64_t v, uint4 p) { *reinterpret_cast<uint4 *>(orow + v * 8) = p; }, w, nw, eps, D,
        red, use_regs);
}

/* The residual add + RMSNorm of R ≤ RMAX rows into shared memory, for a GEMV that takes it as
 * its input (cuda_gemv_norm.cu): xs [R, D] bf16 = bf16(rmsnorm(bf16(resid +
 * delta)) · w), rows D apart (delta NULL: the norm of resid alone); the writer block also stores it to normed. The bits of
 * add_rmsnorm_row for every row — each thread sums its chunks v = tid, tid + blockDim in that
 * order, warp sums, then the warps in order — but all rows at once: the loads of
 * NORM_ROWS_INFLIGHT rows in flight together and one reduction barrier for all rows, where one
 * rmsnorm_row per row costs R dependent round trips and 2R barriers. D ≤ DS_NORM_REG_CHUNKS ·
 * 8 · blockDim.x, D % 8 == 0, blockDim.x == DS_NORM_THREADS; nw = norm_w_load(w, D, 1).
 * Block-wide: xs is complete when it returns. `red` holds ≥ RMAX · 32 floats. */
#define NORM_ROWS_INFLIGHT 4

template <int RMAX>
static __device__ __forceinline__ void add_norm_rows(const bf16 *__restrict__ resid,
                                                     const bf16 *__restrict__ delta, const NormW &nw,
                                                     float eps, int64_t D, int R, bf16 *xs,
                                                     bf16 *__restrict__ normed, bool writer, float *red) {
    constexpr int CH = DS_NORM_REG_CHUNKS, G = NORM_ROWS_INFLIGHT;
    const int64_t nv = D / 8;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
    float ss[RMAX];
#pragma unroll
    for (int r = 0; r < RMAX; r++) ss[r] = 0.f;
    /* pass 1: the rounded sums into xs, each row's squares in this thread's chunk order */
#pragma unroll
    for (int r0 = 0; r0 < RMAX; r0 += G) {
        if (r0 >= R) break;
        uint4 hv[G][CH], dv[G][CH];
#pragma unroll
        for (int g = 0; g < G; g++)
#pragma unroll
            for (int j = 0; j < CH; j++) {
                const int64_t v = threadIdx.x + (int64_t)j * blockDim.x, o = (int64_t)(r0 + g) * D + v * 8;
                if (r0 + g < RMAX && r0 + g < R && v < nv) {
                    hv[g][j] = *reinterpret_cast<const uint4 *>(resid + o);
                    if (delta) dv[g][j] = *reinterpret_cast<const uint4 *>(delta + o);
                }
            }
#pragma unroll
        for (int g = 0; g < G; g++)
#pragma unroll
            for (int j = 0; j < CH; j++) {
                const int64_t v = threadIdx.x + (int64_t)j * blockDim.x;
                if (!(r0 + g < RMAX && r0 + g < R && v < nv)) continue;
                float f[8], d[8];
                unpack8(hv[g][j], f);
                if (delta) {
                    unpack8(dv[g][j], d);
                    add_rounded8(f, d);
                }
                *reinterpret_cast<uint4 *>(xs + (int64_t)(r0 + g) * D + v * 8) = pack8(f);
#pragma unroll
                for (int i = 0; i < 8; i++) ss[r0 + g < RMAX ? r0 + g : 0] += f[i] * f[i];
            }
    }
    /* one reduction for all rows: block_sum's order */
#pragma unroll
    for (int r = 0; r < RMAX; r++) {
        if (r >= R) break;
        const float s = warp_sum(ss[r]);
        if (lane == 0) red[r * 32 + warp] = s;
    }
    __syncthreads();
    /* pass 2: normalise in place (each thread its own chunks, as written in pass 1) */
#pragma unroll
    for (int r = 0; r < RMAX; r++) {
        if (r >= R) break;
        float tot = 0.f;
        for (int i = 0; i < nwarps; i++) tot += red[r * 32 + i];
        const float inv = rsqrtf(tot / (float)D + eps);
#pragma unroll
        for (int j = 0; j < CH; j++) {
            const int64_t v = threadIdx.x + (int64_t)j * blockDim.x;
            if (v >= nv) continue;
            float f[8];
            bf16 *xr = xs + (int64_t)r * D + v * 8;
            unpack8(*reinterpret_cast<const uint4 *>(xr), f);
            norm_scale8(f, inv, nw, j);
            const uint4 p = pack8(f);
            *reinterpret_cast<uint4 *>(xr) = p;
            if (writer) *reinterpret_cast<uint4 *>(normed + (int64_t)r * D + v * 8) = p;
        }
    }
    __syncthreads();
}

#endif
