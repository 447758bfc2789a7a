/* test_json_grammar.c — JSON mode (sampling/json_grammar.h): the byte automaton on valid and
 * invalid documents (the exact byte where each invalid one fails), its bounds, the token mask
 * on a small vocabulary of JSON fragments (random walks that end by EOS are JSON objects cJSON
 * parses, and the mask never leaves a walk without a token), and the sampler with JSON mode
 * (greedy and sampled outputs, the deferred start after a reasoning block, the parameter
 * checks). */
#include "testlib.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "sampling/json_grammar.h"
#include "sampling/sampler.h"

/* Bytes of doc accepted before the first failure (strlen(doc) when all are); *done after. */
static size_t accepted(const char *doc, bool *done) {
    ds_json_state s;
    ds_json_init(&s);
    size_t i = 0;
    for (; doc[i]; i++)
        if (!ds_json_feed(&s, (uint8_t)doc[i])) break;
    *done = ds_json_done(&s);
    return i;
}

/* Proves: documents that are one JSON object are accepted to the end and leave the automaton
 * done; every proper prefix of them is accepted and not done. */
static void test_valid_documents(void **state) {
    (void)state;
    const char *docs[] = {
        "{}",
        "{\"a\":1}",
        " {\"a\": [1, -0.5e+10, 0, -0, 3.25E-2, 10, true, false, null]}",
        "{\"s\":\"x\\\"y\\\\z\\/\\b\\f\\n\\r\\t\\u00e9\\uD83D\\uDE00\", \"\":\"\", \"u\":\"\xc3\xa9\"}",
        "{\"o\":{\"p\":{\"q\":[[],{},[{}]]}}}",
        "{\n  \"a\": 1,\n  \"b\": [\n    2,\n\t3\n  ]\n}",
        "{\"k\":{}, \"l\":[ ], \"m\":\"}\"}",
    };
    for (size_t k = 0; k < sizeof docs / sizeof docs[0]; k++) {
        bool done;
        const size_t n = strlen(docs[k]);
        if (accepted(docs[k], &done) != n || !done) fail_msg("valid document %zu refused", k);
        cJSON *o = cJSON_Parse(docs[k]);
        assert_true(cJSON_IsObject(o)); /* (the references are JSON objects too) */
        cJSON_Delete(o);
        ds_json_state s;
        ds_json_init(&s);
        for (size_t i = 0; i + 1 < n; i++) {
            assert_true(ds_json_feed(&s, (uint8_t)docs[k][i]));
            assert_false(ds_json_done(&s));
        }
    }
}

/* Proves: each invalid document fails at exactly the byte where it stops being a prefix of a
 * JSON object (the index given), and a failed byte leaves the state as it was. */
static void test_invalid_documents(void **state) {
    (void)state;
    const struct {
        const char *doc;
        size_t at;
    } bad[] = {
        {"[]", 0},              /* the top level is an object */
        {"\"{}\"", 0},
        {"{\"a\":01}", 6},      /* leading zero */
        {"{\"a\":1,}", 7},      /* trailing comma */
        {"{,}", 1},
        {"{\"a\" 1}", 5},
        {"{\"a\":tru}", 8},
        {"{\"a\":\"\x01\"}", 6}, /* control byte in a string */
        {"{\"a\":1}}", 7},      /* after the end */
        {"{\"a\":-}", 6},
        {"{\"a\":1.}", 7},
        {"{\"a\":1e}", 7},
        {"{\"a\":\"\\q\"}", 7},
        {"{\"a\":\"\\u12g4\"}", 10},
        {"{1:2}", 1},           /* keys are strings */
        {"{\"a\":[1 2]}", 8},
        {"{\"a\":[1,]}", 8},
        {"{\"a\":1]", 6},       /* wrong closer */
        {"{\"a\":+1}", 5},
        {"{\"a\":.5}", 5},
        {"{} ", 2},             /* nothing after the end, not even whitespace */
        {"{\r}", 1},            /* whitespace is " " or "\n" + indentation */
        {"{  }", 2},
        {"{\n\n}", 2},
        {"{\t}", 1},
    };
    for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
        bool done;
        const size_t at = accepted(bad[k].doc, &done);
        if (at != bad[k].at)
            fail_msg("invalid document %zu (%s) failed at byte %zu, expected %zu", k, bad[k].doc,
                     at, bad[k].at);
    }
    /* a failed byte changes nothing */
    ds_json_state s, before;
    ds_json_init(&s);
    assert_true(ds_json_feed_bytes(&s, (const uint8_t *)"{\"a\":[1", 7));
    before = s;
    assert_false(ds_json_feed(&s, 'x'));
    assert_memory_equal(&s, &before, sizeof s);
    assert_false(ds_json_feed_bytes(&s, (const uint8_t *)",2,x", 4));
    assert_memory_equal(&s, &before, sizeof s);
}

