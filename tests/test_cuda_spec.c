/* test_cuda_spec.c — MTP speculative decoding (runtime/spec.h) on the CUDA backend.
 *
 *  1. MTP head logits against the CPU backend (fp32) on the same inputs, teacher-forced over a
 *     sequence (target forward over n tokens, then the MTP over rows 0..n-2 with token t+1):
 *     a. head alone: both backends get the SAME hidden rows h_t (the CPU target's final-normed
 *        rows rounded to bf16, so the CUDA copy holds exactly the CPU's values) and the same
 *        bf16 weights. What differs is the bf16 rounding of the activations between the head's
 *        ops (fc, norms, attention, FFN, the final norm: about ten roundings of relative size
 *        2^-9 each, partly amplified by the norms and softmax). Bound: relative L2 ≤ 2e-2 per
 *        logits row (the budget test_cuda_ops gives an op with several bf16 roundings inside,
 *        TOL_FUSED, and issue 3 the whole 8-layer model), for all rows but one or 10 % of them
 *        (a MoE row whose expert choice is a near-tie may route differently under bf16 and is
 *        then far off); the block's relative L2 is printed too;
 *     b. end to end: each backend's MTP reads its own target's hidden rows (bound: the larger
 *        of 4e-2 and twice the target hidden error, for the block or its rows). The error is the
 *        target's (≤ 2e-2, test_cuda_model's criterion) carried through the head's input norm
 *        (gain ~1) plus the head's own (≤ 2e-2): bound 4e-2, same row rule.
 *  2. Greedy speculative generation (k = 1..4) against plain greedy decoding on CUDA, 3 prompts
 *     × 48 tokens, for tiny-moe-mtp, tiny-dense-mtp (random MTP heads: nearly every draft is
 *     rejected, so every step rolls the GDN state back to a snapshot) and models/qwen35-demo
 *     (trained head). A verification runs k+1 tokens through multi-token kernels whose bf16
 *     rounding differs from one-token decode, so on the random fixtures a near-tie can
 *     legitimately flip: tokens must be identical up to the first position where the plain
 *     run's top-2 logit margin is below 0.05; past a divergence the speculative tokens are
 *     checked against plain decoding teacher-forced along the speculative output (wherever that
 *     run's margin is decisive, ≥ 90 % must agree: a broken rollback corrupts every later
 *     token, a bf16 near-tie flips an isolated one). On the demo model the tokens must be
 *     identical (set DS_SPEC_DEMO_TIES_OK=1 to judge it like the fixtures); its head must also
 *     predict (k=1 mean accepted length ≥ 1.25; the CPU backend reaches 1.65).
 *  3. GDN rollback: covered by 2, which requires rejected drafts on the tiny fixtures.
 * Every case prints its numbers before any verdict, so one GPU run tells the whole story.
 * Without a CUDA device (CI, CPU-only builds) the test prints a note and passes;
 * DS_CUDA_SPEC_ON_CPU=1 runs it with a second CPU backend in CUDA's place (everything must then
 * match exactly), which checks the test's own plumbing without a GPU. */
#include <cjson/cJSON.h>
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

#define GEN 48             /* tokens generated per prompt */
#define MAX_K 4            /* draft tokens per step: 1..MAX_K */
#define MAX_TOKENS 32      /* rows per step: longer prompts are fed in chunks (MTP over each) */
#define MARGIN_MIN 0.05f   /* a plain-run top-2 logit margin below this is a near-tie */
#define HEAD_TOL 2e-2      /* 1a: the MTP head alone, identical inputs */
#define E2E_TOL 4e-2       /* 1b: target + MTP head */
#define TF_AGREE_MIN 0.90  /* 2: past a divergence, decisive teacher-forced agreement */
#define DEMO_MIN_LEN_K1 1.25

static ds_backend *g_cuda, *g_cpu;

typedef struct fx {
    ds_config cfg;
    ds_model_weights host;
    ds_model model;
} fx;

