/* step_graph.c — see step_graph.h. */
#include "runtime/step_graph.h"

ds_status ds_step_graph_run(ds_backend *be, uint64_t key, signed char *state, const ds_batch *b,
                            ds_step_fn run, void *ctx, ds_error *why, ds_error *err) {
    const ds_backend_ops *op = be->ops;
    if (op->graph_launch && op->graph_begin && op->graph_end) {
        if (op->graph_launch(be, key, b)) return DS_OK;
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
