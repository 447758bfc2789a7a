/* test_json_schema.c — structured outputs (sampling/json_schema.h): what the compiler refuses
 * (each message names the keyword or rule), documents the automaton accepts and the exact byte
 * where invalid ones fail, and the token mask on a small vocabulary: random walks that end by
 * EOS spell documents that an independent validator (below, over cJSON) finds valid for the
 * schema, and the mask agrees with feeding each token on a copy of the state. */
#include "testlib.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "sampling/json_schema.h"

static ds_json_schema *compile_text(const char *schema, char *err, size_t n) {
    cJSON *j = cJSON_Parse(schema);
    if (!j) fail_msg("test schema is not JSON: %s", schema);
    ds_json_schema *s = ds_json_schema_compile(j, err, n);
    cJSON_Delete(j);
    return s;
}

/* ---- the compiler's refusals ------------------------------------------------------------------ */

static const struct {
    const char *schema, *why;
} REFUSED[] = {
    {"{\"type\": \"string\"}", "root schema must be an object"},
    {"[1]", "must be a JSON object"},
    {"{\"type\": \"object\", \"properties\": {\"a\": {\"type\": \"string\", \"pattern\": \"x\"}}}",
     "keyword 'pattern' is not supported (at #/properties/a)"},
    {"{\"type\": \"object\", \"properties\": {\"a\": {\"type\": \"string\", \"format\": \"date\"}}}",
     "keyword 'format'"},
    {"{\"type\": \"object\", \"properties\": {\"a\": {\"type\": \"integer\", \"minimum\": 0}}}",
     "keyword 'minimum'"},
    {"{\"type\": \"object\", \"properties\": {\"a\": {\"anyOf\": [{\"type\": \"string\"}, "
     "{\"enum\": [\"x\"]}]}}}",
     "can start alike"},
    {"{\"type\": \"object\", \"properties\": {\"a\": {\"type\": [\"number\", \"integer\"]}}}",
     "can start alike"},
    {"{\"type\": \"object\", \"properties\": {\"a\": {}}}", "without \"type\""},
    {"{\"type\": \"object\", \"required\": [\"b\"], \"properties\": {\"a\": {\"type\": \"string\"}}}",
     "names 'b', which is not in"},
    {"{\"$ref\": \"#/$defs/missing\"}", "names no definition"},
    {"{\"$ref\": \"http://example.com/s.json\"}", "is not supported"},
    {"{\"type\": \"object\", \"properties\": {\"a\": {\"type\": \"array\"}}}", "needs \"items\""},
    {"{\"type\": \"object\", \"properties\": {\"a\": {\"type\": \"objekt\"}}}", "not a JSON Schema type"},
    {"{\"$defs\": {\"a\": {\"$ref\": \"#/$defs/b\"}, \"b\": {\"$ref\": \"#/$defs/a\"}}, \"type\": "
     "\"object\", \"properties\": {\"x\": {\"$ref\": \"#/$defs/a\"}}}",
     "no value can match"},
    {"{\"type\": \"object\", \"additionalProperties\": {\"type\": \"string\"}}", "as a schema"},
    {"{\"type\": \"object\", \"properties\": {\"a\": {\"enum\": []}}}", "non-empty array"},
    {"{\"type\": \"object\", \"properties\": {\"a\": {\"allOf\": [{\"type\": \"string\"}]}}}",
     "keyword 'allOf'"},
    {"{\"type\": \"object\", \"properties\": {\"a\": {\"$ref\": \"#\", \"enum\": [1]}}}", "combining"},
};

/* Proves: every schema outside the subset is refused, with a message naming the keyword or
 * rule (and where); more than 64 properties and nesting past the compiler's bound too. */
static void test_refused(void **state) {
    (void)state;
    char err[512];
    for (size_t i = 0; i < sizeof REFUSED / sizeof REFUSED[0]; i++) {
        ds_json_schema *s = compile_text(REFUSED[i].schema, err, sizeof err);
        if (s) fail_msg("accepted: %s", REFUSED[i].schema);
        if (!strstr(err, REFUSED[i].why)) fail_msg("%s → '%s' (want '%s')", REFUSED[i].schema, err, REFUSED[i].why);
    }
    char big[8192];
    int o = snprintf(big, sizeof big, "{\"type\": \"object\", \"properties\": {");
    for (int i = 0; i < 65; i++) o += snprintf(big + o, sizeof big - (size_t)o, "%s\"p%d\": {\"type\": \"null\"}", i ? ", " : "", i);
    snprintf(big + o, sizeof big - (size_t)o, "}}");
    assert_null(compile_text(big, err, sizeof err));
    assert_non_null(strstr(err, "more than 64 properties"));
    o = 0;
    for (int i = 0; i < 70; i++) o += snprintf(big + o, sizeof big - (size_t)o, "{\"type\": \"object\", \"properties\": {\"a\": ");
    o += snprintf(big + o, sizeof big - (size_t)o, "{\"type\": \"null\"}");
    for (int i = 0; i < 70; i++) o += snprintf(big + o, sizeof big - (size_t)o, "}}");
    assert_null(compile_text(big, err, sizeof err));
    assert_non_null(strstr(err, "nests deeper"));
}

