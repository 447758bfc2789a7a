/* Filters. The dispatch follows the reference renderer: a few filters work on any value
 * (safe, tojson, default), the rest by operand type, with and without arguments. Where the
 * reference has no such filter for the type (it would fail), Python Jinja2's behaviour is
 * implemented: select/reject, map('filter'), min/max/sum, round, list of a string, ... */
#include <math.h>
#include <string.h>

#include "template/tpl_internal.h"


#define IS(lit) (nn == sizeof(lit) - 1 && !memcmp(name, lit, nn))

static tpl_value *copy_array(tpl_ctx *c, const tpl_value *a) {
    tpl_value *out = tv_array(c, a->u.arr.n);
    for (size_t i = 0; i < a->u.arr.n; i++) tv_push(c, out, a->u.arr.v[i]);
    return out;
}

static tpl_value *tojson(tpl_ctx *c, tpl_value *v, const tpl_args *a) {
    tpl_json_opts o = {.undefined_as_null = true};
    tpl_value *kw = a ? a->kw : NULL;
    tpl_value *indent = kw ? tpl_map_get(kw->u.map, "indent", 6) : NULL;
    tpl_value *ascii = kw ? tpl_map_get(kw->u.map, "ensure_ascii", 12) : NULL;
    tpl_value *sortk = kw ? tpl_map_get(kw->u.map, "sort_keys", 9) : NULL;
    tpl_value *seps = kw ? tpl_map_get(kw->u.map, "separators", 10) : NULL;
    if (indent && indent->type != TV_INT && indent->type != TV_NULL) tpl_fail(c, "tojson: indent must be a number");
    if (ascii && ascii->type != TV_BOOL) tpl_fail(c, "tojson: ensure_ascii must be a boolean");
    if (sortk && sortk->type != TV_BOOL) tpl_fail(c, "tojson: sort_keys must be a boolean");
    if (indent && indent->type == TV_INT) {
        if (indent->u.num < 0 || indent->u.num > 64) tpl_fail(c, "tojson: indent out of range");
        o.indent = (int)indent->u.num;
    }
    o.ensure_ascii = ascii && ascii->u.b;
    o.sort_keys = sortk && sortk->u.b;
    if (seps && seps->type != TV_NULL) {
        if (seps->type != TV_ARRAY || seps->u.arr.n != 2 || seps->u.arr.v[0]->type != TV_STRING ||
            seps->u.arr.v[1]->type != TV_STRING)
            tpl_fail(c, "tojson: separators must be a pair of strings");
        o.item_sep = tpl_strndup(&c->arena, seps->u.arr.v[0]->u.str.s, seps->u.arr.v[0]->u.str.n);
        o.key_sep = tpl_strndup(&c->arena, seps->u.arr.v[1]->u.str.s, seps->u.arr.v[1]->u.str.n);
    }
    tpl_buf b;
    tpl_buf_init(&b, &c->arena, c->lim->max_output);
    b.line = c->line;
    tpl_json_write(c, &b, v, &o);
    return tv_str_buf(c, &b);
}

/* Array.join of raw values: none / undefined join as "" */
static tpl_value *join(tpl_ctx *c, tpl_value *v, const char *sep, size_t sn) {
    tpl_buf b;
    tpl_buf_init(&b, &c->arena, c->lim->max_output);
    b.line = c->line;
    if (v->type == TV_STRING) {
        for (size_t i = 0, k; i < v->u.str.n; i += k) {
            if (i) tpl_buf_put(&b, sep, sn);
            tpl_utf8_next(v->u.str.s + i, v->u.str.n - i, &k);
            tpl_buf_put(&b, v->u.str.s + i, k);
        }
    } else {
        for (size_t i = 0; i < v->u.arr.n; i++) {
            if (i) tpl_buf_put(&b, sep, sn);
            tpl_value *x = v->u.arr.v[i];
            if (x->type != TV_NULL && x->type != TV_UNDEFINED) tv_write_raw(c, &b, x);
        }
    }
    return tv_str_buf(c, &b);
}

