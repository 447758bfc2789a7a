/* cuda_moe_down.cu — y[a] = W_down[e] · SiLU(g_a)·u_a for every assignment a of a decode-sized
 * step (T ≤ 8 tokens), and the shared expert's ysh[t] = W_sh · sh_act[t], as one persistent,
 * pipelined launch (ctx->moe_down_pipe, DS_CUDA_MOE_DOWN_PIPE).
 *
 * Why: the staged down launch (cuda_moe.cu moe_down_staged_kernel) is 65 × 32 blocks of one
 * 64-row tile each, two blocks an SM, 7.9 waves at batch 8; every block pays a whole DRAM round
 * trip with nothing behind it, and DRAM ran at 55-59 % (ncu s7-run2: 45 µs a layer at batch 8,
 * the largest launch of the step after gate_up). Here a block per SM (or two) walks a
 * contiguous range of work items — (expert, tile of TILE output rows) — with the next STAGES − 1
 * tiles' weights in flight through cp.async into shared memory while it multiplies the current
 * one, so DRAM sees a steady stream instead of waves.
 *
 * Items: the active experts in ascending order (groups.act), each split into ⌈H / TILE⌉ tiles,
 * then (w_sh) the shared expert's tiles; block b takes items [b·n / P, (b + 1)·n / P). When an
 * item's expert differs from the previous one, the block stages that expert's inputs in shared
 * memory as fp32 (SiLU(g)·u of its assignments, exactly XSiluMul's values; the shared expert's
 * bf16 activations, exactly converted) — a block touches one or two experts.
 *
 * Sums: warp w owns rows w·ROWS .. of the tile; lane l multiplies k = 8l + 256u (u = 0, 1, ..)
 * in that order and the warp adds its lanes with warp_sum — the same chunks in the same order
 * as gemv_warp_partial + gemv_warp_reduce with UNROLL ≥ ⌈I / 256⌉, so every output is bit-
 * identical to the staged and per-warp launches (test_cuda_ops moe variants). */
#include "cuda_gemv.cuh"
#include "cuda_launch.cuh"
#include "cuda_moe_down.h"

#define PIPE_WARPS 8
#define PIPE_MAX_T 8

