/* runner.h — one planned step → one ds_batch → one forward → the step's logits rows (host).
 *
 * No policy: it runs the plan the scheduler made. Owns the backend cache (KV pool + GDN state
 * slots) and the host staging buffers, which are allocated once and reused every step; token
 * positions and block-table rows are computed here on the host from data already at hand
 * (catalogue items 2 and 3), so a device backend uploads them once in set_batch. The logits of
 * the sequences that want them come back in ONE device → host copy per step.
 *
 * Later (design.md): graph capture per decode shape, an argmax-on-device path for greedy
 * requests without logprobs/penalties, upload only what changed. */
#ifndef DS_RUNNER_H
#define DS_RUNNER_H

#include <stdint.h>

#include "core/status.h"
#include "model/model.h"
#include "runtime/kv_blocks.h"
#include "runtime/scheduler.h"

typedef struct ds_runner {
    ds_model *model; /* borrowed */
    ds_cache *cache; /* owned: n_slots = max_seqs, n_blocks KV blocks of block_size */
    int max_seqs, max_tokens, max_blocks, block_size, vocab;

    /* host staging, one step's worth */
    int32_t *tokens;      /* [max_tokens] */
    int32_t *positions;   /* [max_tokens] */
    int32_t *seq_start;   /* [max_seqs + 1] */
    int32_t *seq_slot;    /* [max_seqs] */
    int32_t *seq_n_past;  /* [max_seqs] */
    int32_t *block_table; /* [max_seqs, max_blocks] */
    int32_t *out_rows;    /* [max_seqs] */
    float *logits;        /* [max_seqs, V] the step's logits rows */
} ds_runner;

/* Creates the cache: max_seqs state slots, n_blocks KV blocks of block_size tokens; block-table
 * rows of max_blocks. Steps carry up to max_tokens tokens (the model must allow that many, and
 * max_seqs logits rows). */
ds_status ds_runner_init(ds_runner *r, ds_model *m, int max_seqs, int max_tokens, int n_blocks,
                         int block_size, int max_blocks, ds_error *err);
void ds_runner_free(ds_runner *r);

/* Runs the plan (resetting the state slots it hands out fresh). On success *logits points at
 * F32 [plan->n_out, V] host rows, one per item that wants logits, in plan order; the caller may
 * overwrite them (the sampler does). */
ds_status ds_runner_step(ds_runner *r, const ds_sched_plan *plan, const ds_kv_blocks *kv,
                         float **logits, ds_error *err);

#endif
