/* test_prefix_cache.c — prefix caching of finished sequences (runtime/prefix_cache.h): the
 * entry table, the scheduler's take-overs and evictions, and the engine on the CPU backend with
 * the committed tiny models, where a continuation resumed from a finished request's caches must
 * give exactly the tokens (and logprobs) of the same request run alone from scratch. The CPU's
 * GDN op is forced to the token-by-token recurrence (testlib.c), whose result does not depend
 * on where a sequence was split into steps, so any difference is a state or KV position the
 * take-over got wrong. */
#include "testlib.h"

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/model.h"
#include "runtime/engine.h"
#include "runtime/prefix_cache.h"
#include "runtime/scheduler.h"
#include "runtime/session.h"

#define MAX_PROMPT 512
#define MAX_OUT 128
#define MODEL_MAX_TOKENS 64
#define MODEL_MAX_OUT 48

#include "engine_harness.h" /* result, solo_run, drain_soft (needs MAX_OUT) */

/* ---- the entry table ------------------------------------------------------------------------ */

/* Proves: a match needs all L + 1 tokens of an entry and leaves at least one token to feed; the
 * longest matching entry wins; oldest skips the excepted slot; take removes exactly one. */
static void test_entry_table(void **state) {
    (void)state;
    ds_prefix_cache c;
    ds_prefix_cache_init(&c, 3);
    const int32_t a[] = {1, 2, 3, 4, 5, 6, 7, 8};
    assert_true(ds_prefix_cache_store(&c, 5, a, 3));     /* tokens 1 2 3 | 4 */
    assert_true(ds_prefix_cache_store(&c, 2, a, 5));     /* 1 2 3 4 5 | 6 */
    const int32_t other[] = {1, 2, 9, 4, 5, 6};
    assert_true(ds_prefix_cache_store(&c, 7, other, 2)); /* 1 2 | 9 */
    assert_false(ds_prefix_cache_store(&c, 8, a, 1));    /* full */
    int L = -1;
    assert_int_equal(ds_prefix_cache_match(&c, a, 8, &L), 2);
    assert_int_equal(L, 5);
    assert_int_equal(ds_prefix_cache_match(&c, a, 6, &L), 2); /* L = 5 < 6 */
    assert_int_equal(ds_prefix_cache_match(&c, a, 5, &L), 5); /* L = 5 would feed nothing */
    assert_int_equal(L, 3);
    assert_int_equal(ds_prefix_cache_match(&c, a, 3, &L), -1); /* token 3 (4) not known */
    const int32_t b[] = {1, 2, 3, 7, 7};
    assert_int_equal(ds_prefix_cache_match(&c, b, 5, &L), -1); /* last token differs */
    assert_int_equal(ds_prefix_cache_match(&c, other, 6, &L), 7);
    assert_int_equal(ds_prefix_cache_oldest(&c, -1), 5);
    assert_int_equal(ds_prefix_cache_oldest(&c, 5), 2);
    ds_prefix_cache_take(&c, 2);
    assert_int_equal(c.n, 2);
    assert_int_equal(ds_prefix_cache_match(&c, a, 8, &L), 5);
    assert_int_equal(L, 3);
    ds_prefix_cache_free(&c);
}

/* ---- the scheduler -------------------------------------------------------------------------- */

typedef struct sched_fix {
    ds_kv_blocks kv;
    ds_state_slots slots;
    ds_scheduler s;
} sched_fix;

static void sched_open(sched_fix *f, int n_seqs, int n_blocks) {
    ds_kv_blocks_init(&f->kv, n_blocks, 4, n_seqs, 64);
    ds_state_slots_init(&f->slots, n_seqs);
    ds_scheduler_init(&f->s, n_seqs, 64, &f->kv, &f->slots);
    ds_scheduler_set_prefix_caching(&f->s, true);
}

