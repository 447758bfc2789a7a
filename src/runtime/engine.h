/* engine.h — the serving runtime's public face: one engine thread owns the model, the caches
 * and the device; other threads (HTTP handlers, benchmarks, tests) submit requests and read
 * their outputs through a per-request channel.
 *
 *   ds_engine_create(model, &opts, &eng, &err);          // starts the engine thread
 *   ds_engine_submit(eng, &desc, &req, &err);            // any thread; never blocks on the model
 *   while (ds_request_next(req, &ev, timeout_ms)) {...}  // the submitter's thread
 *   ds_request_release(req);                             // also cancels if still running
 *   ds_engine_destroy(eng);
 *
 * Policy (scheduler.c): continuous batching; each step packs the running decodes first, then
 * chunked prefill of waiting/partially prefilled requests up to max_num_batched_tokens; at most
 * max_num_seqs sequences hold caches; admission needs a free GDN state slot and enough free KV
 * blocks; under KV pressure the newest running request is preempted (its caches freed, its
 * prompt + generated tokens recomputed later). Requests that can never fit (prompt + max_tokens
 * > max_model_len) are refused at submit. Detokenisation and stop strings are the consumer's
 * business (it calls ds_request_cancel when a stop string matched). */
#ifndef DS_ENGINE_H
#define DS_ENGINE_H

#include <stdbool.h>
#include <stdint.h>

#include "core/status.h"
#include "model/model.h"
#include "runtime/graph_warmup.h"
#include "runtime/spec.h"
#include "sampling/sampler.h"

typedef struct ds_engine ds_engine;
typedef struct ds_request ds_request;

typedef struct ds_engine_opts {
    int max_num_seqs;           /* concurrent sequences holding caches (GDN slots) */
    int max_model_len;          /* prompt + output tokens per request */
    int max_num_batched_tokens; /* token budget per step (chunked prefill) */
    int max_queue;              /* waiting requests beyond which submit returns DS_ERR_BUSY */
    int block_size;             /* KV block size in tokens */
    int num_kv_blocks;          /* 0 = derive from max_num_seqs × max_model_len */
    int num_speculative_tokens; /* MTP draft tokens per step (0 = off; 1..DS_SPEC_MAX_K): the
                                   model needs an MTP head and max_out ≥ max_num_seqs · (k + 1) */
    int warmup_graphs;          /* step shapes recorded at create, before any request
                                   (graph_warmup.h): DS_GRAPH_WARMUP_ALL (the default), 0 =
                                   none (recorded at their first step), N = the N smallest */
    bool prefix_caching;        /* finished requests' caches kept for prompts that continue
                                   them (runtime/prefix_cache.h; default on) */
} ds_engine_opts;

void ds_engine_opts_default(ds_engine_opts *o);

/* The model must be initialised with max_tokens ≥ max_num_batched_tokens and max_out ≥
 * max_num_seqs (· (k + 1) with speculative decoding). The engine does not own the model.
 * Before its thread starts (so before any request) it records the step graph of every shape
 * opts.warmup_graphs asks for (runtime/graph_warmup.h; ds_engine_graph_report says how it went).
 *
 * Speculative decoding (num_speculative_tokens = k > 0, runtime/spec.h): every running decode
 * is verified with the k tokens its MTP head drafted, in the same batch as everything else;
 * greedy requests stay token-identical to plain decoding, sampled ones keep the target
 * distribution (speculative sampling, spec.h). Sampled requests that ask for logprobs do not
 * speculate. */
ds_status ds_engine_create(ds_model *model, const ds_engine_opts *opts, ds_engine **out,
                           ds_error *err);
/* Cancels everything still running, joins the engine thread, frees the caches. */
void ds_engine_destroy(ds_engine *e);

typedef struct ds_request_desc {
    const int32_t *prompt;       /* [n_prompt] token ids (copied) */
    int n_prompt;
    ds_sampling_params params;   /* copied (deep) */
} ds_request_desc;

/* Errors: DS_ERR_INVALID_ARG for bad params, empty prompt, ids outside the vocabulary, or
 * prompt + max_tokens > max_model_len (message states both lengths, like vLLM's
 * context-length error); DS_ERR_BUSY when the waiting queue is full. */
ds_status ds_engine_submit(ds_engine *e, const ds_request_desc *d, ds_request **out, ds_error *err);

typedef struct ds_request_event {
    int n_tokens;                       /* new tokens in this event (≥ 1 unless finished-only) */
    int32_t tokens[16];
    ds_sample_result samples[16];       /* per token (logprobs when asked for) */
    bool finished;
    ds_finish_reason reason;            /* when finished: stop / length (abort → NONE) */
    int stop_token;                     /* the stop_token_id that finished it, else -1 */
    int n_prompt_tokens;
    int n_cached_tokens;                /* of those, taken over from the prefix cache */
    int n_generated;                    /* total so far */
} ds_request_event;

/* Waits up to timeout_ms (< 0 = forever) for the next event. Returns false on timeout or once
 * the finished event has been consumed. */
bool ds_request_next(ds_request *r, ds_request_event *ev, int timeout_ms);
/* Asks the engine to stop the request and free its caches (client gone, stop string hit). */
void ds_request_cancel(ds_request *r);
/* Drops the caller's reference (cancelling first if unfinished). */
void ds_request_release(ds_request *r);

/* Counters and gauges for /metrics and tests (a consistent snapshot). */
typedef struct ds_engine_stats {
    int running, waiting;
    int kv_blocks_total, kv_blocks_used; /* used: by running requests */
    int slots_total, slots_used;
    /* prefix caching (prefix_cache.h): entries, and the blocks they hold (each entry holds a
     * slot: neither counts as used above, since admission evicts them as it needs) */
    int prefix_entries, prefix_blocks;
    uint64_t prefix_queries, prefix_hits; /* prompt tokens admitted, of them taken over */
    uint64_t prefix_stored, prefix_evicted;
    uint64_t requests_finished, requests_aborted, requests_rejected, preemptions;
    uint64_t prompt_tokens, generation_tokens, steps;
    uint64_t greedy_steps;        /* steps of them on the greedy ids-only path (runner.h) */
    uint64_t ban_uploads;         /* banned-id tables sent to the backend (DS_OPT_DEVICE_MASKS) */
    int num_speculative_tokens;   /* k (0: speculative decoding off) */
    uint64_t spec_fused_steps;    /* verification steps whose argmax ran fused with the lm_head
                                     (ids only, rows below min_tokens banned on the device; runner.h
                                     ds_runner_step_graphed_bans) */
    uint64_t spec_device_accepts; /* verification steps accepted on the device and followed by
                                     their draft passes without a host round trip (runner.h
                                     ds_runner_step_ahead) */
    uint64_t spec_chained_steps;  /* of those, verifications queued before the host had read
                                     the one before them (runner.h "chained steps",
                                     DS_OPT_SPEC_ASYNC) */
    uint64_t spec_sampled_steps;  /* of those, verifications with sampled (temperature > 0)
                                     requests decided by spec_sample on the device (their
                                     fused_steps count only the greedy ones) */
    ds_spec_stats spec;           /* drafts, draft tokens, accepted tokens (per position) */
    int graph_shapes_captured;    /* step shapes with a recorded graph (warmup or first use) */
    int graph_shapes_eager;       /* step shapes whose recording failed: they run eagerly */
} ds_engine_stats;

void ds_engine_get_stats(ds_engine *e, ds_engine_stats *s);

/* What the start-up graph warmup did (ds_graph_report_print prints it); valid until
 * ds_engine_destroy. */
const ds_graph_report *ds_engine_graph_report(const ds_engine *e);

#endif
