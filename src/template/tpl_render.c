/* Public entry points: compile a template, render a conversation (the context transformers'
 * apply_chat_template builds, then its continue_final_message cut). */
#include <stdlib.h>
#include <string.h>

#include "template/tpl_internal.h"

#define DEFAULT_MAX_OUTPUT ((size_t)64 << 20)
#define DEFAULT_MAX_MEMORY ((size_t)256 << 20)
#define DEFAULT_MAX_DEPTH 64
#define DEFAULT_MAX_STEPS 10000000UL
#define COMPILE_MAX_MEMORY ((size_t)1 << 30)

static void compile_inner(ds_chat_template *t) {
    tpl_token *toks;
    size_t n;
    tpl_lex(&t->arena, t->source, t->source_len, &toks, &n);
    tpl_parse(&t->arena, toks, n, &t->program);
}

ds_status ds_chat_template_compile(const char *text, size_t len, ds_chat_template **out,
                                   ds_error *err) {
    *out = NULL;
    if (!text) return ds_error_set(err, DS_ERR_INVALID_ARG, "chat template: no text");
    ds_chat_template *t = calloc(1, sizeof *t);
    if (!t) return ds_error_set(err, DS_ERR_NOMEM, "chat template: out of memory");
    tpl_arena_init(&t->arena, COMPILE_MAX_MEMORY, &t->base);
    t->source = malloc(len + 1);
    if (!t->source) {
        free(t);
        return ds_error_set(err, DS_ERR_NOMEM, "chat template: out of memory");
    }
    memcpy(t->source, text, len);
    t->source[len] = 0;
    t->source_len = len;
    if (setjmp(t->base.jb)) {
        ds_status st = ds_error_set(err, t->base.status, "%s", t->base.msg);
        ds_chat_template_free(t);
        return st;
    }
    compile_inner(t);
    *out = t;
    return DS_OK;
}

void ds_chat_template_free(ds_chat_template *t) {
    if (!t) return;
    tpl_arena_free(&t->arena);
    free(t->source);
    free(t);
}

const char *ds_chat_template_source(const ds_chat_template *t) { return t->source; }

