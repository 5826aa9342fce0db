/* plan.h - the execution plan: the contract between the compiler and the runtime.
 *
 * A plan is everything a rank needs to train: the rank grid (from which every
 * process group is computed, so the file does not grow with the world size),
 * and for each pipeline rank ("stage program") its model chunks as op lists
 * over partitioned tensors, its instruction stream (the pipeline schedule)
 * and its static memory plan (one arena, every buffer at a fixed offset).
 * Ranks of one pipeline stage share a program: tensor-, context-, data- and
 * expert-parallel ranks differ only in which shard they hold, which they
 * compute from their grid coordinates.
 *
 * This module is shared by both sides and depends on libc only: the compiler
 * builds an mgc_plan and writes it; mgc-run reads it (plan_io.c) without
 * libyaml or compiler code.  The byte layout is docs/plan-format.md.
 *
 *     mgc_plan *p = mgc_plan_new();            // compiler fills it
 *     mgc_plan_write(p, "model.plan", err, sizeof err);
 *     mgc_plan *q = NULL;
 *     mgc_plan_read("model.plan", &q, err, sizeof err);   // runtime
 *     mgc_plan_free(q);
 *
 * Implementation: plan.c (allocation, strings, names), grid.c (rank grid and
 * process groups, docs/process-groups.md), plan_io.c (the file format and
 * validation), crc32c.c (the checksum). */
#ifndef MGC_PLAN_H
#define MGC_PLAN_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define MGC_PLAN_VERSION 10u /* 2: gradient buckets (BCKT); 3: row pitch (tensor ld), in-place
                              ops (MGC_POF_INPLACE), the split's rotary flag (MGC_POF_ROPE);
                              4: row views (tensor view); 5: a second split (tensor split2_*);
                              6: the attention kernels' dropout numbering (their argument
                              lists, so the cubins of older plans do not fit), 8 inputs and
                              outputs an op (160-byte op records), the document flag
                              (MGC_POF_DOCS); 7: the router kernels' arguments (the top-k
                              scale, the expert bias, the counts' rows), the router's packed
                              iattr[3] and expert-bias input, LOAD_BATCH's bias bit;
                              8: the fused cross-entropy of the loss chunks
                              (MGC_POF_CE_STATS); 9: the norm backward's fused bias gradient
                              (MGC_POF_COLSUM, a third destination of norm_bwd_reduce);
                              within 9, op kind 18 (embedding_norm) and the norm backward's
                              fused dropout backward (MGC_POF_DROPBWD), which older version-9
                              readers refuse as unknown (docs/plan-format.md, Versioning);
                              10: the step argument of every kernel that draws dropout masks
                              (attention, add_norm, dropout: the step read from device
                              memory), so the cubins of older plans do not fit; within 10,
                              embedding_norm with the embedding's dropout (a third output,
                              the mask), attention_bwd with the QKV projection's bias
                              gradient and linear_dgrad_gelu with the MLP's first bias
                              gradient (MGC_POF_COLSUM), which older version-10 readers refuse;
                              docs/plan-format.md */

typedef enum mgc_plan_status {
    MGC_PLAN_OK = 0,
    MGC_PLAN_ERR_IO,       /* cannot open/read/write; errno text in the message */
    MGC_PLAN_ERR_FORMAT,   /* not a plan, truncated, corrupt (checksum), inconsistent */
    MGC_PLAN_ERR_VERSION,  /* a plan of another format version */
    MGC_PLAN_ERR_NOMEM,
    MGC_PLAN_ERR_INVALID,  /* the in-memory plan breaks an invariant (writer side) */
} mgc_plan_status;

/* ---- element types -------------------------------------------------------- */

typedef enum mgc_dtype {
    MGC_DT_F32 = 0,
    MGC_DT_BF16 = 1,
    MGC_DT_F16 = 2,
    MGC_DT_I64 = 3,
    MGC_DT_I32 = 4,
    MGC_DT_U8 = 5,
    MGC_DT__COUNT
} mgc_dtype;

size_t mgc_dtype_size(mgc_dtype t);
const char *mgc_dtype_name(mgc_dtype t);

/* ---- the rank grid and process groups (grid.c) ----------------------------
 * Megatron's default order: tp fastest, then cp, (ep), dp, pp.  The dense
 * grid is world = tp * cp * dp * pp; MoE layers use the expert grid
 * world = etp * ep * edp * pp folded over the same pipeline groups. */

typedef struct mgc_grid {
    int64_t world; /* total ranks */
    int64_t tp;    /* tensor */
    int64_t cp;    /* context */
    int64_t dp;    /* data */
    int64_t pp;    /* pipeline */
    int64_t vp;    /* virtual stages (model chunks) per pipeline rank */
    int64_t etp;   /* expert tensor */
    int64_t ep;    /* expert */
    int64_t edp;   /* expert data = world / (etp * ep * pp) */
} mgc_grid;

typedef struct mgc_coords {
    int64_t tp, cp, dp, pp; /* position in the dense grid */
    int64_t etp, ep, edp;   /* position in the expert grid (same pp) */
} mgc_coords;

