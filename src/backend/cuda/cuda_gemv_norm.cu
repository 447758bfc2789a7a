/* cuda_gemv_norm.cu — a CUDA-core GEMV whose input is the residual add + RMSNorm of the step's
 * previous output, computed by every block for itself, so the norm is not a launch of its own
 * (ctx->gemv_norm, DS_CUDA_GEMV_NORM):
 *
 *   s = bf16(resid + delta)              [R, K]   (not stored: the next residual add redoes it;
 *                                                  delta NULL: s = resid)
 *   x = bf16(rmsnorm(s) · norm_w)        [R, K]   (each block's shared memory; block (0, 0)
 *                                                  also writes it to `normed` for later kernels)
 *   out[R, N] = x · Wᵀ                   fp32
 *
 * Used for the MoE router of one-sequence decode steps (ds_cuda_moe, pre_delta): it saves the
 * add + norm launch (~2.7 µs, ncu s10-run3) and one launch boundary per layer; and, without
 * delta, for the next layer's input projection after a MoE block whose down launch did the
 * combine + residual add (ds_cuda_op_linear_rmsnorm; the norm needs the whole row, which no
 * block of that launch holds). Every block
 * reads the two [R, K] rows (L2: the previous kernels just wrote them) and reduces them with the
 * arithmetic of add_rmsnorm (cuda_norm.cuh add_norm_rows, all rows at once); the GEMV is
 * gemv_kernel's (the same gemv_plan: rows per warp, split K, chunk order), so the logits and
 * the normed rows are the bits of add_rmsnorm followed by ds_cuda_gemv_cores. Nothing in the
 * launch writes what another block reads: the residual stays unchanged (the combine + norm
 * after the MoE adds delta again, cuda_moe.cu). */
#include "cuda_gemv.cuh"
#include "cuda_launch.cuh"
#include "cuda_norm.cuh"

/* ≤ 128 registers (2 blocks an SM): the router's 161-164 blocks in one wave at any R; one row
 * ≤ 80 (3 an SM, 396 on an H200): also the 35B-A3B GDN in_proj's 386 blocks after a MoE block
 * (92 registers at 2 an SM made it two waves) */
#define GEMV_NORM_MIN_BLOCKS(R) ((R) == 1 ? 3 : 2)
template <int R, int ROWS, int UNROLL, typename OutT>
__global__ void __launch_bounds__(GEMV_WARPS * 32, GEMV_NORM_MIN_BLOCKS(R))
    gemv_add_norm_kernel(const bf16 *__restrict__ W, int64_t N, int64_t K,
                         const bf16 *__restrict__ resid, const bf16 *__restrict__ delta,
                         const float *__restrict__ norm_w, float eps, bf16 *__restrict__ normed,
                         OutT *__restrict__ out, int64_t ldo, int64_t k_per_split,
                         float *__restrict__ ws, int *__restrict__ counters, int preload) {
    extern __shared__ __align__(16) unsigned char x_smem[]; /* x [R, K] bf16 */
    __shared__ float red[R * 32];
    bf16 *xs = reinterpret_cast<bf16 *>(x_smem);
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int64_t n0 = ((int64_t)blockIdx.x * GEMV_WARPS + warp) * ROWS;
    const int64_t k0 = (int64_t)blockIdx.y * k_per_split;
    const int64_t k1 = k0 + k_per_split < K ? k0 + k_per_split : K;
    /* weights only before the wait (cuda_launch.cuh): the norm's, and each warp's first batch */
    const NormW nw = norm_w_load(norm_w, K, 1);
    WBatch<ROWS, UNROLL> first;
    const bool pre = gemv_preload<ROWS, UNROLL>(W, K, n0, N, k0, k1, lane, preload, first);
    pdl_enter();
    add_norm_rows<R>(resid, delta, nw, eps, K, R, xs, normed, blockIdx.x == 0 && blockIdx.y == 0, red);
    const XSharedBF16 x = {xs, K};
    float acc[ROWS][R];
    gemv_warp_sums<R, ROWS, UNROLL>(W, K, n0, N, x, k0, k1, pre, first, acc);
    gemv_block_store<R, ROWS>(acc, n0, N, out, ldo, ws, counters);
}

/* Shared memory of the normed rows; the launch stays within the default 48 KB. */
static size_t gemv_norm_smem(int R, int64_t K) { return sizeof(bf16) * (size_t)R * (size_t)K; }

/* Only where ds_cuda_gemv takes the CUDA cores (one-sequence steps; multi-sequence steps
 * whose K is not a multiple of 256), at the default rows per warp (and its narrow plan); rows
 * of ≤ 4096 values (add_norm_rows: two chunks a thread). A tensor-core form for multi-sequence
 * steps (gemv_tc_kernel's block after add_norm_rows) was slower in the step although not in
 * isolation: 4.798 / 7.237 vs 4.746 / 7.084 ms at batch 4 / 8, 10.1 µs a launch at batch 8
 * (s11-run8; with the rows normed one after another, 19.6 µs and 5.106 / 7.702 ms, s11-run3):
 * the separate norm launch overlaps its neighbours under PDL, the prologue does not. */
