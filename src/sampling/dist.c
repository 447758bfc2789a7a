#include "sampling/dist.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/status.h"
#include "sampling/select.h"

static inline float fast_expf(float x) {
    const float lo = -87.0f, hi = 88.0f;
    float xc = x < lo ? lo : (x > hi ? hi : x);
    /* exp(x) = 2^n · exp(r), n = round(x / ln 2), r = x - n ln 2 with ln 2 split in two so
     * n · C1 is exact (Cody–Waite); exp(r) on |r| ≤ ln2/2 by the Cephes expf polynomial. */
    /* round to nearest by the 1.5·2^23 trick: floorf does not vectorise without fast-math */
    float n = (xc * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
    float r = xc - n * 0.693359375f;
    r = r + n * 2.12194440e-4f;
    float r2 = r * r;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r2 + r + 1.0f;
    uint32_t bits = (uint32_t)((int32_t)n + 127) << 23;
    float scale;
    memcpy(&scale, &bits, sizeof scale);
    return x < lo ? 0.0f : p * scale;
}

float ds_fast_expf(float x) { return fast_expf(x); }

/* Loops over the vocabulary run in blocks of DS_LANES with a constant inner trip count: GCC's
 * -O2 ("very cheap") vectoriser only takes loops that need no epilogue. */
#define DS_LANES 16

/* Sum in double with DS_LANES independent accumulators (fixed order: deterministic). */
static double sum_f32(const float *x, int n) {
    double a[DS_LANES] = {0};
    int i = 0;
    for (; i + DS_LANES <= n; i += DS_LANES)
        for (int j = 0; j < DS_LANES; j++) a[j] += (double)x[i + j];
    for (; i < n; i++) a[0] += (double)x[i];
    double s = 0.0;
    for (int j = 0; j < DS_LANES; j++) s += a[j];
    return s;
}

/* Whether any of the DS_LANES values at x exceeds (or reaches) thr: a vectorised test that lets
 * the scalar selection loops skip whole blocks once their threshold has settled. */
static inline bool block_any_gt(const float *x, float thr) {
    int any = 0;
    for (int j = 0; j < DS_LANES; j++) any |= x[j] > thr;
    return any != 0;
}
static inline bool block_any_ge(const float *x, float thr) {
    int any = 0;
    for (int j = 0; j < DS_LANES; j++) any |= x[j] >= thr;
    return any != 0;
}

static void heap_offer(float *heap, int *size, int k, float v) {
    if (!(v > -INFINITY)) return;
    if (*size < k) {
        int j = (*size)++;
        while (j > 0 && heap[(j - 1) / 2] > v) {
            heap[j] = heap[(j - 1) / 2];
            j = (j - 1) / 2;
        }
        heap[j] = v;
    } else if (v > heap[0]) {
        int j = 0;
        for (;;) {
            int c = 2 * j + 1;
            if (c >= k) break;
            if (c + 1 < k && heap[c + 1] < heap[c]) c++;
            if (!(heap[c] < v)) break;
            heap[j] = heap[c];
            j = c;
        }
        heap[j] = v;
    }
}

double ds_logsumexp(const float *x, int n, float m) {
    double a[DS_LANES] = {0};
    int i = 0;
    for (; i + DS_LANES <= n; i += DS_LANES)
        for (int j = 0; j < DS_LANES; j++) a[j] += (double)fast_expf(x[i + j] - m);
    for (; i < n; i++) a[0] += (double)fast_expf(x[i] - m);
    double s = 0.0;
    for (int j = 0; j < DS_LANES; j++) s += a[j];
    return (double)m + log(s);
}

/* k-th largest finite value of x (k < number of values > -inf), with a size-k min-heap. */
static float kth_largest(const float *x, int n, int k) {
    float heap[DS_DIST_HEAP_MAX];
    int size = 0;
    int i = 0;
    for (; i + DS_LANES <= n; i += DS_LANES) {
        /* until the heap is full its top is not a threshold */
        if (size == k && !block_any_gt(x + i, heap[0])) continue;
        for (int j = 0; j < DS_LANES; j++) heap_offer(heap, &size, k, x[i + j]);
    }
    for (; i < n; i++) heap_offer(heap, &size, k, x[i]);
    DS_ASSERT(size == k);
    return heap[0];
}

typedef struct {
    float logit;
    float w;
    int idx;
} compact_item;

static int compact_cmp(const void *a, const void *b) {
    const compact_item *x = a, *y = b;
    if (x->logit != y->logit) return x->logit > y->logit ? -1 : 1;
    return (x->idx > y->idx) - (x->idx < y->idx);
}

/* top_k ≤ DS_DIST_HEAP_MAX: gather the survivors; false if ties overflow the list. */
static bool build_compact(ds_dist *d, const float *x, int n, const ds_dist_params *p,
                          float max_logit) {
    const float kth = kth_largest(x, n, p->top_k);
    const float inv_t = 1.0f / p->temperature;
    int m = 0;
    for (int i = 0; i < n; i++) {
        if ((i & (DS_LANES - 1)) == 0 && i + DS_LANES <= n && !block_any_ge(x + i, kth)) {
            i += DS_LANES - 1;
            continue;
        }
        if (!(x[i] >= kth)) continue; /* ties with the k-th value stay (vLLM) */
        float w = fast_expf((x[i] - max_logit) * inv_t);
        if (!(w >= p->min_p) || !(w > 0.0f)) continue;
        if (m == DS_DIST_COMPACT_MAX) return false;
        d->idx[m] = i;
        d->w[m] = w;
        d->logit[m] = x[i];
        m++;
    }
    DS_ASSERT(m > 0); /* the max survives: weight exactly 1 */
    d->compact = true;
    d->n = m;
    d->total = 0.0;
    if (p->top_p < 1.0f) {
        compact_item items[DS_DIST_COMPACT_MAX];
        for (int j = 0; j < m; j++) items[j] = (compact_item){d->logit[j], d->w[j], d->idx[j]};
        qsort(items, (size_t)m, sizeof items[0], compact_cmp);
        double all = 0.0;
        for (int j = 0; j < m; j++) all += (double)items[j].w;
        const double target = (double)p->top_p * all;
        int keep = 0;
        double cum = 0.0;
        while (keep < m && cum < target) cum += (double)items[keep++].w;
        for (int j = 0; j < keep; j++) {
            d->idx[j] = items[j].idx;
            d->w[j] = items[j].w;
            d->logit[j] = items[j].logit;
        }
        d->n = keep;
        d->total = cum;
    } else {
        for (int j = 0; j < m; j++) d->total += (double)d->w[j];
    }
    return true;
}

static void build_full(ds_dist *d, float *x, int n, const ds_dist_params *p, float max_logit,
                       int n_live) {
    d->compact = false;
    d->n = 0;
    float kth = -INFINITY;
    if (p->top_k > 0 && p->top_k < n_live) {
        double above, at;
        kth = ds_float_from_order_key(
            ds_select_desc(x, (size_t)n, DS_SELECT_COUNT, (double)p->top_k, &above, &at));
    }
    /* Temperature + softmax numerator with the best token at exactly 1, so min_p is simply
     * w >= min_p (vLLM: p >= min_p · p_max). Branch-free so it vectorises. */
    const float inv_t = 1.0f / p->temperature;
    const float min_p = p->min_p;
    int i = 0;
    for (; i + DS_LANES <= n; i += DS_LANES)
        for (int j = 0; j < DS_LANES; j++) {
            float v = x[i + j];
            float w = fast_expf((v - max_logit) * inv_t);
            x[i + j] = (v >= kth && w >= min_p) ? w : 0.0f;
        }
    for (; i < n; i++) {
        float v = x[i];
        float w = fast_expf((v - max_logit) * inv_t);
        x[i] = (v >= kth && w >= min_p) ? w : 0.0f;
    }
    double total = sum_f32(x, n);
    if (p->top_p < 1.0f) {
        /* Keep the smallest top set whose mass reaches top_p · total (vLLM masks tokens whose
         * strictly-better mass is already >= p); ties at the boundary weight join in id order. */
        const double target = (double)p->top_p * total;
        double acc, at;
        const uint32_t kp = ds_select_desc(x, (size_t)n, DS_SELECT_MASS, target, &acc, &at);
        float wk;
        memcpy(&wk, &kp, sizeof wk);
        for (i = 0; i + DS_LANES <= n; i += DS_LANES)
            for (int j = 0; j < DS_LANES; j++) x[i + j] = x[i + j] >= wk ? x[i + j] : 0.0f;
        for (; i < n; i++) x[i] = x[i] >= wk ? x[i] : 0.0f;
        if (at > (double)wk * 1.5) {
            /* Several tokens share the boundary weight: they join in id order, each while the
             * mass before it is still short of the target. */
            for (i = 0; i < n; i++) {
                if (x[i] != wk) continue;
                if (acc < target)
                    acc += (double)wk;
                else
                    x[i] = 0.0f;
            }
        }
        total = sum_f32(x, n);
    }
    DS_ASSERT(total > 0.0);
    d->total = total;
}

void ds_dist_build(ds_dist *d, float *x, int n, const ds_dist_params *p, float max_logit,
                   int n_live) {
    if (p->top_k > 0 && p->top_k <= DS_DIST_HEAP_MAX && p->top_k < n_live &&
        build_compact(d, x, n, p, max_logit))
        return;
    build_full(d, x, n, p, max_logit, n_live);
}

int ds_dist_draw(const ds_dist *d, const float *x, int n, double u) {
    const double target = u * d->total;
    double cum = 0.0;
    int last = -1;
    if (d->compact) {
        for (int j = 0; j < d->n; j++) {
            if (!(d->w[j] > 0.0f)) continue;
            cum += (double)d->w[j];
            last = d->idx[j];
            if (cum > target) break;
        }
    } else {
        /* Blocks of 16 are skipped by their float sum, so the dependent double additions run
         * once per block instead of once per token. */
        int i = 0, last_block = -1;
        for (; i + DS_LANES <= n; i += DS_LANES) {
            const float *b = x + i;
            float s = (((b[0] + b[1]) + (b[2] + b[3])) + ((b[4] + b[5]) + (b[6] + b[7]))) +
                      (((b[8] + b[9]) + (b[10] + b[11])) + ((b[12] + b[13]) + (b[14] + b[15])));
            if (!(s > 0.0f)) continue;
            last_block = i;
            if (cum + (double)s <= target) {
                cum += (double)s;
                continue;
            }
            for (int j = 0; j < DS_LANES; j++) {
                if (!(b[j] > 0.0f)) continue;
                cum += (double)b[j];
                last = i + j;
                if (cum > target) return last;
            }
        }
        for (; i < n; i++) {
            if (!(x[i] > 0.0f)) continue;
            cum += (double)x[i];
            last = i;
            if (cum > target) return last;
        }
        /* Rounding ran past the end: the last surviving token. */
        if (last < 0 && last_block >= 0)
            for (int j = 0; j < DS_LANES; j++)
                if (x[last_block + j] > 0.0f) last = last_block + j;
    }
    DS_ASSERT(last >= 0); /* rounding past the end lands on the last survivor */
    return last;
}

void ds_dist_write_probs(const ds_dist *d, float *x, int n) {
    const double inv = 1.0 / d->total;
    if (d->compact) {
        memset(x, 0, (size_t)n * sizeof *x);
        for (int j = 0; j < d->n; j++) x[d->idx[j]] = (float)((double)d->w[j] * inv);
    } else {
        for (int i = 0; i < n; i++) x[i] = (float)((double)x[i] * inv);
    }
}
