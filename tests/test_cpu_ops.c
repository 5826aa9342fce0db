/* test_cpu_ops.c - the CPU reference kernels against finite differences, naive references,
 * hand-computed values and themselves.
 *
 *  - every backward: central finite differences in float64 of L = sum r * y (r random) on
 *    fresh random non-zero inputs of odd sizes; the analytic gradient of every input and
 *    parameter must match normwise: max|g - fd| <= 1e-6 max|fd| (eps 1e-5);
 *  - every forward: the f32 kernel against the f64 kernel on the same (float-exact) inputs,
 *    normwise rel 1e-5;
 *  - outputs are NaN-poisoned before each kernel call (a skipped element shows up);
 *    parameter gradients start from random values (they accumulate);
 *  - attention against a naive reference written here; cross-entropy with tp = 2 simulated
 *    against tp = 1; AdamW against a hand-computed step; f32 runs repeated bit-identical.
 * The seed is time-based and printed; MGC_TEST_SEED=<n> replays a run. */
#include <stdint.h>
#include <stdlib.h>
#include <time.h>

#include "cpu_ops.h"
#include "testlib.h"

/* ---- helpers -------------------------------------------------------------------------- */

static uint64_t rng_state;
static uint64_t next_u64(void) { /* splitmix64 */
    uint64_t z = (rng_state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}
/* uniform in [-1, 1) less (-1e-3, 1e-3), rounded to float so the f32 kernels see the same
 * inputs: never 0 */
static double urand(void) {
    double u;
    do
        u = (double)(next_u64() >> 11) * (1.0 / 9007199254740992.0) * 2.0 - 1.0;
    while (fabs(u) < 1e-3);
    return (double)(float)u;
}
static int64_t irand(int64_t n) {
    return (int64_t)(next_u64() % (uint64_t)n);
}

#define MAX_ALLOCS 4096
static void *allocs[MAX_ALLOCS];
static int n_allocs;
static void *talloc(size_t bytes) {
    void *p = calloc(bytes ? bytes : 1, 1);
    if (!p || n_allocs == MAX_ALLOCS) {
        fprintf(stderr, "test_cpu_ops: out of memory\n");
        exit(2);
    }
    allocs[n_allocs++] = p;
    return p;
}
static void tfree_all(void) {
    while (n_allocs)
        free(allocs[--n_allocs]);
}
static double *D(int64_t n) {
    return talloc((size_t)n * sizeof(double));
}
static double *Drand(int64_t n) {
    double *x = D(n);
    for (int64_t i = 0; i < n; i++)
        x[i] = urand();
    return x;
}
static double *Dcopy(const double *x, int64_t n) {
    double *y = D(n);
    memcpy(y, x, (size_t)n * sizeof(double));
    return y;
}
static float *F(const double *x, int64_t n) { /* float copy */
    float *y = talloc((size_t)n * sizeof(float));
    for (int64_t i = 0; i < n; i++)
        y[i] = (float)x[i];
    return y;
}
static float *Fn(int64_t n) {
    return talloc((size_t)n * sizeof(float));
}
static int32_t *I(int64_t n) {
    return talloc((size_t)n * sizeof(int32_t));
}
static void pd(double *x, int64_t n) {
    for (int64_t i = 0; i < n; i++)
        x[i] = NAN;
}
static void pf(float *x, int64_t n) {
    for (int64_t i = 0; i < n; i++)
        x[i] = NAN;
}
static double dot(const double *a, const double *b, int64_t n) {
    double s = 0;
    for (int64_t i = 0; i < n; i++)
        s += a[i] * b[i];
    return s;
}
static double *Dsub(const double *a, const double *b, int64_t n) { /* a - b */
    double *y = D(n);
    for (int64_t i = 0; i < n; i++)
        y[i] = a[i] - b[i];
    return y;
}

/* No NaN left by a kernel in an output that was poisoned. */
static void no_nan_d(const char *what, const double *x, int64_t n) {
    int64_t bad = 0;
    for (int64_t i = 0; i < n; i++)
        bad += isnan(x[i]) != 0;
    t_checks++;
    if (bad) {
        t_failed++;
        fprintf(stderr, "%s: %lld elements left unwritten (NaN)\n", what, (long long)bad);
    }
}
static void no_nan_f(const char *what, const float *x, int64_t n) {
    int64_t bad = 0;
    for (int64_t i = 0; i < n; i++)
        bad += isnan(x[i]) != 0;
    t_checks++;
    if (bad) {
        t_failed++;
        fprintf(stderr, "%s: %lld elements left unwritten (NaN)\n", what, (long long)bad);
    }
}

/* normwise: max|a - b| <= tol * max|b| */
static void near_d(const char *what, const double *a, const double *b, int64_t n, double tol) {
    double err = 0, ref = 0;
    for (int64_t i = 0; i < n; i++) {
        double e = fabs(a[i] - b[i]);
        if (!(e <= err)) err = e; /* NaN propagates */
        if (fabs(b[i]) > ref) ref = fabs(b[i]);
    }
    t_checks++;
    if (!(err <= tol * ref) && !(ref == 0 && err == 0)) {
        t_failed++;
        fprintf(stderr, "%s: max err %.3g vs max ref %.3g (rel %.3g > %.1g)\n", what, err, ref,
                err / (ref > 0 ? ref : 1), tol);
    }
}
static void near_fd(const char *what, const float *a, const double *b, int64_t n, double tol) {
    no_nan_f(what, a, n);
    double *ad = D(n);
    for (int64_t i = 0; i < n; i++)
        ad[i] = a[i];
    near_d(what, ad, b, n, tol);
}
#define F32_TOL 1e-5
#define FD_TOL  1e-6
#define FD_EPS  1e-5

/* ---- finite differences --------------------------------------------------------------- */

typedef struct fd_out {
    double *y;       /* output the forward writes */
    const double *r; /* its random projection */
    int64_t n;
} fd_out;

typedef struct fd_case {
    void (*fwd)(void *ctx);
    void *ctx;
    fd_out out[4];
    int n_out;
} fd_case;

static double fd_loss(fd_case *c) {
    for (int o = 0; o < c->n_out; o++)
        pd(c->out[o].y, c->out[o].n);
    c->fwd(c->ctx);
    double L = 0;
    for (int o = 0; o < c->n_out; o++)
        L += dot(c->out[o].y, c->out[o].r, c->out[o].n);
    return L;
}

/* compares the analytic gradient g of input x (n) with central differences of L */
static void fd_check(const char *what, fd_case *c, double *x, int64_t n, const double *g) {
    double *fd = D(n);
    int64_t stride = n > 1500 ? n / 1500 + 1 : 1; /* big tensors: a fixed sample */
    double *gs = D(n);
    int64_t m = 0;
    for (int64_t i = 0; i < n; i += stride) {
        double x0 = x[i];
        x[i] = x0 + FD_EPS;
        double lp = fd_loss(c);
        x[i] = x0 - FD_EPS;
        double lm = fd_loss(c);
        x[i] = x0;
        fd[m] = (lp - lm) / (2 * FD_EPS);
        gs[m++] = g[i];
    }
    fd_loss(c); /* leave the outputs of the unperturbed inputs */
    char buf[160];
    snprintf(buf, sizeof buf, "fd %s", what);
    no_nan_d(buf, g, n);
    near_d(buf, gs, fd, m, FD_TOL);
}

/* f32 determinism: two runs bit-identical */
static void same_bits(const char *what, const void *a, const void *b, size_t bytes) {
    t_checks++;
    if (memcmp(a, b, bytes) != 0) {
        t_failed++;
        fprintf(stderr, "%s: two runs differ\n", what);
    }
}

/* ---- embedding ------------------------------------------------------------------------ */

typedef struct emb_ctx {
    double *out, *wte, *wpe;
    int32_t *tok, *pos;
    int64_t v0, V_l, s, b, h;
    int32_t *docs;
} emb_ctx;
static void emb_fwd(void *p) {
    emb_ctx *c = p;
    mgc_cpu_embedding_fwd_f64(c->out, c->tok, c->wte, c->v0, c->V_l, c->wpe, c->pos, c->docs, c->s,
                              c->b, c->h);
}

/* Learned positions from the rows' document starts (reset_position_ids): every row's output
 * by hand, and both gradients against finite differences (several rows share a position). */
static void test_embedding_docs(void) {
    int64_t s = 7, b = 3, h = 5, V = 11, P = 9, n = s * b;
    int32_t *tok = I(n), *pos = I(s), *docs = I(n);
    for (int64_t i = 0; i < n; i++)
        tok[i] = (int32_t)irand(V);
    for (int64_t i = 0; i < s; i++)
        pos[i] = (int32_t)(i + 1);
    for (int64_t r = 0; r < n; r++)
        docs[r] = (int32_t)irand((uint64_t)pos[r / b] + 1); /* a start at or before the row */
    double *wte = Drand(V * h), *wpe = Drand(P * h), *r = Drand(n * h), *out = D(n * h);
    emb_ctx c = {out, wte, wpe, tok, pos, 0, V, s, b, h, docs};
    fd_case fc = {emb_fwd, &c, {{out, r, n * h}}, 1};
    fd_loss(&fc);
    for (int64_t q = 0; q < n; q++) {
        int64_t p = pos[q / b] - docs[q];
        for (int64_t k = 0; k < h; k++)
            T_CHECK(out[q * h + k] == wte[tok[q] * h + k] + wpe[p * h + k]);
    }
    double *gw0 = Drand(V * h), *gp0 = Drand(P * h);
    double *gw = Dcopy(gw0, V * h), *gp = Dcopy(gp0, P * h);
    mgc_cpu_embedding_bwd_f64(gw, gp, r, tok, 0, V, pos, docs, s, b, h);
    fd_check("embedding documents dwte", &fc, wte, V * h, Dsub(gw, gw0, V * h));
    fd_check("embedding documents dwpe", &fc, wpe, P * h, Dsub(gp, gp0, P * h));
    tfree_all();
}

static void test_embedding(void) {
    int64_t s = 7, b = 3, h = 5, V = 11, P = 9, n = s * b;
    int32_t *tok = I(n), *pos = I(s);
    for (int64_t i = 0; i < n; i++)
        tok[i] = (int32_t)irand(V);
    for (int64_t i = 0; i < s; i++)
        pos[i] = (int32_t)((i * 2 + 1) % P); /* non-trivial ids */
    double *wte = Drand(V * h), *wpe = Drand(P * h), *r = Drand(n * h), *out = D(n * h);
    emb_ctx c = {out, wte, wpe, tok, pos, 0, V, s, b, h, NULL};
    fd_case fc = {emb_fwd, &c, {{out, r, n * h}}, 1};
    fd_loss(&fc);
    no_nan_d("embedding fwd", out, n * h);
    double *gw0 = Drand(V * h), *gp0 = Drand(P * h);
    double *gw = Dcopy(gw0, V * h), *gp = Dcopy(gp0, P * h);
    mgc_cpu_embedding_bwd_f64(gw, gp, r, tok, 0, V, pos, NULL, s, b, h);
    fd_check("embedding dwte", &fc, wte, V * h, Dsub(gw, gw0, V * h));
    fd_check("embedding dwpe", &fc, wpe, P * h, Dsub(gp, gp0, P * h));

    /* vocab-parallel, tp = 2 (V_l 5 and 6), positions on rank 0 only: the sum is the whole */
    double *o0 = D(n * h), *o1 = D(n * h), *sum = D(n * h);
    pd(o0, n * h);
    pd(o1, n * h);
    mgc_cpu_embedding_fwd_f64(o0, tok, wte, 0, 5, wpe, pos, NULL, s, b, h);
    mgc_cpu_embedding_fwd_f64(o1, tok, wte + 5 * h, 5, V - 5, NULL, pos, NULL, s, b, h);
    for (int64_t i = 0; i < n * h; i++)
        sum[i] = o0[i] + o1[i];
    near_d("embedding tp2 = tp1", sum, out, n * h, 1e-15);
    double *g0 = D(V * h);
    mgc_cpu_embedding_bwd_f64(g0, NULL, r, tok, 0, 5, pos, NULL, s, b, h);
    mgc_cpu_embedding_bwd_f64(g0 + 5 * h, NULL, r, tok, 5, V - 5, pos, NULL, s, b, h);
    near_d("embedding tp2 grad", g0, Dsub(gw, gw0, V * h), V * h, 1e-15);

    /* f32 */
    float *of = Fn(n * h), *of2 = Fn(n * h);
    pf(of, n * h);
    mgc_cpu_embedding_fwd_f32(of, tok, F(wte, V * h), 0, V, F(wpe, P * h), pos, NULL, s, b, h);
    near_fd("embedding f32 fwd", of, out, n * h, F32_TOL);
    float *gwf = F(gw0, V * h), *gwf2 = F(gw0, V * h), *rf = F(r, n * h);
    mgc_cpu_embedding_bwd_f32(gwf, NULL, rf, tok, 0, V, pos, NULL, s, b, h);
    mgc_cpu_embedding_bwd_f32(gwf2, NULL, rf, tok, 0, V, pos, NULL, s, b, h);
    near_fd("embedding f32 bwd", gwf, gw, V * h, F32_TOL);
    same_bits("embedding f32 bwd", gwf, gwf2, (size_t)(V * h) * sizeof(float));
    pf(of2, n * h);
    mgc_cpu_embedding_fwd_f32(of2, tok, F(wte, V * h), 0, V, F(wpe, P * h), pos, NULL, s, b, h);
    same_bits("embedding f32 fwd", of, of2, (size_t)(n * h) * sizeof(float));
    tfree_all();
}

/* ---- norms ---------------------------------------------------------------------------- */

typedef struct norm_ctx {
    double *y, *x, *w, *bias;
    int64_t n, h;
    int rms;
} norm_ctx;
static void norm_fwd(void *p) {
    norm_ctx *c = p;
    if (c->rms)
        mgc_cpu_rmsnorm_fwd_f64(c->y, NULL, c->x, c->w, c->n, c->h, 1e-5);
    else
        mgc_cpu_layernorm_fwd_f64(c->y, NULL, NULL, c->x, c->w, c->bias, c->n, c->h, 1e-5);
}

static void test_norm(int rms) {
    int64_t n = 13, h = 9;
    const char *nm = rms ? "rmsnorm" : "layernorm";
    char buf[64];
    double *x = Drand(n * h), *w = Drand(h), *bias = Drand(h), *r = Drand(n * h), *y = D(n * h);
    for (int64_t i = 0; i < n * h; i++)
        x[i] = (double)(float)(x[i] * 3 + 0.5); /* offset rows */
    norm_ctx c = {y, x, w, bias, n, h, rms};
    fd_case fc = {norm_fwd, &c, {{y, r, n * h}}, 1};
    fd_loss(&fc);
    snprintf(buf, sizeof buf, "%s fwd", nm);
    no_nan_d(buf, y, n * h);
    double *dx = D(n * h), *dw0 = Drand(h), *db0 = Drand(h);
    double *dw = Dcopy(dw0, h), *db = Dcopy(db0, h);
    pd(dx, n * h);
    if (rms)
        mgc_cpu_rmsnorm_bwd_f64(dx, dw, r, x, w, n, h, 1e-5);
    else
        mgc_cpu_layernorm_bwd_f64(dx, dw, db, r, x, w, n, h, 1e-5);
    snprintf(buf, sizeof buf, "%s dx", nm);
    fd_check(buf, &fc, x, n * h, dx);
    snprintf(buf, sizeof buf, "%s dw", nm);
    fd_check(buf, &fc, w, h, Dsub(dw, dw0, h));
    if (!rms) fd_check("layernorm db", &fc, bias, h, Dsub(db, db0, h));

    /* saved statistics agree with a direct computation */
    double *mean = D(n), *rstd = D(n);
    pd(mean, n);
    pd(rstd, n);
    if (rms)
        mgc_cpu_rmsnorm_fwd_f64(y, rstd, x, w, n, h, 1e-5);
    else
        mgc_cpu_layernorm_fwd_f64(y, mean, rstd, x, w, bias, n, h, 1e-5);
    double m0 = 0, v0 = 0;
    for (int64_t c2 = 0; c2 < h; c2++)
        m0 += x[c2];
    m0 = rms ? 0 : m0 / (double)h;
    for (int64_t c2 = 0; c2 < h; c2++)
        v0 += (x[c2] - m0) * (x[c2] - m0);
    if (!rms) T_NEAR_REL(mean[0], m0, 1e-14);
    T_NEAR_REL(rstd[0], 1 / sqrt(v0 / (double)h + 1e-5), 1e-14);

    /* f32 */
    float *yf = Fn(n * h), *yf2 = Fn(n * h), *xf = F(x, n * h), *wf = F(w, h), *bf = F(bias, h);
    float *dxf = Fn(n * h), *dxf2 = Fn(n * h), *dwf = F(dw0, h), *dbf = F(db0, h),
          *rf = F(r, n * h);
    for (int rep = 0; rep < 2; rep++) {
        float *yy = rep ? yf2 : yf, *dd = rep ? dxf2 : dxf;
        pf(yy, n * h);
        pf(dd, n * h);
        if (rms) {
            mgc_cpu_rmsnorm_fwd_f32(yy, NULL, xf, wf, n, h, 1e-5);
            mgc_cpu_rmsnorm_bwd_f32(dd, rep ? Fn(h) : dwf, rf, xf, wf, n, h, 1e-5);
        } else {
            mgc_cpu_layernorm_fwd_f32(yy, NULL, NULL, xf, wf, bf, n, h, 1e-5);
            mgc_cpu_layernorm_bwd_f32(dd, rep ? Fn(h) : dwf, rep ? Fn(h) : dbf, rf, xf, wf, n, h,
                                      1e-5);
        }
    }
    norm_fwd(&c);
    snprintf(buf, sizeof buf, "%s f32 fwd", nm);
    near_fd(buf, yf, y, n * h, F32_TOL);
    same_bits(buf, yf, yf2, (size_t)(n * h) * sizeof(float));
    snprintf(buf, sizeof buf, "%s f32 dx", nm);
    near_fd(buf, dxf, dx, n * h, F32_TOL);
    same_bits(buf, dxf, dxf2, (size_t)(n * h) * sizeof(float));
    snprintf(buf, sizeof buf, "%s f32 dw", nm);
    near_fd(buf, dwf, dw, h, F32_TOL);
    tfree_all();
}

/* ---- linear --------------------------------------------------------------------------- */

typedef struct lin_ctx {
    double *y, *x, *W, *bias;
    int64_t n, N, K;
} lin_ctx;
static void lin_fwd(void *p) {
    lin_ctx *c = p;
    mgc_cpu_linear_fwd_f64(c->y, c->x, c->W, c->bias, c->n, c->N, c->K);
}

static void test_linear(void) {
    int64_t n = 11, N = 7, K = 13;
    double *x = Drand(n * K), *W = Drand(N * K), *bias = Drand(N), *r = Drand(n * N), *y = D(n * N);
    lin_ctx c = {y, x, W, bias, n, N, K};
    fd_case fc = {lin_fwd, &c, {{y, r, n * N}}, 1};
    fd_loss(&fc);
    no_nan_d("linear fwd", y, n * N);
    /* naive reference */
    double *ref = D(n * N);
    for (int64_t i = 0; i < n; i++)
        for (int64_t o = 0; o < N; o++) {
            double s = bias[o];
            for (int64_t kk = 0; kk < K; kk++)
                s += x[i * K + kk] * W[o * K + kk];
            ref[i * N + o] = s;
        }
    near_d("linear fwd vs naive", y, ref, n * N, 1e-14);
    double *dx = D(n * K), *dW0 = Drand(N * K), *db0 = Drand(N);
    double *dW = Dcopy(dW0, N * K), *db = Dcopy(db0, N);
    pd(dx, n * K);
    mgc_cpu_linear_dgrad_f64(dx, r, W, n, N, K);
    mgc_cpu_linear_wgrad_f64(dW, db, r, x, n, N, K);
    fd_check("linear dx", &fc, x, n * K, dx);
    fd_check("linear dW (+=)", &fc, W, N * K, Dsub(dW, dW0, N * K));
    fd_check("linear db (+=)", &fc, bias, N, Dsub(db, db0, N));

    /* row-parallel tp = 2: K split 6 + 7, bias on rank 0 only; the partial sums add up */
    double *W0 = D(N * 6), *W1 = D(N * 7), *x0 = D(n * 6), *x1 = D(n * 7), *y0 = D(n * N),
           *y1 = D(n * N);
    for (int64_t o = 0; o < N; o++)
        for (int64_t kk = 0; kk < K; kk++)
            *(kk < 6 ? &W0[o * 6 + kk] : &W1[o * 7 + kk - 6]) = W[o * K + kk];
    for (int64_t i = 0; i < n; i++)
        for (int64_t kk = 0; kk < K; kk++)
            *(kk < 6 ? &x0[i * 6 + kk] : &x1[i * 7 + kk - 6]) = x[i * K + kk];
    pd(y0, n * N);
    pd(y1, n * N);
    mgc_cpu_linear_fwd_f64(y0, x0, W0, bias, n, N, 6);
    mgc_cpu_linear_fwd_f64(y1, x1, W1, NULL, n, N, 7);
    for (int64_t i = 0; i < n * N; i++)
        y0[i] += y1[i];
    near_d("linear row-parallel tp2", y0, y, n * N, 1e-14);

    /* f32 */
    float *xf = F(x, n * K), *Wf = F(W, N * K), *bf = F(bias, N), *rf = F(r, n * N);
    float *yf = Fn(n * N), *yf2 = Fn(n * N), *dxf = Fn(n * K), *dWf = F(dW0, N * K),
          *dWf2 = F(dW0, N * K), *dbf = F(db0, N);
    pf(yf, n * N);
    pf(yf2, n * N);
    pf(dxf, n * K);
    mgc_cpu_linear_fwd_f32(yf, xf, Wf, bf, n, N, K);
    mgc_cpu_linear_fwd_f32(yf2, xf, Wf, bf, n, N, K);
    mgc_cpu_linear_dgrad_f32(dxf, rf, Wf, n, N, K);
    mgc_cpu_linear_wgrad_f32(dWf, dbf, rf, xf, n, N, K);
    mgc_cpu_linear_wgrad_f32(dWf2, NULL, rf, xf, n, N, K);
    near_fd("linear f32 fwd", yf, y, n * N, F32_TOL);
    same_bits("linear f32 fwd", yf, yf2, (size_t)(n * N) * sizeof(float));
    near_fd("linear f32 dx", dxf, dx, n * K, F32_TOL);
    near_fd("linear f32 dW", dWf, dW, N * K, F32_TOL);
    same_bits("linear f32 dW", dWf, dWf2, (size_t)(N * K) * sizeof(float));
    near_fd("linear f32 db", dbf, db, N, F32_TOL);
    tfree_all();
}

typedef struct glin_ctx {
    double *y, *x, *W, *bias;
    int32_t *counts;
    int64_t E, N, K;
} glin_ctx;
static void glin_fwd(void *p) {
    glin_ctx *c = p;
    mgc_cpu_grouped_linear_fwd_f64(c->y, c->x, c->W, c->bias, c->counts, c->E, c->N, c->K);
}

/* each expert's rows through its own weight and bias, an empty expert between */
static void test_grouped_linear(void) {
    int64_t E = 4, N = 5, K = 7, rows = 3 + 0 + 5 + 1;
    int32_t *counts = I(E);
    counts[0] = 3, counts[1] = 0, counts[2] = 5, counts[3] = 1;
    double *x = Drand(rows * K), *W = Drand(E * N * K), *b = Drand(E * N), *r = Drand(rows * N),
           *y = D(rows * N);
    glin_ctx c = {y, x, W, b, counts, E, N, K};
    fd_case fc = {glin_fwd, &c, {{y, r, rows * N}}, 1};
    fd_loss(&fc);
    no_nan_d("grouped_linear fwd", y, rows * N);
    /* against one linear per expert, written here row by row */
    double worst = 0;
    for (int64_t e = 0, r0 = 0; e < E; r0 += counts[e], e++)
        for (int64_t i = r0; i < r0 + counts[e]; i++)
            for (int64_t o = 0; o < N; o++) {
                double v = b[e * N + o];
                for (int64_t k = 0; k < K; k++)
                    v += x[i * K + k] * W[(e * N + o) * K + k];
                if (fabs(v - y[i * N + o]) > worst) worst = fabs(v - y[i * N + o]);
            }
    T_CHECK(worst < 1e-13);
    double *dx = D(rows * K), *dW0 = Drand(E * N * K), *dW = Dcopy(dW0, E * N * K);
    double *db0 = Drand(E * N), *db = Dcopy(db0, E * N);
    pd(dx, rows * K);
    mgc_cpu_grouped_linear_dgrad_f64(dx, r, W, counts, E, N, K);
    mgc_cpu_grouped_linear_wgrad_f64(dW, db, r, x, counts, E, N, K);
    fd_check("grouped_linear dx", &fc, x, rows * K, dx);
    fd_check("grouped_linear dW", &fc, W, E * N * K, Dsub(dW, dW0, E * N * K));
    fd_check("grouped_linear db", &fc, b, E * N, Dsub(db, db0, E * N));
    /* the empty expert's bias gets nothing */
    for (int64_t o = 0; o < N; o++)
        T_CHECK(db[1 * N + o] == db0[1 * N + o]);
    float *yf = Fn(rows * N), *yn = Fn(rows * N);
    pf(yf, rows * N);
    pf(yn, rows * N);
    mgc_cpu_grouped_linear_fwd_f32(yf, F(x, rows * K), F(W, E * N * K), F(b, E * N), counts, E, N, K);
    near_fd("grouped_linear f32 fwd", yf, y, rows * N, F32_TOL);
    /* without a bias: the same minus each expert's bias row */
    mgc_cpu_grouped_linear_fwd_f32(yn, F(x, rows * K), F(W, E * N * K), NULL, counts, E, N, K);
    double *yb = Dcopy(y, rows * N);
    for (int64_t e = 0, r0 = 0; e < E; r0 += counts[e], e++)
        for (int64_t i = r0; i < r0 + counts[e]; i++)
            for (int64_t o = 0; o < N; o++)
                yb[i * N + o] -= b[e * N + o];
    near_fd("grouped_linear f32 fwd, no bias", yn, yb, rows * N, F32_TOL);
    tfree_all();
}

/* ---- pointwise ------------------------------------------------------------------------ */

typedef struct pw_ctx {
    double *y, *x;
    int64_t n, f;
    int swiglu;
} pw_ctx;
static void pw_fwd(void *p) {
    pw_ctx *c = p;
    if (c->swiglu)
        mgc_cpu_swiglu_fwd_f64(c->y, c->x, c->n, c->f);
    else
        mgc_cpu_gelu_fwd_f64(c->y, c->x, c->n * c->f);
}

static void test_pointwise(int swiglu) {
    int64_t n = 9, f = 7, nin = swiglu ? n * 2 * f : n * f, nout = n * f;
    const char *nm = swiglu ? "swiglu" : "gelu";
    char buf[64];
    double *x = Drand(nin), *r = Drand(nout), *y = D(nout), *dx = D(nin);
    for (int64_t i = 0; i < nin; i++)
        x[i] = (double)(float)(x[i] * 3); /* the curved part */
    pw_ctx c = {y, x, n, f, swiglu};
    fd_case fc = {pw_fwd, &c, {{y, r, nout}}, 1};
    fd_loss(&fc);
    /* independent values */
    double e0 =
        swiglu
            ? x[0] / (1 + exp(-x[0])) * x[f]
            : 0.5 * x[0] *
                  (1 + tanh(sqrt(2 / 3.14159265358979323846) * (x[0] + 0.044715 * pow(x[0], 3))));
    T_NEAR_REL(y[0], e0, 1e-14);
    pd(dx, nin);
    if (swiglu)
        mgc_cpu_swiglu_bwd_f64(dx, r, x, n, f);
    else
        mgc_cpu_gelu_bwd_f64(dx, r, x, nout);
    snprintf(buf, sizeof buf, "%s dx", nm);
    fd_check(buf, &fc, x, nin, dx);
    float *yf = Fn(nout), *dxf = Fn(nin), *dxf2 = Fn(nin), *xf = F(x, nin), *rf = F(r, nout);
    pf(yf, nout);
    pf(dxf, nin);
    pf(dxf2, nin);
    if (swiglu) {
        mgc_cpu_swiglu_fwd_f32(yf, xf, n, f);
        mgc_cpu_swiglu_bwd_f32(dxf, rf, xf, n, f);
        mgc_cpu_swiglu_bwd_f32(dxf2, rf, xf, n, f);
    } else {
        mgc_cpu_gelu_fwd_f32(yf, xf, nout);
        mgc_cpu_gelu_bwd_f32(dxf, rf, xf, nout);
        mgc_cpu_gelu_bwd_f32(dxf2, rf, xf, nout);
    }
    snprintf(buf, sizeof buf, "%s f32 fwd", nm);
    near_fd(buf, yf, y, nout, F32_TOL);
    snprintf(buf, sizeof buf, "%s f32 dx", nm);
    near_fd(buf, dxf, dx, nin, F32_TOL);
    same_bits(buf, dxf, dxf2, (size_t)nin * sizeof(float));
    tfree_all();
}

/* ---- dropout -------------------------------------------------------------------------- */

typedef struct drop_ctx {
    double *y, *x, *res;
    int64_t n;
    double p;
    const mgc_dropout_rng *rng;
} drop_ctx;
static void drop_fwd(void *p) {
    drop_ctx *c = p;
    if (c->res)
        mgc_cpu_dropout_add_fwd_f64(c->y, NULL, c->x, c->res, c->n, c->p, c->rng);
    else
        mgc_cpu_dropout_fwd_f64(c->y, NULL, c->x, c->n, c->p, c->rng);
}

static void test_dropout(uint64_t seed) {
    int64_t n = 4099;
    double p = 0.3;
    mgc_dropout_rng rng = {seed, mgc_rng_stream(2, 1, 5), 0};
    double *x = Drand(n), *res = Drand(n), *r = Drand(n), *y = D(n), *dx = D(n), *dx2 = D(n);
    uint8_t *mask = talloc((size_t)n);
    memset(mask, 0xee, (size_t)n);
    pd(y, n);
    mgc_cpu_dropout_fwd_f64(y, mask, x, n, p, &rng);
    no_nan_d("dropout fwd", y, n);
    int64_t kept = 0, bad = 0;
    for (int64_t i = 0; i < n; i++) {
        kept += mask[i] == 1;
        bad += mask[i] > 1 || y[i] != (mask[i] ? x[i] * (1.0 / (1 - p)) : 0.0);
    }
    T_EQ_I64(bad, 0);
    /* keep fraction 1 - p within 5 sigma */
    T_CHECK(fabs((double)kept / (double)n - (1 - p)) < 5 * sqrt(p * (1 - p) / (double)n));
    /* the backward from the mask and from the regenerated RNG agree */
    pd(dx, n);
    pd(dx2, n);
    mgc_cpu_dropout_bwd_f64(dx, r, mask, n, p, &rng);
    mgc_cpu_dropout_bwd_f64(dx2, r, NULL, n, p, &rng);
    same_bits("dropout bwd mask = regenerated", dx, dx2, (size_t)n * sizeof(double));
    drop_ctx c = {y, x, NULL, n, p, &rng};
    fd_case fc = {drop_fwd, &c, {{y, r, n}}, 1};
    fd_check("dropout dx", &fc, x, n, dx);
    drop_ctx c2 = {y, x, res, n, p, &rng};
    fd_case fc2 = {drop_fwd, &c2, {{y, r, n}}, 1};
    fd_check("dropout_add dx", &fc2, x, n, dx);
    fd_check("dropout_add dresidual", &fc2, res, n, r);
    /* a shard (elem0) regenerates its slice of the global mask */
    uint8_t *m2 = talloc((size_t)n);
    mgc_dropout_rng sh = rng;
    sh.elem0 = 1001;
    double *ys = D(n - 1001);
    mgc_cpu_dropout_fwd_f64(ys, m2, x + 1001, n - 1001, p, &sh);
    same_bits("dropout shard mask", m2, mask + 1001, (size_t)(n - 1001));
    /* other streams / seeds give other masks */
    mgc_dropout_rng o = rng;
    o.stream = mgc_rng_stream(2, 1, 6);
    mgc_cpu_dropout_fwd_f64(ys, m2, x, n - 1001, p, &o);
    T_CHECK(memcmp(m2, mask, (size_t)(n - 1001)) != 0);
    /* p = 0 passes through */
    mgc_cpu_dropout_fwd_f64(y, mask, x, n, 0.0, &rng);
    same_bits("dropout p=0", y, x, (size_t)n * sizeof(double));
    /* f32 makes the same mask */
    float *yf = Fn(n);
    uint8_t *mf = talloc((size_t)n);
    mgc_cpu_dropout_fwd_f64(y, mask, x, n, p, &rng);
    mgc_cpu_dropout_fwd_f32(yf, mf, F(x, n), n, p, &rng);
    same_bits("dropout f32 mask", mf, mask, (size_t)n);
    near_fd("dropout f32 fwd", yf, y, n, F32_TOL);
    tfree_all();
}

static void test_rng(void) {
    /* Philox-4x32-10 known-answer vectors (Random123 kat_vectors) */
    uint32_t ctr0[4] = {0, 0, 0, 0}, key0[2] = {0, 0}, out[4];
    mgc_rng_philox4x32(ctr0, key0, out);
    T_EQ_U64(out[0], 0x6627e8d5u);
    T_EQ_U64(out[1], 0xe169c58du);
    T_EQ_U64(out[2], 0xbc57ac4cu);
    T_EQ_U64(out[3], 0x9b00dbd8u);
    uint32_t ctr1[4] = {0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu},
             key1[2] = {0xffffffffu, 0xffffffffu};
    mgc_rng_philox4x32(ctr1, key1, out);
    T_EQ_U64(out[0], 0x408f276du);
    T_EQ_U64(out[1], 0x41c83b0eu);
    T_EQ_U64(out[2], 0xa20bc7c6u);
    T_EQ_U64(out[3], 0x6d5451fdu);
    uint32_t ctr2[4] = {0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u},
             key2[2] = {0xa4093822u, 0x299f31d0u};
    mgc_rng_philox4x32(ctr2, key2, out);
    T_EQ_U64(out[0], 0xd16cfe09u);
    T_EQ_U64(out[1], 0x94fdccebu);
    T_EQ_U64(out[2], 0x5001e420u);
    T_EQ_U64(out[3], 0x24126ea1u);
    /* fill == one by one */
    uint32_t buf[23];
    mgc_rng_fill_u32(buf, 23, 42, 7, 3);
    int bad = 0;
    for (int i = 0; i < 23; i++)
        bad += buf[i] != mgc_rng_u32(42, 7, 3 + (uint64_t)i);
    T_EQ_I64(bad, 0);
    T_EQ_U64(mgc_rng_drop_threshold(0.0), 0);
    T_EQ_U64(mgc_rng_drop_threshold(0.5), 0x80000000u);
    T_CHECK(mgc_rng_stream(-1, 0, 0) == 0 && mgc_rng_stream(0, 0, 0) != 0);
}

/* ---- qkv split ------------------------------------------------------------------------ */

typedef struct qkv_ctx {
    double *q, *k, *v, *qkv;
    int64_t n, G, per, d;
} qkv_ctx;
static void qkv_fwd(void *p) {
    qkv_ctx *c = p;
    mgc_cpu_qkv_split_fwd_f64(c->q, c->k, c->v, c->qkv, c->n, c->G, c->per, c->d);
}

static void test_qkv_split(int64_t G, int64_t per) {
    int64_t n = 7, d = 3, w = G * (per + 2) * d, nq = n * G * per * d, nk = n * G * d;
    double *qkv = Drand(n * w), *q = D(nq), *k = D(nk), *v = D(nk);
    double *rq = Drand(nq), *rk = Drand(nk), *rv = Drand(nk), *dqkv = D(n * w);
    qkv_ctx c = {q, k, v, qkv, n, G, per, d};
    fd_case fc = {qkv_fwd, &c, {{q, rq, nq}, {k, rk, nk}, {v, rv, nk}}, 3};
    fd_loss(&fc);
    no_nan_d("qkv_split fwd", q, nq);
    no_nan_d("qkv_split fwd", k, nk);
    no_nan_d("qkv_split fwd", v, nk);
    /* row 5, group G-1: its k starts after the group's per query heads */
    T_CHECK(k[(5 * G + G - 1) * d + 1] == qkv[5 * w + (G - 1) * (per + 2) * d + per * d + 1]);
    T_CHECK(q[(5 * G * per + (G - 1) * per + per - 1) * d] ==
            qkv[5 * w + (G - 1) * (per + 2) * d + (per - 1) * d]);
    pd(dqkv, n * w);
    mgc_cpu_qkv_split_bwd_f64(dqkv, rq, rk, rv, n, G, per, d);
    fd_check("qkv_split dqkv", &fc, qkv, n * w, dqkv);
    mgc_cpu_qkv_split_bwd_f64(dqkv, q, k, v, n, G, per, d); /* round trip */
    same_bits("qkv_split round trip", dqkv, qkv, (size_t)(n * w) * sizeof(double));
    float *qf = Fn(nq), *kf = Fn(nk), *vf = Fn(nk);
    pf(qf, nq), pf(kf, nk), pf(vf, nk);
    mgc_cpu_qkv_split_fwd_f32(qf, kf, vf, F(qkv, n * w), n, G, per, d);
    near_fd("qkv_split f32", qf, q, nq, 0);
    near_fd("qkv_split f32", vf, v, nk, 0);
    tfree_all();
}

/* ---- rotary --------------------------------------------------------------------------- */

typedef struct rope_ctx {
    double *y, *x;
    int32_t *pos, *docs;
    int64_t s, b, H, d, rd;
} rope_ctx;
static void rope_fwd(void *p) {
    rope_ctx *c = p;
    mgc_cpu_rope_fwd_f64(c->y, c->x, c->pos, c->docs, c->s, c->b, c->H, c->d, c->rd, 10000.0);
}

/* with_docs: every row's position counted from its document's start (reset_position_ids) */
static void test_rope(int with_docs) {
    int64_t s = 7, b = 3, H = 3, d = 10, rd = 6, n = s * b * H * d;
    int32_t *pos = I(s), *docs = NULL;
    for (int64_t i = 0; i < s; i++)
        pos[i] = (int32_t)(3 * i + 2);
    if (with_docs) {
        docs = I(s * b);
        for (int64_t i = 0; i < s * b; i++)
            docs[i] = (int32_t)((i * 7) % (pos[i / b] + 1)); /* a start at or before the row */
    }
    double *x = Drand(n), *r = Drand(n), *y = D(n), *dx = D(n);
    rope_ctx c = {y, x, pos, docs, s, b, H, d, rd};
    fd_case fc = {rope_fwd, &c, {{y, r, n}}, 1};
    fd_loss(&fc);
    no_nan_d("rope fwd", y, n);
    /* one element by hand: sequence row 4, batch 1, head 2, frequency 1 */
    int64_t base = ((4 * b + 1) * H + 2) * d;
    double ang = (pos[4] - (docs ? docs[4 * b + 1] : 0)) * pow(10000.0, -2.0 / (double)rd);
    if (docs) T_CHECK(pos[4] - docs[4 * b + 1] != pos[4] && pos[4] - docs[4 * b + 1] >= 0);
    T_NEAR_REL(y[base + 1], x[base + 1] * cos(ang) - x[base + 4] * sin(ang), 1e-14);
    T_NEAR_REL(y[base + 4], x[base + 4] * cos(ang) + x[base + 1] * sin(ang), 1e-14);
    T_CHECK(y[base + 7] == x[base + 7]); /* past rot_dim: passes through */
    pd(dx, n);
    mgc_cpu_rope_bwd_f64(dx, r, pos, docs, s, b, H, d, rd, 10000.0);
    fd_check("rope dx", &fc, x, n, dx);
    /* in place */
    double *z = Dcopy(x, n);
    mgc_cpu_rope_fwd_f64(z, z, pos, docs, s, b, H, d, rd, 10000.0);
    same_bits("rope in place", z, y, (size_t)n * sizeof(double));
    float *yf = Fn(n);
    pf(yf, n);
    mgc_cpu_rope_fwd_f32(yf, F(x, n), pos, docs, s, b, H, d, rd, 10000.0);
    near_fd("rope f32 fwd", yf, y, n, F32_TOL);
    tfree_all();
}

/* ---- attention ------------------------------------------------------------------------ */

typedef struct attn_ctx {
    double *out, *lse, *q, *k, *v, *work;
    int32_t *qpos, *kpos;
    int64_t sq, sk, b, A, G, d;
    int causal;
    double p;
    const mgc_dropout_rng *rng;
    int32_t *docs; /* (sq, b) document starts, or NULL */
    int64_t window; /* sliding window in keys, 0 none */
} attn_ctx;
static void attn_fwd(void *p) {
    attn_ctx *c = p;
    mgc_cpu_attention_fwd_f64(c->out, c->lse, c->q, c->k, c->v, c->sq, c->sk, c->b, c->A, c->G,
                              c->d, 1 / sqrt((double)c->d), c->causal, c->qpos, c->kpos, c->docs,
                              c->window, c->p, c->rng, c->work);
}

/* The naive reference: for each (batch, head) the full score matrix, masked softmax, P V.
 * The kv head of query head a is a / (A/G); dropout keeps per (bi, a, i, j) from the RNG. */
static void attn_naive(double *out, double *lse, const attn_ctx *c) {
    int64_t sq = c->sq, sk = c->sk, b = c->b, A = c->A, G = c->G, d = c->d;
    double *S = D(sq * sk);
    uint32_t thr = mgc_rng_drop_threshold(c->p);
    for (int64_t bi = 0; bi < b; bi++)
        for (int64_t a = 0; a < A; a++) {
            int64_t g = a * G / A;
            for (int64_t i = 0; i < sq; i++) {
                double mx = -INFINITY, sum = 0;
                for (int64_t j = 0; j < sk; j++) {
                    int64_t kp = c->kpos ? c->kpos[j] : j, qp = c->qpos ? c->qpos[i] : i;
                    int vis = (!c->causal || kp <= qp) && (!c->docs || kp >= c->docs[i * b + bi]) &&
                              (c->window <= 0 || qp - kp < c->window);
                    double s = 0;
                    for (int64_t e = 0; e < d; e++)
                        s += c->q[((i * b + bi) * A + a) * d + e] *
                             c->k[((j * b + bi) * G + g) * d + e];
                    S[i * sk + j] = vis ? s / sqrt((double)d) : -INFINITY;
                    if (S[i * sk + j] > mx) mx = S[i * sk + j];
                }
                for (int64_t j = 0; j < sk; j++)
                    sum += exp(S[i * sk + j] - mx);
                lse[(i * b + bi) * A + a] = mx + log(sum);
                for (int64_t e = 0; e < d; e++) {
                    double o = 0;
                    for (int64_t j = 0; j < sk; j++) {
                        double pr = exp(S[i * sk + j] - mx) / sum;
                        if (c->p > 0) {
                            uint64_t el = (uint64_t)(((bi * A + a) * sq + i) * sk + j);
                            pr = mgc_rng_u32(c->rng->seed, c->rng->stream, el) >= thr
                                     ? pr / (1 - c->p)
                                     : 0;
                        }
                        o += pr * c->v[((j * b + bi) * G + g) * d + e];
                    }
                    out[((i * b + bi) * A + a) * d + e] = o;
                }
            }
        }
}

static void test_attention_case(const char *nm, int64_t sq, int64_t sk, int64_t A, int64_t G,
                                int causal, int cp_pos, double p, int with_docs, int64_t window,
                                uint64_t seed) {
    int64_t b = 3, d = 5;
    int64_t nq = sq * b * A * d, nk = sk * b * G * d, nl = sq * b * A;
    char buf[96];
    mgc_dropout_rng rng = {seed, mgc_rng_stream(1, 2, 3), 0};
    int32_t *qpos = NULL, *kpos = NULL;
    if (cp_pos) { /* context parallel style: the local queries are rows 1, 2 and 5, 6, ... */
        qpos = I(sq);
        kpos = I(sk);
        for (int64_t j = 0; j < sk; j++)
            kpos[j] = (int32_t)j;
        for (int64_t i = 0; i < sq; i++)
            qpos[i] = (int32_t)((i / 2) * 4 + 1 + i % 2);
    }
    int32_t *docs = NULL;
    if (with_docs) { /* per batch row, documents of random lengths (1..4) over the positions */
        docs = I(sq * b);
        int64_t npos = sk + 8;
        int32_t *start = I(npos);
        for (int64_t bi = 0; bi < b; bi++) {
            for (int64_t q0 = 0; q0 < npos;) {
                int64_t len = 1 + (int64_t)(mgc_rng_u32(seed, 77, (uint64_t)(bi * npos + q0)) % 4);
                for (int64_t t = q0; t < q0 + len && t < npos; t++)
                    start[t] = (int32_t)q0;
                q0 += len;
            }
            for (int64_t i = 0; i < sq; i++)
                docs[i * b + bi] = start[qpos ? qpos[i] : i];
        }
    }
    double *q = Drand(nq), *k = Drand(nk), *v = Drand(nk), *out = D(nq), *lse = D(nl);
    for (int64_t i = 0; i < nq; i++)
        q[i] = (double)(float)(q[i] * 2); /* peaky softmax */
    attn_ctx c = {out, lse, q, k, v, D(mgc_cpu_attention_work_f64(sq, sk, d)), qpos, kpos, sq, sk, b, A, G, d, causal, p, &rng, docs, window};
    double *r = Drand(nq);
    fd_case fc = {attn_fwd, &c, {{out, r, nq}}, 1};
    fd_loss(&fc);
    snprintf(buf, sizeof buf, "attention %s fwd", nm);
    no_nan_d(buf, out, nq);
    no_nan_d(buf, lse, nl);
    double *on = D(nq), *ln = D(nl);
    attn_naive(on, ln, &c);
    snprintf(buf, sizeof buf, "attention %s out vs naive", nm);
    near_d(buf, out, on, nq, 1e-13);
    snprintf(buf, sizeof buf, "attention %s lse vs naive", nm);
    near_d(buf, lse, ln, nl, 1e-13);
    double *dq = D(nq), *dk = D(nk), *dv = D(nk);
    pd(dq, nq);
    pd(dk, nk);
    pd(dv, nk);
    mgc_cpu_attention_bwd_f64(dq, dk, dv, r, q, k, v, out, lse, sq, sk, b, A, G, d,
                              1 / sqrt((double)d), causal, qpos, kpos, docs, window, p, &rng, c.work);
    snprintf(buf, sizeof buf, "attention %s dq", nm);
    fd_check(buf, &fc, q, nq, dq);
    snprintf(buf, sizeof buf, "attention %s dk", nm);
    fd_check(buf, &fc, k, nk, dk);
    snprintf(buf, sizeof buf, "attention %s dv", nm);
    fd_check(buf, &fc, v, nk, dv);
    /* f32: forward and backward against f64, twice bit-identical */
    float *qf = F(q, nq), *kf = F(k, nk), *vf = F(v, nk), *rf = F(r, nq), *wf = Fn(mgc_cpu_attention_work_f32(sq, sk, d));
    float *of[2], *lf[2], *dqf[2], *dkf[2], *dvf[2];
    for (int rep = 0; rep < 2; rep++) {
        of[rep] = Fn(nq), lf[rep] = Fn(nl), dqf[rep] = Fn(nq), dkf[rep] = Fn(nk), dvf[rep] = Fn(nk);
        pf(of[rep], nq), pf(lf[rep], nl), pf(dqf[rep], nq), pf(dkf[rep], nk), pf(dvf[rep], nk);
        mgc_cpu_attention_fwd_f32(of[rep], lf[rep], qf, kf, vf, sq, sk, b, A, G, d,
                                  1 / sqrt((double)d), causal, qpos, kpos, docs, window, p, &rng, wf);
        mgc_cpu_attention_bwd_f32(dqf[rep], dkf[rep], dvf[rep], rf, qf, kf, vf, of[rep], lf[rep],
                                  sq, sk, b, A, G, d, 1 / sqrt((double)d), causal, qpos, kpos, docs,
                                  window, p, &rng, wf);
    }
    snprintf(buf, sizeof buf, "attention %s f32", nm);
    near_fd(buf, of[0], out, nq, F32_TOL);
    near_fd(buf, lf[0], lse, nl, F32_TOL);
    near_fd(buf, dqf[0], dq, nq, F32_TOL);
    near_fd(buf, dkf[0], dk, nk, F32_TOL);
    near_fd(buf, dvf[0], dv, nk, F32_TOL);
    same_bits(buf, of[0], of[1], (size_t)nq * sizeof(float));
    same_bits(buf, dqf[0], dqf[1], (size_t)nq * sizeof(float));
    same_bits(buf, dkf[0], dkf[1], (size_t)nk * sizeof(float));
    same_bits(buf, dvf[0], dvf[1], (size_t)nk * sizeof(float));
    tfree_all();
}

static void test_attention(uint64_t seed) {
    test_attention_case("mha causal", 7, 7, 3, 3, 1, 0, 0.0, 0, 0, seed);
    test_attention_case("gqa 6/2 causal", 7, 7, 6, 2, 1, 0, 0.0, 0, 0, seed);
    test_attention_case("mqa 5/1 full", 5, 9, 5, 1, 0, 0, 0.0, 0, 0, seed);
    test_attention_case("gqa cp positions", 6, 11, 4, 2, 1, 1, 0.0, 0, 0, seed);
    test_attention_case("gqa causal dropout", 7, 7, 6, 3, 1, 0, 0.25, 0, 0, seed);
    /* documents (data.reset_attention_mask): no key before the query's document start */
    test_attention_case("mha causal documents", 9, 9, 3, 3, 1, 0, 0.0, 1, 0, seed);
    test_attention_case("gqa cp positions documents", 6, 11, 4, 2, 1, 1, 0.0, 1, 0, seed);
    test_attention_case("gqa causal documents dropout", 9, 9, 6, 3, 1, 0, 0.25, 1, 0, seed);
    /* sliding windows: a query sees its `window` latest positions (with documents, the later
     * of the two bounds); two keys, the causal prefix's interior, and cp positions (a window of one
     * key leaves nothing to differentiate: softmax over one key is 1) */
    test_attention_case("mha causal window 3", 9, 9, 3, 3, 1, 0, 0.0, 0, 3, seed);
    test_attention_case("gqa causal window 2", 7, 7, 6, 2, 1, 0, 0.0, 0, 2, seed);
    test_attention_case("gqa cp positions window 4", 6, 11, 4, 2, 1, 1, 0.0, 0, 4, seed);
    test_attention_case("gqa window 3 documents dropout", 9, 9, 6, 3, 1, 0, 0.25, 1, 3, seed);
    /* a query row with no visible key: out 0, lse -inf, gradients 0 */
    int64_t d = 3;
    double q[3] = {1, 2, 3}, k[6] = {1, 0, 1, 0, 1, 0}, v[6] = {1, 2, 3, 4, 5, 6}, out[3], lse[1],
           w[64], dq[3], dk[6], dv[6], dout[3] = {1, 1, 1}; /* w: 2*1*2 + 4*1*3 + 4*2*3 = 40 */
    int32_t qp[1] = {0}, kp[2] = {1, 2};
    mgc_cpu_attention_fwd_f64(out, lse, q, k, v, 1, 2, 1, 1, 1, d, 1.0, 1, qp, kp, NULL, 0, 0, NULL, w);
    T_CHECK(out[0] == 0 && out[1] == 0 && out[2] == 0 && isinf(lse[0]) && lse[0] < 0);
    mgc_cpu_attention_bwd_f64(dq, dk, dv, dout, q, k, v, out, lse, 1, 2, 1, 1, 1, d, 1.0, 1, qp, kp,
                              NULL, 0, 0, NULL, w);
    T_CHECK(dq[0] == 0 && dk[5] == 0 && dv[5] == 0);
}

/* ---- cross-entropy -------------------------------------------------------------------- */

typedef struct ce_ctx {
    double *lse, *loss, *logits, *mask, *work;
    int32_t *labels;
    int64_t n, V;
} ce_ctx;
static void ce_fwd(void *p) {
    ce_ctx *c = p;
    mgc_cpu_ce_fwd_f64(c->lse, c->loss, NULL, c->logits, c->labels, c->mask, c->n, c->V, c->V, c->work);
}

static void test_cross_entropy(void) {
    int64_t n = 11, V = 13, V0 = 6, V1 = V - V0;
    double *logits = Drand(n * V), *mask = D(n), *lse = D(n), *loss = D(2), *tl = D(n);
    int32_t *labels = I(n);
    for (int64_t i = 0; i < n * V; i++)
        logits[i] = (double)(float)(logits[i] * 4);
    for (int64_t i = 0; i < n; i++) {
        labels[i] = (int32_t)irand(V);
        mask[i] = (i % 4 == 2) ? 0.0 : 1.0;
    }
    ce_ctx c = {lse, loss, logits, mask, D(3 * n), labels, n, V};
    /* a projection of loss[0] only: loss[1] (the count) has no gradient */
    double r2[2] = {urand(), 0.0};
    fd_case fc = {ce_fwd, &c, {{loss, r2, 2}}, 1};
    fd_loss(&fc);
    pd(lse, n);
    pd(tl, n);
    mgc_cpu_ce_fwd_f64(lse, loss, tl, logits, labels, mask, n, V, V, c.work);
    no_nan_d("ce lse", lse, n);
    /* by hand */
    double tot = 0, cnt = 0;
    for (int64_t i = 0; i < n; i++) {
        double s = 0;
        for (int64_t j = 0; j < V; j++)
            s += exp(logits[i * V + j]);
        double li = log(s) - logits[i * V + labels[i]];
        T_NEAR_REL(tl[i], li, 1e-13);
        tot += mask[i] * li;
        cnt += mask[i];
    }
    T_NEAR_REL(loss[0], tot, 1e-13);
    T_NEAR_REL(loss[1], cnt, 0);
    double *dl = D(n * V);
    pd(dl, n * V);
    mgc_cpu_ce_bwd_f64(dl, logits, lse, labels, mask, r2[0], 0, n, V, V);
    fd_check("ce dlogits", &fc, logits, n * V, dl);

    /* tp = 2: the shards compute phase statistics, combined by hand like the all-reduces */
    double *L0 = D(n * V0), *L1 = D(n * V1);
    for (int64_t i = 0; i < n; i++)
        for (int64_t j = 0; j < V; j++)
            *(j < V0 ? &L0[i * V0 + j] : &L1[i * V1 + j - V0]) = logits[i * V + j];
    double *m0 = D(n), *m1 = D(n), *s0 = D(n), *s1 = D(n), *t0 = D(n), *t1 = D(n), *lse2 = D(n),
           *loss2 = D(2);
    pd(m0, n), pd(m1, n), pd(s0, n), pd(s1, n), pd(t0, n), pd(t1, n), pd(lse2, n), pd(loss2, 2);
    mgc_cpu_ce_max_f64(m0, L0, n, V0, V0);
    mgc_cpu_ce_max_f64(m1, L1, n, V1, V1);
    for (int64_t i = 0; i < n; i++)
        m0[i] = m1[i] = fmax(m0[i], m1[i]); /* AR(max) */
    mgc_cpu_ce_sums_f64(s0, t0, L0, m0, labels, 0, n, V0, V0);
    mgc_cpu_ce_sums_f64(s1, t1, L1, m1, labels, V0, n, V1, V1);
    for (int64_t i = 0; i < n; i++) { /* AR(sum) */
        s0[i] = s1[i] = s0[i] + s1[i];
        t0[i] = t1[i] = t0[i] + t1[i];
    }
    mgc_cpu_ce_finish_f64(lse2, loss2, NULL, m0, s0, t0, mask, n);
    near_d("ce tp2 lse = tp1", lse2, lse, n, 1e-14);
    near_d("ce tp2 loss = tp1", loss2, loss, 2, 1e-14);
    double *d0 = D(n * V0), *d1 = D(n * V1);
    pd(d0, n * V0);
    pd(d1, n * V1);
    mgc_cpu_ce_bwd_f64(d0, L0, lse, labels, mask, r2[0], 0, n, V0, V0);
    mgc_cpu_ce_bwd_f64(d1, L1, lse, labels, mask, r2[0], V0, n, V1, V1);
    double *dj = D(n * V);
    for (int64_t i = 0; i < n; i++)
        for (int64_t j = 0; j < V; j++)
            dj[i * V + j] = j < V0 ? d0[i * V0 + j] : d1[i * V1 + j - V0];
    same_bits("ce tp2 dlogits = tp1", dj, dl, (size_t)(n * V) * sizeof(double));

    /* vocabulary padding: 3 extra columns per row holding large random values are left out
     * of the softmax (same loss, bit for bit) and get a zero gradient */
    {
        int64_t ld = V + 3;
        double *Lp = D(n * ld), *lsep = D(n), *lossp = D(2), *wp = D(3 * n), *dp = D(n * ld);
        for (int64_t i = 0; i < n; i++)
            for (int64_t j = 0; j < ld; j++)
                Lp[i * ld + j] = j < V ? logits[i * V + j] : 50.0 + 10.0 * urand();
        pd(lsep, n), pd(lossp, 2), pd(dp, n * ld);
        mgc_cpu_ce_fwd_f64(lsep, lossp, NULL, Lp, labels, mask, n, V, ld, wp);
        same_bits("ce padded lse = unpadded", lsep, lse, (size_t)n * sizeof(double));
        same_bits("ce padded loss = unpadded", lossp, loss, 2 * sizeof(double));
        mgc_cpu_ce_bwd_f64(dp, Lp, lsep, labels, mask, r2[0], 0, n, V, ld);
        int ok = 1;
        for (int64_t i = 0; i < n; i++)
            for (int64_t j = 0; j < ld; j++)
                ok &= dp[i * ld + j] == (j < V ? dl[i * V + j] : 0.0);
        T_CHECK(ok);
    }

    /* f32 */
    float *lf = F(logits, n * V), *mf = F(mask, n), *lsef = Fn(n), *lossf = Fn(2), *wf = Fn(3 * n),
          *dlf = Fn(n * V), *dlf2 = Fn(n * V);
    pf(lsef, n), pf(lossf, 2), pf(dlf, n * V), pf(dlf2, n * V);
    mgc_cpu_ce_fwd_f32(lsef, lossf, NULL, lf, labels, mf, n, V, V, wf);
    mgc_cpu_ce_bwd_f32(dlf, lf, lsef, labels, mf, r2[0], 0, n, V, V);
    mgc_cpu_ce_bwd_f32(dlf2, lf, lsef, labels, mf, r2[0], 0, n, V, V);
    near_fd("ce f32 lse", lsef, lse, n, F32_TOL);
    near_fd("ce f32 loss", lossf, loss, 2, F32_TOL);
    near_fd("ce f32 dlogits", dlf, dl, n * V, F32_TOL);
    same_bits("ce f32 dlogits", dlf, dlf2, (size_t)(n * V) * sizeof(float));
    tfree_all();
}

/* ---- MoE ------------------------------------------------------------------------------ */

typedef struct route_ctx {
    double *probs, *aux, *z, *logits;
    int32_t *experts, *counts;
    int64_t n, E, k, T;
    mgc_router_score score;
    double scale, aux_coeff, z_coeff;
    int64_t C;           /* > 1: the sequence-wise aux loss over C sequences ... */
    int32_t *seq_counts; /* ... with these (C, E) summed counts */
} route_ctx;
static void route_fwd(void *p) {
    route_ctx *c = p;
    mgc_cpu_moe_route_fwd_f64(c->probs, c->experts, c->counts, c->z, c->logits, c->n, c->E, c->k,
                              c->score, NULL, c->scale, c->z_coeff);
    c->aux[0] = mgc_cpu_moe_aux_loss_f64(c->logits, c->C > 1 ? c->seq_counts : c->counts, c->n,
                                         c->E, c->k, c->T, c->C, c->score, c->aux_coeff);
}

/* C > 1: the sequence-wise aux loss (moe.aux_loss_scope sequence) over C sequences, token t of
 * sequence t mod C, from random summed counts (C, E), against Megatron's form of it: the mean
 * over sequences j of sum_i (c_ji E / (s k)) (sum_{t in j} p_ti / s), s = T / C. */
static void test_router(mgc_router_score score, int64_t k, int64_t C) {
    int64_t n = 12, E = 7, T = 30; /* T: the tokens the (summed) counts cover */
    char buf[96];
    const char *sn = score == MGC_ROUTER_SOFTMAX       ? "softmax"
                     : score == MGC_ROUTER_SOFTMAX_PRE ? "pre-softmax"
                                                       : "sigmoid";
    double *logits = Drand(n * E), *probs = D(n * k), *aux = D(1), *z = D(1);
    for (int64_t t = 0; t < n; t++) { /* top-k must not flip under the FD step: gaps >= 1e-3 */
        double *l = logits + t * E;
        for (int again = 1; again;) {
            again = 0;
            for (int64_t e = 0; e < E; e++)
                l[e] = (double)(float)(urand() * 2);
            for (int64_t e = 0; e < E; e++)
                for (int64_t e2 = 0; e2 < e; e2++)
                    again |= fabs(l[e] - l[e2]) < 1e-3;
        }
    }
    int32_t *experts = I(n * k), *counts = I(E), *seq_counts = I(C * E);
    for (int64_t i = 0; i < C * E; i++)
        seq_counts[i] = (int32_t)irand(2 * T * k / (C * E) + 1);
    route_ctx c = {probs, aux, z,     logits, experts, counts, n, E,
                   k,     T,   score, 1.3,    0.07,    0.011,  C, seq_counts};
    double *rp = Drand(n * k), ra[1] = {urand()}, rz[1] = {urand()};
    fd_case fc = {route_fwd, &c, {{probs, rp, n * k}, {aux, ra, 1}, {z, rz, 1}}, 3};
    for (int64_t i = 0; i < n * k; i++)
        experts[i] = -7;
    for (int64_t e = 0; e < E; e++)
        counts[e] = -7;
    fd_loss(&fc);
    snprintf(buf, sizeof buf, "router %s k=%lld C=%lld", sn, (long long)k, (long long)C);
    no_nan_d(buf, probs, n * k);
    int64_t total = 0, bad = 0;
    for (int64_t e = 0; e < E; e++)
        total += counts[e];
    T_EQ_I64(total, n * k);
    for (int64_t t = 0; t < n; t++) /* descending, distinct, in range */
        for (int64_t j = 0; j < k; j++) {
            int32_t e = experts[t * k + j];
            bad += e < 0 || e >= E;
            if (j > 0) bad += logits[t * E + e] > logits[t * E + experts[t * k + j - 1]];
            for (int64_t e2 = 0; e2 < E; e2++) { /* nothing unchosen beats a chosen one */
                int chosen = 0;
                for (int64_t u = 0; u < k; u++)
                    chosen |= experts[t * k + u] == e2;
                bad += !chosen && logits[t * E + e2] > logits[t * E + e];
            }
        }
    T_EQ_I64(bad, 0);
    /* aux loss by its definition: coeff E/(k T^2) sum_i (sum_t p_ti) c_i; per sequence, the
     * mean of coeff sum_i (c_ji E / (s k)) (sum_{t in j} p_ti / s) */
    double acc = 0, sl = (double)T / (double)C, P[8][16] = {{0}};
    for (int64_t t = 0; t < n; t++) {
        double s = 0, pe[16];
        for (int64_t e = 0; e < E; e++)
            s += (pe[e] = score == MGC_ROUTER_SIGMOID ? 1 / (1 + exp(-logits[t * E + e]))
                                                      : exp(logits[t * E + e]));
        for (int64_t e = 0; e < E; e++)
            acc += pe[e] / s * counts[e], P[t % C][e] += pe[e] / s / sl;
    }
    double want = 0.07 * (double)E / ((double)k * T * T) * acc;
    if (C > 1) {
        want = 0;
        for (int64_t j = 0; j < C; j++)
            for (int64_t e = 0; e < E; e++)
                want += seq_counts[j * E + e] * (double)E / (sl * (double)k) * P[j][e];
        want *= 0.07 / (double)C;
    }
    T_NEAR_REL(aux[0], want, 1e-13);
    const int32_t *ac = C > 1 ? seq_counts : counts;
    double *dl = D(n * E);
    pd(dl, n * E);
    mgc_cpu_moe_route_bwd_f64(dl, rp, logits, experts, ac, n, E, k, T, C, score, 1.3, 0.07, ra[0],
                              0.011, rz[0]);
    fd_check(buf, &fc, logits, n * E, dl);
    /* f32 */
    float *pf32 = Fn(n * k), *zf = Fn(1), *dlf = Fn(n * E), *lf = F(logits, n * E);
    int32_t *ef = I(n * k), *cf = I(E);
    pf(pf32, n * k), pf(dlf, n * E);
    mgc_cpu_moe_route_fwd_f32(pf32, ef, cf, zf, lf, n, E, k, score, NULL, 1.3, 0.011);
    mgc_cpu_moe_route_bwd_f32(dlf, F(rp, n * k), lf, ef, C > 1 ? seq_counts : cf, n, E, k, T, C,
                              score, 1.3, 0.07, ra[0], 0.011, rz[0]);
    same_bits(buf, ef, experts, (size_t)(n * k) * sizeof(int32_t));
    near_fd(buf, pf32, probs, n * k, F32_TOL);
    near_fd(buf, zf, z, 1, F32_TOL);
    near_fd(buf, dlf, dl, n * E, F32_TOL);
    tfree_all();
}

/* Index order of x (n) by value, descending, ties to the lower index (insertion sort). */
static void order_desc(int64_t *idx, const double *x, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        int64_t j = i;
        for (; j > 0 && x[i] > x[idx[j - 1]]; j--)
            idx[j] = idx[j - 1];
        idx[j] = i;
    }
}

