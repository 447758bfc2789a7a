/* cuda_gdn_prefill.cu — Gated DeltaNet for steps with long runs of tokens per sequence
 * (prefill), in several launches instead of cuda_gdn.cu's one (DS_OPT_GDN_PREFILL).
 *
 * Why: the fused kernel walks a sequence's tokens in one block per value head (32 blocks at
 * Qwen3.5-35B-A3B), and per token it convolves, reduces the q/k norms, runs the recurrence and
 * the gated RMSNorm with four block-wide barriers and a global load in the chain: 1.7 µs a
 * token, 26 of the 78 ms of a 512-token prefill chunk. Only the recurrence is sequential in
 * time; everything else is parallel over tokens. So:
 *   1. prep   (8 tokens, key head) blocks: conv + SiLU of the key head's q, k and its value heads'
 *             v channels, q/k L2 norms (q also scaled by dk^-1/2), log-decay g and β
 *             → scratch q̂, k̂ [T, hk, dk], v [T, hv, dv], (g, β) [T, hv] (fp32);
 *   2. the recurrence → o [T, hv, dv] fp32 and the final states, either
 *      chunked   (default; cuda_gdn_chunked.cu) chunks of 64 tokens as matrix products, or
 *      scan      (DS_CUDA_GDN_CHUNKED=0) token by token: one warp per (sequence, value head,
 *                C = 4 or 2 state columns), lane l holds rows [4l, 4l + 4) of its columns in
 *                registers; per token S ← αS, kv = Sᵀk̂ (a warp sum), δ = β(v − kv),
 *                S ← S + k̂δ, o = Sᵀq̂ (a warp sum): no barriers, inputs loaded GP_SCAN_AHEAD
 *                tokens ahead; 2048 warps at 35B-A3B (C = 2);
 *   3. out    (8 tokens, value head) blocks: gated RMSNorm o·rsqrt(mean o² + eps)·w·SiLU(z) → bf16;
 *   4. hist   (sequence, value head) blocks: the conv history after the step's last token
 *             (after prep has read the old one).
 * The scan's arithmetic is the fused kernel's, in the same order per value except the
 * reductions (warp shuffles here): results agree to fp32 rounding; the chunked form is the CPU
 * backend's (cpu_gdn.c delta_rule_chunked). Built for dk = dv = 128 and conv kernel 4 (every
 * Qwen3.5 config); speculative snapshot steps (state_out) and other shapes keep the fused
 * kernel. Layouts as cuda_gdn.cu (conv history per value head, q/k duplicated). */
#include "cuda_gdn_prefill.cuh"
#include "cuda_mma.cuh"

#define GP_PREP_THREADS 512
#define GP_BLOCK_TOKENS 8 /* tokens a prep or out block */
#define GP_PREP_CPT DS_DIV_UP((2 + GP_MAX_G) * GP_DK, GP_PREP_THREADS) /* channels a prep thread */
#define GP_SCAN_WARPS 4  /* warps per scan block */
/* state columns per scan warp: a template parameter C of 2 or 4 (ctx->gdn_scan_cols, default
 * 2: 2048 warps at 35B-A3B, 96 registers, still one wave) */
#define GP_SCAN_AHEAD 4  /* tokens whose inputs a scan warp has in flight */

extern "C" size_t ds_cuda_gdn_prefill_scratch_bytes(int hk, int hv, int dk, int dv, int kernel) {
    if (dk != GP_DK || dv != GP_DK || kernel != GP_KC || hk <= 0 || hv % hk || hv / hk > GP_MAX_G)
        return 0;
    return sizeof(float) * (size_t)gdn_scratch_floats(DS_CUDA_MAX_TOKENS, hk, hv);
}

