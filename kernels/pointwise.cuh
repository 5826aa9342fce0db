/* pointwise.cuh - element-wise ops of a chunk program: dropout (+ residual add), GELU,
 * SwiGLU, add, the QKV split and rotary embeddings.  The math is the CPU twins' of
 * runtime/cpu_ops_tmpl.h, computed in fp32 (rope's angles in fp64, as there).
 *
 * Entries (launcher: runtime/cuda_ops_pointwise.c):
 *   dropout_fwd, dropout_add_fwd, dropout_bwd     no constants
 *   gelu_fwd, gelu_bwd, add                       no constants
 *   swiglu_fwd, swiglu_bwd                        F (the output's last dim)
 *   qkv_split_fwd, qkv_split_bwd                  G, PER (query heads per group), D (head dim)
 *   qkv_rope_fwd, qkv_rope_bwd                    G, PER, D, ROT: the split with rope (q, k)
 *   rope                                          D (head dim), ROT (rotary dim, even, <= D)
 *
 * Element-wise geometry (all but rope): grid-stride loops, so any grid works; the launcher
 * uses block 256 and grid min(ceil(work / 256), 16 * SMs), no dynamic shared memory, with
 * work = ceil(n / 8).  A work item is 8 consecutive elements (16-byte loads and stores of
 * bf16, two of fp32) when every pointer is 16-byte aligned (a uniform test; the arena aligns
 * tensors to 256 bytes), the last n % 8 elements one by one; otherwise element by element.
 * The index space is 64-bit (additions only: no division per element but qkv_split's, by
 * constants, in 32 bits when the index fits). */
/* NVRTC has no <math.h>: INFINITY (used by mgc_common.cuh's mgc_block_max) */
#ifndef INFINITY
#define INFINITY __int_as_float(0x7f800000)
#endif
#include "mgc_common.cuh"

#define MGC_GRID_STRIDE(i, n)                                                                  \
    for (i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x; i < (n);                          \
         i += (i64)gridDim.x * blockDim.x)

/* Element-wise y[i] = F(i, a[i] (, b[i])) for i < n: 8-element vectors when the pointers are
 * 16-byte aligned (ok8), then the tail; else element by element.  VEC(v) handles elements
 * 8v .. 8v+7, ONE(i) element i. */
#define MGC_EW8(n, ok8, VEC, ONE)                                                              \
    do {                                                                                       \
        i64 n8_ = (ok8) ? (n) >> 3 : 0;                                                        \
        MGC_GRID_STRIDE(v_, n8_) { VEC(v_); }                                                  \
        for (i64 i_ = n8_ * 8 + (i64)blockIdx.x * blockDim.x + threadIdx.x; i_ < (n);           \
             i_ += (i64)gridDim.x * blockDim.x) {                                              \
            ONE(i_);                                                                           \
        }                                                                                      \
    } while (0)

/* ---- dropout -----------------------------------------------------------------------------
 * Element i (0 .. n) of the shard is element elem0 + i of the stream (its step read from
 * `step`: mgc_step_stream); it is kept iff its
 * Philox word >= thr (thr = mgc_rng_drop_threshold(p), computed on the host).  A work item
 * is one Philox block (4 consecutive stream elements), so each word is generated once.
 * drop == 0 (p = 0): y = x, mask all ones (the CPU's p = 0 path). */

#if defined(MGC_ENTRY_dropout_fwd) || defined(MGC_ENTRY_dropout_add_fwd)
/* grid: min(ceil(units / 256), 16 SMs), block 256, smem 0; units = Philox blocks touched
 * = ((elem0 + n - 1) >> 2) - (elem0 >> 2) + 1.
 * y = x * keep * sc (+ residual for dropout_add); mask (may be NULL) = keep. */
