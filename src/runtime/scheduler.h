/* scheduler.h — policy only: which sequences run this step and how many tokens each.
 *
 * It never touches tensors or the backend; it owns the waiting and running queues and draws on
 * the KV block pool and the state slot pool (bookkeeping) when it admits, grows, preempts or
 * removes a sequence. The engine builds the step's batch from the plan and, after sampling,
 * advances each sequence (ds_sched_seq_advance).
 *
 * A sequence knows n_tokens tokens (prompt + generated so far) of which n_computed are in its
 * caches; the remaining n_tokens − n_computed ≥ 1 are fed next (a decode has exactly 1: the
 * token sampled last step). One step (ds_scheduler_schedule):
 *  1. running decodes, in admission order, 1 token each, plus (speculative decoding,
 *     ds_scheduler_set_spec) the n_draft draft tokens the sequence holds, as far as the budget
 *     allows once every decode has its one token;
 *  2. running sequences still in (chunked) prefill, in admission order, as many tokens as the
 *     step's budget (max_num_batched_tokens) leaves;
 *  3. unless someone was preempted this step: waiting sequences in FCFS order while a state slot
 *     and the KV blocks of their first chunk are free and the budget lasts. The queue is strict
 *     FCFS: when its head cannot be admitted, nobody behind it is.
 * With speculative decoding a chunk that reaches the last known token also reserves KV blocks
 * for the MTP's draft positions after it (lookahead of k − 1 positions past the chunk, capped at
 * the sequence's max_tokens), so drafting never needs blocks outside the plan.
 * A running sequence that needs blocks the pool does not have preempts the most recently
 * admitted running sequence (itself, if it is the newest): the victim's blocks and slot are
 * freed, its n_computed drops to 0 and it goes back to the FRONT of the waiting queue; its
 * prompt + generated tokens are recomputed when it is re-admitted (the engine keeps its sampler
 * state). A victim already planned for this step is taken out of the plan.
 * Prefix caching (ds_scheduler_set_prefix_caching, prefix_cache.h): a sequence that finished
 * normally leaves its slot and blocks as an entry (ds_scheduler_retire); a waiting sequence
 * whose tokens continue an entry's takes it over at admission and starts at its n_computed.
 * Whenever admission or growth lacks a slot or blocks, the least recently stored entries are
 * evicted first; only then is anyone preempted.
 * A chunk ends either at the end of the known tokens (the sequence wants logits: the next token
 * is sampled) or mid-way (no logits). Progress: a sequence alone in the pool always fits if
 * ds_scheduler_fits() accepted it, so the oldest running sequence is never starved. */
#ifndef DS_SCHEDULER_H
#define DS_SCHEDULER_H

#include <stdbool.h>
#include <stdint.h>

#include "runtime/kv_blocks.h"
#include "runtime/prefix_cache.h"
#include "runtime/state_slots.h"

typedef enum ds_sched_state {
    DS_SCHED_NONE = 0, /* not known to the scheduler (new, or removed) */
    DS_SCHED_WAITING,
    DS_SCHED_RUNNING,
} ds_sched_state;

/* Embedded in the engine's request; fields are read by the engine, written by the scheduler
 * (except through ds_sched_seq_advance). */
typedef struct ds_sched_seq {
    int n_tokens;     /* tokens known: prompt + generated */
    int n_computed;   /* tokens already in the caches */
    int max_tokens;   /* most tokens it will ever hold in the caches (prompt + max_tokens − 1) */
    int slot;         /* state slot / KV table row while running, else -1 */
    bool spec;        /* speculates (drafts, lookahead blocks) when the scheduler does */
    int n_draft;      /* draft tokens the runner holds for the next verification (0: none) */
    const int32_t *tokens; /* [n_tokens] the known tokens (owned by the engine's request; the
                              scheduler never reads them, the runner feeds them) */
    ds_sched_state state;
    bool admitted;    /* admitted at least once (a preempted one is re-admitted) */
    int n_reused;     /* tokens its first admission took over from the prefix cache */
    uint64_t plan_step; /* the plan (ds_scheduler.step) it was last put in */
    int plan_index;     /* its item's index in that plan */
    struct ds_sched_seq *prev, *next; /* links in the waiting or running queue */
    void *owner;      /* the engine's request */
} ds_sched_seq;

/* A fresh sequence of n_prompt tokens that may grow to n_prompt + max_new tokens; `tokens` has
 * room for all of them. */
void ds_sched_seq_init(ds_sched_seq *q, const int32_t *tokens, int n_prompt, int max_new,
                       void *owner);

/* After the step ran: n fed tokens are in the caches; `sampled` when a token was appended. */
void ds_sched_seq_advance(ds_sched_seq *q, int n_fed, bool sampled);
/* After a step that sampled: the n_known fed tokens plus the n_emitted − 1 accepted drafts are
 * in the caches and n_emitted ≥ 1 tokens were appended (the last one is fed next). Clears the
 * drafts (n_draft = 0). */
