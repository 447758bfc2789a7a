/* test_cuda_model.c — the whole model on the CUDA backend, with issue 3's criteria:
 *  1. teacher-forced logits, per sequence relative L2 over the [n, V] block, in bf16:
 *     - the trained demo model (models/qwen35-demo, well conditioned): ≤ 2e-2 against the fp32
 *       CPU backend on the same sequences (the CPU backend equals transformers' fp32 reference
 *       to ~1e-5: tests/test_model_fixtures.c; its greedy output equals the demo's transformers
 *       reference_greedy.json: tests/test_cli_contract.c);
 *     - the tiny random fixtures (tests/data/ref, from transformers): these random 2-layer
 *       models amplify rounding noise (a bf16 rounding of one activation moves their logits by
 *       several percent), so the bound is max(2e-2, 2 × the error of the bf16-storage
 *       emulation, tests/bf16_emu.h, against the same reference): the CUDA backend may be
 *       as noisy as bf16 storage itself, not more;
 *  2. greedy: along each reference continuation (fed token by token through one-token decode
 *     steps, the reference's own tokens as inputs), the CUDA argmax equals the reference token
 *     wherever the reference's top-2 logit margin exceeds 0.05 (the demo model, against
 *     transformers' reference_greedy.json, no exception); on the tiny fixtures wherever the
 *     margin also exceeds 3 standard deviations of the bf16 emulation's noise on a logit
 *     difference at that step (√2 · rms of emulated − reference logits), with at most
 *     TINY_FLIPS_MAX exceptions per model: the noise of these random MoE models has heavy
 *     tails (a near-tie in top-k routing moves a token's logits far more than the rms), and
 *     GPU run 2026-12-02 saw 1 such flip in ~95 decisive positions per model (margins 1.22
 *     dense, 0.69 MoE, with thresholds 1.15 and 0.22) while the demo model had none;
 *  3. step graphs: decode steps replayed from a captured graph equal eager steps bit for bit
 *     (logits and fused lm_head argmax ids), over growing contexts at batch 3 then batch 1,
 *     for the dense and the MoE fixture (outputs poisoned before each graph step);
 *  4. dummy weights generated on the device (ops->dummy_weights) at Qwen3.5-35B-A3B widths
 *     with 4 layers: per-kind ranges and moments, determinism per seed, a finite decode step.
 * Without a CUDA device (CI) the test prints a note and passes. */

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "testlib.h"
#include "bf16_emu.h"

#include "backend/backend.h"
#include "model/loader.h"
#include "model/model.h"
#include "runtime/session.h"

#define LOGITS_TOL 2e-2  /* issue 3: per-sequence relative L2 in bf16 */
#define MARGIN_MIN 0.05f /* greedy tokens must match where the reference is this decisive */
#define EMU_FACTOR 2.0    /* tiny fixtures: CUDA error ≤ EMU_FACTOR × bf16-emulation error */
#define EMU_SIGMAS 3.0    /* tiny fixtures: decisive margins exceed this many noise sigmas */
#define TINY_FLIPS_MAX 1  /* tiny fixtures: decisive flips tolerated per model (heavy tails) */
#define DEMO_DIR "models/qwen35-demo" /* relative to the repository root (ctest's directory) */
#define DEMO_REF DEMO_DIR "/reference_greedy.json"

static ds_backend *g_cuda, *g_cpu, *g_emu; /* g_emu: CPU backend with bf16 storage */

static const char *const MODELS[][2] = {
    /* model directory, reference name */
    {"tiny-dense", "tiny-dense"},
    {"tiny-moe", "tiny-moe"},
    {"tiny-moe-fused", "tiny-moe"},
};

typedef struct fixture {
    ds_config cfg;
    ds_model_weights host;
    ds_model model;
    ds_session sess;
} fixture;

