/* test_engine.c — the serving engine on the CPU backend with the committed tiny Qwen3.5 models.
 *
 * The reference for every request is the same request run alone through ds_session (one
 * sequence, fixed KV blocks, no scheduler) with its own ds_sampler: continuous batching,
 * chunked prefill and preemption-recompute must not change a single token (or logprob).
 * The CPU backend is forced to the token-by-token GDN recurrence, whose result does not depend
 * on how a prompt is split into steps (the chunked GDN form rounds differently per chunking);
 * every other CPU op is batch-invariant by construction (see cpu_matmul.c, cpu_attention.c).
 *
 * Also: cancellation frees caches at once, queue-full and too-long submissions, min_tokens /
 * max_tokens / stop ids, and destroying the engine with requests in flight. */
#include "testlib.h"

#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "backend/cpu/cpu_backend.h"
#include "model/loader.h"
#include "model/model.h"
#include "runtime/engine.h"
#include "runtime/session.h"

#define MAX_PROMPT 256
#define MAX_OUT 512
#define MODEL_MAX_TOKENS 256
#define MODEL_MAX_OUT 16
#define N_REQ 16

#include "engine_harness.h" /* result, solo_run, drain_soft (needs MAX_OUT) */

/* ---- fixtures ------------------------------------------------------------------------------- */

typedef test_model fixture; /* testlib.h */

static void fixture_open(fixture *f, const char *name) {
    char rel[256];
    snprintf(rel, sizeof rel, "models/%s", name);
    test_model_load(f, test_data_path(rel));
    test_model_init(f, MODEL_MAX_TOKENS, MODEL_MAX_OUT);
}

static void fixture_close(fixture *f) { test_model_close(f); }

typedef struct spec {
    int32_t prompt[MAX_PROMPT];
    int n_prompt;
    ds_sampling_params params;
    int stop_ids[4];
} spec;


static int rnd_int(test_rng *g, int lo, int hi) { /* [lo, hi] */
    float u = (test_rng_uniform(g) + 1.0f) * 0.5f;
    int v = lo + (int)(u * (float)(hi - lo + 1));
    return v > hi ? hi : v;
}

static void random_prompt(test_rng *g, spec *s, int n) {
    s->n_prompt = n;
    for (int i = 0; i < n; i++) s->prompt[i] = rnd_int(g, 0, 509); /* not EOS (510, 511) */
}

/* 16 requests, prompt lengths 1..200 (both ends included), outputs 1..48. */
static void make_workload(spec *w, bool sampled, uint64_t seed) {
    test_rng g = {seed};
    for (int i = 0; i < N_REQ; i++) {
        spec *s = &w[i];
        memset(s, 0, sizeof *s);
        int n = i == 0 ? 1 : i == 1 ? 200 : rnd_int(&g, 1, 200);
        random_prompt(&g, s, n);
        ds_sampling_params_init(&s->params);
        s->params.max_tokens = i == 2 ? 1 : rnd_int(&g, 1, 48);
        s->params.ignore_eos = i % 2 == 0;
        if (!sampled) {
            s->params.temperature = 0.0f;
        } else {
            s->params.temperature = 0.7f + 0.1f * (float)(i % 4);
            s->params.top_k = i % 3 == 0 ? 0 : 40;
            s->params.top_p = i % 2 ? 0.9f : 1.0f;
            s->params.min_p = i % 5 == 0 ? 0.05f : 0.0f;
            s->params.has_seed = true;
            s->params.seed = 1000 + (uint64_t)i;
            if (i % 4 == 1) {
                s->params.repetition_penalty = 1.2f;
                s->params.presence_penalty = 0.3f;
                s->params.frequency_penalty = 0.2f;
            }
        }
        s->params.logprobs = i % 3 == 1 ? 3 : -1;
    }
}

/* ---- the reference: one request alone through ds_session ------------------------------------ */

static void solo_all(fixture *f, const spec *w, int n, result *out) {
    ds_session ss;
    ds_error err = {0};
    if (ds_session_init(&ss, &f->model, 1, MAX_PROMPT + MAX_OUT, &err) != DS_OK)
        fail_msg("session: %s", err.msg);
    for (int i = 0; i < n; i++) solo_run(f, &ss, w[i].prompt, w[i].n_prompt, &w[i].params, &out[i]);
    ds_session_free(&ss);
}

