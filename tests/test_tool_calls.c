/* Tool-call parsing from generated text (src/chat/tool_calls.c) on well-formed, malformed and
 * truncated outputs, in both call forms, with the <think> rule; every case is also fed in all
 * chunkings (1 byte, 2 bytes, ..., and pseudo-random splits) and must give identical events;
 * plus the request-side helpers (tools / tool_choice validation, prefill, reasoning detection).
 * Expected results are hand-written from the formats' definitions. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "chat/tool_calls.h"
#include "testlib.h"

#define MAXC 8

typedef struct result {
    char content[4096], reasoning[4096];
    int n_calls;
    char name[MAXC][260], id[MAXC][64], args[MAXC][1024];
    bool ended[MAXC], truncated[MAXC];
} result;

static void cat(char *dst, size_t cap, const char *s, size_t n) {
    size_t l = strlen(dst);
    assert_true(l + n < cap);
    memcpy(dst + l, s, n);
    dst[l + n] = 0;
}

static void apply(result *r, const ds_tc_event *ev, size_t n) {
    for (size_t i = 0; i < n; i++) {
        const ds_tc_event *e = &ev[i];
        assert_int_equal(strlen(e->text ? e->text : ""), e->text ? e->len : 0);
        switch (e->kind) {
        case DS_TC_CONTENT: cat(r->content, sizeof r->content, e->text, e->len); break;
        case DS_TC_REASONING: cat(r->reasoning, sizeof r->reasoning, e->text, e->len); break;
        case DS_TC_CALL_BEGIN:
            assert_int_equal(e->index, r->n_calls);
            assert_true(r->n_calls < MAXC);
            snprintf(r->name[e->index], sizeof r->name[0], "%s", e->name);
            snprintf(r->id[e->index], 64, "%s", e->id);
            r->n_calls++;
            break;
        case DS_TC_CALL_ARGS:
            assert_true(e->index == r->n_calls - 1);
            assert_false(r->ended[e->index]);
            cat(r->args[e->index], sizeof r->args[0], e->text, e->len);
            break;
        case DS_TC_CALL_END:
            assert_true(e->index == r->n_calls - 1);
            r->ended[e->index] = true;
            break;
        }
    }
}

static const cJSON *g_tools;

/* Parses text fed in chunks of `chunk` bytes (0: pseudo-random sizes from seed). */
static void parse_chunked(const char *text, bool calls, bool in_reasoning, size_t chunk,
                          unsigned seed, result *r) {
    memset(r, 0, sizeof *r);
    ds_tool_parser_opts o = {.parse_calls = calls, .in_reasoning = in_reasoning, .tools = g_tools,
                             .id_prefix = "call_"};
    ds_tool_parser *p = NULL;
    ds_error err = {0};
    assert_int_equal(ds_tool_parser_create(&o, &p, &err), DS_OK);
    size_t n = strlen(text), i = 0;
    const ds_tc_event *ev;
    size_t nev;
    while (i < n) {
        size_t k = chunk;
        if (!k) {
            seed = seed * 1103515245u + 12345u;
            k = 1 + (seed >> 16) % 9;
        }
        if (k > n - i) k = n - i;
        assert_int_equal(ds_tool_parser_push(p, text + i, k, &ev, &nev, &err), DS_OK);
        apply(r, ev, nev);
        i += k;
    }
    assert_int_equal(ds_tool_parser_finish(p, &ev, &nev, &err), DS_OK);
    apply(r, ev, nev);
    /* the accumulated results agree with the events */
    size_t cl, rl;
    assert_string_equal(ds_tool_parser_content(p, &cl), r->content);
    assert_string_equal(ds_tool_parser_reasoning(p, &rl), r->reasoning);
    assert_int_equal((int)ds_tool_parser_n_calls(p), r->n_calls);
    for (int c = 0; c < r->n_calls; c++) {
        const ds_tool_call *tc = ds_tool_parser_call(p, (size_t)c);
        assert_string_equal(tc->name, r->name[c]);
        assert_string_equal(tc->id, r->id[c]);
        assert_string_equal(tc->arguments, r->args[c]);
        assert_true(r->ended[c]);
        r->truncated[c] = tc->truncated;
    }
    ds_tool_parser_free(p);
}

