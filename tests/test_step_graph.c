/* test_step_graph.c — ds_step_graph_run (runtime/step_graph.h), the replay / record / eager
 * decision shared by the runner, speculative verification and bench, against a fake backend
 * whose graph ops only keep books: which keys were recorded, with which batch shape, and how
 * often the step's work really ran. The CUDA graphs themselves are tested on the GPU
 * (test_cuda_model, test_cuda_spec); this checks the fallback logic that decides when they run. */
#include <stdio.h>
#include <string.h>

#include "testlib.h"

#include "backend/backend.h"
#include "runtime/step_graph.h"

typedef struct fake {
    uint64_t keys[8];
    int n_tokens[8]; /* batch shape at recording */
    int n_keys;
    bool recording;
    uint64_t rec_key;
    int rec_tokens;
    bool fail_begin, fail_end; /* the next begin / end fails */
    bool rec_failed;           /* an op failed while recording: end fails, as a backend's does */
    int begins, ends, launches_ok, runs_live, runs_recorded;
} fake;

static fake *fk(ds_backend *be) { return (fake *)be->impl; }

static ds_status fake_begin(ds_backend *be, uint64_t key, ds_error *err) {
    fake *f = fk(be);
    f->begins++;
    if (f->fail_begin) {
        f->fail_begin = false;
        return ds_error_set(err, DS_ERR_DEVICE, "fake: cannot begin");
    }
    f->recording = true;
    f->rec_key = key;
    return DS_OK;
}

static ds_status fake_end(ds_backend *be, ds_error *err) {
    fake *f = fk(be);
    f->ends++;
    f->recording = false;
    if (f->fail_end || f->rec_failed) {
        f->fail_end = f->rec_failed = false;
        return ds_error_set(err, DS_ERR_UNSUPPORTED, "fake: capture refused");
    }
    f->keys[f->n_keys] = f->rec_key;
    f->n_tokens[f->n_keys++] = f->rec_tokens;
    f->runs_live++; /* graph_end runs the recording once: the step's work */
    return DS_OK;
}

static bool fake_launch(ds_backend *be, uint64_t key, const ds_batch *b) {
    fake *f = fk(be);
    for (int i = 0; i < f->n_keys; i++)
        if (f->keys[i] == key && f->n_tokens[i] == b->n_tokens) {
            f->launches_ok++;
            f->runs_live++;
            return true;
        }
    return false;
}

typedef struct work {
    ds_backend *be;
    const ds_batch *b;
    ds_status fail_with; /* DS_OK: succeed */
} work;

/* The step's work: during a recording it only counts as recorded, otherwise it ran. */
static ds_status step(void *ctx, ds_error *err) {
    work *w = ctx;
    fake *f = fk(w->be);
    if (w->fail_with != DS_OK) {
        if (f->recording) f->rec_failed = true;
        return ds_error_set(err, w->fail_with, "step failed");
    }
    if (f->recording) {
        f->runs_recorded++;
        f->rec_tokens = w->b->n_tokens;
    } else {
        f->runs_live++;
    }
    return DS_OK;
}

static ds_backend_ops g_ops_graphs = {.name = "fake", .graph_begin = fake_begin,
                                      .graph_end = fake_end, .graph_launch = fake_launch};
static ds_backend_ops g_ops_plain = {.name = "fake-no-graphs"};

