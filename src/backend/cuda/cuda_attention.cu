/* cuda_attention.cu — gated GQA attention over a paged bf16 KV cache.
 *
 * Three kernels per layer (two in decode steps of two or more sequences of one token each,
 * whose decode kernel does step 1 itself: ctx->attn_fuse_prep):
 *  1. attn_prep: per (token, head): q/k RMSNorm (fp32, rounded to bf16 like the reference's
 *     bf16 activations), partial NeoX RoPE on dims [0, rot), K/V written into the paged cache,
 *     the normed+roped query written into `out` (which has exactly nh·hd per token) so that no
 *     extra workspace is needed; the attention kernels read it back from there.
 *  2a. decode (every sequence has at most DEC_MAX_Q new tokens: decode steps, speculative
 *     verification): flash-decoding split over KV ranges. A block serves one (token, kv head,
 *     split) and all G = nh/nkv query heads that share the kv head, so K/V are read once per
 *     group; a token attends keys [0, its position] (causal, the step's own keys included); tiles of 32 keys are staged in shared memory with
 *     cp.async 16-byte copies (double-buffered: the next tile loads while this one is used);
 *     online softmax; fp32 partials (acc, m, l) go to the cache's workspace.
 *  2b. prefill (any tokens per sequence): a tiled flash kernel on tensor cores. A block serves
 *     64 query rows = (64/G tokens) × G heads of one kv head and walks key tiles of 64 from
 *     position 0 (cache) up to its last query position, causal mask per row.
 *  2c. decode on tensor cores (ctx->attn_dec_tc: by default in steps of two or more sequences
 *     of one token each; G ≤ 8, head_dim ≥ 64): 2a's blocks and splits with both products as
 *     bf16 MMAs.
 *  3. decode only: combine the splits, times sigmoid(gate) → out (by default a (token, head)'s
 *     splits over 16 warps, attn_combine_warps_kernel). (Prefill applies the gate in its
 *     epilogue.) */
#include <limits.h>
#include <math.h>

#include "cuda_launch.cuh"
#include "cuda_mma.cuh"

/* ---- 1. q/k norm + RoPE + KV write --------------------------------------------------------- */

/* One q or k head by one warp (lane owns dims d = lane + 32·e: coalesced loads, conflict-free
 * shared memory): RMSNorm over HD (fp32, rounded to bf16 like the reference's bf16
 * activations), then partial NeoX RoPE on dims [0, rot) at position pos; y[e] = dim
 * lane + 32·e, not yet rounded. scratch: HD floats of shared memory (the rotation's partner
 * dims), free again at return. attn_prep_kernel and the decode kernel's fused prep share it,
 * so both give the same bits. */
template <int HD>
static __device__ __forceinline__ void norm_rope_head(const bf16 *__restrict__ src, const float *__restrict__ w,
                                                      float eps, int rot, const float *__restrict__ inv_freq,
                                                      int pos, float *scratch, float y[HD / 32]) {
    constexpr int EPL = HD / 32;
    const int lane = threadIdx.x & 31;
    float x[EPL];
#pragma unroll
    for (int e = 0; e < EPL; e++) x[e] = to_f32(src[lane + 32 * e]);
    float ss = 0.f;
#pragma unroll
    for (int e = 0; e < EPL; e++) ss += x[e] * x[e];
    ss = warp_sum(ss);
    const float inv = rsqrtf(ss / (float)HD + eps);
#pragma unroll
    for (int e = 0; e < EPL; e++) {
        const int d = lane + 32 * e;
        x[e] = __bfloat162float(__float2bfloat16_rn(x[e] * inv * w[d]));
        scratch[d] = x[e];
    }
    __syncwarp();
    const int half = rot / 2;
#pragma unroll
    for (int e = 0; e < EPL; e++) {
        const int d = lane + 32 * e;
        float v = x[e];
        if (d < rot) {
            const int i = d < half ? d : d - half;
            float sn, cs;
            const float ang = (float)pos * inv_freq[i];
            sincosf(ang, &sn, &cs);
            v = d < half ? x[e] * cs - scratch[d + half] * sn : x[e] * cs + scratch[d - half] * sn;
        }
        y[e] = v;
    }
    __syncwarp();
}

template <int HD>
__global__ void __launch_bounds__(256)
    attn_prep_kernel(ds_cuda_batch b, ds_cuda_attn_args a) {
    pdl_enter(); /* cuda_launch.cuh: first, before any access */
    __shared__ float buf[8][HD];
    constexpr int EPL = HD / 32; /* elements per lane */
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int t = blockIdx.x;
    const int hh = blockIdx.y * 8 + warp;
    const int nh = a.nh, nkv = a.nkv;
    if (hh >= nh + 2 * nkv) return;
    const int64_t ld = (int64_t)nh * 2 * HD + 2 * (int64_t)nkv * HD;
    const bf16 *row = (const bf16 *)a.qkv + (int64_t)t * ld;
    const bf16 *src;
    int kind, j; /* 0 q, 1 k, 2 v */
    if (hh < nh) {
        kind = 0; j = hh; src = row + (int64_t)hh * 2 * HD;
    } else if (hh < nh + nkv) {
        kind = 1; j = hh - nh; src = row + (int64_t)nh * 2 * HD + (int64_t)j * HD;
    } else {
        kind = 2; j = hh - nh - nkv; src = row + (int64_t)nh * 2 * HD + (int64_t)(nkv + j) * HD;
    }
    const int s = b.tok_seq[t];
    const int pos = b.positions[t];
    bf16 *dst;
    if (kind == 0) {
        dst = (bf16 *)a.out + ((int64_t)t * nh + j) * HD;
    } else {
        const int blk = b.block_table[(int64_t)s * b.max_blocks + pos / a.block_size];
        const int64_t off = ((int64_t)blk * a.block_size + pos % a.block_size) * nkv + j;
        dst = (bf16 *)(kind == 1 ? a.k_cache : a.v_cache) + off * HD;
    }
    if (kind == 2) {
#pragma unroll
        for (int e = 0; e < EPL; e++) dst[lane + 32 * e] = src[lane + 32 * e];
        return;
    }
    float y[EPL];
    norm_rope_head<HD>(src, kind == 0 ? a.q_norm : a.k_norm, a.eps, a.rot, a.inv_freq, pos, buf[warp], y);
#pragma unroll
    for (int e = 0; e < EPL; e++) dst[lane + 32 * e] = __float2bfloat16_rn(y[e]);
}

/* ---- 2a. decode: split-KV flash decoding ---------------------------------------------------- */

#define DEC_TILE 32
#define DEC_MAXG 16
/* query tokens per sequence up to which the decode kernel serves a step (one block column per
 * token): decode steps and speculative verification (k + 1 ≤ 5 tokens); longer runs of
 * tokens share key tiles better in the prefill kernel */
#define DEC_MAX_Q 8

/* dynamic shared memory: K and V tiles, double-buffered, then the G queries in fp32 */
template <int HD>
struct DecSmem {
    static constexpr size_t tile_elems = (size_t)DEC_TILE * HD;
    static constexpr size_t kv_bytes = 2 /* buffers */ * 2 /* K, V */ * tile_elems * 2;
    static constexpr size_t bytes = kv_bytes + (size_t)DEC_MAXG * HD * 4;
};

/* Where dimension d of query head g sits in the decode kernel's fp32 query buffer: each head's
 * HD values as two halves, the first four of every 8-dimension chunk, then the last four, so that
 * the score phase's eight lanes of a key (one chunk each, float4 reads of each half) read 128
 * contiguous bytes. With the chunks whole (32 bytes a lane) those reads were two-way bank
 * conflicts: ncu, s30-run2, batch 8: 32 % of the kernel's shared wavefronts excessive, short
 * scoreboard 37 % of its stalls. Same values, same order of arithmetic. */
template <int HD>
static __device__ __forceinline__ int dec_q_index(int g, int d) {
    return g * HD + ((d & 7) >> 2) * (HD / 2) + (d >> 3) * 4 + (d & 3);
}

/* Keys [start, end) of split c of nsplit over a context of L keys: chunk = ⌈⌈L / nsplit⌉ / g⌉·g
 * for the grain g (a.split_grain, 16 or 32: resolved by ds_cuda_op_attention from
 * ctx->attn_split_grain and the step's token count) (start ≥ end: an empty split). A
 * split's tiles start at `start`, so a 16-key chunk is one tile half full. */
static __device__ __forceinline__ int dec_split_chunk(int L, int nsplit, int grain) {
    const int per = (L + nsplit - 1) / nsplit;
    return (per + grain - 1) / grain * grain;
}
static __device__ __forceinline__ void dec_split_range(int L, int c, int nsplit, int grain, int &start, int &end) {
    const int chunk = dec_split_chunk(L, nsplit, grain);
    start = c * chunk;
    end = min(L, start + chunk);
}
/* how many of the nsplit splits over L keys are not empty: splits [0, n) (start = c·chunk < L) */
static __device__ __forceinline__ int dec_split_used(int L, int nsplit, int grain) {
    const int chunk = dec_split_chunk(L, nsplit, grain);
    return min(nsplit, (L + chunk - 1) / chunk);
}

/* The partials of an empty split (its key range starts past the context): m = −∞, l = 0, which
 * the combine skips; NT threads a block. */
template <int HD, int NT>
static __device__ __forceinline__ void dec_write_empty(const ds_cuda_attn_args &a, int t, int j, int G, int nsplit,
                                                       int c) {
    for (int g = 0; g < G; g++) {
        float *w = a.ws + (((int64_t)t * a.nh + j * G + g) * nsplit + c) * (HD + 2);
        for (int d = threadIdx.x; d < HD; d += NT) w[d] = 0.f;
        if (threadIdx.x == 0) {
            w[HD] = -INFINITY;
            w[HD + 1] = 0.f;
        }
    }
}

/* element offset of (row, d) in a swizzled K/V tile (the tensor-core kernel: ldmatrix reads 8 rows
 * without bank conflicts) */
template <int HD>
static __device__ __forceinline__ int dtc_swz(int row, int d) {
    return row * HD + (((d >> 3) ^ (row & 7)) << 3) + (d & 7);
}

