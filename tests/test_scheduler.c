/* test_scheduler.c — scheduling policy without a model: hand-worked plans (decodes first, FCFS
 * chunked prefill, admission limits, preemption of the newest, re-queue at the front), and a
 * randomised simulation that checks the plan invariants every step and that every request
 * completes with exactly its prompt + outputs fed, in order, however often it was preempted —
 * also with prefix caching, where finished requests leave entries and later ones continue them
 * (test_prefix_cache.c has the hand-worked prefix-cache cases). */
#include "testlib.h"

#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "core/status.h"
#include "runtime/scheduler.h"

typedef struct sim {
    ds_kv_blocks kv;
    ds_state_slots slots;
    ds_scheduler s;
} sim;

static void sim_init(sim *m, int max_seqs, int budget, int n_blocks, int block_size,
                     int max_blocks_per_seq) {
    ds_kv_blocks_init(&m->kv, n_blocks, block_size, max_seqs, max_blocks_per_seq);
    ds_state_slots_init(&m->slots, max_seqs);
    ds_scheduler_init(&m->s, max_seqs, budget, &m->kv, &m->slots);
}

static void sim_free(sim *m) {
    ds_scheduler_free(&m->s);
    ds_kv_blocks_free(&m->kv);
    ds_state_slots_free(&m->slots);
}

enum { FAKE_MAX_TOKENS = 256 };

typedef struct fake_req {
    ds_sched_seq seq;
    int max_new, n_gen;
    bool done;
    int32_t toks[FAKE_MAX_TOKENS]; /* prompt, then the "sampled" tokens */
} fake_req;

/* A request whose prompt is toks[0, n_prompt) (NULL: no tokens, for the tests without prefix
 * caching). */
static void req_init_toks(fake_req *r, const int32_t *toks, int n_prompt, int max_new) {
    memset(r, 0, sizeof *r);
    DS_ASSERT(n_prompt + max_new <= FAKE_MAX_TOKENS);
    if (toks) memcpy(r->toks, toks, (size_t)n_prompt * sizeof *toks);
    ds_sched_seq_init(&r->seq, r->toks, n_prompt, max_new, r);
    r->max_new = max_new;
}

static void req_init(fake_req *r, int n_prompt, int max_new) {
    req_init_toks(r, NULL, n_prompt, max_new);
}

/* What the engine does after the forward: advance, "sample" (a token that is a function of the
 * tokens so far: continuations of the same tokens sample the same), finish at max_new (retired:
 * with prefix caching the caches stay as an entry). */
static void apply_plan(sim *m, const ds_sched_plan *p) {
    for (int i = 0; i < p->n_items; i++) {
        fake_req *r = p->items[i].seq->owner;
        ds_sched_seq_advance(&r->seq, p->items[i].n_tokens, p->items[i].wants_logits);
        if (!p->items[i].wants_logits) continue;
        const int n = r->seq.n_tokens - 1; /* the new token's index */
        r->toks[n] = (int32_t)((uint32_t)r->toks[n - 1] * 2654435761u % 1000u);
        if (++r->n_gen == r->max_new) {
            ds_scheduler_retire(&m->s, &r->seq);
            r->done = true;
        }
    }
}

static const ds_sched_item *find_item(const ds_sched_plan *p, const fake_req *r) {
    for (int i = 0; i < p->n_items; i++)
        if (p->items[i].seq == &r->seq) return &p->items[i];
    return NULL;
}

/* ---- hand-worked plans ---------------------------------------------------------------------- */

