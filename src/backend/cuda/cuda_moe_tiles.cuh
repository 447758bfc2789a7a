/* cuda_moe_tiles.cuh — the grouped expert GEMMs' M tiles: tile index → (active expert, first
 * assignment row), looked up on the device (the host does not know the per-expert counts).
 * Shared by the tiled kernel (cuda_moe_gemm.cu) and the TMA-fed one (cuda_moe_gemm_tma.cu). */
#ifndef DS_CUDA_MOE_TILES_CUH
#define DS_CUDA_MOE_TILES_CUH

#include "cuda_common.cuh"
#include "cuda_moe_gemm.h"

/* This lane's share of the active experts, [*i0, *i1), and the sum of their tile counts. */
template <int BM>
static __device__ __forceinline__ int moe_lane_tiles(const ds_moe_groups &g, int *i0, int *i1) {
    const int lane = threadIdx.x & 31;
    const int n = *g.n_act;
    const int per = DS_DIV_UP(n, 32);
    *i0 = min(lane * per, n);
    *i1 = min(*i0 + per, n);
    int tot = 0;
#pragma unroll 8
    for (int i = *i0; i < *i1; i++) tot += DS_DIV_UP(g.off[i + 1] - g.off[i], BM);
    return tot;
}

/* Tile bx (tiles of BM assignment rows, expert after expert in g.act order) → *expert_i (index
 * into g.act / g.off, -1 past the last tile) and *m0 (its first row within the expert), in every
 * lane of the calling warp (all 32 lanes must call). Lane l owns the contiguous experts
 * [l·per, (l+1)·per), loads all their offsets at once and sums their tile counts
 * ⌈(off[i+1] − off[i]) / BM⌉; one warp scan of the lane totals; the lane whose range holds bx
 * walks its experts. (Session 4's version scanned 32 experts per round with the rounds chained
 * by their loads — ⌈n / 32⌉ round trips before a late block's first weight load; measured no
 * slower at 256 experts, s7-run3: prefill 1024 tokens 77.08 vs 76.91 ms, same tiles bit for
 * bit.) */
template <int BM>
static __device__ __forceinline__ void moe_tile_lookup(int bx, const ds_moe_groups &g, int *expert_i, int *m0) {
    const int lane = threadIdx.x & 31;
    int i0, i1;
    const int tot = moe_lane_tiles<BM>(g, &i0, &i1);
    int incl = tot;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        const int y = __shfl_up_sync(0xffffffffu, incl, o);
        if (lane >= o) incl += y;
    }
    int ei = -1, r0 = 0;
    if (bx >= incl - tot && bx < incl) { /* one lane at most */
        int base = incl - tot;
        for (int i = i0; i < i1; i++) {
            const int t = DS_DIV_UP(g.off[i + 1] - g.off[i], BM);
            if (bx < base + t) {
                ei = i;
                r0 = (bx - base) * BM;
                break;
            }
            base += t;
        }
    }
    const unsigned hit = __ballot_sync(0xffffffffu, ei >= 0);
    const int src = hit ? __ffs(hit) - 1 : 0;
    *expert_i = hit ? __shfl_sync(0xffffffffu, ei, src) : -1;
    *m0 = hit ? __shfl_sync(0xffffffffu, r0, src) : 0;
}

/* The number of M tiles, Σ ⌈(off[i+1] − off[i]) / BM⌉ over the active experts, in every lane of
 * the calling warp. */
template <int BM> static __device__ __forceinline__ int moe_tile_count(const ds_moe_groups &g) {
    int i0, i1;
    int tot = moe_lane_tiles<BM>(g, &i0, &i1);
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) tot += __shfl_xor_sync(0xffffffffu, tot, o);
    return tot;
}

#endif
