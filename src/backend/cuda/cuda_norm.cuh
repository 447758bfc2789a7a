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
            const float wj[8] = {nw.w[j][0].x, nw.w[j][0].y, nw.w[j][0].z, nw.w[j][0].w,
                                 nw.w[j][1].x, nw.w[j][1].y, nw.w[j][1].z, nw.w[j][1].w};
#pragma unroll
            for (int i = 0; i < 8; i++) f[j][i] = f[j][i] * inv * wj[i];
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

#endif
