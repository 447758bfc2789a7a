/* test_cpu_attention.c — CPU gated attention over a paged KV cache against a naive contiguous
 * double-precision reference: shuffled block tables, prefill + decode == one pass, two sequences
 * in one batch == each alone, with and without the output gate. */
#include "test_cpu_common.h"

typedef struct attn_case {
    ds_config cfg;
    float *q_norm, *k_norm; /* [hd] (1+w) */
    ds_attn_weights w;
    int64_t width;
} attn_case;

static void case_init(attn_case *ac, test_rng *rng, int nh, int nkv, int hd, int rot, double theta,
                      bool gated) {
    memset(ac, 0, sizeof *ac);
    ds_config *c = &ac->cfg;
    c->n_layers = 2;
    c->layer_types[0] = DS_LAYER_FULL_ATTN;
    c->layer_types[1] = DS_LAYER_FULL_ATTN;
    c->n_heads = nh;
    c->n_kv_heads = nkv;
    c->head_dim = hd;
    c->rot_dim = rot;
    c->rope_theta = theta;
    c->rms_eps = 1e-6;
    c->attn_output_gate = gated;
    ac->q_norm = tc_rand_host(rng, (size_t)hd, 0.5f);
    ac->k_norm = tc_rand_host(rng, (size_t)hd, 0.5f);
    for (int i = 0; i < hd; i++) {
        ac->q_norm[i] += 1.0f;
        ac->k_norm[i] += 1.0f;
    }
    ac->w.q_norm = tc_tensor1(ac->q_norm, DS_DTYPE_F32, hd);
    ac->w.k_norm = tc_tensor1(ac->k_norm, DS_DTYPE_F32, hd);
    ac->width = (int64_t)nh * hd * (gated ? 2 : 1) + 2 * (int64_t)nkv * hd;
}

static void case_free(attn_case *ac) {
    free(ac->q_norm);
    free(ac->k_norm);
}

/* ---- the reference: one sequence at positions 0..N-1, contiguous, double ------------------- */

static void ref_norm_rope(const float *x, const float *w, double eps, int hd, int rot, double theta,
                          int pos, double *out) {
    double ss = 0;
    for (int i = 0; i < hd; i++) ss += (double)x[i] * x[i];
    double s = 1.0 / sqrt(ss / hd + eps);
    for (int i = 0; i < hd; i++) out[i] = x[i] * s * w[i];
    for (int i = 0; i < rot / 2; i++) {
        /* the angle is specified in float32: inv_freq as PyTorch builds it, pos·inv_freq in fp32 */
        float inv = 1.0f / powf((float)theta, (float)(2 * i) / (float)rot);
        float ang = (float)pos * inv;
        double c = cos((double)ang), sn = sin((double)ang);
        double x1 = out[i], x2 = out[i + rot / 2];
        out[i] = x1 * c - x2 * sn;
        out[i + rot / 2] = x2 * c + x1 * sn;
    }
}

static void ref_attention(const attn_case *ac, const float *qkv, int N, double *out) {
    const ds_config *c = &ac->cfg;
    int nh = c->n_heads, nkv = c->n_kv_heads, hd = c->head_dim,
        qw = c->attn_output_gate ? 2 * hd : hd;
    double *K = malloc(sizeof(double) * (size_t)N * nkv * hd),
           *V = malloc(sizeof(double) * (size_t)N * nkv * hd);
    double *q = malloc(sizeof(double) * hd), *p = malloc(sizeof(double) * N);
    for (int t = 0; t < N; t++)
        for (int g = 0; g < nkv; g++) {
            const float *row = qkv + (size_t)t * ac->width;
            ref_norm_rope(row + nh * qw + g * hd, ac->k_norm, c->rms_eps, hd, c->rot_dim,
                          c->rope_theta, t, K + ((size_t)t * nkv + g) * hd);
            for (int d = 0; d < hd; d++)
                V[((size_t)t * nkv + g) * hd + d] = row[nh * qw + nkv * hd + g * hd + d];
        }
    for (int t = 0; t < N; t++) {
        const float *row = qkv + (size_t)t * ac->width;
        for (int h = 0; h < nh; h++) {
            int g = h / (nh / nkv);
            ref_norm_rope(row + h * qw, ac->q_norm, c->rms_eps, hd, c->rot_dim, c->rope_theta, t,
                          q);
            double m = -INFINITY, sum = 0;
            for (int j = 0; j <= t; j++) {
                double s = 0;
                for (int d = 0; d < hd; d++) s += q[d] * K[((size_t)j * nkv + g) * hd + d];
                p[j] = s / sqrt((double)hd);
                m = p[j] > m ? p[j] : m;
            }
            for (int j = 0; j <= t; j++) sum += (p[j] = exp(p[j] - m));
            for (int d = 0; d < hd; d++) {
                double o = 0;
                for (int j = 0; j <= t; j++) o += p[j] / sum * V[((size_t)j * nkv + g) * hd + d];
                if (c->attn_output_gate) o *= 1.0 / (1.0 + exp(-(double)row[h * qw + hd + d]));
                out[(size_t)t * nh * hd + h * hd + d] = o;
            }
        }
    }
    free(K);
    free(V);
    free(q);
    free(p);
}

