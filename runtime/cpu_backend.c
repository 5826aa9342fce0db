/* cpu_backend.c - the CPU reference backend: every compute op of a chunk
 * program on the fp32 kernels of cpu_ops.h (GEMMs through OpenBLAS).
 *
 * The arena is one aligned host allocation.  Index arrays the kernels take
 * as int32 (tokens, labels, expert counts, position ids, the MoE dispatch
 * map) are converted into a private scratch area that grows to the largest
 * op's need at the first step and is then reused; its size is reported by
 * mgc-run next to the arena (docs/cpu-backend.md). */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cblas.h>

#include "backend.h"
#include "comm.h"
#include "cpu_ops.h"

typedef struct cpu_ctx {
    unsigned char *scratch;
    size_t scratch_bytes;
} cpu_ctx;

static int fail(mgc_backend *be, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(be->err, sizeof be->err, fmt, ap);
    va_end(ap);
    return -1;
}

/* Scratch of at least `bytes`, 64-byte aligned pieces carved by the caller. */
static void *scratch(mgc_backend *be, size_t bytes) {
    cpu_ctx *c = be->context;
    if (bytes > c->scratch_bytes) {
        size_t n = bytes + bytes / 2 + 4096;
        void *p = NULL;
        if (posix_memalign(&p, 64, n)) return NULL;
        free(c->scratch);
        c->scratch = p;
        c->scratch_bytes = n;
    }
    return c->scratch;
}

static uint64_t numel(const mgc_plan_tensor *t) {
    uint64_t n = 1;
    for (int i = 0; i < t->rank; i++)
        n *= (uint64_t)t->dim[i];
    return n;
}

static const mgc_plan_tensor *tin(const mgc_op_call *c, int i) {
    return &c->chunk->tensors[c->op->in[i]];
}
static const mgc_plan_tensor *tout(const mgc_op_call *c, int i) {
    return &c->chunk->tensors[c->op->out[i]];
}

/* int64 -> int32 (token ids, labels, counts: all far below 2^31). */
static void to_i32(int32_t *dst, const void *src, mgc_dtype dt, int64_t n) {
    if (dt == MGC_DT_I32) {
        memcpy(dst, src, (size_t)n * sizeof *dst);
        return;
    }
    const int64_t *s = src;
    for (int64_t i = 0; i < n; i++)
        dst[i] = (int32_t)s[i];
}

static void from_i32(void *dst, mgc_dtype dt, const int32_t *src, int64_t n) {
    if (dt == MGC_DT_I32) {
        memcpy(dst, src, (size_t)n * sizeof *src);
        return;
    }
    int64_t *d = dst;
    for (int64_t i = 0; i < n; i++)
        d[i] = src[i];
}

/* Positions of the rows a context rank holds: chunks r and 2cp-1-r of the
 * 2cp equal chunks of the sequence (docs/partitioning.md), rows in order. */
static void ctx_positions(int32_t *pos, int64_t rows, int64_t s, int64_t cp, int64_t r) {
    if (cp <= 1) {
        for (int64_t i = 0; i < rows; i++)
            pos[i] = (int32_t)i;
        return;
    }
    int64_t half = s / (2 * cp);
    for (int64_t i = 0; i < rows; i++)
        pos[i] = (int32_t)(i < half ? r * half + i : (2 * cp - 1 - r) * half + (i - half));
}

/* Positions of k/v rows all-gathered over CP: rank q's rows for q = 0..cp-1. */
static void gathered_positions(int32_t *pos, int64_t rows, int64_t s, int64_t cp) {
    int64_t per = rows / cp;
    for (int64_t q = 0; q < cp; q++)
        ctx_positions(pos + q * per, per, s, cp, q);
}

/* ---- the ops ---------------------------------------------------------------------- */

#define F(p) ((float *)(p))
#define CF(p) ((const float *)(p))

static int op_embedding(mgc_backend *be, const mgc_op_call *c) {
    const mgc_plan_op *op = c->op;
    /* the activation: the forward's output (s,b,h), the backward's input gradient */
    const mgc_plan_tensor *tok = tin(c, 0),
                          *y = op->kind == MGC_POP_EMBEDDING ? tout(c, 0) : tin(c, 1);
    int64_t s = tok->dim[0], b = tok->dim[1], h = y->dim[y->rank - 1], V_l = op->iattr[0];
    int32_t *t32 = scratch(be, (size_t)(s * b + s) * 4);
    if (!t32) return fail(be, "out of memory");
    int32_t *pos = t32 + s * b;
    to_i32(t32, c->in[0], (mgc_dtype)tok->dtype, s * b);
    ctx_positions(pos, s, c->seq_length, op->iattr[3] > 0 ? op->iattr[3] : 1, c->co.cp);
    int with_pos = op->iattr[1] && (!op->iattr[2] || c->co.tp == 0);
    int64_t v0 = c->co.tp * V_l;
    /* data.reset_position_ids: positions from each row's document start, the last input */
    const int32_t *docs = op->flags & MGC_POF_DOCS ? (const int32_t *)c->in[op->n_in - 1] : NULL;
    if (op->kind == MGC_POP_EMBEDDING) {
        mgc_cpu_embedding_fwd_f32(F(c->out[0]), t32, CF(c->in[1]), v0, V_l,
                                  with_pos ? CF(c->in[2]) : NULL, with_pos ? pos : NULL, docs, s, b,
                                  h);
    } else { /* in: tokens, dy (, doc_start); out: dword (+ dpos) */
        float *dpos = op->n_out > 1 ? F(c->out[1]) : NULL;
        /* positions' gradient: complete on every tensor rank (dy is complete) */
        mgc_cpu_embedding_bwd_f32(F(c->out[0]), dpos, CF(c->in[1]), t32, v0, V_l,
                                  dpos ? pos : NULL, docs, s, b, h);
    }
    return 0;
}

