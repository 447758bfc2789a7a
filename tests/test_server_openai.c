/* test_server_openai.c — OpenAI request validation (every bad-input class gets a 400 naming the
 * right param, never a crash), defaults and field mapping, and the shape of responses, chunks
 * and error bodies as OpenAI clients read them. */
#include "testlib.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "server/openai_req.h"
#include "server/openai_resp.h"

typedef struct bad_case {
    ds_oai_kind kind;
    const char *body;
    const char *param; /* expected param; "" = null */
} bad_case;

#define C DS_OAI_COMPLETIONS
#define H DS_OAI_CHAT
#define MSG "\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]"

static const bad_case BAD[] = {
    /* malformed JSON / not an object */
    {C, "{\"prompt\": \"x\",", ""},
    {C, "", ""},
    {C, "[1,2]", ""},
    {H, "nul", ""},
    /* prompt */
    {C, "{}", "prompt"},
    {C, "{\"prompt\": 5}", "prompt"},
    {C, "{\"prompt\": \"\"}", "prompt"},
    {C, "{\"prompt\": []}", "prompt"},
    {C, "{\"prompt\": [1, \"a\"]}", "prompt"},
    {C, "{\"prompt\": [1, -3]}", "prompt"},
    {C, "{\"prompt\": [1.5]}", "prompt"},
    {C, "{\"prompt\": [\"a\", \"\"]}", "prompt"},
    {C, "{\"prompt\": [\"a\", [1, -2]]}", "prompt"},
    {C, "{\"prompt\": [\"a\", 3]}", "prompt"},
    {C, "{\"prompt\": [\"a\", \"b\", \"c\", \"d\", \"e\"], \"n\": 13, \"max_tokens\": 1}", "n"},
    {C, "{\"prompt\": {\"text\": \"a\"}}", "prompt"},
    /* messages */
    {H, "{}", "messages"},
    {H, "{\"messages\": \"hi\"}", "messages"},
    {H, "{\"messages\": []}", "messages"},
    {H, "{\"messages\": [5]}", "messages"},
    {H, "{\"messages\": [{\"content\": \"x\"}]}", "messages"},
    {H, "{\"messages\": [{\"role\": \"wizard\", \"content\": \"x\"}]}", "messages"},
    {H, "{\"messages\": [{\"role\": \"user\"}]}", "messages"},
    {H, "{\"messages\": [{\"role\": \"user\", \"content\": 7}]}", "messages"},
    {H, "{\"messages\": [{\"role\": \"user\", \"content\": [{\"type\": \"image_url\"}]}]}", "messages"},
    {H, "{\"messages\": [{\"role\": \"assistant\", \"content\": \"x\", \"tool_calls\": 3}]}", "messages"},
    /* wrong types */
    {C, "{\"prompt\": \"x\", \"max_tokens\": \"5\"}", "max_tokens"},
    {C, "{\"prompt\": \"x\", \"max_tokens\": 2.5}", "max_tokens"},
    {C, "{\"prompt\": \"x\", \"temperature\": \"hot\"}", "temperature"},
    {C, "{\"prompt\": \"x\", \"top_p\": true}", "top_p"},
    {C, "{\"prompt\": \"x\", \"top_k\": 1.5}", "top_k"},
    {C, "{\"prompt\": \"x\", \"stream\": 1}", "stream"},
    {C, "{\"prompt\": \"x\", \"stop\": 5}", "stop"},
    {C, "{\"prompt\": \"x\", \"stop\": [\"a\", 1]}", "stop"},
    {C, "{\"prompt\": \"x\", \"stop_token_ids\": [\"a\"]}", "stop_token_ids"},
    {C, "{\"prompt\": \"x\", \"seed\": \"7\"}", "seed"},
    {C, "{\"prompt\": \"x\", \"seed\": 1e20}", "seed"},
    {C, "{\"prompt\": \"x\", \"seed\": -1e19}", "seed"},
    {C, "{\"prompt\": \"x\", \"logprobs\": true}", "logprobs"},
    {C, "{\"prompt\": \"x\", \"model\": 3}", "model"},
    {C, "{\"prompt\": \"x\", \"ignore_eos\": \"yes\"}", "ignore_eos"},
    {H, "{" MSG ", \"logprobs\": 3}", "logprobs"},
    {H, "{" MSG ", \"chat_template_kwargs\": {\"enable_thinking\": \"no\"}}", "chat_template_kwargs"},
    {H, "{" MSG ", \"tools\": {}}", "tools"},
    /* out of range */
    {C, "{\"prompt\": \"x\", \"max_tokens\": -1}", "max_tokens"},
    {C, "{\"prompt\": \"x\", \"max_tokens\": 0}", "max_tokens"},
    {H, "{" MSG ", \"max_completion_tokens\": -5}", "max_completion_tokens"},
    {C, "{\"prompt\": \"x\", \"top_p\": 0}", "top_p"},
    {C, "{\"prompt\": \"x\", \"top_p\": 1.5}", "top_p"},
    {C, "{\"prompt\": \"x\", \"temperature\": -0.5}", "temperature"},
    {C, "{\"prompt\": \"x\", \"temperature\": 1e999}", "temperature"},
    {C, "{\"prompt\": \"x\", \"top_k\": -2}", "top_k"},
    {C, "{\"prompt\": \"x\", \"min_p\": 1.5}", "min_p"},
    {C, "{\"prompt\": \"x\", \"presence_penalty\": 2.5}", "presence_penalty"},
    {C, "{\"prompt\": \"x\", \"frequency_penalty\": -3}", "frequency_penalty"},
    {C, "{\"prompt\": \"x\", \"repetition_penalty\": 0}", "repetition_penalty"},
    {C, "{\"prompt\": \"x\", \"logprobs\": 21}", "logprobs"},
    {C, "{\"prompt\": \"x\", \"logprobs\": -1}", "logprobs"},
    {C, "{\"prompt\": \"x\", \"max_tokens\": 4, \"min_tokens\": 5}", "min_tokens"},
    {C, "{\"prompt\": \"x\", \"min_tokens\": -1}", "min_tokens"},
    {C, "{\"prompt\": \"x\", \"stop\": [\"\"]}", "stop"},
    {H, "{" MSG ", \"top_logprobs\": 21, \"logprobs\": true}", "top_logprobs"},
    {H, "{" MSG ", \"top_logprobs\": 2}", "top_logprobs"},
    {C, "{\"prompt\": \"x\", \"logit_bias\": [5]}", "logit_bias"},
    {C, "{\"prompt\": \"x\", \"logit_bias\": {\"abc\": 1}}", "logit_bias"},
    {C, "{\"prompt\": \"x\", \"logit_bias\": {\"-5\": 1}}", "logit_bias"},
    {C, "{\"prompt\": \"x\", \"logit_bias\": {\"\": 1}}", "logit_bias"},
    {C, "{\"prompt\": \"x\", \"logit_bias\": {\"12345678901\": 1}}", "logit_bias"},
    {C, "{\"prompt\": \"x\", \"logit_bias\": {\"5\": \"1\"}}", "logit_bias"},
    {C, "{\"prompt\": \"x\", \"logit_bias\": {\"5\": 1, \"5\": 2}}", "logit_bias"},
    /* unsupported */
    {C, "{\"prompt\": \"x\", \"n\": 17}", "n"},
    {C, "{\"prompt\": \"x\", \"n\": 0}", "n"},
    {C, "{\"prompt\": \"x\", \"best_of\": 3}", "best_of"},
    /* vLLM extensions that would change the output if honoured: refused, not ignored */
    {H, "{" MSG ", \"guided_json\": {\"type\": \"string\"}}", "guided_json"},
    {H, "{" MSG ", \"guided_json\": \"{nope\"}", "guided_json"},
    {H, "{" MSG ", \"guided_json\": {\"type\": \"object\"}, \"response_format\": {\"type\": "
        "\"json_object\"}}", "guided_json"},
    {C, "{\"prompt\": \"x\", \"guided_choice\": [\"a\", \"b\"]}", "guided_choice"},
    {C, "{\"prompt\": \"x\", \"guided_regex\": \"[0-9]+\"}", "guided_regex"},
    {H, "{" MSG ", \"structured_outputs\": {\"json\": {}}}", "structured_outputs"},
    {H, "{" MSG ", \"structured_outputs\": {\"regex\": \"a+\"}}", "structured_outputs"},
    {H, "{" MSG ", \"structured_outputs\": {\"json\": {\"type\": \"object\"}}, \"guided_json\": "
        "{\"type\": \"object\"}}", "structured_outputs"},
    {C, "{\"prompt\": \"x\", \"allowed_token_ids\": [1, 2]}", "allowed_token_ids"},
    {C, "{\"prompt\": \"x\", \"bad_words\": [\"no\"]}", "bad_words"},
    {C, "{\"prompt\": \"x\", \"prompt_logprobs\": 1}", "prompt_logprobs"},
    {C, "{\"prompt\": \"x\", \"truncate_prompt_tokens\": 8}", "truncate_prompt_tokens"},
    {C, "{\"prompt\": \"x\", \"use_beam_search\": true}", "use_beam_search"},
    {C, "{\"prompt\": \"x\", \"suffix\": \"y\"}", "suffix"},
    {C, "{\"prompt\": \"x\", \"echo\": true, \"logprobs\": 1}", "echo"},
    {C, "{\"prompt\": \"x\", \"stream_options\": {\"include_usage\": true}}", "stream_options"},
    {H, "{" MSG ", \"tool_choice\": \"required\"}", "tool_choice"},
    {H, "{" MSG ", \"response_format\": {\"type\": \"json_schema\", \"json_schema\": {}}}",
     "response_format"},
    {H, "{" MSG ", \"response_format\": {\"type\": 3}}", "response_format"},
    {H, "{" MSG ", \"response_format\": \"json_object\"}", "response_format"},
    {H, "{" MSG ", \"continue_final_message\": true, \"add_generation_prompt\": true}",
     "continue_final_message"},
};

