/* cuda_moe.cu — sparse MoE block with shared expert, deterministic (no float atomics).
 *
 *  1. one GEMV/GEMM over the fused [E + 2Is + 1, H] matrix (router | shared gate_up | shared
 *     gate, contiguous by prepare_weights): fp32 logits L [T, E + 2Is + 1];
 *  2. route: per token softmax over E (fp32), top-k (ties → lowest expert id), renormalise;
 *     the shared expert's SiLU(g)·u (bf16) and sigmoid gate;
 *  3. group: one block sorts the T·k assignments by expert (stable), listing active experts,
 *     from a shared-memory copy of the ids (2 and 3 are one launch when T·k ≤ 1024);
 *  4. expert gate_up GEMV: a block per (active expert, 16 output rows) reads only that expert's
 *     rows and serves all its assigned tokens (≤ 8 at a time) → h [A, 2I] bf16;
 *  5. expert down GEMV with SiLU(g)·u computed in its input loader → y [A, H] fp32 (bf16 from
 *     the grouped GEMM with DS_CUDA_MOE_Y16);
 *     (4 and 5 for steps above DS_CUDA_GEMV_MAX_ROWS tokens: the grouped tensor-core GEMM of
 *     cuda_moe_gemm.cu, which writes SiLU(g)·u [A, I] bf16 into h, then y);
 *  6. shared down GEMV → ysh [T, H] fp32;
 *  7. combine: out[t] = Σ_i w_i·y[t·k + i] + sg[t]·ysh[t], summed in slot order → bf16, over
 *     (H/512, T) blocks with each thread's k loads issued together.
 * Grids are sized from T on the host (min(E, T·k) expert blocks); blocks past the device-side
 * count of active experts exit at once, so the launch shape never depends on routing.
 *
 * One translation unit over four files (the stages' device functions inline into each other's
 * kernels: the one-token gate_up launch routes, the one-token down launch combines):
 * cuda_moe_scratch.cuh (the scratch layout), cuda_moe_route.cuh (2, 3), cuda_moe_experts.cuh
 * (4-6 for GEMV-sized steps), and here 7 and the host side that chooses the launches. */
#include <math.h>

#include "cuda_launch.cuh"
#include "cuda_moe_experts.cuh"
#include "cuda_moe_gemm.h"
#include "cuda_moe_route.cuh"
#include "cuda_moe_scratch.cuh"
#include "cuda_norm.cuh"

extern "C" int64_t ds_cuda_moe_in_rows(int E, int Is) { return moe_ldl(E, Is); }

extern "C" size_t ds_cuda_moe_scratch_bytes(int H, int E, int top_k, int I, int Is) {
    return moe_layout(NULL, DS_CUDA_MAX_TOKENS, H, E, top_k, I, Is, NULL);
}

/* ---- 7. combine ---------------------------------------------------------------------------- */

/* out[t, n..n+3] = Σ_i w_i·y[t·k + i, n..n+3] (+ sg[t]·ysh[t, n..n+3]), summed in slot order.
 * A block covers 4·COMBINE_THREADS columns of one token; each thread issues its k (≤ 8 at a
 * time) 16-byte loads (8-byte with Y16: y in bf16, the grouped GEMM's DS_CUDA_MOE_Y16) before
 * the first FMA. */