static const char *model_dir(const char *name) {
    static char dir[1024];
    if (!strcmp(name, "demo"))
        snprintf(dir, sizeof dir, "%s/../../models/qwen35-demo", test_data_dir());
    else
        snprintf(dir, sizeof dir, "%s/models/%s", test_data_dir(), name);
    return dir;
}

static void fx_open(fx *f, ds_backend *be, const char *name, int max_tokens, int max_out) {
    ds_error err = {0};
    const char *dir = model_dir(name);
    if (ds_model_load(dir, &f->cfg, &f->host, &err) != DS_OK) fail_msg("load %s: %s", dir, err.msg);
    if (ds_model_init(&f->model, be, &f->cfg, &f->host, max_tokens, max_out, &err) != DS_OK)
        fail_msg("%s: model init on %s: %s", name, be->ops->name, err.msg);
    if (!ds_model_has_mtp(&f->model)) fail_msg("%s has no MTP head", dir);
}

static void fx_close(fx *f) {
    ds_model_free(&f->model);
    ds_model_weights_free(&f->host);
}

/* n random token ids clear of the eos ids at the top of the vocabulary */
static void prompt_of(int n, int vocab, uint64_t seed, int32_t *out) {
    test_rng g = {seed};
    for (int i = 0; i < n; i++) {
        float u = (test_rng_uniform(&g) + 1.0f) * 0.5f;
        int v = (int)(u * (float)(vocab - 8));
        out[i] = v < vocab - 8 ? v : vocab - 9;
    }
}

/* lowest index of the maximum (NaN never wins); *margin = best − second best */
static int argmax_margin(const float *v, int n, float *margin) {
    int best = 0;
    for (int i = 1; i < n; i++)
        if (v[i] > v[best] || (isnan(v[best]) && !isnan(v[i]))) best = i;
    float second = -INFINITY;
    for (int i = 0; i < n; i++)
        if (i != best && v[i] > second) second = v[i];
    if (margin) *margin = v[best] - second;
    return best;
}

static cJSON *demo_reference(void) {
    char path[1200];
    snprintf(path, sizeof path, "%s/reference_greedy.json", model_dir("demo"));
    return test_load_json(path);
}

/* ---- activations in backend memory ------------------------------------------------------------ */


/* ---- 1. the MTP head against the CPU backend --------------------------------------------------- */

/* Target forward over tokens[0..n) (one step, n ≤ max_tokens) into slot 0 of s, then the MTP
 * over rows 0..n-2 (token t+1 as input). hidden_in [n-1, H] host values: the MTP's h_t rows
 * (NULL: the target's own final-normed rows). Receives mtp_logits [n-1, V] and, when non-NULL,
 * target_hidden [n-1, H] (the target's final-normed rows, as the backend holds them). */
static void mtp_teacher_forced(fx *f, ds_session *s, const int32_t *tokens, int n,
                               const float *hidden_in, float *mtp_logits, float *target_hidden) {
    ds_model *m = &f->model;
    ds_backend *be = m->be;
    const int H = f->cfg.hidden, V = f->cfg.vocab, Tm = n - 1;
    DS_ASSERT(n >= 2 && n <= m->max_tokens && Tm <= m->max_out);
    ds_error err = {0};
    ds_session_reset(s, 0);
    int32_t pos[64], next[64], rows[64];
    DS_ASSERT(n <= 64);
    for (int i = 0; i < n; i++) pos[i] = i;
    int32_t seq_start[2] = {0, n}, slot = s->gdn_cur[0], past = 0;
    ds_batch b = {.n_tokens = n, .n_seqs = 1, .tokens = tokens, .positions = pos,
                  .seq_start = seq_start, .seq_slot = &slot, .seq_n_past = &past,
                  .block_table = s->block_table, .max_blocks = s->blocks_per_seq};
    if (ds_model_forward(m, s->cache, &b, &err) != DS_OK) fail_msg("forward: %s", err.msg);
    if (target_hidden)
        test_backend_to_host(be, m->s.normed.data, m->s.normed.dtype, (size_t)Tm * (size_t)H, target_hidden);
    for (int i = 0; i < Tm; i++) {
        next[i] = tokens[i + 1];
        rows[i] = i;
    }
    ds_batch mb = b;
    mb.n_tokens = Tm;
    seq_start[1] = Tm;
    mb.tokens = next;
    mb.n_out = Tm;
    mb.out_rows = rows;
    void *hbuf = NULL;
    ds_tensor hid = m->s.normed;
    if (hidden_in) {
        hbuf = test_backend_from_host(be, hidden_in, (size_t)Tm * (size_t)H);
        hid = ds_view2d(hbuf, be->ops->act_dtype, Tm, H);
    }
    if (ds_mtp_forward(m, s->cache, &mb, &hid, true, &err) != DS_OK) fail_msg("mtp: %s", err.msg);
    test_backend_to_host(be, m->s.logits.data, DS_DTYPE_F32, (size_t)Tm * (size_t)V, mtp_logits);
    if (hbuf) be->ops->free(be, hbuf);
}

