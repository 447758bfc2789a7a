#include "testlib.h"

#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/cpu_backend.h"
#include "model/loader.h"

const char *test_data_dir(void) {
    const char *d = getenv("DS_TEST_DATA");
    return d && *d ? d : "tests/data";
}

const char *test_bin(void) {
    const char *b = getenv("DS_BIN");
    return b && *b ? b : "build/deltaserve";
}

int test_cuda_unavailable(const char *test, const char *why) {
    const char *req = getenv("DS_CUDA_REQUIRED");
    const int required = req && atoi(req) != 0;
    printf("%s: skipped (%s)%s\n", test, why, required ? ": a failure, DS_CUDA_REQUIRED is set" : "");
    return required ? 1 : 0;
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

cJSON *test_load_json(const char *path) {
    char *text = test_read_file(path, NULL);
    if (!text) fail_msg("missing %s", path);
    cJSON *j = cJSON_Parse(text);
    free(text);
    if (!j) fail_msg("%s: not JSON", path);
    return j;
}

float *test_load_f32(const char *path, size_t n) {
    size_t len = 0;
    char *buf = test_read_file(path, &len);
    if (!buf) fail_msg("missing %s", path);
    if (len != n * sizeof(float))
        fail_msg("%s: %zu bytes, want %zu floats", path, len, n);
    return (float *)buf;
}

int32_t *test_json_ids(const cJSON *arr, int *n) {
    *n = cJSON_GetArraySize(arr);
    int32_t *ids = malloc(sizeof(int32_t) * (size_t)(*n > 0 ? *n : 1));
    assert_non_null(ids);
    for (int i = 0; i < *n; i++) ids[i] = (int32_t)cJSON_GetArrayItem(arr, i)->valueint;
    return ids;
}

cJSON *test_load_ref(const char *name) {
    char rel[512];
    snprintf(rel, sizeof rel, "ref/%s.json", name);
    return test_load_json(test_data_path(rel));
}

float *test_load_ref_f32(const char *file, size_t n) {
    char rel[512];
    snprintf(rel, sizeof rel, "ref/%s", file);
    return test_load_f32(test_data_path(rel), n);
}

uint64_t test_rng_next(test_rng *r) {
    r->s ^= r->s << 13;
    r->s ^= r->s >> 7;
    r->s ^= r->s << 17;
    return r->s;
}

float test_rng_uniform(test_rng *r) {
    return (float)((test_rng_next(r) >> 40) * (1.0 / 16777216.0)) * 2.0f - 1.0f;
}

void test_fuzz_truncations(test_fuzz_fn one, const uint8_t *seed, size_t len) {
    for (size_t cut = 0; cut < len; cut += 1 + len / 64) {
        uint8_t *t = malloc(cut ? cut : 1);
        memcpy(t, seed, cut);
        one(t, cut);
        free(t);
    }
}

int test_for_each_file(const char *dir_path, test_file_fn fn, void *ctx) {
    DIR *d = opendir(dir_path);
    if (!d) fail_msg("missing directory %s", dir_path);
    struct dirent *de;
    int files = 0;
    while ((de = readdir(d))) {
        if (de->d_name[0] == '.') continue;
        char path[1024];
        snprintf(path, sizeof path, "%s/%s", dir_path, de->d_name);
        size_t len = 0;
        char *data = test_read_file(path, &len);
        if (!data) fail_msg("cannot read %s", path);
        uint8_t *exact = malloc(len ? len : 1); /* ASan sees any read past the end */
        memcpy(exact, data, len);
        free(data);
        fn(path, exact, len, files, ctx);
        free(exact);
        files++;
    }
    closedir(d);
    return files;
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

double test_chi2_z(const int *counts, const double *p, int n, int total, int *df_out) {
    double x2 = 0, pool_e = 0, pool_o = 0;
    int bins = 0;
    for (int i = 0; i < n; i++) {
        if (p[i] == 0.0 && counts[i] > 0) return 1e6; /* a draw the target never makes */
        const double e = p[i] * total;
        if (e < 5.0) {
            pool_e += e;
            pool_o += counts[i];
            continue;
        }
        x2 += (counts[i] - e) * (counts[i] - e) / e;
        bins++;
    }
    if (pool_e >= 1.0) {
        x2 += (pool_o - pool_e) * (pool_o - pool_e) / pool_e;
        bins++;
    } else if (pool_o > 5) {
        return 1e6; /* mass where the target has (almost) none */
    }
    const int df = bins - 1 > 0 ? bins - 1 : 1;
    if (df_out) *df_out = df;
    const double a = 2.0 / (9.0 * df);
    return (pow(x2 / df, 1.0 / 3.0) - (1.0 - a)) / sqrt(a);
}

void *test_backend_from_host(ds_backend *be, const float *vals, size_t n) {
    const ds_dtype dt = be->ops->act_dtype;
    void *d = be->ops->alloc(be, n * ds_dtype_size(dt) + 16);
    assert_non_null(d);
    if (dt == DS_DTYPE_F32) {
        be->ops->upload(be, d, vals, n * sizeof(float));
        return d;
    }
    assert_int_equal(dt, DS_DTYPE_BF16);
    uint16_t *h = malloc(n * sizeof(uint16_t));
    for (size_t i = 0; i < n; i++) h[i] = ds_f32_to_bf16(vals[i]);
    be->ops->upload(be, d, h, n * sizeof(uint16_t));
    ds_error err = {0}; /* the upload may read h until the device has it */
    if (be->ops->synchronize(be, &err) != DS_OK) fail_msg("%s: %s", be->ops->name, err.msg);
    free(h);
    return d;
}

void test_backend_to_host(ds_backend *be, const void *d, ds_dtype dt, size_t n, float *out) {
    ds_error err = {0};
    if (be->ops->synchronize(be, &err) != DS_OK) fail_msg("%s: %s", be->ops->name, err.msg);
    if (dt == DS_DTYPE_F32) {
        be->ops->download(be, out, d, n * sizeof(float));
        return;
    }
    assert_int_equal(dt, DS_DTYPE_BF16);
    uint16_t *h = malloc(n * sizeof(uint16_t));
    be->ops->download(be, h, d, n * sizeof(uint16_t));
    for (size_t i = 0; i < n; i++) out[i] = ds_bf16_to_f32(h[i]);
    free(h);
}

void test_model_load(test_model *f, const char *dir) {
    ds_error err = {0};
    if (ds_model_load(dir, &f->cfg, &f->host, &err) != DS_OK) fail_msg("load %s: %s", dir, err.msg);
    if (ds_backend_cpu_create(2, &f->be, &err) != DS_OK) fail_msg("cpu backend: %s", err.msg);
    ds_cpu_set_gdn_mode(f->be, DS_CPU_GDN_RECURRENT);
}

void test_model_init(test_model *f, int max_tokens, int max_out) {
    ds_error err = {0};
    if (ds_model_init(&f->model, f->be, &f->cfg, &f->host, max_tokens, max_out, &err) != DS_OK)
        fail_msg("model init: %s", err.msg);
}

void test_model_close(test_model *f) {
    ds_model_free(&f->model);
    f->be->ops->destroy(f->be);
    ds_model_weights_free(&f->host);
}
