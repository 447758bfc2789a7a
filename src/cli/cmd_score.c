/* deltaserve score — teacher-forced logits of a token sequence:
 *   deltaserve score -m DIR --tokens 1,2,3 [--logits-out FILE] [--device D] [--threads N]
 * prints one JSON object per position {"pos":i,"argmax":id,"logsumexp":x}; --logits-out writes
 * float32 logits row-major [n_tokens × vocab_size]. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/args.h"
#include "cli/cli_cmds.h"
#include "cli/engine.h"

static void usage(FILE *f) {
    fprintf(f, "usage: deltaserve score -m DIR --tokens ID,ID,... [--logits-out FILE]\n"
               "                        [--device cpu|cuda|auto] [--threads N]\n");
}

int ds_cmd_score(int argc, char **argv) {
    const char *cmd = "score", *tokens_arg = NULL, *logits_out = NULL;
    ds_cli_engine_opts o = {.max_tokens = 256, .max_out = 256};
    bool bad = false;
    for (int i = 1; i < argc && !bad; i++) {
        const char *v;
        long n;
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            usage(stdout);
            return 0;
        } else if ((v = ds_arg_value(argc, argv, &i, "-m", cmd, &bad))) {
            o.model_dir = v;
        } else if ((v = ds_arg_value(argc, argv, &i, "--tokens", cmd, &bad))) {
            tokens_arg = v;
        } else if ((v = ds_arg_value(argc, argv, &i, "--logits-out", cmd, &bad))) {
            logits_out = v;
        } else if ((v = ds_arg_value(argc, argv, &i, "--device", cmd, &bad))) {
            o.device = v;
        } else if ((v = ds_arg_value(argc, argv, &i, "--threads", cmd, &bad))) {
            if (!ds_arg_int(cmd, "--threads", v, 0, 1024, &n)) return 2;
            o.threads = (int)n;
        } else if (!bad) {
            fprintf(stderr, "deltaserve score: unknown option '%s'\n", argv[i]);
            usage(stderr);
            return 2;
        }
    }
    if (bad) return 2;
    if (!o.model_dir || !tokens_arg) {
        fprintf(stderr, "deltaserve score: -m DIR and --tokens are required\n");
        usage(stderr);
        return 2;
    }
    int32_t *ids = NULL;
    size_t n_ids = 0;
    if (!ds_arg_ids(cmd, "--tokens", tokens_arg, 0, &ids, &n_ids)) return 2;

    ds_cli_engine e;
    o.max_len = (int)n_ids;
    if (!ds_cli_engine_open(&e, &o, cmd)) {
        free(ids);
        return 1;
    }
    int rc = 0;
    const size_t V = (size_t)e.cfg.vocab;
    for (size_t i = 0; i < n_ids; i++)
        if (ids[i] >= e.cfg.vocab) {
            fprintf(stderr, "deltaserve score: --tokens: id %d is outside the vocabulary (%zu)\n",
                    ids[i], V);
            rc = 2;
            goto done;
        }
    float *logits = malloc(n_ids * V * sizeof(float));
    if (!logits) {
        fprintf(stderr, "deltaserve score: out of memory for %zu x %zu logits\n", n_ids, V);
        rc = 1;
        goto done;
    }
    ds_error err = {0};
    if (ds_session_feed(&e.sess, 0, ids, (int)n_ids, true, logits, &err) != DS_OK) {
        fprintf(stderr, "deltaserve score: %s\n", err.msg);
        rc = 1;
    } else {
        for (size_t p = 0; p < n_ids; p++) {
            const float *row = logits + p * V;
            size_t best = 0;
            for (size_t v = 1; v < V; v++)
                if (row[v] > row[best]) best = v;
            double mx = row[best], sum = 0;
            for (size_t v = 0; v < V; v++) sum += exp((double)row[v] - mx);
            printf("{\"pos\":%zu,\"argmax\":%zu,\"logsumexp\":%.7g}\n", p, best, mx + log(sum));
        }
        if (logits_out) {
            FILE *f = fopen(logits_out, "wb");
            if (!f || fwrite(logits, sizeof(float), n_ids * V, f) != n_ids * V) {
                fprintf(stderr, "deltaserve score: --logits-out: cannot write '%s'\n", logits_out);
                rc = 1;
            }
            if (f && fclose(f) != 0) rc = 1;
        }
    }
    free(logits);
done:
    ds_cli_engine_close(&e);
    free(ids);
    return rc;
}
