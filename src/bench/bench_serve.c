/* bench_serve.c — datasets, load generation, statistics and reporting of `bench serve`
 * (see bench_serve.h). */
#include "bench/bench_serve.h"

#include <curl/curl.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cjson/cJSON.h>

#include "bench/bench_client.h"
#include "tokenizer/tokenizer.h"

void ds_bench_opts_default(ds_bench_opts *o) {
    *o = (ds_bench_opts){
        .base_url = "http://127.0.0.1:8000",
        .dataset = "random",
        .num_prompts = 200,
        .input_len = 1024,
        .output_len = 512,
        .range_ratio = 0.0,
        .ignore_eos = true,
        .temperature = 0.0,
        .seed = 0,
        .levels = {1, 4, 8},
        .n_levels = 3,
        .request_rate = INFINITY,
        .timeout_s = 6 * 3600.0,
        .warmup = true,
        .multi_turn = 1,
        .turn_input_len = 32,
    };
}

/* One prepared request (multi-turn: the first request of a conversation). */
typedef struct bench_item {
    char *url;
    char *body;
    int input_len; /* known for the random dataset, else -1 (usage tells) */
    /* multi-turn (random dataset): the first prompt's ids, the new ids of every later turn
     * ([multi_turn − 1, turn_input_len]) and each turn's max_tokens */
    int32_t *ids, *turn_ids;
    int out_len;
} bench_item;

typedef struct bench_dataset {
    bench_item *items;
    int n;           /* items: requests, or conversations */
    char *model;     /* the model name the bodies carry */
} bench_dataset;

static void dataset_free(bench_dataset *d) {
    for (int i = 0; i < d->n; i++) {
        free(d->items[i].url);
        free(d->items[i].body);
        free(d->items[i].ids);
        free(d->items[i].turn_ids);
    }
    free(d->model);
    d->model = NULL;
    free(d->items);
    d->items = NULL;
    d->n = 0;
}

static char *join_url(const char *base, const char *path) {
    size_t n = strlen(base);
    while (n && base[n - 1] == '/') n--;
    char *u = malloc(n + strlen(path) + 1);
    if (!u) return NULL;
    memcpy(u, base, n);
    strcpy(u + n, path);
    return u;
}

/* Whether requests ask for token ids: multi-turn feeds them back; --return-token-ids times
 * every token's chunk, text or not. */
static bool asks_token_ids(const ds_bench_opts *o) { return o->multi_turn > 1 || o->return_token_ids; }

/* Adds the common fields and prints the body. Takes ownership of req. */
static char *finish_body(const ds_bench_opts *o, const char *model, cJSON *req, int max_tokens) {
    cJSON_AddStringToObject(req, "model", model);
    cJSON_AddNumberToObject(req, "max_tokens", max_tokens);
    cJSON_AddNumberToObject(req, "temperature", o->temperature);
    if (o->top_k != 0) cJSON_AddNumberToObject(req, "top_k", o->top_k);
    if (o->top_p > 0) cJSON_AddNumberToObject(req, "top_p", o->top_p);
    if (o->ignore_eos) cJSON_AddTrueToObject(req, "ignore_eos");
    if (o->min_tokens > 0) cJSON_AddNumberToObject(req, "min_tokens", o->min_tokens < max_tokens ? o->min_tokens : max_tokens);
    cJSON_AddTrueToObject(req, "stream");
    cJSON *so = cJSON_AddObjectToObject(req, "stream_options");
    cJSON_AddTrueToObject(so, "include_usage");
    if (asks_token_ids(o)) cJSON_AddTrueToObject(req, "return_token_ids");
    char *s = cJSON_PrintUnformatted(req);
    cJSON_Delete(req);
    return s;
}

/* A completions body whose prompt is the token ids ids[0, n). */
static char *ids_body(const ds_bench_opts *o, const char *model, const int32_t *ids, int n,
                      int max_tokens) {
    cJSON *req = cJSON_CreateObject();
    cJSON *p = cJSON_AddArrayToObject(req, "prompt");
    for (int k = 0; k < n; k++) cJSON_AddItemToArray(p, cJSON_CreateNumber(ids[k]));
    return finish_body(o, model, req, max_tokens);
}

