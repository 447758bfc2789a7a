/* strbuf.h — a growable byte buffer for building HTTP bodies, SSE frames and prompts.
 *
 * Allocation failure is sticky: the first failed append sets `oom` and later appends are
 * no-ops, so callers build a whole body and check once (ds_strbuf_ok). The buffer is always
 * NUL-terminated when data != NULL. */
#ifndef DS_SERVER_STRBUF_H
#define DS_SERVER_STRBUF_H

#include <stdbool.h>
#include <stddef.h>

typedef struct ds_strbuf {
    char *data; /* [cap] owned; data[len] == 0 */
    size_t len;
    size_t cap;
    bool oom;
} ds_strbuf;

void ds_strbuf_init(ds_strbuf *b);
void ds_strbuf_free(ds_strbuf *b);
void ds_strbuf_clear(ds_strbuf *b);
void ds_strbuf_append(ds_strbuf *b, const char *s, size_t n);
void ds_strbuf_puts(ds_strbuf *b, const char *s);
void ds_strbuf_printf(ds_strbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Drops the first n bytes (n ≤ len). */
void ds_strbuf_consume(ds_strbuf *b, size_t n);
/* Hands the buffer to the caller (malloc'd, NUL-terminated; never NULL unless oom) and resets b. */
char *ds_strbuf_take(ds_strbuf *b, size_t *len);
static inline bool ds_strbuf_ok(const ds_strbuf *b) { return !b->oom; }

#endif
