/* openai_req.c — request body parsing and validation (see openai_req.h). Field semantics follow
 * vLLM's OpenAI server (its extensions top_k, min_p, repetition_penalty, min_tokens,
 * ignore_eos, stop_token_ids, include_stop_str_in_output, skip_special_tokens,
 * chat_template_kwargs, add_generation_prompt, continue_final_message are accepted). */
#include "server/openai_req.h"

#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sampling/json_schema.h"

#define INVALID "invalid_request_error"

void ds_oai_error_set(ds_oai_error *e, int status, const char *type, const char *code,
                      const char *param, const char *fmt, ...) {
    e->status = status;
    e->type = type;
    e->code = code;
    snprintf(e->param, sizeof e->param, "%s", param ? param : "");
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->message, sizeof e->message, fmt, ap);
    va_end(ap);
}

char *ds_oai_error_json(const ds_oai_error *e) {
    cJSON *root = cJSON_CreateObject();
    cJSON *err = cJSON_AddObjectToObject(root, "error");
    cJSON_AddStringToObject(err, "message", e->message);
    cJSON_AddStringToObject(err, "type", e->type ? e->type : INVALID);
    if (e->param[0]) cJSON_AddStringToObject(err, "param", e->param);
    else cJSON_AddNullToObject(err, "param");
    if (e->code) cJSON_AddStringToObject(err, "code", e->code);
    else cJSON_AddNullToObject(err, "code");
    char *s = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    return s;
}

/* 400 invalid_request_error naming `param`. Returns false for `return bad(...)`. */
static bool bad(ds_oai_error *e, const char *param, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static bool bad(ds_oai_error *e, const char *param, const char *fmt, ...) {
    char msg[DS_ERROR_MSG_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    ds_oai_error_set(e, 400, INVALID, NULL, param, "%s", msg);
    return false;
}

static const char *type_name(const cJSON *v) {
    if (cJSON_IsString(v)) return "a string";
    if (cJSON_IsNumber(v)) return "a number";
    if (cJSON_IsBool(v)) return "a boolean";
    if (cJSON_IsArray(v)) return "an array";
    if (cJSON_IsObject(v)) return "an object";
    return "null";
}

/* The field, or NULL when absent or null (OpenAI clients send null for "not set"). */
static const cJSON *field(const cJSON *obj, const char *name) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, name);
    return v && !cJSON_IsNull(v) ? v : NULL;
}

/* Integral JSON number in [lo, hi], kept as a double: the caller converts it to a type that
 * holds [lo, hi] (converting an out-of-range double is undefined behaviour). */
static bool get_integral(const cJSON *obj, const char *name, double lo, double hi, double *out,
                         bool *present, ds_oai_error *e) {
    const cJSON *v = field(obj, name);
    if (present) *present = v != NULL;
    if (!v) return true;
    if (!cJSON_IsNumber(v)) return bad(e, name, "%s must be an integer, got %s", name, type_name(v));
    double d = v->valuedouble;
    if (!isfinite(d) || d != floor(d))
        return bad(e, name, "%s must be an integer, got %g", name, d);
    if (d < lo || d > hi) return bad(e, name, "%s must be in [%.0f, %.0f], got %.0f", name, lo, hi, d);
    *out = d;
    return true;
}

static bool get_int(const cJSON *obj, const char *name, int lo, int hi, int *out, bool *present,
                    ds_oai_error *e) {
    double v = 0;
    bool have = false;
    if (!get_integral(obj, name, lo, hi, &v, &have, e)) return false;
    if (present) *present = have;
    if (have) *out = (int)v;
    return true;
}

/* Any finite JSON number (ranges are ds_sampling_params_validate's business). */
static bool get_float(const cJSON *obj, const char *name, float *out, ds_oai_error *e) {
    const cJSON *v = field(obj, name);
    if (!v) return true;
    if (!cJSON_IsNumber(v)) return bad(e, name, "%s must be a number, got %s", name, type_name(v));
    if (!isfinite(v->valuedouble)) return bad(e, name, "%s must be a finite number", name);
    *out = (float)v->valuedouble;
    return true;
}

static bool get_bool(const cJSON *obj, const char *name, bool *out, ds_oai_error *e) {
    const cJSON *v = field(obj, name);
    if (!v) return true;
    if (!cJSON_IsBool(v)) return bad(e, name, "%s must be a boolean, got %s", name, type_name(v));
    *out = cJSON_IsTrue(v);
    return true;
}

/* ---- prompt (completions) ---------------------------------------------------------------- */