template <int ROWS, int STAGES>
__global__ void __launch_bounds__(PIPE_WARPS * 32, 2) /* ≤ 128 registers */
    moe_down_pipe_kernel(ds_moe_down_args a) {
    constexpr int TILE = PIPE_WARPS * ROWS;
    extern __shared__ __align__(16) unsigned char smem[];
    __shared__ int32_t out_row[PIPE_MAX_T]; /* the current expert's output rows (y or ysh) */
    __shared__ int n_rows;
    const int H = a.H, T = a.T;
    const int P = a.w_sh && a.Is > a.I ? a.Is : a.I; /* row pitch in shared memory */
    bf16 *wst = reinterpret_cast<bf16 *>(smem);                              /* [STAGES][TILE][P] */
    float *act = reinterpret_cast<float *>(smem + (size_t)STAGES * TILE * P * 2); /* [≤ T][P] */
    pdl_enter(); /* cuda_launch.cuh: before any access */
    const int n_act = *a.groups.n_act;
    const int n_exp = n_act + (a.w_sh ? 1 : 0); /* expert index n_act: the shared expert */
    const int tiles = DS_DIV_UP(H, TILE);
    const int total = n_exp * tiles;
    const int it0 = (int)((int64_t)total * blockIdx.x / gridDim.x);
    const int it1 = (int)((int64_t)total * (blockIdx.x + 1) / gridDim.x);
    if (it0 >= it1) return;
    /* cp.async of item it's TILE weight rows (K = I, or Is for the shared expert) into stage s
     * (rows past H zero-filled) */
    auto load_stage = [&](int it, int s) {
        const int x = it / tiles, n0 = (it - x * tiles) * TILE;
        const int K = x < n_act ? a.I : a.Is, cpr = K / 8;
        const bf16 *W = x < n_act ? (const bf16 *)a.w_down + (int64_t)a.groups.act[x] * H * K
                                  : (const bf16 *)a.w_sh;
        bf16 *dst = wst + (size_t)s * TILE * P;
        for (int c = threadIdx.x; c < TILE * cpr; c += blockDim.x) {
            const int r = c / cpr, q = c - r * cpr;
            const bool in = n0 + r < H;
            cp_async16(dst + (size_t)r * P + q * 8, W + (int64_t)(in ? n0 + r : 0) * K + q * 8, in ? 16 : 0);
        }
    };
#pragma unroll
    for (int s = 0; s < STAGES - 1; s++) {
        if (it0 + s < it1) load_stage(it0 + s, s);
        cp_async_commit(); /* empty groups keep the count uniform */
    }

    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    int cur = -1;
    for (int it = it0; it < it1; it++) {
        cp_async_wait<STAGES - 2>(); /* this thread's copies of item it have landed */
        __syncthreads();             /* everyone's; and item it − 1's stage and inputs are free */
        if (it + STAGES - 1 < it1) load_stage(it + STAGES - 1, (it + STAGES - 1 - it0) % STAGES);
        cp_async_commit();
        const int x = it / tiles, n0 = (it - x * tiles) * TILE;
        const int K = x < n_act ? a.I : a.Is, cpr = K / 8;
        if (x != cur) { /* stage this expert's inputs (fp32) and output rows */
            int n, a0 = 0;
            if (x < n_act) {
                a0 = a.groups.off[x];
                n = a.groups.off[x + 1] - a0;
            } else {
                n = T;
            }
            for (int q = threadIdx.x; q < n * cpr; q += blockDim.x) {
                const int r = q / cpr, c = q - r * cpr;
                float f[8];
                if (x < n_act) {
                    const XSiluMul<1> hs{{(const bf16 *)a.h + (int64_t)a.groups.sorted[a0 + r] * 2 * K}, K};
                    hs.load(0, (int64_t)c * 8, f);
                } else {
                    unpack8(ld_cached16((const bf16 *)a.sh_act + (int64_t)r * K + c * 8), f);
                }
                float4 *d = reinterpret_cast<float4 *>(act + (size_t)r * P + c * 8);
                d[0] = make_float4(f[0], f[1], f[2], f[3]);
                d[1] = make_float4(f[4], f[5], f[6], f[7]);
            }
            if (threadIdx.x < n) out_row[threadIdx.x] = x < n_act ? a.groups.sorted[a0 + threadIdx.x] : threadIdx.x;
            if (threadIdx.x == 0) n_rows = n;
            __syncthreads();
            cur = x;
        }
        const bf16 *ws = wst + (size_t)((it - it0) % STAGES) * TILE * P + (size_t)warp * ROWS * P;
        float *out = x < n_act ? a.y : a.ysh;
        const int n = n_rows;
        /* tokens two at a time (the per-warp launches' chunk bound, ctx->moe_rmax = 2) */
        for (int c = 0; c < n; c += 2) {
            const int R = n - c >= 2 ? 2 : 1;
            float acc[ROWS][2];
#pragma unroll
            for (int rr = 0; rr < ROWS; rr++) acc[rr][0] = acc[rr][1] = 0.f;
            for (int k = lane * 8; k < K; k += 256) {
                float xf[2][8];
                const float4 *x0 = reinterpret_cast<const float4 *>(act + (size_t)c * P + k);
                const float4 a0v = x0[0], a1v = x0[1];
                xf[0][0] = a0v.x, xf[0][1] = a0v.y, xf[0][2] = a0v.z, xf[0][3] = a0v.w;
                xf[0][4] = a1v.x, xf[0][5] = a1v.y, xf[0][6] = a1v.z, xf[0][7] = a1v.w;
                if (R == 2) {
                    const float4 *x1 = reinterpret_cast<const float4 *>(act + (size_t)(c + 1) * P + k);
                    const float4 b0v = x1[0], b1v = x1[1];
                    xf[1][0] = b0v.x, xf[1][1] = b0v.y, xf[1][2] = b0v.z, xf[1][3] = b0v.w;
                    xf[1][4] = b1v.x, xf[1][5] = b1v.y, xf[1][6] = b1v.z, xf[1][7] = b1v.w;
                }
#pragma unroll
                for (int rr = 0; rr < ROWS; rr++) {
                    float wf[8];
                    unpack8(*reinterpret_cast<const uint4 *>(ws + (size_t)rr * P + k), wf);
                    float s = acc[rr][0];
#pragma unroll
                    for (int i = 0; i < 8; i++) s = fmaf(wf[i], xf[0][i], s);
                    acc[rr][0] = s;
                    if (R == 2) {
                        float s1 = acc[rr][1];
#pragma unroll
                        for (int i = 0; i < 8; i++) s1 = fmaf(wf[i], xf[1][i], s1);
                        acc[rr][1] = s1;
                    }
                }
            }
#pragma unroll
            for (int rr = 0; rr < ROWS; rr++) {
                acc[rr][0] = warp_sum(acc[rr][0]);
                if (R == 2) acc[rr][1] = warp_sum(acc[rr][1]);
            }
            if (lane == 0) {
#pragma unroll
                for (int rr = 0; rr < ROWS; rr++) {
                    const int row = n0 + warp * ROWS + rr;
                    if (row >= H) continue;
                    out[(int64_t)out_row[c] * H + row] = acc[rr][0];
                    if (R == 2) out[(int64_t)out_row[c + 1] * H + row] = acc[rr][1];
                }
            }
        }
    }
    cp_async_wait<0>(); /* nothing of ours left in flight when the block exits */
}

