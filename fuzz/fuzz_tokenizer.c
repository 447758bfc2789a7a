/* fuzz_tokenizer.c — libFuzzer target for the tokenizer.
 *
 * Input byte 0 picks the mode; the rest is the payload:
 *   bit 7 clear: encode the payload (any bytes, invalid UTF-8 included) with the tiny tokenizer
 *                of tests/data/tokenizer/tiny/ (bit 0: parse specials), decode the ids whole
 *                (bit 1: skip specials) and incrementally, check the two decodes agree and
 *                every chunk is valid UTF-8, then re-encode the decoded text;
 *   bit 7 set:   parse the payload as a tokenizer.json (must fail cleanly or load).
 * The tiny tokenizer is found through env DS_FUZZ_TOKENIZER, else relative to this source file. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tokenizer/tokenizer.h"

static ds_tokenizer *g_tok;

static void die(const char *what) {
    fprintf(stderr, "fuzz_tokenizer: %s\n", what);
    abort();
}

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc;
    (void)argv;
    char path[4096];
    const char *env = getenv("DS_FUZZ_TOKENIZER");
    if (env && *env) {
        snprintf(path, sizeof path, "%s", env);
    } else {
        snprintf(path, sizeof path, "%s", __FILE__);
        char *slash = strrchr(path, '/');
        if (slash) *slash = 0; /* .../fuzz */
        slash = strrchr(path, '/');
        if (slash)
            *slash = 0; /* repo root */
        else
            snprintf(path, sizeof path, ".");
        strncat(path, "/tests/data/tokenizer/tiny/tokenizer.json", sizeof path - strlen(path) - 1);
    }
    ds_error err = {0};
    if (ds_tokenizer_load(path, &g_tok, &err) != DS_OK) {
        fprintf(stderr, "fuzz_tokenizer: cannot load %s: %s\n", path, err.msg);
        abort();
    }
    return 0;
}

static int utf8_ok(const char *s, size_t n) {
    /* Minimal independent validator (Unicode Table 3-7). */
    const unsigned char *u = (const unsigned char *)s;
    size_t i = 0;
    while (i < n) {
        unsigned c = u[i];
        size_t need = c < 0x80                   ? 1
                      : (c >= 0xC2 && c <= 0xDF) ? 2
                      : (c >= 0xE0 && c <= 0xEF) ? 3
                      : (c >= 0xF0 && c <= 0xF4) ? 4
                                                 : 0;
        if (!need || i + need > n) return 0;
        unsigned lo = 0x80, hi = 0xBF;
        if (c == 0xE0) lo = 0xA0;
        if (c == 0xED) hi = 0x9F;
        if (c == 0xF0) lo = 0x90;
        if (c == 0xF4) hi = 0x8F;
        for (size_t k = 1; k < need; k++) {
            unsigned b = u[i + k];
            if (b < (k == 1 ? lo : 0x80) || b > (k == 1 ? hi : 0xBF)) return 0;
        }
        i += need;
    }
    return 1;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size == 0) return 0;
    uint8_t mode = data[0];
    const char *text = (const char *)data + 1;
    size_t len = size - 1;
    ds_error err = {0};
    if (mode & 0x80) {
        ds_tokenizer *t = NULL;
        ds_status st = ds_tokenizer_load_json(text, len, "fuzz.json", &t, &err);
        if (st == DS_OK) {
            int32_t *ids = NULL;
            size_t n = 0;
            ds_error e2 = {0};
            if (ds_tokenizer_encode(t, "Hello, world! 123 <|x|>", 23, true, &ids, &n, &e2) ==
                DS_OK) {
                char *dec = NULL;
                if (ds_tokenizer_decode(t, ids, n, false, &dec, NULL, &e2) == DS_OK) free(dec);
                free(ids);
            }
            ds_tokenizer_free(t);
        } else if (t != NULL || err.msg[0] == 0) {
            die("failed load without a message, or with a tokenizer");
        }
        return 0;
    }
    bool parse_special = mode & 1, skip_special = mode & 2;
    int32_t *ids = NULL;
    size_t n = 0;
    if (ds_tokenizer_encode(g_tok, text, len, parse_special, &ids, &n, &err) != DS_OK) die(err.msg);
    for (size_t i = 0; i < n; i++)
        if (ids[i] < 0 || (size_t)ids[i] >= ds_tokenizer_vocab_size(g_tok)) die("id out of range");
    char *whole = NULL;
    size_t whole_len = 0;
    if (ds_tokenizer_decode(g_tok, ids, n, skip_special, &whole, &whole_len, &err) != DS_OK)
        die(err.msg);
    if (!utf8_ok(whole, whole_len)) die("decode produced invalid UTF-8");

    ds_detok d;
    ds_detok_init(&d, g_tok, skip_special);
    size_t off = 0;
    for (size_t i = 0; i <= n; i++) {
        const char *chunk;
        size_t cl;
        ds_status st = i < n ? ds_detok_push(&d, ids[i], &chunk, &cl, &err)
                             : ds_detok_flush(&d, &chunk, &cl, &err);
        if (st != DS_OK) die(err.msg);
        if (!utf8_ok(chunk, cl)) die("incremental chunk is not valid UTF-8");
        if (off + cl > whole_len || memcmp(whole + off, chunk, cl) != 0)
            die("incremental decode differs");
        off += cl;
    }
    if (off != whole_len) die("incremental decode is shorter");
    ds_detok_free(&d);

    /* Re-encoding the decoded text must work (it is valid UTF-8 by now). */
    int32_t *again = NULL;
    size_t n2 = 0;
    if (ds_tokenizer_encode(g_tok, whole, whole_len, parse_special, &again, &n2, &err) != DS_OK)
        die(err.msg);
    free(again);
    free(whole);
    free(ids);
    return 0;
}
