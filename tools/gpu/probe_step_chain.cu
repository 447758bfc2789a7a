/* probe_step_chain.cu — what would a persistent (one-launch) decode step save over today's
 * chain of PDL kernels in a CUDA graph, at batch 1?
 *
 * Why: a batch-1 step of the 35B-A3B is 264 kernels at ~0.69 of the copy bandwidth (s32-run2:
 * 2.868 ms for 6.05 GB on an H100 at 3044 GB/s). Every kernel's weights are loaded before its
 * PDL wait, so what remains per boundary is latency: the predecessor's last blocks finishing,
 * its memory flush, the wait's release, the next blocks' first dependent loads. A persistent
 * kernel replaces each boundary with a grid barrier (an atomic arrival count a phase and a spin)
 * and keeps the next phase's weights in registers across it — the same preload. Whether that is
 * worth building depends on the difference of the two boundary costs, measured here on the
 * same work:
 *
 *   chain     : one GEMV kernel a phase, PDL attribute, graph-captured and replayed — each warp
 *               loads its task's weights (16 B × 16 a lane) before griddepcontrol.wait, as the
 *               engine's GEMVs do (cuda_gemv.cu, DS_CUDA_GEMV_PRELOAD);
 *   persistent: one cooperative launch of SMs × resident blocks; phase after phase, each warp
 *               walks its tasks, and before arriving at the phase's barrier it loads the
 *               weights of its first task of the next phase;
 *   *-empty   : the same two with no weights (each block reads the previous phase's vector and
 *               writes one element): the bare cost of a boundary.
 *
 * The work is a batch-1 layer's chain of dependent GEMVs with the 35B-A3B's byte counts
 * (in_proj 2048→12352, the GDN state ~2 MB, out_proj 4096→2048, router + shared gate_up
 * 2048→1281, 8 experts' gate_up 2048→8192, their down 4096→2048), 40 layers, every layer with
 * its own weights (5.0 GB, none L2-resident). Each phase reads the previous phase's whole output
 * vector (bf16) after the boundary, so the dependency is real. The two forms compute every
 * output row with the same sums in the same order: their final vectors must match bit for bit.
 *
 *   nvcc -std=c++17 -O3 -arch=sm_90a -o probe_step_chain tools/gpu/probe_step_chain.cu
 *   ./probe_step_chain            (prints one line a form: µs a step, GB/s, µs a phase — for
 *                                  the empty forms, the bare cost of one boundary)
 */
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <cstdio>
#include <vector>

#include "probe_check.cuh"


constexpr int WARPS = 8;   /* warps a block, both forms */
constexpr int CHUNKS = 16; /* 16-byte weight loads a lane holds for one task (64 registers) */
constexpr int LAYERS = 40;
constexpr int PHASES_A_LAYER = 6;
constexpr int PHASES = LAYERS * PHASES_A_LAYER;
constexpr int VEC_MAX = 12352; /* longest phase output */

/* One phase: y[N] = W[N, K] · x[K] (x = the previous phase's output, its first K entries).
 * A task is the ROWS = CHUNKS / (K / 256) rows a warp computes: K = 2048 → 2 rows, 4096 → 1. */
struct Phase {
    const __nv_bfloat16 *w; /* [N, K] */
    int n, k;
};

static __host__ __device__ inline int rows_a_task(int k) { return CHUNKS / (k / 256); }
static __host__ __device__ inline int tasks_of(const Phase &p) {
    const int r = rows_a_task(p.k);
    return (p.n + r - 1) / r;
}

struct Chain {
    Phase ph[PHASES];
    __nv_bfloat16 *vec[2]; /* ping-pong activation vectors [VEC_MAX] */
};

/* The task's weights: chunk c of row r of the task at lane l is W[n0 + r, (c·32 + l)·8 .. +8]. */
struct Loaded {
    uint4 w[CHUNKS];
};

