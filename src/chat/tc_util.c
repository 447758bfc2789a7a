/* Byte buffers and minimal JSON text helpers for the tool-call parser. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "chat/tc_internal.h"

void tc_put(tc_buf *b, const char *s, size_t n) {
    if (b->oom) return;
    if (b->n + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 64;
        while (cap < b->n + n + 1) cap *= 2;
        char *p = realloc(b->p, cap);
        if (!p) {
            b->oom = true;
            return;
        }
        b->p = p;
        b->cap = cap;
    }
    if (n) memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0;
}

void tc_puts(tc_buf *b, const char *s) { tc_put(b, s, strlen(s)); }

void tc_consume(tc_buf *b, size_t n) {
    if (n >= b->n) {
        b->n = 0;
    } else {
        memmove(b->p, b->p + n, b->n - n);
        b->n -= n;
    }
    if (b->p) b->p[b->n] = 0;
}

void tc_clear(tc_buf *b) {
    b->n = 0;
    if (b->p) b->p[0] = 0;
}

void tc_free(tc_buf *b) {
    free(b->p);
    memset(b, 0, sizeof *b);
}

void tc_json_string(tc_buf *b, const char *s, size_t n) {
    tc_put(b, "\"", 1);
    size_t run = 0;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        char esc[8];
        const char *e = NULL;
        if (c == '"') e = "\\\"";
        else if (c == '\\') e = "\\\\";
        else if (c == '\n') e = "\\n";
        else if (c == '\r') e = "\\r";
        else if (c == '\t') e = "\\t";
        else if (c == '\b') e = "\\b";
        else if (c == '\f') e = "\\f";
        else if (c < 0x20) {
            snprintf(esc, sizeof esc, "\\u%04x", c);
            e = esc;
        }
        if (e) {
            tc_put(b, s + run, i - run);
            tc_puts(b, e);
            run = i + 1;
        }
    }
    tc_put(b, s + run, n - run);
    tc_put(b, "\"", 1);
}

static size_t skip_ws(const char *s, size_t n, size_t i) {
    while (i < n && (s[i] == ' ' || s[i] == '\t' || s[i] == '\n' || s[i] == '\r')) i++;
    return i;
}

/* End of the JSON value starting at s[i] (valid JSON assumed). */
static size_t value_end(const char *s, size_t n, size_t i) {
    if (i < n && s[i] == '"') {
        for (i++; i < n && s[i] != '"'; i++)
            if (s[i] == '\\') i++;
        return i < n ? i + 1 : n;
    }
    if (i < n && (s[i] == '{' || s[i] == '[')) {
        int depth = 0;
        for (; i < n; i++) {
            if (s[i] == '"') {
                i = value_end(s, n, i) - 1;
            } else if (s[i] == '{' || s[i] == '[') {
                depth++;
            } else if (s[i] == '}' || s[i] == ']') {
                if (--depth == 0) return i + 1;
            }
        }
        return n;
    }
    while (i < n && s[i] != ',' && s[i] != '}' && s[i] != ']' && s[i] != ' ' && s[i] != '\n' &&
           s[i] != '\t' && s[i] != '\r')
        i++;
    return i;
}

bool tc_json_member_span(const char *s, size_t n, const char *key, size_t *a, size_t *b) {
    size_t kl = strlen(key);
    size_t i = skip_ws(s, n, 0);
    if (i >= n || s[i] != '{') return false;
    i++;
    for (;;) {
        i = skip_ws(s, n, i);
        if (i >= n || s[i] != '"') return false;
        size_t ks = i + 1, ke = value_end(s, n, i) - 1;
        i = skip_ws(s, n, ke + 1);
        if (i >= n || s[i] != ':') return false;
        i = skip_ws(s, n, i + 1);
        size_t ve = value_end(s, n, i);
        /* keys written with escapes are not matched; tool JSON keys are plain */
        if (ke - ks == kl && !memcmp(s + ks, key, kl)) {
            *a = i;
            *b = ve;
            return true;
        }
        i = skip_ws(s, n, ve);
        if (i >= n || s[i] != ',') return false;
        i++;
    }
}
