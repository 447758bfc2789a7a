/* cuda_moe_gemm.h — the routed experts of prefill-sized MoE steps as a grouped GEMM on tensor
 * cores (cuda_moe_gemm.cu), called by ds_cuda_moe after routing and grouping. */
#ifndef DS_CUDA_MOE_GEMM_H
#define DS_CUDA_MOE_GEMM_H

#include <stdbool.h>
#include <stdint.h>

#include "cuda_internal.h"

/* The assignments grouped by expert, on the device (written by the group step,
 * cuda_moe_route.cuh). */
typedef struct ds_moe_groups {
    const int32_t *n_act;  /* [1] number of active experts */
    const int32_t *act;    /* [E] active expert ids, ascending */
    const int32_t *off;    /* [n_act + 1] first assignment of each active expert in sorted */
    const int32_t *sorted; /* [A] assignment indices (token·top_k + slot), grouped by expert */
} ds_moe_groups;

typedef struct ds_moe_gemm_args {
    int A, E, H, I, top_k; /* A = T·top_k assignments */
    const void *x;         /* [T, H] bf16 */
    const void *w_gu;      /* [E, 2I, H] bf16: gate rows, then up rows */
    const void *w_down;    /* [E, H, I] bf16 */
    ds_moe_groups groups;
    void *act;             /* out of gate_up, in of down: [A, I] bf16, SiLU(g)·u */
    void *y;               /* [A, H] per-assignment expert outputs: fp32, or bf16 with y_bf16 */
    int y_bf16;            /* ctx->moe_y16 (DS_CUDA_MOE_Y16): y rounded to bf16, half the bytes */
    int32_t *sync;         /* [DS_MOE_GEMM_SYNC_INTS(A, E)] device scratch of the TMA kernel
                              (work tickets, per-M-tile counts; it zeroes them itself) */
} ds_moe_gemm_args;

/* The grouped GEMMs' M tiles (64 assignment rows, each expert's rows padded to a whole
 * tile) number at most ⌈A / 64⌉ + min(E, A); the TMA kernel's sync scratch holds two tickets
 * and one count per M tile. */
#define DS_MOE_GEMM_MAX_MTILES(A, E) (((A) + 63) / 64 + ((A) < (E) ? (A) : (E)))
#define DS_MOE_GEMM_SYNC_INTS(A, E) (2 + DS_MOE_GEMM_MAX_MTILES(A, E))

#ifdef __cplusplus
extern "C" {
#endif
/* Whether the tile kernels cover this shape (K of both passes a multiple of 32). */
bool ds_cuda_moe_gemm_fits(int H, int I);
/* Once at backend creation (the kernels' dynamic shared memory limit). */
void ds_cuda_moe_gemm_init(ds_cuda_ctx *ctx);
void ds_cuda_moe_gemm(ds_cuda_ctx *ctx, const ds_moe_gemm_args *a);
/* The TMA-fed kernel (cuda_moe_gemm_tma.cu, DS_CUDA_MOE_GEMM_TMA): its setup (called by
 * ds_cuda_moe_gemm_init), whether it covers these arguments (H % 128, I % 64, a driver with
 * tensor maps), and both passes — false, with nothing launched, where it does not apply. */
void ds_cuda_moe_gemm_tma_init(ds_cuda_ctx *ctx);
bool ds_cuda_moe_gemm_tma_fits(const ds_cuda_ctx *ctx, const ds_moe_gemm_args *a);
bool ds_cuda_moe_gemm_tma(ds_cuda_ctx *ctx, const ds_moe_gemm_args *a);
#ifdef __cplusplus
}
#endif

#endif
