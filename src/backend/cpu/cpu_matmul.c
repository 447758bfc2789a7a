/* cpu_matmul.c — x · Wᵀ with weights in their checkpoint dtype, fp32 accumulation.
 *
 * Every output element is computed the same way whatever the batch: 8 fp32 lanes accumulate
 * w[k..k+7]·x[k..k+7] with one FMA per step in k order, the lanes are summed in a fixed tree,
 * and the k % 8 tail is added last. So a token's row is bit-identical alone or in a batch, and
 * the R = 1 (decode, weight-streaming) and R > 1 (prefill, convert-once) paths agree exactly.
 *
 * R = 1: each weight row is converted on the fly and streamed once (memory bound).
 * R > 1: a block of DS_CPU_MATMUL_BLOCK weight rows is converted to f32 once, then every x row
 * is multiplied against it with a 2×4 register tile (weights read from memory once per call). */
#include "backend/cpu/cpu_internal.h"

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define CPU_SIMD 1
#else
#define CPU_SIMD 0
#endif

/* Scalar element load for tails and the portable path. */
static inline float load1(const void *row, int64_t k, ds_dtype dt) {
    switch (dt) {
    case DS_DTYPE_BF16: return ds_bf16_to_f32(((const uint16_t *)row)[k]);
    case DS_DTYPE_F16: return ds_f16_to_f32(((const uint16_t *)row)[k]);
    default: return ((const float *)row)[k];
    }
}

static inline const void *row_ptr(const ds_tensor *w, int64_t row) {
    return (const char *)w->data +
           (size_t)row * (size_t)w->ne[w->ndim - 1] * ds_dtype_size(w->dtype);
}

/* Σ_{k ≥ k8} w[k]·x[k], the part the 8-lane loop does not cover. */
static inline float tail_dot(const void *wrow, ds_dtype dt, const float *x, int64_t k8, int64_t K) {
    float t = 0.0f;
    for (int64_t k = k8; k < K; k++) t += load1(wrow, k, dt) * x[k];
    return t;
}

#if CPU_SIMD
static inline __m256 load8(const void *row, int64_t k, ds_dtype dt) {
    switch (dt) {
    case DS_DTYPE_BF16: {
        __m128i h = _mm_loadu_si128((const __m128i *)((const uint16_t *)row + k));
        return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
    }
#ifdef __F16C__
    case DS_DTYPE_F16:
        return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((const uint16_t *)row + k)));
#endif
    case DS_DTYPE_F32: return _mm256_loadu_ps((const float *)row + k);
    default: {
        float tmp[8];
        for (int i = 0; i < 8; i++) tmp[i] = load1(row, k + i, dt);
        return _mm256_loadu_ps(tmp);
    }
    }
}

/* Lanes summed as ((l0+l4)+(l2+l6)) + ((l1+l5)+(l3+l7)). */
static inline float hsum8(__m256 v) {
    __m128 a = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    a = _mm_add_ps(a, _mm_movehl_ps(a, a));
    a = _mm_add_ss(a, _mm_shuffle_ps(a, a, 1));
    return _mm_cvtss_f32(a);
}

/* Four weight rows against one x row, converting on the fly (decode). */
static inline __attribute__((always_inline)) void
gemv_rows4(const float *x, const void *w0, int64_t ldw_bytes, ds_dtype dt, int64_t K, float *out) {
    const void *w1 = (const char *)w0 + ldw_bytes, *w2 = (const char *)w1 + ldw_bytes,
               *w3 = (const char *)w2 + ldw_bytes;
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    int64_t k8 = K & ~(int64_t)7;
    for (int64_t k = 0; k < k8; k += 8) {
        __m256 xv = _mm256_loadu_ps(x + k);
        a0 = _mm256_fmadd_ps(load8(w0, k, dt), xv, a0);
        a1 = _mm256_fmadd_ps(load8(w1, k, dt), xv, a1);
        a2 = _mm256_fmadd_ps(load8(w2, k, dt), xv, a2);
        a3 = _mm256_fmadd_ps(load8(w3, k, dt), xv, a3);
    }
    out[0] = hsum8(a0) + tail_dot(w0, dt, x, k8, K);
    out[1] = hsum8(a1) + tail_dot(w1, dt, x, k8, K);
    out[2] = hsum8(a2) + tail_dot(w2, dt, x, k8, K);
    out[3] = hsum8(a3) + tail_dot(w3, dt, x, k8, K);
}

