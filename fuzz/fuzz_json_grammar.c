/* fuzz_json_grammar.c — libFuzzer target for JSON mode's byte automaton
 * (sampling/json_grammar.h), which reads whatever bytes a model's tokens spell.
 *
 * Oracles: a byte the automaton refuses leaves its state exactly as it was; depth and
 * whitespace stay within their bounds; and when every byte of the input is accepted and the
 * object is closed, cJSON parses the input as a JSON object (unless it holds a \u escape of a
 * UTF-16 surrogate, which JSON's grammar allows and cJSON refuses when unpaired).
 *
 * Build with -DDS_FUZZ=ON (clang) and run e.g.
 *   build-fuzz/fuzz_json_grammar fuzz/corpus_json_grammar */
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "core/status.h"
#include "fuzz_json_util.h"
#include "sampling/json_grammar.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    ds_json_state s;
    ds_json_init(&s);
    size_t i = 0;
    for (; i < size; i++) {
        const ds_json_state before = s;
        if (!ds_json_feed(&s, data[i])) {
            DS_ASSERT(memcmp(&s, &before, sizeof s) == 0);
            break;
        }
        DS_ASSERT(s.depth <= DS_JSON_MAX_DEPTH && s.ws <= DS_JSON_MAX_INDENT + 1);
    }
    /* the bulk feed agrees with the bytewise one */
    ds_json_state t;
    ds_json_init(&t);
    DS_ASSERT(ds_json_feed_bytes(&t, data, size) == (i == size));
    if (i == size && ds_json_done(&s) && !has_surrogate_escape(data, size)) {
        cJSON *o = cJSON_ParseWithLength((const char *)data, size);
        DS_ASSERT(cJSON_IsObject(o));
        cJSON_Delete(o);
    }
    return 0;
}