static bool parse_id_array(const cJSON *arr, ds_oai_request *r, ds_oai_error *e) {
    int n = cJSON_GetArraySize(arr);
    if (n == 0) return bad(e, "prompt", "prompt is empty");
    r->prompt_ids = malloc((size_t)n * sizeof(int32_t));
    if (!r->prompt_ids) {
        ds_oai_error_set(e, 500, "server_error", NULL, NULL, "out of memory");
        return false;
    }
    int i = 0;
    for (const cJSON *c = arr->child; c; c = c->next, i++) {
        if (!cJSON_IsNumber(c) || !isfinite(c->valuedouble) || c->valuedouble != floor(c->valuedouble))
            return bad(e, "prompt", "prompt[%d] must be an integer token id, got %s", i, type_name(c));
        if (c->valuedouble < 0 || c->valuedouble > INT32_MAX)
            return bad(e, "prompt", "prompt[%d] = %.0f is not a valid token id", i, c->valuedouble);
        r->prompt_ids[i] = (int32_t)c->valuedouble;
    }
    r->n_prompt_ids = n;
    return true;
}

static bool parse_prompt(const cJSON *root, ds_oai_request *r, ds_oai_error *e) {
    const cJSON *p = field(root, "prompt");
    if (!p) return bad(e, "prompt", "prompt is required");
    if (cJSON_IsString(p)) {
        if (!p->valuestring[0]) return bad(e, "prompt", "prompt is empty");
        r->prompt_text = p->valuestring;
        return true;
    }
    if (!cJSON_IsArray(p))
        return bad(e, "prompt", "prompt must be a string, an array of token ids, or a one-element "
                                "array of those; got %s", type_name(p));
    int n = cJSON_GetArraySize(p);
    if (n == 0) return bad(e, "prompt", "prompt is empty");
    if (cJSON_IsNumber(p->child)) return parse_id_array(p, r, e);
    /* A batch of prompts (strings or id arrays), each its own request with n choices: every
     * element checked here, element 0 selected (the server selects the others in turn) */
    if (n > DS_OAI_MAX_CHOICES)
        return bad(e, "prompt", "at most %d prompts in a batch, got %d", DS_OAI_MAX_CHOICES, n);
    r->n_prompts = n;
    for (int i = n - 1; i >= 0; i--)
        if (!ds_oai_request_select_prompt(r, i, e)) return false;
    return true;
}

bool ds_oai_request_select_prompt(ds_oai_request *r, int index, ds_oai_error *e) {
    const cJSON *p = field(r->root, "prompt");
    const bool batch = cJSON_IsArray(p) && p->child && !cJSON_IsNumber(p->child);
    if (!batch) return index == 0 || bad(e, "prompt", "no prompt %d in the request", index);
    if (index < 0 || index >= r->n_prompts)
        return bad(e, "prompt", "no prompt %d in the request", index);
    const cJSON *el = cJSON_GetArrayItem(p, index);
    free(r->prompt_ids);
    r->prompt_ids = NULL;
    r->n_prompt_ids = 0;
    r->prompt_text = NULL;
    if (cJSON_IsString(el)) {
        if (!el->valuestring[0]) return bad(e, "prompt", "prompt[%d] is empty", index);
        r->prompt_text = el->valuestring;
        return true;
    }
    if (cJSON_IsArray(el)) return parse_id_array(el, r, e);
    return bad(e, "prompt", "prompt[%d] must be a string or an array of token ids, got %s", index,
               type_name(el));
}

/* ---- messages (chat) ----------------------------------------------------------------------- */

/* content: string, null, or an array of {"type": "text", "text": ...} parts (joined). */
static bool parse_content(const cJSON *m, int i, bool may_be_null, ds_oai_request *r,
                          ds_oai_error *e) {
    const cJSON *c = cJSON_GetObjectItemCaseSensitive(m, "content");
    ds_chat_message *msg = &r->messages[i];
    msg->content = "";
    if (!c || cJSON_IsNull(c)) {
        if (!may_be_null) return bad(e, "messages", "messages[%d].content is required", i);
        return true;
    }
    if (cJSON_IsString(c)) {
        msg->content = c->valuestring;
        return true;
    }
    if (!cJSON_IsArray(c))
        return bad(e, "messages", "messages[%d].content must be a string or an array of content "
                                  "parts, got %s", i, type_name(c));
    size_t total = 0;
    int k = 0;
    for (const cJSON *part = c->child; part; part = part->next, k++) {
        const cJSON *type = cJSON_GetObjectItemCaseSensitive(part, "type");
        const cJSON *text = cJSON_GetObjectItemCaseSensitive(part, "text");
        if (!cJSON_IsObject(part) || !cJSON_IsString(type))
            return bad(e, "messages", "messages[%d].content[%d] must be an object with a type", i, k);
        if (strcmp(type->valuestring, "text") != 0)
            return bad(e, "messages", "messages[%d].content[%d]: content parts of type '%s' are not "
                                      "supported (text only)", i, k, type->valuestring);
        if (!cJSON_IsString(text))
            return bad(e, "messages", "messages[%d].content[%d].text must be a string", i, k);
        total += strlen(text->valuestring);
    }
    char *joined = malloc(total + 1);
    if (!joined) {
        ds_oai_error_set(e, 500, "server_error", NULL, NULL, "out of memory");
        return false;
    }
    size_t off = 0;
    for (const cJSON *part = c->child; part; part = part->next) {
        const char *t = cJSON_GetObjectItemCaseSensitive(part, "text")->valuestring;
        size_t n = strlen(t);
        memcpy(joined + off, t, n);
        off += n;
    }
    joined[off] = 0;
    r->joined[i] = joined;
    msg->content = joined;
    return true;
}

