/* tensor.h — dtypes, the plain tensor view shared by every backend, and bf16/f16 helpers.
 *
 * A ds_tensor is a view: it never owns memory. `data` is a host pointer on the CPU backend and
 * a device pointer on the CUDA backend. Shapes are row-major, outermost first: ne[ndim-1] is the
 * contiguous dimension, so a weight [N, K] (PyTorch nn.Linear layout) has ne = {N, K}. */
#ifndef DS_TENSOR_H
#define DS_TENSOR_H

#include <stdint.h>
#include <string.h>

typedef enum ds_dtype {
    DS_DTYPE_F32 = 0,
    DS_DTYPE_BF16,
    DS_DTYPE_F16,
    DS_DTYPE_I32,
    DS_DTYPE_I64,
    DS_DTYPE_COUNT
} ds_dtype;

#define DS_MAX_DIMS 4

typedef struct ds_tensor {
    void *data;
    ds_dtype dtype;
    int ndim;
    int64_t ne[DS_MAX_DIMS];
} ds_tensor;

size_t ds_dtype_size(ds_dtype t);
const char *ds_dtype_name(ds_dtype t);
int64_t ds_tensor_numel(const ds_tensor *t);
size_t ds_tensor_nbytes(const ds_tensor *t);

/* bf16 -> f32 is exact (bf16 is the top half of an f32). */
static inline float ds_bf16_to_f32(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* f32 -> bf16 with round-to-nearest-even; NaN stays NaN (same as PyTorch). */
static inline uint16_t ds_f32_to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

float ds_f16_to_f32(uint16_t h);
uint16_t ds_f32_to_f16(float f);

/* Reads element i of a float tensor of any float dtype as f32 (slow path; tests and loaders). */
float ds_tensor_get_f32(const ds_tensor *t, int64_t i);

#endif
