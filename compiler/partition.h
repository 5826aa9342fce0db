/* partition.h - the per-rank programs of one pipeline rank: partitioning and autodiff.
 *
 * mgc_partition_build() turns the model IR (the forward graph of one
 * microbatch, unpartitioned) into the model chunks of one pipeline rank as
 * plan chunks (plan/plan.h): for each of its vp chunks
 *
 *   - the tensors and forward ops as seen by ONE rank of that stage: weights
 *     and activations split by tensor (TP), sequence (SP), context (CP) and
 *     expert (EP/ETP) parallelism, with the collectives that the splits need
 *     (all-reduce, all-gather, reduce-scatter, all-to-all) inserted as ops;
 *   - the backward program derived from it (autodiff.c): dgrad and wgrad
 *     GEMMs, *_bwd kernels, transposed collectives, recompute ops;
 *   - the saved set: forward tensors the backward reads, packed into the
 *     chunk's stash (tensor.buffer = MGC_PLAN_BUF_STASH), stash_bytes and
 *     send_bytes.
 *
 * All ranks of a stage (every tp/cp/dp/ep rank with the same pp rank) share
 * the program; a rank finds its shard from its grid coordinates and each
 * tensor's split_axis/split_group.  docs/partitioning.md is the manual: the
 * rules per op, the conventions below in full, the saved set per recompute
 * mode and the comparison with Korthikanti et al. 2022.
 *
 *     mgc_grid grid;
 *     mgc_partition_grid(cfg, &grid);
 *     mgc_plan_chunk *chunks = calloc(grid.vp, sizeof *chunks);
 *     if (mgc_partition_build(cfg, graph, &grid, pp_rank, plan, chunks, &diags) == 0)
 *         ... chunks[c].fwd, chunks[c].bwd, chunks[c].stash_bytes ...
 *     mgc_partition_chunks_free(chunks, grid.vp);   // unless handed to a plan
 *
 * Conventions every consumer of a chunk relies on (details in the doc):
 *   - Boundary tensors come first: when the chunk has no embedding, tensor 0
 *     is the activation received from the previous stage and tensor 1 the
 *     gradient sent back to it; then, when it has no loss, the next two are
 *     the activation sent to the next stage and the gradient received from
 *     it.  A chunk without ops (an empty virtual stage) forwards its input:
 *     it has only tensors 0 and 1, which are also its output and output grad.
 *   - GRAD tensors ("<param>.grad", fp32, in the order of their params) are
 *     accumulators: every op writing one adds to it.  Every other tensor is
 *     written by exactly one op.
 *   - A tensor with split_axis == MGC_PLAN_NO_SPLIT and split_group naming a
 *     group holds partial sums over that group (a row-parallel GEMM's output
 *     before its reduction; the gradient of a parameter replicated over the
 *     tensor group but fed different tokens under sequence parallelism,
 *     which must be summed over the group once per step before the
 *     optimizer).  Unsplit, complete tensors have split_group
 *     MGC_PARTITION_NO_GROUP.
 *   - Collective ops: iattr[0] = elements of in[0], iattr[1] = elements of
 *     out[0] (upper bounds when sizes are data dependent), iattr[2] = the
 *     mgc_dtype, iattr[3] = MGC_PCOLL_* flags; gathers and scatters are
 *     along dim 0; seq = index among the collectives of the same group in the
 *     same pass (forward or backward) of the chunk.
 */
#ifndef MGC_PARTITION_H
#define MGC_PARTITION_H

#include <stdint.h>
#include <stdio.h>

#include "config.h"
#include "diag.h"
#include "ir.h"
#include "plan.h"

