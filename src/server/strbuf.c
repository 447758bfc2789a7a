#include "server/strbuf.h"

#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void ds_strbuf_init(ds_strbuf *b) { *b = (ds_strbuf){0}; }

void ds_strbuf_free(ds_strbuf *b) {
    free(b->data);
    *b = (ds_strbuf){0};
}

void ds_strbuf_clear(ds_strbuf *b) {
    b->len = 0;
    if (b->data) b->data[0] = 0;
}

static bool reserve(ds_strbuf *b, size_t extra) {
    if (b->oom) return false;
    if (extra > SIZE_MAX / 2 - b->len) {
        b->oom = true;
        return false;
    }
    size_t need = b->len + extra + 1;
    if (need <= b->cap) return true;
    size_t cap = b->cap ? b->cap : 256;
    while (cap < need) cap *= 2;
    char *p = realloc(b->data, cap);
    if (!p) {
        b->oom = true;
        return false;
    }
    b->data = p;
    b->cap = cap;
    return true;
}

void ds_strbuf_append(ds_strbuf *b, const char *s, size_t n) {
    if (!reserve(b, n)) return;
    if (n) memcpy(b->data + b->len, s, n);
    b->len += n;
    b->data[b->len] = 0;
}

void ds_strbuf_puts(ds_strbuf *b, const char *s) { ds_strbuf_append(b, s, strlen(s)); }

void ds_strbuf_printf(ds_strbuf *b, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    char small[256];
    int n = vsnprintf(small, sizeof small, fmt, ap);
    va_end(ap);
    if (n < 0) {
        b->oom = true;
        return;
    }
    if ((size_t)n < sizeof small) {
        ds_strbuf_append(b, small, (size_t)n);
        return;
    }
    if (!reserve(b, (size_t)n)) return;
    va_start(ap, fmt);
    vsnprintf(b->data + b->len, (size_t)n + 1, fmt, ap);
    va_end(ap);
    b->len += (size_t)n;
}

void ds_strbuf_consume(ds_strbuf *b, size_t n) {
    if (n >= b->len) {
        ds_strbuf_clear(b);
        return;
    }
    memmove(b->data, b->data + n, b->len - n);
    b->len -= n;
    b->data[b->len] = 0;
}

char *ds_strbuf_take(ds_strbuf *b, size_t *len) {
    if (b->oom) {
        ds_strbuf_free(b);
        if (len) *len = 0;
        return NULL;
    }
    if (len) *len = 0;
    if (!b->data && !reserve(b, 0)) return NULL;
    char *p = b->data;
    if (len) *len = b->len;
    *b = (ds_strbuf){0};
    return p;
}
