#include "sampling/select.h"

#include <math.h>
#include <stdbool.h>

#include "core/status.h"

#define SELECT_MAX_BUCKETS 2048
#define SELECT_LANES 16

static inline float bits_to_float(uint32_t u) {
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* Any of SELECT_LANES values in [lo, hi]? Constant trip count: vectorised at -O2. */
static inline bool block_any_in(const float *x, float lo, float hi) {
    int any = 0;
    for (int j = 0; j < SELECT_LANES; j++) any |= (x[j] >= lo) & (x[j] <= hi);
    return any != 0;
}

uint32_t ds_select_desc(const float *x, size_t n, ds_select_weight mode, double target,
                        double *above_out, double *at_out) {
    static const int shifts[3] = {21, 10, 0};
    static const int widths[3] = {11, 11, 10};
    double hist[SELECT_MAX_BUCKETS];
    uint32_t prefix = 0, prefix_mask = 0;
    double above = 0.0;

    for (int pass = 0; pass < 3; pass++) {
        const int shift = shifts[pass];
        const uint32_t nb = 1u << widths[pass];
        memset(hist, 0, nb * sizeof hist[0]);
        /* Elements matching the prefix so far are exactly the floats in [lo, hi] (the keys are
         * monotone); after the first pass few are, so blocks with none are skipped by a
         * vectorised range test. */
        const uint32_t span = ~prefix_mask;
        const float lo = mode == DS_SELECT_COUNT ? ds_float_from_order_key(prefix)
                                                 : bits_to_float(prefix);
        const float hi = mode == DS_SELECT_COUNT ? ds_float_from_order_key(prefix | span)
                                                 : bits_to_float(prefix | span);
        size_t i = 0;
        for (;;) {
            if (pass > 0)
                while (i + SELECT_LANES <= n && !block_any_in(x + i, lo, hi)) i += SELECT_LANES;
            size_t end = pass > 0 ? (i + SELECT_LANES < n ? i + SELECT_LANES : n) : n;
            if (i >= n) break;
            if (mode == DS_SELECT_COUNT) {
                for (; i < end; i++) {
                    float v = x[i];
                    if (!(v > -INFINITY)) continue; /* -inf and NaN never count */
                    uint32_t k = ds_float_order_key(v);
                    if ((k & prefix_mask) != prefix) continue;
                    hist[(k >> shift) & (nb - 1)] += 1.0;
                }
            } else {
                for (; i < end; i++) {
                    float v = x[i];
                    if (!(v > 0.0f)) continue;
                    uint32_t k = ds_float_bits(v);
                    if ((k & prefix_mask) != prefix) continue;
                    hist[(k >> shift) & (nb - 1)] += (double)v;
                }
            }
        }
        int chosen = -1, lowest = -1;
        for (int d = (int)nb - 1; d >= 0; d--) {
            if (hist[d] == 0.0) continue;
            lowest = d;
            if (above + hist[d] >= target) {
                chosen = d;
                break;
            }
            above += hist[d];
        }
        if (chosen < 0) {
            /* Total fell short of target by rounding: settle on the smallest weighted bucket. */
            DS_ASSERT(lowest >= 0);
            chosen = lowest;
            above -= hist[lowest];
        }
        prefix |= (uint32_t)chosen << shift;
        prefix_mask |= (nb - 1) << shift;
        *at_out = hist[chosen];
    }
    *above_out = above;
    return prefix;
}

int ds_select_top_n(const float *x, size_t n, int n_top, int *idx, float *val) {
    int have = 0;
    if (n_top <= 0) return 0;
    for (size_t i = 0; i < n; i++) {
        float v = x[i];
        if (v != v) continue;
        /* Indices arrive in increasing order, so an equal value never displaces an earlier one. */
        if (have == n_top && !(v > val[have - 1])) continue;
        int j = have < n_top ? have++ : have - 1;
        while (j > 0 && v > val[j - 1]) {
            val[j] = val[j - 1];
            idx[j] = idx[j - 1];
            j--;
        }
        val[j] = v;
        idx[j] = (int)i;
    }
    return have;
}
