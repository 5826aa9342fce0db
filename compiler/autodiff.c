/* autodiff.c - the backward program of a chunk, its saved set and stash.
 *
 * Reverse-mode differentiation of the partitioned forward program (see
 * autodiff.h and docs/partitioning.md): forward ops are visited in reverse;
 * each emits its backward ops (kernels, GEMMs, transposed collectives) and
 * accumulates gradients of its inputs.  A forward tensor the backward reads
 * is fetched under the recompute policy:
 *
 *   saved      kept in the chunk's stash from forward to backward;
 *   re-done    recomputed in the backward by a copy of its producing op
 *              flagged MGC_POF_RECOMPUTE: sequence all-gathers (SP, CP)
 *              always; the attention core's logsumexp with selective
 *              recompute; every tensor made and read inside a recompute unit:
 *              full recompute's layers or groups of layers (its method), the
 *              layer halves of the modules mlp and moe; the norm and activation
 *              outputs of those modules.
 *
 * Sections: the builder shared with partition.c (storage, renaming), helpers,
 * the fetch policy, rules per op kind, the pass, pruning and the stash,
 * export (collective numbering, compaction), the structural check. */
#include "autodiff.h"

#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define NOG MGC_PARTITION_NO_GROUP
#define NOS MGC_PLAN_NO_SPLIT

/* ---- the builder (autodiff.h) --------------------------------------------------------- */

void mgc_cb_fail(mgc_cb *b, const char *fmt, ...) {
    if (!b->failed) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(b->why, sizeof b->why, fmt, ap);
        va_end(ap);
    }
    b->failed = 1;
}

/* Grow `*p` (elements of `elem` bytes, capacity *cap) to hold `need`. */
static int grow(void **p, int64_t cap, int64_t need, size_t elem) {
    if (need <= cap) return 0;
    void *q = realloc(*p, (size_t)need * elem);
    if (!q) return -1;
    *p = q;
    return 0;
}

static int reserve_tensors(mgc_cb *b, int64_t need) {
    if (need <= b->cap_t) return 0;
    int64_t nc = b->cap_t ? b->cap_t * 2 : 256;
    while (nc < need)
        nc *= 2;
    if (nc > INT32_MAX || grow((void **)&b->t, b->cap_t, nc, sizeof *b->t) ||
        grow((void **)&b->ti, b->cap_t, nc, sizeof *b->ti) ||
        grow((void **)&b->tx, b->cap_t, nc, sizeof *b->tx))
        return -1;
    b->cap_t = nc;
    return 0;
}

uint32_t mgc_cb_name(mgc_cb *b, const char *base, const char *suffix) {
    char buf[256];
    /* base + suffix without snprintf: this runs for every tensor of every chunk */
    if (!base) base = "";
    if (!suffix) suffix = "";
    size_t nb = strlen(base), ns = strlen(suffix), n = nb + ns;
    if (n < sizeof buf) {
        memcpy(buf, base, nb);
        memcpy(buf + nb, suffix, ns);
        buf[n] = 0;
    } else {
        snprintf(buf, sizeof buf, "%s%s", base, suffix);
    }
    if (n >= sizeof buf) {
        mgc_cb_fail(b, "name too long: %.60s...", buf);
        return 0;
    }
    uint32_t off = mgc_plan_str(b->plan, buf);
    if (off == UINT32_MAX) {
        mgc_cb_fail(b, "out of memory interning '%s'", buf);
        return 0;
    }
    return off;
}

int32_t mgc_cb_tensor(mgc_cb *b, const char *name, mgc_plan_tensor_role role, mgc_dtype dt,
                      int rank, const int64_t *dims, uint16_t split_axis, uint16_t split_group) {
    if (b->failed) return -1;
    if (rank < 0 || rank > MGC_PLAN_MAX_RANK || (split_axis != NOS && split_axis >= rank)) {
        mgc_cb_fail(b, "tensor '%s': rank %d, split axis %u", name, rank, split_axis);
        return -1;
    }
    uint64_t n = 1;
    for (int i = 0; i < rank; i++) {
        if (dims[i] < 1 || mgc_ir_mul_u64(n, (uint64_t)dims[i], &n)) {
            mgc_cb_fail(b, "tensor '%s': dim %d is %" PRId64 " or the size overflows", name, i,
                        dims[i]);
            return -1;
        }
    }
    uint64_t bytes;
    if (mgc_ir_mul_u64(n, mgc_dtype_size(dt), &bytes)) {
        mgc_cb_fail(b, "tensor '%s' has more than 2^64 bytes", name);
        return -1;
    }
    if (reserve_tensors(b, b->nt + 1)) {
        mgc_cb_fail(b, "out of memory adding tensor '%s'", name);
        return -1;
    }
    int32_t id = (int32_t)b->nt;
    mgc_plan_tensor *t = &b->t[id];
    memset(t, 0, sizeof *t);
    t->name = mgc_cb_name(b, name, NULL);
    t->dtype = (uint16_t)dt;
    t->rank = (uint16_t)rank;
    for (int i = 0; i < rank; i++)
        t->dim[i] = dims[i];
    t->role = (uint16_t)role;
    t->split_axis = split_axis;
    t->split_group = split_group;
    t->split2_axis = MGC_PLAN_NO_SPLIT;
    t->split2_group = MGC_GROUP__COUNT;
    t->buffer = -1;
    t->bytes = bytes;
    mgc_partition_tensor_info *ti = &b->ti[id];
    memset(ti, 0, sizeof *ti);
    ti->ir = ti->layer = ti->grad_of = ti->recompute_of = -1;
    ti->split2_axis = NOS;
    ti->split2_group = NOG;
    mgc_cb_tx *tx = &b->tx[id];
    memset(tx, 0, sizeof *tx);
    tx->fprod = tx->grad = tx->re = -1;
    b->nt++;
    return b->failed ? -1 : id;
}

