/* runner.h — one planned step → one ds_batch → one forward → the step's logits rows (host).
 *
 * No policy: it runs the plan the scheduler made. Owns the backend cache (KV pool + GDN state
 * slots) and the host staging buffers, which are allocated once and reused every step; token
 * positions and block-table rows are computed here on the host from data already at hand
 * (catalogue items 2 and 3), so a device backend uploads them once in set_batch. The logits of
 * the sequences that want them come back in ONE device → host copy per step.
 *
 * Speculative decoding (ds_runner_init_spec, k > 0; spec.h has the whole step): every sequence
 * slot owns k + 2 GDN state slots of the cache, used as a ring; a verification item feeds
 * [last token, drafts] with the state after each token written to the ring's next places
 * (ds_batch.state_out_slots), ds_runner_commit moves the current slot on to the place after the
 * last accepted token (no copy), and ds_runner_draft runs the MTP over the step's rows and
 * k − 1 further one-token draft steps, keeping the drafts per slot. The step's greedy decisions
 * come from argmax ids (ds_runner_ids); logits rows are downloaded only for the items that ask
 * (ds_runner_logits).
 *
 * Greedy decode steps (ds_runner_step_greedy): when every item of a plan feeds exactly one token
 * and wants its greedy next token only, a backend with argmax_logits computes lm_head + argmax
 * fused (no logits leave the device), and one with step graphs replays the step from a graph
 * captured per number of sequences (keys tagged per runner: see graph_tag). The engine decides
 * when a plan qualifies. DS_SERVE_GRAPHS=0 turns this path off; DS_SERVE_GRAPHS=force turns it
 * on even without argmax_logits (forward + argmax over the logits: exercises the engine's side
 * on the CPU).
 *
 * Banned ids on the greedy path (catalogue item 6, ds_runner_step_greedy_bans): an item below
 * its min_tokens must not get its EOS / stop ids. With DS_OPT_DEVICE_MASKS (default on) on a
 * fused path whose backend has set_argmax_bans, such items stay on the fused path: the runner
 * keeps the backend's [rows, n_ban] table of banned ids and rebuilds + uploads it only when the
 * rows' ban keys change (a new request in a row, a row reaching its min_tokens), so a steady
 * batch uploads it once and a graph replay reads it from the same device buffer. Off (or no
 * such backend): those items take the logits path (ds_runner_step + the host sampler).
 * Speculative runners do the same per verification row (ds_runner_step_graphed_bans): row j of
 * an item decides its output token n_generated + j, so only the rows below min_tokens ban; off,
 * or a verification that is not fused, those items decide from downloaded logits.
 *
 * Later (design.md): upload only what changed. */
#ifndef DS_RUNNER_H
#define DS_RUNNER_H

#include <stdint.h>

#include "core/status.h"
#include "model/model.h"
#include "runtime/kv_blocks.h"
#include "runtime/scheduler.h"

/* Banned ids per greedy row: EOS ids (DS_SAMPLER_MAX_EOS) + stop_token_ids
 * (DS_SAMPLING_MAX_STOP_IDS); the engine checks the sum. */
#define DS_RUNNER_MAX_BANS 136

/* Writes the banned ids of output row `row` (at most cap) to ids; returns how many. A decode
 * step's row is its plan item; a verification's: runner.h ds_runner_step_graphed_bans. */
typedef int (*ds_runner_ban_fn)(void *ctx, int row, int32_t *ids, int cap);