static inline __attribute__((always_inline)) float gemv_row1(const float *x, const void *w0,
                                                             ds_dtype dt, int64_t K) {
    __m256 a0 = _mm256_setzero_ps();
    int64_t k8 = K & ~(int64_t)7;
    for (int64_t k = 0; k < k8; k += 8)
        a0 = _mm256_fmadd_ps(load8(w0, k, dt), _mm256_loadu_ps(x + k), a0);
    return hsum8(a0) + tail_dot(w0, dt, x, k8, K);
}

static inline __attribute__((always_inline)) void
gemv_dt(const float *x, const ds_tensor *w, int64_t row0, int64_t n_rows, float *out, ds_dtype dt) {
    int64_t K = w->ne[w->ndim - 1];
    int64_t ldw = K * (int64_t)ds_dtype_size(dt);
    int64_t o = 0;
    for (; o + 4 <= n_rows; o += 4) gemv_rows4(x, row_ptr(w, row0 + o), ldw, dt, K, out + o);
    for (; o < n_rows; o++) out[o] = gemv_row1(x, row_ptr(w, row0 + o), dt, K);
}

static void gemv(const float *x, const ds_tensor *w, int64_t row0, int64_t n_rows, float *out) {
    switch (w->dtype) {
    case DS_DTYPE_BF16: gemv_dt(x, w, row0, n_rows, out, DS_DTYPE_BF16); break;
    case DS_DTYPE_F16: gemv_dt(x, w, row0, n_rows, out, DS_DTYPE_F16); break;
    case DS_DTYPE_F32: gemv_dt(x, w, row0, n_rows, out, DS_DTYPE_F32); break;
    default: DS_ASSERT(!"linear: weight dtype must be BF16, F16 or F32");
    }
}

/* out[r][n] for 2 x rows × 4 f32 weight rows (stride K). */
static void tile_2x4(const float *x0, const float *x1, const float *w, int64_t K, float *o0,
                     float *o1) {
    const float *w0 = w, *w1 = w + K, *w2 = w + 2 * K, *w3 = w + 3 * K;
    __m256 a00 = _mm256_setzero_ps(), a01 = a00, a02 = a00, a03 = a00;
    __m256 a10 = a00, a11 = a00, a12 = a00, a13 = a00;
    int64_t k8 = K & ~(int64_t)7;
    for (int64_t k = 0; k < k8; k += 8) {
        __m256 x0v = _mm256_loadu_ps(x0 + k), x1v = _mm256_loadu_ps(x1 + k);
        __m256 wv = _mm256_loadu_ps(w0 + k);
        a00 = _mm256_fmadd_ps(wv, x0v, a00);
        a10 = _mm256_fmadd_ps(wv, x1v, a10);
        wv = _mm256_loadu_ps(w1 + k);
        a01 = _mm256_fmadd_ps(wv, x0v, a01);
        a11 = _mm256_fmadd_ps(wv, x1v, a11);
        wv = _mm256_loadu_ps(w2 + k);
        a02 = _mm256_fmadd_ps(wv, x0v, a02);
        a12 = _mm256_fmadd_ps(wv, x1v, a12);
        wv = _mm256_loadu_ps(w3 + k);
        a03 = _mm256_fmadd_ps(wv, x0v, a03);
        a13 = _mm256_fmadd_ps(wv, x1v, a13);
    }
    o0[0] = hsum8(a00) + tail_dot(w0, DS_DTYPE_F32, x0, k8, K);
    o0[1] = hsum8(a01) + tail_dot(w1, DS_DTYPE_F32, x0, k8, K);
    o0[2] = hsum8(a02) + tail_dot(w2, DS_DTYPE_F32, x0, k8, K);
    o0[3] = hsum8(a03) + tail_dot(w3, DS_DTYPE_F32, x0, k8, K);
    o1[0] = hsum8(a10) + tail_dot(w0, DS_DTYPE_F32, x1, k8, K);
    o1[1] = hsum8(a11) + tail_dot(w1, DS_DTYPE_F32, x1, k8, K);
    o1[2] = hsum8(a12) + tail_dot(w2, DS_DTYPE_F32, x1, k8, K);
    o1[3] = hsum8(a13) + tail_dot(w3, DS_DTYPE_F32, x1, k8, K);
}

float ds_cpu_dot(const float *x, const float *y, int64_t n) {
    return gemv_row1(x, y, DS_DTYPE_F32, n);
}

