/* bf16_emu.h — the CPU backend with its activations stored in bf16: the error bf16 storage
 * alone causes, as a yardstick for the CUDA backend on models that amplify rounding noise.
 *
 * Every op output the CUDA backend keeps in bf16 (embeddings, norms, projections, SiLU·mul,
 * attention / GDN / MoE outputs, the residual stream) is rounded to bf16 (round to nearest
 * even) after the fp32 CPU op computed it; logits stay fp32 as on the device. The residual is
 * rounded before its norm, as the CUDA add_rmsnorm does. Header-only: tests include it. */
#ifndef DS_TESTS_BF16_EMU_H
#define DS_TESTS_BF16_EMU_H

#include "backend/backend.h"
#include "core/tensor.h"

static ds_backend_ops bf16_emu_ops;
static const ds_backend_ops *bf16_emu_cpu; /* the wrapped CPU op table */

static void bf16_emu_round(ds_tensor *t) {
    if (t->dtype != DS_DTYPE_F32) return;
    float *p = t->data;
    const int64_t n = ds_tensor_numel(t);
    for (int64_t i = 0; i < n; i++) p[i] = ds_bf16_to_f32(ds_f32_to_bf16(p[i]));
}

static void bf16_emu_embed(ds_backend *be, const ds_tensor *tab, ds_tensor *o) {
    bf16_emu_cpu->embed(be, tab, o);
    bf16_emu_round(o);
}
static void bf16_emu_rmsnorm(ds_backend *be, const ds_tensor *x, const ds_tensor *w, float eps,
                             ds_tensor *o) {
    bf16_emu_cpu->rmsnorm(be, x, w, eps, o);
    bf16_emu_round(o);
}
/* r += d rounded to bf16, then the norm of the rounded residual (the CUDA kernel's order) */
static void bf16_emu_add_rmsnorm(ds_backend *be, ds_tensor *r, const ds_tensor *d,
                                 const ds_tensor *w, float eps, ds_tensor *o) {
    float *rp = r->data;
    const float *dp = d->data;
    const int64_t n = ds_tensor_numel(r);
    for (int64_t i = 0; i < n; i++) rp[i] = ds_bf16_to_f32(ds_f32_to_bf16(rp[i] + dp[i]));
    bf16_emu_cpu->rmsnorm(be, r, w, eps, o);
    bf16_emu_round(o);
}
static void bf16_emu_linear(ds_backend *be, const ds_tensor *x, const ds_linear *w, ds_tensor *o) {
    bf16_emu_cpu->linear(be, x, w, o);
    bf16_emu_round(o);
}
static void bf16_emu_silu_mul(ds_backend *be, const ds_tensor *x, ds_tensor *o) {
    bf16_emu_cpu->silu_mul(be, x, o);
    bf16_emu_round(o);
}
static void bf16_emu_attention(ds_backend *be, ds_cache *c, int l, const ds_config *cfg,
                               const ds_attn_weights *w, const ds_tensor *q, ds_tensor *o) {
    bf16_emu_cpu->attention(be, c, l, cfg, w, q, o);
    bf16_emu_round(o);
}
static void bf16_emu_gdn(ds_backend *be, ds_cache *c, int l, const ds_config *cfg,
                         const ds_gdn_weights *w, const ds_tensor *p, ds_tensor *o) {
    bf16_emu_cpu->gdn(be, c, l, cfg, w, p, o);
    bf16_emu_round(o);
}
static void bf16_emu_moe(ds_backend *be, const ds_config *cfg, const ds_moe_weights *w,
                         const ds_tensor *x, ds_tensor *o) {
    bf16_emu_cpu->moe(be, cfg, w, x, o);
    bf16_emu_round(o);
}

/* Turns a CPU backend into the bf16-storage emulation (its op table is replaced). */
static void bf16_emu_wrap(ds_backend *cpu) {
    bf16_emu_cpu = cpu->ops;
    bf16_emu_ops = *cpu->ops;
    bf16_emu_ops.embed = bf16_emu_embed;
    bf16_emu_ops.rmsnorm = bf16_emu_rmsnorm;
    bf16_emu_ops.add_rmsnorm = bf16_emu_add_rmsnorm;
    bf16_emu_ops.linear = bf16_emu_linear;
    bf16_emu_ops.silu_mul = bf16_emu_silu_mul;
    bf16_emu_ops.attention = bf16_emu_attention;
    bf16_emu_ops.gdn = bf16_emu_gdn;
    bf16_emu_ops.moe = bf16_emu_moe;
    cpu->ops = &bf16_emu_ops;
}

#endif
