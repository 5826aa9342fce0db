/* fusion.c - see fusion.h. */
#include "fusion.h"

#include <string.h>

/* Boundary tensors of a chunk (docs/partitioning.md, "Conventions of a chunk"):
 * the first four indices hold the activations and gradients that cross
 * pipeline stages; a fusion never drops one of them. */
#define BOUNDARY_TENSORS 4

/* Ops of `ops` (n) other than `skip_a` and `skip_b` that read or write tensor t. */
static int other_uses(const mgc_plan_op *ops, int64_t n, int64_t skip_a, int64_t skip_b, int32_t t) {
    for (int64_t i = 0; i < n; i++) {
        if (i == skip_a || i == skip_b) continue;
        for (int k = 0; k < ops[i].n_in && k < MGC_PLAN_MAX_IO; k++)
            if (ops[i].in[k] == t) return 1;
        for (int k = 0; k < ops[i].n_out && k < MGC_PLAN_MAX_IO; k++)
            if (ops[i].out[k] == t) return 1;
    }
    return 0;
}

/* norm_bwd (x, w, dy) -> (dx1, dw [, db]) followed by add_bwd (a, b) -> (dx)
 * with dx1 one of a, b and read by nothing else: norm_bwd (x, w, dy, g) ->
 * (dx, dw [, db]) where g is the other addend. */
static int64_t fuse_norm_bwd_add(mgc_plan_chunk *ch) {
    int64_t fused = 0, j = 0;
    mgc_plan_op *ops = ch->bwd;
    int64_t n = ch->n_bwd;
    for (int64_t i = 0; i < n; i++) {
        mgc_plan_op *nb = &ops[i];
        const mgc_plan_op *add = i + 1 < n ? &ops[i + 1] : NULL;
        if (nb->kind == MGC_POP_NORM_BWD && nb->n_in == 3 && nb->n_out >= 1 && add &&
            add->kind == MGC_POP_ADD_BWD && add->n_in == 2 && add->n_out == 1 && !(add->flags & MGC_POF_RECOMPUTE) &&
            !(nb->flags & MGC_POF_RECOMPUTE)) {
            int32_t dx1 = nb->out[0];
            int which = add->in[0] == dx1 ? 0 : add->in[1] == dx1 ? 1 : -1;
            int32_t g = which >= 0 ? add->in[1 - which] : -1;
            if (which >= 0 && g != dx1 && dx1 >= BOUNDARY_TENSORS && add->out[0] != g &&
                !other_uses(ops, n, i, i + 1, dx1)) {
                mgc_plan_op f = *nb;
                f.in[3] = g;
                f.n_in = 4;
                f.out[0] = add->out[0];
                ops[j++] = f;
                i++; /* the add is absorbed */
                fused++;
                continue;
            }
        }
        ops[j++] = *nb;
    }
    ch->n_bwd = j;
    return fused;
}

void mgc_fuse_chunk(mgc_plan_chunk *ch, mgc_fusion_stats *st) {
    int64_t a = fuse_norm_bwd_add(ch);
    if (st) st->norm_bwd_add += a;
}