/* rows whose reference argmax is decisive and agrees / is decisive */
static void argmax_agreement(const float *got, const float *ref, int rows, int V, int *agree,
                             int *decisive) {
    *agree = *decisive = 0;
    for (int r = 0; r < rows; r++) {
        float mg;
        const int want = argmax_margin(ref + (size_t)r * V, V, &mg);
        if (mg < MARGIN_MIN) continue;
        (*decisive)++;
        *agree += argmax_margin(got + (size_t)r * V, V, NULL) == want;
    }
}

/* Per-row relative L2 of got against ref ([rows, V]): the median, the worst, and how many rows
 * exceed tol. A MoE head can route a row whose top-k boundary is a near-tie to another expert
 * under bf16 rounding; such a row differs by far more than rounding, so the verdict allows one
 * row or 10 % of the rows over tol (a wrong kernel puts most rows out); the block rel L2 is
 * printed alongside. */
static bool rows_within(const float *got, const float *ref, int rows, int V, double tol,
                        double *median, double *worst, int *over) {
    double *e = malloc(sizeof(double) * (size_t)rows);
    *over = 0;
    *worst = 0;
    for (int r = 0; r < rows; r++) {
        e[r] = test_rel_l2(got + (size_t)r * V, ref + (size_t)r * V, (size_t)V);
        if (!(e[r] <= tol)) (*over)++;
        if (!(e[r] <= *worst)) *worst = e[r]; /* NaN propagates */
    }
    for (int i = 1; i < rows; i++) /* insertion sort: a few dozen rows */
        for (int j = i; j > 0 && e[j - 1] > e[j]; j--) {
            const double t = e[j];
            e[j] = e[j - 1];
            e[j - 1] = t;
        }
    *median = e[rows / 2];
    free(e);
    return (*over <= 1 || *over * 10 <= rows) && !isnan(*worst);
}

