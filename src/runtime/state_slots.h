/* state_slots.h — the pool of GDN state slots (conv history + fp32 recurrent state, one per
 * sequence that holds caches). Pure bookkeeping: the engine calls the backend's
 * cache_reset_slot when a slot is handed to a new sequence (a slot's state is the running
 * summary of everything its previous owner saw, so it must be cleared, unlike KV blocks, which
 * are only read at the positions a sequence has written).
 *
 * The slot id is also the sequence's row in ds_kv_blocks and its ds_batch.seq_slot. */
#ifndef DS_STATE_SLOTS_H
#define DS_STATE_SLOTS_H

#include <stdbool.h>

typedef struct ds_state_slots {
    int n_slots;
    int *free_stack; /* [n_slots] free slot ids; top = free_stack[n_free - 1] */
    int n_free;
    bool *in_use;    /* [n_slots] */
} ds_state_slots;

void ds_state_slots_init(ds_state_slots *s, int n_slots);
void ds_state_slots_free(ds_state_slots *s);

/* A free slot id (lowest ids first on a fresh pool), or -1 when all are taken. */
int ds_state_slots_alloc(ds_state_slots *s);
void ds_state_slots_release(ds_state_slots *s, int slot);

static inline int ds_state_slots_n_free(const ds_state_slots *s) { return s->n_free; }
static inline int ds_state_slots_n_used(const ds_state_slots *s) { return s->n_slots - s->n_free; }

#endif
