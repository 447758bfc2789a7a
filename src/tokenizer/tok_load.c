/* tok_load.c — reading tokenizer.json: the BPE model, added tokens, and the per-id tables.
 * Every field is validated; a message names the file and the field. */
#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "tokenizer/tok_internal.h"

#include "tokenizer/tok_json.h"

/* ---- small JSON helpers (shared with tok_load_parts.c through tok_json.h) ------------------ */

ds_status tok_json_bool(const ds_tokenizer *tok, const cJSON *obj, const char *key, bool dflt,
                        bool *out, const char *where, ds_error *err) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, key);
    if (!v || cJSON_IsNull(v)) {
        *out = dflt;
        return DS_OK;
    }
    if (!cJSON_IsBool(v))
        return ds_error_set(err, DS_ERR_FORMAT, "%s: %s.%s must be true or false", tok->name, where,
                            key);
    *out = cJSON_IsTrue(v);
    return DS_OK;
}

ds_status tok_json_id(const ds_tokenizer *tok, const cJSON *v, int32_t *out, const char *where,
                      ds_error *err) {
    if (!cJSON_IsNumber(v) || !(v->valuedouble >= 0) || v->valuedouble >= TOK_MAX_IDS ||
        v->valuedouble != floor(v->valuedouble))
        return ds_error_set(err, DS_ERR_FORMAT, "%s: %s must be an integer id in [0, %d)",
                            tok->name, where, TOK_MAX_IDS);
    *out = (int32_t)v->valuedouble;
    return DS_OK;
}

/* Type of a {"type": ...} object; NULL (and an error) when missing. */
const char *tok_json_type(const ds_tokenizer *tok, const cJSON *obj, const char *where,
                          ds_error *err) {
    const cJSON *t = cJSON_IsObject(obj) ? cJSON_GetObjectItemCaseSensitive(obj, "type") : NULL;
    if (!cJSON_IsString(t)) {
        ds_error_set(err, DS_ERR_FORMAT, "%s: %s must be an object with a string \"type\"",
                     tok->name, where);
        return NULL;
    }
    return t->valuestring;
}

/* ---- per-id tables -------------------------------------------------------------------------- */

static ds_status arena_add(ds_tokenizer *tok, const char *s, size_t n, uint32_t *off,
                           ds_error *err) {
    if (tok->strs.len + n + 1 > UINT32_MAX)
        return ds_error_set(err, DS_ERR_FORMAT, "%s: vocabulary strings exceed 4 GiB", tok->name);
    *off = (uint32_t)tok->strs.len;
    ds_status st = tok_buf_append(&tok->strs, s, n, err);
    if (st != DS_OK) return st;
    return tok_buf_append(&tok->strs, "", 1, err); /* NUL after every string */
}

/* Sets the spelling of id (and its decoded bytes, by HF's ByteLevel decoder rule). */
static ds_status set_token(ds_tokenizer *tok, int32_t id, const char *s, size_t n, ds_error *err) {
    ds_status st;
    uint32_t off;
    if ((st = arena_add(tok, s, n, &off, err)) != DS_OK) return st;
    tok->str_off[id] = off;
    tok->str_len[id] = (uint32_t)n;
    /* Bytes: every character must be in the byte alphabet, else the raw UTF-8 is used. */
    char small[256];
    char *tmp = n <= sizeof small ? small : malloc(n);
    if (!tmp) return ds_error_set(err, DS_ERR_NOMEM, "%s: out of memory", tok->name);
    size_t nb = 0, i = 0;
    bool bytelevel = true;
    const unsigned char *u = (const unsigned char *)s;
    while (i < n) {
        size_t l;
        if (tok_utf8_next(u + i, n - i, &l) != TOK_UTF8_OK) {
            bytelevel = false;
            break;
        }
        int b = tok_bytelevel_byte(tok_utf8_decode(u + i, n - i, &l));
        if (b < 0) {
            bytelevel = false;
            break;
        }
        tmp[nb++] = (char)b;
        i += l;
    }
    if (bytelevel && !(nb == n && memcmp(tmp, s, n) == 0)) {
        st = arena_add(tok, tmp, nb, &off, err);
        tok->bytes_off[id] = off;
        tok->bytes_len[id] = (uint32_t)nb;
    } else { /* same bytes as the spelling: share them */
        tok->bytes_off[id] = tok->str_off[id];
        tok->bytes_len[id] = (uint32_t)n;
    }
    if (tmp != small) free(tmp);
    return st;
}