int32_t mgc_cb_tensor_like(mgc_cb *b, int32_t like, const char *suffix, mgc_plan_tensor_role role,
                           mgc_dtype dt) {
    if (b->failed || like < 0) return -1;
    char name[256];
    const char *base = mgc_plan_strat(b->plan, b->t[like].name);
    if (!base) base = "?";
    if (!suffix) suffix = "";
    size_t nb = strlen(base), ns = strlen(suffix);
    if (nb + ns < sizeof name) {
        memcpy(name, base, nb);
        memcpy(name + nb, suffix, ns);
        name[nb + ns] = 0;
    } else {
        snprintf(name, sizeof name, "%s%s", base, suffix);
    }
    mgc_plan_tensor src = b->t[like];
    mgc_partition_tensor_info si = b->ti[like];
    int32_t id =
        mgc_cb_tensor(b, name, role, dt, src.rank, src.dim, src.split_axis, src.split_group);
    if (id < 0) return -1;
    b->ti[id].layer = si.layer;
    b->ti[id].split2_axis = si.split2_axis;
    b->ti[id].split2_group = si.split2_group;
    b->ti[id].partial = si.partial;
    b->ti[id].routed = si.routed;
    return id;
}

uint64_t mgc_cb_numel(const mgc_cb *b, int32_t t) {
    size_t es = mgc_dtype_size((mgc_dtype)b->t[t].dtype);
    return es ? b->t[t].bytes / es : 0;
}

int32_t mgc_cb_op(mgc_cb *b, int pass, const mgc_plan_op *op) {
    if (b->failed) return -1;
    for (int i = 0; i < op->n_in; i++)
        if (op->in[i] < 0 || op->in[i] >= b->nt) {
            mgc_cb_fail(b, "op '%s': input %d is tensor %d", mgc_plan_strat(b->plan, op->name), i,
                        (int)op->in[i]);
            return -1;
        }
    for (int i = 0; i < op->n_out; i++)
        if (op->out[i] < 0 || op->out[i] >= b->nt) {
            mgc_cb_fail(b, "op '%s': output %d is tensor %d", mgc_plan_strat(b->plan, op->name), i,
                        (int)op->out[i]);
            return -1;
        }
    mgc_plan_op **arr = pass ? &b->b : &b->f;
    int64_t *n = pass ? &b->nb : &b->nf, *cap = pass ? &b->cap_b : &b->cap_f;
    if (*n + 1 > *cap) {
        int64_t nc = *cap ? *cap * 2 : 256;
        if (nc > INT32_MAX || grow((void **)arr, *cap, nc, sizeof **arr) ||
            (!pass && grow((void **)&b->fx, *cap, nc, sizeof *b->fx))) {
            mgc_cb_fail(b, "out of memory adding an op");
            return -1;
        }
        *cap = nc;
    }
    int32_t id = (int32_t)(*n)++;
    (*arr)[id] = *op;
    if (!pass) {
        mgc_cb_fop *fx = &b->fx[id];
        memset(fx, 0, sizeof *fx);
        fx->ref[0] = fx->ref[1] = fx->ref[2] = -1;
        fx->n_all_out = op->n_out;
        fx->part = (uint8_t)b->part;
        for (int i = 0; i < op->n_out; i++) {
            fx->all_out[i] = op->out[i];
            b->tx[op->out[i]].fprod = id;
        }
    }
    return id;
}

void mgc_cb_coll_attrs(const mgc_cb *b, mgc_plan_op *op, uint32_t flags) {
    op->iattr[0] = (int64_t)mgc_cb_numel(b, op->in[0]);
    op->iattr[1] = (int64_t)mgc_cb_numel(b, op->out[0]);
    op->iattr[2] = b->t[op->in[0]].dtype;
    op->iattr[3] = flags;
}

void mgc_cb_rename(mgc_cb *b, int32_t from, int32_t to, int keep_role) {
    if (from < 0 || to < 0 || from == to) return;
    for (int pass = 0; pass < 2; pass++) {
        mgc_plan_op *ops = pass ? b->b : b->f;
        int64_t n = pass ? b->nb : b->nf;
        for (int64_t i = 0; i < n; i++) {
            for (int k = 0; k < ops[i].n_in; k++)
                if (ops[i].in[k] == from) ops[i].in[k] = to;
            for (int k = 0; k < ops[i].n_out; k++)
                if (ops[i].out[k] == from) ops[i].out[k] = to;
        }
    }
    for (int64_t i = 0; i < b->nf; i++)
        for (int k = 0; k < b->fx[i].n_all_out; k++)
            if (b->fx[i].all_out[k] == from) b->fx[i].all_out[k] = to;
    for (int64_t i = 0; i < b->nt; i++) {
        if (b->tx[i].grad == from) b->tx[i].grad = to;
        if (b->ti[i].grad_of == from) b->ti[i].grad_of = to;
    }
    uint16_t role = b->t[to].role;
    b->t[to] = b->t[from];
    if (keep_role) b->t[to].role = role;
    b->ti[to] = b->ti[from];
    b->tx[to] = b->tx[from];
}

/* ---- helpers ---------------------------------------------------------------------- */

static int is_coll(uint16_t kind) {
    return kind >= MGC_POP_ALL_REDUCE && kind < MGC_POP__END;
}

/* Append a backward op named and layered like forward op `like`. */
static int32_t bop(mgc_cb *b, mgc_plan_op_kind kind, const mgc_plan_op *like, int n_in,
                   const int32_t *in, int n_out, const int32_t *out, uint16_t flags) {
    mgc_plan_op op;
    memset(&op, 0, sizeof op);
    op.kind = (uint16_t)kind;
    op.flags = flags;
    op.layer = like->layer;
    op.name = like->name;
    op.group = NOG;
    op.n_in = (uint16_t)n_in;
    op.n_out = (uint16_t)n_out;
    for (int i = 0; i < n_in; i++) {
        if (in[i] < 0) {
            mgc_cb_fail(b, "backward of '%s': input %d missing",
                        mgc_plan_strat(b->plan, like->name), i);
            return -1;
        }
        op.in[i] = in[i];
    }
    for (int i = 0; i < n_out; i++)
        op.out[i] = out[i];
    memcpy(op.fattr, like->fattr, sizeof op.fattr);
    memcpy(op.iattr, like->iattr, sizeof op.iattr);
    return mgc_cb_op(b, 1, &op);
}

/* A new gradient contribution for activation t: "<t>.grad", then
 * "<t>.grad.1", ... (partial contributions are summed by acc()). */
static int32_t new_grad(mgc_cb *b, int32_t t, mgc_dtype dt) {
    if (t < 0) return -1;
    char suffix[24];
    uint8_t k = b->tx[t].ngrad;
    if (k == 0)
        snprintf(suffix, sizeof suffix, ".grad");
    else
        snprintf(suffix, sizeof suffix, ".grad.%u", (unsigned)k);
    b->tx[t].ngrad = (uint8_t)(k < 255 ? k + 1 : k);
    int32_t g = mgc_cb_tensor_like(b, t, suffix, MGC_TR_ACT_GRAD, dt);
    if (g >= 0) {
        b->ti[g].grad_of = t;
        if (b->ti[g].partial) { /* the gradient of a partial sum is the whole gradient */
            b->ti[g].partial = 0;
            b->t[g].split_group = NOG;
        }
    }
    return g;
}

