/* test_ablation_report.c — the ablation report writers (bench/ablation_report.h) on made-up
 * numbers whose changes were worked out by hand: the Markdown table (one line per row, changes in
 * ms and % with their signs, rows that did not run skipped as the comparison base, the best-row
 * line), the SVG (well-formed, one bar per measured cell, bar heights proportional to the values,
 * ticks, legend, title) and the JSON lines (parse, one per row and batch). */
#include "testlib.h"

#include <ctype.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench/ablation_report.h"

static void set_cells(ds_abl_row *row, double c1, double c4, double c8) {
    const double v[3] = {c1, c4, c8};
    for (int j = 0; j < 3; j++) {
        row->cells[j].tpot_ms = v[j];
        row->cells[j].p10_ms = v[j] * 0.9;
        row->cells[j].p90_ms = v[j] * 1.1;
        row->cells[j].kernels = 400;
        row->cells[j].graph = true;
    }
}

/* Rows 0, 1, 2, 3 (not run), 4, 7 (MTP, c=4/8 computed). Hand-worked changes:
 *   1 vs 0: 3.500-4.000 = -0.500 (-12.5%), 7.000-8.000 = -1.000 (-12.5%),
 *           12.600-12.000 = +0.600 (+5.0%)
 *   2 vs 1: -0.350 (-10.0%), -0.700 (-10.0%), +0.000 (+0.0%)
 *   4 vs 2 (3 did not run): 3.465-3.150 = +0.315 (+10.0%), 5.670-6.300 = -0.630 (-10.0%),
 *           11.340-12.600 = -1.260 (-10.0%)
 *   7 vs 4: 3.000-3.465 = -0.465 (-13.4%), 4.000-5.670 = -1.670 (-29.5%),
 *           9.000-11.340 = -2.340 (-20.6%)
 *   best c=1: row 7, 3.000 ms, (3-4)/4 = -25.0% vs row 0 */
static void make_report(ds_abl_report *r) {
    memset(r, 0, sizeof *r);
    r->commit = "abc123def456";
    r->gpu = "NVIDIA H200";
    r->backend = "cuda";
    r->model = "configs/qwen3.5-35b-a3b";
    r->command = "deltaserve bench --ablation -m configs/qwen3.5-35b-a3b";
    r->date_utc = "2026-12-02 12:00:00 UTC";
    r->steps = 512;
    r->warmup = 8;
    r->prompt_len = 1024;
    r->n_batches = 3;
    r->batches[0] = 1;
    r->batches[1] = 4;
    r->batches[2] = 8;
    static const int idx[6] = {0, 1, 2, 3, 4, 7};
    static const char *labels[6] = {"baseline: everything off", "+ graphs", "+ fused argmax",
                                    "+ a|b & <c>", "+ shared expert", "+ MTP, k = 1"};
    r->n_rows = 6;
    for (int i = 0; i < 6; i++) {
        r->rows[i].index = idx[i];
        r->rows[i].label = labels[i];
        r->rows[i].items = i ? "14" : "";
        r->rows[i].switches = "graphs=1";
        r->rows[i].run = true;
        r->rows[i].ttft_ms = 500.0 - i;
    }
    set_cells(&r->rows[0], 4.000, 8.000, 12.000);
    set_cells(&r->rows[1], 3.500, 7.000, 12.600);
    set_cells(&r->rows[2], 3.150, 6.300, 12.600);
    r->rows[3].run = false;
    r->rows[3].note = "not run (no MTP head)";
    set_cells(&r->rows[4], 3.465, 5.670, 11.340);
    ds_abl_row *m = &r->rows[5];
    m->spec = true;
    m->spec_k = 1;
    m->spec_generated = 512;
    m->acceptance_rate = 0.5;
    m->tokens_per_step = 1.5;
    m->plain_ms_b1 = 3.4;
    m->cells[0] = (ds_abl_cell){.tpot_ms = 3.000};
    m->cells[1] = (ds_abl_cell){.tpot_ms = 4.000, .computed = true, .verify_ms = 5.0,
                                .draft_ms = 1.0};
    m->cells[2] = (ds_abl_cell){.tpot_ms = 9.000, .computed = true, .verify_ms = 11.5,
                                .draft_ms = 2.0};
}

typedef int (*writer_fn)(const ds_abl_report *, FILE *);

static char *render(const ds_abl_report *r, writer_fn w) {
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    assert_non_null(f);
    assert_int_equal(w(r, f), 0);
    assert_int_equal(fclose(f), 0);
    assert_non_null(buf);
    return buf;
}

