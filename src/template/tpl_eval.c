/* Expression evaluation: scopes, operators, member access, slicing and calls, following the
 * reference renderer's evaluation order and type rules. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "template/tpl_internal.h"

tpl_env *tpl_env_new(tpl_ctx *c, tpl_env *parent) {
    tpl_env *e = tpl_alloc(&c->arena, sizeof *e);
    e->parent = parent;
    return e;
}

tpl_value *tpl_env_lookup(tpl_env *e, const char *name, size_t n) {
    for (; e; e = e->parent) {
        tpl_value *v = tpl_map_get(&e->vars, name, n);
        if (v) return v;
    }
    return NULL;
}

void tpl_env_set(tpl_ctx *c, tpl_env *e, const char *name, size_t n, tpl_value *v) {
    tpl_map_set(c, &e->vars, name, n, v);
}

static tpl_value *concat(tpl_ctx *c, const tpl_value *l, const tpl_value *r, bool undef_empty) {
    tpl_buf b;
    tpl_buf_init(&b, &c->arena, c->lim->max_output);
    b.line = c->line;
    if (!(undef_empty && l->type == TV_UNDEFINED)) tv_write_raw(c, &b, l);
    if (!(undef_empty && r->type == TV_UNDEFINED)) tv_write_raw(c, &b, r);
    return tv_str_buf(c, &b);
}

static bool num_like(const tpl_value *v) { return tv_is_number(v) || v->type == TV_BOOL; }
static double num_of(const tpl_value *v) { return v->type == TV_BOOL ? (v->u.b ? 1 : 0) : v->u.num; }

static bool str_contains(const tpl_value *hay, const tpl_value *needle) {
    if (!needle->u.str.n) return true;
    return hay->u.str.n >= needle->u.str.n &&
           memmem(hay->u.str.s, hay->u.str.n, needle->u.str.s, needle->u.str.n) != NULL;
}

static const char *op_name(tpl_op op) {
    static const char *names[] = {"?", "or", "and", "not", "in", "not in", "==", "!=", "<",
                                  ">", "<=", ">=", "+", "-", "~", "*", "/", "//", "%", "**"};
    return names[op];
}

static tpl_value *eval_binary(tpl_ctx *c, const tpl_node *x, tpl_env *env) {
    tpl_op op = x->op;
    tpl_value *l = tpl_eval(c, x->a, env);
    if (op == OP_AND) return tv_truthy(l) ? tpl_eval(c, x->b, env) : l;
    if (op == OP_OR) return tv_truthy(l) ? l : tpl_eval(c, x->b, env);
    tpl_value *r = tpl_eval(c, x->b, env);
    c->line = x->line;
    if (op == OP_EQ) return TPL_BOOL(tv_loose_eq(c, l, r));
    if (op == OP_NE) return TPL_BOOL(!tv_loose_eq(c, l, r));

    if (tv_is_number(l) && tv_is_number(r) && op != OP_CONCAT && op != OP_POW) {
        double a = l->u.num, b = r->u.num;
        tpl_type t = l->type == TV_FLOAT || r->type == TV_FLOAT ? TV_FLOAT : TV_INT;
        switch (op) {
        case OP_ADD: return tv_num(c, t, a + b);
        case OP_SUB: return tv_num(c, t, a - b);
        case OP_MUL: return tv_num(c, t, a * b);
        case OP_DIV: return tv_float(c, a / b);
        case OP_FLOORDIV: return tv_num(c, t, floor(a / b));
        case OP_MOD: return tv_num(c, t, fmod(a, b));
        case OP_LT: return TPL_BOOL(a < b);
        case OP_GT: return TPL_BOOL(a > b);
        case OP_LE: return TPL_BOOL(a <= b);
        case OP_GE: return TPL_BOOL(a >= b);
        default: break;
        }
    } else if (l->type == TV_UNDEFINED || r->type == TV_UNDEFINED) {
        if (r->type == TV_UNDEFINED && (op == OP_IN || op == OP_NOTIN)) return TPL_BOOL(op == OP_NOTIN);
        if (op == OP_CONCAT && l->type != TV_NULL && r->type != TV_NULL) return concat(c, l, r, true);
        tpl_fail(c, "cannot apply '%s' to an undefined value", op_name(op));
    } else if (l->type == TV_NULL || r->type == TV_NULL) {
        tpl_fail(c, "cannot apply '%s' to none", op_name(op));
    } else if (op == OP_CONCAT) {
        return concat(c, l, r, false);
    } else if (op == OP_POW && num_like(l) && num_like(r)) {
        double a = num_of(l), b = num_of(r);
        if (a == 0 && b < 0) tpl_fail(c, "0.0 cannot be raised to a negative power");
        double p = pow(a, b);
        if (!isfinite(p)) tpl_fail(c, "exponentiation result is not a finite real number");
        bool f = l->type == TV_FLOAT || r->type == TV_FLOAT || b < 0;
        return tv_num(c, f ? TV_FLOAT : TV_INT, p);
    } else if (l->type == TV_ARRAY && r->type == TV_ARRAY) {
        if (op == OP_ADD) {
            tpl_value *out = tv_array(c, l->u.arr.n + r->u.arr.n);
            for (size_t i = 0; i < l->u.arr.n; i++) tv_push(c, out, l->u.arr.v[i]);
            for (size_t i = 0; i < r->u.arr.n; i++) tv_push(c, out, r->u.arr.v[i]);
            return out;
        }
    } else if (r->type == TV_ARRAY) {
        if (op == OP_IN || op == OP_NOTIN) {
            bool found = false;
            for (size_t i = 0; i < r->u.arr.n && !found; i++) found = tv_strict_eq(r->u.arr.v[i], l);
            return TPL_BOOL(found == (op == OP_IN));
        }
    }
    if ((l->type == TV_STRING || r->type == TV_STRING) && op == OP_ADD) return concat(c, l, r, false);
    if (l->type == TV_STRING && r->type == TV_STRING) {
        if (op == OP_IN || op == OP_NOTIN) return TPL_BOOL(str_contains(r, l) == (op == OP_IN));
        if (op == OP_LT || op == OP_GT || op == OP_LE || op == OP_GE) {
            /* Python's string ordering (the reference renderer refuses it) */
            int k = tv_compare(c, l, r, true);
            return TPL_BOOL(op == OP_LT ? k < 0 : op == OP_GT ? k > 0 : op == OP_LE ? k <= 0 : k >= 0);
        }
    }
    if (l->type == TV_STRING && r->type == TV_OBJECT && (op == OP_IN || op == OP_NOTIN))
        return TPL_BOOL((tpl_map_get(r->u.map, l->u.str.s, l->u.str.n) != NULL) == (op == OP_IN));
    if (op == OP_MUL && ((l->type == TV_STRING && r->type == TV_INT) ||
                         (l->type == TV_INT && r->type == TV_STRING))) {
        /* Python's "ab" * 3 (the reference renderer refuses it) */
        const tpl_value *s = l->type == TV_STRING ? l : r;
        double k = l->type == TV_STRING ? r->u.num : l->u.num;
        if (k > 0 && (double)s->u.str.n * k > (double)c->lim->max_output)
            tpl_fail(c, "a string exceeds %zu bytes", c->lim->max_output);
        tpl_buf b;
        tpl_buf_init(&b, &c->arena, c->lim->max_output);
        b.line = c->line;
        for (double i = 0; i < k; i++) tpl_buf_put(&b, s->u.str.s, s->u.str.n);
        return tv_str_buf(c, &b);
    }
    tpl_fail(c, "unknown operator '%s' between %s and %s", op_name(op), tv_type_name(l),
             tv_type_name(r));
}

