/* Jinja parser: recursive descent with the reference renderer's grammar and precedence
 *   ternary < or < and < not < comparison/in < + - ~ < * / // % < ** < is-test < |filter
 *   < unary sign < call/member < primary
 * plus test arguments (`x is divisibleby(3)`, `x is in y`), which the reference lacks.
 * Every node records its subtree height; deeper trees are refused so that evaluation and the
 * other recursive walks have bounded stack use. */
#include <stdlib.h>
#include <string.h>

#include "template/tpl_internal.h"

typedef struct parser {
    tpl_arena *a;
    const tpl_token *t;
    size_t n, cur;
    int rdepth; /* recursion depth of the descent itself (unwound by throw on errors) */
} parser;

typedef struct nvec {
    tpl_node **v;
    size_t n, cap;
} nvec;

_Noreturn static void perr(parser *P, const char *msg) {
    const tpl_token *t = &P->t[P->cur < P->n ? P->cur : P->n - 1];
    tpl_throw(P->a->base, DS_ERR_FORMAT, t->line, "%s", msg);
}

static const tpl_token *tok(parser *P) { return &P->t[P->cur]; }
static const tpl_token *tok_at(parser *P, size_t k) {
    return &P->t[P->cur + k < P->n ? P->cur + k : P->n - 1];
}
static void advance(parser *P) {
    if (P->t[P->cur].type != TK_EOF) P->cur++;
}
static bool is(parser *P, tpl_tok_type type) { return tok(P)->type == type; }

static bool tok_is_ident(const tpl_token *t, const char *name) {
    return t->type == TK_IDENT && t->n == strlen(name) && !memcmp(t->s, name, t->n);
}
static bool is_ident(parser *P, const char *name) { return tok_is_ident(tok(P), name); }

static const char *tok_desc(const tpl_token *t) {
    static const char *names[] = {
        "text", "number", "string", "identifier", "'='", "'('", "')'", "'{%'", "'%}'", "'{{'",
        "'}}'", "'['", "']'", "'{'", "'}'", "','", "'.'", "':'", "'|'", "operator", "operator",
        "'**'", "comparison", "unary operator", "comment", "end of template"};
    return names[t->type];
}

static void expect(parser *P, tpl_tok_type type, const char *what) {
    if (!is(P, type)) {
        const tpl_token *t = tok(P);
        tpl_throw(P->a->base, DS_ERR_FORMAT, t->line, "expected %s, got %s", what, tok_desc(t));
    }
    advance(P);
}

static void expect_ident(parser *P, const char *name) {
    if (!is_ident(P, name)) {
        const tpl_token *t = tok(P);
        tpl_throw(P->a->base, DS_ERR_FORMAT, t->line, "expected '%s', got %s", name, tok_desc(t));
    }
    advance(P);
}

/* {% name ... where name is one of names (NULL-terminated) */
static bool is_stmt(parser *P, const char *const *names) {
    if (!is(P, TK_OPEN_STMT)) return false;
    const tpl_token *t = tok_at(P, 1);
    for (; *names; names++)
        if (tok_is_ident(t, *names)) return true;
    return false;
}

static void nvec_push(parser *P, nvec *v, tpl_node *x) {
    if (v->n == v->cap) {
        size_t cap = v->cap ? v->cap * 2 : 8;
        tpl_node **p = tpl_alloc(P->a, cap * sizeof *p);
        if (v->n) memcpy(p, v->v, v->n * sizeof *p);
        v->v = p;
        v->cap = cap;
    }
    v->v[v->n++] = x;
}

static tpl_nlist nlist(nvec v) { return (tpl_nlist){v.v, v.n}; }

/* Bounds the C stack before the tree exists (fin() bounds the tree itself). */
static void enter(parser *P) {
    if (++P->rdepth > 2 * TPL_MAX_AST_DEPTH)
        tpl_throw(P->a->base, DS_ERR_FORMAT, P->t[P->cur].line,
                  "template nested deeper than %d levels", TPL_MAX_AST_DEPTH);
}
static tpl_node *leave(parser *P, tpl_node *x) {
    P->rdepth--;
    return x;
}

