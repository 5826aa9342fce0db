/* partition.c - see partition.h.  Sections: local sizes, tensor mapping
 * (params, inputs, activations), collectives, the forward partitioning of
 * each IR op kind (dense, MoE, head), one chunk, the public entry points.
 * autodiff.c holds the chunk builder (autodiff.h), derives the backward and
 * exports the chunk.
 *
 * Notation (docs/ir.md, docs/partitioning.md): s_c = s/cp is the sequence a
 * context rank holds (two chunks, load-balanced); s_t is the residual
 * stream's sequence on a rank: s_c/tp with sequence parallelism, else s_c.
 * a_l, g_l, V_l, E_l are local head, group, vocabulary and expert counts. */
#include "partition.h"

#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "autodiff.h"

#define NOG MGC_PARTITION_NO_GROUP
#define NOS MGC_PLAN_NO_SPLIT

/* ---- the partitioning context ---------------------------------------------------- */

typedef struct lsz {
    int64_t s, b, h;        /* sequence, microbatch, hidden */
    int64_t s_c, s_t;       /* CP-local sequence; residual-stream sequence */
    int64_t a_l, g_l, d;    /* local query heads, local kv heads, head dim */
    int64_t V_l;            /* vocabulary rows per tensor rank */
    int64_t E, E_l, k;      /* experts, local experts, top-k */
    int64_t T_l;            /* tokens a rank routes: s_t * b */
    int64_t C_l;            /* capacity per expert from the local tokens; 0 dropless */
    int64_t R_l, R_ep, R_x; /* rows: permuted, after the EP exchange, after the ETP gather
                               (upper bounds when dropless) */
    int64_t R_exp;          /* rows the expert GEMMs process with balanced routing */
} lsz;

typedef struct pctx {
    mgc_cb *b;
    const mgc_config *c;
    const mgc_graph *g;
    lsz z;
    uint16_t res_group; /* group of the residual stream's sequence split (NOG: whole) */
    uint16_t ctx_group; /* group of the CP-local sequence split (CP or NOG) */
    int32_t layer;      /* of the IR op being partitioned */
    int32_t *ir2t;      /* (g->n_tensors) chunk tensor of each IR tensor, -1 */
    int32_t memo_src[8], memo_dst[8]; /* sequence all-gathers already emitted */
    int n_memo;
    /* the MoE layer being partitioned */
    int32_t m_probs, m_ids, m_counts_l, m_counts_r, m_counts_x;
    int32_t m_tpe; /* the tokens per local expert of the layer's sorted rows (EP), -1 */
} pctx;

static int is_tp_axis(mgc_ir_axis a) {
    return a == MGC_IR_AXIS_QKV || a == MGC_IR_AXIS_QPROJ || a == MGC_IR_AXIS_FFN ||
           a == MGC_IR_AXIS_FFN_GLU || a == MGC_IR_AXIS_VOCAB || a == MGC_IR_AXIS_HEADS ||
           a == MGC_IR_AXIS_KV_HEADS;
}

static int div_exact(pctx *p, int64_t a, int64_t by, int64_t *out, const char *what) {
    if (by < 1 || a % by) {
        mgc_cb_fail(p->b, "%s (%" PRId64 ") is not divisible by %" PRId64, what, a, by);
        *out = 1;
        return -1;
    }
    *out = a / by;
    return 0;
}

static int64_t mul_or_fail(pctx *p, int64_t a, int64_t b, const char *what) {
    uint64_t r;
    if (a < 0 || b < 0 || mgc_ir_mul_u64((uint64_t)a, (uint64_t)b, &r) || r > INT64_MAX) {
        mgc_cb_fail(p->b, "%s overflows 64 bits", what);
        return 1;
    }
    return (int64_t)r;
}

static void local_sizes(pctx *p) {
    const mgc_ir_dims *dm = &p->g->dims;
    mgc_cb *b = p->b;
    lsz *z = &p->z;
    memset(z, 0, sizeof *z);
    z->s = dm->s;
    z->b = dm->b;
    z->h = dm->h;
    z->d = dm->d;
    div_exact(p, dm->s, b->cp, &z->s_c, "model.seq_length over parallel.context");
    if (b->cp > 1 && dm->s % (2 * b->cp))
        mgc_cb_fail(b, "seq_length is not divisible by 2 * context");
    z->s_t = z->s_c;
    if (b->sp) div_exact(p, z->s_c, b->tp, &z->s_t, "seq_length / context over parallel.tensor");
    div_exact(p, dm->a, b->tp, &z->a_l, "attention heads over parallel.tensor");
    if (dm->g % b->tp == 0)
        z->g_l = dm->g / b->tp;
    else if (b->tp % dm->g == 0)
        z->g_l = 1; /* kv heads replicated: tp/g ranks share one group */
    else
        mgc_cb_fail(b, "query groups (%" PRId64 ") and tensor (%" PRId64 ") do not divide", dm->g,
                    b->tp);
    if (z->g_l < 1) z->g_l = 1;
    if (z->a_l % z->g_l) mgc_cb_fail(b, "local heads do not split into local groups");
    div_exact(p, dm->V_pad, b->tp, &z->V_l, "padded vocabulary over parallel.tensor");
    if (dm->E <= 0) return;
    z->E = dm->E;
    z->k = dm->k;
    div_exact(p, dm->E, b->ep, &z->E_l, "moe.num_experts over parallel.expert");
    z->T_l = mul_or_fail(p, z->s_t, z->b, "tokens per rank");
    int64_t tk = mul_or_fail(p, z->T_l, z->k, "routed rows per rank");
    const double cf = p->c->moe.capacity_factor;
    if (cf > 0) {
        /* Megatron's get_capacity on the tokens this rank routes (the IR's
         * C is for the whole microbatch; the expression is the same). */
        double cap = ceil((double)tk / (double)z->E * cf);
        if (!(cap < 9.0e18)) mgc_cb_fail(b, "expert capacity overflows");
        z->C_l = cap < 1 ? 1 : (int64_t)cap;
        z->R_l = mul_or_fail(p, z->E, z->C_l, "padded expert rows");
        z->R_ep = z->R_l; /* ep sources x E_l local experts x C_l */
        z->R_x = mul_or_fail(p, b->etp, z->R_ep, "gathered expert rows");
        z->R_exp = z->R_x;
    } else {
        z->R_l = tk;
        int64_t per = z->k < z->E_l ? z->k : z->E_l; /* rows one token can send to one rank */
        z->R_ep = mul_or_fail(p, mul_or_fail(p, b->ep, z->T_l, "expert rows"), per, "expert rows");
        z->R_x = mul_or_fail(p, b->etp, z->R_ep, "gathered expert rows");
        z->R_exp = mul_or_fail(p, b->etp, tk, "expert rows");
    }
}

/* ---- ops and tensors ----------------------------------------------------------------- */

static mgc_plan_op mkop(pctx *p, mgc_plan_op_kind kind, const char *module, const char *suffix) {
    mgc_plan_op op;
    memset(&op, 0, sizeof op);
    op.kind = (uint16_t)kind;
    op.layer = p->layer;
    op.name = mgc_cb_name(p->b, module, suffix);
    op.group = NOG;
    return op;
}

static void io(mgc_plan_op *op, int n_in, const int32_t *in, int n_out, const int32_t *out) {
    op->n_in = (uint16_t)n_in;
    op->n_out = (uint16_t)n_out;
    for (int i = 0; i < n_in; i++)
        op->in[i] = in[i];
    for (int i = 0; i < n_out; i++)
        op->out[i] = out[i];
}

/* Append a forward op; `opt` (may be -1) becomes an optional output. */
static int32_t fwd(pctx *p, const mgc_plan_op *op, int32_t opt) {
    int32_t id = mgc_cb_op(p->b, 0, op);
    if (id >= 0 && opt >= 0) {
        mgc_cb_fop *fx = &p->b->fx[id];
        fx->all_out[fx->n_all_out++] = opt;
        p->b->tx[opt].fprod = id;
        p->b->tx[opt].optional = 1;
    }
    return id;
}

