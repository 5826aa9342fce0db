/* losschunk.c - see losschunk.h. */
#include "losschunk.h"

#include "autodiff.h" /* mgc_cb_number */

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int mgc_loss_chunks_fit(const mgc_config *c, int64_t k) {
    if (k == 1) return 1;
    int64_t cp = c->parallel.context > 0 ? c->parallel.context : 1;
    int64_t s_c = c->model.seq_length / cp, b = c->training.micro_batch_size;
    if (k < 1 || s_c < 1 || s_c % k) return 0;
    return (s_c / k) * b % MGC_LOSS_CHUNK_ROWS == 0;
}

int64_t mgc_loss_chunks(const mgc_config *c) {
    const char *e = getenv("MGC_LOSS_CHUNKS");
    if (e && !strcmp(e, "1")) return 1;
    if (c->training.loss_chunks > 0) return c->training.loss_chunks;
    int64_t cp = c->parallel.context > 0 ? c->parallel.context : 1;
    int64_t tp = c->parallel.tensor > 0 ? c->parallel.tensor : 1;
    int64_t s_c = c->model.seq_length / cp;
    /* the logits' bytes: fp32, or the compute dtype's (training.logits_dtype) */
    int half = c->training.logits_dtype == MGC_LOGITS_DT_COMPUTE &&
               c->training.precision != MGC_PREC_FP32;
    double es = half ? 2.0 : 4.0;
    double logits = es * (double)s_c * (double)c->training.micro_batch_size *
                    (double)(c->derived.padded_vocab_size / tp);
    int64_t most = 1;
    for (int64_t k = 1; k <= s_c; k++) {
        if (!mgc_loss_chunks_fit(c, k)) continue;
        if (logits / (double)k <= (double)MGC_LOSS_CHUNK_AUTO_BYTES) return k;
        most = k;
    }
    return most;
}

/* ---- the rewrite ---- */

static int is_coll(uint16_t kind) {
    return kind >= MGC_POP_ALL_REDUCE && kind < MGC_POP__END;
}

static int touches(const mgc_plan_op *o, int32_t t) {
    for (int i = 0; i < o->n_in; i++)
        if (o->in[i] == t) return 1;
    for (int i = 0; i < o->n_out; i++)
        if (o->out[i] == t) return 1;
    return 0;
}

static uint64_t numel(const mgc_plan_tensor *t) {
    uint64_t n = 1;
    for (int i = 0; i < t->rank; i++)
        n *= (uint64_t)t->dim[i];
    return n;
}

typedef struct lc {
    mgc_plan *p;
    mgc_plan_chunk *ch;
    int64_t k, s_c, rows; /* chunks, rows (dim 0) of the head's tensors, per chunk */
    int64_t nt0;          /* tensors at entry: the ones map and role describe */
    mgc_plan_tensor *t;   /* the growing tensor list */
    int64_t nt, cap;
    int32_t *map;  /* (n_tensors at entry) this chunk's copy of a head tensor; -1 none */
    uint8_t *role; /* (n_tensors at entry) R_* below */
} lc;

enum { R_OTHER = 0, R_INSIDE, R_VIEW };

static int32_t add_tensor(lc *x, const mgc_plan_tensor *proto, const char *name) {
    if (x->nt == x->cap) {
        int64_t cap = x->cap * 2 + 16;
        mgc_plan_tensor *t = realloc(x->t, (size_t)cap * sizeof *t);
        if (!t) return -1;
        x->t = t, x->cap = cap;
    }
    uint32_t nm = mgc_plan_str(x->p, name);
    if (nm == UINT32_MAX) return -1;
    x->t[x->nt] = *proto;
    x->t[x->nt].name = nm;
    return (int32_t)x->nt++;
}

/* Row tensors: [s_c, ...] of rank >= 2 (the loss sums are [2]). */
static int is_rows(const lc *x, const mgc_plan_tensor *t) {
    return t->rank >= 2 && t->dim[0] == x->s_c;
}