typedef void (*pipe_kernel_t)(ds_moe_down_args);
static const struct {
    pipe_kernel_t k;
    int rows, stages;
} PIPE_CFG[] = {
    {moe_down_pipe_kernel<8, 3>, 8, 3},
    {moe_down_pipe_kernel<4, 4>, 4, 4},
    {moe_down_pipe_kernel<4, 3>, 4, 3},
};
#define PIPE_NCFG (int)(sizeof PIPE_CFG / sizeof PIPE_CFG[0])

extern "C" void ds_cuda_moe_down_init(ds_cuda_ctx *ctx) {
    for (int i = 0; i < PIPE_NCFG; i++)
        DS_CU(ctx, cudaFuncSetAttribute(PIPE_CFG[i].k, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                        (int)ctx->smem_optin - 1024));
}

extern "C" bool ds_cuda_moe_down_pipe(ds_cuda_ctx *ctx, const ds_moe_down_args *a, int cfg) {
    if (cfg < 0 || cfg >= PIPE_NCFG || a->T < 1 || a->T > PIPE_MAX_T || a->I % 8 || (a->w_sh && a->Is % 8))
        return false;
    const int tile = PIPE_WARPS * PIPE_CFG[cfg].rows;
    const size_t pitch = a->w_sh && a->Is > a->I ? a->Is : a->I;
    const size_t smem = (size_t)PIPE_CFG[cfg].stages * tile * pitch * 2 + (size_t)a->T * pitch * 4;
    if (smem + 1024 > ctx->smem_optin) return false;
    /* blocks an SM by shared memory (228 KB an SM on Hopper, 1 KB reserved per block), ≤ 2 */
    const size_t per_sm = 228 * 1024;
    int bps = (int)(per_sm / (smem + 1024 + 64));
    if (bps > 2) bps = 2;
    if (bps < 1) bps = 1;
    ds_launch(ctx, PIPE_CFG[cfg].k, dim3(ctx->sm_count * bps), PIPE_WARPS * 32, smem, *a);
    DS_CU_LAUNCHED2(ctx, a->w_sh ? "moe_down_pipe_kernel<down+shared>" : "moe_down_pipe_kernel<down>", a->T, a->H);
    return true;
}
