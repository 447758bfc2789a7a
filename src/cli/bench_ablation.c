/* deltaserve bench --ablation (issue 6): the optimisation ablation report in one command.
 * Starting from every optimisation off, the rows of k_rows switch items on one at a time in a
 * fixed order; each row sets its DS_OPT_* variables, creates backend + model + session
 * (ds_bench_measure: the switches are read when the backend is created), measures TTFT and decode
 * TPOT at every --batch size, and frees everything. The last row adds MTP speculative decoding.
 * Writes ablation.jsonl, ablation.md and ablation.svg (bench/ablation_report.h) to
 * --ablation-out (default bench/results/ablation/). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "bench/ablation_report.h"
#include "cli/args.h"
#include "cli/bench_ablation.h"
#include "model/loader.h"
#include "runtime/spec.h"

#ifndef DS_GIT_COMMIT
#define DS_GIT_COMMIT "unknown"
#endif

/* The switches a row sets, in this order (each to "1" or "0"). */
enum {
    SW_ROUTE, SW_SHARED, SW_FUSED_NORM, SW_PDL, SW_PREFETCH, SW_FUSED_ARGMAX, SW_MOE_GEMM,
    SW_ROUTE_FUSED, SW_TC_GEMV, SW_COUNT
};
static const char *const k_switch_env[SW_COUNT] = {
    "DS_OPT_MOE_FAST_ROUTE", "DS_OPT_SHARED_EXPERT", "DS_OPT_FUSED_NORM", "DS_OPT_PDL",
    "DS_OPT_PREFETCH", "DS_OPT_FUSED_ARGMAX", "DS_OPT_MOE_GEMM", "DS_OPT_MOE_ROUTE_FUSED",
    "DS_OPT_TC_GEMV"};

typedef struct abl_row_def {
    const char *label; /* what this row adds to the previous one */
    const char *items; /* catalogue item numbers */
    bool on[SW_COUNT];
    bool graphs; /* bench --graphs */
    bool spec;   /* MTP speculative decoding with k = --num-speculative-tokens (default 1) */
} abl_row_def;

/* Fixed order; each row = the previous row + one item. The L2 prefetch (catalogue item 11)
 * measured slower (docs/cuda_notes.md), so it is off by default: the row after it turns it off
 * again, which makes that row the shipped defaults (and a repeat of the row before the prefetch,
 * a reading of run-to-run noise); the MTP row builds on the defaults. The grouped MoE GEMM is not
 * a catalogue item: it changes prefill (TTFT), not decode steps. */
static const abl_row_def k_rows[] = {
    /*                                   route shared norm pdl pf argmax gemm in-gate_up tc-gemv */
    {"baseline: everything off", "", {0, 0, 0, 0, 0, 0, 0, 0, 0}, false, false},
    {"+ whole-step CUDA graphs", "14", {0, 0, 0, 0, 0, 0, 0, 0, 0}, true, false},
    {"+ lm_head fused with argmax, no logits written", "7, 8", {0, 0, 0, 0, 0, 1, 0, 0, 0}, true, false},
    {"+ MoE routing from shared memory in one launch (DS_OPT_MOE_FAST_ROUTE)", "14",
     {1, 0, 0, 0, 0, 1, 0, 0, 0}, true, false},
    {"+ shared expert fused into the routed experts' launch (DS_OPT_SHARED_EXPERT)", "1",
     {1, 1, 0, 0, 0, 1, 0, 0, 0}, true, false},
    {"+ residual add + RMSNorm fused into the MoE combine (DS_OPT_FUSED_NORM)", "14",
     {1, 1, 1, 0, 0, 1, 0, 0, 0}, true, false},
    {"+ programmatic dependent launch (DS_OPT_PDL)", "14", {1, 1, 1, 1, 0, 1, 0, 0, 0}, true, false},
    {"+ MoE routing inside the routed experts' gate_up launch (DS_OPT_MOE_ROUTE_FUSED)", "14",
     {1, 1, 1, 1, 0, 1, 0, 1, 0}, true, false},
    {"+ decode GEMVs on tensor cores (DS_OPT_TC_GEMV)", "", {1, 1, 1, 1, 0, 1, 0, 1, 1}, true, false},
    {"+ routed experts of prefill steps as a grouped tensor-core GEMM (DS_OPT_MOE_GEMM)", "",
     {1, 1, 1, 1, 0, 1, 1, 1, 1}, true, false},
    {"+ L2 weight prefetch before the dependency wait (DS_OPT_PREFETCH)", "11",
     {1, 1, 1, 1, 1, 1, 1, 1, 1}, true, false},
    {"- L2 weight prefetch again: the shipped defaults", "11", {1, 1, 1, 1, 0, 1, 1, 1, 1}, true, false},
    {"+ MTP speculative decoding", "16", {1, 1, 1, 1, 0, 1, 1, 1, 1}, true, true},
};
#define N_ROWS ((int)(sizeof k_rows / sizeof k_rows[0]))

