/* spec_sample_case.h — backend.h spec_sample (sampled verifications' target ids) on any backend:
 * test_spec_ops.c checks the CPU reference's distributions, test_cuda_ops.c the CUDA backend's
 * ids against the CPU's and its distributions too.
 *
 * One call verifies SS_S sequences of SS_ROWS rows (two drafts each) over SS_V = 64 ids. The
 * sequences come in SS_G groups of sampling parameters (greedy; temperature alone; with top_k;
 * with top_p and min_p; a low temperature with top_k and top_p), each group with its own fixed
 * logits rows, and every sequence has its own seed, so one call is SS_S / SS_G independent
 * draws per group. Draft rows of odd sequences take their draft from the token buffer
 * (token_src), even ones from tokens (an id must depend on neither: backend.h).
 * The expected distribution of each row is computed here from the specification in backend.h
 * (double precision, a sort), independently of both backends: row 0's draft is a likely token
 * (accepted often), row 1's an unlikely one, row 2 has
 * none — each row's ids must follow p whatever its draft. */
#ifndef DS_TEST_SPEC_SAMPLE_CASE_H
#define DS_TEST_SPEC_SAMPLE_CASE_H

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "testlib.h"

enum { SS_V = 64, SS_ROWS = 3, SS_G = 5, SS_S = 255, SS_T = SS_S * SS_ROWS };
enum { SS_IDS_AT = 1024, SS_DRAFT_AT = 0 };

static const ds_spec_sampling ss_params[SS_G] = {
    {.temperature = 0.0f, .top_p = 1.0f},
    {.temperature = 0.9f, .top_p = 1.0f},
    {.temperature = 1.3f, .top_p = 1.0f, .top_k = 6},
    {.temperature = 0.7f, .top_p = 0.8f, .min_p = 0.02f},
    /* z spread over ±100: fewer than top_k ids lie within 64 of the maximum (a kernel that
     * looks only near the maximum must give way to a full selection here) */
    {.temperature = 0.05f, .top_p = 0.9f, .top_k = 30},
};

typedef struct ss_case {
    float logits[SS_G][SS_ROWS][SS_V]; /* per group and row */
    int32_t draft[SS_G][SS_ROWS - 1];  /* row j's draft (the token of row j + 1) */
    double p[SS_G][SS_ROWS][SS_V];     /* each row's distribution (greedy: one-hot argmax) */
} ss_case;

/* p of one row per backend.h spec_sample, in double. */
static void ss_expected(const float *l, const ds_spec_sampling *P, double *p) {
    if (P->temperature <= 0.0f) {
        int best = 0;
        for (int v = 1; v < SS_V; v++)
            if (l[v] > l[best]) best = v;
        for (int v = 0; v < SS_V; v++) p[v] = v == best;
        return;
    }
    double z[SS_V], sorted[SS_V], zmax = -INFINITY;
    for (int v = 0; v < SS_V; v++) zmax = fmax(zmax, z[v] = (double)l[v] / P->temperature);
    double thr = -INFINITY;
    if (P->min_p > 0) thr = zmax + log(P->min_p);
    for (int v = 0; v < SS_V; v++) sorted[v] = z[v];
    for (int i = 1; i < SS_V; i++) /* insertion sort, descending */
        for (int j = i; j > 0 && sorted[j] > sorted[j - 1]; j--) {
            double t = sorted[j];
            sorted[j] = sorted[j - 1];
            sorted[j - 1] = t;
        }
    if (P->top_k > 0 && P->top_k < SS_V) thr = fmax(thr, sorted[P->top_k - 1]);
    if (P->top_p < 1.0f) {
        double total = 0, cum = 0;
        for (int i = 0; i < SS_V; i++)
            if (sorted[i] >= thr) total += exp(sorted[i] - zmax);
        for (int i = 0; i < SS_V && sorted[i] >= thr; i++)
            if ((cum += exp(sorted[i] - zmax)) >= P->top_p * total) {
                thr = sorted[i];
                break;
            }
    }
    double total = 0;
    for (int v = 0; v < SS_V; v++) total += p[v] = z[v] >= thr ? exp(z[v] - zmax) : 0.0;
    for (int v = 0; v < SS_V; v++) p[v] /= total;
}

/* Fixed random logits (scale ~2.5: a few likely ids, a long tail), drafts, distributions. */
static void ss_case_make(ss_case *c) {
    test_rng rng = {0x5eed5a3b1e};
    for (int g = 0; g < SS_G; g++)
        for (int j = 0; j < SS_ROWS; j++) {
            for (int v = 0; v < SS_V; v++) {
                const float u = test_rng_uniform(&rng);
                c->logits[g][j][v] = 2.5f * u * fabsf(u) * 2.0f;
            }
            ss_expected(c->logits[g][j], &ss_params[g], c->p[g][j]);
        }
    for (int g = 0; g < SS_G; g++) {
        /* row 0: the likeliest id after the top one (accepted sometimes, rejected sometimes);
         * row 1: the least likely id (a draft the target nearly never takes) */
        const double *p0 = c->p[g][0], *p1 = c->p[g][1];
        int top = 0, second = -1, worst = 0;
        for (int v = 1; v < SS_V; v++)
            if (p0[v] > p0[top]) top = v;
        for (int v = 0; v < SS_V; v++)
            if (v != top && (second < 0 || p0[v] > p0[second])) second = v;
        for (int v = 1; v < SS_V; v++)
            if (p1[v] < p1[worst]) worst = v;
        c->draft[g][0] = ss_params[g].temperature > 0 ? second : top;
        c->draft[g][1] = worst;
    }
}