static tpl_value *eval_unary(tpl_ctx *c, const tpl_node *x, tpl_env *env) {
    tpl_value *v = tpl_eval(c, x->a, env);
    if (x->op == OP_NOT) return TPL_BOOL(!tv_truthy(v));
    if (!num_like(v)) {
        c->line = x->line;
        tpl_fail(c, "unknown operator '%s' for %s", x->op == OP_SUB ? "-" : "+", tv_type_name(v));
    }
    double r = (x->op == OP_SUB ? -1.0 : 1.0) * num_of(v);
    return tv_num(c, v->type == TV_FLOAT ? TV_FLOAT : TV_INT, r);
}

/* The character at UTF-16 index i (negative: from the end), as JavaScript's String.at. */
static tpl_value *string_at(tpl_ctx *c, const tpl_value *s, double idx) {
    double len = (double)tpl_utf16_len(s->u.str.s, s->u.str.n);
    if (idx < 0) idx += len;
    if (!(idx >= 0 && idx < len)) return TPL_UNDEF;
    size_t want = (size_t)idx, unit = 0;
    for (size_t i = 0; i < s->u.str.n;) {
        size_t k;
        uint32_t cp = tpl_utf8_next(s->u.str.s + i, s->u.str.n - i, &k);
        size_t units = cp >= 0x10000 ? 2 : 1;
        if (want < unit + units) {
            if (units == 2) return tv_str_ref(c, "\xEF\xBF\xBD", 3); /* half a surrogate pair */
            return tv_str_ref(c, s->u.str.s + i, k);
        }
        unit += units;
        i += k;
    }
    return TPL_UNDEF;
}

