/* Jinja lexer: the reference renderer's preprocessing (drop one trailing newline, lstrip_blocks,
 * trim_blocks, remove {% generation %} tags) and tokenizer, byte for byte, with the source line
 * of every token kept for error messages. */
#include <string.h>

#include "template/tpl_internal.h"

typedef struct lexer {
    tpl_arena *a;
    char *s;    /* preprocessed text */
    int *line;  /* [len + 1] source line of each byte */
    size_t len;
    tpl_token *toks;
    size_t n, cap;
} lexer;

/* A text in progress: bytes plus their source lines. */
typedef struct pp_text {
    char *s;
    int *line;
    size_t n;
} pp_text;

static void pp_alloc(tpl_arena *a, pp_text *t, size_t cap) {
    t->s = tpl_alloc(a, cap + 1);
    t->line = tpl_alloc(a, (cap + 1) * sizeof(int));
    t->n = 0;
}

static void pp_copy(pp_text *dst, const pp_text *src, size_t from, size_t to) {
    memcpy(dst->s + dst->n, src->s + from, to - from);
    memcpy(dst->line + dst->n, src->line + from, (to - from) * sizeof(int));
    dst->n += to - from;
}

/* JavaScript's multiline ^: after \n, \r, U+2028 or U+2029. */
static bool line_start(const char *s, size_t i) {
    if (i == 0) return true;
    if (s[i - 1] == '\n' || s[i - 1] == '\r') return true;
    return i >= 3 && (unsigned char)s[i - 3] == 0xE2 && (unsigned char)s[i - 2] == 0x80 &&
           ((unsigned char)s[i - 1] == 0xA8 || (unsigned char)s[i - 1] == 0xA9);
}

static bool js_space_at(const char *s, size_t n, size_t i, size_t *k) {
    return tpl_js_space(tpl_utf8_next(s + i, n - i, k));
}

/* {%(-?)\s*(?:end)?generation\s*(-?)%}(\s*) at s[i]; on a match sets the flags and lengths. */
static bool match_generation(const char *s, size_t n, size_t i, bool *lstrip, bool *rstrip,
                             size_t *tag_len, size_t *after_len) {
    size_t j = i + 2, k;
    if (j > n || s[i] != '{' || s[i + 1] != '%') return false;
    *lstrip = j < n && s[j] == '-';
    if (*lstrip) j++;
    while (j < n && js_space_at(s, n, j, &k)) j += k;
    if (n - j >= 3 && !memcmp(s + j, "end", 3) && n - j >= 13 && !memcmp(s + j + 3, "generation", 10))
        j += 3;
    if (n - j < 10 || memcmp(s + j, "generation", 10)) return false;
    j += 10;
    while (j < n && js_space_at(s, n, j, &k)) j += k;
    *rstrip = j < n && s[j] == '-';
    if (*rstrip) j++;
    if (n - j < 2 || s[j] != '%' || s[j + 1] != '}') return false; /* (backtracking cannot help) */
    j += 2;
    *tag_len = j - i;
    size_t a = j;
    while (a < n && js_space_at(s, n, a, &k)) a += k;
    *after_len = a - j;
    return true;
}

