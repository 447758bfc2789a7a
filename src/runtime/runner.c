#include "runtime/runner.h"

#include <stdlib.h>
#include <string.h>

ds_status ds_runner_init(ds_runner *r, ds_model *m, int max_seqs, int max_tokens, int n_blocks,
                         int block_size, int max_blocks, ds_error *err) {
    *r = (ds_runner){.model = m, .max_seqs = max_seqs, .max_tokens = max_tokens,
                     .max_blocks = max_blocks, .block_size = block_size, .vocab = m->cfg.vocab};
    DS_ASSERT(max_seqs > 0 && max_tokens >= max_seqs && max_blocks > 0);
    DS_ASSERT(max_tokens <= m->max_tokens && max_seqs <= m->max_out);
    const size_t S = (size_t)max_seqs, T = (size_t)max_tokens;
    r->tokens = malloc(T * sizeof(int32_t));
    r->positions = malloc(T * sizeof(int32_t));
    r->seq_start = malloc((S + 1) * sizeof(int32_t));
    r->seq_slot = malloc(S * sizeof(int32_t));
    r->seq_n_past = malloc(S * sizeof(int32_t));
    r->block_table = calloc(S * (size_t)max_blocks, sizeof(int32_t));
    r->out_rows = malloc(S * sizeof(int32_t));
    r->logits = malloc(S * (size_t)r->vocab * sizeof(float));
    if (!r->tokens || !r->positions || !r->seq_start || !r->seq_slot || !r->seq_n_past ||
        !r->block_table || !r->out_rows || !r->logits) {
        ds_runner_free(r);
        return ds_error_set(err, DS_ERR_NOMEM, "runner: out of memory for the step buffers "
                            "(%d sequences x %d KV blocks, %d logits rows of %d)",
                            max_seqs, max_blocks, max_seqs, r->vocab);
    }
    ds_cache_desc desc = {.n_slots = max_seqs, .n_blocks = n_blocks, .block_size = block_size};
    ds_status st = m->be->ops->cache_create(m->be, &m->cfg, &desc, &r->cache, err);
    if (st != DS_OK) {
        r->cache = NULL;
        ds_runner_free(r);
        return st;
    }
    return DS_OK;
}

void ds_runner_free(ds_runner *r) {
    if (r->cache) r->model->be->ops->cache_free(r->model->be, r->cache);
    free(r->tokens);
    free(r->positions);
    free(r->seq_start);
    free(r->seq_slot);
    free(r->seq_n_past);
    free(r->block_table);
    free(r->out_rows);
    free(r->logits);
    *r = (ds_runner){0};
}

/* Fills the staging buffers from the plan; returns the batch that points at them. Sequence i
 * of the batch is plan item i: its tokens [n_computed, n_computed + n) at positions
 * n_computed.., its block-table row, and a logits row for its last token if it wants one. */
static ds_batch build_batch(ds_runner *r, const ds_sched_plan *plan, const ds_kv_blocks *kv) {
    ds_backend *be = r->model->be;
    int T = 0, n_out = 0;
    for (int i = 0; i < plan->n_items; i++) {
        const ds_sched_item *it = &plan->items[i];
        const ds_sched_seq *q = it->seq;
        /* A slot keeps the recurrent state of its previous owner until cleared. */
        if (it->fresh_slot) be->ops->cache_reset_slot(be, r->cache, q->slot);
        r->seq_start[i] = T;
        r->seq_slot[i] = q->slot;
        r->seq_n_past[i] = q->n_computed;
        memcpy(r->tokens + T, q->tokens + q->n_computed, (size_t)it->n_tokens * sizeof(int32_t));
        for (int j = 0; j < it->n_tokens; j++) r->positions[T + j] = q->n_computed + j;
        /* Only the blocks the sequence holds: the rest of the row is never read. */
        int held = ds_kv_blocks_held(kv, q->slot);
        DS_ASSERT(held <= r->max_blocks &&
                  (int64_t)held * r->block_size >= (int64_t)q->n_computed + it->n_tokens);
        memcpy(r->block_table + (size_t)i * (size_t)r->max_blocks, ds_kv_blocks_table(kv, q->slot),
               (size_t)held * sizeof(int32_t));
        T += it->n_tokens;
        if (it->wants_logits) r->out_rows[n_out++] = T - 1;
    }
    r->seq_start[plan->n_items] = T;
    DS_ASSERT(T == plan->n_tokens && T <= r->max_tokens && n_out == plan->n_out);
    return (ds_batch){
        .n_tokens = T,
        .n_seqs = plan->n_items,
        .tokens = r->tokens,
        .positions = r->positions,
        .seq_start = r->seq_start,
        .seq_slot = r->seq_slot,
        .seq_n_past = r->seq_n_past,
        .block_table = r->block_table,
        .max_blocks = r->max_blocks,
        .n_out = n_out,
        .out_rows = r->out_rows,
    };
}

ds_status ds_runner_step(ds_runner *r, const ds_sched_plan *plan, const ds_kv_blocks *kv,
                         float **logits, ds_error *err) {
    DS_ASSERT(plan->n_items > 0 && plan->n_items <= r->max_seqs);
    ds_model *m = r->model;
    const ds_backend_ops *op = m->be->ops;
    ds_batch b = build_batch(r, plan, kv);
    ds_status st = ds_model_forward(m, r->cache, &b, err);
    if (st != DS_OK) return st;
    if (b.n_out > 0)
        op->download(m->be, r->logits, m->s.logits.data,
                     (size_t)b.n_out * (size_t)r->vocab * sizeof(float));
    st = op->synchronize(m->be, err);
    if (st != DS_OK) return st;
    *logits = r->logits;
    return DS_OK;
}
