/* cuda_ops_attention.c - launcher of the attention family (kernels/attention.cuh) for the
 * CUDA backend: the plan's ATTENTION and ATTENTION_BWD ops, mapped exactly as
 * cpu_backend.c op_attention maps them.
 *
 *   ATTENTION      in: q (sq,b,A,d), k, v (sk,b,G,d)   out: out (sq,b,A,d) [, lse (sq,b,A) fp32]
 *   ATTENTION_BWD  in: q, k, v, out, lse, dout          out: dq, dk, dv
 *   fused (MGC_POF_QKV): q, k, v are the projection qkv (s,b,G(A/G+2)d), read in place, and
 *   the backward's first output is dqkv (plan.h mgc_plan_attn_geom); with MGC_POF_COLSUM its
 *   second the projection's bias gradient db ((A+2G)d fp32, accumulated): db += colsum dqkv
 *   documents (MGC_POF_DOCS): one more input, last, doc_start (sq,b) int32
 *   fattr[0] scale, fattr[1] dropout p; iattr[0] causal, iattr[3] cp (layout of the rows)
 *
 * Positions (context parallelism) are computed inside the kernels from (seq_length, cp,
 * cp rank): queries are the rank's two chunks; keys the same rows when sk == sq, else the
 * all-gathered rows of every rank (cpu_backend.c ctx_positions / gathered_positions).  With
 * cp <= 1 rows are positions.  Dropout numbers its elements as the CPU does (backend.h
 * mgc_op_attn_drop_rng: the model's heads and the positions); the kernels read the stream's
 * step from device memory (mgc_cuda_drop_step).
 *
 * The tile sizes below repeat kernels/attention.cuh (ATT_FBQ, ATT_FBK_PP, ATT_BR, ATT_TBR, ATT_TBR_Q): keep
 * them equal.  They are functions of the width the kernels compute over, ATT_W: the head dim
 * rounded up to a multiple of 16 (kspec.h mgc_kspec_att_width). */
#include <math.h>
#include <stdint.h>
#include <stdio.h>

#include "cuda_int.h"
#include "rng.h"

static int fwd_bq(int64_t d, int half) {
    if (half) return d <= 64 ? 128 : 64;     /* ATT_FBQ: 64 * ATT_FMT */
    return d <= 64 ? 64 : (d <= 128 ? 32 : 16); /* ATT_FBQ (fp32) */
}
/* The 16-bit forward's K and V tiles past a width of 64 at 64 keys a step (ATT_FWD_DYN): two
 * buffers of each, rows of w + 8 halves, in dynamic shared memory (69,632 bytes at 128); the
 * keys a step as attention.cuh ATT_FBK_PP chooses them (kspec.h mgc_kspec_att_fwd_keys); none
 * in the one-buffer variant (constant FKVB 1: MGC_ATT_FWD_BUFS, or the twin), whose tiles are
 * static.  The kernel traps when given less (ATT_DYN_END_D). */
static size_t fwd_dyn_bytes(const mgc_kspec *k, int64_t w, int half) {
    if (!half || w <= 64 || w > 128 || mgc_kspec_get(k, "FKVB") == 1) return 0; /* one: static */
    return mgc_kspec_att_fwd_keys(k) == 64 ? (size_t)2 * 2 * 64 * (size_t)(w + 8) * 2 : 0;
}
static int bwd_br(int64_t d, int half) {
    if (half) return 64;                       /* ATT_TBR: tensor-core backward (ATT_TC_BWD) */
    return d <= 32 ? 64 : (d <= 64 ? 32 : 16); /* ATT_BR */
}
static int bwd_dq_rows(const mgc_kspec *k, int64_t d, int half) {
    /* ATT_TBR_Q: 64 * ATT_QMT, one m-tile at D 64 with dropout and positions computed */
    int droppos = mgc_kspec_get(k, "DROP") == 1 && mgc_kspec_get(k, "ROWPOS") == 0;
    if (half) return d < 64 || (d == 64 && !droppos) ? 128 : 64;
    return bwd_br(d, half); /* the SIMT dQ kernel: ATT_BR */
}

/* Head dims past 128 (ATT_DYN): the backward kernels' tiles in dynamic shared memory, the bytes
 * of their ATT_SHARED pieces (each a multiple of 16 here: w is).  16-bit: the dQ kernel's K and
 * V (one buffer of 16 rows) and Q and dO (64 rows), the dK/dV kernel's Q and dO (one buffer of
 * 16 rows) and K and V (64 rows), rows of w + 8 halves; fp32: both kernels' four tiles of 16
 * rows of w + 1 floats.  The kernels trap when given less (ATT_DYN_END).  84,480 and 65,792
 * bytes at 256: under the 99 KiB every sm_80+ GPU allows a block. */
