/* step_graph.h — one step through a backend step graph (backend.h graph_begin / graph_end /
 * graph_launch), with the fallback every user needs: replay when the shape has a graph, record
 * it the first time the shape comes, run eagerly when the backend cannot record it. Used by the
 * serving runner's greedy steps, speculative verification and deltaserve bench. */
#ifndef DS_RUNTIME_STEP_GRAPH_H
#define DS_RUNTIME_STEP_GRAPH_H

#include <stdint.h>

#include "backend/backend.h"
#include "core/status.h"

/* The step's work: ops on the backend, no waiting for the device (a capture refuses that). */
typedef ds_status (*ds_step_fn)(void *ctx, ds_error *err);

/* Runs run(ctx) for batch b (already built) as follows:
 *  - key has a graph of b's shape: replayed (run is not called);
 *  - else, the first time (*state == 0): recorded under key, which also runs it once; *state
 *    becomes 1, or -1 when the backend could not record it (the reason goes to *why when why
 *    is not NULL), and the step then runs eagerly;
 *  - else (*state == -1, or a backend without graphs): run eagerly.
 * A failed recording is never retried for the same state. Returns DS_OK or the error of the
 * eager run. */
ds_status ds_step_graph_run(ds_backend *be, uint64_t key, signed char *state, const ds_batch *b,
                            ds_step_fn run, void *ctx, ds_error *why, ds_error *err);

#endif
