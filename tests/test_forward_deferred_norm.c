/* forward.c's deferred norm, on the CPU (CI has no GPU): a backend whose moe_sublayer leaves
 * the norm after the MoE block to the next layer's input projection (linear_rmsnorm), as the
 * CUDA backend does for one-token steps with DS_CUDA_MOE_DOWN_COMBINE=1. The wrapper is the CPU
 * backend with those two optional ops added from its own ops, and with the normed rows it
 * declines to deliver poisoned (NaN): the logits must equal the plain CPU backend's bit for bit,
 * every deferred norm must be taken up by exactly one linear_rmsnorm, and none may follow the
 * last layer (the lm_head reads that norm). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "model/loader.h"
#include "model/model.h"
#include "runtime/session.h"
#include "testlib.h"

static const ds_backend_ops *g_cpu_ops; /* the wrapped CPU backend's own table */
static ds_backend_ops g_deferring_ops;
static int g_deferred, g_norms_taken, g_sublayers;

static bool deferring_moe_sublayer(ds_backend *be, const ds_config *cfg, const ds_moe_weights *w,
                                   ds_tensor *residual, ds_tensor *delta, const ds_tensor *post_norm_w,
                                   const ds_tensor *next_norm_w, float eps, ds_tensor *out,
                                   bool may_defer_norm) {
    g_sublayers++;
    g_cpu_ops->add_rmsnorm(be, residual, delta, post_norm_w, eps, out);
    g_cpu_ops->moe(be, cfg, w, out, delta);
    g_cpu_ops->add_rmsnorm(be, residual, delta, next_norm_w, eps, out);
    if (!may_defer_norm) return false;
    /* not delivered: any read of it before linear_rmsnorm rewrites it turns the logits NaN */
    memset(out->data, 0xff, ds_tensor_nbytes(out));
    g_deferred++;
    return true;
}

static void deferring_linear_rmsnorm(ds_backend *be, const ds_tensor *residual, const ds_tensor *norm_w,
                                     float eps, ds_tensor *normed, const ds_linear *w, ds_tensor *out) {
    g_norms_taken++;
    g_cpu_ops->rmsnorm(be, residual, norm_w, eps, normed);
    g_cpu_ops->linear(be, normed, w, out);
}

typedef struct run {
    ds_backend *be;
    ds_model model;
    ds_session sess;
} run;

static void run_open(run *r, const ds_config *cfg, const ds_model_weights *host, bool deferring) {
    ds_error err = {0};
    assert_int_equal(ds_backend_cpu_create(2, &r->be, &err), DS_OK);
    if (deferring) {
        g_cpu_ops = r->be->ops;
        g_deferring_ops = *r->be->ops;
        g_deferring_ops.moe_sublayer = deferring_moe_sublayer;
        g_deferring_ops.linear_rmsnorm = deferring_linear_rmsnorm;
        r->be->ops = &g_deferring_ops;
    }
    if (ds_model_init(&r->model, r->be, cfg, host, 64, 64, &err) != DS_OK) fail_msg("model init: %s", err.msg);
    if (ds_session_init(&r->sess, &r->model, 1, 256, &err) != DS_OK) fail_msg("session init: %s", err.msg);
}

static void run_close(run *r) {
    ds_session_free(&r->sess);
    ds_model_free(&r->model);
    r->be->ops->destroy(r->be);
}

/* Feeds ids through both runs (a prefill of n_prompt, then one token a step) and compares every
 * step's last logits bit for bit. */
static void check_model(const char *name) {
    char dir[1024];
    snprintf(dir, sizeof dir, "%s/models/%s", test_data_dir(), name);
    ds_config cfg;
    ds_model_weights host;
    ds_error err = {0};
    if (ds_model_load(dir, &cfg, &host, &err) != DS_OK) fail_msg("load %s: %s", dir, err.msg);
    assert_true(cfg.is_moe && cfg.n_layers >= 2);
    run plain, deferring;
    run_open(&plain, &cfg, &host, false);
    run_open(&deferring, &cfg, &host, true);
    g_deferred = g_norms_taken = g_sublayers = 0;
    const int V = cfg.vocab, n_prompt = 9, n_steps = 6;
    float *a = malloc(sizeof(float) * (size_t)V), *b = malloc(sizeof(float) * (size_t)V);
    int32_t ids[9];
    for (int i = 0; i < n_prompt; i++) ids[i] = (int32_t)((i * 37 + 5) % V);
    size_t differ = 0;
    for (int s = 0; s <= n_steps; s++) {
        const int32_t *in = s == 0 ? ids : &ids[s % n_prompt];
        const int n = s == 0 ? n_prompt : 1;
        assert_int_equal(ds_session_feed(&plain.sess, 0, in, n, false, a, &err), DS_OK);
        assert_int_equal(ds_session_feed(&deferring.sess, 0, in, n, false, b, &err), DS_OK);
        for (int v = 0; v < V; v++) differ += memcmp(&a[v], &b[v], sizeof(float)) != 0 || isnan(b[v]);
    }
    /* every MoE layer but the last defers in each of the 1 + n_steps forwards */
    const int forwards = 1 + n_steps;
    print_message("%s: %d forwards, %d sublayers, %d norms deferred, %d taken up, %zu logits differ\n",
                  name, forwards, g_sublayers, g_deferred, g_norms_taken, differ);
    assert_int_equal(g_sublayers, forwards * cfg.n_layers);
    assert_int_equal(g_deferred, forwards * (cfg.n_layers - 1));
    assert_int_equal(g_norms_taken, g_deferred);
    assert_int_equal(differ, 0);
    free(a);
    free(b);
    run_close(&plain);
    run_close(&deferring);
    ds_model_weights_free(&host);
}

static void test_moe(void **st) {
    (void)st;
    check_model("tiny-moe");
}

static void test_moe_with_mtp_weights(void **st) {
    (void)st;
    check_model("tiny-moe-mtp");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_moe),
        cmocka_unit_test(test_moe_with_mtp_weights),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
