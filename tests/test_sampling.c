/* test_sampling.c — the sampler against independent references: argmax loops, softmax in
 * double, hand-computed penalty/top-p/min-p/top-k sets, sorted reference top-p on a 250k
 * vocabulary, and chi-square tests of seeded draws (fixed seeds: deterministic, cannot flake). */
#include "testlib.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "sampling/dist.h"
#include "sampling/sampler.h"

/* ---- helpers ------------------------------------------------------------------------------ */

static void init_ok(ds_sampler *s, const ds_sampling_params *p, int vocab, const int *eos,
                    int n_eos) {
    ds_error err = {0};
    ds_status st = ds_sampler_init(s, p, vocab, eos, n_eos, &err);
    if (st != DS_OK) fail_msg("ds_sampler_init: %s", err.msg);
}

static int sample_ok(ds_sampler *s, const float *logits, int vocab, int n_gen,
                     ds_sample_result *res) {
    float *work = malloc((size_t)vocab * sizeof *work);
    memcpy(work, logits, (size_t)vocab * sizeof *work);
    ds_error err = {0};
    ds_sample_result local;
    if (!res) res = &local;
    ds_status st = ds_sampler_sample(s, work, n_gen, res, &err);
    free(work);
    if (st != DS_OK) fail_msg("ds_sampler_sample: %s", err.msg);
    return res->token;
}

/* The final distribution (after every stage) for the given raw logits. */
static void probs_ok(ds_sampler *s, const float *logits, int vocab, int n_gen, float *probs) {
    memcpy(probs, logits, (size_t)vocab * sizeof *probs);
    ds_error err = {0};
    if (ds_sampler_probs(s, probs, n_gen, &err) != DS_OK) fail_msg("ds_sampler_probs: %s", err.msg);
}

static int ref_argmax(const float *x, int n) {
    int b = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[b]) b = i;
    return b;
}

static void ref_softmax(const float *logits, int n, double temp, double *p) {
    double m = -INFINITY, s = 0;
    for (int i = 0; i < n; i++) m = fmax(m, logits[i] / temp);
    for (int i = 0; i < n; i++) s += (p[i] = exp(logits[i] / temp - m));
    for (int i = 0; i < n; i++) p[i] /= s;
}

static void random_logits(float *x, int n, uint64_t seed, float scale) {
    test_rng r = {seed};
    for (int i = 0; i < n; i++) x[i] = test_rng_uniform(&r) * scale;
}

/* Pearson chi-square of observed counts against expected probabilities. */
static double chi_square(const int *count, const double *p, int n, int draws) {
    double chi = 0;
    for (int i = 0; i < n; i++) {
        double e = p[i] * draws;
        if (e == 0) {
            if (count[i]) return INFINITY;
            continue;
        }
        chi += (count[i] - e) * (count[i] - e) / e;
    }
    return chi;
}

/* ---- greedy ------------------------------------------------------------------------------- */

static void test_greedy_is_argmax(void **state) {
    (void)state;
    enum { V = 1000 };
    static float x[V];
    ds_sampling_params p;
    ds_sampling_params_init(&p);
    p.temperature = 0.0f;
    p.top_k = 5; /* ignored by greedy */
    p.top_p = 0.3f;
    ds_sampler s;
    init_ok(&s, &p, V, NULL, 0);
    for (int t = 0; t < 20; t++) {
        random_logits(x, V, 100 + (uint64_t)t, 10.0f);
        assert_int_equal(sample_ok(&s, x, V, 0, NULL), ref_argmax(x, V));
    }
    /* ties: the lowest index wins */
    random_logits(x, V, 7, 1.0f);
    x[700] = 5.0f;
    x[300] = 5.0f;
    x[900] = 5.0f;
    assert_int_equal(sample_ok(&s, x, V, 0, NULL), 300);
    /* temperature below 1e-5 is greedy too */
    ds_sampler_free(&s);
    p.temperature = 5e-6f;
    init_ok(&s, &p, V, NULL, 0);
    assert_true(s.greedy);
    assert_int_equal(sample_ok(&s, x, V, 0, NULL), 300);
    ds_sampler_free(&s);
}

/* ---- seeds -------------------------------------------------------------------------------- */

static void draw_seq(uint64_t seed, const float *x, int v, int n, int *out, ds_sampler *other) {
    ds_sampling_params p;
    ds_sampling_params_init(&p);
    p.has_seed = true;
    p.seed = seed;
    p.top_p = 0.95f;
    ds_sampler s;
    init_ok(&s, &p, v, NULL, 0);
    for (int i = 0; i < n; i++) {
        out[i] = sample_ok(&s, x, v, i, NULL);
        if (other) sample_ok(other, x, v, i, NULL); /* a batch neighbour drawing in between */
    }
    ds_sampler_free(&s);
}

static void test_seed_reproducible(void **state) {
    (void)state;
    enum { V = 64, N = 300 };
    float x[V];
    random_logits(x, V, 99, 2.0f);
    int a[N], b[N], c[N], d[N];
    draw_seq(42, x, V, N, a, NULL);
    draw_seq(42, x, V, N, b, NULL);
    draw_seq(43, x, V, N, c, NULL);
    assert_memory_equal(a, b, sizeof a);
    int differ = 0;
    for (int i = 0; i < N; i++) differ += a[i] != c[i];
    assert_true(differ > N / 4);

    /* Independent of other requests: interleave with an unseeded neighbour. */
    ds_sampling_params p;
    ds_sampling_params_init(&p);
    ds_sampler other;
    init_ok(&other, &p, V, NULL, 0);
    draw_seq(42, x, V, N, d, &other);
    ds_sampler_free(&other);
    assert_memory_equal(a, d, sizeof a);

    /* Without a seed each request draws its own from the OS. */
    ds_sampler s1, s2;
    init_ok(&s1, &p, V, NULL, 0);
    init_ok(&s2, &p, V, NULL, 0);
    assert_true(s1.seed != s2.seed);
    ds_sampler_free(&s1);
    ds_sampler_free(&s2);
}