typedef enum mgc_group_kind {
    MGC_GROUP_TP = 0,   /* tensor parallel */
    MGC_GROUP_CP,       /* context parallel */
    MGC_GROUP_DP,       /* data parallel (excludes cp) */
    MGC_GROUP_PP,       /* pipeline */
    MGC_GROUP_DPCP,     /* data x context: gradient reduction and optimizer shards */
    MGC_GROUP_TPCP,     /* tensor x context */
    MGC_GROUP_EP,       /* expert parallel (expert grid) */
    MGC_GROUP_ETP,      /* expert tensor parallel (expert grid) */
    MGC_GROUP_EDP,      /* expert data parallel (expert grid) */
    MGC_GROUP_EMBED,    /* first and last rank of each pipeline group: tied embedding
                           gradients; middle stages are in none; pp == 1: the rank alone */
    MGC_GROUP_WORLD,
    MGC_GROUP__COUNT
} mgc_group_kind;

/* Largest world a grid may have (ranks are C ints in MPI and NCCL). */
#define MGC_GRID_MAX_WORLD 2147483647

/* "tp", "cp", "dp", "pp", "dp_cp", "tp_cp", "ep", "etp", "edp", "embed",
 * "world"; "?" for a value outside the enum. */
const char *mgc_group_name(mgc_group_kind k);
/* 0 when the grid is consistent: every degree >= 1, world == tp*cp*dp*pp ==
 * etp*ep*edp*pp <= MGC_GRID_MAX_WORLD, 1 <= vp <= 65535 (chunk fields are
 * 16-bit); -1 otherwise.  Every other grid function returns its error value
 * for a grid failing this check.  All of them are O(1) except
 * mgc_grid_group, O(group size); none allocates. */
int mgc_grid_check(const mgc_grid *g);
/* Both positions of `rank`; 0 on success, -1 when rank is outside the world. */
int mgc_grid_coords(const mgc_grid *g, int64_t rank, mgc_coords *out);
/* Rank from the dense coords (tp, cp, dp, pp); -1 when one is out of range. */
int64_t mgc_grid_rank(const mgc_grid *g, const mgc_coords *c);
/* Rank from the expert coords (etp, ep, edp, pp); -1 when one is out of range. */
int64_t mgc_grid_rank_expert(const mgc_grid *g, const mgc_coords *c);
/* Members of the group of kind k containing `rank`, in group-rank order
 * (ascending ranks), the first min(size, max) written to members (which may
 * be NULL when max is 0); returns the group size, 0 when the rank is in no
 * group of that kind (EMBED on a middle stage), -1 on error. */
int64_t mgc_grid_group(const mgc_grid *g, mgc_group_kind k, int64_t rank, int64_t *members, int64_t max);
/* The rank's index inside that group (its "group rank"); -1 when none. */
int64_t mgc_grid_group_rank(const mgc_grid *g, mgc_group_kind k, int64_t rank);
/* Which group of kind k holds `rank`: 0..count-1, numbered as Megatron's
 * RankGenerator lists them (the other coordinates, fastest first).  Use it as
 * the colour and the group rank as the key of MPI_Comm_split/ncclCommSplit.
 * -1 when the rank is in none (EMBED on a middle stage) or on error. */
int64_t mgc_grid_group_id(const mgc_grid *g, mgc_group_kind k, int64_t rank);
/* Number of distinct groups of kind k in the world; -1 on error. */
int64_t mgc_grid_group_count(const mgc_grid *g, mgc_group_kind k);

/* Collectives on device memory (runtime/comm.h, "moves-only" communicators) fold each rank's
 * slice of a reduction in rounds through a scratch area; a round's slice is at most
 * MGC_FOLD_ROUND_BYTES over the group.  mgc_fold_round: the elements of a rank's slice a round
 * takes, for a reduction of `count` elements (all-reduce: the whole vector, in slices of whole
 * 8-element vectors; reduce-scatter: one rank's block) over `group` ranks of `es`-byte
 * elements; mgc_fold_scratch_bytes: the scratch its rounds need (group x the round slice
 * rounded up to 8 elements: each part starts 16-byte aligned).  The memory plan reserves the
 * most any reduction of a stage needs, so both sides use these. */
#define MGC_FOLD_ROUND_BYTES ((uint64_t)64 << 20)
uint64_t mgc_fold_round(uint64_t count, int64_t group, uint64_t es, int scatter);
uint64_t mgc_fold_scratch_bytes(uint64_t count, int64_t group, uint64_t es, int scatter);

/* ---- tensors and ops of a model chunk ----------------------------------- */

#define MGC_PLAN_MAX_RANK 4
#define MGC_PLAN_MAX_IO 8

/* Tensor flags. */
#define MGC_PT_ROUTED 1u /* rows of dropless expert routing: sized for the worst case (every row a
                            rank could receive), of which the routed ones, a prefix, are used;
                            with balanced routing a rank receives as many as it sends (the cost
                            model prices by that; docs/cost-model.md) */