static bool parse_tool_calls(const cJSON *m, int i, ds_chat_message *msg, ds_oai_error *e) {
    const cJSON *tcs = field(m, "tool_calls");
    if (!tcs) return true;
    if (!cJSON_IsArray(tcs))
        return bad(e, "messages", "messages[%d].tool_calls must be an array", i);
    int k = 0;
    for (const cJSON *tc = tcs->child; tc; tc = tc->next, k++) {
        const cJSON *fn = cJSON_GetObjectItemCaseSensitive(tc, "function");
        if (!cJSON_IsObject(tc) || !cJSON_IsObject(fn))
            return bad(e, "messages", "messages[%d].tool_calls[%d].function must be an object", i, k);
        const cJSON *name = cJSON_GetObjectItemCaseSensitive(fn, "name");
        const cJSON *args = cJSON_GetObjectItemCaseSensitive(fn, "arguments");
        if (!cJSON_IsString(name))
            return bad(e, "messages", "messages[%d].tool_calls[%d].function.name must be a string",
                       i, k);
        if (args && !cJSON_IsString(args) && !cJSON_IsObject(args))
            return bad(e, "messages", "messages[%d].tool_calls[%d].function.arguments must be a "
                                      "string or an object", i, k);
    }
    msg->tool_calls = tcs;
    return true;
}

static bool parse_messages(const cJSON *root, ds_oai_request *r, ds_oai_error *e) {
    const cJSON *ms = field(root, "messages");
    if (!ms) return bad(e, "messages", "messages is required");
    if (!cJSON_IsArray(ms)) return bad(e, "messages", "messages must be an array, got %s", type_name(ms));
    int n = cJSON_GetArraySize(ms);
    if (n == 0) return bad(e, "messages", "messages must hold at least one message");
    r->messages = calloc((size_t)n, sizeof *r->messages);
    r->joined = calloc((size_t)n, sizeof *r->joined);
    if (!r->messages || !r->joined) {
        ds_oai_error_set(e, 500, "server_error", NULL, NULL, "out of memory");
        return false;
    }
    r->n_messages = n;
    int i = 0;
    for (const cJSON *m = ms->child; m; m = m->next, i++) {
        if (!cJSON_IsObject(m)) return bad(e, "messages", "messages[%d] must be an object", i);
        const cJSON *role = cJSON_GetObjectItemCaseSensitive(m, "role");
        if (!cJSON_IsString(role)) return bad(e, "messages", "messages[%d].role must be a string", i);
        const char *rn = role->valuestring;
        ds_chat_message *msg = &r->messages[i];
        if (!strcmp(rn, "developer")) rn = "system"; /* OpenAI's newer name for system */
        if (strcmp(rn, "system") && strcmp(rn, "user") && strcmp(rn, "assistant") &&
            strcmp(rn, "tool"))
            return bad(e, "messages", "messages[%d].role '%s' is not one of system, developer, "
                                      "user, assistant, tool", i, role->valuestring);
        msg->role = rn;
        bool assistant = !strcmp(rn, "assistant");
        if (!parse_content(m, i, assistant, r, e)) return false;
        if (assistant) {
            if (!parse_tool_calls(m, i, msg, e)) return false;
            const cJSON *rc = field(m, "reasoning_content");
            if (!rc) rc = field(m, "reasoning");
            if (rc && !cJSON_IsString(rc))
                return bad(e, "messages", "messages[%d].reasoning_content must be a string", i);
            msg->reasoning_content = rc ? rc->valuestring : NULL;
        }
    }
    return true;
}