static void test_decodes_first_then_fcfs_prefill(void **state) {
    (void)state;
    sim m;
    sim_init(&m, 4, 10, 100, 4, 25);
    fake_req a, b, c;
    req_init(&a, 3, 5);
    req_init(&b, 20, 5);
    req_init(&c, 2, 5);
    ds_scheduler_add(&m.s, &a.seq);
    ds_scheduler_add(&m.s, &b.seq);
    ds_scheduler_add(&m.s, &c.seq);

    /* Step 1: A whole (3, logits), B chunk 7 (no logits), C does not fit the budget. */
    const ds_sched_plan *p = ds_scheduler_schedule(&m.s);
    assert_int_equal(p->n_items, 2);
    assert_ptr_equal(p->items[0].seq, &a.seq);
    assert_int_equal(p->items[0].n_tokens, 3);
    assert_true(p->items[0].wants_logits && p->items[0].fresh_slot);
    assert_ptr_equal(p->items[1].seq, &b.seq);
    assert_int_equal(p->items[1].n_tokens, 7);
    assert_false(p->items[1].wants_logits);
    assert_int_equal(p->n_tokens, 10);
    assert_int_equal(p->n_out, 1);
    assert_int_equal(ds_scheduler_n_waiting(&m.s), 1);
    apply_plan(&m, p);

    /* Step 2: A decodes first (1), then B's next chunk (9 of 13 left); C still waits. */
    p = ds_scheduler_schedule(&m.s);
    assert_int_equal(p->n_items, 2);
    assert_ptr_equal(p->items[0].seq, &a.seq);
    assert_int_equal(p->items[0].n_tokens, 1);
    assert_true(p->items[0].wants_logits);
    assert_false(p->items[0].fresh_slot);
    assert_ptr_equal(p->items[1].seq, &b.seq);
    assert_int_equal(p->items[1].n_tokens, 9);
    assert_false(p->items[1].wants_logits);
    apply_plan(&m, p);

    /* Step 3: A decode, B's last 4 (logits), C admitted whole (2). */
    p = ds_scheduler_schedule(&m.s);
    assert_int_equal(p->n_items, 3);
    assert_int_equal(find_item(p, &a)->n_tokens, 1);
    assert_int_equal(find_item(p, &b)->n_tokens, 4);
    assert_true(find_item(p, &b)->wants_logits);
    assert_ptr_equal(p->items[2].seq, &c.seq);
    assert_int_equal(p->items[2].n_tokens, 2);
    assert_true(p->items[2].fresh_slot);
    assert_int_equal(p->n_out, 3);
    apply_plan(&m, p);

    /* Step 4: all three decode, in admission order. */
    p = ds_scheduler_schedule(&m.s);
    assert_int_equal(p->n_items, 3);
    assert_ptr_equal(p->items[0].seq, &a.seq);
    assert_ptr_equal(p->items[1].seq, &b.seq);
    assert_ptr_equal(p->items[2].seq, &c.seq);
    for (int i = 0; i < 3; i++) assert_int_equal(p->items[i].n_tokens, 1);
    /* KV blocks cover every position fed. */
    for (int i = 0; i < 3; i++) {
        const ds_sched_seq *q = p->items[i].seq;
        assert_true(ds_kv_blocks_held(&m.kv, q->slot) * 4 >= q->n_computed + 1);
    }
    ds_scheduler_remove(&m.s, &a.seq);
    ds_scheduler_remove(&m.s, &b.seq);
    ds_scheduler_remove(&m.s, &c.seq);
    assert_int_equal(ds_kv_blocks_n_used(&m.kv), 0);
    assert_int_equal(ds_state_slots_n_used(&m.slots), 0);
    sim_free(&m);
}

