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
 *  5. expert down GEMV with SiLU(g)·u computed in its input loader → y [A, H] fp32;
 *     (4 and 5 for steps above DS_CUDA_GEMV_MAX_ROWS tokens: the grouped tensor-core GEMM of
 *     cuda_moe_gemm.cu, which writes SiLU(g)·u [A, I] bf16 into h, then y);
 *  6. shared down GEMV → ysh [T, H] fp32;
 *  7. combine: out[t] = Σ_i w_i·y[t·k + i] + sg[t]·ysh[t], summed in slot order → bf16, over
 *     (H/512, T) blocks with each thread's k loads issued together.
 * Grids are sized from T on the host (min(E, T·k) expert blocks); blocks past the device-side
 * count of active experts exit at once, so the launch shape never depends on routing. */
#include <math.h>

#include "cuda_argmax.cuh"
#include "cuda_gemv.cuh"
#include "cuda_launch.cuh"
#include "cuda_moe_gemm.h"
#include "cuda_norm.cuh"

#define MOE_MAX_E 1024
#define ROUTE_WARPS 4

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
#undef TAKE
    return off;
}

extern "C" size_t ds_cuda_moe_scratch_bytes(int H, int E, int top_k, int I, int Is) {
    return moe_layout(NULL, DS_CUDA_MAX_TOKENS, H, E, top_k, I, Is, NULL);
}

/* ---- 2. route ------------------------------------------------------------------------------ */

/* Lane i < k holds the i-th selection (isel, its probability wsel); wsum is the sum of the k
 * selected probabilities (the same in every lane). Writes sc.ids / sc.wts (to_global; weights
 * renormalised when norm_topk) and ids_s (when not NULL). */
static __device__ __forceinline__ void route_store(int t, int k, int norm_topk, const moe_scratch &sc,
                                                   int32_t *ids_s, bool to_global, int isel,
                                                   float wsel, float wsum) {
    const int lane = threadIdx.x & 31;
    if (lane >= k) return;
    if (to_global) {
        sc.ids[(int64_t)t * k + lane] = isel;
        sc.wts[(int64_t)t * k + lane] = norm_topk ? wsel / wsum : wsel;
    }
    if (ids_s) ids_s[t * k + lane] = isel;
}

/* route_from_shared for E ≤ 256 with each lane's 8 probabilities in registers (ctx->route_regs,
 * DS_CUDA_ROUTE_REGS): the same values in the same order, so the same ids and weights; each
 * argmax round is one butterfly over the lanes' cached local bests, and only the lane that owned
 * the winner rescans its 8 registers (the shared-memory version rescans all of them from shared
 * memory every round: the gate_up launch's other warps wait at a barrier meanwhile, ~19 % of its
 * warp stall samples at batch 1, s10-run7). A round with no candidate left (NaN logits) takes
 * expert 0 rather than an index past E. */
static __device__ __forceinline__ void route_in_registers(int t, int E, int k, int norm_topk, const moe_scratch &sc,
                                          const float *pr, int32_t *ids_s, bool to_global) {
    const int lane = threadIdx.x & 31;
    float v[8];
    float mx = -INFINITY;
#pragma unroll
    for (int j = 0; j < 8; j++) {
        const int e = lane + 32 * j;
        v[j] = e < E ? pr[e] : -INFINITY;
        if (e < E) mx = fmaxf(mx, v[j]);
    }
    mx = warp_max(mx);
    float sum = 0.f;
#pragma unroll
    for (int j = 0; j < 8; j++) {
        if (lane + 32 * j >= E) continue;
        const float p = expf(v[j] - mx);
        v[j] = p;
        sum += p;
    }
    sum = warp_sum(sum);
    const float inv = 1.f / sum;
#pragma unroll
    for (int j = 0; j < 8; j++) v[j] = lane + 32 * j < E ? v[j] * inv : -1.f;
    float lb = -2.f; /* this lane's best untaken entry: the first maximum in ascending e */
    int li = 0x7fffffff;
#pragma unroll
    for (int j = 0; j < 8; j++)
        if (lane + 32 * j < E && v[j] > lb) { lb = v[j]; li = lane + 32 * j; }
    float wsel = 0.f, wsum = 0.f;
    int isel = 0;
    unsigned taken = 0u; /* bit j: entry lane + 32j already selected */
    for (int i = 0; i < k; i++) {
        float bv = lb;
        int bi = li;
        warp_amax(bv, bi);
        if (bi >= E) bi = 0; /* nothing left (NaN): a valid expert */
        if (lane == i) { wsel = bv; isel = bi; }
        wsum += bv;
        if ((bi & 31) == lane) { /* the owner marks the entry taken (a bit, so v stays in
                                   * registers) and rescans its untaken ones */
            taken |= 1u << (bi >> 5);
            lb = -2.f;
            li = 0x7fffffff;
#pragma unroll
            for (int j = 0; j < 8; j++)
                if (!((taken >> j) & 1u) && lane + 32 * j < E && v[j] > lb) { lb = v[j]; li = lane + 32 * j; }
        }
    }
    route_store(t, k, norm_topk, sc, ids_s, to_global, isel, wsel, wsum);
}

/* Routes token t with one warp from its E router logits in shared memory (pr, overwritten):
 * softmax (fp32), top-k by repeated warp argmax (ties → lowest expert id), renormalised
 * weights → sc.ids / sc.wts, and ids_s (may be NULL), a shared copy of the k expert ids. */
static __device__ void route_from_shared(int t, int E, int k, int norm_topk, const moe_scratch &sc,
                                         float *pr, int32_t *ids_s, bool to_global = true,
                                         bool regs = false) {
    if (regs && E <= 256) {
        route_in_registers(t, E, k, norm_topk, sc, pr, ids_s, to_global);
        return;
    }
    const int lane = threadIdx.x & 31;
    float mx = -INFINITY;
    for (int e = lane; e < E; e += 32) mx = fmaxf(mx, pr[e]);
    mx = warp_max(mx);
    float sum = 0.f;
    for (int e = lane; e < E; e += 32) {
        const float p = expf(pr[e] - mx);
        pr[e] = p;
        sum += p;
    }
    sum = warp_sum(sum);
    const float inv = 1.f / sum;
    for (int e = lane; e < E; e += 32) pr[e] *= inv;
    __syncwarp();
    /* top-k by repeated warp argmax; taken entries are set to -1 (probabilities are ≥ 0) */
    float wsel = 0.f, wsum = 0.f;
    int isel = 0;
    for (int i = 0; i < k; i++) {
        float bv = -2.f;
        int bi = 0x7fffffff;
        for (int e = lane; e < E; e += 32) {
            const float v = pr[e];
            if (v > bv) { bv = v; bi = e; } /* e ascending per lane: first max kept */
        }
        warp_amax(bv, bi);
        if (bi >= E) bi = 0; /* nothing left (NaN logits): a valid expert, no write past E */
        if (lane == i) { wsel = bv; isel = bi; }
        wsum += bv;
        __syncwarp();
        if (lane == 0) pr[bi] = -1.f;
        __syncwarp();
    }
    route_store(t, k, norm_topk, sc, ids_s, to_global, isel, wsel, wsum);
}