/* A tensor for IR tensor `ir` with local dims; binds it. */
static int32_t act(pctx *p, int32_t ir, mgc_dtype dt, int rank, const int64_t *dims, uint16_t ax,
                   uint16_t grp) {
    const mgc_ir_tensor *it = &p->g->tensors[ir];
    mgc_plan_tensor_role role = it->role == MGC_IR_ROLE_LOSS || it->role == MGC_IR_ROLE_AUX_LOSS
                                    ? MGC_TR_LOSS
                                    : MGC_TR_ACTIVATION;
    int32_t t = mgc_cb_tensor(p->b, it->name, role, dt, rank, dims, ax, grp);
    if (t < 0) return -1;
    p->b->ti[t].ir = ir;
    p->b->ti[t].layer = it->layer;
    p->b->ti[t].nodiff = (it->flags & MGC_IR_TF_NODIFF) != 0 || role == MGC_TR_LOSS;
    p->ir2t[ir] = t;
    return t;
}

/* A tensor made by partitioning, in the current layer. */
static int32_t tmp(pctx *p, const char *base, const char *suffix, mgc_dtype dt, int rank,
                   const int64_t *dims, uint16_t ax, uint16_t grp, int nodiff) {
    char name[256];
    snprintf(name, sizeof name, "%s%s", base, suffix);
    int32_t t = mgc_cb_tensor(p->b, name, MGC_TR_ACTIVATION, dt, rank, dims, ax, grp);
    if (t < 0) return -1;
    p->b->ti[t].layer = p->layer;
    p->b->ti[t].nodiff = nodiff != 0;
    return t;
}

static void set_split2(pctx *p, int32_t t, uint16_t ax, uint16_t grp) {
    if (t < 0 || grp == NOG) return;
    p->b->ti[t].split2_axis = ax;
    p->b->ti[t].split2_group = grp;
}

/* t holds rows of dropless expert routing received over EP, sized for the worst case (plan.h
 * MGC_PT_ROUTED; without EP every row count is exact) */
static void set_routed(pctx *p, int32_t t) {
    if (t >= 0 && p->z.C_l == 0 && p->b->ep > 1) p->b->ti[t].routed = 1;
}

static void set_partial(pctx *p, int32_t t, uint16_t grp) {
    if (t < 0) return;
    p->b->t[t].split_axis = NOS;
    p->b->t[t].split_group = grp;
    p->b->ti[t].partial = 1;
}

static mgc_dtype plan_dtype(mgc_ir_dtype d) {
    switch (d) {
    case MGC_IR_DTYPE_FP32:
        return MGC_DT_F32;
    case MGC_IR_DTYPE_BF16:
        return MGC_DT_BF16;
    case MGC_IR_DTYPE_FP16:
        return MGC_DT_F16;
    case MGC_IR_DTYPE_INT64:
        return MGC_DT_I64;
    default:
        return MGC_DT_I32;
    }
}

/* The shard of parameter `ir`, and its fp32 main-grad accumulator right
 * after it (so grads are in the order of their params). */
static int32_t param(pctx *p, int32_t ir) {
    mgc_cb *b = p->b;
    const mgc_ir_tensor *it = &p->g->tensors[ir];
    int64_t dims[MGC_PLAN_MAX_RANK];
    uint16_t ax = NOS, grp = NOG, ax2 = NOS, grp2 = NOG;
    int expert = it->pclass == MGC_IR_PCLASS_EXPERT;
    for (int i = 0; i < it->rank; i++) {
        int64_t n = it->dim[i].size;
        mgc_ir_axis a = it->dim[i].axis;
        if (expert && a == MGC_IR_AXIS_EXPERTS) {
            div_exact(p, n, b->ep, &n, "experts over parallel.expert");
            ax = (uint16_t)i, grp = MGC_GROUP_EP; /* always, so expert params are recognisable */
        } else if (expert && (a == MGC_IR_AXIS_FFN || a == MGC_IR_AXIS_FFN_GLU)) {
            div_exact(p, n, b->etp, &n, "expert ffn width over parallel.expert_tensor");
            if (b->etp > 1) ax2 = (uint16_t)i, grp2 = MGC_GROUP_ETP;
        } else if (!expert && a == MGC_IR_AXIS_QKV) {
            n = (p->z.a_l + 2 * p->z.g_l) * p->z.d; /* group-major: whole local groups */
            if (b->tp > 1) ax = (uint16_t)i, grp = MGC_GROUP_TP;
        } else if (!expert && is_tp_axis(a)) {
            div_exact(p, n, b->tp, &n, "a tensor-parallel width over parallel.tensor");
            if (b->tp > 1) ax = (uint16_t)i, grp = MGC_GROUP_TP;
        }
        dims[i] = n;
    }
    int32_t t =
        mgc_cb_tensor(b, it->name, MGC_TR_PARAM, plan_dtype(it->dtype), it->rank, dims, ax, grp);
    if (t < 0) return -1;
    b->ti[t].ir = ir;
    b->ti[t].layer = it->layer;
    b->ti[t].split2_axis = ax2;
    b->ti[t].split2_group = grp2;
    p->ir2t[ir] = t;
    int32_t gr = mgc_cb_tensor_like(b, t, ".grad", MGC_TR_GRAD, MGC_DT_F32);
    if (gr < 0) return -1;
    b->ti[gr].grad_of = t;
    b->ti[gr].ir = ir;
    b->tx[t].grad = gr;
    /* Sequence parallelism feeds each tensor rank different tokens: weights
     * replicated over the tensor group but applied to the sharded sequence
     * (norms, the router) get partial gradients, summed over TP once per
     * step.  Biases of row-parallel GEMMs are added on tensor rank 0 before
     * the reduction (see linear()), so their gradients are complete. */
    if (b->sp && (it->pclass == MGC_IR_PCLASS_NORM || it->pclass == MGC_IR_PCLASS_ROUTER))
        set_partial(p, gr, MGC_GROUP_TP);
    /* The query and key norms (model.qk_layernorm) are one weight over d that every head
     * uses, and each tensor rank holds its own heads: their gradients are partial over TP
     * with or without SP.  Replicated key/value heads are no exception: each replica's key
     * gradient is the part from its own queries, and the weight's gradient is linear in it. */
    if (b->tp > 1 && it->pclass == MGC_IR_PCLASS_NORM && it->rank == 1 &&
        it->dim[0].axis == MGC_IR_AXIS_HEAD_DIM)
        set_partial(p, gr, MGC_GROUP_TP);
    return t;
}

/* The chunk tensor of IR tensor `ir` read by the op being partitioned. */
static int32_t tin(pctx *p, int32_t ir) {
    mgc_cb *b = p->b;
    if (ir < 0 || ir >= p->g->n_tensors) {
        mgc_cb_fail(b, "IR tensor id %d out of range", (int)ir);
        return -1;
    }
    if (p->ir2t[ir] >= 0) return p->ir2t[ir];
    const mgc_ir_tensor *it = &p->g->tensors[ir];
    const lsz *z = &p->z;
    switch (it->role) {
    case MGC_IR_ROLE_PARAM:
        return param(p, ir);
    case MGC_IR_ROLE_TOKENS:
    case MGC_IR_ROLE_LABELS:
    case MGC_IR_ROLE_LOSS_MASK:
    case MGC_IR_ROLE_DOC_START: {
        int64_t dims[2] = {z->s_c, z->b};
        int32_t t = mgc_cb_tensor(b, it->name, MGC_TR_INPUT, plan_dtype(it->dtype), 2, dims,
                                  p->ctx_group == NOG ? NOS : 0, p->ctx_group);
        if (t >= 0) {
            b->ti[t].ir = ir;
            b->ti[t].nodiff = 1;
            p->ir2t[ir] = t;
        }
        return t;
    }
    case MGC_IR_ROLE_EXPERT_BIAS: { /* [E] fp32, every rank the same: the runtime's */
        int64_t dims[1] = {it->dim[0].size};
        int32_t t = mgc_cb_tensor(b, it->name, MGC_TR_INPUT, MGC_DT_F32, 1, dims, NOS, NOG);
        if (t >= 0) {
            b->ti[t].ir = ir;
            b->ti[t].nodiff = 1;
            p->ir2t[ir] = t;
        }
        return t;
    }
    default:
        /* an activation produced before this chunk: the residual stream
         * received from the previous stage, bound once */
        if (b->in_act >= 0 && b->ti[b->in_act].ir < 0 && it->rank == 3 &&
            it->dim[2].axis == MGC_IR_AXIS_HIDDEN) {
            b->ti[b->in_act].ir = ir;
            b->t[b->in_act].name = mgc_cb_name(b, it->name, NULL);
            p->ir2t[ir] = b->in_act;
            return b->in_act;
        }
        mgc_cb_fail(b, "'%s' is read before it is produced in this chunk", it->name);
        return -1;
    }
}

