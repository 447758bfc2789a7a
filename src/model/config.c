/* config.c — config.json (+ generation_config.json) → ds_config, validated.
 *
 * Defaults follow transformers 5.x where a field may be absent (Qwen3_5TextConfig /
 * Qwen3_5MoeTextConfig): partial_rotary_factor 0.25, rope_theta 10000 (PreTrainedConfig's
 * default_theta), full_attention_interval 4, max_position_embeddings 32768,
 * tie_word_embeddings false. deltaserve-specific defaults: attn_output_gate true and
 * norm_topk_prob true (transformers has no such fields: it always gates and renormalises),
 * shared_expert_intermediate_size 0 (transformers would default to 512; a config without the
 * field but a checkpoint with a shared expert is reported by the loader), mtp_num_hidden_layers 0.
 * Every shape field is required: a config that omits one is more likely broken than meant. */
#include "model/config.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CFG_MAX_DIM (1 << 20)       /* any single size beyond this is absurd */
#define CFG_MAX_PRODUCT (1LL << 24) /* per-layer projection widths (keeps int arithmetic safe) */
#define CFG_MAX_FILE (16u << 20)

typedef struct cfg_obj {
    const cJSON *j;   /* the JSON object fields are read from */
    const char *path; /* its path for messages: "" or "text_config." */
} cfg_obj;

typedef struct cfg_ctx {
    const char *origin;
    ds_error *err;
} cfg_ctx;

static const char *cfg_type_name(const cJSON *j) {
    if (cJSON_IsNull(j)) return "null";
    if (cJSON_IsBool(j)) return "a boolean";
    if (cJSON_IsNumber(j)) return "a number";
    if (cJSON_IsString(j)) return "a string";
    if (cJSON_IsArray(j)) return "an array";
    if (cJSON_IsObject(j)) return "an object";
    return "invalid";
}

/* The item for key, NULL when absent or JSON null (transformers writes None as null). */
static const cJSON *cfg_item(cfg_obj o, const char *key) {
    if (!o.j) return NULL;
    const cJSON *it = cJSON_GetObjectItemCaseSensitive(o.j, key);
    return cJSON_IsNull(it) ? NULL : it;
}

static bool cfg_json_int(const cJSON *it, long long *v) {
    if (!cJSON_IsNumber(it)) return false;
    double d = it->valuedouble;
    if (!isfinite(d) || d != floor(d) || fabs(d) > 9007199254740992.0) return false;
    *v = (long long)d;
    return true;
}

static ds_status cfg_int(cfg_ctx *c, cfg_obj o, const char *key, bool required, int def,
                         long long lo, long long hi, int *out) {
    const cJSON *it = cfg_item(o, key);
    if (!it) {
        if (required)
            return ds_error_set(c->err, DS_ERR_FORMAT, "%s: required field '%s%s' is missing",
                                c->origin, o.path, key);
        *out = def;
        return DS_OK;
    }
    long long v;
    if (!cfg_json_int(it, &v))
        return ds_error_set(c->err, DS_ERR_FORMAT, "%s: field '%s%s' must be an integer, got %s",
                            c->origin, o.path, key, cfg_type_name(it));
    if (v < lo || v > hi)
        return ds_error_set(c->err, DS_ERR_FORMAT,
                            "%s: field '%s%s' = %lld is out of range [%lld, %lld]", c->origin,
                            o.path, key, v, lo, hi);
    *out = (int)v;
    return DS_OK;
}

