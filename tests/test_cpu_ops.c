/* test_cpu_ops.c — CPU backend: thread pool, memory, linear/logits (every weight dtype, parts,
 * batch invariance), embed, RMSNorm, add+RMSNorm, SiLU·mul, gather_rows, argmax; each against an
 * independent double-precision reference. Also prints linear() weight-streaming GB/s. */
#include <stdatomic.h>
#include <time.h>

#include "test_cpu_common.h"

#include "core/threadpool.h"

/* ---- thread pool ----------------------------------------------------------------------------- */

typedef struct pool_ctx {
    ds_threadpool *pool;
    _Atomic int64_t sum;
    _Atomic int hits[1000];
    _Atomic int nested_sum;
} pool_ctx;

static void nested_fn(void *ctx, int64_t b, int64_t e, int tid) {
    (void)tid;
    pool_ctx *c = ctx;
    for (int64_t i = b; i < e; i++) atomic_fetch_add(&c->nested_sum, 1);
}

static void pool_fn(void *ctx, int64_t b, int64_t e, int tid) {
    pool_ctx *c = ctx;
    assert_true(tid >= 0 && tid < ds_threadpool_size(c->pool));
    for (int64_t i = b; i < e; i++) {
        atomic_fetch_add(&c->sum, i);
        atomic_fetch_add(&c->hits[i], 1);
    }
    /* nested parallel-for runs inline */
    ds_threadpool_for(c->pool, 3, 1, nested_fn, c);
}

static void test_threadpool(void **state) {
    (void)state;
    for (int nt = 1; nt <= 4; nt++) {
        ds_threadpool *pool = ds_threadpool_create(nt);
        assert_non_null(pool);
        assert_int_equal(ds_threadpool_size(pool), nt);
        for (int64_t n = 1; n <= 1000; n = n * 3 + 1) {
            for (int64_t chunk = 1; chunk <= 64; chunk *= 8) {
                pool_ctx c = {.pool = pool};
                for (int rep = 0; rep < 3; rep++) {
                    atomic_store(&c.sum, 0);
                    ds_threadpool_for(pool, n, chunk, pool_fn, &c);
                    assert_int_equal(atomic_load(&c.sum), n * (n - 1) / 2);
                }
                for (int64_t i = 0; i < n; i++) assert_int_equal(atomic_load(&c.hits[i]), 3);
            }
        }
        ds_threadpool_destroy(pool);
    }
    ds_threadpool *pool = ds_threadpool_create(0);
    assert_non_null(pool);
    assert_true(ds_threadpool_size(pool) >= 1);
    ds_threadpool_destroy(pool);
}

static void test_memory(void **state) {
    (void)state;
    ds_backend *be = tc_backend(2);
    assert_string_equal(be->ops->name, "cpu");
    assert_int_equal(be->ops->act_dtype, DS_DTYPE_F32);
    size_t sizes[] = {1, 100, 4096, (size_t)8 << 20};
    for (size_t i = 0; i < sizeof sizes / sizeof *sizes; i++) {
        unsigned char *p = be->ops->alloc(be, sizes[i]);
        assert_non_null(p);
        assert_int_equal((uintptr_t)p % 64, 0);
        for (size_t k = 0; k < sizes[i]; k += 997) assert_int_equal(p[k], 0);
        unsigned char *h = malloc(sizes[i]), *back = malloc(sizes[i]);
        for (size_t k = 0; k < sizes[i]; k++) h[k] = (unsigned char)(k * 7 + 3);
        be->ops->upload(be, p, h, sizes[i]);
        be->ops->download(be, back, p, sizes[i]);
        assert_memory_equal(h, back, sizes[i]);
        free(h);
        free(back);
        be->ops->free(be, p);
    }
    ds_error err = {0};
    assert_int_equal(be->ops->synchronize(be, &err), DS_OK);
    be->ops->destroy(be);
}

/* ---- linear ---------------------------------------------------------------------------------- */

