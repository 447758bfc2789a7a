/* test_server_chat.c — the built-in Qwen3.5 chat formatter against prompts rendered by the real
 * Qwen3 Jinja template in jinja2 (tests/data/server/chat_fixtures.json, made by
 * make_chat_fixtures.py with Qwen3.5's generation prompt), plus the behaviours the template
 * cannot show: continue_final_message and the reasoning-open flag. */
#include "testlib.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "server/chat_format.h"
#include "server/openai_req.h"

/* Renders one fixture through the same request parser the server uses. */
static void render_case(const cJSON *fx, ds_strbuf *out, bool *open) {
    const cJSON *kw = cJSON_GetObjectItemCaseSensitive(fx, "kwargs");
    cJSON *body = cJSON_CreateObject();
    cJSON_AddItemToObject(body, "messages",
                          cJSON_Duplicate(cJSON_GetObjectItemCaseSensitive(fx, "messages"), 1));
    const cJSON *v;
    if ((v = cJSON_GetObjectItemCaseSensitive(kw, "tools")))
        cJSON_AddItemToObject(body, "tools", cJSON_Duplicate(v, 1));
    if ((v = cJSON_GetObjectItemCaseSensitive(kw, "add_generation_prompt")))
        cJSON_AddItemToObject(body, "add_generation_prompt", cJSON_Duplicate(v, 1));
    if ((v = cJSON_GetObjectItemCaseSensitive(kw, "enable_thinking"))) {
        cJSON *k = cJSON_AddObjectToObject(body, "chat_template_kwargs");
        cJSON_AddItemToObject(k, "enable_thinking", cJSON_Duplicate(v, 1));
    }
    char *s = cJSON_PrintUnformatted(body);
    cJSON_Delete(body);
    ds_oai_request r;
    ds_oai_error e;
    if (!ds_oai_parse(DS_OAI_CHAT, s, strlen(s), &r, &e)) fail_msg("parse: %s", e.message);
    free(s);
    const ds_chat_formatter *f = ds_chat_formatter_qwen35();
    ds_error err = {0};
    assert_int_equal(f->render(f, r.messages, r.n_messages, &r.chat, out, open, &err), DS_OK);
    ds_oai_request_free(&r);
}

static void test_fixtures(void **state) {
    (void)state;
    size_t len = 0;
    char *text = test_read_file(test_data_path("server/chat_fixtures.json"), &len);
    assert_non_null(text);
    cJSON *all = cJSON_ParseWithLength(text, len);
    free(text);
    assert_true(cJSON_IsArray(all));
    assert_true(cJSON_GetArraySize(all) >= 10);
    int n = 0;
    for (const cJSON *fx = all->child; fx; fx = fx->next, n++) {
        const char *name = cJSON_GetObjectItemCaseSensitive(fx, "name")->valuestring;
        const char *want = cJSON_GetObjectItemCaseSensitive(fx, "expected")->valuestring;
        ds_strbuf out;
        ds_strbuf_init(&out);
        bool open = false;
        render_case(fx, &out, &open);
        const char *got = out.data ? out.data : "";
        if (strcmp(got, want) != 0) {
            size_t i = 0;
            while (got[i] && got[i] == want[i]) i++;
            fail_msg("fixture '%s' differs at byte %zu:\n--- got ---\n%s\n--- want ---\n%s", name,
                     i, got + (i > 40 ? i - 40 : 0), want + (i > 40 ? i - 40 : 0));
        }
        /* the output starts inside <think> exactly when the prompt ends with the open tag */
        size_t gl = strlen(got);
        bool ends_open = gl >= 8 && !strcmp(got + gl - 8, "<think>\n");
        assert_int_equal(open, ends_open);
        ds_strbuf_free(&out);
    }
    cJSON_Delete(all);
}

static void test_continue_final_message(void **state) {
    (void)state;
    const char *b = "{\"messages\": [{\"role\": \"user\", \"content\": \"Say hi\"},"
                    " {\"role\": \"assistant\", \"content\": \"Hi th\"}],"
                    " \"continue_final_message\": true}";
    ds_oai_request r;
    ds_oai_error e;
    assert_true(ds_oai_parse(DS_OAI_CHAT, b, strlen(b), &r, &e));
    assert_false(r.chat.add_generation_prompt);
    ds_strbuf out;
    ds_strbuf_init(&out);
    bool open = true;
    ds_error err = {0};
    const ds_chat_formatter *f = ds_chat_formatter_qwen35();
    assert_int_equal(f->render(f, r.messages, r.n_messages, &r.chat, &out, &open, &err), DS_OK);
    /* the template's rendering of the same turn, minus its closing "<|im_end|>\n" */
    assert_string_equal(out.data, "<|im_start|>user\nSay hi<|im_end|>\n<|im_start|>assistant\n"
                                  "<think>\n\n</think>\n\nHi th");
    assert_false(open);
    ds_strbuf_free(&out);
    ds_oai_request_free(&r);

    /* the last message must be the assistant's */
    b = "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"continue_final_message\": true}";
    assert_true(ds_oai_parse(DS_OAI_CHAT, b, strlen(b), &r, &e));
    ds_strbuf_init(&out);
    assert_int_equal(f->render(f, r.messages, r.n_messages, &r.chat, &out, &open, &err),
                     DS_ERR_INVALID_ARG);
    ds_strbuf_free(&out);
    ds_oai_request_free(&r);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fixtures),
        cmocka_unit_test(test_continue_final_message),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
