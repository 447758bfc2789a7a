/* cuda_moe_gemm.cu — the routed experts of prefill-sized MoE steps as a grouped GEMM on tensor
 * cores (bf16 in, fp32 accumulate; DS_OPT_MOE_GEMM).
 *
 * Why: the expert GEMV (cuda_moe_experts.cuh) serves at most RMAX assignments per pass over an
 * expert's weights and multiplies on CUDA cores. A 512-token prefill chunk gives each of the 256 experts
 * of Qwen3.5-35B-A3B ~16 assignments, so every expert's weights were streamed 4 times from L2
 * and every FMA ran on the FP32 pipes: 194 of the chunk's 255 ms were the two expert launches.
 * Here a block computes a 64-assignment × 128-column tile of one expert with mma (WMMA
 * 16×16×16), reading each weight tile once per 64 assignments.
 *
 * Tiles. The assignments are grouped by expert on the device (sc.sorted, sc.off, sc.act); the
 * host does not know the counts, so the grid's x extent is the bound on the number of M tiles
 * (⌈A / 64⌉ + min(E, A)) and block x finds its (expert, first row) with a warp scan over the
 * per-expert tile counts; blocks past the last tile exit at once.
 *
 * Two passes:
 *   gate_up: act[a, n] = SiLU(g)·u, g = x[tok(a)]·W[e, n], u = x[tok(a)]·W[e, I + n]; a block's
 *            128 weight rows are 64 gate rows and the 64 matching up rows, so the epilogue has
 *            both halves and writes act [A, I] bf16 (g and u rounded to bf16 first, as the GEMV
 *            path stores them);
 *   down:    y[a, n] = act[a]·Wd[e, n] → fp32 [A, H], combined by cuda_moe.cu's combine kernel.
 * Deterministic: no atomics; each output element is one tile's fp32 accumulation. */
#include <mma.h>

#include "cuda_launch.cuh"
#include "cuda_moe_gemm.h"

using namespace nvcuda;

#define GG_BM 64             /* assignments per tile */
#define GG_BN 128            /* weight rows per tile */
#define GG_BK 32             /* K per pipeline stage */
#define GG_LDS (GG_BK + 8)   /* smem row pitch (bf16): 80 bytes, rows start on distinct banks */
#define GG_LDC (GG_BN + 4)   /* fp32 pitch of the epilogue tile */
/* Warps: 2 (M) × WN (N), each 32 × (GG_BN / WN): WN = 4 (256 threads, 32 × 32 warp tiles, two
 * smem fragment loads per MMA) or WN = 2 (128 threads, 32 × 64: 1.5 loads per MMA). Chosen at
 * creation (DS_CUDA_MOE_GEMM_WN, default 2: prefill of 1024 tokens 82.06 ms with 4, 78.27 ms
 * with 2, run s4-run6). */
#define GG_THREADS(WN) (64 * (WN))
/* Pipeline depth ST: ST − 1 stages of weight tiles in flight per block. 2 by default; 3 or 4
 * with DS_CUDA_MOE_GEMM_STAGES (at WN = 2). ncu (s9-run2) finds the warps waiting on memory
 * most of the time (126 registers: 4 blocks of 4 warps an SM), yet more bytes in flight barely
 * help: prefill of 1024 tokens 63.33 (3 stages) / 62.95 (4) vs 63.93 ms (2), s9-run3; and an L2
 * prefetch of each weight row's next 4 / 8 stages measured 57.89 / 64.04 vs 58.31 ms (s9-run5,
 * removed). */
template <int ST> struct gg_smem_pipe {
    bf16 a[ST][GG_BM][GG_LDS]; /* [stage][row][k] */
    bf16 b[ST][GG_BN][GG_LDS]; /* [stage][weight row][k] */
};
template <int ST> union gg_smem {
    gg_smem_pipe<ST> pipe;
    float c[GG_BM][GG_LDC]; /* the accumulators, after the main loop */
};

