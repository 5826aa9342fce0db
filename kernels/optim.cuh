/* optim.cuh - the optimizer's element-wise kernels on fp32 arena arrays (runtime/cpu_ops.c):
 * sum of squares (gradient norm) and AdamW.  The arrays are fp32
 * whatever the compute dtype, so the specs are fp32 specs (one cubin per entry for fp32 and
 * bf16 plans); the 16-bit copy-out is written as bf16 bits here, or as fp16 bits when the
 * constant COPY is 2 (fp16 plans; codegen/kspec_pointwise.c).
 *
 * Sum of squares and AdamW are multi-tensor: one launch covers up to LIST tensors (SQ_LIST for
 * the sum, AW_LIST for AdamW), passed by value as a table (the kernel's parameters: no device
 * table to upload, so a step's optimizer is a few launches, not a few per tensor).  Each
 * tensor is cut into chunks of CHUNK elements; c0[t] is the first chunk of tensor t (c0[count]
 * the number of chunks), and block b takes chunks b, b + gridDim.x, ... in order.  The host
 * mirror of the tables is runtime/cuda_ops_pointwise.c's (same members, same order).
 *
 * Entries:
 *   sumsq_partial  part[blk] = sum of g^2 over the block's chunks (fp64; its order depends on
 *                  the tensors' sizes only, never on the GPU)
 *   sumsq_final    out[0] = (first ? 0 : out[0]) + sum of part[0 .. nb) (fp64, fixed order):
 *                  one launch pair per table, accumulated in table order
 *   adamw          mgc_cpu_adamw's fp64 math, bit for bit (no contraction: explicit _rn
 *                  intrinsics), with an optional 16-bit copy of the updated weights, rounded
 *                  to nearest even (fp16: overflow to infinity)
 *   zero_list      the step's zeroing of the gradients that their first writes do not store
 *                  (runtime/exec.c, "gradients' first writes"): a sum-of-squares table's
 *                  ranges set to +0 */
/* NVRTC has no <math.h>: INFINITY (used by mgc_common.cuh's mgc_block_max) */
#ifndef INFINITY
#define INFINITY __int_as_float(0x7f800000)
#endif
#include "mgc_common.cuh"