typedef struct ds_runner {
    ds_model *model; /* borrowed */
    ds_cache *cache; /* owned: n_slots = max_seqs, n_blocks KV blocks of block_size */
    int max_seqs, max_tokens, max_blocks, block_size, vocab;

    /* host staging, one step's worth */
    int32_t *tokens;      /* [max_tokens] */
    int32_t *positions;   /* [max_tokens] */
    int32_t *seq_start;   /* [max_seqs + 1] */
    int32_t *seq_slot;    /* [max_seqs] */
    int32_t *seq_n_past;  /* [max_seqs] */
    int32_t *block_table; /* [max_seqs, max_blocks] */
    int32_t *out_rows;    /* [max_seqs] (speculative: [max_out]) */
    float *logits;        /* [max_seqs, V] the step's logits rows (speculative: [max_out, V]) */

    /* speculative decoding (k = 0: none of these is allocated) */
    int k;
    int max_out;          /* logits rows per step: max_seqs · (k + 1) */
    int32_t *gdn_cur;     /* [max_seqs] current GDN state slot of each sequence slot */
    int32_t *drafts;      /* [max_seqs, k] drafts for each sequence slot's next verification */
    int32_t *state_out;   /* [max_tokens] the step's ds_batch.state_out_slots */
    int32_t *next;        /* [max_tokens] token t+1 of each row (the MTP's input) */
    int32_t *ids;         /* [max_out] argmax of every logits row of the step */
    int32_t *row0;        /* [max_seqs] first logits row of each plan item */
    int32_t *d_order;     /* [max_seqs] plan items that draft, by k_next descending */
    int32_t *d_k;         /* [max_seqs] k_next of each plan item (0: no drafts) */
    int32_t *d_tokens, *d_pos, *d_start, *d_slot, *d_past; /* one draft step's batch */
    int32_t *d_table;     /* [max_seqs, max_blocks] */
    ds_batch batch;       /* the step's batch (the MTP re-runs its rows) */
    int n_out;            /* logits rows of the step */
    /* drafts chained on the device (spec.h "draft passes"; dev_drafts): pass j of the drafting
     * item at place p (d_order) keeps its id at token-buffer entry j·max_seqs + p, with no host
     * copy of its own; they reach the host with the next verification's one copy (accepted on
     * the device: ds_runner_wait_ahead lands them in drafts), or, when the host accepts it, with
     * a copy_tokens of the draft region into dh at its synchronize (drafts_fetch / drafts_land) */
    bool dev_drafts;
    int32_t *dh;          /* [k, max_seqs] */
    int32_t *token_src;   /* [max_tokens] the verification's ds_batch.token_src */
    int32_t *dslot, *dkp; /* [max_seqs] slot and draft count per place of the last draft call */
    int d_unlanded;       /* places of the last draft call whose drafts are not in drafts */
    uint32_t dgen;        /* draft calls so far (0: none) */
    uint32_t *slot_dgen;  /* [max_seqs] the call that drafted each slot's current drafts */
    int32_t *slot_place;  /* [max_seqs] the slot's place p in that call */
    /* acceptance on the device (dev_accept; see ds_runner_step_ahead): token-buffer regions
     * after the drafts' k·max_seqs entries — the verification's argmax ids (ids_at), each
     * verified row's next token (next_at), each item's emitted count (m_at) */
    bool dev_accept;
    int ids_at, next_at, m_at;
    int32_t *dev_m;       /* [max_seqs] emitted count per item as the device decided it */
    int32_t *pshift;      /* [max_tokens] a draft pass's ds_batch.pos_shift */
    int32_t *oshift;      /* [max_seqs] a draft pass's ds_batch.out_shift */
    /* chained steps (ds_runner_chain_verify): two verifications in flight, so what the host
     * reads of one (its ids, rows, counts: ids, row0, dev_m point at half vpar of each) and
     * its shift-table half (shift_at) come in two halves, the chained one taking the other
     * half; on the device one region of ids and counts serves both (each verification's
     * spec_accept and copy run before the next one writes it), so one graph does too */
    bool chain;           /* on (DS_OPT_SPEC_ASYNC, dev_accept, room in the buffers) */
    int vpar;             /* half of the newest verification */
    int shift_at;         /* its shift-table entries (spec_accept shift_at) */
    int32_t *ids_h0;      /* [max_out] the host ids without dev_accept */
    int32_t *row0_h[2];
    /* the step's one device → host copy (copy_tokens of the token buffer from entry 0 up to its
     * half's counts: the drafts it verified, the ids, the counts), per half; ids and dev_m
     * point into it. The drafts land in r->drafts when it is read (ds_runner_wait_ahead), for
     * the places of the draft call that made them, kept per half (the call after it rewrites
     * dslot / dkp first) */
    int32_t *tb_h[2];
    int32_t *land_slot[2], *land_k[2];
    int land_n[2];
    int fly[2], n_fly;    /* halves of the verifications in flight, oldest first */
    int32_t *vshift;      /* [max_seqs] a verification's ds_batch.pos_shift (chain: −1s unless
                             chained) */
    int32_t *last_row;    /* [max_seqs] each item's last row in the newest verification */
    int32_t *ahead_pos;   /* [max_seqs] a chained verification's items: positions (and GDN
                             ring places) ahead of n_computed when the one before it accepts
                             everything; 0 otherwise */
    /* sampled verifications on the device (ds_runner_set_sampling; backend spec_sample): the
     * verification computes every row's logits and spec_sample turns them into the target ids
     * spec_accept reads, instead of the fused greedy head */
    bool dev_sample;      /* possible (dev_accept, backend spec_sample, DS_OPT_SPEC_DEVICE_SAMPLE) */
    bool sampled;         /* the next verifications sample (set by ds_runner_set_sampling) */
    ds_spec_sampling *samp; /* [max_seqs] the table this runner uploaded last */
    int samp_n;           /* its rows (0: none yet) */
    uint64_t samp_uploads; /* set_spec_sampling calls */

    /* greedy decode steps (greedy_mode 0: none of these is allocated) */
    int greedy_mode;          /* 0 off, 1 fused argmax (+ graphs when the backend has them),
                                 2 forced (DS_SERVE_GRAPHS=force) */
    int32_t *gids;            /* [max_seqs] next token of each item; argmax_logits writes here,
                                 graph replays too, so it lives as long as the runner */
    signed char *graph_state; /* [max_seqs + 1] per sequence count: 0 untried, 1 captured,
                                 -1 eager (capture failed) */
    uint64_t graph_tag;       /* high bits of this runner's graph keys (| sequence count): unique
                                 per runner in the process, disjoint from small keys (bench) */

    /* banned ids of greedy rows (ds_runner_step_greedy_bans, ds_runner_step_graphed_bans;
     * runner.c bans_sync) */
    bool device_bans;         /* items below min_tokens may take the fused path with their ids
                                 banned on the device (DS_OPT_DEVICE_MASKS, backend
                                 set_argmax_bans, fused argmax: k = 0 greedy_mode 1, k > 0 graphed
                                 verifications); the ban_* buffers exist only then */
    uint32_t bans_id;         /* this runner in the process-wide record of who set a backend's
                                 ban table last (nonzero) */
    int ban_rows;             /* rows of the table this runner uploaded last (0: empty) */
    uint64_t *ban_keys;       /* [max_out] the ban key of each of those rows (0: no bans) */
    int32_t *ban_table;       /* [max_out, DS_RUNNER_MAX_BANS] host staging of the table */
    int *ban_count;           /* [max_out] ids of each staged row */
    uint64_t ban_uploads;     /* set_argmax_bans calls (a steady batch uploads once) */
} ds_runner;

