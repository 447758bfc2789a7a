/* cuda_moe_gemm_tma.cu — the grouped expert GEMM of prefill-sized MoE steps (the same two
 * passes and results as cuda_moe_gemm.cu's tiled kernel, bit for bit) with its weights fed by
 * the tensor memory accelerator into a ring of stages that never drains, both passes in one
 * launch (DS_CUDA_MOE_GEMM_TMA, DS_CUDA_MOE_GEMM_FUSE; both on by default since session 25).
 *
 * Why: the tiled kernel reads its weights at ~3.1 TB/s (gate_up) and ~2.8 TB/s (down) on an
 * H200 (s25-run1 profile: 13.7 + 7.6 ms of a 1024-token prefill's ~39 ms of device time) where a
 * streaming read reaches 4.4. Its access pattern is not the limit (probe_weight_stream.cu: the
 * same 128 rows × 128 B a stage without the math, 4.40 TB/s at 3 stages); its idle time is —
 * every warp both loads and multiplies, one stage loads while the other is multiplied, and
 * nothing loads during a block's tile lookup or epilogue. The probe's ring (one producer warp
 * issuing one TMA box a stage into a 6-stage ring, four consumer warps doing this kernel's
 * ldmatrix + mma work on it, two blocks an SM) streamed at 4.27 TB/s (s25-run1).
 * Session 24's persistent version lost 4× because its producer issued one bulk copy per
 * 128-byte row piece (the probe: 0.57 TB/s); here a stage is two TMA boxes.
 * Measured (H100s): prefill of 1024 tokens 40.54 / 40.78 vs 42.93 / 42.90 ms with a launch a
 * pass (s25-run2); one launch 40.03 / 39.80 vs 40.82 / 40.66 (s25-run3); the defaults 39.74 /
 * 39.94 vs 43.05 / 42.95 with the tiled kernel, 8192 tokens 264.8 vs 288.9 ms (s25-run4).
 *
 * Block: one producer warp and four consumer warps, persistent (two blocks an SM), taking work
 * items by ticket (tg_params below) — (pass, M tile, column tile), column tiles of one M tile
 * adjacent so that the M tiles of one expert run at about the same time and share its weight
 * tiles in L2.
 *   producer: per item, the M tile's expert and rows (cuda_moe_tiles.cuh), the tile's
 *     assignment indices into a slot (TG_SLOTS of them, see below); per stage (64 of K), waits
 *     for the stage to be empty, then two TMA boxes of 64 weight rows × 64 k (gate_up: the 64
 *     gate rows and their 64 up rows; down: 128 consecutive rows) and, by its 32 lanes'
 *     cp.async, the 64 activation rows' 128 bytes (gathered by assignment: x[token] for
 *     gate_up, act[assignment] for down; rows past the tile's assignments are not read), all
 *     arriving on the stage's "full" barrier;
 *   consumers: warp w multiplies all 64 rows of the stage by its 32 weight rows (gate_up:
 *     gate rows 16w … 16w + 15 and the matching up rows, so that the epilogue has both in one
 *     thread's registers; down: rows 32w … 32w + 31), 16-row fragments past the assignments
 *     skipped, releases the stage ("empty") and, after the item's last stage, writes its
 *     results from registers while the producer already fills the ring with the next item.
 * Stages hold 128-byte rows in the TMA's 128-byte swizzle (cuda_tma.cuh swz128), the
 * activation rows written in the same pattern, so ldmatrix reads them without bank conflicts.
 * The mma sequence per output element (k = 0, 16, 32, … in m16n8k16 steps, fp32 accumulators)
 * is the tiled kernel's WMMA sequence, so the results are the same bits (test_cuda_ops). */
#include "cuda_launch.cuh"
#include "cuda_mma.cuh"
#include "cuda_moe_gemm.h"
#include "cuda_moe_tiles.cuh"
#include "cuda_tma.cuh"

