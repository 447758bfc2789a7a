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
};

static inline gdn_scratch gdn_scratch_of(float *base, int64_t T, int hk, int hv) {
    gdn_scratch s;
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

/* floats of gdn_scratch_of for T tokens */
static inline int64_t gdn_scratch_floats(int64_t T, int hk, int hv) {
    return T * hk * GP_DK * 2 + T * hv * (GP_DK * 3 + 2 + GC_L + 1);
}

/* The chunked recurrence (cuda_gdn_chunked.cu): o and the final states from q, k, v, ab of the
 * batch's sequences; overwrites v. */
void ds_cuda_gdn_chunked(ds_cuda_ctx *ctx, const ds_cuda_batch &b, const ds_cuda_gdn_args &a,
                         const gdn_scratch &sc);

#endif