extern "C" __global__ void __launch_bounds__(256)
    MGC_ENTRY_NAME(mgc_t *__restrict__ y, unsigned char *__restrict__ mask,
                   const mgc_t *__restrict__ x, const mgc_t *__restrict__ res, i64 n,
                   unsigned long long seed, unsigned long long stream,
                   const unsigned long long *__restrict__ step, unsigned long long elem0,
                   unsigned thr, float sc, int drop) {
    mgc_pdl_begin();
    if (n <= 0) return;
    if (drop) stream = mgc_step_stream(stream, step);
#if defined(MGC_ENTRY_dropout_add_fwd)
    const bool rok = mgc_al16(res);
#else
    const bool rok = true;
#endif
    if ((elem0 & 3ull) == 0 && mgc_al16(y) && mgc_al16(x) && rok &&
        ((unsigned long long)mask & 7ull) == 0) {
        /* 8 elements (2 Philox blocks) an item; the rest one by one with its word */
        i64 n8 = n >> 3;
        MGC_GRID_STRIDE(v, n8) {
            unsigned wd[8] = {0u, 0u, 0u, 0u, 0u, 0u, 0u, 0u};
            if (drop) mgc_philox_words8(seed, stream, elem0 + 8ull * (unsigned long long)v, wd);
            float f[8];
            mgc_ld8(x + 8 * v, f);
#if defined(MGC_ENTRY_dropout_add_fwd)
            float rv[8];
            mgc_ld8(res + 8 * v, rv);
#endif
            unsigned mk[2] = {0u, 0u};
#pragma unroll
            for (int j = 0; j < 8; j++) {
                int kp = drop ? wd[j] >= thr : 1;
                float o = kp ? (drop ? f[j] * sc : f[j]) : 0.0f;
#if defined(MGC_ENTRY_dropout_add_fwd)
                o = o + rv[j];
#endif
                f[j] = o;
                mk[j >> 2] |= (unsigned)kp << (8 * (j & 3));
            }
            mgc_st8(y + 8 * v, f);
            if (mask) *(uint2 *)(mask + 8 * v) = make_uint2(mk[0], mk[1]);
        }
        for (i64 i = n8 * 8 + (i64)blockIdx.x * blockDim.x + threadIdx.x; i < n;
             i += (i64)gridDim.x * blockDim.x) {
            int kp = drop ? mgc_philox_word(seed, stream, elem0 + (unsigned long long)i) >= thr : 1;
            float xv = mgc_ld(x[i]);
            float o = kp ? (drop ? xv * sc : xv) : 0.0f;
#if defined(MGC_ENTRY_dropout_add_fwd)
            o = o + mgc_ld(res[i]);
#endif
            y[i] = mgc_st(o);
            if (mask) mask[i] = (unsigned char)kp;
        }
        return;
    }
    unsigned long long b0 = elem0 >> 2;
    i64 units = (i64)(((elem0 + (unsigned long long)n - 1ull) >> 2) - b0 + 1ull);
    MGC_GRID_STRIDE(u, units) {
        unsigned w[4] = {0u, 0u, 0u, 0u};
        unsigned long long blk = b0 + (unsigned long long)u;
        if (drop) mgc_philox4x32(seed, stream, blk, w);
#pragma unroll
        for (int k = 0; k < 4; k++) {
            i64 i = (i64)(blk * 4ull + (unsigned long long)k - elem0);
            if (blk * 4ull + (unsigned long long)k < elem0 || i >= n) continue;
            int kp = drop ? w[k] >= thr : 1;
            float xv = mgc_ld(x[i]);
            float v = kp ? (drop ? xv * sc : xv) : 0.0f;
#if defined(MGC_ENTRY_dropout_add_fwd)
            v = v + mgc_ld(res[i]);
#endif
            y[i] = mgc_st(v);
            if (mask) mask[i] = (unsigned char)kp;
        }
    }
}
#endif

#if defined(MGC_ENTRY_dropout_bwd)
/* grid/block as dropout_fwd.  dx = dy * keep * sc, keep read from mask, or regenerated
 * from the stream when mask is NULL; drop == 0: dx = dy. */
