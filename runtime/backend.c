/* backend.c - the parts of an op's semantics every backend shares (backend.h). */
#include "backend.h"

#include <string.h>

#include "rng.h"

uint64_t mgc_op_dropout_stream(const mgc_op_call *c) {
    return mgc_rng_name_hash(mgc_plan_strat(c->plan, c->op->name)) ^
           ((uint64_t)c->iteration * 0x9E3779B97F4A7C15ull) ^ ((uint64_t)c->microbatch << 32);
}

/* Sequence-parallel shards of the residual stream are contiguous along dim 0; with
 * context parallelism the rows are two chunks, so a CP shard's masks are its own draw
 * (docs/cpu-backend.md). */
uint64_t mgc_op_shard_elem0(const mgc_op_call *c, const mgc_plan_tensor *t) {
    if (t->split_axis != 0) return 0;
    int64_t r = 0;
    if (t->split_group == MGC_GROUP_TP) r = c->co.tp;
    else if (t->split_group == MGC_GROUP_TPCP) r = c->co.tp + c->co.cp * c->grid_tp;
    else if (t->split_group == MGC_GROUP_CP) r = c->co.cp;
    uint64_t n = 1;
    for (int i = 0; i < t->rank; i++)
        n *= (uint64_t)t->dim[i];
    return (uint64_t)r * n;
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
