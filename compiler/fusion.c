/* fusion.c - see fusion.h. */
#include "fusion.h"

#include <stdlib.h>
#include <string.h>
#include "kspec.h"

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

/* Remove the ops flagged in gone_f (forward) and gone_b (backward), keeping the order; NULL
 * leaves that program as it is. */
static void drop_ops(mgc_plan_chunk *ch, const uint8_t *gone_f, const uint8_t *gone_b) {
    int64_t j = 0;
    if (gone_f) {
        for (int64_t i = 0; i < ch->n_fwd; i++)
            if (!gone_f[i]) ch->fwd[j++] = ch->fwd[i];
        ch->n_fwd = j;
    }
    j = 0;
    if (gone_b) {
        for (int64_t i = 0; i < ch->n_bwd; i++)
            if (!gone_b[i]) ch->bwd[j++] = ch->bwd[i];
        ch->n_bwd = j;
    }
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

/* norm_bwd (x, w, dy [, g]) -> (dx, dw [, db]) ... dropout_add_bwd (dx, mask) -> (dbr), the
 * backward of the dropout_add whose sum h the norm read (GPT's residual stream with hidden
 * dropout: h = x + dropout(branch)): norm_bwd with MGC_POF_DROPBWD (x, w, dy [, g], mask) ->
 * (dx, dw [, db], dbr).  dx stays an output: it is the residual stream's gradient, which the
 * layer below reads.  So with the embedding's dropout_bwd (dx, mask) -> (de), the first
 * layer's norm reading x = dropout(e): the same arithmetic, and de is what the embedding's
 * backward reads.  The norm's kernel writes dbr from dx as it stores it, in place of a pass
 * that re-reads dx (24 launches a step at GPT-2 124M with dropout); and the branch's bias
 * gradient can then follow into the norm (fuse_norm_bwd_bias, on dbr).  Only the stashed mask
 * (not the recompute module `dropout`, which draws it again from the dropout's stream), and
 * only when nothing between the two writes dx, the mask or dbr. */
static int64_t fuse_norm_bwd_drop(mgc_plan_chunk *ch) {
    int64_t fused = 0;
    mgc_plan_op *ops = ch->bwd;
    int64_t n = ch->n_bwd;
    uint8_t *gone = calloc((size_t)(n > 0 ? n : 1), 1);
    if (!gone) return 0;
    for (int64_t i = 0; i < n; i++) {
        mgc_plan_op *nb = &ops[i];
        mgc_norm_bwd_io io;
        if (nb->kind != MGC_POP_NORM_BWD || (nb->flags & (MGC_POF_RECOMPUTE | MGC_POF_COLSUM | MGC_POF_DROPBWD)) ||
            mgc_plan_norm_bwd_io(nb, &io) || nb->n_in >= MGC_PLAN_MAX_IO || nb->n_out >= MGC_PLAN_MAX_IO)
            continue;
        int32_t dx = nb->out[0];
        int64_t j = i + 1;
        while (j < n && !((ops[j].kind == MGC_POP_DROPOUT_ADD_BWD || ops[j].kind == MGC_POP_DROPOUT_BWD) &&
                          ops[j].n_in == 2 && ops[j].in[0] == dx))
            j++;
        if (j == n) continue;
        const mgc_plan_op *d = &ops[j];
        int32_t mask = d->in[1], dbr = d->out[0];
        const mgc_plan_tensor *X = &ch->tensors[dx], *M = &ch->tensors[mask], *G = &ch->tensors[dbr];
        uint64_t el = (uint64_t)nb->iattr[1] * (uint64_t)nb->iattr[2];
        if (d->n_out != 1 || (d->flags & MGC_POF_RECOMPUTE) || dbr == dx || dbr == mask ||
            dbr < BOUNDARY_TENSORS || M->dtype != MGC_DT_U8 || M->bytes != el || G->dtype != X->dtype ||
            G->ld || X->ld || G->bytes != X->bytes || !(d->fattr[0] >= 0 && d->fattr[0] < 1))
            continue;
        /* the ops between: none writes dx or the mask, none reads or writes dbr */
        int clash = 0;
        for (int64_t k = i + 1; k < j && !clash; k++) {
            const mgc_plan_op *o = &ops[k];
            for (int q = 0; q < o->n_out && q < MGC_PLAN_MAX_IO; q++)
                clash |= o->out[q] == dx || o->out[q] == mask || o->out[q] == dbr;
            for (int q = 0; q < o->n_in && q < MGC_PLAN_MAX_IO; q++)
                clash |= o->in[q] == dbr;
        }
        if (clash) continue;
        nb->in[nb->n_in++] = mask;
        nb->out[nb->n_out++] = dbr;
        nb->flags |= MGC_POF_DROPBWD;
        nb->fattr[1] = d->fattr[0];
        gone[j] = 1;
        fused++;
    }
    drop_ops(ch, NULL, gone);
    free(gone);
    return fused;
}

/* The first linear_wgrad (dx, x) -> (dW, dbias) after ops[i] of the backward program that reads
 * dx as its output gradient, when its bias gradient may move into the op that writes dx: the
 * wgrad reads dx whole (rows x width, no row pitch) and dbias, an fp32 vector of the width, has
 * no other user (uses: count_uses of the program), so adding dx's column sums where dx is
 * written keeps its order.  Its index, or -1. */
static int64_t bias_wgrad(const mgc_plan_chunk *ch, int64_t i, int32_t dx, int64_t rows,
                          int64_t width, const int32_t *uses) {
    for (int64_t j = i + 1; j < ch->n_bwd; j++) {
        const mgc_plan_op *w = &ch->bwd[j];
        if (w->kind != MGC_POP_LINEAR_WGRAD || w->n_out != 2 || w->in[0] != dx ||
            (w->flags & MGC_POF_RECOMPUTE))
            continue;
        const mgc_plan_tensor *D = &ch->tensors[dx], *B = &ch->tensors[w->out[1]];
        if (w->iattr[0] != rows || w->iattr[1] != width || width <= 0 || D->ld ||
            B->dtype != MGC_DT_F32 || B->bytes != (uint64_t)width * 4 || uses[w->out[1]] != 1)
            return -1;
        return j;
    }
    return -1;
}

/* norm_bwd (..) -> (dx, dw [, db]) ... linear_wgrad (dx, x) -> (dW, dbias), the linear reading
 * dx whole as its output gradient (rows x width the norm's): norm_bwd with MGC_POF_COLSUM ->
 * (dx, dw [, db], dbias), and linear_wgrad (dx, x) -> (dW).  The bias gradient is the column
 * sums of dx, which the norm's backward kernel holds in registers as it writes them, in place
 * of a pass over dx after the GEMM (cuBLASLt's BGRADB reduction kernel, 15.9 us a bias on the
 * H100 at GPT-2 124M, and bias_grad_finish, 3.3 us).  GPT's residual branches (the
 * attention's output projection, the second MLP layer) read the residual stream's gradient,
 * which a norm backward wrote, when no dropout sits between.  Only when dbias is touched by
 * nothing else in the program (its sum keeps the wgrad's order: rows ascending), and only at
 * widths and dtypes whose kernel holds the sums without spilling (mgc_kspec_norm_colsum_fits). */
static int64_t fuse_norm_bwd_bias(mgc_plan_chunk *ch) {
    int64_t fused = 0;
    mgc_plan_op *ops = ch->bwd;
    int64_t n = ch->n_bwd;
    int32_t *uses = count_uses(ch, ops, n);
    if (!uses) return 0;
    for (int64_t i = 0; i < n; i++) {
        mgc_plan_op *nb = &ops[i];
        mgc_norm_bwd_io io;
        if (nb->kind != MGC_POP_NORM_BWD || (nb->flags & (MGC_POF_RECOMPUTE | MGC_POF_COLSUM)) ||
            mgc_plan_norm_bwd_io(nb, &io) || nb->n_out >= MGC_PLAN_MAX_IO)
            continue;
        /* the gradient the branch's linear reads: dx, or the dropout's dbr */
        int32_t dx = io.dbr >= 0 ? nb->out[io.dbr] : nb->out[0];
        int64_t j = bias_wgrad(ch, i, dx, nb->iattr[1], nb->iattr[2], uses);
        if (j < 0 || !mgc_kspec_norm_colsum_fits(nb->iattr[2], ch->tensors[dx].dtype)) continue;
        mgc_plan_op *w = &ops[j];
        /* after dw (and db), before dbr (mgc_plan_norm_bwd_io) */
        int at = 1 + io.sets;
        for (int q = nb->n_out; q > at; q--)
            nb->out[q] = nb->out[q - 1];
        nb->out[at] = w->out[1];
        nb->n_out++;
        nb->flags |= MGC_POF_COLSUM;
        w->n_out = 1;
        w->out[1] = -1;
        fused++;
    }
    free(uses);
    return fused;
}

/* Replaces each run of adjacent ops of the forward program that `run` fuses (it writes the
 * fused op to *f and returns how many ops, 2 or more, it replaces, starting at ch->fwd[i]; 0:
 * none) by that op; the number fused.  No op of a run may be a recompute copy.  While it
 * compacts, ch->fwd[j..i) (j <= i) holds stale copies of ops already placed: a `run` that
 * looks for other uses of a tensor sees them twice, never misses one. */
static int64_t fuse_fwd_runs(mgc_plan_chunk *ch, int (*run)(const mgc_plan_chunk *ch, int64_t i, mgc_plan_op *f)) {
    int64_t fused = 0, j = 0;
    mgc_plan_op *ops = ch->fwd;
    int64_t n = ch->n_fwd;
    for (int64_t i = 0; i < n; i++) {
        mgc_plan_op f;
        int k = run(ch, i, &f), rc = 0;
        for (int q = 0; q < k && i + q < n; q++)
            rc |= (ops[i + q].flags & MGC_POF_RECOMPUTE) != 0;
        if (k >= 2 && i + k <= n && !rc) {
            ops[j++] = f; /* j <= i: the run was read */
            i += k - 1;   /* the others are absorbed */
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
static int pair_add_norm(const mgc_plan_chunk *ch, int64_t i, mgc_plan_op *f) {
    if (i + 2 > ch->n_fwd) return 0;
    const mgc_plan_op *da = &ch->fwd[i], *nm = &ch->fwd[i + 1];
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
    return 2;
}

/* Whether tensor t is touched by an op of the chunk's programs other than fwd[a] and fwd[b]. */
static int used_elsewhere(const mgc_plan_chunk *ch, int32_t t, int64_t a, int64_t b) {
    for (int pass = 0; pass < 2; pass++) {
        const mgc_plan_op *ops = pass ? ch->bwd : ch->fwd;
        int64_t n = pass ? ch->n_bwd : ch->n_fwd;
        for (int64_t i = 0; i < n; i++) {
            if (!pass && (i == a || i == b)) continue;
            for (int q = 0; q < ops[i].n_in && q < MGC_PLAN_MAX_IO; q++)
                if (ops[i].in[q] == t) return 1;
            for (int q = 0; q < ops[i].n_out && q < MGC_PLAN_MAX_IO; q++)
                if (ops[i].out[q] == t) return 1;
        }
    }
    return 0;
}

/* embedding (tokens, word [, positions] [, doc starts]) -> (x) followed by norm (x, w [, b]) ->
 * (y): embedding_norm (tokens, word [, positions], w [, b] [, doc starts]) -> (x, y), one pass
 * in place of the norm's re-read of x (the first layer's norm, 78% of copy bandwidth alone on
 * the H100 at GPT-2 124M: a 25 MB kernel).  With the embedding's dropout between them, saving
 * its mask (GPT's model files: hidden dropout 0.1): embedding (-> e) ; dropout (e) -> (x, mask)
 * ; norm (x) -> (y) becomes embedding_norm -> (x, y, mask) with fattr[2] the dropout's p, named
 * as the dropout (its stream is the name's), and e, which nothing else may touch, is no longer
 * written: three passes over the rows and two launches fewer.  Only where nothing else sits
 * between them: no tensor-parallel reduction of the embedding, and not the recompute module
 * `dropout`, which keeps no mask.  x stays an output: the residual stream and the norm's
 * backward read it.  The fused op keeps the embedding's layer. */
static int pair_embedding_norm(const mgc_plan_chunk *ch, int64_t i, mgc_plan_op *f) {
    if (i + 2 > ch->n_fwd) return 0;
    const mgc_plan_op *em = &ch->fwd[i], *dr = NULL, *nm = &ch->fwd[i + 1];
    if (nm->kind == MGC_POP_DROPOUT && i + 3 <= ch->n_fwd) dr = nm, nm = &ch->fwd[i + 2];
    int docs = (em->flags & MGC_POF_DOCS) != 0, rms = nm->iattr[0] == 1;
    if (!(em->kind == MGC_POP_EMBEDDING && em->n_out == 1 &&
          em->n_in == 2 + (em->iattr[1] != 0) + docs && nm->kind == MGC_POP_NORM &&
          nm->n_in >= 2 && nm->n_in <= (rms ? 2 : 3) && nm->n_out == 1))
        return 0;
    int32_t x = em->out[0];
    if (dr) {
        if (!(dr->n_in == 1 && dr->in[0] == x && dr->n_out == 2 && dr->fattr[0] > 0 && dr->fattr[0] < 1 &&
              dr->out[0] != x && dr->out[1] != x && x >= BOUNDARY_TENSORS && !used_elsewhere(ch, x, i, i + 1)))
            return 0;
        x = dr->out[0];
    }
    if (nm->in[0] != x || nm->out[0] == x || (dr && nm->out[0] == dr->out[1])) return 0;
    *f = *em;
    f->kind = MGC_POP_EMBEDDING_NORM;
    f->flags = (uint16_t)(em->flags | nm->flags | (dr ? dr->flags : 0));
    int k = em->n_in - docs;
    for (int q = 1; q < nm->n_in; q++)
        f->in[k++] = nm->in[q];
    if (docs) f->in[k++] = em->in[em->n_in - 1];
    f->n_in = (uint16_t)k;
    f->n_out = dr ? 3 : 2;
    f->out[0] = x;
    f->out[1] = nm->out[0];
    if (dr) f->out[2] = dr->out[1], f->name = dr->name;
    memset(f->fattr, 0, sizeof f->fattr);
    f->fattr[0] = nm->fattr[0]; /* eps */
    f->fattr[1] = rms;
    if (dr) f->fattr[2] = dr->fattr[0]; /* the dropout's p */
    f->flops = 0;
    return dr ? 3 : 2;
}

/* LINEAR iattr[3] flags of the output layer (partition.c LIN_TIED | LIN_VOCAB): never
 * fused. */
#define LIN_OUTPUT_LAYER (1 | 2)

/* linear (x, W [, b]) -> (h) followed by gelu (h) -> (y), in a forward program:
 * linear_gelu (x, W [, b]) -> (y, h).  h stays an output: the backward reads it. */
static int pair_linear_gelu(const mgc_plan_chunk *ch, int64_t i, mgc_plan_op *f) {
    if (i + 2 > ch->n_fwd) return 0;
    const mgc_plan_op *ln = &ch->fwd[i], *g = &ch->fwd[i + 1];
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
    return 2;
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
    drop_ops(ch, NULL, gone);
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
        /* with the document flag the attention's last input is doc_start, which stays last */
        int docs = (at->flags & MGC_POF_DOCS) != 0;
        if (sp->kind != MGC_POP_QKV_SPLIT || sp->n_in != 1 || sp->n_out != 3 ||
            at->kind != MGC_POP_ATTENTION || at->n_in != 3 + docs || at->n_out < 1 ||
            ((sp->flags | at->flags) & (MGC_POF_RECOMPUTE | MGC_POF_QKV | MGC_POF_ROPE)))
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
            re += o->kind == MGC_POP_ATTENTION && (o->flags & MGC_POF_RECOMPUTE) &&
                  o->n_in == 3 + docs && o->in[0] == q && o->in[1] == k && o->in[2] == v;
        }
        if (uses[q] != 3 + re || uses[k] != 3 + re || uses[v] != 3 + re) continue;
        int64_t bi = -1, si = -1;
        for (int64_t j = 0; j < ch->n_bwd && bi < 0; j++) {
            const mgc_plan_op *o = &ch->bwd[j];
            if (o->kind == MGC_POP_ATTENTION_BWD && o->n_in == 6 + docs && o->n_out == 3 &&
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
        at->n_in = (uint16_t)(1 + docs);
        at->in[0] = qkv, at->in[1] = docs ? at->in[3] : 0, at->in[2] = at->in[3] = 0;
        for (int64_t j = 0; j < ch->n_bwd; j++) {
            mgc_plan_op *o = &ch->bwd[j];
            if (o->kind == MGC_POP_ATTENTION && (o->flags & MGC_POF_RECOMPUTE) &&
                o->n_in == 3 + docs && o->in[0] == q && o->in[1] == k && o->in[2] == v) {
                o->flags |= MGC_POF_QKV;
                o->n_in = (uint16_t)(1 + docs);
                o->in[0] = qkv, o->in[1] = docs ? o->in[3] : 0, o->in[2] = o->in[3] = 0;
            }
        }
        ab->flags |= MGC_POF_QKV;
        ab->in[0] = qkv, ab->in[1] = ab->in[3], ab->in[2] = ab->in[4], ab->in[3] = ab->in[5];
        ab->in[4] = docs ? ab->in[6] : 0, ab->in[5] = ab->in[6] = 0;
        ab->n_in = (uint16_t)(4 + docs);
        ab->out[0] = dqkv, ab->out[1] = ab->out[2] = 0;
        ab->n_out = 1;
        gone_f[i] = 1;
        gone_b[si] = 1;
        fused++;
        i++; /* the attention */
    }
    if (fused) drop_ops(ch, gone_f, gone_b);
    free(gone_f), free(gone_b), free(uses), free(ub);
    return fused;
}

/* The first rope of `t` in ops[from, to) with the given recompute flag: its index, or -1.
 * kind: MGC_POP_ROPE (reads t) or MGC_POP_ROPE_BWD (writes t). */
static int64_t rope_of(const mgc_plan_op *ops, int64_t from, int64_t to, int32_t t, uint16_t kind,
                       uint16_t recompute) {
    for (int64_t j = from; j < to; j++) {
        const mgc_plan_op *o = &ops[j];
        if (o->kind != kind || o->n_in != 1 + ((o->flags & MGC_POF_DOCS) != 0) || o->n_out != 1 ||
            (o->flags & MGC_POF_RECOMPUTE) != recompute)
            continue;
        if (kind == MGC_POP_ROPE ? o->in[0] == t : o->out[0] == t) return j;
    }
    return -1;
}

/* Every op of the chunk touching t (but the ops already fused away, gone[pass]) is a `split`
 * kind writing it as output `slot` (reading it as input `slot`: the join) or a `rope` kind
 * reading it (ROPE) / writing it (ROPE_BWD), and each pass has none or exactly that pair. */
static int split_rope_only(const mgc_plan_chunk *ch, const uint8_t *const gone[2], int32_t t,
                           uint16_t split, int slot, uint16_t rope) {
    for (int pass = 0; pass < 2; pass++) {
        const mgc_plan_op *ops = pass ? ch->bwd : ch->fwd;
        int64_t n = pass ? ch->n_bwd : ch->n_fwd;
        int splits = 0, ropes = 0;
        for (int64_t i = 0; i < n; i++) {
            const mgc_plan_op *o = &ops[i];
            if (gone[pass][i]) continue; /* a rope already fused away */
            int touch = 0;
            for (int k = 0; k < o->n_in && k < MGC_PLAN_MAX_IO; k++) touch += o->in[k] == t;
            for (int k = 0; k < o->n_out && k < MGC_PLAN_MAX_IO; k++) touch += o->out[k] == t;
            if (!touch) continue;
            if (touch > 1) return 0;
            int fwd_split = split == MGC_POP_QKV_SPLIT;
            if (o->kind == split && (fwd_split ? o->out[slot] == t : o->in[slot] == t)) splits++;
            else if (o->kind == rope && (rope == MGC_POP_ROPE ? o->in[0] == t : o->out[0] == t))
                ropes++;
            else
                return 0;
        }
        if (splits != ropes || splits > 1) return 0;
    }
    return 1;
}

/* the same rotation: dim, context layout, base, and the same document starts (MGC_POF_DOCS:
 * the last input, which the fused split or join then takes as its own last input) */
static int same_rope(const mgc_plan_op *a, const mgc_plan_op *b) {
    int da = (a->flags & MGC_POF_DOCS) != 0, db = (b->flags & MGC_POF_DOCS) != 0;
    return a->iattr[0] == b->iattr[0] && a->iattr[1] == b->iattr[1] && a->fattr[0] == b->fattr[0] &&
           da == db && (!da || a->in[1] == b->in[1]);
}

/* The ops of the backward program whose output gradient out[0] (rows x width) may take the
 * bias gradient of the linear that reads it (fuse_bias_into): 1 with *rows and *width. */
typedef int (*bias_site_fn)(const mgc_plan_chunk *ch, const mgc_plan_op *o, int64_t *rows,
                            int64_t *width);

/* Moves the bias gradient of the linear_wgrad that reads a site's out[0] (bias_wgrad) into the
 * site as its second output, flagged MGC_POF_COLSUM; the wgrad keeps dW alone. */
static int64_t fuse_bias_into(mgc_plan_chunk *ch, bias_site_fn site) {
    int64_t fused = 0;
    mgc_plan_op *ops = ch->bwd;
    int64_t n = ch->n_bwd;
    int32_t *uses = count_uses(ch, ops, n);
    if (!uses) return 0;
    for (int64_t i = 0; i < n; i++) {
        mgc_plan_op *o = &ops[i];
        int64_t rows, width;
        if (o->n_out != 1 || (o->flags & (MGC_POF_RECOMPUTE | MGC_POF_COLSUM)) ||
            !site(ch, o, &rows, &width))
            continue;
        int64_t j = bias_wgrad(ch, i, o->out[0], rows, width, uses);
        if (j < 0) continue;
        mgc_plan_op *w = &ops[j];
        o->out[1] = w->out[1];
        o->n_out = 2;
        o->flags |= MGC_POF_COLSUM;
        w->n_out = 1;
        w->out[1] = -1;
        fused++;
    }
    free(uses);
    return fused;
}

/* attention_bwd (.. -> dqkv) with MGC_POF_QKV ... linear_wgrad (dqkv, x) -> (dW, dbias), the
 * QKV projection's weight gradient reading dqkv whole: attention_bwd with MGC_POF_COLSUM ->
 * (dqkv, dbias), and linear_wgrad (dqkv, x) -> (dW).  The bias gradient is the column sums of
 * dqkv, which the 16-bit dQ and dK/dV kernels sum from their accumulators as they store them
 * (a row of partials a 64-row tile, added by norm_bwd_reduce), in place of cuBLASLt's BGRADB
 * reduction (15.9 us a bias on the H100 at GPT-2 124M) and bias_grad_finish.  fp32 plans fuse
 * too (the CPU computes the same function; the CUDA launcher then sums dqkv with the
 * bias-gradient kernels after the attention's).  Only when dbias is touched by nothing else in
 * the program (its sum keeps the wgrad's order on the CPU: rows ascending). */
static int attention_bias_site(const mgc_plan_chunk *ch, const mgc_plan_op *o, int64_t *rows,
                               int64_t *width) {
    mgc_attn_geom g;
    if (o->kind != MGC_POP_ATTENTION_BWD || !(o->flags & MGC_POF_QKV) ||
        mgc_plan_attn_geom(ch, o, &g))
        return 0;
    *rows = g.sq * g.b, *width = (g.A + 2 * g.G) * g.d;
    return 1;
}

/* linear_dgrad_gelu (dy, W, h) -> (dh) ... linear_wgrad (dh, x) -> (dW, dbias), the MLP's first
 * linear reading dh whole as its output gradient: linear_dgrad_gelu with MGC_POF_COLSUM ->
 * (dh, dbias), and linear_wgrad (dh, x) -> (dW).  The bias gradient is the column sums of dh,
 * which cuBLASLt's DGELU_BGRAD epilogue sums as the GEMM writes dh, in place of a pass over dh
 * after the weight gradient's GEMM (BGRADB's reduction kernel, 15.9 us a bias on the H100 at
 * GPT-2 124M).  fp32 plans fuse too (the CPU computes the same function; the CUDA launcher
 * then sums dh with the bias-gradient kernels after the GEMM).  Only when dbias is touched by
 * nothing else in the program (its sum keeps the wgrad's order on the CPU: rows ascending). */
static int dgrad_gelu_bias_site(const mgc_plan_chunk *ch, const mgc_plan_op *o, int64_t *rows,
                                int64_t *width) {
    (void)ch;
    if (o->kind != MGC_POP_LINEAR_DGRAD_GELU) return 0;
    *rows = o->iattr[0], *width = o->iattr[2];
    return 1;
}

/* qkv_split (qkv) -> (q, k, v) ; rope (q) -> q' ; rope (k) -> k'  becomes qkv_split with
 * MGC_POF_ROPE: (qkv) -> (q', k', v), the rotation applied as q and k leave the split.  And in
 * the backward, rope_bwd (dq') -> dq ; rope_bwd (dk') -> dk ; qkv_split_bwd (dq, dk, dv) ->
 * dqkv becomes qkv_split_bwd with MGC_POF_ROPE: (dq', dk', dv) -> dqkv, the inverse rotation
 * applied as they join.  Both programs, recompute copies included (full recompute re-runs the
 * split and the ropes), each split with the ropes of its own pass and recompute flag.  Only
 * when q and k (dq and dk) are touched by nothing else in the chunk, and are not stashed nor
 * boundary tensors; the rotated tensors keep their places.  The rope's attributes go to the
 * split's: iattr[3] the rotary dim, fattr[0] the base, fattr[1] the context-parallel degree of
 * the positions (plan.h). */
static int64_t fuse_qkv_rope(mgc_plan_chunk *ch) {
    int64_t fused = 0;
    uint8_t *gone_f = calloc((size_t)(ch->n_fwd > 0 ? ch->n_fwd : 1), 1);
    uint8_t *gone_b = calloc((size_t)(ch->n_bwd > 0 ? ch->n_bwd : 1), 1);
    if (!gone_f || !gone_b) {
        free(gone_f), free(gone_b);
        return 0;
    }
    const uint8_t *const gone2[2] = {gone_f, gone_b};
    for (int pass = 0; pass < 2; pass++) {
        mgc_plan_op *ops = pass ? ch->bwd : ch->fwd;
        int64_t n = pass ? ch->n_bwd : ch->n_fwd;
        uint8_t *gone = pass ? gone_b : gone_f;
        for (int64_t i = 0; i < n; i++) {
            mgc_plan_op *sp = &ops[i];
            uint16_t rc = sp->flags & MGC_POF_RECOMPUTE;
            if (sp->kind != MGC_POP_QKV_SPLIT || sp->n_in != 1 || sp->n_out != 3 ||
                (sp->flags & (MGC_POF_QKV | MGC_POF_ROPE)) || gone[i])
                continue;
            int32_t q = sp->out[0], k = sp->out[1];
            int64_t rq = rope_of(ops, i + 1, n, q, MGC_POP_ROPE, rc),
                    rk = rope_of(ops, i + 1, n, k, MGC_POP_ROPE, rc);
            if (rq < 0 || rk < 0 || gone[rq] || gone[rk] || !same_rope(&ops[rq], &ops[rk])) continue;
            int32_t qr = ops[rq].out[0], kr = ops[rk].out[0];
            /* q and k: touched only by their splits and ropes, pass by pass */
            const mgc_plan_tensor *Q = &ch->tensors[q], *K = &ch->tensors[k];
            if (q < BOUNDARY_TENSORS || k < BOUNDARY_TENSORS || q == k || qr == kr ||
                Q->buffer == MGC_PLAN_BUF_STASH || K->buffer == MGC_PLAN_BUF_STASH ||
                !split_rope_only(ch, gone2, q, MGC_POP_QKV_SPLIT, 0, MGC_POP_ROPE) ||
                !split_rope_only(ch, gone2, k, MGC_POP_QKV_SPLIT, 1, MGC_POP_ROPE))
                continue;
            /* nothing between the split and the ropes touches the rotated outputs */
            int clash = 0;
            int64_t last = rq > rk ? rq : rk;
            for (int64_t j = i + 1; j < last && !clash; j++) {
                if (j == rq || j == rk) continue;
                for (int t = 0; t < ops[j].n_in + ops[j].n_out; t++) {
                    int32_t x = t < ops[j].n_in ? ops[j].in[t] : ops[j].out[t - ops[j].n_in];
                    clash |= x == qr || x == kr;
                }
            }
            if (clash) continue;
            sp->out[0] = qr, sp->out[1] = kr;
            sp->flags |= MGC_POF_ROPE | ((ops[rq].flags | ops[rk].flags) & MGC_POF_SAVED);
            if (ops[rq].flags & MGC_POF_DOCS) {
                sp->flags |= MGC_POF_DOCS;
                sp->in[1] = ops[rq].in[1];
                sp->n_in = 2;
            }
            sp->iattr[3] = ops[rq].iattr[0];
            sp->fattr[0] = ops[rq].fattr[0];
            sp->fattr[1] = (double)(ops[rq].iattr[1] > 0 ? ops[rq].iattr[1] : 1);
            gone[rq] = gone[rk] = 1;
            fused++;
        }
    }
    /* the backward's joins */
    for (int64_t i = 0; i < ch->n_bwd; i++) {
        mgc_plan_op *jn = &ch->bwd[i];
        if (jn->kind != MGC_POP_QKV_SPLIT_BWD || jn->n_in != 3 || jn->n_out != 1 ||
            (jn->flags & (MGC_POF_QKV | MGC_POF_ROPE | MGC_POF_RECOMPUTE)))
            continue;
        int32_t dq = jn->in[0], dk = jn->in[1];
        int64_t rq = -1, rk = -1;
        for (int64_t j = i - 1; j >= 0 && (rq < 0 || rk < 0); j--) {
            const mgc_plan_op *o = &ch->bwd[j];
            if (o->kind != MGC_POP_ROPE_BWD || o->n_in != 1 + ((o->flags & MGC_POF_DOCS) != 0) ||
                o->n_out != 1 || (o->flags & MGC_POF_RECOMPUTE) || gone_b[j])
                continue;
            if (o->out[0] == dq && rq < 0) rq = j;
            if (o->out[0] == dk && rk < 0) rk = j;
        }
        if (rq < 0 || rk < 0 || !same_rope(&ch->bwd[rq], &ch->bwd[rk])) continue;
        int32_t dqr = ch->bwd[rq].in[0], dkr = ch->bwd[rk].in[0];
        if (dq < BOUNDARY_TENSORS || dk < BOUNDARY_TENSORS || dq == dk || dqr == dkr ||
            ch->tensors[dq].buffer == MGC_PLAN_BUF_STASH ||
            ch->tensors[dk].buffer == MGC_PLAN_BUF_STASH ||
            !split_rope_only(ch, gone2, dq, MGC_POP_QKV_SPLIT_BWD, 0, MGC_POP_ROPE_BWD) ||
            !split_rope_only(ch, gone2, dk, MGC_POP_QKV_SPLIT_BWD, 1, MGC_POP_ROPE_BWD))
            continue;
        /* the join now reads dq', dk' where the ropes did: nothing between writes them */
        int clash = 0;
        for (int64_t j = (rq < rk ? rq : rk) + 1; j < i && !clash; j++)
            for (int t = 0; t < ch->bwd[j].n_out; t++)
                clash |= ch->bwd[j].out[t] == dqr || ch->bwd[j].out[t] == dkr;
        if (clash) continue;
        jn->in[0] = dqr, jn->in[1] = dkr;
        jn->flags |= MGC_POF_ROPE;
        if (ch->bwd[rq].flags & MGC_POF_DOCS) {
            jn->flags |= MGC_POF_DOCS;
            jn->in[3] = ch->bwd[rq].in[1];
            jn->n_in = 4;
        }
        jn->iattr[3] = ch->bwd[rq].iattr[0];
        jn->fattr[0] = ch->bwd[rq].fattr[0];
        jn->fattr[1] = (double)(ch->bwd[rq].iattr[1] > 0 ? ch->bwd[rq].iattr[1] : 1);
        gone_b[rq] = gone_b[rk] = 1;
        fused++;
    }
    if (fused) drop_ops(ch, gone_f, gone_b);
    free(gone_f), free(gone_b);
    return fused;
}

static const struct {
    const char *name;
    unsigned bit;
} fusion_names[] = {
    {"norm_bwd_add", MGC_FUSE_NORM_BWD_ADD},   {"add_norm", MGC_FUSE_ADD_NORM},
    {"linear_gelu", MGC_FUSE_LINEAR_GELU},     {"dgrad_gelu", MGC_FUSE_DGRAD_GELU},
    {"qkv_attention", MGC_FUSE_QKV_ATTENTION}, {"qkv_rope", MGC_FUSE_QKV_ROPE},
    {"norm_bwd_bias", MGC_FUSE_NORM_BWD_BIAS}, {"embedding_norm", MGC_FUSE_EMBEDDING_NORM},
    {"norm_bwd_drop", MGC_FUSE_NORM_BWD_DROP}, {"attention_bwd_bias", MGC_FUSE_ATTENTION_BWD_BIAS},
    {"dgrad_gelu_bias", MGC_FUSE_DGRAD_GELU_BIAS},
};

int mgc_fusion_parse(const char *spec, unsigned *which, const char **bad, size_t *bad_len) {
    *which = MGC_FUSE_ALL;
    if (!spec || !*spec || !strcmp(spec, "1")) return 0;
    if (!strcmp(spec, "0")) {
        *which = 0;
        return 0;
    }
    unsigned on = 0, off = 0;
    for (const char *p = spec; *p;) {
        const char *e = strchr(p, ',');
        size_t n = e ? (size_t)(e - p) : strlen(p);
        int minus = n > 0 && *p == '-';
        const char *name = p + minus;
        size_t len = n - (size_t)minus;
        unsigned bit = 0;
        for (size_t i = 0; i < sizeof fusion_names / sizeof fusion_names[0] && !bit; i++)
            if (strlen(fusion_names[i].name) == len && !strncmp(fusion_names[i].name, name, len))
                bit = fusion_names[i].bit;
        if (!bit) {
            *bad = p, *bad_len = n;
            return -1;
        }
        if (minus)
            off |= bit;
        else
            on |= bit;
        p = e ? e + 1 : p + n;
    }
    *which = (on ? on : MGC_FUSE_ALL) & ~off;
    return 0;
}

void mgc_fuse_chunk(mgc_plan_chunk *ch, unsigned which, mgc_fusion_stats *st) {
    /* the norm backward takes its residual add before it can take a bias gradient */
    int64_t a = which & MGC_FUSE_NORM_BWD_ADD ? fuse_norm_bwd_add(ch) : 0;
    /* and its dropout's backward before the bias gradient that may read the dropout's output */
    int64_t i = which & MGC_FUSE_NORM_BWD_DROP ? fuse_norm_bwd_drop(ch) : 0;
    int64_t g = which & MGC_FUSE_NORM_BWD_BIAS ? fuse_norm_bwd_bias(ch) : 0;
    int64_t b = which & MGC_FUSE_ADD_NORM ? fuse_fwd_runs(ch, pair_add_norm) : 0;
    int64_t c = which & MGC_FUSE_LINEAR_GELU ? fuse_fwd_runs(ch, pair_linear_gelu) : 0;
    int64_t d = which & MGC_FUSE_DGRAD_GELU ? fuse_dgrad_gelu(ch) : 0;
    int64_t e = which & MGC_FUSE_QKV_ATTENTION ? fuse_qkv_attention(ch) : 0;
    int64_t f = which & MGC_FUSE_QKV_ROPE ? fuse_qkv_rope(ch) : 0;
    /* after the attention reads qkv in place: its backward then writes the dqkv the bias sums */
    int64_t k = which & MGC_FUSE_ATTENTION_BWD_BIAS ? fuse_bias_into(ch, attention_bias_site) : 0;
    int64_t h = which & MGC_FUSE_EMBEDDING_NORM ? fuse_fwd_runs(ch, pair_embedding_norm) : 0;
    /* after the dgrad takes its gelu_bwd: the fused op then writes the dh the bias sums */
    int64_t l = which & MGC_FUSE_DGRAD_GELU_BIAS ? fuse_bias_into(ch, dgrad_gelu_bias_site) : 0;
    if (st) {
        st->norm_bwd_add += a, st->add_norm += b, st->linear_gelu += c, st->dgrad_gelu += d;
        st->qkv_attention += e, st->qkv_rope += f, st->norm_bwd_bias += g;
        st->embedding_norm += h, st->norm_bwd_drop += i, st->attention_bwd_bias += k;
        st->dgrad_gelu_bias += l;
    }
}
