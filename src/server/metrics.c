#include "server/metrics.h"

#include <string.h>

#include "server/json_py.h"

/* vLLM's buckets, with finer ones below 10 ms for ITL/TPOT (small models on fast devices). */
static const double TTFT_B[] = {0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5,
                                0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0,
                                2560.0};
static const double ITL_B[] = {0.001, 0.0025, 0.005, 0.0075, 0.01, 0.025, 0.05, 0.075, 0.1,
                               0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
                               40.0, 80.0};
static const double E2E_B[] = {0.01, 0.05, 0.1, 0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0,
                               15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0,
                               1920.0, 7680.0};
static const double TOK_B[] = {1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000,
                               20000, 50000, 100000, 200000, 500000, 1000000};

#define N_OF(a) ((int)(sizeof(a) / sizeof((a)[0])))

void ds_histogram_init(ds_histogram *h, const double *bounds, int n) {
    DS_ASSERT(n <= DS_HIST_MAX_BUCKETS);
    memset(h, 0, sizeof *h);
    h->bounds = bounds;
    h->n = n;
}

void ds_histogram_observe(ds_histogram *h, double v) {
    int i = 0;
    while (i < h->n && v > h->bounds[i]) i++; /* Prometheus buckets are "le" (≤ bound) */
    h->counts[i]++;
    h->sum += v;
    h->count++;
}

void ds_metrics_init(ds_metrics *m) {
    memset(m, 0, sizeof *m);
    pthread_mutex_init(&m->mu, NULL);
    ds_histogram_init(&m->ttft, TTFT_B, N_OF(TTFT_B));
    ds_histogram_init(&m->itl, ITL_B, N_OF(ITL_B));
    ds_histogram_init(&m->tpot, ITL_B, N_OF(ITL_B));
    ds_histogram_init(&m->e2e, E2E_B, N_OF(E2E_B));
    ds_histogram_init(&m->prompt_len, TOK_B, N_OF(TOK_B));
    ds_histogram_init(&m->gen_len, TOK_B, N_OF(TOK_B));
}

void ds_metrics_free(ds_metrics *m) { pthread_mutex_destroy(&m->mu); }

void ds_metrics_observe_ttft(ds_metrics *m, double s) {
    pthread_mutex_lock(&m->mu);
    ds_histogram_observe(&m->ttft, s);
    pthread_mutex_unlock(&m->mu);
}

void ds_metrics_observe_itl(ds_metrics *m, double s) {
    pthread_mutex_lock(&m->mu);
    ds_histogram_observe(&m->itl, s);
    pthread_mutex_unlock(&m->mu);
}

void ds_metrics_observe_request(ds_metrics *m, ds_metrics_finish why, double e2e_s,
                                double ttft_s, int n_prompt, int n_gen) {
    pthread_mutex_lock(&m->mu);
    m->finished[why]++;
    ds_histogram_observe(&m->e2e, e2e_s);
    ds_histogram_observe(&m->prompt_len, n_prompt);
    ds_histogram_observe(&m->gen_len, n_gen);
    if (n_gen > 1) ds_histogram_observe(&m->tpot, (e2e_s - ttft_s) / (n_gen - 1));
    pthread_mutex_unlock(&m->mu);
}

void ds_metrics_count_http(ds_metrics *m, int status) {
    pthread_mutex_lock(&m->mu);
    for (int i = 0; i < DS_METRICS_N_CODES; i++) {
        if (m->codes[i] == status || m->codes[i] == 0) {
            m->codes[i] = status;
            m->code_counts[i]++;
            break;
        }
    }
    pthread_mutex_unlock(&m->mu);
}

/* ---- rendering ------------------------------------------------------------------------------ */

static void header(ds_strbuf *o, const char *name, const char *type, const char *help) {
    ds_strbuf_printf(o, "# HELP deltaserve:%s %s\n# TYPE deltaserve:%s %s\n", name, help, name, type);
}

static void sample_u64(ds_strbuf *o, const char *name, const char *labels, uint64_t v) {
    ds_strbuf_printf(o, "deltaserve:%s{%s} %llu\n", name, labels, (unsigned long long)v);
}

static void sample_f(ds_strbuf *o, const char *name, const char *labels, double v) {
    ds_strbuf_printf(o, "deltaserve:%s{%s} %.17g\n", name, labels, v);
}

static void gauge(ds_strbuf *o, const char *labels, const char *name, const char *help, double v) {
    header(o, name, "gauge", help);
    sample_f(o, name, labels, v);
}

static void counter(ds_strbuf *o, const char *labels, const char *name, const char *help,
                    uint64_t v) {
    header(o, name, "counter", help);
    sample_u64(o, name, labels, v);
}