/* 1. prep: block (key head kh, tokens t0 … t0 + GP_BLOCK_TOKENS − 1), channels c of
 * [q (dk) | k (dk) | v of the G value heads (G·dv)], up to GP_PREP_CPT channels a thread. A
 * thread walks the block's tokens with its channel's last KC − 1 conv inputs in registers (one
 * new load a token while the tokens stay in one sequence) and keeps its outputs until one
 * barrier has the q / k norms of every token (s9-run4: one token a block, 125 µs a layer at
 * 1024 tokens, its time in per-token index math, four loads and a barrier). Same arithmetic
 * in the same order as one token a block.
 * PRE (ctx->gdn_prep_preload, DS_CUDA_GDN_PREP_PRELOAD): the channel's inputs of the block's
 * tokens and of the KC − 1 before them, and the tokens' sequence ids, all loaded before the
 * token loop — ncu's source view (s26-run2, H100) had the warps waiting at each token's bf16 →
 * fp32 conversion in turn, the loads issued one token at a time behind the window branch and
 * the q/k warp sums. The same values into the same arithmetic: the same bits.
 * QK (ctx->gdn_v_in_chunk with the chunked recurrence): the q and k channels only, 2·DK
 * threads a block; the chunked prep computes v itself (cuda_gdn_chunked.cu v_to_shared). */
template <bool PRE, bool QK>
__global__ void __launch_bounds__(GP_PREP_THREADS)
    gdn_prep_kernel(ds_cuda_batch b, ds_cuda_gdn_args a, gdn_scratch sc) {
    constexpr int DK = GP_DK, KC = GP_KC, NCH = 3 * GP_DK; /* history channels per value head */
    constexpr int TT = GP_BLOCK_TOKENS, CPT = QK ? 1 : GP_PREP_CPT, NT = QK ? 2 * GP_DK : GP_PREP_THREADS;
    static_assert(2 * DK <= NT, "q and k channels in a thread's first channel");
    __shared__ float red[2][TT][DK / 32]; /* per token: q / k sums of squares of each warp */
    pdl_enter(); /* cuda_launch.cuh: before any access */
    const int kh = blockIdx.x, t0 = blockIdx.y * TT;
    const int tn = min(TT, b.n_tokens - t0);
    const int hk = a.hk, hv = a.hv, G = hv / hk;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int64_t ldp = gdn_proj_ld(a);
    const bf16 *proj = (const bf16 *)a.proj;
    const int nch = QK ? 2 * DK : 2 * DK + G * DK;
    float y[CPT][TT];
    int seq[TT]; /* (PRE) the tokens' sequences, -1 past the step */
    if (PRE) {
#pragma unroll
        for (int tt = 0; tt < TT; tt++) seq[tt] = tt < tn ? b.tok_seq[t0 + tt] : -1;
    }
#pragma unroll
    for (int ci = 0; ci < CPT; ci++) {
        const int c = tid + ci * NT;
        if (c >= nch) continue;
        int64_t gc;
        int hh, ch; /* where the history keeps this channel: value head hh, channel ch */
        if (c < DK) {
            gc = (int64_t)kh * DK + c, hh = kh * G, ch = c;
        } else if (c < 2 * DK) {
            gc = (int64_t)hk * DK + (int64_t)kh * DK + (c - DK), hh = kh * G, ch = c;
        } else {
            const int vi = c - 2 * DK, h = kh * G + vi / DK, cv = vi % DK;
            gc = 2 * (int64_t)hk * DK + (int64_t)h * DK + cv, hh = h, ch = 2 * DK + cv;
        }
        float cw[KC];
#pragma unroll
        for (int i = 0; i < KC; i++) cw[i] = a.conv_w[gc * KC + i];
        float win[KC - 1]; /* x at run positions p − 3, p − 2, p − 1 */
        /* (PRE) x of tokens t0 − (KC − 1) … t0 + TT − 1 (those before the step's first token
         * are never used: the window takes the history there) */
        float xr[PRE ? KC - 1 + TT : 1];
        if (PRE) {
#pragma unroll
            for (int j = 0; j < KC - 1 + TT; j++) {
                const int t = t0 - (KC - 1) + j;
                xr[j] = t >= 0 && j < KC - 1 + tn ? to_f32(proj[(int64_t)t * ldp + gc]) : 0.f;
            }
        }
        int prev_s = -1;
#pragma unroll
        for (int tt = 0; tt < TT; tt++) {
            if (tt >= tn) continue;
            const int t = t0 + tt, s = PRE ? seq[tt] : b.tok_seq[t];
            if (s != prev_s) { /* first token of the block in this sequence: fill the window */
                const int ts = b.seq_start[s], p = t - ts;
                const float *hist = a.conv_hist + (int64_t)b.seq_slot[s] * a.conv_slot_stride +
                                    ((int64_t)hh * NCH + ch) * (KC - 1);
#pragma unroll
                for (int i = 0; i < KC - 1; i++) {
                    const int pp = p - (KC - 1) + i;
                    /* run position pp is token ts + pp = t − (KC − 1) + i, xr[tt + i] */
                    win[i] = pp >= 0 ? (PRE ? xr[tt + i] : to_f32(proj[(int64_t)(ts + pp) * ldp + gc]))
                                     : hist[KC - 1 + pp];
                }
                prev_s = s;
            }
            y[ci][tt] = silu_f(conv_step<KC>(cw, win, PRE ? xr[KC - 1 + tt] : to_f32(proj[(int64_t)t * ldp + gc])));
            if (ci == 0 && c < 2 * DK) { /* q (warps 0 … 3) or k (warps 4 … 7) */
                const float ss = warp_sum(y[ci][tt] * y[ci][tt]);
                if (lane == 0) red[c < DK ? 0 : 1][tt][warp & 3] = ss;
            }
        }
    }
    if (tid < G * TT) { /* g = log α and β of value head kh·G + tid % G, token t0 + tid / G */
        const int tt = tid / G, h = kh * G + tid % G, t = t0 + tt;
        if (tt < tn) *(float2 *)(sc.ab + ((int64_t)t * hv + h) * 2) = gdn_g_beta(a, t, h);
    }
    __syncthreads();
#pragma unroll
    for (int ci = 0; ci < CPT; ci++) {
        const int c = tid + ci * NT;
        if (c >= nch) continue;
#pragma unroll
        for (int tt = 0; tt < TT; tt++) {
            if (tt >= tn) continue;
            const int t = t0 + tt;
            if (c < 2 * DK) {
                const int qk = c < DK ? 0 : 1;
                float ss = 0.f;
#pragma unroll
                for (int w = 0; w < DK / 32; w++) ss += red[qk][tt][w];
                const float scale = qk == 0 ? rsqrtf(ss + 1e-6f) * rsqrtf((float)DK) : rsqrtf(ss + 1e-6f);
                float *dst = qk == 0 ? sc.q : sc.k;
                const float val = y[ci][tt] * scale;
                dst[((int64_t)t * hk + kh) * DK + (c & (DK - 1))] = tf32_if(qk == 0 && sc.q_tf32, val);
            } else {
                sc.v[((int64_t)t * hv + kh * G) * DK + (c - 2 * DK)] = y[ci][tt];
            }
        }
    }
}