static int op_norm(mgc_backend *be, const mgc_op_call *c) {
    const mgc_plan_op *op = c->op;
    int64_t rows = op->iattr[1], h = op->iattr[2];
    double eps = op->fattr[0];
    int rms = op->iattr[0] == 1;
    (void)be;
    if (op->kind == MGC_POP_NORM) {
        if (rms)
            mgc_cpu_rmsnorm_fwd_f32(F(c->out[0]), NULL, CF(c->in[0]), CF(c->in[1]), rows, h, eps);
        else
            mgc_cpu_layernorm_fwd_f32(F(c->out[0]), NULL, NULL, CF(c->in[0]), CF(c->in[1]),
                                      op->n_in > 2 ? CF(c->in[2]) : NULL, rows, h, eps);
        return 0;
    }
    /* in: x, w, dy (, g: the residual gradient, fused) (, the dropout's mask); out: dx, dw (, db)
     * (, a linear's bias gradient: MGC_POF_COLSUM) (, the dropout's branch gradient:
     * MGC_POF_DROPBWD) -- the ops the fusions replaced, in their order (compiler/fusion.c) */
    mgc_norm_bwd_io io;
    if (mgc_plan_norm_bwd_io(op, &io))
        return fail(be, "norm_bwd '%s': %u inputs and %u outputs do not fit its flags",
                    mgc_plan_strat(c->plan, op->name), op->n_in, op->n_out);
    if (rms)
        mgc_cpu_rmsnorm_bwd_f32(F(c->out[0]), F(c->out[1]), CF(c->in[2]), CF(c->in[0]),
                                CF(c->in[1]), rows, h, eps);
    else
        mgc_cpu_layernorm_bwd_f32(F(c->out[0]), F(c->out[1]), io.db >= 0 ? F(c->out[io.db]) : NULL,
                                  CF(c->in[2]), CF(c->in[0]), CF(c->in[1]), rows, h, eps);
    if (io.res >= 0) {
        /* the fused residual add (compiler/fusion.c): dx = g + d norm, the add it replaces */
        float *dx = F(c->out[0]);
        const float *g = CF(c->in[io.res]);
        for (int64_t i = 0; i < rows * h; i++) dx[i] = g[i] + dx[i];
    }
    /* the fused dropout backward: dropout_add_bwd's own pass over dx, from the mask */
    const float *gl = CF(c->out[0]); /* what the linear reads: dx or dbr */
    if (io.dbr >= 0) {
        mgc_dropout_rng r; /* unused: the mask is given */
        memset(&r, 0, sizeof r);
        mgc_cpu_dropout_bwd_f32(F(c->out[io.dbr]), gl, (const uint8_t *)c->in[io.mask], rows * h,
                                op->fattr[1], &r);
        gl = CF(c->out[io.dbr]);
    }
    /* the fused bias gradient: linear_wgrad's own sum over dx (no weight gradient: K = 0) */
    if (io.cs >= 0) mgc_cpu_linear_wgrad_f32(NULL, F(c->out[io.cs]), gl, NULL, rows, h, 0);
    return 0;
}

#define LIN_ROW        8
#define LIN_BIAS_RANK0 16

static int op_linear(mgc_backend *be, const mgc_op_call *c) {
    const mgc_plan_op *op = c->op;
    int64_t M = op->iattr[0], N = op->iattr[1], K = op->iattr[2];
    /* a row pitch comes only with a gradient narrower than the logits, never in the fp32
     * plans this backend runs (plan.h ld) */
    if (tin(c, 0)->ld)
        return fail(be, "%s '%s': the CPU backend takes no row pitch (an fp32 plan has none)",
                    mgc_plan_op_name((mgc_plan_op_kind)op->kind), mgc_plan_strat(c->plan, op->name));
    switch (op->kind) {
    case MGC_POP_LINEAR: {
        const float *bias = op->n_in > 2 ? CF(c->in[2]) : NULL;
        if ((op->iattr[3] & LIN_BIAS_RANK0) && c->co.tp != 0) bias = NULL;
        mgc_cpu_linear_fwd_f32(F(c->out[0]), CF(c->in[0]), CF(c->in[1]), bias, M, N, K);
        return 0;
    }
    case MGC_POP_LINEAR_DGRAD:
        mgc_cpu_linear_dgrad_f32(F(c->out[0]), CF(c->in[0]), CF(c->in[1]), M, N, K);
        return 0;
    default: /* WGRAD: in dy, x; out dW (+ db) */
        mgc_cpu_linear_wgrad_f32(F(c->out[0]), op->n_out > 1 ? F(c->out[1]) : NULL, CF(c->in[0]),
                                 CF(c->in[1]), M, N, K);
        return 0;
    }
}

/* With MGC_POF_ROPE (compiler/fusion.c), the split and the two ropes it replaced, in their
 * order: the split, then q and k rotated in place; the join from dq, dk rotated back into
 * scratch (the inputs stay as they are). */
static int op_qkv(mgc_backend *be, const mgc_op_call *c) {
    const mgc_plan_op *op = c->op;
    int64_t G = op->iattr[0], per = op->iattr[1], d = op->iattr[2];
    int rope = (op->flags & MGC_POF_ROPE) != 0;
    const mgc_plan_tensor *x = op->kind == MGC_POP_QKV_SPLIT ? tin(c, 0) : tout(c, 0);
    int64_t n = (int64_t)(numel(x) / (uint64_t)(G * (per + 2) * d));
    /* q, k: (s, b, heads, d) with rows = s b */
    const mgc_plan_tensor *tq = op->kind == MGC_POP_QKV_SPLIT ? tout(c, 0) : tin(c, 0);
    int64_t s = tq->dim[0], b = tq->rank == 4 ? tq->dim[1] : 1;
    int64_t rot = op->iattr[3], cp = op->fattr[1] >= 1 ? (int64_t)op->fattr[1] : 1;
    double theta = op->fattr[0];
    int32_t *pos = NULL;
    float *dq = NULL, *dk = NULL;
    /* data.reset_position_ids: the rows' document starts, the last input */
    const int32_t *docs = op->flags & MGC_POF_DOCS ? (const int32_t *)c->in[op->n_in - 1] : NULL;
    if (rope) {
        if (tq->rank != 4 || s * b != n)
            return fail(be, "qkv_split '%s': q is not (s, b, heads, d)",
                        mgc_plan_strat(c->plan, op->name));
        size_t qn = (size_t)(n * G * per * d), kn = (size_t)(n * G * d);
        size_t ps = ((size_t)s * 4 + 63) / 64 * 64, qs = (qn * 4 + 63) / 64 * 64;
        unsigned char *w = scratch(be, ps + (op->kind == MGC_POP_QKV_SPLIT ? 0 : qs + kn * 4));
        if (!w) return fail(be, "out of memory");
        pos = (int32_t *)w;
        dq = (float *)(w + ps), dk = (float *)(w + ps + qs);
        ctx_positions(pos, s, c->seq_length, cp, c->co.cp);
    }
    if (op->kind == MGC_POP_QKV_SPLIT) {
        mgc_cpu_qkv_split_fwd_f32(F(c->out[0]), F(c->out[1]), F(c->out[2]), CF(c->in[0]), n, G,
                                  per, d);
        if (rope) {
            mgc_cpu_rope_fwd_f32(F(c->out[0]), CF(c->out[0]), pos, docs, s, b, G * per, d, rot,
                                 theta);
            mgc_cpu_rope_fwd_f32(F(c->out[1]), CF(c->out[1]), pos, docs, s, b, G, d, rot, theta);
        }
    } else {
        const float *q = CF(c->in[0]), *k = CF(c->in[1]);
        if (rope) {
            mgc_cpu_rope_bwd_f32(dq, q, pos, docs, s, b, G * per, d, rot, theta);
            mgc_cpu_rope_bwd_f32(dk, k, pos, docs, s, b, G, d, rot, theta);
            q = dq, k = dk;
        }
        mgc_cpu_qkv_split_bwd_f32(F(c->out[0]), q, k, CF(c->in[2]), n, G, per, d);
    }
    return 0;
}