static void sched_close(sched_fix *f) {
    ds_scheduler_free(&f->s);
    ds_state_slots_free(&f->slots);
    ds_kv_blocks_free(&f->kv);
}

/* Runs q (the only sequence planned) until it holds n_tokens tokens with all but the last
 * computed, the engine's view of a sequence that just sampled its last token. */
static void run_until(sched_fix *f, ds_sched_seq *q, int n_tokens) {
    while (q->n_tokens < n_tokens) {
        const ds_sched_plan *p = ds_scheduler_schedule(&f->s);
        assert_int_equal(p->n_items, 1);
        assert_ptr_equal(p->items[0].seq, q);
        ds_sched_seq_advance(q, p->items[0].n_tokens, p->items[0].wants_logits);
    }
}

/* Proves: a retired sequence keeps its slot and the blocks of its n_computed positions (the
 * rest go back); a continuation takes them over (same slot, n_computed = L, not fresh, the
 * counters say so); a sequence that does not continue it gets a fresh slot; a sequence retired
 * with prefix caching off, or one whose last token is not sampled yet, frees everything. */
static void test_sched_take_over(void **state) {
    (void)state;
    sched_fix f;
    sched_open(&f, 2, 32);
    int32_t toks[64];
    for (int i = 0; i < 64; i++) toks[i] = 100 + i;
    ds_sched_seq a, b, c;
    ds_sched_seq_init(&a, toks, 10, 8, NULL);
    ds_scheduler_add(&f.s, &a);
    run_until(&f, &a, 14); /* 13 computed, token 13 sampled */
    const int slot = a.slot;
    assert_true(ds_kv_blocks_held(&f.kv, slot) >= 4);
    ds_scheduler_retire(&f.s, &a);
    assert_int_equal(a.state, DS_SCHED_NONE);
    assert_int_equal(f.s.pc.n, 1);
    assert_int_equal(ds_kv_blocks_held(&f.kv, slot), 4); /* ⌈13 / 4⌉ */
    assert_int_equal(ds_scheduler_prefix_blocks(&f.s), 4);
    assert_int_equal(ds_state_slots_n_used(&f.slots), 1);
    /* b continues a's 14 tokens with 6 more */
    ds_sched_seq_init(&b, toks, 20, 4, NULL);
    ds_scheduler_add(&f.s, &b);
    const ds_sched_plan *p = ds_scheduler_schedule(&f.s);
    assert_int_equal(p->n_items, 1);
    assert_int_equal(b.slot, slot);
    assert_int_equal(b.n_computed, 13);
    assert_int_equal(p->items[0].n_tokens, 7);
    assert_false(p->items[0].fresh_slot);
    assert_int_equal(b.n_reused, 13);
    assert_int_equal(f.s.pc.n, 0);
    assert_int_equal(f.s.prefix_hits, 13);
    assert_int_equal(f.s.prefix_queries, 10 + 20); /* prompt lengths at first admission */
    /* c differs in its last cached token: a fresh slot */
    ds_sched_seq_advance(&b, 7, true);
    ds_scheduler_retire(&f.s, &b); /* entry of 20 cached + 1 */
    int32_t ctoks[64];
    memcpy(ctoks, toks, sizeof ctoks);
    ctoks[20] = 7;
    ds_sched_seq_init(&c, ctoks, 22, 4, NULL);
    ds_scheduler_add(&f.s, &c);
    p = ds_scheduler_schedule(&f.s);
    assert_int_equal(p->n_items, 1);
    assert_true(p->items[0].fresh_slot);
    assert_int_equal(c.n_computed, 0);
    assert_int_equal(c.n_reused, 0);
    assert_int_equal(f.s.pc.n, 1);
    /* a sequence that has not sampled after its last fed token is not kept */
    ds_scheduler_retire(&f.s, &c); /* mid-prompt: n_tokens > n_computed + 1 */
    assert_int_equal(f.s.pc.n, 1);
    assert_int_equal(ds_state_slots_n_used(&f.slots), 1);
    /* off: the entries go */
    ds_scheduler_set_prefix_caching(&f.s, false);
    assert_int_equal(f.s.pc.n, 0);
    assert_int_equal(ds_kv_blocks_n_used(&f.kv), 0);
    assert_int_equal(ds_state_slots_n_used(&f.slots), 0);
    sched_close(&f);
}