static void histogram(ds_strbuf *o, const char *labels, const char *name, const char *help,
                      const ds_histogram *h) {
    header(o, name, "histogram", help);
    uint64_t cum = 0;
    for (int i = 0; i < h->n; i++) {
        cum += h->counts[i];
        ds_strbuf_printf(o, "deltaserve:%s_bucket{%s,le=\"%g\"} %llu\n", name, labels, h->bounds[i],
                         (unsigned long long)cum);
    }
    cum += h->counts[h->n];
    ds_strbuf_printf(o, "deltaserve:%s_bucket{%s,le=\"+Inf\"} %llu\n", name, labels,
                     (unsigned long long)cum);
    ds_strbuf_printf(o, "deltaserve:%s_sum{%s} %.17g\n", name, labels, h->sum);
    ds_strbuf_printf(o, "deltaserve:%s_count{%s} %llu\n", name, labels,
                     (unsigned long long)h->count);
}

/* A counter under vLLM's own name (vllm:NAME), for dashboards and tools that read vLLM's. */
static void vllm_counter(ds_strbuf *o, const char *L, const char *name, const char *help,
                         uint64_t v) {
    ds_strbuf_printf(o, "# HELP vllm:%s %s\n# TYPE vllm:%s counter\n", name, help, name);
    ds_strbuf_printf(o, "vllm:%s{%s} %llu\n", name, L, (unsigned long long)v);
}

/* vLLM's prefix-cache counters, in tokens: hit rate = hits / queries. */
static void prefix_counters(ds_strbuf *o, const char *L, const ds_engine_stats *st) {
    vllm_counter(o, L, "prefix_cache_queries_total", "Prompt tokens looked up in the prefix cache.",
                 st->prefix_queries);
    vllm_counter(o, L, "prefix_cache_hits_total", "Prompt tokens taken over from the prefix cache.",
                 st->prefix_hits);
}

/* Speculative decoding counters under vLLM's own names (vllm:spec_decode_*), so dashboards and
 * `bench serve` read them as they read vLLM's: acceptance rate = accepted / draft tokens, mean
 * accepted length = 1 + accepted / drafts. Exported only when speculative decoding is on. */
static void spec_counters(ds_strbuf *o, const char *L, const ds_engine_stats *st) {
    vllm_counter(o, L, "spec_decode_num_drafts_total",
                 "Verification steps that checked draft tokens.", st->spec.n_drafts);
    vllm_counter(o, L, "spec_decode_num_draft_tokens_total", "Draft tokens checked.",
                 st->spec.n_draft_tokens);
    vllm_counter(o, L, "spec_decode_num_accepted_tokens_total", "Draft tokens accepted.",
                 st->spec.n_accepted_tokens);
    const char *pn = "spec_decode_num_accepted_tokens_per_pos_total";
    ds_strbuf_printf(o, "# HELP vllm:%s Draft tokens accepted, by draft position.\n"
                        "# TYPE vllm:%s counter\n", pn, pn);
    const int k = st->num_speculative_tokens < DS_SPEC_MAX_K ? st->num_speculative_tokens
                                                              : DS_SPEC_MAX_K;
    for (int i = 0; i < k; i++)
        ds_strbuf_printf(o, "vllm:%s{%s,position=\"%d\"} %llu\n", pn, L, i,
                         (unsigned long long)st->spec.accepted_per_pos[i]);
}

