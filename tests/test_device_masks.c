/* test_device_masks.c — catalogue item 6: min_tokens bans applied inside the fused greedy head
 * (backend set_argmax_bans + argmax_logits) instead of a logits download and the host sampler.
 *
 *  1. The CPU backend's argmax_logits with a ban table against a reference written here:
 *     exact integer-valued logits (so ties are exact whatever the summation order), the
 *     lowest-index rule among the ids left, -1 padding and out-of-range ids ignored, all but
 *     one id banned, every id banned (the plain argmax), rows past the table unbanned, the
 *     table kept across calls until replaced or cleared.
 *  2. The runner on the tiny MoE fixture: a runner taking greedy steps with bans next to a
 *     second runner taking the same plans through the logits path; every banned greedy id must
 *     equal the masked argmax of the reference logits, and the table is uploaded once per change
 *     of the rows' keys (a steady batch: once).
 *  3. The engine: greedy requests with min_tokens and stop ids give the same tokens with
 *     DS_OPT_DEVICE_MASKS on and off and as one request alone through ds_session with the host
 *     sampler; no EOS / stop id before min_tokens; on, the requests below min_tokens stay on the
 *     greedy path; one request uploads its table exactly twice (set, then cleared when it reaches
 *     min_tokens). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "testlib.h"

#include "backend/backend.h"
#include "backend/cpu/cpu_backend.h"
#include "model/loader.h"
#include "model/model.h"
#include "runtime/engine.h"
#include "runtime/kv_blocks.h"
#include "runtime/runner.h"
#include "runtime/scheduler.h"
#include "runtime/session.h"
#include "runtime/state_slots.h"

#define EOS_ID 510 /* tiny-moe's eos_token_id */

/* Lowest index of the maximum of row[0..V) over the ids bans[0..n) does not list; when no id is
 * left, the lowest index of the maximum over all ids. Written from the contract (backend.h),
 * not from the backend's code: a plain scan with an "allowed" test per id. */
static int ref_argmax(const float *row, int V, const int32_t *bans, int n) {
    int best = -1;
    for (int v = 0; v < V; v++) {
        bool banned = false;
        for (int j = 0; j < n; j++) banned |= bans[j] == v;
        if (!banned && (best < 0 || row[v] > row[best])) best = v;
    }
    if (best >= 0) return best;
    best = 0;
    for (int v = 1; v < V; v++)
        if (row[v] > row[best]) best = v;
    return best;
}

/* ---- 1. CPU backend ------------------------------------------------------------------------- */

#define OP_V 67 /* odd: the matmul's row tiles leave a tail */
#define OP_K 32
#define OP_R 5

typedef struct op_rig {
    ds_backend *be;
    ds_linear lm;           /* [OP_V, OP_K] F32 */
    float *x;               /* [OP_R, OP_K] backend memory */
    float ref[OP_R][OP_V];  /* exact logits */
    int32_t ids[OP_R];
} op_rig;