/* Proves the bounds: DS_JSON_MAX_DEPTH containers nest and one more does not; a newline takes
 * DS_JSON_MAX_INDENT spaces or tabs of indentation and not one more. */
static void test_bounds(void **state) {
    (void)state;
    ds_json_state s;
    ds_json_init(&s);
    assert_true(ds_json_feed_bytes(&s, (const uint8_t *)"{\"k\":", 5));
    for (int d = 1; d < DS_JSON_MAX_DEPTH; d++) assert_true(ds_json_feed(&s, '['));
    assert_int_equal(s.depth, DS_JSON_MAX_DEPTH);
    assert_false(ds_json_feed(&s, '['));
    assert_false(ds_json_feed(&s, '{'));
    assert_true(ds_json_feed(&s, '1'));
    for (int d = 1; d < DS_JSON_MAX_DEPTH; d++) assert_true(ds_json_feed(&s, ']'));
    assert_true(ds_json_feed(&s, '}'));
    assert_true(ds_json_done(&s));

    ds_json_init(&s);
    assert_true(ds_json_feed_bytes(&s, (const uint8_t *)"{\n", 2));
    for (int i = 0; i < DS_JSON_MAX_INDENT; i++) assert_true(ds_json_feed(&s, i % 2 ? '\t' : ' '));
    assert_false(ds_json_feed(&s, ' '));
    assert_true(ds_json_feed_bytes(&s, (const uint8_t *)"\"a\": 1 }", 8));
    assert_true(ds_json_done(&s));
}

/* ---- the token mask -------------------------------------------------------------------------- */

/* A small vocabulary: id 0 is EOS, id 1 a special token (no bytes), the rest JSON fragments
 * and junk, single bytes and longer pieces mixed. */
static const char *const VOCAB[] = {
    NULL, NULL, "{", "}", "[", "]", ":", ",", "\"", " ", "\n", "\n  ", "\t", "a", "b", "0", "1",
    "9", "-", ".", "e", "+", "true", "fal", "se", "null", "nu", "ll", "\\", "n", "u", "f", "F",
    "\": ", "\", \"", "{\"", "\"}", "[1", ", ", "}}", "]}", "},", "x\"y", "1.5", "e-3", "\\u00",
    "41", "\xc3\xa9", "t", "r", "l", "s", "{}", "[]", "\"\"", "0.", "1e", "}\n", "\n}",
};
enum { N_VOCAB = (int)(sizeof VOCAB / sizeof VOCAB[0]) };

static ds_json_vocab make_vocab(void) {
    ds_json_vocab v = {.n = N_VOCAB};
    v.bytes = calloc(N_VOCAB, sizeof *v.bytes);
    v.len = calloc(N_VOCAB, sizeof *v.len);
    for (int i = 0; i < N_VOCAB; i++) {
        if (!VOCAB[i]) continue;
        v.bytes[i] = (const uint8_t *)VOCAB[i];
        v.len[i] = (uint32_t)strlen(VOCAB[i]);
    }
    assert_true(ds_json_vocab_index(&v));
    return v;
}