/* Reads a number in (lo, hi]; *found tells whether it was present. */
static ds_status cfg_num(cfg_ctx *c, cfg_obj o, const char *key, double lo, double hi, double *out,
                         bool *found) {
    const cJSON *it = cfg_item(o, key);
    *found = it != NULL;
    if (!it) return DS_OK;
    if (!cJSON_IsNumber(it) || !isfinite(it->valuedouble))
        return ds_error_set(c->err, DS_ERR_FORMAT, "%s: field '%s%s' must be a number, got %s",
                            c->origin, o.path, key, cfg_type_name(it));
    double v = it->valuedouble;
    if (!(v > lo && v <= hi))
        return ds_error_set(c->err, DS_ERR_FORMAT, "%s: field '%s%s' = %g is out of range (%g, %g]",
                            c->origin, o.path, key, v, lo, hi);
    *out = v;
    return DS_OK;
}

static ds_status cfg_bool(cfg_ctx *c, cfg_obj o, const char *key, bool *out, bool *found) {
    const cJSON *it = cfg_item(o, key);
    *found = it != NULL;
    if (!it) return DS_OK;
    if (!cJSON_IsBool(it))
        return ds_error_set(c->err, DS_ERR_FORMAT, "%s: field '%s%s' must be true or false, got %s",
                            c->origin, o.path, key, cfg_type_name(it));
    *out = cJSON_IsTrue(it);
    return DS_OK;
}

static ds_status cfg_eos_push(cfg_ctx *c, const char *field, long long id, ds_config *cfg) {
    if (id < 0 || id >= cfg->vocab)
        return ds_error_set(c->err, DS_ERR_FORMAT,
                            "%s: '%s' = %lld is outside the vocabulary [0, %d)", c->origin, field,
                            id, cfg->vocab);
    for (int i = 0; i < cfg->n_eos; i++)
        if (cfg->eos_ids[i] == id) return DS_OK;
    if (cfg->n_eos == DS_MAX_EOS)
        return ds_error_set(c->err, DS_ERR_FORMAT, "%s: '%s': more than %d distinct eos ids",
                            c->origin, field, DS_MAX_EOS);
    cfg->eos_ids[cfg->n_eos++] = (int)id;
    return DS_OK;
}

/* eos_token_id: an int, a list of ints, or null/absent. */
static ds_status cfg_eos(cfg_ctx *c, cfg_obj o, ds_config *cfg) {
    const cJSON *it = cfg_item(o, "eos_token_id");
    if (!it) return DS_OK;
    char field[64];
    snprintf(field, sizeof field, "%seos_token_id", o.path);
    long long v;
    if (cJSON_IsArray(it)) {
        const cJSON *e;
        cJSON_ArrayForEach(e, it) {
            if (!cfg_json_int(e, &v))
                return ds_error_set(c->err, DS_ERR_FORMAT, "%s: '%s' must hold integers, found %s",
                                    c->origin, field, cfg_type_name(e));
            ds_status st = cfg_eos_push(c, field, v, cfg);
            if (st != DS_OK) return st;
        }
        return DS_OK;
    }
    if (!cfg_json_int(it, &v))
        return ds_error_set(c->err, DS_ERR_FORMAT,
                            "%s: '%s' must be an integer or a list of integers, got %s", c->origin,
                            field, cfg_type_name(it));
    return cfg_eos_push(c, field, v, cfg);
}