/* Small integers times 0.5: every dot product is exact in fp32, in any order. */
static void op_rig_init(op_rig *g) {
    ds_error err = {0};
    if (ds_backend_cpu_create(2, &g->be, &err) != DS_OK) fail_msg("cpu backend: %s", err.msg);
    assert_non_null(g->be->ops->argmax_logits);
    assert_non_null(g->be->ops->set_argmax_bans);
    test_rng rng = {0xba115ull};
    float *w = malloc(sizeof(float) * OP_V * OP_K);
    assert_non_null(w);
    for (int i = 0; i < OP_V * OP_K; i++) w[i] = 0.5f * (float)(int)(test_rng_uniform(&rng) * 3.0f);
    g->x = g->be->ops->alloc(g->be, sizeof(float) * OP_R * OP_K);
    assert_non_null(g->x);
    for (int i = 0; i < OP_R * OP_K; i++) g->x[i] = (float)(int)(test_rng_uniform(&rng) * 3.0f);
    /* exact ties at the top of row 0: ids 9, 33 and 60 hold sign(x0) (the largest possible
     * value, Σ|x0|/… ) */
    for (int k = 0; k < OP_K; k++) {
        const float s = g->x[k] > 0 ? 1.0f : g->x[k] < 0 ? -1.0f : 0.0f;
        w[9 * OP_K + k] = w[33 * OP_K + k] = w[60 * OP_K + k] = s;
    }
    /* row 4: all zeros, every logit 0: the whole vocabulary ties */
    for (int k = 0; k < OP_K; k++) g->x[4 * OP_K + k] = 0.0f;
    g->lm = (ds_linear){.n_parts = 1, .n_in = OP_K, .n_out = OP_V};
    g->lm.parts[0] = (ds_tensor){.data = w, .dtype = DS_DTYPE_F32, .ndim = 2, .ne = {OP_V, OP_K}};
    for (int r = 0; r < OP_R; r++)
        for (int v = 0; v < OP_V; v++) {
            double acc = 0;
            for (int k = 0; k < OP_K; k++) acc += (double)g->x[r * OP_K + k] * w[v * OP_K + k];
            g->ref[r][v] = (float)acc;
        }
    assert_true(g->ref[0][9] == g->ref[0][33] && g->ref[0][9] == g->ref[0][60]);
    for (int v = 0; v < OP_V; v++) assert_true(g->ref[0][v] <= g->ref[0][9]);
}

static void op_rig_free(op_rig *g) {
    g->be->ops->free(g->be, g->x);
    free(g->lm.parts[0].data);
    g->be->ops->destroy(g->be);
}

static void op_run(op_rig *g) {
    ds_tensor tx = {.data = g->x, .dtype = DS_DTYPE_F32, .ndim = 2, .ne = {OP_R, OP_K}};
    for (int r = 0; r < OP_R; r++) g->ids[r] = -7;
    g->be->ops->argmax_logits(g->be, &tx, &g->lm, g->ids, -1);
    ds_error err = {0};
    assert_int_equal(g->be->ops->synchronize(g->be, &err), DS_OK);
}

/* ids against the reference with table tab [B, n] (rows ≥ B: no bans). */
static void op_check(const op_rig *g, const int32_t *tab, int B, int n) {
    for (int r = 0; r < OP_R; r++) {
        const int want = ref_argmax(g->ref[r], OP_V, r < B ? tab + r * n : NULL, r < B ? n : 0);
        if (g->ids[r] != want) fail_msg("row %d: id %d, expected %d (B %d, n_ban %d)", r, g->ids[r], want, B, n);
    }
}