/* Token t with one warp: its router logits from global memory into pr, routed; the shared
 * expert's SiLU(g)·u and sigmoid gate. */
static __device__ void route_token(int t, int E, int k, int Is, int norm_topk, const moe_scratch &sc,
                                   float *pr, int32_t *ids_s) {
    const int lane = threadIdx.x & 31;
    const float *Lr = sc.L + (int64_t)t * moe_ldl(E, Is);
    for (int e = lane; e < E; e += 32) pr[e] = Lr[e];
    __syncwarp();
    route_from_shared(t, E, k, norm_topk, sc, pr, ids_s);
    if (Is > 0) {
        for (int i = lane; i < Is; i += 32)
            sc.sh_act[(int64_t)t * Is + i] = __float2bfloat16_rn(silu_f(Lr[E + i]) * Lr[E + Is + i]);
        if (lane == 0) sc.sg[t] = sigmoid_f(Lr[E + 2 * Is]);
    }
}

__global__ void __launch_bounds__(ROUTE_WARPS * 32)
    moe_route_kernel(int T, int E, int k, int Is, int norm_topk, moe_scratch sc) {
    __shared__ float prob[ROUTE_WARPS][MOE_MAX_E];
    pdl_enter(); /* cuda_launch.cuh: before any access */
    const int warp = threadIdx.x >> 5;
    const int t = blockIdx.x * ROUTE_WARPS + warp;
    if (t >= T) return;
    route_token(t, E, k, Is, norm_topk, sc, prob[warp], NULL);
}

/* ---- 3. group assignments by expert (one block) ------------------------------------------ */

/* exclusive scan of one value per thread over the block (blockDim.x ≤ 1024); returns the total */
static __device__ int block_excl_scan(int v, int *excl, int *wsum) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    int x = v;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        const int y = __shfl_up_sync(0xffffffffu, x, o);
        if (lane >= o) x += y;
    }
    __syncthreads();
    if (lane == 31) wsum[warp] = x;
    __syncthreads();
    if (warp == 0) {
        int w = lane < nw ? wsum[lane] : 0;
#pragma unroll
        for (int o = 1; o < 32; o <<= 1) {
            const int y = __shfl_up_sync(0xffffffffu, w, o);
            if (lane >= o) w += y;
        }
        if (lane < nw) wsum[lane] = w; /* inclusive warp totals */
    }
    __syncthreads();
    *excl = x - v + (warp > 0 ? wsum[warp - 1] : 0);
    return wsum[nw - 1];
}

/* Groups the A assignments (expert ids in shared memory) by expert, stable: counts per expert
 * (integer shared atomics), exclusive scans for the offsets and the active-expert ranks, then
 * one warp places the assignments in ascending order from shared memory.
 * One thread per expert (E ≤ blockDim.x = 1024). */
/* L2 prefetch, right after routing, of the gate_up weights of the experts a step selected:
 * expert e's [2I, H] matrix starts at base + e·bytes_per_expert; each active expert gets an
 * equal share of the prefetch budget (catalogue item 11, DS_OPT_PREFETCH). */
typedef struct moe_prefetch {
    const bf16 *base; /* NULL: no prefetch */
    int64_t bytes_per_expert;
} moe_prefetch;

/* Where grouping writes: the scratch (global) or a block's shared copy. */
typedef struct moe_groups_out {
    int32_t *n_act, *act, *off, *sorted;
} moe_groups_out;

static __device__ moe_groups_out groups_of(const moe_scratch &sc) {
    return moe_groups_out{sc.n_act, sc.act, sc.off, sc.sorted};
}

/* Counts the assignments of each expert and writes the active experts, their offsets and their
 * number; returns with cnt[e] = expert e's first place in sc.sorted (not yet synchronized) and,
 * when count is not NULL, *count = its count (for the calling thread's expert e = threadIdx.x). */
static __device__ int group_offsets(int A, int E, const int32_t *ids_s, int *cnt, int *wsum,
                                    const moe_groups_out sc, int *count) {
    const int e = threadIdx.x;
    if (e < E) cnt[e] = 0;
    __syncthreads();
    for (int a = threadIdx.x; a < A; a += blockDim.x) atomicAdd(&cnt[ids_s[a]], 1); /* integer */
    __syncthreads();
    const int c = e < E ? cnt[e] : 0;
    int start, rank;
    block_excl_scan(c, &start, wsum);
    const int nact = block_excl_scan(c > 0 ? 1 : 0, &rank, wsum);
    if (c > 0) {
        sc.act[rank] = e;
        sc.off[rank] = start;
    }
    if (e < E) cnt[e] = start; /* from here: expert e's next free place in sc.sorted */
    if (threadIdx.x == 0) {
        *sc.n_act = nact;
        sc.off[nact] = A;
    }
    if (count) *count = c;
    return nact;
}

/* Stable placement of assignments [a0, a1) by one warp, 32 at a time in ascending order:
 * lanes with the same expert (match_any) take consecutive places in lane order, then the lowest
 * of them advances the expert's cursor cur[e]. (One thread per expert scanning all A ids cost
 * 236 µs per layer at A = 4096.) */
static __device__ void place_by_warp(int a0, int a1, const int32_t *ids_s, int *cur, int32_t *sorted) {
    const int lane = threadIdx.x & 31;
    const unsigned lt = (1u << lane) - 1u;
    for (int b0 = a0; b0 < a1; b0 += 32) {
        const int a = b0 + lane;
        const int ex = a < a1 ? ids_s[a] : -1 - lane; /* padding lanes match nobody */
        const unsigned peers = __match_any_sync(0xffffffffu, ex);
        const int rk = __popc(peers & lt);
        if (a < a1) sorted[cur[ex] + rk] = a;
        __syncwarp();
        if (a < a1 && rk == 0) cur[ex] += __popc(peers);
        __syncwarp();
    }
}