/* Creates the cache: max_seqs state slots, n_blocks KV blocks of block_size tokens; block-table
 * rows of max_blocks. Steps carry up to max_tokens tokens (the model must allow that many, and
 * max_seqs logits rows). */
ds_status ds_runner_init(ds_runner *r, ds_model *m, int max_seqs, int max_tokens, int n_blocks,
                         int block_size, int max_blocks, ds_error *err);
/* Same with k draft tokens per step (the model needs an MTP head and max_out ≥ max_seqs·(k+1)). */
ds_status ds_runner_init_spec(ds_runner *r, ds_model *m, int max_seqs, int max_tokens,
                              int n_blocks, int block_size, int max_blocks, int k, ds_error *err);
void ds_runner_free(ds_runner *r);

/* Runs the plan (resetting the state slots it hands out fresh). On success *logits points at
 * F32 [plan->n_out, V] host rows, one per item that wants logits, in plan order; the caller may
 * overwrite them (the sampler does). */
ds_status ds_runner_step(ds_runner *r, const ds_sched_plan *plan, const ds_kv_blocks *kv,
                         float **logits, ds_error *err);

/* True when greedy decode steps may take ds_runner_step_greedy (see the top of this file). */
static inline bool ds_runner_greedy_ready(const ds_runner *r) { return r->greedy_mode != 0; }
/* Runs a plan whose every item feeds one token and wants logits; *ids points at the greedy next
 * token of each item, in plan order (valid until the next step). No logits are produced. */
