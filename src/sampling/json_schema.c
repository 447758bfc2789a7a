/* json_schema.c — the pushdown automaton of a compiled schema (json_schema.h) and its token
 * mask. Each open value is a frame; a frame's kind says what kind of value it is (or F_VALUE:
 * not started, its node decides on the first byte), its phase where inside it the next byte
 * falls. Numbers and literals end on the byte after them: that byte is fed again to the frame
 * below (R_REFEED). */
#include "sampling/json_schema.h"

#include <string.h>

#include "sampling/json_automaton.h"
#include "sampling/json_schema_internal.h"

enum { F_VALUE, F_OBJ, F_ARR, F_STR, F_NUM, F_LIT, F_FREE };
enum { O_FIRST, O_KEY, O_COLON, O_AFTER, O_NEXT };   /* after '{' / in a key / before ':' /
                                                        after a value / after ',' */
enum { A_FIRST, A_AFTER, A_NEXT };                   /* after '[' / after a value / after ',' */
enum { S_IN, S_ESC, S_HEX };                         /* string body / after '\\' / in \uXXXX */
enum { N_MINUS, N_ZERO, N_INT, N_DOT, N_FRAC, N_E, N_ESIGN, N_EXP };

typedef enum { R_FAIL, R_OK, R_REFEED } step_result;

/* One whitespace byte between tokens (JSON mode's rule, json_automaton.h). */
static step_result whitespace(ds_js_state *st, uint8_t c) {
    bool nl = st->nl;
    if (!json_ws_run(&st->ws, &nl, c)) return R_FAIL;
    st->nl = nl;
    return R_OK;
}

static bool push(ds_js_state *st, int node) {
    if (st->depth >= DS_JS_MAX_DEPTH) return false;
    st->f[st->depth++] = (ds_js_frame){.node = (uint16_t)node, .kind = F_VALUE};
    return true;
}

/* The top value is complete: its container goes on, or the document is. */
static void pop(ds_js_state *st) {
    st->depth--;
    if (st->depth == 0) {
        st->done = 1;
        return;
    }
    ds_js_frame *p = &st->f[st->depth - 1];
    p->phase = p->kind == F_OBJ ? O_AFTER : A_AFTER;
}

/* Properties that may come next in an object from property idx on: every one up to and
 * including the first required one. */
static uint64_t key_candidates(const ds_json_schema *s, const js_node *n, int idx) {
    uint64_t m = 0;
    for (int j = idx; j < n->n; j++) {
        m |= 1ull << j;
        if (s->props[n->first + j].required) break;
    }
    return m;
}

static bool may_close(const ds_json_schema *s, const js_node *n, int idx) {
    for (int j = idx; j < n->n; j++)
        if (s->props[n->first + j].required) return false;
    return true;
}

/* The first byte of the value of the top frame (F_VALUE). */
static step_result value_start(ds_js_state *st, const ds_json_schema *s, uint8_t c) {
    ds_js_frame *f = &st->f[st->depth - 1];
    for (int hops = 0; hops <= s->n_nodes; hops++) {
        const js_node *n = &s->nodes[f->node];
        if (!js_starts(n, c)) return R_FAIL;
        switch (n->kind) {
        case JS_UNION: { /* the one alternative that starts with c (compile-time disjoint) */
            int pick = -1;
            for (int a = 0; a < n->n && pick < 0; a++)
                if (js_starts(&s->nodes[s->alts[n->first + a]], c)) pick = s->alts[n->first + a];
            if (pick < 0) return R_FAIL;
            f->node = (uint16_t)pick;
            continue;
        }
        case JS_OBJECT: *f = (ds_js_frame){.node = f->node, .kind = F_OBJ, .phase = O_FIRST}; return R_OK;
        case JS_FREE_OBJECT:
            f->kind = F_FREE;
            ds_json_init(&st->free);
            return ds_json_feed(&st->free, c) ? R_OK : R_FAIL;
        case JS_ARRAY: f->kind = F_ARR, f->phase = A_FIRST; return R_OK;
        case JS_STRING: f->kind = F_STR, f->phase = S_IN; return R_OK;
        case JS_NUMBER:
        case JS_INTEGER:
            f->kind = F_NUM;
            f->phase = c == '-' ? N_MINUS : c == '0' ? N_ZERO : N_INT;
            return R_OK;
        case JS_LITERALS: {
            uint64_t alive = 0;
            bool longer = false;
            for (int l = 0; l < n->n; l++) {
                const js_lit *L = &s->lits[n->first + l];
                if (L->len > 0 && (uint8_t)L->text[0] == c) {
                    alive |= 1ull << l;
                    longer |= L->len > 1;
                }
            }
            if (!alive) return R_FAIL;
            f->kind = F_LIT, f->alive = alive, f->pos = 1;
            if (!longer) pop(st);
            return R_OK;
        }
        default: return R_FAIL;
        }
    }
    return R_FAIL; /* (a union cycle: rejected at compile time) */
}

