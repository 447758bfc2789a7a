/* test_server_tools.c — the server's chat response assembly with tool calls, on fixed model
 * outputs (no engine: a ds_gen made with req NULL is fed text the way ds_gen_step feeds what
 * the stop matcher releases). Streamed: the SSE chunks are parsed back and assembled the way
 * an OpenAI client does (tool_calls deltas merged by index); non-streamed: the response body.
 * Expected values are written from the OpenAI API shape and the model text by hand. Every
 * output is fed in several chunkings (1, 2, 5, 13 bytes and whole), which must all agree. */
#include "testlib.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "server/gen.h"
#include "server/openai_resp.h"

static const char *TOOLS =
    "[{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"parameters\": "
    "{\"type\": \"object\", \"properties\": {\"city\": {\"type\": \"string\"}, "
    "\"days\": {\"type\": \"integer\"}}}}},"
    " {\"type\": \"function\", \"function\": {\"name\": \"get_time\", \"parameters\": "
    "{\"type\": \"object\", \"properties\": {\"tz\": {\"type\": \"string\"}}}}}]";

typedef struct assembled {
    char content[512], reasoning[512];
    int n_calls;
    char id[4][64], name[4][64], args[4][256];
    int n_chunks_with_calls;
} assembled;

static void cat(char *dst, size_t cap, const char *s) {
    size_t n = strlen(dst);
    snprintf(dst + n, cap - n, "%s", s);
}

/* Parses every "data: {...}" event of sse and merges it like a client. */
static void assemble_sse(const char *sse, assembled *a) {
    memset(a, 0, sizeof *a);
    for (const char *p = strstr(sse, "data: "); p; p = strstr(p, "data: ")) {
        p += 6;
        const char *end = strstr(p, "\n\n");
        assert_non_null(end);
        cJSON *o = cJSON_ParseWithLength(p, (size_t)(end - p));
        assert_non_null(o);
        const cJSON *ch = cJSON_GetArrayItem(cJSON_GetObjectItem(o, "choices"), 0);
        const cJSON *d = cJSON_GetObjectItem(ch, "delta");
        const cJSON *v;
        if (cJSON_IsString(v = cJSON_GetObjectItem(d, "content"))) cat(a->content, sizeof a->content, v->valuestring);
        if (cJSON_IsString(v = cJSON_GetObjectItem(d, "reasoning_content")))
            cat(a->reasoning, sizeof a->reasoning, v->valuestring);
        const cJSON *tcs = cJSON_GetObjectItem(d, "tool_calls");
        if (tcs) a->n_chunks_with_calls++;
        for (const cJSON *t = tcs ? tcs->child : NULL; t; t = t->next) {
            int i = cJSON_GetObjectItem(t, "index")->valueint;
            assert_true(i >= 0 && i < 4);
            if (i + 1 > a->n_calls) a->n_calls = i + 1;
            const cJSON *fn = cJSON_GetObjectItem(t, "function");
            if (cJSON_IsString(v = cJSON_GetObjectItem(t, "id"))) {
                assert_string_equal(cJSON_GetObjectItem(t, "type")->valuestring, "function");
                snprintf(a->id[i], sizeof a->id[i], "%s", v->valuestring);
            }
            if (cJSON_IsString(v = cJSON_GetObjectItem(fn, "name"))) cat(a->name[i], sizeof a->name[i], v->valuestring);
            if (cJSON_IsString(v = cJSON_GetObjectItem(fn, "arguments"))) cat(a->args[i], sizeof a->args[i], v->valuestring);
        }
        cJSON_Delete(o);
        p = end;
    }
}

static void assert_json_equal(const char *got, const char *want) {
    cJSON *g = cJSON_Parse(got), *w = cJSON_Parse(want);
    assert_non_null(g);
    assert_non_null(w);
    if (!cJSON_Compare(g, w, 1)) fail_msg("JSON %s != %s", got, want);
    cJSON_Delete(g);
    cJSON_Delete(w);
}

static const ds_oai_resp_ctx CTX = {.kind = DS_OAI_CHAT, .id = "chatcmpl-t", .model = "m", .logprobs = -1};

/* Runs out through a ds_gen in chunks of `chunk` bytes (0: whole), writing each step's events
 * as the streaming handler does; returns the SSE text (malloc'd) and the final response body. */
