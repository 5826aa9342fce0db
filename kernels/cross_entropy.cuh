/* cross_entropy.cuh - vocabulary-parallel cross-entropy (runtime/cpu_ops_tmpl.h mgc_cpu_ce_*).
 *
 * The logits are fp32 (the spec's dtype fp32 for the entries that only read them), or with the
 * constant LT = 1 in the spec's 16-bit dtype (training.logits_dtype compute); lse and the loss
 * are fp32, labels int64.  Rows of the logits are `ld` (= V_l) apart and only their first `vv`
 * columns are real vocabulary (cpu_backend.c valid_columns): the padding columns
 * [vv, ld) take no part in the softmax and get a zero gradient.  The vocabulary start
 * v0 = tp_rank * V_l is an argument.  One constant: LT (above).
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

/* The logits' storage type ce_lt, and CE_V of them in a 16-byte vector. */
#if defined(MGC_LT) && MGC_LT
typedef mgc_t ce_lt;
#define CE_V 8
#else
typedef float ce_lt;
#define CE_V 4
#endif
/* 1: the logits' gradient (mgc_t) has their type (16-bit logits, or an fp32 plan) */
#define CE_SAME (CE_V == 8 || !MGC_HALF)

/* Logit c of a row l, as fp32; the q-th 16-byte vector of it (l 16-byte aligned) into fp32
 * f[CE_V].  Macros, so that the loads stay in the kernel's scope, where a __restrict__
 * pointer's loads may take the read-only path (a helper function's lost it). */
#if CE_V == 8
#define ce_ld(l, c)     mgc_ld((l)[c])
#define ce_ldv(f, l, q) mgc_unraw8(((const uint4 *)(l))[q], f)
#else
#define ce_ld(l, c) ((l)[c])
#define ce_ldv(f, l, q)                                                                      \
    do {                                                                                     \
        float4 ce_a_ = ((const float4 *)(l))[q];                                             \
        f[0] = ce_a_.x, f[1] = ce_a_.y, f[2] = ce_a_.z, f[3] = ce_a_.w;                      \
    } while (0)
#endif

/* The largest of a vector, in a pairwise tree. */
__device__ __forceinline__ float ce_vmax(const float (&f)[CE_V]) {
    float m = fmaxf(fmaxf(f[0], f[1]), fmaxf(f[2], f[3]));
#if CE_V == 8
    m = fmaxf(m, fmaxf(fmaxf(f[4], f[5]), fmaxf(f[6], f[7])));
#endif
    return m;
}

/* The row's columns read by vector: vv / CE_V when ld is a multiple of CE_V and the logits are
 * 16-byte aligned (a uniform test), else 0 (one by one).  A macro, as ce_ld. */
#define ce_nvec(logits, vv, ld)                                                              \
    (((ld) & (CE_V - 1)) == 0 && mgc_al16(logits) ? (vv) >> (CE_V == 8 ? 3 : 2) : 0)

/* One pass over a row's vv logits (its first nv CE_V-vectors, then one by one): the row max,
 * returned, and this thread's sum of exp(l - max) in s.  Each thread keeps a running max and sum
 * (the sum rescaled by exp(m_old - m_new) when the max grows); the block takes the max M and
 * every thread rescales its sum to M (the block sum is the caller's). */