static bool parse_chat_options(const cJSON *root, ds_oai_request *r, ds_oai_error *e) {
    r->chat.add_generation_prompt = true;
    r->chat.enable_thinking = true;
    if (!get_bool(root, "add_generation_prompt", &r->chat.add_generation_prompt, e) ||
        !get_bool(root, "continue_final_message", &r->chat.continue_final_message, e))
        return false;
    if (r->chat.continue_final_message && r->chat.add_generation_prompt &&
        field(root, "add_generation_prompt"))
        return bad(e, "continue_final_message",
                   "continue_final_message and add_generation_prompt cannot both be true");
    const cJSON *kw = field(root, "chat_template_kwargs");
    if (kw) {
        if (!cJSON_IsObject(kw))
            return bad(e, "chat_template_kwargs", "chat_template_kwargs must be an object");
        if (!get_bool(kw, "enable_thinking", &r->chat.enable_thinking, e)) {
            snprintf(e->param, sizeof e->param, "chat_template_kwargs");
            return false;
        }
    }
    const cJSON *tools = field(root, "tools");
    ds_error err = {0};
    if (ds_tools_validate(tools, &err) != DS_OK) return bad(e, "tools", "%s", err.msg);
    if (ds_tool_choice_parse(field(root, "tool_choice"), tools, &r->tool_choice, &err) != DS_OK)
        return bad(e, "tool_choice", "%s", err.msg);
    r->tools = tools;
    /* The prompt lists every tool, or only the one tool_choice names. */
    r->prompt_tools = ds_tools_for_prompt(tools, &r->tool_choice);
    if (tools && !r->prompt_tools && cJSON_GetArraySize(tools) > 0) {
        ds_oai_error_set(e, 500, "server_error", NULL, NULL, "out of memory");
        return false;
    }
    r->chat.tools = r->prompt_tools;
    r->chat.kwargs = kw;
    r->chat.messages_json = field(root, "messages");
    /* chat logprobs: a boolean, with top_logprobs alternatives */
    bool lp = false;
    int top = 0;
    bool top_given = false;
    if (!get_bool(root, "logprobs", &lp, e) ||
        !get_int(root, "top_logprobs", 0, DS_SAMPLING_MAX_LOGPROBS, &top, &top_given, e))
        return false;
    if (top_given && top > 0 && !lp)
        return bad(e, "top_logprobs", "top_logprobs requires logprobs to be true");
    r->logprobs = lp ? top : -1;
    return true;
}

/* ---- common sampling fields ---------------------------------------------------------------- */

static bool parse_stop(const cJSON *root, ds_oai_request *r, ds_oai_error *e) {
    const cJSON *s = field(root, "stop");
    if (s) {
        if (cJSON_IsString(s)) {
            r->stops[0] = s->valuestring;
            r->sp.n_stop = 1;
        } else if (cJSON_IsArray(s)) {
            int n = cJSON_GetArraySize(s);
            if (n > DS_SAMPLING_MAX_STOP)
                return bad(e, "stop", "stop: at most %d stop strings are allowed, got %d",
                           DS_SAMPLING_MAX_STOP, n);
            int i = 0;
            for (const cJSON *c = s->child; c; c = c->next, i++) {
                if (!cJSON_IsString(c)) return bad(e, "stop", "stop[%d] must be a string", i);
                r->stops[i] = c->valuestring;
            }
            r->sp.n_stop = n;
        } else {
            return bad(e, "stop", "stop must be a string or an array of strings, got %s",
                       type_name(s));
        }
        r->sp.stop = r->stops;
    }
    const cJSON *ids = field(root, "stop_token_ids");
    if (ids) {
        if (!cJSON_IsArray(ids)) return bad(e, "stop_token_ids", "stop_token_ids must be an array");
        int n = cJSON_GetArraySize(ids);
        if (n > DS_SAMPLING_MAX_STOP_IDS)
            return bad(e, "stop_token_ids", "stop_token_ids: at most %d ids are allowed, got %d",
                       DS_SAMPLING_MAX_STOP_IDS, n);
        if (n > 0) {
            r->stop_ids = malloc((size_t)n * sizeof(int));
            if (!r->stop_ids) {
                ds_oai_error_set(e, 500, "server_error", NULL, NULL, "out of memory");
                return false;
            }
        }
        int i = 0;
        for (const cJSON *c = ids->child; c; c = c->next, i++) {
            if (!cJSON_IsNumber(c) || c->valuedouble != floor(c->valuedouble) ||
                c->valuedouble < INT_MIN || c->valuedouble > INT_MAX)
                return bad(e, "stop_token_ids", "stop_token_ids[%d] must be an integer", i);
            r->stop_ids[i] = (int)c->valuedouble;
        }
        r->sp.stop_token_ids = r->stop_ids;
        r->sp.n_stop_token_ids = n;
    }
    return true;
}