/* Chunk c's tensor for head tensor t. */
static int32_t remap(lc *x, int32_t t, int64_t c) {
    if (t >= x->nt0 || x->role[t] == R_OTHER) return t;
    if (x->map[t] >= 0) return x->map[t];
    mgc_plan_tensor u = x->t[t];
    char name[512];
    snprintf(name, sizeof name, "%s.c%" PRId64, mgc_plan_strat(x->p, u.name), c);
    uint64_t esz = mgc_dtype_size((mgc_dtype)u.dtype), row = esz * (numel(&u) / (uint64_t)u.dim[0]);
    if (is_rows(x, &u)) u.dim[0] = x->rows;
    u.bytes = numel(&u) * esz;
    u.ld = 0;
    if (x->role[t] == R_VIEW) {
        /* the bytes of rows [c rows, (c + 1) rows) of t; for a tensor the memory plan places,
         * the offset is held relative to t's (0 until then) and the memory plan adds t's */
        u.view = (uint32_t)t + 1;
        u.offset = (uint64_t)(c * x->rows) * row;
    } else {
        u.view = 0;
        u.buffer = -1;
        u.offset = 0;
        if (u.role == MGC_TR_LOSS) u.role = MGC_TR_ACTIVATION; /* a partial sum of the loss */
    }
    int32_t id = add_tensor(x, &u, name);
    if (id >= 0) x->map[t] = id;
    return id;
}

/* A copy of op o for chunk c: tensors remapped, a forward op flagged as run in the backward,
 * GEMM FLOPs and collective sizes per chunk. */
static int clone_op(lc *x, const mgc_plan_op *o, int64_t c, mgc_plan_op *out) {
    *out = *o;
    for (int i = 0; i < o->n_in; i++)
        if ((out->in[i] = remap(x, o->in[i], c)) < 0) return -1;
    for (int i = 0; i < o->n_out; i++)
        if ((out->out[i] = remap(x, o->out[i], c)) < 0) return -1;
    if (o->kind <= MGC_POP_LAST_FWD)
        out->flags = (uint16_t)((o->flags & ~MGC_POF_SAVED) | MGC_POF_RECOMPUTE);
    out->flops = o->flops / (uint64_t)x->k;
    if (o->kind == MGC_POP_LINEAR || o->kind == MGC_POP_LINEAR_DGRAD ||
        o->kind == MGC_POP_LINEAR_WGRAD) /* iattr[0]: the GEMM's rows */
        out->iattr[0] = o->iattr[0] / x->k;
    if (is_coll(o->kind)) {
        out->iattr[0] = (int64_t)numel(&x->t[out->in[0]]);
        out->iattr[1] = (int64_t)numel(&x->t[out->out[0]]);
    }
    return 0;
}

/* Pack the stash again over the tensors the programs still touch, in tensor order (as
 * autodiff packs it); the others get no memory. */
static void repack_stash(mgc_plan_chunk *ch, const uint8_t *used) {
    uint64_t off = 0;
    for (int64_t t = 0; t < ch->n_tensors; t++) {
        mgc_plan_tensor *x = &ch->tensors[t];
        if (x->buffer != MGC_PLAN_BUF_STASH || x->view) continue;
        if (!used[t]) {
            x->buffer = -1, x->offset = 0;
            continue;
        }
        off = (off + MGC_PLAN_ALIGN - 1) / MGC_PLAN_ALIGN * MGC_PLAN_ALIGN;
        x->offset = off;
        off += x->bytes;
    }
    ch->stash_bytes = off;
}