/* Proves: entries give way before anyone is preempted — to admission short of a slot, to
 * admission short of blocks, and to a running sequence that grows — least recently stored
 * first; a head that cannot fit even with every entry gone leaves them in place. */
static void test_sched_eviction(void **state) {
    (void)state;
    sched_fix f;
    sched_open(&f, 3, 12); /* 3 slots, 12 blocks of 4 positions */
    int32_t toks[3][64];
    ds_sched_seq q[3];
    for (int i = 0; i < 3; i++) {
        for (int t = 0; t < 64; t++) toks[i][t] = 1000 * i + t;
        ds_sched_seq_init(&q[i], toks[i], 6, 4, NULL);
        ds_scheduler_add(&f.s, &q[i]);
    }
    /* all three prefill together, then decode to 8 tokens (7 computed: 2 blocks each) */
    while (q[0].n_tokens < 8) {
        const ds_sched_plan *p = ds_scheduler_schedule(&f.s);
        assert_int_equal(p->n_items, 3);
        for (int i = 0; i < 3; i++)
            ds_sched_seq_advance(p->items[i].seq, p->items[i].n_tokens, true);
    }
    for (int i = 0; i < 3; i++) ds_scheduler_retire(&f.s, &q[i]);
    assert_int_equal(f.s.pc.n, 3);
    assert_int_equal(ds_state_slots_n_free(&f.slots), 0);
    assert_int_equal(ds_kv_blocks_n_free(&f.kv), 6);
    /* a new sequence needs a slot: the oldest entry (q[0]'s) goes */
    int32_t nt[64];
    for (int t = 0; t < 64; t++) nt[t] = 5000 + t;
    ds_sched_seq n1;
    ds_sched_seq_init(&n1, nt, 10, 4, NULL);
    ds_scheduler_add(&f.s, &n1);
    const ds_sched_plan *p = ds_scheduler_schedule(&f.s);
    assert_int_equal(p->n_items, 1);
    assert_int_equal(f.s.prefix_evicted, 1);
    assert_int_equal(f.s.pc.n, 2);
    int L = 0;
    assert_int_equal(ds_prefix_cache_match(&f.s.pc, toks[0], 9, &L), -1);
    assert_true(ds_prefix_cache_match(&f.s.pc, toks[1], 9, &L) >= 0);
    /* growing n1 past the free blocks evicts q[1]'s entry, then q[2]'s, and preempts nobody */
    ds_sched_seq_advance(&n1, 10, true);
    while (n1.n_tokens < 14) {
        p = ds_scheduler_schedule(&f.s);
        assert_int_equal(p->n_items, 1);
        ds_sched_seq_advance(&n1, 1, true);
    }
    assert_int_equal(f.s.n_preemptions, 0);
    /* n1 holds ⌈13 / 4⌉ = 4 blocks; a second new sequence of 30 tokens needs 8: 12 − 4 = 8 with
     * both remaining entries gone */
    int32_t mt[64];
    for (int t = 0; t < 64; t++) mt[t] = 7000 + t;
    ds_sched_seq n2;
    ds_sched_seq_init(&n2, mt, 30, 2, NULL);
    ds_scheduler_add(&f.s, &n2);
    p = ds_scheduler_schedule(&f.s);
    assert_int_equal(p->n_items, 2);
    assert_int_equal(f.s.pc.n, 0);
    assert_int_equal(f.s.prefix_evicted, 3);
    assert_int_equal(f.s.n_preemptions, 0);
    /* a head that does not fit even with every entry gone: the entry stays */
    ds_sched_seq_advance(&n1, 1, true);
    ds_sched_seq_advance(&n2, 30, true);
    ds_scheduler_retire(&f.s, &n1); /* 14 cached: 4 blocks kept */
    assert_int_equal(f.s.pc.n, 1);
    ds_sched_seq big;
    int32_t bt[64];
    for (int t = 0; t < 64; t++) bt[t] = 9000 + t;
    ds_sched_seq_init(&big, bt, 40, 1, NULL); /* 10 blocks; 4 free + 4 cached */
    ds_scheduler_add(&f.s, &big);
    p = ds_scheduler_schedule(&f.s);
    assert_int_equal(p->n_items, 1); /* n2's decode only */
    assert_int_equal(f.s.pc.n, 1);
    assert_int_equal(big.state, DS_SCHED_WAITING);
    ds_scheduler_remove(&f.s, &big);
    ds_scheduler_remove(&f.s, &n2);
    sched_close(&f);
}