extern "C" __global__ void __launch_bounds__(256)
    MGC_ENTRY_NAME(mgc_t *__restrict__ dx, const mgc_t *__restrict__ dy,
                   const unsigned char *__restrict__ mask, i64 n, unsigned long long seed,
                   unsigned long long stream, const unsigned long long *__restrict__ step,
                   unsigned long long elem0, unsigned thr, float sc, int drop) {
    mgc_pdl_begin();
    if (n <= 0) return;
    if (drop && !mask) stream = mgc_step_stream(stream, step);
    if ((elem0 & 3ull) == 0 && mgc_al16(dx) && mgc_al16(dy) && ((unsigned long long)mask & 7ull) == 0) {
        i64 n8 = n >> 3; /* 8 elements (2 Philox blocks, or 8 mask bytes) an item */
        MGC_GRID_STRIDE(v, n8) {
            float f[8];
            mgc_ld8(dy + 8 * v, f);
            if (drop) {
                unsigned wd[8];
                if (mask) {
                    uint2 m2 = *(const uint2 *)(mask + 8 * v);
#pragma unroll
                    for (int j = 0; j < 8; j++)
                        wd[j] = ((j < 4 ? m2.x : m2.y) >> (8 * (j & 3))) & 0xffu;
                } else {
                    mgc_philox_words8(seed, stream, elem0 + 8ull * (unsigned long long)v, wd);
                }
#pragma unroll
                for (int j = 0; j < 8; j++) {
                    int kp = mask ? wd[j] != 0 : wd[j] >= thr;
                    f[j] = kp ? f[j] * sc : 0.0f;
                }
            }
            mgc_st8(dx + 8 * v, f);
        }
        for (i64 i = n8 * 8 + (i64)blockIdx.x * blockDim.x + threadIdx.x; i < n;
             i += (i64)gridDim.x * blockDim.x) {
            float g = mgc_ld(dy[i]);
            if (drop) {
                int kp = mask ? mask[i] != 0
                              : mgc_philox_word(seed, stream, elem0 + (unsigned long long)i) >= thr;
                g = kp ? g * sc : 0.0f;
            }
            dx[i] = mgc_st(g);
        }
        return;
    }
    unsigned long long b0 = elem0 >> 2;
    i64 units = (i64)(((elem0 + (unsigned long long)n - 1ull) >> 2) - b0 + 1ull);
    MGC_GRID_STRIDE(u, units) {
        unsigned w[4] = {0u, 0u, 0u, 0u};
        unsigned long long blk = b0 + (unsigned long long)u;
        if (drop && !mask) mgc_philox4x32(seed, stream, blk, w);
#pragma unroll
        for (int k = 0; k < 4; k++) {
            i64 i = (i64)(blk * 4ull + (unsigned long long)k - elem0);
            if (blk * 4ull + (unsigned long long)k < elem0 || i >= n) continue;
            float g = mgc_ld(dy[i]);
            if (!drop) {
                dx[i] = mgc_st(g);
                continue;
            }
            int kp = mask ? mask[i] != 0 : w[k] >= thr;
            dx[i] = mgc_st(kp ? g * sc : 0.0f);
        }
    }
}
#endif

/* ---- GELU (tanh approximation) ---------------------------------------------------------- */

#define MGC_GELU_C 0.7978845608028654f /* sqrt(2/pi) */

/* The CPU's form, exact at the limits (2 / inf = 0), in two MUFU ops: __expf (ex2.approx of
 * a product) and __fdividef (rcp.approx times), a few ulp where expf and IEEE division cost
 * about 30 instructions an element -- more than a memory-bound kernel may spend at full
 * bandwidth; bf16 and fp16 outputs round far coarser.  __fdividef returns 0 for a divisor
 * past 2^126, the limit's value. */
__device__ __forceinline__ float mgc_tanh_exp(float u) {
    return 1.0f - __fdividef(2.0f, __expf(2.0f * u) + 1.0f);
}
/* 1 / (1 + e^-g), the same way (0 below g = -87, 1 above 17) */
__device__ __forceinline__ float mgc_sigmoid(float g) {
    return __fdividef(1.0f, 1.0f + __expf(-g));
}

__device__ __forceinline__ float mgc_gelu(float v) {
    float u = MGC_GELU_C * (v + 0.044715f * v * v * v);
    return 0.5f * v * (1.0f + mgc_tanh_exp(u));
}
/* dy * gelu'(x) */
__device__ __forceinline__ float mgc_gelu_bwd(float g, float xi) {
    float u = MGC_GELU_C * (xi + 0.044715f * xi * xi * xi), t = mgc_tanh_exp(u);
    float du = MGC_GELU_C * (1.0f + 3.0f * 0.044715f * xi * xi);
    return g * (0.5f * (1.0f + t) + 0.5f * xi * (1.0f - t * t) * du);
}