ds_status ds_runner_step_greedy(ds_runner *r, const ds_sched_plan *plan, const ds_kv_blocks *kv,
                                const int32_t **ids, ds_error *err);
/* True when ds_runner_step_greedy_bans (k = 0) or ds_runner_step_graphed_bans (k > 0) may get
 * banned rows (see the top of this file). */
static inline bool ds_runner_device_bans(const ds_runner *r) { return r->device_bans; }
/* ds_runner_step_greedy where item i never gets the ids fill(ctx, i, ...) lists when
 * keys[i] != 0. A key names one ban list for as long as it is used (the engine: the request's
 * serial while it is below min_tokens, 0 after): fill is called only when the keys of the
 * rows changed since the last upload. keys NULL = no bans. Nonzero keys need
 * ds_runner_device_bans. Returns DS_OK with *ids = NULL, having run nothing, when the backend
 * refused the table (too large; device_bans is off from then on): run the plan through
 * ds_runner_step instead. */
ds_status ds_runner_step_greedy_bans(ds_runner *r, const ds_sched_plan *plan,
                                     const ds_kv_blocks *kv, const uint64_t *keys,
                                     ds_runner_ban_fn fill, void *ctx, const int32_t **ids,
                                     ds_error *err);

/* Whether the verifications accepted on the device from now on (ds_runner_queue_ahead and the
 * steps chained to it) sample: items NULL → greedy (the fused head's argmax ids); else item i
 * of their plans samples with items[i] (backend.h spec_sample; temperature ≤ 0: argmax), n
 * items. The table is uploaded only when it differs from this runner's last upload or another
 * runner uploaded since. Needs r->dev_sample for items ≠ NULL. */
void ds_runner_set_sampling(ds_runner *r, const ds_spec_sampling *items, int n);

/* ---- speculative steps ----------------------------------------------------------------------
 * ds_runner_verify runs the plan: item i feeds its known tokens and then its n_draft drafts
 * (logits rows for all 1 + n_draft of them when it wants logits), and computes the argmax of every
 * logits row. Item i's rows are [r->row0[i], r->row0[i] + 1 + n_draft). */
ds_status ds_runner_verify(ds_runner *r, const ds_sched_plan *plan, const ds_kv_blocks *kv,
                           ds_error *err);
/* Host F32 logits rows [row, row + n) of the step (downloaded on demand). */
float *ds_runner_logits(ds_runner *r, int row, int n, ds_error *err);
/* After acceptance: item i emitted n_emitted tokens; a verification's GDN state becomes the one
 * after its last accepted token. */
void ds_runner_commit(ds_runner *r, const ds_sched_plan *plan, int i, int n_emitted);
/* Graph states of a speculative runner (r->graph_state): three regions of
 * (max_seqs + 1)·(k + 1) each — verifications, draft passes 0, draft passes j ≥ 1. */
static inline size_t ds_runner_spec_graph_region(const ds_runner *r) {
    return ((size_t)r->max_seqs + 1) * (size_t)(r->k + 1);
}
static inline size_t ds_runner_spec_graph_states(const ds_runner *r) {
    return 4 * ds_runner_spec_graph_region(r);
}
/* The drafts of slot `slot` (k entries). */
static inline const int32_t *ds_runner_drafts(const ds_runner *r, int slot) {
    return r->drafts + (size_t)slot * (size_t)r->k;
}
/* After every item was advanced (ds_sched_seq_advance*): the MTP over the step's rows (its KV
 * filled at every fed position; row t's token t+1 read from the sequence's tokens), then
 * k_next[i] − 1 more draft steps for each item with k_next[i] ≥ 1 (its last fed token must be
 * its last accepted one). Drafts land in ds_runner_drafts(r, slot). */
