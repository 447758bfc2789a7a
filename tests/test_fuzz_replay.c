/* test_fuzz_replay.c — the OpenAI request, model config and JSON-mode grammar fuzz targets
 * without libFuzzer.
 *
 * The targets are compiled in (each is one entry point, renamed here) so that their seed
 * corpora and thousands of deterministic mutations of each seed run through exactly what
 * libFuzzer calls, with the targets' own oracles; the sanitizer build (ASan + UBSan + leak
 * checks) runs this test too. Every seed must be accepted by its parser (a rejected seed is a
 * parser bug or a stale seed), and some mutations must be accepted as well, so that both the
 * reject and the accept paths are exercised. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "testlib.h"

#define LLVMFuzzerTestOneInput fuzz_openai_req_one
#include "../fuzz/fuzz_openai_req.c"
#undef LLVMFuzzerTestOneInput
#define LLVMFuzzerTestOneInput fuzz_config_one
#include "../fuzz/fuzz_config.c"
#undef LLVMFuzzerTestOneInput
#define LLVMFuzzerTestOneInput fuzz_json_grammar_one
#include "../fuzz/fuzz_json_grammar.c"
#undef LLVMFuzzerTestOneInput

/* Whether the parser behind a target accepts the input (for the seed and accept counts);
 * verbose: say why not on stderr. */
typedef int (*accept_fn)(const uint8_t *data, size_t size, int verbose);

static int openai_accepts(const uint8_t *data, size_t size, int verbose) {
    if (size < 1) return 0;
    ds_oai_request r;
    ds_oai_error e;
    const int ok = ds_oai_parse((data[0] & 1) ? DS_OAI_CHAT : DS_OAI_COMPLETIONS,
                                (const char *)data + 1, size - 1, &r, &e);
    if (!ok && verbose) fprintf(stderr, "  (rejected: %s)\n", e.message);
    ds_oai_request_free(&r);
    return ok;
}

static int config_accepts(const uint8_t *data, size_t size, int verbose) {
    char *text = malloc(size + 1);
    memcpy(text, data, size);
    text[size] = 0;
    ds_config cfg;
    ds_error err = {0};
    const int ok = ds_config_parse(text, "seed", &cfg, &err) == DS_OK;
    if (!ok && verbose) fprintf(stderr, "  (rejected: %s)\n", err.msg);
    free(text);
    return ok;
}

static int json_accepts(const uint8_t *data, size_t size, int verbose) {
    ds_json_state s;
    ds_json_init(&s);
    const int ok = ds_json_feed_bytes(&s, data, size) && ds_json_done(&s);
    if (!ok && verbose) fprintf(stderr, "  (not one closed JSON object)\n");
    return ok;
}

/* Runs every truncation step of `seed` and n mutations of it (bit flips, JSON punctuation and
 * digits, random bytes, a span deleted or doubled) through `one`, each input in an allocation of
 * exactly its size. `keep` bytes at the front are never mutated (the endpoint selector). Returns
 * how many mutants the parser accepted. */
static int replay_mutations(test_fuzz_fn one, accept_fn accepts, const uint8_t *seed, size_t len,
                            size_t keep, int n, uint64_t seed_rs) {
    test_rng rs = {seed_rs};
    test_fuzz_truncations(one, seed, len);
    static const char tokens[] = "\"{}[],:-0915e.E \\ntfu";
    int accepted = 0;
    uint8_t *buf = malloc(2 * len + 1);
    for (int i = 0; i < n; i++) {
        memcpy(buf, seed, len);
        size_t blen = len;
        const int kind = (int)(test_rng_next(&rs) % 5);
        const int edits = 1 + (int)(test_rng_next(&rs) % 3);
        for (int k = 0; k < edits && blen > keep; k++) {
            const size_t at = keep + (size_t)(test_rng_next(&rs) % (blen - keep));
            if (kind == 0) {
                buf[at] ^= (uint8_t)(1u << (test_rng_next(&rs) % 8));
            } else if (kind == 1) {
                buf[at] = (uint8_t)tokens[test_rng_next(&rs) % (sizeof tokens - 1)];
            } else if (kind == 2) {
                buf[at] = (uint8_t)test_rng_next(&rs);
            } else {
                const size_t span = 1 + (size_t)(test_rng_next(&rs) % 16);
                const size_t s = at + span <= blen ? span : blen - at;
                if (kind == 3) { /* delete */
                    memmove(buf + at, buf + at + s, blen - at - s);
                    blen -= s;
                } else if (blen + s <= 2 * len) { /* double */
                    memmove(buf + at + s, buf + at, blen - at);
                    blen += s;
                }
            }
        }
        uint8_t *exact = malloc(blen ? blen : 1);
        memcpy(exact, buf, blen);
        one(exact, blen);
        accepted += accepts(exact, blen, 0); /* rejected mutants are the normal case */
        free(exact);
    }
    free(buf);
    return accepted;
}

