/* runner_internal.h — what the runner's files share (private to them): runner.c (the state,
 * batches, plain and greedy steps, step graphs) and runner_spec.c (the speculative steps). Each
 * function's comment is at its definition. */
#ifndef DS_RUNNER_INTERNAL_H
#define DS_RUNNER_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "runtime/runner.h"
#include "runtime/step_graph.h"

/* The context of runner.c's step functions (ds_step_fn): greedy_fused_step (decode steps and
 * greedy verifications) and sampled_verify_step (sampled verifications). */
typedef struct greedy_step {
    ds_runner *r;
    const ds_batch *b;
    int32_t *ids; /* [b->n_tokens] */
    int keep;     /* argmax_logits keep_at: the ids also stay on the device there (≥ 0) */
} greedy_step;

/* runner.c */
int draft_entry(const ds_runner *r, int j, int p);
int32_t ring_fwd(const ds_runner *r, int32_t slot, int by);
ds_batch build_batch(ds_runner *r, const ds_sched_plan *plan, const ds_kv_blocks *kv,
                     const int32_t *ahead);
ds_status runner_sync(ds_runner *r, ds_error *err);
bool bans_sync(ds_runner *r, int n, const uint64_t *keys, ds_runner_ban_fn fill, void *ctx);
const char *graph_off_reason(const ds_runner *r);
bool spec_graphs_ready(ds_runner *r);
size_t verify_graph_idx(const ds_runner *r, int n, int d);
ds_step_fn verify_step_fn(const ds_runner *r, ds_batch *b);

/* runner_spec.c */
bool dev_accept_init(ds_runner *r);
void use_half(ds_runner *r, int h);
void drafts_fetch(ds_runner *r);
void drafts_land(ds_runner *r);
void land_take(ds_runner *r, int h);
void accept_on_device(ds_runner *r);
ds_status draft_passes(ds_runner *r, const ds_sched_plan *plan, const ds_kv_blocks *kv,
                       const int32_t *k_next, bool ahead, ds_error *err);

#endif
