/* norm.cuh - LayerNorm and RMSNorm, forward and backward (runtime/cpu_ops_tmpl.h math).
 *
 * Constants: H (hidden size), T (threads per block, a multiple of 32, <= 1024; codegen
 * picks ceil(H / 8) rounded up to 32).  A thread holds the NPER = ceil(H / T) elements
 * c = k*T + tid of a row in registers (coalesced accesses); the backward, which also holds
 * the dw/db sums of its columns, re-reads x and dy from L1/L2 instead when NPER > 8
 * (H > 8192), so that nothing spills.  Statistics: two block reductions (mean, then the centred sum of squares,
 * biased variance) for LayerNorm, one (mean of squares) for RMSNorm; rstd = 1 / sqrt(. + eps).
 *
 * Entries:
 *   layernorm_fwd, rmsnorm_fwd    y = (x - mean) rstd w + b  /  x rstd w
 *   layernorm_bwd, rmsnorm_bwd    dx (written) and per-block partial sums of dw (and db);
 *                                 RES = 1: dx = gres + d norm (the residual stream's gradient
 *                                 added in the same pass, compiler/fusion.c); RES = 0: gres unused
 *   norm_bwd_reduce               dw += sum of the partials, db likewise (fixed order)
 *   add_layernorm_fwd, add_rmsnorm_fwd   the fused dropout_add + norm (compiler/fusion.c):
 *                                 h = residual + dropout(branch) (written, rounded to the
 *                                 compute dtype), y = norm(h as rounded), mask (may be NULL)
 * The backward never uses atomics: block p of the first kernel owns rows p, p + NB, ...
 * and writes its column sums to part[p][.]; the reduce kernel adds part[0..NB) in order. */
/* NVRTC has no <math.h>: INFINITY (used by mgc_common.cuh's mgc_block_max) */
#ifndef INFINITY
#define INFINITY __int_as_float(0x7f800000)
#endif
#include "mgc_common.cuh"

#if defined(MGC_ENTRY_layernorm_fwd) || defined(MGC_ENTRY_layernorm_bwd) || defined(MGC_ENTRY_add_layernorm_fwd)
#define MGC_NORM_RMS 0
#else
#define MGC_NORM_RMS 1
#endif

#if defined(MGC_H)
#define MGC_NPER ((MGC_H + MGC_T - 1) / MGC_T)
#endif

#if defined(MGC_ENTRY_layernorm_fwd) || defined(MGC_ENTRY_rmsnorm_fwd) || \
    defined(MGC_ENTRY_add_layernorm_fwd) || defined(MGC_ENTRY_add_rmsnorm_fwd)
/* The forward of one row held in registers (v: NPER values a thread, c = k*T + tid, 0 past
 * H): its statistics by block reductions, then y = (v - mean) rstd w + b  /  v rstd w. */
__device__ __forceinline__ void mgc_norm_row_fwd(const float (&v)[MGC_NPER], mgc_t *__restrict__ yr,
                                                 const mgc_t *__restrict__ w, const mgc_t *__restrict__ bias,
                                                 float eps, float *sh) {
#if MGC_NORM_RMS
    float ss = 0.0f;
#pragma unroll
    for (int k = 0; k < MGC_NPER; k++)
        ss += v[k] * v[k];
    ss = mgc_block_sum(ss, sh);
    float m = 0.0f, rs = 1.0f / sqrtf(ss / (float)MGC_H + eps);
    (void)bias;
#else
    float s = 0.0f;
#pragma unroll
    for (int k = 0; k < MGC_NPER; k++)
        s += v[k];
    float m = mgc_block_sum(s, sh) / (float)MGC_H;
    float q = 0.0f;
#pragma unroll
    for (int k = 0; k < MGC_NPER; k++) {
        int c = k * MGC_T + threadIdx.x;
        float d = v[k] - m;
        q += c < MGC_H ? d * d : 0.0f;
    }
    float rs = 1.0f / sqrtf(mgc_block_sum(q, sh) / (float)MGC_H + eps);
#endif
#pragma unroll
    for (int k = 0; k < MGC_NPER; k++) {
        int c = k * MGC_T + threadIdx.x;
        if (c < MGC_H) {
#if MGC_NORM_RMS
            yr[c] = mgc_st(v[k] * rs * mgc_ld(w[c]));
#else
            yr[c] = mgc_st((v[k] - m) * rs * mgc_ld(w[c]) + (bias ? mgc_ld(bias[c]) : 0.0f));
#endif
        }
    }
}
#endif

