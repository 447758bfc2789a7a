/* tp_model.c — N tensor-parallel ranks on the CPU: rank r is a ds_model with its own CPU
 * backend (threads_per_rank threads), sharded weights (tp_shard.c), per-rank config, cache and
 * session. A step runs ds_session_feed on every rank at once — rank 0 on the caller's thread,
 * ranks 1..N-1 on persistent worker threads — and the ranks meet in the all-reduce hook
 * (model.h) after every row-parallel block. Since every rank sees the same batch and the same
 * all-reduced sums, they take the same decisions (MoE routing, chunking, errors) in lock step.
 * Afterwards the caller gathers the vocab shards of the logits and/or merges per-rank argmaxes. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backend/backend.h"
#include "model/model.h"
#include "parallel/tp.h"
#include "runtime/session.h"

typedef struct tp_rank {
    struct ds_tp_model *tp;
    int r;
    ds_tp_shard shard;
    ds_backend *be;
    ds_model model;
    bool model_ready;
    ds_session sess;
    bool sess_ready;
    float *logits; /* [rows, V_r] host logits of the current call (NULL when not asked) */
    ds_status st;
    ds_error err;
} tp_rank;

struct ds_tp_model {
    int n;
    ds_config cfg; /* full model */
    ds_tp_comm *comm;
    tp_rank *ranks; /* [n] */
    /* the current call (read by the workers after the start signal) */
    int slot, n_tok;
    const int32_t *tokens;
    bool all_logits;
    /* worker threads for ranks 1..n-1 */
    pthread_t *threads;
    int n_started;
    pthread_mutex_t mu;
    pthread_cond_t cv_start, cv_done;
    uint64_t gen;
    int n_done;
    bool quit;
};

static void rank_allreduce(void *ctx, ds_tensor *x) {
    tp_rank *rk = ctx;
    DS_ASSERT(x->dtype == DS_DTYPE_F32);
    ds_tp_allreduce_sum(rk->tp->comm, rk->r, x->data, ds_tensor_numel(x));
}

static void rank_run(tp_rank *rk) {
    ds_tp_model *tp = rk->tp;
    rk->err = (ds_error){0};
    rk->st = ds_session_feed(&rk->sess, tp->slot, tp->tokens, tp->n_tok, tp->all_logits,
                             rk->logits, &rk->err);
}

static void *worker_main(void *arg) {
    tp_rank *rk = arg;
    ds_tp_model *tp = rk->tp;
    uint64_t seen = 0;
    for (;;) {
        pthread_mutex_lock(&tp->mu);
        while (!tp->quit && tp->gen == seen) pthread_cond_wait(&tp->cv_start, &tp->mu);
        if (tp->quit) {
            pthread_mutex_unlock(&tp->mu);
            return NULL;
        }
        seen = tp->gen;
        pthread_mutex_unlock(&tp->mu);
        rank_run(rk);
        pthread_mutex_lock(&tp->mu);
        tp->n_done++;
        pthread_cond_signal(&tp->cv_done);
        pthread_mutex_unlock(&tp->mu);
    }
}

int ds_tp_model_ranks(const ds_tp_model *tp) { return tp->n; }

void ds_tp_model_free(ds_tp_model *tp) {
    if (!tp) return;
    if (tp->threads) {
        pthread_mutex_lock(&tp->mu);
        tp->quit = true;
        pthread_cond_broadcast(&tp->cv_start);
        pthread_mutex_unlock(&tp->mu);
        for (int i = 0; i < tp->n_started; i++) pthread_join(tp->threads[i], NULL);
        free(tp->threads);
    }
    pthread_mutex_destroy(&tp->mu);
    pthread_cond_destroy(&tp->cv_start);
    pthread_cond_destroy(&tp->cv_done);
    for (int r = 0; tp->ranks && r < tp->n; r++) {
        tp_rank *rk = &tp->ranks[r];
        if (rk->sess_ready) ds_session_free(&rk->sess);
        if (rk->model_ready) ds_model_free(&rk->model);
        if (rk->be) rk->be->ops->destroy(rk->be);
        ds_tp_shard_free(&rk->shard);
    }
    free(tp->ranks);
    ds_tp_comm_destroy(tp->comm);
    free(tp);
}

static ds_status rank_init(ds_tp_model *tp, tp_rank *rk, const ds_model_weights *host,
                           const ds_tp_opts *o, int threads, ds_error *err) {
    ds_status st;
    if ((st = ds_tp_shard_init(&rk->shard, &tp->cfg, host, rk->r, tp->n, err))) return st;
    if ((st = ds_backend_cpu_create(threads, &rk->be, err))) return st;
    if ((st = ds_model_init(&rk->model, rk->be, &rk->shard.cfg, &rk->shard.w, o->max_tokens,
                            o->max_out, err)))
        return st;
    rk->model_ready = true;
    if (tp->n > 1) {
        rk->model.allreduce = rank_allreduce;
        rk->model.allreduce_ctx = rk;
    }
    if ((st = ds_session_init(&rk->sess, &rk->model, o->n_slots, o->max_len, err))) return st;
    rk->sess_ready = true;
    return DS_OK;
}

