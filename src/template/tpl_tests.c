/* Tests (`x is defined`, `x is not none`, ...): the reference renderer's set, plus the Python
 * Jinja2 tests that take an argument (divisibleby, in, eq/ne/gt/..., sameas), which it lacks. */
#include <math.h>
#include <string.h>

#include "template/tpl_internal.h"

static bool name_is(const char *name, size_t n, const char *s) {
    return n == strlen(s) && !memcmp(name, s, n);
}

static tpl_value *need_arg(tpl_ctx *c, const tpl_args *a, const char *test) {
    tpl_value *v = tpl_arg(a, 0, NULL);
    if (!v) tpl_fail(c, "test '%s' needs an argument", test);
    return v;
}

static int num_cmp(tpl_ctx *c, const tpl_value *a, const tpl_value *b, const char *test) {
    if (tv_is_number(a) && tv_is_number(b)) return a->u.num < b->u.num ? -1 : a->u.num > b->u.num ? 1 : 0;
    if (a->type == TV_STRING && b->type == TV_STRING) return tv_compare(c, a, b, true);
    tpl_fail(c, "test '%s' cannot compare %s with %s", test, tv_type_name(a), tv_type_name(b));
}

bool tpl_run_test(tpl_ctx *c, const char *name, size_t n, tpl_value *v, const tpl_args *a,
                  bool *known) {
    *known = true;
    if (name_is(name, n, "defined")) return v->type != TV_UNDEFINED;
    if (name_is(name, n, "undefined")) return v->type == TV_UNDEFINED;
    if (name_is(name, n, "none")) return v->type == TV_NULL;
    if (name_is(name, n, "boolean")) return v->type == TV_BOOL;
    if (name_is(name, n, "true")) return v->type == TV_BOOL && v->u.b;
    if (name_is(name, n, "false")) return v->type == TV_BOOL && !v->u.b;
    if (name_is(name, n, "string")) return v->type == TV_STRING;
    if (name_is(name, n, "number")) return tv_is_number(v);
    if (name_is(name, n, "integer")) return v->type == TV_INT;
    if (name_is(name, n, "float")) return v->type == TV_FLOAT;
    if (name_is(name, n, "callable")) return v->type == TV_FUNCTION;
    if (name_is(name, n, "iterable"))
        return (v->type == TV_ARRAY && !(v->flags & TVF_TUPLE)) || v->type == TV_STRING;
    if (name_is(name, n, "mapping")) return v->type == TV_OBJECT;
    if (name_is(name, n, "sequence"))
        return v->type == TV_ARRAY || v->type == TV_OBJECT || v->type == TV_STRING;
    if (name_is(name, n, "odd") || name_is(name, n, "even")) {
        if (v->type != TV_INT) tpl_fail(c, "cannot test %.*s on %s", (int)n, name, tv_type_name(v));
        bool odd = fmod(v->u.num, 2) != 0;
        return name[0] == 'o' ? odd : !odd;
    }
    if (name_is(name, n, "lower") || name_is(name, n, "upper")) {
        if (v->type != TV_STRING) return false;
        tpl_value *m = tpl_str_case(c, v, name[0] == 'u');
        return m->u.str.n == v->u.str.n && !memcmp(m->u.str.s, v->u.str.s, v->u.str.n);
    }
    if (name_is(name, n, "equalto") || name_is(name, n, "eq") || name_is(name, n, "==")) {
        tpl_value *b = tpl_arg(a, 0, NULL);
        return tv_strict_eq(v, b ? b : TPL_UNDEF);
    }
    if (name_is(name, n, "ne") || name_is(name, n, "!="))
        return !tv_strict_eq(v, need_arg(c, a, "ne"));
    if (name_is(name, n, "sameas")) {
        tpl_value *b = need_arg(c, a, "sameas");
        return v == b || tv_strict_eq(v, b);
    }
    if (name_is(name, n, "gt") || name_is(name, n, "greaterthan"))
        return num_cmp(c, v, need_arg(c, a, "gt"), "gt") > 0;
    if (name_is(name, n, "ge")) return num_cmp(c, v, need_arg(c, a, "ge"), "ge") >= 0;
    if (name_is(name, n, "lt") || name_is(name, n, "lessthan"))
        return num_cmp(c, v, need_arg(c, a, "lt"), "lt") < 0;
    if (name_is(name, n, "le")) return num_cmp(c, v, need_arg(c, a, "le"), "le") <= 0;
    if (name_is(name, n, "divisibleby")) {
        tpl_value *d = need_arg(c, a, "divisibleby");
        if (!tv_is_number(v) || !tv_is_number(d) || d->u.num == 0)
            tpl_fail(c, "divisibleby needs a number and a non-zero divisor");
        return fmod(v->u.num, d->u.num) == 0;
    }
    if (name_is(name, n, "in")) {
        tpl_value *seq = need_arg(c, a, "in");
        if (seq->type == TV_ARRAY) {
            for (size_t i = 0; i < seq->u.arr.n; i++)
                if (tv_strict_eq(seq->u.arr.v[i], v)) return true;
            return false;
        }
        if (seq->type == TV_STRING && v->type == TV_STRING)
            return !v->u.str.n || (seq->u.str.n >= v->u.str.n &&
                                   memmem(seq->u.str.s, seq->u.str.n, v->u.str.s, v->u.str.n));
        if (seq->type == TV_OBJECT && v->type == TV_STRING)
            return tpl_map_get(seq->u.map, v->u.str.s, v->u.str.n) != NULL;
        tpl_fail(c, "test 'in' cannot look for %s in %s", tv_type_name(v), tv_type_name(seq));
    }
    *known = false;
    return false;
}
