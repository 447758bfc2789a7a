/* test_spec_sched.c — the scheduler's speculative-decoding bookkeeping, without a model:
 *  - a decode carries the drafts its sequence holds, but only from the budget left once every
 *    running decode has its one token;
 *  - a chunk that reaches the last known token reserves KV blocks for k − 1 draft positions past
 *    it (capped at the sequence's max_tokens); a mid-prompt chunk does not;
 *  - advancing after a verification moves n_computed / n_tokens by the emitted count and clears
 *    the drafts; preemption clears them too;
 *  - a randomised simulation (random acceptance, preemptions) keeps the plan invariants and
 *    finishes every request with exactly max_new tokens, never holding more blocks than the
 *    lookahead rule allows. */
#include "testlib.h"

#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/scheduler.h"

typedef struct sim {
    ds_kv_blocks kv;
    ds_state_slots slots;
    ds_scheduler s;
} sim;

static void sim_init(sim *m, int max_seqs, int budget, int n_blocks, int bs, int max_blocks,
                     int k) {
    ds_kv_blocks_init(&m->kv, n_blocks, bs, max_seqs, max_blocks);
    ds_state_slots_init(&m->slots, max_seqs);
    ds_scheduler_init(&m->s, max_seqs, budget, &m->kv, &m->slots);
    ds_scheduler_set_spec(&m->s, k);
}

static void sim_free(sim *m) {
    ds_scheduler_free(&m->s);
    ds_kv_blocks_free(&m->kv);
    ds_state_slots_free(&m->slots);
}

typedef struct req {
    ds_sched_seq seq;
    int max_new, n_gen;
    bool done;
} req;

static void req_init(req *r, int n_prompt, int max_new) {
    memset(r, 0, sizeof *r);
    ds_sched_seq_init(&r->seq, NULL, n_prompt, max_new, r);
    r->seq.spec = true;
    r->max_new = max_new;
}

static const ds_sched_item *item_of(const ds_sched_plan *p, const req *r) {
    for (int i = 0; i < p->n_items; i++)
        if (p->items[i].seq == &r->seq) return &p->items[i];
    return NULL;
}

static void test_budget_and_lookahead(void **state) {
    (void)state;
    const int k = 3, bs = 4;
    sim m;
    sim_init(&m, 4, 8, 64, bs, 32, k);
    req a, b, c;
    req_init(&a, 5, 40);
    req_init(&b, 6, 40);
    req_init(&c, 30, 40);
    ds_scheduler_add(&m.s, &a.seq);
    ds_scheduler_add(&m.s, &b.seq);
    /* step 1: a's prompt (5) fits, b's is chunked (3 of 6) */
    const ds_sched_plan *p = ds_scheduler_schedule(&m.s);
    assert_int_equal(p->n_items, 2);
    const ds_sched_item *ia = item_of(p, &a), *ib = item_of(p, &b);
    assert_true(ia->wants_logits && !ib->wants_logits);
    /* a reaches its last known token: blocks for 5 + k - 1 = 7 positions; b only its 3 */
    assert_int_equal(ds_kv_blocks_held(&m.kv, a.seq.slot), (5 + k - 1 + bs - 1) / bs);
    assert_int_equal(ds_kv_blocks_held(&m.kv, b.seq.slot), 1);
    ds_sched_seq_advance_spec(&a.seq, 5, 1);
    ds_sched_seq_set_drafts(&a.seq, k);
    ds_sched_seq_advance(&b.seq, 3, false);
    /* step 2: a decodes with its 3 drafts (budget 8: 1 + 3, b's 3 remaining tokens) */
    p = ds_scheduler_schedule(&m.s);
    ia = item_of(p, &a);
    ib = item_of(p, &b);
    assert_int_equal(ia->n_tokens, 1);
    assert_int_equal(ia->n_draft, k);
    assert_int_equal(ib->n_tokens, 3);
    assert_int_equal(p->n_tokens, 1 + k + 3);
    /* verify positions 5..8 and drafting up to (5 + 4) + k - 2 → 5 + 4 + k - 1 = 11 positions */
    assert_int_equal(ds_kv_blocks_held(&m.kv, a.seq.slot), (5 + 1 + k + k - 1 + bs - 1) / bs);
    /* a accepted 2 drafts: 3 tokens emitted, 3 fed tokens computed */
    ds_sched_seq_advance_spec(&a.seq, 1, 3);
    assert_int_equal(a.seq.n_computed, 8);
    assert_int_equal(a.seq.n_tokens, 9);
    assert_int_equal(a.seq.n_draft, 0);
    ds_sched_seq_advance_spec(&b.seq, 3, 1);
    ds_sched_seq_set_drafts(&a.seq, k);
    ds_sched_seq_set_drafts(&b.seq, k);
    /* step 3: c arrives (admitted after the decodes); two decodes share the spare budget:
     * 8 - 2 = 6 draft tokens, first come first served */
    ds_scheduler_add(&m.s, &c.seq);
    p = ds_scheduler_schedule(&m.s);
    ia = item_of(p, &a);
    ib = item_of(p, &b);
    assert_int_equal(ia->n_draft, 3);
    assert_int_equal(ib->n_draft, 3);
    assert_null(item_of(p, &c)); /* the budget is spent */
    assert_int_equal(p->n_tokens, 8);
    sim_free(&m);

    /* a budget with room for only the decodes' own tokens: no drafts at all */
    sim_init(&m, 4, 2, 64, bs, 32, k);
    req_init(&a, 1, 10);
    req_init(&b, 1, 10);
    ds_scheduler_add(&m.s, &a.seq);
    ds_scheduler_add(&m.s, &b.seq);
    p = ds_scheduler_schedule(&m.s);
    ds_sched_seq_advance_spec(&a.seq, 1, 1);
    ds_sched_seq_advance_spec(&b.seq, 1, 1);
    ds_sched_seq_set_drafts(&a.seq, k);
    ds_sched_seq_set_drafts(&b.seq, k);
    p = ds_scheduler_schedule(&m.s);
    assert_int_equal(p->n_items, 2);
    assert_int_equal(item_of(p, &a)->n_draft, 0);
    assert_int_equal(item_of(p, &b)->n_draft, 0);
    sim_free(&m);

    /* the lookahead is capped at what the sequence can ever hold */
    sim_init(&m, 1, 64, 64, 1, 64, k);
    req_init(&a, 10, 2); /* max_tokens = 11 positions */
    ds_scheduler_add(&m.s, &a.seq);
    ds_scheduler_schedule(&m.s);
    assert_int_equal(ds_kv_blocks_held(&m.kv, a.seq.slot), 11);
    sim_free(&m);
}