static void test_cpu_argmax_bans(void **state) {
    (void)state;
    op_rig g;
    op_rig_init(&g);
    const ds_backend_ops *op = g.be->ops;

    /* no table: the plain argmax, equal to argmax over the logits op's output */
    op_run(&g);
    op_check(&g, NULL, 0, 0);
    assert_int_equal(g.ids[0], 9);
    assert_int_equal(g.ids[4], 0);
    {
        float *lg = op->alloc(g.be, sizeof(float) * OP_R * OP_V);
        ds_tensor tx = {.data = g.x, .dtype = DS_DTYPE_F32, .ndim = 2, .ne = {OP_R, OP_K}};
        ds_tensor tl = {.data = lg, .dtype = DS_DTYPE_F32, .ndim = 2, .ne = {OP_R, OP_V}};
        op->logits(g.be, &tx, &g.lm, &tl);
        int32_t plain[OP_R];
        op->argmax(g.be, &tl, plain);
        assert_memory_equal(plain, g.ids, sizeof plain);
        op->free(g.be, lg);
    }

    /* ties: banning the lowest of three equal maxima gives the next one, then the last, then
     * whatever is next; -1 padding and an id past the vocabulary are ignored */
    {
        const int32_t tab[3 * 4] = {9, -1, OP_V + 5, -1,   /* row 0 → 33 */
                                    -1, -1, -1, -1,        /* row 1: padding only */
                                    0, 1, 2, -1};          /* row 2 */
        assert_true(op->set_argmax_bans(g.be, tab, 3, 4));
        op_run(&g);
        op_check(&g, tab, 3, 4);
        assert_int_equal(g.ids[0], 33);
        op_run(&g); /* the table stays until replaced */
        op_check(&g, tab, 3, 4);
        assert_int_equal(g.ids[0], 33);
    }
    {
        const int32_t tab[1 * 3] = {60, 9, 33};
        assert_true(op->set_argmax_bans(g.be, tab, 1, 3));
        op_run(&g);
        op_check(&g, tab, 1, 3);
        assert_true(g.ids[0] != 9 && g.ids[0] != 33 && g.ids[0] != 60);
    }
    /* all but one id banned (row 3: only 17 left), every id banned (row 4: the plain argmax,
     * 0 for its all-zero row), the all-tie row with its first three ids banned (row 2: 3) */
    {
        int32_t *tab = malloc(sizeof(int32_t) * OP_R * OP_V);
        assert_non_null(tab);
        for (int i = 0; i < OP_R * OP_V; i++) tab[i] = -1;
        for (int v = 0, j = 0; v < OP_V; v++)
            if (v != 17) tab[3 * OP_V + j++] = v;
        for (int v = 0; v < OP_V; v++) tab[4 * OP_V + (OP_V - 1 - v)] = v; /* any order */
        tab[0 * OP_V + 0] = 9;
        assert_true(op->set_argmax_bans(g.be, tab, OP_R, OP_V));
        op_run(&g);
        op_check(&g, tab, OP_R, OP_V);
        assert_int_equal(g.ids[3], 17);
        assert_int_equal(g.ids[4], 0);
        assert_int_equal(g.ids[0], 33);
        /* the all-zero row with 0, 1, 2 banned: the lowest id left */
        tab[4 * OP_V + 0] = 0;
        tab[4 * OP_V + 1] = 1;
        tab[4 * OP_V + 2] = 2;
        for (int j = 3; j < OP_V; j++) tab[4 * OP_V + j] = -1;
        assert_true(op->set_argmax_bans(g.be, tab, OP_R, OP_V));
        op_run(&g);
        op_check(&g, tab, OP_R, OP_V);
        assert_int_equal(g.ids[4], 3);
        free(tab);
    }
    /* n_ban = 0 (and B = 0) clear the table */
    assert_true(op->set_argmax_bans(g.be, NULL, 3, 0));
    op_run(&g);
    op_check(&g, NULL, 0, 0);
    assert_int_equal(g.ids[0], 9);
    const int32_t one = 9;
    assert_true(op->set_argmax_bans(g.be, &one, 1, 1));
    op_run(&g);
    assert_int_equal(g.ids[0], 33);
    assert_true(op->set_argmax_bans(g.be, NULL, 0, 0));
    op_run(&g);
    assert_int_equal(g.ids[0], 9);
    op_rig_free(&g);
}

/* ---- model fixture -------------------------------------------------------------------------- */

#define MODEL_MAX_TOKENS 256
#define MODEL_MAX_OUT 16

typedef test_model fixture; /* testlib.h */

static void fixture_open(fixture *f, const char *name) {
    char rel[256];
    snprintf(rel, sizeof rel, "models/%s", name);
    test_model_load(f, test_data_path(rel));
    test_model_init(f, MODEL_MAX_TOKENS, MODEL_MAX_OUT);
    assert_true(f->cfg.n_eos >= 1 && f->cfg.eos_ids[0] == EOS_ID);
}

static void fixture_close(fixture *f) { test_model_close(f); }

/* ---- 2. runner ------------------------------------------------------------------------------ */