#define COMBINE_THREADS 128
template <bool Y16>
__global__ void __launch_bounds__(COMBINE_THREADS)
    moe_combine_kernel(int H, int k, int Is, moe_scratch sc, bf16 *__restrict__ out) {
    __shared__ float w_s[32];
    pdl_enter(); /* cuda_launch.cuh: before any access */
    const int t = blockIdx.y;
    if (threadIdx.x < k) w_s[threadIdx.x] = sc.wts[(int64_t)t * k + threadIdx.x];
    __syncthreads();
    const int n = (blockIdx.x * COMBINE_THREADS + threadIdx.x) * 4;
    if (n >= H) return; /* H % 8 == 0: n < H means n + 3 < H */
    float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
    for (int i0 = 0; i0 < k; i0 += 8) {
        float4 y[8];
        if constexpr (Y16) {
            uint2 yb[8];
#pragma unroll
            for (int u = 0; u < 8; u++)
                if (i0 + u < k)
                    yb[u] = __ldcg(reinterpret_cast<const uint2 *>((const bf16 *)sc.y + ((int64_t)t * k + i0 + u) * H + n));
#pragma unroll
            for (int u = 0; u < 8; u++)
                if (i0 + u < k) y[u] = make_float4(bf_lo(yb[u].x), bf_hi(yb[u].x), bf_lo(yb[u].y), bf_hi(yb[u].y));
        } else {
#pragma unroll
            for (int u = 0; u < 8; u++)
                if (i0 + u < k)
                    y[u] = __ldcg(reinterpret_cast<const float4 *>(sc.y + ((int64_t)t * k + i0 + u) * H + n));
        }
#pragma unroll
        for (int u = 0; u < 8; u++) {
            if (i0 + u < k) {
                const float w = w_s[i0 + u];
                acc.x = fmaf(w, y[u].x, acc.x);
                acc.y = fmaf(w, y[u].y, acc.y);
                acc.z = fmaf(w, y[u].z, acc.z);
                acc.w = fmaf(w, y[u].w, acc.w);
            }
        }
    }
    if (Is > 0) {
        const float g = sc.sg[t];
        const float4 ys = __ldcg(reinterpret_cast<const float4 *>(sc.ysh + (int64_t)t * H + n));
        acc.x = fmaf(g, ys.x, acc.x);
        acc.y = fmaf(g, ys.y, acc.y);
        acc.z = fmaf(g, ys.z, acc.z);
        acc.w = fmaf(g, ys.w, acc.w);
    }
    uint2 o;
    o.x = pack_bf2(acc.x, acc.y);
    o.y = pack_bf2(acc.z, acc.w);
    *reinterpret_cast<uint2 *>(out + (int64_t)t * H + n) = o;
}

/* The combine fused with the residual add + RMSNorm that follows the MoE block
 * (DS_OPT_FUSED_NORM): one block of DS_NORM_THREADS per token computes each 8-column chunk of
 * the combine exactly as moe_combine_kernel does (slot order, then the shared expert, rounded to
 * bf16 as it would be stored) and hands it to the same add_rmsnorm_row as the unfused kernel,
 * so the residual and the normed row are bit-identical to combine + add_rmsnorm. */
template <bool Y16>
__global__ void __launch_bounds__(DS_NORM_THREADS)
    moe_combine_norm_kernel(int H, int k, int Is, moe_scratch sc, bf16 *__restrict__ residual,
                            const bf16 *__restrict__ pre, const float *__restrict__ norm_w,
                            float eps, bf16 *__restrict__ normed, int regs) {
    __shared__ float w_s[32];
    __shared__ float red[32];
    const NormW nw = norm_w_load(norm_w, H, regs); /* weights, before the wait (cuda_launch.cuh) */
    pdl_enter(); /* cuda_launch.cuh: before any other access */
    const int t = blockIdx.x;
    if (threadIdx.x < k) w_s[threadIdx.x] = sc.wts[(int64_t)t * k + threadIdx.x];
    __syncthreads();
    const float g = Is > 0 ? sc.sg[t] : 0.f;
    auto combine8 = [&](int64_t v, float d[8]) {
        const int64_t n = v * 8;
        float acc[8];
#pragma unroll
        for (int j = 0; j < 8; j++) acc[j] = 0.f;
        for (int i0 = 0; i0 < k; i0 += 8) {
            if constexpr (Y16) { /* one 16-byte load a slot, unpacked at its FMAs */
                uint4 yb[8];
#pragma unroll
                for (int u = 0; u < 8; u++)
                    if (i0 + u < k)
                        yb[u] = __ldcg(reinterpret_cast<const uint4 *>((const bf16 *)sc.y + ((int64_t)t * k + i0 + u) * H + n));
#pragma unroll
                for (int u = 0; u < 8; u++)
                    if (i0 + u < k) {
                        float f[8];
                        unpack8(yb[u], f);
                        const float w = w_s[i0 + u];
#pragma unroll
                        for (int j = 0; j < 8; j++) acc[j] = fmaf(w, f[j], acc[j]);
                    }
            } else {
                float4 y[8][2];
#pragma unroll
                for (int u = 0; u < 8; u++)
                    if (i0 + u < k) {
                        const float4 *p = reinterpret_cast<const float4 *>(sc.y + ((int64_t)t * k + i0 + u) * H + n);
                        y[u][0] = __ldcg(p);
                        y[u][1] = __ldcg(p + 1);
                    }
#pragma unroll
                for (int u = 0; u < 8; u++) { /* (written out: this path's code as before Y16) */
                    if (i0 + u < k) {
                        const float w = w_s[i0 + u];
                        acc[0] = fmaf(w, y[u][0].x, acc[0]);
                        acc[1] = fmaf(w, y[u][0].y, acc[1]);
                        acc[2] = fmaf(w, y[u][0].z, acc[2]);
                        acc[3] = fmaf(w, y[u][0].w, acc[3]);
                        acc[4] = fmaf(w, y[u][1].x, acc[4]);
                        acc[5] = fmaf(w, y[u][1].y, acc[5]);
                        acc[6] = fmaf(w, y[u][1].z, acc[6]);
                        acc[7] = fmaf(w, y[u][1].w, acc[7]);
                    }
                }
            }
        }
        if (Is > 0) {
            const float4 *p = reinterpret_cast<const float4 *>(sc.ysh + (int64_t)t * H + n);
            const float4 s0 = __ldcg(p), s1 = __ldcg(p + 1);
            acc[0] = fmaf(g, s0.x, acc[0]);
            acc[1] = fmaf(g, s0.y, acc[1]);
            acc[2] = fmaf(g, s0.z, acc[2]);
            acc[3] = fmaf(g, s0.w, acc[3]);
            acc[4] = fmaf(g, s1.x, acc[4]);
            acc[5] = fmaf(g, s1.y, acc[5]);
            acc[6] = fmaf(g, s1.z, acc[6]);
            acc[7] = fmaf(g, s1.w, acc[7]);
        }
        unpack8(pack8(acc), d); /* rounded to bf16, as the unfused combine stores it */
    };
    add_rmsnorm_row<true>(residual + (int64_t)t * H, pre ? pre + (int64_t)t * H : pre, combine8,
                          norm_w, nw, eps, H,
                          normed + (int64_t)t * H, red, regs);
}