static int32_t grad_like(mgc_cb *b, int32_t t) {
    return t >= 0 ? new_grad(b, t, (mgc_dtype)b->t[t].dtype) : -1;
}

/* Add contribution g to the gradient of activation t. */
static void acc(mgc_cb *b, int32_t t, int32_t g, const mgc_plan_op *like) {
    if (t < 0 || g < 0 || b->ti[t].nodiff) return;
    if (b->tx[t].grad < 0) {
        b->tx[t].grad = g;
        return;
    }
    int32_t s = new_grad(b, t, (mgc_dtype)b->t[t].dtype);
    int32_t in[2] = {b->tx[t].grad, g};
    /* add_bwd sums two gradient contributions: the transpose of a tensor
     * read by several ops */
    bop(b, MGC_POP_ADD_BWD, like, 2, in, 1, &s, 0);
    b->ti[s].layer = like->layer;
    b->tx[t].grad = s;
}

/* ---- the fetch policy --------------------------------------------------------------- */

enum { P_DIRECT, P_SAVE, P_REDO };

static int is_lse(const mgc_cb *b, int32_t t, int32_t f) {
    return b->f[f].kind == MGC_POP_ATTENTION && b->fx[f].n_all_out > 1 && b->fx[f].all_out[1] == t;
}

/* Full recompute's group of decoder layer L (training.recompute_method): its first layer, or
 * -1 when full recompute leaves L alone. */
static int32_t full_group(const mgc_cb *b, int32_t L) {
    if (L < 0 || b->recompute != MGC_RECOMPUTE_FULL) return -1;
    return b->c ? mgc_config_recompute_group(b->c, L) : L;
}

/* Forward op f is in a layer half that training.recompute_modules mlp / moe re-runs. */
static int half_redone(const mgc_cb *b, int32_t f) {
    uint8_t part = b->fx[f].part;
    return b->f[f].layer >= 0 &&
           (((b->recompute_modules & MGC_RECOMPUTE_MOD_MLP) && part == MGC_IR_PART_MLP) ||
            ((b->recompute_modules & MGC_RECOMPUTE_MOD_MOE) && part == MGC_IR_PART_MOE));
}

/* The recompute unit of forward op f: a unit re-runs from the tensors that enter it, which are
 * stashed (b->tx.crosses); everything made and read inside it is re-done.  Full recompute's
 * group of layers, else the layer half the modules mlp / moe re-run, else the layer itself
 * (a unit only for the other modules' purposes); -1 outside the layers. */
static int64_t unit_of(const mgc_cb *b, int32_t f) {
    int32_t L = b->f[f].layer, g = full_group(b, L);
    if (L < 0) return -1;
    if (g >= 0) return (int64_t)g * 4;
    return (int64_t)L * 4 + (half_redone(b, f) ? 2 : 1);
}

/* Forward op f's outputs are re-done in the backward unless they leave its unit. */
static int redone_op(const mgc_cb *b, int32_t f) {
    return full_group(b, b->f[f].layer) >= 0 || half_redone(b, f);
}

static int policy(const mgc_cb *b, int32_t t) {
    uint16_t role = b->t[t].role;
    if (role == MGC_TR_PARAM || role == MGC_TR_GRAD || role == MGC_TR_INPUT ||
        role == MGC_TR_ACT_GRAD)
        return P_DIRECT;
    if (t == b->in_act) return P_SAVE;
    int32_t f = b->tx[t].fprod;
    if (f < 0) return P_DIRECT;
    if (b->fx[f].regather) return P_REDO;
    if (b->recompute == MGC_RECOMPUTE_SELECTIVE && is_lse(b, t, f)) return P_REDO;
    if (redone_op(b, f) && !b->tx[t].crosses) return P_REDO;
    /* training.recompute_modules: a layer's norm output, from the norm's stashed input; its
     * GELU / SwiGLU output, from the stashed GEMM output the activation's backward reads */
    uint16_t k = b->f[f].kind;
    if (b->f[f].layer >= 0 && b->f[f].out[0] == t && !b->tx[t].crosses &&
        (((b->recompute_modules & MGC_RECOMPUTE_MOD_NORM) && k == MGC_POP_NORM) ||
         ((b->recompute_modules & MGC_RECOMPUTE_MOD_ACTIVATION) &&
          (k == MGC_POP_GELU || k == MGC_POP_SWIGLU))))
        return P_REDO;
    return P_SAVE;
}

static int32_t fetch(mgc_cb *b, int32_t t);

/* Re-run forward op f in the backward (flagged recompute), with every
 * output, optional ones included, as a fresh tensor. */
static void redo_op(mgc_cb *b, int32_t f) {
    mgc_plan_op op = b->f[f];
    mgc_cb_fop fx = b->fx[f];
    for (int k = 0; k < op.n_in; k++)
        op.in[k] = fetch(b, op.in[k]);
    op.flags = MGC_POF_RECOMPUTE | (op.flags & (MGC_POF_DOCS | MGC_POF_ROWS)); /* what its inputs mean stays */
    op.n_out = (uint16_t)fx.n_all_out;
    for (int k = 0; k < fx.n_all_out; k++) {
        int32_t o = fx.all_out[k];
        if (b->tx[o].re >= 0) {
            op.out[k] = b->tx[o].re; /* cannot happen: an op is re-run once */
            mgc_cb_fail(b, "'%s' recomputed twice", mgc_plan_strat(b->plan, op.name));
            continue;
        }
        int32_t r = mgc_cb_tensor_like(b, o, ".recompute", (mgc_plan_tensor_role)b->t[o].role,
                                       (mgc_dtype)b->t[o].dtype);
        if (r < 0) return;
        b->ti[r].ir = b->ti[o].ir;
        b->ti[r].nodiff = b->ti[o].nodiff;
        b->ti[r].recompute_of = o;
        b->tx[o].re = r;
        op.out[k] = r;
    }
    if (!b->failed) mgc_cb_op(b, 1, &op);
}

