/* Global functions (range, namespace, raise_exception, strftime_now, dict) and the builtin
 * methods of strings and objects (s.startswith(...), d.items(), ...). */
#include <math.h>
#include <string.h>
#include <time.h>
#include <utf8proc.h>

#include "template/tpl_internal.h"

tpl_value *tpl_arg(const tpl_args *a, size_t i, const char *kw) {
    if (i < a->n) return a->pos[i];
    if (kw && a->kw) return tpl_map_get(a->kw->u.map, kw, strlen(kw));
    return NULL;
}

/* ---- string helpers ------------------------------------------------------------------------ */

tpl_value *tpl_str_case(tpl_ctx *c, const tpl_value *s, bool upper) {
    tpl_buf b;
    tpl_buf_init(&b, &c->arena, c->lim->max_output);
    for (size_t i = 0; i < s->u.str.n;) {
        size_t k;
        uint32_t cp = tpl_utf8_next(s->u.str.s + i, s->u.str.n - i, &k);
        if (upper && cp == 0xDF) { /* JavaScript's full case mapping: ß → SS */
            tpl_buf_put(&b, "SS", 2);
        } else if (!upper && cp == 0x130) { /* İ → i + combining dot above */
            tpl_buf_put(&b, "i\xCC\x87", 3);
        } else {
            uint32_t m = (uint32_t)(upper ? utf8proc_toupper((utf8proc_int32_t)cp)
                                          : utf8proc_tolower((utf8proc_int32_t)cp));
            if (m == cp) {
                tpl_buf_put(&b, s->u.str.s + i, k);
            } else {
                char u[4];
                tpl_buf_put(&b, u, tpl_utf8_put(u, m));
            }
        }
        i += k;
    }
    return tv_str_buf(c, &b);
}

tpl_value *tpl_str_trim(tpl_ctx *c, const tpl_value *s, bool left, bool right) {
    const char *p = s->u.str.s;
    size_t n = s->u.str.n;
    if (left) {
        size_t k = tpl_js_space_prefix(p, n);
        p += k;
        n -= k;
    }
    if (right) n -= tpl_js_space_suffix(p, n);
    return tv_str_ref(c, p, n);
}

static bool cp_in(uint32_t cp, const tpl_value *chars) {
    for (size_t i = 0; i < chars->u.str.n;) {
        size_t k;
        if (tpl_utf8_next(chars->u.str.s + i, chars->u.str.n - i, &k) == cp) return true;
        i += k;
    }
    return false;
}

/* Python's str.strip(chars) */
static tpl_value *strip_chars(tpl_ctx *c, const tpl_value *s, const tpl_value *chars, bool left,
                              bool right) {
    const char *p = s->u.str.s;
    size_t a = 0, b = s->u.str.n;
    if (left)
        while (a < b) {
            size_t k;
            if (!cp_in(tpl_utf8_next(p + a, b - a, &k), chars)) break;
            a += k;
        }
    if (right)
        while (b > a) {
            size_t st = b - 1;
            while (st > a && ((unsigned char)p[st] & 0xC0) == 0x80 && b - st < 4) st--;
            size_t k;
            uint32_t cp = tpl_utf8_next(p + st, b - st, &k);
            if (st + k != b) st = b - 1, cp = (unsigned char)p[st];
            if (!cp_in(cp, chars)) break;
            b = st;
        }
    return tv_str_ref(c, p + a, b - a);
}

