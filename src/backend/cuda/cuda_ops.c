/* cuda_ops.c — the op table entries: shape checks (DS_ASSERT: shapes are internal invariants)
 * on the host, then the launchers of cuda_*.cu. Nothing here synchronises except argmax,
 * which must hand ids back to the host (and set_argmax_bans, which waits for its own previous
 * upload before reusing the staging buffer). */
#include <math.h>
#include <string.h>

#include "backend/cuda/cuda_host.h"

static int64_t last_dim(const ds_tensor *t) { return t->ne[t->ndim - 1]; }
static int64_t n_rows(const ds_tensor *t) { return ds_tensor_numel(t) / last_dim(t); }

void ds_cuda_op_embed(ds_backend *be, const ds_tensor *table, ds_tensor *out) {
    ds_cuda_ctx *c = ds_cuda_ctx_of(be);
    DS_ASSERT(table->ndim == 2 && out->dtype == DS_DTYPE_BF16);
    DS_ASSERT(table->dtype == DS_DTYPE_BF16 || table->dtype == DS_DTYPE_F32 ||
              table->dtype == DS_DTYPE_F16);
    const int64_t H = table->ne[1];
    DS_ASSERT(last_dim(out) == H && n_rows(out) >= c->batch.n_tokens);
    ds_cuda_embed(c, table->data, (int)table->dtype, table->ne[0], H, out->data);
}

void ds_cuda_op_rmsnorm(ds_backend *be, const ds_tensor *x, const ds_tensor *w, float eps,
                        ds_tensor *out) {
    DS_ASSERT(x->dtype == DS_DTYPE_BF16 && out->dtype == DS_DTYPE_BF16 && w->dtype == DS_DTYPE_F32);
    const int64_t D = last_dim(x);
    DS_ASSERT(ds_tensor_numel(w) == D && ds_tensor_numel(out) >= ds_tensor_numel(x));
    ds_cuda_rmsnorm(ds_cuda_ctx_of(be), x->data, w->data, eps, n_rows(x), D, out->data);
}

void ds_cuda_op_add_rmsnorm(ds_backend *be, ds_tensor *residual, const ds_tensor *delta,
                            const ds_tensor *w, float eps, ds_tensor *out) {
    DS_ASSERT(residual->dtype == DS_DTYPE_BF16 && delta->dtype == DS_DTYPE_BF16 &&
              out->dtype == DS_DTYPE_BF16 && w->dtype == DS_DTYPE_F32);
    const int64_t D = last_dim(residual);
    DS_ASSERT(ds_tensor_numel(w) == D && ds_tensor_numel(delta) == ds_tensor_numel(residual) &&
              ds_tensor_numel(out) >= ds_tensor_numel(residual));
    ds_cuda_add_rmsnorm(ds_cuda_ctx_of(be), residual->data, delta->data, w->data, eps,
                        n_rows(residual), D, out->data);
}

/* out[R, n_out] (bf16, or f32 for logits) = x[R, n_in] · Wᵀ over the parts of w. */
static void linear_any(ds_cuda_ctx *c, const ds_tensor *x, const ds_linear *w, ds_tensor *out,
                       int out_f32, int lm_head) {
    DS_ASSERT(x->dtype == DS_DTYPE_BF16);
    DS_ASSERT(out->dtype == (out_f32 ? DS_DTYPE_F32 : DS_DTYPE_BF16));
    const int64_t K = w->n_in, N = w->n_out;
    DS_ASSERT(last_dim(x) == K && last_dim(out) == N);
    const int64_t R = n_rows(x);
    DS_ASSERT(n_rows(out) >= R);
    if (R == 0) return;
    const size_t osz = out_f32 ? 4 : 2;
    int64_t col = 0;
    for (int p = 0; p < w->n_parts; p++) {
        const ds_tensor *wp = &w->parts[p];
        DS_ASSERT(wp->dtype == DS_DTYPE_BF16 && wp->ndim == 2 && wp->ne[1] == K);
        const int64_t Np = wp->ne[0];
        char *o = (char *)out->data + (size_t)col * osz;
        const int aligned = K % 8 == 0 && ((uintptr_t)x->data % 16) == 0 &&
                            ((uintptr_t)wp->data % 16) == 0;
        for (int64_t r0 = 0; r0 < R;) {
            /* the GEMV serves up to 8 rows; more rows go to cuBLASLt in one GEMM */
            if (R <= DS_CUDA_GEMV_MAX_ROWS && aligned) {
                if (!lm_head) ds_cuda_gemv(c, wp->data, Np, K, x->data, K, (int)R, o, N, out_f32);
                else if (!(ds_cuda_lm_head_tc(c, Np, K) &&
                           ds_cuda_gemv_tc(c, wp->data, Np, K, x->data, K, (int)R, o, N, out_f32)))
                    ds_cuda_gemv_cores(c, wp->data, Np, K, x->data, K, (int)R, o, N, out_f32);
                r0 = R;
            } else {
                const int64_t n = R - r0 > (1 << 30) ? (1 << 30) : R - r0;
                ds_cuda_gemm_lt(c, wp->data, Np, K, (const char *)x->data + (size_t)r0 * K * 2, K,
                                (int)n, o + (size_t)r0 * N * osz, N, out_f32);
                r0 += n;
            }
        }
        col += Np;
    }
    DS_ASSERT(col == N);
}