/* The tensor the backward reads for forward tensor t. */
static int32_t fetch(mgc_cb *b, int32_t t) {
    if (t < 0 || b->failed) return -1;
    switch (policy(b, t)) {
    case P_DIRECT:
        return t;
    case P_SAVE:
        b->tx[t].saved = 1;
        return t;
    default:
        if (b->tx[t].re < 0) redo_op(b, b->tx[t].fprod);
        if (b->tx[t].re < 0 && !b->failed)
            mgc_cb_fail(b, "cannot recompute '%s'", mgc_plan_strat(b->plan, b->t[t].name));
        return b->tx[t].re;
    }
}

/* Full recompute: re-run layer L's forward (the ops with an output the
 * policy re-does) in forward order, before the layer's backward. */
static void redo_layer(mgc_cb *b, int32_t L) {
    for (int64_t i = 0; i < b->nf && !b->failed; i++) {
        if (b->f[i].layer != L || b->fx[i].regather) continue;
        int any = 0;
        for (int k = 0; k < b->fx[i].n_all_out; k++) {
            int32_t o = b->fx[i].all_out[k];
            any |= policy(b, o) == P_REDO && b->tx[o].re < 0;
        }
        if (any) redo_op(b, (int32_t)i);
    }
}

/* ---- rules per op kind ------------------------------------------------------------------- */

static int32_t pgrad(mgc_cb *b, int32_t param) {
    int32_t g = param >= 0 ? b->tx[param].grad : -1;
    if (g < 0)
        mgc_cb_fail(b, "parameter '%s' has no gradient accumulator",
                    param >= 0 ? mgc_plan_strat(b->plan, b->t[param].name) : "?");
    return g;
}

static void bwd_linear(mgc_cb *b, const mgc_plan_op *op, const mgc_cb_fop *fx, int32_t gy) {
    int32_t x = op->in[0], w = op->in[1], bias = op->n_in > 2 ? op->in[2] : -1;
    if (!b->ti[x].nodiff) {
        /* dgrad: dx = dy w, in the compute dtype even for fp32 logits */
        int32_t gx = new_grad(b, x, b->dt);
        int32_t in[2] = {gy, w};
        int32_t id = bop(b, MGC_POP_LINEAR_DGRAD, op, 2, in, 1, &gx, 0);
        if (id >= 0) b->b[id].flops = op->flops;
        if (op->iattr[3] & 4) { /* column-parallel: dx is partial over TP */
            b->t[gx].split_axis = NOS;
            b->t[gx].split_group = MGC_GROUP_TP;
            b->ti[gx].partial = 1;
        }
        if (fx->in_ar[0] && gx >= 0) {
            /* Megatron's f: identity forward, all-reduce backward */
            int32_t r = new_grad(b, x, b->dt);
            mgc_plan_op ar;
            memset(&ar, 0, sizeof ar);
            ar.name = mgc_cb_name(b, mgc_plan_strat(b->plan, op->name), ".all_reduce.bwd");
            ar.layer = op->layer;
            int32_t rid = bop(b, MGC_POP_ALL_REDUCE, &ar, 1, &gx, 1, &r, 0);
            if (rid >= 0) {
                b->b[rid].group = MGC_GROUP_TP;
                mgc_cb_coll_attrs(b, &b->b[rid], 0);
            }
            gx = r;
        }
        acc(b, x, gx, op);
    }
    /* wgrad: dW += dy^T x into the fp32 main grad (and db += sum dy) */
    int32_t in[2] = {gy, fetch(b, x)}, out[2] = {pgrad(b, w), bias >= 0 ? pgrad(b, bias) : -1};
    int32_t id = bop(b, MGC_POP_LINEAR_WGRAD, op, 2, in, bias >= 0 ? 2 : 1, out, 0);
    if (id >= 0) b->b[id].flops = op->flops;
}

static void bwd_grouped(mgc_cb *b, const mgc_plan_op *op, int32_t gy) {
    int32_t x = op->in[0], w = op->in[1], tpe = op->in[2], bias = op->n_in > 3 ? op->in[3] : -1;
    int32_t gx = new_grad(b, x, b->dt);
    int32_t din[3] = {gy, w, fetch(b, tpe)};
    int32_t id = bop(b, MGC_POP_GROUPED_LINEAR_DGRAD, op, 3, din, 1, &gx, 0);
    if (id >= 0) b->b[id].flops = op->flops;
    if ((op->iattr[3] & 4) && gx >= 0) {
        b->t[gx].split_axis = NOS;
        b->t[gx].split_group = MGC_GROUP_ETP;
        b->ti[gx].partial = 1;
    }
    acc(b, x, gx, op);
    int32_t win[3] = {gy, fetch(b, x), fetch(b, tpe)},
            out[2] = {pgrad(b, w), bias >= 0 ? pgrad(b, bias) : -1};
    id = bop(b, MGC_POP_GROUPED_LINEAR_WGRAD, op, 3, win, bias >= 0 ? 2 : 1, out, 0);
    if (id >= 0) b->b[id].flops = op->flops;
}

/* Collectives transpose: all-reduce -> identity (the gradient of a reduced
 * output is the gradient of every partial), all-gather <-> reduce-scatter,
 * all-to-all -> all-to-all with the row counts swapped. */
static void bwd_collective(mgc_cb *b, const mgc_plan_op *op, int32_t gy) {
    int32_t x = op->in[0];
    if (op->kind == MGC_POP_ALL_REDUCE) {
        acc(b, x, gy, op);
        return;
    }
    mgc_plan_op_kind kind = op->kind == MGC_POP_ALL_GATHER       ? MGC_POP_REDUCE_SCATTER
                            : op->kind == MGC_POP_REDUCE_SCATTER ? MGC_POP_ALL_GATHER
                                                                 : MGC_POP_ALL_TO_ALL;
    if (op->kind == MGC_POP_ALL_GATHER && gy >= 0) { /* what the reduce-scatter sums */
        b->t[gy].split_axis = NOS;
        b->t[gy].split_group = op->group;
        b->ti[gy].partial = 1;
    }
    int32_t gx = grad_like(b, x);
    int32_t in[3] = {gy, -1, -1};
    int n_in = 1;
    if (op->kind == MGC_POP_ALL_TO_ALL && op->n_in > 2) {
        in[1] = fetch(b, op->in[2]);
        in[2] = fetch(b, op->in[1]);
        n_in = 3;
    } else if (op->n_in > 1) {
        in[1] = fetch(b, op->in[1]);
        n_in = 2;
    }
    int32_t id = bop(b, kind, op, n_in, in, 1, &gx, 0);
    if (id >= 0) {
        b->b[id].name = mgc_cb_name(b, mgc_plan_strat(b->plan, op->name), ".bwd");
        b->b[id].group = op->group;
        mgc_cb_coll_attrs(b, &b->b[id], (uint32_t)op->iattr[3]);
    }
    acc(b, x, gx, op);
}

