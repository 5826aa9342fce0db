/* cpu_ops_tmpl.h - the CPU reference kernels, written once over R (float or double).
 * Included by cpu_ops.c twice with R, FN(name), GEMM and SFX defined; see cpu_ops.h for the
 * contracts and docs/cpu-backend.md for the math.  Not a public header. */
#if !defined(R) || !defined(FN) || !defined(GEMM) || !defined(FEXP)
#error "included by cpu_ops.c only"
#endif

/* ---- embedding ------------------------------------------------------------------------ */

void FN(mgc_cpu_embedding_fwd)(R *out, const int32_t *tok, const R *wte, int64_t v0, int64_t V_l,
                               const R *wpe, const int32_t *pos, const int32_t *docs, int64_t s,
                               int64_t b, int64_t h) {
    for (int64_t i = 0; i < s; i++) {
        for (int64_t j = 0; j < b; j++) {
            int64_t r = i * b + j, id = (int64_t)tok[r] - v0;
            int64_t p = (pos ? pos[i] : i) - (docs ? docs[r] : 0);
            R *o = out + r * h;
            const R *w = (id >= 0 && id < V_l) ? wte + id * h : NULL;
            for (int64_t c = 0; c < h; c++)
                o[c] = w ? w[c] : (R)0;
            if (wpe)
                for (int64_t c = 0; c < h; c++)
                    o[c] += wpe[p * h + c];
        }
    }
}

void FN(mgc_cpu_embedding_bwd)(R *dwte, R *dwpe, const R *dout, const int32_t *tok, int64_t v0,
                               int64_t V_l, const int32_t *pos, const int32_t *docs, int64_t s,
                               int64_t b, int64_t h) {
    for (int64_t i = 0; i < s; i++) {
        for (int64_t j = 0; j < b; j++) {
            int64_t r = i * b + j, id = (int64_t)tok[r] - v0;
            int64_t p = (pos ? pos[i] : i) - (docs ? docs[r] : 0);
            const R *g = dout + r * h;
            if (dwte && id >= 0 && id < V_l)
                for (int64_t c = 0; c < h; c++)
                    dwte[id * h + c] += g[c];
            if (dwpe)
                for (int64_t c = 0; c < h; c++)
                    dwpe[p * h + c] += g[c];
        }
    }
}

/* ---- norms ---------------------------------------------------------------------------- */

static void FN(ln_stats)(const R *x, int64_t h, double eps, R *mean, R *rstd) {
    R m = 0, v = 0;
    for (int64_t c = 0; c < h; c++)
        m += x[c];
    m /= (R)h;
    for (int64_t c = 0; c < h; c++)
        v += (x[c] - m) * (x[c] - m);
    v /= (R)h;
    *mean = m;
    *rstd = (R)1 / sqrt(v + (R)eps);
}

void FN(mgc_cpu_layernorm_fwd)(R *y, R *mean, R *rstd, const R *x, const R *w, const R *bias,
                               int64_t n, int64_t h, double eps) {
    for (int64_t r = 0; r < n; r++) {
        R m, rs;
        FN(ln_stats)(x + r * h, h, eps, &m, &rs);
        for (int64_t c = 0; c < h; c++)
            y[r * h + c] = (x[r * h + c] - m) * rs * w[c] + (bias ? bias[c] : (R)0);
        if (mean) mean[r] = m;
        if (rstd) rstd[r] = rs;
    }
}

/* dx = rstd (g - mean(g) - xhat mean(g xhat)), g = dy w */
void FN(mgc_cpu_layernorm_bwd)(R *dx, R *dw, R *db, const R *dy, const R *x, const R *w, int64_t n,
                               int64_t h, double eps) {
    for (int64_t r = 0; r < n; r++) {
        const R *xr = x + r * h, *gr = dy + r * h;
        R m, rs, sg = 0, sgx = 0;
        FN(ln_stats)(xr, h, eps, &m, &rs);
        for (int64_t c = 0; c < h; c++) {
            R xh = (xr[c] - m) * rs, g = gr[c] * w[c];
            sg += g;
            sgx += g * xh;
            dw[c] += gr[c] * xh;
            if (db) db[c] += gr[c];
        }
        sg /= (R)h;
        sgx /= (R)h;
        for (int64_t c = 0; c < h; c++) {
            R xh = (xr[c] - m) * rs;
            dx[r * h + c] = rs * (gr[c] * w[c] - sg - xh * sgx);
        }
    }
}

static R FN(rms_rstd)(const R *x, int64_t h, double eps) {
    R ss = 0;
    for (int64_t c = 0; c < h; c++)
        ss += x[c] * x[c];
    return (R)1 / sqrt(ss / (R)h + (R)eps);
}

void FN(mgc_cpu_rmsnorm_fwd)(R *y, R *rstd, const R *x, const R *w, int64_t n, int64_t h,
                             double eps) {
    for (int64_t r = 0; r < n; r++) {
        R rs = FN(rms_rstd)(x + r * h, h, eps);
        for (int64_t c = 0; c < h; c++)
            y[r * h + c] = x[r * h + c] * rs * w[c];
        if (rstd) rstd[r] = rs;
    }
}

/* dx = rstd (g - xhat mean(g xhat)), g = dy w, xhat = x rstd */
void FN(mgc_cpu_rmsnorm_bwd)(R *dx, R *dw, const R *dy, const R *x, const R *w, int64_t n,
                             int64_t h, double eps) {
    for (int64_t r = 0; r < n; r++) {
        const R *xr = x + r * h, *gr = dy + r * h;
        R rs = FN(rms_rstd)(xr, h, eps), sgx = 0;
        for (int64_t c = 0; c < h; c++) {
            R xh = xr[c] * rs;
            sgx += gr[c] * w[c] * xh;
            dw[c] += gr[c] * xh;
        }
        sgx /= (R)h;
        for (int64_t c = 0; c < h; c++)
            dx[r * h + c] = rs * (gr[c] * w[c] - xr[c] * rs * sgx);
    }
}