/* ---- collectives ----------------------------------------------------------------- */

/* Emit collective `kind` over `grp` from `in` to `out`; `sz1`/`sz2` are the
 * row-count tensors of a variable-size exchange (-1 when fixed). */
static int32_t coll(pctx *p, mgc_plan_op_kind kind, uint16_t grp, const char *module,
                    const char *suffix, int32_t in, int32_t out, int32_t sz1, int32_t sz2,
                    uint32_t flags, int regather) {
    if (in < 0 || out < 0) return -1;
    mgc_plan_op op = mkop(p, kind, module, suffix);
    int32_t ins[3] = {in, sz1, sz2};
    int n_in = sz1 >= 0 ? (sz2 >= 0 ? 3 : 2) : 1;
    io(&op, n_in, ins, 1, &out);
    op.group = grp;
    mgc_cb_coll_attrs(p->b, &op, flags);
    int32_t id = fwd(p, &op, -1);
    if (id >= 0) p->b->fx[id].regather = (uint8_t)regather;
    return id;
}

/* The residual-stream shard x [s_t, ...] all-gathered over TP along the
 * sequence: [s_c, ...] (sequence parallelism before a column-parallel GEMM).
 * The backward re-gathers it rather than stashing the full tensor. */
static int32_t gather_seq_tp(pctx *p, int32_t x, const char *module) {
    mgc_cb *b = p->b;
    for (int i = 0; i < p->n_memo; i++)
        if (p->memo_src[i] == x) return p->memo_dst[i];
    mgc_plan_tensor xt = b->t[x];
    xt.dim[0] *= b->tp;
    char name[256];
    snprintf(name, sizeof name, "%s.gathered", mgc_plan_strat(b->plan, b->t[x].name));
    int32_t y = mgc_cb_tensor(b, name, MGC_TR_ACTIVATION, (mgc_dtype)xt.dtype, xt.rank, xt.dim,
                              p->ctx_group == NOG ? NOS : 0, p->ctx_group);
    if (y < 0) return -1;
    b->ti[y].layer = p->layer;
    coll(p, MGC_POP_ALL_GATHER, MGC_GROUP_TP, module, ".all_gather", x, y, -1, -1, 0, 1);
    if (p->n_memo == 8) p->n_memo = 0;
    p->memo_src[p->n_memo] = x;
    p->memo_dst[p->n_memo++] = y;
    return y;
}

/* Reduce a row-parallel partial [s_c, b, h] over TP into the residual-stream
 * IR tensor `ir`: all-reduce (→ [s_c, b, h]) or, with sequence parallelism,
 * reduce-scatter along the sequence (→ [s_t, b, h]). */
static int32_t reduce_tp(pctx *p, int32_t partial, int32_t ir, const char *module) {
    const lsz *z = &p->z;
    mgc_cb *b = p->b;
    int64_t dims[3] = {p->b->sp ? z->s_t : z->s_c, z->b, z->h};
    int32_t y = act(p, ir, (mgc_dtype)b->t[partial].dtype, 3, dims, p->res_group == NOG ? NOS : 0,
                    p->res_group);
    if (b->sp)
        coll(p, MGC_POP_REDUCE_SCATTER, MGC_GROUP_TP, module, ".reduce_scatter", partial, y, -1, -1,
             0, 0);
    else
        coll(p, MGC_POP_ALL_REDUCE, MGC_GROUP_TP, module, ".all_reduce", partial, y, -1, -1, 0, 0);
    return y;
}

/* ---- dense ops ----------------------------------------------------------------- */

/* LINEAR iattr[3] flags (docs/partitioning.md). */
#define LIN_TIED       1
#define LIN_VOCAB      2
#define LIN_COLUMN     4
#define LIN_ROW        8
#define LIN_BIAS_RANK0 16

static void op_embedding(pctx *p, const mgc_ir_op *o) {
    mgc_cb *b = p->b;
    const lsz *z = &p->z;
    /* in: tokens, word (, positions (, doc_start: data.reset_position_ids, MGC_POF_DOCS)) */
    int32_t in[4] = {tin(p, o->in[0]), tin(p, o->in[1]), o->n_in > 2 ? tin(p, o->in[2]) : -1,
                     o->n_in > 3 ? tin(p, o->in[3]) : -1};
    mgc_plan_op op = mkop(p, MGC_POP_EMBEDDING, o->name, NULL);
    if (o->n_in > 3) op.flags |= MGC_POF_DOCS;
    int64_t dims[3] = {z->s_c, z->b, z->h};
    int32_t y;
    if (b->tp > 1) {
        y = tmp(p, o->name, ".partial", b->dt, 3, dims, NOS, NOG, 0);
        set_partial(p, y, MGC_GROUP_TP);
        set_split2(p, y, 0, p->ctx_group);
    } else {
        y = act(p, o->out[0], b->dt, 3, dims, p->ctx_group == NOG ? NOS : 0, p->ctx_group);
    }
    io(&op, o->n_in, in, 1, &y);
    op.iattr[0] = z->V_l;      /* vocabulary rows per tensor rank: start = group rank * V_l */
    op.iattr[1] = o->n_in > 2; /* adds learned positions ... */
    op.iattr[2] = b->tp > 1;   /* ... on tensor rank 0 only (the partial sums add them once) */
    op.iattr[3] = b->cp;       /* position ids follow the load-balanced context layout */
    fwd(p, &op, -1);
    if (b->tp > 1) reduce_tp(p, y, o->out[0], o->name);
}

static void op_dropout(pctx *p, const mgc_ir_op *o) {
    mgc_cb *b = p->b;
    int32_t x = tin(p, o->in[0]);
    if (x < 0) return;
    if (!(o->attr.dropout.p > 0)) { /* identity: no op, no mask */
        p->ir2t[o->out[0]] = x;
        return;
    }
    mgc_plan_tensor xt = b->t[x];
    int32_t y =
        act(p, o->out[0], (mgc_dtype)xt.dtype, xt.rank, xt.dim, xt.split_axis, xt.split_group);
    int32_t m =
        tmp(p, o->name, ".mask", MGC_DT_U8, xt.rank, xt.dim, xt.split_axis, xt.split_group, 1);
    mgc_plan_op op = mkop(p, MGC_POP_DROPOUT, o->name, NULL);
    int32_t out[2] = {y, m};
    io(&op, 1, &x, 1, out);
    op.fattr[0] = o->attr.dropout.p;
    op.iattr[0] = (int64_t)mgc_cb_numel(b, x);
    fwd(p, &op, m);
}

static void op_norm(pctx *p, const mgc_ir_op *o) {
    mgc_cb *b = p->b;
    int32_t in[3];
    for (int i = 0; i < o->n_in && i < 3; i++)
        in[i] = tin(p, o->in[i]);
    if (in[0] < 0) return;
    mgc_plan_tensor xt = b->t[in[0]];
    int32_t y =
        act(p, o->out[0], (mgc_dtype)xt.dtype, xt.rank, xt.dim, xt.split_axis, xt.split_group);
    if (y >= 0) set_split2(p, y, b->ti[in[0]].split2_axis, b->ti[in[0]].split2_group);
    mgc_plan_op op = mkop(p, MGC_POP_NORM, o->name, NULL);
    io(&op, o->n_in, in, 1, &y);
    op.fattr[0] = o->attr.norm.eps;
    op.iattr[0] = o->attr.norm.kind;
    op.iattr[2] = xt.dim[xt.rank - 1];
    op.iattr[1] = (int64_t)(mgc_cb_numel(b, in[0]) / (uint64_t)op.iattr[2]);
    fwd(p, &op, -1);
}