static void test_bad_requests(void **state) {
    (void)state;
    for (size_t i = 0; i < sizeof BAD / sizeof BAD[0]; i++) {
        ds_oai_request r;
        ds_oai_error e;
        memset(&e, 0, sizeof e);
        bool ok = ds_oai_parse(BAD[i].kind, BAD[i].body, strlen(BAD[i].body), &r, &e);
        if (ok) fail_msg("accepted: %s", BAD[i].body);
        if (e.status != 400 || strcmp(e.param, BAD[i].param) != 0 || !e.message[0])
            fail_msg("%s → status %d param '%s' (want 400 '%s'): %s", BAD[i].body, e.status,
                     e.param, BAD[i].param, e.message);
        assert_string_equal(e.type, "invalid_request_error");
        ds_oai_request_free(&r);
    }
}

/* Proves: response_format json_schema compiles its schema at parse time (JSON mode on, the
 * schema kept), and a schema outside the subset is a 400 on response_format whose message
 * names the keyword and where it is. */
static void test_json_schema_format(void **state) {
    (void)state;
    ds_oai_request r;
    ds_oai_error e;
    const char *ok = "{" MSG ", \"response_format\": {\"type\": \"json_schema\", \"json_schema\": "
                     "{\"name\": \"p\", \"strict\": true, \"schema\": {\"type\": \"object\", "
                     "\"properties\": {\"a\": {\"type\": \"integer\"}}, \"required\": [\"a\"]}}}}";
    assert_true(ds_oai_parse(H, ok, strlen(ok), &r, &e));
    assert_true(r.json_object);
    assert_non_null(r.json_schema);
    ds_oai_request_free(&r);
    /* vLLM's spellings: guided_json (object or text), structured_outputs json / json_object */
    const char *vllm[] = {
        "{" MSG ", \"guided_json\": {\"type\": \"object\", \"properties\": {\"a\": {\"type\": \"null\"}}}}",
        "{" MSG ", \"guided_json\": \"{\\\"type\\\": \\\"object\\\"}\"}",
        "{" MSG ", \"structured_outputs\": {\"json\": {\"type\": \"object\"}}}",
        "{" MSG ", \"structured_outputs\": {\"json_object\": true}}",
    };
    for (size_t i = 0; i < sizeof vllm / sizeof vllm[0]; i++) {
        if (!ds_oai_parse(H, vllm[i], strlen(vllm[i]), &r, &e)) fail_msg("refused: %s: %s", vllm[i], e.message);
        assert_true(r.json_object);
        assert_true((r.json_schema != NULL) == (i < 3));
        ds_oai_request_free(&r);
    }
    const char *bad = "{" MSG ", \"response_format\": {\"type\": \"json_schema\", \"json_schema\": "
                      "{\"schema\": {\"type\": \"object\", \"properties\": {\"a\": {\"type\": "
                      "\"string\", \"maxLength\": 3}}}}}}";
    memset(&e, 0, sizeof e);
    assert_false(ds_oai_parse(H, bad, strlen(bad), &r, &e));
    assert_int_equal(e.status, 400);
    assert_string_equal(e.param, "response_format");
    if (!strstr(e.message, "keyword 'maxLength' is not supported (at #/properties/a)"))
        fail_msg("message: %s", e.message);
    ds_oai_request_free(&r);
}

