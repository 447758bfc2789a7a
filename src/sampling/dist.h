/* dist.h — from processed logits to the distribution that is sampled (internal to sampling/).
 *
 * Temperature, min_p, top_k and top_p, vLLM v1 order and semantics, in O(V) with no sort of the
 * vocabulary. Two representations:
 *  - compact: when top_k is small (≤ DS_DIST_HEAP_MAX) the survivors are gathered into a short
 *    list (found with a size-k heap in one pass), exponentiated, sorted and cut by top_p there;
 *    only k exps are computed.
 *  - full: otherwise the weights are written over the logits array (0 = excluded) and top_k /
 *    top_p thresholds come from radix selection (select.h).
 * Both keep the best token at weight exactly 1 (logits shifted by their max) and never
 * normalise; `total` is the sum of the surviving weights. */
#ifndef DS_SAMPLING_DIST_H
#define DS_SAMPLING_DIST_H

#include <stdbool.h>

#define DS_DIST_HEAP_MAX 1024    /* largest top_k served by the heap + compact path */
#define DS_DIST_COMPACT_MAX 2048 /* survivors the compact list holds (k plus ties) */

typedef struct ds_dist_params {
    float temperature; /* > 0 */
    int top_k;         /* ≤ 0 = off */
    float top_p;       /* (0, 1] */
    float min_p;       /* [0, 1] */
} ds_dist_params;

/* ~24 KB: callers keep it on the stack of the engine thread. */
typedef struct ds_dist {
    bool compact;
    int n;                           /* compact: entries in idx/w */
    int idx[DS_DIST_COMPACT_MAX];    /* compact: token ids */
    float w[DS_DIST_COMPACT_MAX];    /* compact: weights (0 = cut by min_p / top_p) */
    float logit[DS_DIST_COMPACT_MAX];/* compact: the processed logits, for the top_p order */
    double total;                    /* sum of surviving weights, > 0 */
} ds_dist;

/* x: [n] processed logits, NaN-free with -0 canonicalised, max_logit finite and n_live ≥ 1
 * entries > -inf. In full mode x is overwritten with the weights; in compact mode x is left
 * alone. */
void ds_dist_build(ds_dist *d, float *x, int n, const ds_dist_params *p, float max_logit,
                   int n_live);

/* Inverse CDF: the token whose cumulative weight first exceeds u · total (u in [0, 1)). */
int ds_dist_draw(const ds_dist *d, const float *x, int n, double u);

/* Writes the normalised distribution over x[0..n). */
void ds_dist_write_probs(const ds_dist *d, float *x, int n);

/* exp(x) for float x: Cephes-style range reduction + degree-6 polynomial, relative error
 * < 2e-7 over [-87, 88], 0 below -87; plain C that the compiler vectorises (glibc expf is a
 * call per element). */
float ds_fast_expf(float x);

/* log Σ exp(x[i]) over x[0..n) (-inf entries contribute 0), given m = max x (finite): the
 * log_softmax normaliser for the reported logprobs. */
double ds_logsumexp(const float *x, int n, float m);

#endif