static void op_linear(pctx *p, const mgc_ir_op *o) {
    mgc_cb *b = p->b;
    const lsz *z = &p->z;
    const mgc_ir_tensor *w_ir = &p->g->tensors[o->in[1]];
    mgc_ir_axis out_ax = w_ir->dim[0].axis, in_ax = w_ir->dim[1].axis;
    int col = b->tp > 1 && (out_ax == MGC_IR_AXIS_QKV || out_ax == MGC_IR_AXIS_FFN ||
                            out_ax == MGC_IR_AXIS_FFN_GLU || out_ax == MGC_IR_AXIS_VOCAB);
    int row = b->tp > 1 && (in_ax == MGC_IR_AXIS_QPROJ || in_ax == MGC_IR_AXIS_FFN);
    int logits = out_ax == MGC_IR_AXIS_VOCAB;
    /* moe.router_dtype fp32: the router's logits in fp32 from the 16-bit GEMM (no flag: its
     * gradient comes back in the compute dtype, and the weight is no vocabulary's) */
    int fp32_router = out_ax == MGC_IR_AXIS_EXPERTS && p->c->moe.router_dtype == MGC_ROUTER_DT_FP32;
    int32_t x = tin(p, o->in[0]), w = tin(p, o->in[1]), bias = o->n_in > 2 ? tin(p, o->in[2]) : -1;
    if (x < 0 || w < 0) return;
    int ar_input = 0;
    if (col && b->sp)
        x = gather_seq_tp(p, x, o->name);
    else if (col)
        ar_input = 1; /* replicated input: its gradient is partial over TP */
    if (x < 0) return;
    /* x [s, b, ...]: the dims after the first two contract with the weight */
    mgc_plan_tensor xt = b->t[x];
    int64_t N = b->t[w].dim[0], K = b->t[w].dim[1], xk = 1;
    for (int i = 2; i < xt.rank; i++)
        xk *= xt.dim[i];
    if (xt.rank < 3 || xk != K) {
        mgc_cb_fail(b, "'%s': input width %" PRId64 " != weight width %" PRId64, o->name, xk, K);
        return;
    }
    int64_t dims[3] = {xt.dim[0], xt.dim[1], N};
    /* training.logits_dtype fp32: the logits in fp32 from the 16-bit GEMM, as the router's */
    int fp32_logits = logits && p->c->training.logits_dtype == MGC_LOGITS_DT_FP32;
    mgc_dtype ydt = fp32_logits || fp32_router ? MGC_DT_F32 : b->dt;
    int32_t y;
    if (row) {
        y = tmp(p, o->name, ".partial", ydt, 3, dims, NOS, NOG, 0);
        set_partial(p, y, MGC_GROUP_TP);
        set_split2(p, y, 0, p->ctx_group);
    } else if (col) {
        y = act(p, o->out[0], ydt, 3, dims, 2, MGC_GROUP_TP);
        set_split2(p, y, 0, p->ctx_group);
    } else {
        uint16_t sax = xt.split_axis == 0 ? 0 : NOS; /* only a sequence split carries over */
        y = act(p, o->out[0], ydt, 3, dims, sax, sax == 0 ? xt.split_group : NOG);
        if (sax != 0 && b->ti[x].split2_axis == 0) set_split2(p, y, 0, b->ti[x].split2_group);
    }
    if (y < 0) return;
    mgc_plan_op op = mkop(p, MGC_POP_LINEAR, o->name, NULL);
    int32_t in[3] = {x, w, bias};
    io(&op, bias >= 0 ? 3 : 2, in, 1, &y);
    uint64_t M = mgc_cb_numel(b, x) / (uint64_t)K;
    op.iattr[0] = (int64_t)M;
    op.iattr[1] = N;
    op.iattr[2] = K;
    op.iattr[3] = (o->attr.linear.tied ? LIN_TIED : 0) | (logits ? LIN_VOCAB : 0) |
                  (col ? LIN_COLUMN : 0) | (row ? LIN_ROW : 0) |
                  (row && bias >= 0 ? LIN_BIAS_RANK0 : 0);
    op.flops = 2 * M * (uint64_t)N * (uint64_t)K;
    int32_t id = fwd(p, &op, -1);
    if (id >= 0) b->fx[id].in_ar[0] = (uint8_t)ar_input;
    if (row) reduce_tp(p, y, o->out[0], o->name);
    (void)z;
}

static void op_qkv_split(pctx *p, const mgc_ir_op *o) {
    mgc_cb *b = p->b;
    const lsz *z = &p->z;
    int32_t x = tin(p, o->in[0]);
    if (x < 0) return;
    int64_t rows = b->t[x].dim[0];
    int64_t dq[4] = {rows, z->b, z->a_l, z->d}, dkv[4] = {rows, z->b, z->g_l, z->d};
    uint16_t ax = b->tp > 1 ? 2 : NOS, grp = b->tp > 1 ? MGC_GROUP_TP : NOG;
    int32_t out[3];
    out[0] = act(p, o->out[0], b->dt, 4, dq, ax, grp);
    out[1] = act(p, o->out[1], b->dt, 4, dkv, ax, grp);
    out[2] = act(p, o->out[2], b->dt, 4, dkv, ax, grp);
    for (int i = 0; i < 3; i++) {
        if (b->tp > 1)
            set_split2(p, out[i], 0, p->ctx_group);
        else if (out[i] >= 0 && p->ctx_group != NOG)
            b->t[out[i]].split_axis = 0, b->t[out[i]].split_group = p->ctx_group;
    }
    mgc_plan_op op = mkop(p, MGC_POP_QKV_SPLIT, o->name, NULL);
    io(&op, 1, &x, 3, out);
    op.iattr[0] = z->g_l;
    op.iattr[1] = z->a_l / z->g_l;
    op.iattr[2] = z->d;
    fwd(p, &op, -1);
}

/* An op whose output has its input's shape and split (rope, add). */
static void op_same(pctx *p, const mgc_ir_op *o, mgc_plan_op_kind kind) {
    mgc_cb *b = p->b;
    int32_t in[2] = {tin(p, o->in[0]), o->n_in > 1 ? tin(p, o->in[1]) : -1};
    if (in[0] < 0) return;
    mgc_plan_tensor xt = b->t[in[0]];
    int32_t y =
        act(p, o->out[0], (mgc_dtype)xt.dtype, xt.rank, xt.dim, xt.split_axis, xt.split_group);
    if (y >= 0) {
        b->ti[y].split2_axis = b->ti[in[0]].split2_axis;
        b->ti[y].split2_group = b->ti[in[0]].split2_group;
    }
    if (o->n_in > 1 && in[1] < 0) return;
    mgc_plan_op op = mkop(p, kind, o->name, NULL);
    io(&op, o->n_in, in, 1, &y);
    if (kind == MGC_POP_ROPE && o->n_in > 1) op.flags |= MGC_POF_DOCS; /* reset_position_ids */
    if (kind == MGC_POP_ROPE) {
        op.fattr[0] = o->attr.rope.base;
        op.iattr[0] = o->attr.rope.rotary_dim;
        op.iattr[1] = b->cp; /* positions of the load-balanced context layout */
        op.iattr[2] = xt.dim[0];
    }
    fwd(p, &op, -1);
}