/* ---- distributions (chi-square; df = 7, 99.99% quantile 29.9) ------------------------------- */

static const float k_small_logits[8] = {1.0f, 0.5f, 0.0f, -0.5f, 2.0f, -1.0f, 0.3f, 1.5f};
#define CHI_LIMIT 32.0

static double chi_for(float temperature, double ref_temperature, uint64_t seed) {
    enum { V = 8, N = 40000 };
    ds_sampling_params p;
    ds_sampling_params_init(&p);
    p.temperature = temperature;
    p.has_seed = true;
    p.seed = seed;
    ds_sampler s;
    init_ok(&s, &p, V, NULL, 0);
    int count[V] = {0};
    for (int i = 0; i < N; i++) count[sample_ok(&s, k_small_logits, V, 0, NULL)]++;
    ds_sampler_free(&s);
    double ref[V];
    ref_softmax(k_small_logits, V, ref_temperature, ref);
    return chi_square(count, ref, V, N);
}

static void test_distribution_matches_softmax(void **state) {
    (void)state;
    double chi = chi_for(1.0f, 1.0, 1234);
    print_message("chi2(T=1 vs softmax) = %.2f\n", chi);
    assert_true(chi < CHI_LIMIT);
    chi = chi_for(1.0f, 1.0, 98765);
    assert_true(chi < CHI_LIMIT);
}

static void test_temperature_scaling(void **state) {
    (void)state;
    double c05 = chi_for(0.5f, 0.5, 11), c2 = chi_for(2.0f, 2.0, 12);
    print_message("chi2(T=0.5) = %.2f, chi2(T=2) = %.2f\n", c05, c2);
    assert_true(c05 < CHI_LIMIT);
    assert_true(c2 < CHI_LIMIT);
    /* and the test has teeth: T=2 draws do not look like T=1 */
    assert_true(chi_for(2.0f, 1.0, 12) > 10 * CHI_LIMIT);
    assert_true(chi_for(0.5f, 1.0, 11) > 10 * CHI_LIMIT);
}

/* ---- top_k / top_p / min_p ---------------------------------------------------------------- */

static void test_topk1_and_tiny_topp_are_greedy(void **state) {
    (void)state;
    enum { V = 500 };
    float x[V];
    ds_sampling_params p;
    ds_sampling_params_init(&p);
    p.has_seed = true;
    p.seed = 5;
    p.top_k = 1;
    ds_sampler sk, sp;
    init_ok(&sk, &p, V, NULL, 0);
    p.top_k = 0;
    p.top_p = 1e-6f;
    init_ok(&sp, &p, V, NULL, 0);
    for (int t = 0; t < 50; t++) {
        random_logits(x, V, 1000 + (uint64_t)t, 3.0f);
        int am = ref_argmax(x, V);
        assert_int_equal(sample_ok(&sk, x, V, 0, NULL), am);
        assert_int_equal(sample_ok(&sp, x, V, 0, NULL), am);
    }
    ds_sampler_free(&sk);
    ds_sampler_free(&sp);
}

/* probabilities {0.15, 0.5, 0.05, 0.3} by token id */
static void set4(float *x) {
    x[0] = logf(0.15f);
    x[1] = logf(0.5f);
    x[2] = logf(0.05f);
    x[3] = logf(0.3f);
}

static void expect_probs(const float *got, const double *want, int n) {
    for (int i = 0; i < n; i++) {
        if (fabs(got[i] - want[i]) > 1e-5)
            fail_msg("prob[%d] = %.7f, expected %.7f", i, (double)got[i], want[i]);
    }
}

static void check_filter(float top_p, float min_p, int top_k, float temp, const float *x, int n,
                         const double *want) {
    ds_sampling_params p;
    ds_sampling_params_init(&p);
    p.top_p = top_p;
    p.min_p = min_p;
    p.top_k = top_k;
    p.temperature = temp;
    p.has_seed = true;
    ds_sampler s;
    init_ok(&s, &p, n, NULL, 0);
    float got[16];
    probs_ok(&s, x, n, 0, got);
    ds_sampler_free(&s);
    expect_probs(got, want, n);
}

static void test_top_p_sets(void **state) {
    (void)state;
    float x[4];
    set4(x);
    /* sorted: 1 (0.5), 3 (0.3), 0 (0.15), 2 (0.05) */
    check_filter(0.4f, 0, 0, 1, x, 4, (double[]){0, 1, 0, 0});
    check_filter(0.7f, 0, 0, 1, x, 4, (double[]){0, 0.5 / 0.8, 0, 0.3 / 0.8});
    check_filter(0.85f, 0, 0, 1, x, 4, (double[]){0.15 / 0.95, 0.5 / 0.95, 0, 0.3 / 0.95});
    check_filter(0.99f, 0, 0, 1, x, 4, (double[]){0.15, 0.5, 0.05, 0.3});
    /* equal logits: ties join in id order, exactly enough to reach p */
    float u[4] = {0, 0, 0, 0};
    check_filter(0.5f, 0, 0, 1, u, 4, (double[]){0.5, 0.5, 0, 0});
    check_filter(0.6f, 0, 0, 1, u, 4, (double[]){1 / 3.0, 1 / 3.0, 1 / 3.0, 0});
}

