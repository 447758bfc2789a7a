/* chat_template_fmt.c — the ds_chat_formatter that renders the checkpoint's own chat template
 * (src/template/chat_template.h), as vLLM / transformers do; the built-in Qwen3.5 Jinja text
 * stands in when the checkpoint has none.
 *
 * Per request the message list is rebuilt from the body's "messages": roles as the request
 * parser mapped them (developer → system), contents as joined from text parts, and tool-call
 * arguments given as JSON text turned into objects (templates written for transformers expect
 * objects there; vLLM does the same). */
#include <stdlib.h>
#include <string.h>

#include "server/chat_format.h"
#include "template/chat_template.h"

typedef struct tpl_fmt {
    ds_chat_template *tpl;      /* the default template */
    ds_chat_template *tool_tpl; /* the "tool_use" template, NULL if none */
    char *bos, *eos;            /* NULL when the checkpoint names none */
} tpl_fmt;

/* The messages the template sees (a new array), or NULL on OOM. */
static cJSON *build_messages(const ds_chat_message *m, int n, const cJSON *src) {
    cJSON *msgs = cJSON_CreateArray();
    if (!msgs) return NULL;
    const cJSON *sm = cJSON_IsArray(src) ? src->child : NULL;
    for (int i = 0; i < n; i++, sm = sm ? sm->next : NULL) {
        cJSON *o = sm ? cJSON_Duplicate(sm, true) : cJSON_CreateObject();
        if (!o || !cJSON_AddItemToArray(msgs, o)) {
            cJSON_Delete(o);
            cJSON_Delete(msgs);
            return NULL;
        }
        cJSON_DeleteItemFromObjectCaseSensitive(o, "role");
        cJSON_DeleteItemFromObjectCaseSensitive(o, "content");
        if (!cJSON_AddStringToObject(o, "role", m[i].role) ||
            !cJSON_AddStringToObject(o, "content", m[i].content)) {
            cJSON_Delete(msgs);
            return NULL;
        }
    }
    ds_chat_messages_parse_arguments(msgs);
    return msgs;
}

static ds_status tpl_render(const ds_chat_formatter *f, const ds_chat_message *m, int n,
                            const ds_chat_opts *o, ds_strbuf *out, bool *reasoning_open,
                            ds_error *err) {
    const tpl_fmt *t = f->impl;
    *reasoning_open = false;
    if (n < 1) return ds_error_set(err, DS_ERR_INVALID_ARG, "messages: at least one message is required");
    if (o->continue_final_message && strcmp(m[n - 1].role, "assistant") != 0)
        return ds_error_set(err, DS_ERR_INVALID_ARG,
                            "continue_final_message: the last message must be an assistant message");
    bool have_tools = cJSON_IsArray(o->tools) && cJSON_GetArraySize(o->tools) > 0;
    const ds_chat_template *tpl = have_tools && t->tool_tpl ? t->tool_tpl : t->tpl;
    cJSON *msgs = build_messages(m, n, o->messages_json);
    if (!msgs) return ds_error_set(err, DS_ERR_NOMEM, "chat prompt: out of memory");
    ds_chat_render_opts ro = {
        .messages = msgs,
        .tools = have_tools ? o->tools : NULL,
        .kwargs = o->kwargs,
        .add_generation_prompt = o->add_generation_prompt && !o->continue_final_message,
        .continue_final_message = o->continue_final_message,
        .bos_token = t->bos,
        .eos_token = t->eos,
        .python_numbers = true,
    };
    char *text = NULL;
    size_t len = 0;
    ds_status st = ds_chat_template_render(tpl, &ro, &text, &len, err);
    cJSON_Delete(msgs);
    if (st != DS_OK) return st;
    *reasoning_open = ds_chat_prompt_opens_reasoning(text, len);
    ds_strbuf_append(out, text, len);
    free(text);
    if (!ds_strbuf_ok(out)) return ds_error_set(err, DS_ERR_NOMEM, "chat prompt: out of memory");
    return DS_OK;
}

void ds_chat_formatter_free(ds_chat_formatter *f) {
    if (!f) return;
    tpl_fmt *t = f->impl;
    if (t) {
        ds_chat_template_free(t->tpl);
        ds_chat_template_free(t->tool_tpl);
        free(t->bos);
        free(t->eos);
        free(t);
    }
    free(f);
}

static ds_status compile(const char *text, const char *what, const char *origin,
                         ds_chat_template **out, ds_error *err) {
    ds_status st = ds_chat_template_compile(text, strlen(text), out, err);
    if (st != DS_OK) {
        ds_error inner = *err;
        return ds_error_set(err, st, "chat template (%s, %s): %s", what, origin, inner.msg);
    }
    return DS_OK;
}

ds_status ds_chat_formatter_from_dir(const char *model_dir, ds_chat_formatter **out, ds_error *err) {
    *out = NULL;
    ds_chat_source src = {0};
    ds_status st = ds_chat_source_load(model_dir, &src, err);
    if (st != DS_OK) return st;
    ds_chat_formatter *f = calloc(1, sizeof *f);
    tpl_fmt *t = calloc(1, sizeof *t);
    if (!f || !t) {
        free(f);
        free(t);
        ds_chat_source_free(&src);
        return ds_error_set(err, DS_ERR_NOMEM, "chat template: out of memory");
    }
    f->impl = t;
    f->render = tpl_render;
    f->reasoning_end = "</think>";
    const char *text = ds_chat_source_pick(&src, false);
    bool builtin = !text;
    if (builtin) text = ds_chat_template_qwen35_fallback();
    f->name = builtin ? "built-in qwen3.5" : "checkpoint";
    f->tool_format = ds_tool_format_detect(builtin ? NULL : text);
    st = compile(text, "default", builtin ? "built-in" : src.origin, &t->tpl, err);
    if (st == DS_OK && src.tool_template_text)
        st = compile(src.tool_template_text, "tool_use", src.origin, &t->tool_tpl, err);
    /* keep the token strings (taken over from src) */
    t->bos = src.bos_token;
    t->eos = src.eos_token;
    src.bos_token = src.eos_token = NULL;
    ds_chat_source_free(&src);
    if (st != DS_OK) {
        ds_chat_formatter_free(f);
        return st;
    }
    *out = f;
    return DS_OK;
}