static tpl_node *mk(parser *P, tpl_nk kind, int line) {
    tpl_node *x = tpl_alloc(P->a, sizeof *x);
    x->kind = kind;
    x->line = line;
    x->depth = 1;
    return x;
}

static int list_depth(const tpl_nlist *l) {
    int d = 0;
    for (size_t i = 0; i < l->n; i++)
        if (l->v[i]->depth > d) d = l->v[i]->depth;
    return d;
}

/* Computes the subtree height once all children are attached; refuses too deep trees. */
static tpl_node *fin(parser *P, tpl_node *x) {
    int d = 0;
    if (x->a && x->a->depth > d) d = x->a->depth;
    if (x->b && x->b->depth > d) d = x->b->depth;
    if (x->c && x->c->depth > d) d = x->c->depth;
    int l = list_depth(&x->body);
    if (l > d) d = l;
    l = list_depth(&x->alt);
    if (l > d) d = l;
    l = list_depth(&x->params);
    if (l > d) d = l;
    x->depth = d + 1;
    if (x->depth > TPL_MAX_AST_DEPTH)
        tpl_throw(P->a->base, DS_ERR_FORMAT, x->line, "template nested deeper than %d levels",
                  TPL_MAX_AST_DEPTH);
    return x;
}

static tpl_node *bin(parser *P, tpl_op op, tpl_node *l, tpl_node *r, int line) {
    tpl_node *x = mk(P, TN_BINARY, line);
    x->op = op;
    x->a = l;
    x->b = r;
    return fin(P, x);
}

static tpl_node *parse_any(parser *P);
static tpl_node *parse_expression(parser *P);
static tpl_node *parse_primary(parser *P);
static tpl_node *parse_member(parser *P, tpl_node *obj);
static tpl_node *parse_call(parser *P, tpl_node *callee);
static void parse_args(parser *P, bool params, nvec *out);

/* Statements until one of the end names; missing end → error naming it. */
static void parse_body(parser *P, const char *const *ends, nvec *body, const char *what) {
    while (!is_stmt(P, ends)) {
        if (is(P, TK_EOF))
            tpl_throw(P->a->base, DS_ERR_FORMAT, tok(P)->line, "missing {%% %s %%}", what);
        nvec_push(P, body, parse_any(P));
    }
}

static void expect_end(parser *P, const char *name) {
    expect(P, TK_OPEN_STMT, "'{%'");
    expect_ident(P, name);
    expect(P, TK_CLOSE_STMT, "'%}'");
}

static tpl_node *parse_sequence(parser *P, bool primary) {
    int line = tok(P)->line;
    tpl_node *first = primary ? parse_primary(P) : parse_expression(P);
    if (!is(P, TK_COMMA)) return first;
    nvec items = {0};
    nvec_push(P, &items, first);
    while (is(P, TK_COMMA)) {
        advance(P);
        nvec_push(P, &items, primary ? parse_primary(P) : parse_expression(P));
    }
    tpl_node *x = mk(P, TN_TUPLE, line);
    x->body = nlist(items);
    return fin(P, x);
}

static tpl_node *parse_set(parser *P, int line) {
    tpl_node *x = mk(P, TN_SET, line);
    x->a = parse_sequence(P, false);
    if (is(P, TK_EQUALS)) {
        advance(P);
        x->b = parse_sequence(P, false);
    } else {
        expect(P, TK_CLOSE_STMT, "'%}'");
        static const char *const ends[] = {"endset", NULL};
        nvec body = {0};
        parse_body(P, ends, &body, "endset");
        x->body = nlist(body);
        expect(P, TK_OPEN_STMT, "'{%'");
        expect_ident(P, "endset");
    }
    expect(P, TK_CLOSE_STMT, "'%}'");
    return fin(P, x);
}

