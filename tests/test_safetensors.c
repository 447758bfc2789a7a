/* test_safetensors.c — the safetensors parser on good files, lying files and mutations.
 *
 * The fuzz target is compiled in (it is one function) so the seed corpus and thousands of
 * deterministic mutations run through exactly what libFuzzer would call; the sanitizer build
 * turns any out-of-bounds read into a failure. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "testlib.h"

#include "model/safetensors.h"
#include "st_writer.h"

#include "../fuzz/fuzz_safetensors.c"

/* ---- helpers ------------------------------------------------------------------------------ */

/* A raw image: 8-byte length of `json`, the json, then data_len bytes (value i & 0xff). */
static uint8_t *raw_image(const char *json, size_t data_len, size_t *len) {
    size_t hl = strlen(json);
    *len = 8 + hl + data_len;
    uint8_t *buf = malloc(*len);
    for (int i = 0; i < 8; i++) buf[i] = (uint8_t)((uint64_t)hl >> (8 * i));
    memcpy(buf + 8, json, hl);
    for (size_t i = 0; i < data_len; i++) buf[8 + hl + i] = (uint8_t)i;
    return buf;
}

/* Parses and expects status; returns the message (static copy) for substring checks. */
static const char *parse_expect(const uint8_t *buf, size_t len, ds_status want) {
    static char msg[DS_ERROR_MSG_MAX];
    ds_st_file *f = NULL;
    ds_error err = {0};
    ds_status st = ds_st_parse(buf, len, "test.safetensors", &f, &err);
    if (st != want)
        fprintf(stderr, "got %s (%s), wanted %s\n", ds_status_name(st), err.msg,
                ds_status_name(want));
    assert_int_equal(st, want);
    if (st == DS_OK) {
        assert_non_null(f);
        ds_st_close(f);
    } else {
        assert_null(f);
        assert_true(strstr(err.msg, "test.safetensors") != NULL); /* names the origin */
    }
    snprintf(msg, sizeof msg, "%s", err.msg);
    return msg;
}

static void expect_raw(const char *json, size_t data_len, ds_status want, const char *substr) {
    size_t len;
    uint8_t *buf = raw_image(json, data_len, &len);
    const char *msg = parse_expect(buf, len, want);
    if (substr && !strstr(msg, substr)) {
        fprintf(stderr, "message '%s' lacks '%s'\n", msg, substr);
        fail();
    }
    free(buf);
}

/* ---- good files ----------------------------------------------------------------------------- */