/* ---- the automaton on documents ---------------------------------------------------------------- */

static const char *PERSON =
    "{\"type\": \"object\", \"title\": \"Person\", \"properties\": {"
    "\"name\": {\"type\": \"string\", \"description\": \"the name\"},"
    "\"age\": {\"type\": \"integer\"},"
    "\"tags\": {\"type\": \"array\", \"items\": {\"type\": \"string\"}},"
    "\"kind\": {\"enum\": [\"a\", \"b\", 1, null]},"
    "\"opt\": {\"type\": [\"number\", \"null\"]},"
    "\"meta\": {\"type\": \"object\"},"
    "\"ok\": {\"type\": \"boolean\"}},"
    "\"required\": [\"name\", \"age\", \"kind\"], \"additionalProperties\": false}";

static const char *TREE =
    "{\"$defs\": {\"node\": {\"type\": \"object\", \"properties\": {\"v\": {\"type\": \"integer\"}, "
    "\"kids\": {\"type\": \"array\", \"items\": {\"$ref\": \"#/$defs/node\"}}}, \"required\": [\"v\", "
    "\"kids\"]}}, \"$ref\": \"#/$defs/node\"}";

static const char *MISC =
    "{\"type\": \"object\", \"properties\": {"
    "\"c\": {\"const\": {\"x\": [1, 2]}},"
    "\"n\": {\"enum\": [1, 10, 100]},"
    "\"e\": {\"type\": \"object\", \"additionalProperties\": false},"
    "\"u\": {\"anyOf\": [{\"type\": \"string\"}, {\"type\": \"array\", \"items\": {\"type\": \"number\"}}, "
    "{\"type\": \"null\"}]}},"
    "\"required\": [\"c\", \"n\", \"e\", \"u\"]}";

/* Bytes of doc accepted before the first failure (strlen(doc) when all are); *done after. */
static size_t accepted(const ds_json_schema *s, const char *doc, bool *done) {
    ds_js_state st;
    ds_js_init(&st, s);
    size_t i = 0;
    for (; doc[i]; i++)
        if (!ds_js_feed(&st, s, (uint8_t)doc[i])) break;
    *done = ds_js_done(&st);
    return i;
}

static const struct {
    const char **schema;
    const char *doc;
    long fail_at; /* -1: valid (accepted to the end and done) */
} DOCS[] = {
    {&PERSON, "{\"name\":\"x\",\"age\":3,\"kind\":\"a\"}", -1},
    {&PERSON, "{\"name\": \"J\\u00e9 \\\"q\\\"\", \"age\": -12, \"tags\": [], \"kind\": 1, \"opt\": null, "
              "\"meta\": {\"z\": [1, {}]}, \"ok\": false}", -1},
    {&PERSON, "{\n  \"name\": \"x\",\n  \"age\": 0,\n  \"tags\": [\"p\", \"q\"],\n  \"kind\": null,\n  "
              "\"opt\": -1.5e3\n}", -1},
    {&PERSON, " {\"age\":3}", 3},                                /* name comes first */
    {&PERSON, "{\"name\":\"x\",\"age\":3.5}", 19},              /* an integer */
    {&PERSON, "{\"name\":\"x\",\"age\":03}", 19},               /* no leading zero */
    {&PERSON, "{\"name\":\"x\",\"age\":3}", 19},                /* kind is required */
    {&PERSON, "{\"name\":\"x\",\"age\":3,\"kind\":\"c\"}", 28},
    {&PERSON, "{\"name\":\"x\",\"age\":3,\"kind\":2}", 27},
    {&PERSON, "{\"name\":\"x\",\"age\":3,\"kind\":\"a\",\"extra\":1}", 32},
    {&PERSON, "{\"name\":\"x\",\"age\":3,\"kind\":\"a\",\"tags\":[]}", 32}, /* order: tags before kind */
    {&PERSON, "{\"name\":1}", 8},
    {&PERSON, "{\"name\":\"x\",\"age\":3,\"kind\":\"a\"} ", 31},    /* nothing after the object */
    {&PERSON, "{\"name\":\"x\"  ,", 12},                        /* one space between tokens */
    {&PERSON, "{\"name\":\"a\tb\"}", 10},                       /* control byte in a string */
    {&TREE, "{\"v\":1,\"kids\":[{\"v\":2,\"kids\":[]},{\"v\":3,\"kids\":[{\"v\":4,\"kids\":[]}]}]}", -1},
    {&TREE, "{\"v\":1,\"kids\":[{\"v\":2}]}", 21},
    {&MISC, "{\"c\":{\"x\":[1,2]},\"n\":10,\"e\":{},\"u\":\"s\"}", -1},
    {&MISC, "{\"c\":{\"x\":[1,2]},\"n\":1,\"e\": { },\"u\":[1.5, -2]}", -1},
    {&MISC, "{\"c\":{\"x\":[1,2]},\"n\":100,\"e\":{},\"u\":null}", -1},
    {&MISC, "{\"c\":{\"x\":[1, 2]}", 13},                       /* const: compact spelling */
    {&MISC, "{\"c\":{\"x\":[1,2]},\"n\":1000", 24},
    {&MISC, "{\"c\":{\"x\":[1,2]},\"n\":1,\"e\":{\"a\"", 28},
    {&MISC, "{\"c\":{\"x\":[1,2]},\"n\":1,\"e\":{},\"u\":true", 34},
};

