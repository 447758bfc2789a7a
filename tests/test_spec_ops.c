/* test_spec_ops.c — the backend additions speculative decoding needs, on the CPU backend:
 *  - ds_batch.state_out_slots: a sequence verified over n tokens in one GDN call with per-token
 *    snapshot slots gives the same outputs as n one-token calls in place, each snapshot slot holds
 *    exactly the in-place state after its token (conv history and recurrent state), its seq_slot
 *    is left untouched, slots of -1 entries are not written, and a second sequence of the same
 *    batch without snapshots still updates in place;
 *  - the concat op;
 *  - the token buffer: argmax_logits with keep_at keeps its ids there, a batch row with
 *    token_src ≥ 0 embeds that id instead of its tokens entry, keep_at = -1 leaves the buffer;
 *  - spec_accept and the pos_shift / out_shift lowering (spec_accept_case.h: the emitted counts,
 *    next tokens, lowered out rows, positions and n_past as specified);
 *  - spec_sample (spec_sample_case.h): greedy rows are the argmax; sampled rows, whatever
 *    their draft (likely, unlikely, outside top_k, none), are distributed as the target's
 *    processed distribution (chi-square over 13k seeded draws per group), drafts are accepted
 *    at the rate p(d), a wrong temperature or a missing top_k is detected, and the same seeds
 *    give the same ids. */
#include "test_cpu_common.h"

#include "spec_accept_case.h"
#include "spec_sample_case.h"

typedef struct gdn_fx {
    ds_config cfg;
    float *conv_w, *neg_exp_A, *dt_bias, *norm_w;
    ds_gdn_weights w;
    int conv_dim;
    int64_t width;
    size_t state_n, hist_n;
} gdn_fx;

static void fx_init(gdn_fx *f, test_rng *rng) {
    memset(f, 0, sizeof *f);
    ds_config *c = &f->cfg;
    c->n_layers = 1;
    c->layer_types[0] = DS_LAYER_LINEAR_ATTN;
    c->rms_eps = 1e-6;
    c->gdn_k_heads = 2;
    c->gdn_v_heads = 4;
    c->gdn_k_dim = 8;
    c->gdn_v_dim = 12;
    c->gdn_conv_kernel = 4;
    f->conv_dim = ds_config_gdn_conv_dim(c);
    f->width = f->conv_dim + 4 * 12 + 2 * 4;
    f->state_n = (size_t)4 * 8 * 12;
    f->hist_n = (size_t)f->conv_dim * 3;
    f->conv_w = tc_rand_host(rng, (size_t)f->conv_dim * 4, 0.6f);
    f->neg_exp_A = tc_rand_host(rng, 4, 0.5f);
    for (int h = 0; h < 4; h++) f->neg_exp_A[h] = -0.5f - fabsf(f->neg_exp_A[h]);
    f->dt_bias = tc_rand_host(rng, 4, 1.0f);
    f->norm_w = tc_rand_host(rng, 12, 0.3f);
    for (int e = 0; e < 12; e++) f->norm_w[e] += 1.0f;
    f->w.conv = tc_tensor2(f->conv_w, DS_DTYPE_F32, f->conv_dim, 4);
    f->w.neg_exp_A = tc_tensor1(f->neg_exp_A, DS_DTYPE_F32, 4);
    f->w.dt_bias = tc_tensor1(f->dt_bias, DS_DTYPE_F32, 4);
    f->w.norm = tc_tensor1(f->norm_w, DS_DTYPE_F32, 12);
}

static void fx_free(gdn_fx *f) {
    free(f->conv_w);
    free(f->neg_exp_A);
    free(f->dt_bias);
    free(f->norm_w);
}

/* One gdn call: sequences s with n[s] rows of proj (consecutive), slots[s]. */
static void gdn_call(ds_backend *be, ds_cache *cache, gdn_fx *f, int n_seqs, const int *n,
                     const int *slots, const int32_t *out_slots, const float *proj, float *out) {
    int past[TC_MAX_SEQS] = {0};
    tc_batch tb;
    tc_batch_init(&tb, n_seqs, past, n, slots, NULL, 1);
    tb.b.state_out_slots = out_slots;
    be->ops->set_batch(be, &tb.b);
    int T = tb.b.n_tokens;
    ds_tensor p = tc_tensor2((void *)proj, DS_DTYPE_F32, T, f->width);
    ds_tensor o = tc_tensor2(out, DS_DTYPE_F32, T, 4 * 12);
    be->ops->gdn(be, cache, 0, &f->cfg, &f->w, &p, &o);
}