/* C consecutive fp32 values (C = 2 or 4), one vector load / store */
template <int C> struct fcols {
    float v[C];
};
template <int C> static __device__ __forceinline__ fcols<C> ld_cols(const float *p) {
    fcols<C> r;
    if constexpr (C == 4) {
        const float4 x = *(const float4 *)p;
        r.v[0] = x.x, r.v[1] = x.y, r.v[2] = x.z, r.v[3] = x.w;
    } else {
        static_assert(C == 2, "2 or 4 columns");
        const float2 x = *(const float2 *)p;
        r.v[0] = x.x, r.v[1] = x.y;
    }
    return r;
}
template <int C> static __device__ __forceinline__ void st_cols(float *p, const float (&v)[C]) {
    if constexpr (C == 4) *(float4 *)p = make_float4(v[0], v[1], v[2], v[3]);
    else *(float2 *)p = make_float2(v[0], v[1]);
}

/* 2. scan: warp (sequence blockIdx.z, value head blockIdx.y, columns j0 .. j0 + C).
 * A warp serves C columns so that all warps of a 1-sequence prefill are resident at
 * once (the chain per token is latency, not work: more warps than fit in one wave multiply the
 * time; one column per warp with an 8-token ring needed 200 registers and ran 2.7x slower),
 * and the q̂ / k̂ loads serve all its columns. */