static void test_min_p_sets(void **state) {
    (void)state;
    float x[4];
    set4(x);
    /* threshold = min_p · 0.5 */
    check_filter(1, 0.2f, 0, 1, x, 4, (double[]){0.15 / 0.95, 0.5 / 0.95, 0, 0.3 / 0.95});
    check_filter(1, 0.5f, 0, 1, x, 4, (double[]){0, 0.5 / 0.8, 0, 0.3 / 0.8});
    check_filter(1, 0.7f, 0, 1, x, 4, (double[]){0, 1, 0, 0});
    /* min_p acts after temperature: at T = 2, p ∝ sqrt(p) = {.387, .707, .224, .548}, so the
     * 0.5 cut (0.354 relative to the max) keeps three tokens instead of two */
    double a = sqrt(0.15), b = sqrt(0.5), d = sqrt(0.3), z = a + b + d;
    check_filter(1, 0.5f, 0, 2, x, 4, (double[]){a / z, b / z, 0, d / z});
}

static void test_top_k_sets(void **state) {
    (void)state;
    float x[5] = {1, 2, 2, 0, 3};
    double e[5];
    for (int i = 0; i < 5; i++) e[i] = exp(x[i]);
    check_filter(1, 0, 1, 1, x, 5, (double[]){0, 0, 0, 0, 1});
    /* k = 2: the 2nd largest value is 2, and ties with it stay (vLLM masks logits < kth) */
    double z = e[1] + e[2] + e[4];
    check_filter(1, 0, 2, 1, x, 5, (double[]){0, e[1] / z, e[2] / z, 0, e[4] / z});
    check_filter(1, 0, 3, 1, x, 5, (double[]){0, e[1] / z, e[2] / z, 0, e[4] / z});
    z += e[0];
    check_filter(1, 0, 4, 1, x, 5, (double[]){e[0] / z, e[1] / z, e[2] / z, 0, e[4] / z});
    /* top_k then top_p over the renormalised survivors: {4: .576, 1: .212, 2: .212} (k = 3);
     * p = 0.7 needs token 4 plus one of the tied 2s (id 1 first) */
    z = e[1] + e[4];
    check_filter(0.7f, 0, 3, 1, x, 5, (double[]){0, e[1] / z, 0, 0, e[4] / z});
}

/* Reference pipeline in double with a full sort, for a big vocabulary. */
typedef struct { double v; int i; } ref_item;
static int ref_cmp(const void *a, const void *b) {
    const ref_item *x = a, *y = b;
    if (x->v != y->v) return x->v > y->v ? -1 : 1;
    return x->i - y->i;
}

static void ref_pipeline(const float *x, int n, double temp, int top_k, double top_p,
                         double min_p, double *out) {
    ref_item *it = malloc((size_t)n * sizeof *it);
    for (int i = 0; i < n; i++) it[i] = (ref_item){x[i], i};
    qsort(it, (size_t)n, sizeof *it, ref_cmp);
    int k = (top_k > 0 && top_k < n) ? top_k : n;
    while (k < n && it[k].v == it[k - 1].v) k++; /* ties with the k-th logit stay */
    double m = it[0].v, s = 0;
    for (int j = 0; j < n; j++) out[j] = 0;
    int keep = 0;
    for (int j = 0; j < k; j++) {
        double w = exp((it[j].v - m) / temp);
        if (w < min_p) break;
        keep = j + 1;
        s += w;
    }
    double cum = 0;
    int final = 0;
    for (int j = 0; j < keep; j++) {
        if (cum >= top_p * s) break;
        cum += exp((it[j].v - m) / temp);
        final = j + 1;
    }
    for (int j = 0; j < final; j++) out[it[j].i] = exp((it[j].v - m) / temp) / cum;
    free(it);
}

static void check_big(const float *x, int n, float temp, int top_k, float top_p, float min_p) {
    ds_sampling_params p;
    ds_sampling_params_init(&p);
    p.temperature = temp;
    p.top_k = top_k;
    p.top_p = top_p;
    p.min_p = min_p;
    ds_sampler s;
    init_ok(&s, &p, n, NULL, 0);
    float *got = malloc((size_t)n * sizeof *got);
    double *want = malloc((size_t)n * sizeof *want);
    probs_ok(&s, x, n, 0, got);
    ref_pipeline(x, n, temp, top_k, top_p, min_p, want);
    int kept_got = 0, kept_want = 0;
    for (int i = 0; i < n; i++) {
        kept_got += got[i] > 0;
        kept_want += want[i] > 0;
        if ((got[i] > 0) != (want[i] > 0) || fabs(got[i] - want[i]) > 1e-6)
            fail_msg("T=%g k=%d p=%g min_p=%g: token %d prob %.8g, reference %.8g", (double)temp,
                     top_k, (double)top_p, (double)min_p, i, (double)got[i], want[i]);
    }
    print_message("T=%g top_k=%d top_p=%g min_p=%g: %d tokens kept (reference %d)\n",
                  (double)temp, top_k, (double)top_p, (double)min_p, kept_got, kept_want);
    ds_sampler_free(&s);
    free(got);
    free(want);
}

