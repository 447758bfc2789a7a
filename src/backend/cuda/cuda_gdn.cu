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
#include <math.h>

#include "cuda_launch.cuh"

#define GDN_KC 4  /* conv kernel (all Qwen3.5 configs) */
#define GDN_SEG 4 /* row segments of the state: block = GDN_SEG·dv threads */

/* early, bit 0 (ctx->gdn_early, DS_CUDA_GDN_EARLY): the block reads its state, conv history and conv
 * weights before its dependency wait, while the input projection that precedes it still runs.
 * This widens cuda_launch.cuh's contract, soundly: under PDL this kernel starts only once every
 * kernel before its predecessor has completed, and the state and conv history of a (slot,
 * layer) are written only by this layer's GDN kernels (of earlier steps: done long before), by
 * cache_reset_slot's memsets (ordered before the step's first kernel) and never by the input
 * projection; the slot ids and snapshot slots come from the batch upload, also ordered before
 * the step's first kernel. Bit 1 (DS_CUDA_DIAG_SKIP=gdn_nostore, a measurement, wrong results):
 * no state or conv-history store at the end. */
template <int DK, int DV>
__global__ void __launch_bounds__(GDN_SEG * DV) gdn_kernel(ds_cuda_batch b, ds_cuda_gdn_args a, int early) {
    constexpr int KC = GDN_KC;
    constexpr int SEG = GDN_SEG;
    constexpr int NT = SEG * DV;      /* threads */
    constexpr int RPS = DK / SEG;     /* state rows per thread */
    constexpr int NCH = 2 * DK + DV;  /* channels convolved by this block */
    constexpr int NW = NT / 32;
    static_assert(NCH < NT, "one thread per conv channel plus one for the gates");
    __shared__ float qs[DK], ks[DK], vs[DV];
    __shared__ float red1[SEG][DV], red2[SEG][DV];
    __shared__ float scal[2];
    __shared__ float qred[NW], kred[NW]; /* q/k sums of squares per warp */
    __shared__ float ored[NW];           /* o² per warp (separate arrays: no reuse race) */

    const int diag_nostore = early & 2; /* DS_CUDA_DIAG_SKIP=gdn_nostore: measurement only */
    early &= 1;
    if (!early) pdl_enter(); /* cuda_launch.cuh: before any access */

    const int h = blockIdx.x, s = blockIdx.y;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int j = tid % DV, seg = tid / DV;
    const int hk = a.hk, hv = a.hv;
    const int kh = h / (hv / hk);
    const int64_t conv_dim = 2 * (int64_t)hk * DK + (int64_t)hv * DV;
    const int64_t ldp = conv_dim + (int64_t)hv * DV + 2 * hv;
    const int slot = b.seq_slot[s];
    const int ts = b.seq_start[s], te = b.seq_start[s + 1];

    float *S = a.state + (int64_t)slot * a.state_slot_stride + (int64_t)h * DK * DV;
    float *CH = a.conv_hist + (int64_t)slot * a.conv_slot_stride + (int64_t)h * NCH * (KC - 1);
    /* speculative verification: the state after token t goes to slot state_out[t] (when ≥ 0)
     * and the sequence's own slot is only read */
    bool snap = false;
    if (b.state_out)
        for (int t = ts; t < te; t++) snap |= b.state_out[t] >= 0;

    /* this thread's conv channel (threads ≥ NCH have none) */
    const int c = tid;
    int64_t gc = 0;
    if (c < DK) gc = (int64_t)kh * DK + c;
    else if (c < 2 * DK) gc = (int64_t)hk * DK + (int64_t)kh * DK + (c - DK);
    else if (c < NCH) gc = 2 * (int64_t)hk * DK + (int64_t)h * DV + (c - 2 * DK);
    float cw[KC], hist[KC - 1];
    float st[RPS];
    if (ts < te) {
        if (c < NCH) {
#pragma unroll
            for (int i = 0; i < KC; i++) cw[i] = a.conv_w[gc * KC + i];
#pragma unroll
            for (int i = 0; i < KC - 1; i++) hist[i] = CH[c * (KC - 1) + i];
        }
#pragma unroll
        for (int ii = 0; ii < RPS; ii++) st[ii] = S[(int64_t)(seg * RPS + ii) * DV + j];
    }
    if (early) pdl_enter();
    if (ts >= te) return;

    const float qscale0 = rsqrtf((float)DK);
    /* This thread's inputs of token t (its conv channel; the gate pair; its z), loaded one
     * token ahead: the loads for t + 1 are in flight while token t's recurrence runs, so a
     * prefill token costs the recurrence's synchronisations, not also a global-memory latency. */
    const int64_t g_off = conv_dim + (int64_t)hv * DV;
    auto load_inputs = [&](int t, bf16 &xv, bf16 &bv, bf16 &av, bf16 &zv) {
        const bf16 *prow = (const bf16 *)a.proj + (int64_t)t * ldp;
        if (c < NCH) xv = prow[gc];
        else if (c == NCH) {
            bv = prow[g_off + h];
            av = prow[g_off + hv + h];
        }
        if (tid < DV) zv = prow[conv_dim + (int64_t)h * DV + tid];
    };
    const float dt_bias_h = a.dt_bias[h], neg_a_h = a.neg_exp_A[h];
    const float norm_w_j = tid < DV ? a.norm_w[tid] : 0.f;
    const bf16 zero = __float2bfloat16_rn(0.f);
    bf16 nx = zero, nb = zero, na = zero, nz = zero;
    load_inputs(ts, nx, nb, na, nz);
    for (int t = ts; t < te; t++) {
        const bf16 cx = nx, cb = nb, ca = na, cz = nz;
        if (t + 1 < te) load_inputs(t + 1, nx, nb, na, nz);
        /* conv (kernel KC, causal, over history + this token) + SiLU */
        float y = 0.f;
        if (c < NCH) {
            y = silu_f(conv_step<KC>(cw, hist, to_f32(cx)));
            if (snap && b.state_out[t] >= 0) {
                float *CHo = a.conv_hist + (int64_t)b.state_out[t] * a.conv_slot_stride +
                             (int64_t)h * NCH * (KC - 1);
#pragma unroll
                for (int i = 0; i < KC - 1; i++) CHo[c * (KC - 1) + i] = hist[i];
            }
            if (c < DK) qs[c] = y;
            else if (c < 2 * DK) ks[c - DK] = y;
            else vs[c - 2 * DK] = y;
        } else if (c == NCH) {
            const float bb = to_f32(cb);
            const float aa = to_f32(ca) + dt_bias_h;
            const float sp = aa > 20.f ? aa : log1pf(expf(aa)); /* softplus, torch threshold 20 */
            scal[0] = sigmoid_f(bb);                            /* β */
            scal[1] = expf(neg_a_h * sp);                       /* α = exp(g) */
        }
        /* q/k L2 norms */
        const float sq = warp_sum(c < DK ? y * y : 0.f);
        const float sk = warp_sum(c >= DK && c < 2 * DK ? y * y : 0.f);
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
        if (snap && b.state_out[t] >= 0) {
            float *So = a.state + (int64_t)b.state_out[t] * a.state_slot_stride + (int64_t)h * DK * DV;
#pragma unroll
            for (int ii = 0; ii < RPS; ii++) So[(int64_t)(seg * RPS + ii) * DV + j] = st[ii];
        }
        __syncthreads();
        /* gated RMSNorm over dv: o·rsqrt(mean(o²) + eps)·w·SiLU(z) */
        float o = 0.f;
        if (tid < DV) {
#pragma unroll
            for (int sg = 0; sg < SEG; sg++) o += red2[sg][tid];
        }
        const float o2 = warp_sum(tid < DV ? o * o : 0.f);
        if (lane == 0) ored[warp] = o2;
        __syncthreads();
        if (tid < DV) {
            float ms = 0.f;
#pragma unroll
            for (int w = 0; w < (DV + 31) / 32; w++) ms += ored[w];
            const float n = o * rsqrtf(ms / (float)DV + a.eps);
            const float z = to_f32(cz);
            ((bf16 *)a.out)[(int64_t)t * hv * DV + (int64_t)h * DV + tid] =
                __float2bfloat16_rn(n * norm_w_j * silu_f(z));
        }
    }

    if (snap || diag_nostore) return;
#pragma unroll
    for (int ii = 0; ii < RPS; ii++) S[(int64_t)(seg * RPS + ii) * DV + j] = st[ii];
    if (c < NCH) {
#pragma unroll
        for (int i = 0; i < KC - 1; i++) CH[c * (KC - 1) + i] = hist[i];
    }
}