static tpl_node *parse_if(parser *P, int line) {
    tpl_node *x = mk(P, TN_IF, line);
    x->a = parse_expression(P);
    expect(P, TK_CLOSE_STMT, "'%}'");
    static const char *const ends[] = {"elif", "else", "endif", NULL};
    nvec body = {0}, alt = {0};
    parse_body(P, ends, &body, "endif");
    static const char *const elif[] = {"elif", NULL}, *const els[] = {"else", NULL};
    if (is_stmt(P, elif)) {
        int l2 = tok(P)->line;
        advance(P);
        advance(P);
        enter(P);
        nvec_push(P, &alt, leave(P, parse_if(P, l2)));
    } else if (is_stmt(P, els)) {
        advance(P);
        advance(P);
        expect(P, TK_CLOSE_STMT, "'%}'");
        static const char *const endif[] = {"endif", NULL};
        parse_body(P, endif, &alt, "endif");
    }
    x->body = nlist(body);
    x->alt = nlist(alt);
    return fin(P, x);
}

/* Records which of caller / kwargs / varargs a macro or call-block body reads. */
static unsigned special_uses(const tpl_node *x) {
    if (!x) return 0;
    unsigned u = 0;
    if (x->kind == TN_IDENT) {
        if (x->n == 6 && !memcmp(x->s, "caller", 6)) u |= TPL_USES_CALLER;
        if (x->n == 6 && !memcmp(x->s, "kwargs", 6)) u |= TPL_USES_KWARGS;
        if (x->n == 7 && !memcmp(x->s, "varargs", 7)) u |= TPL_USES_VARARGS;
        return u;
    }
    /* a filter / test name or a non-computed member name is syntax, not a variable read */
    if (x->kind == TN_FILTER || x->kind == TN_FILTERBLOCK) {
        u |= special_uses(x->a);
        if (x->b && x->b->kind == TN_CALL)
            for (size_t i = 0; i < x->b->body.n; i++) u |= special_uses(x->b->body.v[i]);
        for (size_t i = 0; i < x->body.n; i++) u |= special_uses(x->body.v[i]);
        return u;
    }
    if (x->kind == TN_MEMBER && !x->flag) return special_uses(x->a);
    u |= special_uses(x->a) | special_uses(x->b) | special_uses(x->c);
    for (size_t i = 0; i < x->body.n; i++) u |= special_uses(x->body.v[i]);
    for (size_t i = 0; i < x->alt.n; i++) u |= special_uses(x->alt.v[i]);
    return u;
}

static unsigned body_uses(const tpl_nlist *params, const tpl_nlist *body) {
    unsigned u = 0;
    for (size_t i = 0; i < body->n; i++) u |= special_uses(body->v[i]);
    for (size_t i = 0; i < params->n; i++) {
        const tpl_node *p = params->v[i];
        const char *name = p->s;
        size_t n = p->n;
        if (n == 6 && !memcmp(name, "caller", 6)) u &= ~(unsigned)TPL_USES_CALLER;
        if (n == 6 && !memcmp(name, "kwargs", 6)) u &= ~(unsigned)TPL_USES_KWARGS;
        if (n == 7 && !memcmp(name, "varargs", 7)) u &= ~(unsigned)TPL_USES_VARARGS;
    }
    return u;
}

static tpl_node *parse_macro(parser *P, int line) {
    tpl_node *name = parse_primary(P);
    if (name->kind != TN_IDENT) perr(P, "expected a name after macro");
    tpl_node *x = mk(P, TN_MACRO, line);
    x->s = name->s;
    x->n = name->n;
    nvec params = {0}, body = {0};
    parse_args(P, true, &params);
    expect(P, TK_CLOSE_STMT, "'%}'");
    static const char *const ends[] = {"endmacro", NULL};
    parse_body(P, ends, &body, "endmacro");
    x->params = nlist(params);
    x->body = nlist(body);
    x->uses = body_uses(&x->params, &x->body);
    return fin(P, x);
}

static bool reads_name(const tpl_node *x, const char *name, size_t n) {
    if (!x) return false;
    if (x->kind == TN_IDENT) return x->n == n && !memcmp(x->s, name, n);
    if (reads_name(x->a, name, n) || reads_name(x->b, name, n) || reads_name(x->c, name, n)) return true;
    for (size_t i = 0; i < x->body.n; i++)
        if (reads_name(x->body.v[i], name, n)) return true;
    for (size_t i = 0; i < x->alt.n; i++)
        if (reads_name(x->alt.v[i], name, n)) return true;
    for (size_t i = 0; i < x->params.n; i++)
        if (reads_name(x->params.v[i], name, n)) return true;
    return false;
}