static ds_status cfg_layer_types(cfg_ctx *c, cfg_obj t, ds_config *cfg) {
    const cJSON *lt = cfg_item(t, "layer_types");
    if (lt) {
        if (!cJSON_IsArray(lt))
            return ds_error_set(c->err, DS_ERR_FORMAT,
                                "%s: field '%slayer_types' must be an array, got %s", c->origin,
                                t.path, cfg_type_name(lt));
        int n = cJSON_GetArraySize(lt);
        if (n != cfg->n_layers)
            return ds_error_set(c->err, DS_ERR_FORMAT,
                                "%s: '%slayer_types' has %d entries but num_hidden_layers is %d",
                                c->origin, t.path, n, cfg->n_layers);
        int i = 0;
        const cJSON *e;
        cJSON_ArrayForEach(e, lt) {
            const char *s = cJSON_IsString(e) ? e->valuestring : NULL;
            /* "mamba" / "attention" are the legacy names transformers' remap_legacy_layer_types
             * still accepts */
            if (s && (!strcmp(s, "linear_attention") || !strcmp(s, "mamba")))
                cfg->layer_types[i] = DS_LAYER_LINEAR_ATTN;
            else if (s && (!strcmp(s, "full_attention") || !strcmp(s, "attention")))
                cfg->layer_types[i] = DS_LAYER_FULL_ATTN;
            else
                return ds_error_set(c->err, DS_ERR_FORMAT,
                                    "%s: '%slayer_types[%d]' must be \"linear_attention\" or "
                                    "\"full_attention\", got %s%s%s",
                                    c->origin, t.path, i, s ? "\"" : "", s ? s : cfg_type_name(e),
                                    s ? "\"" : "");
            i++;
        }
        return DS_OK;
    }
    int interval;
    ds_status st = cfg_int(c, t, "full_attention_interval", false, 4, 1, CFG_MAX_DIM, &interval);
    if (st != DS_OK) return st;
    for (int i = 0; i < cfg->n_layers; i++)
        cfg->layer_types[i] = (i + 1) % interval == 0 ? DS_LAYER_FULL_ATTN : DS_LAYER_LINEAR_ATTN;
    return DS_OK;
}

/* RoPE: text.rope_parameters (transformers 5) or legacy rope_scaling, else flat fields of the
 * text config, else (nested configs) of the top level. */
static ds_status cfg_rope(cfg_ctx *c, cfg_obj root, cfg_obj t, bool nested, ds_config *cfg) {
    cfg_obj rp = {NULL, "text_config.rope_parameters."};
    const cJSON *it = cfg_item(t, "rope_parameters");
    const char *rp_key = "rope_parameters";
    if (!it) {
        it = cfg_item(t, "rope_scaling");
        rp_key = "rope_scaling";
    }
    char path[64];
    if (it) {
        snprintf(path, sizeof path, "%s%s.", t.path, rp_key);
        if (!cJSON_IsObject(it))
            return ds_error_set(c->err, DS_ERR_FORMAT, "%s: field '%s%s' must be an object, got %s",
                                c->origin, t.path, rp_key, cfg_type_name(it));
        rp.j = it;
        rp.path = path;
        const cJSON *type = cfg_item(rp, "rope_type");
        if (!type) type = cfg_item(rp, "type");
        if (type && (!cJSON_IsString(type) || strcmp(type->valuestring, "default")))
            return ds_error_set(c->err, DS_ERR_UNSUPPORTED,
                                "%s: rope type %s%s%s is not supported (only \"default\")",
                                c->origin, cJSON_IsString(type) ? "\"" : "",
                                cJSON_IsString(type) ? type->valuestring : cfg_type_name(type),
                                cJSON_IsString(type) ? "\"" : "");
    }
    cfg_obj order[3] = {rp, t, nested ? root : (cfg_obj){NULL, ""}};
    double theta = 10000.0, partial = 0.25;
    bool have_theta = false, have_partial = false;
    for (int i = 0; i < 3; i++) {
        ds_status st;
        if (!have_theta &&
            (st = cfg_num(c, order[i], "rope_theta", 0.0, 1e30, &theta, &have_theta)) != DS_OK)
            return st;
        if (!have_partial && (st = cfg_num(c, order[i], "partial_rotary_factor", 0.0, 1.0, &partial,
                                           &have_partial)) != DS_OK)
            return st;
    }
    cfg->rope_theta = theta;
    /* transformers: dim = int(head_dim * partial_rotary_factor) */
    int rot = (int)((double)cfg->head_dim * partial);
    if (rot < 2 || rot % 2 != 0 || rot > cfg->head_dim)
        return ds_error_set(c->err, DS_ERR_FORMAT,
                            "%s: head_dim %d × partial_rotary_factor %g gives %d rotary dims; "
                            "it must be even and in [2, head_dim]",
                            c->origin, cfg->head_dim, partial, rot);
    cfg->rot_dim = rot;
    return DS_OK;
}