/* One call: SS_S sequences with seeds seed0 + s; ids [SS_T] out (row t = s·SS_ROWS + j). */
static void ss_call(ds_backend *be, const ss_case *c, uint64_t seed0, int32_t *ids) {
    const ds_backend_ops *op = be->ops;
    static int32_t tokens[SS_T], src[SS_T], pos[SS_T], start[SS_S + 1], slot[SS_S], past[SS_S],
        bt[SS_S], drafts[SS_S * (SS_ROWS - 1)];
    static ds_spec_sampling P[SS_S];
    static float logits[SS_T][SS_V];
    int n_dr = 0;
    for (int s = 0; s < SS_S; s++) {
        const int g = s % SS_G;
        start[s] = s * SS_ROWS;
        slot[s] = 0;
        bt[s] = 0;
        past[s] = 100 + s;
        P[s] = ss_params[g];
        P[s].seed = seed0 + (uint64_t)s;
        for (int j = 0; j < SS_ROWS; j++) {
            const int t = s * SS_ROWS + j;
            memcpy(logits[t], c->logits[g][j], sizeof logits[t]);
            pos[t] = past[s] + j;
            src[t] = -1;
            tokens[t] = j == 0 ? 1 : c->draft[g][j - 1];
            if (j > 0 && (s & 1)) { /* from the token buffer; tokens holds a decoy */
                drafts[n_dr] = c->draft[g][j - 1];
                src[t] = SS_DRAFT_AT + n_dr++;
                tokens[t] = (c->draft[g][j - 1] + 1) % SS_V;
            }
        }
    }
    start[SS_S] = SS_T;
    /* the token-buffer drafts through argmax_logits over one-hot rows and an identity head */
    float *eye = calloc((size_t)SS_V * SS_V, sizeof(float));
    float *hot = calloc((size_t)n_dr * SS_V, sizeof(float));
    for (int i = 0; i < SS_V; i++) eye[(size_t)i * SS_V + i] = 1.0f;
    for (int i = 0; i < n_dr; i++) hot[(size_t)i * SS_V + drafts[i]] = 1.0f;
    void *d_eye = test_backend_from_host(be, eye, (size_t)SS_V * SS_V);
    void *d_hot = test_backend_from_host(be, hot, (size_t)n_dr * SS_V);
    ds_linear head = {.n_parts = 1, .n_out = SS_V, .n_in = SS_V};
    head.parts[0] = (ds_tensor){.data = d_eye, .dtype = op->act_dtype, .ndim = 2,
                                .ne = {SS_V, SS_V}};
    ds_tensor x = {.data = d_hot, .dtype = op->act_dtype, .ndim = 2, .ne = {n_dr, SS_V}};
    op->argmax_logits(be, &x, &head, NULL, SS_DRAFT_AT);

    void *d_lg = op->alloc(be, sizeof logits);
    op->upload(be, d_lg, logits, sizeof logits);
    ds_batch b = {.n_tokens = SS_T, .n_seqs = SS_S, .tokens = tokens, .positions = pos,
                  .seq_start = start, .seq_slot = slot, .seq_n_past = past, .block_table = bt,
                  .max_blocks = 1, .token_src = src};
    op->set_batch(be, &b);
    op->set_spec_sampling(be, P, SS_S);
    ds_tensor lg = {.data = d_lg, .dtype = DS_DTYPE_F32, .ndim = 2, .ne = {SS_T, SS_V}};
    op->spec_sample(be, &lg, SS_IDS_AT);
    op->copy_tokens(be, SS_IDS_AT, SS_T, ids);
    ds_error err = {0};
    if (op->synchronize(be, &err) != DS_OK) fprintf(stderr, "spec_sample: %s\n", err.msg);
    op->free(be, d_lg);
    op->free(be, d_eye);
    op->free(be, d_hot);
    free(eye);
    free(hot);
}

typedef struct ss_stats {
    double z[SS_G][SS_ROWS];  /* chi-square z of each sampled group's rows (greedy: 0) */
    int greedy_wrong;         /* greedy rows that are not the argmax */
    double accept0[SS_G];     /* how often row 0 took its draft */
    int draws;                /* per group */
    int counts[SS_G][SS_ROWS][SS_V];
} ss_stats;

/* Runs n_calls calls (seeds seed0 + SS_S·i + s) and tests each row's ids against p. */
static void ss_stats_run(ds_backend *be, const ss_case *c, int n_calls, uint64_t seed0,
                         ss_stats *st) {
    int32_t *ids = malloc(sizeof(int32_t) * SS_T);
    memset(st, 0, sizeof *st);
    int(*counts)[SS_ROWS][SS_V] = st->counts;
    int acc[SS_G] = {0};
    for (int i = 0; i < n_calls; i++) {
        ss_call(be, c, seed0 + (uint64_t)i * SS_S, ids);
        for (int s = 0; s < SS_S; s++)
            for (int j = 0; j < SS_ROWS; j++) {
                const int g = s % SS_G, id = ids[s * SS_ROWS + j];
                if (id < 0 || id >= SS_V) {
                    st->greedy_wrong++; /* out of range: counted as a failure */
                    continue;
                }
                counts[g][j][id]++;
                if (j == 0 && id == c->draft[g][0]) acc[g]++;
                if (ss_params[g].temperature <= 0.0f) st->greedy_wrong += c->p[g][j][id] != 1.0;
            }
    }
    st->draws = n_calls * SS_S / SS_G;
    for (int g = 0; g < SS_G; g++) {
        st->accept0[g] = (double)acc[g] / st->draws;
        for (int j = 0; j < SS_ROWS && ss_params[g].temperature > 0.0f; j++)
            st->z[g][j] = test_chi2_z(counts[g][j], c->p[g][j], SS_V, st->draws, NULL);
    }
    free(ids);
}

#endif