#if defined(MGC_ENTRY_gelu_fwd)
/* grid-stride over n; y = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))). */
extern "C" __global__ void __launch_bounds__(256)
    MGC_ENTRY_NAME(mgc_t *__restrict__ y, const mgc_t *__restrict__ x, i64 n) {
    mgc_pdl_begin();
#define MGC_GELU_VEC(v)                                                                        \
    float f[8];                                                                                \
    mgc_ld8(x + 8 * (v), f);                                                                   \
    _Pragma("unroll") for (int j = 0; j < 8; j++) f[j] = mgc_gelu(f[j]);                       \
    mgc_st8(y + 8 * (v), f)
#define MGC_GELU_ONE(i) y[i] = mgc_st(mgc_gelu(mgc_ld(x[i])))
    MGC_EW8(n, mgc_al16(y) && mgc_al16(x), MGC_GELU_VEC, MGC_GELU_ONE);
}
#endif

#if defined(MGC_ENTRY_gelu_bwd)
/* grid-stride over n; dx = dy * gelu'(x).  dx may be dy (linear_dgrad_gelu without cuBLASLt's
 * DGELU epilogue runs it in place): each element is read before it is written, by one thread. */
extern "C" __global__ void __launch_bounds__(256)
    MGC_ENTRY_NAME(mgc_t *dx, const mgc_t *dy, const mgc_t *__restrict__ x, i64 n) {
    mgc_pdl_begin();
#define MGC_GELUB_VEC(v)                                                                       \
    float f[8], g[8];                                                                          \
    mgc_ld8(x + 8 * (v), f);                                                                   \
    mgc_ld8(dy + 8 * (v), g);                                                                  \
    _Pragma("unroll") for (int j = 0; j < 8; j++) f[j] = mgc_gelu_bwd(g[j], f[j]);            \
    mgc_st8(dx + 8 * (v), f)
#define MGC_GELUB_ONE(i) dx[i] = mgc_st(mgc_gelu_bwd(mgc_ld(dy[i]), mgc_ld(x[i])))
    MGC_EW8(n, mgc_al16(dx) && mgc_al16(dy) && mgc_al16(x), MGC_GELUB_VEC, MGC_GELUB_ONE);
}
#endif

/* ---- SwiGLU: x = [gate | up] (rows, 2F), y = silu(gate) * up (rows, F) ------------------- */

#if defined(MGC_ENTRY_swiglu_fwd)
/* grid-stride over rows * F output elements: 8 of one row an item (16-byte accesses) when
 * F % 8 == 0 and the pointers are 16-byte aligned, else one. */
extern "C" __global__ void __launch_bounds__(256)
    MGC_ENTRY_NAME(mgc_t *__restrict__ y, const mgc_t *__restrict__ x, i64 rows) {
    mgc_pdl_begin();
    const i64 F = MGC_F;
    if (MGC_F % 8 == 0 && mgc_al16(y) && mgc_al16(x)) {
        MGC_GRID_STRIDE(v, rows * (F / 8)) {
            i64 i = 8 * v, r = i / F, c = i - r * F;
            float g[8], u[8];
            mgc_ld8(x + r * 2 * F + c, g);
            mgc_ld8(x + r * 2 * F + F + c, u);
#pragma unroll
            for (int j = 0; j < 8; j++) g[j] = g[j] * mgc_sigmoid(g[j]) * u[j];
            mgc_st8(y + i, g);
        }
        return;
    }
    MGC_GRID_STRIDE(i, rows * F) {
        i64 r = i / F, c = i - r * F;
        float g = mgc_ld(x[r * 2 * F + c]), u = mgc_ld(x[r * 2 * F + F + c]);
        y[i] = mgc_st(g * mgc_sigmoid(g) * u);
    }
}
#endif

#if defined(MGC_ENTRY_swiglu_bwd)
/* grid-stride over rows * F; writes both halves of dx (rows, 2F); 8 columns of one row an
 * item as the forward. */
