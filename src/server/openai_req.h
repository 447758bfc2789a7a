/* openai_req.h — OpenAI request bodies (/v1/completions, /v1/chat/completions) → validated
 * generation requests, and OpenAI-style error objects.
 *
 * Everything in a body is untrusted: wrong JSON types, out-of-range values and unsupported
 * features become a ds_oai_error (HTTP status, type, param, code, message) — never a crash.
 * Sampling ranges are checked by ds_sampling_params_validate, whose message names the field;
 * the param of the error is taken from it. Vocabulary and context-length checks need the
 * tokenised prompt and happen later (openai_handlers.c). */
#ifndef DS_SERVER_OPENAI_REQ_H
#define DS_SERVER_OPENAI_REQ_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <cjson/cJSON.h>

#include "core/status.h"
#include "sampling/params.h"
#include "chat/tool_calls.h"
#include "server/chat_format.h"

typedef enum ds_oai_kind { DS_OAI_COMPLETIONS = 0, DS_OAI_CHAT = 1 } ds_oai_kind;

/* Choices per request (`n`): each is its own engine request over the same prompt; a batch of
 * prompts (completions) multiplies them, up to DS_OAI_MAX_CHOICES in all. */
#define DS_OAI_MAX_N 16
#define DS_OAI_MAX_CHOICES 64

typedef struct ds_oai_error {
    int status;          /* HTTP status */
    const char *type;    /* "invalid_request_error", "authentication_error", ... */
    const char *code;    /* NULL → null */
    char param[64];      /* "" → null */
    char message[DS_ERROR_MSG_MAX];
} ds_oai_error;

void ds_oai_error_set(ds_oai_error *e, int status, const char *type, const char *code,
                      const char *param, const char *fmt, ...) __attribute__((format(printf, 6, 7)));
/* {"error": {"message", "type", "param", "code"}} as a malloc'd string (NULL on OOM). */
char *ds_oai_error_json(const ds_oai_error *e);

typedef struct ds_oai_request {
    ds_oai_kind kind;
    cJSON *root;                  /* the parsed body; strings below point into it */
    const char *model;            /* NULL when absent */

    /* /v1/completions */
    const char *prompt_text;      /* the prompt when it is a string */
    int32_t *prompt_ids;          /* [n_prompt_ids] the prompt when it is token ids (owned) */
    int n_prompt_ids;
    bool echo;

    /* /v1/chat/completions */
    ds_chat_message *messages;    /* [n_messages] (owned array; strings point into root) */
    int n_messages;
    char **joined;                /* [n_messages] contents joined from text parts (owned) */
    ds_chat_opts chat;
    const cJSON *tools;           /* the request's tools (validated), NULL when absent */
    cJSON *prompt_tools;          /* the tools the prompt lists (owned; chat.tools points here) */
    ds_tool_choice tool_choice;   /* parsed tool_choice (NONE without tools) */

    bool stream;
    bool include_usage;           /* stream_options.include_usage */
    bool continuous_usage;        /* stream_options.continuous_usage_stats (usage in every chunk) */
    bool max_tokens_given;        /* else: completions 16, chat max_model_len - prompt */
    const char *max_tokens_param; /* "max_tokens" or "max_completion_tokens" (error param) */
    int logprobs;                 /* -1 none, else top-N alternatives per token */
    int n;                        /* choices: 1 .. DS_OAI_MAX_N samples of each prompt */
    int n_prompts;                /* completions: prompts in the batch (1: not a batch) */
    bool skip_special_tokens;     /* vLLM extension, default true */
    bool return_token_ids;        /* vLLM extension: token_ids / prompt_token_ids in the output */
    bool json_object;             /* response_format {"type": "json_object"} (JSON mode: the
                                     server sets sp.json), also set for a schema */
    struct ds_json_schema *json_schema; /* response_format {"type": "json_schema"}: compiled
                                     (sampling/json_schema.h), owned (one reference) */
    ds_sampling_params sp;        /* its stop / id / bias arrays point into the fields below */
    const char *stops[DS_SAMPLING_MAX_STOP];
    int *stop_ids;                /* owned */
    ds_logit_bias *logit_bias;    /* owned */
} ds_oai_request;

/* Parses and validates a body. False with *e filled (status 400) on any problem. *r is to be
 * freed with ds_oai_request_free either way (it may hold part of the body). */
bool ds_oai_parse(ds_oai_kind kind, const char *body, size_t len, ds_oai_request *r,
                  ds_oai_error *e);

/* Sampling defaults for fields a request leaves out (vLLM's --generation-config auto: the
 * model's generation_config.json overrides OpenAI's defaults). Unset fields keep OpenAI's. */
typedef struct ds_oai_defaults {
    bool has_temperature, has_top_p, has_top_k, has_min_p, has_repetition_penalty;
    float temperature, top_p, min_p, repetition_penalty;
    int top_k;
} ds_oai_defaults;

/* Reads temperature, top_p, top_k, min_p, repetition_penalty from DIR/generation_config.json.
 * A missing file leaves *d empty (DS_OK); a malformed one is DS_ERR_FORMAT naming the file and
 * field. The values are validated later, per request, like any other. */
ds_status ds_oai_defaults_load(const char *model_dir, ds_oai_defaults *d, ds_error *err);
/* ds_oai_parse with defaults (NULL = OpenAI's). */
bool ds_oai_parse_with(ds_oai_kind kind, const char *body, size_t len, const ds_oai_defaults *d,
                       ds_oai_request *r, ds_oai_error *e);
void ds_oai_request_free(ds_oai_request *r);
/* Completions with a batch of prompts: makes prompt `index` (< n_prompts) the request's prompt
 * (prompt_text or prompt_ids). False with *e set on a bad element (ds_oai_parse has checked
 * them all, so only an index out of range fails after it). */
bool ds_oai_request_select_prompt(ds_oai_request *r, int index, ds_oai_error *e);

#endif
