/* spec.h — MTP speculative decoding: acceptance of draft tokens, its statistics, and a driver
 * for one sequence of a ds_session (deltaserve generate, bench, tests).
 *
 * One speculative step for a sequence whose last emitted token x sits at position c (not yet in
 * the caches) and which holds n ≤ k draft tokens d1..dn from the MTP head:
 *  1. verify: ONE target forward over [x, d1..dn] at positions c..c+n; the GDN state after each
 *     of the n+1 tokens goes to a spare state slot (ds_batch.state_out_slots), attention KV is
 *     simply written at those positions;
 *  2. accept (ds_spec_verify): row i of the target's output decides token c+i+1; while it equals
 *     d_{i+1} the draft is accepted and checking goes on; the first mismatch (or row n) yields
 *     the target's own token (correction / bonus). m = accepted + 1 tokens are emitted; greedy
 *     requests decide from the pre-sampled argmax ids alone (no logits leave the device), sampled
 *     ones draw each row's token from p by the inverse CDF at a uniform keyed by seed and
 *     position and accept d when it is that token — with probability p(d), as the standard
 *     rejection rule for a deterministic (greedy) proposal accepts it; the output is
 *     distributed exactly as the target model's p (p = the request's processed distribution:
 *     penalties, temperature, top-k/p, min-p, min_tokens) and does not depend on the drafts;
 *  3. roll back: the sequence's current GDN slot becomes the spare that holds the state after
 *     token m−1 (a swap of slot ids, no copy); KV beyond c+m−1 is garbage nobody reads (the next
 *     step writes those positions before any query reaches them); the old slot becomes a spare;
 *  4. draft: the MTP head runs over the same rows as the verify batch (its KV is filled at every
 *     verified position, h_t = the target's final-normed hidden state, token t+1 = the accepted
 *     token / bonus), its row c+m−1 drafts d1' for position c+m+1; each further draft step feeds
 *     the MTP's own post-norm output and the previous draft (k_next − 1 more one-token steps).
 * The prompt fills the MTP's KV the same way: every prefill chunk is followed by an MTP pass
 * over its rows (token t+1 is the next prompt token, or the first sampled token). */
#ifndef DS_SPEC_H
#define DS_SPEC_H

#include <stdbool.h>
#include <stdint.h>

#include "backend/spec_sampling.h"
#include "core/status.h"
#include "runtime/session.h"
#include "sampling/sampler.h"

#define DS_SPEC_MAX_K 8 /* most draft tokens per step */

/* Counters of a run (vLLM's spec_decode metrics). */
typedef struct ds_spec_stats {
    uint64_t n_drafts;          /* verification steps that checked at least one draft token */
    uint64_t n_draft_tokens;    /* draft tokens checked */
    uint64_t n_accepted_tokens; /* draft tokens accepted */
    uint64_t accepted_per_pos[DS_SPEC_MAX_K]; /* accepted at draft position i (0 = first) */
    uint64_t drafted_per_pos[DS_SPEC_MAX_K];  /* checked at draft position i */
} ds_spec_stats;

/* Records one verification of n_draft tokens of which the first n_accepted were accepted. */
void ds_spec_stats_add(ds_spec_stats *s, int n_draft, int n_accepted);
void ds_spec_stats_merge(ds_spec_stats *dst, const ds_spec_stats *src);
/* accepted / checked draft tokens (0 when none). */
double ds_spec_acceptance_rate(const ds_spec_stats *s);
/* tokens emitted per verification step = 1 + accepted / steps (0 when none). */
double ds_spec_mean_accepted_len(const ds_spec_stats *s);
/* accepted_per_pos[i] / drafted_per_pos[i] (0 when none). */
double ds_spec_pos_rate(const ds_spec_stats *s, int i);

/* False for requests that must not speculate: sampled (temperature > 0) requests that ask for
 * logprobs (the rejection path does not compute them). */
bool ds_spec_request_ok(const ds_sampling_params *p);