static void backward_op(mgc_cb *b, int32_t f) {
    const mgc_plan_op op = b->f[f];
    const mgc_cb_fop fx = b->fx[f];
    int32_t gy[MGC_PLAN_MAX_IO];
    int any = 0;
    for (int k = 0; k < op.n_out; k++) {
        gy[k] = b->tx[op.out[k]].grad;
        any |= gy[k] >= 0;
    }
    if (!any && !fx.root) return; /* nothing downstream needs a gradient */
    if (is_coll(op.kind)) {
        bwd_collective(b, &op, gy[0]);
        return;
    }
    int32_t x = op.in[0];
    switch (op.kind) {
    case MGC_POP_EMBEDDING: {
        int docs = (op.flags & MGC_POF_DOCS) != 0; /* the positions' document starts, last */
        int32_t in[3] = {op.in[0], gy[0], docs ? op.in[3] : -1};
        int32_t out[2] = {pgrad(b, op.in[1]), op.n_in > 2 ? pgrad(b, op.in[2]) : -1};
        bop(b, MGC_POP_EMBEDDING_BWD, &op, docs ? 3 : 2, in, op.n_in > 2 ? 2 : 1, out,
            docs ? MGC_POF_DOCS : 0);
        break;
    }
    case MGC_POP_DROPOUT: {
        /* the mask, or (recompute module dropout) none: the backward draws it again */
        int32_t gx = grad_like(b, x);
        int regen = (b->recompute_modules & MGC_RECOMPUTE_MOD_DROPOUT) != 0;
        int32_t in[2] = {gy[0], regen ? -1 : fetch(b, fx.all_out[1])};
        bop(b, MGC_POP_DROPOUT_BWD, &op, regen ? 1 : 2, in, 1, &gx, 0);
        acc(b, x, gx, &op);
        break;
    }
    case MGC_POP_NORM: {
        int32_t in[3] = {fetch(b, x), op.in[1], gy[0]};
        int32_t out[3] = {grad_like(b, x), pgrad(b, op.in[1]),
                          op.n_in > 2 ? pgrad(b, op.in[2]) : -1};
        bop(b, MGC_POP_NORM_BWD, &op, 3, in, op.n_in > 2 ? 3 : 2, out, 0);
        acc(b, x, out[0], &op);
        break;
    }
    case MGC_POP_LINEAR:
        bwd_linear(b, &op, &fx, gy[0]);
        break;
    case MGC_POP_QKV_SPLIT: {
        int32_t gx = grad_like(b, x);
        bop(b, MGC_POP_QKV_SPLIT_BWD, &op, 3, gy, 1, &gx, 0);
        acc(b, x, gx, &op);
        break;
    }
    case MGC_POP_ROPE: {
        int32_t gx = grad_like(b, x);
        int docs = (op.flags & MGC_POF_DOCS) != 0; /* reset_position_ids: doc_start, last */
        int32_t in[2] = {gy[0], docs ? fetch(b, op.in[1]) : -1};
        bop(b, MGC_POP_ROPE_BWD, &op, docs ? 2 : 1, in, 1, &gx, docs ? MGC_POF_DOCS : 0);
        acc(b, x, gx, &op);
        break;
    }
    case MGC_POP_ATTENTION: {
        /* flash-attention backward: q, k, v, out and the logsumexp; the
         * scores are recomputed tile by tile, dropout from the RNG state */
        int32_t lse = fx.n_all_out > 1 ? fx.all_out[1] : -1;
        int docs = (op.flags & MGC_POF_DOCS) != 0; /* the document starts: the last input */
        int32_t in[7] = {fetch(b, op.in[0]),  fetch(b, op.in[1]), fetch(b, op.in[2]),
                         fetch(b, op.out[0]), fetch(b, lse),      gy[0],
                         docs ? fetch(b, op.in[3]) : -1};
        int32_t out[3] = {grad_like(b, op.in[0]), grad_like(b, op.in[1]), grad_like(b, op.in[2])};
        int32_t id = bop(b, MGC_POP_ATTENTION_BWD, &op, docs ? 7 : 6, in, 3, out,
                         docs ? MGC_POF_DOCS : 0);
        if (id >= 0) b->b[id].flops = op.flops / 2 * 5; /* 5 GEMMs per tile against 2 */
        for (int k = 0; k < 3; k++)
            acc(b, op.in[k], out[k], &op);
        break;
    }
    case MGC_POP_DROPOUT_ADD:
        if (fx.n_all_out > 1) {
            int32_t gx = grad_like(b, x);
            int regen = (b->recompute_modules & MGC_RECOMPUTE_MOD_DROPOUT) != 0;
            int32_t in[2] = {gy[0], regen ? -1 : fetch(b, fx.all_out[1])};
            bop(b, MGC_POP_DROPOUT_ADD_BWD, &op, regen ? 1 : 2, in, 1, &gx, 0);
            acc(b, x, gx, &op);
        } else {
            acc(b, x, gy[0], &op);
        }
        acc(b, op.in[1], gy[0], &op); /* the residual: identity */
        break;
    case MGC_POP_GELU:
    case MGC_POP_SWIGLU: {
        int32_t gx = grad_like(b, x);
        /* routed expert rows (MGC_POF_ROWS): the tokens per expert, last, as in the forward */
        int rows = (op.flags & MGC_POF_ROWS) != 0;
        int32_t in[3] = {fetch(b, x), gy[0], rows ? fetch(b, op.in[op.n_in - 1]) : -1};
        bop(b, op.kind == MGC_POP_GELU ? MGC_POP_GELU_BWD : MGC_POP_SWIGLU_BWD, &op, rows ? 3 : 2, in,
            1, &gx, rows ? MGC_POF_ROWS : 0);
        acc(b, x, gx, &op);
        break;
    }
    case MGC_POP_ADD:
        acc(b, op.in[0], gy[0], &op);
        acc(b, op.in[1], gy[0], &op);
        break;
    case MGC_POP_MOE_ROUTE: {
        if (op.iattr[0] != 0) break; /* the aux phase: folded into the route backward */
        /* d logits from d probs, plus the aux and z-loss terms (their
         * coefficients in fattr); scores are recomputed from the logits */
        int32_t gx = new_grad(b, x, b->dt); /* fp32 logits (moe.router_dtype): 16-bit gradient */
        int32_t in[4] = {fetch(b, x), fetch(b, op.out[1]), gy[0],
                         fx.ref[0] >= 0 ? fetch(b, fx.ref[0]) : -1};
        bop(b, MGC_POP_MOE_ROUTE_BWD, &op, fx.ref[0] >= 0 ? 4 : 3, in, 1, &gx, 0);
        acc(b, x, gx, &op);
        break;
    }
    case MGC_POP_MOE_DISPATCH: {
        int32_t gx = grad_like(b, x);
        if (op.iattr[0] == 0) {
            int32_t in[3] = {gy[0], fetch(b, op.in[1]), fetch(b, op.in[2])};
            bop(b, MGC_POP_MOE_DISPATCH_BWD, &op, 3, in, 1, &gx, 0);
        } else {
            int32_t in[2] = {gy[0], fetch(b, op.in[1])};
            bop(b, MGC_POP_MOE_DISPATCH_BWD, &op, 2, in, 1, &gx, 0);
        }
        acc(b, x, gx, &op);
        break;
    }
    case MGC_POP_GROUPED_LINEAR:
        bwd_grouped(b, &op, gy[0]);
        break;
    case MGC_POP_MOE_COMBINE:
        if (op.iattr[0] == 0) {
            int32_t gx = grad_like(b, x);
            int32_t in[2] = {gy[0], fetch(b, op.in[1])};
            bop(b, MGC_POP_MOE_COMBINE_BWD, &op, 2, in, 1, &gx, 0);
            acc(b, x, gx, &op);
        } else {
            int32_t in[4] = {gy[0], fetch(b, x), fetch(b, op.in[1]), fetch(b, op.in[2])};
            int32_t out[2] = {grad_like(b, x), grad_like(b, op.in[1])};
            bop(b, MGC_POP_MOE_COMBINE_BWD, &op, 4, in, 2, out, 0);
            acc(b, x, out[0], &op);
            acc(b, op.in[1], out[1], &op);
        }
        break;
    case MGC_POP_CROSS_ENTROPY: {
        if (!fx.root) break; /* max and sums: statistics */
        /* d logits = (softmax - onehot(label)) * mask / count, with the
         * softmax recomputed from the fp32 logits and the logsumexp */
        int32_t logits = fx.ref[0];
        int32_t in[5] = {fetch(b, logits), fetch(b, op.out[0]), fx.ref[1], fx.ref[2],
                         fetch(b, b->loss)};
        int32_t gx = new_grad(b, logits, b->dt);
        bop(b, MGC_POP_CROSS_ENTROPY_BWD, &op, 5, in, 1, &gx, 0);
        acc(b, logits, gx, &op);
        break;
    }
    default:
        mgc_cb_fail(b, "no backward rule for '%s' (%s)", mgc_plan_strat(b->plan, op.name),
                    mgc_plan_op_name((mgc_plan_op_kind)op.kind));
        break;
    }
}