static void test_big_vocab_matches_sorted_reference(void **state) {
    (void)state;
    enum { V = 250000 };
    float *x = malloc(V * sizeof *x);
    random_logits(x, V, 2024, 8.0f);
    check_big(x, V, 1.0f, 50, 0.9f, 0.0f);
    check_big(x, V, 0.7f, 0, 0.9f, 0.0f);
    check_big(x, V, 1.5f, 0, 0.95f, 0.0f);
    check_big(x, V, 1.0f, 1000, 1.0f, 0.0f);
    check_big(x, V, 1.0f, 0, 1.0f, 0.05f);
    check_big(x, V, 0.8f, 400, 0.8f, 0.01f);
    check_big(x, V, 1.0f, 5000, 0.9f, 0.0f); /* beyond the heap: radix top_k */
    /* heavy ties: logits on a 0.5 grid, so the k-th value is shared by ~3900 tokens (the
     * compact list overflows and the full path takes over) */
    for (int i = 0; i < V; i++) x[i] = roundf(x[i] * 2.0f) / 2.0f;
    check_big(x, V, 1.0f, 50, 1.0f, 0.0f);
    check_big(x, V, 1.0f, 50, 0.3f, 0.0f);
    check_big(x, V, 1.0f, 0, 0.5f, 0.0f);
    check_big(x, V, 2.0f, 3000, 0.9f, 0.02f);

    /* timing, reported only */
    random_logits(x, V, 2024, 8.0f);
    ds_sampling_params p;
    ds_sampling_params_init(&p);
    p.top_k = 50;
    p.top_p = 0.9f;
    ds_sampler s;
    init_ok(&s, &p, V, NULL, 0);
    float *w = malloc(V * sizeof *w);
    const char *names[3] = {"top_k=50 top_p=0.9", "top_p=0.95", "greedy"};
    for (int c = 0; c < 3; c++) {
        s.params.top_k = c == 0 ? 50 : 0;
        s.params.top_p = c == 0 ? 0.9f : 0.95f;
        s.greedy = c == 2;
        struct timespec t0, t1;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        for (int r = 0; r < 20; r++) {
            memcpy(w, x, V * sizeof *w);
            ds_sample_result res;
            ds_error err = {0};
            assert_int_equal(ds_sampler_sample(&s, w, 0, &res, &err), DS_OK);
        }
        clock_gettime(CLOCK_MONOTONIC, &t1);
        double ms = ((double)(t1.tv_sec - t0.tv_sec) * 1e3 + (double)(t1.tv_nsec - t0.tv_nsec) / 1e6) / 20;
        print_message("V=250000 %s: %.3f ms per sample (incl. 1 MB copy)\n", names[c], ms);
    }
    ds_sampler_free(&s);
    free(w);
    free(x);
}

/* Draws through every path (full array, compact top-k list, radix top-p, min_p) against the
 * sorted double reference, on a vocabulary that spans several 16-wide blocks plus a tail. */
static void test_draws_match_filtered_distribution(void **state) {
    (void)state;
    enum { V = 45, N = 60000 };
    float x[V];
    random_logits(x, V, 777, 2.0f);
    const struct { float t; int k; float p; float mp; } cases[] = {
        {1.0f, 0, 1.0f, 0.0f}, {1.0f, 10, 1.0f, 0.0f}, {0.8f, 0, 0.7f, 0.0f},
        {1.3f, 12, 0.8f, 0.0f}, {0.9f, 0, 1.0f, 0.3f}, {1.0f, 40, 0.9f, 0.05f},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        ds_sampling_params p;
        ds_sampling_params_init(&p);
        p.temperature = cases[c].t;
        p.top_k = cases[c].k;
        p.top_p = cases[c].p;
        p.min_p = cases[c].mp;
        p.has_seed = true;
        p.seed = 1000 + c;
        ds_sampler s;
        init_ok(&s, &p, V, NULL, 0);
        int count[V] = {0};
        for (int i = 0; i < N; i++) count[sample_ok(&s, x, V, 0, NULL)]++;
        ds_sampler_free(&s);
        double ref[V];
        ref_pipeline(x, V, cases[c].t, cases[c].k, cases[c].p, cases[c].mp, ref);
        int kept = 0;
        for (int i = 0; i < V; i++) kept += ref[i] > 0;
        const int df = kept - 1;
        double chi = chi_square(count, ref, V, N);
        double limit = df + 6.0 * sqrt(2.0 * df) + 10.0; /* far beyond the 99.99% quantile */
        print_message("case %zu: %d tokens kept, chi2 = %.1f (df %d, limit %.0f)\n", c, kept, chi,
                      df, limit);
        assert_true(chi < limit); /* also infinite if a token outside the set was drawn */
    }
}

/* The inverse-CDF edges: u = 0 gives the first surviving token, u → 1 the last, on both
 * representations. */
static void test_draw_edges(void **state) {
    (void)state;
    enum { V = 100 };
    float x[V], w[V];
    random_logits(x, V, 5, 1.0f);
    float mx = x[0];
    for (int i = 1; i < V; i++) mx = fmaxf(mx, x[i]);
    for (int k = 0; k <= 5; k += 5) {
        memcpy(w, x, sizeof w);
        ds_dist d;
        ds_dist_params dp = {.temperature = 1.0f, .top_k = k, .top_p = 1.0f, .min_p = 0.0f};
        ds_dist_build(&d, w, V, &dp, mx, V);
        assert_int_equal(d.compact, k > 0);
        int lo = V, hi = -1;
        for (int i = 0; i < V; i++) {
            bool in = k == 0;
            if (k) {
                int better = 0;
                for (int j = 0; j < V; j++) better += x[j] > x[i];
                in = better < k;
            }
            if (in) {
                lo = i < lo ? i : lo;
                hi = i;
            }
        }
        if (k) { /* compact order is by id when top_p is off */
            assert_int_equal(ds_dist_draw(&d, w, V, 0.0), lo);
            assert_int_equal(ds_dist_draw(&d, w, V, nextafter(1.0, 0.0)), hi);
        } else {
            assert_int_equal(ds_dist_draw(&d, w, V, 0.0), 0);
            assert_int_equal(ds_dist_draw(&d, w, V, nextafter(1.0, 0.0)), V - 1);
        }
    }
}

