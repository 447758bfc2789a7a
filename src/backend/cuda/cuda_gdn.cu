/* cuda_gdn.cu — Gated DeltaNet core: one fused kernel for conv + SiLU + gates + q/k L2-norm +
 * delta-rule recurrence + gated RMSNorm, decode and prefill alike.
 *
 * A block serves one (sequence, value head) and walks the sequence's tokens of this step in
 * order, so prefill runs the exact token-by-token recurrence (phase 1; the chunked form is
 * phase 2). The head's fp32 state S [dk, dv] lives in registers for the whole step: thread
 * (seg, j) of the 4·dv threads holds column j, rows [seg·dk/4, (seg+1)·dk/4); it is read once
 * and written once per step.
 *
 * Conv history: every block owns the pre-conv inputs of the 2·dk + dv channels it convolves
 * (its key head's q and k channels and its own v channels), stored per value head. The q/k
 * channels of a key head are therefore duplicated for the hv/hk value heads that share it,
 * which costs a few KiB per slot but removes any cross-block ordering on the conv state.
 * Layouts (fp32): state [slot][gdn layer][hv][dk][dv]; conv history
 * [slot][gdn layer][hv][2·dk + dv][kernel − 1].
 *
 * Speculative verification (ds_batch.state_out_slots): a sequence with snapshot slots reads its
 * own slot, never writes it, and writes the conv history and state after each token t with
 * state_out[t] ≥ 0 into that slot (the recurrence has the per-token state anyway). */
#include <cooperative_groups.h>
#include <math.h>

#include "cuda_launch.cuh"

namespace cg = cooperative_groups;

#define GDN_KC 4  /* conv kernel (all Qwen3.5 configs) */
#define GDN_SEG 4 /* row segments of the state: block = GDN_SEG·dv threads */

/* early (ctx->gdn_early, DS_CUDA_GDN_EARLY): the block reads its state, conv history and conv
 * weights before its dependency wait, while the input projection that precedes it still runs.
 * This widens cuda_launch.cuh's contract, soundly: under PDL this kernel starts only once every
 * kernel before its predecessor has completed, and the state and conv history of a (slot,
 * layer) are written only by this layer's GDN kernels (of earlier steps: done long before), by
 * cache_reset_slot's memsets (ordered before the step's first kernel) and never by the input
 * projection; the slot ids and snapshot slots come from the batch upload, also ordered before
 * the step's first kernel.
 *
 * SPLIT (ctx->gdn_split, DS_CUDA_GDN_SPLIT): a value head's dv state columns are shared by a
 * cluster of SPLIT blocks, DV / SPLIT columns each. The columns of the recurrence are independent
 * (kv = Sᵀk and o = Sᵀq reduce over rows), so only the gated RMSNorm over dv crosses blocks: one
 * partial sum per block per token through distributed shared memory. Why: at batch 1 the kernel
 * is 32 blocks of 512 threads on 132 SMs, each streaming a 64 KiB state through one SM; split
 * 4 spreads that over 128 blocks and shortens every barrier. Every block convolves and
 * normalises its key head's q and k itself (cheap); rank 0 alone writes their conv history.
 * SEG: row segments of the state; a block is SEG·DV/SPLIT threads, each holding DK/SEG rows of
 * one column. */
