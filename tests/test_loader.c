/* test_loader.c — ds_model_load on tiny synthetic checkpoints written with st_writer.h.
 *
 * Every tensor is filled with tv(name, i), a value exactly representable in bf16/f16, so the
 * test knows independently what every element of every loaded weight must be (including the
 * load-time conversions of weights.h: 1 + w norms, −exp(A_log), conv [C,1,K] → [C,K], fused
 * expert views). Layouts covered: MoE fused / per-expert, dense, tied / untied, nested / flat
 * names, one file / index + shards, with / without mtp.*, and the failure modes. */
#include <cjson/cJSON.h>
#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "testlib.h"

#include "model/checkpoint.h"
#include "model/loader.h"
#include "model/model_info.h"
#include "st_writer.h"

/* Tiny shapes: H 16, 4 layers (L L L F), V 32, attention 2 q / 1 kv heads of 8 (rot 2),
 * GDN 2 key / 4 value heads of 4 (conv_dim 32), kernel 4, MoE 4 experts top-2 of 6 + shared 8,
 * dense MLP 12. */
enum {
    H = 16,
    NL = 4,
    V = 32,
    NH = 2,
    NKV = 1,
    HD = 8,
    HK = 2,
    HV = 4,
    DK = 4,
    DVV = 4,
    KC = 4,
    NE = 4,
    TOPK = 2,
    MI = 6,
    SI = 8,
    DI = 12
};
#define CONV_DIM (2 * HK * DK + HV * DVV)

/* ---- the synthetic checkpoint ------------------------------------------------------------- */

static uint32_t name_hash(const char *s) {
    uint32_t h = 2166136261u;
    for (; *s; s++) h = (h ^ (uint8_t)*s) * 16777619u;
    return h;
}

/* Element i of tensor `name`: k/64 with k in [-64, 64], exact in bf16 and f16. */
static float tv(const char *name, int64_t i) {
    uint32_t h = name_hash(name);
    return (float)((int)((h + (uint64_t)i * 7u) % 129u) - 64) / 64.0f;
}

typedef struct spec {
    bool moe, fused, tied, nested, mtp, shared;
    int shards;            /* 0: model.safetensors; 2: index.json + 2 shards */
    ds_dtype big, small;   /* dtype of matrices / of 1-D tensors */
    const char *omit;      /* tensor not written */
    const char *misshape;  /* tensor written with its first dim + 1 */
    const char *int_dtype; /* tensor written as I32 */
    bool missing_shard;    /* the index names a shard file that does not exist */
    bool conv2d;           /* conv1d stored squeezed [C, K] */
    bool keep_order;       /* unsorted data: offsets misaligned for F32 after a 1-elem BF16 */
    bool extras;           /* unused vision / I64 / 5-D tensors alongside */
    bool cfg_no_shared;    /* config omits shared_expert_intermediate_size */
} spec;

typedef struct builder {
    const spec *s;
    stw w[2];
    int n_put;
    int64_t text_params, mtp_params;
    cJSON *weight_map;
} builder;

static void put(builder *b, const char *name, int ndim, int64_t d0, int64_t d1, int64_t d2) {
    const spec *s = b->s;
    if (s->omit && !strcmp(name, s->omit)) return;
    int64_t shape[3] = {d0, d1, d2};
    int64_t n = 1;
    for (int i = 0; i < ndim; i++) n *= shape[i];
    if (!strncmp(name, "mtp.", 4))
        b->mtp_params += n;
    else if (strncmp(name, "model.visual.", 13) && strcmp(name, "zz.pad"))
        b->text_params += n;
    if (s->misshape && !strcmp(name, s->misshape)) shape[0] += 1;
    n = 1;
    for (int i = 0; i < ndim; i++) n *= shape[i];
    int shard = s->shards ? (b->n_put++ % 2) : 0;
    if (s->int_dtype && !strcmp(name, s->int_dtype)) {
        int32_t *iv = calloc((size_t)n, sizeof *iv);
        stw_add_raw(&b->w[shard], name, "I32", ndim, shape, iv, (size_t)n * 4);
        free(iv);
    } else {
        float *v = malloc((size_t)n * sizeof *v);
        for (int64_t i = 0; i < n; i++) v[i] = tv(name, i);
        ds_dtype dt = ndim >= 2 ? s->big : s->small;
        if (!strcmp(name, "zz.pad")) dt = DS_DTYPE_BF16; /* 2 bytes */
        stw_add_f32(&b->w[shard], name, dt, ndim, shape, v);
        free(v);
    }
    if (b->weight_map)
        cJSON_AddStringToObject(b->weight_map, name,
                                shard ? "model-00002-of-00002.safetensors"
                                      : "model-00001-of-00002.safetensors");
}