void ds_cuda_op_linear(ds_backend *be, const ds_tensor *x, const ds_linear *w, ds_tensor *out) {
    linear_any(ds_cuda_ctx_of(be), x, w, out, 0, 0);
}

void ds_cuda_op_logits(ds_backend *be, const ds_tensor *x, const ds_linear *lm_head,
                       ds_tensor *out) {
    /* the kernel argmax_logits uses (ds_cuda_lm_head_tc): greedy ids from these logits equal
     * its ids (the same dot products) */
    linear_any(ds_cuda_ctx_of(be), x, lm_head, out, 1, 1);
}

void ds_cuda_op_silu_mul(ds_backend *be, const ds_tensor *gate_up, ds_tensor *out) {
    DS_ASSERT(gate_up->dtype == DS_DTYPE_BF16 && out->dtype == DS_DTYPE_BF16);
    const int64_t I = last_dim(out);
    DS_ASSERT(last_dim(gate_up) == 2 * I && n_rows(out) >= n_rows(gate_up));
    ds_cuda_silu_mul(ds_cuda_ctx_of(be), gate_up->data, n_rows(gate_up), I, out->data);
}

void ds_cuda_op_gather_rows(ds_backend *be, const ds_tensor *x, ds_tensor *out) {
    ds_cuda_ctx *c = ds_cuda_ctx_of(be);
    DS_ASSERT(x->dtype == out->dtype && last_dim(x) == last_dim(out));
    DS_ASSERT(n_rows(out) >= c->batch.n_out);
    ds_cuda_gather_rows(c, x->data, last_dim(x), (int)ds_dtype_size(x->dtype), out->data);
}

void ds_cuda_op_argmax(ds_backend *be, const ds_tensor *logits, int32_t *ids) {
    ds_cuda_ctx *c = ds_cuda_ctx_of(be);
    DS_ASSERT(logits->dtype == DS_DTYPE_F32);
    const int64_t V = last_dim(logits), R = n_rows(logits);
    DS_ASSERT(R <= DS_CUDA_MAX_TOKENS);
    if (R == 0 || ds_cuda_refuse_in_capture(c, "argmax")) return;
    ds_cuda_argmax(c, logits->data, (int)R, V, c->d_ids);
    DS_CU(c, cudaMemcpyAsync(c->h_ids, c->d_ids, sizeof(int32_t) * (size_t)R,
                             cudaMemcpyDeviceToHost, c->stream));
    DS_CU(c, cudaStreamSynchronize(c->stream));
    if (c->failed) memset(ids, 0, sizeof(int32_t) * (size_t)R); /* error reported by synchronize */
    else memcpy(ids, c->h_ids, sizeof(int32_t) * (size_t)R);
}

/* Registers a host output the stream is copying into pinned memory: delivered at the next
 * synchronize, or recorded into the graph being captured (handed over at each replay). */
static void host_out_add(ds_cuda_ctx *c, int32_t *host, const int32_t *pinned, int n) {
    ds_cuda_outs *outs = c->capturing ? &c->cap_outs : &c->pending;
    for (int i = 0; i < outs->n; i++) /* at most one output through h_ids (keep_at = -1) */
        DS_ASSERT(!(pinned == c->h_ids && outs->o[i].pinned == c->h_ids));
    if (outs->n == DS_CUDA_MAX_OUTS) {
        ds_cuda_check(c, cudaErrorInvalidValue, "argmax_logits: too many host outputs pending",
                      __FILE__, __LINE__);
        return;
    }
    outs->o[outs->n++] = (ds_cuda_host_out){host, pinned, n};
}

