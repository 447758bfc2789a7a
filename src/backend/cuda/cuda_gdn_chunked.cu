/* cuda_gdn_chunked.cu — the Gated DeltaNet recurrence of a prefill in chunks of GC_L = 64
 * tokens (step 2 of cuda_gdn_prefill.cu; DS_CUDA_GDN_CHUNKED, default on).
 *
 * Why: the token-serial scan is a chain of two dependent warp reductions per token, ~0.7 µs a
 * token per layer however many warps share the work (21.5 of the 76.9 ms of a 1024-token
 * prefill at 35B-A3B, s7-run3). Within a chunk the recurrence is a small linear system, so all
 * chunks' systems can be solved at once and only a state update of matrix products per chunk
 * stays sequential. The algebra is the CPU backend's (cpu_gdn.c delta_rule_chunked, from
 * transformers' torch_chunk_gated_delta_rule). For a chunk of n ≤ 64 tokens of one sequence and
 * value head, with c_i = Σ_{s≤i} g_s (log-decay from the chunk's first token):
 *   A_ij = β_i e^{c_i−c_j} k̂_i·k̂_j (j < i);  (I + A) U = β v;  (I + A) W = β e^{c} k̂
 *   P_ij = e^{c_i−c_j} q̂_i·k̂_j (j ≤ i)
 *   δ = U − W S;  o_i = e^{c_i} q̂_i S + Σ_j P_ij δ_j;  S ← e^{c_{n−1}} S + Σ_j e^{c_{n−1}−c_j} k̂_jᵀ δ_j
 * (S [dk, dv] maps keys to values, o = Sᵀq̂.) Tokens past n count as zeros (g = 0, β = 0, k̂ = 0),
 * like transformers' padding. Two launches:
 *   chunk_prep  (chunk, value head) blocks, all chunks at once: A and P from the chunk's q̂ / k̂
 *               rows in shared memory; U and W by forward substitution, one thread per column
 *               of [U | W] (64 values in registers) → scratch v (overwritten by U), w, p, cg;
 *   chunk_scan  (GC_NC state columns, value head, sequence) blocks walk their sequence's chunks
 *               in order with S[:, cols] in shared memory and registers: δ and e^{c}q̂S from S,
 *               then o and the new S from δ; each half's inputs are copied in while the other
 *               half computes. ncu, a layer at 1024 tokens: 286 µs with every chunk's inputs
 *               loaded after the previous chunk (s9-run2, warps waiting on L2 latency), 203 µs
 *               with the copies overlapped (s9-run3, then bound by shared-memory loads of the
 *               fp32 CUDA-core products), 149 µs with the products on tensor cores (s9-run4).
 * fp32 sums and state; the tensor-core products in one tf32 pass (DS_CUDA_GDN_TF32, the default
 * since session 23: each product's inputs rounded to 11 bits — still finer than the bf16
 * operands of the chunked GDN kernels vLLM runs — a third of the MMAs of 3xTF32, which
 * DS_CUDA_GDN_TF32=0 keeps; GDN prefill of 2048 tokens 0.501 vs 0.631 ms, H200 s23-run1); every δ / o / S column
 * depends only on its own S column, so blocks split the columns without talking to each other.
 * In one-pass products the operands chunk_scan loads most often (q̂, S, δ, δ') are stored as
 * tf32 values where they are written, and fragments are read by ldmatrix
 * (DS_CUDA_GDN_TF32_STORED, session 27: the same bits; chunk_scan 2708 vs 3090 µs a prefill of
 * 1024 tokens, H100 s27-run5). */
#include <math.h>

#include <type_traits>

#include "cuda_gdn_prefill.cuh"
#include "cuda_mma.cuh"

#define GC_THREADS 256
#define GC_LD (GP_DK + 4) /* shared row pitch of [64][128] tiles: rows 4 banks apart */
#define GC_PLD (GC_L + 4) /* shared row pitch of P */
#define GC_NC 32          /* state columns per chunk_scan block: 4 blocks a value head */
#define GC_KLD (GP_DK + 8) /* pitch of k̂ in chunk_scan (read down its columns) */
#define GC_SLD (GC_NC + 8) /* pitch of the [·][NC] tiles read as B fragments */

