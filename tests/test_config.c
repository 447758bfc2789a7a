/* test_config.c — config.json parsing: both layouts, layer patterns, RoPE, eos ids, and every
 * way a config can be wrong. Expected values come from the published Qwen3.5 shapes
 * (docs/qwen35.md), not from the parser. */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "testlib.h"

#include "model/config.h"
#include "model/model_info.h"

/* Qwen3.5-35B-A3B as published (nested multimodal form, trimmed vision_config). */
static const char *k_moe_nested =
    "{\"architectures\":[\"Qwen3_5MoeForConditionalGeneration\"],"
    "\"model_type\":\"qwen3_5_moe\",\"image_token_id\":248056,\"tie_word_embeddings\":false,"
    "\"vision_config\":{\"depth\":27,\"hidden_size\":1152,\"model_type\":\"qwen3_5_moe\"},"
    "\"text_config\":{\"model_type\":\"qwen3_5_moe_text\",\"attention_bias\":false,"
    "\"attn_output_gate\":true,\"dtype\":\"bfloat16\",\"eos_token_id\":248044,"
    "\"full_attention_interval\":4,\"head_dim\":256,\"hidden_act\":\"silu\",\"hidden_size\":2048,"
    "\"linear_conv_kernel_dim\":4,\"linear_key_head_dim\":128,\"linear_num_key_heads\":16,"
    "\"linear_num_value_heads\":32,\"linear_value_head_dim\":128,"
    "\"max_position_embeddings\":262144,\"moe_intermediate_size\":512,"
    "\"mtp_num_hidden_layers\":1,\"num_attention_heads\":16,\"num_experts\":256,"
    "\"num_experts_per_tok\":8,\"num_hidden_layers\":40,\"num_key_value_heads\":2,"
    "\"rms_norm_eps\":1e-06,\"shared_expert_intermediate_size\":512,\"vocab_size\":248320,"
    "\"rope_parameters\":{\"mrope_interleaved\":true,\"mrope_section\":[11,11,10],"
    "\"rope_type\":\"default\",\"rope_theta\":10000000,\"partial_rotary_factor\":0.25}}}";

/* Qwen3.5-0.8B-like dense text-only flat config with legacy RoPE fields and no layer_types. */
static const char *k_dense_flat =
    "{\"model_type\":\"qwen3_5_text\",\"hidden_size\":1024,\"num_hidden_layers\":24,"
    "\"vocab_size\":248320,\"rms_norm_eps\":1e-6,\"num_attention_heads\":8,"
    "\"num_key_value_heads\":2,\"head_dim\":256,\"linear_num_key_heads\":16,"
    "\"linear_num_value_heads\":16,\"linear_key_head_dim\":128,\"linear_value_head_dim\":128,"
    "\"linear_conv_kernel_dim\":4,\"intermediate_size\":3584,\"tie_word_embeddings\":true,"
    "\"rope_theta\":10000000,\"partial_rotary_factor\":0.25,\"eos_token_id\":[248046,248044]}";

static ds_status parse(const char *json, ds_config *cfg, ds_error *err) {
    *err = (ds_error){0};
    return ds_config_parse(json, "cfg.json", cfg, err);
}

/* Applies edit(root) to a copy of base and parses the result. */
static ds_status parse_edited(const char *base, void (*edit)(cJSON *, const void *),
                              const void *arg, ds_config *cfg, ds_error *err) {
    cJSON *root = cJSON_Parse(base);
    assert_non_null(root);
    edit(root, arg);
    char *s = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    ds_status st = parse(s, cfg, err);
    free(s);
    return st;
}

static cJSON *text_of(cJSON *root) {
    cJSON *t = cJSON_GetObjectItemCaseSensitive(root, "text_config");
    return t ? t : root;
}

typedef struct kv_edit {
    const char *key;
    const char *json_value; /* NULL = delete the key */
} kv_edit;

static void edit_text_field(cJSON *root, const void *arg) {
    const kv_edit *e = arg;
    cJSON *t = text_of(root);
    cJSON_DeleteItemFromObjectCaseSensitive(t, e->key);
    if (e->json_value) cJSON_AddItemToObject(t, e->key, cJSON_Parse(e->json_value));
}

static void edit_root_field(cJSON *root, const void *arg) {
    const kv_edit *e = arg;
    cJSON_DeleteItemFromObjectCaseSensitive(root, e->key);
    if (e->json_value) cJSON_AddItemToObject(root, e->key, cJSON_Parse(e->json_value));
}

