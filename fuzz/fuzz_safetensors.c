/* fuzz_safetensors.c — libFuzzer target for the safetensors parser.
 *
 * Build with -DDS_FUZZ=ON (clang) and run e.g.
 *   build-fuzz/fuzz_safetensors fuzz/corpus_safetensors -max_len=4096
 * tests/test_safetensors.c includes this file and replays the seed corpus plus deterministic
 * mutations through the same entry point, so the suite exercises it without libFuzzer. */
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "core/status.h"
#include "model/safetensors.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    ds_st_file *f = NULL;
    ds_error err = {0};
    if (ds_st_parse(data, size, "fuzz-input", &f, &err) != DS_OK) {
        /* every rejection must say why */
        DS_ASSERT(err.status != DS_OK && err.msg[0] != 0);
        DS_ASSERT(f == NULL);
        return 0;
    }
    /* Touch everything the parser vouched for: every byte of every tensor, every element
     * through the typed reader, the name lookup and the view. ASan flags any lie. */
    volatile uint8_t sink = 0;
    for (int i = 0; i < ds_st_count(f); i++) {
        const ds_st_tensor *t = ds_st_at(f, i);
        DS_ASSERT(ds_st_find(f, t->name) == t);
        DS_ASSERT(t->data >= data && t->data + t->nbytes <= data + size);
        for (size_t b = 0; b < t->nbytes; b++) sink ^= t->data[b];
        ds_tensor v;
        ds_error verr = {0};
        if (ds_st_tensor_view(t, &v, &verr) == DS_OK) {
            int64_t n = ds_tensor_numel(&v);
            DS_ASSERT((size_t)n * ds_dtype_size(v.dtype) == t->nbytes);
            float acc = 0;
            for (int64_t k = 0; k < n; k++) acc += ds_st_tensor_get_f32(t, k);
            sink ^= (uint8_t)(acc != acc);
        } else {
            DS_ASSERT(verr.status == DS_ERR_UNSUPPORTED && verr.msg[0]);
        }
    }
    (void)sink;
    ds_st_close(f);
    return 0;
}