/* Group-limited routing and the expert bias (mgc_router_choice) against a reference built
 * from sorts: per token the group scores (the sum of each group's top k / group_topk scores),
 * the groups by score, the allowed experts by (biased) score or logit; then the weights from
 * the unbiased scores. f64 and f32 choose alike. */
static void test_router_choice(mgc_router_score score, int biased) {
    enum { n = 23, E = 12, k = 4, G = 3, GK = 2, EG = E / G, M = k / GK };
    char buf[96];
    snprintf(buf, sizeof buf, "router choice score %d bias %d", (int)score, biased);
    double *logits = D(n * E), *probs = D(n * k), z;
    for (int64_t i = 0; i < n * E; i++)
        logits[i] = 2.5 * urand();
    float bias[E];
    for (int64_t e = 0; e < E; e++)
        bias[e] = (float)(0.2 * urand());
    mgc_router_choice ch = {G, GK, biased ? bias : NULL};
    int32_t *ex = I(n * k), *cnt = I(E), *exf = I(n * k), *cntf = I(E);
    for (int64_t i = 0; i < n * k; i++)
        ex[i] = exf[i] = -5;
    mgc_cpu_moe_route_fwd_f64(probs, ex, cnt, &z, logits, n, E, k, score, &ch, 1.5, 0.0);
    int64_t bad = 0, bad_p = 0, differs = 0;
    for (int64_t t = 0; t < n; t++) {
        const double *l = logits + t * E;
        double mx = l[0], se = 0, sv[E], gs[G], key[E];
        for (int64_t e = 1; e < E; e++)
            mx = fmax(mx, l[e]);
        for (int64_t e = 0; e < E; e++)
            se += exp(l[e] - mx);
        for (int64_t e = 0; e < E; e++)
            sv[e] = (score == MGC_ROUTER_SIGMOID       ? 1 / (1 + exp(-l[e]))
                     : score == MGC_ROUTER_SOFTMAX_PRE ? exp(l[e] - mx) / se
                                                       : l[e]) +
                    (biased ? bias[e] : 0.0);
        int64_t o[E], go[G], n_ok = 0, ok[E];
        for (int64_t g = 0; g < G; g++) {
            order_desc(o, sv + g * EG, EG);
            gs[g] = 0;
            for (int64_t j = 0; j < M; j++)
                gs[g] += sv[g * EG + o[j]];
        }
        order_desc(go, gs, G);
        for (int64_t e = 0; e < E; e++)
            for (int64_t j = 0; j < GK; j++)
                if (e / EG == go[j]) key[n_ok] = biased ? sv[e] : l[e], ok[n_ok++] = e;
        order_desc(o, key, n_ok);
        double pw[k], ps = 0, lmax = -INFINITY;
        for (int64_t j = 0; j < k; j++) {
            int64_t e = ok[o[j]];
            bad += ex[t * k + j] != e;
            lmax = fmax(lmax, l[e]);
        }
        for (int64_t j = 0; j < k; j++) {
            double le = l[ok[o[j]]];
            ps += (pw[j] = score == MGC_ROUTER_SIGMOID       ? 1 / (1 + exp(-le))
                           : score == MGC_ROUTER_SOFTMAX_PRE ? exp(le - mx) / se
                                                             : exp(le - lmax));
        }
        for (int64_t j = 0; j < k; j++) {
            double want = 1.5 * (score == MGC_ROUTER_SOFTMAX_PRE ? pw[j] : pw[j] / ps);
            bad_p += fabs(probs[t * k + j] - want) > 1e-14 * fabs(want);
        }
        /* the plain top-k by logit: the groups must change some token's choice */
        order_desc(o, l, E);
        for (int64_t j = 0; j < k; j++)
            differs += ex[t * k + j] != o[j];
    }
    T_EQ_I64(bad, 0);
    T_EQ_I64(bad_p, 0);
    T_CHECK(differs > 0);
    float *lf = F(logits, n * E), *pf32 = Fn(n * k), zf;
    mgc_cpu_moe_route_fwd_f32(pf32, exf, cntf, &zf, lf, n, E, k, score, &ch, 1.5, 0.0);
    same_bits(buf, exf, ex, (size_t)(n * k) * sizeof(int32_t));
    same_bits(buf, cntf, cnt, (size_t)E * sizeof(int32_t));
    tfree_all();
}