static size_t bwd_dyn_bytes(int64_t w, int half) {
    if (w <= 128) return 0;
    return half ? (size_t)(2 * 16 + 2 * 64) * (size_t)(w + 8) * 2 : (size_t)4 * 16 * (size_t)(w + 1) * 4;
}
/* The 16-bit dK/dV kernel past a width of 64 to 128 (ATT_DKV_DYN): two buffers of its Q and dO
 * tiles of 16 rows beside K and V (64 rows), rows of w + 8 halves, in dynamic shared memory
 * (52,224 bytes at 128), unless kspec constant KVB (MGC_ATT_DKV_BUFS, or the twin) asks for
 * one buffer, which fits static shared memory; past 128, bwd_dyn_bytes'. */
static size_t dkv_dyn_bytes(const mgc_kspec *k, int64_t w, int half) {
    if (!half || w <= 64 || w > 128) return bwd_dyn_bytes(w, half);
    return mgc_kspec_get(k, "KVB") == 1 ? 0 : (size_t)(2 * 2 * 16 + 2 * 64) * (size_t)(w + 8) * 2;
}

/* The blocks a multiprocessor the kernels' launch bounds ask for (attention.cuh:
 * __launch_bounds__(ATT_NT, 2)) */
#define ATT_MIN_BLOCKS 2

/* The kernel to launch for spec k, *dyn its dynamic shared memory (dyn_of): k, or its twin
 * (kspec.h mgc_kspec_twin: one buffer where k has two, the same bits) where the device's
 * shared memory holds fewer blocks of k than its launch bounds ask for and more of the twin
 * (the GPUs with 100 KB a multiprocessor, sm_86, sm_89 and sm_120, at head dims past 64 to
 * 128); *tw holds the twin.  NULL with be->err. */
static const mgc_kspec *att_kernel(mgc_backend *be, const mgc_kspec *k, mgc_kspec *tw,
                                   size_t (*dyn_of)(const mgc_kspec *, int64_t, int), int64_t w,
                                   int half, size_t *dyn) {
    *dyn = dyn_of(k, w, half);
    if (!mgc_kspec_twin(k, tw)) return k;
    int nk = mgc_cuda_blocks_per_sm(be, k, 128, *dyn);
    if (nk < 0) return NULL;
    if (nk >= ATT_MIN_BLOCKS) return k;
    size_t dt = dyn_of(tw, w, half);
    int nt = mgc_cuda_blocks_per_sm(be, tw, 128, dt);
    if (nt < 0) return NULL;
    if (nt <= nk) return k;
    *dyn = dt;
    return tw;
}