static void run(const char *out, size_t chunk, bool parse_calls, bool in_reasoning,
                const cJSON *tools, char **sse, char **body) {
    ds_tool_parser_opts po = {.parse_calls = parse_calls, .in_reasoning = in_reasoning,
                              .tools = tools, .id_seed = 42};
    ds_sampling_params sp = {0}; /* no stop strings */
    ds_gen_opts go = {.sp = &sp, .chat = &po};
    ds_gen g;
    assert_true(ds_gen_init(&g, NULL, &go));
    ds_strbuf s, content, reasoning;
    ds_strbuf_init(&s);
    ds_strbuf_init(&content);
    ds_strbuf_init(&reasoning);
    size_t n = strlen(out), off = 0;
    do {
        size_t len = chunk && n - off > chunk ? chunk : n - off;
        ds_gen_feed_text(&g, out + off, len, false);
        off += len;
        if (off >= n) ds_gen_feed_text(&g, NULL, 0, true); /* end of output */
        if (g.reasoning.len) ds_oai_chunk(&s, &CTX, false, g.reasoning.data, NULL, NULL, 0, NULL, (ds_oai_usage){0});
        if (g.content.len) ds_oai_chunk(&s, &CTX, false, NULL, g.content.data, NULL, 0, NULL, (ds_oai_usage){0});
        if (g.tool_deltas) ds_oai_tool_chunk(&s, &CTX, g.tool_deltas, NULL, 0, (ds_oai_usage){0});
        ds_strbuf_append(&content, g.content.data ? g.content.data : "", g.content.len);
        ds_strbuf_append(&reasoning, g.reasoning.data ? g.reasoning.data : "", g.reasoning.len);
        ds_gen_clear_step(&g);
    } while (off < n);
    assert_false(g.failed);
    ds_oai_result r = {
        .text = content.data ? content.data : "",
        .reasoning = reasoning.len ? reasoning.data : NULL,
        .tools = g.tp,
        .finish_reason = ds_oai_finish_reason("stop", g.tp),
        .stop_token = -1,
    };
    *body = ds_oai_response_json(&CTX, &r);
    *sse = s.data ? s.data : calloc(1, 1);
    ds_strbuf_free(&content);
    ds_strbuf_free(&reasoning);
    ds_gen_free(&g);
}

static const size_t CHUNKS[] = {1, 2, 5, 13, 0};

static void test_xml_call_with_reasoning_and_content(void **state) {
    (void)state;
    /* Qwen3.5 output: the model opens its own think block, writes a sentence, then two calls. */
    const char *out = "<think>\nthe user wants weather\n</think>\n\nLet me check.\n<tool_call>\n"
                      "<function=get_weather>\n<parameter=city>\nSan Francisco\n</parameter>\n"
                      "<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>\n<tool_call>\n"
                      "<function=get_time>\n<parameter=tz>\nPST\n</parameter>\n</function>\n"
                      "</tool_call>";
    cJSON *tools = cJSON_Parse(TOOLS);
    for (size_t k = 0; k < sizeof CHUNKS / sizeof *CHUNKS; k++) {
        char *sse, *body;
        run(out, CHUNKS[k], true, false, tools, &sse, &body);
        assembled a;
        assemble_sse(sse, &a);
        assert_string_equal(a.reasoning, "the user wants weather");
        assert_string_equal(a.content, "Let me check.");
        assert_int_equal(a.n_calls, 2);
        assert_string_equal(a.name[0], "get_weather");
        assert_string_equal(a.name[1], "get_time");
        assert_json_equal(a.args[0], "{\"city\": \"San Francisco\", \"days\": 3}");
        assert_json_equal(a.args[1], "{\"tz\": \"PST\"}");
        assert_true(!strncmp(a.id[0], "call_", 5) && strcmp(a.id[0], a.id[1]) != 0);

        cJSON *o = cJSON_Parse(body);
        assert_non_null(o);
        const cJSON *ch = cJSON_GetArrayItem(cJSON_GetObjectItem(o, "choices"), 0);
        const cJSON *m = cJSON_GetObjectItem(ch, "message");
        assert_string_equal(cJSON_GetObjectItem(ch, "finish_reason")->valuestring, "tool_calls");
        assert_string_equal(cJSON_GetObjectItem(m, "content")->valuestring, "Let me check.");
        assert_string_equal(cJSON_GetObjectItem(m, "reasoning_content")->valuestring,
                            "the user wants weather");
        const cJSON *tcs = cJSON_GetObjectItem(m, "tool_calls");
        assert_int_equal(cJSON_GetArraySize(tcs), 2);
        for (int i = 0; i < 2; i++) {
            const cJSON *tc = cJSON_GetArrayItem(tcs, i);
            const cJSON *fn = cJSON_GetObjectItem(tc, "function");
            /* the streamed call equals the whole one, id included */
            assert_string_equal(cJSON_GetObjectItem(tc, "id")->valuestring, a.id[i]);
            assert_string_equal(cJSON_GetObjectItem(tc, "type")->valuestring, "function");
            assert_string_equal(cJSON_GetObjectItem(fn, "name")->valuestring, a.name[i]);
            assert_json_equal(cJSON_GetObjectItem(fn, "arguments")->valuestring, a.args[i]);
        }
        cJSON_Delete(o);
        free(sse);
        free(body);
    }
    cJSON_Delete(tools);
}