static void test_router_ties(void) {
    double l[8] = {0.5, 2.0, 2.0, 0.5, /* */ 1, 1, 1, 1}, probs[4], z;
    int32_t ex[4], counts[4];
    mgc_cpu_moe_route_fwd_f64(probs, ex, counts, &z, l, 2, 4, 2, MGC_ROUTER_SOFTMAX, NULL, 1.0,
                              0.0);
    T_CHECK(ex[0] == 1 && ex[1] == 2 && ex[2] == 0 && ex[3] == 1);
    T_CHECK(counts[0] == 1 && counts[1] == 2 && counts[2] == 1 && counts[3] == 0);
    T_NEAR_REL(probs[0], 0.5, 1e-15);
    T_CHECK(z == 0);
}

static void test_dispatch_map(void) {
    /* hand example: n = 5, k = 1, E = 2 */
    int32_t ex[5] = {0, 0, 1, 0, 0}, row_src[5], row_of[5], counts[2];
    double pr[5] = {0.1, 0.9, 0.5, 0.3, 0.3};
    int64_t R =
        mgc_cpu_moe_dispatch_map_f64(row_src, row_of, counts, ex, pr, 5, 1, 2, 0, MGC_DROP_PROBS);
    T_EQ_I64(R, 5);
    T_CHECK(row_src[0] == 0 && row_src[1] == 1 && row_src[2] == 3 && row_src[3] == 4 &&
            row_src[4] == 2);
    T_CHECK(counts[0] == 4 && counts[1] == 1 && row_of[2] == 4 && row_of[4] == 3);
    R = mgc_cpu_moe_dispatch_map_f64(row_src, row_of, counts, ex, pr, 5, 1, 2, 2,
                                     MGC_DROP_POSITION);
    T_EQ_I64(R, 3);
    T_CHECK(row_src[0] == 0 && row_src[1] == 1 && row_src[2] == 2 && counts[0] == 2 &&
            counts[1] == 1);
    T_CHECK(row_of[3] == -1 && row_of[4] == -1 && row_of[2] == 2);
    /* probs: keeps 0.9 (token 1) and the tie 0.3/0.3 goes to the lower index (token 3) */
    R = mgc_cpu_moe_dispatch_map_f64(row_src, row_of, counts, ex, pr, 5, 1, 2, 2, MGC_DROP_PROBS);
    T_EQ_I64(R, 3);
    T_CHECK(row_src[0] == 1 && row_src[1] == 3 && row_src[2] == 2);
    T_CHECK(row_of[0] == -1 && row_of[4] == -1 && row_of[1] == 0 && row_of[3] == 1);
}