__device__ __forceinline__ float ce_online_max(float &s, const ce_lt *l, i64 nv, i64 vv, int tid,
                                               int bd, float *sh) {
    float m = -INFINITY;
    s = 0.0f;
#pragma unroll 2
    for (i64 q = tid; q < nv; q += bd) {
        float a[CE_V];
        ce_ldv(a, l, q);
        float mn = ce_vmax(a);
        if (mn > m) { /* m = -inf before: s = 0, exp(-inf) = 0 */
            s *= expf(m - mn);
            m = mn;
        }
#pragma unroll
        for (int j = 0; j < CE_V; j++) s += expf(a[j] - m);
    }
    for (i64 c = CE_V * nv + tid; c < vv; c += bd) {
        float v = ce_ld(l, c);
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
 * 16-byte vectors when ld is a multiple of CE_V and the logits 16-byte aligned (ce_nvec),
 * else one by one. */
extern "C" __global__ void __launch_bounds__(512)
    MGC_ENTRY_NAME(float *__restrict__ mx, float *__restrict__ sums,
                   const ce_lt *__restrict__ logits, const i64 *__restrict__ labels, i64 v0,
                   i64 vv, i64 ld) {
    mgc_pdl_begin();
    __shared__ float sh[32];
    i64 r = blockIdx.x;
    const ce_lt *l = logits + r * ld;
    const i64 nv = ce_nvec(logits, vv, ld);
    const int tid = threadIdx.x, bd = blockDim.x;
#if defined(MGC_ENTRY_ce_max)
    float m = -INFINITY;
#pragma unroll 4
    for (i64 q = tid; q < nv; q += bd) {
        float a[CE_V];
        ce_ldv(a, l, q);
        m = fmaxf(m, ce_vmax(a));
    }
    for (i64 c = CE_V * nv + tid; c < vv; c += bd)
        m = fmaxf(m, ce_ld(l, c));
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
    for (i64 q = tid; q < nv; q += bd) {
        float a[CE_V];
        ce_ldv(a, l, q);
#pragma unroll
        for (int j = 0; j < CE_V; j++) s += expf(a[j] - m);
    }
    for (i64 c = CE_V * nv + tid; c < vv; c += bd)
        s += expf(ce_ld(l, c) - m);
#else /* ce_rowstats: online */
    float s;
    float m = ce_online_max(s, l, nv, vv, tid, bd, sh);
#endif
    s = mgc_block_sum(s, sh);
    if (threadIdx.x == 0) {
        i64 id = labels[r] - v0;
        sums[2 * r] = s;
        sums[2 * r + 1] = (id >= 0 && id < vv) ? ce_ld(l, id) : 0.0f;
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
/* Loads of 8 logits at columns [c0, c0 + 8): 16-byte loads when vec (two of fp32, one of a
 * 16-bit type), else one by one (columns past ld read as 0). */
__device__ __forceinline__ void ce_load8(float (&x)[8], const ce_lt *l, i64 c0, i64 ld, bool vec) {
    if (c0 >= ld) return;
    if (vec) {
#if CE_V == 8
        mgc_unraw8(mgc_ldraw8(l + c0), x);
#else
        float4 a = *(const float4 *)(l + c0), b = *(const float4 *)(l + c0 + 4);
        x[0] = a.x, x[1] = a.y, x[2] = a.z, x[3] = a.w;
        x[4] = b.x, x[5] = b.y, x[6] = b.z, x[7] = b.w;
#endif
    } else {
#pragma unroll
        for (int j = 0; j < 8; j++) x[j] = c0 + j < ld ? ce_ld(l, c0 + j) : 0.0f;
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
 * byte written up to step s.  Where d and l have one type (fp32 over fp32, 16-bit over 16-bit
 * logits) each column is written over itself by the thread that read it, and there is no
 * barrier.  So the pointers are not __restrict__.  Every thread of the block calls it (the
 * barriers). */
__device__ __forceinline__ void ce_bwd_row(mgc_t *d, const ce_lt *l, float m, float ls, i64 id,
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
#if !CE_SAME
        __syncthreads(); /* every read of this step before its writes */
#endif
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
 * dld = ld * sizeof(ce_lt) / sizeof(mgc_t)): row r's gradient lands on row r's own bytes, so
 * rows never meet.  Columns [vv, ld) get 0. */
extern "C" __global__ void __launch_bounds__(256)
    MGC_ENTRY_NAME(mgc_t *dlogits, const ce_lt *logits, const float *__restrict__ lse,
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
 * ce_rowstats' pass (online max and sum of exp over 16-byte vectors); thread 0 writes mx and
 * sums (sum exp, the label's logit) for ce_finish; lse = mx + log(sum exp), ce_finish's
 * expression.  Then ce_bwd_row over the row, read again from global memory (much of it from
 * L2).  Every global read of the first pass precedes the block reductions' barriers, and the
 * label's logit precedes them or ce_bwd_row's own, so the second pass's in-place writes meet
 * none of them.  (Staging the row in shared memory instead, 1024 threads and one row an SM,
 * measured slower on an H100: bench/results/gpu-h100.md.) */
extern "C" __global__ void __launch_bounds__(512)
    MGC_ENTRY_NAME(mgc_t *dlogits, const ce_lt *logits, float *__restrict__ mx,
                   float *__restrict__ sums, const i64 *__restrict__ labels,
                   const float *__restrict__ mask, const float *__restrict__ loss, double dloss,
                   i64 vv, i64 ld, i64 dld) {
    mgc_pdl_begin();
    __shared__ float sh[32];
    i64 r = blockIdx.x;
    const ce_lt *l = logits + r * ld;
    const i64 nv = ce_nvec(logits, vv, ld);
    const int tid = threadIdx.x, bd = blockDim.x;
    /* the label's logit: read before the barriers where ce_bwd_row has none (the gradient's
     * type is the logits'), else after them, as ce_bwd_row's own barrier orders it */
#if CE_SAME
    const i64 id = labels[r];
    const float tgt = tid == 0 && id >= 0 && id < vv ? ce_ld(l, id) : 0.0f;
#endif
    float s;
    float m = ce_online_max(s, l, nv, vv, tid, bd, sh);
    s = mgc_block_sum(s, sh); /* its barriers: every global read of the row done */
#if !CE_SAME
    const i64 id = labels[r];
#endif
    if (tid == 0) {
        mx[r] = m;
        sums[2 * r] = s;
#if CE_SAME
        sums[2 * r + 1] = tgt;
#else
        sums[2 * r + 1] = (id >= 0 && id < vv) ? ce_ld(l, id) : 0.0f;
#endif
    }
    const float ls = m + logf(s);
    bool vec = (ld & 7) == 0 && (dld & 7) == 0 && mgc_al16(logits) && mgc_al16(dlogits);
    ce_bwd_row(dlogits + r * dld, l, ce_scale(mask, loss, dloss, r), ls, id, vv, ld, vec);
}
#endif
