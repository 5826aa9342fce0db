/* cuda_ops_pointwise.c - launcher of the pointwise family for the CUDA backend: embedding,
 * norms, dropout (+ add), GELU, SwiGLU, add, QKV split, rotary, cross-entropy; and the
 * optimizer's kernels (sum of squares, AdamW, scale, bf16 cast).
 *
 * Every op is mapped exactly as runtime/cpu_backend.c maps it for the CPU twins (same
 * tensors, attributes and rank coordinates); kernels/README.md and the comment above each
 * kernel entry give the launch geometry used here.  Storage: activations and weights are
 * the op's compute dtype (fp32, bf16 or fp16: the spec's dtype), parameter gradients, logits,
 * lse and the loss fp32, tokens and labels int64, the loss mask fp32, dropout masks u8;
 * every tensor's dtype is checked against that before a launch. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_int.h"
#include "rng.h"

#define EW_BLOCK 256 /* element-wise kernels */
#define NORM_NB  MGC_KSPEC_NORM_NB  /* kspec.h: the plan sizes kernel_scratch with it */
#define SUMSQ_NB MGC_KSPEC_SUMSQ_NB

static const mgc_plan_tensor *tin(const mgc_op_call *c, int i) {
    return &c->chunk->tensors[c->op->in[i]];
}
static const mgc_plan_tensor *tout(const mgc_op_call *c, int i) {
    return &c->chunk->tensors[c->op->out[i]];
}

static int64_t numel(const mgc_plan_tensor *t) {
    int64_t n = 1;
    for (int i = 0; i < t->rank; i++)
        n *= t->dim[i];
    return n;
}

static const char *opname(const mgc_op_call *c) {
    return mgc_plan_strat(c->plan, c->op->name);
}

/* Grid of a grid-stride element-wise kernel over `work` items of EW_BLOCK threads. */
static unsigned ew_grid(mgc_backend *be, int64_t work) {
    int64_t g = (work + EW_BLOCK - 1) / EW_BLOCK;
    int sm = mgc_cuda_sm_count(be);
    int64_t cap = 16 * (int64_t)(sm > 0 ? sm : 64);
    if (g > cap) g = cap;
    return (unsigned)(g < 1 ? 1 : g);
}

/* The op's specs (codegen's, the launch order); exactly `want` of them. */
static int get_specs(mgc_backend *be, const mgc_op_call *c, mgc_kspec *k, int want) {
    char err[256] = "";
    int n = mgc_kspecs_for_op(c->plan, c->chunk, c->op, k, MGC_KSPEC_MAX_PER_OP, err, sizeof err);
    if (n < 0) return mgc_cuda_fail(be, "%s '%s': %s", mgc_plan_op_name((mgc_plan_op_kind)c->op->kind),
                                    opname(c), err[0] ? err : "no kernel for its shapes");
    if (n != want)
        return mgc_cuda_fail(be, "%s '%s': %d kernel specs, expected %d",
                             mgc_plan_op_name((mgc_plan_op_kind)c->op->kind), opname(c), n, want);
    return 0;
}

/* Refuses a tensor whose dtype is not `dt`. */
static int want(mgc_backend *be, const mgc_op_call *c, const mgc_plan_tensor *t, int dt,
                const char *what) {
    if (t->dtype == dt) return 0;
    return mgc_cuda_fail(be, "%s '%s': %s is %s, the CUDA kernel takes %s",
                         mgc_plan_op_name((mgc_plan_op_kind)c->op->kind), opname(c), what,
                         mgc_dtype_name((mgc_dtype)t->dtype), mgc_dtype_name((mgc_dtype)dt));
}

/* The cross-entropy's logits: fp32, or 16-bit (training.logits_dtype compute) in the type of
 * their gradient `gdt` (0: any 16-bit type, the forward's phases). */
static int want_logits(mgc_backend *be, const mgc_op_call *c, const mgc_plan_tensor *t, int gdt) {
    int half = t->dtype == MGC_DT_BF16 || t->dtype == MGC_DT_F16;
    if (t->dtype == MGC_DT_F32 || (half && (gdt == 0 || gdt == t->dtype))) return 0;
    return mgc_cuda_fail(be, "%s '%s': the logits are %s, the CUDA kernel takes fp32 or %s",
                         mgc_plan_op_name((mgc_plan_op_kind)c->op->kind), opname(c),
                         mgc_dtype_name((mgc_dtype)t->dtype),
                         gdt ? mgc_dtype_name((mgc_dtype)gdt) : "bf16 or fp16");
}

/* The compute dtype of an op: its main activation's, fp32, bf16 or fp16 only. */
static int act_dtype(mgc_backend *be, const mgc_op_call *c, const mgc_plan_tensor *t, int *dt) {
    if (mgc_kspec_storage(t->dtype) < 0)
        return mgc_cuda_fail(be, "%s '%s': activations in %s (fp32, bf16 and fp16 only)",
                             mgc_plan_op_name((mgc_plan_op_kind)c->op->kind), opname(c),
                             mgc_dtype_name((mgc_dtype)t->dtype));
    *dt = t->dtype;
    return 0;
}

/* The norm kernels take 16-byte vector accesses when h % 8 == 0 (norm.cuh): every pointer
 * must then be 16-byte aligned, which the arena's 256-byte alignment of tensors gives. */
static int norm_aligned(mgc_backend *be, const mgc_op_call *c, int64_t h, const void *const *p, int n) {
    if (h % 8) return 0;
    for (int i = 0; i < n; i++)
        if ((uintptr_t)p[i] & 15u)
            return mgc_cuda_fail(be, "%s '%s': a tensor is not 16-byte aligned (the arena aligns "
                                     "them to 256 bytes)",
                                 mgc_plan_op_name((mgc_plan_op_kind)c->op->kind), opname(c));
    return 0;
}

#define CHECK(x)                                                                               \
    do {                                                                                       \
        if ((x) != 0) return -1;                                                               \
    } while (0)

/* ---- the ops ------------------------------------------------------------------------------ */

/* The rows of dy (n, h) added into the rows of the fp32 table dw (V_l, h) that their ids name
 * (embedding.cuh): a radix sort of (id, row) keys (ids from tok - v0, or with tok NULL the rows'
 * positions under documents), then one pass over the sorted rows and the join of the runs
 * that cross segments, whose launch also adds the position gradient dp (P positions, P > 0
 * with the join's constant POS; else dp NULL, P 0).  k: the op's specs (sort, sorted, join);
 * scratch: its mgc_kspec_emb_sort_bytes. */
/* embedding_bwd_join's launch: G join blocks (0: none) and, with POS, P position blocks adding
 * dy's rows into the position gradient dp; nothing when both are 0. */
static int emb_join(mgc_backend *be, const mgc_kspec *k, void *dw, void *part, void *keys,
                    int64_t V_l, int64_t n, int64_t G, void *dp, void *dy, int64_t P, int64_t b,
                    int64_t cp, int64_t cpr, int64_t half) {
    int S = MGC_KSPEC_EMB_SEG;
    if (!mgc_kspec_get(k, "POS")) P = 0, dp = NULL;
    if (G + P == 0) return 0;
    if (G + P > INT32_MAX) return mgc_cuda_fail(be, "embedding_bwd: %lld blocks", (long long)(G + P));
    void *a[] = {&dw, &part, &keys, &V_l, &n, &S, &G, &dp, &dy, &b, &cp, &cpr, &half};
    return mgc_cuda_launch(be, k, (unsigned)(G + P), 1, 1, (unsigned)mgc_kspec_get(k, "T"), 0, a);
}

/* The rows' sort keys (embedding.cuh embedding_sort_block / embedding_sort) into keys[0 .. n),
 * the tiled sort using tmp and cnt beside them. */