#define TG_BM 64       /* assignment rows a tile */
#define TG_BN 128      /* weight rows a tile: gate_up 64 gate + 64 up, down 128 */
#define TG_BK 64       /* K a stage: one 128-byte swizzle row */
#define TG_ST 4        /* stages in the ring */
#define TG_CW 4        /* consumer warps */
#define TG_BOX_ROWS 64 /* rows of one TMA box (two a stage) */
#define TG_THREADS ((TG_CW + 1) * 32)
/* Slots of per-item data (first row's assignment indices, columns, row count). The producer
 * writes item j's slot after waiting for the first stage of item j to be empty, i.e. after the
 * consumers released the stage TG_ST before it, which lies in item j − TG_ST or later (an item
 * has at least one stage): so the consumers have finished item j − TG_ST − 1's epilogue, and
 * TG_ST + 1 slots are never overwritten while read. */
#define TG_SLOTS (TG_ST + 1)

constexpr int TG_B_BYTES = TG_BN * TG_BK * 2; /* 16 KB of weights a stage */
constexpr int TG_A_BYTES = TG_BM * TG_BK * 2; /* 8 KB of activations a stage */
constexpr int TG_STAGE_BYTES = TG_B_BYTES + TG_A_BYTES;
static_assert(TG_STAGE_BYTES % 1024 == 0 && (TG_B_BYTES / 2) % 1024 == 0, "128-byte swizzle alignment");

struct tg_slot {
    int down, n0, rows, mt; /* pass (0 gate_up, 1 down), first column, tile rows, M tile */
    int end, pad_[3];
    int asg[TG_BM]; /* assignment index of each tile row, -1 past the tile's rows */
};
struct tg_tail {
    tg_slot slot[TG_SLOTS];
    uint64_t full[TG_ST], empty[TG_ST];
};
/* the ring (1024-byte aligned by hand: the dynamic shared memory base is only 16-aligned) */
constexpr size_t TG_SMEM = 1024 + (size_t)TG_ST * TG_STAGE_BYTES + sizeof(tg_tail);
/* a full barrier's arrivals a phase: the producer lanes' cp.async arrivals and lane 0's
 * expect_tx */
#define TG_FULL_ARRIVALS 33

/* Both passes' arguments. Work items, numbered t: gate_up items t < MT·NGU (M tile t / NGU,
 * column tile t % NGU, NGU = I / 64), then down items (MT·NDN of them, NDN = H / 128); MT, the
 * number of M tiles, is counted on the device. A launch serves `passes` (1 gate_up, 2 down, 3
 * both) and hands its items out by ticket (sync[0], or sync[1] for a down-only launch), so a
 * taken item always belongs to a running block. With both passes in one launch, a down item
 * waits until the 4 consumer warps of each of its M tile's NGU gate_up items have counted
 * themselves done in sync[2 + mt]: all gate_up tickets come before the first down ticket and
 * each taken gate_up item is finished without waiting on anything, so the wait always ends. */
struct tg_params {
    int H, I, k_top, passes;
    int evict_first; /* the weight boxes with an L2 evict-first policy (DS_CUDA_MOE_GEMM_EVICT) */
    const bf16 *x;  /* [T, H] */
    bf16 *act;      /* [A, I]: gate_up's output, down's input */
    void *y;        /* [A, H] fp32, or bf16 (Y16) */
    ds_moe_groups g;
    int32_t *sync;  /* [DS_MOE_GEMM_SYNC_INTS(A, E)], zero before the first launch */
};

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
/* a load that later loads (the act rows' cp.async) cannot pass, seeing what was released before
 * the value it reads (the gate_up warps' fence + count) */
