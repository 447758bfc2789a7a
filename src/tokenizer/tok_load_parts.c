/* tok_load_parts.c — the pipeline components of tokenizer.json (normalizer, pre_tokenizer,
 * decoder) and the optional tokenizer_config.json. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

#include "tokenizer/tok_json.h"

/* GPT-2's split pattern, used by ByteLevel when use_regex is true (HF's ByteLevel RE). */
static const char k_gpt2_pattern[] =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

/* ---- normalizer ----------------------------------------------------------------------------- */

/* *list = the `key` array of a "Sequence" step at `where`, nesting depth checked. */
static ds_status sequence_items(const ds_tokenizer *tok, const cJSON *n, const char *key,
                                const char *where, int depth, const cJSON **list, ds_error *err) {
    *list = cJSON_GetObjectItemCaseSensitive(n, key);
    if (!cJSON_IsArray(*list))
        return ds_error_set(err, DS_ERR_FORMAT, "%s: %s.%s must be an array", tok->name, where,
                            key);
    if (depth > 4)
        return ds_error_set(err, DS_ERR_UNSUPPORTED, "%s: %s: Sequence nested too deeply",
                            tok->name, where);
    return DS_OK;
}

static ds_status add_normalizer(ds_tokenizer *tok, const cJSON *n, const char *where, int depth,
                                ds_error *err) {
    if (!n || cJSON_IsNull(n)) return DS_OK;
    const char *type = tok_json_type(tok, n, where, err);
    if (!type) return DS_ERR_FORMAT;
    int opts = 0;
    if (strcmp(type, "Sequence") == 0) {
        const cJSON *list;
        ds_status st = sequence_items(tok, n, "normalizers", where, depth, &list, err);
        if (st != DS_OK) return st;
        int i = 0;
        const cJSON *c;
        cJSON_ArrayForEach(c, list) {
            char sub[128];
            snprintf(sub, sizeof sub, "%s.normalizers[%d]", where, i++);
            if ((st = add_normalizer(tok, c, sub, depth + 1, err)) != DS_OK) return st;
        }
        return DS_OK;
    } else if (strcmp(type, "NFC") == 0) {
        opts = UTF8PROC_STABLE | UTF8PROC_COMPOSE;
    } else if (strcmp(type, "NFD") == 0) {
        opts = UTF8PROC_STABLE | UTF8PROC_DECOMPOSE;
    } else if (strcmp(type, "NFKC") == 0) {
        opts = UTF8PROC_STABLE | UTF8PROC_COMPOSE | UTF8PROC_COMPAT;
    } else if (strcmp(type, "NFKD") == 0) {
        opts = UTF8PROC_STABLE | UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT;
    } else {
        return ds_error_set(err, DS_ERR_UNSUPPORTED,
                            "%s: %s.type '%.40s' is not supported (NFC, NFD, NFKC, NFKD, Sequence)",
                            tok->name, where, type);
    }
    if (tok->norm.n_ops == TOK_MAX_NORM)
        return ds_error_set(err, DS_ERR_UNSUPPORTED, "%s: %s: more than %d normalizers", tok->name,
                            where, TOK_MAX_NORM);
    tok->norm.ops[tok->norm.n_ops++] = opts;
    return DS_OK;
}

ds_status tok_parse_normalizer(ds_tokenizer *tok, const void *json, ds_error *err) {
    return add_normalizer(tok, json, "normalizer", 0, err);
}

/* ---- pre-tokenizer ---------------------------------------------------------------------------- */

static ds_status note_regex(ds_tokenizer *tok, const pcre2_code *re) {
    uint32_t captures = 0;
    pcre2_pattern_info(re, PCRE2_INFO_CAPTURECOUNT, &captures);
    if (captures + 1 > tok->max_ovector) tok->max_ovector = captures + 1;
    return DS_OK;
}

