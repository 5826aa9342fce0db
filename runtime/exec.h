/* exec.h - the executor: runs one rank's part of a plan.
 *
 * An executor binds a plan (plan.h) to one rank of the world: it opens that
 * rank's process groups, allocates the stage's arena through the backend,
 * resolves every tensor of the stage's chunks to an address inside it, and
 * then runs training steps by walking the stage's instruction stream (the
 * pipeline schedule): loading microbatches, running chunk programs (compute
 * ops on the backend, collectives on the communicators), pipeline transfers,
 * data-parallel gradient reduction and the optimizer.
 *
 *     mgc_exec *x = NULL;
 *     if (mgc_exec_open(&x, plan, world, backend, err, sizeof err)) ...;
 *     mgc_exec_init_params(x);                          // from training.seed
 *     for (int64_t it = 0; it < iters; it++) {
 *         mgc_step_stats st;
 *         if (mgc_exec_step(x, it, sample_fn, data, &st)) ... mgc_exec_error(x) ...;
 *     }
 *     mgc_exec_free(x);
 *
 * Every rank of the world calls the same functions in the same order (the
 * collective parts are over the world).  Numbers follow docs/runtime.md:
 * the training loss is the mean over microbatches and data-parallel ranks of
 * each microbatch's masked-mean token loss; gradients are the exact gradient
 * of it (sums over data-parallel ranks, no averaging after the fact). */
#ifndef MGC_EXEC_H
#define MGC_EXEC_H

#include <stddef.h>
#include <stdint.h>

#include "backend.h"
#include "comm.h"
#include "plan.h"
#include "profile.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct mgc_exec mgc_exec;

/* Fills tokens[0 .. seq_length] (seq_length + 1 tokens) of training sample
 * `sample` (a global index: the step's samples are it*global_batch ..); 0 on
 * success, -1 with a message in err. */
typedef int (*mgc_sample_fn)(void *ctx, int64_t sample, int32_t *tokens, char *err, size_t errsz);

typedef struct mgc_step_stats {
    double loss;      /* LM loss: mean over the step's microbatches (all data-parallel ranks) */
    double aux_loss;  /* MoE load-balancing loss (summed over MoE layers), same averaging */
    double z_loss;    /* MoE router z-loss, same averaging */
    double grad_norm; /* global L2 norm of the gradient before clipping */
    double lr;        /* learning rate of this step */
    int64_t tokens;   /* tokens the step trained on (global batch x seq_length) */
    double loss_scale; /* dynamic loss scaling: the scale this step's gradients had; 0 when off */
    int skipped;      /* 1: the gradients overflowed (loss scaling) and the update was skipped */
    int64_t graph_replays; /* programs this step replayed from recorded graphs (mgc_exec_set_graphs) */
    int64_t staged_bytes;  /* bytes this step's communication moved between a device arena and
                              host memory (backend device_memory; docs/runtime.md) */
    int64_t overlapped_buckets; /* gradient buckets reduced beside the backward this step
                                   (mgc_exec_set_grad_overlap) */
    int64_t overlapped_sends;   /* pipeline sends that left beside the compute this step
                                   (mgc_exec_set_send_overlap) */
    /* MoE models: the tokens each expert of each layer processed this step, over every rank
     * and microbatch (after capacity drops): expert_counts[layer * moe_experts + e], layer
     * 0 .. moe_layers-1 (all model layers; a dense layer's row is 0).  Owned by the executor,
     * valid until its next step; NULL for a dense model.  moe_assignments: the step's
     * token-to-expert assignments (tokens x top_k) a MoE layer routes; the difference from a
     * layer's count total is what capacity dropped. */
    const int64_t *expert_counts;
    int64_t moe_layers, moe_experts, moe_assignments;
    /* moe.expert_bias_update_rate: each layer's expert biases after this step's update
     * (expert_bias[layer * moe_experts + e], as expert_counts; the next step routes with them);
     * NULL without the bias */
    const float *expert_bias;
} mgc_step_stats;

/* What can be refused without starting: a precision the backend ("cpu") does
 * not compute in, layouts this runtime does not run yet.  0, or -1 with the
 * reason and a hint in err.  mgc_exec_open runs it too. */
int mgc_exec_check_plan(const mgc_plan *plan, const char *backend, char *err, size_t errsz);

/* Opens rank mgc_comm_world_rank(world) of the plan.  Collective over world.
 * Checks that the world size matches the plan and that the backend can run
 * it (the CPU backend computes in fp32).  0, or -1 with the reason in err. */
int mgc_exec_open(mgc_exec **out, const mgc_plan *plan, mgc_comm *world, mgc_backend *be,
                  char *err, size_t errsz);
/* Initialises the parameters from training.seed: every element is a function
 * of (seed, parameter name, global element index), so every layout starts
 * from the same model.  Weights N(0, std) (output projections std/sqrt(2L)),
 * biases 0, norm weights 1, vocabulary padding rows 0. */