static __device__ __forceinline__ int ld_acquire_gpu(const int32_t *p) {
    int v;
    asm volatile("ld.acquire.gpu.global.b32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}

/* The producer warp. */
static __device__ __forceinline__ void tg_produce(const CUtensorMap *wgu, const CUtensorMap *wdn, const tg_params &p,
                                                  unsigned char *ring, tg_tail &tl) {
    const int lane = threadIdx.x & 31;
    const int MT = moe_tile_count<TG_BM>(p.g);
    const int NGU = p.I / (TG_BN / 2), NDN = p.H / TG_BN;
    const int first = p.passes == 2 ? MT * NGU : 0, last = p.passes == 1 ? MT * NGU : MT * (NGU + NDN);
    int32_t *ticket = &p.sync[p.passes == 2 ? 1 : 0];
    const uint64_t policy = l2_policy_evict_first();
    int q = 0, last_mt = -1, ei = -1, m0 = 0;
    for (int j = 0;; j++) {
        int t = 0;
        if (lane == 0) t = first + atomicAdd(ticket, 1);
        t = __shfl_sync(0xffffffffu, t, 0);
        const bool down = t >= MT * NGU;
        const int u = down ? t - MT * NGU : t, NT = down ? NDN : NGU;
        const int mt = u / NT, nt = u % NT;
        if (t < last && mt != last_mt) moe_tile_lookup<TG_BM>(mt, p.g, &ei, &m0), last_mt = mt;
        tg_slot &sl = tl.slot[j % TG_SLOTS];
        int b = q % TG_ST;
        if (q >= TG_ST) mbar_wait(&tl.empty[b], ((q / TG_ST) - 1) & 1);
        if (t >= last || ei < 0) { /* past the last item: the consumers stop at this stage */
            if (lane == 0) sl.end = 1;
            __syncwarp();
            mbar_arrive(&tl.full[b]);
            if (lane == 0) mbar_arrive(&tl.full[b]);
            return;
        }
        const int e = p.g.act[ei];
        const int a0 = p.g.off[ei] + m0;
        const int rows = min(TG_BM, p.g.off[ei + 1] - a0);
        const int n0 = nt * (down ? TG_BN : TG_BN / 2);
        const int alo = lane < rows ? p.g.sorted[a0 + lane] : -1;
        const int ahi = lane + 32 < rows ? p.g.sorted[a0 + lane + 32] : -1;
        sl.asg[lane] = alo;
        sl.asg[lane + 32] = ahi;
        if (lane == 0) sl.down = down, sl.n0 = n0, sl.rows = rows, sl.mt = mt, sl.end = 0;
        __syncwarp(); /* the slot before the first stage's arrivals */
        const int K = down ? p.I : p.H;
        /* this lane's activation copies: chunk lane % 8 of rows lane / 8 + 4i; gate_up reads
         * x[token] (assignment a = token · k_top + slot), down act[a] */
        const bf16 *asrc[TG_BM / 4];
#pragma unroll
        for (int i = 0; i < TG_BM / 4; i++) {
            const int r = (lane >> 3) + 4 * i;
            const int a = __shfl_sync(0xffffffffu, i < 8 ? alo : ahi, r & 31);
            asrc[i] = a < 0 ? nullptr : (down ? p.act + (int64_t)a * K : p.x + (int64_t)(a / p.k_top) * K) + (lane & 7) * 8;
        }
        if (down && p.passes == 3) { /* act rows of this M tile: all its gate_up items done */
            if (lane == 0)
                while (ld_acquire_gpu(&p.sync[2 + mt]) < NGU * TG_CW) __nanosleep(100);
            __syncwarp();
        }
        /* weight rows of the two boxes: gate rows n0 … and up rows I + n0 … of expert e's [2I, H];
         * or rows n0 … and n0 + 64 … of its [H, I] */
        const CUtensorMap *wmap = down ? wdn : wgu;
        const int wrow = e * (down ? p.H : 2 * p.I) + n0;
        const int wrow2 = wrow + (down ? TG_BOX_ROWS : p.I);
        const int S = K / TG_BK;
        for (int s = 0; s < S; s++, q++) {
            b = q % TG_ST;
            if (s > 0 && q >= TG_ST) mbar_wait(&tl.empty[b], ((q / TG_ST) - 1) & 1);
            unsigned char *st = ring + b * TG_STAGE_BYTES;
            if (lane == 0) {
                mbar_arrive_expect_tx(&tl.full[b], TG_B_BYTES);
                if (p.evict_first) {
                    tma_load_2d_hint(st, wmap, s * TG_BK, wrow, &tl.full[b], policy);
                    tma_load_2d_hint(st + TG_B_BYTES / 2, wmap, s * TG_BK, wrow2, &tl.full[b], policy);
                } else {
                    tma_load_2d(st, wmap, s * TG_BK, wrow, &tl.full[b]);
                    tma_load_2d(st + TG_B_BYTES / 2, wmap, s * TG_BK, wrow2, &tl.full[b]);
                }
            }
            unsigned char *as = st + TG_B_BYTES;
#pragma unroll
            for (int i = 0; i < TG_BM / 4; i++)
                if (asrc[i]) cp_async16(as + swz128((lane >> 3) + 4 * i, lane & 7), asrc[i] + s * TG_BK);
            mbar_arrive_cp_async(&tl.full[b]);
        }
    }
}

/* A consumer warp (w = 0 … TG_CW − 1). Y16: y in bf16, each fp32 sum rounded once. */
template <bool Y16>
static __device__ __forceinline__ void tg_consume(const tg_params &p, unsigned char *ring, tg_tail &tl) {
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    /* ldmatrix row addresses: B, rows nb + (lane / 16) · 8 + lane % 8 at chunk (lane / 8) % 2 of
     * each k16 (matrices: n8 tile 0's k 0-7, k 8-15, n8 tile 1's); A, rows lane % 16 at chunk
     * lane / 16 (rows 0-7, 8-15 at k 0-7, then at k 8-15) */
    const int b_r = ((lane >> 4) & 1) * 8 + (lane & 7), b_c = (lane >> 3) & 1;
    const int a_r = lane & 15, a_c = lane >> 4;
    int q = 0;
    for (int j = 0;; j++) {
        int b = q % TG_ST;
        mbar_wait(&tl.full[b], (q / TG_ST) & 1);
        const tg_slot &sl = tl.slot[j % TG_SLOTS];
        if (sl.end) return;
        const bool down = sl.down;
        const int rows = sl.rows, n0 = sl.n0;
        const int mtc = min(TG_BM / 16, DS_DIV_UP(rows, 16)); /* 16-row fragments holding assignments */
        /* the warp's two 16-row groups of the stage's weight rows: gate rows 16w … and the
         * matching up rows (so that the epilogue has both in one thread); down rows 32w … */
        const int nb0 = down ? 32 * w : 16 * w, nb1 = down ? 32 * w + 16 : TG_BN / 2 + 16 * w;
        const int S = (down ? p.I : p.H) / TG_BK;
        float acc[TG_BM / 16][4][4]; /* [m fragment][n8 tile: group 0's two, group 1's two][c0-c3] */
#pragma unroll
        for (int i = 0; i < TG_BM / 16; i++)
#pragma unroll
            for (int n = 0; n < 4; n++)
#pragma unroll
                for (int c = 0; c < 4; c++) acc[i][n][c] = 0.f;
        for (int s = 0; s < S; s++, q++) {
            b = q % TG_ST;
            if (s > 0) mbar_wait(&tl.full[b], (q / TG_ST) & 1);
            const uint32_t B = smem_u32(ring + b * TG_STAGE_BYTES), A = B + TG_B_BYTES;
#pragma unroll
            for (int kk = 0; kk < TG_BK / 16; kk++) {
                uint32_t f0[4], f1[4];
                ldmatrix_x4(f0, B + swz128(nb0 + b_r, kk * 2 + b_c));
                ldmatrix_x4(f1, B + swz128(nb1 + b_r, kk * 2 + b_c));
#pragma unroll
                for (int mt = 0; mt < TG_BM / 16; mt++) {
                    if (mt >= mtc) break; /* warp-uniform */
                    uint32_t fa[4];
                    ldmatrix_x4(fa, A + swz128(mt * 16 + a_r, kk * 2 + a_c));
                    mma_bf16_16816(acc[mt][0], fa[0], fa[1], fa[2], fa[3], f0[0], f0[1]);
                    mma_bf16_16816(acc[mt][1], fa[0], fa[1], fa[2], fa[3], f0[2], f0[3]);
                    mma_bf16_16816(acc[mt][2], fa[0], fa[1], fa[2], fa[3], f1[0], f1[1]);
                    mma_bf16_16816(acc[mt][3], fa[0], fa[1], fa[2], fa[3], f1[2], f1[3]);
                }
            }
            __syncwarp();
            if (lane == 0) mbar_arrive(&tl.empty[b]);
        }
        /* epilogue from registers: c0, c1 at row lane / 4, columns 2 (lane % 4) + 0, 1 of each
         * n8 tile; c2, c3 at row lane / 4 + 8 */
        const int gr = lane >> 2, tc = 2 * (lane & 3);
#pragma unroll
        for (int mt = 0; mt < TG_BM / 16; mt++) {
            if (mt >= mtc) break;
#pragma unroll
            for (int h = 0; h < 2; h++) {
                const int r = mt * 16 + h * 8 + gr;
                if (r >= rows) continue;
                const int64_t a = sl.asg[r];
                if (!down) { /* act [A, I]: SiLU(g)·u of g and u rounded to bf16, as the tiled kernel */
#pragma unroll
                    for (int n = 0; n < 2; n++) {
                        float v[2];
#pragma unroll
                        for (int c = 0; c < 2; c++) {
                            const float gv = __bfloat162float(__float2bfloat16_rn(acc[mt][n][2 * h + c]));
                            const float uv = __bfloat162float(__float2bfloat16_rn(acc[mt][n + 2][2 * h + c]));
                            v[c] = silu_f(gv) * uv;
                        }
                        *(uint32_t *)&p.act[a * p.I + n0 + 16 * w + 8 * n + tc] = pack_bf2(v[0], v[1]);
                    }
                } else if constexpr (Y16) { /* y [A, H] bf16 */
                    bf16 *y = (bf16 *)p.y;
#pragma unroll
                    for (int n = 0; n < 4; n++)
                        *(uint32_t *)&y[a * p.H + n0 + 32 * w + 8 * n + tc] = pack_bf2(acc[mt][n][2 * h], acc[mt][n][2 * h + 1]);
                } else { /* y [A, H] fp32 */
                    float *y = (float *)p.y;
#pragma unroll
                    for (int n = 0; n < 4; n++)
                        *(float2 *)&y[a * p.H + n0 + 32 * w + 8 * n + tc] = make_float2(acc[mt][n][2 * h], acc[mt][n][2 * h + 1]);
                }
            }
        }
        if (!down && p.passes == 3) { /* this warp's share of the M tile's act rows is written */
            __threadfence(); /* each lane's stores, then the count (released again by lane 0) */
            __syncwarp();
            if (lane == 0) {
                __threadfence();
                atomicAdd(&p.sync[2 + sl.mt], 1);
            }
        }
    }
}
#endif

/* Both passes or one (p.passes): gate_up (act [A, I] bf16 from x [T, H]; wgu over W_gu as
 * [E·2I, H]) and down (y [A, H] fp32, or bf16 with Y16, from act; wdn over W_down as [E·H, I]). */
template <bool Y16>
__global__ void __launch_bounds__(TG_THREADS, 2)
    moe_gemm_tma_kernel(const __grid_constant__ CUtensorMap wgu, const __grid_constant__ CUtensorMap wdn,
                        const tg_params p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    extern __shared__ __align__(1024) unsigned char tg_dyn[];
    unsigned char *ring = (unsigned char *)(((uintptr_t)tg_dyn + 1023) & ~(uintptr_t)1023);
    tg_tail &tl = *(tg_tail *)(ring + TG_ST * TG_STAGE_BYTES);
    if (threadIdx.x == 0) {
        for (int i = 0; i < TG_ST; i++) {
            mbar_init(&tl.full[i], TG_FULL_ARRIVALS);
            mbar_init(&tl.empty[i], TG_CW);
        }
        mbar_init_fence();
    }
    __syncthreads();
    pdl_enter(); /* cuda_launch.cuh: before any access to global memory */
    if (threadIdx.x >= TG_CW * 32) tg_produce(&wgu, &wdn, p, ring, tl);
    else tg_consume<Y16>(p, ring, tl);
#endif
}

typedef CUresult (*tg_encode_fn)(CUtensorMap *, CUtensorMapDataType, cuuint32_t, void *, const cuuint64_t *,
                                 const cuuint64_t *, const cuuint32_t *, const cuuint32_t *, CUtensorMapInterleave,
                                 CUtensorMapSwizzle, CUtensorMapL2promotion, CUtensorMapFloatOOBfill);
/* cuTensorMapEncodeTiled, taken from the driver through the runtime (no libcuda link); NULL
 * where the driver has none */
static tg_encode_fn tg_encode;

extern "C" void ds_cuda_moe_gemm_tma_init(ds_cuda_ctx *ctx) {
    void *fn = NULL;
    cudaDriverEntryPointQueryResult q;
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &q) != cudaSuccess ||
        q != cudaDriverEntryPointSuccess)
        fn = NULL, (void)cudaGetLastError();
    tg_encode = (tg_encode_fn)fn;
    /* the code that runs on this device must be sm_90's: a build for older targets compiles
     * the kernel's body away (PTX of them JIT-compiled here would run an empty kernel) */
    cudaFuncAttributes fa;
    ctx->moe_gemm_tma_ok = tg_encode && ctx->smem_optin >= TG_SMEM &&
                           cudaFuncGetAttributes(&fa, moe_gemm_tma_kernel<false>) == cudaSuccess && fa.binaryVersion >= 90;
    (void)cudaGetLastError();
    if (!ctx->moe_gemm_tma_ok) return;
    DS_CU(ctx, cudaFuncSetAttribute(moe_gemm_tma_kernel<false>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    (int)TG_SMEM));
    DS_CU(ctx, cudaFuncSetAttribute(moe_gemm_tma_kernel<true>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    (int)TG_SMEM));
}

