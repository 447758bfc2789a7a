/* spec.c — acceptance of draft tokens (the leading drafts that match the target's tokens: argmax
 * ids when greedy, tokens drawn by seed and position otherwise) and
 * the speculative-decoding counters. See spec.h for the whole step. */
#include "runtime/spec.h"

#include <string.h>

#include "core/env.h"
#include "sampling/counter_rng.h"

/* ---- statistics ------------------------------------------------------------------------------ */

void ds_spec_stats_add(ds_spec_stats *s, int n_draft, int n_accepted) {
    DS_ASSERT(n_draft >= 0 && n_draft <= DS_SPEC_MAX_K && n_accepted >= 0 &&
              n_accepted <= n_draft);
    if (n_draft == 0) return;
    s->n_drafts++;
    s->n_draft_tokens += (uint64_t)n_draft;
    s->n_accepted_tokens += (uint64_t)n_accepted;
    for (int i = 0; i < n_draft; i++) {
        s->drafted_per_pos[i]++;
        if (i < n_accepted) s->accepted_per_pos[i]++;
    }
}

void ds_spec_stats_merge(ds_spec_stats *dst, const ds_spec_stats *src) {
    dst->n_drafts += src->n_drafts;
    dst->n_draft_tokens += src->n_draft_tokens;
    dst->n_accepted_tokens += src->n_accepted_tokens;
    for (int i = 0; i < DS_SPEC_MAX_K; i++) {
        dst->accepted_per_pos[i] += src->accepted_per_pos[i];
        dst->drafted_per_pos[i] += src->drafted_per_pos[i];
    }
}

double ds_spec_acceptance_rate(const ds_spec_stats *s) {
    return s->n_draft_tokens ? (double)s->n_accepted_tokens / (double)s->n_draft_tokens : 0.0;
}

double ds_spec_mean_accepted_len(const ds_spec_stats *s) {
    return s->n_drafts ? 1.0 + (double)s->n_accepted_tokens / (double)s->n_drafts : 0.0;
}

double ds_spec_pos_rate(const ds_spec_stats *s, int i) {
    DS_ASSERT(i >= 0 && i < DS_SPEC_MAX_K);
    return s->drafted_per_pos[i] ? (double)s->accepted_per_pos[i] / (double)s->drafted_per_pos[i]
                                 : 0.0;
}

/* ---- acceptance ------------------------------------------------------------------------------ */

bool ds_spec_request_ok(const ds_sampling_params *p) {
    return ds_sampling_params_is_greedy(p) || p->logprobs < 0;
}

/* The request's processed distribution depends on its logits row and its parameters alone (no
 * penalties or logit_bias, whose history the device does not keep, and no JSON mode, whose
 * grammar state lives in the host's sampler) and it asks for no logprobs:
 * what a decision on the device (argmax ids, spec_sample) needs besides the min_tokens bans. */
static bool device_distribution(const ds_sampling_params *p) {
    return p->logprobs < 0 && p->presence_penalty == 0.0f && p->frequency_penalty == 0.0f &&
           p->repetition_penalty == 1.0f && p->n_logit_bias == 0 && !p->json;
}

bool ds_spec_argmax_banned_suffices(const ds_sampler *s) {
    const ds_sampling_params *p = &s->params;
    return ds_sampling_params_is_greedy(p) && device_distribution(p);
}

bool ds_spec_argmax_suffices(const ds_sampler *s, int n_generated) {
    return ds_spec_argmax_banned_suffices(s) && n_generated >= s->params.min_tokens;
}

bool ds_spec_sample_suffices(const ds_sampler *s, int n_generated) {
    const ds_sampling_params *p = &s->params;
    return !ds_sampling_params_is_greedy(p) && device_distribution(p) &&
           n_generated >= p->min_tokens;
}

ds_spec_sampling ds_spec_sampling_of(const ds_sampler *s) {
    const ds_sampling_params *p = &s->params;
    return (ds_spec_sampling){.temperature = s->greedy ? 0.0f : s->temperature,
                              .top_p = p->top_p, .min_p = p->min_p, .top_k = p->top_k,
                              .seed = s->seed};
}

int ds_spec_min_tokens_bans(const ds_sampler *s, int32_t *ids, int cap) {
    const int n_stop = s->params.n_stop_token_ids;
    DS_ASSERT(s->n_eos + n_stop <= cap);
    int n = 0;
    for (int i = 0; i < s->n_eos; i++) ids[n++] = s->eos_ids[i];
    for (int i = 0; i < n_stop; i++) ids[n++] = s->params.stop_token_ids[i];
    return n;
}

static void plain_result(ds_sample_result *r, int token) {
    memset(r, 0, sizeof *r);
    r->token = token;
}

/* Index drawn from probs[0..n) (sums to ~1): the inverse CDF, in index order, at u (rounding:
 * the last index with mass; 0 when none has). backend.h spec_sample draws the same way on the
 * device. */
