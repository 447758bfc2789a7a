/* cuda_moe_bulk.cuh — the expert GEMVs (gate_up, then down with the shared expert's down) of
 * decode-sized steps of 2 … DS_CUDA_GEMV_MAX_ROWS tokens with their weights streamed into shared
 * memory by bulk copies (ctx->moe_bulk, DS_CUDA_MOE_BULK). Included by cuda_moe.cu only.
 *
 * Why: at batch 8 the register-fed kernels (cuda_moe_experts.cuh) read the experts' gate_up at
 * ~2.6 TB/s and their down at ~2.3 (eager, H100, s28-run1: 88.6 and 49.7 µs a layer against the
 * 3.04 TB/s copy rate). Each of their blocks owns 64 KB of one expert and pays a chain of
 * dependent loads (active list, offsets, assignments, inputs) before its first weight load, and
 * a warp's loads come in batches with FMAs between them. Here one block an SM walks a
 * contiguous range of work items (16-32 KB of one expert's rows each) and a producer warp keeps
 * up to six items' bytes in flight with one bulk copy an item, so the routing's dependent loads
 * of the next items overlap the current item's arithmetic.
 *
 * Block: MB_CONSUMERS consumer warps + one producer warp, one block an SM, grid = the SMs.
 *   item j (of the block's range) = tile y of active expert i (rows y·RI …, RI = 8·RPW), or
 *   for the down pass with w_sh, tile y of the shared expert (after the routed items);
 *   producer  per item: waits for its ring stage to be empty, writes the item's metadata (expert,
 *             rows, assignments) and bulk-copies its weight rows (contiguous in the expert's
 *             matrix; L2 evict-first) and, for the down pass, its assignments' gate_up rows
 *             [2I] (the shared expert: sh_act [T, I]) into the stage; the gate_up pass copies
 *             x [T, H] once at the start instead;
 *   consumer  warp w: rows RPW·w … of the item against each of its assignments' inputs from
 *             shared memory.
 * Each output sums lane l's chunks k = 8l + 256j in ascending j (8 FMAs a chunk, weight first)
 * and reduces with warp_sum: gemv_warp_partial's order, so the results are bit for bit those of
 * the register-fed kernels (test_cuda_ops moe_variants_vs_default). An expert with more than
 * MB_MAX_N assignments (only from NaN router logits: every top-k round then takes expert 0)
 * takes the assignments past the first MB_MAX_N from global memory (DS_CUDA_MOE_BULK=2 keeps
 * one, so that the tests run that path). */
#ifndef DS_CUDA_MOE_BULK_CUH
#define DS_CUDA_MOE_BULK_CUH

#include "cuda_gemv.cuh"
#include "cuda_internal.h"
#include "cuda_launch.cuh"
#include "cuda_moe_scratch.cuh"
#include "cuda_tma.cuh"

#define MB_CONSUMERS 8
#define MB_THREADS ((MB_CONSUMERS + 1) * 32)
#define MB_STAGE_W (32 * 1024) /* weight bytes a stage holds (one item) */
#define MB_MAX_STAGES 6
#define MB_MAX_N DS_CUDA_GEMV_MAX_ROWS /* assignments of an item kept in shared memory */

/* a ring stage's work item, written by the producer before the stage's bytes are announced */
struct mb_meta {
    int e;              /* expert; −1: the shared expert */
    int r0, rows;       /* output rows r0 … r0 + rows − 1 */
    int n, a0;          /* assignments sorted[a0 … a0 + n) (shared expert: tokens 0 … n − 1) */
    int ids[MB_MAX_N];  /* the first MB_MAX_N of them */
};

/* dynamic shared memory: barriers [full | empty | x], metadata, x (gate_up), the stages */
#define MB_META_OFF 128
#define MB_X_OFF (((MB_META_OFF + MB_MAX_STAGES * (int)sizeof(mb_meta)) + 127) & ~127)
struct mb_layout {
    int stages;
    uint32_t st_off;      /* first stage */
    uint32_t w_bytes;     /* an item's weights: RI rows of K */
    uint32_t stage_bytes; /* w_bytes + the down pass's input rows [MB_MAX_N][2I] bf16 */
    uint32_t total;
};

