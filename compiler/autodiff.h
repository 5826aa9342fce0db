/* autodiff.h - the chunk builder shared by partition.c and autodiff.c (internal).
 *
 * partition.c fills a builder with the partitioned forward program of one
 * chunk; mgc_autodiff() then appends the backward program, decides the
 * saved set for the recompute mode and packs the stash; partition.c numbers
 * the collectives, drops unreferenced tensors and exports an mgc_plan_chunk.
 * Nothing here is public API: partition.h is.  docs/partitioning.md
 * describes the rules.
 */
#ifndef MGC_AUTODIFF_H
#define MGC_AUTODIFF_H

#include <stdint.h>

#include "config.h"
#include "diag.h"
#include "ir.h"
#include "partition.h"
#include "plan.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Side data of a forward op. */
typedef struct mgc_cb_fop {
    int32_t all_out[MGC_PLAN_MAX_IO]; /* outputs including optional ones (dropout mask,
                                         attention logsumexp), attached only when saved */
    int n_all_out;
    uint8_t in_ar[MGC_PLAN_MAX_IO]; /* the gradient of input j is partial over TP:
                                       all-reduce it (Megatron's f, column-parallel input) */
    uint8_t regather;               /* an all-gather the backward redoes instead of saving */
    uint8_t root;                   /* the loss: the backward starts here */
    uint8_t part;                   /* mgc_ir_part of the IR op it came from */
    int32_t ref[3];                 /* tensors the backward needs that the op does not read:
                                       MOE_ROUTE phase 0 {reduced counts of the aux loss};
                                       the loss op {logits, labels, loss mask} */
} mgc_cb_fop;

/* Side data of a tensor, private to the builder. */
typedef struct mgc_cb_tx {
    int32_t fprod;    /* forward op writing it (optional outputs too), -1 */
    int32_t grad;     /* current gradient (ACT_GRAD) or accumulator (GRAD), -1 */
    int32_t re;       /* its recomputed / re-gathered copy in the backward, -1 */
    uint8_t saved;    /* kept from forward to backward */
    uint8_t optional; /* an optional output */
    uint8_t crosses;  /* read by an op of another layer (or outside the layers) */
    uint8_t ngrad;    /* gradient tensors made for it so far (for their names) */
} mgc_cb_tx;

typedef struct mgc_cb {
    const mgc_config *c;
    const mgc_graph *g;
    mgc_plan *plan;
    mgc_diags *d;
    int recompute; /* mgc_recompute */
    uint32_t recompute_modules; /* MGC_RECOMPUTE_MOD_* (config.h) */
    mgc_dtype dt;  /* compute dtype */
    int64_t tp, cp, ep, etp;
    int sp; /* sequence parallelism in effect */
    int part; /* mgc_ir_part of the IR op being partitioned (forward ops take it) */

    mgc_plan_tensor *t; /* (nt) tensors */
    mgc_partition_tensor_info *ti;
    mgc_cb_tx *tx;
    int64_t nt, cap_t;

    mgc_plan_op *f; /* (nf) forward program */
    mgc_cb_fop *fx;
    int64_t nf, cap_f;

    mgc_plan_op *b; /* (nb) backward program */
    int64_t nb, cap_b;

    int32_t in_act, in_grad, out_act, out_grad, loss; /* -1 when absent */
    int failed;    /* out of memory or an internal inconsistency */
    char why[200]; /* the first failure */
} mgc_cb;

/* Record the first failure (the builder keeps going softly). */
void mgc_cb_fail(mgc_cb *b, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;

/* Append a tensor (role, dtype, local dims, primary split); name is interned.
 * Info fields start as: ir -1, layer -1, grad_of -1, recompute_of -1, no
 * second split.  Returns the index, -1 on failure. */
int32_t mgc_cb_tensor(mgc_cb *b, const char *name, mgc_plan_tensor_role role, mgc_dtype dt,
                      int rank, const int64_t *dims, uint16_t split_axis, uint16_t split_group);
/* A new tensor shaped like `like` (dims, split, layer) with another name,
 * role and dtype. */
int32_t mgc_cb_tensor_like(mgc_cb *b, int32_t like, const char *suffix, mgc_plan_tensor_role role,
                           mgc_dtype dt);
/* Append an op to the forward (pass 0) or backward (pass 1) program; the
 * op is copied.  For forward ops `all_out` (may be NULL: the op's outputs)
 * lists optional outputs too.  Returns the index, -1 on failure. */
int32_t mgc_cb_op(mgc_cb *b, int pass, const mgc_plan_op *op);
/* Elements of tensor t. */
uint64_t mgc_cb_numel(const mgc_cb *b, int32_t t);
/* Fill a collective op's iattr from its tensors (elements, dtype, flags). */
void mgc_cb_coll_attrs(const mgc_cb *b, mgc_plan_op *op, uint32_t flags);
/* Interned "<base><suffix>". */
uint32_t mgc_cb_name(mgc_cb *b, const char *base, const char *suffix);

/* Make tensor `to` take the place of `from`: every op reference to `from`
 * is rewritten, and `to` takes its descriptor and side data (keeping its
 * role when keep_role).  `from` is left unreferenced (dropped on export). */
void mgc_cb_rename(mgc_cb *b, int32_t from, int32_t to, int keep_role);

/* Number the collectives of a program (seq per group, see partition.h). */
void mgc_cb_number(mgc_plan_op *ops, int64_t n);
/* Copy the builder into `out` (malloc'd arrays), dropping tensors no op
 * references (boundary tensors and the loss stay), set stash_bytes and
 * send_bytes, and fill `info` (may be NULL).  0, or -1 out of memory. */
int mgc_cb_export(mgc_cb *b, const mgc_stage *st, mgc_plan_chunk *out, mgc_partition_info *info);
/* Free the builder's arrays. */
void mgc_cb_free(mgc_cb *b);

/* Append the backward program, choose the saved set and pack the stash.
 * Needs b->in_act/out_act/out_grad/in_grad/loss set by the forward.  Returns
 * 0, or -1 with b->failed set. */
int mgc_autodiff(mgc_cb *b);

#ifdef __cplusplus
}
#endif
#endif /* MGC_AUTODIFF_H */