/* The [rows, K] bf16 matrix at w as a tensor map of 64 × 64 boxes, 128-byte swizzle. */
static bool tg_map(CUtensorMap *m, const void *w, uint64_t rows, uint64_t K) {
    const cuuint64_t dims[2] = {K, rows}, strides[1] = {K * 2};
    const cuuint32_t box[2] = {TG_BK, TG_BOX_ROWS}, estr[2] = {1, 1};
    return tg_encode(m, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, (void *)w, dims, strides, box, estr,
                     CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                     CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

extern "C" bool ds_cuda_moe_gemm_tma_fits(const ds_cuda_ctx *ctx, const ds_moe_gemm_args *a) {
    return ctx->moe_gemm_tma_ok && a->sync && a->I % (TG_BN / 2) == 0 && a->H % TG_BN == 0 &&
           a->I % TG_BK == 0 && a->H % TG_BK == 0 && ((uintptr_t)a->w_gu & 15) == 0 &&
           ((uintptr_t)a->w_down & 15) == 0;
}

extern "C" bool ds_cuda_moe_gemm_tma(ds_cuda_ctx *ctx, const ds_moe_gemm_args *a) {
    if (!ds_cuda_moe_gemm_tma_fits(ctx, a)) return false;
    CUtensorMap gu, down; /* both before any launch: a refusal leaves both passes to the tiled kernel */
    if (!tg_map(&gu, a->w_gu, (uint64_t)a->E * 2 * a->I, (uint64_t)a->H) ||
        !tg_map(&down, a->w_down, (uint64_t)a->E * a->H, (uint64_t)a->I))
        return false;
    /* the tickets and the per-M-tile counts start at zero (a memset node in a captured graph) */
    DS_CU(ctx, cudaMemsetAsync(a->sync, 0, sizeof(int32_t) * DS_MOE_GEMM_SYNC_INTS(a->A, a->E), ctx->stream));
    tg_params p = {a->H, a->I, a->top_k, 3, ctx->moe_gemm_evict, (const bf16 *)a->x, (bf16 *)a->act, a->y, a->groups, a->sync};
    /* work items: at most (⌈A / 64⌉ + min(E, A)) M tiles × the column tiles of the passes run */
    const int64_t mts = DS_DIV_UP(a->A, TG_BM) + (a->A < a->E ? a->A : a->E);
    const int ngu = a->I / (TG_BN / 2), ndn = a->H / TG_BN;
    auto kern = a->y_bf16 ? moe_gemm_tma_kernel<true> : moe_gemm_tma_kernel<false>;
    const int passes[2] = {ctx->moe_gemm_fuse ? 3 : 1, 2};
    for (int i = 0; i < (ctx->moe_gemm_fuse ? 1 : 2); i++) {
        p.passes = passes[i];
        const int64_t items = mts * (p.passes == 1 ? ngu : p.passes == 2 ? ndn : ngu + ndn);
        const int grid = (int)(items < 2 * ctx->sm_count ? items : 2 * ctx->sm_count);
        ds_launch(ctx, kern, dim3(grid), dim3(TG_THREADS), TG_SMEM, gu, down, p);
        DS_CU_LAUNCHED2(ctx,
                        p.passes == 3   ? "moe_gemm_tma_kernel<gate_up+down>"
                        : p.passes == 1 ? "moe_gemm_tma_kernel<gate_up>"
                                        : "moe_gemm_tma_kernel<down>",
                        a->A, p.passes == 2 ? a->H : a->I);
    }
    return true;
}
