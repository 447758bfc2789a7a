/* cuda_spec_sample.cu — target ids of a sampled verification (backend.h spec_sample): one block
 * per row over its V logits, so that spec_accept's leading-match rule is speculative sampling
 * against deterministic drafts and no logits leave the device. The CPU reference is
 * cpu_spec_sample.c; both draw their numbers from sampling/counter_rng.h, so they give the same
 * ids up to float rounding at a threshold (CPU sums in double, here in float).
 *
 * A row is a few passes over its logits (L2-resident after the first), 16-byte loads, with
 * z = logit · (1 / temperature) recomputed in each (the same float as the CPU's):
 *  - the maximum;
 *  - a truncated distribution (top_k ≤ SS_CAND, top_p or min_p; Qwen3.5's generation_config
 *    asks for top_k 20, top_p 0.95): a histogram of zmax − z (counts, and weights for top_p)
 *    near the maximum, then the ids in the bins that hold every survivor into shared memory;
 *    the top_k-th key, top_p and the inverse CDF are decided over those few
 *    (3 passes in all);
 *  - otherwise (or when too many ids crowd those bins): for top_k a radix selection of the
 *    top_k-th largest key (4 passes of 8 bits, counts), for top_p the total weight and a radix
 *    selection by weight (4 passes), then one pass that sums the survivors' weights per warp
 *    over a contiguous chunk of ids, and the inverse CDF: thread 0 finds the chunk that holds
 *    the draw, its warp walks it 32 ids at a time (a warp scan). Radix histogram updates are
 *    aggregated per warp (__match_any_sync): most logits share their key's top byte, and
 *    per-lane shared atomics on one bin would serialise the first pass. */
#include <math.h>

#include "cuda_argmax.cuh"
#include "cuda_launch.cuh"
#include "sampling/counter_rng.h"

#define SS_THREADS 1024