template <int K>
static __device__ __forceinline__ void load_task_k(const Phase &p, int task, Loaded &L) {
    constexpr int PER_ROW = K / 256, ROWS = CHUNKS / PER_ROW;
    const int lane = threadIdx.x & 31;
#pragma unroll
    for (int c = 0; c < CHUNKS; c++) {
        const int r = c / PER_ROW, j = c % PER_ROW;
        int n = task * ROWS + r;
        n = n < p.n ? n : p.n - 1; /* clamped: its result is not stored */
        const uint4 *src = reinterpret_cast<const uint4 *>(p.w + (int64_t)n * K) + j * 32 + lane;
        asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
                     : "=r"(L.w[c].x), "=r"(L.w[c].y), "=r"(L.w[c].z), "=r"(L.w[c].w)
                     : "l"(src));
    }
}

static __device__ __forceinline__ void load_task(const Phase &p, int task, Loaded &L) {
    if (p.k == 2048) load_task_k<2048>(p, task, L);
    else load_task_k<4096>(p, task, L);
}

static __device__ __forceinline__ float dot8(uint4 a, uint4 b) {
    const __nv_bfloat162 *x = reinterpret_cast<const __nv_bfloat162 *>(&a);
    const __nv_bfloat162 *y = reinterpret_cast<const __nv_bfloat162 *>(&b);
    float s = 0.f;
#pragma unroll
    for (int i = 0; i < 4; i++) {
        const float2 u = __bfloat1622float2(x[i]), v = __bfloat1622float2(y[i]);
        s = fmaf(u.x, v.x, s);
        s = fmaf(u.y, v.y, s);
    }
    return s;
}

/* Finishes a loaded task against x and stores its rows (scaled to keep the chain's values O(1)).
 * x is read through L2 only (.cg): in the persistent form a block's L1 may still hold an older
 * vector at the same address (the two vectors alternate). */
template <int K>
static __device__ __forceinline__ void finish_task_k(const Phase &p, int task, const Loaded &L,
                                                     const __nv_bfloat16 *x, __nv_bfloat16 *y) {
    constexpr int PER_ROW = K / 256, ROWS = CHUNKS / PER_ROW;
    const int lane = threadIdx.x & 31;
    const float scale = rsqrtf((float)K / 3.f);
    float acc[ROWS];
#pragma unroll
    for (int r = 0; r < ROWS; r++) acc[r] = 0.f;
#pragma unroll
    for (int j = 0; j < PER_ROW; j++) {
        uint4 xv;
        const uint4 *src = reinterpret_cast<const uint4 *>(x) + j * 32 + lane;
        asm volatile("ld.global.cg.v4.u32 {%0,%1,%2,%3}, [%4];"
                     : "=r"(xv.x), "=r"(xv.y), "=r"(xv.z), "=r"(xv.w)
                     : "l"(src));
#pragma unroll
        for (int r = 0; r < ROWS; r++) acc[r] += dot8(L.w[r * PER_ROW + j], xv);
    }
#pragma unroll
    for (int r = 0; r < ROWS; r++) {
        float s = acc[r];
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
        const int n = task * ROWS + r;
        if (lane == 0 && n < p.n) y[n] = __float2bfloat16_rn(s * scale);
    }
}

static __device__ __forceinline__ void finish_task(const Phase &p, int task, const Loaded &L,
                                                   const __nv_bfloat16 *x, __nv_bfloat16 *y) {
    if (p.k == 2048) finish_task_k<2048>(p, task, L, x, y);
    else finish_task_k<4096>(p, task, L, x, y);
}

static __device__ __forceinline__ void pdl_wait_then_release() {
    asm volatile("griddepcontrol.wait;" ::: "memory");
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
}

/* ---- the chain: one kernel a phase ------------------------------------------------------- */

__global__ void __launch_bounds__(WARPS * 32) chain_phase_kernel(Phase p, const __nv_bfloat16 *x,
                                                                 __nv_bfloat16 *y) {
    const int task = blockIdx.x * WARPS + (threadIdx.x >> 5);
    Loaded L;
    if (task < tasks_of(p)) load_task(p, task, L); /* weights only: before the wait */
    pdl_wait_then_release();
    if (task < tasks_of(p)) finish_task(p, task, L, x, y);
}

