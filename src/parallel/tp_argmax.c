/* tp_argmax.c — exact argmax over a vocab split across ranks.
 *
 * Each rank reduces its shard to (best value, global id); the merge takes the largest value and
 * the lowest global id among equal values. Because shards cover increasing id ranges and every
 * local argmax already keeps its lowest id, this equals the single-device argmax (strict >,
 * lowest index on ties, NaN never wins) bit for bit — no tolerance involved. Entries past the
 * real vocabulary (padding of evenly sized shards, usually -inf) are skipped by id, so a
 * padding slot cannot win even when the real entries of a shard are all NaN. */
#include <math.h>

#include "parallel/tp.h"

ds_tp_argmax_part ds_tp_argmax_local(const float *logits, int64_t n, int64_t off,
                                     int64_t n_valid) {
    ds_tp_argmax_part best = {.val = NAN, .idx = -1};
    int64_t end = n_valid - off < n ? n_valid - off : n;
    for (int64_t v = 0; v < end; v++) {
        float x = logits[v];
        if (isnan(x)) continue;
        if (best.idx < 0 || x > best.val) {
            best.val = x;
            best.idx = off + v;
        }
    }
    return best;
}

int64_t ds_tp_argmax_merge(const ds_tp_argmax_part *parts, int n) {
    int64_t idx = -1;
    float val = 0.0f;
    for (int r = 0; r < n; r++) {
        const ds_tp_argmax_part *p = &parts[r];
        if (p->idx < 0) continue;
        if (idx < 0 || p->val > val || (p->val == val && p->idx < idx)) {
            val = p->val;
            idx = p->idx;
        }
    }
    return idx < 0 ? 0 : idx; /* all NaN: id 0, like the backends' argmax */
}