static ds_status parse_split(ds_tokenizer *tok, const cJSON *p, const char *where, ds_error *err) {
    if (tok->pre.n_splits == TOK_MAX_SPLITS)
        return ds_error_set(err, DS_ERR_UNSUPPORTED, "%s: %s: more than %d Split steps", tok->name,
                            where, TOK_MAX_SPLITS);
    tok_split *sp = &tok->pre.splits[tok->pre.n_splits];
    const cJSON *pat = cJSON_GetObjectItemCaseSensitive(p, "pattern");
    const cJSON *re = cJSON_IsObject(pat) ? cJSON_GetObjectItemCaseSensitive(pat, "Regex") : NULL;
    const cJSON *lit = cJSON_IsObject(pat) ? cJSON_GetObjectItemCaseSensitive(pat, "String") : NULL;
    if (!cJSON_IsString(re) && !cJSON_IsString(lit))
        return ds_error_set(err, DS_ERR_FORMAT,
                            "%s: %s.pattern must be {\"Regex\": string} or {\"String\": string}",
                            tok->name, where);
    const cJSON *beh = cJSON_GetObjectItemCaseSensitive(p, "behavior");
    if (!cJSON_IsString(beh))
        return ds_error_set(err, DS_ERR_FORMAT, "%s: %s.behavior must be a string", tok->name,
                            where);
    if (strcmp(beh->valuestring, "Isolated") == 0) {
        sp->behavior = TOK_SPLIT_ISOLATED;
    } else if (strcmp(beh->valuestring, "Removed") == 0) {
        sp->behavior = TOK_SPLIT_REMOVED;
    } else {
        return ds_error_set(err, DS_ERR_UNSUPPORTED,
                            "%s: %s.behavior '%.40s' is not supported (Isolated, Removed)",
                            tok->name, where, beh->valuestring);
    }
    ds_status st = tok_json_bool(tok, p, "invert", false, &sp->invert, where, err);
    if (st != DS_OK) return st;
    const char *s = cJSON_IsString(re) ? re->valuestring : lit->valuestring;
    char rwhere[160];
    snprintf(rwhere, sizeof rwhere, "%s: %s.pattern", tok->name, where);
    if ((st = tok_regex_compile(s, strlen(s), !cJSON_IsString(re), rwhere, &sp->re, err)) != DS_OK)
        return st;
    tok->pre.n_splits++;
    return note_regex(tok, sp->re);
}

/* Flattens Sequences; *bytelevel_seen enforces ByteLevel as the last step. */
static ds_status add_pretok(ds_tokenizer *tok, const cJSON *p, const char *where, int depth,
                            bool *bytelevel_seen, ds_error *err) {
    const char *type = tok_json_type(tok, p, where, err);
    if (!type) return DS_ERR_FORMAT;
    if (strcmp(type, "Sequence") == 0) {
        const cJSON *list;
        ds_status st = sequence_items(tok, p, "pretokenizers", where, depth, &list, err);
        if (st != DS_OK) return st;
        int i = 0;
        const cJSON *c;
        cJSON_ArrayForEach(c, list) {
            char sub[128];
            snprintf(sub, sizeof sub, "%s.pretokenizers[%d]", where, i++);
            if ((st = add_pretok(tok, c, sub, depth + 1, bytelevel_seen, err)) != DS_OK) return st;
        }
        return DS_OK;
    }
    if (*bytelevel_seen)
        return ds_error_set(err, DS_ERR_UNSUPPORTED,
                            "%s: %s: steps after ByteLevel are not supported", tok->name, where);
    if (strcmp(type, "Split") == 0) return parse_split(tok, p, where, err);
    if (strcmp(type, "ByteLevel") == 0) {
        bool use_regex;
        ds_status st;
        /* HF's defaults when the fields are absent: both true. */
        if ((st = tok_json_bool(tok, p, "add_prefix_space", true, &tok->pre.add_prefix_space, where,
                                err)) != DS_OK ||
            (st = tok_json_bool(tok, p, "use_regex", true, &use_regex, where, err)) != DS_OK)
            return st;
        *bytelevel_seen = true;
        if (!use_regex) return DS_OK;
        if ((st = tok_regex_compile(k_gpt2_pattern, strlen(k_gpt2_pattern), false,
                                    "ByteLevel regex", &tok->pre.bl_re, err)) != DS_OK)
            return st;
        return note_regex(tok, tok->pre.bl_re);
    }
    return ds_error_set(err, DS_ERR_UNSUPPORTED,
                        "%s: %s.type '%.40s' is not supported (Split, ByteLevel, Sequence)",
                        tok->name, where, type);
}

