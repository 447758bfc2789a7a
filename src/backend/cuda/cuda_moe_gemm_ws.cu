/* cuda_moe_gemm_ws.cu — the grouped expert GEMM of prefill (cuda_moe_gemm.cu) as a persistent,
 * warp-specialised kernel: one producer warp streams the tiles' rows into a ring of ST shared
 * memory stages with bulk copies (the Hopper copy engine, `cp.async.bulk` completing on an
 * mbarrier), four consumer warps multiply, and the ring runs on across tile boundaries
 * (DS_CUDA_MOE_GEMM_WS; sm_90).
 *
 * Why: the expert GEMMs are half of a 1024-token prefill (22.3 of 42.4 ms on an H200, s23-run1),
 * and they read their weights at 3.0 (gate_up) and 2.65 TB/s (down) where the copy rate is ~4.3.
 * The access pattern is not the limit: tools/gpu/probe_weight_stream.cu replays it (128 B of
 * each of 128 rows a stage, 4 blocks an SM, 2 stages) at 94 % of a streaming read on an H100
 * (s24-run1), where the GEMM itself reaches 80 % / 70 %. What the tiled kernel loses is time
 * with nothing in flight: a block has one stage loading while it multiplies the other, and
 * none during its tile lookup (a chain of dependent loads) or its epilogue — a large share of
 * a down tile, whose K = I loop is 8 stages. Here each SM has one block whose producer keeps up
 * to ST − 1 stages in flight, and it starts the next tile's loads while the consumers still
 * finish the last one.
 *
 * Tiles: BM 64 assignments of one expert × BN 128 weight rows (gate_up: 64 gate rows and the
 * matching 64 up rows), K in stages of BK 64 (128-byte pieces of each row, one bulk copy per
 * row and stage). Tile t of the block's walk (t = blockIdx.x, + gridDim.x, …) is column tile
 * t % NCOL of M tile t / NCOL; the M tiles of every active expert in order, from a prefix of
 * their counts each block builds once in shared memory. Neighbouring blocks take the column
 * tiles of one M tile, so its activation rows are read from L2 by all of them at about the same
 * time.
 *
 * Consumer warp w owns 32 of the tile's 128 weight rows for all 64 assignment rows (four 16-row
 * fragments × two 16-column fragments); gate_up: the gate rows 16w … and the matching up rows,
 * so each warp has both halves of its 16 output columns and finishes its epilogue alone through
 * its own fp32 tile in shared memory (no block barrier: the producer never stops). Fragments
 * wholly past the tile's rows are skipped (an expert with 32 assignments does half the MMAs).
 *
 * Bits: every output element is the same k = 0, 16, 32, … sequence of 16×16×16 MMAs as in
 * cuda_moe_gemm.cu, rounded the same way: the results are bit for bit those of the tiled kernel
 * (test_cuda_ops moe_gemm_variants_vs_default). Padding rows (past the expert's assignments or
 * past N) are not copied: their stale shared memory only reaches accumulator rows or columns
 * that are never stored. */
#include <mma.h>

#include "cuda_launch.cuh"
#include "cuda_moe_gemm.h"

using namespace nvcuda;

