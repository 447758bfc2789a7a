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
    ds_detok_init(&g->detok, o->tok, o->skip_special);
    ds_reasoning_init(&g->rs, o->reasoning_end, o->split_reasoning);
    ds_strbuf_init(&g->content);
    ds_strbuf_init(&g->reasoning);
    ds_error err = {0};
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
    ds_reasoning_free(&g->rs);
    ds_strbuf_free(&g->content);
    ds_strbuf_free(&g->reasoning);
    free(g->toks);
    g->toks = NULL;
}

void ds_gen_clear_step(ds_gen *g) {
    ds_strbuf_clear(&g->content);
    ds_strbuf_clear(&g->reasoning);
    g->n_toks = 0;
}

/* Released text goes through the reasoning splitter into content / reasoning. */
static void release(ds_gen *g, const ds_stop_result *sr) {
    if (sr->len) ds_reasoning_feed(&g->rs, sr->text, sr->len, &g->reasoning, &g->content);
}

static void finish(ds_gen *g, const char *reason) {
    g->finished = true;
    g->finish_reason = reason;
    ds_reasoning_flush(&g->rs, &g->reasoning, &g->content);
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
