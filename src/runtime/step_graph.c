/* step_graph.c — see step_graph.h. */
#include "runtime/step_graph.h"

#include <stdatomic.h>
#include <stdio.h>

/* Replays refused although a graph was recorded under the key (the batch no longer has the
 * recorded shape): each such step runs eagerly, a silent slowdown, so the first few say so. */
static atomic_uint g_refused;
enum { REFUSED_SHOWN = 8 };

ds_status ds_step_graph_run(ds_backend *be, uint64_t key, signed char *state, const ds_batch *b,
                            ds_step_fn run, void *ctx, ds_error *why, ds_error *err) {
    const ds_backend_ops *op = be->ops;
    if (op->graph_launch && op->graph_begin && op->graph_end) {
        if (op->graph_launch(be, key, b)) return DS_OK;
        if (*state == 1 && atomic_fetch_add(&g_refused, 1u) < REFUSED_SHOWN)
            fprintf(stderr, "deltaserve: step graph %#llx: the recorded graph does not fit this "
                    "step's batch (%d tokens, %d sequences); it runs eagerly (shown %d times at "
                    "most)\n", (unsigned long long)key, b->n_tokens, b->n_seqs, REFUSED_SHOWN);
        if (*state == 0) {
            *state = -1;
            ds_status st = op->graph_begin(be, key, err);
            if (st == DS_OK) {
                st = run(ctx, err);
                ds_error end_err = {0};
                const ds_status end = op->graph_end(be, &end_err); /* always close the capture */
                if (st == DS_OK && end != DS_OK) {
                    st = end;
                    *err = end_err;
                }
            }
            if (st == DS_OK) {
                *state = 1;
                return DS_OK;
            }
            /* nothing of the step ran: it runs eagerly, now and whenever this state comes */
            if (why) *why = *err;
            *err = (ds_error){0};
        }
    }
    return run(ctx, err);
}