/* ---- linear --------------------------------------------------------------------------- */

void FN(mgc_cpu_linear_fwd)(R *y, const R *x, const R *W, const R *bias, int64_t n, int64_t N,
                            int64_t K) {
    if (n == 0 || N == 0) return;
    if (K == 0) {
        for (int64_t i = 0; i < n * N; i++)
            y[i] = 0;
    } else {
        GEMM(CblasRowMajor, CblasNoTrans, CblasTrans, (int)n, (int)N, (int)K, (R)1, x, (int)K, W,
             (int)K, (R)0, y, (int)N);
    }
    if (bias)
        for (int64_t r = 0; r < n; r++)
            for (int64_t c = 0; c < N; c++)
                y[r * N + c] += bias[c];
}

void FN(mgc_cpu_linear_dgrad)(R *dx, const R *dy, const R *W, int64_t n, int64_t N, int64_t K) {
    if (n == 0 || K == 0) return;
    if (N == 0) {
        for (int64_t i = 0; i < n * K; i++)
            dx[i] = 0;
        return;
    }
    GEMM(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)n, (int)K, (int)N, (R)1, dy, (int)N, W,
         (int)K, (R)0, dx, (int)K);
}

void FN(mgc_cpu_linear_wgrad)(R *dW, R *db, const R *dy, const R *x, int64_t n, int64_t N,
                              int64_t K) {
    if (n == 0) return;
    if (N > 0 && K > 0)
        GEMM(CblasRowMajor, CblasTrans, CblasNoTrans, (int)N, (int)K, (int)n, (R)1, dy, (int)N, x,
             (int)K, (R)1, dW, (int)K);
    if (db)
        for (int64_t r = 0; r < n; r++)
            for (int64_t c = 0; c < N; c++)
                db[c] += dy[r * N + c];
}

void FN(mgc_cpu_grouped_linear_fwd)(R *y, const R *x, const R *W, const R *bias,
                                    const int32_t *counts, int64_t E_l, int64_t N, int64_t K) {
    int64_t r0 = 0;
    for (int64_t e = 0; e < E_l; e++) {
        FN(mgc_cpu_linear_fwd)(y + r0 * N, x + r0 * K, W + e * N * K, bias ? bias + e * N : NULL,
                               counts[e], N, K);
        r0 += counts[e];
    }
}

void FN(mgc_cpu_grouped_linear_dgrad)(R *dx, const R *dy, const R *W, const int32_t *counts,
                                      int64_t E_l, int64_t N, int64_t K) {
    int64_t r0 = 0;
    for (int64_t e = 0; e < E_l; e++) {
        FN(mgc_cpu_linear_dgrad)(dx + r0 * K, dy + r0 * N, W + e * N * K, counts[e], N, K);
        r0 += counts[e];
    }
}

void FN(mgc_cpu_grouped_linear_wgrad)(R *dW, R *db, const R *dy, const R *x,
                                      const int32_t *counts, int64_t E_l, int64_t N, int64_t K) {
    int64_t r0 = 0;
    for (int64_t e = 0; e < E_l; e++) {
        FN(mgc_cpu_linear_wgrad)(dW + e * N * K, db ? db + e * N : NULL, dy + r0 * N, x + r0 * K,
                                 counts[e], N, K);
        r0 += counts[e];
    }
}

/* ---- pointwise ------------------------------------------------------------------------ */

#define GELU_C ((R)0.7978845608028654) /* sqrt(2/pi) */

/* f32: tanh through one exp (libm's tanhf goes through expm1f and is 2x slower here),
 * exact at the limits (exp overflowing gives 1, underflowing -1); its absolute error near
 * 0 is an ulp of 1, which is all GELU's (1 + tanh) keeps anyway. */
static inline R FN(tanh_exp)(R u) {
    if (sizeof(R) > 4) return tanh(u); /* f64 keeps libm's: the reference is exact */
    return (R)1 - (R)2 / (FEXP((R)2 * u) + (R)1);
}

void FN(mgc_cpu_gelu_fwd)(R *y, const R *x, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        R u = GELU_C * (x[i] + (R)0.044715 * x[i] * x[i] * x[i]);
        y[i] = (R)0.5 * x[i] * ((R)1 + FN(tanh_exp)(u));
    }
}

void FN(mgc_cpu_gelu_bwd)(R *dx, const R *dy, const R *x, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        R xi = x[i], u = GELU_C * (xi + (R)0.044715 * xi * xi * xi), t = FN(tanh_exp)(u);
        R du = GELU_C * ((R)1 + (R)3 * (R)0.044715 * xi * xi);
        dx[i] = dy[i] * ((R)0.5 * ((R)1 + t) + (R)0.5 * xi * ((R)1 - t * t) * du);
    }
}

void FN(mgc_cpu_swiglu_fwd)(R *y, const R *x, int64_t n, int64_t f) {
    for (int64_t r = 0; r < n; r++)
        for (int64_t c = 0; c < f; c++) {
            R g = x[r * 2 * f + c], u = x[r * 2 * f + f + c];
            y[r * f + c] = g / ((R)1 + FEXP(-g)) * u;
        }
}

void FN(mgc_cpu_swiglu_bwd)(R *dx, const R *dy, const R *x, int64_t n, int64_t f) {
    for (int64_t r = 0; r < n; r++)
        for (int64_t c = 0; c < f; c++) {
            R g = x[r * 2 * f + c], u = x[r * 2 * f + f + c], sg = (R)1 / ((R)1 + FEXP(-g));
            R d = dy[r * f + c];
            dx[r * 2 * f + c] = d * u * sg * ((R)1 + g * ((R)1 - sg));
            dx[r * 2 * f + f + c] = d * g * sg;
        }
}

void FN(mgc_cpu_add_fwd)(R *y, const R *a, const R *b, int64_t n) {
    for (int64_t i = 0; i < n; i++)
        y[i] = a[i] + b[i];
}

/* ---- dropout -------------------------------------------------------------------------- */