static void test_admission_limits(void **state) {
    (void)state;
    sim m;
    sim_init(&m, 2, 64, 100, 4, 25);
    fake_req r[3];
    for (int i = 0; i < 3; i++) {
        req_init(&r[i], 4, 10);
        ds_scheduler_add(&m.s, &r[i].seq);
    }
    /* Only two state slots. */
    const ds_sched_plan *p = ds_scheduler_schedule(&m.s);
    assert_int_equal(p->n_items, 2);
    assert_int_equal(ds_scheduler_n_running(&m.s), 2);
    assert_int_equal(ds_scheduler_n_waiting(&m.s), 1);
    apply_plan(&m, p);
    /* A cancelled request frees its slot; the waiting one takes it the next step. */
    int freed_slot = r[0].seq.slot;
    ds_scheduler_remove(&m.s, &r[0].seq);
    assert_int_equal(r[0].seq.slot, -1);
    p = ds_scheduler_schedule(&m.s);
    const ds_sched_item *it = find_item(p, &r[2]);
    assert_non_null(it);
    assert_true(it->fresh_slot);
    assert_int_equal(r[2].seq.slot, freed_slot);
    ds_scheduler_remove(&m.s, &r[1].seq);
    ds_scheduler_remove(&m.s, &r[2].seq);

    /* KV admission: the head needs more blocks than are free → nobody behind it is admitted. */
    sim m2;
    sim_init(&m2, 4, 64, 6, 4, 6);
    fake_req big, small1, small2;
    req_init(&big, 10, 4);   /* 3 blocks, room for its next decode */
    req_init(&small1, 6, 4); /* 2 blocks, room for its next decode */
    req_init(&small2, 4, 2); /* 1 block */
    ds_scheduler_add(&m2.s, &big.seq);
    ds_scheduler_add(&m2.s, &small1.seq);
    p = ds_scheduler_schedule(&m2.s);
    assert_int_equal(p->n_items, 2);
    apply_plan(&m2, p);
    assert_int_equal(ds_kv_blocks_n_free(&m2.kv), 1);
    fake_req big2;
    req_init(&big2, 8, 2); /* 2 blocks: does not fit now */
    ds_scheduler_add(&m2.s, &big2.seq);
    ds_scheduler_add(&m2.s, &small2.seq); /* would fit, but must not overtake */
    p = ds_scheduler_schedule(&m2.s);
    assert_int_equal(p->n_preempted, 0);
    assert_int_equal(p->n_items, 2); /* the two decodes only */
    assert_null(find_item(p, &big2));
    assert_null(find_item(p, &small2));
    assert_int_equal(ds_scheduler_n_waiting(&m2.s), 2);
    ds_scheduler_remove(&m2.s, &big.seq);
    ds_scheduler_remove(&m2.s, &small1.seq);
    ds_scheduler_remove(&m2.s, &big2.seq);
    ds_scheduler_remove(&m2.s, &small2.seq);
    assert_int_equal(ds_kv_blocks_n_used(&m2.kv), 0);
    sim_free(&m2);
    sim_free(&m);
}

static void test_preempt_newest(void **state) {
    (void)state;
    sim m;
    /* 4 blocks of 4 tokens: A and B (6-token prompts) hold 2 each after step 1. */
    sim_init(&m, 3, 64, 4, 4, 4);
    fake_req a, b, c;
    req_init(&a, 6, 8);
    req_init(&b, 6, 8);
    req_init(&c, 2, 2);
    ds_scheduler_add(&m.s, &a.seq);
    ds_scheduler_add(&m.s, &b.seq);
    const ds_sched_plan *p = ds_scheduler_schedule(&m.s);
    assert_int_equal(p->n_items, 2);
    apply_plan(&m, p);
    ds_scheduler_add(&m.s, &c.seq); /* arrives later: waits behind preempted requests */
    /* Steps 2, 3: decodes at positions 6 and 7 fit the 2 blocks; C has no free block. */
    for (int step = 0; step < 2; step++) {
        p = ds_scheduler_schedule(&m.s);
        assert_int_equal(p->n_items, 2);
        assert_int_equal(p->n_preempted, 0);
        apply_plan(&m, p);
    }
    assert_int_equal(ds_kv_blocks_n_free(&m.kv), 0);
    /* Step 4: A needs a 3rd block → B (the newest) is preempted; B's plan item is gone. */
    p = ds_scheduler_schedule(&m.s);
    assert_int_equal(p->n_preempted, 1);
    assert_int_equal(m.s.n_preemptions, 1);
    assert_int_equal(p->n_items, 1);
    assert_ptr_equal(p->items[0].seq, &a.seq);
    assert_int_equal(b.seq.state, DS_SCHED_WAITING);
    assert_int_equal(b.seq.slot, -1);
    assert_int_equal(b.seq.n_computed, 0);
    assert_int_equal(b.seq.n_tokens, 6 + 3); /* prompt + 3 generated, all to recompute */
    assert_ptr_equal(m.s.waiting.head, &b.seq); /* at the front, ahead of C */
    assert_ptr_equal(m.s.waiting.tail, &c.seq);
    assert_int_equal(ds_kv_blocks_held(&m.kv, a.seq.slot), 3);
    apply_plan(&m, p);

    /* A runs alone until it finishes (8 outputs); then B recomputes 9 tokens in one chunk. */
    int guard = 0;
    while (!a.done && guard++ < 100) {
        p = ds_scheduler_schedule(&m.s);
        assert_null(find_item(p, &b));
        apply_plan(&m, p);
    }
    assert_true(a.done);
    p = ds_scheduler_schedule(&m.s);
    const ds_sched_item *it = find_item(p, &b);
    assert_non_null(it);
    assert_int_equal(it->n_tokens, 9);
    assert_true(it->wants_logits && it->fresh_slot);
    assert_int_equal(b.n_gen, 3); /* generation continues where it stopped */
    guard = 0;
    while ((!b.done || !c.done) && guard++ < 100) apply_plan(&m, ds_scheduler_schedule(&m.s));
    assert_true(b.done && c.done);
    assert_int_equal(ds_kv_blocks_n_used(&m.kv), 0);
    assert_int_equal(ds_state_slots_n_used(&m.slots), 0);
    sim_free(&m);
}

