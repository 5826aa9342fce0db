/* attention.cuh - flash attention, forward and backward (SIMT, fp32 accumulation).
 *
 * Layouts as the plan has them (docs/partitioning.md, attention):
 *   q, out, dq, dout  (sq, b, A, D)  mgc_t
 *   k, v, dk, dv      (sk, b, G, D)  mgc_t; query head a reads kv head a / (A/G)
 *   lse, dsum         (sq, b, A)     fp32; lse = log sum_j exp(scale q.k_j) over the visible keys
 * Constants: MGC_D (head dim: 16, 32, 64 or 128), MGC_CAUSAL (0/1).
 *
 * Math (runtime/cpu_ops_tmpl.h mgc_cpu_attention_fwd/bwd): key j is visible from query i iff
 * !CAUSAL or kpos(j) <= qpos(i); a row with no visible key gets out 0 and lse -inf and no
 * gradient.  Dropout (p > 0) multiplies probability (bi, a, i, j) by keep / (1-p), keep =
 * (Philox word of element elem0 + ((bi*A + a)*sq + i)*sk + j >= thr): the words of
 * runtime/rng.c; p = 0 draws nothing.
 *
 * Positions: when the int32 arrays qpos (sq) / kpos (sk) are not NULL they are used; otherwise
 * they are computed here from (pos_s = seq_length, pos_cp, pos_rank) exactly as
 * runtime/cpu_backend.c ctx_positions / gathered_positions do: pos_cp <= 1 -> row index;
 * queries: the rank's two chunks; keys: the same (k_gathered = 0) or the all-gathered rows of
 * ranks 0..cp-1 (k_gathered = 1).
 *
 * Every kernel is a block of 128 threads seen as 8 x 16 (ty = tid / 16, tx = tid % 16): a tile
 * row r of a thread is ty + 8 m, a tile column tx + 16 n (conflict-free shared-memory reads).
 * Tiles live in static shared memory (< 48 KiB, no dynamic shared memory); the tile sizes are
 * functions of D only, written below and repeated by runtime/cuda_ops_attention.c:
 *   forward:  ATT_FBQ query rows per block (fp32: 64 for D <= 64, else 32; bf16: 64),
 *             ATT_FBK keys per step (fp32: 64 for D <= 32, else 32; bf16: 64 for D <= 64,
 *             else 32)
 * The bf16 forward runs its two products on tensor cores (mma.sync m16n8k16, bf16 inputs,
 * fp32 accumulation; P is rounded to bf16 for P V as in FlashAttention); every other kernel
 * is SIMT fp32.
 *   backward: ATT_BR rows kept per block (64 for D <= 32, 32 for D = 64, 16 for D = 128),
 *             ATT_BC rows per step (32 for D <= 64, 16 for D = 128)
 * No float atomics: every sum has a fixed order (dK/dV iterate the group's query heads in
 * order, then the query tiles in order). */
/* NVRTC compiles with no toolkit header: mgc_common.cuh's mgc_block_max uses INFINITY */
#ifndef INFINITY
#define INFINITY __int_as_float(0x7f800000)
#endif
#include "mgc_common.cuh"

#ifndef MGC_D
#define MGC_D 64
#endif
#ifndef MGC_CAUSAL
#define MGC_CAUSAL 0
#endif

#define ATT_D ((int)MGC_D)
#define ATT_NT 128
#if MGC_BF16
#define ATT_FBQ 64 /* bf16 forward: tensor cores, 16 query rows per warp */
#define ATT_FBK (ATT_D <= 64 ? 64 : 32)
#else
#define ATT_FBQ (ATT_D <= 64 ? 64 : 32)
#define ATT_FBK (ATT_D <= 32 ? 64 : 32)
#endif
#define ATT_BR (ATT_D <= 32 ? 64 : (ATT_D <= 64 ? 32 : 16))
#define ATT_BC (ATT_D <= 64 ? 32 : 16)
#define ATT_DC (ATT_D / 16) /* columns of D per thread */
#define ATT_LOG2E 1.4426950408889634f
#define ATT_LN2 0.6931471805599453f

#if MGC_D != 16 && MGC_D != 32 && MGC_D != 64 && MGC_D != 128
#error "attention.cuh: D must be 16, 32, 64 or 128"
#endif

__device__ __forceinline__ float att_ninf(void) {
    return __int_as_float(0xff800000);
}

/* ---- positions (runtime/cpu_backend.c ctx_positions, gathered_positions) ---------------- */

__device__ __forceinline__ int att_ctx_pos(int row, int s, int cp, int r) {
    if (cp <= 1) return row;
    int half = s / (2 * cp);
    return row < half ? r * half + row : (2 * cp - 1 - r) * half + (row - half);
}
__device__ __forceinline__ int att_qpos(const int *qpos, int i, int s, int cp, int rank) {
    return qpos ? qpos[i] : att_ctx_pos(i, s, cp, rank);
}
__device__ __forceinline__ int att_kpos(const int *kpos, int j, int sk, int s, int cp, int rank,
                                        int gathered) {
    if (kpos) return kpos[j];
    if (cp <= 1) return j;
    if (!gathered) return att_ctx_pos(j, s, cp, rank);
    int per = sk / cp, q = j / per;
    return att_ctx_pos(j - q * per, s, cp, q);
}