static void expect_msg(const ds_error *err, const char *a, const char *b) {
    if ((a && !strstr(err->msg, a)) || (b && !strstr(err->msg, b))) {
        fprintf(stderr, "message '%s' lacks '%s' / '%s'\n", err->msg, a ? a : "", b ? b : "");
        fail();
    }
}

/* ---- good configs --------------------------------------------------------------------------- */

static void test_nested_moe(void **state) {
    (void)state;
    ds_config c;
    ds_error err;
    assert_int_equal(parse(k_moe_nested, &c, &err), DS_OK);
    assert_string_equal(c.model_type, "qwen3_5_moe");
    assert_true(c.is_moe);
    assert_int_equal(c.hidden, 2048);
    assert_int_equal(c.n_layers, 40);
    assert_int_equal(c.vocab, 248320);
    assert_true(c.rms_eps == 1e-6);
    assert_int_equal(c.max_position, 262144);
    assert_false(c.tie_embeddings);
    for (int i = 0; i < 40; i++) /* attention at 3, 7, ..., 39 */
        assert_int_equal(c.layer_types[i],
                         (i % 4 == 3) ? DS_LAYER_FULL_ATTN : DS_LAYER_LINEAR_ATTN);
    assert_int_equal(c.n_heads, 16);
    assert_int_equal(c.n_kv_heads, 2);
    assert_int_equal(c.head_dim, 256);
    assert_int_equal(c.rot_dim, 64);
    assert_true(c.rope_theta == 1e7);
    assert_true(c.attn_output_gate);
    assert_int_equal(c.gdn_k_heads, 16);
    assert_int_equal(c.gdn_v_heads, 32);
    assert_int_equal(c.gdn_k_dim, 128);
    assert_int_equal(c.gdn_v_dim, 128);
    assert_int_equal(c.gdn_conv_kernel, 4);
    assert_int_equal(ds_config_gdn_conv_dim(&c), 8192);
    assert_int_equal(c.n_experts, 256);
    assert_int_equal(c.top_k, 8);
    assert_int_equal(c.moe_inter, 512);
    assert_int_equal(c.shared_inter, 512);
    assert_true(c.norm_topk_prob);
    assert_int_equal(c.mlp_inter, 0);
    assert_int_equal(c.n_mtp_layers, 1);
    assert_int_equal(c.n_eos, 1);
    assert_int_equal(c.eos_ids[0], 248044);
}

static void test_flat_dense(void **state) {
    (void)state;
    ds_config c;
    ds_error err;
    assert_int_equal(parse(k_dense_flat, &c, &err), DS_OK);
    assert_string_equal(c.model_type, "qwen3_5_text");
    assert_false(c.is_moe);
    assert_int_equal(c.mlp_inter, 3584);
    assert_int_equal(c.n_experts, 0);
    assert_true(c.tie_embeddings);
    assert_true(c.rope_theta == 1e7);
    assert_int_equal(c.rot_dim, 64);
    assert_int_equal(c.max_position, 32768); /* transformers' default when absent */
    for (int i = 0; i < 24; i++)
        assert_int_equal(c.layer_types[i],
                         (i + 1) % 4 == 0 ? DS_LAYER_FULL_ATTN : DS_LAYER_LINEAR_ATTN);
    assert_int_equal(c.n_eos, 2);
    assert_int_equal(c.eos_ids[0], 248046);
    assert_int_equal(c.eos_ids[1], 248044);
    assert_int_equal(c.n_mtp_layers, 0);
}

/* The nested MoE text_config, lifted out as a flat qwen3_5_moe_text config. */
static char *flat_moe_json(void) {
    cJSON *root = cJSON_Parse(k_moe_nested);
    cJSON *t = cJSON_DetachItemFromObjectCaseSensitive(root, "text_config");
    cJSON_Delete(root);
    char *s = cJSON_PrintUnformatted(t);
    cJSON_Delete(t);
    return s;
}