/* Copies rows p ∈ [lo, hi) of the key tile that starts at tile0 (keys tile0 … tile0 + 31) of kv
 * head j into K/V buffers Kb, Vb (one tile each) with cp.async, NT threads; rows p ≥ end are
 * not copied: zero-filled when ZFILL (the tensor-core kernel: a stale V row times P = 0 could
 * be 0·NaN), left as they are otherwise (the FMA kernel masks them). SWZ: 16-byte chunk c of
 * row r at chunk c ^ (r & 7) (dtc_swz). Commits nothing (the caller's group). */
template <int HD, int NT, bool SWZ, bool ZFILL>
static __device__ __forceinline__ void dec_copy_rows(bf16 *Kb, bf16 *Vb, const ds_cuda_attn_args &a,
                                                     const int32_t *__restrict__ bt, int j, int tile0,
                                                     int lo, int hi, int end) {
    constexpr int CPR = HD / 8; /* 16-byte chunks per K/V row */
    const bf16 *kc = (const bf16 *)a.k_cache, *vc = (const bf16 *)a.v_cache;
    for (int i = threadIdx.x; i < DEC_TILE * CPR; i += NT) {
        const int kk = i / CPR, ch = i % CPR;
        const int p = tile0 + kk;
        if (p < lo || p >= hi) continue;
        const size_t o = SWZ ? (size_t)dtc_swz<HD>(kk, ch * 8) : (size_t)kk * HD + (size_t)ch * 8;
        if (p < end) {
            const int64_t row = ((int64_t)bt[p / a.block_size] * a.block_size + p % a.block_size) * a.nkv + j;
            cp_async16(Kb + o, kc + row * HD + ch * 8);
            cp_async16(Vb + o, vc + row * HD + ch * 8);
        } else if (ZFILL) {
            cp_async16(Kb + o, kc, 0);
            cp_async16(Vb + o, vc, 0);
        }
    }
}

/* ctx->attn_kv_early (DS_CUDA_ATTN_KV_EARLY): the first tile's keys below `fresh` — the lowest
 * position any token of the block's sequence writes in this step — are copied before the PDL
 * wait, while the prep launch (or, with the prep fused, the qkv projection) still runs. This
 * widens cuda_launch.cuh's contract as the GDN kernel's early state read does (cuda_gdn.cu),
 * soundly: under PDL the kernel starts only once every kernel before its predecessor has
 * completed; those keys were written by earlier steps (and the batch metadata read here —
 * positions, sequence starts, block table — by the step's upload or its first kernel), and the
 * predecessor writes only the keys at the step's own positions, ≥ fresh. Those rows, and an
 * empty split's partials, wait for the predecessor. The same copies, so the same bits. */
static __device__ __forceinline__ int dec_fresh_position(const ds_cuda_batch &b, int s) {
    int fresh = INT_MAX;
    for (int u = b.seq_start[s]; u < b.seq_start[s + 1]; u++) fresh = min(fresh, b.positions[u]);
    return fresh;
}

/* The start of a decode block (NT threads) once it knows its split's keys [start, end): the
 * first tile's copies into buffer 0 — with early, those of keys below dec_fresh_position
 * before the PDL wait, then the wait (without early the caller has waited already) — then
 * either an empty split's partials (returns false: the block is done) or the rest of the first
 * tile, committed as one group with the early one. SWZ: the tensor-core kernel's swizzled,
 * zero-filled tiles (dec_copy_rows). */
template <int HD, int NT, bool SWZ>
static __device__ __forceinline__ bool dec_first_tile(bf16 *Ks, bf16 *Vs, const ds_cuda_batch &b,
                                                      const ds_cuda_attn_args &a, const int32_t *__restrict__ bt,
                                                      int s, int t, int j, int G, int nsplit, int c, int start,
                                                      int end, int early) {
    int early_end = start; /* keys [start, early_end) copied before the wait */
    if (early) {
        if (start < end) {
            early_end = max(start, min(min(end, start + DEC_TILE), dec_fresh_position(b, s)));
            dec_copy_rows<HD, NT, SWZ, SWZ>(Ks, Vs, a, bt, j, start, start, early_end, end);
            cp_async_commit();
        }
        pdl_enter();
    }
    if (start >= end) {
        dec_write_empty<HD, NT>(a, t, j, G, nsplit, c);
        return false;
    }
    dec_copy_rows<HD, NT, SWZ, SWZ>(Ks, Vs, a, bt, j, start, early_end, start + DEC_TILE, end);
    cp_async_commit();
    return true;
}

/* The fused prep of a decode block (PREP): units of work, one warp each over the block's NW
 * warps — the G query heads of kv head j (normed and roped; store_q(u, d, y) keeps dimension d
 * of head u, unrounded), then, in the block whose split holds the token's own position pos
 * (covers), its key and value: written to the cache for later steps and kept in kp / vp for the
 * tile patch. nrm: this warp's HD floats of norm_rope_head scratch. Shared by the FMA and the
 * tensor-core decode kernels, so both prep exactly as the prep launch does. */
template <int HD, int NW, typename StoreQ>
static __device__ __forceinline__ void decode_prep(const ds_cuda_attn_args &a, int t, int j, int G, int pos,
                                                   const int32_t *__restrict__ bt, bool covers, float *nrm,
                                                   bf16 *kp, bf16 *vp, StoreQ store_q) {
    constexpr int EPL = HD / 32;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int nh = a.nh, nkv = a.nkv, bs = a.block_size;
    const int64_t ld = (int64_t)nh * 2 * HD + 2 * (int64_t)nkv * HD;
    const bf16 *row = (const bf16 *)a.qkv + (int64_t)t * ld;
    for (int u = warp; u < G + 2; u += NW) {
        float y[EPL];
        if (u < G) {
            norm_rope_head<HD>(row + (int64_t)(j * G + u) * 2 * HD, a.q_norm, a.eps, a.rot, a.inv_freq, pos, nrm, y);
#pragma unroll
            for (int e = 0; e < EPL; e++) store_q(u, lane + 32 * e, y[e]);
            continue;
        }
        if (!covers) break;
        const int blk = bt[pos / bs];
        const int64_t off = (((int64_t)blk * bs + pos % bs) * nkv + j) * HD;
        if (u == G) {
            norm_rope_head<HD>(row + (int64_t)nh * 2 * HD + (int64_t)j * HD, a.k_norm, a.eps, a.rot, a.inv_freq,
                               pos, nrm, y);
#pragma unroll
            for (int e = 0; e < EPL; e++) {
                const bf16 kv = __float2bfloat16_rn(y[e]);
                kp[lane + 32 * e] = kv;
                ((bf16 *)a.k_cache)[off + lane + 32 * e] = kv;
            }
        } else {
            const bf16 *vsrc = row + (int64_t)nh * 2 * HD + (int64_t)(nkv + j) * HD;
#pragma unroll
            for (int e = 0; e < EPL; e++) {
                const bf16 vv = vsrc[lane + 32 * e];
                vp[lane + 32 * e] = vv;
                ((bf16 *)a.v_cache)[off + lane + 32 * e] = vv;
            }
        }
    }
}

/* A block serves (token t of sequence s, kv head j, split c) and the G query heads sharing j.
 * The split count is fixed by the launch (it depends on the number of tokens only, so a
 * captured graph stays valid as the context grows); each block finds its key range
 * [start, end) from the token's position on the device: chunk = ⌈⌈L / nsplit⌉ / 32⌉·32. Splits past the
 * context write an empty partial (m = −∞, l = 0) that the combine skips.
 * LMAX: the most lanes a key takes in the score phase. 8 (ctx->attn_lanes8): at head_dim 256 a
 * warp pass scores 4 keys with 3 shuffle levels per (key, head), where 32 lanes a key scored
 * one key with 5 levels — the G heads' reductions were the phase's dependent chain.
 * PREP (steps of two or more sequences, each feeding one token; ctx->attn_fuse_prep): no attn_prep launch
 * before this one. Every block norms and ropes its G query heads itself from the qkv row
 * (norm_rope_head, the prep kernel's arithmetic), and the one block whose key range holds the
 * token's own position also computes the token's key and value: it writes them to the cache
 * (for later steps) and patches them into its staged tile (the tile may have been copied from
 * the cache before its own write landed). With one token per sequence no other block reads
 * that key in this step. */
