/* test_graph_warmup.c — the start-up step-graph warmup (runtime/graph_warmup.h, catalogue items
 * 14 and 15) and the serving paths that use its recordings, on the CPU backend dressed up with
 * fake step graphs: its op table gets graph_begin / graph_end / graph_launch that keep books and
 * refuse to record the steps of chosen sequence counts (as a device refuses a capture: before
 * anything of the step ran), and a recording fails when an op that waits for the device ran
 * inside it (synchronize, download, argmax), as CUDA's stream capture does. The CPU runs a
 * "recorded" step's ops at once, which is the one run graph_end owes; graph_launch never
 * replays, so every later step of a shape runs eagerly. The tokens therefore depend on the
 * record / eager decisions, the scratch steps and the row mapping of the graphed paths, which is
 * what is under test here (the CUDA graphs themselves: test_cuda_model, test_cuda_spec).
 *
 *  (a) the warmup lists exactly the refused shapes with the backend's reason: plain decode
 *      (n = 1 .. max_num_seqs) and speculative verification (n sequences × (1 + k) tokens, n as
 *      far as the token budget holds them); its limit; ds_graph_count; the engine's stats and
 *      the printed report; a backend without graphs is reported off;
 *  (b) an engine whose warmup found refused shapes gives the same tokens as one with graphs off
 *      (the logits path, or eager verification), the refused shapes having run (eagerly), and
 *      no shape is first recorded while serving (plain decode);
 *  (c) the warmup leaves the caches as it found them (every GDN state slot zero, the KV pool's
 *      free list as before, while the scratch steps did write KV rows), refuses a pool in use,
 *      and an engine's tokens after a warmup equal those without one. */
#include "testlib.h"

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/cpu_backend.h"
#include "model/loader.h"
#include "model/model.h"
#include "runtime/engine.h"
#include "runtime/graph_warmup.h"
#include "runtime/runner.h"

#define MODEL_MAX_TOKENS 64
#define MODEL_MAX_OUT 16
#define MAX_ROWS 64
#define MAX_GEN 32

/* ---- the fake graphs ------------------------------------------------------------------------ */

typedef struct fake {
    int refuse[8], n_refuse;   /* sequence counts whose recording graph_begin refuses */
    int pending_seqs, pending_tokens; /* the batch graph_launch saw last: the step to record */
    int cur_seqs;              /* the batch set_batch made current */
    bool recording, rec_failed;
    int begins, refused, recorded;
    int fused_calls;           /* argmax_logits outside recordings */
    int fused_rows[MAX_ROWS + 1]; /* of them, by rows */
    int refused_runs;          /* of them, in a step of a refused sequence count */
} fake;

static fake g_fk;
static const ds_backend_ops *g_cpu; /* the CPU's own table */
static ds_backend_ops g_ops;        /* g_cpu + the fakes */

static bool refuses(int n_seqs) {
    for (int i = 0; i < g_fk.n_refuse; i++)
        if (g_fk.refuse[i] == n_seqs) return true;
    return false;
}

static bool fake_launch(ds_backend *be, uint64_t key, const ds_batch *b) {
    (void)be;
    (void)key;
    g_fk.pending_seqs = b->n_seqs;
    g_fk.pending_tokens = b->n_tokens;
    return false; /* never replays: the step runs eagerly */
}

static ds_status fake_begin(ds_backend *be, uint64_t key, ds_error *err) {
    (void)be;
    (void)key;
    g_fk.begins++;
    if (refuses(g_fk.pending_seqs)) {
        g_fk.refused++;
        return ds_error_set(err, DS_ERR_UNSUPPORTED, "fake: cannot record a step of %d sequences",
                            g_fk.pending_seqs);
    }
    g_fk.recording = true;
    g_fk.rec_failed = false;
    return DS_OK;
}

static ds_status fake_end(ds_backend *be, ds_error *err) {
    (void)be;
    g_fk.recording = false;
    if (g_fk.rec_failed)
        return ds_error_set(err, DS_ERR_UNSUPPORTED, "fake: an op waited for the device");
    g_fk.recorded++;
    return DS_OK;
}