/* name: a fixture under tests/data/models, or a path containing '/' */
static void fixture_open_on(fixture *f, ds_backend *be, const char *name, int max_tokens,
                            int max_out, int n_slots) {
    char dir[1024];
    if (strchr(name, '/')) snprintf(dir, sizeof dir, "%s", name);
    else snprintf(dir, sizeof dir, "%s/models/%s", test_data_dir(), name);
    ds_error err = {0};
    if (ds_model_load(dir, &f->cfg, &f->host, &err) != DS_OK) fail_msg("load %s: %s", dir, err.msg);
    if (ds_model_init(&f->model, be, &f->cfg, &f->host, max_tokens, max_out, &err) != DS_OK)
        fail_msg("model init: %s", err.msg);
    if (ds_session_init(&f->sess, &f->model, n_slots, 512, &err) != DS_OK)
        fail_msg("session init: %s", err.msg);
}

static void fixture_open(fixture *f, const char *name, int max_tokens, int max_out, int n_slots) {
    fixture_open_on(f, g_cuda, name, max_tokens, max_out, n_slots);
}

/* teacher-forced logits [n, V] of one sequence from slot 0 of a fresh session state */
static void feed_logits(fixture *f, const int32_t *ids, int n, float *out) {
    ds_session_reset(&f->sess, 0);
    ds_error err = {0};
    if (ds_session_feed(&f->sess, 0, ids, n, true, out, &err) != DS_OK) fail_msg("feed: %s", err.msg);
}

static void fixture_close(fixture *f) {
    ds_session_free(&f->sess);
    ds_model_free(&f->model);
    ds_model_weights_free(&f->host);
}

/* lowest index of the maximum; NaN never wins */
static int argmax_row(const float *v, int n) {
    int best = 0;
    for (int i = 1; i < n; i++)
        if (v[i] > v[best] || (isnan(v[best]) && !isnan(v[i]))) best = i;
    return best;
}

/* ---- 1. teacher-forced logits ---------------------------------------------------------------- */

/* Tiny fixtures against transformers; returns the number of sequences above their bound (all
 * are printed first). */
static int check_logits(const char *model, const char *ref_name) {
    fixture f, e; /* CUDA, bf16 emulation */
    fixture_open(&f, model, 512, 512, 1);
    fixture_open_on(&e, g_emu, model, 512, 512, 1);
    cJSON *ref = test_load_ref(ref_name);
    const int V = f.cfg.vocab;
    const cJSON *seq;
    double worst = 0;
    int bad = 0;
    cJSON_ArrayForEach(seq, cJSON_GetObjectItem(ref, "sequences")) {
        int n;
        int32_t *ids = test_json_ids(cJSON_GetObjectItem(seq, "tokens"), &n);
        float *want = test_load_ref_f32(cJSON_GetObjectItem(seq, "file")->valuestring, (size_t)n * V);
        float *got = malloc(sizeof(float) * (size_t)n * V);
        float *emu = malloc(sizeof(float) * (size_t)n * V);
        feed_logits(&f, ids, n, got);
        feed_logits(&e, ids, n, emu);
        const double rel = test_rel_l2(got, want, (size_t)n * V);
        const double rel_emu = test_rel_l2(emu, want, (size_t)n * V);
        const double bound = fmax(LOGITS_TOL, EMU_FACTOR * rel_emu);
        int agree = 0, agree_emu = 0;
        for (int p = 0; p < n; p++) {
            const int w = argmax_row(want + (size_t)p * V, V);
            agree += argmax_row(got + (size_t)p * V, V) == w;
            agree_emu += argmax_row(emu + (size_t)p * V, V) == w;
        }
        printf("  %-14s %-7s %3d tokens: logits rel L2 %.3e (bf16 emulation %.3e, bound %.3e)%s, "
               "argmax agree %d/%d (emulation %d)\n", model,
               cJSON_GetObjectItem(seq, "name")->valuestring, n, rel, rel_emu, bound,
               rel <= bound ? "" : "  ABOVE", agree, n, agree_emu);
        if (rel / bound > worst) worst = rel / bound;
        bad += !(rel <= bound);
        free(ids);
        free(want);
        free(got);
        free(emu);
    }
    printf("  %-14s worst sequence error / bound %.2f\n", model, worst);
    cJSON_Delete(ref);
    fixture_close(&e);
    fixture_close(&f);
    return bad;
}

/* The demo model, prompt + reference continuation teacher-forced: CUDA vs the fp32 CPU
 * backend ≤ 2e-2 per sequence. Returns the number of sequences above. */