/* Block x → (active expert index, first assignment row within it); *expert_i = -1 past the end.
 * Warp 0: lane l owns the contiguous experts [l·per, (l+1)·per), loads all their offsets at
 * once and sums their tile counts ⌈(off[i+1] − off[i]) / BM⌉; one warp scan of the lane
 * totals; the lane whose range holds bx walks its experts. (Session 4's version scanned 32
 * experts per round with the rounds chained by their loads — ⌈n / 32⌉ round trips before a
 * late block's first weight load; measured no slower at 256 experts, s7-run3: prefill 1024
 * tokens 77.08 vs 76.91 ms, same tiles bit for bit.) */
static __device__ void gg_find_tile(int bx, const ds_moe_groups &g, int *expert_i, int *m0) {
    if (threadIdx.x >= 32) return;
    const int lane = threadIdx.x;
    const int n = *g.n_act;
    if (lane == 0) *expert_i = -1;
    const int per = DS_DIV_UP(n, 32);
    const int i0 = min(lane * per, n), i1 = min(i0 + per, n);
    int tot = 0;
#pragma unroll 8
    for (int i = i0; i < i1; i++) tot += DS_DIV_UP(g.off[i + 1] - g.off[i], GG_BM);
    int incl = tot;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        const int y = __shfl_up_sync(0xffffffffu, incl, o);
        if (lane >= o) incl += y;
    }
    __syncwarp();
    if (bx >= incl - tot && bx < incl) { /* one lane at most */
        int base = incl - tot;
        for (int i = i0; i < i1; i++) {
            const int t = DS_DIV_UP(g.off[i + 1] - g.off[i], GG_BM);
            if (bx < base + t) {
                *expert_i = i;
                *m0 = (bx - base) * GG_BM;
                break;
            }
            base += t;
        }
    }
}

