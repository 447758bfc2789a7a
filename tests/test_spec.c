/* test_spec.c — MTP speculative decoding of one sequence (runtime/spec.h) on the CPU backend.
 *
 * The reference for greedy decoding is plain decoding (ds_session_feed one token at a time with
 * the same ds_sampler settings): speculative output must be token-identical, for k = 1..4, on
 * the MoE and the dense fixture with random MTP heads (which are rarely right) and on the
 * trained demo model. An "oracle" draft hook that knows the reference continuation forces every
 * accepted length 0..k in turn (correct drafts up to a chosen point, then a wrong one, then
 * correct ones again, which must not be accepted), so each rollback path is exercised, and the
 * acceptance counters must equal what the oracle planned. The non-fast greedy path (penalties,
 * min_tokens with EOS) is compared the same way.
 *
 * Sampling (temperature > 0): speculative sampling must leave the output distributed exactly as
 * the target's, and a position's token must not depend on its draft (or on having one).
 * Chi-square tests (Wilson–Hilferty z < 4 over bins with ≥ 5 expected counts) on
 * (a) ds_spec_verify over fixed target rows and drafts, 40000 seeded draws: the first token, and
 * the second given the first draft was accepted; (b) end to end through the session with oracle
 * drafts: the second generated token, given the first, over seeded runs. Expected distributions
 * are softmax(logits / T) computed here in double from plain forward passes. A deliberately
 * wrong expectation (another temperature) must fail the same test (power check). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "testlib.h"

#include "backend/backend.h"
#include "backend/cpu/cpu_backend.h"
#include "model/loader.h"
#include "model/model.h"
#include "runtime/session.h"
#include "runtime/spec.h"

#define GEN 48
#define MAX_K 4

typedef struct fx {
    ds_config cfg;
    ds_model_weights host;
    ds_backend *be;
    ds_model model;
} fx;

static void fx_open(fx *f, const char *dir) {
    ds_error err = {0};
    if (ds_model_load(dir, &f->cfg, &f->host, &err) != DS_OK) fail_msg("load %s: %s", dir, err.msg);
    assert_int_equal(ds_backend_cpu_create(2, &f->be, &err), DS_OK);
    /* max_tokens 32: prompts longer than that are fed in chunks, with the MTP over each */
    if (ds_model_init(&f->model, f->be, &f->cfg, &f->host, 32, MAX_K + 1, &err) != DS_OK)
        fail_msg("model init: %s", err.msg);
}

static void fx_close(fx *f) {
    ds_model_free(&f->model);
    f->be->ops->destroy(f->be);
    ds_model_weights_free(&f->host);
}

static const char *model_dir(const char *name) {
    static char dir[1024];
    if (!strcmp(name, "demo"))
        snprintf(dir, sizeof dir, "%s/../../models/qwen35-demo", test_data_dir());
    else
        snprintf(dir, sizeof dir, "%s/models/%s", test_data_dir(), name);
    return dir;
}

static void prompt_of(int n, int vocab, uint64_t seed, int32_t *out) {
    test_rng g = {seed};
    for (int i = 0; i < n; i++) {
        float u = (test_rng_uniform(&g) + 1.0f) * 0.5f;
        int v = (int)(u * (float)(vocab - 8));
        out[i] = v < vocab - 8 ? v : vocab - 9; /* keep clear of eos ids at the top */
    }
}

/* Plain decoding with the session: the reference. Returns tokens emitted. */
static int plain_generate(fx *f, const int32_t *prompt, int n_prompt,
                          const ds_sampling_params *sp, int32_t *out) {
    ds_session s;
    ds_error err = {0};
    const int V = f->cfg.vocab;
    if (ds_session_init(&s, &f->model, 1, n_prompt + sp->max_tokens, &err) != DS_OK)
        fail_msg("session: %s", err.msg);
    ds_sampler smp;
    assert_int_equal(ds_sampler_init(&smp, sp, V, f->cfg.eos_ids, f->cfg.n_eos, &err), DS_OK);
    assert_int_equal(ds_sampler_add_prompt(&smp, prompt, n_prompt, &err), DS_OK);
    float *logits = malloc(sizeof(float) * (size_t)V);
    assert_int_equal(ds_session_feed(&s, 0, prompt, n_prompt, false, logits, &err), DS_OK);
    int n = 0;
    for (;;) {
        ds_sample_result r;
        assert_int_equal(ds_sampler_sample(&smp, logits, n, &r, &err), DS_OK);
        assert_int_equal(ds_sampler_accept(&smp, r.token, &err), DS_OK);
        out[n++] = r.token;
        if (ds_sampler_finish_reason(&smp, r.token, n, NULL) != DS_FINISH_NONE) break;
        assert_int_equal(ds_session_feed(&s, 0, &out[n - 1], 1, false, logits, &err), DS_OK);
    }
    free(logits);
    ds_sampler_free(&smp);
    ds_session_free(&s);
    return n;
}