static int emb_sort(mgc_backend *be, const mgc_kspec *k, void *keys, void *tmp, void *cnt, void *tk,
                    int64_t v0, int64_t V_l, int64_t n, int64_t b, int64_t cp, int64_t cpr,
                    int64_t half, const void *docs) {
    int in = (int)n;
    if (!strcmp(k->entry, "embedding_sort_block")) { /* one block */
        int64_t T = mgc_kspec_get(k, "T"), K = mgc_kspec_get(k, "K"), rb = mgc_kspec_get(k, "RB"), vb = 0;
        for (int64_t m = V_l; m > 0; m >>= 1) vb++;
        if (n > T * K || vb + rb > 32) /* the spec was made for these shapes: not reached */
            return mgc_cuda_fail(be,
                                 "embedding_bwd: %lld keys up to %lld do not fit the one-block "
                                 "sort of %lld x %lld keys of %lld row bits",
                                 (long long)n, (long long)V_l, (long long)T, (long long)K,
                                 (long long)rb);
        void *a[] = {&keys, &tk, &v0, &V_l, &in, &b, &cp, &cpr, &half, &docs};
        size_t words = (size_t)n + 256 * (size_t)(T / 32); /* the keys, the warps' counts */
        return mgc_cuda_launch(be, k, 1, 1, 1, (unsigned)T, words * 4, a);
    }
    /* tiles: a pass a byte of the largest id, V_l (the rows outside the table, skipped); the
     * last pass writes keys */
    int64_t per64;
    unsigned tiles = (unsigned)mgc_kspec_emb_sort_tiles(n, &per64);
    int passes = 1, per = (int)per64;
    for (uint64_t m = (uint64_t)V_l >> 8; m; m >>= 8) passes++;
    for (int pass = 0; pass < passes; pass++) {
        void *dst = (passes - 1 - pass) % 2 ? tmp : keys;
        void *src = pass == 0 ? NULL : (passes - pass) % 2 ? tmp : keys;
        int shift = 8 * pass;
        for (int mode = 0; mode < 2; mode++) {
            void *a[] = {&dst, &src, &tk, &cnt, &v0, &V_l, &in, &per,
                         &shift, &mode, &b, &cp, &cpr, &half, &docs};
            CHECK(mgc_cuda_launch(be, k, tiles, 1, 1, 256, 0, a));
        }
    }
    return 0;
}

static int emb_scatter(mgc_backend *be, const mgc_kspec *k, char *scratch, void *dw, void *dy,
                       void *tk, int64_t v0, int64_t V_l, int64_t n, int64_t b, int64_t cp,
                       int64_t cpr, int64_t half, const void *docs, void *dp, int64_t P) {
    int S = MGC_KSPEC_EMB_SEG;
    int64_t per64;
    unsigned tiles = (unsigned)mgc_kspec_emb_sort_tiles(n, &per64);
    unsigned segs = (unsigned)((n + S - 1) / S);
    char *keys = scratch, *tmp = keys + mgc_kspec_align((uint64_t)n * 8);
    void *cnt = tmp + mgc_kspec_align((uint64_t)n * 8);
    void *part = (char *)cnt + mgc_kspec_align((uint64_t)tiles * 256 * 4);
    CHECK(emb_sort(be, &k[0], keys, tmp, cnt, tk, v0, V_l, n, b, cp, cpr, half, docs));
    void *a2[] = {&dw, &part, &dy, &keys, &V_l, &n, &S};
    CHECK(mgc_cuda_launch(be, &k[1], segs, 1, 1, (unsigned)mgc_kspec_get(&k[1], "T"), 0, a2));
    return emb_join(be, &k[2], dw, part, keys, V_l, n, segs > 1 ? (int64_t)segs : 0, dp, dy, P, b, cp,
                    cpr, half);
}

static int op_embedding(mgc_backend *be, const mgc_op_call *c) {
    const mgc_plan_op *op = c->op;
    const mgc_plan_tensor *tok = tin(c, 0);
    int64_t s = tok->dim[0], b = tok->rank > 1 ? tok->dim[1] : 1, V_l = op->iattr[0];
    int64_t cp = op->iattr[3] > 0 ? op->iattr[3] : 1, cpr = c->co.cp;
    int64_t half = cp > 1 ? c->seq_length / (2 * cp) : 0, v0 = c->co.tp * V_l;
    int dt = MGC_DT_F32;
    mgc_kspec k[MGC_KSPEC_MAX_PER_OP];
    CHECK(want(be, c, tok, MGC_DT_I64, "the token tensor"));
    if (op->kind == MGC_POP_EMBEDDING) { /* in: tokens, word (, pos); out: y */
        CHECK(act_dtype(be, c, tout(c, 0), &dt));
        CHECK(want(be, c, tin(c, 1), dt, "the word embedding"));
        int with_pos = op->iattr[1] && (!op->iattr[2] || c->co.tp == 0) && op->n_in > 2;
        if (with_pos) CHECK(want(be, c, tin(c, 2), dt, "the position embedding"));
        CHECK(get_specs(be, c, k, 1));
        if (s * b == 0) return 0;
        void *y = c->out[0], *tk = c->in[0], *w = c->in[1], *wp = with_pos ? c->in[2] : NULL;
        const void *al[] = {y, w, wp}; /* 16-byte rows when h % 8 == 0 (embedding.cuh) */
        CHECK(norm_aligned(be, c, tout(c, 0)->dim[tout(c, 0)->rank - 1], al, 3));
        /* data.reset_position_ids: positions from each row's document start, the last input */
        const void *docs = op->flags & MGC_POF_DOCS ? c->in[op->n_in - 1] : NULL;
        int64_t n = s * b, R = mgc_kspec_get(&k[0], "R");
        void *args[] = {&y, &tk, &w, &wp, &v0, &V_l, &b, &cp, &cpr, &half, &docs, &n};
        return mgc_cuda_launch(be, &k[0], (unsigned)((n + R - 1) / R), 1, 1,
                               (unsigned)mgc_kspec_get(&k[0], "T"), 0, args);
    }
    /* EMBEDDING_BWD; in: tokens, dy; out: dword (+ dpos), fp32, accumulated */
    CHECK(act_dtype(be, c, tin(c, 1), &dt));
    CHECK(want(be, c, tout(c, 0), MGC_DT_F32, "the word embedding's gradient"));
    int with_dpos = op->n_out > 1;
    if (with_dpos) CHECK(want(be, c, tout(c, 1), MGC_DT_F32, "the position embedding's gradient"));
    CHECK(get_specs(be, c, k, 3));
    int64_t n = s * b;
    if (n == 0) return 0;
    if (n > MGC_KSPEC_EMB_SORT_MAX) /* the sort indexes keys with int */
        return mgc_cuda_fail(be,
                             "embedding_bwd '%s': %lld tokens in a microbatch, more than the %d "
                             "its sort indexes",
                             opname(c), (long long)n, MGC_KSPEC_EMB_SORT_MAX);
    void *dw = c->out[0], *dy = c->in[1], *tk = c->in[0];
    int64_t h = tin(c, 1)->dim[tin(c, 1)->rank - 1];
    /* data.reset_position_ids: the rows' document starts (s, b) int32, the last input */
    const void *docs = op->flags & MGC_POF_DOCS ? c->in[op->n_in - 1] : NULL;
    char *scratch = NULL;
    if (V_l > 0 || (with_dpos && docs)) {
        scratch = mgc_cuda_scratch(be, (size_t)mgc_kspec_emb_sort_bytes(n, h));
        if (!scratch) return -1;
    }
    /* without documents, the position gradient's blocks go in the word gradient's join
     * launch (embedding.cuh, POS): s of them, one a sequence row */
    void *dp = with_dpos ? c->out[1] : NULL;
    int64_t P = with_dpos && !docs ? s : 0;
    if (V_l > 0) { /* sort the rows by token, then one pass over dy (embedding.cuh) */
        if (V_l > (int64_t)UINT32_MAX - 1) /* the sort's keys hold a shard's id in 32 bits */
            return mgc_cuda_fail(be,
                                 "embedding_bwd '%s': a vocabulary shard of %lld rows, more than "
                                 "the %lu its sort keys hold",
                                 opname(c), (long long)V_l, (unsigned long)UINT32_MAX - 1);
        CHECK(emb_scatter(be, k, scratch, dw, dy, tk, v0, V_l, n, b, cp, cpr, half, NULL, dp, P));
        P = 0; /* done */
    }
    if (!with_dpos) return 0;
    if (docs) {
        /* with documents the rows sorted by position, as the word rows by token: positions
         * below seq_length (a row's position is at most its place in the sequence), which the
         * position table holds (mgc check: seq_length <= max_position_embeddings) */
        int64_t npos = c->seq_length;
        if (tout(c, 1)->dim[0] < npos)
            return mgc_cuda_fail(be, "embedding_bwd '%s': %lld positions, the sequence has %lld",
                                 opname(c), (long long)tout(c, 1)->dim[0], (long long)npos);
        return emb_scatter(be, k, scratch, dp, dy, NULL, 0, npos, n, b, cp, cpr, half, docs, NULL, 0);
    }
    /* no word gradient on this rank (an empty shard): the position blocks alone */
    return emb_join(be, &k[2], NULL, NULL, NULL, V_l, n, 0, dp, dy, P, b, cp, cpr, half);
}