static int len_in_range(ds_bench_rng *rng, int len, double r) {
    int lo = (int)floor(len * (1.0 - r)), hi = (int)ceil(len * (1.0 + r));
    if (lo < 1) lo = 1;
    if (hi < lo) hi = lo;
    return ds_bench_rng_int(rng, lo, hi);
}

static bool make_random(const ds_bench_opts *o, const char *model, int vocab,
                        const ds_tokenizer *tok, bench_dataset *d, char *err, size_t cap) {
    /* ids a prompt may use: every id, or (with a tokenizer) the ids of ordinary tokens */
    int *pool = malloc((size_t)vocab * sizeof *pool);
    if (!pool) return snprintf(err, cap, "out of memory"), false;
    int n_pool = 0;
    for (int id = 0; id < vocab; id++) {
        if (tok && (id >= (int)ds_tokenizer_vocab_size(tok) || ds_tokenizer_is_special(tok, id) ||
                    !ds_tokenizer_id_to_token(tok, id)))
            continue;
        pool[n_pool++] = id;
    }
    if (n_pool == 0) {
        free(pool);
        return snprintf(err, cap, "no usable token ids for random prompts"), false;
    }
    ds_bench_rng rng = {o->seed * 0x2545F4914F6CDD1Dull + 1};
    d->items = calloc((size_t)o->num_prompts, sizeof *d->items);
    if (!d->items) {
        free(pool);
        return snprintf(err, cap, "out of memory"), false;
    }
    const int n_turn_ids = (o->multi_turn - 1) * o->turn_input_len;
    for (int i = 0; i < o->num_prompts; i++) {
        int in = len_in_range(&rng, o->input_len, o->range_ratio);
        int out = len_in_range(&rng, o->output_len, o->range_ratio);
        bench_item *it = &d->items[i];
        it->ids = malloc((size_t)in * sizeof(int32_t));
        it->turn_ids = malloc(((size_t)n_turn_ids + 1) * sizeof(int32_t));
        if (!it->ids || !it->turn_ids) {
            free(pool);
            return snprintf(err, cap, "out of memory"), false;
        }
        for (int k = 0; k < in; k++) it->ids[k] = pool[ds_bench_rng_next(&rng) % (uint64_t)n_pool];
        for (int k = 0; k < n_turn_ids; k++)
            it->turn_ids[k] = pool[ds_bench_rng_next(&rng) % (uint64_t)n_pool];
        it->body = ids_body(o, model, it->ids, in, out);
        it->url = join_url(o->base_url, "/v1/completions");
        it->input_len = in;
        it->out_len = out;
        d->n++;
        if (!it->body || !it->url) {
            free(pool);
            return snprintf(err, cap, "out of memory"), false;
        }
    }
    free(pool);
    return true;
}

/* JSONL: {"prompt": "..."} → completions, {"messages": [...]} → chat; optional "max_tokens".
 * Lines are used in order, cycling when num_prompts exceeds the file. */
