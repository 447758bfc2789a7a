/* testlib.h — shared helpers for the cmocka tests. */
#ifndef DS_TESTLIB_H
#define DS_TESTLIB_H

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
/* cmocka.h needs the headers above first. */
#include <cmocka.h>
#include <cjson/cJSON.h>

/* Directory of committed test data (env DS_TEST_DATA, else tests/data). */
const char *test_data_dir(void);
/* Path of the deltaserve binary (env DS_BIN, else build/deltaserve). */
const char *test_bin(void);
/* Joins test_data_dir() and rel into a static buffer (valid until the next call). */
const char *test_data_path(const char *rel);
/* A CUDA test whose backend did not start (why): prints "<test>: skipped (why)" and returns its
 * exit status — 0, so that CI machines without a GPU pass, unless DS_CUDA_REQUIRED is set to a
 * non-zero value (the GPU scripts under tools/gpu set it): then 1, a failure. */
int test_cuda_unavailable(const char *test, const char *why);
/* Reads a whole file; returns NULL if missing. Caller frees. */
char *test_read_file(const char *path, size_t *len);

/* Reference fixtures (the test fails with the path when a file is missing or malformed):
 * the parsed JSON file at path (cJSON_Delete it), n floats of a raw f32 file whose size must be
 * exactly n floats (free it), and a JSON array of integers as int32 [*n] (free it). */
cJSON *test_load_json(const char *path);
float *test_load_f32(const char *path, size_t n);
int32_t *test_json_ids(const cJSON *arr, int *n);
/* The transformers fixtures under tests/data/ref: ref/<name>.json, and n floats of ref/<file>. */
cJSON *test_load_ref(const char *name);
float *test_load_ref_f32(const char *file, size_t n);

/* A checkpoint on a 2-thread CPU backend with the token-by-token GDN (results then do not
 * depend on how an engine chunks prompts): test_model_load reads dir and creates the backend,
 * test_model_init binds the model (a test may replace the backend's ops in between). */
#include "model/model.h"
typedef struct test_model {
    ds_config cfg;
    ds_model_weights host;
    ds_backend *be;
    ds_model model;
} test_model;
void test_model_load(test_model *f, const char *dir);
void test_model_init(test_model *f, int max_tokens, int max_out);
void test_model_close(test_model *f);

/* Deterministic xorshift RNG for random test inputs. */
typedef struct test_rng { uint64_t s; } test_rng;
uint64_t test_rng_next(test_rng *r);
float test_rng_uniform(test_rng *r); /* [-1, 1) */

/* Calls fn for every file of dir_path (names starting with '.' skipped; the test fails when
 * the directory is missing), its bytes in an allocation of exactly their size; index counts
 * from 0. Returns the number of files. For seed corpora (fuzz/corpus_*). */
typedef void (*test_file_fn)(const char *path, const uint8_t *data, size_t len, int index, void *ctx);
int test_for_each_file(const char *dir_path, test_file_fn fn, void *ctx);
/* Runs a fuzz target's entry point on ~64 prefixes of seed [0, len) (lengths 0, 1 + len/64, …),
 * each in an allocation of exactly its size. */
typedef int (*test_fuzz_fn)(const uint8_t *data, size_t size);
void test_fuzz_truncations(test_fuzz_fn one, const uint8_t *seed, size_t len);
double test_rel_l2(const float *a, const float *ref, size_t n);
/* Pearson's X² of counts [n] (total draws) against probabilities p [n], as a Wilson–Hilferty z
 * (about N(0, 1) when the counts follow p): bins expected below 5 are pooled; any count where p
 * is exactly 0, or more than 5 draws pooled where less than 1 was expected, gives 1e6. df_out
 * (may be NULL) gets the degrees of freedom. */
double test_chi2_z(const int *counts, const double *p, int n, int total, int *df_out);

/* A new buffer of backend be in its activation dtype (F32 or BF16) holding vals [n]. */
void *test_backend_from_host(ds_backend *be, const float *vals, size_t n);
/* The n values of a buffer of be in dtype dt (F32 or BF16) as host floats, after a synchronize
 * (fails the test if the device reports an error). */
void test_backend_to_host(ds_backend *be, const void *d, ds_dtype dt, size_t n, float *out);

#endif