static int op_norm(mgc_backend *be, const mgc_op_call *c) {
    const mgc_plan_op *op = c->op;
    int64_t rows = op->iattr[1], h = op->iattr[2];
    int rms = op->iattr[0] == 1, dt = MGC_DT_F32;
    float eps = (float)op->fattr[0];
    mgc_kspec k[MGC_KSPEC_MAX_PER_OP];
    CHECK(act_dtype(be, c, tin(c, 0), &dt));
    if (numel(tin(c, 0)) != rows * h)
        return mgc_cuda_fail(be, "norm '%s': input of %lld elements, not rows %lld x h %lld",
                             opname(c), (long long)numel(tin(c, 0)), (long long)rows, (long long)h);
    CHECK(want(be, c, tin(c, 1), dt, "the weight"));
    if (op->kind == MGC_POP_NORM) { /* in: x, w (, bias); out: y */
        const void *bias = NULL;
        if (!rms && op->n_in > 2) {
            CHECK(want(be, c, tin(c, 2), dt, "the bias"));
            bias = c->in[2];
        }
        CHECK(want(be, c, tout(c, 0), dt, "the output"));
        CHECK(get_specs(be, c, k, 1));
        if (rows == 0) return 0;
        void *y = c->out[0], *x = c->in[0], *w = c->in[1];
        const void *al[] = {y, x, w, bias};
        CHECK(norm_aligned(be, c, h, al, 4));
        int64_t R = mgc_kspec_get(&k[0], "R"), RP = R * mgc_kspec_get(&k[0], "P"); /* rows a block */
        void *args[] = {&y, &x, &w, &bias, &rows, &eps};
        return mgc_cuda_launch(be, &k[0], (unsigned)((rows + RP - 1) / RP), 1, 1,
                               (unsigned)(mgc_kspec_get(&k[0], "T") * R), 0, args);
    }
    /* NORM_BWD; in: x, w, dy (, g: the fused residual gradient) (, the dropout's mask); out: dx,
     * dw (, db) (, the column sums of dx or dbr: a linear's bias gradient, MGC_POF_COLSUM) (, dbr:
     * the dropout's branch gradient, MGC_POF_DROPBWD) -- dw, db and the column sums fp32,
     * accumulated (plan.h mgc_plan_norm_bwd_io) */
    mgc_norm_bwd_io io;
    if (mgc_plan_norm_bwd_io(op, &io) || (io.cs >= 0 && numel(tout(c, io.cs)) != h) ||
        (rms && io.db >= 0))
        return mgc_cuda_fail(be, "norm_bwd '%s': %d inputs and %d outputs do not fit its flags",
                             opname(c), op->n_in, op->n_out);
    CHECK(want(be, c, tin(c, 2), dt, "the output gradient"));
    const void *gres = NULL;
    if (io.res >= 0) {
        CHECK(want(be, c, tin(c, io.res), dt, "the residual gradient"));
        gres = c->in[io.res];
    }
    CHECK(want(be, c, tout(c, 0), dt, "the input gradient"));
    CHECK(want(be, c, tout(c, 1), MGC_DT_F32, "the weight's gradient"));
    int sets = io.sets, want_db = !rms && io.db >= 0;
    if (want_db) CHECK(want(be, c, tout(c, io.db), MGC_DT_F32, "the bias's gradient"));
    if (io.cs >= 0) CHECK(want(be, c, tout(c, io.cs), MGC_DT_F32, "the linear's bias gradient"));
    void *dbr = NULL;
    const void *mask = NULL;
    float dsc = 1.0f;
    if (io.dbr >= 0) {
        CHECK(want(be, c, tin(c, io.mask), MGC_DT_U8, "the dropout's mask"));
        CHECK(want(be, c, tout(c, io.dbr), dt, "the dropout's branch gradient"));
        if (numel(tin(c, io.mask)) != rows * h || numel(tout(c, io.dbr)) != rows * h)
            return mgc_cuda_fail(be, "norm_bwd '%s': the dropout's mask or gradient is not rows x h",
                                 opname(c));
        /* op_dropout's sc.  At p = 0 (an evaluation's programs) dsc is 1 and the forward kept
         * every element (the dropout kernels write a mask of ones), so dbr = dx as on the CPU */
        dbr = c->out[io.dbr], mask = c->in[io.mask];
        dsc = (float)(1.0 / (1.0 - op->fattr[1]));
    }
    CHECK(get_specs(be, c, k, 2));
    if (rows == 0 || h == 0) return 0;
    /* blocks: enough for every row slot to have a row (R slots a block), at most NORM_NB; a
     * function of the shape only, so the bits do not depend on the GPU */
    int64_t slots = (rows + mgc_kspec_get(&k[0], "R") - 1) / mgc_kspec_get(&k[0], "R");
    int nb = slots < NORM_NB ? (int)slots : NORM_NB;
    float *part = mgc_cuda_scratch(be, (size_t)nb * (size_t)h * (size_t)sets * sizeof(float));
    if (!part) return -1;
    void *dx = c->out[0], *dy = c->in[2], *x = c->in[0], *w = c->in[1];
    const void *al[] = {dx, dy, x, w, gres, part, dbr, mask};
    CHECK(norm_aligned(be, c, h, al, 8));
    void *a1[] = {&dx, &part, &dy, &x, &w, &gres, &rows, &eps, &want_db, &dbr, &mask, &dsc};
    CHECK(mgc_cuda_launch(be, &k[0], (unsigned)nb, 1, 1,
                          (unsigned)(mgc_kspec_get(&k[0], "T") * mgc_kspec_get(&k[0], "R")), 0, a1));
    /* the sets' destinations in order: dw (, db) (, the column sums) */
    void *d[3] = {c->out[1], want_db ? c->out[io.db] : NULL, NULL};
    if (io.cs >= 0) d[want_db ? 2 : 1] = c->out[io.cs];
    void *a2[] = {&d[0], &d[1], &d[2], &part, &nb, &h};
    return mgc_cuda_launch(be, &k[1], (unsigned)((h + 31) / 32), (unsigned)sets, 1, 1024, 0, a2);
}

