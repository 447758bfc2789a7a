/* bench_serve.h — `deltaserve bench serve`, the serving load generator (mirrors
 * `vllm bench serve`; ../shared/docs/benchmarking.md):
 *  - datasets: random token-id prompts (input/output length, range ratio, seeded) sent to
 *    /v1/completions as token arrays (so the input length is exact), or a JSONL file of
 *    {"prompt": ...} (→ /v1/completions) / {"messages": [...]} (→ /v1/chat/completions) lines;
 *  - load: --max-concurrency N (client-side semaphore; a sweep such as 1,4,8 runs each level)
 *    and/or --request-rate R (Poisson arrivals, seeded; inf = all at t = 0);
 *  - per request, streaming with usage: TTFT = send → first chunk with content, E2EL = send →
 *    last chunk, TPOT = (E2EL − TTFT) / (output tokens − 1), ITL = gaps between content chunks
 *    pooled over requests;
 *  - mean / median / std / p99 (numpy linear percentile), request and token throughputs,
 *    duration, failures; a printed table and --result-json FILE;
 *  - multi-turn conversations (--multi-turn T, random dataset): each of num_prompts
 *    conversations is T requests in a row on one concurrency slot, turn t + 1's prompt = turn
 *    t's prompt + its output token ids (return_token_ids) + turn_input_len new ids, so a
 *    server's prefix cache can resume it; TTFT is reported for first and later turns apart,
 *    with usage.prompt_tokens_details.cached_tokens summed.
 * One thread per in-flight request, each with its own libcurl easy handle. */
#ifndef DS_BENCH_SERVE_H
#define DS_BENCH_SERVE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "server/strbuf.h"

#define DS_BENCH_MAX_LEVELS 16

typedef struct ds_bench_opts {
    const char *base_url;        /* http://127.0.0.1:8000 */
    const char *build_commit;    /* the client binary's commit (NULL / "unknown": ask git in the
                                    working directory, whose metadata may be older) */
    const char *model;           /* NULL: the first model of GET /v1/models */
    const char *api_key;         /* NULL: none */
    const char *dataset;         /* "random" | "jsonl" */
    const char *dataset_path;    /* jsonl file */
    const char *tokenizer_dir;   /* optional: random ids avoid special / unused ids */
    int num_prompts;
    int input_len, output_len;   /* random dataset; output_len also for jsonl lines without one */
    double range_ratio;          /* lengths uniform in [L(1-r), L(1+r)] */
    bool ignore_eos;
    int min_tokens;              /* > 0: sent as min_tokens (vLLM's extension) */
    double temperature;
    int top_k;                   /* sent when ≠ 0 (−1: off, as vLLM) */
    double top_p;                /* sent when > 0 */
    uint64_t seed;
    int levels[DS_BENCH_MAX_LEVELS]; /* max concurrency per run; 0 = unlimited */
    int n_levels;
    double request_rate;         /* requests/s; <= 0 or inf = all at once */
    double timeout_s;            /* per request */
    bool warmup;
    const char *result_json;     /* NULL: no file */
    const char *command_line;    /* recorded in the result file */
    int multi_turn;              /* requests per conversation (1: independent requests) */
    bool return_token_ids;       /* ask for token ids: every token's chunk times TTFT / ITL */
    int turn_input_len;          /* new prompt ids per later turn */
} ds_bench_opts;

void ds_bench_opts_default(ds_bench_opts *o);

/* Runs every level, prints the tables, writes the JSON. Returns the process exit code (0 ok,
 * 1 when the server cannot be reached or every request failed). */
int ds_bench_serve_run(const ds_bench_opts *o);

/* ---- pieces, exposed for tests ---------------------------------------------------------------- */

typedef struct ds_bench_stat {
    double mean, median, std, p99;
} ds_bench_stat;

/* numpy.percentile(x, p) with the default linear interpolation; x sorted ascending, n ≥ 1. */
double ds_bench_percentile(const double *sorted, int n, double p);
/* Sorts v in place; all zero for n == 0 (as vLLM reports np.mean([] or 0)). */
ds_bench_stat ds_bench_stats(double *v, int n);

/* Incremental SSE reader: feed bytes as they arrive; each complete "data:" line is handed to
 * on_data (without the prefix and the optional single space). Chunking-independent. */
typedef struct ds_sse_reader {
    ds_strbuf line;
    void (*on_data)(void *ctx, const char *data, size_t len);
    void *ctx;
} ds_sse_reader;

void ds_sse_init(ds_sse_reader *r, void (*on_data)(void *, const char *, size_t), void *ctx);
void ds_sse_feed(ds_sse_reader *r, const char *buf, size_t len);
void ds_sse_free(ds_sse_reader *r);

/* Seeded generator (splitmix64) for datasets and arrivals. */
typedef struct ds_bench_rng {
    uint64_t s;
} ds_bench_rng;
uint64_t ds_bench_rng_next(ds_bench_rng *r);
double ds_bench_rng_uniform(ds_bench_rng *r);  /* [0, 1) */
int ds_bench_rng_int(ds_bench_rng *r, int lo, int hi); /* [lo, hi] */

#endif