extern "C" int ds_cuda_gemv_add_norm_ok(const ds_cuda_ctx *ctx, int R, int64_t K) {
    const bool tc = ctx->opt.tc_gemv && (ctx->batch.n_seqs > 1 || ctx->tc_one_seq) && K % 256 == 0;
    if (!ctx->gemv_norm || tc || ctx->gemv_rows != 4) return 0;
    return R >= 1 && R <= DS_CUDA_GEMV_MAX_ROWS && K % 8 == 0 && K >= 8 &&
           K <= DS_NORM_REG_CHUNKS * 8 * DS_NORM_THREADS && gemv_norm_smem(R, K) <= 48 * 1024;
}

template <int R, typename OutT>
static void launch_add_norm(ds_cuda_ctx *ctx, const GemvPlan &p, const bf16 *W, int64_t N, int64_t K,
                            const bf16 *resid, const bf16 *delta, const float *norm_w, float eps,
                            bf16 *normed, OutT *out, int64_t ldo) {
    const dim3 grid((unsigned)p.bx, (unsigned)p.splits);
    /* gemv_kernel's instantiations for these rows per warp (cuda_gemv.cu) */
    if (p.rows == 1)
        ds_launch(ctx, gemv_add_norm_kernel<R, 1, 8, OutT>, grid, GEMV_WARPS * 32, gemv_norm_smem(R, K),
                  W, N, K, resid, delta, norm_w, eps, normed, out, ldo, p.kps, ctx->d_splitk_ws,
                  ctx->d_splitk_cnt, ctx->gemv_preload);
    else
        ds_launch(ctx, gemv_add_norm_kernel<R, 4, 2, OutT>, grid, GEMV_WARPS * 32, gemv_norm_smem(R, K),
                  W, N, K, resid, delta, norm_w, eps, normed, out, ldo, p.kps, ctx->d_splitk_ws,
                  ctx->d_splitk_cnt, ctx->gemv_preload);
}

template <typename OutT>
static void launch_add_norm_rows(ds_cuda_ctx *ctx, const GemvPlan &p, int R, const bf16 *W, int64_t N,
                                 int64_t K, const bf16 *h, const bf16 *d, const float *norm_w,
                                 float eps, bf16 *xn, OutT *out, int64_t ldo) {
    switch (R) {
    case 1: launch_add_norm<1>(ctx, p, W, N, K, h, d, norm_w, eps, xn, out, ldo); break;
    case 2: launch_add_norm<2>(ctx, p, W, N, K, h, d, norm_w, eps, xn, out, ldo); break;
    case 3: launch_add_norm<3>(ctx, p, W, N, K, h, d, norm_w, eps, xn, out, ldo); break;
    case 4: launch_add_norm<4>(ctx, p, W, N, K, h, d, norm_w, eps, xn, out, ldo); break;
    case 5: launch_add_norm<5>(ctx, p, W, N, K, h, d, norm_w, eps, xn, out, ldo); break;
    case 6: launch_add_norm<6>(ctx, p, W, N, K, h, d, norm_w, eps, xn, out, ldo); break;
    case 7: launch_add_norm<7>(ctx, p, W, N, K, h, d, norm_w, eps, xn, out, ldo); break;
    default: launch_add_norm<8>(ctx, p, W, N, K, h, d, norm_w, eps, xn, out, ldo); break;
    }
}

extern "C" void ds_cuda_gemv_add_norm(ds_cuda_ctx *ctx, const void *W, int64_t N, int64_t K,
                                      const void *resid, const void *delta, const float *norm_w,
                                      float eps, void *normed, int R, void *out, int64_t ldo,
                                      int out_f32) {
    if (N <= 0 || R <= 0) return;
    if (!ds_cuda_gemv_add_norm_ok(ctx, R, K)) {
        ds_cuda_check(ctx, cudaErrorInvalidValue, "gemv_add_norm: shape outside the built kernel",
                      __FILE__, __LINE__);
        return;
    }
    const bf16 *Wb = (const bf16 *)W, *h = (const bf16 *)resid, *d = (const bf16 *)delta;
    bf16 *xn = (bf16 *)normed;
    /* ds_cuda_gemv_cores' plan for the same shape: the same sums */
    const GemvPlan p = gemv_plan(ctx, N, K, R);
    if (out_f32) launch_add_norm_rows(ctx, p, R, Wb, N, K, h, d, norm_w, eps, xn, (float *)out, ldo);
    else launch_add_norm_rows(ctx, p, R, Wb, N, K, h, d, norm_w, eps, xn, (bf16 *)out, ldo);
    DS_CU_LAUNCHED2(ctx, p.splits > 1 ? "gemv_add_norm_kernel (split-K)" : "gemv_add_norm_kernel", N, K);
}