template <int C>
__global__ void __launch_bounds__(GP_SCAN_WARPS * 32)
    gdn_scan_kernel(ds_cuda_batch b, ds_cuda_gdn_args a, gdn_scratch sc) {
    constexpr int DK = GP_DK, DV = GP_DK, RPL = DK / 32; /* rows per lane */
    static_assert(RPL == 4, "float4 loads of q and k");
    pdl_enter(); /* cuda_launch.cuh: before any access */
    const int lane = threadIdx.x & 31;
    const int j0 = (blockIdx.x * GP_SCAN_WARPS + (threadIdx.x >> 5)) * C;
    const int h = blockIdx.y, s = blockIdx.z;
    const int hk = a.hk, hv = a.hv, kh = h / (hv / hk);
    const int ts = b.seq_start[s], te = b.seq_start[s + 1];
    if (ts >= te) return;
    float *S = a.state + (int64_t)b.seq_slot[s] * a.state_slot_stride + (int64_t)h * DK * DV;
    float st[RPL][C]; /* S[4·lane + r][j0 + c] */
#pragma unroll
    for (int r = 0; r < RPL; r++) {
        const fcols<C> row = ld_cols<C>(S + (int64_t)(lane * RPL + r) * DV + j0);
#pragma unroll
        for (int c = 0; c < C; c++) st[r][c] = row.v[c];
    }

    /* inputs of the next GP_SCAN_AHEAD tokens in a register ring: a token's chain (warp sums)
     * is shorter than an L2 round trip */
    constexpr int D = GP_SCAN_AHEAD;
    float4 rk[D], rq[D];
    fcols<C> rv[D];
    float2 rab[D];
    auto load = [&](int t, float4 &k4, float4 &q4, fcols<C> &vc, float2 &ab) {
        k4 = *(const float4 *)(sc.k + ((int64_t)t * hk + kh) * DK + lane * RPL);
        q4 = *(const float4 *)(sc.q + ((int64_t)t * hk + kh) * DK + lane * RPL);
        vc = ld_cols<C>(sc.v + ((int64_t)t * hv + h) * DV + j0);
        ab = *(const float2 *)(sc.ab + ((int64_t)t * hv + h) * 2);
    };
#pragma unroll
    for (int i = 0; i < D; i++)
        if (ts + i < te) load(ts + i, rk[i], rq[i], rv[i], rab[i]);
    /* the inner loop must unroll fully (no break) so that the ring stays in registers */
    for (int t0 = ts; t0 < te; t0 += D) {
#pragma unroll
        for (int i = 0; i < D; i++) {
            const int t = t0 + i;
            if (t < te) {
                const float kk[RPL] = {rk[i].x, rk[i].y, rk[i].z, rk[i].w};
                const float qq[RPL] = {rq[i].x, rq[i].y, rq[i].z, rq[i].w};
                const fcols<C> vv = rv[i];
                const float alpha = expf(rab[i].x), beta = rab[i].y;
                if (t + D < te) load(t + D, rk[i], rq[i], rv[i], rab[i]); /* slot i is free now */
                float part[C], part2[C];
#pragma unroll
                for (int c = 0; c < C; c++) {
                    part[c] = 0.f;
#pragma unroll
                    for (int r = 0; r < RPL; r++) {
                        st[r][c] *= alpha;
                        part[c] = fmaf(st[r][c], kk[r], part[c]);
                    }
                }
#pragma unroll
                for (int o = 16; o > 0; o >>= 1)
#pragma unroll
                    for (int c = 0; c < C; c++) part[c] += __shfl_xor_sync(0xffffffffu, part[c], o);
#pragma unroll
                for (int c = 0; c < C; c++) {
                    const float delta = beta * (vv.v[c] - part[c]);
                    part2[c] = 0.f;
#pragma unroll
                    for (int r = 0; r < RPL; r++) {
                        st[r][c] = fmaf(kk[r], delta, st[r][c]);
                        part2[c] = fmaf(st[r][c], qq[r], part2[c]);
                    }
                }
#pragma unroll
                for (int o = 16; o > 0; o >>= 1)
#pragma unroll
                    for (int c = 0; c < C; c++) part2[c] += __shfl_xor_sync(0xffffffffu, part2[c], o);
                if (lane == 0) st_cols<C>(sc.o + ((int64_t)t * hv + h) * DV + j0, part2);
            }
        }
    }
#pragma unroll
    for (int r = 0; r < RPL; r++) st_cols<C>(S + (int64_t)(lane * RPL + r) * DV + j0, st[r]);
}

