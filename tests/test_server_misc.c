/* test_server_misc.c — the server's small parts against independent references:
 *  - json_py: Python's json.dumps spellings (strings copied from CPython 3 output);
 *  - metrics: Prometheus histogram lines (cumulative buckets, le bounds, sum, count);
 *  - bench statistics: numpy.percentile's linear interpolation (values from numpy docs /
 *    worked by hand), and the SSE reader under every split of a stream. */
#include "testlib.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "bench/bench_client.h"
#include "bench/bench_serve.h"
#include "server/json_py.h"
#include "server/metrics.h"

/* ---- json_py ------------------------------------------------------------------------------- */

static void test_json_py(void **state) {
    (void)state;
    /* left: JSON input; right: python3 -c 'import json;print(json.dumps(json.loads(IN),
     * ensure_ascii=False))' (integral floats excepted: cJSON keeps no int/float distinction) */
    static const char *const cases[][2] = {
        {"{\"a\":1,\"b\":[true,false,null],\"c\":\"x\"}", "{\"a\": 1, \"b\": [true, false, null], \"c\": \"x\"}"},
        {"[0.1, 0.5, 1e-05, 2.5e-07, 1e+20, 123.456, -0.001, 1e16]",
         "[0.1, 0.5, 1e-05, 2.5e-07, 1e+20, 123.456, -0.001, 1e+16]"},
        {"[3.141592653589793, 1.7976931348623157e308, 5e-324, 0.0001, 100.5]",
         "[3.141592653589793, 1.7976931348623157e+308, 5e-324, 0.0001, 100.5]"},
        {"[1234567890123456.7, 0.30000000000000004]", "[1234567890123456.8, 0.30000000000000004]"},
        {"\"q\\\"uote\\\\ \\n\\t\\r\\b\\f \\u0001 \\u007f Zürich 東京 \\ud83d\\ude00\"",
         "\"q\\\"uote\\\\ \\n\\t\\r\\b\\f \\u0001 \x7f Zürich 東京 \xF0\x9F\x98\x80\""},
        {"{}", "{}"},
        {"[]", "[]"},
        {"{\"z\":{\"y\":[]},\"a\":-7}", "{\"z\": {\"y\": []}, \"a\": -7}"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        cJSON *v = cJSON_Parse(cases[i][0]);
        assert_non_null(v);
        ds_strbuf b;
        ds_strbuf_init(&b);
        ds_json_py_dump(&b, v);
        if (strcmp(b.data, cases[i][1]) != 0) fail_msg("got %s\nwant %s", b.data, cases[i][1]);
        ds_strbuf_free(&b);
        cJSON_Delete(v);
    }
}

/* ---- metrics ------------------------------------------------------------------------------- */

static void test_metrics_render(void **state) {
    (void)state;
    ds_metrics m;
    ds_metrics_init(&m);
    ds_metrics_observe_ttft(&m, 0.003);  /* bucket le=0.005 */
    ds_metrics_observe_ttft(&m, 0.005);  /* le is inclusive */
    ds_metrics_observe_ttft(&m, 5000.0); /* only +Inf */
    ds_metrics_observe_request(&m, DS_METRICS_FINISH_LENGTH, 2.0, 0.5, 10, 4);
    ds_metrics_count_http(&m, 200);
    ds_metrics_count_http(&m, 503);
    ds_metrics_count_http(&m, 200);
    ds_engine_stats st = {.running = 2, .waiting = 3, .kv_blocks_total = 8, .kv_blocks_used = 2,
                          .slots_total = 4, .slots_used = 2, .prompt_tokens = 11,
                          .generation_tokens = 22, .prefix_entries = 1, .prefix_blocks = 3,
                          .prefix_queries = 40, .prefix_hits = 25, .prefix_evicted = 6};
    ds_strbuf out;
    ds_strbuf_init(&out);
    ds_metrics_render(&m, &st, "my \"model\"", &out);
    const char *t = out.data;
    const char *want[] = {
        "# TYPE deltaserve:num_requests_running gauge\n",
        "deltaserve:num_requests_running{model_name=\"my \\\"model\\\"\"} 2\n",
        "deltaserve:num_requests_waiting{model_name=\"my \\\"model\\\"\"} 3\n",
        "deltaserve:kv_cache_usage_perc{model_name=\"my \\\"model\\\"\"} 0.25\n",
        "deltaserve:state_slots_used{model_name=\"my \\\"model\\\"\"} 2\n",
        "deltaserve:prompt_tokens_total{model_name=\"my \\\"model\\\"\"} 11\n",
        "deltaserve:generation_tokens_total{model_name=\"my \\\"model\\\"\"} 22\n",
        "deltaserve:prefix_cache_entries{model_name=\"my \\\"model\\\"\"} 1\n",
        "deltaserve:prefix_cache_blocks{model_name=\"my \\\"model\\\"\"} 3\n",
        "deltaserve:prefix_cache_evictions_total{model_name=\"my \\\"model\\\"\"} 6\n",
        "# TYPE vllm:prefix_cache_queries_total counter\n",
        "vllm:prefix_cache_queries_total{model_name=\"my \\\"model\\\"\"} 40\n",
        "vllm:prefix_cache_hits_total{model_name=\"my \\\"model\\\"\"} 25\n",
        "# TYPE deltaserve:time_to_first_token_seconds histogram\n",
        "deltaserve:time_to_first_token_seconds_bucket{model_name=\"my \\\"model\\\"\",le=\"0.001\"} 0\n",
        "deltaserve:time_to_first_token_seconds_bucket{model_name=\"my \\\"model\\\"\",le=\"0.005\"} 2\n",
        "deltaserve:time_to_first_token_seconds_bucket{model_name=\"my \\\"model\\\"\",le=\"2560\"} 2\n",
        "deltaserve:time_to_first_token_seconds_bucket{model_name=\"my \\\"model\\\"\",le=\"+Inf\"} 3\n",
        "deltaserve:time_to_first_token_seconds_count{model_name=\"my \\\"model\\\"\"} 3\n",
        "deltaserve:request_success_total{model_name=\"my \\\"model\\\"\",finished_reason=\"length\"} 1\n",
        "deltaserve:request_success_total{model_name=\"my \\\"model\\\"\",finished_reason=\"stop\"} 0\n",
        "deltaserve:http_requests_total{model_name=\"my \\\"model\\\"\",code=\"200\"} 2\n",
        "deltaserve:http_requests_total{model_name=\"my \\\"model\\\"\",code=\"503\"} 1\n",
        /* TPOT = (2.0 - 0.5) / (4 - 1) = 0.5 */
        "deltaserve:request_time_per_output_token_seconds_sum{model_name=\"my \\\"model\\\"\"} 0.5\n",
        "deltaserve:e2e_request_latency_seconds_sum{model_name=\"my \\\"model\\\"\"} 2\n",
    };
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++)
        if (!strstr(t, want[i])) fail_msg("missing line: %s", want[i]);
    /* every sample line: name{labels} value */
    for (const char *line = t; *line;) {
        const char *nl = strchr(line, '\n');
        assert_non_null(nl);
        if (*line != '#') {
            assert_true(!strncmp(line, "deltaserve:", 11) || !strncmp(line, "vllm:", 5));
            const char *sp = nl;
            while (sp > line && sp[-1] != ' ') sp--;
            char *end;
            strtod(sp, &end);
            assert_ptr_equal(end, nl);
        }
        line = nl + 1;
    }
    ds_strbuf_free(&out);
    ds_metrics_free(&m);
}

