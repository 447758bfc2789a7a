/* probe_weight_stream.cu — how fast can a block-tiled GEMM stream expert weights from HBM,
 * by access pattern alone (no math)?
 *
 * Why: the prefill expert GEMM (src/backend/cuda/cuda_moe_gemm.cu) reads its weights at
 * ~3.0 TB/s (gate_up) and ~2.65 TB/s (down) on an H200 (s23-run1 profile), where the expert
 * GEMV streams rows at ~4. Each of its blocks reads, per pipeline stage, 128 B of each of 128
 * weight rows that lie K·2 = 4 KB apart, and the next 128 B of each row a stage later. This
 * probe replays that pattern (cp.async into shared memory, ST stages, B blocks an SM) and
 * variants of it — longer pieces of fewer rows, one contiguous chunk a stage (a tiled
 * layout), with and without the activation tile's L2 reads — over one layer of gate_up-shaped
 * weights, so that a kernel change is chosen by what the memory system gives, not guessed.
 *
 * Ring producers (session 24, after a warp-specialised expert GEMM lost 4×): one persistent
 * block an SM (or two), a producer warp filling a ring of ST stages of 128 rows × 128 B, four
 * consumer warps that wait for each stage on its mbarrier and release it — the pipeline of
 * such a GEMM without its math — with the producer issuing one TMA box a stage (a 2-D tensor
 * map, 128-byte swizzle), one bulk copy a row piece (128 a stage), or 16-byte cp.async (32 a
 * lane a stage), or (session 28) one 1-D bulk copy of the whole 16 KB stage (the rows of a
 * tile are contiguous). Says which producer can keep HBM busy from a single warp.
 *
 *   nvcc -std=c++17 -O3 -arch=sm_90a -o probe tools/gpu/probe_weight_stream.cu && ./probe
 * Prints one line per pattern: name, GB/s (best of 5). */
#include <cstdio>
#include <cstdint>
#include <cuda.h> /* CUtensorMap (the driver entry point is taken through the runtime) */
#include <cuda_runtime.h>

#include "probe_check.cuh"

/* the engine's mbarrier / TMA and mma primitives (header-only, no other engine headers) */
#include "../../src/backend/cuda/cuda_mma.cuh"
#include "../../src/backend/cuda/cuda_tma.cuh"


static __device__ __forceinline__ void cp16(void *s, const void *g) {
    unsigned sa = (unsigned)__cvta_generic_to_shared(s);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(sa), "l"(g));
}
static __device__ __forceinline__ void commit() { asm volatile("cp.async.commit_group;"); }
template <int N> static __device__ __forceinline__ void wait_g() {
    asm volatile("cp.async.wait_group %0;" ::"n"(N));
}

constexpr int NT = 128;       /* threads a block */
constexpr int E = 256;        /* experts */
constexpr int R = 1024;       /* weight rows an expert (gate_up of 35B-A3B: 2·512) */
constexpr int KB = 2048 * 2;  /* row bytes (K = 2048 bf16) */
constexpr int A_ROWS = 64;    /* activation rows a tile (cuda_moe_gemm.cu's GG_BM) */

/* One block: expert e = blockIdx.x / (R / ROWS), rows tile · ROWS …; per stage, PIECE bytes of
 * each of its ROWS rows (row-major weights), or one contiguous ROWS·PIECE chunk (TILED: the
 * same bytes stored tile by tile, stage by stage). WITH_A: also 64 rows × PIECE of a 4 MB
 * activation buffer (L2-resident) a stage, rows gathered as the GEMM's token rows are. */
