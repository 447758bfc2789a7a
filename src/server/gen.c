#include "server/gen.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

double ds_now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

bool ds_gen_init(ds_gen *g, ds_request *req, const ds_gen_opts *o) {
    memset(g, 0, sizeof *g);
    g->req = req;
    g->o = *o;
    g->stop_token = -1;
    g->stop_index = -1;
    g->o.chat = NULL; /* the options need not outlive init */
    ds_detok_init(&g->detok, o->tok, o->skip_special);
    ds_strbuf_init(&g->content);
    ds_strbuf_init(&g->reasoning);
    ds_error err = {0};
    if (o->chat && ds_tool_parser_create(o->chat, &g->tp, &err) != DS_OK) {
        g->failed = true;
        return false;
    }
    if (ds_stop_matcher_init_params(&g->stop, o->sp, &err) != DS_OK) {
        g->failed = true;
        return false;
    }
    return true;
}

void ds_gen_free(ds_gen *g) {
    if (g->req) ds_request_release(g->req);
    g->req = NULL;
    ds_detok_free(&g->detok);
    ds_stop_matcher_free(&g->stop);
    ds_tool_parser_free(g->tp);
    g->tp = NULL;
    ds_strbuf_free(&g->content);
    ds_strbuf_free(&g->reasoning);
    cJSON_Delete(g->tool_deltas);
    g->tool_deltas = NULL;
    free(g->toks);
    g->toks = NULL;
}

void ds_gen_clear_step(ds_gen *g) {
    ds_strbuf_clear(&g->content);
    ds_strbuf_clear(&g->reasoning);
    cJSON_Delete(g->tool_deltas);
    g->tool_deltas = NULL;
    g->n_toks = 0;
}

/* A CALL_BEGIN / CALL_ARGS event as a delta.tool_calls item; argument fragments of the same
 * call within one step are merged into one item. False on OOM. */
static bool add_call_delta(ds_gen *g, const ds_tc_event *ev) {
    if (!g->tool_deltas && !(g->tool_deltas = cJSON_CreateArray())) return false;
    if (ev->kind == DS_TC_CALL_ARGS) {
        cJSON *last = cJSON_GetArrayItem(g->tool_deltas, cJSON_GetArraySize(g->tool_deltas) - 1);
        const cJSON *idx = cJSON_GetObjectItemCaseSensitive(last, "index");
        cJSON *fn = cJSON_GetObjectItemCaseSensitive(last, "function");
        const cJSON *args = cJSON_GetObjectItemCaseSensitive(fn, "arguments");
        if (cJSON_IsNumber(idx) && idx->valueint == ev->index && cJSON_IsString(args)) {
            size_t a = strlen(args->valuestring);
            char *joined = malloc(a + ev->len + 1);
            if (!joined) return false;
            memcpy(joined, args->valuestring, a);
            memcpy(joined + a, ev->text, ev->len);
            joined[a + ev->len] = 0;
            cJSON *ns = cJSON_CreateString(joined);
            free(joined);
            return ns && cJSON_ReplaceItemInObjectCaseSensitive(fn, "arguments", ns);
        }
    }
    cJSON *d = cJSON_CreateObject();
    if (!d || !cJSON_AddItemToArray(g->tool_deltas, d)) {
        cJSON_Delete(d);
        return false;
    }
    cJSON_AddNumberToObject(d, "index", ev->index);
    if (ev->kind == DS_TC_CALL_BEGIN) {
        cJSON_AddStringToObject(d, "id", ev->id);
        cJSON_AddStringToObject(d, "type", "function");
    }
    cJSON *fn = cJSON_AddObjectToObject(d, "function");
    if (!fn) return false;
    if (ev->kind == DS_TC_CALL_BEGIN) cJSON_AddStringToObject(fn, "name", ev->name);
    return cJSON_AddStringToObject(fn, "arguments", ev->kind == DS_TC_CALL_ARGS ? ev->text : "") != NULL;
}

/* Released text (after stop strings) goes through the response parser into content,
 * reasoning and tool-call deltas; end: the output is complete. */
void ds_gen_feed_text(ds_gen *g, const char *text, size_t len, bool end) {
    if (!g->tp) {
        ds_strbuf_append(&g->content, text, len);
        return;
    }
    const ds_tc_event *ev = NULL;
    size_t n = 0;
    ds_error err = {0};
    ds_status st = end ? ds_tool_parser_finish(g->tp, &ev, &n, &err)
                       : ds_tool_parser_push(g->tp, text, len, &ev, &n, &err);
    if (st != DS_OK) {
        g->failed = true;
        return;
    }
    for (size_t i = 0; i < n; i++) {
        switch (ev[i].kind) {
        case DS_TC_CONTENT: ds_strbuf_append(&g->content, ev[i].text, ev[i].len); break;
        case DS_TC_REASONING: ds_strbuf_append(&g->reasoning, ev[i].text, ev[i].len); break;
        case DS_TC_CALL_BEGIN:
        case DS_TC_CALL_ARGS:
            if (!add_call_delta(g, &ev[i])) g->failed = true;
            break;
        case DS_TC_CALL_END: break;
        }
    }
}