static void op_attention(pctx *p, const mgc_ir_op *o) {
    mgc_cb *b = p->b;
    const lsz *z = &p->z;
    int32_t q = tin(p, o->in[0]), k = tin(p, o->in[1]), v = tin(p, o->in[2]);
    if (q < 0 || k < 0 || v < 0) return;
    if (b->cp > 1) {
        /* every context rank needs the keys and values of the whole
         * sequence: all-gather them (in gather order: rank r's two chunks
         * r and 2cp-1-r, for r = 0..cp-1); the backward re-gathers them and
         * reduce-scatters their gradients */
        int32_t kv[2] = {k, v};
        for (int i = 0; i < 2; i++) {
            mgc_plan_tensor t = b->t[kv[i]];
            t.dim[0] *= b->cp;
            /* the whole sequence: only the head split (TP) remains */
            int32_t y =
                tmp(p, mgc_plan_strat(b->plan, b->t[kv[i]].name), ".gathered", (mgc_dtype)t.dtype,
                    t.rank, t.dim, b->tp > 1 ? 2 : NOS, b->tp > 1 ? MGC_GROUP_TP : NOG, 0);
            coll(p, MGC_POP_ALL_GATHER, MGC_GROUP_CP, o->name,
                 i ? ".all_gather_v" : ".all_gather_k", kv[i], y, -1, -1, 0, 1);
            kv[i] = y;
        }
        k = kv[0];
        v = kv[1];
    }
    mgc_plan_tensor qt = b->t[q];
    int32_t ctx = act(p, o->out[0], b->dt, 4, qt.dim, qt.split_axis, qt.split_group);
    if (ctx >= 0) {
        b->ti[ctx].split2_axis = b->ti[q].split2_axis;
        b->ti[ctx].split2_group = b->ti[q].split2_group;
    }
    int64_t ld[3] = {qt.dim[0], z->b, z->a_l};
    int32_t lse =
        tmp(p, o->name, ".lse", MGC_DT_F32, 3, ld, b->tp > 1 ? 2 : (p->ctx_group == NOG ? NOS : 0),
            b->tp > 1 ? MGC_GROUP_TP : p->ctx_group, 1);
    if (b->tp > 1) set_split2(p, lse, 0, p->ctx_group);
    /* data.reset_attention_mask: the queries' document starts, the last input (MGC_POF_DOCS) */
    int32_t doc = o->n_in > 3 ? tin(p, o->in[3]) : -1;
    if (o->n_in > 3 && doc < 0) return;
    mgc_plan_op op = mkop(p, MGC_POP_ATTENTION, o->name, NULL);
    int32_t in[4] = {q, k, v, doc}, out[2] = {ctx, lse};
    io(&op, doc >= 0 ? 4 : 3, in, 1, out);
    if (doc >= 0) op.flags |= MGC_POF_DOCS;
    op.fattr[0] = o->attr.attention.scale;
    op.fattr[1] = o->attr.attention.dropout;
    op.fattr[2] = (double)o->attr.attention.window; /* sliding window in keys, 0 none */
    op.iattr[0] = o->attr.attention.causal;
    op.iattr[1] = z->a_l;
    op.iattr[2] = z->g_l;
    op.iattr[3] = b->cp;
    /* q k^T and p v over the local heads against the whole sequence; the
     * causal mask halves it (the load-balanced layout keeps it half on every
     * context rank) */
    uint64_t sk = (uint64_t)b->t[k].dim[0], W = (uint64_t)o->attr.attention.window;
    if (o->attr.attention.causal && W > 0 && W < sk) /* a window: s W - W^2/2 pairs of s^2/2 */
        op.flops = (uint64_t)((double)mgc_cb_numel(b, q) * 2.0 * (double)W * (double)(2 * sk - W) /
                              (double)sk);
    else
        op.flops = mgc_cb_numel(b, q) * sk * (o->attr.attention.causal ? 2u : 4u);
    fwd(p, &op, lse);
}

static void op_dropout_add(pctx *p, const mgc_ir_op *o) {
    mgc_cb *b = p->b;
    int32_t in[2] = {tin(p, o->in[0]), tin(p, o->in[1])};
    if (in[0] < 0 || in[1] < 0) return;
    mgc_plan_tensor rt = b->t[in[1]];
    if (b->t[in[0]].dim[0] != rt.dim[0]) {
        mgc_cb_fail(b, "'%s': branch and residual are split differently", o->name);
        return;
    }
    int32_t y =
        act(p, o->out[0], (mgc_dtype)rt.dtype, rt.rank, rt.dim, rt.split_axis, rt.split_group);
    int32_t m = -1;
    if (o->attr.dropout.p > 0)
        m = tmp(p, o->name, ".mask", MGC_DT_U8, rt.rank, rt.dim, rt.split_axis, rt.split_group, 1);
    mgc_plan_op op = mkop(p, MGC_POP_DROPOUT_ADD, o->name, NULL);
    io(&op, 2, in, 1, &y);
    op.fattr[0] = o->attr.dropout.p;
    op.iattr[0] = (int64_t)mgc_cb_numel(b, y);
    fwd(p, &op, m);
}

static void op_activation(pctx *p, const mgc_ir_op *o, mgc_plan_op_kind kind) {
    mgc_cb *b = p->b;
    int32_t x = tin(p, o->in[0]);
    if (x < 0) return;
    mgc_plan_tensor xt = b->t[x];
    int64_t dims[MGC_PLAN_MAX_RANK];
    for (int i = 0; i < xt.rank; i++)
        dims[i] = xt.dim[i];
    if (kind == MGC_POP_SWIGLU) dims[xt.rank - 1] /= 2; /* each half split the same way */
    int32_t y =
        act(p, o->out[0], (mgc_dtype)xt.dtype, xt.rank, dims, xt.split_axis, xt.split_group);
    if (y >= 0) {
        b->ti[y].split2_axis = b->ti[x].split2_axis;
        b->ti[y].split2_group = b->ti[x].split2_group;
        b->ti[y].routed = b->ti[x].routed; /* an expert's activation */
    }
    mgc_plan_op op = mkop(p, kind, o->name, NULL);
    /* an expert's activation on rows received over EP: only the routed ones (plan.h
     * MGC_POF_ROWS), counted by the tokens per local expert */
    int32_t in[2] = {x, p->m_tpe};
    int rows = b->ti[x].routed && p->m_tpe >= 0;
    io(&op, rows ? 2 : 1, in, 1, &y);
    if (rows) op.flags |= MGC_POF_ROWS;
    op.iattr[0] = (int64_t)mgc_cb_numel(b, y);
    fwd(p, &op, -1);
}

/* ---- mixture of experts ------------------------------------------------------------- */

static void op_moe_route(pctx *p, const mgc_ir_op *o) {
    mgc_cb *b = p->b;
    const lsz *z = &p->z;
    int32_t in[2] = {tin(p, o->in[0]), o->n_in > 1 ? tin(p, o->in[1]) : -1}, logits = in[0];
    if (logits < 0 || (o->n_in > 1 && in[1] < 0)) return;
    int64_t tk[2] = {z->T_l, z->k};
    uint16_t ax = p->res_group == NOG ? NOS : 0;
    p->m_probs = act(p, o->out[0], MGC_DT_F32, 2, tk, ax, p->res_group);
    p->m_ids = act(p, o->out[1], MGC_DT_I32, 2, tk, ax, p->res_group);
    int32_t out[4] = {p->m_probs, p->m_ids, -1, -1}, aux_ir = -1;
    int n_out = 2;
    for (int i = 2; i < o->n_out; i++) {
        const mgc_ir_tensor *t = &p->g->tensors[o->out[i]];
        if (strstr(t->name, "aux_loss"))
            aux_ir = o->out[i];
        else
            out[n_out++] = act(p, o->out[i], MGC_DT_F32, 0, NULL, NOS, NOG); /* z-loss */
    }
    /* the aux loss's counts: per expert, or per (sequence, expert) when it balances each
     * sequence (moe.aux_loss_scope) */
    int32_t counts = -1;
    int seq = o->attr.moe.aux_scope == MGC_AUX_SEQUENCE;
    int64_t e1[2] = {seq ? z->b : z->E, z->E};
    if (aux_ir >= 0)
        out[n_out++] = counts =
            tmp(p, o->name, ".tokens_per_expert", MGC_DT_I64, seq ? 2 : 1, e1, NOS, NOG, 1);
    mgc_plan_op op = mkop(p, MGC_POP_MOE_ROUTE, o->name, NULL);
    io(&op, o->n_in > 1 ? 2 : 1, in, n_out, out); /* logits (, the expert bias) */
    op.fattr[0] = o->attr.moe.aux_coeff;
    op.fattr[1] = o->attr.moe.z_coeff;
    /* the routed weights' factor; 0 (a plan of an older mgc) reads as 1 */
    op.fattr[2] = o->attr.moe.topk_scale != 1.0 ? o->attr.moe.topk_scale : 0.0;
    op.iattr[0] = 0; /* phase 0: scores, top-k, z-loss, local counts */
    op.iattr[1] = z->E;
    op.iattr[2] = z->k;
    op.iattr[3] = MGC_ROUTE_PACK(o->attr.moe.score, o->attr.moe.groups, o->attr.moe.group_topk);
    int32_t r0 = fwd(p, &op, -1);
    if (aux_ir < 0 || r0 < 0) return;
    /* The load-balancing loss needs the token counts of the whole sequence:
     * sum them over tensor x context ranks (Megatron's tp_cp group). */
    int32_t cg = counts;
    if (b->tp * b->cp > 1) {
        cg = tmp(p, o->name, ".tokens_per_expert.global", MGC_DT_I64, seq ? 2 : 1, e1, NOS, NOG, 1);
        coll(p, MGC_POP_ALL_REDUCE, MGC_GROUP_TPCP, o->name, ".all_reduce", counts, cg, -1, -1, 0,
             0);
    }
    b->fx[r0].ref[0] = cg;
    int32_t aux = act(p, aux_ir, MGC_DT_F32, 0, NULL, NOS, NOG);
    mgc_plan_op a = mkop(p, MGC_POP_MOE_ROUTE, o->name, ".aux_loss");
    int32_t ain[2] = {logits, cg};
    io(&a, 2, ain, 1, &aux);
    a.fattr[0] = o->attr.moe.aux_coeff;
    a.iattr[0] = 1; /* phase 1: the aux loss from the global counts */
    a.iattr[1] = z->E;
    a.iattr[2] = z->k;
    a.iattr[3] = z->T_l * b->tp * b->cp; /* tokens the global counts cover */
    fwd(p, &a, -1);
}