/* ---- running the backend ------------------------------------------------------------------- */

static ds_cache *make_cache(ds_backend *be, const ds_config *cfg, int n_blocks, int bs) {
    ds_cache_desc d = {.n_slots = 4, .n_blocks = n_blocks, .block_size = bs};
    ds_cache *c = NULL;
    ds_error err = {0};
    assert_int_equal(be->ops->cache_create(be, cfg, &d, &c, &err), DS_OK);
    return c;
}

/* One step over several sequences; qkv rows of each sequence's new tokens are taken from
 * seq_qkv[s] starting at row n_past[s]; outputs go to seq_out[s] rows n_past[s]... */
static void run_step(ds_backend *be, ds_cache *cache, const attn_case *ac, int layer, int n_seqs,
                     const int *n_past, const int *n_new, const int32_t *const *tables,
                     int max_blocks, const float *const *seq_qkv, float *const *seq_out) {
    const ds_config *c = &ac->cfg;
    int slots[TC_MAX_SEQS] = {0};
    tc_batch *tb = malloc(sizeof *tb);
    tc_batch_init(tb, n_seqs, n_past, n_new, slots, tables, max_blocks);
    int T = tb->b.n_tokens;
    int64_t ow = (int64_t)c->n_heads * c->head_dim;
    float *qkv = tc_zero_act(be, (size_t)T * ac->width), *out = tc_zero_act(be, (size_t)T * ow);
    for (int s = 0; s < n_seqs; s++)
        memcpy(qkv + (size_t)tb->seq_start[s] * ac->width,
               seq_qkv[s] + (size_t)n_past[s] * ac->width,
               sizeof(float) * (size_t)n_new[s] * ac->width);
    be->ops->set_batch(be, &tb->b);
    ds_tensor tq = tc_tensor2(qkv, DS_DTYPE_F32, T, ac->width),
              to = tc_tensor2(out, DS_DTYPE_F32, T, ow);
    be->ops->attention(be, cache, layer, c, &ac->w, &tq, &to);
    for (int s = 0; s < n_seqs; s++)
        memcpy(seq_out[s] + (size_t)n_past[s] * ow, out + (size_t)tb->seq_start[s] * ow,
               sizeof(float) * (size_t)n_new[s] * ow);
    be->ops->free(be, qkv);
    be->ops->free(be, out);
    free(tb);
}

static void shuffled_table(test_rng *rng, int32_t *table, int n) {
    for (int i = 0; i < n; i++) table[i] = i;
    for (int i = n - 1; i > 0; i--) {
        int j = (int)((test_rng_uniform(rng) * 0.5f + 0.5f) * (float)(i + 1));
        if (j > i) j = i;
        int32_t t = table[i];
        table[i] = table[j];
        table[j] = t;
    }
}

static double check_single_pass(int nh, int nkv, int hd, int rot, double theta, bool gated, int N,
                                int bs) {
    test_rng rng = {.s = 0xabcdefull + (uint64_t)(N * 31 + hd)};
    attn_case ac;
    case_init(&ac, &rng, nh, nkv, hd, rot, theta, gated);
    ds_backend *be = tc_backend(2);
    int n_blocks = (N + bs - 1) / bs + 5;
    ds_cache *cache = make_cache(be, &ac.cfg, n_blocks, bs);
    int32_t *table = malloc(sizeof(int32_t) * (size_t)n_blocks);
    shuffled_table(&rng, table, n_blocks);
    float *qkv = tc_rand_host(&rng, (size_t)N * ac.width, 2.0f);
    int64_t ow = (int64_t)nh * hd;
    float *out = malloc(sizeof(float) * (size_t)N * ow);
    double *ref = malloc(sizeof(double) * (size_t)N * ow);
    int past[] = {0}, nn[] = {N};
    const int32_t *tabs[] = {table};
    const float *sq[] = {qkv};
    float *so[] = {out};
    run_step(be, cache, &ac, 1, 1, past, nn, tabs, n_blocks, sq, so);
    ref_attention(&ac, qkv, N, ref);
    double rel = tc_rel_l2_d(out, ref, (size_t)N * ow);
    assert_true(rel <= TC_TOL);
    be->ops->cache_free(be, cache);
    be->ops->destroy(be);
    free(table);
    free(qkv);
    free(out);
    free(ref);
    case_free(&ac);
    return rel;
}

