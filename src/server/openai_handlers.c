/* openai_handlers.c — POST /v1/completions and /v1/chat/completions: parse → tokenise → check
 * the context → submit → stream (SSE) or collect the output; and POST /tokenize, /detokenize
 * (vLLM's extensions), which share the prompt's tokenisation.
 *
 * Every failure before submission is an HTTP error with an OpenAI error body; once streaming
 * has started, an engine failure becomes a `data: {"error": ...}` event followed by [DONE].
 * A client that goes away is noticed either by a failed write (streaming) or by a peek at its
 * socket between 100 ms waits; its request is then cancelled, which frees its KV blocks and
 * state slot in the engine. */
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "server/gen.h"
#include "server/openai_resp.h"
#include "server/server_internal.h"

#define WAIT_SLICE_MS 100

typedef struct ds_job {
    ds_server *srv;
    struct MHD_Connection *conn;
    ds_oai_request rq;
    ds_oai_resp_ctx ctx;
    ds_gen g;
    bool gen_ready;
    char *echo_text;        /* completions with echo: the prompt text */
    char *prefill;          /* chat with a named tool_choice: the call opener ending the prompt */
    int32_t *ids;           /* [n_ids] the prompt's token ids */
    int n_ids;
    /* streaming */
    ds_strbuf out;
    size_t out_pos;
    bool started, done, broken;
    int wait_ms; /* one wait for tokens: WAIT_SLICE_MS alone, shorter when choices share a stream */
    bool sub;    /* one choice of several (n > 1): no usage chunk or [DONE] of its own */
} ds_job;

/* What collect() gathers of a finished request. */
typedef struct ds_collected {
    ds_strbuf text, reasoning;
    ds_gen_token *toks;
    int n_toks, cap;
} ds_collected;

static void collected_free(ds_collected *c) {
    ds_strbuf_free(&c->text);
    ds_strbuf_free(&c->reasoning);
    free(c->toks);
}

static void job_free(ds_job *j) {
    if (j->gen_ready) {
        ds_gen_abort(&j->g); /* no-op when finished */
        ds_gen_free(&j->g);
    }
    ds_oai_request_free(&j->rq);
    free(j->echo_text);
    free(j->prefill);
    free(j->ids);
    ds_strbuf_free(&j->out);
    free(j);
}

static void make_id(ds_server *s, ds_oai_kind kind, char *id, size_t cap) {
    unsigned long long n = atomic_fetch_add(&s->next_id, 1);
    unsigned long long h = (n + s->id_salt) * 0x9E3779B97F4A7C15ull;
    h ^= h >> 29;
    snprintf(id, cap, "%s-%016llx%08llx", kind == DS_OAI_CHAT ? "chatcmpl" : "cmpl", h, n & 0xffffffffull);
}

static bool model_known(const ds_server *s, const char *model) {
    if (!model) return true;
    for (int i = 0; i < s->o.n_served_names; i++)
        if (!strcmp(model, s->o.served_names[i])) return true;
    return false;
}

static void param_from_message(const char *msg, char *param, size_t cap) {
    size_t n = strcspn(msg, " [:(");
    if (n >= cap) n = cap - 1;
    memcpy(param, msg, n);
    param[n] = 0;
}

static void context_error(ds_oai_error *e, const ds_job *j, int max_len, int n_prompt,
                          long long n_out) {
    bool chat = j->rq.kind == DS_OAI_CHAT;
    ds_oai_error_set(e, 400, "invalid_request_error", "context_length_exceeded",
                     chat ? "messages" : "prompt",
                     "This model's maximum context length is %d tokens. However, you requested "
                     "%lld tokens (%d in the %s, %lld in the completion). Please reduce the "
                     "length of the %s or completion.",
                     max_len, (long long)n_prompt + n_out, n_prompt, chat ? "messages" : "prompt",
                     n_out, chat ? "messages" : "prompt");
}