/* Proves: valid documents are accepted to the end and leave the automaton done (and cJSON
 * parses them); invalid ones fail at exactly the byte where they stop being a prefix of a
 * valid document; a refused byte leaves the state unchanged. */
static void test_documents(void **state) {
    (void)state;
    char err[512];
    for (size_t i = 0; i < sizeof DOCS / sizeof DOCS[0]; i++) {
        ds_json_schema *s = compile_text(*DOCS[i].schema, err, sizeof err);
        if (!s) fail_msg("schema refused: %s", err);
        bool done;
        const size_t got = accepted(s, DOCS[i].doc, &done);
        const size_t n = strlen(DOCS[i].doc);
        if (DOCS[i].fail_at < 0) {
            if (got != n || !done) fail_msg("valid document %zu refused at byte %zu: %s", i, got, DOCS[i].doc);
            cJSON *o = cJSON_Parse(DOCS[i].doc);
            assert_true(cJSON_IsObject(o));
            cJSON_Delete(o);
        } else if ((long)got != DOCS[i].fail_at) {
            fail_msg("document %zu failed at byte %zu, want %ld: %s", i, got, DOCS[i].fail_at, DOCS[i].doc);
        }
        ds_json_schema_unref(s);
    }
    /* a refused byte changes nothing */
    ds_json_schema *s = compile_text(PERSON, err, sizeof err);
    ds_js_state st, before;
    ds_js_init(&st, s);
    assert_true(ds_js_feed_bytes(&st, s, (const uint8_t *)"{\"name\"", 7));
    before = st;
    assert_false(ds_js_feed(&st, s, ','));
    assert_memory_equal(&st, &before, sizeof st);
    assert_false(ds_js_feed_bytes(&st, s, (const uint8_t *)": 1", 3));
    assert_memory_equal(&st, &before, sizeof st);
    ds_json_schema_unref(s);
}

/* Proves: a recursive schema stops at DS_JS_MAX_DEPTH open values instead of overflowing. */
static void test_depth_bound(void **state) {
    (void)state;
    char err[512];
    ds_json_schema *s = compile_text(TREE, err, sizeof err);
    ds_js_state st;
    ds_js_init(&st, s);
    int levels = 0;
    for (; levels < 100; levels++)
        if (!ds_js_feed_bytes(&st, s, (const uint8_t *)"{\"v\":1,\"kids\":[", 15)) break;
    assert_true(levels > 5 && levels < 100);
    assert_true(st.depth <= DS_JS_MAX_DEPTH);
    ds_json_schema_unref(s);
}

/* ---- an independent validator of the subset (the reference for the walks) ---------------------- */

static const cJSON *resolve(const cJSON *doc, const cJSON *sch) {
    for (int hops = 0; hops < 16; hops++) {
        const cJSON *ref = cJSON_GetObjectItemCaseSensitive(sch, "$ref");
        if (!cJSON_IsString(ref)) return sch;
        const char *r = ref->valuestring;
        if (!strcmp(r, "#")) sch = doc;
        else sch = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(doc, "$defs"), r + 8);
    }
    return sch;
}