template <bool GATE_UP, int WN, int ST>
__global__ void __launch_bounds__(GG_THREADS(WN))
    moe_group_gemm_kernel(const bf16 *__restrict__ W, int N, int K, const bf16 *__restrict__ x,
                          int k_top, ds_moe_groups g, void *__restrict__ out) {
    extern __shared__ __align__(128) unsigned char gg_dyn[];
    gg_smem<ST> &sm = *(gg_smem<ST> *)gg_dyn; /* dynamic: over the 48 KiB static limit */
    __shared__ const bf16 *arow[GG_BM]; /* source row of each tile row, NULL for padding */
    __shared__ int asg[GG_BM];          /* assignment index of each tile row */
    __shared__ int tile_i, tile_m0;
    pdl_enter(); /* cuda_launch.cuh: before any access */
    gg_find_tile(blockIdx.x, g, &tile_i, &tile_m0);
    __syncthreads();
    const int ei = tile_i;
    if (ei < 0) return;
    const int tid = threadIdx.x;
    const int e = g.act[ei];
    const int a0 = g.off[ei] + tile_m0;
    const int rows = min(GG_BM, g.off[ei + 1] - a0);
    if (tid < GG_BM) {
        const int a = tid < rows ? g.sorted[a0 + tid] : -1;
        asg[tid] = a;
        /* gate_up reads token a / k_top of x [T, K]; down reads row a of act [A, K] */
        arow[tid] = a < 0 ? NULL : x + (int64_t)(GATE_UP ? a / k_top : a) * K;
    }
    /* weight rows of this tile: gate_up, 64 gate rows n0.. and the same 64 up rows I + n0..
     * (N = I output columns per half); down, 128 rows n0.. of [N, K] */
    const int n0 = blockIdx.y * (GATE_UP ? GG_BN / 2 : GG_BN);
    const int64_t w_rows = GATE_UP ? 2 * (int64_t)N : (int64_t)N;
    const bf16 *We = W + (int64_t)e * w_rows * K;
    __syncthreads();

    /* per thread: CA 16-byte chunks of the A tile (rows ar + RS·j), CB of the B tile, all at
     * column ch of the stage */
    constexpr int NT = GG_THREADS(WN), RS = NT / 4, CA = GG_BM / RS, CB = GG_BN / RS;
    const int ch = (tid & 3) * 8;
    const int ar = tid >> 2;
    const bf16 *asrc[CA];
#pragma unroll
    for (int j = 0; j < CA; j++) asrc[j] = arow[ar + RS * j];
    const bf16 *bsrc[CB];
    bool bval[CB];
#pragma unroll
    for (int j = 0; j < CB; j++) {
        const int r = ar + RS * j;
        int64_t wr;
        if (GATE_UP) {
            const int c = n0 + (r & 63);
            bval[j] = c < N;
            wr = (r < 64 ? 0 : N) + (int64_t)(bval[j] ? c : 0);
        } else {
            bval[j] = n0 + r < N;
            wr = bval[j] ? n0 + r : 0;
        }
        bsrc[j] = We + wr * K + ch;
    }
    auto load_stage = [&](int s, int k0) { /* one commit group */
#pragma unroll
        for (int j = 0; j < CA; j++)
            cp_async16(&sm.pipe.a[s][ar + RS * j][ch], asrc[j] ? asrc[j] + k0 + ch : We, asrc[j] ? 16 : 0);
#pragma unroll
        for (int j = 0; j < CB; j++) cp_async16(&sm.pipe.b[s][ar + RS * j][ch], bsrc[j] + k0, bval[j] ? 16 : 0);
        cp_async_commit();
    };

    constexpr int WTN = GG_BN / WN, FN = WTN / 16; /* warp tile columns, fragments */
    const int warp = tid >> 5, wm = warp / WN, wn = warp % WN;
    wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc[2][FN];
#pragma unroll
    for (int i = 0; i < 2; i++)
#pragma unroll
        for (int j = 0; j < FN; j++) wmma::fill_fragment(acc[i][j], 0.f);

    const int KT = K / GG_BK;
    /* stages 0 .. ST − 2 in flight; every iteration commits one group (possibly empty) so that
     * wait_group<ST − 2> always means "stage kt has landed" */
#pragma unroll
    for (int st = 0; st < ST - 1; st++) {
        if (st < KT) load_stage(st, st * GG_BK);
        else cp_async_commit();
    }
    for (int kt = 0; kt < KT; kt++) {
        const int s = kt % ST;
        cp_async_wait<ST - 2>();
        __syncthreads(); /* stage s visible to all; stage (kt − 1) % ST consumed by all */
        const int kn = kt + ST - 1;
        if (kn < KT) load_stage(kn % ST, kn * GG_BK);
        else cp_async_commit();
#pragma unroll
        for (int kk = 0; kk < GG_BK; kk += 16) {
            wmma::fragment<wmma::matrix_a, 16, 16, 16, bf16, wmma::row_major> fa[2];
            wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::col_major> fb[FN];
#pragma unroll
            for (int i = 0; i < 2; i++) wmma::load_matrix_sync(fa[i], &sm.pipe.a[s][wm * 32 + i * 16][kk], GG_LDS);
            /* B(k, n) = W[n, k]: the weight tile rows are B's columns */
#pragma unroll
            for (int j = 0; j < FN; j++) wmma::load_matrix_sync(fb[j], &sm.pipe.b[s][wn * WTN + j * 16][kk], GG_LDS);
#pragma unroll
            for (int i = 0; i < 2; i++)
#pragma unroll
                for (int j = 0; j < FN; j++) wmma::mma_sync(acc[i][j], fa[i], fb[j], acc[i][j]);
        }
    }
    cp_async_wait<0>();
    __syncthreads(); /* the accumulator tile reuses the pipeline's memory */
#pragma unroll
    for (int i = 0; i < 2; i++)
#pragma unroll
        for (int j = 0; j < FN; j++)
            wmma::store_matrix_sync(&sm.c[wm * 32 + i * 16][wn * WTN + j * 16], acc[i][j], GG_LDC,
                                    wmma::mem_row_major);
    __syncthreads();

    if (GATE_UP) {
        bf16 *act = (bf16 *)out; /* [A, N] */
        for (int idx = tid; idx < GG_BM * 64; idx += NT) {
            const int r = idx >> 6, c = idx & 63;
            if (r >= rows || n0 + c >= N) continue;
            const float gv = __bfloat162float(__float2bfloat16_rn(sm.c[r][c]));
            const float uv = __bfloat162float(__float2bfloat16_rn(sm.c[r][64 + c]));
            act[(int64_t)asg[r] * N + n0 + c] = __float2bfloat16_rn(silu_f(gv) * uv);
        }
    } else {
        float *y = (float *)out; /* [A, N] */
        for (int idx = tid; idx < GG_BM * (GG_BN / 4); idx += NT) {
            const int r = idx / (GG_BN / 4), c = (idx % (GG_BN / 4)) * 4;
            if (r >= rows || n0 + c >= N) continue; /* N % 8 == 0: n0 + c < N → all 4 valid */
            *(float4 *)&y[(int64_t)asg[r] * N + n0 + c] =
                make_float4(sm.c[r][c], sm.c[r][c + 1], sm.c[r][c + 2], sm.c[r][c + 3]);
        }
    }
}