/* Owned strings behind one report row. */
typedef struct abl_row_text {
    char label[160], switches[256], note[600];
} abl_row_text;

/* mkdir -p */
static bool make_dirs(const char *path, ds_error *err) {
    char buf[4096];
    const int n = snprintf(buf, sizeof buf, "%s", path);
    if (n <= 0 || n >= (int)sizeof buf) {
        ds_error_set(err, DS_ERR_INVALID_ARG, "--ablation-out: bad path '%s'", path);
        return false;
    }
    for (char *p = buf + 1;; p++) {
        const bool end = *p == 0;
        if (*p == '/' || end) {
            *p = 0;
            if (mkdir(buf, 0777) != 0 && errno != EEXIST) {
                ds_error_set(err, DS_ERR_IO, "--ablation-out: cannot create '%s': %s", buf,
                             strerror(errno));
                return false;
            }
            if (end) break;
            *p = '/';
        }
    }
    struct stat sb;
    if (stat(path, &sb) != 0 || !S_ISDIR(sb.st_mode)) {
        ds_error_set(err, DS_ERR_IO, "--ablation-out: '%s' is not a directory", path);
        return false;
    }
    return true;
}

/* The command line as typed (single-quoted where a shell would need it), for the report. */
static void command_line(int argc, char **argv, char *buf, size_t cap) {
    size_t n = (size_t)snprintf(buf, cap, "deltaserve");
    for (int i = 0; i < argc && n < cap; i++) {
        const char *s = argv[i];
        const bool plain = *s && strspn(s, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
                                           "0123456789-_=./,:+@%") == strlen(s);
        const int w = snprintf(buf + n, cap - n, plain ? " %s" : " '%s'", s);
        if (w < 0) break;
        n += (size_t)w;
    }
    for (size_t i = 0; buf[i]; i++) /* the Markdown code span must not end early */
        if (buf[i] == '`') buf[i] = '\'';
}

/* --ablation-rows → sorted distinct row numbers; all rows when NULL. */
static bool select_rows(const char *arg, int *rows, int *n) {
    if (!arg) {
        for (int i = 0; i < N_ROWS; i++) rows[i] = i;
        *n = N_ROWS;
        return true;
    }
    int32_t *ids = NULL;
    size_t m = 0;
    if (!ds_arg_ids("bench", "--ablation-rows", arg, N_ROWS, &ids, &m)) return false;
    bool seen[N_ROWS] = {0};
    for (size_t i = 0; i < m; i++) seen[ids[i]] = true;
    free(ids);
    *n = 0;
    for (int i = 0; i < N_ROWS; i++)
        if (seen[i]) rows[(*n)++] = i;
    if (*n == 0) {
        fprintf(stderr, "deltaserve bench: --ablation-rows: no rows given\n");
        return false;
    }
    return true;
}