static void test_fast_expf_accuracy(void **state) {
    (void)state;
    double worst = 0;
    for (int i = 0; i <= 200000; i++) {
        float v = -87.0f + 87.0f * (float)i / 200000.0f;
        double ref = exp((double)v);
        double rel = fabs((double)ds_fast_expf(v) - ref) / ref;
        worst = fmax(worst, rel);
    }
    print_message("fast_expf: max relative error %.3g on [-87, 0]\n", worst);
    assert_true(worst < 4e-7);
    assert_true(ds_fast_expf(0.0f) == 1.0f);
    assert_true(ds_fast_expf(-INFINITY) == 0.0f);
    assert_true(ds_fast_expf(-100.0f) == 0.0f);
}

/* ---- penalties ---------------------------------------------------------------------------- */

static void penalised(float rep, float freq, float pres, float *out) {
    const float base[6] = {2.0f, -1.0f, 0.5f, 3.0f, -2.0f, 0.0f};
    ds_sampling_params p;
    ds_sampling_params_init(&p);
    p.repetition_penalty = rep;
    p.frequency_penalty = freq;
    p.presence_penalty = pres;
    ds_sampler s;
    init_ok(&s, &p, 6, NULL, 0);
    ds_error err = {0};
    const int32_t prompt[3] = {0, 1, 0};
    assert_int_equal(ds_sampler_add_prompt(&s, prompt, 3, &err), DS_OK);
    const int out_tokens[4] = {3, 3, 4, 0};
    for (int i = 0; i < 4; i++) assert_int_equal(ds_sampler_accept(&s, out_tokens[i], &err), DS_OK);
    memcpy(out, base, sizeof base);
    ds_sampler_apply_penalties(&s, out);
    ds_sampler_free(&s);
}

static void test_penalties_by_hand(void **state) {
    (void)state;
    float got[6];
    /* prompt {0, 1}; output counts {3: 2, 4: 1, 0: 1}; token 2 and 5 unseen */
    penalised(2.0f, 0, 0, got);
    expect_probs(got, (double[]){1.0, -2.0, 0.5, 1.5, -4.0, 0.0}, 6);
    penalised(1.0f, 0.5f, 0, got);
    expect_probs(got, (double[]){1.5, -1.0, 0.5, 2.0, -2.5, 0.0}, 6);
    penalised(1.0f, 0, 0.25f, got);
    expect_probs(got, (double[]){1.75, -1.0, 0.5, 2.75, -2.25, 0.0}, 6);
    penalised(1.0f, -1.0f, -0.5f, got); /* negative penalties encourage repeats */
    expect_probs(got, (double[]){3.5, -1.0, 0.5, 5.5, -0.5, 0.0}, 6);
    /* all three: repetition first (once, even for token 0 seen in prompt and output) */
    penalised(2.0f, 0.5f, 0.25f, got);
    expect_probs(got, (double[]){1.0 - 0.75, -2.0, 0.5, 1.5 - 1.25, -4.0 - 0.75, 0.0}, 6);
    /* repetition_penalty < 1 boosts */
    penalised(0.5f, 0, 0, got);
    expect_probs(got, (double[]){4.0, -0.5, 0.5, 6.0, -1.0, 0.0}, 6);
}

static void test_penalties_change_greedy_choice(void **state) {
    (void)state;
    float x[4] = {1.0f, 0.2f, 0.9f, 0.1f};
    ds_sampling_params p;
    ds_sampling_params_init(&p);
    p.temperature = 0;
    p.presence_penalty = 0.5f;
    ds_sampler s;
    init_ok(&s, &p, 4, NULL, 0);
    ds_error err = {0};
    assert_int_equal(sample_ok(&s, x, 4, 0, NULL), 0);
    assert_int_equal(ds_sampler_accept(&s, 0, &err), DS_OK);
    assert_int_equal(sample_ok(&s, x, 4, 1, NULL), 2); /* 1.0 - 0.5 < 0.9 */
    assert_int_equal(ds_sampler_accept(&s, 2, &err), DS_OK);
    assert_int_equal(sample_ok(&s, x, 4, 2, NULL), 0); /* 0.5 vs 0.4 */
    ds_sampler_free(&s);
    /* prompt tokens do not count for presence/frequency (vLLM: output only) */
    init_ok(&s, &p, 4, NULL, 0);
    const int32_t prompt[2] = {0, 0};
    assert_int_equal(ds_sampler_add_prompt(&s, prompt, 2, &err), DS_OK);
    assert_int_equal(sample_ok(&s, x, 4, 0, NULL), 0);
    ds_sampler_free(&s);
}

/* ---- min_tokens, max_tokens, finish reasons -------------------------------------------------- */