static void test_good_file(void **state) {
    (void)state;
    stw w;
    stw_init(&w);
    const float a[6] = {0.5f, -1.0f, 2.0f, 3.25f, -0.125f, 8.0f};
    const float b[4] = {1.0f, -2.0f, 0.375f, 100.0f}; /* exact in bf16 and f16 */
    const int64_t sa[2] = {2, 3}, sb[1] = {4}, sc[2] = {2, 2}, s5[5] = {1, 1, 1, 2, 1};
    const int64_t si[1] = {3};
    const int64_t iv[3] = {7, -1, 1LL << 40};
    stw_add_f32(&w, "a.weight", DS_DTYPE_F32, 2, sa, a);
    stw_add_f32(&w, "b.weight", DS_DTYPE_BF16, 1, sb, b);
    stw_add_f32(&w, "c.weight", DS_DTYPE_F16, 2, sc, b);
    stw_add_f32(&w, "five_d", DS_DTYPE_BF16, 5, s5, b);
    stw_add_raw(&w, "position_ids", "I64", 1, si, iv, sizeof iv);
    stw_add_f32(&w, "scalar", DS_DTYPE_F32, 0, NULL, a);
    size_t len;
    uint8_t *buf = stw_build(&w, &len);
    stw_free(&w);

    ds_st_file *f = NULL;
    ds_error err = {0};
    assert_int_equal(ds_st_parse(buf, len, "good", &f, &err), DS_OK);
    assert_int_equal(ds_st_count(f), 6);
    for (int i = 1; i < ds_st_count(f); i++)
        assert_true(strcmp(ds_st_at(f, i - 1)->name, ds_st_at(f, i)->name) < 0);

    const ds_st_tensor *t = ds_st_find(f, "a.weight");
    assert_non_null(t);
    ds_tensor v;
    assert_int_equal(ds_st_tensor_view(t, &v, &err), DS_OK);
    assert_int_equal(v.dtype, DS_DTYPE_F32);
    assert_int_equal(v.ndim, 2);
    assert_int_equal(v.ne[0], 2);
    assert_int_equal(v.ne[1], 3);
    assert_int_equal(v.ne[2], 1);
    for (int i = 0; i < 6; i++) assert_true(ds_st_tensor_get_f32(t, i) == a[i]);
    assert_int_equal(t->nbytes, 24);

    t = ds_st_find(f, "b.weight");
    assert_int_equal(ds_st_tensor_view(t, &v, &err), DS_OK);
    assert_int_equal(v.dtype, DS_DTYPE_BF16);
    for (int i = 0; i < 4; i++) assert_true(ds_st_tensor_get_f32(t, i) == b[i]);
    t = ds_st_find(f, "c.weight");
    assert_int_equal(ds_st_tensor_view(t, &v, &err), DS_OK);
    assert_int_equal(v.dtype, DS_DTYPE_F16);
    for (int i = 0; i < 4; i++) assert_true(ds_st_tensor_get_f32(t, i) == b[i]);

    t = ds_st_find(f, "scalar");
    assert_int_equal(ds_st_tensor_view(t, &v, &err), DS_OK);
    assert_int_equal(v.ndim, 0);
    assert_int_equal(ds_tensor_numel(&v), 1);
    assert_true(ds_st_tensor_get_f32(t, 0) == 0.5f);

    /* Unsupported dtype / rank: parsed fine, refused only when requested. */
    t = ds_st_find(f, "position_ids");
    assert_non_null(t);
    assert_false(t->dtype_ok);
    assert_string_equal(t->dtype_name, "I64");
    int64_t first;
    memcpy(&first, t->data, 8);
    assert_int_equal(first, 7);
    assert_int_equal(ds_st_tensor_view(t, &v, &err), DS_ERR_UNSUPPORTED);
    assert_non_null(strstr(err.msg, "position_ids"));
    assert_non_null(strstr(err.msg, "I64"));
    err = (ds_error){0};
    t = ds_st_find(f, "five_d");
    assert_int_equal(t->ndim, 5);
    assert_int_equal(ds_st_tensor_view(t, &v, &err), DS_ERR_UNSUPPORTED);
    assert_non_null(strstr(err.msg, "five_d"));

    assert_null(ds_st_find(f, "nope"));
    assert_null(ds_st_find(f, ""));
    assert_null(ds_st_find(f, "a.weigh"));
    ds_st_close(f);
    free(buf);
}

static void test_metadata_and_padding(void **state) {
    (void)state;
    /* __metadata__ of any shape is ignored; trailing spaces pad the header; gaps tolerated. */
    expect_raw("{\"__metadata__\":{\"format\":\"pt\",\"x\":[1,2]},"
               "\"t\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,16]}}    ",
               16, DS_OK, NULL);
    expect_raw("{}", 0, DS_OK, NULL);
    expect_raw("{\"e\":{\"dtype\":\"F32\",\"shape\":[0,5],\"data_offsets\":[0,0]},"
               "\"f\":{\"dtype\":\"BF16\",\"shape\":[1],\"data_offsets\":[0,2]}}",
               2, DS_OK, NULL);
    /* unknown dtype string: size not checkable, accepted until requested */
    expect_raw("{\"q\":{\"dtype\":\"F4\",\"shape\":[3],\"data_offsets\":[0,2]}}", 2, DS_OK, NULL);
}

/* ---- lies ----------------------------------------------------------------------------------- */