template <int DK, int DV, int SPLIT, int SEG>
__global__ void __launch_bounds__(SEG * (DV / SPLIT)) gdn_kernel(ds_cuda_batch b, ds_cuda_gdn_args a, int early) {
    constexpr int KC = GDN_KC;
    constexpr int DVB = DV / SPLIT;     /* state columns of this block */
    constexpr int NT = SEG * DVB;       /* threads */
    constexpr int RPS = DK / SEG;       /* state rows per thread */
    constexpr int NCH = 2 * DK + DV;    /* channels of the head (conv history layout) */
    constexpr int NCB = 2 * DK + DVB;   /* channels convolved by this block */
    constexpr int CPT = NCB / NT + 1;   /* channels a thread (+ the gates, channel index NCB) */
    constexpr int NW = NT / 32;
    static_assert(DV % SPLIT == 0 && DVB % 32 == 0 || SPLIT == 1, "a block's columns: whole warps");
    static_assert(DK % SEG == 0, "rows split evenly");
    __shared__ float qs[DK], ks[DK], vs[DVB];
    __shared__ float red1[SEG][DVB], red2[SEG][DVB];
    __shared__ float scal[2];
    __shared__ float qred[NW], kred[NW]; /* q/k sums of squares per warp */
    __shared__ float ored[NW];           /* o² per warp (separate arrays: no reuse race) */
    __shared__ float cl_ms[2];           /* SPLIT > 1: this block's Σo², by token parity */

    if (!early) pdl_enter(); /* cuda_launch.cuh: before any access */

    const int h = blockIdx.x / SPLIT, rank = blockIdx.x % SPLIT, s = blockIdx.y;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int j = tid % DVB, seg = tid / DVB;
    const int col0 = rank * DVB; /* this block's first column of the head */
    const int hk = a.hk, hv = a.hv;
    const int kh = h / (hv / hk);
    const int64_t conv_dim = 2 * (int64_t)hk * DK + (int64_t)hv * DV;
    const int64_t ldp = conv_dim + (int64_t)hv * DV + 2 * hv;
    const int slot = b.seq_slot[s];
    const int ts = b.seq_start[s], te = b.seq_start[s + 1];

    float *S = a.state + (int64_t)slot * a.state_slot_stride + (int64_t)h * DK * DV + col0;
    float *CH = a.conv_hist + (int64_t)slot * a.conv_slot_stride + (int64_t)h * NCH * (KC - 1);
    /* speculative verification: the state after token t goes to slot state_out[t] (when ≥ 0)
     * and the sequence's own slot is only read */
    bool snap = false;
    if (b.state_out)
        for (int t = ts; t < te; t++) snap |= b.state_out[t] >= 0;

    /* this thread's conv channels c = tid + i·NT (< NCB; c == NCB: the gates instead):
     * gc its column of the projection, hc its row of the head's conv history, own whether this
     * block writes that history (the q/k channels: rank 0) */
    int64_t gc[CPT];
    int hc[CPT];
    bool own[CPT];
#pragma unroll
    for (int i = 0; i < CPT; i++) {
        const int c = tid + i * NT;
        gc[i] = 0;
        hc[i] = c < 2 * DK ? c : 2 * DK + col0 + (c - 2 * DK);
        own[i] = c < NCB && (c >= 2 * DK || rank == 0);
        if (c < DK) gc[i] = (int64_t)kh * DK + c;
        else if (c < 2 * DK) gc[i] = (int64_t)hk * DK + (int64_t)kh * DK + (c - DK);
        else if (c < NCB) gc[i] = 2 * (int64_t)hk * DK + (int64_t)h * DV + col0 + (c - 2 * DK);
    }
    float cw[CPT][KC], hist[CPT][KC - 1];
    float st[RPS];
    if (ts < te) {
#pragma unroll
        for (int i = 0; i < CPT; i++) {
            if (tid + i * NT >= NCB) continue;
#pragma unroll
            for (int k = 0; k < KC; k++) cw[i][k] = a.conv_w[gc[i] * KC + k];
#pragma unroll
            for (int k = 0; k < KC - 1; k++) hist[i][k] = CH[hc[i] * (KC - 1) + k];
        }
#pragma unroll
        for (int ii = 0; ii < RPS; ii++) st[ii] = S[(int64_t)(seg * RPS + ii) * DV + j];
    }
    if (early) pdl_enter();
    if (ts >= te) return; /* the whole cluster: its blocks share the sequence */

    const float qscale0 = rsqrtf((float)DK);
    /* This thread's inputs of token t (its conv channels; the gate pair; its z), loaded one
     * token ahead: the loads for t + 1 are in flight while token t's recurrence runs, so a
     * prefill token costs the recurrence's synchronisations, not also a global-memory latency. */
    const int64_t g_off = conv_dim + (int64_t)hv * DV;
    const bf16 zero = __float2bfloat16_rn(0.f);
    struct inputs {
        bf16 x[CPT], b, a, z;
    };
    auto load_inputs = [&](int t, inputs &in) {
        const bf16 *prow = (const bf16 *)a.proj + (int64_t)t * ldp;
#pragma unroll
        for (int i = 0; i < CPT; i++) {
            const int c = tid + i * NT;
            if (c < NCB) in.x[i] = prow[gc[i]];
            else if (c == NCB) {
                in.b = prow[g_off + h];
                in.a = prow[g_off + hv + h];
            }
        }
        if (tid < DVB) in.z = prow[conv_dim + (int64_t)h * DV + col0 + tid];
    };
    const float dt_bias_h = a.dt_bias[h], neg_a_h = a.neg_exp_A[h];
    const float norm_w_j = tid < DVB ? a.norm_w[col0 + tid] : 0.f;
    inputs nxt;
#pragma unroll
    for (int i = 0; i < CPT; i++) nxt.x[i] = zero;
    nxt.b = nxt.a = nxt.z = zero;
    load_inputs(ts, nxt);
    for (int t = ts; t < te; t++) {
        const inputs cur = nxt;
        if (t + 1 < te) load_inputs(t + 1, nxt);
        const bool snap_t = snap && b.state_out[t] >= 0;
        /* conv (kernel KC, causal, over history + this token) + SiLU; q/k sums of squares */
        float sq = 0.f, sk = 0.f;
#pragma unroll
        for (int i = 0; i < CPT; i++) {
            const int c = tid + i * NT;
            if (c < NCB) {
                const float y = silu_f(conv_step<KC>(cw[i], hist[i], to_f32(cur.x[i])));
                if (snap_t && own[i]) {
                    float *CHo = a.conv_hist + (int64_t)b.state_out[t] * a.conv_slot_stride +
                                 (int64_t)h * NCH * (KC - 1);
#pragma unroll
                    for (int k = 0; k < KC - 1; k++) CHo[hc[i] * (KC - 1) + k] = hist[i][k];
                }
                if (c < DK) {
                    qs[c] = y;
                    sq += y * y;
                } else if (c < 2 * DK) {
                    ks[c - DK] = y;
                    sk += y * y;
                } else vs[c - 2 * DK] = y;
            } else if (c == NCB) {
                const float bb = to_f32(cur.b);
                const float aa = to_f32(cur.a) + dt_bias_h;
                const float sp = aa > 20.f ? aa : log1pf(expf(aa)); /* softplus, torch threshold 20 */
                scal[0] = sigmoid_f(bb);                            /* β */
                scal[1] = expf(neg_a_h * sp);                       /* α = exp(g) */
            }
        }
        /* q/k L2 norms */
        sq = warp_sum(sq);
        sk = warp_sum(sk);
        if (lane == 0) {
            qred[warp] = sq;
            kred[warp] = sk;
        }
        __syncthreads();
        float qss = 0.f, kss = 0.f;
#pragma unroll
        for (int w = 0; w < NW; w++) {
            qss += qred[w];
            kss += kred[w];
        }
        const float qscale = rsqrtf(qss + 1e-6f) * qscale0;
        const float kscale = rsqrtf(kss + 1e-6f);
        const float beta = scal[0], alpha = scal[1];

        /* S ← α·S;  kv = Sᵀk */
        float part = 0.f;
#pragma unroll
        for (int ii = 0; ii < RPS; ii++) {
            st[ii] *= alpha;
            part = fmaf(st[ii], ks[seg * RPS + ii] * kscale, part);
        }
        red1[seg][j] = part;
        __syncthreads();
        float kv = 0.f;
#pragma unroll
        for (int sg = 0; sg < SEG; sg++) kv += red1[sg][j];
        /* δ = β·(v − kv);  S ← S + k·δᵀ;  o = Sᵀq */
        const float delta = beta * (vs[j] - kv);
        float part2 = 0.f;
#pragma unroll
        for (int ii = 0; ii < RPS; ii++) {
            st[ii] = fmaf(ks[seg * RPS + ii] * kscale, delta, st[ii]);
            part2 = fmaf(st[ii], qs[seg * RPS + ii] * qscale, part2);
        }
        red2[seg][j] = part2;
        if (snap_t) {
            float *So = a.state + (int64_t)b.state_out[t] * a.state_slot_stride + (int64_t)h * DK * DV + col0;
#pragma unroll
            for (int ii = 0; ii < RPS; ii++) So[(int64_t)(seg * RPS + ii) * DV + j] = st[ii];
        }
        __syncthreads();
        /* gated RMSNorm over dv: o·rsqrt(mean(o²) + eps)·w·SiLU(z) */
        float o = 0.f;
        if (tid < DVB) {
#pragma unroll
            for (int sg = 0; sg < SEG; sg++) o += red2[sg][tid];
        }
        const float o2 = warp_sum(tid < DVB ? o * o : 0.f);
        if (lane == 0) ored[warp] = o2;
        __syncthreads();
        float ms = 0.f;
        if constexpr (SPLIT == 1) {
            if (tid < DVB) {
#pragma unroll
                for (int w = 0; w < (DVB + 31) / 32; w++) ms += ored[w];
            }
        } else {
            /* the cluster's Σo²: each block's partial (parity buffer: a peer may still read the
             * previous token's while this one is written), the cluster barrier, then every
             * partial in rank order (the same sum in every block) */
            cg::cluster_group cluster = cg::this_cluster();
            if (tid == 0) {
                float mb = 0.f;
#pragma unroll
                for (int w = 0; w < DVB / 32; w++) mb += ored[w];
                cl_ms[t & 1] = mb;
            }
            cluster.sync();
            if (tid < DVB) {
#pragma unroll
                for (int r = 0; r < SPLIT; r++) ms += cluster.map_shared_rank(cl_ms, r)[t & 1];
            }
        }
        if (tid < DVB) {
            const float n = o * rsqrtf(ms / (float)DV + a.eps);
            const float z = to_f32(cur.z);
            ((bf16 *)a.out)[(int64_t)t * hv * DV + (int64_t)h * DV + col0 + tid] =
                __float2bfloat16_rn(n * norm_w_j * silu_f(z));
        }
    }
    /* SPLIT > 1: no block leaves while a peer may still read its partials */
    if constexpr (SPLIT > 1) cg::this_cluster().sync();

    if (snap) return;
#pragma unroll
    for (int ii = 0; ii < RPS; ii++) S[(int64_t)(seg * RPS + ii) * DV + j] = st[ii];
#pragma unroll
    for (int i = 0; i < CPT; i++) {
        if (own[i]) {
#pragma unroll
            for (int k = 0; k < KC - 1; k++) CH[hc[i] * (KC - 1) + k] = hist[i][k];
        }
    }
}

