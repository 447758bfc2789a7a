/* deltaserve bench — the offline engine benchmark (docs: ../shared/docs/benchmarking.md):
 *   deltaserve bench -m DIR [--dummy-weights] [--prompt-len 1024] [--batch 1,4,8]
 *                    [--steps 512] [--warmup 8] [--num-speculative-tokens K]
 *                    [--json-out FILE] [--device D] [--threads N] [--graphs 0|1]
 *   deltaserve bench --ablation -m DIR ... [--ablation-rows 0,1,5] [--ablation-out DIR]
 *     (the optimisation ablation report, bench_ablation.c)
 * Measures prefill time for one prompt and the decode step time at each batch size over a long
 * generation (greedy, argmax on the device, tokens fed back), and prints per step the kernels
 * launched, the bytes of weights and state read (estimated from the shape), the achieved GB/s
 * and its ratio to the copy bandwidth the backend measured at start.
 * With --num-speculative-tokens K (MTP speculative decoding, runtime/spec.h) it also times, per
 * batch size B, one verification step (B sequences × (K+1) tokens through the target, GDN states
 * to spare slots, argmax of every row) and one draft phase (the MTP over those rows, then K−1
 * one-token MTP steps of B rows), and runs a greedy batch-1 speculative generation of --steps
 * tokens from the prompt: acceptance rate, mean accepted length, time per emitted token against
 * plain decoding.
 * Decode steps run the way the serving runner will (bench_decode): when the backend has step
 * graphs and --graphs is 1 (the default) the first step of each batch size is captured and the
 * others replay it (a shape that cannot be captured runs eagerly and is reported); when the
 * backend has argmax_logits the lm_head is fused with the argmax, so no logits are written
 * (DS_OPT_FUSED_ARGMAX=0: logits + argmax instead, as the serving runner does then). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli/args.h"
#include "core/env.h"
#include "cli/bench_ablation.h"
#include "cli/cli_cmds.h"
#include "cli/engine.h"
#include "model/dummy_weights.h"
#include "model/loader.h"
#include "model/model_info.h"
#include "runtime/spec.h"
#include "runtime/step_graph.h"

#ifndef DS_GIT_COMMIT
#define DS_GIT_COMMIT "unknown"
#endif

#define BENCH_MAX_BATCH DS_BENCH_MAX_BATCH

typedef ds_bench_args bench_args;

extern char **environ;

/* The optimisation switches and CUDA measurement knobs set in the environment (DS_OPT_* and
 * DS_CUDA_* variables, README "Switches") as "NAME=value,..." or "defaults", for the report and
 * the JSON lines: a result line names the variant it measured. */
