/* deltaserve bench serve — the serving load generator (src/bench/bench_serve.h):
 *   deltaserve bench serve [--base-url URL | --host H --port P] [--model NAME]
 *       [--dataset random|jsonl] [--dataset-path FILE] [--num-prompts N]
 *       [--random-input-len N] [--random-output-len N] [--random-range-ratio R]
 *       [--max-concurrency 1,4,8] [--request-rate R] [--seed S] [--result-json FILE]
 *       [--multi-turn T [--turn-input-len N]] ...
 * argv[0] is "serve" (reached through `deltaserve bench serve`).
 *
 * Speculative decoding: when the server's /metrics has vLLM's vllm:spec_decode_* counters, they
 * are scraped before and after the run; the difference gives the acceptance rate (accepted /
 * draft tokens) and the mean accepted length (1 + accepted / drafts, tokens per verification),
 * printed after the tables and added to --result-json as "spec_decode". The difference covers
 * the whole invocation (every level, and the warm-up request). */
#ifndef DS_GIT_COMMIT
#define DS_GIT_COMMIT "unknown" /* set by CMake for the deltaserve target */
#endif

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "bench/bench_client.h"
#include "bench/bench_serve.h"
#include "cli/args.h"
#include "cli/cli_cmds.h"

static void usage(FILE *f) {
    fprintf(f,
            "usage: deltaserve bench serve [options]\n"
            "  --base-url URL            server (default http://127.0.0.1:8000)\n"
            "  --host H --port P         alternative to --base-url\n"
            "  --model NAME              model name to send (default: the server's first)\n"
            "  --api-key KEY             (default: $DELTASERVE_API_KEY)\n"
            "  --dataset random|jsonl    (default random)\n"
            "  --dataset-path FILE       JSONL: {\"prompt\": ...} or {\"messages\": [...]} per line\n"
            "  --num-prompts N           requests per concurrency level (default 200)\n"
            "  --random-input-len N      (default 1024)   --random-output-len N (default 512)\n"
            "  --random-range-ratio R    lengths uniform in [L(1-R), L(1+R)] (default 0)\n"
            "  --tokenizer DIR           random prompts use only ordinary tokens of DIR\n"
            "  --max-concurrency LIST    e.g. 1,4,8 (default); 0 = unlimited\n"
            "  --request-rate R          Poisson arrivals per second (default inf)\n"
            "  --temperature T           (default 0)   --no-ignore-eos\n"
            "  --top-k K  --top-p P      sent when given (default: the server's)\n"
            "  --min-tokens N            send min_tokens N (capped at each request's max_tokens)\n"
            "  --multi-turn T            random dataset: each prompt starts a conversation of T\n"
            "                            turns, turn t + 1 = turn t's prompt + output ids + new\n"
            "                            ids (TTFT of later turns and cached tokens reported)\n"
            "  --turn-input-len N        new ids per later turn (default 32)\n"
            "  --return-token-ids        ask for token ids: a chunk times every token, text or\n"
            "                            not (dummy weights' random ids hold text back)\n"
            "  --seed S                  (default 0)   --no-warmup\n"
            "  --request-timeout S       per request (default 21600)\n"
            "  --result-json FILE        write the results as JSON\n");
}

static bool parse_levels(const char *v, ds_bench_opts *o) {
    o->n_levels = 0;
    const char *p = v;
    while (*p) {
        char *end;
        long n = strtol(p, &end, 10);
        if (end == p || n < 0 || n > 1000000 || (*end && *end != ',') ||
            o->n_levels >= DS_BENCH_MAX_LEVELS) {
            fprintf(stderr, "deltaserve bench serve: --max-concurrency: bad list '%s' (up to %d "
                            "non-negative integers)\n", v, DS_BENCH_MAX_LEVELS);
            return false;
        }
        o->levels[o->n_levels++] = (int)n;
        p = *end ? end + 1 : end;
    }
    if (!o->n_levels) {
        fprintf(stderr, "deltaserve bench serve: --max-concurrency: empty list\n");
        return false;
    }
    return true;
}

/* The server's speculative-decoding counters (summed over label sets). */
typedef struct spec_counters {
    bool ok; /* the counters were there */
    double drafts, draft_tokens, accepted;
} spec_counters;

/* Value of the samples of metric `name` (name{...} v or name v lines), summed; false if absent. */
static bool metric_sum(const char *text, const char *name, double *out) {
    const size_t n = strlen(name);
    bool found = false;
    *out = 0;
    for (const char *p = text; p && *p;) {
        const char *eol = strchr(p, '\n');
        if (!strncmp(p, name, n) && (p[n] == '{' || p[n] == ' ')) {
            const char *sp = p + n;
            if (*sp == '{') sp = strchr(sp, '}');
            if (sp && (!eol || sp < eol)) {
                char *end;
                double v = strtod(sp + 1, &end);
                if (end != sp + 1) {
                    *out += v;
                    found = true;
                }
            }
        }
        p = eol ? eol + 1 : NULL;
    }
    return found;
}