static int check_logits_demo(void) {
    fixture f, c;
    fixture_open(&f, DEMO_DIR, 512, 512, 1);
    fixture_open_on(&c, g_cpu, DEMO_DIR, 512, 512, 1);
    cJSON *ref = test_load_json(DEMO_REF);
    const int V = f.cfg.vocab;
    const cJSON *g;
    int bad = 0;
    cJSON_ArrayForEach(g, cJSON_GetObjectItem(ref, "greedy")) {
        int np, ng;
        int32_t *p = test_json_ids(cJSON_GetObjectItem(g, "prompt"), &np);
        int32_t *q = test_json_ids(cJSON_GetObjectItem(g, "generated"), &ng);
        const int n = np + ng;
        int32_t *ids = malloc(sizeof(int32_t) * (size_t)n);
        memcpy(ids, p, sizeof(int32_t) * (size_t)np);
        memcpy(ids + np, q, sizeof(int32_t) * (size_t)ng);
        float *got = malloc(sizeof(float) * (size_t)n * V), *want = malloc(sizeof(float) * (size_t)n * V);
        feed_logits(&f, ids, n, got);
        feed_logits(&c, ids, n, want);
        const double rel = test_rel_l2(got, want, (size_t)n * V);
        int agree = 0;
        for (int i = 0; i < n; i++)
            agree += argmax_row(got + (size_t)i * V, V) == argmax_row(want + (size_t)i * V, V);
        printf("  qwen35-demo    %-10s %3d tokens: logits rel L2 vs fp32 %.3e%s, argmax agree %d/%d\n",
               cJSON_GetObjectItem(g, "name")->valuestring, n, rel,
               rel <= LOGITS_TOL ? "" : "  (> 2e-2)", agree, n);
        bad += !(rel <= LOGITS_TOL);
        free(p);
        free(q);
        free(ids);
        free(got);
        free(want);
    }
    cJSON_Delete(ref);
    fixture_close(&c);
    fixture_close(&f);
    return bad;
}

static void test_logits(void **state) {
    (void)state;
    int bad = check_logits_demo();
    for (size_t i = 0; i < sizeof MODELS / sizeof MODELS[0]; i++)
        bad += check_logits(MODELS[i][0], MODELS[i][1]);
    if (bad) fail_msg("%d sequences above their logits bound", bad);
}

/* ---- 2. greedy tokens through decode steps --------------------------------------------------- */

/* Along one reference continuation: prompt, then the reference's own tokens one decode step at
 * a time on the CUDA model (and the emulation when e != NULL, with the reference's logits
 * ref_logits [n_gen, V]). A position is decisive when its reference margin exceeds MARGIN_MIN
 * and, with the emulation, EMU_SIGMAS noise sigmas. Returns decisive positions that differ. */
static int greedy_walk(fixture *f, fixture *e, const char *model, const char *name,
                       const int32_t *prompt, int n_prompt, const int32_t *want, int n_gen,
                       const cJSON *margins, const float *ref_logits) {
    const int V = f->cfg.vocab;
    float *lg = malloc(sizeof(float) * (size_t)V), *le = malloc(sizeof(float) * (size_t)V);
    ds_error err = {0};
    ds_session_reset(&f->sess, 0);
    if (ds_session_feed(&f->sess, 0, prompt, n_prompt, false, lg, &err) != DS_OK)
        fail_msg("feed: %s", err.msg);
    if (e) {
        ds_session_reset(&e->sess, 0);
        if (ds_session_feed(&e->sess, 0, prompt, n_prompt, false, le, &err) != DS_OK)
            fail_msg("feed: %s", err.msg);
    }
    int checked = 0, differ = 0, differ_close = 0;
    for (int i = 0; i < n_gen; i++) {
        const int got = argmax_row(lg, V);
        const double margin = cJSON_GetArrayItem(margins, i)->valuedouble;
        double need = MARGIN_MIN, noise = 0;
        if (e) {
            double s2 = 0;
            for (int v = 0; v < V; v++) {
                const double d = (double)le[v] - ref_logits[(size_t)i * V + v];
                s2 += d * d;
            }
            noise = sqrt(2.0 * s2 / V); /* std of a difference of two logits' errors */
            need = fmax(need, EMU_SIGMAS * noise);
        }
        if (margin > need) {
            checked++;
            if (got != want[i]) {
                differ++;
                printf("  %-14s %s: token %d: got %d want %d (reference margin %.3f, needed %.3f)\n",
                       model, name, i, got, want[i], margin, need);
            }
        } else {
            differ_close += got != want[i];
        }
        /* the reference's token goes in: each decision is checked on the reference prefix */
        const int32_t slot = 0, tok = want[i];
        if (i + 1 < n_gen) {
            if (ds_session_decode(&f->sess, &slot, &tok, 1, lg, &err) != DS_OK)
                fail_msg("decode: %s", err.msg);
            if (e && ds_session_decode(&e->sess, &slot, &tok, 1, le, &err) != DS_OK)
                fail_msg("decode: %s", err.msg);
        }
    }
    printf("  %-14s %s: %d/%d decisive tokens identical (%d below the margin differ)\n", model,
           name, checked - differ, checked, differ_close);
    free(lg);
    free(le);
    return differ;
}

