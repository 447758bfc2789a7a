/* UTF-8 helpers with JavaScript's notions of whitespace and string length (the reference
 * renderer works on UTF-16 strings). */
#include "template/tpl_internal.h"

uint32_t tpl_utf8_next(const char *s, size_t n, size_t *len) {
    const unsigned char *u = (const unsigned char *)s;
    uint32_t c = u[0];
    size_t k;
    uint32_t min;
    if (c < 0x80) {
        *len = 1;
        return c;
    } else if ((c & 0xE0) == 0xC0) {
        k = 2, c &= 0x1F, min = 0x80;
    } else if ((c & 0xF0) == 0xE0) {
        k = 3, c &= 0x0F, min = 0x800;
    } else if ((c & 0xF8) == 0xF0) {
        k = 4, c &= 0x07, min = 0x10000;
    } else {
        *len = 1;
        return 0xFFFD;
    }
    if (n < k) {
        *len = 1;
        return 0xFFFD;
    }
    for (size_t i = 1; i < k; i++) {
        if ((u[i] & 0xC0) != 0x80) {
            *len = 1;
            return 0xFFFD;
        }
        c = (c << 6) | (u[i] & 0x3F);
    }
    if (c < min || c > 0x10FFFF || (c >= 0xD800 && c <= 0xDFFF)) {
        *len = 1;
        return 0xFFFD;
    }
    *len = k;
    return c;
}

size_t tpl_utf8_put(char out[4], uint32_t cp) {
    if (cp >= 0xD800 && cp <= 0xDFFF) cp = 0xFFFD; /* a lone surrogate prints as U+FFFD */
    if (cp < 0x80) {
        out[0] = (char)cp;
        return 1;
    } else if (cp < 0x800) {
        out[0] = (char)(0xC0 | (cp >> 6));
        out[1] = (char)(0x80 | (cp & 0x3F));
        return 2;
    } else if (cp < 0x10000) {
        out[0] = (char)(0xE0 | (cp >> 12));
        out[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        out[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    out[0] = (char)(0xF0 | (cp >> 18));
    out[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
    out[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
    out[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

bool tpl_js_space(uint32_t c) {
    if (c <= 32) return c == 32 || (c >= 9 && c <= 13);
    return c == 0xA0 || c == 0x1680 || (c >= 0x2000 && c <= 0x200A) || c == 0x2028 ||
           c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000 || c == 0xFEFF;
}

size_t tpl_js_space_prefix(const char *s, size_t n) {
    size_t i = 0;
    while (i < n) {
        size_t k;
        uint32_t c = tpl_utf8_next(s + i, n - i, &k);
        if (!tpl_js_space(c)) break;
        i += k;
    }
    return i;
}

/* Start of the code point that ends at s[end) (end > 0). */
static size_t prev_start(const char *s, size_t end) {
    size_t i = end - 1;
    size_t lim = end >= 4 ? end - 4 : 0;
    while (i > lim && ((unsigned char)s[i] & 0xC0) == 0x80) i--;
    size_t k;
    tpl_utf8_next(s + i, end - i, &k);
    return i + k == end ? i : end - 1;
}

size_t tpl_js_space_suffix(const char *s, size_t n) {
    size_t end = n;
    while (end > 0) {
        size_t st = prev_start(s, end);
        size_t k;
        uint32_t c = tpl_utf8_next(s + st, end - st, &k);
        if (!tpl_js_space(c)) break;
        end = st;
    }
    return n - end;
}

size_t tpl_utf16_len(const char *s, size_t n) {
    size_t units = 0;
    for (size_t i = 0; i < n;) {
        size_t k;
        uint32_t c = tpl_utf8_next(s + i, n - i, &k);
        units += c >= 0x10000 ? 2 : 1;
        i += k;
    }
    return units;
}