/* keep flag of element i: the RNG word against the threshold, in integers so that the
 * float and double variants make identical masks */
static int FN(keep)(const mgc_dropout_rng *rng, uint32_t thr, uint64_t i) {
    uint64_t e = rng->n0 > 0 && i >= (uint64_t)rng->n0 ? rng->elem1 + (i - (uint64_t)rng->n0)
                                                        : rng->elem0 + i;
    return mgc_rng_u32(rng->seed, rng->stream, e) >= thr;
}

void FN(mgc_cpu_dropout_fwd)(R *y, uint8_t *mask, const R *x, int64_t n, double p,
                             const mgc_dropout_rng *rng) {
    uint32_t thr = mgc_rng_drop_threshold(p);
    R sc = (R)(1.0 / (1.0 - p));
    for (int64_t i = 0; i < n; i++) {
        int kp = p > 0 ? FN(keep)(rng, thr, (uint64_t)i) : 1;
        y[i] = kp ? (p > 0 ? x[i] * sc : x[i]) : (R)0;
        if (mask) mask[i] = (uint8_t)kp;
    }
}

void FN(mgc_cpu_dropout_bwd)(R *dx, const R *dy, const uint8_t *mask, int64_t n, double p,
                             const mgc_dropout_rng *rng) {
    uint32_t thr = mgc_rng_drop_threshold(p);
    R sc = (R)(1.0 / (1.0 - p));
    for (int64_t i = 0; i < n; i++) {
        if (!(p > 0)) {
            dx[i] = dy[i];
            continue;
        }
        int kp = mask ? mask[i] != 0 : FN(keep)(rng, thr, (uint64_t)i);
        dx[i] = kp ? dy[i] * sc : (R)0;
    }
}

void FN(mgc_cpu_dropout_add_fwd)(R *y, uint8_t *mask, const R *x, const R *residual, int64_t n,
                                 double p, const mgc_dropout_rng *rng) {
    FN(mgc_cpu_dropout_fwd)(y, mask, x, n, p, rng);
    for (int64_t i = 0; i < n; i++)
        y[i] += residual[i];
}

/* ---- qkv split ------------------------------------------------------------------------ */

static void FN(qkv_move)(R *qkv, R *q, R *k, R *v, int64_t n, int64_t G, int64_t per, int64_t d,
                         int to_qkv) {
    int64_t w = G * (per + 2) * d;
    for (int64_t r = 0; r < n; r++)
        for (int64_t g = 0; g < G; g++) {
            R *src = qkv + r * w + g * (per + 2) * d;
            R *dst[3] = {q + (r * G * per + g * per) * d, k + (r * G + g) * d, v + (r * G + g) * d};
            int64_t len[3] = {per * d, d, d}, off = 0;
            for (int part = 0; part < 3; part++) {
                for (int64_t c = 0; c < len[part]; c++) {
                    if (to_qkv)
                        src[off + c] = dst[part][c];
                    else
                        dst[part][c] = src[off + c];
                }
                off += len[part];
            }
        }
}

void FN(mgc_cpu_qkv_split_fwd)(R *q, R *k, R *v, const R *qkv, int64_t n, int64_t G, int64_t per,
                               int64_t d) {
    FN(qkv_move)((R *)qkv, q, k, v, n, G, per, d, 0); /* reads qkv only */
}

void FN(mgc_cpu_qkv_split_bwd)(R *dqkv, const R *dq, const R *dk, const R *dv, int64_t n, int64_t G,
                               int64_t per, int64_t d) {
    FN(qkv_move)(dqkv, (R *)dq, (R *)dk, (R *)dv, n, G, per, d, 1); /* reads dq, dk, dv only */
}

/* ---- rotary --------------------------------------------------------------------------- */

static void FN(rope)(R *y, const R *x, const int32_t *pos, const int32_t *docs, int64_t s,
                     int64_t b, int64_t H, int64_t d, int64_t rot_dim, double theta, double sign) {
    int64_t half = rot_dim / 2;
    for (int64_t i = 0; i < s; i++) {
        for (int64_t bi = 0; bi < b; bi++) {
            /* the position, counted from the row's document start with documents */
            double p = (pos ? pos[i] : (double)i) - (docs ? docs[i * b + bi] : 0);
            for (int64_t f = 0; f < half; f++) {
                double ang = p * pow(theta, -2.0 * (double)f / (double)rot_dim);
                R cs = (R)cos(ang), sn = (R)(sign * sin(ang));
                for (int64_t h = 0; h < H; h++) {
                    const R *xr = x + ((i * b + bi) * H + h) * d;
                    R *yr = y + ((i * b + bi) * H + h) * d;
                    R x0 = xr[f], x1 = xr[f + half];
                    yr[f] = x0 * cs - x1 * sn;
                    yr[f + half] = x1 * cs + x0 * sn;
                }
            }
        }
        if (y != x)
            for (int64_t bh = 0; bh < b * H; bh++)
                for (int64_t c = rot_dim; c < d; c++)
                    y[(i * b * H + bh) * d + c] = x[(i * b * H + bh) * d + c];
    }
}

void FN(mgc_cpu_rope_fwd)(R *y, const R *x, const int32_t *pos, const int32_t *docs, int64_t s,
                          int64_t b, int64_t H, int64_t d, int64_t rot_dim, double theta) {
    FN(rope)(y, x, pos, docs, s, b, H, d, rot_dim, theta, 1.0);
}

void FN(mgc_cpu_rope_bwd)(R *dx, const R *dy, const int32_t *pos, const int32_t *docs, int64_t s,
                          int64_t b, int64_t H, int64_t d, int64_t rot_dim, double theta) {
    FN(rope)(dx, dy, pos, docs, s, b, H, d, rot_dim, theta, -1.0);
}

/* ---- attention ------------------------------------------------------------------------ */

/* key j visible from query i: causal, kpos(j) <= qpos(i); with documents, kpos(j) >= ds (the
 * position query i's document starts at) */