/* The oracle: drafts follow the reference for `plan` tokens, then one wrong token, then the
 * reference again (which must not be accepted past the wrong one). */
typedef struct oracle {
    const int32_t *ref;
    int n_ref, vocab, step;
    int64_t planned; /* Σ min(plan, n_draft): accepted drafts the oracle expects */
} oracle;

static void oracle_hook(void *ctx, int n_generated, int n_draft, int32_t *drafts) {
    oracle *o = ctx;
    int plan = o->step % (n_draft + 1); /* cycles 0..n_draft */
    o->step++;
    for (int i = 0; i < n_draft; i++) {
        int idx = n_generated + i;
        int32_t right = idx < o->n_ref ? o->ref[idx] : 0;
        drafts[i] = i == plan ? (right + 1) % o->vocab : right;
    }
    o->planned += plan;
}

/* Speculative generation; returns tokens emitted (and stats). */
static int spec_generate(fx *f, const int32_t *prompt, int n_prompt, const ds_sampling_params *sp,
                         int k, oracle *orc, int32_t *out, ds_spec_stats *stats) {
    ds_session s;
    ds_error err = {0};
    const int V = f->cfg.vocab;
    if (ds_session_init_spec(&s, &f->model, 1, n_prompt + sp->max_tokens, k, &err) != DS_OK)
        fail_msg("session: %s", err.msg);
    ds_sampler smp;
    assert_int_equal(ds_sampler_init(&smp, sp, V, f->cfg.eos_ids, f->cfg.n_eos, &err), DS_OK);
    assert_int_equal(ds_sampler_add_prompt(&smp, prompt, n_prompt, &err), DS_OK);
    ds_spec_gen g;
    if (ds_spec_gen_init(&g, &s, 0, k, &smp, &err) != DS_OK) fail_msg("spec init: %s", err.msg);
    if (orc) {
        g.hook = oracle_hook;
        g.hook_ctx = orc;
    }
    int32_t toks[DS_SPEC_MAX_K + 1];
    ds_sample_result res[DS_SPEC_MAX_K + 1];
    int n = 0, m = 0;
    if (ds_spec_gen_prefill(&g, prompt, n_prompt, toks, res, &m, &err) != DS_OK)
        fail_msg("prefill: %s", err.msg);
    for (;;) {
        for (int i = 0; i < m; i++) out[n++] = toks[i];
        if (g.finished) break;
        assert_true(n < sp->max_tokens);
        if (ds_spec_gen_step(&g, toks, res, &m, &err) != DS_OK) fail_msg("step: %s", err.msg);
        assert_true(m >= 1 && m <= k + 1);
    }
    if (stats) *stats = g.stats;
    ds_spec_gen_free(&g);
    ds_sampler_free(&smp);
    ds_session_free(&s);
    return n;
}

static void greedy_params(ds_sampling_params *sp, int max_tokens) {
    ds_sampling_params_init(sp);
    sp->temperature = 0.0f;
    sp->max_tokens = max_tokens;
    sp->ignore_eos = true;
}