static tpl_node *parse_for(parser *P, int line) {
    tpl_node *x = mk(P, TN_FOR, line);
    x->a = parse_sequence(P, true);
    if (x->a->kind != TN_IDENT && x->a->kind != TN_TUPLE)
        perr(P, "expected a name or a tuple of names as the loop variable");
    if (!is_ident(P, "in")) perr(P, "expected 'in' after the loop variable");
    advance(P);
    tpl_node *it = parse_expression(P);
    if (it->kind == TN_SELECT) { /* for x in xs if cond */
        x->b = it->a;
        x->c = it->b;
    } else {
        x->b = it;
    }
    expect(P, TK_CLOSE_STMT, "'%}'");
    static const char *const ends[] = {"endfor", "else", NULL};
    nvec body = {0}, alt = {0};
    parse_body(P, ends, &body, "endfor");
    static const char *const els[] = {"else", NULL};
    if (is_stmt(P, els)) {
        advance(P);
        advance(P);
        expect(P, TK_CLOSE_STMT, "'%}'");
        static const char *const endfor[] = {"endfor", NULL};
        parse_body(P, endfor, &alt, "endfor");
    }
    x->body = nlist(body);
    x->alt = nlist(alt);
    x = fin(P, x);
    if (reads_name(x->c, "loop", 4)) x->uses |= TPL_USES_LOOP;
    for (size_t i = 0; i < x->body.n; i++)
        if (reads_name(x->body.v[i], "loop", 4)) x->uses |= TPL_USES_LOOP;
    return x;
}

static tpl_node *parse_statement(parser *P) {
    int line = tok(P)->line;
    expect(P, TK_OPEN_STMT, "'{%'");
    const tpl_token *t = tok(P);
    if (t->type != TK_IDENT) perr(P, "expected a statement name after {%");
    char name[32];
    size_t k = t->n < sizeof name - 1 ? t->n : sizeof name - 1;
    memcpy(name, t->s, k);
    name[k] = 0;
    advance(P);
    tpl_node *x;
    if (!strcmp(name, "set")) {
        x = parse_set(P, line);
    } else if (!strcmp(name, "if")) {
        x = parse_if(P, line);
        expect_end(P, "endif");
    } else if (!strcmp(name, "macro")) {
        x = parse_macro(P, line);
        expect_end(P, "endmacro");
    } else if (!strcmp(name, "for")) {
        x = parse_for(P, line);
        expect_end(P, "endfor");
    } else if (!strcmp(name, "call")) {
        x = mk(P, TN_CALLBLOCK, line);
        nvec params = {0}, body = {0};
        if (is(P, TK_LPAREN)) parse_args(P, true, &params);
        tpl_node *callee = parse_primary(P);
        if (callee->kind != TN_IDENT) perr(P, "expected a macro name after call");
        tpl_node *call = mk(P, TN_CALL, line);
        nvec args = {0};
        parse_args(P, false, &args);
        call->a = callee;
        call->body = nlist(args);
        x->a = fin(P, call);
        expect(P, TK_CLOSE_STMT, "'%}'");
        static const char *const ends[] = {"endcall", NULL};
        parse_body(P, ends, &body, "endcall");
        expect_end(P, "endcall");
        x->params = nlist(params);
        x->body = nlist(body);
        x->uses = body_uses(&x->params, &x->body);
        x = fin(P, x);
    } else if (!strcmp(name, "break") || !strcmp(name, "continue")) {
        expect(P, TK_CLOSE_STMT, "'%}'");
        x = mk(P, name[0] == 'b' ? TN_BREAK : TN_CONTINUE, line);
    } else if (!strcmp(name, "filter")) {
        x = mk(P, TN_FILTERBLOCK, line);
        tpl_node *f = parse_primary(P);
        if (f->kind == TN_IDENT && is(P, TK_LPAREN)) f = parse_call(P, f);
        if (f->kind != TN_IDENT && f->kind != TN_CALL) perr(P, "expected a filter name");
        expect(P, TK_CLOSE_STMT, "'%}'");
        nvec body = {0};
        static const char *const ends[] = {"endfilter", NULL};
        parse_body(P, ends, &body, "endfilter");
        expect_end(P, "endfilter");
        x->b = f;
        x->body = nlist(body);
        x = fin(P, x);
    } else {
        tpl_throw(P->a->base, DS_ERR_FORMAT, line, "unknown statement '%s'", name);
    }
    return x;
}

