/* metrics.h — Prometheus metrics of the server, named in parallel to vLLM's
 * (vllm:num_requests_running → deltaserve:num_requests_running, ...).
 *
 * Request-level series (latency histograms, finished counts, HTTP responses) are observed by
 * the HTTP threads under one mutex; engine gauges and token counters come from a
 * ds_engine_stats snapshot taken at render time. */
#ifndef DS_SERVER_METRICS_H
#define DS_SERVER_METRICS_H

#include <pthread.h>
#include <stdint.h>

#include "runtime/engine.h"
#include "server/strbuf.h"

#define DS_HIST_MAX_BUCKETS 32

typedef struct ds_histogram {
    const double *bounds; /* [n] upper bounds, increasing (+Inf implied) */
    int n;
    uint64_t counts[DS_HIST_MAX_BUCKETS + 1]; /* per bucket, not cumulative; [n] = +Inf */
    double sum;
    uint64_t count;
} ds_histogram;

void ds_histogram_init(ds_histogram *h, const double *bounds, int n);
void ds_histogram_observe(ds_histogram *h, double v);

typedef enum ds_metrics_finish {
    DS_METRICS_FINISH_STOP = 0,
    DS_METRICS_FINISH_LENGTH,
    DS_METRICS_FINISH_ABORT,
    DS_METRICS_FINISH_COUNT,
} ds_metrics_finish;

#define DS_METRICS_N_CODES 12

typedef struct ds_metrics {
    pthread_mutex_t mu;
    ds_histogram ttft;        /* time_to_first_token_seconds */
    ds_histogram itl;         /* inter_token_latency_seconds (per output event) */
    ds_histogram tpot;        /* request_time_per_output_token_seconds */
    ds_histogram e2e;         /* e2e_request_latency_seconds */
    ds_histogram prompt_len;  /* request_prompt_tokens */
    ds_histogram gen_len;     /* request_generation_tokens */
    uint64_t finished[DS_METRICS_FINISH_COUNT];
    int codes[DS_METRICS_N_CODES];        /* HTTP status codes seen, in first-seen order */
    uint64_t code_counts[DS_METRICS_N_CODES];
} ds_metrics;

void ds_metrics_init(ds_metrics *m);
void ds_metrics_free(ds_metrics *m);

void ds_metrics_observe_ttft(ds_metrics *m, double seconds);
void ds_metrics_observe_itl(ds_metrics *m, double seconds);
/* A request that produced output: its end-to-end latency, token counts, TPOT when n_gen > 1. */
void ds_metrics_observe_request(ds_metrics *m, ds_metrics_finish why, double e2e_s,
                                double ttft_s, int n_prompt, int n_gen);
void ds_metrics_count_http(ds_metrics *m, int status);

/* Prometheus text exposition format 0.0.4. */
void ds_metrics_render(ds_metrics *m, const ds_engine_stats *st, const char *model_name,
                       ds_strbuf *out);

#endif