/* ---- the engine ----------------------------------------------------------------------------- */

typedef test_model fixture; /* testlib.h */

static void fixture_open(fixture *f, const char *name) {
    char rel[256];
    snprintf(rel, sizeof rel, !strcmp(name, "demo") ? "../../models/qwen35-demo" : "models/%s",
             name);
    test_model_load(f, test_data_path(rel));
    test_model_init(f, MODEL_MAX_TOKENS, MODEL_MAX_OUT);
}

static int rnd_int(test_rng *g, int lo, int hi) { /* [lo, hi] */
    float u = (test_rng_uniform(g) + 1.0f) * 0.5f;
    int v = lo + (int)(u * (float)(hi - lo + 1));
    return v > hi ? hi : v;
}

/* A conversation: each turn's prompt is the previous turn's prompt + output + new tokens. */
typedef struct turn {
    int32_t prompt[MAX_PROMPT];
    int n_prompt;
    ds_sampling_params params;
    int32_t stop_ids[1];
    result solo, eng;
} turn;

enum { N_CONV = 6, N_TURNS = 4 };

/* "The grace of our Lord Jesus Christ be with you all. Amen." in the demo's tokenizer, after
 * which the demo model wants EOS at once (as in test_spec_engine.c): below min_tokens it
 * answers " Amen." and wants EOS again, so such turns end by EOS, often inside a verification
 * whose drafts (EOS among them) the device accepted past it. */
static const int32_t AMEN[] = {470, 1733, 268, 606, 639, 691, 848, 301, 352, 376, 369, 13, 2475, 13};
#define N_AMEN ((int)(sizeof AMEN / sizeof AMEN[0]))

/* Appends a turn's new tokens to x->prompt and sets its parameters. k = 0: random tokens,
 * greedy or seeded sampled turns. k > 0: greedy only (sampled tokens follow the drafts'
 * randomness), even conversations end by EOS after the AMEN text. */
static void make_turn(turn *x, test_rng *g, int c, int t, int k) {
    const bool amen = k > 0 && c % 2 == 0;
    if (amen) {
        memcpy(x->prompt + x->n_prompt, AMEN, sizeof AMEN);
        x->n_prompt += N_AMEN;
    } else {
        /* conversation 0's last turn feeds no new token: its prompt is the whole last turn */
        const int fresh = c == 0 && t == 2 ? 0 : rnd_int(g, 1, t == 0 ? 40 : 12);
        for (int i = 0; i < fresh; i++) x->prompt[x->n_prompt++] = rnd_int(g, 0, 500);
    }
    ds_sampling_params *p = &x->params;
    ds_sampling_params_init(p);
    p->max_tokens = rnd_int(g, 4, 24);
    p->temperature = 0.0f;
    p->ignore_eos = !amen && c % 3 != 2;
    if (amen) p->min_tokens = 1 + (c + t) % 4;
    if (k == 0 && c % 2 == 1) {
        p->temperature = 0.8f;
        p->top_p = 0.9f;
        p->has_seed = true;
        p->seed = 77 + (uint64_t)c;
        p->logprobs = 2;
    }
}

