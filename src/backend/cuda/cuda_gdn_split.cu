/* cuda_gdn_split.cu — the GDN decode kernel (cuda_gdn.cu) with each value head's state columns
 * spread over a thread block cluster (ctx->gdn_split, DS_CUDA_GDN_SPLIT).
 *
 * Why: at batch 1 the 35B-A3B's GDN layer is 32 blocks of 512 threads, one an SM, each reading
 * and writing its head's 64 KB of fp32 state and walking the token's chain of block barriers
 * (conv → q/k norms → Sᵀk → δ, S update, Sᵀq → gated norm). In the step it costs ~6.2 µs a
 * layer for 4 MB of state (s33-run2, DS_CUDA_DIAG_SKIP=gdn_kernel), where a GEMV phase of that
 * size costs ~3.6. Here a head is a cluster of CS = dv / 32 blocks of 128 threads: block `part`
 * holds state columns [32·part, 32·part + 32) (16 KB), so the state moves through 4× as many SMs
 * and each barrier spans 4 warps, not 16.
 *
 * Everything but the gated RMSNorm is per column: every block convolves the key head's q and k
 * channels itself (the same values in each) and its own 32 v channels. The norm's Σ o² over the
 * head's dv columns is the one exchange: each block's warp 0 holds its 32 columns, so its
 * warp_sum is exactly the unsplit kernel's per-warp sum; the blocks publish it in shared memory
 * and, after a cluster barrier, each adds the CS sums in rank order — the unsplit kernel's order.
 * The q/k norms' per-warp sums cover the same 32 channels as there too, so the outputs, states
 * and conv histories are the unsplit kernel's bits (test_cuda_ops compares them).
 *
 * Conv history: the q/k channels' history is the same in every block of a head; block 0 writes
 * it, each block its own v channels. PDL and the early state read are as in gdn_kernel. */
#include <cooperative_groups.h>

#include "cuda_gdn.cuh"
#include "cuda_launch.cuh"

namespace cg = cooperative_groups;

#define GDN_SPLIT_COLS 32 /* state columns a block: one warp's worth (see above) */