template <int HD, int LMAX, bool PREP>
__global__ void __launch_bounds__(HD)
    attn_decode_kernel(ds_cuda_batch b, ds_cuda_attn_args a, int G, int nsplit, int early) {
    if (!early) pdl_enter(); /* cuda_launch.cuh: first, before any access (early: below) */
    constexpr int NW = HD / 32;
    constexpr int CPR = HD / 8;                 /* 16-byte chunks per K/V row */
    constexpr int LPK = CPR < LMAX ? CPR : LMAX; /* lanes per key in the score phase */
    constexpr int KPW = 32 / LPK;               /* keys per warp pass */
    constexpr int CPL = CPR / LPK;              /* chunks per lane */
    typedef DecSmem<HD> SM;
    extern __shared__ __align__(16) unsigned char dsmem[];
    bf16 *Ks = reinterpret_cast<bf16 *>(dsmem);         /* [2][DEC_TILE][HD] */
    bf16 *Vs = Ks + 2 * SM::tile_elems;                  /* [2][DEC_TILE][HD] */
    float *qs = reinterpret_cast<float *>(dsmem + SM::kv_bytes); /* [DEC_MAXG][HD], dec_q_index */
    __shared__ __align__(16) float sc[DEC_MAXG][DEC_TILE];
    __shared__ float m_s[DEC_MAXG], l_s[DEC_MAXG], al_s[DEC_MAXG];
    __shared__ float nrm[PREP ? NW : 1][HD];                 /* norm_rope_head's scratch */
    __shared__ __align__(16) bf16 kp[PREP ? HD : 8], vp[PREP ? HD : 8]; /* the new key, value */

    const int t = blockIdx.x, j = blockIdx.y, c = blockIdx.z;
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int nh = a.nh;
    const int s = b.tok_seq[t];
    const int L = b.positions[t] + 1; /* causal: keys up to this token's own position */
    int start, end;
    dec_split_range(L, c, nsplit, a.split_grain, start, end);
    const int32_t *bt = b.block_table + (int64_t)s * b.max_blocks;

    /* cooperative copy of keys [tile0, min(tile0 + 32, end)) into buffer buf */
    auto load_tile = [&](int buf, int tile0) {
        dec_copy_rows<HD, HD, false, false>(Ks + (size_t)buf * SM::tile_elems, Vs + (size_t)buf * SM::tile_elems,
                                            a, bt, j, tile0, tile0, tile0 + DEC_TILE, end);
        cp_async_commit();
    };
    if (!dec_first_tile<HD, HD, false>(Ks, Vs, b, a, bt, s, t, j, G, nsplit, c, start, end, early))
        return; /* an empty split */

    const int pos = L - 1;                          /* the token's own position */
    const bool covers = PREP && pos >= start && pos < end; /* this split holds it */
    if (PREP) {
        decode_prep<HD, NW>(a, t, j, G, pos, bt, covers, nrm[warp], kp, vp, [&](int u, int d, float y) {
            /* rounded to bf16 as prep's q, then scaled */
            qs[dec_q_index<HD>(u, d)] = __bfloat162float(__float2bfloat16_rn(y)) * a.scale;
        });
    } else {
        for (int g = 0; g < G; g++)
            qs[dec_q_index<HD>(g, tid)] = to_f32(((const bf16 *)a.out)[((int64_t)t * nh + j * G + g) * HD + tid]) * a.scale;
    }
    if (tid < G) {
        m_s[tid] = -INFINITY;
        l_s[tid] = 0.f;
    }
    float acc[DEC_MAXG];
#pragma unroll
    for (int g = 0; g < DEC_MAXG; g++) acc[g] = 0.f;

    int buf = 0;
    for (int tile0 = start; tile0 < end; tile0 += DEC_TILE, buf ^= 1) {
        if (tile0 + DEC_TILE < end) {
            load_tile(buf ^ 1, tile0 + DEC_TILE);
            cp_async_wait<1>(); /* this tile's group is complete, the next may still fly */
        } else {
            cp_async_wait<0>();
        }
        __syncthreads();
        if (covers && pos < tile0 + DEC_TILE) { /* the tile holding the new key: patched */
            const size_t o = (size_t)buf * SM::tile_elems + (size_t)(pos - tile0) * HD + tid;
            Ks[o] = kp[tid];
            Vs[o] = vp[tid];
            __syncthreads();
        }
        const bf16 *Kt = Ks + (size_t)buf * SM::tile_elems;
        const bf16 *Vt = Vs + (size_t)buf * SM::tile_elems;
        /* A: scores. LPK lanes per key, each with CPL 16-byte chunks of the head dim. Lanes of
         * keys past `end` read stale shared memory; their scores are replaced by −∞. */
        for (int k0 = warp * KPW; k0 < DEC_TILE; k0 += NW * KPW) {
            const int kk = k0 + lane / LPK, sub = lane % LPK;
            float kf[CPL][8];
#pragma unroll
            for (int cc = 0; cc < CPL; cc++)
                unpack8(*reinterpret_cast<const uint4 *>(Kt + (size_t)kk * HD + (sub + LPK * cc) * 8), kf[cc]);
            const bool valid = tile0 + kk < end;
#pragma unroll
            for (int g = 0; g < DEC_MAXG; g++) {
                if (g >= G) break;
                float part = 0.f;
#pragma unroll
                for (int cc = 0; cc < CPL; cc++) {
                    const float *qg = qs + g * HD + (sub + LPK * cc) * 4; /* dec_q_index */
                    const float4 q0 = *reinterpret_cast<const float4 *>(qg);
                    const float4 q1 = *reinterpret_cast<const float4 *>(qg + HD / 2);
                    part = fmaf(q0.x, kf[cc][0], part);
                    part = fmaf(q0.y, kf[cc][1], part);
                    part = fmaf(q0.z, kf[cc][2], part);
                    part = fmaf(q0.w, kf[cc][3], part);
                    part = fmaf(q1.x, kf[cc][4], part);
                    part = fmaf(q1.y, kf[cc][5], part);
                    part = fmaf(q1.z, kf[cc][6], part);
                    part = fmaf(q1.w, kf[cc][7], part);
                }
#pragma unroll
                for (int o = LPK / 2; o > 0; o >>= 1) part += __shfl_xor_sync(0xffffffffu, part, o);
                if (sub == 0) sc[g][kk] = valid ? part : -INFINITY;
            }
        }
        __syncthreads();
        /* B: online softmax per head; a warp per head, a lane per key */
        for (int g = warp; g < G; g += NW) {
            const float v = sc[g][lane];
            const float mold = m_s[g];
            const float mnew = fmaxf(mold, warp_max(v)); /* finite: key tile0 is valid */
            const float p = v == -INFINITY ? 0.f : expf(v - mnew);
            const float sum = warp_sum(p);
            sc[g][lane] = p;
            __syncwarp();
            if (lane == 0) {
                const float al = expf(mold - mnew); /* mold = -inf → 0 */
                al_s[g] = al;
                l_s[g] = l_s[g] * al + sum;
                m_s[g] = mnew;
            }
        }
        __syncthreads();
        /* C: acc[g] (dim tid) = acc·alpha + Σ_k p·V[k, tid], V from shared memory */
#pragma unroll
        for (int g = 0; g < DEC_MAXG; g++)
            if (g < G) acc[g] *= al_s[g];
        /* four keys at a time: each head's four weights are one float4 read (a broadcast), where
         * a read a (key, head) made this loop most of the kernel's shared-memory instructions
         * (s30-run2); each acc[g] still adds its keys in ascending order, so the same bits */
        const int nk = min(DEC_TILE, end - tile0);
        int kk = 0;
        for (; kk + 4 <= nk; kk += 4) {
            float v[4];
#pragma unroll
            for (int i = 0; i < 4; i++) v[i] = to_f32(Vt[(size_t)(kk + i) * HD + tid]);
#pragma unroll
            for (int g = 0; g < DEC_MAXG; g++) {
                if (g >= G) break;
                const float4 p = *reinterpret_cast<const float4 *>(&sc[g][kk]);
                acc[g] = fmaf(p.x, v[0], acc[g]);
                acc[g] = fmaf(p.y, v[1], acc[g]);
                acc[g] = fmaf(p.z, v[2], acc[g]);
                acc[g] = fmaf(p.w, v[3], acc[g]);
            }
        }
        for (; kk < nk; kk++) { /* the last tile's remainder (keys past `end` hold stale V) */
            const float v = to_f32(Vt[(size_t)kk * HD + tid]);
#pragma unroll
            for (int g = 0; g < DEC_MAXG; g++)
                if (g < G) acc[g] = fmaf(sc[g][kk], v, acc[g]);
        }
        __syncthreads(); /* buffer buf is refilled two tiles later */
    }
#pragma unroll
    for (int g = 0; g < DEC_MAXG; g++) { /* constant indices keep acc[] in registers */
        if (g >= G) break;
        const int64_t r = ((int64_t)t * nh + j * G + g) * nsplit + c;
        float *w = a.ws + r * (HD + 2);
        w[tid] = acc[g];
        if (tid == 0) {
            w[HD] = m_s[g];
            w[HD + 1] = l_s[g];
        }
    }
}

/* ---- 2c. decode on tensor cores (ctx->attn_dec_tc) ------------------------------------------ */

/* The same work as attn_decode_kernel — a block per (token, kv head, split) and the G ≤ 8 query
 * heads sharing the kv head — with both products as bf16 m16n8k16 MMAs over 32-key tiles, where
 * the FMA form spent most of its time on shared-memory reads of q and of the weights (ncu,
 * s30-run2: 29 µs at batch 8 after a 1024-token prompt, ~5× its K/V bytes at the copy rate).
 * The heads are the MMA's n = 8 columns:
 *   scores Sᵀ[key, g] = K[key, :]·q_g — A = the K tile (ldmatrix), B = the bf16 queries (held
 *     in registers), 4 warps = 2 key halves × 2 head-dim halves, summed in shared memory;
 *   Oᵀ[d, g] += Vᵀ[d, key]·Pᵀ[key, g] — A = the V tile transposed (ldmatrix.trans), B = P as bf16
 *     hi + lo halves (two MMAs: P to ~2⁻¹⁷, as the prefill kernel's PV16 form), a warp a quarter
 *     of the head dims.
 * q and k are bf16 already (q·k exact products, fp32 sums), so only the order of the sums and P's
 * last bits differ from the FMA form: not the same bits. K/V tiles are stored with 16-byte chunk
 * c of row r at chunk c ^ (r & 7) (no bank conflicts for ldmatrix's 8 rows); rows past the key
 * range are zero-filled (a stale V row times P = 0 could be 0·NaN). PREP as attn_decode_kernel. */
#define DTC_THREADS 128
#define DTC_G 8 /* heads a block: one n tile */

template <int HD>
struct DecTcSmem {
    static constexpr int QSTR = HD + 8;         /* bf16 query row pitch: conflict-free B loads */
    static constexpr int PSTR = DEC_TILE + 8;   /* bf16 P row pitch */
    static constexpr size_t tile_elems = (size_t)DEC_TILE * HD;
    static constexpr size_t kv_bytes = 2 /* buffers */ * 2 /* K, V */ * tile_elems * 2;
    static constexpr size_t bytes = kv_bytes + (size_t)DTC_G * QSTR * 2;
};

