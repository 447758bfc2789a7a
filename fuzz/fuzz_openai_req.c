/* fuzz_openai_req.c — libFuzzer target for the OpenAI request parser (server/openai_req.c):
 * the bodies of /v1/completions and /v1/chat/completions, untrusted input straight off the wire.
 *
 * Input: byte 0 picks the endpoint (low bit: 0 completions, 1 chat), the rest is the body (not
 * NUL-terminated: the parser takes a length). Oracle: a rejected body yields a 4xx error with a
 * type and a message whose JSON rendering parses back to the same message (untrusted text in
 * the message is escaped); an accepted one holds only what the parser vouched for — every string
 * and array it hands out is read in full (ASan flags any dangling pointer or short array), its
 * sampling parameters pass ds_sampling_params_validate, and freeing it leaks nothing.
 *
 * Build with -DDS_FUZZ=ON (clang) and run e.g.
 *   build-fuzz/fuzz_openai_req fuzz/corpus_openai_req -max_len=4096
 * tests/test_fuzz_replay.c includes this file and replays the seed corpus plus deterministic
 * mutations through the same entry point, so the test suite exercises it without libFuzzer. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "core/status.h"
#include "sampling/params.h"
#include "server/openai_req.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void oai_check_error(const ds_oai_error *e) {
    DS_ASSERT(e->status >= 400 && e->status < 500);
    DS_ASSERT(e->type && e->type[0] && e->message[0]);
    char *json = ds_oai_error_json(e);
    DS_ASSERT(json);
    cJSON *root = cJSON_Parse(json);
    DS_ASSERT(root); /* the rendering is valid JSON whatever the message holds */
    const cJSON *err = cJSON_GetObjectItemCaseSensitive(root, "error");
    const cJSON *msg = cJSON_GetObjectItemCaseSensitive(err, "message");
    DS_ASSERT(cJSON_IsString(msg) && strcmp(msg->valuestring, e->message) == 0);
    cJSON_Delete(root);
    free(json);
}

static size_t oai_touch(const char *s) { return s ? strlen(s) : 0; }

static void oai_check_request(const ds_oai_request *r) {
    volatile size_t sink = oai_touch(r->model);
    if (r->kind == DS_OAI_COMPLETIONS) {
        DS_ASSERT(r->n_prompt_ids >= 0);
        DS_ASSERT(r->prompt_text || r->n_prompt_ids > 0);
        for (int i = 0; i < r->n_prompt_ids; i++) sink += (size_t)r->prompt_ids[i];
        sink += oai_touch(r->prompt_text);
    } else {
        DS_ASSERT(r->n_messages >= 1 && r->messages);
        for (int i = 0; i < r->n_messages; i++) {
            const ds_chat_message *m = &r->messages[i];
            DS_ASSERT(m->role && m->content);
            sink += oai_touch(m->role) + oai_touch(m->content) + oai_touch(m->reasoning_content);
            if (r->joined) sink += oai_touch(r->joined[i]);
        }
    }
    DS_ASSERT(r->logprobs >= -1);
    ds_error err = {0};
    DS_ASSERT(ds_sampling_params_validate(&r->sp, 0, &err) == DS_OK);
    for (int i = 0; i < r->sp.n_stop; i++) sink += oai_touch(r->sp.stop[i]);
    for (int i = 0; i < r->sp.n_stop_token_ids; i++) sink += (size_t)r->sp.stop_token_ids[i];
    (void)sink;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    const ds_oai_kind kind = (data[0] & 1) ? DS_OAI_CHAT : DS_OAI_COMPLETIONS;
    ds_oai_request r;
    ds_oai_error e;
    memset(&e, 0, sizeof e);
    if (ds_oai_parse(kind, (const char *)data + 1, size - 1, &r, &e)) {
        DS_ASSERT(r.kind == kind);
        oai_check_request(&r);
    } else {
        oai_check_error(&e);
    }
    ds_oai_request_free(&r); /* owed either way */
    return 0;
}
