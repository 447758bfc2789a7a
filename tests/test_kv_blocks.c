/* test_kv_blocks.c — KV block bookkeeping and the state slot pool against a brute-force model:
 * after every operation each block is owned by at most one sequence or free, the free count
 * matches, and each sequence holds exactly ceil(tokens / block_size) blocks. */
#include "testlib.h"

#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/kv_blocks.h"
#include "runtime/state_slots.h"

static void test_basic(void **state) {
    (void)state;
    ds_kv_blocks kv;
    ds_kv_blocks_init(&kv, 10, 4, 3, 5);
    assert_int_equal(ds_kv_blocks_n_free(&kv), 10);
    assert_int_equal(ds_kv_blocks_for_tokens(&kv, 0), 0);
    assert_int_equal(ds_kv_blocks_for_tokens(&kv, 1), 1);
    assert_int_equal(ds_kv_blocks_for_tokens(&kv, 4), 1);
    assert_int_equal(ds_kv_blocks_for_tokens(&kv, 5), 2);

    /* Growing within a block takes nothing; crossing a boundary takes one block. */
    assert_true(ds_kv_blocks_append(&kv, 0, 3));
    assert_int_equal(ds_kv_blocks_held(&kv, 0), 1);
    assert_true(ds_kv_blocks_append(&kv, 0, 4));
    assert_int_equal(ds_kv_blocks_held(&kv, 0), 1);
    assert_int_equal(ds_kv_blocks_missing(&kv, 0, 5), 1);
    assert_true(ds_kv_blocks_append(&kv, 0, 5));
    assert_int_equal(ds_kv_blocks_held(&kv, 0), 2);
    assert_int_equal(ds_kv_blocks_n_used(&kv), 2);
    /* Shrinking requests are no-ops. */
    assert_true(ds_kv_blocks_append(&kv, 0, 1));
    assert_int_equal(ds_kv_blocks_held(&kv, 0), 2);
    /* A fresh pool hands out 0, 1, ... */
    assert_int_equal(ds_kv_blocks_table(&kv, 0)[0], 0);
    assert_int_equal(ds_kv_blocks_table(&kv, 0)[1], 1);

    /* The table row limit (5 blocks = 20 tokens) holds even with free blocks left. */
    assert_false(ds_kv_blocks_can_append(&kv, 1, 21));
    assert_false(ds_kv_blocks_append(&kv, 1, 21));
    assert_int_equal(ds_kv_blocks_held(&kv, 1), 0);
    assert_true(ds_kv_blocks_append(&kv, 1, 20));
    assert_int_equal(ds_kv_blocks_n_free(&kv), 3);

    /* Pool exhaustion: 3 free blocks, 4 wanted → refused, nothing changes. */
    assert_false(ds_kv_blocks_can_append(&kv, 2, 16));
    assert_false(ds_kv_blocks_append(&kv, 2, 16));
    assert_int_equal(ds_kv_blocks_n_free(&kv), 3);
    assert_true(ds_kv_blocks_append(&kv, 2, 12));
    assert_int_equal(ds_kv_blocks_n_free(&kv), 0);
    assert_false(ds_kv_blocks_can_append(&kv, 0, 9));

    ds_kv_blocks_release(&kv, 1);
    assert_int_equal(ds_kv_blocks_n_free(&kv), 5);
    assert_int_equal(ds_kv_blocks_held(&kv, 1), 0);
    assert_true(ds_kv_blocks_append(&kv, 0, 9));
    ds_kv_blocks_release(&kv, 0);
    ds_kv_blocks_release(&kv, 2);
    ds_kv_blocks_release(&kv, 2); /* releasing an empty sequence is a no-op */
    assert_int_equal(ds_kv_blocks_n_free(&kv), 10);
    ds_kv_blocks_free(&kv);
}

/* Random appends and releases against an independent owner map. */
static void test_random_invariants(void **state) {
    (void)state;
    enum { NB = 37, BS = 3, NS = 6, MAXB = 12 };
    ds_kv_blocks kv;
    ds_kv_blocks_init(&kv, NB, BS, NS, MAXB);
    int tokens[NS] = {0};
    test_rng rng = {0x9e3779b97f4a7c15ull};
    for (int it = 0; it < 20000; it++) {
        int seq = (int)((test_rng_uniform(&rng) + 1.0f) * 0.5f * NS) % NS;
        float u = test_rng_uniform(&rng);
        if (u < -0.8f) {
            ds_kv_blocks_release(&kv, seq);
            tokens[seq] = 0;
        } else {
            int want = tokens[seq] + (int)((u + 1.0f) * 4.0f); /* grow by 0..7 tokens */
            int need = (want + BS - 1) / BS - (tokens[seq] + BS - 1) / BS;
            int used = 0;
            for (int s = 0; s < NS; s++) used += (tokens[s] + BS - 1) / BS;
            bool expect = need <= NB - used && (want + BS - 1) / BS <= MAXB;
            assert_int_equal(ds_kv_blocks_can_append(&kv, seq, want), expect);
            assert_int_equal(ds_kv_blocks_append(&kv, seq, want), expect);
            if (expect) tokens[seq] = want;
        }
        /* Brute-force check of the whole state. */
        int owner[NB];
        for (int b = 0; b < NB; b++) owner[b] = -1;
        int used = 0;
        for (int s = 0; s < NS; s++) {
            int held = ds_kv_blocks_held(&kv, s);
            assert_int_equal(held, (tokens[s] + BS - 1) / BS);
            for (int i = 0; i < held; i++) {
                int b = ds_kv_blocks_table(&kv, s)[i];
                assert_true(b >= 0 && b < NB);
                assert_int_equal(owner[b], -1); /* never shared */
                owner[b] = s;
            }
            used += held;
        }
        assert_int_equal(ds_kv_blocks_n_used(&kv), used);
        for (int i = 0; i < kv.n_free; i++) {
            int b = kv.free_stack[i];
            assert_true(b >= 0 && b < NB);
            assert_int_equal(owner[b], -1); /* free blocks are not owned */
            owner[b] = NS;                  /* and listed once */
        }
    }
    for (int s = 0; s < NS; s++) ds_kv_blocks_release(&kv, s);
    assert_int_equal(ds_kv_blocks_n_free(&kv), NB);
    ds_kv_blocks_free(&kv);
}

static void test_state_slots(void **state) {
    (void)state;
    ds_state_slots s;
    ds_state_slots_init(&s, 3);
    assert_int_equal(ds_state_slots_alloc(&s), 0);
    assert_int_equal(ds_state_slots_alloc(&s), 1);
    assert_int_equal(ds_state_slots_alloc(&s), 2);
    assert_int_equal(ds_state_slots_alloc(&s), -1);
    assert_int_equal(ds_state_slots_n_used(&s), 3);
    ds_state_slots_release(&s, 1);
    assert_int_equal(ds_state_slots_n_free(&s), 1);
    assert_int_equal(ds_state_slots_alloc(&s), 1);
    ds_state_slots_release(&s, 0);
    ds_state_slots_release(&s, 2);
    ds_state_slots_release(&s, 1);
    assert_int_equal(ds_state_slots_n_used(&s), 0);
    ds_state_slots_free(&s);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_basic),
        cmocka_unit_test(test_random_invariants),
        cmocka_unit_test(test_state_slots),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