#define RS_SEQS 3
#define RS_MAX_NEW 40
#define RS_BLOCK 16
#define RS_MAX_BLOCKS 4

typedef struct rs_ban_list {
    int32_t ids[8];
    int n;
} rs_ban_list;

static int rs_fill(void *ctx, int item, int32_t *ids, int cap) {
    const rs_ban_list *lists = ctx;
    assert_true(lists[item].n <= cap);
    memcpy(ids, lists[item].ids, sizeof(int32_t) * (size_t)lists[item].n);
    return lists[item].n;
}

static void test_runner_bans(void **state) {
    (void)state;
    fixture f;
    fixture_open(&f, "tiny-moe");
    const int V = f.cfg.vocab;
    ds_kv_blocks kv;
    ds_state_slots slots;
    ds_scheduler sched;
    const int n_blocks = RS_SEQS * RS_MAX_BLOCKS;
    ds_kv_blocks_init(&kv, n_blocks, RS_BLOCK, RS_SEQS, RS_MAX_BLOCKS);
    ds_state_slots_init(&slots, RS_SEQS);
    ds_scheduler_init(&sched, RS_SEQS, 64, &kv, &slots);
    ds_runner a, b; /* a: greedy steps with bans; b: the same plans through the logits path */
    ds_error err = {0};
    if (ds_runner_init(&a, &f.model, RS_SEQS, 64, n_blocks, RS_BLOCK, RS_MAX_BLOCKS, &err) != DS_OK ||
        ds_runner_init(&b, &f.model, RS_SEQS, 64, n_blocks, RS_BLOCK, RS_MAX_BLOCKS, &err) != DS_OK)
        fail_msg("runner: %s", err.msg);
    assert_true(ds_runner_greedy_ready(&a));
    assert_true(ds_runner_device_bans(&a)); /* DS_OPT_DEVICE_MASKS defaults to on */

    static const int n_prompt[RS_SEQS] = {5, 9, 3};
    int32_t toks[RS_SEQS][64];
    ds_sched_seq seq[RS_SEQS];
    test_rng rng = {0x5eedull};
    for (int s = 0; s < RS_SEQS; s++) {
        for (int i = 0; i < n_prompt[s]; i++)
            toks[s][i] = (int32_t)((test_rng_uniform(&rng) + 1.0f) * 250.0f);
        ds_sched_seq_init(&seq[s], toks[s], n_prompt[s], RS_MAX_NEW, NULL);
        ds_scheduler_add(&sched, &seq[s]);
    }

    uint64_t keys[RS_SEQS];
    rs_ban_list lists[RS_SEQS];
    int greedy = 0, banned_rows = 0, changed = 0;
    uint64_t uploads_at[32];
    for (int step = 0; step < 30; step++) {
        const ds_sched_plan *plan = ds_scheduler_schedule(&sched);
        assert_true(plan->n_items == RS_SEQS);
        bool decode = true;
        for (int i = 0; i < plan->n_items; i++)
            decode &= plan->items[i].n_tokens == 1 && plan->items[i].wants_logits;
        float *logits = NULL; /* [n_out, V] the reference's rows */
        if (ds_runner_step(&b, plan, &kv, &logits, &err) != DS_OK) fail_msg("step: %s", err.msg);
        int32_t next[RS_SEQS];
        if (!decode) {
            float *la = NULL;
            if (ds_runner_step(&a, plan, &kv, &la, &err) != DS_OK) fail_msg("step: %s", err.msg);
            for (int i = 0, k = 0; i < plan->n_items; i++)
                if (plan->items[i].wants_logits) {
                    next[i] = ref_argmax(logits + (size_t)k * V, V, NULL, 0);
                    assert_int_equal(ref_argmax(la + (size_t)k * V, V, NULL, 0), next[i]);
                    k++;
                }
        } else {
            /* phases by greedy step: 0-3 new lists each step (each bans the reference's plain
             * winner, so the ban must change the answer); 4-9 a steady table; 10-12 one row
             * left; from 13 none */
            const int g = greedy++;
            for (int i = 0; i < RS_SEQS; i++) {
                const float *row = logits + (size_t)i * V;
                lists[i].n = 0;
                keys[i] = 0;
                if (g < 4 && i != 1) {
                    keys[i] = (uint64_t)(100 * g + i + 1);
                    lists[i].ids[lists[i].n++] = ref_argmax(row, V, NULL, 0);
                    lists[i].ids[lists[i].n++] = EOS_ID;
                } else if (g < 10 && i != 1) {
                    keys[i] = (uint64_t)(1000 + i);
                    for (int v = 0; v < 5; v++) lists[i].ids[lists[i].n++] = v * 7 + i;
                    lists[i].ids[lists[i].n++] = EOS_ID;
                } else if (g < 13 && i == 0) {
                    keys[i] = 1000; /* the same list as in the steady phase */
                    for (int v = 0; v < 5; v++) lists[i].ids[lists[i].n++] = v * 7 + i;
                    lists[i].ids[lists[i].n++] = EOS_ID;
                }
            }
            const int32_t *ids = NULL;
            if (ds_runner_step_greedy_bans(&a, plan, &kv, keys, rs_fill, lists, &ids, &err) != DS_OK)
                fail_msg("greedy step: %s", err.msg);
            assert_non_null(ids);
            for (int i = 0; i < RS_SEQS; i++) {
                const float *row = logits + (size_t)i * V;
                next[i] = ref_argmax(row, V, lists[i].ids, lists[i].n);
                if (ids[i] != next[i])
                    fail_msg("greedy step %d row %d: id %d, masked reference %d", g, i, ids[i], next[i]);
                for (int j = 0; j < lists[i].n; j++) assert_int_not_equal(ids[i], lists[i].ids[j]);
                banned_rows += lists[i].n > 0;
                if (g < 4 && i != 1) changed += ids[i] != ref_argmax(row, V, NULL, 0);
            }
            uploads_at[g] = a.ban_uploads;
        }
        for (int i = 0; i < plan->n_items; i++) {
            ds_sched_seq *q = plan->items[i].seq;
            const bool sampled = plan->items[i].wants_logits;
            if (sampled) toks[q - seq][q->n_tokens] = next[i];
            ds_sched_seq_advance(q, plan->items[i].n_tokens, sampled);
        }
    }
    assert_true(greedy >= 20);
    assert_true(banned_rows > 0);
    assert_int_equal(changed, 8); /* every row of phase 0-3 lost its plain winner */
    /* one upload per change of the rows' keys: 4 new tables, the steady one, one row, empty */
    for (int g = 0; g < 4; g++) assert_int_equal(uploads_at[g], (uint64_t)(g + 1));
    for (int g = 4; g < 10; g++) assert_int_equal(uploads_at[g], 5);
    for (int g = 10; g < 13; g++) assert_int_equal(uploads_at[g], 6);
    for (int g = 13; g < greedy; g++) assert_int_equal(uploads_at[g], 7);
    assert_int_equal(b.ban_uploads, 0); /* the logits path never touches the table */

    for (int s = 0; s < RS_SEQS; s++) ds_scheduler_remove(&sched, &seq[s]);
    ds_runner_free(&a);
    ds_runner_free(&b);
    ds_scheduler_free(&sched);
    ds_state_slots_free(&slots);
    ds_kv_blocks_free(&kv);
    fixture_close(&f);
}