static __device__ void group_from_shared(int A, int E, const int32_t *ids_s, int *cnt, int *wsum,
                                         const moe_groups_out sc, moe_prefetch pf) {
    const int e = threadIdx.x;
    int c;
    const int nact = group_offsets(A, E, ids_s, cnt, wsum, sc, &c);
    __syncthreads();
    if (threadIdx.x < 32) place_by_warp(0, A, ids_s, cnt, sc.sorted);
    if (pf.base && c > 0) {
        int64_t share = (int64_t)(DS_CUDA_PREFETCH_BUDGET / (unsigned)nact) & ~(int64_t)15;
        if (share > pf.bytes_per_expert) share = pf.bytes_per_expert;
        prefetch_l2_range(pf.base + (int64_t)e * (pf.bytes_per_expert / 2), (uint64_t)share);
    }
}

/* Large steps (prefill): the route kernel wrote sc.ids; stage them in dynamic shared memory.
 * PW warps place the assignments, warp w the w-th of PW equal slices, each from its own cursors
 * (cw[w][e] = expert e's offset + its assignments in earlier slices): the same order as one warp
 * placing all A (session 4's kernel, 66 µs a layer at A = 8192 by ncu in s9-run4). */
__global__ void __launch_bounds__(1024) moe_group_kernel(int A, int E, int PW, moe_scratch sc) {
    extern __shared__ int32_t ids_dyn[]; /* [A] ids, then [PW][E] cursors */
    __shared__ int cnt[MOE_MAX_E];
    __shared__ int wsum[32];
    pdl_enter(); /* cuda_launch.cuh: before any access */
    int *cw = ids_dyn + A;
    for (int a = threadIdx.x; a < A; a += blockDim.x) ids_dyn[a] = sc.ids[a];
    for (int i = threadIdx.x; i < PW * E; i += blockDim.x) cw[i] = 0;
    __syncthreads();
    const moe_groups_out out = groups_of(sc);
    group_offsets(A, E, ids_dyn, cnt, wsum, out, NULL);
    const int warp = threadIdx.x >> 5, slice = DS_DIV_UP(A, PW);
    const int a0 = min(A, warp * slice), a1 = min(A, a0 + slice);
    if (warp < PW)
        for (int a = a0 + (threadIdx.x & 31); a < a1; a += 32) atomicAdd(&cw[warp * E + ids_dyn[a]], 1);
    __syncthreads();
    if (threadIdx.x < E) { /* counts of the slices → each slice's first place for expert e */
        int run = cnt[threadIdx.x];
        for (int w = 0; w < PW; w++) {
            const int n = cw[w * E + threadIdx.x];
            cw[w * E + threadIdx.x] = run;
            run += n;
        }
    }
    __syncthreads();
    if (warp < PW) place_by_warp(a0, a1, ids_dyn, cw + warp * E, out.sorted);
}

/* Small steps (decode, T·k ≤ MOE_FUSED_A): routing and grouping in one launch. Warps
 * 0..ROUTE_WARPS-1 route the tokens, then the whole block groups from shared memory. */
#define MOE_FUSED_A 1024
__global__ void __launch_bounds__(1024)
    moe_route_group_kernel(int T, int E, int k, int Is, int norm_topk, moe_scratch sc,
                           moe_prefetch pf) {
    __shared__ float prob[ROUTE_WARPS][MOE_MAX_E];
    __shared__ int32_t ids_s[MOE_FUSED_A];
    __shared__ int cnt[MOE_MAX_E];
    __shared__ int wsum[32];
    pdl_enter(); /* cuda_launch.cuh: before any access */
    const int warp = threadIdx.x >> 5;
    if (warp < ROUTE_WARPS)
        for (int t = warp; t < T; t += ROUTE_WARPS) route_token(t, E, k, Is, norm_topk, sc, prob[warp], ids_s);
    __syncthreads();
    group_from_shared(T * k, E, ids_s, cnt, wsum, groups_of(sc), pf);
}

/* Decode steps with T·E ≤ ROUTE_FAST_LOGITS: the same routing as moe_route_group_kernel (same
 * arithmetic, same results), with the latency taken out. The slow kernel's routing warps walk
 * the router logits and the shared expert's 2·Is gate/up values with one dependent L2 round
 * trip per loop iteration (~17 µs per layer at Qwen3.5-35B-A3B); here all 1024 threads first
 * stage the T·E logits in shared memory and compute the shared expert's activations with
 * independent loads, then one warp per token routes from shared memory. */
#define ROUTE_FAST_LOGITS 4096
__global__ void __launch_bounds__(1024)
    moe_route_group_fast_kernel(int T, int E, int k, int Is, int norm_topk, moe_scratch sc,
                                moe_prefetch pf, int batched, int regs) {
    __shared__ float lg[ROUTE_FAST_LOGITS]; /* [T, E] router logits, then probabilities */
    __shared__ int32_t ids_s[MOE_FUSED_A];
    __shared__ int cnt[MOE_MAX_E];
    __shared__ int wsum[32];
    pdl_enter(); /* cuda_launch.cuh: before any access */
    const int64_t NL = moe_ldl(E, Is); /* row pitch of L */
    for (int i = threadIdx.x; i < T * E; i += blockDim.x) {
        const int t = i / E;
        lg[i] = sc.L[(int64_t)t * NL + (i - t * E)];
    }
    if (Is > 0) {
        if (batched) {
            /* SH_BATCH elements per thread, every load issued before the first store: the
             * compiler cannot move a load of sc.L past a store to sc.sh_act (both global), so
             * the plain loop paid one L2 round trip per element (4 at batch 8). Same values. */
            constexpr int SH_BATCH = 4;
            const int n = T * Is, stride = blockDim.x;
            for (int i0 = threadIdx.x; i0 < n; i0 += SH_BATCH * stride) {
                float g[SH_BATCH], u[SH_BATCH];
#pragma unroll
                for (int q = 0; q < SH_BATCH; q++) {
                    const int i = i0 + q * stride;
                    if (i < n) {
                        const int t = i / Is, j = i - t * Is;
                        const float *Lr = sc.L + (int64_t)t * NL + E;
                        g[q] = Lr[j];
                        u[q] = Lr[Is + j];
                    }
                }
#pragma unroll
                for (int q = 0; q < SH_BATCH; q++) {
                    const int i = i0 + q * stride;
                    if (i < n) sc.sh_act[i] = __float2bfloat16_rn(silu_f(g[q]) * u[q]);
                }
            }
        } else {
            for (int i = threadIdx.x; i < T * Is; i += blockDim.x) {
                const int t = i / Is, j = i - t * Is;
                const float *Lr = sc.L + (int64_t)t * NL + E;
                sc.sh_act[(int64_t)t * Is + j] = __float2bfloat16_rn(silu_f(Lr[j]) * Lr[Is + j]);
            }
        }
        if (threadIdx.x < T) sc.sg[threadIdx.x] = sigmoid_f(sc.L[(int64_t)threadIdx.x * NL + E + 2 * Is]);
    }
    __syncthreads();
    const int warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    for (int t = warp; t < T; t += nw) route_from_shared(t, E, k, norm_topk, sc, lg + t * E, ids_s, true, regs);
    __syncthreads();
    group_from_shared(T * k, E, ids_s, cnt, wsum, groups_of(sc), pf);
}