ds_status ds_tp_model_create(const ds_config *cfg, const ds_model_weights *host,
                             const ds_tp_opts *o, ds_tp_model **out, ds_error *err) {
    *out = NULL;
    if (o->n_ranks < 1 || o->n_ranks > DS_TP_MAX_RANKS)
        return ds_error_set(err, DS_ERR_INVALID_ARG,
                            "--tensor-parallel-size %d is out of range (1..%d)", o->n_ranks,
                            DS_TP_MAX_RANKS);
    if (o->max_tokens <= 0 || o->max_out <= 0 || o->max_out > o->max_tokens)
        return ds_error_set(err, DS_ERR_INVALID_ARG, "tensor parallel: bad step sizes %d / %d",
                            o->max_tokens, o->max_out);
    /* refuse an indivisible size before allocating anything */
    ds_config probe;
    int64_t off;
    ds_status st = ds_tp_config_shard(cfg, 0, o->n_ranks, &probe, &off, err);
    if (st != DS_OK) return st;

    ds_tp_model *tp = calloc(1, sizeof *tp);
    if (!tp) return ds_error_set(err, DS_ERR_NOMEM, "tensor parallel: out of memory");
    tp->n = o->n_ranks;
    tp->cfg = *cfg;
    pthread_mutex_init(&tp->mu, NULL);
    pthread_cond_init(&tp->cv_start, NULL);
    pthread_cond_init(&tp->cv_done, NULL);
    tp->ranks = calloc((size_t)tp->n, sizeof *tp->ranks);
    if (!tp->ranks) {
        ds_tp_model_free(tp);
        return ds_error_set(err, DS_ERR_NOMEM, "tensor parallel: out of memory");
    }
    int threads = o->threads_per_rank;
    if (threads <= 0) {
        long cpus = sysconf(_SC_NPROCESSORS_ONLN);
        threads = cpus > tp->n ? (int)(cpus / tp->n) : 1;
    }
    if ((st = ds_tp_comm_create(tp->n, (int64_t)o->max_tokens * cfg->hidden, &tp->comm, err))) {
        ds_tp_model_free(tp);
        return st;
    }
    for (int r = 0; r < tp->n; r++) {
        tp->ranks[r].tp = tp;
        tp->ranks[r].r = r;
        if ((st = rank_init(tp, &tp->ranks[r], host, o, threads, err))) {
            ds_tp_model_free(tp);
            return st;
        }
    }
    if (tp->n > 1) {
        tp->threads = calloc((size_t)tp->n - 1, sizeof *tp->threads);
        if (!tp->threads) {
            ds_tp_model_free(tp);
            return ds_error_set(err, DS_ERR_NOMEM, "tensor parallel: out of memory");
        }
        for (int r = 1; r < tp->n; r++) {
            if (pthread_create(&tp->threads[r - 1], NULL, worker_main, &tp->ranks[r]) != 0) {
                ds_tp_model_free(tp);
                return ds_error_set(err, DS_ERR_INTERNAL,
                                    "tensor parallel: cannot start the thread of rank %d", r);
            }
            tp->n_started++;
        }
    }
    *out = tp;
    return DS_OK;
}

void ds_tp_reset(ds_tp_model *tp, int slot) {
    for (int r = 0; r < tp->n; r++) ds_session_reset(&tp->ranks[r].sess, slot);
}

ds_status ds_tp_feed(ds_tp_model *tp, int slot, const int32_t *tokens, int n, bool all_logits,
                     float *logits, int32_t *ids, ds_error *err) {
    if (n <= 0) return ds_error_set(err, DS_ERR_INVALID_ARG, "nothing to feed");
    const int rows = all_logits ? n : 1;
    const bool want = logits || ids;
    ds_status st = DS_OK;
    for (int r = 0; r < tp->n && want; r++) {
        tp_rank *rk = &tp->ranks[r];
        rk->logits = malloc((size_t)rows * (size_t)rk->shard.cfg.vocab * sizeof(float));
        if (!rk->logits) st = ds_error_set(err, DS_ERR_NOMEM, "tensor parallel: out of memory");
    }
    if (st == DS_OK) {
        tp->slot = slot;
        tp->tokens = tokens;
        tp->n_tok = n;
        tp->all_logits = all_logits;
        pthread_mutex_lock(&tp->mu);
        tp->gen++;
        tp->n_done = 0;
        pthread_cond_broadcast(&tp->cv_start);
        pthread_mutex_unlock(&tp->mu);
        rank_run(&tp->ranks[0]);
        pthread_mutex_lock(&tp->mu);
        while (tp->n_done < tp->n - 1) pthread_cond_wait(&tp->cv_done, &tp->mu);
        pthread_mutex_unlock(&tp->mu);
        for (int r = 0; r < tp->n && st == DS_OK; r++)
            if (tp->ranks[r].st != DS_OK) {
                st = tp->ranks[r].st;
                ds_error_set(err, st, "%s", tp->ranks[r].err.msg);
            }
    }
    if (st == DS_OK && want) {
        const int64_t V = tp->cfg.vocab;
        ds_tp_argmax_part parts[DS_TP_MAX_RANKS];
        for (int row = 0; row < rows; row++) {
            for (int r = 0; r < tp->n; r++) {
                const tp_rank *rk = &tp->ranks[r];
                const int64_t Vr = rk->shard.cfg.vocab, off = rk->shard.vocab_off;
                const float *src = rk->logits + (size_t)row * (size_t)Vr;
                if (logits)
                    memcpy(logits + (size_t)row * (size_t)V + (size_t)off, src,
                           (size_t)Vr * sizeof(float));
                parts[r] = ds_tp_argmax_local(src, Vr, off, V);
            }
            if (ids) ids[row] = (int32_t)ds_tp_argmax_merge(parts, tp->n);
        }
    }
    for (int r = 0; r < tp->n; r++) {
        free(tp->ranks[r].logits);
        tp->ranks[r].logits = NULL;
    }
    return st;
}