static const char *bench_switches(void) {
    static char buf[1024];
    size_t n = 0;
    buf[0] = 0;
    for (char **e = environ; e && *e; e++) {
        if (strncmp(*e, "DS_OPT_", 7) != 0 && strncmp(*e, "DS_CUDA_", 8) != 0) continue;
        const int w = snprintf(buf + n, sizeof buf - n, "%s%s", n ? "," : "", *e);
        if (w < 0 || (size_t)w >= sizeof buf - n) break;
        n += (size_t)w;
    }
    for (size_t i = 0; i < n; i++) /* JSON-safe: switch values are plain words */
        if (buf[i] == '"' || buf[i] == '\\' || (unsigned char)buf[i] < 0x20) buf[i] = '_';
    return n ? buf : "defaults";
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* numpy-style linear percentile of sorted v[n]. */
static double percentile(const double *v, int n, double q) {
    if (n == 1) return v[0];
    double pos = q / 100.0 * (n - 1);
    int lo = (int)floor(pos);
    int hi = lo + 1 < n ? lo + 1 : lo;
    return v[lo] + (v[hi] - v[lo]) * (pos - lo);
}

/* Bytes one decode step must read at batch B: every non-expert weight once, the experts the
 * batch selects (expected distinct count under uniform routing), the lm_head, GDN state read
 * and written (fp32) per sequence, and the KV cache of each sequence's context. */
static double step_bytes(const ds_config *c, int B, int ctx, size_t weight_bytes) {
    ds_model_info mi;
    ds_model_info_compute(c, DS_DTYPE_BF16, DS_DTYPE_BF16, &mi);
    double active = (double)mi.params_active;
    if (c->is_moe && B > 1) {
        double E = c->n_experts, k = c->top_k;
        double distinct = E * (1.0 - pow(1.0 - k / E, B));
        double per_expert = 3.0 * c->hidden * (double)c->moe_inter;
        active += (double)c->n_layers * (distinct - k) * per_expert;
    }
    return active * (double)weight_bytes + 2.0 * (double)B * (double)mi.gdn_state_bytes +
           (double)B * (double)ctx * (double)mi.kv_bytes_per_token;
}

static int parse(int argc, char **argv, bench_args *a) {
    const char *cmd = "bench";
    bool bad = false;
    *a = (bench_args){.prompt_len = 1024, .steps = 512, .warmup = 8, .repeats = 3,
                      .batches_arg = "1,4,8", .seed = 1, .graphs = true};
    for (int i = 1; i < argc && !bad; i++) {
        const char *v;
        long n;
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            printf("usage: deltaserve bench -m DIR [--dummy-weights] [--seed S] [--prompt-len N]\n"
                   "       [--batch 1,4,8] [--steps N] [--warmup N] [--json-out FILE]\n"
                   "       [--num-speculative-tokens K] [--device cpu|cuda|auto] [--threads N]\n"
                   "       [--graphs 0|1]\n"
                   "       deltaserve bench --ablation -m DIR ... [--ablation-rows 0,1,5]\n"
                   "       [--ablation-out DIR]  (rows set DS_OPT_* and --graphs themselves;\n"
                   "       --num-speculative-tokens is the MTP row's k, default 1)\n");
            return -1;
        } else if (!strcmp(argv[i], "--dummy-weights")) {
            a->dummy = true;
        } else if (!strcmp(argv[i], "--ablation")) {
            a->ablation = true;
        } else if ((v = ds_arg_value(argc, argv, &i, "--ablation-rows", cmd, &bad))) {
            a->ablation_rows = v;
        } else if ((v = ds_arg_value(argc, argv, &i, "--ablation-out", cmd, &bad))) {
            a->ablation_out = v;
        } else if ((v = ds_arg_value(argc, argv, &i, "-m", cmd, &bad))) {
            a->model_dir = v;
        } else if ((v = ds_arg_value(argc, argv, &i, "--device", cmd, &bad))) {
            a->device = v;
        } else if ((v = ds_arg_value(argc, argv, &i, "--json-out", cmd, &bad))) {
            a->json_out = v;
        } else if ((v = ds_arg_value(argc, argv, &i, "--batch", cmd, &bad))) {
            a->batches_arg = v;
        } else if ((v = ds_arg_value(argc, argv, &i, "--seed", cmd, &bad))) {
            if (!ds_arg_u64(cmd, "--seed", v, &a->seed)) return 2;
        } else if ((v = ds_arg_value(argc, argv, &i, "--threads", cmd, &bad))) {
            if (!ds_arg_int(cmd, "--threads", v, 0, 1024, &n)) return 2;
            a->threads = (int)n;
        } else if ((v = ds_arg_value(argc, argv, &i, "--prompt-len", cmd, &bad))) {
            if (!ds_arg_int(cmd, "--prompt-len", v, 1, 1 << 20, &n)) return 2;
            a->prompt_len = (int)n;
        } else if ((v = ds_arg_value(argc, argv, &i, "--steps", cmd, &bad))) {
            if (!ds_arg_int(cmd, "--steps", v, 1, 1 << 20, &n)) return 2;
            a->steps = (int)n;
        } else if ((v = ds_arg_value(argc, argv, &i, "--num-speculative-tokens", cmd, &bad))) {
            if (!ds_arg_int(cmd, "--num-speculative-tokens", v, 0, DS_SPEC_MAX_K, &n)) return 2;
            a->n_spec = (int)n;
        } else if ((v = ds_arg_value(argc, argv, &i, "--graphs", cmd, &bad))) {
            if (!ds_arg_int(cmd, "--graphs", v, 0, 1, &n)) return 2;
            a->graphs = n != 0;
        } else if ((v = ds_arg_value(argc, argv, &i, "--warmup", cmd, &bad))) {
            if (!ds_arg_int(cmd, "--warmup", v, 0, 1 << 20, &n)) return 2;
            a->warmup = (int)n;
        } else if (!bad) {
            fprintf(stderr, "deltaserve bench: unknown option '%s'\n", argv[i]);
            return 2;
        }
    }
    if (bad) return 2;
    if ((a->ablation_rows || a->ablation_out) && !a->ablation) {
        fprintf(stderr, "deltaserve bench: --ablation-rows / --ablation-out need --ablation\n");
        return 2;
    }
    if (!a->model_dir) {
        fprintf(stderr, "deltaserve bench: -m DIR is required (a checkpoint, or a config with "
                        "--dummy-weights)\n");
        return 2;
    }
    return 0;
}

typedef struct bench_ctx {
    ds_config cfg;
    ds_backend *be;
    bool fused; /* lm_head + argmax in one kernel: argmax_logits, unless DS_OPT_FUSED_ARGMAX=0 */
    ds_model model;
    bool model_ready;
    ds_session sess;
    bool sess_ready;
} bench_ctx;

/* Host staging of one decode step (bench_decode), sized for the largest batch. The ids buffer
 * is where argmax_logits delivers the next tokens; a graph replay writes the same buffer, so it
 * lives as long as the graphs do. */
typedef struct bench_step {
    int32_t *tokens, *positions, *seq_start, *seq_n_past, *seq_gdn, *out_rows, *blocks, *ids;
    bool graphs;
    signed char graph_state[BENCH_MAX_BATCH + 1]; /* 0 not tried, 1 captured, -1 eager */
} bench_step;