static void test_attention_single_pass(void **state) {
    (void)state;
    double r1 = check_single_pass(4, 2, 32, 8, 10000.0, true, 37, 4);
    double r2 = check_single_pass(4, 1, 16, 16, 100.0, false, 29, 3);
    double r3 = check_single_pass(16, 2, 256, 64, 1e7, true, 130, 16);
    printf("attention rel L2 vs naive (shuffled blocks): small %.2e, no gate %.2e, "
           "35B-like heads %.2e\n",
           r1, r2, r3);
}

static void test_attention_prefill_then_decode(void **state) {
    (void)state;
    test_rng rng = {.s = 4242};
    attn_case ac;
    case_init(&ac, &rng, 4, 2, 32, 8, 10000.0, true);
    ds_backend *be = tc_backend(2);
    const int N = 30, bs = 4, n_blocks = 12;
    int32_t table[12];
    shuffled_table(&rng, table, n_blocks);
    int64_t ow = 4 * 32;
    float *qkv = tc_rand_host(&rng, (size_t)N * ac.width, 2.0f);
    float *one = malloc(sizeof(float) * (size_t)N * ow),
          *steps = malloc(sizeof(float) * (size_t)N * ow);
    const int32_t *tabs[] = {table};
    const float *sq[] = {qkv};

    ds_cache *c1 = make_cache(be, &ac.cfg, n_blocks, bs);
    int p0[] = {0}, nN[] = {N};
    float *so1[] = {one};
    run_step(be, c1, &ac, 0, 1, p0, nN, tabs, n_blocks, sq, so1);

    /* prefill 10, chunked prefill 13, then single-token decodes */
    ds_cache *c2 = make_cache(be, &ac.cfg, n_blocks, bs);
    float *so2[] = {steps};
    int past = 0;
    int sizes[] = {10, 13, 1, 1, 1, 1, 1, 1, 1};
    for (int i = 0; i < 9; i++) {
        int pp[] = {past}, nn[] = {sizes[i]};
        run_step(be, c2, &ac, 0, 1, pp, nn, tabs, n_blocks, sq, so2);
        past += sizes[i];
    }
    assert_int_equal(past, N);
    double rel = test_rel_l2(steps, one, (size_t)N * ow);
    double *ref = malloc(sizeof(double) * (size_t)N * ow);
    ref_attention(&ac, qkv, N, ref);
    double rel_ref = tc_rel_l2_d(steps, ref, (size_t)N * ow);
    printf("attention prefill+decode vs one pass: rel %.2e (%s); vs naive %.2e\n", rel,
           memcmp(steps, one, sizeof(float) * (size_t)N * ow) == 0 ? "bit-identical" : "differs",
           rel_ref);
    assert_true(rel <= 1e-6);
    assert_true(rel_ref <= TC_TOL);
    be->ops->cache_free(be, c1);
    be->ops->cache_free(be, c2);
    be->ops->destroy(be);
    free(qkv);
    free(one);
    free(steps);
    free(ref);
    case_free(&ac);
}