/* ---- Philox-4x32-10 (runtime/rng.c): word of element e of (seed, stream) ---------------- */

__device__ __forceinline__ unsigned att_philox_word(unsigned long long seed,
                                                    unsigned long long stream,
                                                    unsigned long long e) {
    unsigned long long blk = e >> 2;
    unsigned c0 = (unsigned)blk, c1 = (unsigned)(blk >> 32), c2 = (unsigned)stream,
             c3 = (unsigned)(stream >> 32);
    unsigned k0 = (unsigned)seed, k1 = (unsigned)(seed >> 32);
#pragma unroll
    for (int round = 0; round < 10; round++) {
        unsigned hi0 = __umulhi(0xD2511F53u, c0), lo0 = 0xD2511F53u * c0;
        unsigned hi1 = __umulhi(0xCD9E8D57u, c2), lo1 = 0xCD9E8D57u * c2;
        c0 = hi1 ^ c1 ^ k0;
        c1 = lo1;
        c2 = hi0 ^ c3 ^ k1;
        c3 = lo0;
        k0 += 0x9E3779B9u;
        k1 += 0xBB67AE85u;
    }
    unsigned w = e & 1 ? c1 : c0, w2 = e & 1 ? c3 : c2;
    return e & 2 ? w2 : w;
}

/* keep / (1-p) of probability (bi, a, i, j), or 1 when p = 0 */
__device__ __forceinline__ float att_keep(float p, unsigned thr, float dscale,
                                          unsigned long long seed, unsigned long long stream,
                                          unsigned long long elem0, int bi, int a, int i, int j,
                                          int A, int sq, int sk) {
    if (!(p > 0.0f)) return 1.0f;
    unsigned long long e =
        elem0 + (unsigned long long)((((i64)bi * A + a) * sq + i) * (i64)sk + j);
    return att_philox_word(seed, stream, e) >= thr ? dscale : 0.0f;
}

/* Loads rows [r0, r0 + ROWS) of head h of x (n, b, H, D) for batch row bi into sh[ROWS][D+1]
 * as fp32; rows past n are 0. */
template <int ROWS>
__device__ __forceinline__ void att_load_tile(float (*sh)[ATT_D + 1], const mgc_t *x, int r0,
                                              int n, int b, int H, int bi, int h) {
    for (int idx = threadIdx.x; idx < ROWS * ATT_D; idx += ATT_NT) {
        int r = idx / ATT_D, c = idx % ATT_D, i = r0 + r;
        sh[r][c] = i < n ? mgc_ld(x[(((i64)i * b + bi) * H + h) * ATT_D + c]) : 0.0f;
    }
}

/* block-wide max of an int held by threads tid < n (others pass anything); all get it */
__device__ __forceinline__ int att_block_max_int(int v, int valid, float *red) {
    float f = valid ? (float)v : att_ninf();
    f = mgc_block_max(f, red);
    return f == att_ninf() ? -2147483647 - 1 : (int)f;
}

#if defined(MGC_ENTRY_attention_fwd) && !MGC_BF16
/* attention_fwd (fp32, SIMT): out = softmax(scale q k^T, masked) (dropout) v, lse per row.
 * grid (ceil(sq / ATT_FBQ), b, A), block 128, dynamic shared memory 0.
 * lse must not be NULL (the launcher passes scratch when the plan does not keep it). */