static int draw_inverse_cdf(const float *probs, int n, double u) {
    double total = 0.0;
    for (int i = 0; i < n; i++) total += probs[i];
    if (!(total > 0.0)) return 0;
    double target = u * total, acc = 0.0;
    int last = 0;
    for (int i = 0; i < n; i++) {
        if (probs[i] <= 0.0f) continue;
        acc += probs[i];
        last = i;
        if (acc > target) return i;
    }
    return last; /* rounding: the last token with mass */
}

ds_status ds_spec_verify(ds_sampler *s, int n_generated, const int32_t *drafts, int n_draft,
                         const int32_t *target_ids, float *logits, int vocab, int32_t *tokens,
                         ds_sample_result *res, ds_spec_result *out, ds_error *err) {
    DS_ASSERT(n_draft >= 0 && n_draft <= DS_SPEC_MAX_K && vocab == s->vocab);
    DS_ASSERT(target_ids || logits);
    const bool greedy = ds_sampling_params_is_greedy(&s->params);
    *out = (ds_spec_result){.stop_token = -1};
    for (int i = 0; i <= n_draft; i++) {
        const int gen = n_generated + i; /* output tokens before this one */
        const bool has_draft = i < n_draft;
        const int d = has_draft ? drafts[i] : -1;
        float *row = logits ? logits + (size_t)i * (size_t)vocab : NULL;
        int tok;
        ds_status st;
        if (target_ids) {
            tok = target_ids[i];
            plain_result(&res[i], tok);
        } else if (greedy || !ds_spec_request_ok(&s->params)) {
            /* greedy with penalties / min_tokens / logprobs, or a sampled request that does not
             * speculate (logprobs: its one row is a plain decode): the sampler decides */
            if ((st = ds_sampler_sample(s, row, gen, &res[i], err)) != DS_OK) return st;
            tok = res[i].token;
        } else {
            /* speculative sampling with a deterministic proposal d: the token is drawn from p
             * by the inverse CDF at the position's number (counter_rng.h), and d is accepted
             * when it is that token. So d is accepted with probability p(d), as the usual
             * accept-with-p(d)-else-draw-from-the-residual rule accepts it, every token comes
             * out with probability p, and the token does not depend on whether the row had a
             * draft (the device's chained steps draft fewer near max_tokens than the host's).
             * backend.h spec_sample decides the same way. */
            if ((st = ds_sampler_probs(s, row, gen, err)) != DS_OK) return st;
            const uint64_t key = ds_crng_key(s->seed, (int64_t)s->n_prompt + gen);
            tok = draw_inverse_cdf(row, vocab, (double)ds_crng_uniform(key, DS_CRNG_DRAW));
            plain_result(&res[i], tok);
        }
        /* every path: the draft is accepted when it is the row's token */
        const bool accepted = has_draft && tok == d;
        /* the sampler masks these ids below min_tokens; target ids come from an argmax that
         * banned them on the device, which falls back to the plain argmax when every other id
         * is NaN: such a row fails here as the sampler fails a row without a finite logit */
        if (ds_sampler_min_tokens_banned(s, tok, gen))
            return ds_error_set(err, DS_ERR_INTERNAL,
                                "speculative verification: output token %d is the banned id %d "
                                "(min_tokens %d)", gen, tok, s->params.min_tokens);
        if ((st = ds_sampler_accept(s, tok, err)) != DS_OK) return st;
        tokens[i] = tok;
        out->n_emitted = i + 1;
        if (accepted) out->n_accepted++;
        out->reason = ds_sampler_finish_reason(s, tok, gen + 1, &out->stop_token);
        if (out->reason != DS_FINISH_NONE || !accepted) break;
    }
    return DS_OK;
}

/* ---- draft passes ---------------------------------------------------------------------------- */

ds_status ds_spec_draft_pass_run(void *ctx, ds_error *err) {
    ds_spec_draft_pass *p = ctx;
    ds_model *m = p->m;
    const bool fused = p->keep >= 0;
    ds_status st = ds_mtp_forward(m, p->cache, p->b, p->hidden, !fused, err);
    if (st != DS_OK || p->b->n_out == 0) return st;
    if (fused) {
        ds_tensor oh = ds_view2d(m->mtp.out_h.data, m->mtp.out_h.dtype, p->b->n_out, m->cfg.hidden);
        m->be->ops->argmax_logits(m->be, &oh, &m->w.lm_head, p->ids, p->keep);
    } else {
        ds_tensor lg = ds_view2d(m->s.logits.data, DS_DTYPE_F32, p->b->n_out, m->cfg.vocab);
        m->be->ops->argmax(m->be, &lg, p->ids);
    }
    return DS_OK;
}

bool ds_spec_device_drafts(const ds_model *m, int k, int max_rows) {
    return m->be->ops->argmax_logits != NULL && (int64_t)k * max_rows <= DS_TOKEN_BUF &&
           ds_env_switch("DS_OPT_SPEC_DEVICE_DRAFTS", true);
}