/* ADD_NORM (compiler/fusion.c); in: branch, residual, w (, bias); out: h, y (, mask) */
static int op_add_norm(mgc_backend *be, const mgc_op_call *c) {
    const mgc_plan_op *op = c->op;
    int64_t rows = op->iattr[1], hd = op->iattr[2];
    int rms = op->iattr[0] == 1, dt = MGC_DT_F32;
    float eps = (float)op->fattr[0];
    double p = op->fattr[1];
    mgc_kspec k[MGC_KSPEC_MAX_PER_OP];
    CHECK(act_dtype(be, c, tin(c, 0), &dt));
    if (numel(tout(c, 0)) != rows * hd || numel(tin(c, 0)) != rows * hd || numel(tin(c, 1)) != rows * hd)
        return mgc_cuda_fail(be, "add_norm '%s': tensors are not rows %lld x h %lld", opname(c), (long long)rows,
                             (long long)hd);
    CHECK(want(be, c, tin(c, 1), dt, "the residual"));
    CHECK(want(be, c, tin(c, 2), dt, "the weight"));
    CHECK(want(be, c, tout(c, 0), dt, "the sum"));
    CHECK(want(be, c, tout(c, 1), dt, "the output"));
    const void *bias = NULL;
    if (!rms && op->n_in > 3) {
        CHECK(want(be, c, tin(c, 3), dt, "the bias"));
        bias = c->in[3];
    }
    void *mask = NULL;
    if (op->n_out > 2) {
        CHECK(want(be, c, tout(c, 2), MGC_DT_U8, "the mask"));
        mask = c->out[2];
    }
    CHECK(get_specs(be, c, k, 1));
    if (rows == 0) return 0;
    /* the dropout_add's numbering (same name, same output tensor): one launch a run of rows */
    mgc_dropout_rng dr = mgc_op_drop_rng(c, tout(c, 0));
    unsigned long long seed = dr.seed, stream = dr.stream, elem0 = dr.elem0;
    unsigned thr = mgc_rng_drop_threshold(p);
    float sc = (float)(1.0 / (1.0 - p));
    int drop = p > 0;
    const unsigned long long *step = NULL;
    if (drop && !(step = mgc_cuda_drop_step(be, c, &stream))) return -1;
    void *hp = c->out[0], *yp = c->out[1], *br = c->in[0], *rs = c->in[1], *w = c->in[2];
    const void *al[] = {hp, yp, br, rs, w, bias};
    CHECK(norm_aligned(be, c, hd, al, 6));
    if (mask && hd % 8 == 0 && ((uintptr_t)mask & 7u))
        return mgc_cuda_fail(be, "add_norm '%s': the mask is not 8-byte aligned", opname(c));
    int64_t R = mgc_kspec_get(&k[0], "R"), all = rows;
    int64_t first = dr.n0 > 0 && drop ? dr.n0 / hd : rows; /* mgc_op_drop_rng: whole positions */
    size_t es = dt == MGC_DT_F32 ? 4 : 2;
    for (int run = 0; run < 2; run++) {
        int64_t r0 = run ? first : 0;
        rows = run ? all - first : first;
        if (rows <= 0) continue;
        if (run) {
            size_t off = (size_t)(r0 * hd) * es;
            hp = (char *)hp + off, yp = (char *)yp + off, br = (char *)br + off, rs = (char *)rs + off;
            if (mask) mask = (char *)mask + r0 * hd;
            elem0 = dr.elem1;
        }
        void *args[] = {&hp, &yp, &mask, &br, &rs, &w, &bias, &rows, &eps, &seed, &stream, &step, &elem0, &thr, &sc, &drop};
        CHECK(mgc_cuda_launch(be, &k[0], (unsigned)((rows + R - 1) / R), 1, 1, (unsigned)(mgc_kspec_get(&k[0], "T") * R),
                              0, args));
    }
    return 0;
}

/* EMBEDDING_NORM (compiler/fusion.c; plan.h mgc_plan_emb_norm_io): in tokens, word
 * (, positions), w (, bias) (, doc starts); out x, y (, the embedding dropout's mask) */
static int op_embedding_norm(mgc_backend *be, const mgc_op_call *c) {
    const mgc_plan_op *op = c->op;
    mgc_emb_norm_io io;
    if (mgc_plan_emb_norm_io(op, &io) || (op->n_out != 2 && op->n_out != 3))
        return mgc_cuda_fail(be, "embedding_norm '%s': inputs that do not fit its attributes", opname(c));
    const mgc_plan_tensor *tok = tin(c, 0), *xt = tout(c, 0);
    int64_t s = tok->dim[0], b = tok->rank > 1 ? tok->dim[1] : 1, V_l = op->iattr[0];
    int64_t h = xt->dim[xt->rank - 1], rows = s * b;
    int64_t cp = op->iattr[3] > 0 ? op->iattr[3] : 1, cpr = c->co.cp;
    int64_t half = cp > 1 ? c->seq_length / (2 * cp) : 0, v0 = c->co.tp * V_l;
    int rms = op->fattr[1] == 1, dt = MGC_DT_F32;
    float eps = (float)op->fattr[0];
    mgc_kspec k[MGC_KSPEC_MAX_PER_OP];
    CHECK(want(be, c, tok, MGC_DT_I64, "the token tensor"));
    CHECK(act_dtype(be, c, xt, &dt));
    if (numel(xt) != rows * h || numel(tout(c, 1)) != rows * h)
        return mgc_cuda_fail(be, "embedding_norm '%s': outputs are not the %lld tokens x h %lld", opname(c),
                             (long long)rows, (long long)h);
    CHECK(want(be, c, tin(c, 1), dt, "the word embedding"));
    int with_pos = io.pos >= 0 && (!op->iattr[2] || c->co.tp == 0);
    if (with_pos) CHECK(want(be, c, tin(c, io.pos), dt, "the position embedding"));
    CHECK(want(be, c, tin(c, io.w), dt, "the norm's weight"));
    const void *bias = NULL;
    if (!rms && io.b >= 0) {
        CHECK(want(be, c, tin(c, io.b), dt, "the norm's bias"));
        bias = c->in[io.b];
    }
    CHECK(want(be, c, tout(c, 1), dt, "the norm's output"));
    void *mask = NULL;
    if (op->n_out > 2) {
        CHECK(want(be, c, tout(c, 2), MGC_DT_U8, "the dropout's mask"));
        mask = c->out[2];
    }
    CHECK(get_specs(be, c, k, 1));
    if (rows == 0) return 0;
    void *x = c->out[0], *y = c->out[1], *tk = c->in[0], *wte = c->in[1];
    void *wpe = with_pos ? c->in[io.pos] : NULL, *w = c->in[io.w];
    const void *docs = io.docs >= 0 ? c->in[io.docs] : NULL;
    const void *al[] = {x, y, wte, wpe, w, bias}; /* 16-byte rows when h % 8 == 0 */
    CHECK(norm_aligned(be, c, h, al, 6));
    int64_t R = mgc_kspec_get(&k[0], "R");
    unsigned grid = (unsigned)((rows + R - 1) / R), block = (unsigned)(mgc_kspec_get(&k[0], "T") * R);
    if (!mask) {
        void *args[] = {&x, &y, &tk, &wte, &wpe, &w, &bias, &v0, &V_l, &b, &cp, &cpr, &half, &docs, &rows, &eps};
        return mgc_cuda_launch(be, &k[0], grid, 1, 1, block, 0, args);
    }
    /* the dropout's numbering of x (one run, or a context rank's two: whole positions); the
     * spec has DROP, being made from this op's outputs (kspec_pointwise.c) */
    if (h % 8 == 0 && ((uintptr_t)mask & 7u))
        return mgc_cuda_fail(be, "embedding_norm '%s': the mask is not 8-byte aligned", opname(c));
    double p = op->fattr[2];
    mgc_dropout_rng dr = mgc_op_drop_rng(c, xt);
    unsigned long long seed = dr.seed, stream = dr.stream, elem0 = dr.elem0, elem1 = dr.elem1;
    int64_t first = dr.n0 > 0 ? dr.n0 / h : rows;
    unsigned thr = mgc_rng_drop_threshold(p);
    float sc = (float)(1.0 / (1.0 - p));
    int drop = p > 0;
    const unsigned long long *step = NULL;
    if (drop && !(step = mgc_cuda_drop_step(be, c, &stream))) return -1;
    void *args[] = {&x,    &y,    &tk,   &wte,  &wpe,    &w,    &bias,  &v0,    &V_l,
                    &b,    &cp,   &cpr,  &half, &docs,   &rows, &eps,   /* then DROP's */
                    &mask, &seed, &stream, &step, &elem0, &first, &elem1, &thr, &sc, &drop};
    return mgc_cuda_launch(be, &k[0], grid, 1, 1, block, 0, args);
}