static void check_greedy_equal(const char *name) {
    fx f;
    fx_open(&f, model_dir(name));
    const int V = f.cfg.vocab;
    const int plens[] = {1, 9, 40, 70};
    int32_t prompt[128], ref[GEN + 8], out[GEN + 8];
    for (size_t pi = 0; pi < sizeof plens / sizeof plens[0]; pi++) {
        prompt_of(plens[pi], V, 1000 + pi, prompt);
        ds_sampling_params sp;
        greedy_params(&sp, GEN);
        int nr = plain_generate(&f, prompt, plens[pi], &sp, ref);
        assert_int_equal(nr, GEN);
        for (int k = 1; k <= MAX_K; k++) {
            ds_spec_stats st;
            int n = spec_generate(&f, prompt, plens[pi], &sp, k, NULL, out, &st);
            assert_int_equal(n, nr);
            for (int i = 0; i < n; i++)
                if (out[i] != ref[i])
                    fail_msg("%s prompt %d k=%d: token %d differs (%d vs plain %d)", name,
                             plens[pi], k, i, out[i], ref[i]);
            printf("  %s prompt %d k=%d: identical; MTP acceptance %.2f, mean accepted length "
                   "%.2f\n", name, plens[pi], k, ds_spec_acceptance_rate(&st),
                   ds_spec_mean_accepted_len(&st));
            /* oracle drafts: every accepted length 0..k, output still identical */
            oracle o = {.ref = ref, .n_ref = nr, .vocab = V};
            n = spec_generate(&f, prompt, plens[pi], &sp, k, &o, out, &st);
            assert_int_equal(n, nr);
            for (int i = 0; i < n; i++)
                if (out[i] != ref[i])
                    fail_msg("%s prompt %d k=%d oracle: token %d differs (%d vs %d)", name,
                             plens[pi], k, i, out[i], ref[i]);
            assert_int_equal((int64_t)st.n_accepted_tokens, o.planned);
            /* every accepted length was seen */
            assert_true(st.n_drafts >= (uint64_t)k + 1);
            assert_true(st.accepted_per_pos[k - 1] > 0 || k * (k + 1) > GEN);
        }
    }
    fx_close(&f);
}

static void test_greedy_moe(void **state) {
    (void)state;
    check_greedy_equal("tiny-moe-mtp");
}

static void test_greedy_dense(void **state) {
    (void)state;
    check_greedy_equal("tiny-dense-mtp");
}

static void test_greedy_demo(void **state) {
    (void)state;
    check_greedy_equal("demo");
}

/* Greedy with penalties and min_tokens (the sampler decides from downloaded logits rows) and EOS
 * allowed: identical to plain decoding, including where it stops. */
static void test_greedy_general_path(void **state) {
    (void)state;
    fx f;
    fx_open(&f, model_dir("tiny-moe-mtp"));
    const int V = f.cfg.vocab;
    int32_t prompt[64], ref[GEN + 8], out[GEN + 8];
    for (int c = 0; c < 4; c++) {
        prompt_of(5 + 11 * c, V, 77 + (uint64_t)c, prompt);
        ds_sampling_params sp;
        greedy_params(&sp, GEN);
        sp.ignore_eos = false;
        sp.repetition_penalty = c % 2 ? 1.3f : 1.0f;
        sp.presence_penalty = c >= 2 ? 0.4f : 0.0f;
        sp.frequency_penalty = c == 3 ? 0.3f : 0.0f;
        sp.min_tokens = c == 0 ? 6 : 0;
        int stop_ids[1];
        if (c == 1) {
            /* a stop id that the greedy continuation reaches mid-way: generation must end there
             * even when the drafts after it are accepted */
            int nr0 = plain_generate(&f, prompt, 5 + 11 * c, &sp, ref);
            assert_true(nr0 > 20);
            stop_ids[0] = ref[20];
            sp.stop_token_ids = stop_ids;
            sp.n_stop_token_ids = 1;
        }
        int nr = plain_generate(&f, prompt, 5 + 11 * c, &sp, ref);
        if (c == 1) assert_true(nr <= 21);
        for (int k = 1; k <= MAX_K; k++) {
            int n = spec_generate(&f, prompt, 5 + 11 * c, &sp, k, NULL, out, NULL);
            assert_int_equal(n, nr);
            assert_memory_equal(out, ref, (size_t)n * sizeof(int32_t));
            oracle o = {.ref = ref, .n_ref = nr, .vocab = V};
            n = spec_generate(&f, prompt, 5 + 11 * c, &sp, k, &o, out, NULL);
            assert_int_equal(n, nr);
            assert_memory_equal(out, ref, (size_t)n * sizeof(int32_t));
        }
        printf("  general greedy path case %d: %d tokens identical for k=1..%d\n", c, nr, MAX_K);
    }
    fx_close(&f);
}