static void bench_step_free(bench_step *st) {
    free(st->tokens);
    free(st->positions);
    free(st->seq_start);
    free(st->seq_n_past);
    free(st->seq_gdn);
    free(st->out_rows);
    free(st->blocks);
    free(st->ids);
}

static bool bench_step_alloc(bench_step *st, int max_batch, int blocks_per_seq) {
    const size_t n = (size_t)max_batch;
    st->tokens = malloc(sizeof(int32_t) * n);
    st->positions = malloc(sizeof(int32_t) * n);
    st->seq_start = malloc(sizeof(int32_t) * (n + 1));
    st->seq_n_past = malloc(sizeof(int32_t) * n);
    st->seq_gdn = malloc(sizeof(int32_t) * n);
    st->out_rows = malloc(sizeof(int32_t) * n);
    st->blocks = malloc(sizeof(int32_t) * n * (size_t)blocks_per_seq);
    st->ids = malloc(sizeof(int32_t) * n);
    return st->tokens && st->positions && st->seq_start && st->seq_n_past && st->seq_gdn &&
           st->out_rows && st->blocks && st->ids;
}

/* The work of one bench decode step (ds_step_fn): the forward, with the lm_head fused with the
 * argmax into ids when `fused` (else the forward writes the logits). */
typedef struct bench_step_work {
    bench_ctx *b;
    const ds_batch *bt;
    bool fused;
    int32_t *ids;
} bench_step_work;

static ds_status bench_step_run(void *ctx, ds_error *err) {
    bench_step_work *w = ctx;
    ds_model *m = &w->b->model;
    ds_status rc = ds_model_forward(m, w->b->sess.cache, w->bt, err);
    if (rc != DS_OK || !w->fused) return rc;
    ds_tensor xn = ds_view2d(m->s.normed.data, m->s.normed.dtype, w->bt->n_seqs, m->cfg.hidden);
    m->be->ops->argmax_logits(w->b->be, &xn, &m->w.lm_head, w->ids, -1);
    return DS_OK;
}

/* One greedy decode step: ids[i] (the token of slot slots[i]) in, the next token of each
 * sequence out. The batch is built from the session's state as ds_session_decode builds it,
 * then: replay of this batch size's graph, or its capture at the first step, or an eager
 * forward; lm_head + argmax fused when the backend can (n_out = 0: the forward stops at the
 * final norm, whose rows are the B sequences). */
static ds_status bench_decode(bench_ctx *b, bench_step *st, const int32_t *slots, int32_t *ids,
                              int B, ds_error *err) {
    ds_session *s = &b->sess;
    ds_model *m = &b->model;
    const ds_backend_ops *op = b->be->ops;
    const bool fused = b->fused;
    const size_t nb = (size_t)s->blocks_per_seq;
    for (int i = 0; i < B; i++) {
        const int slot = slots[i];
        if (s->n_past[slot] + 1 > s->max_len)
            return ds_error_set(err, DS_ERR_INVALID_ARG, "slot %d is full", slot);
        st->tokens[i] = ids[i];
        st->positions[i] = s->n_past[slot];
        st->seq_start[i] = i;
        st->seq_n_past[i] = s->n_past[slot];
        st->seq_gdn[i] = s->gdn_cur[slot];
        st->out_rows[i] = i;
        memcpy(st->blocks + (size_t)i * nb, s->block_table + (size_t)slot * nb, nb * sizeof(int32_t));
    }
    st->seq_start[B] = B;
    const ds_batch bt = {.n_tokens = B, .n_seqs = B, .tokens = st->tokens,
                         .positions = st->positions, .seq_start = st->seq_start,
                         .seq_slot = st->seq_gdn, .seq_n_past = st->seq_n_past,
                         .block_table = st->blocks, .max_blocks = s->blocks_per_seq,
                         .n_out = fused ? 0 : B, .out_rows = st->out_rows};
    ds_tensor lg = ds_view2d(m->s.logits.data, DS_DTYPE_F32, B, m->cfg.vocab);
    bench_step_work w = {b, &bt, fused, st->ids};
    ds_status rc;
    if (st->graphs && op->graph_launch && B <= BENCH_MAX_BATCH) {
        ds_error why = {0};
        const bool first = st->graph_state[B] == 0;
        rc = ds_step_graph_run(b->be, (uint64_t)B, &st->graph_state[B], &bt, bench_step_run, &w,
                               &why, err);
        if (first && st->graph_state[B] < 0)
            fprintf(stderr, "bench: batch %d: decode step not capturable, eager steps (%s)\n", B,
                    why.msg);
    } else {
        rc = bench_step_run(&w, err);
    }
    if (rc != DS_OK) return rc;
    if (!fused) op->argmax(b->be, &lg, st->ids); /* greedy: only the ids come back */
    if ((rc = op->synchronize(b->be, err)) != DS_OK) return rc;
    memcpy(ids, st->ids, sizeof(int32_t) * (size_t)B);
    for (int i = 0; i < B; i++) s->n_past[slots[i]] += 1;
    return DS_OK;
}