/* record once, then replay; another shape under the same key is not replayed */
static void test_record_then_replay(void **state) {
    (void)state;
    fake f = {0};
    ds_backend be = {&g_ops_graphs, &f};
    ds_batch b = {.n_tokens = 3};
    work w = {&be, &b, DS_OK};
    signed char st = 0;
    ds_error err = {0}, why = {0};
    assert_int_equal(ds_step_graph_run(&be, 7, &st, &b, step, &w, &why, &err), DS_OK);
    assert_int_equal(st, 1);
    assert_int_equal(f.begins, 1);
    assert_int_equal(f.runs_recorded, 1);
    assert_int_equal(f.runs_live, 1); /* the recording's own run, nothing eager */
    for (int i = 0; i < 5; i++)
        assert_int_equal(ds_step_graph_run(&be, 7, &st, &b, step, &w, &why, &err), DS_OK);
    assert_int_equal(f.launches_ok, 5);
    assert_int_equal(f.begins, 1);
    assert_int_equal(f.runs_live, 6); /* every step ran exactly once */
    assert_int_equal(why.msg[0], 0);
    /* a batch of another shape under the same key and a captured state: eager, no new capture */
    ds_batch b2 = {.n_tokens = 4};
    w.b = &b2;
    assert_int_equal(ds_step_graph_run(&be, 7, &st, &b2, step, &w, &why, &err), DS_OK);
    assert_int_equal(f.begins, 1);
    assert_int_equal(f.runs_live, 7);
}

/* a refused capture: the step runs eagerly at once, the reason is reported, never retried */
static void test_refused_capture(void **state) {
    (void)state;
    fake f = {.fail_end = true};
    ds_backend be = {&g_ops_graphs, &f};
    ds_batch b = {.n_tokens = 2};
    work w = {&be, &b, DS_OK};
    signed char st = 0;
    ds_error err = {0}, why = {0};
    assert_int_equal(ds_step_graph_run(&be, 9, &st, &b, step, &w, &why, &err), DS_OK);
    assert_int_equal(st, -1);
    assert_non_null(strstr(why.msg, "capture refused"));
    assert_int_equal(err.msg[0], 0); /* the caller's error stays clean */
    assert_int_equal(f.runs_live, 1);  /* the eager run after the failed recording */
    for (int i = 0; i < 3; i++)
        assert_int_equal(ds_step_graph_run(&be, 9, &st, &b, step, &w, NULL, &err), DS_OK);
    assert_int_equal(f.begins, 1);
    assert_int_equal(f.ends, 1);
    assert_int_equal(f.runs_live, 4);
    /* begin itself failing is handled the same way */
    fake f2 = {.fail_begin = true};
    ds_backend be2 = {&g_ops_graphs, &f2};
    w.be = &be2;
    signed char st2 = 0;
    assert_int_equal(ds_step_graph_run(&be2, 9, &st2, &b, step, &w, &why, &err), DS_OK);
    assert_int_equal(st2, -1);
    assert_non_null(strstr(why.msg, "cannot begin"));
    assert_int_equal(f2.ends, 0);
    assert_int_equal(f2.runs_live, 1);
}

/* a step that fails for real fails during the recording and again eagerly: the error returns */
static void test_failing_step(void **state) {
    (void)state;
    fake f = {0};
    ds_backend be = {&g_ops_graphs, &f};
    ds_batch b = {.n_tokens = 1};
    work w = {&be, &b, DS_ERR_INVALID_ARG};
    signed char st = 0;
    ds_error err = {0};
    assert_int_equal(ds_step_graph_run(&be, 1, &st, &b, step, &w, NULL, &err), DS_ERR_INVALID_ARG);
    assert_int_equal(st, -1);
    assert_int_equal(f.ends, 1); /* the recording was closed */
    assert_int_equal(f.n_keys, 0);
    assert_non_null(strstr(err.msg, "step failed"));
}

/* a backend without graph ops: always eager, the state untouched */
static void test_no_graph_ops(void **state) {
    (void)state;
    fake f = {0};
    ds_backend be = {&g_ops_plain, &f};
    ds_batch b = {.n_tokens = 2};
    work w = {&be, &b, DS_OK};
    signed char st = 0;
    ds_error err = {0};
    for (int i = 0; i < 3; i++)
        assert_int_equal(ds_step_graph_run(&be, 5, &st, &b, step, &w, NULL, &err), DS_OK);
    assert_int_equal(st, 0);
    assert_int_equal(f.runs_live, 3);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_record_then_replay),
        cmocka_unit_test(test_refused_capture),
        cmocka_unit_test(test_failing_step),
        cmocka_unit_test(test_no_graph_ops),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