static tpl_value *indent(tpl_ctx *c, tpl_value *s, const char *pad, size_t pn, bool first,
                         bool blank) {
    tpl_buf b;
    tpl_buf_init(&b, &c->arena, c->lim->max_output);
    b.line = c->line;
    const char *p = s->u.str.s, *end = p + s->u.str.n;
    for (size_t line = 0;; line++) {
        const char *nl = memchr(p, '\n', (size_t)(end - p));
        size_t len = nl ? (size_t)(nl - p) : (size_t)(end - p);
        if (!((!first && line == 0) || (!blank && len == 0))) tpl_buf_put(&b, pad, pn);
        tpl_buf_put(&b, p, len);
        if (!nl) break;
        tpl_buf_putc(&b, '\n');
        p = nl + 1;
    }
    return tv_str_buf(c, &b);
}

static tpl_value *unique(tpl_ctx *c, tpl_value *v) {
    tpl_value *out = tv_array(c, 0);
    for (size_t i = 0; i < v->u.arr.n; i++) {
        bool seen = false;
        for (size_t j = 0; j < out->u.arr.n && !seen; j++) {
            tpl_step(c);
            seen = tv_strict_eq(out->u.arr.v[j], v->u.arr.v[i]);
        }
        if (!seen) tv_push(c, out, v->u.arr.v[i]);
    }
    return out;
}

static tpl_value *num_filter(tpl_ctx *c, tpl_value *v, bool to_int, tpl_value *dflt) {
    if (v->type == TV_STRING) {
        double x = to_int ? tpl_parse_int(v->u.str.s, v->u.str.n) : tpl_parse_float(v->u.str.s, v->u.str.n);
        if (isnan(x)) return dflt ? dflt : to_int ? tv_int(c, 0) : tv_float(c, 0);
        return to_int ? tv_int(c, x) : tv_float(c, x);
    }
    if (tv_is_number(v)) return to_int ? tv_int(c, trunc(v->u.num) + 0.0) : tv_float(c, v->u.num);
    if (v->type == TV_BOOL) return to_int ? tv_int(c, v->u.b) : tv_float(c, v->u.b);
    if (v->type == TV_NULL || v->type == TV_UNDEFINED) /* Python: the default */
        return dflt ? dflt : to_int ? tv_int(c, 0) : tv_float(c, 0);
    tpl_fail(c, "cannot apply filter '%s' to %s", to_int ? "int" : "float", tv_type_name(v));
}

static tpl_value *html_escape(tpl_ctx *c, tpl_value *v) {
    tpl_buf b;
    tpl_buf_init(&b, &c->arena, c->lim->max_output);
    b.line = c->line;
    tpl_buf s;
    tpl_buf_init(&s, &c->arena, c->lim->max_output);
    if (v->type == TV_NULL) tpl_buf_puts(&s, "None"); /* Python's spellings */
    else if (v->type != TV_UNDEFINED) tv_write(c, &s, v);
    for (size_t i = 0; i < s.n; i++) {
        switch (s.p[i]) {
        case '&': tpl_buf_puts(&b, "&amp;"); break;
        case '<': tpl_buf_puts(&b, "&lt;"); break;
        case '>': tpl_buf_puts(&b, "&gt;"); break;
        case '"': tpl_buf_puts(&b, "&#34;"); break;
        case '\'': tpl_buf_puts(&b, "&#39;"); break;
        default: tpl_buf_putc(&b, s.p[i]);
        }
    }
    return tv_str_buf(c, &b);
}

static tpl_value *apply_named(tpl_ctx *c, tpl_value *v, const char *name, size_t nn,
                              const tpl_args *a, tpl_env *env);

