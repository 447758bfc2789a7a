/* The whole model on the CPU backend against Hugging Face transformers' fp32 reference
 * (tools/make_fixtures.py): teacher-forced logits per sequence within relative L2 1e-4, and
 * 48-token greedy continuations identical, for every committed fixture model (MoE with both
 * expert layouts, sharded, dense with tied embeddings). */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "model/loader.h"
#include "model/model.h"
#include "runtime/session.h"
#include "testlib.h"

#define REL_TOL 1e-4

typedef struct fixture {
    ds_config cfg;
    ds_model_weights host;
    ds_backend *be;
    ds_model model;
    ds_session sess;
} fixture;

static void fixture_open(fixture *f, const char *model_name, int max_tokens, int max_out) {
    char dir[1024];
    snprintf(dir, sizeof dir, "%s/models/%s", test_data_dir(), model_name);
    ds_error err = {0};
    if (ds_model_load(dir, &f->cfg, &f->host, &err) != DS_OK) fail_msg("load %s: %s", dir, err.msg);
    assert_int_equal(ds_backend_cpu_create(2, &f->be, &err), DS_OK);
    if (ds_model_init(&f->model, f->be, &f->cfg, &f->host, max_tokens, max_out, &err) != DS_OK)
        fail_msg("model init: %s", err.msg);
    if (ds_session_init(&f->sess, &f->model, 1, 512, &err) != DS_OK)
        fail_msg("session init: %s", err.msg);
}

static void fixture_close(fixture *f) {
    ds_session_free(&f->sess);
    ds_model_free(&f->model);
    f->be->ops->destroy(f->be);
    ds_model_weights_free(&f->host);
}

/* Teacher-forced logits of every reference sequence. `step` is the session's max tokens per
 * step, so small values exercise chunked prefill across steps. */
static void check_teacher_forced(const char *model_name, const char *ref_name, int step) {
    fixture f;
    fixture_open(&f, model_name, step, step);
    cJSON *ref = test_load_ref(ref_name);
    const int V = f.cfg.vocab;
    assert_int_equal(V, cJSON_GetObjectItem(ref, "vocab")->valueint);
    const cJSON *seq;
    double worst = 0;
    cJSON_ArrayForEach(seq, cJSON_GetObjectItem(ref, "sequences")) {
        int n;
        int32_t *ids = test_json_ids(cJSON_GetObjectItem(seq, "tokens"), &n);
        float *want = test_load_ref_f32(cJSON_GetObjectItem(seq, "file")->valuestring, (size_t)n * V);
        float *got = malloc(sizeof(float) * (size_t)n * V);
        ds_session_reset(&f.sess, 0);
        ds_error err = {0};
        if (ds_session_feed(&f.sess, 0, ids, n, true, got, &err) != DS_OK)
            fail_msg("feed: %s", err.msg);
        /* per-sequence relative L2 over the whole [n, V] block, and per row for diagnosis */
        double rel = test_rel_l2(got, want, (size_t)n * V);
        if (rel > worst) worst = rel;
        if (rel > REL_TOL) {
            for (int p = 0; p < n; p++) {
                double r = test_rel_l2(got + (size_t)p * V, want + (size_t)p * V, (size_t)V);
                if (r > REL_TOL) {
                    print_error("%s %s: first bad row %d rel %.3g\n", model_name,
                                cJSON_GetObjectItem(seq, "name")->valuestring, p, r);
                    break;
                }
            }
            fail_msg("%s %s: rel L2 %.3g > %g", model_name,
                     cJSON_GetObjectItem(seq, "name")->valuestring, rel, REL_TOL);
        }
        free(ids);
        free(want);
        free(got);
    }
    print_message("%s (step %d): worst rel L2 over all sequences %.3g\n", model_name, step, worst);
    cJSON_Delete(ref);
    fixture_close(&f);
}

/* Greedy continuation token by token through the caches (prefill then 1-token decode steps). */
static void check_greedy(const char *model_name, const char *ref_name) {
    fixture f;
    fixture_open(&f, model_name, 64, 1);
    cJSON *ref = test_load_ref(ref_name);
    const int V = f.cfg.vocab;
    float *logits = malloc(sizeof(float) * (size_t)V);
    const cJSON *g;
    cJSON_ArrayForEach(g, cJSON_GetObjectItem(ref, "greedy")) {
        int n_prompt, n_gen;
        int32_t *prompt = test_json_ids(cJSON_GetObjectItem(g, "prompt"), &n_prompt);
        int32_t *want = test_json_ids(cJSON_GetObjectItem(g, "generated"), &n_gen);
        ds_session_reset(&f.sess, 0);
        ds_error err = {0};
        assert_int_equal(ds_session_feed(&f.sess, 0, prompt, n_prompt, false, logits, &err), DS_OK);
        for (int i = 0; i < n_gen; i++) {
            int best = 0;
            for (int v = 1; v < V; v++)
                if (logits[v] > logits[best]) best = v;
            if (best != want[i])
                fail_msg("%s %s: token %d: got %d want %d", model_name,
                         cJSON_GetObjectItem(g, "name")->valuestring, i, best, want[i]);
            int32_t tok = best;
            assert_int_equal(ds_session_feed(&f.sess, 0, &tok, 1, false, logits, &err), DS_OK);
        }
        free(prompt);
        free(want);
    }
    free(logits);
    cJSON_Delete(ref);
    fixture_close(&f);
}

static void test_moe_logits(void **st) { (void)st; check_teacher_forced("tiny-moe", "tiny-moe", 512); }
static void test_moe_logits_small_steps(void **st) {
    (void)st;
    check_teacher_forced("tiny-moe", "tiny-moe", 37);
}
static void test_moe_fused_logits(void **st) {
    (void)st;
    check_teacher_forced("tiny-moe-fused", "tiny-moe", 512);
}
static void test_moe_sharded_logits(void **st) {
    (void)st;
    check_teacher_forced("tiny-moe-sharded", "tiny-moe", 512);
}
static void test_dense_logits(void **st) { (void)st; check_teacher_forced("tiny-dense", "tiny-dense", 512); }
static void test_dense_logits_small_steps(void **st) {
    (void)st;
    check_teacher_forced("tiny-dense", "tiny-dense", 20);
}
static void test_moe_greedy(void **st) { (void)st; check_greedy("tiny-moe", "tiny-moe"); }
static void test_moe_fused_greedy(void **st) { (void)st; check_greedy("tiny-moe-fused", "tiny-moe"); }
static void test_dense_greedy(void **st) { (void)st; check_greedy("tiny-dense", "tiny-dense"); }

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_moe_logits),        cmocka_unit_test(test_moe_logits_small_steps),
        cmocka_unit_test(test_moe_fused_logits),  cmocka_unit_test(test_moe_sharded_logits),
        cmocka_unit_test(test_dense_logits),      cmocka_unit_test(test_dense_logits_small_steps),
        cmocka_unit_test(test_moe_greedy),        cmocka_unit_test(test_moe_fused_greedy),
        cmocka_unit_test(test_dense_greedy),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
