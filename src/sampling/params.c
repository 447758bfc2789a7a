#include "sampling/params.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <utf8proc.h>

#include "sampling/json_schema.h"

void ds_sampling_params_init(ds_sampling_params *p) {
    memset(p, 0, sizeof *p);
    p->temperature = 1.0f;
    p->top_p = 1.0f;
    p->top_k = 0;
    p->min_p = 0.0f;
    p->repetition_penalty = 1.0f;
    p->max_tokens = 16;
    p->logprobs = -1;
}

bool ds_sampling_params_is_greedy(const ds_sampling_params *p) {
    return p->temperature < DS_SAMPLING_GREEDY_EPS;
}

/* Rejects malformed UTF-8 so that byte-level stop matching lines up with characters. */
static bool utf8_valid(const char *s, size_t n) {
    const utf8proc_uint8_t *u = (const utf8proc_uint8_t *)s;
    size_t i = 0;
    while (i < n) {
        utf8proc_int32_t cp;
        utf8proc_ssize_t k = utf8proc_iterate(u + i, (utf8proc_ssize_t)(n - i), &cp);
        if (k <= 0) return false;
        i += (size_t)k;
    }
    return true;
}

#define BAD(...) ds_error_set(err, DS_ERR_INVALID_ARG, __VA_ARGS__)

ds_status ds_sampling_params_validate(const ds_sampling_params *p, int vocab, ds_error *err) {
    /* `!(x >= lo)` style comparisons also reject NaN. */
    if (!(p->temperature >= 0.0f) || isinf(p->temperature))
        return BAD("temperature must be a finite number >= 0, got %g", (double)p->temperature);
    if (!(p->top_p > 0.0f && p->top_p <= 1.0f))
        return BAD("top_p must be in (0, 1], got %g", (double)p->top_p);
    if (!(p->min_p >= 0.0f && p->min_p <= 1.0f))
        return BAD("min_p must be in [0, 1], got %g", (double)p->min_p);
    if (!(p->presence_penalty >= -2.0f && p->presence_penalty <= 2.0f))
        return BAD("presence_penalty must be in [-2, 2], got %g", (double)p->presence_penalty);
    if (!(p->frequency_penalty >= -2.0f && p->frequency_penalty <= 2.0f))
        return BAD("frequency_penalty must be in [-2, 2], got %g", (double)p->frequency_penalty);
    if (!(p->repetition_penalty > 0.0f) || isinf(p->repetition_penalty))
        return BAD("repetition_penalty must be a finite number > 0, got %g",
                   (double)p->repetition_penalty);
    if (p->max_tokens < 1) return BAD("max_tokens must be at least 1, got %d", p->max_tokens);
    if (p->min_tokens < 0) return BAD("min_tokens must be >= 0, got %d", p->min_tokens);
    if (p->min_tokens > p->max_tokens)
        return BAD("min_tokens (%d) must be <= max_tokens (%d)", p->min_tokens, p->max_tokens);
    if (p->logprobs < -1 || p->logprobs > DS_SAMPLING_MAX_LOGPROBS)
        return BAD("logprobs must be in [0, %d] (or -1 for none), got %d",
                   DS_SAMPLING_MAX_LOGPROBS, p->logprobs);

    if (p->n_stop_token_ids < 0 || p->n_stop_token_ids > DS_SAMPLING_MAX_STOP_IDS)
        return BAD("stop_token_ids: at most %d ids are allowed, got %d", DS_SAMPLING_MAX_STOP_IDS,
                   p->n_stop_token_ids);
    if (p->n_stop_token_ids > 0 && !p->stop_token_ids)
        return BAD("stop_token_ids: %d ids announced but no array given", p->n_stop_token_ids);
    for (int i = 0; i < p->n_stop_token_ids; i++) {
        int id = p->stop_token_ids[i];
        if (id < 0 || (vocab > 0 && id >= vocab))
            return BAD("stop_token_ids[%d] = %d is outside the vocabulary [0, %d)", i, id,
                       vocab > 0 ? vocab : 0);
    }

    if (p->n_logit_bias < 0 || p->n_logit_bias > DS_SAMPLING_MAX_LOGIT_BIAS)
        return BAD("logit_bias: at most %d entries are allowed, got %d", DS_SAMPLING_MAX_LOGIT_BIAS,
                   p->n_logit_bias);
    if (p->n_logit_bias > 0 && !p->logit_bias)
        return BAD("logit_bias: %d entries announced but no array given", p->n_logit_bias);
    for (int i = 0; i < p->n_logit_bias; i++) {
        const ds_logit_bias *b = &p->logit_bias[i];
        if (b->id < 0 || (vocab > 0 && b->id >= vocab))
            return BAD("logit_bias: token id %d is outside the vocabulary [0, %d)", b->id,
                       vocab > 0 ? vocab : 0);
        if (!(b->bias >= -DS_SAMPLING_MAX_BIAS && b->bias <= DS_SAMPLING_MAX_BIAS))
            return BAD("logit_bias: the bias of token %d must be in [-100, 100], got %g", b->id,
                       (double)b->bias);
        for (int j = 0; j < i; j++) /* ≤ 1024 entries: the quadratic check is cheap */
            if (p->logit_bias[j].id == b->id)
                return BAD("logit_bias: token id %d appears more than once", b->id);
    }

    if (p->n_stop < 0 || p->n_stop > DS_SAMPLING_MAX_STOP)
        return BAD("stop: at most %d stop strings are allowed, got %d", DS_SAMPLING_MAX_STOP,
                   p->n_stop);
    if (p->n_stop > 0 && !p->stop)
        return BAD("stop: %d strings announced but no array given", p->n_stop);
    for (int i = 0; i < p->n_stop; i++) {
        const char *s = p->stop[i];
        if (!s) return BAD("stop[%d] is null", i);
        size_t n = strlen(s);
        if (n == 0) return BAD("stop[%d] is an empty string", i);
        if (n > DS_SAMPLING_MAX_STOP_LEN)
            return BAD("stop[%d] is %zu bytes long; the limit is %d", i, n,
                       DS_SAMPLING_MAX_STOP_LEN);
        if (!utf8_valid(s, n)) return BAD("stop[%d] is not valid UTF-8", i);
    }
    if (p->json_schema && !p->json) return BAD("response_format: a JSON schema needs JSON mode's vocabulary");
    if (p->json && (p->ignore_eos || p->min_tokens > 0))
        return BAD("response_format: JSON mode ends when the object closes; it cannot be combined "
                   "with %s", p->ignore_eos ? "ignore_eos" : "min_tokens");
    return DS_OK;
}