static ds_status cfg_product(cfg_ctx *c, const char *what, long long a, long long b) {
    if (a * b > CFG_MAX_PRODUCT)
        return ds_error_set(c->err, DS_ERR_FORMAT, "%s: %s = %lld × %lld exceeds %lld", c->origin,
                            what, a, b, CFG_MAX_PRODUCT);
    return DS_OK;
}

static ds_status cfg_from_json(cfg_ctx *c, const cJSON *json, ds_config *cfg) {
    ds_status st;
#define TRY(x)                                                                                     \
    do {                                                                                           \
        if ((st = (x)) != DS_OK) return st;                                                        \
    } while (0)
    if (!cJSON_IsObject(json))
        return ds_error_set(c->err, DS_ERR_FORMAT, "%s: top level is not a JSON object", c->origin);
    cfg_obj root = {json, ""};
    const cJSON *mt = cfg_item(root, "model_type");
    if (!mt)
        return ds_error_set(c->err, DS_ERR_FORMAT, "%s: required field 'model_type' is missing",
                            c->origin);
    if (!cJSON_IsString(mt))
        return ds_error_set(c->err, DS_ERR_FORMAT,
                            "%s: field 'model_type' must be a string, got %s", c->origin,
                            cfg_type_name(mt));
    const char *type = mt->valuestring;
    bool nested, moe;
    if (!strcmp(type, "qwen3_5_moe"))
        nested = true, moe = true;
    else if (!strcmp(type, "qwen3_5"))
        nested = true, moe = false;
    else if (!strcmp(type, "qwen3_5_moe_text"))
        nested = false, moe = true;
    else if (!strcmp(type, "qwen3_5_text"))
        nested = false, moe = false;
    else
        return ds_error_set(c->err, DS_ERR_UNSUPPORTED,
                            "%s: model_type \"%s\" is not supported (expected qwen3_5_moe, "
                            "qwen3_5, qwen3_5_moe_text or qwen3_5_text)",
                            c->origin, type);
    *cfg = (ds_config){0};
    snprintf(cfg->model_type, sizeof cfg->model_type, "%s", type);
    cfg->is_moe = moe;

    cfg_obj t = root;
    if (nested) {
        const cJSON *tc = cfg_item(root, "text_config");
        if (!tc)
            return ds_error_set(c->err, DS_ERR_FORMAT,
                                "%s: required field 'text_config' is missing (model_type %s)",
                                c->origin, type);
        if (!cJSON_IsObject(tc))
            return ds_error_set(c->err, DS_ERR_FORMAT,
                                "%s: field 'text_config' must be an object, got %s", c->origin,
                                cfg_type_name(tc));
        t = (cfg_obj){tc, "text_config."};
        const cJSON *tmt = cfg_item(t, "model_type");
        const char *want = moe ? "qwen3_5_moe_text" : "qwen3_5_text";
        if (tmt && (!cJSON_IsString(tmt) || strcmp(tmt->valuestring, want)))
            return ds_error_set(c->err, DS_ERR_FORMAT,
                                "%s: text_config.model_type must be \"%s\" for model_type %s",
                                c->origin, want, type);
    }

    TRY(cfg_int(c, t, "hidden_size", true, 0, 1, CFG_MAX_DIM, &cfg->hidden));
    TRY(cfg_int(c, t, "num_hidden_layers", true, 0, 1, DS_MAX_LAYERS, &cfg->n_layers));
    TRY(cfg_int(c, t, "vocab_size", true, 0, 1, 1 << 24, &cfg->vocab));
    TRY(cfg_int(c, t, "max_position_embeddings", false, 32768, 1, 1 << 30, &cfg->max_position));
    bool found;
    TRY(cfg_num(c, t, "rms_norm_eps", 0.0, 1.0, &cfg->rms_eps, &found));
    if (!found)
        return ds_error_set(c->err, DS_ERR_FORMAT, "%s: required field '%srms_norm_eps' is missing",
                            c->origin, t.path);

    TRY(cfg_int(c, t, "num_attention_heads", true, 0, 1, CFG_MAX_DIM, &cfg->n_heads));
    TRY(cfg_int(c, t, "num_key_value_heads", true, 0, 1, CFG_MAX_DIM, &cfg->n_kv_heads));
    TRY(cfg_int(c, t, "head_dim", true, 0, 2, CFG_MAX_DIM, &cfg->head_dim));
    if (cfg->n_heads % cfg->n_kv_heads)
        return ds_error_set(
            c->err, DS_ERR_FORMAT,
            "%s: num_attention_heads %d is not a multiple of num_key_value_heads %d", c->origin,
            cfg->n_heads, cfg->n_kv_heads);
    TRY(cfg_product(c, "2 · num_attention_heads · head_dim", 2LL * cfg->n_heads, cfg->head_dim));
    cfg->attn_output_gate = true;
    TRY(cfg_bool(c, t, "attn_output_gate", &cfg->attn_output_gate, &found));
    TRY(cfg_rope(c, root, t, nested, cfg));

    TRY(cfg_int(c, t, "linear_num_key_heads", true, 0, 1, CFG_MAX_DIM, &cfg->gdn_k_heads));
    TRY(cfg_int(c, t, "linear_num_value_heads", true, 0, 1, CFG_MAX_DIM, &cfg->gdn_v_heads));
    TRY(cfg_int(c, t, "linear_key_head_dim", true, 0, 1, CFG_MAX_DIM, &cfg->gdn_k_dim));
    TRY(cfg_int(c, t, "linear_value_head_dim", true, 0, 1, CFG_MAX_DIM, &cfg->gdn_v_dim));
    TRY(cfg_int(c, t, "linear_conv_kernel_dim", true, 0, 1, 64, &cfg->gdn_conv_kernel));
    if (cfg->gdn_v_heads % cfg->gdn_k_heads)
        return ds_error_set(c->err, DS_ERR_FORMAT,
                            "%s: linear_num_value_heads %d is not a multiple of "
                            "linear_num_key_heads %d",
                            c->origin, cfg->gdn_v_heads, cfg->gdn_k_heads);
    TRY(cfg_product(c, "2 · linear_num_key_heads · linear_key_head_dim", 2LL * cfg->gdn_k_heads,
                    cfg->gdn_k_dim));
    TRY(cfg_product(c, "linear_num_value_heads · linear_value_head_dim", cfg->gdn_v_heads,
                    cfg->gdn_v_dim));

    if (moe) {
        TRY(cfg_int(c, t, "num_experts", true, 0, 1, 1 << 16, &cfg->n_experts));
        TRY(cfg_int(c, t, "num_experts_per_tok", true, 0, 1, cfg->n_experts, &cfg->top_k));
        TRY(cfg_int(c, t, "moe_intermediate_size", true, 0, 1, CFG_MAX_DIM, &cfg->moe_inter));
        TRY(cfg_int(c, t, "shared_expert_intermediate_size", false, 0, 0, CFG_MAX_DIM,
                    &cfg->shared_inter));
        cfg->norm_topk_prob = true;
        TRY(cfg_bool(c, t, "norm_topk_prob", &cfg->norm_topk_prob, &found));
    } else {
        TRY(cfg_int(c, t, "intermediate_size", true, 0, 1, CFG_MAX_DIM, &cfg->mlp_inter));
    }
    TRY(cfg_int(c, t, "mtp_num_hidden_layers", false, 0, 0, 16, &cfg->n_mtp_layers));
    TRY(cfg_layer_types(c, t, cfg));

    /* tie_word_embeddings: the text config's value wins, then the top level's, else false. */
    cfg->tie_embeddings = false;
    TRY(cfg_bool(c, t, "tie_word_embeddings", &cfg->tie_embeddings, &found));
    if (!found && nested)
        TRY(cfg_bool(c, root, "tie_word_embeddings", &cfg->tie_embeddings, &found));

    TRY(cfg_eos(c, t, cfg));
    if (nested) TRY(cfg_eos(c, root, cfg));
    return DS_OK;
#undef TRY
}

