/* fuzz_template.c — libFuzzer target for the chat-template engine and the tool-call parser.
 *
 * Input byte 0 picks the mode; the rest is the payload:
 *   bit 7 clear: the payload is template text, compiled and rendered against a fixed
 *                conversation (system, user, assistant with reasoning and tool calls, tool
 *                result; tools; bit 0: add_generation_prompt, bit 1: enable_thinking false).
 *                Must fail cleanly or render; small limits keep each run fast.
 *   bit 7 set:   the payload is model output fed to the tool-call parser whole and in chunks of
 *                (byte0 & 15) + 1 bytes (bit 6: starting inside <think>); both feedings must give
 *                the same content, reasoning and calls. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "chat/tool_calls.h"
#include "template/chat_template.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static const char *MESSAGES =
    "[{\"role\": \"system\", \"content\": \"You are terse.\"},"
    " {\"role\": \"user\", \"content\": \"Weather in Paris? \\u00e9\\ud83d\\ude00\"},"
    " {\"role\": \"assistant\", \"content\": \"<think>\\nlook up\\n</think>\\n\\n\", \"reasoning_content\": null,"
    "  \"tool_calls\": [{\"id\": \"c1\", \"type\": \"function\", \"function\": {\"name\": \"get_weather\","
    "  \"arguments\": {\"city\": \"Paris\", \"days\": 2, \"x\": [1.5, true, null]}}}]},"
    " {\"role\": \"tool\", \"content\": \"sunny\", \"tool_call_id\": \"c1\"},"
    " {\"role\": \"assistant\", \"content\": \"Sunny.\"}, {\"role\": \"user\", \"content\": \"thanks\"}]";
static const char *TOOLS =
    "[{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"description\": \"d\","
    " \"parameters\": {\"type\": \"object\", \"properties\": {\"city\": {\"type\": \"string\"},"
    " \"days\": {\"type\": \"integer\"}}, \"required\": [\"city\"]}}}]";

static cJSON *g_messages, *g_tools, *g_kw_off;

static void die(const char *what) {
    fprintf(stderr, "fuzz_template: %s\n", what);
    abort();
}

static void fuzz_template(const uint8_t *p, size_t n, uint8_t mode) {
    if (!g_messages) {
        g_messages = cJSON_Parse(MESSAGES);
        g_tools = cJSON_Parse(TOOLS);
        g_kw_off = cJSON_Parse("{\"enable_thinking\": false}");
        if (!g_messages || !g_tools || !g_kw_off) die("fixed conversation does not parse");
    }
    ds_chat_template *t = NULL;
    ds_error err = {0};
    if (ds_chat_template_compile((const char *)p, n, &t, &err) != DS_OK) {
        if (!err.msg[0]) die("compile failed without a message");
        return;
    }
    ds_chat_render_opts o = {
        .messages = g_messages,
        .tools = g_tools,
        .kwargs = (mode & 2) ? g_kw_off : NULL,
        .add_generation_prompt = mode & 1,
        .bos_token = "<s>",
        .eos_token = "</s>",
        .limits = {.max_output = 1 << 20, .max_memory = 64u << 20, .max_depth = 32, .max_steps = 200000},
    };
    char *out = NULL;
    size_t len = 0;
    ds_status st = ds_chat_template_render(t, &o, &out, &len, &err);
    if (st == DS_OK) {
        if (!out || strlen(out) > len || len > (1u << 20)) die("bad output");
    } else if (!err.msg[0] || out) {
        die("render failed without a message, or with output");
    }
    free(out);
    ds_chat_template_free(t);
}

typedef struct summary {
    char *content, *reasoning, *calls;
} summary;

static char *dup_str(const char *s) {
    size_t n = strlen(s) + 1;
    char *d = malloc(n);
    if (!d) die("oom");
    memcpy(d, s, n);
    return d;
}

static summary parse(const char *text, size_t n, size_t chunk, bool in_reasoning) {
    ds_tool_parser_opts o = {.parse_calls = true, .in_reasoning = in_reasoning, .tools = g_tools,
                             .id_prefix = "c"};
    ds_tool_parser *p = NULL;
    ds_error err = {0};
    if (ds_tool_parser_create(&o, &p, &err) != DS_OK) die("create");
    const ds_tc_event *ev;
    size_t nev;
    for (size_t i = 0; i < n; i += chunk) {
        size_t k = n - i < chunk ? n - i : chunk;
        if (ds_tool_parser_push(p, text + i, k, &ev, &nev, &err) != DS_OK) die("push");
    }
    if (ds_tool_parser_finish(p, &ev, &nev, &err) != DS_OK) die("finish");
    summary s;
    s.content = dup_str(ds_tool_parser_content(p, NULL));
    s.reasoning = dup_str(ds_tool_parser_reasoning(p, NULL));
    size_t total = 1;
    for (size_t i = 0; i < ds_tool_parser_n_calls(p); i++) {
        const ds_tool_call *c = ds_tool_parser_call(p, i);
        total += strlen(c->name) + strlen(c->arguments) + 4;
    }
    s.calls = malloc(total);
    if (!s.calls) die("oom");
    s.calls[0] = 0;
    for (size_t i = 0; i < ds_tool_parser_n_calls(p); i++) {
        const ds_tool_call *c = ds_tool_parser_call(p, i);
        strcat(s.calls, c->name);
        strcat(s.calls, "(");
        strcat(s.calls, c->arguments);
        strcat(s.calls, ")\n");
    }
    ds_tool_parser_free(p);
    return s;
}

static void fuzz_tool_calls(const uint8_t *p, size_t n, uint8_t mode) {
    if (!g_tools) fuzz_template((const uint8_t *)"", 0, 0); /* initialises the fixtures */
    bool in_reasoning = mode & 0x40;
    summary a = parse((const char *)p, n, n ? n : 1, in_reasoning);
    summary b = parse((const char *)p, n, (size_t)(mode & 15) + 1, in_reasoning);
    if (strcmp(a.content, b.content) || strcmp(a.reasoning, b.reasoning) || strcmp(a.calls, b.calls))
        die("chunked parse differs from whole parse");
    free(a.content), free(a.reasoning), free(a.calls);
    free(b.content), free(b.reasoning), free(b.calls);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1 || size > (64u << 10)) return 0;
    if (data[0] & 0x80)
        fuzz_tool_calls(data + 1, size - 1, data[0]);
    else
        fuzz_template(data + 1, size - 1, data[0]);
    return 0;
}