/* Prompt ids for the request (owned by the caller); false with *e on a bad prompt. */
static bool prompt_ids(ds_job *j, int32_t **ids, size_t *n, bool *reasoning_open, ds_oai_error *e) {
    ds_server *s = j->srv;
    ds_error err = {0};
    *reasoning_open = false;
    const ds_oai_request *rq = &j->rq;
    if (rq->kind == DS_OAI_CHAT) {
        ds_strbuf text;
        ds_strbuf_init(&text);
        ds_status st = s->chat->render(s->chat, rq->messages, rq->n_messages, &rq->chat, &text,
                                       reasoning_open, &err);
        /* A named tool_choice: the prompt ends inside a call of that function (no constrained
         * decoding; the parser is told the prefill so the call is reported whole). */
        if (st == DS_OK && rq->tool_choice.mode == DS_TOOL_CHOICE_NAMED) {
            j->prefill = ds_tool_call_prefill(s->chat->tool_format, rq->tool_choice.name,
                                              *reasoning_open);
            if (!j->prefill) st = ds_error_set(&err, DS_ERR_NOMEM, "chat prompt: out of memory");
            else ds_strbuf_puts(&text, j->prefill);
            if (st == DS_OK && !ds_strbuf_ok(&text))
                st = ds_error_set(&err, DS_ERR_NOMEM, "chat prompt: out of memory");
        }
        /* parse_special: the template's <|im_start|> etc. are the special tokens */
        if (st == DS_OK)
            st = ds_tokenizer_encode(s->tok, text.data ? text.data : "", text.len, true, ids, n, &err);
        ds_strbuf_free(&text);
        if (st != DS_OK) {
            /* the conversation (or a template's raise_exception) is the client's problem */
            bool client = st == DS_ERR_INVALID_ARG || st == DS_ERR_FORMAT;
            char param[64] = "messages";
            if (st == DS_ERR_INVALID_ARG) param_from_message(err.msg, param, sizeof param);
            ds_oai_error_set(e, client ? 400 : 500,
                             client ? "invalid_request_error" : "server_error", NULL,
                             client ? param : NULL, "%s", err.msg);
            return false;
        }
    } else if (rq->prompt_text) {
        if (ds_tokenizer_encode(s->tok, rq->prompt_text, strlen(rq->prompt_text), true, ids, n,
                                &err) != DS_OK) {
            ds_oai_error_set(e, 500, "server_error", NULL, NULL, "tokenizer: %s", err.msg);
            return false;
        }
        if (rq->echo) j->echo_text = ds_xstrdup(rq->prompt_text);
    } else {
        for (int i = 0; i < rq->n_prompt_ids; i++)
            if (rq->prompt_ids[i] >= s->o.vocab) {
                ds_oai_error_set(e, 400, "invalid_request_error", NULL, "prompt",
                                 "prompt[%d] = %d is outside the vocabulary [0, %d)", i,
                                 rq->prompt_ids[i], s->o.vocab);
                return false;
            }
        *ids = malloc((size_t)rq->n_prompt_ids * sizeof(int32_t));
        if (!*ids) {
            ds_oai_error_set(e, 500, "server_error", NULL, NULL, "out of memory");
            return false;
        }
        memcpy(*ids, rq->prompt_ids, (size_t)rq->n_prompt_ids * sizeof(int32_t));
        *n = (size_t)rq->n_prompt_ids;
        if (rq->echo) {
            char *t = NULL;
            size_t len = 0;
            if (ds_tokenizer_decode(s->tok, *ids, *n, false, &t, &len, &err) == DS_OK)
                j->echo_text = t;
        }
    }
    if (*n == 0) {
        ds_oai_error_set(e, 400, "invalid_request_error", NULL,
                         rq->kind == DS_OAI_CHAT ? "messages" : "prompt",
                         "the prompt encodes to no tokens");
        return false;
    }
    return true;
}