/* Runs the conversations turn by turn, all conversations of a turn at once; each turn's prompt
 * extends the last turn's with its engine output and new tokens (make_turn). */
static void run_conversations(fixture *f, const ds_engine_opts *o, uint64_t seed, int k,
                              turn (*conv)[N_TURNS], ds_engine_stats *st) {
    test_rng g = {seed};
    ds_engine *e;
    ds_error err = {0};
    if (ds_engine_create(&f->model, o, &e, &err) != DS_OK) fail_msg("engine: %s", err.msg);
    ds_session ss;
    if (ds_session_init(&ss, &f->model, 1, MAX_PROMPT + MAX_OUT, &err) != DS_OK)
        fail_msg("session: %s", err.msg);
    for (int t = 0; t < N_TURNS; t++) {
        ds_request *req[N_CONV];
        for (int c = 0; c < N_CONV; c++) {
            turn *x = &conv[c][t];
            x->n_prompt = 0;
            if (t > 0) {
                const turn *prev = &conv[c][t - 1];
                memcpy(x->prompt, prev->prompt, (size_t)prev->n_prompt * sizeof(int32_t));
                memcpy(x->prompt + prev->n_prompt, prev->eng.toks,
                       (size_t)prev->eng.n * sizeof(int32_t));
                x->n_prompt = prev->n_prompt + prev->eng.n;
            }
            make_turn(x, &g, c, t, k);
            if (k > 0 && c % 2 == 1) {
                /* a stop id from the turn's own output (the engine is idle: every request of
                 * the last turn was drained, none of this one's submitted yet), so the turn ends at a token the device may have
                 * accepted past, in a steady batch whose verifications chain */
                x->params.max_tokens = 24;
                solo_run(f, &ss, x->prompt, x->n_prompt, &x->params, &x->solo);
                x->stop_ids[0] = x->solo.toks[x->solo.n > 12 ? 12 : x->solo.n - 1];
                x->params.stop_token_ids = x->stop_ids;
                x->params.n_stop_token_ids = 1;
            }
        }
        for (int c = 0; c < N_CONV; c++) {
            const turn *x = &conv[c][t];
            ds_request_desc d = {.prompt = x->prompt, .n_prompt = x->n_prompt,
                                 .params = x->params};
            if (ds_engine_submit(e, &d, &req[c], &err) != DS_OK)
                fail_msg("submit: %s", err.msg);
        }
        for (int c = 0; c < N_CONV; c++) {
            turn *x = &conv[c][t];
            drain_soft(req[c], x->n_prompt, &x->eng);
            if (x->eng.err[0]) fail_msg("turn %d conversation %d: %s", t, c, x->eng.err);
            ds_request_release(req[c]);
        }
    }
    ds_engine_get_stats(e, st);
    ds_engine_destroy(e);
    /* the references, once the engine no longer uses the model's buffers */
    for (int c = 0; c < N_CONV; c++)
        for (int t = 0; t < N_TURNS; t++)
            solo_run(f, &ss, conv[c][t].prompt, conv[c][t].n_prompt, &conv[c][t].params,
                     &conv[c][t].solo);
    ds_session_free(&ss);
}

static void expect_same(turn (*conv)[N_TURNS], const char *what) {
    for (int c = 0; c < N_CONV; c++) {
        for (int t = 0; t < N_TURNS; t++) {
            const result *a = &conv[c][t].solo, *b = &conv[c][t].eng;
            bool same = a->n == b->n && a->reason == b->reason &&
                        memcmp(a->toks, b->toks, (size_t)a->n * sizeof a->toks[0]) == 0 &&
                        memcmp(a->logprob, b->logprob, (size_t)a->n * sizeof a->logprob[0]) == 0;
            if (!same) {
                int j = 0;
                while (j < a->n && j < b->n && a->toks[j] == b->toks[j]) j++;
                fail_msg("%s: conversation %d turn %d (prompt %d): solo %d tokens, engine %d, "
                         "first difference at %d", what, c, t, conv[c][t].n_prompt, a->n, b->n,
                         j);
            }
        }
    }
}