void ds_metrics_render(ds_metrics *m, const ds_engine_stats *st, const char *model_name,
                       ds_strbuf *out) {
    /* Label value escaping: Prometheus uses \\, \" and \n, as a JSON string literal does. */
    ds_strbuf lb;
    ds_strbuf_init(&lb);
    ds_strbuf_puts(&lb, "model_name=");
    ds_json_py_string(&lb, model_name);
    const char *L = lb.data ? lb.data : "";

    gauge(out, L, "num_requests_running", "Requests in the running batch (holding caches).",
          st->running);
    gauge(out, L, "num_requests_waiting", "Requests waiting to be scheduled.", st->waiting);
    gauge(out, L, "kv_cache_usage_perc", "Fraction of KV-cache blocks in use (1 = full).",
          st->kv_blocks_total ? (double)st->kv_blocks_used / st->kv_blocks_total : 0.0);
    gauge(out, L, "kv_cache_blocks_used", "KV-cache blocks in use.", st->kv_blocks_used);
    gauge(out, L, "kv_cache_blocks_total", "KV-cache blocks in the pool.", st->kv_blocks_total);
    gauge(out, L, "state_slots_usage_perc",
          "Fraction of recurrent-state (GDN) slots in use (1 = full).",
          st->slots_total ? (double)st->slots_used / st->slots_total : 0.0);
    gauge(out, L, "state_slots_used", "Recurrent-state (GDN) slots in use.", st->slots_used);
    gauge(out, L, "state_slots_total", "Recurrent-state (GDN) slots.", st->slots_total);
    counter(out, L, "prompt_tokens_total", "Prefill tokens processed.", st->prompt_tokens);
    counter(out, L, "generation_tokens_total", "Generation tokens processed.",
            st->generation_tokens);
    counter(out, L, "num_preemptions_total", "Cumulative preemptions (recomputed requests).",
            st->preemptions);
    counter(out, L, "engine_steps_total", "Engine steps (batched forward passes).", st->steps);
    counter(out, L, "request_rejected_total",
            "Requests refused at submission (queue full or invalid).", st->requests_rejected);

    gauge(out, L, "graph_shapes_captured",
          "Step shapes replayed from a recorded step graph (start-up warmup or first use).",
          st->graph_shapes_captured);
    gauge(out, L, "graph_shapes_eager",
          "Step shapes whose graph recording failed: they run eagerly (the start-up report on "
          "stderr lists those of the warmup, with the reason).",
          st->graph_shapes_eager);

    counter(out, L, "greedy_steps_total",
            "Decode steps on the greedy ids-only path (fused lm_head + argmax, no logits).",
            st->greedy_steps);
    counter(out, L, "ban_uploads_total",
            "Banned-id tables (EOS / stop ids below min_tokens) sent to the device.",
            st->ban_uploads);
    gauge(out, L, "prefix_cache_entries",
          "Finished requests whose caches are kept for prompts that continue them (each holds "
          "a state slot; admission evicts them as it needs).",
          st->prefix_entries);
    gauge(out, L, "prefix_cache_blocks", "KV-cache blocks held by prefix-cache entries.",
          st->prefix_blocks);
    counter(out, L, "prefix_cache_evictions_total", "Prefix-cache entries evicted for room.",
            st->prefix_evicted);
    prefix_counters(out, L, st);
    if (st->num_speculative_tokens > 0) {
        spec_counters(out, L, st);
        counter(out, L, "spec_fused_verifications_total",
                "Verification steps decided on the device by the fused lm_head + argmax (no "
                "logits; rows below min_tokens with their ids banned).",
                st->spec_fused_steps);
        counter(out, L, "spec_device_accepts_total",
                "Verification steps accepted on the device, their draft passes issued before "
                "the host saw the result (no host round trip between verify and draft).",
                st->spec_device_accepts);
        counter(out, L, "spec_chained_verifications_total",
                "Verification steps queued before the host had read the one before them (the "
                "device never waits for the host's acceptance; DS_OPT_SPEC_ASYNC).",
                st->spec_chained_steps);
        counter(out, L, "spec_sampled_verifications_total",
                "Verification steps with sampled (temperature > 0) requests whose speculative "
                "sampling ran on the device (spec_sample; no logits left the device).",
                st->spec_sampled_steps);
    }

    pthread_mutex_lock(&m->mu);
    static const char *const reasons[DS_METRICS_FINISH_COUNT] = {"stop", "length", "abort"};
    header(out, "request_success_total", "counter",
           "Finished requests by finish reason (abort: client gone or engine failure).");
    for (int i = 0; i < DS_METRICS_FINISH_COUNT; i++) {
        ds_strbuf_printf(out, "deltaserve:request_success_total{%s,finished_reason=\"%s\"} %llu\n",
                         L, reasons[i], (unsigned long long)m->finished[i]);
    }
    header(out, "http_requests_total", "counter", "HTTP responses by status code.");
    for (int i = 0; i < DS_METRICS_N_CODES && m->codes[i]; i++)
        ds_strbuf_printf(out, "deltaserve:http_requests_total{%s,code=\"%d\"} %llu\n", L,
                         m->codes[i], (unsigned long long)m->code_counts[i]);
    histogram(out, L, "time_to_first_token_seconds", "Time to first token (from arrival).",
              &m->ttft);
    histogram(out, L, "inter_token_latency_seconds", "Time between consecutive outputs.", &m->itl);
    histogram(out, L, "request_time_per_output_token_seconds",
              "Per request: (E2E - TTFT) / (output tokens - 1).", &m->tpot);
    histogram(out, L, "e2e_request_latency_seconds", "End-to-end request latency.", &m->e2e);
    histogram(out, L, "request_prompt_tokens", "Prompt tokens per request.", &m->prompt_len);
    histogram(out, L, "request_generation_tokens", "Generated tokens per request.", &m->gen_len);
    pthread_mutex_unlock(&m->mu);
    ds_strbuf_free(&lb);
}
