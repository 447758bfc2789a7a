/* cpu_internal.h — shared state and kernels of the CPU reference backend (private). */
#ifndef DS_CPU_INTERNAL_H
#define DS_CPU_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "backend/backend.h"
#include "backend/cpu/cpu_backend.h"
#include "core/threadpool.h"

/* Per-thread scratch levels: a kernel (linear) and the op that calls it (attention, gdn, moe)
 * may both hold scratch on the same thread, so they use different levels. */
enum { DS_CPU_SCRATCH_KERNEL = 0, DS_CPU_SCRATCH_OP = 1, DS_CPU_SCRATCH_LEVELS = 2 };

/* Op-level work buffers shared by all threads of one op (grown by the calling thread only). */
enum { DS_CPU_WORK_A = 0, DS_CPU_WORK_B, DS_CPU_WORK_C, DS_CPU_WORK_D, DS_CPU_WORK_COUNT };

typedef struct ds_cpu_buf {
    void *p;
    size_t bytes;
} ds_cpu_buf;

typedef struct ds_cpu {
    ds_threadpool *pool;
    int n_threads;
    ds_batch batch; /* current step (set_batch); arrays owned by the caller */
    bool has_batch;
    ds_cpu_gdn_mode gdn_mode;
    ds_cpu_buf *scratch; /* [n_threads * DS_CPU_SCRATCH_LEVELS] */
    ds_cpu_buf work[DS_CPU_WORK_COUNT];
    /* RoPE inverse frequencies for (rope_theta, rot_dim), cached across steps. */
    float *inv_freq; /* [rot_dim / 2] */
    int inv_freq_rot;
    double inv_freq_theta;
    /* argmax_logits' banned ids (set_argmax_bans): row r < ban_rows of the table bans
     * [ban_rows, ban_n] (-1 padded) lists the ids row r of argmax_logits must not return */
    int32_t *bans; /* [ban_cap] */
    size_t ban_cap;
    int ban_rows, ban_n;
    /* the token buffer (backend.h DS_TOKEN_BUF): argmax_logits' kept ids, ds_batch.token_src */
    int32_t tokbuf[DS_TOKEN_BUF];
    /* the shift table (backend.h DS_SHIFT_TABLE): spec_accept's rejected drafts per sequence */
    int32_t shift[DS_SHIFT_TABLE];
    /* spec_sample's per-sequence parameters (set_spec_sampling) */
    ds_spec_sampling samp[DS_SPEC_SAMPLING_MAX];
    int samp_n;
    /* a batch with pos_shift / out_shift points its positions [T], seq_n_past [S] and out_rows
     * [n_out] here, lowered (cpu_spec.c ds_cpu_shift_batch), and with slot_ring its seq_slot
     * [S] and state_out_slots [T] */
    int32_t *shifted;
    size_t shifted_cap;
} ds_cpu;

static inline ds_cpu *ds_cpu_of(ds_backend *be) { return (ds_cpu *)be->impl; }

/* 64-byte aligned buffers; grow-only, contents not preserved. Abort on OOM (DS_ASSERT): the
 * op table has no error path and sizes here are bounded by the batch. */
float *ds_cpu_scratch(ds_cpu *cpu, int tid, int level, size_t n_floats);
float *ds_cpu_work(ds_cpu *cpu, int which, size_t n_floats);
void *ds_cpu_aligned_alloc(size_t bytes); /* zeroed; NULL on failure */
void ds_cpu_aligned_free(void *p);

/* The whole batch must be set before ops that read it. */
const ds_batch *ds_cpu_batch(ds_cpu *cpu);

/* Row t's token (backend.h ds_batch.token_src): entry token_src[t] ≥ 0 of the token buffer,
 * else tokens[t]; token_src may be NULL. */
static inline int32_t ds_cpu_row_token(const int32_t *tokens, const int32_t *token_src,
                                       const int32_t *tokbuf, int64_t t) {
    const int32_t src = token_src ? token_src[t] : -1;
    DS_ASSERT(src < DS_TOKEN_BUF);
    return src >= 0 ? tokbuf[src] : tokens[t];
}

/* ---- kernels (cpu_matmul.c) ---------------------------------------------------------------- */

/* out[r, o] = Σ_k x[r, k] · W[row0 + o, k] for r < R, o < n_rows; W any float dtype [N, K].
 * x rows have stride ldx, out rows stride ldo. Single-threaded; scratch holds
 * DS_CPU_MATMUL_BLOCK * K floats (used when R > 1). The accumulation order per output does not
 * depend on R, so a row's result is the same alone or in a batch. */
#define DS_CPU_MATMUL_BLOCK 4
void ds_cpu_matmul_rows(const float *x, int64_t R, int64_t ldx, const ds_tensor *w, int64_t row0,
                        int64_t n_rows, float *out, int64_t ldo, float *scratch);

/* Multi-threaded out[R, n_out] = x[R, n_in] · Wᵀ over the parts of `w`; x/out row strides
 * ldx/ldo. */
void ds_cpu_linear_f32(ds_cpu *cpu, const float *x, int64_t R, int64_t ldx, const ds_linear *w,
                       float *out, int64_t ldo);