/* acc[rr][c] (c < nc) += rows rbase + rr (< rows) of the stage's weights wst [rows][K] against
 * input c: src[c] [K] bf16 (SILU: SiLU(src[c][k]) · src[c][I + k], XSiluMul's values) */
template <int RPW, bool SILU>
static __device__ __forceinline__ void mb_dot(const bf16 *wst, int K, int rbase, int rows,
                                              const bf16 *const src[MB_MAX_N], int nc, int I,
                                              float acc[RPW][MB_MAX_N]) {
    const int lane = threadIdx.x & 31;
    for (int kb = lane * 8; kb < K; kb += 256) {
        float wf[RPW][8];
#pragma unroll
        for (int rr = 0; rr < RPW; rr++) {
            const uint4 w = rbase + rr < rows ? *reinterpret_cast<const uint4 *>(wst + (int64_t)(rbase + rr) * K + kb)
                                              : make_uint4(0, 0, 0, 0);
            unpack8(w, wf[rr]);
        }
#pragma unroll
        for (int c = 0; c < MB_MAX_N; c++) {
            if (c >= nc) break;
            float xf[8];
            unpack8(*reinterpret_cast<const uint4 *>(src[c] + kb), xf);
            if (SILU) {
                float u[8];
                unpack8(*reinterpret_cast<const uint4 *>(src[c] + I + kb), u);
#pragma unroll
                for (int i = 0; i < 8; i++) xf[i] = silu_f(xf[i]) * u[i];
            }
#pragma unroll
            for (int rr = 0; rr < RPW; rr++) {
                float s = acc[rr][c];
#pragma unroll
                for (int i = 0; i < 8; i++) s = fmaf(wf[rr][i], xf[i], s);
                acc[rr][c] = s;
            }
        }
    }
}

/* DOWN false: h[a, r] = W_e[r] · x[a / k] for r < N = 2I, K = H. DOWN true: y[a, r] = W_e[r] ·
 * SiLU(g_a) u_a for r < N = H, K = I, and with w_sh ysh[t, r] = W_sh[r] · sh_act[t] (Is = I). */