static void op_moe_dispatch(pctx *p, const mgc_ir_op *o) {
    mgc_cb *b = p->b;
    const lsz *z = &p->z;
    int32_t x = tin(p, o->in[0]), ids = tin(p, o->in[1]);
    if (x < 0 || ids < 0 || p->m_probs < 0) {
        mgc_cb_fail(b, "'%s' without its router", o->name);
        return;
    }
    int dropless = z->C_l == 0;
    uint32_t vflag = dropless ? MGC_PCOLL_VARIABLE : 0;
    int64_t e1[1] = {z->E}, rl[2] = {z->R_l, z->h};
    int32_t rows = tmp(p, o->name, ".rows", b->dt, 2, rl, NOS, NOG, 0);
    int32_t cnt = tmp(p, o->name, ".counts", MGC_DT_I64, 1, e1, NOS, NOG, 1);
    mgc_plan_op op = mkop(p, MGC_POP_MOE_DISPATCH, o->name, NULL);
    int32_t in[3] = {x, ids, p->m_probs}, out[2] = {rows, cnt};
    io(&op, 3, in, 2, out);
    op.iattr[0] = 0; /* phase 0: permute the local tokens' rows by expert */
    op.iattr[1] = z->E;
    op.iattr[2] = z->C_l;
    op.iattr[3] = o->attr.moe.drop_policy;
    fwd(p, &op, -1);
    p->m_counts_l = p->m_counts_r = p->m_counts_x = cnt;
    p->m_tpe = -1;
    if (b->ep > 1) {
        int32_t cr = tmp(p, o->name, ".counts.ep", MGC_DT_I64, 1, e1, NOS, NOG, 1);
        coll(p, MGC_POP_ALL_TO_ALL, MGC_GROUP_EP, o->name, ".all_to_all_counts", cnt, cr, -1, -1, 0,
             0);
        int64_t re[2] = {z->R_ep, z->h};
        int32_t rr = tmp(p, o->name, ".rows.ep", b->dt, 2, re, NOS, NOG, 0);
        set_routed(p, rr);
        coll(p, MGC_POP_ALL_TO_ALL, MGC_GROUP_EP, o->name, ".all_to_all", rows, rr, cnt, cr, vflag,
             0);
        rows = rr;
        p->m_counts_r = p->m_counts_x = cnt = cr;
    }
    if (b->etp > 1) {
        int64_t ex[1] = {z->E * b->etp}, rx[2] = {z->R_x, z->h};
        int32_t cx = tmp(p, o->name, ".counts.etp", MGC_DT_I64, 1, ex, NOS, NOG, 1);
        coll(p, MGC_POP_ALL_GATHER, MGC_GROUP_ETP, o->name, ".all_gather_counts", cnt, cx, -1, -1,
             0, 0);
        int32_t rg = tmp(p, o->name, ".rows.etp", b->dt, 2, rx, NOS, NOG, 0);
        set_routed(p, rg);
        coll(p, MGC_POP_ALL_GATHER, MGC_GROUP_ETP, o->name, ".all_gather", rows, rg, cx, -1, vflag,
             0);
        rows = rg;
        p->m_counts_x = cnt = cx;
    }
    if (b->ep > 1 || b->etp > 1) {
        int64_t rx[2] = {z->R_x, z->h}, el[1] = {z->E_l};
        int32_t rs = act(p, o->out[0], b->dt, 2, rx, NOS, NOG);
        set_routed(p, rs);
        int32_t tpe = act(p, o->out[1], MGC_DT_I64, 1, el, NOS, NOG);
        p->m_tpe = tpe;
        mgc_plan_op s = mkop(p, MGC_POP_MOE_DISPATCH, o->name, ".sort");
        int32_t sin[2] = {rows, cnt}, sout[2] = {rs, tpe};
        io(&s, 2, sin, 2, sout);
        s.iattr[0] = 1; /* phase 1: sort the received chunks by local expert */
        s.iattr[1] = z->E_l;
        s.iattr[2] = b->ep * b->etp; /* source chunks */
        fwd(p, &s, -1);
    } else {
        p->ir2t[o->out[0]] = rows;
        p->ir2t[o->out[1]] = cnt;
        b->ti[rows].ir = o->out[0];
        b->ti[cnt].ir = o->out[1];
    }
}

static void op_grouped_linear(pctx *p, const mgc_ir_op *o) {
    mgc_cb *b = p->b;
    const lsz *z = &p->z;
    const mgc_ir_tensor *w_ir = &p->g->tensors[o->in[1]];
    int row = b->etp > 1 && w_ir->dim[2].axis == MGC_IR_AXIS_FFN;
    int col = b->etp > 1 && !row;
    int32_t x = tin(p, o->in[0]), w = tin(p, o->in[1]), tpe = tin(p, o->in[2]);
    int32_t bias = o->n_in > 3 ? tin(p, o->in[3]) : -1;
    if (x < 0 || w < 0 || tpe < 0) return;
    int64_t N = b->t[w].dim[1], K = b->t[w].dim[2];
    int64_t dims[2] = {b->t[x].dim[0], N};
    int32_t y = act(p, o->out[0], b->dt, 2, dims, col ? 1 : NOS, col ? MGC_GROUP_ETP : NOG);
    if (row) set_partial(p, y, MGC_GROUP_ETP);
    if (y >= 0) b->ti[y].routed = b->ti[x].routed;
    mgc_plan_op op = mkop(p, MGC_POP_GROUPED_LINEAR, o->name, NULL);
    int32_t in[4] = {x, w, tpe, bias};
    io(&op, bias >= 0 ? 4 : 3, in, 1, &y);
    op.iattr[0] = b->t[x].dim[0];
    op.iattr[1] = N;
    op.iattr[2] = K;
    op.iattr[3] =
        (col ? LIN_COLUMN : 0) | (row ? LIN_ROW : 0) | (row && bias >= 0 ? LIN_BIAS_RANK0 : 0);
    /* dropless: the rows of balanced routing (the buffers hold the bound) */
    op.flops = 2 * (uint64_t)z->R_exp * (uint64_t)N * (uint64_t)K;
    fwd(p, &op, -1);
}