extern "C" __global__ void __launch_bounds__(ATT_NT, 2)
    MGC_ENTRY_NAME(mgc_t *__restrict__ out, float *__restrict__ lse, const mgc_t *__restrict__ q,
                   const mgc_t *__restrict__ k, const mgc_t *__restrict__ v, int sq, int sk, int b,
                   int A, int G, float scale, float drop_p, unsigned drop_thr, float drop_scale,
                   unsigned long long seed, unsigned long long stream, unsigned long long elem0,
                   const int *__restrict__ qpos, const int *__restrict__ kpos, int pos_s,
                   int pos_cp, int pos_rank, int k_gathered) {
    constexpr int BQ = ATT_FBQ, BK = ATT_FBK, RM = BQ / 8, RN = BK / 16;
    __shared__ float Qs[BQ][ATT_D + 1];
    __shared__ float KVs[BK][ATT_D + 1];
    __shared__ float Ps[BQ][BK + 1];
    __shared__ float red[32];
    const int tid = threadIdx.x, ty = tid >> 4, tx = tid & 15;
    const int q0 = blockIdx.x * BQ, bi = blockIdx.y, a = blockIdx.z, g = a / (A / G);
    const float sl2 = scale * ATT_LOG2E;

    att_load_tile<BQ>(Qs, q, q0, sq, b, A, bi, a);
    int qp[RM];
#pragma unroll
    for (int m = 0; m < RM; m++) {
        int i = q0 + ty + 8 * m;
        qp[m] = i < sq ? att_qpos(qpos, i, pos_s, pos_cp, pos_rank) : -2147483647 - 1;
    }
    int qmax = 0;
    if (MGC_CAUSAL) {
        int i = q0 + tid;
        int ok = tid < BQ && i < sq;
        qmax = att_block_max_int(ok ? att_qpos(qpos, i, pos_s, pos_cp, pos_rank) : 0, ok, red);
    }
    float acc[RM][ATT_DC], mrow[RM], lrow[RM];
#pragma unroll
    for (int m = 0; m < RM; m++) {
        mrow[m] = att_ninf();
        lrow[m] = 0.0f;
#pragma unroll
        for (int c = 0; c < ATT_DC; c++) acc[m][c] = 0.0f;
    }
    __syncthreads();

    for (int k0 = 0; k0 < sk; k0 += BK) {
        if (MGC_CAUSAL) { /* skip a key tile no query of the tile sees */
            int j = k0 + tid;
            int vis = tid < BK && j < sk &&
                      att_kpos(kpos, j, sk, pos_s, pos_cp, pos_rank, k_gathered) <= qmax;
            if (!__syncthreads_or(vis)) continue;
        }
        att_load_tile<BK>(KVs, k, k0, sk, b, G, bi, g);
        __syncthreads();
        float s[RM][RN];
#pragma unroll
        for (int m = 0; m < RM; m++)
#pragma unroll
            for (int n = 0; n < RN; n++) s[m][n] = 0.0f;
#pragma unroll 4
        for (int c = 0; c < ATT_D; c++) {
            float qa[RM], kb[RN];
#pragma unroll
            for (int m = 0; m < RM; m++) qa[m] = Qs[ty + 8 * m][c];
#pragma unroll
            for (int n = 0; n < RN; n++) kb[n] = KVs[tx + 16 * n][c];
#pragma unroll
            for (int m = 0; m < RM; m++)
#pragma unroll
                for (int n = 0; n < RN; n++) s[m][n] = fmaf(qa[m], kb[n], s[m][n]);
        }
        int kp[RN];
#pragma unroll
        for (int n = 0; n < RN; n++) {
            int j = k0 + tx + 16 * n;
            kp[n] = j < sk ? (MGC_CAUSAL ? att_kpos(kpos, j, sk, pos_s, pos_cp, pos_rank,
                                                    k_gathered)
                                         : 0)
                           : 2147483647;
        }
#pragma unroll
        for (int m = 0; m < RM; m++) {
            float mx = att_ninf();
#pragma unroll
            for (int n = 0; n < RN; n++) {
                int j = k0 + tx + 16 * n;
                bool visible = j < sk && (!MGC_CAUSAL || kp[n] <= qp[m]);
                s[m][n] = visible ? s[m][n] * sl2 : att_ninf();
                mx = fmaxf(mx, s[m][n]);
            }
#pragma unroll
            for (int o = 8; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
            float mnew = fmaxf(mrow[m], mx);
            float alpha = 1.0f, sum = 0.0f;
            int i = q0 + ty + 8 * m;
            if (mnew != att_ninf()) {
                alpha = exp2f(mrow[m] - mnew); /* 0 when mrow is -inf */
#pragma unroll
                for (int n = 0; n < RN; n++) {
                    float p = s[m][n] == att_ninf() ? 0.0f : exp2f(s[m][n] - mnew);
                    sum += p;
                    if (drop_p > 0.0f && p != 0.0f)
                        p *= att_keep(drop_p, drop_thr, drop_scale, seed, stream, elem0, bi, a, i,
                                      k0 + tx + 16 * n, A, sq, sk);
                    s[m][n] = p;
                }
            } else {
#pragma unroll
                for (int n = 0; n < RN; n++) s[m][n] = 0.0f;
            }
#pragma unroll
            for (int o = 8; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
            mrow[m] = mnew;
            lrow[m] = lrow[m] * alpha + sum;
#pragma unroll
            for (int c = 0; c < ATT_DC; c++) acc[m][c] *= alpha;
#pragma unroll
            for (int n = 0; n < RN; n++) Ps[ty + 8 * m][tx + 16 * n] = s[m][n];
        }
        __syncthreads(); /* K read by all, P written */
        att_load_tile<BK>(KVs, v, k0, sk, b, G, bi, g);
        __syncthreads();
#pragma unroll 4
        for (int kk = 0; kk < BK; kk++) {
            float vb[ATT_DC];
#pragma unroll
            for (int c = 0; c < ATT_DC; c++) vb[c] = KVs[kk][tx + 16 * c];
#pragma unroll
            for (int m = 0; m < RM; m++) {
                float p = Ps[ty + 8 * m][kk];
#pragma unroll
                for (int c = 0; c < ATT_DC; c++) acc[m][c] = fmaf(p, vb[c], acc[m][c]);
            }
        }
        __syncthreads(); /* before the next tile overwrites KVs and Ps */
    }

#pragma unroll
    for (int m = 0; m < RM; m++) {
        int i = q0 + ty + 8 * m;
        if (i >= sq) continue;
        bool none = lrow[m] == 0.0f;
        float inv = none ? 0.0f : 1.0f / lrow[m];
        i64 base = (((i64)i * b + bi) * A + a) * ATT_D;
#pragma unroll
        for (int c = 0; c < ATT_DC; c++) out[base + tx + 16 * c] = mgc_st(acc[m][c] * inv);
        if (tx == 0)
            lse[((i64)i * b + bi) * A + a] =
                none ? att_ninf() : (mrow[m] + __log2f(lrow[m])) * ATT_LN2;
    }
}
#endif

#if defined(MGC_ENTRY_attention_fwd) && MGC_BF16
/* c += a (16x16, row) * b (16x8, col): bf16 inputs, fp32 accumulators.  Fragments (lane =
 * 4 grp + tig): a0 (row grp, k 2tig..+1), a1 (row grp+8, same k), a2/a3 (k + 8); b0 (k 2tig..+1,
 * col grp), b1 (k + 8); c0,c1 (row grp, cols 2tig..+1), c2,c3 (row grp+8). */
__device__ __forceinline__ void att_mma(float c[4], const unsigned a[4], unsigned b0,
                                        unsigned b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, "
                 "{%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
__device__ __forceinline__ unsigned att_pack(float lo, float hi) {
    return (unsigned)mgc_st(lo) | ((unsigned)mgc_st(hi) << 16);
}

/* attention_fwd (bf16, tensor cores): out = softmax(scale q k^T, masked) (dropout) v, lse.
 * Warp w owns query rows q0 + 16 w .. +15 (q fragments in registers); per key tile K is staged
 * row-major and V transposed in shared memory; S = Q K^T and O += P V on mma.sync.
 * grid (ceil(sq / ATT_FBQ), b, A), block 128, dynamic shared memory 0.
 * lse must not be NULL (the launcher passes scratch when the plan does not keep it). */
extern "C" __global__ void __launch_bounds__(ATT_NT, 2)
    MGC_ENTRY_NAME(mgc_t *__restrict__ out, float *__restrict__ lse, const mgc_t *__restrict__ q,
                   const mgc_t *__restrict__ k, const mgc_t *__restrict__ v, int sq, int sk, int b,
                   int A, int G, float scale, float drop_p, unsigned drop_thr, float drop_scale,
                   unsigned long long seed, unsigned long long stream, unsigned long long elem0,
                   const int *__restrict__ qpos, const int *__restrict__ kpos, int pos_s,
                   int pos_cp, int pos_rank, int k_gathered) {
    constexpr int BQ = ATT_FBQ, BK = ATT_FBK, NT = BK / 8, KS = ATT_D / 16, DT = ATT_D / 8,
                  PK = BK / 16;
    __shared__ __align__(16) unsigned short Ks[BK][ATT_D + 8];
    __shared__ __align__(16) unsigned short Vt[ATT_D][BK + 8];
    __shared__ float red[32];
    const int tid = threadIdx.x, w = tid >> 5, lane = tid & 31, grp = lane >> 2, tig = lane & 3;
    const int q0 = blockIdx.x * BQ, bi = blockIdx.y, a = blockIdx.z, g = a / (A / G);
    const float sl2 = scale * ATT_LOG2E;
    const int r[2] = {q0 + 16 * w + grp, q0 + 16 * w + grp + 8};

    unsigned qf[KS][4];
    int qp[2];
#pragma unroll
    for (int h = 0; h < 2; h++) {
        bool ok = r[h] < sq;
        const unsigned *row =
            (const unsigned *)(q + (((i64)(ok ? r[h] : 0) * b + bi) * A + a) * ATT_D);
#pragma unroll
        for (int ks = 0; ks < KS; ks++) {
            qf[ks][h] = ok ? row[8 * ks + tig] : 0u;
            qf[ks][h + 2] = ok ? row[8 * ks + tig + 4] : 0u;
        }
        qp[h] = ok ? att_qpos(qpos, r[h], pos_s, pos_cp, pos_rank) : -2147483647 - 1;
    }
    int qmax = 0;
    if (MGC_CAUSAL) {
        int i = q0 + tid;
        int ok = tid < BQ && i < sq;
        qmax = att_block_max_int(ok ? att_qpos(qpos, i, pos_s, pos_cp, pos_rank) : 0, ok, red);
    }
    float o[DT][4], mrow[2], lrow[2];
#pragma unroll
    for (int dt = 0; dt < DT; dt++) o[dt][0] = o[dt][1] = o[dt][2] = o[dt][3] = 0.0f;
    mrow[0] = mrow[1] = att_ninf();
    lrow[0] = lrow[1] = 0.0f;

    for (int k0 = 0; k0 < sk; k0 += BK) {
        if (MGC_CAUSAL) { /* skip a key tile no query of the tile sees */
            int j = k0 + tid;
            int vis = tid < BK && j < sk &&
                      att_kpos(kpos, j, sk, pos_s, pos_cp, pos_rank, k_gathered) <= qmax;
            if (!__syncthreads_or(vis)) continue;
        }
        /* 16-byte loads (rows are 16-byte aligned: the arena is 256-aligned, D >= 16) */
        for (int idx = tid; idx < BK * (ATT_D / 8); idx += ATT_NT) {
            int rr = idx / (ATT_D / 8), c8 = idx % (ATT_D / 8), j = k0 + rr;
            uint4 x = make_uint4(0u, 0u, 0u, 0u);
            if (j < sk) x = ((const uint4 *)(k + (((i64)j * b + bi) * G + g) * ATT_D))[c8];
            *(uint4 *)&Ks[rr][8 * c8] = x;
        }
        for (int idx = tid; idx < BK * (ATT_D / 8); idx += ATT_NT) {
            int rr = idx % BK, c8 = idx / BK, j = k0 + rr; /* lanes along keys: no conflicts */
            uint4 x = make_uint4(0u, 0u, 0u, 0u);
            if (j < sk) x = ((const uint4 *)(v + (((i64)j * b + bi) * G + g) * ATT_D))[c8];
            unsigned u[4] = {x.x, x.y, x.z, x.w};
#pragma unroll
            for (int e = 0; e < 4; e++) {
                Vt[8 * c8 + 2 * e][rr] = (unsigned short)(u[e] & 0xffffu);
                Vt[8 * c8 + 2 * e + 1][rr] = (unsigned short)(u[e] >> 16);
            }
        }
        __syncthreads();
        float s[NT][4];
#pragma unroll
        for (int nt = 0; nt < NT; nt++) {
            s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.0f;
#pragma unroll
            for (int ks = 0; ks < KS; ks++) {
                unsigned b0 = *(const unsigned *)&Ks[nt * 8 + grp][16 * ks + 2 * tig];
                unsigned b1 = *(const unsigned *)&Ks[nt * 8 + grp][16 * ks + 2 * tig + 8];
                att_mma(s[nt], qf[ks], b0, b1);
            }
        }
        float mx[2] = {att_ninf(), att_ninf()};
#pragma unroll
        for (int nt = 0; nt < NT; nt++)
#pragma unroll
            for (int e = 0; e < 2; e++) {
                int j = k0 + nt * 8 + 2 * tig + e;
                int kpj = 0;
                if (MGC_CAUSAL && j < sk)
                    kpj = att_kpos(kpos, j, sk, pos_s, pos_cp, pos_rank, k_gathered);
#pragma unroll
                for (int h = 0; h < 2; h++) {
                    bool visible = j < sk && (!MGC_CAUSAL || kpj <= qp[h]);
                    float x = visible ? s[nt][2 * h + e] * sl2 : att_ninf();
                    s[nt][2 * h + e] = x;
                    mx[h] = fmaxf(mx[h], x);
                }
            }
        float alpha[2];
#pragma unroll
        for (int h = 0; h < 2; h++) {
            mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 1));
            mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 2));
            float mnew = fmaxf(mrow[h], mx[h]), sum = 0.0f;
            alpha[h] = 1.0f;
            if (mnew != att_ninf()) {
                alpha[h] = exp2f(mrow[h] - mnew); /* 0 when mrow is -inf */
#pragma unroll
                for (int nt = 0; nt < NT; nt++)
#pragma unroll
                    for (int e = 0; e < 2; e++) {
                        float x = s[nt][2 * h + e];
                        float p = x == att_ninf() ? 0.0f : exp2f(x - mnew);
                        sum += p;
                        if (drop_p > 0.0f && p != 0.0f)
                            p *= att_keep(drop_p, drop_thr, drop_scale, seed, stream, elem0, bi, a,
                                          r[h], k0 + nt * 8 + 2 * tig + e, A, sq, sk);
                        s[nt][2 * h + e] = p;
                    }
            } else {
#pragma unroll
                for (int nt = 0; nt < NT; nt++) s[nt][2 * h] = s[nt][2 * h + 1] = 0.0f;
            }
            sum += __shfl_xor_sync(0xffffffffu, sum, 1);
            sum += __shfl_xor_sync(0xffffffffu, sum, 2);
            mrow[h] = mnew;
            lrow[h] = lrow[h] * alpha[h] + sum;
        }
#pragma unroll
        for (int dt = 0; dt < DT; dt++) {
            o[dt][0] *= alpha[0];
            o[dt][1] *= alpha[0];
            o[dt][2] *= alpha[1];
            o[dt][3] *= alpha[1];
        }
#pragma unroll
        for (int pk = 0; pk < PK; pk++) {
            unsigned pa[4] = {att_pack(s[2 * pk][0], s[2 * pk][1]),
                              att_pack(s[2 * pk][2], s[2 * pk][3]),
                              att_pack(s[2 * pk + 1][0], s[2 * pk + 1][1]),
                              att_pack(s[2 * pk + 1][2], s[2 * pk + 1][3])};
#pragma unroll
            for (int dt = 0; dt < DT; dt++) {
                unsigned b0 = *(const unsigned *)&Vt[dt * 8 + grp][16 * pk + 2 * tig];
                unsigned b1 = *(const unsigned *)&Vt[dt * 8 + grp][16 * pk + 2 * tig + 8];
                att_mma(o[dt], pa, b0, b1);
            }
        }
        __syncthreads(); /* before the next tile overwrites Ks and Vt */
    }