/* Everything up to a submitted request; false with *e set. */
static bool submit(ds_job *j, double t_arrival, ds_oai_error *e) {
    ds_server *s = j->srv;
    ds_oai_request *rq = &j->rq;
    int32_t *ids = NULL;
    size_t n = 0;
    bool reasoning_open = false;
    bool ok_ids = prompt_ids(j, &ids, &n, &reasoning_open, e);
    j->ids = ids; /* freed with the job */
    j->n_ids = (int)n;
    if (!ok_ids) return false;
    const int max_len = s->o.max_model_len;
    if (!rq->max_tokens_given && rq->kind == DS_OAI_CHAT) {
        long long room = (long long)max_len - (long long)n;
        if (room < 1) {
            context_error(e, j, max_len, (int)n, 1);
            return false;
        }
        rq->sp.max_tokens = (int)room;
    }
    if ((long long)n + rq->sp.max_tokens > max_len) {
        context_error(e, j, max_len, (int)n, rq->sp.max_tokens);
        return false;
    }
    if (rq->sp.min_tokens > rq->sp.max_tokens) {
        ds_oai_error_set(e, 400, "invalid_request_error", NULL, "min_tokens",
                         "min_tokens (%d) must be <= max_tokens (%d)", rq->sp.min_tokens,
                         rq->sp.max_tokens);
        return false;
    }

    ds_request_desc d = {.prompt = ids, .n_prompt = (int)n, .params = rq->sp};
    if (rq->json_object) { /* JSON mode (json_grammar.h), after the reasoning the prompt opened */
        d.params.json = &s->json_vocab;
        const int32_t end_think = ds_tokenizer_token_to_id(s->tok, "</think>");
        d.params.json_deferred = reasoning_open && end_think >= 0;
        d.params.json_start_after = end_think;
        d.params.json_schema = rq->json_schema; /* NULL: any object; the engine takes a reference */
    }
    ds_request *req = NULL;
    ds_error err = {0};
    ds_status st = ds_engine_submit(s->eng, &d, &req, &err);
    if (st == DS_ERR_BUSY) {
        ds_oai_error_set(e, 503, "service_unavailable_error", "queue_full", NULL,
                         "the server is busy: %s; retry later", err.msg);
        return false;
    }
    if (st == DS_ERR_INVALID_ARG) {
        if (strstr(err.msg, "maximum context length") || strstr(err.msg, "KV pool")) {
            ds_oai_error_set(e, 400, "invalid_request_error", "context_length_exceeded",
                             rq->kind == DS_OAI_CHAT ? "messages" : "prompt", "%s", err.msg);
        } else {
            char param[64];
            param_from_message(err.msg, param, sizeof param);
            ds_oai_error_set(e, 400, "invalid_request_error", NULL, param, "%s", err.msg);
        }
        return false;
    }
    if (st != DS_OK) {
        ds_oai_error_set(e, 500, "server_error", NULL, NULL, "engine: %s", err.msg);
        return false;
    }

    /* Tool-call ids: unique per request (the server's salt and request counter). */
    unsigned long long seq = atomic_fetch_add(&s->next_id, 1);
    ds_tool_parser_opts po = {
        .parse_calls = rq->tool_choice.mode != DS_TOOL_CHOICE_NONE,
        .in_reasoning = reasoning_open,
        .tools = rq->tools,
        .id_seed = (seq + s->id_salt) * 0x9E3779B97F4A7C15ull ^ (unsigned long long)(t_arrival * 1e9),
        .prefill = j->prefill,
    };
    ds_gen_opts go = {
        .tok = s->tok,
        .sp = &rq->sp,
        .skip_special = rq->skip_special_tokens,
        .want_tokens = rq->logprobs >= 0 || rq->return_token_ids,
        .chat = rq->kind == DS_OAI_CHAT ? &po : NULL,
        .metrics = &s->metrics,
        .t_arrival = t_arrival,
    };
    bool ok = ds_gen_init(&j->g, req, &go);
    j->gen_ready = true; /* owns req from here, even after a failed init */
    if (!ok) {
        ds_oai_error_set(e, 500, "server_error", NULL, NULL, "out of memory");
        return false;
    }
    j->g.n_prompt = (int)n;
    return true;
}