extern "C" __global__ void __launch_bounds__(256)
    MGC_ENTRY_NAME(mgc_t *__restrict__ dx, const mgc_t *__restrict__ dy,
                   const mgc_t *__restrict__ x, i64 rows) {
    mgc_pdl_begin();
    const i64 F = MGC_F;
    if (MGC_F % 8 == 0 && mgc_al16(dx) && mgc_al16(dy) && mgc_al16(x)) {
        MGC_GRID_STRIDE(v, rows * (F / 8)) {
            i64 i = 8 * v, r = i / F, c = i - r * F;
            float g[8], u[8], d[8], dg[8], du[8];
            mgc_ld8(x + r * 2 * F + c, g);
            mgc_ld8(x + r * 2 * F + F + c, u);
            mgc_ld8(dy + i, d);
#pragma unroll
            for (int j = 0; j < 8; j++) {
                float sg = mgc_sigmoid(g[j]);
                dg[j] = d[j] * u[j] * sg * (1.0f + g[j] * (1.0f - sg));
                du[j] = d[j] * g[j] * sg;
            }
            mgc_st8(dx + r * 2 * F + c, dg);
            mgc_st8(dx + r * 2 * F + F + c, du);
        }
        return;
    }
    MGC_GRID_STRIDE(i, rows * F) {
        i64 r = i / F, c = i - r * F;
        float g = mgc_ld(x[r * 2 * F + c]), u = mgc_ld(x[r * 2 * F + F + c]);
        float sg = mgc_sigmoid(g), d = mgc_ld(dy[i]);
        dx[r * 2 * F + c] = mgc_st(d * u * sg * (1.0f + g * (1.0f - sg)));
        dx[r * 2 * F + F + c] = mgc_st(d * g * sg);
    }
}
#endif

/* ---- add (ADD, and ADD_BWD: the sum of a fan-out's two gradients) ------------------------ */

#if defined(MGC_ENTRY_add)
/* grid-stride over n; y = a + b (y may alias a or b). */
extern "C" __global__ void __launch_bounds__(256)
    MGC_ENTRY_NAME(mgc_t *y, const mgc_t *a, const mgc_t *b, i64 n) {
    mgc_pdl_begin();
    /* y may alias a or b: an item reads its 8 elements before it writes them */
#define MGC_ADD_VEC(v)                                                                         \
    float f[8], g[8];                                                                          \
    mgc_ld8(a + 8 * (v), f);                                                                   \
    mgc_ld8(b + 8 * (v), g);                                                                   \
    _Pragma("unroll") for (int j = 0; j < 8; j++) f[j] = f[j] + g[j];                          \
    mgc_st8(y + 8 * (v), f)
#define MGC_ADD_ONE(i) y[i] = mgc_st(mgc_ld(a[i]) + mgc_ld(b[i]))
    MGC_EW8(n, mgc_al16(y) && mgc_al16(a) && mgc_al16(b), MGC_ADD_VEC, MGC_ADD_ONE);
}
#endif

/* ---- QKV split: row = [g][PER q heads, k, v][D] for G groups ------------------------------ */

#if defined(MGC_ENTRY_qkv_split_fwd) || defined(MGC_ENTRY_qkv_split_bwd)
#define MGC_QKV_GW ((i64)(MGC_PER + 2) * MGC_D) /* one group's width */
#define MGC_QKV_W  ((i64)MGC_G * MGC_QKV_GW)     /* the fused row's width */
/* The element of q, k or v that fused element o (< GW) of group g of row r is. */
template <typename I>
__device__ __forceinline__ i64 mgc_qkv_dst(I r, I g, I o, int &which) {
    if (o < (I)MGC_PER * MGC_D) {
        which = 0;
        return ((i64)r * MGC_G * MGC_PER + (i64)g * MGC_PER) * MGC_D + o;
    }
    which = o < (I)(MGC_PER + 1) * MGC_D ? 1 : 2;
    return ((i64)r * MGC_G + g) * MGC_D + (o - (I)(MGC_PER + which - 1) * MGC_D);
}
/* Items of 8 elements (D % 8 == 0: never across a head) when every pointer is 16-byte aligned,
 * else single elements; index arithmetic in I (32 bits when the item count fits). */
template <typename I, int V>
__device__ __forceinline__ void mgc_qkv_copy(mgc_t *__restrict__ qkv, mgc_t *__restrict__ q,
                                             mgc_t *__restrict__ k, mgc_t *__restrict__ v, I items) {
    const I gw = (I)(MGC_QKV_GW / V), w = (I)MGC_G * gw; /* items of a group, of a row */
    for (I it = (I)blockIdx.x * blockDim.x + threadIdx.x; it < items; it += (I)gridDim.x * blockDim.x) {
        I r = it / w, rem = it - r * w, g = rem / gw, o = (rem - g * gw) * V;
        int which;
        i64 d = mgc_qkv_dst<I>(r, g, o, which);
        mgc_t *p = (which == 0 ? q : which == 1 ? k : v) + d;
        mgc_t *f = qkv + (i64)it * V;
        if (V == 8) {
#if defined(MGC_ENTRY_qkv_split_fwd)
            mgc_straw8(p, mgc_ldraw8(f));
#else
            mgc_straw8(f, mgc_ldraw8(p));
#endif
        } else {
#if defined(MGC_ENTRY_qkv_split_fwd)
            *p = *f;
#else
            *f = *p;
#endif
        }
    }
}
/* grid-stride over rows * W / 8 items (or rows * W elements); a pure copy of the storage bits.
 * fwd: q (rows, G*PER, D), k, v (rows, G, D) from qkv; bwd: dqkv from dq, dk, dv. */
