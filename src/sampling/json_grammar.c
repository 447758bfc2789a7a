#include "sampling/json_grammar.h"

#include <stdlib.h>

#include "core/status.h"
#include "sampling/json_automaton.h"

enum {
    L_START,     /* before the top-level object: whitespace or '{' */
    L_VALUE,     /* a value (after ':' or an array's ',') */
    L_ARR_FIRST, /* after '[': a value or ']' */
    L_OBJ_FIRST, /* after '{': a key or '}' */
    L_OBJ_KEY,   /* after an object's ',': a key */
    L_COLON,     /* after a key */
    L_AFTER,     /* after a value inside a container: ',' or its closer */
    L_STR,       /* inside a string */
    L_ESC,       /* after '\\' in a string */
    L_HEX,       /* in \uXXXX: aux hex digits left */
    L_MINUS,     /* number: after '-' */
    L_ZERO,      /* number: a leading 0 */
    L_INT,       /* number: integer digits */
    L_DOT,       /* number: after '.' */
    L_FRAC,      /* number: fraction digits */
    L_E,         /* number: after 'e' */
    L_ESIGN,     /* number: after the exponent's sign */
    L_EXP,       /* number: exponent digits */
    L_LIT,       /* true / false / null: aux = literal · 8 + bytes read */
    L_DONE,      /* the top-level object is closed */
};

#define F_KEY 1u /* the string being read is an object key */
#define F_NL 2u  /* the whitespace run began with a newline (indentation may follow) */

static const char *const LITERALS[3] = {"true", "false", "null"};
static const uint8_t LITERAL_LEN[3] = {4, 5, 4};

void ds_json_init(ds_json_state *s) { *s = (ds_json_state){.lex = L_START}; }

bool ds_json_done(const ds_json_state *s) { return s->lex == L_DONE; }

bool ds_json_in_string(const ds_json_state *s) { return s->lex == L_STR; }

/* One whitespace byte between tokens (json_automaton.h's rule; the run's '\n' start is a bit
 * of flags here). */
static bool whitespace(ds_json_state *s, uint8_t c) {
    bool nl = s->flags & F_NL;
    if (!json_ws_run(&s->ws, &nl, c)) return false;
    s->flags = (uint8_t)(nl ? s->flags | F_NL : s->flags & ~F_NL);
    return true;
}
static bool top_is_array(const ds_json_state *s) {
    return s->depth > 0 && ((s->arrays >> (s->depth - 1)) & 1u);
}

static bool push(ds_json_state *s, bool array) {
    if (s->depth >= DS_JSON_MAX_DEPTH) return false;
    const uint64_t bit = 1ull << s->depth;
    s->arrays = array ? s->arrays | bit : s->arrays & ~bit;
    s->depth++;
    s->lex = array ? L_ARR_FIRST : L_OBJ_FIRST;
    return true;
}

/* A value just ended: the container goes on, or the document is complete. */
static void value_done(ds_json_state *s) { s->lex = s->depth == 0 ? L_DONE : L_AFTER; }

static bool pop(ds_json_state *s, bool array) {
    if (s->depth == 0 || top_is_array(s) != array) return false;
    s->depth--;
    value_done(s);
    return true;
}

/* The first byte of a value (whitespace handled by the caller). */
static bool value_start(ds_json_state *s, uint8_t c) {
    switch (c) {
    case '{': return push(s, false);
    case '[': return push(s, true);
    case '"': s->lex = L_STR; s->flags &= (uint8_t)~F_KEY; return true;
    case '-': s->lex = L_MINUS; return true;
    case '0': s->lex = L_ZERO; return true;
    case 't': s->lex = L_LIT; s->aux = 0 * 8 + 1; return true;
    case 'f': s->lex = L_LIT; s->aux = 1 * 8 + 1; return true;
    case 'n': s->lex = L_LIT; s->aux = 2 * 8 + 1; return true;
    default:
        if (c >= '1' && c <= '9') {
            s->lex = L_INT;
            return true;
        }
        return false;
    }
}

static bool after_value(ds_json_state *s, uint8_t c) {
    if (c == ',') {
        s->lex = top_is_array(s) ? L_VALUE : L_OBJ_KEY;
        return true;
    }
    if (c == ']') return pop(s, true);
    if (c == '}') return pop(s, false);
    return false;
}

static bool step(ds_json_state *s, uint8_t c);

/* A number ended before c: c must continue after the value. */
static bool end_number(ds_json_state *s, uint8_t c) {
    value_done(s);
    return s->lex != L_DONE && step(s, c); /* (numbers only appear inside containers) */
}