/* ---- 3. engine ------------------------------------------------------------------------------ */

#define EN_REQ 4
#define MAX_OUT 48
#include "engine_harness.h" /* result, solo_run, drain_soft */

typedef struct en_spec {
    int32_t prompt[32];
    int n_prompt;
    int stop_ids[4];
    ds_sampling_params params;
} en_spec;

/* One request alone through ds_session with the host sampler (the logits path). */
static void solo_alone(fixture *f, const en_spec *sp, result *out) {
    ds_error err = {0};
    ds_session ss;
    if (ds_session_init(&ss, &f->model, 1, 128, &err) != DS_OK) fail_msg("session: %s", err.msg);
    solo_run(f, &ss, sp->prompt, sp->n_prompt, &sp->params, out);
    ds_session_free(&ss);
}

/* All requests submitted at once to one engine, then drained in order. */
static void engine_run(fixture *f, en_spec *w, int n, result *out, ds_engine_stats *st) {
    ds_engine_opts o;
    ds_engine_opts_default(&o);
    o.max_num_seqs = 4;
    o.max_model_len = 128;
    o.max_num_batched_tokens = 64;
    o.block_size = 16;
    ds_engine *e;
    ds_error err = {0};
    if (ds_engine_create(&f->model, &o, &e, &err) != DS_OK) fail_msg("engine: %s", err.msg);
    ds_request *reqs[EN_REQ];
    for (int i = 0; i < n; i++) {
        w[i].params.stop_token_ids = w[i].stop_ids;
        ds_request_desc d = {.prompt = w[i].prompt, .n_prompt = w[i].n_prompt, .params = w[i].params};
        if (ds_engine_submit(e, &d, &reqs[i], &err) != DS_OK) fail_msg("submit: %s", err.msg);
    }
    for (int i = 0; i < n; i++) {
        drain_soft(reqs[i], w[i].n_prompt, &out[i]);
        if (out[i].err[0]) fail_msg("request %d: %s", i, out[i].err);
        ds_request_release(reqs[i]);
    }
    ds_engine_get_stats(e, st);
    ds_engine_destroy(e);
}

