/* json_mode.c — the vocabulary table of JSON mode (sampling/json_grammar.h): each id's bytes as
 * the tokenizer decodes them, borrowed from the tokenizer for the server's lifetime. */
#include <stdlib.h>

#include "server/server_internal.h"
#include "tokenizer/tokenizer.h"

bool ds_json_vocab_build(const ds_tokenizer *tok, ds_json_vocab *v) {
    const int n = (int)ds_tokenizer_vocab_size(tok);
    *v = (ds_json_vocab){.n = n};
    v->bytes = calloc((size_t)(n > 0 ? n : 1), sizeof *v->bytes);
    v->len = calloc((size_t)(n > 0 ? n : 1), sizeof *v->len);
    if (!v->bytes || !v->len) {
        ds_json_vocab_free(v);
        return false;
    }
    for (int id = 0; id < n; id++) {
        size_t len = 0;
        const char *b = ds_tokenizer_is_special(tok, id) ? NULL : ds_tokenizer_token_bytes(tok, id, &len);
        if (!b || len == 0 || len > UINT32_MAX) continue;
        v->bytes[id] = (const uint8_t *)b;
        v->len[id] = (uint32_t)len;
    }
    if (!ds_json_vocab_index(v)) {
        ds_json_vocab_free(v);
        return false;
    }
    return true;
}
