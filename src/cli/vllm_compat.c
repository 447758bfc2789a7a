#include "cli/vllm_compat.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

char **ds_vllm_normalize_args(int argc, char **argv) {
    char **out = calloc((size_t)argc + 1, sizeof *out);
    if (!out) return NULL;
    for (int i = 0; i < argc; i++) {
        out[i] = strdup(argv[i]);
        if (!out[i]) {
            ds_vllm_args_free(i, out);
            return NULL;
        }
        if (strncmp(out[i], "--", 2) != 0) continue;
        /* the name only: "--served_model_name=my_model" keeps its value's underscores */
        for (char *p = out[i] + 2; *p && *p != '='; p++)
            if (*p == '_') *p = '-';
    }
    return out;
}

void ds_vllm_args_free(int argc, char **args) {
    if (!args) return;
    for (int i = 0; i < argc; i++) free(args[i]);
    free(args);
}

static bool spec_fail(const char *why, const char *detail) {
    fprintf(stderr, "deltaserve serve: --speculative-config: %s%s\n", why, detail ? detail : "");
    return false;
}

bool ds_vllm_spec_config(const char *json, int max_k, int *k) {
    cJSON *root = cJSON_Parse(json);
    if (!root) return spec_fail("not valid JSON: ", json);
    bool ok = false;
    if (!cJSON_IsObject(root)) {
        spec_fail("must be a JSON object", NULL);
        goto done;
    }
    const cJSON *method = cJSON_GetObjectItemCaseSensitive(root, "method");
    if (method) {
        static const char *const MTP[] = {"mtp", "qwen3_next_mtp", "qwen3_5_mtp"};
        bool known = false;
        for (size_t i = 0; cJSON_IsString(method) && i < sizeof MTP / sizeof MTP[0]; i++)
            known |= strcmp(method->valuestring, MTP[i]) == 0;
        if (!known) {
            fprintf(stderr, "deltaserve serve: --speculative-config: method %s is not supported; "
                            "deltaserve drafts with the model's own MTP head (\"mtp\", "
                            "\"qwen3_next_mtp\" or \"qwen3_5_mtp\")\n",
                    cJSON_IsString(method) ? method->valuestring : "(not a string)");
            goto done;
        }
    }
    const cJSON *n = cJSON_GetObjectItemCaseSensitive(root, "num_speculative_tokens");
    if (!n) { /* vLLM then takes the draft model's count: Qwen3.5 has one MTP layer */
        *k = 1;
    } else if (!cJSON_IsNumber(n) || n->valuedouble != floor(n->valuedouble) || n->valuedouble < 0 ||
        n->valuedouble > max_k) {
        fprintf(stderr, "deltaserve serve: --speculative-config: num_speculative_tokens must be "
                        "an integer in [0, %d]\n",
                max_k);
        goto done;
    } else {
        *k = (int)n->valuedouble;
    }
    for (const cJSON *it = root->child; it; it = it->next)
        if (strcmp(it->string, "method") && strcmp(it->string, "num_speculative_tokens"))
            fprintf(stderr, "deltaserve serve: --speculative-config: '%s' has no meaning here, "
                            "ignored\n",
                    it->string);
    ok = true;
done:
    cJSON_Delete(root);
    return ok;
}

bool ds_vllm_parser_ok(const char *opt, const char *value) {
    /* the output parser (chat/tool_calls.h) reads Qwen's <think> blocks and both of Qwen3.5's
     * tool-call forms: the XML one (vLLM's qwen3_coder / qwen3_xml) and the JSON one (hermes) */
    static const char *const REASONING[] = {"qwen3", NULL};
    static const char *const TOOLS[] = {"qwen3_coder", "qwen3_xml", "hermes", NULL};
    const char *const *names = !strcmp(opt, "--reasoning-parser") ? REASONING : TOOLS;
    for (int i = 0; names[i]; i++)
        if (!strcmp(value, names[i])) return true;
    fprintf(stderr, "deltaserve serve: %s: '%s' is not supported; deltaserve parses Qwen3.5's "
                    "output formats (%s)\n",
            opt, value, names == REASONING ? "qwen3" : "qwen3_coder, qwen3_xml or hermes");
    return false;
}

bool ds_vllm_noop_flag(const char *arg) {
    return !strcmp(arg, "--enable-auto-tool-choice") || !strcmp(arg, "--trust-remote-code") ||
           !strcmp(arg, "--language-model-only");
}
