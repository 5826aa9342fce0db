/* calibrate.h - `mgc calibrate`: fit a hardware profile's efficiency factors
 * to measured times, so the cost model's predictions improve with every run.
 *
 *   mgc calibrate PLAN PROFILE.jsonl [--hardware NAME] [--name NEW] [-o OUT.yaml]
 *       per-op fit from `mgc-run --profile` (docs/runtime.md#profiling)
 *   mgc calibrate PLAN --step-time SECONDS [--hardware NAME] [--name NEW] [-o OUT.yaml]
 *       one factor on every compute efficiency from a measured step time
 *
 * docs/cost-model.md#calibration is the manual. */
#ifndef MGC_CALIBRATE_H
#define MGC_CALIBRATE_H

#include <stddef.h>

#include "cost.h"
#include "hwprofile.h"
#include "plan.h"

#ifdef __cplusplus
extern "C" {
#endif

/* One measured op or instruction, as read from a profile file. */
typedef struct mgc_calib_sample {
    int64_t stage, chunk, index; /* chunk program position (ops) */
    int bwd;                     /* 0 fwd, 1 bwd (ops) */
    int instr;                   /* mgc_instr_op + 1 for instruction records, 0 for ops */
    uint32_t arg;                /* instruction arg (bucket) */
    double mean_s;               /* measured seconds per call */
    double calls;                /* how many calls the mean is over (its weight) */
    char kind[32];               /* op records: the op's kind as recorded ("linear"); "" unchecked */
} mgc_calib_sample;

/* The factors a fit changes, the rest of the profile kept. */
typedef enum mgc_calib_factor {
    MGC_CALIB_GEMM = 0,
    MGC_CALIB_ATTENTION_FWD,
    MGC_CALIB_ATTENTION_BWD,
    MGC_CALIB_MEMORY,
    MGC_CALIB_NVLINK,
    MGC_CALIB_NETWORK,
    MGC_CALIB__COUNT
} mgc_calib_factor;

typedef struct mgc_calib_fit {
    int64_t samples[MGC_CALIB__COUNT];   /* records that inform each factor */
    double measured_s[MGC_CALIB__COUNT]; /* their measured time, weighted by calls */
    double before_s[MGC_CALIB__COUNT];   /* predicted with the input profile */
    double after_s[MGC_CALIB__COUNT];    /* predicted with the fitted profile */
    double old_eff[MGC_CALIB__COUNT], new_eff[MGC_CALIB__COUNT];
} mgc_calib_fit;

/* Fit `hw` in place from samples of plan p.  Factors without samples keep
 * their value.  0 ok; -1 with a message in err (no usable sample, or an op
 * record whose kind is not the plan's op at its position: another plan's). */
int mgc_calibrate_ops(const mgc_plan *p, const mgc_calib_sample *s, int64_t n, mgc_hw *hw, mgc_calib_fit *fit,
                      char *err, size_t errsz);

/* Scale every compute efficiency (gemm, attention, memory) by one factor so
 * that the predicted step of p equals step_s; *factor receives it.  0 ok; -1
 * with err when no factor in range reaches it (e.g. communication alone takes
 * longer than step_s). */
int mgc_calibrate_step(const mgc_plan *p, double step_s, mgc_hw *hw, double *factor, char *err, size_t errsz);

/* The commands: `mgc calibrate`, and `mgc profile PLAN PROFILE.jsonl
 * [--copy-gbs X] [--gemm-tflops Y] [--hardware NAME]`, a markdown table of
 * each kernel kind's measured time, achieved bandwidth and FLOP/s against
 * the device's ceilings (measured ones when given, else the profile's). */
int mgc_cmd_calibrate(int argc, char **argv);
int mgc_cmd_profile(int argc, char **argv);

#ifdef __cplusplus
}
#endif
#endif /* MGC_CALIBRATE_H */