/* The table line of row `idx` ("| idx | ..."), copied into out. */
static bool table_line(const char *md, int idx, char *out, size_t cap) {
    char key[16];
    snprintf(key, sizeof key, "| %d | ", idx);
    for (const char *p = md; p && *p;) {
        const char *e = strchr(p, '\n');
        const size_t n = e ? (size_t)(e - p) : strlen(p);
        if (!strncmp(p, key, strlen(key))) {
            snprintf(out, cap, "%.*s", (int)n, p);
            return true;
        }
        p = e ? e + 1 : NULL;
    }
    return false;
}

/* Unescaped '|' in a line. */
static int count_pipes(const char *s) {
    int n = 0;
    for (; *s; s++) {
        if (*s == '\\' && s[1] == '|') s++;
        else if (*s == '|') n++;
    }
    return n;
}

static int count_str(const char *s, const char *needle) {
    int n = 0;
    for (const char *p = s; (p = strstr(p, needle)); p += strlen(needle)) n++;
    return n;
}

static void test_change_values(void **state) {
    (void)state;
    ds_abl_report *r = calloc(1, sizeof *r);
    make_report(r);
    double d, pct;
    assert_false(ds_abl_change(r, 0, 0, &d, &pct)); /* nothing before the baseline */
    assert_true(ds_abl_change(r, 2, 0, &d, &pct));
    assert_true(fabs(d - -0.350) < 1e-9 && fabs(pct - -10.0) < 1e-9);
    assert_true(ds_abl_change(r, 1, 2, &d, &pct));
    assert_true(fabs(d - 0.600) < 1e-9 && fabs(pct - 5.0) < 1e-9); /* slower: positive */
    assert_false(ds_abl_change(r, 3, 0, &d, &pct));                /* did not run */
    assert_true(ds_abl_change(r, 4, 0, &d, &pct));                 /* vs row 2, not 3 */
    assert_true(fabs(d - 0.315) < 1e-9 && fabs(pct - 10.0) < 1e-9);
    assert_int_equal(ds_abl_b1_column(r), 0);
    assert_int_equal(ds_abl_best_row(r, 0), 5);
    assert_int_equal(ds_abl_best_row(r, 2), 5);
    free(r);
}

static void test_markdown(void **state) {
    (void)state;
    ds_abl_report *r = calloc(1, sizeof *r);
    make_report(r);
    char *md = render(r, ds_abl_write_markdown);
    char line[1024];

    /* header: commit, GPU, command, date, steps */
    assert_non_null(strstr(md, "abc123def456"));
    assert_non_null(strstr(md, "NVIDIA H200"));
    assert_non_null(strstr(md, "`deltaserve bench --ablation -m configs/qwen3.5-35b-a3b`"));
    assert_non_null(strstr(md, "2026-12-02 12:00:00 UTC"));
    assert_non_null(strstr(md, "512 measured steps"));
    assert_non_null(strstr(md, "| # | item (catalogue no.) | TPOT c=1 | c=4 | c=8 | TTFT 1024 |"));

    /* one table line per row, every line with the header's column count */
    int n_lines = 0;
    const int header_pipes = 8; /* 7 columns */
    for (const char *p = md; p && *p;) {
        const char *e = strchr(p, '\n');
        char buf[1024];
        snprintf(buf, sizeof buf, "%.*s", (int)(e ? e - p : (long)strlen(p)), p);
        if (buf[0] == '|') assert_int_equal(count_pipes(buf), header_pipes);
        if (buf[0] == '|' && buf[1] == ' ' && isdigit((unsigned char)buf[2])) n_lines++;
        p = e ? e + 1 : NULL;
    }
    assert_int_equal(n_lines, 6);

    assert_true(table_line(md, 0, line, sizeof line));
    assert_non_null(strstr(line, "| 4.000 ms | 8.000 ms | 12.000 ms | 500.0 ms | reference |"));
    assert_true(table_line(md, 1, line, sizeof line));
    assert_non_null(strstr(line, "-0.500 ms (-12.5%) / -1.000 ms (-12.5%) / +0.600 ms (+5.0%)"));
    assert_true(table_line(md, 2, line, sizeof line));
    assert_non_null(strstr(line, "-0.350 ms (-10.0%) / -0.700 ms (-10.0%) / +0.000 ms (+0.0%)"));
    assert_true(table_line(md, 3, line, sizeof line));
    assert_non_null(strstr(line, "a\\|b & <c>"));
    assert_non_null(strstr(line, "not run (no MTP head)"));
    assert_true(table_line(md, 4, line, sizeof line));
    assert_non_null(strstr(line, "+0.315 ms (+10.0%) / -0.630 ms (-10.0%) / -1.260 ms (-10.0%)"));
    assert_true(table_line(md, 7, line, sizeof line));
    assert_non_null(strstr(line, "| 3.000 ms | 4.000 ms † | 9.000 ms † |"));
    assert_non_null(strstr(line, "-0.465 ms (-13.4%) / -1.670 ms (-29.5%) / -2.340 ms (-20.6%)"));

    /* the MTP notes: measured acceptance, computed cells explained */
    assert_non_null(strstr(md, "acceptance rate 0.50, 1.50 tokens per verification step"));
    assert_non_null(strstr(md, "computed from measured step times, not a generation"));
    assert_non_null(strstr(md, "c=4: (5.000 + 1.000) / 1.50"));
    assert_null(strstr(md, "Nothing was accepted")); /* acceptance 0.5 */

    const char *best = strstr(md, "Best c=1 row: 7 (+ MTP, k = 1) at 3.000 ms, -25.0% vs row 0");
    assert_non_null(best);
    assert_null(strchr(best, '\n') ? strstr(strchr(best, '\n'), "|") : NULL); /* last line */
    free(md);

    /* zero acceptance: the report says nothing was accepted */
    r->rows[5].acceptance_rate = 0;
    r->rows[5].tokens_per_step = 1;
    md = render(r, ds_abl_write_markdown);
    assert_non_null(strstr(md, "Nothing was accepted"));
    free(md);
    free(r);
}