/* Empty form: each block reads one element of the previous vector and writes one. */
__global__ void __launch_bounds__(WARPS * 32) chain_empty_kernel(const __nv_bfloat16 *x,
                                                                 __nv_bfloat16 *y) {
    pdl_wait_then_release();
    if (threadIdx.x == 0) y[blockIdx.x] = __float2bfloat16_rn(__bfloat162float(__ldcg(x + blockIdx.x)) + 1.f);
}

/* ---- the persistent form ----------------------------------------------------------------- */

/* Phase p's barrier: every block counts itself in arrive[p] (after its stores, fenced), then
 * waits until all have. The counters are zeroed before each launch. */
static __device__ __forceinline__ void grid_barrier(unsigned *arrive, unsigned nblocks) {
    __syncthreads();
    if (threadIdx.x == 0) {
        __threadfence();
        atomicAdd(arrive, 1u);
        unsigned seen;
        do {
            asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(seen) : "l"(arrive) : "memory");
        } while (seen < nblocks);
    }
    __syncthreads();
}

__global__ void __launch_bounds__(WARPS * 32) persistent_kernel(const Chain *__restrict__ ch,
                                                                unsigned *arrive, int empty) {
    const int gw = blockIdx.x * WARPS + (threadIdx.x >> 5);
    const int nw = gridDim.x * WARPS;
    Loaded L;
    if (!empty && gw < tasks_of(ch->ph[0])) load_task(ch->ph[0], gw, L);
    for (int p = 0; p < PHASES; p++) {
        const __nv_bfloat16 *x = ch->vec[p & 1];
        __nv_bfloat16 *y = ch->vec[(p + 1) & 1];
        if (empty) {
            if (threadIdx.x == 0)
                y[blockIdx.x] = __float2bfloat16_rn(__bfloat162float(__ldcg(x + blockIdx.x)) + 1.f);
        } else {
            const Phase ph = ch->ph[p];
            const int nt = tasks_of(ph);
            for (int t = gw; t < nt; t += nw) {
                if (t != gw) load_task(ph, t, L); /* the first was loaded before the barrier */
                finish_task(ph, t, L, x, y);
            }
            if (p + 1 < PHASES && gw < tasks_of(ch->ph[p + 1])) load_task(ch->ph[p + 1], gw, L);
        }
        grid_barrier(arrive + p, gridDim.x);
    }
}

/* ---- host ------------------------------------------------------------------------------- */

__global__ void fill_kernel(__nv_bfloat16 *w, int64_t n, uint32_t seed) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x) {
        uint32_t h = (uint32_t)i * 2654435761u ^ seed;
        h ^= h >> 15, h *= 2246822519u, h ^= h >> 13;
        w[i] = __float2bfloat16_rn((float)(h & 0xffff) / 32768.f - 1.f);
    }
}

static float median(std::vector<float> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
}

/* The median over reps runs (after two warm-up runs) of the time enqueue() takes on stream st,
 * in µs. */
template <class F>
static cudaError_t time_median_us(cudaStream_t st, cudaEvent_t e0, cudaEvent_t e1, int reps, F enqueue,
                                  float *us) {
    std::vector<float> t;
    for (int i = 0; i < reps + 2; i++) {
        cudaError_t e;
        if ((e = cudaEventRecord(e0, st)) != cudaSuccess || (e = enqueue()) != cudaSuccess ||
            (e = cudaEventRecord(e1, st)) != cudaSuccess || (e = cudaEventSynchronize(e1)) != cudaSuccess)
            return e;
        float ms;
        if ((e = cudaEventElapsedTime(&ms, e0, e1)) != cudaSuccess) return e;
        if (i >= 2) t.push_back(ms);
    }
    *us = median(t) * 1e3f;
    return cudaSuccess;
}