/* ---- pruning and the stash ---------------------------------------------------------- */

/* Drop recompute ops whose outputs nothing reads (full recompute re-runs a
 * layer's ops eagerly; some outputs, like the layer's output, are saved). */
static int prune(mgc_cb *b) {
    uint8_t *read = calloc((size_t)(b->nt ? b->nt : 1), 1);
    uint8_t *keep = calloc((size_t)(b->nb ? b->nb : 1), 1);
    if (!read || !keep) {
        free(read), free(keep);
        return -1;
    }
    for (int64_t i = b->nb - 1; i >= 0; i--) {
        const mgc_plan_op *op = &b->b[i];
        int live = !(op->flags & MGC_POF_RECOMPUTE);
        for (int k = 0; !live && k < op->n_out; k++)
            live = read[op->out[k]];
        keep[i] = (uint8_t)live;
        if (live)
            for (int k = 0; k < op->n_in; k++)
                read[op->in[k]] = 1;
    }
    int64_t n = 0;
    for (int64_t i = 0; i < b->nb; i++)
        if (keep[i]) b->b[n++] = b->b[i];
    b->nb = n;
    free(read), free(keep);
    return 0;
}

/* Attach saved optional outputs, flag saving ops, pack the stash. */
static void pack_stash(mgc_cb *b) {
    for (int64_t f = 0; f < b->nf; f++) {
        mgc_plan_op *op = &b->f[f];
        const mgc_cb_fop *fx = &b->fx[f];
        for (int k = op->n_out; k < fx->n_all_out; k++)
            if (b->tx[fx->all_out[k]].saved && op->n_out < MGC_PLAN_MAX_IO)
                op->out[op->n_out++] = fx->all_out[k];
        for (int k = 0; k < op->n_out; k++)
            if (b->tx[op->out[k]].saved) op->flags |= MGC_POF_SAVED;
    }
    uint64_t off = 0;
    for (int64_t t = 0; t < b->nt; t++) {
        if (!b->tx[t].saved) continue;
        off = (off + MGC_PLAN_ALIGN - 1) / MGC_PLAN_ALIGN * MGC_PLAN_ALIGN;
        b->t[t].buffer = MGC_PLAN_BUF_STASH;
        b->t[t].offset = off;
        off += b->t[t].bytes;
    }
}

/* ---- the pass ---------------------------------------------------------------------- */

