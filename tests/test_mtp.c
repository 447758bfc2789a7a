/* test_mtp.c — the MTP head (model/mtp.c) on the CPU backend.
 *
 * References, all computed by PyTorch outside this code base:
 *  - tests/data/ref/mtp_ref.json + <model>.mtp.logits.f32 (tools/mtp_reference.py): the tiny
 *    fixtures with seeded random mtp.* heads (tests/data/models/tiny-{moe,dense}-mtp), a head
 *    built from transformers' own decoder-layer / RMSNorm classes after vLLM's qwen3_5_mtp.py.
 *    Teacher-forced rows (h_t + token t+1 → logits predicting t+2) must match within relative
 *    L2 1e-4 per sequence, the argmax wherever the reference's top-2 margin is clear, and a
 *    3-step draft chain (post-norm output fed back) must reproduce the reference drafts/logits;
 *  - models/qwen35-demo/reference_greedy.json (tools/train_demo.py, trained head): the
 *    teacher-forced draft argmax per position.
 * Also: the MTP filled over a prompt in several chunks equals one pass (batch invariance of the
 * head over its own paged KV). */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "testlib.h"

#include "backend/backend.h"
#include "model/loader.h"
#include "model/model.h"
#include "runtime/session.h"

#define REL_TOL 1e-4
#define MARGIN_TOL 2e-3 /* compare argmax only where the reference's top-2 margin exceeds this */

typedef struct fx {
    ds_config cfg;
    ds_model_weights host;
    ds_backend *be;
    ds_model model;
    ds_session sess;
} fx;

static void fx_open(fx *f, const char *dir, int max_tokens, int max_out) {
    ds_error err = {0};
    if (ds_model_load(dir, &f->cfg, &f->host, &err) != DS_OK) fail_msg("load %s: %s", dir, err.msg);
    assert_int_equal(ds_backend_cpu_create(2, &f->be, &err), DS_OK);
    if (ds_model_init(&f->model, f->be, &f->cfg, &f->host, max_tokens, max_out, &err) != DS_OK)
        fail_msg("model init: %s", err.msg);
    assert_true(ds_model_has_mtp(&f->model));
    if (ds_session_init(&f->sess, &f->model, 1, 512, &err) != DS_OK)
        fail_msg("session init: %s", err.msg);
}

static void fx_close(fx *f) {
    ds_session_free(&f->sess);
    ds_model_free(&f->model);
    f->be->ops->destroy(f->be);
    ds_model_weights_free(&f->host);
}

/* Runs the target over tokens[0..n) (chunks of `step`) and after each chunk the MTP over the
 * same rows with token t+1 (rows 0..n-2 only: row n-1 has no next token). The MTP logits of
 * every row come back in mtp_logits [n-1, V]; mtp_out [n-1, H] its post-norm outputs. */
static void teacher_forced(fx *f, const int32_t *tokens, int n, int step, float *mtp_logits,
                           float *mtp_out) {
    ds_model *m = &f->model;
    ds_session *s = &f->sess;
    const int V = f->cfg.vocab, H = f->cfg.hidden;
    ds_error err = {0};
    ds_session_reset(s, 0);
    int32_t next[512], rows[512], pos[512];
    for (int done = 0; done < n; done += step) {
        int T = n - done < step ? n - done : step;
        for (int i = 0; i < T; i++) pos[i] = done + i;
        int32_t seq_start[2] = {0, T}, slot = s->gdn_cur[0], past = done;
        ds_batch b = {.n_tokens = T, .n_seqs = 1, .tokens = tokens + done, .positions = pos,
                      .seq_start = seq_start, .seq_slot = &slot, .seq_n_past = &past,
                      .block_table = s->block_table, .max_blocks = s->blocks_per_seq};
        if (ds_model_forward(m, s->cache, &b, &err) != DS_OK) fail_msg("forward: %s", err.msg);
        int Tm = done + T == n ? T - 1 : T; /* rows with a known next token */
        if (Tm == 0) break;
        for (int i = 0; i < Tm; i++) {
            next[i] = tokens[done + i + 1];
            rows[i] = i;
        }
        ds_batch mb = b;
        mb.n_tokens = Tm;
        seq_start[1] = Tm;
        mb.tokens = next;
        mb.n_out = Tm;
        mb.out_rows = rows;
        if (ds_mtp_forward(m, s->cache, &mb, &m->s.normed, true, &err) != DS_OK)
            fail_msg("mtp: %s", err.msg);
        memcpy(mtp_logits + (size_t)done * V, m->s.logits.data, (size_t)Tm * V * sizeof(float));
        if (mtp_out)
            memcpy(mtp_out + (size_t)done * H, m->mtp.out_h.data, (size_t)Tm * H * sizeof(float));
    }
}

static int argmax_row(const float *x, int n) {
    int best = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[best]) best = i;
    return best;
}

/* ---- the trained demo head ------------------------------------------------------------------ */

