/* cuda_moe_down.h — the routed experts' down projection of decode-sized MoE steps as a
 * persistent, pipelined launch (cuda_moe_down.cu, DS_CUDA_MOE_DOWN_PIPE), called by ds_cuda_moe
 * after the gate_up launch. */
#ifndef DS_CUDA_MOE_DOWN_H
#define DS_CUDA_MOE_DOWN_H

#include <stdbool.h>
#include <stdint.h>

#include "cuda_moe_gemm.h"

typedef struct ds_moe_down_args {
    int T, H, I, Is;       /* tokens of the step (≤ 8), hidden, expert width, shared width */
    ds_moe_groups groups;  /* the step's assignments grouped by expert (device) */
    const void *h;         /* [T·top_k, 2I] bf16: each assignment's gate | up outputs */
    const void *w_down;    /* [E, H, I] bf16 */
    const void *w_sh;      /* [H, Is] bf16: the shared expert's down rows, or NULL (not here) */
    const void *sh_act;    /* [T, Is] bf16: the shared expert's SiLU(g)·u */
    float *y;              /* [T·top_k, H] fp32 per-assignment outputs */
    float *ysh;            /* [T, H] fp32 shared expert output */
} ds_moe_down_args;

#ifdef __cplusplus
extern "C" {
#endif
/* Once at backend creation (the kernels' dynamic shared memory limit). */
void ds_cuda_moe_down_init(ds_cuda_ctx *ctx);
/* Launches the down projection (and the shared expert's, when w_sh) with tile configuration
 * cfg (0: 64 rows × 3 stages, 1: 32 rows × 4 stages, 2: 32 rows × 3 stages); returns false
 * without launching when the shape does not fit (shared memory, T > 8, widths not multiples of 8). */
bool ds_cuda_moe_down_pipe(ds_cuda_ctx *ctx, const ds_moe_down_args *a, int cfg);
#ifdef __cplusplus
}
#endif

#endif