tpl_value *tpl_member(tpl_ctx *c, tpl_value *obj, tpl_value *prop) {
    tpl_value *v = NULL;
    if (obj->type == TV_OBJECT || obj->type == TV_NAMESPACE) {
        if (prop->type != TV_STRING)
            tpl_fail(c, "cannot access a property with a non-string key (%s)", tv_type_name(prop));
        v = tpl_map_get(obj->u.map, prop->u.str.s, prop->u.str.n);
        if (!v && obj->type == TV_OBJECT) v = tpl_builtin_member(c, obj, prop->u.str.s, prop->u.str.n);
    } else if (obj->type == TV_ARRAY || obj->type == TV_STRING) {
        if (prop->type == TV_INT) {
            if (obj->type == TV_STRING) return string_at(c, obj, prop->u.num);
            double i = prop->u.num;
            if (i < 0) i += (double)obj->u.arr.n;
            if (i >= 0 && i < (double)obj->u.arr.n) v = obj->u.arr.v[(size_t)i];
        } else if (prop->type == TV_STRING) {
            v = tpl_builtin_member(c, obj, prop->u.str.s, prop->u.str.n);
        } else {
            tpl_fail(c, "cannot index with %s", tv_type_name(prop));
        }
    } else {
        if (prop->type != TV_STRING)
            tpl_fail(c, "cannot access a property with a non-string key (%s)", tv_type_name(prop));
        v = NULL; /* numbers, booleans, none, undefined and functions have no members */
    }
    return v ? v : TPL_UNDEF;
}

/* utils.slice of the reference: Python's slice rules (except that a negative step's explicit
 * stop of -1 means "before index 0"). */
static void slice_bounds(double len, tpl_value *start, tpl_value *stop, double step, double *s0,
                         double *s1) {
    bool has_start = start->type == TV_INT, has_stop = stop->type == TV_INT;
    double a = has_start ? start->u.num : 0, b = has_stop ? stop->u.num : 0;
    if (step >= 0) {
        a = has_start ? a : 0;
        a = a < 0 ? fmax(len + a, 0) : fmin(a, len);
        b = has_stop ? b : len;
        b = b < 0 ? fmax(len + b, 0) : fmin(b, len);
    } else {
        a = has_start ? a : len - 1;
        a = a < 0 ? fmax(len + a, -1) : fmin(a, len - 1);
        b = has_stop ? b : -1;
        b = b < -1 ? fmax(len + b, -1) : fmin(b, len - 1);
    }
    *s0 = a;
    *s1 = b;
}