static void test_min_tokens_bans_eos_and_stop_ids(void **state) {
    (void)state;
    enum { V = 10 };
    float x[V] = {0, 1, 2, 0, 0, 0, 0, 8, 0, 9}; /* EOS 9 best, stop id 7 next, then 2 */
    const int eos = 9, stop_ids[1] = {7};
    ds_sampling_params p;
    ds_sampling_params_init(&p);
    p.temperature = 0;
    p.min_tokens = 3;
    p.max_tokens = 10;
    p.stop_token_ids = stop_ids;
    p.n_stop_token_ids = 1;
    ds_sampler s;
    init_ok(&s, &p, V, &eos, 1);
    for (int n = 0; n < 3; n++) assert_int_equal(sample_ok(&s, x, V, n, NULL), 2);
    assert_int_equal(sample_ok(&s, x, V, 3, NULL), 9);
    ds_sampler_free(&s);

    /* the same ban in the sampled distribution */
    p.temperature = 1;
    init_ok(&s, &p, V, &eos, 1);
    float pr[V];
    probs_ok(&s, x, V, 2, pr);
    assert_true(pr[9] == 0 && pr[7] == 0 && fabsf(pr[2] - 0.4587f) < 1e-3f);
    probs_ok(&s, x, V, 3, pr);
    assert_true(fabsf(pr[9] - 0.7299f) < 1e-3f && fabsf(pr[7] - 0.2685f) < 1e-3f);

    int stop_tok;
    /* before min_tokens nothing stops; after, EOS and stop ids do */
    assert_int_equal(ds_sampler_finish_reason(&s, 9, 2, &stop_tok), DS_FINISH_NONE);
    assert_int_equal(ds_sampler_finish_reason(&s, 7, 2, &stop_tok), DS_FINISH_NONE);
    assert_int_equal(ds_sampler_finish_reason(&s, 9, 4, &stop_tok), DS_FINISH_STOP);
    assert_int_equal(stop_tok, -1);
    assert_int_equal(ds_sampler_finish_reason(&s, 7, 4, &stop_tok), DS_FINISH_STOP);
    assert_int_equal(stop_tok, 7);
    assert_int_equal(ds_sampler_finish_reason(&s, 2, 4, &stop_tok), DS_FINISH_NONE);
    ds_sampler_free(&s);

    /* ignore_eos: EOS neither stops nor is banned after min_tokens; stop ids still stop */
    p.ignore_eos = true;
    p.temperature = 0;
    init_ok(&s, &p, V, &eos, 1);
    assert_int_equal(ds_sampler_finish_reason(&s, 9, 5, &stop_tok), DS_FINISH_NONE);
    assert_int_equal(ds_sampler_finish_reason(&s, 7, 5, &stop_tok), DS_FINISH_STOP);
    assert_int_equal(sample_ok(&s, x, V, 5, NULL), 9);
    assert_int_equal(sample_ok(&s, x, V, 0, NULL), 2); /* still banned during min_tokens */
    ds_sampler_free(&s);
}

static void test_max_tokens_length(void **state) {
    (void)state;
    const int eos[2] = {5, 6};
    ds_sampling_params p;
    ds_sampling_params_init(&p);
    p.max_tokens = 4;
    ds_sampler s;
    init_ok(&s, &p, 8, eos, 2);
    int st;
    assert_int_equal(ds_sampler_finish_reason(&s, 1, 3, &st), DS_FINISH_NONE);
    assert_int_equal(ds_sampler_finish_reason(&s, 1, 4, &st), DS_FINISH_LENGTH);
    assert_int_equal(ds_sampler_finish_reason(&s, 6, 2, &st), DS_FINISH_STOP); /* 2nd EOS id */
    assert_int_equal(ds_sampler_finish_reason(&s, 5, 4, &st), DS_FINISH_STOP);
    assert_string_equal(ds_finish_reason_name(DS_FINISH_LENGTH), "length");
    assert_string_equal(ds_finish_reason_name(DS_FINISH_STOP), "stop");
    assert_null(ds_finish_reason_name(DS_FINISH_NONE));
    ds_sampler_free(&s);
}

/* ---- logprobs ----------------------------------------------------------------------------- */

static void check_logprobs(float temperature, int n_top) {
    enum { V = 100 };
    float x[V];
    random_logits(x, V, 31337, 4.0f);
    double m = -INFINITY, sum = 0, ref[V];
    for (int i = 0; i < V; i++) m = fmax(m, x[i]);
    for (int i = 0; i < V; i++) sum += exp((double)x[i] - m);
    for (int i = 0; i < V; i++) ref[i] = (double)x[i] - m - log(sum);
    ref_item order[V];
    for (int i = 0; i < V; i++) order[i] = (ref_item){ref[i], i};
    qsort(order, V, sizeof order[0], ref_cmp);

    ds_sampling_params p;
    ds_sampling_params_init(&p);
    p.temperature = temperature;
    p.logprobs = n_top;
    p.repetition_penalty = 3.0f; /* the raw logprobs must ignore it */
    p.has_seed = true;
    p.seed = 8;
    ds_sampler s;
    init_ok(&s, &p, V, NULL, 0);
    ds_error err = {0};
    const int32_t prompt[3] = {order[0].i, order[1].i, order[2].i};
    assert_int_equal(ds_sampler_add_prompt(&s, prompt, 3, &err), DS_OK);
    for (int t = 0; t < 30; t++) {
        ds_sample_result res;
        int tok = sample_ok(&s, x, V, t, &res);
        if (fabs(res.logprob - ref[tok]) > 1e-5)
            fail_msg("logprob of %d: %g, reference %g", tok, (double)res.logprob, ref[tok]);
        int rank = 1;
        for (int i = 0; i < V; i++) rank += ref[i] > ref[tok];
        assert_int_equal(res.rank, rank);
        assert_int_equal(res.n_top, n_top);
        for (int j = 0; j < n_top; j++) {
            assert_int_equal(res.top_ids[j], order[j].i);
            assert_true(fabs(res.top_logprobs[j] - order[j].v) < 1e-5);
            if (j) assert_true(res.top_logprobs[j] <= res.top_logprobs[j - 1]);
        }
        if (temperature == 0) assert_true(rank > 1); /* the penalty moved the argmax */
    }
    ds_sampler_free(&s);
}

static void test_logprobs_are_raw_log_softmax(void **state) {
    (void)state;
    check_logprobs(1.0f, 5);
    check_logprobs(0.0f, 20);
    check_logprobs(0.7f, 0);
}

/* ---- robustness --------------------------------------------------------------------------- */

