/* st_writer.h — writes synthetic safetensors files for tests.
 *
 * Header-only with static inline functions because CMake links only tests/testlib.c into the test
 * executables. Follows the spec, not our parser: u64 LE header length, a JSON header (built with
 * cJSON) padded with spaces so the data section starts 8-byte aligned, then the data with tensors
 * ordered by element size (largest first) then name, as the Python writer does, so every tensor
 * is aligned to its element size. */
#ifndef DS_TEST_ST_WRITER_H
#define DS_TEST_ST_WRITER_H

#include <cjson/cJSON.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/tensor.h"

typedef struct stw_entry {
    char *name;
    char dtype[16];
    int ndim;
    int64_t shape[8];
    uint8_t *data;
    size_t nbytes;
    size_t esize; /* for ordering */
} stw_entry;

typedef struct stw {
    stw_entry *e;
    int n, cap;
    int keep_order; /* 1: write tensors in insertion order (to provoke misaligned offsets) */
} stw;

static inline void stw_init(stw *w) { memset(w, 0, sizeof *w); }

static inline void stw_free(stw *w) {
    for (int i = 0; i < w->n; i++) {
        free(w->e[i].name);
        free(w->e[i].data);
    }
    free(w->e);
    memset(w, 0, sizeof *w);
}

static inline size_t stw_dtype_size(const char *dtype) {
    if (!strcmp(dtype, "F64") || !strcmp(dtype, "I64")) return 8;
    if (!strcmp(dtype, "F32") || !strcmp(dtype, "I32")) return 4;
    if (!strcmp(dtype, "F16") || !strcmp(dtype, "BF16")) return 2;
    return 1;
}

/* Adds a tensor with raw little-endian bytes (copied). */
static inline void stw_add_raw(stw *w, const char *name, const char *dtype, int ndim,
                               const int64_t *shape, const void *data, size_t nbytes) {
    if (w->n == w->cap) {
        w->cap = w->cap ? 2 * w->cap : 16;
        w->e = realloc(w->e, (size_t)w->cap * sizeof *w->e);
    }
    stw_entry *e = &w->e[w->n++];
    memset(e, 0, sizeof *e);
    e->name = strdup(name);
    snprintf(e->dtype, sizeof e->dtype, "%s", dtype);
    e->ndim = ndim;
    for (int i = 0; i < ndim; i++) e->shape[i] = shape[i];
    e->data = malloc(nbytes ? nbytes : 1);
    if (nbytes) memcpy(e->data, data, nbytes);
    e->nbytes = nbytes;
    e->esize = stw_dtype_size(dtype);
}

/* Adds a float tensor stored as dt (F32, BF16 or F16) from f32 values (numel from shape). */
static inline void stw_add_f32(stw *w, const char *name, ds_dtype dt, int ndim,
                               const int64_t *shape, const float *vals) {
    int64_t n = 1;
    for (int i = 0; i < ndim; i++) n *= shape[i];
    size_t es = dt == DS_DTYPE_F32 ? 4 : 2;
    uint8_t *buf = malloc((size_t)n * es + 1);
    for (int64_t i = 0; i < n; i++) {
        if (dt == DS_DTYPE_F32) {
            memcpy(buf + i * 4, &vals[i], 4);
        } else {
            uint16_t h = dt == DS_DTYPE_BF16 ? ds_f32_to_bf16(vals[i]) : ds_f32_to_f16(vals[i]);
            memcpy(buf + i * 2, &h, 2);
        }
    }
    const char *name_dt = dt == DS_DTYPE_F32 ? "F32" : dt == DS_DTYPE_BF16 ? "BF16" : "F16";
    stw_add_raw(w, name, name_dt, ndim, shape, buf, (size_t)n * es);
    free(buf);
}

static inline int stw_cmp(const void *a, const void *b) {
    const stw_entry *x = *(const stw_entry *const *)a, *y = *(const stw_entry *const *)b;
    if (x->esize != y->esize) return x->esize > y->esize ? -1 : 1;
    return strcmp(x->name, y->name);
}

/* The whole file image (malloc'd; caller frees). */
static inline uint8_t *stw_build(const stw *w, size_t *len) {
    const stw_entry **order = malloc((size_t)(w->n ? w->n : 1) * sizeof *order);
    for (int i = 0; i < w->n; i++) order[i] = &w->e[i];
    if (!w->keep_order) qsort(order, (size_t)w->n, sizeof *order, stw_cmp);
    cJSON *root = cJSON_CreateObject();
    cJSON *meta = cJSON_AddObjectToObject(root, "__metadata__");
    cJSON_AddStringToObject(meta, "format", "pt");
    size_t off = 0;
    for (int i = 0; i < w->n; i++) {
        const stw_entry *e = order[i];
        cJSON *t = cJSON_AddObjectToObject(root, e->name);
        cJSON_AddStringToObject(t, "dtype", e->dtype);
        cJSON *sh = cJSON_AddArrayToObject(t, "shape");
        for (int d = 0; d < e->ndim; d++)
            cJSON_AddItemToArray(sh, cJSON_CreateNumber((double)e->shape[d]));
        cJSON *of = cJSON_AddArrayToObject(t, "data_offsets");
        cJSON_AddItemToArray(of, cJSON_CreateNumber((double)off));
        cJSON_AddItemToArray(of, cJSON_CreateNumber((double)(off + e->nbytes)));
        off += e->nbytes;
    }
    char *js = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    size_t hl = strlen(js);
    size_t pad = (8 - (8 + hl) % 8) % 8;
    size_t total = 8 + hl + pad + off;
    uint8_t *buf = malloc(total);
    uint64_t n = hl + pad;
    for (int i = 0; i < 8; i++) buf[i] = (uint8_t)(n >> (8 * i));
    memcpy(buf + 8, js, hl);
    memset(buf + 8 + hl, ' ', pad);
    uint8_t *p = buf + 8 + hl + pad;
    for (int i = 0; i < w->n; i++) {
        memcpy(p, order[i]->data, order[i]->nbytes);
        p += order[i]->nbytes;
    }
    free(js);
    free(order);
    *len = total;
    return buf;
}

static inline int stw_write_bytes(const char *path, const void *buf, size_t len) {
    FILE *f = fopen(path, "wb");
    if (!f) return -1;
    size_t n = fwrite(buf, 1, len, f);
    return fclose(f) == 0 && n == len ? 0 : -1;
}

/* Writes the file; 0 on success. */
static inline int stw_write(const stw *w, const char *path) {
    size_t len;
    uint8_t *buf = stw_build(w, &len);
    int rc = stw_write_bytes(path, buf, len);
    free(buf);
    return rc;
}

#endif
