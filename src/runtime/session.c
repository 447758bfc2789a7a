#include "runtime/session.h"

#include <stdlib.h>
#include <string.h>

#define DS_SESSION_BLOCK_SIZE 16

ds_status ds_session_init(ds_session *s, ds_model *m, int n_slots, int max_len, ds_error *err) {
    return ds_session_init_spec(s, m, n_slots, max_len, 0, err);
}

ds_status ds_session_init_spec(ds_session *s, ds_model *m, int n_slots, int max_len, int n_spec,
                               ds_error *err) {
    *s = (ds_session){.model = m, .n_slots = n_slots, .max_len = max_len,
                      .block_size = DS_SESSION_BLOCK_SIZE};
    if (n_slots <= 0 || max_len <= 0 || n_spec < 0)
        return ds_error_set(err, DS_ERR_INVALID_ARG, "session needs positive slots and length");
    if ((int64_t)max_len + 2 * (int64_t)n_spec > INT32_MAX / 2)
        return ds_error_set(err, DS_ERR_INVALID_ARG, "session length %d is too large", max_len);
    s->n_spec = n_spec;
    s->gdn_per_slot = n_spec > 0 ? n_spec + 2 : 1;
    s->blocks_per_seq = (max_len + 2 * n_spec + s->block_size - 1) / s->block_size;
    if ((int64_t)n_slots * s->gdn_per_slot > INT32_MAX ||
        (int64_t)n_slots * s->blocks_per_seq > INT32_MAX)
        return ds_error_set(err, DS_ERR_INVALID_ARG, "session of %d slots is too large", n_slots);
    ds_cache_desc desc = {.n_slots = n_slots * s->gdn_per_slot,
                          .n_blocks = n_slots * s->blocks_per_seq,
                          .block_size = s->block_size};
    ds_status st = m->be->ops->cache_create(m->be, &m->cfg, &desc, &s->cache, err);
    if (st != DS_OK) {
        s->cache = NULL;
        return st;
    }
    s->block_table = ds_xcalloc((size_t)n_slots * (size_t)s->blocks_per_seq, sizeof(int32_t));
    for (int i = 0; i < n_slots * s->blocks_per_seq; i++) s->block_table[i] = i;
    s->n_past = ds_xcalloc((size_t)n_slots, sizeof(int32_t));
    s->gdn_cur = ds_xcalloc((size_t)n_slots, sizeof(int32_t));
    for (int i = 0; i < n_slots; i++) s->gdn_cur[i] = i * s->gdn_per_slot;
    s->seq_gdn = ds_xcalloc((size_t)m->max_tokens, sizeof(int32_t));
    s->positions = ds_xcalloc((size_t)m->max_tokens, sizeof(int32_t));
    s->seq_start = ds_xcalloc((size_t)m->max_tokens + 1, sizeof(int32_t));
    s->seq_n_past = ds_xcalloc((size_t)m->max_tokens, sizeof(int32_t));
    s->step_blocks = ds_xcalloc((size_t)m->max_tokens * (size_t)s->blocks_per_seq, sizeof(int32_t));
    s->out_rows = ds_xcalloc((size_t)m->max_tokens, sizeof(int32_t));
    for (int i = 0; i < n_slots; i++) ds_session_reset(s, i);
    return DS_OK;
}

void ds_session_free(ds_session *s) {
    if (s->cache) s->model->be->ops->cache_free(s->model->be, s->cache);
    free(s->block_table);
    free(s->n_past);
    free(s->positions);
    free(s->seq_start);
    free(s->seq_n_past);
    free(s->step_blocks);
    free(s->out_rows);
    free(s->gdn_cur);
    free(s->seq_gdn);
    *s = (ds_session){0};
}

void ds_session_reset(ds_session *s, int slot) {
    DS_ASSERT(slot >= 0 && slot < s->n_slots);
    s->n_past[slot] = 0;
    /* Only the current GDN slot needs clearing: a verification writes a spare completely
     * before it becomes current. */
    s->model->be->ops->cache_reset_slot(s->model->be, s->cache, s->gdn_cur[slot]);
}

int ds_session_spare_slots(const ds_session *s, int slot, int32_t *out) {
    DS_ASSERT(slot >= 0 && slot < s->n_slots);
    int n = 0;
    for (int j = 0; j < s->gdn_per_slot; j++) {
        int32_t g = slot * s->gdn_per_slot + j;
        if (g != s->gdn_cur[slot]) out[n++] = g;
    }
    return n;
}