/* logit_bias: {"<token id>": bias, ...} (OpenAI: ids as decimal strings, bias in [-100, 100];
 * vLLM clamps the bias to that range, so do we). Ids are range-checked against the vocabulary
 * when the engine validates the request; duplicates (the same key twice) are refused there. */
static bool parse_logit_bias(const cJSON *root, ds_oai_request *r, ds_oai_error *e) {
    const cJSON *lb = field(root, "logit_bias");
    if (!lb) return true;
    if (!cJSON_IsObject(lb))
        return bad(e, "logit_bias", "logit_bias must be an object mapping token ids to biases");
    const int n = cJSON_GetArraySize(lb);
    if (n > DS_SAMPLING_MAX_LOGIT_BIAS)
        return bad(e, "logit_bias", "logit_bias: at most %d entries are allowed, got %d",
                   DS_SAMPLING_MAX_LOGIT_BIAS, n);
    if (n == 0) return true;
    r->logit_bias = malloc((size_t)n * sizeof *r->logit_bias);
    if (!r->logit_bias) {
        ds_oai_error_set(e, 500, "server_error", NULL, NULL, "out of memory");
        return false;
    }
    int i = 0;
    for (const cJSON *c = lb->child; c; c = c->next, i++) {
        const char *key = c->string ? c->string : "";
        size_t len = strlen(key);
        bool digits = len >= 1 && len <= 9; /* ≤ 999 999 999: no overflow below */
        for (size_t j = 0; digits && j < len; j++) digits = key[j] >= '0' && key[j] <= '9';
        if (!digits)
            return bad(e, "logit_bias", "logit_bias keys must be token ids (decimal integers), "
                                        "got \"%.40s\"", key);
        if (!cJSON_IsNumber(c) || !isfinite(c->valuedouble))
            return bad(e, "logit_bias", "logit_bias[\"%s\"] must be a number", key);
        const double b = c->valuedouble;
        r->logit_bias[i].id = atoi(key);
        r->logit_bias[i].bias = (float)(b < -DS_SAMPLING_MAX_BIAS  ? -DS_SAMPLING_MAX_BIAS
                                        : b > DS_SAMPLING_MAX_BIAS ? DS_SAMPLING_MAX_BIAS
                                                                   : b);
    }
    r->sp.logit_bias = r->logit_bias;
    r->sp.n_logit_bias = n;
    return true;
}

/* vLLM request fields that change what is generated — constrained decoding (guided_*,
 * structured_outputs), vocabulary limits (allowed_token_ids, bad_words), prompt logprobs,
 * prompt truncation, beam search — which deltaserve does not implement. Unknown fields are
 * ignored (as OpenAI and vLLM do), but ignoring one of these would answer an unconstrained
 * output as if it were constrained: refused by name instead. null counts as absent. */
static bool refuse_vllm_extensions(const cJSON *root, ds_oai_error *e) {
    /* (guided_json and structured_outputs' json / json_object are structured outputs:
     * parse_vllm_structured) */
    static const char *const REFUSED[] = {"guided_regex",      "guided_choice",     "guided_grammar",
                                          "allowed_token_ids", "bad_words",         "prompt_logprobs",
                                          "truncate_prompt_tokens", "logits_processors"};
    for (size_t i = 0; i < sizeof REFUSED / sizeof REFUSED[0]; i++)
        if (field(root, REFUSED[i]))
            return bad(e, REFUSED[i], "%s (a vLLM extension) is not supported by this server",
                       REFUSED[i]);
    const cJSON *beam = field(root, "use_beam_search");
    if (beam && !cJSON_IsFalse(beam))
        return bad(e, "use_beam_search", "use_beam_search is not supported by this server");
    return true;
}

/* JSON output asked for by `where` (NULL schema: JSON mode; else the schema compiled here, so an
 * unsupported one is a 400 naming what, json_schema.h): one way of asking per request. */
static bool use_schema(const cJSON *schema, const char *param, const char *where, ds_oai_request *r,
                       ds_oai_error *e) {
    if (r->json_object)
        return bad(e, param, "%s: the request already asks for JSON output another way "
                             "(response_format, guided_json or structured_outputs: one of them)", where);
    if (!schema) {
        r->json_object = true;
        return true;
    }
    char why[320];
    r->json_schema = ds_json_schema_compile(schema, why, sizeof why);
    if (!r->json_schema) return bad(e, param, "%s: %s", where, why);
    r->json_object = true;
    return true;
}