/* Proves, over 3000 random walks (uniform random logits, the best allowed token each step):
 * the mask never leaves a walk without a token; an allowed token's bytes always feed; EOS is
 * allowed exactly when the object is closed, and then alone; every walk that chose EOS spelled
 * a document cJSON parses as an object; the special id and the ids past the vocabulary are
 * never allowed. Also: the mask agrees with feeding each token on a copy of the state. */
static void test_mask_walks(void **state) {
    (void)state;
    ds_json_vocab v = make_vocab();
    const int end_ids[1] = {0};
    enum { N_LOGITS = N_VOCAB + 3 };
    float logits[N_LOGITS];
    test_rng g = {0x150d};
    int n_closed = 0;
    char text[4096];
    for (int walk = 0; walk < 3000; walk++) {
        ds_json_state s;
        ds_json_init(&s);
        size_t len = 0;
        bool ended = false;
        for (int step = 0; step < 200 && !ended; step++) {
            for (int i = 0; i < N_LOGITS; i++) logits[i] = test_rng_uniform(&g);
            float copy[N_LOGITS];
            memcpy(copy, logits, sizeof copy);
            ds_json_mask(&s, &v, end_ids, 1, logits, N_LOGITS);
            int best = -1;
            for (int i = 0; i < N_LOGITS; i++) {
                const bool allowed = logits[i] != -INFINITY;
                if (allowed) assert_true(logits[i] == copy[i]); /* untouched */
                bool feeds = false;
                if (i > 0 && i < N_VOCAB && VOCAB[i]) {
                    ds_json_state t = s;
                    feeds = !ds_json_done(&s) && ds_json_feed_token(&t, &v, i);
                }
                assert_int_equal(allowed, i == 0 ? ds_json_done(&s) : feeds);
                if (allowed && (best < 0 || logits[i] > logits[best])) best = i;
            }
            assert_true(best >= 0); /* never stuck */
            if (best == 0) {
                ended = true;
                break;
            }
            assert_true(ds_json_feed_token(&s, &v, best));
            const size_t n = strlen(VOCAB[best]);
            assert_true(len + n < sizeof text);
            memcpy(text + len, VOCAB[best], n);
            len += n;
        }
        text[len] = 0;
        if (!ended) continue;
        n_closed++;
        cJSON *o = cJSON_Parse(text);
        if (!cJSON_IsObject(o)) fail_msg("walk %d ended with EOS but spelled: %s", walk, text);
        cJSON_Delete(o);
    }
    printf("  %d of 3000 walks closed their object and ended\n", n_closed);
    assert_true(n_closed > 300);
    ds_json_vocab_free(&v);
}

/* ---- the sampler ----------------------------------------------------------------------------- */

static int sample_all(ds_sampler *smp, test_rng *g, int max, char *text, size_t cap) {
    size_t len = 0;
    float logits[N_VOCAB];
    for (int n = 0; n < max; n++) {
        for (int i = 0; i < N_VOCAB; i++) logits[i] = 2.0f * test_rng_uniform(g);
        ds_sample_result res;
        ds_error err = {0};
        if (ds_sampler_sample(smp, logits, n, &res, &err) != DS_OK) fail_msg("%s", err.msg);
        if (ds_sampler_accept(smp, res.token, &err) != DS_OK) fail_msg("%s", err.msg);
        if (res.token == 0) {
            text[len] = 0;
            return n + 1;
        }
        const size_t k = VOCAB[res.token] ? strlen(VOCAB[res.token]) : 0;
        assert_true(len + k < cap);
        memcpy(text + len, VOCAB[res.token], k);
        len += k;
    }
    text[len] = 0;
    return -1;
}

