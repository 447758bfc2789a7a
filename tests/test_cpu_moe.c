/* test_cpu_moe.c — CPU sparse MoE against a naive double-precision reference (routing ties
 * excluded by construction), bf16 and f32 weights, fused and split gate_up, with and without
 * the shared expert and top-k renormalisation; the tie rule; batch invariance. */
#include "test_cpu_common.h"

typedef struct moe_case {
    ds_config cfg;
    ds_moe_weights w;
    int E, k, H, I, Is;
    /* exact f32 values of every weight, for the reference */
    float *router_ex, *sg_ex;
    float **gate_ex, **up_ex, **down_ex; /* [E] each [I, H] / [I, H] / [H, I] */
    float *s_gate_ex, *s_up_ex, *s_down_ex;
    void **owned; /* weight storage to free */
    int n_owned;
} moe_case;

static void own(moe_case *mc, void *p) { mc->owned[mc->n_owned++] = p; }

/* Fills a ds_linear whose parts are [rows_i, K]; exact_out gets the stacked exact values. */
static void rand_linear(moe_case *mc, test_rng *rng, ds_dtype dt, ds_linear *lin, int n_parts,
                        const int *rows, int K, float **exact_out, float scale) {
    memset(lin, 0, sizeof *lin);
    lin->n_parts = n_parts;
    lin->n_in = K;
    int total = 0;
    for (int p = 0; p < n_parts; p++) total += rows[p];
    float *ex = malloc(sizeof(float) * (size_t)total * K);
    int off = 0;
    for (int p = 0; p < n_parts; p++) {
        float *pe;
        lin->parts[p] = tc_rand_weight(rng, dt, rows[p], K, scale, &pe);
        memcpy(ex + (size_t)off * K, pe, sizeof(float) * (size_t)rows[p] * K);
        free(pe);
        own(mc, lin->parts[p].data);
        off += rows[p];
    }
    lin->n_out = total;
    *exact_out = ex;
    own(mc, ex);
}

static void case_init(moe_case *mc, test_rng *rng, ds_dtype dt, int E, int k, int H, int I, int Is,
                      bool shared, bool norm_topk) {
    memset(mc, 0, sizeof *mc);
    mc->E = E, mc->k = k, mc->H = H, mc->I = I, mc->Is = Is;
    mc->cfg.hidden = H;
    mc->cfg.is_moe = true;
    mc->cfg.n_experts = E;
    mc->cfg.top_k = k;
    mc->cfg.moe_inter = I;
    mc->cfg.shared_inter = shared ? Is : 0;
    mc->cfg.norm_topk_prob = norm_topk;
    mc->owned = calloc((size_t)(8 * E + 16), sizeof(void *));
    mc->gate_ex = calloc((size_t)E, sizeof(float *));
    mc->up_ex = calloc((size_t)E, sizeof(float *));
    mc->down_ex = calloc((size_t)E, sizeof(float *));
    mc->w.n_experts = E;
    mc->w.experts = calloc((size_t)E, sizeof(ds_mlp_weights));
    mc->w.router = tc_rand_weight(rng, dt, E, H, 0.5f, &mc->router_ex);
    own(mc, mc->w.router.data);
    own(mc, mc->router_ex);
    for (int e = 0; e < E; e++) {
        float *gu;
        if (e % 2 == 0) { /* split gate | up parts */
            int rows[] = {I, I};
            rand_linear(mc, rng, dt, &mc->w.experts[e].gate_up, 2, rows, H, &gu, 0.3f);
        } else { /* one fused [2I, H] part */
            int rows[] = {2 * I};
            rand_linear(mc, rng, dt, &mc->w.experts[e].gate_up, 1, rows, H, &gu, 0.3f);
        }
        mc->gate_ex[e] = gu;
        mc->up_ex[e] = gu + (size_t)I * H;
        int drows[] = {H};
        rand_linear(mc, rng, dt, &mc->w.experts[e].down, 1, drows, I, &mc->down_ex[e], 0.3f);
    }
    mc->w.has_shared = shared;
    if (shared) {
        int rows[] = {Is, Is};
        float *gu;
        rand_linear(mc, rng, dt, &mc->w.shared.gate_up, 2, rows, H, &gu, 0.3f);
        mc->s_gate_ex = gu;
        mc->s_up_ex = gu + (size_t)Is * H;
        int drows[] = {H};
        rand_linear(mc, rng, dt, &mc->w.shared.down, 1, drows, Is, &mc->s_down_ex, 0.3f);
        mc->w.shared_gate = tc_rand_weight(rng, dt, 1, H, 0.5f, &mc->sg_ex);
        own(mc, mc->w.shared_gate.data);
        own(mc, mc->sg_ex);
    }
}