namespace {

constexpr int BM = 64, BN = 128, BK = 64;
constexpr int LDS = BK + 8;     /* smem row pitch, bf16: 144 bytes, ldmatrix without conflicts */
constexpr int CW = 4;           /* consumer warps */
constexpr int NT = (CW + 1) * 32; /* + the producer warp (the last) */
constexpr int ST = 6;           /* stages: 6 × 27 KB + the epilogue tiles ≈ 200 KB, one block an SM */
constexpr int WC = BN / CW;     /* weight rows (fragment columns) a consumer warp: 32 */
constexpr int LDC = WC + 4;     /* epilogue tile pitch, floats */

struct Smem {
    bf16 a[ST][BM][LDS];        /* [stage][assignment row][k] */
    bf16 b[ST][BN][LDS];        /* [stage][weight row][k] */
    float c[CW][BM][LDC];       /* per consumer warp: its 64 × 32 accumulators */
    unsigned long long full[ST], empty[ST];
    int ptok[BM];               /* the producer's: source row (x or act) of each tile row, or -1 */
    int tstart[1];              /* [n_act + 1] first M tile of each active expert (sized at launch) */
};

__device__ __forceinline__ uint32_t smem_u32(const void *p) { return (uint32_t)__cvta_generic_to_shared(p); }

__device__ __forceinline__ void mbar_init(unsigned long long *m, int count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_u32(m)), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_expect_tx(unsigned long long *m, uint32_t bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_u32(m)), "r"(bytes)
                 : "memory");
}
__device__ __forceinline__ void mbar_arrive(unsigned long long *m) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(smem_u32(m)) : "memory");
}
/* until the phase of parity `parity` has completed */
__device__ __forceinline__ void mbar_wait(unsigned long long *m, uint32_t parity) {
    uint32_t done;
    do {
        asm volatile("{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2; selp.u32 %0, 1, 0, p; }"
                     : "=r"(done)
                     : "r"(smem_u32(m)), "r"(parity)
                     : "memory");
    } while (!done);
}
/* global → shared bulk copy of `bytes` (16-byte aligned, a multiple of 16) completing on m */
__device__ __forceinline__ void bulk_g2s(void *dst, const void *src, uint32_t bytes, unsigned long long *m) {
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
                     smem_u32(dst)),
                 "l"(src), "r"(bytes), "r"(smem_u32(m))
                 : "memory");
}

/* Tile t → active expert index, first assignment row, rows (≤ BM), first weight row n0 (of the
 * N outputs; gate_up: gate row n0, up row N + n0). tstart in shared memory, n_act + 1 entries. */
struct Tile {
    int ei, m0, rows, n0;
};
__device__ __forceinline__ Tile tile_of(int t, int ncol, int n_act, const int *tstart, const int *off,
                                        bool gate_up) {
    const int mt = t / ncol, col = t % ncol;
    int lo = 0, hi = n_act - 1; /* the last i with tstart[i] ≤ mt */
    while (lo < hi) {
        const int mid = (lo + hi + 1) >> 1;
        if (tstart[mid] <= mt) lo = mid;
        else hi = mid - 1;
    }
    Tile r;
    r.ei = lo;
    r.m0 = (mt - tstart[lo]) * BM;
    r.rows = min(BM, off[lo + 1] - off[lo] - r.m0);
    r.n0 = col * (gate_up ? BN / 2 : BN);
    return r;
}

/* BULK: the producer's copies are bulk copies, one a row piece, counted in bytes on the stage's
 * mbarrier; else (DS_CUDA_MOE_GEMM_WS=2) 16-byte cp.async, 48 a lane a stage, each lane's
 * completing as one of the mbarrier's 32 arrivals — the Ampere-style producer, in case the copy
 * engine's per-copy cost is what limits 128-byte pieces. */