int mgc_exec_init_params(mgc_exec *x);
/* Runs training step `iteration` (0-based).  Collective over the world. */
int mgc_exec_step(mgc_exec *x, int64_t iteration, mgc_sample_fn fn, void *ctx,
                  mgc_step_stats *st);
/* Evaluates the current model on one global batch of samples first_sample, first_sample + 1,
 * ... (of fn, ctx: the validation data): the step's instruction stream with every dropout
 * probability 0 and no gradient reduction, clipping or update, so the parameters, the
 * optimizer state and the next training step are untouched; st->loss is the batch's loss.
 * The backward runs too (the head of a loss-chunked plan is there), so an evaluation costs
 * a training step's compute.  Collective over the world. */
int mgc_exec_eval(mgc_exec *x, int64_t first_sample, mgc_sample_fn fn, void *ctx, mgc_step_stats *st);
const char *mgc_exec_error(const mgc_exec *x);
uint64_t mgc_exec_arena_bytes(const mgc_exec *x);
int64_t mgc_exec_rank(const mgc_exec *x);

/* Parameters, for checkpoints and tests: the stage's flat fp32 parameter
 * space (weights) and the Adam moments of this rank's shard.  Pointers are
 * arena addresses; use the backend's download/upload. */
typedef struct mgc_exec_param {
    const char *name;  /* module path: decoder.layers.0.mlp.linear_fc1.weight */
    int chunk;
    int rank;          /* dims used */
    int64_t dim[4];    /* local shape */
    int64_t numel;
    float *weight;     /* arena address */
    float *grad;
} mgc_exec_param;
int64_t mgc_exec_param_count(const mgc_exec *x);
/* The gradient bytes a training step zeroes before its first writes: the whole gradient
 * buffer, or less where the backend stores first writes whole (docs/runtime.md, "Gradients'
 * first writes"). */
uint64_t mgc_exec_zeroed_bytes(const mgc_exec *x);
const mgc_exec_param *mgc_exec_param_at(const mgc_exec *x, int64_t i);
mgc_backend *mgc_exec_backend(const mgc_exec *x);

/* Test hooks: called before and after every compute op with the op's call
 * (addresses in this backend's memory); NULL removes them.  tests/test_cuda.c
 * replays each op of a CPU run on the GPU this way. */
typedef void (*mgc_exec_op_hook)(void *ctx, const mgc_op_call *call);
void mgc_exec_set_op_hooks(mgc_exec *x, mgc_exec_op_hook before, mgc_exec_op_hook after, void *ctx);

/* Profiling (mgc-run --profile): while `p` is attached (NULL detaches), every
 * step adds to it the time of each op of each chunk program (compute ops and
 * collectives), of each instruction of the stream and of the whole step.  Each
 * time is taken between two clock reads (CLOCK_MONOTONIC), each after the
 * backend's sync, so the queued work of an asynchronous backend is counted
 * where it was queued; that makes profiled steps slower.  Detached, the
 * executor reads no clock and never syncs.  The caller keeps ownership. */
void mgc_exec_set_profile(mgc_exec *x, mgc_profile *p);

/* Dynamic loss scaling, on for fp16 plans from training.initial_loss_scale,
 * loss_scale_window and hysteresis; this call sets it in any precision
 * (tests; initial <= 0 turns it off).  Every loss's gradient is seeded with
 * the scale (rounded down to a power of two, so unscaling is exact); the
 * optimizer divides it out.  A step whose gradient norm is not finite is
 * skipped on every rank (no update; mgc_step_stats.skipped) and, after
 * `hysteresis` such steps, the scale halves (never below 1); `window` clean
 * steps in a row double it. */
void mgc_exec_set_loss_scaling(mgc_exec *x, double initial, int64_t window, int64_t hysteresis);
/* Graphs (backend.h graph_begin / graph_end): on (1) or off (0, the default).  The forward and
 * backward programs that qualify (no collective, no MoE op with host-side sizes, no dropout
 * unless the backend reads the step from its memory, backend.h set_step: nothing in their
 * kernels' arguments changes from step to step but the loss scale, which is part of the key)
 * are recorded on their second run and replayed after.  Ignored by a
 * backend without graphs, and while a profile or op hooks are set. */
void mgc_exec_set_graphs(mgc_exec *x, int on);
/* Gradient reduction beside the backward: on (1, the default) or off (0: every bucket is
 * reduced at its REDUCE_GRADS instruction).  When on, a second thread of the rank reduces a
 * bucket as soon as its chunk's last backward has issued the op that last writes it; the
 * results are the same bits.  It runs only where the communicator allows two threads
 * (mgc_comm_concurrent: local, and mpi under MPI_THREAD_MULTIPLE), on device memory only with the backend's transfer
 * slots (backend.h xfer_*), and never while a profile is set (whose REDUCE_GRADS times are
 * the whole reductions).  mgc_exec_grad_overlap says whether it can run. */
