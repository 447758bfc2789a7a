/* loader.h — a Hugging Face model directory → ds_config + host ds_model_weights.
 *
 * Tensor names (text weights under P = "model.language_model." for the multimodal layout or
 * "model." for a text-only checkpoint; P is detected once from where embed_tokens lives):
 *   P embed_tokens.weight [V, H], P norm.weight [H], lm_head.weight [V, H] (unless tied)
 *   P layers.i.{input_layernorm,post_attention_layernorm}.weight [H]
 *   linear-attention layers: P layers.i.linear_attn.
 *       in_proj_qkv.weight [conv_dim, H], in_proj_z.weight [Hv·dv, H], in_proj_b.weight [Hv, H],
 *       in_proj_a.weight [Hv, H], conv1d.weight [conv_dim, 1, K] (or [conv_dim, K]),
 *       A_log [Hv], dt_bias [Hv] (no .weight suffix), norm.weight [dv], out_proj.weight [H, Hv·dv]
 *   full-attention layers: P layers.i.self_attn.
 *       q_proj.weight [nh·hd·2, H] ([nh·hd, H] without output gate), k_proj/v_proj.weight
 *       [nkv·hd, H], o_proj.weight [H, nh·hd], q_norm/k_norm.weight [hd]
 *   MoE: P layers.i.mlp.gate.weight [E, H]; experts either fused
 *       mlp.experts.gate_up_proj [E, 2I, H] + mlp.experts.down_proj [E, H, I] (per-expert views,
 *       no copy) or per-expert mlp.experts.e.{gate,up,down}_proj.weight; shared expert
 *       mlp.shared_expert.{gate,up,down}_proj.weight + mlp.shared_expert_gate.weight [1, H]
 *       (required iff shared_expert_intermediate_size > 0)
 *   dense: P layers.i.mlp.{gate,up,down}_proj.weight
 *   MTP (loaded when any "mtp." tensor exists): mtp.fc.weight [H, 2H],
 *       mtp.pre_fc_norm_embedding.weight, mtp.pre_fc_norm_hidden.weight, mtp.norm.weight [H],
 *       mtp.layers.0.* named like a decoder layer (full attention + the model's FFN type).
 * Everything else (model.visual.*, extra mtp layers, rotary buffers) is ignored.
 *
 * Conventions of weights.h are applied here: zero-centred norms → F32 (1 + w), GDN norm → F32 w,
 * A_log → F32 −exp(A_log), dt_bias → F32, conv1d → F32 [conv_dim, K]. Large matrices stay views
 * into the memory-mapped files in their checkpoint dtype (copied to aligned memory only in the
 * rare case a tensor's offset is not a multiple of its element size).
 *
 * Every tensor's shape is checked against the config; a missing or mis-shaped tensor fails with
 * DS_ERR_FORMAT naming the tensor, its file, and the expected and actual shapes. */
#ifndef DS_LOADER_H
#define DS_LOADER_H

#include "core/status.h"
#include "model/config.h"
#include "model/weights.h"

/* Parses DIR/config.json (+ generation_config.json) into *cfg and loads every weight into *w.
 * On failure *w is zeroed and nothing is leaked. Free with ds_model_weights_free. */
ds_status ds_model_load(const char *dir, ds_config *cfg, ds_model_weights *w, ds_error *err);

/* Same, for a config the caller already has (tests, tools). */
ds_status ds_model_load_weights(const char *dir, const ds_config *cfg, ds_model_weights *w,
                                ds_error *err);

/* Releases the mappings and F32 copies held by w->owner and zeroes *w. Safe on a zeroed struct. */
void ds_model_weights_free(ds_model_weights *w);

#endif
