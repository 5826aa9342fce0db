/* memplan.h - the static memory plan: one arena per pipeline rank.
 *
 * Every byte a rank touches on the device lives in one arena whose layout the
 * plan fixes, so the number `mgc compile` prints is the number mgc-run
 * allocates (DESIGN.md point 2).  Two layers:
 *
 *   1. mgc_memplan_assign: a generic offset assigner.  Requests have a size,
 *      an alignment and a lifetime [live_begin, live_end) on some integer
 *      timeline; two requests whose lifetimes overlap get disjoint byte
 *      ranges, others may share.  Greedy by size with best fit (Pisarchyk &
 *      Lee 2020, TFLite's "greedy by size"), retried greedy by breadth and
 *      in time order when it leaves waste; deterministic.  It also reports
 *      the lower bound (max over time of the live bytes), so the placement
 *      waste is visible.
 *
 *   2. mgc_memplan_build: the buffers of one pipeline rank from its chunks
 *      and instruction stream -- weights, fp32 main grads, optimizer state
 *      (sharded with the distributed optimizer), one stash per (mb, chunk),
 *      the pass workspace for transient activations, p2p staging, input
 *      batches and the GEMM workspace -- placed by the assigner on the
 *      instruction timeline; every tensor gets its (buffer, offset).
 *      mgc_memplan_buckets cuts the same flat parameter layout into the
 *      gradient buckets REDUCE_GRADS names (before the schedule exists).
 *
 * docs/memory-plan.md is the manual: what the arena holds, how lifetimes are
 * read off the instruction stream, padding rules, the comparison with
 * Megatron's estimator.
 *
 *     mgc_memreq r[3] = {{1024, 0, 4, 0}, {512, 4, 8, 0}, {512, 2, 6, 0}};
 *     uint64_t off[3], arena;
 *     mgc_memplan_stats st;
 *     if (mgc_memplan_assign(r, 3, off, &arena, &st) == MGC_MEMPLAN_OK)
 *         printf("%llu bytes, lower bound %llu\n", arena, st.lower_bound_bytes);
 *
 *     // per pipeline rank, after partitioning and scheduling:
 *     mgc_memplan_build(cfg, &plan->grid, plan, &plan->stages[r], &diags);
 */
#ifndef MGC_MEMPLAN_H
#define MGC_MEMPLAN_H

#include <stddef.h>
#include <stdint.h>

#include "config.h"
#include "diag.h"
#include "plan.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- constants (documented in docs/memory-plan.md) ----------------------- */

/* cuBLASLt workspace.  NVIDIA recommends 32 MiB on Hopper (4 MiB is enough
 * before it); one size for every target keeps plans portable across the
 * architectures a plan is compiled for.  The optimizer's scratch (norm
 * partial sums) reuses it: no GEMM runs during OPTIMIZER. */
#define MGC_MEMPLAN_GEMM_WORKSPACE_BYTES (32ull << 20)

/* Parameters start at multiples of this many elements inside the flat
 * weight/grad buffers (256 B in bf16), so every weight and grad pointer is
 * MGC_PLAN_ALIGN-aligned. */
#define MGC_MEMPLAN_PARAM_ALIGN_ELEMS 128u

/* ---- 1. the generic offset assigner ----------------------------------- */

typedef enum mgc_memplan_status {
    MGC_MEMPLAN_OK = 0,
    MGC_MEMPLAN_ERR_NOMEM,    /* out of host memory */
    MGC_MEMPLAN_ERR_INVALID,  /* alignment not a power of two, live_end < live_begin, bad segment */
    MGC_MEMPLAN_ERR_OVERFLOW, /* the arena would pass 2^64 bytes */
} mgc_memplan_status;

const char *mgc_memplan_status_name(mgc_memplan_status s);

/* One buffer to place.  Lifetimes are half-open: a request live over
 * [0, 4) and one over [4, 8) never coexist and may share bytes. */
typedef struct mgc_memreq {
    uint64_t bytes;     /* size; 0 bytes: offset 0, conflicts with nothing */
    int64_t live_begin; /* first time step it is live at */
    int64_t live_end;   /* one past the last; == live_begin: never live (offset 0) */
    uint64_t align;     /* a power of two; 0 means MGC_PLAN_ALIGN */
} mgc_memreq;