extern "C" __global__ void __launch_bounds__(256)
    MGC_ENTRY_NAME(mgc_t *__restrict__ qkv, mgc_t *__restrict__ q, mgc_t *__restrict__ k,
                   mgc_t *__restrict__ v, i64 rows) {
    mgc_pdl_begin();
    const bool v8 = MGC_D % 8 == 0 && mgc_al16(qkv) && mgc_al16(q) && mgc_al16(k) && mgc_al16(v);
    const i64 items = rows * MGC_QKV_W / (v8 ? 8 : 1);
    const bool small = items + (i64)gridDim.x * blockDim.x < 2147483647ll;
    if (v8 && small) mgc_qkv_copy<unsigned, 8>(qkv, q, k, v, (unsigned)items);
    else if (v8) mgc_qkv_copy<i64, 8>(qkv, q, k, v, items);
    else if (small) mgc_qkv_copy<unsigned, 1>(qkv, q, k, v, (unsigned)items);
    else mgc_qkv_copy<i64, 1>(qkv, q, k, v, items);
}
#endif

/* ---- QKV split with rotary embeddings (MGC_POF_ROPE) ----------------------------------- */

#if defined(MGC_ENTRY_qkv_rope_fwd) || defined(MGC_ENTRY_qkv_rope_bwd)
#define MGC_QR_HALF (MGC_ROT / 2)
#define MGC_QR_UNIT (MGC_QR_HALF + (MGC_D - MGC_ROT))           /* items of a rotated head row */
#define MGC_QR_GU   ((MGC_PER + 1) * MGC_QR_UNIT + MGC_D)       /* items of a group */
/* Head h (< PER: a query head, PER: the key) of group rg (r G + g over all rows): x the rows
 * read, y the rows written -- the fused row's head, then q's or k's (the join: reversed). */
__device__ __forceinline__ void mgc_qr_head(mgc_t *qkv, mgc_t *q, mgc_t *k, i64 rg, int h,
                                            const mgc_t *&x, mgc_t *&y) {
    mgc_t *f = qkv + rg * (i64)((MGC_PER + 2) * MGC_D) + h * MGC_D;
    mgc_t *o = h < MGC_PER ? q + (rg * MGC_PER + h) * (i64)MGC_D : k + rg * (i64)MGC_D;
#if defined(MGC_ENTRY_qkv_rope_fwd)
    x = f, y = o;
#else
    x = o, y = f;
#endif
}
/* Group rg's value head: x read, y written (as mgc_qr_head). */
__device__ __forceinline__ void mgc_qr_value(mgc_t *qkv, mgc_t *v, i64 rg, const mgc_t *&x,
                                             mgc_t *&y) {
    mgc_t *f = qkv + rg * (i64)((MGC_PER + 2) * MGC_D) + (MGC_PER + 1) * MGC_D, *o = v + rg * MGC_D;
#if defined(MGC_ENTRY_qkv_rope_fwd)
    x = f, y = o;
#else
    x = o, y = f;
#endif
}
/* The split (join) and the rope of q and k in one pass: qkv_split then rope (q), rope (k) in
 * the forward; rope_bwd (dq'), rope_bwd (dk') then qkv_split_bwd in the backward, with the
 * arithmetic of the `rope` kernel below (so the bits of the ops it replaces).  A row of qkv
 * is G groups of [PER query heads, k, v][D]; q' is (rows, G PER, D), k' and v (rows, G, D).
 * grid (s nb, ceil(bG / 8)), block 128, smem 8 * ROT bytes (static).  Block (r, y) computes
 * the cos/sin of row group r's position (fp64 angle, as the CPU) once, then moves groups
 * [8y, 8y + 8) of the bG groups of row group r: one thread a rotation pair (f, f + ROT/2) of a
 * query or key head, or a column past ROT, or a column of v -- or, in 16-bit storage, eight
 * of them with 16-byte accesses, when ROT/2 and D - ROT are multiples of 8 and the pointers
 * 16-byte aligned.  A row group is a sequence row (nb = 1, bG = b G), or with documents
 * (docs: (s, b) starts, reset_position_ids) one (sequence row, batch row) (nb = b, bG = G).
 * Positions: mgc_ctx_pos(r / nb, cp, cp_rank, seq / (2 cp)) - docs[r]. */
