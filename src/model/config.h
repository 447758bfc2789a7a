/* config.h — the text model's shape, parsed from a Hugging Face config.json.
 *
 * Accepts the nested multimodal form (`text_config` inside a `qwen3_5_moe` / `qwen3_5`
 * config) and a flat text-only config (`qwen3_5_moe_text` / `qwen3_5_text`). Field names follow
 * transformers' Qwen3_5TextConfig / Qwen3_5MoeTextConfig. */
#ifndef DS_CONFIG_H
#define DS_CONFIG_H

#include <stdbool.h>

#include "core/status.h"

#define DS_MAX_LAYERS 256
#define DS_MAX_EOS 8

typedef enum ds_layer_type {
    DS_LAYER_LINEAR_ATTN = 0, /* Gated DeltaNet */
    DS_LAYER_FULL_ATTN = 1,   /* gated softmax attention */
} ds_layer_type;

typedef struct ds_config {
    char model_type[48];       /* top-level model_type as written in the file */
    bool is_moe;               /* qwen3_5_moe* → sparse MoE FFN; qwen3_5* → dense SwiGLU MLP */

    int hidden;                /* hidden_size */
    int n_layers;              /* num_hidden_layers */
    int vocab;                 /* vocab_size */
    double rms_eps;            /* rms_norm_eps */
    int max_position;          /* max_position_embeddings */
    bool tie_embeddings;       /* tie_word_embeddings (top level or text_config) */
    ds_layer_type layer_types[DS_MAX_LAYERS];

    /* gated attention */
    int n_heads;               /* num_attention_heads */
    int n_kv_heads;            /* num_key_value_heads */
    int head_dim;              /* head_dim */
    int rot_dim;               /* head_dim * partial_rotary_factor, even */
    double rope_theta;         /* rope_parameters.rope_theta (or rope_theta) */
    bool attn_output_gate;     /* attn_output_gate (default true) */

    /* Gated DeltaNet */
    int gdn_k_heads;           /* linear_num_key_heads */
    int gdn_v_heads;           /* linear_num_value_heads */
    int gdn_k_dim;             /* linear_key_head_dim */
    int gdn_v_dim;             /* linear_value_head_dim */
    int gdn_conv_kernel;       /* linear_conv_kernel_dim */

    /* FFN */
    int n_experts;             /* num_experts (MoE) */
    int top_k;                 /* num_experts_per_tok */
    int moe_inter;             /* moe_intermediate_size */
    int shared_inter;          /* shared_expert_intermediate_size (0 = none) */
    bool norm_topk_prob;       /* renormalise top-k weights (default true) */
    int mlp_inter;             /* intermediate_size (dense) */

    int n_mtp_layers;          /* mtp_num_hidden_layers (0 when absent) */

    int eos_ids[DS_MAX_EOS];   /* eos_token_id(s) from config/generation_config */
    int n_eos;
} ds_config;

/* Derived sizes. */
static inline int ds_config_gdn_conv_dim(const ds_config *c) {
    return 2 * c->gdn_k_heads * c->gdn_k_dim + c->gdn_v_heads * c->gdn_v_dim;
}

/* Parses DIR/config.json (and DIR/generation_config.json for eos ids when present). */
ds_status ds_config_load(const char *model_dir, ds_config *cfg, ds_error *err);

/* Parses config JSON text already in memory (used by the loader, tests and --dummy-weights).
 * `origin` names the file in error messages. */
ds_status ds_config_parse(const char *json_text, const char *origin, ds_config *cfg, ds_error *err);

#endif