static ds_oai_result result_of(const ds_job *j, const char *text, const char *reasoning,
                               const ds_gen_token *toks, int n_toks) {
    const ds_gen *g = &j->g;
    const char *fr = ds_oai_finish_reason(g->finish_reason, g->tp);
    return (ds_oai_result){
        .text = text,
        .reasoning = reasoning,
        .toks = toks,
        .n_toks = n_toks,
        .finish_reason = fr,
        .tools = g->tp,
        .stop_str = g->stop_index >= 0 ? j->rq.sp.stop[g->stop_index] : NULL,
        .stop_token = g->stop_token,
        .n_prompt = g->n_prompt,
        .n_gen = g->n_generated,
        .n_cached = g->n_cached,
    };
}

/* ---- non-streaming ------------------------------------------------------------------------- */

enum { COLLECT_OK, COLLECT_GONE, COLLECT_FAILED };

/* Runs j to its end, gathering its text (after the echo), reasoning and tokens into *out
 * (initialised here; free with collected_free). The client is looked at every slice. */
static int collect(ds_job *j, ds_collected *out) {
    ds_server *s = j->srv;
    ds_gen *g = &j->g;
    memset(out, 0, sizeof *out);
    ds_strbuf_init(&out->text);
    ds_strbuf_init(&out->reasoning);
    if (j->echo_text) ds_strbuf_puts(&out->text, j->echo_text);
    double next_check = ds_now_s() + WAIT_SLICE_MS * 1e-3;
    while (!g->finished) {
        bool progressed = ds_gen_step(g, WAIT_SLICE_MS);
        /* Look at the client every slice even while tokens flow: nothing is written to it
         * before the end, so only a peek can tell that it left. */
        double now = ds_now_s();
        if (!progressed || now >= next_check) {
            next_check = now + WAIT_SLICE_MS * 1e-3;
            if (atomic_load(&s->stopping) || ds_http_client_gone(j->conn)) {
                ds_gen_abort(g);
                return COLLECT_GONE;
            }
        }
        if (!progressed) continue;
        ds_strbuf_append(&out->text, g->content.data ? g->content.data : "", g->content.len);
        ds_strbuf_append(&out->reasoning, g->reasoning.data ? g->reasoning.data : "", g->reasoning.len);
        if (g->n_toks) {
            if (out->n_toks + g->n_toks > out->cap) {
                int nc = out->cap ? out->cap : 64;
                while (nc < out->n_toks + g->n_toks) nc *= 2;
                ds_gen_token *t = realloc(out->toks, (size_t)nc * sizeof *t);
                if (!t) {
                    ds_gen_abort(g);
                    return COLLECT_FAILED;
                }
                out->toks = t;
                out->cap = nc;
            }
            memcpy(out->toks + out->n_toks, g->toks, (size_t)g->n_toks * sizeof *out->toks);
            out->n_toks += g->n_toks;
        }
        ds_gen_clear_step(g);
    }
    if (g->failed || !ds_strbuf_ok(&out->text) || !ds_strbuf_ok(&out->reasoning) ||
        !strcmp(g->finish_reason, "abort"))
        return COLLECT_FAILED;
    return COLLECT_OK;
}

static ds_oai_result collected_result(const ds_job *j, const ds_collected *c) {
    /* chat: reasoning_content is null unless the model produced some */
    const char *rs = j->rq.kind == DS_OAI_CHAT && c->reasoning.len ? c->reasoning.data : NULL;
    return result_of(j, c->text.data ? c->text.data : "", rs, c->toks, c->n_toks);
}

static enum MHD_Result aborted_error(ds_server *s, struct MHD_Connection *c) {
    ds_oai_error e;
    ds_oai_error_set(&e, 500, "server_error", NULL, NULL,
                     "the request was aborted by the engine (or ran out of memory)");
    return ds_http_error(s, c, &e);
}

/* The n choices of one request (jobs[i] is choice i, all submitted): each collected in turn
 * (the engine runs them together; a request's queue holds all its tokens), one response. */