/* Returns the number of comparisons above their bound (all are printed first). */
static int check_mtp_head(const char *name, const int32_t *tokens, int n, const char *what) {
    fx fc, fg;
    fx_open(&fc, g_cpu, name, 64, 64);
    fx_open(&fg, g_cuda, name, 64, 64);
    ds_session sc, sg;
    ds_error err = {0};
    if (ds_session_init(&sc, &fc.model, 1, 128, &err) != DS_OK ||
        ds_session_init(&sg, &fg.model, 1, 128, &err) != DS_OK)
        fail_msg("session: %s", err.msg);
    const int H = fc.cfg.hidden, V = fc.cfg.vocab, Tm = n - 1;
    const size_t nl = (size_t)Tm * (size_t)V, nh = (size_t)Tm * (size_t)H;
    float *h_cpu = malloc(nh * sizeof(float)), *h_cuda = malloc(nh * sizeof(float)),
          *h_bf = malloc(nh * sizeof(float));
    float *ref_own = malloc(nl * sizeof(float)), *ref_bf = malloc(nl * sizeof(float));
    float *got_e2e = malloc(nl * sizeof(float)), *got_head = malloc(nl * sizeof(float));
    /* CPU: own hidden rows (fp32), then the same rows rounded to bf16 */
    mtp_teacher_forced(&fc, &sc, tokens, n, NULL, ref_own, h_cpu);
    for (size_t i = 0; i < nh; i++) h_bf[i] = ds_bf16_to_f32(ds_f32_to_bf16(h_cpu[i]));
    mtp_teacher_forced(&fc, &sc, tokens, n, h_bf, ref_bf, NULL);
    /* CUDA: own hidden rows (end to end), then the CPU's bf16 rows (head alone) */
    mtp_teacher_forced(&fg, &sg, tokens, n, NULL, got_e2e, h_cuda);
    mtp_teacher_forced(&fg, &sg, tokens, n, h_bf, got_head, NULL);
    const double e_hid = test_rel_l2(h_cuda, h_cpu, nh);
    const double e_head = test_rel_l2(got_head, ref_bf, nl);
    const double e_e2e = test_rel_l2(got_e2e, ref_own, nl);
    int ag_h, dec_h, ag_e, dec_e;
    argmax_agreement(got_head, ref_bf, Tm, V, &ag_h, &dec_h);
    argmax_agreement(got_e2e, ref_own, Tm, V, &ag_e, &dec_e);
    double med_h, worst_h, med_e, worst_e;
    int over_h, over_e;
    const bool ok_h = rows_within(got_head, ref_bf, Tm, V, HEAD_TOL, &med_h, &worst_h, &over_h);
    /* end to end carries the target's own error: on the tiny random fixtures that is ~10 %
     * (bf16 storage alone gives as much there, tests/test_cuda_model.c), so the head's output
     * may be off by up to twice the target hidden error; the demo's target is within 2e-2 and
     * keeps the 4e-2 bound */
    const double e2e_tol = fmax(E2E_TOL, 2.0 * e_hid);
    const bool ok_e = rows_within(got_e2e, ref_own, Tm, V, e2e_tol, &med_e, &worst_e, &over_e) ||
                      e_e2e <= e2e_tol;
    printf("  %-14s %-10s %2d rows: target hidden rel L2 %.2e\n"
           "      MTP head alone: rel L2 %.2e, rows median %.2e worst %.2e, %d over %.0e%s; "
           "argmax %d/%d decisive\n"
           "      end to end:     rel L2 %.2e, rows median %.2e worst %.2e, %d over %.1e%s; "
           "argmax %d/%d decisive\n",
           name, what, Tm, e_hid, e_head, med_h, worst_h, over_h, HEAD_TOL, ok_h ? "" : "  FAIL",
           ag_h, dec_h, e_e2e, med_e, worst_e, over_e, e2e_tol, ok_e ? "" : "  FAIL", ag_e, dec_e);
    const int bad = !ok_h + !ok_e;
    free(h_cpu);
    free(h_cuda);
    free(h_bf);
    free(ref_own);
    free(ref_bf);
    free(got_e2e);
    free(got_head);
    ds_session_free(&sc);
    ds_session_free(&sg);
    fx_close(&fc);
    fx_close(&fg);
    return bad;
}

static void test_mtp_head_vs_cpu(void **state) {
    (void)state;
    int bad = 0;
    int32_t toks[64];
    const char *tiny[2] = {"tiny-moe-mtp", "tiny-dense-mtp"};
    for (int i = 0; i < 2; i++) {
        ds_config cfg;
        ds_error err = {0};
        if (ds_config_load(model_dir(tiny[i]), &cfg, &err) != DS_OK) fail_msg("%s", err.msg);
        prompt_of(40, cfg.vocab, 501, toks);
        bad += check_mtp_head(tiny[i], toks, 40, "random40");
        prompt_of(9, cfg.vocab, 502, toks);
        bad += check_mtp_head(tiny[i], toks, 9, "random9");
    }
    /* the demo model on real text: the teacher-forced sequence of its reference file */
    cJSON *ref = demo_reference();
    int n;
    int32_t *ids = test_json_ids(cJSON_GetObjectItem(cJSON_GetObjectItem(ref, "mtp_teacher_forced"),
                                                "tokens"), &n);
    if (n > 64) n = 64;
    assert_true(n >= 8);
    bad += check_mtp_head("demo", ids, n, "reference");
    free(ids);
    cJSON_Delete(ref);
    if (bad) fail_msg("%d MTP logit comparisons with too many rows above their bound", bad);
}

