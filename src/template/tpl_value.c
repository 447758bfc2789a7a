/* Runtime values: construction, maps, truthiness, printing and comparison with the reference
 * renderer's (JavaScript) semantics. */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "template/tpl_internal.h"

tpl_value tpl_undefined_v = {.type = TV_UNDEFINED};
tpl_value tpl_null_v = {.type = TV_NULL};
tpl_value tpl_true_v = {.type = TV_BOOL, .u.b = true};
tpl_value tpl_false_v = {.type = TV_BOOL, .u.b = false};

_Noreturn void tpl_fail(tpl_ctx *c, const char *fmt, ...) {
    char msg[DS_ERROR_MSG_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    tpl_throw(&c->base, DS_ERR_FORMAT, c->line, "%s", msg);
}

void tpl_step(tpl_ctx *c) {
    if (++c->steps > c->lim->max_steps)
        tpl_fail(c, "rendering took more than %lu evaluation steps", c->lim->max_steps);
}

static tpl_value *tv_new(tpl_ctx *c, tpl_type t) {
    tpl_value *v = tpl_alloc(&c->arena, sizeof *v);
    v->type = t;
    return v;
}

tpl_value *tv_num(tpl_ctx *c, tpl_type t, double x) {
    tpl_value *v = tv_new(c, t);
    v->u.num = x;
    return v;
}
tpl_value *tv_int(tpl_ctx *c, double x) { return tv_num(c, TV_INT, x); }
tpl_value *tv_float(tpl_ctx *c, double x) { return tv_num(c, TV_FLOAT, x); }

tpl_value *tv_str_ref(tpl_ctx *c, const char *s, size_t n) {
    if (c->lim->max_output && n > c->lim->max_output)
        tpl_fail(c, "a string exceeds %zu bytes", c->lim->max_output);
    tpl_value *v = tv_new(c, TV_STRING);
    v->u.str.s = s ? s : "";
    v->u.str.n = n;
    return v;
}

tpl_value *tv_str(tpl_ctx *c, const char *s, size_t n) {
    if (c->lim->max_output && n > c->lim->max_output)
        tpl_fail(c, "a string exceeds %zu bytes", c->lim->max_output);
    return tv_str_ref(c, tpl_strndup(&c->arena, s, n), n);
}

tpl_value *tv_str_buf(tpl_ctx *c, const tpl_buf *b) { return tv_str_ref(c, b->p, b->n); }

tpl_value *tv_array(tpl_ctx *c, size_t cap) {
    tpl_value *v = tv_new(c, TV_ARRAY);
    if (cap) {
        v->u.arr.v = tpl_alloc(&c->arena, cap * sizeof(tpl_value *));
        v->u.arr.cap = cap;
    }
    return v;
}

void tv_push(tpl_ctx *c, tpl_value *arr, tpl_value *x) {
    tpl_step(c); /* bulk builders (range, split, items, ...) count per element */
    if (arr->u.arr.n == arr->u.arr.cap) {
        size_t cap = arr->u.arr.cap ? arr->u.arr.cap * 2 : 4;
        tpl_value **p = tpl_alloc(&c->arena, cap * sizeof *p);
        if (arr->u.arr.n) memcpy(p, arr->u.arr.v, arr->u.arr.n * sizeof *p);
        arr->u.arr.v = p;
        arr->u.arr.cap = cap;
    }
    arr->u.arr.v[arr->u.arr.n++] = x;
}

tpl_value *tv_object(tpl_ctx *c) {
    tpl_value *v = tv_new(c, TV_OBJECT);
    v->u.map = tpl_alloc(&c->arena, sizeof(tpl_map));
    return v;
}

tpl_value *tv_namespace(tpl_ctx *c) {
    tpl_value *v = tv_object(c);
    v->type = TV_NAMESPACE;
    return v;
}

tpl_value *tv_native(tpl_ctx *c, const char *name, tpl_native_fn fn, tpl_value *self) {
    tpl_value *v = tv_new(c, TV_FUNCTION);
    v->u.fn = tpl_alloc(&c->arena, sizeof(tpl_func));
    v->u.fn->name = name;
    v->u.fn->native = fn;
    v->u.fn->self = self;
    return v;
}

tpl_value *tpl_map_get(const tpl_map *m, const char *k, size_t kn) {
    for (size_t i = 0; i < m->n; i++)
        if (m->klens[i] == kn && !memcmp(m->keys[i], k, kn)) return m->vals[i];
    return NULL;
}

/* JavaScript Map.set: an existing key keeps its position. */
void tpl_map_set(tpl_ctx *c, tpl_map *m, const char *k, size_t kn, tpl_value *v) {
    for (size_t i = 0; i < m->n; i++)
        if (m->klens[i] == kn && !memcmp(m->keys[i], k, kn)) {
            m->vals[i] = v;
            return;
        }
    if (m->n == m->cap) {
        size_t cap = m->cap ? m->cap * 2 : 4;
        const char **keys = tpl_alloc(&c->arena, cap * sizeof *keys);
        size_t *klens = tpl_alloc(&c->arena, cap * sizeof *klens);
        tpl_value **vals = tpl_alloc(&c->arena, cap * sizeof *vals);
        if (m->n) {
            memcpy(keys, m->keys, m->n * sizeof *keys);
            memcpy(klens, m->klens, m->n * sizeof *klens);
            memcpy(vals, m->vals, m->n * sizeof *vals);
        }
        m->keys = keys;
        m->klens = klens;
        m->vals = vals;
        m->cap = cap;
    }
    m->keys[m->n] = k;
    m->klens[m->n] = kn;
    m->vals[m->n] = v;
    m->n++;
}

bool tv_is_array(const tpl_value *v) { return v->type == TV_ARRAY; }
bool tv_is_object(const tpl_value *v) { return v->type == TV_OBJECT; }
bool tv_is_number(const tpl_value *v) { return v->type == TV_INT || v->type == TV_FLOAT; }

const char *tv_type_name(const tpl_value *v) {
    switch (v->type) {
    case TV_UNDEFINED: return "UndefinedValue";
    case TV_NULL: return "NullValue";
    case TV_BOOL: return "BooleanValue";
    case TV_INT: return "IntegerValue";
    case TV_FLOAT: return "FloatValue";
    case TV_STRING: return "StringValue";
    case TV_ARRAY: return v->flags & TVF_TUPLE ? "TupleValue" : "ArrayValue";
    case TV_OBJECT: return v->flags & TVF_KWARGS ? "KeywordArgumentsValue" : "ObjectValue";
    case TV_NAMESPACE: return "NamespaceValue";
    case TV_FUNCTION: return "FunctionValue";
    }
    return "?";
}

bool tv_truthy(const tpl_value *v) {
    switch (v->type) {
    case TV_UNDEFINED:
    case TV_NULL: return false;
    case TV_BOOL: return v->u.b;
    case TV_INT:
    case TV_FLOAT: return v->u.num != 0 && !isnan(v->u.num);
    case TV_STRING: return v->u.str.n > 0;
    case TV_ARRAY: return v->u.arr.n > 0;
    case TV_OBJECT: return v->u.map->n > 0;
    case TV_NAMESPACE:
    case TV_FUNCTION: return true;
    }
    return false;
}

static void write_num(tpl_buf *out, double x) {
    char b[40];
    tpl_buf_put(out, b, tpl_num_js(x, b));
}

/* FloatValue.toString: integral values keep one decimal ("2.0"), -0 is "-0.0". */
static void write_float(tpl_buf *out, double x) {
    if (x == 0 && signbit(x)) {
        tpl_buf_puts(out, "-0.0");
    } else if (isfinite(x) && x == floor(x) && fabs(x) < 1e21) {
        tpl_buf_printf(out, "%.1f", x);
    } else {
        write_num(out, x);
    }
}

void tv_write(tpl_ctx *c, tpl_buf *out, const tpl_value *v) {
    switch (v->type) {
    case TV_UNDEFINED: tpl_buf_puts(out, "undefined"); return;
    case TV_NULL: /* the reference's NullValue holds undefined, and String() says so */
        tpl_buf_puts(out, "undefined");
        return;
    case TV_BOOL: tpl_buf_puts(out, v->u.b ? "true" : "false"); return;
    case TV_INT:
    case TV_FLOAT:
        if (c->py_numbers) {
            char b[40];
            tpl_buf_put(out, b, tpl_num_py(v->u.num, v->type == TV_FLOAT, b));
        } else if (v->type == TV_INT) {
            write_num(out, v->u.num);
        } else {
            write_float(out, v->u.num);
        }
        return;
    case TV_STRING: tpl_buf_put(out, v->u.str.s, v->u.str.n); return;
    case TV_ARRAY:
    case TV_OBJECT:
    case TV_NAMESPACE: {
        tpl_json_opts o = {.undefined_as_null = false};
        tpl_json_write(c, out, v, &o);
        return;
    }
    case TV_FUNCTION: tpl_fail(c, "cannot print a function");
    }
}

void tv_write_raw(tpl_ctx *c, tpl_buf *out, const tpl_value *v) {
    switch (v->type) {
    case TV_FLOAT:
        if (c->py_numbers) break; /* str(float) is repr(float) in Python */
        write_num(out, v->u.num);
        return;
    case TV_ARRAY:
        for (size_t i = 0; i < v->u.arr.n; i++) {
            if (i) tpl_buf_putc(out, ',');
            tv_write(c, out, v->u.arr.v[i]);
        }
        return;
    case TV_OBJECT:
    case TV_NAMESPACE: tpl_buf_puts(out, "[object Map]"); return;
    case TV_FUNCTION: tpl_buf_puts(out, "function"); return;
    default: break;
    }
    tv_write(c, out, v);
}

static bool is_primitive(const tpl_value *v) {
    return v->type == TV_BOOL || v->type == TV_INT || v->type == TV_FLOAT ||
           v->type == TV_STRING;
}

/* ToNumber of a primitive */
static double prim_number(const tpl_value *v) {
    if (v->type == TV_BOOL) return v->u.b ? 1 : 0;
    if (v->type == TV_STRING) return tpl_to_number(v->u.str.s, v->u.str.n);
    return v->u.num;
}

bool tv_strict_eq(const tpl_value *a, const tpl_value *b) {
    bool an = tv_is_number(a), bn = tv_is_number(b);
    if (an || bn) return an && bn && a->u.num == b->u.num;
    if (a->type != b->type) return false;
    switch (a->type) {
    case TV_UNDEFINED:
    case TV_NULL: return true;
    case TV_BOOL: return a->u.b == b->u.b;
    case TV_STRING: return a->u.str.n == b->u.str.n && !memcmp(a->u.str.s, b->u.str.s, a->u.str.n);
    case TV_ARRAY: return a == b;
    case TV_OBJECT:
    case TV_NAMESPACE: return a->u.map == b->u.map;
    case TV_FUNCTION: return a->u.fn == b->u.fn;
    default: return false;
    }
}

bool tv_loose_eq(tpl_ctx *c, const tpl_value *a, const tpl_value *b) {
    bool a_nullish = a->type == TV_UNDEFINED || a->type == TV_NULL;
    bool b_nullish = b->type == TV_UNDEFINED || b->type == TV_NULL;
    if (a_nullish || b_nullish) return a_nullish && b_nullish;
    bool an = tv_is_number(a), bn = tv_is_number(b);
    if ((an && bn) || a->type == b->type) return tv_strict_eq(a, b);
    if (is_primitive(a) && is_primitive(b)) {
        if (a->type == TV_STRING && b->type == TV_STRING) return tv_strict_eq(a, b);
        return prim_number(a) == prim_number(b);
    }
    /* an object against a primitive: the object's primitive spelling is compared */
    const tpl_value *obj = is_primitive(a) ? b : a, *prim = is_primitive(a) ? a : b;
    if (!is_primitive(prim)) return false; /* two different kinds of object */
    tpl_buf s;
    tpl_buf_init(&s, &c->arena, 0);
    tv_write_raw(c, &s, obj);
    tpl_value sv = {.type = TV_STRING, .u.str = {s.p ? s.p : "", s.n}};
    return tv_loose_eq(c, &sv, prim);
}

int tv_compare(tpl_ctx *c, const tpl_value *a, const tpl_value *b, bool case_sensitive) {
    if (a->type == TV_NULL || b->type == TV_NULL) {
        if (a->type == b->type) return 0;
        tpl_fail(c, "cannot compare %s with %s", tv_type_name(a), tv_type_name(b));
    }
    if (a->type == TV_UNDEFINED || b->type == TV_UNDEFINED) {
        if (a->type == b->type) return 0;
        tpl_fail(c, "cannot compare %s with %s", tv_type_name(a), tv_type_name(b));
    }
    bool an = tv_is_number(a) || a->type == TV_BOOL, bn = tv_is_number(b) || b->type == TV_BOOL;
    if (an && bn) {
        double x = prim_number(a), y = prim_number(b);
        return x < y ? -1 : x > y ? 1 : 0;
    }
    if (a->type != b->type || (a->flags != b->flags))
        tpl_fail(c, "cannot compare different types: %s and %s", tv_type_name(a), tv_type_name(b));
    if (a->type != TV_STRING) tpl_fail(c, "cannot compare values of type %s", tv_type_name(a));
    const tpl_value *x = a, *y = b;
    if (!case_sensitive) {
        x = tpl_str_case(c, a, false);
        y = tpl_str_case(c, b, false);
    }
    size_t n = x->u.str.n < y->u.str.n ? x->u.str.n : y->u.str.n;
    int r = memcmp(x->u.str.s, y->u.str.s, n);
    if (r) return r < 0 ? -1 : 1;
    return x->u.str.n < y->u.str.n ? -1 : x->u.str.n > y->u.str.n ? 1 : 0;
}

tpl_value *tv_from_json(tpl_ctx *c, const cJSON *j) {
    if (!j || cJSON_IsNull(j) || cJSON_IsInvalid(j)) return TPL_NULL;
    if (cJSON_IsBool(j)) return TPL_BOOL(cJSON_IsTrue(j));
    if (cJSON_IsNumber(j)) {
        double x = j->valuedouble;
        /* JSON.parse then Number.isInteger decides between the two kinds */
        return tv_num(c, isfinite(x) && x == floor(x) ? TV_INT : TV_FLOAT, x);
    }
    if (cJSON_IsString(j) || cJSON_IsRaw(j))
        return tv_str_ref(c, j->valuestring, j->valuestring ? strlen(j->valuestring) : 0);
    if (cJSON_IsArray(j)) {
        tpl_value *a = tv_array(c, (size_t)cJSON_GetArraySize(j));
        for (const cJSON *e = j->child; e; e = e->next) tv_push(c, a, tv_from_json(c, e));
        return a;
    }
    tpl_value *o = tv_object(c);
    for (const cJSON *e = j->child; e; e = e->next) {
        const char *k = e->string ? e->string : "";
        tpl_map_set(c, o->u.map, k, strlen(k), tv_from_json(c, e));
    }
    return o;
}