/* Shared-memory limit of the prefill group kernel (ids of up to DS_CUDA_MAX_TOKENS·32
 * assignments and its placing warps' cursors: all the device allows), set once at creation. */
extern "C" void ds_cuda_moe_init(ds_cuda_ctx *ctx) {
    const int bytes = (int)ctx->smem_optin - 8192;
    DS_CU(ctx, cudaFuncSetAttribute(moe_group_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    bytes));
    ds_cuda_moe_gemm_init(ctx);
}

extern "C" int ds_cuda_moe_down_combine_ok(const ds_cuda_ctx *ctx, int T, int H, int k, int I, int Is) {
    /* the shared expert's down runs in this launch: only where it may share the routed
     * experts' launch (DS_OPT_SHARED_EXPERT), so that switch's ablation keeps its meaning */
    return ctx->moe_down_combine && ctx->opt.fuse_norm && (Is == 0 || ctx->opt.moe_fuse_shared) &&
           T == 1 && k >= 1 &&
           k + (Is > 0 ? 1 : 0) <= MOE_DC_MAX_WARPS && H % 8 == 0 && I % 8 == 0 && Is % 8 == 0;
}

/* The one-token down + combine kernel at dr rows a warp (8 × 1 batch, 4 or 2 × 2 batches). */
template <bool EARLY>
static auto down_combine_kernel(int dr) {
    return dr == 8 ? moe_down_combine_kernel<8, 1, EARLY>
           : dr == 2 ? moe_down_combine_kernel<2, 2, EARLY> : moe_down_combine_kernel<4, 2, EARLY>;
}

