/* norm.cuh - LayerNorm and RMSNorm, forward and backward (runtime/cpu_ops_tmpl.h math).
 *
 * Constants: H (hidden size), T (threads of one row: a multiple of 32, <= 1024; codegen picks
 * ceil(H / 8) rounded up to 32, or 384 past H = 8192), R (row slots of a block: a power of
 * two, T * R <= 512 where T <= 512; codegen's choice), P (the plain forward only: rows a slot
 * holds at once, 2 where a row is one vector a thread).  A block of T * R threads is R row
 * slots of T threads (slot s = threadIdx.x / T, whole warps).  Thread t of a slot owns the
 * 8-element vectors v = k*T + t, k < NV = ceil(H / (8 T)), i.e. columns [8v, 8v + 8): 16-byte loads
 * and stores of bf16 (two of fp32) when H % 8 == 0 (the launcher checks that every pointer
 * is 16-byte aligned; the arena aligns tensors to 256 bytes), element by element otherwise.
 * Row statistics: warp shuffles, then (T > 32) one __syncthreads, and every thread adds the
 * slot's warp sums read from shared memory in the order a second butterfly would (or runs
 * that butterfly, past 8 warps or 12 sums): a fixed order, the same bits in every thread.
 * LayerNorm: mean, then the centred sum of squares (biased variance); RMSNorm: mean of
 * squares; rstd = rsqrtf(. + eps) (within 2 ulp of 1 / sqrt); a mean is a sum times the
 * float nearest 1 / H.  The row stays in registers (the backward re-reads x and
 * dy from L1/L2 when NV > 1, i.e. H > 8192, so that nothing spills; it re-reads w always).
 *
 * Entries:
 *   layernorm_fwd, rmsnorm_fwd    y = (x - mean) rstd w + b  /  x rstd w
 *   layernorm_bwd, rmsnorm_bwd    dx (written) and per-block partial sums of dw (and db);
 *                                 RES = 1: dx = gres + d norm (the residual stream's gradient
 *                                 added in the same pass, compiler/fusion.c); RES = 0: gres unused;
 *                                 CS = 1: also the column sums of dx as stored (the bias
 *                                 gradient of the linear that reads dx, compiler/fusion.c);
 *                                 DROP = 1 (absent: 0): also dbr = dx as stored x mask x dsc,
 *                                 the backward of the dropout_add whose sum the norm read
 *                                 (compiler/fusion.c), and CS sums dbr as stored
 *   norm_bwd_reduce               d0 += sum of the partials of set 0, d1, d2 likewise (fixed
 *                                 order)
 *   add_layernorm_fwd, add_rmsnorm_fwd   the fused dropout_add + norm (compiler/fusion.c):
 *                                 h = residual + dropout(branch) (written, rounded to the
 *                                 compute dtype), y = norm(h as rounded), mask (may be NULL);
 *                                 constant DROP (0: no dropout code)
 *   embedding_layernorm_fwd, embedding_rmsnorm_fwd   the fused embedding + norm
 *                                 (compiler/fusion.c): x = wte[tok - v0] + wpe[pos] (written,
 *                                 rounded to the compute dtype), y = norm(x as rounded);
 *                                 constant DROP (absent: 0): x is the embedding's dropout of
 *                                 that sum, with its mask (arguments only with DROP = 1)
 * The backward never uses atomics: block p of the first kernel owns rows p, p + NB, ... (its
 * slot s the i-th of them for i = s mod R), adds the R slots' column sums in slot order and
 * writes them to part[p][.]; the reduce kernel adds part[0..NB) in a fixed tree. */
/* NVRTC has no <math.h>: INFINITY (used by mgc_common.cuh's mgc_block_max) */
#ifndef INFINITY
#define INFINITY __int_as_float(0x7f800000)
#endif
#include "mgc_common.cuh"

#if defined(MGC_ENTRY_layernorm_fwd) || defined(MGC_ENTRY_layernorm_bwd) || \
    defined(MGC_ENTRY_add_layernorm_fwd) || defined(MGC_ENTRY_embedding_layernorm_fwd)
#define MGC_NORM_RMS 0
#else
#define MGC_NORM_RMS 1
#endif

#if defined(MGC_H)
#define MGC_NV   ((MGC_H + 8 * MGC_T - 1) / (8 * MGC_T)) /* 8-element vectors a thread */
#define MGC_NW   (MGC_T / 32)                            /* warps of a row slot */
#define MGC_VEC8 (MGC_H % 8 == 0)                        /* whole, aligned vectors */
/* means as products with the float nearest 1 / H: an IEEE division is about 10 instructions
 * and a branch in the chain of every row's statistics */
#define MGC_INV_H (1.0f / (float)MGC_H)
/* forward: two blocks an SM (<= 64 registers) when they are small enough to share one and a
 * thread holds at most 4 vectors of its row (H <= 12288: fp32's H 16384 forward, 6 vectors of
 * floats, spilled 84 bytes at 80 registers); the backward: MGC_NORM_BWD_MINB */
#define MGC_NORM_MINB (MGC_T * MGC_R <= 512 && MGC_NV <= 4 ? 2 : 1)
/* the fused forwards with dropout (add + norm, embedding + norm): one block a multiprocessor
 * for rows of 4 vectors a thread or more (GPT-3's H 12288: 80 registers for two spilled on
 * sm_80, the Philox words beside the held row) and for rows that are no whole vectors (H % 8
 * != 0: element loads and stores with their bounds; H 260 spilled 4 bytes at 64 registers on
 * sm_90, found by emu_sweep.py) */
#define MGC_NORM_DROP_MINB(drop) ((drop) && (MGC_NV >= 4 || !MGC_VEC8) ? 1 : MGC_NORM_MINB)