static void put_mlp(builder *b, const char *base, int inter) {
    char n[256];
    snprintf(n, sizeof n, "%sgate_proj.weight", base);
    put(b, n, 2, inter, H, 0);
    snprintf(n, sizeof n, "%sup_proj.weight", base);
    put(b, n, 2, inter, H, 0);
    snprintf(n, sizeof n, "%sdown_proj.weight", base);
    put(b, n, 2, H, inter, 0);
}

static void put_layer(builder *b, const char *lp, bool full) {
    const spec *s = b->s;
    char n[256];
#define NAME(suffix) (snprintf(n, sizeof n, "%s%s", lp, suffix), n)
    put(b, NAME("input_layernorm.weight"), 1, H, 0, 0);
    put(b, NAME("post_attention_layernorm.weight"), 1, H, 0, 0);
    if (full) {
        put(b, NAME("self_attn.q_proj.weight"), 2, NH * HD * 2, H, 0);
        put(b, NAME("self_attn.k_proj.weight"), 2, NKV * HD, H, 0);
        put(b, NAME("self_attn.v_proj.weight"), 2, NKV * HD, H, 0);
        put(b, NAME("self_attn.o_proj.weight"), 2, H, NH * HD, 0);
        put(b, NAME("self_attn.q_norm.weight"), 1, HD, 0, 0);
        put(b, NAME("self_attn.k_norm.weight"), 1, HD, 0, 0);
    } else {
        put(b, NAME("linear_attn.in_proj_qkv.weight"), 2, CONV_DIM, H, 0);
        put(b, NAME("linear_attn.in_proj_z.weight"), 2, HV * DVV, H, 0);
        put(b, NAME("linear_attn.in_proj_b.weight"), 2, HV, H, 0);
        put(b, NAME("linear_attn.in_proj_a.weight"), 2, HV, H, 0);
        if (s->conv2d)
            put(b, NAME("linear_attn.conv1d.weight"), 2, CONV_DIM, KC, 0);
        else
            put(b, NAME("linear_attn.conv1d.weight"), 3, CONV_DIM, 1, KC);
        put(b, NAME("linear_attn.A_log"), 1, HV, 0, 0);
        put(b, NAME("linear_attn.dt_bias"), 1, HV, 0, 0);
        put(b, NAME("linear_attn.norm.weight"), 1, DVV, 0, 0);
        put(b, NAME("linear_attn.out_proj.weight"), 2, H, HV * DVV, 0);
    }
    if (s->moe) {
        put(b, NAME("mlp.gate.weight"), 2, NE, H, 0);
        if (s->fused) {
            put(b, NAME("mlp.experts.gate_up_proj"), 3, NE, 2 * MI, H);
            put(b, NAME("mlp.experts.down_proj"), 3, NE, H, MI);
        } else {
            for (int e = 0; e < NE; e++) {
                char base[200];
                snprintf(base, sizeof base, "%smlp.experts.%d.", lp, e);
                put_mlp(b, base, MI);
            }
        }
        if (s->shared) {
            char base[200];
            snprintf(base, sizeof base, "%smlp.shared_expert.", lp);
            put_mlp(b, base, SI);
            put(b, NAME("mlp.shared_expert_gate.weight"), 2, 1, H, 0);
        }
    } else {
        char base[200];
        snprintf(base, sizeof base, "%smlp.", lp);
        put_mlp(b, base, DI);
    }
#undef NAME
}

static const char *prefix_of(const spec *s) {
    return s->nested ? "model.language_model." : "model.";
}

