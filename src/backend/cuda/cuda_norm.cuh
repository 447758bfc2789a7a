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

/* One block, one row of D (D % 8 == 0) bf16 values xr. ADD: xr += delta, where
 * load_delta(v, d) gives the 8 delta values of chunk v (columns 8v..8v+7) already rounded to
 * bf16 as the unfused path stores them; the sum is rounded to bf16 (the reference's bf16
 * residual stream) and written back. Then orow = xr · rsqrt(mean(xr²) + eps) · w. `red` is
 * shared scratch of ≥ 32 floats; nw = norm_w_load(w, D, use_regs). Both paths (registers or two passes
 * over memory) add the same values in the same order: the same bits. */
template <bool ADD, class DeltaFn>
static __device__ __forceinline__ void add_rmsnorm_row(bf16 *xr, DeltaFn load_delta,
                                                       const float *__restrict__ w, const NormW &nw,
                                                       float eps, int64_t D, bf16 *orow, float *red,
                                                       int use_regs) {
    const int64_t nv = D / 8;
    float ss = 0.f;
    if (use_regs && nv <= (int64_t)DS_NORM_REG_CHUNKS * blockDim.x) {
        float f[DS_NORM_REG_CHUNKS][8];
#pragma unroll
        for (int j = 0; j < DS_NORM_REG_CHUNKS; j++) {
            const int64_t v = threadIdx.x + (int64_t)j * blockDim.x;
            if (v >= nv) continue;
            unpack8(*reinterpret_cast<const uint4 *>(xr + v * 8), f[j]);
            if (ADD) {
                float d[8];
                load_delta(v, d);
#pragma unroll
                for (int i = 0; i < 8; i++) f[j][i] += d[i];
                uint4 p = pack8(f[j]);
                *reinterpret_cast<uint4 *>(xr + v * 8) = p;
                unpack8(p, f[j]); /* the rounded sum */
            }
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
            *reinterpret_cast<uint4 *>(orow + v * 8) = pack8(f[j]);
        }
        return;
    }
    for (int64_t v = threadIdx.x; v < nv; v += blockDim.x) {
        float f[8];
        unpack8(*reinterpret_cast<const uint4 *>(xr + v * 8), f);
        if (ADD) {
            float d[8];
            load_delta(v, d);
#pragma unroll
            for (int i = 0; i < 8; i++) f[i] += d[i];
            uint4 p = pack8(f);
            *reinterpret_cast<uint4 *>(xr + v * 8) = p;
            unpack8(p, f); /* the rounded sum */
        }
#pragma unroll
        for (int i = 0; i < 8; i++) ss += f[i] * f[i];
    }
    const float inv = rsqrtf(block_sum(ss, red) / (float)D + eps);
    for (int64_t v = threadIdx.x; v < nv; v += blockDim.x) {
        float f[8];
        unpack8(*reinterpret_cast<const uint4 *>(xr + v * 8), f);
#pragma unroll
        for (int i = 0; i < 8; i++) f[i] = f[i] * inv * w[v * 8 + i];
        *reinterpret_cast<uint4 *>(orow + v * 8) = pack8(f);
    }
}

#endif