template <int ROWS, int PIECE, int ST, bool TILED, bool WITH_A>
__global__ void __launch_bounds__(NT) pattern(const uint8_t *__restrict__ W, const uint8_t *__restrict__ X,
                                              unsigned *sink) {
    extern __shared__ __align__(16) uint8_t sm[];
    constexpr int STAGE_B = ROWS * PIECE, STAGE_A = WITH_A ? A_ROWS * PIECE : 0;
    constexpr int CH = STAGE_B / 16 / NT, CHA = STAGE_A / 16 / NT, CPR = PIECE / 16;
    static_assert(STAGE_B % (16 * NT) == 0 && (!WITH_A || STAGE_A % (16 * NT) == 0), "map");
    constexpr int TILES = R / ROWS, S = KB / PIECE;
    const int e = blockIdx.x / TILES, tile = blockIdx.x % TILES;
    const uint8_t *base = W + ((int64_t)e * R + (int64_t)tile * ROWS) * KB;
    auto load = [&](int buf, int s) {
#pragma unroll
        for (int j = 0; j < CH; j++) {
            const int c = threadIdx.x + NT * j; /* 16-byte chunk of the stage */
            const uint8_t *g = TILED ? base + (int64_t)s * STAGE_B + c * 16
                                     : base + (int64_t)(c / CPR) * KB + (int64_t)s * PIECE + (c % CPR) * 16;
            cp16(sm + buf * (STAGE_B + STAGE_A) + c * 16, g);
        }
#pragma unroll
        for (int j = 0; j < CHA; j++) {
            const int c = threadIdx.x + NT * j, r = c / CPR;
            const int tok = (r * 37 + e * 11) & 1023; /* gathered rows of x [1024, K] */
            cp16(sm + buf * (STAGE_B + STAGE_A) + STAGE_B + c * 16,
                 X + (int64_t)tok * KB + (int64_t)s * PIECE + (c % CPR) * 16);
        }
        commit();
    };
    unsigned acc = 0;
#pragma unroll
    for (int s = 0; s < ST - 1; s++) load(s, s);
    for (int s = 0; s < S; s++) {
        wait_g<ST - 2>();
        __syncthreads();
        if (s + ST - 1 < S) load((s + ST - 1) % ST, s + ST - 1);
        else commit();
        acc ^= *(const unsigned *)(sm + (s % ST) * (STAGE_B + STAGE_A) + threadIdx.x * 16);
    }
    if (acc == 0x9e3779b9u) *sink = acc; /* keeps the loads */
}

/* Plain streaming read: every thread 4 × 16 B in flight, grid-stride; the ceiling for any
 * access pattern on this GPU. */
__global__ void stream_read(const uint4 *__restrict__ W, int64_t n16, unsigned *sink) {
    unsigned acc = 0;
    const int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n16; i += 4 * stride) {
        uint4 v[4];
#pragma unroll
        for (int j = 0; j < 4; j++) v[j] = i + j * stride < n16 ? __ldg(&W[i + j * stride]) : make_uint4(0, 0, 0, 0);
#pragma unroll
        for (int j = 0; j < 4; j++) acc ^= v[j].x ^ v[j].w;
    }
    if (acc == 0x9e3779b9u) *sink = acc;
}

static const size_t BYTES = (size_t)E * R * KB; /* 1 GiB */

/* The fastest of 5 timed launches after one warm-up, in ms; non-zero on a CUDA error. */
template <typename Launch> static int best_ms(Launch launch, float *best) {
    cudaEvent_t a, b;
    CK(cudaEventCreate(&a));
    CK(cudaEventCreate(&b));
    *best = 1e30f;
    for (int rep = 0; rep < 6; rep++) {
        CK(cudaEventRecord(a));
        launch();
        CK(cudaEventRecord(b));
        CK(cudaEventSynchronize(b));
        float ms;
        CK(cudaEventElapsedTime(&ms, a, b));
        if (rep > 0 && ms < *best) *best = ms;
    }
    CK(cudaEventDestroy(a));
    CK(cudaEventDestroy(b));
    return 0;
}

template <int ROWS, int PIECE, int ST, bool TILED, bool WITH_A>
static int run(const char *name, int blocks_per_sm, const uint8_t *W, const uint8_t *X, unsigned *sink) {
    auto k = pattern<ROWS, PIECE, ST, TILED, WITH_A>;
    const int need = ST * (ROWS * PIECE + (WITH_A ? A_ROWS * PIECE : 0));
    int dev, smem_sm;
    CK(cudaGetDevice(&dev));
    CK(cudaDeviceGetAttribute(&smem_sm, cudaDevAttrMaxSharedMemoryPerMultiprocessor, dev));
    /* shared memory padded so that at most blocks_per_sm fit (1 KB a block is reserved) */
    int smem = smem_sm / blocks_per_sm - 1024;
    if (smem < need) {
        printf("%-44s bps %d: needs %d B of shared memory, skipped\n", name, blocks_per_sm, need);
        return 0;
    }
    if (smem > 227 * 1024) smem = 227 * 1024;
    CK(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    const int grid = E * (R / ROWS);
    float best;
    if (best_ms([&] { k<<<grid, NT, smem>>>(W, X, sink); }, &best)) return 1;
    int occ;
    CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occ, k, NT, smem));
    printf("%-44s bps %d (occ %d) st %d: %7.1f GB/s  (%.3f ms)\n", name, blocks_per_sm, occ, ST,
           BYTES / best / 1e6, best);
    return 0;
}

/* ---- ring producers ---------------------------------------------------------------------- */

