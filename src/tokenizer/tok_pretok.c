/* tok_pretok.c — normalizer and pre-tokenizer: text → pieces that BPE encodes one by one. */
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

#include "tokenizer/tok_internal.h"

ds_status tok_regex_compile(const char *pattern, size_t len, bool literal, const char *where,
                            pcre2_code **out, ds_error *err) {
    int code = 0;
    PCRE2_SIZE off = 0;
    /* PCRE2_LITERAL refuses PCRE2_UCP (nothing to classify in a literal). */
    uint32_t opts = PCRE2_UTF | (literal ? PCRE2_LITERAL : PCRE2_UCP);
    pcre2_code *re = pcre2_compile((PCRE2_SPTR)pattern, len, opts, &code, &off, NULL);
    if (!re) {
        PCRE2_UCHAR msg[160];
        pcre2_get_error_message(code, msg, sizeof msg);
        return ds_error_set(err, DS_ERR_FORMAT, "%s: bad regex at offset %zu: %s", where,
                            (size_t)off, (const char *)msg);
    }
    /* JIT is an optimisation only: without it pcre2_match interprets the pattern. */
    (void)pcre2_jit_compile(re, PCRE2_JIT_COMPLETE);
    *out = re;
    return DS_OK;
}

static bool all_ascii(const char *s, size_t n) {
    for (size_t i = 0; i < n; i++)
        if ((unsigned char)s[i] >= 0x80) return false;
    return true;
}

ds_status tok_normalize(const tok_normalizer *nz, const char *s, size_t n, tok_buf *buf,
                        const char **out, size_t *out_len, ds_error *err) {
    *out = s;
    *out_len = n;
    /* ASCII is invariant under every normal form we support: skip the common case. */
    if (nz->n_ops == 0 || n == 0 || all_ascii(s, n)) return DS_OK;
    const char *cur = s;
    size_t cur_len = n;
    for (int k = 0; k < nz->n_ops; k++) {
        utf8proc_uint8_t *dst = NULL;
        utf8proc_ssize_t r = utf8proc_map((const utf8proc_uint8_t *)cur, (utf8proc_ssize_t)cur_len,
                                          &dst, (utf8proc_option_t)nz->ops[k]);
        if (r < 0) {
            free(dst);
            return ds_error_set(err, DS_ERR_INVALID_ARG, "tokenizer: normalization failed: %s",
                                utf8proc_errmsg(r));
        }
        buf->len = 0;
        ds_status st = tok_buf_append(buf, dst, (size_t)r, err);
        free(dst);
        if (st != DS_OK) return st;
        cur = buf->p;
        cur_len = buf->len;
    }
    *out = cur;
    *out_len = cur_len;
    return DS_OK;
}

static ds_status pieces_push(tok_piece **v, size_t *n, size_t *cap, size_t off, size_t len,
                             ds_error *err) {
    if (len == 0) return DS_OK; /* HF drops empty splits */
    if (off + len > UINT32_MAX)
        return ds_error_set(err, DS_ERR_INVALID_ARG, "tokenizer: input too long (over 4 GiB)");
    if (*n == *cap) {
        size_t c = *cap ? *cap * 2 : 64;
        tok_piece *p = realloc(*v, sizeof *p * c);
        if (!p) return ds_error_set(err, DS_ERR_NOMEM, "tokenizer: out of memory (pieces)");
        *v = p;
        *cap = c;
    }
    (*v)[(*n)++] = (tok_piece){.off = (uint32_t)off, .len = (uint32_t)len};
    return DS_OK;
}

/* Splits every piece in sc->pieces on re; the result replaces sc->pieces. Pieces of text the
 * pattern matched are "delimiters" (or the gaps between them, with invert). */
