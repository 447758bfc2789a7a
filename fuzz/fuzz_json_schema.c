/* fuzz_json_schema.c — libFuzzer target for structured outputs (sampling/json_schema.h): the
 * compiler reads a schema from an HTTP body, the automaton whatever bytes a model's tokens
 * spell.
 *
 * Input: a schema (JSON text) up to the first NUL byte, then the bytes fed to its automaton.
 * Oracles: the compiler returns a schema or a message, never both, never crashes; a byte the
 * automaton refuses leaves its state exactly as it was; the depth stays within its bound; the
 * bulk feed agrees with the bytewise one; and when every byte is accepted and the object is
 * closed, cJSON parses the bytes as a JSON object (unless they hold a \u escape of a UTF-16
 * surrogate, which JSON's grammar allows and cJSON refuses when unpaired).
 *
 * Build with -DDS_FUZZ=ON (clang) and run e.g.
 *   build-fuzz/fuzz_json_schema fuzz/corpus_json_schema */
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "core/status.h"
#include "fuzz_json_util.h"
#include "sampling/json_schema.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const uint8_t *nul = memchr(data, 0, size);
    const size_t n_schema = nul ? (size_t)(nul - data) : size;
    const uint8_t *doc = nul ? nul + 1 : data + size;
    const size_t n_doc = nul ? size - n_schema - 1 : 0;
    cJSON *j = cJSON_ParseWithLength((const char *)data, n_schema);
    if (!j) return 0;
    char err[512];
    ds_json_schema *s = ds_json_schema_compile(j, err, sizeof err);
    cJSON_Delete(j);
    DS_ASSERT(s ? err[0] == 0 : err[0] != 0);
    if (!s) return 0;
    ds_js_state st;
    ds_js_init(&st, s);
    size_t i = 0;
    for (; i < n_doc; i++) {
        const ds_js_state before = st;
        if (!ds_js_feed(&st, s, doc[i])) {
            DS_ASSERT(memcmp(&st, &before, sizeof st) == 0);
            break;
        }
        DS_ASSERT(st.depth <= DS_JS_MAX_DEPTH);
    }
    ds_js_state t;
    ds_js_init(&t, s);
    DS_ASSERT(ds_js_feed_bytes(&t, s, doc, n_doc) == (i == n_doc));
    if (i == n_doc && ds_js_done(&st) && !has_surrogate_escape(doc, n_doc)) {
        cJSON *o = cJSON_ParseWithLength((const char *)doc, n_doc);
        DS_ASSERT(cJSON_IsObject(o));
        cJSON_Delete(o);
    }
    ds_json_schema_unref(s);
    return 0;
}
