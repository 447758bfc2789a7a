/* cpu_spec_sample.c — sampled verifications' target ids (backend.h spec_sample) and their
 * per-sequence table (set_spec_sampling): the reference cuda_spec_sample.cu is tested against.
 *
 * Written for obviousness, not speed: each threshold comes from a sort of the row's keys (the
 * CUDA kernel finds the same keys by radix selection), sums are in double. The order-preserving
 * key of a float makes "z ≥ c" an integer comparison, so ties and NaN are handled the same way
 * on both backends. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/cpu_internal.h"
#include "sampling/counter_rng.h"

void ds_cpu_set_spec_sampling(ds_backend *be, const ds_spec_sampling *seqs, int S) {
    ds_cpu *cpu = ds_cpu_of(be);
    DS_ASSERT(S >= 0 && S <= DS_SPEC_SAMPLING_MAX && (S == 0 || seqs));
    if (S > 0) memcpy(cpu->samp, seqs, (size_t)S * sizeof *seqs);
    cpu->samp_n = S;
}

/* Order-preserving key of z (a larger float, a larger key); NaN below everything. */
static uint32_t z_key(float z) {
    if (isnan(z)) return 0;
    uint32_t u;
    memcpy(&u, &z, sizeof u);
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

static int cmp_key_desc(const void *a, const void *b) {
    const uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return (x < y) - (x > y);
}

typedef struct keyed {
    uint32_t key;
    float w;
} keyed;

static int cmp_keyed_desc(const void *a, const void *b) {
    return cmp_key_desc(&((const keyed *)a)->key, &((const keyed *)b)->key);
}

/* The smallest key of the survivors (backend.h spec_sample) of z[0..V) with maximum zmax;
 * keys [V] and sorted [V] are scratch. */
static uint32_t survivor_threshold(const float *z, int V, float zmax, const ds_spec_sampling *P,
                                   uint32_t *keys, keyed *sorted) {
    uint32_t thr = 0;
    if (P->min_p > 0.0f) thr = z_key(zmax + logf(P->min_p));
    if (P->top_k > 0 && P->top_k < V) {
        for (int v = 0; v < V; v++) keys[v] = z_key(z[v]);
        qsort(keys, (size_t)V, sizeof *keys, cmp_key_desc);
        if (keys[P->top_k - 1] > thr) thr = keys[P->top_k - 1];
    }
    if (P->top_p < 1.0f) {
        int n = 0;
        double total = 0.0;
        for (int v = 0; v < V; v++) {
            const uint32_t k = z_key(z[v]);
            if (k < thr) continue;
            sorted[n++] = (keyed){k, expf(z[v] - zmax)};
            total += sorted[n - 1].w;
        }
        qsort(sorted, (size_t)n, sizeof *sorted, cmp_keyed_desc);
        const double target = (double)P->top_p * total;
        double cum = 0.0;
        int i = 0;
        while (i < n - 1 && (cum += sorted[i].w) < target) i++;
        if (n > 0 && sorted[i].key > thr) thr = sorted[i].key;
    }
    return thr;
}

/* Target id of one row (backend.h spec_sample); z [V] scratch. */
static int32_t sample_row(const float *logits, int V, const ds_spec_sampling *P, int64_t pos,
                          float *z, uint32_t *keys, keyed *sorted) {
    if (!(P->temperature > 0.0f)) return (int32_t)ds_cpu_argmax_row(logits, V);
    const float inv_t = 1.0f / P->temperature; /* the CUDA kernel's z, to the bit */
    float zmax = -INFINITY;
    for (int v = 0; v < V; v++) {
        z[v] = logits[v] * inv_t;
        if (z[v] > zmax) zmax = z[v]; /* NaN never */
    }
    if (!isfinite(zmax)) return (int32_t)ds_cpu_argmax_row(logits, V);
    const uint32_t thr = survivor_threshold(z, V, zmax, P, keys, sorted);
    const uint64_t key = ds_crng_key(P->seed, pos + 1);
    /* the survivors' weights, then the inverse CDF in id order */
    double total = 0.0;
    for (int v = 0; v < V; v++) {
        if (z_key(z[v]) < thr) {
            z[v] = 0.0f; /* from here on z holds the weights */
            continue;
        }
        z[v] = expf(z[v] - zmax);
        total += z[v];
    }
    if (!(total > 0.0)) return 0;
    const double target = (double)ds_crng_uniform(key, DS_CRNG_DRAW) * total;
    double cum = 0.0;
    int last = 0;
    for (int v = 0; v < V; v++) {
        if (z[v] <= 0.0f) continue;
        last = v;
        if ((cum += z[v]) > target) return v;
    }
    return last; /* rounding: the last with weight */
}

void ds_cpu_op_spec_sample(ds_backend *be, const ds_tensor *logits, int ids_at) {
    ds_cpu *cpu = ds_cpu_of(be);
    const ds_batch *b = ds_cpu_batch(cpu);
    const int T = b->n_tokens, S = b->n_seqs;
    DS_ASSERT(logits->dtype == DS_DTYPE_F32 && logits->ndim == 2 && logits->ne[0] == T);
    DS_ASSERT(ids_at >= 0 && ids_at + T <= DS_TOKEN_BUF && S <= cpu->samp_n);
    const int V = (int)logits->ne[1];
    float *z = ds_cpu_work(cpu, DS_CPU_WORK_A, (size_t)V);
    uint32_t *keys = (uint32_t *)ds_cpu_work(cpu, DS_CPU_WORK_B, (size_t)V);
    keyed *sorted = (keyed *)ds_cpu_work(cpu, DS_CPU_WORK_C, 2 * (size_t)V);
    for (int s = 0; s < S; s++)
        for (int t = b->seq_start[s]; t < b->seq_start[s + 1]; t++)
            cpu->tokbuf[ids_at + t] =
                sample_row((const float *)logits->data + (size_t)t * (size_t)V, V, &cpu->samp[s],
                           b->positions[t], z, keys, sorted);
}