/* ---- model ---------------------------------------------------------------------------------- */

static ds_status check_model_options(ds_tokenizer *tok, const cJSON *model, ds_error *err) {
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(model, "type");
    if (type && !cJSON_IsString(type))
        return ds_error_set(err, DS_ERR_FORMAT, "%s: model.type must be a string", tok->name);
    if (type && strcmp(type->valuestring, "BPE") != 0)
        return ds_error_set(err, DS_ERR_UNSUPPORTED,
                            "%s: model.type '%s' is not supported (only BPE)", tok->name,
                            type->valuestring);
    const cJSON *dropout = cJSON_GetObjectItemCaseSensitive(model, "dropout");
    if (dropout && !cJSON_IsNull(dropout) &&
        !(cJSON_IsNumber(dropout) && dropout->valuedouble == 0))
        return ds_error_set(err, DS_ERR_UNSUPPORTED, "%s: model.dropout must be null or 0",
                            tok->name);
    static const char *const affixes[] = {"continuing_subword_prefix", "end_of_word_suffix"};
    for (size_t i = 0; i < 2; i++) {
        const cJSON *a = cJSON_GetObjectItemCaseSensitive(model, affixes[i]);
        if (a && !cJSON_IsNull(a) && !(cJSON_IsString(a) && a->valuestring[0] == 0))
            return ds_error_set(err, DS_ERR_UNSUPPORTED,
                                "%s: model.%s is not supported (must be null or \"\")", tok->name,
                                affixes[i]);
    }
    bool b;
    ds_status st;
    if ((st = tok_json_bool(tok, model, "byte_fallback", false, &b, "model", err)) != DS_OK)
        return st;
    if (b)
        return ds_error_set(err, DS_ERR_UNSUPPORTED, "%s: model.byte_fallback is not supported",
                            tok->name);
    if ((st = tok_json_bool(tok, model, "fuse_unk", false, &b, "model", err)) != DS_OK) return st;
    return tok_json_bool(tok, model, "ignore_merges", false, &tok->ignore_merges, "model", err);
}

/* One merge as two spellings: "a b" or ["a", "b"]. */
static ds_status merge_parts(ds_tokenizer *tok, const cJSON *m, size_t idx, tok_buf *tmp,
                             size_t *split, ds_error *err) {
    tmp->len = 0;
    ds_status st;
    if (cJSON_IsString(m)) {
        const char *s = m->valuestring, *sp = strchr(s, ' ');
        if (!sp || sp == s || sp[1] == 0 || strchr(sp + 1, ' '))
            return ds_error_set(err, DS_ERR_FORMAT, "%s: model.merges[%zu] '%.60s' is not \"a b\"",
                                tok->name, idx, s);
        *split = (size_t)(sp - s);
        return tok_buf_append(tmp, s, strlen(s), err); /* "a b": parts at [0,split), (split,end) */
    }
    if (cJSON_IsArray(m) && cJSON_GetArraySize(m) == 2 &&
        cJSON_IsString(cJSON_GetArrayItem(m, 0)) && cJSON_IsString(cJSON_GetArrayItem(m, 1))) {
        const char *a = cJSON_GetArrayItem(m, 0)->valuestring,
                   *b = cJSON_GetArrayItem(m, 1)->valuestring;
        *split = strlen(a);
        if ((st = tok_buf_append(tmp, a, *split, err)) != DS_OK) return st;
        if ((st = tok_buf_append(tmp, " ", 1, err)) != DS_OK) return st;
        return tok_buf_append(tmp, b, strlen(b), err);
    }
    return ds_error_set(err, DS_ERR_FORMAT,
                        "%s: model.merges[%zu] must be \"a b\" or [\"a\", \"b\"]", tok->name, idx);
}