static void write_config(const spec *s, const char *dir) {
    cJSON *root = cJSON_CreateObject();
    cJSON *t = root;
    if (s->nested) {
        cJSON_AddStringToObject(root, "model_type", s->moe ? "qwen3_5_moe" : "qwen3_5");
        t = cJSON_AddObjectToObject(root, "text_config");
        cJSON_AddStringToObject(t, "model_type", s->moe ? "qwen3_5_moe_text" : "qwen3_5_text");
    } else {
        cJSON_AddStringToObject(root, "model_type", s->moe ? "qwen3_5_moe_text" : "qwen3_5_text");
    }
    cJSON_AddNumberToObject(t, "hidden_size", H);
    cJSON_AddNumberToObject(t, "num_hidden_layers", NL);
    cJSON_AddNumberToObject(t, "vocab_size", V);
    cJSON_AddNumberToObject(t, "rms_norm_eps", 1e-6);
    cJSON_AddNumberToObject(t, "num_attention_heads", NH);
    cJSON_AddNumberToObject(t, "num_key_value_heads", NKV);
    cJSON_AddNumberToObject(t, "head_dim", HD);
    cJSON_AddNumberToObject(t, "linear_num_key_heads", HK);
    cJSON_AddNumberToObject(t, "linear_num_value_heads", HV);
    cJSON_AddNumberToObject(t, "linear_key_head_dim", DK);
    cJSON_AddNumberToObject(t, "linear_value_head_dim", DVV);
    cJSON_AddNumberToObject(t, "linear_conv_kernel_dim", KC);
    cJSON_AddNumberToObject(t, "full_attention_interval", 4);
    cJSON_AddBoolToObject(s->nested ? root : t, "tie_word_embeddings", s->tied);
    if (s->moe) {
        cJSON_AddNumberToObject(t, "num_experts", NE);
        cJSON_AddNumberToObject(t, "num_experts_per_tok", TOPK);
        cJSON_AddNumberToObject(t, "moe_intermediate_size", MI);
        if (s->shared && !s->cfg_no_shared)
            cJSON_AddNumberToObject(t, "shared_expert_intermediate_size", SI);
    } else {
        cJSON_AddNumberToObject(t, "intermediate_size", DI);
    }
    if (s->mtp) cJSON_AddNumberToObject(t, "mtp_num_hidden_layers", 1);
    cJSON *rp = cJSON_AddObjectToObject(t, "rope_parameters");
    cJSON_AddStringToObject(rp, "rope_type", "default");
    cJSON_AddNumberToObject(rp, "rope_theta", 1e7);
    cJSON_AddNumberToObject(rp, "partial_rotary_factor", 0.25);
    char *js = cJSON_Print(root);
    cJSON_Delete(root);
    char path[512];
    snprintf(path, sizeof path, "%s/config.json", dir);
    assert_int_equal(stw_write_bytes(path, js, strlen(js)), 0);
    free(js);
}

/* Writes the model to a fresh temp dir (dir must hold ≥ 32 bytes). */
static void build_model(const spec *s, char *dir, builder *b) {
    strcpy(dir, "/tmp/ds_ld_XXXXXX");
    assert_non_null(mkdtemp(dir));
    memset(b, 0, sizeof *b);
    b->s = s;
    stw_init(&b->w[0]);
    stw_init(&b->w[1]);
    b->w[0].keep_order = b->w[1].keep_order = s->keep_order;
    cJSON *index = NULL;
    if (s->shards) {
        index = cJSON_CreateObject();
        cJSON_AddObjectToObject(index, "metadata");
        b->weight_map = cJSON_AddObjectToObject(index, "weight_map");
    }
    if (s->keep_order)
        put(b, "zz.pad", 1, 1, 0, 0); /* 2 bytes first: every F32 after is misaligned */
    const char *P = prefix_of(s);
    char n[256], lp[128];
    snprintf(n, sizeof n, "%sembed_tokens.weight", P);
    put(b, n, 2, V, H, 0);
    snprintf(n, sizeof n, "%snorm.weight", P);
    put(b, n, 1, H, 0, 0);
    if (!s->tied) put(b, "lm_head.weight", 2, V, H, 0);
    for (int i = 0; i < NL; i++) {
        snprintf(lp, sizeof lp, "%slayers.%d.", P, i);
        put_layer(b, lp, (i + 1) % 4 == 0);
    }
    if (s->mtp) {
        put(b, "mtp.fc.weight", 2, H, 2 * H, 0);
        put(b, "mtp.pre_fc_norm_embedding.weight", 1, H, 0, 0);
        put(b, "mtp.pre_fc_norm_hidden.weight", 1, H, 0, 0);
        put(b, "mtp.norm.weight", 1, H, 0, 0);
        put_layer(b, "mtp.layers.0.", true);
    }
    if (s->extras) {
        const int64_t s5[5] = {4, 3, 2, 2, 2};
        float v[96] = {0};
        stw_add_f32(&b->w[0], "model.visual.patch_embed.proj.weight", DS_DTYPE_BF16, 5, s5, v);
        const int64_t si[1] = {4};
        const int64_t ids[4] = {0, 1, 2, 3};
        stw_add_raw(&b->w[0], "model.visual.pos_ids", "I64", 1, si, ids, sizeof ids);
        if (b->weight_map) {
            cJSON_AddStringToObject(b->weight_map, "model.visual.patch_embed.proj.weight",
                                    "model-00001-of-00002.safetensors");
            cJSON_AddStringToObject(b->weight_map, "model.visual.pos_ids",
                                    "model-00001-of-00002.safetensors");
        }
    }
    write_config(s, dir);
    char path[512];
    if (s->shards) {
        if (s->missing_shard)
            cJSON_AddStringToObject(b->weight_map, "extra.weight",
                                    "model-00003-of-00003.safetensors");
        char *js = cJSON_Print(index);
        snprintf(path, sizeof path, "%s/model.safetensors.index.json", dir);
        assert_int_equal(stw_write_bytes(path, js, strlen(js)), 0);
        free(js);
        cJSON_Delete(index);
        snprintf(path, sizeof path, "%s/model-00001-of-00002.safetensors", dir);
        assert_int_equal(stw_write(&b->w[0], path), 0);
        snprintf(path, sizeof path, "%s/model-00002-of-00002.safetensors", dir);
        assert_int_equal(stw_write(&b->w[1], path), 0);
    } else {
        snprintf(path, sizeof path, "%s/model.safetensors", dir);
        assert_int_equal(stw_write(&b->w[0], path), 0);
    }
    stw_free(&b->w[0]);
    stw_free(&b->w[1]);
}