/* select / reject / selectattr / rejectattr */
static tpl_value *select_items(tpl_ctx *c, tpl_value *v, const tpl_args *a, bool attr, bool keep) {
    size_t base = attr ? 1 : 0;
    tpl_value *attr_name = attr ? tpl_arg(a, 0, NULL) : NULL;
    if (attr && (!attr_name || attr_name->type != TV_STRING))
        tpl_fail(c, "selectattr / rejectattr need an attribute name");
    tpl_value *test = tpl_arg(a, base, NULL);
    if (test && test->type != TV_STRING) tpl_fail(c, "the test name must be a string");
    tpl_args targs = {a->n > base + 1 ? a->pos + base + 1 : NULL, a->n > base + 1 ? a->n - base - 1 : 0, NULL};
    tpl_value *out = tv_array(c, 0);
    for (size_t i = 0; i < v->u.arr.n; i++) {
        tpl_step(c);
        tpl_value *item = v->u.arr.v[i], *x = item;
        bool r;
        if (attr) {
            if (item->type != TV_OBJECT && item->type != TV_NAMESPACE)
                tpl_fail(c, "%s can only be applied to an array of objects", keep ? "selectattr" : "rejectattr");
            x = tpl_map_get(item->u.map, attr_name->u.str.s, attr_name->u.str.n);
        }
        if (!x) {
            r = false; /* a missing attribute fails every test, as in the reference */
        } else if (test) {
            bool known;
            r = tpl_run_test(c, test->u.str.s, test->u.str.n, x, &targs, &known);
            if (!known) tpl_fail(c, "unknown test '%.*s'", (int)test->u.str.n, test->u.str.s);
        } else {
            r = tv_truthy(x);
        }
        if (r == keep) tv_push(c, out, item);
    }
    return out;
}

static tpl_value *map_items(tpl_ctx *c, tpl_value *v, const tpl_args *a, tpl_env *env) {
    tpl_value *attr = a->kw ? tpl_map_get(a->kw->u.map, "attribute", 9) : NULL;
    tpl_value *out = tv_array(c, v->u.arr.n);
    if (attr) {
        if (attr->type != TV_STRING) tpl_fail(c, "map: attribute must be a string");
        tpl_value *dflt = tpl_map_get(a->kw->u.map, "default", 7);
        for (size_t i = 0; i < v->u.arr.n; i++) {
            tpl_value *item = v->u.arr.v[i];
            if (item->type != TV_OBJECT && item->type != TV_NAMESPACE)
                tpl_fail(c, "map: items must be objects");
            tpl_value *x = tpl_attr_path(c, item, attr->u.str.s, attr->u.str.n);
            tv_push(c, out, x->type == TV_UNDEFINED && dflt ? dflt : x);
        }
        return out;
    }
    /* map('filter', args...) as in Python Jinja2 */
    tpl_value *f = tpl_arg(a, 0, NULL);
    if (!f || f->type != TV_STRING) tpl_fail(c, "map needs attribute= or a filter name");
    tpl_args fa = {a->n > 1 ? a->pos + 1 : NULL, a->n > 1 ? a->n - 1 : 0, NULL};
    for (size_t i = 0; i < v->u.arr.n; i++)
        tv_push(c, out, apply_named(c, v->u.arr.v[i], f->u.str.s, f->u.str.n, fa.n ? &fa : NULL, env));
    return out;
}

static tpl_value *min_max_sum(tpl_ctx *c, tpl_value *v, int which) {
    if (which == 2) {
        double s = 0;
        bool is_float = false;
        for (size_t i = 0; i < v->u.arr.n; i++) {
            tpl_value *x = v->u.arr.v[i];
            if (!tv_is_number(x) && x->type != TV_BOOL) tpl_fail(c, "sum: items must be numbers");
            s += x->type == TV_BOOL ? x->u.b : x->u.num;
            is_float |= x->type == TV_FLOAT;
        }
        return tv_num(c, is_float ? TV_FLOAT : TV_INT, s);
    }
    if (!v->u.arr.n) return TPL_UNDEF;
    tpl_value *best = v->u.arr.v[0];
    for (size_t i = 1; i < v->u.arr.n; i++) {
        int r = tv_compare(c, v->u.arr.v[i], best, false);
        if (which == 0 ? r < 0 : r > 0) best = v->u.arr.v[i];
    }
    return best;
}