int mgc_autodiff(mgc_cb *b) {
    if (b->failed) return -1;
    /* tensors read across a boundary of full recompute's units (a layer, or a group of layers
     * re-run together): full recompute saves those */
    for (int64_t i = 0; i < b->nf; i++)
        for (int k = 0; k < b->f[i].n_in; k++) {
            int32_t t = b->f[i].in[k], p = b->tx[t].fprod;
            if (p >= 0 && unit_of(b, p) != unit_of(b, (int32_t)i)) b->tx[t].crosses = 1;
        }
    if (b->out_act >= 0 && b->out_act != b->in_act) {
        b->tx[b->out_act].crosses = 1;
        b->tx[b->out_act].grad = b->out_grad;
    }
    /* a recomputed unit's forward re-runs, in forward order, as its backward starts (at its
     * last layer's last op) */
    int64_t unit = -2;
    for (int64_t i = b->nf - 1; i >= 0 && !b->failed; i--) {
        int32_t L = b->f[i].layer, g = full_group(b, L);
        int64_t u = unit_of(b, (int32_t)i);
        if (u != unit) { /* a half the modules re-run is re-done lazily, as its backward reads it */
            unit = u;
            if (g >= 0)
                for (int32_t l = g; l <= L; l++)
                    redo_layer(b, l);
        }
        backward_op(b, (int32_t)i);
    }
    if (b->failed) return -1;
    if (b->in_act >= 0 && b->out_act != b->in_act) {
        int32_t g = b->tx[b->in_act].grad;
        if (g < 0 || g == b->out_grad || b->t[g].role != MGC_TR_ACT_GRAD) {
            mgc_cb_fail(b, "the chunk's input gets no gradient of its own");
            return -1;
        }
        uint32_t name = b->t[b->in_grad].name;
        mgc_cb_rename(b, g, b->in_grad, 1);
        b->t[b->in_grad].name = name;
        b->ti[b->in_grad].grad_of = b->in_act;
        b->tx[b->in_act].grad = b->in_grad;
    }
    if (prune(b)) {
        mgc_cb_fail(b, "out of memory pruning the backward");
        return -1;
    }
    pack_stash(b);
    return b->failed ? -1 : 0;
}

/* ---- export ---------------------------------------------------------------------------- */

/* Collective sequence numbers: the index among the pass's collectives of
 * the same group. */
void mgc_cb_number(mgc_plan_op *ops, int64_t n) {
    uint32_t next[MGC_GROUP__COUNT + 1];
    memset(next, 0, sizeof next);
    for (int64_t i = 0; i < n; i++)
        if (ops[i].kind >= MGC_POP_ALL_REDUCE && ops[i].kind < MGC_POP__END &&
            ops[i].group <= MGC_GROUP__COUNT)
            ops[i].seq = next[ops[i].group]++;
}

/* Copy the builder into `out`, dropping tensors no op references (the
 * boundary tensors stay), and fill `info` (may be NULL). */
int mgc_cb_export(mgc_cb *b, const mgc_stage *st, mgc_plan_chunk *out, mgc_partition_info *info) {
    int32_t *map = malloc((size_t)(b->nt ? b->nt : 1) * sizeof *map);
    if (!map) return -1;
    for (int64_t i = 0; i < b->nt; i++)
        map[i] = -1;
    for (int pass = 0; pass < 2; pass++) {
        const mgc_plan_op *ops = pass ? b->b : b->f;
        int64_t n = pass ? b->nb : b->nf;
        for (int64_t i = 0; i < n; i++) {
            for (int k = 0; k < ops[i].n_in; k++)
                map[ops[i].in[k]] = 0;
            for (int k = 0; k < ops[i].n_out; k++)
                map[ops[i].out[k]] = 0;
        }
    }
    int32_t keep[5] = {b->in_act, b->in_grad, b->out_act, b->out_grad, b->loss};
    for (int i = 0; i < 5; i++)
        if (keep[i] >= 0) map[keep[i]] = 0;
    int64_t n = 0;
    for (int64_t i = 0; i < b->nt; i++)
        if (map[i] == 0) map[i] = (int32_t)n++;
    memset(out, 0, sizeof *out);
    out->tensors = malloc((size_t)(n ? n : 1) * sizeof *out->tensors);
    out->fwd = malloc((size_t)(b->nf ? b->nf : 1) * sizeof *out->fwd);
    out->bwd = malloc((size_t)(b->nb ? b->nb : 1) * sizeof *out->bwd);
    mgc_partition_tensor_info *ti = info ? malloc((size_t)(n ? n : 1) * sizeof *ti) : NULL;
    if (!out->tensors || !out->fwd || !out->bwd || (info && !ti)) {
        free(out->tensors), free(out->fwd), free(out->bwd), free(ti), free(map);
        memset(out, 0, sizeof *out);
        return -1;
    }
    for (int64_t i = 0; i < b->nt; i++) {
        if (map[i] < 0) continue;
        out->tensors[map[i]] = b->t[i];
        out->tensors[map[i]].split2_axis = b->ti[i].split2_axis; /* plan.h: the second split */
        if (b->ti[i].routed) out->tensors[map[i]].flags |= MGC_PT_ROUTED;
        out->tensors[map[i]].split2_group = b->ti[i].split2_group;
        if (ti) {
            mgc_partition_tensor_info x = b->ti[i];
            x.grad_of = x.grad_of >= 0 ? map[x.grad_of] : -1;
            x.recompute_of = x.recompute_of >= 0 ? map[x.recompute_of] : -1;
            ti[map[i]] = x;
        }
    }
    for (int pass = 0; pass < 2; pass++) {
        const mgc_plan_op *src = pass ? b->b : b->f;
        mgc_plan_op *dst = pass ? out->bwd : out->fwd;
        int64_t cnt = pass ? b->nb : b->nf;
        for (int64_t i = 0; i < cnt; i++) {
            dst[i] = src[i];
            for (int k = 0; k < dst[i].n_in; k++)
                dst[i].in[k] = map[dst[i].in[k]];
            for (int k = 0; k < dst[i].n_out; k++)
                dst[i].out[k] = map[dst[i].out[k]];
        }
    }
    out->n_tensors = n;
    out->n_fwd = b->nf;
    out->n_bwd = b->nb;
    out->first_layer = st->first_layer;
    out->num_layers = st->num_layers;
    out->embedding = st->embedding;
    out->loss = st->loss;
    uint64_t stash = 0;
    for (int64_t i = 0; i < n; i++)
        if (out->tensors[i].buffer == MGC_PLAN_BUF_STASH) {
            uint64_t end = out->tensors[i].offset + out->tensors[i].bytes;
            if (end > stash) stash = end;
        }
    out->stash_bytes = (stash + MGC_PLAN_ALIGN - 1) / MGC_PLAN_ALIGN * MGC_PLAN_ALIGN;
    out->send_bytes = !st->loss && b->out_act >= 0 ? b->t[b->out_act].bytes : 0;
    if (info) {
        memset(info, 0, sizeof *info);
        info->n_tensors = n;
        info->tensors = ti;
        info->in_act = b->in_act >= 0 ? map[b->in_act] : -1;
        info->in_grad = b->in_grad >= 0 ? map[b->in_grad] : -1;
        info->out_act = b->out_act >= 0 ? map[b->out_act] : -1;
        info->out_grad = b->out_grad >= 0 ? map[b->out_grad] : -1;
        info->loss = b->loss >= 0 ? map[b->loss] : -1;
    }
    free(map);
    return 0;
}