static void remove_dir(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return;
    struct dirent *de;
    char path[1024];
    while ((de = readdir(d))) {
        if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, "..")) continue;
        snprintf(path, sizeof path, "%s/%s", dir, de->d_name);
        unlink(path);
    }
    closedir(d);
    rmdir(dir);
}

/* ---- checks --------------------------------------------------------------------------------- */

typedef enum xf { XF_PLAIN, XF_PLUS_ONE, XF_NEG_EXP } xf;

static float expect_val(const char *name, int64_t i, xf x) {
    float w = tv(name, i);
    if (x == XF_PLUS_ONE) return 1.0f + w;
    if (x == XF_NEG_EXP) return (float)-exp((double)w);
    return w;
}

/* t must be [rows, cols] (or 1-D [rows] when cols == 0) and hold name's values from element
 * `offset` on, transformed by x. */
static void check_tensor(const ds_tensor *t, const char *name, int64_t rows, int64_t cols,
                         int64_t offset, xf x, ds_dtype want_dtype) {
    if (cols == 0) {
        assert_int_equal(t->ndim, 1);
        assert_int_equal(t->ne[0], rows);
    } else {
        assert_int_equal(t->ndim, 2);
        assert_int_equal(t->ne[0], rows);
        assert_int_equal(t->ne[1], cols);
    }
    assert_int_equal(t->dtype, want_dtype);
    assert_int_equal((uintptr_t)t->data % ds_dtype_size(t->dtype), 0);
    int64_t n = rows * (cols ? cols : 1);
    for (int64_t i = 0; i < n; i++) {
        float got = ds_tensor_get_f32(t, i), want = expect_val(name, offset + i, x);
        if (fabsf(got - want) > 1e-6f * fmaxf(1.0f, fabsf(want))) {
            fprintf(stderr, "%s[%lld]: got %g want %g\n", name, (long long)(offset + i), got, want);
            fail();
        }
    }
}

static void check_vec(const ds_tensor *t, const char *lp, const char *suffix, int64_t n, xf x) {
    char name[256];
    snprintf(name, sizeof name, "%s%s", lp, suffix);
    check_tensor(t, name, n, 0, 0, x, DS_DTYPE_F32);
}

static void check_mat(const spec *s, const ds_tensor *t, const char *lp, const char *suffix,
                      int64_t rows, int64_t cols) {
    char name[256];
    snprintf(name, sizeof name, "%s%s", lp, suffix);
    check_tensor(t, name, rows, cols, 0, XF_PLAIN, s->big);
}

static void check_mlp(const spec *s, const ds_mlp_weights *m, const char *base, int64_t inter) {
    assert_int_equal(m->gate_up.n_parts, 2);
    assert_int_equal(m->gate_up.n_out, 2 * inter);
    assert_int_equal(m->gate_up.n_in, H);
    check_mat(s, &m->gate_up.parts[0], base, "gate_proj.weight", inter, H);
    check_mat(s, &m->gate_up.parts[1], base, "up_proj.weight", inter, H);
    assert_int_equal(m->down.n_parts, 1);
    check_mat(s, &m->down.parts[0], base, "down_proj.weight", H, inter);
}

