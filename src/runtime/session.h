/* session.h — drive sequences through a model one step at a time without a scheduler.
 *
 * Used by the CLI (generate, score), the benchmarks and the tests. Each slot owns a fixed
 * range of KV blocks (slot s: blocks [s·B, (s+1)·B)), so a slot holds up to max_len tokens.
 * The serving runtime (runtime/scheduler) replaces this with paged block allocation. */
#ifndef DS_SESSION_H
#define DS_SESSION_H

#include <stdbool.h>
#include <stdint.h>

#include "model/model.h"

typedef struct ds_session {
    ds_model *model;
    ds_cache *cache;
    int n_slots;
    int max_len;          /* tokens per slot */
    int block_size;
    int blocks_per_seq;   /* covers max_len + 2·n_spec positions (speculative lookahead) */
    int32_t *block_table; /* [n_slots, blocks_per_seq] */
    int32_t *n_past;      /* [n_slots] tokens already in each slot's caches */
    /* Speculative decoding (ds_session_init_spec): each slot owns gdn_per_slot GDN state slots
     * of the cache, [slot·gdn_per_slot, (slot+1)·gdn_per_slot); gdn_cur[slot] holds the
     * sequence's state, the others are spares that a verification writes its per-token states
     * into (spec.h). Without speculation gdn_per_slot = 1 and gdn_cur[slot] = slot. */
    int n_spec;
    int gdn_per_slot;
    int32_t *gdn_cur;     /* [n_slots] */
    int32_t *seq_gdn;     /* [max_tokens] staging: GDN slots of a batched decode */
    /* per-step host staging, sized for model->max_tokens */
    int32_t *positions, *out_rows;   /* [max_tokens] */
    int32_t *seq_start, *seq_n_past; /* [max_tokens + 1], [max_tokens] (batched decode) */
    int32_t *step_blocks;            /* [max_tokens, blocks_per_seq] block-table rows of a step */
} ds_session;

ds_status ds_session_init(ds_session *s, ds_model *m, int n_slots, int max_len, ds_error *err);
/* Same, ready for speculative decoding with up to n_spec draft tokens per step (0 = plain):
 * n_spec + 2 GDN state slots per sequence and KV blocks for 2·n_spec positions of lookahead. */
ds_status ds_session_init_spec(ds_session *s, ds_model *m, int n_slots, int max_len, int n_spec,
                               ds_error *err);
/* The spare GDN slots of `slot` (all but the current one), in a fixed order; returns how many
 * (gdn_per_slot − 1). */
int ds_session_spare_slots(const ds_session *s, int slot, int32_t *out);
void ds_session_free(ds_session *s);

/* Starts a new sequence in `slot` (clears its GDN state, forgets its KV). */
void ds_session_reset(ds_session *s, int slot);

/* Feeds n tokens of one sequence (any n: split into steps of model->max_tokens). When
 * logits_host is non-NULL it receives F32 logits: [n, V] if all_logits, else [1, V] for the
 * last token. */
ds_status ds_session_feed(ds_session *s, int slot, const int32_t *tokens, int n, bool all_logits,
                          float *logits_host, ds_error *err);

/* One decode step for n sequences at once: token tokens[i] appended to slot slots[i] (distinct
 * slots), all in one batch. logits_host (may be NULL) receives F32 [n, V]. The model must have
 * max_out ≥ n. */
ds_status ds_session_decode(ds_session *s, const int32_t *slots, const int32_t *tokens, int n,
                            float *logits_host, ds_error *err);

#endif
