/* Tensor parallelism on the CPU backend (src/parallel): the shared-memory all-reduce gives
 * bit-identical fixed-order sums on every rank; the vocab-parallel argmax merge equals the
 * backend's full-row argmax exactly (ties across shards, NaN, -inf, padded shards); an
 * indivisible size is refused; and N-rank models of the committed tiny checkpoints match an
 * independent single-rank run (plain ds_model + ds_session): logits within relative L2 1e-5
 * and the same 48 greedy tokens, where the TP tokens come from the vocab-parallel argmax. */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "model/loader.h"
#include "model/model.h"
#include "parallel/tp.h"
#include "runtime/session.h"
#include "testlib.h"

#define REL_TOL 1e-5
#define GEN_STEPS 48

/* ---- all-reduce ------------------------------------------------------------------------------ */

typedef struct ar_job {
    ds_tp_comm *comm;
    int rank, n_sizes;
    const int64_t *sizes;
    float **bufs; /* [n_sizes] this rank's buffers */
} ar_job;

static void *ar_thread(void *arg) {
    ar_job *j = arg;
    for (int i = 0; i < j->n_sizes; i++)
        ds_tp_allreduce_sum(j->comm, j->rank, j->bufs[i], j->sizes[i]);
    return NULL;
}

static void check_allreduce(int N) {
    enum { N_SIZES = 5 };
    const int64_t sizes[N_SIZES] = {1, 3, 7, 1000, 4096};
    ds_tp_comm *comm = NULL;
    ds_error err = {0};
    assert_int_equal(ds_tp_comm_create(N, 4096, &comm, &err), DS_OK);
    test_rng rng = {0x1234u + (uint64_t)N};
    float *in[DS_TP_MAX_RANKS][N_SIZES], *bufs[DS_TP_MAX_RANKS][N_SIZES];
    for (int r = 0; r < N; r++)
        for (int s = 0; s < N_SIZES; s++) {
            in[r][s] = malloc((size_t)sizes[s] * sizeof(float));
            bufs[r][s] = malloc((size_t)sizes[s] * sizeof(float));
            /* mixed magnitudes so that the summation order matters in the last bits */
            for (int64_t i = 0; i < sizes[s]; i++)
                in[r][s][i] = test_rng_uniform(&rng) * (i % 3 == 0 ? 1e4f : 1e-3f);
            memcpy(bufs[r][s], in[r][s], (size_t)sizes[s] * sizeof(float));
        }
    pthread_t th[DS_TP_MAX_RANKS];
    ar_job jobs[DS_TP_MAX_RANKS];
    for (int r = 0; r < N; r++) {
        jobs[r] = (ar_job){comm, r, N_SIZES, sizes, bufs[r]};
        assert_int_equal(pthread_create(&th[r], NULL, ar_thread, &jobs[r]), 0);
    }
    for (int r = 0; r < N; r++) pthread_join(th[r], NULL);
    for (int s = 0; s < N_SIZES; s++)
        for (int64_t i = 0; i < sizes[s]; i++) {
            float want = in[0][s][i];
            double exact = in[0][s][i];
            for (int r = 1; r < N; r++) {
                want += in[r][s][i];
                exact += in[r][s][i];
            }
            for (int r = 0; r < N; r++) {
                /* bit-identical on every rank and equal to the rank-order float sum */
                assert_memory_equal(&bufs[r][s][i], &bufs[0][s][i], sizeof(float));
                assert_memory_equal(&bufs[r][s][i], &want, sizeof(float));
            }
            assert_true(fabs((double)bufs[0][s][i] - exact) <= 1e-6 * (fabs(exact) + 1e4));
        }
    for (int r = 0; r < N; r++)
        for (int s = 0; s < N_SIZES; s++) {
            free(in[r][s]);
            free(bufs[r][s]);
        }
    ds_tp_comm_destroy(comm);
}

static void test_allreduce(void **state) {
    (void)state;
    for (int N = 2; N <= 5; N++) check_allreduce(N);
}

/* ---- vocab-parallel argmax ------------------------------------------------------------------ */

/* Merges shards of row[V] for N ranks: floor split (padded = false) or evenly padded shards of
 * ceil(V/N) entries whose slots past V hold `pad`. */
static int64_t sharded_argmax(const float *row, int64_t V, int N, bool padded, float pad) {
    ds_tp_argmax_part parts[DS_TP_MAX_RANKS];
    const int64_t per = (V + N - 1) / N;
    float *shard = malloc((size_t)per * sizeof(float));
    for (int r = 0; r < N; r++) {
        int64_t off = padded ? per * r : V * r / N;
        int64_t len = padded ? per : V * (r + 1) / N - off;
        for (int64_t v = 0; v < len; v++) shard[v] = off + v < V ? row[off + v] : pad;
        parts[r] = ds_tp_argmax_local(shard, len, off, V);
    }
    free(shard);
    return ds_tp_argmax_merge(parts, N);
}