template <int HD, bool PREP>
__global__ void __launch_bounds__(DTC_THREADS)
    attn_decode_tc_kernel(ds_cuda_batch b, ds_cuda_attn_args a, int G, int nsplit, int early) {
    if (!early) pdl_enter(); /* cuda_launch.cuh: first, before any access (early: below) */
    static_assert(HD >= 64 && HD % 64 == 0, "swizzle over 8 chunks; a warp 16·k of the head dims");
    constexpr int NW = DTC_THREADS / 32;
    constexpr int KH = HD / 32;        /* k steps of 16 per head-dim half (score phase) */
    constexpr int MT = HD / 64;        /* m tiles of 16 dims per warp (P·V phase) */
    typedef DecTcSmem<HD> SM;
    extern __shared__ __align__(16) unsigned char dsmem[];
    bf16 *Ks = reinterpret_cast<bf16 *>(dsmem);                 /* [2][DEC_TILE][HD] swizzled */
    bf16 *Vs = Ks + 2 * SM::tile_elems;                          /* [2][DEC_TILE][HD] swizzled */
    bf16 *Qs = reinterpret_cast<bf16 *>(dsmem + SM::kv_bytes);   /* [DTC_G][QSTR] */
    /* score halves [dim half][head][key], rows padded by 4 floats: the softmax's lanes read 32
     * consecutive keys of a head, and the score stores' lanes (key lg, heads 2·lt, 2·lt + 1)
     * land on banks 8·lt + lg — both conflict-free (the [key][head] layout read at an 8-float
     * stride: 8-way conflicts, 32 % of the kernel's shared wavefronts in ncu, s32-run1) */
    __shared__ float sp[2][DTC_G][DEC_TILE + 4];
    __shared__ __align__(16) bf16 ph[DTC_G][SM::PSTR], pl[DTC_G][SM::PSTR]; /* P = hi + lo */
    __shared__ float m_s[DTC_G], l_s[DTC_G], al_s[DTC_G];
    __shared__ float nrm[PREP ? NW : 1][HD];                     /* norm_rope_head's scratch */
    __shared__ __align__(16) bf16 kp[PREP ? HD : 8], vp[PREP ? HD : 8];

    const int t = blockIdx.x, j = blockIdx.y, c = blockIdx.z;
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int lg = lane >> 2, lt = lane & 3; /* MMA fragment row group, thread in group */
    const int nh = a.nh;
    const int s = b.tok_seq[t];
    const int L = b.positions[t] + 1; /* causal: keys up to this token's own position */
    int start, end;
    dec_split_range(L, c, nsplit, a.split_grain, start, end);
    const int32_t *bt = b.block_table + (int64_t)s * b.max_blocks;

    auto load_tile = [&](int buf, int tile0) {
        dec_copy_rows<HD, DTC_THREADS, true, true>(Ks + (size_t)buf * SM::tile_elems,
                                                   Vs + (size_t)buf * SM::tile_elems, a, bt, j, tile0,
                                                   tile0, tile0 + DEC_TILE, end);
        cp_async_commit();
    };
    if (!dec_first_tile<HD, DTC_THREADS, true>(Ks, Vs, b, a, bt, s, t, j, G, nsplit, c, start, end, early))
        return; /* an empty split */

    const int pos = L - 1;
    const bool covers = PREP && pos >= start && pos < end;
    if (PREP) {
        decode_prep<HD, NW>(a, t, j, G, pos, bt, covers, nrm[warp], kp, vp,
                            [&](int u, int d, float y) { Qs[u * SM::QSTR + d] = __float2bfloat16_rn(y); });
    } else {
        for (int i = tid; i < G * HD; i += DTC_THREADS)
            Qs[(i / HD) * SM::QSTR + i % HD] = ((const bf16 *)a.out)[((int64_t)t * nh + j * G) * HD + i];
    }
    const bf16 zero = __float2bfloat16_rn(0.f);
    for (int i = G * HD + tid; i < DTC_G * HD; i += DTC_THREADS) Qs[(i / HD) * SM::QSTR + i % HD] = zero;
    if (tid < DTC_G) {
        m_s[tid] = -INFINITY;
        l_s[tid] = 0.f;
    }
    __syncthreads();

    /* score phase roles: key half (16 keys, one m tile) and head-dim half; the half's query
     * B fragments stay in registers for the whole range */
    const int kh_key = warp & 1, kh_dim = warp >> 1;
    uint32_t qb[KH][2];
#pragma unroll
    for (int ks = 0; ks < KH; ks++) {
        const bf16 *q = Qs + lg * SM::QSTR + kh_dim * (HD / 2) + ks * 16 + 2 * lt;
        qb[ks][0] = *reinterpret_cast<const uint32_t *>(q);
        qb[ks][1] = *reinterpret_cast<const uint32_t *>(q + 8);
    }
    float acc[MT][4];
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int i = 0; i < 4; i++) acc[mt][i] = 0.f;

    int buf = 0;
    for (int tile0 = start; tile0 < end; tile0 += DEC_TILE, buf ^= 1) {
        if (tile0 + DEC_TILE < end) {
            load_tile(buf ^ 1, tile0 + DEC_TILE);
            cp_async_wait<1>();
        } else {
            cp_async_wait<0>();
        }
        __syncthreads();
        if (covers && pos < tile0 + DEC_TILE) { /* the tile holding the new key: patched */
            const size_t o = (size_t)buf * SM::tile_elems;
            for (int d = tid; d < HD; d += DTC_THREADS) {
                Ks[o + dtc_swz<HD>(pos - tile0, d)] = kp[d];
                Vs[o + dtc_swz<HD>(pos - tile0, d)] = vp[d];
            }
            __syncthreads();
        }
        const bf16 *Kt = Ks + (size_t)buf * SM::tile_elems;
        const bf16 *Vt = Vs + (size_t)buf * SM::tile_elems;
        /* A: partial scores of 16 keys × 8 heads over half the head dims */
        {
            float sc4[4] = {0.f, 0.f, 0.f, 0.f};
            const int arow = kh_key * 16 + (lane & 7) + ((lane >> 3) & 1) * 8;
#pragma unroll
            for (int ks = 0; ks < KH; ks++) {
                const int d = kh_dim * (HD / 2) + ks * 16 + (lane >> 4) * 8;
                uint32_t af[4];
                ldmatrix_x4(af, (uint32_t)__cvta_generic_to_shared(Kt + dtc_swz<HD>(arow, d)));
                mma_bf16_16816(sc4, af[0], af[1], af[2], af[3], qb[ks][0], qb[ks][1]);
            }
            const int k0 = kh_key * 16 + lg;
            sp[kh_dim][2 * lt][k0] = sc4[0];
            sp[kh_dim][2 * lt + 1][k0] = sc4[1];
            sp[kh_dim][2 * lt][k0 + 8] = sc4[2];
            sp[kh_dim][2 * lt + 1][k0 + 8] = sc4[3];
        }
        __syncthreads();
        /* B: online softmax, a warp per two heads, a lane per key; heads ≥ G get P = 0 */
#pragma unroll
        for (int hh = 0; hh < 2; hh++) {
            const int g = 2 * warp + hh;
            float p = 0.f;
            if (g < G) {
                const bool valid = tile0 + lane < end;
                const float v = valid ? (sp[0][g][lane] + sp[1][g][lane]) * a.scale : -INFINITY;
                const float mold = m_s[g];
                const float mnew = fmaxf(mold, warp_max(v)); /* finite: key tile0 is valid */
                p = valid ? expf(v - mnew) : 0.f;
                const float sum = warp_sum(p);
                if (lane == 0) {
                    const float al = expf(mold - mnew);
                    al_s[g] = al;
                    l_s[g] = l_s[g] * al + sum;
                    m_s[g] = mnew;
                }
            } else if (lane == 0) {
                al_s[g] = 1.f;
            }
            const bf16 hi = __float2bfloat16_rn(p);
            ph[g][lane] = hi;
            pl[g][lane] = __float2bfloat16_rn(p - __bfloat162float(hi));
        }
        __syncthreads();
        /* C: this warp's MT m tiles of 16 head dims; acc = acc·α + Vᵀ·P over the tile's keys */
        {
            const float a0 = al_s[2 * lt], a1 = al_s[2 * lt + 1];
#pragma unroll
            for (int mt = 0; mt < MT; mt++) {
                acc[mt][0] *= a0;
                acc[mt][1] *= a1;
                acc[mt][2] *= a0;
                acc[mt][3] *= a1;
            }
#pragma unroll
            for (int kq = 0; kq < DEC_TILE / 16; kq++) {
                const bf16 *hrow = &ph[lg][kq * 16 + 2 * lt], *lrow = &pl[lg][kq * 16 + 2 * lt];
                const uint32_t bh0 = *reinterpret_cast<const uint32_t *>(hrow);
                const uint32_t bh1 = *reinterpret_cast<const uint32_t *>(hrow + 8);
                const uint32_t bl0 = *reinterpret_cast<const uint32_t *>(lrow);
                const uint32_t bl1 = *reinterpret_cast<const uint32_t *>(lrow + 8);
                /* matrix i: keys kq·16 + 8(i >> 1) …, dims d0 + 8(i & 1) … (transposed: a_i) */
                const int vrow = kq * 16 + ((lane >> 4) << 3) + (lane & 7);
#pragma unroll
                for (int mt = 0; mt < MT; mt++) {
                    const int d = warp * (HD / 4) + mt * 16 + ((lane >> 3) & 1) * 8;
                    uint32_t vf[4];
                    ldmatrix_x4_trans(vf, Vt + dtc_swz<HD>(vrow, d));
                    mma_bf16_16816(acc[mt], vf[0], vf[1], vf[2], vf[3], bh0, bh1);
                    mma_bf16_16816(acc[mt], vf[0], vf[1], vf[2], vf[3], bl0, bl1);
                }
            }
        }
        __syncthreads(); /* buffer buf is refilled two tiles later; sp, ph, pl rewritten */
    }
    /* partials: acc[mt] holds dims (d0 + lg, d0 + lg + 8) of heads (2·lt, 2·lt + 1) */
#pragma unroll
    for (int hh = 0; hh < 2; hh++) {
        const int g = 2 * lt + hh;
        if (g >= G) continue;
        float *w = a.ws + (((int64_t)t * nh + j * G + g) * nsplit + c) * (HD + 2);
#pragma unroll
        for (int mt = 0; mt < MT; mt++) {
            const int d0 = warp * (HD / 4) + mt * 16 + lg;
            w[d0] = acc[mt][hh];
            w[d0 + 8] = acc[mt][2 + hh];
        }
    }
    if (tid < G) {
        float *w = a.ws + (((int64_t)t * nh + j * G + tid) * nsplit + c) * (HD + 2);
        w[HD] = m_s[tid];
        w[HD + 1] = l_s[tid];
    }
}

/* ---- 3. decode combine + output gate -------------------------------------------------------- */