static tpl_node *parse_any_inner(parser *P);
static tpl_node *parse_any(parser *P) {
    enter(P);
    return leave(P, parse_any_inner(P));
}

static tpl_node *parse_any_inner(parser *P) {
    const tpl_token *t = tok(P);
    tpl_node *x;
    switch (t->type) {
    case TK_COMMENT:
        advance(P);
        return mk(P, TN_COMMENT, t->line);
    case TK_TEXT:
        x = mk(P, TN_TEXT, t->line);
        x->s = t->s;
        x->n = t->n;
        advance(P);
        return x;
    case TK_OPEN_STMT:
        return parse_statement(P);
    case TK_OPEN_EXPR:
        advance(P);
        x = parse_expression(P);
        expect(P, TK_CLOSE_EXPR, "'}}'");
        return x;
    default:
        tpl_throw(P->a->base, DS_ERR_FORMAT, t->line, "unexpected %s", tok_desc(t));
    }
}

/* ---- expressions ---------------------------------------------------------------------------- */

static tpl_node *parse_or(parser *P);

static tpl_node *parse_if_expr(parser *P) {
    tpl_node *a = parse_or(P);
    if (is_ident(P, "if")) {
        int line = tok(P)->line;
        advance(P);
        tpl_node *test = parse_or(P);
        if (is_ident(P, "else")) {
            advance(P);
            tpl_node *x = mk(P, TN_TERNARY, line);
            x->a = test;
            x->b = a;
            x->c = parse_if_expr(P);
            return fin(P, x);
        }
        tpl_node *x = mk(P, TN_SELECT, line);
        x->a = a;
        x->b = test;
        return fin(P, x);
    }
    return a;
}

static tpl_node *parse_expression(parser *P) {
    enter(P);
    return leave(P, parse_if_expr(P));
}

static tpl_node *parse_not(parser *P);
static tpl_node *parse_and(parser *P) {
    tpl_node *l = parse_not(P);
    while (is_ident(P, "and")) {
        int line = tok(P)->line;
        advance(P);
        l = bin(P, OP_AND, l, parse_not(P), line);
    }
    return l;
}

static tpl_node *parse_or(parser *P) {
    tpl_node *l = parse_and(P);
    while (is_ident(P, "or")) {
        int line = tok(P)->line;
        advance(P);
        l = bin(P, OP_OR, l, parse_and(P), line);
    }
    return l;
}

static tpl_node *parse_comparison(parser *P);
static tpl_node *parse_not(parser *P) {
    if (is_ident(P, "not")) {
        int line = tok(P)->line;
        advance(P);
        tpl_node *x = mk(P, TN_UNARY, line);
        x->op = OP_NOT;
        enter(P);
        x->a = leave(P, parse_not(P));
        return fin(P, x);
    }
    return parse_comparison(P);
}

static tpl_node *parse_additive(parser *P);
static tpl_node *parse_comparison(parser *P) {
    tpl_node *l = parse_additive(P);
    for (;;) {
        const tpl_token *t = tok(P);
        tpl_op op;
        if (tok_is_ident(t, "not") && tok_is_ident(tok_at(P, 1), "in")) {
            op = OP_NOTIN;
            advance(P);
            advance(P);
        } else if (tok_is_ident(t, "in")) {
            op = OP_IN;
            advance(P);
        } else if (t->type == TK_CMP) {
            op = t->s[0] == '=' ? OP_EQ : t->s[0] == '!' ? OP_NE
                 : t->s[0] == '<' ? (t->n == 2 ? OP_LE : OP_LT)
                                  : (t->n == 2 ? OP_GE : OP_GT);
            advance(P);
        } else {
            break;
        }
        l = bin(P, op, l, parse_additive(P), t->line);
    }
    return l;
}

