#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "bench/bench_serve.h"

double ds_bench_percentile(const double *x, int n, double p) {
    if (n <= 0) return 0.0;
    double h = (double)(n - 1) * p / 100.0;
    int lo = (int)floor(h);
    if (lo >= n - 1) return x[n - 1];
    if (lo < 0) return x[0];
    return x[lo] + (h - lo) * (x[lo + 1] - x[lo]);
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

ds_bench_stat ds_bench_stats(double *v, int n) {
    ds_bench_stat s = {0};
    if (n <= 0) return s;
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    double sum = 0;
    for (int i = 0; i < n; i++) sum += v[i];
    s.mean = sum / n;
    double ss = 0;
    for (int i = 0; i < n; i++) ss += (v[i] - s.mean) * (v[i] - s.mean);
    s.std = sqrt(ss / n); /* numpy's default ddof = 0 */
    s.median = ds_bench_percentile(v, n, 50);
    s.p99 = ds_bench_percentile(v, n, 99);
    return s;
}

uint64_t ds_bench_rng_next(ds_bench_rng *r) {
    uint64_t z = (r->s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

double ds_bench_rng_uniform(ds_bench_rng *r) {
    return (double)(ds_bench_rng_next(r) >> 11) * (1.0 / 9007199254740992.0);
}

int ds_bench_rng_int(ds_bench_rng *r, int lo, int hi) {
    if (hi <= lo) return lo;
    uint64_t span = (uint64_t)((int64_t)hi - lo + 1);
    return lo + (int)(ds_bench_rng_next(r) % span);
}

void ds_sse_init(ds_sse_reader *r, void (*on_data)(void *, const char *, size_t), void *ctx) {
    ds_strbuf_init(&r->line);
    r->on_data = on_data;
    r->ctx = ctx;
}

void ds_sse_free(ds_sse_reader *r) { ds_strbuf_free(&r->line); }

static void sse_line(ds_sse_reader *r, const char *s, size_t n) {
    if (n && s[n - 1] == '\r') n--;
    if (n < 5 || memcmp(s, "data:", 5) != 0) return; /* comments, event:, id:, blank lines */
    s += 5;
    n -= 5;
    if (n && *s == ' ') s++, n--;
    r->on_data(r->ctx, s, n);
}

void ds_sse_feed(ds_sse_reader *r, const char *buf, size_t len) {
    size_t start = 0;
    for (size_t i = 0; i < len; i++) {
        if (buf[i] != '\n') continue;
        if (r->line.len) {
            ds_strbuf_append(&r->line, buf + start, i - start);
            sse_line(r, r->line.data, r->line.len);
            ds_strbuf_clear(&r->line);
        } else {
            sse_line(r, buf + start, i - start);
        }
        start = i + 1;
    }
    if (start < len) ds_strbuf_append(&r->line, buf + start, len - start);
}
