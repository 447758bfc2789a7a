/* testlib.h — shared helpers for the cmocka tests. */
#ifndef DS_TESTLIB_H
#define DS_TESTLIB_H

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
/* cmocka.h needs the headers above first. */
#include <cmocka.h>

/* Directory of committed test data (env DS_TEST_DATA, else tests/data). */
const char *test_data_dir(void);
/* Path of the deltaserve binary (env DS_BIN, else build/deltaserve). */
const char *test_bin(void);
/* Joins test_data_dir() and rel into a static buffer (valid until the next call). */
const char *test_data_path(const char *rel);
/* Reads a whole file; returns NULL if missing. Caller frees. */
char *test_read_file(const char *path, size_t *len);

/* Deterministic xorshift RNG for random test inputs. */
typedef struct test_rng { uint64_t s; } test_rng;
float test_rng_uniform(test_rng *r); /* [-1, 1) */
double test_rel_l2(const float *a, const float *ref, size_t n);

#endif
