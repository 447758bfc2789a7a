/* cpu_argmax.c — greedy heads: argmax over logits rows, the lm_head fused with the argmax
 * (argmax_logits) and its banned-id table (set_argmax_bans, catalogue item 6).
 *
 * On the CPU "fused" only means that no logits leave the op: the lm_head rows are computed by
 * the same kernel as the logits op (ds_cpu_linear_f32, same accumulation order), so the ids
 * equal argmax(logits) bit for bit, and the ban is applied by integer indexing into that row:
 * the banned entries are overwritten with NaN (which never wins) and the argmax is taken again
 * only when the plain winner was banned. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/cpu_internal.h"

static int64_t last_dim(const ds_tensor *t) { return t->ne[t->ndim - 1]; }
static int64_t n_rows(const ds_tensor *t) { return ds_tensor_numel(t) / last_dim(t); }

/* Lowest index of the maximum of row[0..V); a NaN never wins over a number (all NaN: 0). */
int64_t ds_cpu_argmax_row(const float *row, int64_t V) {
    int64_t best = 0;
    float bv = row[0];
    for (int64_t v = 1; v < V; v++) { /* strict > keeps the lowest index on ties */
        if (row[v] > bv || (isnan(bv) && !isnan(row[v]))) {
            bv = row[v];
            best = v;
        }
    }
    return best;
}

void ds_cpu_op_argmax(ds_backend *be, const ds_tensor *logits, int32_t *ids) {
    (void)be;
    DS_ASSERT(logits->dtype == DS_DTYPE_F32);
    const int64_t V = last_dim(logits), R = n_rows(logits);
    const float *l = logits->data;
    for (int64_t r = 0; r < R; r++) ids[r] = (int32_t)ds_cpu_argmax_row(l + r * V, V);
}

bool ds_cpu_set_argmax_bans(ds_backend *be, const int32_t *ids, int B, int n_ban) {
    ds_cpu *cpu = ds_cpu_of(be);
    DS_ASSERT(B >= 0 && n_ban >= 0 && (B == 0 || n_ban == 0 || ids));
    cpu->ban_rows = 0;
    cpu->ban_n = 0;
    if (B == 0 || n_ban == 0) return true;
    const size_t n = (size_t)B * (size_t)n_ban;
    if (n > cpu->ban_cap) {
        int32_t *p = realloc(cpu->bans, n * sizeof(int32_t));
        if (!p) return false; /* cleared above */
        cpu->bans = p;
        cpu->ban_cap = n;
    }
    memcpy(cpu->bans, ids, n * sizeof(int32_t));
    cpu->ban_rows = B;
    cpu->ban_n = n_ban;
    return true;
}

/* The argmax of row (scratch, clobbered) over the ids bans[0..n) does not list; the plain
 * argmax when none is left. */
static int64_t argmax_row_banned(float *row, int64_t V, const int32_t *bans, int n) {
    const int64_t plain = ds_cpu_argmax_row(row, V);
    bool hit = false;
    for (int j = 0; j < n; j++) hit |= bans[j] == plain;
    if (!hit) return plain; /* the winner is allowed: nothing to redo */
    for (int j = 0; j < n; j++)
        if (bans[j] >= 0 && bans[j] < V) row[bans[j]] = NAN;
    const int64_t best = ds_cpu_argmax_row(row, V);
    return isnan(row[best]) ? plain : best;
}

void ds_cpu_op_argmax_logits(ds_backend *be, const ds_tensor *x, const ds_linear *lm_head,
                             int32_t *ids, int keep_at) {
    ds_cpu *cpu = ds_cpu_of(be);
    DS_ASSERT(x->dtype == DS_DTYPE_F32);
    const int64_t K = lm_head->n_in, V = lm_head->n_out, R = n_rows(x);
    DS_ASSERT(last_dim(x) == K);
    DS_ASSERT(keep_at < 0 || keep_at + R <= DS_TOKEN_BUF);
    DS_ASSERT(ids || keep_at >= 0);
    if (R == 0) return;
    float *logits = ds_cpu_work(cpu, DS_CPU_WORK_A, (size_t)R * (size_t)V); /* [R, V] */
    ds_cpu_linear_f32(cpu, x->data, R, K, lm_head, logits, V);
    for (int64_t r = 0; r < R; r++) {
        float *row = logits + r * V;
        const int32_t id =
            r < cpu->ban_rows
                ? (int32_t)argmax_row_banned(row, V, cpu->bans + r * cpu->ban_n, cpu->ban_n)
                : (int32_t)ds_cpu_argmax_row(row, V);
        if (ids) ids[r] = id;
        if (keep_at >= 0) cpu->tokbuf[keep_at + r] = id;
    }
}

void ds_cpu_op_copy_tokens(ds_backend *be, int at, int n, int32_t *host) {
    ds_cpu *cpu = ds_cpu_of(be);
    DS_ASSERT(at >= 0 && n >= 0 && at + n <= DS_TOKEN_BUF && (host || n == 0));
    if (n) memcpy(host, cpu->tokbuf + at, (size_t)n * sizeof(int32_t));
}