static bool make_jsonl(const ds_bench_opts *o, const char *model, bench_dataset *d, char *err,
                       size_t cap) {
    FILE *f = fopen(o->dataset_path, "r");
    if (!f) return snprintf(err, cap, "--dataset-path: cannot open '%s'", o->dataset_path), false;
    cJSON **lines = NULL;
    int n = 0, capl = 0, lineno = 0;
    char *line = NULL;
    size_t lcap = 0;
    ssize_t len;
    bool ok = true;
    while ((len = getline(&line, &lcap, f)) >= 0) {
        lineno++;
        while (len && (line[len - 1] == '\n' || line[len - 1] == '\r')) line[--len] = 0;
        if (len == 0) continue;
        cJSON *j = cJSON_ParseWithLength(line, (size_t)len);
        const cJSON *pr = cJSON_GetObjectItemCaseSensitive(j, "prompt");
        const cJSON *ms = cJSON_GetObjectItemCaseSensitive(j, "messages");
        if (!j || (!cJSON_IsString(pr) && !cJSON_IsArray(ms))) {
            snprintf(err, cap, "%s:%d: expected a JSON object with \"prompt\" (string) or "
                               "\"messages\" (array)", o->dataset_path, lineno);
            cJSON_Delete(j);
            ok = false;
            break;
        }
        if (n == capl) {
            capl = capl ? 2 * capl : 64;
            cJSON **g = realloc(lines, (size_t)capl * sizeof *g);
            if (!g) {
                cJSON_Delete(j);
                ok = false;
                snprintf(err, cap, "out of memory");
                break;
            }
            lines = g;
        }
        lines[n++] = j;
    }
    free(line);
    fclose(f);
    if (ok && n == 0) {
        snprintf(err, cap, "%s: no prompts", o->dataset_path);
        ok = false;
    }
    if (ok) {
        d->items = calloc((size_t)o->num_prompts, sizeof *d->items);
        if (!d->items) ok = false;
    }
    for (int i = 0; ok && i < o->num_prompts; i++) {
        const cJSON *j = lines[i % n];
        const cJSON *pr = cJSON_GetObjectItemCaseSensitive(j, "prompt");
        const cJSON *mt = cJSON_GetObjectItemCaseSensitive(j, "max_tokens");
        int out = cJSON_IsNumber(mt) && mt->valueint > 0 ? mt->valueint : o->output_len;
        cJSON *req = cJSON_CreateObject();
        if (cJSON_IsString(pr)) {
            cJSON_AddStringToObject(req, "prompt", pr->valuestring);
        } else {
            cJSON_AddItemToObject(req, "messages",
                                  cJSON_Duplicate(cJSON_GetObjectItemCaseSensitive(j, "messages"), 1));
        }
        d->items[i].body = finish_body(o, model, req, out);
        d->items[i].url = join_url(o->base_url, cJSON_IsString(pr) ? "/v1/completions"
                                                                   : "/v1/chat/completions");
        d->items[i].input_len = -1;
        d->n++;
        if (!d->items[i].body || !d->items[i].url) ok = false;
    }
    for (int i = 0; i < n; i++) cJSON_Delete(lines[i]);
    free(lines);
    return ok;
}

/* ---- running one level ---------------------------------------------------------------------- */

typedef struct bench_run {
    const ds_bench_opts *o;
    const bench_dataset *d;
    ds_bench_request *reqs; /* [d->n · multi_turn]: conversation i's turn t at i · T + t */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int in_flight, limit;
} bench_run;

typedef struct worker_arg {
    bench_run *run;
    int i;
} worker_arg;

/* Conversation i (multi-turn): its turns one after another, each prompt the last one + the
 * last output's token ids + the turn's new ids. A failed turn ends the conversation (the
 * turns after it are failures too). */
static void run_conversation(bench_run *run, int i) {
    const ds_bench_opts *o = run->o;
    const bench_item *it = &run->d->items[i];
    const int T = o->multi_turn;
    ds_bench_request *q = &run->reqs[(size_t)i * (size_t)T];
    int n = it->input_len, cap = n + T * (it->out_len + o->turn_input_len);
    int32_t *ids = malloc((size_t)cap * sizeof *ids);
    int t = 0;
    if (ids) memcpy(ids, it->ids, (size_t)n * sizeof *ids);
    for (; ids && t < T; t++) {
        char *body = t == 0 ? NULL : ids_body(o, run->d->model, ids, n, it->out_len);
        q[t].body = t == 0 ? it->body : body;
        if (q[t].body) ds_bench_request_run(&q[t]);
        else snprintf(q[t].error, sizeof q[t].error, "out of memory");
        q[t].body = NULL;
        free(body);
        if (q[t].ok && q[t].n_out_ids != q[t].output_tokens) {
            snprintf(q[t].error, sizeof q[t].error, "the server sent %d token_ids for %d output "
                     "tokens: multi-turn conversations need return_token_ids", q[t].n_out_ids,
                     q[t].output_tokens);
            q[t].ok = false;
        }
        if (!q[t].ok || n + q[t].n_out_ids + o->turn_input_len > cap) break;
        memcpy(ids + n, q[t].out_ids, (size_t)q[t].n_out_ids * sizeof *ids);
        n += q[t].n_out_ids;
        if (t + 1 < T) {
            memcpy(ids + n, it->turn_ids + (size_t)t * (size_t)o->turn_input_len,
                   (size_t)o->turn_input_len * sizeof *ids);
            n += o->turn_input_len;
        }
    }
    if (!ids && T > 0) snprintf(q[0].error, sizeof q[0].error, "out of memory");
    for (int k = t + 1; k < T; k++)
        snprintf(q[k].error, sizeof q[k].error, "an earlier turn of its conversation failed");
    free(ids);
}

