#include "core/threadpool.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>
#include <unistd.h>

#include "core/status.h"

struct ds_threadpool {
    int n_threads;      /* total, including the caller */
    pthread_t *workers; /* [n_threads - 1] */
    int n_started;      /* workers actually running (for a clean shutdown on partial start) */

    pthread_mutex_t mu;
    pthread_cond_t cv_start; /* workers wait here for a new generation */
    pthread_cond_t cv_done;  /* the caller waits here for n_busy == 0 */
    uint64_t generation;     /* bumped once per job */
    int n_busy;              /* workers that have not finished the current job */
    bool stop;

    /* The current job (written under mu before the generation bump). */
    ds_parallel_fn fn;
    void *ctx;
    int64_t n, chunk;
    atomic_int_fast64_t next; /* next unclaimed item */
};

typedef struct worker_arg {
    ds_threadpool *pool;
    int tid;
} worker_arg;

/* Set while the current thread runs tasks of some pool: nested parallel-fors run inline. */
static _Thread_local int tl_in_task;
static _Thread_local int tl_tid;

static void run_chunks(ds_threadpool *p, int tid) {
    for (;;) {
        int64_t b = atomic_fetch_add_explicit(&p->next, p->chunk, memory_order_relaxed);
        if (b >= p->n) break;
        int64_t e = b + p->chunk < p->n ? b + p->chunk : p->n;
        p->fn(p->ctx, b, e, tid);
    }
}

static void *worker_main(void *argp) {
    worker_arg a = *(worker_arg *)argp;
    free(argp);
    ds_threadpool *p = a.pool;
    tl_in_task = 1;
    tl_tid = a.tid;
    uint64_t seen = 0;
    pthread_mutex_lock(&p->mu);
    for (;;) {
        while (p->generation == seen && !p->stop) pthread_cond_wait(&p->cv_start, &p->mu);
        if (p->stop) break;
        seen = p->generation;
        pthread_mutex_unlock(&p->mu);
        run_chunks(p, a.tid);
        pthread_mutex_lock(&p->mu);
        if (--p->n_busy == 0) pthread_cond_signal(&p->cv_done);
    }
    pthread_mutex_unlock(&p->mu);
    return NULL;
}

ds_threadpool *ds_threadpool_create(int n_threads) {
    if (n_threads <= 0) {
        long n = sysconf(_SC_NPROCESSORS_ONLN);
        n_threads = n > 0 ? (int)n : 1;
    }
    ds_threadpool *p = calloc(1, sizeof *p);
    if (!p) return NULL;
    p->n_threads = n_threads;
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->cv_start, NULL);
    pthread_cond_init(&p->cv_done, NULL);
    atomic_init(&p->next, 0);
    if (n_threads > 1) {
        p->workers = calloc((size_t)(n_threads - 1), sizeof *p->workers);
        if (!p->workers) {
            ds_threadpool_destroy(p);
            return NULL;
        }
        for (int i = 0; i < n_threads - 1; i++) {
            worker_arg *a = malloc(sizeof *a);
            if (!a) break;
            a->pool = p;
            a->tid = i + 1;
            if (pthread_create(&p->workers[i], NULL, worker_main, a) != 0) {
                free(a);
                break;
            }
            p->n_started++;
        }
        if (p->n_started != n_threads - 1) {
            ds_threadpool_destroy(p);
            return NULL;
        }
    }
    return p;
}

void ds_threadpool_destroy(ds_threadpool *p) {
    if (!p) return;
    pthread_mutex_lock(&p->mu);
    p->stop = true;
    pthread_cond_broadcast(&p->cv_start);
    pthread_mutex_unlock(&p->mu);
    for (int i = 0; i < p->n_started; i++) pthread_join(p->workers[i], NULL);
    free(p->workers);
    pthread_cond_destroy(&p->cv_done);
    pthread_cond_destroy(&p->cv_start);
    pthread_mutex_destroy(&p->mu);
    free(p);
}

int ds_threadpool_size(const ds_threadpool *p) { return p->n_threads; }

int64_t ds_threadpool_chunk(const ds_threadpool *p, int64_t n, int64_t min_chunk) {
    int64_t c = n / ((int64_t)p->n_threads * 4);
    if (min_chunk < 1) min_chunk = 1;
    return c < min_chunk ? min_chunk : c;
}

void ds_threadpool_for(ds_threadpool *p, int64_t n, int64_t chunk, ds_parallel_fn fn, void *ctx) {
    if (n <= 0) return;
    if (chunk < 1) chunk = 1;
    if (p->n_threads == 1 || n <= chunk || tl_in_task) {
        fn(ctx, 0, n, tl_in_task ? tl_tid : 0);
        return;
    }
    pthread_mutex_lock(&p->mu);
    p->fn = fn;
    p->ctx = ctx;
    p->n = n;
    p->chunk = chunk;
    atomic_store_explicit(&p->next, 0, memory_order_relaxed);
    p->n_busy = p->n_threads - 1;
    p->generation++;
    pthread_cond_broadcast(&p->cv_start);
    pthread_mutex_unlock(&p->mu);

    tl_in_task = 1;
    tl_tid = 0;
    run_chunks(p, 0);
    tl_in_task = 0;

    pthread_mutex_lock(&p->mu);
    while (p->n_busy > 0) pthread_cond_wait(&p->cv_done, &p->mu);
    pthread_mutex_unlock(&p->mu);
}
