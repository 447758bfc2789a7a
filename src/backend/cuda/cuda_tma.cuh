/* cuda_tma.cuh — Hopper (sm_90) asynchronous copies into shared memory signalled on mbarriers:
 * the tensor memory accelerator's 2-D box loads (cp.async.bulk.tensor), cp.async whose
 * completion arrives on an mbarrier, and the mbarrier operations a producer / consumer ring
 * needs. Each phase of a "full" barrier completes when its expected arrivals have happened and
 * the bytes announced with expect_tx have landed. */
#ifndef DS_CUDA_TMA_CUH
#define DS_CUDA_TMA_CUH

#include <cuda.h> /* CUtensorMap (the type only: the encoder is reached through the runtime) */
#include <stdint.h>

static __device__ __forceinline__ uint32_t smem_u32(const void *p) {
    return (uint32_t)__cvta_generic_to_shared(p);
}

/* Each body is for sm_90 only (empty in the host pass and for older targets, as cuda_mma.cuh's):
 * callers run them in kernels built for sm_90. */
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define DS_SM90_ASM 1
#endif

static __device__ __forceinline__ void mbar_init(uint64_t *m, unsigned count) {
#ifdef DS_SM90_ASM
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_u32(m)), "r"(count) : "memory");
#endif
}
/* after every mbar_init, before the barriers are used by other threads or the async proxy */
static __device__ __forceinline__ void mbar_init_fence() {
#ifdef DS_SM90_ASM
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
#endif
}
/* spins until the phase of parity `parity` has completed (acquire: what the arrivals released,
 * and the bytes the async copies wrote, are visible after it) */
static __device__ __forceinline__ void mbar_wait(uint64_t *m, uint32_t parity) {
#ifdef DS_SM90_ASM
    uint32_t done;
    do {
        asm volatile("{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2; selp.u32 %0, 1, 0, p; }"
                     : "=r"(done)
                     : "r"(smem_u32(m)), "r"(parity)
                     : "memory");
    } while (!done);
#endif
}
static __device__ __forceinline__ void mbar_arrive(uint64_t *m) {
#ifdef DS_SM90_ASM
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(smem_u32(m)) : "memory");
#endif
}
/* one arrival that also announces `bytes` more to land in this phase */
static __device__ __forceinline__ void mbar_arrive_expect_tx(uint64_t *m, uint32_t bytes) {
#ifdef DS_SM90_ASM
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_u32(m)), "r"(bytes) : "memory");
#endif
}
/* one arrival, made when every cp.async this thread issued before it has landed (.noinc: the
 * barrier's expected count includes it) */
static __device__ __forceinline__ void mbar_arrive_cp_async(uint64_t *m) {
#ifdef DS_SM90_ASM
    asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];" ::"r"(smem_u32(m)) : "memory");
#endif
}
/* box (x, y) of a 2-D tensor map (x the inner, contiguous coordinate) into dst (aligned as the
 * map's swizzle needs: 1024 bytes for 128-byte swizzle); its bytes complete_tx on *m */
static __device__ __forceinline__ void tma_load_2d(void *dst, const CUtensorMap *map, int x, int y, uint64_t *m) {
#ifdef DS_SM90_ASM
    asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];"
                 ::"r"(smem_u32(dst)), "l"(map), "r"(x), "r"(y), "r"(smem_u32(m))
                 : "memory");
#endif
}
/* the same with an L2 cache policy (createpolicy: e.g. evict_first for data read once) */
static __device__ __forceinline__ void tma_load_2d_hint(void *dst, const CUtensorMap *map, int x, int y, uint64_t *m,
                                                        uint64_t policy) {
#ifdef DS_SM90_ASM
    asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint"
                 " [%0], [%1, {%2, %3}], [%4], %5;"
                 ::"r"(smem_u32(dst)), "l"(map), "r"(x), "r"(y), "r"(smem_u32(m)), "l"(policy)
                 : "memory");
#endif
}
/* bytes (a multiple of 16; src and dst 16-byte aligned) of contiguous global memory into dst
 * with one bulk copy (the TMA without a tensor map); they complete_tx on *m. Used by the weight
 * streaming probe (tools/gpu/probe_weight_stream.cu); session 28's expert GEMV fed this way was
 * ~1.35-2× slower than the register-fed kernels and was removed (docs/cuda_notes.md). */
static __device__ __forceinline__ void bulk_load_1d(void *dst, const void *src, uint32_t bytes, uint64_t *m) {
#ifdef DS_SM90_ASM
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
                 ::"r"(smem_u32(dst)), "l"(src), "r"(bytes), "r"(smem_u32(m))
                 : "memory");
#endif
}
static __device__ __forceinline__ uint64_t l2_policy_evict_first() {
    uint64_t pol = 0;
#ifdef DS_SM90_ASM
    asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(pol));
#endif
    return pol;
}

/* Byte offset of 16-byte chunk c (0-7) of row r in a tile of 128-byte rows stored with the
 * TMA's 128-byte swizzle (chunk c of row r at position c ^ (r mod 8); the tile 1024-byte
 * aligned): the 8 rows an ldmatrix reads at one chunk fall in 8 distinct bank groups. */
static __device__ __forceinline__ uint32_t swz128(int r, int c) {
    return (uint32_t)(r * 128 + ((c ^ (r & 7)) << 4));
}

#endif