void ds_cpu_axpy(float a, const float *x, float *y, int64_t n) {
    __m256 av = _mm256_set1_ps(a);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(y + i,
                         _mm256_fmadd_ps(av, _mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
    for (; i < n; i++) y[i] += a * x[i];
}

#else /* portable path: the same 8-lane order in plain C (GCC vectorises the lane loops) */

static inline float hsum_lanes(const float *l) {
    return ((l[0] + l[4]) + (l[2] + l[6])) + ((l[1] + l[5]) + (l[3] + l[7]));
}

static float dot_row(const float *x, const void *wrow, ds_dtype dt, int64_t K) {
    float acc[8] = {0};
    int64_t k8 = K & ~(int64_t)7;
    for (int64_t k = 0; k < k8; k += 8)
        for (int l = 0; l < 8; l++) acc[l] += load1(wrow, k + l, dt) * x[k + l];
    return hsum_lanes(acc) + tail_dot(wrow, dt, x, k8, K);
}

static void gemv(const float *x, const ds_tensor *w, int64_t row0, int64_t n_rows, float *out) {
    DS_ASSERT(w->dtype == DS_DTYPE_BF16 || w->dtype == DS_DTYPE_F16 || w->dtype == DS_DTYPE_F32);
    int64_t K = w->ne[w->ndim - 1];
    for (int64_t o = 0; o < n_rows; o++) out[o] = dot_row(x, row_ptr(w, row0 + o), w->dtype, K);
}

static void tile_2x4(const float *x0, const float *x1, const float *w, int64_t K, float *o0,
                     float *o1) {
    for (int n = 0; n < 4; n++) {
        o0[n] = dot_row(x0, w + n * K, DS_DTYPE_F32, K);
        o1[n] = dot_row(x1, w + n * K, DS_DTYPE_F32, K);
    }
}

float ds_cpu_dot(const float *x, const float *y, int64_t n) {
    return dot_row(x, y, DS_DTYPE_F32, n);
}

void ds_cpu_axpy(float a, const float *x, float *y, int64_t n) {
    for (int64_t i = 0; i < n; i++) y[i] += a * x[i];
}

#endif

#if CPU_SIMD
void ds_cpu_scale(float a, float *y, int64_t n) {
    __m256 av = _mm256_set1_ps(a);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, _mm256_mul_ps(av, _mm256_loadu_ps(y + i)));
    for (; i < n; i++) y[i] *= a;
}
#else
void ds_cpu_scale(float a, float *y, int64_t n) {
    for (int64_t i = 0; i < n; i++) y[i] *= a;
}
#endif

/* Converts n rows of W starting at row0 to f32 [n, K]. */
static void convert_rows(const ds_tensor *w, int64_t row0, int64_t n, float *dst) {
    int64_t K = w->ne[w->ndim - 1];
    for (int64_t r = 0; r < n; r++) {
        const void *src = row_ptr(w, row0 + r);
        float *d = dst + r * K;
        switch (w->dtype) {
        case DS_DTYPE_BF16: {
            const uint16_t *s = src;
            for (int64_t k = 0; k < K; k++) d[k] = ds_bf16_to_f32(s[k]);
            break;
        }
        case DS_DTYPE_F32: memcpy(d, src, (size_t)K * sizeof(float)); break;
        default:
            for (int64_t k = 0; k < K; k++) d[k] = load1(src, k, w->dtype);
            break;
        }
    }
}

void ds_cpu_matmul_rows(const float *x, int64_t R, int64_t ldx, const ds_tensor *w, int64_t row0,
                        int64_t n_rows, float *out, int64_t ldo, float *scratch) {
    DS_ASSERT(w->dtype == DS_DTYPE_BF16 || w->dtype == DS_DTYPE_F16 || w->dtype == DS_DTYPE_F32);
    if (R == 1) {
        gemv(x, w, row0, n_rows, out);
        return;
    }
    int64_t K = w->ne[w->ndim - 1];
    for (int64_t b = 0; b < n_rows; b += DS_CPU_MATMUL_BLOCK) {
        int64_t nb = n_rows - b < DS_CPU_MATMUL_BLOCK ? n_rows - b : DS_CPU_MATMUL_BLOCK;
        convert_rows(w, row0 + b, nb, scratch);
        ds_tensor wf = {.data = scratch, .dtype = DS_DTYPE_F32, .ndim = 2, .ne = {nb, K}};
        int64_t r = 0;
        for (; r + 2 <= R; r += 2) {
            const float *x0 = x + r * ldx, *x1 = x0 + ldx;
            float *o0 = out + r * ldo + b, *o1 = o0 + ldo;
            int64_t n = 0;
            for (; n + 4 <= nb; n += 4) tile_2x4(x0, x1, scratch + n * K, K, o0 + n, o1 + n);
            if (n < nb) {
                gemv(x0, &wf, n, nb - n, o0 + n);
                gemv(x1, &wf, n, nb - n, o1 + n);
            }
        }
        for (; r < R; r++) gemv(x + r * ldx, &wf, 0, nb, out + r * ldo + b);
    }
}

/* ---- the multi-threaded linear over the parts ------------------------------------------------ */

#define LINEAR_TASK_ROWS 16 /* weight rows per task unit: 64 KiB of bf16 at K = 2048 */

typedef struct linear_job {
    ds_cpu *cpu;
    const float *x;
    int64_t R, ldx, ldo;
    const ds_linear *w;
    float *out;
    int64_t unit_start[DS_LINEAR_MAX_PARTS + 1]; /* first task unit of each part */
    int64_t col_start[DS_LINEAR_MAX_PARTS];      /* first output column of each part */
} linear_job;

static void linear_task(void *ctx, int64_t begin, int64_t end, int tid) {
    linear_job *j = ctx;
    float *scratch = NULL;
    if (j->R > 1) {
        scratch = ds_cpu_scratch(j->cpu, tid, DS_CPU_SCRATCH_KERNEL,
                                 (size_t)DS_CPU_MATMUL_BLOCK * (size_t)j->w->n_in);
    }
    int p = 0;
    for (int64_t u = begin; u < end;) {
        while (u >= j->unit_start[p + 1]) p++;
        const ds_tensor *part = &j->w->parts[p];
        int64_t u_end = end < j->unit_start[p + 1] ? end : j->unit_start[p + 1];
        int64_t r0 = (u - j->unit_start[p]) * LINEAR_TASK_ROWS;
        int64_t r1 = (u_end - j->unit_start[p]) * LINEAR_TASK_ROWS;
        if (r1 > part->ne[0]) r1 = part->ne[0];
        ds_cpu_matmul_rows(j->x, j->R, j->ldx, part, r0, r1 - r0, j->out + j->col_start[p] + r0,
                           j->ldo, scratch);
        u = u_end;
    }
}

void ds_cpu_linear_f32(ds_cpu *cpu, const float *x, int64_t R, int64_t ldx, const ds_linear *w,
                       float *out, int64_t ldo) {
    DS_ASSERT(w->n_parts >= 1 && w->n_parts <= DS_LINEAR_MAX_PARTS);
    if (R <= 0) return;
    linear_job j = {.cpu = cpu, .x = x, .R = R, .ldx = ldx, .ldo = ldo, .w = w, .out = out};
    int64_t units = 0, cols = 0;
    for (int p = 0; p < w->n_parts; p++) {
        const ds_tensor *t = &w->parts[p];
        DS_ASSERT(t->ndim == 2 && t->ne[1] == w->n_in);
        j.unit_start[p] = units;
        j.col_start[p] = cols;
        units += (t->ne[0] + LINEAR_TASK_ROWS - 1) / LINEAR_TASK_ROWS;
        cols += t->ne[0];
    }
    DS_ASSERT(cols == w->n_out);
    j.unit_start[w->n_parts] = units;
    /* Few units per chunk at decode (balance), more when many rows share each unit. */
    int64_t chunk = ds_threadpool_chunk(cpu->pool, units, 1);
    ds_threadpool_for(cpu->pool, units, chunk, linear_task, &j);
}

void ds_cpu_op_linear(ds_backend *be, const ds_tensor *x, const ds_linear *w, ds_tensor *out) {
    DS_ASSERT(x->dtype == DS_DTYPE_F32 && out->dtype == DS_DTYPE_F32);
    int64_t K = x->ne[x->ndim - 1];
    DS_ASSERT(K == w->n_in && out->ne[out->ndim - 1] == w->n_out);
    int64_t R = ds_tensor_numel(x) / K;
    DS_ASSERT(ds_tensor_numel(out) >= R * w->n_out); /* R comes from x; out may be a larger view */
    ds_cpu_linear_f32(ds_cpu_of(be), x->data, R, K, w, out->data, w->n_out);
}

void ds_cpu_op_logits(ds_backend *be, const ds_tensor *x, const ds_linear *lm_head,
                      ds_tensor *out) {
    ds_cpu_op_linear(be, x, lm_head, out); /* activations are already F32 on the CPU */
}