static void op_moe_combine(pctx *p, const mgc_ir_op *o) {
    mgc_cb *b = p->b;
    const lsz *z = &p->z;
    int32_t y = tin(p, o->in[0]), probs = tin(p, o->in[1]), ids = tin(p, o->in[2]);
    if (y < 0 || probs < 0 || ids < 0 || p->m_counts_l < 0) {
        mgc_cb_fail(b, "'%s' without its dispatch", o->name);
        return;
    }
    uint32_t vflag = z->C_l == 0 ? MGC_PCOLL_VARIABLE : 0;
    int32_t rows = y;
    if (b->ep > 1 || b->etp > 1) {
        int64_t rx[2] = {z->R_x, z->h};
        int32_t u = tmp(p, o->name, ".unsorted", b->dt, 2, rx, NOS, NOG, 0);
        if (b->etp > 1) set_partial(p, u, MGC_GROUP_ETP);
        set_routed(p, u);
        mgc_plan_op op = mkop(p, MGC_POP_MOE_COMBINE, o->name, ".unsort");
        int32_t in[2] = {y, p->m_counts_x};
        io(&op, 2, in, 1, &u);
        op.iattr[0] = 0; /* phase 0: back to the order of the source chunks */
        op.iattr[1] = z->E_l;
        op.iattr[2] = b->ep * b->etp;
        fwd(p, &op, -1);
        rows = u;
    }
    if (b->etp > 1) {
        int64_t re[2] = {z->R_ep, z->h};
        int32_t r = tmp(p, o->name, ".rows.etp", b->dt, 2, re, NOS, NOG, 0);
        set_routed(p, r);
        coll(p, MGC_POP_REDUCE_SCATTER, MGC_GROUP_ETP, o->name, ".reduce_scatter", rows, r,
             p->m_counts_x, -1, vflag, 0);
        rows = r;
    }
    if (b->ep > 1) {
        int64_t rl[2] = {z->R_l, z->h};
        int32_t r = tmp(p, o->name, ".rows.ep", b->dt, 2, rl, NOS, NOG, 0);
        coll(p, MGC_POP_ALL_TO_ALL, MGC_GROUP_EP, o->name, ".all_to_all", rows, r, p->m_counts_r,
             p->m_counts_l, vflag, 0);
        rows = r;
    }
    int64_t dims[3] = {z->s_t, z->b, z->h};
    int32_t out = act(p, o->out[0], b->dt, 3, dims, p->res_group == NOG ? NOS : 0, p->res_group);
    mgc_plan_op op = mkop(p, MGC_POP_MOE_COMBINE, o->name, NULL);
    int32_t in[3] = {rows, probs, ids};
    io(&op, 3, in, 1, &out);
    op.iattr[0] = 1; /* phase 1: weighted sum of each token's k rows */
    op.iattr[1] = z->E;
    op.iattr[2] = z->k;
    op.iattr[3] = z->C_l;
    fwd(p, &op, -1);
}

/* ---- the head --------------------------------------------------------------------- */

static void op_cross_entropy(pctx *p, const mgc_ir_op *o) {
    mgc_cb *b = p->b;
    const lsz *z = &p->z;
    int32_t logits = tin(p, o->in[0]), labels = tin(p, o->in[1]), mask = tin(p, o->in[2]);
    if (logits < 0 || labels < 0 || mask < 0) return;
    int64_t sb[2] = {z->s_c, z->b}, sb2[3] = {z->s_c, z->b, 2}, two[1] = {2};
    uint16_t ax = p->ctx_group == NOG ? NOS : 0;
    int32_t lse = tmp(p, o->name, ".lse", MGC_DT_F32, 2, sb, ax, p->ctx_group, 1);
    int32_t loss_l = b->cp > 1 ? tmp(p, o->name, ".loss_partial", MGC_DT_F32, 1, two, NOS, NOG, 1)
                               : act(p, o->out[0], MGC_DT_F32, 1, two, NOS, NOG);
    if (b->cp > 1) set_partial(p, loss_l, MGC_GROUP_CP);
    int32_t root;
    if (b->tp > 1) {
        /* vocabulary-parallel cross-entropy: three reductions over TP as
         * two collectives -- the max, then (sum of exp, target logit) */
        int32_t mx_l = tmp(p, o->name, ".max_partial", MGC_DT_F32, 2, sb, ax, p->ctx_group, 1);
        int32_t mx = tmp(p, o->name, ".max", MGC_DT_F32, 2, sb, ax, p->ctx_group, 1);
        int32_t sm_l = tmp(p, o->name, ".sums_partial", MGC_DT_F32, 3, sb2, ax, p->ctx_group, 1);
        int32_t sm = tmp(p, o->name, ".sums", MGC_DT_F32, 3, sb2, ax, p->ctx_group, 1);
        set_partial(p, sm_l, MGC_GROUP_TP);
        mgc_plan_op a = mkop(p, MGC_POP_CROSS_ENTROPY, o->name, ".max");
        io(&a, 1, &logits, 1, &mx_l);
        a.iattr[0] = 0;
        a.iattr[1] = z->V_l;
        fwd(p, &a, -1);
        coll(p, MGC_POP_ALL_REDUCE, MGC_GROUP_TP, o->name, ".all_reduce_max", mx_l, mx, -1, -1,
             MGC_PCOLL_MAX, 0);
        mgc_plan_op s = mkop(p, MGC_POP_CROSS_ENTROPY, o->name, ".sums");
        int32_t sin[3] = {logits, mx, labels};
        io(&s, 3, sin, 1, &sm_l);
        s.iattr[0] = 1;
        s.iattr[1] = z->V_l;
        fwd(p, &s, -1);
        coll(p, MGC_POP_ALL_REDUCE, MGC_GROUP_TP, o->name, ".all_reduce_sums", sm_l, sm, -1, -1, 0,
             0);
        mgc_plan_op f = mkop(p, MGC_POP_CROSS_ENTROPY, o->name, NULL);
        int32_t fin[3] = {mx, sm, mask}, fout[2] = {lse, loss_l};
        io(&f, 3, fin, 2, fout);
        f.iattr[0] = 2;
        f.iattr[1] = z->V_l;
        root = fwd(p, &f, -1);
    } else {
        mgc_plan_op f = mkop(p, MGC_POP_CROSS_ENTROPY, o->name, NULL);
        int32_t fin[3] = {logits, labels, mask}, fout[2] = {lse, loss_l};
        io(&f, 3, fin, 2, fout);
        f.iattr[0] = 3; /* fused: max, sums and loss in one kernel */
        f.iattr[1] = z->V_l;
        root = fwd(p, &f, -1);
    }
    if (root >= 0) {
        b->fx[root].root = 1;
        b->fx[root].ref[0] = logits;
        b->fx[root].ref[1] = labels;
        b->fx[root].ref[2] = mask;
    }
    int32_t loss = loss_l;
    if (b->cp > 1) {
        loss = act(p, o->out[0], MGC_DT_F32, 1, two, NOS, NOG);
        coll(p, MGC_POP_ALL_REDUCE, MGC_GROUP_CP, o->name, ".all_reduce_loss", loss_l, loss, -1, -1,
             0, 0);
    }
    b->loss = loss;
}

static void partition_op(pctx *p, const mgc_ir_op *o) {
    p->layer = o->layer;
    p->b->part = (int)o->part;
    switch (o->kind) {
    case MGC_IR_OP_EMBEDDING:
        op_embedding(p, o);
        break;
    case MGC_IR_OP_DROPOUT:
        op_dropout(p, o);
        break;
    case MGC_IR_OP_NORM:
        op_norm(p, o);
        break;
    case MGC_IR_OP_LINEAR:
        op_linear(p, o);
        break;
    case MGC_IR_OP_QKV_SPLIT:
        op_qkv_split(p, o);
        break;
    case MGC_IR_OP_ROPE:
        op_same(p, o, MGC_POP_ROPE);
        break;
    case MGC_IR_OP_ATTENTION:
        op_attention(p, o);
        break;
    case MGC_IR_OP_DROPOUT_ADD:
        op_dropout_add(p, o);
        break;
    case MGC_IR_OP_GELU:
        op_activation(p, o, MGC_POP_GELU);
        break;
    case MGC_IR_OP_SWIGLU:
        op_activation(p, o, MGC_POP_SWIGLU);
        break;
    case MGC_IR_OP_ADD:
        op_same(p, o, MGC_POP_ADD);
        break;
    case MGC_IR_OP_MOE_ROUTE:
        op_moe_route(p, o);
        break;
    case MGC_IR_OP_MOE_DISPATCH:
        op_moe_dispatch(p, o);
        break;
    case MGC_IR_OP_GROUPED_LINEAR:
        op_grouped_linear(p, o);
        break;
    case MGC_IR_OP_MOE_COMBINE:
        op_moe_combine(p, o);
        break;
    case MGC_IR_OP_CROSS_ENTROPY:
        op_cross_entropy(p, o);
        break;
    default:
        mgc_cb_fail(p->b, "op '%s': unknown kind %d", o->name, (int)o->kind);
        break;
    }
}

/* ---- chunks -------------------------------------------------------------------------- */

static int included(const mgc_ir_op *o, const mgc_stage *st) {
    if (o->layer >= 0)
        return o->layer >= st->first_layer && o->layer < st->first_layer + st->num_layers;
    if (o->part == MGC_IR_PART_EMBEDDING) return st->embedding != 0;
    return o->part == MGC_IR_PART_HEAD && st->loss;
}

