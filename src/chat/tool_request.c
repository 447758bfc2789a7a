/* The request side of tool calling: validating "tools" and "tool_choice", what goes into the
 * prompt, and the prompt-side helpers (call form, prefill, open reasoning block). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "chat/tc_internal.h"
#include "chat/tool_calls.h"

static bool valid_name(const char *s) {
    size_t n = strlen(s);
    if (n == 0 || n > 64) return false;
    for (size_t i = 0; i < n; i++) {
        char c = s[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '_' || c == '-' || c == '.'))
            return false;
    }
    return true;
}

static const char *tool_name(const cJSON *tool) {
    const cJSON *f = cJSON_GetObjectItemCaseSensitive(tool, "function");
    const cJSON *n = cJSON_GetObjectItemCaseSensitive(f, "name");
    return cJSON_IsString(n) ? n->valuestring : NULL;
}

ds_status ds_tools_validate(const cJSON *tools, ds_error *err) {
    if (!tools || cJSON_IsNull(tools)) return DS_OK;
    if (!cJSON_IsArray(tools)) return ds_error_set(err, DS_ERR_INVALID_ARG, "tools: must be an array");
    int i = 0;
    for (const cJSON *t = tools->child; t; t = t->next, i++) {
        const cJSON *type = cJSON_GetObjectItemCaseSensitive(t, "type");
        const cJSON *f = cJSON_GetObjectItemCaseSensitive(t, "function");
        if (!cJSON_IsObject(t) || !cJSON_IsString(type) || strcmp(type->valuestring, "function"))
            return ds_error_set(err, DS_ERR_INVALID_ARG, "tools[%d]: type must be \"function\"", i);
        if (!cJSON_IsObject(f))
            return ds_error_set(err, DS_ERR_INVALID_ARG, "tools[%d].function: must be an object", i);
        const char *name = tool_name(t);
        if (!name || !valid_name(name))
            return ds_error_set(err, DS_ERR_INVALID_ARG,
                                "tools[%d].function.name: must be 1-64 characters of a-z, A-Z, "
                                "0-9, '_', '-' or '.'", i);
        const cJSON *d = cJSON_GetObjectItemCaseSensitive(f, "description");
        if (d && !cJSON_IsString(d) && !cJSON_IsNull(d))
            return ds_error_set(err, DS_ERR_INVALID_ARG, "tools[%d].function.description: must be a string", i);
        const cJSON *p = cJSON_GetObjectItemCaseSensitive(f, "parameters");
        if (p && !cJSON_IsObject(p) && !cJSON_IsNull(p))
            return ds_error_set(err, DS_ERR_INVALID_ARG, "tools[%d].function.parameters: must be an object", i);
        int j = 0;
        for (const cJSON *u = tools->child; u != t; u = u->next, j++)
            if (!strcmp(tool_name(u), name))
                return ds_error_set(err, DS_ERR_INVALID_ARG,
                                    "tools[%d].function.name: '%s' is already tools[%d]'s name", i, name, j);
    }
    return DS_OK;
}

ds_status ds_tool_choice_parse(const cJSON *tc, const cJSON *tools, ds_tool_choice *out, ds_error *err) {
    bool have = cJSON_IsArray(tools) && cJSON_GetArraySize(tools) > 0;
    memset(out, 0, sizeof *out);
    out->mode = have ? DS_TOOL_CHOICE_AUTO : DS_TOOL_CHOICE_NONE;
    if (!tc || cJSON_IsNull(tc)) return DS_OK;
    if (cJSON_IsString(tc)) {
        if (!strcmp(tc->valuestring, "none")) out->mode = DS_TOOL_CHOICE_NONE;
        else if (!strcmp(tc->valuestring, "auto")) out->mode = have ? DS_TOOL_CHOICE_AUTO : DS_TOOL_CHOICE_NONE;
        else if (!strcmp(tc->valuestring, "required")) {
            if (!have) return ds_error_set(err, DS_ERR_INVALID_ARG, "tool_choice: \"required\" needs tools");
            out->mode = DS_TOOL_CHOICE_REQUIRED;
        } else {
            return ds_error_set(err, DS_ERR_INVALID_ARG,
                                "tool_choice: must be \"none\", \"auto\", \"required\" or a named function");
        }
        return DS_OK;
    }
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(tc, "type");
    const cJSON *name = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(tc, "function"), "name");
    if (!cJSON_IsObject(tc) || !cJSON_IsString(type) || strcmp(type->valuestring, "function") ||
        !cJSON_IsString(name))
        return ds_error_set(err, DS_ERR_INVALID_ARG,
                            "tool_choice: expected {\"type\": \"function\", \"function\": {\"name\": ...}}");
    bool found = false;
    for (const cJSON *t = have ? tools->child : NULL; t && !found; t = t->next) {
        const char *n = tool_name(t);
        found = n && !strcmp(n, name->valuestring);
    }
    if (!found)
        return ds_error_set(err, DS_ERR_INVALID_ARG, "tool_choice: function '%.100s' is not in tools",
                            name->valuestring);
    out->mode = DS_TOOL_CHOICE_NAMED;
    snprintf(out->name, sizeof out->name, "%s", name->valuestring);
    return DS_OK;
}

cJSON *ds_tools_for_prompt(const cJSON *tools, const ds_tool_choice *choice) {
    if (!cJSON_IsArray(tools) || cJSON_GetArraySize(tools) == 0) return NULL;
    if (choice->mode != DS_TOOL_CHOICE_NAMED) return cJSON_Duplicate(tools, 1);
    cJSON *out = cJSON_CreateArray();
    for (const cJSON *t = out ? tools->child : NULL; t; t = t->next) {
        const char *n = tool_name(t);
        if (n && !strcmp(n, choice->name)) cJSON_AddItemToArray(out, cJSON_Duplicate(t, 1));
    }
    return out;
}

void ds_chat_messages_parse_arguments(cJSON *messages) {
    for (cJSON *m = cJSON_IsArray(messages) ? messages->child : NULL; m; m = m->next) {
        cJSON *calls = cJSON_GetObjectItemCaseSensitive(m, "tool_calls");
        for (cJSON *c = cJSON_IsArray(calls) ? calls->child : NULL; c; c = c->next) {
            cJSON *f = cJSON_GetObjectItemCaseSensitive(c, "function");
            cJSON *a = cJSON_GetObjectItemCaseSensitive(f, "arguments");
            if (!cJSON_IsString(a)) continue;
            cJSON *obj = cJSON_Parse(a->valuestring);
            if (cJSON_IsObject(obj))
                cJSON_ReplaceItemInObjectCaseSensitive(f, "arguments", obj);
            else
                cJSON_Delete(obj);
        }
    }
}

ds_tool_format ds_tool_format_detect(const char *template_text) {
    return template_text && strstr(template_text, "<function=") ? DS_TOOL_FORMAT_XML : DS_TOOL_FORMAT_JSON;
}

char *ds_tool_call_prefill(ds_tool_format format, const char *name, bool reasoning_open) {
    tc_buf b = {0};
    if (reasoning_open) tc_puts(&b, "\n</think>\n\n"); /* an empty reasoning block, closed */
    if (format == DS_TOOL_FORMAT_XML) {
        tc_puts(&b, "<tool_call>\n<function=");
        tc_puts(&b, name);
        tc_puts(&b, ">\n");
    } else {
        tc_puts(&b, "<tool_call>\n{\"name\": ");
        tc_json_string(&b, name, strlen(name));
        tc_puts(&b, ", \"arguments\": ");
    }
    if (b.oom) {
        tc_free(&b);
        return NULL;
    }
    return b.p;
}

bool ds_chat_prompt_opens_reasoning(const char *prompt, size_t len) {
    size_t n = len;
    while (n && (prompt[n - 1] == '\n' || prompt[n - 1] == ' ' || prompt[n - 1] == '\r' || prompt[n - 1] == '\t'))
        n--;
    static const char open[] = "<think>";
    return n >= sizeof open - 1 && !memcmp(prompt + n - (sizeof open - 1), open, sizeof open - 1);
}