static bool valid(const cJSON *doc, const cJSON *sch, const cJSON *v);

static bool valid_type(const cJSON *doc, const cJSON *sch, const char *t, const cJSON *v) {
    if (!strcmp(t, "string")) return cJSON_IsString(v);
    if (!strcmp(t, "number")) return cJSON_IsNumber(v);
    if (!strcmp(t, "integer")) return cJSON_IsNumber(v) && v->valuedouble == floor(v->valuedouble);
    if (!strcmp(t, "boolean")) return cJSON_IsBool(v);
    if (!strcmp(t, "null")) return cJSON_IsNull(v);
    if (!strcmp(t, "array")) {
        if (!cJSON_IsArray(v)) return false;
        const cJSON *items = cJSON_GetObjectItemCaseSensitive(sch, "items");
        for (const cJSON *e = v->child; e; e = e->next)
            if (!valid(doc, items, e)) return false;
        return true;
    }
    if (!strcmp(t, "object")) {
        if (!cJSON_IsObject(v)) return false;
        const cJSON *props = cJSON_GetObjectItemCaseSensitive(sch, "properties");
        const cJSON *addl = cJSON_GetObjectItemCaseSensitive(sch, "additionalProperties");
        for (const cJSON *r = cJSON_GetObjectItemCaseSensitive(sch, "required") ? cJSON_GetObjectItemCaseSensitive(sch, "required")->child : NULL; r; r = r->next)
            if (!cJSON_GetObjectItemCaseSensitive(v, r->valuestring)) return false;
        for (const cJSON *m = v->child; m; m = m->next) {
            const cJSON *ps = props ? cJSON_GetObjectItemCaseSensitive(props, m->string) : NULL;
            if (ps) {
                if (!valid(doc, ps, m)) return false;
            } else if (cJSON_IsFalse(addl)) {
                return false;
            }
        }
        return true;
    }
    return false;
}

static bool valid(const cJSON *doc, const cJSON *sch, const cJSON *v) {
    sch = resolve(doc, sch);
    const cJSON *en = cJSON_GetObjectItemCaseSensitive(sch, "enum");
    const cJSON *cn = cJSON_GetObjectItemCaseSensitive(sch, "const");
    if (cn) return cJSON_Compare(cn, v, true);
    if (en) {
        for (const cJSON *e = en->child; e; e = e->next)
            if (cJSON_Compare(e, v, true)) return true;
        return false;
    }
    const cJSON *alts = cJSON_GetObjectItemCaseSensitive(sch, "anyOf");
    if (!alts) alts = cJSON_GetObjectItemCaseSensitive(sch, "oneOf");
    if (alts) {
        int ok = 0;
        for (const cJSON *a = alts->child; a; a = a->next) ok += valid(doc, a, v);
        return ok == 1;
    }
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(sch, "type");
    if (cJSON_IsArray(type)) {
        for (const cJSON *t = type->child; t; t = t->next)
            if (valid_type(doc, sch, t->valuestring, v)) return true;
        return false;
    }
    return valid_type(doc, sch, type->valuestring, v);
}

/* ---- the token mask ------------------------------------------------------------------------------ */

/* id 0 is EOS, id 1 a special token (no bytes), then every printable ASCII byte and '\n', then
 * fragments (so every valid document can be spelled, and multi-byte tokens cross boundaries). */
static const char *const FRAGMENTS[] = {
    "\"name\"", "\":", "{\"", "\"}", "true", "null", "12", "\", \"", "[{", "}]", ", ", "\n  ",
    "\\u00e9", "\"kind\": ", "\"age\":", "10", "-1.5", "e+3", "{\"x\":[1,2]}", "\"v\":", "\"kids\":[",
    "[]", "{}", "false", "\"a\"", "\"s\"", "ll", "tr", "\xc3\xa9", "\"}\n", "\"tags\": [\"",
};
enum { N_ASCII = 0x7f - 0x20 + 1, N_FRAG = (int)(sizeof FRAGMENTS / sizeof FRAGMENTS[0]),
       N_VOCAB = 2 + N_ASCII + 1 + N_FRAG };

static char g_ascii[N_ASCII + 1][2];