static void check_layer(const spec *s, const ds_layer_weights *l, const char *lp, bool full) {
    char base[256];
    assert_int_equal(l->type, full ? DS_LAYER_FULL_ATTN : DS_LAYER_LINEAR_ATTN);
    check_vec(&l->input_norm, lp, "input_layernorm.weight", H, XF_PLUS_ONE);
    check_vec(&l->post_norm, lp, "post_attention_layernorm.weight", H, XF_PLUS_ONE);
    if (full) {
        const ds_attn_weights *a = &l->attn;
        assert_int_equal(a->qkv.n_parts, 3);
        assert_int_equal(a->qkv.n_out, NH * HD * 2 + 2 * NKV * HD);
        check_mat(s, &a->qkv.parts[0], lp, "self_attn.q_proj.weight", NH * HD * 2, H);
        check_mat(s, &a->qkv.parts[1], lp, "self_attn.k_proj.weight", NKV * HD, H);
        check_mat(s, &a->qkv.parts[2], lp, "self_attn.v_proj.weight", NKV * HD, H);
        check_mat(s, &a->o.parts[0], lp, "self_attn.o_proj.weight", H, NH * HD);
        check_vec(&a->q_norm, lp, "self_attn.q_norm.weight", HD, XF_PLUS_ONE);
        check_vec(&a->k_norm, lp, "self_attn.k_norm.weight", HD, XF_PLUS_ONE);
    } else {
        const ds_gdn_weights *g = &l->gdn;
        assert_int_equal(g->in_proj.n_parts, 4);
        assert_int_equal(g->in_proj.n_out, CONV_DIM + HV * DVV + 2 * HV);
        assert_int_equal(g->in_proj.n_in, H);
        check_mat(s, &g->in_proj.parts[0], lp, "linear_attn.in_proj_qkv.weight", CONV_DIM, H);
        check_mat(s, &g->in_proj.parts[1], lp, "linear_attn.in_proj_z.weight", HV * DVV, H);
        check_mat(s, &g->in_proj.parts[2], lp, "linear_attn.in_proj_b.weight", HV, H);
        check_mat(s, &g->in_proj.parts[3], lp, "linear_attn.in_proj_a.weight", HV, H);
        char name[256];
        snprintf(name, sizeof name, "%slinear_attn.conv1d.weight", lp);
        check_tensor(&g->conv, name, CONV_DIM, KC, 0, XF_PLAIN, DS_DTYPE_F32);
        check_vec(&g->neg_exp_A, lp, "linear_attn.A_log", HV, XF_NEG_EXP);
        check_vec(&g->dt_bias, lp, "linear_attn.dt_bias", HV, XF_PLAIN);
        check_vec(&g->norm, lp, "linear_attn.norm.weight", DVV, XF_PLAIN); /* not 1 + w */
        check_mat(s, &g->out.parts[0], lp, "linear_attn.out_proj.weight", H, HV * DVV);
    }
    if (s->moe) {
        const ds_moe_weights *m = &l->moe;
        check_mat(s, &m->router, lp, "mlp.gate.weight", NE, H);
        assert_int_equal(m->n_experts, NE);
        for (int e = 0; e < NE; e++) {
            const ds_mlp_weights *x = &m->experts[e];
            if (s->fused) {
                /* one [2I, H] part: rows [0, I) are expert e's gate, [I, 2I) its up */
                char name[256];
                snprintf(name, sizeof name, "%smlp.experts.gate_up_proj", lp);
                assert_int_equal(x->gate_up.n_parts, 1);
                assert_int_equal(x->gate_up.n_out, 2 * MI);
                check_tensor(&x->gate_up.parts[0], name, 2 * MI, H, (int64_t)e * 2 * MI * H,
                             XF_PLAIN, s->big);
                snprintf(name, sizeof name, "%smlp.experts.down_proj", lp);
                check_tensor(&x->down.parts[0], name, H, MI, (int64_t)e * H * MI, XF_PLAIN, s->big);
            } else {
                snprintf(base, sizeof base, "%smlp.experts.%d.", lp, e);
                check_mlp(s, x, base, MI);
            }
        }
        assert_int_equal(m->has_shared, s->shared);
        if (s->shared) {
            snprintf(base, sizeof base, "%smlp.shared_expert.", lp);
            check_mlp(s, &m->shared, base, SI);
            check_mat(s, &m->shared_gate, lp, "mlp.shared_expert_gate.weight", 1, H);
        }
    } else {
        snprintf(base, sizeof base, "%smlp.", lp);
        check_mlp(s, &l->mlp, base, DI);
    }
}

