/* chat_format.c — the built-in Qwen3.5 ChatML formatter (see chat_format.h for what it
 * reproduces and where it differs from the Qwen3 template). Comments quote the template lines
 * each block mirrors. */
#include "server/chat_format.h"

#include <string.h>

#include "server/json_py.h"

static bool starts_with(const char *s, const char *p) { return !strncmp(s, p, strlen(p)); }

static bool ends_with(const char *s, const char *p) {
    size_t ls = strlen(s), lp = strlen(p);
    return ls >= lp && !memcmp(s + ls - lp, p, lp);
}

/* Python's str.strip/lstrip/rstrip with the character '\n' only. */
static void append_stripped(ds_strbuf *out, const char *s, size_t n, bool left, bool right) {
    if (left)
        while (n && *s == '\n') s++, n--;
    if (right)
        while (n && s[n - 1] == '\n') n--;
    ds_strbuf_append(out, s, n);
}

/* The last occurrence of needle in s, or NULL. */
static const char *find_last(const char *s, const char *needle) {
    const char *last = NULL;
    for (const char *p = strstr(s, needle); p; p = strstr(p + 1, needle)) last = p;
    return last;
}

/* {%- if '</think>' in message.content %}
 *   content = message.content.split('</think>')[-1].lstrip('\n')
 *   reasoning_content = message.content.split('</think>')[0].rstrip('\n').split('<think>')[-1]
 *                       .lstrip('\n') */
static void split_reasoning(const char *content, ds_strbuf *reasoning, const char **rest) {
    const char *first_end = strstr(content, "</think>");
    const char *last_end = find_last(content, "</think>");
    *rest = last_end + strlen("</think>");
    while (**rest == '\n') (*rest)++;
    /* split('</think>')[0] = content[0, first_end); .rstrip('\n') */
    size_t n = (size_t)(first_end - content);
    while (n && content[n - 1] == '\n') n--;
    /* .split('<think>')[-1]: after the last <think> within that prefix */
    const char *start = content;
    for (const char *p = content; p + 7 <= content + n; p++)
        if (!memcmp(p, "<think>", 7)) start = p + 7;
    n -= (size_t)(start - content);
    append_stripped(reasoning, start, n, true, false);
}

static void render_tool_call(ds_strbuf *out, const cJSON *tc) {
    /* {%- if tool_call.function %}{%- set tool_call = tool_call.function %} */
    const cJSON *fn = cJSON_GetObjectItemCaseSensitive(tc, "function");
    if (cJSON_IsObject(fn)) tc = fn;
    const cJSON *name = cJSON_GetObjectItemCaseSensitive(tc, "name");
    const cJSON *args = cJSON_GetObjectItemCaseSensitive(tc, "arguments");
    ds_strbuf_puts(out, "<tool_call>\n{\"name\": \"");
    if (cJSON_IsString(name)) ds_strbuf_puts(out, name->valuestring);
    ds_strbuf_puts(out, "\", \"arguments\": ");
    /* {%- if tool_call.arguments is string %} raw {%- else %} tojson */
    if (cJSON_IsString(args)) ds_strbuf_puts(out, args->valuestring);
    else ds_json_py_dump(out, args);
    ds_strbuf_puts(out, "}\n</tool_call>");
}

static bool is_tool_response(const char *content) {
    return starts_with(content, "<tool_response>") && ends_with(content, "</tool_response>");
}