/* chunk_prep's dynamic shared memory (floats): k̂, q̂ [L][LD], A [L][L], c, β [L] */
#define GC_PREP_FLOATS (2 * GC_L * GC_LD + GC_L * GC_L + 2 * GC_L)
/* chunk_scan's: W, q̂ [L][LD], U [L][NC], k̂ [L][KLD], P [L][PLD], δ, δ' [L][SLD], S [DK][SLD] */
#define GC_SCAN_FLOATS \
    (2 * GC_L * GC_LD + GC_L * GC_NC + GC_L * GC_KLD + GC_L * GC_PLD + 2 * GC_L * GC_SLD + GP_DK * GC_SLD)

/* The idx-th chunk of the step (sequences in order, each cut from its first token): first token
 * t0 and length n; false past the last chunk. */
static __device__ bool chunk_of(const ds_cuda_batch &b, int idx, int &t0, int &n) {
    for (int s = 0; s < b.n_seqs; s++) {
        const int ts = b.seq_start[s], te = b.seq_start[s + 1];
        const int nc = (te - ts + GC_L - 1) / GC_L;
        if (idx < nc) {
            t0 = ts + idx * GC_L;
            n = min(GC_L, te - t0);
            return true;
        }
        idx -= nc;
    }
    return false;
}

/* VF: v (conv + SiLU of the value channels) computed here from the projection, where prep
 * computed it into scratch before (ctx->gdn_v_in_chunk, DS_CUDA_GDN_V_IN_CHUNK), so prep
 * neither computes v nor writes it (16.8 MB a layer at 1024 tokens) nor does this kernel read
 * it back. Thread tid of the block convolves channel col = tid mod DK of value head h over half
 * tid / DK of the chunk's tokens with gdn_prep_kernel's window rule (the tokens before, in the
 * chunk's sequence, else the conv history, which gdn_hist_kernel overwrites only after this
 * launch): the same values, so the same bits. Writes v_i·β_i (zero past n) to vs[i][col]
 * (pitch GC_LD; the q̂ tile's space, free once A and P are done). In registers, the 64 values
 * a column thread needs spilled (ptxas: 276 bytes at 128 registers). */
static __device__ __forceinline__ void v_to_shared(const ds_cuda_batch &b, const ds_cuda_gdn_args &a, int t0, int n,
                                                   int h, const float *bs, float *vs) {
    constexpr int DK = GP_DK, KC = GP_KC, NCH = 3 * GP_DK, HALF = GC_L / 2;
    static_assert(GC_THREADS == 2 * GP_DK, "two threads a value channel");
    const int col = threadIdx.x % DK, i0 = (threadIdx.x / DK) * HALF;
    if (i0 >= n) { /* nothing of this half in the step */
#pragma unroll
        for (int i = 0; i < HALF; i++) vs[(i0 + i) * GC_LD + col] = 0.f;
        return;
    }
    const int64_t ldp = gdn_proj_ld(a);
    const int64_t gc = 2 * (int64_t)a.hk * DK + (int64_t)h * DK + col;
    const bf16 *src = (const bf16 *)a.proj + (int64_t)(t0 + i0) * ldp + gc; /* token t0 + i0's value */
    float x[HALF];
#pragma unroll
    for (int i = 0; i < HALF; i++) x[i] = i0 + i < n ? to_f32(src[i * ldp]) : 0.f; /* all in flight */
    float cw[KC];
#pragma unroll
    for (int i = 0; i < KC; i++) cw[i] = a.conv_w[gc * KC + i];
    const int s = b.tok_seq[t0], p0 = t0 + i0 - b.seq_start[s]; /* run position of token t0 + i0 */
    const float *hist = a.conv_hist + (int64_t)b.seq_slot[s] * a.conv_slot_stride + ((int64_t)h * NCH + 2 * DK + col) * (KC - 1);
    float win[KC - 1];
#pragma unroll
    for (int i = 0; i < KC - 1; i++) {
        const int pp = p0 - (KC - 1) + i; /* run position of token t0 + i0 − (KC − 1) + i */
        win[i] = pp >= 0 ? to_f32(src[(i - (KC - 1)) * ldp]) : hist[KC - 1 + pp];
    }
#pragma unroll
    for (int i = 0; i < HALF; i++) {
        const float v = silu_f(conv_step<KC>(cw, win, x[i]));
        vs[(i0 + i) * GC_LD + col] = i0 + i < n ? v * bs[i0 + i] : 0.f;
    }
}

