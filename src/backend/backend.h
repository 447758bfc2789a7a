/* backend.h — the op table every backend implements (ggml-style: a vtable + opaque context).
 *
 * The Qwen3.5 forward (model/forward.c) is written once against these ops and never knows
 * which backend runs it. Ops are coarse where a fast backend wants to fuse (one `gdn` op covers
 * conv + SiLU + gates + L2-norm + recurrence + gated norm; one `attention` op covers q/k norm +
 * RoPE + KV-cache write + attention + output gate; one `moe` op covers router + experts +
 * shared expert), and plain where fusion buys nothing.
 *
 * Memory: activations passed to ops live in backend memory (be->alloc) and have dtype
 * ops->act_dtype (F32 on the CPU, BF16 on CUDA), except where an op says F32. Weights are the
 * ds_model_weights produced by prepare_weights. Ops never fail on well-formed input: shape
 * mismatches are internal invariants (DS_ASSERT). Device errors are sticky and reported by
 * synchronize(). */
#ifndef DS_BACKEND_H
#define DS_BACKEND_H

#include <stdint.h>

#include "backend/spec_sampling.h"
#include "core/status.h"
#include "core/tensor.h"
#include "model/config.h"
#include "model/weights.h"

/* One step's worth of work: T tokens from S sequences, each sequence's tokens contiguous.
 * All arrays are host memory; set_batch() makes them visible to the ops (a device backend
 * uploads them once per step). */
typedef struct ds_batch {
    int n_tokens;                /* T */
    int n_seqs;                  /* S */
    const int32_t *tokens;       /* [T] token ids */
    const int32_t *positions;    /* [T] absolute position of each token (RoPE, causal mask) */
    const int32_t *seq_start;    /* [S+1] sequence s owns tokens [seq_start[s], seq_start[s+1]) */
    const int32_t *seq_slot;     /* [S] state slot: GDN state row and KV block-table row */
    const int32_t *seq_n_past;   /* [S] tokens already in the caches before this step */
    const int32_t *block_table;  /* [S, max_blocks] physical KV block ids, in position order */
    int max_blocks;              /* row length of block_table */
    int n_out;                   /* rows that need logits */
    const int32_t *out_rows;     /* [n_out] token indices (into [0, T)) that need logits */
    /* Speculative verification (optional; NULL = every sequence updates its seq_slot state in
     * place). [T] state slot per token, or -1. A sequence with at least one entry >= 0 keeps its
     * seq_slot GDN state untouched (only read) and gets its conv history and fp32 recurrent
     * state after token t written to slot state_out_slots[t] for every t whose entry is >= 0, so
     * the caller can continue from the state after the last accepted token without a copy or a
     * recomputation. Entries must differ from the sequence's seq_slot and from each other. A
     * sequence whose entries are all -1 updates seq_slot in place. Attention layers ignore it. */
    const int32_t *state_out_slots;
    /* Tokens that exist only on the device (optional; NULL = every token from tokens): [T],
     * entry ≥ 0 → row t's token is entry token_src[t] of the backend's token buffer, written by
     * an earlier argmax_logits with keep_at ≥ 0 (tokens[t] is then ignored); −1 → tokens[t].
     * Lets a step take the ids of the step before it without the host waiting for them: the
     * MTP draft steps chain their drafts this way, and verification feeds them (spec.h). */
    const int32_t *token_src;
    /* Positions decided on the device (optional; NULL = as given): the MTP draft passes that
     * follow a verification accepted by spec_accept run before the host knows how many tokens
     * were accepted, so their host arrays are written for the case where every draft was
     * accepted and the device lowers them by the shift spec_accept stored (the drafts it
     * rejected). pos_shift [S]: entry ≥ 0 → sequence s's positions and seq_n_past are lowered
     * by entry pos_shift[s] of the backend's shift table; out_shift [n_out]: entry ≥ 0 →
     * out_rows[r] is lowered by entry out_shift[r]; −1 → unchanged. Host-side checks see the
     * unlowered values, an upper bound: the KV blocks they name must exist. */
    const int32_t *pos_shift;
    const int32_t *out_shift;
    /* GDN state slots decided on the device (0 = as given; needs pos_shift): a verification
     * queued before the host read the previous one's count (runner.h "chained steps") names
     * its sequence's current slot and its state_out_slots for the case where every draft of
     * the previous verification was accepted. A sequence's slots form a ring of slot_ring
     * consecutive ids starting at a multiple of slot_ring, used in rotation; sequence s's
     * seq_slot and its tokens' state_out_slots entries ≥ 0 are rotated back by the same shift
     * entry as its positions: slot → base + (slot − base − d) mod slot_ring. */
    int slot_ring;
} ds_batch;