static int op_rope(mgc_backend *be, const mgc_op_call *c) {
    const mgc_plan_op *op = c->op;
    const mgc_plan_tensor *x = tin(c, 0);
    int64_t s = x->dim[0], b = x->dim[1], H = x->dim[2], d = x->dim[3];
    int32_t *pos = scratch(be, (size_t)s * 4);
    if (!pos) return fail(be, "out of memory");
    ctx_positions(pos, s, c->seq_length, op->iattr[1] > 0 ? op->iattr[1] : 1, c->co.cp);
    const int32_t *docs = op->flags & MGC_POF_DOCS ? (const int32_t *)c->in[op->n_in - 1] : NULL;
    if (op->kind == MGC_POP_ROPE)
        mgc_cpu_rope_fwd_f32(F(c->out[0]), CF(c->in[0]), pos, docs, s, b, H, d, op->iattr[0],
                             op->fattr[0]);
    else
        mgc_cpu_rope_bwd_f32(F(c->out[0]), CF(c->in[0]), pos, docs, s, b, H, d, op->iattr[0],
                             op->fattr[0]);
    return 0;
}

static int op_attention(mgc_backend *be, const mgc_op_call *c) {
    const mgc_plan_op *op = c->op;
    mgc_attn_geom ag;
    if (mgc_plan_attn_geom(c->chunk, op, &ag))
        return fail(be, "attention '%s': malformed inputs", mgc_plan_strat(c->plan, op->name));
    int64_t sq = ag.sq, b = ag.b, A = ag.A, d = ag.d, sk = ag.sk, G = ag.G;
    int64_t cp = op->iattr[3] > 0 ? op->iattr[3] : 1;
    int bwd = op->kind == MGC_POP_ATTENTION_BWD;
    /* fused (MGC_POF_QKV): q, k, v gathered from the projection (and, backward, their
     * gradients scattered back into it) around the same computation */
    size_t nq = (size_t)(sq * b * A * d), nk = (size_t)(sk * b * G * d);
    size_t fused = ag.fused ? (nq + 2 * nk) * (bwd ? 2 : 1) : 0;
    size_t need = (size_t)(sq + sk) * 4 + (size_t)mgc_cpu_attention_work_f32(sq, sk, d) * 4 +
                  (size_t)(sq * b * A) * 4 + fused * 4 + 256;
    unsigned char *w = scratch(be, need);
    if (!w) return fail(be, "out of memory");
    int32_t *qpos = (int32_t *)w, *kpos = qpos + sq;
    float *work = (float *)(kpos + sk);
    float *lse_tmp = work + mgc_cpu_attention_work_f32(sq, sk, d);
    float *qs = lse_tmp + sq * b * A, *ks = qs + nq, *vs = ks + nk;
    float *dqs = vs + nk, *dks = dqs + nq, *dvs = dks + nk;
    ctx_positions(qpos, sq, c->seq_length, cp, c->co.cp);
    gathered_positions(kpos, sk, c->seq_length, sk == sq ? 1 : cp);
    if (sk == sq && cp > 1) ctx_positions(kpos, sk, c->seq_length, cp, c->co.cp);
    if (cp <= 1) qpos = kpos = NULL; /* rows are positions: the kernels' fast path */
    mgc_dropout_rng rng = mgc_op_attn_drop_rng(c, A);
    /* data.reset_attention_mask: the queries' document starts, the last input */
    const int32_t *docs = op->flags & MGC_POF_DOCS ? (const int32_t *)c->in[op->n_in - 1] : NULL;
    const float *q = CF(c->in[0]), *k = ag.fused ? ks : CF(c->in[1]), *v = ag.fused ? vs : CF(c->in[2]);
    if (ag.fused) {
        mgc_cpu_qkv_split_fwd_f32(qs, ks, vs, CF(c->in[0]), sq * b, G, A / G, d);
        q = qs;
    }
    if (!bwd) {
        float *lse = op->n_out > 1 ? F(c->out[1]) : lse_tmp;
        mgc_cpu_attention_fwd_f32(F(c->out[0]), lse, q, k, v, sq, sk, b, A, G, d, op->fattr[0],
                                  (int)op->iattr[0], qpos, kpos, docs, (int64_t)op->fattr[2], op->fattr[1],
                                  &rng, work);
    } else { /* in: q, k, v (or qkv), out, lse, dout; out: dq, dk, dv (or dqkv) */
        int o = ag.in_out;
        float *dq = ag.fused ? dqs : F(c->out[0]), *dk = ag.fused ? dks : F(c->out[1]),
              *dv = ag.fused ? dvs : F(c->out[2]);
        mgc_cpu_attention_bwd_f32(dq, dk, dv, CF(c->in[o + 2]), q, k, v, CF(c->in[o]),
                                  CF(c->in[o + 1]), sq, sk, b, A, G, d, op->fattr[0],
                                  (int)op->iattr[0], qpos, kpos, docs, (int64_t)op->fattr[2], op->fattr[1],
                                  &rng, work);
        if (ag.fused) mgc_cpu_qkv_split_bwd_f32(F(c->out[0]), dqs, dks, dvs, sq * b, G, A / G, d);
        /* the fused bias gradient of the QKV projection (MGC_POF_COLSUM): linear_wgrad's own
         * sum over dqkv (no weight gradient: K = 0) */
        if (ag.fused && (op->flags & MGC_POF_COLSUM) && op->n_out > 1)
            mgc_cpu_linear_wgrad_f32(NULL, F(c->out[1]), CF(c->out[0]), NULL, sq * b,
                                     (A + 2 * G) * d, 0);
    }
    return 0;
}

/* The rows an activation runs over: its tensors' rows, or with MGC_POF_ROWS the routed ones,
 * counted by its last input (-1 with a message when the counts do not fit the buffer). */
static int64_t live_rows(mgc_backend *be, const mgc_op_call *c, int64_t rows) {
    const mgc_plan_op *op = c->op;
    if (!(op->flags & MGC_POF_ROWS)) return rows;
    const int64_t *cnt = (const int64_t *)c->in[op->n_in - 1];
    int64_t n = (int64_t)numel(tin(c, op->n_in - 1)), sum = 0;
    for (int64_t e = 0; e < n; e++) {
        if (cnt[e] < 0 || cnt[e] > rows - sum) {
            fail(be, "%s '%s': %" PRId64 " rows routed to local expert %" PRId64 " overflow the %" PRId64
                     "-row buffer",
                 mgc_plan_op_name((mgc_plan_op_kind)op->kind), mgc_plan_strat(c->plan, op->name), cnt[e], e,
                 rows);
            return -1;
        }
        sum += cnt[e];
    }
    return sum;
}

