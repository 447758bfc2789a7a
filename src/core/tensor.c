#include "core/tensor.h"

#include "core/status.h"

size_t ds_dtype_size(ds_dtype t) {
    switch (t) {
    case DS_DTYPE_F32: return 4;
    case DS_DTYPE_BF16: return 2;
    case DS_DTYPE_F16: return 2;
    case DS_DTYPE_I32: return 4;
    case DS_DTYPE_I64: return 8;
    default: break;
    }
    DS_ASSERT(!"bad dtype");
    return 0;
}

const char *ds_dtype_name(ds_dtype t) {
    static const char *names[DS_DTYPE_COUNT] = {"F32", "BF16", "F16", "I32", "I64"};
    return (t >= 0 && t < DS_DTYPE_COUNT) ? names[t] : "?";
}

int64_t ds_tensor_numel(const ds_tensor *t) {
    int64_t n = 1;
    for (int i = 0; i < t->ndim; i++) n *= t->ne[i];
    return n;
}

size_t ds_tensor_nbytes(const ds_tensor *t) {
    return (size_t)ds_tensor_numel(t) * ds_dtype_size(t->dtype);
}

float ds_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu;
    uint32_t man = h & 0x3ffu;
    uint32_t u;
    if (exp == 0) {
        if (man == 0) {
            u = sign;
        } else { /* subnormal: renormalise */
            exp = 127 - 15 + 1;
            while (!(man & 0x400u)) {
                man <<= 1;
                exp--;
            }
            man &= 0x3ffu;
            u = sign | (exp << 23) | (man << 13);
        }
    } else if (exp == 31) {
        u = sign | 0x7f800000u | (man << 13);
    } else {
        u = sign | ((exp + 127 - 15) << 23) | (man << 13);
    }
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

uint16_t ds_f32_to_f16(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    uint32_t sign = (u >> 16) & 0x8000u;
    int32_t exp = (int32_t)((u >> 23) & 0xffu) - 127 + 15;
    uint32_t man = u & 0x7fffffu;
    if (((u >> 23) & 0xffu) == 0xffu) return (uint16_t)(sign | 0x7c00u | (man ? 0x200u : 0));
    if (exp >= 31) return (uint16_t)(sign | 0x7c00u);
    if (exp <= 0) {
        if (exp < -10) return (uint16_t)sign;
        man |= 0x800000u;
        uint32_t shift = (uint32_t)(14 - exp);
        uint32_t half = man >> shift;
        uint32_t rem = man & ((1u << shift) - 1);
        uint32_t mid = 1u << (shift - 1);
        if (rem > mid || (rem == mid && (half & 1u))) half++;
        return (uint16_t)(sign | half);
    }
    uint32_t half = sign | ((uint32_t)exp << 10) | (man >> 13);
    uint32_t rem = man & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (half & 1u))) half++;
    return (uint16_t)half;
}

float ds_tensor_get_f32(const ds_tensor *t, int64_t i) {
    switch (t->dtype) {
    case DS_DTYPE_F32: return ((const float *)t->data)[i];
    case DS_DTYPE_BF16: return ds_bf16_to_f32(((const uint16_t *)t->data)[i]);
    case DS_DTYPE_F16: return ds_f16_to_f32(((const uint16_t *)t->data)[i]);
    case DS_DTYPE_I32: return (float)((const int32_t *)t->data)[i];
    case DS_DTYPE_I64: return (float)((const int64_t *)t->data)[i];
    default: break;
    }
    DS_ASSERT(!"bad dtype");
    return 0;
}