static void bench_close(bench_ctx *b) {
    if (b->sess_ready) ds_session_free(&b->sess);
    if (b->model_ready) ds_model_free(&b->model);
    if (b->be) b->be->ops->destroy(b->be);
}

/* Median of fn over `reps` runs after `warm` unmeasured ones (seconds). */
typedef ds_status (*bench_fn)(void *ctx, ds_error *err);
static ds_status time_median(bench_fn fn, void *ctx, int warm, int reps, double *times,
                             double *med, ds_error *err) {
    for (int i = 0; i < warm + reps; i++) {
        double t0 = now_s();
        ds_status st = fn(ctx, err);
        if (st != DS_OK) return st;
        if (i >= warm) times[i - warm] = now_s() - t0;
    }
    qsort(times, (size_t)reps, sizeof(double), cmp_double);
    *med = percentile(times, reps, 50);
    return DS_OK;
}

/* One verification step of B sequences (slots 0..B-1, each at its n_past) × (k+1) tokens, and
 * one draft phase after it. Nothing is committed: every run rewrites the same positions. */
typedef struct spec_shape {
    bench_ctx *b;
    int B, k;
    int32_t *tokens, *pos, *start, *slot, *past, *table, *out_rows, *state_out, *ids;
    ds_batch batch;
} spec_shape;

static ds_status spec_verify_once(void *ctx, ds_error *err) {
    spec_shape *sh = ctx;
    ds_model *m = &sh->b->model;
    ds_status st = ds_model_forward(m, sh->b->sess.cache, &sh->batch, err);
    if (st != DS_OK) return st;
    ds_tensor lg = ds_view2d(m->s.logits.data, DS_DTYPE_F32, sh->batch.n_out, m->cfg.vocab);
    m->be->ops->argmax(m->be, &lg, sh->ids);
    return m->be->ops->synchronize(m->be, err);
}

/* The draft phase as serving runs it (spec.h "draft passes"): chained on the device when the
 * backend allows (pass j keeps its ids at token-buffer entries j·B.., pass j + 1 reads them
 * there, one synchronize at the end), else each pass's argmax downloaded before the next. */
static ds_status spec_draft_once(void *ctx, ds_error *err) {
    spec_shape *sh = ctx;
    ds_model *m = &sh->b->model;
    ds_session *s = &sh->b->sess;
    const int B = sh->B, K1 = sh->k + 1;
    const bool dev = ds_spec_device_drafts(m, sh->k, B);
    /* catch-up over the verification's rows (hidden = its final-normed rows), one out row each */
    ds_batch mb = sh->batch;
    mb.state_out_slots = NULL;
    mb.n_out = B;
    for (int i = 0; i < B; i++) sh->out_rows[i] = i * K1 + K1 - 1;
    ds_spec_draft_pass p = {m, s->cache, &mb, &m->s.normed, sh->ids, dev ? 0 : -1};
    ds_status st = ds_spec_draft_pass_run(&p, err);
    if (st != DS_OK) return st;
    int32_t *dpos = sh->pos + B * K1, *dstart = sh->start + B + 1, *dpast = sh->past + B;
    int32_t *dsrc = sh->tokens + B * K1; /* the draft steps' token_src */
    for (int j = 1; j < sh->k; j++) {
        for (int i = 0; i < B; i++) {
            dpos[i] = s->n_past[i] + K1 + j - 1;
            dpast[i] = dpos[i];
            dstart[i] = i;
            dsrc[i] = (j - 1) * B + i;
            sh->out_rows[i] = i;
        }
        dstart[B] = B;
        ds_batch db = {.n_tokens = B, .n_seqs = B, .tokens = sh->ids, .positions = dpos,
                       .seq_start = dstart, .seq_slot = sh->slot, .seq_n_past = dpast,
                       .block_table = sh->table, .max_blocks = s->blocks_per_seq, .n_out = B,
                       .out_rows = sh->out_rows, .token_src = dev ? dsrc : NULL};
        ds_tensor hid = ds_view2d(m->mtp.out_h.data, m->mtp.out_h.dtype, B, m->cfg.hidden);
        /* device chain: each pass's host copy into its own part of ids ([k, B]) */
        p = (ds_spec_draft_pass){m, s->cache, &db, &hid, dev ? sh->ids + (size_t)j * B : sh->ids,
                                 dev ? j * B : -1};
        if ((st = ds_spec_draft_pass_run(&p, err)) != DS_OK) return st;
    }
    return m->be->ops->synchronize(m->be, err);
}