static ds_status fake_sync(ds_backend *be, ds_error *err) {
    if (g_fk.recording) g_fk.rec_failed = true;
    return g_cpu->synchronize(be, err);
}

static void fake_download(ds_backend *be, void *dst, const void *src, size_t bytes) {
    if (g_fk.recording) g_fk.rec_failed = true;
    g_cpu->download(be, dst, src, bytes);
}

static void fake_argmax(ds_backend *be, const ds_tensor *logits, int32_t *ids) {
    if (g_fk.recording) g_fk.rec_failed = true;
    g_cpu->argmax(be, logits, ids);
}

static void fake_set_batch(ds_backend *be, const ds_batch *b) {
    g_fk.cur_seqs = b->n_seqs;
    g_cpu->set_batch(be, b);
}

/* The CPU's fused head, counted. */
static void fake_argmax_logits(ds_backend *be, const ds_tensor *x, const ds_linear *lm_head,
                               int32_t *ids, int keep_at) {
    const int64_t R = x->ne[0];
    if (!g_fk.recording) {
        g_fk.fused_calls++;
        if (R <= MAX_ROWS) g_fk.fused_rows[R]++;
        if (refuses(g_fk.cur_seqs)) g_fk.refused_runs++;
    }
    g_cpu->argmax_logits(be, x, lm_head, ids, keep_at);
}

static void fake_reset(const int *refuse, int n_refuse) {
    memset(&g_fk, 0, sizeof g_fk);
    for (int i = 0; i < n_refuse; i++) g_fk.refuse[i] = refuse[i];
    g_fk.n_refuse = n_refuse;
}

static void fake_counts_reset(void) {
    g_fk.begins = g_fk.refused = g_fk.recorded = 0;
    g_fk.fused_calls = g_fk.refused_runs = 0;
    memset(g_fk.fused_rows, 0, sizeof g_fk.fused_rows);
}

/* ---- fixture -------------------------------------------------------------------------------- */

typedef test_model fixture; /* testlib.h */

/* graphs: the fake graph ops on top of the CPU backend; else the plain CPU backend */
static void fixture_open(fixture *f, const char *name, bool graphs) {
    char rel[256];
    snprintf(rel, sizeof rel, "models/%s", name);
    test_model_load(f, test_data_path(rel));
    g_cpu = f->be->ops;
    if (graphs) {
        g_ops = *g_cpu;
        g_ops.graph_begin = fake_begin;
        g_ops.graph_end = fake_end;
        g_ops.graph_launch = fake_launch;
        g_ops.synchronize = fake_sync;
        g_ops.download = fake_download;
        g_ops.argmax = fake_argmax;
        g_ops.set_batch = fake_set_batch;
        g_ops.argmax_logits = fake_argmax_logits;
        f->be->ops = &g_ops;
    }
    test_model_init(f, MODEL_MAX_TOKENS, MODEL_MAX_OUT);
}

static void fixture_close(fixture *f) {
    f->be->ops = g_cpu; /* the CPU backend's own ops (the fake ones share its free) */
    test_model_close(f);
}

/* Every GDN state and conv slot of the runner's cache is zero; some KV row is not (the scratch
 * steps ran and wrote there, so the zero states are the reset's doing). */