/* Order-preserving key of z (cpu_spec_sample.c z_key): NaN below everything. */
static __device__ __forceinline__ uint32_t z_key(float z) {
    if (isnan(z)) return 0u;
    const uint32_t u = __float_as_uint(z);
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

#define SS_CAND 1024 /* candidates of a truncated distribution */
#define SS_REL_BINS 2048 /* its histogram of zmax − z: bins 1/32 wide, 64 below the maximum */

struct SampleShared {
    float red[32];
    int redi[32];
    unsigned count[SS_REL_BINS]; /* radix digits use the first 256 */
    float weight[SS_REL_BINS];
    uint32_t prefix;
    float need_w;
    unsigned need_c;
    int n_cand;
    int cand_id[SS_CAND];
    float cand_z[SS_CAND];
    uint32_t cand_key[SS_CAND];
    short by_key[SS_CAND]; /* candidates by key, largest first (ties: lower id first) */
    short by_id[SS_CAND];  /* candidates by id */
};

/* f(v, logit) for every v < V of row l, 4 at a time when the row allows (16-byte loads). */
template <class F>
static __device__ __forceinline__ void for_row(const float *__restrict__ l, int V, F f) {
    if ((V & 3) == 0 && (reinterpret_cast<uintptr_t>(l) & 15) == 0) {
        const float4 *l4 = reinterpret_cast<const float4 *>(l);
#pragma unroll 4
        for (int i = threadIdx.x; i < (V >> 2); i += blockDim.x) {
            const float4 x = l4[i];
            f(4 * i, x.x);
            f(4 * i + 1, x.y);
            f(4 * i + 2, x.z);
            f(4 * i + 3, x.w);
        }
    } else {
        for (int v = threadIdx.x; v < V; v += blockDim.x) f(v, l[v]);
    }
}

/* Block-wide (value, index) argmax by amax_merge's rule; every thread gets the result. */
static __device__ __forceinline__ void block_amax(float &bv, int &bi, SampleShared &sh) {
    warp_amax(bv, bi);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    __syncthreads();
    if (lane == 0) {
        sh.red[warp] = bv;
        sh.redi[warp] = bi;
    }
    __syncthreads();
    bv = sh.red[0];
    bi = sh.redi[0];
    for (int w = 1; w < (int)(blockDim.x >> 5); w++) amax_merge(bv, bi, sh.red[w], sh.redi[w]);
}

/* One 8-bit digit's histogram of the keys ≥ lo whose bits above `shift` equal prefix: counts
 * (by_weight false) or weights exp(z − zmax). One atomic per distinct bin per warp. */
static __device__ void digit_histogram(const float *l, int V, float inv_t, float zmax, uint32_t lo,
                                       uint32_t prefix, int shift, bool by_weight,
                                       SampleShared &sh) {
    for (int i = threadIdx.x; i < 256; i += blockDim.x) {
        sh.count[i] = 0u;
        sh.weight[i] = 0.0f;
    }
    __syncthreads();
    const int lane = threadIdx.x & 31;
    const uint32_t high = shift == 24 ? 0u : ~0u << (shift + 8);
    for (int base = threadIdx.x - lane; base < V; base += blockDim.x) { /* warp-uniform */
        const int v = base + lane;
        int bin = -1;
        float w = 0.0f;
        if (v < V) {
            const float z = l[v] * inv_t;
            const uint32_t k = z_key(z);
            if (k >= lo && (k & high) == prefix) {
                bin = (int)((k >> shift) & 255u);
                if (by_weight) w = expf(z - zmax);
            }
        }
        const unsigned same = __match_any_sync(0xffffffffu, bin);
        float group_w = 0.0f;
        if (by_weight)
            for (int j = 0; j < 32; j++) {
                const float wj = __shfl_sync(0xffffffffu, w, j);
                if ((same >> j) & 1u) group_w += wj;
            }
        if (bin >= 0 && lane == __ffs(same) - 1) {
            if (by_weight) atomicAdd(&sh.weight[bin], group_w);
            else atomicAdd(&sh.count[bin], (unsigned)__popc(same));
        }
    }
    __syncthreads();
}

/* The largest key t ≥ lo such that the keys ≥ t (and ≥ lo) number ≥ need (by count) or weigh
 * ≥ need_w (by weight): a radix descent, 8 bits at a time. By weight, float rounding may leave
 * no bin that reaches the need: then the lowest non-empty bin is taken (everything left
 * survives), as the CPU's walk ends at its last survivor. */
static __device__ uint32_t radix_select(const float *l, int V, float inv_t, float zmax, uint32_t lo,
                                        bool by_weight, unsigned need, float need_w,
                                        SampleShared &sh) {
    uint32_t prefix = 0u;
    for (int shift = 24; shift >= 0; shift -= 8) {
        digit_histogram(l, V, inv_t, zmax, lo, prefix, shift, by_weight, sh);
        if (threadIdx.x == 0) {
            int b = 255, lowest = -1;
            float cum_w = 0.0f;
            unsigned cum = 0u;
            for (; b >= 0; b--) {
                if (by_weight) {
                    if (sh.weight[b] > 0.0f) lowest = b;
                    if (sh.weight[b] > 0.0f && cum_w + sh.weight[b] >= need_w) break;
                    cum_w += sh.weight[b];
                } else {
                    if (cum + sh.count[b] >= need) break;
                    cum += sh.count[b];
                }
            }
            if (b < 0) { /* by weight, rounding (by count, unreachable: need ≤ the keys left) */
                b = lowest < 0 ? 0 : lowest;
                cum_w -= sh.weight[b];
                need_w = cum_w + sh.weight[b];
            }
            sh.prefix = prefix | ((uint32_t)b << shift);
            sh.need_c = need - cum;
            sh.need_w = need_w - cum_w;
        }
        __syncthreads();
        prefix = sh.prefix;
        need = sh.need_c;
        need_w = sh.need_w;
        __syncthreads();
    }
    return prefix;
}

/* Bin of zmax − z (1/32 wide) when below 64, else −1 (NaN too). */
static __device__ __forceinline__ int rel_bin(float z, float zmax) {
    const float d = (zmax - z) * 32.0f;
    return d < (float)SS_REL_BINS ? (int)d : -1;
}

/* The candidates of a truncated distribution: every id whose z lies in the bins of zmax − z
 * that hold all survivors — up to the bin of the top_k-th largest (top_k); else up to the bin
 * where the weight from the top reaches top_p of the total, and the next non-empty one (float
 * sums in another order may cross a token later); and up to min_p's bin — into sh.cand_* with
 * sh.n_cand, ranked by key and by id, and *total the weight of the ids with key ≥ lo. Two
 * passes over the row whose atomics touch only ids within 64 of the maximum. False (nothing
 * kept) for a distribution those bounds do not cut (temperature alone), or when more than
 * SS_CAND ids fall in the bins: the general path decides. */
static __device__ bool collect_candidates(const float *l, int V, float inv_t, float zmax,
                                          uint32_t lo, const ds_spec_sampling &P,
                                          SampleShared &sh, float *total) {
    const bool top_k = P.top_k > 0 && P.top_k < V, top_p = P.top_p < 1.0f;
    const int b_min = P.min_p > 0.0f ? rel_bin(zmax + logf(P.min_p), zmax) : -1;
    if (!top_k && !top_p && b_min < 0) return false;
    for (int i = threadIdx.x; i < SS_REL_BINS; i += blockDim.x) {
        sh.count[i] = 0u;
        sh.weight[i] = 0.0f;
    }
    __syncthreads();
    float w_all = 0.0f;
    for_row(l, V, [&](int v, float x) {
        const float z = x * inv_t;
        if (z_key(z) < lo) return;
        const float w = expf(z - zmax);
        w_all += w;
        const int b = rel_bin(z, zmax);
        if (b < 0) return;
        atomicAdd(&sh.count[b], 1u);
        if (top_p && !top_k) atomicAdd(&sh.weight[b], w);
    });
    *total = block_sum(w_all, sh.red);
    if (threadIdx.x == 0) {
        int last = SS_REL_BINS; /* none yet */
        if (top_k) {
            unsigned cum = 0;
            int b = 0;
            while (b < SS_REL_BINS && (cum += sh.count[b]) < (unsigned)P.top_k) b++;
            last = b; /* SS_REL_BINS: fewer than top_k within 64 */
        } else if (top_p) {
            const float target = P.top_p * *total;
            float cum = 0.0f;
            int b = 0;
            while (b < SS_REL_BINS && (cum += sh.weight[b]) < target) b++;
            for (b++; b < SS_REL_BINS && sh.count[b] == 0; b++) {
            }
            last = b < SS_REL_BINS ? b : SS_REL_BINS - 1;
        }
        if (b_min >= 0 && b_min < last) last = b_min;
        unsigned n = 0;
        for (int b = 0; b <= last && b < SS_REL_BINS; b++) n += sh.count[b];
        sh.need_c = last < SS_REL_BINS && n <= SS_CAND ? (unsigned)last : 0xffffffffu;
        sh.n_cand = 0;
    }
    __syncthreads();
    const unsigned last = sh.need_c;
    if (last == 0xffffffffu) return false;
    for_row(l, V, [&](int v, float x) {
        const float z = x * inv_t;
        const int b = rel_bin(z, zmax);
        if (b >= 0 && (unsigned)b <= last && z_key(z) >= lo) {
            const int i = atomicAdd(&sh.n_cand, 1);
            sh.cand_id[i] = v;
            sh.cand_z[i] = z;
            sh.cand_key[i] = z_key(z);
        }
    });
    __syncthreads();
    const int n = sh.n_cand;
    for (int i = threadIdx.x; i < n; i += blockDim.x) { /* ranks: O(n) per candidate */
        const uint32_t ki = sh.cand_key[i];
        const int id = sh.cand_id[i];
        int rk = 0, ri = 0;
        for (int j = 0; j < n; j++) {
            const uint32_t kj = sh.cand_key[j];
            const int jd = sh.cand_id[j];
            rk += kj > ki || (kj == ki && jd < id);
            ri += jd < id;
        }
        sh.by_key[rk] = (short)i;
        sh.by_id[ri] = (short)i;
    }
    __syncthreads();
    return true;
}

/* backend.h spec_sample's decision over the candidates (thread 0): the survivors are a prefix
 * of by_key (min_p key lo, top_k-th key, top_p walk against the weight of top_k's survivors,
 * or without top_k against all_w, that of every id with key ≥ lo), then the inverse CDF in id
 * order, as the general path and the CPU reference decide them. */
static __device__ int32_t decide_candidates(const SampleShared &sh, const ds_spec_sampling &P,
                                            int V, float zmax, uint32_t lo, float all_w,
                                            uint64_t key) {
    const int n = sh.n_cand;
    uint32_t thr = lo;
    const bool top_k = P.top_k > 0 && P.top_k < V;
    /* fewer candidates than top_k: min_p bounded them, and the top_k-th key lies below lo */
    if (top_k && P.top_k <= n && sh.cand_key[sh.by_key[P.top_k - 1]] > thr)
        thr = sh.cand_key[sh.by_key[P.top_k - 1]];
    if (P.top_p < 1.0f) {
        float total = all_w;
        if (top_k) {
            total = 0.0f;
            for (int r = 0; r < n && sh.cand_key[sh.by_key[r]] >= thr; r++)
                total += expf(sh.cand_z[sh.by_key[r]] - zmax);
        }
        const float target = P.top_p * total;
        float cum = 0.0f;
        for (int r = 0; r < n && sh.cand_key[sh.by_key[r]] >= thr; r++) {
            const int i = sh.by_key[r];
            const bool end = r + 1 == n || sh.cand_key[sh.by_key[r + 1]] < thr;
            if ((cum += expf(sh.cand_z[i] - zmax)) >= target || end) {
                if (sh.cand_key[i] > thr) thr = sh.cand_key[i];
                break;
            }
        }
    }
    float total = 0.0f;
    for (int i = 0; i < n; i++)
        if (sh.cand_key[i] >= thr) total += expf(sh.cand_z[i] - zmax);
    if (!(total > 0.0f)) return 0;
    const float target = ds_crng_uniform(key, DS_CRNG_DRAW) * total;
    float cum = 0.0f;
    int32_t last = 0;
    for (int r = 0; r < n; r++) {
        const int i = sh.by_id[r];
        if (sh.cand_key[i] < thr) continue;
        last = sh.cand_id[i];
        if ((cum += expf(sh.cand_z[i] - zmax)) > target) return last;
    }
    return last; /* rounding: the last with weight */
}

__global__ void __launch_bounds__(SS_THREADS)
    spec_sample_kernel(int V, const float *__restrict__ logits, const int32_t *__restrict__ tok_seq,
                       const int32_t *__restrict__ positions,
                       const ds_spec_sampling *__restrict__ table, int32_t *tokbuf, int ids_at) {
    pdl_enter(); /* cuda_launch.cuh: first, before any access */
    __shared__ SampleShared sh;
    const int t = blockIdx.x, s = tok_seq[t];
    const ds_spec_sampling P = table[s];
    const float *l = logits + (int64_t)t * V;
    /* the plain argmax: greedy rows, and rows whose largest z is not finite */
    float bv = -INFINITY;
    int bi = 0x7fffffff;
    for_row(l, V, [&](int v, float x) { amax_merge(bv, bi, x, v); });
    block_amax(bv, bi, sh);
    const float inv_t = 1.0f / P.temperature;
    const float zmax = bv * inv_t; /* a positive factor keeps the order: the largest z */
    if (!(P.temperature > 0.0f) || !isfinite(zmax)) {
        if (threadIdx.x == 0) tokbuf[ids_at + t] = bi == 0x7fffffff ? 0 : bi;
        return;
    }
    uint32_t lo = 0u;
    if (P.min_p > 0.0f) lo = z_key(zmax + logf(P.min_p));
    const uint64_t key = ds_crng_key(P.seed, (int64_t)positions[t] + 1);
    /* a truncated distribution (Qwen's generation_config: top_k 20, top_p 0.95): the few ids
     * near the maximum decide */
    float all_w;
    if ((P.top_k <= 0 || P.top_k <= SS_CAND) &&
        collect_candidates(l, V, inv_t, zmax, lo, P, sh, &all_w)) {
        if (threadIdx.x == 0)
            tokbuf[ids_at + t] = decide_candidates(sh, P, V, zmax, lo, all_w, key);
        return;
    }
    if (P.top_k > 0 && P.top_k < V) {
        const uint32_t k = radix_select(l, V, inv_t, zmax, 0u, false, (unsigned)P.top_k, 0.0f, sh);
        lo = k > lo ? k : lo;
    }
    if (P.top_p < 1.0f) {
        float w = 0.0f;
        for_row(l, V, [&](int v, float x) {
            const float z = x * inv_t;
            if (z_key(z) >= lo) w += expf(z - zmax);
        });
        const float total = block_sum(w, sh.red);
        const uint32_t k = radix_select(l, V, inv_t, zmax, lo, true, 0u, P.top_p * total, sh);
        lo = k > lo ? k : lo;
    }
    /* the survivors' weights in warp-contiguous chunks of ids, so the inverse CDF can walk them
     * in id order */
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    const int C = ((V + nw - 1) / nw + 31) & ~31;
    const int c0 = min(V, warp * C), c1 = min(V, c0 + C);
    float part = 0.0f;
    for (int v = c0 + lane; v < c1; v += 32) {
        const float z = l[v] * inv_t;
        if (z_key(z) >= lo) part += expf(z - zmax);
    }
    part = warp_sum(part);
    if (lane == 0) sh.weight[warp] = part;
    __syncthreads();
    if (threadIdx.x == 0) {
        float all = 0.0f;
        for (int w = 0; w < nw; w++) all += sh.weight[w];
        int sel = -1; /* the warp whose chunk holds the draw; -2: done (sh.prefix = the id) */
        float off = 0.0f;
        if (!(all > 0.0f)) {
            sh.prefix = 0u, sel = -2;
        } else {
            const float target = ds_crng_uniform(key, DS_CRNG_DRAW) * all;
            float cum = 0.0f;
            int last = -1;
            for (int w = 0; w < nw && sel < 0; w++) {
                if (sh.weight[w] > 0.0f) last = w;
                if (sh.weight[w] > 0.0f && cum + sh.weight[w] > target) sel = w, off = target - cum;
                cum += sh.weight[w];
            }
            if (sel < 0) sel = last, off = INFINITY; /* rounding: the last with weight */
        }
        sh.need_c = (unsigned)sel;
        sh.need_w = off;
    }
    __syncthreads();
    const int sel = (int)sh.need_c;
    if (sel == -2) {
        if (threadIdx.x == 0) tokbuf[ids_at + t] = (int32_t)sh.prefix;
        return;
    }
    if (warp != sel) return;
    /* this warp's chunk in steps of 32 ids: the first whose cumulative weight exceeds off (off
     * infinite: the last with weight) */
    const float off = sh.need_w;
    float carry = 0.0f;
    int found = -1, last = -1;
    for (int base = c0; base < c1 && found < 0; base += 32) {
        const int v = base + lane;
        float w = 0.0f;
        if (v < c1) {
            const float z = l[v] * inv_t;
            if (z_key(z) >= lo) w = expf(z - zmax);
        }
        float incl = w; /* inclusive scan over the lanes */
        for (int o = 1; o < 32; o <<= 1) {
            const float up = __shfl_up_sync(0xffffffffu, incl, o);
            if (lane >= o) incl += up;
        }
        const unsigned hit = __ballot_sync(0xffffffffu, w > 0.0f && carry + incl > off);
        const unsigned has = __ballot_sync(0xffffffffu, w > 0.0f);
        if (hit) found = base + __ffs(hit) - 1;
        if (has) last = base + 31 - __clz(has);
        carry += __shfl_sync(0xffffffffu, incl, 31);
    }
    if (lane == 0) tokbuf[ids_at + t] = found >= 0 ? found : last >= 0 ? last : 0;
}

extern "C" void ds_cuda_spec_sample(ds_cuda_ctx *ctx, const float *logits, int64_t V, int ids_at) {
    const ds_cuda_batch *b = &ctx->batch;
    if (b->n_tokens <= 0) return;
    ds_launch(ctx, spec_sample_kernel, b->n_tokens, SS_THREADS, 0, (int)V, logits, b->tok_seq,
              b->positions,
              (const ds_spec_sampling *)ctx->d_samp, ctx->d_tokbuf, ids_at);
    DS_CU_LAUNCHED2(ctx, "spec_sample_kernel", b->n_tokens, V);
}
