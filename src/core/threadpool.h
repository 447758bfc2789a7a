/* threadpool.h — a small persistent pthread pool with one primitive: a parallel-for over [0, n).
 *
 * The calling thread takes part in the work (as thread 0), so a pool of n_threads starts
 * n_threads - 1 workers. Work is handed out in chunks from an atomic counter, so uneven items
 * (attention rows of growing length, experts with different token counts) balance themselves.
 *
 * One caller at a time: a pool is driven by the thread that owns it (the engine thread).
 * A parallel-for issued from inside a running task runs inline on the current thread (no
 * deadlock, same tid), so kernels may call each other freely. */
#ifndef DS_THREADPOOL_H
#define DS_THREADPOOL_H

#include <stdint.h>

typedef struct ds_threadpool ds_threadpool;

/* Runs items [begin, end) on thread `tid` (0 .. n_threads-1; stable for the call, use it to
 * index per-thread scratch). */
typedef void (*ds_parallel_fn)(void *ctx, int64_t begin, int64_t end, int tid);

/* n_threads: total threads including the caller; 0 = number of online CPUs. Returns NULL when
 * threads cannot be started. */
ds_threadpool *ds_threadpool_create(int n_threads);
void ds_threadpool_destroy(ds_threadpool *pool);
int ds_threadpool_size(const ds_threadpool *pool);

/* Calls fn over [0, n) in chunks of `chunk` items (>= 1) and returns when all are done.
 * Runs inline when n <= chunk, the pool has one thread, or the caller is already inside a task. */
void ds_threadpool_for(ds_threadpool *pool, int64_t n, int64_t chunk, ds_parallel_fn fn, void *ctx);

/* A chunk size that gives every thread several chunks (for balance) but never fewer than
 * min_chunk items (for overhead). */
int64_t ds_threadpool_chunk(const ds_threadpool *pool, int64_t n, int64_t min_chunk);

#endif
