/* tool_calls.h — OpenAI tool calling around a chat model's text: which tools a request offers,
 * and a streaming parser that turns generated text into content, reasoning and tool calls.
 *
 * Output forms understood (auto-detected per call):
 *   Qwen3.5 / Qwen3-Coder XML   <tool_call>\n<function=NAME>\n<parameter=P>\nVALUE\n</parameter>
 *                               ...</function>\n</tool_call>
 *   Qwen3 / Hermes JSON         <tool_call>\n{"name": "NAME", "arguments": {...}}\n</tool_call>
 * XML parameter values are typed by the tool's JSON schema (string stays a string; integer /
 * number / boolean / object / array / null are parsed when they parse, else kept as a string;
 * parameters without a schema type are strings). JSON-form arguments and XML values that parse
 * as JSON are passed through verbatim (no precision is lost).
 *
 * Reasoning: text inside <think>...</think> is reasoning, never a tool call. The block may be
 * opened by the prompt (opts.in_reasoning, see ds_chat_prompt_opens_reasoning) or by the model
 * at the very start of its output. Whitespace rule (the one the server's reasoning splitter and
 * Qwen's template use): newlines at both ends of the reasoning and at the start of the content
 * after </think> are dropped.
 *
 * Content: text outside reasoning and calls. Whitespace between content and a call, and right
 * after a call, is dropped. A <tool_call> block that is malformed (neither form, bad JSON, no
 * function name) is returned as content, verbatim.
 *
 * Truncation (output ends inside a call, e.g. max_tokens): a JSON call is kept if its text
 * parses; an XML call whose name was complete is closed with the parameters that were complete
 * (a cut-off value is dropped, never passed on half-written) and flagged truncated.
 *
 * Streaming: push text as it is generated; each push returns events (content / reasoning text,
 * call begin with id and name, argument JSON fragments, call end). The concatenated events
 * equal the final result, whatever the chunking. XML calls stream one parameter at a time;
 * JSON calls arrive whole when their closing tag does. */
#ifndef DS_CHAT_TOOL_CALLS_H
#define DS_CHAT_TOOL_CALLS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <cjson/cJSON.h>

#include "core/status.h"

/* ---- the request side ---------------------------------------------------------------------- */

typedef enum ds_tool_choice_mode {
    DS_TOOL_CHOICE_AUTO,     /* default when tools are given */
    DS_TOOL_CHOICE_NONE,     /* default without tools; calls are not parsed */
    DS_TOOL_CHOICE_REQUIRED, /* like auto (no constrained decoding) */
    DS_TOOL_CHOICE_NAMED,    /* {"type": "function", "function": {"name": ...}} */
} ds_tool_choice_mode;

typedef struct ds_tool_choice {
    ds_tool_choice_mode mode;
    char name[128]; /* NAMED */
} ds_tool_choice;

/* Validates an OpenAI "tools" array: each {"type": "function", "function": {"name": [A-Za-z0-9_.-]
 * 1..64 chars, "description"?: string, "parameters"?: object, "strict"?: bool}}; names unique.
 * NULL is valid (no tools). Messages name the offending index / field. */
ds_status ds_tools_validate(const cJSON *tools, ds_error *err);
/* Parses "tool_choice" (NULL: the default): "auto", "none", "required" or a named function
 * that must exist in tools. */
ds_status ds_tool_choice_parse(const cJSON *tool_choice, const cJSON *tools, ds_tool_choice *out,
                               ds_error *err);
/* The tools to render into the prompt: all of them, only the named one, or NULL when the
 * request has none. Returns a new array (caller cJSON_Delete's it) or NULL. */
cJSON *ds_tools_for_prompt(const cJSON *tools, const ds_tool_choice *choice);

/* Assistant messages of a request carry tool_calls[].function.arguments as JSON text; templates
 * written for transformers (Llama 3.1, gpt-oss, ...) expect an object there. Replaces every
 * such string that parses as a JSON object by the object, in place (as vLLM does). Templates
 * that accept both (Qwen) render the same either way up to JSON spacing. */
