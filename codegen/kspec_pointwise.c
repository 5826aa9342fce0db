/* kspec_pointwise.c - kernel specs of the pointwise family (embedding, norms, dropout,
 * GELU, SwiGLU, add, QKV split, rotary, cross-entropy) and of the optimizer.
 *
 * The spec of an op is a pure function of the plan (shapes, attributes, dtypes), never of
 * the rank: vocabulary starts, valid vocabulary columns and context-parallel positions are
 * kernel arguments (runtime/cuda_ops_pointwise.c), so every rank of a stage shares the
 * cubins.  The storage dtype (fp32, bf16 or fp16) is the dtype of the op's main activation; the
 * cross-entropy and optimizer kernels work on fp32 arrays and are always fp32 specs.
 *
 * Block sizes chosen here (constant T) are the launcher's: see kernels/README.md. */
#include <stdint.h>

#include "kspec.h"

static const mgc_plan_tensor *tin(const mgc_plan_chunk *ch, const mgc_plan_op *op, int i) {
    return &ch->tensors[op->in[i]];
}
static const mgc_plan_tensor *tout(const mgc_plan_chunk *ch, const mgc_plan_op *op, int i) {
    return &ch->tensors[op->out[i]];
}

/* Threads per block for rows of h elements, `per` elements a thread, a multiple of 32 in
 * [32, cap]. */
static int64_t row_threads(int64_t h, int64_t per, int64_t cap) {
    int64_t t = (h + per - 1) / per;
    t = (t + 31) / 32 * 32;
    if (t < 32) t = 32;
    if (t > cap) t = cap;
    return t;
}

/* The block sizes of the row kernels (constant T; the launcher reads it from the spec). */
static int64_t mgc_kspec_norm_threads(int64_t h, int bwd) {
    (void)bwd; /* the same rule both ways: one 8-element vector a thread up to h = 8192; past
                  that 384 threads of 3 or more vectors (the backward re-reads x and dy:
                  norm.cuh MGC_NORM_HOLD), so that a thread may use 168 registers */
    return (h + 7) / 8 > 1024 ? 384 : row_threads(h, 8, 1024);
}
int mgc_kspec_norm_colsum_fits(int64_t h, int dt) {
    if (h <= 0 || (h + 7) / 8 > 1024) return 0; /* past 1024 vectors: 384 threads of several */
    int64_t t = mgc_kspec_norm_threads(h, 1);
    int64_t need = dt == MGC_DT_F32 ? 100 : 72;
    return 65536 / t >= need; /* a block alone on a multiprocessor: 64 Ki registers */
}
/* Rows a norm block works on at once (constant R): the largest power of two with
 * T * R <= 512 (at least 1, at most 16), so that blocks of ~256-512 threads, two an SM, keep
 * enough rows in flight (norm.cuh). */
static int64_t mgc_kspec_norm_rows(int64_t t) {
    int64_t r = 1;
    while (r < 16 && 2 * r * t <= 512)
        r *= 2;
    return r;
}
/* Rows a slot of the plain norm forward holds at once (constant P): two where a row is one
 * vector a thread, so that each thread has two 16-byte loads in flight before its first
 * barrier, as the fused add_norm has (its branch and residual), else one. */
static int64_t mgc_kspec_norm_fwd_rows_held(int64_t h, int64_t t) {
    return (h + 7) / 8 <= t ? 2 : 1;
}
static int64_t mgc_kspec_embedding_threads(int64_t h) {
    return row_threads(h, 4, 1024);
}
/* The embedding forward's block: at most 512 threads, so that a thread may hold 128 registers
 * (blocks of 1024 hold 64: fp16's conversions spilled 20 bytes there at H 5120 and 6144). */
static int64_t mgc_kspec_embedding_fwd_threads(int64_t h) {
    return row_threads(h, 4, 512);
}
/* Rows an embedding forward block copies (constant R): with 16-byte vectors (h % 8 == 0) about
 * 64 bytes of each table a thread, all loaded before the first store (four vectors of 8 16-bit
 * values, two of fp32: four of fp32 spilled 180 bytes at H 4096), at most 16 rows; else one. */