/* ---- chi-square ---------------------------------------------------------------------------- */

static void softmax_t(const float *logits, int V, double temp, double *p) {
    double m = -INFINITY, s = 0;
    for (int i = 0; i < V; i++) m = fmax(m, logits[i] / temp);
    for (int i = 0; i < V; i++) s += p[i] = exp(logits[i] / temp - m);
    for (int i = 0; i < V; i++) p[i] /= s;
}

/* Target logits rows of a plain forward over seq[0..n) (row i predicts token i+1). */
static void target_rows(fx *f, const int32_t *seq, int n, float *rows) {
    ds_session s;
    ds_error err = {0};
    assert_int_equal(ds_session_init(&s, &f->model, 1, 128, &err), DS_OK);
    for (int i = 0; i < n; i++)
        assert_int_equal(ds_session_feed(&s, 0, &seq[i], 1, false,
                                         rows + (size_t)i * f->cfg.vocab, &err),
                         DS_OK);
    ds_session_free(&s);
}

static int pick_moderate(const double *p, int V, double lo, double hi) {
    int best = -1;
    for (int i = 0; i < V; i++)
        if (p[i] > lo && p[i] < hi && (best < 0 || p[i] > p[best])) best = i;
    if (best < 0) /* take the most likely token */
        for (int i = 0; i < V; i++)
            if (best < 0 || p[i] > p[best]) best = i;
    return best;
}

