/* Streaming parser of generated text into content, reasoning and tool calls (see tool_calls.h).
 *
 * Input accumulates in `pend`; each state consumes what it can decide on and leaves the rest
 * (a possibly partial tag, trailing whitespace whose fate depends on what follows) for the next
 * push. Events are collected per push and merged when adjacent and of the same kind. */
#include "chat/tool_calls.h"

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "chat/tc_internal.h"
#include "template/chat_template.h"

#define MAX_NAME 256

typedef enum pstate {
    P_TEXT,        /* content */
    P_THINK,       /* reasoning */
    P_CALL_START,  /* after <tool_call>: which form? */
    P_JSON,        /* JSON form, until </tool_call> */
    P_FUNC_NAME,   /* after <function= */
    P_BODY,        /* inside <function=...>: parameters or the end */
    P_PARAM_NAME,  /* after <parameter= */
    P_PARAM_VALUE, /* until </parameter> */
    P_AFTER_FUNC,  /* after </function>: </tool_call> (or another <function=) */
} pstate;

typedef struct ev {
    ds_tc_event_kind kind;
    int index;
    size_t off, len; /* text in evtext */
} ev;

struct ds_tool_parser {
    bool parse_calls;
    cJSON *tools;
    char *id_prefix;
    uint64_t id_rng;
    pstate st;
    tc_buf pend;       /* input not consumed yet */
    bool any_content;  /* non-whitespace content was emitted (a later <think> is text) */
    bool think_start;  /* drop newlines at the start of the reasoning */
    tc_buf think_nl;   /* trailing newlines of the reasoning, held */
    bool after_think;  /* drop newlines at the start of the content */
    bool after_call;   /* drop whitespace at the start of the content */
    tc_buf ws;         /* trailing whitespace of the content, held */
    tc_buf raw;        /* text of the call block so far (returned as content if malformed) */
    size_t raw_ws;     /* raw starts with this much whitespace that preceded <tool_call> */
    tc_buf fname, pname;
    tc_buf pnames;     /* "\n"-separated names of the parameters emitted in this call */
    int n_params;
    /* results */
    tc_buf content, reasoning;
    ds_tool_call *calls;
    tc_buf *args; /* [n_calls] */
    size_t n_calls, cap_calls;
    /* events of the current push */
    ev *evs;
    size_t n_evs, cap_evs;
    tc_buf evtext;
    bool carry_events; /* the prefill's events are reported with the first push */
    ds_tc_event *out;
    size_t cap_out;
    bool oom;
};

static const char T_CALL[] = "<tool_call>", T_CALL_END[] = "</tool_call>", T_THINK[] = "<think>",
                  T_THINK_END[] = "</think>", T_FUNC[] = "<function=", T_FUNC_END[] = "</function>",
                  T_PARAM[] = "<parameter=", T_PARAM_END[] = "</parameter>";

/* ---- events ---------------------------------------------------------------------------------- */

static void add_event(ds_tool_parser *p, ds_tc_event_kind kind, int index, const char *s, size_t n) {
    if (kind != DS_TC_CALL_BEGIN && kind != DS_TC_CALL_END && n == 0) return;
    if (p->n_evs && (kind == DS_TC_CONTENT || kind == DS_TC_REASONING || kind == DS_TC_CALL_ARGS)) {
        ev *last = &p->evs[p->n_evs - 1];
        if (last->kind == kind && last->index == index && last->off + last->len == p->evtext.n) {
            tc_put(&p->evtext, s, n);
            last->len += n;
            return;
        }
    }
    if (p->n_evs == p->cap_evs) {
        size_t cap = p->cap_evs ? p->cap_evs * 2 : 16;
        ev *e = realloc(p->evs, cap * sizeof *e);
        if (!e) {
            p->oom = true;
            return;
        }
        p->evs = e;
        p->cap_evs = cap;
    }
    ev *e = &p->evs[p->n_evs++];
    e->kind = kind;
    e->index = index;
    e->off = p->evtext.n;
    e->len = n;
    tc_put(&p->evtext, s, n);
}