static void test_demo_drafts(void **state) {
    (void)state;
    char dir[1024];
    snprintf(dir, sizeof dir, "%s/../../models/qwen35-demo", test_data_dir());
    char path[1200];
    snprintf(path, sizeof path, "%s/reference_greedy.json", dir);
    char *text = test_read_file(path, NULL);
    if (!text) {
        skip();
        return;
    }
    cJSON *j = cJSON_Parse(text);
    free(text);
    const cJSON *tf = cJSON_GetObjectItem(j, "mtp_teacher_forced");
    assert_non_null(tf);
    int n, nd, nm;
    int32_t *tokens = test_json_ids(cJSON_GetObjectItem(tf, "tokens"), &n);
    int32_t *drafts = test_json_ids(cJSON_GetObjectItem(tf, "draft_argmax"), &nd);
    const cJSON *margins = cJSON_GetObjectItem(tf, "draft_top2_margin");
    int32_t *main_am = test_json_ids(cJSON_GetObjectItem(tf, "main_argmax"), &nm);
    assert_int_equal(nd, n - 1);
    fx f;
    fx_open(&f, dir, 64, 64);
    const int V = f.cfg.vocab;
    float *lg = malloc(sizeof(float) * (size_t)(n - 1) * V);
    for (int step = n; step >= 7; step = step == n ? 16 : 7) { /* one pass, then chunked */
        teacher_forced(&f, tokens, n, step, lg, NULL);
        int checked = 0;
        for (int p = 0; p < n - 1; p++) {
            if (cJSON_GetArrayItem(margins, p)->valuedouble < MARGIN_TOL) continue;
            checked++;
            if (argmax_row(lg + (size_t)p * V, V) != drafts[p])
                fail_msg("demo MTP draft at position %d (step %d): got %d, reference %d", p, step,
                         argmax_row(lg + (size_t)p * V, V), drafts[p]);
        }
        assert_true(checked > n / 2);
        if (step == 7) break;
    }
    (void)main_am;
    free(lg);
    free(tokens);
    free(drafts);
    free(main_am);
    cJSON_Delete(j);
    fx_close(&f);
}

/* ---- the tiny fixtures against tools/mtp_reference.py ---------------------------------------- */

