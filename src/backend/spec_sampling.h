/* spec_sampling.h — the per-sequence sampling parameters of backend.h spec_sample, in a header
 * of plain C types only, so the CUDA kernels (which include no other project header: see
 * cuda_internal.h) share the layout with the host. */
#ifndef DS_BACKEND_SPEC_SAMPLING_H
#define DS_BACKEND_SPEC_SAMPLING_H

#include <stdint.h>

/* Sampling parameters of one sequence of a sampled verification (spec_sample): the request's
 * processed distribution when it has no penalties, logit_bias, logprobs or pending min_tokens
 * (sampler.h's order: temperature, then min_p, top_k and top_p over the tempered logits). */
typedef struct ds_spec_sampling {
    float temperature; /* ≤ 0: the row's target id is the plain argmax (greedy rows) */
    float top_p;       /* (0, 1]; 1: off */
    float min_p;       /* [0, 1]; 0: off */
    int32_t top_k;     /* ≤ 0 or ≥ vocab: off */
    uint64_t seed;     /* the request's seed (sampling/counter_rng.h keys its numbers) */
} ds_spec_sampling;
/* Sequences of every backend's sampling table (set_spec_sampling). */
#define DS_SPEC_SAMPLING_MAX 256

#endif