template <int HD>
__global__ void __launch_bounds__(HD)
    attn_combine_kernel(ds_cuda_batch b, ds_cuda_attn_args a, int nsplit) {
    pdl_enter(); /* cuda_launch.cuh: first, before any access */
    /* The splits are combined in parallel rather than walked by every thread: each thread
     * loads the (m, l) of its splits, the block reduces the maximum and the denominator, and
     * each thread then sums its dimension over the non-empty splits with independent loads. */
    __shared__ float sf[DS_CUDA_ATTN_MAX_SPLIT]; /* exp(m_c − M), 0 for empty splits */
    __shared__ float red[32];
    const int t = blockIdx.x, h = blockIdx.y, d = threadIdx.x;
    const int nh = a.nh, lane = d & 31, warp = d >> 5;
    const float *w = a.ws + ((int64_t)t * nh + h) * nsplit * (HD + 2);
    float mx = -INFINITY;
    for (int c = d; c < nsplit; c += HD) mx = fmaxf(mx, w[c * (HD + 2) + HD]);
    mx = warp_max(mx);
    if (lane == 0) red[warp] = mx;
    __syncthreads();
    float M = -INFINITY;
    for (int i = 0; i < HD / 32; i++) M = fmaxf(M, red[i]);
    __syncthreads(); /* red is reused by block_sum */
    float dpart = 0.f;
    for (int c = d; c < nsplit; c += HD) {
        const float m = w[c * (HD + 2) + HD];
        const float f = m == -INFINITY ? 0.f : expf(m - M);
        sf[c] = f;
        dpart += f * w[c * (HD + 2) + HD + 1];
    }
    const float den = block_sum(dpart, red); /* its barriers also publish sf */
    float num = 0.f;
#pragma unroll 4
    for (int c = 0; c < nsplit; c++) {
        const float f = sf[c];
        if (f != 0.f) num += f * w[c * (HD + 2) + d];
    }
    const int64_t ld = (int64_t)nh * 2 * HD + 2 * (int64_t)a.nkv * HD;
    const float gate = to_f32(((const bf16 *)a.qkv)[(int64_t)t * ld + (int64_t)h * 2 * HD + HD + d]);
    const float o = den > 0.f ? num / den : 0.f;
    ((bf16 *)a.out)[((int64_t)t * nh + h) * HD + d] = __float2bfloat16_rn(o * sigmoid_f(gate));
}

/* The combine with a (token, head)'s splits spread over the block's warps (ctx->attn_combine_warps).
 * attn_combine_kernel walks the splits in every thread, four loads in flight: at batch 1 (64
 * splits, 33-48 of them used after 1024-1536 tokens) that is ~9-12 dependent round trips to L2 in a
 * kernel on the step's critical path. Here warp w of 16 takes splits w, w + 16, …, below the used
 * count (dec_split_used: empty splits are not read), and issues all of their loads at once —
 * (m, l) and its lanes' dims as float2s 64 dims apart (coalesced 256-byte rows) — then
 * reduces them against its own maximum M_w; the block then merges the 16 (M_w, L_w, num_w)
 * through shared memory against M = max M_w: one round trip, one barrier. The same partials,
 * another order of summation (test_cuda_ops compares with the CPU). */
#define CMB_WARPS 16
template <int HD>
__global__ void __launch_bounds__(CMB_WARPS * 32)
    attn_combine_warps_kernel(ds_cuda_batch b, ds_cuda_attn_args a, int nsplit) {
    pdl_enter(); /* cuda_launch.cuh: first, before any access */
    static_assert(HD % 64 == 0, "a lane's dims as float2 pairs 64 dims apart");
    constexpr int NP = HD / 64;                              /* float2 pairs a lane a split */
    constexpr int SPW = DS_CUDA_ATTN_MAX_SPLIT / CMB_WARPS;  /* splits a warp at most */
    constexpr int DPT = (HD + CMB_WARPS * 32 - 1) / (CMB_WARPS * 32); /* output dims a thread */
    __shared__ float s_m[CMB_WARPS], s_l[CMB_WARPS];
    __shared__ __align__(8) float s_num[CMB_WARPS][HD];
    const int t = blockIdx.x, h = blockIdx.y;
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int nh = a.nh;
    const int64_t ld = (int64_t)nh * 2 * HD + 2 * (int64_t)a.nkv * HD;
    const bf16 *gate = (const bf16 *)a.qkv + (int64_t)t * ld + (int64_t)h * 2 * HD + HD;
    float gv[DPT];
#pragma unroll
    for (int k = 0; k < DPT; k++) {
        const int d = tid + k * CMB_WARPS * 32;
        gv[k] = d < HD ? to_f32(gate[d]) : 0.f;
    }
    const int used = dec_split_used(b.positions[t] + 1, nsplit, a.split_grain);
    const float *w = a.ws + ((int64_t)t * nh + h) * nsplit * (HD + 2);
    float mv[SPW], lv[SPW];
    float2 v[SPW][NP];
#pragma unroll
    for (int i = 0; i < SPW; i++) {
        const int c = warp + CMB_WARPS * i;
        mv[i] = -INFINITY;
        lv[i] = 0.f;
#pragma unroll
        for (int p = 0; p < NP; p++) v[i][p] = make_float2(0.f, 0.f);
        if (c < used) {
            const float *r = w + (int64_t)c * (HD + 2);
            mv[i] = r[HD];
            lv[i] = r[HD + 1];
#pragma unroll
            for (int p = 0; p < NP; p++) v[i][p] = *reinterpret_cast<const float2 *>(r + 64 * p + 2 * lane);
        }
    }
    float mw = -INFINITY; /* the same in every lane: each reads the same (m, l) */
#pragma unroll
    for (int i = 0; i < SPW; i++) mw = fmaxf(mw, mv[i]);
    float lw = 0.f;
    float2 num[NP];
#pragma unroll
    for (int p = 0; p < NP; p++) num[p] = make_float2(0.f, 0.f);
#pragma unroll
    for (int i = 0; i < SPW; i++) {
        const float f = mv[i] == -INFINITY ? 0.f : expf(mv[i] - mw);
        lw += f * lv[i];
#pragma unroll
        for (int p = 0; p < NP; p++) {
            num[p].x += f * v[i][p].x;
            num[p].y += f * v[i][p].y;
        }
    }
    if (lane == 0) {
        s_m[warp] = mw;
        s_l[warp] = lw;
    }
#pragma unroll
    for (int p = 0; p < NP; p++) *reinterpret_cast<float2 *>(&s_num[warp][64 * p + 2 * lane]) = num[p];
    __syncthreads();
    float M = -INFINITY;
#pragma unroll
    for (int u = 0; u < CMB_WARPS; u++) M = fmaxf(M, s_m[u]); /* finite: split 0 holds key 0 */
    float e[CMB_WARPS], den = 0.f;
#pragma unroll
    for (int u = 0; u < CMB_WARPS; u++) {
        e[u] = s_m[u] == -INFINITY ? 0.f : expf(s_m[u] - M);
        den += e[u] * s_l[u];
    }
#pragma unroll
    for (int k = 0; k < DPT; k++) {
        const int d = tid + k * CMB_WARPS * 32;
        if (d >= HD) break;
        float o = 0.f;
#pragma unroll
        for (int u = 0; u < CMB_WARPS; u++) o += e[u] * s_num[u][d];
        o = den > 0.f ? o / den : 0.f;
        ((bf16 *)a.out)[((int64_t)t * nh + h) * HD + d] = __float2bfloat16_rn(o * sigmoid_f(gv[k]));
    }
}

/* ---- 2b. prefill: tiled flash attention on tensor cores ------------------------------------ */

#define PF_ROWS 64
#define PF_KEYS 64
#define PF_THREADS 256

/* Pitches chosen so that every mma fragment's 32 shared reads fall in distinct banks: Q / K rows
 * (HD + 8) bf16 (a word stride ≡ 4 mod 32), V rows (HD + 16) bf16 (≡ 8; HD + 8 for ldmatrix's
 * eight 16-byte rows under PV16), P rows 68 floats, P's bf16 halves (PV16) rows 72 bf16. */
template <int HD>
struct PfSmem {
    static constexpr int QS = HD + 8, VS = HD + 16, PS = PF_KEYS + 4, PH = PF_KEYS + 8;
    static constexpr size_t q_off = 0;
    static constexpr size_t k_off = q_off + (size_t)PF_ROWS * QS * 2;
    static constexpr size_t v_off = k_off + (size_t)PF_KEYS * QS * 2;
    static constexpr size_t p_off = v_off + (size_t)PF_KEYS * VS * 2;
    static constexpr size_t st_off = p_off + (size_t)PF_ROWS * PS * 4;
    static constexpr size_t bytes = st_off + 4 * PF_ROWS * 4;
    static constexpr size_t ph_off = bytes; /* PV16 only: P's hi and lo halves [PF_ROWS][PH] bf16 */
    static constexpr size_t bytes_pv16 = ph_off + 2 * (size_t)PF_ROWS * PH * 2;
    /* P1 only: Q, K, V (pitch QS), P [PF_ROWS][PH] bf16, the SMR row maxima / sums [4][PF_ROWS],
     * rpos [PF_ROWS]: 109 KB at HD 256, so two blocks fit an SM's 228 KB */
    static constexpr size_t p1_ph_off = k_off + 2 * (size_t)PF_KEYS * QS * 2;
    static constexpr size_t p1_part_off = p1_ph_off + (size_t)PF_ROWS * PH * 2;
    static constexpr size_t p1_rpos_off = p1_part_off + 4 * (size_t)PF_ROWS * 4;
    static constexpr size_t bytes_p1 = p1_rpos_off + (size_t)PF_ROWS * 4;
};