/* Columns of vector k of thread t that exist: 8, or fewer (<= 0: none) at the row's end. */
__device__ __forceinline__ int mgc_norm_nvalid(int k, int t) {
    return MGC_H - 8 * (k * MGC_T + t);
}
/* Vector k of thread t of a row (0 past H, and everywhere when !ok). */
__device__ __forceinline__ void mgc_norm_ld(const mgc_t *__restrict__ row, int k, int t, bool ok,
                                            float (&f)[8]) {
    int c0 = 8 * (k * MGC_T + t), nv = MGC_H - c0;
#if MGC_VEC8
    if (ok && nv > 0) {
        mgc_ld8(row + c0, f);
        return;
    }
#pragma unroll
    for (int j = 0; j < 8; j++)
        f[j] = 0.0f;
#else
    mgc_ld8_part(row + c0, ok ? nv : 0, f);
#endif
}
/* Vector k of thread t of a row as raw storage values (H % 8 == 0 only). */
__device__ __forceinline__ mgc_raw8 mgc_norm_ldraw(const mgc_t *__restrict__ row, int k, int t, bool ok) {
    int c0 = 8 * (k * MGC_T + t);
    return ok && c0 < MGC_H ? mgc_ldraw8(row + c0) : mgc_raw8_zero();
}
__device__ __forceinline__ void mgc_norm_st(mgc_t *__restrict__ row, int k, int t, const float (&f)[8]) {
    int c0 = 8 * (k * MGC_T + t), nv = MGC_H - c0;
#if MGC_VEC8
    if (nv > 0) mgc_st8(row + c0, f);
#else
    mgc_st8_part(row + c0, nv, f);
#endif
}

/* The dropout mask's bytes kb of a row's vector at mr (its column c0; nv of them exist): one
 * 8-byte store where rows are whole vectors (the mask's base is 8-byte aligned, and r*H + c0
 * a multiple of 8). */
__device__ __forceinline__ void mgc_norm_stmask(unsigned char *__restrict__ mr, int nv,
                                                const unsigned char (&kb)[8]) {
#if MGC_VEC8
    (void)nv;
    *(uint2 *)mr = make_uint2((unsigned)kb[0] | (unsigned)kb[1] << 8 | (unsigned)kb[2] << 16 |
                                  (unsigned)kb[3] << 24,
                              (unsigned)kb[4] | (unsigned)kb[5] << 8 | (unsigned)kb[6] << 16 |
                                  (unsigned)kb[7] << 24);
#else
#pragma unroll
    for (int j = 0; j < 8; j++)
        if (j < nv) mr[j] = kb[j];
#endif
}

/* The slot's sum of the warps' sums sh[w N + n] (w < NW) as mgc_warp_sum over lanes holding
 * them (lane w: warp w's, 0 past NW) adds them: F(r, o) is lane r's value after the
 * butterfly's levels 16 .. o (lane r adds lane r + o's), so F(0, 1) is every lane's result.
 * Read straight from shared memory by every thread, without the five dependent shuffles. */
template <int R, int O> struct mgc_slot_bfly {
    static __device__ __forceinline__ float at(const float *sh, int N, int n) {
        return mgc_slot_bfly<R, 2 * O>::at(sh, N, n) + mgc_slot_bfly<R + O, 2 * O>::at(sh, N, n);
    }
};
template <int R> struct mgc_slot_bfly<R, 32> {
    static __device__ __forceinline__ float at(const float *sh, int N, int n) {
        return R < MGC_NW ? sh[R * N + n] : 0.0f;
    }
};

/* the most warp sums (NW N) a slot sum reads directly: more would hold as many registers at
 * once (GPT-2 1.5B's backward at H 1600, 7 warps x 3, spilled).  Past 8 warps the loads and
 * adds outnumber the shuffles and adds they replace. */
#define MGC_SLOT_DIRECT 12

/* Sums of N values over the T threads of row slot `slot` (every thread of the block calls it
 * together: one __syncthreads when T > 32).  sh: this call's buffer of the slot, NW * N
 * floats; consecutive calls alternate two buffers (see the callers), so that the buffer a
 * call writes was read by every thread before the barrier of the call in between.  The warps'
 * sums are added as a butterfly over the lanes would: up to MGC_SLOT_DIRECT of them read by
 * every thread (mgc_slot_bfly: loads of shared memory in parallel in place of 5 dependent
 * shuffles and adds; the same bits), else by that butterfly. */
template <int N> __device__ __forceinline__ void mgc_slot_sum(float (&v)[N], float *sh) {
#pragma unroll
    for (int n = 0; n < N; n++)
        v[n] = mgc_warp_sum(v[n]);
#if MGC_NW > 1
    const int w = (threadIdx.x % MGC_T) >> 5, l = threadIdx.x & 31;
    if (l == 0)
#pragma unroll
        for (int n = 0; n < N; n++)
            sh[w * N + n] = v[n];
    __syncthreads();
#pragma unroll
    for (int n = 0; n < N; n++)
        v[n] = MGC_NW <= 8 && MGC_NW * N <= MGC_SLOT_DIRECT
                   ? mgc_slot_bfly<0, 1>::at(sh, N, n)
                   : mgc_warp_sum(l < MGC_NW ? sh[l * N + n] : 0.0f);
#else
    (void)sh;
#endif
}
#endif /* MGC_H */

#if defined(MGC_ENTRY_layernorm_fwd) || defined(MGC_ENTRY_rmsnorm_fwd) || \
    defined(MGC_ENTRY_add_layernorm_fwd) || defined(MGC_ENTRY_add_rmsnorm_fwd) || \
    defined(MGC_ENTRY_embedding_layernorm_fwd) || defined(MGC_ENTRY_embedding_rmsnorm_fwd)
