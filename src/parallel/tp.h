/* tp.h — tensor parallelism, CPU reference: N ranks, each a ds_model on its own CPU backend
 * with 1/N of the weights, running the same forward in lock step (Megatron-style, the split
 * vLLM uses for Qwen3.5).
 *
 *   attention  q (with its gate) / k / v column-parallel by heads: nh/N query heads and
 *              nkv/N kv heads per rank (nkv < N: each rank keeps the one kv head its query
 *              heads read, replicated); o_proj row-parallel (its input columns sliced)
 *   GDN        value heads and key heads split (key heads replicated when Hk < N); in_proj
 *              q/k/v/z/b/a rows, conv1d channels, A/dt_bias per head; out_proj row-parallel
 *   MLP        gate/up column-parallel, down row-parallel
 *   MoE        router and shared-expert gate replicated (every rank routes identically); each
 *              expert and the shared expert sliced on the intermediate dim: the block's output
 *              on a rank is a partial sum of down projections
 *   lm_head    vocab-parallel: rank r owns vocab rows [off_r, off_r + V_r); greedy decoding
 *              merges per-rank (max, index) pairs (tp_argmax.c), sampling gathers the logits
 *   embedding, norms  replicated
 * After every row-parallel block the partial [T, H] outputs are all-reduced (fixed rank order,
 * so every rank holds bit-identical sums and the replicated residual streams never drift).
 * TP=1 runs the model unchanged (no all-reduce hook). */
#ifndef DS_TP_H
#define DS_TP_H

#include <stdbool.h>
#include <stdint.h>

#include "core/status.h"
#include "model/config.h"
#include "model/weights.h"

#define DS_TP_MAX_RANKS 64

/* ---- per-rank shapes and weights (tp_shard.c) --------------------------------------------- */

/* The config rank `rank` of n runs: head counts and intermediate sizes divided, vocab = its
 * lm_head shard (*vocab_off = the shard's first global id), no MTP layers. DS_ERR_INVALID_ARG
 * naming the field when n does not divide a sharded size. */
ds_status ds_tp_config_shard(const ds_config *cfg, int rank, int n, ds_config *out,
                             int64_t *vocab_off, ds_error *err);

/* Rank `rank`'s weights: views into `host` where a slice is contiguous rows, copies (same
 * dtype) where it is not (column slices of row-parallel matrices, multi-range row sets). The
 * host weights must outlive the shard. The MTP head is not sharded (w.mtp = NULL). */
typedef struct ds_tp_shard {
    ds_config cfg;      /* per-rank config (ds_tp_config_shard) */
    int64_t vocab_off;  /* first global vocab id of this rank's lm_head rows */
    ds_model_weights w; /* views/copies; w.owner is NULL */
    void **allocs;      /* [n_allocs] memory this shard owns */
    int n_allocs, cap_allocs;
} ds_tp_shard;

ds_status ds_tp_shard_init(ds_tp_shard *s, const ds_config *cfg, const ds_model_weights *host,
                           int rank, int n, ds_error *err);
void ds_tp_shard_free(ds_tp_shard *s);

/* ---- shared-memory all-reduce among rank threads (tp_allreduce.c) ------------------------- */

typedef struct ds_tp_comm ds_tp_comm;

/* n_ranks threads will call the collectives; buffers hold at most max_elems floats. */
ds_status ds_tp_comm_create(int n_ranks, int64_t max_elems, ds_tp_comm **out, ds_error *err);
void ds_tp_comm_destroy(ds_tp_comm *c);
/* Collective: every rank calls it with its own buf [n] (same n). On return every buf holds
 * Σ_r buf_r summed in rank order ((b0 + b1) + b2) + …, bit-identical on all ranks. */
void ds_tp_allreduce_sum(ds_tp_comm *c, int rank, float *buf, int64_t n);
/* Collective barrier. */
void ds_tp_barrier(ds_tp_comm *c);

/* ---- vocab-parallel argmax (tp_argmax.c) --------------------------------------------------- */

/* One rank's candidate for one row: its best logit and that logit's global vocab id, or
 * idx = -1 when the shard has no candidate (every entry NaN, or only padding). */
typedef struct ds_tp_argmax_part {
    float val;
    int64_t idx;
} ds_tp_argmax_part;

/* Local argmax of one shard row: logits [n] for global ids [off, off + n); entries with a global
 * id >= n_valid (padding of an evenly padded shard) never count, nor do NaNs; ties keep the
 * lowest id. */
ds_tp_argmax_part ds_tp_argmax_local(const float *logits, int64_t n, int64_t off, int64_t n_valid);
/* Merges the parts of one row from every rank: the largest value, lowest global id on ties,
 * parts with idx < 0 ignored; equal to the argmax over the full row (lowest index on ties,
 * NaN never wins; an all-NaN row gives 0, as the backends' argmax does). */
int64_t ds_tp_argmax_merge(const ds_tp_argmax_part *parts, int n);

/* ---- the N-rank model (tp_model.c) --------------------------------------------------------- */

typedef struct ds_tp_model ds_tp_model;

typedef struct ds_tp_opts {
    int n_ranks;          /* N >= 1 */
    int threads_per_rank; /* CPU backend threads of each rank (0 = online CPUs / N, at least 1) */
    int max_tokens;       /* rows per step */
    int max_out;          /* logit rows per step */
    int n_slots;          /* concurrent sequences */
    int max_len;          /* tokens per sequence */
} ds_tp_opts;

/* Shards `host` for N ranks and binds each shard to its own CPU backend, model and session.
 * host (and cfg) must outlive the model. */
ds_status ds_tp_model_create(const ds_config *cfg, const ds_model_weights *host,
                             const ds_tp_opts *o, ds_tp_model **out, ds_error *err);
void ds_tp_model_free(ds_tp_model *tp);
int ds_tp_model_ranks(const ds_tp_model *tp);

/* ds_session_feed on every rank at once: n tokens of the sequence in `slot`. When logits is
 * non-NULL it receives the gathered F32 logits [rows, V] (rows = n if all_logits, else 1: the
 * last token); when ids is non-NULL it receives the vocab-parallel argmax of those rows
 * (computed from the shards, never from the gathered logits). */
ds_status ds_tp_feed(ds_tp_model *tp, int slot, const int32_t *tokens, int n, bool all_logits,
                     float *logits, int32_t *ids, ds_error *err);
/* Starts a new sequence in `slot` on every rank. */
void ds_tp_reset(ds_tp_model *tp, int slot);

#endif
