/* cpu_gdn.c — Gated DeltaNet core: causal conv + SiLU, gates, q/k L2-norm, the gated delta
 * rule (token-by-token recurrence or the chunked form), gated RMSNorm.
 *
 * proj [T, conv_dim + Hv·dv + 2·Hv]: q|k|v (conv_dim = 2·Hk·dk + Hv·dv, head-major), z [Hv·dv],
 * b [Hv], a [Hv]. out [T, Hv·dv]. Per value head h (key head h / (Hv/Hk)), state S [dk, dv]:
 *   S ← α·S;  δ = β·(v − Sᵀk);  S ← S + k·δᵀ;  o = Sᵀq       (α = exp(g), g ≤ 0)
 * Phase 1 (parallel over channels): conv over the slot's history + the step's inputs, SiLU,
 * history update. Phase 2 (parallel over tokens): L2-norm q/k, scale q, β and g. Phase 3
 * (parallel over sequence × value head): recurrence or chunked rule, then gated RMSNorm.
 *
 * Speculative verification (ds_batch.state_out_slots): a sequence with snapshot slots reads its
 * seq_slot state, never writes it, and leaves the conv history and recurrent state after each
 * token t in slot state_out_slots[t]. It always runs the token-by-token recurrence (a state per
 * token is what the recurrence has anyway), so its outputs equal a one-token-per-step decode. */
#include <math.h>

#include "backend/cpu/cpu_internal.h"

typedef struct gdn_job {
    ds_cpu *cpu;
    ds_cache *c;
    const ds_batch *b;
    int pool;
    const float *proj;      /* [T, width] */
    float *out;             /* [T, Hv·dv] */
    float *xc;              /* [T, conv_dim] conv + SiLU output; q, k normalised in place */
    float *gb;              /* [T, 2·Hv]: β then g */
    const float *conv_w;    /* [conv_dim, K] */
    const float *neg_exp_A; /* [Hv] */
    const float *dt_bias;   /* [Hv] */
    const float *norm_w;    /* [dv] */
    int Hk, Hv, dk, dv, K, conv_dim;
    int64_t width;
    float eps, q_scale;
    ds_cpu_gdn_mode mode;
} gdn_job;

/* True when sequence s of the batch writes per-token state snapshots instead of updating its
 * seq_slot in place. */
static bool seq_snapshots(const ds_batch *b, int s) {
    if (!b->state_out_slots) return false;
    for (int t = b->seq_start[s]; t < b->seq_start[s + 1]; t++)
        if (b->state_out_slots[t] >= 0) return true;
    return false;
}

/* ---- phase 1: depthwise causal conv + SiLU ----------------------------------------------- */

static void gdn_conv_task(void *ctx, int64_t begin, int64_t end, int tid) {
    (void)tid;
    gdn_job *j = ctx;
    const ds_batch *b = j->b;
    int K = j->K, H = K - 1; /* H = history length */
    for (int s = 0; s < b->n_seqs; s++) {
        int slot = b->seq_slot[s];
        int t0 = b->seq_start[s], n = b->seq_start[s + 1] - t0;
        if (n == 0) continue;
        const bool snap = seq_snapshots(b, s);
        float *hist_all = j->c->conv[j->pool] + (size_t)slot * (size_t)j->conv_dim * (size_t)H;
        for (int64_t ch = begin; ch < end; ch++) {
            float *hist = hist_all + ch * H; /* [K-1], oldest first */
            const float *w = j->conv_w + ch * K;
            /* input i of xpad = [hist, x_0 .. x_{n-1}] */
            for (int t = 0; t < n; t++) {
                float acc = 0.0f;
                for (int i = 0; i < K; i++) {
                    int idx = t + i; /* position in xpad */
                    float xv =
                        idx < H ? hist[idx]
                                : j->proj[(size_t)(t0 + idx - H) * (size_t)j->width + (size_t)ch];
                    acc += w[i] * xv;
                }
                j->xc[(size_t)(t0 + t) * (size_t)j->conv_dim + (size_t)ch] = ds_cpu_silu(acc);
            }
            if (snap) {
                /* history after token t = xpad[t+1 .. t+H], into that token's snapshot slot */
                for (int t = 0; t < n; t++) {
                    int o = b->state_out_slots[t0 + t];
                    if (o < 0) continue;
                    float *dst = j->c->conv[j->pool] +
                                 ((size_t)o * (size_t)j->conv_dim + (size_t)ch) * (size_t)H;
                    for (int i = 0; i < H; i++) {
                        int idx = t + 1 + i;
                        dst[i] = idx < H ? hist[idx]
                                         : j->proj[(size_t)(t0 + idx - H) * (size_t)j->width +
                                                   (size_t)ch];
                    }
                }
                continue;
            }
            /* new history = last K-1 entries of xpad (xpad has H + n entries) */
            for (int i = 0; i < H; i++) {
                int idx = n + i;
                hist[i] = idx < H ? hist[idx]
                                  : j->proj[(size_t)(t0 + idx - H) * (size_t)j->width + (size_t)ch];
            }
        }
    }
}