/* ---- 4/5. grouped expert GEMV --------------------------------------------------------------- */

#define MOE_WARPS 8

template <bool DOWN, int ROWS, int UNROLL, int R, bool STREAM>
static __device__ __forceinline__ void moe_chunk(const bf16 *W, int64_t N, int64_t K, int64_t n0,
                                                 const int32_t *rows, int k, int H, int I,
                                                 const bf16 *x, const moe_scratch &sc) {
    const int lane = threadIdx.x & 31;
    float acc[ROWS][R];
#pragma unroll
    for (int rr = 0; rr < ROWS; rr++)
#pragma unroll
        for (int r = 0; r < R; r++) acc[rr][r] = 0.f;
    if (DOWN) {
        XSiluMul<R> xs;
        xs.I = I;
#pragma unroll
        for (int r = 0; r < R; r++) xs.base[r] = sc.h + (int64_t)rows[r] * 2 * I;
        gemv_warp_partial<R, ROWS, UNROLL, STREAM>(W, K, n0, N, xs, 0, K, acc);
    } else {
        XRows<R> xs;
#pragma unroll
        for (int r = 0; r < R; r++) xs.base[r] = x + (int64_t)(rows[r] / k) * H;
        gemv_warp_partial<R, ROWS, UNROLL, STREAM>(W, K, n0, N, xs, 0, K, acc);
    }
    gemv_warp_reduce<R, ROWS>(acc);
    if (lane == 0) {
#pragma unroll
        for (int rr = 0; rr < ROWS; rr++) {
            if (n0 + rr >= N) continue;
#pragma unroll
            for (int r = 0; r < R; r++) {
                if (DOWN) sc.y[(int64_t)rows[r] * H + n0 + rr] = acc[rr][r];
                else sc.h[(int64_t)rows[r] * 2 * I + n0 + rr] = __float2bfloat16_rn(acc[rr][r]);
            }
        }
    }
}

/* The shared expert's down projection for tokens [t0, t0 + R): ysh[t] = W_sh · sh_act[t]. */
template <int ROWS, int UNROLL, int R>
static __device__ __forceinline__ void shared_down_chunk(const bf16 *W, int64_t N, int64_t K,
                                                         int64_t n0, int t0, const moe_scratch &sc) {
    const int lane = threadIdx.x & 31;
    float acc[ROWS][R];
#pragma unroll
    for (int rr = 0; rr < ROWS; rr++)
#pragma unroll
        for (int r = 0; r < R; r++) acc[rr][r] = 0.f;
    XRows<R> xs;
#pragma unroll
    for (int r = 0; r < R; r++) xs.base[r] = sc.sh_act + (int64_t)(t0 + r) * K;
    gemv_warp_partial<R, ROWS, UNROLL, true>(W, K, n0, N, xs, 0, K, acc);
    gemv_warp_reduce<R, ROWS>(acc);
    if (lane == 0) {
#pragma unroll
        for (int rr = 0; rr < ROWS; rr++) {
            if (n0 + rr >= N) continue;
#pragma unroll
            for (int r = 0; r < R; r++) sc.ysh[(int64_t)(t0 + r) * N + n0 + rr] = acc[rr][r];
        }
    }
}

template <int N> struct IntC { static constexpr int value = N; };

/* Walks rows [0, n) in chunks of 8, 4, 2, 1 (largest first, none larger than RMAX), calling
 * f(IntC<R>(), first row) per chunk. RMAX bounds the chunk kernels compiled into a launch: a
 * kernel carrying the 8-row path needs ~3× the registers of the 1-row one, which caps its
 * occupancy even when every chunk is a single row (decode at batch 1). */
template <int RMAX, class F>
static __device__ __forceinline__ void for_chunks(int n, F &&f) {
    for (int c = 0; c < n;) {
        const int left = n - c;
        if constexpr (RMAX >= 8) {
            if (left >= 8) { f(IntC<8>(), c); c += 8; continue; }
        }
        if constexpr (RMAX >= 4) {
            if (left >= 4) { f(IntC<4>(), c); c += 4; continue; }
        }
        if constexpr (RMAX >= 2) {
            if (left >= 2) { f(IntC<2>(), c); c += 2; continue; }
        }
        f(IntC<1>(), c);
        c += 1;
    }
}

/* A block of the down launches' last column: the shared expert's rows n0.. of block row
 * blockIdx.y for all T tokens; its weights do not depend on routing, so with pf_w they are
 * prefetched while waiting. */
template <int ROWS, int UNROLL, int RMAX>
static __device__ __forceinline__ void shared_down_column(const bf16 *__restrict__ w_sh, int H, int Is,
                                                          int T, const moe_scratch &sc,
                                                          const bf16 *__restrict__ pf_w) {
    const int64_t n0 = ((int64_t)blockIdx.y * MOE_WARPS + (threadIdx.x >> 5)) * ROWS;
    if (pf_w && (threadIdx.x & 31) == 0 && n0 < H)
        prefetch_l2(w_sh + n0 * Is, (uint32_t)((H - n0 < ROWS ? H - n0 : ROWS) * Is * 2));
    pdl_enter(); /* cuda_launch.cuh */
    if (n0 >= H) return;
    for_chunks<RMAX>(T, [&](auto r, int t) {
        shared_down_chunk<ROWS, UNROLL, decltype(r)::value>(w_sh, H, Is, n0, t, sc);
    });
}

/* Blocks (active expert i, 16·ROWS output rows). With w_sh (down only, catalogue item 1 fused:
 * the shared expert runs concurrently with the routed ones, in the same launch), the last
 * column of blocks (blockIdx.x == gridDim.x - 1) computes the shared expert's down projection
 * for all T tokens instead. pf_w (DS_OPT_PREFETCH; NULL when off): in the gate_up launch the
 * routed experts' down weights, each block prefetching its slice of its expert's matrix for the
 * launch that follows; in the down launch the shared expert's down weights, prefetched before
 * the dependency wait. */
