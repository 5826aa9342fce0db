/* backend.c - the parts of an op's semantics every backend shares (backend.h). */
#include "backend.h"

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