/* 1. block (chunk blockIdx.x of the step, value head blockIdx.y). X3: A and P in 3xTF32
 * (DS_CUDA_GDN_TF32=0), else one tf32 pass (ctx->gdn_tf32, the default). VF: v_to_shared
 * above. ST (one-pass products only, ctx->gdn_tf32_stored; see chunk_scan's): the product's
 * fragments by ldmatrix (ldsm_a_tf32 / ldsm_bt2_tf32: a quarter / half of the load
 * instructions), q̂ taken as tf32 from the prep launch. P and W stay fp32: rounded here for
 * chunk_scan as well, this kernel took 2511 vs 2357 µs and chunk_scan 2815 vs 3080 (eager,
 * 1024 tokens, 30 layers, H100 s27-run4); without, chunk_scan 2708 vs 3090, this even (s27-run5). */
template <bool X3, bool VF, bool ST>
__global__ void __launch_bounds__(GC_THREADS, 2) /* two blocks an SM: ≤ 128 registers */
    gdn_chunk_prep_kernel(ds_cuda_batch b, ds_cuda_gdn_args a, gdn_scratch sc) {
    constexpr int DK = GP_DK, L = GC_L, LD = GC_LD;
    static_assert(!(X3 && ST), "tf32 operands are one-pass operands");
    extern __shared__ float4 gc_smem4[];
    float *Ks = (float *)gc_smem4; /* [L][LD] k̂ of the chunk's tokens, zeros past n */
    float *Qs = Ks + L * LD;       /* [L][LD] q̂ */
    float *As = Qs + L * LD;       /* [L][L] A, zero on and above the diagonal */
    float *cs = As + L * L;        /* [L] c_i */
    float *bs = cs + L;            /* [L] β_i, zero past n */
    pdl_enter(); /* cuda_launch.cuh: before any access */
    int t0, n;
    if (!chunk_of(b, blockIdx.x, t0, n)) return;
    const int h = blockIdx.y, hk = a.hk, hv = a.hv, kh = h / (hv / hk);
    const int tid = threadIdx.x;

    for (int e = tid; e < L * DK / 4; e += GC_THREADS) { /* all copies in flight at once */
        const int i = e / (DK / 4), d = (e % (DK / 4)) * 4;
        const int64_t t = i < n ? t0 + i : t0; /* rows past n: zeros, nothing read */
        cp_async16(Ks + i * LD + d, sc.k + (t * hk + kh) * DK + d, i < n ? 16 : 0);
        cp_async16(Qs + i * LD + d, sc.q + (t * hk + kh) * DK + d, i < n ? 16 : 0);
    }
    cp_async_commit();
    if (tid < 32) { /* c = inclusive prefix sum of g, two tokens per lane */
        const int i0 = 2 * tid, i1 = i0 + 1;
        float2 ab0 = make_float2(0.f, 0.f), ab1 = ab0;
        if (i0 < n) ab0 = *(const float2 *)(sc.ab + ((int64_t)(t0 + i0) * hv + h) * 2);
        if (i1 < n) ab1 = *(const float2 *)(sc.ab + ((int64_t)(t0 + i1) * hv + h) * 2);
        const float pair = ab0.x + ab1.x;
        float incl = pair;
#pragma unroll
        for (int o = 1; o < 32; o <<= 1) {
            const float y = __shfl_up_sync(0xffffffffu, incl, o);
            if (tid >= o) incl += y;
        }
        const float before = incl - pair;
        cs[i0] = before + ab0.x;
        cs[i1] = before + pair;
        bs[i0] = ab0.y;
        bs[i1] = ab1.y;
    }
    cp_async_wait<0>();
    __syncthreads();

    /* A and P on tensor cores (3xTF32): warp w, rows m0 = 16(w mod 4) … of k̂·k̂ᵀ (w < 4) or
     * q̂·k̂ᵀ (w ≥ 4), all 64 columns (eight n-tiles; B(d, j) = k̂_j[d]) */
    {
        const int warp = tid >> 5, lane = tid & 31, g = lane >> 2, t4 = lane & 3;
        const bool k_warp = warp < 4;
        const int m0 = 16 * (warp & 3);
        const float *Xs = k_warp ? Ks : Qs;
        float acc[8][4];
#pragma unroll
        for (int nt = 0; nt < 8; nt++)
#pragma unroll
            for (int r = 0; r < 4; r++) acc[nt][r] = 0.f;
        const bool q_raw = ST && !k_warp; /* q̂ from the prep launch as tf32 (q_tf32); k̂ fp32 */
#pragma unroll 2
        for (int k0 = 0; k0 < DK; k0 += 8) {
            tf32_split fa[4];
            if constexpr (ST) {
                if (q_raw) ldsm_a_tf32<true>(fa, Xs, LD, m0, k0, lane);
                else ldsm_a_tf32<false>(fa, Xs, LD, m0, k0, lane);
#pragma unroll
                for (int nt = 0; nt < 8; nt += 2) {
                    tf32_split fb0[2], fb1[2];
                    ldsm_bt2_tf32(fb0, fb1, Ks, LD, k0, 8 * nt, lane);
                    mma_x<X3>(acc[nt], fa, fb0);
                    mma_x<X3>(acc[nt + 1], fa, fb1);
                }
            } else {
                load_a_tf32(fa, Xs, LD, m0, k0, g, t4);
#pragma unroll
                for (int nt = 0; nt < 8; nt++) {
                    tf32_split fb[2];
                    load_bt_tf32(fb, Ks, LD, k0, 8 * nt, g, t4);
                    mma_x<X3>(acc[nt], fa, fb);
                }
            }
        }
#pragma unroll
        for (int nt = 0; nt < 8; nt++)
#pragma unroll
            for (int r = 0; r < 4; r++) {
                const int i = m0 + g + (r >> 1) * 8, j = 8 * nt + 2 * t4 + (r & 1);
                const float decay = j <= i ? expf(cs[i] - cs[j]) : 0.f;
                if (k_warp) As[i * L + j] = j < i ? bs[i] * acc[nt][r] * decay : 0.f;
                else if (i < n) sc.p[((int64_t)(t0 + i) * hv + h) * L + j] = acc[nt][r] * decay;
            }
    }
    __syncthreads();
    if (VF) { /* v·β into the q̂ tile's space */
        v_to_shared(b, a, t0, n, h, bs, Qs);
        __syncthreads();
    }

    /* forward substitution x_i = b_i − Σ_{j<i} A_ij x_j for column tid of [U | W] */
    {
        const int col = tid;
        float x[L];
        if (col < DK && VF) {
#pragma unroll
            for (int i = 0; i < L; i++) x[i] = Qs[i * LD + col]; /* v_to_shared's v·β */
        } else if (col < DK) {
#pragma unroll
            for (int i = 0; i < L; i++)
                x[i] = i < n ? sc.v[((int64_t)(t0 + i) * hv + h) * DK + col] * bs[i] : 0.f;
        } else {
#pragma unroll
            for (int i = 0; i < L; i++) x[i] = Ks[i * LD + col - DK] * bs[i] * expf(cs[i]);
        }
#pragma unroll
        for (int i = 1; i < L; i++) {
            float acc = x[i];
#pragma unroll
            for (int j = 0; j < i; j += 4) {
                const float4 a4 = *(const float4 *)(As + i * L + j); /* zero at j ≥ i */
                acc = fmaf(-a4.x, x[j], acc);
                if (j + 1 < i) acc = fmaf(-a4.y, x[j + 1], acc);
                if (j + 2 < i) acc = fmaf(-a4.z, x[j + 2], acc);
                if (j + 3 < i) acc = fmaf(-a4.w, x[j + 3], acc);
            }
            x[i] = acc;
        }
        float *dst = col < DK ? sc.v + (int64_t)h * DK + col : sc.w + (int64_t)h * DK + col - DK;
#pragma unroll
        for (int i = 0; i < L; i++)
            if (i < n) dst[(int64_t)(t0 + i) * hv * DK] = x[i];
    }
    if (tid < n) sc.cg[(int64_t)(t0 + tid) * hv + h] = cs[tid];
}