static enum MHD_Result respond_whole(ds_job **jobs, int n, int per_prompt) {
    ds_server *s = jobs[0]->srv;
    struct MHD_Connection *conn = jobs[0]->conn;
    ds_collected col[DS_OAI_MAX_CHOICES];
    ds_oai_result res[DS_OAI_MAX_CHOICES];
    int got = 0, status = COLLECT_OK;
    while (got < n && status == COLLECT_OK) {
        status = collect(jobs[got], &col[got]);
        res[got] = collected_result(jobs[got], &col[got]);
        got++;
    }
    enum MHD_Result ret;
    if (status == COLLECT_GONE) {
        ret = MHD_NO; /* the client is gone: close the connection */
    } else if (status == COLLECT_FAILED) {
        ret = aborted_error(s, conn);
    } else {
        char *body = ds_oai_response_json_n(&jobs[0]->ctx, res, n, per_prompt);
        ret = ds_http_respond(s, conn, 200, "application/json", body, body ? strlen(body) : 0,
                              NULL);
    }
    for (int i = 0; i < got; i++) collected_free(&col[i]);
    for (int i = 0; i < n; i++) job_free(jobs[i]); /* aborts the ones not run to their end */
    return ret;
}

/* ---- streaming ----------------------------------------------------------------------------- */

/* g's usage with n_gen completion tokens. */
static ds_oai_usage gen_usage(const ds_gen *g, int n_gen) {
    return (ds_oai_usage){.n_prompt = g->n_prompt, .n_cached = g->n_cached, .n_gen = n_gen};
}

/* Appends the next SSE events to j->out (may block up to one wait slice). */
static void produce(ds_job *j) {
    ds_gen *g = &j->g;
    const ds_oai_resp_ctx *c = &j->ctx;
    if (!j->started) {
        j->started = true;
        if (c->kind == DS_OAI_CHAT)
            ds_oai_chunk(&j->out, c, true, NULL, NULL, NULL, 0, NULL, gen_usage(g, 0));
        else if (j->echo_text)
            ds_oai_chunk(&j->out, c, false, NULL, j->echo_text, NULL, 0, NULL, gen_usage(g, 0));
        if (j->out.len) return;
    }
    if (!ds_gen_step(g, j->wait_ms)) {
        if (atomic_load(&j->srv->stopping) || ds_http_client_gone(j->conn)) {
            ds_gen_abort(g);
            j->broken = true;
        }
        return;
    }
    const ds_gen_token *toks = g->toks;
    int n_toks = g->n_toks;
    if (g->reasoning.len) {
        ds_oai_chunk(&j->out, c, false, g->reasoning.data, NULL, toks, n_toks, NULL,
                     gen_usage(g, g->n_generated));
        n_toks = 0; /* the logprobs went with the first chunk of this step */
    }
    if (g->content.len || (n_toks > 0 && !g->tool_deltas)) {
        ds_oai_chunk(&j->out, c, false, NULL, g->content.data ? g->content.data : "", toks, n_toks,
                     NULL, gen_usage(g, g->n_generated));
        n_toks = 0;
    }
    if (g->tool_deltas)
        ds_oai_tool_chunk(&j->out, c, g->tool_deltas, toks, n_toks, gen_usage(g, g->n_generated));
    if (g->finished) {
        if (g->failed || !strcmp(g->finish_reason, "abort")) {
            ds_oai_error e;
            ds_oai_error_set(&e, 500, "server_error", NULL, NULL,
                             "the request was aborted by the engine (or ran out of memory)");
            ds_oai_error_event(&j->out, &e);
        } else {
            ds_oai_result r = result_of(j, NULL, NULL, NULL, 0);
            ds_oai_chunk(&j->out, c, false, NULL, NULL, NULL, 0, &r, gen_usage(g, g->n_generated));
            if (c->include_usage && !j->sub) ds_oai_usage_chunk(&j->out, c, gen_usage(g, g->n_generated));
        }
        if (!j->sub) ds_strbuf_puts(&j->out, "data: [DONE]\n\n");
        j->done = true;
    }
    ds_gen_clear_step(g);
}

/* The choices of one streamed request (one for n = 1) and the SSE text not yet sent. */
typedef struct ds_stream {
    ds_job *jobs[DS_OAI_MAX_CHOICES];
    int n, per_prompt; /* per_prompt consecutive choices sample one prompt */
    ds_strbuf out;
    size_t out_pos;
    bool done, broken;
} ds_stream;

