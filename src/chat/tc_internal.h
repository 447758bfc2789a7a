/* tc_internal.h — small helpers shared by the tool-call files. */
#ifndef DS_CHAT_TC_INTERNAL_H
#define DS_CHAT_TC_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>

/* Growable byte buffer; appends after an allocation failure are dropped and oom is set. */
typedef struct tc_buf {
    char *p;
    size_t n, cap;
    bool oom;
} tc_buf;

void tc_put(tc_buf *b, const char *s, size_t n);
void tc_puts(tc_buf *b, const char *s);
void tc_consume(tc_buf *b, size_t n); /* drops the first n bytes */
void tc_clear(tc_buf *b);
void tc_free(tc_buf *b);
/* A JSON string literal (UTF-8 kept, control characters escaped). */
void tc_json_string(tc_buf *b, const char *s, size_t n);
/* Span [*a, *b) of the value of top-level member `key` in the JSON object text s (already
 * validated). False when absent. */
bool tc_json_member_span(const char *s, size_t n, const char *key, size_t *a, size_t *b);

#endif