static bool write_file(const char *dir, const char *name, const ds_abl_report *rep,
                       int (*writer)(const ds_abl_report *, FILE *), ds_error *err) {
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "w");
    if (!f) {
        ds_error_set(err, DS_ERR_IO, "cannot write '%s': %s", path, strerror(errno));
        return false;
    }
    const int rc = writer(rep, f);
    if (fclose(f) != 0 || rc != 0) {
        ds_error_set(err, DS_ERR_IO, "error writing '%s'", path);
        return false;
    }
    fprintf(stderr, "ablation: wrote %s\n", path);
    return true;
}

/* The row's result → the report row. */
static void fill_row(ds_abl_row *row, const ds_bench_result *res, const int32_t *batches,
                     size_t n_batches, bool spec, int k) {
    row->run = true;
    row->ttft_ms = res->ttft_ms;
    for (size_t j = 0; j < n_batches; j++) {
        const ds_bench_batch_result *b = &res->b[j];
        ds_abl_cell *c = &row->cells[j];
        if (!spec) {
            *c = (ds_abl_cell){.tpot_ms = b->step_ms, .p10_ms = b->p10_ms, .p90_ms = b->p90_ms,
                               .kernels = b->kernels, .graph = b->graph};
            continue;
        }
        /* batch 1: the measured generation; larger batches: computed from measured step times
         * and the measured tokens per verification step */
        const double tps = res->spec_tokens_per_step > 0 ? res->spec_tokens_per_step : 1.0;
        *c = (ds_abl_cell){.verify_ms = b->verify_ms, .draft_ms = b->draft_ms};
        if (batches[j] == 1) {
            c->tpot_ms = res->spec_ms_per_token;
        } else {
            c->tpot_ms = (b->verify_ms + b->draft_ms) / tps;
            c->computed = true;
        }
    }
    if (spec) {
        row->spec_k = k;
        row->spec_generated = res->spec_generated;
        row->acceptance_rate = res->spec_acceptance;
        row->tokens_per_step = res->spec_tokens_per_step;
        row->plain_ms_b1 = res->spec_plain_ms;
    }
}

