/* fusion.c - see fusion.h. */
#include "fusion.h"

#include <stdlib.h>
#include <string.h>

/* Boundary tensors of a chunk (docs/partitioning.md, "Conventions of a chunk"):
 * the first four indices hold the activations and gradients that cross
 * pipeline stages; a fusion never drops one of them. */
#define BOUNDARY_TENSORS 4

/* How many times each tensor of the chunk is read or written by `ops` (n):
 * uses[t]; NULL when out of memory (the caller then fuses nothing). */
static int32_t *count_uses(const mgc_plan_chunk *ch, const mgc_plan_op *ops, int64_t n) {
    int32_t *uses = calloc((size_t)(ch->n_tensors > 0 ? ch->n_tensors : 1), sizeof *uses);
    if (!uses) return NULL;
    for (int64_t i = 0; i < n; i++) {
        for (int k = 0; k < ops[i].n_in && k < MGC_PLAN_MAX_IO; k++)
            if (ops[i].in[k] >= 0 && ops[i].in[k] < ch->n_tensors) uses[ops[i].in[k]]++;
        for (int k = 0; k < ops[i].n_out && k < MGC_PLAN_MAX_IO; k++)
            if (ops[i].out[k] >= 0 && ops[i].out[k] < ch->n_tensors) uses[ops[i].out[k]]++;
    }
    return uses;
}

/* norm_bwd (x, w, dy) -> (dx1, dw [, db]) followed by add_bwd (a, b) -> (dx)
 * with dx1 one of a, b and read by nothing else: norm_bwd (x, w, dy, g) ->
 * (dx, dw [, db]) where g is the other addend. */
