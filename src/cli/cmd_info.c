/* deltaserve info -m DIR — the model's shape, parameter counts and memory needs, from
 * config.json alone (no weights are read, so it is instant even for a 70 GB checkpoint). */
#include <stdio.h>
#include <string.h>

#include "cli/args.h"
#include "cli/cli_cmds.h"
#include "model/config.h"
#include "model/model_info.h"

static double gib(double bytes) { return bytes / (1024.0 * 1024.0 * 1024.0); }

int ds_cmd_info(int argc, char **argv) {
    const char *cmd = "info", *dir = NULL;
    long ctx = 0;
    bool bad = false;
    for (int i = 1; i < argc && !bad; i++) {
        const char *v;
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            printf("usage: deltaserve info -m DIR [--context N]\n");
            return 0;
        } else if ((v = ds_arg_value(argc, argv, &i, "-m", cmd, &bad))) {
            dir = v;
        } else if ((v = ds_arg_value(argc, argv, &i, "--context", cmd, &bad))) {
            if (!ds_arg_int(cmd, "--context", v, 1, 1L << 30, &ctx)) return 2;
        } else if (!bad) {
            fprintf(stderr, "deltaserve info: unknown option '%s'\n", argv[i]);
            return 2;
        }
    }
    if (bad) return 2;
    if (!dir) {
        fprintf(stderr, "deltaserve info: -m DIR is required\n");
        return 2;
    }
    ds_config c;
    ds_error err = {0};
    if (ds_config_load(dir, &c, &err) != DS_OK) {
        fprintf(stderr, "deltaserve info: %s\n", err.msg);
        return 1;
    }
    ds_model_info mi;
    ds_model_info_compute(&c, DS_DTYPE_BF16, DS_DTYPE_BF16, &mi);
    if (ctx == 0) ctx = c.max_position;

    printf("model_type        %s (%s)\n", c.model_type, c.is_moe ? "MoE" : "dense");
    printf("layers            %d (%d Gated DeltaNet + %d gated attention)\n", c.n_layers,
           mi.n_linear_layers, mi.n_full_layers);
    printf("hidden            %d, vocab %d, rms_eps %g, max_position %d\n", c.hidden, c.vocab,
           c.rms_eps, c.max_position);
    printf("attention         %d q heads / %d kv heads x %d, rotary %d dims, theta %g, "
           "output gate %s\n",
           c.n_heads, c.n_kv_heads, c.head_dim, c.rot_dim, c.rope_theta,
           c.attn_output_gate ? "on" : "off");
    printf("gated deltanet    %d key heads x %d, %d value heads x %d, conv kernel %d\n",
           c.gdn_k_heads, c.gdn_k_dim, c.gdn_v_heads, c.gdn_v_dim, c.gdn_conv_kernel);
    if (c.is_moe)
        printf("moe               %d experts, top-%d, expert intermediate %d, shared expert %d\n",
               c.n_experts, c.top_k, c.moe_inter, c.shared_inter);
    else
        printf("mlp               intermediate %d\n", c.mlp_inter);
    printf("embeddings        %s\n", c.tie_embeddings ? "tied" : "untied lm_head");
    printf("mtp layers        %d\n", c.n_mtp_layers);
    printf("parameters        %.3f B total, %.3f B active per token, %.3f B MTP\n",
           (double)mi.params_total * 1e-9, (double)mi.params_active * 1e-9,
           (double)mi.params_mtp * 1e-9);
    printf("weights (bf16)    %.2f GiB (+ %.2f GiB MTP)\n", gib(2.0 * (double)mi.params_total),
           gib(2.0 * (double)mi.params_mtp));
    printf("decode reads      %.2f GB per token at batch 1 (bf16 active weights + fp32 GDN "
           "state read and written)\n",
           (2.0 * (double)mi.params_active + 2.0 * (double)mi.gdn_state_bytes) * 1e-9);
    printf("kv cache (bf16)   %.1f KiB per token, %.2f GiB for one %ld-token sequence\n",
           (double)mi.kv_bytes_per_token / 1024.0, gib((double)mi.kv_bytes_per_token * (double)ctx),
           ctx);
    printf("gdn state         %.1f MiB per sequence (fp32) + %.2f MiB conv history (bf16)\n",
           (double)mi.gdn_state_bytes / (1024.0 * 1024.0),
           (double)mi.gdn_conv_bytes / (1024.0 * 1024.0));
    return 0;
}