static void preprocess(lexer *L, const char *src, size_t len) {
    tpl_arena *a = L->a;
    pp_text t0, t1;
    pp_alloc(a, &t0, len);
    memcpy(t0.s, src, len);
    int line = 1;
    for (size_t i = 0; i < len; i++) {
        t0.line[i] = line;
        if (src[i] == '\n') line++;
    }
    t0.n = len;
    /* 1. a single trailing newline is dropped */
    if (t0.n && t0.s[t0.n - 1] == '\n') t0.n--;

    /* 2. lstrip_blocks: /^[ \t]*({[#%-])/gm → "$1" */
    pp_alloc(a, &t1, t0.n);
    for (size_t i = 0; i < t0.n;) {
        if (line_start(t0.s, i)) {
            size_t j = i;
            while (j < t0.n && (t0.s[j] == ' ' || t0.s[j] == '\t')) j++;
            if (j + 1 < t0.n && t0.s[j] == '{' && strchr("#%-", t0.s[j + 1]) && t0.s[j + 1]) {
                pp_copy(&t1, &t0, j, j + 2);
                i = j + 2;
                continue;
            }
        }
        pp_copy(&t1, &t0, i, i + 1);
        i++;
    }

    /* 3. trim_blocks: /([#%-]})\n/g → "$1" */
    pp_text t2;
    pp_alloc(a, &t2, t1.n);
    for (size_t i = 0; i < t1.n;) {
        if (i + 2 < t1.n && strchr("#%-", t1.s[i]) && t1.s[i] && t1.s[i + 1] == '}' &&
            t1.s[i + 2] == '\n') {
            pp_copy(&t2, &t1, i, i + 2);
            i += 3;
            continue;
        }
        pp_copy(&t2, &t1, i, i + 1);
        i++;
    }

    /* 4. transformers' {% generation %} / {% endgeneration %} tags are removed */
    pp_text t3;
    pp_alloc(a, &t3, t2.n);
    size_t last = 0;
    for (size_t i = 0; i + 1 < t2.n; i++) {
        bool ls, rs;
        size_t tag, after;
        if (t2.s[i] != '{' || t2.s[i + 1] != '%') continue;
        if (!match_generation(t2.s, t2.n, i, &ls, &rs, &tag, &after)) continue;
        size_t end = i;
        while (ls && end > last) {
            size_t st = end - 1;
            while (st > last && ((unsigned char)t2.s[st] & 0xC0) == 0x80) st--;
            size_t k;
            if (!js_space_at(t2.s, end, st, &k) || st + k != end) break;
            end = st;
        }
        pp_copy(&t3, &t2, last, end);
        if (!rs) pp_copy(&t3, &t2, i + tag, i + tag + after);
        last = i + tag + after;
        i = last - 1;
    }
    pp_copy(&t3, &t2, last, t2.n);
    t3.line[t3.n] = t3.n ? t3.line[t3.n - 1] : 1;
    t3.s[t3.n] = 0;
    L->s = t3.s;
    L->line = t3.line;
    L->len = t3.n;
}

static tpl_token *push(lexer *L, tpl_tok_type type, const char *s, size_t n, size_t pos) {
    if (L->n == L->cap) {
        size_t cap = L->cap ? L->cap * 2 : 256;
        tpl_token *t = tpl_alloc(L->a, cap * sizeof *t);
        if (L->n) memcpy(t, L->toks, L->n * sizeof *t);
        L->toks = t;
        L->cap = cap;
    }
    tpl_token *t = &L->toks[L->n++];
    t->type = type;
    t->s = s;
    t->n = n;
    t->line = L->line[pos < L->len ? pos : L->len];
    return t;
}

_Noreturn static void lex_fail(lexer *L, size_t pos, const char *msg, const char *detail) {
    tpl_throw(L->a->base, DS_ERR_FORMAT, L->line[pos < L->len ? pos : L->len], "%s%s", msg,
              detail ? detail : "");
}

static bool is_word(char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_';
}
static bool is_digit(char c) { return c >= '0' && c <= '9'; }

/* consumeWhile of the reference: throws when the input ends while the predicate holds. */
static size_t consume_space(lexer *L, size_t i) {
    size_t k;
    while (i < L->len && js_space_at(L->s, L->len, i, &k)) {
        i += k;
        if (i >= L->len) lex_fail(L, i, "unexpected end of template", NULL);
    }
    return i;
}

static size_t consume_digits(lexer *L, size_t i) {
    while (i < L->len && is_digit(L->s[i]))
        if (++i >= L->len) lex_fail(L, i, "unexpected end of template", NULL);
    return i;
}

static void strip_trailing(lexer *L) {
    if (!L->n || L->toks[L->n - 1].type != TK_TEXT) return;
    tpl_token *t = &L->toks[L->n - 1];
    t->n -= tpl_js_space_suffix(t->s, t->n);
    if (!t->n) L->n--;
}

static size_t skip_leading(lexer *L, size_t i) { return i + tpl_js_space_prefix(L->s + i, L->len - i); }