extern "C" void ds_cuda_moe(ds_cuda_ctx *ctx, const ds_cuda_moe_args *a) {
    const int T = a->T;
    if (T <= 0) return;
    if (a->residual && !a->normed && !ds_cuda_moe_down_combine_ok(ctx, T, a->H, a->top_k, a->I, a->Is)) {
        ds_cuda_check(ctx, cudaErrorInvalidValue, "moe: no normed output needs the down + combine launch",
                      __FILE__, __LINE__);
        return;
    }
    if (T > DS_CUDA_MAX_TOKENS || a->E > MOE_MAX_E || a->top_k > 32 || a->top_k > a->E || a->H % 8 || a->I % 8 ||
        a->Is % 8) {
        ds_cuda_check(ctx, cudaErrorInvalidValue, "moe: shape outside the built kernels", __FILE__,
                      __LINE__);
        return;
    }
    const int H = a->H, E = a->E, k = a->top_k, I = a->I, Is = a->Is;
    const int A = T * k;
    const int64_t NL = (int64_t)E + 2 * Is + (Is ? 1 : 0);
    moe_scratch sc;
    moe_layout((char *)ctx->d_moe_scratch, T, H, E, k, I, Is, &sc);

    /* 1. router | shared gate_up | shared gate */
    const int64_t ldl = moe_ldl(E, Is);
    if (a->pre_delta) { /* with the add + norm before the block (cuda_gemv_norm.cu) */
        if (!a->residual) {
            ds_cuda_check(ctx, cudaErrorInvalidValue, "moe: pre_delta needs residual",
                          __FILE__, __LINE__);
            return;
        }
        ds_cuda_gemv_add_norm(ctx, a->w_in, NL, H, a->residual, a->pre_delta, a->pre_norm_w, a->eps,
                              (void *)a->x, T, sc.L, ldl, 1); /* x is written here */
    } else if (T <= DS_CUDA_GEMV_MAX_ROWS) ds_cuda_gemv(ctx, a->w_in, NL, H, a->x, H, T, sc.L, ldl, 1);
    else /* NL odd: split there, or over the zero rows up to ldl (ctx->router_pad) */
        ds_cuda_gemm_lt(ctx, a->w_in, ctx->router_pad ? ldl : NL, H, a->x, H, T, sc.L, ldl, 1);
    /* 2. route, 3. group: one launch for small steps (the fast kernel when the router logits
     * fit in shared memory), else a route grid and a group block with the ids staged in
     * dynamic shared memory */
    const bool pf_on = ds_prefetch_on(ctx) && T <= DS_CUDA_GEMV_MAX_ROWS;
    const moe_prefetch pf_gu = {pf_on ? (const bf16 *)a->w_gu : NULL, 2 * (int64_t)I * H * 2};
    /* the grouped GEMM from ctx->moe_gemm_min_t tokens (DS_CUDA_MOE_GEMM_MIN_T, default
     * DS_CUDA_GEMV_MAX_ROWS + 1; never one-token steps, which have their own down + combine) */
    const bool use_gemm = T > 1 && T >= ctx->moe_gemm_min_t && ctx->opt.moe_gemm && ds_cuda_moe_gemm_fits(H, I);
    /* one-token steps: routing and grouping inside the gate_up launch (moe_gate_up_routed_kernel).
     * Only T = 1: every gate_up block repeats the routing, and at T = 4 / 8 (32 / 64 expert
     * columns of blocks, each routing T tokens) that cost 5.878 vs 5.178 and 9.835 vs 7.745 ms
     * per step, against 2.936 vs 3.000 ms at T = 1 (s5-run2); DS_CUDA_ROUTE_FUSED_MAX_T re-measures
     * that with session 10-13's routing in registers */
    const bool route_fused = ctx->opt.moe_route_fused && !use_gemm && T <= ctx->route_fused_max_t &&
                             E <= MOE_WARPS * 32 && T * E <= ROUTE_FUSED_LOGITS && A <= ROUTE_FUSED_A;
    if (route_fused) {
        /* nothing here: step 4 routes */
    } else if (A <= MOE_FUSED_A && T * E <= ROUTE_FAST_LOGITS && ctx->opt.moe_fast_route) {
        ds_launch(ctx, moe_route_group_fast_kernel, 1, 1024, 0, T, E, k, Is, (int)a->norm_topk, sc,
                  pf_gu, ctx->route_batched, ds_cuda_route_mode(ctx));
        DS_CU_LAUNCHED2(ctx, "moe_route_group_fast_kernel", T, E);
    } else if (A <= MOE_FUSED_A) {
        ds_launch(ctx, moe_route_group_kernel, 1, 1024, 0, T, E, k, Is, (int)a->norm_topk, sc,
                  pf_gu);
        DS_CU_LAUNCHED2(ctx, "moe_route_group_kernel", T, E);
    } else {
        /* ids, then as many placing warps' cursors as fit (up to 32) */
        const size_t ids_bytes = sizeof(int32_t) * (size_t)A, cur_bytes = sizeof(int32_t) * (size_t)E;
        const size_t room = ctx->smem_optin > ids_bytes + 8192 ? ctx->smem_optin - ids_bytes - 8192 : 0;
        const int PW = room / cur_bytes > 32 ? 32 : (int)(room / cur_bytes);
        const size_t smem = ids_bytes + (size_t)PW * cur_bytes;
        if (PW < 1) {
            ds_cuda_check(ctx, cudaErrorInvalidValue, "moe: too many assignments for the group kernel",
                          __FILE__, __LINE__);
            return;
        }
        ds_launch(ctx, moe_route_kernel, DS_DIV_UP(T, ROUTE_WARPS), ROUTE_WARPS * 32, 0, T, E, k,
                  Is, (int)a->norm_topk, sc, ds_cuda_route_mode(ctx), ctx->route_batched);
        DS_CU_LAUNCHED2(ctx, "moe_route_kernel", T, E);
        ds_launch(ctx, moe_group_kernel, 1, 1024, smem, A, E, PW, sc, ctx->route_batched);
        DS_CU_LAUNCHED2(ctx, "moe_group_kernel", A, E);
    }
    /* 4. gate_up, 5. down (+ 6. the shared expert's down in the same launch for GEMV-sized
     * steps when ctx->opt.moe_fuse_shared). Larger steps: the grouped tensor-core GEMM
     * (cuda_moe_gemm.cu, DS_OPT_MOE_GEMM) */
    const int nblk = A < E ? A : E;
    /* the grouped GEMM's y in bf16 (ctx->moe_y16), read so by the combine below */
    const bool y16 = use_gemm && ctx->moe_y16;
    const bool fuse_sh = Is > 0 && T <= DS_CUDA_GEMV_MAX_ROWS && ctx->opt.moe_fuse_shared && !use_gemm;
    if (use_gemm) {
        ds_moe_gemm_args g = {};
        g.A = A, g.E = E, g.H = H, g.I = I, g.top_k = k;
        g.x = a->x, g.w_gu = a->w_gu, g.w_down = a->w_down;
        g.groups = ds_moe_groups{sc.n_act, sc.act, sc.off, sc.sorted};
        g.act = sc.h; /* [A, I] of the [A, 2I] buffer */
        g.y = sc.y;
        g.y_bf16 = y16;
        g.sync = sc.gemm_sync;
        ds_cuda_moe_gemm(ctx, &g);
    } else {
        /* the gate_up blocks' L2 prefetch of their expert's down slice: with DS_OPT_PREFETCH
         * only (alone, s7-run4: 2.765 / 5.184 / 7.518 vs 2.691 / 5.066 / 7.399 ms, slower) */
        const bf16 *pf_down = pf_on ? (const bf16 *)a->w_down : (const bf16 *)NULL;
        /* 5-7 in one launch (moe_down_combine_kernel), the norm left to the caller */
        const bool down_combine = a->residual && !a->normed;
        const int dc_warps = k + (Is > 0 ? 1 : 0); /* its block: a warp a slot, one for the shared expert */
        /* the routing flag between the one-token gate_up (routing inside) and the down +
         * combine launch (ctx->moe_down_early): set by the one, waited on by the other, so only
         * when both run (a launch dropped by DS_CUDA_DIAG_SKIP would leave the other waiting) */
        const void *gate_up_routed = ctx->moe_gu_rows == 4 ? (const void *)moe_gate_up_routed_kernel<4, 2>
                                                           : (const void *)moe_gate_up_routed_kernel<2, 4>;
        const bool gate_up_runs = !ctx->diag_skip || !ds_cuda_diag_skip(ctx, gate_up_routed);
        int *route_flag = ctx->moe_down_early && route_fused && down_combine && dc_warps <= MOE_DC_EARLY_WARPS &&
                                  gate_up_runs
                              ? ctx->d_route_flag
                              : NULL;
        if (ctx->moe_gu_rows == 4) launch_gate_up<4, 2>(ctx, a, sc, nblk, route_fused, pf_down, route_flag);
        else launch_gate_up<2, 4>(ctx, a, sc, nblk, route_fused, pf_down, route_flag);
        if (down_combine) {
            /* rows a warp (ctx->moe_dc_rows): 4 × 2 batches, 89 registers, 2 blocks of 9 warps
             * an SM, so the 35B-A3B's 512 blocks take two waves; 8 × 1 (105 registers: 256
             * blocks, one wave, two round trips a warp) or 2 × 2 (62: 3 blocks an SM). Same sums. */
            const int dr = ctx->moe_dc_rows == 4 || ctx->moe_dc_rows == 2 ? ctx->moe_dc_rows : 8;
            auto kern = route_flag ? down_combine_kernel<true>(dr) : down_combine_kernel<false>(dr);
            ds_launch(ctx, kern, DS_DIV_UP(H, dr), dc_warps * 32, 0,
                      (const bf16 *)a->w_down, H, I, k, sc, (const bf16 *)a->w_sh_down, Is,
                      (bf16 *)a->residual, (const bf16 *)a->pre_delta, ctx->gemv_preload, route_flag);
            DS_CU_LAUNCHED2(ctx, "moe_down_combine_kernel", T, H);
            return;
        }
        const bf16 *w_sh = fuse_sh ? (const bf16 *)a->w_sh_down : (const bf16 *)NULL;
        const bf16 *pf_sh = pf_on ? (const bf16 *)a->w_sh_down : (const bf16 *)NULL;
        /* rows per warp of the down launch (0 = by step size: 16 rows read 16 KB per warp, fewer
         * and longer blocks; at T = 1 they cost 2.958 vs 2.919 ms per step, at T = 4 / 8 they
         * saved 5.162 → 5.054 and 7.683 → 7.506 ms, s5-run3). Results are the same bits. */
        const int down_rows = ctx->moe_down_rows ? ctx->moe_down_rows : (T == 1 ? 4 : 16);
        /* steps of 2+ tokens with the default rows: inputs staged (moe_down_staged_kernel) */
        const size_t staged_smem = sizeof(float) * (size_t)T * (size_t)I;
        if (ctx->moe_down_staged && T >= 2 && ctx->moe_down_rows == 0 && ctx->moe_rmax == 2 &&
            staged_smem <= 48 * 1024) { /* 8 rows per warp: the whole K = I per lane in one batch */
            /* `tiles` row tiles a routed block (8 rows a warp for one, else 4), the shared
             * expert one a block over `tiles` columns */
            const int tiles = ctx->moe_down_tiles, rows = tiles == 1 ? 8 : 4;
            dim3 grid(nblk + (w_sh ? tiles : 0), DS_DIV_UP(DS_DIV_UP(H, MOE_WARPS * rows), tiles));
            auto kern = tiles == 8 ? moe_down_staged_kernel<4, 2, 2, 8>
                        : tiles == 4 ? moe_down_staged_kernel<4, 2, 2, 4>
                        : tiles == 2 ? moe_down_staged_kernel<4, 2, 2, 2>
                                     : moe_down_staged_kernel<8, 2, 2, 1>;
            ds_launch(ctx, kern, grid, MOE_WARPS * 32, staged_smem, (const bf16 *)a->w_down, H, I, sc,
                      w_sh, Is, T, pf_sh);
        } else if (down_rows == 16) launch_down<16, 1>(ctx, a, sc, nblk, w_sh, pf_sh);
        else if (down_rows == 8) launch_down<8, 2>(ctx, a, sc, nblk, w_sh, pf_sh);
        else launch_down<4, 2>(ctx, a, sc, nblk, w_sh, pf_sh);
        DS_CU_LAUNCHED2(ctx, fuse_sh ? "moe_expert_kernel<down+shared>" : "moe_expert_kernel<down>", T, H);
    }
    /* 6. shared expert down */
    if (Is > 0 && !fuse_sh) {
        if (T <= DS_CUDA_GEMV_MAX_ROWS) ds_cuda_gemv(ctx, a->w_sh_down, H, Is, sc.sh_act, Is, T, sc.ysh, H, 1);
        else ds_cuda_gemm_lt(ctx, a->w_sh_down, H, Is, sc.sh_act, Is, T, sc.ysh, H, 1);
    }
    /* 7. combine (+ the residual add and RMSNorm that follow the block) */
    if (a->residual) {
        ds_launch(ctx, y16 ? moe_combine_norm_kernel<true> : moe_combine_norm_kernel<false>, T,
                  DS_NORM_THREADS, 0, H, k, Is, sc,
                  (bf16 *)a->residual, (const bf16 *)a->pre_delta, a->norm_w, a->eps,
                  (bf16 *)a->normed, ctx->norm_regs);
        DS_CU_LAUNCHED2(ctx, "moe_combine_norm_kernel", T, H);
        return;
    }
    ds_launch(ctx, y16 ? moe_combine_kernel<true> : moe_combine_kernel<false>,
              dim3(DS_DIV_UP(H, 4 * COMBINE_THREADS), T), COMBINE_THREADS, 0, H, k, Is, sc,
              (bf16 *)a->out);
    DS_CU_LAUNCHED2(ctx, "moe_combine_kernel", T, H);
}