static int FN(visible)(int causal, const int32_t *qpos, const int32_t *kpos, int64_t i, int64_t j,
                       int64_t ds) {
    int64_t qp = qpos ? qpos[i] : i, kp = kpos ? kpos[j] : j;
    return (!causal || kp <= qp) && kp >= ds;
}

/* The first position query i (at qp, batch row bi) sees: its document's start (docs) and, with
 * a sliding window of W keys, qp - W + 1; INT64_MIN when neither applies. */
static int64_t FN(lower)(const int32_t *docs, int64_t window, int64_t i, int64_t b, int64_t bi,
                         int64_t qp) {
    int64_t lo = docs ? docs[i * b + bi] : INT64_MIN;
    if (window > 0 && qp - window + 1 > lo) lo = qp - window + 1;
    return lo;
}

/* Documents or a window: the keys before query i's first visible position masked to -inf. */
static void FN(mask_docs)(R *row, const int32_t *kpos, int64_t sk, int64_t ds) {
    for (int64_t j = 0; j < sk; j++)
        if ((kpos ? kpos[j] : j) < ds) row[j] = -INFINITY;
}

/* dropout multiplier of probability (bi, a, i, j): 0 or 1/(1-p); the element is numbered by
 * the global head and positions when rng->heads > 0 (cpu_ops.h mgc_dropout_rng) */
static R FN(attn_keep)(const mgc_dropout_rng *rng, double p, uint32_t thr, int64_t bi, int64_t a,
                       int64_t i, int64_t j, int64_t A, int64_t sq, int64_t sk,
                       const int32_t *qpos, const int32_t *kpos) {
    if (!(p > 0)) return (R)1;
    uint64_t e;
    if (rng->heads > 0) {
        int64_t qp = qpos ? qpos[i] : i, kp = kpos ? kpos[j] : j, S = rng->seq;
        e = rng->elem0 + (uint64_t)(((bi * rng->heads + rng->head0 + a) * S + qp) * S + kp);
    } else {
        e = rng->elem0 + (uint64_t)(((bi * A + a) * sq + i) * sk + j);
    }
    return mgc_rng_u32(rng->seed, rng->stream, e) >= thr ? (R)(1.0 / (1.0 - p)) : (R)0;
}

int64_t FN(mgc_cpu_attention_work)(int64_t sq, int64_t sk, int64_t d) {
    return 2 * sq * sk + 4 * sq * d + 4 * sk * d;
}

/* Gather head h of x (s,b,H,d) for batch row bi into a packed (s,d) matrix, and back. */
static void FN(pack_head)(R *dst, const R *x, int64_t s, int64_t b, int64_t H, int64_t d,
                          int64_t bi, int64_t h) {
    for (int64_t i = 0; i < s; i++)
        memcpy(dst + i * d, x + ((i * b + bi) * H + h) * d, (size_t)d * sizeof(R));
}
static void FN(unpack_head)(R *x, const R *src, int64_t s, int64_t b, int64_t H, int64_t d,
                            int64_t bi, int64_t h) {
    for (int64_t i = 0; i < s; i++)
        memcpy(x + ((i * b + bi) * H + h) * d, src + i * d, (size_t)d * sizeof(R));
}

/* Per (batch row, head): S = scale Q K^T (GEMM), a masked softmax row by row,
 * O = P V (GEMM).  The (sq, sk) score block lives in `work` only: memory is
 * linear in the sequence outside this call, as with flash attention. */
void FN(mgc_cpu_attention_fwd)(R *out, R *lse, const R *q, const R *k, const R *v, int64_t sq,
                               int64_t sk, int64_t b, int64_t A, int64_t G, int64_t d, double scale,
                               int causal, const int32_t *qpos, const int32_t *kpos,
                               const int32_t *docs, int64_t window, double dropout_p,
                               const mgc_dropout_rng *rng, R *work) {
    uint32_t thr = mgc_rng_drop_threshold(dropout_p);
    int64_t per = A / G;
    R *S = work, *Qc = S + 2 * sq * sk, *Oc = Qc + sq * d, *Kc = Oc + 3 * sq * d, *Vc = Kc + sk * d;
    for (int64_t bi = 0; bi < b; bi++)
        for (int64_t g = 0; g < G; g++) {
            FN(pack_head)(Kc, k, sk, b, G, d, bi, g);
            FN(pack_head)(Vc, v, sk, b, G, d, bi, g);
            for (int64_t a = g * per; a < (g + 1) * per; a++) {
                FN(pack_head)(Qc, q, sq, b, A, d, bi, a);
                GEMM(CblasRowMajor, CblasNoTrans, CblasTrans, (int)sq, (int)sk, (int)d, (R)scale, Qc,
                     (int)d, Kc, (int)d, (R)0, S, (int)sk);
                for (int64_t i = 0; i < sq; i++) {
                    R *row = S + i * sk, mx = -INFINITY;
                    int64_t qp = qpos ? qpos[i] : i;
                    /* key j is visible iff !causal or its position <= the query's; without
                     * kpos the visible keys are a prefix, and the loops vectorise */
                    int64_t lim = kpos || !causal ? sk : (qp + 1 < sk ? qp + 1 : sk);
                    if (lim < 0) lim = 0;
                    if (kpos && causal)
                        for (int64_t j = 0; j < sk; j++)
                            row[j] = kpos[j] <= qp ? row[j] : -INFINITY;
                    if (docs || window > 0)
                        FN(mask_docs)(row, kpos, lim, FN(lower)(docs, window, i, b, bi, qp));
                    for (int64_t j = 0; j < lim; j++)
                        mx = row[j] > mx ? row[j] : mx;
                    R *l = lse + (i * b + bi) * A + a;
                    if (mx == -INFINITY) { /* no visible key: out 0, lse -inf */
                        *l = -INFINITY;
                        for (int64_t j = 0; j < sk; j++)
                            row[j] = 0;
                        continue;
                    }
                    R sum = 0;
                    for (int64_t j = 0; j < lim; j++) {
                        R e = FEXP(row[j] - mx);
                        e = row[j] == -INFINITY ? (R)0 : e;
                        row[j] = e;
                        sum += e;
                    }
                    for (int64_t j = lim; j < sk; j++)
                        row[j] = 0;
                    *l = mx + log(sum);
                    R inv = (R)1 / sum;
                    for (int64_t j = 0; j < sk; j++)
                        row[j] *= inv;
                    if (dropout_p > 0)
                        for (int64_t j = 0; j < sk; j++)
                            row[j] *= FN(attn_keep)(rng, dropout_p, thr, bi, a, i, j, A, sq, sk, qpos,
                                                          kpos);
                }
                GEMM(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)sq, (int)d, (int)sk, (R)1, S,
                     (int)sk, Vc, (int)d, (R)0, Oc, (int)d);
                FN(unpack_head)(out, Oc, sq, b, A, d, bi, a);
            }
        }
}

