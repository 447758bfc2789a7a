/* bench_ablation.h — the offline engine benchmark's measurement (cmd_bench.c) as a function,
 * and `deltaserve bench --ablation` (bench_ablation.c), which calls it once per ablation row. */
#ifndef DS_CLI_BENCH_ABLATION_H
#define DS_CLI_BENCH_ABLATION_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "core/status.h"
#include "model/config.h"
#include "model/weights.h"

#define DS_BENCH_MAX_BATCH 1024 /* largest --batch size (graph keys) */
#define DS_BENCH_MAX_BATCHES 16 /* most --batch sizes in one run */

typedef struct ds_bench_args {
    const char *model_dir, *device, *json_out, *batches_arg;
    bool dummy;
    uint64_t seed;
    int threads, prompt_len, steps, warmup, repeats;
    int n_spec;  /* --num-speculative-tokens */
    bool graphs; /* --graphs: replay decode steps from step graphs when the backend has them */
    /* --ablation */
    bool ablation;
    const char *ablation_rows; /* "0,1,5" or NULL = every row */
    const char *ablation_out;  /* output directory */
} ds_bench_args;

/* One decode batch size's measurement. */
typedef struct ds_bench_batch_result {
    int batch;
    double step_ms, p10_ms, p90_ms;   /* median / percentiles of the measured steps */
    double bytes, gbps, ratio;        /* estimated bytes per step, achieved GB/s, / copy GB/s */
    unsigned long long kernels;       /* launches per step (0 when the backend does not count) */
    bool graph;                       /* the steps replayed a captured graph */
    double verify_ms, draft_ms;       /* speculative: one verification / one draft phase */
} ds_bench_batch_result;

typedef struct ds_bench_result {
    char device[128];  /* GPU name (or backend name) */
    char backend[32];
    double ttft_ms;    /* prefill of prompt_len tokens, median of `repeats` */
    bool fused_argmax; /* decode steps fused the lm_head with the argmax */
    bool no_mtp_head;  /* the run failed because n_spec > 0 and the model has no MTP head */
    size_t n_batches;
    ds_bench_batch_result b[DS_BENCH_MAX_BATCHES];
    /* speculative decoding (n_spec > 0): the greedy batch-1 generation */
    bool spec;
    int spec_generated;
    double spec_ms_per_token, spec_plain_ms, spec_acceptance, spec_tokens_per_step;
} ds_bench_result;

/* Creates backend + model (dummy weights, or `host` weights already loaded) + session under the
 * current environment (DS_OPT_* switches are read here), measures prefill, decode at every batch
 * size and, with a->n_spec > 0, speculative decoding; prints the usual tables to stdout, appends
 * the usual JSON lines to `json` (may be NULL); frees everything. a->n_spec > 0 needs an MTP head
 * (DS_ERR_UNSUPPORTED otherwise). */
ds_status ds_bench_measure(const ds_bench_args *a, const ds_config *cfg,
                           const ds_model_weights *host, const int32_t *batches, size_t n_batches,
                           FILE *json, ds_bench_result *out, ds_error *err);

/* `deltaserve bench --ablation`: argv is the command's argv (for the report's command line).
 * Returns the process exit code. */
int ds_bench_ablation(const ds_bench_args *a, const int32_t *batches, size_t n_batches, int argc,
                      char **argv);

#endif