static int64_t mgc_kspec_embedding_rows(int64_t h, int64_t t, int dtype) {
    if (h % 8 != 0) return 1;
    int64_t r = (dtype == MGC_DT_BF16 || dtype == MGC_DT_F16 ? 4 : 2) * t / (h / 8);
    return r < 1 ? 1 : r > 16 ? 16 : r;
}

/* The one-block sort of the embedding backward (kernels/embedding.cuh embedding_sort_block) for
 * n keys of values up to vmax: 1 with its threads *t, rounds of 32 keys a warp *k (a power of
 * two) and row bits *rb where n <= MGC_KSPEC_EMB_BSORT_MAX and v << rb | r fits 32 bits; else 0
 * (the tiled sort, two launches a byte of v).  A thread holds a key and its rank a round: 8
 * rounds in the 64 registers of a block of 1024 (16 spilled 56-68 bytes, and 32 rounds in
 * blocks of 512 spilled 180). */
static int emb_block_sort(int64_t n, int64_t vmax, int64_t *t, int64_t *k, int64_t *rb) {
    if (n < 1 || n > MGC_KSPEC_EMB_BSORT_MAX) return 0;
    int64_t r = 1, vb = 0, per = 1;
    while (((int64_t)1 << r) < n) r++;
    for (int64_t m = vmax; m > 0; m >>= 1) vb++;
    if (r + vb > 32) return 0;
    while (per * 1024 < n) per *= 2;
    *k = per, *rb = r;
    *t = ((n + per - 1) / per + 31) / 32 * 32;
    return 1;
}

static int dt(const mgc_plan_tensor *t) {
    return t->dtype;
}

/* A cross-entropy kernel that reads the logits (l): fp32 ones under `dtype` (fp32 for the
 * entries that write no 16-bit tensor, else the gradient's), or 16-bit ones (training.logits_dtype
 * compute) under their own dtype with constant LT = 1, which must then be `dtype` too where that
 * is 16-bit (the gradient's: cross_entropy.cuh takes one 16-bit type).  -1 when it is not. */
static int ce_spec(mgc_kspec *k, const char *entry, const mgc_plan_tensor *l, int dtype) {
    if (mgc_kspec_storage(dt(l)) < 0) return -1;
    if (dt(l) == MGC_DT_F32) {
        mgc_kspec_init(k, "cross_entropy.cuh", entry, dtype);
        return 0;
    }
    if (dtype != MGC_DT_F32 && dtype != dt(l)) return -1;
    mgc_kspec_init(k, "cross_entropy.cuh", entry, dt(l));
    mgc_kspec_const(k, "LT", 1);
    return 0;
}