static int op_pointwise(mgc_backend *be, const mgc_op_call *c) {
    const mgc_plan_op *op = c->op;
    switch (op->kind) {
    case MGC_POP_DROPOUT: {
        int64_t n = (int64_t)numel(tin(c, 0));
        mgc_dropout_rng r = mgc_op_drop_rng(c, tin(c, 0));
        mgc_cpu_dropout_fwd_f32(F(c->out[0]), op->n_out > 1 ? (uint8_t *)c->out[1] : NULL,
                                CF(c->in[0]), n, op->fattr[0], &r);
        return 0;
    }
    case MGC_POP_DROPOUT_BWD: {
        int64_t n = (int64_t)numel(tout(c, 0));
        mgc_dropout_rng r = mgc_op_drop_rng(c, tout(c, 0));
        mgc_cpu_dropout_bwd_f32(F(c->out[0]), CF(c->in[0]),
                                op->n_in > 1 ? (const uint8_t *)c->in[1] : NULL, n, op->fattr[0],
                                &r); /* no mask: drawn again */
        return 0;
    }
    case MGC_POP_DROPOUT_ADD: {
        int64_t n = (int64_t)numel(tout(c, 0));
        mgc_dropout_rng r = mgc_op_drop_rng(c, tout(c, 0));
        mgc_cpu_dropout_add_fwd_f32(F(c->out[0]), op->n_out > 1 ? (uint8_t *)c->out[1] : NULL,
                                    CF(c->in[0]), CF(c->in[1]), n, op->fattr[0], &r);
        return 0;
    }
    case MGC_POP_DROPOUT_ADD_BWD: {
        int64_t n = (int64_t)numel(tout(c, 0));
        mgc_dropout_rng r = mgc_op_drop_rng(c, tout(c, 0));
        mgc_cpu_dropout_bwd_f32(F(c->out[0]), CF(c->in[0]),
                                op->n_in > 1 ? (const uint8_t *)c->in[1] : NULL, n, op->fattr[0],
                                &r); /* no mask: drawn again */
        return 0;
    }
    case MGC_POP_GELU:
    case MGC_POP_GELU_BWD: { /* in: x (, dy) */
        const mgc_plan_tensor *y = tout(c, 0);
        int64_t w = y->rank ? y->dim[y->rank - 1] : 1, rows = live_rows(be, c, (int64_t)numel(y) / w);
        if (rows < 0) return -1;
        if (op->kind == MGC_POP_GELU)
            mgc_cpu_gelu_fwd_f32(F(c->out[0]), CF(c->in[0]), rows * w);
        else
            mgc_cpu_gelu_bwd_f32(F(c->out[0]), CF(c->in[1]), CF(c->in[0]), rows * w);
        return 0;
    }
    case MGC_POP_SWIGLU: {
        const mgc_plan_tensor *y = tout(c, 0);
        int64_t f = y->dim[y->rank - 1], rows = live_rows(be, c, (int64_t)numel(y) / f);
        if (rows < 0) return -1;
        mgc_cpu_swiglu_fwd_f32(F(c->out[0]), CF(c->in[0]), rows, f);
        return 0;
    }
    case MGC_POP_SWIGLU_BWD: { /* in: x (n,2f), dy (n,f) */
        const mgc_plan_tensor *dy = tin(c, 1);
        int64_t f = dy->dim[dy->rank - 1], rows = live_rows(be, c, (int64_t)numel(dy) / f);
        if (rows < 0) return -1;
        mgc_cpu_swiglu_bwd_f32(F(c->out[0]), CF(c->in[1]), CF(c->in[0]), rows, f);
        return 0;
    }
    case MGC_POP_ADD:
    case MGC_POP_ADD_BWD: /* the transpose of a fan-out: sum of two contributions */
        mgc_cpu_add_fwd_f32(F(c->out[0]), CF(c->in[0]), CF(c->in[1]), (int64_t)numel(tout(c, 0)));
        return 0;
    default:
        return fail(be, "not a pointwise op");
    }
}

/* Logit columns of this tensor rank that are real vocabulary entries. */
static int64_t valid_columns(const mgc_op_call *c, int64_t V_l) {
    int64_t v0 = c->co.tp * V_l, valid = c->vocab_size - v0;
    return valid < 0 ? 0 : valid > V_l ? V_l : valid;
}

static int op_cross_entropy(mgc_backend *be, const mgc_op_call *c) {
    const mgc_plan_op *op = c->op;
    int64_t V_l = op->iattr[1], v0 = c->co.tp * V_l, Vv = valid_columns(c, V_l);
    if (op->kind == MGC_POP_CROSS_ENTROPY_BWD && (op->flags & MGC_POF_CE_STATS)) {
        /* the statistics fused in (tensor parallel 1): in: logits, labels, mask, count; out:
         * dlogits, lse, loss[2] -- phase 3's forward, then the backward, as the two ops */
        const mgc_plan_tensor *lab = tin(c, 1);
        int64_t n = (int64_t)numel(lab);
        if (tout(c, 0)->ld)
            return fail(be, "cross_entropy_bwd '%s': the CPU backend takes no row pitch",
                        mgc_plan_strat(c->plan, op->name));
        unsigned char *w = scratch(be, (size_t)n * 16);
        if (!w) return fail(be, "out of memory");
        int32_t *l32 = (int32_t *)w;
        to_i32(l32, c->in[1], (mgc_dtype)lab->dtype, n);
        mgc_cpu_ce_fwd_f32(F(c->out[1]), F(c->out[2]), NULL, CF(c->in[0]), l32, CF(c->in[2]), n,
                           Vv, V_l, (float *)(w + n * 4));
        double count = CF(c->in[3])[1];
        double dloss = count > 0 ? c->dloss / count : 0.0;
        mgc_cpu_ce_bwd_f32(F(c->out[0]), CF(c->in[0]), CF(c->out[1]), l32, CF(c->in[2]), dloss, v0,
                           n, Vv, V_l);
        return 0;
    }
    if (op->kind == MGC_POP_CROSS_ENTROPY_BWD) {
        /* in: logits, lse, labels, mask, loss; out: dlogits */
        const mgc_plan_tensor *lab = tin(c, 2);
        int64_t n = (int64_t)numel(lab);
        int32_t *l32 = scratch(be, (size_t)n * 4);
        if (!l32) return fail(be, "out of memory");
        to_i32(l32, c->in[2], (mgc_dtype)lab->dtype, n);
        double count = CF(c->in[4])[1];
        double dloss = count > 0 ? c->dloss / count : 0.0;
        if (tout(c, 0)->ld)
            return fail(be, "cross_entropy_bwd '%s': the CPU backend takes no row pitch",
                        mgc_plan_strat(c->plan, op->name));
        /* in place (MGC_POF_INPLACE): out[0] == in[0]; mgc_cpu_ce_bwd reads each element
         * before it writes it */
        mgc_cpu_ce_bwd_f32(F(c->out[0]), CF(c->in[0]), CF(c->in[1]), l32, CF(c->in[3]), dloss, v0,
                           n, Vv, V_l);
        return 0;
    }
    switch (op->iattr[0]) {
    case 0: { /* in: logits; out: row max */
        int64_t n = (int64_t)numel(tout(c, 0));
        mgc_cpu_ce_max_f32(F(c->out[0]), CF(c->in[0]), n, Vv, V_l);
        return 0;
    }
    case 1: { /* in: logits, max, labels; out: (n, 2) = (sum exp, target logit) */
        const mgc_plan_tensor *lab = tin(c, 2);
        int64_t n = (int64_t)numel(lab);
        unsigned char *w = scratch(be, (size_t)n * 12);
        if (!w) return fail(be, "out of memory");
        int32_t *l32 = (int32_t *)w;
        float *se = (float *)(w + n * 4), *tg = se + n;
        to_i32(l32, c->in[2], (mgc_dtype)lab->dtype, n);
        mgc_cpu_ce_sums_f32(se, tg, CF(c->in[0]), CF(c->in[1]), l32, v0, n, Vv, V_l);
        float *o = F(c->out[0]);
        for (int64_t i = 0; i < n; i++)
            o[2 * i] = se[i], o[2 * i + 1] = tg[i];
        return 0;
    }
    case 2: { /* in: max, sums (n,2), mask; out: lse, loss[2] */
        int64_t n = (int64_t)numel(tin(c, 0));
        float *w = scratch(be, (size_t)n * 8);
        if (!w) return fail(be, "out of memory");
        const float *sm = CF(c->in[1]);
        for (int64_t i = 0; i < n; i++)
            w[i] = sm[2 * i], w[n + i] = sm[2 * i + 1];
        mgc_cpu_ce_finish_f32(F(c->out[0]), F(c->out[1]), NULL, CF(c->in[0]), w, w + n,
                              CF(c->in[2]), n);
        return 0;
    }
    case 4: { /* in: mask; out: (0, sum of the mask), the count the loss chunks' backward
               * scales by (compiler/losschunk.h), summed as ce_finish sums it */
        const float *m = CF(c->in[0]);
        float cnt = 0.0f, *o = F(c->out[0]);
        for (int64_t i = 0, n = (int64_t)numel(tin(c, 0)); i < n; i++)
            cnt += m[i];
        o[0] = 0.0f, o[1] = cnt;
        return 0;
    }
    default: { /* 3 fused; in: logits, labels, mask; out: lse, loss[2] */
        const mgc_plan_tensor *lab = tin(c, 1);
        int64_t n = (int64_t)numel(lab);
        unsigned char *w = scratch(be, (size_t)n * 16);
        if (!w) return fail(be, "out of memory");
        int32_t *l32 = (int32_t *)w;
        to_i32(l32, c->in[1], (mgc_dtype)lab->dtype, n);
        mgc_cpu_ce_fwd_f32(F(c->out[0]), F(c->out[1]), NULL, CF(c->in[0]), l32, CF(c->in[2]), n,
                           Vv, V_l, (float *)(w + n * 4));
        return 0;
    }
    }
}