static void expect_clean_caches(const fixture *f, const ds_runner *r, int n_slots,
                                int n_blocks) {
    const ds_config *c = &f->cfg;
    const size_t n_state = (size_t)c->gdn_v_heads * (size_t)c->gdn_k_dim * (size_t)c->gdn_v_dim;
    const size_t n_conv = (size_t)ds_config_gdn_conv_dim(c) * (size_t)(c->gdn_conv_kernel - 1);
    int gdn_layers = 0, attn_layer = -1;
    for (int l = 0; l < c->n_layers; l++) {
        if (c->layer_types[l] != DS_LAYER_LINEAR_ATTN) {
            if (attn_layer < 0) attn_layer = l;
            continue;
        }
        gdn_layers++;
        for (int s = 0; s < n_slots; s++) {
            const float *st = ds_cpu_cache_gdn_state(r->cache, l, s);
            const float *cv = ds_cpu_cache_gdn_conv(r->cache, l, s);
            assert_non_null(st);
            assert_non_null(cv);
            for (size_t i = 0; i < n_state; i++)
                if (st[i] != 0.0f)
                    fail_msg("layer %d slot %d: GDN state [%zu] = %g", l, s, i, st[i]);
            for (size_t i = 0; i < n_conv; i++)
                if (cv[i] != 0.0f)
                    fail_msg("layer %d slot %d: conv state [%zu] = %g", l, s, i, cv[i]);
        }
    }
    assert_true(gdn_layers > 0 && attn_layer >= 0);
    const float *k = ds_cpu_cache_k(r->cache, attn_layer);
    const size_t n_k = (size_t)n_blocks * 16 * (size_t)c->n_kv_heads * (size_t)c->head_dim;
    double sum = 0;
    for (size_t i = 0; i < n_k; i++) sum += k[i] < 0 ? -k[i] : k[i];
    assert_true(sum > 0);
}

static char *print_report(const ds_graph_report *rep) {
    char *buf = NULL;
    size_t len = 0;
    FILE *m = open_memstream(&buf, &len);
    assert_non_null(m);
    ds_graph_report_print(rep, "T: ", m);
    fclose(m);
    return buf;
}

/* ---- (a) + (c) at the runner -------------------------------------------------------------- */

#define R_SEQS 6
#define R_BLOCKS 32
#define R_MAXB 4