/* ---- phase 2: per-token q/k normalisation and gates --------------------------------------- */

static void l2norm_inplace(float *x, int n, float post_scale) {
    float inv = 1.0f / sqrtf(ds_cpu_dot(x, x, n) + 1e-6f);
    for (int i = 0; i < n; i++) x[i] = (x[i] * inv) * post_scale;
}

static float softplus(float x) { return x > 20.0f ? x : log1pf(expf(x)); } /* torch threshold 20 */

static void gdn_gate_task(void *ctx, int64_t begin, int64_t end, int tid) {
    (void)tid;
    gdn_job *j = ctx;
    for (int64_t t = begin; t < end; t++) {
        float *x = j->xc + t * j->conv_dim;
        for (int h = 0; h < j->Hk; h++) {
            l2norm_inplace(x + (size_t)h * (size_t)j->dk, j->dk, j->q_scale);
            l2norm_inplace(x + (size_t)(j->Hk + h) * (size_t)j->dk, j->dk, 1.0f);
        }
        const float *bv = j->proj + t * j->width + j->conv_dim + (int64_t)j->Hv * j->dv;
        const float *av = bv + j->Hv;
        float *gb = j->gb + t * 2 * j->Hv;
        for (int h = 0; h < j->Hv; h++) {
            gb[h] = ds_cpu_sigmoid(bv[h]);
            gb[j->Hv + h] = j->neg_exp_A[h] * softplus(av[h] + j->dt_bias[h]);
        }
    }
}

/* ---- phase 3: the gated delta rule ---------------------------------------------------------- */

typedef struct head_io {
    const float *q, *k, *v; /* token t: q + t·ld_x, k + t·ld_x, v + t·ld_x */
    size_t ld_x;
    const float *beta, *g; /* token t: beta[t·ld_g], g[t·ld_g] */
    size_t ld_g;
    float *o; /* token t: o + t·ld_o */
    size_t ld_o;
    int n, dk, dv;
} head_io;

/* Token by token (decode). scratch: 2·dv floats. */
static void delta_rule_recurrent(const head_io *io, float *S, float *scratch) {
    int dk = io->dk, dv = io->dv;
    float *kv = scratch, *delta = scratch + dv;
    for (int t = 0; t < io->n; t++) {
        const float *q = io->q + t * io->ld_x, *k = io->k + t * io->ld_x, *v = io->v + t * io->ld_x;
        float alpha = expf(io->g[t * io->ld_g]), beta = io->beta[t * io->ld_g];
        memset(kv, 0, (size_t)dv * sizeof(float));
        for (int i = 0; i < dk; i++) {
            float *Si = S + (size_t)i * (size_t)dv;
            ds_cpu_scale(alpha, Si, dv);
            ds_cpu_axpy(k[i], Si, kv, dv); /* kv = Sᵀk */
        }
        for (int e = 0; e < dv; e++) delta[e] = (v[e] - kv[e]) * beta;
        float *o = io->o + t * io->ld_o;
        memset(o, 0, (size_t)dv * sizeof(float));
        for (int i = 0; i < dk; i++) {
            float *Si = S + (size_t)i * (size_t)dv;
            ds_cpu_axpy(k[i], delta, Si, dv); /* S += k δᵀ */
            ds_cpu_axpy(q[i], Si, o, dv);     /* o = Sᵀq */
        }
    }
}

#define CH DS_CPU_GDN_CHUNK

static size_t chunk_scratch_floats(int dk, int dv) {
    return (size_t)CH * (size_t)(4 * dk + 2 * dv) + 2 * (size_t)CH * CH + 2 * (size_t)CH +
           (size_t)dk * (size_t)dv + 2 * (size_t)dv;
}