/* 3. out: block (value head, GP_BLOCK_TOKENS tokens), thread j of dv; one barrier for all the
 * block's tokens (one token a block: 41 µs a layer at 1024 tokens, s9-run6). */
__global__ void __launch_bounds__(GP_DK) gdn_out_kernel(ds_cuda_batch b, ds_cuda_gdn_args a, gdn_scratch sc) {
    constexpr int DV = GP_DK, TT = GP_BLOCK_TOKENS;
    __shared__ float red[TT][DV / 32];
    pdl_enter(); /* cuda_launch.cuh: before any access */
    const int h = blockIdx.x, t0 = blockIdx.y * TT, j = threadIdx.x;
    const int tn = min(TT, b.n_tokens - t0);
    const int hv = a.hv;
    const int64_t conv_dim = gdn_conv_dim(a), ldp = gdn_proj_ld(a);
    float o[TT], z[TT];
#pragma unroll
    for (int tt = 0; tt < TT; tt++) { /* every load in flight before the first sum */
        o[tt] = z[tt] = 0.f;
        if (tt < tn) {
            o[tt] = sc.o[((int64_t)(t0 + tt) * hv + h) * DV + j];
            z[tt] = to_f32(((const bf16 *)a.proj)[(int64_t)(t0 + tt) * ldp + conv_dim + (int64_t)h * DV + j]);
        }
    }
#pragma unroll
    for (int tt = 0; tt < TT; tt++) {
        const float o2 = warp_sum(o[tt] * o[tt]);
        if ((j & 31) == 0) red[tt][j >> 5] = o2;
    }
    __syncthreads();
#pragma unroll
    for (int tt = 0; tt < TT; tt++) {
        if (tt >= tn) continue;
        float ms = 0.f;
#pragma unroll
        for (int w = 0; w < DV / 32; w++) ms += red[tt][w];
        const float n = o[tt] * rsqrtf(ms / (float)DV + a.eps);
        ((bf16 *)a.out)[(int64_t)(t0 + tt) * hv * DV + (int64_t)h * DV + j] =
            __float2bfloat16_rn(n * a.norm_w[j] * silu_f(z[tt]));
    }
}

/* 4. hist: block (value head, sequence), thread c of the value head's 3·dk history channels:
 * the last KC − 1 conv inputs after the step (from this step's rows, or the old history when
 * the run is shorter than that). */
__global__ void __launch_bounds__(3 * GP_DK) gdn_hist_kernel(ds_cuda_batch b, ds_cuda_gdn_args a) {
    constexpr int DK = GP_DK, KC = GP_KC, NCH = 3 * GP_DK;
    pdl_enter(); /* cuda_launch.cuh: before any access */
    const int h = blockIdx.x, s = blockIdx.y, c = threadIdx.x;
    const int hk = a.hk, hv = a.hv, kh = h / (hv / hk);
    const int ts = b.seq_start[s], te = b.seq_start[s + 1];
    if (ts >= te) return;
    const int64_t ldp = gdn_proj_ld(a);
    int64_t gc;
    if (c < DK) gc = (int64_t)kh * DK + c;
    else if (c < 2 * DK) gc = (int64_t)hk * DK + (int64_t)kh * DK + (c - DK);
    else gc = 2 * (int64_t)hk * DK + (int64_t)h * DK + (c - 2 * DK);
    float *CH = a.conv_hist + (int64_t)b.seq_slot[s] * a.conv_slot_stride + ((int64_t)h * NCH + c) * (KC - 1);
    float old[KC - 1], nh[KC - 1];
#pragma unroll
    for (int i = 0; i < KC - 1; i++) old[i] = CH[i];
    const int n = te - ts;
#pragma unroll
    for (int i = 0; i < KC - 1; i++) {
        const int pp = n - (KC - 1) + i;
        nh[i] = pp >= 0 ? to_f32(((const bf16 *)a.proj)[(int64_t)(ts + pp) * ldp + gc]) : old[KC - 1 + pp];
    }
#pragma unroll
    for (int i = 0; i < KC - 1; i++) CH[i] = nh[i];
}