/* Random acceptance, tight KV pool: invariants every step, every request finishes. */
static void test_simulation(void **state) {
    (void)state;
    for (int k = 1; k <= 4; k++) {
        const int n_req = 24, bs = 4;
        sim m;
        sim_init(&m, 6, 24, 48, bs, 64, k);
        req *rs = calloc(n_req, sizeof *rs);
        test_rng g = {0x5eed0000ull + (uint64_t)k};
        for (int i = 0; i < n_req; i++) {
            int np = 1 + (int)((test_rng_uniform(&g) + 1.0f) * 20.0f);
            int mn = 1 + (int)((test_rng_uniform(&g) + 1.0f) * 30.0f);
            req_init(&rs[i], np, mn);
            rs[i].seq.spec = i % 5 != 0; /* some requests never speculate */
            ds_scheduler_add(&m.s, &rs[i].seq);
        }
        int done = 0, steps = 0;
        while (done < n_req) {
            assert_true(++steps < 100000);
            const ds_sched_plan *p = ds_scheduler_schedule(&m.s);
            assert_true(p->n_items > 0);
            int tokens = 0;
            for (int i = 0; i < p->n_items; i++) {
                const ds_sched_item *it = &p->items[i];
                req *r = it->seq->owner;
                tokens += it->n_tokens + it->n_draft;
                assert_true(it->n_draft <= it->seq->n_draft && it->n_draft <= k);
                assert_true(it->n_draft == 0 || (it->n_tokens == 1 && it->seq->spec));
                /* KV held covers the fed positions, and the lookahead when it samples */
                int64_t need = (int64_t)it->seq->n_computed + it->n_tokens + it->n_draft;
                assert_true((int64_t)ds_kv_blocks_held(&m.kv, it->seq->slot) * bs >= need);
                (void)r;
            }
            assert_int_equal(tokens, p->n_tokens);
            assert_true(tokens <= 24);
            for (int i = 0; i < p->n_items; i++) {
                const ds_sched_item *it = &p->items[i];
                req *r = it->seq->owner;
                if (!it->wants_logits) {
                    ds_sched_seq_advance(&r->seq, it->n_tokens, false);
                    continue;
                }
                int left = r->max_new - r->n_gen;
                int emit = 1 + (int)((test_rng_uniform(&g) + 1.0f) * 0.5f * (it->n_draft + 1));
                if (emit > it->n_draft + 1) emit = it->n_draft + 1;
                if (emit > left) emit = left;
                ds_sched_seq_advance_spec(&r->seq, it->n_tokens, emit);
                r->n_gen += emit;
                if (r->n_gen == r->max_new) {
                    ds_scheduler_remove(&m.s, &r->seq);
                    r->done = true;
                    done++;
                } else if (r->seq.spec) {
                    int kn = r->seq.max_tokens - r->seq.n_tokens;
                    if (kn > k) kn = k;
                    /* the drafting positions must already be held */
                    int64_t last = (int64_t)r->seq.n_computed + kn - 2;
                    assert_true(kn <= 0 || (int64_t)ds_kv_blocks_held(&m.kv, r->seq.slot) * bs > last);
                    if (kn > 0) ds_sched_seq_set_drafts(&r->seq, kn);
                }
            }
        }
        for (int i = 0; i < n_req; i++) assert_true(rs[i].done && rs[i].n_gen == rs[i].max_new);
        assert_int_equal(ds_kv_blocks_n_used(&m.kv), 0);
        print_message("k=%d: %d steps, %llu preemptions\n", k, steps,
                      (unsigned long long)m.s.n_preemptions);
        free(rs);
        sim_free(&m);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_budget_and_lookahead),
        cmocka_unit_test(test_simulation),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