void mgc_exec_set_grad_overlap(mgc_exec *x, int on);
int mgc_exec_grad_overlap(const mgc_exec *x);
/* Pipeline sends beside the compute: on (1, the default) or off (0: each transfer at its
 * instruction, on the rank's thread).  When on, on device memory (backend.h p2p_*), SEND_ACT
 * and SEND_GRAD queue their staging buffer's download on the backend's pipeline-transfer
 * queue and a second thread of the rank sends it, while this one goes on; the compute is
 * fenced behind the download (on the device) before the buffer's bytes are reused; receives
 * go through the same thread in order.  The same bits either way.  It runs only where the
 * communicator allows two threads (mgc_comm_concurrent), and never while a profile is set.
 * mgc_exec_send_overlap says whether it can run. */
void mgc_exec_set_send_overlap(mgc_exec *x, int on);
/* A device communicator (docs/runtime.md, "Communication on device memory"): `dworld`, a
 * moves-only world of the plan's size (comm.h: NCCL over the CUDA backend, or a local world
 * with moves_only on a host-addressable arena in tests), takes every collective and pipeline
 * transfer on arena memory, directly on it and queued on the backend's compute queue (no host
 * staging); its reductions fold in group-rank order through the plan's kernel_scratch with
 * the backend's fold kernel, so the numbers are the host communicator's, bit for bit.  The
 * host world keeps the scalars (losses, norms, token counts).  Transfers then go in line (no
 * reducer or sender thread).  Call once, after mgc_exec_open and before the first step;
 * collective over dworld.  The caller keeps dworld and frees it after mgc_exec_free.  0, or -1
 * with the reason in mgc_exec_error. */
int mgc_exec_set_device_comm(mgc_exec *x, mgc_comm *dworld);
int mgc_exec_device_comm(const mgc_exec *x); /* 1 when one is set */
int mgc_exec_send_overlap(const mgc_exec *x);
double mgc_exec_loss_scale(const mgc_exec *x); /* the current scale, 1 when off */

/* Checkpoints (runtime/checkpoint.h, docs/checkpoints.md).  A checkpoint holds every
 * parameter whole, as the unpartitioned model has it, in three fp32 arrays: the parameter
 * (the master copy), Adam's m and v.  An element is addressed by the parameter's name, the
 * array (MGC_CKPT_PARAM, _M, _V) and its global row-major index, the one that
 * mgc_exec_init_params draws its initial value from, so any layout reads what any layout
 * wrote.  `put` and `get` move n consecutive global elements; 0 ok, -1 with the message
 * kept by the callee. */
enum { MGC_CKPT_PARAM = 0, MGC_CKPT_M = 1, MGC_CKPT_V = 2 };
typedef struct mgc_exec_ckpt_io {
    int (*put)(void *ctx, const char *name, int array, uint64_t gi, const float *v, int64_t n);
    int (*get)(void *ctx, const char *name, int array, uint64_t gi, float *v, int64_t n);
    void *ctx;
} mgc_exec_ckpt_io;
/* Writes the elements this rank owns: the gradient norm's partition, in which every element
 * of the model belongs to exactly one rank of the world.  Call between steps. */
int mgc_exec_ckpt_save(mgc_exec *x, const mgc_exec_ckpt_io *io);
/* Reads every element this rank holds: its weights (rounded to the 16-bit copy where the
 * weights are 16-bit, as the optimizer's copy-out rounds them) and its optimizer shard's
 * master copy, m and v (params_only: m and v zero, a fresh optimizer).  In place of
 * mgc_exec_init_params. */
int mgc_exec_ckpt_load(mgc_exec *x, const mgc_exec_ckpt_io *io, int params_only);
/* The state between steps that is not a tensor: steps completed, training samples consumed
 * (a resumed run reads sample consumed + k * global_batch at its k-th step, so a checkpoint
 * may be resumed with another global batch) and dynamic loss scaling's state. */
typedef struct mgc_exec_resume {
    int64_t iteration;        /* steps completed */
    int64_t consumed_samples;
    double loss_scale;        /* 0: loss scaling off */
    int64_t ls_clean, ls_left;
} mgc_exec_resume;
/* The state after `completed` steps (the caller's count: steps run so far plus the resumed). */
void mgc_exec_get_resume(const mgc_exec *x, int64_t completed, mgc_exec_resume *r);
/* Continue from r: the next step is r->iteration (0-based).  Loss scaling's state is taken
 * only when both the plan and r have it on. */
void mgc_exec_set_resume(mgc_exec *x, const mgc_exec_resume *r);
/* Samples a step trains on: micro batch x microbatches x data-parallel ranks. */
int64_t mgc_exec_global_batch(const mgc_exec *x);

void mgc_exec_free(mgc_exec *x); /* NULL is a no-op; frees the groups, not the world */

#ifdef __cplusplus
}
#endif
#endif /* MGC_EXEC_H */
