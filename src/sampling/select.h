/* select.h — O(V) order statistics over float arrays (internal to sampling/).
 *
 * top_k and top_p are both "keep everything above a threshold": top_k's threshold is the k-th
 * largest logit, top_p's is the probability at which the descending cumulative mass first
 * reaches p. Both are found without sorting by radix selection on the float bit patterns
 * (11 + 11 + 10 bits, three histogram passes), the same idea as the GPU top-p kernels. No
 * scratch memory: a 250k vocabulary costs three streaming passes instead of an O(V log V) sort. */
#ifndef DS_SAMPLING_SELECT_H
#define DS_SAMPLING_SELECT_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

/* Monotone map float → uint32 (a < b ⇔ key(a) < key(b) for non-NaN; -0 and +0 differ, so
 * callers canonicalise -0 first). */
static inline uint32_t ds_float_order_key(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

/* Inverse of ds_float_order_key. */
static inline float ds_float_from_order_key(uint32_t k) {
    uint32_t u = (k & 0x80000000u) ? (k & 0x7fffffffu) : ~k;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* Bit pattern of a non-negative float: already monotone. */
static inline uint32_t ds_float_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

typedef enum ds_select_weight {
    DS_SELECT_COUNT, /* x = logits; every element > -inf weighs 1; key = ds_float_order_key */
    DS_SELECT_MASS,  /* x = unnormalised probabilities ≥ 0; weight = x; key = ds_float_bits */
} ds_select_weight;

/* Walking x[0..n) in descending key order and summing weights, returns the key of the element
 * at which the sum first reaches `target` (> 0). *above = total weight of keys strictly greater
 * than the returned key, *at = total weight of keys equal to it (ties). If rounding leaves the
 * total below target, returns the smallest weighted key. */
uint32_t ds_select_desc(const float *x, size_t n, ds_select_weight mode, double target,
                        double *above, double *at);

/* The n_top (≤ cap) largest values of x[0..n) as (index, value), sorted by value desc then
 * index asc. NaN is skipped. Returns how many were found (< n_top when n is smaller). */
int ds_select_top_n(const float *x, size_t n, int n_top, int *idx, float *val);

#endif
