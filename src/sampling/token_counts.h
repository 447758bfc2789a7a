/* token_counts.h — the sparse token history behind the penalties (internal to sampling/).
 *
 * A dense [vocab] count array per request would cost 1 MB at a 250k vocabulary; requests see a
 * few thousand distinct tokens, so this is an open-addressing hash (linear probing, ≤ 50% load)
 * from token id to {output count, seen in prompt}. Iterating the slots visits every distinct
 * token once, which is what applying the penalties needs. */
#ifndef DS_SAMPLING_TOKEN_COUNTS_H
#define DS_SAMPLING_TOKEN_COUNTS_H

#include <stdbool.h>
#include <stdint.h>

#include "core/status.h"

typedef struct ds_token_count {
    int32_t token;      /* -1 = empty slot */
    uint32_t n_output;  /* occurrences among generated tokens */
    bool in_prompt;
} ds_token_count;

typedef struct ds_token_counts {
    ds_token_count *slots; /* [cap], cap a power of two */
    uint32_t cap;
    uint32_t n_used;
} ds_token_counts;

void ds_token_counts_init(ds_token_counts *c);
void ds_token_counts_free(ds_token_counts *c);
/* Records one occurrence; DS_ERR_NOMEM when the table cannot grow. */
ds_status ds_token_counts_add(ds_token_counts *c, int32_t token, bool is_prompt);
/* NULL when the token was never seen. */
const ds_token_count *ds_token_counts_find(const ds_token_counts *c, int32_t token);

#endif
