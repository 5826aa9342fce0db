/* cross_entropy.cuh - vocabulary-parallel cross-entropy (runtime/cpu_ops_tmpl.h mgc_cpu_ce_*).
 *
 * Logits, lse and the loss are fp32 whatever the compute dtype (the spec's bf16 flag is 0);
 * labels are int64.  Rows of the logits are `ld` (= V_l) apart and only their first `vv`
 * columns are real vocabulary (cpu_backend.c valid_columns): the padding columns
 * [vv, ld) take no part in the softmax and get a zero gradient.  The vocabulary start
 * v0 = tp_rank * V_l is an argument.  No constants.
 *
 * Entries, by phase of the op (iattr[0]):
 *   ce_max       0: mx (n) = row max
 *   ce_sums      1: out (n, 2) = (sum exp(l - mx), logit of the label if in the shard else 0)
 *   ce_finish    2: lse = mx + log(sum exp), loss[0] = sum mask (lse - tgt), loss[1] = sum mask
 *   ce_rowstats  3 (fused, tp = 1): mx and (n, 2) sums of every row, then ce_finish
 *   ce_count     4: loss = (0, sum mask), the scale of the loss chunks' backward
 *                (compiler/losschunk.h)
 *   ce_bwd       dlogits = (softmax - onehot) * mask * dloss / loss[1], in place over the
 *                logits when the plan says so (plan.h MGC_POF_INPLACE)
 *   ce_fused     a loss chunk's cross-entropy at tp = 1 (plan.h MGC_POF_CE_STATS): ce_rowstats'
 *                mx and sums and ce_bwd's dlogits in one pass over the logits (ce_finish
 *                after it writes lse and the loss) */
/* NVRTC has no <math.h>: INFINITY (used by mgc_common.cuh's mgc_block_max) */
#ifndef INFINITY
#define INFINITY __int_as_float(0x7f800000)
#endif
#include "mgc_common.cuh"

/* One pass over a row's vv logits (l; l4 its first n4 float4 columns): the row max, returned,
 * and this thread's sum of exp(l - max) in s.  Each thread keeps a running max and sum (the
 * sum rescaled by exp(m_old - m_new) when the max grows); the block takes the max M and
 * every thread rescales its sum to M (the block sum is the caller's). */
__device__ __forceinline__ float ce_online_max(float &s, const float *l, const float4 *l4, i64 n4,
                                               i64 vv, int tid, int bd, float *sh) {
    float m = -INFINITY;
    s = 0.0f;
#pragma unroll 2
    for (i64 q = tid; q < n4; q += bd) {
        float4 a = l4[q];
        float mn = fmaxf(fmaxf(a.x, a.y), fmaxf(a.z, a.w));
        if (mn > m) { /* m = -inf before: s = 0, exp(-inf) = 0 */
            s *= expf(m - mn);
            m = mn;
        }
        s += expf(a.x - m);
        s += expf(a.y - m);
        s += expf(a.z - m);
        s += expf(a.w - m);
    }
    for (i64 c = 4 * n4 + tid; c < vv; c += bd) {
        float v = l[c];
        if (v > m) {
            s *= expf(m - v);
            m = v;
        }
        s += expf(v - m);
    }
    const float tm = m;
    m = mgc_block_max(m, sh);
    s = tm == -INFINITY ? 0.0f : tm == m ? s : s * expf(tm - m);
    return m;
}

#if defined(MGC_ENTRY_ce_max) || defined(MGC_ENTRY_ce_sums) || defined(MGC_ENTRY_ce_rowstats)
/* grid n (one block per row), block 512, smem 0 (static 128 B).  ce_max writes mx only;
 * ce_sums reads mx and writes sums; ce_rowstats does both (its mx goes to scratch) in one
 * pass over the row: each thread keeps a running max m and sum s of exp(l - m) (s rescaled
 * by exp(m_old - m_new) when m grows), then the block takes M = max m and sums
 * s exp(m - M) (the same value as the CPU's two passes up to rounding).  Columns go by
 * float4 when ld % 4 == 0 and logits is 16-byte aligned (a uniform test), else one by one. */
