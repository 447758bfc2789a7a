/* Statement execution: output, if, for (with loop.*, else, break/continue), set (names, tuples,
 * namespace attributes, blocks), macros, {% call %} and {% filter %} blocks. */
#include <setjmp.h>
#include <string.h>

#include "template/tpl_internal.h"

tpl_value *tpl_render_to_value(tpl_ctx *c, const tpl_nlist *body, tpl_env *env) {
    tpl_buf b;
    tpl_buf_init(&b, &c->arena, c->lim->max_output);
    tpl_render_block(c, body, env, &b);
    return tv_str_buf(c, &b);
}

static void bind_target(tpl_ctx *c, const tpl_node *target, tpl_value *item, tpl_env *scope) {
    if (target->kind == TN_IDENT) {
        tpl_env_set(c, scope, target->s, target->n, item);
        return;
    }
    for (size_t j = 0; j < target->body.n; j++) {
        const tpl_node *t = target->body.v[j];
        if (t->kind != TN_IDENT) tpl_fail(c, "cannot unpack into a non-name");
        tpl_env_set(c, scope, t->s, t->n, j < item->u.arr.n ? item->u.arr.v[j] : TPL_UNDEF);
    }
}

static tpl_value *loop_object(tpl_ctx *c, size_t i, size_t n, tpl_value **items) {
    tpl_value *o = tv_object(c);
    tpl_map *m = o->u.map;
    tpl_map_set(c, m, "index", 5, tv_int(c, (double)i + 1));
    tpl_map_set(c, m, "index0", 6, tv_int(c, (double)i));
    tpl_map_set(c, m, "revindex", 8, tv_int(c, (double)(n - i)));
    tpl_map_set(c, m, "revindex0", 9, tv_int(c, (double)(n - i - 1)));
    tpl_map_set(c, m, "first", 5, TPL_BOOL(i == 0));
    tpl_map_set(c, m, "last", 4, TPL_BOOL(i == n - 1));
    tpl_map_set(c, m, "length", 6, tv_int(c, (double)n));
    tpl_map_set(c, m, "previtem", 8, i > 0 ? items[i - 1] : TPL_UNDEF);
    tpl_map_set(c, m, "nextitem", 8, i + 1 < n ? items[i + 1] : TPL_UNDEF);
    return o;
}

/* One iteration's body; returns 0, or TN_BREAK / TN_CONTINUE when one was reached (then the
 * iteration's partial output is cut off again, as the reference drops it). */
static int run_iteration(tpl_ctx *c, const tpl_nlist *body, tpl_env *scope, tpl_buf *out) {
    jmp_buf jb;
    jmp_buf *const prev = c->loop_jb;
    const int depth = c->depth;
    const size_t start = out->n;
    int sig = setjmp(jb);
    if (sig == 0) {
        c->loop_jb = &jb;
        tpl_render_block(c, body, scope, out);
    } else { /* unwound from the break / continue: nothing below owns memory */
        c->depth = depth;
        out->n = start;
        if (out->p) out->p[start] = 0;
    }
    c->loop_jb = prev;
    return sig;
}

static void render_for(tpl_ctx *c, const tpl_node *x, tpl_env *env, tpl_buf *out) {
    tpl_env *scope = tpl_env_new(c, env);
    tpl_value *it = tpl_eval(c, x->b, scope);
    c->line = x->line;
    if (it->type == TV_OBJECT) { /* iterating a mapping gives its keys */
        tpl_value *keys = tv_array(c, it->u.map->n);
        for (size_t i = 0; i < it->u.map->n; i++)
            tv_push(c, keys, tv_str_ref(c, it->u.map->keys[i], it->u.map->klens[i]));
        it = keys;
    } else if (it->type == TV_STRING) { /* Python iterates characters (the reference refuses) */
        tpl_value *chars = tv_array(c, 0);
        for (size_t i = 0, k; i < it->u.str.n; i += k) {
            tpl_utf8_next(it->u.str.s + i, it->u.str.n - i, &k);
            tv_push(c, chars, tv_str_ref(c, it->u.str.s + i, k));
        }
        it = chars;
    } else if (it->type != TV_ARRAY) {
        tpl_fail(c, "cannot loop over %s", tv_type_name(it));
    }
    const tpl_node *target = x->a;
    size_t n = 0;
    tpl_value **items = tpl_alloc(&c->arena, (it->u.arr.n ? it->u.arr.n : 1) * sizeof *items);
    for (size_t i = 0; i < it->u.arr.n; i++) {
        tpl_value *cur = it->u.arr.v[i];
        if (target->kind == TN_TUPLE) {
            if (cur->type != TV_ARRAY || (cur->flags & TVF_TUPLE))
                tpl_fail(c, "cannot unpack %s", tv_type_name(cur));
            if (cur->u.arr.n != target->body.n)
                tpl_fail(c, "too %s items to unpack", target->body.n > cur->u.arr.n ? "few" : "many");
        }
        if (x->c) {
            tpl_env *ls = tpl_env_new(c, scope);
            bind_target(c, target, cur, ls);
            if (!tv_truthy(tpl_eval(c, x->c, ls))) continue;
        }
        items[n++] = cur;
    }
    bool none = true;
    for (size_t i = 0; i < n; i++) {
        tpl_step(c);
        if (x->uses & TPL_USES_LOOP) tpl_env_set(c, scope, "loop", 4, loop_object(c, i, n, items));
        bind_target(c, target, items[i], scope);
        int sig = run_iteration(c, &x->body, scope, out);
        if (sig == TN_BREAK) break;
        if (sig == 0) none = false;
    }
    if (none) tpl_render_block(c, &x->alt, scope, out);
}