/* ---- the engine side ------------------------------------------------------------------------ */


static void drain(ds_request *r, int n_prompt, result *out) {
    drain_soft(r, n_prompt, out);
    if (out->err[0]) fail_msg("channel: %s", out->err);
}

/* Worker threads: BUSY is retried; any other error is recorded in *out. */
static ds_request *submit_retry(ds_engine *e, const spec *s, result *out) {
    ds_request_desc d = {.prompt = s->prompt, .n_prompt = s->n_prompt, .params = s->params};
    for (;;) {
        ds_request *r = NULL;
        ds_error err = {0};
        ds_status st = ds_engine_submit(e, &d, &r, &err);
        if (st == DS_OK) return r;
        if (st != DS_ERR_BUSY) {
            snprintf(out->err, sizeof out->err, "submit: %s", err.msg);
            return NULL;
        }
        usleep(1000);
    }
}

typedef struct worker {
    ds_engine *e;
    const spec *specs;
    result *res;
    int first, step, n; /* requests first, first + step, ... (n of them) */
} worker;

static void *worker_main(void *arg) {
    worker *w = arg;
    ds_request *reqs[N_REQ * 2];
    for (int k = 0; k < w->n; k++) {
        int i = w->first + k * w->step;
        reqs[k] = submit_retry(w->e, &w->specs[i], &w->res[i]);
    }
    for (int k = 0; k < w->n; k++) {
        int i = w->first + k * w->step;
        if (!reqs[k]) continue;
        drain_soft(reqs[k], w->specs[i].n_prompt, &w->res[i]);
        ds_request_release(reqs[k]);
    }
    return NULL;
}

/* Runs n requests through one engine from n_threads submitting threads; returns the stats. */
static void engine_run(fixture *f, const ds_engine_opts *o, const spec *w, int n, int n_threads,
                       result *out, ds_engine_stats *stats) {
    ds_engine *e;
    ds_error err = {0};
    if (ds_engine_create(&f->model, o, &e, &err) != DS_OK) fail_msg("engine: %s", err.msg);
    pthread_t th[8];
    worker wk[8];
    assert_true(n_threads <= 8 && n % n_threads == 0);
    for (int t = 0; t < n_threads; t++) {
        wk[t] = (worker){.e = e, .specs = w, .res = out, .first = t, .step = n_threads,
                         .n = n / n_threads};
        assert_int_equal(pthread_create(&th[t], NULL, worker_main, &wk[t]), 0);
    }
    for (int t = 0; t < n_threads; t++) pthread_join(th[t], NULL);
    ds_engine_get_stats(e, stats);
    ds_engine_destroy(e);
    for (int i = 0; i < n; i++)
        if (out[i].err[0]) fail_msg("request %d: %s", i, out[i].err);
}

static void expect_same(const spec *w, const result *solo, const result *eng, int n) {
    for (int i = 0; i < n; i++) {
        const result *a = &solo[i], *b = &eng[i];
        bool same = a->n == b->n && a->reason == b->reason && a->stop_token == b->stop_token &&
                    memcmp(a->toks, b->toks, (size_t)a->n * sizeof a->toks[0]) == 0;
        if (same && w[i].params.logprobs >= 0)
            same = memcmp(a->logprob, b->logprob, (size_t)a->n * sizeof a->logprob[0]) == 0;
        if (!same) {
            int k = 0;
            while (k < a->n && k < b->n && a->toks[k] == b->toks[k]) k++;
            int kl = 0;
            while (kl < k && a->logprob[kl] == b->logprob[kl]) kl++;
            fail_msg("request %d (prompt %d, max_tokens %d): solo %d tokens (%s), engine %d tokens "
                     "(%s), first token difference at %d, first logprob difference at %d",
                     i, w[i].n_prompt, w[i].params.max_tokens, a->n,
                     ds_finish_reason_name(a->reason), b->n, ds_finish_reason_name(b->reason), k,
                     w[i].params.logprobs >= 0 ? kl : -1);
        }
    }
}

