/* cuda_moe_experts.cuh — stages 4-6 of the MoE block (cuda_moe.cu) for GEMV-sized steps: the
 * experts' gate_up and down GEMVs over the selected experts only (a block per active expert
 * and row tile), the shared expert's down in the routed down launch, the one-token launches
 * that fold the routing into gate_up and the combine into down, and their host launchers.
 * Included by cuda_moe.cu only. */
#ifndef DS_CUDA_MOE_EXPERTS_CUH
#define DS_CUDA_MOE_EXPERTS_CUH

#include "cuda_gemv.cuh"
#include "cuda_internal.h"
#include "cuda_launch.cuh"
#include "cuda_moe_route.cuh"

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
                                                          const bf16 *__restrict__ pf_w,
                                                          int tile) {
    const int64_t n0 = ((int64_t)tile * MOE_WARPS + (threadIdx.x >> 5)) * ROWS;
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
        shared_down_column<ROWS, UNROLL, RMAX>(w_sh, H, Is, T, sc, pf_w, blockIdx.y);
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
 * DRAM at 55 % (ncu, s7-run1, batch 8). Same chunks, same order: bit-identical to moe_expert_kernel.
 *
 * TILES (ctx->moe_down_tiles, DS_CUDA_MOE_DOWN_TILES): a block of expert i serves TILES
 * consecutive tiles of MOE_WARPS·ROWS output rows (blockIdx.y·TILES + t), so the dependent
 * prologue (active list, offsets, the staging and its barrier) is paid once per TILES tiles:
 * with one tile a block a 64 KB slice of weights cost that prologue (DRAM ~57 % at batch 8, ncu
 * s13). The shared expert's down (w_sh) takes the last TILES columns, one tile a block (its T
 * tokens already make its blocks the longest), tile (x − first shared column)·gridDim.y +
 * blockIdx.y. With ROWS 8 a loop over tiles spills (328 bytes: the 64 registers of a weight
 * batch and the loop's invariants), so TILES > 1 runs 4 rows a warp (no spills).
 * Dynamic shared memory: T·I floats. */
template <int ROWS, int UNROLL, int RMAX, int TILES>
__global__ void __launch_bounds__(MOE_WARPS * 32, 2) /* ≤ 128 registers: two blocks per SM */
    moe_down_staged_kernel(const bf16 *__restrict__ Wall, int H, int I, moe_scratch sc,
                           const bf16 *__restrict__ w_sh, int Is, int T, const bf16 *__restrict__ pf_w) {
    extern __shared__ __align__(16) float act[]; /* [n, I] */
    const int i = blockIdx.x;
    const int first_shared = (int)gridDim.x - TILES;
    if (w_sh && i >= first_shared) {
        shared_down_column<ROWS, UNROLL, RMAX>(w_sh, H, Is, T, sc, pf_w,
                                               (i - first_shared) * (int)gridDim.y + blockIdx.y);
        return;
    }
    pdl_enter(); /* cuda_launch.cuh: before any access */
    if (i >= *sc.n_act) return;
    const int e = sc.act[i];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const bf16 *W = Wall + (int64_t)e * H * I;
    const int tile0 = blockIdx.y * TILES;
    auto row0 = [&](int t) { return ((int64_t)(tile0 + t) * MOE_WARPS + warp) * ROWS; };
    const int a0 = sc.off[i], n = sc.off[i + 1] - a0;
    /* `first` is loaded at the top of every tile, so it is dead across the loop's back edge (a
     * batch loaded before the loop for tile 0 stayed live through it: 580 bytes of spills) */
#pragma unroll 1
    for (int t = 0; t < TILES; t++) {
        const int64_t n0 = row0(t);
        WBatch<ROWS, UNROLL> first;
        if (n0 < H) {
            const bf16 *wrow[ROWS];
            gemv_rows<ROWS>(W, I, n0, H, wrow);
            wbatch_load<ROWS, UNROLL, true>(wrow, lane * 8, I, first);
        }
        if (t == 0) { /* tile 0's weights are in flight while the block stages the inputs */
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
        }
        if (n0 >= H) return; /* after the barrier */
        /* chunks of assignments as for_chunks<RMAX> walks them; the first takes `first` */
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

/* The groups of a one-token step (ctx->route_ranks) from the k selected expert ids in ids_s,
 * by warp 0: selection i's place is its id's rank among the k, which is what the block-wide
 * grouping (group_from_shared) gives when the ids are distinct — experts ascending, one
 * assignment each, assignment i at the place of its expert. Writes the groups and *dup_s
 * (whether two selections share an id: then nothing else was written and the caller groups
 * the general way). Call with the whole block; returns after a barrier. */
static __device__ void group_one_token(int k, const int32_t *ids_s, moe_groups_out g, int *dup_s) {
    if (threadIdx.x < 32) {
        const int lane = threadIdx.x;
        const int id = lane < k ? ids_s[lane] : -1 - lane; /* padding lanes match nobody */
        const unsigned peers = __match_any_sync(0xffffffffu, id);
        const bool dup = __any_sync(0xffffffffu, lane < k && __popc(peers) > 1);
        if (!dup) {
            int rank = 0;
            for (int j = 0; j < k; j++) rank += __shfl_sync(0xffffffffu, id, j) < id;
            if (lane < k) {
                g.act[rank] = id;
                g.off[rank] = rank;
                g.sorted[rank] = lane;
            }
            if (lane == 0) {
                *g.n_act = k;
                g.off[k] = k;
            }
        }
        if (lane == 0) *dup_s = dup;
    }
    __syncthreads();
}

/* ≤ 64 registers (4 blocks an SM): the 35B-A3B launch's 512 blocks then run in one wave. At
 * 72 registers (ptxas' choice once group_one_token came in) 3 blocks fit an SM, the launch took
 * two waves and 22.1 instead of 17.8 µs (ncu, s13-run3). */
template <int ROWS, int UNROLL>
__global__ void __launch_bounds__(MOE_WARPS * 32, 4)
    moe_gate_up_routed_kernel(const bf16 *__restrict__ Wall, int H, int I, int E, int k, int Is,
                              int norm_topk, int T, const bf16 *__restrict__ x, moe_scratch sc,
                              const bf16 *__restrict__ pf_w, int regs, int ranks, int *route_flag) {
    __shared__ float lg[ROUTE_FUSED_LOGITS]; /* [T, E] router logits, then probabilities */
    __shared__ int32_t ids_s[ROUTE_FUSED_A];
    __shared__ int cnt[MOE_WARPS * 32];
    __shared__ int wsum[32];
    __shared__ int32_t n_act_s, act_s[MOE_WARPS * 32], off_s[MOE_WARPS * 32 + 1], sorted_s[ROUTE_FUSED_A];
    __shared__ int dup_s;
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
    const moe_groups_out groups{&n_act_s, act_s, off_s, sorted_s};
    bool grouped = false;
    if (ranks && T == 1 && k <= 32) {
        group_one_token(k, ids_s, groups, &dup_s);
        grouped = !dup_s;
    }
    if (!grouped) {
        group_from_shared(A, E, ids_s, cnt, wsum, groups, moe_prefetch{NULL, 0});
        __syncthreads();
    }
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
        if (route_flag) { /* the routing (ids, weights above, groups) is out: release it to the
                           * down + combine launch's early warps (moe_down_combine_kernel) */
            __syncthreads();
            if (threadIdx.x == 0) {
                __threadfence();
                asm volatile("st.release.gpu.global.u32 [%0], %1;" ::"l"(route_flag), "r"(1u) : "memory");
            }
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
 * The shared warp's first batch of weights is loaded before the PDL wait (not routed).
 *
 * route_flag (ctx->moe_down_early; NULL: off): the routed warps' first batch too. The gate_up
 * launch's writer block sets route_flag[0] (release) once the step's expert ids and weights are
 * written; under PDL this launch starts while gate_up still runs, so each routed warp's lane 0
 * waits for the flag (acquire) and the warp reads its expert id and loads its first weights
 * before the PDL wait (cuda_launch.cuh's third exception). The last block to finish clears the
 * flag and its count (route_flag[1]); the next MoE block's gate_up sets it only after its own
 * wait, so after this launch. Never spins without PDL: then gate_up has completed. The same sums
 * as without (gemv_warp_sums with the batch preloaded). */
#define MOE_DC_MAX_WARPS 16
/* EARLY: at most 9 warps (top-8 + the shared expert) and two blocks an SM (≤ 113 registers), so
 * that the 35B-A3B's 256 blocks of 8 rows stay one wave (unbounded, the early form took 122) */
#define MOE_DC_EARLY_WARPS 9
template <int ROWS, int UNROLL, bool EARLY>
__global__ void __launch_bounds__(EARLY ? MOE_DC_EARLY_WARPS * 32 : MOE_DC_MAX_WARPS * 32, EARLY ? 2 : 0)
    moe_down_combine_kernel(const bf16 *__restrict__ Wall, int H, int I, int k, moe_scratch sc,
                            const bf16 *__restrict__ w_sh, int Is, bf16 *__restrict__ residual,
                            const bf16 *__restrict__ pre, int preload, int *route_flag) {
    __shared__ float y_s[MOE_DC_MAX_WARPS][ROWS]; /* [slot (k routed, then shared), row] */
    __shared__ float w_s[MOE_DC_MAX_WARPS];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int64_t n0 = (int64_t)blockIdx.x * ROWS;
    const bool shared_warp = w_sh && warp == k;
    WBatch<ROWS, UNROLL> first;
    bool pre_loaded = shared_warp && gemv_preload<ROWS, UNROLL>(w_sh, Is, n0, H, 0, Is, lane, preload, first);
    const bf16 *W_e = NULL; /* routed warps: this slot's expert's [H, I] matrix */
    if (EARLY && warp < k) {
        if (lane == 0) {
            unsigned f;
            for (;;) {
                asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(f) : "l"(route_flag) : "memory");
                if (f) break;
                __nanosleep(64);
            }
        }
        __syncwarp(); /* the lanes' reads below follow lane 0's acquire */
        W_e = Wall + (int64_t)__ldcg(sc.ids + warp) * H * I;
        pre_loaded = gemv_preload<ROWS, UNROLL>(W_e, I, n0, H, 0, I, lane, 1, first);
    }
    pdl_enter(); /* cuda_launch.cuh: weights only before this (and, with route_flag, the ids) */
    float acc[ROWS][1];
    if (warp < k) {
        if (lane == 0) w_s[warp] = sc.wts[warp];
        XSiluMul<1> xs;
        xs.I = I;
        xs.base[0] = sc.h + (int64_t)warp * 2 * I; /* T = 1: assignment i is slot i */
        if constexpr (EARLY) {
            gemv_warp_sums<1, ROWS, UNROLL>(W_e, I, n0, H, xs, 0, I, pre_loaded, first, acc);
        } else {
#pragma unroll
            for (int rr = 0; rr < ROWS; rr++) acc[rr][0] = 0.f;
            gemv_warp_partial<1, ROWS, UNROLL, true>(Wall + (int64_t)sc.ids[warp] * H * I, I, n0, H, xs,
                                                     0, I, acc);
            gemv_warp_reduce<1, ROWS>(acc);
        }
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
    if (EARLY && threadIdx.x == 0 && atomicAdd(route_flag + 1, 1) == (int)gridDim.x - 1) {
        route_flag[1] = 0; /* the last block: every block is past its wait for the flag */
        route_flag[0] = 0;
    }
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
                           int nblk, bool route_fused, const bf16 *pf_down, int *route_flag) {
    const int T = a->T, H = a->H, I = a->I;
    dim3 grid(nblk, DS_DIV_UP(2 * I, MOE_WARPS * ROWS));
    if (route_fused) {
        ds_launch(ctx, moe_gate_up_routed_kernel<ROWS, UNROLL>, grid, MOE_WARPS * 32, 0,
                  (const bf16 *)a->w_gu, H, I, a->E, a->top_k, a->Is, (int)a->norm_topk, T,
                  (const bf16 *)a->x, sc, pf_down, ds_cuda_route_mode(ctx), ctx->route_ranks, route_flag);
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

#endif