/* ids[r] = argmax of x[r]·lm_headᵀ without logits (one fused GEMV + argmax per 8 rows). The
 * ids reach the host at the next synchronize (pinned copy on the stream), so the op can be
 * recorded in a step graph; keep_at ≥ 0 writes them into the token buffer (backend.h) and
 * copies them from there. */
void ds_cuda_op_argmax_logits(ds_backend *be, const ds_tensor *x, const ds_linear *lm_head,
                              int32_t *ids, int keep_at) {
    ds_cuda_ctx *c = ds_cuda_ctx_of(be);
    DS_ASSERT(x->dtype == DS_DTYPE_BF16 && lm_head->n_parts == 1);
    const ds_tensor *w = &lm_head->parts[0];
    const int64_t K = lm_head->n_in, N = lm_head->n_out, R = n_rows(x);
    DS_ASSERT(last_dim(x) == K && w->dtype == DS_DTYPE_BF16 && w->ndim == 2 && w->ne[0] == N &&
              w->ne[1] == K);
    DS_ASSERT(R <= DS_CUDA_MAX_TOKENS && N <= (int64_t)DS_CUDA_AMAX_BLOCKS * 16);
    DS_ASSERT(K % 8 == 0 && (uintptr_t)x->data % 16 == 0 && (uintptr_t)w->data % 16 == 0);
    DS_ASSERT(keep_at < 0 || keep_at + R <= DS_TOKEN_BUF);
    DS_ASSERT(ids || keep_at >= 0);
    if (R == 0) return;
    int32_t *d = keep_at >= 0 ? c->d_tokbuf + keep_at : c->d_ids;
    int32_t *h = keep_at >= 0 ? c->h_tokbuf + keep_at : c->h_ids;
    ds_cuda_argmax_gemv(c, w->data, N, K, x->data, K, (int)R, d);
    if (!ids) return; /* kept on the device only */
    DS_CU(c, cudaMemcpyAsync(h, d, sizeof(int32_t) * (size_t)R, cudaMemcpyDeviceToHost, c->stream));
    host_out_add(c, ids, h, (int)R);
}

/* backend.h copy_tokens: one async copy of the entries into the next of DS_CUDA_COPY_BUFS
 * pinned buffers (each call its own, so a copy the stream makes for a later step never
 * overwrites bytes the host has yet to take from an earlier one), delivered at the next wait.
 * Not in a graph recording: its pinned buffer changes from call to call. */
void ds_cuda_op_copy_tokens(ds_backend *be, int at, int n, int32_t *host) {
    ds_cuda_ctx *c = ds_cuda_ctx_of(be);
    DS_ASSERT(at >= 0 && n >= 0 && at + n <= DS_TOKEN_BUF && (host || n == 0));
    if (n == 0 || ds_cuda_refuse_in_capture(c, "copy_tokens")) return;
    int32_t *pin = c->h_copy[c->copy_flip];
    c->copy_flip = (c->copy_flip + 1) % DS_CUDA_COPY_BUFS;
    for (int i = 0; i < c->pending.n; i++)
        if (c->pending.o[i].pinned >= pin && c->pending.o[i].pinned < pin + DS_TOKEN_BUF) {
            ds_cuda_check(c, cudaErrorInvalidValue, "copy_tokens: too many copies pending",
                          __FILE__, __LINE__);
            return;
        }
    DS_CU(c, cudaMemcpyAsync(pin, c->d_tokbuf + at, sizeof(int32_t) * (size_t)n,
                             cudaMemcpyDeviceToHost, c->stream));
    host_out_add(c, host, pin, n);
}