static void test_markdown_edges(void **state) {
    (void)state;
    ds_abl_report *r = calloc(1, sizeof *r);
    make_report(r);
    /* the baseline did not run: row 1 becomes the reference, row 2 compares with it */
    r->rows[0].run = false;
    r->rows[0].note = "failed: out of memory";
    char *md = render(r, ds_abl_write_markdown);
    char line[1024];
    assert_true(table_line(md, 1, line, sizeof line));
    assert_non_null(strstr(line, "| reference |"));
    assert_true(table_line(md, 2, line, sizeof line));
    assert_non_null(strstr(line, "-0.350 ms (-10.0%)"));
    assert_non_null(strstr(md, "Best c=1 row: 7 (+ MTP, k = 1) at 3.000 ms.")); /* no row 0 */
    free(md);
    /* nothing ran */
    for (int i = 0; i < r->n_rows; i++) r->rows[i].run = false;
    md = render(r, ds_abl_write_markdown);
    assert_non_null(strstr(md, "Best c=1 row: none"));
    free(md);
    free(r);
}

/* Minimal XML well-formedness: balanced, properly nested tags with one root <svg>, quoted
 * attributes, only the predefined entities, no stray '<' or '>' in text. */
static void check_xml(const char *s) {
    const char *stack[256];
    size_t stack_len[256];
    int depth = 0, roots = 0;
    const char *p = s;
    if (!strncmp(p, "<?xml", 5)) {
        p = strstr(p, "?>");
        assert_non_null(p);
        p += 2;
    }
    while (*p) {
        if (*p == '<') {
            const bool closing = p[1] == '/';
            const char *name = p + (closing ? 2 : 1);
            size_t n = 0;
            while (isalnum((unsigned char)name[n]) || name[n] == '-' || name[n] == ':') n++;
            assert_true(n > 0);
            const char *q = name + n;
            char quote = 0;
            for (; *q && (quote || *q != '>'); q++) {
                if (quote && *q == quote) quote = 0;
                else if (!quote && (*q == '"' || *q == '\'')) quote = *q;
                else if (!quote) assert_true(*q != '<');
            }
            assert_int_equal(*q, '>');
            const bool self_closing = q[-1] == '/';
            if (closing) {
                assert_true(depth > 0);
                depth--;
                assert_int_equal(stack_len[depth], n);
                assert_memory_equal(stack[depth], name, n);
            } else if (!self_closing) {
                if (depth == 0) roots++;
                assert_true(depth < 256);
                stack[depth] = name;
                stack_len[depth++] = n;
            } else if (depth == 0) {
                roots++;
            }
            p = q + 1;
        } else {
            assert_true(*p != '>');
            if (*p == '&') {
                assert_true(!strncmp(p, "&amp;", 5) || !strncmp(p, "&lt;", 4) ||
                            !strncmp(p, "&gt;", 4) || !strncmp(p, "&quot;", 6) ||
                            !strncmp(p, "&apos;", 6) || !strncmp(p, "&#", 2));
            }
            if (depth == 0) assert_true(isspace((unsigned char)*p)); /* nothing outside root */
            p++;
        }
    }
    assert_int_equal(depth, 0);
    assert_int_equal(roots, 1);
    const char *root = strstr(s, "<svg");
    assert_non_null(root);
    assert_non_null(strstr(root, "xmlns=\"http://www.w3.org/2000/svg\""));
}

