#include "runtime/state_slots.h"

#include <stdlib.h>

#include "core/status.h"

void ds_state_slots_init(ds_state_slots *s, int n_slots) {
    DS_ASSERT(n_slots > 0);
    *s = (ds_state_slots){.n_slots = n_slots, .n_free = n_slots};
    s->free_stack = ds_xcalloc((size_t)n_slots, sizeof(int));
    s->in_use = ds_xcalloc((size_t)n_slots, sizeof(bool));
    for (int i = 0; i < n_slots; i++) s->free_stack[i] = n_slots - 1 - i;
}

void ds_state_slots_free(ds_state_slots *s) {
    free(s->free_stack);
    free(s->in_use);
    *s = (ds_state_slots){0};
}

int ds_state_slots_alloc(ds_state_slots *s) {
    if (s->n_free == 0) return -1;
    int slot = s->free_stack[--s->n_free];
    DS_ASSERT(!s->in_use[slot]);
    s->in_use[slot] = true;
    return slot;
}

void ds_state_slots_release(ds_state_slots *s, int slot) {
    DS_ASSERT(slot >= 0 && slot < s->n_slots && s->in_use[slot] && s->n_free < s->n_slots);
    s->in_use[slot] = false;
    s->free_stack[s->n_free++] = slot;
}