static void test_flat_moe_and_defaults(void **state) {
    (void)state;
    char *flat = flat_moe_json();
    ds_config c;
    ds_error err;
    assert_int_equal(parse(flat, &c, &err), DS_OK);
    assert_string_equal(c.model_type, "qwen3_5_moe_text");
    assert_true(c.is_moe);
    assert_int_equal(c.hidden, 2048);
    assert_int_equal(c.rot_dim, 64);

    /* Optional fields absent → documented defaults. */
    static const char *optional[] = {"rope_parameters",         "attn_output_gate",
                                     "norm_topk_prob",          "shared_expert_intermediate_size",
                                     "mtp_num_hidden_layers",   "eos_token_id",
                                     "full_attention_interval", "max_position_embeddings",
                                     "tie_word_embeddings"};
    cJSON *root = cJSON_Parse(flat);
    for (size_t i = 0; i < sizeof optional / sizeof optional[0]; i++)
        cJSON_DeleteItemFromObjectCaseSensitive(root, optional[i]);
    char *s = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    assert_int_equal(parse(s, &c, &err), DS_OK);
    assert_true(c.rope_theta == 10000.0);
    assert_int_equal(c.rot_dim, 64); /* 256 · 0.25 */
    assert_true(c.attn_output_gate);
    assert_true(c.norm_topk_prob);
    assert_int_equal(c.shared_inter, 0);
    assert_int_equal(c.n_mtp_layers, 0);
    assert_int_equal(c.n_eos, 0);
    assert_int_equal(c.max_position, 32768);
    assert_false(c.tie_embeddings);
    free(s);
    free(flat);
}

static void test_tie_precedence(void **state) {
    (void)state;
    ds_config c;
    ds_error err;
    kv_edit top_true = {"tie_word_embeddings", "true"};
    /* only the top level says true → true */
    assert_int_equal(parse_edited(k_moe_nested, edit_root_field, &top_true, &c, &err), DS_OK);
    assert_true(c.tie_embeddings);
    /* text_config says false, top level true → the text config wins */
    cJSON *root = cJSON_Parse(k_moe_nested);
    cJSON_DeleteItemFromObjectCaseSensitive(root, "tie_word_embeddings");
    cJSON_AddTrueToObject(root, "tie_word_embeddings");
    cJSON_AddFalseToObject(text_of(root), "tie_word_embeddings");
    char *s = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    assert_int_equal(parse(s, &c, &err), DS_OK);
    assert_false(c.tie_embeddings);
    free(s);
}

static void set_layer_types(cJSON *root, const void *arg) {
    const char *const *types = arg;
    cJSON *t = text_of(root);
    cJSON_DeleteItemFromObjectCaseSensitive(t, "layer_types");
    cJSON *arr = cJSON_AddArrayToObject(t, "layer_types");
    for (int i = 0; types[i]; i++) cJSON_AddItemToArray(arr, cJSON_CreateString(types[i]));
}

static void test_layer_types(void **state) {
    (void)state;
    ds_config c;
    ds_error err;
    /* interval 3 over 24 layers: full at 2, 5, 8, ... */
    kv_edit iv = {"full_attention_interval", "3"};
    assert_int_equal(parse_edited(k_dense_flat, edit_text_field, &iv, &c, &err), DS_OK);
    for (int i = 0; i < 24; i++)
        assert_int_equal(c.layer_types[i], i % 3 == 2 ? DS_LAYER_FULL_ATTN : DS_LAYER_LINEAR_ATTN);

    /* explicit layer_types win over the interval */
    const char *types[25];
    for (int i = 0; i < 24; i++)
        types[i] = (i == 0 || i == 5) ? "full_attention" : "linear_attention";
    types[24] = NULL;
    assert_int_equal(parse_edited(k_dense_flat, set_layer_types, types, &c, &err), DS_OK);
    for (int i = 0; i < 24; i++)
        assert_int_equal(c.layer_types[i],
                         (i == 0 || i == 5) ? DS_LAYER_FULL_ATTN : DS_LAYER_LINEAR_ATTN);

    /* legacy names */
    types[0] = "attention";
    types[1] = "mamba";
    assert_int_equal(parse_edited(k_dense_flat, set_layer_types, types, &c, &err), DS_OK);
    assert_int_equal(c.layer_types[0], DS_LAYER_FULL_ATTN);
    assert_int_equal(c.layer_types[1], DS_LAYER_LINEAR_ATTN);

    /* wrong length */
    types[23] = NULL;
    assert_int_equal(parse_edited(k_dense_flat, set_layer_types, types, &c, &err), DS_ERR_FORMAT);
    expect_msg(&err, "layer_types", "cfg.json");
    /* bad entry */
    types[23] = "linear_attention";
    types[7] = "sliding_attention";
    assert_int_equal(parse_edited(k_dense_flat, set_layer_types, types, &c, &err), DS_ERR_FORMAT);
    expect_msg(&err, "layer_types[7]", "sliding_attention");
    kv_edit not_array = {"layer_types", "\"full_attention\""};
    assert_int_equal(parse_edited(k_dense_flat, edit_text_field, &not_array, &c, &err),
                     DS_ERR_FORMAT);
    expect_msg(&err, "layer_types", NULL);
    kv_edit iv0 = {"full_attention_interval", "0"};
    assert_int_equal(parse_edited(k_dense_flat, edit_text_field, &iv0, &c, &err), DS_ERR_FORMAT);
    expect_msg(&err, "full_attention_interval", NULL);
}

