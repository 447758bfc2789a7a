/* cpu_attention.c — Qwen3.5 gated attention core over a paged KV cache.
 *
 * qkv [T, nh·qw + 2·nkv·hd] with qw = 2·hd when attn_output_gate (per head: hd query values, then
 * hd gate values), else hd. Phase 1 (parallel over tokens): q/k RMSNorm over hd with (1+w)
 * weights, partial NeoX RoPE on dims [0, rot), K and V written to the pool at the token's
 * position. Phase 2 (parallel over token × kv head): causal GQA softmax attention over positions
 * 0..pos of the token's sequence, times sigmoid(gate). Every (token, head) result depends only on
 * that token and the cache, so a sequence gives the same output alone or batched, in one pass
 * or prefill + decode. */
#include <math.h>
#include <stdlib.h>

#include "backend/cpu/cpu_internal.h"

/* inv_freq[i] = 1 / theta^(2i/rot) in float32, the way PyTorch builds it:
 * 1.0 / (base ** (arange(0, rot, 2, dtype=float32) / rot)). */
static const float *rope_inv_freq(ds_cpu *cpu, double theta, int rot) {
    if (cpu->inv_freq && cpu->inv_freq_rot == rot && cpu->inv_freq_theta == theta)
        return cpu->inv_freq;
    free(cpu->inv_freq);
    cpu->inv_freq = ds_xmalloc((size_t)(rot / 2 > 0 ? rot / 2 : 1) * sizeof(float));
    for (int i = 0; i < rot / 2; i++)
        cpu->inv_freq[i] = 1.0f / powf((float)theta, (float)(2 * i) / (float)rot);
    cpu->inv_freq_rot = rot;
    cpu->inv_freq_theta = theta;
    return cpu->inv_freq;
}

typedef struct attn_job {
    ds_cpu *cpu;
    const ds_batch *b;
    const int32_t *tok_seq;       /* [T] sequence of each token */
    const float *qkv;             /* [T, width] */
    float *q;                     /* [T, nh, hd] normed + roped queries */
    float *out;                   /* [T, nh·hd] */
    float *kpool, *vpool;         /* [n_blocks, bs, nkv, hd] */
    const float *q_norm, *k_norm; /* [hd] */
    const float *inv_freq;        /* [rot/2] */
    int nh, nkv, hd, rot, qw, bs, n_blocks;
    int64_t width;
    float eps, scale;
    bool gated;
} attn_job;

/* x[0..rot) rotated in place by the angles whose cos/sin are given ([rot/2] each). */
static void rope_apply(float *x, const float *cs, const float *sn, int rot) {
    int half = rot / 2;
    for (int i = 0; i < half; i++) {
        float x1 = x[i], x2 = x[i + half];
        x[i] = x1 * cs[i] - x2 * sn[i];
        x[i + half] = x2 * cs[i] + x1 * sn[i];
    }
}

/* Offset of (position, kv head) in the pool, following the sequence's block table row. */
static size_t kv_offset(const attn_job *j, int s, int pos, int kvh) {
    const ds_batch *b = j->b;
    DS_ASSERT(pos >= 0 && pos / j->bs < b->max_blocks);
    int blk = b->block_table[(size_t)s * (size_t)b->max_blocks + (size_t)(pos / j->bs)];
    DS_ASSERT(blk >= 0 && blk < j->n_blocks);
    return (((size_t)blk * (size_t)j->bs + (size_t)(pos % j->bs)) * (size_t)j->nkv + (size_t)kvh) *
           (size_t)j->hd;
}

static void attn_prepare_task(void *ctx, int64_t begin, int64_t end, int tid) {
    attn_job *j = ctx;
    int half = j->rot / 2;
    float *cs = ds_cpu_scratch(j->cpu, tid, DS_CPU_SCRATCH_OP, (size_t)(2 * half + 1));
    float *sn = cs + half;
    for (int64_t t = begin; t < end; t++) {
        int s = j->tok_seq[t];
        int pos = j->b->positions[t];
        for (int i = 0; i < half; i++) {
            float angle = (float)pos * j->inv_freq[i];
            cs[i] = cosf(angle);
            sn[i] = sinf(angle);
        }
        const float *row = j->qkv + t * j->width;
        for (int h = 0; h < j->nh; h++) {
            float *q = j->q + ((size_t)t * (size_t)j->nh + (size_t)h) * (size_t)j->hd;
            ds_cpu_rmsnorm_row(row + (size_t)h * (size_t)j->qw, j->q_norm, j->eps, j->hd, q);
            rope_apply(q, cs, sn, j->rot);
        }
        const float *k_in = row + (size_t)j->nh * (size_t)j->qw;
        const float *v_in = k_in + (size_t)j->nkv * (size_t)j->hd;
        for (int g = 0; g < j->nkv; g++) {
            size_t off = kv_offset(j, s, pos, g);
            float *k = j->kpool + off;
            ds_cpu_rmsnorm_row(k_in + (size_t)g * (size_t)j->hd, j->k_norm, j->eps, j->hd, k);
            rope_apply(k, cs, sn, j->rot);
            memcpy(j->vpool + off, v_in + (size_t)g * (size_t)j->hd, (size_t)j->hd * sizeof(float));
        }
    }
}

