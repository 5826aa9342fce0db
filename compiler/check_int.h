/* check_int.h - private to the consistency checker (check.c, check_pipeline.c).
 *
 * check.h is the interface; this header is what the checker's two source
 * files share: the context every rule reads and writes, the reporting
 * helpers, checked arithmetic, and the pipeline entry points that check.c's
 * mgc_check_config() calls in order.  Nothing outside compiler/check*.c
 * includes it.
 *
 *   check.c           helpers, model, parallel grid, moe, run settings,
 *                     c->derived, mgc_check_config()
 *   check_pipeline.c  the stages and the microbatches that flow through
 *                     them: layout grammar and rules, even split, virtual
 *                     stages, the batch triple, schedule rules,
 *                     c->derived.stages
 *
 * Conventions.  A diagnostic points at the key the user should change: the
 * first of the involved keys that was given, in the order a rule lists them
 * (see mgc_check_pick()).  Values in messages say where they came from: "(8)"
 * when given, "(8, default)" or "(8, derived)" otherwise.  Every quantity
 * here is positive, so checked products return -1 on overflow.  Rules that
 * depend on a value an earlier rule rejected are skipped, so one mistake
 * gives one error, not a cascade. */
#ifndef MGC_CHECK_INT_H
#define MGC_CHECK_INT_H

#include <stddef.h>
#include <stdint.h>

#include "check.h"

#define KV_N   160 /* one "key (value, derived)" piece */
#define HINT_N 512
#define LIST_N 256

#define KEY(id) MGC_KEY_##id

#if defined(__GNUC__)
#define PRINTF_LIKE(a, b) __attribute__((format(printf, a, b)))
#else
#define PRINTF_LIKE(a, b)
#endif

/* The state of one mgc_check_config() run.  The *_ok flags record which
 * values later rules may trust. */
typedef struct mgc_check_ctx {
    mgc_config *c;         /* the config being checked; derived values are written here */
    mgc_diags *d;          /* where diagnostics go */
    int errors0;           /* d->errors on entry */
    int model_ok;          /* heads, groups, head_dim, ffn consistent */
    int hd_ok;             /* head_dim known */
    int g_ok;              /* num_query_groups divides heads */
    int grid_ok;           /* tensor, context, pipeline, data, world consistent */
    int pipe_ok;           /* stages known (even split or a valid layout) */
    int batch_ok;          /* micro, global, accumulation consistent */
    int moe;               /* num_experts > 0 */
    int sp;                /* effective sequence parallelism */
    mgc_layout_stage *lay; /* (nlay) parsed layout strings, NULL without a layout */
    int nlay;              /* entries in lay: strings in parallel.pipeline_layout */
} mgc_check_ctx;

/* ---- checked arithmetic and key lookups --------------------------------- */

/* a * b for non-negative a, b; -1 on overflow or a negative operand. */
static inline int64_t mgc_check_mul(int64_t a, int64_t b) {
    if (a < 0 || b < 0) return -1;
    if (a != 0 && b > INT64_MAX / a) return -1;
    return a * b;
}

static inline int64_t mgc_check_mul3(int64_t a, int64_t b, int64_t c) {
    int64_t ab = mgc_check_mul(a, b);
    return ab < 0 ? -1 : mgc_check_mul(ab, c);
}

/* Did the user set key (in the file or with --set)? */
static inline int mgc_check_given(const mgc_check_ctx *k, mgc_key key) {
    return k->c->given[key];
}

/* Where to point a diagnostic about key. */
static inline mgc_loc mgc_check_at(const mgc_check_ctx *k, mgc_key key) {
    return mgc_config_loc(k->c, key);
}

/* A position `off` bytes into a string value that starts at loc.  The loader
 * records where the value's node starts; see docs/validation.md on quotes. */
static inline mgc_loc mgc_check_inside(mgc_loc loc, int off) {
    if (loc.line > 0 && loc.col > 0) loc.col += off;
    return loc;
}

/* ---- reporting (check.c) ------------------------------------------------ */

/* The first of the listed keys the user gave, else the first listed.
 * Call as mgc_check_pick(k, 3, KEY(A), KEY(B), KEY(C)). */
mgc_key mgc_check_pick(const mgc_check_ctx *k, int n, ...);

/* "parallel.tensor (8)", "(8, default)" or "(8, derived)" in buf (KV_N bytes);
 * returns buf. */
const char *mgc_check_kv(char *buf, const mgc_check_ctx *k, mgc_key key, int64_t v);

/* Add an error or a warning at loc; hint may be NULL or empty. */
void mgc_check_error(mgc_check_ctx *k, mgc_loc loc, const char *hint, const char *fmt, ...)
    PRINTF_LIKE(4, 5);
void mgc_check_warning(mgc_check_ctx *k, mgc_loc loc, const char *hint, const char *fmt, ...)
    PRINTF_LIKE(4, 5);

/* Append printf text to buf (size n), truncating safely. */
void mgc_check_cat(char *buf, size_t n, const char *fmt, ...) PRINTF_LIKE(3, 4);

/* Nearest multiples of `unit` around `x`: "504 or 528", or just the next. */
void mgc_check_multiples(int64_t unit, int64_t x, char *buf, size_t n);

/* Does value v pass the rules a hint is about? */
typedef int (*mgc_check_fit_fn)(const mgc_check_ctx *k, int64_t v);

/* Values v in [lo, hi] with fit(k, v), at most `max` of them, the ones
 * nearest `target`, ascending, written as "1, 2, 4, 8".  Returns how many. */
int mgc_check_candidates(const mgc_check_ctx *k, mgc_check_fit_fn fit, int64_t lo, int64_t hi,
                         int64_t target, int max, char *buf, size_t n);

/* ---- pipeline, batch and schedule (check_pipeline.c) -------------------- */

/* The stages: the explicit layout when given (parsed into k->lay), else the
 * even split; then virtual stages, the schedule and microbatch_group_size.
 * Sets k->pipe_ok.  Runs after the parallel grid, before the batch. */
void mgc_check_derive_pipeline(mgc_check_ctx *k);

/* The batch triple: whichever of micro_batch_size, global_batch_size and
 * gradient_accumulation_steps was not given, from the others and data.  Sets
 * k->batch_ok; needs k->grid_ok. */
void mgc_check_derive_batch(mgc_check_ctx *k);

/* Microbatches against the schedule: the interleaving rule and the pipeline
 * bubble warning.  Runs after the batch is derived. */
void mgc_check_schedule(mgc_check_ctx *k);

/* c->derived.stages and num_stages in model order, when k->pipe_ok. */
void mgc_check_fill_stages(mgc_check_ctx *k);

#endif /* MGC_CHECK_INT_H */