/* Parses whole, then in every chunking, and checks they all agree; returns the whole result. */
static void parse_all_ways(const char *text, bool calls, bool in_reasoning, result *whole) {
    parse_chunked(text, calls, in_reasoning, strlen(text) + 1, 0, whole);
    result *r = malloc(sizeof *r);
    for (size_t chunk = 1; chunk <= 13; chunk++) {
        parse_chunked(text, calls, in_reasoning, chunk, 0, r);
        assert_string_equal(r->content, whole->content);
        assert_string_equal(r->reasoning, whole->reasoning);
        assert_int_equal(r->n_calls, whole->n_calls);
        for (int c = 0; c < r->n_calls; c++) {
            assert_string_equal(r->name[c], whole->name[c]);
            assert_string_equal(r->args[c], whole->args[c]);
            assert_int_equal(r->truncated[c], whole->truncated[c]);
        }
    }
    for (unsigned seed = 1; seed <= 20; seed++) {
        parse_chunked(text, calls, in_reasoning, 0, seed, r);
        assert_string_equal(r->content, whole->content);
        assert_string_equal(r->reasoning, whole->reasoning);
        assert_int_equal(r->n_calls, whole->n_calls);
        for (int c = 0; c < r->n_calls; c++) assert_string_equal(r->args[c], whole->args[c]);
    }
    free(r);
}

static const char *TOOLS_JSON =
    "[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"parameters\":{\"type\":\"object\","
    "\"properties\":{\"city\":{\"type\":\"string\"},\"days\":{\"type\":\"integer\"},"
    "\"metric\":{\"type\":\"boolean\"},\"ratio\":{\"type\":[\"number\",\"null\"]},"
    "\"opts\":{\"type\":\"object\"},\"tags\":{\"anyOf\":[{\"type\":\"null\"},{\"type\":\"array\"}]},"
    "\"zip\":{\"type\":\"string\"}}}}},"
    "{\"type\":\"function\",\"function\":{\"name\":\"run_shell\",\"parameters\":{\"type\":\"object\","
    "\"properties\":{\"command\":{\"type\":\"string\"}}}}}]";

static int setup(void **state) {
    (void)state;
    g_tools = cJSON_Parse(TOOLS_JSON);
    return g_tools ? 0 : -1;
}

static int teardown(void **state) {
    (void)state;
    cJSON_Delete((cJSON *)g_tools);
    return 0;
}

static void test_xml_well_formed(void **state) {
    (void)state;
    result r;
    parse_all_ways("Let me check the weather.\n\n<tool_call>\n<function=get_weather>\n"
                   "<parameter=city>\nParis\n</parameter>\n<parameter=days>\n3\n</parameter>\n"
                   "</function>\n</tool_call>",
                   true, false, &r);
    assert_string_equal(r.content, "Let me check the weather.");
    assert_string_equal(r.reasoning, "");
    assert_int_equal(r.n_calls, 1);
    assert_string_equal(r.name[0], "get_weather");
    assert_string_equal(r.id[0], "call_0");
    assert_string_equal(r.args[0], "{\"city\": \"Paris\", \"days\": 3}");
    assert_false(r.truncated[0]);
}

static void test_xml_two_calls_and_types(void **state) {
    (void)state;
    result r;
    parse_all_ways("<tool_call>\n<function=get_weather>\n<parameter=city>\nNew \"York\"\\\n</parameter>\n"
                   "<parameter=metric>\nTrue\n</parameter>\n<parameter=ratio>\n0.25\n</parameter>\n"
                   "<parameter=opts>\n{\"a\": [1, 2], \"big\": 12345678901234567890}\n</parameter>\n"
                   "<parameter=tags>\n[\"x\"]\n</parameter>\n<parameter=zip>\n01234\n</parameter>\n"
                   "<parameter=days>\nthree\n</parameter>\n<parameter=unknown>\n42\n</parameter>\n"
                   "</function>\n</tool_call>\n\n<tool_call>\n<function=run_shell>\n<parameter=command>\n"
                   "line1\nline2\t</tag>\n</parameter>\n</function>\n</tool_call>",
                   true, false, &r);
    assert_string_equal(r.content, "");
    assert_int_equal(r.n_calls, 2);
    assert_string_equal(r.args[0],
                        "{\"city\": \"New \\\"York\\\"\\\\\", \"metric\": true, \"ratio\": 0.25, "
                        "\"opts\": {\"a\": [1, 2], \"big\": 12345678901234567890}, \"tags\": [\"x\"], "
                        "\"zip\": \"01234\", \"days\": \"three\", \"unknown\": \"42\"}");
    assert_string_equal(r.name[1], "run_shell");
    assert_string_equal(r.id[1], "call_1");
    assert_string_equal(r.args[1], "{\"command\": \"line1\\nline2\\t</tag>\"}");
}

