/* cpu_elementwise.c — row-wise ops: embed, RMSNorm, residual add + RMSNorm, SiLU·mul,
 * gather_rows (argmax: cpu_argmax.c). Rows are split across threads only when there is enough
 * work. */
#include <math.h>

#include "backend/cpu/cpu_internal.h"

#define ROWS_PARALLEL_MIN_ELEMS 32768 /* below this the pool's wake-up costs more than it saves */

static int64_t last_dim(const ds_tensor *t) { return t->ne[t->ndim - 1]; }
static int64_t n_rows(const ds_tensor *t) { return ds_tensor_numel(t) / last_dim(t); }

/* Runs fn over R rows of D elements, in parallel when worthwhile. */
static void for_rows(ds_cpu *cpu, int64_t R, int64_t D, ds_parallel_fn fn, void *ctx) {
    if (R * D < ROWS_PARALLEL_MIN_ELEMS) {
        fn(ctx, 0, R, 0);
        return;
    }
    int64_t min_rows = ROWS_PARALLEL_MIN_ELEMS / (4 * D) + 1;
    ds_threadpool_for(cpu->pool, R, ds_threadpool_chunk(cpu->pool, R, min_rows), fn, ctx);
}

/* ---- embed ----------------------------------------------------------------------------------- */

typedef struct embed_job {
    const ds_tensor *table;
    const int32_t *tokens;
    const int32_t *token_src; /* [T] or NULL (backend.h ds_batch.token_src) */
    const int32_t *tokbuf;    /* [DS_TOKEN_BUF] */
    float *out; /* [T, H] */
    int64_t H;
} embed_job;

static void embed_task(void *ctx, int64_t b, int64_t e, int tid) {
    (void)tid;
    embed_job *j = ctx;
    int64_t V = j->table->ne[0];
    for (int64_t t = b; t < e; t++) {
        const int64_t id = ds_cpu_row_token(j->tokens, j->token_src, j->tokbuf, t);
        DS_ASSERT(id >= 0 && id < V);
        float *o = j->out + t * j->H;
        const char *row = (const char *)j->table->data +
                          (size_t)id * (size_t)j->H * ds_dtype_size(j->table->dtype);
        switch (j->table->dtype) {
        case DS_DTYPE_F32: memcpy(o, row, (size_t)j->H * sizeof(float)); break;
        case DS_DTYPE_BF16:
            for (int64_t i = 0; i < j->H; i++) o[i] = ds_bf16_to_f32(((const uint16_t *)row)[i]);
            break;
        case DS_DTYPE_F16:
            for (int64_t i = 0; i < j->H; i++) o[i] = ds_f16_to_f32(((const uint16_t *)row)[i]);
            break;
        default: DS_ASSERT(!"embed: table dtype must be F32, BF16 or F16");
        }
    }
}

void ds_cpu_op_embed(ds_backend *be, const ds_tensor *table, ds_tensor *out) {
    ds_cpu *cpu = ds_cpu_of(be);
    const ds_batch *b = ds_cpu_batch(cpu);
    DS_ASSERT(table->ndim == 2 && out->dtype == DS_DTYPE_F32);
    embed_job j = {.table = table,
                   .tokens = b->tokens,
                   .token_src = b->token_src,
                   .tokbuf = cpu->tokbuf,
                   .out = out->data,
                   .H = table->ne[1]};
    DS_ASSERT(last_dim(out) == j.H && n_rows(out) >= b->n_tokens);
    for_rows(cpu, b->n_tokens, j.H, embed_task, &j);
}

/* ---- RMSNorm --------------------------------------------------------------------------------- */

/* out = x · rsqrt(mean(x²) + eps) · w; (x·r)·w in that order, as PyTorch does. */
void ds_cpu_rmsnorm_row(const float *x, const float *w, float eps, int64_t D, float *out) {
    float ss = ds_cpu_dot(x, x, D);
    float r = 1.0f / sqrtf(ss / (float)D + eps);
    for (int64_t i = 0; i < D; i++) out[i] = (x[i] * r) * w[i];
}

typedef struct norm_job {
    float *res;         /* [R, D] residual (add_rmsnorm) or NULL */
    const float *delta; /* [R, D] */
    const float *x;     /* [R, D] input (rmsnorm) */
    const float *w;     /* [D] */
    float eps;
    float *out; /* [R, D] */
    int64_t D;
} norm_job;

static void rmsnorm_task(void *ctx, int64_t b, int64_t e, int tid) {
    (void)tid;
    norm_job *j = ctx;
    for (int64_t r = b; r < e; r++)
        ds_cpu_rmsnorm_row(j->x + r * j->D, j->w, j->eps, j->D, j->out + r * j->D);
}