/* The chunked form of transformers' torch_chunk_gated_delta_rule (chunk 64), one head. Within a
 * chunk of L tokens with cumulative log-decay c_i = Σ_{s≤i} g_s:
 *   A_ij = (β_i k_i·k_j)·e^{c_i−c_j} (j < i);  (I + A) U = β v;  (I + A) W = β k e^{c}
 *   P_ij = (q_i·k_j)·e^{c_i−c_j} (j ≤ i)
 *   v'   = U − W S;   o_i = (q_i e^{c_i}) S + Σ_j P_ij v'_j
 *   S    ← e^{c_L} S + Σ_j (k_j e^{c_L−c_j}) v'_jᵀ
 * A short last chunk equals transformers' zero padding (padded g = 0, k = 0). */
static void delta_rule_chunked(const head_io *io, float *S, float *scratch) {
    int dk = io->dk, dv = io->dv;
    float *qc = scratch;                 /* [CH, dk] q, then q·e^{c} */
    float *kc = qc + CH * dk;            /* [CH, dk] k, then k·e^{c_L−c} */
    float *kb = kc + CH * dk;            /* [CH, dk] β·k */
    float *U = kb + CH * dk;             /* [CH, dv] β·v → new values */
    float *W = U + CH * dv;              /* [CH, dk] β·k·e^{c} → decayed-key system solution */
    float *vn = W + CH * dk;             /* [CH, dv] v' */
    float *A = vn + CH * dv;             /* [CH, CH] */
    float *P = A + CH * CH;              /* [CH, CH] */
    float *cg = P + CH * CH;             /* [CH] cumulative g */
    float *bt = cg + CH;                 /* [CH] β */
    float *Srow = bt + CH;               /* [dk, dv] kdᵀ v' */
    float *tmp = Srow + (size_t)dk * dv; /* [dv] */
    float *tmp2 = tmp + dv;              /* [dv] */

    for (int c0 = 0; c0 < io->n; c0 += CH) {
        int L = io->n - c0 < CH ? io->n - c0 : CH;
        float acc = 0.0f;
        for (int i = 0; i < L; i++) {
            int t = c0 + i;
            memcpy(qc + i * dk, io->q + t * io->ld_x, (size_t)dk * sizeof(float));
            memcpy(kc + i * dk, io->k + t * io->ld_x, (size_t)dk * sizeof(float));
            bt[i] = io->beta[t * io->ld_g];
            acc += io->g[t * io->ld_g];
            cg[i] = acc;
            const float *v = io->v + t * io->ld_x;
            for (int a = 0; a < dk; a++) kb[i * dk + a] = kc[i * dk + a] * bt[i];
            for (int e = 0; e < dv; e++) U[i * dv + e] = v[e] * bt[i];
        }
        /* A (strictly lower) and P (lower incl. diagonal) */
        for (int i = 0; i < L; i++) {
            for (int jj = 0; jj <= i; jj++) {
                float decay = expf(cg[i] - cg[jj]);
                if (jj < i) A[i * CH + jj] = ds_cpu_dot(kb + i * dk, kc + jj * dk, dk) * decay;
                P[i * CH + jj] = ds_cpu_dot(qc + i * dk, kc + jj * dk, dk) * decay;
            }
        }
        /* forward substitution: row i of (I + A)⁻¹ applied to U and W */
        for (int i = 0; i < L; i++) {
            float ec = expf(cg[i]);
            for (int a = 0; a < dk; a++) W[i * dk + a] = kb[i * dk + a] * ec;
            for (int jj = 0; jj < i; jj++) {
                float aij = A[i * CH + jj];
                ds_cpu_axpy(-aij, U + jj * dv, U + i * dv, dv);
                ds_cpu_axpy(-aij, W + jj * dk, W + i * dk, dk);
            }
        }
        float cL = cg[L - 1];
        for (int i = 0; i < L; i++) {
            ds_cpu_scale(expf(cg[i]), qc + i * dk, dk);
            ds_cpu_scale(expf(cL - cg[i]), kc + i * dk, dk);
        }
        /* v' = U − W·S */
        for (int i = 0; i < L; i++) {
            memset(tmp, 0, (size_t)dv * sizeof(float));
            for (int a = 0; a < dk; a++) ds_cpu_axpy(W[i * dk + a], S + (size_t)a * dv, tmp, dv);
            for (int e = 0; e < dv; e++) vn[i * dv + e] = U[i * dv + e] - tmp[e];
        }
        /* o_i = (q_i e^{c_i})·S + Σ_{j≤i} P_ij v'_j */
        for (int i = 0; i < L; i++) {
            memset(tmp, 0, (size_t)dv * sizeof(float));
            for (int a = 0; a < dk; a++) ds_cpu_axpy(qc[i * dk + a], S + (size_t)a * dv, tmp, dv);
            memset(tmp2, 0, (size_t)dv * sizeof(float));
            for (int jj = 0; jj <= i; jj++) ds_cpu_axpy(P[i * CH + jj], vn + jj * dv, tmp2, dv);
            float *o = io->o + (c0 + i) * io->ld_o;
            for (int e = 0; e < dv; e++) o[e] = tmp[e] + tmp2[e];
        }
        /* S ← e^{c_L}·S + kdᵀ v' */
        memset(Srow, 0, (size_t)dk * dv * sizeof(float));
        for (int jj = 0; jj < L; jj++)
            for (int a = 0; a < dk; a++)
                ds_cpu_axpy(kc[jj * dk + a], vn + jj * dv, Srow + (size_t)a * dv, dv);
        float eL = expf(cL);
        for (size_t x = 0; x < (size_t)dk * dv; x++) S[x] = S[x] * eL + Srow[x];
    }
}