static void *worker(void *p) {
    worker_arg *a = p;
    bench_run *run = a->run;
    if (run->o->multi_turn > 1) run_conversation(run, a->i);
    else ds_bench_request_run(&run->reqs[a->i]);
    pthread_mutex_lock(&run->mu);
    run->in_flight--;
    pthread_cond_broadcast(&run->cv);
    pthread_mutex_unlock(&run->mu);
    return NULL;
}

static void sleep_until(double t) {
    for (;;) {
        double now = ds_bench_now();
        if (now >= t) return;
        double dt = t - now;
        struct timespec ts = {(time_t)dt, (long)((dt - floor(dt)) * 1e9)};
        nanosleep(&ts, NULL);
    }
}

/* Issues every request of the dataset under the level's concurrency limit and the arrival
 * process; returns the duration (first send → last completion). */
static double run_level(const ds_bench_opts *o, const bench_dataset *d, int limit,
                        ds_bench_request *reqs) {
    bench_run run = {.o = o, .d = d, .reqs = reqs, .limit = limit > 0 ? limit : d->n};
    const int T = o->multi_turn;
    pthread_mutex_init(&run.mu, NULL);
    pthread_cond_init(&run.cv, NULL);
    pthread_t *th = calloc((size_t)d->n, sizeof *th);
    worker_arg *args = calloc((size_t)d->n, sizeof *args);
    bool *started = calloc((size_t)d->n, sizeof *started);
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setstacksize(&attr, 512 * 1024);
    ds_bench_rng rng = {o->seed ^ 0xA5A5A5A5DEADBEEFull};
    bool poisson = o->request_rate > 0 && isfinite(o->request_rate);
    double t0 = ds_bench_now(), next = t0;
    for (int i = 0; th && args && started && i < d->n; i++) {
        if (poisson) {
            sleep_until(next);
            /* exponential gaps: a Poisson process of rate request_rate */
            next += -log(1.0 - ds_bench_rng_uniform(&rng)) / o->request_rate;
        }
        pthread_mutex_lock(&run.mu);
        while (run.in_flight >= run.limit) pthread_cond_wait(&run.cv, &run.mu);
        run.in_flight++;
        pthread_mutex_unlock(&run.mu);
        ds_bench_request *q = &reqs[(size_t)i * (size_t)T]; /* the item's T requests */
        for (int t = 0; t < T; t++) {
            memset(&q[t], 0, sizeof q[t]);
            q[t].url = d->items[i].url;
            q[t].body = d->items[i].body; /* multi-turn: set per turn by run_conversation */
            q[t].api_key = o->api_key;
            q[t].timeout_s = o->timeout_s;
        }
        args[i] = (worker_arg){&run, i};
        if (pthread_create(&th[i], &attr, worker, &args[i]) != 0) {
            snprintf(q[0].error, sizeof q[0].error, "cannot start a client thread");
            pthread_mutex_lock(&run.mu);
            run.in_flight--;
            pthread_mutex_unlock(&run.mu);
            continue;
        }
        started[i] = true;
    }
    for (int i = 0; th && started && i < d->n; i++)
        if (started[i]) pthread_join(th[i], NULL);
    double t_end = t0;
    for (int i = 0; i < d->n * T; i++) {
        double end = reqs[i].t_send + reqs[i].e2el;
        if (reqs[i].t_send > 0 && end > t_end) t_end = end;
    }
    pthread_attr_destroy(&attr);
    free(th);
    free(args);
    free(started);
    pthread_mutex_destroy(&run.mu);
    pthread_cond_destroy(&run.cv);
    return t_end - t0;
}

/* ---- statistics and reporting --------------------------------------------------------------- */

typedef struct level_result {
    int max_concurrency;
    int completed, failed;
    long long in_tokens, out_tokens;
    double duration;
    ds_bench_stat ttft, tpot, itl, e2el; /* milliseconds */
    int n_itl;
    char first_error[256];
    /* multi-turn: TTFT of first and of later turns; later turns' prompt and cached tokens */
    int turns;
    ds_bench_stat ttft_first, ttft_later;
    long long later_in_tokens, later_cached_tokens;
} level_result;