static step_result step_object(ds_js_state *st, const ds_json_schema *s, uint8_t c) {
    ds_js_frame *f = &st->f[st->depth - 1];
    const js_node *n = &s->nodes[f->node];
    switch (f->phase) {
    case O_FIRST:
    case O_NEXT:
    case O_AFTER:
    case O_COLON:
        if (json_is_ws(c)) return whitespace(st, c);
        break;
    default: break;
    }
    switch (f->phase) {
    case O_FIRST:
        if (c == '}') {
            if (!may_close(s, n, f->idx)) return R_FAIL;
            pop(st);
            return R_OK;
        }
        /* a key, as after ',' */
        /* fall through */
    case O_NEXT: {
        if (c != '"') return R_FAIL;
        const uint64_t cand = key_candidates(s, n, f->idx);
        if (!cand) return R_FAIL;
        f->phase = O_KEY, f->alive = cand, f->pos = 1;
        return R_OK;
    }
    case O_KEY: {
        uint64_t alive = 0;
        int done_j = -1;
        for (int j = 0; j < n->n; j++) {
            if (!((f->alive >> j) & 1u)) continue;
            const js_prop *p = &s->props[n->first + j];
            if (f->pos < p->key_len && (uint8_t)p->key[f->pos] == c) {
                alive |= 1ull << j;
                if (p->key_len == f->pos + 1) done_j = j; /* its closing quote: one key at most */
            }
        }
        if (!alive) return R_FAIL;
        if (done_j >= 0) {
            f->phase = O_COLON, f->pos = (uint16_t)done_j, f->idx = (uint16_t)(done_j + 1), f->alive = 0;
            return R_OK;
        }
        f->alive = alive, f->pos++;
        return R_OK;
    }
    case O_COLON: {
        if (c != ':') return R_FAIL;
        const int child = s->props[n->first + f->pos].node;
        f->phase = O_AFTER;
        return push(st, child) ? R_OK : R_FAIL;
    }
    case O_AFTER:
        if (c == ',') {
            if (!key_candidates(s, n, f->idx)) return R_FAIL;
            f->phase = O_NEXT;
            return R_OK;
        }
        if (c == '}' && may_close(s, n, f->idx)) {
            pop(st);
            return R_OK;
        }
        return R_FAIL;
    default: return R_FAIL;
    }
}

static step_result step_array(ds_js_state *st, const ds_json_schema *s, uint8_t c) {
    ds_js_frame *f = &st->f[st->depth - 1];
    if (json_is_ws(c)) return whitespace(st, c);
    switch (f->phase) {
    case A_FIRST:
        if (c == ']') {
            pop(st);
            return R_OK;
        }
        /* the first item, as after ',' */
        /* fall through */
    case A_NEXT:
        f->phase = A_AFTER;
        return push(st, s->nodes[f->node].item) ? R_REFEED : R_FAIL;
    case A_AFTER:
        if (c == ',') {
            f->phase = A_NEXT;
            return R_OK;
        }
        if (c == ']') {
            pop(st);
            return R_OK;
        }
        return R_FAIL;
    default: return R_FAIL;
    }
}

static step_result step_string(ds_js_state *st, uint8_t c) {
    ds_js_frame *f = &st->f[st->depth - 1];
    switch (f->phase) {
    case S_IN:
        if (c == '"') {
            pop(st);
            return R_OK;
        }
        if (c == '\\') {
            f->phase = S_ESC;
            return R_OK;
        }
        return c >= 0x20 ? R_OK : R_FAIL;
    case S_ESC:
        if (c == 'u') {
            f->phase = S_HEX, f->pos = 4;
            return R_OK;
        }
        if (!strchr("\"\\/bfnrt", c) || c == 0) return R_FAIL;
        f->phase = S_IN;
        return R_OK;
    case S_HEX:
        if (!json_is_hex(c)) return R_FAIL;
        if (--f->pos == 0) f->phase = S_IN;
        return R_OK;
    default: return R_FAIL;
    }
}

/* JSON's number grammar; an integer schema stops before '.' / 'e'. A byte that cannot continue
 * a complete number ends it and goes to the frame below. */
static step_result step_number(ds_js_state *st, const ds_json_schema *s, uint8_t c) {
    ds_js_frame *f = &st->f[st->depth - 1];
    const bool integer = s->nodes[f->node].kind == JS_INTEGER;
    switch (f->phase) {
    case N_MINUS:
        if (c == '0') f->phase = N_ZERO;
        else if (json_is_digit(c)) f->phase = N_INT;
        else return R_FAIL;
        return R_OK;
    case N_ZERO:
    case N_INT:
    case N_FRAC:
        if (json_is_digit(c) && f->phase != N_ZERO) return R_OK;
        if (c == '.' && f->phase != N_FRAC && !integer) {
            f->phase = N_DOT;
            return R_OK;
        }
        if ((c == 'e' || c == 'E') && !integer) {
            f->phase = N_E;
            return R_OK;
        }
        pop(st);
        return R_REFEED;
    case N_DOT:
        if (!json_is_digit(c)) return R_FAIL;
        f->phase = N_FRAC;
        return R_OK;
    case N_E:
        if (c == '+' || c == '-') f->phase = N_ESIGN;
        else if (json_is_digit(c)) f->phase = N_EXP;
        else return R_FAIL;
        return R_OK;
    case N_ESIGN:
        if (!json_is_digit(c)) return R_FAIL;
        f->phase = N_EXP;
        return R_OK;
    case N_EXP:
        if (json_is_digit(c)) return R_OK;
        pop(st);
        return R_REFEED;
    default: return R_FAIL;
    }
}

