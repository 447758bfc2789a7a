/* tok_json.h — cJSON helpers shared by the tokenizer's loaders (messages name file + field). */
#ifndef DS_TOK_JSON_H
#define DS_TOK_JSON_H

#include <cjson/cJSON.h>

#include "tokenizer/tok_internal.h"

/* Missing or null: dflt. Any other non-bool: DS_ERR_FORMAT naming where.key. */
ds_status tok_json_bool(const ds_tokenizer *tok, const cJSON *obj, const char *key, bool dflt,
                        bool *out, const char *where, ds_error *err);
/* An integer id in [0, TOK_MAX_IDS). */
ds_status tok_json_id(const ds_tokenizer *tok, const cJSON *v, int32_t *out, const char *where,
                      ds_error *err);
/* The "type" string of a component object, or NULL with DS_ERR_FORMAT set. */
const char *tok_json_type(const ds_tokenizer *tok, const cJSON *obj, const char *where,
                          ds_error *err);
/* Whole file into a malloc'd buffer (not NUL-terminated). */
ds_status tok_read_file(const char *path, char **data, size_t *len, ds_error *err);

#endif
