#include "server/openai_resp.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

void ds_utf8_lossy(ds_strbuf *out, const char *str, size_t n) {
    const unsigned char *s = (const unsigned char *)str;
    size_t i = 0, run = 0;
    while (i < n) {
        unsigned char c = s[i];
        size_t need;
        unsigned lo = 0x80, hi = 0xBF; /* allowed range of the second byte */
        if (c < 0x80) { i++; continue; }
        else if (c >= 0xC2 && c <= 0xDF) need = 1;
        else if (c == 0xE0) { need = 2; lo = 0xA0; }
        else if (c >= 0xE1 && c <= 0xEC) need = 2;
        else if (c == 0xED) { need = 2; hi = 0x9F; }
        else if (c >= 0xEE && c <= 0xEF) need = 2;
        else if (c == 0xF0) { need = 3; lo = 0x90; }
        else if (c >= 0xF1 && c <= 0xF3) need = 3;
        else if (c == 0xF4) { need = 3; hi = 0x8F; }
        else need = 0;
        /* the maximal valid prefix of this sequence */
        size_t k = 0;
        while (need && k < need && i + 1 + k < n) {
            unsigned char b = s[i + 1 + k];
            unsigned l = k == 0 ? lo : 0x80, h = k == 0 ? hi : 0xBF;
            if (b < l || b > h) break;
            k++;
        }
        if (need && k == need) {
            i += 1 + need;
            continue;
        }
        ds_strbuf_append(out, str + run, i - run);
        ds_strbuf_puts(out, "\xEF\xBF\xBD");
        i += 1 + k;
        run = i;
    }
    ds_strbuf_append(out, str + run, n - run);
}

static double clamp_lp(float lp) { return isfinite(lp) ? (double)lp : -9999.0; }

/* The token's display string (lossy UTF-8) into a fresh buffer; raw bytes via raw / raw_len. */
static void token_string(const ds_tokenizer *tok, int32_t id, ds_strbuf *s, const char **raw,
                         size_t *raw_len) {
    ds_strbuf_clear(s);
    size_t n = 0;
    const char *b = ds_tokenizer_token_bytes(tok, id, &n);
    if (!b) {
        b = "";
        n = 0;
    }
    ds_utf8_lossy(s, b, n);
    if (!s->data) ds_strbuf_puts(s, "");
    *raw = b;
    *raw_len = n;
}

static cJSON *bytes_array(const char *raw, size_t n) {
    cJSON *a = cJSON_CreateArray();
    for (size_t i = 0; i < n; i++) cJSON_AddItemToArray(a, cJSON_CreateNumber((unsigned char)raw[i]));
    return a;
}

/* completions: {"tokens","token_logprobs","top_logprobs":[{tok: lp}],"text_offset"} */
static cJSON *logprobs_completion(const ds_oai_resp_ctx *c, const ds_gen_token *t, int n) {
    cJSON *o = cJSON_CreateObject();
    cJSON *tokens = cJSON_AddArrayToObject(o, "tokens");
    cJSON *lps = cJSON_AddArrayToObject(o, "token_logprobs");
    cJSON *tops = cJSON_AddArrayToObject(o, "top_logprobs");
    cJSON *offs = cJSON_AddArrayToObject(o, "text_offset");
    ds_strbuf s;
    ds_strbuf_init(&s);
    const char *raw;
    size_t raw_len;
    for (int i = 0; i < n; i++) {
        token_string(c->tok, t[i].id, &s, &raw, &raw_len);
        cJSON_AddItemToArray(tokens, cJSON_CreateString(s.data));
        cJSON_AddItemToArray(lps, cJSON_CreateNumber(clamp_lp(t[i].s.logprob)));
        cJSON *top = cJSON_CreateObject();
        /* the chosen token first, then the alternatives (one entry per distinct string) */
        cJSON_AddNumberToObject(top, s.data, clamp_lp(t[i].s.logprob));
        for (int k = 0; k < t[i].s.n_top && k < c->logprobs; k++) {
            token_string(c->tok, t[i].s.top_ids[k], &s, &raw, &raw_len);
            if (!cJSON_GetObjectItemCaseSensitive(top, s.data))
                cJSON_AddNumberToObject(top, s.data, clamp_lp(t[i].s.top_logprobs[k]));
        }
        cJSON_AddItemToArray(tops, top);
        cJSON_AddItemToArray(offs, cJSON_CreateNumber((double)t[i].text_offset));
    }
    ds_strbuf_free(&s);
    return o;
}

