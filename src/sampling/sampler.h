/* sampler.h — per-request token sampling with vLLM (v1 engine) semantics.
 *
 * One ds_sampler per request, driven by the engine thread once per generated token:
 *
 *   ds_sampler_init(&s, &params, vocab, eos_ids, n_eos, &err);   // validates params
 *   ds_sampler_add_prompt(&s, prompt, n_prompt, &err);            // for repetition_penalty
 *   loop:
 *     ds_sampler_sample(&s, logits, n_out, &res, &err);   // logits [vocab] fp32, clobbered
 *     ds_sampler_accept(&s, res.token);                   // history for the penalties
 *     n_out++;
 *     reason = ds_sampler_finish_reason(&s, res.token, n_out, &stop_id);
 *     text = detokenise(res.token); ds_stop_matcher_feed(&m, text, ...);   // stop strings
 *   ds_sampler_free(&s);
 *
 * Order inside ds_sampler_sample (vLLM v1 Sampler): raw logprobs for reporting (log_softmax of
 * the untouched logits) → logit_bias → repetition, frequency, presence penalties → EOS/stop ids banned while
 * n_generated < min_tokens → JSON mode's grammar mask (json_grammar.h) → greedy argmax (lowest
 * id on ties) if temperature < 1e-5, else
 * divide by temperature → min_p → top_k → top_p → draw from the renormalised survivors with
 * the request's own RNG. Sampling does not record the token: ds_sampler_accept does, so a
 * speculative verifier can sample and reject without undo.
 *
 * Cost at vocab V: greedy is one pass over the logits; random sampling is O(V) with no sort of
 * the vocabulary and no allocation per call (dist.c: a size-k heap + short sorted list for
 * small top_k, radix selection over the float bits for top_p / large top_k, a vectorisable
 * exp). Measured at V = 250k on the 2-core dev box, including the 1 MB logits copy: greedy
 * ≈ 0.1 ms, top_k=50 + top_p=0.9 ≈ 0.15 ms, top_p=0.95 alone ≈ 0.6 ms. */
#ifndef DS_SAMPLING_SAMPLER_H
#define DS_SAMPLING_SAMPLER_H

#include <stdbool.h>
#include <stdint.h>

#include "core/status.h"
#include "sampling/json_grammar.h"
#include "sampling/json_schema.h"
#include "sampling/params.h"
#include "sampling/rng.h"
#include "sampling/stop.h"
#include "sampling/token_counts.h"

#define DS_SAMPLER_MAX_EOS 8

typedef enum ds_finish_reason {
    DS_FINISH_NONE = 0, /* keep generating */
    DS_FINISH_STOP,     /* EOS (unless ignore_eos), a stop_token_id, or a stop string */
    DS_FINISH_LENGTH,   /* max_tokens reached */
} ds_finish_reason;

/* "stop", "length", or NULL for DS_FINISH_NONE (the OpenAI finish_reason strings). */
const char *ds_finish_reason_name(ds_finish_reason r);

typedef struct ds_sample_result {
    int token;
    /* Filled when params.logprobs >= 0, from the raw (unpenalised, untempered) distribution: */
    float logprob;                               /* log_softmax(raw logits)[token] */
    int rank;                                    /* #tokens with raw logprob >= token's (1 = top) */
    int n_top;                                   /* = params.logprobs */
    int top_ids[DS_SAMPLING_MAX_LOGPROBS];       /* [n_top] by logprob desc, then id asc */
    float top_logprobs[DS_SAMPLING_MAX_LOGPROBS];/* [n_top] */
} ds_sample_result;