/* The backward per (batch row, kv group): P from the saved lse, dV += (P Z)^T dO,
 * dP = dO V^T, dS = P (dP Z - rowsum(dO O)) scale, dQ = dS K, dK += dS^T Q; the
 * group's query heads are summed in order into dK and dV. */
void FN(mgc_cpu_attention_bwd)(R *dq, R *dk, R *dv, const R *dout, const R *q, const R *k,
                               const R *v, const R *out, const R *lse, int64_t sq, int64_t sk,
                               int64_t b, int64_t A, int64_t G, int64_t d, double scale, int causal,
                               const int32_t *qpos, const int32_t *kpos, const int32_t *docs,
                               int64_t window, double dropout_p, const mgc_dropout_rng *rng, R *work) {
    uint32_t thr = mgc_rng_drop_threshold(dropout_p);
    int64_t per = A / G;
    R *P = work, *dP = P + sq * sk, *Qc = dP + sq * sk, *dOc = Qc + sq * d, *Oc = dOc + sq * d,
      *dQc = Oc + sq * d, *Kc = dQc + sq * d, *Vc = Kc + sk * d, *dKc = Vc + sk * d,
      *dVc = dKc + sk * d;
    for (int64_t bi = 0; bi < b; bi++)
        for (int64_t g = 0; g < G; g++) {
            FN(pack_head)(Kc, k, sk, b, G, d, bi, g);
            FN(pack_head)(Vc, v, sk, b, G, d, bi, g);
            memset(dKc, 0, (size_t)(2 * sk * d) * sizeof(R));
            for (int64_t a = g * per; a < (g + 1) * per; a++) {
                FN(pack_head)(Qc, q, sq, b, A, d, bi, a);
                FN(pack_head)(dOc, dout, sq, b, A, d, bi, a);
                FN(pack_head)(Oc, out, sq, b, A, d, bi, a);
                GEMM(CblasRowMajor, CblasNoTrans, CblasTrans, (int)sq, (int)sk, (int)d, (R)scale, Qc,
                     (int)d, Kc, (int)d, (R)0, P, (int)sk);
                GEMM(CblasRowMajor, CblasNoTrans, CblasTrans, (int)sq, (int)sk, (int)d, (R)1, dOc,
                     (int)d, Vc, (int)d, (R)0, dP, (int)sk);
                for (int64_t i = 0; i < sq; i++) {
                    R l = lse[(i * b + bi) * A + a], D = 0, *pr = P + i * sk, *dpr = dP + i * sk;
                    int64_t qp = qpos ? qpos[i] : i, ds = FN(lower)(docs, window, i, b, bi, qp);
                    for (int64_t c = 0; c < d; c++)
                        D += dOc[i * d + c] * Oc[i * d + c];
                    if (l == -INFINITY) { /* no visible key: no gradient */
                        for (int64_t j = 0; j < sk; j++)
                            pr[j] = dpr[j] = 0;
                        continue;
                    }
                    if (dropout_p > 0) {
                        for (int64_t j = 0; j < sk; j++) {
                            if (!FN(visible)(causal, qpos, kpos, i, j, ds)) {
                                pr[j] = dpr[j] = 0;
                                continue;
                            }
                            R pj = FEXP(pr[j] - l);
                            R z = FN(attn_keep)(rng, dropout_p, thr, bi, a, i, j, A, sq, sk, qpos, kpos);
                            dpr[j] = pj * (dpr[j] * z - D) * (R)scale; /* dS */
                            pr[j] = pj * z;                           /* dropped-out P for dV */
                        }
                        continue;
                    }
                    int64_t lim = kpos || !causal ? sk : (qp + 1 < sk ? qp + 1 : sk);
                    if (lim < 0) lim = 0;
                    if (kpos && causal)
                        for (int64_t j = 0; j < sk; j++)
                            pr[j] = kpos[j] <= qp ? pr[j] : -INFINITY;
                    if (docs || window > 0) FN(mask_docs)(pr, kpos, lim, ds);
                    for (int64_t j = 0; j < lim; j++) {
                        R pj = FEXP(pr[j] - l);
                        pj = pr[j] == -INFINITY ? (R)0 : pj;
                        dpr[j] = pj * (dpr[j] - D) * (R)scale; /* dS */
                        pr[j] = pj;
                    }
                    for (int64_t j = lim; j < sk; j++)
                        pr[j] = dpr[j] = 0;
                }
                GEMM(CblasRowMajor, CblasTrans, CblasNoTrans, (int)sk, (int)d, (int)sq, (R)1, P,
                     (int)sk, dOc, (int)d, (R)1, dVc, (int)d);
                GEMM(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)sq, (int)d, (int)sk, (R)1, dP,
                     (int)sk, Kc, (int)d, (R)0, dQc, (int)d);
                GEMM(CblasRowMajor, CblasTrans, CblasNoTrans, (int)sk, (int)d, (int)sq, (R)1, dP,
                     (int)sk, Qc, (int)d, (R)1, dKc, (int)d);
                FN(unpack_head)(dq, dQc, sq, b, A, d, bi, a);
            }
            FN(unpack_head)(dk, dKc, sk, b, G, d, bi, g);
            FN(unpack_head)(dv, dVc, sk, b, G, d, bi, g);
        }
}