static ds_status split_pieces(tok_scratch *sc, const pcre2_code *re, tok_split_behavior behavior,
                              bool invert, ds_error *err) {
    ds_status st;
    sc->n_pieces2 = 0;
    for (size_t p = 0; p < sc->n_pieces; p++) {
        size_t base = sc->pieces[p].off, n = sc->pieces[p].len;
        PCRE2_SPTR subj = (PCRE2_SPTR)sc->piece_text.p + base;
        size_t pos = 0, last = 0;
        while (pos <= n) {
            int rc = pcre2_match(re, subj, n, pos, PCRE2_NO_UTF_CHECK, sc->md, NULL);
            if (rc == PCRE2_ERROR_NOMATCH) break;
            if (rc < 0) {
                PCRE2_UCHAR msg[160];
                pcre2_get_error_message(rc, msg, sizeof msg);
                return ds_error_set(err, DS_ERR_INVALID_ARG,
                                    "tokenizer: pre-tokenizer regex failed: %s", (const char *)msg);
            }
            PCRE2_SIZE *ov = pcre2_get_ovector_pointer(sc->md);
            size_t ms = ov[0], me = ov[1];
            if (me == ms) { /* empty match: yields no piece; step one character */
                if (ms >= n) break;
                size_t l;
                tok_utf8_next(subj + ms, n - ms, &l);
                pos = ms + l;
                continue;
            }
            bool keep_gap = behavior == TOK_SPLIT_ISOLATED || !invert;
            bool keep_match = behavior == TOK_SPLIT_ISOLATED || invert;
            if (keep_gap && (st = pieces_push(&sc->pieces2, &sc->n_pieces2, &sc->cap_pieces2,
                                              base + last, ms - last, err)) != DS_OK)
                return st;
            if (keep_match && (st = pieces_push(&sc->pieces2, &sc->n_pieces2, &sc->cap_pieces2,
                                                base + ms, me - ms, err)) != DS_OK)
                return st;
            last = pos = me;
        }
        bool keep_gap = behavior == TOK_SPLIT_ISOLATED || !invert;
        if (keep_gap && (st = pieces_push(&sc->pieces2, &sc->n_pieces2, &sc->cap_pieces2,
                                          base + last, n - last, err)) != DS_OK)
            return st;
    }
    tok_piece *t = sc->pieces;
    sc->pieces = sc->pieces2;
    sc->pieces2 = t;
    size_t c = sc->cap_pieces;
    sc->cap_pieces = sc->cap_pieces2;
    sc->cap_pieces2 = c;
    sc->n_pieces = sc->n_pieces2;
    return DS_OK;
}

ds_status tok_pretokenize(const ds_tokenizer *tok, tok_scratch *sc, const char *s, size_t n,
                          ds_error *err) {
    const tok_pretok *pt = &tok->pre;
    ds_status st;
    sc->piece_text.len = 0;
    sc->n_pieces = 0;
    if ((st = tok_buf_append(&sc->piece_text, s, n, err)) != DS_OK) return st;
    if ((st = pieces_push(&sc->pieces, &sc->n_pieces, &sc->cap_pieces, 0, n, err)) != DS_OK)
        return st;
    for (int k = 0; k < pt->n_splits; k++) {
        const tok_split *sp = &pt->splits[k];
        if ((st = split_pieces(sc, sp->re, sp->behavior, sp->invert, err)) != DS_OK) return st;
    }
    if (pt->add_prefix_space) {
        /* HF's ByteLevel prepends a space to every piece that does not start with one. Such
         * pieces are copied to the end of piece_text with the space in front. */
        for (size_t p = 0; p < sc->n_pieces; p++) {
            tok_piece *pc = &sc->pieces[p];
            if (sc->piece_text.p[pc->off] == ' ') continue;
            size_t off = sc->piece_text.len;
            if ((st = tok_buf_reserve(&sc->piece_text, (size_t)pc->len + 1, err)) != DS_OK)
                return st;
            if (off + pc->len + 1 > UINT32_MAX)
                return ds_error_set(err, DS_ERR_INVALID_ARG, "tokenizer: input too long");
            sc->piece_text.p[off] = ' ';
            memcpy(sc->piece_text.p + off + 1, sc->piece_text.p + pc->off, pc->len);
            sc->piece_text.len += (size_t)pc->len + 1;
            pc->off = (uint32_t)off;
            pc->len += 1;
        }
    }
    if (pt->bl_re && (st = split_pieces(sc, pt->bl_re, TOK_SPLIT_ISOLATED, false, err)) != DS_OK)
        return st;
    return DS_OK;
}
