/* request.c — a request's life outside the engine loop: creation, the output channel, cancel and
 * release (see request.h for the threading rules). */
#include "runtime/request.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define CHANNEL_MIN_CAP 16

ds_request *ds_request_create(ds_engine *eng, const int32_t *prompt, int n_prompt,
                              ds_sampler *sampler) {
    DS_ASSERT(n_prompt > 0 && sampler->params.max_tokens > 0);
    ds_request *r = calloc(1, sizeof *r);
    if (!r) return NULL;
    int max_new = sampler->params.max_tokens;
    /* Prompt + every token it may generate: the recompute source after a preemption. */
    r->tokens = malloc(((size_t)n_prompt + (size_t)max_new) * sizeof(int32_t));
    if (!r->tokens) {
        free(r);
        return NULL;
    }
    memcpy(r->tokens, prompt, (size_t)n_prompt * sizeof(int32_t));
    r->eng = eng;
    r->refs = 2;
    atomic_init(&r->cancel, false);
    r->stop_token = -1;
    r->end_stop_token = -1;
    r->n_prompt = n_prompt;
    r->max_new = max_new;
    r->sampler = *sampler; /* moved: the caller no longer frees it */
    ds_sched_seq_init(&r->seq, r->tokens, n_prompt, max_new, r);

    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&r->cv, &ca);
    pthread_condattr_destroy(&ca);
    pthread_mutex_init(&r->mu, NULL);
    return r;
}

static void request_destroy(ds_request *r) {
    ds_sampler_free(&r->sampler);
    free(r->tokens);
    free(r->q_tokens);
    free(r->q_samples);
    pthread_mutex_destroy(&r->mu);
    pthread_cond_destroy(&r->cv);
    free(r);
}

void ds_request_unref(ds_request *r) {
    pthread_mutex_lock(&r->mu);
    DS_ASSERT(r->refs > 0);
    bool last = --r->refs == 0;
    pthread_mutex_unlock(&r->mu);
    if (last) request_destroy(r);
}

/* Room for one more token at q_write: slide the unread part to the front, else grow. */
static bool channel_reserve(ds_request *r) {
    if (r->q_write < r->q_cap) return true;
    if (r->q_read > 0) {
        int n = r->q_write - r->q_read;
        memmove(r->q_tokens, r->q_tokens + r->q_read, (size_t)n * sizeof *r->q_tokens);
        memmove(r->q_samples, r->q_samples + r->q_read, (size_t)n * sizeof *r->q_samples);
        r->q_read = 0;
        r->q_write = n;
        if (n < r->q_cap) return true;
    }
    int cap = r->q_cap ? 2 * r->q_cap : CHANNEL_MIN_CAP;
    int32_t *t = realloc(r->q_tokens, (size_t)cap * sizeof *t);
    if (!t) return false;
    r->q_tokens = t;
    ds_sample_result *s = realloc(r->q_samples, (size_t)cap * sizeof *s);
    if (!s) return false;
    r->q_samples = s;
    r->q_cap = cap;
    return true;
}

bool ds_request_push_token(ds_request *r, const ds_sample_result *res) {
    pthread_mutex_lock(&r->mu);
    DS_ASSERT(!r->finished);
    bool ok = channel_reserve(r);
    if (ok) {
        r->q_tokens[r->q_write] = res->token;
        r->q_samples[r->q_write] = *res;
        r->q_write++;
        r->n_pushed++;
        r->n_cached = r->seq.n_reused;
        pthread_cond_broadcast(&r->cv);
    }
    pthread_mutex_unlock(&r->mu);
    return ok;
}

void ds_request_finish(ds_request *r, ds_finish_reason reason, int stop_token) {
    pthread_mutex_lock(&r->mu);
    DS_ASSERT(!r->finished);
    r->finished = true;
    r->reason = reason;
    r->stop_token = reason == DS_FINISH_STOP ? stop_token : -1;
    pthread_cond_broadcast(&r->cv);
    pthread_mutex_unlock(&r->mu);
    ds_request_unref(r); /* the engine's reference */
}

/* ---- the submitter's side (engine.h) -------------------------------------------------------- */

static void deadline_after(struct timespec *ts, int ms) {
    clock_gettime(CLOCK_MONOTONIC, ts);
    ts->tv_sec += ms / 1000;
    ts->tv_nsec += (long)(ms % 1000) * 1000000L;
    if (ts->tv_nsec >= 1000000000L) {
        ts->tv_sec++;
        ts->tv_nsec -= 1000000000L;
    }
}

bool ds_request_next(ds_request *r, ds_request_event *ev, int timeout_ms) {
    struct timespec deadline;
    if (timeout_ms > 0) deadline_after(&deadline, timeout_ms);
    pthread_mutex_lock(&r->mu);
    while (r->q_read == r->q_write && !r->finished) {
        if (timeout_ms == 0) break;
        if (timeout_ms < 0) {
            pthread_cond_wait(&r->cv, &r->mu);
        } else if (pthread_cond_timedwait(&r->cv, &r->mu, &deadline) == ETIMEDOUT) {
            break;
        }
    }
    bool have = r->q_read < r->q_write || (r->finished && !r->final_consumed);
    if (!have) {
        pthread_mutex_unlock(&r->mu);
        return false;
    }
    int avail = r->q_write - r->q_read;
    int n = avail < 16 ? avail : 16;
    memset(ev, 0, sizeof *ev);
    if (n > 0) {
        memcpy(ev->tokens, r->q_tokens + r->q_read, (size_t)n * sizeof ev->tokens[0]);
        memcpy(ev->samples, r->q_samples + r->q_read, (size_t)n * sizeof ev->samples[0]);
    }
    r->q_read += n;
    ev->n_tokens = n;
    ev->n_prompt_tokens = r->n_prompt;
    ev->n_cached_tokens = r->n_cached;
    ev->n_generated = r->n_pushed - (r->q_write - r->q_read);
    ev->stop_token = -1;
    if (r->finished && r->q_read == r->q_write) {
        ev->finished = true;
        ev->reason = r->reason;
        ev->stop_token = r->stop_token;
        r->final_consumed = true;
    }
    if (r->q_read == r->q_write) r->q_read = r->q_write = 0;
    pthread_mutex_unlock(&r->mu);
    return true;
}

void ds_request_cancel(ds_request *r) {
    if (!r) return;
    pthread_mutex_lock(&r->mu);
    /* Holding r->mu keeps the engine alive: it cannot finish (and so cannot be destroyed past)
     * this request until we let go. */
    if (!r->finished && !atomic_load(&r->cancel)) {
        atomic_store(&r->cancel, true);
        ds_engine_poke_cancel(r->eng);
    }
    pthread_mutex_unlock(&r->mu);
}

void ds_request_release(ds_request *r) {
    if (!r) return;
    ds_request_cancel(r);
    ds_request_unref(r);
}