ds_status ds_session_feed(ds_session *s, int slot, const int32_t *tokens, int n, bool all_logits,
                          float *logits_host, ds_error *err) {
    ds_model *m = s->model;
    const ds_backend_ops *op = m->be->ops;
    if (slot < 0 || slot >= s->n_slots)
        return ds_error_set(err, DS_ERR_INVALID_ARG, "slot %d out of range", slot);
    if (n <= 0) return ds_error_set(err, DS_ERR_INVALID_ARG, "nothing to feed");
    if ((int64_t)s->n_past[slot] + n > s->max_len)
        return ds_error_set(err, DS_ERR_INVALID_ARG,
                            "sequence of %d tokens exceeds the context length %d",
                            s->n_past[slot] + n, s->max_len);
    const size_t V = (size_t)m->cfg.vocab;
    for (int done = 0; done < n;) {
        int T = n - done < m->max_tokens ? n - done : m->max_tokens;
        bool last_chunk = done + T == n;
        int n_out = 0;
        if (logits_host && all_logits) {
            /* out rows are limited by max_out: shrink the chunk if needed */
            if (T > m->max_out) {
                T = m->max_out;
                last_chunk = done + T == n;
            }
            for (int i = 0; i < T; i++) s->out_rows[n_out++] = i;
        } else if (logits_host && last_chunk) {
            s->out_rows[n_out++] = T - 1;
        }
        for (int i = 0; i < T; i++) s->positions[i] = s->n_past[slot] + i;
        int32_t seq_start[2] = {0, T};
        int32_t seq_slot = s->gdn_cur[slot], seq_n_past = s->n_past[slot];
        ds_batch b = {
            .n_tokens = T,
            .n_seqs = 1,
            .tokens = tokens + done,
            .positions = s->positions,
            .seq_start = seq_start,
            .seq_slot = &seq_slot,
            .seq_n_past = &seq_n_past,
            .block_table = s->block_table + (size_t)slot * (size_t)s->blocks_per_seq,
            .max_blocks = s->blocks_per_seq,
            .n_out = n_out,
            .out_rows = s->out_rows,
        };
        ds_status st = ds_model_forward(m, s->cache, &b, err);
        if (st != DS_OK) return st;
        if (n_out > 0) {
            float *dst = all_logits ? logits_host + (size_t)done * V : logits_host;
            op->download(m->be, dst, m->s.logits.data, (size_t)n_out * V * sizeof(float));
        }
        if ((st = op->synchronize(m->be, err)) != DS_OK) return st;
        s->n_past[slot] += T;
        done += T;
    }
    return DS_OK;
}

ds_status ds_session_decode(ds_session *s, const int32_t *slots, const int32_t *tokens, int n,
                            float *logits_host, ds_error *err) {
    ds_model *m = s->model;
    if (n <= 0 || n > m->max_tokens || n > m->max_out || n > s->n_slots)
        return ds_error_set(err, DS_ERR_INVALID_ARG, "decode batch of %d does not fit", n);
    const size_t B = (size_t)s->blocks_per_seq;
    for (int i = 0; i < n; i++) {
        int slot = slots[i];
        if (slot < 0 || slot >= s->n_slots)
            return ds_error_set(err, DS_ERR_INVALID_ARG, "slot %d out of range", slot);
        if (s->n_past[slot] + 1 > s->max_len)
            return ds_error_set(err, DS_ERR_INVALID_ARG, "slot %d is full (%d tokens)", slot,
                                s->max_len);
        s->positions[i] = s->n_past[slot];
        s->seq_start[i] = i;
        s->seq_n_past[i] = s->n_past[slot];
        s->out_rows[i] = i;
        s->seq_gdn[i] = s->gdn_cur[slot];
        memcpy(s->step_blocks + (size_t)i * B, s->block_table + (size_t)slot * B,
               B * sizeof(int32_t));
    }
    s->seq_start[n] = n;
    ds_batch b = {
        .n_tokens = n,
        .n_seqs = n,
        .tokens = tokens,
        .positions = s->positions,
        .seq_start = s->seq_start,
        .seq_slot = s->seq_gdn,
        .seq_n_past = s->seq_n_past,
        .block_table = s->step_blocks,
        .max_blocks = s->blocks_per_seq,
        .n_out = n,
        .out_rows = s->out_rows,
    };
    ds_status st = ds_model_forward(m, s->cache, &b, err);
    if (st != DS_OK) return st;
    if (logits_host)
        m->be->ops->download(m->be, logits_host, m->s.logits.data,
                             (size_t)n * (size_t)m->cfg.vocab * sizeof(float));
    if ((st = m->be->ops->synchronize(m->be, err)) != DS_OK) return st;
    for (int i = 0; i < n; i++) s->n_past[slots[i]] += 1;
    return DS_OK;
}
