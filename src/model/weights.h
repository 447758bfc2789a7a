/* weights.h — the model's weights as plain data: views into memory-mapped safetensors files
 * (host) or into backend memory (after ds_backend_ops.prepare_weights).
 *
 * Conventions fixed at load time (catalogue item 10: constant work hoisted out of the step):
 *  - Every RMSNorm weight is an F32 vector that is multiplied as-is: zero-centred norms
 *    (input/post/final, q_norm/k_norm, MTP norms) already hold (1 + w); the GDN gated norm holds
 *    its plain w.
 *  - GDN `A_log` is stored as neg_exp_A = -exp(A_log) (F32), `dt_bias` as F32, the depthwise conv
 *    weight as F32 [conv_dim, kernel].
 *  - Projections that share an input are one ds_linear of several parts whose outputs are
 *    concatenated in part order; a backend may fuse the parts into one matrix.
 *  - Large matrices keep their checkpoint dtype (bf16/f16/f32) on the host. */
#ifndef DS_WEIGHTS_H
#define DS_WEIGHTS_H

#include "core/tensor.h"
#include "model/config.h"

#define DS_LINEAR_MAX_PARTS 4

/* y[T, n_out] = x[T, n_in] · Wᵀ where W = the parts stacked along rows. */
typedef struct ds_linear {
    int n_parts;
    ds_tensor parts[DS_LINEAR_MAX_PARTS]; /* each [N_i, n_in] */
    int64_t n_out;                        /* Σ N_i */
    int64_t n_in;
} ds_linear;

typedef struct ds_attn_weights {
    ds_linear qkv;    /* parts: q_proj [nh·hd·2, H] (per head: hd query then hd gate),
                         k_proj [nkv·hd, H], v_proj [nkv·hd, H] */
    ds_tensor q_norm; /* F32 [hd], (1+w) */
    ds_tensor k_norm; /* F32 [hd], (1+w) */
    ds_linear o;      /* o_proj [H, nh·hd] */
} ds_attn_weights;

typedef struct ds_gdn_weights {
    ds_linear in_proj;   /* parts: in_proj_qkv [conv_dim, H] (q|k|v, head-major),
                            in_proj_z [Hv·dv, H], in_proj_b [Hv, H], in_proj_a [Hv, H] */
    ds_tensor conv;      /* F32 [conv_dim, kernel] depthwise causal conv, no bias */
    ds_tensor neg_exp_A; /* F32 [Hv] = -exp(A_log) */
    ds_tensor dt_bias;   /* F32 [Hv] */
    ds_tensor norm;      /* F32 [dv] gated RMSNorm weight (plain w) */
    ds_linear out;       /* out_proj [H, Hv·dv] */
} ds_gdn_weights;

typedef struct ds_mlp_weights {
    ds_linear gate_up; /* parts: gate_proj [I, H], up_proj [I, H] (or one fused [2I, H]) */
    ds_linear down;    /* down_proj [H, I] */
} ds_mlp_weights;

typedef struct ds_moe_weights {
    ds_tensor router;          /* mlp.gate.weight [E, H] */
    int n_experts;
    ds_mlp_weights *experts;   /* [E]; fused checkpoints become per-expert views, no copy */
    bool has_shared;
    ds_mlp_weights shared;     /* shared_expert.{gate,up,down}_proj */
    ds_tensor shared_gate;     /* shared_expert_gate.weight [1, H] */
} ds_moe_weights;

typedef struct ds_layer_weights {
    ds_layer_type type;
    ds_tensor input_norm; /* F32 [H], (1+w) */
    ds_tensor post_norm;  /* F32 [H], (1+w) */
    ds_attn_weights attn; /* type == FULL_ATTN */
    ds_gdn_weights gdn;   /* type == LINEAR_ATTN */
    ds_moe_weights moe;   /* cfg.is_moe */
    ds_mlp_weights mlp;   /* !cfg.is_moe */
} ds_layer_weights;

typedef struct ds_mtp_weights {
    ds_linear fc;              /* mtp.fc.weight [H, 2H]: input [embedding ; hidden] */
    ds_tensor norm_embedding;  /* F32 [H], (1+w) */
    ds_tensor norm_hidden;     /* F32 [H], (1+w) */
    ds_tensor final_norm;      /* mtp.norm F32 [H], (1+w) */
    ds_layer_weights layer;    /* mtp.layers.0 (full attention + the model's FFN type) */
} ds_mtp_weights;

typedef struct ds_model_weights {
    ds_tensor embed;          /* embed_tokens [V, H] */
    ds_tensor final_norm;     /* F32 [H], (1+w) */
    ds_linear lm_head;        /* [V, H]; a view of embed when tied */
    int n_layers;
    ds_layer_weights *layers; /* [n_layers] */
    ds_mtp_weights *mtp;      /* NULL when the checkpoint has no mtp.* tensors */
    void *owner;              /* loader-private storage (mmaps, f32 copies); freed by its owner */
} ds_model_weights;

#endif