static level_result summarize(const bench_dataset *d, ds_bench_request *reqs, int level,
                              double duration, int T) {
    level_result r = {.max_concurrency = level, .duration = duration, .turns = T};
    int n = d->n * T, total_itl = 0;
    for (int i = 0; i < n; i++) total_itl += reqs[i].ok ? reqs[i].n_itl : 0;
    double *ttft = calloc((size_t)n + 1, sizeof *ttft), *tpot = calloc((size_t)n + 1, sizeof *tpot);
    double *e2el = calloc((size_t)n + 1, sizeof *e2el);
    double *itl = calloc((size_t)total_itl + 1, sizeof *itl);
    double *ttft_t[2] = {calloc((size_t)n + 1, sizeof(double)), calloc((size_t)n + 1, sizeof(double))};
    int n_ttft = 0, n_tpot = 0, n_e2el = 0, n_ttft_t[2] = {0, 0};
    for (int i = 0; i < n; i++) {
        const ds_bench_request *q = &reqs[i];
        if (!q->ok) {
            r.failed++;
            if (!r.first_error[0]) snprintf(r.first_error, sizeof r.first_error, "%s", q->error);
            continue;
        }
        r.completed++;
        const int later = i % T > 0;
        const long long in = q->prompt_tokens >= 0 ? q->prompt_tokens : d->items[i / T].input_len;
        r.in_tokens += in;
        if (later) {
            r.later_in_tokens += in;
            r.later_cached_tokens += q->cached_tokens > 0 ? q->cached_tokens : 0;
        }
        if (ttft_t[later] && q->n_content_chunks > 0) ttft_t[later][n_ttft_t[later]++] = q->ttft * 1e3;
        r.out_tokens += q->output_tokens;
        if (ttft && q->n_content_chunks > 0) ttft[n_ttft++] = q->ttft * 1e3;
        if (e2el) e2el[n_e2el++] = q->e2el * 1e3;
        if (tpot && q->output_tokens > 1)
            tpot[n_tpot++] = (q->e2el - q->ttft) / (q->output_tokens - 1) * 1e3;
        for (int k = 0; itl && k < q->n_itl; k++) itl[r.n_itl++] = q->itl[k] * 1e3;
    }
    r.ttft = ds_bench_stats(ttft, ttft ? n_ttft : 0);
    r.tpot = ds_bench_stats(tpot, tpot ? n_tpot : 0);
    r.e2el = ds_bench_stats(e2el, e2el ? n_e2el : 0);
    r.itl = ds_bench_stats(itl, itl ? r.n_itl : 0);
    r.ttft_first = ds_bench_stats(ttft_t[0], ttft_t[0] ? n_ttft_t[0] : 0);
    r.ttft_later = ds_bench_stats(ttft_t[1], ttft_t[1] ? n_ttft_t[1] : 0);
    free(ttft_t[0]);
    free(ttft_t[1]);
    free(ttft);
    free(tpot);
    free(e2el);
    free(itl);
    return r;
}

static void print_section(const char *title, const char *abbr, const ds_bench_stat *s) {
    int pad = (50 - (int)strlen(title) - 2) / 2;
    printf("%.*s %s %.*s\n", pad, "--------------------------------------------------", title,
           50 - pad - (int)strlen(title) - 2, "--------------------------------------------------");
    char k[64];
    snprintf(k, sizeof k, "Mean %s (ms):", abbr);
    printf("%-40s %-10.2f\n", k, s->mean);
    snprintf(k, sizeof k, "Median %s (ms):", abbr);
    printf("%-40s %-10.2f\n", k, s->median);
    snprintf(k, sizeof k, "P99 %s (ms):", abbr);
    printf("%-40s %-10.2f\n", k, s->p99);
}