static void case_free(moe_case *mc) {
    for (int i = 0; i < mc->n_owned; i++) free(mc->owned[i]);
    free(mc->owned);
    free(mc->gate_ex);
    free(mc->up_ex);
    free(mc->down_ex);
    free(mc->w.experts);
}

/* ---- reference ------------------------------------------------------------------------------ */

static double dot_d(const float *w, const double *x, int n) {
    double s = 0;
    for (int i = 0; i < n; i++) s += (double)w[i] * x[i];
    return s;
}

/* probabilities of one token, and whether its top-k boundary is a clear gap (no near-tie) */
static bool ref_route(const moe_case *mc, const float *xf, double *p, int *sel) {
    double *x = malloc(sizeof(double) * mc->H), m = -INFINITY, sum = 0;
    for (int i = 0; i < mc->H; i++) x[i] = xf[i];
    for (int e = 0; e < mc->E; e++) {
        p[e] = dot_d(mc->router_ex + (size_t)e * mc->H, x, mc->H);
        m = p[e] > m ? p[e] : m;
    }
    for (int e = 0; e < mc->E; e++) sum += (p[e] = exp(p[e] - m));
    for (int e = 0; e < mc->E; e++) p[e] /= sum;
    for (int j = 0; j < mc->k; j++) { /* selection with ties to the lower index */
        int best = -1;
        for (int e = 0; e < mc->E; e++) {
            bool taken = false;
            for (int q = 0; q < j; q++) taken |= sel[q] == e;
            if (!taken && (best < 0 || p[e] > p[best])) best = e;
        }
        sel[j] = best;
    }
    double next = -1;
    for (int e = 0; e < mc->E; e++) {
        bool taken = false;
        for (int q = 0; q < mc->k; q++) taken |= sel[q] == e;
        if (!taken && p[e] > next) next = p[e];
    }
    free(x);
    return mc->k == mc->E || p[sel[mc->k - 1]] - next > 1e-4;
}

static void ref_mlp(const float *g, const float *u, const float *d, int H, int I, const double *x,
                    double scale, double *out) {
    double *a = malloc(sizeof(double) * I);
    for (int i = 0; i < I; i++) {
        double gg = dot_d(g + (size_t)i * H, x, H), uu = dot_d(u + (size_t)i * H, x, H);
        a[i] = gg / (1.0 + exp(-gg)) * uu;
    }
    for (int h = 0; h < H; h++) out[h] += scale * dot_d(d + (size_t)h * I, a, I);
    free(a);
}

static void ref_moe(const moe_case *mc, const float *xf, int T, double *out) {
    int H = mc->H;
    double *x = malloc(sizeof(double) * H), *p = malloc(sizeof(double) * mc->E);
    int *sel = malloc(sizeof(int) * mc->k);
    for (int t = 0; t < T; t++) {
        for (int i = 0; i < H; i++) x[i] = xf[(size_t)t * H + i];
        double *o = out + (size_t)t * H;
        memset(o, 0, sizeof(double) * H);
        ref_route(mc, xf + (size_t)t * H, p, sel);
        double wsum = 0;
        for (int j = 0; j < mc->k; j++) wsum += p[sel[j]];
        for (int j = 0; j < mc->k; j++) {
            int e = sel[j];
            double wt = mc->cfg.norm_topk_prob ? p[e] / wsum : p[e];
            ref_mlp(mc->gate_ex[e], mc->up_ex[e], mc->down_ex[e], H, mc->I, x, wt, o);
        }
        if (mc->w.has_shared) {
            double sg = 1.0 / (1.0 + exp(-dot_d(mc->sg_ex, x, H)));
            ref_mlp(mc->s_gate_ex, mc->s_up_ex, mc->s_down_ex, H, mc->Is, x, sg, o);
        }
    }
    free(x);
    free(p);
    free(sel);
}

/* Random tokens whose routing has no near-tie at the top-k boundary. */
static float *rand_tokens(ds_backend *be, const moe_case *mc, test_rng *rng, int T) {
    float *x = tc_zero_act(be, (size_t)T * mc->H);
    double *p = malloc(sizeof(double) * mc->E);
    int *sel = malloc(sizeof(int) * mc->k);
    for (int t = 0; t < T; t++) {
        do {
            for (int i = 0; i < mc->H; i++) x[(size_t)t * mc->H + i] = test_rng_uniform(rng);
        } while (!ref_route(mc, x + (size_t)t * mc->H, p, sel));
    }
    free(p);
    free(sel);
    return x;
}