static void test_defaults_and_mapping(void **state) {
    (void)state;
    ds_oai_request r;
    ds_oai_error e;
    const char *b = "{\"prompt\": \"hello\", \"model\": \"m\"}";
    assert_true(ds_oai_parse(C, b, strlen(b), &r, &e));
    assert_string_equal(r.prompt_text, "hello");
    assert_string_equal(r.model, "m");
    assert_true(fabsf(r.sp.temperature - 1.0f) < 1e-7f); /* OpenAI's default */
    assert_int_equal(r.sp.max_tokens, 16);                 /* legacy completions default */
    assert_false(r.max_tokens_given);
    assert_int_equal(r.logprobs, -1);
    assert_false(r.stream);
    assert_true(r.skip_special_tokens);
    ds_oai_request_free(&r);

    b = "{\"prompt\": [[5, 6, 7]], \"max_tokens\": 9, \"temperature\": 0, \"top_p\": 0.5, "
        "\"top_k\": 4, \"min_p\": 0.1, \"presence_penalty\": 0.5, \"frequency_penalty\": -0.5, "
        "\"repetition_penalty\": 1.2, \"seed\": 42, \"stop\": \"END\", \"stop_token_ids\": [3, 4],"
        " \"min_tokens\": 2, \"ignore_eos\": true, \"logprobs\": 3, \"stream\": true, "
        "\"stream_options\": {\"include_usage\": true}, \"n\": 1, \"user\": \"u\", "
        "\"unknown_field\": {\"x\": 1}, \"top_logprobs\": null, \"guided_json\": null, "
        "\"use_beam_search\": false, \"priority\": 0}";
    assert_true(ds_oai_parse(C, b, strlen(b), &r, &e));
    assert_int_equal(r.n_prompt_ids, 3);
    assert_int_equal(r.prompt_ids[2], 7);
    assert_int_equal(r.sp.max_tokens, 9);
    assert_true(r.max_tokens_given);
    assert_true(r.sp.temperature == 0.0f);
    assert_true(fabsf(r.sp.top_p - 0.5f) < 1e-7f);
    assert_int_equal(r.sp.top_k, 4);
    assert_true(fabsf(r.sp.repetition_penalty - 1.2f) < 1e-6f);
    assert_true(r.sp.has_seed);
    assert_int_equal((int)r.sp.seed, 42);
    assert_int_equal(r.sp.n_stop, 1);
    assert_string_equal(r.sp.stop[0], "END");
    assert_int_equal(r.sp.n_stop_token_ids, 2);
    assert_int_equal(r.sp.stop_token_ids[1], 4);
    assert_int_equal(r.sp.min_tokens, 2);
    assert_true(r.sp.ignore_eos);
    assert_int_equal(r.logprobs, 3);
    assert_int_equal(r.sp.logprobs, 3);
    assert_true(r.stream);
    assert_true(r.include_usage);
    ds_oai_request_free(&r);
}

