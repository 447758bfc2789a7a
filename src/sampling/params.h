/* params.h — per-request sampling parameters with vLLM's meaning, and their validation.
 *
 * The HTTP server fills a ds_sampling_params from the request body, calls
 * ds_sampling_params_validate (DS_ERR_INVALID_ARG → HTTP 400 with err->msg, which names the
 * field) and keeps a deep copy (ds_sampling_params_clone) in the request. */
#ifndef DS_SAMPLING_PARAMS_H
#define DS_SAMPLING_PARAMS_H

#include <stdbool.h>
#include <stdint.h>

#include "core/status.h"

#define DS_SAMPLING_MAX_LOGPROBS 20   /* vLLM's default max_logprobs; OpenAI's top_logprobs cap */
#define DS_SAMPLING_MAX_STOP 16       /* stop strings per request */
#define DS_SAMPLING_MAX_STOP_LEN 256  /* bytes per stop string (bounds the hold-back buffer) */
#define DS_SAMPLING_MAX_STOP_IDS 128  /* stop_token_ids per request */
#define DS_SAMPLING_GREEDY_EPS 1e-5f  /* temperature below this → greedy (vLLM _SAMPLING_EPS) */
#define DS_SAMPLING_MIN_TEMP 1e-2f    /* temperatures in [EPS, MIN_TEMP) run at MIN_TEMP (vLLM) */
#define DS_SAMPLING_MAX_LOGIT_BIAS 1024 /* logit_bias entries per request */
#define DS_SAMPLING_MAX_BIAS 100.0f   /* |bias| bound: vLLM clamps each bias to [-100, 100] */

/* One logit_bias entry: bias added to the logit of token id before any other processing. */
typedef struct ds_logit_bias {
    int id;
    float bias;
} ds_logit_bias;

typedef struct ds_sampling_params {
    float temperature;        /* ≥ 0; < DS_SAMPLING_GREEDY_EPS = greedy */
    float top_p;              /* (0, 1]; 1 = off */
    int top_k;                /* ≤ 0 = off; ties with the k-th logit are kept (vLLM) */
    float min_p;              /* [0, 1]; keep tokens with p ≥ min_p · p_max; 0 = off */
    float presence_penalty;   /* [-2, 2]; subtracted once from every token already generated */
    float frequency_penalty;  /* [-2, 2]; subtracted once per occurrence in the output */
    float repetition_penalty; /* > 0; 1 = off; prompt + output tokens: l>0 ? l/r : l·r */
    bool has_seed;            /* false: a seed is drawn from the OS entropy source */
    uint64_t seed;
    int max_tokens;           /* ≥ 1; output tokens before finish_reason "length" */
    int min_tokens;           /* [0, max_tokens]; EOS and stop ids banned until reached */
    bool ignore_eos;          /* EOS does not finish (and stays sampleable) */
    const int *stop_token_ids; /* [n_stop_token_ids] extra ids that finish with "stop" */
    int n_stop_token_ids;
    const char *const *stop;  /* [n_stop] NUL-terminated UTF-8 stop strings */
    int n_stop;
    bool include_stop_str_in_output;
    int logprobs;             /* -1 = none; 0 = chosen token only; N = also the top N */
    const ds_logit_bias *logit_bias; /* [n_logit_bias] distinct ids, |bias| ≤ DS_SAMPLING_MAX_BIAS;
                                        added to the logits before the penalties (vLLM order) */
    int n_logit_bias;
    /* JSON mode (response_format json_object; json_grammar.h): the output is one JSON object;
     * the vocabulary's byte strings (shared, not copied; they outlive every request). NULL =
     * off. Needs ignore_eos off and min_tokens 0 (the end comes when the object closes). */
    const struct ds_json_vocab *json;
    bool json_deferred;       /* JSON mode starts once json_start_after was generated (the end
                                 of a reasoning block the prompt opened, "</think>"); false:
                                 from the first token */
    int json_start_after;
    /* Structured outputs (response_format json_schema; json_schema.h): with json set, the
     * object must also match this compiled schema. Reference-counted: a clone takes a
     * reference, _free drops it. NULL = any object (JSON mode). */
    struct ds_json_schema *json_schema;

    bool owns_arrays;         /* set by ds_sampling_params_clone; read by _free */
} ds_sampling_params;

/* vLLM SamplingParams defaults: temperature 1, top_p 1, top_k off, min_p 0, no penalties,
 * max_tokens 16, no stops, logprobs none. */
void ds_sampling_params_init(ds_sampling_params *p);

/* Checks every field; on a bad value returns DS_ERR_INVALID_ARG with a message that starts with
 * the field name ("top_p must be in (0, 1], got 0"). `vocab` > 0 also range-checks
 * stop_token_ids and logit_bias ids. */
ds_status ds_sampling_params_validate(const ds_sampling_params *p, int vocab, ds_error *err);

/* Deep copy: dst owns copies of stop_token_ids, stop strings and logit_bias (free with
 * ds_sampling_params_free). dst may not alias src. */
ds_status ds_sampling_params_clone(ds_sampling_params *dst, const ds_sampling_params *src,
                                   ds_error *err);

/* Frees the arrays of a clone; a no-op for params that do not own their arrays. */
void ds_sampling_params_free(ds_sampling_params *p);

/* True when the request samples greedily (temperature below DS_SAMPLING_GREEDY_EPS). */
bool ds_sampling_params_is_greedy(const ds_sampling_params *p);

#endif
