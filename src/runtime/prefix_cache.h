/* prefix_cache.h — finished sequences kept for their continuations: the prefix caching a
 * multi-turn chat or an agent's tool loop needs (the next request's prompt is the previous
 * request's prompt + output + something new).
 *
 * Why continuations only: a Gated DeltaNet layer's cache is one recurrent state, the summary of
 * every token so far, not a record per position like attention's KV. A request can resume only
 * at a position whose state exists, and the states that exist are those of sequences where
 * they stopped (copying a state elsewhere would cost ~60 MB per position at the 35B-A3B shape).
 * So when a request finishes normally its GDN state slot and KV blocks are not freed but kept
 * here as an entry: the caches of its tokens [0, L) (L = n_computed), and the L + 1 tokens
 * themselves (token L was sampled last and never fed). A later sequence whose tokens begin with
 * those L + 1 takes the entry over — same slot, same blocks, n_computed = L, no copy, no reset —
 * and feeds from token L on. Token L must match as well because speculative decoding's MTP KV
 * at position L − 1 was computed from it.
 *
 * A take-over consumes the entry (the state moves on with its new owner). Entries hold slots
 * and blocks the pools would otherwise have free; the scheduler evicts the least recently
 * stored one whenever admission or growth needs a slot or blocks, before it preempts anyone,
 * so the cache never costs capacity. Pure bookkeeping: no tensors, no backend calls. */
#ifndef DS_PREFIX_CACHE_H
#define DS_PREFIX_CACHE_H

#include <stdbool.h>
#include <stdint.h>

typedef struct ds_prefix_entry {
    int slot;        /* the state slot / KV table row it holds */
    int n_cached;    /* L: positions in its caches */
    int32_t *tokens; /* [L + 1] its tokens, the last one not fed */
    uint64_t stamp;  /* store order (least recently stored is evicted first) */
} ds_prefix_entry;

typedef struct ds_prefix_cache {
    int cap;            /* entries at most (the size of the slot pool) */
    int n;              /* entries [0, n) are valid */
    ds_prefix_entry *e; /* [cap] */
    uint64_t clock;     /* stores so far */
} ds_prefix_cache;

void ds_prefix_cache_init(ds_prefix_cache *c, int cap);
void ds_prefix_cache_free(ds_prefix_cache *c);

/* Keeps slot's caches of tokens[0, n_cached) with tokens[n_cached] (n_cached ≥ 1). False,
 * storing nothing, when it is full or out of memory: the caller frees the caches. */
bool ds_prefix_cache_store(ds_prefix_cache *c, int slot, const int32_t *tokens, int n_cached);

/* The slot of the longest entry whose L + 1 tokens begin tokens[0, n_tokens) (so L < n_tokens:
 * at least one token is left to feed), its L in *n_cached; -1 when none matches. */
int ds_prefix_cache_match(const ds_prefix_cache *c, const int32_t *tokens, int n_tokens,
                          int *n_cached);

/* The slot of the least recently stored entry other than the one holding `except` (-1: none
 * excepted); -1 when there is none. */
int ds_prefix_cache_oldest(const ds_prefix_cache *c, int except);

/* Removes the entry holding `slot` (it must exist); the slot and its blocks are the caller's. */
void ds_prefix_cache_take(ds_prefix_cache *c, int slot);

#endif