/* backend.h spec_accept: the kernel (cuda_spec.cu); the host reads m through copy_tokens. */
void ds_cuda_op_spec_accept(ds_backend *be, int ids_at, int next_at, int m_at, int shift_at) {
    ds_cuda_ctx *c = ds_cuda_ctx_of(be);
    const int S = c->batch.n_seqs, T = c->batch.n_tokens;
    DS_ASSERT(shift_at >= 0 && shift_at + 2 * S <= DS_SHIFT_TABLE && ids_at >= 0 &&
              ids_at + T <= DS_TOKEN_BUF && next_at >= 0 && next_at + T <= DS_TOKEN_BUF &&
              m_at >= 0 && m_at + S <= DS_TOKEN_BUF);
    if (S == 0) return;
    ds_cuda_spec_accept(c, ids_at, next_at, m_at, shift_at);
}

/* The banned-id table of argmax_logits (backend.h): header + table packed into pinned staging
 * and copied with one async copy into d_bans, whose address never changes (graphs recorded
 * the pointer, the kernel reads the sizes from the header). Before the staging is refilled the
 * previous copy from it must be done; uploads happen only when the caller's table changed, so
 * that wait is normally over long ago. During a capture the copy goes to the side stream and is
 * waited for (not recorded), as set_batch's. */
bool ds_cuda_set_argmax_bans(ds_backend *be, const int32_t *ids, int B, int n_ban) {
    ds_cuda_ctx *c = ds_cuda_ctx_of(be);
    DS_ASSERT(B >= 0 && n_ban >= 0 && (B == 0 || n_ban == 0 || ids));
    const int64_t n = (int64_t)B * n_ban;
    const bool fits = n <= DS_CUDA_BAN_INTS;
    if (n == 0 || !fits) B = n_ban = 0; /* cleared */
    DS_CU(c, cudaEventSynchronize(c->bans_done));
    int32_t *h = c->h_bans;
    h[0] = B;
    h[1] = n_ban;
    if (B > 0) memcpy(h + 2, ids, sizeof(int32_t) * (size_t)n);
    const size_t bytes = sizeof(int32_t) * (size_t)(2 + (B > 0 ? n : 0));
    if (c->capturing) {
        DS_CU(c, cudaMemcpyAsync(c->d_bans, h, bytes, cudaMemcpyHostToDevice, c->side));
        DS_CU(c, cudaStreamSynchronize(c->side));
    } else {
        DS_CU(c, cudaMemcpyAsync(c->d_bans, h, bytes, cudaMemcpyHostToDevice, c->stream));
        DS_CU(c, cudaEventRecord(c->bans_done, c->stream));
    }
    return fits;
}

/* spec_sample's table (backend.h set_spec_sampling): as the ban table, pinned staging and one
 * async copy to d_samp, whose address graphs recorded. */
void ds_cuda_set_spec_sampling(ds_backend *be, const ds_spec_sampling *seqs, int S) {
    ds_cuda_ctx *c = ds_cuda_ctx_of(be);
    DS_ASSERT(S >= 0 && S <= DS_SPEC_SAMPLING_MAX && (S == 0 || seqs));
    if (S == 0) return; /* spec_sample reads only the rows of the batch's sequences */
    DS_CU(c, cudaEventSynchronize(c->samp_done));
    memcpy(c->h_samp, seqs, sizeof(ds_spec_sampling) * (size_t)S);
    const size_t bytes = sizeof(ds_spec_sampling) * (size_t)S;
    if (c->capturing) {
        DS_CU(c, cudaMemcpyAsync(c->d_samp, c->h_samp, bytes, cudaMemcpyHostToDevice, c->side));
        DS_CU(c, cudaStreamSynchronize(c->side));
    } else {
        DS_CU(c, cudaMemcpyAsync(c->d_samp, c->h_samp, bytes, cudaMemcpyHostToDevice, c->stream));
        DS_CU(c, cudaEventRecord(c->samp_done, c->stream));
    }
}

/* backend.h spec_sample: the kernel (cuda_spec_sample.cu). */
void ds_cuda_op_spec_sample(ds_backend *be, const ds_tensor *logits, int ids_at) {
    ds_cuda_ctx *c = ds_cuda_ctx_of(be);
    const int T = c->batch.n_tokens;
    DS_ASSERT(logits->dtype == DS_DTYPE_F32 && logits->ndim == 2 && logits->ne[0] == T &&
              ids_at >= 0 && ids_at + T <= DS_TOKEN_BUF && c->batch.n_seqs <= DS_SPEC_SAMPLING_MAX);
    ds_cuda_spec_sample(c, (const float *)logits->data, logits->ne[1], ids_at);
}