int mgc_kspecs_pointwise(const mgc_plan *p, const mgc_plan_chunk *ch, const mgc_plan_op *op,
                         mgc_kspec *out, int max) {
    (void)p;
    if (max < 2) return -1; /* only the embedding backward needs more than 2 */
    switch ((mgc_plan_op_kind)op->kind) {
    case MGC_POP_EMBEDDING: {
        const mgc_plan_tensor *y = tout(ch, op, 0);
        int64_t h = y->dim[y->rank - 1];
        if (h <= 0) return -1;
        int64_t t = mgc_kspec_embedding_fwd_threads(h);
        mgc_kspec_init(&out[0], "embedding.cuh", "embedding_fwd", dt(y));
        mgc_kspec_const(mgc_kspec_const(&out[0], "H", h), "T", t);
        mgc_kspec_const(&out[0], "R", mgc_kspec_embedding_rows(h, t, dt(y)));
        return 1;
    }
    case MGC_POP_EMBEDDING_BWD: { /* in: tokens, dy; out: dword (+ dpos): sort + sorted +
                                      join (with the positions' blocks) */
        const mgc_plan_tensor *dy = tin(ch, op, 1);
        int64_t h = dy->dim[dy->rank - 1];
        if (h <= 0) return -1;
        int64_t t = mgc_kspec_embedding_threads(h);
        if (max < 3) return -1;
        /* one block sorts the rows when they fit (the word ids up to V_l, or with documents the
         * positions, up to the sequence's s * cp): the keys and the sort are shared */
        const mgc_plan_tensor *tk = tin(ch, op, 0);
        int64_t n = tk->dim[0] * (tk->rank > 1 ? tk->dim[1] : 1), bt, bk, brb;
        int64_t vmax = op->iattr[0], npos = tk->dim[0] * (op->iattr[3] > 0 ? op->iattr[3] : 1);
        if (op->n_out > 1 && (op->flags & MGC_POF_DOCS) && npos > vmax) vmax = npos;
        if (emb_block_sort(n, vmax, &bt, &bk, &brb)) {
            mgc_kspec_init(&out[0], "embedding.cuh", "embedding_sort_block", MGC_DT_F32);
            mgc_kspec_const(mgc_kspec_const(&out[0], "T", bt), "K", bk);
            mgc_kspec_const(&out[0], "RB", brb);
        } else {
            mgc_kspec_init(&out[0], "embedding.cuh", "embedding_sort", MGC_DT_F32); /* any dtype */
        }
        mgc_kspec_init(&out[1], "embedding.cuh", "embedding_bwd_sorted", dt(dy));
        mgc_kspec_const(mgc_kspec_const(&out[1], "H", h), "T", t);
        /* the position gradient in the join's launch, without documents (with them its rows
         * are sorted and joined as the word gradient's) */
        int pos = op->n_out > 1 && !(op->flags & MGC_POF_DOCS);
        mgc_kspec_init(&out[2], "embedding.cuh", "embedding_bwd_join", pos ? dt(dy) : MGC_DT_F32);
        mgc_kspec_const(mgc_kspec_const(&out[2], "H", h), "T", t);
        mgc_kspec_const(&out[2], "POS", pos);
        return 3;
    }
    case MGC_POP_NORM:
    case MGC_POP_NORM_BWD: {
        int rms = op->iattr[0] == 1, bwd = op->kind == MGC_POP_NORM_BWD;
        int64_t h = op->iattr[2];
        if (h <= 0) return -1;
        const char *e = bwd ? (rms ? "rmsnorm_bwd" : "layernorm_bwd")
                            : (rms ? "rmsnorm_fwd" : "layernorm_fwd");
        int64_t t = mgc_kspec_norm_threads(h, bwd);
        mgc_kspec_init(&out[0], "norm.cuh", e, dt(tin(ch, op, 0)));
        mgc_kspec_const(mgc_kspec_const(&out[0], "H", h), "T", t);
        mgc_kspec_const(&out[0], "R", mgc_kspec_norm_rows(t));
        if (!bwd) { /* rows a forward slot loads before their statistics (norm.cuh) */
            mgc_kspec_const(&out[0], "P", mgc_kspec_norm_fwd_rows_held(h, t));
            return 1;
        }
        mgc_norm_bwd_io io;
        if (mgc_plan_norm_bwd_io(op, &io)) return -1;
        /* the residual gradient fused in (compiler/fusion.c) */
        mgc_kspec_const(&out[0], "RES", io.res >= 0);
        /* the column sums of dx (or dbr): a linear's bias gradient (MGC_POF_COLSUM) */
        mgc_kspec_const(&out[0], "CS", io.cs >= 0);
        /* the branch's dropout backward from the mask (MGC_POF_DROPBWD); named only when set,
         * so that the other kernels keep their names (norm.cuh: absent is 0) */
        if (io.dbr >= 0) mgc_kspec_const(&out[0], "DROP", 1);
        mgc_kspec_init(&out[1], "norm.cuh", "norm_bwd_reduce", 0);
        return 2;
    }
    case MGC_POP_ADD_NORM: { /* the fused dropout_add + norm (compiler/fusion.c) */
        int64_t h = op->iattr[2];
        if (h <= 0) return -1;
        mgc_kspec_init(&out[0], "norm.cuh", op->iattr[0] == 1 ? "add_rmsnorm_fwd" : "add_layernorm_fwd",
                       dt(tin(ch, op, 0)));
        int64_t t = mgc_kspec_norm_threads(h, 0);
        mgc_kspec_const(mgc_kspec_const(&out[0], "H", h), "T", t);
        mgc_kspec_const(&out[0], "R", mgc_kspec_norm_rows(t));
        /* without dropout the kernel has no Philox code (and its registers) */
        mgc_kspec_const(&out[0], "DROP", op->fattr[1] > 0);
        return 1;
    }
    case MGC_POP_EMBEDDING_NORM: { /* the fused embedding + norm (compiler/fusion.c) */
        const mgc_plan_tensor *x = tout(ch, op, 0);
        int64_t h = x->dim[x->rank - 1];
        if (h <= 0) return -1;
        mgc_kspec_init(&out[0], "norm.cuh",
                       op->fattr[1] == 1 ? "embedding_rmsnorm_fwd" : "embedding_layernorm_fwd", dt(x));
        int64_t t = mgc_kspec_norm_threads(h, 0);
        mgc_kspec_const(mgc_kspec_const(&out[0], "H", h), "T", t);
        mgc_kspec_const(&out[0], "R", mgc_kspec_norm_rows(t));
        /* the embedding's dropout (a mask, the third output): named only when set, so that
         * the kernels without it keep their names and arguments (norm.cuh: absent is 0) */
        if (op->n_out > 2) mgc_kspec_const(&out[0], "DROP", 1);
        return 1;
    }
    case MGC_POP_DROPOUT:
        mgc_kspec_init(&out[0], "pointwise.cuh", "dropout_fwd", dt(tin(ch, op, 0)));
        return 1;
    case MGC_POP_DROPOUT_ADD:
        mgc_kspec_init(&out[0], "pointwise.cuh", "dropout_add_fwd", dt(tin(ch, op, 0)));
        return 1;
    case MGC_POP_DROPOUT_BWD:
    case MGC_POP_DROPOUT_ADD_BWD:
        mgc_kspec_init(&out[0], "pointwise.cuh", "dropout_bwd", dt(tin(ch, op, 0)));
        return 1;
    case MGC_POP_GELU:
        mgc_kspec_init(&out[0], "pointwise.cuh", "gelu_fwd", dt(tin(ch, op, 0)));
        return 1;
    case MGC_POP_GELU_BWD:
        mgc_kspec_init(&out[0], "pointwise.cuh", "gelu_bwd", dt(tin(ch, op, 0)));
        return 1;
    case MGC_POP_SWIGLU:
    case MGC_POP_SWIGLU_BWD: {
        int bwd = op->kind == MGC_POP_SWIGLU_BWD;
        const mgc_plan_tensor *y = bwd ? tin(ch, op, 1) : tout(ch, op, 0); /* (n, f) */
        int64_t f = y->dim[y->rank - 1];
        if (f <= 0) return -1;
        mgc_kspec_init(&out[0], "pointwise.cuh", bwd ? "swiglu_bwd" : "swiglu_fwd",
                       dt(tin(ch, op, 0)));
        mgc_kspec_const(&out[0], "F", f);
        return 1;
    }
    case MGC_POP_ADD:
    case MGC_POP_ADD_BWD:
        mgc_kspec_init(&out[0], "pointwise.cuh", "add", dt(tin(ch, op, 0)));
        return 1;
    case MGC_POP_QKV_SPLIT:
    case MGC_POP_QKV_SPLIT_BWD: {
        if (op->iattr[0] <= 0 || op->iattr[1] <= 0 || op->iattr[2] <= 0) return -1;
        int rope = (op->flags & MGC_POF_ROPE) != 0, fwd = op->kind == MGC_POP_QKV_SPLIT;
        if (rope && (op->iattr[3] <= 0 || op->iattr[3] > op->iattr[2] || op->iattr[3] % 2))
            return -1;
        mgc_kspec_init(&out[0], "pointwise.cuh",
                       rope ? (fwd ? "qkv_rope_fwd" : "qkv_rope_bwd")
                            : (fwd ? "qkv_split_fwd" : "qkv_split_bwd"),
                       dt(tin(ch, op, 0)));
        mgc_kspec_const(&out[0], "G", op->iattr[0]);
        mgc_kspec_const(&out[0], "PER", op->iattr[1]);
        mgc_kspec_const(&out[0], "D", op->iattr[2]);
        if (rope) mgc_kspec_const(&out[0], "ROT", op->iattr[3]);
        return 1;
    }
    case MGC_POP_ROPE:
    case MGC_POP_ROPE_BWD: { /* one entry for both: the sign of the angle is an argument */
        const mgc_plan_tensor *x = tin(ch, op, 0);
        int64_t d = x->dim[3], rot = op->iattr[0];
        if (x->rank != 4 || d <= 0 || rot < 0 || rot > d || rot % 2) return -1;
        mgc_kspec_init(&out[0], "pointwise.cuh", "rope", dt(x));
        mgc_kspec_const(mgc_kspec_const(&out[0], "D", d), "ROT", rot);
        return 1;
    }
    case MGC_POP_CROSS_ENTROPY: /* phases 2 and 4 read no logits */
        switch (op->iattr[0]) {
        case 0: return ce_spec(&out[0], "ce_max", tin(ch, op, 0), 0) ? -1 : 1;
        case 1: return ce_spec(&out[0], "ce_sums", tin(ch, op, 0), 0) ? -1 : 1;
        case 2: mgc_kspec_init(&out[0], "cross_entropy.cuh", "ce_finish", 0); return 1;
        case 4: mgc_kspec_init(&out[0], "cross_entropy.cuh", "ce_count", 0); return 1;
        default:
            if (ce_spec(&out[0], "ce_rowstats", tin(ch, op, 0), 0)) return -1;
            mgc_kspec_init(&out[1], "cross_entropy.cuh", "ce_finish", 0);
            return 2;
        }
    case MGC_POP_CROSS_ENTROPY_BWD: /* dlogits in the compute dtype */
        if (op->flags & MGC_POF_CE_STATS) { /* the statistics fused in; ce_finish after */
            if (ce_spec(&out[0], "ce_fused", tin(ch, op, 0), dt(tout(ch, op, 0)))) return -1;
            mgc_kspec_init(&out[1], "cross_entropy.cuh", "ce_finish", 0);
            return 2;
        }
        return ce_spec(&out[0], "ce_bwd", tin(ch, op, 0), dt(tout(ch, op, 0))) ? -1 : 1;
    default:
        return 0;
    }
}