/* One byte on s in place (the caller restores s on failure). */
static bool step(ds_json_state *s, uint8_t c) {
    const uint8_t lex = s->lex;
    const bool between = lex <= L_AFTER; /* states where whitespace may come */
    if (between && json_is_ws(c)) return whitespace(s, c);
    if (between) s->ws = 0;
    switch (lex) {
    case L_START: return c == '{' && push(s, false);
    case L_VALUE: return value_start(s, c);
    case L_ARR_FIRST: return c == ']' ? pop(s, true) : value_start(s, c);
    case L_OBJ_FIRST:
        if (c == '}') return pop(s, false);
        /* fall through */
    case L_OBJ_KEY:
        if (c != '"') return false;
        s->lex = L_STR;
        s->flags |= F_KEY;
        return true;
    case L_COLON:
        if (c != ':') return false;
        s->lex = L_VALUE;
        return true;
    case L_AFTER: return after_value(s, c);
    case L_STR:
        if (c == '"') {
            if (s->flags & F_KEY) s->lex = L_COLON;
            else value_done(s);
            return true;
        }
        if (c == '\\') {
            s->lex = L_ESC;
            return true;
        }
        return c >= 0x20;
    case L_ESC:
        if (c == 'u') {
            s->lex = L_HEX;
            s->aux = 4;
            return true;
        }
        if (c == '"' || c == '\\' || c == '/' || c == 'b' || c == 'f' || c == 'n' || c == 'r' ||
            c == 't') {
            s->lex = L_STR;
            return true;
        }
        return false;
    case L_HEX:
        if (!json_is_hex(c)) return false;
        if (--s->aux == 0) s->lex = L_STR;
        return true;
    case L_MINUS:
        if (c == '0') s->lex = L_ZERO;
        else if (c >= '1' && c <= '9') s->lex = L_INT;
        else return false;
        return true;
    case L_ZERO:
    case L_INT:
        if (lex == L_INT && json_is_digit(c)) return true;
        if (c == '.') s->lex = L_DOT;
        else if (c == 'e' || c == 'E') s->lex = L_E;
        else return end_number(s, c);
        return true;
    case L_DOT:
        if (!json_is_digit(c)) return false;
        s->lex = L_FRAC;
        return true;
    case L_FRAC:
        if (json_is_digit(c)) return true;
        if (c == 'e' || c == 'E') {
            s->lex = L_E;
            return true;
        }
        return end_number(s, c);
    case L_E:
        if (c == '+' || c == '-') s->lex = L_ESIGN;
        else if (json_is_digit(c)) s->lex = L_EXP;
        else return false;
        return true;
    case L_ESIGN:
        if (!json_is_digit(c)) return false;
        s->lex = L_EXP;
        return true;
    case L_EXP: return json_is_digit(c) ? true : end_number(s, c);
    case L_LIT: {
        const int lit = s->aux / 8, pos = s->aux % 8;
        if (c != (uint8_t)LITERALS[lit][pos]) return false;
        if (pos + 1 == LITERAL_LEN[lit]) value_done(s);
        else s->aux++;
        return true;
    }
    default: return false; /* L_DONE: nothing more */
    }
}

bool ds_json_feed(ds_json_state *s, uint8_t c) {
    ds_json_state t = *s;
    if (!step(&t, c)) return false;
    *s = t;
    return true;
}

bool ds_json_feed_bytes(ds_json_state *s, const uint8_t *b, size_t n) {
    ds_json_state t = *s;
    for (size_t i = 0; i < n; i++)
        if (!step(&t, b[i])) return false;
    *s = t;
    return true;
}

bool ds_json_vocab_index(ds_json_vocab *v) {
    free(v->plain);
    free(v->head);
    v->plain = calloc((size_t)(v->n > 0 ? v->n : 1), 1);
    v->head = calloc((size_t)(v->n > 0 ? v->n : 1), sizeof *v->head);
    if (!v->plain || !v->head) return false;
    for (int id = 0; id < v->n; id++) {
        if (!v->bytes[id]) continue;
        v->head[id] = (uint16_t)(v->bytes[id][0] | (v->len[id] > 1 ? v->bytes[id][1] << 8 : 0));
        bool plain = true;
        for (uint32_t i = 0; i < v->len[id] && plain; i++) {
            const uint8_t b = v->bytes[id][i];
            plain = b >= 0x20 && b != '"' && b != '\\';
        }
        v->plain[id] = plain;
    }
    return true;
}

void ds_json_vocab_free(ds_json_vocab *v) {
    free(v->bytes);
    free(v->len);
    free(v->plain);
    free(v->head);
    *v = (ds_json_vocab){0};
}

static bool step_fn(void *state, const void *ctx, uint8_t c) {
    (void)ctx;
    return step((ds_json_state *)state, c);
}

void ds_json_mask(const ds_json_state *s, const ds_json_vocab *v, const int *end_ids, int n_end,
                  float *logits, int n_logits) {
    json_mask_run(s, sizeof *s, step_fn, NULL, ds_json_done(s), s->lex == L_STR, v, end_ids, n_end,
                  logits, n_logits);
}

bool ds_json_feed_token(ds_json_state *s, const ds_json_vocab *v, int id) {
    if (id < 0 || id >= v->n || !v->bytes[id]) return false;
    return ds_json_feed_bytes(s, v->bytes[id], v->len[id]);
}