template <bool DOWN, int ROWS, int UNROLL, int RMAX>
__global__ void __launch_bounds__(MOE_WARPS * 32)
    moe_expert_kernel(const bf16 *__restrict__ Wall, int H, int I, int k,
                      const bf16 *__restrict__ x, moe_scratch sc, const bf16 *__restrict__ w_sh,
                      int Is, int T, const bf16 *__restrict__ pf_w) {
    const int i = blockIdx.x;
    if (DOWN && w_sh && i == (int)gridDim.x - 1) {
        shared_down_column<ROWS, UNROLL, RMAX>(w_sh, H, Is, T, sc, pf_w);
        return;
    }
    pdl_enter(); /* cuda_launch.cuh: before any access */
    if (i >= *sc.n_act) return;
    const int e = sc.act[i];
    const int a0 = sc.off[i], a1 = sc.off[i + 1];
    const int64_t N = DOWN ? H : 2 * (int64_t)I;
    const int64_t K = DOWN ? I : H;
    const bf16 *W = Wall + (int64_t)e * N * K;
    const int warp = threadIdx.x >> 5;
    const int64_t n0 = ((int64_t)blockIdx.y * MOE_WARPS + warp) * ROWS;
    if (!DOWN && pf_w && threadIdx.x == 0) {
        /* gate_up block (i, y) prefetches slice y of the same expert's down matrix [H, I] for
         * the launch that follows (catalogue item 11) */
        const int64_t rows = DS_DIV_UP((int64_t)H, (int64_t)gridDim.y);
        const int64_t r0 = (int64_t)blockIdx.y * rows;
        /* all active experts' slices together stay within the prefetch budget */
        const int64_t cap = (int64_t)DS_CUDA_PREFETCH_BUDGET / ((int64_t)*sc.n_act * gridDim.y);
        if (r0 < H) {
            const int64_t nr = H - r0 < rows ? H - r0 : rows;
            const int64_t bytes = nr * I * 2 < cap ? nr * I * 2 : cap;
            prefetch_l2_range(pf_w + ((int64_t)e * H + r0) * I, (uint64_t)(bytes & ~(int64_t)15));
        }
    }
    if (n0 >= N) return;
    const bool stream = (a1 - a0) <= 8; /* weights re-read for more rows: keep them in L1 */
    for_chunks<RMAX>(a1 - a0, [&](auto r, int c) {
        constexpr int R = decltype(r)::value;
        const int32_t *rows = sc.sorted + a0 + c;
        if (R == 8 && !stream) moe_chunk<DOWN, ROWS, UNROLL, R, false>(W, N, K, n0, rows, k, H, I, x, sc);
        else moe_chunk<DOWN, ROWS, UNROLL, R, true>(W, N, K, n0, rows, k, H, I, x, sc);
    });
}

/* The down launch of decode steps of 2+ tokens with the experts' inputs staged
 * (ctx->moe_down_staged, DS_CUDA_MOE_DOWN_STAGED): the block of expert i first computes
 * SiLU(g)·u of its n ≤ T assignments once into shared memory (fp32, exactly the values
 * XSiluMul computes per warp), then its warps stream their rows against it; each warp's first
 * batch of weights is loaded before the staging, so the block's dependent loads (groups,
 * gate_up rows) overlap it. The per-warp loader held both halves of every gate_up row and the
 * SiLU in registers: moe_expert_kernel<down, 16 rows> needed 240 registers, one block per SM,
 * DRAM at 55 % (ncu, s7-run1, batch 8). Same chunks, same order: bit-identical to moe_expert_kernel. Dynamic
 * shared memory: T·I floats. */
template <int ROWS, int UNROLL, int RMAX>
__global__ void __launch_bounds__(MOE_WARPS * 32, 2) /* ≤ 128 registers: two blocks per SM */
    moe_down_staged_kernel(const bf16 *__restrict__ Wall, int H, int I, moe_scratch sc,
                           const bf16 *__restrict__ w_sh, int Is, int T, const bf16 *__restrict__ pf_w) {
    extern __shared__ __align__(16) float act[]; /* [n, I] */
    const int i = blockIdx.x;
    if (w_sh && i == (int)gridDim.x - 1) {
        shared_down_column<ROWS, UNROLL, RMAX>(w_sh, H, Is, T, sc, pf_w);
        return;
    }
    pdl_enter(); /* cuda_launch.cuh: before any access */
    if (i >= *sc.n_act) return;
    const int e = sc.act[i];
    const int lane = threadIdx.x & 31;
    const int64_t n0 = ((int64_t)blockIdx.y * MOE_WARPS + (threadIdx.x >> 5)) * ROWS;
    const bf16 *W = Wall + (int64_t)e * H * I;
    /* the warp's first batch of weights is in flight while the block stages the inputs */
    WBatch<ROWS, UNROLL> first;
    if (n0 < H) {
        const bf16 *wrow[ROWS];
        gemv_rows<ROWS>(W, I, n0, H, wrow);
        wbatch_load<ROWS, UNROLL, true>(wrow, lane * 8, I, first);
    }
    const int a0 = sc.off[i], n = sc.off[i + 1] - a0;
    const int cpr = I / 8; /* 8-element chunks per row */
    for (int q = threadIdx.x; q < n * cpr; q += blockDim.x) {
        const int r = q / cpr, c = q - r * cpr;
        const XSiluMul<1> hs{{sc.h + (int64_t)sc.sorted[a0 + r] * 2 * I}, I};
        float g[8];
        hs.load(0, (int64_t)c * 8, g);
        float4 *dst = reinterpret_cast<float4 *>(act + (int64_t)r * I + c * 8);
        dst[0] = make_float4(g[0], g[1], g[2], g[3]);
        dst[1] = make_float4(g[4], g[5], g[6], g[7]);
    }
    __syncthreads();
    if (n0 >= H) return;
    /* chunks of assignments as for_chunks<RMAX> walks them; the first takes the loaded batch */
    auto chunk = [&](auto rc, int c, bool pre) {
        constexpr int R = decltype(rc)::value;
        float acc[ROWS][R];
#pragma unroll
        for (int rr = 0; rr < ROWS; rr++)
#pragma unroll
            for (int r = 0; r < R; r++) acc[rr][r] = 0.f;
        const XSharedF32 xs{act + (int64_t)c * I, I};
        if (pre) gemv_warp_partial<R, ROWS, UNROLL, true, XSharedF32, true>(W, I, n0, H, xs, 0, I, acc, &first);
        else gemv_warp_partial<R, ROWS, UNROLL, true>(W, I, n0, H, xs, 0, I, acc);
        gemv_warp_reduce<R, ROWS>(acc);
        if (lane == 0) {
#pragma unroll
            for (int rr = 0; rr < ROWS; rr++) {
                if (n0 + rr >= H) continue;
#pragma unroll
                for (int r = 0; r < R; r++) sc.y[(int64_t)sc.sorted[a0 + c + r] * H + n0 + rr] = acc[rr][r];
            }
        }
    };
    int c0;
    if (RMAX >= 2 && n >= 2) {
        chunk(IntC<(RMAX >= 2 ? 2 : 1)>(), 0, true);
        c0 = 2;
    } else {
        chunk(IntC<1>(), 0, true);
        c0 = 1;
    }
    if (n > c0) /* an expert with more assignments than one chunk: rare in decode */
        for_chunks<RMAX>(n - c0, [&](auto rc, int c) { chunk(rc, c0 + c, false); });
}