/* ---- mixture of experts ---------------------------------------------------------- */

static mgc_router_score router_score(int64_t s) { /* config's mgc_score */
    return s == 1 ? MGC_ROUTER_SIGMOID : s == 2 ? MGC_ROUTER_SOFTMAX_PRE : MGC_ROUTER_SOFTMAX;
}

/* The dispatch map of n tokens' k choices (recomputed from ids and probs by
 * every op that needs it: it is a pure function of them). */
typedef struct dmap {
    int32_t *ids, *row_src, *row_of, *counts;
    int64_t R;
} dmap;

static int build_map(mgc_backend *be, dmap *m, const void *ids, const float *probs, int64_t n,
                     int64_t k, int64_t E, int64_t capacity, int64_t policy, unsigned char *w) {
    (void)be;
    m->ids = (int32_t *)w;
    m->row_src = m->ids + n * k;
    m->row_of = m->row_src + n * k;
    m->counts = m->row_of + n * k;
    memcpy(m->ids, ids, (size_t)(n * k) * 4);
    m->R = mgc_cpu_moe_dispatch_map_f32(m->row_src, m->row_of, m->counts, m->ids, probs, n, k, E,
                                        capacity, (mgc_drop_policy)policy);
    return 0;
}

static size_t map_bytes(int64_t n, int64_t k, int64_t E) {
    return (size_t)(3 * n * k + E) * 4 + 64;
}

/* Rows grouped by source chunk then local expert <-> by local expert then chunk. */
static void sort_rows(float *dst, const float *src, const int64_t *counts, int64_t chunks,
                      int64_t E_l, int64_t h, int inverse) {
    int64_t src_off = 0;
    /* offsets of (chunk, expert) blocks in the chunk-major order */
    for (int64_t e = 0, dst_off = 0; e < E_l; e++)
        for (int64_t ch = 0; ch < chunks; ch++) {
            int64_t cm = 0; /* chunk-major offset of block (ch, e) */
            for (int64_t q = 0; q < ch * E_l + e; q++)
                cm += counts[q];
            int64_t cnt = counts[ch * E_l + e];
            if (cnt) {
                if (!inverse)
                    memcpy(dst + dst_off * h, src + cm * h, (size_t)(cnt * h) * 4);
                else
                    memcpy(dst + cm * h, src + dst_off * h, (size_t)(cnt * h) * 4);
            }
            dst_off += cnt;
        }
    (void)src_off;
}

/* moe.router_topk_scaling_factor (the route op's fattr[2]; 0, as in older plans, is 1) */
static double topk_scale(const mgc_plan_op *op) {
    return op->fattr[2] > 0 ? op->fattr[2] : 1.0;
}

/* The rows of an aux loss's counts tensor t: 1 (E counts), or the sequences C of (C, E) counts
 * (moe.aux_loss_scope sequence); -1 when they do not divide the n tokens. */
static int64_t count_rows(const mgc_plan_tensor *t, int64_t E, int64_t n) {
    int64_t C = t->rank == 2 && E > 0 ? (int64_t)(numel(t) / (uint64_t)E) : 1;
    return C >= 1 && n % C == 0 ? C : -1;
}

