#include "sampling/sampler.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "sampling/dist.h"
#include "sampling/select.h"

const char *ds_finish_reason_name(ds_finish_reason r) {
    switch (r) {
    case DS_FINISH_STOP: return "stop";
    case DS_FINISH_LENGTH: return "length";
    case DS_FINISH_NONE: break;
    }
    return NULL;
}

ds_status ds_sampler_init(ds_sampler *s, const ds_sampling_params *p, int vocab,
                          const int *eos_ids, int n_eos, ds_error *err) {
    memset(s, 0, sizeof *s);
    ds_token_counts_init(&s->counts);
    if (vocab <= 0) return ds_error_set(err, DS_ERR_INVALID_ARG, "vocab must be > 0, got %d", vocab);
    if (n_eos < 0 || n_eos > DS_SAMPLER_MAX_EOS || (n_eos > 0 && !eos_ids))
        return ds_error_set(err, DS_ERR_INVALID_ARG, "eos ids: expected 0..%d ids, got %d",
                            DS_SAMPLER_MAX_EOS, n_eos);
    for (int i = 0; i < n_eos; i++)
        if (eos_ids[i] < 0 || eos_ids[i] >= vocab)
            return ds_error_set(err, DS_ERR_INVALID_ARG,
                                "eos id %d is outside the vocabulary [0, %d)", eos_ids[i], vocab);
    ds_status st = ds_sampling_params_validate(p, vocab, err);
    if (st != DS_OK) return st;
    st = ds_sampling_params_clone(&s->params, p, err);
    if (st != DS_OK) return st;

    s->vocab = vocab;
    s->n_eos = n_eos;
    for (int i = 0; i < n_eos; i++) s->eos_ids[i] = eos_ids[i];
    s->seed = p->has_seed ? p->seed : ds_rng_entropy_seed();
    ds_rng_seed(&s->rng, s->seed);

    s->greedy = ds_sampling_params_is_greedy(p);
    /* vLLM raises tiny temperatures to 0.01 (logits / 1e-4 overflow fp16/bf16 kernels); we
     * keep the rule so the same request means the same distribution on both engines. */
    s->temperature = p->temperature < DS_SAMPLING_MIN_TEMP ? DS_SAMPLING_MIN_TEMP : p->temperature;
    s->penalties = p->presence_penalty != 0.0f || p->frequency_penalty != 0.0f ||
                   p->repetition_penalty != 1.0f;
    if (p->logprobs >= 0) {
        s->raw = malloc((size_t)vocab * sizeof *s->raw);
        if (!s->raw)
            return ds_error_set(err, DS_ERR_NOMEM, "out of memory for the logprobs buffer "
                                "(%d floats)", vocab);
    }
    if (p->json) {
        ds_json_init(&s->json_state);
        if (s->params.json_schema) ds_js_init(&s->js_state, s->params.json_schema);
        s->json_on = !p->json_deferred;
        s->end_ids = malloc(((size_t)n_eos + (size_t)p->n_stop_token_ids + 1) * sizeof(int));
        if (!s->end_ids) return ds_error_set(err, DS_ERR_NOMEM, "out of memory (JSON mode)");
        for (int i = 0; i < n_eos; i++) s->end_ids[s->n_end++] = eos_ids[i];
        for (int i = 0; i < p->n_stop_token_ids; i++)
            s->end_ids[s->n_end++] = p->stop_token_ids[i];
    }
    return DS_OK;
}

void ds_sampler_free(ds_sampler *s) {
    ds_sampling_params_free(&s->params);
    ds_token_counts_free(&s->counts);
    free(s->raw);
    s->raw = NULL;
    free(s->end_ids);
    s->end_ids = NULL;
    s->n_end = 0;
}

ds_status ds_sampler_add_prompt(ds_sampler *s, const int32_t *tokens, int n, ds_error *err) {
    for (int i = 0; i < n; i++)
        if (tokens[i] < 0 || tokens[i] >= s->vocab)
            return ds_error_set(err, DS_ERR_INVALID_ARG,
                                "prompt token %d (position %d) is outside the vocabulary [0, %d)",
                                (int)tokens[i], i, s->vocab);
    s->n_prompt += n;
    if (!s->penalties) return DS_OK;
    for (int i = 0; i < n; i++)
        if (ds_token_counts_add(&s->counts, tokens[i], true) != DS_OK)
            return ds_error_set(err, DS_ERR_NOMEM, "out of memory recording the prompt");
    return DS_OK;
}

/* An id that ends the output (EOS, a stop id). */
static bool is_end_id(const ds_sampler *s, int token) {
    for (int i = 0; i < s->n_end; i++)
        if (s->end_ids[i] == token) return true;
    return false;
}