template <bool GATE_UP, bool Y16, bool BULK>
__global__ void __launch_bounds__(NT, 1)
    moe_gemm_ws_kernel(const bf16 *__restrict__ W, int N, int K, const bf16 *__restrict__ x, int k_top,
                       ds_moe_groups g, void *__restrict__ out) {
    extern __shared__ __align__(128) unsigned char ws_dyn[];
    Smem &sm = *(Smem *)ws_dyn;
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    pdl_enter(); /* cuda_launch.cuh: before any access */
    const int n_act = *g.n_act;
    /* the M tiles' prefix: lane l sums the tile counts of experts [l·per, (l+1)·per), one warp
     * scan, each lane writes its experts' starts */
    if (warp == 0) {
        const int per = DS_DIV_UP(n_act, 32);
        const int i0 = min(lane * per, n_act), i1 = min(i0 + per, n_act);
        int tot = 0;
        for (int i = i0; i < i1; i++) tot += DS_DIV_UP(g.off[i + 1] - g.off[i], BM);
        int incl = tot;
#pragma unroll
        for (int o = 1; o < 32; o <<= 1) {
            const int y = __shfl_up_sync(0xffffffffu, incl, o);
            if (lane >= o) incl += y;
        }
        int s = incl - tot;
        for (int i = i0; i < i1; i++) {
            sm.tstart[i] = s;
            s += DS_DIV_UP(g.off[i + 1] - g.off[i], BM);
        }
        if (lane == 31) sm.tstart[n_act] = incl;
    }
    if (tid == 0) {
        for (int s = 0; s < ST; s++) {
            mbar_init(&sm.full[s], BULK ? 1 : 32); /* expect_tx (+ the bytes), or the lanes' copies */
            mbar_init(&sm.empty[s], CW); /* one arrival per consumer warp */
        }
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    __syncthreads();
    const int ncol = DS_DIV_UP(N, GATE_UP ? BN / 2 : BN);
    const int total = sm.tstart[n_act] * ncol;
    const int KT = K / BK; /* the launch holds K % BK == 0 */

    if (warp == CW) { /* ---- producer ---- */
        int q = 0;    /* stages issued so far, over all tiles */
        for (int t = blockIdx.x; t < total; t += gridDim.x) {
            const Tile tl = tile_of(t, ncol, n_act, sm.tstart, g.off, GATE_UP);
            const int e = g.act[tl.ei], a0 = g.off[tl.ei] + tl.m0;
            const int64_t w_rows = GATE_UP ? 2 * (int64_t)N : (int64_t)N;
            const bf16 *We = W + (int64_t)e * w_rows * K;
            if (!BULK) __syncwarp(); /* every lane is done reading the last tile's ptok */
            /* this lane's rows: A rows lane, lane + 32; weight rows lane + 32·j of the tile */
            const bf16 *asrc[2];
#pragma unroll
            for (int j = 0; j < 2; j++) {
                const int r = lane + 32 * j;
                const int a = r < tl.rows ? g.sorted[a0 + r] : -1;
                const int src = a < 0 ? -1 : GATE_UP ? a / k_top : a;
                asrc[j] = src < 0 ? nullptr : x + (int64_t)src * K;
                if (!BULK) sm.ptok[r] = src;
            }
            /* weight row of tile row r (gate_up: 0..63 gate rows, 64..127 the up rows), or null */
            auto wrow = [&](int r) -> const bf16 * {
                const int n = GATE_UP ? tl.n0 + (r & 63) : tl.n0 + r;
                const int64_t wr = GATE_UP && r >= 64 ? (int64_t)N + n : (int64_t)n;
                return n < N ? We + wr * K : nullptr;
            };
            if constexpr (BULK) {
                const bf16 *bsrc[4];
                int nvalid = 0;
#pragma unroll
                for (int j = 0; j < 4; j++) {
                    bsrc[j] = wrow(lane + 32 * j);
                    nvalid += __popc(__ballot_sync(0xffffffffu, bsrc[j] != nullptr));
                }
                nvalid += min(tl.rows, BM);
                const uint32_t bytes = (uint32_t)nvalid * BK * 2;
                for (int kt = 0; kt < KT; kt++, q++) {
                    const int s = q % ST;
                    if (q >= ST) mbar_wait(&sm.empty[s], ((q / ST) - 1) & 1);
                    if (lane == 0) mbar_expect_tx(&sm.full[s], bytes);
                    __syncwarp();
                    const int k0 = kt * BK;
#pragma unroll
                    for (int j = 0; j < 2; j++)
                        if (asrc[j]) bulk_g2s(&sm.a[s][lane + 32 * j][0], asrc[j] + k0, BK * 2, &sm.full[s]);
#pragma unroll
                    for (int j = 0; j < 4; j++)
                        if (bsrc[j]) bulk_g2s(&sm.b[s][lane + 32 * j][0], bsrc[j] + k0, BK * 2, &sm.full[s]);
                }
            } else {
                __syncwarp(); /* ptok written */
                const int cc = (lane & 7) * 8, r0 = lane >> 3; /* 16-byte chunk of a row piece; rows r0 + 4j */
                for (int kt = 0; kt < KT; kt++, q++) {
                    const int s = q % ST;
                    if (q >= ST) mbar_wait(&sm.empty[s], ((q / ST) - 1) & 1);
                    const int k0 = kt * BK + cc;
#pragma unroll 4
                    for (int j = 0; j < BM / 4; j++) {
                        const int r = r0 + 4 * j, src = sm.ptok[r];
                        if (src >= 0) cp_async16(&sm.a[s][r][cc], x + (int64_t)src * K + k0);
                    }
#pragma unroll 4
                    for (int j = 0; j < BN / 4; j++) {
                        const int r = r0 + 4 * j;
                        const bf16 *w = wrow(r);
                        if (w) cp_async16(&sm.b[s][r][cc], w + k0);
                    }
                    /* arrives on full[s] once this lane's copies so far have landed */
                    asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];" ::"r"(smem_u32(&sm.full[s]))
                                 : "memory");
                }
            }
        }
        return;
    }

    /* ---- consumers: warp w, weight rows (B fragment columns) brow(j), j = 0, 1 ---- */
    const int w = warp;
    /* gate_up: fragment 0 = gate rows 16w …, fragment 1 = the up rows 64 + 16w …;
     * down: rows 32w … and 32w + 16 … */
    const int brow0 = GATE_UP ? 16 * w : WC * w, brow1 = GATE_UP ? 64 + 16 * w : WC * w + 16;
    float(*cw)[LDC] = sm.c[w];
    int q = 0;
    for (int t = blockIdx.x; t < total; t += gridDim.x) {
        const Tile tl = tile_of(t, ncol, n_act, sm.tstart, g.off, GATE_UP);
        const int ni = DS_DIV_UP(tl.rows, 16); /* 16-row fragments holding assignments */
        wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc[4][2];
#pragma unroll
        for (int i = 0; i < 4; i++)
#pragma unroll
            for (int j = 0; j < 2; j++) wmma::fill_fragment(acc[i][j], 0.f);
        for (int kt = 0; kt < KT; kt++, q++) {
            const int s = q % ST;
            mbar_wait(&sm.full[s], (q / ST) & 1);
#pragma unroll
            for (int kk = 0; kk < BK; kk += 16) {
                wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::col_major> fb[2];
                wmma::load_matrix_sync(fb[0], &sm.b[s][brow0][kk], LDS); /* B(k, n) = W[n, k] */
                wmma::load_matrix_sync(fb[1], &sm.b[s][brow1][kk], LDS);
#pragma unroll
                for (int i = 0; i < 4; i++) {
                    if (i < ni) { /* warp-uniform */
                        wmma::fragment<wmma::matrix_a, 16, 16, 16, bf16, wmma::row_major> fa;
                        wmma::load_matrix_sync(fa, &sm.a[s][i * 16][kk], LDS);
                        wmma::mma_sync(acc[i][0], fa, fb[0], acc[i][0]);
                        wmma::mma_sync(acc[i][1], fa, fb[1], acc[i][1]);
                    }
                }
            }
            __syncwarp();
            if (lane == 0) mbar_arrive(&sm.empty[s]); /* this warp is done with stage s */
        }
        /* epilogue through this warp's own tile: cw[row][0..15] fragment 0, [16..31] fragment 1 */
#pragma unroll
        for (int i = 0; i < 4; i++)
            if (i < ni)
#pragma unroll
                for (int j = 0; j < 2; j++)
                    wmma::store_matrix_sync(&cw[i * 16][j * 16], acc[i][j], LDC, wmma::mem_row_major);
        __syncwarp();
        const int a0 = g.off[tl.ei] + tl.m0;
        /* assignment index of rows lane and lane + 32 */
        const int asg0 = lane < tl.rows ? g.sorted[a0 + lane] : 0;
        const int asg1 = lane + 32 < tl.rows ? g.sorted[a0 + 32 + lane] : 0;
        if (GATE_UP) {
            bf16 *act = (bf16 *)out; /* [A, N]: this warp's 16 columns n0 + 16w …, 2 a lane, 4 rows a pass */
            const int c = (lane & 7) * 2, n = tl.n0 + 16 * w + c;
            for (int r0 = 0; r0 < tl.rows; r0 += 4) {
                const int r = r0 + (lane >> 3);
                const int v0 = __shfl_sync(0xffffffffu, asg0, r & 31), v1 = __shfl_sync(0xffffffffu, asg1, r & 31);
                if (r >= tl.rows || n >= N) continue; /* N % 8 == 0: n < N → n + 1 < N */
                float o[2];
#pragma unroll
                for (int h = 0; h < 2; h++) {
                    const float gv = __bfloat162float(__float2bfloat16_rn(cw[r][c + h]));
                    const float uv = __bfloat162float(__float2bfloat16_rn(cw[r][16 + c + h]));
                    o[h] = silu_f(gv) * uv;
                }
                *(__nv_bfloat162 *)&act[(int64_t)(r < 32 ? v0 : v1) * N + n] = __floats2bfloat162_rn(o[0], o[1]);
            }
        } else {
            /* y [A, N]: this warp's 32 columns n0 + 32w …, 4 a lane, 4 rows a pass */
            const int c = (lane & 7) * 4, n = tl.n0 + WC * w + c;
            for (int r0 = 0; r0 < tl.rows; r0 += 4) {
                const int r = r0 + (lane >> 3);
                const int v0 = __shfl_sync(0xffffffffu, asg0, r & 31), v1 = __shfl_sync(0xffffffffu, asg1, r & 31);
                if (r >= tl.rows || n >= N) continue; /* N % 8 == 0: n < N → all 4 valid */
                const int64_t at = (int64_t)(r < 32 ? v0 : v1) * N + n;
                if constexpr (Y16) {
                    uint2 v;
                    v.x = pack_bf2(cw[r][c], cw[r][c + 1]);
                    v.y = pack_bf2(cw[r][c + 2], cw[r][c + 3]);
                    *(uint2 *)&((bf16 *)out)[at] = v;
                } else {
                    *(float4 *)&((float *)out)[at] = make_float4(cw[r][c], cw[r][c + 1], cw[r][c + 2], cw[r][c + 3]);
                }
            }
        }
        __syncwarp(); /* the next tile's fragments overwrite cw */
    }
}