static void attn_core_task(void *ctx, int64_t begin, int64_t end, int tid) {
    attn_job *j = ctx;
    int G = j->nh / j->nkv; /* query heads per kv head */
    for (int64_t item = begin; item < end; item++) {
        int64_t t = item / j->nkv;
        int kvh = (int)(item % j->nkv);
        int s = j->tok_seq[t];
        int pos = j->b->positions[t];
        int64_t n_ctx = (int64_t)pos + 1;
        float *p = ds_cpu_scratch(j->cpu, tid, DS_CPU_SCRATCH_OP, (size_t)G * (size_t)n_ctx);
        const float *q0 =
            j->q + ((size_t)t * (size_t)j->nh + (size_t)kvh * (size_t)G) * (size_t)j->hd;

        /* scores[g][i] = q_g · k_i · hd^-0.5 */
        for (int64_t i = 0; i < n_ctx; i++) {
            const float *k = j->kpool + kv_offset(j, s, (int)i, kvh);
            for (int g = 0; g < G; g++)
                p[g * n_ctx + i] = ds_cpu_dot(q0 + (size_t)g * (size_t)j->hd, k, j->hd) * j->scale;
        }
        /* softmax in fp32 */
        for (int g = 0; g < G; g++) {
            float *pg = p + g * n_ctx;
            float m = pg[0];
            for (int64_t i = 1; i < n_ctx; i++) m = pg[i] > m ? pg[i] : m;
            float sum = 0.0f;
            for (int64_t i = 0; i < n_ctx; i++) {
                pg[i] = expf(pg[i] - m);
                sum += pg[i];
            }
            float inv = 1.0f / sum;
            for (int64_t i = 0; i < n_ctx; i++) pg[i] *= inv;
        }
        /* out_g = Σ_i p[g][i] · v_i */
        float *o0 = j->out + (size_t)t * (size_t)j->nh * (size_t)j->hd +
                    (size_t)kvh * (size_t)G * (size_t)j->hd;
        memset(o0, 0, (size_t)G * (size_t)j->hd * sizeof(float));
        for (int64_t i = 0; i < n_ctx; i++) {
            const float *v = j->vpool + kv_offset(j, s, (int)i, kvh);
            for (int g = 0; g < G; g++)
                ds_cpu_axpy(p[g * n_ctx + i], v, o0 + (size_t)g * (size_t)j->hd, j->hd);
        }
        /* output gate */
        if (j->gated) {
            const float *row = j->qkv + t * j->width;
            for (int g = 0; g < G; g++) {
                int h = kvh * G + g;
                const float *gate = row + (size_t)h * (size_t)j->qw + (size_t)j->hd;
                float *o = o0 + (size_t)g * (size_t)j->hd;
                for (int d = 0; d < j->hd; d++) o[d] *= ds_cpu_sigmoid(gate[d]);
            }
        }
    }
}

void ds_cpu_op_attention(ds_backend *be, ds_cache *c, int layer, const ds_config *cfg,
                         const ds_attn_weights *w, const ds_tensor *qkv, ds_tensor *out) {
    ds_cpu *cpu = ds_cpu_of(be);
    const ds_batch *b = ds_cpu_batch(cpu);
    DS_ASSERT(layer >= 0 && layer < c->n_layers && c->is_attn[layer]);
    int pool = c->pool_of_layer[layer];
    attn_job j = {
        .cpu = cpu,
        .b = b,
        .qkv = qkv->data,
        .out = out->data,
        .kpool = c->k[pool],
        .vpool = c->v[pool],
        .q_norm = w->q_norm.data,
        .k_norm = w->k_norm.data,
        .nh = cfg->n_heads,
        .nkv = cfg->n_kv_heads,
        .hd = cfg->head_dim,
        .rot = cfg->rot_dim,
        .bs = c->desc.block_size,
        .n_blocks = c->desc.n_blocks,
        .eps = (float)cfg->rms_eps,
        .scale = (float)pow((double)cfg->head_dim, -0.5),
        .gated = cfg->attn_output_gate,
    };
    j.qw = j.gated ? 2 * j.hd : j.hd;
    j.width = (int64_t)j.nh * j.qw + 2 * (int64_t)j.nkv * j.hd;
    int T = b->n_tokens;
    DS_ASSERT(j.nh > 0 && j.nkv > 0 && j.nh % j.nkv == 0 && j.hd == c->head_dim &&
              j.nkv == c->n_kv_heads && j.rot >= 0 && j.rot <= j.hd && j.rot % 2 == 0);
    DS_ASSERT(qkv->dtype == DS_DTYPE_F32 && out->dtype == DS_DTYPE_F32);
    DS_ASSERT(qkv->ne[qkv->ndim - 1] == j.width && ds_tensor_numel(qkv) >= (int64_t)T * j.width);
    DS_ASSERT(ds_tensor_numel(out) >= (int64_t)T * j.nh * j.hd);
    DS_ASSERT(w->q_norm.dtype == DS_DTYPE_F32 && w->k_norm.dtype == DS_DTYPE_F32 &&
              ds_tensor_numel(&w->q_norm) == j.hd && ds_tensor_numel(&w->k_norm) == j.hd);
    if (T == 0) return;

    j.inv_freq = rope_inv_freq(cpu, cfg->rope_theta, j.rot);
    int32_t *tok_seq = (int32_t *)ds_cpu_work(cpu, DS_CPU_WORK_D, (size_t)T);
    DS_ASSERT(b->seq_start[0] == 0 && b->seq_start[b->n_seqs] == T);
    for (int s = 0; s < b->n_seqs; s++)
        for (int t = b->seq_start[s]; t < b->seq_start[s + 1]; t++) tok_seq[t] = s;
    j.tok_seq = tok_seq;
    j.q = ds_cpu_work(cpu, DS_CPU_WORK_A, (size_t)T * (size_t)j.nh * (size_t)j.hd);

    ds_threadpool_for(cpu->pool, T, ds_threadpool_chunk(cpu->pool, T, 1), attn_prepare_task, &j);
    int64_t items = (int64_t)T * j.nkv;
    ds_threadpool_for(cpu->pool, items, 1, attn_core_task, &j);
}