/* Filters without arguments (or with empty parentheses), by operand type. */
static tpl_value *apply_plain(tpl_ctx *c, tpl_value *v, const char *name, size_t nn) {
    if (IS("safe")) return v;
    if (IS("tojson")) return tojson(c, v, NULL);
    if (IS("default") || IS("d")) return v->type == TV_UNDEFINED ? tv_str_ref(c, "", 0) : v;
    if (IS("e") || IS("escape")) return html_escape(c, v);
    if (v->type == TV_ARRAY) {
        if (IS("list")) return v;
        if (IS("first")) return v->u.arr.n ? v->u.arr.v[0] : TPL_UNDEF;
        if (IS("last")) return v->u.arr.n ? v->u.arr.v[v->u.arr.n - 1] : TPL_UNDEF;
        if (IS("length") || IS("count")) return tv_int(c, (double)v->u.arr.n);
        if (IS("reverse")) {
            tpl_value *out = tv_array(c, v->u.arr.n);
            for (size_t i = v->u.arr.n; i-- > 0;) tv_push(c, out, v->u.arr.v[i]);
            return out;
        }
        if (IS("sort")) {
            tpl_value *out = copy_array(c, v);
            tpl_sort_values(c, out->u.arr.v, out->u.arr.n, false, false, NULL);
            return out;
        }
        if (IS("join")) return join(c, v, "", 0);
        if (IS("string")) {
            tpl_json_opts o = {.undefined_as_null = false};
            tpl_buf b;
            tpl_buf_init(&b, &c->arena, c->lim->max_output);
            tpl_json_write(c, &b, v, &o);
            return tv_str_buf(c, &b);
        }
        if (IS("unique")) return unique(c, v);
        if (IS("select") || IS("reject")) {
            tpl_args none = {0};
            return select_items(c, v, &none, false, IS("select"));
        }
        if (IS("min")) return min_max_sum(c, v, 0);
        if (IS("max")) return min_max_sum(c, v, 1);
        if (IS("sum")) return min_max_sum(c, v, 2);
        if (IS("items") || IS("dictsort")) goto unknown;
    } else if (v->type == TV_STRING) {
        if (IS("length") || IS("count")) return tv_int(c, (double)tpl_utf16_len(v->u.str.s, v->u.str.n));
        if (IS("upper") || IS("lower") || IS("title") || IS("capitalize"))
            return tpl_call(c, tpl_builtin_member(c, v, name, nn), &(tpl_args){0}, NULL);
        if (IS("trim")) return tpl_str_trim(c, v, true, true);
        if (IS("indent")) return indent(c, v, "    ", 4, false, false);
        if (IS("join") || IS("string")) return v;
        if (IS("int")) return num_filter(c, v, true, NULL);
        if (IS("float")) return num_filter(c, v, false, NULL);
        if (IS("list")) {
            tpl_value *out = tv_array(c, 0);
            for (size_t i = 0, k; i < v->u.str.n; i += k) {
                tpl_utf8_next(v->u.str.s + i, v->u.str.n - i, &k);
                tv_push(c, out, tv_str_ref(c, v->u.str.s + i, k));
            }
            return out;
        }
        if (IS("first") || IS("last")) {
            if (!v->u.str.n) return TPL_UNDEF;
            tpl_value *l = apply_plain(c, v, "list", 4);
            return l->u.arr.v[IS("first") ? 0 : l->u.arr.n - 1];
        }
        if (IS("reverse")) {
            tpl_value *l = apply_plain(c, v, "list", 4);
            tpl_buf b;
            tpl_buf_init(&b, &c->arena, c->lim->max_output);
            for (size_t i = l->u.arr.n; i-- > 0;) tpl_buf_put(&b, l->u.arr.v[i]->u.str.s, l->u.arr.v[i]->u.str.n);
            return tv_str_buf(c, &b);
        }
    } else if (tv_is_number(v)) {
        if (IS("abs")) return tv_num(c, v->type, fabs(v->u.num));
        if (IS("int")) return num_filter(c, v, true, NULL);
        if (IS("float")) return num_filter(c, v, false, NULL);
        if (IS("round")) return tv_float(c, round(v->u.num));
        if (IS("string")) {
            tpl_buf b;
            tpl_buf_init(&b, &c->arena, 0);
            tv_write(c, &b, v);
            return tv_str_buf(c, &b);
        }
    } else if (v->type == TV_OBJECT) {
        if (IS("items")) {
            tpl_value *out = tv_array(c, v->u.map->n);
            for (size_t i = 0; i < v->u.map->n; i++) {
                tpl_value *p = tv_array(c, 2);
                tv_push(c, p, tv_str_ref(c, v->u.map->keys[i], v->u.map->klens[i]));
                tv_push(c, p, v->u.map->vals[i]);
                tv_push(c, out, p);
            }
            return out;
        }
        if (IS("length") || IS("count")) return tv_int(c, (double)v->u.map->n);
        tpl_value *m = tpl_builtin_member(c, v, name, nn);
        if (m) return m->type == TV_FUNCTION ? tpl_call(c, m, &(tpl_args){0}, NULL) : m;
        if (IS("list")) return tpl_call(c, tpl_builtin_member(c, v, "keys", 4), &(tpl_args){0}, NULL);
        if (IS("string")) {
            tpl_buf b;
            tpl_buf_init(&b, &c->arena, c->lim->max_output);
            tv_write(c, &b, v);
            return tv_str_buf(c, &b);
        }
    } else if (v->type == TV_BOOL) {
        if (IS("bool")) return v;
        if (IS("int")) return tv_int(c, v->u.b);
        if (IS("float")) return tv_float(c, v->u.b);
        if (IS("string")) return tv_str_ref(c, v->u.b ? "true" : "false", v->u.b ? 4 : 5);
    } else if (v->type == TV_NULL || v->type == TV_UNDEFINED) {
        /* Python Jinja2's answers where the reference fails */
        bool u = v->type == TV_UNDEFINED;
        if (IS("string")) return u ? tv_str_ref(c, "", 0) : tv_str_ref(c, "None", 4);
        if (IS("length") || IS("count")) return tv_int(c, 0);
        if (IS("int")) return tv_int(c, 0);
        if (IS("float")) return tv_float(c, 0);
        if (u && (IS("trim") || IS("upper") || IS("lower") || IS("join"))) return tv_str_ref(c, "", 0);
        if (u && IS("list")) return tv_array(c, 0);
    }
unknown:
    tpl_fail(c, "cannot apply filter '%.*s' to %s", (int)nn, name, tv_type_name(v));
}