/* ---- cross-entropy -------------------------------------------------------------------- */

void FN(mgc_cpu_ce_max)(R *mx, const R *logits, int64_t n, int64_t V_l, int64_t ld) {
    for (int64_t r = 0; r < n; r++) {
        R m = -INFINITY;
        for (int64_t c = 0; c < V_l; c++)
            if (logits[r * ld + c] > m) m = logits[r * ld + c];
        mx[r] = m;
    }
}

void FN(mgc_cpu_ce_sums)(R *sumexp, R *tgt, const R *logits, const R *mx, const int32_t *labels,
                         int64_t v0, int64_t n, int64_t V_l, int64_t ld) {
    for (int64_t r = 0; r < n; r++) {
        R s = 0;
        for (int64_t c = 0; c < V_l; c++)
            s += FEXP(logits[r * ld + c] - mx[r]);
        sumexp[r] = s;
        int64_t id = (int64_t)labels[r] - v0;
        tgt[r] = (id >= 0 && id < V_l) ? logits[r * ld + id] : (R)0;
    }
}

void FN(mgc_cpu_ce_finish)(R *lse, R *loss, R *token_loss, const R *mx, const R *sumexp,
                           const R *tgt, const R *mask, int64_t n) {
    R tot = 0, cnt = 0;
    for (int64_t r = 0; r < n; r++) {
        lse[r] = mx[r] + log(sumexp[r]);
        R m = mask ? mask[r] : (R)1, tl = lse[r] - tgt[r];
        if (token_loss) token_loss[r] = tl;
        if (m != 0) tot += m * tl; /* a masked-out token never contributes, even inf/nan */
        cnt += m;
    }
    loss[0] = tot;
    loss[1] = cnt;
}

void FN(mgc_cpu_ce_fwd)(R *lse, R *loss, R *token_loss, const R *logits, const int32_t *labels,
                        const R *mask, int64_t n, int64_t V, int64_t ld, R *work) {
    R *mx = work, *se = work + n, *tg = work + 2 * n;
    FN(mgc_cpu_ce_max)(mx, logits, n, V, ld);
    FN(mgc_cpu_ce_sums)(se, tg, logits, mx, labels, 0, n, V, ld);
    FN(mgc_cpu_ce_finish)(lse, loss, token_loss, mx, se, tg, mask, n);
}

void FN(mgc_cpu_ce_bwd)(R *dlogits, const R *logits, const R *lse, const int32_t *labels,
                        const R *mask, double dloss, int64_t v0, int64_t n, int64_t V_l,
                        int64_t ld) {
    for (int64_t r = 0; r < n; r++) {
        R m = (mask ? mask[r] : (R)1) * (R)dloss;
        int64_t id = (int64_t)labels[r] - v0;
        for (int64_t c = 0; c < V_l; c++) {
            R g = m == 0 ? (R)0 : m * (FEXP(logits[r * ld + c] - lse[r]) - (c == id ? (R)1 : (R)0));
            dlogits[r * ld + c] = g;
        }
        for (int64_t c = V_l; c < ld; c++)
            dlogits[r * ld + c] = 0;
    }
}

/* ---- MoE router ----------------------------------------------------------------------- */

static R FN(sigm)(R x) {
    return (R)1 / ((R)1 + exp(-x));
}

/* top-k of row l (E) into ex (k): descending value, ties to the lower expert index; only the
 * experts [lo, hi) with allow[e] (allow NULL: all) */
static void FN(topk)(int32_t *ex, const R *l, int64_t lo, int64_t hi, int64_t k,
                     const uint8_t *allow) {
    for (int64_t j = 0; j < k; j++) {
        int64_t best = -1;
        for (int64_t e = lo; e < hi; e++) {
            int taken = allow && !allow[e];
            for (int64_t u = 0; u < j; u++)
                taken |= ex[u] == e;
            if (taken) continue;
            if (best < 0 || l[e] > l[best]) best = e;
        }
        ex[j] = (int32_t)best;
    }
}

/* The experts of row l (E; lse its log-sum-exp) under a mgc_router_choice (cpu_ops.h) */
static void FN(choose)(int32_t *ex, const R *l, R lse, int64_t E, int64_t k, mgc_router_score score,
                       const mgc_router_choice *ch) {
    R sv[E > 0 ? E : 1];
    for (int64_t e = 0; e < E; e++) {
        sv[e] = score == MGC_ROUTER_SIGMOID       ? FN(sigm)(l[e])
                : score == MGC_ROUTER_SOFTMAX_PRE ? (R)exp(l[e] - lse)
                                                  : l[e];
        if (ch->bias) sv[e] += (R)ch->bias[e];
    }
    uint8_t allow[E > 0 ? E : 1];
    if (ch->groups > 0) {
        int64_t G = ch->groups, EG = E / G, m = k / ch->group_topk;
        R gs[G];
        int32_t top[m > 0 ? m : 1];
        for (int64_t g = 0; g < G; g++) {
            FN(topk)(top, sv, g * EG, (g + 1) * EG, m, NULL);
            gs[g] = 0;
            for (int64_t j = 0; j < m; j++)
                gs[g] += sv[top[j]];
        }
        int32_t gtop[ch->group_topk];
        FN(topk)(gtop, gs, 0, G, ch->group_topk, NULL);
        for (int64_t e = 0; e < E; e++) {
            allow[e] = 0;
            for (int64_t j = 0; j < ch->group_topk; j++)
                allow[e] |= gtop[j] == e / EG;
        }
    }
    /* without a bias the logits order the experts as the scores do */
    FN(topk)(ex, ch->bias ? sv : l, 0, E, k, ch->groups > 0 ? allow : NULL);
}