static void test_nan_and_all_masked(void **state) {
    (void)state;
    float x[4] = {NAN, 1.0f, NAN, 0.5f};
    ds_sampling_params p;
    ds_sampling_params_init(&p);
    p.has_seed = true;
    ds_sampler s;
    init_ok(&s, &p, 4, NULL, 0);
    for (int i = 0; i < 100; i++) {
        int t = sample_ok(&s, x, 4, 0, NULL);
        assert_true(t == 1 || t == 3);
    }
    float y[4] = {-INFINITY, NAN, -INFINITY, -INFINITY};
    ds_sample_result res;
    ds_error err = {0};
    assert_int_equal(ds_sampler_sample(&s, y, 0, &res, &err), DS_ERR_INTERNAL);
    assert_non_null(strstr(err.msg, "finite"));
    ds_sampler_free(&s);
}

/* ---- validation --------------------------------------------------------------------------- */

static void expect_bad(const ds_sampling_params *p, const char *field) {
    ds_error err = {0};
    ds_status st = ds_sampling_params_validate(p, 1000, &err);
    if (st != DS_ERR_INVALID_ARG) fail_msg("%s: expected DS_ERR_INVALID_ARG, got %d", field, st);
    if (!strstr(err.msg, field)) fail_msg("%s: message does not name it: %s", field, err.msg);
    /* the sampler refuses it too */
    ds_sampler s;
    ds_error err2 = {0};
    assert_int_equal(ds_sampler_init(&s, p, 1000, NULL, 0, &err2), DS_ERR_INVALID_ARG);
    ds_sampler_free(&s);
}

static void test_validation(void **state) {
    (void)state;
    ds_sampling_params p;
#define BAD(field_expr, name)                                                                    \
    do {                                                                                         \
        ds_sampling_params_init(&p);                                                             \
        field_expr;                                                                              \
        expect_bad(&p, name);                                                                    \
    } while (0)
    ds_sampling_params_init(&p);
    ds_error err = {0};
    assert_int_equal(ds_sampling_params_validate(&p, 1000, &err), DS_OK);

    BAD(p.temperature = -0.1f, "temperature");
    BAD(p.temperature = NAN, "temperature");
    BAD(p.temperature = INFINITY, "temperature");
    BAD(p.top_p = 0.0f, "top_p");
    BAD(p.top_p = 1.01f, "top_p");
    BAD(p.top_p = NAN, "top_p");
    BAD(p.min_p = -0.01f, "min_p");
    BAD(p.min_p = 1.5f, "min_p");
    BAD(p.presence_penalty = 2.5f, "presence_penalty");
    BAD(p.frequency_penalty = -2.01f, "frequency_penalty");
    BAD(p.repetition_penalty = 0.0f, "repetition_penalty");
    BAD(p.repetition_penalty = -1.0f, "repetition_penalty");
    {
        static const ds_logit_bias out_of_vocab[1] = {{1000, 1.0f}}, negative[1] = {{-1, 1.0f}},
                                   too_big[1] = {{3, 100.5f}}, nan_bias[1] = {{3, NAN}},
                                   twice[2] = {{3, 1.0f}, {3, 2.0f}};
        BAD((p.logit_bias = out_of_vocab, p.n_logit_bias = 1), "logit_bias");
        BAD((p.logit_bias = negative, p.n_logit_bias = 1), "logit_bias");
        BAD((p.logit_bias = too_big, p.n_logit_bias = 1), "logit_bias");
        BAD((p.logit_bias = nan_bias, p.n_logit_bias = 1), "logit_bias");
        BAD((p.logit_bias = twice, p.n_logit_bias = 2), "logit_bias");
        BAD((p.logit_bias = NULL, p.n_logit_bias = 1), "logit_bias");
        BAD(p.n_logit_bias = -1, "logit_bias");
    }
    BAD(p.max_tokens = 0, "max_tokens");
    BAD(p.max_tokens = -5, "max_tokens");
    BAD(p.min_tokens = -1, "min_tokens");
    BAD((p.min_tokens = 20, p.max_tokens = 10), "min_tokens");
    BAD(p.logprobs = DS_SAMPLING_MAX_LOGPROBS + 1, "logprobs");
    BAD(p.logprobs = -2, "logprobs");

    const char *many[DS_SAMPLING_MAX_STOP + 1];
    for (int i = 0; i <= DS_SAMPLING_MAX_STOP; i++) many[i] = "x";
    BAD((p.stop = many, p.n_stop = DS_SAMPLING_MAX_STOP + 1), "stop");
    const char *empty[2] = {"ok", ""};
    BAD((p.stop = empty, p.n_stop = 2), "stop[1]");
    const char *bad_utf8[1] = {"ab\xff"};
    BAD((p.stop = bad_utf8, p.n_stop = 1), "stop[0]");
    char longs[DS_SAMPLING_MAX_STOP_LEN + 2];
    memset(longs, 'a', sizeof longs - 1);
    longs[sizeof longs - 1] = 0;
    const char *too_long[1] = {longs};
    BAD((p.stop = too_long, p.n_stop = 1), "stop[0]");

    const int ids_bad[2] = {5, 1000};
    BAD((p.stop_token_ids = ids_bad, p.n_stop_token_ids = 2), "stop_token_ids[1]");
    const int ids_neg[1] = {-3};
    BAD((p.stop_token_ids = ids_neg, p.n_stop_token_ids = 1), "stop_token_ids[0]");
    static int ids_many[DS_SAMPLING_MAX_STOP_IDS + 1];
    BAD((p.stop_token_ids = ids_many, p.n_stop_token_ids = DS_SAMPLING_MAX_STOP_IDS + 1),
        "stop_token_ids");
#undef BAD

    /* edge values that are fine */
    ds_sampling_params_init(&p);
    p.temperature = 0;
    p.top_p = 1;
    p.min_p = 1;
    p.top_k = -1;
    p.presence_penalty = -2;
    p.frequency_penalty = 2;
    p.min_tokens = p.max_tokens;
    p.logprobs = DS_SAMPLING_MAX_LOGPROBS;
    const char *stops[2] = {"</s>", "停"};
    p.stop = stops;
    p.n_stop = 2;
    assert_int_equal(ds_sampling_params_validate(&p, 1000, &err), DS_OK);

    /* sampler-level checks: prompt ids and eos ids come from outside too */
    ds_sampler s;
    ds_sampling_params_init(&p);
    p.repetition_penalty = 1.2f;
    init_ok(&s, &p, 100, NULL, 0);
    const int32_t prompt[3] = {1, 100, 2};
    err = (ds_error){0};
    assert_int_equal(ds_sampler_add_prompt(&s, prompt, 3, &err), DS_ERR_INVALID_ARG);
    assert_non_null(strstr(err.msg, "position 1"));
    ds_sampler_free(&s);
    const int eos_bad = 100;
    err = (ds_error){0};
    assert_int_equal(ds_sampler_init(&s, &p, 100, &eos_bad, 1, &err), DS_ERR_INVALID_ARG);
    ds_sampler_free(&s);
}