static void test_xml_lenient_endings(void **state) {
    (void)state;
    result r;
    /* no </parameter> before </function>, no </tool_call> at all, a function without
     * parameters, and a repeated parameter (first value kept) */
    parse_all_ways("<tool_call>\n<function=run_shell>\n<parameter=command>\nls\n</function>", true, false, &r);
    assert_int_equal(r.n_calls, 1);
    assert_string_equal(r.args[0], "{\"command\": \"ls\"}");
    assert_false(r.truncated[0]);
    parse_all_ways("<tool_call><function=get_weather></function></tool_call> done", true, false, &r);
    assert_string_equal(r.args[0], "{}");
    assert_string_equal(r.content, "done");
    parse_all_ways("<tool_call>\n<function=get_weather>\n<parameter=city>\nA\n</parameter>\n"
                   "<parameter=city>\nB\n</parameter>\n</function>\n</tool_call>",
                   true, false, &r);
    assert_string_equal(r.args[0], "{\"city\": \"A\"}");
}

static void test_json_form(void **state) {
    (void)state;
    result r;
    parse_all_ways("I'll look it up.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": "
                   "{\"city\": \"Paris\", \"id\": 12345678901234567890, \"f\": 1.50}}\n</tool_call>\n"
                   "<tool_call>\n{\"name\": \"run_shell\", \"arguments\": \"{\\\"command\\\": \\\"ls\\\"}\"}\n"
                   "</tool_call>",
                   true, false, &r);
    assert_string_equal(r.content, "I'll look it up.");
    assert_int_equal(r.n_calls, 2);
    assert_string_equal(r.name[0], "get_weather");
    /* verbatim: no precision lost, the model's spelling kept */
    assert_string_equal(r.args[0], "{\"city\": \"Paris\", \"id\": 12345678901234567890, \"f\": 1.50}");
    assert_string_equal(r.name[1], "run_shell");
    assert_string_equal(r.args[1], "{\"command\": \"ls\"}");
    /* "parameters" instead of "arguments", and no arguments at all */
    parse_all_ways("<tool_call>{\"name\": \"f\", \"parameters\": {\"x\": 1}}</tool_call>"
                   "<tool_call>{\"name\": \"g\"}</tool_call>", true, false, &r);
    assert_int_equal(r.n_calls, 2);
    assert_string_equal(r.args[0], "{\"x\": 1}");
    assert_string_equal(r.args[1], "{}");
}

static void test_think_rule(void **state) {
    (void)state;
    result r;
    /* the prompt opened the block: a call inside it is reasoning */
    parse_all_ways("\nMaybe <tool_call>\n<function=run_shell>\n<parameter=command>\nrm -rf /\n"
                   "</parameter>\n</function>\n</tool_call> - no.\n\n</think>\n\nNothing to do.",
                   true, true, &r);
    assert_int_equal(r.n_calls, 0);
    assert_string_equal(r.reasoning, "Maybe <tool_call>\n<function=run_shell>\n<parameter=command>\n"
                                     "rm -rf /\n</parameter>\n</function>\n</tool_call> - no.");
    assert_string_equal(r.content, "Nothing to do.");
    /* the model opens the block itself (Qwen3), then calls after it */
    parse_all_ways("<think>\nI need the weather.\n</think>\n\n<tool_call>\n{\"name\": \"get_weather\", "
                   "\"arguments\": {\"city\": \"Oslo\"}}\n</tool_call>",
                   true, false, &r);
    assert_string_equal(r.reasoning, "I need the weather.");
    assert_string_equal(r.content, "");
    assert_int_equal(r.n_calls, 1);
    assert_string_equal(r.args[0], "{\"city\": \"Oslo\"}");
    /* after content, <think> is plain text */
    parse_all_ways("Use <think> tags.", true, false, &r);
    assert_string_equal(r.content, "Use <think> tags.");
    assert_string_equal(r.reasoning, "");
    /* output ends inside the block: all reasoning */
    parse_all_ways("still thinking\n\n", true, true, &r);
    assert_string_equal(r.reasoning, "still thinking");
    assert_string_equal(r.content, "");
}

