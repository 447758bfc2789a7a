/* cuda_moe_route.cuh — stages 2 and 3 of the MoE block (cuda_moe.cu): routing (softmax over
 * the router logits, top-k with ties to the lowest expert id, renormalised weights; the
 * shared expert's SiLU(g)·u and gate) and grouping (the T·k assignments sorted by expert,
 * stable), as device functions the routed gate_up launch reuses and as kernels of their own.
 * Included by cuda_moe.cu only. */
#ifndef DS_CUDA_MOE_ROUTE_CUH
#define DS_CUDA_MOE_ROUTE_CUH

#include "cuda_argmax.cuh"
#include "cuda_launch.cuh"
#include "cuda_moe_scratch.cuh"

#define ROUTE_WARPS 4

/* The routing kernels' `regs` argument: 0 from shared memory (DS_CUDA_ROUTE_REGS=0), 1 from
 * registers, 2 from registers with hardware warp reductions (DS_CUDA_ROUTE_REDUX, default). */
static inline int ds_cuda_route_mode(const ds_cuda_ctx *ctx) {
    return ctx->route_regs ? (ctx->route_redux ? 2 : 1) : 0;
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
 * expert 0 rather than an index past E.
 * redux (ctx->route_redux): each round's argmax as two warp reductions in hardware (redux.sync:
 * the largest probability as its bits — non-negative floats order as their bit patterns — then
 * the lowest expert id among the lanes holding it) instead of the 5-level butterfly of
 * (value, index) shuffles: the same winner by the same rule (larger value, ties to the lower
 * id; no candidate: value −2, index past E). */
static __device__ __forceinline__ void route_in_registers(int t, int E, int k, int norm_topk, const moe_scratch &sc,
                                          const float *pr, int32_t *ids_s, bool to_global,
                                          bool redux) {
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
        if (redux) {
            /* lb ≥ 0 whenever li names a candidate (a probability; NaN never becomes lb) */
            const unsigned key = li != 0x7fffffff ? __float_as_uint(lb) : 0u;
            const unsigned m = __reduce_max_sync(0xffffffffu, key);
            bi = (int)__reduce_min_sync(0xffffffffu, key == m ? (unsigned)li : 0x7fffffffu);
            bv = bi == 0x7fffffff ? -2.f : __uint_as_float(m);
        } else {
            warp_amax(bv, bi);
        }
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
                                         int regs = 0) {
    if (regs && E <= 256) { /* regs: 1 registers, 2 registers and hardware reductions */
        route_in_registers(t, E, k, norm_topk, sc, pr, ids_s, to_global, regs == 2);
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

/* Token t with one warp: its router logits from global memory into pr, routed (regs as
 * route_from_shared's); the shared expert's SiLU(g)·u and sigmoid gate. */
static __device__ void route_token(int t, int E, int k, int Is, int norm_topk, const moe_scratch &sc,
                                   float *pr, int32_t *ids_s, int regs = 0, int batched = 1) {
    const int lane = threadIdx.x & 31;
    const float *Lr = sc.L + (int64_t)t * moe_ldl(E, Is);
    for (int e = lane; e < E; e += 32) pr[e] = Lr[e];
    __syncwarp();
    route_from_shared(t, E, k, norm_topk, sc, pr, ids_s, true, regs);
    if (Is > 0 && !batched) { /* measurement only (DS_CUDA_ROUTE_BATCHED=0): before session 26 */
        for (int i = lane; i < Is; i += 32)
            sc.sh_act[(int64_t)t * Is + i] = __float2bfloat16_rn(silu_f(Lr[E + i]) * Lr[E + Is + i]);
        if (lane == 0) sc.sg[t] = sigmoid_f(Lr[E + 2 * Is]);
    } else if (Is > 0) {
        /* SH_BATCH elements a lane, every load issued before the first store: a load of sc.L
         * cannot move past a store to sc.sh_act (both global, may alias), so the plain loop
         * paid one L2 round trip an element (16 at Is = 512). Same values. */
        constexpr int SH_BATCH = 8;
        const float gate = lane == 0 ? Lr[E + 2 * Is] : 0.f;
        for (int i0 = lane; i0 < Is; i0 += 32 * SH_BATCH) {
            float g[SH_BATCH], u[SH_BATCH];
#pragma unroll
            for (int q = 0; q < SH_BATCH; q++) {
                const int i = i0 + 32 * q;
                g[q] = i < Is ? Lr[E + i] : 0.f;
                u[q] = i < Is ? Lr[E + Is + i] : 0.f;
            }
#pragma unroll
            for (int q = 0; q < SH_BATCH; q++) {
                const int i = i0 + 32 * q;
                if (i < Is) sc.sh_act[(int64_t)t * Is + i] = __float2bfloat16_rn(silu_f(g[q]) * u[q]);
            }
        }
        if (lane == 0) sc.sg[t] = sigmoid_f(gate);
    }
}

/* Large steps (prefill): a warp per token. regs: ds_cuda_route_mode, as in decode (since
 * session 22; before, this kernel always took the shared-memory rounds: the same ids and
 * weights either way, tested bit for bit by test_cuda_ops' moe variants at T = 300 of the
 * 35B-like shape, the step there with more than MOE_FUSED_A assignments). */
__global__ void __launch_bounds__(ROUTE_WARPS * 32)
    moe_route_kernel(int T, int E, int k, int Is, int norm_topk, moe_scratch sc, int regs, int batched) {
    __shared__ float prob[ROUTE_WARPS][MOE_MAX_E];
    pdl_enter(); /* cuda_launch.cuh: before any access */
    const int warp = threadIdx.x >> 5;
    const int t = blockIdx.x * ROUTE_WARPS + warp;
    if (t >= T) return;
    route_token(t, E, k, Is, norm_topk, sc, prob[warp], NULL, regs, batched);
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
__global__ void __launch_bounds__(1024) moe_group_kernel(int A, int E, int PW, moe_scratch sc, int batched) {
    extern __shared__ int32_t ids_dyn[]; /* [A] ids, then [PW][E] cursors */
    __shared__ int cnt[MOE_MAX_E];
    __shared__ int wsum[32];
    pdl_enter(); /* cuda_launch.cuh: before any access */
    int *cw = ids_dyn + A;
    if (!batched) { /* measurement only (DS_CUDA_ROUTE_BATCHED=0): before session 26 */
        for (int a = threadIdx.x; a < A; a += blockDim.x) ids_dyn[a] = sc.ids[a];
    } else { /* IDS_BATCH loads a thread in flight before their stores (one round trip, not
              * eight, at A = 8192) */
        constexpr int IDS_BATCH = 8;
        for (int a0 = threadIdx.x; a0 < A; a0 += IDS_BATCH * blockDim.x) {
            int32_t v[IDS_BATCH];
#pragma unroll
            for (int q = 0; q < IDS_BATCH; q++) {
                const int a = a0 + q * blockDim.x;
                v[q] = a < A ? sc.ids[a] : 0;
            }
#pragma unroll
            for (int q = 0; q < IDS_BATCH; q++) {
                const int a = a0 + q * blockDim.x;
                if (a < A) ids_dyn[a] = v[q];
            }
        }
    }
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

#endif