static void test_rejection_sampling_unit(void **state) {
    (void)state;
    fx f;
    fx_open(&f, model_dir("tiny-moe-mtp"));
    const int V = f.cfg.vocab;
    const double temp = 0.9;
    int32_t seq[16];
    prompt_of(6, V, 4242, seq);
    /* row 0: the target after the prompt; the draft d1 has moderate probability; row 1: after
     * d1; d2 likewise */
    float *rows = malloc(sizeof(float) * 3 * (size_t)V);
    double *p0 = malloc(sizeof(double) * V), *p1 = malloc(sizeof(double) * V),
           *pw = malloc(sizeof(double) * V);
    float *tmp = malloc(sizeof(float) * (size_t)V * 3);
    float *tmp2 = malloc(sizeof(float) * (size_t)V * 7);
    target_rows(&f, seq, 6, tmp2);
    memcpy(rows, tmp2 + 5 * (size_t)V, sizeof(float) * V);
    softmax_t(rows, V, temp, p0);
    int32_t drafts[2];
    drafts[0] = pick_moderate(p0, V, 0.15, 0.6);
    seq[6] = drafts[0];
    target_rows(&f, seq, 7, tmp2);
    memcpy(rows + V, tmp2 + 6 * (size_t)V, sizeof(float) * V);
    softmax_t(rows + V, V, temp, p1);
    drafts[1] = pick_moderate(p1, V, 0.15, 0.6);
    memset(rows + 2 * (size_t)V, 0, sizeof(float) * V); /* row 2 (bonus) only needs to exist */
    printf("  drafts %d (p %.3f), %d (p %.3f)\n", drafts[0], p0[drafts[0]], drafts[1],
           p1[drafts[1]]);

    ds_sampling_params sp;
    ds_sampling_params_init(&sp);
    sp.temperature = (float)temp;
    sp.max_tokens = 100;
    sp.ignore_eos = true;
    sp.has_seed = true;
    sp.seed = 99;
    ds_sampler smp;
    ds_error err = {0};
    assert_int_equal(ds_sampler_init(&smp, &sp, V, f.cfg.eos_ids, f.cfg.n_eos, &err), DS_OK);
    const int N = 40000;
    int *c0 = calloc((size_t)V, sizeof(int)), *c1 = calloc((size_t)V, sizeof(int));
    int n_acc0 = 0;
    int32_t toks[3];
    ds_sample_result res[3];
    for (int i = 0; i < N; i++) {
        smp.seed = 99 + (uint64_t)i; /* the numbers are the seed's and the position's */
        memcpy(tmp, rows, sizeof(float) * 3 * (size_t)V);
        ds_spec_result r;
        assert_int_equal(ds_spec_verify(&smp, 1, drafts, 2, NULL, tmp, V, toks, res, &r, &err),
                         DS_OK);
        assert_true(r.n_emitted >= 1 && r.n_emitted <= 3 && r.n_accepted == r.n_emitted - 1);
        c0[toks[0]]++;
        if (toks[0] == drafts[0]) {
            n_acc0++;
            c1[toks[1]]++;
        }
    }
    int df;
    double z0 = test_chi2_z(c0, p0, V, N, &df);
    printf("  first token: %d draws, z %.2f (df %d); accepted %.4f vs p(d1) %.4f\n", N, z0, df,
           (double)n_acc0 / N, p0[drafts[0]]);
    assert_true(z0 < 4.0);
    double z1 = test_chi2_z(c1, p1, V, n_acc0, &df);
    printf("  second token | first accepted: %d draws, z %.2f (df %d)\n", n_acc0, z1, df);
    assert_true(z1 < 4.0);
    /* power: a different temperature is detected */
    softmax_t(rows, V, temp * 1.15, pw);
    double zw = test_chi2_z(c0, pw, V, N, &df);
    printf("  power check (T x 1.15): z %.2f\n", zw);
    assert_true(zw > 4.0);
    /* with the draft always rejected-by-construction (a token of probability ~0) the output is
     * still the target's distribution */
    int32_t bad[1];
    int worst = 0;
    for (int i = 1; i < V; i++)
        if (p0[i] < p0[worst]) worst = i;
    bad[0] = worst;
    memset(c0, 0, sizeof(int) * (size_t)V);
    for (int i = 0; i < N / 2; i++) {
        smp.seed = 7 * (uint64_t)N + (uint64_t)i;
        memcpy(tmp, rows, sizeof(float) * 2 * (size_t)V);
        ds_spec_result r;
        assert_int_equal(ds_spec_verify(&smp, 1, bad, 1, NULL, tmp, V, toks, res, &r, &err), DS_OK);
        c0[toks[0]]++;
    }
    z0 = test_chi2_z(c0, p0, V, N / 2, &df);
    printf("  unlikely draft: z %.2f\n", z0);
    assert_true(z0 < 4.0);
    /* the token at a position is the seed's and the position's alone: the same with the likely
     * draft, the unlikely one or none (so the device's chained steps, which draft fewer near
     * max_tokens, emit what the host's would); the old accept-else-residual rule fails this */
    int n_acc = 0;
    for (int i = 0; i < 2000; i++) {
        smp.seed = 5 * (uint64_t)N + (uint64_t)i;
        int32_t first[3];
        const int32_t *dr[3] = {drafts, bad, NULL};
        for (int c = 0; c < 3; c++) {
            memcpy(tmp, rows, sizeof(float) * 2 * (size_t)V);
            ds_spec_result r;
            assert_int_equal(ds_spec_verify(&smp, 1, dr[c], c == 2 ? 0 : 1, NULL, tmp, V, toks,
                                            res, &r, &err),
                             DS_OK);
            first[c] = toks[0];
            if (c == 0) n_acc += r.n_accepted;
        }
        if (first[0] != first[1] || first[0] != first[2])
            fail_msg("seed %d: token %d with the draft, %d with an unlikely one, %d with none",
                     (int)smp.seed, first[0], first[1], first[2]);
    }
    printf("  2000 seeds: the same first token with either draft or none (%d accepted)\n", n_acc);
    assert_true(n_acc > 0 && n_acc < 2000);

    ds_sampler_free(&smp);
    free(c0);
    free(c1);
    free(rows);
    free(tmp);
    free(tmp2);
    free(p0);
    free(p1);
    free(pw);
    fx_close(&f);
}

/* End to end: prompt → first token (sampled at prefill) → one speculative step with oracle drafts
 * [most likely token, ...]: the second token, given the first, follows the target. */
typedef struct fixed_drafts {
    int32_t d[MAX_K];
} fixed_drafts;

static void fixed_hook(void *ctx, int n_generated, int n_draft, int32_t *drafts) {
    fixed_drafts *fd = ctx;
    if (n_generated == 1)
        for (int i = 0; i < n_draft; i++) drafts[i] = fd->d[i];
}

