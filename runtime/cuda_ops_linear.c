/* cuda_ops_linear.c - the linear family for the CUDA backend and the CUDA emulator: the
 * GEMMs of the linear and grouped (MoE expert) ops through the backend's GEMM (cuBLASLt on
 * the GPU) with its epilogues where they help, the kernels around them (a bias the epilogue
 * cannot add, deterministic bias gradients, the unfused GELU halves); and what every
 * launcher calls (mgc_cuda_launch, mgc_cuda_scratch, ...) through the backend's
 * mgc_cuda_host table, and the op dispatch (mgc_cuda_run_op). */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_int.h"
#include "rng.h"

static mgc_cuda_host *host(mgc_backend *be) {
    return (mgc_cuda_host *)be->context;
}

int mgc_cuda_fail(mgc_backend *be, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(be->err, sizeof be->err, fmt, ap);
    va_end(ap);
    return -1;
}

int mgc_cuda_launch(mgc_backend *be, const mgc_kspec *k, unsigned gx, unsigned gy, unsigned gz,
                    unsigned block, size_t smem_bytes, void **args) {
    return host(be)->launch(be, k, gx, gy, gz, block, smem_bytes, args);
}

int mgc_cuda_blocks_per_sm(mgc_backend *be, const mgc_kspec *k, unsigned block, size_t smem_bytes) {
    return host(be)->blocks_per_sm(be, k, block, smem_bytes);
}

void *mgc_cuda_scratch(mgc_backend *be, size_t bytes) {
    return host(be)->scratch(be, bytes);
}

const unsigned long long *mgc_cuda_drop_step(mgc_backend *be, const mgc_op_call *c,
                                             unsigned long long *stream) {
    *stream ^= mgc_rng_step_mix(c->iteration);
    return host(be)->step(be, c->iteration);
}

int mgc_cuda_sm_count(mgc_backend *be) {
    return host(be)->sms;
}

#define LIN_BIAS_RANK0 16

static const mgc_plan_tensor *T_in(const mgc_op_call *c, int i) {
    return &c->chunk->tensors[c->op->in[i]];
}
static const mgc_plan_tensor *T_out(const mgc_op_call *c, int i) {
    return &c->chunk->tensors[c->op->out[i]];
}

/* A deterministic bias gradient: db (N, fp32) += column sums of dy (M, N), in row partitions
 * of about 32 rows (kernels/gemm_aux.cuh; the partition by M alone) whose sums are then added
 * in a fixed order by the norm backward's reduce kernel (norm.cuh norm_bwd_reduce: 32 lanes of
 * partitions, then the lanes in order), which spreads them over ceil(N / 32) blocks. */
int mgc_cuda_bias_grad(mgc_backend *be, float *db, const void *dy, int dy_dtype, int64_t M,
                       int64_t N) {
    mgc_kspec k[2];
    mgc_kspec_init(&k[0], "gemm_aux.cuh", "bias_grad_partial", dy_dtype);
    mgc_kspec_init(&k[1], "norm.cuh", "norm_bwd_reduce", 0);
    if (M <= 0 || N <= 0) return 0;
    int64_t RP, chunks = mgc_kspec_bias_grad_parts(M, &RP);
    float *part = mgc_cuda_scratch(be, (size_t)(chunks * N) * sizeof(float));
    if (!part) return -1;
    int vec = N % 8 == 0 && (uintptr_t)dy % 16 == 0;
    void *a1[] = {&part, (void *)&dy, &M, &N, &RP, &vec};
    if (mgc_cuda_launch(be, &k[0], (unsigned)((N + 255) / 256), (unsigned)chunks, 1, 256, 0, a1))
        return -1;
    float *none = NULL;
    int nb = (int)chunks;
    void *a2[] = {&db, &none, &none, &part, &nb, &N};
    return mgc_cuda_launch(be, &k[1], (unsigned)((N + 31) / 32), 1, 1, 1024, 0, a2);
}

/* The plan's op as another kind on the same call (a fused op's unfused half). */
static int run_as(mgc_backend *be, const mgc_op_call *c, mgc_plan_op_kind kind, int n_in,
                  const int32_t *in, void *const *in_ptr, int n_out, const int32_t *out,
                  void *const *out_ptr) {
    mgc_plan_op op = *c->op;
    mgc_op_call call = *c;
    op.kind = (uint16_t)kind;
    op.n_in = (uint16_t)n_in, op.n_out = (uint16_t)n_out;
    for (int i = 0; i < n_in; i++) op.in[i] = in[i], call.in[i] = in_ptr[i];
    for (int i = 0; i < n_out; i++) op.out[i] = out[i], call.out[i] = out_ptr[i];
    call.op = &op;
    return mgc_cuda_ops_pointwise(be, &call);
}