static void test_json_call_only(void **state) {
    (void)state;
    /* Qwen3 JSON form, prompt-opened reasoning (in_reasoning), nothing but a call after it */
    const char *out = "plan\n</think>\n\n<tool_call>\n{\"name\": \"get_time\", \"arguments\": "
                      "{\"tz\": \"UTC\"}}\n</tool_call>";
    cJSON *tools = cJSON_Parse(TOOLS);
    for (size_t k = 0; k < sizeof CHUNKS / sizeof *CHUNKS; k++) {
        char *sse, *body;
        run(out, CHUNKS[k], true, true, tools, &sse, &body);
        assembled a;
        assemble_sse(sse, &a);
        assert_string_equal(a.reasoning, "plan");
        assert_string_equal(a.content, "");
        assert_int_equal(a.n_calls, 1);
        assert_string_equal(a.name[0], "get_time");
        assert_json_equal(a.args[0], "{\"tz\": \"UTC\"}");
        cJSON *o = cJSON_Parse(body);
        const cJSON *ch = cJSON_GetArrayItem(cJSON_GetObjectItem(o, "choices"), 0);
        const cJSON *m = cJSON_GetObjectItem(ch, "message");
        assert_true(cJSON_IsNull(cJSON_GetObjectItem(m, "content"))); /* only a call: null */
        assert_string_equal(cJSON_GetObjectItem(ch, "finish_reason")->valuestring, "tool_calls");
        assert_int_equal(cJSON_GetArraySize(cJSON_GetObjectItem(m, "tool_calls")), 1);
        cJSON_Delete(o);
        free(sse);
        free(body);
    }
    cJSON_Delete(tools);
}

static void test_tool_choice_none_keeps_text(void **state) {
    (void)state;
    const char *out = "<tool_call>\n{\"name\": \"get_time\", \"arguments\": {}}\n</tool_call>";
    for (size_t k = 0; k < sizeof CHUNKS / sizeof *CHUNKS; k++) {
        char *sse, *body;
        run(out, CHUNKS[k], false, false, NULL, &sse, &body);
        assembled a;
        assemble_sse(sse, &a);
        assert_string_equal(a.content, out);
        assert_int_equal(a.n_calls, 0);
        assert_int_equal(a.n_chunks_with_calls, 0);
        cJSON *o = cJSON_Parse(body);
        const cJSON *ch = cJSON_GetArrayItem(cJSON_GetObjectItem(o, "choices"), 0);
        const cJSON *m = cJSON_GetObjectItem(ch, "message");
        assert_string_equal(cJSON_GetObjectItem(m, "content")->valuestring, out);
        assert_string_equal(cJSON_GetObjectItem(ch, "finish_reason")->valuestring, "stop");
        assert_int_equal(cJSON_GetArraySize(cJSON_GetObjectItem(m, "tool_calls")), 0);
        cJSON_Delete(o);
        free(sse);
        free(body);
    }
}

static void test_finish_reason(void **state) {
    (void)state;
    assert_string_equal(ds_oai_finish_reason("stop", NULL), "stop");
    assert_string_equal(ds_oai_finish_reason("length", NULL), "length");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_xml_call_with_reasoning_and_content),
        cmocka_unit_test(test_json_call_only),
        cmocka_unit_test(test_tool_choice_none_keeps_text),
        cmocka_unit_test(test_finish_reason),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
