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
 *               half computes (s9-run2: 286 µs a layer at 1024 tokens when every chunk's inputs
 *               were loaded after the previous chunk, its warps waiting on L2 latency).
 * fp32 throughout on CUDA cores; every δ / o / S column depends only on its own S column, so
 * blocks split the columns without talking to each other. */
#include <math.h>

#include "cuda_gdn_prefill.cuh"

#define GC_THREADS 256
#define GC_LD (GP_DK + 4) /* shared row pitch of [64][128] tiles: rows 4 banks apart */
#define GC_PLD (GC_L + 4) /* shared row pitch of P */
#define GC_NC 32          /* state columns per chunk_scan block: 4 blocks a value head */

/* chunk_prep's dynamic shared memory (floats): k̂, q̂ [L][LD], A [L][L], c, β [L] */
#define GC_PREP_FLOATS (2 * GC_L * GC_LD + GC_L * GC_L + 2 * GC_L)
/* chunk_scan's: W, q̂ [L][LD], U [L][NC], k̂ [L][DK], P [L][PLD], δ twice [L][NC], S [DK][NC] */
#define GC_SCAN_FLOATS (2 * GC_L * GC_LD + GC_L * GP_DK + GC_L * GC_PLD + 3 * GC_L * GC_NC + GP_DK * GC_NC)

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

static __device__ __forceinline__ float dot4(float4 a, float4 b) {
    return fmaf(a.x, b.x, fmaf(a.y, b.y, fmaf(a.z, b.z, a.w * b.w)));
}