void ds_cuda_op_concat(ds_backend *be, const ds_tensor *a, const ds_tensor *b, ds_tensor *out) {
    DS_ASSERT(a->dtype == DS_DTYPE_BF16 && b->dtype == DS_DTYPE_BF16 && out->dtype == DS_DTYPE_BF16);
    const int64_t A = last_dim(a), B = last_dim(b), R = n_rows(a);
    DS_ASSERT(n_rows(b) == R && last_dim(out) == A + B && n_rows(out) >= R);
    ds_cuda_concat(ds_cuda_ctx_of(be), a->data, A, b->data, B, R, out->data);
}

/* Host-side checks of the batch against the cache: slots and, for attention, the blocks the
 * new tokens are written to. */
static void check_batch_slots(const ds_cuda_ctx *c, const ds_cache *cache) {
    const int32_t *slot = c->h_cur + c->h_seq_slot_off;
    for (int s = 0; s < c->batch.n_seqs; s++) DS_ASSERT(slot[s] >= 0 && slot[s] < cache->n_slots);
    if (c->h_state_out_off < 0) return;
    /* snapshot slots (speculative verification): in range, not the sequence's own slot, distinct
     * within the sequence */
    const int32_t *so = c->h_cur + c->h_state_out_off;
    const int32_t *start = c->h_cur + c->h_seq_start_off;
    for (int s = 0; s < c->batch.n_seqs; s++)
        for (int t = start[s]; t < start[s + 1]; t++) {
            if (so[t] < 0) continue;
            DS_ASSERT(so[t] < cache->n_slots && so[t] != slot[s]);
            for (int u = start[s]; u < t; u++) DS_ASSERT(so[u] != so[t]);
        }
}

void ds_cuda_op_attention(ds_backend *be, ds_cache *cache, int layer, const ds_config *cfg,
                          const ds_attn_weights *w, const ds_tensor *qkv, ds_tensor *out) {
    ds_cuda_ctx *c = ds_cuda_ctx_of(be);
    DS_ASSERT(layer >= 0 && layer < cache->n_layers && cache->attn_index[layer] >= 0);
    DS_ASSERT(cfg->attn_output_gate); /* Qwen3.5 always gates; the kernels assume [q; gate] */
    const int nh = cfg->n_heads, nkv = cfg->n_kv_heads, hd = cfg->head_dim;
    const int T = c->batch.n_tokens;
    DS_ASSERT(nh > 0 && nkv > 0 && nh % nkv == 0 && nh / nkv <= 64 && hd == cache->hd &&
              nkv == cache->nkv && cfg->rot_dim >= 0 && cfg->rot_dim <= hd && cfg->rot_dim % 2 == 0);
    DS_ASSERT(qkv->dtype == DS_DTYPE_BF16 && out->dtype == DS_DTYPE_BF16);
    const int64_t width = (int64_t)nh * hd * 2 + 2 * (int64_t)nkv * hd;
    DS_ASSERT(last_dim(qkv) == width && n_rows(qkv) >= T);
    DS_ASSERT(last_dim(out) == (int64_t)nh * hd && n_rows(out) >= T);
    DS_ASSERT(w->q_norm.dtype == DS_DTYPE_F32 && w->k_norm.dtype == DS_DTYPE_F32 &&
              ds_tensor_numel(&w->q_norm) == hd && ds_tensor_numel(&w->k_norm) == hd);
    if (T == 0) return;
    check_batch_slots(c, cache);
    const int32_t *pos = c->h_cur + c->h_positions_off;
    const int32_t *tseq = c->h_cur + c->h_tok_seq_off;
    const int32_t *bt = c->h_cur + c->h_block_table_off;
    for (int t = 0; t < T; t++) {
        DS_ASSERT(pos[t] >= 0 && pos[t] / cache->block_size < c->batch.max_blocks);
        const int32_t blk = bt[(int64_t)tseq[t] * c->batch.max_blocks + pos[t] / cache->block_size];
        DS_ASSERT(blk >= 0 && blk < cache->n_blocks);
    }
    const int pool = cache->attn_index[layer];
    char *kv = (char *)cache->kv + (size_t)2 * (size_t)pool * cache->kv_pool_elems * 2;
    ds_cuda_attn_args a = {
        .nh = nh,
        .nkv = nkv,
        .hd = hd,
        .rot = cfg->rot_dim,
        .block_size = cache->block_size,
        .eps = (float)cfg->rms_eps,
        .scale = (float)pow((double)hd, -0.5),
        .q_norm = w->q_norm.data,
        .k_norm = w->k_norm.data,
        .inv_freq = cache->inv_freq,
        .qkv = qkv->data,
        .out = out->data,
        .k_cache = kv,
        .v_cache = kv + cache->kv_pool_elems * 2,
        .ws = cache->attn_ws,
        .ws_rows = cache->attn_ws_rows,
        .split_grain = c->attn_split_grain ? c->attn_split_grain : c->batch.n_tokens == 1 ? 16 : 32,
    };
    ds_cuda_attention(c, &a);
}