static void test_malformed(void **state) {
    (void)state;
    result r;
    const char *bad_json = "Sure.\n<tool_call>\n{\"name\": \"f\", \"arguments\": {oops}}\n</tool_call>";
    parse_all_ways(bad_json, true, false, &r);
    assert_int_equal(r.n_calls, 0);
    assert_string_equal(r.content, bad_json); /* verbatim */
    parse_all_ways("<tool_call>{\"arguments\": {}}</tool_call>", true, false, &r); /* no name */
    assert_int_equal(r.n_calls, 0);
    assert_string_equal(r.content, "<tool_call>{\"arguments\": {}}</tool_call>");
    parse_all_ways("<tool_call>\njust words\n</tool_call>", true, false, &r);
    assert_int_equal(r.n_calls, 0);
    assert_string_equal(r.content, "<tool_call>\njust words\n</tool_call>");
    parse_all_ways("<tool_call>\n<function=>\n</function>\n</tool_call>", true, false, &r); /* empty name */
    assert_int_equal(r.n_calls, 0);
    assert_string_equal(r.content, "<tool_call>\n<function=>\n</function>\n</tool_call>");
    parse_all_ways("<tool_call><function=bad\nname>", true, false, &r);
    assert_int_equal(r.n_calls, 0);
    assert_string_equal(r.content, "<tool_call><function=bad\nname>");
    /* tool_choice "none": tags are content */
    const char *call = "<tool_call>\n{\"name\": \"f\", \"arguments\": {}}\n</tool_call>";
    parse_all_ways(call, false, false, &r);
    assert_int_equal(r.n_calls, 0);
    assert_string_equal(r.content, call);
    /* a lone "<" and partial tags at the end are content */
    parse_all_ways("a < b and <tool_c", true, false, &r);
    assert_string_equal(r.content, "a < b and <tool_c");
}

/* Names at the length limit (256 bytes): a function or parameter name of 256 is taken, one of
 * 257 is malformed (function: the block is content; parameter: the tag is skipped), the same
 * in every chunking (the streaming parser once took 257 bytes when they came in one chunk and
 * 256 when they came one by one: found by fuzz_template). */
static void test_name_length_limit(void **state) {
    (void)state;
    static char text[2048], name[300];
    result r;
    for (int len = 255; len <= 257; len++) {
        memset(name, 'a', (size_t)len);
        name[len] = 0;
        snprintf(text, sizeof text, "<tool_call>\n<function=%s>\n</function>\n</tool_call>", name);
        parse_all_ways(text, true, false, &r);
        assert_int_equal(r.n_calls, len <= 256 ? 1 : 0);
        assert_string_equal(r.content, len <= 256 ? "" : text);
        snprintf(text, sizeof text,
                 "<tool_call>\n<function=f>\n<parameter=%s>\n1\n</parameter>\n</function>\n</tool_call>",
                 name);
        parse_all_ways(text, true, false, &r);
        assert_int_equal(r.n_calls, 1);
        assert_int_equal(strstr(r.args[0], name) != NULL, len <= 256);
    }
}

static void test_truncated(void **state) {
    (void)state;
    result r;
    /* cut inside a value: the value is never passed on half-written */
    parse_all_ways("<tool_call>\n<function=run_shell>\n<parameter=command>\nrm -rf /tmp/bu", true, false, &r);
    assert_int_equal(r.n_calls, 1);
    assert_string_equal(r.args[0], "{}");
    assert_true(r.truncated[0]);
    /* cut after a complete parameter */
    parse_all_ways("<tool_call>\n<function=get_weather>\n<parameter=city>\nRome\n</parameter>\n<param",
                   true, false, &r);
    assert_int_equal(r.n_calls, 1);
    assert_string_equal(r.args[0], "{\"city\": \"Rome\"}");
    assert_true(r.truncated[0]);
    /* cut inside the function name: no call, the text is content */
    parse_all_ways("<tool_call>\n<function=get_wea", true, false, &r);
    assert_int_equal(r.n_calls, 0);
    assert_string_equal(r.content, "<tool_call>\n<function=get_wea");
    /* JSON without its closing tag: kept when it parses, content when it does not */
    parse_all_ways("<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": 1}}\n", true, false, &r);
    assert_int_equal(r.n_calls, 1);
    assert_string_equal(r.args[0], "{\"a\": 1}");
    assert_true(r.truncated[0]);
    parse_all_ways("<tool_call>\n{\"name\": \"f\", \"argu", true, false, &r);
    assert_int_equal(r.n_calls, 0);
    assert_string_equal(r.content, "<tool_call>\n{\"name\": \"f\", \"argu");
    /* just the opening tag */
    parse_all_ways("Calling:\n<tool_call>\n", true, false, &r);
    assert_int_equal(r.n_calls, 0);
    assert_string_equal(r.content, "Calling:\n<tool_call>\n");
}