static ds_status load_merges(ds_tokenizer *tok, const cJSON *merges, ds_error *err) {
    if (!cJSON_IsArray(merges))
        return ds_error_set(err, DS_ERR_FORMAT, "%s: model.merges must be an array", tok->name);
    size_t n = (size_t)cJSON_GetArraySize(merges);
    ds_status st = tok_pairmap_init(&tok->merges, n, err);
    if (st != DS_OK) return st;
    tok_buf tmp = {0};
    size_t idx = 0;
    const cJSON *m;
    cJSON_ArrayForEach(m, merges) {
        size_t split = 0;
        if ((st = merge_parts(tok, m, idx, &tmp, &split, err)) != DS_OK) break;
        const char *s = tmp.p;
        int32_t a = tok_strmap_get(&tok->vocab, tok->strs.p, s, split);
        int32_t b = tok_strmap_get(&tok->vocab, tok->strs.p, s + split + 1, tmp.len - split - 1);
        /* The merged token is "ab": close the gap in place. */
        memmove(tmp.p + split, tmp.p + split + 1, tmp.len - split - 1);
        int32_t ab = tok_strmap_get(&tok->vocab, tok->strs.p, s, tmp.len - 1);
        if (a < 0 || b < 0 || ab < 0) {
            tmp.p[tmp.len - 1] = 0;
            st = ds_error_set(err, DS_ERR_FORMAT,
                              "%s: model.merges[%zu]: %s of '%.60s' is not in model.vocab",
                              tok->name, idx,
                              a < 0   ? "the left part"
                              : b < 0 ? "the right part"
                                      : "the merged token",
                              tmp.p);
            break;
        }
        tok_pairmap_put(&tok->merges, a, b, (uint32_t)idx, ab);
        idx++;
    }
    tok_buf_free(&tmp);
    return st;
}

/* ---- added tokens --------------------------------------------------------------------------- */

static ds_status parse_added(ds_tokenizer *tok, const cJSON *arr, int32_t *max_id, ds_error *err) {
    if (!arr || cJSON_IsNull(arr)) return DS_OK;
    if (!cJSON_IsArray(arr))
        return ds_error_set(err, DS_ERR_FORMAT, "%s: added_tokens must be an array", tok->name);
    size_t n = (size_t)cJSON_GetArraySize(arr);
    tok->added = calloc(n ? n : 1, sizeof *tok->added);
    if (!tok->added) return ds_error_set(err, DS_ERR_NOMEM, "%s: out of memory", tok->name);
    const cJSON *a;
    ds_status st;
    cJSON_ArrayForEach(a, arr) {
        char where[48];
        snprintf(where, sizeof where, "added_tokens[%zu]", tok->n_added);
        if (!cJSON_IsObject(a))
            return ds_error_set(err, DS_ERR_FORMAT, "%s: %s must be an object", tok->name, where);
        const cJSON *content = cJSON_GetObjectItemCaseSensitive(a, "content");
        if (!cJSON_IsString(content) || content->valuestring[0] == 0)
            return ds_error_set(err, DS_ERR_FORMAT, "%s: %s.content must be a non-empty string",
                                tok->name, where);
        tok_added *t = &tok->added[tok->n_added];
        char idwhere[64];
        snprintf(idwhere, sizeof idwhere, "%s.id", where);
        if ((st = tok_json_id(tok, cJSON_GetObjectItemCaseSensitive(a, "id"), &t->id, idwhere,
                              err)) != DS_OK)
            return st;
        if ((st = tok_json_bool(tok, a, "special", false, &t->special, where, err)) != DS_OK ||
            (st = tok_json_bool(tok, a, "lstrip", false, &t->lstrip, where, err)) != DS_OK ||
            (st = tok_json_bool(tok, a, "rstrip", false, &t->rstrip, where, err)) != DS_OK ||
            (st = tok_json_bool(tok, a, "single_word", false, &t->single_word, where, err)) !=
                DS_OK ||
            (st = tok_json_bool(tok, a, "normalized", !t->special, &t->normalized, where, err)) !=
                DS_OK)
            return st;
        if (t->id > *max_id) *max_id = t->id;
        tok->n_added++;
    }
    return DS_OK;
}