/* The forward of NP rows held in registers (v[q]: thread t's vectors of row q, 0 past H):
 * their statistics by slot sums (the NP rows' sums side by side, so one barrier serves them
 * all, each summed in the same order as alone), then yr[q] = (v - mean) rstd w + b  /
 * v rstd w where ok[q].  sh: the slot's two buffers of NW NP floats. */
template <int NP>
__device__ __forceinline__ void mgc_norm_rows_fwd(const float (&v)[NP][MGC_NV][8], mgc_t *const (&yr)[NP],
                                                  const mgc_t *__restrict__ w, const mgc_t *__restrict__ bias,
                                                  float eps, int t, const bool (&ok)[NP],
                                                  float (*sh)[MGC_NW * NP]) {
    float m[NP], rs[NP];
#if MGC_NORM_RMS
    float ss[NP];
#pragma unroll
    for (int q = 0; q < NP; q++) {
        ss[q] = 0.0f;
#pragma unroll
        for (int k = 0; k < MGC_NV; k++)
#pragma unroll
            for (int j = 0; j < 8; j++)
                ss[q] += v[q][k][j] * v[q][k][j];
    }
    mgc_slot_sum(ss, sh[0]); /* a slot sums once: no buffer is reused */
#pragma unroll
    for (int q = 0; q < NP; q++)
        m[q] = 0.0f, rs[q] = rsqrtf(ss[q] * MGC_INV_H + eps);
    (void)bias;
#else
    float s[NP];
#pragma unroll
    for (int q = 0; q < NP; q++) {
        s[q] = 0.0f;
#pragma unroll
        for (int k = 0; k < MGC_NV; k++)
#pragma unroll
            for (int j = 0; j < 8; j++)
                s[q] += v[q][k][j];
    }
    mgc_slot_sum(s, sh[0]);
    float d2[NP];
#pragma unroll
    for (int q = 0; q < NP; q++) {
        m[q] = s[q] * MGC_INV_H, d2[q] = 0.0f;
#pragma unroll
        for (int k = 0; k < MGC_NV; k++) {
            int nv = mgc_norm_nvalid(k, t);
#pragma unroll
            for (int j = 0; j < 8; j++) {
                float d = v[q][k][j] - m[q];
                d2[q] += j < nv ? d * d : 0.0f;
            }
        }
    }
    mgc_slot_sum(d2, sh[1]);
#pragma unroll
    for (int q = 0; q < NP; q++)
        rs[q] = rsqrtf(d2[q] * MGC_INV_H + eps);
#endif
#pragma unroll
    for (int k = 0; k < MGC_NV; k++) {
        if (mgc_norm_nvalid(k, t) <= 0) continue;
        float wv[8];
        mgc_norm_ld(w, k, t, true, wv);
#if !MGC_NORM_RMS
        float bv[8];
        mgc_norm_ld(bias, k, t, bias != 0, bv);
#endif
#pragma unroll
        for (int q = 0; q < NP; q++) {
            if (!ok[q]) continue;
            float o[8];
#pragma unroll
            for (int j = 0; j < 8; j++)
#if MGC_NORM_RMS
                o[j] = v[q][k][j] * rs[q] * wv[j];
#else
                o[j] = (v[q][k][j] - m[q]) * rs[q] * wv[j] + bv[j];
#endif
            mgc_norm_st(yr[q], k, t, o);
        }
    }
}
#endif

#if defined(MGC_ENTRY_layernorm_fwd) || defined(MGC_ENTRY_rmsnorm_fwd)
#ifndef MGC_P
#define MGC_P 1
#endif
/* grid ceil(rows / (R P)), block T * R, smem 0 (static 8 R NW P bytes).  Slot s of block b
 * normalises rows b R P + q R + s, q < P (none past rows: it still takes part in the
 * barriers), all P loaded before the statistics of any: P 16-byte loads in flight a thread
 * where a row is one vector a thread (codegen's P).  bias may be NULL (LayerNorm only). */
extern "C" __global__ void __launch_bounds__(MGC_T * MGC_R, MGC_NORM_MINB)
    MGC_ENTRY_NAME(mgc_t *__restrict__ y, const mgc_t *__restrict__ x,
                   const mgc_t *__restrict__ w, const mgc_t *__restrict__ bias, i64 rows,
                   float eps) {
    mgc_pdl_begin();
    __shared__ float sh[MGC_R][2][MGC_NW * MGC_P];
    const int s = threadIdx.x / MGC_T, t = threadIdx.x - s * MGC_T;
    float v[MGC_P][MGC_NV][8];
    bool ok[MGC_P];
    mgc_t *yr[MGC_P];
#pragma unroll
    for (int q = 0; q < MGC_P; q++) {
        const i64 r = ((i64)blockIdx.x * MGC_P + q) * MGC_R + s;
        ok[q] = r < rows;
        yr[q] = y + r * (i64)MGC_H;
#pragma unroll
        for (int k = 0; k < MGC_NV; k++)
            mgc_norm_ld(x + r * (i64)MGC_H, k, t, ok[q], v[q][k]);
    }
    mgc_norm_rows_fwd<MGC_P>(v, yr, w, bias, eps, t, ok, sh[s]);
}
#endif

#if defined(MGC_ENTRY_add_layernorm_fwd) || defined(MGC_ENTRY_add_rmsnorm_fwd)
#ifndef MGC_DROP
#define MGC_DROP 1 /* 0: the op has no dropout; `drop` is then ignored */
#endif
/* grid ceil(rows / R), block T * R, smem 0 (static 8 R NW bytes); slot s: row b R + s.
 * Row r, column c is element e = elem0 + r*H + c of the dropout stream (pointwise.cuh's
 * numbering: word e & 3 of Philox block e >> 2, kept iff >= thr; the stream's step read from
 * `step`, mgc_step_stream); drop == 0: no dropout.
 * h and y are exactly the unfused pair's: h is rounded to the compute dtype before the norm
 * reads it.  bias may be NULL (LayerNorm only). */