/* Eight warps; per key tile of 64:
 *   S = Q·Kᵀ   warp w: rows 16(w mod 4) …, keys 32(w / 4) …: m16n8k16 bf16 (Q and K are bf16,
 *              so every product is exact, fp32 sums), scaled and masked into P (fp32);
 *   softmax    online, 4 threads a row (fp32, as before);
 *   O += P·V   warp w: rows 16(w mod 4) …, head dims HD/2·(w / 4) …: m16n8k8 in tf32 with P
 *              split hi + lo and V exact as tf32 (a bf16 fits 11 bits), i.e. fp32-level P·V;
 *              O in registers (C fragments) across tiles.
 * PIPE (ctx->attn_pf_pipe, DS_CUDA_ATTN_PF_PIPE): false, each K/V tile is copied in after the
 * previous tile is done and waited for in full; true, K and V are two copy groups, the next
 * K copied in once S is done (under the softmax and P·V), the next V once P·V is done (under
 * the next S and softmax), and the blocks run their query tiles last first (a causal tile's
 * work grows with its position: the longest start in the first wave). Why: at 120 KB of
 * shared memory a block, an SM holds one block of eight warps, which had nothing to run while
 * each tile's copies were in flight (245 µs a layer at 1024 tokens on the H100, s20-run4). The
 * same products in the same order: the same bits.
 * PV16 (ctx->attn_pf_pv16, DS_CUDA_ATTN_PF_PV16; with PIPE only): O += P·V as m16n8k16 bf16 with
 * P split into bf16 halves hi + lo (written by the softmax) and V's fragments by ldmatrix.trans:
 * half the MMAs and no per-element V loads and conversions of the tf32 form. P = hi + lo to
 * ~2⁻¹⁷ relative (the tf32 split: ~2⁻²¹), far below the bf16 output's rounding; not the same
 * bits.
 * SMR (ctx->attn_pf_smr, DS_CUDA_ATTN_PF_SMR; with PV16 only): the softmax in the S warps'
 * registers. Warp w's S rows are its P·V rows, so each thread keeps its two rows' running max
 * and its part of their sums; the two warps of a row group swap their 32-key maxima through
 * shared memory (one barrier, which also frees the K tile) and write P's bf16 halves straight
 * from the S fragments. No fp32 P round trip, no softmax phase of its own, the rescale factors
 * in registers; the row sums are added across the quad and the two warps once, at the end.
 * Sums in a different order: not the same bits as PV16 alone.
 * P1 (ctx->attn_pf_p1, DS_CUDA_ATTN_PF_P1; with SMR only): P as one bf16 (no lo half), as
 * FlashAttention-2 does, normalised by the sum of the rounded values (the weights P·V really
 * uses); one MMA per P·V tile instead of two, and the unused fp32 P tile and lo half gone from
 * shared memory (109 KB at HD 256), so with ≤ 128 registers two blocks share an SM. On by
 * default since session 24: attention of 2048 tokens 0.342 vs 0.517 ms (H200, s23-run1), a
 * prefill of 8192 tokens 294.9 vs 319.1 ms (H100, s24-run1); rel L2 3.19e-3 vs 2.96e-3. */
template <int HD, bool PIPE, bool PV16, bool SMR, bool P1>
__global__ void __launch_bounds__(PF_THREADS, P1 ? 2 : 0)
    attn_prefill_kernel(ds_cuda_batch b, ds_cuda_attn_args a, int G, int BT) {
    pdl_enter(); /* cuda_launch.cuh: first, before any access */
    typedef PfSmem<HD> SM;
    static_assert(PIPE || !PV16, "PV16 comes with the pipe");
    static_assert(PV16 || !SMR, "SMR comes with PV16");
    static_assert(SMR || !P1, "P1 comes with SMR");
    constexpr int QS = SM::QS, VS = PV16 ? SM::QS : SM::VS, PS = SM::PS, PH = SM::PH;
    constexpr int NT = HD / 16; /* O n-tiles of 8 head dims per warp (HD / 2 dims) */
    static_assert(HD % 32 == 0 && PF_THREADS == 256 && PF_ROWS == 64 && PF_KEYS == 64, "warp map");
    extern __shared__ __align__(16) unsigned char smem[];
    bf16 *Qs = (bf16 *)(smem + SM::q_off);
    bf16 *Ks = (bf16 *)(smem + SM::k_off);
    bf16 *Vs = (bf16 *)(smem + SM::v_off);
    float *Ps = (float *)(smem + (P1 ? SM::p1_part_off : SM::p_off)); /* P1: only the parts below */
    float *m_s = (float *)(smem + SM::st_off); /* m_s, l_s, al_s: not under SMR */
    float *l_s = m_s + PF_ROWS;
    float *al_s = l_s + PF_ROWS;
    int *rpos = P1 ? (int *)(smem + SM::p1_rpos_off) : (int *)(al_s + PF_ROWS);
    bf16 *Ph = (bf16 *)(smem + (P1 ? SM::p1_ph_off : SM::ph_off)); /* PV16: [PF_ROWS][PH] hi, then lo */
    bf16 *Pl = P1 ? nullptr : Ph + PF_ROWS * PH; /* P1: no lo half (its place is the row parts') */
    float *mpart = Ps;                /* SMR: [2][PF_ROWS] each key half's row maxima */
    float *lpart = Ps + 2 * PF_ROWS;  /* SMR: [2][PF_ROWS] each half's row sums, at the end */
    float m_run[2] = {-INFINITY, -INFINITY}, l_run[2] = {0.f, 0.f}, alpha[2] = {1.f, 1.f};

    const int s = blockIdx.z, j = blockIdx.y;
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t4 = lane & 3;
    const int m0 = 16 * (warp & 3), half = warp >> 2;
    const int nh = a.nh, nkv = a.nkv, bs = a.block_size;
    const int ts = b.seq_start[s], te = b.seq_start[s + 1];
    const int t0 = ts + (PIPE ? gridDim.x - 1 - blockIdx.x : blockIdx.x) * BT;
    if (t0 >= te) return;
    const int ntok = min(BT, te - t0);
    const int nrows = ntok * G;
    const int32_t *bt = b.block_table + (int64_t)s * b.max_blocks;
    const bf16 *kc = (const bf16 *)a.k_cache, *vc = (const bf16 *)a.v_cache;

    /* query rows: r → token t0 + r / G, head j·G + r % G (zeros past nrows) */
    if (tid < PF_ROWS) {
        rpos[tid] = tid < nrows ? b.positions[t0 + tid / G] : -1;
        if (!P1) m_s[tid] = -INFINITY, l_s[tid] = 0.f; /* P1: not in its layout (unused by SMR) */
    }
    for (int i = tid; i < PF_ROWS * (HD / 8); i += PF_THREADS) {
        const int r = i / (HD / 8), c8 = i % (HD / 8);
        const int64_t src = r < nrows ? ((int64_t)(t0 + r / G) * nh + j * G + r % G) * HD + 8 * c8 : 0;
        cp_async16(Qs + r * QS + 8 * c8, (const bf16 *)a.out + src, r < nrows ? 16 : 0);
    }
    cp_async_commit();
    __syncthreads();
    int maxpos = -1;
    for (int r = 0; r < nrows; r++) maxpos = max(maxpos, rpos[r]);

    float o[NT][4];
#pragma unroll
    for (int nt = 0; nt < NT; nt++) o[nt][0] = o[nt][1] = o[nt][2] = o[nt][3] = 0.f;

    /* the K (or V) tile of keys kt0 … from the paged cache (keys past maxpos are zero and
     * masked) into dst, pitch ld */
    auto copy_tile = [&](bf16 *dst, int ld, const bf16 *cache, int kt0) {
        for (int i = tid; i < PF_KEYS * (HD / 8); i += PF_THREADS) {
            const int kk = i / (HD / 8), c8 = i % (HD / 8);
            const int p = kt0 + kk;
            const int64_t row = p <= maxpos ? ((int64_t)bt[p / bs] * bs + p % bs) * nkv + j : 0;
            cp_async16(dst + kk * ld + c8 * 8, cache + row * HD + c8 * 8, p <= maxpos ? 16 : 0);
        }
        cp_async_commit();
    };
    if (PIPE) { /* groups in flight: K(0), V(0) */
        copy_tile(Ks, QS, kc, 0);
        copy_tile(Vs, VS, vc, 0);
    }
    for (int kt0 = 0; kt0 <= maxpos; kt0 += PF_KEYS) {
        const bool more = kt0 + PF_KEYS <= maxpos;
        if (PIPE) {
            cp_async_wait<1>(); /* K(kt0) (and Q) here; V(kt0) may still be in flight */
        } else { /* one loop for both tiles, as before PIPE (its time is the baseline's) */
            for (int i = tid; i < PF_KEYS * (HD / 8); i += PF_THREADS) {
                const int kk = i / (HD / 8), c8 = i % (HD / 8);
                const int p = kt0 + kk;
                const int64_t row = p <= maxpos ? ((int64_t)bt[p / bs] * bs + p % bs) * nkv + j : 0;
                cp_async16(Ks + kk * QS + c8 * 8, kc + row * HD + c8 * 8, p <= maxpos ? 16 : 0);
                cp_async16(Vs + kk * VS + c8 * 8, vc + row * HD + c8 * 8, p <= maxpos ? 16 : 0);
            }
            cp_async_commit();
            cp_async_wait<0>();
        }
        __syncthreads();
        /* S = Q·Kᵀ for rows m0 …, keys 32·half … (four n-tiles) */
        {
            float sacc[4][4];
#pragma unroll
            for (int nt = 0; nt < 4; nt++) sacc[nt][0] = sacc[nt][1] = sacc[nt][2] = sacc[nt][3] = 0.f;
#pragma unroll 4
            for (int k0 = 0; k0 < HD; k0 += 16) {
                const uint32_t a0 = *(const uint32_t *)(Qs + (m0 + g) * QS + k0 + 2 * t4);
                const uint32_t a1 = *(const uint32_t *)(Qs + (m0 + g + 8) * QS + k0 + 2 * t4);
                const uint32_t a2 = *(const uint32_t *)(Qs + (m0 + g) * QS + k0 + 2 * t4 + 8);
                const uint32_t a3 = *(const uint32_t *)(Qs + (m0 + g + 8) * QS + k0 + 2 * t4 + 8);
#pragma unroll
                for (int nt = 0; nt < 4; nt++) {
                    const bf16 *kr = Ks + (32 * half + 8 * nt + g) * QS + k0 + 2 * t4;
                    mma_bf16_16816(sacc[nt], a0, a1, a2, a3, *(const uint32_t *)kr, *(const uint32_t *)(kr + 8));
                }
            }
            if (SMR) { /* rows m0 + g (c = 0, 1) and m0 + g + 8 (c = 2, 3) */
                const int rpos0 = rpos[m0 + g], rpos1 = rpos[m0 + g + 8];
                float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
                for (int nt = 0; nt < 4; nt++)
#pragma unroll
                    for (int c = 0; c < 4; c++) {
                        const int kk = 32 * half + 8 * nt + 2 * t4 + (c & 1);
                        const float v = kt0 + kk <= (c < 2 ? rpos0 : rpos1) ? sacc[nt][c] * a.scale : -INFINITY;
                        sacc[nt][c] = v;
                        mx[c >> 1] = fmaxf(mx[c >> 1], v);
                    }
#pragma unroll
                for (int h = 0; h < 2; h++) {
                    mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 1));
                    mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 2));
                }
                if (t4 == 0) mpart[half * PF_ROWS + m0 + g] = mx[0], mpart[half * PF_ROWS + m0 + g + 8] = mx[1];
                __syncthreads(); /* both halves' maxima; every warp is done with K */
                if (PIPE && more) copy_tile(Ks, QS, kc, kt0 + PF_KEYS); /* in flight: V(kt0), K(next) */