/* y (M,N) = x (M,K) W (N,K)^T (+ bias), the GEMM of linear and linear_gelu: with
 * gelu_out, cuBLASLt's GELU_AUX(_BIAS) epilogue writes gelu(h) there and h to y (1 when it
 * cannot: the caller then applies the gelu kernel).  The bias goes to the epilogue when its
 * type allows, else to the bias_add kernel. */
static int linear_fwd(mgc_backend *be, const mgc_op_call *c, void *y, const mgc_plan_tensor *ty,
                      void *gelu_out) {
    const mgc_plan_op *op = c->op;
    int64_t M = op->iattr[0], N = op->iattr[1], K = op->iattr[2];
    const void *bias = op->n_in > 2 ? c->in[2] : NULL;
    if ((op->iattr[3] & LIN_BIAS_RANK0) && c->co.tp != 0) bias = NULL;
    int want_bias = bias != NULL;
    int bt = bias ? T_in(c, 2)->dtype : 0;
    int yt = ty->dtype;
    /* cuBLASLt's bias epilogue wants the bias in the output type (or compute type) */
    if (bias && bt != yt && yt != MGC_DT_F32) bias = NULL;
    mgc_gemm_epi ep = {bias ? MGC_GEMM_EPI_BIAS : MGC_GEMM_EPI_NONE, bias, bt, NULL, 0, 0};
    void *d = y;
    if (gelu_out) {
        if (want_bias && !bias) return 1; /* the bias would come after the GELU */
        ep.kind = bias ? MGC_GEMM_EPI_GELU_AUX_BIAS : MGC_GEMM_EPI_GELU_AUX;
        ep.aux = y, ep.aux_ld = N, ep.aux_type = yt;
        d = gelu_out;
    }
    int rc = host(be)->gemm(be, 1, 0, N, M, K, c->in[1], K, T_in(c, 1)->dtype, c->in[0], K,
                  T_in(c, 0)->dtype, d, N, yt, 0.0f, &ep);
    if (rc || gelu_out || !want_bias || bias) return rc;
    mgc_kspec k;
    mgc_kspec_init(&k, "gemm_aux.cuh", "bias_add", ty->dtype);
    void *b = c->in[2];
    void *a[] = {&y, &b, &M, &N};
    return mgc_cuda_launch(be, &k, (unsigned)((M * N + 255) / 256), 1, 1, 256, 0, a);
}

/* The fused epilogues (GELU, DGELU, BGRADB) run in 16-bit plans only, where their rounding
 * hides in the storage type's; an fp32 plan keeps the kernels that do the CPU's arithmetic
 * (the element-wise GELU, the bias gradient summed row by row). */
static int use_epilogue(const mgc_cuda_host *cx, const mgc_plan_tensor *t) {
    return cx->epilogues && t->dtype != MGC_DT_F32;
}

/* Where an epilogue (BGRADB, DGELU_BGRAD) writes the column sums of a bias gradient out[k] (N,
 * fp32, accumulated over microbatches): into out[k] itself when it holds zeros no op of the
 * step has written (mgc_op_call.fresh; 16-byte aligned, as the flat parameter layout's
 * 128-element alignment gives), *store then 1; else into scratch, which bias_finish adds. */
static int bias_dest(mgc_backend *be, const mgc_op_call *c, int k, int64_t N, float **part,
                     int *store) {
    *store = (c->fresh >> k & 1u) && !((uintptr_t)c->out[k] & 15u);
    *part = *store ? (float *)c->out[k] : mgc_cuda_scratch(be, (size_t)N * sizeof(float));
    return *part ? 0 : -1;
}

/* The bias gradient db (N) after its GEMM: the epilogue's sums in part (NULL: it had no
 * algorithm, or none was asked for) added by bias_grad_finish unless stored in db itself,
 * else mgc's kernels over dy (M, N). */
static int bias_finish(mgc_backend *be, float *db, float *part, int store, const void *dy,
                       int dy_dtype, int64_t M, int64_t N) {
    if (!part) return mgc_cuda_bias_grad(be, db, dy, dy_dtype, M, N);
    if (store) return 0; /* the epilogue wrote db */
    mgc_kspec k;
    mgc_kspec_init(&k, "gemm_aux.cuh", "bias_grad_finish", dy_dtype);
    int64_t one = 1;
    void *a[] = {&db, &part, &one, &N};
    return mgc_cuda_launch(be, &k, (unsigned)((N + 255) / 256), 1, 1, 256, 0, a);
}