typedef struct moe_ctx {
    double *rows, *y, *x, *probs;
    int32_t *row_src, *row_of;
    int64_t n, k, h, R;
    int which; /* 0 permute (x -> rows), 1 combine (rows, probs -> y) */
} moe_ctx;
static void moe_fwd(void *p) {
    moe_ctx *c = p;
    if (c->which == 0)
        mgc_cpu_moe_permute_f64(c->rows, c->x, c->row_src, c->R, c->k, c->h);
    else
        mgc_cpu_moe_combine_f64(c->y, c->rows, c->probs, c->row_of, c->n, c->k, c->h);
}

static void test_dispatch_combine(int64_t capacity, mgc_drop_policy policy) {
    int64_t n = 13, k = 2, E = 5, h = 7;
    char buf[96];
    snprintf(buf, sizeof buf, "moe dispatch/combine cap %lld policy %d", (long long)capacity,
             (int)policy);
    double *logits = Drand(n * E), *probs = D(n * k), z;
    int32_t *ex = I(n * k), *cnt = I(E), *row_src = I(n * k), *row_of = I(n * k), *counts = I(E);
    mgc_cpu_moe_route_fwd_f64(probs, ex, cnt, &z, logits, n, E, k, MGC_ROUTER_SOFTMAX_PRE, NULL,
                              1.0, 0.0);
    int64_t R =
        mgc_cpu_moe_dispatch_map_f64(row_src, row_of, counts, ex, probs, n, k, E, capacity, policy);
    int64_t tot = 0, bad = 0;
    for (int64_t e = 0; e < E; e++) {
        tot += counts[e];
        bad += capacity > 0 && counts[e] > capacity;
    }
    T_EQ_I64(tot, R);
    T_EQ_I64(bad, 0);
    if (capacity <= 0) T_EQ_I64(R, n * k);
    for (int64_t r = 0; r < R; r++)
        bad += row_of[row_src[r]] != r;
    for (int64_t r = 1; r < R; r++)
        bad += ex[row_src[r]] < ex[row_src[r - 1]] ||
               (ex[row_src[r]] == ex[row_src[r - 1]] && row_src[r] < row_src[r - 1]);
    T_EQ_I64(bad, 0);
    double *x = Drand(n * h), *rows = D(n * k * h), *y = D(n * h), *rr = Drand(R * h),
           *ry = Drand(n * h);
    moe_ctx c = {rows, y, x, probs, row_src, row_of, n, k, h, R, 0};
    fd_case fp = {moe_fwd, &c, {{rows, rr, R * h}}, 1};
    fd_loss(&fp);
    no_nan_d(buf, rows, R * h);
    double *dx = D(n * h);
    pd(dx, n * h);
    mgc_cpu_moe_permute_bwd_f64(dx, rr, row_of, n, k, h);
    fd_check(buf, &fp, x, n * h, dx);
    moe_ctx c2 = c;
    c2.which = 1;
    for (int64_t i = 0; i < R * h; i++)
        rows[i] = urand();
    fd_case fcm = {moe_fwd, &c2, {{y, ry, n * h}}, 1};
    fd_loss(&fcm);
    no_nan_d(buf, y, n * h);
    double *drows = D(R * h), *dprobs = D(n * k);
    pd(drows, R * h);
    pd(dprobs, n * k);
    mgc_cpu_moe_combine_bwd_f64(drows, dprobs, ry, rows, probs, row_of, n, k, h);
    fd_check(buf, &fcm, rows, R * h, drows);
    fd_check(buf, &fcm, probs, n * k, dprobs);
    /* f32 */
    float *rf = Fn(R * h), *yf = Fn(n * h), *rowsf = F(rows, R * h), *pf32 = F(probs, n * k);
    pf(rf, R * h), pf(yf, n * h);
    mgc_cpu_moe_permute_f32(rf, F(x, n * h), row_src, R, k, h);
    mgc_cpu_moe_combine_f32(yf, rowsf, pf32, row_of, n, k, h);
    near_fd(buf, yf, y, n * h, F32_TOL);
    mgc_cpu_moe_permute_f64(rows, x, row_src, R, k, h);
    near_fd(buf, rf, rows, R * h, F32_TOL);
    tfree_all();
}

