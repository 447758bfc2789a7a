#include "server/reasoning.h"

#include <string.h>

void ds_reasoning_init(ds_reasoning_split *s, const char *end_tag, bool in_reasoning) {
    s->end_tag = end_tag ? end_tag : "";
    s->end_len = strlen(s->end_tag);
    s->state = in_reasoning && s->end_len ? DS_REASONING_START : DS_REASONING_CONTENT;
    ds_strbuf_init(&s->held);
}

void ds_reasoning_free(ds_reasoning_split *s) { ds_strbuf_free(&s->held); }

static void feed_content(ds_reasoning_split *s, const char *t, size_t n, ds_strbuf *content) {
    if (s->state == DS_REASONING_CONTENT_START) {
        while (n && *t == '\n') t++, n--;
        if (!n) return;
        s->state = DS_REASONING_CONTENT;
    }
    ds_strbuf_append(content, t, n);
}

/* Length of the longest proper prefix of the end tag that ends buf. */
static size_t partial_tag(const ds_reasoning_split *s, const char *buf, size_t n) {
    size_t k = s->end_len - 1 < n ? s->end_len - 1 : n;
    for (; k > 0; k--)
        if (!memcmp(buf + n - k, s->end_tag, k)) return k;
    return 0;
}

void ds_reasoning_feed(ds_reasoning_split *s, const char *text, size_t len, ds_strbuf *reasoning,
                       ds_strbuf *content) {
    if (s->state == DS_REASONING_CONTENT || s->state == DS_REASONING_CONTENT_START) {
        feed_content(s, text, len, content);
        return;
    }
    ds_strbuf_append(&s->held, text, len);
    if (!ds_strbuf_ok(&s->held)) { /* out of memory: degrade to passing text through */
        ds_strbuf_append(reasoning, text, len);
        return;
    }
    char *buf = s->held.data;
    size_t n = s->held.len;
    size_t start = 0;
    if (s->state == DS_REASONING_START) {
        while (start < n && buf[start] == '\n') start++;
        if (start == n) { /* only newlines so far */
            ds_strbuf_clear(&s->held);
            return;
        }
    }
    char *tag = s->end_len ? memmem(buf + start, n - start, s->end_tag, s->end_len) : NULL;
    if (tag) {
        size_t r_end = (size_t)(tag - buf);
        while (r_end > start && buf[r_end - 1] == '\n') r_end--;
        ds_strbuf_append(reasoning, buf + start, r_end - start);
        s->state = DS_REASONING_CONTENT_START;
        size_t after = (size_t)(tag - buf) + s->end_len;
        /* copy out first: feed_content may not alias held */
        ds_strbuf rest;
        ds_strbuf_init(&rest);
        ds_strbuf_append(&rest, buf + after, n - after);
        ds_strbuf_clear(&s->held);
        feed_content(s, rest.data ? rest.data : "", rest.len, content);
        ds_strbuf_free(&rest);
        return;
    }
    /* Hold back a possible partial tag and the newlines before it. */
    size_t keep_from = n - partial_tag(s, buf + start, n - start);
    while (keep_from > start && buf[keep_from - 1] == '\n') keep_from--;
    if (keep_from > start) {
        ds_strbuf_append(reasoning, buf + start, keep_from - start);
        s->state = DS_REASONING_IN;
    }
    ds_strbuf_consume(&s->held, keep_from);
}

void ds_reasoning_flush(ds_reasoning_split *s, ds_strbuf *reasoning, ds_strbuf *content) {
    (void)content;
    if (s->state == DS_REASONING_START || s->state == DS_REASONING_IN) {
        size_t n = s->held.len;
        while (n && s->held.data[n - 1] == '\n') n--;
        if (n) ds_strbuf_append(reasoning, s->held.data, n);
        s->state = DS_REASONING_IN;
    }
    ds_strbuf_clear(&s->held);
}