typedef struct mgc_plan_tensor {
    uint32_t name;        /* string table offset */
    uint16_t dtype;       /* mgc_dtype */
    uint16_t rank;        /* dims used */
    int64_t dim[MGC_PLAN_MAX_RANK]; /* local (per-rank, partitioned) shape, outermost first */
    uint16_t role;        /* mgc_plan_tensor_role */
    uint16_t split_axis;  /* which dim is sharded (MGC_PLAN_NO_SPLIT when replicated) */
    uint16_t split_group; /* mgc_group_kind the shard index comes from */
    uint16_t flags;       /* MGC_PT_* (0 in plans written before the flags existed) */
    int32_t buffer;       /* index into the stage's buffers; MGC_PLAN_BUF_STASH: the STASH buffer
                             of the (mb, chunk) being run; -1 none (not materialised) */
    uint32_t ld;          /* row pitch: elements from one row (of the innermost dim) to the next;
                             0 dense (= dim[rank-1]).  Only the output of an MGC_POF_INPLACE op
                             that is narrower than its input has one (mgc_plan_validate) */
    uint64_t offset;      /* byte offset inside that buffer */
    uint64_t bytes;       /* local bytes: rows x (ld or the innermost dim) x dtype size */
    uint32_t view;        /* 1 + the tensor whose bytes this one is a part of: a range of its
                             outermost dim (the loss chunks, compiler/losschunk.c), at the same
                             buffer, offset - that tensor's offset bytes in; 0 none.  Same dtype,
                             role and inner dims; never a view of a view (mgc_plan_validate) */
    uint16_t split2_axis;  /* a second sharded dim, MGC_PLAN_NO_SPLIT when none: an expert
                              weight's FFN dim over ETP (its first split is EP's, dim 0), the
                              sequence (dim 0) of q, k, v over CP when the first is TP's heads */
    uint16_t split2_group; /* mgc_group_kind of that second shard index */
} mgc_plan_tensor;

/* Elements from one row of t to the next: t->ld, or the innermost dim when dense (1 for a
 * scalar). */
int64_t mgc_plan_tensor_ld(const mgc_plan_tensor *t);
/* The bytes of t's elements, without the gaps a row pitch leaves: numel x dtype size. */
uint64_t mgc_plan_tensor_data_bytes(const mgc_plan_tensor *t);

#define MGC_PLAN_NO_SPLIT 0xffffu
#define MGC_PLAN_BUF_STASH (-2) /* tensor.buffer: the per-(mb, chunk) stash buffer */

typedef enum mgc_plan_tensor_role {
    MGC_TR_PARAM = 0,     /* trainable weight (compute dtype) */
    MGC_TR_GRAD,          /* gradient of a param (fp32 main grad) */
    MGC_TR_ACTIVATION,    /* forward value */
    MGC_TR_ACT_GRAD,      /* gradient of an activation */
    MGC_TR_INPUT,         /* tokens, labels, loss mask */
    MGC_TR_LOSS,
    MGC_TR_WORKSPACE,
} mgc_plan_tensor_role;

/* One op of a chunk program: a compute kernel, a GEMM or a collective. */
typedef struct mgc_plan_op {
    uint16_t kind;        /* mgc_plan_op_kind */
    uint16_t flags;       /* MGC_POF_* */
    int32_t layer;        /* decoder layer; -1 embedding/head */
    uint32_t name;        /* string table offset (module path) */
    uint16_t n_in, n_out;
    int32_t in[MGC_PLAN_MAX_IO];  /* chunk tensor indices */
    int32_t out[MGC_PLAN_MAX_IO];
    uint16_t group;       /* collectives: mgc_group_kind */
    uint16_t pad_;
    uint32_t seq;         /* collectives: sequence number within (group, microbatch, chunk pass) */
    double fattr[4];      /* float attributes (eps, dropout p, scale, ...) */
    int64_t iattr[4];     /* integer attributes (op-kind specific, docs/plan-format.md) */
    uint64_t flops;       /* GEMM FLOPs as executed on this rank */
} mgc_plan_op;

