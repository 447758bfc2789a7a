#include "cli/args.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

bool ds_arg_int(const char *cmd, const char *opt, const char *val, long lo, long hi, long *out) {
    char *end = NULL;
    errno = 0;
    long v = strtol(val, &end, 10);
    if (!*val || *end || errno) {
        fprintf(stderr, "deltaserve %s: %s: '%s' is not an integer\n", cmd, opt, val);
        return false;
    }
    if (v < lo || v > hi) {
        fprintf(stderr, "deltaserve %s: %s: %ld is outside [%ld, %ld]\n", cmd, opt, v, lo, hi);
        return false;
    }
    *out = v;
    return true;
}

bool ds_arg_u64(const char *cmd, const char *opt, const char *val, uint64_t *out) {
    char *end = NULL;
    errno = 0;
    if (*val == '-') {
        fprintf(stderr, "deltaserve %s: %s: '%s' must be a non-negative integer\n", cmd, opt, val);
        return false;
    }
    unsigned long long v = strtoull(val, &end, 10);
    if (!*val || *end || errno) {
        fprintf(stderr, "deltaserve %s: %s: '%s' is not a non-negative integer\n", cmd, opt, val);
        return false;
    }
    *out = (uint64_t)v;
    return true;
}

bool ds_arg_float(const char *cmd, const char *opt, const char *val, double lo, double hi,
                  double *out) {
    char *end = NULL;
    errno = 0;
    double v = strtod(val, &end);
    if (!*val || *end || errno || !isfinite(v)) {
        fprintf(stderr, "deltaserve %s: %s: '%s' is not a finite number\n", cmd, opt, val);
        return false;
    }
    if (v < lo || v > hi) {
        fprintf(stderr, "deltaserve %s: %s: %g is outside [%g, %g]\n", cmd, opt, v, lo, hi);
        return false;
    }
    *out = v;
    return true;
}

bool ds_arg_ids(const char *cmd, const char *opt, const char *val, long max_id, int32_t **ids,
                size_t *n) {
    size_t cap = 16, cnt = 0;
    int32_t *out = malloc(cap * sizeof *out);
    if (!out) return false;
    const char *p = val;
    while (*p) {
        char *end = NULL;
        errno = 0;
        long v = strtol(p, &end, 10);
        if (end == p || errno || (*end && *end != ',')) {
            fprintf(stderr, "deltaserve %s: %s: bad token id list at '%.20s'\n", cmd, opt, p);
            free(out);
            return false;
        }
        if (v < 0 || v > INT32_MAX || (max_id > 0 && v >= max_id)) {
            fprintf(stderr, "deltaserve %s: %s: token id %ld is outside [0, %ld)\n", cmd, opt, v,
                    max_id > 0 ? max_id : (long)INT32_MAX);
            free(out);
            return false;
        }
        if (cnt == cap) {
            cap *= 2;
            int32_t *grown = realloc(out, cap * sizeof *out);
            if (!grown) {
                free(out);
                return false;
            }
            out = grown;
        }
        out[cnt++] = (int32_t)v;
        p = *end ? end + 1 : end;
        if (*end == ',' && !*p) {
            fprintf(stderr, "deltaserve %s: %s: trailing comma\n", cmd, opt);
            free(out);
            return false;
        }
    }
    if (cnt == 0) {
        fprintf(stderr, "deltaserve %s: %s: empty token id list\n", cmd, opt);
        free(out);
        return false;
    }
    *ids = out;
    *n = cnt;
    return true;
}

const char *ds_arg_value(int argc, char **argv, int *i, const char *name, const char *cmd,
                         bool *bad) {
    const char *a = argv[*i];
    size_t len = strlen(name);
    if (strncmp(a, name, len) != 0) return NULL;
    if (a[len] == '=') return a + len + 1; /* --opt=value */
    if (a[len] != 0) return NULL;
    if (*i + 1 >= argc) {
        fprintf(stderr, "deltaserve %s: %s needs a value\n", cmd, name);
        *bad = true;
        return NULL;
    }
    *i += 1;
    return argv[*i];
}
