/* safetensors.c — parsing (see safetensors.h for what is checked and why). */
#include "model/safetensors.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

struct ds_st_file {
    const uint8_t *base; /* whole image: [8-byte N][header][data] */
    size_t len;
    void *map; /* non-NULL when we own an mmap of the image */
    size_t map_len;
    char *origin;
    int n;
    ds_st_tensor *t; /* [n] sorted by name */
    char *strings;   /* names and dtype strings of all tensors */
};

/* Sizes in bits of the dtypes the format defines; 0 = unknown (byte count not checkable). */
static int st_dtype_bits(const char *s) {
    static const struct {
        const char *name;
        int bits;
    } table[] = {
        {"F64", 64}, {"F32", 32},    {"F16", 16},    {"BF16", 16},   {"I64", 64}, {"I32", 32},
        {"I16", 16}, {"I8", 8},      {"U64", 64},    {"U32", 32},    {"U16", 16}, {"U8", 8},
        {"BOOL", 8}, {"F8_E4M3", 8}, {"F8_E5M2", 8}, {"F8_E8M0", 8}, {"C64", 64},
    };
    for (size_t i = 0; i < sizeof table / sizeof table[0]; i++)
        if (!strcmp(s, table[i].name)) return table[i].bits;
    return 0;
}

static bool st_float_dtype(const char *s, ds_dtype *out) {
    if (!strcmp(s, "F32"))
        *out = DS_DTYPE_F32;
    else if (!strcmp(s, "BF16"))
        *out = DS_DTYPE_BF16;
    else if (!strcmp(s, "F16"))
        *out = DS_DTYPE_F16;
    else
        return false;
    return true;
}

/* JSON numbers are doubles: accept only exact non-negative integers ≤ 2^53. */
static bool st_json_u64(const cJSON *j, uint64_t *out) {
    if (!cJSON_IsNumber(j)) return false;
    double d = j->valuedouble;
    if (!(d >= 0.0 && d <= 9007199254740992.0)) return false; /* also rejects NaN */
    uint64_t u = (uint64_t)d;
    if ((double)u != d) return false;
    *out = u;
    return true;
}

char *ds_st_shape_str(const int64_t *shape, int ndim, char *buf, size_t size) {
    size_t off = 0;
    int n = snprintf(buf, size, "[");
    off = n > 0 ? (size_t)n : 0;
    for (int i = 0; i < ndim && off < size; i++) {
        n = snprintf(buf + off, size - off, "%s%lld", i ? ", " : "", (long long)shape[i]);
        if (n < 0) break;
        off += (size_t)n;
    }
    if (off < size) snprintf(buf + off, size - off, "]");
    return buf;
}

typedef struct st_range {
    uint64_t begin, end;
    int idx;
} st_range;

static int st_cmp_range(const void *a, const void *b) {
    const st_range *x = a, *y = b;
    if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
    if (x->end != y->end) return x->end < y->end ? -1 : 1;
    return 0;
}

static int st_cmp_tensor_name(const void *a, const void *b) {
    return strcmp(((const ds_st_tensor *)a)->name, ((const ds_st_tensor *)b)->name);
}