/* Plain data so it can live inside a request; fields are private to sampling/. */
typedef struct ds_sampler {
    ds_sampling_params params; /* owned clone */
    int vocab;
    int eos_ids[DS_SAMPLER_MAX_EOS];
    int n_eos;
    uint64_t seed;             /* the seed in use: params.seed, or one drawn from the OS */
    ds_rng rng;
    float temperature;         /* effective: vLLM raises (0, 0.01) to 0.01 */
    bool greedy;
    bool penalties;            /* any of the three penalties is active */
    ds_token_counts counts;    /* prompt + output history (only kept when penalties) */
    int n_accepted;            /* tokens passed to ds_sampler_accept */
    int n_prompt;              /* prompt tokens passed to ds_sampler_add_prompt: output token i
                                  sits at position n_prompt + i (speculative verification keys
                                  its random numbers by position: runtime/spec.h) */
    float *raw;                /* [vocab] copy of the raw logits; only when logprobs >= 0 */
    /* JSON mode (params.json): the grammar's state after the accepted tokens, and the ids
     * that end the output (EOS, stop ids), allowed once the object is closed */
    ds_json_state json_state;
    ds_js_state js_state;      /* with params.json_schema: the schema's automaton instead */
    bool json_on;              /* the grammar applies (from the start, or since the
                                  params.json_start_after token) */
    int *end_ids;              /* [n_end] */
    int n_end;
} ds_sampler;

/* Validates `p` against `vocab` (DS_ERR_INVALID_ARG naming the field) and keeps a deep copy of
 * it. eos_ids[n_eos] are the model's end-of-sequence ids (config eos_token_id(s)); at most
 * DS_SAMPLER_MAX_EOS. Without p->has_seed a seed is drawn from the OS entropy source and
 * recorded in s->seed. Free with ds_sampler_free (also after a failed init). */
ds_status ds_sampler_init(ds_sampler *s, const ds_sampling_params *p, int vocab,
                          const int *eos_ids, int n_eos, ds_error *err);
void ds_sampler_free(ds_sampler *s);

/* Records the prompt for repetition_penalty (a no-op when no penalty is active). Ids come from
 * the user: out-of-range ids are DS_ERR_INVALID_ARG naming the position. */
ds_status ds_sampler_add_prompt(ds_sampler *s, const int32_t *tokens, int n, ds_error *err);

/* Records one generated token (presence/frequency count it; repetition sees it; JSON mode feeds
 * its bytes to the grammar: DS_ERR_INVALID_ARG when they cannot continue the object). */
ds_status ds_sampler_accept(ds_sampler *s, int token, ds_error *err);

/* Picks the next token. logits: [vocab] fp32, overwritten (scratch for the probabilities).
 * n_generated: output tokens so far, before this one (drives min_tokens). Fails only with
 * DS_ERR_INTERNAL when no token has a finite logit (NaN counts as -inf). */
ds_status ds_sampler_sample(ds_sampler *s, float *logits, int n_generated, ds_sample_result *res,
                            ds_error *err);

/* The distribution ds_sampler_sample draws from, written over logits ([vocab], sums to 1;
 * one-hot for greedy). Does not touch the RNG. For speculative-decoding acceptance and tests. */
ds_status ds_sampler_probs(ds_sampler *s, float *logits, int n_generated, ds_error *err);

/* The individual stages, exposed for the runner (e.g. penalties before a device-side argmax)
 * and for tests. Both are in place on logits [vocab]. */
void ds_sampler_apply_logit_bias(const ds_sampler *s, float *logits);
void ds_sampler_apply_penalties(const ds_sampler *s, float *logits);
void ds_sampler_apply_min_tokens(const ds_sampler *s, float *logits, int n_generated);
/* Whether ds_sampler_apply_min_tokens masks token at n_generated (an EOS or stop_token_id while
 * n_generated < min_tokens): for ids decided elsewhere (a device argmax with banned ids). */
bool ds_sampler_min_tokens_banned(const ds_sampler *s, int token, int n_generated);

/* After token `token` was appended and n_generated counts it: DS_FINISH_STOP for an EOS id
 * (unless ignore_eos) or a stop_token_id (*stop_token = that id, else -1) once
 * n_generated >= min_tokens; DS_FINISH_LENGTH when n_generated >= max_tokens; else NONE.
 * EOS on the last allowed token reports "stop" (the model did finish). Stop strings are the
 * ds_stop_matcher's business; the context-length cap is the scheduler's. */
ds_finish_reason ds_sampler_finish_reason(const ds_sampler *s, int token, int n_generated,
                                          int *stop_token);

bool ds_sampler_is_eos(const ds_sampler *s, int token);

#endif