int mgc_cuda_ops_attention(mgc_backend *be, const mgc_op_call *c) {
    const mgc_plan_op *op = c->op;
    if (op->kind != MGC_POP_ATTENTION && op->kind != MGC_POP_ATTENTION_BWD) return 1;
    mgc_attn_geom ag;
    if (mgc_plan_attn_geom(c->chunk, op, &ag))
        return mgc_cuda_fail(be, "attention '%s': malformed inputs", mgc_plan_strat(c->plan, op->name));
    int64_t sq = ag.sq, b = ag.b, A = ag.A, d = ag.d, sk = ag.sk, G = ag.G;
    int64_t cp = op->iattr[3] > 0 ? op->iattr[3] : 1;
    if (G <= 0 || A % G != 0 || b > 65535 || A > 65535 || sq >= INT32_MAX || sk >= INT32_MAX ||
        c->seq_length >= INT32_MAX || A * (c->grid_tp > 1 ? c->grid_tp : 1) > INT32_MAX)
        return mgc_cuda_fail(be, "attention '%s': unsupported shape sq=%lld sk=%lld b=%lld A=%lld G=%lld",
                             mgc_plan_strat(c->plan, op->name), (long long)sq, (long long)sk,
                             (long long)b, (long long)A, (long long)G);
    if (sq == 0 || sk == 0 || b == 0 || A == 0) return 0;

    mgc_kspec ks[MGC_KSPEC_MAX_PER_OP];
    char err[256];
    int n = mgc_kspecs_for_op(c->plan, c->chunk, op, ks, MGC_KSPEC_MAX_PER_OP, err, sizeof err);
    if (n < 0) return mgc_cuda_fail(be, "%s", err);
    if (n != (op->kind == MGC_POP_ATTENTION ? 1 : 2))
        return mgc_cuda_fail(be, "attention '%s': %d kernel specs", mgc_plan_strat(c->plan, op->name), n);

    /* arguments common to every kernel */
    int isq = (int)sq, isk = (int)sk, ib = (int)b, iA = (int)A, iG = (int)G;
    float scale = (float)op->fattr[0];
    if (!(scale > 0.0f) || scale == (float)INFINITY) /* the kernels take the row max unscaled */
        return mgc_cuda_fail(be, "attention '%s': softmax scale %g is not a positive number",
                             mgc_plan_strat(c->plan, op->name), op->fattr[0]);
    double pd = op->fattr[1];
    float drop_p = pd > 0 ? (float)pd : 0.0f;
    if (pd > 0 && drop_p <= 0.0f) drop_p = 1e-30f; /* p > 0 must stay > 0 */
    unsigned drop_thr = mgc_rng_drop_threshold(pd);
    float drop_scale = pd > 0 ? (float)(1.0 / (1.0 - pd)) : 1.0f;
    mgc_dropout_rng dr = mgc_op_attn_drop_rng(c, A);
    unsigned long long seed = dr.seed, stream = dr.stream;
    const unsigned long long *step = NULL;
    if (drop_p > 0.0f && !(step = mgc_cuda_drop_step(be, c, &stream))) return -1;
    unsigned long long elem0 = (unsigned long long)dr.head0 * (unsigned long long)dr.seq *
                               (unsigned long long)dr.seq;
    int drop_heads = (int)dr.heads;
    const int *qpos = NULL, *kpos = NULL; /* positions are computed on the device */
    /* data.reset_attention_mask: the queries' document starts (s_c, b) int32, the last input */
    const void *docs = op->flags & MGC_POF_DOCS ? c->in[op->n_in - 1] : NULL;
    int pos_s = (int)c->seq_length, pos_cp = (int)cp, pos_rank = (int)c->co.cp;
    int k_gathered = sk != sq;
    if (cp > 1 && (c->seq_length % (2 * cp) != 0 || (k_gathered && sk % cp != 0)))
        return mgc_cuda_fail(be, "attention '%s': seq_length %lld / sk %lld do not split over cp %lld",
                             mgc_plan_strat(c->plan, op->name), (long long)c->seq_length,
                             (long long)sk, (long long)cp);

    /* fused (MGC_POF_QKV): k and v start PER and PER + 1 heads into the projection's rows
     * (kernels/attention.cuh att_qH ...); the kernels stride over it */
    int qkv = ag.fused;
    size_t es = ks[0].dtype == MGC_DT_F32 ? 4 : 2, koff = (size_t)(A / G) * (size_t)d * es;
    if (op->kind == MGC_POP_ATTENTION) {
        void *out = c->out[0], *q = c->in[0];
        void *k = qkv ? (char *)q + koff : c->in[1], *v = qkv ? (char *)q + koff + (size_t)d * es : c->in[2];
        void *lse = op->n_out > 1 ? c->out[1] : NULL;
        if (!lse) {
            lse = mgc_cuda_scratch(be, (size_t)(sq * b * A) * sizeof(float));
            if (!lse) return -1;
        }
        void *args[] = {&out,      &lse,       &q,         &k,        &v,    &isq,   &isk,
                        &ib,       &iA,        &iG,        &scale,    &drop_p, &drop_thr,
                        &drop_scale, &seed,    &stream,    &step,     &elem0,    &drop_heads, &qpos, &kpos,
                        &docs,     &pos_s,     &pos_cp,    &pos_rank,  &k_gathered, &qkv};
        int64_t w = mgc_kspec_att_width(d);
        int half = ks[0].dtype != MGC_DT_F32, bq = fwd_bq(w, half);
        mgc_kspec tw;
        size_t dyn;
        const mgc_kspec *kf = att_kernel(be, &ks[0], &tw, fwd_dyn_bytes, w, half, &dyn);
        if (!kf) return -1;
        return mgc_cuda_launch(be, kf, (unsigned)((sq + bq - 1) / bq), (unsigned)b, (unsigned)A,
                               128, dyn, args);
    }

    /* backward: in q, k, v (or qkv), out, lse, dout; out dq, dk, dv (or dqkv) */
    int io = ag.in_out;
    void *q = c->in[0], *o = c->in[io], *lse = c->in[io + 1], *dout = c->in[io + 2];
    void *k = qkv ? (char *)q + koff : c->in[1], *v = qkv ? (char *)q + koff + (size_t)d * es : c->in[2];
    void *dq = c->out[0];
    void *dk = qkv ? (char *)dq + koff : c->out[1], *dv = qkv ? (char *)dq + koff + (size_t)d * es : c->out[2];
    /* the QKV projection's bias gradient (MGC_POF_COLSUM, fused qkv only): in 16 bits the
     * kernels (constant CS) write the column sums of each 64-row tile of dqkv they store, a row
     * of partials (b ceil(s / 64), (A + 2G) d), which norm_bwd_reduce adds into db in tile
     * order; in fp32 the bias-gradient kernels sum dqkv after them */
    float *db = qkv && (op->flags & MGC_POF_COLSUM) && op->n_out > 1 ? (float *)c->out[1] : NULL;
    int kcs = db && mgc_kspec_get(&ks[0], "CS") == 1;
    int64_t width = (A + 2 * G) * d;
    if (db && c->chunk->tensors[op->out[1]].bytes != (uint64_t)width * 4)
        return mgc_cuda_fail(be, "attention '%s': the bias gradient is not %lld floats",
                             mgc_plan_strat(c->plan, op->name), (long long)width);
    /* dsum = rowsum(dO o O) (sq, b, A) fp32: the dQ kernel writes it, the dK/dV kernel after
     * it reads it; then the partials */
    size_t dsum_bytes = (size_t)mgc_kspec_align((uint64_t)(sq * b * A) * sizeof(float));
    size_t cs_bytes = kcs ? (size_t)mgc_kspec_att_cs_bytes(sq, b, width) : 0;
    void *dsum = mgc_cuda_scratch(be, dsum_bytes + cs_bytes);
    if (!dsum) return -1;
    float *cs = kcs ? (float *)((char *)dsum + dsum_bytes) : NULL;
    void *a0[] = {&dq,      &dsum,     &o,       &q,        &k,          &v,     &dout,
                  &lse,     &isq,      &isk,     &ib,       &iA,         &iG,    &scale,
                  &drop_p,  &drop_thr, &drop_scale, &seed,  &stream,     &step,  &elem0, &drop_heads,
                  &qpos,    &kpos,     &docs,    &pos_s,    &pos_cp,     &pos_rank,   &k_gathered,
                  &qkv,     &cs};
    int64_t w = mgc_kspec_att_width(d);
    int half = ks[0].dtype != MGC_DT_F32;
    int bq = bwd_dq_rows(&ks[0], w, half);
    if (mgc_cuda_launch(be, &ks[0], (unsigned)((sq + bq - 1) / bq), (unsigned)b, (unsigned)A, 128,
                        bwd_dyn_bytes(w, half), a0))
        return -1;
    int br = bwd_br(w, half);
    void *a1[] = {&dk,      &dv,       &dsum,    &q,        &k,          &v,     &dout,
                  &lse,     &isq,      &isk,     &ib,       &iA,         &iG,    &scale,
                  &drop_p,  &drop_thr, &drop_scale, &seed,  &stream,     &step,  &elem0, &drop_heads,
                  &qpos,    &kpos,     &docs,    &pos_s,    &pos_cp,     &pos_rank,   &k_gathered,
                  &qkv,     &cs};
    mgc_kspec tw;
    size_t dyn;
    const mgc_kspec *kkv = att_kernel(be, &ks[1], &tw, dkv_dyn_bytes, w, half, &dyn);
    if (!kkv || mgc_cuda_launch(be, kkv, (unsigned)((sk + br - 1) / br) *
                                             (unsigned)mgc_kspec_att_dkv_slices(d, half),
                                (unsigned)b, (unsigned)G, 128, dyn, a1))
        return -1;
    if (!db) return 0;
    if (!kcs) return mgc_cuda_bias_grad(be, db, dq, ks[0].dtype, sq * b, width);
    mgc_kspec red;
    mgc_kspec_init(&red, "norm.cuh", "norm_bwd_reduce", 0);
    float *none = NULL;
    int nb = (int)(b * ((sq + MGC_KSPEC_ATT_CS_ROWS - 1) / MGC_KSPEC_ATT_CS_ROWS));
    void *a2[] = {&db, &none, &none, &cs, &nb, &width};
    return mgc_cuda_launch(be, &red, (unsigned)((width + 31) / 32), 1, 1, 1024, 0, a2);
}