/* ---- 2. greedy speculative generation = plain greedy ------------------------------------------- */

/* Plain greedy decoding, one token a step. force NULL: free running (out receives the argmax);
 * else teacher-forced: force[i] is fed after step i. am [GEN] the argmax per step, margin [GEN]
 * its top-2 logit margin. */
static void plain_run(fx *f, const int32_t *prompt, int n_prompt, const int32_t *force,
                      int32_t *am, float *margin) {
    ds_session s;
    ds_error err = {0};
    const int V = f->cfg.vocab;
    if (ds_session_init(&s, &f->model, 1, n_prompt + GEN + 1, &err) != DS_OK)
        fail_msg("session: %s", err.msg);
    float *logits = malloc(sizeof(float) * (size_t)V);
    if (ds_session_feed(&s, 0, prompt, n_prompt, false, logits, &err) != DS_OK)
        fail_msg("prefill: %s", err.msg);
    for (int i = 0; i < GEN; i++) {
        am[i] = argmax_margin(logits, V, &margin[i]);
        const int32_t tok = force ? force[i] : am[i];
        if (i + 1 < GEN && ds_session_feed(&s, 0, &tok, 1, false, logits, &err) != DS_OK)
            fail_msg("decode: %s", err.msg);
    }
    free(logits);
    ds_session_free(&s);
}

/* Greedy speculative generation of GEN tokens with k drafts a step. */
static void spec_run(fx *f, const int32_t *prompt, int n_prompt, int k, int32_t *out,
                     ds_spec_stats *stats) {
    ds_session s;
    ds_error err = {0};
    const int V = f->cfg.vocab;
    if (ds_session_init_spec(&s, &f->model, 1, n_prompt + GEN + 1, k, &err) != DS_OK)
        fail_msg("spec session: %s", err.msg);
    ds_sampling_params sp;
    ds_sampling_params_init(&sp);
    sp.temperature = 0.0f;
    sp.max_tokens = GEN;
    sp.ignore_eos = true;
    ds_sampler smp;
    if (ds_sampler_init(&smp, &sp, V, f->cfg.eos_ids, f->cfg.n_eos, &err) != DS_OK ||
        ds_sampler_add_prompt(&smp, prompt, n_prompt, &err) != DS_OK)
        fail_msg("sampler: %s", err.msg);
    ds_spec_gen g;
    if (ds_spec_gen_init(&g, &s, 0, k, &smp, &err) != DS_OK) fail_msg("spec init: %s", err.msg);
    int32_t toks[DS_SPEC_MAX_K + 1];
    ds_sample_result res[DS_SPEC_MAX_K + 1];
    int n = 0, m = 0;
    if (ds_spec_gen_prefill(&g, prompt, n_prompt, toks, res, &m, &err) != DS_OK)
        fail_msg("spec prefill: %s", err.msg);
    for (;;) {
        for (int i = 0; i < m; i++) {
            assert_true(n < GEN);
            out[n++] = toks[i];
        }
        if (g.finished) break;
        if (ds_spec_gen_step(&g, toks, res, &m, &err) != DS_OK) fail_msg("spec step: %s", err.msg);
        assert_true(m >= 1 && m <= k + 1);
    }
    assert_int_equal(n, GEN);
    *stats = g.stats;
    ds_spec_gen_free(&g);
    ds_sampler_free(&smp);
    ds_session_free(&s);
}

typedef struct prompt_set {
    const char *label[3];
    int32_t *tok[3];
    int len[3];
} prompt_set;