/* logit_bias: ids from decimal keys, biases clamped to [-100, 100] as vLLM does, an empty
 * object the same as none. */
static void test_logit_bias(void **state) {
    (void)state;
    ds_oai_request r;
    ds_oai_error e;
    const char *b = "{\"prompt\": \"x\", \"logit_bias\": {\"7\": 2.5, \"0\": -1e9, \"151645\": 300}}";
    assert_true(ds_oai_parse(C, b, strlen(b), &r, &e));
    assert_int_equal(r.sp.n_logit_bias, 3);
    assert_int_equal(r.sp.logit_bias[0].id, 7);
    assert_true(r.sp.logit_bias[0].bias == 2.5f);
    assert_int_equal(r.sp.logit_bias[1].id, 0);
    assert_true(r.sp.logit_bias[1].bias == -100.0f);
    assert_int_equal(r.sp.logit_bias[2].id, 151645);
    assert_true(r.sp.logit_bias[2].bias == 100.0f);
    ds_oai_request_free(&r);
    b = "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], \"logit_bias\": {}}";
    assert_true(ds_oai_parse(H, b, strlen(b), &r, &e));
    assert_int_equal(r.sp.n_logit_bias, 0);
    ds_oai_request_free(&r);
}

/* A batch of prompts: every element checked at parse, element 0 selected; select_prompt moves
 * to the others (strings and id arrays alike). */
