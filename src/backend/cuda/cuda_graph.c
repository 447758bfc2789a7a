/* cuda_graph.c — step graphs: backend.h graph_begin / graph_end / graph_launch.
 *
 * A decode step is recorded once per batch shape with stream capture and replayed with one
 * cudaGraphLaunch, which removes the per-kernel launch cost (~300 kernels per step at
 * Qwen3.5-35B-A3B). What makes the ops replayable:
 *  - set_batch is never recorded: during a capture it uploads at once on a side stream (the
 *    main stream was drained by graph_begin); before a replay graph_launch uploads the new
 *    batch on the main stream, into the same device buffer, at the same offsets (they depend on
 *    the batch shape only, which graph_launch checks);
 *  - launch shapes depend on the batch shape only (attention decode sizes its KV split from
 *    the sequence count and finds each split's range on the device from the positions);
 *  - self-resetting counters (split-K, fused argmax) and no allocation inside ops;
 *  - host outputs (argmax_logits ids) are copied into pinned memory by the graph and handed to
 *    the recorded host buffer at the next synchronize.
 * Ops that wait for the device (download, synchronize, argmax) refuse to run during a
 * capture: the capture fails, nothing of the step ran, and the caller runs it eagerly. */
#include <stdio.h>
#include <string.h>

#include "backend/cuda/cuda_host.h"

static ds_cuda_graph *graph_find(ds_cuda_ctx *c, uint64_t key) {
    for (int i = 0; i < DS_CUDA_MAX_GRAPHS; i++)
        if (c->graphs[i].used && c->graphs[i].key == key) return &c->graphs[i];
    return NULL;
}

static int batch_max_seq_tokens(const ds_batch *b) {
    int m = 0;
    for (int s = 0; s < b->n_seqs; s++) {
        const int n = b->seq_start[s + 1] - b->seq_start[s];
        if (n > m) m = n;
    }
    return m;
}

/* A graph's host outputs join those the next synchronize delivers. */
static void pending_add(ds_cuda_ctx *c, const ds_cuda_outs *outs) {
    for (int i = 0; i < outs->n; i++) {
        if (c->pending.n == DS_CUDA_MAX_OUTS) {
            ds_cuda_check(c, cudaErrorInvalidValue, "graph: too many host outputs pending",
                          __FILE__, __LINE__);
            return;
        }
        c->pending.o[c->pending.n++] = outs->o[i];
    }
}

void ds_cuda_graphs_free(ds_cuda_ctx *c) {
    for (int i = 0; i < DS_CUDA_MAX_GRAPHS; i++) {
        if (c->graphs[i].used) cudaGraphExecDestroy(c->graphs[i].exec);
        c->graphs[i] = (ds_cuda_graph){0};
    }
}

ds_status ds_cuda_graph_begin(ds_backend *be, uint64_t key, ds_error *err) {
    ds_cuda_ctx *c = ds_cuda_ctx_of(be);
    if (c->capturing) return ds_error_set(err, DS_ERR_INTERNAL, "CUDA graph: capture already open");
    /* drain the stream: set_batch will overwrite the batch buffer outside stream order, and the
     * pending ids of an earlier step become available */
    ds_status st = be->ops->synchronize(be, err);
    if (st != DS_OK) return st;
    cudaError_t e = cudaStreamBeginCapture(c->stream, cudaStreamCaptureModeRelaxed);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        return ds_error_set(err, DS_ERR_DEVICE, "CUDA graph: cannot begin capture: %s",
                            cudaGetErrorString(e));
    }
    c->capturing = 1;
    c->cap_failed = 0;
    c->cap_why[0] = 0;
    c->cap_key = key;
    c->cap_launch0 = c->n_launches;
    c->cap_outs.n = 0;
    return DS_OK;
}