extern "C" __global__ void __launch_bounds__(MGC_T * MGC_R, MGC_NORM_DROP_MINB(MGC_DROP))
    MGC_ENTRY_NAME(mgc_t *__restrict__ h, mgc_t *__restrict__ y, unsigned char *__restrict__ mask,
                   const mgc_t *__restrict__ branch, const mgc_t *__restrict__ res,
                   const mgc_t *__restrict__ w, const mgc_t *__restrict__ bias, i64 rows, float eps,
                   unsigned long long seed, unsigned long long stream,
                   const unsigned long long *__restrict__ step, unsigned long long elem0,
                   unsigned thr, float sc, int drop_arg) {
    mgc_pdl_begin();
    const int drop = MGC_DROP && drop_arg; /* a kernel built with DROP = 0 draws nothing */
    if (drop) stream = mgc_step_stream(stream, step);
    __shared__ float sh[MGC_R][2][MGC_NW];
    const int s = threadIdx.x / MGC_T, t = threadIdx.x - s * MGC_T;
    const i64 r = (i64)blockIdx.x * MGC_R + s;
    const bool ok = r < rows;
    const mgc_t *br = branch + r * (i64)MGC_H, *rr = res + r * (i64)MGC_H;
    mgc_t *hr = h + r * (i64)MGC_H;
    float v[1][MGC_NV][8];
#pragma unroll
    for (int k = 0; k < MGC_NV; k++) {
        int c0 = 8 * (k * MGC_T + t), nv = mgc_norm_nvalid(k, t);
        float xv[8], rv[8];
        mgc_norm_ld(br, k, t, ok, xv);
        mgc_norm_ld(rr, k, t, ok, rv);
        unsigned wd[8] = {0u, 0u, 0u, 0u, 0u, 0u, 0u, 0u};
        if (ok && nv > 0 && drop)
            mgc_philox_words8(seed, stream, elem0 + (unsigned long long)(r * (i64)MGC_H + c0), wd);
        unsigned char kb[8];
#pragma unroll
        for (int j = 0; j < 8; j++) {
            int kp = drop ? wd[j] >= thr : 1;
            kb[j] = (unsigned char)kp;
            xv[j] = (kp ? (drop ? xv[j] * sc : xv[j]) : 0.0f) + rv[j];
        }
        /* rounded to the compute dtype once (as the unfused dropout_add writes it): h's
         * storage values, and v their values */
        const mgc_raw8 hq = mgc_toraw8(xv);
        mgc_unraw8(hq, v[0][k]);
        if (!ok || nv <= 0) {
#pragma unroll
            for (int j = 0; j < 8; j++)
                v[0][k][j] = 0.0f;
            continue;
        }
#if MGC_VEC8
        mgc_straw8(hr + c0, hq);
#else
        mgc_norm_st(hr, k, t, v[0][k]); /* exact: v holds values of the dtype */
#endif
        if (mask) mgc_norm_stmask(mask + r * (i64)MGC_H + c0, nv, kb);
    }
    mgc_t *const yr[1] = {y + r * (i64)MGC_H};
    const bool oks[1] = {ok};
    mgc_norm_rows_fwd<1>(v, yr, w, bias, eps, t, oks, sh[s]);
}
#endif

#if defined(MGC_ENTRY_embedding_layernorm_fwd) || defined(MGC_ENTRY_embedding_rmsnorm_fwd)
#ifndef MGC_DROP
#define MGC_DROP 0 /* 1: the embedding's dropout, with its arguments after eps */
#endif
#if MGC_DROP
/* Row r, column c is element e = elem0 + r*H + c of the dropout stream for r < first, else
 * elem1 + (r - first)*H + c (runtime/backend.h mgc_op_drop_rng: a context rank's shard is two
 * runs of the sequence's numbering); the rest as add_norm's */
#define MGC_EMB_DROP_PARAMS                                                                    \
    , unsigned char *__restrict__ mask, unsigned long long seed, unsigned long long stream,    \
        const unsigned long long *__restrict__ step, unsigned long long elem0, i64 first,      \
        unsigned long long elem1, unsigned thr, float sc, int drop_arg
#else
#define MGC_EMB_DROP_PARAMS
#endif
/* grid ceil(rows / R), block T * R, smem 0 (static 8 R NW bytes); slot s: row r = b R + s of
 * the rows = s_c * b, r = i * b + j.  The fused embedding + norm (compiler/fusion.c): x[r] =
 * wte[tok[r] - v0] (0 outside the shard) + wpe[pos(r)] (wpe NULL: none), written rounded to
 * the compute dtype, and y[r] = norm(x[r] as rounded): embedding.cuh's embedding_fwd and the
 * plain norm's forward, bit for bit, without the norm's re-read of x.  DROP = 1: x is then the
 * embedding's dropout of that sum, as pointwise.cuh's dropout_fwd computes it from the sum as
 * stored (kept: times sc, rounded again), with its mask (never NULL); drop == 0 (an
 * evaluation): every element kept.  Positions as there: mgc_ctx_pos(i, cp, cpr, half_len) -
 * docs[r] (docs may be NULL).  bias may be NULL (LayerNorm only). */