void ds_cuda_op_gdn(ds_backend *be, ds_cache *cache, int layer, const ds_config *cfg,
                    const ds_gdn_weights *w, const ds_tensor *proj, ds_tensor *out) {
    ds_cuda_ctx *c = ds_cuda_ctx_of(be);
    DS_ASSERT(layer >= 0 && layer < cache->n_layers && cache->gdn_index[layer] >= 0);
    const int Hk = cfg->gdn_k_heads, Hv = cfg->gdn_v_heads, dk = cfg->gdn_k_dim,
              dv = cfg->gdn_v_dim, K = cfg->gdn_conv_kernel;
    const int64_t conv_dim = ds_config_gdn_conv_dim(cfg);
    const int64_t width = conv_dim + (int64_t)Hv * dv + 2 * (int64_t)Hv;
    const int T = c->batch.n_tokens;
    DS_ASSERT(Hk > 0 && Hv % Hk == 0);
    DS_ASSERT(proj->dtype == DS_DTYPE_BF16 && out->dtype == DS_DTYPE_BF16);
    DS_ASSERT(last_dim(proj) == width && n_rows(proj) >= T);
    DS_ASSERT(last_dim(out) == (int64_t)Hv * dv && n_rows(out) >= T);
    DS_ASSERT(w->conv.dtype == DS_DTYPE_F32 && ds_tensor_numel(&w->conv) == conv_dim * K);
    DS_ASSERT(w->neg_exp_A.dtype == DS_DTYPE_F32 && ds_tensor_numel(&w->neg_exp_A) == Hv);
    DS_ASSERT(w->dt_bias.dtype == DS_DTYPE_F32 && ds_tensor_numel(&w->dt_bias) == Hv);
    DS_ASSERT(w->norm.dtype == DS_DTYPE_F32 && ds_tensor_numel(&w->norm) == dv);
    DS_ASSERT(cache->state_layer_floats == (int64_t)Hv * dk * dv);
    if (T == 0) return;
    check_batch_slots(c, cache);
    const int g = cache->gdn_index[layer];
    ds_cuda_gdn_args a = {
        .hk = Hk,
        .hv = Hv,
        .dk = dk,
        .dv = dv,
        .kernel = K,
        .eps = (float)cfg->rms_eps,
        .proj = proj->data,
        .conv_w = w->conv.data,
        .neg_exp_A = w->neg_exp_A.data,
        .dt_bias = w->dt_bias.data,
        .norm_w = w->norm.data,
        .state = cache->state + (size_t)g * (size_t)cache->state_layer_floats,
        .state_slot_stride = (int64_t)cache->n_gdn * cache->state_layer_floats,
        .conv_hist = cache->conv + (size_t)g * (size_t)cache->conv_layer_floats,
        .conv_slot_stride = (int64_t)cache->n_gdn * cache->conv_layer_floats,
        .out = out->data,
    };
    ds_cuda_gdn(c, &a);
}

/* Fills the launcher's arguments for the MoE block (checks the weight layout); false when
 * there are no rows. */