static int op_dropout(mgc_backend *be, const mgc_op_call *c) {
    const mgc_plan_op *op = c->op;
    int fwd = op->kind == MGC_POP_DROPOUT || op->kind == MGC_POP_DROPOUT_ADD;
    int add = op->kind == MGC_POP_DROPOUT_ADD, dt = MGC_DT_F32;
    /* elements and shard offset: the input's for DROPOUT, the output's otherwise (CPU) */
    const mgc_plan_tensor *ref = op->kind == MGC_POP_DROPOUT ? tin(c, 0) : tout(c, 0);
    int64_t n = numel(ref);
    double p = op->fattr[0];
    mgc_dropout_rng dr = mgc_op_drop_rng(c, ref);
    unsigned long long seed = dr.seed, stream = dr.stream, elem0 = dr.elem0;
    uint32_t thr = mgc_rng_drop_threshold(p);
    float sc = (float)(1.0 / (1.0 - p));
    int drop = p > 0;
    const unsigned long long *step = NULL;
    mgc_kspec k[MGC_KSPEC_MAX_PER_OP];
    CHECK(act_dtype(be, c, tin(c, 0), &dt));
    CHECK(want(be, c, tout(c, 0), dt, "the output"));
    if (numel(tout(c, 0)) < n || numel(tin(c, 0)) < n)
        return mgc_cuda_fail(be, "dropout '%s': input and output sizes differ", opname(c));
    void *mask = NULL;
    if (fwd && op->n_out > 1) {
        CHECK(want(be, c, tout(c, 1), MGC_DT_U8, "the mask"));
        mask = c->out[1];
    }
    if (!fwd && op->n_in > 1) {
        CHECK(want(be, c, tin(c, 1), MGC_DT_U8, "the mask"));
        mask = c->in[1];
    }
    if (add) CHECK(want(be, c, tin(c, 1), dt, "the residual"));
    CHECK(get_specs(be, c, k, 1));
    if (n == 0) return 0;
    /* the kernels draw in the forward, and in a backward without the forward's mask */
    if (drop && (fwd || !mask) && !(step = mgc_cuda_drop_step(be, c, &stream))) return -1;
    void *y = c->out[0], *x = c->in[0], *res = add ? c->in[1] : NULL;
    /* one launch a run of the stream (mgc_op_drop_rng: two under context parallelism) */
    int64_t all = n, first = dr.n0 > 0 && drop ? dr.n0 : n;
    size_t es = dt == MGC_DT_F32 ? 4 : 2;
    for (int run = 0; run < 2; run++) {
        n = run ? all - first : first;
        if (n <= 0) continue;
        if (run) {
            size_t off = (size_t)first * es;
            y = (char *)y + off, x = (char *)x + off;
            if (res) res = (char *)res + off;
            if (mask) mask = (char *)mask + first;
            elem0 = dr.elem1;
        }
        /* 8-element items (pointwise.cuh), or Philox blocks of 4 when the run is not aligned */
        int64_t units = (int64_t)(((elem0 + (uint64_t)n - 1) >> 2) - (elem0 >> 2) + 1);
        unsigned grid = ew_grid(be, (elem0 & 3) == 0 ? (n + 7) / 8 : units);
        if (fwd) {
            void *args[] = {&y, &mask, &x, &res, &n, &seed, &stream, &step, &elem0, &thr, &sc, &drop};
            CHECK(mgc_cuda_launch(be, &k[0], grid, 1, 1, EW_BLOCK, 0, args));
        } else {
            void *args[] = {&y, &x, &mask, &n, &seed, &stream, &step, &elem0, &thr, &sc, &drop};
            CHECK(mgc_cuda_launch(be, &k[0], grid, 1, 1, EW_BLOCK, 0, args));
        }
    }
    return 0;
}

/* The rows an activation runs over: `rows`, or with MGC_POF_ROWS the routed ones (a prefix of
 * the buffer), counted by the last input, read back (the grouped GEMM before it has read them
 * too: the stream waits for nothing new); -1 with a message when they do not fit. */
static int64_t live_rows(mgc_backend *be, const mgc_op_call *c, int64_t rows) {
    const mgc_plan_op *op = c->op;
    if (!(op->flags & MGC_POF_ROWS)) return rows;
    int64_t n = numel(tin(c, op->n_in - 1)), sum = 0;
    int64_t *cnt = malloc((size_t)(n > 0 ? n : 1) * sizeof *cnt);
    if (!cnt) return mgc_cuda_fail(be, "out of memory");
    if (be->iface->download(be, cnt, c->in[op->n_in - 1], (size_t)n * sizeof *cnt)) {
        free(cnt);
        return -1;
    }
    for (int64_t e = 0; e < n && sum >= 0; e++) {
        if (cnt[e] < 0 || cnt[e] > rows - sum) {
            mgc_cuda_fail(be, "%s '%s': %lld rows routed to local expert %lld overflow the %lld-row buffer",
                          mgc_plan_op_name((mgc_plan_op_kind)op->kind), opname(c), (long long)cnt[e],
                          (long long)e, (long long)rows);
            sum = -1;
            break;
        }
        sum += cnt[e];
    }
    free(cnt);
    return sum;
}

static int op_elementwise(mgc_backend *be, const mgc_op_call *c) {
    const mgc_plan_op *op = c->op;
    int dt = MGC_DT_F32;
    mgc_kspec k[MGC_KSPEC_MAX_PER_OP];
    CHECK(act_dtype(be, c, tin(c, 0), &dt));
    int n_act = op->flags & MGC_POF_ROWS ? op->n_in - 1 : op->n_in; /* the counts are int64 */
    for (int i = 0; i < n_act; i++)
        CHECK(want(be, c, tin(c, i), dt, "an input"));
    CHECK(want(be, c, tout(c, 0), dt, "the output"));
    CHECK(get_specs(be, c, k, 1));
    void *y = c->out[0], *a = c->in[0], *b = op->n_in > 1 ? c->in[1] : NULL;
    switch (op->kind) {
    case MGC_POP_GELU:
    case MGC_POP_GELU_BWD: { /* in: x (, dy) */
        const mgc_plan_tensor *yt = tout(c, 0);
        int64_t w = yt->rank ? yt->dim[yt->rank - 1] : 1, rows = live_rows(be, c, numel(yt) / w);
        if (rows < 0) return -1;
        int64_t n = rows * w;
        if (n == 0) return 0;
        if (op->kind == MGC_POP_GELU) {
            void *args[] = {&y, &a, &n};
            return mgc_cuda_launch(be, &k[0], ew_grid(be, (n + 7) / 8), 1, 1, EW_BLOCK, 0, args);
        }
        void *args[] = {&y, &b, &a, &n};
        return mgc_cuda_launch(be, &k[0], ew_grid(be, (n + 7) / 8), 1, 1, EW_BLOCK, 0, args);
    }
    case MGC_POP_SWIGLU: { /* in: x (n, 2f); out: y (n, f) */
        int64_t f = mgc_kspec_get(&k[0], "F"), rows = f > 0 ? numel(tout(c, 0)) / f : 0;
        if (numel(tin(c, 0)) != 2 * rows * f)
            return mgc_cuda_fail(be, "swiglu '%s': input is not (rows, 2f)", opname(c));
        if ((rows = live_rows(be, c, rows)) < 0) return -1;
        if (rows == 0) return 0;
        void *args[] = {&y, &a, &rows};
        return mgc_cuda_launch(be, &k[0], ew_grid(be, f % 8 ? rows * f : rows * f / 8), 1, 1,
                               EW_BLOCK, 0, args);
    }
    case MGC_POP_SWIGLU_BWD: { /* in: x (n, 2f), dy (n, f); out: dx (n, 2f) */
        int64_t f = mgc_kspec_get(&k[0], "F"), rows = f > 0 ? numel(tin(c, 1)) / f : 0;
        if (numel(tin(c, 0)) != 2 * rows * f || numel(tout(c, 0)) != 2 * rows * f)
            return mgc_cuda_fail(be, "swiglu_bwd '%s': shapes are not (rows, 2f)", opname(c));
        if ((rows = live_rows(be, c, rows)) < 0) return -1;
        if (rows == 0) return 0;
        void *args[] = {&y, &b, &a, &rows};
        return mgc_cuda_launch(be, &k[0], ew_grid(be, f % 8 ? rows * f : rows * f / 8), 1, 1,
                               EW_BLOCK, 0, args);
    }
    default: { /* ADD, ADD_BWD: y = a + b */
        int64_t n = numel(tout(c, 0));
        if (op->n_in < 2) return mgc_cuda_fail(be, "add '%s': one input", opname(c));
        if (n == 0) return 0;
        void *args[] = {&y, &a, &b, &n};
        return mgc_cuda_launch(be, &k[0], ew_grid(be, (n + 7) / 8), 1, 1, EW_BLOCK, 0, args);
    }
    }
}