/* response_format {"type": "json_schema", "json_schema": {"name", "schema", "strict", ...}} */
static bool parse_json_schema(const cJSON *rf, ds_oai_request *r, ds_oai_error *e) {
    const cJSON *js = cJSON_GetObjectItemCaseSensitive(rf, "json_schema");
    const cJSON *schema = cJSON_IsObject(js) ? cJSON_GetObjectItemCaseSensitive(js, "schema") : NULL;
    if (!cJSON_IsObject(schema))
        return bad(e, "response_format", "response_format: type \"json_schema\" needs "
                                         "\"json_schema\": {\"schema\": {...}}");
    return use_schema(schema, "response_format", "response_format.json_schema.schema", r, e);
}

/* vLLM's spellings of the same: guided_json (a schema, or a schema as JSON text) and
 * structured_outputs {"json": schema | text} / {"json_object": true}; its other structured
 * output kinds (regex, choice, grammar, …) are refused by name. */
static bool parse_vllm_structured(const cJSON *root, ds_oai_request *r, ds_oai_error *e) {
    const cJSON *gj = field(root, "guided_json");
    const cJSON *so = field(root, "structured_outputs");
    const char *param = gj ? "guided_json" : "structured_outputs";
    const cJSON *schema = gj;
    if (so) {
        if (gj) return bad(e, "structured_outputs", "guided_json and structured_outputs: one of them");
        if (!cJSON_IsObject(so)) return bad(e, param, "structured_outputs must be an object");
        for (const cJSON *k = so->child; k; k = k->next) {
            if (cJSON_IsNull(k) || !strcmp(k->string, "json") ||
                (!strcmp(k->string, "json_object") && cJSON_IsBool(k)))
                continue;
            return bad(e, param, "structured_outputs.%.40s is not supported by this server (json "
                                 "and json_object are)", k->string);
        }
        schema = field(so, "json");
        const cJSON *jo = field(so, "json_object");
        if (!schema && cJSON_IsTrue(jo)) return use_schema(NULL, param, "structured_outputs.json_object", r, e);
        if (!schema) return true;
    }
    if (!schema) return true;
    cJSON *parsed = NULL;
    if (cJSON_IsString(schema)) { /* a schema as JSON text */
        parsed = cJSON_Parse(schema->valuestring);
        if (!parsed) return bad(e, param, "%s: the schema text is not JSON", param);
        schema = parsed;
    }
    bool ok = cJSON_IsObject(schema) ? use_schema(schema, param, param, r, e)
                                     : bad(e, param, "%s must be a JSON Schema object", param);
    cJSON_Delete(parsed);
    return ok;
}