static void release(ds_gen *g, const ds_stop_result *sr) {
    if (sr->len) ds_gen_feed_text(g, sr->text, sr->len, false);
}

static void finish(ds_gen *g, const char *reason) {
    g->finished = true;
    g->finish_reason = reason;
    ds_gen_feed_text(g, NULL, 0, true);
    if (g->o.metrics && g->n_generated > 0) {
        ds_metrics_finish why = !strcmp(reason, "stop")     ? DS_METRICS_FINISH_STOP
                                : !strcmp(reason, "length") ? DS_METRICS_FINISH_LENGTH
                                                            : DS_METRICS_FINISH_ABORT;
        double end = ds_now_s();
        ds_metrics_observe_request(g->o.metrics, why, end - g->o.t_arrival,
                                   g->t_first - g->o.t_arrival, g->n_prompt, g->n_generated);
    } else if (g->o.metrics) {
        ds_metrics_observe_request(g->o.metrics, DS_METRICS_FINISH_ABORT, ds_now_s() - g->o.t_arrival,
                                   0, g->n_prompt, 0);
    }
    if (g->req) ds_request_cancel(g->req); /* no-op when the engine already finished it */
}

void ds_gen_abort(ds_gen *g) {
    if (!g->finished) finish(g, "abort");
}

static bool push_tok(ds_gen *g, int32_t id, const ds_sample_result *s) {
    if (!g->o.want_tokens) return true;
    if (g->n_toks == g->cap_toks) {
        int cap = g->cap_toks ? 2 * g->cap_toks : 16;
        ds_gen_token *t = realloc(g->toks, (size_t)cap * sizeof *t);
        if (!t) return false;
        g->toks = t;
        g->cap_toks = cap;
    }
    ds_gen_token *t = &g->toks[g->n_toks++];
    t->id = id;
    t->s = *s;
    t->text_offset = g->text_bytes;
    return true;
}

bool ds_gen_step(ds_gen *g, int timeout_ms) {
    if (g->finished) return false;
    ds_request_event ev;
    if (!ds_request_next(g->req, &ev, timeout_ms)) return false;
    double now = ds_now_s();
    ds_error err = {0};
    g->n_prompt = ev.n_prompt_tokens;
    g->n_cached = ev.n_cached_tokens;
    if (ev.n_tokens > 0) {
        if (g->n_generated == 0) {
            g->t_first = now;
            if (g->o.metrics) ds_metrics_observe_ttft(g->o.metrics, now - g->o.t_arrival);
        } else if (g->o.metrics) {
            ds_metrics_observe_itl(g->o.metrics, now - g->t_last);
        }
        g->t_last = now;
    }
    for (int i = 0; i < ev.n_tokens; i++) {
        const char *text;
        size_t len;
        ds_stop_result sr;
        if (!push_tok(g, ev.tokens[i], &ev.samples[i]) ||
            ds_detok_push(&g->detok, ev.tokens[i], &text, &len, &err) != DS_OK ||
            ds_stop_matcher_feed(&g->stop, text, len, &sr, &err) != DS_OK) {
            g->failed = true;
            finish(g, "abort");
            return true;
        }
        g->n_generated++;
        g->text_bytes += len;
        release(g, &sr);
        if (sr.stop_index >= 0) {
            g->stop_index = sr.stop_index;
            finish(g, "stop");
            return true;
        }
    }
    if (ev.finished) {
        if (ev.reason == DS_FINISH_NONE) {
            finish(g, "abort");
            return true;
        }
        const char *text;
        size_t len;
        ds_stop_result sr;
        if (ds_detok_flush(&g->detok, &text, &len, &err) == DS_OK &&
            ds_stop_matcher_feed(&g->stop, text, len, &sr, &err) == DS_OK) {
            g->text_bytes += len;
            release(g, &sr);
            if (sr.stop_index >= 0) {
                g->stop_index = sr.stop_index;
                finish(g, "stop");
                return true;
            }
        }
        ds_stop_matcher_flush(&g->stop, &sr);
        release(g, &sr);
        g->stop_token = ev.stop_token;
        finish(g, ev.reason == DS_FINISH_LENGTH ? "length" : "stop");
    }
    if (!ds_strbuf_ok(&g->content) || !ds_strbuf_ok(&g->reasoning)) g->failed = true;
    return true;
}
