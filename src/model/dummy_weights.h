/* dummy_weights.h — seeded random host weights of realistic scale for any config, for
 * benchmarks and tests without a checkpoint (`--dummy-weights`). Never zeros: matrices are
 * uniform with std 1/sqrt(fan_in), norms are 1 ± 0.1, GDN decay parameters follow the ranges
 * Qwen3.5 is initialised with, so activations stay O(1) through every layer. */
#ifndef DS_DUMMY_WEIGHTS_H
#define DS_DUMMY_WEIGHTS_H

#include <stdint.h>

#include "core/status.h"
#include "model/config.h"
#include "model/weights.h"

/* Fills *w following weights.h's conventions (BF16 matrices, F32 small tensors), including an
 * MTP head when cfg->n_mtp_layers > 0. Free with ds_dummy_weights_free. */
ds_status ds_dummy_weights_create(const ds_config *cfg, uint64_t seed, ds_model_weights *w,
                                  ds_error *err);
void ds_dummy_weights_free(ds_model_weights *w);

#endif