ds_status ds_runner_draft(ds_runner *r, const ds_sched_plan *plan, const ds_kv_blocks *kv,
                          const int32_t *k_next, ds_error *err);

/* ---- acceptance on the device (issue 5: no host round-trip between verify and draft) --------
 * ds_runner_step_ahead runs a verification as ds_runner_step_graphed_bans does and, when it ran
 * fused (greedy ids, step graph) on a runner with dev_accept (backend spec_accept, device
 * drafts, DS_OPT_SPEC_DEVICE_ACCEPT on), goes on without waiting: spec_accept decides each
 * item's emitted count m on the device and each verified row's next token, and the draft
 * passes follow at once (k_ahead[i] drafts for item i, as many as it may take if every draft
 * is accepted now), their positions written for m = 1 + n_draft and lowered on the device by
 * the drafts rejected (ds_batch.pos_shift / out_shift). One synchronize at the end brings the
 * ids (r->ids), the device's counts (r->dev_m) and, a step later, the drafts. The caller then
 * accepts each item on the host from the same ids (ds_spec_verify: finishes, stop ids, the
 * sampler's record), checks its count against r->dev_m[i] where the request goes on, and
 * commits; it must not call ds_runner_draft for this step. *drafted says whether the drafts
 * were issued (false: the verification took another path, or the runner has no dev_accept;
 * then the caller accepts and drafts as after ds_runner_step_graphed_bans). */
ds_status ds_runner_step_ahead(ds_runner *r, const ds_sched_plan *plan, const ds_kv_blocks *kv,
                               const uint64_t *keys, ds_runner_ban_fn fill, void *ctx,
                               const int32_t *k_ahead, bool *drafted, int *graphed,
                               ds_error *err);
/* ds_runner_step_ahead without its final wait: when *drafted, the verification's results are
 * read after ds_runner_wait_ahead (and a chained verification may be queued first). */
ds_status ds_runner_queue_ahead(ds_runner *r, const ds_sched_plan *plan, const ds_kv_blocks *kv,
                                const uint64_t *keys, ds_runner_ban_fn fill, void *ctx,
                                const int32_t *k_ahead, bool *drafted, int *graphed,
                                ds_error *err);
/* Waits for the oldest verification in flight: its ids, rows and counts are readable (at the
 * pointers ds_runner_view gave before anything was chained behind it). */
ds_status ds_runner_wait_ahead(ds_runner *r, ds_error *err);
/* After a failed step accepted on the device (its requests are ended): forgets the
 * verifications in flight, so the runner can take the next step. */
void ds_runner_drop_inflight(ds_runner *r);

/* What the host reads of a verification (runner.h "chained steps"): valid until the one after
 * the next is queued. */
typedef struct ds_runner_view {
    const int32_t *ids;   /* argmax of every row */
    const int32_t *row0;  /* [items] first row of each item */
    const int32_t *dev_m; /* [items] emitted count as the device decided it */
} ds_runner_view;
static inline ds_runner_view ds_runner_view_of(const ds_runner *r) {
    return (ds_runner_view){r->ids, r->row0, r->dev_m};
}

/* ---- chained steps (issue 5: the next verification queued before the host reads this one) --
 * With a verification V(N) in flight (ds_runner_queue_ahead or a chained one) whose host
 * acceptance has not happened, ds_runner_chain_verify queues V(N + 1) for the same items as if
 * V(N) accepted every draft: item i feeds its bonus token (spec_accept's next token of V(N)'s
 * last row, from the token buffer) and the n_draft drafts of V(N)'s draft passes, at positions
 * n_computed + ahead[i] + j, reading the GDN slot ahead[i] places further on its ring and
 * writing the states after its rows to the places after that; the device lowers all of it by
 * the drafts V(N) rejected (ds_batch.pos_shift / slot_ring, spec_accept's shift of V(N)), so
 * V(N + 1) runs exactly as if it had been built after V(N)'s acceptance. ahead[i] =
 * V(N)'s n_draft + 1 of item i; plan = V(N)'s items, each feeding 1 known token and
 * n_draft ≥ 1 drafts (what V(N)'s passes drafted). spec_accept follows (into the other half);
 * nothing waits. ds_runner_chain_drafts then marks and queues V(N + 1)'s draft passes
 * (k_ahead[i] each, positions lowered by both shifts). The host accepts V(N) from
 * ds_runner_view_of taken before the chain call, after ds_runner_wait_ahead landed the drafts
 * it verified (they come with its one host copy). Needs r->chain; each item's KV
 * blocks must cover every position V(N + 1) and its passes may write. */