/* ---- optimizer, norm, schedule -------------------------------------------------------- */

static void test_adamw(void) {
    mgc_adamw_cfg cfg = {0.9, 0.95, 1e-8, 0.1};
    float p[3] = {0.5f, -1.25f, 2.0f}, g[3] = {0.2f, -0.03f, 0.0f}, m[3] = {0}, v[3] = {0};
    double P[3] = {0.5, -1.25, 2.0}, M[3] = {0}, V[3] = {0};
    double lr = 3e-3, scale = 0.5;
    for (int step = 1; step <= 3; step++) {
        int decay = 1;
        mgc_cpu_adamw(p, g, m, v, 3, &cfg, step, lr, scale, decay);
        for (int i = 0; i < 3; i++) { /* PyTorch's order: decay first, then the Adam update */
            double gi = (double)g[i] * scale;
            M[i] = 0.9 * M[i] + 0.1 * gi;
            V[i] = 0.95 * V[i] + 0.05 * gi * gi;
            double mh = M[i] / (1 - pow(0.9, step)), vh = V[i] / (1 - pow(0.95, step));
            double upd = lr * mh / (sqrt(vh) + 1e-8);
            P[i] = P[i] * (1 - lr * 0.1) - upd;
        }
    }
    for (int i = 0; i < 3; i++) {
        T_NEAR_REL(p[i], P[i], 1e-6);
        T_NEAR_REL(m[i], M[i], 1e-6);
        T_NEAR_REL(v[i], V[i], 1e-6);
    }
    /* step 1 by hand: mhat = g, vhat = g^2, so the update is lr * sign(g) (eps aside) */
    float q[1] = {1.0f}, gq[1] = {0.4f}, mq[1] = {0}, vq[1] = {0};
    mgc_cpu_adamw(q, gq, mq, vq, 1, &cfg, 1, 0.01, 1.0, 0);
    T_NEAR_REL(q[0], 1.0 - 0.01 * 0.4 / (0.4 + 1e-8), 1e-7);
}