static void check_counters(const spec *w, const result *res, int n, const ds_engine_stats *s) {
    uint64_t prompt = 0, gen = 0;
    for (int i = 0; i < n; i++) {
        prompt += (uint64_t)w[i].n_prompt;
        gen += (uint64_t)res[i].n;
    }
    assert_int_equal(s->requests_finished, n);
    assert_int_equal(s->requests_aborted, 0);
    assert_int_equal(s->prompt_tokens, prompt);
    assert_int_equal(s->generation_tokens, gen);
    assert_int_equal(s->running, 0);
    assert_int_equal(s->waiting, 0);
    assert_int_equal(s->kv_blocks_used, 0);
    assert_int_equal(s->slots_used, 0);
    assert_true(s->steps > 0);
}

static void base_opts(ds_engine_opts *o) {
    ds_engine_opts_default(o);
    o->max_num_seqs = 8;
    o->max_model_len = 512;
    o->max_num_batched_tokens = 64; /* small: prompts are chunked and mixed with decodes */
    o->max_queue = 64;
    o->block_size = 16;
}

/* ---- (1), (2), (3): batching does not change results ---------------------------------------- */

static void run_equivalence(const char *model, bool sampled, uint64_t seed) {
    fixture f;
    fixture_open(&f, model);
    spec *w = calloc(N_REQ, sizeof *w);
    result *solo = calloc(N_REQ, sizeof *solo), *eng = calloc(N_REQ, sizeof *eng);
    make_workload(w, sampled, seed);
    solo_all(&f, w, N_REQ, solo);
    ds_engine_opts o;
    base_opts(&o);
    ds_engine_stats st;
    engine_run(&f, &o, w, N_REQ, 4, eng, &st);
    expect_same(w, solo, eng, N_REQ);
    check_counters(w, eng, N_REQ, &st);
    /* The steps really were batched: far fewer steps than tokens processed one sequence at a
     * time would need. */
    assert_true(st.steps < st.generation_tokens);
    free(w);
    free(solo);
    free(eng);
    fixture_close(&f);
}

static void test_greedy_batched_equals_solo_moe(void **state) {
    (void)state;
    run_equivalence("tiny-moe", false, 0x1234567ull);
}

static void test_greedy_batched_equals_solo_dense(void **state) {
    (void)state;
    run_equivalence("tiny-dense", false, 0x7654321ull);
}

static void test_sampled_batched_equals_solo(void **state) {
    (void)state;
    run_equivalence("tiny-moe", true, 0xabcdefull);
}

static void test_preemption_keeps_results(void **state) {
    (void)state;
    fixture f;
    fixture_open(&f, "tiny-moe");
    enum { N = 2 * N_REQ };
    spec *w = calloc(N, sizeof *w);
    result *solo = calloc(N, sizeof *solo), *eng = calloc(N, sizeof *eng);
    make_workload(w, false, 0x55aa55ull);
    make_workload(w + N_REQ, true, 0xaa55aaull);
    solo_all(&f, w, N, solo);
    ds_engine_opts o;
    base_opts(&o);
    o.max_model_len = 256;
    o.block_size = 8;
    o.num_kv_blocks = 40; /* 320 positions for 8 sequences of up to 248 */
    ds_engine_stats st;
    engine_run(&f, &o, w, N, 4, eng, &st);
    expect_same(w, solo, eng, N);
    check_counters(w, eng, N, &st);
    print_message("preemption test: %llu preemptions in %llu steps\n",
                  (unsigned long long)st.preemptions, (unsigned long long)st.steps);
    assert_true(st.preemptions > 0);
    assert_int_equal(st.kv_blocks_total, 40);
    free(w);
    free(solo);
    free(eng);
    fixture_close(&f);
}

/* ---- (4) cancellation ----------------------------------------------------------------------- */

static ds_request *submit_ok(ds_engine *e, const spec *s) {
    ds_request_desc d = {.prompt = s->prompt, .n_prompt = s->n_prompt, .params = s->params};
    ds_request *r = NULL;
    ds_error err = {0};
    if (ds_engine_submit(e, &d, &r, &err) != DS_OK) fail_msg("submit: %s", err.msg);
    return r;
}