static void gdn_head_task(void *ctx, int64_t begin, int64_t end, int tid) {
    gdn_job *j = ctx;
    const ds_batch *b = j->b;
    int Hv = j->Hv, dk = j->dk, dv = j->dv, group = j->Hv / j->Hk;
    const size_t state_floats = (size_t)dk * (size_t)dv;
    float *scratch = ds_cpu_scratch(j->cpu, tid, DS_CPU_SCRATCH_OP,
                                    chunk_scratch_floats(dk, dv) + state_floats);
    float *S_work = scratch + chunk_scratch_floats(dk, dv); /* [dk, dv] snapshot mode */
    for (int64_t item = begin; item < end; item++) {
        int s = (int)(item / Hv), h = (int)(item % Hv), kh = h / group;
        int t0 = b->seq_start[s], n = b->seq_start[s + 1] - t0;
        if (n == 0) continue;
        int slot = b->seq_slot[s];
        float *S = j->c->state[j->pool] +
                   ((size_t)slot * (size_t)Hv + (size_t)h) * (size_t)dk * (size_t)dv;
        const float *x0 = j->xc + (size_t)t0 * (size_t)j->conv_dim;
        head_io io = {
            .q = x0 + (size_t)kh * dk,
            .k = x0 + (size_t)(j->Hk + kh) * dk,
            .v = x0 + (size_t)2 * j->Hk * dk + (size_t)h * dv,
            .ld_x = (size_t)j->conv_dim,
            .beta = j->gb + (size_t)t0 * 2 * Hv + h,
            .g = j->gb + (size_t)t0 * 2 * Hv + Hv + h,
            .ld_g = (size_t)2 * Hv,
            .o = j->out + (size_t)t0 * Hv * dv + (size_t)h * dv,
            .ld_o = (size_t)Hv * dv,
            .n = n,
            .dk = dk,
            .dv = dv,
        };
        bool chunked = j->mode == DS_CPU_GDN_CHUNKED ||
                       (j->mode == DS_CPU_GDN_AUTO && n >= DS_CPU_GDN_CHUNK_MIN);
        if (seq_snapshots(b, s)) {
            /* seq_slot is only read: run on a copy, leave the state after each token where the
             * batch asks for it */
            memcpy(S_work, S, state_floats * sizeof(float));
            for (int t = 0; t < n; t++) {
                head_io one = io;
                one.n = 1;
                one.q = io.q + (size_t)t * io.ld_x;
                one.k = io.k + (size_t)t * io.ld_x;
                one.v = io.v + (size_t)t * io.ld_x;
                one.beta = io.beta + (size_t)t * io.ld_g;
                one.g = io.g + (size_t)t * io.ld_g;
                one.o = io.o + (size_t)t * io.ld_o;
                delta_rule_recurrent(&one, S_work, scratch);
                int o = b->state_out_slots[t0 + t];
                if (o >= 0)
                    memcpy(j->c->state[j->pool] +
                               ((size_t)o * (size_t)Hv + (size_t)h) * state_floats,
                           S_work, state_floats * sizeof(float));
            }
        } else if (chunked) {
            delta_rule_chunked(&io, S, scratch);
        } else {
            delta_rule_recurrent(&io, S, scratch);
        }

        /* gated RMSNorm over dv: (o·rsqrt(mean(o²)+eps))·w·SiLU(z) */
        for (int t = 0; t < n; t++) {
            float *o = io.o + t * io.ld_o;
            const float *z = j->proj + (size_t)(t0 + t) * j->width + j->conv_dim + (size_t)h * dv;
            float r = 1.0f / sqrtf(ds_cpu_dot(o, o, dv) / (float)dv + j->eps);
            for (int e = 0; e < dv; e++) o[e] = (j->norm_w[e] * (o[e] * r)) * ds_cpu_silu(z[e]);
        }
    }
}

