/* cuda_host.h — C-side internals of the CUDA backend shared by cuda_backend.c, cuda_ops.c,
 * cuda_weights.c and cuda_cache.c (never seen by nvcc). */
#ifndef DS_CUDA_HOST_H
#define DS_CUDA_HOST_H

#include "backend/backend.h"
#include "backend/cuda/cuda_internal.h"

ds_cuda_ctx *ds_cuda_ctx_of(ds_backend *be);

/* The CUDA cache: per-layer paged KV pools and GDN state pools (device memory). */
#define DS_CUDA_MAX_CACHE_LAYERS (DS_MAX_LAYERS + 8) /* model layers, then MTP layers */
struct ds_cache {
    int n_slots, n_blocks, block_size;
    int n_layers;                            /* cfg->n_layers + cfg->n_mtp_layers */
    int attn_index[DS_CUDA_MAX_CACHE_LAYERS]; /* layer → attention pool, or -1 */
    int gdn_index[DS_CUDA_MAX_CACHE_LAYERS];  /* layer → GDN pool, or -1 */
    int n_attn, n_gdn;
    int nkv, hd;
    void *kv;              /* [n_attn][2 (K, V)][n_blocks, block_size, nkv, hd] bf16 */
    size_t kv_pool_elems;  /* elements of one K (or V) pool */
    float *state;          /* [n_slots][n_gdn][hv][dk][dv] */
    int64_t state_layer_floats;
    float *conv;           /* [n_slots][n_gdn][hv][2dk + dv][kernel - 1] */
    int64_t conv_layer_floats;
    float *inv_freq;       /* [rot/2] RoPE inverse frequencies, computed on the host */
    float *attn_ws;        /* decode split partials [ws_rows][hd + 2] */
    int attn_ws_rows;
};

/* Layer index of MTP layer i as the attention op expects it. */
static inline int ds_cuda_mtp_layer(const ds_config *cfg, int i) { return cfg->n_layers + i; }

void ds_cuda_set_batch(ds_backend *be, const ds_batch *b);
/* set_batch's upload; shift = 0 leaves out the batch_shift_kernel launch (a replay: the graph
 * has it). */
void ds_cuda_upload_batch(ds_backend *be, const ds_batch *b, int shift);

/* cuda_graph.c: step graphs (backend.h graph_begin / graph_end / graph_launch). */
ds_status ds_cuda_graph_begin(ds_backend *be, uint64_t key, ds_error *err);
ds_status ds_cuda_graph_end(ds_backend *be, ds_error *err);
bool ds_cuda_graph_launch(ds_backend *be, uint64_t key, const ds_batch *b);
void ds_cuda_graphs_free(ds_cuda_ctx *ctx);

/* cuda_weights.c: dummy weights generated on the device (backend.h dummy_weights). */
ds_status ds_cuda_dummy_weights(ds_backend *be, const ds_config *cfg, uint64_t seed,
                                ds_model_weights *out, ds_error *err);

/* Generation descriptor of a placeholder tensor (dummy weights): matrices are uniform with
 * std 1/sqrt(fan_in) (fan_in = the last dim), other tensors uniform in [lo, hi). */
typedef struct ds_cuda_gen {
    int matrix;
    float lo, hi;
} ds_cuda_gen;

/* prepare_weights' walk; gen != 0: `host` holds placeholders whose data points to ds_cuda_gen
 * descriptors and every tensor is generated on the device from `seed`. */
ds_status ds_cuda_build_weights(ds_backend *be, const ds_config *cfg, const ds_model_weights *host,
                                int gen, uint64_t seed, ds_model_weights *out, ds_error *err);

ds_status ds_cuda_prepare_weights(ds_backend *be, const ds_config *cfg,
                                  const ds_model_weights *host, ds_model_weights *out,
                                  ds_error *err);
void ds_cuda_release_weights(ds_backend *be, ds_model_weights *w);

ds_status ds_cuda_cache_create(ds_backend *be, const ds_config *cfg, const ds_cache_desc *desc,
                               ds_cache **out, ds_error *err);
void ds_cuda_cache_free(ds_backend *be, ds_cache *c);
void ds_cuda_cache_reset_slot(ds_backend *be, ds_cache *c, int slot);

void ds_cuda_op_embed(ds_backend *be, const ds_tensor *table, ds_tensor *out);
void ds_cuda_op_rmsnorm(ds_backend *be, const ds_tensor *x, const ds_tensor *w, float eps,
                        ds_tensor *out);
void ds_cuda_op_add_rmsnorm(ds_backend *be, ds_tensor *residual, const ds_tensor *delta,
                            const ds_tensor *w, float eps, ds_tensor *out);
void ds_cuda_op_linear(ds_backend *be, const ds_tensor *x, const ds_linear *w, ds_tensor *out);
void ds_cuda_op_silu_mul(ds_backend *be, const ds_tensor *gate_up, ds_tensor *out);
void ds_cuda_op_gather_rows(ds_backend *be, const ds_tensor *x, ds_tensor *out);
void ds_cuda_op_attention(ds_backend *be, ds_cache *c, int layer, const ds_config *cfg,
                          const ds_attn_weights *w, const ds_tensor *qkv, ds_tensor *out);
void ds_cuda_op_gdn(ds_backend *be, ds_cache *c, int layer, const ds_config *cfg,
                    const ds_gdn_weights *w, const ds_tensor *proj, ds_tensor *out);
void ds_cuda_op_moe(ds_backend *be, const ds_config *cfg, const ds_moe_weights *w,
                    const ds_tensor *x, ds_tensor *out);
bool ds_cuda_op_moe_sublayer(ds_backend *be, const ds_config *cfg, const ds_moe_weights *w,
                             ds_tensor *residual, ds_tensor *delta, const ds_tensor *post_norm_w,
                             const ds_tensor *next_norm_w, float eps, ds_tensor *out,
                             bool may_defer_norm);
void ds_cuda_op_linear_rmsnorm(ds_backend *be, const ds_tensor *residual, const ds_tensor *norm_w,
                               float eps, ds_tensor *normed, const ds_linear *w, ds_tensor *out);
void ds_cuda_op_moe_add_rmsnorm(ds_backend *be, const ds_config *cfg, const ds_moe_weights *w,
                                const ds_tensor *x, ds_tensor *delta, ds_tensor *residual,
                                const ds_tensor *norm_w, float eps, ds_tensor *out);
void ds_cuda_op_logits(ds_backend *be, const ds_tensor *x, const ds_linear *lm_head,
                       ds_tensor *out);
void ds_cuda_op_argmax(ds_backend *be, const ds_tensor *logits, int32_t *ids);
void ds_cuda_op_concat(ds_backend *be, const ds_tensor *a, const ds_tensor *b, ds_tensor *out);
void ds_cuda_op_spec_accept(ds_backend *be, int ids_at, int next_at, int m_at, int shift_at);
void ds_cuda_set_spec_sampling(ds_backend *be, const ds_spec_sampling *seqs, int S);
void ds_cuda_op_spec_sample(ds_backend *be, const ds_tensor *logits, int ids_at);
void ds_cuda_op_copy_tokens(ds_backend *be, int at, int n, int32_t *host);
void ds_cuda_op_argmax_logits(ds_backend *be, const ds_tensor *x, const ds_linear *lm_head,
                              int32_t *ids, int keep_at);
bool ds_cuda_set_argmax_bans(ds_backend *be, const int32_t *ids, int B, int n_ban);

#endif