/* After the normalizer is known: spellings, special flags, and the two match tries. */
static ds_status index_added(ds_tokenizer *tok, const cJSON *arr, ds_error *err) {
    ds_status st;
    tok_buf nbuf = {0};
    size_t i = 0;
    const cJSON *a;
    if (!tok->n_added) return DS_OK;
    cJSON_ArrayForEach(a, arr) {
        const tok_added *t = &tok->added[i];
        const char *c = cJSON_GetObjectItemCaseSensitive(a, "content")->valuestring;
        size_t n = strlen(c);
        /* A normalized token is matched in normalized text by its normalized spelling, and HF
         * also decodes it from that spelling (e.g. NFKC turns "cafe\u0301" into "caf\u00e9",
         * whose byte-level decoding is "caf\xe9"). */
        const char *sp = c;
        size_t spn = n;
        if (t->normalized) {
            if ((st = tok_normalize(&tok->norm, c, n, &nbuf, &sp, &spn, err)) != DS_OK) break;
            if (spn == 0) { /* normalizes to nothing: can never match; keep the raw spelling */
                sp = c;
                spn = n;
            }
        }
        if ((st = set_token(tok, t->id, sp, spn, err)) != DS_OK) break;
        tok->is_special[t->id] = t->special;
        if ((st = tok_strmap_put(&tok->added_by, tok->strs.p, tok->str_off[t->id], (uint32_t)spn,
                                 t->id, err)) != DS_OK)
            break;
        if (sp != c) { /* look-ups by the spelling in the file work too */
            uint32_t off;
            if ((st = arena_add(tok, c, n, &off, err)) != DS_OK ||
                (st = tok_strmap_put(&tok->added_by, tok->strs.p, off, (uint32_t)n, t->id, err)) !=
                    DS_OK)
                break;
        }
        st = tok_trie_add(t->normalized ? &tok->trie_norm : &tok->trie_raw, sp, spn, (int32_t)i,
                          err);
        if (st != DS_OK) break;
        i++;
    }
    tok_buf_free(&nbuf);
    return st;
}

/* ---- the whole file --------------------------------------------------------------------------- */