tpl_value *tpl_slice(tpl_ctx *c, tpl_value *obj, tpl_value *start, tpl_value *stop,
                     tpl_value *step) {
    if (obj->type != TV_ARRAY && obj->type != TV_STRING)
        tpl_fail(c, "only arrays and strings can be sliced (got %s)", tv_type_name(obj));
    tpl_value *parts[3] = {start, stop, step};
    for (int i = 0; i < 3; i++)
        if (parts[i]->type != TV_INT && parts[i]->type != TV_UNDEFINED)
            tpl_fail(c, "slice indices must be integers (got %s)", tv_type_name(parts[i]));
    double st = step->type == TV_INT ? step->u.num : 1;
    double dir = st > 0 ? 1 : st < 0 ? -1 : 0;
    if (obj->type == TV_ARRAY) {
        double a, b;
        slice_bounds((double)obj->u.arr.n, start, stop, st, &a, &b);
        tpl_value *out = tv_array(c, 0);
        for (double i = a; dir * i < dir * b; i += st) {
            tpl_step(c);
            tv_push(c, out, obj->u.arr.v[(size_t)i]);
        }
        return out;
    }
    /* strings slice by code point (Array.from) */
    const char *s = obj->u.str.s;
    size_t n = obj->u.str.n, cps = 0;
    for (size_t i = 0, k; i < n; i += k, cps++) tpl_utf8_next(s + i, n - i, &k);
    size_t *offs = tpl_alloc(&c->arena, (cps + 1) * sizeof *offs);
    cps = 0;
    for (size_t i = 0, k; i < n; i += k) {
        offs[cps++] = i;
        tpl_utf8_next(s + i, n - i, &k);
    }
    offs[cps] = n;
    double a, b;
    slice_bounds((double)cps, start, stop, st, &a, &b);
    tpl_buf out;
    tpl_buf_init(&out, &c->arena, c->lim->max_output);
    if (dir > 0 && st == 1 && a < b) return tv_str_ref(c, s + offs[(size_t)a], offs[(size_t)b] - offs[(size_t)a]);
    for (double i = a; dir * i < dir * b; i += st) {
        tpl_step(c);
        size_t j = (size_t)i;
        tpl_buf_put(&out, s + offs[j], offs[j + 1] - offs[j]);
    }
    return tv_str_buf(c, &out);
}

void tpl_eval_args(tpl_ctx *c, const tpl_nlist *args, tpl_env *env, tpl_args *out) {
    out->n = 0;
    out->kw = NULL;
    out->pos = tpl_alloc(&c->arena, (args->n ? args->n : 1) * sizeof(tpl_value *));
    size_t cap = args->n;
    for (size_t i = 0; i < args->n; i++) {
        const tpl_node *a = args->v[i];
        if (a->kind == TN_KWARG || a->kind == TN_KWSPREAD) continue;
        if (a->kind == TN_SPREAD) {
            tpl_value *v = tpl_eval(c, a->a, env);
            if (v->type != TV_ARRAY) tpl_fail(c, "cannot unpack %s", tv_type_name(v));
            if (out->n + v->u.arr.n > cap) {
                cap = out->n + v->u.arr.n + args->n;
                tpl_value **p = tpl_alloc(&c->arena, cap * sizeof *p);
                memcpy(p, out->pos, out->n * sizeof *p);
                out->pos = p;
            }
            for (size_t k = 0; k < v->u.arr.n; k++) out->pos[out->n++] = v->u.arr.v[k];
        } else {
            out->pos[out->n++] = tpl_eval(c, a, env);
        }
    }
    for (size_t i = 0; i < args->n; i++) {
        const tpl_node *a = args->v[i];
        if (a->kind != TN_KWARG && a->kind != TN_KWSPREAD) continue;
        if (!out->kw) {
            out->kw = tv_object(c);
            out->kw->flags = TVF_KWARGS;
        }
        if (a->kind == TN_KWARG) {
            if (tpl_map_get(out->kw->u.map, a->s, a->n))
                tpl_fail(c, "got multiple values for keyword argument '%.*s'", (int)a->n, a->s);
            tpl_map_set(c, out->kw->u.map, a->s, a->n, tpl_eval(c, a->a, env));
        } else {
            tpl_value *v = tpl_eval(c, a->a, env);
            if (v->type != TV_OBJECT) tpl_fail(c, "argument after ** must be a mapping, not %s", tv_type_name(v));
            for (size_t k = 0; k < v->u.map->n; k++) {
                if (tpl_map_get(out->kw->u.map, v->u.map->keys[k], v->u.map->klens[k]))
                    tpl_fail(c, "got multiple values for keyword argument '%.*s'",
                             (int)v->u.map->klens[k], v->u.map->keys[k]);
                tpl_map_set(c, out->kw->u.map, v->u.map->keys[k], v->u.map->klens[k], v->u.map->vals[k]);
            }
        }
    }
}

