/* tok_utf8.c — UTF-8 scanning with Rust's from_utf8_lossy semantics, the byte-level alphabet,
 * and the two character classes the added-token flags need. */
#include <string.h>
#include <utf8proc.h>

#include "tokenizer/tok_internal.h"

/* Unicode Table 3-7 (well-formed byte sequences). An invalid sequence is replaced by one U+FFFD
 * per "maximal subpart": the longest prefix that could still start a valid character, or one
 * byte. This is what Rust's String::from_utf8_lossy does, so decode matches HF byte for byte. */
tok_utf8_kind tok_utf8_next(const unsigned char *s, size_t n, size_t *len) {
    DS_ASSERT(n > 0);
    unsigned c = s[0];
    if (c < 0x80) {
        *len = 1;
        return TOK_UTF8_OK;
    }
    size_t need;
    unsigned lo = 0x80, hi = 0xBF; /* allowed range of the second byte */
    if (c >= 0xC2 && c <= 0xDF) {
        need = 2;
    } else if (c >= 0xE0 && c <= 0xEF) {
        need = 3;
        if (c == 0xE0) lo = 0xA0;
        if (c == 0xED) hi = 0x9F;
    } else if (c >= 0xF0 && c <= 0xF4) {
        need = 4;
        if (c == 0xF0) lo = 0x90;
        if (c == 0xF4) hi = 0x8F;
    } else {
        *len = 1;
        return TOK_UTF8_INVALID;
    }
    for (size_t i = 1; i < need; i++) {
        if (i >= n) {
            *len = i;
            return TOK_UTF8_INCOMPLETE;
        }
        unsigned b = s[i];
        unsigned l = i == 1 ? lo : 0x80, h = i == 1 ? hi : 0xBF;
        if (b < l || b > h) {
            *len = i;
            return TOK_UTF8_INVALID;
        }
    }
    *len = need;
    return TOK_UTF8_OK;
}

ds_status tok_utf8_lossy_append(tok_buf *out, const unsigned char *s, size_t n, bool final,
                                size_t *consumed, ds_error *err) {
    static const char repl[3] = {(char)0xEF, (char)0xBF, (char)0xBD};
    size_t i = 0, run = 0; /* s[i-run .. i) is valid and not yet copied */
    ds_status st = DS_OK;
    while (i < n) {
        size_t len;
        tok_utf8_kind k = tok_utf8_next(s + i, n - i, &len);
        if (k == TOK_UTF8_OK) {
            i += len;
            run += len;
            continue;
        }
        if ((st = tok_buf_append(out, s + i - run, run, err)) != DS_OK) return st;
        run = 0;
        if (k == TOK_UTF8_INCOMPLETE && !final) break;
        if ((st = tok_buf_append(out, repl, 3, err)) != DS_OK) return st;
        i += len;
    }
    if (run && (st = tok_buf_append(out, s + i - run, run, err)) != DS_OK) return st;
    if (out->p == NULL && (st = tok_buf_reserve(out, 0, err)) != DS_OK) return st;
    out->p[out->len] = 0;
    if (consumed) *consumed = i;
    return DS_OK;
}

uint32_t tok_utf8_decode(const unsigned char *s, size_t n, size_t *len) {
    utf8proc_int32_t cp = 0;
    utf8proc_ssize_t r = utf8proc_iterate(s, (utf8proc_ssize_t)n, &cp);
    if (r <= 0) {
        *len = 1;
        return 0xFFFD;
    }
    *len = (size_t)r;
    return (uint32_t)cp;
}

size_t tok_utf8_encode(uint32_t cp, char out[4]) {
    return (size_t)utf8proc_encode_char((utf8proc_int32_t)cp, (utf8proc_uint8_t *)out);
}

bool tok_is_whitespace(uint32_t cp) {
    return (cp >= 0x09 && cp <= 0x0D) || cp == 0x20 || cp == 0x85 || cp == 0xA0 || cp == 0x1680 ||
           (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 || cp == 0x202F ||
           cp == 0x205F || cp == 0x3000;
}

/* Rust's \w is Alphabetic + M + Nd + Pc + Join_Control; letters and letter-numbers stand in for
 * Alphabetic (it also holds a few marks and symbols, which M already covers or which are rare). */
bool tok_is_word_char(uint32_t cp) {
    if (cp == 0x200C || cp == 0x200D) return true;
    switch (utf8proc_category((utf8proc_int32_t)cp)) {
    case UTF8PROC_CATEGORY_LU:
    case UTF8PROC_CATEGORY_LL:
    case UTF8PROC_CATEGORY_LT:
    case UTF8PROC_CATEGORY_LM:
    case UTF8PROC_CATEGORY_LO:
    case UTF8PROC_CATEGORY_MN:
    case UTF8PROC_CATEGORY_MC:
    case UTF8PROC_CATEGORY_ME:
    case UTF8PROC_CATEGORY_ND:
    case UTF8PROC_CATEGORY_NL:
    case UTF8PROC_CATEGORY_PC:
        return true;
    default:
        return false;
    }
}

/* GPT-2's bytes_to_unicode: printable Latin-1 bytes stand for themselves, the other 68 bytes
 * (0x00-0x20, 0x7F-0xA0, 0xAD) are written as U+0100.. in byte order. */
uint32_t tok_bytelevel_char(uint8_t b) {
    if (b <= 0x20) return 256u + b;
    if (b >= 0x7F && b <= 0xA0) return 256u + 33u + (b - 0x7Fu);
    if (b == 0xAD) return 256u + 67u;
    return b;
}

int tok_bytelevel_byte(uint32_t cp) {
    if (cp < 256) return (cp <= 0x20 || (cp >= 0x7F && cp <= 0xA0) || cp == 0xAD) ? -1 : (int)cp;
    if (cp < 256 + 33) return (int)(cp - 256);
    if (cp < 256 + 67) return (int)(cp - 256 - 33 + 0x7F);
    if (cp == 256 + 67) return 0xAD;
    return -1;
}

ds_status tok_bytelevel_encode(tok_buf *out, const unsigned char *s, size_t n, ds_error *err) {
    ds_status st = tok_buf_reserve(out, n * 2, err);
    if (st != DS_OK) return st;
    for (size_t i = 0; i < n; i++) {
        uint32_t cp = tok_bytelevel_char(s[i]);
        if (cp < 0x80) {
            out->p[out->len++] = (char)cp;
        } else { /* every alphabet code point is below U+0800: two bytes */
            out->p[out->len++] = (char)(0xC0 | (cp >> 6));
            out->p[out->len++] = (char)(0x80 | (cp & 0x3F));
        }
    }
    out->p[out->len] = 0;
    return DS_OK;
}
