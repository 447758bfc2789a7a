/* checkpoint.c — model.safetensors or an index.json + shards, behind one name lookup. */
#include "model/checkpoint.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define CK_SINGLE "model.safetensors"
#define CK_INDEX "model.safetensors.index.json"
#define CK_MAX_INDEX_BYTES (256u << 20) /* an index of a 1000-shard model is a few MB */

struct ds_checkpoint {
    char *dir;
    int n_files;
    ds_st_file **files; /* [n_files] */
    int n;
    const ds_st_tensor **by_name; /* [n] sorted by name */
};

static char *ck_join(const char *dir, const char *name) {
    size_t a = strlen(dir), b = strlen(name);
    char *p = malloc(a + b + 2);
    if (!p) return NULL;
    memcpy(p, dir, a);
    p[a] = '/';
    memcpy(p + a + 1, name, b + 1);
    return p;
}

static bool ck_exists(const char *path) {
    struct stat sb;
    return stat(path, &sb) == 0;
}

static int ck_cmp_tensor_ptr(const void *a, const void *b) {
    const ds_st_tensor *x = *(const ds_st_tensor *const *)a, *y = *(const ds_st_tensor *const *)b;
    return strcmp(x->name, y->name);
}

static int ck_cmp_str_ptr(const void *a, const void *b) {
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

void ds_checkpoint_close(ds_checkpoint *ck) {
    if (!ck) return;
    for (int i = 0; i < ck->n_files; i++) ds_st_close(ck->files[i]);
    free(ck->files);
    free(ck->by_name);
    free(ck->dir);
    free(ck);
}

/* Reads a whole small text file (NUL-terminated). */
static ds_status ck_read_text(const char *path, size_t max, char **out, ds_error *err) {
    *out = NULL;
    FILE *f = fopen(path, "rb");
    if (!f) return ds_error_set(err, DS_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    ds_status st = DS_OK;
    char *buf = NULL;
    long n = -1;
    if (fseek(f, 0, SEEK_END) == 0) n = ftell(f);
    if (n < 0 || fseek(f, 0, SEEK_SET) != 0) {
        st = ds_error_set(err, DS_ERR_IO, "%s: cannot determine the file size", path);
    } else if ((unsigned long)n > max) {
        st = ds_error_set(err, DS_ERR_FORMAT, "%s: %ld bytes is larger than the %zu-byte limit",
                          path, n, max);
    } else if (!(buf = malloc((size_t)n + 1))) {
        st = ds_error_set(err, DS_ERR_NOMEM, "%s: out of memory", path);
    } else if (fread(buf, 1, (size_t)n, f) != (size_t)n) {
        st = ds_error_set(err, DS_ERR_IO, "%s: read error", path);
    }
    fclose(f);
    if (st != DS_OK) {
        free(buf);
        return st;
    }
    buf[n] = 0;
    *out = buf;
    return DS_OK;
}

/* A shard name must stay inside the model directory. */
static bool ck_safe_relpath(const char *s) {
    if (!*s || s[0] == '/') return false;
    for (const char *p = s; *p;) {
        const char *q = strchr(p, '/');
        size_t seg = q ? (size_t)(q - p) : strlen(p);
        if (seg == 2 && p[0] == '.' && p[1] == '.') return false;
        if (!q) break;
        p = q + 1;
    }
    return true;
}

static ds_status ck_open_single(ds_checkpoint *ck, const char *path, ds_error *err) {
    ck->files = calloc(1, sizeof *ck->files);
    if (!ck->files) return ds_error_set(err, DS_ERR_NOMEM, "%s: out of memory", path);
    ds_status st = ds_st_open(path, &ck->files[0], err);
    if (st != DS_OK) return st;
    ck->n_files = 1;
    ck->n = ds_st_count(ck->files[0]);
    ck->by_name = malloc((size_t)(ck->n ? ck->n : 1) * sizeof *ck->by_name);
    if (!ck->by_name) return ds_error_set(err, DS_ERR_NOMEM, "%s: out of memory", path);
    for (int i = 0; i < ck->n; i++) ck->by_name[i] = ds_st_at(ck->files[0], i);
    return DS_OK; /* the file's own table is already sorted by name */
}

static ds_status ck_open_index(ds_checkpoint *ck, const char *path, ds_error *err) {
    ds_status st = DS_OK;
    const char **shards = NULL;
    char *text = NULL;
    st = ck_read_text(path, CK_MAX_INDEX_BYTES, &text, err);
    if (st != DS_OK) return st;
    cJSON *root = cJSON_Parse(text);
    free(text);
    if (!root) return ds_error_set(err, DS_ERR_FORMAT, "%s: not valid JSON", path);
    const cJSON *wm = cJSON_GetObjectItemCaseSensitive(root, "weight_map");
    if (!cJSON_IsObject(wm)) {
        st = ds_error_set(err, DS_ERR_FORMAT, "%s: 'weight_map' missing or not an object", path);
        goto done;
    }
    int n = cJSON_GetArraySize(wm);
    shards = malloc((size_t)(n ? n : 1) * sizeof *shards);
    ck->by_name = malloc((size_t)(n ? n : 1) * sizeof *ck->by_name);
    if (!shards || !ck->by_name) {
        st = ds_error_set(err, DS_ERR_NOMEM, "%s: out of memory", path);
        goto done;
    }
    const cJSON *e;
    int k = 0;
    cJSON_ArrayForEach(e, wm) {
        if (!cJSON_IsString(e) || !e->valuestring || !ck_safe_relpath(e->valuestring)) {
            st = ds_error_set(err, DS_ERR_FORMAT,
                              "%s: weight_map['%s'] is not a file name inside the model directory",
                              path, e->string ? e->string : "");
            goto done;
        }
        shards[k++] = e->valuestring;
    }
    /* Unique shard names, each mapped once. */
    const char **uniq = malloc((size_t)(n ? n : 1) * sizeof *uniq);
    if (!uniq) {
        st = ds_error_set(err, DS_ERR_NOMEM, "%s: out of memory", path);
        goto done;
    }
    memcpy(uniq, shards, (size_t)n * sizeof *uniq);
    qsort(uniq, (size_t)n, sizeof *uniq, ck_cmp_str_ptr);
    int nu = 0;
    for (int i = 0; i < n; i++)
        if (nu == 0 || strcmp(uniq[nu - 1], uniq[i])) uniq[nu++] = uniq[i];
    ck->files = calloc((size_t)(nu ? nu : 1), sizeof *ck->files);
    if (!ck->files) {
        free(uniq);
        st = ds_error_set(err, DS_ERR_NOMEM, "%s: out of memory", path);
        goto done;
    }
    for (int i = 0; i < nu; i++) {
        char *sp = ck_join(ck->dir, uniq[i]);
        if (!sp) {
            st = ds_error_set(err, DS_ERR_NOMEM, "%s: out of memory", path);
            break;
        }
        if (!ck_exists(sp)) {
            st = ds_error_set(err, DS_ERR_IO, "%s: missing shard file %s (named by weight_map)",
                              path, sp);
        } else {
            st = ds_st_open(sp, &ck->files[i], err);
        }
        free(sp);
        if (st != DS_OK) break;
        ck->n_files++;
    }
    if (st != DS_OK) {
        free(uniq);
        goto done;
    }
    /* Resolve every weight_map entry in its shard. */
    k = 0;
    cJSON_ArrayForEach(e, wm) {
        const char **hit = bsearch(&e->valuestring, uniq, (size_t)nu, sizeof *uniq, ck_cmp_str_ptr);
        DS_ASSERT(hit);
        const ds_st_file *f = ck->files[hit - uniq];
        const ds_st_tensor *t = ds_st_find(f, e->string ? e->string : "");
        if (!t) {
            st = ds_error_set(err, DS_ERR_FORMAT,
                              "%s: weight_map maps '%s' to %s, which has no such tensor", path,
                              e->string ? e->string : "", e->valuestring);
            break;
        }
        ck->by_name[k++] = t;
    }
    free(uniq);
    if (st != DS_OK) goto done;
    ck->n = k;
    qsort(ck->by_name, (size_t)k, sizeof *ck->by_name, ck_cmp_tensor_ptr);
    for (int i = 1; i < k; i++) {
        if (!strcmp(ck->by_name[i - 1]->name, ck->by_name[i]->name)) {
            st = ds_error_set(err, DS_ERR_FORMAT, "%s: tensor '%s' appears twice in weight_map",
                              path, ck->by_name[i]->name);
            goto done;
        }
    }
done:
    free(shards);
    cJSON_Delete(root);
    return st;
}

ds_status ds_checkpoint_open(const char *dir, ds_checkpoint **out, ds_error *err) {
    *out = NULL;
    ds_checkpoint *ck = calloc(1, sizeof *ck);
    if (!ck || !(ck->dir = strdup(dir))) {
        free(ck);
        return ds_error_set(err, DS_ERR_NOMEM, "%s: out of memory", dir);
    }
    char *single = ck_join(dir, CK_SINGLE);
    char *index = ck_join(dir, CK_INDEX);
    ds_status st;
    if (!single || !index)
        st = ds_error_set(err, DS_ERR_NOMEM, "%s: out of memory", dir);
    else if (ck_exists(single))
        st = ck_open_single(ck, single, err);
    else if (ck_exists(index))
        st = ck_open_index(ck, index, err);
    else
        st = ds_error_set(err, DS_ERR_IO, "%s: no %s or %s in the model directory", dir, CK_SINGLE,
                          CK_INDEX);
    free(single);
    free(index);
    if (st != DS_OK) {
        ds_checkpoint_close(ck);
        return st;
    }
    *out = ck;
    return DS_OK;
}

const ds_st_tensor *ds_checkpoint_find(const ds_checkpoint *ck, const char *name) {
    int lo = 0, hi = ck->n - 1;
    while (lo <= hi) {
        int mid = lo + (hi - lo) / 2;
        int c = strcmp(ck->by_name[mid]->name, name);
        if (c == 0) return ck->by_name[mid];
        if (c < 0)
            lo = mid + 1;
        else
            hi = mid - 1;
    }
    return NULL;
}

bool ds_checkpoint_has_prefix(const ds_checkpoint *ck, const char *prefix) {
    /* lower bound of prefix: the first name ≥ prefix starts with it iff any does */
    int lo = 0, hi = ck->n;
    while (lo < hi) {
        int mid = lo + (hi - lo) / 2;
        if (strcmp(ck->by_name[mid]->name, prefix) < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo < ck->n && !strncmp(ck->by_name[lo]->name, prefix, strlen(prefix));
}

int ds_checkpoint_count(const ds_checkpoint *ck) { return ck->n; }

const ds_st_tensor *ds_checkpoint_at(const ds_checkpoint *ck, int i) {
    DS_ASSERT(i >= 0 && i < ck->n);
    return ck->by_name[i];
}

int ds_checkpoint_n_files(const ds_checkpoint *ck) { return ck->n_files; }
const char *ds_checkpoint_dir(const ds_checkpoint *ck) { return ck->dir; }