/* full-distribution scores p (E) of row l: softmax, or sigmoid normalised over E */
static R FN(full_scores)(R *p, const R *l, int64_t E, mgc_router_score score) {
    R lse = -INFINITY;
    if (score == MGC_ROUTER_SIGMOID) {
        R s = 0;
        for (int64_t e = 0; e < E; e++)
            s += (p[e] = FN(sigm)(l[e]));
        for (int64_t e = 0; e < E; e++)
            p[e] /= s;
    }
    R mx = -INFINITY, s = 0;
    for (int64_t e = 0; e < E; e++)
        if (l[e] > mx) mx = l[e];
    for (int64_t e = 0; e < E; e++)
        s += exp(l[e] - mx);
    lse = mx + log(s);
    if (score != MGC_ROUTER_SIGMOID)
        for (int64_t e = 0; e < E; e++)
            p[e] = exp(l[e] - lse);
    return lse;
}

void FN(mgc_cpu_moe_route_fwd)(R *probs, int32_t *experts, int32_t *counts, R *z, const R *logits,
                               int64_t n, int64_t E, int64_t k, mgc_router_score score,
                               const mgc_router_choice *choice, double scale, double z_coeff) {
    R zs = 0;
    for (int64_t e = 0; e < E; e++)
        counts[e] = 0;
    if (choice && choice->groups <= 0 && !choice->bias) choice = NULL;
    for (int64_t t = 0; t < n; t++) {
        const R *l = logits + t * E;
        int32_t *ex = experts + t * k;
        R *pr = probs + t * k;
        R mx = -INFINITY, s = 0, lse = 0;
        for (int64_t e = 0; e < E; e++)
            if (l[e] > mx) mx = l[e];
        for (int64_t e = 0; e < E; e++)
            s += exp(l[e] - mx);
        lse = mx + log(s);
        if (choice)
            FN(choose)(ex, l, lse, E, k, score, choice);
        else
            FN(topk)(ex, l, 0, E, k, NULL);
        zs += lse * lse;
        if (score == MGC_ROUTER_SOFTMAX_PRE) {
            for (int64_t j = 0; j < k; j++)
                pr[j] = exp(l[ex[j]] - lse);
        } else if (score == MGC_ROUTER_SOFTMAX) {
            R ss = 0, mc = l[ex[0]]; /* the max of the chosen */
            for (int64_t j = 1; j < k; j++)
                if (l[ex[j]] > mc) mc = l[ex[j]];
            for (int64_t j = 0; j < k; j++)
                ss += (pr[j] = exp(l[ex[j]] - mc));
            for (int64_t j = 0; j < k; j++)
                pr[j] /= ss;
        } else {
            R ss = 0;
            for (int64_t j = 0; j < k; j++)
                ss += (pr[j] = FN(sigm)(l[ex[j]]));
            if (k > 1)
                for (int64_t j = 0; j < k; j++)
                    pr[j] /= ss;
        }
        for (int64_t j = 0; j < k; j++) {
            pr[j] *= (R)scale;
            counts[ex[j]]++;
        }
    }
    if (z) *z = n > 0 ? (R)z_coeff * zs / (R)n : (R)0;
}

R FN(mgc_cpu_moe_aux_loss)(const R *logits, const int32_t *counts, int64_t n, int64_t E, int64_t k,
                           int64_t T, int64_t C, mgc_router_score score, double coeff) {
    R acc = 0;
    for (int64_t t = 0; t < n; t++) {
        R p[E > 0 ? E : 1];
        const int32_t *c = counts + (C > 1 ? t % C : 0) * E;
        FN(full_scores)(p, logits + t * E, E, score);
        for (int64_t e = 0; e < E; e++)
            acc += p[e] * (R)c[e];
    }
    return (R)(coeff * (double)E * (double)(C > 1 ? C : 1) / ((double)k * (double)T * (double)T)) *
           acc;
}

void FN(mgc_cpu_moe_route_bwd)(R *dlogits, const R *dprobs, const R *logits, const int32_t *experts,
                               const int32_t *counts, int64_t n, int64_t E, int64_t k, int64_t T,
                               int64_t C, mgc_router_score score, double scale, double aux_coeff,
                               double daux, double z_coeff, double dz) {
    R K = (R)(daux * aux_coeff * (double)E * (double)(C > 1 ? C : 1) /
              ((double)k * (double)T * (double)T));
    R zk = n > 0 ? (R)(dz * z_coeff * 2.0 / (double)n) : (R)0;
    for (int64_t t = 0; t < n; t++) {
        const R *l = logits + t * E;
        const int32_t *ex = experts + t * k;
        const R *dp = dprobs + t * k;
        R *dl = dlogits + t * E;
        R p[E > 0 ? E : 1], sm[E > 0 ? E : 1], h[E > 0 ? E : 1];
        for (int64_t e = 0; e < E; e++)
            dl[e] = 0;
        /* the probabilities */
        if (score == MGC_ROUTER_SOFTMAX_PRE) {
            FN(full_scores)(sm, l, E, MGC_ROUTER_SOFTMAX);
            for (int64_t e = 0; e < E; e++)
                h[e] = 0;
            for (int64_t j = 0; j < k; j++)
                h[ex[j]] = (R)scale * dp[j];
            R dot = 0;
            for (int64_t e = 0; e < E; e++)
                dot += sm[e] * h[e];
            for (int64_t e = 0; e < E; e++)
                dl[e] += sm[e] * (h[e] - dot);
        } else if (score == MGC_ROUTER_SOFTMAX) {
            R q[k > 0 ? k : 1], ss = 0, dot = 0;
            for (int64_t j = 0; j < k; j++)
                ss += (q[j] = exp(l[ex[j]] - l[ex[0]]));
            for (int64_t j = 0; j < k; j++)
                dot += (q[j] /= ss) * (R)scale * dp[j];
            for (int64_t j = 0; j < k; j++)
                dl[ex[j]] += q[j] * ((R)scale * dp[j] - dot);
        } else {
            R sg[k > 0 ? k : 1], ss = 0, dot = 0;
            for (int64_t j = 0; j < k; j++)
                ss += (sg[j] = FN(sigm)(l[ex[j]]));
            if (k > 1) {
                for (int64_t j = 0; j < k; j++)
                    dot += sg[j] / ss * (R)scale * dp[j];
                for (int64_t j = 0; j < k; j++)
                    dl[ex[j]] += ((R)scale * dp[j] - dot) / ss * sg[j] * ((R)1 - sg[j]);
            } else {
                for (int64_t j = 0; j < k; j++)
                    dl[ex[j]] += (R)scale * dp[j] * sg[j] * ((R)1 - sg[j]);
            }
        }
        /* the aux loss: d/dp_{t,e} = K c_e through the full-distribution scores (c: the
         * token's sequence's counts when C > 1) */
        if (K != 0) {
            const int32_t *cnt = counts + (C > 1 ? t % C : 0) * E;
            FN(full_scores)(p, l, E, score);
            R dot = 0;
            for (int64_t e = 0; e < E; e++)
                dot += p[e] * K * (R)cnt[e];
            if (score == MGC_ROUTER_SIGMOID) {
                R s = 0;
                for (int64_t e = 0; e < E; e++)
                    s += FN(sigm)(l[e]);
                for (int64_t e = 0; e < E; e++) {
                    R se = FN(sigm)(l[e]);
                    dl[e] += (K * (R)cnt[e] - dot) / s * se * ((R)1 - se);
                }
            } else {
                for (int64_t e = 0; e < E; e++)
                    dl[e] += p[e] * (K * (R)cnt[e] - dot);
            }
        }
        /* the z-loss: d/dl = zk lse softmax */
        if (zk != 0) {
            R lse = FN(full_scores)(sm, l, E, MGC_ROUTER_SOFTMAX);
            for (int64_t e = 0; e < E; e++)
                dl[e] += zk * lse * sm[e];
        }
    }
}