/* Returns the number of failed verdicts; prints one line per prompt and k, and the totals. */
static int check_spec_model(const char *name, const prompt_set *ps, bool strict) {
    fx f;
    fx_open(&f, g_cuda, name, MAX_TOKENS, MAX_K + 1);
    int32_t ref[GEN], out[GEN], tf_am[GEN];
    float ref_mg[GEN], tf_mg[GEN];
    int bad = 0;
    ds_spec_stats per_k[MAX_K + 1];
    memset(per_k, 0, sizeof per_k);
    int ties_total = 0, diverged_total = 0;
    for (int p = 0; p < 3; p++) {
        plain_run(&f, ps->tok[p], ps->len[p], NULL, ref, ref_mg);
        int first_tie = GEN, n_ties = 0;
        for (int i = 0; i < GEN; i++)
            if (ref_mg[i] < MARGIN_MIN) {
                n_ties++;
                if (first_tie == GEN) first_tie = i;
            }
        ties_total += n_ties;
        for (int k = 1; k <= MAX_K; k++) {
            ds_spec_stats st;
            spec_run(&f, ps->tok[p], ps->len[p], k, out, &st);
            ds_spec_stats_merge(&per_k[k], &st);
            int fd = 0;
            while (fd < GEN && out[fd] == ref[fd]) fd++;
            char tail[160] = "";
            bool ok = strict ? fd == GEN : fd >= first_tie;
            if (fd < GEN) {
                diverged_total++;
                /* past the divergence: plain decoding fed the speculative tokens */
                plain_run(&f, ps->tok[p], ps->len[p], out, tf_am, tf_mg);
                int dec = 0, agree = 0;
                for (int i = 0; i < GEN; i++)
                    if (tf_mg[i] >= MARGIN_MIN) {
                        dec++;
                        agree += tf_am[i] == out[i];
                    }
                const bool tf_ok = agree >= TF_AGREE_MIN * dec;
                ok = ok && tf_ok;
                snprintf(tail, sizeof tail,
                         "; diverged at %d (plain margin %.3f, spec %d vs plain %d); teacher-forced "
                         "along spec: %d/%d decisive agree%s",
                         fd, ref_mg[fd], out[fd], ref[fd], agree, dec, tf_ok ? "" : " (< 90%!)");
            }
            printf("  %-14s %-10s k=%d: %2d/%d identical (near-ties %d, first at %d); acceptance "
                   "%.2f, mean accepted length %.2f, %llu/%llu drafts accepted%s%s\n",
                   name, ps->label[p], k, fd, GEN, n_ties, first_tie,
                   ds_spec_acceptance_rate(&st), ds_spec_mean_accepted_len(&st),
                   (unsigned long long)st.n_accepted_tokens,
                   (unsigned long long)st.n_draft_tokens, tail, ok ? "" : "  FAIL");
            bad += !ok;
        }
    }
    printf("  %-14s totals: %d near-tie positions (margin < %.2f) in %d plain tokens; %d of %d "
           "speculative runs diverged\n",
           name, ties_total, MARGIN_MIN, 3 * GEN, diverged_total, 3 * MAX_K);
    for (int k = 1; k <= MAX_K; k++) {
        const ds_spec_stats *st = &per_k[k];
        printf("  %-14s k=%d: acceptance rate %.3f, mean accepted length %.3f (%llu steps), per "
               "position:", name, k, ds_spec_acceptance_rate(st), ds_spec_mean_accepted_len(st),
               (unsigned long long)st->n_drafts);
        for (int i = 0; i < k; i++) printf(" %.2f", ds_spec_pos_rate(st, i));
        printf("\n");
        if (!strict && st->n_accepted_tokens >= st->n_draft_tokens) {
            /* the random heads must get drafts rejected, or no rollback was exercised */
            printf("  %-14s k=%d: no draft rejected: GDN rollback not exercised  FAIL\n", name, k);
            bad++;
        }
    }
    if (!strcmp(name, "demo") && !(ds_spec_mean_accepted_len(&per_k[1]) >= DEMO_MIN_LEN_K1)) {
        printf("  demo k=1 mean accepted length %.3f < %.2f: the trained head does not predict on "
               "CUDA  FAIL\n", ds_spec_mean_accepted_len(&per_k[1]), DEMO_MIN_LEN_K1);
        bad++;
    }
    fx_close(&f);
    return bad;
}