static int op_moe(mgc_backend *be, const mgc_op_call *c) {
    const mgc_plan_op *op = c->op;
    int64_t tp = c->grid_tp, cp = c->grid_cp;
    switch (op->kind) {
    case MGC_POP_MOE_ROUTE: {
        int64_t E = op->iattr[1], k = op->iattr[2];
        const mgc_plan_tensor *lg = tin(c, 0);
        int64_t n = (int64_t)(numel(lg) / (uint64_t)E);
        if (op->iattr[0] == 1) { /* aux loss from the global counts */
            int64_t C = count_rows(tin(c, 1), E, n);
            int32_t *c32 = C > 0 ? scratch(be, (size_t)(C * E) * 4) : NULL;
            if (C < 0) return fail(be, "the aux loss's counts do not divide its tokens");
            if (!c32) return fail(be, "out of memory");
            to_i32(c32, c->in[1], (mgc_dtype)tin(c, 1)->dtype, C * E);
            /* the score function of the route op is not repeated here: softmax unless the
             * model says sigmoid (the exec passes it) */
            F(c->out[0])
            [0] = mgc_cpu_moe_aux_loss_f32(CF(c->in[0]), c32, n, E, k, op->iattr[3], C,
                                           router_score(c->router_score), op->fattr[0]);
            return 0;
        }
        unsigned char *w = scratch(be, (size_t)(n * k + E) * 4 + 64);
        if (!w) return fail(be, "out of memory");
        int32_t *ids = (int32_t *)c->out[1], *c32 = (int32_t *)w;
        float *z = NULL, zval = 0;
        void *counts = NULL;
        int64_t C = 1;
        for (int i = 2; i < op->n_out; i++) {
            if (tout(c, i)->dtype == MGC_DT_F32) z = F(c->out[i]);
            else
                counts = c->out[i], C = count_rows(tout(c, i), E, n);
        }
        if (C < 0) return fail(be, "the aux loss's counts do not divide its tokens");
        /* the second input, when there is one: the expert bias (fp32, E) */
        mgc_router_choice ch = {MGC_ROUTE_GROUPS(op->iattr[3]), MGC_ROUTE_GROUP_TOPK(op->iattr[3]),
                                op->n_in > 1 ? CF(c->in[1]) : NULL};
        mgc_cpu_moe_route_fwd_f32(F(c->out[0]), ids, c32, z ? &zval : NULL, CF(c->in[0]), n, E, k,
                                  router_score(MGC_ROUTE_SCORE(op->iattr[3])), &ch, topk_scale(op),
                                  op->fattr[1]);
        if (z) *z = zval;
        if (counts && C == 1) from_i32(counts, (mgc_dtype)MGC_DT_I64, c32, E);
        if (counts && C > 1) { /* each sequence's: token t is of sequence t mod C */
            int64_t *c64 = counts;
            memset(c64, 0, (size_t)(C * E) * sizeof *c64);
            for (int64_t t = 0; t < n; t++)
                for (int64_t j = 0; j < k; j++)
                    c64[(t % C) * E + ids[t * k + j]]++;
        }
        return 0;
    }
    case MGC_POP_MOE_ROUTE_BWD: { /* in: logits, ids, dprobs, (global counts); out: dlogits */
        int64_t E = op->iattr[1], k = op->iattr[2];
        int64_t n = (int64_t)(numel(tin(c, 0)) / (uint64_t)E);
        int has_aux = op->n_in > 3;
        int64_t C = has_aux ? count_rows(tin(c, 3), E, n) : 1;
        int32_t *c32 = C > 0 ? scratch(be, (size_t)(C * E) * 4) : NULL;
        if (C < 0) return fail(be, "the aux loss's counts do not divide its tokens");
        if (!c32) return fail(be, "out of memory");
        if (has_aux)
            to_i32(c32, c->in[3], (mgc_dtype)tin(c, 3)->dtype, C * E);
        else memset(c32, 0, (size_t)E * 4);
        /* the training loss adds the aux loss summed over tensor x context ranks and the
         * z-loss averaged over them; both per microbatch like the LM loss (c->dloss) */
        mgc_cpu_moe_route_bwd_f32(
            F(c->out[0]), CF(c->in[2]), CF(c->in[0]), (const int32_t *)c->in[1], c32, n, E, k,
            n * tp * cp, C, router_score(MGC_ROUTE_SCORE(op->iattr[3])), topk_scale(op),
            has_aux ? op->fattr[0] : 0.0, c->dloss, op->fattr[1], c->dloss / (double)(tp * cp));
        return 0;
    }
    case MGC_POP_MOE_DISPATCH: {
        if (op->iattr[0] == 0) { /* in: x, ids, probs; out: rows, counts */
            int64_t E = op->iattr[1];
            const mgc_plan_tensor *ids = tin(c, 1), *x = tin(c, 0);
            int64_t n = ids->dim[0], k = ids->dim[1], h = x->dim[x->rank - 1];
            unsigned char *w = scratch(be, map_bytes(n, k, E));
            if (!w) return fail(be, "out of memory");
            dmap m;
            build_map(be, &m, c->in[1], CF(c->in[2]), n, k, E, op->iattr[2], op->iattr[3], w);
            mgc_cpu_moe_permute_f32(F(c->out[0]), CF(c->in[0]), m.row_src, m.R, k, h);
            from_i32(c->out[1], (mgc_dtype)tout(c, 1)->dtype, m.counts, E);
            return 0;
        }
        /* .sort; in: rows by source chunk, counts; out: rows by local expert, per-expert counts */
        int64_t E_l = op->iattr[1], chunks = op->iattr[2];
        const int64_t *cnt = c->in[1];
        const mgc_plan_tensor *x = tin(c, 0);
        int64_t h = x->dim[1];
        sort_rows(F(c->out[0]), CF(c->in[0]), cnt, chunks, E_l, h, 0);
        int64_t *tpe = c->out[1];
        for (int64_t e = 0; e < E_l; e++) {
            tpe[e] = 0;
            for (int64_t ch = 0; ch < chunks; ch++)
                tpe[e] += cnt[ch * E_l + e];
        }
        return 0;
    }
    case MGC_POP_MOE_DISPATCH_BWD: {
        if (op->iattr[0] == 0) { /* in: drows, ids, probs; out: dx */
            int64_t E = op->iattr[1];
            const mgc_plan_tensor *ids = tin(c, 1), *dx = tout(c, 0);
            int64_t n = ids->dim[0], k = ids->dim[1], h = dx->dim[dx->rank - 1];
            unsigned char *w = scratch(be, map_bytes(n, k, E));
            if (!w) return fail(be, "out of memory");
            dmap m;
            build_map(be, &m, c->in[1], CF(c->in[2]), n, k, E, op->iattr[2], op->iattr[3], w);
            mgc_cpu_moe_permute_bwd_f32(F(c->out[0]), CF(c->in[0]), m.row_of, n, k, h);
            return 0;
        }
        /* the sort's transpose: in dy (by local expert), counts; out dx (by chunk) */
        const mgc_plan_tensor *dy = tin(c, 0);
        sort_rows(F(c->out[0]), CF(c->in[0]), c->in[1], op->iattr[2], op->iattr[1], dy->dim[1], 1);
        return 0;
    }
    case MGC_POP_MOE_COMBINE: {
        if (op->iattr[0] == 0) { /* .unsort; in: rows by local expert, counts; out: by chunk */
            const mgc_plan_tensor *x = tin(c, 0);
            sort_rows(F(c->out[0]), CF(c->in[0]), c->in[1], op->iattr[2], op->iattr[1], x->dim[1], 1);
            return 0;
        }
        /* in: rows, probs, ids; out: y (n, h) */
        int64_t E = op->iattr[1], k = op->iattr[2];
        const mgc_plan_tensor *y = tout(c, 0);
        int64_t h = y->dim[y->rank - 1], n = (int64_t)(numel(y) / (uint64_t)h);
        unsigned char *w = scratch(be, map_bytes(n, k, E));
        if (!w) return fail(be, "out of memory");
        dmap m;
        build_map(be, &m, c->in[2], CF(c->in[1]), n, k, E, op->iattr[3], c->drop_policy, w);
        mgc_cpu_moe_combine_f32(F(c->out[0]), CF(c->in[0]), CF(c->in[1]), m.row_of, n, k, h);
        return 0;
    }
    case MGC_POP_MOE_COMBINE_BWD: {
        if (op->iattr[0] == 0) { /* the unsort's transpose: in dy (by chunk), counts */
            const mgc_plan_tensor *dy = tin(c, 0);
            sort_rows(F(c->out[0]), CF(c->in[0]), c->in[1], op->iattr[2], op->iattr[1], dy->dim[1], 0);
            return 0;
        }
        /* in: dy, rows, probs, ids; out: drows, dprobs */
        int64_t E = op->iattr[1], k = op->iattr[2];
        const mgc_plan_tensor *dy = tin(c, 0);
        int64_t h = dy->dim[dy->rank - 1], n = (int64_t)(numel(dy) / (uint64_t)h);
        unsigned char *w = scratch(be, map_bytes(n, k, E));
        if (!w) return fail(be, "out of memory");
        dmap m;
        build_map(be, &m, c->in[3], CF(c->in[2]), n, k, E, op->iattr[3], c->drop_policy, w);
        /* rows past the routed ones (the buffer holds the dropless bound) stay untouched */
        mgc_cpu_moe_combine_bwd_f32(F(c->out[0]), F(c->out[1]), CF(c->in[0]), CF(c->in[1]),
                                    CF(c->in[2]), m.row_of, n, k, h);
        return 0;
    }
    case MGC_POP_GROUPED_LINEAR:
    case MGC_POP_GROUPED_LINEAR_DGRAD:
    case MGC_POP_GROUPED_LINEAR_WGRAD: {
        int64_t N = op->iattr[1], K = op->iattr[2];
        const mgc_plan_tensor *w = op->kind == MGC_POP_GROUPED_LINEAR_WGRAD ? tout(c, 0) : tin(c, 1);
        int64_t E_l = w->dim[0];
        int tpe_in = 2; /* tokens per expert, in every kind */
        int32_t *c32 = scratch(be, (size_t)E_l * 4);
        if (!c32) return fail(be, "out of memory");
        to_i32(c32, c->in[tpe_in], (mgc_dtype)tin(c, tpe_in)->dtype, E_l);
        if (op->kind == MGC_POP_GROUPED_LINEAR) {
            /* the experts' biases (E_l,N); a row-parallel one on expert-tensor rank 0 only */
            const float *bias = op->n_in > 3 ? CF(c->in[3]) : NULL;
            if ((op->iattr[3] & LIN_BIAS_RANK0) && c->co.etp != 0) bias = NULL;
            mgc_cpu_grouped_linear_fwd_f32(F(c->out[0]), CF(c->in[0]), CF(c->in[1]), bias, c32, E_l,
                                           N, K);
        } else if (op->kind == MGC_POP_GROUPED_LINEAR_DGRAD) {
            mgc_cpu_grouped_linear_dgrad_f32(F(c->out[0]), CF(c->in[0]), CF(c->in[1]), c32, E_l, N,
                                             K);
        } else {
            mgc_cpu_grouped_linear_wgrad_f32(F(c->out[0]), op->n_out > 1 ? F(c->out[1]) : NULL,
                                             CF(c->in[0]), CF(c->in[1]), c32, E_l, N, K);
        }
        return 0;
    }
    default:
        return fail(be, "not a MoE op");
    }
}