tpl_value *tpl_str_replace(tpl_ctx *c, const tpl_value *s, const tpl_value *old,
                           const tpl_value *new_, double count) {
    if (count == 0) return (tpl_value *)s;
    double left = count < 0 || isnan(count) ? INFINITY : count;
    tpl_buf b;
    tpl_buf_init(&b, &c->arena, c->lim->max_output);
    b.line = c->line;
    const char *p = s->u.str.s;
    size_t n = s->u.str.n, on = old->u.str.n;
    if (on == 0) { /* matches before every code point and at the end */
        size_t i = 0;
        while (i <= n) {
            if (left > 0) {
                tpl_buf_put(&b, new_->u.str.s, new_->u.str.n);
                left--;
            }
            if (i == n) break;
            size_t k;
            tpl_utf8_next(p + i, n - i, &k);
            tpl_buf_put(&b, p + i, k);
            i += k;
        }
        return tv_str_buf(c, &b);
    }
    size_t i = 0;
    while (i < n) {
        const char *hit = left > 0 && n - i >= on ? memmem(p + i, n - i, old->u.str.s, on) : NULL;
        if (!hit) break;
        size_t h = (size_t)(hit - p);
        tpl_buf_put(&b, p + i, h - i);
        tpl_buf_put(&b, new_->u.str.s, new_->u.str.n);
        i = h + on;
        left--;
    }
    tpl_buf_put(&b, p + i, n - i);
    return tv_str_buf(c, &b);
}

/* ---- string methods ------------------------------------------------------------------------ */

static tpl_value *m_upper(tpl_ctx *c, tpl_value *self, const tpl_args *a, tpl_env *e) {
    (void)a, (void)e;
    return tpl_str_case(c, self, true);
}
static tpl_value *m_lower(tpl_ctx *c, tpl_value *self, const tpl_args *a, tpl_env *e) {
    (void)a, (void)e;
    return tpl_str_case(c, self, false);
}

/* strip / lstrip / rstrip: JavaScript whitespace without an argument; with a string argument
 * Python's strip(chars) (the reference ignores the argument, which templates such as Qwen's
 * `.strip('\n')` do not expect). */
static tpl_value *do_strip(tpl_ctx *c, tpl_value *self, const tpl_args *a, bool l, bool r) {
    tpl_value *chars = tpl_arg(a, 0, "chars");
    if (chars && chars->type == TV_STRING) return strip_chars(c, self, chars, l, r);
    if (chars && chars->type != TV_NULL && chars->type != TV_UNDEFINED)
        tpl_fail(c, "strip arguments must be strings");
    return tpl_str_trim(c, self, l, r);
}
static tpl_value *m_strip(tpl_ctx *c, tpl_value *self, const tpl_args *a, tpl_env *e) {
    (void)e;
    return do_strip(c, self, a, true, true);
}
static tpl_value *m_lstrip(tpl_ctx *c, tpl_value *self, const tpl_args *a, tpl_env *e) {
    (void)e;
    return do_strip(c, self, a, true, false);
}
static tpl_value *m_rstrip(tpl_ctx *c, tpl_value *self, const tpl_args *a, tpl_env *e) {
    (void)e;
    return do_strip(c, self, a, false, true);
}