/* Launches gdn_kernel<D, D, SPLIT, SEG> with SPLIT blocks a value head, a cluster of them. */
template <int D, int SPLIT, int SEG>
static void gdn_launch(ds_cuda_ctx *ctx, const ds_cuda_gdn_args *a) {
    const dim3 grid(a->hv * SPLIT, ctx->batch.n_seqs);
    ds_launch_cluster(ctx, SPLIT, gdn_kernel<D, D, SPLIT, SEG>, grid, SEG * (D / SPLIT), 0, ctx->batch, *a,
                      ctx->gdn_early);
}

extern "C" void ds_cuda_gdn(ds_cuda_ctx *ctx, const ds_cuda_gdn_args *a) {
    if (ctx->batch.n_tokens <= 0) return;
    if (ds_cuda_gdn_prefill(ctx, a)) return; /* long runs of tokens: cuda_gdn_prefill.cu */
    const int shape = (a->dk == a->dv && a->kernel == GDN_KC && a->hk > 0 && a->hv % a->hk == 0) ? a->dk : 0;
    /* split: at least a warp of columns a block (dv 128: 2 or 4; dv 64: 2) */
    const int split = ctx->gdn_split == 4 && shape == 128 ? 4 : ctx->gdn_split >= 2 && shape >= 64 ? 2 : 1;
    switch (shape * 8 + split) {
    case 16 * 8 + 1: gdn_launch<16, 1, GDN_SEG>(ctx, a); break;
    case 32 * 8 + 1: gdn_launch<32, 1, GDN_SEG>(ctx, a); break;
    case 64 * 8 + 1: gdn_launch<64, 1, GDN_SEG>(ctx, a); break;
    case 64 * 8 + 2: gdn_launch<64, 2, GDN_SEG>(ctx, a); break;
    case 128 * 8 + 1: gdn_launch<128, 1, GDN_SEG>(ctx, a); break;
    case 128 * 8 + 2: gdn_launch<128, 2, GDN_SEG>(ctx, a); break;     /* 256 threads, 32 rows each */
    case 128 * 8 + 4: gdn_launch<128, 4, 2 * GDN_SEG>(ctx, a); break; /* 256 threads, 16 rows each */
    default:
        ds_cuda_check(ctx, cudaErrorInvalidValue,
                      "gdn: built for dk = dv in {16, 32, 64, 128} and conv kernel 4", __FILE__,
                      __LINE__);
        return;
    }
    DS_CU_LAUNCHED2(ctx, "gdn_kernel", a->hv * split, ctx->batch.n_seqs);
}