static int op_add_norm(mgc_backend *be, const mgc_op_call *c) {
    /* the fused op is the pair it replaces, run in order (bit for bit the unfused result) */
    mgc_plan_op aop, nop;
    mgc_op_call ac, nc;
    mgc_op_split_add_norm(c, &aop, &ac, &nop, &nc);
    if (op_pointwise(be, &ac)) return -1;
    return op_norm(be, &nc);
}

static int op_embedding_norm(mgc_backend *be, const mgc_op_call *c) {
    /* the ops it replaces, in order (bit for bit the unfused result) */
    mgc_plan_op eop, dop, nop;
    mgc_op_call ec, dc, nc;
    int drop = mgc_op_split_embedding_norm(c, &eop, &ec, &dop, &dc, &nop, &nc);
    if (drop < 0) return fail(be, "embedding_norm: inputs that do not fit its attributes");
    if (op_embedding(be, &ec)) return -1;
    if (drop && op_pointwise(be, &dc)) return -1;
    return op_norm(be, &nc);
}

/* linear_gelu and linear_dgrad_gelu (compiler/fusion.c) as the pairs they replace: the
 * linear into h, then y = gelu(h); the dgrad into dh, then dh = gelu'(h) dh in place. */
static int op_linear_gelu(mgc_backend *be, const mgc_op_call *c) {
    const mgc_plan_op *op = c->op;
    mgc_plan_op lop = *op;
    mgc_op_call lc = *c;
    lc.op = &lop;
    int64_t n = (int64_t)numel(tout(c, 0));
    if (op->kind == MGC_POP_LINEAR_GELU) { /* out y, h */
        lop.kind = MGC_POP_LINEAR;
        lop.n_out = 1;
        lop.out[0] = op->out[1];
        lc.out[0] = c->out[1];
        if (op_linear(be, &lc)) return -1;
        mgc_cpu_gelu_fwd_f32(F(c->out[0]), CF(c->out[1]), n);
        return 0;
    }
    lop.kind = MGC_POP_LINEAR_DGRAD; /* in dy, W, h; out dh (, db: MGC_POF_COLSUM) */
    lop.n_in = 2;
    lop.n_out = 1;
    if (op_linear(be, &lc)) return -1;
    mgc_cpu_gelu_bwd_f32(F(c->out[0]), CF(c->out[0]), CF(c->in[2]), n);
    /* the fused bias gradient of the linear that reads dh: linear_wgrad's own sum over dh (no
     * weight gradient: K = 0) */
    if ((op->flags & MGC_POF_COLSUM) && op->n_out > 1)
        mgc_cpu_linear_wgrad_f32(NULL, F(c->out[1]), CF(c->out[0]), NULL, op->iattr[0],
                                 op->iattr[2], 0);
    return 0;
}