static void check_model(const spec *s, const ds_config *cfg, const ds_model_weights *w) {
    const char *P = prefix_of(s);
    char name[256], lp[128];
    assert_int_equal(cfg->is_moe, s->moe);
    snprintf(name, sizeof name, "%sembed_tokens.weight", P);
    check_tensor(&w->embed, name, V, H, 0, XF_PLAIN, s->big);
    snprintf(name, sizeof name, "%snorm.weight", P);
    check_tensor(&w->final_norm, name, H, 0, 0, XF_PLUS_ONE, DS_DTYPE_F32);
    assert_int_equal(w->lm_head.n_parts, 1);
    assert_int_equal(w->lm_head.n_out, V);
    assert_int_equal(w->lm_head.n_in, H);
    if (s->tied) {
        assert_ptr_equal(w->lm_head.parts[0].data, w->embed.data);
    } else {
        assert_ptr_not_equal(w->lm_head.parts[0].data, w->embed.data);
        check_tensor(&w->lm_head.parts[0], "lm_head.weight", V, H, 0, XF_PLAIN, s->big);
    }
    assert_int_equal(w->n_layers, NL);
    for (int i = 0; i < NL; i++) {
        snprintf(lp, sizeof lp, "%slayers.%d.", P, i);
        check_layer(s, &w->layers[i], lp, (i + 1) % 4 == 0);
    }
    if (s->mtp) {
        assert_non_null(w->mtp);
        check_tensor(&w->mtp->fc.parts[0], "mtp.fc.weight", H, 2 * H, 0, XF_PLAIN, s->big);
        assert_int_equal(w->mtp->fc.n_in, 2 * H);
        check_tensor(&w->mtp->norm_embedding, "mtp.pre_fc_norm_embedding.weight", H, 0, 0,
                     XF_PLUS_ONE, DS_DTYPE_F32);
        check_tensor(&w->mtp->norm_hidden, "mtp.pre_fc_norm_hidden.weight", H, 0, 0, XF_PLUS_ONE,
                     DS_DTYPE_F32);
        check_tensor(&w->mtp->final_norm, "mtp.norm.weight", H, 0, 0, XF_PLUS_ONE, DS_DTYPE_F32);
        check_layer(s, &w->mtp->layer, "mtp.layers.0.", true);
    } else {
        assert_null(w->mtp);
    }
}

/* Builds, loads, checks values and derived sizes, frees. */
static void roundtrip(const spec *s) {
    char dir[32];
    builder b;
    build_model(s, dir, &b);
    ds_config cfg;
    ds_model_weights w;
    ds_error err = {0};
    ds_status st = ds_model_load(dir, &cfg, &w, &err);
    if (st != DS_OK) fprintf(stderr, "load failed: %s\n", err.msg);
    assert_int_equal(st, DS_OK);
    assert_non_null(w.owner);
    check_model(s, &cfg, &w);

    /* model_info's parameter count must equal the elements actually in the checkpoint */
    ds_model_info mi;
    ds_model_info_compute(&cfg, DS_DTYPE_BF16, DS_DTYPE_BF16, &mi);
    assert_int_equal(mi.params_total, b.text_params);
    if (s->mtp) assert_int_equal(mi.params_mtp, b.mtp_params);
    if (s->big == DS_DTYPE_F32) /* every tensor F32 on the host: bytes = 4 · elements */
        assert_int_equal(ds_model_weights_nbytes(&cfg, &w),
                         4 * (size_t)(b.text_params + (s->mtp ? b.mtp_params : 0)));

    ds_model_weights_free(&w);
    assert_null(w.owner);
    assert_null(w.layers);
    ds_model_weights_free(&w); /* idempotent */
    remove_dir(dir);
}

/* Builds, loads, expects failure with status and message fragments; nothing may leak. */
static void expect_fail(const spec *s, ds_status want, const char *frag1, const char *frag2) {
    char dir[32];
    builder b;
    build_model(s, dir, &b);
    ds_config cfg;
    ds_model_weights w;
    ds_error err = {0};
    ds_status st = ds_model_load(dir, &cfg, &w, &err);
    if (st != want || (frag1 && !strstr(err.msg, frag1)) || (frag2 && !strstr(err.msg, frag2))) {
        fprintf(stderr, "got %s: '%s' (wanted %s with '%s', '%s')\n", ds_status_name(st), err.msg,
                ds_status_name(want), frag1 ? frag1 : "", frag2 ? frag2 : "");
        fail();
    }
    assert_null(w.owner);
    assert_null(w.layers);
    assert_null(w.mtp);
    remove_dir(dir);
}

/* ---- tests ---------------------------------------------------------------------------------- */

static spec base_moe(void) {
    return (spec){.moe = true,
                  .fused = true,
                  .shared = true,
                  .nested = true,
                  .mtp = true,
                  .big = DS_DTYPE_BF16,
                  .small = DS_DTYPE_F32};
}

static void test_moe_fused(void **state) {
    (void)state;
    spec s = base_moe();
    roundtrip(&s);
    s.extras = true; /* unused 5-D and I64 tensors must not matter */
    roundtrip(&s);
}

static void test_moe_per_expert(void **state) {
    (void)state;
    spec s = base_moe();
    s.fused = false;
    s.small = DS_DTYPE_BF16;
    roundtrip(&s);
    s.shared = false; /* no shared expert anywhere */
    s.mtp = false;
    roundtrip(&s);
}