/* Appends the next events of every unfinished choice; after the last one, for several, the usage
 * chunk (each prompt once, the completions summed) and [DONE] (a lone choice writes its own). */
static void stream_produce(ds_stream *st) {
    bool all_done = true;
    for (int i = 0; i < st->n; i++) {
        ds_job *j = st->jobs[i];
        if (j->done) continue;
        ds_strbuf_clear(&j->out);
        produce(j);
        if (j->broken || !ds_strbuf_ok(&j->out)) {
            st->broken = true;
            return;
        }
        ds_strbuf_append(&st->out, j->out.data ? j->out.data : "", j->out.len);
        all_done = all_done && j->done;
    }
    if (!all_done) return;
    if (st->n > 1) {
        const ds_oai_resp_ctx *c = &st->jobs[0]->ctx;
        ds_oai_usage u = {0};
        for (int i = 0; i < st->n; i++) {
            const ds_gen *g = &st->jobs[i]->g;
            if (i % st->per_prompt == 0) {
                u.n_prompt += g->n_prompt;
                u.n_cached += g->n_cached;
            }
            u.n_gen += g->n_generated;
        }
        if (c->include_usage) ds_oai_usage_chunk(&st->out, c, u);
        ds_strbuf_puts(&st->out, "data: [DONE]\n\n");
    }
    st->done = true;
}

static ssize_t stream_reader(void *cls, uint64_t pos, char *buf, size_t max) {
    (void)pos;
    ds_stream *st = cls;
    while (st->out_pos == st->out.len) {
        if (st->broken || !ds_strbuf_ok(&st->out)) return MHD_CONTENT_READER_END_WITH_ERROR;
        if (st->done) return MHD_CONTENT_READER_END_OF_STREAM;
        ds_strbuf_clear(&st->out);
        st->out_pos = 0;
        stream_produce(st);
    }
    if (!ds_strbuf_ok(&st->out)) return MHD_CONTENT_READER_END_WITH_ERROR;
    size_t n = st->out.len - st->out_pos;
    if (n > max) n = max;
    memcpy(buf, st->out.data + st->out_pos, n);
    st->out_pos += n;
    return (ssize_t)n;
}

static void stream_free(void *cls) {
    ds_stream *st = cls;
    for (int i = 0; i < st->n; i++) job_free(st->jobs[i]);
    ds_strbuf_free(&st->out);
    free(st);
}

static enum MHD_Result respond_stream(ds_job **jobs, int n, int per_prompt) {
    ds_server *s = jobs[0]->srv;
    struct MHD_Connection *c = jobs[0]->conn;
    ds_stream *st = calloc(1, sizeof *st);
    struct MHD_Response *r =
        st ? MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16384, stream_reader, st, stream_free)
           : NULL;
    if (!r) {
        free(st);
        for (int i = 0; i < n; i++) job_free(jobs[i]);
        return MHD_NO;
    }
    st->n = n;
    st->per_prompt = per_prompt;
    ds_strbuf_init(&st->out);
    for (int i = 0; i < n; i++) {
        st->jobs[i] = jobs[i];
        jobs[i]->sub = n > 1;
        /* one wait per choice and round: a token of any choice waits at most ~n of them */
        jobs[i]->wait_ms = n > 1 ? 2 : WAIT_SLICE_MS;
    }
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, "text/event-stream; charset=utf-8");
    MHD_add_response_header(r, MHD_HTTP_HEADER_CACHE_CONTROL, "no-cache");
    MHD_add_response_header(r, "X-Accel-Buffering", "no");
    enum MHD_Result ret = MHD_queue_response(c, 200, r);
    MHD_destroy_response(r); /* the jobs are freed with the response (stream_free) */
    ds_metrics_count_http(&s->metrics, 200);
    return ret;
}

/* A parsed job for the body, or NULL with *e set. */
static ds_job *job_parse(ds_server *s, struct MHD_Connection *c, ds_oai_kind kind, const ds_conn *cs,
                         ds_oai_error *e) {
    ds_job *j = calloc(1, sizeof *j);
    if (!j) {
        ds_oai_error_set(e, 500, "server_error", NULL, NULL, "out of memory");
        return NULL;
    }
    j->srv = s;
    j->conn = c;
    j->wait_ms = WAIT_SLICE_MS;
    ds_strbuf_init(&j->out);
    if (!ds_oai_parse_with(kind, cs->body.data ? cs->body.data : "", cs->body.len,
                           &s->o.defaults, &j->rq, e)) {
        job_free(j);
        return NULL;
    }
    return j;
}