/* One chunk: partition the included IR ops, derive the backward, export. */
static int build_chunk(const mgc_config *c, const mgc_graph *g, const mgc_grid *grid,
                       const mgc_stage *st, mgc_plan *plan, mgc_plan_chunk *out,
                       mgc_partition_info *info, char *why, size_t whysz) {
    mgc_cb b;
    memset(&b, 0, sizeof b);
    b.c = c;
    b.g = g;
    b.plan = plan;
    b.recompute = c->training.recompute;
    b.recompute_modules = mgc_config_recompute_modules(c);
    b.dt = plan_dtype(g->dtype);
    b.tp = grid->tp;
    b.cp = grid->cp;
    b.ep = grid->ep;
    b.etp = grid->etp;
    b.sp = c->derived.sequence_parallel && grid->tp > 1;
    b.in_act = b.in_grad = b.out_act = b.out_grad = b.loss = -1;
    pctx p;
    memset(&p, 0, sizeof p);
    p.b = &b;
    p.c = c;
    p.g = g;
    p.layer = -1;
    p.m_probs = p.m_ids = p.m_counts_l = p.m_counts_r = p.m_counts_x = p.m_tpe = -1;
    p.ctx_group = b.cp > 1 ? MGC_GROUP_CP : NOG;
    p.res_group = b.sp ? (b.cp > 1 ? MGC_GROUP_TPCP : MGC_GROUP_TP) : p.ctx_group;
    p.ir2t = malloc((size_t)(g->n_tensors ? g->n_tensors : 1) * sizeof *p.ir2t);
    if (!p.ir2t) {
        snprintf(why, whysz, "out of memory");
        return -1;
    }
    for (int32_t i = 0; i < g->n_tensors; i++)
        p.ir2t[i] = -1;
    local_sizes(&p);
    const lsz *z = &p.z;
    int64_t res[3] = {z->s_t, z->b, z->h};
    uint16_t rax = p.res_group == NOG ? NOS : 0;
    if (!st->embedding) {
        b.in_act =
            mgc_cb_tensor(&b, "chunk.input", MGC_TR_ACTIVATION, b.dt, 3, res, rax, p.res_group);
        b.in_grad =
            mgc_cb_tensor(&b, "chunk.input.grad", MGC_TR_ACT_GRAD, b.dt, 3, res, rax, p.res_group);
        if (b.in_grad >= 0) b.ti[b.in_grad].grad_of = b.in_act;
    }
    if (!st->loss) {
        b.out_act =
            mgc_cb_tensor(&b, "chunk.output", MGC_TR_ACTIVATION, b.dt, 3, res, rax, p.res_group);
        b.out_grad =
            mgc_cb_tensor(&b, "chunk.output.grad", MGC_TR_ACT_GRAD, b.dt, 3, res, rax, p.res_group);
    }
    int32_t last = -1;
    for (int32_t i = 0; i < g->n_ops && !b.failed; i++) {
        if (!included(&g->ops[i], st)) continue;
        partition_op(&p, &g->ops[i]);
        last = i;
    }
    if (!st->loss && !b.failed) {
        int32_t y = last >= 0 ? p.ir2t[g->ops[last].out[0]] : b.in_act;
        if (b.nf == 0 && y == b.in_act) {
            /* an empty virtual stage forwards its input unchanged */
            b.out_act = b.in_act;
            b.out_grad = b.in_grad;
        } else if (y < 0 || y == b.in_act) {
            mgc_cb_fail(&b, "the chunk's output is not produced in it");
        } else {
            uint32_t slot_name = b.t[b.out_grad].name;
            mgc_cb_rename(&b, y, b.out_act, 0);
            b.ti[b.out_act].layer = -1;
            b.t[b.out_grad] = b.t[b.out_act];
            b.t[b.out_grad].role = MGC_TR_ACT_GRAD;
            b.t[b.out_grad].name = slot_name;
            b.ti[b.out_grad] = b.ti[b.out_act];
            b.ti[b.out_grad].ir = -1;
            b.ti[b.out_grad].grad_of = b.out_act;
        }
    }
    if (st->loss && b.loss < 0 && !b.failed) mgc_cb_fail(&b, "the loss chunk computes no loss");
    if (!b.failed) mgc_autodiff(&b);
    if (!b.failed) {
        mgc_cb_number(b.f, b.nf);
        mgc_cb_number(b.b, b.nb);
        if (mgc_cb_export(&b, st, out, info)) mgc_cb_fail(&b, "out of memory exporting the chunk");
    }
    int rc = b.failed ? -1 : 0;
    if (rc) snprintf(why, whysz, "%s", b.why);
    mgc_cb_free(&b);
    free(p.ir2t);
    return rc;
}

/* ---- public API ------------------------------------------------------------------------- */

void mgc_partition_grid(const mgc_config *c, mgc_grid *grid) {
    memset(grid, 0, sizeof *grid);
    grid->world = c->parallel.world_size;
    grid->tp = c->parallel.tensor;
    grid->cp = c->parallel.context;
    grid->dp = c->parallel.data;
    grid->pp = c->parallel.pipeline;
    grid->vp = c->parallel.virtual_stages;
    grid->etp = c->parallel.expert_tensor;
    grid->ep = c->parallel.expert;
    grid->edp = c->derived.expert_data;
}

int mgc_partition_build_ex(const mgc_config *c, const mgc_graph *g, const mgc_grid *grid,
                           int64_t pp_rank, mgc_plan *plan, mgc_plan_chunk *chunks,
                           mgc_partition_info *info, mgc_diags *d) {
    if (!c || !g || !grid || !plan || !chunks || !d) return -1;
    const mgc_loc loc = c->file_loc;
    int before = d->errors;
    if (mgc_grid_check(grid) || grid->tp != c->parallel.tensor || grid->cp != c->parallel.context ||
        grid->pp != c->parallel.pipeline || grid->ep != c->parallel.expert ||
        grid->etp != c->parallel.expert_tensor || grid->pp * grid->vp != c->derived.num_stages ||
        !c->derived.stages) {
        mgc_diag(d, MGC_SEV_ERROR, loc, "pass the grid of this configuration (mgc_partition_grid)",
                 "internal: the rank grid does not match the configuration's parallel degrees");
        return -1;
    }
    if (pp_rank < 0 || pp_rank >= grid->pp) {
        mgc_diag(d, MGC_SEV_ERROR, loc, NULL,
                 "internal: pipeline rank %" PRId64 " outside 0..%" PRId64, pp_rank, grid->pp - 1);
        return -1;
    }
    if (g->dims.E > 0 && grid->tp > 1 && !c->derived.sequence_parallel) {
        mgc_diag(d, MGC_SEV_ERROR, mgc_config_loc(c, MGC_KEY_PAR_SP),
                 "set parallel.sequence_parallel: true (Megatron refuses this combination in "
                 "training too)",
                 "experts with parallel.tensor = %" PRId64
                 " need sequence parallelism: tokens are dispatched to experts from the sequence "
                 "shards of the "
                 "tensor ranks",
                 grid->tp);
        return -1;
    }
    for (int64_t v = 0; v < grid->vp; v++)
        memset(&chunks[v], 0, sizeof chunks[v]);
    if (info)
        for (int64_t v = 0; v < grid->vp; v++)
            memset(&info[v], 0, sizeof info[v]);
    for (int64_t v = 0; v < grid->vp; v++) {
        const mgc_stage *st = &c->derived.stages[v * grid->pp + pp_rank];
        char why[256];
        if (build_chunk(c, g, grid, st, plan, &chunks[v], info ? &info[v] : NULL, why,
                        sizeof why)) {
            mgc_diag(d, MGC_SEV_ERROR, loc, NULL,
                     "cannot partition chunk %" PRId64 " of pipeline rank %" PRId64
                     " (layers %d..%d): %s",
                     v, pp_rank, (int)st->first_layer, (int)(st->first_layer + st->num_layers - 1),
                     why);
            break;
        }
    }
    if (d->errors > before) {
        mgc_partition_chunks_free(chunks, grid->vp);
        mgc_partition_info_free(info, grid->vp);
        return -1;
    }
    return 0;
}

int mgc_partition_build(const mgc_config *c, const mgc_graph *g, const mgc_grid *grid,
                        int64_t pp_rank, mgc_plan *plan, mgc_plan_chunk *chunks, mgc_diags *d) {
    return mgc_partition_build_ex(c, g, grid, pp_rank, plan, chunks, NULL, d);
}