static int cpu_run_op(mgc_backend *be, const mgc_op_call *c) {
    switch ((mgc_plan_op_kind)c->op->kind) {
    case MGC_POP_ADD_NORM: return op_add_norm(be, c);
    case MGC_POP_EMBEDDING_NORM: return op_embedding_norm(be, c);
    case MGC_POP_LINEAR_GELU:
    case MGC_POP_LINEAR_DGRAD_GELU: return op_linear_gelu(be, c);
    case MGC_POP_EMBEDDING:
    case MGC_POP_EMBEDDING_BWD: return op_embedding(be, c);
    case MGC_POP_NORM:
    case MGC_POP_NORM_BWD: return op_norm(be, c);
    case MGC_POP_LINEAR:
    case MGC_POP_LINEAR_DGRAD:
    case MGC_POP_LINEAR_WGRAD: return op_linear(be, c);
    case MGC_POP_QKV_SPLIT:
    case MGC_POP_QKV_SPLIT_BWD: return op_qkv(be, c);
    case MGC_POP_ROPE:
    case MGC_POP_ROPE_BWD: return op_rope(be, c);
    case MGC_POP_ATTENTION:
    case MGC_POP_ATTENTION_BWD: return op_attention(be, c);
    case MGC_POP_DROPOUT:
    case MGC_POP_DROPOUT_BWD:
    case MGC_POP_DROPOUT_ADD:
    case MGC_POP_DROPOUT_ADD_BWD:
    case MGC_POP_GELU:
    case MGC_POP_GELU_BWD:
    case MGC_POP_SWIGLU:
    case MGC_POP_SWIGLU_BWD:
    case MGC_POP_ADD:
    case MGC_POP_ADD_BWD: return op_pointwise(be, c);
    case MGC_POP_CROSS_ENTROPY:
    case MGC_POP_CROSS_ENTROPY_BWD: return op_cross_entropy(be, c);
    case MGC_POP_MOE_ROUTE:
    case MGC_POP_MOE_ROUTE_BWD:
    case MGC_POP_MOE_DISPATCH:
    case MGC_POP_MOE_DISPATCH_BWD:
    case MGC_POP_MOE_COMBINE:
    case MGC_POP_MOE_COMBINE_BWD:
    case MGC_POP_GROUPED_LINEAR:
    case MGC_POP_GROUPED_LINEAR_DGRAD:
    case MGC_POP_GROUPED_LINEAR_WGRAD: return op_moe(be, c);
    default:
        return fail(be, "cpu backend: op %s (kind %u) '%s' is not a compute op",
                    mgc_plan_op_name((mgc_plan_op_kind)c->op->kind), (unsigned)c->op->kind,
                    mgc_plan_strat(c->plan, c->op->name));
    }
}

/* ---- memory and the optimizer ------------------------------------------------------ */

static int cpu_arena_alloc(mgc_backend *be, uint64_t bytes, void **out) {
    void *p = NULL;
    size_t n = bytes ? (size_t)bytes : 256;
    if ((uint64_t)n != (bytes ? bytes : 256) || posix_memalign(&p, 256, n))
        return fail(be, "cannot allocate the %" PRIu64 "-byte arena on the host: %s", bytes,
                    strerror(ENOMEM));
    memset(p, 0, n);
    *out = p;
    return 0;
}

static void cpu_arena_free(mgc_backend *be, void *arena) {
    (void)be;
    free(arena);
}

static int cpu_copy(mgc_backend *be, void *dst, const void *src, size_t bytes) {
    (void)be;
    if (bytes && dst != src) memmove(dst, src, bytes);
    return 0;
}

static int cpu_zero(mgc_backend *be, void *dst, size_t bytes) {
    (void)be;
    if (bytes) memset(dst, 0, bytes);
    return 0;
}

static int cpu_sumsq(mgc_backend *be, const float *const *g, const int64_t *n, int64_t count,
                     double *out) {
    (void)be;
    double s = 0;
    for (int64_t i = 0; i < count; i++)
        s += mgc_cpu_sumsq(g[i], n[i]);
    *out = s;
    return 0;
}

static int cpu_adamw(mgc_backend *be, const mgc_adamw_tensor *t, int64_t count,
                     const mgc_adamw_step *s) {
    mgc_adamw_cfg cfg = {s->beta1, s->beta2, s->eps, s->weight_decay};
    for (int64_t i = 0; i < count; i++) {
        if (t[i].copy16) return fail(be, "cpu backend: 16-bit weights are not supported (fp32 only)");
        mgc_cpu_adamw(t[i].p, t[i].g, t[i].m, t[i].v, t[i].n, &cfg, s->step, s->lr, s->grad_scale,
                      t[i].decay);
    }
    return 0;
}

static int cpu_bind(mgc_backend *be, const mgc_plan *plan, const mgc_stage_program *stage,
                    void *arena) {
    (void)be, (void)plan, (void)stage, (void)arena;
    return 0;
}

static int cpu_sync(mgc_backend *be) {
    (void)be;
    return 0;
}

static int cpu_set_threads(mgc_backend *be, int threads) {
    (void)be;
    if (threads > 0) openblas_set_num_threads(threads);
    return 0;
}

static void cpu_close(mgc_backend *be) {
    cpu_ctx *c = be->context;
    if (c) free(c->scratch);
    free(c);
    free(be);
}

/* The fold of a device communicator's reductions (tests: a moves-only local world on the CPU's
 * arena): comm.c's reference fold. */
static int cpu_fold(mgc_backend *be, void *dst, const void *src, int parts, size_t count,
                    size_t stride, int dt, int op) {
    if (mgc_comm_fold_host(NULL, dst, src, parts, count, stride, (mgc_dtype)dt,
                           op ? MGC_COMM_MAX : MGC_COMM_SUM))
        return fail(be, "fold: %d parts of %s", parts, mgc_dtype_name((mgc_dtype)dt));
    return 0;
}

static const mgc_backend_iface cpu_iface = {
    .name = "cpu",
    .arena_alloc = cpu_arena_alloc,
    .arena_free = cpu_arena_free,
    .bind = cpu_bind,
    .run_op = cpu_run_op,
    .copy = cpu_copy,
    .upload = cpu_copy,
    .download = cpu_copy,
    .zero = cpu_zero,
    .sumsq = cpu_sumsq,
    .adamw = cpu_adamw,
    .sync = cpu_sync,
    .set_threads = cpu_set_threads,
    .close = cpu_close,
    .fold = cpu_fold,
};

int mgc_backend_cpu_open(mgc_backend **out, char *err, size_t err_size) {
    *out = NULL;
    mgc_backend *be = calloc(1, sizeof *be);
    cpu_ctx *c = calloc(1, sizeof *c);
    if (!be || !c) {
        free(be), free(c);
        if (err && err_size) snprintf(err, err_size, "cpu backend: out of memory");
        return -1;
    }
    be->iface = &cpu_iface;
    be->context = c;
    *out = be;
    return 0;
}

void mgc_backend_close(mgc_backend *be) {
    if (be) be->iface->close(be);
}

#ifndef MGC_HAVE_CUDA_BACKEND
/* This build has no CUDA backend (no CUDA toolkit at configure time). */
int mgc_backend_cuda_available(void) {
    return 0;
}

int mgc_backend_cuda_devices(void) {
    return 0;
}

int mgc_backend_cuda_open(mgc_backend **out, int device, char *err, size_t err_size) {
    (void)device;
    *out = NULL;
    if (err && err_size)
        snprintf(err, err_size, "this mgc-run was built without the CUDA toolkit, so it has no CUDA "
                                "backend: rebuild where /usr/local/cuda exists, or use --backend cpu");
    return -1;
}
#endif