extern "C" bool ds_cuda_moe_gemm_fits(int H, int I) {
    return H % GG_BK == 0 && I % GG_BK == 0 && H % 8 == 0 && I % 8 == 0;
}

/* Dynamic shared memory limit of every instantiation, set once at creation. */
template <int WN, int ST> static void gemm_init(ds_cuda_ctx *ctx) {
    DS_CU(ctx, cudaFuncSetAttribute(moe_group_gemm_kernel<true, WN, ST>,
                                    cudaFuncAttributeMaxDynamicSharedMemorySize, (int)sizeof(gg_smem<ST>)));
    DS_CU(ctx, cudaFuncSetAttribute(moe_group_gemm_kernel<false, WN, ST>,
                                    cudaFuncAttributeMaxDynamicSharedMemorySize, (int)sizeof(gg_smem<ST>)));
}
extern "C" void ds_cuda_moe_gemm_init(ds_cuda_ctx *ctx) {
    gemm_init<4, 2>(ctx);
    gemm_init<2, 2>(ctx);
    gemm_init<2, 3>(ctx);
    gemm_init<2, 4>(ctx);
}

template <int WN, int ST>
static void launch_gemms(ds_cuda_ctx *ctx, const ds_moe_gemm_args *a) {
    const int tiles = DS_DIV_UP(a->A, GG_BM) + (a->A < a->E ? a->A : a->E);
    /* gate_up: act [A, I] from x [T, H] and W_gu [E, 2I, H] */
    dim3 gu(tiles, DS_DIV_UP(a->I, GG_BN / 2));
    ds_launch(ctx, moe_group_gemm_kernel<true, WN, ST>, gu, GG_THREADS(WN), sizeof(gg_smem<ST>),
              (const bf16 *)a->w_gu, a->I, a->H, (const bf16 *)a->x, a->top_k, a->groups, (void *)a->act);
    DS_CU_LAUNCHED2(ctx, "moe_group_gemm_kernel<gate_up>", a->A, a->I);
    /* down: y [A, H] fp32 from act [A, I] and W_down [E, H, I] */
    dim3 dn(tiles, DS_DIV_UP(a->H, GG_BN));
    ds_launch(ctx, moe_group_gemm_kernel<false, WN, ST>, dn, GG_THREADS(WN), sizeof(gg_smem<ST>),
              (const bf16 *)a->w_down, a->H, a->I, (const bf16 *)a->act, a->top_k, a->groups, (void *)a->y);
    DS_CU_LAUNCHED2(ctx, "moe_group_gemm_kernel<down>", a->A, a->H);
}

extern "C" void ds_cuda_moe_gemm(ds_cuda_ctx *ctx, const ds_moe_gemm_args *a) {
    if (ctx->moe_gemm_wn == 4) launch_gemms<4, 2>(ctx, a);
    else if (ctx->moe_gemm_stages == 4) launch_gemms<2, 4>(ctx, a);
    else if (ctx->moe_gemm_stages == 3) launch_gemms<2, 3>(ctx, a);
    else launch_gemms<2, 2>(ctx, a);
}