static tpl_node *parse_multiplicative(parser *P);
static tpl_node *parse_additive(parser *P) {
    tpl_node *l = parse_multiplicative(P);
    while (is(P, TK_ADD)) {
        const tpl_token *t = tok(P);
        advance(P);
        tpl_op op = t->s[0] == '+' ? OP_ADD : t->s[0] == '-' ? OP_SUB : OP_CONCAT;
        l = bin(P, op, l, parse_multiplicative(P), t->line);
    }
    return l;
}

static tpl_node *parse_power(parser *P);
static tpl_node *parse_multiplicative(parser *P) {
    tpl_node *l = parse_power(P);
    while (is(P, TK_MUL)) {
        const tpl_token *t = tok(P);
        advance(P);
        tpl_op op = t->s[0] == '*' ? OP_MUL : t->s[0] == '%' ? OP_MOD
                    : t->n == 2 ? OP_FLOORDIV : OP_DIV;
        l = bin(P, op, l, parse_power(P), t->line);
    }
    return l;
}

static tpl_node *parse_test(parser *P);
static tpl_node *parse_power(parser *P) {
    tpl_node *l = parse_test(P);
    while (is(P, TK_POW)) {
        int line = tok(P)->line;
        advance(P);
        l = bin(P, OP_POW, l, parse_test(P), line);
    }
    return l;
}

static tpl_node *parse_filter(parser *P);
static tpl_node *parse_unary(parser *P);

/* Can the token start a test's single bare argument (`x is divisibleby 3`)? As Jinja2. */
static bool starts_test_arg(parser *P) {
    const tpl_token *t = tok(P);
    if (t->type == TK_IDENT)
        return !tok_is_ident(t, "else") && !tok_is_ident(t, "or") && !tok_is_ident(t, "and") &&
               !tok_is_ident(t, "if") && !tok_is_ident(t, "is") && !tok_is_ident(t, "not") &&
               !tok_is_ident(t, "in");
    return t->type == TK_STR || t->type == TK_NUM || t->type == TK_LBRACKET || t->type == TK_LBRACE;
}

static tpl_node *parse_test(parser *P) {
    tpl_node *operand = parse_filter(P);
    while (is_ident(P, "is")) {
        int line = tok(P)->line;
        advance(P);
        bool neg = is_ident(P, "not");
        if (neg) advance(P);
        const tpl_token *name = tok(P);
        /* `in` and the comparison names arrive as identifiers too */
        if (name->type != TK_IDENT) perr(P, "expected a test name after 'is'");
        advance(P);
        tpl_node *x = mk(P, TN_TEST, line);
        x->s = name->s;
        x->n = name->n;
        x->flag = neg;
        x->a = operand;
        nvec args = {0};
        if (is(P, TK_LPAREN)) {
            parse_args(P, false, &args);
        } else if (starts_test_arg(P)) {
            nvec_push(P, &args, parse_member(P, parse_primary(P)));
        }
        x->body = nlist(args);
        operand = fin(P, x);
    }
    return operand;
}

static tpl_node *parse_filter(parser *P) {
    tpl_node *operand = parse_unary(P);
    while (is(P, TK_PIPE)) {
        int line = tok(P)->line;
        advance(P);
        tpl_node *f = parse_primary(P);
        if (f->kind != TN_IDENT) perr(P, "expected a filter name after '|'");
        if (is(P, TK_LPAREN)) f = parse_call(P, f);
        tpl_node *x = mk(P, TN_FILTER, line);
        x->a = operand;
        x->b = f;
        operand = fin(P, x);
    }
    return operand;
}

static tpl_node *parse_unary(parser *P) {
    const tpl_token *t = tok(P);
    if ((t->type == TK_UNARY || t->type == TK_ADD) && (t->s[0] == '-' || t->s[0] == '+') &&
        t->n == 1) {
        advance(P);
        tpl_node *x = mk(P, TN_UNARY, t->line);
        x->op = t->s[0] == '-' ? OP_SUB : OP_ADD;
        enter(P);
        x->a = leave(P, parse_unary(P));
        return fin(P, x);
    }
    tpl_node *m = parse_member(P, parse_primary(P));
    if (is(P, TK_LPAREN)) return parse_call(P, m);
    return m;
}