/* fp32 -> bf16 bits, round to nearest even, NaN kept quiet (mgc_common.cuh's mgc_st). */
__device__ __forceinline__ unsigned short mgc_f32_to_bf16(float f) {
    unsigned u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (unsigned short)((u >> 16) | 0x40u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (unsigned short)(u >> 16);
}
/* fp32 -> fp16 bits, round to nearest even. */
__device__ __forceinline__ unsigned short mgc_f32_to_f16(float f) {
#ifdef MGC_EMU
    return mgc_emu_f32_to_f16(f);
#else
    unsigned short h;
    asm("cvt.rn.f16.f32 %0, %1;\n" : "=h"(h) : "f"(f));
    return h;
#endif
}
#ifndef MGC_COPY
#define MGC_COPY 1 /* AdamW's 16-bit copy-out: 1 bf16, 2 fp16 */
#endif
#ifndef MGC_CHUNK
#define MGC_CHUNK 8192 /* elements a chunk (codegen/kspec.h MGC_KSPEC_OPT_CHUNK) */
#endif
#ifndef MGC_SQ_LIST
#define MGC_SQ_LIST 128 /* tensors a sum-of-squares table (MGC_KSPEC_SQ_LIST) */
#endif
#ifndef MGC_AW_LIST
#define MGC_AW_LIST 48 /* tensors an AdamW table (MGC_KSPEC_AW_LIST) */
#endif

/* The tables (kernel parameters, read in place: __grid_constant__). */
struct mgc_sq_list {
    const float *g[MGC_SQ_LIST];
    i64 n[MGC_SQ_LIST];
    i64 c0[MGC_SQ_LIST + 1];
};
struct mgc_aw_list {
    float *p[MGC_AW_LIST];
    const float *g[MGC_AW_LIST];
    float *m[MGC_AW_LIST];
    float *v[MGC_AW_LIST];
    unsigned short *copy[MGC_AW_LIST]; /* NULL: no 16-bit copy of that tensor */
    i64 n[MGC_AW_LIST];
    double wd[MGC_AW_LIST];            /* weight decay of that tensor (0: none) */
    i64 c0[MGC_AW_LIST + 1];
};

/* zero_list's table: sumsq's layout, the pointers writable */
struct mgc_zl_list {
    float *p[MGC_SQ_LIST];
    i64 n[MGC_SQ_LIST];
    i64 c0[MGC_SQ_LIST + 1];
};

#if defined(MGC_ENTRY_zero_list)
/* grid: any (the launcher's min(chunks, SUMSQ_NB)), block 256, smem 0.  Block b zeroes chunks
 * b, b + gridDim.x, ...: a chunk's elements by the block's threads, consecutive threads on
 * consecutive elements. */
extern "C" __global__ void __launch_bounds__(256)
    MGC_ENTRY_NAME(const __grid_constant__ mgc_zl_list L, int count) {
    mgc_pdl_begin();
    const i64 total = L.c0[count];
    int t = 0;
    for (i64 c = blockIdx.x; c < total; c += gridDim.x) {
        while (L.c0[t + 1] <= c) t++;
        const i64 off = (c - L.c0[t]) * MGC_CHUNK, rest = L.n[t] - off;
        const int len = rest < MGC_CHUNK ? (int)rest : MGC_CHUNK;
        float *g = L.p[t] + off;
        for (int i = threadIdx.x; i < len; i += 256) g[i] = 0.0f;
    }
}
#endif

#if defined(MGC_ENTRY_sumsq_partial)
/* grid nb = min(c0[count], SUMSQ_NB): a function of the tensors' sizes only (never the SM
 * count: the result's bits do not depend on the GPU), block 256, smem 0 (static 256 B).
 * part (nb) fp64. */
extern "C" __global__ void __launch_bounds__(256)
    MGC_ENTRY_NAME(double *__restrict__ part, const __grid_constant__ mgc_sq_list L, int count) {
    mgc_pdl_begin();
    __shared__ double sh[32];
    double s = 0.0;
    const i64 total = L.c0[count];
    int t = 0;
    for (i64 c = blockIdx.x; c < total; c += gridDim.x) {
        while (L.c0[t + 1] <= c) t++; /* c grows: the tensor index only moves on */
        const i64 off = (c - L.c0[t]) * MGC_CHUNK, rest = L.n[t] - off;
        const int len = rest < MGC_CHUNK ? (int)rest : MGC_CHUNK;
        const float *__restrict__ g = L.g[t] + off;
        for (int i = threadIdx.x; i < len; i += 256) {
            double v = (double)g[i];
            s = __fma_rn(v, v, s);
        }
    }
    s = mgc_block_sum(s, sh);
    if (threadIdx.x == 0) part[blockIdx.x] = s;
}
#endif

#if defined(MGC_ENTRY_sumsq_final)
/* grid 1, block 1024, smem 0 (static 256 B).  out[0] = (first ? 0 : out[0]) + sum of
 * part[0 .. nb). */
extern "C" __global__ void __launch_bounds__(1024)
    MGC_ENTRY_NAME(double *__restrict__ out, const double *__restrict__ part, int nb, int first) {
    mgc_pdl_begin();
    __shared__ double sh[32];
    double s = 0.0;
    for (int i = threadIdx.x; i < nb; i += blockDim.x)
        s += part[i];
    s = mgc_block_sum(s, sh);
    if (threadIdx.x == 0) out[0] = first ? s : out[0] + s;
}
#endif

#if defined(MGC_ENTRY_adamw)
/* One element of AdamW in double precision (runtime/cpu_ops.c mgc_cpu_adamw, bit for bit):
 * m, v, p updated in place. */
__device__ __forceinline__ void mgc_adamw_elem(float g, float &m, float &v, float &p, double lr,
                                               double b1, double b2, double ob1, double ob2,
                                               double eps, double c1, double c2,
                                               double grad_scale, double wd) {
    double gi = __dmul_rn((double)g, grad_scale);
    double mi = __dadd_rn(__dmul_rn(b1, (double)m), __dmul_rn(ob1, gi));
    double vi = __dadd_rn(__dmul_rn(b2, (double)v), __dmul_rn(__dmul_rn(ob2, gi), gi));
    double pi = (double)p;
    double den = __dadd_rn(__dsqrt_rn(__ddiv_rn(vi, c2)), eps);
    double upd = __dadd_rn(__ddiv_rn(__ddiv_rn(mi, c1), den), __dmul_rn(wd, pi));
    pi = __dadd_rn(pi, -__dmul_rn(lr, upd));
    m = (float)mi;
    v = (float)vi;
    p = (float)pi;
}
/* grid min(c0[count], 16 SMs) (any grid gives the same bits: element-wise), block 256,
 * smem 0.  c1 = 1 - beta1^step, c2 = 1 - beta2^step come from the host; copy (bf16 bits, or
 * fp16 bits when COPY = 2) may be NULL. */
extern "C" __global__ void __launch_bounds__(256)
    MGC_ENTRY_NAME(const __grid_constant__ mgc_aw_list L, int count, double lr, double b1,
                   double b2, double eps, double c1, double c2, double grad_scale) {
    mgc_pdl_begin();
    const double ob1 = 1.0 - b1, ob2 = 1.0 - b2;
    const i64 total = L.c0[count];
    int t = 0;
    for (i64 c = blockIdx.x; c < total; c += gridDim.x) {
        while (L.c0[t + 1] <= c) t++;
        const i64 off = (c - L.c0[t]) * MGC_CHUNK, rest = L.n[t] - off;
        const int len = rest < MGC_CHUNK ? (int)rest : MGC_CHUNK;
        float *__restrict__ p = L.p[t] + off;
        const float *__restrict__ g = L.g[t] + off;
        float *__restrict__ m = L.m[t] + off;
        float *__restrict__ v = L.v[t] + off;
        unsigned short *__restrict__ copy = L.copy[t] ? L.copy[t] + off : (unsigned short *)0;
        const double wd = L.wd[t];
        /* 4 elements a thread at a time (16-byte loads and stores) where every array of the
         * tensor is 16-byte aligned at this chunk, the copy 8-byte: four times the loads in
         * flight.  Element by element otherwise, and for the chunk's tail.  The arithmetic
         * of each element is the same either way. */
        int i0 = 0;
        typedef unsigned long long addr;
        if (((addr)p | (addr)g | (addr)m | (addr)v) % 16 == 0 &&
            (addr)copy % 8 == 0) {
            const int n4 = len / 4 * 4;
            for (int i = threadIdx.x * 4; i < n4; i += 256 * 4) {
                float4 g4 = *(const float4 *)(g + i), m4 = *(const float4 *)(m + i);
                float4 v4 = *(const float4 *)(v + i), p4 = *(const float4 *)(p + i);
                float ga[4] = {g4.x, g4.y, g4.z, g4.w}, ma[4] = {m4.x, m4.y, m4.z, m4.w};
                float va[4] = {v4.x, v4.y, v4.z, v4.w}, pa[4] = {p4.x, p4.y, p4.z, p4.w};
                unsigned short ca[4];
#pragma unroll
                for (int j = 0; j < 4; j++) {
                    mgc_adamw_elem(ga[j], ma[j], va[j], pa[j], lr, b1, b2, ob1, ob2, eps, c1, c2,
                                   grad_scale, wd);
                    ca[j] = MGC_COPY == 2 ? mgc_f32_to_f16(pa[j]) : mgc_f32_to_bf16(pa[j]);
                }
                *(float4 *)(m + i) = make_float4(ma[0], ma[1], ma[2], ma[3]);
                *(float4 *)(v + i) = make_float4(va[0], va[1], va[2], va[3]);
                *(float4 *)(p + i) = make_float4(pa[0], pa[1], pa[2], pa[3]);
                if (copy)
                    *(uint2 *)(copy + i) = make_uint2((unsigned)ca[0] | (unsigned)ca[1] << 16,
                                                      (unsigned)ca[2] | (unsigned)ca[3] << 16);
            }
            i0 = n4;
        }
        for (int i = i0 + threadIdx.x; i < len; i += 256) {
            float mi = m[i], vi = v[i], pi = p[i];
            mgc_adamw_elem(g[i], mi, vi, pi, lr, b1, b2, ob1, ob2, eps, c1, c2, grad_scale, wd);
            m[i] = mi;
            v[i] = vi;
            p[i] = pi;
            if (copy) copy[i] = MGC_COPY == 2 ? mgc_f32_to_f16(pi) : mgc_f32_to_bf16(pi);
        }
    }
}
#endif