ds_status ds_runner_chain_verify(ds_runner *r, const ds_sched_plan *plan, const ds_kv_blocks *kv,
                                 const int32_t *ahead, ds_error *err);
ds_status ds_runner_chain_drafts(ds_runner *r, const ds_sched_plan *plan, const ds_kv_blocks *kv,
                                 const int32_t *k_ahead, ds_error *err);

/* ---- step graphs of serving steps (runtime/graph_warmup.h) -------------------------------
 * Runs a plan of greedy steps the way serving runs it, from the step graph of its shape when r
 * records one, and says what happened: *graphed (may be NULL) is 1 when the step ran from a
 * graph (recorded now or replayed), -1 when the shape's recording failed (now: *why has the
 * backend's reason; or at an earlier step) and it ran eagerly, 0 when r graphs no such step
 * (*why says why) and it ran eagerly. why may be NULL.
 *  - k = 0: every item feeds one token and wants its argmax (ds_runner_step_greedy's plan; ids
 *    in r->gids); graph per sequence count n, state r->graph_state[n], key graph_tag | n
 *    (for the warmup: the backend's banned-id table is left as it is, the engine's steps take
 *    ds_runner_step_greedy_bans);
 *  - k > 0: a verification (ds_runner_verify's results: r->ids, r->row0, then ds_runner_draft)
 *    whose items each feed one known token + the same n_draft = d drafts and decide from the
 *    argmax ids only (the caller checks that: greedy, no penalties / logprobs, min_tokens
 *    reached, or its rows below it banned through ds_runner_step_graphed_bans); the lm_head +
 *    argmax fused over all n · (1 + d) rows, no logits (ds_runner_logits must not be called for
 *    the step); graph per (n, d), state r->graph_state[n · (k + 1) + d] of
 *    (max_seqs + 1) · (k + 1) (allocated at the first call), keys tagged "SRVS". Other plans, or
 *    no graphs: ds_runner_verify (*graphed 0). So *graphed != 0 exactly when the step was fused:
 *    its ids come from the fused argmax (with the backend's ban table as it is: the warmup's
 *    steps leave it alone), and no logits exist.
 * plan NULL runs nothing: *graphed 0 with *why set when r graphs no steps at all. */
ds_status ds_runner_step_graphed(ds_runner *r, const ds_sched_plan *plan, const ds_kv_blocks *kv,
                                 int *graphed, ds_error *why, ds_error *err);
/* ds_runner_step_graphed of a verification (k > 0) whose fused argmax never gives output row
 * `row` the ids fill(ctx, row, ...) lists when keys[row] != 0. Item i's rows follow those of the
 * items before it, 1 + n_draft each (so they start at r->row0[i] after the step, and are the
 * fused argmax's rows); its row j decides its output token n_generated + j. Keys and fill as
 * ds_runner_step_greedy_bans: fill is called only when the rows' keys changed; the table is
 * uploaded before the step and read by every run or replay of its graph. Nonzero keys need
 * ds_runner_device_bans. When the step is not fused (*graphed 0: ds_runner_verify) nothing was
 * banned: its rows below min_tokens must decide from logits. That also happens when the
 * backend refused the table (device_bans is off from then on). The draft passes after the step
 * read the same table (one per backend): a draft pass's row p bans what the verification's row p
 * does, which may change drafts but never the tokens (the verification decides those). */
ds_status ds_runner_step_graphed_bans(ds_runner *r, const ds_sched_plan *plan,
                                      const ds_kv_blocks *kv, const uint64_t *keys,
                                      ds_runner_ban_fn fill, void *ctx, int *graphed,
                                      ds_error *why, ds_error *err);

#endif