static void test_rope(void **state) {
    (void)state;
    ds_config c;
    ds_error err;
    /* nested config whose RoPE fields sit at the top level (legacy) */
    cJSON *root = cJSON_Parse(k_moe_nested);
    cJSON_DeleteItemFromObjectCaseSensitive(text_of(root), "rope_parameters");
    cJSON_AddNumberToObject(root, "rope_theta", 5e6);
    cJSON_AddNumberToObject(root, "partial_rotary_factor", 0.5);
    char *s = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    assert_int_equal(parse(s, &c, &err), DS_OK);
    assert_true(c.rope_theta == 5e6);
    assert_int_equal(c.rot_dim, 128);
    free(s);

    kv_edit yarn = {"rope_parameters", "{\"rope_type\":\"yarn\",\"factor\":4,\"rope_theta\":1e6}"};
    assert_int_equal(parse_edited(k_moe_nested, edit_text_field, &yarn, &c, &err),
                     DS_ERR_UNSUPPORTED);
    expect_msg(&err, "yarn", NULL);
    kv_edit full = {"rope_parameters", "{\"rope_theta\":1e6,\"partial_rotary_factor\":1.0}"};
    assert_int_equal(parse_edited(k_moe_nested, edit_text_field, &full, &c, &err), DS_OK);
    assert_int_equal(c.rot_dim, 256);
    kv_edit bad = {"rope_parameters", "{\"rope_theta\":1e6,\"partial_rotary_factor\":1.5}"};
    assert_int_equal(parse_edited(k_moe_nested, edit_text_field, &bad, &c, &err), DS_ERR_FORMAT);
    expect_msg(&err, "partial_rotary_factor", NULL);
    kv_edit neg = {"rope_parameters", "{\"rope_theta\":-1}"};
    assert_int_equal(parse_edited(k_moe_nested, edit_text_field, &neg, &c, &err), DS_ERR_FORMAT);
    expect_msg(&err, "rope_theta", NULL);
    kv_edit str = {"rope_parameters", "{\"rope_theta\":\"1e6\"}"};
    assert_int_equal(parse_edited(k_moe_nested, edit_text_field, &str, &c, &err), DS_ERR_FORMAT);
    expect_msg(&err, "rope_theta", NULL);
    /* head_dim 10 · 0.5 = 5 rotary dims: odd */
    cJSON *r2 = cJSON_Parse(k_dense_flat);
    cJSON_ReplaceItemInObjectCaseSensitive(r2, "head_dim", cJSON_CreateNumber(10));
    cJSON_ReplaceItemInObjectCaseSensitive(r2, "partial_rotary_factor", cJSON_CreateNumber(0.5));
    s = cJSON_PrintUnformatted(r2);
    cJSON_Delete(r2);
    assert_int_equal(parse(s, &c, &err), DS_ERR_FORMAT);
    expect_msg(&err, "rotary", NULL);
    free(s);
}

/* ---- bad configs ---------------------------------------------------------------------------- */

static void test_missing_fields(void **state) {
    (void)state;
    static const char *moe_required[] = {"hidden_size",
                                         "num_hidden_layers",
                                         "vocab_size",
                                         "rms_norm_eps",
                                         "num_attention_heads",
                                         "num_key_value_heads",
                                         "head_dim",
                                         "linear_num_key_heads",
                                         "linear_num_value_heads",
                                         "linear_key_head_dim",
                                         "linear_value_head_dim",
                                         "linear_conv_kernel_dim",
                                         "num_experts",
                                         "num_experts_per_tok",
                                         "moe_intermediate_size"};
    for (size_t i = 0; i < sizeof moe_required / sizeof moe_required[0]; i++) {
        ds_config c;
        ds_error err;
        kv_edit e = {moe_required[i], NULL};
        assert_int_equal(parse_edited(k_moe_nested, edit_text_field, &e, &c, &err), DS_ERR_FORMAT);
        char field[96];
        snprintf(field, sizeof field, "text_config.%s", moe_required[i]);
        expect_msg(&err, field, "cfg.json");
        /* JSON null counts as missing */
        kv_edit n = {moe_required[i], "null"};
        assert_int_equal(parse_edited(k_moe_nested, edit_text_field, &n, &c, &err), DS_ERR_FORMAT);
    }
    ds_config c;
    ds_error err;
    kv_edit e = {"intermediate_size", NULL};
    assert_int_equal(parse_edited(k_dense_flat, edit_text_field, &e, &c, &err), DS_ERR_FORMAT);
    expect_msg(&err, "'intermediate_size'", NULL);
    kv_edit tc = {"text_config", NULL};
    assert_int_equal(parse_edited(k_moe_nested, edit_root_field, &tc, &c, &err), DS_ERR_FORMAT);
    expect_msg(&err, "text_config", NULL);
    kv_edit tcs = {"text_config", "[1]"};
    assert_int_equal(parse_edited(k_moe_nested, edit_root_field, &tcs, &c, &err), DS_ERR_FORMAT);
    kv_edit mt = {"model_type", NULL};
    assert_int_equal(parse_edited(k_moe_nested, edit_root_field, &mt, &c, &err), DS_ERR_FORMAT);
    expect_msg(&err, "model_type", NULL);
}