static bool parse_sampling(const cJSON *root, ds_oai_request *r, ds_oai_error *e) {
    ds_sampling_params *sp = &r->sp;
    if (!refuse_vllm_extensions(root, e)) return false;
    if (!get_float(root, "temperature", &sp->temperature, e) ||
        !get_float(root, "top_p", &sp->top_p, e) || !get_float(root, "min_p", &sp->min_p, e) ||
        !get_float(root, "presence_penalty", &sp->presence_penalty, e) ||
        !get_float(root, "frequency_penalty", &sp->frequency_penalty, e) ||
        !get_float(root, "repetition_penalty", &sp->repetition_penalty, e) ||
        !get_int(root, "top_k", INT_MIN, INT_MAX, &sp->top_k, NULL, e) ||
        !get_int(root, "min_tokens", INT_MIN, INT_MAX, &sp->min_tokens, NULL, e) ||
        !get_bool(root, "ignore_eos", &sp->ignore_eos, e) ||
        !get_bool(root, "include_stop_str_in_output", &sp->include_stop_str_in_output, e) ||
        !get_bool(root, "skip_special_tokens", &r->skip_special_tokens, e) ||
        !get_bool(root, "return_token_ids", &r->return_token_ids, e))
        return false;
    if (sp->top_k < -1) return bad(e, "top_k", "top_k must be -1 (off) or >= 0, got %d", sp->top_k);
    /* response_format (chat and, as vLLM, completions): text, or JSON mode */
    const cJSON *rf = field(root, "response_format");
    if (rf) {
        const cJSON *t = cJSON_GetObjectItemCaseSensitive(rf, "type");
        if (!cJSON_IsObject(rf) || !cJSON_IsString(t))
            return bad(e, "response_format", "response_format must be an object with a string "
                                             "\"type\"");
        if (!strcmp(t->valuestring, "json_object")) {
            r->json_object = true;
        } else if (!strcmp(t->valuestring, "json_schema")) {
            if (!parse_json_schema(rf, r, e)) return false;
        } else if (strcmp(t->valuestring, "text") != 0) {
            return bad(e, "response_format", "response_format: type '%.40s' is not supported "
                       "(\"text\", \"json_object\" or \"json_schema\")", t->valuestring);
        }
    }
    if (!parse_vllm_structured(root, r, e)) return false;

    /* max_tokens / max_completion_tokens (chat's newer name wins when both are given) */
    bool have = false;
    int mt = 0;
    if (r->kind == DS_OAI_CHAT) {
        if (!get_int(root, "max_completion_tokens", INT_MIN, INT_MAX, &mt, &have, e)) return false;
        if (have) r->max_tokens_param = "max_completion_tokens";
    }
    if (!have) {
        if (!get_int(root, "max_tokens", INT_MIN, INT_MAX, &mt, &have, e)) return false;
        r->max_tokens_param = "max_tokens";
    }
    r->max_tokens_given = have;
    /* chat without a limit: the room left in the context, known once the prompt is tokenised */
    if (!have && r->kind == DS_OAI_CHAT) sp->max_tokens = INT_MAX;
    if (have) {
        if (mt < 1)
            return bad(e, r->max_tokens_param, "%s must be at least 1, got %d",
                       r->max_tokens_param, mt);
        sp->max_tokens = mt;
    }

    /* Seeds are int64 in OpenAI's API and uint64 in some clients: accept both ranges; a
     * negative seed keeps its two's-complement bits. */
    double seed = 0;
    bool seed_given = false;
    if (!get_integral(root, "seed", -9.2e18, 1.8e19, &seed, &seed_given, e)) return false;
    if (seed_given) {
        sp->has_seed = true;
        sp->seed = seed < 0 ? (uint64_t)(int64_t)seed : (uint64_t)seed;
    }

    int n = 1;
    if (!get_int(root, "n", INT_MIN, INT_MAX, &n, NULL, e)) return false;
    if (n < 1 || n > DS_OAI_MAX_N) return bad(e, "n", "n must be in [1, %d], got %d", DS_OAI_MAX_N, n);
    if (n * r->n_prompts > DS_OAI_MAX_CHOICES)
        return bad(e, "n", "n (%d) times the prompts in the batch (%d) is over the %d choices a "
                           "request may have", n, r->n_prompts, DS_OAI_MAX_CHOICES);
    r->n = n;
    int best_of = 1;
    if (!get_int(root, "best_of", INT_MIN, INT_MAX, &best_of, NULL, e)) return false;
    if (best_of != 1) return bad(e, "best_of", "best_of other than 1 is not supported");
    if (!parse_logit_bias(root, r, e) || !parse_stop(root, r, e)) return false;

    if (!get_bool(root, "stream", &r->stream, e)) return false;
    const cJSON *so = field(root, "stream_options");
    if (so) {
        if (!cJSON_IsObject(so)) return bad(e, "stream_options", "stream_options must be an object");
        if (!r->stream)
            return bad(e, "stream_options", "stream_options can only be set when stream is true");
        if (!get_bool(so, "include_usage", &r->include_usage, e) ||
            !get_bool(so, "continuous_usage_stats", &r->continuous_usage, e)) {
            snprintf(e->param, sizeof e->param, "stream_options");
            return false;
        }
    }
    return true;
}

static void param_from_message(const char *msg, char *param, size_t cap) {
    size_t n = strcspn(msg, " [:(");
    if (n >= cap) n = cap - 1;
    memcpy(param, msg, n);
    param[n] = 0;
}

bool ds_oai_parse(ds_oai_kind kind, const char *body, size_t len, ds_oai_request *r,
                  ds_oai_error *e) {
    return ds_oai_parse_with(kind, body, len, NULL, r, e);
}