static int op_linear(mgc_backend *be, const mgc_op_call *c) {
    mgc_cuda_host *cx = host(be);
    const mgc_plan_op *op = c->op;
    int64_t M = op->iattr[0], N = op->iattr[1], K = op->iattr[2];
    /* dy's row pitch: N, or more for the logits' gradient written in place (plan.h ld) */
    int grad = op->kind != MGC_POP_LINEAR && op->kind != MGC_POP_LINEAR_GELU;
    int64_t ldy = grad ? mgc_plan_tensor_ld(T_in(c, 0)) : N;
    if (ldy != N && (op->kind == MGC_POP_LINEAR_DGRAD_GELU || op->n_out > 1 || ldy < N))
        return mgc_cuda_fail(be, "%s '%s': dy has a row pitch of %lld for %lld columns",
                             mgc_plan_op_name((mgc_plan_op_kind)op->kind),
                             mgc_plan_strat(c->plan, op->name), (long long)ldy, (long long)N);
    switch (op->kind) {
    case MGC_POP_LINEAR: /* y (M,N) = x (M,K) W (N,K)^T + bias */
        return linear_fwd(be, c, c->out[0], T_out(c, 0), NULL);
    case MGC_POP_LINEAR_GELU: { /* out y = gelu(h), h */
        if (use_epilogue(cx, T_out(c, 0))) {
            int rc = linear_fwd(be, c, c->out[1], T_out(c, 1), c->out[0]);
            if (rc <= 0) return rc;
        }
        if (linear_fwd(be, c, c->out[1], T_out(c, 1), NULL)) return -1;
        int32_t in = op->out[1], out = op->out[0];
        return run_as(be, c, MGC_POP_GELU, 1, &in, &c->out[1], 1, &out, &c->out[0]);
    }
    case MGC_POP_LINEAR_DGRAD:      /* dx (M,K) = dy (M,N) W (N,K) */
    case MGC_POP_LINEAR_DGRAD_GELU: { /* dh = gelu'(h) (dy W), h the third input; with
                                         MGC_POF_COLSUM db += the column sums of dh */
        const mgc_gemm_epi none = {MGC_GEMM_EPI_NONE, NULL, 0, NULL, 0, 0};
        mgc_gemm_epi ep = none;
        int fused = op->kind == MGC_POP_LINEAR_DGRAD_GELU, rc, store = 0;
        float *db = fused && (op->flags & MGC_POF_COLSUM) && op->n_out > 1 ? c->out[1] : NULL,
              *part = NULL;
        const mgc_gemm_epi dgelu = {MGC_GEMM_EPI_DGELU, NULL, 0, c->in[2], K, T_in(c, 2)->dtype};
        if (fused && use_epilogue(cx, T_out(c, 0))) {
            ep = dgelu;
            /* cuBLASLt's DGELU_BGRAD: the sums of dh's columns as the GEMM writes them */
            if (db && cx->bgrad_epilogue) {
                if (bias_dest(be, c, 1, K, &part, &store)) return -1;
                ep.kind = MGC_GEMM_EPI_DGELU_BGRAD, ep.bias = part, ep.bias_type = MGC_DT_F32;
            }
        }
        /* 1: cuBLASLt has no algorithm with the epilogue: DGELU alone then, then the plain
         * GEMM (never 1) */
        while ((rc = host(be)->gemm(be, 0, 0, K, M, N, c->in[1], K, T_in(c, 1)->dtype, c->in[0], ldy,
                          T_in(c, 0)->dtype, c->out[0], K, T_out(c, 0)->dtype, 0.0f,
                          &ep)) == 1)
            ep = ep.kind == MGC_GEMM_EPI_DGELU_BGRAD ? dgelu : none;
        if (rc || !fused) return rc;
        if (!ep.aux) {
            /* gelu_bwd in place: dh = gelu'(h) dh (pointwise.cuh allows dx == dy) */
            int32_t in[2] = {op->in[2], op->out[0]}, out = op->out[0];
            void *inp[2] = {c->in[2], c->out[0]};
            if (run_as(be, c, MGC_POP_GELU_BWD, 2, in, inp, 1, &out, &c->out[0])) return -1;
        }
        if (!db) return 0;
        return bias_finish(be, db, ep.bias ? part : NULL, store, c->out[0], T_out(c, 0)->dtype, M,
                           K);
    }
    default: { /* WGRAD: dW (N,K) += dy^T x; db += colsum dy */
        const mgc_gemm_epi none = {MGC_GEMM_EPI_NONE, NULL, 0, NULL, 0, 0};
        mgc_gemm_epi ep = none;
        float *part = NULL;
        int store = 0;
        if (op->n_out > 1 && cx->bgrad_epilogue && use_epilogue(cx, T_in(c, 0))) {
            /* cuBLASLt's BGRADB writes the column sums of dy (the GEMM's B) */
            if (bias_dest(be, c, 1, N, &part, &store)) return -1;
            ep = (mgc_gemm_epi){MGC_GEMM_EPI_BGRADB, part, MGC_DT_F32, NULL, 0, 0};
        }
        /* dW holds zeros no op of the step has written: beta 0 spares the GEMM its read of
         * them, by beta 1's algorithm (as_beta1), so with the bits of adding into them */
        int wfresh = (c->fresh & 1u) != 0;
        ep.as_beta1 = wfresh;
        int rc;
        /* 1: cuBLASLt has no BGRADB algorithm; the plain GEMM (never 1) and the kernels then */
        while ((rc = host(be)->gemm(be, 0, 1, K, N, M, c->in[1], K, T_in(c, 1)->dtype, c->in[0], ldy,
                          T_in(c, 0)->dtype, c->out[0], K, T_out(c, 0)->dtype, wfresh ? 0.0f : 1.0f,
                          &ep)) == 1) {
            ep = none;
            ep.as_beta1 = wfresh;
        }
        if (rc) return -1;
        if (op->n_out < 2) return 0;
        return bias_finish(be, (float *)c->out[1], ep.bias ? part : NULL, store, c->in[0],
                           T_in(c, 0)->dtype, M, N);
    }
    }
}