extern "C" __global__ void __launch_bounds__(MGC_T * MGC_R, MGC_NORM_DROP_MINB(MGC_DROP))
    MGC_ENTRY_NAME(mgc_t *__restrict__ x, mgc_t *__restrict__ y, const i64 *__restrict__ tok,
                   const mgc_t *__restrict__ wte, const mgc_t *__restrict__ wpe,
                   const mgc_t *__restrict__ w, const mgc_t *__restrict__ bias, i64 v0, i64 V_l,
                   i64 b, i64 cp, i64 cpr, i64 half_len, const int *__restrict__ docs, i64 rows,
                   float eps MGC_EMB_DROP_PARAMS) {
    mgc_pdl_begin();
    __shared__ float sh[MGC_R][2][MGC_NW];
    const int s = threadIdx.x / MGC_T, t = threadIdx.x - s * MGC_T;
    const i64 r = (i64)blockIdx.x * MGC_R + s;
    const bool ok = r < rows;
#if MGC_DROP
    const int drop = drop_arg;
    if (drop) stream = mgc_step_stream(stream, step);
    const unsigned long long erow = r < first ? elem0 + (unsigned long long)(r * (i64)MGC_H)
                                              : elem1 + (unsigned long long)((r - first) * (i64)MGC_H);
#endif
    /* the row's table rows (every thread of the slot reads the same token: one transaction) */
    const i64 id = ok ? tok[r] - v0 : -1;
    const bool in = id >= 0 && id < V_l;
    const mgc_t *wr = wte + (in ? id : 0) * (i64)MGC_H;
    const i64 p = ok ? mgc_ctx_pos(r / b, cp, cpr, half_len) - (docs ? docs[r] : 0) : 0;
    const mgc_t *pr = wpe && ok ? wpe + p * (i64)MGC_H : (const mgc_t *)0;
    mgc_t *xr = x + r * (i64)MGC_H;
    float v[1][MGC_NV][8];
#if MGC_VEC8 /* every load of the row before the first addition, held as storage values (half
              * the registers of floats in 16 bits: H 16384 in bf16 spilled 144 bytes as floats) */
    mgc_raw8 wq[MGC_NV], pq[MGC_NV];
#pragma unroll
    for (int k = 0; k < MGC_NV; k++) {
        wq[k] = mgc_norm_ldraw(wr, k, t, ok && in);
        pq[k] = mgc_norm_ldraw(pr, k, t, pr != 0);
    }
#else
    float wvs[MGC_NV][8], pvs[MGC_NV][8];
#pragma unroll
    for (int k = 0; k < MGC_NV; k++) { /* every load of the row before the first addition */
        mgc_norm_ld(wr, k, t, ok && in, wvs[k]);
        mgc_norm_ld(pr, k, t, pr != 0, pvs[k]);
    }
#endif
#pragma unroll
    for (int k = 0; k < MGC_NV; k++) {
        int c0 = 8 * (k * MGC_T + t), nv = mgc_norm_nvalid(k, t);
#if MGC_VEC8
        float wv[8], pv[8];
        mgc_unraw8(wq[k], wv);
        mgc_unraw8(pq[k], pv);
#else
        float(&wv)[8] = wvs[k];
        const float(&pv)[8] = pvs[k];
#endif
        if (pr) /* as embedding_fwd adds: not at all without positions (-0 stays -0) */
#pragma unroll
            for (int j = 0; j < 8; j++)
                wv[j] += pv[j];
        /* rounded to the compute dtype once (as embedding_fwd writes it): x's storage values,
         * and v their values */
#if MGC_DROP /* then dropped out as dropout_fwd does from that sum as stored, rounded again */
        mgc_unraw8(mgc_toraw8(wv), wv);
        unsigned wd[8] = {0u, 0u, 0u, 0u, 0u, 0u, 0u, 0u};
        if (ok && nv > 0 && drop) mgc_philox_words8(seed, stream, erow + (unsigned long long)c0, wd);
        unsigned char kb[8];
#pragma unroll
        for (int j = 0; j < 8; j++) {
            int kp = drop ? wd[j] >= thr : 1;
            kb[j] = (unsigned char)kp;
            wv[j] = kp ? (drop ? wv[j] * sc : wv[j]) : 0.0f;
        }
#endif
        const mgc_raw8 xq = mgc_toraw8(wv);
        mgc_unraw8(xq, v[0][k]);
        if (!ok || nv <= 0) {
#pragma unroll
            for (int j = 0; j < 8; j++)
                v[0][k][j] = 0.0f;
            continue;
        }
#if MGC_VEC8
        mgc_straw8(xr + c0, xq);
#else
        (void)c0;
        mgc_norm_st(xr, k, t, v[0][k]); /* exact: v holds values of the dtype */
#endif
#if MGC_DROP
        mgc_norm_stmask(mask + r * (i64)MGC_H + c0, nv, kb);
#endif
    }
    mgc_t *const yr[1] = {y + r * (i64)MGC_H};
    const bool oks[1] = {ok};
    mgc_norm_rows_fwd<1>(v, yr, w, bias, eps, t, oks, sh[s]);
}
#endif

#if defined(MGC_ENTRY_layernorm_bwd) || defined(MGC_ENTRY_rmsnorm_bwd)
/* grid NB = min(ceil(rows / R), 256) (the launcher's choice from the shape alone, never the SM
 * count, so the bits do not depend on the GPU), block T * R, smem 0 (static: R NW 6 floats, and (R - 1) T 8 NV
 * floats for the slots' column sums).  Block p handles its rows p + i NB (i < its count),
 * R at a time (slot s: i = s, s + R, ...), and writes part[p*H + c] = sum over its rows of
 * dy xhat (dw), then the next sets: when want_db, part[(NB + p)*H + c] = sum of dy (db); when
 * CS, in the set after those, the sum of dx as stored (rounded to the row's dtype): each slot
 * sums its rows in order, then the slots are added in order 0, 1, .., R-1.
 * dx = rstd (g - mean(g) - xhat mean(g xhat)), g = dy w (RMSNorm: no mean(g) term,
 * xhat = x rstd); mean(g xhat) is computed as rstd mean(g (x - mean)). */