static void expect_same(const char *what, const result *a, const result *b, int n) {
    for (int i = 0; i < n; i++) {
        int k = 0;
        while (k < a[i].n && k < b[i].n && a[i].toks[k] == b[i].toks[k]) k++;
        if (a[i].n != b[i].n || k != a[i].n || a[i].reason != b[i].reason ||
            a[i].stop_token != b[i].stop_token)
            fail_msg("%s: request %d differs: %d vs %d tokens, first difference at %d, reasons %d "
                     "vs %d", what, i, a[i].n, b[i].n, k, (int)a[i].reason, (int)b[i].reason);
    }
}

static void random_spec(test_rng *g, en_spec *s, int n_prompt, int max_tokens) {
    memset(s, 0, sizeof *s);
    s->n_prompt = n_prompt;
    for (int i = 0; i < n_prompt; i++) s->prompt[i] = (int32_t)((test_rng_uniform(g) + 1.0f) * 250.0f);
    ds_sampling_params_init(&s->params);
    s->params.temperature = 0.0f;
    s->params.max_tokens = max_tokens;
}

static void test_engine_masks_equal_logits_path(void **state) {
    (void)state;
    fixture f;
    fixture_open(&f, "tiny-moe");
    test_rng g = {0xe05ull};
    en_spec w[EN_REQ];
    random_spec(&g, &w[0], 7, 30);
    random_spec(&g, &w[1], 12, 24);
    random_spec(&g, &w[2], 4, 36);
    random_spec(&g, &w[3], 9, 16);
    /* the plain greedy continuations, so that the bans below hit tokens greedy would emit */
    result base[EN_REQ];
    for (int i = 0; i < EN_REQ; i++) {
        en_spec s = w[i];
        s.params.ignore_eos = true;
        solo_alone(&f, &s, &base[i]);
    }
    /* 0: min_tokens 14, its greedy tokens 2, 5 and 9 are stop ids; 1: no min_tokens (plain
     * greedy next to banned rows); 2: min_tokens 30 with ignore_eos, stop id = its token 3;
     * 3: min_tokens = max_tokens, two stop ids */
    w[0].params.min_tokens = 14;
    w[0].stop_ids[0] = base[0].toks[2];
    w[0].stop_ids[1] = base[0].toks[5];
    w[0].stop_ids[2] = base[0].toks[9];
    w[0].params.n_stop_token_ids = 3;
    w[2].params.min_tokens = 30;
    w[2].params.ignore_eos = true;
    w[2].stop_ids[0] = base[2].toks[3];
    w[2].params.n_stop_token_ids = 1;
    w[3].params.min_tokens = 16;
    w[3].stop_ids[0] = base[3].toks[1];
    w[3].stop_ids[1] = base[3].toks[4];
    w[3].params.n_stop_token_ids = 2;

    result solo[EN_REQ], on[EN_REQ], off[EN_REQ];
    for (int i = 0; i < EN_REQ; i++) {
        w[i].params.stop_token_ids = w[i].stop_ids;
        solo_alone(&f, &w[i], &solo[i]);
    }
    ds_engine_stats st_on, st_off;
    engine_run(&f, w, EN_REQ, on, &st_on);
    setenv("DS_OPT_DEVICE_MASKS", "0", 1);
    engine_run(&f, w, EN_REQ, off, &st_off);
    unsetenv("DS_OPT_DEVICE_MASKS");
    expect_same("masks on vs off", on, off, EN_REQ);
    expect_same("masks on vs solo", on, solo, EN_REQ);

    /* the bans mattered: without them request 0 would have emitted its token 2 */
    assert_int_not_equal(on[0].toks[2], base[0].toks[2]);
    for (int i = 0; i < EN_REQ; i++) {
        const ds_sampling_params *p = &w[i].params;
        assert_true(on[i].n >= p->min_tokens);
        for (int j = 0; j < p->min_tokens && j < on[i].n; j++) {
            assert_int_not_equal(on[i].toks[j], EOS_ID);
            for (int k = 0; k < p->n_stop_token_ids; k++)
                assert_int_not_equal(on[i].toks[j], p->stop_token_ids[k]);
        }
    }
    /* on: steps with rows below min_tokens stayed greedy; off: they took the logits path */
    print_message("greedy steps: %llu of %llu (masks on), %llu of %llu (off); %llu uploads\n",
                  (unsigned long long)st_on.greedy_steps, (unsigned long long)st_on.steps,
                  (unsigned long long)st_off.greedy_steps, (unsigned long long)st_off.steps,
                  (unsigned long long)st_on.ban_uploads);
    assert_true(st_on.greedy_steps > st_off.greedy_steps);
    assert_true(st_on.ban_uploads >= 1 && st_on.ban_uploads < st_on.greedy_steps);
    fixture_close(&f);
}

/* One request, min_tokens 20 of 30 (ignore_eos, so it runs to its max_tokens): the decode
 * steps 1..19 ban its EOS id (one upload), 20..29 do not (one upload that clears the table). */
static void test_engine_steady_batch_uploads_once(void **state) {
    (void)state;
    fixture f;
    fixture_open(&f, "tiny-dense");
    test_rng g = {0x0717ull};
    en_spec w;
    random_spec(&g, &w, 6, 30);
    w.params.min_tokens = 20;
    w.params.ignore_eos = true;
    result solo, on;
    solo_alone(&f, &w, &solo);
    ds_engine_stats st;
    engine_run(&f, &w, 1, &on, &st);
    expect_same("engine vs solo", &on, &solo, 1);
    assert_int_equal(on.n, 30);
    assert_int_equal(st.greedy_steps, 29); /* every step after the prompt's */
    assert_int_equal(st.ban_uploads, 2);
    fixture_close(&f);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cpu_argmax_bans),
        cmocka_unit_test(test_runner_bans),
        cmocka_unit_test(test_engine_masks_equal_logits_path),
        cmocka_unit_test(test_engine_steady_batch_uploads_once),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