/* Greedy walks over ref's "greedy" entries on the CUDA model in dir (label: printed name).
 * emulate: the tiny random fixtures, judged with the bf16 emulation's noise and the
 * reference's logits files; else (the demo model) by the reference margin alone. */
static int check_greedy(const char *dir, const char *label, const cJSON *ref, bool emulate) {
    fixture f, e;
    fixture_open(&f, dir, 64, 1, 1);
    if (emulate) fixture_open_on(&e, g_emu, dir, 64, 1, 1);
    const int V = f.cfg.vocab;
    const cJSON *g;
    int bad = 0;
    cJSON_ArrayForEach(g, cJSON_GetObjectItem(ref, "greedy")) {
        int n_prompt, n_gen;
        int32_t *prompt = test_json_ids(cJSON_GetObjectItem(g, "prompt"), &n_prompt);
        int32_t *want = test_json_ids(cJSON_GetObjectItem(g, "generated"), &n_gen);
        const cJSON *margins = cJSON_GetObjectItem(g, "top2_margin");
        assert_int_equal(cJSON_GetArraySize(margins), n_gen);
        float *rl = emulate ? test_load_ref_f32(cJSON_GetObjectItem(g, "logits_file")->valuestring,
                                                (size_t)n_gen * V)
                            : NULL;
        bad += greedy_walk(&f, emulate ? &e : NULL, label,
                           cJSON_GetObjectItem(g, "name")->valuestring, prompt, n_prompt, want,
                           n_gen, margins, rl);
        free(rl);
        free(prompt);
        free(want);
    }
    if (emulate) fixture_close(&e);
    fixture_close(&f);
    return bad;
}

static void test_greedy(void **state) {
    (void)state;
    cJSON *demo_ref = test_load_json(DEMO_REF);
    const int demo = check_greedy(DEMO_DIR, "qwen35-demo", demo_ref, false);
    cJSON_Delete(demo_ref);
    int tiny_over = 0;
    for (size_t i = 0; i < sizeof MODELS / sizeof MODELS[0]; i++) {
        cJSON *ref = test_load_ref(MODELS[i][1]);
        const int flips = check_greedy(MODELS[i][0], MODELS[i][0], ref, true);
        cJSON_Delete(ref);
        printf("  %-14s %d decisive flips (at most %d tolerated)\n", MODELS[i][0], flips, TINY_FLIPS_MAX);
        tiny_over += flips > TINY_FLIPS_MAX;
    }
    if (demo) fail_msg("qwen35-demo: %d decisive greedy tokens differ from transformers", demo);
    if (tiny_over) fail_msg("%d tiny fixtures above %d decisive flips", tiny_over, TINY_FLIPS_MAX);
}

/* ---- 3. graph replay = eager ------------------------------------------------------------------ */

/* A decode batch of B sequences (slots[i], token toks[i]) from a session's state, as
 * ds_session_decode builds it; n_out = B. */
typedef struct dstep {
    int32_t tokens[8], positions[8], seq_start[9], n_past[8], gdn[8], out_rows[8];
    int32_t *blocks;
    ds_batch b;
} dstep;

