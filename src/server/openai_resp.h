/* openai_resp.h — OpenAI response bodies and streaming chunks (cJSON), vLLM-compatible:
 *   completions  {"id","object":"text_completion","created","model","choices":[{"index","text",
 *                 "logprobs","finish_reason","stop_reason"}],"usage"}
 *   chat         {"id","object":"chat.completion",...,"choices":[{"index","message":{"role",
 *                 "content","reasoning_content"},"logprobs","finish_reason","stop_reason"}],"usage"}
 *   chunks       object "text_completion" / "chat.completion.chunk" with "text" / "delta".
 * Token strings in logprobs are the token's bytes as UTF-8 (invalid sequences → U+FFFD), with
 * the raw bytes in "bytes" (chat); -inf logprobs are written as -9999.0 (as vLLM does). */
#ifndef DS_SERVER_OPENAI_RESP_H
#define DS_SERVER_OPENAI_RESP_H

#include <stdbool.h>

#include <cjson/cJSON.h>

#include "server/gen.h"
#include "server/openai_req.h"
#include "server/strbuf.h"

typedef struct ds_oai_resp_ctx {
    ds_oai_kind kind;
    char id[48];         /* "cmpl-…" / "chatcmpl-…" */
    long long created;   /* unix seconds */
    const char *model;   /* served name */
    const ds_tokenizer *tok;
    int logprobs;        /* -1 none, else top-N */
    bool include_usage;  /* streaming: "usage": null in chunks, a usage chunk at the end */
    bool continuous_usage;
    bool return_token_ids; /* "token_ids" (and "prompt_token_ids") in choices / chunks */
    const int32_t *prompt_ids; /* [n_prompt_ids] for prompt_token_ids */
    int n_prompt_ids;
    int index;           /* the choice a chunk belongs to (requests with n > 1) */
} ds_oai_resp_ctx;

/* What a finished request reports. */
typedef struct ds_oai_result {
    const char *text;       /* content (completions: the text) */
    const char *reasoning;  /* chat: reasoning_content, NULL if none */
    const ds_tool_parser *tools; /* chat: the parsed tool calls (NULL: none) */
    const ds_gen_token *toks;
    int n_toks;
    const char *finish_reason;
    const char *stop_str;   /* stop string that matched, else NULL */
    int stop_token;         /* stop_token_id that matched, else -1 */
    int n_prompt, n_gen;
    int n_cached;           /* prompt tokens taken over from the prefix cache */
} ds_oai_result;

/* A response's usage: prompt tokens (of them cached: usage.prompt_tokens_details.cached_tokens,
 * OpenAI's field, from the engine's prefix cache) and completion tokens. */
typedef struct ds_oai_usage {
    int n_prompt, n_cached, n_gen;
} ds_oai_usage;

/* Appends `s` (n bytes) to out with each invalid UTF-8 sequence replaced by U+FFFD. */
void ds_utf8_lossy(ds_strbuf *out, const char *s, size_t n);

/* The finish_reason reported: "tool_calls" for a normal stop after calls (as vLLM does), else
 * reason unchanged ("length" stays "length": the last call may be cut off). */
const char *ds_oai_finish_reason(const char *reason, const ds_tool_parser *tools);

char *ds_oai_response_json(const ds_oai_resp_ctx *c, const ds_oai_result *r);
/* n choices (r[i] is choice i, per_prompt consecutive ones sampled from one prompt): usage
 * counts each prompt once and sums the completions. */
char *ds_oai_response_json_n(const ds_oai_resp_ctx *c, const ds_oai_result *r, int n,
                             int per_prompt);

/* One SSE event ("data: {...}\n\n") appended to out. Chat: role → the first delta carries the
 * role; reasoning/content may be NULL. finish_reason NULL = not finished. */
void ds_oai_chunk(ds_strbuf *out, const ds_oai_resp_ctx *c, bool role, const char *reasoning,
                  const char *content, const ds_gen_token *toks, int n_toks,
                  const ds_oai_result *fin, ds_oai_usage u);
/* A chat chunk whose delta carries tool_calls (the items of `deltas`, an array of
 * {index, id?, type?, function: {name?, arguments}}). */
void ds_oai_tool_chunk(ds_strbuf *out, const ds_oai_resp_ctx *c, const cJSON *deltas,
                       const ds_gen_token *toks, int n_toks, ds_oai_usage u);
/* The final usage chunk (choices: []). */
void ds_oai_usage_chunk(ds_strbuf *out, const ds_oai_resp_ctx *c, ds_oai_usage u);
/* data: {"error": {...}} */
void ds_oai_error_event(ds_strbuf *out, const ds_oai_error *e);

#endif