int mgc_loss_chunk(mgc_plan *p, mgc_plan_chunk *ch, int64_t k) {
    if (k <= 1 || !ch->loss) return 0;
    const int64_t nt0 = ch->n_tensors, nf = ch->n_fwd, nb = ch->n_bwd;
    /* the forward's head: the output layer's GEMM, the cross-entropy phases and their
     * collectives, the CP all-reduce of the loss last */
    int64_t ce0 = -1, root = -1, lin = -1, loss_ar = -1, ag = -1;
    for (int64_t i = 0; i < nf; i++)
        if (ch->fwd[i].kind == MGC_POP_CROSS_ENTROPY) {
            if (ce0 < 0) ce0 = i;
            if (ch->fwd[i].n_out == 2) root = i;
        }
    if (ce0 < 0 || root < 0) return -1;
    int32_t logits = ch->fwd[ce0].in[0], loss = ch->fwd[root].out[1];
    for (int64_t i = 0; i < ce0; i++)
        if (ch->fwd[i].kind == MGC_POP_LINEAR && ch->fwd[i].n_out == 1 &&
            ch->fwd[i].out[0] == logits)
            lin = i;
    if (lin < 0) return -1;
    for (int64_t i = lin + 1; i < nf; i++) {
        const mgc_plan_op *o = &ch->fwd[i];
        if (o->kind == MGC_POP_CROSS_ENTROPY || (is_coll(o->kind) && i < root)) continue;
        if (i == root + 1 && o->kind == MGC_POP_ALL_REDUCE && o->in[0] == loss && i == nf - 1) {
            loss_ar = i, loss = o->out[0];
            continue;
        }
        return -1; /* something else after the head */
    }
    /* a gather of the output layer's input that only it reads (sequence parallelism: the
     * backward gathers its own copy for the weight gradient) */
    int32_t hin = ch->fwd[lin].in[0];
    for (int64_t i = 0; i < lin; i++)
        if (ch->fwd[i].kind == MGC_POP_ALL_GATHER && ch->fwd[i].out[0] == hin) ag = i;
    for (int64_t i = 0; ag >= 0 && i < nf; i++)
        if (i != ag && i != lin && touches(&ch->fwd[i], hin)) ag = -1;
    /* the backward's head: ce_bwd, then the output layer's dgrad and wgrad */
    int64_t cb = -1, dg = -1, wg[2] = {-1, -1}, nwg = 0, last = -1;
    for (int64_t i = 0; i < nb; i++)
        if (ch->bwd[i].kind == MGC_POP_CROSS_ENTROPY_BWD) cb = cb < 0 ? i : -2;
    if (cb < 0) return -1;
    int32_t dl = ch->bwd[cb].out[0];
    for (int64_t i = 0; i < nb; i++) {
        const mgc_plan_op *o = &ch->bwd[i];
        if (o->n_in < 1 || o->in[0] != dl) continue;
        if (o->kind == MGC_POP_LINEAR_DGRAD && dg < 0)
            dg = i;
        else if (o->kind == MGC_POP_LINEAR_WGRAD && nwg < 2)
            wg[nwg++] = i;
        else
            return -1;
    }
    if (dg < 0 || nwg < 1 || ch->bwd[cb].n_in != 5 || ch->bwd[cb].in[4] != loss ||
        ch->fwd[root].n_in < 3)
        return -1;
    last = cb > dg ? cb : dg;
    for (int64_t j = 0; j < nwg; j++)
        if (wg[j] > last) last = wg[j];
    const int32_t dh = ch->bwd[dg].out[0], hbw = ch->bwd[wg[0]].in[1];
    if (hin == hbw) ag = -1; /* the backward reads the forward's gathered copy: keep it */
    const int64_t s_c = ch->tensors[logits].dim[0];
    if (s_c % k || ch->tensors[logits].rank < 2) return -1;

    lc x = {.p = p,
            .ch = ch,
            .k = k,
            .s_c = s_c,
            .rows = s_c / k,
            .nt0 = nt0,
            .nt = nt0,
            .cap = nt0 + 16 * k + 16};
    x.t = malloc((size_t)x.cap * sizeof *x.t);
    x.map = malloc((size_t)(nt0 ? nt0 : 1) * sizeof *x.map);
    x.role = calloc((size_t)(nt0 ? nt0 : 1), 1);
    mgc_plan_op *nfw = malloc((size_t)(nf ? nf : 1) * sizeof *nfw);
    mgc_plan_op *nbw = malloc((size_t)(nb + k * (nf - lin + nwg + 4) + 8) * sizeof *nbw);
    uint8_t *head_b = calloc((size_t)(nb ? nb : 1), 1);
    uint8_t *used = NULL;
    int rc = -1;
    if (!x.t || !x.map || !x.role || !nfw || !nbw || !head_b) goto out;
    memcpy(x.t, ch->tensors, (size_t)nt0 * sizeof *x.t);

    /* classify: what the head's ops write (bar parameter gradients and the backward's
     * output dh) is new per chunk; what they read from elsewhere (h, labels, mask) and dh are
     * row views; parameters and their gradients are shared */
    int64_t hi = loss_ar >= 0 ? loss_ar : nf;
    for (int64_t i = lin; i < hi; i++)
        for (int j = 0; j < ch->fwd[i].n_out; j++)
            x.role[ch->fwd[i].out[j]] = R_INSIDE;
    x.role[ch->bwd[cb].out[0]] = R_INSIDE;
    head_b[cb] = head_b[dg] = 1;
    for (int64_t j = 0; j < nwg; j++)
        head_b[wg[j]] = 1;
    for (int64_t pass = 0; pass < 2; pass++)
        for (int64_t i = pass ? 0 : lin; i < (pass ? nb : hi); i++) {
            const mgc_plan_op *o = pass ? &ch->bwd[i] : &ch->fwd[i];
            if (pass && !head_b[i]) continue;
            for (int j = 0; j < o->n_in + o->n_out; j++) {
                int32_t t = j < o->n_in ? o->in[j] : o->out[j - o->n_in];
                const mgc_plan_tensor *u = &ch->tensors[t];
                if (x.role[t] == R_INSIDE || u->role == MGC_TR_PARAM || u->role == MGC_TR_GRAD ||
                    (pass && i == cb && j == 4))
                    continue;
                if (!is_rows(&x, u) || u->ld || u->view) goto out; /* not a row tensor */
                x.role[t] = R_VIEW;
            }
        }
    if (x.role[dh] != R_VIEW) goto out;
    /* views of a tensor the memory plan places hold their offset relative to its, which is 0
     * until then (stashed tensors are placed already: their views are placed below) */
    for (int32_t t = 0; t < nt0; t++)
        if (x.role[t] == R_VIEW && ch->tensors[t].buffer != MGC_PLAN_BUF_STASH &&
            ch->tensors[t].offset != 0)
            goto out;
    /* no op outside the head reads what only the head's chunks will have (the loss is written
     * whole again, by the last sum) */
    for (int64_t i = 0; i < nb; i++)
        for (int j = 0; !head_b[i] && j < ch->bwd[i].n_in; j++)
            if (x.role[ch->bwd[i].in[j]] == R_INSIDE && ch->bwd[i].in[j] != loss) goto out;

    /* the forward without the head */
    int64_t n_f = 0;
    for (int64_t i = 0; i < lin; i++)
        if (i != ag) nfw[n_f++] = ch->fwd[i];

    /* the backward: the ops among the head that need none of its outputs, the mask count,
     * the chunks, the loss, then the rest */
    int64_t n_b = 0;
    for (int64_t i = 0; i <= last; i++) {
        if (head_b[i]) continue;
        int needs = 0;
        for (int j = 0; j < ch->bwd[i].n_in; j++)
            needs |= ch->bwd[i].in[j] == dh || x.role[ch->bwd[i].in[j]] == R_INSIDE;
        if (!needs) nbw[n_b++] = ch->bwd[i];
    }
    const mgc_plan_op *rt = &ch->fwd[root];
    mgc_plan_tensor two = ch->tensors[loss];
    two.buffer = -1, two.offset = 0, two.view = 0, two.role = MGC_TR_ACTIVATION;
    char nm[512];
    const char *base = mgc_plan_strat(p, rt->name);
    int32_t mask = rt->in[2];
    snprintf(nm, sizeof nm, "%s.count", base);
    int32_t count = add_tensor(&x, &two, nm);
    if (count < 0) goto out;
    mgc_plan_op co = *rt;
    co.flags = MGC_POF_RECOMPUTE;
    co.name = mgc_plan_str(p, nm);
    co.n_in = 1, co.n_out = 1, co.in[0] = mask, co.out[0] = count;
    co.iattr[0] = 4; /* phase 4: (0, sum of the mask) */
    co.flops = 0;
    nbw[n_b++] = co;
    if (loss_ar >= 0) { /* the count over the whole sequence */
        snprintf(nm, sizeof nm, "%s.count.all_reduce", base);
        int32_t all = add_tensor(&x, &two, nm);
        if (all < 0) goto out;
        mgc_plan_op a = ch->fwd[loss_ar];
        a.flags = MGC_POF_RECOMPUTE;
        a.name = mgc_plan_str(p, nm);
        a.in[0] = count, a.out[0] = all;
        nbw[n_b++] = a;
        count = all;
    }
    /* at tensor parallel 1 the cross-entropy is one op (phase 3) right after the GEMM: its
     * backward takes it in (MGC_POF_CE_STATS), one pass over each chunk's logits.
     * MGC_CE_FUSE=0 in the environment keeps the two (tests compare them, bit for bit). */
    const char *fz = getenv("MGC_CE_FUSE");
    const int fuse = hi == lin + 2 && root == lin + 1 && rt->iattr[0] == 3 && rt->n_in == 3 &&
                     rt->n_out == 2 && !(fz && !strcmp(fz, "0"));
    int32_t acc = -1;
    for (int64_t c = 0; c < k; c++) {
        for (int32_t t = 0; t < nt0; t++)
            x.map[t] = -1;
        mgc_plan_op st; /* the statistics, fused into the backward */
        for (int64_t i = lin; i < hi; i++) {
            mgc_plan_op o = ch->fwd[i];
            if (i == lin) o.in[0] = hbw; /* the backward's copy (re-gathered with SP) */
            if (clone_op(&x, &o, c, fuse && i == root ? &st : &nbw[n_b++])) goto out;
        }
        if (fuse) {
            mgc_plan_op o = ch->bwd[cb], f;
            o.in[4] = count;
            if (clone_op(&x, &o, c, &f)) goto out;
            f.flags |= MGC_POF_CE_STATS;
            f.n_in = 4, f.n_out = 3;
            f.in[0] = st.in[0], f.in[1] = st.in[1], f.in[2] = st.in[2], f.in[3] = count;
            f.out[1] = st.out[0], f.out[2] = st.out[1]; /* lse, the chunk's loss */
            f.flops += st.flops;
            nbw[n_b++] = f;
        }
        int32_t part = x.map[rt->out[1]];
        if (c == 0) {
            acc = part;
        } else { /* the loss sum, chunk by chunk */
            int32_t sum = c == k - 1 && loss_ar < 0 ? loss : -1;
            if (sum < 0) {
                snprintf(nm, sizeof nm, "%s.loss_sum.c%" PRId64, base, c);
                if ((sum = add_tensor(&x, &two, nm)) < 0) goto out;
            }
            mgc_plan_op a = *rt;
            a.kind = MGC_POP_ADD;
            a.flags = MGC_POF_RECOMPUTE;
            snprintf(nm, sizeof nm, "%s.loss_sum", base);
            a.name = mgc_plan_str(p, nm);
            a.n_in = 2, a.n_out = 1, a.in[0] = acc, a.in[1] = part, a.out[0] = sum;
            memset(a.iattr, 0, sizeof a.iattr);
            memset(a.fattr, 0, sizeof a.fattr);
            a.flops = 0;
            nbw[n_b++] = a;
            acc = sum;
        }
        mgc_plan_op o = ch->bwd[cb];
        o.in[4] = count; /* the scale: the whole microbatch's mask count */
        if (!fuse && clone_op(&x, &o, c, &nbw[n_b++])) goto out;
        if (clone_op(&x, &ch->bwd[dg], c, &nbw[n_b++])) goto out;
        for (int64_t j = 0; j < nwg; j++)
            if (clone_op(&x, &ch->bwd[wg[j]], c, &nbw[n_b++])) goto out;
    }
    if (loss_ar >= 0) {
        mgc_plan_op a = ch->fwd[loss_ar];
        a.flags = MGC_POF_RECOMPUTE;
        a.in[0] = acc;
        nbw[n_b++] = a;
    }
    for (int64_t i = 0; i <= last; i++) {
        if (head_b[i]) continue;
        int needs = 0;
        for (int j = 0; j < ch->bwd[i].n_in; j++)
            needs |= ch->bwd[i].in[j] == dh || x.role[ch->bwd[i].in[j]] == R_INSIDE;
        if (needs) nbw[n_b++] = ch->bwd[i];
    }
    for (int64_t i = last + 1; i < nb; i++)
        nbw[n_b++] = ch->bwd[i];
    /* the loss is now a backward tensor, written last: it lives to the pass's end */
    x.t[loss].buffer = -1, x.t[loss].offset = 0;
    mgc_cb_number(nbw, n_b);

    /* commit */
    free(ch->tensors);
    ch->tensors = x.t, ch->n_tensors = x.nt, x.t = NULL;
    free(ch->fwd);
    free(ch->bwd);
    ch->fwd = nfw, ch->n_fwd = n_f, nfw = NULL;
    ch->bwd = nbw, ch->n_bwd = n_b, nbw = NULL;
    used = calloc((size_t)ch->n_tensors, 1);
    if (!used) goto out; /* the stash keeps its holes: still a valid plan */
    for (int pass = 0; pass < 2; pass++)
        for (int64_t i = 0; i < (pass ? ch->n_bwd : ch->n_fwd); i++) {
            const mgc_plan_op *o = pass ? &ch->bwd[i] : &ch->fwd[i];
            for (int j = 0; j < o->n_in; j++)
                used[o->in[j]] = 1;
            for (int j = 0; j < o->n_out; j++)
                used[o->out[j]] = 1;
        }
    for (int64_t t = nt0; t < ch->n_tensors; t++) /* views count for their whole tensor */
        if (ch->tensors[t].view && used[t]) used[ch->tensors[t].view - 1] = 1;
    repack_stash(ch, used);
    for (int64_t t = nt0; t < ch->n_tensors; t++) {
        mgc_plan_tensor *v = &ch->tensors[t];
        if (!v->view) continue;
        const mgc_plan_tensor *w = &ch->tensors[v->view - 1];
        v->buffer = w->buffer; /* -1 until the memory plan places w */
        if (w->buffer == MGC_PLAN_BUF_STASH) v->offset += w->offset;
    }
    rc = 0;
out:
    free(x.t);
    free(x.map);
    free(x.role);
    free(nfw);
    free(nbw);
    free(head_b);
    free(used);
    return rc;
}
