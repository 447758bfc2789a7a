/* deltaserve render-chat: prints the prompt text a checkpoint's chat template renders for a
 * conversation, byte for byte (no newline is added).
 *
 *   deltaserve render-chat -m DIR --messages FILE.json [--tools FILE.json]
 *       [--add-generation-prompt] [--continue-final-message] [--kwargs JSON]
 *       [--template FILE.jinja] [--python-numbers]
 *
 * DIR holds tokenizer_config.json and/or chat_template.jinja (bos_token / eos_token come from
 * the config); without a template there the built-in Qwen3.5 one is used (noted on stderr).
 * --messages: a JSON array of messages, or an object with "messages" (and "tools"); "-" reads
 * stdin. --kwargs: a JSON object of chat_template_kwargs (e.g. '{"enable_thinking": false}').
 * --template overrides the checkpoint's template (then -m is optional). --python-numbers spells
 * numbers as Python / transformers do (1e-05) instead of the reference renderer (0.00001). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/args.h"
#include "cli/cli_cmds.h"
#include "template/chat_template.h"

#define RENDER_MAX_FILE ((size_t)256 << 20)

static char *slurp(const char *path, size_t *len) {
    FILE *f = strcmp(path, "-") ? fopen(path, "rb") : stdin;
    if (!f) return NULL;
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap);
    while (buf) {
        if (n + 1 >= cap) {
            char *g = cap < RENDER_MAX_FILE ? realloc(buf, cap * 2) : NULL;
            if (!g) {
                free(buf);
                buf = NULL;
                break;
            }
            buf = g;
            cap *= 2;
        }
        size_t got = fread(buf + n, 1, cap - n - 1, f);
        n += got;
        if (got == 0) break;
    }
    bool failed = ferror(f);
    if (f != stdin) fclose(f);
    if (failed || !buf) {
        free(buf);
        return NULL;
    }
    buf[n] = 0;
    *len = n;
    return buf;
}

static cJSON *load_json(const char *cmd, const char *opt, const char *path) {
    size_t len = 0;
    char *text = slurp(path, &len);
    if (!text) {
        fprintf(stderr, "deltaserve %s: %s: cannot read '%s'\n", cmd, opt, path);
        return NULL;
    }
    cJSON *j = cJSON_ParseWithLength(text, len);
    free(text);
    if (!j) fprintf(stderr, "deltaserve %s: %s: '%s' is not valid JSON\n", cmd, opt, path);
    return j;
}

static void usage(FILE *f) {
    fprintf(f, "usage: deltaserve render-chat -m DIR --messages FILE.json [--tools FILE.json]\n"
               "         [--add-generation-prompt] [--continue-final-message] [--kwargs JSON]\n"
               "         [--template FILE.jinja] [--python-numbers]\n");
}

int ds_cmd_render_chat(int argc, char **argv) {
    const char *cmd = "render-chat", *dir = NULL, *messages_path = NULL, *tools_path = NULL,
               *kwargs_text = NULL, *template_path = NULL;
    bool bad = false, gen = false, cont = false, py_numbers = false;
    for (int i = 1; i < argc && !bad; i++) {
        const char *v;
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            usage(stdout);
            return 0;
        } else if (!strcmp(argv[i], "--add-generation-prompt")) {
            gen = true;
        } else if (!strcmp(argv[i], "--continue-final-message")) {
            cont = true;
        } else if (!strcmp(argv[i], "--python-numbers")) {
            py_numbers = true;
        } else if ((v = ds_arg_value(argc, argv, &i, "-m", cmd, &bad)) ||
                   (!bad && (v = ds_arg_value(argc, argv, &i, "--model", cmd, &bad)))) {
            dir = v;
        } else if (!bad && (v = ds_arg_value(argc, argv, &i, "--messages", cmd, &bad))) {
            messages_path = v;
        } else if (!bad && (v = ds_arg_value(argc, argv, &i, "--tools", cmd, &bad))) {
            tools_path = v;
        } else if (!bad && (v = ds_arg_value(argc, argv, &i, "--kwargs", cmd, &bad))) {
            kwargs_text = v;
        } else if (!bad && (v = ds_arg_value(argc, argv, &i, "--template", cmd, &bad))) {
            template_path = v;
        } else if (!bad) {
            fprintf(stderr, "deltaserve %s: unknown option '%s'\n", cmd, argv[i]);
            return 2;
        }
    }
    if (bad) return 2;
    if ((!dir && !template_path) || !messages_path) {
        fprintf(stderr, "deltaserve %s: -m DIR (or --template FILE) and --messages FILE are required\n", cmd);
        usage(stderr);
        return 2;
    }
    if (gen && cont) {
        fprintf(stderr, "deltaserve %s: --add-generation-prompt and --continue-final-message "
                        "cannot both be given\n", cmd);
        return 2;
    }
    int rc = 1;
    ds_error err = {0};
    ds_chat_source src = {0};
    ds_chat_template *tpl = NULL;
    cJSON *msgs_doc = NULL, *tools = NULL, *kwargs = NULL;
    char *template_text = NULL, *out = NULL;
    if (kwargs_text) {
        kwargs = cJSON_Parse(kwargs_text);
        if (!kwargs || !cJSON_IsObject(kwargs)) {
            fprintf(stderr, "deltaserve %s: --kwargs: not a JSON object\n", cmd);
            rc = 2;
            goto done;
        }
    }
    if (!(msgs_doc = load_json(cmd, "--messages", messages_path))) goto done;
    const cJSON *messages = msgs_doc, *doc_tools = NULL;
    if (cJSON_IsObject(msgs_doc)) {
        messages = cJSON_GetObjectItemCaseSensitive(msgs_doc, "messages");
        doc_tools = cJSON_GetObjectItemCaseSensitive(msgs_doc, "tools");
    }
    if (!cJSON_IsArray(messages)) {
        fprintf(stderr, "deltaserve %s: --messages: expected a JSON array of messages (or an "
                        "object with \"messages\")\n", cmd);
        goto done;
    }
    if (tools_path && !(tools = load_json(cmd, "--tools", tools_path))) goto done;
    const cJSON *use_tools = tools ? tools : doc_tools;
    if (dir && ds_chat_source_load(dir, &src, &err) != DS_OK) {
        fprintf(stderr, "deltaserve %s: %s\n", cmd, err.msg);
        goto done;
    }
    const char *text;
    size_t text_len;
    if (template_path) {
        if (!(template_text = slurp(template_path, &text_len))) {
            fprintf(stderr, "deltaserve %s: --template: cannot read '%s'\n", cmd, template_path);
            goto done;
        }
        text = template_text;
    } else {
        text = ds_chat_source_pick(&src, cJSON_IsArray(use_tools) && cJSON_GetArraySize(use_tools) > 0);
        if (!text) {
            fprintf(stderr, "deltaserve %s: %s has no chat template; using the built-in Qwen3.5 "
                            "template\n", cmd, dir);
            text = ds_chat_template_qwen35_fallback();
        }
        text_len = strlen(text);
    }
    if (ds_chat_template_compile(text, text_len, &tpl, &err) != DS_OK) {
        fprintf(stderr, "deltaserve %s: %s\n", cmd, err.msg);
        goto done;
    }
    ds_chat_render_opts o = {.messages = messages, .tools = use_tools, .kwargs = kwargs,
                             .add_generation_prompt = gen, .continue_final_message = cont,
                             .bos_token = src.bos_token, .eos_token = src.eos_token,
                             .python_numbers = py_numbers};
    size_t n = 0;
    if (ds_chat_template_render(tpl, &o, &out, &n, &err) != DS_OK) {
        fprintf(stderr, "deltaserve %s: %s\n", cmd, err.msg);
        goto done;
    }
    if (fwrite(out, 1, n, stdout) != n || fflush(stdout) != 0) {
        fprintf(stderr, "deltaserve %s: cannot write the output\n", cmd);
        goto done;
    }
    rc = 0;
done:
    free(out);
    free(template_text);
    ds_chat_template_free(tpl);
    ds_chat_source_free(&src);
    cJSON_Delete(msgs_doc);
    cJSON_Delete(tools);
    cJSON_Delete(kwargs);
    return rc;
}