static spec_counters scrape_spec(const ds_bench_opts *o) {
    spec_counters c = {0};
    char url[600], err[256];
    snprintf(url, sizeof url, "%s/metrics", o->base_url);
    char *body = NULL;
    long code = ds_bench_http_get(url, o->api_key, 10.0, &body, err, sizeof err);
    if (code == 200 && body) {
        c.ok = metric_sum(body, "vllm:spec_decode_num_drafts_total", &c.drafts) &&
               metric_sum(body, "vllm:spec_decode_num_draft_tokens_total", &c.draft_tokens) &&
               metric_sum(body, "vllm:spec_decode_num_accepted_tokens_total", &c.accepted);
    }
    free(body);
    return c;
}

/* Prints the run's speculative-decoding summary and adds it to the result file. */
static void report_spec(const ds_bench_opts *o, const spec_counters *a, const spec_counters *b) {
    const double drafts = b->drafts - a->drafts, dt = b->draft_tokens - a->draft_tokens,
                 acc = b->accepted - a->accepted;
    const double rate = dt > 0 ? acc / dt : 0, mean_len = drafts > 0 ? 1 + acc / drafts : 0;
    printf("---------------Speculative Decoding---------------\n");
    printf("%-40s %-10.2f\n", "Acceptance rate (%):", rate * 100);
    printf("%-40s %-10.2f\n", "Acceptance length:", mean_len);
    printf("%-40s %-10.0f\n", "Drafts:", drafts);
    printf("%-40s %-10.0f\n", "Draft tokens:", dt);
    printf("%-40s %-10.0f\n", "Accepted tokens:", acc);
    printf("==================================================\n");
    if (!o->result_json) return;
    FILE *f = fopen(o->result_json, "rb");
    if (!f) return; /* the run wrote none (it failed) */
    char *text = NULL;
    size_t n = 0, cap = 0, got;
    do {
        if (n + 4096 > cap) {
            char *t = realloc(text, cap = cap ? 2 * cap : 65536);
            if (!t) break;
            text = t;
        }
        got = fread(text + n, 1, cap - n - 1, f);
        n += got;
    } while (got > 0);
    fclose(f);
    cJSON *root = text ? cJSON_ParseWithLength(text, n) : NULL;
    free(text);
    if (!root) {
        fprintf(stderr, "bench serve: cannot add the speculative-decoding summary to %s\n",
                o->result_json);
        return;
    }
    cJSON *sd = cJSON_AddObjectToObject(root, "spec_decode");
    cJSON_AddNumberToObject(sd, "num_drafts", drafts);
    cJSON_AddNumberToObject(sd, "num_draft_tokens", dt);
    cJSON_AddNumberToObject(sd, "num_accepted_tokens", acc);
    cJSON_AddNumberToObject(sd, "acceptance_rate", rate);
    cJSON_AddNumberToObject(sd, "mean_accepted_length", mean_len);
    char *s = cJSON_Print(root);
    cJSON_Delete(root);
    if (s && (f = fopen(o->result_json, "w"))) {
        fputs(s, f);
        fputc('\n', f);
        fclose(f);
    }
    free(s);
}

