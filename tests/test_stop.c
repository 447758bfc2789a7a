/* test_stop.c — the stop-string matcher against hand-worked cases and against a brute-force
 * reference on random text with random chunkings (the outcome must not depend on chunking). */
#include "testlib.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sampling/sampler.h"

typedef struct run_out {
    char text[4096];   /* concatenation of everything released */
    size_t len;
    int stop_index;    /* -1 when no stop string matched */
    long long offset;  /* match_offset, or -1 */
    int released_at[64]; /* bytes released after each feed (to check hold-back) */
} run_out;

/* Feeds `chunks` one per token; flushes at the end when no stop string matched. */
static void run(const char *const *stops, int n_stops, bool include, int min_tokens,
                const char *const *chunks, int n_chunks, run_out *o) {
    ds_stop_matcher m;
    ds_error err = {0};
    if (ds_stop_matcher_init(&m, stops, n_stops, include, min_tokens, &err) != DS_OK)
        fail_msg("init: %s", err.msg);
    memset(o, 0, sizeof *o);
    o->stop_index = -1;
    o->offset = -1;
    for (int i = 0; i < n_chunks; i++) {
        ds_stop_result r;
        assert_int_equal(ds_stop_matcher_feed(&m, chunks[i], strlen(chunks[i]), &r, &err), DS_OK);
        assert_true(o->len + r.len < sizeof o->text);
        memcpy(o->text + o->len, r.text, r.len);
        o->len += r.len;
        if (i < 64) o->released_at[i] = (int)o->len;
        if (r.stop_index >= 0) {
            assert_int_equal(o->stop_index, -1);
            o->stop_index = r.stop_index;
            o->offset = (long long)r.match_offset;
        }
    }
    if (o->stop_index < 0) {
        ds_stop_result r;
        ds_stop_matcher_flush(&m, &r);
        memcpy(o->text + o->len, r.text, r.len);
        o->len += r.len;
    }
    o->text[o->len] = 0;
    ds_stop_matcher_free(&m);
}

#define CHUNKS(...) (const char *const[]){__VA_ARGS__}, (int)(sizeof((const char *const[]){__VA_ARGS__}) / sizeof(char *))
#define STOPS(...) (const char *const[]){__VA_ARGS__}, (int)(sizeof((const char *const[]){__VA_ARGS__}) / sizeof(char *))

static void test_split_across_chunks(void **state) {
    (void)state;
    run_out o;
    run(STOPS("STOP"), false, 0, CHUNKS("abc S", "T", "OP def"), &o);
    assert_string_equal(o.text, "abc ");
    assert_int_equal(o.stop_index, 0);
    assert_int_equal(o.offset, 4);
    /* "S" and "ST" were held back; "abc " went out at once */
    assert_int_equal(o.released_at[0], 4);
    assert_int_equal(o.released_at[1], 4);

    run(STOPS("STOP"), true, 0, CHUNKS("abc S", "T", "OP def"), &o);
    assert_string_equal(o.text, "abc STOP");
    assert_int_equal(o.released_at[0], 5); /* nothing to hide when the stop string is shown */
    assert_int_equal(o.offset, 4);
}

static void test_multiple_stop_strings(void **state) {
    (void)state;
    run_out o;
    /* the stop string that completes first wins, whatever the list order */
    run(STOPS("world", "lo w"), false, 0, CHUNKS("hel", "lo world"), &o);
    assert_string_equal(o.text, "hel");
    assert_int_equal(o.stop_index, 1);
    run(STOPS("lo w", "world"), false, 0, CHUNKS("hel", "lo world"), &o);
    assert_int_equal(o.stop_index, 0);
    /* both end at the same byte: the longer one (it started earlier) */
    run(STOPS("b", "ab"), false, 0, CHUNKS("xxab"), &o);
    assert_string_equal(o.text, "xx");
    assert_int_equal(o.stop_index, 1);
    /* "\n\n" in one chunk, "###" in the next: the first to appear in the stream wins */
    run(STOPS("###", "\n\n"), false, 0, CHUNKS("a\n", "\nb###"), &o);
    assert_string_equal(o.text, "a");
    assert_int_equal(o.stop_index, 1);
    assert_int_equal(o.offset, 1);
}

static void test_overlapping_prefix(void **state) {
    (void)state;
    run_out o;
    run(STOPS("ab"), false, 0, CHUNKS("a", "a", "b"), &o);
    assert_string_equal(o.text, "a");
    assert_int_equal(o.released_at[0], 0); /* "a" could start "ab" */
    assert_int_equal(o.released_at[1], 1); /* "aa": only the second "a" could */
    assert_int_equal(o.offset, 1);
    run(STOPS("aab"), false, 0, CHUNKS("a", "a", "a", "b"), &o);
    assert_string_equal(o.text, "a");
    assert_int_equal(o.offset, 1);
    run(STOPS("abab"), false, 0, CHUNKS("ab", "a", "bab"), &o); /* "ababab" → at 0 */
    assert_string_equal(o.text, "");
    assert_int_equal(o.offset, 0);
}

