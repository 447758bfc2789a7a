/* cuda_mma.cuh — warp-level tensor-core products (mma.sync, sm_80+) shared by the kernels:
 * bf16 m16n8k16 and fp32-accurate "3xTF32" m16n8k8. Fragment layouts (PTX ISA), lane = 4g + t:
 *   m16n8k16 bf16: A a0 (row g, k 2t…2t+1), a1 (row g + 8), a2 (row g, k 2t + 8…), a3 (row g + 8,
 *                  k 2t + 8…); B b0 (k 2t…2t+1, column g), b1 (k 2t + 8…); each a bf16 pair;
 *   m16n8k8 tf32:  A a0 (row g, k t), a1 (row g + 8, k t), a2 (row g, k t + 4), a3 (row g + 8,
 *                  k t + 4); B b0 (k t, column g), b1 (k t + 4, column g);
 *   C / D (both):  c0, c1 (row g, columns 2t, 2t + 1), c2, c3 (row g + 8, the same columns). */
#ifndef DS_CUDA_MMA_CUH
#define DS_CUDA_MMA_CUH

#include <stdint.h>

static __device__ __forceinline__ void mma_bf16_16816(float c[4], uint32_t a0, uint32_t a1, uint32_t a2,
                                                      uint32_t a3, uint32_t b0, uint32_t b1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
#endif
}

/* Four 8×8 bf16 matrices from shared memory: lanes 8i … 8i + 7 give the row addresses (16
 * bytes each, 16-byte aligned) of matrix i; register i gets matrix i with lane 4g + t holding
 * (row g, columns 2t, 2t + 1). Rows as m and columns as k: an A fragment quarter of m16n8k16;
 * rows as n and columns as k (a weight matrix W[n, k], B = Wᵀ): a B fragment half. */
static __device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], uint32_t smem_addr) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem_addr));
#endif
}

/* Four 8×8 bf16 matrices from shared memory, transposed: lanes 8i … 8i + 7 give the row
 * addresses (16 bytes each, 16-byte aligned) of matrix i; register i gets matrix i with lane
 * 4g + t holding (row 2t, column g) and (row 2t + 1, column g). With the rows as k and the
 * columns as n, that is a B fragment half (b0 or b1) of m16n8k16. */
static __device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], const void *row_addr) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    const uint32_t a = (uint32_t)__cvta_generic_to_shared(row_addr);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(a));
#endif
}

/* fp32 products on tensor cores, "3xTF32": x = hi + lo with hi = tf32(x), lo = tf32(x − hi);
 * a·b ≈ hi_a·hi_b + hi_a·lo_b + lo_a·hi_b in fp32 accumulators keeps fp32-level accuracy
 * (one tf32 pass would round every input to 11 bits). A value with at most 11 significant
 * bits (a bf16) is exact as hi alone: its lo is 0 and its terms can be skipped. */
struct tf32_split {
    uint32_t hi, lo;
};
static __device__ __forceinline__ uint32_t to_tf32(float x) {
    uint32_t r;
    asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(r) : "f"(x));
    return r;
}
/* x as to_tf32's bits when round (the bits a one-pass product would feed the tensor cores),
 * else x */
static __device__ __forceinline__ float tf32_if(bool round, float x) {
    return round ? __uint_as_float(to_tf32(x)) : x;
}
static __device__ __forceinline__ tf32_split split_tf32(float x) {
    const uint32_t hi = to_tf32(x);
    return {hi, to_tf32(x - __uint_as_float(hi))};
}
static __device__ __forceinline__ void mma_tf32(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2,
                                                uint32_t a3, uint32_t b0, uint32_t b1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
                 "{%8,%9}, {%0,%1,%2,%3};"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
#endif
}
/* c += A·B for one m16n8k8 tile in 3xTF32 */
static __device__ __forceinline__ void mma3(float (&c)[4], const tf32_split (&a)[4], const tf32_split (&b)[2]) {
    mma_tf32(c, a[0].hi, a[1].hi, a[2].hi, a[3].hi, b[0].lo, b[1].lo);
    mma_tf32(c, a[0].lo, a[1].lo, a[2].lo, a[3].lo, b[0].hi, b[1].hi);
    mma_tf32(c, a[0].hi, a[1].hi, a[2].hi, a[3].hi, b[0].hi, b[1].hi);
}

/* c += A·B for one m16n8k8 tile: 3xTF32 (X3), or one tf32 pass on the hi parts (every input
 * rounded to 11 bits, fp32 sums; the lo parts, unused, compile away) */
template <bool X3>
static __device__ __forceinline__ void mma_x(float (&c)[4], const tf32_split (&a)[4], const tf32_split (&b)[2]) {
    if constexpr (X3) mma3(c, a, b);
    else mma_tf32(c, a[0].hi, a[1].hi, a[2].hi, a[3].hi, b[0].hi, b[1].hi);
}