/* chat: {"content":[{"token","logprob","bytes","top_logprobs":[{"token","logprob","bytes"}]}]} */
static cJSON *logprobs_chat(const ds_oai_resp_ctx *c, const ds_gen_token *t, int n) {
    cJSON *o = cJSON_CreateObject();
    cJSON *content = cJSON_AddArrayToObject(o, "content");
    ds_strbuf s;
    ds_strbuf_init(&s);
    const char *raw;
    size_t raw_len;
    for (int i = 0; i < n; i++) {
        cJSON *e = cJSON_CreateObject();
        token_string(c->tok, t[i].id, &s, &raw, &raw_len);
        cJSON_AddStringToObject(e, "token", s.data);
        cJSON_AddNumberToObject(e, "logprob", clamp_lp(t[i].s.logprob));
        cJSON_AddItemToObject(e, "bytes", bytes_array(raw, raw_len));
        cJSON *tops = cJSON_AddArrayToObject(e, "top_logprobs");
        for (int k = 0; k < t[i].s.n_top && k < c->logprobs; k++) {
            cJSON *a = cJSON_CreateObject();
            token_string(c->tok, t[i].s.top_ids[k], &s, &raw, &raw_len);
            cJSON_AddStringToObject(a, "token", s.data);
            cJSON_AddNumberToObject(a, "logprob", clamp_lp(t[i].s.top_logprobs[k]));
            cJSON_AddItemToObject(a, "bytes", bytes_array(raw, raw_len));
            cJSON_AddItemToArray(tops, a);
        }
        cJSON_AddItemToArray(content, e);
    }
    ds_strbuf_free(&s);
    return o;
}

static cJSON *logprobs_json(const ds_oai_resp_ctx *c, const ds_gen_token *t, int n) {
    if (c->logprobs < 0) return cJSON_CreateNull();
    return c->kind == DS_OAI_CHAT ? logprobs_chat(c, t, n) : logprobs_completion(c, t, n);
}

static cJSON *id_array(const int32_t *ids, int n) {
    cJSON *a = cJSON_CreateArray();
    for (int i = 0; i < n; i++) cJSON_AddItemToArray(a, cJSON_CreateNumber(ids[i]));
    return a;
}

static cJSON *tok_ids(const ds_gen_token *t, int n) {
    cJSON *a = cJSON_CreateArray();
    for (int i = 0; i < n; i++) cJSON_AddItemToArray(a, cJSON_CreateNumber(t[i].id));
    return a;
}

static cJSON *usage_json(ds_oai_usage x) {
    cJSON *u = cJSON_CreateObject();
    cJSON_AddNumberToObject(u, "prompt_tokens", x.n_prompt);
    cJSON_AddNumberToObject(u, "total_tokens", x.n_prompt + x.n_gen);
    cJSON_AddNumberToObject(u, "completion_tokens", x.n_gen);
    cJSON *d = cJSON_AddObjectToObject(u, "prompt_tokens_details");
    cJSON_AddNumberToObject(d, "cached_tokens", x.n_cached);
    return u;
}

static cJSON *envelope(const ds_oai_resp_ctx *c, const char *object) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "id", c->id);
    cJSON_AddStringToObject(o, "object", object);
    cJSON_AddNumberToObject(o, "created", (double)c->created);
    cJSON_AddStringToObject(o, "model", c->model);
    return o;
}

static void add_finish(cJSON *choice, const ds_oai_result *r) {
    if (r && r->finish_reason) cJSON_AddStringToObject(choice, "finish_reason", r->finish_reason);
    else cJSON_AddNullToObject(choice, "finish_reason");
    if (r && r->stop_str) cJSON_AddStringToObject(choice, "stop_reason", r->stop_str);
    else if (r && r->stop_token >= 0) cJSON_AddNumberToObject(choice, "stop_reason", r->stop_token);
    else cJSON_AddNullToObject(choice, "stop_reason");
}