static void check_fixture(const char *model_name) {
    char *text = test_read_file(test_data_path("ref/mtp_ref.json"), NULL);
    if (!text) fail_msg("missing ref/mtp_ref.json");
    cJSON *j = cJSON_Parse(text);
    free(text);
    assert_non_null(j);
    const cJSON *ent = NULL, *it;
    cJSON_ArrayForEach(it, cJSON_GetObjectItem(j, "models")) {
        if (!strcmp(cJSON_GetObjectItem(it, "model")->valuestring, model_name)) ent = it;
    }
    assert_non_null(ent);
    char rel[256];
    snprintf(rel, sizeof rel, "ref/%s", cJSON_GetObjectItem(ent, "logits_file")->valuestring);
    size_t len = 0;
    float *ref = (float *)test_read_file(test_data_path(rel), &len);
    assert_non_null(ref);
    char dir[1024];
    snprintf(dir, sizeof dir, "%s/models/%s-mtp", test_data_dir(), model_name);
    fx f;
    fx_open(&f, dir, 256, 256);
    const int V = f.cfg.vocab, H = f.cfg.hidden;
    assert_int_equal(V, cJSON_GetObjectItem(ent, "vocab")->valueint);
    assert_int_equal(len, (size_t)cJSON_GetObjectItem(ent, "total_rows")->valueint * V * 4);

    const cJSON *seq;
    cJSON_ArrayForEach(seq, cJSON_GetObjectItem(ent, "sequences")) {
        int n;
        int32_t *tokens = test_json_ids(cJSON_GetObjectItem(seq, "tokens"), &n);
        const int rows = cJSON_GetObjectItem(seq, "rows")->valueint;
        const int off = cJSON_GetObjectItem(seq, "row_offset")->valueint;
        const cJSON *margins = cJSON_GetObjectItem(seq, "top2_margin");
        assert_int_equal(rows, n - 1);
        float *lg = malloc(sizeof(float) * (size_t)rows * V);
        const int steps[2] = {256, 16}; /* one pass; chunked prefill of target + MTP */
        for (int si = 0; si < 2; si++) {
            teacher_forced(&f, tokens, n, steps[si], lg, NULL);
            double e = test_rel_l2(lg, ref + (size_t)off * V, (size_t)rows * V);
            printf("  %s %s step %d: MTP logits rel L2 %.2e\n", model_name,
                   cJSON_GetObjectItem(seq, "name")->valuestring, steps[si], e);
            assert_true(e < REL_TOL);
            for (int p = 0; p < rows; p++)
                if (cJSON_GetArrayItem(margins, p)->valuedouble > MARGIN_TOL)
                    assert_int_equal(argmax_row(lg + (size_t)p * V, V),
                                     cJSON_GetArrayItem(cJSON_GetObjectItem(seq, "argmax"), p)
                                         ->valueint);
        }
        free(lg);
        free(tokens);
    }

    /* draft chain: step 1 = the last teacher-forced row; step j feeds the MTP's own post-norm
     * output of the previous row and the previous draft, at position n + j - 3 */
    const cJSON *ch;
    cJSON_ArrayForEach(ch, cJSON_GetObjectItem(ent, "chains")) {
        const char *sname = cJSON_GetObjectItem(ch, "seq")->valuestring;
        const cJSON *seqs = cJSON_GetObjectItem(ent, "sequences"), *sq = NULL;
        cJSON_ArrayForEach(it, seqs) if (!strcmp(cJSON_GetObjectItem(it, "name")->valuestring, sname)) sq = it;
        assert_non_null(sq);
        int n, nd;
        int32_t *tokens = test_json_ids(cJSON_GetObjectItem(sq, "tokens"), &n);
        int32_t *rdrafts = test_json_ids(cJSON_GetObjectItem(ch, "drafts"), &nd);
        const int off = cJSON_GetObjectItem(ch, "row_offset")->valueint;
        const cJSON *margins = cJSON_GetObjectItem(ch, "top2_margin");
        float *lg = malloc(sizeof(float) * (size_t)(n - 1) * V);
        float *out = malloc(sizeof(float) * (size_t)(n - 1) * H);
        teacher_forced(&f, tokens, n, 256, lg, out);
        ds_model *m = &f.model;
        ds_session *s = &f.sess;
        float *row = lg + (size_t)(n - 2) * V;
        int32_t d = argmax_row(row, V);
        double e = test_rel_l2(row, ref + (size_t)off * V, (size_t)V);
        assert_true(e < REL_TOL);
        if (cJSON_GetArrayItem(margins, 0)->valuedouble > MARGIN_TOL) assert_int_equal(d, rdrafts[0]);
        d = rdrafts[0]; /* follow the reference chain */
        float *hid = m->be->ops->alloc(m->be, sizeof(float) * (size_t)H);
        memcpy(hid, out + (size_t)(n - 2) * H, sizeof(float) * (size_t)H);
        for (int jstep = 1; jstep < nd; jstep++) {
            int32_t pos = n + jstep - 2, seq_start[2] = {0, 1}, slot = s->gdn_cur[0], past = pos,
                    orow = 0;
            ds_batch b = {.n_tokens = 1, .n_seqs = 1, .tokens = &d, .positions = &pos,
                          .seq_start = seq_start, .seq_slot = &slot, .seq_n_past = &past,
                          .block_table = s->block_table, .max_blocks = s->blocks_per_seq,
                          .n_out = 1, .out_rows = &orow};
            ds_tensor h = ds_view2d(hid, DS_DTYPE_F32, 1, H);
            ds_error err = {0};
            if (ds_mtp_forward(m, s->cache, &b, &h, true, &err) != DS_OK) fail_msg("mtp: %s", err.msg);
            const float *l = m->s.logits.data;
            e = test_rel_l2(l, ref + (size_t)(off + jstep) * V, (size_t)V);
            printf("  %s chain after %s step %d: rel L2 %.2e\n", model_name, sname, jstep + 1, e);
            assert_true(e < REL_TOL);
            if (cJSON_GetArrayItem(margins, jstep)->valuedouble > MARGIN_TOL)
                assert_int_equal(argmax_row(l, V), rdrafts[jstep]);
            d = rdrafts[jstep];
            memcpy(hid, m->mtp.out_h.data, sizeof(float) * (size_t)H);
        }
        m->be->ops->free(m->be, hid);
        free(lg);
        free(out);
        free(tokens);
        free(rdrafts);
    }
    free(ref);
    cJSON_Delete(j);
    fx_close(&f);
}

static void test_fixture_moe(void **state) {
    (void)state;
    check_fixture("tiny-moe");
}

static void test_fixture_dense(void **state) {
    (void)state;
    check_fixture("tiny-dense");
}

/* A model without mtp.* tensors reports DS_ERR_UNSUPPORTED. */
static void test_no_mtp(void **state) {
    (void)state;
    ds_config cfg;
    ds_model_weights host;
    ds_backend *be;
    ds_model m;
    ds_error err = {0};
    char dir[1024];
    snprintf(dir, sizeof dir, "%s/models/tiny-moe", test_data_dir());
    assert_int_equal(ds_model_load(dir, &cfg, &host, &err), DS_OK);
    assert_int_equal(ds_backend_cpu_create(1, &be, &err), DS_OK);
    assert_int_equal(ds_model_init(&m, be, &cfg, &host, 8, 8, &err), DS_OK);
    assert_false(ds_model_has_mtp(&m));
    int32_t tok = 1, pos = 0, ss[2] = {0, 1}, slot = 0, past = 0, bt = 0;
    ds_batch b = {.n_tokens = 1, .n_seqs = 1, .tokens = &tok, .positions = &pos, .seq_start = ss,
                  .seq_slot = &slot, .seq_n_past = &past, .block_table = &bt, .max_blocks = 1};
    assert_int_equal(ds_mtp_forward(&m, NULL, &b, &m.s.normed, true, &err), DS_ERR_UNSUPPORTED);
    ds_model_free(&m);
    be->ops->destroy(be);
    ds_model_weights_free(&host);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_demo_drafts),
        cmocka_unit_test(test_fixture_moe),
        cmocka_unit_test(test_fixture_dense),
        cmocka_unit_test(test_no_mtp),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
