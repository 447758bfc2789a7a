/* test_cpu_common.h — helpers shared by the CPU-backend tests (test_cpu_*.c): tensors, random
 * weights in a chosen dtype together with the exact values the backend will see, and a batch
 * builder. References live in each test file, written independently of the backend code. */
#ifndef DS_TEST_CPU_COMMON_H
#define DS_TEST_CPU_COMMON_H

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "testlib.h"

#include "backend/backend.h"
#include "backend/cpu/cpu_backend.h"

static inline ds_backend *tc_backend(int n_threads) {
    ds_backend *be = NULL;
    ds_error err = {0};
    ds_status st = ds_backend_cpu_create(n_threads, &be, &err);
    if (st != DS_OK) fprintf(stderr, "cpu backend: %s\n", err.msg);
    assert_int_equal(st, DS_OK);
    return be;
}

static inline ds_tensor tc_tensor2(void *data, ds_dtype dt, int64_t rows, int64_t cols) {
    ds_tensor t = {.data = data, .dtype = dt, .ndim = 2, .ne = {rows, cols}};
    return t;
}

static inline ds_tensor tc_tensor1(void *data, ds_dtype dt, int64_t n) {
    ds_tensor t = {.data = data, .dtype = dt, .ndim = 1, .ne = {n}};
    return t;
}

/* Backend F32 buffer of n floats filled with uniform [-scale, scale). */
static inline float *tc_rand_act(ds_backend *be, test_rng *rng, size_t n, float scale) {
    float *p = be->ops->alloc(be, n * sizeof(float));
    assert_non_null(p);
    for (size_t i = 0; i < n; i++) p[i] = test_rng_uniform(rng) * scale;
    return p;
}

static inline float *tc_zero_act(ds_backend *be, size_t n) {
    float *p = be->ops->alloc(be, n * sizeof(float));
    assert_non_null(p);
    return p;
}

static inline float *tc_rand_host(test_rng *rng, size_t n, float scale) {
    float *p = malloc(n * sizeof(float));
    assert_non_null(p);
    for (size_t i = 0; i < n; i++) p[i] = test_rng_uniform(rng) * scale;
    return p;
}

/* A random [N, K] weight in dtype dt (malloc'd data) plus `exact` [N, K]: the f32 values the
 * stored dtype really holds, for the reference. Free both with free(t.data), free(exact). */
static inline ds_tensor tc_rand_weight(test_rng *rng, ds_dtype dt, int64_t N, int64_t K,
                                       float scale, float **exact) {
    size_t n = (size_t)(N * K);
    float *ex = malloc(n * sizeof(float));
    void *data = malloc(n * ds_dtype_size(dt));
    assert_non_null(ex);
    assert_non_null(data);
    for (size_t i = 0; i < n; i++) {
        float v = test_rng_uniform(rng) * scale;
        switch (dt) {
        case DS_DTYPE_BF16:
            ((uint16_t *)data)[i] = ds_f32_to_bf16(v);
            ex[i] = ds_bf16_to_f32(((uint16_t *)data)[i]);
            break;
        case DS_DTYPE_F16:
            ((uint16_t *)data)[i] = ds_f32_to_f16(v);
            ex[i] = ds_f16_to_f32(((uint16_t *)data)[i]);
            break;
        default:
            ((float *)data)[i] = v;
            ex[i] = v;
            break;
        }
    }
    *exact = ex;
    return tc_tensor2(data, dt, N, K);
}

/* A batch with its own storage for up to TC_MAX_SEQS sequences. */
#define TC_MAX_SEQS   8
#define TC_MAX_TOKENS 1024
#define TC_MAX_BLOCKS 256

typedef struct tc_batch {
    ds_batch b;
    int32_t tokens[TC_MAX_TOKENS], positions[TC_MAX_TOKENS];
    int32_t seq_start[TC_MAX_SEQS + 1], seq_slot[TC_MAX_SEQS], seq_n_past[TC_MAX_SEQS];
    int32_t block_table[TC_MAX_SEQS * TC_MAX_BLOCKS];
    int32_t out_rows[TC_MAX_TOKENS];
} tc_batch;

/* n_seqs sequences: seq s has n_new[s] tokens at positions n_past[s]..; block table rows are
 * copied from tables[s] (max_blocks entries each; may be NULL when no attention runs). */
static inline void tc_batch_init(tc_batch *tb, int n_seqs, const int *n_past, const int *n_new,
                                 const int *slots, const int32_t *const *tables, int max_blocks) {
    memset(tb, 0, sizeof *tb);
    assert_true(n_seqs <= TC_MAX_SEQS && max_blocks <= TC_MAX_BLOCKS);
    int t = 0;
    for (int s = 0; s < n_seqs; s++) {
        tb->seq_start[s] = t;
        tb->seq_slot[s] = slots[s];
        tb->seq_n_past[s] = n_past[s];
        for (int i = 0; i < n_new[s]; i++, t++) {
            assert_true(t < TC_MAX_TOKENS);
            tb->positions[t] = n_past[s] + i;
            tb->tokens[t] = 0;
        }
        if (tables)
            memcpy(tb->block_table + s * max_blocks, tables[s],
                   (size_t)max_blocks * sizeof(int32_t));
    }
    tb->seq_start[n_seqs] = t;
    for (int i = 0; i < t; i++) tb->out_rows[i] = i;
    tb->b = (ds_batch){
        .n_tokens = t,
        .n_seqs = n_seqs,
        .tokens = tb->tokens,
        .positions = tb->positions,
        .seq_start = tb->seq_start,
        .seq_slot = tb->seq_slot,
        .seq_n_past = tb->seq_n_past,
        .block_table = tb->block_table,
        .max_blocks = max_blocks,
        .n_out = t,
        .out_rows = tb->out_rows,
    };
}

/* Relative L2 of float data against a double reference. */
static inline double tc_rel_l2_d(const float *a, const double *ref, size_t n) {
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        double d = (double)a[i] - ref[i];
        num += d * d;
        den += ref[i] * ref[i];
    }
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

#define TC_TOL 1e-5

#endif