/* Runs the four launches when this step suits them (see the file comment); false: the caller
 * runs the fused kernel. */
extern "C" bool ds_cuda_gdn_prefill(ds_cuda_ctx *ctx, const ds_cuda_gdn_args *a) {
    const ds_cuda_batch *b = &ctx->batch;
    if (!ctx->opt.gdn_prefill || !ctx->d_gdn_scratch || ctx->h_state_out_off >= 0 ||
        ctx->info.max_seq_tokens < DS_CUDA_GDN_PREFILL_MIN_TOKENS)
        return false;
    const size_t need = ds_cuda_gdn_prefill_scratch_bytes(a->hk, a->hv, a->dk, a->dv, a->kernel);
    if (need == 0 || need > ctx->gdn_scratch_bytes) return false;
    const int T = b->n_tokens, S = b->n_seqs;
    gdn_scratch sc = gdn_scratch_of((float *)ctx->d_gdn_scratch, T, a->hk, a->hv);
    sc.q_tf32 = ctx->gdn_chunked && ds_cuda_gdn_chunk_q_tf32(ctx);
    /* v in the chunked prep (ctx->gdn_v_in_chunk): the prep launch serves q and k only */
    const bool qk = ctx->gdn_chunked && ctx->gdn_v_in_chunk;
    auto prep = ctx->gdn_prep_preload ? (qk ? gdn_prep_kernel<true, true> : gdn_prep_kernel<true, false>)
                                      : (qk ? gdn_prep_kernel<false, true> : gdn_prep_kernel<false, false>);
    ds_launch(ctx, prep, dim3(a->hk, DS_DIV_UP(T, GP_BLOCK_TOKENS)), qk ? 2 * GP_DK : GP_PREP_THREADS, 0, *b, *a, sc);
    DS_CU_LAUNCHED2(ctx, "gdn_prep_kernel", T, a->hk);
    if (ctx->gdn_chunked) {
        ds_cuda_gdn_chunked(ctx, *b, *a, sc);
    } else {
        if (ctx->gdn_scan_cols == 2)
            ds_launch(ctx, gdn_scan_kernel<2>, dim3(GP_DK / (GP_SCAN_WARPS * 2), a->hv, S),
                      GP_SCAN_WARPS * 32, 0, *b, *a, sc);
        else
            ds_launch(ctx, gdn_scan_kernel<4>, dim3(GP_DK / (GP_SCAN_WARPS * 4), a->hv, S),
                      GP_SCAN_WARPS * 32, 0, *b, *a, sc);
        DS_CU_LAUNCHED2(ctx, "gdn_scan_kernel", S, a->hv);
    }
    ds_launch(ctx, gdn_out_kernel, dim3(a->hv, DS_DIV_UP(T, GP_BLOCK_TOKENS)), GP_DK, 0, *b, *a, sc);
    DS_CU_LAUNCHED2(ctx, "gdn_out_kernel", T, a->hv);
    ds_launch(ctx, gdn_hist_kernel, dim3(a->hv, S), 3 * GP_DK, 0, *b, *a);
    DS_CU_LAUNCHED2(ctx, "gdn_hist_kernel", S, a->hv);
    return true;
}