template <bool DOWN, int RPW>
__global__ void __launch_bounds__(MB_THREADS, 2)
    moe_bulk_kernel(const bf16 *__restrict__ W, const bf16 *__restrict__ w_sh, const bf16 *__restrict__ x,
                    int N, int K, int T, int k, moe_scratch sc, mb_layout L, int keep) {
    extern __shared__ __align__(128) unsigned char mb_smem[];
    constexpr int RI = MB_CONSUMERS * RPW;
    uint64_t *full = reinterpret_cast<uint64_t *>(mb_smem);
    uint64_t *empty = full + MB_MAX_STAGES;
    uint64_t *xbar = empty + MB_MAX_STAGES;
    mb_meta *meta = reinterpret_cast<mb_meta *>(mb_smem + MB_META_OFF);
    bf16 *xs = reinterpret_cast<bf16 *>(mb_smem + MB_X_OFF); /* gate_up: x [T, K] */
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    if (threadIdx.x == 0) {
        for (int s = 0; s < L.stages; s++) {
            mbar_init(&full[s], 1);
            mbar_init(&empty[s], MB_CONSUMERS);
        }
        mbar_init(xbar, 1);
        mbar_init_fence();
    }
    __syncthreads();
    pdl_enter(); /* cuda_launch.cuh: before any global access */
    __shared__ int offs[MOE_MAX_E + 1]; /* the groups' offsets: assignments before expert i */
    const int n_act = *sc.n_act;
    for (int i = threadIdx.x; i <= n_act; i += blockDim.x) offs[i] = sc.off[i];
    __syncthreads();
    const int ipe = (N + RI - 1) / RI; /* items an expert */
    const int n_exp = n_act + (DOWN && w_sh ? 1 : 0); /* the shared expert last, T inputs */
    const int total = n_exp * ipe;
    /* The blocks' item ranges by cost, an item costing 1 + its input rows (its bytes and its
     * sums): the shared expert's items (T inputs each) on one block's range took it ~4× as long
     * as the others (ncu s28-run3, SM active 52 % of the launch). cost(i) = the cost of every
     * item of the experts before i. */
    auto cost = [&](int i) { return (int64_t)ipe * (i + (i <= n_act ? offs[i] : offs[n_act] + T)); };
    auto first_item = [&](int b) { /* the first item at or past cost b/G of the total */
        if (b >= (int)gridDim.x) return total;
        const int64_t target = cost(n_exp) * b / gridDim.x;
        int lo = 0, hi = n_exp - 1; /* the last expert whose items start at or before target */
        while (lo < hi) {
            const int mid = (lo + hi + 1) / 2;
            if (cost(mid) <= target) lo = mid;
            else hi = mid - 1;
        }
        const int64_t ci = 1 + (lo < n_act ? offs[lo + 1] - offs[lo] : T);
        const int64_t y = (target - cost(lo) + ci - 1) / ci;
        return y >= ipe ? (lo + 1) * ipe : lo * ipe + (int)y;
    };
    const int j0 = first_item(blockIdx.x), j1 = first_item(blockIdx.x + 1);
    if (j0 >= j1) return;
    auto stage = [&](int s) { return mb_smem + L.st_off + (size_t)s * L.stage_bytes; };

    if (warp == MB_CONSUMERS) { /* producer */
        const uint64_t pol = l2_policy_evict_first();
        if (!DOWN && lane == 0) {
            mbar_arrive_expect_tx(xbar, (uint32_t)T * K * 2);
            bulk_load_1d(xs, x, (uint32_t)T * K * 2, xbar);
        }
        int cur = -1, e = -1, n = 0, a0 = 0, id = 0;
        for (int j = j0, u = 0; j < j1; j++, u++) {
            const int s = u % L.stages, round = u / L.stages;
            const int i = j / ipe, y = j - i * ipe;
            if (i != cur) { /* the items of a block's range change expert rarely */
                cur = i;
                if (i < n_act) {
                    e = sc.act[i];
                    a0 = sc.off[i];
                    n = sc.off[i + 1] - a0;
                    id = lane < n && lane < MB_MAX_N ? sc.sorted[a0 + lane] : 0;
                } else {
                    e = -1, a0 = 0, n = T, id = lane;
                }
            }
            if (round > 0) mbar_wait(&empty[s], (round - 1) & 1);
            mb_meta &m = meta[s];
            const int r0 = y * RI, rows = min(RI, N - r0);
            int ids[MB_MAX_N]; /* lane 0 writes the whole record: its arrival releases it */
#pragma unroll
            for (int c = 0; c < MB_MAX_N; c++) ids[c] = __shfl_sync(0xffffffffu, id, c);
            if (lane == 0) {
                m.e = e, m.r0 = r0, m.rows = rows, m.n = n, m.a0 = a0;
#pragma unroll
                for (int c = 0; c < MB_MAX_N; c++) m.ids[c] = ids[c];
                unsigned char *st = stage(s);
                const uint32_t wb = (uint32_t)rows * K * 2; /* ≤ L.w_bytes */
                const int na = e >= 0 ? min(n, keep) : n; /* rows copied: the kept ones */
                const uint32_t ab = DOWN ? (uint32_t)na * (e >= 0 ? 2 : 1) * K * 2 : 0;
                mbar_arrive_expect_tx(&full[s], wb + ab);
                const bf16 *src = e >= 0 ? W + ((int64_t)e * N + r0) * K : w_sh + (int64_t)r0 * K;
                bulk_load_1d(st, src, wb, &full[s], pol);
                if (DOWN) {
                    bf16 *as = reinterpret_cast<bf16 *>(st + L.w_bytes);
                    if (e >= 0) {
#pragma unroll
                        for (int c = 0; c < MB_MAX_N; c++)
                            if (c < na) bulk_load_1d(as + (int64_t)c * 2 * K, sc.h + (int64_t)ids[c] * 2 * K, 2 * K * 2, &full[s]);
                    } else {
                        bulk_load_1d(as, sc.sh_act, ab, &full[s]);
                    }
                }
            }
            __syncwarp();
        }
        return;
    }

    /* consumers */
    if (!DOWN) mbar_wait(xbar, 0);
    const int rbase = warp * RPW;
    for (int j = j0, u = 0; j < j1; j++, u++) {
        const int s = u % L.stages, round = u / L.stages;
        mbar_wait(&full[s], round & 1);
        const mb_meta &m = meta[s];
        const int e = m.e, r0 = m.r0, rows = m.rows, n = m.n;
        const bf16 *wst = reinterpret_cast<const bf16 *>(stage(s));
        const bf16 *as = reinterpret_cast<const bf16 *>(stage(s) + L.w_bytes);
        if (rbase < rows) {
            for (int c0 = 0; c0 < n; c0 += MB_MAX_N) {
                const int nc = min(MB_MAX_N, n - c0);
                int ids[MB_MAX_N];
                const bf16 *src[MB_MAX_N];
#pragma unroll
                for (int c = 0; c < MB_MAX_N; c++) {
                    ids[c] = 0;
                    src[c] = as;
                    if (c >= nc) continue;
                    const bool kept = c0 + c < keep; /* in shared memory: the first `keep` */
                    ids[c] = e < 0 ? c0 + c : kept ? m.ids[c] : sc.sorted[m.a0 + c0 + c];
                    if (!DOWN) src[c] = xs + (int64_t)(ids[c] / k) * K;
                    else if (e < 0) src[c] = as + (int64_t)c * K; /* sh_act rows (T ≤ MB_MAX_N) */
                    else src[c] = kept ? as + (int64_t)c * 2 * K : sc.h + (int64_t)ids[c] * 2 * K;
                }
                float acc[RPW][MB_MAX_N];
#pragma unroll
                for (int rr = 0; rr < RPW; rr++)
#pragma unroll
                    for (int c = 0; c < MB_MAX_N; c++) acc[rr][c] = 0.f;
                if (DOWN && e >= 0) mb_dot<RPW, true>(wst, K, rbase, rows, src, nc, K, acc);
                else mb_dot<RPW, false>(wst, K, rbase, rows, src, nc, K, acc);
#pragma unroll
                for (int rr = 0; rr < RPW; rr++)
#pragma unroll
                    for (int c = 0; c < MB_MAX_N; c++)
                        if (c < nc) acc[rr][c] = warp_sum(acc[rr][c]);
                if (lane == 0) {
#pragma unroll
                    for (int rr = 0; rr < RPW; rr++) {
                        if (rbase + rr >= rows) break;
                        const int64_t r = r0 + rbase + rr;
#pragma unroll
                        for (int c = 0; c < MB_MAX_N; c++) {
                            if (c >= nc) break;
                            if (!DOWN) sc.h[(int64_t)ids[c] * N + r] = __float2bfloat16_rn(acc[rr][c]);
                            else if (e >= 0) sc.y[(int64_t)ids[c] * N + r] = acc[rr][c];
                            else sc.ysh[(int64_t)ids[c] * N + r] = acc[rr][c];
                        }
                    }
                }
            }
        }
        __syncwarp();
        if (lane == 0) mbar_arrive(&empty[s]); /* this warp is done with stage s */
    }
}

