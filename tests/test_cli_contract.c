/* The CLI contract users and scripts rely on, checked through the real binary against the
 * transformers fixtures: `generate --tokens … --print-ids` prints the greedy continuation as
 * one comma-separated line; `score` prints {"pos","argmax","logsumexp"} per position and
 * --logits-out writes float32 [n_tokens × vocab]. */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "testlib.h"

static char *run_capture(const char *cmdline) {
    FILE *p = popen(cmdline, "r");
    assert_non_null(p);
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap);
    size_t got;
    while ((got = fread(buf + n, 1, cap - n - 1, p)) > 0) {
        n += got;
        if (n + 1 == cap) buf = realloc(buf, cap *= 2);
    }
    buf[n] = 0;
    int rc = pclose(p);
    if (rc != 0) fail_msg("command failed (%d): %s", rc, cmdline);
    return buf;
}

static void ids_to_csv(const cJSON *arr, char *out, size_t cap) {
    size_t n = 0;
    out[0] = 0;
    const cJSON *v;
    cJSON_ArrayForEach(v, arr) n += (size_t)snprintf(out + n, cap - n, n ? ",%d" : "%d", v->valueint);
}

static void check_generate(const char *model) {
    cJSON *ref = test_load_ref(model);
    const cJSON *g;
    cJSON_ArrayForEach(g, cJSON_GetObjectItem(ref, "greedy")) {
        char prompt[8192], want[8192], cmd[16384];
        ids_to_csv(cJSON_GetObjectItem(g, "prompt"), prompt, sizeof prompt);
        ids_to_csv(cJSON_GetObjectItem(g, "generated"), want, sizeof want);
        int n = cJSON_GetArraySize(cJSON_GetObjectItem(g, "generated"));
        snprintf(cmd, sizeof cmd,
                 "%s generate -m %s/models/%s --tokens %s -n %d --ignore-eos --print-ids "
                 "--device cpu 2>/dev/null",
                 test_bin(), test_data_dir(), model, prompt, n);
        char *out = run_capture(cmd);
        out[strcspn(out, "\n")] = 0;
        assert_string_equal(out, want);
        free(out);
    }
    cJSON_Delete(ref);
}

static void test_generate_moe(void **st) { (void)st; check_generate("tiny-moe"); }
static void test_generate_dense(void **st) { (void)st; check_generate("tiny-dense"); }

static void test_score(void **st) {
    (void)st;
    cJSON *ref = test_load_ref("tiny-moe");
    const cJSON *seq = cJSON_GetArrayItem(cJSON_GetObjectItem(ref, "sequences"), 3); /* len63 */
    const cJSON *toks = cJSON_GetObjectItem(seq, "tokens");
    int n = cJSON_GetArraySize(toks);
    char ids[8192], cmd[16384], tmp[] = "/tmp/ds_score_XXXXXX";
    ids_to_csv(toks, ids, sizeof ids);
    int fd = mkstemp(tmp);
    assert_true(fd >= 0);
    close(fd);
    snprintf(cmd, sizeof cmd, "%s score -m %s/models/tiny-moe --tokens %s --logits-out %s --device cpu",
             test_bin(), test_data_dir(), ids, tmp);
    char *out = run_capture(cmd);
    const cJSON *am = cJSON_GetObjectItem(seq, "argmax"), *lse = cJSON_GetObjectItem(seq, "logsumexp");
    char *line = out;
    for (int p = 0; p < n; p++) {
        char *nl = strchr(line, '\n');
        assert_non_null(nl);
        *nl = 0;
        cJSON *j = cJSON_Parse(line);
        assert_non_null(j);
        assert_int_equal(cJSON_GetObjectItem(j, "pos")->valueint, p);
        assert_int_equal(cJSON_GetObjectItem(j, "argmax")->valueint, cJSON_GetArrayItem(am, p)->valueint);
        double got = cJSON_GetObjectItem(j, "logsumexp")->valuedouble;
        double want = cJSON_GetArrayItem(lse, p)->valuedouble;
        assert_true(fabs(got - want) <= 1e-4 * fabs(want) + 1e-5);
        cJSON_Delete(j);
        line = nl + 1;
    }
    assert_int_equal(*line, 0);
    size_t len = 0;
    char *bin = test_read_file(tmp, &len);
    assert_non_null(bin);
    assert_int_equal(len, (size_t)n * 512 * sizeof(float));
    char rel[128];
    snprintf(rel, sizeof rel, "ref/%s", cJSON_GetObjectItem(seq, "file")->valuestring);
    size_t rlen = 0;
    char *want = test_read_file(test_data_path(rel), &rlen);
    assert_int_equal(rlen, len);
    assert_true(test_rel_l2((float *)bin, (float *)want, len / sizeof(float)) < 1e-4);
    free(bin);
    free(want);
    free(out);
    unlink(tmp);
    cJSON_Delete(ref);
}

/* The bundled demo model (models/qwen35-demo) against transformers' own greedy generations of
 * the same checkpoint (fp32 from the bf16 files): deltaserve on the CPU must produce the same ids,
 * and its tokenizer must give transformers' prompt ids for the prompt texts. */
static void test_demo_model_matches_transformers(void **st) {
    (void)st;
    char *text = test_read_file("models/qwen35-demo/reference_greedy.json", NULL);
    assert_non_null(text);
    cJSON *ref = cJSON_Parse(text);
    free(text);
    assert_non_null(ref);
    const cJSON *g;
    int n_cases = 0;
    cJSON_ArrayForEach(g, cJSON_GetObjectItem(ref, "greedy")) {
        char prompt[16384], want[4096], cmd[32768];
        ids_to_csv(cJSON_GetObjectItem(g, "prompt"), prompt, sizeof prompt);
        ids_to_csv(cJSON_GetObjectItem(g, "generated"), want, sizeof want);
        int n = cJSON_GetArraySize(cJSON_GetObjectItem(g, "generated"));
        snprintf(cmd, sizeof cmd,
                 "%s generate -m models/qwen35-demo --tokens %s -n %d --ignore-eos --print-ids "
                 "--device cpu 2>/dev/null",
                 test_bin(), prompt, n);
        char *out = run_capture(cmd);
        out[strcspn(out, "\n")] = 0;
        if (strcmp(out, want) != 0)
            fail_msg("%s: got %s want %s", cJSON_GetObjectItem(g, "name")->valuestring, out, want);
        free(out);
        /* the prompt text tokenises to transformers' ids */
        const cJSON *pt = cJSON_GetObjectItem(g, "prompt_text");
        if (cJSON_IsString(pt)) {
            char path[] = "/tmp/ds_demo_prompt_XXXXXX";
            int fd = mkstemp(path);
            assert_true(fd >= 0);
            size_t len = strlen(pt->valuestring);
            assert_int_equal(write(fd, pt->valuestring, len), (ssize_t)len);
            close(fd);
            snprintf(cmd, sizeof cmd,
                     "%s tokenize --tokenizer models/qwen35-demo --text-file %s", test_bin(), path);
            out = run_capture(cmd);
            unlink(path);
            char want_ids[sizeof prompt + 3]; /* "[" + prompt + "]" */
            snprintf(want_ids, sizeof want_ids, "[%s]", prompt);
            out[strcspn(out, "\n")] = 0;
            assert_string_equal(out, want_ids);
            free(out);
        }
        n_cases++;
    }
    assert_true(n_cases >= 3);
    cJSON_Delete(ref);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_generate_moe),
        cmocka_unit_test(test_generate_dense),
        cmocka_unit_test(test_score),
        cmocka_unit_test(test_demo_model_matches_transformers),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