/* ---- logit_bias ---------------------------------------------------------------------------- */

/* Added to the logits before the penalties (vLLM order: a repetition penalty then divides the
 * biased logit), so it can force or ban a greedy choice; the reported logprobs stay raw. */
static void test_logit_bias(void **state) {
    (void)state;
    const ds_logit_bias bias[2] = {{2, 3.0f}, {0, -100.0f}};
    ds_sampling_params p;
    ds_sampling_params_init(&p);
    p.temperature = 0;
    p.logit_bias = bias;
    p.n_logit_bias = 2;
    p.repetition_penalty = 2.0f;
    p.logprobs = 1;
    ds_sampler s;
    init_ok(&s, &p, 4, NULL, 0);
    ds_error err = {0};
    const int32_t prompt[1] = {2};
    assert_int_equal(ds_sampler_add_prompt(&s, prompt, 1, &err), DS_OK);
    float x[4] = {1.0f, 0.2f, 0.9f, 0.1f};
    ds_sampler_apply_logit_bias(&s, x);
    ds_sampler_apply_penalties(&s, x);
    expect_probs(x, (double[]){1.0 - 100.0, 0.2, (0.9 + 3.0) / 2.0, 0.1}, 4);
    float y[4] = {1.0f, 0.2f, 0.9f, 0.1f};
    ds_sample_result res;
    assert_int_equal(ds_sampler_sample(&s, y, 0, &res, &err), DS_OK);
    assert_int_equal(res.token, 2); /* 1.95 beats 0.2; token 0 banned */
    assert_int_equal(res.top_ids[0], 0); /* the raw distribution's top token */
    ds_sampler_free(&s);
    /* sampled: a −100 bias leaves no measurable mass */
    p.temperature = 1.0f;
    p.repetition_penalty = 1.0f;
    p.logprobs = -1;
    p.has_seed = true;
    p.seed = 7;
    init_ok(&s, &p, 4, NULL, 0);
    for (int i = 0; i < 200; i++) {
        float z[4] = {1.0f, 0.2f, 0.9f, 0.1f};
        assert_int_not_equal(sample_ok(&s, z, 4, 0, NULL), 0);
    }
    ds_sampler_free(&s);
}

static void test_params_clone_is_deep(void **state) {
    (void)state;
    int ids[2] = {3, 4};
    char s0[] = "stop";
    const char *stops[1] = {s0};
    ds_sampling_params p, c;
    ds_sampling_params_init(&p);
    p.stop_token_ids = ids;
    p.n_stop_token_ids = 2;
    p.stop = stops;
    p.n_stop = 1;
    ds_error err = {0};
    assert_int_equal(ds_sampling_params_clone(&c, &p, &err), DS_OK);
    ids[0] = 9;
    s0[0] = 'X';
    assert_int_equal(c.stop_token_ids[0], 3);
    assert_string_equal(c.stop[0], "stop");
    ds_sampling_params_free(&c);
    ds_logit_bias bias[1] = {{5, 1.5f}};
    p.logit_bias = bias;
    p.n_logit_bias = 1;
    assert_int_equal(ds_sampling_params_clone(&c, &p, &err), DS_OK);
    bias[0].id = 6;
    assert_int_equal(c.logit_bias[0].id, 5);
    assert_int_equal(c.n_logit_bias, 1);
    ds_sampling_params_free(&c);
    ds_sampling_params_free(&p); /* not owned: no-op */
    assert_int_equal(ids[1], 4);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_greedy_is_argmax),
        cmocka_unit_test(test_seed_reproducible),
        cmocka_unit_test(test_distribution_matches_softmax),
        cmocka_unit_test(test_temperature_scaling),
        cmocka_unit_test(test_topk1_and_tiny_topp_are_greedy),
        cmocka_unit_test(test_top_p_sets),
        cmocka_unit_test(test_min_p_sets),
        cmocka_unit_test(test_top_k_sets),
        cmocka_unit_test(test_big_vocab_matches_sorted_reference),
        cmocka_unit_test(test_draws_match_filtered_distribution),
        cmocka_unit_test(test_draw_edges),
        cmocka_unit_test(test_fast_expf_accuracy),
        cmocka_unit_test(test_penalties_by_hand),
        cmocka_unit_test(test_penalties_change_greedy_choice),
        cmocka_unit_test(test_min_tokens_bans_eos_and_stop_ids),
        cmocka_unit_test(test_max_tokens_length),
        cmocka_unit_test(test_logprobs_are_raw_log_softmax),
        cmocka_unit_test(test_nan_and_all_masked),
        cmocka_unit_test(test_validation),
        cmocka_unit_test(test_logit_bias),
        cmocka_unit_test(test_params_clone_is_deep),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