/* Python's str.isspace (what transformers' strip() in continue_final_message uses). */
static bool py_space(uint32_t c) {
    return (c >= 9 && c <= 13) || (c >= 0x1C && c <= 0x20) || c == 0x85 || c == 0xA0 ||
           c == 0x1680 || (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 ||
           c == 0x202F || c == 0x205F || c == 0x3000;
}

static void py_strip(const char *s, size_t n, size_t *a, size_t *b) {
    size_t i = 0;
    while (i < n) {
        size_t k;
        if (!py_space(tpl_utf8_next(s + i, n - i, &k))) break;
        i += k;
    }
    size_t e = n;
    while (e > i) {
        size_t st = e - 1;
        while (st > i && ((unsigned char)s[st] & 0xC0) == 0x80 && e - st < 4) st--;
        size_t k;
        uint32_t cp = tpl_utf8_next(s + st, e - st, &k);
        if (st + k != e || !py_space(cp)) break;
        e = st;
    }
    *a = i;
    *b = e;
}

/* transformers: cut the rendered text right after the final message's content. */
static void continue_final(tpl_ctx *c, const cJSON *messages, tpl_buf *out) {
    const cJSON *last = cJSON_GetArrayItem(messages, cJSON_GetArraySize(messages) - 1);
    const cJSON *content = last ? cJSON_GetObjectItemCaseSensitive(last, "content") : NULL;
    const char *msg = NULL;
    if (cJSON_IsString(content)) {
        msg = content->valuestring;
    } else if (cJSON_IsArray(content)) {
        for (const cJSON *b = content->child; b; b = b->next) {
            const cJSON *t = cJSON_GetObjectItemCaseSensitive(b, "text");
            if (cJSON_IsString(t)) msg = t->valuestring; /* the last block with text */
        }
    }
    if (!msg)
        tpl_throw(&c->base, DS_ERR_INVALID_ARG, 0,
                  "continue_final_message needs a final message with text content");
    size_t n = strlen(msg), a, b;
    py_strip(msg, n, &a, &b);
    const char *needle = msg + a;
    size_t nl = b - a;
    if (!out->p) { /* nothing rendered */
        if (nl)
            tpl_throw(&c->base, DS_ERR_INVALID_ARG, 0,
                      "continue_final_message is set but the final message does not appear in "
                      "the rendered chat");
        return;
    }
    /* rindex */
    const char *hit = NULL;
    for (size_t i = out->n >= nl ? out->n - nl + 1 : 0; i-- > 0;)
        if (!memcmp(out->p + i, needle, nl)) {
            hit = out->p + i;
            break;
        }
    if (!hit)
        tpl_throw(&c->base, DS_ERR_INVALID_ARG, 0,
                  "continue_final_message is set but the final message does not appear in the "
                  "rendered chat");
    size_t loc = (size_t)(hit - out->p);
    /* rendered[loc : loc + len(msg.lstrip())] == msg holds only when msg has no leading
     * whitespace and appears whole: then its trailing whitespace is kept too */
    if (a == 0 && out->n - loc >= n && !memcmp(out->p + loc, msg, n))
        out->n = loc + n;
    else
        out->n = loc + nl;
    out->p[out->n] = 0;
}

static void declare(tpl_ctx *c, tpl_env *g, const char *name, tpl_value *v, bool user) {
    size_t n = strlen(name);
    if (tpl_map_get(&g->vars, name, n))
        tpl_throw(&c->base, DS_ERR_INVALID_ARG, 0, "%s'%s' clashes with a variable the template "
                  "already has", user ? "chat_template_kwargs: " : "", name);
    tpl_env_set(c, g, name, n, v);
}

static void render_inner(tpl_ctx *c, const ds_chat_template *t, const ds_chat_render_opts *o,
                         tpl_buf *out) {
    tpl_env *g = tpl_env_new(c, NULL);
    tpl_declare_globals(c, g);
    declare(c, g, "messages", tv_from_json(c, o->messages), false);
    declare(c, g, "tools", o->tools ? tv_from_json(c, o->tools) : TPL_NULL, false);
    declare(c, g, "add_generation_prompt", TPL_BOOL(o->add_generation_prompt), false);
    if (o->bos_token) declare(c, g, "bos_token", tv_str_ref(c, o->bos_token, strlen(o->bos_token)), false);
    if (o->eos_token) declare(c, g, "eos_token", tv_str_ref(c, o->eos_token, strlen(o->eos_token)), false);
    if (o->kwargs)
        for (const cJSON *k = o->kwargs->child; k; k = k->next)
            declare(c, g, k->string ? k->string : "", tv_from_json(c, k), true);
    tpl_render_block(c, &t->program, g, out);
    if (o->continue_final_message) continue_final(c, o->messages, out);
}

ds_status ds_chat_template_render(const ds_chat_template *t, const ds_chat_render_opts *o,
                                  char **out, size_t *out_len, ds_error *err) {
    *out = NULL;
    if (out_len) *out_len = 0;
    if (!cJSON_IsArray(o->messages))
        return ds_error_set(err, DS_ERR_INVALID_ARG, "messages must be a JSON array");
    if (o->tools && !cJSON_IsArray(o->tools) && !cJSON_IsNull(o->tools))
        return ds_error_set(err, DS_ERR_INVALID_ARG, "tools must be a JSON array");
    if (o->kwargs && !cJSON_IsObject(o->kwargs) && !cJSON_IsNull(o->kwargs))
        return ds_error_set(err, DS_ERR_INVALID_ARG, "chat_template_kwargs must be a JSON object");
    if (o->add_generation_prompt && o->continue_final_message)
        return ds_error_set(err, DS_ERR_INVALID_ARG,
                            "add_generation_prompt and continue_final_message cannot both be set");
    ds_chat_limits lim = o->limits;
    if (!lim.max_output) lim.max_output = DEFAULT_MAX_OUTPUT;
    if (!lim.max_memory) lim.max_memory = DEFAULT_MAX_MEMORY;
    if (!lim.max_depth) lim.max_depth = DEFAULT_MAX_DEPTH;
    if (!lim.max_steps) lim.max_steps = DEFAULT_MAX_STEPS;
    tpl_ctx *c = calloc(1, sizeof *c);
    if (!c) return ds_error_set(err, DS_ERR_NOMEM, "chat template: out of memory");
    c->lim = &lim;
    c->py_numbers = o->python_numbers;
    tpl_arena_init(&c->arena, lim.max_memory, &c->base);
    ds_chat_render_opts oo = *o;
    if (cJSON_IsNull(oo.tools)) oo.tools = NULL;
    if (cJSON_IsNull(oo.kwargs)) oo.kwargs = NULL;
    tpl_buf *buf = NULL;
    if (setjmp(c->base.jb)) {
        ds_status st = ds_error_set(err, c->base.status, "%s", c->base.msg);
        tpl_arena_free(&c->arena);
        free(c);
        return st;
    }
    buf = tpl_alloc(&c->arena, sizeof *buf);
    tpl_buf_init(buf, &c->arena, lim.max_output);
    render_inner(c, t, &oo, buf);
    char *res = malloc(buf->n + 1);
    if (!res) {
        tpl_arena_free(&c->arena);
        free(c);
        return ds_error_set(err, DS_ERR_NOMEM, "chat template: out of memory");
    }
    if (buf->n) memcpy(res, buf->p, buf->n);
    res[buf->n] = 0;
    *out = res;
    if (out_len) *out_len = buf->n;
    tpl_arena_free(&c->arena);
    free(c);
    return DS_OK;
}

ds_status ds_chat_template_render_json(const ds_chat_template *t, const char *messages_json,
                                       const char *tools_json, const char *kwargs_json,
                                       bool add_generation_prompt, bool continue_final_message,
                                       const char *bos_token, const char *eos_token, char **out,
                                       size_t *out_len, ds_error *err) {
    *out = NULL;
    cJSON *m = cJSON_Parse(messages_json ? messages_json : "");
    cJSON *tl = tools_json ? cJSON_Parse(tools_json) : NULL;
    cJSON *kw = kwargs_json ? cJSON_Parse(kwargs_json) : NULL;
    ds_status st;
    if (!m)
        st = ds_error_set(err, DS_ERR_INVALID_ARG, "messages: invalid JSON");
    else if (tools_json && !tl)
        st = ds_error_set(err, DS_ERR_INVALID_ARG, "tools: invalid JSON");
    else if (kwargs_json && !kw)
        st = ds_error_set(err, DS_ERR_INVALID_ARG, "chat_template_kwargs: invalid JSON");
    else {
        ds_chat_render_opts o = {.messages = m, .tools = tl, .kwargs = kw,
                                 .add_generation_prompt = add_generation_prompt,
                                 .continue_final_message = continue_final_message,
                                 .bos_token = bos_token, .eos_token = eos_token};
        st = ds_chat_template_render(t, &o, out, out_len, err);
    }
    cJSON_Delete(m);
    cJSON_Delete(tl);
    cJSON_Delete(kw);
    return st;
}