/* Filters called with arguments (a non-NULL). */
static tpl_value *apply_named(tpl_ctx *c, tpl_value *v, const char *name, size_t nn,
                              const tpl_args *a, tpl_env *env) {
    if (!a) return apply_plain(c, v, name, nn);
    if (IS("tojson")) return tojson(c, v, a);
    if (IS("default") || IS("d")) {
        tpl_value *d = tpl_arg(a, 0, NULL), *boolean = tpl_arg(a, 1, "boolean");
        if (!d) d = tv_str_ref(c, "", 0);
        if (boolean && boolean->type != TV_BOOL) tpl_fail(c, "default: the boolean flag must be a boolean");
        if (v->type == TV_UNDEFINED || (boolean && boolean->u.b && !tv_truthy(v))) return d;
        return v;
    }
    if (IS("join")) {
        if (v->type != TV_STRING && v->type != TV_ARRAY) tpl_fail(c, "cannot apply filter 'join' to %s", tv_type_name(v));
        tpl_value *sep = tpl_arg(a, 0, "separator");
        if (!sep) sep = a->kw ? tpl_map_get(a->kw->u.map, "d", 1) : NULL;
        if (sep && sep->type != TV_STRING) tpl_fail(c, "join: the separator must be a string");
        tpl_value *attr = a->kw ? tpl_map_get(a->kw->u.map, "attribute", 9) : NULL;
        if (attr && v->type == TV_ARRAY) { /* Python's join(attribute=...) */
            tpl_args ma = {NULL, 0, a->kw};
            tpl_value *kw = tv_object(c);
            tpl_map_set(c, kw->u.map, "attribute", 9, attr);
            ma.kw = kw;
            v = map_items(c, v, &ma, env);
        }
        return join(c, v, sep ? sep->u.str.s : "", sep ? sep->u.str.n : 0);
    }
    if (IS("int") || IS("float")) return num_filter(c, v, IS("int"), tpl_arg(a, 0, "default"));
    if (v->type == TV_ARRAY) {
        if (IS("sort")) {
            tpl_value *rev = tpl_arg(a, 0, "reverse"), *cs = tpl_arg(a, 1, "case_sensitive"),
                      *attr = tpl_arg(a, 2, "attribute");
            if (rev && rev->type != TV_BOOL) tpl_fail(c, "sort: reverse must be a boolean");
            if (cs && cs->type != TV_BOOL) tpl_fail(c, "sort: case_sensitive must be a boolean");
            if (attr && attr->type != TV_STRING && attr->type != TV_INT && attr->type != TV_NULL)
                tpl_fail(c, "sort: attribute must be a string, an integer or none");
            tpl_value *out = copy_array(c, v);
            tpl_sort_values(c, out->u.arr.v, out->u.arr.n, rev && rev->u.b, cs && cs->u.b, attr);
            return out;
        }
        if (IS("selectattr") || IS("rejectattr")) return select_items(c, v, a, true, IS("selectattr"));
        if (IS("select") || IS("reject")) return select_items(c, v, a, false, IS("select"));
        if (IS("map")) return map_items(c, v, a, env);
    } else if (v->type == TV_STRING) {
        if (IS("indent")) {
            tpl_value *w = tpl_arg(a, 0, "width"), *first = tpl_arg(a, 1, "first"),
                      *blank = tpl_arg(a, 2, "blank");
            char spaces[256];
            const char *pad = "    ";
            size_t pn = 4;
            if (w && w->type == TV_STRING) {
                pad = w->u.str.s;
                pn = w->u.str.n;
            } else if (w && w->type == TV_INT) {
                double k = w->u.num < 0 ? 0 : w->u.num;
                if (k > 255) tpl_fail(c, "indent: width too large");
                memset(spaces, ' ', (size_t)k);
                pad = spaces;
                pn = (size_t)k;
            } else if (w) {
                tpl_fail(c, "indent: width must be an integer or a string");
            }
            return indent(c, v, pad, pn, first && tv_truthy(first), blank && tv_truthy(blank));
        }
        if (IS("replace")) {
            tpl_value *m = tpl_builtin_member(c, v, "replace", 7);
            return tpl_call(c, m, a, NULL);
        }
        if (IS("trim")) { /* Python's trim(chars) */
            tpl_value *m = tpl_builtin_member(c, v, "strip", 5);
            return tpl_call(c, m, a, NULL);
        }
    } else if (v->type == TV_OBJECT) {
        tpl_value *m = tpl_builtin_member(c, v, name, nn);
        if (m && m->type == TV_FUNCTION) return tpl_call(c, m, a, NULL);
    } else if (tv_is_number(v) && IS("round")) {
        tpl_value *prec = tpl_arg(a, 0, "precision"), *method = tpl_arg(a, 1, "method");
        double p = prec && tv_is_number(prec) ? prec->u.num : 0, f = pow(10, p), x = v->u.num * f;
        if (method && method->type == TV_STRING && method->u.str.n == 4 && !memcmp(method->u.str.s, "ceil", 4))
            x = ceil(x);
        else if (method && method->type == TV_STRING && method->u.str.n == 5 && !memcmp(method->u.str.s, "floor", 5))
            x = floor(x);
        else
            x = round(x);
        return tv_float(c, x / f);
    }
    if (a->n == 0 && !a->kw) return apply_plain(c, v, name, nn); /* `x|length()` */
    tpl_fail(c, "cannot apply filter '%.*s' with arguments to %s", (int)nn, name, tv_type_name(v));
}

tpl_value *tpl_apply_filter(tpl_ctx *c, tpl_value *operand, const tpl_node *f, tpl_env *env) {
    if (f->kind == TN_IDENT) return apply_plain(c, operand, f->s, f->n);
    if (f->kind != TN_CALL || f->a->kind != TN_IDENT) tpl_fail(c, "unknown filter");
    tpl_args a;
    tpl_eval_args(c, &f->body, env, &a);
    c->line = f->line;
    return apply_named(c, operand, f->a->s, f->a->n, &a, env);
}