/* Fills t from one header entry. `data`/`data_len` describe the data section. */
static ds_status st_parse_entry(const cJSON *e, const char *origin, const uint8_t *data,
                                uint64_t data_len, ds_st_tensor *t, uint64_t *begin_out,
                                ds_error *err) {
    const char *name = t->name;
    if (!cJSON_IsObject(e))
        return ds_error_set(err, DS_ERR_FORMAT, "%s: header entry '%s' is not an object", origin,
                            name);
    const cJSON *dt = cJSON_GetObjectItemCaseSensitive(e, "dtype");
    const cJSON *sh = cJSON_GetObjectItemCaseSensitive(e, "shape");
    const cJSON *off = cJSON_GetObjectItemCaseSensitive(e, "data_offsets");
    if (!cJSON_IsString(dt) || !dt->valuestring)
        return ds_error_set(err, DS_ERR_FORMAT, "%s: tensor '%s': 'dtype' missing or not a string",
                            origin, name);
    if (!cJSON_IsArray(sh))
        return ds_error_set(err, DS_ERR_FORMAT, "%s: tensor '%s': 'shape' missing or not an array",
                            origin, name);
    if (!cJSON_IsArray(off) || cJSON_GetArraySize(off) != 2)
        return ds_error_set(err, DS_ERR_FORMAT,
                            "%s: tensor '%s': 'data_offsets' missing or not an array of 2", origin,
                            name);
    int rank = cJSON_GetArraySize(sh);
    if (rank > DS_ST_MAX_RANK)
        return ds_error_set(err, DS_ERR_FORMAT, "%s: tensor '%s': rank %d exceeds %d", origin, name,
                            rank, DS_ST_MAX_RANK);
    t->ndim = rank;
    uint64_t numel = 1;
    int i = 0;
    const cJSON *d;
    cJSON_ArrayForEach(d, sh) {
        uint64_t v;
        if (!st_json_u64(d, &v) || v > (uint64_t)INT64_MAX)
            return ds_error_set(err, DS_ERR_FORMAT,
                                "%s: tensor '%s': shape[%d] is not a non-negative integer", origin,
                                name, i);
        t->shape[i++] = (int64_t)v;
        if (__builtin_mul_overflow(numel, v, &numel))
            return ds_error_set(err, DS_ERR_FORMAT, "%s: tensor '%s': element count overflows",
                                origin, name);
    }
    uint64_t begin, end;
    if (!st_json_u64(cJSON_GetArrayItem(off, 0), &begin) ||
        !st_json_u64(cJSON_GetArrayItem(off, 1), &end))
        return ds_error_set(err, DS_ERR_FORMAT,
                            "%s: tensor '%s': data_offsets are not non-negative integers", origin,
                            name);
    if (begin > end || end > data_len)
        return ds_error_set(err, DS_ERR_FORMAT,
                            "%s: tensor '%s': data_offsets [%llu, %llu] outside the data section "
                            "of %llu bytes (truncated file?)",
                            origin, name, (unsigned long long)begin, (unsigned long long)end,
                            (unsigned long long)data_len);
    int bits = st_dtype_bits(dt->valuestring);
    if (bits) {
        uint64_t want;
        if (__builtin_mul_overflow(numel, (uint64_t)(bits / 8), &want))
            return ds_error_set(err, DS_ERR_FORMAT, "%s: tensor '%s': byte size overflows", origin,
                                name);
        if (end - begin != want) {
            char sbuf[160];
            return ds_error_set(err, DS_ERR_FORMAT,
                                "%s: tensor '%s': %s %s needs %llu bytes but data_offsets span "
                                "%llu",
                                origin, name, dt->valuestring,
                                ds_st_shape_str(t->shape, t->ndim, sbuf, sizeof sbuf),
                                (unsigned long long)want, (unsigned long long)(end - begin));
        }
    }
    t->dtype_ok = st_float_dtype(dt->valuestring, &t->dtype);
    t->data = data + begin;
    t->nbytes = (size_t)(end - begin);
    *begin_out = begin;
    return DS_OK;
}

static void st_free(ds_st_file *f) {
    if (!f) return;
    free(f->t);
    free(f->strings);
    free(f->origin);
    if (f->map) munmap(f->map, f->map_len);
    free(f);
}