static double run_case(ds_dtype dt, int T, bool shared, bool norm_topk, uint64_t seed) {
    test_rng rng = {.s = seed};
    moe_case mc;
    case_init(&mc, &rng, dt, 8, 3, 64, 40, 24, shared, norm_topk);
    ds_backend *be = tc_backend(2);
    float *x = rand_tokens(be, &mc, &rng, T), *out = tc_zero_act(be, (size_t)T * mc.H);
    ds_tensor tx = tc_tensor2(x, DS_DTYPE_F32, T, mc.H),
              to = tc_tensor2(out, DS_DTYPE_F32, T, mc.H);
    be->ops->moe(be, &mc.cfg, &mc.w, &tx, &to);
    double *ref = malloc(sizeof(double) * (size_t)T * mc.H);
    ref_moe(&mc, x, T, ref);
    double rel = tc_rel_l2_d(out, ref, (size_t)T * mc.H);
    assert_true(rel <= TC_TOL);
    /* batch invariance: a few rows alone are bit-identical */
    float *o1 = tc_zero_act(be, (size_t)mc.H);
    for (int t = 0; t < T; t += (T > 8 ? T / 5 : 1)) {
        ds_tensor t1 = tc_tensor2(x + (size_t)t * mc.H, DS_DTYPE_F32, 1, mc.H),
                  u1 = tc_tensor2(o1, DS_DTYPE_F32, 1, mc.H);
        be->ops->moe(be, &mc.cfg, &mc.w, &t1, &u1);
        assert_memory_equal(o1, out + (size_t)t * mc.H, sizeof(float) * mc.H);
    }
    be->ops->free(be, o1);
    be->ops->free(be, x);
    be->ops->free(be, out);
    be->ops->destroy(be);
    free(ref);
    case_free(&mc);
    return rel;
}

static void test_moe_vs_naive(void **state) {
    (void)state;
    double a = run_case(DS_DTYPE_BF16, 5, true, true, 11);
    double b = run_case(DS_DTYPE_F32, 1, true, true, 12);
    double c = run_case(DS_DTYPE_F32, 600, false, false, 13); /* crosses the 512-token pass */
    double d = run_case(DS_DTYPE_BF16, 37, true, false, 14);
    printf("moe rel L2 vs naive: bf16 T=5 %.2e, f32 T=1 %.2e, f32 T=600 no-shared %.2e, bf16 T=37 "
           "unnormalised %.2e\n",
           a, b, c, d);
}

/* Experts 1 and 3 share a router row (exact tie): top-1 must pick 1; top-3 must pick 1, 3, then
 * 0 over its twin 2. */
static void test_moe_tie_rule(void **state) {
    (void)state;
    test_rng rng = {.s = 5};
    for (int k = 1; k <= 3; k += 2) {
        moe_case mc;
        case_init(&mc, &rng, DS_DTYPE_F32, 4, k, 16, 8, 8, false, true);
        float *r = mc.w.router.data;
        for (int i = 0; i < 16; i++) {
            r[1 * 16 + i] = r[3 * 16 + i];
            r[0 * 16 + i] = -r[3 * 16 + i];
            r[2 * 16 + i] = -r[3 * 16 + i];
        }
        memcpy(mc.router_ex, r, sizeof(float) * 4 * 16);
        ds_backend *be = tc_backend(2);
        float *x = tc_zero_act(be, 16), *out = tc_zero_act(be, 16);
        memcpy(x, r + 16, sizeof(float) * 16); /* x = router row 1 → logits (-a, a, -a, a) */
        ds_tensor tx = tc_tensor2(x, DS_DTYPE_F32, 1, 16),
                  to = tc_tensor2(out, DS_DTYPE_F32, 1, 16);
        be->ops->moe(be, &mc.cfg, &mc.w, &tx, &to);
        /* expected: explicit experts with weights from the (exactly tied) probabilities */
        double xd[16], ref[16] = {0};
        for (int i = 0; i < 16; i++) xd[i] = x[i];
        double a = dot_d(r + 16, xd, 16);
        double pa = exp(a) / (2 * exp(a) + 2 * exp(-a)), pb = exp(-a) / (2 * exp(a) + 2 * exp(-a));
        if (k == 1) {
            ref_mlp(mc.gate_ex[1], mc.up_ex[1], mc.down_ex[1], 16, 8, xd, 1.0, ref);
        } else {
            double s = 2 * pa + pb;
            ref_mlp(mc.gate_ex[1], mc.up_ex[1], mc.down_ex[1], 16, 8, xd, pa / s, ref);
            ref_mlp(mc.gate_ex[3], mc.up_ex[3], mc.down_ex[3], 16, 8, xd, pa / s, ref);
            ref_mlp(mc.gate_ex[0], mc.up_ex[0], mc.down_ex[0], 16, 8, xd, pb / s, ref);
        }
        assert_true(tc_rel_l2_d(out, ref, 16) <= TC_TOL);
        be->ops->free(be, x);
        be->ops->free(be, out);
        be->ops->destroy(be);
        case_free(&mc);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_moe_vs_naive),
        cmocka_unit_test(test_moe_tie_rule),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
