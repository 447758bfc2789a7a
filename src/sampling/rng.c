#include "sampling/rng.h"

#include <stdatomic.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

static uint64_t splitmix64(uint64_t *x) {
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static inline uint64_t rotl64(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

void ds_rng_seed(ds_rng *r, uint64_t seed) {
    uint64_t x = seed;
    for (int i = 0; i < 4; i++) r->s[i] = splitmix64(&x);
    /* splitmix64 is a bijection of a counter, so four consecutive outputs are never all zero
     * (the one state xoshiro cannot leave). */
}

uint64_t ds_rng_next(ds_rng *r) {
    uint64_t *s = r->s;
    const uint64_t result = rotl64(s[1] * 5, 7) * 9;
    const uint64_t t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl64(s[3], 45);
    return result;
}

double ds_rng_uniform(ds_rng *r) {
    return (double)(ds_rng_next(r) >> 11) * 0x1.0p-53;
}

uint64_t ds_rng_entropy_seed(void) {
    uint64_t seed;
    if (getrandom(&seed, sizeof seed, GRND_NONBLOCK) == (ssize_t)sizeof seed) return seed;
    /* No kernel entropy (old kernel, seccomp): mix whatever differs between calls. */
    static atomic_uint_fast64_t counter;
    struct timespec a, b;
    clock_gettime(CLOCK_REALTIME, &a);
    clock_gettime(CLOCK_MONOTONIC, &b);
    uint64_t x = (uint64_t)a.tv_sec * 1000000007ull ^ (uint64_t)a.tv_nsec ^
                 ((uint64_t)b.tv_nsec << 21) ^ ((uint64_t)getpid() << 40) ^
                 (atomic_fetch_add(&counter, 1) * 0xd1342543de82ef95ull);
    return splitmix64(&x);
}