static void test_argmax_merge(void **state) {
    (void)state;
    ds_backend *be = NULL;
    ds_error err = {0};
    assert_int_equal(ds_backend_cpu_create(1, &be, &err), DS_OK);
    enum { V = 37, CASES = 400 };
    float *row = be->ops->alloc(be, V * sizeof(float));
    test_rng rng = {99};
    int n_ties = 0;
    for (int c = 0; c < CASES; c++) {
        int kind = c % 8;
        for (int v = 0; v < V; v++) {
            /* few distinct values → many ties, often across shards */
            row[v] = kind < 4 ? floorf(test_rng_uniform(&rng) * 3.0f) : test_rng_uniform(&rng);
            if (kind == 4 && test_rng_uniform(&rng) > 0.3f) row[v] = NAN;
            if (kind == 5 && v < V - 3) row[v] = NAN; /* only the last shard has numbers */
            if (kind == 6) row[v] = -INFINITY;
            if (kind == 7) row[v] = v < 20 ? NAN : -INFINITY;
        }
        if (c == 8) /* all NaN: the backends answer 0 */
            for (int v = 0; v < V; v++) row[v] = NAN;
        int32_t want;
        ds_tensor t = ds_view2d(row, DS_DTYPE_F32, 1, V);
        be->ops->argmax(be, &t, &want); /* the single-device reference */
        int hits = 0;
        for (int v = 0; v < V; v++) hits += row[v] == row[want];
        n_ties += hits > 1;
        for (int N = 1; N <= 6; N++) {
            assert_int_equal(sharded_argmax(row, V, N, false, 0), want);
            /* padding of evenly sized shards must never win: -inf, NaN, even +inf */
            assert_int_equal(sharded_argmax(row, V, N, true, -INFINITY), want);
            assert_int_equal(sharded_argmax(row, V, N, true, NAN), want);
            assert_int_equal(sharded_argmax(row, V, N, true, INFINITY), want);
        }
    }
    assert_true(n_ties > CASES / 4); /* the cases did exercise ties */
    be->ops->free(be, row);
    be->ops->destroy(be);
}

/* ---- refusal of an indivisible size ---------------------------------------------------------- */

static void test_refuse_indivisible(void **state) {
    (void)state;
    char dir[1024];
    snprintf(dir, sizeof dir, "%s/models/tiny-moe", test_data_dir());
    ds_config cfg;
    ds_model_weights host;
    ds_error err = {0};
    if (ds_model_load(dir, &cfg, &host, &err) != DS_OK) fail_msg("load %s: %s", dir, err.msg);
    const int bad[] = {3, 8, 0};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        ds_tp_opts o = {.n_ranks = bad[i], .threads_per_rank = 1, .max_tokens = 8, .max_out = 1,
                        .n_slots = 1, .max_len = 64};
        ds_tp_model *tp = NULL;
        err = (ds_error){0};
        assert_int_equal(ds_tp_model_create(&cfg, &host, &o, &tp, &err), DS_ERR_INVALID_ARG);
        assert_null(tp);
        assert_non_null(strstr(err.msg, "--tensor-parallel-size"));
        if (bad[i] == 3) assert_non_null(strstr(err.msg, "num_attention_heads"));
    }
    ds_model_weights_free(&host);
}

/* ---- whole models: N ranks against an independent single-rank run --------------------------- */

static int32_t ref_argmax(const float *l, int V) {
    int32_t best = 0;
    for (int v = 1; v < V; v++)
        if (l[v] > l[best]) best = v;
    return best;
}