static int op_qkv(mgc_backend *be, const mgc_op_call *c) {
    const mgc_plan_op *op = c->op;
    int fwd = op->kind == MGC_POP_QKV_SPLIT, dt = MGC_DT_F32;
    int64_t G = op->iattr[0], per = op->iattr[1], d = op->iattr[2], w = G * (per + 2) * d;
    mgc_kspec k[MGC_KSPEC_MAX_PER_OP];
    const mgc_plan_tensor *fused = fwd ? tin(c, 0) : tout(c, 0);
    CHECK(act_dtype(be, c, fused, &dt));
    for (int i = 0; i < 3; i++)
        CHECK(want(be, c, fwd ? tout(c, i) : tin(c, i), dt, "q, k or v"));
    CHECK(get_specs(be, c, k, 1));
    if (w <= 0) return mgc_cuda_fail(be, "qkv_split '%s': bad attributes", opname(c));
    int64_t rows = numel(fused) / w;
    if (rows == 0) return 0;
    void *qkv = fwd ? c->in[0] : c->out[0];
    void *q = fwd ? c->out[0] : c->in[0], *kk = fwd ? c->out[1] : c->in[1],
         *v = fwd ? c->out[2] : c->in[2];
    if (op->flags & MGC_POF_ROPE) { /* with the rotary embedding of q and k (qkv_rope_*) */
        const mgc_plan_tensor *tq = fwd ? tout(c, 0) : tin(c, 0);
        int64_t s = tq->dim[0], bG = tq->rank == 4 ? tq->dim[1] * G : 0, nb = 1;
        /* reset_position_ids: a block a (sequence row, batch row), positions from its document */
        const void *docs = op->flags & MGC_POF_DOCS ? c->in[op->n_in - 1] : NULL;
        int64_t cp = op->fattr[1] >= 1 ? (int64_t)op->fattr[1] : 1, cpr = c->co.cp;
        int64_t half = cp > 1 ? c->seq_length / (2 * cp) : 0;
        double theta = op->fattr[0];
        if (tq->rank != 4 || s * tq->dim[1] != rows || (bG + 7) / 8 > 65535)
            return mgc_cuda_fail(be, "qkv_split '%s': q is not (s, b, heads, d), or b*groups "
                                 "is too large", opname(c));
        if (docs) nb = tq->dim[1], bG = G;
        if (s * nb > INT32_MAX)
            return mgc_cuda_fail(be, "qkv_split '%s': too many rows", opname(c));
        void *args[] = {&qkv, &q, &kk, &v, &bG, &cp, &cpr, &half, &theta, &docs, &nb};
        return mgc_cuda_launch(be, &k[0], (unsigned)(s * nb), (unsigned)((bG + 7) / 8), 1, 128, 0,
                               args);
    }
    void *args[] = {&qkv, &q, &kk, &v, &rows};
    return mgc_cuda_launch(be, &k[0], ew_grid(be, d % 8 ? rows * w : rows * w / 8), 1, 1, EW_BLOCK,
                           0, args);
}

static int op_rope(mgc_backend *be, const mgc_op_call *c) {
    const mgc_plan_op *op = c->op;
    const mgc_plan_tensor *x = tin(c, 0);
    int64_t s = x->dim[0], bH = x->dim[1] * x->dim[2];
    int64_t cp = op->iattr[1] > 0 ? op->iattr[1] : 1, cpr = c->co.cp;
    int64_t half = cp > 1 ? c->seq_length / (2 * cp) : 0;
    double theta = op->fattr[0], sign = op->kind == MGC_POP_ROPE ? 1.0 : -1.0;
    int dt = MGC_DT_F32;
    mgc_kspec k[MGC_KSPEC_MAX_PER_OP];
    CHECK(act_dtype(be, c, x, &dt));
    CHECK(want(be, c, tout(c, 0), dt, "the output"));
    CHECK(get_specs(be, c, k, 1));
    if (s == 0 || bH == 0) return 0;
    if ((bH + 7) / 8 > 65535) return mgc_cuda_fail(be, "rope '%s': b*heads too large", opname(c));
    /* reset_position_ids: a block a (sequence row, batch row), positions from its document */
    const void *docs = op->flags & MGC_POF_DOCS ? c->in[op->n_in - 1] : NULL;
    int64_t nb = docs ? x->dim[1] : 1;
    if (docs) bH = x->dim[2];
    if (s * nb > INT32_MAX) return mgc_cuda_fail(be, "rope '%s': too many rows", opname(c));
    void *y = c->out[0], *xp = c->in[0];
    void *args[] = {&y, &xp, &bH, &cp, &cpr, &half, &theta, &sign, &docs, &nb};
    return mgc_cuda_launch(be, &k[0], (unsigned)(s * nb), (unsigned)((bH + 7) / 8), 1, 128, 0, args);
}

/* Logit columns of this tensor rank that are real vocabulary entries (cpu_backend.c). */
static int64_t valid_columns(const mgc_op_call *c, int64_t V_l) {
    int64_t v0 = c->co.tp * V_l, valid = c->vocab_size - v0;
    return valid < 0 ? 0 : valid > V_l ? V_l : valid;
}