static void print_level(const level_result *r, double rate) {
    printf("============ Serving Benchmark Result ============\n");
    printf("%-40s %-10d\n", "Successful requests:", r->completed);
    printf("%-40s %-10d\n", "Failed requests:", r->failed);
    if (r->max_concurrency > 0) printf("%-40s %-10d\n", "Maximum request concurrency:", r->max_concurrency);
    else printf("%-40s %-10s\n", "Maximum request concurrency:", "unlimited");
    if (rate > 0 && isfinite(rate)) printf("%-40s %-10.2f\n", "Request rate (req/s):", rate);
    else printf("%-40s %-10s\n", "Request rate (req/s):", "inf");
    printf("%-40s %-10.2f\n", "Benchmark duration (s):", r->duration);
    printf("%-40s %-10lld\n", "Total input tokens:", r->in_tokens);
    printf("%-40s %-10lld\n", "Total generated tokens:", r->out_tokens);
    double d = r->duration > 0 ? r->duration : 1e-9;
    printf("%-40s %-10.2f\n", "Request throughput (req/s):", r->completed / d);
    printf("%-40s %-10.2f\n", "Output token throughput (tok/s):", r->out_tokens / d);
    printf("%-40s %-10.2f\n", "Total token throughput (tok/s):", (r->in_tokens + r->out_tokens) / d);
    print_section("Time to First Token", "TTFT", &r->ttft);
    print_section("Time per Output Token (excl. 1st token)", "TPOT", &r->tpot);
    print_section("Inter-token Latency", "ITL", &r->itl);
    print_section("End-to-end Latency", "E2EL", &r->e2el);
    if (r->turns > 1) {
        char t[64];
        snprintf(t, sizeof t, "Multi-turn (%d turns)", r->turns);
        print_section(t, "TTFT, first turns", &r->ttft_first);
        printf("%-40s %-10.2f\n", "Mean TTFT, later turns (ms):", r->ttft_later.mean);
        printf("%-40s %-10.2f\n", "Median TTFT, later turns (ms):", r->ttft_later.median);
        printf("%-40s %-10.2f\n", "P99 TTFT, later turns (ms):", r->ttft_later.p99);
        printf("%-40s %lld of %lld (%.1f %%)\n", "Cached prompt tokens, later turns:",
               r->later_cached_tokens, r->later_in_tokens,
               r->later_in_tokens ? 100.0 * (double)r->later_cached_tokens / (double)r->later_in_tokens : 0.0);
    }
    printf("==================================================\n");
    if (r->failed) printf("first error: %s\n", r->first_error);
    fflush(stdout);
}

static void add_stat(cJSON *o, const char *name, const ds_bench_stat *s) {
    char k[64];
    snprintf(k, sizeof k, "mean_%s_ms", name);
    cJSON_AddNumberToObject(o, k, s->mean);
    snprintf(k, sizeof k, "median_%s_ms", name);
    cJSON_AddNumberToObject(o, k, s->median);
    snprintf(k, sizeof k, "std_%s_ms", name);
    cJSON_AddNumberToObject(o, k, s->std);
    snprintf(k, sizeof k, "p99_%s_ms", name);
    cJSON_AddNumberToObject(o, k, s->p99);
}

static cJSON *level_json(const level_result *r, double rate) {
    cJSON *o = cJSON_CreateObject();
    if (r->max_concurrency > 0) cJSON_AddNumberToObject(o, "max_concurrency", r->max_concurrency);
    else cJSON_AddNullToObject(o, "max_concurrency");
    if (rate > 0 && isfinite(rate)) cJSON_AddNumberToObject(o, "request_rate", rate);
    else cJSON_AddStringToObject(o, "request_rate", "inf");
    double d = r->duration > 0 ? r->duration : 1e-9;
    cJSON_AddNumberToObject(o, "duration", r->duration);
    cJSON_AddNumberToObject(o, "completed", r->completed);
    cJSON_AddNumberToObject(o, "failed", r->failed);
    cJSON_AddNumberToObject(o, "total_input_tokens", (double)r->in_tokens);
    cJSON_AddNumberToObject(o, "total_output_tokens", (double)r->out_tokens);
    cJSON_AddNumberToObject(o, "request_throughput", r->completed / d);
    cJSON_AddNumberToObject(o, "output_throughput", r->out_tokens / d);
    cJSON_AddNumberToObject(o, "total_token_throughput", (r->in_tokens + r->out_tokens) / d);
    add_stat(o, "ttft", &r->ttft);
    add_stat(o, "tpot", &r->tpot);
    add_stat(o, "itl", &r->itl);
    add_stat(o, "e2el", &r->e2el);
    cJSON_AddNumberToObject(o, "itl_samples", r->n_itl);
    if (r->turns > 1) {
        cJSON_AddNumberToObject(o, "turns", r->turns);
        add_stat(o, "ttft_first_turn", &r->ttft_first);
        add_stat(o, "ttft_later_turns", &r->ttft_later);
        cJSON_AddNumberToObject(o, "later_turn_input_tokens", (double)r->later_in_tokens);
        cJSON_AddNumberToObject(o, "later_turn_cached_tokens", (double)r->later_cached_tokens);
    }
    if (r->first_error[0]) cJSON_AddStringToObject(o, "first_error", r->first_error);
    return o;
}