size_t smem_bytes(int E) { return offsetof(Smem, tstart) + sizeof(int) * (size_t)(E + 1); }

template <bool GATE_UP, bool Y16, bool BULK> void launch(ds_cuda_ctx *ctx, const ds_moe_gemm_args *a) {
    const int N = GATE_UP ? a->I : a->H, K = GATE_UP ? a->H : a->I;
    const int ncol = DS_DIV_UP(N, GATE_UP ? BN / 2 : BN);
    const int bound = (DS_DIV_UP(a->A, BM) + (a->A < a->E ? a->A : a->E)) * ncol; /* tiles at most */
    const int grid = bound < ctx->sm_count ? bound : ctx->sm_count;
    ds_launch(ctx, moe_gemm_ws_kernel<GATE_UP, Y16, BULK>, dim3(grid), dim3(NT), smem_bytes(a->E),
              (const bf16 *)(GATE_UP ? a->w_gu : a->w_down), N, K, (const bf16 *)(GATE_UP ? a->x : a->act),
              a->top_k, a->groups, GATE_UP ? (void *)a->act : a->y);
    DS_CU_LAUNCHED2(ctx, GATE_UP ? "moe_gemm_ws_kernel<gate_up>" : "moe_gemm_ws_kernel<down>", a->A, N);
}

