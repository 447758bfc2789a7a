/* cuda_common.cuh — device helpers shared by the kernels: bf16 packing, streaming loads,
 * warp/block reductions. Header-only, included by the .cu files. */
#ifndef DS_CUDA_COMMON_CUH
#define DS_CUDA_COMMON_CUH

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

#include "cuda_internal.h"

typedef __nv_bfloat16 bf16;

#define DS_DIV_UP(a, b) (((a) + (b) - 1) / (b))

/* 16-byte streaming load that bypasses L1 (weights are read once per step). */
static __device__ __forceinline__ uint4 ld_stream16(const void *p) {
    uint4 v;
    asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p));
    return v;
}

/* 16-byte asynchronous global → shared copy (cp.async, sm_80+): a thread issues all its copies
 * of a tile before waiting, so a tile costs about one memory latency and the next tile's copies
 * can be in flight while this one is used. src_bytes 0 reads nothing and fills the 16 bytes with
 * zeros (padding rows; gmem must still be a valid address). */
static __device__ __forceinline__ void cp_async16(void *smem, const void *gmem, int src_bytes = 16) {
    const unsigned s = (unsigned)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(s), "l"(gmem), "r"(src_bytes));
}
/* closes this thread's group of copies issued since the last commit */
static __device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;"); }
/* waits until at most N of this thread's committed groups are still in flight */
template <int N>
static __device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;" ::"n"(N)); }

/* 16-byte read-only load through L1 (activations reused by every warp of a block). */
static __device__ __forceinline__ uint4 ld_cached16(const void *p) {
    return __ldg(reinterpret_cast<const uint4 *>(p));
}

/* bf16 → f32 of the low/high half of a packed pair (exact: bf16 is the top half of f32). */
static __device__ __forceinline__ float bf_lo(uint32_t u) { return __uint_as_float(u << 16); }
static __device__ __forceinline__ float bf_hi(uint32_t u) { return __uint_as_float(u & 0xffff0000u); }

static __device__ __forceinline__ void unpack8(const uint4 v, float f[8]) {
    f[0] = bf_lo(v.x); f[1] = bf_hi(v.x);
    f[2] = bf_lo(v.y); f[3] = bf_hi(v.y);
    f[4] = bf_lo(v.z); f[5] = bf_hi(v.z);
    f[6] = bf_lo(v.w); f[7] = bf_hi(v.w);
}

static __device__ __forceinline__ uint32_t pack_bf2(float lo, float hi) {
    __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<uint32_t *>(&h);
}

static __device__ __forceinline__ uint4 pack8(const float f[8]) {
    uint4 v;
    v.x = pack_bf2(f[0], f[1]);
    v.y = pack_bf2(f[2], f[3]);
    v.z = pack_bf2(f[4], f[5]);
    v.w = pack_bf2(f[6], f[7]);
    return v;
}

static __device__ __forceinline__ float to_f32(bf16 v) { return __bfloat162float(v); }

/* Element i of a float tensor in dtype code 0 F32, 1 BF16, 2 F16. */
static __device__ __forceinline__ float load_any(const void *p, int dtype, int64_t i) {
    if (dtype == 1) return __bfloat162float(reinterpret_cast<const bf16 *>(p)[i]);
    if (dtype == 2) return __half2float(reinterpret_cast<const __half *>(p)[i]);
    return reinterpret_cast<const float *>(p)[i];
}

static __device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

static __device__ __forceinline__ float warp_max(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

/* Sum over the whole block (blockDim.x a multiple of 32, ≤ 1024); every thread gets the result.
 * `red` is shared scratch of ≥ 32 floats; the call contains two barriers. */
static __device__ __forceinline__ float block_sum(float v, float *red) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = warp_sum(v);
    __syncthreads();
    if (lane == 0) red[warp] = v;
    __syncthreads();
    float s = 0.f;
    for (int i = 0; i < nw; i++) s += red[i]; /* fixed order: deterministic */
    return s;
}

/* Row t's token (backend.h ds_batch.token_src; the device copy holds -1 where none): entry
 * token_src[t] ≥ 0 of the token buffer, else tokens[t]. */
static __device__ __forceinline__ int32_t batch_row_token(const int32_t *tokens,
                                                          const int32_t *token_src,
                                                          const int32_t *tokbuf, int t) {
    const int32_t src = token_src[t];
    return src >= 0 ? tokbuf[src] : tokens[t];
}

/* Accurate expf (not __expf): these feed bf16 outputs compared against the fp32 CPU backend. */
static __device__ __forceinline__ float silu_f(float x) { return x / (1.f + expf(-x)); }
static __device__ __forceinline__ float sigmoid_f(float x) { return 1.f / (1.f + expf(-x)); }

/* One step of a causal depthwise conv of kernel KC over a channel's last KC − 1 inputs: returns
 * w[KC−1]·x + Σ_i w[i]·win[i] (this order: the GDN kernels and the CPU backend agree to the
 * bit) and shifts x into the window. */
template <int KC>
static __device__ __forceinline__ float conv_step(const float (&w)[KC], float (&win)[KC - 1], float x) {
    float acc = w[KC - 1] * x;
#pragma unroll
    for (int i = 0; i < KC - 1; i++) acc = fmaf(w[i], win[i], acc);
#pragma unroll
    for (int i = 0; i < KC - 2; i++) win[i] = win[i + 1];
    win[KC - 2] = x;
    return acc;
}

#endif