/* ---- bench statistics and SSE ------------------------------------------------------------- */

static void test_percentile(void **state) {
    (void)state;
    /* numpy.percentile([1, 2, 3, 4], 99) = 3.97; [15, 20, 35, 40, 50]: 40th = 29, 50th = 35 */
    double a[] = {1, 2, 3, 4};
    assert_true(fabs(ds_bench_percentile(a, 4, 99) - 3.97) < 1e-12);
    assert_true(fabs(ds_bench_percentile(a, 4, 50) - 2.5) < 1e-12);
    assert_true(fabs(ds_bench_percentile(a, 4, 0) - 1) < 1e-12);
    assert_true(fabs(ds_bench_percentile(a, 4, 100) - 4) < 1e-12);
    double b[] = {15, 20, 35, 40, 50};
    assert_true(fabs(ds_bench_percentile(b, 5, 40) - 29) < 1e-12);
    assert_true(fabs(ds_bench_percentile(b, 5, 50) - 35) < 1e-12);
    double one[] = {7};
    assert_true(ds_bench_percentile(one, 1, 99) == 7);
    double v[] = {4, 1, 3, 2};
    ds_bench_stat s = ds_bench_stats(v, 4);
    assert_true(fabs(s.mean - 2.5) < 1e-12);
    assert_true(fabs(s.median - 2.5) < 1e-12);
    assert_true(fabs(s.p99 - 3.97) < 1e-12);
    assert_true(fabs(s.std - sqrt(1.25)) < 1e-12); /* numpy std, ddof = 0 */
    ds_bench_stat z = ds_bench_stats(NULL, 0);
    assert_true(z.mean == 0 && z.p99 == 0);
}

