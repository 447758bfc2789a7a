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
 *   nvcc -std=c++17 -O3 -arch=sm_90a -o probe tools/gpu/probe_weight_stream.cu && ./probe
 * Prints one line per pattern: name, GB/s (best of 5). */
#include <cstdio>
#include <cstdint>
#include <cuda_runtime.h>

#define CK(x)                                                                                  \
    do {                                                                                       \
        cudaError_t e_ = (x);                                                                  \
        if (e_ != cudaSuccess) {                                                               \
            fprintf(stderr, "%s:%d %s\n", __FILE__, __LINE__, cudaGetErrorString(e_));        \
            return 1;                                                                          \
        }                                                                                      \
    } while (0)

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
    return rc;
}