/* Binds a macro's (or call block's) parameters in scope, Jinja's way. */
static void bind_params(tpl_ctx *c, const char *display, const tpl_nlist *params, unsigned uses,
                        const tpl_args *args, tpl_env *scope) {
    size_t nkw = args->kw ? args->kw->u.map->n : 0;
    bool *used = tpl_alloc(&c->arena, (nkw ? nkw : 1) * sizeof *used);
    const tpl_node **pending = tpl_alloc(&c->arena, (params->n ? params->n : 1) * sizeof *pending);
    size_t n_pending = 0;
    for (size_t i = 0; i < params->n; i++) {
        const tpl_node *p = params->v[i];
        tpl_value *v = i < args->n ? args->pos[i] : NULL;
        if (!v && args->kw) {
            for (size_t k = 0; k < nkw; k++)
                if (!used[k] && args->kw->u.map->klens[k] == p->n &&
                    !memcmp(args->kw->u.map->keys[k], p->s, p->n)) {
                    v = args->kw->u.map->vals[k];
                    used[k] = true;
                    break;
                }
        }
        if (!v && p->kind == TN_KWARG) pending[n_pending++] = p;
        tpl_env_set(c, scope, p->s, p->n, v ? v : TPL_UNDEF);
    }
    tpl_value *rest = tv_object(c);
    for (size_t k = 0; k < nkw; k++)
        if (!used[k])
            tpl_map_set(c, rest->u.map, args->kw->u.map->keys[k], args->kw->u.map->klens[k],
                        args->kw->u.map->vals[k]);
    if (uses & TPL_USES_KWARGS)
        tpl_env_set(c, scope, "kwargs", 6, rest);
    else if (rest->u.map->n)
        tpl_fail(c, "macro %s takes no keyword argument '%.*s'", display, (int)rest->u.map->klens[0],
                 rest->u.map->keys[0]);
    if (uses & TPL_USES_VARARGS) {
        tpl_value *va = tv_array(c, 0);
        for (size_t i = params->n; i < args->n; i++) tv_push(c, va, args->pos[i]);
        tpl_env_set(c, scope, "varargs", 7, va);
    } else if (args->n > params->n) {
        tpl_fail(c, "macro %s takes not more than %zu argument(s)", display, params->n);
    }
    for (size_t i = 0; i < n_pending; i++)
        tpl_env_set(c, scope, pending[i]->s, pending[i]->n, tpl_eval(c, pending[i]->a, scope));
}

tpl_value *tpl_call(tpl_ctx *c, tpl_value *fnv, const tpl_args *args, tpl_env *call_site) {
    if (fnv->type != TV_FUNCTION) tpl_fail(c, "cannot call %s: it is not a function", tv_type_name(fnv));
    tpl_func *fn = fnv->u.fn;
    if (fn->native) return fn->native(c, fn->self, args, call_site);
    if (++c->depth > c->lim->max_depth)
        tpl_fail(c, "macro calls nested deeper than %d levels", c->lim->max_depth);
    const tpl_node *m = fn->node;
    tpl_value *result;
    if (m->kind == TN_MACRO) {
        tpl_env *parent = fn->closure;
        if (m->uses & TPL_USES_CALLER) {
            tpl_value *caller = call_site && call_site->call_block_scope
                                    ? tpl_map_get(&call_site->vars, "caller", 6) : NULL;
            parent = tpl_env_new(c, fn->closure);
            tpl_env_set(c, parent, "caller", 6, caller ? caller : TPL_UNDEF);
        }
        tpl_env *scope = tpl_env_new(c, parent);
        char display[80];
        snprintf(display, sizeof display, "'%.*s'", (int)(m->n < 60 ? m->n : 60), m->s);
        bind_params(c, display, &m->params, m->uses, args, scope);
        result = tpl_render_to_value(c, &m->body, scope);
    } else { /* the body of a {% call %} block, invoked as caller(...) */
        tpl_env *scope = tpl_env_new(c, fn->closure);
        bind_params(c, "None", &m->params, m->uses, args, scope);
        result = tpl_render_to_value(c, &m->body, scope);
    }
    c->depth--;
    return result;
}