typedef struct sse_acc {
    char buf[1024];
    size_t len;
    int n;
} sse_acc;

static void on_data(void *ctx, const char *d, size_t n) {
    sse_acc *a = ctx;
    assert_true(a->len + n + 1 < sizeof a->buf);
    memcpy(a->buf + a->len, d, n);
    a->len += n;
    a->buf[a->len++] = '|';
    a->n++;
}

static void test_sse_reader(void **state) {
    (void)state;
    const char *stream = "data: {\"a\":1}\n\n: keep-alive comment\n\ndata:{\"b\":2}\r\n\r\n"
                         "event: x\ndata: [DONE]\n\n";
    const char *want = "{\"a\":1}|{\"b\":2}|[DONE]|";
    size_t n = strlen(stream);
    for (size_t cut1 = 0; cut1 <= n; cut1++)
        for (size_t cut2 = cut1; cut2 <= n; cut2 += 7) {
            sse_acc a = {0};
            ds_sse_reader r;
            ds_sse_init(&r, on_data, &a);
            ds_sse_feed(&r, stream, cut1);
            ds_sse_feed(&r, stream + cut1, cut2 - cut1);
            ds_sse_feed(&r, stream + cut2, n - cut2);
            ds_sse_free(&r);
            a.buf[a.len] = 0;
            if (strcmp(a.buf, want) != 0) fail_msg("cuts %zu/%zu: %s", cut1, cut2, a.buf);
        }
}

/* bench serve's clock starts at the first chunk carrying a token: text, or token ids alone
 * (return_token_ids, text held back by the detokenizer); an empty chunk without ids does not
 * count. */
static void test_bench_token_chunks(void **state) {
    (void)state;
    ds_bench_request r = {0};
    r.t_send = ds_bench_now();
    const char *empty = "{\"choices\":[{\"index\":0,\"text\":\"\"}]}";
    const char *ids_only = "{\"choices\":[{\"index\":0,\"text\":\"\",\"token_ids\":[17]}]}";
    const char *text = "{\"choices\":[{\"index\":0,\"text\":\"ab\",\"token_ids\":[5,6]}]}";
    ds_bench_request_event(&r, empty, strlen(empty));
    assert_int_equal(r.n_content_chunks, 0);
    ds_bench_request_event(&r, ids_only, strlen(ids_only));
    assert_int_equal(r.n_content_chunks, 1);
    assert_true(r.ttft >= 0);
    ds_bench_request_event(&r, text, strlen(text));
    assert_int_equal(r.n_content_chunks, 2);
    assert_int_equal(r.n_itl, 1);
    assert_int_equal(r.n_out_ids, 3);
    assert_int_equal(r.out_ids[0], 17);
    ds_bench_request_free(&r);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bench_token_chunks),
        cmocka_unit_test(test_json_py),
        cmocka_unit_test(test_metrics_render),
        cmocka_unit_test(test_percentile),
        cmocka_unit_test(test_sse_reader),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