static ds_status qwen35_render(const ds_chat_formatter *f, const ds_chat_message *m, int n,
                               const ds_chat_opts *o, ds_strbuf *out, bool *reasoning_open,
                               ds_error *err) {
    (void)f;
    *reasoning_open = false;
    if (n < 1) return ds_error_set(err, DS_ERR_INVALID_ARG, "messages: at least one message is required");
    if (o->continue_final_message && strcmp(m[n - 1].role, "assistant") != 0)
        return ds_error_set(err, DS_ERR_INVALID_ARG,
                            "continue_final_message: the last message must be an assistant message");
    bool has_tools = cJSON_IsArray(o->tools) && cJSON_GetArraySize(o->tools) > 0;
    bool first_system = !strcmp(m[0].role, "system");

    /* System block. */
    if (has_tools) {
        ds_strbuf_puts(out, "<|im_start|>system\n");
        if (first_system) {
            ds_strbuf_puts(out, m[0].content);
            ds_strbuf_puts(out, "\n\n");
        }
        ds_strbuf_puts(out, "# Tools\n\nYou may call one or more functions to assist with the user "
                            "query.\n\nYou are provided with function signatures within "
                            "<tools></tools> XML tags:\n<tools>");
        for (const cJSON *t = o->tools->child; t; t = t->next) {
            ds_strbuf_puts(out, "\n");
            ds_json_py_dump(out, t);
        }
        ds_strbuf_puts(out, "\n</tools>\n\nFor each function call, return a json object with "
                            "function name and arguments within <tool_call></tool_call> XML "
                            "tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": "
                            "<args-json-object>}\n</tool_call><|im_end|>\n");
    } else if (first_system) {
        ds_strbuf_puts(out, "<|im_start|>system\n");
        ds_strbuf_puts(out, m[0].content);
        ds_strbuf_puts(out, "<|im_end|>\n");
    }

    /* ns.last_query_index: the last user message that is not a wrapped tool response. */
    int last_query = n - 1;
    for (int i = n - 1; i >= 0; i--)
        if (!strcmp(m[i].role, "user") && !is_tool_response(m[i].content)) {
            last_query = i;
            break;
        }

    ds_strbuf reasoning;
    ds_strbuf_init(&reasoning);
    for (int i = 0; i < n; i++) {
        const ds_chat_message *msg = &m[i];
        bool last = i == n - 1;
        if (!strcmp(msg->role, "user") || (!strcmp(msg->role, "system") && i > 0)) {
            ds_strbuf_printf(out, "<|im_start|>%s\n", msg->role);
            ds_strbuf_puts(out, msg->content);
            ds_strbuf_puts(out, "<|im_end|>\n");
        } else if (!strcmp(msg->role, "assistant")) {
            const char *content = msg->content;
            ds_strbuf_clear(&reasoning);
            if (msg->reasoning_content) ds_strbuf_puts(&reasoning, msg->reasoning_content);
            else if (strstr(content, "</think>")) split_reasoning(content, &reasoning, &content);
            const char *r = reasoning.data ? reasoning.data : "";
            if (i > last_query && (last || r[0])) {
                /* '<think>\n' + reasoning_content.strip('\n') + '\n</think>\n\n' +
                 * content.lstrip('\n') */
                ds_strbuf_puts(out, "<|im_start|>assistant\n<think>\n");
                append_stripped(out, r, strlen(r), true, true);
                ds_strbuf_puts(out, "\n</think>\n\n");
                append_stripped(out, content, strlen(content), true, false);
            } else {
                ds_strbuf_puts(out, "<|im_start|>assistant\n");
                ds_strbuf_puts(out, content);
            }
            if (cJSON_IsArray(msg->tool_calls)) {
                bool first = true;
                for (const cJSON *tc = msg->tool_calls->child; tc; tc = tc->next) {
                    if ((first && content[0]) || !first) ds_strbuf_puts(out, "\n");
                    render_tool_call(out, tc);
                    first = false;
                }
            }
            if (!(last && o->continue_final_message)) ds_strbuf_puts(out, "<|im_end|>\n");
        } else if (!strcmp(msg->role, "tool")) {
            if (i == 0 || strcmp(m[i - 1].role, "tool") != 0) ds_strbuf_puts(out, "<|im_start|>user");
            ds_strbuf_puts(out, "\n<tool_response>\n");
            ds_strbuf_puts(out, msg->content);
            ds_strbuf_puts(out, "\n</tool_response>");
            if (last || strcmp(m[i + 1].role, "tool") != 0) ds_strbuf_puts(out, "<|im_end|>\n");
        } else if (strcmp(msg->role, "system") != 0) {
            ds_strbuf_free(&reasoning);
            return ds_error_set(err, DS_ERR_INVALID_ARG,
                                "messages[%d].role: '%s' is not one of system, user, assistant, "
                                "tool",
                                i, msg->role);
        }
    }
    ds_strbuf_free(&reasoning);
    if (o->add_generation_prompt && !o->continue_final_message) {
        ds_strbuf_puts(out, "<|im_start|>assistant\n");
        if (o->enable_thinking) {
            ds_strbuf_puts(out, "<think>\n");
            *reasoning_open = true;
        } else {
            ds_strbuf_puts(out, "<think>\n\n</think>\n\n");
        }
    }
    if (!ds_strbuf_ok(out)) return ds_error_set(err, DS_ERR_NOMEM, "chat prompt: out of memory");
    return DS_OK;
}

static const ds_chat_formatter qwen35 = {
    .name = "qwen3.5",
    .reasoning_end = "</think>",
    .render = qwen35_render,
    .tool_format = DS_TOOL_FORMAT_JSON,
    .impl = NULL,
};

const ds_chat_formatter *ds_chat_formatter_qwen35(void) { return &qwen35; }
