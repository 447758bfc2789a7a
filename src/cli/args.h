/* args.h — strict parsing of command-line values (untrusted input: every bad value is an
 * error message naming the option, never a crash or a silent default). */
#ifndef DS_CLI_ARGS_H
#define DS_CLI_ARGS_H

#include <stdbool.h>
#include <stdint.h>
#include <stddef.h>

/* Each returns false after printing "deltaserve <cmd>: <opt>: <why>" to stderr. */
bool ds_arg_int(const char *cmd, const char *opt, const char *val, long lo, long hi, long *out);
bool ds_arg_u64(const char *cmd, const char *opt, const char *val, uint64_t *out);
bool ds_arg_float(const char *cmd, const char *opt, const char *val, double lo, double hi,
                  double *out);
/* "1,2,3" → ids (each in [0, max_id)); caller frees *ids. max_id ≤ 0 means no upper bound. */
bool ds_arg_ids(const char *cmd, const char *opt, const char *val, long max_id, int32_t **ids,
                size_t *n);

/* Option iteration: `i` indexes argv; returns the value of option `name` at argv[*i] (advancing
 * *i past it) or NULL. Prints an error and sets *bad when the value is missing. */
const char *ds_arg_value(int argc, char **argv, int *i, const char *name, const char *cmd,
                         bool *bad);

#endif