static void dstep_make(dstep *d, const ds_session *s, const int32_t *slots, const int32_t *toks,
                       int B) {
    const size_t nb = (size_t)s->blocks_per_seq;
    for (int i = 0; i < B; i++) {
        d->tokens[i] = toks[i];
        d->positions[i] = s->n_past[slots[i]];
        d->seq_start[i] = i;
        d->n_past[i] = s->n_past[slots[i]];
        d->gdn[i] = s->gdn_cur[slots[i]];
        d->out_rows[i] = i;
        memcpy(d->blocks + (size_t)i * nb, s->block_table + (size_t)slots[i] * nb,
               nb * sizeof(int32_t));
    }
    d->seq_start[B] = B;
    d->b = (ds_batch){.n_tokens = B, .n_seqs = B, .tokens = d->tokens, .positions = d->positions,
                      .seq_start = d->seq_start, .seq_slot = d->gdn, .seq_n_past = d->n_past,
                      .block_table = d->blocks, .max_blocks = s->blocks_per_seq, .n_out = B,
                      .out_rows = d->out_rows};
}

/* One decode step: forward (logits of all B rows) + fused argmax of the final-normed rows. */
static void step_ops(ds_model *m, ds_session *s, const ds_batch *b, int32_t *ids) {
    ds_error err = {0};
    if (ds_model_forward(m, s->cache, b, &err) != DS_OK) fail_msg("forward: %s", err.msg);
    ds_tensor xn = ds_view2d(m->s.normed.data, m->s.normed.dtype, b->n_tokens, m->cfg.hidden);
    g_cuda->ops->argmax_logits(g_cuda, &xn, &m->w.lm_head, ids, -1);
}

static void graph_vs_eager(const char *model) {
    const ds_backend_ops *op = g_cuda->ops;
    assert_non_null(op->graph_begin);
    assert_non_null(op->argmax_logits);
    ds_config cfg;
    ds_model_weights host;
    ds_error err = {0};
    char dir[1024];
    snprintf(dir, sizeof dir, "%s/models/%s", test_data_dir(), model);
    if (ds_model_load(dir, &cfg, &host, &err) != DS_OK) fail_msg("load: %s", err.msg);
    ds_model m;
    if (ds_model_init(&m, g_cuda, &cfg, &host, 64, 8, &err) != DS_OK) fail_msg("%s", err.msg);
    ds_session se, sg; /* eager, graph: same model, separate caches */
    if (ds_session_init(&se, &m, 3, 256, &err) != DS_OK) fail_msg("%s", err.msg);
    if (ds_session_init(&sg, &m, 3, 256, &err) != DS_OK) fail_msg("%s", err.msg);
    const int V = cfg.vocab;
    float *scratch = malloc(sizeof(float) * (size_t)V);
    const int plen[3] = {20, 33, 7};
    int32_t prompt[40];
    for (int s = 0; s < 3; s++) {
        for (int i = 0; i < plen[s]; i++) prompt[i] = (int32_t)((i * 37 + s * 101 + 5) % V);
        if (ds_session_feed(&se, s, prompt, plen[s], false, scratch, &err) != DS_OK ||
            ds_session_feed(&sg, s, prompt, plen[s], false, scratch, &err) != DS_OK)
            fail_msg("prefill: %s", err.msg);
    }
    dstep *de = calloc(1, sizeof *de), *dg = calloc(1, sizeof *dg);
    de->blocks = calloc((size_t)3 * (size_t)se.blocks_per_seq, sizeof(int32_t));
    dg->blocks = calloc((size_t)3 * (size_t)sg.blocks_per_seq, sizeof(int32_t));
    float *le = malloc(sizeof(float) * 3 * (size_t)V), *lg = malloc(sizeof(float) * 3 * (size_t)V);
    int32_t ids_e[8], ids_g[8]; /* ids_g: the host buffer the graphs record */
    int32_t slots[3] = {0, 1, 2}, toks[3] = {1, 2, 3};
    int replays = 0, captures = 0;
    for (int step = 0; step < 40; step++) {
        const int B = step < 28 ? 3 : 1; /* batch 3, then batch 1 (a second graph) */
        dstep_make(de, &se, slots, toks, B);
        dstep_make(dg, &sg, slots, toks, B);
        /* eager */
        step_ops(&m, &se, &de->b, ids_e);
        if (op->synchronize(g_cuda, &err) != DS_OK) fail_msg("%s", err.msg);
        op->download(g_cuda, le, m.s.logits.data, sizeof(float) * (size_t)B * V);
        /* poison what the graph step must write, so a step that writes nothing cannot pass */
        for (size_t i = 0; i < (size_t)B * V; i++) lg[i] = NAN;
        op->upload(g_cuda, m.s.logits.data, lg, sizeof(float) * (size_t)B * V);
        for (int i = 0; i < 8; i++) ids_g[i] = -1;
        /* graph: replay, else capture (which also runs the step) */
        if (op->graph_launch(g_cuda, (uint64_t)B, &dg->b)) {
            replays++;
        } else {
            if (op->graph_begin(g_cuda, (uint64_t)B, &err) != DS_OK) fail_msg("begin: %s", err.msg);
            step_ops(&m, &sg, &dg->b, ids_g);
            if (op->graph_end(g_cuda, &err) != DS_OK) fail_msg("capture: %s", err.msg);
            captures++;
        }
        if (op->synchronize(g_cuda, &err) != DS_OK) fail_msg("%s", err.msg);
        op->download(g_cuda, lg, m.s.logits.data, sizeof(float) * (size_t)B * V);
        if (memcmp(le, lg, sizeof(float) * (size_t)B * V) != 0)
            fail_msg("%s step %d (batch %d): graph logits differ from eager (rel L2 %.3e)", model,
                     step, B, test_rel_l2(lg, le, (size_t)B * V));
        for (int i = 0; i < B; i++) {
            if (ids_e[i] != ids_g[i])
                fail_msg("%s step %d row %d: graph id %d, eager %d", model, step, i, ids_g[i], ids_e[i]);
            /* the fused argmax computes the same dot products as the logits */
            if (ids_e[i] != argmax_row(le + (size_t)i * V, V))
                fail_msg("%s step %d row %d: fused argmax %d, argmax of logits %d", model, step, i,
                         ids_e[i], argmax_row(le + (size_t)i * V, V));
            toks[i] = ids_e[i];
        }
        for (int i = 0; i < B; i++) {
            se.n_past[slots[i]]++;
            sg.n_past[slots[i]]++;
        }
    }
    printf("  %-14s 40 decode steps (batch 3, then 1): %d captures, %d replays, all identical to "
           "eager (logits bit for bit, fused argmax ids)\n", model, captures, replays);
    assert_int_equal(captures, 2);
    free(de->blocks);
    free(dg->blocks);
    free(de);
    free(dg);
    free(le);
    free(lg);
    free(scratch);
    ds_session_free(&se);
    ds_session_free(&sg);
    ds_model_free(&m);
    ds_model_weights_free(&host);
}

