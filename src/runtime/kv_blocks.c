#include "runtime/kv_blocks.h"

#include <stdlib.h>

#include "core/status.h"

void ds_kv_blocks_init(ds_kv_blocks *kv, int n_blocks, int block_size, int n_seqs,
                       int max_blocks_per_seq) {
    DS_ASSERT(n_blocks >= 0 && block_size > 0 && n_seqs > 0 && max_blocks_per_seq > 0);
    *kv = (ds_kv_blocks){.n_blocks = n_blocks, .block_size = block_size, .n_seqs = n_seqs,
                         .max_blocks_per_seq = max_blocks_per_seq};
    kv->free_stack = ds_xcalloc((size_t)(n_blocks > 0 ? n_blocks : 1), sizeof(int32_t));
    /* Block 0 on top, so a fresh pool hands out 0, 1, 2, ... (readable in tests and dumps). */
    for (int i = 0; i < n_blocks; i++) kv->free_stack[i] = n_blocks - 1 - i;
    kv->n_free = n_blocks;
    kv->tables = ds_xcalloc((size_t)n_seqs * (size_t)max_blocks_per_seq, sizeof(int32_t));
    for (size_t i = 0; i < (size_t)n_seqs * (size_t)max_blocks_per_seq; i++) kv->tables[i] = -1;
    kv->n_held = ds_xcalloc((size_t)n_seqs, sizeof(int));
}

void ds_kv_blocks_free(ds_kv_blocks *kv) {
    free(kv->free_stack);
    free(kv->tables);
    free(kv->n_held);
    *kv = (ds_kv_blocks){0};
}

int ds_kv_blocks_for_tokens(const ds_kv_blocks *kv, int64_t n_tokens) {
    DS_ASSERT(n_tokens >= 0);
    int64_t n = (n_tokens + kv->block_size - 1) / kv->block_size;
    return n > INT32_MAX ? INT32_MAX : (int)n;
}

int ds_kv_blocks_missing(const ds_kv_blocks *kv, int seq, int64_t n_tokens) {
    DS_ASSERT(seq >= 0 && seq < kv->n_seqs);
    int need = ds_kv_blocks_for_tokens(kv, n_tokens) - kv->n_held[seq];
    return need > 0 ? need : 0;
}

bool ds_kv_blocks_can_append(const ds_kv_blocks *kv, int seq, int64_t n_tokens) {
    int missing = ds_kv_blocks_missing(kv, seq, n_tokens);
    return missing <= kv->n_free && kv->n_held[seq] + missing <= kv->max_blocks_per_seq;
}

bool ds_kv_blocks_append(ds_kv_blocks *kv, int seq, int64_t n_tokens) {
    if (!ds_kv_blocks_can_append(kv, seq, n_tokens)) return false;
    int missing = ds_kv_blocks_missing(kv, seq, n_tokens);
    int32_t *row = kv->tables + (size_t)seq * (size_t)kv->max_blocks_per_seq;
    for (int i = 0; i < missing; i++) row[kv->n_held[seq]++] = kv->free_stack[--kv->n_free];
    return true;
}

void ds_kv_blocks_truncate(ds_kv_blocks *kv, int seq, int64_t n_tokens) {
    DS_ASSERT(seq >= 0 && seq < kv->n_seqs);
    const int keep = ds_kv_blocks_for_tokens(kv, n_tokens);
    int32_t *row = kv->tables + (size_t)seq * (size_t)kv->max_blocks_per_seq;
    /* Pushed back from the end so the lowest kept-over block is on top again. */
    for (int i = kv->n_held[seq] - 1; i >= keep; i--) {
        DS_ASSERT(kv->n_free < kv->n_blocks && row[i] >= 0 && row[i] < kv->n_blocks);
        kv->free_stack[kv->n_free++] = row[i];
        row[i] = -1;
    }
    if (kv->n_held[seq] > keep) kv->n_held[seq] = keep;
}

void ds_kv_blocks_release(ds_kv_blocks *kv, int seq) {
    /* Pushed back in reverse so the sequence's first block is on top again. */
    ds_kv_blocks_truncate(kv, seq, 0);
}

const int32_t *ds_kv_blocks_table(const ds_kv_blocks *kv, int seq) {
    DS_ASSERT(seq >= 0 && seq < kv->n_seqs);
    return kv->tables + (size_t)seq * (size_t)kv->max_blocks_per_seq;
}

int ds_kv_blocks_held(const ds_kv_blocks *kv, int seq) {
    DS_ASSERT(seq >= 0 && seq < kv->n_seqs);
    return kv->n_held[seq];
}