static void test_prompt_batch(void **state) {
    (void)state;
    ds_oai_request r;
    ds_oai_error e;
    const char *b = "{\"prompt\": [\"ab\", [4, 5], \"c\"], \"n\": 2}";
    assert_true(ds_oai_parse(C, b, strlen(b), &r, &e));
    assert_int_equal(r.n_prompts, 3);
    assert_int_equal(r.n, 2);
    assert_string_equal(r.prompt_text, "ab");
    assert_true(ds_oai_request_select_prompt(&r, 1, &e));
    assert_null(r.prompt_text);
    assert_int_equal(r.n_prompt_ids, 2);
    assert_int_equal(r.prompt_ids[1], 5);
    assert_true(ds_oai_request_select_prompt(&r, 2, &e));
    assert_string_equal(r.prompt_text, "c");
    assert_null(r.prompt_ids);
    assert_false(ds_oai_request_select_prompt(&r, 3, &e));
    ds_oai_request_free(&r);
    /* one element: not a batch */
    b = "{\"prompt\": [[7, 8]]}";
    assert_true(ds_oai_parse(C, b, strlen(b), &r, &e));
    assert_int_equal(r.n_prompts, 1);
    assert_int_equal(r.n_prompt_ids, 2);
    ds_oai_request_free(&r);
}

/* Seeds take both int64 (OpenAI) and uint64 values; the ones past INT64_MAX must not pass
 * through an int64 conversion (undefined behaviour the fuzzer found under UBSan). */