static char *print_free(cJSON *o) {
    char *s = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    return s;
}

const char *ds_oai_finish_reason(const char *reason, const ds_tool_parser *tools) {
    if (reason && !strcmp(reason, "stop") && tools && ds_tool_parser_n_calls(tools) > 0)
        return "tool_calls";
    return reason;
}

/* Choice `index` of a finished response. */
static cJSON *choice_json(const ds_oai_resp_ctx *c, const ds_oai_result *r, int index) {
    bool chat = c->kind == DS_OAI_CHAT;
    cJSON *ch = cJSON_CreateObject();
    cJSON_AddNumberToObject(ch, "index", index);
    if (chat) {
        cJSON *m = cJSON_AddObjectToObject(ch, "message");
        cJSON_AddStringToObject(m, "role", "assistant");
        size_t n_calls = r->tools ? ds_tool_parser_n_calls(r->tools) : 0;
        /* content is null when the model only called tools */
        if (n_calls && (!r->text || !r->text[0])) cJSON_AddNullToObject(m, "content");
        else cJSON_AddStringToObject(m, "content", r->text ? r->text : "");
        if (r->reasoning) cJSON_AddStringToObject(m, "reasoning_content", r->reasoning);
        else cJSON_AddNullToObject(m, "reasoning_content");
        cJSON *calls = cJSON_AddArrayToObject(m, "tool_calls");
        for (size_t i = 0; i < n_calls; i++) {
            const ds_tool_call *tc = ds_tool_parser_call(r->tools, i);
            cJSON *call = cJSON_CreateObject();
            cJSON_AddStringToObject(call, "id", tc->id);
            cJSON_AddStringToObject(call, "type", "function");
            cJSON *fn = cJSON_AddObjectToObject(call, "function");
            cJSON_AddStringToObject(fn, "name", tc->name);
            cJSON_AddStringToObject(fn, "arguments", tc->arguments);
            cJSON_AddItemToArray(calls, call);
        }
    } else {
        cJSON_AddStringToObject(ch, "text", r->text ? r->text : "");
    }
    cJSON_AddItemToObject(ch, "logprobs", logprobs_json(c, r->toks, r->n_toks));
    add_finish(ch, r);
    if (c->return_token_ids) {
        cJSON_AddItemToObject(ch, "token_ids", tok_ids(r->toks, r->n_toks));
        if (!chat) cJSON_AddItemToObject(ch, "prompt_token_ids", id_array(c->prompt_ids, c->n_prompt_ids));
    }
    return ch;
}

char *ds_oai_response_json_n(const ds_oai_resp_ctx *c, const ds_oai_result *r, int n,
                             int per_prompt) {
    bool chat = c->kind == DS_OAI_CHAT;
    cJSON *o = envelope(c, chat ? "chat.completion" : "text_completion");
    cJSON *choices = cJSON_AddArrayToObject(o, "choices");
    ds_oai_usage u = {0};
    for (int i = 0; i < n; i++) {
        cJSON_AddItemToArray(choices, choice_json(c, &r[i], i));
        if (i % per_prompt == 0) {
            u.n_prompt += r[i].n_prompt;
            u.n_cached += r[i].n_cached; /* the prompt's first choice's (vLLM counts it once) */
        }
        u.n_gen += r[i].n_gen;
    }
    if (chat && c->return_token_ids)
        cJSON_AddItemToObject(o, "prompt_token_ids", id_array(c->prompt_ids, c->n_prompt_ids));
    /* each prompt once (n samples of it), the completions summed (as vLLM) */
    cJSON_AddItemToObject(o, "usage", usage_json(u));
    return print_free(o);
}

char *ds_oai_response_json(const ds_oai_resp_ctx *c, const ds_oai_result *r) {
    return ds_oai_response_json_n(c, r, 1, 1);
}