int ds_cmd_bench_serve(int argc, char **argv) {
    const char *cmd = "bench serve";
    ds_bench_opts o;
    ds_bench_opts_default(&o);
    o.api_key = getenv("DELTASERVE_API_KEY");
    o.build_commit = DS_GIT_COMMIT;
    const char *host = NULL;
    long port = -1;
    bool bad = false;
    char url[512];
    for (int i = 1; i < argc && !bad; i++) {
        const char *v;
        long n;
        double d;
        uint64_t u;
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            usage(stdout);
            return 0;
        } else if (!strcmp(argv[i], "--no-ignore-eos")) {
            o.ignore_eos = false;
        } else if (!strcmp(argv[i], "--ignore-eos")) {
            o.ignore_eos = true;
        } else if (!strcmp(argv[i], "--no-warmup")) {
            o.warmup = false;
        } else if (!strcmp(argv[i], "--return-token-ids")) {
            o.return_token_ids = true;
        } else if ((v = ds_arg_value(argc, argv, &i, "--base-url", cmd, &bad))) {
            o.base_url = v;
        } else if ((v = ds_arg_value(argc, argv, &i, "--host", cmd, &bad))) {
            host = v;
        } else if ((v = ds_arg_value(argc, argv, &i, "--port", cmd, &bad))) {
            if (!ds_arg_int(cmd, "--port", v, 1, 65535, &port)) return 2;
        } else if ((v = ds_arg_value(argc, argv, &i, "--model", cmd, &bad))) {
            o.model = v;
        } else if ((v = ds_arg_value(argc, argv, &i, "--api-key", cmd, &bad))) {
            o.api_key = v;
        } else if ((v = ds_arg_value(argc, argv, &i, "--dataset-path", cmd, &bad))) {
            o.dataset_path = v;
        } else if ((v = ds_arg_value(argc, argv, &i, "--dataset-name", cmd, &bad)) ||
                   (v = ds_arg_value(argc, argv, &i, "--dataset", cmd, &bad))) {
            o.dataset = v;
        } else if ((v = ds_arg_value(argc, argv, &i, "--num-prompts", cmd, &bad))) {
            if (!ds_arg_int(cmd, "--num-prompts", v, 1, 10000000, &n)) return 2;
            o.num_prompts = (int)n;
        } else if ((v = ds_arg_value(argc, argv, &i, "--random-input-len", cmd, &bad)) ||
                   (v = ds_arg_value(argc, argv, &i, "--input-len", cmd, &bad))) {
            if (!ds_arg_int(cmd, "--random-input-len", v, 1, 1 << 24, &n)) return 2;
            o.input_len = (int)n;
        } else if ((v = ds_arg_value(argc, argv, &i, "--random-output-len", cmd, &bad)) ||
                   (v = ds_arg_value(argc, argv, &i, "--output-len", cmd, &bad))) {
            if (!ds_arg_int(cmd, "--random-output-len", v, 1, 1 << 24, &n)) return 2;
            o.output_len = (int)n;
        } else if ((v = ds_arg_value(argc, argv, &i, "--random-range-ratio", cmd, &bad))) {
            if (!ds_arg_float(cmd, "--random-range-ratio", v, 0, 0.999, &d)) return 2;
            o.range_ratio = d;
        } else if ((v = ds_arg_value(argc, argv, &i, "--tokenizer", cmd, &bad))) {
            o.tokenizer_dir = v;
        } else if ((v = ds_arg_value(argc, argv, &i, "--max-concurrency", cmd, &bad))) {
            if (!parse_levels(v, &o)) return 2;
        } else if ((v = ds_arg_value(argc, argv, &i, "--request-rate", cmd, &bad))) {
            if (!strcmp(v, "inf")) o.request_rate = INFINITY;
            else if (!ds_arg_float(cmd, "--request-rate", v, 1e-6, 1e9, &d)) return 2;
            else o.request_rate = d;
        } else if ((v = ds_arg_value(argc, argv, &i, "--multi-turn", cmd, &bad))) {
            if (!ds_arg_int(cmd, "--multi-turn", v, 1, 1000, &n)) return 2;
            o.multi_turn = (int)n;
        } else if ((v = ds_arg_value(argc, argv, &i, "--turn-input-len", cmd, &bad))) {
            if (!ds_arg_int(cmd, "--turn-input-len", v, 0, 1 << 20, &n)) return 2;
            o.turn_input_len = (int)n;
        } else if ((v = ds_arg_value(argc, argv, &i, "--min-tokens", cmd, &bad))) {
            if (!ds_arg_int(cmd, "--min-tokens", v, 0, 1 << 20, &n)) return 2;
            o.min_tokens = (int)n;
        } else if ((v = ds_arg_value(argc, argv, &i, "--temperature", cmd, &bad))) {
            if (!ds_arg_float(cmd, "--temperature", v, 0, 100, &d)) return 2;
            o.temperature = d;
        } else if ((v = ds_arg_value(argc, argv, &i, "--top-k", cmd, &bad))) {
            if (!ds_arg_int(cmd, "--top-k", v, -1, 1 << 30, &n)) return 2;
            o.top_k = (int)n;
        } else if ((v = ds_arg_value(argc, argv, &i, "--top-p", cmd, &bad))) {
            if (!ds_arg_float(cmd, "--top-p", v, 1e-9, 1, &d)) return 2;
            o.top_p = d;
        } else if ((v = ds_arg_value(argc, argv, &i, "--seed", cmd, &bad))) {
            if (!ds_arg_u64(cmd, "--seed", v, &u)) return 2;
            o.seed = u;
        } else if ((v = ds_arg_value(argc, argv, &i, "--request-timeout", cmd, &bad))) {
            if (!ds_arg_float(cmd, "--request-timeout", v, 0.001, 1e7, &d)) return 2;
            o.timeout_s = d;
        } else if ((v = ds_arg_value(argc, argv, &i, "--result-json", cmd, &bad))) {
            o.result_json = v;
        } else if (!bad) {
            fprintf(stderr, "deltaserve bench serve: unknown option '%s'\n", argv[i]);
            usage(stderr);
            return 2;
        }
    }
    if (bad) return 2;
    if (host || port > 0) {
        snprintf(url, sizeof url, "http://%s:%ld", host ? host : "127.0.0.1", port > 0 ? port : 8000);
        o.base_url = url;
    }
    /* the command line, for the result file */
    size_t len = 32;
    for (int i = 0; i < argc; i++) len += strlen(argv[i]) + 1;
    char *cl = malloc(len);
    if (cl) {
        snprintf(cl, len, "deltaserve bench");
        for (int i = 0; i < argc; i++) {
            strcat(cl, " ");
            strcat(cl, argv[i]);
        }
        o.command_line = cl;
    }
    const spec_counters before = scrape_spec(&o);
    int rc = ds_bench_serve_run(&o);
    if (before.ok && rc == 0) {
        const spec_counters after = scrape_spec(&o);
        if (after.ok) report_spec(&o, &before, &after);
    }
    free(cl);
    return rc;
}