template <bool BULK> void init(ds_cuda_ctx *ctx) {
    const int bytes = (int)ctx->smem_optin;
    DS_CU(ctx, cudaFuncSetAttribute(moe_gemm_ws_kernel<true, false, BULK>,
                                    cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
    DS_CU(ctx, cudaFuncSetAttribute(moe_gemm_ws_kernel<false, false, BULK>,
                                    cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
    DS_CU(ctx, cudaFuncSetAttribute(moe_gemm_ws_kernel<false, true, BULK>,
                                    cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
}
template <bool BULK> void both_passes(ds_cuda_ctx *ctx, const ds_moe_gemm_args *a) {
    launch<true, false, BULK>(ctx, a);
    if (a->y_bf16) launch<false, true, BULK>(ctx, a);
    else launch<false, false, BULK>(ctx, a);
}

} // namespace

extern "C" bool ds_cuda_moe_gemm_ws_fits(const ds_cuda_ctx *ctx, int H, int I, int E) {
    return H % BK == 0 && I % BK == 0 && H % 8 == 0 && I % 8 == 0 && smem_bytes(E) <= ctx->smem_optin;
}

/* The dynamic shared memory limit: all the device allows (the launch takes smem_bytes(E)). */
extern "C" void ds_cuda_moe_gemm_ws_init(ds_cuda_ctx *ctx) {
    init<true>(ctx);
    init<false>(ctx);
}

extern "C" void ds_cuda_moe_gemm_ws(ds_cuda_ctx *ctx, const ds_moe_gemm_args *a) {
    if (ctx->moe_gemm_ws == 2) both_passes<false>(ctx, a);
    else both_passes<true>(ctx, a);
}
