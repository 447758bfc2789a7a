/* cuda_gdn_prefill.cuh — what the Gated DeltaNet prefill launches share: the shapes they are
 * built for and their fp32 scratch (ctx->d_gdn_scratch). cuda_gdn_prefill.cu has the per-token
 * launches (prep, the token-serial scan, out, hist), cuda_gdn_chunked.cu the chunked recurrence
 * that replaces the scan. */
#ifndef DS_CUDA_GDN_PREFILL_CUH
#define DS_CUDA_GDN_PREFILL_CUH

#include "cuda_launch.cuh"

#define GP_KC 4    /* conv kernel */
#define GP_DK 128  /* key dim = value dim */
#define GP_MAX_G 8 /* value heads per key head */
#define GC_L 64    /* chunk length of the chunked recurrence (transformers' chunk_size) */

/* Pieces of ctx->d_gdn_scratch for T tokens (fp32). */
struct gdn_scratch {
    float *q;  /* [T, hk, dk] normalised, scaled by dk^-1/2 */
    float *k;  /* [T, hk, dk] normalised */
    float *v;  /* [T, hv, dv]; the chunked form overwrites it with U = (I + A)⁻¹ β v */
    float *ab; /* [T, hv, 2] g = log α (the log-decay), β */
    float *o;  /* [T, hv, dv] recurrence output before the gated norm */
    float *w;  /* [T, hv, dk] chunked form: W = (I + A)⁻¹ β e^{c} k̂ */
    float *p;  /* [T, hv, GC_L] chunked form: row i of the chunk's P (q̂_i·k̂_j e^{c_i − c_j}, j ≤ i) */
    float *cg; /* [T, hv] chunked form: c_i, the log-decay summed from the chunk's first token */
    int q_tf32; /* q holds to_tf32's bits (the chunked form's tensor-core operand only;
                   ds_cuda_gdn_chunk_q_tf32) */
};

static inline gdn_scratch gdn_scratch_of(float *base, int64_t T, int hk, int hv) {
    gdn_scratch s;
    s.q_tf32 = 0;
    s.q = base;
    s.k = s.q + T * hk * GP_DK;
    s.v = s.k + T * hk * GP_DK;
    s.ab = s.v + T * hv * GP_DK;
    s.o = s.ab + T * hv * 2;
    s.w = s.o + T * hv * GP_DK;
    s.p = s.w + T * hv * GP_DK;
    s.cg = s.p + T * hv * GC_L;
    return s;
}

/* The projection's row: [q (hk·dk) | k (hk·dk) | v (hv·dv) | z (hv·dv) | b (hv) | a (hv)].
 * gdn_conv_dim: the conv channels q | k | v (z starts there); gdn_proj_ld: the row pitch. */
static __device__ __forceinline__ int64_t gdn_conv_dim(const ds_cuda_gdn_args &a) {
    return 2 * (int64_t)a.hk * GP_DK + (int64_t)a.hv * GP_DK;
}
static __device__ __forceinline__ int64_t gdn_proj_ld(const ds_cuda_gdn_args &a) {
    return gdn_conv_dim(a) + (int64_t)a.hv * GP_DK + 2 * (int64_t)a.hv;
}

/* g = log α (the log-decay) and β of token t, value head h, from the projection's b and a. */
static __device__ __forceinline__ float2 gdn_g_beta(const ds_cuda_gdn_args &a, int64_t t, int h) {
    const bf16 *row = (const bf16 *)a.proj + t * gdn_proj_ld(a) + gdn_conv_dim(a) + (int64_t)a.hv * GP_DK;
    const float bb = to_f32(row[h]);
    const float aa = to_f32(row[a.hv + h]) + a.dt_bias[h];
    const float sp = aa > 20.f ? aa : log1pf(expf(aa)); /* softplus, torch threshold 20 */
    return make_float2(a.neg_exp_A[h] * sp, sigmoid_f(bb));
}

/* floats of gdn_scratch_of for T tokens */
static inline int64_t gdn_scratch_floats(int64_t T, int hk, int hv) {
    return T * hk * GP_DK * 2 + T * hv * (GP_DK * 3 + 2 + GC_L + 1);
}

/* The chunked recurrence (cuda_gdn_chunked.cu): o and the final states from q, k, v, ab of the
 * batch's sequences; overwrites v. */
void ds_cuda_gdn_chunked(ds_cuda_ctx *ctx, const ds_cuda_batch &b, const ds_cuda_gdn_args &a,
                         const gdn_scratch &sc);
/* Whether the chunked kernels take q̂ rounded to tf32 by the prep launch (gdn_scratch.q_tf32). */
bool ds_cuda_gdn_chunk_q_tf32(const ds_cuda_ctx *ctx);

#endif