ds_status ds_st_parse(const uint8_t *buf, size_t len, const char *origin, ds_st_file **out,
                      ds_error *err) {
    *out = NULL;
    if (!origin) origin = "<memory>";
    if (!buf || len < 8)
        return ds_error_set(err, DS_ERR_FORMAT,
                            "%s: %zu bytes is too short for a safetensors file (needs the 8-byte "
                            "header length)",
                            origin, len);
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--) hlen = (hlen << 8) | buf[i];
    if (hlen > (uint64_t)(len - 8))
        return ds_error_set(err, DS_ERR_FORMAT,
                            "%s: header length %llu exceeds the %zu bytes that follow it "
                            "(truncated file?)",
                            origin, (unsigned long long)hlen, len - 8);
    if (hlen > DS_ST_MAX_HEADER)
        return ds_error_set(err, DS_ERR_FORMAT, "%s: header length %llu exceeds the %u-byte limit",
                            origin, (unsigned long long)hlen, DS_ST_MAX_HEADER);
    const char *hdr = (const char *)buf + 8;
    if (hlen < 2 || hdr[0] != '{')
        return ds_error_set(err, DS_ERR_FORMAT, "%s: header does not start with a JSON object",
                            origin);
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(hdr, (size_t)hlen, &end, 0);
    if (!root) {
        size_t at = end && end >= hdr && end <= hdr + hlen ? (size_t)(end - hdr) : 0;
        return ds_error_set(err, DS_ERR_FORMAT, "%s: header is not valid JSON (near byte %zu)",
                            origin, at);
    }
    ds_status st = DS_OK;
    ds_st_file *f = NULL;
    st_range *ranges = NULL;
    /* Writers pad the header with spaces to align the data section; anything else is junk. */
    for (const char *p = end; p < hdr + hlen; p++) {
        if (*p != ' ' && *p != '\t' && *p != '\n' && *p != '\r') {
            st = ds_error_set(err, DS_ERR_FORMAT,
                              "%s: unexpected bytes after the JSON header (at byte %zu)", origin,
                              (size_t)(p - hdr));
            goto done;
        }
    }
    if (!cJSON_IsObject(root)) {
        st = ds_error_set(err, DS_ERR_FORMAT, "%s: header is not a JSON object", origin);
        goto done;
    }

    int n = 0;
    size_t str_bytes = 0;
    const cJSON *e;
    cJSON_ArrayForEach(e, root) {
        if (!e->string) continue;
        if (!strcmp(e->string, "__metadata__")) continue;
        const cJSON *dt = cJSON_IsObject(e) ? cJSON_GetObjectItemCaseSensitive(e, "dtype") : NULL;
        str_bytes += strlen(e->string) + 1;
        str_bytes += (cJSON_IsString(dt) && dt->valuestring ? strlen(dt->valuestring) : 0) + 1;
        n++;
    }
    f = calloc(1, sizeof *f);
    if (!f) {
        st = ds_error_set(err, DS_ERR_NOMEM, "%s: out of memory", origin);
        goto done;
    }
    f->base = buf;
    f->len = len;
    f->origin = strdup(origin);
    f->t = calloc((size_t)(n ? n : 1), sizeof *f->t);
    f->strings = malloc(str_bytes ? str_bytes : 1);
    ranges = malloc((size_t)(n ? n : 1) * sizeof *ranges);
    if (!f->origin || !f->t || !f->strings || !ranges) {
        st = ds_error_set(err, DS_ERR_NOMEM, "%s: out of memory for %d tensor entries", origin, n);
        goto done;
    }

    const uint8_t *data = buf + 8 + hlen;
    uint64_t data_len = (uint64_t)(len - 8) - hlen;
    char *sp = f->strings;
    int k = 0;
    cJSON_ArrayForEach(e, root) {
        if (!e->string || !strcmp(e->string, "__metadata__")) continue;
        ds_st_tensor *t = &f->t[k];
        size_t nl = strlen(e->string) + 1;
        memcpy(sp, e->string, nl);
        t->name = sp;
        sp += nl;
        const cJSON *dt = cJSON_IsObject(e) ? cJSON_GetObjectItemCaseSensitive(e, "dtype") : NULL;
        const char *ds = cJSON_IsString(dt) && dt->valuestring ? dt->valuestring : "";
        size_t dl = strlen(ds) + 1;
        memcpy(sp, ds, dl);
        t->dtype_name = sp;
        sp += dl;
        t->origin = f->origin;
        uint64_t begin = 0;
        st = st_parse_entry(e, origin, data, data_len, t, &begin, err);
        if (st != DS_OK) goto done;
        ranges[k] = (st_range){begin, begin + t->nbytes, k};
        k++;
    }
    f->n = n;

    /* Overlap check on byte ranges (empty tensors occupy nothing and may sit anywhere). */
    qsort(ranges, (size_t)n, sizeof *ranges, st_cmp_range);
    uint64_t prev_end = 0;
    int prev = -1;
    for (int i = 0; i < n; i++) {
        if (ranges[i].begin == ranges[i].end) continue;
        if (prev >= 0 && ranges[i].begin < prev_end) {
            st = ds_error_set(err, DS_ERR_FORMAT,
                              "%s: tensors '%s' and '%s' overlap in the data "
                              "section",
                              origin, f->t[prev].name, f->t[ranges[i].idx].name);
            goto done;
        }
        prev = ranges[i].idx;
        prev_end = ranges[i].end;
    }

    qsort(f->t, (size_t)n, sizeof *f->t, st_cmp_tensor_name);
    for (int i = 1; i < n; i++) {
        if (!strcmp(f->t[i - 1].name, f->t[i].name)) {
            st = ds_error_set(err, DS_ERR_FORMAT, "%s: tensor '%s' appears twice in the header",
                              origin, f->t[i].name);
            goto done;
        }
    }

