/* tp_allreduce.c — all-reduce (sum) among rank threads through shared memory.
 *
 * Every rank publishes its buffer; after a barrier, rank r sums its 1/N slice of the elements
 * over all ranks in rank order into a shared result; after a second barrier every rank copies
 * the whole result into its own buffer. Each element is summed once, by one thread, in a fixed
 * order, so all ranks receive the same bits (what keeps the replicated residual streams of the
 * ranks identical step after step). The next call's first barrier guarantees every rank has
 * finished copying before the result is overwritten. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "parallel/tp.h"

struct ds_tp_comm {
    int n;
    int64_t max_elems;
    pthread_barrier_t bar;
    float **bufs;   /* [n] each rank's buffer of the current call */
    int64_t *lens;  /* [n] element count each rank passed (checked equal) */
    float *result;  /* [max_elems] the sum */
};

ds_status ds_tp_comm_create(int n_ranks, int64_t max_elems, ds_tp_comm **out, ds_error *err) {
    *out = NULL;
    if (n_ranks < 1 || n_ranks > DS_TP_MAX_RANKS || max_elems < 0)
        return ds_error_set(err, DS_ERR_INVALID_ARG,
                            "tensor parallel: %d ranks (1..%d) / %lld elements", n_ranks,
                            DS_TP_MAX_RANKS, (long long)max_elems);
    ds_tp_comm *c = calloc(1, sizeof *c);
    if (!c) return ds_error_set(err, DS_ERR_NOMEM, "tensor parallel: out of memory");
    c->n = n_ranks;
    c->max_elems = max_elems;
    c->bufs = calloc((size_t)n_ranks, sizeof *c->bufs);
    c->lens = calloc((size_t)n_ranks, sizeof *c->lens);
    c->result = malloc((size_t)(max_elems > 0 ? max_elems : 1) * sizeof(float));
    if (!c->bufs || !c->lens || !c->result) {
        free(c->bufs);
        free(c->lens);
        free(c->result);
        free(c);
        return ds_error_set(err, DS_ERR_NOMEM, "tensor parallel: out of memory");
    }
    if (pthread_barrier_init(&c->bar, NULL, (unsigned)n_ranks) != 0) {
        free(c->bufs);
        free(c->lens);
        free(c->result);
        free(c);
        return ds_error_set(err, DS_ERR_INTERNAL, "tensor parallel: cannot create a barrier");
    }
    *out = c;
    return DS_OK;
}

void ds_tp_comm_destroy(ds_tp_comm *c) {
    if (!c) return;
    pthread_barrier_destroy(&c->bar);
    free(c->bufs);
    free(c->lens);
    free(c->result);
    free(c);
}

void ds_tp_barrier(ds_tp_comm *c) {
    if (c->n > 1) pthread_barrier_wait(&c->bar);
}

void ds_tp_allreduce_sum(ds_tp_comm *c, int rank, float *buf, int64_t n) {
    DS_ASSERT(rank >= 0 && rank < c->n && n >= 0 && n <= c->max_elems);
    if (c->n == 1) return;
    c->bufs[rank] = buf;
    c->lens[rank] = n;
    pthread_barrier_wait(&c->bar); /* every buffer published and final */
    for (int q = 0; q < c->n; q++) DS_ASSERT(c->lens[q] == n);
    const int64_t i0 = n * rank / c->n, i1 = n * (rank + 1) / c->n;
    for (int64_t i = i0; i < i1; i++) {
        float s = c->bufs[0][i];
        for (int q = 1; q < c->n; q++) s += c->bufs[q][i];
        c->result[i] = s;
    }
    pthread_barrier_wait(&c->bar); /* the whole sum is in result; nobody reads bufs any more */
    memcpy(buf, c->result, (size_t)n * sizeof(float));
}