void ds_cpu_op_gdn(ds_backend *be, ds_cache *c, int layer, const ds_config *cfg,
                   const ds_gdn_weights *w, const ds_tensor *proj, ds_tensor *out) {
    ds_cpu *cpu = ds_cpu_of(be);
    const ds_batch *b = ds_cpu_batch(cpu);
    DS_ASSERT(layer >= 0 && layer < c->n_layers && !c->is_attn[layer]);
    gdn_job j = {
        .cpu = cpu,
        .c = c,
        .b = b,
        .pool = c->pool_of_layer[layer],
        .proj = proj->data,
        .out = out->data,
        .conv_w = w->conv.data,
        .neg_exp_A = w->neg_exp_A.data,
        .dt_bias = w->dt_bias.data,
        .norm_w = w->norm.data,
        .Hk = cfg->gdn_k_heads,
        .Hv = cfg->gdn_v_heads,
        .dk = cfg->gdn_k_dim,
        .dv = cfg->gdn_v_dim,
        .K = cfg->gdn_conv_kernel,
        .conv_dim = ds_config_gdn_conv_dim(cfg),
        .eps = (float)cfg->rms_eps,
        .q_scale = (float)pow((double)cfg->gdn_k_dim, -0.5),
        .mode = cpu->gdn_mode,
    };
    j.width = (int64_t)j.conv_dim + (int64_t)j.Hv * j.dv + 2 * (int64_t)j.Hv;
    int T = b->n_tokens;
    DS_ASSERT(j.Hk > 0 && j.Hv % j.Hk == 0 && j.conv_dim == c->conv_dim &&
              j.K - 1 == c->conv_hist && j.Hv == c->gdn_v_heads && j.dk == c->gdn_k_dim &&
              j.dv == c->gdn_v_dim);
    DS_ASSERT(proj->dtype == DS_DTYPE_F32 && out->dtype == DS_DTYPE_F32);
    DS_ASSERT(proj->ne[proj->ndim - 1] == j.width && ds_tensor_numel(proj) >= (int64_t)T * j.width);
    DS_ASSERT(ds_tensor_numel(out) >= (int64_t)T * j.Hv * j.dv);
    DS_ASSERT(w->conv.dtype == DS_DTYPE_F32 &&
              ds_tensor_numel(&w->conv) == (int64_t)j.conv_dim * j.K);
    DS_ASSERT(w->neg_exp_A.dtype == DS_DTYPE_F32 && ds_tensor_numel(&w->neg_exp_A) == j.Hv);
    DS_ASSERT(w->dt_bias.dtype == DS_DTYPE_F32 && ds_tensor_numel(&w->dt_bias) == j.Hv);
    DS_ASSERT(w->norm.dtype == DS_DTYPE_F32 && ds_tensor_numel(&w->norm) == j.dv);
    DS_ASSERT(b->seq_start[0] == 0 && b->seq_start[b->n_seqs] == T);
    for (int s = 0; s < b->n_seqs; s++) {
        DS_ASSERT(b->seq_slot[s] >= 0 && b->seq_slot[s] < c->desc.n_slots &&
                  b->seq_start[s + 1] >= b->seq_start[s]);
        for (int t = b->seq_start[s]; b->state_out_slots && t < b->seq_start[s + 1]; t++) {
            int o = b->state_out_slots[t];
            DS_ASSERT(o < c->desc.n_slots && o != b->seq_slot[s]);
            for (int u = b->seq_start[s]; o >= 0 && u < t; u++)
                DS_ASSERT(b->state_out_slots[u] != o);
        }
    }
    if (T == 0) return;

    j.xc = ds_cpu_work(cpu, DS_CPU_WORK_A, (size_t)T * (size_t)j.conv_dim);
    j.gb = ds_cpu_work(cpu, DS_CPU_WORK_B, (size_t)T * 2 * (size_t)j.Hv);

    ds_threadpool_for(cpu->pool, j.conv_dim, ds_threadpool_chunk(cpu->pool, j.conv_dim, 64),
                      gdn_conv_task, &j);
    ds_threadpool_for(cpu->pool, T, ds_threadpool_chunk(cpu->pool, T, 4), gdn_gate_task, &j);
    ds_threadpool_for(cpu->pool, (int64_t)b->n_seqs * j.Hv, 1, gdn_head_task, &j);
}
