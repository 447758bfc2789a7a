/* engine_internal.h — the engine's state and the helpers its files share (engine.c: intake,
 * plain steps, lifetime; engine_spec.c: speculative steps). Engine thread only, except where a
 * field says "under mu". */
#ifndef DS_ENGINE_INTERNAL_H
#define DS_ENGINE_INTERNAL_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#include "runtime/engine.h"
#include "runtime/graph_warmup.h"
#include "runtime/kv_blocks.h"
#include "runtime/request.h"
#include "runtime/runner.h"
#include "runtime/scheduler.h"
#include "runtime/state_slots.h"

struct ds_engine {
    ds_model *model; /* borrowed */
    ds_engine_opts o;
    int vocab;
    ds_kv_blocks kv;      /* KV block bookkeeping (rows = state slots) */
    ds_state_slots slots; /* GDN state slot bookkeeping */
    ds_scheduler sched;   /* queues + policy */
    ds_runner runner;     /* the backend cache + step buffers */
    ds_graph_report warmup; /* the start-up graph warmup (written before the thread starts) */

    int k;                    /* draft tokens per step (0: no speculative decoding) */
    int32_t *k_next;          /* [max_num_seqs] engine thread: drafts wanted per plan item */
    int32_t *k_ahead;         /* [max_num_seqs] engine thread: the same, drafted before the host
                                 accepted (ds_runner_step_ahead): as if every draft were taken */
    /* chained steps (runner.h): the plans of the two verifications in flight, their items'
     * draft counts for the step after them, and the chained one's positions ahead */
    ds_sched_plan chain_plan[2];
    int32_t *chain_k[2];      /* [max_num_seqs] each */
    int32_t *chain_ahead;     /* [max_num_seqs] */
    uint64_t *ban_keys;       /* [max_num_seqs · (k + 1)] engine thread: ban key per greedy plan
                                 item (k = 0) or per verification row (k > 0) */
    int32_t *ban_item;        /* [max_num_seqs · (k + 1)] engine thread (k > 0): plan item of
                                 each verification row */
    ds_spec_sampling *samp;   /* [max_num_seqs] engine thread (k > 0): a verification's device
                                 sampling parameters per plan item (ds_runner_set_sampling) */
    uint64_t n_serial;        /* engine thread: serials handed to requests so far */
    ds_request *done;         /* engine thread: finished this round, events not yet delivered */
    ds_engine_stats counters; /* engine thread: the counters part of the stats */

    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    /* ---- under mu ---- */
    ds_request *sub_head, *sub_tail; /* submitted, not yet taken by the engine thread */
    int n_sub;
    bool wake;      /* a cancel arrived */
    bool stopping;  /* ds_engine_destroy */
    ds_engine_stats pub; /* the last published snapshot (waiting excludes the n_sub above) */
    uint64_t rejected;
};

/* Takes r out of the scheduler (its blocks and slot are free from here on) and queues its final
 * event for after the stats are published. reason NONE = aborted. */
void ds_engine_end_request(ds_engine *e, ds_request *r, ds_finish_reason reason, int stop_token);
/* The stats snapshot clients read (under mu). */
void ds_engine_publish_stats(ds_engine *e);
/* One speculative step (engine_spec.c). */
void ds_engine_run_step_spec(ds_engine *e);

#endif