void ds_chat_messages_parse_arguments(cJSON *messages);

typedef enum ds_tool_format {
    DS_TOOL_FORMAT_JSON, /* <tool_call>{"name": ..., "arguments": ...}</tool_call> */
    DS_TOOL_FORMAT_XML,  /* <tool_call><function=NAME><parameter=P>...</tool_call> */
} ds_tool_format;

/* The call form a chat template teaches its model: XML when the template mentions
 * "<function=", JSON otherwise. NULL (the built-in template) gives JSON. */
ds_tool_format ds_tool_format_detect(const char *template_text);

/* Text to append after the generation prompt so that the model continues inside a call of the
 * named function (tool_choice naming one; there is no constrained decoding). When the prompt
 * leaves a reasoning block open, the block is closed empty first. malloc'd; caller frees. */
char *ds_tool_call_prefill(ds_tool_format format, const char *name, bool reasoning_open);

/* Does the rendered prompt end inside an open <think> block (Qwen3.5's generation prompt
 * "<|im_start|>assistant\n<think>\n")? Then the model's output starts as reasoning. */
bool ds_chat_prompt_opens_reasoning(const char *prompt, size_t len);

/* ---- the response side --------------------------------------------------------------------- */

typedef enum ds_tc_event_kind {
    DS_TC_CONTENT,    /* text of message.content */
    DS_TC_REASONING,  /* text of message.reasoning_content */
    DS_TC_CALL_BEGIN, /* a call starts: index, id, name */
    DS_TC_CALL_ARGS,  /* a fragment of the call's arguments (JSON text) */
    DS_TC_CALL_END,   /* the call is complete */
} ds_tc_event_kind;

typedef struct ds_tc_event {
    ds_tc_event_kind kind;
    int index;        /* CALL_*: position of the call in tool_calls */
    const char *text; /* CONTENT, REASONING, CALL_ARGS: NUL-terminated */
    size_t len;
    const char *id;   /* CALL_BEGIN */
    const char *name; /* CALL_BEGIN */
} ds_tc_event;

typedef struct ds_tool_call {
    char *id;
    char *name;
    char *arguments; /* JSON text of an object */
    bool truncated;  /* the output ended inside the call */
} ds_tool_call;

typedef struct ds_tool_parser_opts {
    bool parse_calls;     /* false (tool_choice "none", no tools): tags stay content */
    bool in_reasoning;    /* the prompt left the model inside <think> */
    const cJSON *tools;   /* tool definitions, for XML parameter types (copied); may be NULL */
    const char *id_prefix; /* ids are id_prefix + index; NULL: "call_" + 24 random characters */
    uint64_t id_seed;     /* randomness for the NULL-prefix ids */
    const char *prefill;  /* text the prompt already holds (ds_tool_call_prefill), parsed first */
} ds_tool_parser_opts;

typedef struct ds_tool_parser ds_tool_parser;

ds_status ds_tool_parser_create(const ds_tool_parser_opts *o, ds_tool_parser **out, ds_error *err);
void ds_tool_parser_free(ds_tool_parser *p);
/* Feeds generated text. *events / *n_events stay valid until the next push / finish / free. */
ds_status ds_tool_parser_push(ds_tool_parser *p, const char *text, size_t len,
                              const ds_tc_event **events, size_t *n_events, ds_error *err);
/* End of generation: releases what was held back. */
ds_status ds_tool_parser_finish(ds_tool_parser *p, const ds_tc_event **events, size_t *n_events,
                                ds_error *err);

/* Everything so far (valid until the next push / finish / free). */
const char *ds_tool_parser_content(const ds_tool_parser *p, size_t *len);
const char *ds_tool_parser_reasoning(const ds_tool_parser *p, size_t *len);
size_t ds_tool_parser_n_calls(const ds_tool_parser *p);
const ds_tool_call *ds_tool_parser_call(const ds_tool_parser *p, size_t i);

#endif
