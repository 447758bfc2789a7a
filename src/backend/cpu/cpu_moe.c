/* cpu_moe.c — sparse MoE block: router (softmax, top-k, renormalise), experts grouped by
 * expert so each selected expert's weights are streamed once per token chunk, shared expert
 * with its sigmoid gate.
 *
 * x [T, H] → out [T, H] = Σ_top-k w_e · down_e(SiLU(g_e) ⊙ u_e) + σ(x·w_sg) · shared(x).
 * The grouped matmuls run as one parallel-for over (expert segment, weight-row block) units, so
 * the threads split the weight rows of all selected experts (and the shared expert) evenly. */
#include <math.h>
#include <stdlib.h>

#include "backend/cpu/cpu_internal.h"

#define MOE_MAX_TOKENS 512 /* tokens per pass: bounds the grouped buffers (~T·k·(2H + 3I)) */
#define MOE_UNIT_ROWS  16  /* weight rows per work unit */

/* One matmul of the grouped call: out[R, n_out] = x[R, n_in] · wᵀ. */
typedef struct moe_seg {
    const ds_linear *w;
    const float *x;
    float *out;
    int64_t R;
} moe_seg;

typedef struct grouped_job {
    ds_cpu *cpu;
    const moe_seg *segs;
    int n_segs;
    /* (segment, part) pairs flattened: pair q = seg·DS_LINEAR_MAX_PARTS + part */
    int64_t *unit_start; /* [n_pairs + 1] first unit of each pair */
    int n_pairs;
    int64_t max_in;
} grouped_job;

static void grouped_task(void *ctx, int64_t begin, int64_t end, int tid) {
    grouped_job *j = ctx;
    float *scratch = ds_cpu_scratch(j->cpu, tid, DS_CPU_SCRATCH_KERNEL,
                                    (size_t)DS_CPU_MATMUL_BLOCK * (size_t)j->max_in);
    int q = 0;
    for (int64_t u = begin; u < end;) {
        while (u >= j->unit_start[q + 1]) q++;
        const moe_seg *sg = &j->segs[q / DS_LINEAR_MAX_PARTS];
        int part = q % DS_LINEAR_MAX_PARTS;
        const ds_tensor *wt = &sg->w->parts[part];
        int64_t col = 0;
        for (int p = 0; p < part; p++) col += sg->w->parts[p].ne[0];
        int64_t u_end = end < j->unit_start[q + 1] ? end : j->unit_start[q + 1];
        int64_t r0 = (u - j->unit_start[q]) * MOE_UNIT_ROWS;
        int64_t r1 = (u_end - j->unit_start[q]) * MOE_UNIT_ROWS;
        if (r1 > wt->ne[0]) r1 = wt->ne[0];
        ds_cpu_matmul_rows(sg->x, sg->R, sg->w->n_in, wt, r0, r1 - r0, sg->out + col + r0,
                           sg->w->n_out, scratch);
        u = u_end;
    }
}

static void grouped_linear(ds_cpu *cpu, const moe_seg *segs, int n_segs, int64_t *unit_start) {
    grouped_job j = {.cpu = cpu,
                     .segs = segs,
                     .n_segs = n_segs,
                     .unit_start = unit_start,
                     .n_pairs = n_segs * DS_LINEAR_MAX_PARTS};
    int64_t units = 0;
    for (int s = 0; s < n_segs; s++) {
        const ds_linear *w = segs[s].w;
        if (w->n_in > j.max_in) j.max_in = w->n_in;
        for (int p = 0; p < DS_LINEAR_MAX_PARTS; p++) {
            unit_start[s * DS_LINEAR_MAX_PARTS + p] = units;
            if (p < w->n_parts && segs[s].R > 0)
                units += (w->parts[p].ne[0] + MOE_UNIT_ROWS - 1) / MOE_UNIT_ROWS;
        }
    }
    unit_start[j.n_pairs] = units;
    ds_threadpool_for(cpu->pool, units, ds_threadpool_chunk(cpu->pool, units, 1), grouped_task, &j);
}

/* out[R, I] = SiLU(gu[:, :I]) ⊙ gu[:, I:] */
static void silu_mul_rows(const float *gu, int64_t R, int64_t I, float *out) {
    for (int64_t r = 0; r < R; r++)
        for (int64_t i = 0; i < I; i++)
            out[r * I + i] = ds_cpu_silu(gu[r * 2 * I + i]) * gu[r * 2 * I + I + i];
}

