/* cuda_moe_gemm.cu — the routed experts of prefill-sized MoE steps as a grouped GEMM on tensor
 * cores (bf16 in, fp32 accumulate; DS_OPT_MOE_GEMM).
 *
 * Why: the expert GEMV (cuda_moe_experts.cuh) serves at most RMAX assignments per pass over an
 * expert's weights and multiplies on CUDA cores. A 512-token prefill chunk gives each of the 256 experts
 * of Qwen3.5-35B-A3B ~16 assignments, so every expert's weights were streamed 4 times from L2
 * and every FMA ran on the FP32 pipes: 194 of the chunk's 255 ms were the two expert launches.
 * Here a block computes a 64-assignment × BN-column tile of one expert with mma (WMMA
 * 16×16×16; BN 256 by default since session 24, see below), reading each weight tile once per
 * 64 assignments.
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
 *   down:    y[a, n] = act[a]·Wd[e, n] → fp32 [A, H], combined by cuda_moe.cu's combine kernel;
 *            or rounded to bf16 (DS_CUDA_MOE_Y16): at 1024 tokens of 35B-A3B y is 64 MB a
 *            layer in fp32, written here and read by the combine, against ~400 MB of weights
 *            (written in session 22 without a GPU: not yet measured, off by default).
 * Deterministic: no atomics; each output element is one tile's fp32 accumulation.
 *
 * Since session 25 the default is cuda_moe_gemm_tma.cu (the same results, its weights fed by TMA
 * into persistent blocks), where it applies; this kernel serves the rest (H not a multiple of
 * 128 or I of 64, a driver without tensor maps) and DS_CUDA_MOE_GEMM_TMA=0. */
#include <mma.h>

#include "cuda_launch.cuh"
#include "cuda_moe_gemm.h"
#include "cuda_moe_tiles.cuh"

using namespace nvcuda;

#define GG_BM 64 /* assignments per tile */
/* Weight rows per tile BN (256 by default since session 24, or 128 with DS_CUDA_MOE_GEMM_BN) and
 * K per pipeline stage BK (64 by default, or 32 / 128 with DS_CUDA_MOE_GEMM_BK) are template
 * parameters. Why BK: a stage reads 2·BK bytes of each of its BN weight rows, rows K·2 bytes
 * apart; at BK = 32 that is 64-byte pieces of 128 (gate_up) or 256 rows, the next piece of each
 * row a stage later, and the kernel stayed at 2.1-2.25 TB/s (session 9) where the expert GEMV,
 * streaming each row in long runs, reaches ~4. 128-byte pieces (BK 64) took a 1024-token
 * prefill from 58.99 / 58.62 to 48.37 / 48.48 ms (H100, s19-run1; BK 128: 48.94). Why BN: each
 * block reads its tile's activations once per weight tile, so 256 rows halve those L2 reads
 * (with BK 64: 48.12 ms vs 48.37 / 48.48, s19-run1; 44.05 vs 44.38 / 44.45, s24-run1; 43.91 vs
 * 44.17 / 44.13, s24-run4: small, the same sign three times; all H100s). BN 64 (256-byte
 * pieces at BK 128 in 70 KB of shared memory, 3 blocks an SM) lost: 49.27 ms at BK 64, 49.53
 * at BK 128 against 48.65 / 48.63 for BN 128 (H100, s20-run1); removed. */
template <int BK> struct gg_pitch {
    /* smem row pitch (bf16): 80, 144 or 272 bytes, so 8 consecutive rows start in 8 distinct
     * 16-byte bank groups (fragment loads without conflicts) */
    static constexpr int LDS = BK + 8;
};
/* Warps: 2 (M) × WN (N), each 32 × (BN / WN): WN = 4 (256 threads) or WN = 2 (128 threads).
 * At BN = 128, WN = 4 gives 32 × 32 warp tiles (two smem fragment loads per MMA), WN = 2 32 × 64
 * (1.5 loads per MMA); DS_CUDA_MOE_GEMM_WN, default 2: prefill of 1024 tokens 82.06 ms with 4,
 * 78.27 ms with 2, run s4-run6. BN = 256 always takes WN = 4 (32 × 64 warp tiles). */