void ds_sched_seq_advance_spec(ds_sched_seq *q, int n_known, int n_emitted);
/* The runner drafted n tokens for the sequence's next verification. */
void ds_sched_seq_set_drafts(ds_sched_seq *q, int n);

typedef struct ds_sched_item {
    ds_sched_seq *seq;
    int n_tokens;      /* known tokens fed this step: [n_computed, n_computed + n_tokens) */
    int n_draft;       /* draft tokens fed after them (a verification); 0 otherwise */
    bool wants_logits; /* the chunk reaches the last known token: sample after it */
    bool fresh_slot;   /* admitted by this plan to a free slot: the engine must reset its state
                          (false for a prefix-cache take-over, whose state is the entry's) */
    bool resumed;      /* admitted by this plan taking a prefix-cache entry over: it starts at
                          the entry's n_computed */
} ds_sched_item;

typedef struct ds_sched_plan {
    int n_items;          /* sequences in the step, decodes first */
    ds_sched_item *items; /* [max_num_seqs] */
    int n_tokens;         /* Σ items[i].n_tokens + n_draft ≤ max_num_batched_tokens */
    int n_out;            /* items that want logits */
    int n_preempted;      /* sequences preempted while planning this step */
} ds_sched_plan;

typedef struct ds_sched_queue {
    ds_sched_seq *head, *tail;
    int n;
} ds_sched_queue;

typedef struct ds_scheduler {
    int max_num_seqs;
    int max_num_batched_tokens;
    int num_spec;           /* draft tokens per step (0: no speculative decoding) */
    ds_kv_blocks *kv;       /* borrowed */
    ds_state_slots *slots;  /* borrowed */
    ds_sched_queue waiting; /* FCFS; preempted sequences re-enter at the head */
    ds_sched_queue running; /* admission order: the tail is the newest */
    ds_sched_seq **snap;    /* [max_num_seqs] running queue snapshot while planning */
    ds_sched_plan plan;     /* the last plan (its items array is owned here) */
    uint64_t step;          /* plans made so far; numbers the current plan */
    uint64_t n_preemptions;
    /* prefix caching (off unless ds_scheduler_set_prefix_caching) */
    bool prefix_caching;
    ds_prefix_cache pc;     /* entries: finished sequences' slots and blocks */
    uint64_t prefix_queries; /* tokens of sequences admitted for the first time */
    uint64_t prefix_hits;    /* of those, tokens taken over from entries */
    uint64_t prefix_stored, prefix_evicted; /* entries stored, evicted */
} ds_scheduler;

/* The pools must have at least max_num_seqs slots / sequences. */
void ds_scheduler_init(ds_scheduler *s, int max_num_seqs, int max_num_batched_tokens,
                       ds_kv_blocks *kv, ds_state_slots *slots);
void ds_scheduler_free(ds_scheduler *s);

/* Speculative decoding with up to k draft tokens per sequence and step (0 = off). */
void ds_scheduler_set_spec(ds_scheduler *s, int k);

/* True when a sequence that may hold max_tokens positions fits the KV pool on its own (and its
 * table row); requests that fail this can never run and must be refused at submission. */
bool ds_scheduler_fits(const ds_scheduler *s, int64_t max_tokens);

/* Prefix caching on or off (off: every entry is evicted). */
void ds_scheduler_set_prefix_caching(ds_scheduler *s, bool on);

/* Appends a new sequence (ds_sched_seq_init'ed, state NONE) to the waiting queue. */
void ds_scheduler_add(ds_scheduler *s, ds_sched_seq *q);

/* Takes a sequence out (finished, cancelled, aborted): frees its blocks and slot. Safe in any
 * state; a sequence in the current plan must not be removed before the engine used the plan. */
void ds_scheduler_remove(ds_scheduler *s, ds_sched_seq *q);

/* Takes out a sequence that finished normally, its caches consistent with its n_computed:
 * with prefix caching, a running one whose last token is known but not fed leaves its slot and
 * blocks as a prefix-cache entry; otherwise as ds_scheduler_remove. */
void ds_scheduler_retire(ds_scheduler *s, ds_sched_seq *q);

/* Blocks held by prefix-cache entries. */
int ds_scheduler_prefix_blocks(const ds_scheduler *s);

/* Plans the next step into s->plan (valid until the next call) and returns it. The plan's
 * sequences hold the KV blocks for every position they feed. An empty plan means nothing to
 * do (no sequences). */
const ds_sched_plan *ds_scheduler_schedule(ds_scheduler *s);

static inline int ds_scheduler_n_running(const ds_scheduler *s) { return s->running.n; }
static inline int ds_scheduler_n_waiting(const ds_scheduler *s) { return s->waiting.n; }

#endif