static int hexval(char c) {
    if (is_digit(c)) return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

/* String literal body at L->s[i] (after the opening quote); returns the index of the closing
 * quote. Escapes are resolved; \uD83D\uDE00 pairs join into one character. */
static size_t lex_string(lexer *L, size_t i, char quote, tpl_token *tok) {
    tpl_buf b;
    tpl_buf_init(&b, L->a, 0);
    uint32_t high = 0; /* pending high surrogate from \u */
    for (;;) {
        if (i >= L->len) lex_fail(L, i, "unexpected end of template in a string", NULL);
        char ch = L->s[i];
        if (ch == quote) break;
        i++;
        if (ch != '\\') {
            if (high) {
                char u[4];
                tpl_buf_put(&b, u, tpl_utf8_put(u, high));
                high = 0;
            }
            tpl_buf_putc(&b, ch);
            continue;
        }
        if (i >= L->len) lex_fail(L, i, "unexpected end of template in a string", NULL);
        char e = L->s[i++];
        uint32_t cp;
        if (e == 'x' || e == 'u') {
            size_t hl = e == 'x' ? 2 : 4;
            if (L->len - i < hl) lex_fail(L, i, "invalid hexadecimal escape sequence", NULL);
            cp = 0;
            for (size_t k = 0; k < hl; k++) {
                int h = hexval(L->s[i + k]);
                if (h < 0) lex_fail(L, i, "invalid hexadecimal escape sequence", NULL);
                cp = cp * 16 + (uint32_t)h;
            }
            i += hl;
        } else {
            const char *from = "ntrbfv'\"\\", *to = "\n\t\r\b\f\v'\"\\";
            const char *p = e ? strchr(from, e) : NULL;
            if (!p) {
                char d[2] = {e, 0};
                lex_fail(L, i, "unexpected escaped character: ", d);
            }
            cp = (unsigned char)to[p - from];
        }
        if (high && cp >= 0xDC00 && cp <= 0xDFFF) {
            cp = 0x10000 + ((high - 0xD800) << 10) + (cp - 0xDC00);
            high = 0;
        } else if (high) {
            char u[4];
            tpl_buf_put(&b, u, tpl_utf8_put(u, high));
            high = 0;
        }
        if (cp >= 0xD800 && cp <= 0xDBFF) {
            high = cp;
            continue;
        }
        char u[4];
        tpl_buf_put(&b, u, tpl_utf8_put(u, cp));
    }
    if (high) {
        char u[4];
        tpl_buf_put(&b, u, tpl_utf8_put(u, high));
    }
    tok->s = b.p ? b.p : "";
    tok->n = b.n;
    return i;
}

static const struct {
    const char *seq;
    tpl_tok_type type;
} RULES[] = {
    {"{%", TK_OPEN_STMT}, {"%}", TK_CLOSE_STMT}, {"{{", TK_OPEN_EXPR}, {"}}", TK_CLOSE_EXPR},
    {"(", TK_LPAREN},     {")", TK_RPAREN},      {"{", TK_LBRACE},    {"}", TK_RBRACE},
    {"[", TK_LBRACKET},   {"]", TK_RBRACKET},    {",", TK_COMMA},     {".", TK_DOT},
    {":", TK_COLON},      {"|", TK_PIPE},        {"<=", TK_CMP},      {">=", TK_CMP},
    {"==", TK_CMP},       {"!=", TK_CMP},        {"<", TK_CMP},       {">", TK_CMP},
    {"+", TK_ADD},        {"-", TK_ADD},         {"~", TK_ADD},       {"**", TK_POW},
    {"*", TK_MUL},        {"//", TK_MUL},        {"/", TK_MUL},       {"%", TK_MUL},
    {"=", TK_EQUALS},
};

void tpl_lex(tpl_arena *a, const char *src, size_t len, tpl_token **toks, size_t *n_toks) {
    lexer L = {.a = a};
    preprocess(&L, src, len);
    const char *s = L.s;
    size_t n = L.len, i = 0;
    int depth = 0; /* curly brackets open inside an expression */
    while (i < n) {
        tpl_tok_type last = L.n ? L.toks[L.n - 1].type : TK_EOF;
        if (last == TK_EOF || last == TK_CLOSE_STMT || last == TK_CLOSE_EXPR ||
            last == TK_COMMENT) {
            size_t end = i;
            for (;;) {
                const char *br = memchr(s + end, '{', n - end);
                if (!br) {
                    end = n;
                    break;
                }
                end = (size_t)(br - s);
                char nx = end + 1 < n ? s[end + 1] : 0;
                if (nx == '%' || nx == '{' || nx == '#') break;
                end++;
            }
            if (end > i) {
                push(&L, TK_TEXT, s + i, end - i, i);
                i = end;
                continue;
            }
        }
        if (s[i] == '{') {
            char nx = i + 1 < n ? s[i + 1] : 0;
            if (nx == '#') {
                size_t st = i;
                i += 2;
                bool strip_before = i < n && s[i] == '-';
                if (strip_before) i++;
                const char *end = i <= n ? memmem(s + i, n - i, "#}", 2) : NULL;
                if (!end) lex_fail(&L, st, "missing end of comment tag", NULL);
                size_t e = (size_t)(end - s);
                bool strip_after = e > i && s[e - 1] == '-';
                if (strip_before) strip_trailing(&L);
                push(&L, TK_COMMENT, s + i, e - i - (strip_after ? 1 : 0), st);
                i = e + 2;
                if (strip_after) i = skip_leading(&L, i);
                continue;
            }
            if (i + 2 < n && s[i + 2] == '-') {
                if (nx == '%') {
                    strip_trailing(&L);
                    push(&L, TK_OPEN_STMT, "{%", 2, i);
                    i += 3;
                    continue;
                }
                if (nx == '{') {
                    strip_trailing(&L);
                    push(&L, TK_OPEN_EXPR, "{{", 2, i);
                    depth = 0;
                    i += 3;
                    continue;
                }
            }
        }
        i = consume_space(&L, i);
        char ch = s[i];
        if (ch == '-' && i + 2 < n && s[i + 2] == '}') {
            if (s[i + 1] == '%') {
                push(&L, TK_CLOSE_STMT, "%}", 2, i);
                i = skip_leading(&L, i + 3);
                continue;
            }
            if (s[i + 1] == '}') {
                push(&L, TK_CLOSE_EXPR, "}}", 2, i);
                i = skip_leading(&L, i + 3);
                continue;
            }
        }
        if (ch == '-' || ch == '+') {
            if (last == TK_TEXT || last == TK_EOF) {
                char d[2] = {ch, 0};
                lex_fail(&L, i, "unexpected character: ", d);
            }
            if (!(last == TK_IDENT || last == TK_NUM || last == TK_STR || last == TK_RPAREN ||
                  last == TK_RBRACKET)) {
                /* a unary sign, folded into a following number */
                size_t st = i++;
                size_t e = consume_digits(&L, i);
                if (e > i && e + 1 < n && s[e] == '.' && is_digit(s[e + 1])) e = consume_digits(&L, e + 1);
                if (e > i)
                    push(&L, TK_NUM, s + st, e - st, st);
                else
                    push(&L, TK_UNARY, s + st, 1, st);
                i = e;
                continue;
            }
        }
        bool matched = false;
        for (size_t r = 0; r < sizeof RULES / sizeof RULES[0]; r++) {
            size_t k = strlen(RULES[r].seq);
            if (RULES[r].seq[0] != ch) continue;
            if (RULES[r].type == TK_CLOSE_EXPR && depth > 0) continue;
            if (n - i < k || memcmp(s + i, RULES[r].seq, k)) continue;
            push(&L, RULES[r].type, s + i, k, i);
            if (RULES[r].type == TK_OPEN_EXPR) depth = 0;
            else if (RULES[r].type == TK_LBRACE) depth++;
            else if (RULES[r].type == TK_RBRACE) depth--;
            i += k;
            matched = true;
            break;
        }
        if (matched) continue;
        if (ch == '\'' || ch == '"') {
            tpl_token *t = push(&L, TK_STR, NULL, 0, i);
            i = lex_string(&L, i + 1, ch, t) + 1;
            continue;
        }
        if (is_digit(ch)) {
            size_t st = i;
            size_t e = consume_digits(&L, i);
            if (last != TK_DOT && e + 1 < n && s[e] == '.' && is_digit(s[e + 1]))
                e = consume_digits(&L, e + 1);
            push(&L, TK_NUM, s + st, e - st, st);
            i = e;
            continue;
        }
        if (is_word(ch)) {
            size_t st = i;
            while (i < n && is_word(s[i]))
                if (++i >= n) lex_fail(&L, i, "unexpected end of template", NULL);
            push(&L, TK_IDENT, s + st, i - st, st);
            continue;
        }
        char d[8] = {0};
        size_t k;
        tpl_utf8_next(s + i, n - i, &k);
        memcpy(d, s + i, k < 7 ? k : 7);
        lex_fail(&L, i, "unexpected character: ", d);
    }
    push(&L, TK_EOF, "", 0, n);
    *toks = L.toks;
    *n_toks = L.n;
}