template <int D>
__global__ void __launch_bounds__(GDN_SEG * GDN_SPLIT_COLS)
    gdn_split_kernel(ds_cuda_batch b, ds_cuda_gdn_args a, int early) {
    constexpr int KC = GDN_KC;
    constexpr int SEG = GDN_SEG;
    constexpr int DK = D, DV = D;
    constexpr int DVP = GDN_SPLIT_COLS;        /* this block's columns */
    constexpr int CS = DV / DVP;               /* blocks a head (the cluster) */
    constexpr int NT = SEG * DVP;              /* threads */
    constexpr int RPS = DK / SEG;              /* state rows a thread */
    constexpr int NCH = 2 * DK + DVP;          /* channels convolved: q, k of the key head; own v */
    constexpr int CPT = (NCH + NT - 1) / NT;   /* channels a thread: c = tid + NT·i */
    constexpr int NW = NT / 32;
    static_assert(DV % DVP == 0 && DK % NT == 0, "q and k channels in whole rounds of the block");
    __shared__ float qs[DK], ks[DK], vs[DVP];
    __shared__ float red1[SEG][DVP], red2[SEG][DVP];
    __shared__ float scal[2];
    __shared__ float qred[NW], kred[NW]; /* per-warp sums of squares of 32 q / k channels */
    __shared__ float osum[2];            /* Σ o² of this block's columns, by token parity */

    if (!early) pdl_enter(); /* cuda_launch.cuh: before any access */

    cg::cluster_group cluster = cg::this_cluster();
    const int part = (int)cluster.block_rank();
    const int h = blockIdx.x / CS, s = blockIdx.y;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int j = tid % DVP, seg = tid / DVP;
    const int jg = part * DVP + j; /* this thread's state column in the head */
    const int hk = a.hk, hv = a.hv;
    const int kh = h / (hv / hk);
    const int64_t conv_dim = 2 * (int64_t)hk * DK + (int64_t)hv * DV;
    const int64_t ldp = conv_dim + (int64_t)hv * DV + 2 * hv;
    const int slot = b.seq_slot[s];
    const int ts = b.seq_start[s], te = b.seq_start[s + 1];

    float *S = a.state + (int64_t)slot * a.state_slot_stride + (int64_t)h * DK * DV;
    float *CH = a.conv_hist + (int64_t)slot * a.conv_slot_stride + (int64_t)h * (2 * DK + DV) * (KC - 1);
    bool snap = false;
    if (b.state_out)
        for (int t = ts; t < te; t++) snap |= b.state_out[t] >= 0;

    /* this thread's channels c = tid + NT·i: global input column gc, history row hc (the
     * unsplit block's channel numbering: q, k, then the head's dv v channels) */
    int64_t gc[CPT];
    int hc[CPT];
    bool has[CPT];
#pragma unroll
    for (int i = 0; i < CPT; i++) {
        const int c = tid + NT * i;
        has[i] = c < NCH;
        if (c < DK) gc[i] = (int64_t)kh * DK + c, hc[i] = c;
        else if (c < 2 * DK) gc[i] = (int64_t)hk * DK + (int64_t)kh * DK + (c - DK), hc[i] = c;
        else gc[i] = 2 * (int64_t)hk * DK + (int64_t)h * DV + part * DVP + (c - 2 * DK),
             hc[i] = 2 * DK + part * DVP + (c - 2 * DK);
        if (!has[i]) gc[i] = 0, hc[i] = 0;
    }
    /* q / k history rows are written by block 0 only (the same values in every block) */
    auto writes_hist = [&](int i) { return has[i] && (hc[i] >= 2 * DK || part == 0); };
    float cw[CPT][KC], hist[CPT][KC - 1];
    float st[RPS];
    if (ts < te) {
#pragma unroll
        for (int i = 0; i < CPT; i++) {
            if (!has[i]) continue;
#pragma unroll
            for (int q = 0; q < KC; q++) cw[i][q] = a.conv_w[gc[i] * KC + q];
#pragma unroll
            for (int q = 0; q < KC - 1; q++) hist[i][q] = CH[hc[i] * (KC - 1) + q];
        }
#pragma unroll
        for (int ii = 0; ii < RPS; ii++) st[ii] = S[(int64_t)(seg * RPS + ii) * DV + jg];
    }
    if (early) pdl_enter();
    if (ts >= te) return; /* the whole cluster (one sequence): no shared memory was shared */

    const float qscale0 = rsqrtf((float)DK);
    const int64_t g_off = conv_dim + (int64_t)hv * DV;
    const bool gate_thread = tid == NT - 1;
    auto load_inputs = [&](int t, bf16 (&xv)[CPT], bf16 &bv, bf16 &av, bf16 &zv) {
        const bf16 *prow = (const bf16 *)a.proj + (int64_t)t * ldp;
#pragma unroll
        for (int i = 0; i < CPT; i++)
            if (has[i]) xv[i] = prow[gc[i]];
        if (gate_thread) {
            bv = prow[g_off + h];
            av = prow[g_off + hv + h];
        }
        if (tid < DVP) zv = prow[conv_dim + (int64_t)h * DV + part * DVP + tid];
    };
    const float dt_bias_h = a.dt_bias[h], neg_a_h = a.neg_exp_A[h];
    const float norm_w_j = tid < DVP ? a.norm_w[part * DVP + tid] : 0.f;
    const bf16 zero = __float2bfloat16_rn(0.f);
    bf16 nx[CPT], nb = zero, na = zero, nz = zero;
#pragma unroll
    for (int i = 0; i < CPT; i++) nx[i] = zero;
    load_inputs(ts, nx, nb, na, nz);
    for (int t = ts; t < te; t++) {
        bf16 cx[CPT];
#pragma unroll
        for (int i = 0; i < CPT; i++) cx[i] = nx[i];
        const bf16 cb = nb, ca = na, cz = nz;
        if (t + 1 < te) load_inputs(t + 1, nx, nb, na, nz);
        /* conv + SiLU of this thread's channels; the q / k sums of squares a warp */
        float yq = 0.f, yk = 0.f;
#pragma unroll
        for (int i = 0; i < CPT; i++) {
            if (!has[i]) continue;
            const int c = tid + NT * i;
            const float y = silu_f(conv_step<KC>(cw[i], hist[i], to_f32(cx[i])));
            if (snap && b.state_out[t] >= 0 && writes_hist(i)) {
                float *CHo = a.conv_hist + (int64_t)b.state_out[t] * a.conv_slot_stride +
                             (int64_t)h * (2 * DK + DV) * (KC - 1);
#pragma unroll
                for (int q = 0; q < KC - 1; q++) CHo[hc[i] * (KC - 1) + q] = hist[i][q];
            }
            if (c < DK) qs[c] = y, yq = y;
            else if (c < 2 * DK) ks[c - DK] = y, yk = y;
            else vs[c - 2 * DK] = y;
        }
        if (gate_thread) {
            const float bb = to_f32(cb);
            const float aa = to_f32(ca) + dt_bias_h;
            const float sp = aa > 20.f ? aa : log1pf(expf(aa)); /* softplus, torch threshold 20 */
            scal[0] = sigmoid_f(bb);                            /* β */
            scal[1] = expf(neg_a_h * sp);                       /* α = exp(g) */
        }
        /* q channels are round 0 (c = tid), k channels round 1: warp w sums channels 32w.. of
         * each, as warp w (q) and warp DK/32 + w (k) of the unsplit block do */
        const float sq = warp_sum(yq * yq);
        const float sk = warp_sum(yk * yk);
        if (lane == 0) {
            qred[warp] = sq;
            kred[warp] = sk;
        }
        __syncthreads();
        /* the unsplit block adds its 16 per-warp sums in warp order: q's four then zeros, and
         * zeros, k's four, zeros — the same sums as these (sums of squares: x + 0 = x) */
        static_assert(NT == DK, "one q and one k channel a thread: warp w's sums are channels 32w..");
        float qss = 0.f, kss = 0.f;
#pragma unroll
        for (int w = 0; w < NW; w++) qss += qred[w];
#pragma unroll
        for (int w = 0; w < NW; w++) kss += kred[w];
        const float qscale = rsqrtf(qss + 1e-6f) * qscale0;
        const float kscale = rsqrtf(kss + 1e-6f);
        const float beta = scal[0], alpha = scal[1];

        /* S ← α·S;  kv = Sᵀk */
        float part1 = 0.f;
#pragma unroll
        for (int ii = 0; ii < RPS; ii++) {
            st[ii] *= alpha;
            part1 = fmaf(st[ii], ks[seg * RPS + ii] * kscale, part1);
        }
        red1[seg][j] = part1;
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
            for (int ii = 0; ii < RPS; ii++) So[(int64_t)(seg * RPS + ii) * DV + jg] = st[ii];
        }
        __syncthreads();
        /* gated RMSNorm over the head's dv columns: Σ o² from every block of the cluster */
        float o = 0.f;
        if (tid < DVP) {
#pragma unroll
            for (int sg = 0; sg < SEG; sg++) o += red2[sg][tid];
        }
        const float o2 = warp_sum(tid < DVP ? o * o : 0.f);
        if (tid == 0) osum[t & 1] = o2;
        cluster.sync(); /* every block's osum[t & 1] written; the next token's goes to the other */
        if (tid < DVP) {
            float ms = 0.f;
#pragma unroll
            for (int r = 0; r < CS; r++) ms += *cluster.map_shared_rank(&osum[t & 1], r);
            const float n = o * rsqrtf(ms / (float)DV + a.eps);
            const float z = to_f32(cz);
            ((bf16 *)a.out)[(int64_t)t * hv * DV + (int64_t)h * DV + jg] =
                __float2bfloat16_rn(n * norm_w_j * silu_f(z));
        }
    }
    cluster.sync(); /* no block leaves while another may still read its osum */

    if (snap) return;