extern "C" void ds_cuda_gdn(ds_cuda_ctx *ctx, const ds_cuda_gdn_args *a) {
    if (ctx->batch.n_tokens <= 0) return;
    if (ds_cuda_gdn_prefill(ctx, a)) return; /* long runs of tokens: cuda_gdn_prefill.cu */
    const dim3 grid(a->hv, ctx->batch.n_seqs);
    /* bit 0: the early state read; bit 1 (DS_CUDA_DIAG_SKIP containing "gdn_nostore", a
     * measurement of what the state's store costs the step, never for serving): no store */
    const int flags = ctx->gdn_early | (ctx->diag_gdn_nostore ? 2 : 0);
    const int shape = (a->dk == a->dv && a->kernel == GDN_KC && a->hk > 0 && a->hv % a->hk == 0) ? a->dk : 0;
    switch (shape) {
    case 16: ds_launch(ctx, gdn_kernel<16, 16>, grid, GDN_SEG * 16, 0, ctx->batch, *a, flags); break;
    case 32: ds_launch(ctx, gdn_kernel<32, 32>, grid, GDN_SEG * 32, 0, ctx->batch, *a, flags); break;
    case 64: ds_launch(ctx, gdn_kernel<64, 64>, grid, GDN_SEG * 64, 0, ctx->batch, *a, flags); break;
    case 128: ds_launch(ctx, gdn_kernel<128, 128>, grid, GDN_SEG * 128, 0, ctx->batch, *a, flags); break;
    default:
        ds_cuda_check(ctx, cudaErrorInvalidValue,
                      "gdn: built for dk = dv in {16, 32, 64, 128} and conv kernel 4", __FILE__,
                      __LINE__);
        return;
    }
    DS_CU_LAUNCHED2(ctx, "gdn_kernel", a->hv, ctx->batch.n_seqs);
}