static void check_tiny(const char *name) {
    ds_config cfg;
    ds_error err = {0};
    if (ds_config_load(model_dir(name), &cfg, &err) != DS_OK) fail_msg("%s", err.msg);
    /* 9 tokens: one prefill step; 40 and 70: chunked (MAX_TOKENS 32) with the MTP over each */
    static const int lens[3] = {9, 40, 70};
    static int32_t buf[3][70];
    prompt_set ps = {.label = {"random9", "random40", "random70"}};
    for (int p = 0; p < 3; p++) {
        prompt_of(lens[p], cfg.vocab, 1000 + (uint64_t)p, buf[p]);
        ps.tok[p] = buf[p];
        ps.len[p] = lens[p];
    }
    const int bad = check_spec_model(name, &ps, false);
    if (bad) fail_msg("%s: %d speculative runs / checks failed", name, bad);
}

static void test_spec_greedy_moe(void **state) {
    (void)state;
    check_tiny("tiny-moe-mtp");
}

static void test_spec_greedy_dense(void **state) {
    (void)state;
    check_tiny("tiny-dense-mtp");
}

static void test_spec_greedy_demo(void **state) {
    (void)state;
    cJSON *ref = demo_reference();
    static const char *const want[3] = {"genesis", "psalm", "heldout100"};
    prompt_set ps;
    memset(&ps, 0, sizeof ps);
    const cJSON *g;
    int found = 0;
    cJSON_ArrayForEach(g, cJSON_GetObjectItem(ref, "greedy")) {
        const char *nm = cJSON_GetStringValue(cJSON_GetObjectItem(g, "name"));
        for (int p = 0; p < 3; p++)
            if (nm && !strcmp(nm, want[p])) {
                ps.label[p] = want[p];
                ps.tok[p] = test_json_ids(cJSON_GetObjectItem(g, "prompt"), &ps.len[p]);
                found++;
            }
    }
    if (found != 3) fail_msg("demo reference_greedy.json lacks the genesis/psalm/heldout100 prompts");
    const char *lenient = getenv("DS_SPEC_DEMO_TIES_OK");
    const int bad = check_spec_model("demo", &ps, !(lenient && !strcmp(lenient, "1")));
    for (int p = 0; p < 3; p++) free(ps.tok[p]);
    cJSON_Delete(ref);
    if (bad) fail_msg("demo: %d speculative runs / checks failed", bad);
}

int main(void) {
    setvbuf(stdout, NULL, _IOLBF, 0);
    ds_error err = {0};
    /* DS_CUDA_SPEC_ON_CPU=1: a second CPU backend stands in for CUDA, to check this test's own
     * plumbing on a machine without a GPU (everything must then match exactly) */
    const char *on_cpu = getenv("DS_CUDA_SPEC_ON_CPU");
    if (on_cpu && !strcmp(on_cpu, "1")) {
        if (ds_backend_cpu_create(2, &g_cuda, &err) != DS_OK) {
            printf("test_cuda_spec: CPU backend: %s\n", err.msg);
            return 1;
        }
        printf("test_cuda_spec: DS_CUDA_SPEC_ON_CPU=1: the CPU backend stands in for CUDA\n");
    } else if (ds_backend_cuda_create(0, &g_cuda, &err) != DS_OK) {
        return test_cuda_unavailable("test_cuda_spec", err.msg);
    }
    if (ds_backend_cpu_create(2, &g_cpu, &err) != DS_OK) {
        printf("test_cuda_spec: CPU backend: %s\n", err.msg);
        g_cuda->ops->destroy(g_cuda);
        return 1;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_mtp_head_vs_cpu),
        cmocka_unit_test(test_spec_greedy_moe),
        cmocka_unit_test(test_spec_greedy_dense),
        cmocka_unit_test(test_spec_greedy_demo),
    };
    const int rc = cmocka_run_group_tests(tests, NULL, NULL);
    g_cpu->ops->destroy(g_cpu);
    g_cuda->ops->destroy(g_cuda);
    return rc;
}