static void test_dense(void **state) {
    (void)state;
    spec s = {
        .moe = false, .nested = true, .tied = true, .big = DS_DTYPE_BF16, .small = DS_DTYPE_BF16};
    roundtrip(&s);
    s.tied = false;
    s.nested = false; /* flat text-only names: model.layers.* */
    s.big = DS_DTYPE_F16;
    s.small = DS_DTYPE_F16;
    s.mtp = true;
    s.conv2d = true;
    roundtrip(&s);
}

static void test_tied_untied_moe(void **state) {
    (void)state;
    spec s = base_moe();
    s.tied = true;
    s.nested = false;
    roundtrip(&s);
}

static void test_all_f32_and_misaligned(void **state) {
    (void)state;
    spec s = base_moe();
    s.big = DS_DTYPE_F32;
    roundtrip(&s);
    /* a 2-byte tensor first and no reordering: every F32 offset ≡ 2 (mod 4) → loader copies */
    s.keep_order = true;
    s.mtp = false;
    roundtrip(&s);
    spec d = {.moe = false,
              .nested = true,
              .big = DS_DTYPE_F32,
              .small = DS_DTYPE_F32,
              .keep_order = true,
              .mtp = true};
    roundtrip(&d);
}

static void test_sharded(void **state) {
    (void)state;
    spec s = base_moe();
    s.shards = 2;
    s.extras = true;
    roundtrip(&s);
    s.fused = false;
    s.nested = false;
    roundtrip(&s);
    s.missing_shard = true;
    expect_fail(&s, DS_ERR_IO, "model-00003-of-00003.safetensors", NULL);
}

static void test_missing_tensor(void **state) {
    (void)state;
    spec s = base_moe();
    s.omit = "model.language_model.layers.1.linear_attn.A_log";
    expect_fail(&s, DS_ERR_FORMAT, s.omit, "/tmp/ds_ld_");
    s.omit = "model.language_model.layers.3.mlp.experts.down_proj";
    expect_fail(&s, DS_ERR_FORMAT, s.omit, "[4, 16, 6]");
    s.omit = "lm_head.weight";
    expect_fail(&s, DS_ERR_FORMAT, s.omit, NULL);
    s.omit = "model.language_model.embed_tokens.weight";
    expect_fail(&s, DS_ERR_FORMAT, "embed_tokens", NULL);
    s.omit = "mtp.layers.0.self_attn.q_norm.weight"; /* mtp.* present but incomplete */
    expect_fail(&s, DS_ERR_FORMAT, s.omit, NULL);
    s.omit = "model.language_model.layers.2.mlp.shared_expert_gate.weight";
    expect_fail(&s, DS_ERR_FORMAT, s.omit, NULL);
    spec p = base_moe();
    p.fused = false;
    p.omit = "model.language_model.layers.0.mlp.experts.3.up_proj.weight";
    expect_fail(&p, DS_ERR_FORMAT, p.omit, NULL);
    spec d = {.moe = false,
              .nested = false,
              .big = DS_DTYPE_BF16,
              .small = DS_DTYPE_F32,
              .shards = 2,
              .omit = "model.layers.0.mlp.down_proj.weight"};
    expect_fail(&d, DS_ERR_FORMAT, d.omit, NULL);
}

static void test_misshaped_tensor(void **state) {
    (void)state;
    spec s = base_moe();
    s.misshape = "model.language_model.layers.3.self_attn.k_proj.weight";
    expect_fail(&s, DS_ERR_FORMAT, "[9, 16]", "[8, 16]");
    expect_fail(&s, DS_ERR_FORMAT, s.misshape, "model.safetensors");
    s.misshape = "model.language_model.layers.0.linear_attn.conv1d.weight";
    expect_fail(&s, DS_ERR_FORMAT, s.misshape, "[33, 1, 4]");
    s.misshape = "model.language_model.layers.1.mlp.experts.gate_up_proj";
    expect_fail(&s, DS_ERR_FORMAT, s.misshape, "[5, 12, 16]");
    s.misshape = "model.language_model.norm.weight";
    expect_fail(&s, DS_ERR_FORMAT, s.misshape, "[17]");
    s.misshape = "mtp.fc.weight";
    expect_fail(&s, DS_ERR_FORMAT, s.misshape, "[17, 32]");
    s.misshape = NULL;
    s.int_dtype = "model.language_model.layers.2.input_layernorm.weight";
    expect_fail(&s, DS_ERR_UNSUPPORTED, s.int_dtype, "I32");
    s.int_dtype = "model.language_model.layers.2.linear_attn.out_proj.weight";
    expect_fail(&s, DS_ERR_UNSUPPORTED, s.int_dtype, "I32");
}