ds_status ds_oai_defaults_load(const char *model_dir, ds_oai_defaults *d, ds_error *err) {
    memset(d, 0, sizeof *d);
    char path[4096];
    snprintf(path, sizeof path, "%s/generation_config.json", model_dir);
    FILE *f = fopen(path, "rb");
    if (!f) return DS_OK;
    char *text = NULL;
    size_t n = 0, cap = 0;
    for (;;) {
        if (n + 4096 > cap) {
            cap = cap ? 2 * cap : 8192;
            if (cap > (1u << 24)) break; /* a generation config is tiny: refuse absurd files */
            char *t = realloc(text, cap + 1);
            if (!t) break;
            text = t;
        }
        size_t got = fread(text + n, 1, cap - n, f);
        n += got;
        if (got == 0) break;
    }
    fclose(f);
    cJSON *root = text ? cJSON_ParseWithLength(text, n) : NULL;
    free(text);
    if (!cJSON_IsObject(root)) {
        cJSON_Delete(root);
        return ds_error_set(err, DS_ERR_FORMAT, "%s: not a JSON object", path);
    }
    static const char *const names[] = {"temperature", "top_p", "top_k", "min_p",
                                        "repetition_penalty"};
    for (int i = 0; i < 5; i++) {
        const cJSON *v = field(root, names[i]);
        if (!v) continue;
        if (!cJSON_IsNumber(v) || !isfinite(v->valuedouble)) {
            cJSON_Delete(root);
            return ds_error_set(err, DS_ERR_FORMAT, "%s: %s must be a number", path, names[i]);
        }
        double value = v->valuedouble;
        if (i == 2 && !(value >= INT_MIN && value <= INT_MAX)) {
            cJSON_Delete(root); /* (int) of a double out of range is undefined behaviour */
            return ds_error_set(err, DS_ERR_FORMAT, "%s: top_k = %g is out of range", path, value);
        }
        float x = (float)v->valuedouble;
        switch (i) {
        case 0: d->has_temperature = true; d->temperature = x; break;
        case 1: d->has_top_p = true; d->top_p = x; break;
        case 2: d->has_top_k = true; d->top_k = (int)v->valuedouble; break;
        case 3: d->has_min_p = true; d->min_p = x; break;
        default: d->has_repetition_penalty = true; d->repetition_penalty = x; break;
        }
    }
    cJSON_Delete(root);
    return DS_OK;
}

bool ds_oai_parse_with(ds_oai_kind kind, const char *body, size_t len, const ds_oai_defaults *d,
                       ds_oai_request *r, ds_oai_error *e) {
    memset(r, 0, sizeof *r);
    r->kind = kind;
    r->logprobs = -1;
    r->n = 1;
    r->n_prompts = 1;
    r->skip_special_tokens = true;
    ds_sampling_params_init(&r->sp);
    r->sp.temperature = 1.0f; /* OpenAI default */
    r->sp.max_tokens = 16;    /* completions default; chat overrides from the context */
    if (d) {
        if (d->has_temperature) r->sp.temperature = d->temperature;
        if (d->has_top_p) r->sp.top_p = d->top_p;
        if (d->has_top_k) r->sp.top_k = d->top_k;
        if (d->has_min_p) r->sp.min_p = d->min_p;
        if (d->has_repetition_penalty) r->sp.repetition_penalty = d->repetition_penalty;
    }
    r->root = cJSON_ParseWithLength(body, len);
    if (!r->root) return bad(e, NULL, "the request body is not valid JSON");
    const cJSON *root = r->root;
    if (!cJSON_IsObject(root)) return bad(e, NULL, "the request body must be a JSON object");

    const cJSON *model = field(root, "model");
    if (model) {
        if (!cJSON_IsString(model)) return bad(e, "model", "model must be a string");
        r->model = model->valuestring;
    }
    if (kind == DS_OAI_COMPLETIONS) {
        if (!parse_prompt(root, r, e)) return false;
        if (!get_bool(root, "echo", &r->echo, e)) return false;
        const cJSON *suffix = field(root, "suffix");
        if (suffix) return bad(e, "suffix", "suffix is not supported");
        int lp = -1;
        bool given = false;
        if (!get_int(root, "logprobs", 0, DS_SAMPLING_MAX_LOGPROBS, &lp, &given, e)) return false;
        r->logprobs = given ? lp : -1;
    } else {
        if (!parse_messages(root, r, e) || !parse_chat_options(root, r, e)) return false;
        if (r->chat.continue_final_message) r->chat.add_generation_prompt = false;
    }
    if (!parse_sampling(root, r, e)) return false;
    if (r->echo && r->logprobs >= 0)
        return bad(e, "echo", "echo together with logprobs (prompt logprobs) is not supported");
    r->sp.logprobs = r->logprobs;

    ds_error err = {0};
    if (ds_sampling_params_validate(&r->sp, 0, &err) != DS_OK) {
        char param[64];
        param_from_message(err.msg, param, sizeof param);
        if (!strcmp(param, "max_tokens") && r->max_tokens_param) snprintf(param, sizeof param, "%s", r->max_tokens_param);
        if (!strcmp(param, "logprobs") && kind == DS_OAI_CHAT) snprintf(param, sizeof param, "top_logprobs");
        return bad(e, param, "%s", err.msg);
    }
    return true;
}

void ds_oai_request_free(ds_oai_request *r) {
    if (r->joined)
        for (int i = 0; i < r->n_messages; i++) free(r->joined[i]);
    free(r->joined);
    free(r->messages);
    free(r->prompt_ids);
    free(r->stop_ids);
    free(r->logit_bias);
    cJSON_Delete(r->prompt_tools);
    cJSON_Delete(r->root);
    ds_json_schema_unref(r->json_schema);
    memset(r, 0, sizeof *r);
}