/* ref[r, o] = Σ_k x[r, k]·W[o, k] in double, W = parts stacked. */
static void ref_linear(const float *x, int R, int K, const float *const *wex, const int *rows,
                       int n_parts, double *ref) {
    int n_out = 0;
    for (int p = 0; p < n_parts; p++) n_out += rows[p];
    for (int r = 0; r < R; r++) {
        int col = 0;
        for (int p = 0; p < n_parts; p++) {
            for (int o = 0; o < rows[p]; o++) {
                double acc = 0;
                for (int k = 0; k < K; k++) acc += (double)x[r * K + k] * (double)wex[p][o * K + k];
                ref[r * n_out + col + o] = acc;
            }
            col += rows[p];
        }
    }
}

static void check_linear(ds_backend *be, ds_dtype dt, int R, int K, const int *rows, int n_parts,
                         double *worst) {
    test_rng rng = {.s = 0x1234567ull + (uint64_t)(K * 131 + R * 7 + (int)dt)};
    ds_linear lin = {.n_parts = n_parts, .n_in = K};
    float *wex[DS_LINEAR_MAX_PARTS];
    for (int p = 0; p < n_parts; p++) {
        lin.parts[p] = tc_rand_weight(&rng, dt, rows[p], K, 0.5f, &wex[p]);
        lin.n_out += rows[p];
    }
    float *x = tc_rand_act(be, &rng, (size_t)R * K, 1.0f);
    float *y = tc_zero_act(be, (size_t)R * lin.n_out);
    ds_tensor tx = tc_tensor2(x, DS_DTYPE_F32, R, K),
              ty = tc_tensor2(y, DS_DTYPE_F32, R, lin.n_out);
    be->ops->linear(be, &tx, &lin, &ty);
    double *ref = malloc(sizeof(double) * (size_t)R * (size_t)lin.n_out);
    ref_linear(x, R, K, (const float *const *)wex, rows, n_parts, ref);
    double rel = tc_rel_l2_d(y, ref, (size_t)R * lin.n_out);
    if (rel > *worst) *worst = rel;
    assert_true(rel <= TC_TOL);

    /* batch invariance: each row alone gives bit-identical output */
    float *y1 = tc_zero_act(be, (size_t)lin.n_out);
    for (int r = 0; r < R; r++) {
        ds_tensor t1 = tc_tensor2(x + (size_t)r * K, DS_DTYPE_F32, 1, K);
        ds_tensor o1 = tc_tensor2(y1, DS_DTYPE_F32, 1, lin.n_out);
        be->ops->linear(be, &t1, &lin, &o1);
        assert_memory_equal(y1, y + (size_t)r * lin.n_out, (size_t)lin.n_out * sizeof(float));
    }
    /* logits is the same product into F32 */
    memset(y, 0, sizeof(float) * (size_t)R * lin.n_out);
    be->ops->logits(be, &tx, &lin, &ty);
    assert_true(tc_rel_l2_d(y, ref, (size_t)R * lin.n_out) <= TC_TOL);

    be->ops->free(be, y1);
    be->ops->free(be, x);
    be->ops->free(be, y);
    free(ref);
    for (int p = 0; p < n_parts; p++) {
        free(lin.parts[p].data);
        free(wex[p]);
    }
}