static void test_warmup_decode(void **state) {
    (void)state;
    const int refuse[] = {2, 5};
    fake_reset(refuse, 2);
    fixture f;
    fixture_open(&f, "tiny-moe", true);
    ds_runner r;
    ds_error err = {0};
    if (ds_runner_init(&r, &f.model, R_SEQS, MODEL_MAX_TOKENS, R_BLOCKS, 16, R_MAXB, &err) != DS_OK)
        fail_msg("runner: %s", err.msg);
    assert_true(ds_runner_greedy_ready(&r));
    ds_kv_blocks kv;
    ds_kv_blocks_init(&kv, R_BLOCKS, 16, R_SEQS, R_MAXB);
    int32_t stack0[R_BLOCKS];
    memcpy(stack0, kv.free_stack, sizeof stack0);

    ds_graph_report rep;
    assert_int_equal(ds_graph_warmup(&r, &kv, DS_GRAPH_WARMUP_ALL, &rep, &err), DS_OK);
    assert_false(rep.off);
    assert_int_equal(rep.k, 0);
    assert_int_equal(rep.n_formable, R_SEQS);
    assert_int_equal(rep.n_run, R_SEQS);
    assert_int_equal(rep.n_captured, R_SEQS - 2);
    assert_int_equal(rep.n_eager, 2);
    for (int i = 0; i < 2; i++) {
        assert_int_equal(rep.eager[i].n_seqs, refuse[i]);
        assert_int_equal(rep.eager[i].n_tokens, refuse[i]);
        char want[64];
        snprintf(want, sizeof want, "fake: cannot record a step of %d sequences", refuse[i]);
        if (!strstr(rep.eager[i].why, want)) fail_msg("why: '%s'", rep.eager[i].why);
    }
    assert_int_equal(g_fk.begins, R_SEQS);
    assert_int_equal(g_fk.recorded, R_SEQS - 2);
    for (int n = 1; n <= R_SEQS; n++) assert_int_equal(r.graph_state[n], refuses(n) ? -1 : 1);
    int cap = 0, eag = 0;
    ds_graph_count(&r, &cap, &eag);
    assert_int_equal(cap, R_SEQS - 2);
    assert_int_equal(eag, 2);

    char *txt = print_report(&rep);
    if (!strstr(txt, "T: step graphs: 4 of 6 decode shapes recorded") ||
        !strstr(txt, "T:   eager: 2 sequences (2 tokens): fake: cannot record a step of 2") ||
        !strstr(txt, "T:   eager: 5 sequences (5 tokens): fake: cannot record a step of 5"))
        fail_msg("report:\n%s", txt);
    free(txt);

    /* (c) the caches and the pool as before */
    assert_int_equal(kv.n_free, R_BLOCKS);
    assert_memory_equal(kv.free_stack, stack0, sizeof stack0);
    for (int s = 0; s < R_SEQS; s++) assert_int_equal(ds_kv_blocks_held(&kv, s), 0);
    expect_clean_caches(&f, &r, R_SEQS, R_BLOCKS);
    ds_graph_report_free(&rep);

    /* a second warmup replays what is recorded and tries nothing again */
    fake_counts_reset();
    assert_int_equal(ds_graph_warmup(&r, &kv, DS_GRAPH_WARMUP_ALL, &rep, &err), DS_OK);
    assert_int_equal(g_fk.begins, 0);
    assert_int_equal(rep.n_captured, R_SEQS - 2);
    assert_int_equal(rep.n_eager, 2);
    assert_non_null(strstr(rep.eager[0].why, "earlier step"));
    ds_graph_report_free(&rep);

    /* a pool that a sequence holds is refused */
    assert_true(ds_kv_blocks_append(&kv, 3, 20));
    assert_int_equal(ds_graph_warmup(&r, &kv, DS_GRAPH_WARMUP_ALL, &rep, &err), DS_ERR_INVALID_ARG);
    assert_non_null(strstr(err.msg, "held by sequences"));
    ds_graph_report_free(&rep);
    ds_kv_blocks_free(&kv);
    ds_runner_free(&r);

    /* the limit: n = 1..3 only, the rest left to their first step */
    fake_reset(refuse, 2);
    if (ds_runner_init(&r, &f.model, R_SEQS, MODEL_MAX_TOKENS, R_BLOCKS, 16, R_MAXB, &err) != DS_OK)
        fail_msg("runner: %s", err.msg);
    ds_kv_blocks_init(&kv, R_BLOCKS, 16, R_SEQS, R_MAXB);
    assert_int_equal(ds_graph_warmup(&r, &kv, 3, &rep, &err), DS_OK);
    assert_int_equal(rep.n_run, 3);
    assert_int_equal(rep.n_captured, 2);
    assert_int_equal(rep.n_eager, 1);
    assert_int_equal(rep.eager[0].n_seqs, 2);
    assert_int_equal(g_fk.begins, 3);
    txt = print_report(&rep);
    if (!strstr(txt, "n = 4..6 left to their first step (the warmup's limit)"))
        fail_msg("report:\n%s", txt);
    free(txt);
    ds_graph_report_free(&rep);
    /* limit 0: nothing runs */
    fake_counts_reset();
    assert_int_equal(ds_graph_warmup(&r, &kv, 0, &rep, &err), DS_OK);
    assert_int_equal(rep.n_run, 0);
    assert_int_equal(g_fk.begins + g_fk.fused_calls, 0);
    ds_graph_report_free(&rep);
    ds_kv_blocks_free(&kv);
    ds_runner_free(&r);
    fixture_close(&f);
}