/* An extra live interval of request `req` (a tensor live in a forward and
 * again in a backward pass gets one offset valid in both).  A request's
 * intervals must not overlap each other (they may touch). */
typedef struct mgc_memseg {
    int64_t req;   /* index into the request array */
    int64_t begin; /* [begin, end), as live_begin/live_end */
    int64_t end;
} mgc_memseg;

typedef struct mgc_memplan_stats {
    uint64_t arena_bytes;       /* = *arena_bytes of the call */
    uint64_t lower_bound_bytes; /* max over time of the summed bytes of live requests: no
                                   placement can do better; arena - this = placement waste */
    int64_t peak_time;          /* earliest time step where the lower bound is reached; -1 when
                                   nothing is ever live */
    uint64_t overlaps;          /* sum over requests of the placed requests their lifetimes
                                   overlap (the k of the cost bound), for benchmarks */
} mgc_memplan_stats;

/* Assign offsets[i] for every request so that requests with overlapping
 * lifetimes occupy disjoint [offset, offset + bytes) ranges, each offset a
 * multiple of its alignment.  *arena_bytes receives the end of the highest
 * buffer rounded up to MGC_PLAN_ALIGN (0 when nothing has bytes).  `stats`
 * may be NULL.  Deterministic: the same requests give the same offsets.
 * Cost O(n log n + sum_i k_i log n) per placement order, k_i the placed requests
 * whose lifetimes overlap request i's (up to three orders, the later two
 * only while the arena exceeds the lower bound); memory O(n + T log T), T
 * the distinct times. */
mgc_memplan_status mgc_memplan_assign(const mgc_memreq *req, size_t n, uint64_t *offsets,
                                      uint64_t *arena_bytes, mgc_memplan_stats *stats);

/* The same with extra live intervals per request (see mgc_memseg). */
mgc_memplan_status mgc_memplan_assign_segs(const mgc_memreq *req, size_t n, const mgc_memseg *extra,
                                           size_t n_extra, uint64_t *offsets, uint64_t *arena_bytes,
                                           mgc_memplan_stats *stats);

/* Only the lower bound (max over time of live bytes) of a request set. */
mgc_memplan_status mgc_memplan_lower_bound(const mgc_memreq *req, size_t n,
                                           uint64_t *lower_bound_bytes, int64_t *peak_time);

/* ---- 2. one pipeline rank's memory plan ------------------------------- */

/* What mgc_memplan_build found, beyond what the stage program records. */
typedef struct mgc_memplan_info {
    uint64_t arena_bytes;        /* = sp->arena_bytes */
    uint64_t lower_bound_bytes;  /* max over instructions of live buffer bytes (= sum of by_kind) */
    int64_t peak_instr;          /* the instruction at which it is reached */
    uint64_t param_elems;        /* local parameter elements (unpadded), dense + expert */
    uint64_t expert_param_elems; /* of which expert parameters (sharded over edp) */
    uint64_t param_pad_elems;    /* padding elements in the flat weight/grad layout */
    uint64_t optimizer_bytes;    /* weights + grads + master + moments, padding included */
    int64_t shard_dense;         /* optimizer shard divisor of dense params (dp*cp, or 1) */
    int64_t shard_expert;        /* ... of expert params (edp, or 1) */
    uint64_t workspace_bytes;    /* the ACTIVATION (pass workspace) buffer */
    uint64_t fwd_peak_bytes;     /* max over chunks of the forward pass's live transients */
    uint64_t bwd_peak_bytes;     /* max over chunks of the backward pass's live transients */
    int64_t n_buffers;           /* = sp->n_buffers */
    uint64_t assign_overlaps;    /* mgc_memplan_stats.overlaps of the arena placement */
} mgc_memplan_info;

/* In-place outputs: mark MGC_POF_INPLACE every op of the chunk whose launcher can write its
 * output over its input (plan.h; today cross_entropy_bwd, the logits' gradient over the fp32
 * logits) where that is safe: the input is an activation no later op touches, the output an
 * activation gradient only this op writes, their shapes equal, and, when the output's dtype
 * is narrower, only readers that take a row pitch (linear_dgrad, linear_wgrad) read it.  The
 * output gets the input's bytes and, when narrower, a row pitch (tensor.ld); the memory plan
 * then gives it the input's place.  Returns how many ops it marked.  Run it after fusion and
 * before mgc_memplan_build; MGC_INPLACE=0 in the environment makes mgc_compile skip it. */
