/* tok_encode.c — the encode pipeline, in HF's order:
 *   1. added tokens with normalized == false are cut out of the raw text;
 *   2. each remaining span is normalized, and added tokens with normalized == true are cut out;
 *   3. each remaining span is pre-tokenized (regex splits, byte-level) into pieces;
 *   4. each piece is BPE-encoded. */
#include <stdlib.h>
#include <string.h>

#include "tokenizer/tok_internal.h"

static void scratch_free(tok_scratch *sc) {
    if (sc->md) pcre2_match_data_free(sc->md);
    tok_buf_free(&sc->piece_text);
    tok_buf_free(&sc->word);
    free(sc->pieces);
    free(sc->pieces2);
    free(sc->syms);
    free(sc->heap);
    free(sc->ids);
    free(sc->cache);
    tok_buf_free(&sc->cache_keys);
    free(sc->cache_ids);
}

/* BPE of one piece through the per-call cache. Only worth it for pieces longer than a byte
 * and short enough to repeat. */
static ds_status bpe_cached(const ds_tokenizer *tok, tok_scratch *sc, const unsigned char *w,
                            size_t n, ds_error *err) {
    if (!sc->use_cache || n < 2 || n > TOK_CACHE_MAX_WORD) return tok_bpe_word(tok, sc, w, n, err);
    if (!sc->cache) {
        sc->cache = calloc(TOK_CACHE_SLOTS, sizeof *sc->cache);
        if (!sc->cache) return tok_bpe_word(tok, sc, w, n, err); /* the cache is optional */
    }
    uint32_t h = tok_hash_bytes(w, n);
    size_t j = h & (TOK_CACHE_SLOTS - 1);
    while (sc->cache[j].key_len) {
        const tok_cache_slot *c = &sc->cache[j];
        if (c->hash == h && c->key_len == n && memcmp(sc->cache_keys.p + c->key_off, w, n) == 0) {
            for (uint32_t k = 0; k < c->ids_n; k++) {
                ds_status st = tok_scratch_push_id(sc, sc->cache_ids[c->ids_off + k], err);
                if (st != DS_OK) return st;
            }
            return DS_OK;
        }
        j = (j + 1) & (TOK_CACHE_SLOTS - 1);
    }
    size_t first = sc->n_ids;
    ds_status st = tok_bpe_word(tok, sc, w, n, err);
    if (st != DS_OK || sc->cache_count * 2 >= TOK_CACHE_SLOTS) return st;
    size_t got = sc->n_ids - first;
    if (sc->n_cache_ids + got > sc->cap_cache_ids) {
        size_t cap = sc->cap_cache_ids ? sc->cap_cache_ids * 2 : 4096;
        while (cap < sc->n_cache_ids + got) cap *= 2;
        int32_t *v = realloc(sc->cache_ids, sizeof *v * cap);
        if (!v) return DS_OK;
        sc->cache_ids = v;
        sc->cap_cache_ids = cap;
    }
    size_t key_off = sc->cache_keys.len;
    if (tok_buf_append(&sc->cache_keys, w, n, NULL) != DS_OK) return DS_OK;
    memcpy(sc->cache_ids + sc->n_cache_ids, sc->ids + first, sizeof(int32_t) * got);
    sc->cache[j] = (tok_cache_slot){.hash = h,
                                    .key_off = (uint32_t)key_off,
                                    .key_len = (uint32_t)n,
                                    .ids_off = (uint32_t)sc->n_cache_ids,
                                    .ids_n = (uint32_t)got};
    sc->n_cache_ids += got;
    sc->cache_count++;
    return DS_OK;
}

/* Step 3 + 4 on one plain span. */
static ds_status encode_plain(const ds_tokenizer *tok, tok_scratch *sc, const char *s, size_t n,
                              ds_error *err) {
    ds_status st = tok_pretokenize(tok, sc, s, n, err);
    if (st != DS_OK) return st;
    for (size_t p = 0; p < sc->n_pieces; p++) {
        const unsigned char *w = (const unsigned char *)sc->piece_text.p + sc->pieces[p].off;
        if ((st = bpe_cached(tok, sc, w, sc->pieces[p].len, err)) != DS_OK) return st;
    }
    return DS_OK;
}

static bool utf8_valid(const unsigned char *s, size_t n) {
    size_t i = 0;
    while (i < n) {
        if (s[i] < 0x80) {
            i++;
            continue;
        }
        size_t len;
        if (tok_utf8_next(s + i, n - i, &len) != TOK_UTF8_OK) return false;
        i += len;
    }
    return true;
}

static ds_status encode_impl(const ds_tokenizer *tok, const char *text, size_t len,
                             bool parse_special, tok_scratch *sc, ds_error *err) {
    ds_status st = DS_OK;
    tok_buf clean = {0}, nbuf = {0};
    tok_spans raw = {0}, norm = {0};

    /* HF only ever sees valid strings: invalid input is repaired the way a lossy decode would. */
    if (!utf8_valid((const unsigned char *)text, len)) {
        if ((st = tok_utf8_lossy_append(&clean, (const unsigned char *)text, len, true, NULL,
                                        err)) != DS_OK)
            goto done;
        text = clean.p;
        len = clean.len;
    }
    sc->md = pcre2_match_data_create(tok->max_ovector, NULL);
    if (!sc->md) {
        st = ds_error_set(err, DS_ERR_NOMEM, "tokenizer: out of memory (regex match data)");
        goto done;
    }
    if ((st = tok_find_added(tok, &tok->trie_raw, text, len, parse_special, &raw, err)) != DS_OK)
        goto done;
    for (size_t i = 0; i < raw.n; i++) {
        const tok_span *sp = &raw.v[i];
        if (sp->added >= 0) {
            if ((st = tok_scratch_push_id(sc, tok->added[sp->added].id, err)) != DS_OK) goto done;
            continue;
        }
        const char *ns;
        size_t nn;
        if ((st = tok_normalize(&tok->norm, text + sp->start, sp->end - sp->start, &nbuf, &ns, &nn,
                                err)) != DS_OK)
            goto done;
        if ((st = tok_find_added(tok, &tok->trie_norm, ns, nn, parse_special, &norm, err)) != DS_OK)
            goto done;
        for (size_t j = 0; j < norm.n; j++) {
            const tok_span *q = &norm.v[j];
            if (q->added >= 0)
                st = tok_scratch_push_id(sc, tok->added[q->added].id, err);
            else
                st = encode_plain(tok, sc, ns + q->start, q->end - q->start, err);
            if (st != DS_OK) goto done;
        }
    }
done:
    tok_buf_free(&clean);
    tok_buf_free(&nbuf);
    free(raw.v);
    free(norm.v);
    return st;
}

ds_status ds_tokenizer_encode(const ds_tokenizer *tok, const char *text, size_t len,
                              bool parse_special, int32_t **ids, size_t *n_ids, ds_error *err) {
    if (!tok || !ids || !n_ids || (!text && len))
        return ds_error_set(err, DS_ERR_INVALID_ARG, "ds_tokenizer_encode: NULL argument");
    *ids = NULL;
    *n_ids = 0;
    tok_scratch sc = {0};
    sc.use_cache = len >= TOK_CACHE_MIN_INPUT;
    ds_status st = encode_impl(tok, text ? text : "", len, parse_special, &sc, err);
    if (st == DS_OK) {
        *ids = sc.ids; /* ownership passes to the caller */
        *n_ids = sc.n_ids;
        sc.ids = NULL;
    }
    scratch_free(&sc);
    return st;
}
