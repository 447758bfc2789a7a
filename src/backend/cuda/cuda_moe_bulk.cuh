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
    int ag;             /* the down pass: which of the block's input sets the item reads */
    int ids[MB_MAX_N];  /* the first MB_MAX_N of them */
};

/* dynamic shared memory: barriers [full | empty | x], metadata, x (gate_up), the stages */
#define MB_META_OFF 128
#define MB_X_OFF (((MB_META_OFF + MB_MAX_STAGES * (int)sizeof(mb_meta)) + 127) & ~127)
struct mb_layout {
    int stages;
    uint32_t st_off;      /* first stage */
    uint32_t w_bytes;     /* an item's weights: RI rows of K = a stage */
    uint32_t a_off;       /* the down pass: the current expert's input rows [MB_MAX_N][2I] bf16 */
    uint32_t f_off;       /* and their SiLU(g)·u [MB_MAX_N][I] fp32 */
    uint32_t total;
};

/* acc[rr][c] (c < nc) += rows rbase + rr (< rows) of the stage's weights wst [rows][K] against
 * input c: for c < nf fp32 rows src[c] [K] (shared memory), else bf16 rows src[c] [K] (SILU:
 * SiLU(src[c][k]) · src[c][I + k], XSiluMul's values) */
template <int RPW, bool SILU>
static __device__ __forceinline__ void mb_dot(const bf16 *wst, int K, int rbase, int rows,
                                              const void *const src[MB_MAX_N], int nf, int nc, int I,
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
            if (c < nf) {
                const float4 *p = reinterpret_cast<const float4 *>(static_cast<const float *>(src[c]) + kb);
                const float4 a = p[0], b = p[1];
                xf[0] = a.x, xf[1] = a.y, xf[2] = a.z, xf[3] = a.w, xf[4] = b.x, xf[5] = b.y, xf[6] = b.z, xf[7] = b.w;
            } else {
                const bf16 *p = static_cast<const bf16 *>(src[c]) + kb;
                unpack8(*reinterpret_cast<const uint4 *>(p), xf);
                if (SILU) {
                    float u[8];
                    unpack8(*reinterpret_cast<const uint4 *>(p + I), u);
#pragma unroll
                    for (int i = 0; i < 8; i++) xf[i] = silu_f(xf[i]) * u[i];
                }
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

static __device__ __forceinline__ void mb_consumer_barrier() {
    asm volatile("bar.sync 1, %0;" ::"n"(MB_CONSUMERS * 32) : "memory");
}

/* DOWN false: h[a, r] = W_e[r] · x[a / k] for r < N = 2I, K = H. DOWN true: y[a, r] = W_e[r] ·
 * SiLU(g_a) u_a for r < N = H, K = I, and with w_sh ysh[t, r] = W_sh[r] · sh_act[t] (Is = I).
 * The down pass's inputs: when the block's items move to another expert (an input set, ag), the
 * producer copies that expert's gate_up rows (the shared expert's sh_act rows) into one buffer
 * and the consumers turn them into SiLU(g)·u (the shared expert: the bf16 values) in fp32 once,
 * between two consumer barriers, for every item of the set: per warp and item the SiLU took
 * eight times the instructions (the down launch 109 vs 50 µs a layer, s28-run4). */
template <bool DOWN, int RPW>
__global__ void __maxnreg__(112) /* two blocks an SM (minBlocks 2 capped it at 96: spills) */
    moe_bulk_kernel(const bf16 *__restrict__ W, const bf16 *__restrict__ w_sh, const bf16 *__restrict__ x,
                    int N, int K, int T, int k, moe_scratch sc, mb_layout L, int keep) {
    extern __shared__ __align__(128) unsigned char mb_smem[];
    constexpr int RI = MB_CONSUMERS * RPW;
    uint64_t *full = reinterpret_cast<uint64_t *>(mb_smem);
    uint64_t *empty = full + MB_MAX_STAGES;
    uint64_t *xbar = empty + MB_MAX_STAGES; /* gate_up: x landed; down: an input set landed */
    uint64_t *aempty = xbar + 1;            /* down: the input buffer is free again */
    mb_meta *meta = reinterpret_cast<mb_meta *>(mb_smem + MB_META_OFF);
    bf16 *xs = reinterpret_cast<bf16 *>(mb_smem + MB_X_OFF);      /* gate_up: x [T, K] */
    bf16 *as = reinterpret_cast<bf16 *>(mb_smem + L.a_off);       /* down: [MB_MAX_N][2K] bf16 */
    float *af = reinterpret_cast<float *>(mb_smem + L.f_off);     /* down: [MB_MAX_N][K] fp32 */
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    if (threadIdx.x == 0) {
        for (int s = 0; s < L.stages; s++) {
            mbar_init(&full[s], 1);
            mbar_init(&empty[s], MB_CONSUMERS);
        }
        mbar_init(xbar, 1);
        mbar_init(aempty, 1);
        mbar_init_fence();
    }
    __shared__ int offs[MOE_MAX_E + 1]; /* the groups' offsets: assignments before expert i */
    pdl_enter(); /* cuda_launch.cuh: before any global access */
    const int n_act = *sc.n_act;
    for (int i = threadIdx.x; i <= n_act; i += blockDim.x) offs[i] = sc.off[i];
    __syncthreads(); /* also publishes the barriers' initialisation */
    const int ipe = (N + RI - 1) / RI; /* items an expert */
    const int n_exp = n_act + (DOWN && w_sh ? 1 : 0); /* the shared expert last, T inputs */
    const int total = n_exp * ipe;
    /* The blocks' item ranges by cost, an item costing 1 + its input rows (its bytes and its
     * sums): the shared expert's items (T inputs each) on one block's range took it ~4× as long
     * as the others (ncu s28-run3, SM active 52 % of the down launch). cost(i) = the cost of
     * every item of the experts before i. */
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
    auto stage = [&](int s) { return mb_smem + L.st_off + (size_t)s * L.w_bytes; };

    if (warp == MB_CONSUMERS) { /* producer */
        const uint64_t pol = l2_policy_evict_first();
        if (!DOWN && lane == 0) {
            mbar_arrive_expect_tx(xbar, (uint32_t)T * K * 2);
            bulk_load_1d(xs, x, (uint32_t)T * K * 2, xbar);
        }
        int cur = -1, e = -1, n = 0, a0 = 0, id = 0, ag = -1;
        for (int j = j0, u = 0; j < j1; j++, u++) {
            const int s = u % L.stages, round = u / L.stages;
            const int i = j / ipe, y = j - i * ipe;
            if (i != cur) { /* the items of a block's range change expert rarely */
                cur = i;
                if (i < n_act) {
                    e = sc.act[i];
                    a0 = offs[i];
                    n = offs[i + 1] - a0;
                    id = lane < n && lane < MB_MAX_N ? sc.sorted[a0 + lane] : 0;
                } else {
                    e = -1, a0 = 0, n = T, id = lane;
                }
                if (DOWN) { /* this expert's inputs, once the consumers are done with the last set's */
                    ag++;
                    if (ag > 0) mbar_wait(aempty, (ag - 1) & 1);
                    const int na = e >= 0 ? min(n, keep) : n;
                    if (lane == 0) mbar_arrive_expect_tx(xbar, (uint32_t)na * (e >= 0 ? 2 : 1) * K * 2);
                    __syncwarp();
                    if (lane < na) {
                        if (e >= 0) bulk_load_1d(as + (int64_t)lane * 2 * K, sc.h + (int64_t)id * 2 * K, 2 * K * 2, xbar);
                        else bulk_load_1d(as + (int64_t)lane * 2 * K, sc.sh_act + (int64_t)lane * K, K * 2, xbar);
                    }
                }
            }
            if (round > 0) mbar_wait(&empty[s], (round - 1) & 1);
            mb_meta &m = meta[s];
            const int r0 = y * RI, rows = min(RI, N - r0);
            int ids[MB_MAX_N]; /* lane 0 writes the whole record: its arrival releases it */
#pragma unroll
            for (int c = 0; c < MB_MAX_N; c++) ids[c] = __shfl_sync(0xffffffffu, id, c);
            if (lane == 0) {
                m.e = e, m.r0 = r0, m.rows = rows, m.n = n, m.a0 = a0, m.ag = ag;
#pragma unroll
                for (int c = 0; c < MB_MAX_N; c++) m.ids[c] = ids[c];
                const uint32_t wb = (uint32_t)rows * K * 2; /* ≤ L.w_bytes */
                mbar_arrive_expect_tx(&full[s], wb);
                const bf16 *src = e >= 0 ? W + ((int64_t)e * N + r0) * K : w_sh + (int64_t)r0 * K;
                bulk_load_1d(stage(s), src, wb, &full[s], pol);
            }
            __syncwarp();
        }
        return;
    }

    /* consumers */
    if (!DOWN) mbar_wait(xbar, 0);
    const int rbase = warp * RPW;
    int ag = -1;
    for (int j = j0, u = 0; j < j1; j++, u++) {
        const int s = u % L.stages, round = u / L.stages;
        mbar_wait(&full[s], round & 1);
        const mb_meta &m = meta[s];
        const int e = m.e, r0 = m.r0, rows = m.rows, n = m.n;
        const int nk = e >= 0 ? min(n, keep) : n; /* inputs in shared memory */
        if (DOWN && m.ag != ag) { /* a new input set: SiLU(g)·u in fp32, once */
            ag = m.ag;
            mb_consumer_barrier(); /* every warp is done with the last set's af */
            mbar_wait(xbar, ag & 1);
            const int cpr = K / 8; /* 8-element chunks a row */
            for (int q = threadIdx.x; q < nk * cpr; q += MB_CONSUMERS * 32) {
                const int c = q / cpr, kb = (q - c * cpr) * 8;
                float f[8];
                unpack8(*reinterpret_cast<const uint4 *>(as + (int64_t)c * 2 * K + kb), f);
                if (e >= 0) { /* XSiluMul's values */
                    float uu[8];
                    unpack8(*reinterpret_cast<const uint4 *>(as + (int64_t)c * 2 * K + K + kb), uu);
#pragma unroll
                    for (int i = 0; i < 8; i++) f[i] = silu_f(f[i]) * uu[i];
                }
                float4 *dst = reinterpret_cast<float4 *>(af + (int64_t)c * K + kb);
                dst[0] = make_float4(f[0], f[1], f[2], f[3]);
                dst[1] = make_float4(f[4], f[5], f[6], f[7]);
            }
            mb_consumer_barrier(); /* af written; as may be refilled */
            if (threadIdx.x == 0) mbar_arrive(aempty);
        }
        const bf16 *wst = reinterpret_cast<const bf16 *>(stage(s));
        if (rbase < rows) {
            for (int c0 = 0; c0 < n; c0 += MB_MAX_N) {
                const int nc = min(MB_MAX_N, n - c0);
                const int nf = DOWN ? max(0, min(nc, nk - c0)) : 0; /* fp32 inputs first */
                int ids[MB_MAX_N];
                const void *src[MB_MAX_N];
#pragma unroll
                for (int c = 0; c < MB_MAX_N; c++) {
                    ids[c] = 0;
                    src[c] = af;
                    if (c >= nc) continue;
                    const bool kept = c0 + c < nk; /* in shared memory */
                    ids[c] = e < 0 ? c0 + c : kept ? m.ids[c] : sc.sorted[m.a0 + c0 + c];
                    if (!DOWN) src[c] = xs + (int64_t)(ids[c] / k) * K;
                    else src[c] = kept ? static_cast<const void *>(af + (int64_t)(c0 + c) * K)
                                       : static_cast<const void *>(sc.h + (int64_t)ids[c] * 2 * K);
                }
                float acc[RPW][MB_MAX_N];
#pragma unroll
                for (int rr = 0; rr < RPW; rr++)
#pragma unroll
                    for (int c = 0; c < MB_MAX_N; c++) acc[rr][c] = 0.f;
                mb_dot<RPW, DOWN>(wst, K, rbase, rows, src, nf, nc, K, acc);
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

/* The bulk launch's plan for one pass (K: the weight rows' length; down: the input buffers;
 * x_bytes: the gate_up pass's x): rows a warp (2 or 1, the most whose item fits MB_STAGE_W; 4
 * took 147 registers, one block an SM) and the ring's stages (as many as half an SM's shared
 * memory takes: two blocks an SM; at most MB_MAX_STAGES). False: the register-fed kernels serve
 * this shape. */
static bool mb_plan(const ds_cuda_ctx *ctx, int K, bool down, uint32_t x_bytes, int *rpw, mb_layout *l) {
    int r = 2;
    while (r >= 1 && (int64_t)MB_CONSUMERS * r * K * 2 > MB_STAGE_W) r /= 2;
    if (r < 1) return false;
    *rpw = r;
    const uint32_t a_bytes = down ? (uint32_t)MB_MAX_N * 2 * K * 2 : 0, f_bytes = a_bytes; /* [8][2K] bf16, [8][K] fp32 */
    l->a_off = (uint32_t)((MB_X_OFF + x_bytes + 127) & ~127u);
    l->f_off = l->a_off + a_bytes;
    l->st_off = (uint32_t)((l->f_off + f_bytes + 127) & ~127u);
    l->w_bytes = (uint32_t)(MB_CONSUMERS * r * K * 2);
    /* two blocks an SM: each takes half of what an SM has, less the offsets table */
    const int64_t room = ((int64_t)ctx->smem_optin - 16384) / 2 - l->st_off;
    int64_t st = room > 0 ? room / l->w_bytes : 0;
    if (st > MB_MAX_STAGES) st = MB_MAX_STAGES;
    if (st < 2) return false;
    l->stages = (int)st;
    l->total = l->st_off + (uint32_t)st * l->w_bytes;
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
    if (!mb_plan(ctx, H, false, (uint32_t)T * H * 2, &rpw, &l)) return false;
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
    if (!mb_plan(ctx, I, true, 0, &rpw, &l)) return false;
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