static void check_model(const char *name, int N, int prompt_len, int max_tokens) {
    char dir[1024];
    snprintf(dir, sizeof dir, "%s/models/%s", test_data_dir(), name);
    ds_config cfg;
    ds_model_weights host;
    ds_error err = {0};
    if (ds_model_load(dir, &cfg, &host, &err) != DS_OK) fail_msg("load %s: %s", dir, err.msg);
    const int V = cfg.vocab, max_len = prompt_len + GEN_STEPS + 1;

    /* reference: the plain model, one rank */
    ds_backend *be = NULL;
    ds_model ref;
    ds_session sess;
    assert_int_equal(ds_backend_cpu_create(2, &be, &err), DS_OK);
    if (ds_model_init(&ref, be, &cfg, &host, max_tokens, max_tokens, &err) != DS_OK)
        fail_msg("model init: %s", err.msg);
    assert_int_equal(ds_session_init(&sess, &ref, 1, max_len, &err), DS_OK);

    ds_tp_opts o = {.n_ranks = N, .threads_per_rank = 1, .max_tokens = max_tokens,
                    .max_out = max_tokens, .n_slots = 1, .max_len = max_len};
    ds_tp_model *tp = NULL;
    if (ds_tp_model_create(&cfg, &host, &o, &tp, &err) != DS_OK)
        fail_msg("%s tp=%d: %s", name, N, err.msg);
    assert_int_equal(ds_tp_model_ranks(tp), N);

    int32_t *prompt = malloc(sizeof(int32_t) * (size_t)prompt_len);
    test_rng rng = {(uint64_t)prompt_len * 7919u + 1};
    for (int i = 0; i < prompt_len; i++)
        prompt[i] = (int32_t)((test_rng_uniform(&rng) + 1.0f) * 0.5f * (float)(V - 1));
    float *lr = malloc(sizeof(float) * (size_t)prompt_len * (size_t)V);
    float *lt = malloc(sizeof(float) * (size_t)prompt_len * (size_t)V);
    int32_t *ids = malloc(sizeof(int32_t) * (size_t)prompt_len);

    /* prefill: every position's logits */
    assert_int_equal(ds_session_feed(&sess, 0, prompt, prompt_len, true, lr, &err), DS_OK);
    if (ds_tp_feed(tp, 0, prompt, prompt_len, true, lt, ids, &err) != DS_OK)
        fail_msg("tp feed: %s", err.msg);
    double rel = test_rel_l2(lt, lr, (size_t)prompt_len * (size_t)V), worst = rel;
    if (rel > REL_TOL) fail_msg("%s tp=%d prefill logits rel L2 %.3g", name, N, rel);
    for (int i = 0; i < prompt_len; i++)
        assert_int_equal(ids[i], ref_argmax(lt + (size_t)i * (size_t)V, V));

    /* greedy decode: the reference picks from its logits, TP from the vocab-parallel argmax */
    int32_t tok_r = ref_argmax(lr + (size_t)(prompt_len - 1) * (size_t)V, V);
    int32_t tok_t = ids[prompt_len - 1];
    int distinct = 0;
    for (int s = 0; s < GEN_STEPS; s++) {
        if (tok_t != tok_r) fail_msg("%s tp=%d: step %d token %d != %d", name, N, s, tok_t, tok_r);
        distinct += s > 0 && tok_r != prompt[0];
        assert_int_equal(ds_session_feed(&sess, 0, &tok_r, 1, false, lr, &err), DS_OK);
        if (ds_tp_feed(tp, 0, &tok_t, 1, false, lt, ids, &err) != DS_OK)
            fail_msg("tp feed: %s", err.msg);
        rel = test_rel_l2(lt, lr, (size_t)V);
        if (rel > REL_TOL) fail_msg("%s tp=%d step %d logits rel L2 %.3g", name, N, s, rel);
        worst = rel > worst ? rel : worst;
        tok_r = ref_argmax(lr, V);
        tok_t = ids[0];
    }
    print_message("%s tp=%d prompt %d (step %d): worst logits rel L2 %.3g over prefill + %d "
                  "greedy steps, tokens identical\n",
                  name, N, prompt_len, max_tokens, worst, GEN_STEPS);

    free(prompt);
    free(lr);
    free(lt);
    free(ids);
    ds_tp_model_free(tp);
    ds_session_free(&sess);
    ds_model_free(&ref);
    be->ops->destroy(be);
    ds_model_weights_free(&host);
}

static void test_tiny_moe(void **state) {
    (void)state;
    check_model("tiny-moe", 2, 24, 32);
    check_model("tiny-moe", 4, 24, 8); /* kv and GDN key heads replicated; chunked prefill */
    check_model("tiny-moe", 1, 24, 32);
}

static void test_tiny_moe_fused(void **state) {
    (void)state;
    check_model("tiny-moe-fused", 2, 80, 128); /* 80 tokens in one step: chunked GDN form */
    check_model("tiny-moe-fused", 4, 24, 32);
}

static void test_tiny_dense(void **state) {
    (void)state;
    check_model("tiny-dense", 2, 24, 32);
    check_model("tiny-dense", 4, 80, 128);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_allreduce),
        cmocka_unit_test(test_argmax_merge),
        cmocka_unit_test(test_refuse_indivisible),
        cmocka_unit_test(test_tiny_moe),
        cmocka_unit_test(test_tiny_moe_fused),
        cmocka_unit_test(test_tiny_dense),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