#define GG_THREADS(WN) (64 * (WN))
/* Pipeline depth ST: ST − 1 stages of weight tiles in flight per block. 2 by default; 3 or 4
 * with DS_CUDA_MOE_GEMM_STAGES (at WN = 2). ncu (s9-run2) finds the warps waiting on memory
 * most of the time (126 registers: 4 blocks of 4 warps an SM), yet more bytes in flight barely
 * help: prefill of 1024 tokens 63.33 (3 stages) / 62.95 (4) vs 63.93 ms (2), s9-run3; and an L2
 * prefetch of each weight row's next 4 / 8 stages measured 57.89 / 64.04 vs 58.31 ms (s9-run5,
 * removed). */
template <int ST, int BK, int BN> struct gg_smem_pipe {
    bf16 a[ST][GG_BM][gg_pitch<BK>::LDS]; /* [stage][row][k] */
    bf16 b[ST][BN][gg_pitch<BK>::LDS];    /* [stage][weight row][k] */
};
template <int ST, int BK, int BN> union gg_smem {
    gg_smem_pipe<ST, BK, BN> pipe;
    float c[GG_BM][BN + 4]; /* the accumulators, after the main loop */
};

/* Block x → (active expert index, first assignment row within it) in shared memory, by warp 0
 * (cuda_moe_tiles.cuh); *expert_i = -1 past the end. */
static __device__ void gg_find_tile(int bx, const ds_moe_groups &g, int *expert_i, int *m0) {
    if (threadIdx.x >= 32) return;
    int ei, r0;
    moe_tile_lookup<GG_BM>(bx, g, &ei, &r0);
    if (threadIdx.x == 0) *expert_i = ei, *m0 = r0;
}

/* Y16 (down pass only): y stored in bf16. A template parameter, not a flag: the flag's extra
 * epilogue took the BK 32 and BK 128 down passes from 128 / 124 to 166 / 182 registers. */