int main() {
    int dev = 0, sms = 0;
    CK(cudaSetDevice(dev));
    CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, dev));

    /* a batch-1 layer's dependent GEMVs (N, K), bytes as the 35B-A3B's */
    const int shape[PHASES_A_LAYER][2] = {{12352, 2048}, {512, 2048}, {2048, 4096},
                                          {1281, 2048},  {8192, 2048}, {2048, 4096}};
    int64_t total = 0;
    for (int l = 0; l < LAYERS; l++)
        for (int s = 0; s < PHASES_A_LAYER; s++) total += (int64_t)shape[s][0] * shape[s][1];
    __nv_bfloat16 *wall = nullptr;
    CK(cudaMalloc(&wall, total * 2));
    fill_kernel<<<4 * sms, 256>>>(wall, total, 12345u);
    CK(cudaGetLastError());

    Chain h = {};
    int64_t off = 0;
    for (int p = 0; p < PHASES; p++) {
        const int s = p % PHASES_A_LAYER;
        h.ph[p] = Phase{wall + off, shape[s][0], shape[s][1]};
        off += (int64_t)shape[s][0] * shape[s][1];
    }
    for (int i = 0; i < 2; i++) CK(cudaMalloc(&h.vec[i], VEC_MAX * 2));
    Chain *d_chain = nullptr;
    CK(cudaMalloc(&d_chain, sizeof(Chain)));
    CK(cudaMemcpy(d_chain, &h, sizeof(Chain), cudaMemcpyHostToDevice));
    unsigned *arrive = nullptr;
    CK(cudaMalloc(&arrive, PHASES * sizeof(unsigned)));
    std::vector<__nv_bfloat16> x0(VEC_MAX);
    for (int i = 0; i < VEC_MAX; i++) x0[i] = __float2bfloat16_rn((float)((i * 37) % 101) / 50.f - 1.f);
    __nv_bfloat16 *d_x0 = nullptr; /* the step's input, copied device to device (graph-capturable) */
    CK(cudaMalloc(&d_x0, VEC_MAX * 2));
    CK(cudaMemcpy(d_x0, x0.data(), VEC_MAX * 2, cudaMemcpyHostToDevice));

    cudaStream_t st;
    CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));

    /* copy bandwidth (read + write) of 2 GiB, for the ratio */
    float copy_gbps = 0.f;
    {
        const size_t n = (size_t)1 << 30;
        void *a = nullptr, *b = nullptr;
        CK(cudaMalloc(&a, n));
        CK(cudaMalloc(&b, n));
        std::vector<float> t;
        for (int i = 0; i < 5; i++) {
            CK(cudaEventRecord(e0, st));
            CK(cudaMemcpyAsync(b, a, n, cudaMemcpyDeviceToDevice, st));
            CK(cudaEventRecord(e1, st));
            CK(cudaEventSynchronize(e1));
            float ms;
            CK(cudaEventElapsedTime(&ms, e0, e1));
            t.push_back(ms);
        }
        copy_gbps = 2.f * n / (median(t) * 1e-3f) / 1e9f;
        CK(cudaFree(a));
        CK(cudaFree(b));
    }
    printf("probe_step_chain on %s (%d SMs): %d phases, %.3f GB of weights, copy %.0f GB/s\n",
           prop.name, sms, PHASES, total * 2 / 1e9, copy_gbps);
    printf("floor at copy bandwidth: %.1f us a step\n", total * 2 / (copy_gbps * 1e9) * 1e6);

    /* the chain, graph-captured with PDL */
    auto capture_chain = [&](bool empty, bool pdl, cudaGraphExec_t *exec) -> int {
        cudaGraph_t g;
        CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
        CK(cudaMemcpyAsync(h.vec[0], d_x0, VEC_MAX * 2, cudaMemcpyDeviceToDevice, st));
        for (int p = 0; p < PHASES; p++) {
            cudaLaunchAttribute attr[1];
            attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
            attr[0].val.programmaticStreamSerializationAllowed = 1;
            cudaLaunchConfig_t cfg = {};
            cfg.blockDim = dim3(WARPS * 32);
            cfg.stream = st;
            cfg.attrs = attr;
            cfg.numAttrs = pdl ? 1 : 0;
            const __nv_bfloat16 *x = h.vec[p & 1];
            __nv_bfloat16 *y = h.vec[(p + 1) & 1];
            if (empty) {
                cfg.gridDim = dim3(sms);
                CK(cudaLaunchKernelEx(&cfg, chain_empty_kernel, x, y));
            } else {
                cfg.gridDim = dim3((tasks_of(h.ph[p]) + WARPS - 1) / WARPS);
                CK(cudaLaunchKernelEx(&cfg, chain_phase_kernel, h.ph[p], x, y));
            }
        }
        CK(cudaStreamEndCapture(st, &g));
        CK(cudaGraphInstantiate(exec, g, 0));
        CK(cudaGraphDestroy(g));
        return 0;
    };

    int occ = 0;
    CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occ, persistent_kernel, WARPS * 32, 0));
    int occ_chain = 0;
    CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occ_chain, chain_phase_kernel, WARPS * 32, 0));
    printf("resident blocks an SM: persistent %d, chain kernel %d\n", occ, occ_chain);

    std::vector<__nv_bfloat16> out_chain(VEC_MAX), out_pers(VEC_MAX);
    const int reps = 20;
    for (int empty = 1; empty >= 0; empty--) {
        for (int pdl = 1; pdl >= 0; pdl--) {
            cudaGraphExec_t ex;
            if (capture_chain(empty, pdl, &ex)) return 1;
            float us;
            CK(time_median_us(st, e0, e1, reps, [&] { return cudaGraphLaunch(ex, st); }, &us));
            printf("chain%s%s       : %8.1f us a step, %6.0f GB/s, %.2f us a phase\n",
                   empty ? "-empty" : "", pdl ? "" : "-nopdl", us,
                   empty ? 0.f : total * 2 / (us * 1e-6f) / 1e9f, us / PHASES);
            if (!empty && pdl) CK(cudaMemcpy(out_chain.data(), h.vec[PHASES & 1], VEC_MAX * 2, cudaMemcpyDeviceToHost));
            CK(cudaGraphExecDestroy(ex));
        }
        for (int blocks_an_sm = 1; blocks_an_sm <= occ; blocks_an_sm++) {
            const int grid = sms * blocks_an_sm;
            float us;
            CK(time_median_us(st, e0, e1, reps, [&] { /* the input copy inside, as in the chain's graph */
                cudaError_t e = cudaMemcpyAsync(h.vec[0], d_x0, VEC_MAX * 2, cudaMemcpyDeviceToDevice, st);
                if (e == cudaSuccess) e = cudaMemsetAsync(arrive, 0, PHASES * sizeof(unsigned), st);
                void *args[] = {&d_chain, &arrive, &empty};
                if (e == cudaSuccess)
                    e = cudaLaunchCooperativeKernel((void *)persistent_kernel, dim3(grid), dim3(WARPS * 32),
                                                    args, 0, st);
                return e;
            }, &us));
            printf("persistent%s x%d : %8.1f us a step, %6.0f GB/s, %.2f us a phase\n",
                   empty ? "-empty" : "", blocks_an_sm, us,
                   empty ? 0.f : total * 2 / (us * 1e-6f) / 1e9f, us / PHASES);
            if (!empty) {
                CK(cudaMemcpy(out_pers.data(), h.vec[PHASES & 1], VEC_MAX * 2, cudaMemcpyDeviceToHost));
                int diff = 0;
                for (int i = 0; i < 2048; i++) /* the last phase writes 2048 entries */
                    diff += memcmp(&out_chain[i], &out_pers[i], 2) != 0;
                float rms = 0.f;
                for (int i = 0; i < 2048; i++) rms += __bfloat162float(out_pers[i]) * __bfloat162float(out_pers[i]);
                printf("  final vector vs the chain's: %d of 2048 differ (rms %.3f)\n", diff,
                       sqrtf(rms / 2048));
            }
        }
    }
    return 0;
}