typedef enum mgc_plan_op_kind {
    /* forward compute: the IR op kinds, partitioned */
    MGC_POP_EMBEDDING = 0, MGC_POP_DROPOUT, MGC_POP_NORM, MGC_POP_LINEAR, MGC_POP_QKV_SPLIT,
    MGC_POP_ROPE, MGC_POP_ATTENTION, MGC_POP_DROPOUT_ADD, MGC_POP_GELU, MGC_POP_SWIGLU,
    MGC_POP_ADD, MGC_POP_MOE_ROUTE, MGC_POP_MOE_DISPATCH, MGC_POP_GROUPED_LINEAR,
    MGC_POP_MOE_COMBINE, MGC_POP_CROSS_ENTROPY,
    MGC_POP_ADD_NORM,     /* fused dropout_add + norm (compiler/fusion.c): in branch, residual,
                             weight (, bias); out h = residual + dropout(branch), y = norm(h)
                             (, dropout mask) */
    MGC_POP_LINEAR_GELU,  /* fused linear + gelu (compiler/fusion.c): in x, W (, bias); out
                             y = gelu(h), h = x W^T (+ bias) (the GELU input the backward reads) */
    MGC_POP_EMBEDDING_NORM, /* fused embedding (+ its dropout) + the first layer's norm
                               (compiler/fusion.c): in tokens, word (, positions), the norm's
                               weight (, its bias) (, doc starts); out x = the embedding (after
                               its dropout), y = norm(x) (, the dropout's mask: then fattr[2]
                               = p; mgc_plan_emb_norm_io) */
    /* backward compute */
    MGC_POP_EMBEDDING_BWD = 32, MGC_POP_DROPOUT_BWD, MGC_POP_NORM_BWD, MGC_POP_LINEAR_DGRAD,
    MGC_POP_LINEAR_WGRAD, MGC_POP_QKV_SPLIT_BWD, MGC_POP_ROPE_BWD, MGC_POP_ATTENTION_BWD,
    MGC_POP_DROPOUT_ADD_BWD, MGC_POP_GELU_BWD, MGC_POP_SWIGLU_BWD, MGC_POP_ADD_BWD,
    MGC_POP_MOE_ROUTE_BWD, MGC_POP_MOE_DISPATCH_BWD, MGC_POP_GROUPED_LINEAR_DGRAD,
    MGC_POP_GROUPED_LINEAR_WGRAD, MGC_POP_MOE_COMBINE_BWD, MGC_POP_CROSS_ENTROPY_BWD,
    MGC_POP_LINEAR_DGRAD_GELU, /* fused linear_dgrad + gelu_bwd (compiler/fusion.c): in dy, W, h
                                  (the GELU input); out dh = gelu'(h) * (dy W) */
    /* collectives inserted by partitioning */
    MGC_POP_ALL_REDUCE = 64, MGC_POP_ALL_GATHER, MGC_POP_REDUCE_SCATTER, MGC_POP_ALL_TO_ALL,
    MGC_POP_BROADCAST,
    MGC_POP__END
} mgc_plan_op_kind;

#define MGC_POP_LAST_FWD MGC_POP_EMBEDDING_NORM    /* forward kinds are 0 .. this */
#define MGC_POP_LAST_BWD MGC_POP_LINEAR_DGRAD_GELU /* backward kinds are 32 .. this */

#define MGC_POF_RECOMPUTE 1u /* a forward op of a backward program: re-run for recompute, or the
                                loss chunks' head, run there only (compiler/losschunk.h) */
#define MGC_POF_SAVED 2u     /* its outputs are stashed for the backward */
#define MGC_POF_QKV 4u       /* attention, attention_bwd: q, k and v are read in place from the
                                fused projection (compiler/fusion.c; mgc_plan_attn_geom) */
#define MGC_POF_INPLACE 8u   /* out[0] occupies in[0]'s bytes (the memory plan's in-place outputs,
                                compiler/memplan.c mgc_memplan_inplace): cross_entropy_bwd writes
                                the logits' gradient over the fp32 logits, each row over its own
                                row, so a 16-bit gradient has a row pitch (ld) of twice its
                                width.  in[0] is read by no later op */
#define MGC_POF_ROPE 16u     /* qkv_split: q and k leave rotated (rotary embedding fused,
                                compiler/fusion.c); qkv_split_bwd: their gradients are rotated
                                back as they join.  iattr[3] the rotary dim (even, <= head dim),
                                fattr[0] the base (theta), fattr[1] the context-parallel degree
                                of the positions, as the rope ops' iattr[0], fattr[0], iattr[1] */
#define MGC_POF_DOCS 32u     /* the last input is doc_start (s_c, b) int32, the position each
                                row's document starts at.  attention, attention_bwd
                                (data.reset_attention_mask): key j is visible from query i iff
                                doc_start(i) <= kpos(j) (and kpos(j) <= qpos(i) when causal);
                                rope, rope_bwd, the rotating qkv split and join, embedding
                                and embedding_bwd (data.reset_position_ids): row (i, b)'s
                                position is pos(i) - doc_start(i, b) */
#define MGC_POF_ROWS 64u     /* gelu, swiglu and their backwards on dropless expert rows received
                                over EP (their first input MGC_PT_ROUTED): the last input is the
                                tokens per local expert (E_l) int64, and only the first sum of
                                it rows are live; the rest are neither read nor written */
#define MGC_POF_CE_STATS 128u /* cross_entropy_bwd of a loss chunk at tensor parallel 1
                                (compiler/losschunk.h): the forward's statistics fused in, one
                                pass over the logits.  in: logits, labels, mask, count (the
                                whole microbatch's, (0, n)); out: dlogits (in place over the
                                logits), lse, the chunk's loss (sum, count) -- what the
                                cross-entropy of phase 3 and the unfused backward compute, bit
                                for bit */