static void test_linear(void **state) {
    (void)state;
    ds_backend *be = tc_backend(2);
    ds_dtype dts[] = {DS_DTYPE_F32, DS_DTYPE_BF16, DS_DTYPE_F16};
    int Ks[] = {8, 37, 64, 261};
    int Rs[] = {1, 2, 3, 7};
    int rows3[] = {5, 19, 33};
    int rows1[] = {70};
    double worst[3] = {0};
    for (int d = 0; d < 3; d++)
        for (int ki = 0; ki < 4; ki++)
            for (int ri = 0; ri < 4; ri++) {
                check_linear(be, dts[d], Rs[ri], Ks[ki], rows3, 3, &worst[d]);
                check_linear(be, dts[d], Rs[ri], Ks[ki], rows1, 1, &worst[d]);
            }
    printf("linear rel L2 max: f32 %.2e  bf16 %.2e  f16 %.2e\n", worst[0], worst[1], worst[2]);
    /* a wide, prefill-sized case through the threaded path */
    double w = 0;
    int big[] = {1024, 512};
    check_linear(be, DS_DTYPE_BF16, 33, 512, big, 2, &w);
    printf("linear rel L2 (33x512 · 1536x512 bf16): %.2e\n", w);
    be->ops->destroy(be);
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Not a pass/fail test: prints the weight-streaming rate of a decode GEMV (one matrix that may
 * stay in the last-level cache, and 8 rotating copies that cannot) and a prefill GEMM. */
static void test_linear_throughput(void **state) {
    (void)state;
    ds_backend *be = tc_backend(0);
    test_rng rng = {.s = 99};
    enum { K = 2048, N = 8192, COPIES = 8 };
    size_t wbytes = (size_t)N * K * 2;
    float *ex;
    ds_linear lin[COPIES];
    for (int c = 0; c < COPIES; c++) lin[c] = (ds_linear){.n_parts = 1, .n_in = K, .n_out = N};
    lin[0].parts[0] = tc_rand_weight(&rng, DS_DTYPE_BF16, N, K, 0.1f, &ex);
    free(ex);
    for (int c = 1; c < COPIES; c++) {
        lin[c].parts[0] = lin[0].parts[0];
        lin[c].parts[0].data = malloc(wbytes);
        memcpy(lin[c].parts[0].data, lin[0].parts[0].data, wbytes);
    }
    float *x = tc_rand_act(be, &rng, (size_t)64 * K, 1.0f);
    float *y = tc_zero_act(be, (size_t)64 * N);
    ds_tensor tx = tc_tensor2(x, DS_DTYPE_F32, 1, K), ty = tc_tensor2(y, DS_DTYPE_F32, 1, N);
    be->ops->linear(be, &tx, &lin[0], &ty); /* warm-up */
    int iters = 24;
    double t0 = now_s();
    for (int i = 0; i < iters; i++) be->ops->linear(be, &tx, &lin[0], &ty);
    double hot = (now_s() - t0) / iters;
    t0 = now_s();
    for (int i = 0; i < iters; i++) be->ops->linear(be, &tx, &lin[i % COPIES], &ty);
    double cold = (now_s() - t0) / iters;
    printf("linear [1,%d]x[%d,%d] bf16, %d threads: same matrix %.3f ms = %.1f GB/s; "
           "8 rotating matrices %.3f ms = %.1f GB/s\n",
           K, K, N, ds_cpu_n_threads(be), hot * 1e3, (double)wbytes / 1e9 / hot, cold * 1e3,
           (double)wbytes / 1e9 / cold);
    tx = tc_tensor2(x, DS_DTYPE_F32, 64, K);
    ty = tc_tensor2(y, DS_DTYPE_F32, 64, N);
    t0 = now_s();
    be->ops->linear(be, &tx, &lin[0], &ty);
    double dt = now_s() - t0;
    printf("linear [64,%d]x[%d,%d] bf16: %.1f ms, %.1f GFLOP/s\n", K, K, N, dt * 1e3,
           2.0 * 64 * N * K / dt / 1e9);
    for (int c = 0; c < COPIES; c++) free(lin[c].parts[0].data);
    be->ops->free(be, x);
    be->ops->free(be, y);
    be->ops->destroy(be);
}

/* ---- embed / norms / silu / gather / argmax -------------------------------------------------- */

static void test_embed(void **state) {
    (void)state;
    ds_backend *be = tc_backend(2);
    test_rng rng = {.s = 5};
    ds_dtype dts[] = {DS_DTYPE_F32, DS_DTYPE_BF16, DS_DTYPE_F16};
    const int V = 50, H = 40;
    for (int d = 0; d < 3; d++) {
        float *ex;
        ds_tensor table = tc_rand_weight(&rng, dts[d], V, H, 1.0f, &ex);
        int n_new[] = {7}, past[] = {0}, slot[] = {0};
        tc_batch tb;
        tc_batch_init(&tb, 1, past, n_new, slot, NULL, 0);
        int ids[] = {3, 0, 49, 3, 17, 48, 1};
        memcpy(tb.tokens, ids, sizeof ids);
        be->ops->set_batch(be, &tb.b);
        float *out = tc_zero_act(be, (size_t)7 * H);
        ds_tensor to = tc_tensor2(out, DS_DTYPE_F32, 7, H);
        be->ops->embed(be, &table, &to);
        for (int t = 0; t < 7; t++)
            assert_memory_equal(out + t * H, ex + ids[t] * H, (size_t)H * sizeof(float));
        be->ops->free(be, out);
        free(table.data);
        free(ex);
    }
    be->ops->destroy(be);
}

static void ref_rmsnorm(const float *x, const float *w, double eps, int R, int D, double *out) {
    for (int r = 0; r < R; r++) {
        double ss = 0;
        for (int i = 0; i < D; i++) ss += (double)x[r * D + i] * x[r * D + i];
        double s = 1.0 / sqrt(ss / D + eps);
        for (int i = 0; i < D; i++) out[r * D + i] = x[r * D + i] * s * w[i];
    }
}

static void test_rmsnorm(void **state) {
    (void)state;
    ds_backend *be = tc_backend(2);
    test_rng rng = {.s = 77};
    int shapes[][2] = {{1, 16}, {3, 37}, {5, 2048}, {40, 1024}};
    double worst = 0, worst_add = 0;
    for (int si = 0; si < 4; si++) {
        int R = shapes[si][0], D = shapes[si][1];
        size_t n = (size_t)R * D;
        float *x = tc_rand_act(be, &rng, n, 3.0f), *w = tc_rand_act(be, &rng, (size_t)D, 1.0f);
        float *out = tc_zero_act(be, n);
        for (int i = 0; i < D; i++) w[i] += 1.0f; /* a (1+w) weight */
        double *ref = malloc(n * sizeof(double));
        ds_tensor tx = tc_tensor2(x, DS_DTYPE_F32, R, D), tw = tc_tensor1(w, DS_DTYPE_F32, D),
                  to = tc_tensor2(out, DS_DTYPE_F32, R, D);
        be->ops->rmsnorm(be, &tx, &tw, 1e-6f, &to);
        ref_rmsnorm(x, w, (double)1e-6f, R, D, ref);
        double rel = tc_rel_l2_d(out, ref, n);
        worst = rel > worst ? rel : worst;
        assert_true(rel <= TC_TOL);

        /* add_rmsnorm: residual += delta, out = rmsnorm(residual) */
        float *delta = tc_rand_act(be, &rng, n, 2.0f);
        double *sum = malloc(n * sizeof(double));
        float *sumf = malloc(n * sizeof(float));
        for (size_t i = 0; i < n; i++) {
            sum[i] = (double)x[i] + delta[i];
            sumf[i] = (float)sum[i];
        }
        ds_tensor td = tc_tensor2(delta, DS_DTYPE_F32, R, D);
        be->ops->add_rmsnorm(be, &tx, &td, &tw, 1e-6f, &to);
        assert_true(tc_rel_l2_d(x, sum, n) <= 1e-7);
        ref_rmsnorm(sumf, w, (double)1e-6f, R, D, ref);
        rel = tc_rel_l2_d(out, ref, n);
        worst_add = rel > worst_add ? rel : worst_add;
        assert_true(rel <= TC_TOL);
        free(sum);
        free(sumf);
        free(ref);
        be->ops->free(be, x);
        be->ops->free(be, w);
        be->ops->free(be, out);
        be->ops->free(be, delta);
    }
    printf("rmsnorm rel L2 max %.2e, add_rmsnorm %.2e\n", worst, worst_add);
    be->ops->destroy(be);
}

static void test_silu_mul(void **state) {
    (void)state;
    ds_backend *be = tc_backend(2);
    test_rng rng = {.s = 8};
    const int R = 70, I = 333;
    float *gu = tc_rand_act(be, &rng, (size_t)R * 2 * I, 6.0f),
          *out = tc_zero_act(be, (size_t)R * I);
    ds_tensor tg = tc_tensor2(gu, DS_DTYPE_F32, R, 2 * I), to = tc_tensor2(out, DS_DTYPE_F32, R, I);
    be->ops->silu_mul(be, &tg, &to);
    double *ref = malloc(sizeof(double) * R * I);
    for (int r = 0; r < R; r++)
        for (int i = 0; i < I; i++) {
            double g = gu[r * 2 * I + i], u = gu[r * 2 * I + I + i];
            ref[r * I + i] = g / (1.0 + exp(-g)) * u;
        }
    double rel = tc_rel_l2_d(out, ref, (size_t)R * I);
    printf("silu_mul rel L2 %.2e\n", rel);
    assert_true(rel <= TC_TOL);
    free(ref);
    be->ops->free(be, gu);
    be->ops->free(be, out);
    be->ops->destroy(be);
}

static void test_gather_rows(void **state) {
    (void)state;
    ds_backend *be = tc_backend(2);
    test_rng rng = {.s = 9};
    const int T = 9, H = 24;
    float *x = tc_rand_act(be, &rng, (size_t)T * H, 1.0f), *out = tc_zero_act(be, (size_t)T * H);
    int n_new[] = {5, 4}, past[] = {0, 3}, slot[] = {0, 1};
    tc_batch tb;
    tc_batch_init(&tb, 2, past, n_new, slot, NULL, 0);
    int32_t rows[] = {4, 8, 0};
    memcpy(tb.out_rows, rows, sizeof rows);
    tb.b.n_out = 3;
    be->ops->set_batch(be, &tb.b);
    ds_tensor tx = tc_tensor2(x, DS_DTYPE_F32, T, H), to = tc_tensor2(out, DS_DTYPE_F32, 3, H);
    be->ops->gather_rows(be, &tx, &to);
    for (int r = 0; r < 3; r++)
        assert_memory_equal(out + r * H, x + rows[r] * H, H * sizeof(float));
    be->ops->free(be, x);
    be->ops->free(be, out);
    be->ops->destroy(be);
}

static void test_argmax(void **state) {
    (void)state;
    ds_backend *be = tc_backend(2);
    const int V = 11;
    float *l = tc_zero_act(be, (size_t)4 * V);
    /* row 0: tie between 3 and 7 → 3 */
    for (int v = 0; v < V; v++) l[v] = -1.0f;
    l[3] = 2.5f;
    l[7] = 2.5f;
    /* row 1: all equal → 0 */
    for (int v = 0; v < V; v++) l[V + v] = 0.25f;
    /* row 2: max at the end */
    for (int v = 0; v < V; v++) l[2 * V + v] = (float)v;
    /* row 3: NaN first, then a tie between 5 and 9 */
    for (int v = 0; v < V; v++) l[3 * V + v] = -3.0f;
    l[3 * V + 0] = NAN;
    l[3 * V + 5] = 1.0f;
    l[3 * V + 9] = 1.0f;
    int32_t ids[4];
    ds_tensor t = tc_tensor2(l, DS_DTYPE_F32, 4, V);
    be->ops->argmax(be, &t, ids);
    assert_int_equal(ids[0], 3);
    assert_int_equal(ids[1], 0);
    assert_int_equal(ids[2], V - 1);
    assert_int_equal(ids[3], 5);
    be->ops->free(be, l);
    be->ops->destroy(be);
}

static void test_prepare_weights_aliases(void **state) {
    (void)state;
    ds_backend *be = tc_backend(1);
    float e[6] = {1, 2, 3, 4, 5, 6};
    ds_model_weights host = {0};
    host.embed = tc_tensor2(e, DS_DTYPE_F32, 3, 2);
    ds_model_weights dev;
    ds_error err = {0};
    assert_int_equal(be->ops->prepare_weights(be, NULL, &host, &dev, &err), DS_OK);
    assert_ptr_equal(dev.embed.data, e);
    be->ops->release_weights(be, &dev);
    assert_true(e[5] == 6.0f); /* host memory untouched */
    be->ops->destroy(be);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_threadpool),
        cmocka_unit_test(test_memory),
        cmocka_unit_test(test_prepare_weights_aliases),
        cmocka_unit_test(test_linear),
        cmocka_unit_test(test_linear_throughput),
        cmocka_unit_test(test_embed),
        cmocka_unit_test(test_rmsnorm),
        cmocka_unit_test(test_silu_mul),
        cmocka_unit_test(test_gather_rows),
        cmocka_unit_test(test_argmax),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
