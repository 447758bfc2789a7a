/* tok_bpe.c — byte-level BPE over one pre-token.
 *
 * Symbols start as one per byte (each byte's single-character token) in a linked list. A
 * min-heap holds candidate merges ordered by (rank, position); popping the best one, checking it
 * is still current, merging and pushing the two new neighbour pairs gives the same result as
 * "repeatedly apply the lowest-ranked merge, leftmost first" (HF's Word::merge_all). */
#include <stdlib.h>
#include <string.h>

#include "tokenizer/tok_internal.h"

ds_status tok_scratch_push_id(tok_scratch *sc, int32_t id, ds_error *err) {
    if (sc->n_ids == sc->cap_ids) {
        size_t cap = sc->cap_ids ? sc->cap_ids * 2 : 256;
        int32_t *v = realloc(sc->ids, sizeof *v * cap);
        if (!v) return ds_error_set(err, DS_ERR_NOMEM, "tokenizer: out of memory (ids)");
        sc->ids = v;
        sc->cap_ids = cap;
    }
    sc->ids[sc->n_ids++] = id;
    return DS_OK;
}

static inline bool merge_less(const tok_merge *a, const tok_merge *b) {
    return a->rank != b->rank ? a->rank < b->rank : a->pos < b->pos;
}

static void heap_push(tok_merge *h, size_t *n, tok_merge m) {
    size_t i = (*n)++;
    while (i > 0) {
        size_t parent = (i - 1) / 2;
        if (!merge_less(&m, &h[parent])) break;
        h[i] = h[parent];
        i = parent;
    }
    h[i] = m;
}

static tok_merge heap_pop(tok_merge *h, size_t *n) {
    tok_merge top = h[0];
    tok_merge last = h[--(*n)];
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= *n) break;
        if (c + 1 < *n && merge_less(&h[c + 1], &h[c])) c++;
        if (!merge_less(&h[c], &last)) break;
        h[i] = h[c];
        i = c;
    }
    h[i] = last;
    return top;
}

static void try_push(const ds_tokenizer *tok, tok_scratch *sc, size_t *nh, int32_t left_pos) {
    const tok_sym *l = &sc->syms[left_pos];
    if (l->next < 0) return;
    const tok_pair_slot *m = tok_pairmap_get(&tok->merges, l->id, sc->syms[l->next].id);
    if (m)
        heap_push(sc->heap, nh,
                  (tok_merge){.rank = m->rank, .pos = (uint32_t)left_pos, .merged = m->merged});
}

ds_status tok_bpe_word(const ds_tokenizer *tok, tok_scratch *sc, const unsigned char *s, size_t n,
                       ds_error *err) {
    ds_status st;
    if (n == 0) return DS_OK;
    if (n == 1 && tok->byte_id[s[0]] >= 0) return tok_scratch_push_id(sc, tok->byte_id[s[0]], err);
    if (tok->ignore_merges) {
        /* The whole word is in the vocab: HF returns it without merging. */
        sc->word.len = 0;
        if ((st = tok_bytelevel_encode(&sc->word, s, n, err)) != DS_OK) return st;
        int32_t id = tok_strmap_get(&tok->vocab, tok->strs.p, sc->word.p, sc->word.len);
        if (id >= 0) return tok_scratch_push_id(sc, id, err);
    }
    if (n > sc->cap_syms) {
        tok_sym *sy = realloc(sc->syms, sizeof *sy * n);
        tok_merge *h = sy ? realloc(sc->heap, sizeof *h * n * 2) : NULL;
        if (sy) sc->syms = sy;
        if (h) sc->heap = h;
        if (!sy || !h) return ds_error_set(err, DS_ERR_NOMEM, "tokenizer: out of memory (bpe)");
        sc->cap_syms = n;
    }
    /* One symbol per byte. A byte with no token becomes unk, or is dropped (HF does both). */
    int32_t ns = 0;
    for (size_t i = 0; i < n; i++) {
        int32_t id = tok->byte_id[s[i]];
        if (id < 0) id = tok->unk_id;
        if (id < 0) continue;
        sc->syms[ns] = (tok_sym){.id = id, .prev = ns - 1, .next = -1, .len = 1};
        if (ns > 0) sc->syms[ns - 1].next = ns;
        ns++;
    }
    if (ns == 0) return DS_OK;
    /* Heap bound: ns-1 initial entries; each later step pops one and pushes at most two, and
     * only the at most ns-1 successful merges push, so it never holds more than 2*ns entries. */
    DS_ASSERT((size_t)ns <= n);
    size_t nh = 0;
    for (int32_t i = 0; i + 1 < ns; i++) try_push(tok, sc, &nh, i);
    while (nh > 0) {
        tok_merge top = heap_pop(sc->heap, &nh);
        tok_sym *l = &sc->syms[top.pos];
        if (l->len == 0 || l->next < 0) continue;
        tok_sym *r = &sc->syms[l->next];
        const tok_pair_slot *m = tok_pairmap_get(&tok->merges, l->id, r->id);
        if (!m || m->merged != top.merged) continue; /* stale: a neighbour changed */
        l->id = top.merged;
        l->len += r->len;
        r->len = 0;
        l->next = r->next;
        if (r->next >= 0) sc->syms[r->next].prev = (int32_t)top.pos;
        if (l->prev >= 0) try_push(tok, sc, &nh, l->prev);
        try_push(tok, sc, &nh, (int32_t)top.pos);
    }
    for (int32_t i = 0; i >= 0; i = sc->syms[i].next)
        if ((st = tok_scratch_push_id(sc, sc->syms[i].id, err)) != DS_OK) return st;
    return DS_OK;
}