#pragma unroll
    for (int h = 0; h < 2; h++) {
        if (r[h] >= sq) continue;
        bool none = lrow[h] == 0.0f;
        float inv = none ? 0.0f : 1.0f / lrow[h];
        i64 rowi = ((i64)r[h] * b + bi) * A + a;
        unsigned *orow = (unsigned *)(out + rowi * ATT_D);
#pragma unroll
        for (int dt = 0; dt < DT; dt++)
            orow[4 * dt + tig] = att_pack(o[dt][2 * h] * inv, o[dt][2 * h + 1] * inv);
        if (tig == 0) lse[rowi] = none ? att_ninf() : (mrow[h] + __log2f(lrow[h])) * ATT_LN2;
    }
}
#endif

#if defined(MGC_ENTRY_attention_bwd_dot)
/* attention_bwd_dot: dsum[i,bi,a] = sum_c dout * out over the head dim (fixed order: lane
 * partial sums, then a warp butterfly).  One warp per (i, bi, a) row of n = sq*b*A rows.
 * grid (ceil(n / 8)), block 256, dynamic shared memory 0. */
extern "C" __global__ void __launch_bounds__(256)
    MGC_ENTRY_NAME(float *__restrict__ dsum, const mgc_t *__restrict__ dout,
                   const mgc_t *__restrict__ out, i64 n) {
    i64 row = (i64)blockIdx.x * 8 + (threadIdx.x >> 5);
    int lane = threadIdx.x & 31;
    if (row >= n) return;
    const mgc_t *x = dout + row * ATT_D, *y = out + row * ATT_D;
    float s = 0.0f;
    for (int c = lane; c < ATT_D; c += 32) s = fmaf(mgc_ld(x[c]), mgc_ld(y[c]), s);
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
    if (lane == 0) dsum[row] = s;
}
#endif