static void test_norm_clip_lr(void) {
    float g[5] = {3, -4, 0, 1e-3f, 12};
    T_NEAR_REL(mgc_cpu_sumsq(g, 5), 9.0 + 16 + (double)1e-3f * (double)1e-3f + 144, 1e-15);
    T_NEAR_REL(mgc_cpu_clip_scale(13.0, 1.0), 1.0 / (13.0 + 1e-6), 1e-15);
    T_CHECK(mgc_cpu_clip_scale(0.5, 1.0) == 1.0);
    T_CHECK(mgc_cpu_clip_scale(100.0, 0.0) == 1.0);
    mgc_lr_sched s = {1e-3, 1e-4, 10, 110, MGC_LR_COSINE, 0, MGC_LR_WSD_EXPONENTIAL};
    T_NEAR_REL(mgc_cpu_lr(&s, 0), 0.0, 0);
    T_NEAR_REL(mgc_cpu_lr(&s, 5), 5e-4, 1e-15);
    T_NEAR_REL(mgc_cpu_lr(&s, 10), 1e-3, 1e-15);
    T_NEAR_REL(mgc_cpu_lr(&s, 60), 1e-4 + 0.5 * 9e-4, 1e-14);
    T_NEAR_REL(mgc_cpu_lr(&s, 35), 1e-4 + 9e-4 * 0.5 * (1 + cos(3.14159265358979323846 / 4)),
               1e-14);
    T_NEAR_REL(mgc_cpu_lr(&s, 110), 1e-4, 1e-15);
    T_NEAR_REL(mgc_cpu_lr(&s, 500), 1e-4, 1e-15);
    s.decay = MGC_LR_LINEAR;
    T_NEAR_REL(mgc_cpu_lr(&s, 35), 1e-4 + 9e-4 * 0.75, 1e-14);
    s.decay = MGC_LR_CONSTANT;
    T_NEAR_REL(mgc_cpu_lr(&s, 500), 1e-3, 0);
    s.warmup_steps = 0;
    s.decay = MGC_LR_COSINE;
    T_NEAR_REL(mgc_cpu_lr(&s, 0), 1e-3, 1e-15);
    /* warmup-stable-decay: warmup 10, held to step 90, the last 20 of 110 anneal */
    mgc_lr_sched w = {1e-3, 1e-4, 10, 110, MGC_LR_WSD, 20, MGC_LR_WSD_EXPONENTIAL};
    T_NEAR_REL(mgc_cpu_lr(&w, 5), 5e-4, 1e-15);
    T_NEAR_REL(mgc_cpu_lr(&w, 50), 1e-3, 0);
    T_NEAR_REL(mgc_cpu_lr(&w, 90), 1e-3, 0);
    T_NEAR_REL(mgc_cpu_lr(&w, 100), 1e-4 + 9e-4 * (2 * sqrt(0.5) - 1), 1e-14); /* r = 1/2 */
    T_NEAR_REL(mgc_cpu_lr(&w, 110), 1e-4, 1e-15);
    w.wsd_shape = MGC_LR_WSD_LINEAR;
    T_NEAR_REL(mgc_cpu_lr(&w, 95), 1e-4 + 9e-4 * 0.75, 1e-14);
    w.wsd_shape = MGC_LR_WSD_COSINE;
    T_NEAR_REL(mgc_cpu_lr(&w, 95), 1e-4 + 9e-4 * 0.5 * (1 + cos(3.14159265358979323846 / 4)), 1e-14);
    w.wsd_shape = MGC_LR_WSD_MINUS_SQRT;
    T_NEAR_REL(mgc_cpu_lr(&w, 95), 1e-4 + 9e-4 * 0.5, 1e-14);
    T_NEAR_REL(mgc_cpu_lr(&w, 109), 1e-4 + 9e-4 * (1 - sqrt(0.95)), 1e-13);
}