static void long_request(spec *s, int n_prompt, int max_tokens, uint64_t seed) {
    test_rng g = {seed};
    memset(s, 0, sizeof *s);
    random_prompt(&g, s, n_prompt);
    ds_sampling_params_init(&s->params);
    s->params.temperature = 0.0f;
    s->params.max_tokens = max_tokens;
    s->params.ignore_eos = true;
}

static bool wait_stats(ds_engine *e, ds_engine_stats *s, bool (*ok)(const ds_engine_stats *)) {
    for (int i = 0; i < 5000; i++) {
        ds_engine_get_stats(e, s);
        if (ok(s)) return true;
        usleep(1000);
    }
    return false;
}

static bool idle(const ds_engine_stats *s) {
    return s->running == 0 && s->waiting == 0 && s->kv_blocks_used == 0 && s->slots_used == 0;
}

static bool idle_after_two_aborts(const ds_engine_stats *s) {
    return s->requests_aborted == 2 && s->kv_blocks_used == 0 && s->slots_used == 0 &&
           s->running == 0 && s->waiting == 0;
}

static void test_cancel_frees_caches(void **state) {
    (void)state;
    fixture f;
    fixture_open(&f, "tiny-moe");
    ds_engine_opts o;
    base_opts(&o);
    ds_engine *e;
    ds_error err = {0};
    if (ds_engine_create(&f.model, &o, &e, &err) != DS_OK) fail_msg("engine: %s", err.msg);
    spec s;
    long_request(&s, 40, 450, 77);

    /* Cancel mid-generation: the finished event says "aborted", caches are already free. */
    ds_request *r = submit_ok(e, &s);
    ds_request_event ev;
    int got = 0;
    while (got < 3 && ds_request_next(r, &ev, -1)) {
        assert_false(ev.finished);
        got += ev.n_tokens;
    }
    ds_engine_stats st;
    ds_engine_get_stats(e, &st);
    assert_true(st.kv_blocks_used > 0 && st.slots_used == 1);
    ds_request_cancel(r);
    bool finished = false;
    int n = got;
    while (ds_request_next(r, &ev, -1)) {
        n += ev.n_tokens;
        if (ev.finished) {
            finished = true;
            assert_int_equal(ev.reason, DS_FINISH_NONE);
            assert_int_equal(ev.stop_token, -1);
        }
    }
    assert_true(finished);
    assert_true(n < 450);
    ds_engine_get_stats(e, &st); /* published before the finished event was delivered */
    assert_int_equal(st.kv_blocks_used, 0);
    assert_int_equal(st.slots_used, 0);
    assert_int_equal(st.running, 0);
    assert_int_equal(st.requests_aborted, 1);
    assert_int_equal(st.requests_finished, 0);
    ds_request_release(r);

    /* A client that goes away without reading: release alone frees everything. */
    r = submit_ok(e, &s);
    usleep(2000);
    ds_request_release(r);
    if (!wait_stats(e, &st, idle_after_two_aborts))
        fail_msg("caches not freed after release: %d blocks, %d slots, %llu aborted",
                 st.kv_blocks_used, st.slots_used, (unsigned long long)st.requests_aborted);

    /* Cancelled before the engine even looked at it. */
    r = submit_ok(e, &s);
    ds_request_cancel(r);
    ds_request_cancel(r); /* twice is harmless */
    result res;
    drain(r, s.n_prompt, &res);
    assert_int_equal(res.reason, DS_FINISH_NONE);
    ds_request_release(r);

    /* The engine still serves normally afterwards, and matches a solo run. */
    long_request(&s, 30, 20, 78);
    result solo, eng;
    ds_engine_destroy(e);
    solo_all(&f, &s, 1, &solo);
    if (ds_engine_create(&f.model, &o, &e, &err) != DS_OK) fail_msg("engine: %s", err.msg);
    r = submit_ok(e, &s);
    drain(r, s.n_prompt, &eng);
    ds_request_release(r);
    expect_same(&s, &solo, &eng, 1);
    ds_engine_destroy(e);
    fixture_close(&f);
}

/* ---- (5) admission errors ------------------------------------------------------------------- */

