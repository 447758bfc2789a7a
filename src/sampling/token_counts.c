#include "sampling/token_counts.h"

#include <stdlib.h>

static inline uint32_t hash_token(int32_t t) {
    /* Fibonacci hashing: token ids are dense small integers, spread them over the table. */
    return (uint32_t)(((uint64_t)(uint32_t)t * 0x9e3779b97f4a7c15ull) >> 32);
}

void ds_token_counts_init(ds_token_counts *c) {
    c->slots = NULL;
    c->cap = 0;
    c->n_used = 0;
}

void ds_token_counts_free(ds_token_counts *c) {
    free(c->slots);
    ds_token_counts_init(c);
}

static ds_token_count *probe(ds_token_count *slots, uint32_t cap, int32_t token) {
    uint32_t mask = cap - 1;
    for (uint32_t i = hash_token(token) & mask;; i = (i + 1) & mask)
        if (slots[i].token == token || slots[i].token < 0) return &slots[i];
}

static ds_status grow(ds_token_counts *c) {
    uint32_t cap = c->cap ? c->cap * 2 : 256;
    if (cap < c->cap) return DS_ERR_NOMEM;
    ds_token_count *slots = malloc((size_t)cap * sizeof *slots);
    if (!slots) return DS_ERR_NOMEM;
    for (uint32_t i = 0; i < cap; i++) slots[i] = (ds_token_count){.token = -1};
    for (uint32_t i = 0; i < c->cap; i++)
        if (c->slots[i].token >= 0) *probe(slots, cap, c->slots[i].token) = c->slots[i];
    free(c->slots);
    c->slots = slots;
    c->cap = cap;
    return DS_OK;
}

ds_status ds_token_counts_add(ds_token_counts *c, int32_t token, bool is_prompt) {
    DS_ASSERT(token >= 0);
    if (2 * (c->n_used + 1) > c->cap) {
        ds_status st = grow(c);
        if (st != DS_OK) return st;
    }
    ds_token_count *e = probe(c->slots, c->cap, token);
    if (e->token < 0) {
        *e = (ds_token_count){.token = token};
        c->n_used++;
    }
    if (is_prompt)
        e->in_prompt = true;
    else
        e->n_output++;
    return DS_OK;
}

const ds_token_count *ds_token_counts_find(const ds_token_counts *c, int32_t token) {
    if (c->cap == 0) return NULL;
    const ds_token_count *e = probe(c->slots, c->cap, token);
    return e->token == token ? e : NULL;
}