/* ---- /tokenize, /detokenize (vLLM's extensions) --------------------------------------------- */

static enum MHD_Result respond_json(ds_server *s, struct MHD_Connection *c, cJSON *root) {
    char *body = root ? cJSON_PrintUnformatted(root) : NULL;
    cJSON_Delete(root);
    if (!body) {
        ds_oai_error e;
        ds_oai_error_set(&e, 500, "server_error", NULL, NULL, "out of memory");
        return ds_http_error(s, c, &e);
    }
    return ds_http_respond(s, c, 200, "application/json", body, strlen(body), NULL);
}

/* {"prompt": ...} or {"messages": [...], ...}: the prompt's token ids exactly as a completions or
 * chat request with the same fields would feed them (the chat template, tool prompt and named
 * tool_choice opener included), without generating: {"count", "max_model_len", "tokens",
 * "token_strs": null}. A prompt longer than the context is counted, not refused. */
enum MHD_Result ds_handle_tokenize(ds_conn *cs, struct MHD_Connection *c) {
    ds_server *s = cs->srv;
    const char *body = cs->body.data ? cs->body.data : "";
    cJSON *peek = cJSON_ParseWithLength(body, cs->body.len);
    const bool chat = cJSON_IsObject(peek) && cJSON_GetObjectItemCaseSensitive(peek, "messages");
    cJSON_Delete(peek);
    ds_oai_error e;
    ds_job *j = job_parse(s, c, chat ? DS_OAI_CHAT : DS_OAI_COMPLETIONS, cs, &e);
    if (!j) return ds_http_error(s, c, &e);
    int32_t *ids = NULL;
    size_t n = 0;
    bool reasoning_open;
    if (!prompt_ids(j, &ids, &n, &reasoning_open, &e)) {
        job_free(j);
        return ds_http_error(s, c, &e);
    }
    cJSON *root = cJSON_CreateObject();
    cJSON_AddNumberToObject(root, "count", (double)n);
    cJSON_AddNumberToObject(root, "max_model_len", s->o.max_model_len);
    cJSON *arr = cJSON_AddArrayToObject(root, "tokens");
    for (size_t i = 0; i < n && arr; i++) cJSON_AddItemToArray(arr, cJSON_CreateNumber(ids[i]));
    cJSON_AddNullToObject(root, "token_strs");
    free(ids);
    job_free(j);
    return respond_json(s, c, root);
}

/* {"tokens": [ids]} → {"prompt": text} (special tokens kept, as vLLM's tokenizer.decode). */
enum MHD_Result ds_handle_detokenize(ds_conn *cs, struct MHD_Connection *c) {
    ds_server *s = cs->srv;
    ds_oai_error e;
    cJSON *root = cJSON_ParseWithLength(cs->body.data ? cs->body.data : "", cs->body.len);
    const cJSON *toks = cJSON_IsObject(root) ? cJSON_GetObjectItemCaseSensitive(root, "tokens") : NULL;
    if (!cJSON_IsArray(toks)) {
        cJSON_Delete(root);
        ds_oai_error_set(&e, 400, "invalid_request_error", NULL, "tokens",
                         "the body must be a JSON object with \"tokens\": an array of token ids");
        return ds_http_error(s, c, &e);
    }
    const int n = cJSON_GetArraySize(toks);
    int32_t *ids = malloc((size_t)(n > 0 ? n : 1) * sizeof *ids);
    if (!ids) {
        cJSON_Delete(root);
        return MHD_NO;
    }
    int i = 0;
    for (const cJSON *t = toks->child; t; t = t->next, i++) {
        const double v = cJSON_IsNumber(t) ? t->valuedouble : -1.0;
        if (!(v >= 0 && v < (double)s->o.vocab && v == floor(v))) {
            free(ids);
            cJSON_Delete(root);
            ds_oai_error_set(&e, 400, "invalid_request_error", NULL, "tokens",
                             "tokens[%d] is not a token id in [0, %d)", i, s->o.vocab);
            return ds_http_error(s, c, &e);
        }
        ids[i] = (int32_t)v;
    }
    cJSON_Delete(root);
    char *text = NULL;
    size_t len = 0;
    ds_error err = {0};
    ds_status st = ds_tokenizer_decode(s->tok, ids, (size_t)n, false, &text, &len, &err);
    free(ids);
    if (st != DS_OK) {
        ds_oai_error_set(&e, 500, "server_error", NULL, NULL, "tokenizer: %s", err.msg);
        return ds_http_error(s, c, &e);
    }
    ds_strbuf clean;
    ds_strbuf_init(&clean);
    ds_utf8_lossy(&clean, text ? text : "", len);
    free(text);
    cJSON *out = ds_strbuf_ok(&clean) ? cJSON_CreateObject() : NULL;
    if (out) cJSON_AddStringToObject(out, "prompt", clean.data ? clean.data : "");
    ds_strbuf_free(&clean);
    return respond_json(s, c, out);
}