static tpl_node *parse_call(parser *P, tpl_node *callee) {
    tpl_node *x = mk(P, TN_CALL, tok(P)->line);
    nvec args = {0};
    parse_args(P, false, &args);
    x->a = callee;
    x->body = nlist(args);
    tpl_node *e = parse_member(P, fin(P, x));
    if (is(P, TK_LPAREN)) e = parse_call(P, e);
    return e;
}

/* (a, b=1, *xs, **kw) — params: declarations (names with optional defaults) */
static void parse_args(parser *P, bool params, nvec *out) {
    expect(P, TK_LPAREN, "'('");
    bool saw_kw = false, saw_spread = false;
    while (!is(P, TK_RPAREN)) {
        if (is(P, TK_EOF)) perr(P, "missing ')'");
        const tpl_token *t = tok(P);
        bool kwspread = t->type == TK_POW;
        bool spread = t->type == TK_MUL && t->n == 1 && t->s[0] == '*';
        if (params && (kwspread || spread))
            perr(P, "argument unpacking is not allowed in parameter declarations");
        if (kwspread) {
            advance(P);
            tpl_node *x = mk(P, TN_KWSPREAD, t->line);
            x->a = parse_expression(P);
            nvec_push(P, out, fin(P, x));
            if (is(P, TK_COMMA)) advance(P);
            if (!is(P, TK_RPAREN)) perr(P, "'**' must be applied to the final argument");
            break;
        }
        tpl_node *arg;
        if (spread) {
            if (saw_spread) perr(P, "only one '*' argument unpacking is allowed");
            saw_spread = true;
            advance(P);
            arg = mk(P, TN_SPREAD, t->line);
            arg->a = parse_expression(P);
            arg = fin(P, arg);
        } else {
            arg = parse_expression(P);
            if (is(P, TK_EQUALS)) {
                advance(P);
                if (arg->kind != TN_IDENT)
                    perr(P, params ? "expected a parameter name" : "expected a keyword name");
                tpl_node *kw = mk(P, TN_KWARG, arg->line);
                kw->s = arg->s;
                kw->n = arg->n;
                kw->a = parse_expression(P);
                arg = fin(P, kw);
            }
            if (params) {
                if (arg->kind != TN_IDENT && arg->kind != TN_KWARG)
                    perr(P, "expected a parameter name");
                for (size_t i = 0; i < out->n; i++)
                    if (out->v[i]->n == arg->n && !memcmp(out->v[i]->s, arg->s, arg->n))
                        perr(P, "duplicate parameter name");
            }
            if (arg->kind == TN_KWARG)
                saw_kw = true;
            else if (saw_kw)
                perr(P, params ? "non-default parameter follows a default one"
                               : "positional argument follows keyword argument");
            else if (saw_spread)
                perr(P, "positional argument follows '*' unpacking");
        }
        nvec_push(P, out, arg);
        if (is(P, TK_COMMA)) advance(P);
    }
    expect(P, TK_RPAREN, "')'");
}

/* [a], [a:b:c], [:b] ... */
static tpl_node *parse_subscript(parser *P) {
    tpl_node *parts[3] = {0};
    size_t n = 0;
    bool is_slice = false;
    int line = tok(P)->line;
    while (!is(P, TK_RBRACKET)) {
        if (is(P, TK_EOF)) perr(P, "missing ']'");
        if (n == 3) perr(P, "a slice takes at most 3 parts");
        if (is(P, TK_COLON)) {
            parts[n++] = NULL;
            advance(P);
            is_slice = true;
        } else {
            parts[n++] = parse_expression(P);
            if (is(P, TK_COLON)) {
                advance(P);
                is_slice = true;
            }
        }
    }
    if (n == 0) perr(P, "expected an index inside []");
    if (!is_slice) return parts[0];
    tpl_node *x = mk(P, TN_SLICE, line);
    x->a = parts[0];
    x->b = n > 1 ? parts[1] : NULL;
    x->c = n > 2 ? parts[2] : NULL;
    return fin(P, x);
}