/* The bulk launch's plan for one pass (K: the weight rows' length; act_rows: the down pass's
 * input rows a stage holds, [2K] bf16 each; x_bytes: the gate_up pass's x): rows a warp (4, 2 or
 * 1, the most whose item fits MB_STAGE_W) and the ring's stages (as many as shared memory takes,
 * at most MB_MAX_STAGES). False: the register-fed kernels serve this shape. */
static bool mb_plan(const ds_cuda_ctx *ctx, int K, uint32_t act_bytes, uint32_t x_bytes, int *rpw, mb_layout *l) {
    int r = 2; /* 4 rows a warp took 147 registers: one block an SM */
    while (r >= 1 && (int64_t)MB_CONSUMERS * r * K * 2 > MB_STAGE_W) r /= 2;
    if (r < 1) return false;
    *rpw = r;
    l->st_off = (uint32_t)((MB_X_OFF + x_bytes + 127) & ~127u);
    l->w_bytes = (uint32_t)(MB_CONSUMERS * r * K * 2);
    l->stage_bytes = (uint32_t)((l->w_bytes + act_bytes + 127) & ~127u);
    /* two blocks an SM: each takes half of what an SM has, less the offsets table */
    const int64_t room = ((int64_t)ctx->smem_optin - 16384) / 2 - l->st_off;
    int64_t st = room > 0 ? room / l->stage_bytes : 0;
    if (st > MB_MAX_STAGES) st = MB_MAX_STAGES;
    if (st < 2) return false;
    l->stages = (int)st;
    l->total = l->st_off + (uint32_t)st * l->stage_bytes;
    return true;
}