/* speculative verification: n sequences × (1 + k) tokens, n within the token budget */
static void test_warmup_verify(void **state) {
    (void)state;
    const int K = 2, SEQS = 4, BUDGET = 10; /* 10 / (1 + 2): n = 1..3 form, 4 never does */
    const int refuse[] = {2};
    fake_reset(refuse, 1);
    fixture f;
    fixture_open(&f, "tiny-moe-mtp", true);
    ds_runner r;
    ds_error err = {0};
    if (ds_runner_init_spec(&r, &f.model, SEQS, BUDGET, R_BLOCKS, 16, R_MAXB, K, &err) != DS_OK)
        fail_msg("runner: %s", err.msg);
    ds_kv_blocks kv;
    ds_kv_blocks_init(&kv, R_BLOCKS, 16, SEQS, R_MAXB);
    int32_t stack0[R_BLOCKS];
    memcpy(stack0, kv.free_stack, sizeof stack0);

    ds_graph_report rep;
    assert_int_equal(ds_graph_warmup(&r, &kv, DS_GRAPH_WARMUP_ALL, &rep, &err), DS_OK);
    assert_false(rep.off);
    assert_int_equal(rep.k, K);
    assert_int_equal(rep.n_formable, 3);
    assert_int_equal(rep.n_run, 3);
    assert_int_equal(rep.n_captured, 2);
    assert_int_equal(rep.n_eager, 1);
    assert_int_equal(rep.eager[0].n_seqs, 2);
    assert_int_equal(rep.eager[0].n_tokens, 2 * (1 + K));
    assert_non_null(strstr(rep.eager[0].why, "fake: cannot record a step of 2 sequences"));
    /* each shape's step: every row's argmax in one fused call of n·(1 + k) rows; the fake never
     * replays, so a shape runs (and counts) eagerly when refused, and again (both) before its
     * draft passes are recorded. Last the sampled verifications (no fused head: spec_sample),
     * each followed by its K draft passes of n rows, which replay (here: run eagerly, counted)
     * the passes recorded before: K more fused calls of n rows for n = 1..3 (so n = 3's land
     * on the index of n = 1's verification) */
    for (int n = 1; n <= 3; n++)
        assert_int_equal(g_fk.fused_rows[n * (1 + K)], (refuses(n) ? 2 : 1) + (n == 1 ? K : 0));
    /* the draft passes after each greedy shape (device-chained drafts): K passes of n rows
     * each, those of the refused n = 2 eager (fused heads of 2 rows) */
    assert_int_equal(rep.n_draft_run, 3 * K);
    assert_int_equal(rep.n_draft_captured, 2 * K);
    assert_int_equal(rep.n_draft_eager, K);
    assert_int_equal(g_fk.fused_rows[1], K);
    assert_int_equal(g_fk.fused_rows[2], K + K);
    /* the sampled verification shapes: n = 2 refused as the greedy one */
    assert_int_equal(rep.n_sampled_run, 3);
    assert_int_equal(rep.n_sampled_captured, 2);
    int cap = 0, eag = 0;
    ds_graph_count(&r, &cap, &eag); /* verifications (greedy, sampled) and draft passes */
    assert_int_equal(cap, 2 + 2 * K + 2);
    assert_int_equal(eag, 1 + K + 1);
    char *txt = print_report(&rep);
    if (!strstr(txt, "2 of 3 verification shapes recorded") ||
        !strstr(txt, "2 of 3 sampled verification shapes recorded (n = 1..3 sequences); the others run eagerly") ||
        !strstr(txt, "4 of 6 draft passes recorded (n = 1..3 sequences x 2 passes); the others run eagerly") ||
        !strstr(txt, "eager: 2 sequences (6 tokens)") ||
        !strstr(txt, "n = 4..4 never form a step of 3 tokens per sequence"))
        fail_msg("report:\n%s", txt);
    free(txt);
    assert_int_equal(kv.n_free, R_BLOCKS);
    assert_memory_equal(kv.free_stack, stack0, sizeof stack0);
    expect_clean_caches(&f, &r, SEQS * (K + 2), R_BLOCKS);
    ds_graph_report_free(&rep);
    ds_kv_blocks_free(&kv);
    ds_runner_free(&r);
    fixture_close(&f);
}