static void base_opts(ds_engine_opts *o, int k) {
    ds_engine_opts_default(o);
    o->max_num_seqs = 8;
    o->max_model_len = MAX_PROMPT;
    o->max_num_batched_tokens = 32; /* small: long prompts are chunked */
    o->block_size = 16;
    o->num_speculative_tokens = k;
}

/* Expected take-overs of a run: every turn after the first continues its last turn's whole
 * sequence, so with room for every entry each of them resumes at the last turn's prompt +
 * output − 1 tokens. */
static uint64_t expected_hits(turn (*conv)[N_TURNS]) {
    uint64_t n = 0;
    for (int c = 0; c < N_CONV; c++)
        for (int t = 1; t < N_TURNS; t++) n += (uint64_t)(conv[c][t - 1].n_prompt + conv[c][t - 1].eng.n - 1);
    return n;
}

/* Proves (k = 0, tiny-moe): multi-turn conversations through one engine with prefix caching give
 * exactly the tokens and logprobs of each turn run alone from scratch — greedy and seeded
 * sampled turns (a third of them allow EOS), a turn that feeds a single new token,
 * prompts chunked across steps — and every later turn took its last turn over (prefix_hits =
 * the sum of their L). Then with a KV pool too small to keep every entry: the tokens stay the
 * same, entries are evicted, and some turns still resume. Off: no entries, the same tokens. */
static void test_engine_conversations(void **state) {
    (void)state;
    fixture f;
    fixture_open(&f, "tiny-moe");
    turn(*conv)[N_TURNS] = calloc(N_CONV, sizeof *conv);
    ds_engine_opts o;
    base_opts(&o, 0);
    ds_engine_stats st;
    run_conversations(&f, &o, 0xc0ffee, 0, conv, &st);
    expect_same(conv, "prefix caching");
    printf("  k=0: %llu of %llu prompt tokens taken over, %llu entries stored, %llu evicted\n",
           (unsigned long long)st.prefix_hits, (unsigned long long)st.prefix_queries,
           (unsigned long long)st.prefix_stored, (unsigned long long)st.prefix_evicted);
    assert_int_equal(st.prefix_hits, expected_hits(conv));
    for (int c = 0; c < N_CONV; c++)
        for (int t = 0; t < N_TURNS; t++)
            assert_int_equal(conv[c][t].eng.n_cached,
                             t == 0 ? 0 : conv[c][t - 1].n_prompt + conv[c][t - 1].eng.n - 1);
    assert_int_equal(st.prefix_stored, N_CONV * N_TURNS);
    assert_int_equal(st.prefix_entries, N_CONV);
    assert_int_equal(st.running + st.kv_blocks_used + st.slots_used, 0);

    /* a pool of 12 blocks (192 positions) for 6 conversations of up to ~170 tokens */
    o.num_kv_blocks = 12;
    run_conversations(&f, &o, 0xc0ffee, 0, conv, &st);
    expect_same(conv, "small pool");
    printf("  k=0, 12 blocks: %llu tokens taken over, %llu entries evicted, %llu preemptions\n",
           (unsigned long long)st.prefix_hits, (unsigned long long)st.prefix_evicted,
           (unsigned long long)st.preemptions);
    assert_true(st.prefix_evicted > 0 && st.prefix_hits > 0);

    o.num_kv_blocks = 0;
    o.prefix_caching = false;
    run_conversations(&f, &o, 0xc0ffee, 0, conv, &st);
    expect_same(conv, "prefix caching off");
    assert_int_equal(st.prefix_hits + st.prefix_stored + (uint64_t)st.prefix_entries, 0);
    free(conv);
    test_model_close(&f);
}