static int64_t fuse_norm_bwd_add(mgc_plan_chunk *ch) {
    int64_t fused = 0, j = 0;
    mgc_plan_op *ops = ch->bwd;
    int64_t n = ch->n_bwd;
    /* dx1 may be dropped only when the pair is its whole life: written once, read once */
    int32_t *uses = count_uses(ch, ops, n);
    if (!uses) return 0;
    for (int64_t i = 0; i < n; i++) {
        mgc_plan_op *nb = &ops[i];
        const mgc_plan_op *add = i + 1 < n ? &ops[i + 1] : NULL;
        if (nb->kind == MGC_POP_NORM_BWD && nb->n_in == 3 && nb->n_out >= 1 && add &&
            add->kind == MGC_POP_ADD_BWD && add->n_in == 2 && add->n_out == 1 && !(add->flags & MGC_POF_RECOMPUTE) &&
            !(nb->flags & MGC_POF_RECOMPUTE)) {
            int32_t dx1 = nb->out[0];
            int which = add->in[0] == dx1 ? 0 : add->in[1] == dx1 ? 1 : -1;
            int32_t g = which >= 0 ? add->in[1 - which] : -1;
            if (which >= 0 && g != dx1 && dx1 >= BOUNDARY_TENSORS && add->out[0] != g && uses[dx1] == 2) {
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
    free(uses);
    return fused;
}

/* Replaces each adjacent pair (a, b) of the forward program that `pair` fuses (it writes the
 * fused op to *f and returns 1) by that op; the number fused.  Neither op may be a recompute
 * copy. */
static int64_t fuse_fwd_pairs(mgc_plan_chunk *ch,
                              int (*pair)(const mgc_plan_op *a, const mgc_plan_op *b, mgc_plan_op *f)) {
    int64_t fused = 0, j = 0;
    mgc_plan_op *ops = ch->fwd;
    int64_t n = ch->n_fwd;
    for (int64_t i = 0; i < n; i++) {
        mgc_plan_op f;
        if (i + 1 < n && !((ops[i].flags | ops[i + 1].flags) & MGC_POF_RECOMPUTE) &&
            pair(&ops[i], &ops[i + 1], &f)) {
            ops[j++] = f;
            i++; /* the second op is absorbed */
            fused++;
            continue;
        }
        ops[j++] = ops[i];
    }
    ch->n_fwd = j;
    return fused;
}

/* dropout_add (branch, residual) -> (h [, mask]) followed by norm (h, w [, b]) -> (y):
 * add_norm (branch, residual, w [, b]) -> (h, y [, mask]).  The fused op keeps the
 * dropout_add's name, so its dropout stream (hashed from the name) is the same. */
static int pair_add_norm(const mgc_plan_op *da, const mgc_plan_op *nm, mgc_plan_op *f) {
    if (!(da->kind == MGC_POP_DROPOUT_ADD && da->n_in == 2 && (da->n_out == 1 || da->n_out == 2) &&
          nm->kind == MGC_POP_NORM && nm->n_in >= 2 && nm->n_in <= 3 && nm->n_out == 1 &&
          nm->in[0] == da->out[0]))
        return 0;
    *f = *da;
    f->kind = MGC_POP_ADD_NORM;
    f->flags = (uint16_t)(da->flags | nm->flags);
    f->n_in = (uint16_t)(2 + nm->n_in - 1);
    f->in[2] = nm->in[1];
    if (nm->n_in > 2) f->in[3] = nm->in[2];
    f->n_out = (uint16_t)(1 + da->n_out);
    f->out[0] = da->out[0];
    f->out[1] = nm->out[0];
    if (da->n_out > 1) f->out[2] = da->out[1];
    memset(f->fattr, 0, sizeof f->fattr);
    memset(f->iattr, 0, sizeof f->iattr);
    f->fattr[0] = nm->fattr[0]; /* eps */
    f->fattr[1] = da->fattr[0]; /* dropout probability */
    f->iattr[0] = nm->iattr[0]; /* 1: RMSNorm */
    f->iattr[1] = nm->iattr[1]; /* rows */
    f->iattr[2] = nm->iattr[2]; /* h */
    f->flops = 0;
    return 1;
}

/* LINEAR iattr[3] flags of the output layer (partition.c LIN_TIED | LIN_FP32_OUT): never
 * fused. */
#define LIN_OUTPUT_LAYER (1 | 2)

/* linear (x, W [, b]) -> (h) followed by gelu (h) -> (y), in a forward program:
 * linear_gelu (x, W [, b]) -> (y, h).  h stays an output: the backward reads it. */
static int pair_linear_gelu(const mgc_plan_op *ln, const mgc_plan_op *g, mgc_plan_op *f) {
    if (!(ln->kind == MGC_POP_LINEAR && ln->n_in >= 2 && ln->n_in <= 3 && ln->n_out == 1 &&
          g->kind == MGC_POP_GELU && g->n_in == 1 && g->n_out == 1 && g->in[0] == ln->out[0] &&
          g->out[0] != ln->out[0] && !(ln->iattr[3] & LIN_OUTPUT_LAYER)))
        return 0;
    *f = *ln;
    f->kind = MGC_POP_LINEAR_GELU;
    f->flags = (uint16_t)(ln->flags | g->flags);
    f->n_out = 2;
    f->out[0] = g->out[0];
    f->out[1] = ln->out[0];
    return 1;
}

/* linear_dgrad (dy, W) -> (dg) ... gelu_bwd (h, dg) -> (dh), with dg read by nothing else
 * and nothing in between touching dh or h: linear_dgrad_gelu (dy, W, h) -> (dh) in the
 * dgrad's place (the ops between, a wgrad in practice, read neither). */
static int64_t fuse_dgrad_gelu(mgc_plan_chunk *ch) {
    int64_t fused = 0;
    mgc_plan_op *ops = ch->bwd;
    int64_t n = ch->n_bwd;
    int32_t *uses = count_uses(ch, ops, n);
    if (!uses) return 0;
    uint8_t *gone = calloc((size_t)(n > 0 ? n : 1), 1);
    if (!gone) {
        free(uses);
        return 0;
    }
    for (int64_t i = 0; i < n; i++) {
        mgc_plan_op *gb = &ops[i];
        if (gb->kind != MGC_POP_GELU_BWD || gb->n_in != 2 || gb->n_out != 1 ||
            (gb->flags & MGC_POF_RECOMPUTE))
            continue;
        int32_t h = gb->in[0], dg = gb->in[1], dh = gb->out[0];
        if (dg < BOUNDARY_TENSORS || uses[dg] != 2 || h == dg || dh == dg || dh == h) continue;
        int64_t p = i - 1;
        for (; p >= 0; p--) { /* the producer of dg; nothing between may touch h or dh */
            const mgc_plan_op *o = &ops[p];
            int writes_dg = 0, touches = 0;
            for (int k = 0; k < o->n_out && k < MGC_PLAN_MAX_IO; k++) {
                writes_dg |= o->out[k] == dg;
                touches |= o->out[k] == h || o->out[k] == dh;
            }
            for (int k = 0; k < o->n_in && k < MGC_PLAN_MAX_IO; k++) touches |= o->in[k] == dh;
            if (writes_dg || touches) break;
        }
        if (p < 0) continue;
        mgc_plan_op *dx = &ops[p];
        if (dx->kind != MGC_POP_LINEAR_DGRAD || dx->n_in != 2 || dx->n_out != 1 ||
            dx->out[0] != dg || (dx->flags & MGC_POF_RECOMPUTE) || dx->in[0] == dh || dx->in[1] == dh)
            continue;
        dx->kind = MGC_POP_LINEAR_DGRAD_GELU;
        dx->in[2] = h;
        dx->n_in = 3;
        dx->out[0] = dh;
        gone[i] = 1;
        fused++;
    }
    int64_t j = 0;
    for (int64_t i = 0; i < n; i++)
        if (!gone[i]) ops[j++] = ops[i];
    ch->n_bwd = j;
    free(gone);
    free(uses);
    return fused;
}

void mgc_fuse_chunk(mgc_plan_chunk *ch, mgc_fusion_stats *st) {
    int64_t a = fuse_norm_bwd_add(ch);
    int64_t b = fuse_fwd_pairs(ch, pair_add_norm);
    int64_t c = fuse_fwd_pairs(ch, pair_linear_gelu);
    int64_t d = fuse_dgrad_gelu(ch);
    if (st) st->norm_bwd_add += a, st->add_norm += b, st->linear_gelu += c, st->dgrad_gelu += d;
}
