/* cuda_moe_scratch.cuh — the MoE block's device scratch: one allocation carved into the
 * pieces every stage reads or writes (router logits, routing, groups, expert activations and
 * outputs). Included by cuda_moe.cu only (one translation unit for the whole MoE block, so its
 * stages' device functions inline into each other's kernels). */
#ifndef DS_CUDA_MOE_SCRATCH_CUH
#define DS_CUDA_MOE_SCRATCH_CUH

#include "cuda_common.cuh"
#include "cuda_moe_gemm.h"

#define MOE_MAX_E 1024

/* scratch layout for T tokens (A = T·k assignments), 256-byte aligned pieces */
typedef struct moe_scratch {
    float *L;        /* [T, NL], row pitch moe_ldl */
    int32_t *ids;    /* [A] */
    float *wts;      /* [A] */
    bf16 *sh_act;    /* [T, Is] */
    float *sg;       /* [T] */
    int32_t *n_act;  /* [1] */
    int32_t *act;    /* [E] active experts, ascending */
    int32_t *off;    /* [E + 1] assignment offsets per active expert */
    int32_t *sorted; /* [A] assignment indices grouped by expert, ascending within */
    bf16 *h;         /* [A, 2I] */
    float *y;        /* [A, H] */
    float *ysh;      /* [T, H] */
    int32_t *gemm_sync; /* [DS_MOE_GEMM_SYNC_INTS(A, E)]: the TMA-fed grouped GEMM's tickets, counts */
} moe_scratch;

static size_t al256(size_t x) { return (x + 255) & ~(size_t)255; }

/* Row pitch (floats) of the router logits L [T, NL], NL = E + 2Is + 1: NL rounded up to a
 * multiple of 8. With the pitch 1281 (Qwen3.5-35B-A3B) cuBLASLt's prefill GEMM ran at
 * 15 TFLOP/s, its output rows not 16-byte aligned. */
static __host__ __device__ int64_t moe_ldl(int E, int Is) {
    return ((int64_t)E + 2 * Is + (Is ? 1 : 0) + 7) & ~(int64_t)7;
}

static size_t moe_layout(char *base, int T, int H, int E, int k, int I, int Is, moe_scratch *s) {
    const size_t A = (size_t)T * k;
    const size_t NL = (size_t)moe_ldl(E, Is);
    size_t off = 0;
#define TAKE(field, type, count)                                      \
    do {                                                              \
        if (s) s->field = (type *)(base + off);                       \
        off += al256(sizeof(type) * (size_t)(count));                 \
    } while (0)
    TAKE(L, float, (size_t)T * NL);
    TAKE(ids, int32_t, A);
    TAKE(wts, float, A);
    TAKE(sh_act, bf16, (size_t)T * (Is ? Is : 1));
    TAKE(sg, float, T);
    TAKE(n_act, int32_t, 1);
    TAKE(act, int32_t, E);
    TAKE(off, int32_t, E + 1);
    TAKE(sorted, int32_t, A);
    TAKE(h, bf16, A * 2 * (size_t)I);
    TAKE(y, float, A * (size_t)H);
    TAKE(ysh, float, (size_t)T * H);
    TAKE(gemm_sync, int32_t, DS_MOE_GEMM_SYNC_INTS(A, (size_t)E));
#undef TAKE
    return off;
}

#endif
