/* tok_map.c — the tokenizer's containers: growable buffer, string map, merge-pair map. */
#include <stdlib.h>
#include <string.h>

#include "tokenizer/tok_internal.h"

/* ---- tok_buf ---------------------------------------------------------------------------- */

ds_status tok_buf_reserve(tok_buf *b, size_t extra, ds_error *err) {
    if (b->cap - b->len > extra) return DS_OK; /* keeps one spare byte for a NUL */
    size_t cap = b->cap ? b->cap : 64;
    while (cap - b->len <= extra) {
        if (cap > SIZE_MAX / 2)
            return ds_error_set(err, DS_ERR_NOMEM, "tokenizer: buffer too large");
        cap *= 2;
    }
    char *p = realloc(b->p, cap);
    if (!p) return ds_error_set(err, DS_ERR_NOMEM, "tokenizer: out of memory (%zu bytes)", cap);
    b->p = p;
    b->cap = cap;
    return DS_OK;
}

ds_status tok_buf_append(tok_buf *b, const void *data, size_t n, ds_error *err) {
    ds_status st = tok_buf_reserve(b, n, err);
    if (st != DS_OK) return st;
    if (n) memcpy(b->p + b->len, data, n);
    b->len += n;
    b->p[b->len] = 0;
    return DS_OK;
}

void tok_buf_free(tok_buf *b) {
    free(b->p);
    memset(b, 0, sizeof *b);
}

/* ---- tok_strmap --------------------------------------------------------------------------- */

/* FNV-1a: keys are short (tokens), and this map is off the per-byte hot path. */
uint32_t tok_hash_bytes(const void *p, size_t n) {
    const unsigned char *s = p;
    uint32_t h = 2166136261u;
    for (size_t i = 0; i < n; i++) {
        h ^= s[i];
        h *= 16777619u;
    }
    return h;
}

static uint32_t strmap_cap_for(size_t n) {
    uint32_t cap = 16;
    while (cap < n * 2 + 1) cap *= 2;
    return cap;
}

ds_status tok_strmap_init(tok_strmap *m, size_t expected, ds_error *err) {
    if (expected > TOK_MAX_IDS) expected = TOK_MAX_IDS;
    m->cap = strmap_cap_for(expected);
    m->count = 0;
    m->slots = malloc(sizeof *m->slots * m->cap);
    if (!m->slots) return ds_error_set(err, DS_ERR_NOMEM, "tokenizer: out of memory (string map)");
    for (uint32_t i = 0; i < m->cap; i++) m->slots[i].val = -1;
    return DS_OK;
}

static ds_status strmap_grow(tok_strmap *m, ds_error *err) {
    uint32_t cap = m->cap * 2;
    tok_strmap_slot *slots = malloc(sizeof *slots * cap);
    if (!slots) return ds_error_set(err, DS_ERR_NOMEM, "tokenizer: out of memory (string map)");
    for (uint32_t i = 0; i < cap; i++) slots[i].val = -1;
    for (uint32_t i = 0; i < m->cap; i++) {
        if (m->slots[i].val < 0) continue;
        uint32_t j = m->slots[i].hash & (cap - 1);
        while (slots[j].val >= 0) j = (j + 1) & (cap - 1);
        slots[j] = m->slots[i];
    }
    free(m->slots);
    m->slots = slots;
    m->cap = cap;
    return DS_OK;
}

ds_status tok_strmap_put(tok_strmap *m, const char *base, uint32_t off, uint32_t len, int32_t val,
                         ds_error *err) {
    DS_ASSERT(val >= 0);
    if ((m->count + 1) * 2 > m->cap) {
        ds_status st = strmap_grow(m, err);
        if (st != DS_OK) return st;
    }
    uint32_t h = tok_hash_bytes(base + off, len);
    uint32_t j = h & (m->cap - 1);
    while (m->slots[j].val >= 0) {
        tok_strmap_slot *s = &m->slots[j];
        if (s->hash == h && s->len == len && memcmp(base + s->off, base + off, len) == 0) {
            s->val = val;
            return DS_OK;
        }
        j = (j + 1) & (m->cap - 1);
    }
    m->slots[j] = (tok_strmap_slot){.off = off, .len = len, .val = val, .hash = h};
    m->count++;
    return DS_OK;
}

int32_t tok_strmap_get(const tok_strmap *m, const char *base, const char *key, size_t len) {
    if (!m->slots || len > UINT32_MAX) return -1;
    uint32_t h = tok_hash_bytes(key, len);
    uint32_t j = h & (m->cap - 1);
    while (m->slots[j].val >= 0) {
        const tok_strmap_slot *s = &m->slots[j];
        if (s->hash == h && s->len == len && memcmp(base + s->off, key, len) == 0) return s->val;
        j = (j + 1) & (m->cap - 1);
    }
    return -1;
}

void tok_strmap_free(tok_strmap *m) {
    free(m->slots);
    memset(m, 0, sizeof *m);
}

/* ---- tok_pairmap -------------------------------------------------------------------------- */

#define PAIR_EMPTY UINT64_MAX

static inline uint64_t pair_key(int32_t l, int32_t r) {
    return ((uint64_t)(uint32_t)l << 32) | (uint32_t)r;
}

static inline uint64_t pair_hash(uint64_t k) {
    k ^= k >> 33;
    k *= 0xff51afd7ed558ccdull;
    k ^= k >> 33;
    return k;
}

ds_status tok_pairmap_init(tok_pairmap *m, size_t expected, ds_error *err) {
    size_t cap = 16;
    while (cap < expected * 2 + 1) cap *= 2;
    m->slots = malloc(sizeof *m->slots * cap);
    if (!m->slots) return ds_error_set(err, DS_ERR_NOMEM, "tokenizer: out of memory (merges)");
    for (size_t i = 0; i < cap; i++) m->slots[i].key = PAIR_EMPTY;
    m->mask = cap - 1;
    return DS_OK;
}

/* Capacity is fixed at init (the merge count is known up front), at most half full. */
void tok_pairmap_put(tok_pairmap *m, int32_t left, int32_t right, uint32_t rank, int32_t merged) {
    uint64_t k = pair_key(left, right);
    uint64_t j = pair_hash(k) & m->mask;
    while (m->slots[j].key != PAIR_EMPTY && m->slots[j].key != k) j = (j + 1) & m->mask;
    m->slots[j] = (tok_pair_slot){.key = k, .rank = rank, .merged = merged};
}

const tok_pair_slot *tok_pairmap_get(const tok_pairmap *m, int32_t left, int32_t right) {
    uint64_t k = pair_key(left, right);
    uint64_t j = pair_hash(k) & m->mask;
    for (;;) {
        const tok_pair_slot *s = &m->slots[j];
        if (s->key == k) return s;
        if (s->key == PAIR_EMPTY) return NULL;
        j = (j + 1) & m->mask;
    }
}

void tok_pairmap_free(tok_pairmap *m) {
    free(m->slots);
    memset(m, 0, sizeof *m);
}