extern "C" __global__ void __launch_bounds__(512)
    MGC_ENTRY_NAME(float *__restrict__ mx, float *__restrict__ sums,
                   const float *__restrict__ logits, const i64 *__restrict__ labels, i64 v0,
                   i64 vv, i64 ld) {
    mgc_pdl_begin();
    __shared__ float sh[32];
    i64 r = blockIdx.x;
    const float *l = logits + r * ld;
    const float4 *l4 = (const float4 *)l;
    const i64 n4 = (ld & 3) == 0 && mgc_al16(logits) ? vv >> 2 : 0; /* float4 columns */
    const int tid = threadIdx.x, bd = blockDim.x;
#if defined(MGC_ENTRY_ce_max)
    float m = -INFINITY;
#pragma unroll 4
    for (i64 q = tid; q < n4; q += bd) {
        float4 a = l4[q];
        m = fmaxf(m, fmaxf(fmaxf(a.x, a.y), fmaxf(a.z, a.w)));
    }
    for (i64 c = 4 * n4 + tid; c < vv; c += bd)
        m = fmaxf(m, l[c]);
    m = mgc_block_max(m, sh);
    (void)sums;
    (void)labels;
    (void)v0;
    if (threadIdx.x == 0) mx[r] = m;
#else
#if defined(MGC_ENTRY_ce_sums)
    const float m = mx[r];
    float s = 0.0f;
#pragma unroll 4
    for (i64 q = tid; q < n4; q += bd) {
        float4 a = l4[q];
        s += expf(a.x - m);
        s += expf(a.y - m);
        s += expf(a.z - m);
        s += expf(a.w - m);
    }
    for (i64 c = 4 * n4 + tid; c < vv; c += bd)
        s += expf(l[c] - m);
#else /* ce_rowstats: online */
    float s;
    float m = ce_online_max(s, l, l4, n4, vv, tid, bd, sh);
#endif
    s = mgc_block_sum(s, sh);
    if (threadIdx.x == 0) {
        i64 id = labels[r] - v0;
        sums[2 * r] = s;
        sums[2 * r + 1] = (id >= 0 && id < vv) ? l[id] : 0.0f;
#if defined(MGC_ENTRY_ce_rowstats)
        mx[r] = m;
#endif
    }
#endif
}
#endif

#if defined(MGC_ENTRY_ce_finish)
/* grid 1, block 1024, smem 0 (static 128 B): thread t handles rows t, t+1024, ... (a fixed
 * order), then two block sums.  mask may be NULL (all ones); a masked-out row never
 * contributes to loss[0], even when its loss is inf/nan. */
extern "C" __global__ void __launch_bounds__(1024)
    MGC_ENTRY_NAME(float *__restrict__ lse, float *__restrict__ loss,
                   const float *__restrict__ mx, const float *__restrict__ sums,
                   const float *__restrict__ mask, i64 n) {
    mgc_pdl_begin();
    __shared__ float sh[32];
    float tot = 0.0f, cnt = 0.0f;
    for (i64 r = threadIdx.x; r < n; r += blockDim.x) {
        float l = mx[r] + logf(sums[2 * r]);
        lse[r] = l;
        float m = mask ? mask[r] : 1.0f, tl = l - sums[2 * r + 1];
        if (m != 0.0f) tot += m * tl;
        cnt += m;
    }
    tot = mgc_block_sum(tot, sh);
    cnt = mgc_block_sum(cnt, sh);
    if (threadIdx.x == 0) {
        loss[0] = tot;
        loss[1] = cnt;
    }
}
#endif

#if defined(MGC_ENTRY_ce_count)
/* grid 1, block 1024, smem 0 (static 128 B): the mask summed in ce_finish's order, so the
 * count is the one ce_finish writes.  mask is not NULL. */
extern "C" __global__ void __launch_bounds__(1024)
    MGC_ENTRY_NAME(float *__restrict__ loss, const float *__restrict__ mask, i64 n) {
    mgc_pdl_begin();
    __shared__ float sh[32];
    float cnt = 0.0f;
    for (i64 r = threadIdx.x; r < n; r += blockDim.x)
        cnt += mask[r];
    cnt = mgc_block_sum(cnt, sh);
    if (threadIdx.x == 0) {
        loss[0] = 0.0f;
        loss[1] = cnt;
    }
}
#endif

#if defined(MGC_ENTRY_ce_bwd) || defined(MGC_ENTRY_ce_fused)
/* Loads of 8 fp32 logits at columns [c0, c0 + 8): two 16-byte loads when vec, else one by
 * one (columns past ld read as 0). */
__device__ __forceinline__ void ce_load8(float *x, const float *l, i64 c0, i64 ld, bool vec) {
    if (c0 >= ld) return;
    if (vec) {
        float4 a = *(const float4 *)(l + c0), b = *(const float4 *)(l + c0 + 4);
        x[0] = a.x, x[1] = a.y, x[2] = a.z, x[3] = a.w;
        x[4] = b.x, x[5] = b.y, x[6] = b.z, x[7] = b.w;
    } else {
#pragma unroll
        for (int j = 0; j < 8; j++) x[j] = c0 + j < ld ? l[c0 + j] : 0.0f;
    }
}

/* One row's gradient d[c] = m (exp(l[c] - ls) - [c == id]) for c < vv, 0 for [vv, ld): the
 * block walks the row 8 blockDim.x columns a step, 8 consecutive ones per thread: two 16-byte
 * loads of logits and one 16-byte store (fp32: two) when vec, else element by element.
 *
 * In place (d over l's own row, a 16-bit d at twice the row's fp32 width): a 16-bit step s
 * writes the bytes of fp32 columns [4 T s, 4 T (s + 1)) (T threads), all read at steps <= s
 * (step 0 its own).  Every thread loads step s + 1, computes step s, and a barrier separates
 * all of step s's reads from its writes; step s + 1's columns start at 8 T (s + 1), past any
 * byte written up to step s.  (fp32 writes each column over itself.)  So the pointers are not
 * __restrict__.  Every thread of the block calls it (the barriers). */
