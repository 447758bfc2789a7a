/* engine_harness.h — what the engine tests (test_engine.c, test_spec_engine.c) share: a
 * request's output as the engine streamed it, the reference run of one request alone through
 * ds_session, and the draining of an engine request that checks the event channel's contract.
 * Include after testlib.h with MAX_OUT (the most tokens a result holds) defined. */
#ifndef DS_TEST_ENGINE_HARNESS_H
#define DS_TEST_ENGINE_HARNESS_H

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/engine.h"
#include "runtime/session.h"
#include "sampling/sampler.h"

typedef struct result {
    int32_t toks[MAX_OUT];
    float logprob[MAX_OUT];
    int n;
    ds_finish_reason reason;
    int stop_token;
    bool finished;
    int n_cached; /* prompt tokens the engine took over from its prefix cache */
    char err[DS_ERROR_MSG_MAX + 64]; /* contract violation seen by a worker thread */
} result;

/* The reference: the request alone through ds_session (slot 0 reset first), sampled with its
 * own sampler until it finishes. */
static void solo_run(test_model *f, ds_session *ss, const int32_t *prompt, int n_prompt,
                     const ds_sampling_params *params, result *out) {
    const int V = f->cfg.vocab;
    ds_error err = {0};
    ds_sampler smp;
    if (ds_sampler_init(&smp, params, V, f->cfg.eos_ids, f->cfg.n_eos, &err) != DS_OK ||
        ds_sampler_add_prompt(&smp, prompt, n_prompt, &err) != DS_OK)
        fail_msg("sampler: %s", err.msg);
    float *logits = malloc((size_t)V * sizeof(float));
    ds_session_reset(ss, 0);
    if (ds_session_feed(ss, 0, prompt, n_prompt, false, logits, &err) != DS_OK)
        fail_msg("feed: %s", err.msg);
    memset(out, 0, sizeof *out);
    out->stop_token = -1;
    for (;;) {
        ds_sample_result res;
        if (ds_sampler_sample(&smp, logits, out->n, &res, &err) != DS_OK ||
            ds_sampler_accept(&smp, res.token, &err) != DS_OK)
            fail_msg("sample: %s", err.msg);
        assert_true(out->n < MAX_OUT);
        out->logprob[out->n] = res.logprob;
        out->toks[out->n++] = res.token;
        int stop = -1;
        ds_finish_reason reason = ds_sampler_finish_reason(&smp, res.token, out->n, &stop);
        if (reason != DS_FINISH_NONE) {
            out->reason = reason;
            out->stop_token = reason == DS_FINISH_STOP ? stop : -1;
            break;
        }
        int32_t t = res.token;
        if (ds_session_feed(ss, 0, &t, 1, false, logits, &err) != DS_OK)
            fail_msg("feed: %s", err.msg);
    }
    out->finished = true;
    free(logits);
    ds_sampler_free(&smp);
}

/* Reads every event of r into out, checking the channel's contract as it goes. Runs on worker
 * threads, where cmocka's assertions must not be used: violations go to out->err. */
static void drain_soft(ds_request *r, int n_prompt, result *out) {
    memset(out, 0, sizeof *out);
    out->stop_token = -1;
    ds_request_event ev;
#define SOFT_CHECK(cond)                                                                        \
    if (!(cond)) {                                                                              \
        if (!out->err[0]) snprintf(out->err, sizeof out->err, "line %d: %s", __LINE__, #cond); \
        continue;                                                                               \
    }
    while (ds_request_next(r, &ev, -1)) {
        SOFT_CHECK(!out->finished); /* nothing after the finished event */
        SOFT_CHECK(ev.n_tokens >= 0 && ev.n_tokens <= 16);
        SOFT_CHECK(ev.n_tokens >= 1 || ev.finished);
        SOFT_CHECK(ev.n_prompt_tokens == n_prompt);
        SOFT_CHECK(ev.n_cached_tokens >= 0 && ev.n_cached_tokens < n_prompt);
        out->n_cached = ev.n_cached_tokens;
        SOFT_CHECK(out->n + ev.n_tokens <= MAX_OUT);
        for (int i = 0; i < ev.n_tokens; i++) {
            if (ev.samples[i].token != ev.tokens[i] && !out->err[0])
                snprintf(out->err, sizeof out->err, "sample/token mismatch");
            out->logprob[out->n] = ev.samples[i].logprob;
            out->toks[out->n++] = ev.tokens[i];
        }
        SOFT_CHECK(ev.n_generated == out->n);
        if (ev.finished) {
            out->finished = true;
            out->reason = ev.reason;
            out->stop_token = ev.stop_token;
        }
    }
#undef SOFT_CHECK
    if (!out->finished && !out->err[0]) snprintf(out->err, sizeof out->err, "no finished event");
    if (ds_request_next(r, &ev, 0) && !out->err[0]) /* stays over */
        snprintf(out->err, sizeof out->err, "event after the end");
}

#endif