static void git_commit(const char *build, char *out, size_t cap) {
    if (build && build[0] && strcmp(build, "unknown") != 0) {
        snprintf(out, cap, "%s", build);
        return;
    }
    snprintf(out, cap, "unknown");
    FILE *p = popen("git rev-parse HEAD 2>/dev/null", "r");
    if (!p) return;
    char buf[128];
    if (fgets(buf, sizeof buf, p)) {
        buf[strcspn(buf, "\r\n")] = 0;
        if (buf[0]) snprintf(out, cap, "%s", buf);
    }
    pclose(p);
}

/* ---- the whole run ---------------------------------------------------------------------------- */

int ds_bench_serve_run(const ds_bench_opts *o) {
    if (curl_global_init(CURL_GLOBAL_DEFAULT) != CURLE_OK) {
        fprintf(stderr, "deltaserve bench serve: libcurl failed to initialise\n");
        return 1;
    }
    int rc = 1;
    char err[512] = "";
    char *models_body = NULL;
    cJSON *models = NULL, *result = NULL;
    ds_tokenizer *tok = NULL;
    bench_dataset d = {0};
    ds_bench_request *reqs = NULL;

    char *url = join_url(o->base_url, "/v1/models");
    long st = url ? ds_bench_http_get(url, o->api_key, 30, &models_body, err, sizeof err) : -1;
    free(url);
    if (st != 200) {
        if (st > 0) snprintf(err, sizeof err, "GET /v1/models answered HTTP %ld: %.200s", st,
                             models_body ? models_body : "");
        goto done;
    }
    models = cJSON_Parse(models_body);
    const cJSON *data = cJSON_GetObjectItemCaseSensitive(models, "data");
    const cJSON *card = cJSON_IsArray(data) ? data->child : NULL;
    const cJSON *id = cJSON_GetObjectItemCaseSensitive(card, "id");
    if (!cJSON_IsString(id)) {
        snprintf(err, sizeof err, "GET /v1/models: no model listed");
        goto done;
    }
    const char *model = o->model ? o->model : id->valuestring;
    const cJSON *ext = cJSON_GetObjectItemCaseSensitive(card, "deltaserve");
    const cJSON *vs = cJSON_GetObjectItemCaseSensitive(ext, "vocab_size");

    if (o->multi_turn < 1 || o->turn_input_len < 0 ||
        (o->multi_turn > 1 && strcmp(o->dataset, "random") != 0)) {
        snprintf(err, sizeof err, "--multi-turn %d: needs the random dataset and a count >= 1 "
                 "(--turn-input-len >= 0)", o->multi_turn);
        goto done;
    }
    d.model = strdup(model);
    if (!d.model) {
        snprintf(err, sizeof err, "out of memory");
        goto done;
    }
    if (!strcmp(o->dataset, "random")) {
        int vocab = cJSON_IsNumber(vs) ? vs->valueint : 0;
        if (o->tokenizer_dir) {
            ds_error e = {0};
            if (ds_tokenizer_load(o->tokenizer_dir, &tok, &e) != DS_OK) {
                snprintf(err, sizeof err, "--tokenizer: %.400s", e.msg);
                goto done;
            }
            int tv = (int)ds_tokenizer_vocab_size(tok);
            if (vocab <= 0 || tv < vocab) vocab = tv;
        }
        if (vocab <= 0) {
            snprintf(err, sizeof err, "the server does not report its vocabulary size: pass "
                                      "--tokenizer DIR");
            goto done;
        }
        if (!make_random(o, model, vocab, tok, &d, err, sizeof err)) goto done;
    } else if (!strcmp(o->dataset, "jsonl")) {
        if (!o->dataset_path) {
            snprintf(err, sizeof err, "--dataset jsonl needs --dataset-path FILE");
            goto done;
        }
        if (!make_jsonl(o, model, &d, err, sizeof err)) goto done;
    } else {
        snprintf(err, sizeof err, "--dataset: unknown dataset '%s' (random, jsonl)", o->dataset);
        goto done;
    }

    if (o->warmup) {
        ds_bench_request w = {.url = d.items[0].url, .body = d.items[0].body, .api_key = o->api_key,
                              .timeout_s = o->timeout_s};
        fprintf(stderr, "bench serve: warm-up request to %s ...\n", d.items[0].url);
        ds_bench_request_run(&w);
        ds_bench_request_free(&w);
        if (!w.ok) {
            snprintf(err, sizeof err, "the warm-up request failed: %s", w.error);
            goto done;
        }
    }

    reqs = calloc((size_t)d.n * (size_t)o->multi_turn, sizeof *reqs);
    result = cJSON_CreateObject();
    if (!reqs || !result) {
        snprintf(err, sizeof err, "out of memory");
        goto done;
    }
    char commit[128], date[64];
    git_commit(o->build_commit, commit, sizeof commit);
    time_t now = time(NULL);
    strftime(date, sizeof date, "%Y-%m-%dT%H:%M:%SZ", gmtime(&now));
    cJSON_AddStringToObject(result, "date", date);
    cJSON_AddStringToObject(result, "git_commit", commit);
    cJSON_AddStringToObject(result, "command", o->command_line ? o->command_line : "");
    cJSON_AddStringToObject(result, "base_url", o->base_url);
    cJSON_AddStringToObject(result, "model", model);
    cJSON_AddItemToObject(result, "server", card ? cJSON_Duplicate(card, 1) : cJSON_CreateNull());
    cJSON *ds = cJSON_AddObjectToObject(result, "dataset");
    cJSON_AddStringToObject(ds, "name", o->dataset);
    if (o->dataset_path) cJSON_AddStringToObject(ds, "path", o->dataset_path);
    cJSON_AddNumberToObject(ds, "num_prompts", o->num_prompts);
    cJSON_AddNumberToObject(ds, "input_len", o->input_len);
    cJSON_AddNumberToObject(ds, "output_len", o->output_len);
    cJSON_AddNumberToObject(ds, "range_ratio", o->range_ratio);
    cJSON_AddBoolToObject(ds, "ignore_eos", o->ignore_eos);
    cJSON_AddNumberToObject(ds, "min_tokens", o->min_tokens);
    cJSON_AddNumberToObject(ds, "temperature", o->temperature);
    if (o->top_k != 0) cJSON_AddNumberToObject(ds, "top_k", o->top_k);
    if (o->top_p > 0) cJSON_AddNumberToObject(ds, "top_p", o->top_p);
    cJSON_AddNumberToObject(ds, "seed", (double)o->seed);
    cJSON_AddBoolToObject(ds, "return_token_ids", asks_token_ids(o));
    if (o->multi_turn > 1) {
        cJSON_AddNumberToObject(ds, "multi_turn", o->multi_turn);
        cJSON_AddNumberToObject(ds, "turn_input_len", o->turn_input_len);
    }
    cJSON *runs = cJSON_AddArrayToObject(result, "runs");

    int any_ok = 0;
    for (int l = 0; l < o->n_levels; l++) {
        fprintf(stderr, "bench serve: %d %s, max concurrency %s%d, request rate %g/s\n", d.n,
                o->multi_turn > 1 ? "conversations" : "requests",
                o->levels[l] > 0 ? "" : "unlimited ", o->levels[l], o->request_rate);
        double dur = run_level(o, &d, o->levels[l], reqs);
        level_result r = summarize(&d, reqs, o->levels[l], dur, o->multi_turn);
        any_ok += r.completed;
        print_level(&r, o->request_rate);
        cJSON_AddItemToArray(runs, level_json(&r, o->request_rate));
        for (int i = 0; i < d.n * o->multi_turn; i++) ds_bench_request_free(&reqs[i]);
    }
    if (o->result_json) {
        char *s = cJSON_Print(result);
        FILE *f = s ? fopen(o->result_json, "w") : NULL;
        if (!f) {
            snprintf(err, sizeof err, "--result-json: cannot write '%s'", o->result_json);
            free(s);
            goto done;
        }
        fputs(s, f);
        fputc('\n', f);
        fclose(f);
        free(s);
        fprintf(stderr, "bench serve: results written to %s\n", o->result_json);
    }
    rc = any_ok ? 0 : 1;
    if (!any_ok) snprintf(err, sizeof err, "every request failed");
done:
    if (rc && err[0]) fprintf(stderr, "deltaserve bench serve: %s\n", err);
    free(reqs);
    dataset_free(&d);
    cJSON_Delete(result);
    cJSON_Delete(models);
    free(models_body);
    ds_tokenizer_free(tok);
    curl_global_cleanup();
    return rc;
}
