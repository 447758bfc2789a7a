/* model_info.c — parameter, byte and cache-size arithmetic from the config. */
#include "model/model_info.h"

static int64_t mi_attn(const ds_config *c) {
    const int64_t H = c->hidden, hd = c->head_dim;
    const int64_t q = (int64_t)c->n_heads * hd * (c->attn_output_gate ? 2 : 1);
    const int64_t kv = (int64_t)c->n_kv_heads * hd;
    return (q + 2 * kv) * H + H * (int64_t)c->n_heads * hd + 2 * hd; /* + q_norm, k_norm */
}

static int64_t mi_gdn(const ds_config *c) {
    const int64_t H = c->hidden, Hv = c->gdn_v_heads, dv = c->gdn_v_dim;
    const int64_t C = ds_config_gdn_conv_dim(c);
    return (C + Hv * dv + 2 * Hv) * H /* in_proj qkv | z | b | a */
           + C * c->gdn_conv_kernel   /* conv1d */
           + 2 * Hv + dv              /* A_log, dt_bias, norm */
           + H * Hv * dv;             /* out_proj */
}

static int64_t mi_ffn(const ds_config *c, bool active_only) {
    const int64_t H = c->hidden;
    if (!c->is_moe) return 3 * H * c->mlp_inter;
    const int64_t expert = 3 * H * c->moe_inter;
    const int64_t n = active_only ? c->top_k : c->n_experts;
    int64_t p = (int64_t)c->n_experts * H + n * expert;        /* router + experts */
    if (c->shared_inter > 0) p += 3 * H * c->shared_inter + H; /* shared expert + its gate */
    return p;
}

int64_t ds_model_layer_params(const ds_config *cfg, ds_layer_type type, bool active_only) {
    const int64_t mixer = type == DS_LAYER_FULL_ATTN ? mi_attn(cfg) : mi_gdn(cfg);
    return 2 * (int64_t)cfg->hidden + mixer + mi_ffn(cfg, active_only);
}

void ds_model_info_compute(const ds_config *cfg, ds_dtype kv_dtype, ds_dtype conv_dtype,
                           ds_model_info *out) {
    ds_model_info m = {0};
    const int64_t H = cfg->hidden, V = cfg->vocab;
    int64_t active_layers = 0;
    for (int i = 0; i < cfg->n_layers; i++) {
        ds_layer_type t = cfg->layer_types[i];
        if (t == DS_LAYER_FULL_ATTN)
            m.n_full_layers++;
        else
            m.n_linear_layers++;
        m.params_layers += ds_model_layer_params(cfg, t, false);
        active_layers += ds_model_layer_params(cfg, t, true);
    }
    m.params_embed = V * H;
    m.params_lm_head = cfg->tie_embeddings ? 0 : V * H;
    m.params_total = m.params_embed + m.params_lm_head + m.params_layers + H;
    m.params_active = V * H /* lm_head, tied or not */ + active_layers + H;
    if (cfg->n_mtp_layers > 0)
        m.params_mtp = 2 * H * H + 3 * H + ds_model_layer_params(cfg, DS_LAYER_FULL_ATTN, false);
    m.kv_bytes_per_token = (size_t)m.n_full_layers * 2 * (size_t)cfg->n_kv_heads *
                           (size_t)cfg->head_dim * ds_dtype_size(kv_dtype);
    m.gdn_state_bytes = (size_t)m.n_linear_layers * (size_t)cfg->gdn_v_heads *
                        (size_t)cfg->gdn_k_dim * (size_t)cfg->gdn_v_dim * sizeof(float);
    m.gdn_conv_bytes = (size_t)m.n_linear_layers * (size_t)ds_config_gdn_conv_dim(cfg) *
                       (size_t)(cfg->gdn_conv_kernel - 1) * ds_dtype_size(conv_dtype);
    *out = m;
}

static size_t mi_t(const ds_tensor *t) { return t->data ? ds_tensor_nbytes(t) : 0; }

static size_t mi_lin(const ds_linear *l) {
    size_t n = 0;
    for (int i = 0; i < l->n_parts; i++) n += mi_t(&l->parts[i]);
    return n;
}

static size_t mi_mlp(const ds_mlp_weights *m) { return mi_lin(&m->gate_up) + mi_lin(&m->down); }

static size_t mi_layer(const ds_config *cfg, const ds_layer_weights *l) {
    size_t n = mi_t(&l->input_norm) + mi_t(&l->post_norm);
    if (l->type == DS_LAYER_FULL_ATTN) {
        n += mi_lin(&l->attn.qkv) + mi_lin(&l->attn.o) + mi_t(&l->attn.q_norm) +
             mi_t(&l->attn.k_norm);
    } else {
        const ds_gdn_weights *g = &l->gdn;
        n += mi_lin(&g->in_proj) + mi_t(&g->conv) + mi_t(&g->neg_exp_A) + mi_t(&g->dt_bias) +
             mi_t(&g->norm) + mi_lin(&g->out);
    }
    if (cfg->is_moe) {
        const ds_moe_weights *m = &l->moe;
        n += mi_t(&m->router);
        for (int e = 0; e < m->n_experts; e++) n += mi_mlp(&m->experts[e]);
        if (m->has_shared) n += mi_mlp(&m->shared) + mi_t(&m->shared_gate);
    } else {
        n += mi_mlp(&l->mlp);
    }
    return n;
}

size_t ds_model_weights_nbytes(const ds_config *cfg, const ds_model_weights *w) {
    size_t n = mi_t(&w->embed) + mi_t(&w->final_norm);
    for (int i = 0; i < w->lm_head.n_parts; i++)
        if (w->lm_head.parts[i].data != w->embed.data) n += mi_t(&w->lm_head.parts[i]);
    for (int i = 0; i < w->n_layers; i++) n += mi_layer(cfg, &w->layers[i]);
    if (w->mtp) {
        n += mi_lin(&w->mtp->fc) + mi_t(&w->mtp->norm_embedding) + mi_t(&w->mtp->norm_hidden) +
             mi_t(&w->mtp->final_norm) + mi_layer(cfg, &w->mtp->layer);
    }
    return n;
}