static void exec_set(tpl_ctx *c, const tpl_node *x, tpl_env *env) {
    tpl_value *v = x->b ? tpl_eval(c, x->b, env) : tpl_render_to_value(c, &x->body, env);
    const tpl_node *t = x->a;
    c->line = x->line;
    if (t->kind == TN_IDENT) {
        tpl_env_set(c, env, t->s, t->n, v);
    } else if (t->kind == TN_TUPLE) {
        if (v->type != TV_ARRAY) tpl_fail(c, "cannot unpack %s in set", tv_type_name(v));
        if (v->u.arr.n != t->body.n)
            tpl_fail(c, "too %s items to unpack in set", t->body.n > v->u.arr.n ? "few" : "many");
        for (size_t i = 0; i < t->body.n; i++) {
            if (t->body.v[i]->kind != TN_IDENT) tpl_fail(c, "cannot unpack into a non-name in set");
            tpl_env_set(c, env, t->body.v[i]->s, t->body.v[i]->n, v->u.arr.v[i]);
        }
    } else if (t->kind == TN_MEMBER) {
        tpl_value *obj = tpl_eval(c, t->a, env);
        c->line = x->line;
        if (obj->type != TV_NAMESPACE) tpl_fail(c, "cannot assign an attribute of a non-namespace object");
        if (t->b->kind != TN_IDENT) tpl_fail(c, "cannot assign to a member that is not a name");
        tpl_map_set(c, obj->u.map, t->b->s, t->b->n, v);
    } else {
        tpl_fail(c, "invalid target of set");
    }
}

static tpl_value *eval_callblock(tpl_ctx *c, const tpl_node *x, tpl_env *env) {
    tpl_value *caller = tv_native(c, "caller", NULL, NULL);
    caller->u.fn->node = x;
    caller->u.fn->closure = env;
    const tpl_node *call = x->a;
    tpl_args args;
    tpl_eval_args(c, &call->body, env, &args);
    tpl_value *fn = tpl_eval(c, call->a, env);
    c->line = x->line;
    if (fn->type != TV_FUNCTION) tpl_fail(c, "cannot call %s: it is not a function", tv_type_name(fn));
    tpl_env *site = tpl_env_new(c, env);
    site->call_block_scope = true;
    tpl_env_set(c, site, "caller", 6, caller);
    return tpl_call(c, fn, &args, site);
}

static void emit(tpl_ctx *c, tpl_buf *out, const tpl_value *v) {
    if (v->type != TV_NULL && v->type != TV_UNDEFINED) tv_write(c, out, v);
}

void tpl_render_block(tpl_ctx *c, const tpl_nlist *body, tpl_env *env, tpl_buf *out) {
    for (size_t i = 0; i < body->n; i++) {
        const tpl_node *x = body->v[i];
        c->line = x->line;
        out->line = x->line;
        switch (x->kind) {
        case TN_TEXT: tpl_buf_put(out, x->s, x->n); break;
        case TN_COMMENT: break;
        case TN_IF: {
            bool t = tv_truthy(tpl_eval(c, x->a, env));
            tpl_render_block(c, t ? &x->body : &x->alt, env, out);
            break;
        }
        case TN_FOR: render_for(c, x, env, out); break;
        case TN_SET: exec_set(c, x, env); break;
        case TN_MACRO: {
            tpl_value *fn = tv_native(c, "macro", NULL, NULL);
            fn->u.fn->node = x;
            fn->u.fn->closure = env;
            tpl_env_set(c, env, x->s, x->n, fn);
            break;
        }
        case TN_CALLBLOCK: emit(c, out, eval_callblock(c, x, env)); break;
        case TN_FILTERBLOCK: {
            if (++c->depth > c->lim->max_depth)
                tpl_fail(c, "blocks nested deeper than %d levels", c->lim->max_depth);
            tpl_value *s = tpl_render_to_value(c, &x->body, env);
            c->line = x->line;
            emit(c, out, tpl_apply_filter(c, s, x->b, env));
            c->depth--;
            break;
        }
        case TN_BREAK:
        case TN_CONTINUE:
            if (!c->loop_jb) tpl_fail(c, "'%s' outside of a loop", x->kind == TN_BREAK ? "break" : "continue");
            longjmp(*c->loop_jb, (int)x->kind);
        default: emit(c, out, tpl_eval(c, x, env)); break;
        }
    }
}