void mgc_cb_free(mgc_cb *b) {
    free(b->t), free(b->ti), free(b->tx), free(b->f), free(b->fx), free(b->b);
}

void mgc_partition_chunks_free(mgc_plan_chunk *chunks, int64_t n) {
    if (!chunks) return;
    for (int64_t i = 0; i < n; i++) {
        free(chunks[i].tensors);
        free(chunks[i].fwd);
        free(chunks[i].bwd);
        memset(&chunks[i], 0, sizeof chunks[i]);
    }
}

void mgc_partition_info_free(mgc_partition_info *info, int64_t n) {
    if (!info) return;
    for (int64_t i = 0; i < n; i++) {
        free(info[i].tensors);
        memset(&info[i], 0, sizeof info[i]);
    }
}

int64_t mgc_partition_count_collectives(const mgc_plan_chunk *ch, int bwd, mgc_group_kind group) {
    if (!ch) return 0;
    const mgc_plan_op *ops = bwd ? ch->bwd : ch->fwd;
    int64_t n = bwd ? ch->n_bwd : ch->n_fwd, k = 0;
    for (int64_t i = 0; i < n; i++)
        k += ops[i].kind >= MGC_POP_ALL_REDUCE && ops[i].kind < MGC_POP__END &&
             ops[i].group == (uint16_t)group;
    return k;
}

/* ---- the structural check ------------------------------------------------------------ */

int mgc_partition_check(const mgc_plan_chunk *ch, mgc_diags *d) {
    const mgc_loc loc = {"<partition>", 0, 0};
    int before = d->errors;
    int64_t n = ch->n_tensors;
    int32_t in_act = -1, out_grad = -1;
    if (!ch->embedding) in_act = 0;
    if (!ch->loss) out_grad = ch->embedding ? 1 : 3;
    if (ch->n_fwd == 0 && !ch->embedding && !ch->loss) out_grad = 1; /* an empty chunk */
    uint8_t *state = calloc((size_t)(n ? n : 1), 1); /* 1 written in fwd, 2 in bwd */
    uint32_t seq[2][MGC_GROUP__COUNT + 1];
    memset(seq, 0, sizeof seq);
    if (!state) {
        mgc_diag(d, MGC_SEV_ERROR, loc, NULL, "out of memory");
        return -1;
    }
    for (int pass = 0; pass < 2; pass++) {
        const mgc_plan_op *ops = pass ? ch->bwd : ch->fwd;
        int64_t cnt = pass ? ch->n_bwd : ch->n_fwd;
        for (int64_t i = 0; i < cnt; i++) {
            const mgc_plan_op *o = &ops[i];
            const char *pn = pass ? "bwd" : "fwd";
            int bad = o->n_in > MGC_PLAN_MAX_IO || o->n_out > MGC_PLAN_MAX_IO || o->n_out < 1;
            for (int k = 0; !bad && k < o->n_in; k++)
                bad |= o->in[k] < 0 || o->in[k] >= n;
            for (int k = 0; !bad && k < o->n_out; k++)
                bad |= o->out[k] < 0 || o->out[k] >= n;
            if (bad) {
                mgc_diag(d, MGC_SEV_ERROR, loc, NULL,
                         "%s op %" PRId64 ": tensor index out of range", pn, i);
                continue;
            }
            for (int k = 0; k < o->n_in; k++) {
                int32_t t = o->in[k];
                const mgc_plan_tensor *x = &ch->tensors[t];
                int ok = x->role == MGC_TR_PARAM || x->role == MGC_TR_INPUT ||
                         state[t] == (pass ? 2 : 1);
                if (!pass) ok |= t == in_act;
                if (pass) ok |= x->buffer == MGC_PLAN_BUF_STASH || t == out_grad;
                if (!ok)
                    mgc_diag(d, MGC_SEV_ERROR, loc, NULL,
                             "%s op %" PRId64 " (%s) reads tensor %d, which is %s", pn, i,
                             mgc_plan_op_name((mgc_plan_op_kind)o->kind), (int)t,
                             pass && state[t] == 1
                                 ? "a forward tensor neither stashed nor recomputed"
                                 : "not produced before it");
            }
            for (int k = 0; k < o->n_out; k++) {
                int32_t t = o->out[k];
                if (ch->tensors[t].role == MGC_TR_GRAD) continue;
                if (state[t] || t == in_act || t == out_grad)
                    mgc_diag(d, MGC_SEV_ERROR, loc, NULL,
                             "%s op %" PRId64 " (%s) writes tensor %d a second time", pn, i,
                             mgc_plan_op_name((mgc_plan_op_kind)o->kind), (int)t);
                state[t] = (uint8_t)(pass ? 2 : 1);
            }
            if (is_coll(o->kind)) {
                uint16_t g = o->group <= MGC_GROUP__COUNT ? o->group : MGC_GROUP__COUNT;
                if (g >= MGC_GROUP__COUNT || o->seq != seq[pass][g]++)
                    mgc_diag(d, MGC_SEV_ERROR, loc, NULL,
                             "%s op %" PRId64 ": collective group %u seq %u out of order", pn, i,
                             o->group, o->seq);
            }
            int saves = 0;
            for (int k = 0; k < o->n_out; k++)
                saves |= ch->tensors[o->out[k]].buffer == MGC_PLAN_BUF_STASH;
            if (!pass && saves != ((o->flags & MGC_POF_SAVED) != 0))
                mgc_diag(d, MGC_SEV_ERROR, loc, NULL,
                         "fwd op %" PRId64 ": MGC_POF_SAVED does not match its outputs", i);
        }
    }
    for (int64_t t = 0; t < n; t++) {
        const mgc_plan_tensor *x = &ch->tensors[t];
        if (x->buffer != MGC_PLAN_BUF_STASH) continue;
        if (x->offset % MGC_PLAN_ALIGN || x->offset + x->bytes > ch->stash_bytes)
            mgc_diag(d, MGC_SEV_ERROR, loc, NULL,
                     "stashed tensor %" PRId64 " at [%" PRIu64 ", +%" PRIu64
                     ") is misaligned or outside the stash of %" PRIu64 " bytes",
                     t, x->offset, x->bytes, ch->stash_bytes);
        if (state[t] != 1 && (int32_t)t != in_act)
            mgc_diag(d, MGC_SEV_ERROR, loc, NULL,
                     "stashed tensor %" PRId64 " is not a forward tensor", t);
    }
    free(state);
    return d->errors > before ? -1 : 0;
}