/* One SSE event "data: <json>\n\n" from printed JSON s (taken: freed here; NULL = out of
 * memory). */
static void sse_append_text(ds_strbuf *out, char *s) {
    if (!s) {
        out->oom = true;
        return;
    }
    ds_strbuf_puts(out, "data: ");
    ds_strbuf_puts(out, s);
    ds_strbuf_puts(out, "\n\n");
    free(s);
}

static void sse_append(ds_strbuf *out, cJSON *o) { sse_append_text(out, print_free(o)); }

void ds_oai_chunk(ds_strbuf *out, const ds_oai_resp_ctx *c, bool role, const char *reasoning,
                  const char *content, const ds_gen_token *toks, int n_toks,
                  const ds_oai_result *fin, ds_oai_usage u) {
    bool chat = c->kind == DS_OAI_CHAT;
    cJSON *o = envelope(c, chat ? "chat.completion.chunk" : "text_completion");
    cJSON *choices = cJSON_AddArrayToObject(o, "choices");
    cJSON *ch = cJSON_CreateObject();
    cJSON_AddNumberToObject(ch, "index", c->index);
    if (chat) {
        cJSON *d = cJSON_AddObjectToObject(ch, "delta");
        if (role) cJSON_AddStringToObject(d, "role", "assistant");
        if (reasoning) cJSON_AddStringToObject(d, "reasoning_content", reasoning);
        if (content || role) cJSON_AddStringToObject(d, "content", content ? content : "");
    } else {
        cJSON_AddStringToObject(ch, "text", content ? content : "");
    }
    if (n_toks > 0 && c->logprobs >= 0) cJSON_AddItemToObject(ch, "logprobs", logprobs_json(c, toks, n_toks));
    else cJSON_AddNullToObject(ch, "logprobs");
    add_finish(ch, fin);
    if (c->return_token_ids) cJSON_AddItemToObject(ch, "token_ids", tok_ids(toks, n_toks));
    cJSON_AddItemToArray(choices, ch);
    if (c->continuous_usage) cJSON_AddItemToObject(o, "usage", usage_json(u));
    else if (c->include_usage) cJSON_AddNullToObject(o, "usage");
    sse_append(out, o);
}

void ds_oai_tool_chunk(ds_strbuf *out, const ds_oai_resp_ctx *c, const cJSON *deltas,
                       const ds_gen_token *toks, int n_toks, ds_oai_usage u) {
    cJSON *o = envelope(c, "chat.completion.chunk");
    cJSON *choices = cJSON_AddArrayToObject(o, "choices");
    cJSON *ch = cJSON_CreateObject();
    cJSON_AddNumberToObject(ch, "index", c->index);
    cJSON *d = cJSON_AddObjectToObject(ch, "delta");
    cJSON_AddItemToObject(d, "tool_calls", cJSON_Duplicate(deltas, true));
    if (n_toks > 0 && c->logprobs >= 0) cJSON_AddItemToObject(ch, "logprobs", logprobs_json(c, toks, n_toks));
    else cJSON_AddNullToObject(ch, "logprobs");
    add_finish(ch, NULL);
    if (c->return_token_ids) cJSON_AddItemToObject(ch, "token_ids", tok_ids(toks, n_toks));
    cJSON_AddItemToArray(choices, ch);
    if (c->continuous_usage) cJSON_AddItemToObject(o, "usage", usage_json(u));
    else if (c->include_usage) cJSON_AddNullToObject(o, "usage");
    sse_append(out, o);
}

void ds_oai_usage_chunk(ds_strbuf *out, const ds_oai_resp_ctx *c, ds_oai_usage u) {
    cJSON *o = envelope(c, c->kind == DS_OAI_CHAT ? "chat.completion.chunk" : "text_completion");
    cJSON_AddArrayToObject(o, "choices");
    cJSON_AddItemToObject(o, "usage", usage_json(u));
    sse_append(out, o);
}

void ds_oai_error_event(ds_strbuf *out, const ds_oai_error *e) {
    sse_append_text(out, ds_oai_error_json(e));
}