/* enum / const / true / false / null: the values still matching their first pos bytes. */
static step_result step_literal(ds_js_state *st, const ds_json_schema *s, uint8_t c) {
    ds_js_frame *f = &st->f[st->depth - 1];
    const js_node *n = &s->nodes[f->node];
    uint64_t alive = 0;
    bool ended = false, longer = false;
    for (int l = 0; l < n->n; l++) {
        if (!((f->alive >> l) & 1u)) continue;
        const js_lit *L = &s->lits[n->first + l];
        if (L->len == f->pos) ended = true;
        else if ((uint8_t)L->text[f->pos] == c) {
            alive |= 1ull << l;
            longer |= L->len > f->pos + 1;
        }
    }
    if (alive) {
        f->alive = alive, f->pos++;
        if (!longer) pop(st);
        return R_OK;
    }
    if (!ended) return R_FAIL;
    pop(st); /* a value that is a prefix of another ended here */
    return R_REFEED;
}

static bool step(ds_js_state *st, const ds_json_schema *s, uint8_t c) {
    for (;;) {
        if (st->done || st->depth == 0) return false;
        ds_js_frame *f = &st->f[st->depth - 1];
        step_result r;
        switch (f->kind) {
        case F_VALUE: r = json_is_ws(c) ? whitespace(st, c) : value_start(st, s, c); break;
        case F_OBJ: r = step_object(st, s, c); break;
        case F_ARR: r = step_array(st, s, c); break;
        case F_STR: r = step_string(st, c); break;
        case F_NUM: r = step_number(st, s, c); break;
        case F_LIT: r = step_literal(st, s, c); break;
        case F_FREE:
            r = ds_json_feed(&st->free, c) ? R_OK : R_FAIL;
            if (r == R_OK && ds_json_done(&st->free)) pop(st);
            break;
        default: return false;
        }
        if (r == R_FAIL) return false;
        if (r == R_REFEED) continue;
        /* structural whitespace counted its run in whitespace(); anything else ends a run
         * (bytes inside strings and free objects included: they are not between tokens) */
        if (!json_is_ws(c) || (f->kind != F_VALUE && f->kind != F_OBJ && f->kind != F_ARR)) st->ws = 0, st->nl = 0;
        return true;
    }
}

void ds_js_init(ds_js_state *st, const ds_json_schema *s) {
    memset(st, 0, sizeof *st);
    st->depth = 1;
    st->f[0] = (ds_js_frame){.node = (uint16_t)s->root, .kind = F_VALUE};
}

bool ds_js_done(const ds_js_state *st) { return st->done; }

bool ds_js_feed(ds_js_state *st, const ds_json_schema *s, uint8_t c) {
    ds_js_state t = *st;
    if (!step(&t, s, c)) return false;
    *st = t;
    return true;
}

bool ds_js_feed_bytes(ds_js_state *st, const ds_json_schema *s, const uint8_t *b, size_t n) {
    ds_js_state t = *st;
    for (size_t i = 0; i < n; i++)
        if (!step(&t, s, b[i])) return false;
    *st = t;
    return true;
}

bool ds_js_feed_token(ds_js_state *st, const ds_json_schema *s, const ds_json_vocab *v, int id) {
    if (id < 0 || id >= v->n || !v->bytes[id]) return false;
    return ds_js_feed_bytes(st, s, v->bytes[id], v->len[id]);
}

static bool step_fn(void *state, const void *ctx, uint8_t c) {
    return step((ds_js_state *)state, (const ds_json_schema *)ctx, c);
}

void ds_js_mask(const ds_js_state *st, const ds_json_schema *s, const ds_json_vocab *v,
                const int *end_ids, int n_end, float *logits, int n_logits) {
    _Static_assert(sizeof *st <= JSON_MASK_MAX_STATE, "json_mask_run copies the state");
    /* inside a free string (of a string schema, or anywhere in a free object) every plain
     * token stays inside it */
    const ds_js_frame *top = st->depth ? &st->f[st->depth - 1] : NULL;
    const bool in_string = !st->done && top &&
                           ((top->kind == F_STR && top->phase == S_IN) ||
                            (top->kind == F_FREE && ds_json_in_string(&st->free)));
    json_mask_run(st, sizeof *st, step_fn, s, ds_js_done(st), in_string, v, end_ids, n_end, logits,
                  n_logits);
}