/* 2. block (columns j0 = GC_NC·blockIdx.x …, value head blockIdx.y, sequence blockIdx.z), eight
 * warps, every product an m16n8k8 tensor-core tile (3xTF32) over the block's 32 columns (four
 * n-tiles):
 *   δ, q̂S    warp w < 4: rows 16w … of W·S → δ = U − W·S;  warp w ≥ 4: rows 16(w − 4) … of q̂·S
 *   o        warps ≥ 4 continue their q̂S rows: e^{c}q̂S + P·δ
 *   S        warp w: state rows 16w …, held in registers across chunks: e^{c_{n−1}}S + k̂ᵀ·δ'
 * The chunk's inputs are raw copies (cp.async) in two groups, each loaded while the other is in
 * use: {W, q̂, U} for the first half of a chunk, {k̂, P} for the second. The decays are applied
 * to per-row results instead of the inputs: e^{c_i} to q̂_iS, and e^{c_{n−1}−c_i} to a second
 * copy δ' of δ_i for the state update. Pitches put every fragment's 32 reads in 32 banks. */
template <bool X3, bool ST> /* as chunk_prep's */
__global__ void __launch_bounds__(GC_THREADS)
    gdn_chunk_scan_kernel(ds_cuda_batch b, ds_cuda_gdn_args a, gdn_scratch sc) {
    constexpr int DK = GP_DK, DV = GP_DK, L = GC_L, LD = GC_LD, PLD = GC_PLD, NC = GC_NC;
    constexpr int KLD = GC_KLD;
    /* ST: the operands q̂, S, δ and δ' held as tf32 values (tf32_stored), rounded once where
     * they are written — q̂ by the prep launch (gdn_scratch.q_tf32), S, δ and δ' here — instead
     * of at each of the eight warps' loads of them (the same operands reach the tensor cores);
     * fragments by ldmatrix, for which S, δ and δ' are stored transposed. ncu (H100, s27-run2):
     * 16 % of the kernel's instructions were the rounding's FSETP, as many IMADs its add. W, P
     * and k̂ are still rounded at the loads (W and P are written by chunk_prep, whose
     * substitution and P store grew by more than this saved; k̂ also feeds that substitution) */
    static_assert(!(X3 && ST), "tf32 operands are one-pass operands");
    /* the B operands' pitches: [k][n] tiles read by load_b_tf32, or with ST [n][k] tiles
     * read by ldsm_bt2_tf32 (rows 16-byte aligned, 4 banks apart; each fits the [k][n] space) */
    constexpr int SLD = ST ? DK + 4 : GC_SLD, DLD = ST ? L + 4 : GC_SLD;
    static_assert(!ST || (NC * SLD <= DK * GC_SLD && NC * DLD <= L * GC_SLD), "transposed tiles fit");
    static_assert(GC_THREADS == 256 && DK == 8 * 16 && L == 4 * 16 && NC == 4 * 8, "warp ↔ tile map");
    extern __shared__ float4 gc_smem4[];
    float *Ws = (float *)gc_smem4; /* [L][LD] W                   group A */
    float *Qs = Ws + L * LD;       /* [L][LD] q̂                   group A */
    float *Us = Qs + L * LD;       /* [L][NC] U of the columns    group A */
    float *Ks = Us + L * NC;       /* [L][KLD] k̂                  group B */
    float *Ps = Ks + L * KLD;      /* [L][PLD] P                  group B */
    float *Ds = Ps + L * PLD;      /* [L][GC_SLD] δ (ST: [NC][DLD]) */
    float *Dk = Ds + L * GC_SLD;   /* [L][GC_SLD] δ' = e^{c_{n−1}−c_i} δ_i (ST: [NC][DLD]) */
    float *Ss = Dk + L * GC_SLD;   /* [DK][GC_SLD] S of the block's columns (ST: [NC][SLD]) */
    pdl_enter(); /* cuda_launch.cuh: before any access */
    const int j0 = blockIdx.x * NC, h = blockIdx.y, s = blockIdx.z;
    const int hk = a.hk, hv = a.hv, kh = h / (hv / hk);
    const int ts = b.seq_start[s], te = b.seq_start[s + 1];
    if (ts >= te) return;
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t4 = lane & 3;
    /* a pair of values (row r, columns col, col + 1) into the B-operand tile X of pitch ld */
    auto pair_to_shared = [&](float *X, int ld, int r, int col, float2 v) {
        v.x = tf32_if(ST, v.x), v.y = tf32_if(ST, v.y);
        if constexpr (ST) {
            X[col * ld + r] = v.x;
            X[(col + 1) * ld + r] = v.y;
        } else {
            *(float2 *)(X + r * ld + col) = v;
        }
    };
    /* acc[nt] += fa · B(k0 …, 8nt …) for the warp's four n-tiles */
    auto mma_n4 = [&](float (&acc)[4][4], const tf32_split (&fa)[4], const float *B, int ld, int k0) {
        if constexpr (ST) {
#pragma unroll
            for (int nt = 0; nt < 4; nt += 2) {
                tf32_split fb0[2], fb1[2];
                ldsm_bt2_tf32<true>(fb0, fb1, B, ld, k0, 8 * nt, lane);
                mma_x<X3>(acc[nt], fa, fb0);
                mma_x<X3>(acc[nt + 1], fa, fb1);
            }
        } else {
#pragma unroll
            for (int nt = 0; nt < 4; nt++) {
                tf32_split fb[2];
                load_b_tf32(fb, B, ld, k0, 8 * nt, g, t4);
                mma_x<X3>(acc[nt], fa, fb);
            }
        }
    };
    /* an A fragment of W or P (fp32), or with raw of q̂ (tf32 values with ST) */
    auto a_frag = [&](tf32_split (&fa)[4], const float *X, int ld, int m0, int k0, bool raw) {
        if constexpr (ST) {
            if (raw) ldsm_a_tf32<true>(fa, X, ld, m0, k0, lane);
            else ldsm_a_tf32<false>(fa, X, ld, m0, k0, lane);
        } else {
            load_a_tf32(fa, X, ld, m0, k0, g, t4);
        }
    };

    /* rows past the sequence's end are zeros (no bytes read) */
    auto load_a = [&](int c0) {
        const int n = min(L, te - c0);
        for (int e = tid; e < L * DK / 4; e += GC_THREADS) {
            const int i = e / (DK / 4), d = (e % (DK / 4)) * 4, ok = i < n ? 16 : 0;
            const int64_t t = i < n ? c0 + i : c0;
            cp_async16(Ws + i * LD + d, sc.w + (t * hv + h) * DK + d, ok);
            cp_async16(Qs + i * LD + d, sc.q + (t * hk + kh) * DK + d, ok);
        }
        for (int e = tid; e < L * NC / 4; e += GC_THREADS) {
            const int i = e / (NC / 4), j = (e % (NC / 4)) * 4;
            const int64_t t = i < n ? c0 + i : c0;
            cp_async16(Us + i * NC + j, sc.v + (t * hv + h) * DV + j0 + j, i < n ? 16 : 0);
        }
        cp_async_commit();
    };
    auto load_b = [&](int c0) {
        const int n = min(L, te - c0);
        for (int e = tid; e < L * DK / 4; e += GC_THREADS) {
            const int i = e / (DK / 4), d = (e % (DK / 4)) * 4;
            const int64_t t = i < n ? c0 + i : c0;
            cp_async16(Ks + i * KLD + d, sc.k + (t * hk + kh) * DK + d, i < n ? 16 : 0);
        }
        for (int e = tid; e < L * L / 4; e += GC_THREADS) {
            const int i = e / (L / 4), j = (e % (L / 4)) * 4;
            const int64_t t = i < n ? c0 + i : c0;
            cp_async16(Ps + i * PLD + j, sc.p + (t * hv + h) * L + j, i < n ? 16 : 0);
        }
        cp_async_commit();
    };
    load_a(ts);
    load_b(ts);

    /* the state rows of warp w: sr = 16w + g and sr + 8, columns 8n + 2·t4 (+1) of n-tile n */
    const int sr = 16 * warp + g;
    float *S = a.state + (int64_t)b.seq_slot[s] * a.state_slot_stride + (int64_t)h * DK * DV + j0;
    float sacc[4][4];
#pragma unroll
    for (int nt = 0; nt < 4; nt++) {
        const int col = 8 * nt + 2 * t4;
        const float2 lo = *(const float2 *)(S + (int64_t)sr * DV + col);
        const float2 hi = *(const float2 *)(S + (int64_t)(sr + 8) * DV + col);
        sacc[nt][0] = lo.x, sacc[nt][1] = lo.y, sacc[nt][2] = hi.x, sacc[nt][3] = hi.y;
        pair_to_shared(Ss, SLD, sr, col, lo);
        pair_to_shared(Ss, SLD, sr + 8, col, hi);
    }

    const bool w_warp = warp < 4;          /* W·S → δ; else q̂·S → o */
    const int m0 = 16 * (warp & 3);        /* the chunk rows of phases 1 and 2a */
    const float *Xs = w_warp ? Ws : Qs;
    for (int c0 = ts; c0 < te; c0 += L) {
        const int n = min(L, te - c0);
        const float cl = sc.cg[((int64_t)c0 + n - 1) * hv + h];
        const float c_lo = m0 + g < n ? sc.cg[((int64_t)c0 + m0 + g) * hv + h] : cl;
        const float c_hi = m0 + g + 8 < n ? sc.cg[((int64_t)c0 + m0 + g + 8) * hv + h] : cl;
        cp_async_wait<1>(); /* group A of this chunk (B may still be in flight) */
        __syncthreads();    /* A visible to all; the previous chunk's S is in Ss */

        /* phase 1: rows m0 … m0 + 15 of W·S or q̂·S */
        float acc[4][4];
#pragma unroll
        for (int nt = 0; nt < 4; nt++)
#pragma unroll
            for (int r = 0; r < 4; r++) acc[nt][r] = 0.f;
        auto phase1 = [&](auto q_raw) { /* loop unswitched: W (fp32) or q̂ (raw with ST) */
#pragma unroll 4
            for (int k0 = 0; k0 < DK; k0 += 8) {
                tf32_split fa[4];
                a_frag(fa, Xs, LD, m0, k0, decltype(q_raw)::value);
                mma_n4(acc, fa, Ss, SLD, k0);
            }
        };
        if (ST && !w_warp) phase1(std::true_type{});
        else phase1(std::false_type{});
        if (w_warp) {
            const float ek_lo = expf(cl - c_lo), ek_hi = expf(cl - c_hi); /* ≤ 1: c decreases */
#pragma unroll
            for (int nt = 0; nt < 4; nt++) {
                const int col = 8 * nt + 2 * t4;
                const float2 u_lo = *(const float2 *)(Us + (m0 + g) * NC + col);
                const float2 u_hi = *(const float2 *)(Us + (m0 + g + 8) * NC + col);
                const float2 d_lo = make_float2(u_lo.x - acc[nt][0], u_lo.y - acc[nt][1]);
                const float2 d_hi = make_float2(u_hi.x - acc[nt][2], u_hi.y - acc[nt][3]);
                pair_to_shared(Ds, DLD, m0 + g, col, d_lo);
                pair_to_shared(Ds, DLD, m0 + g + 8, col, d_hi);
                pair_to_shared(Dk, DLD, m0 + g, col, make_float2(d_lo.x * ek_lo, d_lo.y * ek_lo));
                pair_to_shared(Dk, DLD, m0 + g + 8, col, make_float2(d_hi.x * ek_hi, d_hi.y * ek_hi));
            }
        } else {
            const float eq_lo = expf(c_lo), eq_hi = expf(c_hi);
#pragma unroll
            for (int nt = 0; nt < 4; nt++) {
                acc[nt][0] *= eq_lo, acc[nt][1] *= eq_lo;
                acc[nt][2] *= eq_hi, acc[nt][3] *= eq_hi;
            }
        }
        __syncthreads(); /* δ visible; group A's buffers free */
        if (c0 + L < te) load_a(c0 + L);
        else cp_async_commit(); /* an empty group keeps wait<1> meaning "all but the newest" */
        cp_async_wait<1>();     /* group B of this chunk */
        __syncthreads();

        /* phase 2a (warps ≥ 4): o = e^{c}q̂S + P·δ for rows m0 … (P zero above the diagonal) */
        if (!w_warp) {
#pragma unroll 2
            for (int k0 = 0; k0 < L; k0 += 8) {
                tf32_split fa[4];
                a_frag(fa, Ps, PLD, m0, k0, false);
                mma_n4(acc, fa, Ds, DLD, k0);
            }
#pragma unroll
            for (int nt = 0; nt < 4; nt++) {
                const int col = j0 + 8 * nt + 2 * t4;
                if (m0 + g < n)
                    *(float2 *)(sc.o + ((int64_t)(c0 + m0 + g) * hv + h) * DV + col) = make_float2(acc[nt][0], acc[nt][1]);
                if (m0 + g + 8 < n)
                    *(float2 *)(sc.o + ((int64_t)(c0 + m0 + g + 8) * hv + h) * DV + col) =
                        make_float2(acc[nt][2], acc[nt][3]);
            }
        }

        /* phase 2b: S ← e^{c_{n−1}} S + k̂ᵀ·δ' for state rows sr, sr + 8 (A[d][i] = k̂_i[d]) */
        const float el = expf(cl);
#pragma unroll
        for (int nt = 0; nt < 4; nt++)
#pragma unroll
            for (int r = 0; r < 4; r++) sacc[nt][r] *= el;
#pragma unroll 2
        for (int k0 = 0; k0 < L; k0 += 8) {
            tf32_split fa[4];
            load_at_tf32(fa, Ks, KLD, 16 * warp, k0, g, t4);
            mma_n4(sacc, fa, Dk, DLD, k0);
        }
#pragma unroll
        for (int nt = 0; nt < 4; nt++) {
            const int col = 8 * nt + 2 * t4;
            pair_to_shared(Ss, SLD, sr, col, make_float2(sacc[nt][0], sacc[nt][1]));
            pair_to_shared(Ss, SLD, sr + 8, col, make_float2(sacc[nt][2], sacc[nt][3]));
        }
        __syncthreads(); /* group B's buffers free; δ, δ' read by all */
        if (c0 + L < te) load_b(c0 + L);
        else cp_async_commit();
    }
    cp_async_wait<0>();
#pragma unroll
    for (int nt = 0; nt < 4; nt++) {
        const int col = 8 * nt + 2 * t4;
        *(float2 *)(S + (int64_t)sr * DV + col) = make_float2(sacc[nt][0], sacc[nt][1]);
        *(float2 *)(S + (int64_t)(sr + 8) * DV + col) = make_float2(sacc[nt][2], sacc[nt][3]);
    }
}