tpl_value *tpl_eval(tpl_ctx *c, const tpl_node *x, tpl_env *env) {
    tpl_step(c);
    c->line = x->line;
    switch (x->kind) {
    case TN_IDENT: {
        tpl_value *v = tpl_env_lookup(env, x->s, x->n);
        return v ? v : TPL_UNDEF;
    }
    case TN_INT:
    case TN_FLOAT:
    case TN_STR: return x->lit; /* constants are shared, never modified */
    case TN_TEXT: return tv_str_ref(c, x->s, x->n);
    case TN_ARRAY:
    case TN_TUPLE: {
        tpl_value *a = tv_array(c, x->body.n);
        for (size_t i = 0; i < x->body.n; i++) tv_push(c, a, tpl_eval(c, x->body.v[i], env));
        if (x->kind == TN_TUPLE) a->flags = TVF_TUPLE;
        return a;
    }
    case TN_OBJECT: {
        tpl_value *o = tv_object(c);
        for (size_t i = 0; i < x->body.n; i++) {
            tpl_value *k = tpl_eval(c, x->body.v[i], env);
            if (k->type != TV_STRING) tpl_fail(c, "object keys must be strings (got %s)", tv_type_name(k));
            tpl_map_set(c, o->u.map, k->u.str.s, k->u.str.n, tpl_eval(c, x->alt.v[i], env));
        }
        return o;
    }
    case TN_MEMBER: {
        tpl_value *obj = tpl_eval(c, x->a, env);
        tpl_value *prop;
        if (x->flag) {
            if (x->b->kind == TN_SLICE) {
                const tpl_node *s = x->b;
                tpl_value *a = s->a ? tpl_eval(c, s->a, env) : TPL_UNDEF;
                tpl_value *b = s->b ? tpl_eval(c, s->b, env) : TPL_UNDEF;
                tpl_value *st = s->c ? tpl_eval(c, s->c, env) : TPL_UNDEF;
                c->line = x->line;
                return tpl_slice(c, obj, a, b, st);
            }
            prop = tpl_eval(c, x->b, env);
        } else if (x->b->kind == TN_INT) {
            prop = tv_int(c, x->b->num);
        } else {
            prop = tv_str_ref(c, x->b->s, x->b->n);
        }
        c->line = x->line;
        return tpl_member(c, obj, prop);
    }
    case TN_CALL: {
        tpl_args args;
        tpl_eval_args(c, &x->body, env, &args);
        tpl_value *fn = tpl_eval(c, x->a, env);
        c->line = x->line;
        return tpl_call(c, fn, &args, env);
    }
    case TN_BINARY: return eval_binary(c, x, env);
    case TN_UNARY: return eval_unary(c, x, env);
    case TN_FILTER: {
        tpl_value *v = tpl_eval(c, x->a, env);
        c->line = x->line;
        return tpl_apply_filter(c, v, x->b, env);
    }
    case TN_TEST: {
        tpl_value *v = tpl_eval(c, x->a, env);
        tpl_args args;
        tpl_eval_args(c, &x->body, env, &args);
        c->line = x->line;
        bool known;
        bool r = tpl_run_test(c, x->s, x->n, v, &args, &known);
        if (!known) tpl_fail(c, "unknown test '%.*s'", (int)x->n, x->s);
        return TPL_BOOL(r != x->flag);
    }
    case TN_TERNARY:
        return tv_truthy(tpl_eval(c, x->a, env)) ? tpl_eval(c, x->b, env) : tpl_eval(c, x->c, env);
    case TN_SELECT:
        return tv_truthy(tpl_eval(c, x->b, env)) ? tpl_eval(c, x->a, env) : TPL_UNDEF;
    case TN_SLICE: tpl_fail(c, "a slice is only allowed inside []");
    case TN_KWARG:
    case TN_SPREAD:
    case TN_KWSPREAD: tpl_fail(c, "keyword arguments and unpacking are only allowed in calls");
    default: tpl_fail(c, "a statement cannot be used as a value");
    }
}