/* Grouped (MoE experts): per-expert GEMMs over the rows each expert received
 * (counts read back from the device: the sizes are data dependent). */
static int op_grouped(mgc_backend *be, const mgc_op_call *c) {
    const mgc_plan_op *op = c->op;
    int64_t N = op->iattr[1], K = op->iattr[2];
    const mgc_plan_tensor *w = op->kind == MGC_POP_GROUPED_LINEAR_WGRAD ? T_out(c, 0) : T_in(c, 1);
    int64_t E_l = w->dim[0];
    int64_t *cnt = malloc((size_t)E_l * sizeof *cnt);
    if (!cnt) return mgc_cuda_fail(be, "out of memory");
    if (be->iface->download(be, cnt, c->in[2], (size_t)E_l * 8)) {
        free(cnt);
        return -1;
    }
    size_t xs = mgc_dtype_size((mgc_dtype)T_in(c, 0)->dtype);
    /* the experts' biases (E_l,N): added by bias_add after each expert's GEMM (a row-parallel
     * one on expert-tensor rank 0 only); their gradients summed by mgc_cuda_bias_grad, expert
     * by expert */
    const char *bias = op->kind == MGC_POP_GROUPED_LINEAR && op->n_in > 3 ? c->in[3] : NULL;
    if ((op->iattr[3] & LIN_BIAS_RANK0) && c->co.etp != 0) bias = NULL;
    float *db = op->kind == MGC_POP_GROUPED_LINEAR_WGRAD && op->n_out > 1 ? c->out[1] : NULL;
    mgc_kspec badd;
    if (bias) {
        if (T_in(c, 3)->dtype != T_out(c, 0)->dtype) {
            free(cnt);
            return mgc_cuda_fail(be, "grouped_linear '%s': a %s bias for %s outputs",
                                 mgc_plan_strat(c->plan, op->name),
                                 mgc_dtype_name((mgc_dtype)T_in(c, 3)->dtype),
                                 mgc_dtype_name((mgc_dtype)T_out(c, 0)->dtype));
        }
        mgc_kspec_init(&badd, "gemm_aux.cuh", "bias_add", T_out(c, 0)->dtype);
    }
    int rc = 0;
    int64_t row = 0;
    /* dW holds no step's write yet (mgc_op_call.fresh): each expert's GEMM at beta 0 by beta
     * 1's algorithm (as op_linear's), and an expert that received no rows gets its zeros
     * written, so that dW is stored whole (mgc_cuda_stores_fresh) */
    const int wfresh = op->kind == MGC_POP_GROUPED_LINEAR_WGRAD && (c->fresh & 1u);
    mgc_gemm_epi wep = {MGC_GEMM_EPI_NONE, NULL, 0, NULL, 0, 0};
    wep.as_beta1 = wfresh;
    for (int64_t e = 0; e < E_l && !rc; e++) {
        int64_t r = cnt[e];
        size_t ws = mgc_dtype_size((mgc_dtype)w->dtype);
        if (r <= 0 && wfresh) {
            char *dw = (char *)c->out[0] + (size_t)(e * N * K) * ws;
            rc = be->iface->zero(be, dw, (size_t)(N * K) * ws);
        }
        if (r <= 0) continue;
        if (op->kind == MGC_POP_GROUPED_LINEAR) {
            const char *x = (const char *)c->in[0] + (size_t)(row * K) * xs;
            char *y = (char *)c->out[0] + (size_t)(row * N) * mgc_dtype_size((mgc_dtype)T_out(c, 0)->dtype);
            rc = host(be)->gemm(be, 1, 0, N, r, K, (const char *)c->in[1] + (size_t)(e * N * K) * ws, K,
                      w->dtype, x, K, T_in(c, 0)->dtype, y, N, T_out(c, 0)->dtype,
                      0.0f, NULL);
            if (!rc && bias) {
                const void *bp = bias + (size_t)(e * N) * mgc_dtype_size((mgc_dtype)T_in(c, 3)->dtype);
                void *a[] = {&y, (void *)&bp, &r, (void *)&N};
                rc = mgc_cuda_launch(be, &badd, (unsigned)((r * N + 255) / 256), 1, 1, 256, 0, a);
            }
        } else if (op->kind == MGC_POP_GROUPED_LINEAR_DGRAD) { /* in dy (rows,N), W; out dx (rows,K) */
            const char *dy = (const char *)c->in[0] + (size_t)(row * N) * xs;
            char *dx = (char *)c->out[0] + (size_t)(row * K) * mgc_dtype_size((mgc_dtype)T_out(c, 0)->dtype);
            rc = host(be)->gemm(be, 0, 0, K, r, N, (const char *)c->in[1] + (size_t)(e * N * K) * ws, K,
                      w->dtype, dy, N, T_in(c, 0)->dtype, dx, K,
                      T_out(c, 0)->dtype, 0.0f, NULL);
        } else { /* in dy (rows,N), x (rows,K); out dW (E_l,N,K) fp32 += */
            const char *dy = (const char *)c->in[0] + (size_t)(row * N) * xs;
            const char *x = (const char *)c->in[1] + (size_t)(row * K) * mgc_dtype_size((mgc_dtype)T_in(c, 1)->dtype);
            rc = host(be)->gemm(be, 0, 1, K, N, r, x, K, T_in(c, 1)->dtype, dy, N, T_in(c, 0)->dtype,
                      (char *)c->out[0] + (size_t)(e * N * K) * ws, K, w->dtype,
                      wfresh ? 0.0f : 1.0f, &wep);
            if (!rc && db) rc = mgc_cuda_bias_grad(be, db + e * N, dy, T_in(c, 0)->dtype, r, N);
        }
        row += r;
    }
    free(cnt);
    return rc;
}