static void emit_reasoning(ds_tool_parser *p, const char *s, size_t n) {
    if (!n) return;
    tc_put(&p->reasoning, s, n);
    add_event(p, DS_TC_REASONING, -1, s, n);
}

static bool is_ws(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

/* Content, with its whitespace rules: leading newlines dropped after </think>, leading
 * whitespace dropped after a call, trailing whitespace held until we know no call follows. */
static void emit_content(ds_tool_parser *p, const char *s, size_t n) {
    if (p->after_think) {
        while (n && *s == '\n') s++, n--;
        if (n) p->after_think = false;
    }
    if (p->after_call) {
        while (n && is_ws(*s)) s++, n--;
        if (n) p->after_call = false;
    }
    if (!n) return;
    size_t t = n;
    while (t && is_ws(s[t - 1])) t--;
    if (t == 0) { /* whitespace only: hold it */
        tc_put(&p->ws, s, n);
        return;
    }
    if (p->ws.n) {
        tc_put(&p->content, p->ws.p, p->ws.n);
        add_event(p, DS_TC_CONTENT, -1, p->ws.p, p->ws.n);
        tc_clear(&p->ws);
    }
    tc_put(&p->content, s, t);
    add_event(p, DS_TC_CONTENT, -1, s, t);
    p->any_content = true;
    tc_put(&p->ws, s + t, n - t);
}

static void flush_ws(ds_tool_parser *p) {
    if (!p->ws.n) return;
    tc_put(&p->content, p->ws.p, p->ws.n);
    add_event(p, DS_TC_CONTENT, -1, p->ws.p, p->ws.n);
    tc_clear(&p->ws);
}

/* ---- calls ------------------------------------------------------------------------------------ */

static uint64_t splitmix(uint64_t *s) {
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static int begin_call(ds_tool_parser *p, const char *name, size_t n) {
    if (p->n_calls == p->cap_calls) {
        size_t cap = p->cap_calls ? p->cap_calls * 2 : 4;
        ds_tool_call *c = realloc(p->calls, cap * sizeof *c);
        if (!c) {
            p->oom = true;
            return -1;
        }
        p->calls = c;
        tc_buf *a = realloc(p->args, cap * sizeof *a);
        if (!a) {
            p->oom = true;
            return -1;
        }
        p->args = a;
        p->cap_calls = cap;
    }
    int idx = (int)p->n_calls;
    ds_tool_call *c = &p->calls[idx];
    memset(c, 0, sizeof *c);
    memset(&p->args[idx], 0, sizeof p->args[idx]);
    tc_put(&p->args[idx], "", 0); /* arguments always has storage */
    char id[128];
    if (p->id_prefix) {
        snprintf(id, sizeof id, "%.100s%d", p->id_prefix, idx);
    } else {
        static const char al[] = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
        memcpy(id, "call_", 5);
        for (int i = 0; i < 24; i++) id[5 + i] = al[splitmix(&p->id_rng) % 62];
        id[29] = 0;
    }
    c->id = strdup(id);
    c->name = malloc(n + 1);
    if (!c->id || !c->name) {
        free(c->id);
        free(c->name);
        p->oom = true;
        return -1;
    }
    memcpy(c->name, name, n);
    c->name[n] = 0;
    p->n_calls++;
    add_event(p, DS_TC_CALL_BEGIN, idx, "", 0);
    p->n_params = 0;
    tc_clear(&p->pnames);
    return idx;
}

static void call_args(ds_tool_parser *p, const char *s, size_t n) {
    int idx = (int)p->n_calls - 1;
    tc_put(&p->args[idx], s, n);
    add_event(p, DS_TC_CALL_ARGS, idx, s, n);
}

static void end_call(ds_tool_parser *p, bool truncated) {
    int idx = (int)p->n_calls - 1;
    p->calls[idx].truncated = truncated;
    add_event(p, DS_TC_CALL_END, idx, "", 0);
    p->after_call = true;
    tc_clear(&p->ws);
}

/* Closes an XML call's arguments object. */
static void end_xml_call(ds_tool_parser *p, bool truncated) {
    call_args(p, p->n_params ? "}" : "{}", p->n_params ? 1 : 2);
    end_call(p, truncated);
}

/* The schema type of parameter pname of function fname ("string" when unknown). */
static const char *param_type(const ds_tool_parser *p, const char *fname, const char *pname) {
    if (!cJSON_IsArray(p->tools)) return "string";
    for (const cJSON *t = p->tools->child; t; t = t->next) {
        const cJSON *f = cJSON_GetObjectItemCaseSensitive(t, "function");
        if (!f) f = t;
        const cJSON *nm = cJSON_GetObjectItemCaseSensitive(f, "name");
        if (!cJSON_IsString(nm) || strcmp(nm->valuestring, fname)) continue;
        const cJSON *props = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(f, "parameters"), "properties");
        const cJSON *spec = cJSON_GetObjectItemCaseSensitive(props, pname);
        const cJSON *ty = cJSON_GetObjectItemCaseSensitive(spec, "type");
        if (cJSON_IsString(ty)) return ty->valuestring;
        if (cJSON_IsArray(ty)) /* ["integer", "null"]: the first non-null type */
            for (const cJSON *e = ty->child; e; e = e->next)
                if (cJSON_IsString(e) && strcmp(e->valuestring, "null")) return e->valuestring;
        const cJSON *any = cJSON_GetObjectItemCaseSensitive(spec, "anyOf");
        if (!any) any = cJSON_GetObjectItemCaseSensitive(spec, "oneOf");
        for (const cJSON *e = cJSON_IsArray(any) ? any->child : NULL; e; e = e->next) {
            const cJSON *et = cJSON_GetObjectItemCaseSensitive(e, "type");
            if (cJSON_IsString(et) && strcmp(et->valuestring, "null")) return et->valuestring;
        }
        return "string";
    }
    return "string";
}

/* One XML parameter value as JSON text, typed by the schema. */
static void param_json(tc_buf *out, const char *type, const char *v, size_t n) {
    size_t a = 0, b = n;
    while (a < b && isspace((unsigned char)v[a])) a++;
    while (b > a && isspace((unsigned char)v[b - 1])) b--;
    const char *t = v + a;
    size_t tn = b - a;
    if (strcmp(type, "string") && tn) {
        bool want_num = !strcmp(type, "integer") || !strcmp(type, "number");
        bool want_bool = !strcmp(type, "boolean"), want_null = !strcmp(type, "null");
        bool want_obj = !strcmp(type, "object"), want_arr = !strcmp(type, "array");
        if (want_bool || want_null) {
            char low[8] = {0};
            for (size_t i = 0; i < tn && i < 7; i++) low[i] = (char)tolower((unsigned char)t[i]);
            if (want_bool && tn <= 5 && (!strcmp(low, "true") || !strcmp(low, "false"))) {
                tc_puts(out, low[0] == 't' ? "true" : "false");
                return;
            }
            if (want_null && tn <= 4 && (!strcmp(low, "null") || !strcmp(low, "none"))) {
                tc_puts(out, "null");
                return;
            }
        } else if (want_num || want_obj || want_arr) {
            char *z = malloc(tn + 1);
            if (z) {
                memcpy(z, t, tn);
                z[tn] = 0;
                const char *end = NULL;
                cJSON *j = cJSON_ParseWithOpts(z, &end, 1);
                bool ok = j && ((want_num && cJSON_IsNumber(j)) || (want_obj && cJSON_IsObject(j)) ||
                                (want_arr && cJSON_IsArray(j)));
                cJSON_Delete(j);
                free(z);
                if (ok) { /* verbatim: valid JSON, nothing lost */
                    tc_put(out, t, tn);
                    return;
                }
            }
        }
    }
    tc_json_string(out, v, n);
}

/* A finished <parameter=...> value: strip the newline after '>' and before '</parameter>'. */
static void finish_param(ds_tool_parser *p, const char *v, size_t n) {
    if (n && v[0] == '\n') v++, n--;
    if (n && v[n - 1] == '\n') n--;
    /* a repeated parameter name keeps its first value (the JSON object stays well-formed) */
    const char *names = p->pnames.p ? p->pnames.p : "";
    for (const char *s = names; *s;) {
        const char *e = strchr(s, '\n');
        size_t len = e ? (size_t)(e - s) : strlen(s);
        if (len == p->pname.n && !memcmp(s, p->pname.p, len)) return;
        s = e ? e + 1 : s + len;
    }
    tc_put(&p->pnames, p->pname.p, p->pname.n);
    tc_put(&p->pnames, "\n", 1);
    tc_buf j = {0};
    tc_puts(&j, p->n_params ? ", " : "{");
    tc_json_string(&j, p->pname.p, p->pname.n);
    tc_puts(&j, ": ");
    param_json(&j, param_type(p, p->calls[p->n_calls - 1].name, p->pname.p), v, n);
    if (j.oom) p->oom = true;
    else call_args(p, j.p, j.n);
    tc_free(&j);
    p->n_params++;
}

/* A JSON-form call body ({"name": ..., "arguments": ...}); false when it is not one. */
static bool json_call(ds_tool_parser *p, const char *s, size_t n, bool truncated) {
    while (n && isspace((unsigned char)*s)) s++, n--;
    while (n && isspace((unsigned char)s[n - 1])) n--;
    if (!n || s[0] != '{') return false;
    char *z = malloc(n + 1);
    if (!z) {
        p->oom = true;
        return false;
    }
    memcpy(z, s, n);
    z[n] = 0;
    const char *end = NULL;
    cJSON *j = cJSON_ParseWithOpts(z, &end, 1);
    const cJSON *name = cJSON_GetObjectItemCaseSensitive(j, "name");
    const char *key = "arguments";
    const cJSON *args = cJSON_GetObjectItemCaseSensitive(j, key);
    if (!args) args = cJSON_GetObjectItemCaseSensitive(j, key = "parameters");
    bool ok = cJSON_IsObject(j) && cJSON_IsString(name) && name->valuestring[0] &&
              strlen(name->valuestring) <= MAX_NAME &&
              (!args || cJSON_IsObject(args) || cJSON_IsString(args));
    if (ok && begin_call(p, name->valuestring, strlen(name->valuestring)) >= 0) {
        size_t a, b;
        if (!args) {
            call_args(p, "{}", 2);
        } else if (cJSON_IsString(args)) { /* already JSON text */
            call_args(p, args->valuestring, strlen(args->valuestring));
        } else if (tc_json_member_span(z, n, key, &a, &b)) {
            call_args(p, z + a, b - a);
        } else {
            char *t = cJSON_PrintUnformatted(args);
            if (t) call_args(p, t, strlen(t));
            else p->oom = true;
            free(t);
        }
        end_call(p, truncated);
    }
    cJSON_Delete(j);
    free(z);
    return ok;
}

/* ---- the state machine -------------------------------------------------------------------- */

static bool has_prefix(const char *s, size_t n, const char *tag) {
    size_t k = strlen(tag);
    return n >= k && !memcmp(s, tag, k);
}

/* s[0..n) is a proper prefix of tag (more input could complete it). */
static bool is_partial(const char *s, size_t n, const char *tag) {
    size_t k = strlen(tag);
    return n < k && !memcmp(s, tag, n);
}

/* Length of the longest suffix of s that is a proper prefix of one of the tags. */
static size_t partial_suffix(const char *s, size_t n, const char *const *tags, int nt) {
    size_t best = 0;
    for (int t = 0; t < nt; t++) {
        size_t k = strlen(tags[t]);
        for (size_t m = (k - 1 < n ? k - 1 : n); m > best; m--)
            if (!memcmp(s + n - m, tags[t], m)) {
                best = m;
                break;
            }
    }
    return best;
}

/* Earliest occurrence of any tag in s; NULL if none. */
static const char *find_tag(const char *s, size_t n, const char *const *tags, int nt, int *which) {
    const char *best = NULL;
    for (int t = 0; t < nt; t++) {
        const char *h = memmem(s, n, tags[t], strlen(tags[t]));
        if (h && (!best || h < best)) {
            best = h;
            *which = t;
        }
    }
    return best;
}

static void malformed(ds_tool_parser *p) {
    /* the block was not a call: its text is content */
    emit_content(p, p->raw.p ? p->raw.p : "", p->raw.n);
    tc_clear(&p->raw);
    p->st = P_TEXT;
}

/* One step on s[0..n); returns bytes consumed (0: wait for more input). final: no more input. */
static size_t step(ds_tool_parser *p, const char *s, size_t n, bool final) {
    switch (p->st) {
    case P_TEXT: {
        const char *tags[2];
        int nt = 0;
        if (p->parse_calls) tags[nt++] = T_CALL;
        if (!p->any_content) tags[nt++] = T_THINK; /* a reasoning block only opens the output */
        int w = 0;
        const char *h = find_tag(s, n, tags, nt, &w);
        if (h) {
            size_t before = (size_t)(h - s);
            emit_content(p, s, before);
            if (tags[w] == T_THINK && !p->any_content) {
                tc_clear(&p->ws); /* whitespace before <think> */
                p->st = P_THINK;
                p->think_start = true;
                return before + strlen(T_THINK);
            }
            if (tags[w] == T_THINK) { /* content came first: <think> is text */
                emit_content(p, T_THINK, strlen(T_THINK));
                return before + strlen(T_THINK);
            }
            /* whitespace between content and a call is dropped, unless the block turns out
             * not to be a call: raw keeps it for that case */
            tc_clear(&p->raw);
            tc_put(&p->raw, p->ws.p, p->ws.n);
            p->raw_ws = p->ws.n;
            tc_clear(&p->ws);
            tc_put(&p->raw, T_CALL, strlen(T_CALL));
            p->st = P_CALL_START;
            return before + strlen(T_CALL);
        }
        size_t keep = final ? 0 : partial_suffix(s, n, tags, nt);
        emit_content(p, s, n - keep);
        return n - keep;
    }
    case P_THINK: {
        const char *h = memmem(s, n, T_THINK_END, strlen(T_THINK_END));
        size_t upto = h ? (size_t)(h - s) : n;
        if (!h && !final) upto = n - partial_suffix(s, n, (const char *const[]){T_THINK_END}, 1);
        const char *t = s;
        size_t tn = upto;
        if (p->think_start) {
            while (tn && *t == '\n') t++, tn--;
            if (tn) p->think_start = false;
        }
        size_t body = tn;
        while (body && t[body - 1] == '\n') body--;
        if (body) { /* non-newline text: the held newlines were inside the reasoning */
            emit_reasoning(p, p->think_nl.p, p->think_nl.n);
            tc_clear(&p->think_nl);
            emit_reasoning(p, t, body);
        }
        if (h || final) {
            tc_clear(&p->think_nl); /* newlines before </think> (or the end) are dropped */
        } else {
            tc_put(&p->think_nl, t + body, tn - body);
        }
        if (h) {
            p->st = P_TEXT;
            p->after_think = true;
            p->think_start = false;
            return upto + strlen(T_THINK_END);
        }
        return upto;
    }
    case P_CALL_START: {
        size_t i = 0;
        while (i < n && is_ws(s[i])) i++;
        tc_put(&p->raw, s, i);
        if (i == n) {
            if (final) malformed(p);
            return i;
        }
        if (s[i] == '{') {
            p->st = P_JSON;
            return i;
        }
        if (has_prefix(s + i, n - i, T_FUNC)) {
            tc_put(&p->raw, s + i, strlen(T_FUNC));
            tc_clear(&p->fname);
            p->st = P_FUNC_NAME;
            return i + strlen(T_FUNC);
        }
        if (!final && is_partial(s + i, n - i, T_FUNC)) return i;
        malformed(p);
        return i;
    }
    case P_JSON: {
        /* accumulate the body in raw (after "<tool_call>" + whitespace) until </tool_call> */
        const char *h = memmem(s, n, T_CALL_END, strlen(T_CALL_END));
        size_t upto = h ? (size_t)(h - s) : n;
        if (!h && !final) upto = n - partial_suffix(s, n, (const char *const[]){T_CALL_END}, 1);
        tc_put(&p->raw, s, upto);
        if (!h && !final) return upto;
        const char *body = p->raw.p + p->raw_ws + strlen(T_CALL);
        size_t bn = p->raw.n - p->raw_ws - strlen(T_CALL);
        if (json_call(p, body, bn, !h)) {
            tc_clear(&p->raw);
            p->st = P_TEXT;
        } else {
            if (h) tc_put(&p->raw, T_CALL_END, strlen(T_CALL_END));
            malformed(p);
        }
        return h ? upto + strlen(T_CALL_END) : upto;
    }
    case P_FUNC_NAME: {
        size_t i = 0;
        while (i < n && s[i] != '>' && s[i] != '<' && s[i] != '\n' && p->fname.n + i < MAX_NAME) i++;
        tc_put(&p->raw, s, i);
        tc_put(&p->fname, s, i);
        if (i < n && s[i] == '>' && p->fname.n > 0) {
            tc_put(&p->raw, ">", 1);
            if (begin_call(p, p->fname.p, p->fname.n) < 0) return i + 1;
            tc_clear(&p->raw);
            p->st = P_BODY;
            return i + 1;
        }
        if (i < n || p->fname.n > MAX_NAME || final) malformed(p);
        return i;
    }
    case P_BODY:
    case P_AFTER_FUNC: {
        size_t i = 0;
        while (i < n && is_ws(s[i])) i++;
        const char *r = s + i;
        size_t rn = n - i;
        if (rn) {
            if (p->st == P_BODY && has_prefix(r, rn, T_PARAM)) {
                tc_clear(&p->pname);
                p->st = P_PARAM_NAME;
                return i + strlen(T_PARAM);
            }
            if (p->st == P_BODY && has_prefix(r, rn, T_FUNC_END)) {
                end_xml_call(p, false);
                p->st = P_AFTER_FUNC;
                return i + strlen(T_FUNC_END);
            }
            if (has_prefix(r, rn, T_CALL_END)) {
                if (p->st == P_BODY) end_xml_call(p, false);
                p->st = P_TEXT;
                return i + strlen(T_CALL_END);
            }
            if (p->st == P_AFTER_FUNC && has_prefix(r, rn, T_FUNC)) { /* another call, same block */
                tc_clear(&p->raw);
                tc_clear(&p->fname);
                p->st = P_FUNC_NAME;
                return i + strlen(T_FUNC);
            }
            if (!final && (is_partial(r, rn, T_PARAM) || is_partial(r, rn, T_FUNC_END) ||
                           is_partial(r, rn, T_CALL_END) || is_partial(r, rn, T_FUNC)))
                return i;
            if (p->st == P_AFTER_FUNC) { /* no </tool_call>: the block ended with the function */
                p->st = P_TEXT;
                return i;
            }
            return i + 1; /* stray text inside a function is ignored */
        }
        if (!final) return i;
        if (p->st == P_BODY) end_xml_call(p, true); /* the output ended inside the call */
        p->st = P_TEXT;
        return i;
    }
    case P_PARAM_NAME: {
        size_t i = 0;
        while (i < n && s[i] != '>' && s[i] != '<' && s[i] != '\n' && p->pname.n + i < MAX_NAME) i++;
        tc_put(&p->pname, s, i);
        if (i < n && s[i] == '>' && p->pname.n > 0) {
            tc_clear(&p->raw); /* raw holds the value from here */
            p->st = P_PARAM_VALUE;
            return i + 1;
        }
        if (i < n || p->pname.n > MAX_NAME) { /* broken parameter tag: skip it */
            p->st = P_BODY;
            return i;
        }
        if (final) {
            end_xml_call(p, true);
            p->st = P_TEXT;
        }
        return i;
    }
    case P_PARAM_VALUE: {
        static const char *const ends[] = {T_PARAM_END, T_FUNC_END, T_CALL_END};
        int w = 0;
        const char *h = find_tag(s, n, ends, 3, &w);
        size_t upto = h ? (size_t)(h - s) : n;
        if (!h && !final) upto = n - partial_suffix(s, n, ends, 3);
        tc_put(&p->raw, s, upto);
        if (!h) {
            if (final) { /* cut off mid-value: the value is dropped */
                end_xml_call(p, true);
                tc_clear(&p->raw);
                p->st = P_TEXT;
            }
            return upto;
        }
        finish_param(p, p->raw.p ? p->raw.p : "", p->raw.n);
        tc_clear(&p->raw);
        if (w == 0) {
            p->st = P_BODY;
        } else {
            end_xml_call(p, false);
            p->st = w == 1 ? P_AFTER_FUNC : P_TEXT;
        }
        return upto + strlen(ends[w]);
    }
    }
    return 0;
}

static void run(ds_tool_parser *p, bool final) {
    size_t pos = 0;
    while (!p->oom) {
        pstate before = p->st;
        size_t used = step(p, p->pend.p ? p->pend.p + pos : "", p->pend.n - pos, final);
        pos += used;
        if (used == 0 && p->st == before) break; /* waiting for more input (or done) */
    }
    tc_consume(&p->pend, pos);
}

static ds_status collect(ds_tool_parser *p, const ds_tc_event **events, size_t *n_events,
                         ds_error *err) {
    if (p->oom || p->pend.oom || p->content.oom || p->reasoning.oom || p->evtext.oom || p->raw.oom ||
        p->ws.oom || p->think_nl.oom)
        return ds_error_set(err, DS_ERR_NOMEM, "tool-call parser: out of memory");
    for (size_t i = 0; i < p->n_calls; i++)
        if (p->args[i].oom) return ds_error_set(err, DS_ERR_NOMEM, "tool-call parser: out of memory");
    if (p->n_evs > p->cap_out) {
        ds_tc_event *o = realloc(p->out, p->n_evs * sizeof *o);
        if (!o) return ds_error_set(err, DS_ERR_NOMEM, "tool-call parser: out of memory");
        p->out = o;
        p->cap_out = p->n_evs;
    }
    /* texts are NUL-separated copies: rebuild them so each event's text ends with NUL */
    tc_buf t = {0};
    size_t *offs = malloc((p->n_evs ? p->n_evs : 1) * sizeof *offs);
    if (!offs) return ds_error_set(err, DS_ERR_NOMEM, "tool-call parser: out of memory");
    for (size_t i = 0; i < p->n_evs; i++) {
        offs[i] = t.n;
        tc_put(&t, p->evtext.p + p->evs[i].off, p->evs[i].len);
        tc_put(&t, "", 1);
    }
    if (t.oom) {
        free(offs);
        tc_free(&t);
        return ds_error_set(err, DS_ERR_NOMEM, "tool-call parser: out of memory");
    }
    tc_free(&p->evtext);
    p->evtext = t;
    for (size_t i = 0; i < p->n_evs; i++) p->evs[i].off = offs[i];
    for (size_t i = 0; i < p->n_evs; i++) {
        const ev *e = &p->evs[i];
        ds_tc_event *o = &p->out[i];
        o->kind = e->kind;
        o->index = e->index;
        o->text = t.p + offs[i];
        o->len = e->len;
        o->id = e->kind == DS_TC_CALL_BEGIN ? p->calls[e->index].id : NULL;
        o->name = e->kind == DS_TC_CALL_BEGIN ? p->calls[e->index].name : NULL;
    }
    free(offs);
    for (size_t i = 0; i < p->n_calls; i++) p->calls[i].arguments = p->args[i].p;
    *events = p->out;
    *n_events = p->n_evs;
    return DS_OK;
}

static void reset_events(ds_tool_parser *p) {
    if (p->carry_events) {
        p->carry_events = false;
        return;
    }
    p->n_evs = 0;
    tc_clear(&p->evtext);
}

ds_status ds_tool_parser_push(ds_tool_parser *p, const char *text, size_t len,
                              const ds_tc_event **events, size_t *n_events, ds_error *err) {
    reset_events(p);
    tc_put(&p->pend, text, len);
    run(p, false);
    return collect(p, events, n_events, err);
}

ds_status ds_tool_parser_finish(ds_tool_parser *p, const ds_tc_event **events, size_t *n_events,
                                ds_error *err) {
    reset_events(p);
    run(p, true);
    if (p->st == P_THINK) tc_clear(&p->think_nl);
    flush_ws(p);
    return collect(p, events, n_events, err);
}

ds_status ds_tool_parser_create(const ds_tool_parser_opts *o, ds_tool_parser **out, ds_error *err) {
    *out = NULL;
    ds_tool_parser *p = calloc(1, sizeof *p);
    if (!p) return ds_error_set(err, DS_ERR_NOMEM, "tool-call parser: out of memory");
    p->parse_calls = o->parse_calls;
    p->st = o->in_reasoning ? P_THINK : P_TEXT;
    p->think_start = o->in_reasoning;
    p->id_rng = o->id_seed;
    if (o->tools && !(p->tools = cJSON_Duplicate(o->tools, 1))) goto oom;
    if (o->id_prefix && !(p->id_prefix = strdup(o->id_prefix))) goto oom;
    if (o->prefill && *o->prefill) {
        const ds_tc_event *evp;
        size_t n;
        ds_status st = ds_tool_parser_push(p, o->prefill, strlen(o->prefill), &evp, &n, err);
        if (st != DS_OK) {
            ds_tool_parser_free(p);
            return st;
        }
        (void)evp;
        p->carry_events = true; /* its events (a call's begin) go out with the first push */
    }
    *out = p;
    return DS_OK;
oom:
    ds_tool_parser_free(p);
    return ds_error_set(err, DS_ERR_NOMEM, "tool-call parser: out of memory");
}

void ds_tool_parser_free(ds_tool_parser *p) {
    if (!p) return;
    cJSON_Delete(p->tools);
    free(p->id_prefix);
    tc_free(&p->pend);
    tc_free(&p->think_nl);
    tc_free(&p->ws);
    tc_free(&p->raw);
    tc_free(&p->fname);
    tc_free(&p->pname);
    tc_free(&p->pnames);
    tc_free(&p->content);
    tc_free(&p->reasoning);
    for (size_t i = 0; i < p->n_calls; i++) {
        free(p->calls[i].id);
        free(p->calls[i].name);
        tc_free(&p->args[i]);
    }
    free(p->calls);
    free(p->args);
    free(p->evs);
    tc_free(&p->evtext);
    free(p->out);
    free(p);
}

const char *ds_tool_parser_content(const ds_tool_parser *p, size_t *len) {
    if (len) *len = p->content.n;
    return p->content.p ? p->content.p : "";
}

const char *ds_tool_parser_reasoning(const ds_tool_parser *p, size_t *len) {
    if (len) *len = p->reasoning.n;
    return p->reasoning.p ? p->reasoning.p : "";
}

size_t ds_tool_parser_n_calls(const ds_tool_parser *p) { return p->n_calls; }

const ds_tool_call *ds_tool_parser_call(const ds_tool_parser *p, size_t i) {
    if (i >= p->n_calls) return NULL;
    p->calls[i].arguments = p->args[i].p;
    return &p->calls[i];
}
