#include "testlib.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

const char *test_data_dir(void) {
    const char *d = getenv("DS_TEST_DATA");
    return d && *d ? d : "tests/data";
}

const char *test_bin(void) {
    const char *b = getenv("DS_BIN");
    return b && *b ? b : "build/deltaserve";
}

const char *test_data_path(const char *rel) {
    static char buf[4096];
    snprintf(buf, sizeof buf, "%s/%s", test_data_dir(), rel);
    return buf;
}

char *test_read_file(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = malloc((size_t)n + 1);
    if (buf && fread(buf, 1, (size_t)n, f) != (size_t)n) {
        free(buf);
        buf = NULL;
    }
    fclose(f);
    if (buf) {
        buf[n] = 0;
        if (len) *len = (size_t)n;
    }
    return buf;
}

float test_rng_uniform(test_rng *r) {
    r->s ^= r->s << 13;
    r->s ^= r->s >> 7;
    r->s ^= r->s << 17;
    return (float)((r->s >> 40) * (1.0 / 16777216.0)) * 2.0f - 1.0f;
}

double test_rel_l2(const float *a, const float *ref, size_t n) {
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        double d = (double)a[i] - (double)ref[i];
        num += d * d;
        den += (double)ref[i] * (double)ref[i];
    }
    return den > 0 ? sqrt(num / den) : sqrt(num);
}