int mgc_cuda_ops_linear(mgc_backend *be, const mgc_op_call *c) {
    switch ((mgc_plan_op_kind)c->op->kind) {
    case MGC_POP_LINEAR:
    case MGC_POP_LINEAR_GELU:
    case MGC_POP_LINEAR_DGRAD:
    case MGC_POP_LINEAR_DGRAD_GELU:
    case MGC_POP_LINEAR_WGRAD: return op_linear(be, c);
    case MGC_POP_GROUPED_LINEAR:
    case MGC_POP_GROUPED_LINEAR_DGRAD:
    case MGC_POP_GROUPED_LINEAR_WGRAD: return op_grouped(be, c);
    default: return 1;
    }
}

int mgc_cuda_run_op(mgc_backend *be, const mgc_op_call *c) {
    int r = mgc_cuda_ops_linear(be, c);
    if (r == 1) r = mgc_cuda_ops_attention(be, c);
    if (r == 1) r = mgc_cuda_ops_moe(be, c);
    if (r == 1) r = mgc_cuda_ops_pointwise(be, c);
    if (r == 1)
        return mgc_cuda_fail(be, "no launcher for op %s '%s'",
                             mgc_plan_op_name((mgc_plan_op_kind)c->op->kind),
                             mgc_plan_strat(c->plan, c->op->name));
    return r;
}