ds_status ds_sampler_accept(ds_sampler *s, int token, ds_error *err) {
    DS_ASSERT(token >= 0 && token < s->vocab);
    if (s->json_on && !is_end_id(s, token) &&
        !(s->params.json_schema
              ? ds_js_feed_token(&s->js_state, s->params.json_schema, s->params.json, token)
              : ds_json_feed_token(&s->json_state, s->params.json, token)))
        return ds_error_set(err, DS_ERR_INVALID_ARG,
                            "JSON mode: token %d cannot continue the JSON object%s", token,
                            s->params.json_schema ? " of the schema" : "");
    if (s->params.json && !s->json_on && token == s->params.json_start_after) s->json_on = true;
    s->n_accepted++;
    if (!s->penalties) return DS_OK;
    if (ds_token_counts_add(&s->counts, token, false) != DS_OK)
        return ds_error_set(err, DS_ERR_NOMEM, "out of memory recording generated tokens");
    return DS_OK;
}

bool ds_sampler_is_eos(const ds_sampler *s, int token) {
    for (int i = 0; i < s->n_eos; i++)
        if (s->eos_ids[i] == token) return true;
    return false;
}

static bool is_stop_id(const ds_sampler *s, int token) {
    for (int i = 0; i < s->params.n_stop_token_ids; i++)
        if (s->params.stop_token_ids[i] == token) return true;
    return false;
}

ds_finish_reason ds_sampler_finish_reason(const ds_sampler *s, int token, int n_generated,
                                          int *stop_token) {
    if (stop_token) *stop_token = -1;
    if (n_generated >= s->params.min_tokens) {
        if (!s->params.ignore_eos && ds_sampler_is_eos(s, token)) return DS_FINISH_STOP;
        if (is_stop_id(s, token)) {
            if (stop_token) *stop_token = token;
            return DS_FINISH_STOP;
        }
    }
    if (n_generated >= s->params.max_tokens) return DS_FINISH_LENGTH;
    return DS_FINISH_NONE;
}

/* vLLM's LogitBiasLogitsProcessor: runs before the penalties (vLLM v1 Sampler order). The ids
 * are distinct and in the vocabulary (validated at init). */
void ds_sampler_apply_logit_bias(const ds_sampler *s, float *logits) {
    for (int i = 0; i < s->params.n_logit_bias; i++)
        logits[s->params.logit_bias[i].id] += s->params.logit_bias[i].bias;
}

/* vLLM apply_penalties: repetition over prompt ∪ output (divide positive logits, multiply
 * negative ones), then frequency · count and presence · [count > 0] over the output only. */
void ds_sampler_apply_penalties(const ds_sampler *s, float *logits) {
    if (!s->penalties) return;
    const float rep = s->params.repetition_penalty;
    const float freq = s->params.frequency_penalty;
    const float pres = s->params.presence_penalty;
    for (uint32_t i = 0; i < s->counts.cap; i++) {
        const ds_token_count *e = &s->counts.slots[i];
        if (e->token < 0) continue;
        float l = logits[e->token];
        if (rep != 1.0f) l = l > 0.0f ? l / rep : l * rep;
        if (e->n_output > 0) l -= freq * (float)e->n_output + pres;
        logits[e->token] = l;
    }
}

void ds_sampler_apply_min_tokens(const ds_sampler *s, float *logits, int n_generated) {
    if (n_generated >= s->params.min_tokens) return;
    for (int i = 0; i < s->n_eos; i++) logits[s->eos_ids[i]] = -INFINITY;
    for (int i = 0; i < s->params.n_stop_token_ids; i++)
        logits[s->params.stop_token_ids[i]] = -INFINITY;
}

bool ds_sampler_min_tokens_banned(const ds_sampler *s, int token, int n_generated) {
    return n_generated < s->params.min_tokens &&
           (ds_sampler_is_eos(s, token) || is_stop_id(s, token));
}

/* NaN → -inf and -0 → +0 in place (equal logits then have equal radix keys); returns the max
 * and the number of entries > -inf. Blocks of 16 with a constant inner trip count so GCC -O2
 * vectorises it. */
#define SANITIZE_LANES 16
static float sanitize_max(float *x, int n, int *n_live) {
    float mx[SANITIZE_LANES];
    float cnt[SANITIZE_LANES]; /* float: an int count from a float compare defeats if-conversion;
                                  exact while a lane counts < 2^24 */
    for (int j = 0; j < SANITIZE_LANES; j++) {
        mx[j] = -INFINITY;
        cnt[j] = 0;
    }
    int i = 0;
    for (; i + SANITIZE_LANES <= n; i += SANITIZE_LANES)
        for (int j = 0; j < SANITIZE_LANES; j++) {
            float v = x[i + j];
            v = v == v ? v + 0.0f : -INFINITY;
            x[i + j] = v;
            mx[j] = v > mx[j] ? v : mx[j];
            cnt[j] += v > -INFINITY ? 1.0f : 0.0f;
        }
    for (; i < n; i++) {
        float v = x[i];
        v = v == v ? v + 0.0f : -INFINITY;
        x[i] = v;
        mx[0] = v > mx[0] ? v : mx[0];
        cnt[0] += v > -INFINITY ? 1.0f : 0.0f;
    }
    float m = -INFINITY;
    int live = 0;
    for (int j = 0; j < SANITIZE_LANES; j++) {
        m = mx[j] > m ? mx[j] : m;
        live += (int)cnt[j];
    }
    *n_live = live;
    return m;
}