static bool is_word_byte(unsigned char ch) {
    return (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') || ch == '_';
}

/* title: /\b\w/g upper-cased (ASCII word characters, the rest untouched) */
static tpl_value *m_title(tpl_ctx *c, tpl_value *self, const tpl_args *a, tpl_env *e) {
    (void)a, (void)e;
    char *p = tpl_strndup(&c->arena, self->u.str.s, self->u.str.n);
    for (size_t i = 0; i < self->u.str.n; i++) {
        unsigned char ch = (unsigned char)p[i];
        if (is_word_byte(ch) && (i == 0 || !is_word_byte((unsigned char)p[i - 1])) && ch >= 'a' && ch <= 'z')
            p[i] = (char)(ch - 32);
    }
    return tv_str_ref(c, p, self->u.str.n);
}

/* capitalize: first character upper-cased, the rest untouched */
static tpl_value *m_capitalize(tpl_ctx *c, tpl_value *self, const tpl_args *a, tpl_env *e) {
    (void)a, (void)e;
    if (!self->u.str.n) return self;
    size_t k;
    tpl_utf8_next(self->u.str.s, self->u.str.n, &k);
    tpl_value head = {.type = TV_STRING, .u.str = {self->u.str.s, k}};
    tpl_value *h = tpl_str_case(c, &head, true);
    tpl_buf b;
    tpl_buf_init(&b, &c->arena, c->lim->max_output);
    tpl_buf_put(&b, h->u.str.s, h->u.str.n);
    tpl_buf_put(&b, self->u.str.s + k, self->u.str.n - k);
    return tv_str_buf(c, &b);
}

static tpl_value *affix(tpl_ctx *c, tpl_value *self, const tpl_args *a, bool start) {
    tpl_value *p = tpl_arg(a, 0, NULL);
    const char *name = start ? "startswith" : "endswith";
    if (!p) tpl_fail(c, "%s() requires an argument", name);
    tpl_value *one = p;
    size_t n = 1;
    tpl_value **list = &one;
    if (p->type == TV_ARRAY) {
        list = p->u.arr.v;
        n = p->u.arr.n;
    } else if (p->type != TV_STRING) {
        tpl_fail(c, "%s() argument must be a string or a tuple of strings", name);
    }
    for (size_t i = 0; i < n; i++) {
        const tpl_value *x = list[i];
        if (x->type != TV_STRING) tpl_fail(c, "%s() tuple elements must be strings", name);
        size_t xn = x->u.str.n, sn = self->u.str.n;
        if (xn <= sn && !memcmp(self->u.str.s + (start ? 0 : sn - xn), x->u.str.s, xn)) return TPL_BOOL(true);
    }
    return TPL_BOOL(false);
}
static tpl_value *m_startswith(tpl_ctx *c, tpl_value *self, const tpl_args *a, tpl_env *e) {
    (void)e;
    return affix(c, self, a, true);
}
static tpl_value *m_endswith(tpl_ctx *c, tpl_value *self, const tpl_args *a, tpl_env *e) {
    (void)e;
    return affix(c, self, a, false);
}

/* Python's str.split(sep=None, maxsplit=-1), as the reference implements it */
static tpl_value *m_split(tpl_ctx *c, tpl_value *self, const tpl_args *a, tpl_env *e) {
    (void)e;
    tpl_value *sep = tpl_arg(a, 0, "sep");
    tpl_value *maxv = tpl_arg(a, 1, "maxsplit");
    if (!sep) sep = TPL_NULL;
    if (sep->type != TV_STRING && sep->type != TV_NULL) tpl_fail(c, "split() separator must be a string or none");
    if (maxv && maxv->type != TV_INT) tpl_fail(c, "split() maxsplit must be an integer");
    double maxsplit = maxv ? maxv->u.num : -1;
    tpl_value *out = tv_array(c, 0);
    const char *s = self->u.str.s;
    size_t n = self->u.str.n;
    if (sep->type == TV_NULL) {
        size_t i = tpl_js_space_prefix(s, n);
        while (i < n) {
            size_t st = i;
            while (i < n) {
                size_t k;
                if (tpl_js_space(tpl_utf8_next(s + i, n - i, &k))) break;
                i += k;
            }
            if (maxsplit >= 0 && (double)out->u.arr.n >= maxsplit) {
                tv_push(c, out, tv_str_ref(c, s + st, n - st));
                break;
            }
            tv_push(c, out, tv_str_ref(c, s + st, i - st));
            i += tpl_js_space_prefix(s + i, n - i);
        }
        return out;
    }
    size_t sn = sep->u.str.n;
    if (!sn) tpl_fail(c, "empty separator");
    size_t i = 0;
    for (;;) {
        tpl_step(c);
        const char *hit = n - i >= sn ? memmem(s + i, n - i, sep->u.str.s, sn) : NULL;
        if (!hit || (maxsplit >= 0 && (double)out->u.arr.n >= maxsplit)) {
            tv_push(c, out, tv_str_ref(c, s + i, n - i));
            break;
        }
        tv_push(c, out, tv_str_ref(c, s + i, (size_t)(hit - s) - i));
        i = (size_t)(hit - s) + sn;
    }
    return out;
}

static tpl_value *m_replace(tpl_ctx *c, tpl_value *self, const tpl_args *a, tpl_env *e) {
    (void)e;
    tpl_value *old = tpl_arg(a, 0, NULL), *new_ = tpl_arg(a, 1, NULL);
    if (!old || !new_) tpl_fail(c, "replace() requires two arguments");
    if (old->type != TV_STRING || new_->type != TV_STRING) tpl_fail(c, "replace() arguments must be strings");
    tpl_value *count = tpl_arg(a, 2, "count");
    if (count && count->type != TV_INT && count->type != TV_NULL)
        tpl_fail(c, "replace() count must be an integer or none");
    return tpl_str_replace(c, self, old, new_, count && count->type == TV_INT ? count->u.num : -1);
}

/* ---- object methods ------------------------------------------------------------------------ */

static tpl_value *pair(tpl_ctx *c, const tpl_map *m, size_t i) {
    tpl_value *p = tv_array(c, 2);
    tv_push(c, p, tv_str_ref(c, m->keys[i], m->klens[i]));
    tv_push(c, p, m->vals[i]);
    return p;
}

static tpl_value *m_get(tpl_ctx *c, tpl_value *self, const tpl_args *a, tpl_env *e) {
    (void)e;
    tpl_value *k = tpl_arg(a, 0, NULL), *d = tpl_arg(a, 1, NULL);
    if (!k || k->type != TV_STRING) tpl_fail(c, "object key must be a string");
    tpl_value *v = tpl_map_get(self->u.map, k->u.str.s, k->u.str.n);
    return v ? v : d ? d : TPL_NULL;
}
static tpl_value *m_items(tpl_ctx *c, tpl_value *self, const tpl_args *a, tpl_env *e) {
    (void)a, (void)e;
    tpl_value *out = tv_array(c, self->u.map->n);
    for (size_t i = 0; i < self->u.map->n; i++) tv_push(c, out, pair(c, self->u.map, i));
    return out;
}
static tpl_value *m_keys(tpl_ctx *c, tpl_value *self, const tpl_args *a, tpl_env *e) {
    (void)a, (void)e;
    tpl_value *out = tv_array(c, self->u.map->n);
    for (size_t i = 0; i < self->u.map->n; i++)
        tv_push(c, out, tv_str_ref(c, self->u.map->keys[i], self->u.map->klens[i]));
    return out;
}
static tpl_value *m_values(tpl_ctx *c, tpl_value *self, const tpl_args *a, tpl_env *e) {
    (void)a, (void)e;
    tpl_value *out = tv_array(c, self->u.map->n);
    for (size_t i = 0; i < self->u.map->n; i++) tv_push(c, out, self->u.map->vals[i]);
    return out;
}

typedef struct sort_ctx {
    tpl_ctx *c;
    bool case_sensitive, reverse;
    int index; /* pair element compared */
} sort_ctx;

/* A stable merge sort (JavaScript's Array.prototype.sort is stable) with a throwing comparator. */
static void merge_sort(tpl_value **v, tpl_value **tmp, size_t n, sort_ctx *s) {
    if (n < 2) return;
    size_t h = n / 2;
    merge_sort(v, tmp, h, s);
    merge_sort(v + h, tmp, n - h, s);
    size_t i = 0, j = h, o = 0;
    while (i < h && j < n) {
        const tpl_value *x = s->index >= 0 ? v[i]->u.arr.v[s->index] : v[i];
        const tpl_value *y = s->index >= 0 ? v[j]->u.arr.v[s->index] : v[j];
        int r = tv_compare(s->c, x, y, s->case_sensitive);
        if (s->reverse) r = -r;
        tmp[o++] = r <= 0 ? v[i++] : v[j++];
    }
    while (i < h) tmp[o++] = v[i++];
    while (j < n) tmp[o++] = v[j++];
    memcpy(v, tmp, n * sizeof *v);
}

static tpl_value *m_dictsort(tpl_ctx *c, tpl_value *self, const tpl_args *a, tpl_env *e) {
    (void)e;
    tpl_value *cs = tpl_arg(a, 0, "case_sensitive"), *by = tpl_arg(a, 1, "by"),
              *rev = tpl_arg(a, 2, "reverse");
    if (cs && cs->type != TV_BOOL) tpl_fail(c, "case_sensitive must be a boolean");
    if (rev && rev->type != TV_BOOL) tpl_fail(c, "reverse must be a boolean");
    int index = 0;
    if (by) {
        if (by->type != TV_STRING) tpl_fail(c, "by must be a string");
        if (by->u.str.n == 5 && !memcmp(by->u.str.s, "value", 5)) index = 1;
        else if (!(by->u.str.n == 3 && !memcmp(by->u.str.s, "key", 3)))
            tpl_fail(c, "by must be either 'key' or 'value'");
    }
    tpl_value *items = m_items(c, self, a, e);
    sort_ctx s = {c, cs && cs->u.b, rev && rev->u.b, index};
    tpl_value **tmp = tpl_alloc(&c->arena, (items->u.arr.n + 1) * sizeof *tmp);
    merge_sort(items->u.arr.v, tmp, items->u.arr.n, &s);
    return items;
}

void tpl_sort_values(tpl_ctx *c, tpl_value **v, size_t n, bool reverse, bool case_sensitive,
                     tpl_value *attribute) {
    sort_ctx s = {c, case_sensitive, reverse, -1};
    if (attribute && attribute->type != TV_NULL) {
        /* sort [key, item] pairs by key */
        tpl_buf path;
        tpl_buf_init(&path, &c->arena, 0);
        tv_write(c, &path, attribute);
        tpl_value **pairs = tpl_alloc(&c->arena, (n + 1) * sizeof *pairs);
        for (size_t i = 0; i < n; i++) {
            pairs[i] = tv_array(c, 2);
            tv_push(c, pairs[i], tpl_attr_path(c, v[i], path.p ? path.p : "", path.n));
            tv_push(c, pairs[i], v[i]);
        }
        s.index = 0;
        tpl_value **tmp = tpl_alloc(&c->arena, (n + 1) * sizeof *tmp);
        merge_sort(pairs, tmp, n, &s);
        for (size_t i = 0; i < n; i++) v[i] = pairs[i]->u.arr.v[1];
        return;
    }
    tpl_value **tmp = tpl_alloc(&c->arena, (n + 1) * sizeof *tmp);
    merge_sort(v, tmp, n, &s);
}

tpl_value *tpl_attr_path(tpl_ctx *c, tpl_value *item, const char *path, size_t n) {
    tpl_value *v = item;
    size_t i = 0;
    for (;;) {
        const char *dot = memchr(path + i, '.', n - i);
        size_t end = dot ? (size_t)(dot - path) : n;
        const char *part = path + i;
        size_t pn = end - i;
        if (v->type == TV_OBJECT || v->type == TV_NAMESPACE) {
            v = tpl_map_get(v->u.map, part, pn);
            if (!v) return TPL_UNDEF;
        } else if (v->type == TV_ARRAY) {
            double idx = tpl_parse_int(part, pn);
            if (isnan(idx) || idx < 0 || idx >= (double)v->u.arr.n) return TPL_UNDEF;
            v = v->u.arr.v[(size_t)idx];
        } else {
            return TPL_UNDEF;
        }
        if (!dot) return v;
        i = end + 1;
        (void)c;
    }
}

tpl_value *tpl_builtin_member(tpl_ctx *c, tpl_value *obj, const char *name, size_t n) {
    static const struct {
        const char *name;
        tpl_native_fn fn;
    } str_methods[] = {{"upper", m_upper},           {"lower", m_lower},
                       {"strip", m_strip},           {"title", m_title},
                       {"capitalize", m_capitalize}, {"rstrip", m_rstrip},
                       {"lstrip", m_lstrip},         {"startswith", m_startswith},
                       {"endswith", m_endswith},     {"split", m_split},
                       {"replace", m_replace}},
      obj_methods[] = {{"get", m_get},
                       {"items", m_items},
                       {"keys", m_keys},
                       {"values", m_values},
                       {"dictsort", m_dictsort}};
    if (obj->type == TV_STRING) {
        if (n == 6 && !memcmp(name, "length", 6))
            return tv_int(c, (double)tpl_utf16_len(obj->u.str.s, obj->u.str.n));
        for (size_t i = 0; i < sizeof str_methods / sizeof str_methods[0]; i++)
            if (strlen(str_methods[i].name) == n && !memcmp(str_methods[i].name, name, n))
                return tv_native(c, str_methods[i].name, str_methods[i].fn, obj);
    } else if (obj->type == TV_ARRAY) {
        if (n == 6 && !memcmp(name, "length", 6)) return tv_int(c, (double)obj->u.arr.n);
    } else if (obj->type == TV_OBJECT) {
        for (size_t i = 0; i < sizeof obj_methods / sizeof obj_methods[0]; i++)
            if (strlen(obj_methods[i].name) == n && !memcmp(obj_methods[i].name, name, n))
                return tv_native(c, obj_methods[i].name, obj_methods[i].fn, obj);
    }
    return NULL;
}

/* ---- globals --------------------------------------------------------------------------------- */

static tpl_value *g_namespace(tpl_ctx *c, tpl_value *self, const tpl_args *a, tpl_env *e) {
    (void)self, (void)e;
    if (a->n > 1) tpl_fail(c, "namespace expected at most 1 argument, got %zu", a->n);
    tpl_value *ns = tv_namespace(c);
    if (a->n == 1) {
        tpl_value *src = a->pos[0];
        if (src->type == TV_OBJECT) {
            for (size_t i = 0; i < src->u.map->n; i++)
                tpl_map_set(c, ns->u.map, src->u.map->keys[i], src->u.map->klens[i], src->u.map->vals[i]);
        } else if (src->type == TV_ARRAY) {
            for (size_t i = 0; i < src->u.arr.n; i++) {
                tpl_value *p = src->u.arr.v[i];
                if (p->type != TV_ARRAY || p->u.arr.n != 2 || p->u.arr.v[0]->type != TV_STRING)
                    tpl_fail(c, "namespace expected an object or [key, value] pairs");
                tpl_value *k = p->u.arr.v[0];
                tpl_map_set(c, ns->u.map, k->u.str.s, k->u.str.n, p->u.arr.v[1]);
            }
        } else {
            tpl_fail(c, "'%s' object is not iterable", tv_type_name(src));
        }
    }
    if (a->kw)
        for (size_t i = 0; i < a->kw->u.map->n; i++)
            tpl_map_set(c, ns->u.map, a->kw->u.map->keys[i], a->kw->u.map->klens[i], a->kw->u.map->vals[i]);
    return ns;
}

static tpl_value *g_dict(tpl_ctx *c, tpl_value *self, const tpl_args *a, tpl_env *e) {
    tpl_value *ns = g_namespace(c, self, a, e);
    ns->type = TV_OBJECT;
    return ns;
}

static tpl_value *g_range(tpl_ctx *c, tpl_value *self, const tpl_args *a, tpl_env *e) {
    (void)self, (void)e;
    double v[3] = {0, 0, 1};
    if (a->n < 1 || a->n > 3) tpl_fail(c, "range expected 1 to 3 arguments, got %zu", a->n);
    for (size_t i = 0; i < a->n; i++) {
        if (!tv_is_number(a->pos[i]) && a->pos[i]->type != TV_BOOL)
            tpl_fail(c, "range arguments must be numbers (got %s)", tv_type_name(a->pos[i]));
        v[i] = a->pos[i]->type == TV_BOOL ? a->pos[i]->u.b : a->pos[i]->u.num;
    }
    double start = a->n == 1 ? 0 : v[0], stop = a->n == 1 ? v[0] : v[1], step = a->n == 3 ? v[2] : 1;
    if (step == 0) tpl_fail(c, "range() step must not be zero");
    double count = ceil((stop - start) / step);
    if (!(count <= 1e7)) tpl_fail(c, "range() of more than 10 million numbers");
    tpl_value *out = tv_array(c, count > 0 ? (size_t)count : 0);
    if (step > 0)
        for (double i = start; i < stop; i += step) tv_push(c, out, tv_int(c, i));
    else
        for (double i = start; i > stop; i += step) tv_push(c, out, tv_int(c, i));
    return out;
}

static tpl_value *g_raise(tpl_ctx *c, tpl_value *self, const tpl_args *a, tpl_env *e) {
    (void)self, (void)e;
    tpl_buf b;
    tpl_buf_init(&b, &c->arena, 400);
    if (a->n) {
        tpl_value *m = a->pos[0];
        if (m->type == TV_STRING) tpl_buf_put(&b, m->u.str.s, m->u.str.n < 400 ? m->u.str.n : 400);
        else tv_write(c, &b, m);
    }
    tpl_throw(&c->base, DS_ERR_INVALID_ARG, c->line, "%s", b.p ? b.p : "raise_exception");
}

static tpl_value *g_strftime_now(tpl_ctx *c, tpl_value *self, const tpl_args *a, tpl_env *e) {
    (void)self, (void)e;
    tpl_value *f = tpl_arg(a, 0, NULL);
    if (!f || f->type != TV_STRING) tpl_fail(c, "strftime_now() takes a format string");
    time_t now = time(NULL);
    struct tm tm;
    localtime_r(&now, &tm);
    tpl_buf b;
    tpl_buf_init(&b, &c->arena, c->lim->max_output);
    const char *s = f->u.str.s;
    size_t n = f->u.str.n;
    for (size_t i = 0; i < n; i++) {
        /* the conversions Python's strftime shares with the C library; others stay literal */
        if (s[i] == '%' && i + 1 < n && strchr("aAbBcdHIjmMpSUwWxXyYzZ%", s[i + 1]) && s[i + 1]) {
            char fmt[3] = {'%', s[i + 1], 0}, out[128];
            /* fmt is one whitelisted conversion built here, not caller text */
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wformat-nonliteral"
            size_t k = strftime(out, sizeof out, fmt, &tm);
#pragma GCC diagnostic pop
            tpl_buf_put(&b, out, k);
            i++;
        } else {
            tpl_buf_putc(&b, s[i]);
        }
    }
    return tv_str_buf(c, &b);
}

void tpl_declare_globals(tpl_ctx *c, tpl_env *g) {
    tpl_env_set(c, g, "namespace", 9, tv_native(c, "namespace", g_namespace, NULL));
    tpl_env_set(c, g, "false", 5, TPL_BOOL(false));
    tpl_env_set(c, g, "true", 4, TPL_BOOL(true));
    tpl_env_set(c, g, "none", 4, TPL_NULL);
    tpl_env_set(c, g, "raise_exception", 15, tv_native(c, "raise_exception", g_raise, NULL));
    tpl_env_set(c, g, "range", 5, tv_native(c, "range", g_range, NULL));
    tpl_env_set(c, g, "strftime_now", 12, tv_native(c, "strftime_now", g_strftime_now, NULL));
    tpl_env_set(c, g, "True", 4, TPL_BOOL(true));
    tpl_env_set(c, g, "False", 5, TPL_BOOL(false));
    tpl_env_set(c, g, "None", 4, TPL_NULL);
    tpl_env_set(c, g, "dict", 4, tv_native(c, "dict", g_dict, NULL));
}