/* Value of attribute `name` inside the tag starting at tag. */
static double attr(const char *tag, const char *name) {
    char key[32];
    snprintf(key, sizeof key, " %s=\"", name);
    const char *end = strchr(tag, '>');
    const char *a = strstr(tag, key);
    assert_true(a && a < end);
    return strtod(a + strlen(key), NULL);
}

static void test_svg(void **state) {
    (void)state;
    ds_abl_report *r = calloc(1, sizeof *r);
    make_report(r);
    char *svg = render(r, ds_abl_write_svg);
    check_xml(svg);
    /* one bar per measured cell: 5 rows ran × 3 batch sizes */
    assert_int_equal(count_str(svg, "<rect class=\"bar\""), 15);
    assert_int_equal(count_str(svg, "<rect class=\"legend\""), 3);
    /* bar height ∝ value, bars stand on one baseline */
    double ratio = 0, base = 0;
    int k = 0;
    for (int i = 0; i < r->n_rows; i++) {
        if (!r->rows[i].run) continue;
        for (int j = 0; j < 3; j++) {
            const char *p = svg;
            for (int m = 0; m <= k; m++) p = strstr(p, "<rect class=\"bar\"") + 1;
            const char *tag = p - 1;
            const double h = attr(tag, "height"), y = attr(tag, "y");
            const double rr = h / r->rows[i].cells[j].tpot_ms;
            if (k == 0) {
                ratio = rr;
                base = y + h;
            }
            assert_true(fabs(rr - ratio) < 1e-2 * ratio);
            assert_true(fabs(y + h - base) < 0.11);
            k++;
        }
    }
    /* y ticks: numbers right-aligned at the axis, the top one at least the largest bar */
    int ticks = 0;
    double top_tick = 0;
    for (const char *p = svg; (p = strstr(p, "text-anchor=\"end\">")); p++) {
        top_tick = fmax(top_tick, strtod(p + strlen("text-anchor=\"end\">"), NULL));
        ticks++;
    }
    assert_true(ticks >= 3);
    assert_true(top_tick >= 12.6);
    /* legend, title, escaped label */
    assert_non_null(strstr(svg, ">c=1</text>"));
    assert_non_null(strstr(svg, ">c=4</text>"));
    assert_non_null(strstr(svg, ">c=8</text>"));
    assert_non_null(strstr(svg, "abc123def456"));
    assert_non_null(strstr(svg, "NVIDIA H200"));
    assert_non_null(strstr(svg, "a|b &amp; &lt;c&gt;"));
    assert_non_null(strstr(svg, "ms"));
    free(svg);
    free(r);
}

static void test_jsonl(void **state) {
    (void)state;
    ds_abl_report *r = calloc(1, sizeof *r);
    make_report(r);
    char *js = render(r, ds_abl_write_jsonl);
    int lines = 0, computed = 0, not_run = 0;
    for (char *p = js; p && *p;) {
        char *e = strchr(p, '\n');
        assert_non_null(e);
        *e = 0;
        cJSON *o = cJSON_Parse(p);
        assert_non_null(o);
        lines++;
        const cJSON *run = cJSON_GetObjectItem(o, "run");
        assert_true(cJSON_IsBool(run));
        assert_string_equal(cJSON_GetObjectItem(o, "commit")->valuestring, "abc123def456");
        if (cJSON_IsFalse(run)) {
            not_run++;
            assert_int_equal(cJSON_GetObjectItem(o, "row")->valueint, 3);
        } else {
            const double ms = cJSON_GetObjectItem(o, "step_ms")->valuedouble;
            assert_true(isfinite(ms) && ms > 0);
            computed += cJSON_IsTrue(cJSON_GetObjectItem(o, "computed"));
            if (cJSON_GetObjectItem(o, "row")->valueint == 1 &&
                cJSON_GetObjectItem(o, "batch")->valueint == 8)
                assert_true(fabs(ms - 12.6) < 1e-9);
        }
        cJSON_Delete(o);
        p = e + 1;
    }
    assert_int_equal(lines, 16);
    assert_int_equal(not_run, 1);
    assert_int_equal(computed, 2);
    free(js);
    free(r);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_change_values), cmocka_unit_test(test_markdown),
        cmocka_unit_test(test_markdown_edges), cmocka_unit_test(test_svg),
        cmocka_unit_test(test_jsonl)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