static void test_graph_replay(void **state) {
    (void)state;
    graph_vs_eager("tiny-dense");
    graph_vs_eager("tiny-moe");
}

/* ---- 4. dummy weights on the device ---------------------------------------------------------- */

/* n values of a device tensor (bf16 or f32) as floats */
static float *dl(const ds_tensor *t, size_t n) {
    float *out = malloc(sizeof(float) * n);
    if (t->dtype == DS_DTYPE_F32) {
        g_cuda->ops->download(g_cuda, out, t->data, n * sizeof(float));
    } else {
        assert_int_equal(t->dtype, DS_DTYPE_BF16);
        uint16_t *h = malloc(n * 2);
        g_cuda->ops->download(g_cuda, h, t->data, n * 2);
        for (size_t i = 0; i < n; i++) out[i] = ds_bf16_to_f32(h[i]);
        free(h);
    }
    return out;
}

/* uniform in [lo, hi] (bf16 rounding allowed), mean and std of U(lo, hi) within sampling error
 * (the sample variance of a uniform has relative standard error sqrt(0.8 / n)) */
static void check_uniform(const char *what, const ds_tensor *t, size_t n, double lo, double hi) {
    float *v = dl(t, n);
    double s = 0, s2 = 0, mn = 1e30, mx = -1e30;
    for (size_t i = 0; i < n; i++) {
        s += v[i];
        s2 += (double)v[i] * v[i];
        if (v[i] < mn) mn = v[i];
        if (v[i] > mx) mx = v[i];
    }
    const double mean = s / (double)n, sd = sqrt(s2 / (double)n - mean * mean);
    const double want_mean = (lo + hi) / 2, want_sd = (hi - lo) / sqrt(12.0);
    const double slack = (hi - lo) * 0.01;
    printf("  dummy %-28s n %8zu  range [%.4f, %.4f] want [%.4f, %.4f]  mean %+.5f  std %.5f "
           "want %.5f\n", what, n, mn, mx, lo, hi, mean, sd, want_sd);
    if (mn < lo - slack || mx > hi + slack || fabs(mean - want_mean) > 6 * want_sd / sqrt((double)n) + 1e-3 * (hi - lo) ||
        fabs(sd / want_sd - 1) > 0.03 + 2.0 * sqrt(0.8 / (double)n))
        fail_msg("dummy %s: not U(%.4f, %.4f)", what, lo, hi);
    free(v);
}

