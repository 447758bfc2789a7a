/* deltaserve bench serve — the serving load generator (src/bench/bench_serve.h):
 *   deltaserve bench serve [--base-url URL | --host H --port P] [--model NAME]
 *       [--dataset random|jsonl] [--dataset-path FILE] [--num-prompts N]
 *       [--random-input-len N] [--random-output-len N] [--random-range-ratio R]
 *       [--max-concurrency 1,4,8] [--request-rate R] [--seed S] [--result-json FILE] ...
 * argv[0] is "serve" (reached through `deltaserve bench serve`). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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

int ds_cmd_bench_serve(int argc, char **argv) {
    const char *cmd = "bench serve";
    ds_bench_opts o;
    ds_bench_opts_default(&o);
    o.api_key = getenv("DELTASERVE_API_KEY");
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
        } else if ((v = ds_arg_value(argc, argv, &i, "--temperature", cmd, &bad))) {
            if (!ds_arg_float(cmd, "--temperature", v, 0, 100, &d)) return 2;
            o.temperature = d;
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
    int rc = ds_bench_serve_run(&o);
    free(cl);
    return rc;
}