static void test_rejection_sampling_end_to_end(void **state) {
    (void)state;
    fx f;
    fx_open(&f, model_dir("tiny-moe-mtp"));
    const int V = f.cfg.vocab, np = 5, k = 2;
    const double temp = 0.8;
    int32_t seq[16];
    prompt_of(np, V, 31337, seq);
    float *rows = malloc(sizeof(float) * (size_t)V * (np + 2));
    double *pa = malloc(sizeof(double) * V), *pb = malloc(sizeof(double) * V);
    target_rows(&f, seq, np, rows);
    softmax_t(rows + (size_t)(np - 1) * V, V, temp, pa);
    int first = pick_moderate(pa, V, 0.0, 1.0); /* the most likely first token */
    seq[np] = first;
    target_rows(&f, seq, np + 1, rows);
    softmax_t(rows + (size_t)np * V, V, temp, pb);
    fixed_drafts fd;
    fd.d[0] = pick_moderate(pb, V, 0.0, 1.0);
    fd.d[1] = 0;
    ds_session s;
    ds_error err = {0};
    assert_int_equal(ds_session_init_spec(&s, &f.model, 1, 64, k, &err), DS_OK);
    int *cnt = calloc((size_t)V, sizeof(int));
    int n_cond = 0, n_acc = 0;
    const int RUNS = 6000;
    for (int run = 0; run < RUNS; run++) {
        ds_sampling_params sp;
        ds_sampling_params_init(&sp);
        sp.temperature = (float)temp;
        sp.max_tokens = 8;
        sp.ignore_eos = true;
        sp.has_seed = true;
        sp.seed = 5000 + (uint64_t)run;
        ds_sampler smp;
        assert_int_equal(ds_sampler_init(&smp, &sp, V, f.cfg.eos_ids, f.cfg.n_eos, &err), DS_OK);
        ds_spec_gen g;
        assert_int_equal(ds_spec_gen_init(&g, &s, 0, k, &smp, &err), DS_OK);
        g.hook = fixed_hook;
        g.hook_ctx = &fd;
        int32_t toks[DS_SPEC_MAX_K + 1];
        ds_sample_result res[DS_SPEC_MAX_K + 1];
        int m;
        assert_int_equal(ds_spec_gen_prefill(&g, seq, np, toks, res, &m, &err), DS_OK);
        if (toks[0] == first) {
            assert_int_equal(ds_spec_gen_step(&g, toks, res, &m, &err), DS_OK);
            n_cond++;
            cnt[toks[0]]++;
            n_acc += toks[0] == fd.d[0];
        }
        ds_spec_gen_free(&g);
        ds_sampler_free(&smp);
    }
    int df;
    double z = test_chi2_z(cnt, pb, V, n_cond, &df);
    printf("  end to end: %d of %d runs began with token %d; second token z %.2f (df %d); "
           "draft accepted %.3f vs p %.3f\n",
           n_cond, RUNS, first, z, df, (double)n_acc / n_cond, pb[fd.d[0]]);
    assert_true(n_cond > 500);
    assert_true(z < 4.0);
    ds_session_free(&s);
    free(cnt);
    free(rows);
    free(pa);
    free(pb);
    fx_close(&f);
}

static void test_stats(void **state) {
    (void)state;
    ds_spec_stats s = {0};
    ds_spec_stats_add(&s, 3, 2);
    ds_spec_stats_add(&s, 3, 0);
    ds_spec_stats_add(&s, 2, 2);
    ds_spec_stats_add(&s, 0, 0); /* not a draft step */
    assert_int_equal(s.n_drafts, 3);
    assert_int_equal(s.n_draft_tokens, 8);
    assert_int_equal(s.n_accepted_tokens, 4);
    assert_true(fabs(ds_spec_acceptance_rate(&s) - 0.5) < 1e-12);
    assert_true(fabs(ds_spec_mean_accepted_len(&s) - (1.0 + 4.0 / 3.0)) < 1e-12);
    assert_true(fabs(ds_spec_pos_rate(&s, 0) - 2.0 / 3.0) < 1e-12);
    assert_true(fabs(ds_spec_pos_rate(&s, 2) - 0.0) < 1e-12);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_stats),
        cmocka_unit_test(test_greedy_moe),
        cmocka_unit_test(test_greedy_dense),
        cmocka_unit_test(test_greedy_demo),
        cmocka_unit_test(test_greedy_general_path),
        cmocka_unit_test(test_rejection_sampling_unit),
        cmocka_unit_test(test_rejection_sampling_end_to_end),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