static bool moe_args(ds_cuda_ctx *c, const ds_config *cfg, const ds_moe_weights *w,
                     const ds_tensor *x, ds_tensor *out, ds_cuda_moe_args *args) {
    DS_ASSERT(x->dtype == DS_DTYPE_BF16 && out->dtype == DS_DTYPE_BF16);
    const int64_t H = last_dim(x), T = n_rows(x);
    DS_ASSERT(last_dim(out) == H && n_rows(out) >= T && T <= DS_CUDA_MAX_TOKENS);
    const int E = w->n_experts, k = cfg->top_k;
    DS_ASSERT(E > 0 && k > 0 && k <= E && w->experts);
    DS_ASSERT(w->router.ndim == 2 && w->router.ne[0] == E && w->router.ne[1] == H &&
              w->router.dtype == DS_DTYPE_BF16);
    const int64_t I = w->experts[0].gate_up.n_out / 2;
    const int64_t Is = w->has_shared ? w->shared.gate_up.n_out / 2 : 0;
    /* the layout prepare_weights made: router | shared gate_up | shared gate contiguous, and
     * experts contiguous [E, 2I, H] / [E, H, I] */
    const char *base = w->router.data;
    DS_ASSERT(w->experts[0].gate_up.n_parts == 1 && w->experts[0].down.n_parts == 1);
    if (E > 1) {
        DS_ASSERT((const char *)w->experts[1].gate_up.parts[0].data ==
                  (const char *)w->experts[0].gate_up.parts[0].data + (size_t)2 * I * H * 2);
        DS_ASSERT((const char *)w->experts[1].down.parts[0].data ==
                  (const char *)w->experts[0].down.parts[0].data + (size_t)H * I * 2);
    }
    if (Is) {
        DS_ASSERT(w->shared.gate_up.n_parts == 1 &&
                  (const char *)w->shared.gate_up.parts[0].data == base + (size_t)E * H * 2);
        DS_ASSERT((const char *)w->shared_gate.data == base + (size_t)(E + 2 * Is) * H * 2);
        DS_ASSERT(w->shared.down.n_parts == 1 && w->shared.down.n_in == Is);
    }
    /* the zero rows up to ds_cuda_moe_in_rows that the padded router GEMM reads
     * (ctx->router_pad) lie before the experts */
    DS_ASSERT((const char *)w->experts[0].gate_up.parts[0].data >=
              base + (size_t)ds_cuda_moe_in_rows(E, (int)Is) * (size_t)H * 2);
    DS_ASSERT(c->d_moe_scratch && c->moe_scratch_bytes >= ds_cuda_moe_scratch_bytes(
                                                             (int)H, E, k, (int)I, (int)Is));
    if (T == 0) return false;
    *args = (ds_cuda_moe_args){
        .T = (int)T,
        .H = (int)H,
        .E = E,
        .top_k = k,
        .I = (int)I,
        .Is = (int)Is,
        .norm_topk = cfg->norm_topk_prob,
        .x = x->data,
        .w_in = base,
        .w_gu = w->experts[0].gate_up.parts[0].data,
        .w_down = w->experts[0].down.parts[0].data,
        .w_sh_down = Is ? w->shared.down.parts[0].data : NULL,
        .out = out->data,
    };
    return true;
}

void ds_cuda_op_moe(ds_backend *be, const ds_config *cfg, const ds_moe_weights *w,
                    const ds_tensor *x, ds_tensor *out) {
    ds_cuda_ctx *c = ds_cuda_ctx_of(be);
    ds_cuda_moe_args a;
    if (moe_args(c, cfg, w, x, out, &a)) ds_cuda_moe(c, &a);
}

void ds_cuda_op_moe_add_rmsnorm(ds_backend *be, const ds_config *cfg, const ds_moe_weights *w,
                                const ds_tensor *x, ds_tensor *delta, ds_tensor *residual,
                                const ds_tensor *norm_w, float eps, ds_tensor *out) {
    ds_cuda_ctx *c = ds_cuda_ctx_of(be);
    const int64_t H = last_dim(residual);
    DS_ASSERT(residual->dtype == DS_DTYPE_BF16 && out->dtype == DS_DTYPE_BF16 &&
              norm_w->dtype == DS_DTYPE_F32 && ds_tensor_numel(norm_w) == H &&
              n_rows(residual) == n_rows(x) && ds_tensor_numel(out) >= ds_tensor_numel(residual));
    ds_cuda_moe_args a;
    if (!moe_args(c, cfg, w, x, delta, &a)) return;
    if (!c->opt.fuse_norm) { /* the unfused pair (the ablation's "before") */
        ds_cuda_moe(c, &a);
        ds_cuda_op_add_rmsnorm(be, residual, delta, norm_w, eps, out);
        return;
    }
    a.residual = residual->data;
    a.norm_w = norm_w->data;
    a.eps = eps;
    a.normed = out->data;
    ds_cuda_moe(c, &a);
}