/* One-token steps: routing + grouping folded into the gate_up launch (DS_OPT_MOE_ROUTE_FUSED), so
 * no single-block routing launch sits between the router GEMV and the experts (s5-run1, ncu:
 * moe_route_group_fast_kernel took 7.9 µs per layer at batch 1 on one SM while the GPU idled).
 * Every block stages the T·E router logits in shared memory, routes each token with one warp and
 * groups the assignments with the same code as moe_route_group_fast_kernel (same results), then
 * serves active expert blockIdx.x from its shared copy of the groups. Block (0, 0) also writes
 * the routing (ids, weights) and the groups to the scratch for the down and combine launches;
 * the blocks of column 0 compute the shared expert's SiLU(g)·u and gate. Needs E ≤ blockDim.x
 * (one thread per expert while grouping), T·E ≤ ROUTE_FUSED_LOGITS, T·k ≤ ROUTE_FUSED_A. */
#define ROUTE_FUSED_LOGITS 2048
#define ROUTE_FUSED_A 256
template <int ROWS, int UNROLL>
__global__ void __launch_bounds__(MOE_WARPS * 32)
    moe_gate_up_routed_kernel(const bf16 *__restrict__ Wall, int H, int I, int E, int k, int Is,
                              int norm_topk, int T, const bf16 *__restrict__ x, moe_scratch sc,
                              const bf16 *__restrict__ pf_w, int regs) {
    __shared__ float lg[ROUTE_FUSED_LOGITS]; /* [T, E] router logits, then probabilities */
    __shared__ int32_t ids_s[ROUTE_FUSED_A];
    __shared__ int cnt[MOE_WARPS * 32];
    __shared__ int wsum[32];
    __shared__ int32_t n_act_s, act_s[MOE_WARPS * 32], off_s[MOE_WARPS * 32 + 1], sorted_s[ROUTE_FUSED_A];
    pdl_enter(); /* cuda_launch.cuh: before any access */
    const int64_t NL = moe_ldl(E, Is); /* row pitch of L */
    const bool writer = blockIdx.x == 0 && blockIdx.y == 0;
    for (int i = threadIdx.x; i < T * E; i += blockDim.x) {
        const int t = i / E;
        lg[i] = sc.L[(int64_t)t * NL + (i - t * E)];
    }
    if (Is > 0 && blockIdx.x == 0) { /* column 0 shares the shared expert's activations */
        const int64_t per = DS_DIV_UP((int64_t)T * Is, (int64_t)gridDim.y);
        const int64_t i0 = (int64_t)blockIdx.y * per;
        for (int64_t i = i0 + threadIdx.x; i < i0 + per && i < (int64_t)T * Is; i += blockDim.x) {
            const int64_t t = i / Is, j = i - t * Is;
            const float *Lr = sc.L + t * NL + E;
            sc.sh_act[t * Is + j] = __float2bfloat16_rn(silu_f(Lr[j]) * Lr[Is + j]);
        }
        if (blockIdx.y == 0 && threadIdx.x < T) sc.sg[threadIdx.x] = sigmoid_f(sc.L[(int64_t)threadIdx.x * NL + E + 2 * Is]);
    }
    __syncthreads();
    const int warp = threadIdx.x >> 5;
    for (int t = warp; t < T; t += MOE_WARPS)
        route_from_shared(t, E, k, norm_topk, sc, lg + t * E, ids_s, writer, regs);
    __syncthreads();
    const int A = T * k;
    group_from_shared(A, E, ids_s, cnt, wsum, moe_groups_out{&n_act_s, act_s, off_s, sorted_s},
                      moe_prefetch{NULL, 0});
    __syncthreads();
    const int n_act = n_act_s;
    if (writer) { /* the groups for the down launch */
        for (int i = threadIdx.x; i < n_act; i += blockDim.x) {
            sc.act[i] = act_s[i];
            sc.off[i] = off_s[i];
        }
        for (int a = threadIdx.x; a < A; a += blockDim.x) sc.sorted[a] = sorted_s[a];
        if (threadIdx.x == 0) {
            *sc.n_act = n_act;
            sc.off[n_act] = A;
        }
    }
    const int i = blockIdx.x;
    if (i >= n_act) return;
    const int e = act_s[i];
    const int a0 = off_s[i], a1 = off_s[i + 1];
    const int64_t N = 2 * (int64_t)I, K = H;
    const bf16 *W = Wall + (int64_t)e * N * K;
    const int64_t n0 = ((int64_t)blockIdx.y * MOE_WARPS + warp) * ROWS;
    if (pf_w && threadIdx.x == 0) { /* as moe_expert_kernel: this block's slice of the down matrix */
        const int64_t rows = DS_DIV_UP((int64_t)H, (int64_t)gridDim.y);
        const int64_t r0 = (int64_t)blockIdx.y * rows;
        const int64_t cap = (int64_t)DS_CUDA_PREFETCH_BUDGET / ((int64_t)n_act * gridDim.y);
        if (r0 < H) {
            const int64_t nr = H - r0 < rows ? H - r0 : rows;
            const int64_t bytes = nr * I * 2 < cap ? nr * I * 2 : cap;
            prefetch_l2_range(pf_w + ((int64_t)e * H + r0) * I, (uint64_t)(bytes & ~(int64_t)15));
        }
    }
    if (n0 >= N) return;
    /* one assignment at a time: the launch serves one-token steps (an expert has one row) */
    for_chunks<1>(a1 - a0, [&](auto r, int c) {
        constexpr int R = decltype(r)::value;
        moe_chunk<false, ROWS, UNROLL, R, true>(W, N, K, n0, sorted_s + a0 + c, k, H, I, x, sc);
    });
}

/* One-token steps whose MoE output goes into the residual (ctx->moe_down_combine,
 * DS_CUDA_MOE_DOWN_COMBINE): the down projection and the combine + residual add in one launch,
 * so the combine is not a launch of its own. Block b owns output rows b·ROWS..: warp i < k
 * computes them for routing slot i (expert ids[i], input SiLU(g)·u of assignment i), warp k the
 * shared expert's; then one thread a row sums the k + 1 values in moe_combine_norm_kernel's
 * order (slots in order, then the shared expert; rounded to bf16) and adds it to the residual
 * (pre first when set, each add rounded: add_rmsnorm_row's arithmetic). Each row's dot products
 * are moe_chunk's and shared_down_chunk's (gemv_warp_partial at the same ROWS, same order), so
 * the residual is bit-identical to down + moe_combine_norm_kernel. The RMSNorm that follows is
 * left to the next launch (a GEMV with the norm as its prologue, cuda_gemv_norm.cu): it needs
 * the whole row, which no block here holds. Block: k + (w_sh ? 1 : 0) ≤ MOE_DC_MAX_WARPS warps.
 * The shared warp's first batch of weights is loaded before the PDL wait (not routed). */