extern "C" __global__ void __launch_bounds__(128)
    MGC_ENTRY_NAME(mgc_t *__restrict__ qkv, mgc_t *__restrict__ q, mgc_t *__restrict__ k,
                   mgc_t *__restrict__ v, i64 bG, i64 cp, i64 cpr, i64 half_len, double theta,
                   const int *__restrict__ docs, i64 nb) {
    mgc_pdl_begin();
    __shared__ float cs[MGC_QR_HALF > 0 ? MGC_QR_HALF : 1], sn[MGC_QR_HALF > 0 ? MGC_QR_HALF : 1];
#if defined(MGC_ENTRY_qkv_rope_fwd)
    const double sign = 1.0;
#else
    const double sign = -1.0;
#endif
    i64 i = blockIdx.x; /* the row group */
    double p = (double)(mgc_ctx_pos(i / nb, cp, cpr, half_len) - (docs ? docs[i] : 0));
    for (int f = threadIdx.x; f < MGC_QR_HALF; f += blockDim.x) {
        double ang = p * pow(theta, -2.0 * (double)f / (double)MGC_ROT), sd, cd;
        sincospi(ang * 0.31830988618379067154, &sd, &cd); /* as in `rope` */
        cs[f] = (float)cd;
        sn[f] = (float)(sign * sd);
    }
    __syncthreads();
    i64 g0 = (i64)blockIdx.y * 8, ng = bG - g0 < 8 ? bG - g0 : 8;
    /* 8 pairs (or 8 columns) a thread, 16-byte accesses, when the halves and the rest of a
     * head are multiples of 8 and every pointer 16-byte aligned (a uniform test); 16-bit
     * storage only (fp32 plans keep the element path: its vector form spilled 8 bytes of
     * qkv_rope_bwd on sm_80) */
    if (MGC_HALF && MGC_QR_HALF % 8 == 0 && (MGC_D - MGC_ROT) % 8 == 0 && mgc_al16(qkv) &&
        mgc_al16(q) && mgc_al16(k) && mgc_al16(v)) {
        const int U8 = MGC_QR_HALF / 8 + (MGC_D - MGC_ROT) / 8, GU8 = (MGC_PER + 1) * U8 + MGC_D / 8;
        for (int t = threadIdx.x; t < ng * GU8; t += blockDim.x) {
            int gr = t / GU8, u = t - gr * GU8;
            i64 rg = i * bG + g0 + gr;
            const mgc_t *x;
            mgc_t *y;
            if (u < (MGC_PER + 1) * U8) {
                int h = u / U8, w = 8 * (u - h * U8);
                mgc_qr_head(qkv, q, k, rg, h, x, y);
                if (w < MGC_QR_HALF) {
                    float x0[8], x1[8], y0[8], y1[8];
                    mgc_ld8(x + w, x0);
                    mgc_ld8(x + w + MGC_QR_HALF, x1);
#pragma unroll
                    for (int j = 0; j < 8; j++) {
                        float c = cs[w + j], s = sn[w + j];
                        y0[j] = x0[j] * c - x1[j] * s;
                        y1[j] = x1[j] * c + x0[j] * s;
                    }
                    mgc_st8(y + w, y0);
                    mgc_st8(y + w + MGC_QR_HALF, y1);
                } else {
                    int col = MGC_ROT + (w - MGC_QR_HALF);
                    mgc_straw8(y + col, mgc_ldraw8(x + col));
                }
            } else {
                int w = 8 * (u - (MGC_PER + 1) * U8);
                mgc_qr_value(qkv, v, rg, x, y);
                mgc_straw8(y + w, mgc_ldraw8(x + w));
            }
        }
        return;
    }
    for (int t = threadIdx.x; t < ng * MGC_QR_GU; t += blockDim.x) {
        int gr = t / MGC_QR_GU, u = t - gr * MGC_QR_GU;
        i64 rg = i * bG + g0 + gr; /* the group's index over all rows: r G + g */
        const mgc_t *x;
        mgc_t *y;
        if (u < (MGC_PER + 1) * MGC_QR_UNIT) {
            int h = u / MGC_QR_UNIT, w = u - h * MGC_QR_UNIT;
            mgc_qr_head(qkv, q, k, rg, h, x, y);
            if (w < MGC_QR_HALF) {
                float x0 = mgc_ld(x[w]), x1 = mgc_ld(x[w + MGC_QR_HALF]);
                float c = cs[w], s = sn[w];
                y[w] = mgc_st(x0 * c - x1 * s);
                y[w + MGC_QR_HALF] = mgc_st(x1 * c + x0 * s);
            } else {
                int col = MGC_ROT + (w - MGC_QR_HALF);
                y[col] = x[col];
            }
        } else {
            int w = u - (MGC_PER + 1) * MGC_QR_UNIT;
            mgc_qr_value(qkv, v, rg, x, y);
            y[w] = x[w];
        }
    }
}
#endif