static ds_status bench_spec(bench_ctx *b, const bench_args *a, const int32_t *prompt,
                            const int32_t *batches, size_t n_batches, double plain_ms_b1,
                            const char *device, FILE *json, ds_bench_result *out,
                            ds_error *err) {
    ds_session *s = &b->sess;
    ds_model *m = &b->model;
    const int k = a->n_spec, K1 = k + 1, V = b->cfg.vocab;
    int max_batch = 1;
    for (size_t i = 0; i < n_batches; i++) max_batch = batches[i] > max_batch ? batches[i] : max_batch;
    const size_t T = (size_t)max_batch * (size_t)K1 + (size_t)max_batch;
    const int reps = a->steps < 64 ? a->steps : 64;
    spec_shape sh = {.b = b, .k = k};
    sh.tokens = calloc(T, sizeof(int32_t));
    sh.pos = calloc(T, sizeof(int32_t));
    sh.start = calloc(2 * (size_t)max_batch + 2, sizeof(int32_t));
    sh.slot = calloc((size_t)max_batch, sizeof(int32_t));
    sh.past = calloc(2 * (size_t)max_batch, sizeof(int32_t));
    sh.table = calloc((size_t)max_batch * (size_t)s->blocks_per_seq, sizeof(int32_t));
    sh.out_rows = calloc(T, sizeof(int32_t));
    sh.state_out = calloc(T, sizeof(int32_t));
    sh.ids = calloc(T, sizeof(int32_t));
    double *times = calloc((size_t)reps, sizeof(double));
    ds_status st = DS_OK;
    if (!sh.tokens || !sh.pos || !sh.start || !sh.slot || !sh.past || !sh.table || !sh.out_rows ||
        !sh.state_out || !sh.ids || !times) {
        st = ds_error_set(err, DS_ERR_NOMEM, "out of host memory");
        goto done;
    }
    printf("speculative decoding, k = %d draft tokens (MTP):\n", k);
    printf("%5s %12s %12s %14s\n", "batch", "verify_ms", "draft_ms", "step_ms");
    for (size_t bi = 0; bi < n_batches; bi++) {
        const int B = batches[bi];
        sh.B = B;
        for (int i = 0; i < B; i++) {
            int32_t spares[DS_SPEC_MAX_K + 2];
            ds_session_spare_slots(s, i, spares);
            sh.start[i] = i * K1;
            sh.slot[i] = s->gdn_cur[i];
            sh.past[i] = s->n_past[i];
            memcpy(sh.table + (size_t)i * s->blocks_per_seq,
                   s->block_table + (size_t)i * s->blocks_per_seq,
                   (size_t)s->blocks_per_seq * sizeof(int32_t));
            for (int j = 0; j < K1; j++) {
                int t = i * K1 + j;
                sh.tokens[t] = (int32_t)((t * 7919 + 13) % V);
                sh.pos[t] = s->n_past[i] + j;
                sh.out_rows[t] = t;
                sh.state_out[t] = spares[j];
            }
        }
        sh.start[B] = B * K1;
        sh.batch = (ds_batch){.n_tokens = B * K1, .n_seqs = B, .tokens = sh.tokens,
                              .positions = sh.pos, .seq_start = sh.start, .seq_slot = sh.slot,
                              .seq_n_past = sh.past, .block_table = sh.table,
                              .max_blocks = s->blocks_per_seq, .n_out = B * K1,
                              .out_rows = sh.out_rows, .state_out_slots = sh.state_out};
        double t_verify, t_draft;
        if ((st = time_median(spec_verify_once, &sh, 2, reps, times, &t_verify, err)) != DS_OK)
            goto done;
        /* the draft phase reads the verification's hidden rows: run one before each */
        for (int r = 0; r < reps; r++) {
            if ((st = spec_verify_once(&sh, err)) != DS_OK) goto done;
            double t0 = now_s();
            if ((st = spec_draft_once(&sh, err)) != DS_OK) goto done;
            times[r] = now_s() - t0;
            /* restore the verification's out rows, which the draft phase reuses */
            for (int t = 0; t < B * K1; t++) sh.out_rows[t] = t;
        }
        qsort(times, (size_t)reps, sizeof(double), cmp_double);
        t_draft = percentile(times, reps, 50);
        printf("%5d %12.3f %12.3f %14.3f\n", B, t_verify * 1e3, t_draft * 1e3,
               (t_verify + t_draft) * 1e3);
        out->b[bi].verify_ms = t_verify * 1e3;
        out->b[bi].draft_ms = t_draft * 1e3;
        if (json)
            fprintf(json,
                    "{\"commit\":\"%s\",\"gpu\":\"%s\",\"backend\":\"%s\",\"model\":\"%s\","
                    "\"batch\":%d,\"num_speculative_tokens\":%d,\"verify_ms\":%.4f,"
                    "\"draft_ms\":%.4f,\"date\":%lld}\n",
                    DS_GIT_COMMIT, device, m->be->ops->name, a->model_dir, B, k, t_verify * 1e3,
                    t_draft * 1e3, (long long)time(NULL));
    }

    /* a real greedy generation at batch 1: acceptance and time per emitted token */
    {
        ds_sampling_params sp;
        ds_sampling_params_init(&sp);
        sp.temperature = 0.0f;
        sp.max_tokens = a->steps;
        sp.ignore_eos = true;
        ds_sampler smp;
        st = ds_sampler_init(&smp, &sp, V, b->cfg.eos_ids, b->cfg.n_eos, err);
        ds_spec_gen g = {0};
        if (st == DS_OK) st = ds_spec_gen_init(&g, s, 0, k, &smp, err);
        int32_t toks[DS_SPEC_MAX_K + 1];
        ds_sample_result res[DS_SPEC_MAX_K + 1];
        int n = 0, got = 0;
        double t0 = 0;
        if (st == DS_OK) st = ds_spec_gen_prefill(&g, prompt, a->prompt_len, toks, res, &got, err);
        if (st == DS_OK) {
            n = got;
            g.t_verify = g.t_draft = 0;
            t0 = now_s();
            while (st == DS_OK && !g.finished) {
                st = ds_spec_gen_step(&g, toks, res, &got, err);
                n += got;
            }
        }
        double dt = now_s() - t0;
        if (st == DS_OK) {
            double per_tok = dt / (double)(n > 1 ? n - 1 : 1) * 1e3;
            printf("batch 1 greedy generation of %d tokens: acceptance rate %.2f, mean accepted "
                   "length %.2f; %.3f ms per token (verify %.3f + draft %.3f ms per step) vs "
                   "plain decode %.3f ms: %.2fx\n",
                   n, ds_spec_acceptance_rate(&g.stats), ds_spec_mean_accepted_len(&g.stats),
                   per_tok, g.stats.n_drafts ? g.t_verify / (double)g.stats.n_drafts * 1e3 : 0,
                   g.stats.n_drafts ? g.t_draft / (double)g.stats.n_drafts * 1e3 : 0, plain_ms_b1,
                   plain_ms_b1 > 0 && per_tok > 0 ? plain_ms_b1 / per_tok : 0.0);
            out->spec = true;
            out->spec_generated = n;
            out->spec_ms_per_token = per_tok;
            out->spec_plain_ms = plain_ms_b1;
            out->spec_acceptance = ds_spec_acceptance_rate(&g.stats);
            out->spec_tokens_per_step = ds_spec_mean_accepted_len(&g.stats);
            printf("acceptance per position:");
            for (int i = 0; i < k; i++) printf(" %.2f", ds_spec_pos_rate(&g.stats, i));
            printf("\n");
            if (json)
                fprintf(json,
                        "{\"commit\":\"%s\",\"gpu\":\"%s\",\"backend\":\"%s\","
                        "\"model\":\"%s\",\"batch\":1,\"num_speculative_tokens\":%d,"
                        "\"generated\":%d,\"ms_per_token\":%.4f,\"plain_ms_per_token\":%.4f,"
                        "\"acceptance_rate\":%.4f,\"mean_accepted_length\":%.4f,\"date\":%lld}\n",
                        DS_GIT_COMMIT, device, m->be->ops->name, a->model_dir, k, n, per_tok,
                        plain_ms_b1, ds_spec_acceptance_rate(&g.stats),
                        ds_spec_mean_accepted_len(&g.stats), (long long)time(NULL));
        }
        ds_spec_gen_free(&g);
        ds_sampler_free(&smp);
    }
done:
    free(sh.tokens);
    free(sh.pos);
    free(sh.start);
    free(sh.slot);
    free(sh.past);
    free(sh.table);
    free(sh.out_rows);
    free(sh.state_out);
    free(sh.ids);
    free(times);
    return st;
}