static void test_wrong_types_and_ranges(void **state) {
    (void)state;
    static const kv_edit bad[] = {
        {"hidden_size", "\"2048\""},
        {"hidden_size", "2048.5"},
        {"hidden_size", "0"},
        {"hidden_size", "-2048"},
        {"hidden_size", "2097152"},
        {"hidden_size", "true"},
        {"num_hidden_layers", "257"},
        {"num_attention_heads", "3"}, /* 3 % 2 kv heads */
        {"num_key_value_heads", "0"},
        {"linear_num_value_heads", "24"}, /* 24 % 16 */
        {"num_experts_per_tok", "257"},
        {"num_experts", "[256]"},
        {"head_dim", "1"},
        {"rms_norm_eps", "0"},
        {"rms_norm_eps", "\"1e-6\""},
        {"tie_word_embeddings", "1"},
        {"attn_output_gate", "\"yes\""},
        {"norm_topk_prob", "0"},
        {"eos_token_id", "\"2\""},
        {"eos_token_id", "[1, \"2\"]"},
        {"eos_token_id", "248320"},
        {"eos_token_id", "-1"},
        {"linear_conv_kernel_dim", "0"},
        {"head_dim", "1048576"},
        {"mtp_num_hidden_layers", "-1"},
        {"shared_expert_intermediate_size", "-5"},
        {"max_position_embeddings", "1.5"},
        {"eos_token_id", "[0,1,2,3,4,5,6,7,8]"},
        {"text_config", "3"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        ds_config c;
        ds_error err;
        ds_status st = parse_edited(
            k_moe_nested, strcmp(bad[i].key, "text_config") ? edit_text_field : edit_root_field,
            &bad[i], &c, &err);
        if (st != DS_ERR_FORMAT) {
            fprintf(stderr, "%s = %s: got %s (%s)\n", bad[i].key, bad[i].json_value,
                    ds_status_name(st), err.msg);
            fail();
        }
        expect_msg(&err, "cfg.json", NULL);
    }
    /* messages name the field */
    ds_config c;
    ds_error err;
    kv_edit e = {"hidden_size", "\"2048\""};
    parse_edited(k_moe_nested, edit_text_field, &e, &c, &err);
    expect_msg(&err, "text_config.hidden_size", "string");
    kv_edit nh = {"num_attention_heads", "3"};
    parse_edited(k_moe_nested, edit_text_field, &nh, &c, &err);
    expect_msg(&err, "num_attention_heads", "num_key_value_heads");
    assert_int_equal(parse("{not json", &c, &err), DS_ERR_FORMAT);
    assert_int_equal(parse("[1,2]", &c, &err), DS_ERR_FORMAT);
    /* text_config.model_type inconsistent with the top level */
    cJSON *root = cJSON_Parse(k_moe_nested);
    cJSON_ReplaceItemInObjectCaseSensitive(text_of(root), "model_type",
                                           cJSON_CreateString("qwen3_5_text"));
    char *s = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    assert_int_equal(parse(s, &c, &err), DS_ERR_FORMAT);
    free(s);
}

static void test_unknown_model_type(void **state) {
    (void)state;
    ds_config c;
    ds_error err;
    kv_edit e = {"model_type", "\"qwen3_next\""};
    assert_int_equal(parse_edited(k_moe_nested, edit_root_field, &e, &c, &err), DS_ERR_UNSUPPORTED);
    expect_msg(&err, "qwen3_next", "cfg.json");
    kv_edit n = {"model_type", "7"};
    assert_int_equal(parse_edited(k_moe_nested, edit_root_field, &n, &c, &err), DS_ERR_FORMAT);
}

/* ---- ds_config_load ------------------------------------------------------------------------- */

static void write_text(const char *path, const char *text) {
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
}

static void test_load_with_generation_config(void **state) {
    (void)state;
    char dir[] = "/tmp/ds_cfg_XXXXXX";
    assert_non_null(mkdtemp(dir));
    char cfg_path[256], gen_path[256];
    snprintf(cfg_path, sizeof cfg_path, "%s/config.json", dir);
    snprintf(gen_path, sizeof gen_path, "%s/generation_config.json", dir);
    ds_config c;
    ds_error err = {0};
    assert_int_equal(ds_config_load(dir, &c, &err), DS_ERR_IO); /* no config.json */
    expect_msg(&err, cfg_path, NULL);

    write_text(cfg_path, k_moe_nested);
    err = (ds_error){0};
    assert_int_equal(ds_config_load(dir, &c, &err), DS_OK); /* no generation_config: fine */
    assert_int_equal(c.n_eos, 1);

    write_text(gen_path, "{\"bos_token_id\":248044,\"eos_token_id\":[248046,248044],"
                         "\"do_sample\":true,\"temperature\":0.6}");
    assert_int_equal(ds_config_load(dir, &c, &err), DS_OK);
    assert_int_equal(c.n_eos, 2); /* union, deduplicated */
    assert_int_equal(c.eos_ids[0], 248044);
    assert_int_equal(c.eos_ids[1], 248046);

    write_text(gen_path, "{\"eos_token_id\": 248046,");
    err = (ds_error){0};
    assert_int_equal(ds_config_load(dir, &c, &err), DS_ERR_FORMAT);
    expect_msg(&err, "generation_config.json", NULL);
    write_text(gen_path, "{\"eos_token_id\": \"x\"}");
    err = (ds_error){0};
    assert_int_equal(ds_config_load(dir, &c, &err), DS_ERR_FORMAT);
    expect_msg(&err, "generation_config.json", "eos_token_id");

    write_text(cfg_path, "{\"model_type\":\"qwen3_5_moe\"}");
    err = (ds_error){0};
    assert_int_equal(ds_config_load(dir, &c, &err), DS_ERR_FORMAT);
    expect_msg(&err, cfg_path, "text_config");
    unlink(cfg_path);
    unlink(gen_path);
    rmdir(dir);
}

/* ---- derived sizes -------------------------------------------------------------------------- */

static void test_model_info_35b(void **state) {
    (void)state;
    ds_config c;
    ds_error err;
    assert_int_equal(parse(k_moe_nested, &c, &err), DS_OK);
    ds_model_info mi;
    ds_model_info_compute(&c, DS_DTYPE_BF16, DS_DTYPE_BF16, &mi);
    assert_int_equal(mi.n_full_layers, 10);
    assert_int_equal(mi.n_linear_layers, 30);
    /* docs/qwen35.md: KV cache 20 KiB per token; GDN state 60 MiB per sequence (fp32) plus
     * ~1.4 MiB of conv state; ~2.95 B active parameters incl. the 0.51 B lm_head; "35B". */
    assert_int_equal(mi.kv_bytes_per_token, 20 * 1024);
    assert_int_equal(mi.gdn_state_bytes, 60u * 1024 * 1024);
    assert_true(mi.gdn_conv_bytes > 1.35 * 1024 * 1024 && mi.gdn_conv_bytes < 1.45 * 1024 * 1024);
    assert_true(mi.params_lm_head == 248320LL * 2048);
    assert_true(mi.params_active > 2.90e9 && mi.params_active < 3.00e9);
    assert_true(mi.params_total > 34.0e9 && mi.params_total < 36.0e9);
    assert_true(mi.params_mtp > 0);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_nested_moe),
        cmocka_unit_test(test_flat_dense),
        cmocka_unit_test(test_flat_moe_and_defaults),
        cmocka_unit_test(test_tie_precedence),
        cmocka_unit_test(test_layer_types),
        cmocka_unit_test(test_rope),
        cmocka_unit_test(test_missing_fields),
        cmocka_unit_test(test_wrong_types_and_ranges),
        cmocka_unit_test(test_unknown_model_type),
        cmocka_unit_test(test_load_with_generation_config),
        cmocka_unit_test(test_model_info_35b),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
