/* rng.h — the per-request random number generator of the sampler.
 *
 * xoshiro256** (Blackman & Vigna) seeded through splitmix64: fast, 256 bits of state, passes
 * BigCrush, and — what matters here — each request owns one, so a seeded request draws the same
 * numbers whatever else shares its batch. Same seed → same stream, on every platform (pure
 * 64-bit integer arithmetic, no library RNG). */
#ifndef DS_SAMPLING_RNG_H
#define DS_SAMPLING_RNG_H

#include <stdint.h>

typedef struct ds_rng {
    uint64_t s[4];
} ds_rng;

/* Seeds the four state words from splitmix64(seed); any seed (0 included) gives a valid state. */
void ds_rng_seed(ds_rng *r, uint64_t seed);

uint64_t ds_rng_next(ds_rng *r);

/* Uniform double in [0, 1) with 53 random bits. */
double ds_rng_uniform(ds_rng *r);

/* A fresh 64-bit seed from the OS entropy source (getrandom); falls back to clocks, the pid and
 * a process-wide counter when the kernel call is unavailable, so two calls never repeat. Used
 * for requests that carry no seed. */
uint64_t ds_rng_entropy_seed(void);

#endif