enum { RING_TMA = 0, RING_BULK = 1, RING_CPASYNC = 2, RING_BULK1D = 3 };
constexpr int RING_ROWS = 128, RING_PIECE = 128, RING_STAGE = RING_ROWS * RING_PIECE; /* 16 KB */

/* tiles: (expert, 128-row tile) of W [E·R rows, KB bytes]; stage s of a tile = bytes s·128 … of
 * its 128 rows */
constexpr int RING_A_PITCH = 144; /* bytes: the 64 × 64 activation tile, padded (ldmatrix without conflicts) */

/* CW consumer warps; MATH: each stage's 128 weight rows (TMA's 128-byte swizzle: 16-byte chunk c
 * of row n at c ^ (n & 7)) multiplied by a 64-row activation tile on tensor cores, as the
 * expert GEMM would (mma m16n8k16, fragments by ldmatrix; warp w owns 128 / CW rows) */
template <int MODE, int ST, int CW = 4, bool MATH = false>
__global__ void __launch_bounds__((CW + 1) * 32) ring_pattern(const __grid_constant__ CUtensorMap tmap,
                                                              const uint8_t *__restrict__ W, unsigned *sink) {
    extern __shared__ __align__(1024) uint8_t rs[];
    uint8_t *stage = (uint8_t *)(((uintptr_t)rs + 1023) & ~(uintptr_t)1023); /* swizzle-128B alignment */
    uint8_t *atile = stage + ST * RING_STAGE; /* [64][RING_A_PITCH] */
    uint64_t *full = (uint64_t *)(atile + 64 * RING_A_PITCH), *empty = full + ST;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    if (threadIdx.x == 0) {
        for (int i = 0; i < ST; i++) {
            mbar_init(&full[i], MODE == RING_CPASYNC ? 32 : 1);
            mbar_init(&empty[i], CW);
        }
        mbar_init_fence();
    }
    __syncthreads();
    constexpr int S = KB / RING_PIECE;        /* stages a tile */
    const int tiles = E * (R / RING_ROWS);
    if (warp == CW) { /* producer */
        int q = 0;
        for (int t = blockIdx.x; t < tiles; t += gridDim.x) {
            const int row0 = t * RING_ROWS; /* tiles in order: expert-major, rows consecutive */
            for (int s = 0; s < S; s++, q++) {
                const int b = q % ST;
                if (q >= ST) mbar_wait(&empty[b], ((q / ST) - 1) & 1);
                uint8_t *dst = stage + b * RING_STAGE;
                if (MODE == RING_TMA) {
                    if (lane == 0) {
                        mbar_arrive_expect_tx(&full[b], RING_STAGE);
                        tma_load_2d(dst, &tmap, s * (RING_PIECE / 2), row0, &full[b]);
                    }
                } else if (MODE == RING_BULK1D) { /* the tile's rows are contiguous: one copy a stage */
                    if (lane == 0) {
                        mbar_arrive_expect_tx(&full[b], RING_STAGE);
                        bulk_load_1d(dst, W + (int64_t)row0 * KB + (int64_t)s * RING_STAGE, RING_STAGE, &full[b]);
                    }
                } else if (MODE == RING_BULK) {
                    if (lane == 0) mbar_arrive_expect_tx(&full[b], RING_STAGE);
                    __syncwarp();
                    for (int j = 0; j < RING_ROWS / 32; j++) {
                        const int r = lane + 32 * j;
                        asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
                                     ::"r"(smem_u32(dst + r * RING_PIECE)), "l"(W + (int64_t)(row0 + r) * KB + s * RING_PIECE),
                                     "r"(RING_PIECE), "r"(smem_u32(&full[b])) : "memory");
                    }
                } else {
                    const int cc = (lane & 7) * 16, r0 = lane >> 3;
#pragma unroll 8
                    for (int j = 0; j < RING_ROWS / 4; j++) {
                        const int r = r0 + 4 * j;
                        cp16(dst + r * RING_PIECE + cc, W + (int64_t)(row0 + r) * KB + s * RING_PIECE + cc);
                    }
                    mbar_arrive_cp_async(&full[b]);
                }
            }
        }
        return;
    }
    /* consumers: wait, touch (or multiply), release */
    constexpr int NT8 = RING_ROWS / CW / 8; /* n8 tiles a warp */
    float d[4][NT8 > 0 ? NT8 : 1][4] = {};
    unsigned acc = 0;
    int q = 0;
    for (int t = blockIdx.x; t < tiles; t += gridDim.x)
        for (int s = 0; s < S; s++, q++) {
            const int b = q % ST;
            mbar_wait(&full[b], (q / ST) & 1);
            if constexpr (MATH) {
                const uint32_t B = smem_u32(stage + b * RING_STAGE), A = smem_u32(atile);
#pragma unroll
                for (int kk = 0; kk < 4; kk++) { /* k16 steps of the stage's 64 */
                    uint32_t a[4][4];
#pragma unroll
                    for (int mt = 0; mt < 4; mt++)
                        ldmatrix_x4(a[mt], A + (mt * 16 + (lane & 15)) * RING_A_PITCH + (kk * 2 + (lane >> 4)) * 16);
#pragma unroll
                    for (int np = 0; np < NT8 / 2; np++) {
                        const int n = warp * (RING_ROWS / CW) + np * 16 + ((lane >> 4) & 1) * 8 + (lane & 7);
                        const int c = kk * 2 + ((lane >> 3) & 1);
                        uint32_t bf[4];
                        ldmatrix_x4(bf, B + n * RING_PIECE + ((c ^ (n & 7)) * 16));
#pragma unroll
                        for (int mt = 0; mt < 4; mt++) {
                            mma_bf16_16816(d[mt][2 * np], a[mt][0], a[mt][1], a[mt][2], a[mt][3], bf[0], bf[1]);
                            mma_bf16_16816(d[mt][2 * np + 1], a[mt][0], a[mt][1], a[mt][2], a[mt][3], bf[2], bf[3]);
                        }
                    }
                }
            } else {
                acc ^= *(const unsigned *)(stage + b * RING_STAGE + threadIdx.x * 16);
            }
            __syncwarp();
            if (lane == 0) mbar_arrive(&empty[b]);
        }
    if (MATH)
        for (int i = 0; i < 4; i++)
            for (int j = 0; j < NT8; j++)
                for (int e = 0; e < 4; e++) acc ^= __float_as_uint(d[i][j][e]);
    if (acc == 0x9e3779b9u) *sink = acc;
}

