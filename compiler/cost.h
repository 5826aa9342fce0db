/* cost.h - the cost model: how long a plan's training step takes on a target.
 *
 * Everything is derived from the plan (so `mgc inspect` predicts from a plan
 * file alone) and a hardware profile (hwprofile.h):
 *   - every compute op of every chunk program: GEMMs by shape (a wave-
 *     quantised, depth-dependent efficiency curve under a roofline), memory-
 *     bound kernels by bytes moved, attention by FLOPs at its own efficiency;
 *   - every collective by algorithm (ring or tree, whichever is faster, as
 *     NCCL's tuner picks), alpha-beta over NVLink or the network depending on
 *     where the group's ranks sit (rank layout of plan.h, gpus_per_node);
 *   - pipeline transfers as point-to-point alpha-beta;
 *   - the step: every pipeline rank's instruction stream simulated together
 *     (schedule.h) with those durations; data-parallel gradient reductions run
 *     on their own stream beside the backward (bucket b starts when the last
 *     backward that writes it ends), the optimizer waits for all of them.
 * docs/cost-model.md is the manual: formulas, defaults and blind spots.
 *
 *     mgc_hw hw;  mgc_hw_load("h100-sxm", &hw, &diags);
 *     mgc_cost_options o = {.hw = &hw};
 *     mgc_cost_report r;
 *     if (mgc_cost_plan(plan, &o, &r, err, sizeof err) == 0)
 *         printf("%.0f tokens/s, MFU %.1f%%\n", r.tokens_per_s, 100 * r.mfu);
 *
 * Deterministic, allocation-light, no I/O: sweeps call it thousands of times. */
#ifndef MGC_COST_H
#define MGC_COST_H

#include <stddef.h>
#include <stdio.h>
#include <stdint.h>

#include "hwprofile.h"
#include "json.h"
#include "plan.h"

#ifdef __cplusplus
extern "C" {
#endif

/* What an op's or instruction's time is charged to. */
typedef enum mgc_cost_class {
    MGC_COST_GEMM = 0,   /* linear / grouped linear forward, dgrad, wgrad */
    MGC_COST_ATTENTION,  /* flash attention forward and backward */
    MGC_COST_MEMORY,     /* every other compute kernel: norms, pointwise, embedding, loss, MoE */
    MGC_COST_TP_COMM,    /* collectives inside chunk programs (TP, SP, CP, EP) */
    MGC_COST_P2P,        /* pipeline sends and receives */
    MGC_COST_DP_COMM,    /* gradient reductions, parameter gathers, tied-embedding sum */
    MGC_COST_OPTIMIZER,  /* grad norm, clip, AdamW */
    MGC_COST__COUNT
} mgc_cost_class;

/* "gemm", "attention", "memory", "tp_comm", "p2p", "dp_comm", "optimizer". */
const char *mgc_cost_class_name(mgc_cost_class c);

typedef struct mgc_cost_options {
    const mgc_hw *hw;      /* required */
    int64_t gpus_per_node; /* 0: the plan's hardware.gpus_per_node, else the profile's */
    int no_grad_overlap;   /* 1: gradient reductions wait for the whole backward (exposed) */
} mgc_cost_options;

typedef struct mgc_cost_report {
    /* the step */
    double step_s;              /* predicted time of one training step */
    double tokens_per_s;        /* global batch tokens / step_s */
    double model_flops;         /* per step, the model convention (plan->model_flops_per_iter) */
    double hardware_flops;      /* per step, every GEMM and attention FLOP executed (recompute too) */
    double model_tflops_per_gpu;    /* model_flops / step_s / world / 1e12 */
    double hardware_tflops_per_gpu; /* hardware_flops / step_s / world / 1e12 */
    double mfu;                 /* model_tflops_per_gpu / peak of the compute dtype */
    double hfu;                 /* hardware_tflops_per_gpu / peak */
    double energy_j;            /* power_w * world * step_s */
    /* the critical pipeline rank: the one that finishes last */
    int64_t critical_rank;
    double compute_s;           /* its time in compute kernels (all classes but comm) */
    double comm_s;              /* its communication, all of it (own durations) */
    double exposed_comm_s;      /* the part of comm_s no compute hides */
    double comm_compute_ratio;  /* comm_s / compute_s */
    double bubble_s;            /* its idle time: waiting on other pipeline ranks */
    double bubble_fraction;     /* bubble_s / step_s */
    double by_class_s[MGC_COST__COUNT]; /* its time per class, per step */
    /* memory */
    uint64_t max_arena_bytes;   /* the largest arena of any pipeline rank */
    double memory_fraction;     /* max_arena_bytes / hw->memory_bytes */
    int64_t gpus_per_node, nodes;
    int grad_overlap;           /* 1 when reductions overlap the backward */
} mgc_cost_report;

/* Predict one step.  0 on success; -1 with a one-line message in err for a
 * plan the model cannot cost (a missing profile field, a broken plan). */
int mgc_cost_plan(const mgc_plan *p, const mgc_cost_options *o, mgc_cost_report *out, char *err,
                  size_t errsz);

/* Predicted seconds of one op of `stage`'s chunk program (per microbatch),
 * and its class in *cls (may be NULL).  Collectives use the group layout of
 * the stage's first rank.  For calibration and per-op listings. */
double mgc_cost_op(const mgc_plan *p, int64_t stage, const mgc_plan_chunk *ch, const mgc_plan_op *op,
                   const mgc_cost_options *o, mgc_cost_class *cls);

/* Predicted seconds of one instruction of `stage`'s stream, outside its chunk
 * programs (FORWARD/BACKWARD give the sum of their ops). */
double mgc_cost_instr(const mgc_plan *p, int64_t stage, const mgc_instr *in, const mgc_cost_options *o,
                      mgc_cost_class *cls);

/* Bytes an op moves by the model's count: its input and output tensors
 * (local shards; dropless expert rows at the part balanced routing fills,
 * plan.h MGC_PT_ROUTED), the quantity memory-bound kernels are costed by. */
double mgc_cost_op_bytes(const mgc_plan *p, const mgc_plan_chunk *ch, const mgc_plan_op *op);

/* 1 when the group of kind `group` (mgc_group_kind) of stage `stage`'s first
 * rank spans more than one node (its collectives use the network), else 0. */
int mgc_cost_group_spans_nodes(const mgc_plan *p, int64_t stage, int group, const mgc_cost_options *o);

/* Human-readable report (a few lines, for mgc compile / inspect). */
void mgc_cost_print_text(const mgc_cost_report *r, const mgc_hw *hw, FILE *out);
/* The same as a JSON object member `key` (e.g. "predicted"). */
void mgc_cost_print_json(const mgc_cost_report *r, const mgc_hw *hw, mgc_json *j, const char *key);

#ifdef __cplusplus
}
#endif
#endif /* MGC_COST_H */