#define MOE_DC_MAX_WARPS 16
template <int ROWS, int UNROLL>
__global__ void __launch_bounds__(MOE_DC_MAX_WARPS * 32)
    moe_down_combine_kernel(const bf16 *__restrict__ Wall, int H, int I, int k, moe_scratch sc,
                            const bf16 *__restrict__ w_sh, int Is, bf16 *__restrict__ residual,
                            const bf16 *__restrict__ pre, int preload) {
    __shared__ float y_s[MOE_DC_MAX_WARPS][ROWS]; /* [slot (k routed, then shared), row] */
    __shared__ float w_s[MOE_DC_MAX_WARPS];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int64_t n0 = (int64_t)blockIdx.x * ROWS;
    const bool shared_warp = w_sh && warp == k;
    WBatch<ROWS, UNROLL> first;
    const bool pre_loaded = shared_warp && gemv_preload<ROWS, UNROLL>(w_sh, Is, n0, H, 0, Is, lane, preload, first);
    pdl_enter(); /* cuda_launch.cuh: weights only before this */
    float acc[ROWS][1];
    if (warp < k) {
        if (lane == 0) w_s[warp] = sc.wts[warp];
        XSiluMul<1> xs;
        xs.I = I;
        xs.base[0] = sc.h + (int64_t)warp * 2 * I; /* T = 1: assignment i is slot i */
#pragma unroll
        for (int rr = 0; rr < ROWS; rr++) acc[rr][0] = 0.f;
        gemv_warp_partial<1, ROWS, UNROLL, true>(Wall + (int64_t)sc.ids[warp] * H * I, I, n0, H, xs,
                                                 0, I, acc);
        gemv_warp_reduce<1, ROWS>(acc);
    } else if (shared_warp) {
        XRows<1> xs;
        xs.base[0] = sc.sh_act;
        gemv_warp_sums<1, ROWS, UNROLL>(w_sh, Is, n0, H, xs, 0, Is, pre_loaded, first, acc);
    }
    if (lane == 0 && (warp < k || shared_warp)) {
#pragma unroll
        for (int rr = 0; rr < ROWS; rr++) y_s[warp][rr] = acc[rr][0];
    }
    __syncthreads();
    const int64_t n = n0 + threadIdx.x;
    if (threadIdx.x >= ROWS || n >= H) return;
    float s = 0.f;
    for (int i = 0; i < k; i++) s = fmaf(w_s[i], y_s[i][threadIdx.x], s);
    if (w_sh) s = fmaf(sc.sg[0], y_s[k][threadIdx.x], s);
    const float out = __bfloat162float(__float2bfloat16_rn(s)); /* the combine's stored value */
    float f = __bfloat162float(residual[n]);
    if (pre) f = __bfloat162float(__float2bfloat16_rn(f + __bfloat162float(pre[n])));
    residual[n] = __float2bfloat16_rn(f + out);
}

/* Launches the expert kernel with the chunk bound RMAX = the largest of 8, 4, 2, 1 not above T
 * (no expert has more assignments than there are tokens), and not above ctx->moe_rmax (decode-
 * sized steps) or ctx->moe_rmax_prefill (occupancy, see cuda_internal.h). */
template <bool DOWN, int ROWS, int UNROLL, class... Args>
static void launch_experts(ds_cuda_ctx *ctx, int T, dim3 grid, Args &&...args) {
    const int bound = T <= DS_CUDA_GEMV_MAX_ROWS ? ctx->moe_rmax : ctx->moe_rmax_prefill;
    if (bound >= 1 && T > bound) T = bound;
    if (T >= 8) ds_launch(ctx, moe_expert_kernel<DOWN, ROWS, UNROLL, 8>, grid, MOE_WARPS * 32, 0, args...);
    else if (T >= 4) ds_launch(ctx, moe_expert_kernel<DOWN, ROWS, UNROLL, 4>, grid, MOE_WARPS * 32, 0, args...);
    else if (T >= 2) ds_launch(ctx, moe_expert_kernel<DOWN, ROWS, UNROLL, 2>, grid, MOE_WARPS * 32, 0, args...);
    else ds_launch(ctx, moe_expert_kernel<DOWN, ROWS, UNROLL, 1>, grid, MOE_WARPS * 32, 0, args...);
}

/* The expert gate_up launch of GEMV-sized steps: ROWS output rows per warp (ctx->moe_gu_rows),
 * with the routing inside it when route_fused. */
template <int ROWS, int UNROLL>
static void launch_gate_up(ds_cuda_ctx *ctx, const ds_cuda_moe_args *a, const moe_scratch &sc,
                           int nblk, bool route_fused, const bf16 *pf_down) {
    const int T = a->T, H = a->H, I = a->I;
    dim3 grid(nblk, DS_DIV_UP(2 * I, MOE_WARPS * ROWS));
    if (route_fused) {
        ds_launch(ctx, moe_gate_up_routed_kernel<ROWS, UNROLL>, grid, MOE_WARPS * 32, 0,
                  (const bf16 *)a->w_gu, H, I, a->E, a->top_k, a->Is, (int)a->norm_topk, T,
                  (const bf16 *)a->x, sc, pf_down, ctx->route_regs);
        DS_CU_LAUNCHED2(ctx, "moe_gate_up_routed_kernel", T, 2 * I);
    } else {
        launch_experts<false, ROWS, UNROLL>(ctx, T, grid, (const bf16 *)a->w_gu, H, I, a->top_k,
                                            (const bf16 *)a->x, sc, (const bf16 *)NULL, 0, T, pf_down);
        DS_CU_LAUNCHED2(ctx, "moe_expert_kernel<gate_up>", T, 2 * I);
    }
}

/* The expert down launch: ROWS output rows per warp (ctx->moe_down_rows); w_sh (not NULL): the
 * shared expert's down projection as its last column of blocks. */
template <int ROWS, int UNROLL>
static void launch_down(ds_cuda_ctx *ctx, const ds_cuda_moe_args *a, const moe_scratch &sc,
                        int nblk, const bf16 *w_sh, const bf16 *pf_sh) {
    const int T = a->T, H = a->H;
    dim3 grid(nblk + (w_sh ? 1 : 0), DS_DIV_UP(H, MOE_WARPS * ROWS));
    launch_experts<true, ROWS, UNROLL>(ctx, T, grid, (const bf16 *)a->w_down, H, a->I, a->top_k,
                                       (const bf16 *)a->x, sc, w_sh, a->Is, T, pf_sh);
}