static void test_whitespace_rules(void **state) {
    (void)state;
    result r;
    parse_all_ways("  Hello  \n\nworld \n", true, false, &r);
    assert_string_equal(r.content, "  Hello  \n\nworld \n"); /* untouched without calls */
    parse_all_ways("A\n\n<tool_call>{\"name\": \"f\"}</tool_call>\n\n  B\n", true, false, &r);
    assert_string_equal(r.content, "AB\n");
    parse_all_ways("\n\nreason\n\n\n</think>\n\n\nAnswer\n", true, true, &r);
    assert_string_equal(r.reasoning, "reason");
    assert_string_equal(r.content, "Answer\n");
}

static void test_prefill(void **state) {
    (void)state;
    char *pre = ds_tool_call_prefill(DS_TOOL_FORMAT_XML, "get_weather", true);
    assert_string_equal(pre, "\n</think>\n\n<tool_call>\n<function=get_weather>\n");
    ds_tool_parser_opts o = {.parse_calls = true, .in_reasoning = true, .tools = g_tools,
                             .id_prefix = "x", .prefill = pre};
    ds_tool_parser *p = NULL;
    ds_error err = {0};
    assert_int_equal(ds_tool_parser_create(&o, &p, &err), DS_OK);
    const ds_tc_event *ev;
    size_t n;
    const char *gen = "<parameter=city>\nLima\n</parameter>\n</function>\n</tool_call>";
    assert_int_equal(ds_tool_parser_push(p, gen, strlen(gen), &ev, &n, &err), DS_OK);
    result r = {0};
    apply(&r, ev, n);
    assert_int_equal(ds_tool_parser_finish(p, &ev, &n, &err), DS_OK);
    apply(&r, ev, n);
    assert_int_equal(r.n_calls, 1);
    assert_string_equal(r.name[0], "get_weather");
    assert_string_equal(r.id[0], "x0");
    assert_string_equal(r.args[0], "{\"city\": \"Lima\"}");
    assert_string_equal(r.reasoning, "");
    ds_tool_parser_free(p);
    free(pre);
    pre = ds_tool_call_prefill(DS_TOOL_FORMAT_JSON, "f", false);
    assert_string_equal(pre, "<tool_call>\n{\"name\": \"f\", \"arguments\": ");
    free(pre);
}

static void test_random_ids(void **state) {
    (void)state;
    ds_tool_parser_opts o = {.parse_calls = true, .id_seed = 42};
    ds_tool_parser *p = NULL;
    ds_error err = {0};
    assert_int_equal(ds_tool_parser_create(&o, &p, &err), DS_OK);
    const ds_tc_event *ev;
    size_t n;
    const char *t = "<tool_call>{\"name\": \"a\"}</tool_call><tool_call>{\"name\": \"b\"}</tool_call>";
    assert_int_equal(ds_tool_parser_push(p, t, strlen(t), &ev, &n, &err), DS_OK);
    assert_int_equal(ds_tool_parser_finish(p, &ev, &n, &err), DS_OK);
    assert_int_equal(ds_tool_parser_n_calls(p), 2);
    const char *a = ds_tool_parser_call(p, 0)->id, *b = ds_tool_parser_call(p, 1)->id;
    assert_int_equal(strlen(a), 29);
    assert_memory_equal(a, "call_", 5);
    assert_string_not_equal(a, b);
    ds_tool_parser_free(p);
}