typedef struct corpus_run {
    test_fuzz_fn one;
    accept_fn accepts;
    size_t keep;
    int mutations, accepted_mutants, total;
} corpus_run;

static void replay_seed(const char *path, const uint8_t *seed, size_t len, int index, void *ctx) {
    corpus_run *c = ctx;
    if (!c->accepts(seed, len, 1)) {
        fprintf(stderr, "seed %s rejected\n", path);
        fail();
    }
    c->one(seed, len);
    c->accepted_mutants += replay_mutations(c->one, c->accepts, seed, len, c->keep, c->mutations,
                                            0x9E3779B97F4A7C15ull + (uint64_t)index * 7919);
    c->total += c->mutations;
}

static void replay_corpus(const char *dir_path, test_fuzz_fn one, accept_fn accepts, size_t keep,
                          int mutations) {
    corpus_run c = {one, accepts, keep, mutations, 0, 0};
    const int files = test_for_each_file(dir_path, replay_seed, &c); /* run from the repo root */
    assert_true(files >= 5);
    assert_true(c.accepted_mutants > 0 && c.accepted_mutants < c.total);
    printf("fuzz replay %s: %d seeds, %d mutated inputs, %d accepted\n", dir_path, files, c.total,
           c.accepted_mutants);
}

static void test_openai_req_corpus(void **state) {
    (void)state;
    replay_corpus("fuzz/corpus_openai_req", fuzz_openai_req_one, openai_accepts, 1, 2000);
}

static void test_config_corpus(void **state) {
    (void)state;
    replay_corpus("fuzz/corpus_config", fuzz_config_one, config_accepts, 0, 1500);
}

static void test_json_grammar_corpus(void **state) {
    (void)state;
    replay_corpus("fuzz/corpus_json_grammar", fuzz_json_grammar_one, json_accepts, 0, 3000);
}

/* Hand-made hostile inputs through the targets' oracles (a rejection must be a 4xx error whose
 * JSON rendering holds its message; an acceptance must hold up to the checks). */
static void test_hostile_inputs(void **state) {
    (void)state;
    static const char *bodies[] = {
        "0", "1", "0{", "1[]", "0{\"prompt\": \"\\ud800\"}",          /* lone surrogate */
        "1{\"messages\": [{\"role\": \"user\", \"content\": \"\\u0000x\"}]}", /* NUL inside */
        "0{\"prompt\": \"x\", \"stop\": [\"\\\"</script>\\n\"]}",      /* needs escaping */
        "0{\"prompt\": \"x\", \"max_tokens\": 1e400}",                   /* overflow */
        "1{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"tools\": [{}]}",
    };
    for (size_t i = 0; i < sizeof bodies / sizeof bodies[0]; i++)
        fuzz_openai_req_one((const uint8_t *)bodies[i], strlen(bodies[i]));
    static const char *configs[] = {
        "", "{}", "[]", "{\"model_type\": \"qwen3_5_moe_text\"}",
        "{\"model_type\": \"qwen3_5_text\", \"hidden_size\": 1e300}",
        "{\"model_type\": \"qwen3_5_moe\", \"text_config\": 5}",
    };
    for (size_t i = 0; i < sizeof configs / sizeof configs[0]; i++)
        fuzz_config_one((const uint8_t *)configs[i], strlen(configs[i]));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_openai_req_corpus),
        cmocka_unit_test(test_config_corpus),
        cmocka_unit_test(test_json_grammar_corpus),
        cmocka_unit_test(test_hostile_inputs),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