#define MGC_POF_COLSUM 256u  /* norm_bwd: an fp32 output after dw (and the norm's db) is the
                                bias gradient of the linear whose output gradient is dx (out[0];
                                compiler/fusion.c), or with MGC_POF_DROPBWD the branch's
                                gradient: db += the column sums of that tensor, rows ascending,
                                as linear_wgrad adds them (mgc_plan_norm_bwd_io).
                                attention_bwd with MGC_POF_QKV (within version 10): out[1], an
                                fp32 vector of qkv's width, is the QKV projection's bias
                                gradient: db += the column sums of dqkv (out[0]) likewise.
                                linear_dgrad_gelu (within version 10): out[1], an fp32 vector
                                of dh's width (iattr[2]), is the bias gradient of the linear
                                that reads dh: db += the column sums of dh (out[0]) likewise */
#define MGC_POF_DROPBWD 512u /* norm_bwd: the backward of the dropout_add whose sum the norm
                                read (compiler/fusion.c): the last input is that dropout's mask
                                (u8), the last output the branch's gradient dbr = dx as stored
                                x mask / (1 - p), rounded as dropout_add_bwd rounds it;
                                fattr[1] = p (mgc_plan_norm_bwd_io) */

/* Where norm_bwd's optional inputs and outputs are (each -1 when absent): in: x, w, dy, then
 * the fused residual gradient g (res), then the dropout's mask (MGC_POF_DROPBWD); out: dx, dw,
 * the norm's db (LayerNorm with a bias), the fused bias gradient (cs, MGC_POF_COLSUM), the
 * branch's gradient (dbr, MGC_POF_DROPBWD).  sets: the fp32 column-sum outputs (dw, db, cs),
 * 1 to 3, the GPU kernel's sets of partial sums.  Returns -1 when the counts do not fit the
 * flags. */
typedef struct mgc_norm_bwd_io {
    int res, mask, db, cs, dbr, sets;
} mgc_norm_bwd_io;
static inline int mgc_plan_norm_bwd_io(const mgc_plan_op *op, mgc_norm_bwd_io *io) {
    int drop = (op->flags & MGC_POF_DROPBWD) != 0, cs = (op->flags & MGC_POF_COLSUM) != 0;
    int nin = op->n_in - drop, nout = op->n_out - drop - cs; /* without them: 3-4, 2-3 */
    io->res = nin == 4 ? 3 : -1;
    io->mask = drop ? op->n_in - 1 : -1;
    io->db = nout == 3 ? 2 : -1;
    io->cs = cs ? nout : -1;
    io->dbr = drop ? op->n_out - 1 : -1;
    io->sets = nout - 1 + cs;
    return nin < 3 || nin > 4 || nout < 2 || nout > 3 ? -1 : 0;
}
static inline int mgc_plan_norm_bwd_sets(const mgc_plan_op *op) {
    mgc_norm_bwd_io io;
    return mgc_plan_norm_bwd_io(op, &io) ? 1 : io.sets;
}

/* Where embedding_norm's inputs are: tokens 0, word 1, then the positions (iattr[1] set: learned
 * positions, as the embedding's), the norm's weight, its bias (LayerNorm with one) and the
 * document starts (MGC_POF_DOCS), each -1 when absent.  iattr[0..3] are the embedding's,
 * fattr[0] the norm's eps, fattr[1] 1 for RMSNorm (the norm's iattr[0]) and 0 for LayerNorm,
 * fattr[2] the embedding dropout's p when the op has its mask as a third output (0 without:
 * the op is then named as that dropout, whose stream it draws; mgc_op_dropout_stream).
 * 0, or -1 when n_in does not fit these. */
typedef struct mgc_emb_norm_io {
    int pos, w, b, docs; /* input indices, -1: none */
} mgc_emb_norm_io;
static inline int mgc_plan_emb_norm_io(const mgc_plan_op *op, mgc_emb_norm_io *io) {
    int k = 2, docs = (op->flags & MGC_POF_DOCS) != 0;
    io->pos = op->iattr[1] ? k++ : -1;
    io->w = k++;
    int extra = (int)op->n_in - k - docs; /* the bias: 0 or 1 */
    if (extra < 0 || extra > 1 || (extra && op->fattr[1] != 0)) return -1;
    io->b = extra ? k++ : -1;
    io->docs = docs ? k++ : -1;
    return 0;
}

/* moe_route and moe_route_bwd of phase 0 keep three numbers in iattr[3]: the score function
 * (config.h mgc_score) in bits 0-7, and group-limited routing's expert groups in bits 8-31 and
 * groups a token may use in bits 32-55 (both 0 without a group limit, as in older plans). */
#define MGC_ROUTE_SCORE(a) ((int)((uint64_t)(a) & 0xffu))
#define MGC_ROUTE_GROUPS(a) ((int64_t)(((uint64_t)(a) >> 8) & 0xffffffu))
#define MGC_ROUTE_GROUP_TOPK(a) ((int64_t)(((uint64_t)(a) >> 32) & 0xffffffu))
#define MGC_ROUTE_PACK(score, groups, group_topk)                                                  \
    ((int64_t)(((uint64_t)(score) & 0xffu) | ((uint64_t)(groups) & 0xffffffu) << 8 |              \
               ((uint64_t)(group_topk) & 0xffffffu) << 32))