static int op_cross_entropy(mgc_backend *be, const mgc_op_call *c) {
    const mgc_plan_op *op = c->op;
    int64_t V_l = op->iattr[1], v0 = c->co.tp * V_l, vv = valid_columns(c, V_l), ld = V_l;
    mgc_kspec k[MGC_KSPEC_MAX_PER_OP];
    const int F32 = MGC_DT_F32, I64 = MGC_DT_I64;
    if (op->kind == MGC_POP_CROSS_ENTROPY_BWD && (op->flags & MGC_POF_CE_STATS)) {
        /* the statistics fused in (tp = 1): in: logits, labels, mask, count; out: dlogits (in
         * place), lse, loss[2].  ce_fused, then ce_finish over its mx and sums. */
        const mgc_plan_tensor *lab = tin(c, 1);
        int64_t n = numel(lab);
        CHECK(want(be, c, lab, I64, "the labels"));
        CHECK(want(be, c, tin(c, 2), F32, "the loss mask"));
        CHECK(want(be, c, tin(c, 3), F32, "the count"));
        CHECK(want(be, c, tout(c, 1), F32, "lse"));
        CHECK(want(be, c, tout(c, 2), F32, "the loss"));
        int gdt = MGC_DT_F32;
        CHECK(act_dtype(be, c, tout(c, 0), &gdt));
        CHECK(want_logits(be, c, tin(c, 0), gdt));
        CHECK(get_specs(be, c, k, 2));
        int64_t dld = mgc_plan_tensor_ld(tout(c, 0));
        if (dld < ld || v0 != 0 || ((op->flags & MGC_POF_INPLACE) && c->out[0] != c->in[0]))
            return mgc_cuda_fail(be,
                                 "cross_entropy_bwd '%s': the gradient's row pitch %lld is below "
                                 "its %lld columns, a tensor rank above 0, or in place on other "
                                 "memory than the logits'",
                                 mgc_plan_strat(c->plan, op->name), (long long)dld, (long long)ld);
        float *mx = mgc_cuda_scratch(be, (size_t)(n > 0 ? n : 1) * 3 * sizeof(float));
        if (!mx) return -1;
        float *sums = mx + n;
        if (n > 0 && ld > 0) {
            void *dl = c->out[0], *lg = c->in[0], *lb = c->in[1], *mk = c->in[2], *cn = c->in[3];
            double dloss = c->dloss;
            void *a1[] = {&dl, &lg, &mx, &sums, &lb, &mk, &cn, &dloss, &vv, &ld, &dld};
            CHECK(mgc_cuda_launch(be, &k[0], (unsigned)n, 1, 1, 512, 0, a1));
        }
        void *lse = c->out[1], *loss = c->out[2], *mk = c->in[2];
        void *a2[] = {&lse, &loss, &mx, &sums, &mk, &n};
        return mgc_cuda_launch(be, &k[1], 1, 1, 1, 1024, 0, a2);
    }
    if (op->kind == MGC_POP_CROSS_ENTROPY_BWD) {
        /* in: logits, lse, labels, mask, loss; out: dlogits */
        const mgc_plan_tensor *lab = tin(c, 2);
        int64_t n = numel(lab);
        CHECK(want(be, c, tin(c, 1), F32, "lse"));
        CHECK(want(be, c, lab, I64, "the labels"));
        CHECK(want(be, c, tin(c, 3), F32, "the loss mask"));
        CHECK(want(be, c, tin(c, 4), F32, "the loss"));
        int gdt = MGC_DT_F32;
        CHECK(act_dtype(be, c, tout(c, 0), &gdt)); /* the compute dtype */
        CHECK(want_logits(be, c, tin(c, 0), gdt));
        CHECK(get_specs(be, c, k, 1));
        /* in place (MGC_POF_INPLACE): each row of the gradient over its own fp32 row, at a row
         * pitch of dld elements (2 V_l for a 16-bit gradient over fp32 logits, plan.h) */
        int64_t dld = mgc_plan_tensor_ld(tout(c, 0));
        if (dld < ld || ((op->flags & MGC_POF_INPLACE) && c->out[0] != c->in[0]))
            return mgc_cuda_fail(be,
                                 "cross_entropy_bwd '%s': the gradient's row pitch %lld is below "
                                 "its %lld columns, or it is marked in place on other memory "
                                 "than the logits'",
                                 mgc_plan_strat(c->plan, op->name), (long long)dld, (long long)ld);
        if (n == 0 || ld == 0) return 0;
        void *dl = c->out[0], *lg = c->in[0], *lse = c->in[1], *lb = c->in[2], *mk = c->in[3],
             *ls = c->in[4];
        double dloss = c->dloss;
        void *args[] = {&dl, &lg, &lse, &lb, &mk, &ls, &dloss, &v0, &vv, &ld, &dld};
        return mgc_cuda_launch(be, &k[0], (unsigned)n, 1, 1, 256, 0, args);
    }
    switch (op->iattr[0]) {
    case 0: { /* in: logits; out: row max */
        int64_t n = numel(tout(c, 0));
        CHECK(want_logits(be, c, tin(c, 0), 0));
        CHECK(want(be, c, tout(c, 0), F32, "the row max"));
        CHECK(get_specs(be, c, k, 1));
        if (n == 0) return 0;
        void *mx = c->out[0], *sums = NULL, *lg = c->in[0], *lb = NULL;
        void *args[] = {&mx, &sums, &lg, &lb, &v0, &vv, &ld};
        return mgc_cuda_launch(be, &k[0], (unsigned)n, 1, 1, 512, 0, args);
    }
    case 1: { /* in: logits, max, labels; out: (n, 2) = (sum exp, target logit) */
        int64_t n = numel(tin(c, 2));
        CHECK(want_logits(be, c, tin(c, 0), 0));
        CHECK(want(be, c, tin(c, 1), F32, "the row max"));
        CHECK(want(be, c, tin(c, 2), I64, "the labels"));
        CHECK(want(be, c, tout(c, 0), F32, "the sums"));
        CHECK(get_specs(be, c, k, 1));
        if (n == 0) return 0;
        void *mx = c->in[1], *sums = c->out[0], *lg = c->in[0], *lb = c->in[2];
        void *args[] = {&mx, &sums, &lg, &lb, &v0, &vv, &ld};
        return mgc_cuda_launch(be, &k[0], (unsigned)n, 1, 1, 512, 0, args);
    }
    case 2: { /* in: max, sums (n, 2), mask; out: lse, loss[2] */
        int64_t n = numel(tin(c, 0));
        CHECK(want(be, c, tin(c, 0), F32, "the row max"));
        CHECK(want(be, c, tin(c, 1), F32, "the sums"));
        void *mk = NULL;
        if (op->n_in > 2) {
            CHECK(want(be, c, tin(c, 2), F32, "the loss mask"));
            mk = c->in[2];
        }
        CHECK(want(be, c, tout(c, 0), F32, "lse"));
        CHECK(want(be, c, tout(c, 1), F32, "the loss"));
        CHECK(get_specs(be, c, k, 1));
        void *lse = c->out[0], *loss = c->out[1], *mx = c->in[0], *sums = c->in[1];
        void *args[] = {&lse, &loss, &mx, &sums, &mk, &n};
        return mgc_cuda_launch(be, &k[0], 1, 1, 1, 1024, 0, args);
    }
    case 4: { /* in: mask; out: (0, sum of the mask) (compiler/losschunk.h) */
        int64_t n = numel(tin(c, 0));
        CHECK(want(be, c, tin(c, 0), F32, "the loss mask"));
        CHECK(want(be, c, tout(c, 0), F32, "the count"));
        CHECK(get_specs(be, c, k, 1));
        void *loss = c->out[0], *mk = c->in[0];
        void *args[] = {&loss, &mk, &n};
        return mgc_cuda_launch(be, &k[0], 1, 1, 1, 1024, 0, args);
    }
    default: { /* 3 fused (tp = 1); in: logits, labels, mask; out: lse, loss[2] */
        int64_t n = numel(tin(c, 1)), z = 0;
        CHECK(want_logits(be, c, tin(c, 0), 0));
        CHECK(want(be, c, tin(c, 1), I64, "the labels"));
        void *mk = NULL;
        if (op->n_in > 2) {
            CHECK(want(be, c, tin(c, 2), F32, "the loss mask"));
            mk = c->in[2];
        }
        CHECK(want(be, c, tout(c, 0), F32, "lse"));
        CHECK(want(be, c, tout(c, 1), F32, "the loss"));
        CHECK(get_specs(be, c, k, 2));
        float *mx = mgc_cuda_scratch(be, (size_t)(n > 0 ? n : 1) * 3 * sizeof(float));
        if (!mx) return -1;
        float *sums = mx + n;
        if (n > 0) {
            void *lg = c->in[0], *lb = c->in[1];
            void *a1[] = {&mx, &sums, &lg, &lb, &z, &vv, &ld}; /* v0 = 0 as the CPU's fused path */
            CHECK(mgc_cuda_launch(be, &k[0], (unsigned)n, 1, 1, 512, 0, a1));
        }
        void *lse = c->out[0], *loss = c->out[1];
        void *a2[] = {&lse, &loss, &mx, &sums, &mk, &n};
        return mgc_cuda_launch(be, &k[1], 1, 1, 1, 1024, 0, a2);
    }
    }
}

int mgc_cuda_ops_pointwise(mgc_backend *be, const mgc_op_call *c) {
    switch ((mgc_plan_op_kind)c->op->kind) {
    case MGC_POP_EMBEDDING:
    case MGC_POP_EMBEDDING_BWD: return op_embedding(be, c);
    case MGC_POP_NORM:
    case MGC_POP_NORM_BWD: return op_norm(be, c);
    case MGC_POP_DROPOUT:
    case MGC_POP_DROPOUT_BWD:
    case MGC_POP_DROPOUT_ADD:
    case MGC_POP_DROPOUT_ADD_BWD: return op_dropout(be, c);
    case MGC_POP_ADD_NORM: return op_add_norm(be, c);
    case MGC_POP_EMBEDDING_NORM: return op_embedding_norm(be, c);
    case MGC_POP_GELU:
    case MGC_POP_GELU_BWD:
    case MGC_POP_SWIGLU:
    case MGC_POP_SWIGLU_BWD:
    case MGC_POP_ADD:
    case MGC_POP_ADD_BWD: return op_elementwise(be, c);
    case MGC_POP_QKV_SPLIT:
    case MGC_POP_QKV_SPLIT_BWD: return op_qkv(be, c);
    case MGC_POP_ROPE:
    case MGC_POP_ROPE_BWD: return op_rope(be, c);
    case MGC_POP_CROSS_ENTROPY:
    case MGC_POP_CROSS_ENTROPY_BWD: return op_cross_entropy(be, c);
    default: return 1;
    }
}

/* ---- the optimizer ----------------------------------------------------------------------- */

enum { OPT_SUMSQ_PARTIAL, OPT_SUMSQ_FINAL, OPT_ADAMW, OPT_ZERO_LIST, OPT__N };