/* A planned decode is taken back out of the plan when an older running sequence that needs
 * more tokens (a recompute or multi-token step) preempts it; its budget is returned. */
static void test_preempt_planned_victim(void **state) {
    (void)state;
    sim m;
    sim_init(&m, 2, 16, 4, 4, 4);
    fake_req x, y;
    req_init(&x, 4, 8);
    req_init(&y, 4, 8);
    ds_scheduler_add(&m.s, &x.seq);
    ds_scheduler_add(&m.s, &y.seq);
    apply_plan(&m, ds_scheduler_schedule(&m.s)); /* both prefilled, one block each */
    /* X now has 6 more tokens to feed (as a speculative step would), needing 2 more blocks. */
    x.seq.n_tokens += 6;
    const ds_sched_plan *p = ds_scheduler_schedule(&m.s);
    /* Pass 1 planned Y's decode; pass 2 preempted Y (the newest) to grow X. */
    assert_int_equal(p->n_preempted, 1);
    assert_int_equal(p->n_items, 1);
    assert_ptr_equal(p->items[0].seq, &x.seq);
    assert_int_equal(p->items[0].seq->plan_index, 0);
    assert_int_equal(p->items[0].n_tokens, 7);
    assert_int_equal(p->n_tokens, 7);
    assert_int_equal(p->n_out, 1);
    assert_int_equal(y.seq.state, DS_SCHED_WAITING);
    assert_int_equal(ds_kv_blocks_n_used(&m.kv), 3);
    ds_scheduler_remove(&m.s, &x.seq);
    ds_scheduler_remove(&m.s, &y.seq);
    assert_int_equal(ds_kv_blocks_n_used(&m.kv), 0);
    sim_free(&m);
}

static void test_fits(void **state) {
    (void)state;
    sim m;
    sim_init(&m, 2, 16, 10, 4, 8);
    assert_true(ds_scheduler_fits(&m.s, 32));  /* 8 blocks: the table row */
    assert_false(ds_scheduler_fits(&m.s, 33)); /* 9 blocks > row */
    sim_free(&m);
    sim_init(&m, 2, 16, 5, 4, 8);
    assert_true(ds_scheduler_fits(&m.s, 20));
    assert_false(ds_scheduler_fits(&m.s, 21)); /* 6 blocks > pool */
    sim_free(&m);
}

/* ---- randomised simulation ------------------------------------------------------------------ */

typedef struct rnd_req {
    fake_req f;
    int n_prompt;
    int fed;          /* positions fed since the last (re)admission, must equal n_computed */
    bool ever_admitted, cancelled, counted;
    int admit_rank;   /* order of first admission */
} rnd_req;

static int rnd_int(test_rng *g, int lo, int hi) { /* [lo, hi] */
    float u = (test_rng_uniform(g) + 1.0f) * 0.5f;
    int v = lo + (int)(u * (float)(hi - lo + 1));
    return v > hi ? hi : v;
}

typedef struct rnd_totals {
    uint64_t preemptions, hits, evicted;
} rnd_totals;