template <bool GATE_UP, int WN, int ST, int BK, int BN, bool Y16>
/* ≤ 128 registers: 4 blocks of 4 warps (2 of 8) an SM */
__global__ void __launch_bounds__(GG_THREADS(WN), 512 / GG_THREADS(WN))
    moe_group_gemm_kernel(const bf16 *__restrict__ W, int N, int K, const bf16 *__restrict__ x,
                          int k_top, ds_moe_groups g, void *__restrict__ out, int ntiles, int skip_pad) {
    constexpr int LDS = gg_pitch<BK>::LDS, LDC = BN + 4, HALF = BN / 2;
    extern __shared__ __align__(128) unsigned char gg_dyn[];
    gg_smem<ST, BK, BN> &sm = *(gg_smem<ST, BK, BN> *)gg_dyn; /* dynamic: over the 48 KiB static limit */
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
    /* column tiles blockIdx.y · ntiles … (ntiles > 1: DS_CUDA_MOE_GEMM_DOWN_TILES, the down pass,
     * whose K = I main loop is short: the tile lookup and row setup above are paid once) */
    const int n_tiles = GATE_UP ? 1 : ntiles; /* a constant for gate_up: no loop there */
    for (int tile = 0; tile < n_tiles; tile++) {
        /* weight rows of this tile: gate_up, HALF gate rows n0.. and the same HALF up rows I + n0..
         * (N = I output columns per half); down, BN rows n0.. of [N, K] */
        const int n0 = (blockIdx.y * n_tiles + tile) * (GATE_UP ? HALF : BN);
        if (n0 >= N) break; /* uniform across the block */
        const int64_t w_rows = GATE_UP ? 2 * (int64_t)N : (int64_t)N;
        const bf16 *We = W + (int64_t)e * w_rows * K;
        __syncthreads();

        /* per thread: CA 16-byte chunks of the A tile (rows ar + RS·j), CB of the B tile, all at
         * column ch of the stage; CPR threads cover a row's BK columns */
        constexpr int NT = GG_THREADS(WN), CPR = BK / 8, RS = NT / CPR, CA = GG_BM / RS, CB = BN / RS;
        static_assert(NT % CPR == 0 && GG_BM % RS == 0 && HALF % RS == 0, "load map");
        const int ch = (tid % CPR) * 8;
        const int ar = tid / CPR;
        /* A sources: in registers while few; from arow (shared) per stage when CA > 2, where the
         * pointers would cost more registers than the loads of them cost time */
        constexpr bool A_REGS = CA <= 2;
        const bf16 *asrc[A_REGS ? CA : 1];
        if constexpr (A_REGS) {
#pragma unroll
            for (int j = 0; j < CA; j++) asrc[j] = arow[ar + RS * j];
        }
        /* B row of chunk j: rows ar + RS·j of the tile; gate_up's first CB / 2 are gate rows
         * n0 + ar + RS·j, the rest the matching up rows (N further down) */
        const bf16 *bbase = We + (int64_t)(n0 + ar) * K + ch;
        auto b_row_ok = [&](int j) {
            return GATE_UP ? n0 + ar + RS * (j % (CB / 2)) < N : n0 + ar + RS * j < N;
        };
        auto b_src = [&](int j) -> const bf16 * {
            if (!b_row_ok(j)) return We; /* zero-filled, nothing read */
            const int64_t r = GATE_UP ? (j < CB / 2 ? (int64_t)RS * j : (int64_t)N + RS * (j - CB / 2)) : (int64_t)RS * j;
            return bbase + r * K;
        };
        auto load_stage = [&](int s, int k0) { /* one commit group */
#pragma unroll
            for (int j = 0; j < CA; j++) {
                const bf16 *src = A_REGS ? asrc[A_REGS ? j : 0] : arow[ar + RS * j];
                cp_async16(&sm.pipe.a[s][ar + RS * j][ch], src ? src + k0 + ch : We, src ? 16 : 0);
            }
#pragma unroll
            for (int j = 0; j < CB; j++) {
                /* (the test stays at the call: passing b_src(j) + k0 alone, which is We + k0 for
                 * a missing row, took the default down pass from 128 to 166 registers) */
                const bool ok = b_row_ok(j);
                cp_async16(&sm.pipe.b[s][ar + RS * j][ch], ok ? b_src(j) + k0 : We, ok ? 16 : 0);
            }
            cp_async_commit();
        };

        constexpr int WTN = BN / WN, FN = WTN / 16; /* warp tile columns, fragments */
        const int warp = tid >> 5, wm = warp / WN, wn = warp % WN;
        /* this warp's 16-row A fragments that hold assignments (skip_pad, DS_CUDA_MOE_GEMM_SKIP):
         * at ~32 assignments an expert (1024 tokens of 35B-A3B) the tile's second half is
         * padding, and its MMAs only fill accumulator rows that are never stored. Warp-uniform;
         * the stored rows' sums are unchanged, bit for bit. */
        const int mi = skip_pad ? max(0, min(2, DS_DIV_UP(rows - wm * 32, 16))) : 2;
        wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc[2][FN];
#pragma unroll
        for (int i = 0; i < 2; i++)
#pragma unroll
            for (int j = 0; j < FN; j++) wmma::fill_fragment(acc[i][j], 0.f);

        const int KT = K / BK; /* the launch picks BK dividing K */
        /* stages 0 .. ST − 2 in flight; every iteration commits one group (possibly empty) so that
         * wait_group<ST − 2> always means "stage kt has landed" */
#pragma unroll
        for (int st = 0; st < ST - 1; st++) {
            if (st < KT) load_stage(st, st * BK);
            else cp_async_commit();
        }
        for (int kt = 0; kt < KT; kt++) {
            const int s = kt % ST;
            cp_async_wait<ST - 2>();
            __syncthreads(); /* stage s visible to all; stage (kt − 1) % ST consumed by all */
            const int kn = kt + ST - 1;
            if (kn < KT) load_stage(kn % ST, kn * BK);
            else cp_async_commit();
            /* the same k = 0, 16, 32, … sequence of MMAs whatever BK: results bit for bit equal */
#pragma unroll
            for (int kk = 0; kk < BK; kk += 16) {
                if (mi == 0) break; /* warp-uniform: nothing of this warp's rows is stored */
                wmma::fragment<wmma::matrix_a, 16, 16, 16, bf16, wmma::row_major> fa[2];
                wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::col_major> fb[FN];
#pragma unroll
                for (int i = 0; i < 2; i++)
                    if (i < mi) wmma::load_matrix_sync(fa[i], &sm.pipe.a[s][wm * 32 + i * 16][kk], LDS);
                /* B(k, n) = W[n, k]: the weight tile rows are B's columns */
#pragma unroll
                for (int j = 0; j < FN; j++) wmma::load_matrix_sync(fb[j], &sm.pipe.b[s][wn * WTN + j * 16][kk], LDS);
#pragma unroll
                for (int i = 0; i < 2; i++)
                    if (i < mi)
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
                wmma::store_matrix_sync(&sm.c[wm * 32 + i * 16][wn * WTN + j * 16], acc[i][j], LDC,
                                        wmma::mem_row_major);
        __syncthreads();

        if (GATE_UP) {
            bf16 *act = (bf16 *)out; /* [A, N] */
            for (int idx = tid; idx < GG_BM * HALF; idx += NT) {
                const int r = idx / HALF, c = idx % HALF;
                if (r >= rows || n0 + c >= N) continue;
                const float gv = __bfloat162float(__float2bfloat16_rn(sm.c[r][c]));
                const float uv = __bfloat162float(__float2bfloat16_rn(sm.c[r][HALF + c]));
                act[(int64_t)asg[r] * N + n0 + c] = __float2bfloat16_rn(silu_f(gv) * uv);
            }
        } else if constexpr (Y16) {
            bf16 *y = (bf16 *)out; /* [A, N], each fp32 sum rounded once */
            for (int idx = tid; idx < GG_BM * (BN / 8); idx += NT) {
                const int r = idx / (BN / 8), c = (idx % (BN / 8)) * 8;
                if (r >= rows || n0 + c >= N) continue; /* N % 8 == 0: n0 + c < N → all 8 valid */
                float f[8];
#pragma unroll
                for (int j = 0; j < 8; j++) f[j] = sm.c[r][c + j];
                *(uint4 *)&y[(int64_t)asg[r] * N + n0 + c] = pack8(f);
            }
        } else {
            float *y = (float *)out; /* [A, N] */
            for (int idx = tid; idx < GG_BM * (BN / 4); idx += NT) {
                const int r = idx / (BN / 4), c = (idx % (BN / 4)) * 4;
                if (r >= rows || n0 + c >= N) continue; /* N % 8 == 0: n0 + c < N → all 4 valid */
                *(float4 *)&y[(int64_t)asg[r] * N + n0 + c] =
                    make_float4(sm.c[r][c], sm.c[r][c + 1], sm.c[r][c + 2], sm.c[r][c + 3]);
            }
        }
        __syncthreads(); /* the next tile's stages overwrite sm.c */
    }
}

extern "C" bool ds_cuda_moe_gemm_fits(int H, int I) {
    return H % 32 == 0 && I % 32 == 0 && H % 8 == 0 && I % 8 == 0;
}

/* Dynamic shared memory limit of both passes of one instantiation, set once at creation. */
template <int WN, int ST, int BK, int BN> static void gemm_init(ds_cuda_ctx *ctx) {
    const int bytes = (int)sizeof(gg_smem<ST, BK, BN>);
    DS_CU(ctx, cudaFuncSetAttribute(moe_group_gemm_kernel<true, WN, ST, BK, BN, false>,
                                    cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
    DS_CU(ctx, cudaFuncSetAttribute(moe_group_gemm_kernel<false, WN, ST, BK, BN, false>,
                                    cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
    DS_CU(ctx, cudaFuncSetAttribute(moe_group_gemm_kernel<false, WN, ST, BK, BN, true>,
                                    cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
}
/* Every instantiation ds_cuda_moe_gemm can pick (pass below). */
extern "C" void ds_cuda_moe_gemm_init(ds_cuda_ctx *ctx) {
    gemm_init<4, 2, 32, 128>(ctx);
    gemm_init<2, 2, 32, 128>(ctx);
    gemm_init<2, 3, 32, 128>(ctx);
    gemm_init<2, 4, 32, 128>(ctx);
    gemm_init<2, 2, 64, 128>(ctx);
    gemm_init<2, 3, 64, 128>(ctx);
    gemm_init<2, 2, 128, 128>(ctx);
    gemm_init<4, 2, 32, 256>(ctx);
    gemm_init<4, 2, 64, 256>(ctx);
    ds_cuda_moe_gemm_tma_init(ctx);
}

/* One pass: gate_up (act [A, I] from x [T, H] and W_gu [E, 2I, H]) or down (y [A, H] fp32 or
 * bf16 from act [A, I] and W_down [E, H, I]). */
template <bool GATE_UP, int WN, int ST, int BK, int BN>
static void launch_pass(ds_cuda_ctx *ctx, const ds_moe_gemm_args *a) {
    const int tiles = DS_DIV_UP(a->A, GG_BM) + (a->A < a->E ? a->A : a->E);
    const int N = GATE_UP ? a->I : a->H, K = GATE_UP ? a->H : a->I;
    const int ntiles = GATE_UP ? 1 : ctx->moe_gemm_down_tiles; /* column tiles a block */
    dim3 grid(tiles, DS_DIV_UP(DS_DIV_UP(N, GATE_UP ? BN / 2 : BN), ntiles));
    auto kern = moe_group_gemm_kernel<GATE_UP, WN, ST, BK, BN, false>;
    if constexpr (!GATE_UP)
        if (a->y_bf16) kern = moe_group_gemm_kernel<false, WN, ST, BK, BN, true>;
    ds_launch(ctx, kern, grid, GG_THREADS(WN), sizeof(gg_smem<ST, BK, BN>),
              (const bf16 *)(GATE_UP ? a->w_gu : a->w_down), N, K,
              (const bf16 *)(GATE_UP ? a->x : a->act), a->top_k, a->groups,
              GATE_UP ? (void *)a->act : a->y, ntiles, ctx->moe_gemm_skip);
    DS_CU_LAUNCHED2(ctx, GATE_UP ? "moe_group_gemm_kernel<gate_up>" : "moe_group_gemm_kernel<down>", a->A, N);
}

/* The instantiation for the knobs (ctx->moe_gemm_wn / _stages / _bk / _bn) and this pass's K:
 * a BK that does not divide K falls back to 32 (ds_cuda_moe_gemm_fits holds K % 32 == 0).
 * Instantiated combinations (the knob table in the README says the same): BN 128 with BK 32
 * (WN 2 at 2-4 stages, or WN 4 at 2), BK 64 (WN 2, 2 or 3 stages), BK 128 (WN 2, 2 stages);
 * BN 256 with BK 32 or 64 (WN 4, 2 stages; BK 128 takes 64). Knobs outside them are not used. */
template <bool GATE_UP> static void pass(ds_cuda_ctx *ctx, const ds_moe_gemm_args *a) {
    const int K = GATE_UP ? a->H : a->I;
    const int bk = K % ctx->moe_gemm_bk == 0 ? ctx->moe_gemm_bk : 32;
    if (ctx->moe_gemm_bn == 256) {
        if (bk >= 64) launch_pass<GATE_UP, 4, 2, 64, 256>(ctx, a); /* K % 128 == 0 → K % 64 == 0 */
        else launch_pass<GATE_UP, 4, 2, 32, 256>(ctx, a);
    } else if (bk == 128) {
        launch_pass<GATE_UP, 2, 2, 128, 128>(ctx, a);
    } else if (bk == 64) {
        if (ctx->moe_gemm_stages == 3) launch_pass<GATE_UP, 2, 3, 64, 128>(ctx, a);
        else launch_pass<GATE_UP, 2, 2, 64, 128>(ctx, a);
    } else if (ctx->moe_gemm_wn == 4) {
        launch_pass<GATE_UP, 4, 2, 32, 128>(ctx, a);
    } else if (ctx->moe_gemm_stages == 4) {
        launch_pass<GATE_UP, 2, 4, 32, 128>(ctx, a);
    } else if (ctx->moe_gemm_stages == 3) {
        launch_pass<GATE_UP, 2, 3, 32, 128>(ctx, a);
    } else {
        launch_pass<GATE_UP, 2, 2, 32, 128>(ctx, a);
    }
}

extern "C" void ds_cuda_moe_gemm(ds_cuda_ctx *ctx, const ds_moe_gemm_args *a) {
    if (ctx->moe_gemm_tma && ds_cuda_moe_gemm_tma(ctx, a)) { /* cuda_moe_gemm_tma.cu */
        ctx->moe_gemm_tma_runs++;
        return;
    }
    pass<true>(ctx, a);
    pass<false>(ctx, a);
}