static ds_status try_submit(ds_engine *e, const int32_t *prompt, int n, const ds_sampling_params *p,
                            ds_error *err) {
    ds_request_desc d = {.prompt = prompt, .n_prompt = n, .params = *p};
    ds_request *r = (ds_request *)(uintptr_t)1; /* must be reset to NULL on failure */
    memset(err, 0, sizeof *err);
    ds_status st = ds_engine_submit(e, &d, &r, err);
    if (st == DS_OK) {
        ds_request_release(r);
    } else {
        assert_null(r);
        assert_true(err->msg[0] != '\0');
    }
    return st;
}

static void test_submit_errors(void **state) {
    (void)state;
    fixture f;
    fixture_open(&f, "tiny-moe");
    ds_engine_opts o;
    base_opts(&o);
    o.max_num_seqs = 1;
    o.max_queue = 2;
    ds_engine *e;
    ds_error err = {0};
    if (ds_engine_create(&f.model, &o, &e, &err) != DS_OK) fail_msg("engine: %s", err.msg);

    /* Queue full: one request runs, max_queue wait, the next is refused with BUSY. */
    spec s;
    long_request(&s, 50, 450, 5);
    ds_request *held[10];
    int n_ok = 0, n_busy = 0;
    for (int i = 0; i < 10; i++) {
        ds_request_desc d = {.prompt = s.prompt, .n_prompt = s.n_prompt, .params = s.params};
        ds_request *r = NULL;
        memset(&err, 0, sizeof err);
        ds_status st = ds_engine_submit(e, &d, &r, &err);
        if (st == DS_OK) {
            held[n_ok++] = r;
        } else {
            assert_int_equal(st, DS_ERR_BUSY);
            assert_null(r);
            assert_non_null(strstr(err.msg, "queue"));
            n_busy++;
        }
    }
    assert_true(n_busy > 0);
    assert_true(n_ok >= o.max_queue && n_ok <= o.max_queue + o.max_num_seqs);
    ds_engine_stats st;
    ds_engine_get_stats(e, &st);
    assert_int_equal(st.requests_rejected, n_busy);
    for (int i = 0; i < n_ok; i++) ds_request_release(held[i]);
    if (!wait_stats(e, &st, idle))
        fail_msg("released requests still hold the engine: %d running, %d waiting", st.running,
                 st.waiting);

    /* Too long: prompt + max_tokens > max_model_len, both lengths in the message. */
    ds_sampling_params p;
    ds_sampling_params_init(&p);
    p.max_tokens = 20;
    int32_t *big = calloc(600, sizeof *big);
    assert_int_equal(try_submit(e, big, 500, &p, &err), DS_ERR_INVALID_ARG);
    assert_non_null(strstr(err.msg, "512"));
    assert_non_null(strstr(err.msg, "500"));
    assert_non_null(strstr(err.msg, "20"));
    p.max_tokens = 12; /* exactly max_model_len: accepted */
    assert_int_equal(try_submit(e, big, 500, &p, &err), DS_OK);
    p.max_tokens = 1;
    assert_int_equal(try_submit(e, big, 600, &p, &err), DS_ERR_INVALID_ARG);
    p.max_tokens = 0x7fffffff; /* no overflow in the sum */
    assert_int_equal(try_submit(e, big, 10, &p, &err), DS_ERR_INVALID_ARG);

    /* Empty prompt, ids outside the vocabulary, bad parameters. */
    ds_sampling_params_init(&p);
    assert_int_equal(try_submit(e, big, 0, &p, &err), DS_ERR_INVALID_ARG);
    assert_int_equal(try_submit(e, NULL, 5, &p, &err), DS_ERR_INVALID_ARG);
    int32_t bad[3] = {1, 512, 2};
    assert_int_equal(try_submit(e, bad, 3, &p, &err), DS_ERR_INVALID_ARG);
    bad[1] = -1;
    assert_int_equal(try_submit(e, bad, 3, &p, &err), DS_ERR_INVALID_ARG);
    p.top_p = 0.0f;
    assert_int_equal(try_submit(e, big, 5, &p, &err), DS_ERR_INVALID_ARG);
    assert_non_null(strstr(err.msg, "top_p"));
    ds_sampling_params_init(&p);
    p.max_tokens = 0;
    assert_int_equal(try_submit(e, big, 5, &p, &err), DS_ERR_INVALID_ARG);
    ds_sampling_params_init(&p);
    int stop_bad[1] = {9999};
    p.stop_token_ids = stop_bad;
    p.n_stop_token_ids = 1;
    assert_int_equal(try_submit(e, big, 5, &p, &err), DS_ERR_INVALID_ARG);
    ds_request *r = NULL;
    assert_int_equal(ds_engine_submit(e, NULL, &r, &err), DS_ERR_INVALID_ARG);

    ds_engine_get_stats(e, &st);
    assert_int_equal(st.requests_rejected, (uint64_t)n_busy + 10);
    free(big);
    ds_engine_destroy(e);

    /* Bad engine options are refused, not asserted on. */
    ds_engine_opts bad_o;
    base_opts(&bad_o);
    bad_o.max_num_batched_tokens = MODEL_MAX_TOKENS + 1;
    assert_int_equal(ds_engine_create(&f.model, &bad_o, &e, &err), DS_ERR_INVALID_ARG);
    base_opts(&bad_o);
    bad_o.max_num_seqs = MODEL_MAX_OUT + 1;
    bad_o.max_num_batched_tokens = 64;
    assert_int_equal(ds_engine_create(&f.model, &bad_o, &e, &err), DS_ERR_INVALID_ARG);
    base_opts(&bad_o);
    bad_o.max_model_len = 5000; /* > max_position_embeddings 4096 */
    assert_int_equal(ds_engine_create(&f.model, &bad_o, &e, &err), DS_ERR_INVALID_ARG);
    base_opts(&bad_o);
    bad_o.block_size = 0;
    assert_int_equal(ds_engine_create(&f.model, &bad_o, &e, &err), DS_ERR_INVALID_ARG);
    /* A KV pool smaller than one request: such requests are refused at submit. */
    base_opts(&bad_o);
    bad_o.num_kv_blocks = 4; /* 64 positions */
    if (ds_engine_create(&f.model, &bad_o, &e, &err) != DS_OK) fail_msg("engine: %s", err.msg);
    p.max_tokens = 20;
    p.stop_token_ids = NULL;
    p.n_stop_token_ids = 0;
    big = calloc(100, sizeof *big);
    assert_int_equal(try_submit(e, big, 45, &p, &err), DS_OK); /* 64 positions */
    assert_int_equal(try_submit(e, big, 46, &p, &err), DS_ERR_INVALID_ARG);
    assert_non_null(strstr(err.msg, "KV"));
    free(big);
    ds_engine_destroy(e);
    fixture_close(&f);
}