typedef CUresult (*encode_tiled_fn)(CUtensorMap *, CUtensorMapDataType, cuuint32_t, void *, const cuuint64_t *,
                                    const cuuint64_t *, const cuuint32_t *, const cuuint32_t *, CUtensorMapInterleave,
                                    CUtensorMapSwizzle, CUtensorMapL2promotion, CUtensorMapFloatOOBfill);

/* W as a 2-D tensor of E·R rows × K bf16, boxes of 128 rows × 64 elements (128 B), 128-byte swizzle */
static int make_tmap(CUtensorMap *m, const uint8_t *W) {
    void *fn = nullptr;
    cudaDriverEntryPointQueryResult q;
    CK(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &q));
    if (!fn || q != cudaDriverEntryPointSuccess) {
        fprintf(stderr, "cuTensorMapEncodeTiled: not found\n");
        return 1;
    }
    const cuuint64_t dims[2] = {KB / 2, (cuuint64_t)E * R}, strides[1] = {KB};
    const cuuint32_t box[2] = {RING_PIECE / 2, RING_ROWS}, estr[2] = {1, 1};
    const CUresult r = ((encode_tiled_fn)fn)(m, CU_TENSOR_MAP_DATA_TYPE_UINT16, 2, (void *)W, dims, strides, box, estr,
                                             CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                                             CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    if (r != CUDA_SUCCESS) {
        fprintf(stderr, "cuTensorMapEncodeTiled: error %d\n", (int)r);
        return 1;
    }
    return 0;
}