#pragma unroll
                for (int h = 0; h < 2; h++) {
                    const int r = m0 + g + 8 * h;
                    const float mnew = fmaxf(m_run[h], fmaxf(mpart[r], mpart[PF_ROWS + r]));
                    alpha[h] = mnew == -INFINITY ? 1.f : expf(m_run[h] - mnew);
                    m_run[h] = mnew;
                    float sum = 0.f;
#pragma unroll
                    for (int nt = 0; nt < 4; nt++) {
                        const float s0 = sacc[nt][2 * h], s1 = sacc[nt][2 * h + 1];
                        const float p0 = s0 == -INFINITY ? 0.f : expf(s0 - mnew);
                        const float p1 = s1 == -INFINITY ? 0.f : expf(s1 - mnew);
                        const __nv_bfloat162 hi = __floats2bfloat162_rn(p0, p1); /* hi, lo = p − hi */
                        const float2 hf = __bfloat1622float2(hi);
                        const int at = r * PH + 32 * half + 8 * nt + 2 * t4;
                        *reinterpret_cast<__nv_bfloat162 *>(Ph + at) = hi;
                        if (P1) { /* the weights P·V uses */
                            sum += hf.x;
                            sum += hf.y;
                        } else {
                            *reinterpret_cast<uint32_t *>(Pl + at) = pack_bf2(p0 - hf.x, p1 - hf.y);
                            sum += p0;
                            sum += p1;
                        }
                    }
                    l_run[h] = l_run[h] * alpha[h] + sum; /* this thread's part of the row sum */
                }
            } else {
#pragma unroll
                for (int nt = 0; nt < 4; nt++)
#pragma unroll
                    for (int c = 0; c < 4; c++) {
                        const int r = m0 + g + (c >> 1) * 8, kk = 32 * half + 8 * nt + 2 * t4 + (c & 1);
                        Ps[r * PS + kk] = (kt0 + kk <= rpos[r]) ? sacc[nt][c] * a.scale : -INFINITY;
                    }
            }
        }
        if (!SMR) {
            __syncthreads();
            if (PIPE && more) copy_tile(Ks, QS, kc, kt0 + PF_KEYS); /* in flight: V(kt0), K(next) */
            /* online softmax: 4 threads per row, 16 keys each */
            {
                const int r = tid / 4, part = tid % 4;
                float *pr = Ps + r * PS + part * 16;
                float mx = -INFINITY;
#pragma unroll
                for (int i = 0; i < 16; i++) mx = fmaxf(mx, pr[i]);
                mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
                mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
                const float mold = m_s[r];
                const float mnew = fmaxf(mold, mx);
                float sum = 0.f;
#pragma unroll
                for (int i = 0; i < 16; i += 2) {
                    const float p0 = pr[i] == -INFINITY ? 0.f : expf(pr[i] - mnew);
                    const float p1 = pr[i + 1] == -INFINITY ? 0.f : expf(pr[i + 1] - mnew);
                    if (PV16) { /* hi = bf16(p), lo = bf16(p − hi) */
                        const __nv_bfloat162 hi = __floats2bfloat162_rn(p0, p1);
                        const float2 hf = __bfloat1622float2(hi);
                        *reinterpret_cast<__nv_bfloat162 *>(Ph + r * PH + part * 16 + i) = hi;
                        *reinterpret_cast<uint32_t *>(Pl + r * PH + part * 16 + i) = pack_bf2(p0 - hf.x, p1 - hf.y);
                    } else {
                        pr[i] = p0;
                        pr[i + 1] = p1;
                    }
                    sum += p0;
                    sum += p1;
                }
                sum += __shfl_xor_sync(0xffffffffu, sum, 1);
                sum += __shfl_xor_sync(0xffffffffu, sum, 2);
                __syncwarp();
                if (part == 0) {
                    const float al = mnew == -INFINITY ? 1.f : expf(mold - mnew);
                    al_s[r] = al;
                    l_s[r] = l_s[r] * al + sum;
                    m_s[r] = mnew;
                }
            }
        }
        if (PIPE) { /* V(kt0) here */
            if (more) cp_async_wait<1>();
            else cp_async_wait<0>();
        }
        __syncthreads();
        /* O = O·alpha + P·V for rows m0 …, head dims HD/2·half … */
        {
            const float al_lo = SMR ? alpha[0] : al_s[m0 + g], al_hi = SMR ? alpha[1] : al_s[m0 + g + 8];
#pragma unroll
            for (int nt = 0; nt < NT; nt++) {
                o[nt][0] *= al_lo, o[nt][1] *= al_lo;
                o[nt][2] *= al_hi, o[nt][3] *= al_hi;
            }
            if (PV16) {
                const int mi = lane >> 3, rr = lane & 7; /* ldmatrix: this lane's row address */
#pragma unroll
                for (int k0 = 0; k0 < PF_KEYS; k0 += 16) {
                    uint32_t ah[4], al[4] = {0, 0, 0, 0};
                    const bf16 *ph = Ph + (m0 + g) * PH + k0 + 2 * t4, *pl = Pl + (m0 + g) * PH + k0 + 2 * t4;
                    ah[0] = *(const uint32_t *)ph, ah[1] = *(const uint32_t *)(ph + 8 * PH);
                    ah[2] = *(const uint32_t *)(ph + 8), ah[3] = *(const uint32_t *)(ph + 8 * PH + 8);
                    if (!P1) {
                        al[0] = *(const uint32_t *)pl, al[1] = *(const uint32_t *)(pl + 8 * PH);
                        al[2] = *(const uint32_t *)(pl + 8), al[3] = *(const uint32_t *)(pl + 8 * PH + 8);
                    }
#pragma unroll
                    for (int n2 = 0; n2 < NT / 2; n2++) { /* n-tiles 2·n2 and 2·n2 + 1 */
                        const int d0 = (HD / 2) * half + 16 * n2;
                        uint32_t vb[4]; /* b0, b1 of n-tile 2·n2; b0, b1 of 2·n2 + 1 */
                        ldmatrix_x4_trans(vb, Vs + (k0 + rr + 8 * (mi & 1)) * VS + d0 + 8 * (mi >> 1));
                        if (!P1) mma_bf16_16816(o[2 * n2], al[0], al[1], al[2], al[3], vb[0], vb[1]);
                        mma_bf16_16816(o[2 * n2], ah[0], ah[1], ah[2], ah[3], vb[0], vb[1]);
                        if (!P1) mma_bf16_16816(o[2 * n2 + 1], al[0], al[1], al[2], al[3], vb[2], vb[3]);
                        mma_bf16_16816(o[2 * n2 + 1], ah[0], ah[1], ah[2], ah[3], vb[2], vb[3]);
                    }
                }
            } else
#pragma unroll 2
            for (int k0 = 0; k0 < PF_KEYS; k0 += 8) {
                tf32_split pa[4];
                load_a_tf32(pa, Ps, PS, m0, k0, g, t4);
#pragma unroll
                for (int nt = 0; nt < NT; nt++) {
                    const int d = (HD / 2) * half + 8 * nt + g;
                    /* bf16 → fp32 is exact and has a zero tf32 remainder */
                    const uint32_t b0 = __float_as_uint(__bfloat162float(Vs[(k0 + t4) * VS + d]));
                    const uint32_t b1 = __float_as_uint(__bfloat162float(Vs[(k0 + t4 + 4) * VS + d]));
                    mma_tf32(o[nt], pa[0].lo, pa[1].lo, pa[2].lo, pa[3].lo, b0, b1);
                    mma_tf32(o[nt], pa[0].hi, pa[1].hi, pa[2].hi, pa[3].hi, b0, b1);
                }
            }
        }
        __syncthreads();
        if (PIPE && more) copy_tile(Vs, VS, vc, kt0 + PF_KEYS); /* in flight: K(next), V(next) */
    }
    if (SMR) { /* the row sums: over the quad, then the two key halves */
#pragma unroll
        for (int h = 0; h < 2; h++) {
            l_run[h] += __shfl_xor_sync(0xffffffffu, l_run[h], 1);
            l_run[h] += __shfl_xor_sync(0xffffffffu, l_run[h], 2);
        }
        if (t4 == 0) lpart[half * PF_ROWS + m0 + g] = l_run[0], lpart[half * PF_ROWS + m0 + g + 8] = l_run[1];
        __syncthreads();
    }
    /* epilogue: normalise, gate, store (rows m0 + g and m0 + g + 8, dim pairs of each n-tile) */
    const int64_t ld = (int64_t)nh * 2 * HD + 2 * (int64_t)nkv * HD;