static void add_rmsnorm_task(void *ctx, int64_t b, int64_t e, int tid) {
    (void)tid;
    norm_job *j = ctx;
    for (int64_t r = b; r < e; r++) {
        float *res = j->res + r * j->D;
        const float *d = j->delta + r * j->D;
        for (int64_t i = 0; i < j->D; i++) res[i] += d[i];
        ds_cpu_rmsnorm_row(res, j->w, j->eps, j->D, j->out + r * j->D);
    }
}

void ds_cpu_op_rmsnorm(ds_backend *be, const ds_tensor *x, const ds_tensor *w, float eps,
                       ds_tensor *out) {
    DS_ASSERT(x->dtype == DS_DTYPE_F32 && w->dtype == DS_DTYPE_F32 && out->dtype == DS_DTYPE_F32);
    int64_t D = last_dim(x);
    DS_ASSERT(ds_tensor_numel(w) == D && ds_tensor_numel(out) >= ds_tensor_numel(x));
    norm_job j = {.x = x->data, .w = w->data, .eps = eps, .out = out->data, .D = D};
    for_rows(ds_cpu_of(be), n_rows(x), D, rmsnorm_task, &j);
}

void ds_cpu_op_add_rmsnorm(ds_backend *be, ds_tensor *residual, const ds_tensor *delta,
                           const ds_tensor *w, float eps, ds_tensor *out) {
    DS_ASSERT(residual->dtype == DS_DTYPE_F32 && delta->dtype == DS_DTYPE_F32 &&
              w->dtype == DS_DTYPE_F32 && out->dtype == DS_DTYPE_F32);
    int64_t D = last_dim(residual);
    DS_ASSERT(ds_tensor_numel(w) == D && ds_tensor_numel(delta) == ds_tensor_numel(residual) &&
              ds_tensor_numel(out) >= ds_tensor_numel(residual));
    norm_job j = {.res = residual->data,
                  .delta = delta->data,
                  .w = w->data,
                  .eps = eps,
                  .out = out->data,
                  .D = D};
    for_rows(ds_cpu_of(be), n_rows(residual), D, add_rmsnorm_task, &j);
}

/* ---- SiLU(gate) ⊙ up ------------------------------------------------------------------------- */

typedef struct silu_job {
    const float *gu; /* [R, 2I] */
    float *out;      /* [R, I] */
    int64_t I;
} silu_job;

static void silu_mul_task(void *ctx, int64_t b, int64_t e, int tid) {
    (void)tid;
    silu_job *j = ctx;
    for (int64_t r = b; r < e; r++) {
        const float *g = j->gu + r * 2 * j->I, *u = g + j->I;
        float *o = j->out + r * j->I;
        for (int64_t i = 0; i < j->I; i++) o[i] = ds_cpu_silu(g[i]) * u[i];
    }
}

void ds_cpu_op_silu_mul(ds_backend *be, const ds_tensor *gate_up, ds_tensor *out) {
    DS_ASSERT(gate_up->dtype == DS_DTYPE_F32 && out->dtype == DS_DTYPE_F32);
    int64_t I = last_dim(out);
    DS_ASSERT(last_dim(gate_up) == 2 * I && n_rows(out) >= n_rows(gate_up));
    silu_job j = {.gu = gate_up->data, .out = out->data, .I = I};
    for_rows(ds_cpu_of(be), n_rows(gate_up), 2 * I, silu_mul_task, &j);
}

/* ---- gather_rows ----------------------------------------------------------------------------- */

void ds_cpu_op_gather_rows(ds_backend *be, const ds_tensor *x, ds_tensor *out) {
    const ds_batch *b = ds_cpu_batch(ds_cpu_of(be));
    DS_ASSERT(x->dtype == DS_DTYPE_F32 && out->dtype == DS_DTYPE_F32);
    int64_t H = last_dim(x), R = n_rows(x);
    DS_ASSERT(last_dim(out) == H && n_rows(out) >= b->n_out);
    const float *src = x->data;
    float *dst = out->data;
    for (int r = 0; r < b->n_out; r++) {
        int64_t row = b->out_rows[r];
        DS_ASSERT(row >= 0 && row < R);
        memmove(dst + (int64_t)r * H, src + row * H, (size_t)H * sizeof(float));
    }
}

/* ---- concat ---------------------------------------------------------------------------------- */

void ds_cpu_op_concat(ds_backend *be, const ds_tensor *a, const ds_tensor *b, ds_tensor *out) {
    (void)be;
    DS_ASSERT(a->dtype == DS_DTYPE_F32 && b->dtype == DS_DTYPE_F32 && out->dtype == DS_DTYPE_F32);
    const int64_t A = last_dim(a), B = last_dim(b), R = n_rows(a);
    DS_ASSERT(n_rows(b) == R && last_dim(out) == A + B && n_rows(out) >= R);
    const float *pa = a->data, *pb = b->data;
    float *po = out->data;
    for (int64_t r = 0; r < R; r++) {
        memcpy(po + r * (A + B), pa + r * A, (size_t)A * sizeof(float));
        memcpy(po + r * (A + B) + A, pb + r * B, (size_t)B * sizeof(float));
    }
}