template <int MODE, int ST, int CW = 4, bool MATH = false>
static int run_ring(const char *name, int blocks_per_sm, const CUtensorMap &tmap, const uint8_t *W, unsigned *sink) {
    auto k = ring_pattern<MODE, ST, CW, MATH>;
    const int smem = ST * RING_STAGE + 64 * RING_A_PITCH + 2 * ST * 8 + 1024;
    CK(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    int dev, sms;
    CK(cudaGetDevice(&dev));
    CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
    const int grid = sms * blocks_per_sm;
    float best;
    if (best_ms([&] { k<<<grid, (CW + 1) * 32, smem>>>(tmap, W, sink); }, &best)) return 1;
    CK(cudaGetLastError());
    printf("%-44s bps %d st %d cw %d: %7.1f GB/s  (%.3f ms)\n", name, blocks_per_sm, ST, CW, BYTES / best / 1e6,
           best);
    return 0;
}

int main() {
    uint8_t *W, *X;
    unsigned *sink;
    CK(cudaMalloc(&W, BYTES));
    CK(cudaMalloc(&X, 1024 * KB));
    CK(cudaMalloc(&sink, 4));
    CK(cudaMemset(W, 1, BYTES));
    CK(cudaMemset(X, 2, 1024 * KB));
    cudaDeviceProp p;
    CK(cudaGetDeviceProperties(&p, 0));
    printf("%s, %d SMs, L2 %d MB\n", p.name, p.multiProcessorCount, p.l2CacheSize >> 20);
    float best;
    if (best_ms([&] { stream_read<<<p.multiProcessorCount * 8, 256>>>((const uint4 *)W, BYTES / 16, sink); }, &best))
        return 1;
    printf("%-44s %7.1f GB/s  (%.3f ms)\n", "stream_read (ceiling)", BYTES / best / 1e6, best);
    int rc = 0;
    /* the GEMM's pattern today (BN 128, BK 64: 128 B of 128 rows a stage) */
    rc |= run<128, 128, 2, false, false>("rowmajor 128 rows x 128 B", 4, W, X, sink);
    rc |= run<128, 128, 2, false, true>("rowmajor 128 rows x 128 B + A", 4, W, X, sink);
    rc |= run<128, 128, 3, false, false>("rowmajor 128 rows x 128 B", 4, W, X, sink);
    rc |= run<128, 128, 4, false, false>("rowmajor 128 rows x 128 B", 3, W, X, sink);
    rc |= run<128, 128, 2, false, false>("rowmajor 128 rows x 128 B", 6, W, X, sink);
    rc |= run<128, 128, 2, false, false>("rowmajor 128 rows x 128 B", 2, W, X, sink);
    /* longer pieces of fewer rows, 16 KB a stage */
    rc |= run<64, 256, 2, false, false>("rowmajor 64 rows x 256 B", 4, W, X, sink);
    rc |= run<32, 512, 2, false, false>("rowmajor 32 rows x 512 B", 4, W, X, sink);
    rc |= run<8, 2048, 2, false, false>("rowmajor 8 rows x 2048 B", 4, W, X, sink);
    rc |= run<128, 256, 2, false, false>("rowmajor 128 rows x 256 B (32 KB)", 3, W, X, sink);
    /* contiguous 16 KB a stage */
    rc |= run<128, 128, 2, true, false>("tiled 16 KB chunks", 4, W, X, sink);
    rc |= run<128, 128, 2, true, true>("tiled 16 KB chunks + A", 4, W, X, sink);
    rc |= run<128, 128, 3, true, false>("tiled 16 KB chunks", 4, W, X, sink);
    rc |= run<128, 128, 2, true, false>("tiled 16 KB chunks", 6, W, X, sink);
    /* one producer warp: a TMA box, 128 bulk copies or 32 cp.async a lane per 16 KB stage */
    CUtensorMap tmap;
    if (make_tmap(&tmap, W)) return 1;
    rc |= run_ring<RING_TMA, 6>("ring: TMA 2-D box a stage", 1, tmap, W, sink);
    rc |= run_ring<RING_TMA, 4>("ring: TMA 2-D box a stage", 2, tmap, W, sink);
    rc |= run_ring<RING_TMA, 12>("ring: TMA 2-D box a stage", 1, tmap, W, sink);
    rc |= run_ring<RING_BULK, 6>("ring: bulk copy a row piece", 1, tmap, W, sink);
    rc |= run_ring<RING_BULK1D, 6>("ring: one 1-D bulk copy a stage", 1, tmap, W, sink);
    rc |= run_ring<RING_BULK1D, 4>("ring: one 1-D bulk copy a stage", 2, tmap, W, sink);
    rc |= run_ring<RING_BULK1D, 12>("ring: one 1-D bulk copy a stage", 1, tmap, W, sink);
    rc |= run_ring<RING_CPASYNC, 6>("ring: cp.async, one warp", 1, tmap, W, sink);
    rc |= run_ring<RING_CPASYNC, 4>("ring: cp.async, one warp", 2, tmap, W, sink);
    /* the same with the consumers' tensor-core work of a 64 × 128 × 64 tile a stage */
    rc |= run_ring<RING_TMA, 6, 4, true>("ring: TMA box + mma (4 warps)", 1, tmap, W, sink);
    rc |= run_ring<RING_TMA, 6, 8, true>("ring: TMA box + mma (8 warps)", 1, tmap, W, sink);
    rc |= run_ring<RING_TMA, 6, 4, true>("ring: TMA box + mma (4 warps)", 2, tmap, W, sink);
    rc |= run_ring<RING_TMA, 6, 8, true>("ring: TMA box + mma (8 warps)", 2, tmap, W, sink);
    return rc;
}