static ds_json_vocab make_vocab(void) {
    ds_json_vocab v = {.n = N_VOCAB};
    v.bytes = calloc(N_VOCAB, sizeof *v.bytes);
    v.len = calloc(N_VOCAB, sizeof *v.len);
    for (int i = 0; i < N_ASCII; i++) {
        g_ascii[i][0] = (char)(0x20 + i);
        v.bytes[2 + i] = (const uint8_t *)g_ascii[i];
        v.len[2 + i] = 1;
    }
    g_ascii[N_ASCII][0] = '\n';
    v.bytes[2 + N_ASCII] = (const uint8_t *)g_ascii[N_ASCII];
    v.len[2 + N_ASCII] = 1;
    for (int i = 0; i < N_FRAG; i++) {
        v.bytes[3 + N_ASCII + i] = (const uint8_t *)FRAGMENTS[i];
        v.len[3 + N_ASCII + i] = (uint32_t)strlen(FRAGMENTS[i]);
    }
    assert_true(ds_json_vocab_index(&v));
    return v;
}

/* Proves, over random walks for each schema (random logits with closing bytes favoured, the best
 * allowed token each step): the mask never leaves a walk without a token below the depth
 * bound; a token is allowed exactly when its bytes feed (EOS exactly when the object is closed,
 * and then alone; the special id and ids past the vocabulary never); every walk that chose EOS
 * spelled a document that cJSON parses and the independent validator accepts. */
static void test_mask_walks(void **state) {
    (void)state;
    const char *schemas[] = {PERSON, TREE, MISC};
    ds_json_vocab v = make_vocab();
    const int end_ids[1] = {0};
    enum { N_LOGITS = N_VOCAB + 2 };
    float logits[N_LOGITS];
    test_rng g = {0x5c4e};
    char err[512];
    static char text[1 << 14];
    for (size_t k = 0; k < sizeof schemas / sizeof schemas[0]; k++) {
        ds_json_schema *s = compile_text(schemas[k], err, sizeof err);
        cJSON *doc = cJSON_Parse(schemas[k]);
        int n_closed = 0;
        for (int walk = 0; walk < 300; walk++) {
            ds_js_state st;
            ds_js_init(&st, s);
            size_t len = 0;
            bool ended = false;
            for (int step = 0; step < 400 && !ended; step++) {
                for (int i = 0; i < N_LOGITS; i++) {
                    logits[i] = test_rng_uniform(&g);
                    if (i >= 2 && i < N_VOCAB && (memchr(v.bytes[i], '"', v.len[i]) ||
                                                  memchr(v.bytes[i], '}', v.len[i]) ||
                                                  memchr(v.bytes[i], ']', v.len[i])))
                        logits[i] += 0.6f; /* close strings and containers now and then */
                }
                ds_js_mask(&st, s, &v, end_ids, 1, logits, N_LOGITS);
                int best = -1;
                for (int i = 0; i < N_LOGITS; i++) {
                    const bool allowed = logits[i] != -INFINITY;
                    bool feeds = false;
                    if (i >= 2 && i < N_VOCAB) {
                        ds_js_state t = st;
                        feeds = ds_js_feed_token(&t, s, &v, i);
                    }
                    if (allowed != (i == 0 ? ds_js_done(&st) : feeds))
                        fail_msg("schema %zu walk %d step %d: id %d allowed %d, feeds %d", k, walk, step, i, allowed, feeds);
                    if (allowed && (best < 0 || logits[i] > logits[best])) best = i;
                }
                if (best < 0) { /* only past the depth bound */
                    assert_true(st.depth >= DS_JS_MAX_DEPTH - 1);
                    break;
                }
                if (best == 0) {
                    ended = true;
                    break;
                }
                assert_true(ds_js_feed_token(&st, s, &v, best));
                assert_true(len + v.len[best] < sizeof text);
                memcpy(text + len, v.bytes[best], v.len[best]);
                len += v.len[best];
            }
            text[len] = 0;
            if (!ended) continue;
            n_closed++;
            cJSON *o = cJSON_Parse(text);
            if (!cJSON_IsObject(o) || !valid(doc, doc, o))
                fail_msg("schema %zu walk %d ended with EOS but spelled: %s", k, walk, text);
            cJSON_Delete(o);
        }
        printf("  schema %zu: %d of 300 walks closed their object and ended\n", k, n_closed);
        assert_true(n_closed > 30);
        cJSON_Delete(doc);
        ds_json_schema_unref(s);
    }
    ds_json_vocab_free(&v);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_refused),
        cmocka_unit_test(test_documents),
        cmocka_unit_test(test_depth_bound),
        cmocka_unit_test(test_mask_walks),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
