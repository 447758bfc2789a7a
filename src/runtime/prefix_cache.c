#include "runtime/prefix_cache.h"

#include <stdlib.h>
#include <string.h>

#include "core/status.h"

void ds_prefix_cache_init(ds_prefix_cache *c, int cap) {
    DS_ASSERT(cap > 0);
    *c = (ds_prefix_cache){.cap = cap};
    c->e = ds_xcalloc((size_t)cap, sizeof *c->e);
}

void ds_prefix_cache_free(ds_prefix_cache *c) {
    for (int i = 0; i < c->n; i++) free(c->e[i].tokens);
    free(c->e);
    *c = (ds_prefix_cache){0};
}

bool ds_prefix_cache_store(ds_prefix_cache *c, int slot, const int32_t *tokens, int n_cached) {
    DS_ASSERT(slot >= 0 && n_cached >= 1);
    if (c->n == c->cap) return false;
    int32_t *copy = malloc(((size_t)n_cached + 1) * sizeof *copy);
    if (!copy) return false;
    memcpy(copy, tokens, ((size_t)n_cached + 1) * sizeof *copy);
    c->e[c->n++] = (ds_prefix_entry){
        .slot = slot, .n_cached = n_cached, .tokens = copy, .stamp = ++c->clock};
    return true;
}

int ds_prefix_cache_match(const ds_prefix_cache *c, const int32_t *tokens, int n_tokens,
                          int *n_cached) {
    int best = -1;
    for (int i = 0; i < c->n; i++) {
        const ds_prefix_entry *x = &c->e[i];
        if (x->n_cached >= n_tokens || (best >= 0 && x->n_cached <= c->e[best].n_cached))
            continue;
        if (memcmp(x->tokens, tokens, ((size_t)x->n_cached + 1) * sizeof *tokens) == 0) best = i;
    }
    if (best < 0) return -1;
    *n_cached = c->e[best].n_cached;
    return c->e[best].slot;
}

int ds_prefix_cache_oldest(const ds_prefix_cache *c, int except) {
    int best = -1;
    for (int i = 0; i < c->n; i++)
        if (c->e[i].slot != except && (best < 0 || c->e[i].stamp < c->e[best].stamp)) best = i;
    return best < 0 ? -1 : c->e[best].slot;
}

void ds_prefix_cache_take(ds_prefix_cache *c, int slot) {
    for (int i = 0; i < c->n; i++) {
        if (c->e[i].slot != slot) continue;
        free(c->e[i].tokens);
        c->e[i] = c->e[--c->n];
        return;
    }
    DS_ASSERT(!"ds_prefix_cache_take: no entry holds the slot");
}