/* the kernels' instances by (3xTF32, v in chunk_prep, tf32 operands stored) */
typedef void (*gdn_chunk_kernel)(ds_cuda_batch, ds_cuda_gdn_args, gdn_scratch);
static bool gdn_chunk_stored(const ds_cuda_ctx *ctx) { return ctx->gdn_tf32 && ctx->gdn_tf32_stored; }
bool ds_cuda_gdn_chunk_q_tf32(const ds_cuda_ctx *ctx) { return gdn_chunk_stored(ctx); }
static gdn_chunk_kernel chunk_prep_of(bool x3, bool vf, bool st) {
    if (x3) return vf ? gdn_chunk_prep_kernel<true, true, false> : gdn_chunk_prep_kernel<true, false, false>;
    if (st) return vf ? gdn_chunk_prep_kernel<false, true, true> : gdn_chunk_prep_kernel<false, false, true>;
    return vf ? gdn_chunk_prep_kernel<false, true, false> : gdn_chunk_prep_kernel<false, false, false>;
}
static gdn_chunk_kernel chunk_scan_of(bool x3, bool st) {
    return x3 ? gdn_chunk_scan_kernel<true, false> : st ? gdn_chunk_scan_kernel<false, true> : gdn_chunk_scan_kernel<false, false>;
}

