/* chat_template.h — Hugging Face chat templates (Jinja) rendered in C.
 *
 * A checkpoint's chat template (tokenizer_config.json "chat_template", or chat_template.jinja)
 * is compiled once and rendered per request with the conversation, the tool list and the
 * caller's chat_template_kwargs, the way transformers' apply_chat_template does it.
 *
 * Semantics follow the reference renderer @huggingface/jinja (what the tests compare against
 * byte for byte): lstrip_blocks + trim_blocks on, `{% generation %}` tags removed, JavaScript
 * spellings where that renderer has them (`{{ true }}` prints "true", none prints nothing, tojson
 * writes numbers as JSON.stringify does). Where the reference lacks something Python Jinja2 has
 * (it ignores the chars argument of strip/lstrip/rstrip, knows no select/reject filter or test
 * arguments), the Python behaviour is implemented. See tests/jinja/README.md for the list.
 *
 * Untrusted input: template text, messages, tools and kwargs may come from a checkpoint or an
 * HTTP body. Errors (syntax, runtime, raise_exception, limits) come back as a ds_status with a
 * message naming the template line; nothing crashes, recursion depth, output size, memory and
 * evaluation steps are bounded.
 *
 * Thread safety: a compiled ds_chat_template is immutable; render may run concurrently on it. */
#ifndef DS_CHAT_TEMPLATE_H
#define DS_CHAT_TEMPLATE_H

#include <stdbool.h>
#include <stddef.h>

#include <cjson/cJSON.h>

#include "core/status.h"

typedef struct ds_chat_template ds_chat_template;

/* Parses template text (len bytes, need not be NUL-terminated). Syntax errors give
 * DS_ERR_FORMAT "chat template line N: ...". *out owned by the caller. */
ds_status ds_chat_template_compile(const char *text, size_t len, ds_chat_template **out,
                                   ds_error *err);
void ds_chat_template_free(ds_chat_template *t);
/* The source text as given to compile (NUL-terminated). */
const char *ds_chat_template_source(const ds_chat_template *t);

/* Limits of one render; zero fields take the defaults below. */
typedef struct ds_chat_limits {
    size_t max_output;  /* bytes of any string the template builds (default 64 MiB) */
    size_t max_memory;  /* bytes of working memory (default 256 MiB) */
    int max_depth;      /* nesting of macro / call / filter-block invocations (default 64) */
    unsigned long max_steps; /* evaluated expressions (default 10M) */
} ds_chat_limits;

typedef struct ds_chat_render_opts {
    const cJSON *messages;       /* JSON array of {role, content, ...} (required) */
    const cJSON *tools;          /* JSON array or NULL: NULL renders `tools` as none */
    const cJSON *kwargs;         /* JSON object or NULL: chat_template_kwargs, one variable each */
    bool add_generation_prompt;
    /* Leave the final (assistant) message open for the model to continue: the rendered text is
     * cut after that message's content, as transformers does. Exclusive with
     * add_generation_prompt. */
    bool continue_final_message;
    const char *bos_token;       /* NULL: undefined in the template */
    const char *eos_token;
    /* Spell numbers as Python does (what transformers renders): json.dumps / repr of floats
     * ("1e-05", "1e+20", "2.5"; NaN / Infinity) instead of the reference renderer's JavaScript
     * ("0.00001", "100000000000000000000"). Integral JSON numbers below 1e16 stay integers either
     * way (cJSON does not keep "2.0" apart from "2"). The server should set it; the byte-for-byte
     * comparison with @huggingface/jinja runs with it off. */
    bool python_numbers;
    ds_chat_limits limits;
} ds_chat_render_opts;

/* Renders into *out (malloc'd, NUL-terminated, owned by the caller) / *out_len.
 * DS_ERR_INVALID_ARG: bad inputs (messages not an array, kwargs clash with a reserved name,
 * continue_final_message without a final message to continue); DS_ERR_FORMAT: the template
 * failed at run time (message "chat template line N: ..."), including raise_exception. */
ds_status ds_chat_template_render(const ds_chat_template *t, const ds_chat_render_opts *o,
                                  char **out, size_t *out_len, ds_error *err);

/* Convenience for JSON text inputs (tools_json / kwargs_json may be NULL). */
ds_status ds_chat_template_render_json(const ds_chat_template *t, const char *messages_json,
                                       const char *tools_json, const char *kwargs_json,
                                       bool add_generation_prompt, bool continue_final_message,
                                       const char *bos_token, const char *eos_token, char **out,
                                       size_t *out_len, ds_error *err);

/* ---- a checkpoint's template -------------------------------------------------------------- */

/* What a model directory says about chat formatting. */
typedef struct ds_chat_source {
    char *template_text;      /* NULL when the checkpoint has none (caller uses the fallback) */
    char *tool_template_text; /* a named "tool_use" template, NULL if none */
    char *origin;             /* "chat_template.jinja", "tokenizer_config.json" or "built-in" */
    char *bos_token;          /* NULL when absent */
    char *eos_token;
} ds_chat_source;

/* Reads DIR/chat_template.jinja (preferred, as transformers does) or DIR/tokenizer_config.json
 * "chat_template" (a string, or a list of {name, template} where "default" and "tool_use" are
 * used), plus bos_token / eos_token (strings or {content: ...}). A directory with neither
 * template gives template_text NULL and DS_OK. dir may also name tokenizer_config.json itself. */
ds_status ds_chat_source_load(const char *dir, ds_chat_source *out, ds_error *err);
void ds_chat_source_free(ds_chat_source *s);
/* The text to compile for a request: the tool_use template when tools are given and the
 * checkpoint has one, else the default one (NULL when neither exists). */
const char *ds_chat_source_pick(const ds_chat_source *s, bool have_tools);

/* Built-in Qwen3.5 ChatML template (Jinja text) for checkpoints without one: the Qwen3 layout
 * (system + tools block, <think> reasoning kept after the last user query, <tool_call> JSON
 * history, grouped <tool_response> turns) with Qwen3.5's generation prompt, which opens the
 * reasoning block ("<think>\n"; "<think>\n\n</think>\n\n" when enable_thinking is false). */
const char *ds_chat_template_qwen35_fallback(void);

/* JavaScript's Number.prototype.toString spelling of v (shortest round-trip digits), the
 * spelling tojson uses. buf needs 32 bytes; returns the length. */
size_t ds_json_number_format(double v, char buf[32]);

#endif