/* Proves (k = 2, the demo model, whose MTP head is often right): conversations resumed from the
 * prefix cache give the tokens of each turn alone, with verifications accepted on the host, on
 * the device, and on the device chained (DS_OPT_SPEC_DEVICE_ACCEPT=1, the CPU's stand-in for the
 * CUDA path). Every turn ends by EOS (the AMEN turns) or by a stop id taken from its own output
 * (the others), so finishes fall inside verifications whose drafts the device accepted past.
 * On the host and on the unchained device every later turn takes its last turn over; chained,
 * a turn that finished before the device's count while the next verification was queued is
 * not kept (engine_spec.c accept_step: keeping it, conversation 1 turn 3 went wrong at its
 * first token), and the others are. */
static void test_spec_conversations(void **state) {
    (void)state;
    fixture f;
    fixture_open(&f, "demo");
    turn(*conv)[N_TURNS] = calloc(N_CONV, sizeof *conv);
    ds_engine_opts o;
    base_opts(&o, 2);
    const char *modes[] = {"host", "device", "device chained"};
#ifdef DS_SANITIZE_BUILD
    const int first_mode = 2; /* sanitizer builds: the chained mode alone (648 s for all three) */
#else
    const int first_mode = 0;
#endif
    for (int mode = first_mode; mode < 3; mode++) {
        setenv("DS_OPT_SPEC_DEVICE_ACCEPT", mode == 0 ? "0" : "1", 1);
        setenv("DS_OPT_SPEC_ASYNC", mode == 2 ? "1" : "0", 1);
        ds_engine_stats st;
        run_conversations(&f, &o, 0x5eca11, 2, conv, &st);
        unsetenv("DS_OPT_SPEC_ASYNC");
        unsetenv("DS_OPT_SPEC_DEVICE_ACCEPT");
        expect_same(conv, modes[mode]);
        int eos = 0;
        for (int c = 0; c < N_CONV; c++)
            for (int t = 0; t < N_TURNS; t++) eos += conv[c][t].eng.reason == DS_FINISH_STOP;
        printf("  k=2 %s: %llu of %llu prompt tokens taken over (all continued: %llu), %llu "
               "entries stored, %d turns ended by EOS or a stop id; %llu device acceptances, %llu chained, "
               "%llu of %llu drafts accepted\n",
               modes[mode], (unsigned long long)st.prefix_hits,
               (unsigned long long)st.prefix_queries, (unsigned long long)expected_hits(conv),
               (unsigned long long)st.prefix_stored, eos,
               (unsigned long long)st.spec_device_accepts,
               (unsigned long long)st.spec_chained_steps,
               (unsigned long long)st.spec.n_accepted_tokens,
               (unsigned long long)st.spec.n_draft_tokens);
        assert_true(eos >= N_CONV);
        if (mode < 2) {
            assert_int_equal(st.prefix_hits, expected_hits(conv));
            assert_int_equal(st.prefix_stored, N_CONV * N_TURNS);
        } else {
            /* the other turns still resume; the case the refusal is for (keeping such a finish,
             * this run's tokens differed) came up 3 or 4 times a run so far, but which steps
             * chain depends on when the engine thread took the turn's submissions, so its
             * absence is reported, not failed */
            assert_true(st.spec_chained_steps > 0 && st.prefix_hits > 0);
            if (st.prefix_stored == N_CONV * N_TURNS)
                printf("  NOTE: no finish came before the device's count in a chained step this "
                       "run: the refusal was not exercised\n");
        }
        if (mode > 0) assert_true(st.spec_device_accepts > 0);
    }
    free(conv);
    test_model_close(&f);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_entry_table),
        cmocka_unit_test(test_sched_take_over),
        cmocka_unit_test(test_sched_eviction),
        cmocka_unit_test(test_engine_conversations),
        cmocka_unit_test(test_spec_conversations),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
