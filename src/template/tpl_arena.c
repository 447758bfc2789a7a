/* Arena, byte buffers and error unwinding of the Jinja engine. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "template/tpl_internal.h"

#define CHUNK_SIZE ((size_t)64 << 10)

struct tpl_chunk {
    tpl_chunk *next;
    size_t used, cap;
    _Alignas(16) unsigned char data[];
};

_Noreturn void tpl_throw(tpl_base *b, ds_status st, int line, const char *fmt, ...) {
    char msg[DS_ERROR_MSG_MAX - 64]; /* room for the "chat template line N: " prefix */
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    b->status = st;
    if (line > 0)
        snprintf(b->msg, sizeof b->msg, "chat template line %d: %s", line, msg);
    else
        snprintf(b->msg, sizeof b->msg, "chat template: %s", msg);
    longjmp(b->jb, 1);
}

void tpl_arena_init(tpl_arena *a, size_t limit, tpl_base *base) {
    a->head = NULL;
    a->used = 0;
    a->limit = limit;
    a->base = base;
}

void tpl_arena_free(tpl_arena *a) {
    tpl_chunk *c = a->head;
    while (c) {
        tpl_chunk *next = c->next;
        free(c);
        c = next;
    }
    a->head = NULL;
    a->used = 0;
}

static void *alloc(tpl_arena *a, size_t n, bool zero);

void *tpl_alloc(tpl_arena *a, size_t n) { return alloc(a, n, true); }

/* Bytes that are written before being read (string buffers): not zeroed. */
static void *tpl_alloc_bytes(tpl_arena *a, size_t n) { return alloc(a, n, false); }

static void *alloc(tpl_arena *a, size_t n, bool zero) {
    n = (n + 15) & ~(size_t)15;
    if (n == 0) n = 16;
    tpl_chunk *c = a->head;
    if (!c || c->cap - c->used < n) {
        /* Large requests get a chunk of their own, placed behind the current one so the
         * current chunk's free space stays usable. */
        size_t cap = n > CHUNK_SIZE / 4 ? n : CHUNK_SIZE;
        if (cap + sizeof(tpl_chunk) > a->limit - a->used) /* used ≤ limit always holds */
            tpl_throw(a->base, DS_ERR_NOMEM, 0, "rendering needs more than %zu MiB of memory",
                      a->limit >> 20);
        tpl_chunk *nc = malloc(sizeof(tpl_chunk) + cap);
        if (!nc) tpl_throw(a->base, DS_ERR_NOMEM, 0, "out of memory");
        a->used += sizeof(tpl_chunk) + cap;
        nc->used = 0;
        nc->cap = cap;
        if (c && cap != CHUNK_SIZE) {
            nc->next = c->next;
            c->next = nc;
        } else {
            nc->next = c;
            a->head = nc;
        }
        c = nc;
    }
    void *p = c->data + c->used;
    c->used += n;
    if (zero) memset(p, 0, n);
    return p;
}

char *tpl_strndup(tpl_arena *a, const char *s, size_t n) {
    char *p = tpl_alloc_bytes(a, n + 1);
    if (n) memcpy(p, s, n);
    p[n] = 0;
    return p;
}

void tpl_buf_init(tpl_buf *b, tpl_arena *a, size_t max) {
    b->a = a;
    b->p = NULL;
    b->n = b->cap = 0;
    b->max = max;
    b->line = 0;
}

static void buf_reserve(tpl_buf *b, size_t extra) {
    if (b->max && (extra > b->max || b->n > b->max - extra))
        tpl_throw(b->a->base, DS_ERR_FORMAT, b->line, "output exceeds %zu bytes", b->max);
    if (b->n + extra + 1 <= b->cap) return;
    size_t cap = b->cap ? b->cap * 2 : 64;
    while (cap < b->n + extra + 1) cap *= 2;
    char *p = tpl_alloc_bytes(b->a, cap);
    if (b->n) memcpy(p, b->p, b->n);
    b->p = p;
    b->cap = cap;
}

void tpl_buf_put(tpl_buf *b, const char *s, size_t n) {
    if (!n) return;
    buf_reserve(b, n);
    memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0;
}

void tpl_buf_putc(tpl_buf *b, char c) { tpl_buf_put(b, &c, 1); }

void tpl_buf_puts(tpl_buf *b, const char *s) { tpl_buf_put(b, s, strlen(s)); }

void tpl_buf_printf(tpl_buf *b, const char *fmt, ...) {
    char tmp[256];
    va_list ap;
    va_start(ap, fmt);
    int k = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    if (k < 0) return;
    tpl_buf_put(b, tmp, (size_t)k < sizeof tmp ? (size_t)k : sizeof tmp - 1);
}
