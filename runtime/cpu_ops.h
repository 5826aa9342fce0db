/* cpu_ops.h - the CPU reference kernels: every op forward and backward.
 *
 * Plain C over a `real` type, compiled twice: the `_f32` functions are the CPU backend, the
 * `_f64` ones the same code in double, used by the gradient checks (tests/test_cpu_ops.c).
 * The per-op declarations live in cpu_ops_api.h (included here once per type); the
 * implementations in cpu_ops_tmpl.h (included by cpu_ops.c once per type).
 *
 * Conventions (docs/cpu-backend.md has the math of every op):
 *  - layout is sequence-first like Megatron: activations are (s, b, ...) row-major, so a
 *    "row" (token) is r = i*b + j for sequence position i and batch entry j; ops that do
 *    not care about positions take n = s*b rows.
 *  - activation outputs and activation gradients are written (=); parameter gradients are
 *    accumulated (+=) so microbatches add up in the main grad.
 *  - no globals, no threads, no allocation inside a kernel (scratch is an argument),
 *    fixed reduction order: the same inputs give the same bits.
 *  - positions: `pos` arrays (s) give each sequence row's absolute position (context
 *    parallelism hands a rank non-contiguous rows); NULL means 0..s-1.
 *  - GEMMs go to BLAS (cblas_sgemm / cblas_dgemm); everything else is loops. */
#ifndef MGC_CPU_OPS_H
#define MGC_CPU_OPS_H

#include <stdint.h>

#include "rng.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Router score functions (moe_route). */
typedef enum mgc_router_score {
    MGC_ROUTER_SOFTMAX = 0, /* top-k of the logits, softmax over the k chosen (Megatron default) */
    MGC_ROUTER_SOFTMAX_PRE = 1, /* softmax over all E, then the top-k probabilities (pre-softmax) */
    MGC_ROUTER_SIGMOID = 2,     /* sigmoid, top-k, normalised over the k chosen when k > 1 */
} mgc_router_score;

/* How the router chooses its experts beyond the plain top-k of the logits (moe_route):
 * - groups > 0: group-limited routing. The E experts form `groups` equal groups of consecutive
 *   indices; a group's score is the sum of its top k / group_topk scores (descending, added in
 *   that order); a token chooses among the experts of its `group_topk` best groups only (ties
 *   to the lower group index);
 * - bias (E) not NULL: the aux-loss-free expert bias, added to the sigmoid scores for choosing
 *   (groups and experts) and nowhere else: the weights stay the unbiased scores.
 * The scores compared are the score function's: logits (softmax over the chosen), the
 * probabilities exp(l - lse) (pre-softmax) or sigmoid(l) (+ bias). */
typedef struct mgc_router_choice {
    int64_t groups;     /* 0: no group limit */
    int64_t group_topk; /* groups a token may use (1 <= group_topk <= groups, <= k) */
    const float *bias;  /* (E) or NULL */
} mgc_router_choice;

/* Token-drop policy when a capacity is set (moe_dispatch). */
typedef enum mgc_drop_policy {
    MGC_DROP_PROBS = 0,    /* each expert keeps its `capacity` highest-probability assignments */
    MGC_DROP_POSITION = 1, /* each expert keeps its first `capacity` assignments in token order */
} mgc_drop_policy;

/* mgc_dropout_rng: rng.h */

#define MGC_REAL     float
#define MGC_FN(name) name##_f32
#include "cpu_ops_api.h"
#undef MGC_REAL
#undef MGC_FN
#define MGC_REAL     double
#define MGC_FN(name) name##_f64
#include "cpu_ops_api.h"
#undef MGC_REAL
#undef MGC_FN

/* ---- optimizer and schedule (fp32 master state; not templated) ---------------------- */

typedef struct mgc_adamw_cfg {
    double beta1, beta2, eps; /* 0.9, 0.999, 1e-8 typically */
    double weight_decay;      /* decoupled: p -= lr * wd * p */
} mgc_adamw_cfg;

/* One AdamW step (step >= 1, 1-based, for the bias corrections) on n fp32 master weights:
 *   g = grad * grad_scale            (grad_scale: the clipping factor, 1 without clipping)
 *   m = b1 m + (1-b1) g;  v = b2 v + (1-b2) g^2
 *   p = p - lr * ( (m / (1-b1^step)) / (sqrt(v / (1-b2^step)) + eps) + wd * p )
 * with wd = 0 when apply_decay is 0 (norms, biases). State math in double per element. */
void mgc_cpu_adamw(float *param, const float *grad, float *m, float *v, int64_t n,
                   const mgc_adamw_cfg *cfg, int64_t step, double lr, double grad_scale,
                   int apply_decay);

/* Sum of squares of g[0..n) in double, in index order (fixed, deterministic). Sum these
 * over tensors (and ranks) in a fixed order, then take the square root for the norm. */
double mgc_cpu_sumsq(const float *g, int64_t n);

/* Clipping factor for a global norm: max_norm / (norm + 1e-6) when that is < 1, else 1
 * (Megatron's clip_grad_norm); max_norm <= 0 disables clipping. */
double mgc_cpu_clip_scale(double global_norm, double max_norm);

typedef enum mgc_lr_decay {
    MGC_LR_CONSTANT = 0,
    MGC_LR_LINEAR = 1,
    MGC_LR_COSINE = 2,
    MGC_LR_WSD = 3, /* warmup-stable-decay: max_lr until the last wsd_steps, then wsd_shape */
} mgc_lr_decay;

typedef enum mgc_lr_wsd_shape {
    MGC_LR_WSD_EXPONENTIAL = 0, /* 2 * 0.5^r - 1 */
    MGC_LR_WSD_LINEAR = 1,      /* 1 - r */
    MGC_LR_WSD_COSINE = 2,      /* (1 + cos(pi r)) / 2 */
    MGC_LR_WSD_MINUS_SQRT = 3,  /* 1 - sqrt(r) */
} mgc_lr_wsd_shape;

typedef struct mgc_lr_sched {
    double max_lr, min_lr;
    int64_t warmup_steps; /* lr = max_lr * step / warmup_steps for step < warmup_steps */
    int64_t decay_steps;  /* end of decay (counted from step 0, includes warmup) */
    mgc_lr_decay decay;   /* shape from max_lr at warmup_steps to min_lr at decay_steps */
    int64_t wsd_steps;    /* MGC_LR_WSD: the anneal's length, ending at decay_steps */
    mgc_lr_wsd_shape wsd_shape;
} mgc_lr_sched;

/* Learning rate at optimizer step `step` (0-based: the first step uses step 0). */
double mgc_cpu_lr(const mgc_lr_sched *s, int64_t step);

#ifdef __cplusplus
}
#endif
#endif