/* 1. block (chunk blockIdx.x of the step, value head blockIdx.y) */
__global__ void __launch_bounds__(GC_THREADS)
    gdn_chunk_prep_kernel(ds_cuda_batch b, ds_cuda_gdn_args a, gdn_scratch sc) {
    constexpr int DK = GP_DK, L = GC_L, LD = GC_LD;
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

    /* A and P: thread (ib, jb) has rows i = ib + 16r, columns j = jb + 16c (r, c < 4): within a
     * warp 2 distinct i and 16 distinct j, whose float4 reads fall in distinct banks */
    {
        const int ib = tid >> 4, jb = tid & 15;
        float ak[4][4], aq[4][4];
#pragma unroll
        for (int r = 0; r < 4; r++)
#pragma unroll
            for (int c = 0; c < 4; c++) ak[r][c] = aq[r][c] = 0.f;
#pragma unroll 2
        for (int d = 0; d < DK; d += 4) {
            float4 ki[4], qi[4], kj[4];
#pragma unroll
            for (int r = 0; r < 4; r++) {
                ki[r] = *(const float4 *)(Ks + (ib + 16 * r) * LD + d);
                qi[r] = *(const float4 *)(Qs + (ib + 16 * r) * LD + d);
                kj[r] = *(const float4 *)(Ks + (jb + 16 * r) * LD + d);
            }
#pragma unroll
            for (int r = 0; r < 4; r++)
#pragma unroll
                for (int c = 0; c < 4; c++) {
                    ak[r][c] += dot4(ki[r], kj[c]);
                    aq[r][c] += dot4(qi[r], kj[c]);
                }
        }
#pragma unroll
        for (int r = 0; r < 4; r++)
#pragma unroll
            for (int c = 0; c < 4; c++) {
                const int i = ib + 16 * r, j = jb + 16 * c;
                const float decay = j <= i ? expf(cs[i] - cs[j]) : 0.f;
                As[i * L + j] = j < i ? bs[i] * ak[r][c] * decay : 0.f;
                if (i < n) sc.p[((int64_t)(t0 + i) * hv + h) * L + j] = aq[r][c] * decay;
            }
    }
    __syncthreads();

    /* forward substitution x_i = b_i − Σ_{j<i} A_ij x_j for column tid of [U | W] */
    {
        const int col = tid;
        float x[L];
        if (col < DK) {
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

/* 2. block (columns j0 = GC_NC·blockIdx.x …, value head blockIdx.y, sequence blockIdx.z).
 * Thread (row = tid / 4, g = tid % 4): chunk row `row` (δ, o) and state rows 2·row, 2·row + 1
 * (the update), both at columns j0 + 8g … j0 + 8g + 7.
 * The chunk's inputs are raw copies (cp.async) in two groups, each loaded while the other is in
 * use: {W, q̂, U} for the first half of a chunk (δ, q̂S), {k̂, P} for the second (o, S). The
 * decays are applied to the per-row results instead of the inputs: e^{c_i} to q̂_iS, and
 * e^{c_{n−1}−c_i} to a second copy of δ_i for the state update. */
__global__ void __launch_bounds__(GC_THREADS)
    gdn_chunk_scan_kernel(ds_cuda_batch b, ds_cuda_gdn_args a, gdn_scratch sc) {
    constexpr int DK = GP_DK, DV = GP_DK, L = GC_L, LD = GC_LD, PLD = GC_PLD, NC = GC_NC;
    static_assert(GC_THREADS == 4 * L && DK == 2 * L && NC == 4 * 8, "thread ↔ row / column map");
    extern __shared__ float4 gc_smem4[];
    float *Ws = (float *)gc_smem4; /* [L][LD] W                   group A */
    float *Qs = Ws + L * LD;       /* [L][LD] q̂                   group A */
    float *Us = Qs + L * LD;       /* [L][NC] U of the columns    group A */
    float *Ks = Us + L * NC;       /* [L][DK] k̂                   group B */
    float *Ps = Ks + L * DK;       /* [L][PLD] P                  group B */
    float *Ds = Ps + L * PLD;      /* [L][NC] δ */
    float *Dk = Ds + L * NC;       /* [L][NC] e^{c_{n−1}−c_i} δ_i */
    float *Ss = Dk + L * NC;       /* [DK][NC] S of the block's columns */
    pdl_enter(); /* cuda_launch.cuh: before any access */
    const int j0 = blockIdx.x * NC, h = blockIdx.y, s = blockIdx.z;
    const int hk = a.hk, hv = a.hv, kh = h / (hv / hk);
    const int ts = b.seq_start[s], te = b.seq_start[s + 1];
    if (ts >= te) return;
    const int tid = threadIdx.x, row = tid >> 2, g = tid & 3, cj = 8 * g;

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
            cp_async16(Ks + i * DK + d, sc.k + (t * hk + kh) * DK + d, i < n ? 16 : 0);
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

    float *S = a.state + (int64_t)b.seq_slot[s] * a.state_slot_stride + (int64_t)h * DK * DV + j0 + cj;
    float st[2][8]; /* S[2·row + r][j0 + cj + c] */
#pragma unroll
    for (int r = 0; r < 2; r++) {
        const float4 lo = *(const float4 *)(S + (int64_t)(2 * row + r) * DV);
        const float4 hi = *(const float4 *)(S + (int64_t)(2 * row + r) * DV + 4);
        st[r][0] = lo.x, st[r][1] = lo.y, st[r][2] = lo.z, st[r][3] = lo.w;
        st[r][4] = hi.x, st[r][5] = hi.y, st[r][6] = hi.z, st[r][7] = hi.w;
        *(float4 *)(Ss + (2 * row + r) * NC + cj) = lo;
        *(float4 *)(Ss + (2 * row + r) * NC + cj + 4) = hi;
    }

    for (int c0 = ts; c0 < te; c0 += L) {
        const int n = min(L, te - c0);
        const float cl = sc.cg[((int64_t)c0 + n - 1) * hv + h];
        const float ci = row < n ? sc.cg[((int64_t)c0 + row) * hv + h] : cl;
        cp_async_wait<1>(); /* group A of this chunk (B may still be in flight) */
        __syncthreads();    /* A visible to all; the previous chunk's S is in Ss */

        /* δ_row = U_row − W_row S and q̂_row S */
        float ws[8], qs[8];
#pragma unroll
        for (int c = 0; c < 8; c++) ws[c] = qs[c] = 0.f;
#pragma unroll 2
        for (int d = 0; d < DK; d += 4) {
            const float4 w4 = *(const float4 *)(Ws + row * LD + d);
            const float4 q4 = *(const float4 *)(Qs + row * LD + d);
            const float wv[4] = {w4.x, w4.y, w4.z, w4.w}, qv[4] = {q4.x, q4.y, q4.z, q4.w};
#pragma unroll
            for (int dd = 0; dd < 4; dd++) {
                const float4 lo = *(const float4 *)(Ss + (d + dd) * NC + cj);
                const float4 hi = *(const float4 *)(Ss + (d + dd) * NC + cj + 4);
                const float sv[8] = {lo.x, lo.y, lo.z, lo.w, hi.x, hi.y, hi.z, hi.w};
#pragma unroll
                for (int c = 0; c < 8; c++) {
                    ws[c] = fmaf(wv[dd], sv[c], ws[c]);
                    qs[c] = fmaf(qv[dd], sv[c], qs[c]);
                }
            }
        }
        const float eq = expf(ci), ek = expf(cl - ci); /* both ≤ 1: c decreases along the chunk */
#pragma unroll
        for (int c = 0; c < 8; c++) {
            const float delta = Us[row * NC + cj + c] - ws[c];
            Ds[row * NC + cj + c] = delta;
            Dk[row * NC + cj + c] = delta * ek;
            qs[c] *= eq;
        }
        __syncthreads(); /* δ visible; group A's buffers free */
        if (c0 + L < te) load_a(c0 + L);
        else cp_async_commit(); /* an empty group keeps wait<1> meaning "all but the newest" */
        cp_async_wait<1>();     /* group B of this chunk */
        __syncthreads();

        /* o_row = e^{c}q̂_row S + Σ_j P_row,j δ_j (P is zero above the diagonal and past n) */
#pragma unroll 4
        for (int j = 0; j < L; j++) {
            const float p = Ps[row * PLD + j];
            const float4 lo = *(const float4 *)(Ds + j * NC + cj);
            const float4 hi = *(const float4 *)(Ds + j * NC + cj + 4);
            qs[0] = fmaf(p, lo.x, qs[0]), qs[1] = fmaf(p, lo.y, qs[1]);
            qs[2] = fmaf(p, lo.z, qs[2]), qs[3] = fmaf(p, lo.w, qs[3]);
            qs[4] = fmaf(p, hi.x, qs[4]), qs[5] = fmaf(p, hi.y, qs[5]);
            qs[6] = fmaf(p, hi.z, qs[6]), qs[7] = fmaf(p, hi.w, qs[7]);
        }
        if (row < n) {
            float *o = sc.o + ((int64_t)(c0 + row) * hv + h) * DV + j0 + cj;
            *(float4 *)o = make_float4(qs[0], qs[1], qs[2], qs[3]);
            *(float4 *)(o + 4) = make_float4(qs[4], qs[5], qs[6], qs[7]);
        }

        /* S ← e^{c_{n−1}} S + Σ_i k̂_iᵀ (e^{c_{n−1}−c_i} δ_i) for state rows 2·row, 2·row + 1 */
        const float el = expf(cl);
#pragma unroll
        for (int r = 0; r < 2; r++)
#pragma unroll
            for (int c = 0; c < 8; c++) st[r][c] *= el;
#pragma unroll 4
        for (int i = 0; i < L; i++) {
            const float2 k2 = *(const float2 *)(Ks + i * DK + 2 * row);
            const float4 lo = *(const float4 *)(Dk + i * NC + cj);
            const float4 hi = *(const float4 *)(Dk + i * NC + cj + 4);
            const float dv[8] = {lo.x, lo.y, lo.z, lo.w, hi.x, hi.y, hi.z, hi.w};
#pragma unroll
            for (int c = 0; c < 8; c++) {
                st[0][c] = fmaf(k2.x, dv[c], st[0][c]);
                st[1][c] = fmaf(k2.y, dv[c], st[1][c]);
            }
        }
#pragma unroll
        for (int r = 0; r < 2; r++) {
            *(float4 *)(Ss + (2 * row + r) * NC + cj) = make_float4(st[r][0], st[r][1], st[r][2], st[r][3]);
            *(float4 *)(Ss + (2 * row + r) * NC + cj + 4) = make_float4(st[r][4], st[r][5], st[r][6], st[r][7]);
        }
        __syncthreads(); /* group B's buffers free; δ read by all */
        if (c0 + L < te) load_b(c0 + L);
        else cp_async_commit();
    }
    cp_async_wait<0>();
#pragma unroll
    for (int r = 0; r < 2; r++) {
        *(float4 *)(S + (int64_t)(2 * row + r) * DV) = make_float4(st[r][0], st[r][1], st[r][2], st[r][3]);
        *(float4 *)(S + (int64_t)(2 * row + r) * DV + 4) = make_float4(st[r][4], st[r][5], st[r][6], st[r][7]);
    }
}

void ds_cuda_gdn_chunked(ds_cuda_ctx *ctx, const ds_cuda_batch &b, const ds_cuda_gdn_args &a,
                         const gdn_scratch &sc) {
    /* Σ_s ⌈n_s / L⌉ ≤ T / L + S chunks; blocks past the last one return at once */
    const int chunks = DS_DIV_UP(b.n_tokens, GC_L) + b.n_seqs;
    ds_launch(ctx, gdn_chunk_prep_kernel, dim3(chunks, a.hv), GC_THREADS, sizeof(float) * GC_PREP_FLOATS, b, a, sc);
    DS_CU_LAUNCHED2(ctx, "gdn_chunk_prep_kernel", chunks, a.hv);
    ds_launch(ctx, gdn_chunk_scan_kernel, dim3(GP_DK / GC_NC, a.hv, b.n_seqs), GC_THREADS,
              sizeof(float) * GC_SCAN_FLOATS, b, a, sc);
    DS_CU_LAUNCHED2(ctx, "gdn_chunk_scan_kernel", b.n_seqs, a.hv);
}

/* Shared-memory limits of the two kernels, set once at creation (never inside a capture). */
extern "C" void ds_cuda_gdn_chunked_init(ds_cuda_ctx *ctx) {
    DS_CU(ctx, cudaFuncSetAttribute(gdn_chunk_prep_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    (int)(sizeof(float) * GC_PREP_FLOATS)));
    DS_CU(ctx, cudaFuncSetAttribute(gdn_chunk_scan_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    (int)(sizeof(float) * GC_SCAN_FLOATS)));
}