/* The optimizer's kernels, always in this order (the launcher indexes them):
 *   0 sumsq_partial, 1 sumsq_final, 2 adamw, 3 zero_list (the step's zeroing of the gradients,
 *   runtime/exec.c: the sum of squares' table).
 * Sum of squares and AdamW take tables of tensors (optim.cuh): their constants CHUNK, SQ_LIST
 * and AW_LIST are kspec.h's.
 * They work on fp32 arrays whatever the compute dtype, so their storage dtype is fp32. AdamW's
 * 16-bit copy-out writes bf16 bits, or fp16 bits for fp16 weights: then AdamW has the constant
 * COPY = 2 (fp32 and bf16 plans share one set). */
int mgc_kspecs_optimizer(int dtype, mgc_kspec *out, int max) {
    static const char *const entries[] = {"sumsq_partial", "sumsq_final", "adamw", "zero_list"};
    if (max < 4) return -1;
    for (int i = 0; i < 4; i++)
        mgc_kspec_init(&out[i], "optim.cuh", entries[i], MGC_DT_F32);
    /* the multi-tensor tables' geometry (optim.cuh; runtime/cuda_ops_pointwise.c mirrors it) */
    mgc_kspec_const(mgc_kspec_const(&out[0], "CHUNK", MGC_KSPEC_OPT_CHUNK), "SQ_LIST",
                    MGC_KSPEC_SQ_LIST);
    mgc_kspec_const(mgc_kspec_const(&out[2], "CHUNK", MGC_KSPEC_OPT_CHUNK), "AW_LIST",
                    MGC_KSPEC_AW_LIST);
    mgc_kspec_const(mgc_kspec_const(&out[3], "CHUNK", MGC_KSPEC_OPT_CHUNK), "SQ_LIST",
                    MGC_KSPEC_SQ_LIST);
    if (dtype == MGC_DT_F16) mgc_kspec_const(&out[2], "COPY", 2);
    return 4;
}

void mgc_kspec_fold(int dtype, mgc_kspec *out) {
    mgc_kspec_init(out, "comm.cuh", "fold", dtype);
}