/* ---- (6) min_tokens / max_tokens / stop ids ------------------------------------------------- */

static void engine_one(fixture *f, const spec *s, result *out) {
    ds_engine_opts o;
    base_opts(&o);
    ds_engine *e;
    ds_error err = {0};
    if (ds_engine_create(&f->model, &o, &e, &err) != DS_OK) fail_msg("engine: %s", err.msg);
    ds_request *r = submit_ok(e, s);
    drain(r, s->n_prompt, out);
    ds_request_release(r);
    ds_engine_destroy(e);
}

static void test_stop_conditions(void **state) {
    (void)state;
    fixture f;
    fixture_open(&f, "tiny-moe");
    spec s;
    long_request(&s, 17, 40, 4242);
    result base;
    engine_one(&f, &s, &base);
    assert_int_equal(base.n, 40);
    assert_int_equal(base.reason, DS_FINISH_LENGTH);

    /* max_tokens: a prefix of the same greedy continuation, finish "length". */
    spec s2 = s;
    s2.params.max_tokens = 7;
    result r;
    engine_one(&f, &s2, &r);
    assert_int_equal(r.n, 7);
    assert_int_equal(r.reason, DS_FINISH_LENGTH);
    assert_memory_equal(r.toks, base.toks, 7 * sizeof(int32_t));

    /* stop_token_ids: stops at the first occurrence, the stop id is the last token. */
    int k = 3;
    for (;; k++) {
        assert_true(k < base.n - 5);
        bool seen = false;
        for (int j = 0; j < k; j++) seen |= base.toks[j] == base.toks[k];
        if (!seen) break;
    }
    spec s3 = s;
    s3.stop_ids[0] = base.toks[k];
    s3.params.stop_token_ids = s3.stop_ids;
    s3.params.n_stop_token_ids = 1;
    engine_one(&f, &s3, &r);
    assert_int_equal(r.n, k + 1);
    assert_int_equal(r.reason, DS_FINISH_STOP);
    assert_int_equal(r.stop_token, base.toks[k]);
    assert_memory_equal(r.toks, base.toks, (size_t)(k + 1) * sizeof(int32_t));

    /* min_tokens: the stop id is banned for the first min_tokens outputs. */
    spec s4 = s3;
    s4.params.stop_token_ids = s4.stop_ids;
    s4.params.min_tokens = k + 3;
    engine_one(&f, &s4, &r);
    assert_memory_equal(r.toks, base.toks, (size_t)k * sizeof(int32_t));
    for (int j = 0; j < s4.params.min_tokens && j < r.n; j++)
        assert_int_not_equal(r.toks[j], s3.stop_ids[0]);
    assert_true(r.n >= s4.params.min_tokens);
    if (r.reason == DS_FINISH_STOP) {
        assert_int_equal(r.toks[r.n - 1], s3.stop_ids[0]);
        assert_int_equal(r.stop_token, s3.stop_ids[0]);
    } else {
        assert_int_equal(r.reason, DS_FINISH_LENGTH);
        assert_int_equal(r.n, 40);
    }
    result solo;
    solo_all(&f, &s4, 1, &solo);
    expect_same(&s4, &solo, &r, 1);
    fixture_close(&f);
}