static void test_dummy_weights(void **state) {
    (void)state;
    assert_non_null(g_cuda->ops->dummy_weights);
    ds_config cfg;
    ds_error err = {0};
    if (ds_config_load("configs/qwen3.5-35b-a3b", &cfg, &err) != DS_OK) fail_msg("%s", err.msg);
    cfg.n_layers = 4; /* layers 0-2 GDN, 3 attention; full widths, 256 experts */
    ds_model_weights a, b, c;
    if (g_cuda->ops->dummy_weights(g_cuda, &cfg, 7, &a, &err) != DS_OK) fail_msg("%s", err.msg);
    if (g_cuda->ops->dummy_weights(g_cuda, &cfg, 7, &b, &err) != DS_OK) fail_msg("%s", err.msg);
    if (g_cuda->ops->dummy_weights(g_cuda, &cfg, 8, &c, &err) != DS_OK) fail_msg("%s", err.msg);
    const double H = cfg.hidden;
    const double am = sqrt(3.0 / H);
    check_uniform("embed (first 1M)", &a.embed, 1 << 20, -am, am);
    check_uniform("lm_head (first 1M)", &a.lm_head.parts[0], 1 << 20, -am, am);
    check_uniform("final_norm", &a.final_norm, (size_t)H, 0.9, 1.1);
    const ds_layer_weights *g = &a.layers[0], *t = &a.layers[3];
    assert_int_equal(g->type, DS_LAYER_LINEAR_ATTN);
    assert_int_equal(t->type, DS_LAYER_FULL_ATTN);
    check_uniform("gdn in_proj (fused)", &g->gdn.in_proj.parts[0],
                  (size_t)g->gdn.in_proj.n_out * (size_t)H, -am, am);
    const double ao = sqrt(3.0 / (double)g->gdn.out.n_in);
    check_uniform("gdn out_proj", &g->gdn.out.parts[0], (size_t)g->gdn.out.n_out * g->gdn.out.n_in, -ao, ao);
    check_uniform("gdn conv", &g->gdn.conv, (size_t)ds_tensor_numel(&g->gdn.conv), -0.5, 0.5);
    check_uniform("gdn neg_exp_A", &g->gdn.neg_exp_A, (size_t)cfg.gdn_v_heads, -16, -1);
    check_uniform("gdn dt_bias", &g->gdn.dt_bias, (size_t)cfg.gdn_v_heads, -4, 0);
    check_uniform("gdn norm", &g->gdn.norm, (size_t)cfg.gdn_v_dim, 0.9, 1.1);
    check_uniform("attn qkv (fused)", &t->attn.qkv.parts[0], (size_t)t->attn.qkv.n_out * (size_t)H, -am, am);
    check_uniform("attn q_norm", &t->attn.q_norm, (size_t)cfg.head_dim, 0.9, 1.1);
    check_uniform("input_norm", &t->input_norm, (size_t)H, 0.9, 1.1);
    check_uniform("router|shared gate_up|gate", &t->moe.router,
                  (size_t)(cfg.n_experts + 2 * cfg.shared_inter + 1) * (size_t)H, -am, am);
    const double ai = sqrt(3.0 / (double)cfg.moe_inter);
    /* the last expert's matrices: the contiguous expert arrays are filled to the end */
    const ds_mlp_weights *e = &t->moe.experts[cfg.n_experts - 1];
    check_uniform("expert 255 gate_up", &e->gate_up.parts[0], (size_t)2 * cfg.moe_inter * (size_t)H, -am, am);
    check_uniform("expert 255 down", &e->down.parts[0], (size_t)H * cfg.moe_inter, -ai, ai);
    check_uniform("shared down", &t->moe.shared.down.parts[0], (size_t)H * cfg.shared_inter,
                  -sqrt(3.0 / cfg.shared_inter), sqrt(3.0 / cfg.shared_inter));
    assert_non_null(a.mtp);
    check_uniform("mtp fc", &a.mtp->fc.parts[0], (size_t)H * 2 * (size_t)H, -sqrt(1.5 / H), sqrt(1.5 / H));
    /* determinism: same seed → same bytes; another seed → other values */
    {
        const size_t n = 1 << 16;
        float *x = dl(&a.layers[2].gdn.in_proj.parts[0], n), *y = dl(&b.layers[2].gdn.in_proj.parts[0], n),
              *z = dl(&c.layers[2].gdn.in_proj.parts[0], n);
        assert_memory_equal(x, y, n * sizeof(float));
        int same = 0;
        for (size_t i = 0; i < n; i++) same += x[i] == z[i];
        printf("  dummy seeds: seed 7 twice identical; seed 8 equal in %d of %zu values\n", same, n);
        assert_true(same < (int)(n / 50));
        free(x);
        free(y);
        free(z);
    }
    g_cuda->ops->release_weights(g_cuda, &a);
    g_cuda->ops->release_weights(g_cuda, &b);
    g_cuda->ops->release_weights(g_cuda, &c);

    /* a model on them: prefill 40 tokens and decode one step; logits finite and O(1) */
    ds_model m;
    if (ds_model_init_dummy(&m, g_cuda, &cfg, 3, 64, 1, &err) != DS_OK) fail_msg("%s", err.msg);
    assert_null(m.dummy_host); /* generated on the device, no host weights */
    ds_session s;
    if (ds_session_init(&s, &m, 1, 128, &err) != DS_OK) fail_msg("%s", err.msg);
    int32_t prompt[40];
    for (int i = 0; i < 40; i++) prompt[i] = (int32_t)((i * 7919 + 3) % cfg.vocab);
    float *logits = malloc(sizeof(float) * (size_t)cfg.vocab);
    if (ds_session_feed(&s, 0, prompt, 40, false, logits, &err) != DS_OK) fail_msg("%s", err.msg);
    const int32_t slot = 0, tok = (int32_t)argmax_row(logits, cfg.vocab);
    if (ds_session_decode(&s, &slot, &tok, 1, logits, &err) != DS_OK) fail_msg("%s", err.msg);
    double s2 = 0;
    int nonfinite = 0;
    for (int v = 0; v < cfg.vocab; v++) {
        nonfinite += !isfinite(logits[v]);
        s2 += (double)logits[v] * logits[v];
    }
    const double rms = sqrt(s2 / cfg.vocab);
    printf("  dummy 4-layer 35B-A3B-wide model: decode logits rms %.3f, %d non-finite\n", rms, nonfinite);
    assert_int_equal(nonfinite, 0);
    assert_true(rms > 0.05 && rms < 50);
    free(logits);
    ds_session_free(&s);
    ds_model_free(&m);
}

int main(void) {
    setvbuf(stdout, NULL, _IOLBF, 0);
    ds_error err = {0};
    if (ds_backend_cuda_create(0, &g_cuda, &err) != DS_OK) {
        return test_cuda_unavailable("test_cuda_model", err.msg);
    }
    if (ds_backend_cpu_create(0, &g_cpu, &err) != DS_OK || ds_backend_cpu_create(0, &g_emu, &err) != DS_OK) {
        printf("test_cuda_model: CPU backend: %s\n", err.msg);
        return 1;
    }
    bf16_emu_wrap(g_emu);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_logits),
        cmocka_unit_test(test_greedy),
        cmocka_unit_test(test_graph_replay),
        cmocka_unit_test(test_dummy_weights),
    };
    const int rc = cmocka_run_group_tests(tests, NULL, NULL);
    g_cuda->ops->destroy(g_cuda);
    g_cpu->ops->destroy(g_cpu);
    g_emu->ops->destroy(g_emu);
    return rc;
}
