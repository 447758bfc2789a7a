/* cuda_launch.cuh — kernel launches with programmatic dependent launch (PDL) and L2 weight
 * prefetch while waiting for the predecessor (README "Switches": DS_OPT_PDL, DS_OPT_PREFETCH).
 *
 * A decode step is ~420 small kernels in one stream. Without PDL each kernel starts only after
 * its predecessor has fully drained, so every boundary costs the tail of the old kernel plus the
 * ramp of the new one while DRAM idles. With PDL (Hopper: launch attribute
 * programmaticStreamSerialization + griddepcontrol), the next kernel is launched as soon as every
 * block of the current one has passed its own dependency wait; it can then stream its weights
 * (immutable during a step) into L2 while the current kernel finishes, and waits for it before
 * touching anything the current kernel writes or reads.
 *
 * The contract every kernel launched through ds_launch keeps:
 *   1. before pdl_enter(): only reads of weights (never written by a step) — in practice only
 *      L2 prefetches of them — and no early return; two documented exceptions, data no kernel
 *      of the current step has written before them: the GDN decode kernel's state (cuda_gdn.cu,
 *      DS_CUDA_GDN_EARLY) and the decode attention's keys older than the step
 *      (cuda_attention.cu, DS_CUDA_ATTN_KV_EARLY); and a third, ordered by a flag instead: the
 *      one-token down + combine launch reads the expert ids its predecessor wrote after
 *      waiting for that predecessor's release of them (cuda_moe_experts.cuh,
 *      DS_CUDA_MOE_DOWN_EARLY);
 *   2. pdl_enter() (wait for the predecessor grid to complete and flush, then allow the successor
 *      to launch) before any other memory access and before any early return.
 * Because every block of every kernel waits, kernel N complete implies kernels < N complete, so
 * a kernel may read anything any earlier kernel wrote. Kernels launched plainly (<<<>>>, cuBLASLt,
 * copies) are ordered the normal way; griddepcontrol is a no-op in a kernel launched without the
 * attribute. */
#ifndef DS_CUDA_LAUNCH_CUH
#define DS_CUDA_LAUNCH_CUH

#include <utility>

#include "cuda_common.cuh"

/* Wait for the predecessor grid (complete, memory visible), then let the successor launch. */
static __device__ __forceinline__ void pdl_enter() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

/* Asynchronous prefetch of [p, p + bytes) into L2 (p 16-byte aligned, bytes a multiple of 16);
 * no registers held, nothing to wait for. */
static __device__ __forceinline__ void prefetch_l2(const void *p, uint32_t bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    if (bytes >= 16) asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(p), "r"(bytes & ~15u) : "memory");
#endif
}

/* Prefetch a large range in pieces of at most 1 MiB (one instruction each). */
static __device__ __forceinline__ void prefetch_l2_range(const void *p, uint64_t bytes) {
    const char *c = (const char *)p;
    while (bytes >= 16) {
        const uint32_t n = bytes > (1u << 20) ? (1u << 20) : (uint32_t)bytes;
        prefetch_l2(c, n);
        c += n;
        bytes -= n;
    }
}

/* L2 bytes one kernel may prefetch ahead of its own reads: room for that and the running
 * kernel's working set in the H200's 50 MB L2. */
#define DS_CUDA_PREFETCH_BUDGET (24u << 20)

/* Launches kernel<<<grid, block, smem, ctx->stream>>>(args...), with the PDL attribute when
 * ctx->opt.pdl (never while profiling: the per-kernel events would sit between the kernels). */
template <typename... KArgs, typename... Args>
static void ds_launch(ds_cuda_ctx *ctx, void (*kernel)(KArgs...), dim3 grid, dim3 block,
                      size_t smem, Args &&...args) {
    if (ctx->diag_skip && ds_cuda_diag_skip(ctx, (const void *)kernel)) return; /* measurement only */
    cudaLaunchAttribute attr[2];
    unsigned n = 0;
    if (ctx->opt.pdl && !ctx->prof_on) {
        attr[n].id = cudaLaunchAttributeProgrammaticStreamSerialization;
        attr[n++].val.programmaticStreamSerializationAllowed = 1;
    }
    /* ctx->carveout1: one-token steps ask for the largest shared-memory carveout in every
     * launch, so that no SM drains to change its L1 / shared split between neighbours */
    if (ctx->carveout1 && ctx->batch.n_tokens == 1) {
        attr[n].id = cudaLaunchAttributePreferredSharedMemoryCarveout;
        attr[n++].val.sharedMemCarveout = cudaSharedmemCarveoutMaxShared;
    }
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid;
    cfg.blockDim = block;
    cfg.dynamicSmemBytes = smem;
    cfg.stream = ctx->stream;
    cfg.attrs = attr;
    cfg.numAttrs = n;
    DS_CU(ctx, cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...));
}

/* Whether a kernel's pre-wait prefetch can overlap anything (PDL on, prefetch on). */
static inline bool ds_prefetch_on(const ds_cuda_ctx *ctx) {
    return ctx->opt.pdl && ctx->opt.prefetch && !ctx->prof_on;
}

#endif