/* ---- MoE dispatch / combine ----------------------------------------------------------- */

/* a before b in the "probs" drop order: higher prob first, then lower assignment index */
static int FN(before)(const R *probs, int32_t a, int32_t b) {
    return probs[a] > probs[b] || (probs[a] == probs[b] && a < b);
}

int64_t FN(mgc_cpu_moe_dispatch_map)(int32_t *row_src, int32_t *row_of, int32_t *counts,
                                     const int32_t *experts, const R *probs, int64_t n, int64_t k,
                                     int64_t E, int64_t capacity, mgc_drop_policy policy) {
    int64_t nk = n * k, R0 = 0;
    for (int64_t a = 0; a < nk; a++)
        row_of[a] = -1;
    for (int64_t e = 0; e < E; e++) {
        int64_t c = 0;
        for (int64_t a = 0; a < nk; a++)
            if (experts[a] == e) row_src[R0 + c++] = (int32_t)a;
        if (capacity > 0 && c > capacity) {
            int32_t *seg = row_src + R0;
            if (policy == MGC_DROP_PROBS) {
                for (int64_t u = 1; u < c; u++) /* insertion sort by drop order */
                    for (int64_t w = u; w > 0 && FN(before)(probs, seg[w], seg[w - 1]); w--) {
                        int32_t tmp = seg[w];
                        seg[w] = seg[w - 1];
                        seg[w - 1] = tmp;
                    }
                for (int64_t u = 1; u < capacity; u++) /* kept ones back to assignment order */
                    for (int64_t w = u; w > 0 && seg[w] < seg[w - 1]; w--) {
                        int32_t tmp = seg[w];
                        seg[w] = seg[w - 1];
                        seg[w - 1] = tmp;
                    }
            }
            c = capacity;
        }
        for (int64_t u = 0; u < c; u++)
            row_of[row_src[R0 + u]] = (int32_t)(R0 + u);
        counts[e] = (int32_t)c;
        R0 += c;
    }
    return R0;
}

void FN(mgc_cpu_moe_permute)(R *rows, const R *x, const int32_t *row_src, int64_t Rn, int64_t k,
                             int64_t h) {
    for (int64_t r = 0; r < Rn; r++) {
        const R *src = x + (row_src[r] / k) * h;
        for (int64_t c = 0; c < h; c++)
            rows[r * h + c] = src[c];
    }
}

void FN(mgc_cpu_moe_permute_bwd)(R *dx, const R *drows, const int32_t *row_of, int64_t n, int64_t k,
                                 int64_t h) {
    for (int64_t t = 0; t < n; t++) {
        R *o = dx + t * h;
        for (int64_t c = 0; c < h; c++)
            o[c] = 0;
        for (int64_t j = 0; j < k; j++) {
            int32_t r = row_of[t * k + j];
            if (r < 0) continue;
            for (int64_t c = 0; c < h; c++)
                o[c] += drows[r * h + c];
        }
    }
}

void FN(mgc_cpu_moe_combine)(R *y, const R *rows, const R *probs, const int32_t *row_of, int64_t n,
                             int64_t k, int64_t h) {
    for (int64_t t = 0; t < n; t++) {
        R *o = y + t * h;
        for (int64_t c = 0; c < h; c++)
            o[c] = 0;
        for (int64_t j = 0; j < k; j++) {
            int32_t r = row_of[t * k + j];
            if (r < 0) continue;
            for (int64_t c = 0; c < h; c++)
                o[c] += probs[t * k + j] * rows[r * h + c];
        }
    }
}

void FN(mgc_cpu_moe_combine_bwd)(R *drows, R *dprobs, const R *dy, const R *rows, const R *probs,
                                 const int32_t *row_of, int64_t n, int64_t k, int64_t h) {
    for (int64_t t = 0; t < n; t++)
        for (int64_t j = 0; j < k; j++) {
            int32_t r = row_of[t * k + j];
            R dot = 0;
            if (r >= 0) {
                for (int64_t c = 0; c < h; c++) {
                    dot += dy[t * h + c] * rows[r * h + c];
                    drows[r * h + c] = probs[t * k + j] * dy[t * h + c];
                }
            }
            dprobs[t * k + j] = dot;
        }
}