#if defined(MGC_ENTRY_layernorm_fwd) || defined(MGC_ENTRY_rmsnorm_fwd)
/* grid rows, block T, smem 0 (128 B static).  bias may be NULL (LayerNorm only). */
extern "C" __global__ void __launch_bounds__(MGC_T, 1)
    MGC_ENTRY_NAME(mgc_t *__restrict__ y, const mgc_t *__restrict__ x,
                   const mgc_t *__restrict__ w, const mgc_t *__restrict__ bias, i64 rows,
                   float eps) {
    __shared__ float sh[32];
    i64 r = blockIdx.x; /* grid = rows exactly (no early exit: ptxas then keeps no stack) */
    (void)rows;
    const mgc_t *xr = x + r * (i64)MGC_H;
    float v[MGC_NPER];
#pragma unroll
    for (int k = 0; k < MGC_NPER; k++) {
        int c = k * MGC_T + threadIdx.x;
        v[k] = c < MGC_H ? mgc_ld(xr[c]) : 0.0f;
    }
    mgc_norm_row_fwd(v, y + r * (i64)MGC_H, w, bias, eps, sh);
}
#endif

#if defined(MGC_ENTRY_add_layernorm_fwd) || defined(MGC_ENTRY_add_rmsnorm_fwd)
/* grid rows, block T, smem 0 (128 B static).  Row r, column c is element e = elem0 + r*H + c
 * of the dropout stream (pointwise.cuh's numbering: word e & 3 of Philox block e >> 2, kept
 * iff >= thr); drop == 0: no dropout.  h and y are exactly the unfused pair's: h is rounded
 * to the compute dtype before the norm reads it.  bias may be NULL (LayerNorm only). */
extern "C" __global__ void __launch_bounds__(MGC_T, 1)
    MGC_ENTRY_NAME(mgc_t *__restrict__ h, mgc_t *__restrict__ y, unsigned char *__restrict__ mask,
                   const mgc_t *__restrict__ branch, const mgc_t *__restrict__ res,
                   const mgc_t *__restrict__ w, const mgc_t *__restrict__ bias, i64 rows, float eps,
                   unsigned long long seed, unsigned long long stream, unsigned long long elem0,
                   unsigned thr, float sc, int drop) {
    __shared__ float sh[32];
    i64 r = blockIdx.x; /* grid = rows exactly */
    (void)rows;
    const mgc_t *br = branch + r * (i64)MGC_H, *rr = res + r * (i64)MGC_H;
    mgc_t *hr = h + r * (i64)MGC_H;
    float v[MGC_NPER];
#pragma unroll
    for (int k = 0; k < MGC_NPER; k++) {
        int c = k * MGC_T + threadIdx.x;
        v[k] = 0.0f;
        if (c < MGC_H) {
            unsigned long long e = elem0 + (unsigned long long)(r * (i64)MGC_H + c);
            int kp = drop ? mgc_philox_word(seed, stream, e) >= thr : 1;
            float xv = mgc_ld(br[c]);
            float s = (kp ? (drop ? xv * sc : xv) : 0.0f) + mgc_ld(rr[c]);
            mgc_t hv = mgc_st(s);
            hr[c] = hv;
            if (mask) mask[r * (i64)MGC_H + c] = (unsigned char)kp;
            v[k] = mgc_ld(hv);
        }
    }
    mgc_norm_row_fwd(v, y + r * (i64)MGC_H, w, bias, eps, sh);
}
#endif

#if defined(MGC_ENTRY_layernorm_bwd) || defined(MGC_ENTRY_rmsnorm_bwd)
/* grid NB = min(rows, 256) (the launcher's fixed choice, never the SM count, so the bits do
 * not depend on the GPU), block T, smem 0 (128 B static).  Block p handles rows p, p+NB, ...
 * and writes part[p*H + c] = sum over its rows of dy xhat (dw), and, when want_db,
 * part[(NB + p)*H + c] = sum of dy (db).  dx = rstd (g - mean(g) - xhat mean(g xhat)),
 * g = dy w (RMSNorm: no mean(g) term, xhat = x rstd). */