done:
    cJSON_Delete(root);
    free(ranges);
    if (st != DS_OK) {
        st_free(f);
        return st;
    }
    *out = f;
    return DS_OK;
}

ds_status ds_st_open(const char *path, ds_st_file **out, ds_error *err) {
    *out = NULL;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return ds_error_set(err, DS_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    struct stat sb;
    if (fstat(fd, &sb) != 0) {
        int e = errno;
        close(fd);
        return ds_error_set(err, DS_ERR_IO, "%s: cannot stat: %s", path, strerror(e));
    }
    if (!S_ISREG(sb.st_mode)) {
        close(fd);
        return ds_error_set(err, DS_ERR_IO, "%s: not a regular file", path);
    }
    size_t len = (size_t)sb.st_size;
    if (len < 8) {
        close(fd);
        return ds_error_set(err, DS_ERR_FORMAT,
                            "%s: %zu bytes is too short for a safetensors file (truncated?)", path,
                            len);
    }
    void *map = mmap(NULL, len, PROT_READ, MAP_PRIVATE, fd, 0);
    int e = errno;
    close(fd); /* the mapping keeps the file alive */
    if (map == MAP_FAILED)
        return ds_error_set(err, DS_ERR_IO, "%s: cannot mmap %zu bytes: %s", path, len,
                            strerror(e));
    ds_st_file *f = NULL;
    ds_status st = ds_st_parse(map, len, path, &f, err);
    if (st != DS_OK) {
        munmap(map, len);
        return st;
    }
    f->map = map;
    f->map_len = len;
    *out = f;
    return DS_OK;
}

void ds_st_close(ds_st_file *f) { st_free(f); }

const char *ds_st_origin(const ds_st_file *f) { return f->origin; }
int ds_st_count(const ds_st_file *f) { return f->n; }

const ds_st_tensor *ds_st_at(const ds_st_file *f, int i) {
    DS_ASSERT(i >= 0 && i < f->n);
    return &f->t[i];
}

const ds_st_tensor *ds_st_find(const ds_st_file *f, const char *name) {
    int lo = 0, hi = f->n - 1;
    while (lo <= hi) {
        int mid = lo + (hi - lo) / 2;
        int c = strcmp(f->t[mid].name, name);
        if (c == 0) return &f->t[mid];
        if (c < 0)
            lo = mid + 1;
        else
            hi = mid - 1;
    }
    return NULL;
}

ds_status ds_st_tensor_view(const ds_st_tensor *t, ds_tensor *out, ds_error *err) {
    if (!t->dtype_ok)
        return ds_error_set(err, DS_ERR_UNSUPPORTED,
                            "%s: tensor '%s' has dtype %s; only F32, BF16 and F16 are supported",
                            t->origin, t->name, t->dtype_name);
    if (t->ndim > DS_MAX_DIMS)
        return ds_error_set(err, DS_ERR_UNSUPPORTED,
                            "%s: tensor '%s' has rank %d; at most %d is supported", t->origin,
                            t->name, t->ndim, DS_MAX_DIMS);
    ds_tensor v = {0};
    v.data = (void *)t->data; /* read-only mapping: views must never be written through */
    v.dtype = t->dtype;
    v.ndim = t->ndim;
    for (int i = 0; i < DS_MAX_DIMS; i++) v.ne[i] = i < t->ndim ? t->shape[i] : 1;
    *out = v;
    return DS_OK;
}

float ds_st_tensor_get_f32(const ds_st_tensor *t, int64_t i) {
    DS_ASSERT(t->dtype_ok && i >= 0);
    if (t->dtype == DS_DTYPE_F32) {
        float f;
        DS_ASSERT((size_t)(i + 1) * 4 <= t->nbytes);
        memcpy(&f, t->data + (size_t)i * 4, 4);
        return f;
    }
    uint16_t h;
    DS_ASSERT((size_t)(i + 1) * 2 <= t->nbytes);
    memcpy(&h, t->data + (size_t)i * 2, 2);
    return t->dtype == DS_DTYPE_BF16 ? ds_bf16_to_f32(h) : ds_f16_to_f32(h);
}