/* the optimizer's specs for weights of dtype `w` (the 16-bit copy-out's type) */
static int opt_specs(mgc_backend *be, mgc_kspec *k, int w) {
    if (mgc_kspecs_optimizer(w, k, OPT__N) != OPT__N)
        return mgc_cuda_fail(be, "optimizer: unexpected kernel specs");
    return 0;
}

/* The multi-tensor tables, as kernels/optim.cuh declares them (kernel parameters by value:
 * the same members in the same order; every member 8 bytes, so no padding either side). */
#define OPT_CHUNK MGC_KSPEC_OPT_CHUNK
#define SQ_LIST   MGC_KSPEC_SQ_LIST
#define AW_LIST   MGC_KSPEC_AW_LIST
typedef struct sq_list {
    const float *g[SQ_LIST];
    int64_t n[SQ_LIST];
    int64_t c0[SQ_LIST + 1];
} sq_list;
typedef struct aw_list {
    float *p[AW_LIST];
    const float *g[AW_LIST];
    float *m[AW_LIST];
    float *v[AW_LIST];
    uint16_t *copy[AW_LIST];
    int64_t n[AW_LIST];
    double wd[AW_LIST];
    int64_t c0[AW_LIST + 1];
} aw_list;
/* a launch's parameters stay within the 4 KiB every driver accepts */
_Static_assert(sizeof(sq_list) + 16 <= 4096, "optim.cuh sumsq table too large");
_Static_assert(sizeof(aw_list) + 8 * 8 <= 4096, "optim.cuh adamw table too large");

static int64_t chunks_of(int64_t n) {
    return n > 0 ? (n + OPT_CHUNK - 1) / OPT_CHUNK : 0;
}

/* The next table of up to SQ_LIST of the count arrays g[i] (n[i] elements), from *at on (which
 * it advances): its entries, and in *nb its blocks, min(chunks, SUMSQ_NB) (0: no element). */
static int sq_table(sq_list *L, const float *const *g, const int64_t *n, int64_t count,
                    int64_t *at, int *nb) {
    memset(L, 0, sizeof *L);
    int cnt = 0;
    for (; *at < count && cnt < SQ_LIST; (*at)++, cnt++) {
        L->g[cnt] = g[*at];
        L->n[cnt] = n[*at] > 0 ? n[*at] : 0;
        L->c0[cnt + 1] = L->c0[cnt] + chunks_of(n[*at]);
    }
    int64_t total = L->c0[cnt];
    *nb = total < SUMSQ_NB ? (int)total : SUMSQ_NB;
    return cnt;
}

/* out is a host address (the executor's, as for the CPU backend): the fp64 sum is reduced on
 * the device in a fixed order -- per table of up to SQ_LIST tensors nb block partials
 * (nb = min(chunks, SUMSQ_NB), a function of the sizes only, never of the GPU, so the bits are
 * not either), then one block adds them to the running total -- and downloaded once. */
int mgc_cuda_sumsq(mgc_backend *be, const float *const *g, const int64_t *n, int64_t count,
                   double *out) {
    mgc_kspec k[OPT__N];
    CHECK(opt_specs(be, k, MGC_DT_F32));
    double *part = mgc_cuda_scratch(be, (SUMSQ_NB + 1) * sizeof(double));
    if (!part) return -1;
    double *res = part + SUMSQ_NB;
    int first = 1;
    for (int64_t at = 0; at < count;) {
        sq_list L;
        int nb, cnt = sq_table(&L, g, n, count, &at, &nb);
        if (nb == 0) continue;
        void *a1[] = {&part, &L, &cnt};
        CHECK(mgc_cuda_launch(be, &k[OPT_SUMSQ_PARTIAL], (unsigned)nb, 1, 1, 256, 0, a1));
        void *a2[] = {&res, &part, &nb, &first};
        CHECK(mgc_cuda_launch(be, &k[OPT_SUMSQ_FINAL], 1, 1, 1, 1024, 0, a2));
        first = 0;
    }
    if (first) {
        *out = 0.0;
        return 0;
    }
    return be->iface->download(be, out, res, sizeof *out);
}

/* backend.h zero_list: the ranges in sum-of-squares tables (optim.cuh zero_list), a launch a
 * table; base and bytes are the emulator's (it poisons them first). */
int mgc_cuda_zero_list(mgc_backend *be, void *base, size_t bytes, float *const *p,
                       const int64_t *n, int64_t count) {
    (void)base, (void)bytes;
    mgc_kspec k[OPT__N];
    CHECK(opt_specs(be, k, MGC_DT_F32));
    for (int64_t at = 0; at < count;) {
        sq_list L; /* optim.cuh's mgc_zl_list: the same layout, the pointers writable */
        int nb, cnt = sq_table(&L, (const float *const *)p, n, count, &at, &nb);
        if (nb == 0) continue;
        void *a[] = {&L, &cnt};
        CHECK(mgc_cuda_launch(be, &k[OPT_ZERO_LIST], (unsigned)nb, 1, 1, 256, 0, a));
    }
    return 0;
}

/* backend.h stores_fresh: the weight gradients, linear_wgrad's and grouped_linear_wgrad's dW
 * (cuda_ops_linear.c: their GEMMs at beta 0, which read no C, every row written; an expert
 * with no rows gets its zeros).  Their bias gradients may go through kernels that add. */
int mgc_cuda_stores_fresh(mgc_backend *be, const mgc_plan_op *op, int k) {
    (void)be;
    return (op->kind == MGC_POP_LINEAR_WGRAD || op->kind == MGC_POP_GROUPED_LINEAR_WGRAD) && k == 0;
}

/* AdamW in tables of up to AW_LIST tensors: a launch a table (element-wise, so any grid gives
 * the same bits). */
int mgc_cuda_adamw(mgc_backend *be, const mgc_adamw_tensor *t, int64_t count,
                   const mgc_adamw_step *s) {
    mgc_kspec k[OPT__N];
    int copy = 0;
    for (int64_t i = 0; i < count; i++)
        copy |= t[i].copy16 != NULL;
    CHECK(opt_specs(be, k, copy ? s->copy_dtype : MGC_DT_F32));
    double c1 = 1.0 - pow(s->beta1, (double)s->step), c2 = 1.0 - pow(s->beta2, (double)s->step);
    double lr = s->lr, b1 = s->beta1, b2 = s->beta2, eps = s->eps, gs = s->grad_scale;
    for (int64_t at = 0; at < count;) {
        aw_list L;
        memset(&L, 0, sizeof L);
        int cnt = 0;
        for (; at < count && cnt < AW_LIST; at++, cnt++) {
            const mgc_adamw_tensor *e = &t[at];
            L.p[cnt] = e->p, L.g[cnt] = e->g, L.m[cnt] = e->m, L.v[cnt] = e->v;
            L.copy[cnt] = e->copy16;
            L.n[cnt] = e->n > 0 ? e->n : 0;
            L.wd[cnt] = e->decay ? s->weight_decay : 0.0;
            L.c0[cnt + 1] = L.c0[cnt] + chunks_of(e->n);
        }
        int64_t total = L.c0[cnt];
        if (total == 0) continue;
        void *args[] = {&L, &cnt, &lr, &b1, &b2, &eps, &c1, &c2, &gs};
        CHECK(mgc_cuda_launch(be, &k[OPT_ADAMW], ew_grid(be, total * EW_BLOCK), 1, 1, EW_BLOCK, 0,
                              args));
    }
    return 0;
}

/* ---- the fold of a reduction on device memory (comm.h moves-only communicators) ----------- */

int mgc_cuda_fold(mgc_backend *be, void *dst, const void *src, int parts, size_t count,
                  size_t stride, int dt, int op) {
    if (!count) return 0;
    if (parts < 1 || (dt != MGC_DT_F32 && dt != MGC_DT_BF16 && dt != MGC_DT_F16))
        return mgc_cuda_fail(be, "fold: %d parts of %s", parts, mgc_dtype_name((mgc_dtype)dt));
    mgc_kspec k;
    mgc_kspec_fold(dt, &k);
    long long n = (long long)count, st = (long long)stride;
    void *args[] = {&dst, &src, &parts, &n, &st, &op};
    return mgc_cuda_launch(be, &k, ew_grid(be, (n + 7) / 8), 1, 1, EW_BLOCK, 0, args);
}
