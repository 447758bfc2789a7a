/* status.h — the two error tiers of deltaserve.
 *
 * Untrusted input (checkpoint files, tokenizer files, HTTP bodies, CLI args) is validated and
 * reported through ds_status + a ds_error message that names what was wrong. Internal
 * invariants use DS_ASSERT, which is always on and reports file:line. Library code never
 * calls exit(). */
#ifndef DS_STATUS_H
#define DS_STATUS_H

#include <stdarg.h>
#include <stddef.h>

typedef enum ds_status {
    DS_OK = 0,
    DS_ERR_IO,          /* file missing, unreadable, truncated */
    DS_ERR_FORMAT,      /* file present but its content is malformed or lies */
    DS_ERR_UNSUPPORTED, /* well-formed but not something we implement (dtype, model_type) */
    DS_ERR_INVALID_ARG, /* caller / user supplied a bad value */
    DS_ERR_NOMEM,       /* allocation failed (host or device) */
    DS_ERR_DEVICE,      /* accelerator runtime error */
    DS_ERR_INTERNAL,
    DS_ERR_BUSY,        /* a bounded queue is full: try again later */
} ds_status;

#define DS_ERROR_MSG_MAX 512

/* Carries a human-readable message alongside a status. Zero-initialise before use. */
typedef struct ds_error {
    ds_status status;
    char msg[DS_ERROR_MSG_MAX];
} ds_error;

/* Records the first error only (later calls do not overwrite the root cause); returns status
 * so it can be used as `return ds_error_set(err, DS_ERR_IO, "...", ...);`. err may be NULL. */
ds_status ds_error_set(ds_error *err, ds_status status, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

const char *ds_status_name(ds_status s);

/* Always-on invariant check. Aborts with file:line: invariants, never user input. */
#define DS_ASSERT(cond)                                                                      \
    do {                                                                                     \
        if (!(cond)) ds_assert_fail(#cond, __FILE__, __LINE__);                              \
    } while (0)

_Noreturn void ds_assert_fail(const char *expr, const char *file, int line);

/* Allocation helpers that assert on OOM for small internal bookkeeping; large or
 * input-sized allocations must use plain malloc and report DS_ERR_NOMEM instead. */
void *ds_xmalloc(size_t n);
void *ds_xcalloc(size_t count, size_t size);
char *ds_xstrdup(const char *s);

#endif