/* ---- 7. combine ---------------------------------------------------------------------------- */

/* out[t, n..n+3] = Σ_i w_i·y[t·k + i, n..n+3] (+ sg[t]·ysh[t, n..n+3]), summed in slot order.
 * A block covers 4·COMBINE_THREADS columns of one token; each thread issues its k (≤ 8 at a
 * time) 16-byte loads before the first FMA. */
#define COMBINE_THREADS 128
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
#pragma unroll
        for (int u = 0; u < 8; u++)
            if (i0 + u < k)
                y[u] = __ldcg(reinterpret_cast<const float4 *>(sc.y + ((int64_t)t * k + i0 + u) * H + n));
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
            float4 y[8][2];
#pragma unroll
            for (int u = 0; u < 8; u++)
                if (i0 + u < k) {
                    const float4 *p = reinterpret_cast<const float4 *>(sc.y + ((int64_t)t * k + i0 + u) * H + n);
                    y[u][0] = __ldcg(p);
                    y[u][1] = __ldcg(p + 1);
                }
#pragma unroll
            for (int u = 0; u < 8; u++) {
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
    else ds_cuda_gemm_lt(ctx, a->w_in, NL, H, a->x, H, T, sc.L, ldl, 1); /* NL odd: split there */
    /* 2. route, 3. group: one launch for small steps (the fast kernel when the router logits
     * fit in shared memory), else a route grid and a group block with the ids staged in
     * dynamic shared memory */
    const bool pf_on = ds_prefetch_on(ctx) && T <= DS_CUDA_GEMV_MAX_ROWS;
    const moe_prefetch pf_gu = {pf_on ? (const bf16 *)a->w_gu : NULL, 2 * (int64_t)I * H * 2};
    const bool use_gemm = T > DS_CUDA_GEMV_MAX_ROWS && ctx->opt.moe_gemm && ds_cuda_moe_gemm_fits(H, I);
    /* one-token steps: routing and grouping inside the gate_up launch (moe_gate_up_routed_kernel).
     * Only T = 1: every gate_up block repeats the routing, and at T = 4 / 8 (32 / 64 expert
     * columns of blocks, each routing T tokens) that cost 5.878 vs 5.178 and 9.835 vs 7.745 ms
     * per step, against 2.936 vs 3.000 ms at T = 1 (s5-run2) */
    const bool route_fused = ctx->opt.moe_route_fused && !use_gemm && T == 1 &&
                             E <= MOE_WARPS * 32 && T * E <= ROUTE_FUSED_LOGITS && A <= ROUTE_FUSED_A;
    if (route_fused) {
        /* nothing here: step 4 routes */
    } else if (A <= MOE_FUSED_A && T * E <= ROUTE_FAST_LOGITS && ctx->opt.moe_fast_route) {
        ds_launch(ctx, moe_route_group_fast_kernel, 1, 1024, 0, T, E, k, Is, (int)a->norm_topk, sc,
                  pf_gu, ctx->route_batched, ctx->route_regs);
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
                  Is, (int)a->norm_topk, sc);
        DS_CU_LAUNCHED2(ctx, "moe_route_kernel", T, E);
        ds_launch(ctx, moe_group_kernel, 1, 1024, smem, A, E, PW, sc);
        DS_CU_LAUNCHED2(ctx, "moe_group_kernel", A, E);
    }
    /* 4. gate_up, 5. down (+ 6. the shared expert's down in the same launch for GEMV-sized
     * steps when ctx->opt.moe_fuse_shared). Larger steps: the grouped tensor-core GEMM
     * (cuda_moe_gemm.cu, DS_OPT_MOE_GEMM) */
    const int nblk = A < E ? A : E;
    const bool fuse_sh = Is > 0 && T <= DS_CUDA_GEMV_MAX_ROWS && ctx->opt.moe_fuse_shared;
    if (use_gemm) {
        ds_moe_gemm_args g = {};
        g.A = A, g.E = E, g.H = H, g.I = I, g.top_k = k;
        g.x = a->x, g.w_gu = a->w_gu, g.w_down = a->w_down;
        g.groups = ds_moe_groups{sc.n_act, sc.act, sc.off, sc.sorted};
        g.act = sc.h; /* [A, I] of the [A, 2I] buffer */
        g.y = sc.y;
        ds_cuda_moe_gemm(ctx, &g);
    } else {
        /* the gate_up blocks' L2 prefetch of their expert's down slice: with DS_OPT_PREFETCH
         * only (alone, s7-run4: 2.765 / 5.184 / 7.518 vs 2.691 / 5.066 / 7.399 ms, slower) */
        const bf16 *pf_down = pf_on ? (const bf16 *)a->w_down : (const bf16 *)NULL;
        if (ctx->moe_gu_rows == 4) launch_gate_up<4, 2>(ctx, a, sc, nblk, route_fused, pf_down);
        else launch_gate_up<2, 4>(ctx, a, sc, nblk, route_fused, pf_down);
        if (a->residual && !a->normed) { /* 5-7 in one launch, the norm left to the caller */
            const int warps = k + (Is > 0 ? 1 : 0);
            ds_launch(ctx, moe_down_combine_kernel<4, 2>, DS_DIV_UP(H, 4), warps * 32, 0,
                      (const bf16 *)a->w_down, H, I, k, sc, (const bf16 *)a->w_sh_down, Is,
                      (bf16 *)a->residual, (const bf16 *)a->pre_delta, ctx->gemv_preload);
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
            dim3 grid(nblk + (w_sh ? 1 : 0), DS_DIV_UP(H, MOE_WARPS * 8));
            ds_launch(ctx, moe_down_staged_kernel<8, 2, 2>, grid, MOE_WARPS * 32, staged_smem,
                      (const bf16 *)a->w_down, H, I, sc, w_sh, Is, T, pf_sh);
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
        ds_launch(ctx, moe_combine_norm_kernel, T, DS_NORM_THREADS, 0, H, k, Is, sc,
                  (bf16 *)a->residual, (const bf16 *)a->pre_delta, a->norm_w, a->eps,
                  (bf16 *)a->normed, ctx->norm_regs);
        DS_CU_LAUNCHED2(ctx, "moe_combine_norm_kernel", T, H);
        return;
    }
    ds_launch(ctx, moe_combine_kernel, dim3(DS_DIV_UP(H, 4 * COMBINE_THREADS), T), COMBINE_THREADS,
              0, H, k, Is, sc, (bf16 *)a->out);
    DS_CU_LAUNCHED2(ctx, "moe_combine_kernel", T, H);
}
