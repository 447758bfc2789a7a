/* kv_blocks.h — paged KV-cache block bookkeeping for the attention layers (pure bookkeeping: no
 * tensors, no backend calls).
 *
 * The KV pool holds n_blocks blocks of block_size token positions each (the backend owns the
 * memory, ds_cache_desc.n_blocks). Every sequence that holds caches owns a list of physical
 * block ids in position order: position p of the sequence lives in block list[p / block_size],
 * row p % block_size. Sequences are identified by their GDN state slot (0 .. n_seqs-1), so the
 * block list of slot s is also the row the engine copies into ds_batch.block_table.
 *
 *   ds_kv_blocks_init(&kv, n_blocks, block_size, n_seqs, max_blocks_per_seq);
 *   if (ds_kv_blocks_can_append(&kv, slot, n_past + n)) ds_kv_blocks_append(&kv, slot, n_past + n);
 *   ds_kv_blocks_table(&kv, slot)  → [n_held] physical ids for the batch
 *   ds_kv_blocks_release(&kv, slot);   // finish / cancel / preemption
 *
 * Free blocks are kept on a stack (LIFO), so a freed block is reused first (warm in caches). */
#ifndef DS_KV_BLOCKS_H
#define DS_KV_BLOCKS_H

#include <stdbool.h>
#include <stdint.h>

typedef struct ds_kv_blocks {
    int n_blocks;           /* blocks in the pool */
    int block_size;         /* token positions per block */
    int n_seqs;             /* sequences (state slots) that can hold blocks */
    int max_blocks_per_seq; /* row length of the per-sequence tables */
    int32_t *free_stack;    /* [n_blocks] free block ids; the top is free_stack[n_free - 1] */
    int n_free;
    int32_t *tables;        /* [n_seqs, max_blocks_per_seq] block ids in position order */
    int *n_held;            /* [n_seqs] blocks each sequence holds (prefix of its table row) */
} ds_kv_blocks;

/* All blocks start free. Sizes are internal configuration (checked by the engine): asserts. */
void ds_kv_blocks_init(ds_kv_blocks *kv, int n_blocks, int block_size, int n_seqs,
                       int max_blocks_per_seq);
void ds_kv_blocks_free(ds_kv_blocks *kv);

/* Blocks needed to hold n_tokens positions: ceil(n_tokens / block_size). */
int ds_kv_blocks_for_tokens(const ds_kv_blocks *kv, int64_t n_tokens);

/* Blocks sequence `seq` must still obtain so that it holds n_tokens positions (0 if it already
 * does). */
int ds_kv_blocks_missing(const ds_kv_blocks *kv, int seq, int64_t n_tokens);

/* True when sequence `seq` can grow to n_tokens positions from the free pool and its table
 * row. */
bool ds_kv_blocks_can_append(const ds_kv_blocks *kv, int seq, int64_t n_tokens);

/* Grows sequence `seq` to hold n_tokens positions (a no-op if it already does). Returns false,
 * changing nothing, when the pool or the table row is too small. */
bool ds_kv_blocks_append(ds_kv_blocks *kv, int seq, int64_t n_tokens);

/* Returns the blocks of sequence `seq` past those holding n_tokens positions to the pool (a
 * no-op if it holds no more). */
void ds_kv_blocks_truncate(ds_kv_blocks *kv, int seq, int64_t n_tokens);

/* Returns every block of sequence `seq` to the pool. */
void ds_kv_blocks_release(ds_kv_blocks *kv, int seq);

/* Sequence seq's block ids in position order ([ds_kv_blocks_held(kv, seq)] valid entries). */
const int32_t *ds_kv_blocks_table(const ds_kv_blocks *kv, int seq);
int ds_kv_blocks_held(const ds_kv_blocks *kv, int seq);

static inline int ds_kv_blocks_n_free(const ds_kv_blocks *kv) { return kv->n_free; }
static inline int ds_kv_blocks_n_used(const ds_kv_blocks *kv) { return kv->n_blocks - kv->n_free; }

#endif