enum MHD_Result ds_handle_generate(ds_conn *cs, struct MHD_Connection *c) {
    ds_server *s = cs->srv;
    ds_oai_kind kind = cs->route == DS_ROUTE_CHAT ? DS_OAI_CHAT : DS_OAI_COMPLETIONS;
    ds_oai_error e;
    ds_job *jobs[DS_OAI_MAX_CHOICES] = {NULL};
    jobs[0] = job_parse(s, c, kind, cs, &e);
    if (!jobs[0]) return ds_http_error(s, c, &e);
    const ds_oai_request *rq0 = &jobs[0]->rq;
    if (!model_known(s, rq0->model)) {
        ds_oai_error_set(&e, 404, "not_found_error", "model_not_found", "model",
                         "The model `%.200s` does not exist.", rq0->model);
        job_free(jobs[0]);
        return ds_http_error(s, c, &e);
    }
    /* Several choices (n > 1, a batch of prompts): each its own engine request (the body parsed
     * again), choice k = prompt k / n, sample k % n, seeded seed + k % n when the request is
     * seeded (as vLLM seeds its n child requests) */
    const int per_prompt = rq0->n, n = rq0->n * rq0->n_prompts;
    bool ok = true;
    for (int k = 1; k < n && ok; k++) {
        jobs[k] = job_parse(s, c, kind, cs, &e);
        ok = jobs[k] && ds_oai_request_select_prompt(&jobs[k]->rq, k / per_prompt, &e);
        if (ok && jobs[k]->rq.sp.has_seed) jobs[k]->rq.sp.seed += (uint64_t)(k % per_prompt);
    }
    for (int k = 0; k < n && ok; k++) ok = submit(jobs[k], cs->t_arrival, &e);
    if (!ok) {
        for (int i = 0; i < n; i++)
            if (jobs[i]) job_free(jobs[i]); /* aborts the choices already submitted */
        return ds_http_error(s, c, &e);
    }
    char id[sizeof jobs[0]->ctx.id];
    make_id(s, kind, id, sizeof id);
    const long long created = (long long)time(NULL);
    for (int i = 0; i < n; i++) {
        ds_job *j = jobs[i];
        j->ctx = (ds_oai_resp_ctx){
            .kind = kind,
            .created = created,
            .model = j->rq.model ? j->rq.model : s->o.served_names[0],
            .tok = s->tok,
            .logprobs = j->rq.logprobs,
            .include_usage = j->rq.include_usage || j->rq.continuous_usage,
            .continuous_usage = j->rq.continuous_usage,
            .return_token_ids = j->rq.return_token_ids,
            .prompt_ids = j->ids,
            .n_prompt_ids = j->n_ids,
            .index = i,
        };
        memcpy(j->ctx.id, id, sizeof id);
    }
    return rq0->stream ? respond_stream(jobs, n, per_prompt) : respond_whole(jobs, n, per_prompt);
}