/* a backend without graph ops: reported off, nothing run */
static void test_warmup_off(void **state) {
    (void)state;
    fake_reset(NULL, 0);
    fixture f;
    fixture_open(&f, "tiny-moe", false);
    ds_runner r;
    ds_error err = {0};
    if (ds_runner_init(&r, &f.model, R_SEQS, MODEL_MAX_TOKENS, R_BLOCKS, 16, R_MAXB, &err) != DS_OK)
        fail_msg("runner: %s", err.msg);
    ds_kv_blocks kv;
    ds_kv_blocks_init(&kv, R_BLOCKS, 16, R_SEQS, R_MAXB);
    ds_graph_report rep;
    assert_int_equal(ds_graph_warmup(&r, &kv, DS_GRAPH_WARMUP_ALL, &rep, &err), DS_OK);
    assert_true(rep.off);
    assert_int_equal(rep.n_run, 0);
    assert_non_null(strstr(rep.off_why, "records no step graphs"));
    char *txt = print_report(&rep);
    assert_non_null(strstr(txt, "T: step graphs: off (the backend records no step graphs)"));
    free(txt);
    ds_graph_report_free(&rep);
    ds_kv_blocks_free(&kv);
    ds_runner_free(&r);
    fixture_close(&f);
}

/* ---- (b) + (c) in the engine ---------------------------------------------------------------- */

typedef struct req {
    int32_t prompt[24];
    int n_prompt, max_tokens;
    int bias_id; /* ≥ 0: logit_bias {bias_id: +100}, which must take every greedy choice */
} req;

typedef struct outcome {
    int32_t toks[8][MAX_GEN];
    int n[8];
    ds_engine_stats st;
    int n_eager;
    int eager_seqs[8];
    int runtime_begins, runtime_refused_runs, runtime_fused_calls;
} outcome;

static void make_reqs(req *w, int n, int vocab) {
    test_rng g = {12345};
    for (int i = 0; i < n; i++) {
        w[i].n_prompt = 5 + 4 * i;
        for (int t = 0; t < w[i].n_prompt; t++) {
            int v = (int)((test_rng_uniform(&g) + 1.0f) * 0.5f * (float)(vocab - 1));
            w[i].prompt[t] = v < 0 ? 0 : v >= vocab ? vocab - 1 : v;
        }
        w[i].max_tokens = 8 + 4 * i; /* staggered ends: every batch size from n down to 1 */
        w[i].bias_id = -1;
    }
}

static void run_engine(fixture *f, const ds_engine_opts *o, const req *w, int n, outcome *out) {
    memset(out, 0, sizeof *out);
    ds_engine *e;
    ds_error err = {0};
    if (ds_engine_create(&f->model, o, &e, &err) != DS_OK) fail_msg("engine: %s", err.msg);
    const ds_graph_report *rep = ds_engine_graph_report(e);
    out->n_eager = rep->n_eager;
    for (int i = 0; i < rep->n_eager && i < 8; i++) out->eager_seqs[i] = rep->eager[i].n_seqs;
    fake_counts_reset(); /* from here: what serving did */
    ds_request *rq[8];
    for (int i = 0; i < n; i++) {
        ds_request_desc d = {.prompt = w[i].prompt, .n_prompt = w[i].n_prompt};
        ds_sampling_params_init(&d.params);
        d.params.temperature = 0.0f;
        d.params.ignore_eos = true;
        d.params.max_tokens = w[i].max_tokens;
        const ds_logit_bias bias = {w[i].bias_id, 100.0f};
        if (w[i].bias_id >= 0) {
            d.params.logit_bias = &bias;
            d.params.n_logit_bias = 1;
        }
        if (ds_engine_submit(e, &d, &rq[i], &err) != DS_OK) fail_msg("submit: %s", err.msg);
    }
    for (int i = 0; i < n; i++) {
        ds_request_event ev;
        bool finished = false;
        while (ds_request_next(rq[i], &ev, -1)) {
            for (int t = 0; t < ev.n_tokens; t++) {
                assert_true(out->n[i] < MAX_GEN);
                out->toks[i][out->n[i]++] = ev.tokens[t];
            }
            if (ev.finished) {
                finished = true;
                assert_int_equal(ev.reason, DS_FINISH_LENGTH);
            }
        }
        assert_true(finished);
        assert_int_equal(out->n[i], w[i].max_tokens);
        ds_request_release(rq[i]);
    }
    ds_engine_get_stats(e, &out->st);
    out->runtime_begins = g_fk.begins;
    out->runtime_refused_runs = g_fk.refused_runs;
    out->runtime_fused_calls = g_fk.fused_calls;
    ds_engine_destroy(e);
}

