/* request.h — internals of ds_request (engine.h): what the engine thread keeps per request and
 * the output channel it shares with the submitter.
 *
 * Threads and locks:
 *  - The engine thread alone touches the "engine side" fields (tokens, sampler, seq, ...).
 *  - The channel (queued tokens, finished flag, refs) is guarded by the request's mutex; the
 *    engine pushes, the submitter pops in ds_request_next, waiting on the condvar.
 *  - Two references: the submitter's (ds_request_release) and the engine's (dropped after the
 *    final event is pushed). The last one frees.
 *  - Lock order: request mutex, then engine mutex (ds_request_cancel). The engine thread never
 *    holds the engine mutex while it takes a request mutex.
 *  - Once `finished` is set the engine never looks at the request again, so ds_request_cancel /
 *    ds_request_release on a finished request do not touch the engine (which may be gone). */
#ifndef DS_REQUEST_H
#define DS_REQUEST_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "runtime/engine.h"
#include "runtime/scheduler.h"
#include "sampling/sampler.h"

struct ds_request {
    ds_engine *eng;

    /* ---- channel (under mu) ---- */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int refs;
    atomic_bool cancel;        /* set by ds_request_cancel; polled by the engine thread */
    bool finished;             /* the engine pushed its last event */
    bool final_consumed;       /* ds_request_next returned the finished event */
    ds_finish_reason reason;   /* when finished */
    int stop_token;            /* when finished with a stop_token_id, else -1 */
    int32_t *q_tokens;         /* [q_cap] tokens pushed, not yet read: [q_read, q_write) */
    ds_sample_result *q_samples; /* [q_cap] */
    int q_read, q_write, q_cap;
    int n_pushed;              /* tokens pushed in total */
    int n_cached;              /* prompt tokens its first admission took from the prefix cache */

    /* ---- engine side (engine thread only, after submission) ---- */
    uint64_t serial;           /* ≥ 1, unique per engine: names its ban list (runner bans) */
    int n_prompt;
    int max_new;               /* params.max_tokens */
    int32_t *tokens;           /* [n_prompt + max_new] prompt then generated tokens */
    int n_generated;
    ds_sampler sampler;
    ds_sched_seq seq;
    bool counted_prompt;       /* prompt tokens added to the stats (once, not per recompute) */
    bool caches_ahead;         /* its caches went past its last token (a device acceptance that
                                  took more drafts than the host, which stopped earlier): not
                                  kept for the prefix cache */
    ds_finish_reason end_reason; /* decided this step; delivered by ds_request_finish */
    int end_stop_token;
    ds_request *next_sub;      /* submission queue link (under the engine mutex) */
    ds_request *next_done;     /* the engine thread's list of requests to finalise */
};

/* A request with refs = 2 (submitter + engine) for a validated prompt and sampler (moved in). */
ds_request *ds_request_create(ds_engine *eng, const int32_t *prompt, int n_prompt,
                              ds_sampler *sampler);

/* Engine thread: queues one generated token for the reader. False when the channel cannot grow
 * (out of memory): the engine aborts the request. */
bool ds_request_push_token(ds_request *r, const ds_sample_result *res);
/* Engine thread: the last event (reason NONE = aborted), then drops the engine's reference. */
void ds_request_finish(ds_request *r, ds_finish_reason reason, int stop_token);

/* Drops one reference; frees the request on the last. */
void ds_request_unref(ds_request *r);

/* Engine side of a cancel (engine.c): wakes the engine thread so it looks at cancel flags. */
void ds_engine_poke_cancel(ds_engine *e);

#endif