__device__ __forceinline__ void ce_bwd_row(mgc_t *d, const float *l, float m, float ls, i64 id,
                                           i64 vv, i64 ld, bool vec) {
    const i64 t8 = 8 * (i64)threadIdx.x, step = 8 * (i64)blockDim.x;
    float x[8] = {0, 0, 0, 0, 0, 0, 0, 0}, g[8];
    ce_load8(x, l, t8, ld, vec);
    for (i64 c0 = t8; c0 - t8 < ld; c0 += step) {
#pragma unroll
        for (int j = 0; j < 8; j++) {
            i64 c = c0 + j;
            g[j] = 0.0f;
            if (c < vv && m != 0.0f) g[j] = m * (expf(x[j] - ls) - (c == id ? 1.0f : 0.0f));
        }
        ce_load8(x, l, c0 + step, ld, vec); /* the next step's columns: never written yet */
        __syncthreads();                     /* every read of this step before its writes */
        if (c0 < ld) {
            if (vec) mgc_st8(d + c0, g);
            else mgc_st8_part(d + c0, (int)(ld - c0 < 8 ? ld - c0 : 8), g);
        }
    }
}

/* The scale, computed on the device from the loss tensor (count = loss[1]): dl = count > 0 ?
 * dloss / count : 0 in fp64, then mask[r] * (float)dl as the CPU.  mask may be NULL. */
__device__ __forceinline__ float ce_scale(const float *mask, const float *loss, double dloss,
                                          i64 r) {
    double count = (double)loss[1];
    double dl = count > 0 ? dloss / count : 0.0;
    return (mask ? mask[r] : 1.0f) * (float)dl;
}
#endif

#if defined(MGC_ENTRY_ce_bwd)
/* grid n (one block per row), block 256, smem 0: ce_bwd_row over row r of the logits, whose
 * gradient row starts dld elements after row r - 1's (dld >= ld): 16-byte accesses when ld
 * and dld are multiples of 8 and the tensors 16-byte aligned.  In place (dlogits == logits,
 * dld = ld * 4 / sizeof(mgc_t)): row r's gradient lands on row r's own fp32 bytes, so rows
 * never meet.  Columns [vv, ld) get 0. */
extern "C" __global__ void __launch_bounds__(256)
    MGC_ENTRY_NAME(mgc_t *dlogits, const float *logits, const float *__restrict__ lse,
                   const i64 *__restrict__ labels, const float *__restrict__ mask,
                   const float *__restrict__ loss, double dloss, i64 v0, i64 vv, i64 ld,
                   i64 dld) {
    mgc_pdl_begin();
    i64 r = blockIdx.x;
    bool vec = (ld & 7) == 0 && (dld & 7) == 0 && mgc_al16(logits) && mgc_al16(dlogits);
    ce_bwd_row(dlogits + r * dld, logits + r * ld, ce_scale(mask, loss, dloss, r), lse[r],
               labels[r] - v0, vv, ld, vec);
}
#endif

#if defined(MGC_ENTRY_ce_fused)
/* grid n (one block per row), block 512, smem 0 (static 128 B).  v0 = 0 (tp = 1).  First
 * ce_rowstats' pass (online max and sum of exp over float4 columns); thread 0 writes mx and
 * sums (sum exp, the label's logit) for ce_finish; lse = mx + log(sum exp), ce_finish's
 * expression.  Then ce_bwd_row over the row, read again from global memory (much of it from
 * L2).  Every global read of the first pass precedes the block reductions' barriers, so the
 * second pass's in-place writes meet none of them.  (Staging the row in shared memory instead,
 * 1024 threads and one row an SM, measured slower on an H100: bench/results/gpu-h100.md.) */
extern "C" __global__ void __launch_bounds__(512)
    MGC_ENTRY_NAME(mgc_t *dlogits, const float *logits, float *__restrict__ mx,
                   float *__restrict__ sums, const i64 *__restrict__ labels,
                   const float *__restrict__ mask, const float *__restrict__ loss, double dloss,
                   i64 vv, i64 ld, i64 dld) {
    mgc_pdl_begin();
    __shared__ float sh[32];
    i64 r = blockIdx.x;
    const float *l = logits + r * ld;
    const float4 *l4 = (const float4 *)l;
    const i64 n4 = (ld & 3) == 0 && mgc_al16(logits) ? vv >> 2 : 0; /* float4 columns */
    const int tid = threadIdx.x, bd = blockDim.x;
    float s;
    float m = ce_online_max(s, l, l4, n4, vv, tid, bd, sh);
    s = mgc_block_sum(s, sh); /* its barriers: every global read of the row done */
    const i64 id = labels[r];
    if (tid == 0) {
        mx[r] = m;
        sums[2 * r] = s;
        sums[2 * r + 1] = (id >= 0 && id < vv) ? l[id] : 0.0f;
    }
    const float ls = m + logf(s);
    bool vec = (ld & 7) == 0 && (dld & 7) == 0 && mgc_al16(logits) && mgc_al16(dlogits);
    ce_bwd_row(dlogits + r * dld, l, ce_scale(mask, loss, dloss, r), ls, id, vv, ld, vec);
}
#endif