ds_status ds_sampling_params_clone(ds_sampling_params *dst, const ds_sampling_params *src,
                                   ds_error *err) {
    DS_ASSERT(dst != src);
    *dst = *src;
    dst->stop_token_ids = NULL;
    dst->stop = NULL;
    dst->logit_bias = NULL;
    dst->owns_arrays = true;
    ds_json_schema_ref(dst->json_schema); /* shared, dropped by _free */
    int n_ids = src->n_stop_token_ids > 0 ? src->n_stop_token_ids : 0;
    int n_stop = src->n_stop > 0 ? src->n_stop : 0;
    int n_bias = src->n_logit_bias > 0 ? src->n_logit_bias : 0;
    dst->n_stop_token_ids = n_ids;
    dst->n_stop = n_stop;
    dst->n_logit_bias = n_bias;
    if (n_ids > 0) {
        int *ids = malloc((size_t)n_ids * sizeof *ids);
        if (!ids) goto nomem;
        memcpy(ids, src->stop_token_ids, (size_t)n_ids * sizeof *ids);
        dst->stop_token_ids = ids;
    }
    if (n_bias > 0) {
        ds_logit_bias *b = malloc((size_t)n_bias * sizeof *b);
        if (!b) goto nomem;
        memcpy(b, src->logit_bias, (size_t)n_bias * sizeof *b);
        dst->logit_bias = b;
    }
    if (n_stop > 0) {
        char **strs = calloc((size_t)n_stop, sizeof *strs);
        if (!strs) goto nomem;
        dst->stop = (const char *const *)strs;
        for (int i = 0; i < n_stop; i++) {
            const char *s = src->stop[i] ? src->stop[i] : "";
            size_t n = strlen(s) + 1;
            strs[i] = malloc(n);
            if (!strs[i]) goto nomem;
            memcpy(strs[i], s, n);
        }
    }
    return DS_OK;
nomem:
    ds_sampling_params_free(dst);
    return ds_error_set(err, DS_ERR_NOMEM, "out of memory copying sampling parameters");
}

void ds_sampling_params_free(ds_sampling_params *p) {
    if (!p->owns_arrays) return;
    ds_json_schema_unref(p->json_schema);
    p->json_schema = NULL;
    free((void *)p->stop_token_ids);
    free((void *)p->logit_bias);
    if (p->stop) {
        char **strs = (char **)p->stop;
        for (int i = 0; i < p->n_stop; i++) free(strs[i]);
        free(strs);
    }
    p->stop_token_ids = NULL;
    p->stop = NULL;
    p->logit_bias = NULL;
    p->n_logit_bias = 0;
    p->n_stop_token_ids = 0;
    p->n_stop = 0;
    p->owns_arrays = false;
}
