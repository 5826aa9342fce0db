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

/* qkv_split (qkv) -> (q, k, v) immediately followed by attention (q, k, v) -> (out [, lse]) in
 * the forward, whose backward attention_bwd (q, k, v, out, lse, dout) -> (dq, dk, dv) is
 * followed, later, by qkv_split_bwd (dq, dk, dv) -> (dqkv): attention reads q, k and v in place
 * from qkv and attention_bwd writes dqkv (MGC_POF_QKV, plan.h mgc_plan_attn_geom); both splits
 * go; the attention's recompute copies (selective recompute) read qkv too.  Only when q, k, v
 * and dq, dk, dv have no other reader or writer (no rotary embedding, no context-parallel
 * gather between) and nothing between the backward pair touches dqkv.  The backward now reads
 * qkv instead of q, k, v: qkv takes their stash slot when they are stashed back to back (it is
 * as large as the three), else nothing is fused. */
static int64_t fuse_qkv_attention(mgc_plan_chunk *ch) {
    int64_t fused = 0;
    int32_t *uses = count_uses(ch, ch->fwd, ch->n_fwd), *ub = count_uses(ch, ch->bwd, ch->n_bwd);
    if (!uses || !ub) {
        free(uses), free(ub);
        return 0;
    }
    for (int64_t i = 0; i < ch->n_tensors; i++) uses[i] += ub[i];
    uint8_t *gone_f = calloc((size_t)(ch->n_fwd > 0 ? ch->n_fwd : 1), 1);
    uint8_t *gone_b = calloc((size_t)(ch->n_bwd > 0 ? ch->n_bwd : 1), 1);
    for (int64_t i = 0; gone_f && gone_b && i + 1 < ch->n_fwd; i++) {
        mgc_plan_op *sp = &ch->fwd[i], *at = &ch->fwd[i + 1];
        if (sp->kind != MGC_POP_QKV_SPLIT || sp->n_in != 1 || sp->n_out != 3 ||
            at->kind != MGC_POP_ATTENTION || at->n_in != 3 || at->n_out < 1 ||
            ((sp->flags | at->flags) & (MGC_POF_RECOMPUTE | MGC_POF_QKV)))
            continue;
        int32_t qkv = sp->in[0], q = sp->out[0], k = sp->out[1], v = sp->out[2];
        if (at->in[0] != q || at->in[1] != k || at->in[2] != v || q < BOUNDARY_TENSORS ||
            k < BOUNDARY_TENSORS || v < BOUNDARY_TENSORS || qkv < 0 || q == k || k == v || q == v)
            continue;
        /* q, k, v: written by the split, read by the attention, its backward and its recompute
         * copies (selective recompute re-runs it for the logsumexp) only */
        int re = 0;
        for (int64_t j = 0; j < ch->n_bwd; j++) {
            const mgc_plan_op *o = &ch->bwd[j];
            re += o->kind == MGC_POP_ATTENTION && (o->flags & MGC_POF_RECOMPUTE) && o->n_in == 3 &&
                  o->in[0] == q && o->in[1] == k && o->in[2] == v;
        }
        if (uses[q] != 3 + re || uses[k] != 3 + re || uses[v] != 3 + re) continue;
        int64_t bi = -1, si = -1;
        for (int64_t j = 0; j < ch->n_bwd && bi < 0; j++) {
            const mgc_plan_op *o = &ch->bwd[j];
            if (o->kind == MGC_POP_ATTENTION_BWD && o->n_in == 6 && o->n_out == 3 &&
                o->in[0] == q && o->in[1] == k && o->in[2] == v &&
                !(o->flags & (MGC_POF_RECOMPUTE | MGC_POF_QKV)))
                bi = j;
        }
        if (bi < 0) continue;
        mgc_plan_op *ab = &ch->bwd[bi];
        int32_t dq = ab->out[0], dk = ab->out[1], dv = ab->out[2];
        if (dq < BOUNDARY_TENSORS || dk < BOUNDARY_TENSORS || dv < BOUNDARY_TENSORS ||
            uses[dq] != 2 || uses[dk] != 2 || uses[dv] != 2)
            continue;
        int32_t dqkv = -1;
        for (int64_t j = bi + 1; j < ch->n_bwd; j++) {
            const mgc_plan_op *o = &ch->bwd[j];
            if (o->kind == MGC_POP_QKV_SPLIT_BWD && o->n_in == 3 && o->n_out == 1 &&
                o->in[0] == dq && o->in[1] == dk && o->in[2] == dv &&
                !(o->flags & MGC_POF_RECOMPUTE)) {
                si = j, dqkv = o->out[0];
                break;
            }
        }
        if (si < 0 || dqkv < 0) continue;
        int clash = 0; /* nothing between the backward pair reads or writes dqkv */
        for (int64_t j = bi; j < si && !clash; j++) {
            const mgc_plan_op *o = &ch->bwd[j];
            for (int t = 0; t < o->n_in && t < MGC_PLAN_MAX_IO; t++) clash |= o->in[t] == dqkv;
            for (int t = 0; t < o->n_out && t < MGC_PLAN_MAX_IO; t++) clash |= o->out[t] == dqkv;
        }
        if (clash) continue;
        /* the stash: qkv where q, k, v were (back to back, as the autodiff packs them) */
        mgc_plan_tensor *Q = &ch->tensors[q], *K = &ch->tensors[k], *V = &ch->tensors[v],
                        *X = &ch->tensors[qkv];
        int relocate = 0;
        if (X->buffer != MGC_PLAN_BUF_STASH) {
            if (Q->buffer != MGC_PLAN_BUF_STASH || K->buffer != MGC_PLAN_BUF_STASH ||
                V->buffer != MGC_PLAN_BUF_STASH)
                continue;
            uint64_t al = MGC_PLAN_ALIGN;
            if (K->offset != (Q->offset + Q->bytes + al - 1) / al * al ||
                V->offset != (K->offset + K->bytes + al - 1) / al * al ||
                X->bytes > V->offset + V->bytes - Q->offset)
                continue;
            relocate = 1;
        }
        /* the producer of qkv saves it now: its flag must say so */
        int64_t pi = -1;
        for (int64_t j = 0; j < i && relocate; j++)
            for (int t = 0; t < ch->fwd[j].n_out && t < MGC_PLAN_MAX_IO; t++)
                if (ch->fwd[j].out[t] == qkv) pi = j;
        if (relocate && pi < 0) continue; /* a chunk input: leave it */
        if (relocate) {
            X->buffer = MGC_PLAN_BUF_STASH;
            X->offset = Q->offset;
            ch->fwd[pi].flags |= MGC_POF_SAVED;
        }
        Q->buffer = K->buffer = V->buffer = -1, Q->offset = K->offset = V->offset = 0;
        at->flags |= MGC_POF_QKV;
        at->n_in = 1;
        at->in[0] = qkv, at->in[1] = at->in[2] = 0;
        for (int64_t j = 0; j < ch->n_bwd; j++) {
            mgc_plan_op *o = &ch->bwd[j];
            if (o->kind == MGC_POP_ATTENTION && (o->flags & MGC_POF_RECOMPUTE) && o->n_in == 3 &&
                o->in[0] == q && o->in[1] == k && o->in[2] == v) {
                o->flags |= MGC_POF_QKV;
                o->n_in = 1;
                o->in[0] = qkv, o->in[1] = o->in[2] = 0;
            }
        }
        ab->flags |= MGC_POF_QKV;
        ab->in[0] = qkv, ab->in[1] = ab->in[3], ab->in[2] = ab->in[4], ab->in[3] = ab->in[5];
        ab->in[4] = ab->in[5] = 0;
        ab->n_in = 4;
        ab->out[0] = dqkv, ab->out[1] = ab->out[2] = 0;
        ab->n_out = 1;
        gone_f[i] = 1;
        gone_b[si] = 1;
        fused++;
        i++; /* the attention */
    }
    if (fused) {
        int64_t j = 0;
        for (int64_t i = 0; i < ch->n_fwd; i++)
            if (!gone_f[i]) ch->fwd[j++] = ch->fwd[i];
        ch->n_fwd = j;
        j = 0;
        for (int64_t i = 0; i < ch->n_bwd; i++)
            if (!gone_b[i]) ch->bwd[j++] = ch->bwd[i];
        ch->n_bwd = j;
    }
    free(gone_f), free(gone_b), free(uses), free(ub);
    return fused;
}

void mgc_fuse_chunk(mgc_plan_chunk *ch, mgc_fusion_stats *st) {
    int64_t a = fuse_norm_bwd_add(ch);
    int64_t b = fuse_fwd_pairs(ch, pair_add_norm);
    int64_t c = fuse_fwd_pairs(ch, pair_linear_gelu);
    int64_t d = fuse_dgrad_gelu(ch);
    int64_t e = fuse_qkv_attention(ch);
    if (st) {
        st->norm_bwd_add += a, st->add_norm += b, st->linear_gelu += c, st->dgrad_gelu += d;
        st->qkv_attention += e;
    }
}
