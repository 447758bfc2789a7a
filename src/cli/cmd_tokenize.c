/* deltaserve tokenize / detokenize:
 *   deltaserve tokenize --tokenizer PATH (--text S | --text-file F) [--no-special]
 *       prints the ids as a JSON array
 *   deltaserve detokenize --tokenizer PATH --tokens 1,2,3 [--skip-special]
 *       prints the text
 * PATH is a tokenizer.json file or a model directory holding one. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/args.h"
#include "cli/cli_cmds.h"
#include "tokenizer/tokenizer.h"

#define TOKENIZE_MAX_FILE (256u << 20) /* refuse text files over 256 MiB */

static char *read_text_file(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap);
    while (buf) {
        size_t got = fread(buf + n, 1, cap - n, f);
        n += got;
        if (got == 0) break;
        if (n == cap) {
            if (cap >= TOKENIZE_MAX_FILE) {
                free(buf);
                buf = NULL;
                break;
            }
            char *grown = realloc(buf, cap * 2);
            if (!grown) {
                free(buf);
                buf = NULL;
                break;
            }
            buf = grown;
            cap *= 2;
        }
    }
    bool failed = ferror(f);
    fclose(f);
    if (failed) {
        free(buf);
        return NULL;
    }
    *len = n;
    return buf;
}

int ds_cmd_tokenize(int argc, char **argv) {
    const char *cmd = "tokenize", *path = NULL, *text = NULL, *text_file = NULL;
    bool bad = false, special = true;
    for (int i = 1; i < argc && !bad; i++) {
        const char *v;
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            printf("usage: deltaserve tokenize --tokenizer PATH (--text S | --text-file F) "
                   "[--no-special]\n");
            return 0;
        } else if (!strcmp(argv[i], "--no-special")) {
            special = false;
        } else if ((v = ds_arg_value(argc, argv, &i, "--tokenizer", cmd, &bad))) {
            path = v;
        } else if ((v = ds_arg_value(argc, argv, &i, "--text", cmd, &bad))) {
            text = v;
        } else if ((v = ds_arg_value(argc, argv, &i, "--text-file", cmd, &bad))) {
            text_file = v;
        } else if (!bad) {
            fprintf(stderr, "deltaserve tokenize: unknown option '%s'\n", argv[i]);
            return 2;
        }
    }
    if (bad) return 2;
    if (!path || (!text == !text_file)) {
        fprintf(stderr, "deltaserve tokenize: --tokenizer PATH and exactly one of --text / "
                        "--text-file are required\n");
        return 2;
    }
    size_t len = 0;
    char *owned = NULL;
    if (text_file) {
        owned = read_text_file(text_file, &len);
        if (!owned) {
            fprintf(stderr, "deltaserve tokenize: --text-file: cannot read '%s'\n", text_file);
            return 1;
        }
        text = owned;
    } else {
        len = strlen(text);
    }
    ds_error err = {0};
    ds_tokenizer *tok = NULL;
    int32_t *ids = NULL;
    size_t n = 0;
    int rc = 1;
    if (ds_tokenizer_load(path, &tok, &err) == DS_OK &&
        ds_tokenizer_encode(tok, text, len, special, &ids, &n, &err) == DS_OK) {
        putchar('[');
        for (size_t i = 0; i < n; i++) printf(i ? ",%d" : "%d", ids[i]);
        printf("]\n");
        rc = 0;
    } else {
        fprintf(stderr, "deltaserve tokenize: %s\n", err.msg);
    }
    free(ids);
    ds_tokenizer_free(tok);
    free(owned);
    return rc;
}

int ds_cmd_detokenize(int argc, char **argv) {
    const char *cmd = "detokenize", *path = NULL, *tokens = NULL;
    bool bad = false, skip_special = false;
    for (int i = 1; i < argc && !bad; i++) {
        const char *v;
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            printf("usage: deltaserve detokenize --tokenizer PATH --tokens ID,ID,... "
                   "[--skip-special]\n");
            return 0;
        } else if (!strcmp(argv[i], "--skip-special")) {
            skip_special = true;
        } else if ((v = ds_arg_value(argc, argv, &i, "--tokenizer", cmd, &bad))) {
            path = v;
        } else if ((v = ds_arg_value(argc, argv, &i, "--tokens", cmd, &bad))) {
            tokens = v;
        } else if (!bad) {
            fprintf(stderr, "deltaserve detokenize: unknown option '%s'\n", argv[i]);
            return 2;
        }
    }
    if (bad) return 2;
    if (!path || !tokens) {
        fprintf(stderr, "deltaserve detokenize: --tokenizer PATH and --tokens are required\n");
        return 2;
    }
    ds_error err = {0};
    ds_tokenizer *tok = NULL;
    if (ds_tokenizer_load(path, &tok, &err) != DS_OK) {
        fprintf(stderr, "deltaserve detokenize: %s\n", err.msg);
        return 1;
    }
    int32_t *ids = NULL;
    size_t n = 0;
    int rc = 2;
    if (ds_arg_ids(cmd, "--tokens", tokens, (long)ds_tokenizer_vocab_size(tok), &ids, &n)) {
        char *text = NULL;
        size_t len = 0;
        if (ds_tokenizer_decode(tok, ids, n, skip_special, &text, &len, &err) == DS_OK) {
            fwrite(text, 1, len, stdout);
            putchar('\n');
            rc = 0;
        } else {
            fprintf(stderr, "deltaserve detokenize: %s\n", err.msg);
            rc = 1;
        }
        free(text);
    }
    free(ids);
    ds_tokenizer_free(tok);
    return rc;
}