static void test_config_checkpoint_mismatch(void **state) {
    (void)state;
    spec s = base_moe();
    s.cfg_no_shared = true; /* checkpoint has shared experts, config does not say so */
    expect_fail(&s, DS_ERR_FORMAT, "shared_expert", NULL);
    /* no checkpoint files at all */
    char dir[] = "/tmp/ds_ld_empty_XXXXXX";
    assert_non_null(mkdtemp(dir));
    spec d = {.moe = false, .nested = true};
    write_config(&d, dir);
    ds_config cfg;
    ds_model_weights w;
    ds_error err = {0};
    assert_int_equal(ds_model_load(dir, &cfg, &w, &err), DS_ERR_IO);
    assert_non_null(strstr(err.msg, "model.safetensors"));
    assert_null(w.owner);
    remove_dir(dir);
    err = (ds_error){0};
    assert_int_equal(ds_model_load("/nonexistent/dir", &cfg, &w, &err), DS_ERR_IO);
    assert_non_null(strstr(err.msg, "config.json"));
}

static void test_checkpoint_api(void **state) {
    (void)state;
    spec s = base_moe();
    s.shards = 2;
    char dir[32];
    builder b;
    build_model(&s, dir, &b);
    ds_checkpoint *ck = NULL;
    ds_error err = {0};
    assert_int_equal(ds_checkpoint_open(dir, &ck, &err), DS_OK);
    assert_int_equal(ds_checkpoint_n_files(ck), 2);
    const ds_st_tensor *t = ds_checkpoint_find(ck, "mtp.fc.weight");
    assert_non_null(t);
    assert_non_null(strstr(t->origin, ".safetensors"));
    assert_null(ds_checkpoint_find(ck, "mtp.fc"));
    assert_true(ds_checkpoint_has_prefix(ck, "mtp."));
    assert_true(ds_checkpoint_has_prefix(ck, "model.language_model.layers.3."));
    assert_false(ds_checkpoint_has_prefix(ck, "model.visual."));
    assert_false(ds_checkpoint_has_prefix(ck, "zzz"));
    for (int i = 1; i < ds_checkpoint_count(ck); i++)
        assert_true(strcmp(ds_checkpoint_at(ck, i - 1)->name, ds_checkpoint_at(ck, i)->name) < 0);
    ds_checkpoint_close(ck);

    /* index that lies about where a tensor lives */
    char path[512];
    snprintf(path, sizeof path, "%s/model.safetensors.index.json", dir);
    size_t len;
    char *text = test_read_file(path, &len);
    cJSON *root = cJSON_Parse(text);
    free(text);
    cJSON *wm = cJSON_GetObjectItemCaseSensitive(root, "weight_map");
    cJSON_AddStringToObject(wm, "ghost.weight", "model-00001-of-00002.safetensors");
    char *js = cJSON_Print(root);
    assert_int_equal(stw_write_bytes(path, js, strlen(js)), 0);
    free(js);
    err = (ds_error){0};
    assert_int_equal(ds_checkpoint_open(dir, &ck, &err), DS_ERR_FORMAT);
    assert_non_null(strstr(err.msg, "ghost.weight"));
    assert_null(ck);
    /* a shard path escaping the directory */
    cJSON_DeleteItemFromObjectCaseSensitive(wm, "ghost.weight");
    cJSON_AddStringToObject(wm, "evil.weight", "../model-00001-of-00002.safetensors");
    js = cJSON_Print(root);
    assert_int_equal(stw_write_bytes(path, js, strlen(js)), 0);
    free(js);
    err = (ds_error){0};
    assert_int_equal(ds_checkpoint_open(dir, &ck, &err), DS_ERR_FORMAT);
    assert_non_null(strstr(err.msg, "evil.weight"));
    /* not JSON / no weight_map */
    assert_int_equal(stw_write_bytes(path, "{\"metadata\":{}}", 15), 0);
    err = (ds_error){0};
    assert_int_equal(ds_checkpoint_open(dir, &ck, &err), DS_ERR_FORMAT);
    assert_non_null(strstr(err.msg, "weight_map"));
    assert_int_equal(stw_write_bytes(path, "{\"weight_map\":", 14), 0);
    err = (ds_error){0};
    assert_int_equal(ds_checkpoint_open(dir, &ck, &err), DS_ERR_FORMAT);
    cJSON_Delete(root);
    remove_dir(dir);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_moe_fused),
        cmocka_unit_test(test_moe_per_expert),
        cmocka_unit_test(test_dense),
        cmocka_unit_test(test_tied_untied_moe),
        cmocka_unit_test(test_all_f32_and_misaligned),
        cmocka_unit_test(test_sharded),
        cmocka_unit_test(test_missing_tensor),
        cmocka_unit_test(test_misshaped_tensor),
        cmocka_unit_test(test_config_checkpoint_mismatch),
        cmocka_unit_test(test_checkpoint_api),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