/* First index holding the maximum m (the lowest id wins ties, as torch.argmax). */
static int argmax_first(const float *x, int n, float m) {
    for (int i = 0; i < n; i++)
        if (x[i] == m) return i;
    DS_ASSERT(0);
    return -1;
}

/* The shared front half of sample and probs: logit_bias, penalties, min_tokens, then either
 * the greedy token (*greedy_token >= 0) or the sampling distribution in d. */
static ds_status process(ds_sampler *s, float *logits, int n_generated, int *greedy_token,
                         ds_dist *d, ds_error *err) {
    const int n = s->vocab;
    ds_sampler_apply_logit_bias(s, logits);
    ds_sampler_apply_penalties(s, logits);
    ds_sampler_apply_min_tokens(s, logits, n_generated);
    if (s->json_on && s->params.json_schema)
        ds_js_mask(&s->js_state, s->params.json_schema, s->params.json, s->end_ids, s->n_end,
                   logits, n);
    else if (s->json_on)
        ds_json_mask(&s->json_state, s->params.json, s->end_ids, s->n_end, logits, n);
    int n_live;
    const float m = sanitize_max(logits, n, &n_live);
    if (n_live == 0)
        return ds_error_set(err, DS_ERR_INTERNAL,
                            "sampling: no token has a finite logit (all -inf or NaN)");
    *greedy_token = -1;
    if (s->greedy || m == INFINITY) {
        /* (+inf logits: treated as certain; the first one wins like a greedy tie) */
        *greedy_token = argmax_first(logits, n, m);
        return DS_OK;
    }
    const ds_dist_params dp = {.temperature = s->temperature,
                               .top_k = s->params.top_k,
                               .top_p = s->params.top_p,
                               .min_p = s->params.min_p};
    ds_dist_build(d, logits, n, &dp, m, n_live);
    return DS_OK;
}

/* Raw log_softmax statistics, from the logits before any processing: the copy lets us rank the
 * chosen token afterwards (processing overwrites the logits). */
static double raw_logprob_prepare(ds_sampler *s, const float *logits, ds_sample_result *res) {
    const int n = s->vocab;
    float m = -INFINITY;
    for (int i = 0; i < n; i++) {
        float v = logits[i];
        if (v != v) v = -INFINITY;
        s->raw[i] = v;
        if (v > m) m = v;
    }
    const double lse = ds_logsumexp(s->raw, n, m);
    res->n_top = ds_select_top_n(s->raw, (size_t)n, s->params.logprobs, res->top_ids,
                                 res->top_logprobs);
    for (int j = 0; j < res->n_top; j++)
        res->top_logprobs[j] = (float)((double)res->top_logprobs[j] - lse);
    return lse;
}

static void raw_logprob_finish(const ds_sampler *s, double lse, ds_sample_result *res) {
    const float v = s->raw[res->token];
    int rank = 0;
    for (int i = 0; i < s->vocab; i++) rank += s->raw[i] >= v;
    res->rank = rank;
    res->logprob = (float)((double)v - lse);
}

ds_status ds_sampler_sample(ds_sampler *s, float *logits, int n_generated, ds_sample_result *res,
                            ds_error *err) {
    res->token = -1;
    res->logprob = 0.0f;
    res->rank = 0;
    res->n_top = 0;
    double lse = 0.0;
    if (s->params.logprobs >= 0) lse = raw_logprob_prepare(s, logits, res);

    int token;
    ds_dist d;
    ds_status st = process(s, logits, n_generated, &token, &d, err);
    if (st != DS_OK) return st;
    if (token < 0) token = ds_dist_draw(&d, logits, s->vocab, ds_rng_uniform(&s->rng));
    res->token = token;
    if (s->params.logprobs >= 0) raw_logprob_finish(s, lse, res);
    return DS_OK;
}

ds_status ds_sampler_probs(ds_sampler *s, float *logits, int n_generated, ds_error *err) {
    int token;
    ds_dist d;
    ds_status st = process(s, logits, n_generated, &token, &d, err);
    if (st != DS_OK) return st;
    if (token >= 0) {
        memset(logits, 0, (size_t)s->vocab * sizeof *logits);
        logits[token] = 1.0f;
        return DS_OK;
    }
    ds_dist_write_probs(&d, logits, s->vocab);
    return DS_OK;
}