static tpl_node *parse_member(parser *P, tpl_node *obj) {
    while (is(P, TK_DOT) || is(P, TK_LBRACKET)) {
        bool computed = is(P, TK_LBRACKET);
        int line = tok(P)->line;
        advance(P);
        tpl_node *prop;
        if (computed) {
            prop = parse_subscript(P);
            expect(P, TK_RBRACKET, "']'");
        } else {
            prop = parse_primary(P);
            if (prop->kind != TN_IDENT && prop->kind != TN_INT)
                perr(P, "expected a name or an integer after '.'");
        }
        tpl_node *x = mk(P, TN_MEMBER, line);
        x->a = obj;
        x->b = prop;
        x->flag = computed;
        obj = fin(P, x);
    }
    return obj;
}

static tpl_node *parse_primary(parser *P) {
    const tpl_token *t = tok(P);
    advance(P);
    tpl_node *x;
    switch (t->type) {
    case TK_NUM: {
        bool is_float = memchr(t->s, '.', t->n) != NULL;
        x = mk(P, is_float ? TN_FLOAT : TN_INT, t->line);
        x->num = strtod(tpl_strndup(P->a, t->s, t->n), NULL);
        x->lit = tpl_alloc(P->a, sizeof(tpl_value));
        x->lit->type = is_float ? TV_FLOAT : TV_INT;
        x->lit->u.num = x->num;
        return x;
    }
    case TK_STR: {
        x = mk(P, TN_STR, t->line);
        x->lit = tpl_alloc(P->a, sizeof(tpl_value));
        x->lit->type = TV_STRING;
        if (!is(P, TK_STR)) {
            x->s = t->s;
            x->n = t->n;
            x->lit->u.str.s = x->s;
            x->lit->u.str.n = x->n;
            return x;
        }
        tpl_buf b;
        tpl_buf_init(&b, P->a, 0);
        tpl_buf_put(&b, t->s, t->n);
        while (is(P, TK_STR)) {
            tpl_buf_put(&b, tok(P)->s, tok(P)->n);
            advance(P);
        }
        x->s = b.p ? b.p : "";
        x->n = b.n;
        x->lit->u.str.s = x->s;
        x->lit->u.str.n = x->n;
        return x;
    }
    case TK_IDENT:
        x = mk(P, TN_IDENT, t->line);
        x->s = t->s;
        x->n = t->n;
        return x;
    case TK_LPAREN:
        x = parse_sequence(P, false);
        expect(P, TK_RPAREN, "')'");
        return x;
    case TK_LBRACKET: {
        nvec items = {0};
        while (!is(P, TK_RBRACKET)) {
            if (is(P, TK_EOF)) perr(P, "missing ']'");
            nvec_push(P, &items, parse_expression(P));
            if (is(P, TK_COMMA)) advance(P);
        }
        advance(P);
        x = mk(P, TN_ARRAY, t->line);
        x->body = nlist(items);
        return fin(P, x);
    }
    case TK_LBRACE: {
        nvec keys = {0}, vals = {0};
        while (!is(P, TK_RBRACE)) {
            if (is(P, TK_EOF)) perr(P, "missing '}'");
            nvec_push(P, &keys, parse_expression(P));
            expect(P, TK_COLON, "':'");
            nvec_push(P, &vals, parse_expression(P));
            if (is(P, TK_COMMA)) advance(P);
        }
        advance(P);
        x = mk(P, TN_OBJECT, t->line);
        x->body = nlist(keys);
        x->alt = nlist(vals);
        return fin(P, x);
    }
    default:
        tpl_throw(P->a->base, DS_ERR_FORMAT, t->line, "unexpected %s", tok_desc(t));
    }
}

void tpl_parse(tpl_arena *a, const tpl_token *toks, size_t n_toks, tpl_nlist *program) {
    parser P = {.a = a, .t = toks, .n = n_toks, .cur = 0};
    nvec body = {0};
    while (!is(&P, TK_EOF)) nvec_push(&P, &body, parse_any(&P));
    *program = nlist(body);
}
