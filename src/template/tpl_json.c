/* JSON output of values: the reference renderer's toJSON (its tojson filter and the way it
 * prints arrays / objects), i.e. JSON.stringify spellings with Python json.dumps's default
 * separators ", " and ": " (or "," with an indent). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "template/tpl_internal.h"

#define JSON_MAX_DEPTH 512 /* also stops a namespace that contains itself */

void tpl_json_string(tpl_buf *out, const char *s, size_t n, bool ensure_ascii) {
    static const char hex[] = "0123456789abcdef";
    tpl_buf_putc(out, '"');
    size_t run = 0; /* start of bytes copied verbatim */
    for (size_t i = 0; i < n;) {
        unsigned char ch = (unsigned char)s[i];
        const char *esc = NULL;
        char tmp[16];
        size_t k = 1;
        if (ch == '"') esc = "\\\"";
        else if (ch == '\\') esc = "\\\\";
        else if (ch == '\b') esc = "\\b";
        else if (ch == '\f') esc = "\\f";
        else if (ch == '\n') esc = "\\n";
        else if (ch == '\r') esc = "\\r";
        else if (ch == '\t') esc = "\\t";
        else if (ch < 0x20 || (ensure_ascii && ch >= 0x7F)) {
            uint32_t cp = ch;
            if (ch >= 0x80) cp = tpl_utf8_next(s + i, n - i, &k);
            size_t o = 0;
            if (cp >= 0x10000) { /* UTF-16 surrogate pair, as JavaScript sees the string */
                uint32_t v = cp - 0x10000, hi = 0xD800 + (v >> 10), lo = 0xDC00 + (v & 0x3FF);
                uint32_t units[2] = {hi, lo};
                for (int u = 0; u < 2; u++) {
                    tmp[o++] = '\\', tmp[o++] = 'u';
                    for (int sh = 12; sh >= 0; sh -= 4) tmp[o++] = hex[(units[u] >> sh) & 15];
                }
            } else {
                tmp[o++] = '\\', tmp[o++] = 'u';
                for (int sh = 12; sh >= 0; sh -= 4) tmp[o++] = hex[(cp >> sh) & 15];
            }
            tmp[o] = 0;
            esc = tmp;
        }
        if (esc) {
            tpl_buf_put(out, s + run, i - run);
            tpl_buf_puts(out, esc);
            i += k;
            run = i;
        } else {
            i++;
        }
    }
    tpl_buf_put(out, s + run, n - run);
    tpl_buf_putc(out, '"');
}

typedef struct kv {
    const char *k;
    size_t kn;
    const tpl_value *v;
} kv;

static int kv_cmp(const void *a, const void *b) {
    const kv *x = a, *y = b;
    size_t n = x->kn < y->kn ? x->kn : y->kn;
    int r = memcmp(x->k, y->k, n);
    return r ? r : (x->kn > y->kn) - (x->kn < y->kn);
}

static void pad(tpl_buf *out, int indent, int depth) {
    tpl_buf_putc(out, '\n');
    for (long i = 0; i < (long)indent * depth; i++) tpl_buf_putc(out, ' ');
}

static void json_value(tpl_ctx *c, tpl_buf *out, const tpl_value *v, const tpl_json_opts *o,
                       int depth) {
    if (depth > JSON_MAX_DEPTH) tpl_fail(c, "value nested deeper than %d levels", JSON_MAX_DEPTH);
    tpl_step(c);
    const char *item_sep = o->item_sep ? o->item_sep : o->indent > 0 ? "," : ", ";
    const char *key_sep = o->key_sep ? o->key_sep : ": ";
    switch (v->type) {
    case TV_NULL: tpl_buf_puts(out, "null"); return;
    case TV_UNDEFINED: tpl_buf_puts(out, o->undefined_as_null ? "null" : "undefined"); return;
    case TV_BOOL: tpl_buf_puts(out, v->u.b ? "true" : "false"); return;
    case TV_INT:
    case TV_FLOAT: {
        char b[40];
        if (o->py_numbers || c->py_numbers)
            tpl_buf_put(out, b, tpl_num_py(v->u.num, v->type == TV_FLOAT, b));
        else
            tpl_buf_put(out, b, ds_json_number_format(v->u.num, b));
        return;
    }
    case TV_STRING: tpl_json_string(out, v->u.str.s, v->u.str.n, o->ensure_ascii); return;
    case TV_ARRAY:
        if (v->flags & TVF_TUPLE) break;
        tpl_buf_putc(out, '[');
        for (size_t i = 0; i < v->u.arr.n; i++) {
            if (i) tpl_buf_puts(out, item_sep);
            if (o->indent > 0) pad(out, o->indent, depth + 1);
            json_value(c, out, v->u.arr.v[i], o, depth + 1);
        }
        if (o->indent > 0 && v->u.arr.n) pad(out, o->indent, depth);
        tpl_buf_putc(out, ']');
        return;
    case TV_OBJECT:
    case TV_NAMESPACE: {
        if (v->flags & TVF_KWARGS) break;
        const tpl_map *m = v->u.map;
        kv *items = tpl_alloc(&c->arena, (m->n ? m->n : 1) * sizeof *items);
        for (size_t i = 0; i < m->n; i++) items[i] = (kv){m->keys[i], m->klens[i], m->vals[i]};
        if (o->sort_keys && m->n > 1) qsort(items, m->n, sizeof *items, kv_cmp);
        tpl_buf_putc(out, '{');
        for (size_t i = 0; i < m->n; i++) {
            if (i) tpl_buf_puts(out, item_sep);
            if (o->indent > 0) pad(out, o->indent, depth + 1);
            tpl_json_string(out, items[i].k, items[i].kn, o->ensure_ascii);
            tpl_buf_puts(out, key_sep);
            json_value(c, out, items[i].v, o, depth + 1);
        }
        if (o->indent > 0 && m->n) pad(out, o->indent, depth);
        tpl_buf_putc(out, '}');
        return;
    }
    case TV_FUNCTION: break;
    }
    tpl_fail(c, "cannot convert %s to JSON", tv_type_name(v));
}

void tpl_json_write(tpl_ctx *c, tpl_buf *out, const tpl_value *v, const tpl_json_opts *o) {
    json_value(c, out, v, o, 0);
}