static void test_request_helpers(void **state) {
    (void)state;
    ds_error err = {0};
    assert_int_equal(ds_tools_validate(g_tools, &err), DS_OK);
    assert_int_equal(ds_tools_validate(NULL, &err), DS_OK);
    const char *bad[] = {
        "{}",
        "[{\"type\": \"code\", \"function\": {\"name\": \"f\"}}]",
        "[{\"type\": \"function\", \"function\": {\"name\": \"bad name\"}}]",
        "[{\"type\": \"function\", \"function\": {\"name\": \"f\", \"parameters\": 3}}]",
        "[{\"type\": \"function\", \"function\": {\"name\": \"f\"}}, {\"type\": \"function\", \"function\": {\"name\": \"f\"}}]",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        cJSON *j = cJSON_Parse(bad[i]);
        ds_error e2 = {0};
        assert_int_equal(ds_tools_validate(j, &e2), DS_ERR_INVALID_ARG);
        assert_true(strlen(e2.msg) > 0);
        cJSON_Delete(j);
    }
    ds_tool_choice c;
    assert_int_equal(ds_tool_choice_parse(NULL, g_tools, &c, &err), DS_OK);
    assert_int_equal(c.mode, DS_TOOL_CHOICE_AUTO);
    assert_int_equal(ds_tool_choice_parse(NULL, NULL, &c, &err), DS_OK);
    assert_int_equal(c.mode, DS_TOOL_CHOICE_NONE);
    cJSON *s = cJSON_CreateString("none");
    assert_int_equal(ds_tool_choice_parse(s, g_tools, &c, &err), DS_OK);
    assert_int_equal(c.mode, DS_TOOL_CHOICE_NONE);
    cJSON_Delete(s);
    s = cJSON_CreateString("required");
    assert_int_equal(ds_tool_choice_parse(s, g_tools, &c, &err), DS_OK);
    assert_int_equal(c.mode, DS_TOOL_CHOICE_REQUIRED);
    ds_error e3 = {0};
    assert_int_equal(ds_tool_choice_parse(s, NULL, &c, &e3), DS_ERR_INVALID_ARG);
    cJSON_Delete(s);
    cJSON *named = cJSON_Parse("{\"type\": \"function\", \"function\": {\"name\": \"run_shell\"}}");
    assert_int_equal(ds_tool_choice_parse(named, g_tools, &c, &err), DS_OK);
    assert_int_equal(c.mode, DS_TOOL_CHOICE_NAMED);
    assert_string_equal(c.name, "run_shell");
    cJSON *only = ds_tools_for_prompt(g_tools, &c);
    assert_int_equal(cJSON_GetArraySize(only), 1);
    assert_string_equal(cJSON_GetObjectItem(cJSON_GetObjectItem(cJSON_GetArrayItem(only, 0), "function"), "name")->valuestring,
                        "run_shell");
    cJSON_Delete(only);
    cJSON_Delete(named);
    named = cJSON_Parse("{\"type\": \"function\", \"function\": {\"name\": \"nope\"}}");
    ds_error e4 = {0};
    assert_int_equal(ds_tool_choice_parse(named, g_tools, &c, &e4), DS_ERR_INVALID_ARG);
    assert_non_null(strstr(e4.msg, "nope"));
    cJSON_Delete(named);

    cJSON *msgs = cJSON_Parse("[{\"role\": \"assistant\", \"tool_calls\": [{\"function\": {\"name\": \"f\", "
                              "\"arguments\": \"{\\\"a\\\": 1}\"}}, {\"function\": {\"name\": \"g\", "
                              "\"arguments\": \"not json\"}}]}]");
    ds_chat_messages_parse_arguments(msgs);
    const cJSON *calls = cJSON_GetObjectItem(cJSON_GetArrayItem(msgs, 0), "tool_calls");
    assert_true(cJSON_IsObject(cJSON_GetObjectItem(cJSON_GetObjectItem(cJSON_GetArrayItem(calls, 0), "function"), "arguments")));
    assert_true(cJSON_IsString(cJSON_GetObjectItem(cJSON_GetObjectItem(cJSON_GetArrayItem(calls, 1), "function"), "arguments")));
    cJSON_Delete(msgs);

    assert_int_equal(ds_tool_format_detect("...<function=example_function_name>..."), DS_TOOL_FORMAT_XML);
    assert_int_equal(ds_tool_format_detect("<tool_call>{\"name\": ...}"), DS_TOOL_FORMAT_JSON);
    assert_int_equal(ds_tool_format_detect(NULL), DS_TOOL_FORMAT_JSON);
    const char *open = "<|im_start|>assistant\n<think>\n";
    const char *closed = "<|im_start|>assistant\n<think>\n\n</think>\n\n";
    assert_true(ds_chat_prompt_opens_reasoning(open, strlen(open)));
    assert_false(ds_chat_prompt_opens_reasoning(closed, strlen(closed)));
    assert_false(ds_chat_prompt_opens_reasoning("<|im_start|>assistant\n", 22));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_xml_well_formed),  cmocka_unit_test(test_xml_two_calls_and_types),
        cmocka_unit_test(test_xml_lenient_endings), cmocka_unit_test(test_json_form),
        cmocka_unit_test(test_think_rule),       cmocka_unit_test(test_malformed),
        cmocka_unit_test(test_truncated),        cmocka_unit_test(test_whitespace_rules),
        cmocka_unit_test(test_prefill),          cmocka_unit_test(test_random_ids),
        cmocka_unit_test(test_request_helpers), cmocka_unit_test(test_name_length_limit),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