static ds_status load_root(ds_tokenizer *tok, const cJSON *root, ds_error *err) {
    ds_status st;
    if (!cJSON_IsObject(root))
        return ds_error_set(err, DS_ERR_FORMAT, "%s: top level must be a JSON object", tok->name);
    static const char *const unsupported[] = {"truncation", "padding"};
    for (size_t i = 0; i < 2; i++) {
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, unsupported[i]);
        if (v && !cJSON_IsNull(v))
            return ds_error_set(err, DS_ERR_UNSUPPORTED, "%s: %s must be null (not supported)",
                                tok->name, unsupported[i]);
    }
    const cJSON *model = cJSON_GetObjectItemCaseSensitive(root, "model");
    if (!model) return ds_error_set(err, DS_ERR_FORMAT, "%s: missing field 'model'", tok->name);
    if (!cJSON_IsObject(model))
        return ds_error_set(err, DS_ERR_FORMAT, "%s: model must be an object", tok->name);
    if ((st = check_model_options(tok, model, err)) != DS_OK) return st;
    const cJSON *vocab = cJSON_GetObjectItemCaseSensitive(model, "vocab");
    if (!cJSON_IsObject(vocab))
        return ds_error_set(err, DS_ERR_FORMAT, "%s: model.vocab must be an object of token: id",
                            tok->name);

    /* Pass 1: ids and their range. */
    int32_t max_id = -1;
    size_t n_vocab = 0;
    const cJSON *e;
    cJSON_ArrayForEach(e, vocab) {
        int32_t id;
        char where[96];
        snprintf(where, sizeof where, "model.vocab['%.60s']", e->string);
        if ((st = tok_json_id(tok, e, &id, where, err)) != DS_OK) return st;
        if (id > max_id) max_id = id;
        n_vocab++;
    }
    const cJSON *added = cJSON_GetObjectItemCaseSensitive(root, "added_tokens");
    if ((st = parse_added(tok, added, &max_id, err)) != DS_OK) return st;
    if (max_id < 0) return ds_error_set(err, DS_ERR_FORMAT, "%s: model.vocab is empty", tok->name);

    tok->n_ids = (size_t)max_id + 1;
    tok->str_off = malloc(sizeof(uint32_t) * tok->n_ids);
    tok->str_len = calloc(tok->n_ids, sizeof(uint32_t));
    tok->bytes_off = calloc(tok->n_ids, sizeof(uint32_t));
    tok->bytes_len = calloc(tok->n_ids, sizeof(uint32_t));
    tok->is_special = calloc(tok->n_ids, 1);
    if (!tok->str_off || !tok->str_len || !tok->bytes_off || !tok->bytes_len || !tok->is_special)
        return ds_error_set(err, DS_ERR_NOMEM, "%s: out of memory (%zu ids)", tok->name,
                            tok->n_ids);
    for (size_t i = 0; i < tok->n_ids; i++) tok->str_off[i] = TOK_NONE;
    if ((st = tok_buf_reserve(&tok->strs, n_vocab * 16, err)) != DS_OK) return st;
    if ((st = tok_strmap_init(&tok->vocab, n_vocab, err)) != DS_OK) return st;
    if ((st = tok_strmap_init(&tok->added_by, tok->n_added, err)) != DS_OK) return st;

    /* Pass 2: spellings. */
    cJSON_ArrayForEach(e, vocab) {
        int32_t id = (int32_t)e->valuedouble;
        size_t n = strlen(e->string);
        if ((st = set_token(tok, id, e->string, n, err)) != DS_OK) return st;
        if ((st = tok_strmap_put(&tok->vocab, tok->strs.p, tok->str_off[id], (uint32_t)n, id,
                                 err)) != DS_OK)
            return st;
    }
    for (int b = 0; b < 256; b++) {
        char sp[4];
        size_t l = tok_utf8_encode(tok_bytelevel_char((uint8_t)b), sp);
        tok->byte_id[b] = tok_strmap_get(&tok->vocab, tok->strs.p, sp, l);
    }
    tok->unk_id = -1;
    const cJSON *unk = cJSON_GetObjectItemCaseSensitive(model, "unk_token");
    if (unk && !cJSON_IsNull(unk)) {
        if (!cJSON_IsString(unk))
            return ds_error_set(err, DS_ERR_FORMAT, "%s: model.unk_token must be a string",
                                tok->name);
        tok->unk_id =
            tok_strmap_get(&tok->vocab, tok->strs.p, unk->valuestring, strlen(unk->valuestring));
        if (tok->unk_id < 0)
            return ds_error_set(err, DS_ERR_FORMAT,
                                "%s: model.unk_token '%.60s' is not in model.vocab", tok->name,
                                unk->valuestring);
    }
    const cJSON *merges = cJSON_GetObjectItemCaseSensitive(model, "merges");
    if (!merges)
        return ds_error_set(err, DS_ERR_FORMAT, "%s: missing field 'model.merges'", tok->name);
    if ((st = load_merges(tok, merges, err)) != DS_OK) return st;

    if ((st = tok_parse_normalizer(tok, cJSON_GetObjectItemCaseSensitive(root, "normalizer"),
                                   err)) != DS_OK)
        return st;
    if ((st = tok_parse_pretokenizer(tok, cJSON_GetObjectItemCaseSensitive(root, "pre_tokenizer"),
                                     err)) != DS_OK)
        return st;
    if ((st = tok_parse_decoder(tok, cJSON_GetObjectItemCaseSensitive(root, "decoder"), err)) !=
        DS_OK)
        return st;
    return index_added(tok, added, err);
}

void ds_tokenizer_free(ds_tokenizer *tok) {
    if (!tok) return;
    free(tok->name);
    free(tok->str_off);
    free(tok->str_len);
    free(tok->bytes_off);
    free(tok->bytes_len);
    free(tok->is_special);
    tok_buf_free(&tok->strs);
    tok_strmap_free(&tok->vocab);
    tok_strmap_free(&tok->added_by);
    tok_pairmap_free(&tok->merges);
    free(tok->added);
    tok_trie_free(&tok->trie_raw);
    tok_trie_free(&tok->trie_norm);
    for (int i = 0; i < tok->pre.n_splits; i++) pcre2_code_free(tok->pre.splits[i].re);
    if (tok->pre.bl_re) pcre2_code_free(tok->pre.bl_re);
    free(tok->chat_template);
    free(tok);
}

