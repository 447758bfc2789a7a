/* cuda_argmax.cuh — the pieces of the fused lm_head + argmax (greedy decode without logits)
 * shared by its CUDA-core kernel (cuda_gemv.cu) and its tensor-core kernel (cuda_gemv_tc.cu):
 * the (value, index) merge, the banned-id masks and the last block's merge of the partials.
 *
 * Each block of a fused argmax launch keeps, per input row r, the best (value, index) of its own
 * candidate rows — and, when the row has banned ids (set_argmax_bans, catalogue item 6), a
 * second best that skips them — as partials pv / pi [m][block][R] (m = 1: without the banned
 * ids, at masked_off). The last block to finish merges them; the merge is a max with a
 * lowest-index tie rule, so its result does not depend on the order blocks finished in.
 *
 * With atomic keys (ctx->amax_atomic, the default since session 20; DS_CUDA_AMAX_ATOMIC=0 for
 * the partials) there are no partials: each block
 * folds its best into one 64-bit key per input row (and one more skipping banned ids) by
 * atomicMax, and the last block only reads and clears those keys. The partials' merge was a tail
 * after everything else of the launch had finished: at the 248320-row lm_head, 7760 partials a
 * row (CUDA cores, one warp a row: 243 dependent L2 round trips a lane) or 15520 (tensor cores);
 * the fused lm_head + argmax took 303 / 331 µs against 233 / 244 µs for the logits GEMV alone at
 * batch 1 / 8 (s17-run2). Keys vs partials, whole decode step: 2.933 / 5.548 / 8.383 vs
 * 2.940 / 5.571 / 8.419 ms at batch 1 / 4 / 8 (H100, s20-run1): the tail was smaller than
 * that gap suggested. */
#ifndef DS_CUDA_ARGMAX_CUH
#define DS_CUDA_ARGMAX_CUH

#include <math.h>

#include "cuda_common.cuh"

/* (bv, bi) ← (v, i) when v is larger, or equal with a lower index; NaN never wins. */
static __device__ __forceinline__ void amax_merge(float &bv, int &bi, float v, int i) {
    if (v > bv || (v == bv && i < bi)) {
        bv = v;
        bi = i;
    }
}

/* (bv, bi) ← the best over the warp's lanes by amax_merge's rule (a butterfly: every lane ends
 * with the same pair). */
static __device__ __forceinline__ void warp_amax(float &bv, int &bi) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
        const int oi = __shfl_xor_sync(0xffffffffu, bi, o);
        amax_merge(bv, bi, ov, oi);
    }
}

/* Which input rows of this launch have bans: bans = [B, n_ban, table [B, n_ban]] at a fixed
 * device address (a graph replay sees the current table); input row r is batch row row0 + r. */
struct ArgmaxBans {
    int n_ban, n_banned_rows;
    bool masked;
};

static __device__ __forceinline__ ArgmaxBans argmax_bans(const int32_t *bans, int row0, int R) {
    ArgmaxBans b;
    b.n_ban = bans[1];
    b.n_banned_rows = bans[0] - row0;
    if (b.n_banned_rows > R) b.n_banned_rows = R;
    b.masked = b.n_ban > 0 && b.n_banned_rows > 0;
    return b;
}

/* ban_bits[r] ← bit j set when candidate row nb0 + j (j < span ≤ 32) is banned for input row r:
 * each block scatters the table entries that fall in its own rows (integer indexing: n_ban loads
 * per input row, no per-candidate search). Block-wide, with its own barriers; masked only. */
static __device__ __forceinline__ void argmax_ban_bits(const int32_t *bans, int row0, const ArgmaxBans &b,
                                                       int64_t nb0, int span, unsigned *ban_bits) {
    if ((int)threadIdx.x < b.n_banned_rows) ban_bits[threadIdx.x] = 0u;
    __syncthreads();
    const int32_t *tab = bans + 2 + (int64_t)row0 * b.n_ban;
    for (int i = threadIdx.x; i < b.n_banned_rows * b.n_ban; i += blockDim.x) {
        const int64_t off = (int64_t)tab[i] - nb0; /* -1 padding never lands in [0, span) */
        if (off >= 0 && off < span) atomicOr(&ban_bits[i / b.n_ban], 1u << (int)off);
    }
    __syncthreads();
}

/* The block's partials from its warps' bests sv / si [2][nw][stride] (m = 1: without the banned
 * ids): thread m·R + r merges input row r over the warps in order (after a barrier). */