/* Σ x[i]·y[i] with 8 fp32 lanes (fixed order). */
float ds_cpu_dot(const float *x, const float *y, int64_t n);
/* y[i] += a·x[i] */
void ds_cpu_axpy(float a, const float *x, float *y, int64_t n);
/* out = x · rsqrt(mean(x²) + eps) · w over D elements, fp32 (x and out may alias). */
void ds_cpu_rmsnorm_row(const float *x, const float *w, float eps, int64_t D, float *out);
/* y[i] *= a */
void ds_cpu_scale(float a, float *y, int64_t n);

static inline float ds_cpu_sigmoid(float x) { return 1.0f / (1.0f + __builtin_expf(-x)); }
static inline float ds_cpu_silu(float x) { return x / (1.0f + __builtin_expf(-x)); }

/* ---- ops, one file each ------------------------------------------------------------------- */
void ds_cpu_op_embed(ds_backend *be, const ds_tensor *table, ds_tensor *out);
void ds_cpu_op_rmsnorm(ds_backend *be, const ds_tensor *x, const ds_tensor *w, float eps,
                       ds_tensor *out);
void ds_cpu_op_add_rmsnorm(ds_backend *be, ds_tensor *residual, const ds_tensor *delta,
                           const ds_tensor *w, float eps, ds_tensor *out);
void ds_cpu_op_linear(ds_backend *be, const ds_tensor *x, const ds_linear *w, ds_tensor *out);
void ds_cpu_op_silu_mul(ds_backend *be, const ds_tensor *gate_up, ds_tensor *out);
void ds_cpu_op_gather_rows(ds_backend *be, const ds_tensor *x, ds_tensor *out);
void ds_cpu_op_logits(ds_backend *be, const ds_tensor *x, const ds_linear *lm_head, ds_tensor *out);
void ds_cpu_op_argmax(ds_backend *be, const ds_tensor *logits, int32_t *ids); /* cpu_argmax.c */
/* Lowest index of the maximum of row[0..V); a NaN never wins over a number (all NaN: 0). */
int64_t ds_cpu_argmax_row(const float *row, int64_t V);
void ds_cpu_op_argmax_logits(ds_backend *be, const ds_tensor *x, const ds_linear *lm_head,
                             int32_t *ids, int keep_at);
bool ds_cpu_set_argmax_bans(ds_backend *be, const int32_t *ids, int B, int n_ban);
void ds_cpu_op_copy_tokens(ds_backend *be, int at, int n, int32_t *host);
/* cpu_spec_sample.c: backend.h set_spec_sampling and spec_sample (the reference of
 * cuda_spec_sample.cu). */
void ds_cpu_set_spec_sampling(ds_backend *be, const ds_spec_sampling *seqs, int S);
void ds_cpu_op_spec_sample(ds_backend *be, const ds_tensor *logits, int ids_at);

/* cpu_spec.c: backend.h spec_accept, and set_batch's lowering of a batch with pos_shift /
 * out_shift (cpu->batch then points at cpu->shifted for the lowered arrays). */
void ds_cpu_op_spec_accept(ds_backend *be, int ids_at, int next_at, int m_at, int shift_at);
void ds_cpu_shift_batch(ds_cpu *cpu);
void ds_cpu_op_concat(ds_backend *be, const ds_tensor *a, const ds_tensor *b, ds_tensor *out);

ds_status ds_cpu_cache_create(ds_backend *be, const ds_config *cfg, const ds_cache_desc *desc,
                              ds_cache **out, ds_error *err);
void ds_cpu_cache_free(ds_backend *be, ds_cache *c);
void ds_cpu_cache_reset_slot(ds_backend *be, ds_cache *c, int slot);

void ds_cpu_op_attention(ds_backend *be, ds_cache *c, int layer, const ds_config *cfg,
                         const ds_attn_weights *w, const ds_tensor *qkv, ds_tensor *out);
void ds_cpu_op_gdn(ds_backend *be, ds_cache *c, int layer, const ds_config *cfg,
                   const ds_gdn_weights *w, const ds_tensor *proj, ds_tensor *out);
void ds_cpu_op_moe(ds_backend *be, const ds_config *cfg, const ds_moe_weights *w,
                   const ds_tensor *x, ds_tensor *out);

/* ---- cache layout (cpu_cache.c), used by attention and gdn -------------------------------- */
#define DS_CPU_MAX_CACHE_LAYERS (DS_MAX_LAYERS + 8) /* model layers + MTP layers */
struct ds_cache {
    ds_cache_desc desc;
    int n_layers;                               /* cfg->n_layers + cfg->n_mtp_layers */
    int pool_of_layer[DS_CPU_MAX_CACHE_LAYERS]; /* attention or GDN pool index, -1 if none */
    bool is_attn[DS_CPU_MAX_CACHE_LAYERS];
    int n_attn, n_gdn;
    /* attention */
    int n_kv_heads, head_dim;
    float **k, **v; /* [n_attn] each [n_blocks, block_size, n_kv_heads, head_dim] */
    /* GDN */
    int conv_dim, conv_hist; /* conv_hist = kernel - 1 */
    int gdn_v_heads, gdn_k_dim, gdn_v_dim;
    float **conv;  /* [n_gdn] each [n_slots, conv_dim, conv_hist] */
    float **state; /* [n_gdn] each [n_slots, Hv, dk, dv] */
};

/* cpu_info.c */
const char *ds_cpu_device_name(ds_backend *be);
double ds_cpu_copy_bandwidth_gbps(ds_backend *be);

#endif