int ds_bench_ablation(const ds_bench_args *a, const int32_t *batches, size_t n_batches, int argc,
                      char **argv) {
    int sel[N_ROWS], n_sel = 0;
    if (!select_rows(a->ablation_rows, sel, &n_sel)) return 2;
    const char *out_dir = a->ablation_out ? a->ablation_out : "bench/results/ablation";
    const int k = a->n_spec > 0 ? a->n_spec : 1;

    static ds_abl_report rep; /* large: rows × batches of cells */
    static abl_row_text text[N_ROWS];
    static char cmd[4096], date[64], gpu[128], backend[32];
    memset(&rep, 0, sizeof rep);
    command_line(argc, argv, cmd, sizeof cmd);
    const time_t now = time(NULL);
    struct tm tm_utc;
    gmtime_r(&now, &tm_utc);
    strftime(date, sizeof date, "%Y-%m-%d %H:%M:%S UTC", &tm_utc);
    snprintf(gpu, sizeof gpu, "unknown");
    snprintf(backend, sizeof backend, "unknown");
    rep = (ds_abl_report){.commit = DS_GIT_COMMIT, .gpu = gpu, .backend = backend,
                          .model = a->model_dir, .command = cmd, .date_utc = date,
                          .steps = a->steps, .warmup = a->warmup, .prompt_len = a->prompt_len,
                          .n_batches = (int)n_batches};
    for (size_t j = 0; j < n_batches; j++) rep.batches[j] = batches[j];

    /* the environment as it was, restored at the end */
    char *saved[SW_COUNT];
    for (int s = 0; s < SW_COUNT; s++) {
        const char *v = getenv(k_switch_env[s]);
        saved[s] = v ? strdup(v) : NULL;
    }

    ds_config cfg;
    ds_model_weights host;
    bool host_loaded = false;
    ds_error err = {0};
    FILE *json = NULL;
    int rc = 1;
    bool row_failed = false;
    if (!make_dirs(out_dir, &err)) goto done;
    if (ds_config_load(a->model_dir, &cfg, &err) != DS_OK) goto done;
    if (!a->dummy) { /* loaded once, shared by every row's engine */
        if (ds_model_load(a->model_dir, &cfg, &host, &err) != DS_OK) goto done;
        host_loaded = true;
    }
    if (a->json_out && !(json = fopen(a->json_out, "a"))) {
        ds_error_set(&err, DS_ERR_IO, "--json-out: cannot open '%s'", a->json_out);
        goto done;
    }

    for (int r = 0; r < n_sel; r++) {
        const abl_row_def *def = &k_rows[sel[r]];
        abl_row_text *tx = &text[r];
        ds_abl_row *row = &rep.rows[rep.n_rows++];
        if (def->spec) snprintf(tx->label, sizeof tx->label, "%s, k = %d", def->label, k);
        else snprintf(tx->label, sizeof tx->label, "%s", def->label);
        size_t n = (size_t)snprintf(tx->switches, sizeof tx->switches, "graphs=%d",
                                    def->graphs ? 1 : 0);
        for (int s = 0; s < SW_COUNT; s++) {
            setenv(k_switch_env[s], def->on[s] ? "1" : "0", 1);
            n += (size_t)snprintf(tx->switches + n, sizeof tx->switches - n, ",%s=%d",
                                  k_switch_env[s], def->on[s] ? 1 : 0);
        }
        if (def->spec)
            snprintf(tx->switches + n, sizeof tx->switches - n, ",num_speculative_tokens=%d", k);
        *row = (ds_abl_row){.index = sel[r], .label = tx->label, .items = def->items,
                            .switches = tx->switches, .spec = def->spec};
        printf("### ablation row %d: %s (%s)\n", sel[r], tx->label, tx->switches);
        fflush(stdout);
        fprintf(stderr, "ablation: row %d (%d of %d): %s\n", sel[r], r + 1, n_sel, tx->label);

        ds_bench_args ra = *a;
        ra.graphs = def->graphs;
        ra.n_spec = def->spec ? k : 0;
        ds_bench_result *res = calloc(1, sizeof *res);
        if (!res) {
            ds_error_set(&err, DS_ERR_NOMEM, "out of host memory");
            goto done;
        }
        ds_error row_err = {0};
        const ds_status st = ds_bench_measure(&ra, &cfg, host_loaded ? &host : NULL, batches,
                                              n_batches, json, res, &row_err);
        if (st == DS_OK) {
            fill_row(row, res, batches, n_batches, def->spec, k);
            snprintf(gpu, sizeof gpu, "%s", res->device);
            snprintf(backend, sizeof backend, "%s", res->backend);
        } else if (res->no_mtp_head) {
            snprintf(tx->note, sizeof tx->note, "not run (no MTP head)");
            row->note = tx->note;
            fprintf(stderr, "ablation: row %d not run: %s has no MTP head\n", sel[r],
                    a->model_dir);
        } else { /* keep going: the other rows still make a report */
            snprintf(tx->note, sizeof tx->note, "failed: %s", row_err.msg);
            row->note = tx->note;
            row_failed = true;
            fprintf(stderr, "ablation: row %d failed: %s\n", sel[r], row_err.msg);
        }
        free(res);
        fflush(stdout);
    }
    if (!write_file(out_dir, "ablation.jsonl", &rep, ds_abl_write_jsonl, &err) ||
        !write_file(out_dir, "ablation.md", &rep, ds_abl_write_markdown, &err) ||
        !write_file(out_dir, "ablation.svg", &rep, ds_abl_write_svg, &err))
        goto done;
    rc = row_failed ? 1 : 0;
    if (row_failed) ds_error_set(&err, DS_ERR_INVALID_ARG, "some ablation rows failed (see above)");
done:
    if (rc) fprintf(stderr, "deltaserve bench --ablation: %s\n", err.msg[0] ? err.msg : "failed");
    for (int s = 0; s < SW_COUNT; s++) {
        if (saved[s]) setenv(k_switch_env[s], saved[s], 1);
        else unsetenv(k_switch_env[s]);
        free(saved[s]);
    }
    if (json) fclose(json);
    if (host_loaded) ds_model_weights_free(&host);
    return rc;
}
