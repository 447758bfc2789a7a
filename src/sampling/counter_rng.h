/* counter_rng.h — a counter-based random generator shared by the CPU and CUDA backends.
 *
 * Sampled verifications (backend.h spec_sample on the device, runtime/spec.c ds_spec_verify on
 * the host) need random numbers that every row can draw on its own, in any order, with no state
 * carried between steps, and that every path reproduces bit for bit: uniform number i of the
 * token at position p of a request with seed s is a pure function of (s, p, i). So a seeded
 * request's tokens do not depend on which path, step or batch decided them, nor on how many
 * drafts each step had (up to float rounding at a boundary). Two splitmix64 finalisers (Steele
 * et al., the same mixer rng.c seeds xoshiro with) make the key of (s, p), a third mixes in i.
 * Each position of a request is decided once, so its numbers are never reused; positions and
 * counters are distinct inputs, so different rows draw independent numbers.
 *
 * Header-only, integer arithmetic plus one float multiply: identical on every platform. */
#ifndef DS_SAMPLING_COUNTER_RNG_H
#define DS_SAMPLING_COUNTER_RNG_H

#include <stdint.h>

#if defined(__CUDACC__)
#define DS_CRNG_FN static __host__ __device__ __forceinline__
#else
#define DS_CRNG_FN static inline
#endif

/* The counter of a row's one uniform (never a vocabulary id): the inverse-CDF draw of its
 * token, made whether or not the row has a draft (backend.h spec_sample). */
#define DS_CRNG_DRAW UINT32_C(0xfffffffe)

DS_CRNG_FN uint64_t ds_crng_mix(uint64_t z) {
    z += UINT64_C(0x9e3779b97f4a7c15);
    z = (z ^ (z >> 30)) * UINT64_C(0xbf58476d1ce4e5b9);
    z = (z ^ (z >> 27)) * UINT64_C(0x94d049bb133111eb);
    return z ^ (z >> 31);
}

/* The key of the token at position pos of a request seeded with seed. */
DS_CRNG_FN uint64_t ds_crng_key(uint64_t seed, int64_t pos) {
    return ds_crng_mix(seed ^ ds_crng_mix((uint64_t)pos));
}

/* Uniform number i of key: in (0, 1), 24 random bits, exactly representable as a float. */
DS_CRNG_FN float ds_crng_uniform(uint64_t key, uint32_t i) {
    const uint64_t h = ds_crng_mix(key ^ ((uint64_t)i * UINT64_C(0xd1342543de82ef95)));
    return ((float)(uint32_t)(h >> 40) + 0.5f) * (1.0f / 16777216.0f);
}

#endif