ds_status tok_parse_pretokenizer(ds_tokenizer *tok, const void *json, ds_error *err) {
    const cJSON *p = json;
    if (!p || cJSON_IsNull(p))
        return ds_error_set(err, DS_ERR_UNSUPPORTED,
                            "%s: pre_tokenizer is null: only byte-level BPE (a ByteLevel "
                            "pre-tokenizer) is supported",
                            tok->name);
    bool bytelevel = false;
    ds_status st = add_pretok(tok, p, "pre_tokenizer", 0, &bytelevel, err);
    if (st != DS_OK) return st;
    if (!bytelevel)
        return ds_error_set(err, DS_ERR_UNSUPPORTED,
                            "%s: pre_tokenizer has no ByteLevel step: only byte-level BPE is "
                            "supported",
                            tok->name);
    return DS_OK;
}

/* ---- decoder ---------------------------------------------------------------------------------- */

static ds_status check_decoder(ds_tokenizer *tok, const cJSON *d, const char *where, int depth,
                               ds_error *err) {
    const char *type = tok_json_type(tok, d, where, err);
    if (!type) return DS_ERR_FORMAT;
    if (strcmp(type, "ByteLevel") == 0) return DS_OK;
    if (strcmp(type, "Sequence") == 0 && depth < 4) {
        const cJSON *list = cJSON_GetObjectItemCaseSensitive(d, "decoders");
        if (!cJSON_IsArray(list))
            return ds_error_set(err, DS_ERR_FORMAT, "%s: %s.decoders must be an array", tok->name,
                                where);
        int i = 0;
        const cJSON *c;
        cJSON_ArrayForEach(c, list) {
            char sub[128];
            snprintf(sub, sizeof sub, "%s.decoders[%d]", where, i++);
            ds_status st = check_decoder(tok, c, sub, depth + 1, err);
            if (st != DS_OK) return st;
        }
        return DS_OK;
    }
    return ds_error_set(err, DS_ERR_UNSUPPORTED, "%s: %s.type '%.40s' is not supported (ByteLevel)",
                        tok->name, where, type);
}

ds_status tok_parse_decoder(ds_tokenizer *tok, const void *json, ds_error *err) {
    const cJSON *d = json;
    if (!d || cJSON_IsNull(d))
        return ds_error_set(err, DS_ERR_UNSUPPORTED,
                            "%s: decoder is null: only the ByteLevel decoder is supported",
                            tok->name);
    return check_decoder(tok, d, "decoder", 0, err);
}

/* ---- tokenizer_config.json -------------------------------------------------------------------- */

/* bos_token etc.: a string, {"content": string, ...}, or null. */
static ds_status config_token(ds_tokenizer *tok, const cJSON *root, const char *key,
                              const char *path, int32_t *out, ds_error *err) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, key);
    if (!v || cJSON_IsNull(v)) return DS_OK;
    if (cJSON_IsObject(v)) v = cJSON_GetObjectItemCaseSensitive(v, "content");
    if (!cJSON_IsString(v))
        return ds_error_set(err, DS_ERR_FORMAT,
                            "%s: %s must be a string, {\"content\": string} or null", path, key);
    *out = ds_tokenizer_token_to_id(tok, v->valuestring);
    return DS_OK;
}

ds_status tok_parse_config(ds_tokenizer *tok, const char *path, ds_error *err) {
    char *data = NULL;
    size_t len = 0;
    ds_status st = tok_read_file(path, &data, &len, err);
    if (st != DS_OK) return st;
    cJSON *root = cJSON_ParseWithLength(data, len);
    free(data);
    if (!cJSON_IsObject(root)) {
        cJSON_Delete(root);
        return ds_error_set(err, DS_ERR_FORMAT, "%s: not a valid JSON object", path);
    }
    if ((st = config_token(tok, root, "bos_token", path, &tok->bos_id, err)) == DS_OK &&
        (st = config_token(tok, root, "eos_token", path, &tok->eos_id, err)) == DS_OK &&
        (st = config_token(tok, root, "pad_token", path, &tok->pad_id, err)) == DS_OK) {
        const cJSON *tpl = cJSON_GetObjectItemCaseSensitive(root, "chat_template");
        if (cJSON_IsString(tpl)) {
            tok->chat_template = strdup(tpl->valuestring);
            if (!tok->chat_template)
                st = ds_error_set(err, DS_ERR_NOMEM, "%s: out of memory", path);
        }
    }
    cJSON_Delete(root);
    return st;
}
