#include "core/status.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

ds_status ds_error_set(ds_error *err, ds_status status, const char *fmt, ...) {
    if (err && err->status == DS_OK) {
        err->status = status;
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err->msg, sizeof err->msg, fmt, ap);
        va_end(ap);
    }
    return status;
}

const char *ds_status_name(ds_status s) {
    switch (s) {
    case DS_OK: return "ok";
    case DS_ERR_IO: return "io error";
    case DS_ERR_FORMAT: return "format error";
    case DS_ERR_UNSUPPORTED: return "unsupported";
    case DS_ERR_INVALID_ARG: return "invalid argument";
    case DS_ERR_NOMEM: return "out of memory";
    case DS_ERR_DEVICE: return "device error";
    case DS_ERR_INTERNAL: return "internal error";
    case DS_ERR_BUSY: return "busy";
    }
    return "unknown status";
}

void ds_assert_fail(const char *expr, const char *file, int line) {
    fprintf(stderr, "deltaserve: assertion failed: %s (%s:%d)\n", expr, file, line);
    abort();
}

void *ds_xmalloc(size_t n) {
    void *p = malloc(n ? n : 1);
    if (!p) ds_assert_fail("malloc", __FILE__, __LINE__);
    return p;
}

void *ds_xcalloc(size_t count, size_t size) {
    void *p = calloc(count ? count : 1, size ? size : 1);
    if (!p) ds_assert_fail("calloc", __FILE__, __LINE__);
    return p;
}

char *ds_xstrdup(const char *s) {
    size_t n = strlen(s) + 1;
    char *p = ds_xmalloc(n);
    memcpy(p, s, n);
    return p;
}