static void expect_same_tokens(const outcome *a, const outcome *b, int n, const char *what) {
    for (int i = 0; i < n; i++) {
        if (a->n[i] != b->n[i] || memcmp(a->toks[i], b->toks[i], (size_t)a->n[i] * 4) != 0) {
            int k = 0;
            while (k < a->n[i] && k < b->n[i] && a->toks[i][k] == b->toks[i][k]) k++;
            fail_msg("%s: request %d differs at token %d", what, i, k);
        }
    }
}

static void engine_opts(ds_engine_opts *o, int max_seqs, int k) {
    ds_engine_opts_default(o);
    o->max_num_seqs = max_seqs;
    o->max_model_len = 128;
    o->max_num_batched_tokens = 64;
    o->block_size = 16;
    o->num_speculative_tokens = k;
}

static void test_engine_decode(void **state) {
    (void)state;
    enum { N = 4 };
    const int refuse[] = {2, 3};
    fake_reset(refuse, 2);
    fixture f;
    fixture_open(&f, "tiny-moe", true);
    req w[N];
    make_reqs(w, N, f.cfg.vocab);
    ds_engine_opts o;
    engine_opts(&o, N, 0);

    outcome warm, cold, off;
    run_engine(&f, &o, w, N, &warm); /* (A) warmup: all shapes, 2 and 3 refused */
    assert_int_equal(warm.n_eager, 2);
    assert_int_equal(warm.eager_seqs[0], 2);
    assert_int_equal(warm.eager_seqs[1], 3);
    assert_int_equal(warm.st.graph_shapes_captured, 2);
    assert_int_equal(warm.st.graph_shapes_eager, 2);
    assert_int_equal(warm.runtime_begins, 0); /* every shape served was tried at start-up */
    assert_true(warm.runtime_refused_runs > 0); /* the refused shapes did run, eagerly */

    o.warmup_graphs = 0; /* (B) no warmup: shapes recorded (or refused) at first use */
    run_engine(&f, &o, w, N, &cold);
    assert_int_equal(cold.n_eager, 0);
    assert_true(cold.runtime_begins > 0);
    assert_int_equal(cold.st.graph_shapes_eager, 2); /* counted when they fell back serving */
    assert_true(cold.st.graph_shapes_captured >= 1);
    expect_same_tokens(&warm, &cold, N, "warmup vs none");

    setenv("DS_SERVE_GRAPHS", "0", 1); /* (C) graphs off: the logits path and the sampler */
    o.warmup_graphs = DS_GRAPH_WARMUP_ALL;
    run_engine(&f, &o, w, N, &off);
    unsetenv("DS_SERVE_GRAPHS");
    assert_int_equal(off.runtime_fused_calls, 0);
    assert_int_equal(off.st.graph_shapes_captured + off.st.graph_shapes_eager, 0);
    expect_same_tokens(&warm, &off, N, "graphs vs graphs off");
    fixture_close(&f);
}

