/* backend.c - the parts of an op's semantics every backend shares (backend.h). */
#include "backend.h"

#include <string.h>

#include "rng.h"

uint64_t mgc_op_dropout_stream(const mgc_op_call *c) {
    return mgc_rng_name_hash(mgc_plan_strat(c->plan, c->op->name)) ^ mgc_rng_step_mix(c->iteration) ^
           ((uint64_t)c->microbatch << 32);
}

/* A position of a context rank's rows: chunks r and 2cp-1-r of the 2cp equal chunks of the
 * sequence (docs/partitioning.md, "Sequence splits"). */
static int64_t ctx_pos(int64_t x, int64_t s, int64_t cp, int64_t r) {
    int64_t half = s / (2 * cp);
    return x < half ? r * half + x : (2 * cp - 1 - r) * half + (x - half);
}

/* A tensor sharded along dim 0 holds rows of the sequence: under SP (split group TP) rows
 * [tp L, tp L + L) of it, L = s / tp; under CP the rank's two chunks; under both (TPCP)
 * rows [tp L, tp L + L) of the rank's cp-local rows, L = s / (cp tp), which may straddle the
 * two chunks.  Each position holds E = numel / L elements, so the local elements are at most
 * two runs of the global (s, ...) tensor. */
mgc_dropout_rng mgc_op_drop_rng(const mgc_op_call *c, const mgc_plan_tensor *t) {
    mgc_dropout_rng r;
    memset(&r, 0, sizeof r);
    r.seed = c->seed;
    r.stream = mgc_op_dropout_stream(c);
    if (t->split_axis != 0) return r;
    int64_t tp = 1, cp = 1, tpr = 0;
    if (t->split_group == MGC_GROUP_TP) tp = c->grid_tp, tpr = c->co.tp;
    else if (t->split_group == MGC_GROUP_TPCP) tp = c->grid_tp, tpr = c->co.tp, cp = c->grid_cp;
    else if (t->split_group == MGC_GROUP_CP) cp = c->grid_cp;
    else return r;
    uint64_t n = 1;
    for (int i = 0; i < t->rank; i++)
        n *= (uint64_t)t->dim[i];
    int64_t s = c->seq_length, L = tp * cp > 0 ? s / (tp * cp) : 0;
    if (cp <= 1 || L <= 0 || s % (2 * cp) != 0 || n % (uint64_t)L != 0) { /* contiguous shards */
        r.elem0 = (uint64_t)(tpr + (cp > 1 ? c->co.cp * tp : 0)) * n;
        return r;
    }
    uint64_t E = n / (uint64_t)L;
    int64_t base = tpr * L, half = s / (2 * cp);
    int64_t first = base < half ? (half - base < L ? half - base : L) : L;
    r.elem0 = (uint64_t)ctx_pos(base, s, cp, c->co.cp) * E;
    if (first < L) {
        r.n0 = (int64_t)((uint64_t)first * E);
        r.elem1 = (uint64_t)ctx_pos(base + first, s, cp, c->co.cp) * E;
    }
    return r;
}

/* Attention heads are split over the tensor group in order (partition.c: a_l = a / tp). */
mgc_dropout_rng mgc_op_attn_drop_rng(const mgc_op_call *c, int64_t A) {
    mgc_dropout_rng r;
    memset(&r, 0, sizeof r);
    r.seed = c->seed;
    r.stream = mgc_op_dropout_stream(c);
    int64_t tp = c->grid_tp > 1 ? c->grid_tp : 1;
    r.heads = A * tp;
    r.head0 = A * (tp > 1 ? c->co.tp : 0);
    r.seq = c->seq_length;
    return r;
}

void mgc_op_split_add_norm(const mgc_op_call *c, mgc_plan_op *add_op, mgc_op_call *add_call,
                           mgc_plan_op *norm_op, mgc_op_call *norm_call) {
    const mgc_plan_op *f = c->op; /* in: branch, residual, w (, b); out: h, y (, mask) */
    *add_op = *f;
    add_op->kind = MGC_POP_DROPOUT_ADD;
    add_op->n_in = 2;
    add_op->n_out = f->n_out > 2 ? 2 : 1;
    add_op->out[1] = f->n_out > 2 ? f->out[2] : -1;
    memset(add_op->fattr, 0, sizeof add_op->fattr);
    memset(add_op->iattr, 0, sizeof add_op->iattr);
    add_op->fattr[0] = f->fattr[1];
    *add_call = *c;
    add_call->op = add_op;
    add_call->out[1] = f->n_out > 2 ? c->out[2] : NULL;

    *norm_op = *f;
    norm_op->kind = MGC_POP_NORM;
    norm_op->n_in = (uint16_t)(f->n_in - 1);
    norm_op->in[0] = f->out[0];
    norm_op->in[1] = f->in[2];
    norm_op->in[2] = f->n_in > 3 ? f->in[3] : -1;
    norm_op->n_out = 1;
    norm_op->out[0] = f->out[1];
    memset(norm_op->fattr, 0, sizeof norm_op->fattr);
    norm_op->fattr[0] = f->fattr[0];
    norm_op->iattr[3] = 0;
    *norm_call = *c;
    norm_call->op = norm_op;
    norm_call->in[0] = c->out[0];
    norm_call->in[1] = c->in[2];
    norm_call->in[2] = f->n_in > 3 ? c->in[3] : NULL;
    norm_call->out[0] = c->out[1];
}