template <bool DOWN>
static void mb_launch(ds_cuda_ctx *ctx, int rpw, const mb_layout &l, const bf16 *W, const bf16 *w_sh,
                      const bf16 *x, int N, int K, int T, int k, const moe_scratch &sc) {
    auto kern = rpw == 2 ? moe_bulk_kernel<DOWN, 2> : moe_bulk_kernel<DOWN, 1>;
    /* DS_CUDA_MOE_BULK=2 (tests): one assignment an item kept, the others' inputs from global
     * memory, as an expert with more than MB_MAX_N assignments takes them */
    const int keep = ctx->moe_bulk == 2 ? 1 : MB_MAX_N;
    ds_launch(ctx, kern, 2 * ctx->sm_count, MB_THREADS, l.total, W, w_sh, x, N, K, T, k, sc, l, keep);
}

/* gate_up of a T-token step (2 ≤ T ≤ DS_CUDA_GEMV_MAX_ROWS) by the bulk kernel; false: not
 * launched (shape outside its plan) */
static bool moe_bulk_gate_up(ds_cuda_ctx *ctx, const ds_cuda_moe_args *a, const moe_scratch &sc) {
    const int T = a->T, H = a->H, I = a->I;
    int rpw;
    mb_layout l;
    if (!mb_plan(ctx, H, 0, (uint32_t)T * H * 2, &rpw, &l)) return false;
    mb_launch<false>(ctx, rpw, l, (const bf16 *)a->w_gu, NULL, (const bf16 *)a->x, 2 * I, H, T, a->top_k, sc);
    DS_CU_LAUNCHED2(ctx, "moe_bulk_kernel<gate_up>", T, 2 * I);
    return true;
}

/* down (+ the shared expert's down when w_sh, which needs Is = I) by the bulk kernel */
static bool moe_bulk_down(ds_cuda_ctx *ctx, const ds_cuda_moe_args *a, const moe_scratch &sc, const bf16 *w_sh) {
    const int T = a->T, H = a->H, I = a->I;
    if (w_sh && a->Is != I) return false;
    int rpw;
    mb_layout l;
    if (!mb_plan(ctx, I, (uint32_t)MB_MAX_N * 2 * I * 2, 0, &rpw, &l)) return false;
    mb_launch<true>(ctx, rpw, l, (const bf16 *)a->w_down, w_sh, NULL, H, I, T, a->top_k, sc);
    DS_CU_LAUNCHED2(ctx, w_sh ? "moe_bulk_kernel<down+shared>" : "moe_bulk_kernel<down>", T, H);
    return true;
}

/* the four instances' shared-memory limit: all the device allows (set once, ds_cuda_moe_init) */
static void moe_bulk_init(ds_cuda_ctx *ctx) {
    const int bytes = (int)ctx->smem_optin - 8192; /* less the static offsets table */
    DS_CU(ctx, cudaFuncSetAttribute(moe_bulk_kernel<false, 1>, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
    DS_CU(ctx, cudaFuncSetAttribute(moe_bulk_kernel<false, 2>, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
    DS_CU(ctx, cudaFuncSetAttribute(moe_bulk_kernel<true, 1>, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
    DS_CU(ctx, cudaFuncSetAttribute(moe_bulk_kernel<true, 2>, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
}

#endif
