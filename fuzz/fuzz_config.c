/* fuzz_config.c — libFuzzer target for the model config parser (model/config.c): a checkpoint's
 * config.json is untrusted, and every size in it later sizes an allocation or a loop.
 *
 * Oracle: a rejected config says why; an accepted one satisfies every bound the rest of the
 * engine relies on (each checked here against the parser's promise): sizes positive and within
 * range, heads divisible, rotary dims even within the head, one known type per layer, top-k
 * within the experts, eos ids distinct and inside the vocabulary.
 *
 * Build with -DDS_FUZZ=ON (clang) and run e.g.
 *   build-fuzz/fuzz_config fuzz/corpus_config -max_len=8192
 * tests/test_fuzz_replay.c includes this file and replays the seed corpus plus deterministic
 * mutations through the same entry point. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/status.h"
#include "model/config.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void cfg_check(const ds_config *c) {
    const int max_dim = 1 << 20;
    DS_ASSERT(c->hidden >= 1 && c->hidden <= max_dim);
    DS_ASSERT(c->n_layers >= 1 && c->n_layers <= DS_MAX_LAYERS);
    DS_ASSERT(c->vocab >= 1 && c->vocab <= (1 << 24));
    DS_ASSERT(c->rms_eps >= 0.0 && c->rms_eps <= 1.0);
    DS_ASSERT(c->n_heads >= 1 && c->n_kv_heads >= 1 && c->n_heads % c->n_kv_heads == 0);
    DS_ASSERT(c->head_dim >= 2 && c->head_dim <= max_dim);
    DS_ASSERT(c->rot_dim >= 2 && c->rot_dim % 2 == 0 && c->rot_dim <= c->head_dim);
    DS_ASSERT(c->gdn_k_heads >= 1 && c->gdn_v_heads % c->gdn_k_heads == 0);
    DS_ASSERT(c->gdn_k_dim >= 1 && c->gdn_v_dim >= 1);
    DS_ASSERT(c->gdn_conv_kernel >= 1 && c->gdn_conv_kernel <= 64);
    DS_ASSERT(ds_config_gdn_conv_dim(c) > 0); /* no overflow */
    for (int i = 0; i < c->n_layers; i++)
        DS_ASSERT(c->layer_types[i] == DS_LAYER_LINEAR_ATTN || c->layer_types[i] == DS_LAYER_FULL_ATTN);
    if (c->is_moe) {
        DS_ASSERT(c->n_experts >= 1 && c->top_k >= 1 && c->top_k <= c->n_experts);
        DS_ASSERT(c->moe_inter >= 1 && c->shared_inter >= 0);
    } else {
        DS_ASSERT(c->mlp_inter >= 1);
    }
    DS_ASSERT(c->n_mtp_layers >= 0 && c->n_mtp_layers <= 16);
    DS_ASSERT(c->n_eos >= 0 && c->n_eos <= DS_MAX_EOS);
    for (int i = 0; i < c->n_eos; i++) {
        DS_ASSERT(c->eos_ids[i] >= 0 && c->eos_ids[i] < c->vocab);
        for (int j = 0; j < i; j++) DS_ASSERT(c->eos_ids[j] != c->eos_ids[i]);
    }
    DS_ASSERT(memchr(c->model_type, 0, sizeof c->model_type) != NULL);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char *text = malloc(size + 1); /* the parser takes NUL-terminated text */
    if (!text) return 0;
    memcpy(text, data, size);
    text[size] = 0;
    ds_config cfg;
    ds_error err = {0};
    if (ds_config_parse(text, "fuzz-config.json", &cfg, &err) == DS_OK) cfg_check(&cfg);
    else DS_ASSERT(err.status != DS_OK && err.msg[0] != 0); /* every rejection says why */
    free(text);
    return 0;
}