#define MGC_NORM_RELOAD (MGC_NPER > 8)
extern "C" __global__ void __launch_bounds__(MGC_T, 1)
    MGC_ENTRY_NAME(mgc_t *__restrict__ dx, float *__restrict__ part,
                   const mgc_t *__restrict__ dy, const mgc_t *__restrict__ x,
                   const mgc_t *__restrict__ w, const mgc_t *__restrict__ gres, i64 rows, float eps,
                   int want_db) {
    __shared__ float sh[32];
    float aw[MGC_NPER], ab[MGC_NPER];
#pragma unroll
    for (int k = 0; k < MGC_NPER; k++)
        aw[k] = ab[k] = 0.0f;
    for (i64 r = blockIdx.x; r < rows; r += gridDim.x) {
        const mgc_t *xr = x + r * (i64)MGC_H, *gr = dy + r * (i64)MGC_H;
#if MGC_NORM_RELOAD /* wide rows: x and dy re-read (L1/L2) instead of held in registers */
#define MGC_XV(k) ((k) * MGC_T + threadIdx.x < MGC_H ? mgc_ld(xr[(k) * MGC_T + threadIdx.x]) : 0.0f)
#define MGC_GV(k) ((k) * MGC_T + threadIdx.x < MGC_H ? mgc_ld(gr[(k) * MGC_T + threadIdx.x]) : 0.0f)
#else
        float xv[MGC_NPER], gv[MGC_NPER];
#pragma unroll
        for (int k = 0; k < MGC_NPER; k++) {
            int c = k * MGC_T + threadIdx.x;
            xv[k] = c < MGC_H ? mgc_ld(xr[c]) : 0.0f;
            gv[k] = c < MGC_H ? mgc_ld(gr[c]) : 0.0f;
        }
#define MGC_XV(k) xv[k]
#define MGC_GV(k) gv[k]
#endif
#if MGC_NORM_RMS
        float ss = 0.0f;
#pragma unroll
        for (int k = 0; k < MGC_NPER; k++)
            ss += MGC_XV(k) * MGC_XV(k);
        float m = 0.0f, rs = 1.0f / sqrtf(mgc_block_sum(ss, sh) / (float)MGC_H + eps);
#else
        float s = 0.0f;
#pragma unroll
        for (int k = 0; k < MGC_NPER; k++)
            s += MGC_XV(k);
        float m = mgc_block_sum(s, sh) / (float)MGC_H, q = 0.0f;
#pragma unroll
        for (int k = 0; k < MGC_NPER; k++) {
            int c = k * MGC_T + threadIdx.x;
            float d = MGC_XV(k) - m;
            q += c < MGC_H ? d * d : 0.0f;
        }
        float rs = 1.0f / sqrtf(mgc_block_sum(q, sh) / (float)MGC_H + eps);
#endif
        float sg = 0.0f, sgx = 0.0f;
#pragma unroll
        for (int k = 0; k < MGC_NPER; k++) {
            int c = k * MGC_T + threadIdx.x;
            if (c < MGC_H) {
                float xh = (MGC_XV(k) - m) * rs, g = MGC_GV(k) * mgc_ld(w[c]);
                sg += g;
                sgx += g * xh;
                aw[k] += MGC_GV(k) * xh;
                ab[k] += MGC_GV(k);
            }
        }
#if !MGC_NORM_RMS
        sg = mgc_block_sum(sg, sh) / (float)MGC_H;
#endif
        sgx = mgc_block_sum(sgx, sh) / (float)MGC_H;
        mgc_t *dr = dx + r * (i64)MGC_H;
#if MGC_RES
        const mgc_t *rr = gres + r * (i64)MGC_H;
#endif
#pragma unroll
        for (int k = 0; k < MGC_NPER; k++) {
            int c = k * MGC_T + threadIdx.x;
            if (c < MGC_H) {
                float xh = (MGC_XV(k) - m) * rs, g = MGC_GV(k) * mgc_ld(w[c]);
#if MGC_NORM_RMS
                float v = rs * (g - xh * sgx);
#else
                float v = rs * (g - sg - xh * sgx);
#endif
#if MGC_RES /* the fused residual add: dx = g_res + d norm, rounded once */
                v = mgc_ld(rr[c]) + v;
#endif
                dr[c] = mgc_st(v);
            }
        }
    }
#pragma unroll
    for (int k = 0; k < MGC_NPER; k++) {
        int c = k * MGC_T + threadIdx.x;
        if (c < MGC_H) {
            part[(i64)blockIdx.x * MGC_H + c] = aw[k];
            if (want_db) part[((i64)gridDim.x + blockIdx.x) * MGC_H + c] = ab[k];
        }
    }
}
#endif

#if defined(MGC_ENTRY_norm_bwd_reduce)
/* grid ceil(h / 256), block 256, smem 0.  Column c: dw[c] += sum_{p < nb} part[p*h + c]
 * (p ascending); db (may be NULL) likewise from part[(nb + p)*h + c]. */
extern "C" __global__ void __launch_bounds__(256)
    MGC_ENTRY_NAME(float *__restrict__ dw, float *__restrict__ db,
                   const float *__restrict__ part, int nb, i64 h) {
    i64 c = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= h) return;
    float s = 0.0f;
    for (int p = 0; p < nb; p++)
        s += part[(i64)p * h + c];
    dw[c] += s;
    if (db) {
        float t = 0.0f;
        for (int p = 0; p < nb; p++)
            t += part[((i64)nb + p) * h + c];
        db[c] += t;
    }
}
#endif