int mgc_op_split_embedding_norm(const mgc_op_call *c, mgc_plan_op *emb_op, mgc_op_call *emb_call,
                                mgc_plan_op *drop_op, mgc_op_call *drop_call, mgc_plan_op *norm_op,
                                mgc_op_call *norm_call) {
    const mgc_plan_op *f = c->op; /* mgc_plan_emb_norm_io; out: x, y (, mask) */
    mgc_emb_norm_io io;
    if (mgc_plan_emb_norm_io(f, &io) || (f->n_out != 2 && f->n_out != 3)) return -1;
    int drop = f->n_out == 3;
    *emb_op = *f; /* in: tokens, word (, positions) (, doc starts); out: x */
    emb_op->kind = MGC_POP_EMBEDDING;
    *emb_call = *c;
    emb_call->op = emb_op;
    int k = io.pos >= 0 ? 3 : 2;
    if (io.docs >= 0) {
        emb_op->in[k] = f->in[io.docs];
        emb_call->in[k] = c->in[io.docs];
        k++;
    }
    emb_op->n_in = (uint16_t)k;
    emb_op->n_out = 1;
    emb_op->out[1] = emb_op->out[2] = -1;
    emb_call->out[1] = emb_call->out[2] = NULL;
    memset(emb_op->fattr, 0, sizeof emb_op->fattr);

    const mgc_plan_tensor *x = &c->chunk->tensors[f->out[0]];
    int64_t h = x->rank > 0 ? x->dim[x->rank - 1] : 0, rows = 1;
    for (int i = 0; i + 1 < x->rank; i++) rows *= x->dim[i];
    *norm_op = *f; /* in: x, w (, b); out: y */
    norm_op->kind = MGC_POP_NORM;
    norm_op->flags = (uint16_t)(f->flags & ~MGC_POF_DOCS);
    norm_op->n_in = (uint16_t)(io.b >= 0 ? 3 : 2);
    norm_op->in[0] = f->out[0];
    norm_op->in[1] = f->in[io.w];
    norm_op->in[2] = io.b >= 0 ? f->in[io.b] : -1;
    norm_op->n_out = 1;
    norm_op->out[0] = f->out[1];
    norm_op->out[1] = norm_op->out[2] = -1;
    memset(norm_op->fattr, 0, sizeof norm_op->fattr);
    norm_op->fattr[0] = f->fattr[0];
    norm_op->iattr[0] = f->fattr[1] == 1;
    norm_op->iattr[1] = rows;
    norm_op->iattr[2] = h;
    norm_op->iattr[3] = 0;
    *norm_call = *c;
    norm_call->op = norm_op;
    norm_call->in[0] = c->out[0];
    norm_call->in[1] = c->in[io.w];
    norm_call->in[2] = io.b >= 0 ? c->in[io.b] : NULL;
    norm_call->out[0] = c->out[1];
    norm_call->out[1] = NULL;
    norm_call->out[2] = NULL;
    if (!drop) return 0;
    /* the dropout in place over x, with the fused op's name (the dropout's) and x's numbering */
    *drop_op = *f;
    drop_op->kind = MGC_POP_DROPOUT;
    drop_op->flags = (uint16_t)(f->flags & ~MGC_POF_DOCS);
    drop_op->n_in = 1;
    drop_op->in[0] = f->out[0];
    drop_op->n_out = 2;
    drop_op->out[0] = f->out[0];
    drop_op->out[1] = f->out[2];
    drop_op->out[2] = -1;
    memset(drop_op->fattr, 0, sizeof drop_op->fattr);
    memset(drop_op->iattr, 0, sizeof drop_op->iattr);
    drop_op->fattr[0] = f->fattr[2];
    *drop_call = *c;
    drop_call->op = drop_op;
    drop_call->in[0] = c->out[0];
    drop_call->out[0] = c->out[0];
    drop_call->out[1] = c->out[2];
    drop_call->out[2] = NULL;
    return 1;
}