ds_status ds_cuda_graph_end(ds_backend *be, ds_error *err) {
    ds_cuda_ctx *c = ds_cuda_ctx_of(be);
    if (!c->capturing) return ds_error_set(err, DS_ERR_INTERNAL, "CUDA graph: no capture open");
    cudaGraph_t g = NULL;
    cudaError_t e = cudaStreamEndCapture(c->stream, &g);
    c->capturing = 0;
    const uint64_t n_kernels = c->n_launches - c->cap_launch0;
    c->n_launches = c->cap_launch0; /* recorded, not run: counted when the graph runs below */
    const ds_cuda_outs outs = c->cap_outs;
    c->cap_outs.n = 0;
    if (e != cudaSuccess || c->cap_failed || c->failed || !g) {
        (void)cudaGetLastError();
        if (g) cudaGraphDestroy(g);
        if (c->failed) return ds_error_set(err, DS_ERR_DEVICE, "CUDA backend: %s", c->errmsg);
        return ds_error_set(err, DS_ERR_UNSUPPORTED, "CUDA graph capture failed: %s",
                            c->cap_failed ? c->cap_why : cudaGetErrorString(e));
    }
    cudaGraphExec_t exec = NULL;
    e = cudaGraphInstantiate(&exec, g, 0);
    cudaGraphDestroy(g);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        return ds_error_set(err, DS_ERR_UNSUPPORTED, "CUDA graph: instantiate failed: %s",
                            cudaGetErrorString(e));
    }
    ds_cuda_graph *slot = graph_find(c, c->cap_key);
    if (slot) {
        cudaGraphExecDestroy(slot->exec);
    } else {
        for (int i = 0; i < DS_CUDA_MAX_GRAPHS && !slot; i++)
            if (!c->graphs[i].used) slot = &c->graphs[i];
    }
    if (!slot) {
        cudaGraphExecDestroy(exec);
        return ds_error_set(err, DS_ERR_UNSUPPORTED, "CUDA graph: more than %d graphs",
                            DS_CUDA_MAX_GRAPHS);
    }
    *slot = (ds_cuda_graph){
        .used = 1,
        .key = c->cap_key,
        .T = c->batch.n_tokens,
        .S = c->batch.n_seqs,
        .n_out = c->batch.n_out,
        .max_blocks = c->batch.max_blocks,
        .max_seq_tokens = c->info.max_seq_tokens,
        .has_state_out = c->batch.state_out != NULL,
        .has_shift = c->batch.pos_shift != NULL,
        .slot_ring = c->batch.slot_ring,
        .exec = exec,
        .n_kernels = n_kernels,
        .outs = outs,
    };
    /* the step's work: the batch uploaded during the capture is still current */
    if (DS_CU(c, cudaGraphLaunch(exec, c->stream)))
        return ds_error_set(err, DS_ERR_DEVICE, "CUDA backend: %s", c->errmsg);
    c->n_launches += n_kernels;
    pending_add(c, &outs);
    return DS_OK;
}

bool ds_cuda_graph_launch(ds_backend *be, uint64_t key, const ds_batch *b) {
    ds_cuda_ctx *c = ds_cuda_ctx_of(be);
    ds_cuda_graph *g = graph_find(c, key);
    if (!g || c->capturing || c->failed) return false;
    if (g->T != b->n_tokens || g->S != b->n_seqs || g->n_out != b->n_out ||
        g->max_blocks != b->max_blocks || g->has_state_out != (b->state_out_slots != NULL) ||
        g->max_seq_tokens != batch_max_seq_tokens(b) ||
        g->has_shift != (b->pos_shift != NULL || b->out_shift != NULL) ||
        g->slot_ring != b->slot_ring)
        return false;
    ds_cuda_upload_batch(be, b, 0); /* the graph lowers a shifted batch itself */
    if (DS_CU(c, cudaGraphLaunch(g->exec, c->stream))) return true; /* sticky error: synchronize */
    c->n_launches += g->n_kernels;
    pending_add(c, &g->outs);
    return true;
}