static void test_attention_two_sequences(void **state) {
    (void)state;
    test_rng rng = {.s = 777};
    attn_case ac;
    case_init(&ac, &rng, 6, 2, 16, 8, 5000.0, true);
    ds_backend *be = tc_backend(2);
    const int bs = 4, n_blocks = 16, max_blocks = 8;
    int32_t perm[16];
    shuffled_table(&rng, perm, n_blocks);
    const int32_t *tA = perm, *tB = perm + 8; /* disjoint block sets */
    const int NA = 20, NB = 15;
    int64_t ow = 6 * 16;
    float *qa = tc_rand_host(&rng, (size_t)NA * ac.width, 2.0f),
          *qb = tc_rand_host(&rng, (size_t)NB * ac.width, 2.0f);
    float *oa_alone = malloc(sizeof(float) * NA * ow), *ob_alone = malloc(sizeof(float) * NB * ow);
    float *oa_batch = malloc(sizeof(float) * NA * ow), *ob_batch = malloc(sizeof(float) * NB * ow);

    /* alone: A = 12 then 8 tokens; B = 15 tokens */
    ds_cache *c1 = make_cache(be, &ac.cfg, n_blocks, bs);
    {
        int p[] = {0}, n[] = {12};
        const int32_t *t[] = {tA};
        const float *q[] = {qa};
        float *o[] = {oa_alone};
        run_step(be, c1, &ac, 0, 1, p, n, t, max_blocks, q, o);
        int p2[] = {12}, n2[] = {8};
        run_step(be, c1, &ac, 0, 1, p2, n2, t, max_blocks, q, o);
        const int32_t *tb[] = {tB};
        const float *qbb[] = {qb};
        float *ob[] = {ob_alone};
        int p3[] = {0}, n3[] = {NB};
        run_step(be, c1, &ac, 0, 1, p3, n3, tb, max_blocks, qbb, ob);
    }
    /* batched: A's first 12 alone, then A's 8 + B's 15 in one step */
    ds_cache *c2 = make_cache(be, &ac.cfg, n_blocks, bs);
    {
        int p[] = {0}, n[] = {12};
        const int32_t *t[] = {tA};
        const float *q[] = {qa};
        float *o[] = {oa_batch};
        run_step(be, c2, &ac, 0, 1, p, n, t, max_blocks, q, o);
        int p2[] = {12, 0}, n2[] = {8, NB};
        const int32_t *t2[] = {tA, tB};
        const float *q2[] = {qa, qb};
        float *o2[] = {oa_batch, ob_batch};
        run_step(be, c2, &ac, 0, 2, p2, n2, t2, max_blocks, q2, o2);
    }
    double ra = test_rel_l2(oa_batch, oa_alone, (size_t)NA * ow),
           rb = test_rel_l2(ob_batch, ob_alone, (size_t)NB * ow);
    printf("attention two sequences batched vs alone: rel %.2e / %.2e\n", ra, rb);
    assert_true(ra <= 1e-6 && rb <= 1e-6);
    double *ref = malloc(sizeof(double) * NA * ow);
    ref_attention(&ac, qa, NA, ref);
    assert_true(tc_rel_l2_d(oa_batch, ref, (size_t)NA * ow) <= TC_TOL);
    ref_attention(&ac, qb, NB, ref);
    assert_true(tc_rel_l2_d(ob_batch, ref, (size_t)NB * ow) <= TC_TOL);
    be->ops->cache_free(be, c1);
    be->ops->cache_free(be, c2);
    be->ops->destroy(be);
    free(ref);
    free(qa);
    free(qb);
    free(oa_alone);
    free(ob_alone);
    free(oa_batch);
    free(ob_batch);
    case_free(&ac);
}

static void test_cache_create_validation(void **state) {
    (void)state;
    test_rng rng = {.s = 1};
    attn_case ac;
    case_init(&ac, &rng, 4, 2, 32, 8, 10000.0, true);
    ds_backend *be = tc_backend(1);
    ds_cache_desc bad = {.n_slots = 0, .n_blocks = 4, .block_size = 16};
    ds_cache *c = NULL;
    ds_error err = {0};
    assert_int_equal(be->ops->cache_create(be, &ac.cfg, &bad, &c, &err), DS_ERR_INVALID_ARG);
    assert_null(c);
    assert_true(strlen(err.msg) > 0);
    ds_cache_desc huge = {.n_slots = 1, .n_blocks = 1 << 30, .block_size = 1 << 30};
    err = (ds_error){0};
    assert_int_not_equal(be->ops->cache_create(be, &ac.cfg, &huge, &c, &err), DS_OK);
    assert_null(c);
    c = make_cache(be, &ac.cfg, 4, 16);
    assert_non_null(ds_cpu_cache_k(c, 1));
    assert_null(ds_cpu_cache_gdn_state(c, 1, 0));
    be->ops->cache_free(be, c);
    be->ops->destroy(be);
    case_free(&ac);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_attention_single_pass),
        cmocka_unit_test(test_attention_prefill_then_decode),
        cmocka_unit_test(test_attention_two_sequences),
        cmocka_unit_test(test_cache_create_validation),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