int main(void) {
    const char *env = getenv("MGC_TEST_SEED");
    uint64_t seed = env ? strtoull(env, NULL, 10) : (uint64_t)time(NULL);
    printf("test_cpu_ops: seed %llu (MGC_TEST_SEED=%llu replays)\n", (unsigned long long)seed,
           (unsigned long long)seed);
    rng_state = seed;
    test_rng();
    test_embedding();
    test_embedding_docs();
    test_norm(0);
    test_norm(1);
    test_linear();
    test_grouped_linear();
    test_pointwise(0);
    test_pointwise(1);
    test_dropout(seed);
    test_qkv_split(3, 2);
    test_qkv_split(1, 5);
    test_rope(0);
    test_rope(1);
    test_attention(seed);
    test_cross_entropy();
    for (int k = 1; k <= 3; k++) {
        test_router(MGC_ROUTER_SOFTMAX, k, 1);
        test_router(MGC_ROUTER_SOFTMAX_PRE, k, 1);
        test_router(MGC_ROUTER_SIGMOID, k, 1);
    }
    test_router(MGC_ROUTER_SOFTMAX, 2, 3); /* the sequence-wise aux loss */
    test_router(MGC_ROUTER_SIGMOID, 2, 4);
    test_router_ties();
    test_router_choice(MGC_ROUTER_SOFTMAX, 0);
    test_router_choice(MGC_ROUTER_SOFTMAX_PRE, 0);
    test_router_choice(MGC_ROUTER_SIGMOID, 0);
    test_router_choice(MGC_ROUTER_SIGMOID, 1);
    test_dispatch_map();
    test_dispatch_combine(0, MGC_DROP_PROBS);
    test_dispatch_combine(4, MGC_DROP_PROBS);
    test_dispatch_combine(4, MGC_DROP_POSITION);
    test_adamw();
    test_norm_clip_lr();
    tfree_all();
    return t_summary("test_cpu_ops");
}