static void test_seed_range(void **state) {
    (void)state;
    static const struct {
        const char *body;
        uint64_t seed;
    } cases[] = {
        {"{\"prompt\": \"x\", \"seed\": 15163516585596478351}", 15163516585596477440ull},
        {"{\"prompt\": \"x\", \"seed\": 9300000000000000000}", 9300000000000000000ull},
        {"{\"prompt\": \"x\", \"seed\": -1}", UINT64_MAX},
        {"{\"prompt\": \"x\", \"seed\": 0}", 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        ds_oai_request r;
        ds_oai_error e;
        assert_true(ds_oai_parse(C, cases[i].body, strlen(cases[i].body), &r, &e));
        assert_true(r.sp.has_seed);
        assert_true(r.sp.seed == cases[i].seed);
        ds_oai_request_free(&r);
    }
}

static void test_chat_parse(void **state) {
    (void)state;
    ds_oai_request r;
    ds_oai_error e;
    const char *b =
        "{\"messages\": [{\"role\": \"developer\", \"content\": \"be brief\"},"
        " {\"role\": \"user\", \"content\": [{\"type\": \"text\", \"text\": \"ab\"},"
        " {\"type\": \"text\", \"text\": \"cd\"}]},"
        " {\"role\": \"assistant\", \"content\": null, \"tool_calls\": [{\"id\": \"1\", "
        "\"type\": \"function\", \"function\": {\"name\": \"f\", \"arguments\": \"{}\"}}]},"
        " {\"role\": \"tool\", \"content\": \"r\", \"tool_call_id\": \"1\"}],"
        " \"max_completion_tokens\": 7, \"max_tokens\": 3, \"logprobs\": true, \"top_logprobs\": 2,"
        " \"chat_template_kwargs\": {\"enable_thinking\": false}}";
    assert_true(ds_oai_parse(H, b, strlen(b), &r, &e));
    assert_int_equal(r.n_messages, 4);
    assert_string_equal(r.messages[0].role, "system"); /* developer → system */
    assert_string_equal(r.messages[1].content, "abcd");
    assert_string_equal(r.messages[2].content, "");
    assert_non_null(r.messages[2].tool_calls);
    assert_int_equal(r.sp.max_tokens, 7); /* max_completion_tokens wins */
    assert_int_equal(r.logprobs, 2);
    assert_false(r.chat.enable_thinking);
    assert_true(r.chat.add_generation_prompt);
    ds_oai_request_free(&r);

    /* chat without max_tokens: left for the context computation */
    b = "{" MSG "}";
    assert_true(ds_oai_parse(H, b, strlen(b), &r, &e));
    assert_false(r.max_tokens_given);
    assert_true(r.chat.enable_thinking);
    assert_int_equal(r.logprobs, -1);
    assert_false(r.json_object);
    ds_oai_request_free(&r);

    /* JSON mode; "text" is the default */
    b = "{" MSG ", \"response_format\": {\"type\": \"json_object\"}}";
    assert_true(ds_oai_parse(H, b, strlen(b), &r, &e));
    assert_true(r.json_object);
    ds_oai_request_free(&r);
    b = "{" MSG ", \"response_format\": {\"type\": \"text\"}}";
    assert_true(ds_oai_parse(H, b, strlen(b), &r, &e));
    assert_false(r.json_object);
    ds_oai_request_free(&r);
    b = "{\"prompt\": \"x\", \"response_format\": {\"type\": \"json_object\"}}";
    assert_true(ds_oai_parse(C, b, strlen(b), &r, &e)); /* completions too, as vLLM */
    assert_true(r.json_object);
    ds_oai_request_free(&r);

    /* logprobs true without top_logprobs → chosen token only */
    b = "{" MSG ", \"logprobs\": true}";
    assert_true(ds_oai_parse(H, b, strlen(b), &r, &e));
    assert_int_equal(r.logprobs, 0);
    ds_oai_request_free(&r);
}

static void test_error_json(void **state) {
    (void)state;
    ds_oai_error e;
    ds_oai_error_set(&e, 400, "invalid_request_error", "context_length_exceeded", "messages",
                     "too long: %d", 5);
    char *s = ds_oai_error_json(&e);
    cJSON *o = cJSON_Parse(s);
    const cJSON *err = cJSON_GetObjectItemCaseSensitive(o, "error");
    assert_string_equal(cJSON_GetObjectItemCaseSensitive(err, "message")->valuestring, "too long: 5");
    assert_string_equal(cJSON_GetObjectItemCaseSensitive(err, "type")->valuestring, "invalid_request_error");
    assert_string_equal(cJSON_GetObjectItemCaseSensitive(err, "param")->valuestring, "messages");
    assert_string_equal(cJSON_GetObjectItemCaseSensitive(err, "code")->valuestring, "context_length_exceeded");
    cJSON_Delete(o);
    free(s);
    ds_oai_error_set(&e, 401, "authentication_error", NULL, NULL, "no");
    s = ds_oai_error_json(&e);
    o = cJSON_Parse(s);
    err = cJSON_GetObjectItemCaseSensitive(o, "error");
    assert_true(cJSON_IsNull(cJSON_GetObjectItemCaseSensitive(err, "param")));
    assert_true(cJSON_IsNull(cJSON_GetObjectItemCaseSensitive(err, "code")));
    cJSON_Delete(o);
    free(s);
}

static void test_utf8_lossy(void **state) {
    (void)state;
    struct { const char *in; size_t n; const char *want; } cases[] = {
        {"abc", 3, "abc"},
        {"\xC3\xA9", 2, "\xC3\xA9"},
        {"\xC3", 1, "\xEF\xBF\xBD"},
        {"a\xE2\x82", 3, "a\xEF\xBF\xBD"},               /* one maximal subpart → one U+FFFD */
        {"\xE2\x82\xAC\xFF!", 5, "\xE2\x82\xAC\xEF\xBF\xBD!"},
        {"\xED\xA0\x80", 3, "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD"}, /* surrogate: 3 (as Rust) */
        {"\xF0\x9F\x98\x80", 4, "\xF0\x9F\x98\x80"},
        {"\xC0\xAF", 2, "\xEF\xBF\xBD\xEF\xBF\xBD"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        ds_strbuf b;
        ds_strbuf_init(&b);
        ds_utf8_lossy(&b, cases[i].in, cases[i].n);
        assert_string_equal(b.data ? b.data : "", cases[i].want);
        ds_strbuf_free(&b);
    }
}

static void test_response_shapes(void **state) {
    (void)state;
    ds_oai_resp_ctx c = {.kind = DS_OAI_CHAT, .created = 1, .model = "m", .logprobs = -1,
                         .include_usage = true};
    snprintf(c.id, sizeof c.id, "chatcmpl-x");
    ds_oai_result r = {.text = "hi", .reasoning = "think", .finish_reason = "stop",
                       .stop_str = "END", .stop_token = -1, .n_prompt = 3, .n_gen = 2};
    char *s = ds_oai_response_json(&c, &r);
    cJSON *o = cJSON_Parse(s);
    assert_string_equal(cJSON_GetObjectItemCaseSensitive(o, "object")->valuestring, "chat.completion");
    const cJSON *ch = cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(o, "choices"), 0);
    const cJSON *m = cJSON_GetObjectItemCaseSensitive(ch, "message");
    assert_string_equal(cJSON_GetObjectItemCaseSensitive(m, "role")->valuestring, "assistant");
    assert_string_equal(cJSON_GetObjectItemCaseSensitive(m, "content")->valuestring, "hi");
    assert_string_equal(cJSON_GetObjectItemCaseSensitive(m, "reasoning_content")->valuestring, "think");
    assert_string_equal(cJSON_GetObjectItemCaseSensitive(ch, "finish_reason")->valuestring, "stop");
    assert_string_equal(cJSON_GetObjectItemCaseSensitive(ch, "stop_reason")->valuestring, "END");
    const cJSON *u = cJSON_GetObjectItemCaseSensitive(o, "usage");
    assert_int_equal(cJSON_GetObjectItemCaseSensitive(u, "prompt_tokens")->valueint, 3);
    assert_int_equal(cJSON_GetObjectItemCaseSensitive(u, "completion_tokens")->valueint, 2);
    assert_int_equal(cJSON_GetObjectItemCaseSensitive(u, "total_tokens")->valueint, 5);
    cJSON_Delete(o);
    free(s);

    /* chunks: SSE framing, role delta, usage null while include_usage, usage chunk */
    ds_strbuf b;
    ds_strbuf_init(&b);
    ds_oai_chunk(&b, &c, true, NULL, NULL, NULL, 0, NULL, (ds_oai_usage){.n_prompt = 3});
    assert_true(!strncmp(b.data, "data: {", 7));
    assert_true(b.len > 2 && !strcmp(b.data + b.len - 2, "\n\n"));
    o = cJSON_ParseWithLength(b.data + 6, b.len - 8);
    assert_non_null(o);
    assert_string_equal(cJSON_GetObjectItemCaseSensitive(o, "object")->valuestring,
                        "chat.completion.chunk");
    ch = cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(o, "choices"), 0);
    const cJSON *d = cJSON_GetObjectItemCaseSensitive(ch, "delta");
    assert_string_equal(cJSON_GetObjectItemCaseSensitive(d, "role")->valuestring, "assistant");
    assert_true(cJSON_IsNull(cJSON_GetObjectItemCaseSensitive(ch, "finish_reason")));
    assert_true(cJSON_IsNull(cJSON_GetObjectItemCaseSensitive(o, "usage")));
    cJSON_Delete(o);
    ds_strbuf_clear(&b);
    ds_oai_usage_chunk(&b, &c, (ds_oai_usage){.n_prompt = 3, .n_cached = 1, .n_gen = 2});
    o = cJSON_ParseWithLength(b.data + 6, b.len - 8);
    assert_int_equal(cJSON_GetArraySize(cJSON_GetObjectItemCaseSensitive(o, "choices")), 0);
    u = cJSON_GetObjectItemCaseSensitive(o, "usage");
    assert_int_equal(cJSON_GetObjectItemCaseSensitive(u, "total_tokens")->valueint, 5);
    const cJSON *details = cJSON_GetObjectItemCaseSensitive(u, "prompt_tokens_details");
    assert_int_equal(cJSON_GetObjectItemCaseSensitive(details, "cached_tokens")->valueint, 1);
    cJSON_Delete(o);
    ds_strbuf_free(&b);
}