bool ds_cuda_op_moe_sublayer(ds_backend *be, const ds_config *cfg, const ds_moe_weights *w,
                             ds_tensor *residual, ds_tensor *delta, const ds_tensor *post_norm_w,
                             const ds_tensor *next_norm_w, float eps, ds_tensor *out,
                             bool may_defer_norm) {
    ds_cuda_ctx *c = ds_cuda_ctx_of(be);
    const int64_t T = n_rows(residual), H = last_dim(residual);
    DS_ASSERT(delta->dtype == DS_DTYPE_BF16 && ds_tensor_numel(delta) == ds_tensor_numel(residual) &&
              post_norm_w->dtype == DS_DTYPE_F32 && ds_tensor_numel(post_norm_w) == H &&
              next_norm_w->dtype == DS_DTYPE_F32 && ds_tensor_numel(next_norm_w) == H &&
              residual->dtype == DS_DTYPE_BF16 && out->dtype == DS_DTYPE_BF16 &&
              ds_tensor_numel(out) >= ds_tensor_numel(residual));
    if (!c->opt.fuse_norm || !ds_cuda_gemv_add_norm_ok(c, (int)T, H)) {
        ds_cuda_op_add_rmsnorm(be, residual, delta, post_norm_w, eps, out);
        ds_cuda_op_moe_add_rmsnorm(be, cfg, w, out, delta, residual, next_norm_w, eps, out);
        return false;
    }
    /* the add + norm inside the router launch (cuda_gemv_norm.cu): the delta stays unchanged
     * for the combine, which adds it to the residual again */
    const ds_tensor x = {out->data, DS_DTYPE_BF16, 2, {T, H, 1, 1}}; /* the MoE input: out's first T rows */
    ds_cuda_moe_args a;
    if (!moe_args(c, cfg, w, &x, delta, &a)) return false;
    /* the norm after the block deferred to the next layer's input projection: the combine +
     * residual add in the down launch, the norm in that projection's launch (its GEMV takes
     * the norm as a prologue only on the CUDA cores, the same rule as the router's) */
    const bool defer = may_defer_norm && ds_cuda_moe_down_combine_ok(c, a.T, a.H, a.top_k, a.I, a.Is);
    a.residual = residual->data;
    a.norm_w = next_norm_w->data;
    a.eps = eps;
    a.normed = defer ? NULL : out->data;
    a.pre_delta = delta->data;
    a.pre_norm_w = post_norm_w->data;
    ds_cuda_moe(c, &a);
    return defer;
}

void ds_cuda_op_linear_rmsnorm(ds_backend *be, const ds_tensor *residual, const ds_tensor *norm_w,
                               float eps, ds_tensor *normed, const ds_linear *w, ds_tensor *out) {
    ds_cuda_ctx *c = ds_cuda_ctx_of(be);
    const int64_t R = n_rows(residual), K = last_dim(residual);
    DS_ASSERT(residual->dtype == DS_DTYPE_BF16 && normed->dtype == DS_DTYPE_BF16 &&
              out->dtype == DS_DTYPE_BF16 && norm_w->dtype == DS_DTYPE_F32 &&
              ds_tensor_numel(norm_w) == K && w->n_in == K && last_dim(out) == w->n_out &&
              n_rows(out) >= R && ds_tensor_numel(normed) >= ds_tensor_numel(residual));
    const ds_tensor *wp = &w->parts[0];
    if (R >= 1 && R <= DS_CUDA_GEMV_MAX_ROWS && w->n_parts == 1 && wp->ne[1] == K &&
        ds_cuda_gemv_add_norm_ok(c, (int)R, K) && ((uintptr_t)wp->data % 16) == 0) {
        ds_cuda_gemv_add_norm(c, wp->data, w->n_out, K, residual->data, NULL, norm_w->data, eps,
                              normed->data, (int)R, out->data, w->n_out, 0);
        return;
    }
    ds_cuda_op_rmsnorm(be, residual, norm_w, eps, normed);
    const ds_tensor x = {normed->data, DS_DTYPE_BF16, 2, {R, K, 1, 1}};
    linear_any(c, &x, w, out, 0, 0);
}
