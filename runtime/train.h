/* train.h - the training loop of mgc-run: one rank's steps (mgc_train_rank)
 * and a whole job of local ranks as threads of this process (mgc_train_local).
 *
 *     mgc_train_opts o = MGC_TRAIN_OPTS_INIT;
 *     o.iterations = 10;
 *     o.losses = losses;                         // (iterations) per-step losses out
 *     if (mgc_train_local(plan, data, 4, &o, err, sizeof err)) ... err ...;
 *
 * Rank 0 prints the progress lines and writes the metrics (docs/runtime.md).
 * With o.profiles set every rank measures its steps after o.profile_warmup
 * (exec.h, mgc_exec_set_profile) and hands its profile back in its slot. */
#ifndef MGC_TRAIN_H
#define MGC_TRAIN_H

#include <stdint.h>
#include <stdio.h>

#include "backend.h"
#include "comm.h"
#include "plan.h"
#include "profile.h"
#include "train_data.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct mgc_train_opts {
    size_t size;           /* sizeof(mgc_train_opts) */
    int64_t iterations;    /* steps to run; <= 0: the plan's training.iterations */
    int64_t log_interval;  /* <= 0: the plan's training.log_interval */
    int threads;           /* BLAS threads per rank; <= 0: 1 */
    FILE *log;             /* progress lines (rank 0); NULL: none */
    FILE *metrics;         /* JSON lines, one per step (rank 0); NULL: none */
    double *losses;        /* (iterations) per-step LM losses, or NULL */
    double *grad_norms;    /* (iterations) or NULL */
    int64_t timeout_ms;    /* communicator timeout; <= 0 default */
    const char *backend;   /* "cpu", "cuda" or "auto" (cuda when a GPU is visible); NULL: cpu */
    mgc_profile **profiles; /* (world size) or NULL: --profile.  A rank that succeeds stores its
                              profile in profiles[its world rank] (the caller frees it); each
                              rank writes only its own slot */
    int64_t profile_warmup; /* steps run before the profile records (0 <= it < iterations) */
    int graphs;             /* 1: CUDA graphs for the programs that qualify (mgc_exec_set_graphs) */
    /* Opens world rank `rank`'s backend in place of `backend` (programs that embed the
     * runtime, tests); NULL: by name.  Called in the rank's thread. */
    int (*open_backend)(void *ctx, int64_t rank, mgc_backend **out, char *err, size_t errsz);
    void *open_ctx;
    int no_grad_overlap;    /* 1: reduce gradient buckets in line (mgc_exec_set_grad_overlap) */
    int64_t *overlapped;    /* (iterations) buckets reduced beside the backward (rank 0's under
                               local ranks, this process's under MPI), or NULL */
    int no_send_overlap;    /* 1: pipeline transfers in line (mgc_exec_set_send_overlap) */
    /* Checkpoints (checkpoint.h, docs/checkpoints.md): the directory (NULL: the plan's
     * checkpoint.directory; "": none).  With one, the run resumes from its newest checkpoint,
     * runs to step `iterations` (counted from the job's start, not from the resumed step) and
     * saves every checkpoint.interval steps and after its last step. */
    const char *checkpoint_dir;
    int64_t *resumed_from;  /* out, or NULL: the step the run resumed from (0: none) */
    /* A checkpoint whose parameters the run starts from, with a fresh optimizer at step 1
     * (fine-tuning; any layout's checkpoint of the same model), or NULL.  A checkpoint in
     * checkpoint_dir takes precedence: the run is then resuming itself. */
    const char *init_from;
    /* A request to stop (a signal handler sets it), or NULL.  After each step the ranks agree
     * on it (one all-reduce): if any saw it set, every rank saves a checkpoint (when
     * checkpoints are on) and the run ends there, successfully. */
    volatile int *stop;
    int64_t *stopped_after; /* out, or NULL: the step a stop request ended the run after (0: none) */
    /* Evaluation (training.eval_interval > 0): the validation data
     * (mgc_train_data_open_validation with eval_iters x global batch samples), or NULL to
     * open it here; eval_losses (iterations, or NULL) gets the validation loss after each step
     * that evaluates (NaN after the others). */
    mgc_train_data *valid;
    double *eval_losses;
    /* out, or NULL: the test split's loss (the third part of data.split, eval_iters global
     * batches) after the run's last step, when it evaluates and the split holds a sample;
     * left alone otherwise */
    double *test_loss;
    /* A device communicator (exec.h mgc_exec_set_device_comm; docs/runtime.md): "nccl" (NCCL
     * on the CUDA backend, bootstrapped over the world), "local" (mgc_train_local only: a
     * moves-only local world beside the host one -- how the tests run this path on the CPU and
     * the emulator), NULL or "none": every collective through the world. */
    const char *device_comm;
    /* out, or NULL: (iterations x model.num_layers x moe.num_experts) the tokens each expert
     * of each layer processed at each step (mgc_step_stats.expert_counts; MoE models only) */
    int64_t *expert_counts;
    /* 1: save checkpoints in the background (checkpoint.h mgc_ckpt_save_async) whatever the
     * plan's checkpoint.async_save says; 0: as it says */
    int async_save;
    /* > 0: a time limit, in seconds from this call (mgc-run --time-limit).  After each step every
     * rank asks whether the time left still holds another step and a checkpoint (the longest
     * step, evaluation and save so far); the ranks agree (the stop request's all-reduce) and,
     * when it does not, stop as on a stop request: a checkpoint when checkpoints are on, then
     * *stopped_after is set and the run ends successfully. */
    double time_limit_s;
} mgc_train_opts;

#define MGC_TRAIN_OPTS_INIT                                                                        \
    { sizeof(mgc_train_opts), 0, 0, 0, NULL, NULL, NULL, NULL, 0, NULL, NULL, 0, 0, NULL, NULL, 0, NULL,  \
      0 }

/* One rank's whole run over `world` (a world communicator of plan->grid.world ranks). */
int mgc_train_rank(const mgc_plan *plan, mgc_train_data *data, mgc_comm *world,
                   const mgc_train_opts *o, char *err, size_t errsz);
/* `n` ranks as threads of this process over the local transport. */
int mgc_train_local(const mgc_plan *plan, mgc_train_data *data, int n, const mgc_train_opts *o,
                    char *err, size_t errsz);

#ifdef __cplusplus
}
#endif
#endif