ds_status ds_bench_measure(const bench_args *a, const ds_config *cfg, const ds_model_weights *host,
                           const int32_t *batches, size_t n_batches, FILE *json,
                           ds_bench_result *out, ds_error *err) {
    DS_ASSERT(n_batches > 0 && n_batches <= DS_BENCH_MAX_BATCHES && (a->dummy || host));
    *out = (ds_bench_result){.n_batches = n_batches};
    int max_batch = 1;
    for (size_t i = 0; i < n_batches; i++)
        if (batches[i] > max_batch) max_batch = batches[i];

    bench_ctx b = {.cfg = *cfg};
    float *logits = NULL;
    double *times = NULL;
    int32_t *tokens = NULL, *ids = NULL, *slots = NULL;
    bench_step bs = {.graphs = a->graphs};
    ds_status st;
    if ((st = ds_cli_backend_create(a->device, a->threads, &b.be, err)) != DS_OK) goto done;
    /* prefill chunk: the server's default --max-num-batched-tokens (engine.c), so TTFT here is
     * what a server with default settings gives a prompt of this length */
    const int step_tokens = a->prompt_len < 2048 ? a->prompt_len : 2048;
    const int max_out = max_batch * (a->n_spec + 1); /* a verification: k + 1 rows a sequence */
    const int max_tokens = step_tokens > max_out ? step_tokens : max_out;
    double t_load = now_s();
    st = a->dummy ? ds_model_init_dummy(&b.model, b.be, &b.cfg, a->seed, max_tokens, max_out, err)
                  : ds_model_init(&b.model, b.be, &b.cfg, host, max_tokens, max_out, err);
    if (st != DS_OK) goto done;
    b.model_ready = true;
    t_load = now_s() - t_load;
    const int ctx = a->prompt_len + a->warmup + a->steps + 1;
    if (a->n_spec > 0 && !ds_model_has_mtp(&b.model)) {
        out->no_mtp_head = true;
        st = ds_error_set(err, DS_ERR_UNSUPPORTED, "--num-speculative-tokens: %s has no MTP head",
                          a->model_dir);
        goto done;
    }
    if ((st = ds_session_init_spec(&b.sess, &b.model, max_batch, ctx, a->n_spec, err)) != DS_OK)
        goto done;
    b.sess_ready = true;
    const ds_backend_ops *op = b.be->ops;
    b.fused = op->argmax_logits != NULL && ds_env_switch("DS_OPT_FUSED_ARGMAX", true);
    out->fused_argmax = b.fused;
    const char *device = op->device_name ? op->device_name(b.be) : op->name;
    snprintf(out->device, sizeof out->device, "%s", device);
    snprintf(out->backend, sizeof out->backend, "%s", op->name);
    double copy_gbps = op->copy_bandwidth_gbps ? op->copy_bandwidth_gbps(b.be) : 0.0;
    fprintf(stderr, "bench: %s on %s, weights ready in %.1f s, copy bandwidth %.0f GB/s\n",
            a->model_dir, device, t_load, copy_gbps);
    fprintf(stderr, "bench: switches: %s\n", bench_switches());

    const int V = b.cfg.vocab;
    tokens = malloc(sizeof(int32_t) * (size_t)a->prompt_len);
    logits = malloc(sizeof(float) * (size_t)V);
    times = malloc(sizeof(double) * (size_t)(a->steps > a->repeats ? a->steps : a->repeats));
    ids = malloc(sizeof(int32_t) * (size_t)max_batch);
    slots = malloc(sizeof(int32_t) * (size_t)max_batch);
    if (!tokens || !logits || !times || !ids || !slots ||
        !bench_step_alloc(&bs, max_batch, b.sess.blocks_per_seq)) {
        st = ds_error_set(err, DS_ERR_NOMEM, "out of host memory");
        goto done;
    }
    uint64_t rng = a->seed * 6364136223846793005ull + 1442695040888963407ull;
    for (int i = 0; i < a->prompt_len; i++) {
        rng = rng * 6364136223846793005ull + 1442695040888963407ull;
        tokens[i] = (int32_t)((rng >> 33) % (uint64_t)V);
    }

    /* Prefill: the prompt into slot 0, logits of the last token (time to first token). */
    for (int r = 0; r < a->repeats + 1; r++) {
        ds_session_reset(&b.sess, 0);
        double t0 = now_s();
        if ((st = ds_session_feed(&b.sess, 0, tokens, a->prompt_len, false, logits, err)) != DS_OK)
            goto done;
        if (r > 0) times[r - 1] = now_s() - t0; /* the first run is warm-up */
    }
    qsort(times, (size_t)a->repeats, sizeof(double), cmp_double);
    const double ttft_ms = times[a->repeats / 2] * 1e3;
    out->ttft_ms = ttft_ms;
    printf("prefill %d tokens: %.2f ms (median of %d)\n", a->prompt_len, ttft_ms, a->repeats);
    printf("%5s %10s %10s %10s %9s %12s %9s %9s %7s\n", "batch", "step_ms", "p10_ms", "p90_ms",
           "tok/s", "bytes/step", "GB/s", "kernels", "ratio");

    double plain_ms_b1 = 0;
    for (size_t bi = 0; bi < n_batches; bi++) {
        const int B = batches[bi];
        /* Every sequence gets the same prompt so the context length matches prefill's. */
        for (int s = 0; s < B; s++) {
            slots[s] = s;
            ds_session_reset(&b.sess, s);
            if ((st = ds_session_feed(&b.sess, s, tokens, a->prompt_len, false, logits, err)) !=
                DS_OK)
                goto done;
            ids[s] = (int32_t)((s * 7919 + 1) % V);
        }
        uint64_t launches = 0;
        for (int step = 0; step < a->warmup + a->steps; step++) {
            if (op->take_launch_count) op->take_launch_count(b.be);
            double t0 = now_s();
            if ((st = bench_decode(&b, &bs, slots, ids, B, err)) != DS_OK) goto done;
            double dt = now_s() - t0;
            if (op->take_launch_count) launches = op->take_launch_count(b.be);
            if (step >= a->warmup) times[step - a->warmup] = dt;
        }
        qsort(times, (size_t)a->steps, sizeof(double), cmp_double);
        double med = percentile(times, a->steps, 50) * 1e3;
        double p10 = percentile(times, a->steps, 10) * 1e3;
        double p90 = percentile(times, a->steps, 90) * 1e3;
        double bytes = step_bytes(&b.cfg, B, a->prompt_len + a->warmup + a->steps / 2, 2);
        double gbps = bytes / (med * 1e-3) * 1e-9;
        double ratio = copy_gbps > 0 ? gbps / copy_gbps : 0;
        const bool graph = B <= BENCH_MAX_BATCH && bs.graph_state[B] == 1;
        if (B == 1) plain_ms_b1 = med;
        out->b[bi] = (ds_bench_batch_result){.batch = B, .step_ms = med, .p10_ms = p10,
                                             .p90_ms = p90, .bytes = bytes, .gbps = gbps,
                                             .ratio = ratio,
                                             .kernels = (unsigned long long)launches,
                                             .graph = graph};
        printf("%5d %10.3f %10.3f %10.3f %9.1f %12.4g %9.1f %9llu %7.3f\n", B, med, p10, p90,
               B / (med * 1e-3), bytes, gbps, (unsigned long long)launches, ratio);
        if (json)
            fprintf(json,
                    "{\"commit\":\"%s\",\"gpu\":\"%s\",\"backend\":\"%s\",\"model\":\"%s\","
                    "\"dummy_weights\":%s,\"batch\":%d,\"prompt_len\":%d,\"steps\":%d,"
                    "\"step_ms\":%.4f,\"step_ms_p10\":%.4f,\"step_ms_p90\":%.4f,\"ttft_ms\":%.3f,"
                    "\"kernels_per_step\":%llu,\"bytes_per_step\":%.6g,\"achieved_gbps\":%.2f,"
                    "\"copy_gbps\":%.2f,\"ratio\":%.4f,\"graph\":%s,\"fused_argmax\":%s,"
                    "\"switches\":\"%s\",\"date\":%lld}\n",
                    DS_GIT_COMMIT, device, op->name, a->model_dir, a->dummy ? "true" : "false", B,
                    a->prompt_len, a->steps, med, p10, p90, ttft_ms, (unsigned long long)launches,
                    bytes, gbps, copy_gbps, ratio, graph ? "true" : "false",
                    b.fused ? "true" : "false", bench_switches(), (long long)time(NULL));
    }
    if (a->graphs && op->graph_launch) { /* which decode shapes ran from graphs */
        fprintf(stderr, "bench: decode steps from CUDA graphs:");
        for (size_t bi = 0; bi < n_batches; bi++)
            fprintf(stderr, " batch %d %s;", batches[bi],
                    bs.graph_state[batches[bi]] == 1 ? "replayed" : "EAGER (fell back)");
        fputc('\n', stderr);
    }
    if (a->n_spec > 0)
        st = bench_spec(&b, a, tokens, batches, n_batches, plain_ms_b1, device, json, out, err);
done:
    free(tokens);
    free(logits);
    free(times);
    free(ids);
    free(slots);
    bench_step_free(&bs);
    bench_close(&b);
    return st;
}