/* The A fragment of rows m0 … m0 + 15, columns k0 … k0 + 7 of a row-major fp32 tile X (row
 * pitch ld) for lane (g, t), split for 3xTF32. */
static __device__ __forceinline__ void load_a_tf32(tf32_split (&fa)[4], const float *X, int ld, int m0,
                                                   int k0, int g, int t) {
    fa[0] = split_tf32(X[(m0 + g) * ld + k0 + t]);
    fa[1] = split_tf32(X[(m0 + g + 8) * ld + k0 + t]);
    fa[2] = split_tf32(X[(m0 + g) * ld + k0 + t + 4]);
    fa[3] = split_tf32(X[(m0 + g + 8) * ld + k0 + t + 4]);
}
/* The same from a tile stored [k][m] (A = Xᵀ). */
static __device__ __forceinline__ void load_at_tf32(tf32_split (&fa)[4], const float *X, int ld, int m0,
                                                    int k0, int g, int t) {
    fa[0] = split_tf32(X[(k0 + t) * ld + m0 + g]);
    fa[1] = split_tf32(X[(k0 + t) * ld + m0 + g + 8]);
    fa[2] = split_tf32(X[(k0 + t + 4) * ld + m0 + g]);
    fa[3] = split_tf32(X[(k0 + t + 4) * ld + m0 + g + 8]);
}
/* The B fragment of columns n0 … n0 + 7, rows k0 … k0 + 7 of an fp32 tile stored [k][n] (pitch
 * ld), split for 3xTF32. */
static __device__ __forceinline__ void load_b_tf32(tf32_split (&fb)[2], const float *X, int ld, int k0,
                                                   int n0, int g, int t) {
    fb[0] = split_tf32(X[(k0 + t) * ld + n0 + g]);
    fb[1] = split_tf32(X[(k0 + t + 4) * ld + n0 + g]);
}
/* The same from a tile stored [n][k] (B = Xᵀ). */
static __device__ __forceinline__ void load_bt_tf32(tf32_split (&fb)[2], const float *X, int ld, int k0,
                                                    int n0, int g, int t) {
    fb[0] = split_tf32(X[(n0 + g) * ld + k0 + t]);
    fb[1] = split_tf32(X[(n0 + g) * ld + k0 + t + 4]);
}

/* A value stored as to_tf32's bits (tf32_if) taken as the hi of a one-pass product as it is:
 * the operand split_tf32 of the unrounded value would have given. Never convert it again (the
 * conversion need not clear the low bits it leaves, so a second one could differ). */
static __device__ __forceinline__ tf32_split tf32_stored(uint32_t bits) { return {bits, 0u}; }

/* The same values as load_a_tf32 by one ldmatrix.x4, the fp32 rows read as bf16 pairs: matrix
 * i is rows m0 + 8(i & 1) …, columns k0 + 4(i >> 1) … (8 rows of 16 bytes), and lane 4g + t
 * receives its (row g, column t) — the A fragment's a_i. Rows 16-byte aligned (ld and k0
 * multiples of 4); one instruction where load_a_tf32 issues four. RAW: the tile holds tf32
 * values already (tf32_stored; one-pass products only). */
template <bool RAW = false>
static __device__ __forceinline__ void ldsm_a_tf32(tf32_split (&fa)[4], const float *X, int ld, int m0,
                                                   int k0, int lane) {
    uint32_t r[4];
    const int row = m0 + (lane & 7) + ((lane >> 3) & 1) * 8, col = k0 + (lane >> 4) * 4;
    ldmatrix_x4(r, (uint32_t)__cvta_generic_to_shared(X + row * ld + col));
#pragma unroll
    for (int i = 0; i < 4; i++) fa[i] = RAW ? tf32_stored(r[i]) : split_tf32(__uint_as_float(r[i]));
}
/* load_bt_tf32's values for two n-tiles (columns n0 … n0 + 7 into fb0, n0 + 8 … into fb1) of a
 * tile stored [n][k], by one ldmatrix.x4: matrix i is rows n0 + 8(i >> 1) …, columns
 * k0 + 4(i & 1) …. Alignment and RAW as ldsm_a_tf32. */
template <bool RAW = false>
static __device__ __forceinline__ void ldsm_bt2_tf32(tf32_split (&fb0)[2], tf32_split (&fb1)[2], const float *X,
                                                     int ld, int k0, int n0, int lane) {
    uint32_t r[4];
    const int row = n0 + (lane & 7) + (lane >> 4) * 8, col = k0 + ((lane >> 3) & 1) * 4;
    ldmatrix_x4(r, (uint32_t)__cvta_generic_to_shared(X + row * ld + col));
    tf32_split v[4];
#pragma unroll
    for (int i = 0; i < 4; i++) v[i] = RAW ? tf32_stored(r[i]) : split_tf32(__uint_as_float(r[i]));
    fb0[0] = v[0], fb0[1] = v[1], fb1[0] = v[2], fb1[1] = v[3];
}

#endif