void ds_cuda_gdn_chunked(ds_cuda_ctx *ctx, const ds_cuda_batch &b, const ds_cuda_gdn_args &a,
                         const gdn_scratch &sc) {
    /* Σ_s ⌈n_s / L⌉ ≤ T / L + S chunks; blocks past the last one return at once */
    const int chunks = DS_DIV_UP(b.n_tokens, GC_L) + b.n_seqs;
    const bool x3 = !ctx->gdn_tf32, vf = ctx->gdn_v_in_chunk;
    const bool st = gdn_chunk_stored(ctx);
    ds_launch(ctx, chunk_prep_of(x3, vf, st), dim3(chunks, a.hv), GC_THREADS, sizeof(float) * GC_PREP_FLOATS, b, a, sc);
    DS_CU_LAUNCHED2(ctx, "gdn_chunk_prep_kernel", chunks, a.hv);
    ds_launch(ctx, chunk_scan_of(x3, st), dim3(GP_DK / GC_NC, a.hv, b.n_seqs), GC_THREADS,
              sizeof(float) * GC_SCAN_FLOATS, b, a, sc);
    DS_CU_LAUNCHED2(ctx, "gdn_chunk_scan_kernel", b.n_seqs, a.hv);
}

/* Shared-memory limits of the kernels, set once at creation (never inside a capture). */
extern "C" void ds_cuda_gdn_chunked_init(ds_cuda_ctx *ctx) {
    for (int x3 = 0; x3 < 2; x3++)
        for (int st = 0; st < (x3 ? 1 : 2); st++) { /* stored tf32 operands: one-pass only */
            for (int vf = 0; vf < 2; vf++)
                DS_CU(ctx, cudaFuncSetAttribute(chunk_prep_of(x3, vf, st), cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                (int)(sizeof(float) * GC_PREP_FLOATS)));
            DS_CU(ctx, cudaFuncSetAttribute(chunk_scan_of(x3, st), cudaFuncAttributeMaxDynamicSharedMemorySize,
                                            (int)(sizeof(float) * GC_SCAN_FLOATS)));
        }
}