/* True when the target's argmax ids alone decide rows n_generated.. of a greedy request: greedy,
 * no penalties, no logit_bias, no logprobs, min_tokens already reached (catalogue item 9). */
bool ds_spec_argmax_suffices(const ds_sampler *s, int n_generated);
/* The same before min_tokens is reached, given that the ids ds_spec_min_tokens_bans lists are
 * excluded from the argmax (catalogue item 6): greedy, no penalties, no logit_bias, no
 * logprobs. */
bool ds_spec_argmax_banned_suffices(const ds_sampler *s);
/* True when spec_sample on the device decides rows n_generated.. of a sampled request
 * (backend.h: speculative sampling without a host round trip): temperature > 0,
 * no penalties, no logit_bias, no logprobs, min_tokens already reached. temperature, top_k,
 * top_p and min_p are the device's (ds_spec_sampling_of). */
bool ds_spec_sample_suffices(const ds_sampler *s, int n_generated);
/* The device's parameters of a request (spec_sample's table row): its effective temperature
 * (0 for greedy requests: the argmax), top_k, top_p, min_p, and its seed. */
ds_spec_sampling ds_spec_sampling_of(const ds_sampler *s);
/* The ids the sampler bans while a request is below its min_tokens (ds_sampler_apply_min_tokens:
 * its EOS ids, then its stop_token_ids), at most cap of them into ids; returns how many. */
int ds_spec_min_tokens_bans(const ds_sampler *s, int32_t *ids, int cap);

typedef struct ds_spec_result {
    int n_emitted;           /* tokens emitted (≥ 1): accepted drafts, then correction/bonus */
    int n_accepted;          /* draft tokens among them */
    ds_finish_reason reason; /* finish after the last emitted token (NONE: keep going) */
    int stop_token;          /* the stop_token_id that finished it, else -1 */
} ds_spec_result;

/* Decides the tokens of one verification (step 2 above) for a request that has emitted
 * n_generated tokens, and records each in the sampler (ds_sampler_accept). drafts [n_draft];
 * target_ids [n_draft + 1] the target's argmax per row (only when ds_spec_argmax_suffices, or
 * ds_spec_argmax_banned_suffices with the ids of ds_spec_min_tokens_bans excluded from the
 * argmax of every row j with n_generated + j < min_tokens), or NULL: then logits
 * [n_draft + 1, vocab] host F32 rows (clobbered). Stops early at a finish (EOS / stop id /
 * max_tokens). tokens / res receive up to n_draft + 1 entries. Fails (DS_ERR_INTERNAL) rather
 * than emit one of those ids below min_tokens, whatever decided it. */
ds_status ds_spec_verify(ds_sampler *s, int n_generated, const int32_t *drafts, int n_draft,
                         const int32_t *target_ids, float *logits, int vocab, int32_t *tokens,
                         ds_sample_result *res, ds_spec_result *out, ds_error *err);

/* ---- draft passes ----------------------------------------------------------------------------
 * Step 4 runs the MTP k times: over the verified rows (pass 0), then one token per drafting
 * sequence (pass j, fed draft j − 1 and its own pass j − 1 output). With a backend that has
 * argmax_logits and DS_OPT_SPEC_DEVICE_DRAFTS (default on), each pass ends in the fused greedy
 * head, its ids kept in the backend's token buffer, and pass j takes its tokens from there
 * (ds_batch.token_src): the drafts never make a round trip through the host between passes, no
 * pass waits for the device, and the next verification reads them from the buffer as well; their
 * host copies land at the verification's synchronize. Otherwise each pass downloads its logits'
 * argmax before the next one is built. Both give the same drafts. */

/* One MTP pass (a ds_step_fn, so it can be recorded as a step graph): the MTP over b from the
 * hidden rows it continues (m->s.normed for pass 0, m->mtp.out_h after), then the greedy head
 * over its b->n_out rows into ids: fused and kept at token-buffer entry keep when keep ≥ 0 (ids
 * land at the next synchronize), else logits + argmax (ids on the host at return). */