static void test_engine_verify(void **state) {
    (void)state;
    enum { N = 3, K = 2 };
    const int refuse[] = {2};
    fake_reset(refuse, 1);
    fixture f;
    fixture_open(&f, "tiny-moe-mtp", true);
    req w[N];
    make_reqs(w, N, f.cfg.vocab);
    ds_engine_opts o;
    engine_opts(&o, N, K);

    outcome warm, off;
    run_engine(&f, &o, w, N, &warm);
    assert_int_equal(warm.n_eager, 1);
    assert_int_equal(warm.eager_seqs[0], 2);
    assert_true(warm.st.graph_shapes_captured >= 2);
    assert_true(warm.st.graph_shapes_eager >= 1);
    assert_true(warm.runtime_fused_calls > 0); /* greedy verifications took the graphed path */
    assert_true(warm.runtime_refused_runs > 0);

    /* eager verification (ds_runner_verify) and drafts through the host, pass by pass (no
     * fused head anywhere: the warm run's draft passes were fused, chained on the device and
     * recorded as graphs too) */
    setenv("DS_OPT_SPEC_GRAPHS", "0", 1);
    setenv("DS_OPT_SPEC_DEVICE_DRAFTS", "0", 1);
    run_engine(&f, &o, w, N, &off);
    unsetenv("DS_OPT_SPEC_GRAPHS");
    unsetenv("DS_OPT_SPEC_DEVICE_DRAFTS");
    assert_int_equal(off.runtime_fused_calls, 0);
    assert_int_equal(off.st.graph_shapes_captured + off.st.graph_shapes_eager, 0);
    expect_same_tokens(&warm, &off, N, "graphed verification + device drafts vs eager + host");

    /* device-chained drafts without any graph (the CPU backend's path) */
    outcome chain;
    setenv("DS_OPT_SPEC_GRAPHS", "0", 1);
    run_engine(&f, &o, w, N, &chain);
    unsetenv("DS_OPT_SPEC_GRAPHS");
    assert_true(chain.runtime_fused_calls > 0); /* the draft passes' fused heads */
    assert_int_equal(chain.st.graph_shapes_captured + chain.st.graph_shapes_eager, 0);
    expect_same_tokens(&warm, &chain, N, "graphs vs device drafts without graphs");

    /* and both equal plain decoding without speculation */
    outcome plain;
    engine_opts(&o, N, 0);
    setenv("DS_SERVE_GRAPHS", "0", 1);
    run_engine(&f, &o, w, N, &plain);
    unsetenv("DS_SERVE_GRAPHS");
    expect_same_tokens(&warm, &plain, N, "speculative vs plain decoding");
    fixture_close(&f);
}

/* A greedy request with logit_bias needs its logits (catalogue items 7, 9: the fused argmax
 * paths are for plain argmax requests only): on a backend with the fused head and graphs,
 * decoding and speculative verification alike, the biased request gets its forced token every
 * step while its neighbours get the tokens they get without it in the batch. */
static void test_engine_logit_bias(void **state) {
    (void)state;
    enum { N = 3, FORCED = 7 };
    fake_reset(NULL, 0);
    fixture f;
    fixture_open(&f, "tiny-moe-mtp", true);
    req w[N];
    make_reqs(w, N, f.cfg.vocab);
    for (int k = 0; k <= 2; k += 2) {
        ds_engine_opts o;
        engine_opts(&o, N, k);
        outcome plain, biased;
        run_engine(&f, &o, w, N, &plain);
        w[1].bias_id = FORCED;
        run_engine(&f, &o, w, N, &biased);
        w[1].bias_id = -1;
        int forced = 0;
        for (int t = 0; t < biased.n[1]; t++) forced += biased.toks[1][t] == FORCED;
        print_message("k = %d: %d of %d tokens forced; plain run's fused calls %d\n", k, forced,
                      biased.n[1], plain.runtime_fused_calls);
        assert_true(plain.runtime_fused_calls > 0); /* the fused path was in play */
        assert_int_equal(forced, biased.n[1]);
        assert_int_equal(biased.n[0], plain.n[0]);
        assert_memory_equal(biased.toks[0], plain.toks[0], (size_t)plain.n[0] * 4);
        assert_int_equal(biased.n[2], plain.n[2]);
        assert_memory_equal(biased.toks[2], plain.toks[2], (size_t)plain.n[2] * 4);
    }
    fixture_close(&f);
}

int main(void) {
    unsetenv("DS_SERVE_GRAPHS");
    unsetenv("DS_OPT_SPEC_GRAPHS");
    unsetenv("DS_OPT_FUSED_ARGMAX");
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_warmup_decode),
        cmocka_unit_test(test_warmup_verify),
        cmocka_unit_test(test_warmup_off),
        cmocka_unit_test(test_engine_decode),
        cmocka_unit_test(test_engine_verify),
        cmocka_unit_test(test_engine_logit_bias),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