/* Top-k of p[E] by value, ties to the lower index; indices in decreasing-weight order. */
static void topk(const float *p, int E, int k, int32_t *idx) {
    for (int j = 0; j < k; j++) {
        int best = -1;
        for (int e = 0; e < E; e++) {
            bool taken = false;
            for (int q = 0; q < j; q++) taken |= idx[q] == e;
            if (!taken && (best < 0 || p[e] > p[best])) best = e;
        }
        idx[j] = best;
    }
}

static void moe_pass(ds_cpu *cpu, const ds_config *cfg, const ds_moe_weights *w, const float *x,
                     int64_t T, int64_t H, float *out) {
    int E = w->n_experts, k = cfg->top_k;
    int64_t N = T * k;
    int64_t I = w->experts[0].gate_up.n_out / 2;
    int64_t Is = w->has_shared ? w->shared.gate_up.n_out / 2 : 0;

    /* carve one work buffer (floats; int32 arrays share the 4-byte slots) */
    size_t n_logits = (size_t)T * E, n_sel = (size_t)N;
    size_t total = n_logits + 3 * n_sel + (size_t)E + 1 + (size_t)N * H /* xg */ +
                   (size_t)N * 2 * I + (size_t)N * I + (size_t)N * H /* y */ +
                   (size_t)T * (3 * Is + H + 1) /* shared gu, act, y, gate */;
    float *buf = ds_cpu_work(cpu, DS_CPU_WORK_A, total);
    float *logits = buf;                           /* [T, E] router logits → probabilities */
    int32_t *sel = (int32_t *)(logits + n_logits); /* [T, k] expert ids */
    float *wt = (float *)(sel + n_sel);            /* [T, k] routing weights */
    int32_t *pos = (int32_t *)(wt + n_sel);        /* [T, k] row of (t, j) in the grouped order */
    int32_t *off = pos + n_sel;                    /* [E + 1] first grouped row of each expert */
    float *xg = (float *)(off + E + 1);            /* [N, H] tokens grouped by expert */
    float *gu = xg + (size_t)N * H;                /* [N, 2I] */
    float *act = gu + (size_t)N * 2 * I;           /* [N, I] */
    float *y = act + (size_t)N * I;                /* [N, H] */
    float *s_gu = y + (size_t)N * H;               /* [T, 2Is] */
    float *s_act = s_gu + (size_t)T * 2 * Is;      /* [T, Is] */
    float *s_y = s_act + (size_t)T * Is;           /* [T, H] */
    float *s_gate = s_y + (size_t)T * H;           /* [T] */

    /* router: logits = x·routerᵀ, softmax, top-k, renormalise */
    ds_linear router = {.n_parts = 1, .n_out = E, .n_in = H};
    router.parts[0] = w->router;
    ds_cpu_linear_f32(cpu, x, T, H, &router, logits, E);
    memset(off, 0, (size_t)(E + 1) * sizeof *off);
    for (int64_t t = 0; t < T; t++) {
        float *p = logits + t * E;
        float m = p[0], sum = 0.0f;
        for (int e = 1; e < E; e++) m = p[e] > m ? p[e] : m;
        for (int e = 0; e < E; e++) {
            p[e] = expf(p[e] - m);
            sum += p[e];
        }
        for (int e = 0; e < E; e++) p[e] /= sum;
        int32_t *st = sel + t * k;
        topk(p, E, k, st);
        float wsum = 0.0f;
        for (int j = 0; j < k; j++) wsum += p[st[j]];
        for (int j = 0; j < k; j++) {
            wt[t * k + j] = cfg->norm_topk_prob ? p[st[j]] / wsum : p[st[j]];
            off[st[j] + 1]++;
        }
    }
    /* group rows by expert (tokens ascending inside each expert) */
    for (int e = 0; e < E; e++) off[e + 1] += off[e];
    for (int64_t t = 0; t < T; t++) {
        for (int j = 0; j < k; j++) {
            int e = sel[t * k + j];
            int32_t r = off[e]++;
            pos[t * k + j] = r;
            memcpy(xg + (size_t)r * H, x + t * H, (size_t)H * sizeof(float));
        }
    }
    for (int e = E; e > 0; e--) off[e] = off[e - 1]; /* restore starts */
    off[0] = 0;

    /* segments: every expert with rows, plus the shared expert */
    moe_seg *segs = ds_xmalloc(sizeof(moe_seg) * (size_t)(E + 1));
    int64_t *unit_start = ds_xmalloc(sizeof(int64_t) * ((size_t)(E + 1) * DS_LINEAR_MAX_PARTS + 1));
    int n_segs = 0;
    for (int e = 0; e < E; e++) {
        int64_t n = off[e + 1] - off[e];
        if (n == 0) continue;
        DS_ASSERT(w->experts[e].gate_up.n_out == 2 * I && w->experts[e].gate_up.n_in == H);
        segs[n_segs++] = (moe_seg){&w->experts[e].gate_up, xg + (size_t)off[e] * H,
                                   gu + (size_t)off[e] * 2 * I, n};
    }
    if (w->has_shared) {
        DS_ASSERT(w->shared.gate_up.n_in == H);
        segs[n_segs++] = (moe_seg){&w->shared.gate_up, x, s_gu, T};
    }
    grouped_linear(cpu, segs, n_segs, unit_start);

    silu_mul_rows(gu, N, I, act);
    if (w->has_shared) silu_mul_rows(s_gu, T, Is, s_act);

    n_segs = 0;
    for (int e = 0; e < E; e++) {
        int64_t n = off[e + 1] - off[e];
        if (n == 0) continue;
        DS_ASSERT(w->experts[e].down.n_out == H && w->experts[e].down.n_in == I);
        segs[n_segs++] =
            (moe_seg){&w->experts[e].down, act + (size_t)off[e] * I, y + (size_t)off[e] * H, n};
    }
    if (w->has_shared) {
        DS_ASSERT(w->shared.down.n_out == H && w->shared.down.n_in == Is);
        segs[n_segs++] = (moe_seg){&w->shared.down, s_act, s_y, T};
    }
    grouped_linear(cpu, segs, n_segs, unit_start);
    free(segs);
    free(unit_start);

    if (w->has_shared) {
        DS_ASSERT(ds_tensor_numel(&w->shared_gate) == H);
        float *scratch =
            ds_cpu_scratch(cpu, 0, DS_CPU_SCRATCH_KERNEL, (size_t)DS_CPU_MATMUL_BLOCK * (size_t)H);
        ds_cpu_matmul_rows(x, T, H, &w->shared_gate, 0, 1, s_gate, 1, scratch);
    }
    /* combine in top-k order, then the gated shared expert */
    for (int64_t t = 0; t < T; t++) {
        float *o = out + t * H;
        memset(o, 0, (size_t)H * sizeof(float));
        for (int j = 0; j < k; j++)
            ds_cpu_axpy(wt[t * k + j], y + (size_t)pos[t * k + j] * H, o, H);
        if (w->has_shared) ds_cpu_axpy(ds_cpu_sigmoid(s_gate[t]), s_y + t * H, o, H);
    }
}

void ds_cpu_op_moe(ds_backend *be, const ds_config *cfg, const ds_moe_weights *w,
                   const ds_tensor *x, ds_tensor *out) {
    ds_cpu *cpu = ds_cpu_of(be);
    DS_ASSERT(x->dtype == DS_DTYPE_F32 && out->dtype == DS_DTYPE_F32);
    int64_t H = x->ne[x->ndim - 1];
    int64_t T = ds_tensor_numel(x) / H;
    DS_ASSERT(ds_tensor_numel(out) >= T * H);
    DS_ASSERT(w->n_experts > 0 && cfg->top_k > 0 && cfg->top_k <= w->n_experts && w->experts);
    DS_ASSERT(w->router.ndim == 2 && w->router.ne[0] == w->n_experts && w->router.ne[1] == H);
    for (int64_t t0 = 0; t0 < T; t0 += MOE_MAX_TOKENS) {
        int64_t n = T - t0 < MOE_MAX_TOKENS ? T - t0 : MOE_MAX_TOKENS;
        moe_pass(cpu, cfg, w, (const float *)x->data + t0 * H, n, H, (float *)out->data + t0 * H);
    }
}