static bool same(const float *a, const float *b, size_t n) {
    return memcmp(a, b, n * sizeof(float)) == 0;
}

static void test_gdn_state_snapshots(void **state) {
    (void)state;
    test_rng rng = {0x5eedULL};
    gdn_fx f;
    fx_init(&f, &rng);
    ds_backend *be = tc_backend(2);
    ds_error err = {0};
    /* slots: 0 = reference (in place), 1 = verified sequence's own state, 2..7 = snapshots,
     * 8 = the batch's second sequence, 9 = its reference */
    ds_cache_desc d = {.n_slots = 10, .n_blocks = 1, .block_size = 16};
    ds_cache *cache = NULL;
    assert_int_equal(be->ops->cache_create(be, &f.cfg, &d, &cache, &err), DS_OK);
    const int warm = 7, n = 5, n2 = 3;
    float *proj_warm = tc_rand_host(&rng, (size_t)warm * f.width, 1.0f);
    float *proj = tc_rand_host(&rng, (size_t)(n + n2) * f.width, 1.0f);
    float *out = tc_zero_act(be, (size_t)(warm + n + n2) * 48);
    float *ref_out = tc_zero_act(be, (size_t)(n + n2) * 48);

    /* the same history in slots 0, 1, 8, 9 (prefill of `warm` tokens) */
    int slots_w[1];
    int nw[1] = {warm};
    for (int s = 0; s < 4; s++) {
        const int sl[4] = {0, 1, 8, 9};
        slots_w[0] = sl[s];
        gdn_call(be, cache, &f, 1, nw, slots_w, NULL, proj_warm, out);
    }
    /* poison the snapshot slots so unwritten ones are recognisable */
    for (int s = 2; s < 8; s++) {
        float *st = ds_cpu_cache_gdn_state(cache, 0, s), *cv = ds_cpu_cache_gdn_conv(cache, 0, s);
        for (size_t i = 0; i < f.state_n; i++) st[i] = 777.0f;
        for (size_t i = 0; i < f.hist_n; i++) cv[i] = 777.0f;
    }
    float *own_state = malloc(f.state_n * sizeof(float)), *own_conv = malloc(f.hist_n * sizeof(float));
    memcpy(own_state, ds_cpu_cache_gdn_state(cache, 0, 1), f.state_n * sizeof(float));
    memcpy(own_conv, ds_cpu_cache_gdn_conv(cache, 0, 1), f.hist_n * sizeof(float));

    /* verification: seq A (slot 1) n tokens with snapshots 2,3,-1,5,6 (token 2 not kept); seq B
     * (slot 8) n2 tokens, no snapshots (all -1): in place */
    int32_t out_slots[8] = {2, 3, -1, 5, 6, -1, -1, -1};
    int ns[2] = {n, n2}, sl2[2] = {1, 8};
    gdn_call(be, cache, &f, 2, ns, sl2, out_slots, proj, out);

    /* reference: one token at a time in place on slot 0 (seq A) and slot 9 (seq B) */
    int one[1] = {1};
    for (int t = 0; t < n; t++) {
        int s0[1] = {0};
        gdn_call(be, cache, &f, 1, one, s0, NULL, proj + (size_t)t * f.width, ref_out + t * 48);
        if (out_slots[t] >= 0) {
            assert_true(same(ds_cpu_cache_gdn_state(cache, 0, out_slots[t]),
                             ds_cpu_cache_gdn_state(cache, 0, 0), f.state_n));
            assert_true(same(ds_cpu_cache_gdn_conv(cache, 0, out_slots[t]),
                             ds_cpu_cache_gdn_conv(cache, 0, 0), f.hist_n));
        }
    }
    int ns2[1] = {n2}, s9[1] = {9};
    gdn_call(be, cache, &f, 1, ns2, s9, NULL, proj + (size_t)n * f.width, ref_out + n * 48);
    /* outputs: bitwise equal to the one-token-at-a-time decode */
    assert_true(same(out, ref_out, (size_t)n * 48));
    assert_true(same(out + n * 48, ref_out + n * 48, (size_t)n2 * 48));
    /* seq A's own slot untouched; slot 4 (the -1 entry's would-be slot) untouched */
    assert_true(same(ds_cpu_cache_gdn_state(cache, 0, 1), own_state, f.state_n));
    assert_true(same(ds_cpu_cache_gdn_conv(cache, 0, 1), own_conv, f.hist_n));
    assert_true(ds_cpu_cache_gdn_state(cache, 0, 4)[0] == 777.0f);
    assert_true(ds_cpu_cache_gdn_conv(cache, 0, 7)[0] == 777.0f);
    /* seq B updated in place like its reference */
    assert_true(same(ds_cpu_cache_gdn_state(cache, 0, 8), ds_cpu_cache_gdn_state(cache, 0, 9),
                     f.state_n));
    assert_true(same(ds_cpu_cache_gdn_conv(cache, 0, 8), ds_cpu_cache_gdn_conv(cache, 0, 9),
                     f.hist_n));

    /* continuing from a snapshot (the slot swap) equals continuing the reference */
    int s3[1] = {3};
    float *o1 = tc_zero_act(be, 48);
    /* slot 3 = state after tokens 0, 1; replaying tokens 2.. on it must reach slot 0's state */
    for (int t = 2; t < n; t++)
        gdn_call(be, cache, &f, 1, one, s3, NULL, proj + (size_t)t * f.width, o1);
    assert_true(same(ds_cpu_cache_gdn_state(cache, 0, 3), ds_cpu_cache_gdn_state(cache, 0, 0),
                     f.state_n));
    assert_true(same(o1, ref_out + (n - 1) * 48, 48));
    be->ops->free(be, o1);

    free(own_state);
    free(own_conv);
    free(proj_warm);
    free(proj);
    be->ops->free(be, out);
    be->ops->free(be, ref_out);
    be->ops->cache_free(be, cache);
    be->ops->destroy(be);
    fx_free(&f);
}