static void test_generation_config_defaults(void **state) {
    (void)state;
    char dir[] = "/tmp/ds_gencfg_XXXXXX";
    assert_non_null(mkdtemp(dir));
    char path[128];
    snprintf(path, sizeof path, "%s/generation_config.json", dir);
    ds_oai_defaults d;
    ds_error err = {0};
    /* no file: nothing set */
    assert_int_equal(ds_oai_defaults_load(dir, &d, &err), DS_OK);
    assert_false(d.has_temperature || d.has_top_p || d.has_top_k);
    FILE *f = fopen(path, "w");
    fputs("{\"do_sample\": true, \"temperature\": 0.6, \"top_k\": 20, \"top_p\": 0.95, "
          "\"eos_token_id\": [1, 2]}", f);
    fclose(f);
    assert_int_equal(ds_oai_defaults_load(dir, &d, &err), DS_OK);
    assert_true(d.has_temperature && d.has_top_k && d.has_top_p && !d.has_min_p);
    /* defaults fill what the request leaves out; the request wins otherwise */
    ds_oai_request r;
    ds_oai_error e;
    const char *b = "{\"prompt\": \"x\", \"top_p\": 0.5}";
    assert_true(ds_oai_parse_with(C, b, strlen(b), &d, &r, &e));
    assert_true(fabsf(r.sp.temperature - 0.6f) < 1e-6f);
    assert_int_equal(r.sp.top_k, 20);
    assert_true(fabsf(r.sp.top_p - 0.5f) < 1e-6f);
    assert_true(r.sp.min_p == 0.0f);
    ds_oai_request_free(&r);
    /* a malformed file names itself and the field; a top_k no int holds is refused, not
     * converted */
    static const struct {
        const char *text, *field;
    } bad_files[] = {{"{\"temperature\": \"hot\"}", "temperature"}, {"{\"top_k\": 1e30}", "top_k"}};
    for (size_t i = 0; i < sizeof bad_files / sizeof bad_files[0]; i++) {
        f = fopen(path, "w");
        fputs(bad_files[i].text, f);
        fclose(f);
        memset(&err, 0, sizeof err);
        assert_int_equal(ds_oai_defaults_load(dir, &d, &err), DS_ERR_FORMAT);
        assert_non_null(strstr(err.msg, "generation_config.json"));
        assert_non_null(strstr(err.msg, bad_files[i].field));
    }
    remove(path);
    rmdir(dir);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bad_requests),
        cmocka_unit_test(test_defaults_and_mapping),
        cmocka_unit_test(test_json_schema_format),
        cmocka_unit_test(test_seed_range),
        cmocka_unit_test(test_logit_bias),
        cmocka_unit_test(test_prompt_batch),
        cmocka_unit_test(test_chat_parse),
        cmocka_unit_test(test_error_json),
        cmocka_unit_test(test_utf8_lossy),
        cmocka_unit_test(test_response_shapes),
        cmocka_unit_test(test_generation_config_defaults),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
