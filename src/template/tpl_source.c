/* Where a checkpoint keeps its chat template: chat_template.jinja or tokenizer_config.json. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "template/chat_template.h"

#define MAX_CONFIG_BYTES ((long)256 << 20)

/* Reads a whole file; NULL with errno set when missing / unreadable. */
static char *read_all(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    char *buf = NULL;
    if (fseek(f, 0, SEEK_END) == 0) {
        long n = ftell(f);
        if (n >= 0 && n <= MAX_CONFIG_BYTES && fseek(f, 0, SEEK_SET) == 0) {
            buf = malloc((size_t)n + 1);
            if (buf && fread(buf, 1, (size_t)n, f) == (size_t)n) {
                buf[n] = 0;
                *len = (size_t)n;
            } else {
                free(buf);
                buf = NULL;
            }
        }
    }
    fclose(f);
    if (!buf) errno = EIO;
    return buf;
}

static char *dup_or_null(const char *s) {
    if (!s) return NULL;
    size_t n = strlen(s) + 1;
    char *p = malloc(n);
    if (p) memcpy(p, s, n);
    return p;
}

/* bos_token / eos_token: a string or an AddedToken object {"content": ...} */
static const char *token_text(const cJSON *v) {
    if (cJSON_IsString(v)) return v->valuestring;
    const cJSON *c = cJSON_IsObject(v) ? cJSON_GetObjectItemCaseSensitive(v, "content") : NULL;
    return cJSON_IsString(c) ? c->valuestring : NULL;
}

void ds_chat_source_free(ds_chat_source *s) {
    if (!s) return;
    free(s->template_text);
    free(s->tool_template_text);
    free(s->origin);
    free(s->bos_token);
    free(s->eos_token);
    memset(s, 0, sizeof *s);
}

static ds_status nomem(ds_chat_source *out, ds_error *err) {
    ds_chat_source_free(out);
    return ds_error_set(err, DS_ERR_NOMEM, "chat template: out of memory");
}

ds_status ds_chat_source_load(const char *dir, ds_chat_source *out, ds_error *err) {
    memset(out, 0, sizeof *out);
    struct stat st;
    if (!dir || stat(dir, &st) != 0)
        return ds_error_set(err, DS_ERR_IO, "%s: %s", dir ? dir : "(null)", strerror(errno));
    size_t dl = strlen(dir);
    char *config = malloc(dl + 32), *jinja = malloc(dl + 32);
    if (!config || !jinja) {
        free(config);
        free(jinja);
        return nomem(out, err);
    }
    if (S_ISDIR(st.st_mode)) {
        snprintf(config, dl + 32, "%s/tokenizer_config.json", dir);
        snprintf(jinja, dl + 32, "%s/chat_template.jinja", dir);
    } else { /* a tokenizer_config.json given directly */
        snprintf(config, dl + 32, "%s", dir);
        const char *slash = strrchr(dir, '/');
        if (slash)
            snprintf(jinja, dl + 32, "%.*s/chat_template.jinja", (int)(slash - dir), dir);
        else
            snprintf(jinja, dl + 32, "chat_template.jinja");
    }
    ds_status rc = DS_OK;
    size_t len = 0;
    char *text = read_all(config, &len);
    if (text) {
        cJSON *j = cJSON_ParseWithLength(text, len);
        free(text);
        if (!j || !cJSON_IsObject(j)) {
            cJSON_Delete(j);
            rc = ds_error_set(err, DS_ERR_FORMAT, "%s: not a JSON object", config);
            goto done;
        }
        const cJSON *ct = cJSON_GetObjectItemCaseSensitive(j, "chat_template");
        if (cJSON_IsString(ct)) {
            out->template_text = dup_or_null(ct->valuestring);
            if (!out->template_text) goto oom_json;
        } else if (cJSON_IsArray(ct)) {
            /* [{"name": "default", "template": ...}, {"name": "tool_use", ...}] */
            const char *first = NULL;
            for (const cJSON *e = ct->child; e; e = e->next) {
                const cJSON *name = cJSON_GetObjectItemCaseSensitive(e, "name");
                const cJSON *tpl = cJSON_GetObjectItemCaseSensitive(e, "template");
                if (!cJSON_IsString(name) || !cJSON_IsString(tpl)) {
                    cJSON_Delete(j);
                    rc = ds_error_set(err, DS_ERR_FORMAT,
                                      "%s: chat_template list entries need string name and template",
                                      config);
                    goto done;
                }
                if (!first) first = tpl->valuestring;
                if (!strcmp(name->valuestring, "default") && !out->template_text) {
                    out->template_text = dup_or_null(tpl->valuestring);
                    if (!out->template_text) goto oom_json;
                } else if (!strcmp(name->valuestring, "tool_use") && !out->tool_template_text) {
                    out->tool_template_text = dup_or_null(tpl->valuestring);
                    if (!out->tool_template_text) goto oom_json;
                }
            }
            if (!out->template_text && first && !out->tool_template_text) {
                out->template_text = dup_or_null(first);
                if (!out->template_text) goto oom_json;
            }
        } else if (ct && !cJSON_IsNull(ct)) {
            cJSON_Delete(j);
            rc = ds_error_set(err, DS_ERR_FORMAT, "%s: chat_template must be a string or a list", config);
            goto done;
        }
        if (out->template_text || out->tool_template_text) {
            out->origin = dup_or_null("tokenizer_config.json");
            if (!out->origin) goto oom_json;
        }
        const char *bos = token_text(cJSON_GetObjectItemCaseSensitive(j, "bos_token"));
        const char *eos = token_text(cJSON_GetObjectItemCaseSensitive(j, "eos_token"));
        if ((bos && !(out->bos_token = dup_or_null(bos))) || (eos && !(out->eos_token = dup_or_null(eos))))
            goto oom_json;
        cJSON_Delete(j);
        goto read_jinja;
    oom_json:
        cJSON_Delete(j);
        free(config);
        free(jinja);
        return nomem(out, err);
    } else if (!S_ISDIR(st.st_mode)) {
        rc = ds_error_set(err, DS_ERR_IO, "%s: cannot read", config);
        goto done;
    }
read_jinja:
    /* transformers gives a separate chat_template.jinja precedence over the config's string */
    text = read_all(jinja, &len);
    if (text) {
        if (memchr(text, 0, len)) {
            free(text);
            rc = ds_error_set(err, DS_ERR_FORMAT, "%s: contains a NUL byte", jinja);
            goto done;
        }
        free(out->template_text);
        out->template_text = text;
        free(out->origin);
        out->origin = dup_or_null("chat_template.jinja");
        if (!out->origin) {
            free(config);
            free(jinja);
            return nomem(out, err);
        }
    }
done:
    free(config);
    free(jinja);
    if (rc != DS_OK) ds_chat_source_free(out);
    return rc;
}

const char *ds_chat_source_pick(const ds_chat_source *s, bool have_tools) {
    if (have_tools && s->tool_template_text) return s->tool_template_text;
    return s->template_text ? s->template_text : s->tool_template_text;
}