/* The layer N of a router's expert bias, an input named "...layers.N.mlp.router.expert_bias"
 * (moe.expert_bias_update_rate; the runtime keeps its values), or -1 for any other name. */
int64_t mgc_plan_expert_bias_layer(const char *name);

/* "linear", "linear_dgrad", "all_reduce", ...; "?" for an unused value. */
const char *mgc_plan_op_name(mgc_plan_op_kind k);
/* The fattr index of op's dropout probability (dropout and dropout-add: 0; add-norm,
 * attention, forward and backward, and a norm backward with the dropout's backward
 * (MGC_POF_DROPBWD): 1; an embedding_norm with its dropout's mask: 2), or -1 for an op
 * without one.  An evaluation runs the
 * ops with that attribute 0 (mgc-run, docs/runtime.md "Evaluation"). */
int mgc_plan_op_dropout_attr(const mgc_plan_op *op);
const char *mgc_tensor_role_name(mgc_plan_tensor_role r);

typedef struct mgc_plan_chunk {
    int32_t first_layer, num_layers; /* decoder layers in this chunk */
    uint8_t embedding, loss;         /* holds the embedding / the head and loss */
    uint8_t pad_[2];
    int64_t n_tensors;
    mgc_plan_tensor *tensors;        /* (n_tensors) */
    int64_t n_fwd, n_bwd;
    mgc_plan_op *fwd;                /* (n_fwd) forward program of one microbatch */
    mgc_plan_op *bwd;                /* (n_bwd) backward program (recompute ops first, flagged) */
    uint64_t stash_bytes;            /* activations one microbatch keeps from forward to backward */
    uint64_t send_bytes;             /* activation sent to the next stage per microbatch */
} mgc_plan_chunk;

/* The geometry of an ATTENTION or ATTENTION_BWD op.  Unfused: q (sq, b, A, d), k and v
 * (sk, b, G, d) are inputs 0..2 (the backward's out, lse, dout 3..5; its outputs dq, dk, dv).
 * Fused (MGC_POF_QKV): input 0 is the fused projection qkv (s, b, G (A/G + 2) d) -- kv group g's
 * A/G query heads, then its key, then its value -- with A = iattr[1], G = iattr[2] and sq = sk
 * = s; the backward's out, lse, dout are inputs 1..3 and its one output is d qkv. */
typedef struct mgc_attn_geom {
    int64_t sq, sk, b, A, G, d;
    int fused;
    int in_out; /* the backward's input index of out (lse, dout follow) */
} mgc_attn_geom;
/* 0, or -1 when the op's tensors do not make such a geometry. */
int mgc_plan_attn_geom(const mgc_plan_chunk *ch, const mgc_plan_op *op, mgc_attn_geom *g);

/* ---- the schedule: instruction stream of one pipeline rank ---------------- */

typedef enum mgc_instr_op {
    MGC_I_LOAD_BATCH = 0, /* read microbatch mb's inputs; arg: 1 tokens, 2 labels + loss mask,
                             4 document starts, 8 the routers' expert biases */
    MGC_I_FORWARD,        /* run chunk's fwd program for mb */
    MGC_I_BACKWARD,       /* run chunk's bwd program for mb (recompute first when planned) */
    MGC_I_SEND_ACT,       /* send (mb, chunk)'s output activation to pipeline rank `peer` */
    MGC_I_RECV_ACT,       /* receive (mb, chunk)'s input activation from `peer` */
    MGC_I_SEND_GRAD,      /* send the input-activation gradient of (mb, chunk) to `peer` */
    MGC_I_RECV_GRAD,      /* receive the output-activation gradient of (mb, chunk) from `peer` */
    MGC_I_REDUCE_GRADS,   /* data-parallel reduction of gradient bucket `arg` (all-reduce, or
                             reduce-scatter with the distributed optimizer) */
    MGC_I_EMBED_GRADS,    /* all-reduce the tied embedding's gradient over MGC_GROUP_EMBED */
    MGC_I_OPTIMIZER,      /* clip + AdamW step on this rank's (shard of the) parameters */
    MGC_I_GATHER_PARAMS,  /* distributed optimizer: all-gather updated bucket `arg` */
    MGC_I__COUNT
} mgc_instr_op;

typedef struct mgc_instr {
    uint16_t op;     /* mgc_instr_op */
    uint16_t chunk;  /* model chunk on this rank (0..vp-1) */
    int32_t mb;      /* microbatch, -1 when not per-microbatch */
    int32_t peer;    /* pipeline rank of the peer (send/recv), -1 otherwise */
    uint32_t arg;    /* bucket index, ... */
    uint64_t seq;    /* send/recv: sequence number on the (this, peer) link; collectives: in its group */
} mgc_instr;

/* ---- the memory plan: one arena per pipeline rank ------------------------- */