#ifndef MGC_DROP
#define MGC_DROP 0
#endif
#define MGC_NORM_HOLD (MGC_NV == 1) /* x and dy held in registers, else re-read (L1/L2) */
/* 16-bit rows held, blocks of up to 384 threads: the next row's x and dy are loaded while
 * this one's statistics are computed (8 more registers, which two blocks of up to 384 threads
 * a multiprocessor leave: 85 a thread; two of 512 leave 64, and there the second block is
 * worth more than the prefetch) */
#define MGC_NORM_PREFETCH (MGC_NORM_HOLD && MGC_VEC8 && MGC_HALF && MGC_T * MGC_R <= 384)
/* two blocks a multiprocessor where they hold their rows and have up to 512 threads (at most
 * 85 registers at 384 threads, 64 at 512: 64 Ki registers, allocated 256 a warp), else one.
 * With one, the 256 blocks of the grid run in two rounds on a 132-multiprocessor H100 (GPT-2
 * 1.5B's H 1600 backward at 95 registers did).  fp16's conversions need more than 80 (it
 * would spill), and fp32 rows more than 64 (twice the registers of a 16-bit row): one.  At
 * 512 threads only rows of whole 16-byte vectors, held as raw storage values: a row of other
 * width holds its x and dy as floats, and at 64 registers spilled (H 100 in bf16: 28 bytes,
 * found by test_cuda's norm check on an H200).  The column sums of dx (CS) take 8 registers
 * more: two blocks of bf16 rows up to 448 threads (72 registers: GPT-2 1.5B's H 1600), not 512
 * (64: H 1024 spilled 68 bytes), and fp32 rows one block (H 768 spilled 16 bytes at 80). */
#define MGC_NORM_BWD_MINB                                                                      \
    (MGC_NORM_HOLD && !MGC_FP16 &&                                                             \
             (MGC_T * MGC_R <= 384 || (MGC_HALF && MGC_VEC8 && MGC_T * MGC_R <= 512)) &&       \
             (!MGC_CS || (MGC_HALF && MGC_T * MGC_R <= 448))                                   \
         ? 2                                                                                   \
         : 1)

/* The residual gradient's row loaded with x and dy, before the statistics, where a row is held
 * (else in the pass that writes dx), but not by fp16 and fp32 blocks of more than 512 threads,
 * whose 64-80 registers it crowds: fp16 spilled 12-16 bytes on sm_80 at H 7424-7936 (none
 * since), fp32 32-68 at H 6400-7936 (8-44 since) */
#define MGC_NORM_RES_EARLY                                                                     \
    (MGC_RES && MGC_NORM_HOLD && MGC_VEC8 && (MGC_BF16 || MGC_T * MGC_R <= 512))

/* Adds the R slots' column sums a (slot order 0, 1, ..) and writes them to pr[0..H) (slot 0).
 * cmb: (R - 1) NV 8 T floats of shared memory; every thread of the block calls it. */
template <typename C>
__device__ __forceinline__ void mgc_norm_put_part(float (&a)[MGC_NV][8], float *__restrict__ pr, C cmb,
                                                  int s, int t) {
#if MGC_R > 1
    if (s > 0)
#pragma unroll
        for (int k = 0; k < MGC_NV; k++)
#pragma unroll
            for (int j = 0; j < 8; j++)
                cmb[s - 1][(k * 8 + j) * MGC_T + t] = a[k][j];
    __syncthreads();
    if (s == 0)
#pragma unroll
        for (int k = 0; k < MGC_NV; k++)
#pragma unroll
            for (int j = 0; j < 8; j++)
                for (int q = 0; q < MGC_R - 1; q++)
                    a[k][j] += cmb[q][(k * 8 + j) * MGC_T + t];
    __syncthreads(); /* cmb is rewritten by the next call */
#else
    (void)cmb;
#endif
    if (s != 0) return;
#pragma unroll
    for (int k = 0; k < MGC_NV; k++) {
        int c0 = 8 * (k * MGC_T + t), nv = mgc_norm_nvalid(k, t);
#if MGC_VEC8 /* part is 16-byte aligned: scratch, rows of H % 8 == 0 floats */
        if (nv > 0) {
            ((float4 *)(pr + c0))[0] = make_float4(a[k][0], a[k][1], a[k][2], a[k][3]);
            ((float4 *)(pr + c0))[1] = make_float4(a[k][4], a[k][5], a[k][6], a[k][7]);
        }
#else
#pragma unroll
        for (int j = 0; j < 8; j++)
            if (j < nv) pr[c0 + j] = a[k][j];
#endif
    }
}
#if MGC_DROP
/* The dropout mask's bytes of vector k of thread t of a row, byte j for column 8v + j (0 past
 * H): one 8-byte load where rows are whole vectors (the mask's rows are then 8-byte aligned). */