static void test_stop_at_start(void **state) {
    (void)state;
    run_out o;
    run(STOPS("<|im_end|>"), false, 0, CHUNKS("<|im_end|>", "tail"), &o);
    assert_string_equal(o.text, "");
    assert_int_equal(o.stop_index, 0);
    assert_int_equal(o.offset, 0);
    run(STOPS("<|im_end|>"), true, 0, CHUNKS("<|im_end|>tail"), &o);
    assert_string_equal(o.text, "<|im_end|>");
}

static void test_flush_releases_everything(void **state) {
    (void)state;
    run_out o;
    run(STOPS("STOP"), false, 0, CHUNKS("abc", " ST"), &o);
    assert_int_equal(o.released_at[1], 4);
    assert_string_equal(o.text, "abc ST"); /* the flush gave back "ST" */
    assert_int_equal(o.stop_index, -1);
    /* no false hold-back: text that cannot start a stop string goes out immediately */
    run(STOPS("STOP"), false, 0, CHUNKS("abc", "xyz", "T"), &o);
    assert_int_equal(o.released_at[0], 3);
    assert_int_equal(o.released_at[1], 6);
    assert_int_equal(o.released_at[2], 7);
    /* no stop strings at all: a pass-through */
    run(NULL, 0, false, 0, CHUNKS("a", "STOP", ""), &o);
    assert_int_equal(o.released_at[1], 5);
    assert_string_equal(o.text, "aSTOP");
    /* empty chunks (a token whose text is not complete yet) are fine */
    run(STOPS("xy"), false, 0, CHUNKS("", "x", "", "y"), &o);
    assert_string_equal(o.text, "");
    assert_int_equal(o.stop_index, 0);
}

static void test_utf8(void **state) {
    (void)state;
    run_out o;
    /* multibyte stop string split between tokens, even inside a character */
    run(STOPS("停止"), false, 0, CHUNKS("你好", "停", "止了"), &o);
    assert_string_equal(o.text, "你好");
    assert_int_equal(o.offset, 6);
    run(STOPS("停止"), false, 0, CHUNKS("你好\xe5\x81", "\x9c\xe6", "\xad\xa2"), &o);
    assert_string_equal(o.text, "你好");
    /* a character sharing its first bytes with the stop string is released whole */
    run(STOPS("停止"), false, 0, CHUNKS("你", "停", "车"), &o);
    assert_int_equal(o.released_at[1], 3);
    assert_int_equal(o.released_at[2], 9);
    assert_string_equal(o.text, "你停车");
    /* with no stop strings, an incomplete trailing character is still held until complete */
    run(NULL, 0, false, 0, CHUNKS("a\xe4\xbd", "\xa0", "b"), &o);
    assert_int_equal(o.released_at[0], 1);
    assert_int_equal(o.released_at[1], 4);
    assert_string_equal(o.text, "a你b");
    run(STOPS("。"), true, 0, CHUNKS("好。", "多"), &o);
    assert_string_equal(o.text, "好。");
}

static void test_min_tokens_delays_stop_strings(void **state) {
    (void)state;
    run_out o;
    /* vLLM: stop strings are checked once more than min_tokens tokens exist */
    run(STOPS("."), false, 2, CHUNKS("a.", "b.", "c.", "d."), &o);
    assert_string_equal(o.text, "a.b.c");
    assert_int_equal(o.offset, 5);
    run(STOPS("."), false, 0, CHUNKS("a.", "b."), &o);
    assert_string_equal(o.text, "a");
    /* a match must end in text fed after min_tokens, but may start before */
    run(STOPS("xyz"), false, 1, CHUNKS("xy", "z"), &o);
    assert_string_equal(o.text, "");
    assert_int_equal(o.offset, 0);
    run(STOPS("xy"), false, 1, CHUNKS("xy", "z"), &o);
    assert_string_equal(o.text, "xyz");
}