typedef enum mgc_buf_kind {
    MGC_BUF_WEIGHT = 0,   /* parameters in compute dtype */
    MGC_BUF_GRAD,         /* fp32 main gradients */
    MGC_BUF_MASTER,       /* fp32 master weights (or shard) */
    MGC_BUF_ADAM_M,       /* first moment (or shard) */
    MGC_BUF_ADAM_V,       /* second moment (or shard) */
    MGC_BUF_STASH,        /* activations kept from forward to backward for (mb, chunk) */
    MGC_BUF_ACTIVATION,   /* transient activations and their gradients within one pass */
    MGC_BUF_RECOMPUTE,    /* recompute outputs */
    MGC_BUF_LOGITS,
    MGC_BUF_WORKSPACE,    /* GEMM / kernel scratch */
    MGC_BUF_COMM,         /* send/recv and collective staging */
    MGC_BUF_INPUT,        /* tokens, labels, loss mask */
    MGC_BUF__COUNT
} mgc_buf_kind;

const char *mgc_buf_kind_name(mgc_buf_kind k);

typedef struct mgc_buffer {
    uint32_t name;        /* string table offset */
    uint16_t kind;        /* mgc_buf_kind */
    uint16_t chunk;       /* owning chunk (0xffff: whole rank) */
    int32_t mb;           /* microbatch for per-microbatch buffers, -1 persistent */
    uint32_t pad_;
    uint64_t bytes;       /* size */
    uint64_t offset;      /* in the arena, aligned to MGC_PLAN_ALIGN */
    int64_t live_begin;   /* first instruction index (in the stage's stream) it is live at */
    int64_t live_end;     /* one past the last; persistent buffers span [0, n_instrs] */
} mgc_buffer;

#define MGC_PLAN_ALIGN 256u

/* ---- gradient buckets ------------------------------------------------------
 * What REDUCE_GRADS `arg` and GATHER_PARAMS `arg` name: a contiguous range of
 * the stage's flat parameter element space (docs/memory-plan.md), inside one
 * chunk's dense or expert section.  Dense buckets reduce over MGC_GROUP_DPCP,
 * expert buckets over MGC_GROUP_EDP, so a bucket never mixes the two.  With
 * the distributed optimizer a bucket is reduce-scattered in place into
 * `shards` equal pieces (rank i of the group owns piece i) and all-gathered
 * back after OPTIMIZER; without it it is all-reduced (shards = 1).  Buckets
 * are listed in reverse layout order (bucket 0 ends the flat space): the
 * backward produces the last layers' gradients first, as Megatron fills its
 * buckets. */
typedef struct mgc_bucket {
    uint16_t group;         /* mgc_group_kind: MGC_GROUP_DPCP (dense) or MGC_GROUP_EDP (expert) */
    uint16_t chunk;         /* the chunk whose section holds it (0..vp-1) */
    uint32_t pad_;
    int64_t shards;         /* D: reduce-scatter pieces (dp*cp or edp with the distributed
                               optimizer, else 1); divides count */
    uint64_t begin;         /* first element in the flat parameter space */
    uint64_t count;         /* elements (padding included) */
    int32_t grad_buffer;    /* the stage's GRAD buffer (index into buffers) */
    int32_t weight_buffer;  /* the stage's WEIGHT buffer */
    uint64_t grad_offset;   /* bytes inside grad_buffer = begin * 4 (fp32 main grads) */
    uint64_t grad_bytes;    /* = count * 4 */
    uint64_t weight_offset; /* bytes inside weight_buffer = begin * compute dtype size */
    uint64_t weight_bytes;  /* = count * compute dtype size */
} mgc_bucket;

/* ---- one pipeline rank's program --------------------------------------- */

typedef struct mgc_stage_program {
    int64_t pp_rank;
    int64_t n_chunks;              /* = grid.vp */
    mgc_plan_chunk *chunks;        /* (n_chunks) */
    int64_t n_instrs;
    mgc_instr *instrs;             /* (n_instrs) */
    int64_t n_buffers;
    mgc_buffer *buffers;           /* (n_buffers) */
    uint64_t arena_bytes;          /* the arena mgc-run allocates on every rank of this stage */
    uint64_t by_kind[MGC_BUF__COUNT]; /* peak-time bytes per kind (see docs) */
    int64_t max_in_flight;         /* most microbatches stashed at once */
    int64_t n_buckets;             /* = the REDUCE_GRADS instructions of the stream */
    mgc_bucket *buckets;           /* (n_buckets) gradient buckets, reverse layout order */
} mgc_stage_program;

/* ---- the plan ------------------------------------------------------------ */

typedef struct mgc_plan_kv {
    uint32_t key;    /* string table offset: "model.hidden_size" */
    uint16_t type;   /* 0 int, 1 float, 2 string */
    uint16_t pad_;
    int64_t i;       /* int / bool / enum index */
    double f;
    uint32_t s;      /* string table offset */
    uint32_t pad2_;
} mgc_plan_kv;

/* ---- compiled kernels (optional) ------------------------------------------
 * The cubins NVRTC made at `mgc compile` for each kernel spec of the plan
 * (codegen/kspec.h) and each target architecture; `name` is the spec's name,
 * which is also the kernel's symbol in its cubin.  Stored in the optional
 * plan-wide sections KERN (the table) and KBIN (the bytes) after the stages;
 * a plan compiled without kernels has none (docs/plan-format.md). */