__device__ __forceinline__ unsigned long long mgc_norm_ldmask(const unsigned char *__restrict__ row,
                                                             int k, int t) {
    int c0 = 8 * (k * MGC_T + t), nv = MGC_H - c0;
#if MGC_VEC8
    return nv > 0 ? *(const unsigned long long *)(row + c0) : 0ull;
#else
    unsigned long long m = 0ull;
#pragma unroll
    for (int j = 0; j < 8; j++)
        if (j < nv) m |= (unsigned long long)row[c0 + j] << (8 * j);
    return m;
#endif
}
#endif
extern "C" __global__ void __launch_bounds__(MGC_T * MGC_R, MGC_NORM_BWD_MINB)
    MGC_ENTRY_NAME(mgc_t *__restrict__ dx, float *__restrict__ part,
                   const mgc_t *__restrict__ dy, const mgc_t *__restrict__ x,
                   const mgc_t *__restrict__ w, const mgc_t *__restrict__ gres, i64 rows, float eps,
                   int want_db_arg, mgc_t *__restrict__ dbr, const unsigned char *__restrict__ mask,
                   float dsc) {
    mgc_pdl_begin();
#if !MGC_DROP
    (void)dbr, (void)mask, (void)dsc;
#endif
    /* RMSNorm has no bias: its db sums are then dead code, not NV 8 registers (H 16384 in bf16
     * spilled 16 bytes with them) */
    const int want_db = MGC_NORM_RMS ? 0 : want_db_arg;
    __shared__ float sh[MGC_R][2][MGC_NW * 3];
    const int s = threadIdx.x / MGC_T, t = threadIdx.x - s * MGC_T;
    const i64 nb = gridDim.x, p = blockIdx.x;
    const i64 mine = rows > p ? (rows - 1 - p) / nb + 1 : 0; /* rows of this block */
    float aw[MGC_NV][8], ab[MGC_NV][8];
#if MGC_CS
    float ac[MGC_NV][8]; /* the column sums of dx as stored */
#endif
#pragma unroll
    for (int k = 0; k < MGC_NV; k++)
#pragma unroll
        for (int j = 0; j < 8; j++) {
            aw[k][j] = ab[k][j] = 0.0f;
#if MGC_CS
            ac[k][j] = 0.0f;
#endif
        }
    int buf = 0; /* the slot-sum buffer of the next call: alternates */
#if MGC_NORM_PREFETCH /* the slot's first row; each step then fetches the next one's */
    mgc_raw8 xn, gn;
    {
        const i64 r0 = p + (i64)s * nb;
        xn = mgc_norm_ldraw(x + r0 * (i64)MGC_H, 0, t, s < mine);
        gn = mgc_norm_ldraw(dy + r0 * (i64)MGC_H, 0, t, s < mine);
    }
#endif
#pragma unroll 1
    for (i64 i0 = 0; i0 < mine; i0 += MGC_R) { /* the same trip count in every slot */
        const i64 i = i0 + s, r = p + i * nb;
        const bool ok = i < mine;
        const mgc_t *xr = x + r * (i64)MGC_H, *gr = dy + r * (i64)MGC_H;
#if MGC_NORM_PREFETCH
        const mgc_raw8 xq = xn, gq = gn;
        {   /* the slot's next row, in flight during this one's statistics */
            const i64 r2 = r + MGC_R * nb;
            const bool ok2 = i + MGC_R < mine;
            xn = mgc_norm_ldraw(x + r2 * (i64)MGC_H, 0, t, ok2);
            gn = mgc_norm_ldraw(dy + r2 * (i64)MGC_H, 0, t, ok2);
        }
        (void)xr, (void)gr;
#elif MGC_NORM_HOLD && MGC_VEC8 /* the row's x, dy (and gres) held as raw storage values */
        mgc_raw8 xq = mgc_norm_ldraw(xr, 0, t, ok), gq = mgc_norm_ldraw(gr, 0, t, ok);
#endif
#if MGC_NORM_RES_EARLY /* issued early: its latency hides behind the stats */
        mgc_raw8 rq = mgc_norm_ldraw(gres + r * (i64)MGC_H, 0, t, ok);
#endif
#if MGC_NORM_HOLD && MGC_VEC8
#define MGC_XLOAD(k, f)                                                                        \
    float f[8];                                                                                \
    mgc_unraw8(xq, f)
#define MGC_GLOAD(k, f)                                                                        \
    float f[8];                                                                                \
    mgc_unraw8(gq, f)
#elif MGC_NORM_HOLD
        float xv[1][8], gv[1][8];
        mgc_norm_ld(xr, 0, t, ok, xv[0]);
        mgc_norm_ld(gr, 0, t, ok, gv[0]);
#define MGC_XLOAD(k, f) float(&f)[8] = xv[k]
#define MGC_GLOAD(k, f) float(&f)[8] = gv[k]
#else
#define MGC_XLOAD(k, f)                                                                        \
    float f[8];                                                                                \
    mgc_norm_ld(xr, k, t, ok, f)
#define MGC_GLOAD(k, f)                                                                        \
    float f[8];                                                                                \
    mgc_norm_ld(gr, k, t, ok, f)
#endif
#define MGC_WLOAD(k, f) /* w: re-read, from L1 */                                              \
    float f[8];                                                                                \
    mgc_norm_ld(w, k, t, true, f)
#if MGC_NORM_RMS /* one slot sum: sum x^2 and sum g x */
        float st[2] = {0.0f, 0.0f};
#pragma unroll
        for (int k = 0; k < MGC_NV; k++) {
            MGC_XLOAD(k, xk);
            MGC_GLOAD(k, gk);
            MGC_WLOAD(k, wk);
#pragma unroll
            for (int j = 0; j < 8; j++) {
                st[0] += xk[j] * xk[j];
                st[1] += gk[j] * wk[j] * xk[j];
            }
        }
        mgc_slot_sum(st, sh[s][buf]);
        buf ^= 1;
        const float m = 0.0f, rs = rsqrtf(st[0] * MGC_INV_H + eps), sg = 0.0f;
        const float sgx = st[1] * rs * MGC_INV_H;
#else /* two: sum x; then sum (x - m)^2, sum g, sum g (x - m) */
        float s1[1] = {0.0f};
#pragma unroll
        for (int k = 0; k < MGC_NV; k++) {
            MGC_XLOAD(k, xk);
#pragma unroll
            for (int j = 0; j < 8; j++)
                s1[0] += xk[j];
        }
        mgc_slot_sum(s1, sh[s][buf]);
        buf ^= 1;
        const float m = s1[0] * MGC_INV_H;
        float st[3] = {0.0f, 0.0f, 0.0f};
#pragma unroll
        for (int k = 0; k < MGC_NV; k++) {
            MGC_XLOAD(k, xk);
            MGC_GLOAD(k, gk);
            MGC_WLOAD(k, wk);
            int nv = mgc_norm_nvalid(k, t);
#pragma unroll
            for (int j = 0; j < 8; j++) {
                float d = j < nv ? xk[j] - m : 0.0f, g = gk[j] * wk[j];
                st[0] += d * d;
                st[1] += g;
                st[2] += g * d;
            }
        }
        mgc_slot_sum(st, sh[s][buf]);
        buf ^= 1;
        const float rs = rsqrtf(st[0] * MGC_INV_H + eps), sg = st[1] * MGC_INV_H;
        const float sgx = st[2] * rs * MGC_INV_H;
#endif
        if (!ok) continue;
        mgc_t *dr = dx + r * (i64)MGC_H;
#pragma unroll
        for (int k = 0; k < MGC_NV; k++) {
            if (mgc_norm_nvalid(k, t) <= 0) continue;
            MGC_XLOAD(k, xk);
            MGC_GLOAD(k, gk);
            MGC_WLOAD(k, wk);
#if MGC_NORM_RES_EARLY
            float rv[8];
            mgc_unraw8(rq, rv);
#elif MGC_RES
            float rv[8];
            mgc_norm_ld(gres + r * (i64)MGC_H, k, t, true, rv);
#endif
            float o[8];
#if MGC_DROP /* dropout_add_bwd's kernel on dx as stored (pointwise.cuh dropout_bwd) */
            const unsigned long long mk = mgc_norm_ldmask(mask + r * (i64)MGC_H, k, t);
            float ob[8];
#endif
#pragma unroll
            for (int j = 0; j < 8; j++) {
                float xh = (xk[j] - m) * rs, g = gk[j] * wk[j];
                aw[k][j] += gk[j] * xh;
                ab[k][j] += gk[j];
                o[j] = rs * (g - sg - xh * sgx);
#if MGC_RES /* the fused residual add: dx = g_res + d norm, rounded once */
                o[j] = rv[j] + o[j];
#endif
#if MGC_DROP
                ob[j] = (mk >> (8 * j)) & 0xffull ? mgc_ld(mgc_st(o[j])) * dsc : 0.0f;
#if MGC_CS /* the bias gradient of the linear that reads dbr: dbr as stored */
                ac[k][j] += mgc_ld(mgc_st(ob[j]));
#endif
#elif MGC_CS /* what the linear's bias gradient would read back: dx rounded to the dtype */
                ac[k][j] += mgc_ld(mgc_st(o[j]));
#endif
            }
            mgc_norm_st(dr, k, t, o);
#if MGC_DROP
            mgc_norm_st(dbr + r * (i64)MGC_H, k, t, ob);
#endif
        }
#undef MGC_XLOAD
#undef MGC_GLOAD
#undef MGC_WLOAD
    }
    /* the slots' column sums, added in slot order by slot 0 through shared memory */
#if MGC_R > 1
    __shared__ float cmb[MGC_R - 1][MGC_NV * 8 * MGC_T];
#else
    float *cmb = 0;
#endif
    mgc_norm_put_part(aw, part + p * (i64)MGC_H, cmb, s, t);
    if (want_db) mgc_norm_put_part(ab, part + (nb + p) * (i64)MGC_H, cmb, s, t);
#if MGC_CS
    mgc_norm_put_part(ac, part + ((want_db ? 2 : 1) * nb + p) * (i64)MGC_H, cmb, s, t);
#endif
}
#endif

