/* tpl_internal.h — the Jinja engine's internals: arena, tokens, syntax tree, values, scopes.
 *
 * Memory: a compiled template owns one arena (tokens' text and the syntax tree); a render owns
 * another (every value, scope and intermediate string), freed in one go at the end. Values are
 * never freed individually, which also gives JavaScript's reference identity for free (the
 * reference renderer compares arrays and objects by identity).
 *
 * Errors: the lexer, parser and evaluator report errors by longjmp to the entry point
 * (tpl_throw), which frees the arena and returns the status. Nothing between the throw and the
 * catch owns memory outside the arena, so unwinding this way leaks nothing and keeps the
 * hundreds of evaluation paths free of error plumbing. */
#ifndef DS_TPL_INTERNAL_H
#define DS_TPL_INTERNAL_H

#include <setjmp.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <cjson/cJSON.h>

#include "core/status.h"
#include "template/chat_template.h"

/* ---- error unwinding ------------------------------------------------------------------------ */

typedef struct tpl_base {
    jmp_buf jb;
    ds_status status;
    char msg[DS_ERROR_MSG_MAX];
} tpl_base;

/* Records "chat template line N: <msg>" (line ≤ 0: no line) and unwinds to setjmp(b->jb). */
_Noreturn void tpl_throw(tpl_base *b, ds_status st, int line, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* ---- arena ------------------------------------------------------------------------------------ */

typedef struct tpl_chunk tpl_chunk;
typedef struct tpl_arena {
    tpl_chunk *head;
    size_t used;   /* bytes obtained from malloc so far */
    size_t limit;  /* throw when used would exceed it */
    tpl_base *base; /* where to throw */
} tpl_arena;

void tpl_arena_init(tpl_arena *a, size_t limit, tpl_base *base);
void tpl_arena_free(tpl_arena *a);
void *tpl_alloc(tpl_arena *a, size_t n);     /* zeroed, 16-byte aligned; throws when over limit */
char *tpl_strndup(tpl_arena *a, const char *s, size_t n); /* NUL-terminated copy */

/* Growable byte buffer living in an arena (old storage is abandoned on growth). */
typedef struct tpl_buf {
    tpl_arena *a;
    char *p;
    size_t n, cap;
    size_t max; /* throw when a string would exceed it (0: no limit) */
    int line;   /* for the error message */
} tpl_buf;

void tpl_buf_init(tpl_buf *b, tpl_arena *a, size_t max);
void tpl_buf_put(tpl_buf *b, const char *s, size_t n);
void tpl_buf_putc(tpl_buf *b, char c);
void tpl_buf_puts(tpl_buf *b, const char *s);
void tpl_buf_printf(tpl_buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* ---- UTF-8 and JavaScript string helpers (tpl_utf8.c) ------------------------------------ */

/* Decodes one code point at s[0..n) (n ≥ 1); invalid bytes decode as U+FFFD of length 1. */
uint32_t tpl_utf8_next(const char *s, size_t n, size_t *len);
size_t tpl_utf8_put(char out[4], uint32_t cp);
/* JavaScript's whitespace (String.prototype.trim, \s): WhiteSpace + LineTerminator. */
bool tpl_js_space(uint32_t cp);
/* Length of the whitespace run at the start / end of s. */
size_t tpl_js_space_prefix(const char *s, size_t n);
size_t tpl_js_space_suffix(const char *s, size_t n);
/* Length in UTF-16 code units (JavaScript's .length). */
size_t tpl_utf16_len(const char *s, size_t n);

/* ---- numbers (tpl_number.c) -------------------------------------------------------------- */

/* JavaScript Number.prototype.toString; buf ≥ 32 bytes. */
size_t tpl_num_js(double v, char *buf);
/* Python's repr of a float (json.dumps spelling: 1e-05, 1e+20, 2.0, Infinity); integral
 * non-float values below 1e16 are written as integers. buf ≥ 32 bytes. */
size_t tpl_num_py(double v, bool is_float, char *buf);
/* parseInt(s, 10) / parseFloat(s): NaN when nothing parses. */
double tpl_parse_int(const char *s, size_t n);
double tpl_parse_float(const char *s, size_t n);
/* JavaScript ToNumber of a string (for loose ==): NaN when not numeric. */
double tpl_to_number(const char *s, size_t n);

/* ---- tokens (tpl_lexer.c) ------------------------------------------------------------------ */

typedef enum tpl_tok_type {
    TK_TEXT, TK_NUM, TK_STR, TK_IDENT, TK_EQUALS, TK_LPAREN, TK_RPAREN, TK_OPEN_STMT,
    TK_CLOSE_STMT, TK_OPEN_EXPR, TK_CLOSE_EXPR, TK_LBRACKET, TK_RBRACKET, TK_LBRACE, TK_RBRACE,
    TK_COMMA, TK_DOT, TK_COLON, TK_PIPE, TK_ADD, TK_MUL, TK_POW, TK_CMP, TK_UNARY, TK_COMMENT,
    TK_EOF,
} tpl_tok_type;

typedef struct tpl_token {
    tpl_tok_type type;
    const char *s; /* value: text, decoded string literal, identifier, operator, number */
    size_t n;
    int line;
} tpl_token;

/* Tokenizes a template (after the lstrip_blocks / trim_blocks / generation-tag preprocessing
 * of the reference renderer). Tokens and their text live in a; the list ends with TK_EOF. */
void tpl_lex(tpl_arena *a, const char *src, size_t len, tpl_token **toks, size_t *n_toks);

/* ---- syntax tree (tpl_parser.c) --------------------------------------------------------- */

typedef enum tpl_nk {
    /* statements */
    TN_TEXT, TN_IF, TN_FOR, TN_SET, TN_MACRO, TN_CALLBLOCK, TN_FILTERBLOCK, TN_BREAK,
    TN_CONTINUE, TN_COMMENT,
    /* expressions */
    TN_INT, TN_FLOAT, TN_STR, TN_IDENT, TN_ARRAY, TN_TUPLE, TN_OBJECT, TN_MEMBER, TN_SLICE,
    TN_CALL, TN_BINARY, TN_UNARY, TN_FILTER, TN_TEST, TN_TERNARY, TN_SELECT, TN_KWARG,
    TN_SPREAD, TN_KWSPREAD,
} tpl_nk;

typedef enum tpl_op {
    OP_NONE, OP_OR, OP_AND, OP_NOT, OP_IN, OP_NOTIN, OP_EQ, OP_NE, OP_LT, OP_GT, OP_LE, OP_GE,
    OP_ADD, OP_SUB, OP_CONCAT, OP_MUL, OP_DIV, OP_FLOORDIV, OP_MOD, OP_POW,
} tpl_op;

typedef struct tpl_node tpl_node;
typedef struct tpl_nlist {
    tpl_node **v;
    size_t n;
} tpl_nlist;

/* Special names a macro / call-block body reads (Jinja passes them only when used); for a FOR
 * node, TPL_USES_LOOP says whether its subtree reads `loop` at all (else no loop object is
 * built per iteration). */
enum { TPL_USES_CALLER = 1, TPL_USES_KWARGS = 2, TPL_USES_VARARGS = 4, TPL_USES_LOOP = 8 };

struct tpl_value;

/* Field use by kind:
 *   TEXT, STR   s/n text                      INT, FLOAT  num
 *   IDENT       s/n name                      KWARG       s/n key, a value
 *   IF          a test, body, alt             FOR         a target, b iterable, c select test,
 *                                                         body, alt (else block)
 *   SET         a target, b value or NULL (block form: body)
 *   MACRO       s/n name, params, body, uses  CALLBLOCK   a CALL node, params (caller's), body,
 *                                                         uses
 *   FILTERBLOCK a filter (IDENT or CALL), body
 *   ARRAY/TUPLE body items                    OBJECT      body keys, alt values
 *   MEMBER      a object, b property, flag computed
 *   SLICE       a start, b stop, c step (NULL: absent)
 *   CALL        a callee, body args           BINARY      op, a, b
 *   UNARY       op (OP_NOT, OP_SUB, OP_ADD), a
 *   FILTER      a operand, b filter (IDENT or CALL)
 *   TEST        a operand, s/n test name, flag negated, body args
 *   TERNARY     a condition, b if true, c if false
 *   SELECT      a value, b condition (`x if c` without else)
 *   SPREAD, KWSPREAD  a */
struct tpl_node {
    tpl_nk kind;
    int line;
    int depth; /* height of the subtree: bounded so every recursive walk is */
    tpl_op op;
    bool flag;
    unsigned uses;
    const char *s;
    size_t n;
    double num;
    tpl_node *a, *b, *c;
    tpl_nlist body, alt, params;
    struct tpl_value *lit; /* INT, FLOAT, STR: the constant, built once (read-only) */
};

#define TPL_MAX_AST_DEPTH 200

/* Parses tokens into the program's statement list (nodes live in a); throws on errors. */
void tpl_parse(tpl_arena *a, const tpl_token *toks, size_t n_toks, tpl_nlist *program);

struct ds_chat_template {
    tpl_arena arena;
    tpl_base base; /* the arena's throw target while compiling */
    tpl_nlist program;
    char *source;
    size_t source_len;
};

/* ---- values (tpl_value.c) ---------------------------------------------------------------- */

typedef enum tpl_type {
    TV_UNDEFINED, TV_NULL, TV_BOOL, TV_INT, TV_FLOAT, TV_STRING, TV_ARRAY, TV_OBJECT,
    TV_NAMESPACE, TV_FUNCTION,
} tpl_type;

/* flags */
enum { TVF_TUPLE = 1, /* array built by (a, b): the reference refuses to print / tojson it */
       TVF_KWARGS = 2 /* object of keyword arguments */ };

typedef struct tpl_value tpl_value;
typedef struct tpl_map {
    size_t n, cap;
    const char **keys;
    size_t *klens;
    tpl_value **vals;
} tpl_map;

typedef struct tpl_ctx tpl_ctx;
typedef struct tpl_env tpl_env;
typedef struct tpl_args {
    tpl_value **pos; /* positional arguments */
    size_t n;
    tpl_value *kw;   /* TV_OBJECT of keyword arguments, or NULL */
} tpl_args;

typedef tpl_value *(*tpl_native_fn)(tpl_ctx *c, tpl_value *self, const tpl_args *args,
                                    tpl_env *call_site);

typedef struct tpl_func {
    const char *name;
    tpl_native_fn native; /* NULL: a macro or a call block's caller */
    tpl_value *self;      /* bound receiver of a method */
    const tpl_node *node; /* MACRO or CALLBLOCK */
    tpl_env *closure;     /* scope the macro was defined in */
} tpl_func;

struct tpl_value {
    tpl_type type;
    unsigned flags;
    union {
        bool b;
        double num; /* TV_INT and TV_FLOAT: JavaScript numbers (ints are integral doubles) */
        struct {
            const char *s;
            size_t n;
        } str;
        struct {
            tpl_value **v;
            size_t n, cap;
        } arr;
        tpl_map *map; /* TV_OBJECT, TV_NAMESPACE */
        tpl_func *fn;
    } u;
};

extern tpl_value tpl_undefined_v, tpl_null_v, tpl_true_v, tpl_false_v;
#define TPL_UNDEF (&tpl_undefined_v)
#define TPL_NULL (&tpl_null_v)
#define TPL_BOOL(x) ((x) ? &tpl_true_v : &tpl_false_v)

/* ---- scopes and the render context ---------------------------------------------------------- */

struct tpl_env {
    tpl_env *parent;
    tpl_map vars;
    bool call_block_scope; /* created by {% call %}: `caller` here is the block */
};

struct tpl_ctx {
    tpl_base base;
    tpl_arena arena;
    const ds_chat_limits *lim;
    int line;   /* line of the node being evaluated, for messages */
    int depth;  /* macro / call / filter-block nesting */
    unsigned long steps;
    bool py_numbers; /* Python's number spellings (ds_chat_render_opts.python_numbers) */
    /* The innermost loop iteration being rendered: {% break %} / {% continue %} jump there
     * from wherever they are reached (a macro called from the loop, a set or filter block),
     * the way the reference's exceptions propagate. */
    jmp_buf *loop_jb;
};

_Noreturn void tpl_fail(tpl_ctx *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void tpl_step(tpl_ctx *c); /* counts one evaluation step, throws past the limit */

tpl_value *tv_num(tpl_ctx *c, tpl_type t, double v); /* TV_INT or TV_FLOAT */
tpl_value *tv_int(tpl_ctx *c, double v);
tpl_value *tv_float(tpl_ctx *c, double v);
tpl_value *tv_str(tpl_ctx *c, const char *s, size_t n);      /* copies */
tpl_value *tv_str_ref(tpl_ctx *c, const char *s, size_t n);  /* s must outlive the render */
tpl_value *tv_str_buf(tpl_ctx *c, const tpl_buf *b);          /* takes the buffer's bytes */
tpl_value *tv_array(tpl_ctx *c, size_t cap);
void tv_push(tpl_ctx *c, tpl_value *arr, tpl_value *v);
tpl_value *tv_object(tpl_ctx *c);
tpl_value *tv_namespace(tpl_ctx *c);
tpl_value *tv_native(tpl_ctx *c, const char *name, tpl_native_fn fn, tpl_value *self);

void tpl_map_set(tpl_ctx *c, tpl_map *m, const char *k, size_t kn, tpl_value *v);
tpl_value *tpl_map_get(const tpl_map *m, const char *k, size_t kn); /* NULL when absent */

bool tv_is_array(const tpl_value *v);  /* arrays and tuples */
bool tv_is_object(const tpl_value *v); /* objects and kwargs */
bool tv_is_number(const tpl_value *v);
const char *tv_type_name(const tpl_value *v); /* the reference's names: "StringValue", ... */
bool tv_truthy(const tpl_value *v);
/* RuntimeValue.toString() of the reference (what {{ x }} prints for non-null values). */
void tv_write(tpl_ctx *c, tpl_buf *out, const tpl_value *v);
/* String(x.value): the JavaScript spelling used by + and ~ on non-strings. */
void tv_write_raw(tpl_ctx *c, tpl_buf *out, const tpl_value *v);
/* x.value == y.value (JavaScript loose equality) and === (strict). */
bool tv_loose_eq(tpl_ctx *c, const tpl_value *a, const tpl_value *b);
bool tv_strict_eq(const tpl_value *a, const tpl_value *b);
/* Ordering used by sort / dictsort; throws on incomparable types. */
int tv_compare(tpl_ctx *c, const tpl_value *a, const tpl_value *b, bool case_sensitive);
/* JSON input → values (strings reference the cJSON memory). */
tpl_value *tv_from_json(tpl_ctx *c, const cJSON *j);

/* ---- JSON output (tpl_json.c) ---------------------------------------------------------------- */

typedef struct tpl_json_opts {
    int indent;               /* ≤ 0: none */
    bool ensure_ascii, sort_keys;
    const char *item_sep, *key_sep; /* NULL: defaults (", " / ": ", or "," with indent) */
    bool undefined_as_null;   /* tojson: null; printing: undefined */
    bool py_numbers;          /* json.dumps spellings of numbers */
} tpl_json_opts;

void tpl_json_write(tpl_ctx *c, tpl_buf *out, const tpl_value *v, const tpl_json_opts *o);
void tpl_json_string(tpl_buf *out, const char *s, size_t n, bool ensure_ascii);

/* ---- evaluation (tpl_eval.c, tpl_exec.c) ---------------------------------------------------- */

tpl_env *tpl_env_new(tpl_ctx *c, tpl_env *parent);
tpl_value *tpl_env_lookup(tpl_env *e, const char *name, size_t n);
void tpl_env_set(tpl_ctx *c, tpl_env *e, const char *name, size_t n, tpl_value *v);

tpl_value *tpl_eval(tpl_ctx *c, const tpl_node *n, tpl_env *env);
/* Evaluates call arguments: positional (with *spread) then keyword (with **spread). */
void tpl_eval_args(tpl_ctx *c, const tpl_nlist *args, tpl_env *env, tpl_args *out);
tpl_value *tpl_call(tpl_ctx *c, tpl_value *fn, const tpl_args *args, tpl_env *call_site);
/* Renders statements into out. */
void tpl_render_block(tpl_ctx *c, const tpl_nlist *body, tpl_env *env, tpl_buf *out);
/* Renders a body into a fresh string value (macros, set blocks, filter blocks). */
tpl_value *tpl_render_to_value(tpl_ctx *c, const tpl_nlist *body, tpl_env *env);
/* a.b / a[b] lookup (property already evaluated). */
tpl_value *tpl_member(tpl_ctx *c, tpl_value *obj, tpl_value *prop);
/* a[start:stop:step] */
tpl_value *tpl_slice(tpl_ctx *c, tpl_value *obj, tpl_value *start, tpl_value *stop,
                     tpl_value *step);

/* ---- library (tpl_filters.c, tpl_tests.c, tpl_builtins.c) --------------------------------- */

tpl_value *tpl_apply_filter(tpl_ctx *c, tpl_value *operand, const tpl_node *filter, tpl_env *env);
/* A test by name: NULL name_ok when unknown. */
bool tpl_run_test(tpl_ctx *c, const char *name, size_t n, tpl_value *operand,
                  const tpl_args *args, bool *known);
/* Builtin methods of strings / objects (`s.upper`, `d.items`), NULL when none. */
tpl_value *tpl_builtin_member(tpl_ctx *c, tpl_value *obj, const char *name, size_t n);
/* Declares range, namespace, raise_exception, strftime_now, dict, true/false/none. */
void tpl_declare_globals(tpl_ctx *c, tpl_env *g);
/* Stable sort of v[0..n) (optionally by an attribute path); throws on incomparable items. */
void tpl_sort_values(tpl_ctx *c, tpl_value **v, size_t n, bool reverse, bool case_sensitive,
                     tpl_value *attribute);
/* getAttributeValue of the reference: "a.b.0" paths through objects and arrays. */
tpl_value *tpl_attr_path(tpl_ctx *c, tpl_value *item, const char *path, size_t n);

/* String helpers shared by filters and methods. */
tpl_value *tpl_str_case(tpl_ctx *c, const tpl_value *s, bool upper);
tpl_value *tpl_str_trim(tpl_ctx *c, const tpl_value *s, bool left, bool right);
tpl_value *tpl_str_replace(tpl_ctx *c, const tpl_value *s, const tpl_value *old,
                           const tpl_value *new_, double count);
/* Keyword argument by name, or the positional at index i, or NULL. */
tpl_value *tpl_arg(const tpl_args *a, size_t i, const char *kw);

#endif