ds_status ds_tokenizer_load_json(const char *json, size_t len, const char *name, ds_tokenizer **out,
                                 ds_error *err) {
    if (!out || (!json && len))
        return ds_error_set(err, DS_ERR_INVALID_ARG, "ds_tokenizer_load_json: NULL argument");
    *out = NULL;
    ds_tokenizer *tok = calloc(1, sizeof *tok);
    if (!tok) return ds_error_set(err, DS_ERR_NOMEM, "tokenizer: out of memory");
    tok->name = strdup(name ? name : "tokenizer.json");
    tok->bos_id = tok->eos_id = tok->pad_id = -1;
    tok->unk_id = -1;
    tok->max_ovector = 1;
    if (!tok->name) {
        ds_tokenizer_free(tok);
        return ds_error_set(err, DS_ERR_NOMEM, "tokenizer: out of memory");
    }
    cJSON *root = cJSON_ParseWithLength(json ? json : "", len);
    ds_status st;
    if (!root) {
        const char *at = cJSON_GetErrorPtr();
        size_t off = at && at >= json && at <= json + len ? (size_t)(at - json) : len;
        st = ds_error_set(err, DS_ERR_FORMAT, "%s: not valid JSON (error near byte %zu of %zu)",
                          tok->name, off, len);
    } else {
        st = load_root(tok, root, err);
        cJSON_Delete(root);
    }
    if (st != DS_OK) {
        ds_tokenizer_free(tok);
        return st;
    }
    *out = tok;
    return DS_OK;
}

static ds_status read_file(const char *path, char **data, size_t *len, ds_error *err) {
    FILE *f = fopen(path, "rb");
    if (!f) return ds_error_set(err, DS_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    char *buf = NULL;
    size_t n = 0, cap = 0;
    ds_status st = DS_OK;
    for (;;) {
        if (cap - n < 65536) {
            cap = cap ? cap * 2 : 1 << 20;
            char *p = realloc(buf, cap);
            if (!p) {
                st = ds_error_set(err, DS_ERR_NOMEM, "%s: out of memory reading the file", path);
                break;
            }
            buf = p;
        }
        size_t r = fread(buf + n, 1, cap - n, f);
        n += r;
        if (r == 0) {
            if (ferror(f)) st = ds_error_set(err, DS_ERR_IO, "%s: read error", path);
            break;
        }
    }
    fclose(f);
    if (st != DS_OK) {
        free(buf);
        return st;
    }
    *data = buf;
    *len = n;
    return DS_OK;
}

ds_status tok_read_file(const char *path, char **data, size_t *len, ds_error *err) {
    return read_file(path, data, len, err);
}

ds_status ds_tokenizer_load(const char *path, ds_tokenizer **out, ds_error *err) {
    if (!path || !out)
        return ds_error_set(err, DS_ERR_INVALID_ARG, "ds_tokenizer_load: NULL argument");
    *out = NULL;
    struct stat sb;
    if (stat(path, &sb) != 0) return ds_error_set(err, DS_ERR_IO, "%s: %s", path, strerror(errno));
    size_t plen = strlen(path);
    char *file = malloc(plen + 32), *dir = malloc(plen + 32);
    if (!file || !dir) {
        free(file);
        free(dir);
        return ds_error_set(err, DS_ERR_NOMEM, "tokenizer: out of memory");
    }
    if (S_ISDIR(sb.st_mode)) {
        snprintf(dir, plen + 32, "%s", path);
        snprintf(file, plen + 32, "%s/tokenizer.json", path);
    } else {
        snprintf(file, plen + 32, "%s", path);
        snprintf(dir, plen + 32, "%s", path);
        char *slash = strrchr(dir, '/');
        if (slash)
            *slash = 0;
        else
            snprintf(dir, plen + 32, ".");
    }
    char *data = NULL;
    size_t len = 0;
    ds_status st = read_file(file, &data, &len, err);
    if (st == DS_OK) st = ds_tokenizer_load_json(data, len, file, out, err);
    free(data);
    if (st == DS_OK) {
        char *cfg = malloc(strlen(dir) + 32);
        if (!cfg) {
            st = ds_error_set(err, DS_ERR_NOMEM, "tokenizer: out of memory");
        } else {
            sprintf(cfg, "%s/tokenizer_config.json", dir);
            if (stat(cfg, &sb) == 0) st = tok_parse_config(*out, cfg, err);
            free(cfg);
        }
        if (st != DS_OK) {
            ds_tokenizer_free(*out);
            *out = NULL;
        }
    }
    free(file);
    free(dir);
    return st;
}