/* Adds what it saw to *t. With prefix caching, half of the arrivals continue a finished
 * request's whole token sequence with new tokens (each token a function of the request's
 * number and position, the sampled ones of the token before). */
static void run_random(uint64_t seed, bool prefix, rnd_totals *t) {
    test_rng g = {seed};
    const int max_seqs = rnd_int(&g, 1, 6);
    const int budget = rnd_int(&g, max_seqs, 40);
    const int bs = rnd_int(&g, 1, 8);
    const int max_len = rnd_int(&g, 8, 80);
    const int row = (max_len + bs - 1) / bs;
    const int n_blocks = rnd_int(&g, row, row * max_seqs); /* from one request to all at once */
    sim m;
    sim_init(&m, max_seqs, budget, n_blocks, bs, row);
    ds_scheduler_set_prefix_caching(&m.s, prefix);
    enum { N = 40 };
    rnd_req *r = calloc(N, sizeof *r);
    int n_added = 0, n_admitted = 0, finished = 0;
    uint64_t steps = 0;
    while (finished < N) {
        /* Arrivals. */
        while (n_added < N && rnd_int(&g, 0, 2) == 0) {
            rnd_req *q = &r[n_added++];
            int32_t toks[FAKE_MAX_TOKENS];
            int n = 0;
            const int from = prefix && n_added > 1 && rnd_int(&g, 0, 1) ? rnd_int(&g, 0, n_added - 2) : -1;
            if (from >= 0 && r[from].f.done && !r[from].cancelled &&
                r[from].f.seq.n_tokens < max_len - 1) { /* a continuation */
                n = r[from].f.seq.n_tokens;
                memcpy(toks, r[from].f.toks, (size_t)n * sizeof *toks);
            }
            q->n_prompt = rnd_int(&g, n + 1, max_len - 1);
            for (int k = n; k < q->n_prompt; k++) toks[k] = 1000 * n_added + k;
            req_init_toks(&q->f, toks, q->n_prompt, rnd_int(&g, 1, max_len - q->n_prompt));
            ds_scheduler_add(&m.s, &q->f.seq);
        }
        /* Occasional cancellation of a random live request. */
        if (n_added > 0 && rnd_int(&g, 0, 30) == 0) {
            rnd_req *q = &r[rnd_int(&g, 0, n_added - 1)];
            if (!q->f.done) {
                ds_scheduler_remove(&m.s, &q->f.seq);
                q->f.done = q->cancelled = q->counted = true;
                finished++;
            }
        }
        const ds_sched_plan *p = ds_scheduler_schedule(&m.s);
        steps++;
        if (n_added == N && finished < N) assert_true(p->n_items > 0 || finished == N);
        /* Plan invariants. */
        assert_true(p->n_items <= max_seqs && p->n_tokens <= budget);
        int tok = 0, out = 0;
        bool seen_nondecode = false;
        for (int i = 0; i < p->n_items; i++) {
            const ds_sched_item *it = &p->items[i];
            const ds_sched_seq *q = it->seq;
            rnd_req *rq = (rnd_req *)q->owner;
            assert_int_equal(q->state, DS_SCHED_RUNNING);
            assert_true(it->n_tokens >= 1 && q->n_computed + it->n_tokens <= q->n_tokens);
            assert_int_equal(it->wants_logits, q->n_computed + it->n_tokens == q->n_tokens);
            bool decode = q->n_tokens - q->n_computed == 1 && !it->fresh_slot && !it->resumed;
            if (decode) assert_false(seen_nondecode); /* decodes come first */
            else seen_nondecode = true;
            assert_true((int64_t)ds_kv_blocks_held(&m.kv, q->slot) * bs >=
                        q->n_computed + it->n_tokens);
            for (int k = 0; k < i; k++) assert_int_not_equal(p->items[k].seq->slot, q->slot);
            if (it->resumed) { /* took over an entry of the same first n_computed + 1 tokens */
                assert_true(prefix && !it->fresh_slot && q->n_computed > 0);
                rq->fed = q->n_computed;
                if (!rq->ever_admitted) {
                    rq->ever_admitted = true;
                    rq->admit_rank = n_admitted++;
                }
            }
            if (it->fresh_slot) {
                assert_int_equal(q->n_computed, 0);
                rq->fed = 0;
                if (!rq->ever_admitted) {
                    rq->ever_admitted = true;
                    rq->admit_rank = n_admitted++;
                }
            }
            assert_int_equal(rq->fed, q->n_computed); /* positions fed in order, no gaps */
            rq->fed += it->n_tokens;
            tok += it->n_tokens;
            out += it->wants_logits;
        }
        assert_int_equal(tok, p->n_tokens);
        assert_int_equal(out, p->n_out);
        /* Pool accounting: running sequences and prefix-cache entries hold every used block
         * (an entry exactly those of its cached positions), waiting ones none. */
        int held = 0;
        for (ds_sched_seq *q = m.s.running.head; q; q = q->next)
            held += ds_kv_blocks_held(&m.kv, q->slot);
        for (ds_sched_seq *q = m.s.waiting.head; q; q = q->next) assert_int_equal(q->slot, -1);
        for (int e = 0; e < m.s.pc.n; e++)
            assert_int_equal(ds_kv_blocks_held(&m.kv, m.s.pc.e[e].slot),
                             ds_kv_blocks_for_tokens(&m.kv, m.s.pc.e[e].n_cached));
        assert_int_equal(held + ds_scheduler_prefix_blocks(&m.s), ds_kv_blocks_n_used(&m.kv));
        assert_int_equal(ds_state_slots_n_used(&m.slots), ds_scheduler_n_running(&m.s) + m.s.pc.n);

        apply_plan(&m, p);
        for (int i = 0; i < n_added; i++)
            if (r[i].f.done && !r[i].counted) {
                r[i].counted = true;
                finished++;
            }
        assert_true(steps < 100000); /* progress */
    }
    /* Everyone finished with exactly max_new outputs; first admissions in arrival order. */
    int last_rank = -1;
    for (int i = 0; i < N; i++) {
        if (r[i].cancelled) continue;
        assert_int_equal(r[i].f.n_gen, r[i].f.max_new);
        assert_int_equal(r[i].f.seq.n_tokens, r[i].n_prompt + r[i].f.max_new);
        assert_true(r[i].admit_rank > last_rank);
        last_rank = r[i].admit_rank;
    }
    assert_int_equal(ds_kv_blocks_n_used(&m.kv), ds_scheduler_prefix_blocks(&m.s));
    assert_int_equal(ds_state_slots_n_used(&m.slots), m.s.pc.n);
    assert_int_equal(ds_scheduler_n_running(&m.s) + ds_scheduler_n_waiting(&m.s), 0);
    if (!prefix) assert_int_equal(m.s.pc.n + m.s.prefix_hits, 0);
    t->preemptions += m.s.n_preemptions;
    t->hits += m.s.prefix_hits;
    t->evicted += m.s.prefix_evicted;
    ds_scheduler_set_prefix_caching(&m.s, false);
    assert_int_equal(ds_kv_blocks_n_used(&m.kv) + ds_state_slots_n_used(&m.slots), 0);
    free(r);
    sim_free(&m);
}

static void test_random_workloads(void **state) {
    (void)state;
    for (int prefix = 0; prefix <= 1; prefix++) {
        rnd_totals t = {0};
        for (uint64_t seed = 1; seed <= 300; seed++)
            run_random(seed * 0x9e3779b97f4a7c15ull, prefix, &t);
        print_message("random workloads%s: %llu preemptions, %llu tokens taken over, %llu "
                      "entries evicted\n", prefix ? " (prefix caching)" : "",
                      (unsigned long long)t.preemptions, (unsigned long long)t.hits,
                      (unsigned long long)t.evicted);
        assert_true(t.preemptions > 100); /* the small pools did exercise preemption */
        if (prefix) assert_true(t.hits > 0 && t.evicted > 0);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_decodes_first_then_fcfs_prefill),
        cmocka_unit_test(test_admission_limits),
        cmocka_unit_test(test_preempt_newest),
        cmocka_unit_test(test_preempt_planned_victim),
        cmocka_unit_test(test_fits),
        cmocka_unit_test(test_random_workloads),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
