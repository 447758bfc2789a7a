/* The optimisation ablation report (`deltaserve bench --ablation`, issue 6): the measured rows
 * and the writers of ablation.md / ablation.svg / ablation.jsonl. The writers are pure functions
 * of the report struct (no clock, no environment), so a test can feed them made-up numbers. */
#ifndef DS_BENCH_ABLATION_REPORT_H
#define DS_BENCH_ABLATION_REPORT_H

#include <stdbool.h>
#include <stdio.h>

#define DS_ABL_MAX_ROWS 16
#define DS_ABL_MAX_BATCHES 16

/* One (row, batch size) measurement. */
typedef struct ds_abl_cell {
    double tpot_ms;             /* median decode step time; MTP row: time per emitted token */
    double p10_ms, p90_ms;      /* 10th/90th percentile step time; 0 = not measured (MTP row) */
    unsigned long long kernels; /* kernel launches per step (0 = not counted) */
    bool graph;                 /* the steps replayed a CUDA graph */
    bool computed;              /* MTP row, batch > 1: (verify + draft) / tokens per step from
                                   measured step times, not a generation */
    double verify_ms, draft_ms; /* MTP row: one verification step / one draft phase (median) */
} ds_abl_cell;

typedef struct ds_abl_row {
    int index;            /* row number in the fixed table (0 = baseline) */
    const char *label;    /* "+ whole-step CUDA graphs" */
    const char *items;    /* catalogue item numbers, "7, 8" */
    const char *switches; /* "graphs=1,DS_OPT_MOE_FAST_ROUTE=0,..." */
    bool run;             /* false: nothing measured, note says why */
    const char *note;     /* when !run: "not run (no MTP head)" */
    double ttft_ms;       /* prefill of the prompt (median) */
    ds_abl_cell cells[DS_ABL_MAX_BATCHES]; /* [report.n_batches] */
    /* MTP row only */
    bool spec;
    int spec_k, spec_generated;
    double acceptance_rate;   /* accepted / drafted tokens of the batch-1 generation */
    double tokens_per_step;   /* 1 + accepted drafts per verification (ds_spec_mean_accepted_len) */
    double plain_ms_b1;       /* plain decode step at batch 1 in the same engine */
} ds_abl_row;

typedef struct ds_abl_report {
    const char *commit, *gpu, *backend, *model, *command, *date_utc;
    int steps, warmup, prompt_len;
    int n_batches;
    int batches[DS_ABL_MAX_BATCHES]; /* decode batch sizes, the table's columns */
    int n_rows;
    ds_abl_row rows[DS_ABL_MAX_ROWS]; /* in table order */
} ds_abl_report;

/* Change of rows[i] against the closest earlier row that ran, at batch column j: *d_ms =
 * this − previous (positive = slower), *d_pct = 100·d_ms / previous. False when either is
 * missing (first row, not run). */
bool ds_abl_change(const ds_abl_report *r, int i, int j, double *d_ms, double *d_pct);
/* Column of batch size 1 (else 0). */
int ds_abl_b1_column(const ds_abl_report *r);
/* Index into rows[] of the run row with the lowest TPOT at column j; -1 when none ran. */
int ds_abl_best_row(const ds_abl_report *r, int j);

/* The writers return 0, or -1 when the stream reported an error. */
int ds_abl_write_markdown(const ds_abl_report *r, FILE *f);
int ds_abl_write_svg(const ds_abl_report *r, FILE *f);
/* One JSON object a line per run row and batch (rows not run: one line with "run": false). */
int ds_abl_write_jsonl(const ds_abl_report *r, FILE *f);

#endif