static void test_header_length_lies(void **state) {
    (void)state;
    size_t len;
    uint8_t *buf =
        raw_image("{\"t\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4, &len);
    parse_expect(buf, len, DS_OK);
    uint64_t lies[] = {len - 8 + 1, len, UINT64_MAX, 1ULL << 63, 0, 1};
    for (size_t i = 0; i < sizeof lies / sizeof lies[0]; i++) {
        uint8_t *copy = malloc(len);
        memcpy(copy, buf, len);
        for (int b = 0; b < 8; b++) copy[b] = (uint8_t)(lies[i] >> (8 * b));
        parse_expect(copy, len, DS_ERR_FORMAT);
        free(copy);
    }
    /* too short for the length itself */
    parse_expect(buf, 7, DS_ERR_FORMAT);
    parse_expect(buf, 0, DS_ERR_FORMAT);
    free(buf);
}

static void test_offsets(void **state) {
    (void)state;
    expect_raw("{\"t\":{\"dtype\":\"F32\",\"shape\":[25],\"data_offsets\":[0,100]}}", 24,
               DS_ERR_FORMAT, "'t'");
    expect_raw("{\"t\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[8,4]}}", 24,
               DS_ERR_FORMAT, "'t'");
    expect_raw("{\"t\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[-4,0]}}", 24,
               DS_ERR_FORMAT, "'t'");
    expect_raw("{\"t\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0.5,4.5]}}", 24,
               DS_ERR_FORMAT, "'t'");
    expect_raw("{\"t\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0]}}", 24, DS_ERR_FORMAT,
               "'t'");
    expect_raw("{\"t\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4,8]}}", 24,
               DS_ERR_FORMAT, "'t'");
    expect_raw("{\"t\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[1e300,1e300]}}", 24,
               DS_ERR_FORMAT, "'t'");
    /* overlapping ranges */
    expect_raw("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
               "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}",
               16, DS_ERR_FORMAT, "overlap");
    expect_raw("{\"a\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]},"
               "\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}",
               16, DS_ERR_FORMAT, "overlap");
    expect_raw("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
               "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}",
               16, DS_ERR_FORMAT, "overlap");
    /* adjacent is fine */
    expect_raw("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
               "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,16]}}",
               16, DS_OK, NULL);
}

static void test_byte_count(void **state) {
    (void)state;
    expect_raw("{\"t\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,8]}}", 16,
               DS_ERR_FORMAT, "'t'");
    expect_raw("{\"t\":{\"dtype\":\"BF16\",\"shape\":[2,2],\"data_offsets\":[0,16]}}", 16,
               DS_ERR_FORMAT, "'t'");
    expect_raw("{\"t\":{\"dtype\":\"I64\",\"shape\":[2],\"data_offsets\":[0,8]}}", 16,
               DS_ERR_FORMAT, "'t'");
    /* numel·size overflowing 64 bits must not wrap to a small number */
    expect_raw("{\"t\":{\"dtype\":\"F32\",\"shape\":[4294967296,4294967296],"
               "\"data_offsets\":[0,0]}}",
               16, DS_ERR_FORMAT, "'t'");
    expect_raw("{\"t\":{\"dtype\":\"F32\",\"shape\":[4611686018427387904],"
               "\"data_offsets\":[0,0]}}",
               16, DS_ERR_FORMAT, "'t'");
    expect_raw("{\"t\":{\"dtype\":\"F32\",\"shape\":[-1],\"data_offsets\":[0,4]}}", 16,
               DS_ERR_FORMAT, "'t'");
    expect_raw("{\"t\":{\"dtype\":\"F32\",\"shape\":[1,1,1,1,1,1,1,1,1],\"data_offsets\":[0,4]}}",
               16, DS_ERR_FORMAT, "rank");
}

static void test_truncated(void **state) {
    (void)state;
    stw w;
    stw_init(&w);
    const float v[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    const int64_t s[1] = {8};
    stw_add_f32(&w, "w", DS_DTYPE_F32, 1, s, v);
    size_t len;
    uint8_t *buf = stw_build(&w, &len);
    stw_free(&w);
    parse_expect(buf, len, DS_OK);
    for (size_t cut = 0; cut < len; cut++) {
        uint8_t *copy = malloc(cut ? cut : 1); /* exact size: ASan sees any overread */
        memcpy(copy, buf, cut);
        parse_expect(copy, cut, DS_ERR_FORMAT);
        free(copy);
    }

    /* The same through a real file and mmap. */
    char dir[] = "/tmp/ds_st_XXXXXX";
    assert_non_null(mkdtemp(dir));
    char path[256];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    assert_int_equal(stw_write_bytes(path, buf, len), 0);
    ds_st_file *f = NULL;
    ds_error err = {0};
    assert_int_equal(ds_st_open(path, &f, &err), DS_OK);
    assert_true(ds_st_tensor_get_f32(ds_st_find(f, "w"), 7) == 8.0f);
    assert_string_equal(ds_st_origin(f), path);
    ds_st_close(f);
    assert_int_equal(stw_write_bytes(path, buf, len - 3), 0);
    assert_int_equal(ds_st_open(path, &f, &err), DS_ERR_FORMAT);
    assert_non_null(strstr(err.msg, path));
    assert_null(f);
    assert_int_equal(stw_write_bytes(path, buf, 5), 0);
    err = (ds_error){0};
    assert_int_equal(ds_st_open(path, &f, &err), DS_ERR_FORMAT);
    unlink(path);
    err = (ds_error){0};
    assert_int_equal(ds_st_open(path, &f, &err), DS_ERR_IO);
    assert_non_null(strstr(err.msg, path));
    err = (ds_error){0};
    assert_int_equal(ds_st_open(dir, &f, &err), DS_ERR_IO); /* a directory */
    rmdir(dir);
    free(buf);
}

static void test_bad_json(void **state) {
    (void)state;
    expect_raw("{\"t\": ", 0, DS_ERR_FORMAT, "JSON");
    expect_raw("[]", 0, DS_ERR_FORMAT, NULL);
    expect_raw("\"str\"", 0, DS_ERR_FORMAT, NULL);
    expect_raw("{} x", 0, DS_ERR_FORMAT, NULL);
    expect_raw("{}{}", 0, DS_ERR_FORMAT, NULL);
    expect_raw("{\"t\":3}", 0, DS_ERR_FORMAT, "'t'");
    expect_raw("{\"t\":{\"shape\":[1],\"data_offsets\":[0,4]}}", 4, DS_ERR_FORMAT, "dtype");
    expect_raw("{\"t\":{\"dtype\":5,\"shape\":[1],\"data_offsets\":[0,4]}}", 4, DS_ERR_FORMAT,
               "dtype");
    expect_raw("{\"t\":{\"dtype\":\"F32\",\"data_offsets\":[0,4]}}", 4, DS_ERR_FORMAT, "shape");
    expect_raw("{\"t\":{\"dtype\":\"F32\",\"shape\":{},\"data_offsets\":[0,4]}}", 4, DS_ERR_FORMAT,
               "shape");
    expect_raw("{\"t\":{\"dtype\":\"F32\",\"shape\":[\"1\"],\"data_offsets\":[0,4]}}", 4,
               DS_ERR_FORMAT, "shape");
    expect_raw("{\"t\":{\"dtype\":\"F32\",\"shape\":[1]}}", 4, DS_ERR_FORMAT, "data_offsets");
    /* duplicate names */
    expect_raw("{\"t\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
               "\"t\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}",
               8, DS_ERR_FORMAT, "twice");
    /* a NUL inside the header region */
    size_t len;
    uint8_t *buf =
        raw_image("{\"t\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4, &len);
    buf[20] = 0;
    parse_expect(buf, len, DS_ERR_FORMAT);
    free(buf);
}

static void test_unsupported_requested(void **state) {
    (void)state;
    size_t len;
    uint8_t *buf = raw_image("{\"ids\":{\"dtype\":\"I32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                             "\"w\":{\"dtype\":\"F64\",\"shape\":[1],\"data_offsets\":[8,16]},"
                             "\"ok\":{\"dtype\":\"BF16\",\"shape\":[2],\"data_offsets\":[16,20]}}",
                             20, &len);
    ds_st_file *f = NULL;
    ds_error err = {0};
    assert_int_equal(ds_st_parse(buf, len, "x.safetensors", &f, &err), DS_OK);
    ds_tensor v;
    assert_int_equal(ds_st_tensor_view(ds_st_find(f, "ok"), &v, &err), DS_OK);
    assert_int_equal(ds_st_tensor_view(ds_st_find(f, "w"), &v, &err), DS_ERR_UNSUPPORTED);
    assert_non_null(strstr(err.msg, "'w'"));
    assert_non_null(strstr(err.msg, "F64"));
    assert_non_null(strstr(err.msg, "x.safetensors"));
    err = (ds_error){0};
    assert_int_equal(ds_st_tensor_view(ds_st_find(f, "ids"), &v, &err), DS_ERR_UNSUPPORTED);
    assert_non_null(strstr(err.msg, "I32"));
    ds_st_close(f);
    free(buf);
}

/* ---- fuzz replay ---------------------------------------------------------------------------- */

/* Runs `seed` and ~n mutations of it through the fuzz entry point. Each input lives in an
 * allocation of exactly its size. Returns the number of inputs the parser accepted. */
static int replay_mutations(const uint8_t *seed, size_t len, int n, uint64_t seed_rs) {
    test_rng rs = {seed_rs};
    int accepted = 0;
    uint8_t *buf = malloc(len ? len : 1);
    memcpy(buf, seed, len);
    LLVMFuzzerTestOneInput(buf, len);
    test_fuzz_truncations(LLVMFuzzerTestOneInput, seed, len);
    static const char tokens[] = "\"{}[],:-0915e.Ex \\";
    for (int i = 0; i < n; i++) {
        memcpy(buf, seed, len);
        int kind = (int)(test_rng_next(&rs) % 4);
        int edits = 1 + (int)(test_rng_next(&rs) % 3);
        for (int k = 0; k < edits && len > 0; k++) {
            size_t at = (size_t)(test_rng_next(&rs) % len);
            if (kind == 0) {
                buf[at] ^= (uint8_t)(1u << (test_rng_next(&rs) % 8));
            } else if (kind == 1) {
                buf[at] = (uint8_t)tokens[test_rng_next(&rs) % (sizeof tokens - 1)];
            } else if (kind == 2 && len >= 8) {
                uint64_t h = test_rng_next(&rs);
                uint64_t cur = 0;
                for (int b = 7; b >= 0; b--) cur = (cur << 8) | seed[b];
                /* random, near the truth, or at the edges */
                uint64_t choice[4] = {h, cur + (h % 17) - 8, len - 8 - (h % 4), h >> (h % 64)};
                uint64_t v = choice[test_rng_next(&rs) % 4];
                for (int b = 0; b < 8; b++) buf[b] = (uint8_t)(v >> (8 * b));
            } else {
                buf[at] = (uint8_t)test_rng_next(&rs);
            }
        }
        ds_st_file *f = NULL;
        ds_error err = {0};
        if (ds_st_parse(buf, len, "m", &f, &err) == DS_OK) {
            accepted++;
            ds_st_close(f);
        }
        LLVMFuzzerTestOneInput(buf, len);
    }
    free(buf);
    return accepted;
}

typedef struct corpus_stats {
    int accepted_mutants, total_inputs;
} corpus_stats;

static void replay_seed(const char *path, const uint8_t *seed, size_t len, int index, void *ctx) {
    corpus_stats *st = ctx;
    ds_st_file *f = NULL;
    ds_error err = {0};
    /* every seed is a valid file: a seed the parser rejects would be a parser bug */
    if (ds_st_parse(seed, len, path, &f, &err) != DS_OK) {
        fprintf(stderr, "seed %s rejected: %s\n", path, err.msg);
        fail();
    }
    ds_st_close(f);
    st->accepted_mutants += replay_mutations(seed, len, 3000, 0x9E3779B97F4A7C15ull + (uint64_t)index * 7919);
    st->total_inputs += 3000;
}

static void test_fuzz_corpus(void **state) {
    (void)state;
    corpus_stats st = {0, 0};
    const int files = test_for_each_file("fuzz/corpus_safetensors", replay_seed, &st);
    assert_true(files >= 5);
    /* mutations of tensor bytes keep a file valid: the accept path must be exercised too */
    assert_true(st.accepted_mutants > 0 && st.accepted_mutants < st.total_inputs);
    printf("fuzz replay: %d seeds, %d mutated inputs, %d accepted\n", files, st.total_inputs,
           st.accepted_mutants);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_good_file),          cmocka_unit_test(test_metadata_and_padding),
        cmocka_unit_test(test_header_length_lies), cmocka_unit_test(test_offsets),
        cmocka_unit_test(test_byte_count),         cmocka_unit_test(test_truncated),
        cmocka_unit_test(test_bad_json),           cmocka_unit_test(test_unsupported_requested),
        cmocka_unit_test(test_fuzz_corpus),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
