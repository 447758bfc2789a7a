/* cuda_norm.cuh — the residual add + RMSNorm of one row, shared by the add_rmsnorm kernel and
 * the kernels that fuse it into their epilogue (the MoE combine), so that fused and unfused
 * paths do the same arithmetic in the same order and give identical bits. */
#ifndef DS_CUDA_NORM_CUH
#define DS_CUDA_NORM_CUH

#include "cuda_common.cuh"

#define DS_NORM_THREADS 256 /* the block size every caller uses (fixes the reduction order) */

/* One block, one row of D (D % 8 == 0) bf16 values xr. ADD: xr += delta, where
 * load_delta(v, d) gives the 8 delta values of chunk v (columns 8v..8v+7) already rounded to
 * bf16 as the unfused path stores them; the sum is rounded to bf16 (the reference's bf16
 * residual stream) and written back. Then orow = xr · rsqrt(mean(xr²) + eps) · w. `red` is
 * shared scratch of ≥ 32 floats. */
template <bool ADD, class DeltaFn>
static __device__ __forceinline__ void add_rmsnorm_row(bf16 *xr, DeltaFn load_delta,
                                                       const float *__restrict__ w, float eps,
                                                       int64_t D, bf16 *orow, float *red) {
    const int64_t nv = D / 8;
    float ss = 0.f;
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