#if defined(MGC_ENTRY_attention_bwd_dkv)
/* attention_bwd_dkv: dk, dv of ATT_BR keys of kv head g for batch row bi, summed over the
 * group's query heads a = g*(A/G) .. in order and over query tiles of ATT_BC rows in order:
 *   P = exp(scale q k^T - lse) (0 where invisible or lse = -inf), Z = dropout multiplier,
 *   dV += (P Z)^T dO,  dS = P (Z (dO v^T) - dsum) scale,  dK += dS^T q.
 * grid (ceil(sk / ATT_BR), b, G), block 128, dynamic shared memory 0. */
extern "C" __global__ void __launch_bounds__(ATT_NT, 2)
    MGC_ENTRY_NAME(mgc_t *__restrict__ dk, mgc_t *__restrict__ dv, const mgc_t *__restrict__ q,
                   const mgc_t *__restrict__ k, const mgc_t *__restrict__ v,
                   const mgc_t *__restrict__ dout, const float *__restrict__ lse,
                   const float *__restrict__ dsum, int sq, int sk, int b, int A, int G,
                   float scale, float drop_p, unsigned drop_thr, float drop_scale,
                   unsigned long long seed, unsigned long long stream, unsigned long long elem0,
                   const int *__restrict__ qpos, const int *__restrict__ kpos, int pos_s,
                   int pos_cp, int pos_rank, int k_gathered) {
    constexpr int BR = ATT_BR, BC = ATT_BC, RM = BR / 8, RN = BC / 16;
    __shared__ float Ks[BR][ATT_D + 1];
    __shared__ float Vs[BR][ATT_D + 1];
    __shared__ float Qs[BC][ATT_D + 1];
    __shared__ float dOs[BC][ATT_D + 1];
    __shared__ float PTs[BR][BC + 1];  /* (P Z)^T */
    __shared__ float dSTs[BR][BC + 1]; /* dS^T */
    __shared__ float lses[BC], dsums[BC];
    __shared__ float red[32];
    const int tid = threadIdx.x, ty = tid >> 4, tx = tid & 15;
    const int k0 = blockIdx.x * BR, bi = blockIdx.y, g = blockIdx.z, per = A / G;
    const float sl2 = scale * ATT_LOG2E;

    att_load_tile<BR>(Ks, k, k0, sk, b, G, bi, g);
    att_load_tile<BR>(Vs, v, k0, sk, b, G, bi, g);
    int kp[RM];
#pragma unroll
    for (int m = 0; m < RM; m++) {
        int j = k0 + ty + 8 * m;
        kp[m] = j < sk ? att_kpos(kpos, j, sk, pos_s, pos_cp, pos_rank, k_gathered) : 2147483647;
    }
    int kmin = 0;
    if (MGC_CAUSAL) {
        int j = k0 + tid;
        int ok = tid < BR && j < sk;
        kmin = -att_block_max_int(
            ok ? -att_kpos(kpos, j, sk, pos_s, pos_cp, pos_rank, k_gathered) : 0, ok, red);
    }
    float dka[RM][ATT_DC], dva[RM][ATT_DC];
#pragma unroll
    for (int m = 0; m < RM; m++)
#pragma unroll
        for (int c = 0; c < ATT_DC; c++) dka[m][c] = dva[m][c] = 0.0f;

    for (int a = g * per; a < (g + 1) * per; a++) {
        for (int q0 = 0; q0 < sq; q0 += BC) {
            if (MGC_CAUSAL) { /* skip a query tile that sees no key of the tile */
                int i = q0 + tid;
                int vis = tid < BC && i < sq && att_qpos(qpos, i, pos_s, pos_cp, pos_rank) >= kmin;
                if (!__syncthreads_or(vis)) continue;
            }
            att_load_tile<BC>(Qs, q, q0, sq, b, A, bi, a);
            att_load_tile<BC>(dOs, dout, q0, sq, b, A, bi, a);
            if (tid < BC) {
                int i = q0 + tid;
                i64 r = ((i64)i * b + bi) * A + a;
                lses[tid] = i < sq ? lse[r] * ATT_LOG2E : att_ninf();
                dsums[tid] = i < sq ? dsum[r] : 0.0f;
            }
            __syncthreads();
            float s[RM][RN], dp[RM][RN];
#pragma unroll
            for (int m = 0; m < RM; m++)
#pragma unroll
                for (int n = 0; n < RN; n++) s[m][n] = dp[m][n] = 0.0f;
#pragma unroll 4
            for (int c = 0; c < ATT_D; c++) {
                float ka[RM], va[RM], qb[RN], ob[RN];
#pragma unroll
                for (int m = 0; m < RM; m++) {
                    ka[m] = Ks[ty + 8 * m][c];
                    va[m] = Vs[ty + 8 * m][c];
                }
#pragma unroll
                for (int n = 0; n < RN; n++) {
                    qb[n] = Qs[tx + 16 * n][c];
                    ob[n] = dOs[tx + 16 * n][c];
                }
#pragma unroll
                for (int m = 0; m < RM; m++)
#pragma unroll
                    for (int n = 0; n < RN; n++) {
                        s[m][n] = fmaf(ka[m], qb[n], s[m][n]);
                        dp[m][n] = fmaf(va[m], ob[n], dp[m][n]);
                    }
            }
#pragma unroll
            for (int n = 0; n < RN; n++) {
                int ql = tx + 16 * n, i = q0 + ql;
                float l2 = lses[ql], D = dsums[ql];
                int qpi = 0;
                if (MGC_CAUSAL && i < sq) qpi = att_qpos(qpos, i, pos_s, pos_cp, pos_rank);
#pragma unroll
                for (int m = 0; m < RM; m++) {
                    int j = k0 + ty + 8 * m;
                    bool visible = i < sq && j < sk && l2 != att_ninf() &&
                                   (!MGC_CAUSAL || kp[m] <= qpi);
                    float p = visible ? exp2f(s[m][n] * sl2 - l2) : 0.0f;
                    float z = 1.0f;
                    if (drop_p > 0.0f && visible)
                        z = att_keep(drop_p, drop_thr, drop_scale, seed, stream, elem0, bi, a, i,
                                     j, A, sq, sk);
                    dSTs[ty + 8 * m][ql] = p * (dp[m][n] * z - D) * scale;
                    PTs[ty + 8 * m][ql] = p * z;
                }
            }
            __syncthreads();
#pragma unroll 4
            for (int qq = 0; qq < BC; qq++) {
                float ob[ATT_DC], qb[ATT_DC];
#pragma unroll
                for (int c = 0; c < ATT_DC; c++) {
                    ob[c] = dOs[qq][tx + 16 * c];
                    qb[c] = Qs[qq][tx + 16 * c];
                }
#pragma unroll
                for (int m = 0; m < RM; m++) {
                    float pt = PTs[ty + 8 * m][qq], st = dSTs[ty + 8 * m][qq];
#pragma unroll
                    for (int c = 0; c < ATT_DC; c++) {
                        dva[m][c] = fmaf(pt, ob[c], dva[m][c]);
                        dka[m][c] = fmaf(st, qb[c], dka[m][c]);
                    }
                }
            }
            __syncthreads(); /* before the next tile overwrites the shared tiles */
        }
    }

#pragma unroll
    for (int m = 0; m < RM; m++) {
        int j = k0 + ty + 8 * m;
        if (j >= sk) continue;
        i64 base = (((i64)j * b + bi) * G + g) * ATT_D;
#pragma unroll
        for (int c = 0; c < ATT_DC; c++) {
            dk[base + tx + 16 * c] = mgc_st(dka[m][c]);
            dv[base + tx + 16 * c] = mgc_st(dva[m][c]);
        }
    }
}
#endif

