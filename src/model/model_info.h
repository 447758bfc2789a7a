/* model_info.h — sizes derived from a ds_config (for `deltaserve info`, pool sizing, roofline).
 *
 * Parameter counts follow the checkpoint tensors exactly (every weight the loader reads,
 * including norms, A_log, dt_bias, the conv kernel and routers). "Active" parameters are the
 * ones one decode token reads: every non-expert weight, top_k routed experts, the shared expert,
 * and the lm_head matrix — but not the embedding table, of which a token reads one row. For
 * Qwen3.5-35B-A3B this gives ≈2.95 B active (incl. the 0.51 B lm_head). */
#ifndef DS_MODEL_INFO_H
#define DS_MODEL_INFO_H

#include <stddef.h>
#include <stdint.h>

#include "core/tensor.h"
#include "model/config.h"
#include "model/weights.h"

typedef struct ds_model_info {
    int n_full_layers;         /* gated attention layers */
    int n_linear_layers;       /* Gated DeltaNet layers */
    int64_t params_embed;      /* V·H */
    int64_t params_lm_head;    /* V·H when untied, 0 when tied (it is the embedding) */
    int64_t params_layers;     /* all decoder layers (all experts) */
    int64_t params_total;      /* embed + lm_head + layers + final norm (MTP excluded) */
    int64_t params_active;     /* per decode token, see above (MTP excluded) */
    int64_t params_mtp;        /* one MTP layer + fc + its norms (0 when cfg->n_mtp_layers == 0) */
    size_t kv_bytes_per_token; /* K and V of every attention layer, at kv_dtype */
    size_t gdn_state_bytes; /* per sequence: fp32 recurrent state Hv·dk·dv of every GDN layer */
    size_t gdn_conv_bytes;  /* per sequence: (K−1) conv inputs per channel, at conv_dtype */
} ds_model_info;

/* Fills *out from cfg; kv_dtype and conv_dtype are the cache element types (bf16 on CUDA). */
void ds_model_info_compute(const ds_config *cfg, ds_dtype kv_dtype, ds_dtype conv_dtype,
                           ds_model_info *out);

/* Parameters of one decoder layer of the given type (all experts / only the active ones). */
int64_t ds_model_layer_params(const ds_config *cfg, ds_layer_type type, bool active_only);

/* Bytes of host memory the loaded weights reference (each matrix counted once: a tied lm_head
 * is not counted twice), including the MTP head when present. */
size_t ds_model_weights_nbytes(const ds_config *cfg, const ds_model_weights *w);

#endif