ds_status ds_config_parse(const char *json_text, const char *origin, ds_config *cfg,
                          ds_error *err) {
    cfg_ctx c = {origin ? origin : "config.json", err};
    cJSON *json = cJSON_Parse(json_text);
    if (!json) return ds_error_set(err, DS_ERR_FORMAT, "%s: not valid JSON", c.origin);
    ds_config tmp;
    ds_status st = cfg_from_json(&c, json, &tmp);
    cJSON_Delete(json);
    if (st == DS_OK) *cfg = tmp;
    return st;
}

/* Reads a whole small text file; DS_ERR_IO when missing. */
static ds_status cfg_read_file(const char *path, char **out, ds_error *err) {
    *out = NULL;
    FILE *f = fopen(path, "rb");
    if (!f) return ds_error_set(err, DS_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    ds_status st = DS_OK;
    char *buf = NULL;
    long n = -1;
    if (fseek(f, 0, SEEK_END) == 0) n = ftell(f);
    if (n < 0 || fseek(f, 0, SEEK_SET) != 0)
        st = ds_error_set(err, DS_ERR_IO, "%s: cannot determine the file size", path);
    else if ((unsigned long)n > CFG_MAX_FILE)
        st = ds_error_set(err, DS_ERR_FORMAT, "%s: %ld bytes is too large for a config", path, n);
    else if (!(buf = malloc((size_t)n + 1)))
        st = ds_error_set(err, DS_ERR_NOMEM, "%s: out of memory", path);
    else if (fread(buf, 1, (size_t)n, f) != (size_t)n)
        st = ds_error_set(err, DS_ERR_IO, "%s: read error", path);
    fclose(f);
    if (st != DS_OK) {
        free(buf);
        return st;
    }
    buf[n] = 0;
    *out = buf;
    return DS_OK;
}

ds_status ds_config_load(const char *model_dir, ds_config *cfg, ds_error *err) {
    char path[4096];
    if (snprintf(path, sizeof path, "%s/generation_config.json", model_dir) >= (int)sizeof path)
        return ds_error_set(err, DS_ERR_INVALID_ARG, "model directory path too long: %s",
                            model_dir);
    snprintf(path, sizeof path, "%s/config.json", model_dir);
    char *text = NULL;
    ds_status st = cfg_read_file(path, &text, err);
    if (st != DS_OK) return st;
    ds_config tmp;
    st = ds_config_parse(text, path, &tmp, err);
    free(text);
    if (st != DS_OK) return st;

    /* generation_config.json is optional; when present its eos ids join the config's. */
    snprintf(path, sizeof path, "%s/generation_config.json", model_dir);
    FILE *probe = fopen(path, "rb");
    if (probe) {
        fclose(probe);
        st = cfg_read_file(path, &text, err);
        if (st != DS_OK) return st;
        cJSON *json = cJSON_Parse(text);
        free(text);
        if (!json) return ds_error_set(err, DS_ERR_FORMAT, "%s: not valid JSON", path);
        cfg_ctx c = {path, err};
        if (!cJSON_IsObject(json))
            st = ds_error_set(err, DS_ERR_FORMAT, "%s: top level is not a JSON object", path);
        else
            st = cfg_eos(&c, (cfg_obj){json, ""}, &tmp);
        cJSON_Delete(json);
        if (st != DS_OK) return st;
    }
    *cfg = tmp;
    return DS_OK;
}