#if defined(MGC_ENTRY_attention_bwd_dq)
/* attention_bwd_dq: dq of ATT_BR query rows of head a for batch row bi, over key tiles of
 * ATT_BC rows in order: dS = P (Z (dO v^T) - dsum) scale, dQ += dS k.
 * grid (ceil(sq / ATT_BR), b, A), block 128, dynamic shared memory 0. */
extern "C" __global__ void __launch_bounds__(ATT_NT, 2)
    MGC_ENTRY_NAME(mgc_t *__restrict__ dq, const mgc_t *__restrict__ q,
                   const mgc_t *__restrict__ k, const mgc_t *__restrict__ v,
                   const mgc_t *__restrict__ dout, const float *__restrict__ lse,
                   const float *__restrict__ dsum, int sq, int sk, int b, int A, int G,
                   float scale, float drop_p, unsigned drop_thr, float drop_scale,
                   unsigned long long seed, unsigned long long stream, unsigned long long elem0,
                   const int *__restrict__ qpos, const int *__restrict__ kpos, int pos_s,
                   int pos_cp, int pos_rank, int k_gathered) {
    constexpr int BR = ATT_BR, BC = ATT_BC, RM = BR / 8, RN = BC / 16;
    __shared__ float Qs[BR][ATT_D + 1];
    __shared__ float dOs[BR][ATT_D + 1];
    __shared__ float Ks[BC][ATT_D + 1];
    __shared__ float Vs[BC][ATT_D + 1];
    __shared__ float dSs[BR][BC + 1];
    __shared__ float red[32];
    const int tid = threadIdx.x, ty = tid >> 4, tx = tid & 15;
    const int q0 = blockIdx.x * BR, bi = blockIdx.y, a = blockIdx.z, g = a / (A / G);
    const float sl2 = scale * ATT_LOG2E;

    att_load_tile<BR>(Qs, q, q0, sq, b, A, bi, a);
    att_load_tile<BR>(dOs, dout, q0, sq, b, A, bi, a);
    int qp[RM];
    float l2[RM], Dm[RM];
#pragma unroll
    for (int m = 0; m < RM; m++) {
        int i = q0 + ty + 8 * m;
        i64 r = ((i64)i * b + bi) * A + a;
        qp[m] = i < sq ? att_qpos(qpos, i, pos_s, pos_cp, pos_rank) : -2147483647 - 1;
        l2[m] = i < sq ? lse[r] * ATT_LOG2E : att_ninf();
        Dm[m] = i < sq ? dsum[r] : 0.0f;
    }
    int qmax = 0;
    if (MGC_CAUSAL) {
        int i = q0 + tid;
        int ok = tid < BR && i < sq;
        qmax = att_block_max_int(ok ? att_qpos(qpos, i, pos_s, pos_cp, pos_rank) : 0, ok, red);
    }
    float dqa[RM][ATT_DC];
#pragma unroll
    for (int m = 0; m < RM; m++)
#pragma unroll
        for (int c = 0; c < ATT_DC; c++) dqa[m][c] = 0.0f;
    __syncthreads();

    for (int k0 = 0; k0 < sk; k0 += BC) {
        if (MGC_CAUSAL) {
            int j = k0 + tid;
            int vis = tid < BC && j < sk &&
                      att_kpos(kpos, j, sk, pos_s, pos_cp, pos_rank, k_gathered) <= qmax;
            if (!__syncthreads_or(vis)) continue;
        }
        att_load_tile<BC>(Ks, k, k0, sk, b, G, bi, g);
        att_load_tile<BC>(Vs, v, k0, sk, b, G, bi, g);
        __syncthreads();
        float s[RM][RN], dp[RM][RN];
#pragma unroll
        for (int m = 0; m < RM; m++)
#pragma unroll
            for (int n = 0; n < RN; n++) s[m][n] = dp[m][n] = 0.0f;
#pragma unroll 4
        for (int c = 0; c < ATT_D; c++) {
            float qa[RM], oa[RM], kb[RN], vb[RN];
#pragma unroll
            for (int m = 0; m < RM; m++) {
                qa[m] = Qs[ty + 8 * m][c];
                oa[m] = dOs[ty + 8 * m][c];
            }
#pragma unroll
            for (int n = 0; n < RN; n++) {
                kb[n] = Ks[tx + 16 * n][c];
                vb[n] = Vs[tx + 16 * n][c];
            }
#pragma unroll
            for (int m = 0; m < RM; m++)
#pragma unroll
                for (int n = 0; n < RN; n++) {
                    s[m][n] = fmaf(qa[m], kb[n], s[m][n]);
                    dp[m][n] = fmaf(oa[m], vb[n], dp[m][n]);
                }
        }
#pragma unroll
        for (int n = 0; n < RN; n++) {
            int kl = tx + 16 * n, j = k0 + kl;
            int kpj = 0;
            if (MGC_CAUSAL && j < sk) kpj = att_kpos(kpos, j, sk, pos_s, pos_cp, pos_rank, k_gathered);
#pragma unroll
            for (int m = 0; m < RM; m++) {
                int i = q0 + ty + 8 * m;
                bool visible = i < sq && j < sk && l2[m] != att_ninf() &&
                               (!MGC_CAUSAL || kpj <= qp[m]);
                float p = visible ? exp2f(s[m][n] * sl2 - l2[m]) : 0.0f;
                float z = 1.0f;
                if (drop_p > 0.0f && visible)
                    z = att_keep(drop_p, drop_thr, drop_scale, seed, stream, elem0, bi, a, i, j,
                                 A, sq, sk);
                dSs[ty + 8 * m][kl] = p * (dp[m][n] * z - Dm[m]) * scale;
            }
        }
        __syncthreads();
#pragma unroll 4
        for (int kk = 0; kk < BC; kk++) {
            float kb[ATT_DC];
#pragma unroll
            for (int c = 0; c < ATT_DC; c++) kb[c] = Ks[kk][tx + 16 * c];
#pragma unroll
            for (int m = 0; m < RM; m++) {
                float ds = dSs[ty + 8 * m][kk];
#pragma unroll
                for (int c = 0; c < ATT_DC; c++) dqa[m][c] = fmaf(ds, kb[c], dqa[m][c]);
            }
        }
        __syncthreads();
    }

#pragma unroll
    for (int m = 0; m < RM; m++) {
        int i = q0 + ty + 8 * m;
        if (i >= sq) continue;
        i64 base = (((i64)i * b + bi) * A + a) * ATT_D;
#pragma unroll
        for (int c = 0; c < ATT_DC; c++) dq[base + tx + 16 * c] = mgc_st(dqa[m][c]);
    }
}
#endif