/* ---- rotary embeddings ----------------------------------------------------------------- */

#if defined(MGC_ENTRY_rope)
#define MGC_RHALF (MGC_ROT / 2)
#define MGC_RUNIT (MGC_RHALF + (MGC_D - MGC_ROT)) /* work items of one head row */
/* grid (s nb, ceil(bH / 8)), block 128, smem 8 * ROT bytes (static).  Block (r, y) computes
 * the cos/sin of row group r's position (fp64 angle and sin/cos, as the CPU) once, then rotates
 * heads [8y, 8y+8) of the bH head rows of row group r: a sequence row (nb = 1, bH = b H), or
 * with documents (docs, reset_position_ids) one (sequence row, batch row) (nb = b, bH = H).
 * One thread owns a pair (f, f + ROT/2), so y may equal x (in place).  sign = +1 forward, -1
 * backward.  Positions: mgc_ctx_pos(r / nb, cp, cp_rank, seq / (2 cp)) - docs[r]. */
extern "C" __global__ void __launch_bounds__(128)
    MGC_ENTRY_NAME(mgc_t *y, const mgc_t *x, i64 bH, i64 cp, i64 cpr, i64 half_len,
                   double theta, double sign, const int *__restrict__ docs, i64 nb) {
    mgc_pdl_begin();
    __shared__ float cs[MGC_RHALF > 0 ? MGC_RHALF : 1], sn[MGC_RHALF > 0 ? MGC_RHALF : 1];
    i64 i = blockIdx.x; /* the row group */
    double p = (double)(mgc_ctx_pos(i / nb, cp, cpr, half_len) - (docs ? docs[i] : 0));
    for (int f = threadIdx.x; f < MGC_RHALF; f += blockDim.x) {
        double ang = p * pow(theta, -2.0 * (double)f / (double)MGC_ROT), sd, cd;
        /* sincospi: its argument reduction is exact, so no Payne-Hanek local array (ptxas
         * keeps no stack); ang / pi costs a relative 2^-53 of the angle, far below fp32 */
        sincospi(ang * 0.31830988618379067154, &sd, &cd);
        cs[f] = (float)cd;
        sn[f] = (float)(sign * sd);
    }
    __syncthreads();
    i64 h0 = (i64)blockIdx.y * 8, nh = bH - h0 < 8 ? bH - h0 : 8;
    for (int t = threadIdx.x; t < nh * MGC_RUNIT; t += blockDim.x) {
        int hr = t / MGC_RUNIT, u = t - hr * MGC_RUNIT;
        i64 base = (i * bH + h0 + hr) * (i64)MGC_D;
        if (u < MGC_RHALF) {
            float x0 = mgc_ld(x[base + u]), x1 = mgc_ld(x[base + u + MGC_RHALF]);
            float c = cs[u], s = sn[u];
            y[base + u] = mgc_st(x0 * c - x1 * s);
            y[base + u + MGC_RHALF] = mgc_st(x1 * c + x0 * s);
        } else if (y != x) {
            int col = MGC_ROT + (u - MGC_RHALF);
            y[base + col] = x[base + col];
        }
    }
}
#endif