/* ds_batch.slot_ring: slot rotated back by d places within its ring of R (every backend's
 * lowering, and the runner's reference of it). */
static inline int32_t ds_slot_ring_back(int32_t slot, int R, int32_t d) {
    const int32_t base = slot - slot % R;
    return base + (int32_t)((((slot - base - d) % R) + R) % R);
}

/* Entries of every backend's token buffer (ds_batch.token_src, argmax_logits keep_at). */
#define DS_TOKEN_BUF 8192
/* Entries of every backend's shift table (spec_accept, ds_batch.pos_shift / out_shift). */
#define DS_SHIFT_TABLE 4096


/* Sizes of the per-sequence caches: KV blocks for attention layers, one GDN state slot
 * (conv history + fp32 recurrent state) per slot for linear-attention layers. */
typedef struct ds_cache_desc {
    int n_slots;     /* concurrent sequences */
    int n_blocks;    /* KV blocks in the pool (shared by all slots) */
    int block_size;  /* tokens per KV block */
} ds_cache_desc;

typedef struct ds_backend ds_backend;
typedef struct ds_cache ds_cache; /* backend-private: KV pools + GDN state pools */

typedef struct ds_backend_ops {
    const char *name;
    ds_dtype act_dtype;

    void (*destroy)(ds_backend *be);

    /* Memory. alloc returns NULL on failure (zeroed memory). */
    void *(*alloc)(ds_backend *be, size_t bytes);
    void (*free)(ds_backend *be, void *p);
    void (*upload)(ds_backend *be, void *dst, const void *src, size_t bytes);
    void (*download)(ds_backend *be, void *dst, const void *src, size_t bytes);
    ds_status (*synchronize)(ds_backend *be, ds_error *err);

    /* Weights: builds `out` (views valid until release_weights) from host weights. The CPU
     * backend aliases the host memory; a device backend copies, converts and fuses. */
    ds_status (*prepare_weights)(ds_backend *be, const ds_config *cfg, const ds_model_weights *host,
                                 ds_model_weights *out, ds_error *err);
    void (*release_weights)(ds_backend *be, ds_model_weights *w);

    /* Caches. A slot's GDN state must be reset before a new sequence uses it. */
    ds_status (*cache_create)(ds_backend *be, const ds_config *cfg, const ds_cache_desc *desc,
                              ds_cache **out, ds_error *err);
    void (*cache_free)(ds_backend *be, ds_cache *c);
    void (*cache_reset_slot)(ds_backend *be, ds_cache *c, int slot);

    /* Makes the batch metadata current for the following ops. */
    void (*set_batch)(ds_backend *be, const ds_batch *b);

    /* out[T, H] = table[tokens[t]] (table [V, H] in any float dtype). */
    void (*embed)(ds_backend *be, const ds_tensor *table, ds_tensor *out);
    /* out = x · rsqrt(mean(x²) + eps) · w over the last dim; x [R, D], w F32 [D]. */
    void (*rmsnorm)(ds_backend *be, const ds_tensor *x, const ds_tensor *w, float eps, ds_tensor *out);
    /* residual += delta; out = rmsnorm(residual). residual/delta/out [T, H]. */
    void (*add_rmsnorm)(ds_backend *be, ds_tensor *residual, const ds_tensor *delta,
                        const ds_tensor *w, float eps, ds_tensor *out);
    /* out[R, n_out] = x[R, n_in] · Wᵀ (parts concatenated along the output). */
    void (*linear)(ds_backend *be, const ds_tensor *x, const ds_linear *w, ds_tensor *out);
    /* out[R, I] = SiLU(gu[:, :I]) ⊙ gu[:, I:]; gu [R, 2I]. */
    void (*silu_mul)(ds_backend *be, const ds_tensor *gate_up, ds_tensor *out);
    /* out[R, H] = x[rows[r], :] for the batch's out_rows. */
    void (*gather_rows)(ds_backend *be, const ds_tensor *x, ds_tensor *out);

    /* Gated attention core for layer `layer` (an index into cfg->layer_types):
     * qkv [T, nh·hd·2 + 2·nkv·hd] (q_proj|k_proj|v_proj outputs) → out [T, nh·hd]:
     * q/k RMSNorm, partial NeoX RoPE at the batch positions, K/V written to the paged cache,
     * causal GQA softmax attention over cache + new tokens, times sigmoid(gate). */
    void (*attention)(ds_backend *be, ds_cache *c, int layer, const ds_config *cfg,
                      const ds_attn_weights *w, const ds_tensor *qkv, ds_tensor *out);

    /* Gated DeltaNet core for layer `layer`: proj [T, conv_dim + Hv·dv + 2·Hv] (in_proj output
     * q|k|v, z, b, a) → out [T, Hv·dv] (gated-RMSNormed, before out_proj). Updates the slot's
     * conv history and fp32 recurrent state. */
    void (*gdn)(ds_backend *be, ds_cache *c, int layer, const ds_config *cfg,
                const ds_gdn_weights *w, const ds_tensor *proj, ds_tensor *out);

    /* Sparse MoE block: out[T, H] = Σ_topk w_e·expert_e(x) + sigmoid(x·w_sg)·shared(x). */
    void (*moe)(ds_backend *be, const ds_config *cfg, const ds_moe_weights *w, const ds_tensor *x,
                ds_tensor *out);

    /* logits F32 [R, V] = x[R, H] · lm_headᵀ. */
    void (*logits)(ds_backend *be, const ds_tensor *x, const ds_linear *lm_head, ds_tensor *out);
    /* ids[r] = argmax_v logits[r, v] (lowest index on ties); logits F32 [R, V]; ids host [R]. */
    void (*argmax)(ds_backend *be, const ds_tensor *logits, int32_t *ids);

    /* ---- optional (NULL when a backend does not provide them) ---------------------------- */

    /* The MoE block fused with the residual add + RMSNorm after it: residual += moe(x);
     * out = rmsnorm(residual)·norm_w — the same bits as moe into delta, then add_rmsnorm.
     * delta [T, H] is scratch (the unfused path, DS_OPT_FUSED_NORM=0); x and out may alias (x is
     * read before out is written). */
    void (*moe_add_rmsnorm)(ds_backend *be, const ds_config *cfg, const ds_moe_weights *w,
                            const ds_tensor *x, ds_tensor *delta, ds_tensor *residual,
                            const ds_tensor *norm_w, float eps, ds_tensor *out);
    /* The FFN half of a MoE layer: residual += delta (the mixer's output);
     * out = rmsnorm(residual)·post_norm_w (the MoE's input); residual += moe(out);
     * out = rmsnorm(residual)·next_norm_w — the same bits as add_rmsnorm then moe_add_rmsnorm.
     * delta is scratch afterwards. With may_defer_norm (only when linear_rmsnorm exists) the
     * backend may leave the last norm out: it returns true when out does not hold
     * rmsnorm(residual)·next_norm_w, which the caller then gets from linear_rmsnorm. */
    bool (*moe_sublayer)(ds_backend *be, const ds_config *cfg, const ds_moe_weights *w,
                         ds_tensor *residual, ds_tensor *delta, const ds_tensor *post_norm_w,
                         const ds_tensor *next_norm_w, float eps, ds_tensor *out,
                         bool may_defer_norm);
    /* normed = rmsnorm(residual)·norm_w; out = normed · Wᵀ — the same bits as rmsnorm then
     * linear (a backend folds the norm into the projection's launch where it can). */
    void (*linear_rmsnorm)(ds_backend *be, const ds_tensor *residual, const ds_tensor *norm_w,
                           float eps, ds_tensor *normed, const ds_linear *w, ds_tensor *out);

    /* Seeded random weights of realistic scale for cfg, created directly in backend memory, so
     * full-size shapes can be benchmarked without a checkpoint (NULL: the model code generates
     * host weights and calls prepare_weights). Freed by release_weights. */
    ds_status (*dummy_weights)(ds_backend *be, const ds_config *cfg, uint64_t seed,
                               ds_model_weights *out, ds_error *err);
    /* Measured copy bandwidth of the backend's memory in GB/s (bytes read + written per
     * second), the roofline the benchmarks report against. */
    double (*copy_bandwidth_gbps)(ds_backend *be);
    /* Kernels launched since the last call (resets the counter); for per-step counts. */
    uint64_t (*take_launch_count)(ds_backend *be);
    /* Human-readable device name ("NVIDIA H200", "cpu: 16 threads"). */
    const char *(*device_name)(ds_backend *be);
    /* out[R, A + B] = [a | b] row by row; a [R, A], b [R, B], all activation dtype. The MTP
     * head's fc input [RMSNorm(embed(t+1)) ; RMSNorm(h_t)]; the MTP needs it (NULL: no MTP). */
    void (*concat)(ds_backend *be, const ds_tensor *a, const ds_tensor *b, ds_tensor *out);

    /* Greedy head without logits: ids[r] = argmax_v (x[r]·lm_headᵀ)[v] for the R rows of
     * x [R, H] (lowest index on ties, NaN never wins), never materialising the logits. ids is
     * host memory [R], written by the time the next synchronize() returns (a device backend
     * copies them back asynchronously, so the op can sit inside a captured step graph).
     * keep_at ≥ 0 also keeps the ids on the device, at entries [keep_at, keep_at + R) of the
     * token buffer (keep_at + R ≤ DS_TOKEN_BUF), for later batches' token_src; −1 keeps none.
     * Several calls may be pending (not yet synchronized) at once, each into its own ids, as
     * long as at most one of them has keep_at = −1 and their kept ranges do not overlap.
     * ids NULL (with keep_at ≥ 0): the ids stay on the device only (copy_tokens reads them). */
    void (*argmax_logits)(ds_backend *be, const ds_tensor *x, const ds_linear *lm_head,
                          int32_t *ids, int keep_at);
    /* host[0, n) = token-buffer entries [at, at + n) as they are once the ops queued before
     * this call have run; written by the next synchronize / wait_mark (a device backend copies
     * them asynchronously, in one copy). At most two calls may be pending at once (two
     * speculative steps in flight). NULL when the backend has no argmax_logits. */
    void (*copy_tokens)(ds_backend *be, int at, int n, int32_t *host);
    /* Banned ids of argmax_logits (catalogue item 6: min_tokens masks without host
     * round-trips; NULL when the backend has no argmax_logits). ids [B, n_ban] host, row r
     * padded with -1 (any id outside [0, V) is ignored): from now on argmax_logits row r < B
     * returns the argmax over the ids its table row does not list (lowest index on ties, NaN
     * never wins); rows ≥ B are unbanned. When no id is left (every id banned, or all the
     * others NaN) the row gets the plain argmax. B = 0 or n_ban = 0 clears the table.
     * The table is copied at once (outside any graph recording, like set_batch) into a backend
     * buffer at a fixed address together with B and n_ban, which the device reads at every
     * argmax_logits: a recorded graph replays with whatever table is current, and nothing is
     * uploaded unless this is called. The table is one per backend: the caller owns it.
     * Returns false, with the table cleared, when B·n_ban exceeds the backend's capacity (at
     * least 256 rows of 136 ids). */
    bool (*set_argmax_bans)(ds_backend *be, const int32_t *ids, int B, int n_ban);
    /* Greedy acceptance of a verification on the device (issue 5's "no host round-trips";
     * NULL: the host accepts). The current batch is the verification just run: sequence s
     * feeds its last token then its n_s = rows − 1 drafts at rows [seq_start[s],
     * seq_start[s+1]), all of them output rows, and each row's target argmax is at token-buffer
     * entry ids_at + row (argmax_logits keep_at = ids_at). For each sequence: m_s = 1 + the
     * number of leading drafts equal to the target id of the row before them (the tokens it
     * emits: accepted drafts, then the correction / bonus). Writes token-buffer entry
     * next_at + row = the target id of row min(row, seq_start[s] + m_s − 1), each row's next
     * token for the MTP pass over the verified rows; token-buffer entry m_at + s = m_s (the
     * host reads the ids and counts through copy_tokens); shift-table entry
     * shift_at + 2s = r_s = rows − m_s (the drafts rejected: for the draft passes' pos_shift /
     * out_shift, and a chained verification's) and entry shift_at + 2s + 1 = r_s plus the shift
     * the verification itself was lowered by (its pos_shift entry, 0 when none): where a draft
     * pass queued behind it must be lowered when the verification was queued on a guess too.
     * The entries read must not be among those written. Ranges must fit DS_TOKEN_BUF and
     * DS_SHIFT_TABLE. Finishes (EOS, max_tokens) are the host's: it learns them from the ids
     * and discards what the device drafted past them. */
    void (*spec_accept)(ds_backend *be, int ids_at, int next_at, int m_at, int shift_at);
    /* Per-sequence parameters of spec_sample: row s of seqs for the current batch's sequence
     * s (S ≤ DS_SPEC_SAMPLING_MAX; S = 0 clears). Copied at once, outside any graph recording,
     * to a fixed backend address that every spec_sample reads (a recorded graph replays with
     * the current table), ordered after the ops queued before it. NULL when the backend has
     * no spec_sample. */
    void (*set_spec_sampling)(ds_backend *be, const ds_spec_sampling *seqs, int S);
    /* Target ids of a sampled verification, so that spec_accept's leading-match rule is
     * speculative sampling against deterministic drafts (issue 5: no host round trip for
     * temperature > 0). The current batch is the verification; logits [T, V] f32 are its rows
     * (row t = batch row t). Row t of sequence s, whose token sits at position p_t (as lowered
     * on the device), decides the token at p_t + 1 from P = the sampling table's row s.
     *  - P.temperature ≤ 0: the argmax (lowest id on ties, NaN never wins).
     *  - else z = logits[t] · (1 / P.temperature) (float); survivors: z ≥ max z + log(min_p)
     *    when min_p > 0; z at least the top_k-th largest z when 0 < top_k < V; and, of those
     *    (weights w = exp(z − max z), total W), z at least the largest value c such that the
     *    survivors with z ≥ c weigh ≥ top_p · W when top_p < 1. Ties at a threshold all
     *    survive; NaN never does. p = w / (their total) over the survivors, 0 elsewhere.
     *    The id is the inverse CDF of p, in id order, at u = ds_crng_uniform(k, DS_CRNG_DRAW)
     *    with the key k = ds_crng_key(P.seed, p_t + 1): the lowest id whose cumulative weight
     *    over the survivors exceeds u times their total (rounding: the last with weight). The
     *    host (runtime/spec.c ds_spec_verify) draws the same numbers the same way.
     * So each row's id is distributed as p, and a row's draft d (the token of row t + 1) is
     * accepted when it equals the id: with probability p(d), as the standard rule for a one-hot
     * proposal accepts it (accept with p(d), else draw from max(0, p − δ_d)). Unlike that rule,
     * the id does not depend on d nor on whether the row has a draft, so a seeded request's
     * tokens do not depend on how many drafts its steps had. Writes token-buffer entry ids_at + t
     * for every row (spec_accept's ids_at). A row whose largest z is not finite gets the plain
     * argmax (0 when all NaN). */
    void (*spec_sample)(ds_backend *be, const ds_tensor *logits, int ids_at);
    /* A wait for part of the queued work (NULL: the backend finishes every op before returning,
     * and its host outputs are written at once). mark() notes the current point of the queue;
     * wait_mark() returns once the device has passed the last mark, with the host outputs of the
     * ops queued before it (argmax_logits ids, spec_accept counts) written; those of later ops
     * stay pending until a later synchronize or wait_mark. Not during a graph recording. Device
     * errors are reported as by synchronize. Lets the host accept a verification while the
     * device still runs the draft passes queued after it. */
    void (*mark)(ds_backend *be);
    ds_status (*wait_mark)(ds_backend *be, ds_error *err);

    /* Step graphs (all three or none). graph_begin(key) starts recording: the ops that follow
     * are recorded, not run, except set_batch, whose upload happens at once and stays out of
     * the recording. graph_end() instantiates the recording, keeps it under key and runs it once
     * (that run is the step's work); on failure (an op that waits for the device was called,
     * or the device refused) nothing of the step ran, the error says why, and the caller runs
     * the step eagerly. graph_launch(key, b) makes b current (set_batch, outside the graph) and
     * replays key's recording; it returns false, doing nothing, when key has no graph or b's
     * shape (tokens, sequences, outputs, block-table width, tokens per sequence) differs from
     * the captured batch's. A replay reads the same backend buffers and writes host outputs
     * (argmax_logits ids) to the same host memory as the captured ops did, so the key must
     * name everything the recording depends on besides the batch shape (model, cache, host
     * output buffer): one key space per backend, chosen by its single user. Freeing any
     * backend buffer (free, cache_free, release_weights) drops every graph. */
    ds_status (*graph_begin)(ds_backend *be, uint64_t key, ds_error *err);
    ds_status (*graph_end)(ds_backend *be, ds_error *err);
    bool (*graph_launch)(ds_backend *be, uint64_t key, const ds_batch *b);
    /* Bytes of device memory free right now (what caches may still take); 0 when unknown. */
    size_t (*free_memory)(ds_backend *be);
} ds_backend_ops;

struct ds_backend {
    const ds_backend_ops *ops;
    void *impl; /* backend-private context */
};

/* CPU reference backend: fp32 math, n_threads workers (0 = all cores). */
ds_status ds_backend_cpu_create(int n_threads, ds_backend **out, ds_error *err);

/* CUDA backend (only when built with CUDA; returns DS_ERR_UNSUPPORTED otherwise). */
ds_status ds_backend_cuda_create(int device, ds_backend **out, ds_error *err);

#endif
