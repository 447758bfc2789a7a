/* gen.h — drives one submitted request from the HTTP thread: pulls engine events, detokenises
 * (UTF-8 safe), applies stop strings, splits reasoning, content and tool calls (chat), records per-token
 * logprobs and latency metrics. Shared by the streaming and the non-streaming paths, so both
 * produce the same text for the same tokens.
 *
 *   ds_gen_init(&g, req, &opts);
 *   while (!g.finished) {
 *       if (ds_gen_step(&g, 100) == 0) { check the client; continue; }
 *       use g.content / g.reasoning / g.toks (what this step released), then ds_gen_clear_step
 *   }
 *   ds_gen_free(&g);   // releases (and so cancels, if unfinished) the request */
#ifndef DS_SERVER_GEN_H
#define DS_SERVER_GEN_H

#include <stdbool.h>
#include <stdint.h>

#include "runtime/engine.h"
#include "sampling/stop.h"
#include "server/metrics.h"
#include "chat/tool_calls.h"
#include "server/strbuf.h"
#include "tokenizer/tokenizer.h"

typedef struct ds_gen_token {
    int32_t id;
    ds_sample_result s;   /* logprob, top alternatives */
    uint64_t text_offset; /* bytes of output text (before stop handling) preceding this token */
} ds_gen_token;

typedef struct ds_gen_opts {
    const ds_tokenizer *tok;
    const ds_sampling_params *sp; /* stop strings, include_stop_str_in_output, min_tokens */
    bool skip_special;
    bool want_tokens;             /* keep per-token ids + samples in toks (logprobs, token ids) */
    /* chat: options of the response parser (reasoning / content / tool calls, see
     * chat/tool_calls.h); NULL (completions): all text is content */
    const ds_tool_parser_opts *chat;
    ds_metrics *metrics;          /* NULL: no observations */
    double t_arrival;             /* monotonic seconds the request arrived */
} ds_gen_opts;

typedef struct ds_gen {
    ds_request *req;
    ds_gen_opts o;
    ds_detok detok;
    ds_stop_matcher stop;
    ds_tool_parser *tp;   /* chat only */
    /* released by the last step(s), until ds_gen_clear_step */
    ds_strbuf content;
    ds_strbuf reasoning;
    cJSON *tool_deltas;   /* OpenAI delta.tool_calls items ({index, id?, type?, function}) or NULL */
    ds_gen_token *toks; /* [n_toks] tokens consumed (only with want_tokens) */
    int n_toks, cap_toks;
    /* totals */
    int n_prompt;
    int n_cached;         /* of them, taken over from the engine's prefix cache */
    int n_generated;      /* tokens counted for usage (up to the one completing a stop string) */
    uint64_t text_bytes;  /* detokenised bytes so far */
    bool finished;
    const char *finish_reason; /* "stop" | "length" | "abort" once finished */
    int stop_token;            /* stop_token_id that finished it, else -1 */
    int stop_index;            /* stop string that finished it, else -1 */
    double t_first, t_last;    /* monotonic seconds of the first / latest token event */
    bool failed;               /* out of memory while building output */
} ds_gen;

double ds_now_s(void);

/* Takes ownership of req (released by ds_gen_free). Fails on OOM or a bad parser option
 * (returns false). */
bool ds_gen_init(ds_gen *g, ds_request *req, const ds_gen_opts *o);
/* Waits up to timeout_ms for the next event and processes it. Returns true when something
 * happened (tokens consumed or finished), false on timeout. */
bool ds_gen_step(ds_gen *g, int timeout_ms);
void ds_gen_clear_step(ds_gen *g);
/* What a step does with output text once stop strings are applied: parses it into content,
 * reasoning and tool_deltas (chat) or appends it to content. end: the output is complete (the
 * parser releases what it held). Exposed so tests can drive the response assembly with a fixed
 * text stream on a ds_gen made with req NULL. */
void ds_gen_feed_text(ds_gen *g, const char *text, size_t len, bool end);
/* Marks the request finished as aborted (client gone / shutdown) and cancels it. */
void ds_gen_abort(ds_gen *g);
void ds_gen_free(ds_gen *g);

#endif
