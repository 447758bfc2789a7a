/* tok_decode.c — ids → text (whole sequence and incremental), and the id/token look-ups.
 *
 * HF's ByteLevel decoder maps each token's characters back to bytes (a token holding a
 * character outside the byte alphabet contributes its UTF-8 bytes unchanged), joins all bytes
 * and decodes them with from_utf8_lossy. The per-id bytes are precomputed at load. */
#include <stdlib.h>
#include <string.h>

#include "tokenizer/tok_internal.h"

static bool has_token(const ds_tokenizer *tok, int32_t id) {
    return id >= 0 && (size_t)id < tok->n_ids && tok->str_off[id] != TOK_NONE;
}

size_t ds_tokenizer_vocab_size(const ds_tokenizer *tok) { return tok->n_ids; }

int32_t ds_tokenizer_token_to_id(const ds_tokenizer *tok, const char *token) {
    if (!token) return -1;
    size_t n = strlen(token);
    int32_t id = tok_strmap_get(&tok->added_by, tok->strs.p, token, n);
    if (id < 0) id = tok_strmap_get(&tok->vocab, tok->strs.p, token, n);
    return id;
}

const char *ds_tokenizer_id_to_token(const ds_tokenizer *tok, int32_t id) {
    return has_token(tok, id) ? tok->strs.p + tok->str_off[id] : NULL;
}

const char *ds_tokenizer_token_bytes(const ds_tokenizer *tok, int32_t id, size_t *len) {
    if (!has_token(tok, id)) return NULL;
    if (len) *len = tok->bytes_len[id];
    return tok->strs.p + tok->bytes_off[id];
}

bool ds_tokenizer_is_special(const ds_tokenizer *tok, int32_t id) {
    return has_token(tok, id) && tok->is_special[id];
}

int32_t ds_tokenizer_bos_id(const ds_tokenizer *tok) { return tok->bos_id; }
int32_t ds_tokenizer_eos_id(const ds_tokenizer *tok) { return tok->eos_id; }
int32_t ds_tokenizer_pad_id(const ds_tokenizer *tok) { return tok->pad_id; }
const char *ds_tokenizer_chat_template(const ds_tokenizer *tok) { return tok->chat_template; }

ds_status ds_tokenizer_decode(const ds_tokenizer *tok, const int32_t *ids, size_t n_ids,
                              bool skip_special, char **text, size_t *len, ds_error *err) {
    if (!tok || !text || (!ids && n_ids))
        return ds_error_set(err, DS_ERR_INVALID_ARG, "ds_tokenizer_decode: NULL argument");
    *text = NULL;
    tok_buf bytes = {0}, out = {0};
    ds_status st = tok_buf_reserve(&bytes, 0, err);
    for (size_t i = 0; st == DS_OK && i < n_ids; i++) {
        int32_t id = ids[i];
        if (!has_token(tok, id) || (skip_special && tok->is_special[id])) continue;
        st = tok_buf_append(&bytes, tok->strs.p + tok->bytes_off[id], tok->bytes_len[id], err);
    }
    if (st == DS_OK)
        st =
            tok_utf8_lossy_append(&out, (const unsigned char *)bytes.p, bytes.len, true, NULL, err);
    tok_buf_free(&bytes);
    if (st != DS_OK) {
        tok_buf_free(&out);
        return st;
    }
    *text = out.p; /* ownership passes to the caller */
    if (len) *len = out.len;
    return DS_OK;
}

/* ---- incremental ---------------------------------------------------------------------------- */

void ds_detok_init(ds_detok *d, const ds_tokenizer *tok, bool skip_special) {
    memset(d, 0, sizeof *d);
    d->tok = tok;
    d->skip_special = skip_special;
}

/* Decodes pending + more into d->buf, keeping an incomplete tail when !final. */
static ds_status detok_emit(ds_detok *d, const unsigned char *more, size_t n, bool final,
                            const char **text, size_t *len, ds_error *err) {
    tok_buf out = {.p = d->buf, .len = 0, .cap = d->buf_cap};
    ds_status st = DS_OK;
    const unsigned char *src = more;
    size_t src_n = n;
    tok_buf joined = {0};
    if (d->n_pending) { /* rare: a character split across tokens */
        if ((st = tok_buf_append(&joined, d->pending, d->n_pending, err)) != DS_OK ||
            (st = tok_buf_append(&joined, more, n, err)) != DS_OK) {
            tok_buf_free(&joined);
            return st;
        }
        src = (const unsigned char *)joined.p;
        src_n = joined.len;
    }
    size_t used = 0;
    st = tok_utf8_lossy_append(&out, src, src_n, final, &used, err);
    d->buf = out.p;
    d->buf_cap = out.cap;
    if (st == DS_OK) {
        DS_ASSERT(src_n - used < sizeof d->pending);
        memcpy(d->pending, src + used, src_n - used);
        d->n_pending = src_n - used;
        *text = d->buf;
        if (len) *len = out.len;
    }
    tok_buf_free(&joined);
    return st;
}

ds_status ds_detok_push(ds_detok *d, int32_t id, const char **text, size_t *len, ds_error *err) {
    const ds_tokenizer *tok = d->tok;
    const unsigned char *b = (const unsigned char *)"";
    size_t n = 0;
    if (has_token(tok, id) && !(d->skip_special && tok->is_special[id])) {
        b = (const unsigned char *)tok->strs.p + tok->bytes_off[id];
        n = tok->bytes_len[id];
    }
    return detok_emit(d, b, n, false, text, len, err);
}

ds_status ds_detok_flush(ds_detok *d, const char **text, size_t *len, ds_error *err) {
    ds_status st = detok_emit(d, (const unsigned char *)"", 0, true, text, len, err);
    d->n_pending = 0;
    return st;
}

void ds_detok_free(ds_detok *d) {
    free(d->buf);
    d->buf = NULL;
    d->buf_cap = 0;
}