static __device__ __forceinline__ void argmax_block_partials(const float *sv, const int *si, int nw, int stride,
                                                             int R, bool masked, float *pv, int32_t *pi,
                                                             int64_t masked_off) {
    if ((int)threadIdx.x >= (masked ? 2 * R : R)) return;
    const int m = threadIdx.x / R, r = threadIdx.x % R;
    float bv = -INFINITY;
    int bi = 0x7fffffff;
    for (int w = 0; w < nw; w++) amax_merge(bv, bi, sv[(m * nw + w) * stride + r], si[(m * nw + w) * stride + r]);
    pv[m * masked_off + (int64_t)blockIdx.x * R + r] = bv;
    pi[m * masked_off + (int64_t)blockIdx.x * R + r] = bi;
}

/* After the block wrote its partials: true in every thread of the last block to finish (an
 * atomic ticket on *counter, which that block resets for the next launch or graph replay). */
static __device__ __forceinline__ bool argmax_last_block(int *counter, int *is_last) {
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) *is_last = atomicAdd(counter, 1) == (int)gridDim.x - 1;
    __syncthreads();
    if (!*is_last) return false;
    __threadfence();
    if (threadIdx.x == 0) *counter = 0;
    return true;
}

/* The last block: warp w merges input rows w, w + nwarps, .. over all blocks' partials (the
 * masked partials of a banned row first, the plain ones when no candidate was left) → ids. */
static __device__ __forceinline__ void argmax_merge_partials(const float *pv, const int32_t *pi,
                                                             int64_t masked_off, int R, const ArgmaxBans &b,
                                                             int32_t *ids) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
    for (int r = warp; r < R; r += nwarps) {
        const bool row_masked = b.masked && r < b.n_banned_rows;
        int best = 0x7fffffff;
        for (int m = row_masked ? 1 : 0; m >= 0 && best == 0x7fffffff; m--) {
            float bv = -INFINITY;
            int bi = 0x7fffffff;
            for (int blk = lane; blk < (int)gridDim.x; blk += 32)
                amax_merge(bv, bi, __ldcg(&pv[m * masked_off + (int64_t)blk * R + r]),
                           __ldcg(&pi[m * masked_off + (int64_t)blk * R + r]));
            warp_amax(bv, bi);
            best = bi; /* the same in every lane after the butterfly */
        }
        if (lane == 0) ids[r] = best == 0x7fffffff ? 0 : best; /* all -inf/NaN: id 0, as argmax */
    }
}

/* The key of candidate (v, i) for atomicMax: larger for a larger value, and for the lower index
 * among equal values (amax_merge's order; −0 counts as +0, which amax_merge finds equal); 0 —
 * below every candidate's key, −inf's included — for NaN, which never wins, and for no
 * candidate. */
static __device__ __forceinline__ unsigned long long amax_key(float v, int i) {
    if (v != v || i == 0x7fffffff) return 0ull;
    const unsigned u = v == 0.f ? 0u : __float_as_uint(v);
    const unsigned ord = (u & 0x80000000u) ? ~u : (u | 0x80000000u);
    return ((unsigned long long)ord << 32) | (unsigned)(0x7fffffff - i);
}

/* argmax_block_partials for atomic keys: thread m·R + r merges input row r over the warps' bests
 * and folds the result into keys[m·8 + r] (m = 1: without the banned ids). */
static __device__ __forceinline__ void argmax_block_keys(const float *sv, const int *si, int nw, int stride,
                                                         int R, bool masked, unsigned long long *keys) {
    if ((int)threadIdx.x >= (masked ? 2 * R : R)) return;
    const int m = threadIdx.x / R, r = threadIdx.x % R;
    float bv = -INFINITY;
    int bi = 0x7fffffff;
    for (int w = 0; w < nw; w++) amax_merge(bv, bi, sv[(m * nw + w) * stride + r], si[(m * nw + w) * stride + r]);
    const unsigned long long key = amax_key(bv, bi);
    if (key) atomicMax(&keys[m * 8 + r], key);
}

/* The last block with atomic keys: ids from the keys (a banned row's key without its banned ids
 * when it has a candidate, else the plain one; no candidate at all: id 0, as argmax), the keys
 * cleared for the next launch or replay. */
static __device__ __forceinline__ void argmax_finish_keys(unsigned long long *keys, int R, const ArgmaxBans &b,
                                                          int32_t *ids) {
    if ((int)threadIdx.x >= R) return;
    const int r = threadIdx.x;
    const unsigned long long plain = atomicExch(&keys[r], 0ull);
    const unsigned long long skip = atomicExch(&keys[8 + r], 0ull);
    const unsigned long long k = b.masked && r < b.n_banned_rows && skip ? skip : plain;
    ids[r] = k ? 0x7fffffff - (int)(unsigned)(k & 0xffffffffull) : 0;
}

#endif