#if defined(MGC_ENTRY_norm_bwd_reduce)
/* grid (ceil(h / 32), sets: 1 to 3), block 1024, smem 0 (static 4 KiB).  Block (x, y) owns
 * the 32 columns c = 32x + (tid & 31) of set y: destination d0, d1 or d2, its partials from
 * part[y*nb*h] (the sets of the norm backward: dw, then db, then the column sums of dx; of
 * a bias gradient: one).  Thread row j = tid >> 5 sums the partials p = j, j + 32, ... < nb
 * in order, then thread row 0 adds the 32 row sums in order j = 0..31: d[c] += that.  The
 * order depends on nb only. */
extern "C" __global__ void __launch_bounds__(1024)
    MGC_ENTRY_NAME(float *__restrict__ d0, float *__restrict__ d1, float *__restrict__ d2,
                   const float *__restrict__ part, int nb, i64 h) {
    mgc_pdl_begin();
    __shared__ float sh[32][33];
    const int cx = threadIdx.x & 31, j = threadIdx.x >> 5;
    const i64 c = (i64)blockIdx.x * 32 + cx;
    const float *src = part + (i64)blockIdx.y * nb * h;
    float *dst = blockIdx.y == 0 ? d0 : blockIdx.y == 1 ? d1 : d2;
    /* thread row 0 reads dst with the partials, not after the barrier: one wait for memory
     * less (dst[c] + t, as dst[c] += t) */
    const float v0 = j == 0 && c < h ? dst[c] : 0.0f;
    float s = 0.0f;
    if (c < h)
#pragma unroll 8 /* the 8 partials of nb = 256 loaded together, then added in order */
        for (int p = j; p < nb; p += 32)
            s += src[(i64)p * h + c];
    sh[j][cx] = s;
    __syncthreads();
    if (j == 0 && c < h) {
        float t = 0.0f;
        for (int q = 0; q < 32; q++)
            t += sh[q][cx];
        dst[c] = v0 + t;
    }
}
#endif