int64_t mgc_memplan_inplace(mgc_plan_chunk *ch);

/* Build the memory plan of one pipeline rank: create sp->buffers (freeing a
 * previous list), give every tensor of every chunk its buffer and offset
 * (saved tensors keep the partitioner's MGC_PLAN_BUF_STASH placement; the output of an
 * MGC_POF_INPLACE op takes its input's, whose lifetime grows to cover both), and
 * fill sp->arena_bytes, sp->by_kind and sp->max_in_flight.  `plan` interns
 * the buffer names (may be NULL: names stay 0).  `c` gives the precision,
 * the distributed-optimizer switch and the boundary-activation shape; `grid`
 * the shard degrees.  0 on success; -1 with a diagnostic when the stage
 * program is malformed (an instruction stream that does not pair forwards
 * with backwards, a tensor read by the backward that is neither stashed nor
 * recomputed, ...) or out of memory. */
int mgc_memplan_build(const mgc_config *c, const mgc_grid *grid, mgc_plan *plan,
                      mgc_stage_program *sp, mgc_diags *d);

/* The same, also filling `info` (may be NULL). */
int mgc_memplan_build_info(const mgc_config *c, const mgc_grid *grid, mgc_plan *plan,
                           mgc_stage_program *sp, mgc_diags *d, mgc_memplan_info *info);

/* Chunks with the same layers and shapes (every middle chunk of a uniform
 * model, on every pipeline rank) pack their pass workspace identically.  A
 * cache shared by the mgc_memplan_build_cached calls of one plan remembers
 * each packing by its exact requests, so that only the first is computed;
 * the plan is byte for byte the same with or without it.  Not thread-safe:
 * one cache per compile.  _new returns NULL on OOM; _free(NULL) is a no-op. */
typedef struct mgc_memplan_cache mgc_memplan_cache;
mgc_memplan_cache *mgc_memplan_cache_new(void);
void mgc_memplan_cache_free(mgc_memplan_cache *cache);

/* mgc_memplan_build_info with a cache (NULL: none). */
int mgc_memplan_build_cached(const mgc_config *c, const mgc_grid *grid, mgc_plan *plan,
                             mgc_stage_program *sp, mgc_diags *d, mgc_memplan_info *info,
                             mgc_memplan_cache *cache);

/* The gradient buckets of one pipeline rank: what REDUCE_GRADS / GATHER_PARAMS
 * `arg` names.  Needs only the partitioned chunks (sp->chunks; no stream
 * yet): it lays the parameters out with the very routine mgc_memplan_build
 * uses (docs/memory-plan.md, "Parameters") and cuts each chunk's dense and
 * expert section into buckets of at most bucket_elems elements (at least
 * 128 * D) on 128 * D boundaries from the section's start, D the section's
 * shard divisor; so a bucket never mixes dense and expert parameters and
 * splits into D equal, 256-byte-aligned shards.  Buckets are listed in
 * reverse layout order (bucket 0 ends the flat space: the backward finishes
 * the last layers' gradients first, as Megatron fills its buckets).  Fills
 * group, chunk, shards, the element range and the byte ranges; grad_buffer
 * and weight_buffer are -1 until mgc_memplan_build binds them (it checks the
 * table tiles its layout).  *out is malloc'd (NULL when *n is 0: a rank
 * without parameters).  0 on success; -1 on OOM, overflow or a malformed
 * stage. */
int mgc_memplan_buckets(const mgc_config *c, const mgc_grid *grid, const mgc_stage_program *sp,
                        int64_t bucket_elems, mgc_bucket **out, int64_t *n);

/* Bytes of the activation passed between pipeline stages for one
 * microbatch: (s/cp) * b * h in the compute dtype, divided by tp with
 * sequence parallelism.  The size of p2p staging buffers when the chunks do
 * not say (a last stage sends nothing but still receives). */
uint64_t mgc_memplan_boundary_bytes(const mgc_config *c, const mgc_grid *grid);

#ifdef __cplusplus
}
#endif
#endif /* MGC_MEMPLAN_H */