static void test_concat(void **state) {
    (void)state;
    test_rng rng = {42};
    ds_backend *be = tc_backend(1);
    assert_non_null(be->ops->concat);
    const int R = 5, A = 7, B = 3;
    float *a = tc_rand_act(be, &rng, (size_t)R * A, 1.0f), *b = tc_rand_act(be, &rng, (size_t)R * B, 1.0f);
    float *o = tc_zero_act(be, (size_t)R * (A + B));
    ds_tensor ta = tc_tensor2(a, DS_DTYPE_F32, R, A), tb = tc_tensor2(b, DS_DTYPE_F32, R, B),
              to = tc_tensor2(o, DS_DTYPE_F32, R, A + B);
    be->ops->concat(be, &ta, &tb, &to);
    for (int r = 0; r < R; r++) {
        for (int i = 0; i < A; i++) assert_true(o[r * (A + B) + i] == a[r * A + i]);
        for (int i = 0; i < B; i++) assert_true(o[r * (A + B) + A + i] == b[r * B + i]);
    }
    be->ops->free(be, a);
    be->ops->free(be, b);
    be->ops->free(be, o);
    be->ops->destroy(be);
}

static void test_token_buffer(void **state) {
    (void)state;
    test_rng rng = {7};
    ds_backend *be = tc_backend(1);
    assert_non_null(be->ops->argmax_logits);
    enum { V = 16, H = 8, R = 3 };
    float *head = tc_rand_act(be, &rng, (size_t)V * H, 1.0f);  /* [V, H] lm_head */
    float *table = tc_rand_act(be, &rng, (size_t)V * H, 1.0f); /* [V, H] embeddings */
    float *x = tc_rand_act(be, &rng, (size_t)R * H, 1.0f);
    ds_linear lm = {.n_parts = 1, .n_out = V, .n_in = H};
    lm.parts[0] = tc_tensor2(head, DS_DTYPE_F32, V, H);
    ds_tensor tx = tc_tensor2(x, DS_DTYPE_F32, R, H), tt = tc_tensor2(table, DS_DTYPE_F32, V, H);
    int32_t kept[R], plain[R];
    be->ops->argmax_logits(be, &tx, &lm, kept, 10); /* ids also at entries 10, 11, 12 */
    for (int r = 0; r < R; r++) { /* the argmax of each row, computed here */
        int best = 0;
        float bv = -INFINITY;
        for (int v = 0; v < V; v++) {
            float d = 0.f;
            for (int k = 0; k < H; k++) d += x[r * H + k] * head[v * H + k];
            if (d > bv) bv = d, best = v;
        }
        assert_int_equal(kept[r], best);
    }
    /* another row set through keep_at = -1: the buffer keeps the first ids */
    float *x2 = tc_rand_act(be, &rng, (size_t)R * H, 1.0f);
    ds_tensor tx2 = tc_tensor2(x2, DS_DTYPE_F32, R, H);
    be->ops->argmax_logits(be, &tx2, &lm, plain, -1);

    /* the tokens entries of the buffered rows differ from the kept ids: a row that ignored
     * token_src would embed the wrong row */
    int32_t tokens[4] = {5, (kept[0] + 1) % V, (kept[2] + 1) % V, 8}, src[4] = {-1, 10, 12, -1};
    int32_t pos[4] = {0, 1, 2, 3};
    int32_t start[2] = {0, 4}, slot = 0, past = 0, bt = 0, out_rows[1] = {0};
    ds_batch b = {.n_tokens = 4, .n_seqs = 1, .tokens = tokens, .positions = pos,
                  .seq_start = start, .seq_slot = &slot, .seq_n_past = &past,
                  .block_table = &bt, .max_blocks = 1, .n_out = 0, .out_rows = out_rows,
                  .token_src = src};
    be->ops->set_batch(be, &b);
    float *o = tc_zero_act(be, (size_t)4 * H);
    ds_tensor to = tc_tensor2(o, DS_DTYPE_F32, 4, H);
    be->ops->embed(be, &tt, &to);
    const int want[4] = {5, kept[0], kept[2], 8};
    for (int t = 0; t < 4; t++)
        for (int k = 0; k < H; k++) assert_true(o[t * H + k] == table[want[t] * H + k]);
    void *bufs[] = {head, table, x, x2, o};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) be->ops->free(be, bufs[i]);
    be->ops->destroy(be);
}