#ifdef __cplusplus
extern "C" {
#endif

/* split_group of a tensor that is neither split nor partial. */
#define MGC_PARTITION_NO_GROUP ((uint16_t)MGC_GROUP__COUNT)

/* Collective flags, in iattr[3] of ALL_REDUCE .. ALL_TO_ALL ops. */
#define MGC_PCOLL_MAX      1u  /* all-reduce with max instead of sum */
#define MGC_PCOLL_VARIABLE 16u /* sizes known at run time: in[1] (and in[2]) are row counts */

/* Extra facts about one chunk tensor that plan tensors do not carry. */
typedef struct mgc_partition_tensor_info {
    int32_t ir;           /* IR tensor it is (a shard of); -1: made by partitioning/autodiff */
    int32_t layer;        /* decoder layer; -1 embedding, head and boundary tensors */
    int32_t grad_of;      /* GRAD/ACT_GRAD: the tensor it is the gradient of; else -1 */
    int32_t recompute_of; /* a recomputed (or re-gathered) copy of this forward tensor; else -1 */
    uint16_t split2_axis; /* a second sharded dim, MGC_PLAN_NO_SPLIT when none: the sequence (dim
                             0) over CP when the primary split is TP's, ETP for expert weights */
    uint16_t split2_group;
    uint8_t partial; /* holds partial sums over split_group (see the header comment) */
    uint8_t nodiff;  /* integer or statistics: never has a gradient */
    uint8_t routed;  /* rows of dropless expert routing, sized for the worst case (MGC_PT_ROUTED) */
    uint8_t pad_;
} mgc_partition_tensor_info;

/* Per chunk: the side table and the boundary tensors. */
typedef struct mgc_partition_info {
    int64_t n_tensors;                  /* = chunk.n_tensors */
    mgc_partition_tensor_info *tensors; /* (n_tensors) */
    int32_t in_act, in_grad;            /* received activation, gradient sent back; -1 */
    int32_t out_act, out_grad;          /* activation sent on, gradient received; -1 */
    int32_t loss;                       /* the LOSS tensor (sum, count); -1 */
} mgc_partition_info;

/* The grid of a finalized config (same as the compile driver's). */
void mgc_partition_grid(const mgc_config *c, mgc_grid *grid);

/* Build the grid->vp chunks of pipeline rank pp_rank (chunk v is the
 * virtual stage v*pp + pp_rank of c->derived.stages).  `plan` receives the
 * tensor and op names (mgc_plan_str).  `chunks` must have room for grid->vp
 * entries; each is overwritten (not freed first).  0 on success; -1 with
 * diagnostics when the layout cannot be partitioned (e.g. experts with
 * tensor parallelism but no sequence parallelism), the grid does not match
 * the config, or memory runs out -- the chunks are then empty. */
int mgc_partition_build(const mgc_config *c, const mgc_graph *g, const mgc_grid *grid,
                        int64_t pp_rank, mgc_plan *plan, mgc_plan_chunk *chunks, mgc_diags *d);

/* The same, also filling info[0..vp) (may be NULL; free with
 * mgc_partition_info_free). */
int mgc_partition_build_ex(const mgc_config *c, const mgc_graph *g, const mgc_grid *grid,
                           int64_t pp_rank, mgc_plan *plan, mgc_plan_chunk *chunks,
                           mgc_partition_info *info, mgc_diags *d);

/* Free the arrays of n chunks (not the array itself) and zero them. */
void mgc_partition_chunks_free(mgc_plan_chunk *chunks, int64_t n);
/* Free the arrays of n infos and zero them.  NULL is a no-op. */
void mgc_partition_info_free(mgc_partition_info *info, int64_t n);

/* Collectives of `group` in the forward (bwd = 0) or backward (bwd = 1,
 * recompute ops included) program of one microbatch of the chunk.  The
 * runtime numbers a collective of group G globally as the sum of these
 * counts over the passes it has run before, plus the op's seq. */
int64_t mgc_partition_count_collectives(const mgc_plan_chunk *ch, int bwd, mgc_group_kind group);

/* A readable listing: one line per op with its tensors (local shape, the
 * split dim starred, /group, "(partial G)", "@stash+offset"). */
void mgc_partition_print(const mgc_plan *plan, const mgc_plan_chunk *ch, FILE *out);

/* Structural checks of a built chunk (used by tests and the compile
 * driver): indices in range; forward ops read only inputs, params, the
 * received activation and earlier outputs; every backward input is a param,
 * an input, a stashed tensor, the received gradient or an earlier backward
 * output; no tensor other than a GRAD is written twice; stash offsets
 * aligned and inside stash_bytes.  Appends errors at "<partition>"; 0 when
 * none. */
int mgc_partition_check(const mgc_plan_chunk *ch, mgc_diags *d);

#ifdef __cplusplus
}
#endif
#endif /* MGC_PARTITION_H */