#pragma unroll
    for (int ii = 0; ii < RPS; ii++) S[(int64_t)(seg * RPS + ii) * DV + jg] = st[ii];
#pragma unroll
    for (int i = 0; i < CPT; i++) {
        if (!writes_hist(i)) continue;
#pragma unroll
        for (int q = 0; q < KC - 1; q++) CH[hc[i] * (KC - 1) + q] = hist[i][q];
    }
}

/* The split launch where ctx->gdn_split and the shape is built (dk = dv = 128, conv kernel 4):
 * returns whether it ran. */
extern "C" bool ds_cuda_gdn_split(ds_cuda_ctx *ctx, const ds_cuda_gdn_args *a) {
    if (!ctx->gdn_split || a->dk != 128 || a->dv != 128 || a->kernel != GDN_KC || a->hk <= 0 ||
        a->hv % a->hk)
        return false;
    constexpr int CS = 128 / GDN_SPLIT_COLS;
    const dim3 grid(a->hv * CS, ctx->batch.n_seqs);
    ds_launch_clustered(ctx, gdn_split_kernel<128>, grid, GDN_SEG * GDN_SPLIT_COLS, 0, CS, ctx->batch, *a,
                        ctx->gdn_early);
    DS_CU_LAUNCHED2(ctx, "gdn_split_kernel", a->hv, ctx->batch.n_seqs);
    return true;
}