#pragma unroll
    for (int hr = 0; hr < 2; hr++) {
        const int r = m0 + g + 8 * hr;
        if (r >= nrows) continue;
        const int tok = t0 + r / G, h = j * G + r % G;
        const float l = SMR ? lpart[r] + lpart[PF_ROWS + r] : l_s[r];
        const float inv = l > 0.f ? 1.f / l : 0.f;
        const bf16 *gate = (const bf16 *)a.qkv + (int64_t)tok * ld + (int64_t)h * 2 * HD + HD;
        bf16 *dst = (bf16 *)a.out + ((int64_t)tok * nh + h) * HD;
#pragma unroll
        for (int nt = 0; nt < NT; nt++) {
            const int d = (HD / 2) * half + 8 * nt + 2 * t4;
            const float2 gf = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162 *>(gate + d));
            *reinterpret_cast<uint32_t *>(dst + d) =
                pack_bf2(o[nt][2 * hr] * inv * sigmoid_f(gf.x), o[nt][2 * hr + 1] * inv * sigmoid_f(gf.y));
        }
    }
}

/* ---- launcher ---------------------------------------------------------------------------- */

template <int HD>
static void run_attention(ds_cuda_ctx *ctx, const ds_cuda_attn_args *a) {
    const ds_cuda_batch &b = ctx->batch;
    const int T = b.n_tokens, S = b.n_seqs;
    const int G = a->nh / a->nkv;
    const bool decode = ctx->info.max_seq_tokens <= DEC_MAX_Q && G <= DEC_MAXG && (int64_t)T * a->nh <= a->ws_rows;
    /* one token per sequence: the decode kernel does the prep itself (ctx->attn_fuse_prep;
     * batch 4 / 8 4.675 / 7.012 vs 4.700 / 7.031 ms, s13-run7). At one token (batch 1) only
     * with ctx->attn_fuse_prep1: there the FMA kernel's 128 blocks each repeating the query
     * prep made the step longer than the prep launch it saves (2.502 vs 2.483 / 2.477 ms,
     * s13-run7); the tensor-core kernel with 16-key splits gains a little (s34-run2) */
    const bool fuse_prep = decode && ctx->info.max_seq_tokens == 1 && (T >= 2 || ctx->attn_fuse_prep1) && ctx->attn_fuse_prep;
    if (!fuse_prep) {
        dim3 pgrid(T, DS_DIV_UP(a->nh + 2 * a->nkv, 8));
        ds_launch(ctx, attn_prep_kernel<HD>, pgrid, 256, 0, b, *a);
        DS_CU_LAUNCHED2(ctx, "attn_prep_kernel", T, a->nh + 2 * a->nkv);
    }

    if (decode) {
        /* split count from the token count only (graph-safe); ranges are found on the device */
        int nsplit = DS_DIV_UP(2 * ctx->sm_count, T * a->nkv);
        const int max_split = T == 1 ? ctx->attn_max_split1 : DS_CUDA_ATTN_MAX_SPLIT_BATCH;
        if (nsplit > max_split) nsplit = max_split;
        while (nsplit > 1 && (int64_t)T * a->nh * nsplit > a->ws_rows) nsplit--;
        if (nsplit < 1) nsplit = 1;
        const dim3 grid(T, a->nkv, nsplit);
        const size_t smem = DecSmem<HD>::bytes;
        /* the tensor-core form (ctx->attn_dec_tc) for G ≤ 8 and head_dim ≥ 64, else the FMA form */
        const bool tc = (ctx->attn_dec_tc == 1 || (ctx->attn_dec_tc == 2 && fuse_prep)) && G <= DTC_G && HD >= 64;
        if (tc) {
            if constexpr (HD >= 64) {
                const size_t tsmem = DecTcSmem<HD>::bytes;
                if (fuse_prep) ds_launch(ctx, attn_decode_tc_kernel<HD, true>, grid, DTC_THREADS, tsmem, b, *a, G, nsplit, ctx->attn_kv_early);
                else ds_launch(ctx, attn_decode_tc_kernel<HD, false>, grid, DTC_THREADS, tsmem, b, *a, G, nsplit, ctx->attn_kv_early);
            }
            DS_CU_LAUNCHED2(ctx, "attn_decode_tc_kernel", T, nsplit);
        } else {
            if (ctx->attn_lanes8 && fuse_prep) ds_launch(ctx, attn_decode_kernel<HD, 8, true>, grid, HD, smem, b, *a, G, nsplit, ctx->attn_kv_early);
            else if (ctx->attn_lanes8) ds_launch(ctx, attn_decode_kernel<HD, 8, false>, grid, HD, smem, b, *a, G, nsplit, ctx->attn_kv_early);
            else if (fuse_prep) ds_launch(ctx, attn_decode_kernel<HD, 32, true>, grid, HD, smem, b, *a, G, nsplit, ctx->attn_kv_early);
            else ds_launch(ctx, attn_decode_kernel<HD, 32, false>, grid, HD, smem, b, *a, G, nsplit, ctx->attn_kv_early);
            DS_CU_LAUNCHED2(ctx, "attn_decode_kernel", T, nsplit);
        }
        if constexpr (HD % 64 == 0) {
            if (ctx->attn_combine_warps) {
                ds_launch(ctx, attn_combine_warps_kernel<HD>, dim3(T, a->nh), CMB_WARPS * 32, 0, b, *a, nsplit);
                DS_CU_LAUNCHED2(ctx, "attn_combine_warps_kernel", T, nsplit);
                return;
            }
        }
        ds_launch(ctx, attn_combine_kernel<HD>, dim3(T, a->nh), HD, 0, b, *a, nsplit);
        DS_CU_LAUNCHED2(ctx, "attn_combine_kernel", T, nsplit);
        return;
    }
    const int BT = PF_ROWS / G;
    const size_t smem = PfSmem<HD>::bytes;
    dim3 grid(DS_DIV_UP(ctx->info.max_seq_tokens, BT), a->nkv, S);
    if (ctx->attn_pf_pipe && ctx->attn_pf_pv16 && ctx->attn_pf_smr && ctx->attn_pf_p1)
        ds_launch(ctx, attn_prefill_kernel<HD, true, true, true, true>, grid, PF_THREADS, PfSmem<HD>::bytes_p1, b, *a, G, BT);
    else if (ctx->attn_pf_pipe && ctx->attn_pf_pv16 && ctx->attn_pf_smr)
        ds_launch(ctx, attn_prefill_kernel<HD, true, true, true, false>, grid, PF_THREADS, PfSmem<HD>::bytes_pv16, b, *a, G, BT);
    else if (ctx->attn_pf_pipe && ctx->attn_pf_pv16)
        ds_launch(ctx, attn_prefill_kernel<HD, true, true, false, false>, grid, PF_THREADS, PfSmem<HD>::bytes_pv16, b, *a, G, BT);
    else if (ctx->attn_pf_pipe)
        ds_launch(ctx, attn_prefill_kernel<HD, true, false, false, false>, grid, PF_THREADS, smem, b, *a, G, BT);
    else ds_launch(ctx, attn_prefill_kernel<HD, false, false, false, false>, grid, PF_THREADS, smem, b, *a, G, BT);
    DS_CU_LAUNCHED2(ctx, "attn_prefill_kernel", T, S);
}

template <int HD>
static void attention_init(ds_cuda_ctx *ctx) {
    DS_CU(ctx, cudaFuncSetAttribute(attn_prefill_kernel<HD, false, false, false, false>,
                                    cudaFuncAttributeMaxDynamicSharedMemorySize, (int)PfSmem<HD>::bytes));
    DS_CU(ctx, cudaFuncSetAttribute(attn_prefill_kernel<HD, true, false, false, false>,
                                    cudaFuncAttributeMaxDynamicSharedMemorySize, (int)PfSmem<HD>::bytes));
    DS_CU(ctx, cudaFuncSetAttribute(attn_prefill_kernel<HD, true, true, false, false>,
                                    cudaFuncAttributeMaxDynamicSharedMemorySize, (int)PfSmem<HD>::bytes_pv16));
    DS_CU(ctx, cudaFuncSetAttribute(attn_prefill_kernel<HD, true, true, true, false>,
                                    cudaFuncAttributeMaxDynamicSharedMemorySize, (int)PfSmem<HD>::bytes_pv16));
    DS_CU(ctx, cudaFuncSetAttribute(attn_prefill_kernel<HD, true, true, true, true>,
                                    cudaFuncAttributeMaxDynamicSharedMemorySize, (int)PfSmem<HD>::bytes_p1));
    const int dec = (int)DecSmem<HD>::bytes;
    DS_CU(ctx, cudaFuncSetAttribute(attn_decode_kernel<HD, 8, false>, cudaFuncAttributeMaxDynamicSharedMemorySize, dec));
    DS_CU(ctx, cudaFuncSetAttribute(attn_decode_kernel<HD, 32, false>, cudaFuncAttributeMaxDynamicSharedMemorySize, dec));
    DS_CU(ctx, cudaFuncSetAttribute(attn_decode_kernel<HD, 8, true>, cudaFuncAttributeMaxDynamicSharedMemorySize, dec));
    DS_CU(ctx, cudaFuncSetAttribute(attn_decode_kernel<HD, 32, true>, cudaFuncAttributeMaxDynamicSharedMemorySize, dec));
    if constexpr (HD >= 64) {
        const int tc = (int)DecTcSmem<HD>::bytes;
        DS_CU(ctx, cudaFuncSetAttribute(attn_decode_tc_kernel<HD, false>, cudaFuncAttributeMaxDynamicSharedMemorySize, tc));
        DS_CU(ctx, cudaFuncSetAttribute(attn_decode_tc_kernel<HD, true>, cudaFuncAttributeMaxDynamicSharedMemorySize, tc));
    }
}

/* Shared-memory limits of the kernels, set once at creation (never inside a graph capture). */
extern "C" void ds_cuda_attention_init(ds_cuda_ctx *ctx) {
    attention_init<32>(ctx);
    attention_init<64>(ctx);
    attention_init<128>(ctx);
    attention_init<256>(ctx);
}

extern "C" void ds_cuda_attention(ds_cuda_ctx *ctx, const ds_cuda_attn_args *a) {
    if (ctx->batch.n_tokens <= 0) return;
    switch (a->hd) {
    case 32: run_attention<32>(ctx, a); break;
    case 64: run_attention<64>(ctx, a); break;
    case 128: run_attention<128>(ctx, a); break;
    case 256: run_attention<256>(ctx, a); break;
    default: ds_cuda_check(ctx, cudaErrorInvalidValue, "attention: head_dim not 32/64/128/256", __FILE__, __LINE__);
    }
}