typedef struct ds_spec_draft_pass {
    ds_model *m;
    ds_cache *cache;
    const ds_batch *b;
    const ds_tensor *hidden;
    int32_t *ids;
    int keep;
} ds_spec_draft_pass;
ds_status ds_spec_draft_pass_run(void *ctx, ds_error *err);

/* True when drafts chain on the device for this backend and k: argmax_logits, the switch, and
 * room for k passes of max_rows ids in the token buffer. */
bool ds_spec_device_drafts(const ds_model *m, int k, int max_rows);

/* ---- one sequence of a ds_session ------------------------------------------------------------
 * The session must come from ds_session_init_spec with n_spec ≥ k, on a model with an MTP head
 * and max_out ≥ k + 1. Token streams are token-identical to plain decoding for greedy requests. */

/* Test hook: may overwrite the MTP's n_draft drafts (e.g. an oracle that knows the reference
 * continuation). n_generated = tokens emitted so far; drafts[i] proposes output token
 * n_generated + i. */
typedef void (*ds_spec_draft_hook)(void *ctx, int n_generated, int n_draft, int32_t *drafts);

typedef struct ds_spec_gen {
    ds_session *sess;  /* borrowed */
    int slot;
    int k;             /* draft tokens per step */
    ds_sampler *sampler; /* borrowed */
    int n_generated;   /* tokens emitted */
    int32_t pending;   /* the last emitted token: next to be fed, at position n_past[slot] */
    int32_t drafts[DS_SPEC_MAX_K];
    int n_draft;
    bool finished;
    ds_finish_reason reason;
    int stop_token;
    ds_spec_stats stats;
    double t_verify, t_draft; /* seconds in verification (target forward + acceptance) and in
                                 the MTP (catch-up + draft steps) */
    ds_spec_draft_hook hook;
    void *hook_ctx;
    /* host staging */
    float *logits;          /* [k + 1, V] */
    int32_t *ids;           /* [k + 1] */
    int32_t *tokens;        /* [max_tokens] tokens of the current batch */
    int32_t *next;          /* [max_tokens] token t+1 of each row (MTP input) */
    int32_t *out_slots;     /* [k + 1] state snapshot slots */
    /* verification steps from step graphs (greedy, backend with argmax_logits and graphs,
     * DS_OPT_SPEC_GRAPHS): graph key tag (unique per generator: the graphs write into `ids`)
     * and per draft count n, 0 not tried / 1 captured / -1 eager */
    uint64_t graph_tag;
    signed char graph_state[DS_SPEC_MAX_K + 1];
    bool graphs;
    /* drafts chained on the device (see "draft passes"); graph states of draft pass 0 per
     * verified row count (1 + d) and of pass j */
    bool dev_drafts;
    bool drafts_on_dev; /* the current drafts are in the token buffer, host copies pending */
    signed char pass0_state[DS_SPEC_MAX_K + 2];
    signed char passj_state[DS_SPEC_MAX_K];
} ds_spec_gen;

ds_status ds_spec_gen_init(ds_spec_gen *g, ds_session *s, int slot, int k, ds_sampler *sampler,
                           ds_error *err);
void ds_spec_gen_free(ds_spec_gen *g);

/* Resets the slot, feeds the prompt (filling the MTP's KV over it), samples the first token and
 * drafts the next ones. tokens/res receive the emitted tokens (*n_out = 1). */
ds_status ds_spec_gen_prefill(ds_spec_gen *g, const int32_t *prompt, int n_prompt,
                              int32_t *tokens, ds_sample_result *res, int *n_out, ds_error *err);

/* One speculative step: emits 1 .. n_draft + 1 tokens into tokens/res ([k + 1] each). Sets
 * g->finished (and reason) when generation ends. */
ds_status ds_spec_gen_step(ds_spec_gen *g, int32_t *tokens, ds_sample_result *res, int *n_out,
                           ds_error *err);

#endif