/* ---- (7) destroy with requests in flight ---------------------------------------------------- */

typedef struct reader {
    ds_request *r;
    int n_prompt;
    result res;
} reader;

static void *reader_main(void *arg) {
    reader *rd = arg;
    drain_soft(rd->r, rd->n_prompt, &rd->res);
    return NULL;
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void test_destroy_in_flight(void **state) {
    (void)state;
    fixture f;
    fixture_open(&f, "tiny-moe");
    ds_engine_opts o;
    base_opts(&o);
    o.max_num_seqs = 4;
    ds_engine *e;
    ds_error err = {0};
    if (ds_engine_create(&f.model, &o, &e, &err) != DS_OK) fail_msg("engine: %s", err.msg);
    enum { N = 12, NREAD = 3 };
    spec s[N];
    ds_request *r[N];
    for (int i = 0; i < N; i++) {
        long_request(&s[i], 20 + 10 * i, 300, 900 + (uint64_t)i);
        r[i] = submit_ok(e, &s[i]);
    }
    ds_request_release(r[N - 1]); /* one client already gone */
    reader rd[NREAD];
    pthread_t th[NREAD];
    for (int i = 0; i < NREAD; i++) {
        rd[i] = (reader){.r = r[i], .n_prompt = s[i].n_prompt};
        assert_int_equal(pthread_create(&th[i], NULL, reader_main, &rd[i]), 0);
    }
    usleep(20000);
    double t0 = now_s();
    ds_engine_destroy(e);
    double dt = now_s() - t0;
    assert_true(dt < 5.0);
    for (int i = 0; i < NREAD; i++) {
        pthread_join(th[i], NULL);
        if (rd[i].res.err[0]) fail_msg("reader %d: %s", i, rd[i].res.err);
        assert_true(rd[i].res.finished);
        assert_true(rd[i].res.reason == DS_FINISH_NONE || rd[i].res.n == 300);
    }
    /* Unread requests end aborted too; releasing after destroy is safe. */
    for (int i = NREAD; i < N - 1; i++) {
        result res;
        drain(r[i], s[i].n_prompt, &res);
        assert_true(res.reason == DS_FINISH_NONE || res.n == 300); /* aborted, unless done */
        ds_request_cancel(r[i]);
        ds_request_release(r[i]);
    }
    for (int i = 0; i < NREAD; i++) ds_request_release(r[i]);
    fixture_close(&f);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_greedy_batched_equals_solo_moe),
        cmocka_unit_test(test_greedy_batched_equals_solo_dense),
        cmocka_unit_test(test_sampled_batched_equals_solo),
        cmocka_unit_test(test_preemption_keeps_results),
        cmocka_unit_test(test_cancel_frees_caches),
        cmocka_unit_test(test_submit_errors),
        cmocka_unit_test(test_stop_conditions),
        cmocka_unit_test(test_destroy_in_flight),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