typedef struct mgc_plan_kernel {
    uint32_t name;   /* string table offset: "mgc_layernorm_fwd_bf16_H1024" */
    uint32_t arch;   /* compute capability x 10 + minor: 80, 90 */
    uint64_t offset; /* into kbin */
    uint64_t bytes;  /* cubin size */
} mgc_plan_kernel;

typedef struct mgc_plan {
    mgc_grid grid;
    int64_t num_microbatches;   /* per step per data-parallel rank */
    int64_t micro_batch_size;
    int64_t seq_length;
    int32_t schedule;           /* mgc_sched from config.h (0 gpipe, 1 1f1b, 2 interleaved) */
    int32_t recompute;          /* 0 none, 1 selective, 2 full */
    int32_t distributed_optimizer;
    int32_t pad_;
    double bubble_fraction;     /* idle / total, by the schedule simulator with uniform costs */
    double model_flops_per_iter;
    int64_t n_config;
    mgc_plan_kv *config;        /* the resolved config (every schema key) */
    int64_t n_stages;           /* = grid.pp */
    mgc_stage_program *stages;  /* (n_stages) */
    char *strings;              /* string table: NUL-terminated strings back to back;
                                   offset 0 is always "" (the first byte is NUL) */
    uint64_t strings_len;
    uint64_t strings_cap;
    int64_t n_kernels;          /* compiled kernels (0: the plan carries none) */
    mgc_plan_kernel *kernels;   /* (n_kernels) */
    uint8_t *kbin;              /* (kbin_len) the cubins back to back, 8-aligned */
    uint64_t kbin_len;
    /* private to plan.c: the intern index (open addressing; each slot is two
     * words, offset + 1 (0 empty) and the string's hash); built lazily from
     * the table, never written to a file */
    uint32_t *str_index;
    uint64_t str_index_cap;     /* slots, a power of two (0: not built) */
    uint64_t str_index_used;
} mgc_plan;

/* A zeroed plan (NULL on OOM).  Free with mgc_plan_free, which frees every
 * array the plan points to (nested ones included): allocate them with
 * malloc/calloc.  mgc_plan_free(NULL) is a no-op. */
mgc_plan *mgc_plan_new(void);
void mgc_plan_free(mgc_plan *p);
/* Intern a string in the table; returns its offset (or UINT32_MAX on OOM or
 * when the table would pass 4 GiB).  Equal strings share one offset; "" and
 * NULL give 0; a pointer into the table itself (from mgc_plan_strat) gives
 * its own offset. */
uint32_t mgc_plan_str(mgc_plan *p, const char *s);
/* The string at `off`; "" for 0, NULL when off is outside the table. */
const char *mgc_plan_strat(const mgc_plan *p, uint32_t off);

/* The resolved config value of `key` ("model.hidden_size"): 1 and *out set when
 * present with that type (int also covers bool and enum index; float accepts an
 * int entry), 0 when absent.  _str returns NULL when absent.  Linear scans: for
 * start-up, not inner loops. */
int mgc_plan_config_int(const mgc_plan *p, const char *key, int64_t *out);
int mgc_plan_config_float(const mgc_plan *p, const char *key, double *out);
const char *mgc_plan_config_str(const mgc_plan *p, const char *key);

/* Write atomically (temp file + rename: a failed write never leaves a
 * half-written plan) and read with full validation.  `err` receives a
 * one-line message naming the file, the problem and a hint (err may be NULL;
 * the message is cut to errsz bytes). */
mgc_plan_status mgc_plan_write(const mgc_plan *p, const char *path, char *err, size_t errsz);
mgc_plan_status mgc_plan_read(const char *path, mgc_plan **out, char *err, size_t errsz);
/* The same on memory (tests, fuzzing). *out_buf is malloc'd. */
mgc_plan_status mgc_plan_encode(const mgc_plan *p, uint8_t **out_buf, size_t *out_len, char *err, size_t errsz);
mgc_plan_status mgc_plan_decode(const uint8_t *buf, size_t len, const char *name, mgc_plan **out, char *err,
                                size_t errsz);
/* Structural invariants (indices in range, buffers inside the arena, ...),
 * listed in docs/plan-format.md; mgc_plan_write and mgc_plan_decode run it.
 * MGC_PLAN_ERR_INVALID with the first violation in err. */
mgc_plan_status mgc_plan_validate(const mgc_plan *p, char *err, size_t errsz);
/* 1 when `path` exists and is neither a regular file nor a directory (a
 * device such as /dev/null, a FIFO, a socket).  Every writer in mgc writes a
 * temporary file and renames it over its target so a failure never leaves a
 * half-written file; for such a target it writes in place instead, because
 * renaming over it would replace the device (fsutil.c). */
int mgc_path_is_special(const char *path);

/* "ok", "i/o error", ... for a status. */
const char *mgc_plan_status_name(mgc_plan_status s);

#ifdef __cplusplus
}
#endif
#endif /* MGC_PLAN_H */