int ds_cmd_bench(int argc, char **argv) {
    /* `deltaserve bench serve …` is the HTTP load generator (vllm bench serve's twin). */
    if (argc > 1 && !strcmp(argv[1], "serve")) return ds_cmd_bench_serve(argc - 1, argv + 1);
    bench_args a;
    int rc = parse(argc, argv, &a);
    if (rc) return rc < 0 ? 0 : rc;
    int32_t *batches = NULL;
    size_t n_batches = 0;
    if (!ds_arg_ids("bench", "--batch", a.batches_arg, BENCH_MAX_BATCH, &batches, &n_batches))
        return 2;
    if (n_batches == 0 || n_batches > DS_BENCH_MAX_BATCHES) {
        fprintf(stderr, "deltaserve bench: --batch: 1 to %d sizes\n", DS_BENCH_MAX_BATCHES);
        free(batches);
        return 2;
    }
    for (size_t i = 0; i < n_batches; i++) {
        if (batches[i] < 1) {
            fprintf(stderr, "deltaserve bench: --batch: sizes must be ≥ 1\n");
            free(batches);
            return 2;
        }
    }
    if (a.ablation) {
        rc = ds_bench_ablation(&a, batches, n_batches, argc, argv);
        free(batches);
        return rc;
    }

    ds_config cfg;
    ds_model_weights host;
    bool host_loaded = false;
    ds_error err = {0};
    FILE *json = NULL;
    ds_bench_result res;
    rc = 1;
    if (ds_config_load(a.model_dir, &cfg, &err) != DS_OK) goto fail;
    if (!a.dummy) {
        if (ds_model_load(a.model_dir, &cfg, &host, &err) != DS_OK) goto fail;
        host_loaded = true;
    }
    if (a.json_out && !(json = fopen(a.json_out, "a"))) {
        ds_error_set(&err, DS_ERR_IO, "--json-out: cannot open '%s'", a.json_out);
        goto fail;
    }
    if (ds_bench_measure(&a, &cfg, host_loaded ? &host : NULL, batches, n_batches, json, &res,
                         &err) != DS_OK)
        goto fail;
    rc = 0;
fail:
    if (rc) fprintf(stderr, "deltaserve bench: %s\n", err.msg[0] ? err.msg : "failed");
    if (json) fclose(json);
    if (host_loaded) ds_model_weights_free(&host);
    free(batches);
    return rc;
}