static void test_after_stop_nothing_more(void **state) {
    (void)state;
    ds_stop_matcher m;
    ds_error err = {0};
    const char *stops[1] = {"!"};
    assert_int_equal(ds_stop_matcher_init(&m, stops, 1, false, 0, &err), DS_OK);
    ds_stop_result r;
    assert_int_equal(ds_stop_matcher_feed(&m, "hi! there", 9, &r, &err), DS_OK);
    assert_int_equal(r.len, 2);
    assert_int_equal(r.stop_index, 0);
    assert_int_equal(ds_stop_matcher_feed(&m, "more", 4, &r, &err), DS_OK);
    assert_int_equal(r.len, 0);
    assert_int_equal(r.stop_index, -1);
    ds_stop_matcher_flush(&m, &r);
    assert_int_equal(r.len, 0);
    ds_stop_matcher_free(&m);

    /* init from request params */
    ds_sampling_params p;
    ds_sampling_params_init(&p);
    const char *st[2] = {"END", "\n\n"};
    p.stop = st;
    p.n_stop = 2;
    p.include_stop_str_in_output = true;
    assert_int_equal(ds_stop_matcher_init_params(&m, &p, &err), DS_OK);
    assert_int_equal(ds_stop_matcher_feed(&m, "the END.", 8, &r, &err), DS_OK);
    assert_int_equal(r.stop_index, 0);
    assert_int_equal(r.len, 7);
    assert_memory_equal(r.text, "the END", 7);
    ds_stop_matcher_free(&m);
}

/* Brute force: scan end positions in order; the first at which some stop string ends wins
 * (the longest such). Matches must end after byte min_end (the text of the first min_tokens
 * tokens). */
static void reference(const char *t, size_t n, const char *const *stops, int ns, bool include,
                      size_t min_end, char *out, int *idx, long long *off) {
    *idx = -1;
    *off = -1;
    for (size_t e = min_end + 1; e <= n; e++) {
        int best = -1;
        for (int j = 0; j < ns; j++) {
            size_t L = strlen(stops[j]);
            if (L <= e && memcmp(t + e - L, stops[j], L) == 0 &&
                (best < 0 || L > strlen(stops[best])))
                best = j;
        }
        if (best >= 0) {
            size_t L = strlen(stops[best]);
            size_t cut = include ? e : e - L;
            memcpy(out, t, cut);
            out[cut] = 0;
            *idx = best;
            *off = (long long)(e - L);
            return;
        }
    }
    memcpy(out, t, n);
    out[n] = 0;
}

static void test_random_chunkings_match_reference(void **state) {
    (void)state;
    const char *alphabet[] = {"a", "b", "c", " ", "é", "停"};
    const char *const stops[4] = {"abca", "bb", "c é", "停停a"};
    test_rng rng = {12345};
    int matched = 0;
    for (int trial = 0; trial < 3000; trial++) {
        char text[512];
        size_t n = 0;
        int len = 5 + (int)((test_rng_uniform(&rng) + 1) * 20);
        for (int i = 0; i < len; i++) {
            const char *a = alphabet[(int)((test_rng_uniform(&rng) + 1) * 3) % 6];
            memcpy(text + n, a, strlen(a));
            n += strlen(a);
        }
        text[n] = 0;
        int ns = 1 + trial % 4;
        bool include = trial % 3 == 0;
        /* random byte-level chunking (may split characters) */
        char pieces[64][64];
        const char *chunks[64];
        int nc = 0;
        size_t pos = 0;
        while (pos < n && nc < 63) {
            size_t k = 1 + (size_t)((test_rng_uniform(&rng) + 1) * 3);
            if (k > n - pos) k = n - pos;
            memcpy(pieces[nc], text + pos, k);
            pieces[nc][k] = 0;
            chunks[nc] = pieces[nc];
            nc++;
            pos += k;
        }
        if (pos < n) {
            strcpy(pieces[nc], text + pos);
            chunks[nc] = pieces[nc];
            nc++;
        }
        int min_tokens = trial % 5 == 0 ? trial % 7 : 0;
        size_t min_end = 0;
        for (int i = 0; i < min_tokens && i < nc; i++) min_end += strlen(chunks[i]);
        run_out o;
        run(stops, ns, include, min_tokens, chunks, nc, &o);
        char want[512];
        int widx;
        long long woff;
        reference(text, n, stops, ns, include, min_end, want, &widx, &woff);
        if (strcmp(o.text, want) != 0 || o.stop_index != widx || o.offset != woff)
            fail_msg("trial %d text \"%s\" (%d stops, include %d, min_tokens %d): got \"%s\" "
                     "idx %d off %lld, want \"%s\" idx %d off %lld",
                     trial, text, ns, include, min_tokens, o.text, o.stop_index, o.offset, want,
                     widx, woff);
        matched += widx >= 0;
    }
    print_message("%d of 3000 random streams hit a stop string\n", matched);
    assert_true(matched > 500 && matched < 2900);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_split_across_chunks),
        cmocka_unit_test(test_multiple_stop_strings),
        cmocka_unit_test(test_overlapping_prefix),
        cmocka_unit_test(test_stop_at_start),
        cmocka_unit_test(test_flush_releases_everything),
        cmocka_unit_test(test_utf8),
        cmocka_unit_test(test_min_tokens_delays_stop_strings),
        cmocka_unit_test(test_after_stop_nothing_more),
        cmocka_unit_test(test_random_chunkings_match_reference),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