static void test_spec_accept(void **state) {
    (void)state;
    ds_backend *be = tc_backend(1);
    assert_non_null(be->ops->spec_accept);
    sa_result res;
    sa_run(be, sa_cpu_read_meta, &res);
    for (int s = 0; s < SA_S; s++)
        printf("  spec_accept seq %d: %d drafts, m = %d, out row -> %d, n_past -> %d\n", s,
               sa_n_draft[s], res.n_emitted[s], res.gathered[s], res.n_past[s]);
    assert_int_equal(sa_mismatches(&res), 0);
    be->ops->destroy(be);
}

static void test_spec_sample(void **state) {
    (void)state;
    ds_backend *be = tc_backend(1);
    assert_non_null(be->ops->spec_sample);
    static ss_case c;
    ss_case_make(&c);
    static ss_stats st;
    ss_stats_run(be, &c, 256, 7, &st); /* 256 · 51 draws per group */
    assert_int_equal(st.greedy_wrong, 0);
    for (int g = 1; g < SS_G; g++) {
        const double pd = c.p[g][0][c.draft[g][0]];
        const double sd = sqrt(pd * (1 - pd) / st.draws);
        printf("  group %d (T %.1f top_k %d top_p %.2f min_p %.2f): z %.2f %.2f %.2f; draft "
               "accepted %.4f vs p(d) %.4f\n", g, (double)ss_params[g].temperature,
               ss_params[g].top_k, (double)ss_params[g].top_p, (double)ss_params[g].min_p,
               st.z[g][0], st.z[g][1], st.z[g][2], st.accept0[g], pd);
        for (int j = 0; j < SS_ROWS; j++) assert_true(st.z[g][j] < 4.5);
        assert_true(fabs(st.accept0[g] - pd) < 4.5 * sd + 1e-9);
    }
    /* power: the counts of the temperature group against T × 1.15, and of the top_k group
     * against no top_k, are rejected */
    double pw[SS_V];
    ds_spec_sampling wrong = ss_params[1];
    wrong.temperature *= 1.15f;
    ss_expected(c.logits[1][2], &wrong, pw);
    const double z_t = test_chi2_z(st.counts[1][2], pw, SS_V, st.draws, NULL);
    wrong = ss_params[2];
    wrong.top_k = 0;
    ss_expected(c.logits[2][2], &wrong, pw);
    const double z_k = test_chi2_z(st.counts[2][2], pw, SS_V, st.draws, NULL);
    printf("  power: T x 1.15 z %.1f, top_k off z %.1f\n", z_t, z_k);
    assert_true(z_t > 4.5 && z_k > 4.5);
    /* the same seeds, the same ids; other seeds, other ids */
    static int32_t a[SS_T], b[SS_T], d[SS_T];
    ss_call(be, &c, 1000, a);
    ss_call(be, &c, 1000, b);
    ss_call(be, &c, 2000, d);
    assert_memory_equal(a, b, sizeof a);
    assert_true(memcmp(a, d, sizeof a) != 0);
    be->ops->destroy(be);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gdn_state_snapshots),
        cmocka_unit_test(test_concat),
        cmocka_unit_test(test_token_buffer),
        cmocka_unit_test(test_spec_accept),
        cmocka_unit_test(test_spec_sample),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