/* Proves: greedy and sampled requests with JSON mode produce JSON objects when they end by EOS;
 * a deferred start lets anything through until the start token, then the grammar holds; JSON
 * mode refuses ignore_eos and min_tokens; accepting a token the grammar rules out fails. */
static void test_sampler_json(void **state) {
    (void)state;
    ds_json_vocab v = make_vocab();
    const int eos[1] = {0};
    test_rng g = {77};
    char text[8192];
    int ended = 0;
    for (int k = 0; k < 200; k++) {
        ds_sampling_params p;
        ds_sampling_params_init(&p);
        p.json = &v;
        p.temperature = k % 2 ? 0.0f : 1.0f;
        p.top_p = 0.9f;
        p.has_seed = true;
        p.seed = (uint64_t)k;
        p.max_tokens = 300;
        ds_sampler smp;
        ds_error err = {0};
        if (ds_sampler_init(&smp, &p, N_VOCAB, eos, 1, &err) != DS_OK) fail_msg("%s", err.msg);
        if (sample_all(&smp, &g, 300, text, sizeof text) > 0) {
            ended++;
            cJSON *o = cJSON_Parse(text);
            if (!cJSON_IsObject(o)) fail_msg("request %d: %s", k, text);
            cJSON_Delete(o);
        }
        ds_sampler_free(&smp);
    }
    printf("  %d of 200 JSON-mode requests ended by EOS with an object\n", ended);
    assert_true(ended > 20);

    /* deferred: "x" tokens (id of "a") are free before the start token (id of "t") */
    ds_sampling_params p;
    ds_sampling_params_init(&p);
    p.json = &v;
    p.json_deferred = true;
    p.json_start_after = 48; /* "t" */
    assert_string_equal(VOCAB[48], "t");
    ds_sampler smp;
    ds_error err = {0};
    assert_int_equal(ds_sampler_init(&smp, &p, N_VOCAB, eos, 1, &err), DS_OK);
    assert_int_equal(ds_sampler_accept(&smp, 13, &err), DS_OK); /* "a": no grammar yet */
    assert_int_equal(ds_sampler_accept(&smp, 3, &err), DS_OK);  /* "}" */
    assert_int_equal(ds_sampler_accept(&smp, 48, &err), DS_OK); /* the start */
    assert_int_equal(ds_sampler_accept(&smp, 3, &err), DS_ERR_INVALID_ARG); /* "}" first: no */
    assert_int_equal(ds_sampler_accept(&smp, 2, &err), DS_OK);  /* "{" */
    float logits[N_VOCAB];
    for (int i = 0; i < N_VOCAB; i++) logits[i] = 0.0f;
    logits[13] = 5.0f; /* "a" is the favourite but cannot follow "{" */
    ds_sample_result res;
    assert_int_equal(ds_sampler_sample(&smp, logits, 5, &res, &err), DS_OK);
    assert_int_not_equal(res.token, 13);
    ds_sampler_free(&smp);

    /* refused combinations */
    p.json_deferred = false;
    p.ignore_eos = true;
    err = (ds_error){0};
    assert_int_equal(ds_sampler_init(&smp, &p, N_VOCAB, eos, 1, &err), DS_ERR_INVALID_ARG);
    if (!strstr(err.msg, "ignore_eos")) fail_msg("%s", err.msg);
    ds_sampler_free(&smp);
    p.ignore_eos = false;
    p.min_tokens = 2;
    err = (ds_error){0};
    assert_int_equal(ds_sampler_init(&smp, &p, N_VOCAB, eos, 1, &err), DS_ERR_INVALID_ARG);
    assert_non_null(strstr(err.msg, "min_tokens"));
    ds_sampler_free(&smp);
    ds_json_vocab_free(&v);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_valid_documents),
        cmocka_unit_test(test_invalid_documents),
        cmocka_unit_test(test_bounds),
        cmocka_unit_test(test_mask_walks),
        cmocka_unit_test(test_sampler_json),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
