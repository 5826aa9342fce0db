/* embedding.cuh - word (+ learned position) embedding, forward and backward
 * (runtime/cpu_ops_tmpl.h mgc_cpu_embedding_fwd/bwd).
 *
 * Constants: H (hidden size), T (threads per block, multiple of 32, <= 1024); a thread owns
 * columns c = k*T + tid, k < ceil(H / T).  Tokens are int64 (s, b), rows r = i*b + j.
 * The vocabulary start v0 = tp_rank * V_l and the positions of a context-parallel shard
 * (mgc_ctx_pos(i, cp, cp_rank, seq / (2 cp))) are arguments: every rank shares the cubins.
 *
 * Entries:
 *   embedding_fwd       out[r] = wte[tok[r] - v0] (0 outside the shard) + wpe[pos(r)]
 *   embedding_bwd_pos   dwpe[pos(i)] += dy[i*b + j], j ascending; with documents
 *                       dwpe[p] += dy[r] for every row r with pos(r) = p, r ascending
 * Positions: pos(r) = mgc_ctx_pos(i) for row r = i*b + j, minus docs[r] (the row's document
 * start, data.reset_position_ids) when docs is not NULL.
 *   embedding_sort      keys = (tok[r] << 32 | r) sorted: each token's rows together, ascending
 *   embedding_bwd_sorted  the word gradient from the sorted keys, one block per segment of
 *                       S keys (MGC_KSPEC_EMB_SEG); embedding_bwd_join adds the pieces of the
 *                       runs that cross segments
 * The backward is deterministic without atomics: each gradient row is written by one block at
 * a time, adding its contributions in a fixed order (row index ascending) starting from the
 * row's current value.  A token whose run of sorted rows lies within one segment gets the CPU
 * reference's order and rounding exactly; a longer run is summed in pieces (the rows of each
 * segment from zero), which are then added in segment order, so that a frequent token (a byte
 * tokenizer's space, say: a fifth of the rows) no longer makes one block read its rows one
 * after another (0.58 ms of a GPT-2 124M step on the H100 before).
 * The launcher sorts the rows by token (a bitonic network: blocks of 2048 keys in shared
 * memory, the longer strides in global memory), and embedding_bwd_sorted walks the segments:
 * every row of dy is read once, whatever the microbatch (up to 2^30 tokens: int indices). */
/* NVRTC has no <math.h>: INFINITY (used by mgc_common.cuh's mgc_block_max) */
#ifndef INFINITY
#define INFINITY __int_as_float(0x7f800000)
#endif
#include "mgc_common.cuh"

#ifdef MGC_H /* embedding_sort has no H, T */
#define MGC_EPER ((MGC_H + MGC_T - 1) / MGC_T)
#endif

#if defined(MGC_ENTRY_embedding_fwd)
/* grid s*b (one block per output row), block T, smem 0.  wpe may be NULL (no learned
 * positions, or a tensor rank other than 0 when they are added on rank 0 only). */
extern "C" __global__ void __launch_bounds__(MGC_T, 1)
    MGC_ENTRY_NAME(mgc_t *__restrict__ out, const i64 *__restrict__ tok,
                   const mgc_t *__restrict__ wte, const mgc_t *__restrict__ wpe, i64 v0,
                   i64 V_l, i64 b, i64 cp, i64 cpr, i64 half_len, const int *__restrict__ docs) {
    i64 r = blockIdx.x, i = r / b;
    i64 id = tok[r] - v0;
    const mgc_t *wr = (id >= 0 && id < V_l) ? wte + id * (i64)MGC_H : (const mgc_t *)0;
    i64 p = mgc_ctx_pos(i, cp, cpr, half_len) - (docs ? docs[r] : 0);
    const mgc_t *pr = wpe ? wpe + p * (i64)MGC_H : (const mgc_t *)0;
    mgc_t *o = out + r * (i64)MGC_H;
#if MGC_H % 8 == 0
    /* whole 16-byte vectors of 8 columns (every row 16-byte aligned; the arena aligns the
     * tables), the same arithmetic per element */
    for (int c = 8 * threadIdx.x; c < MGC_H; c += 8 * MGC_T) {
        float v[8], w[8];
        if (wr) mgc_ld8(wr + c, v);
        else
#pragma unroll
            for (int j = 0; j < 8; j++) v[j] = 0.0f;
        if (pr) {
            mgc_ld8(pr + c, w);
#pragma unroll
            for (int j = 0; j < 8; j++) v[j] += w[j];
        }
        mgc_st8(o + c, v);
    }
    return;
#endif
#pragma unroll
    for (int k = 0; k < MGC_EPER; k++) {
        int c = k * MGC_T + threadIdx.x;
        if (c < MGC_H) {
            float v = wr ? mgc_ld(wr[c]) : 0.0f;
            if (pr) v += mgc_ld(pr[c]);
            o[c] = mgc_st(v);
        }
    }
}
#endif

#if defined(MGC_ENTRY_embedding_sort)
/* keys[0..N) sorted ascending, keys[i] = (tok[i] << 32 | i) for i < n and ~0 past n: rows with
 * the same token together, in ascending r (every key is distinct, so the order is total).
 * Tokens are vocabulary ids, below 2^32.  A bitonic network over N (a power of two >= n) keys,
 * its stages (k, j) split between launches (the launcher, cuda_ops_pointwise.c):
 *   mode 0: block b loads keys [b B, b B + B) (B = 2 blockDim.x, a power of two <= N; from tok)
 *           and runs every stage with k <= B on them in dynamic shared memory (B * 8 bytes);
 *   mode 1: stage (k, j), j >= B: one compare-exchange a thread, in global memory;
 *   mode 2: block b runs the stages (k, j < B) of one k on its B keys in shared memory.
 * Every thread compares one pair a stage; the direction of a pair is the whole network's
 * (ascending where the global index & k is 0), so the launches compute the one network. */
__device__ __forceinline__ void mgc_sort_pair(unsigned long long *__restrict__ a, int i, int j,
                                              long long gi, long long k) {
    int l = i + j;
    unsigned long long x = a[i], y = a[l];
    if ((gi & k) == 0 ? x > y : x < y) a[i] = y, a[l] = x;
}
extern "C" __global__ void __launch_bounds__(1024, 1)
    MGC_ENTRY_NAME(unsigned long long *__restrict__ keys, const i64 *__restrict__ tok, int n,
                   int N, int mode, int k, int j) {
    if (mode == 1) {
        long long p = (long long)blockIdx.x * blockDim.x + threadIdx.x;
        if (p >= N / 2) return;
        long long i = 2LL * j * (p / j) + p % j;
        mgc_sort_pair(keys, (int)i, j, i, k);
        return;
    }
    MGC_DYN_SHARED(unsigned long long, sk);
    const int h = (int)blockDim.x, B = 2 * h;
    const long long base = (long long)blockIdx.x * B;
    for (int i = threadIdx.x; i < B; i += h) {
        long long g = base + i;
        sk[i] = mode == 2 ? keys[g]
                : g < n   ? ((unsigned long long)(unsigned)tok[g] << 32) | (unsigned)g
                          : ~0ull;
    }
    __syncthreads();
    const int k0 = mode == 2 ? k : 2, k1 = mode == 2 ? k : B;
    for (int kk = k0; kk <= k1; kk <<= 1)
        for (int jj = (mode == 2 ? B : kk) >> 1; jj > 0; jj >>= 1) {
            int p = threadIdx.x, i = 2 * jj * (p / jj) + p % jj;
            mgc_sort_pair(sk, i, jj, base + i, kk);
            __syncthreads();
        }
    for (int i = threadIdx.x; i < B; i += h) keys[base + i] = sk[i];
}
#endif

#if defined(MGC_ENTRY_embedding_bwd_sorted) || defined(MGC_ENTRY_embedding_bwd_join)
/* rows (or partial rows) read ahead of their additions: U * EPER registers, within the 64 a
 * thread has at T = 1024 */
#define MGC_EMB_U (MGC_EPER <= 4 ? 8 : MGC_EPER <= 24 ? 24 / MGC_EPER : 1)
/* Token of sorted key j. */
__device__ __forceinline__ unsigned mgc_emb_tok(const unsigned long long *__restrict__ keys, i64 j) {
    return (unsigned)(keys[j] >> 32);
}
#endif

#if defined(MGC_ENTRY_embedding_bwd_sorted)
/* grid ceil(n / S) (one block per segment of S = MGC_KSPEC_EMB_SEG sorted keys), block T.
 * The segment's keys fall into pieces of one token each.  A piece that is its token's whole
 * run of rows adds them, r ascending, to the token's gradient row starting from the row's
 * value (the CPU's order and rounding).  A run that crosses segments: its first piece is
 * added to the gradient row the same way; the piece at the start of each later segment it
 * covers is summed from zero into part[g] (the segment's own row of partials), and
 * embedding_bwd_join adds those in segment order.  Rows are read U at a time ahead of the
 * additions (independent loads in flight; the order of the additions is unchanged).  dwte
 * (V_l, H) fp32, accumulated; tokens outside the shard [v0, v0 + V_l) are skipped. */
extern "C" __global__ void __launch_bounds__(MGC_T, 1)
    MGC_ENTRY_NAME(float *__restrict__ dwte, float *__restrict__ part, const mgc_t *__restrict__ dy,
                   const unsigned long long *__restrict__ keys, i64 v0, i64 V_l, i64 n, int S) {
    i64 g = blockIdx.x, j0 = g * S, j1 = j0 + S < n ? j0 + S : n;
    /* the token of the piece in progress, its gradient row (NULL: the head piece of a run
     * begun in an earlier segment, summed into part[g]; or a token outside the shard) */
    unsigned cur = mgc_emb_tok(keys, j0);
    bool head = j0 > 0 && mgc_emb_tok(keys, j0 - 1) == cur;
    float *dst = 0;
    float acc[MGC_EPER];
    if (head) {
        dst = part + g * (i64)MGC_H;
    } else {
        i64 v = (i64)cur - v0;
        dst = v >= 0 && v < V_l ? dwte + v * (i64)MGC_H : (float *)0;
    }
#pragma unroll
    for (int k = 0; k < MGC_EPER; k++) {
        int c = k * MGC_T + threadIdx.x;
        acc[k] = !head && dst && c < MGC_H ? dst[c] : 0.0f;
    }
    for (i64 j = j0; j < j1; j += MGC_EMB_U) {
        float x[MGC_EMB_U][MGC_EPER];
        unsigned tk[MGC_EMB_U];
#pragma unroll
        for (int u = 0; u < MGC_EMB_U; u++) {
            i64 q = j + u < j1 ? j + u : j1 - 1;
            unsigned long long key = keys[q];
            tk[u] = (unsigned)(key >> 32);
            const mgc_t *row = dy + (i64)(unsigned)key * MGC_H;
#pragma unroll
            for (int k = 0; k < MGC_EPER; k++) {
                int c = k * MGC_T + threadIdx.x;
                x[u][k] = c < MGC_H ? mgc_ld(row[c]) : 0.0f;
            }
        }
#pragma unroll
        for (int u = 0; u < MGC_EMB_U; u++) {
            if (j + u >= j1) break;
            if (tk[u] != cur) { /* the piece before ends here: a whole run, or a head piece */
#pragma unroll
                for (int k = 0; k < MGC_EPER; k++) {
                    int c = k * MGC_T + threadIdx.x;
                    if (dst && c < MGC_H) dst[c] = acc[k];
                }
                cur = tk[u];
                i64 v = (i64)cur - v0;
                dst = v >= 0 && v < V_l ? dwte + v * (i64)MGC_H : (float *)0;
#pragma unroll
                for (int k = 0; k < MGC_EPER; k++) {
                    int c = k * MGC_T + threadIdx.x;
                    acc[k] = dst && c < MGC_H ? dst[c] : 0.0f;
                }
            }
#pragma unroll
            for (int k = 0; k < MGC_EPER; k++)
                acc[k] += x[u][k];
        }
    }
#pragma unroll
    for (int k = 0; k < MGC_EPER; k++) {
        int c = k * MGC_T + threadIdx.x;
        if (dst && c < MGC_H) dst[c] = acc[k];
    }
}
#endif

#if defined(MGC_ENTRY_embedding_bwd_join)
/* grid ceil(n / S), block T: after embedding_bwd_sorted.  Block g owns the run whose first
 * piece ends segment g and goes on into segment g + 1 (when there is one): it adds part[g + 1],
 * part[g + 2], ... (each the run's piece in that segment), in segment order, to the token's
 * gradient row, up to the segment where the run ends.  U partial rows are read ahead. */
extern "C" __global__ void __launch_bounds__(MGC_T, 1)
    MGC_ENTRY_NAME(float *__restrict__ dwte, const float *__restrict__ part,
                   const unsigned long long *__restrict__ keys, i64 v0, i64 V_l, i64 n, int S) {
    i64 G = (n + S - 1) / S, g = blockIdx.x, last = (g + 1) * S - 1;
    if (last + 1 >= n) return;
    unsigned t = mgc_emb_tok(keys, last);
    if (mgc_emb_tok(keys, last + 1) != t) return; /* the segment's last run ends in it */
    if (g > 0 && mgc_emb_tok(keys, g * S - 1) == t && mgc_emb_tok(keys, g * S) == t)
        return; /* the whole segment is the middle of a run begun earlier: not the owner */
    i64 v = (i64)t - v0;
    if (v < 0 || v >= V_l) return;
    /* the segments after g that the run reaches: g + 1 .. ge - 1, those whose first key is of
     * token t (a prefix: the keys are sorted; g + 1 is one).  T of them are tested at once,
     * one a thread: ge is the one segment that is not in the run while the segment before it
     * is (a scan one key at a time, each load waiting for the last, took 25 us of a GPT-2
     * 124M step for a token with a fifth of the rows). */
    __shared__ i64 ge_sh;
    for (i64 q0 = g + 1;; q0 += MGC_T) {
        const i64 q = q0 + threadIdx.x;
        const bool in = q < G && mgc_emb_tok(keys, q * S) == t;
        const bool end = !in && q - 1 < G && mgc_emb_tok(keys, (q - 1) * S) == t;
        if (end) ge_sh = q;
        if (__syncthreads_or(end)) break;
    }
    const i64 ge = ge_sh;
    float *d = dwte + v * (i64)MGC_H;
    float acc[MGC_EPER];
#pragma unroll
    for (int k = 0; k < MGC_EPER; k++) {
        int c = k * MGC_T + threadIdx.x;
        acc[k] = c < MGC_H ? d[c] : 0.0f;
    }
    for (i64 q = g + 1; q < ge; q += MGC_EMB_U) {
        float x[MGC_EMB_U][MGC_EPER];
#pragma unroll
        for (int u = 0; u < MGC_EMB_U; u++) {
            const float *p = part + (q + u < ge ? q + u : ge - 1) * (i64)MGC_H;
#pragma unroll
            for (int k = 0; k < MGC_EPER; k++) {
                int c = k * MGC_T + threadIdx.x;
                x[u][k] = c < MGC_H ? p[c] : 0.0f;
            }
        }
#pragma unroll
        for (int u = 0; u < MGC_EMB_U; u++)
            if (q + u < ge)
#pragma unroll
                for (int k = 0; k < MGC_EPER; k++)
                    acc[k] += x[u][k];
    }
#pragma unroll
    for (int k = 0; k < MGC_EPER; k++) {
        int c = k * MGC_T + threadIdx.x;
        if (c < MGC_H) d[c] = acc[k];
    }
}
#endif

#if defined(MGC_ENTRY_embedding_bwd_pos)
/* grid s (one block per sequence row, i.e. per distinct position), block T, smem 0.
 * dwpe (P, H) fp32, accumulated.  With documents (docs, (s, b)): grid npos, one block per
 * position p < npos, which adds the rows r = i*b + j with pos(r) = p in ascending order (the
 * CPU's order), scanning the s*b rows' positions. */
extern "C" __global__ void __launch_bounds__(MGC_T, 1)
    MGC_ENTRY_NAME(float *__restrict__ dwpe, const mgc_t *__restrict__ dy, i64 b, i64 cp,
                   i64 cpr, i64 half_len, const int *__restrict__ docs, i64 s) {
    if (docs) {
        i64 p = blockIdx.x;
        float *d = dwpe + p * (i64)MGC_H;
        float acc[MGC_EPER];
#pragma unroll
        for (int k = 0; k < MGC_EPER; k++) {
            int c = k * MGC_T + threadIdx.x;
            acc[k] = c < MGC_H ? d[c] : 0.0f;
        }
        for (i64 r = 0; r < s * b; r++) {
            if (mgc_ctx_pos(r / b, cp, cpr, half_len) - docs[r] != p) continue;
#pragma unroll
            for (int k = 0; k < MGC_EPER; k++) {
                int c = k * MGC_T + threadIdx.x;
                if (c < MGC_H) acc[k] += mgc_ld(dy[r * (i64)MGC_H + c]);
            }
        }
#pragma unroll
        for (int k = 0; k < MGC_EPER; k++) {
            int c = k * MGC_T + threadIdx.x;
            if (c < MGC_H) d[c] = acc[k];
        }
        return;
    }
    i64 i = blockIdx.x;
    float *d = dwpe + mgc_ctx_pos(i, cp, cpr, half_len) * (i64)MGC_H;
#pragma unroll
    for (int k = 0; k < MGC_EPER; k++) {
        int c = k * MGC_T + threadIdx.x;
        if (c < MGC_H) {
            float acc = d[c];
            for (i64 j = 0; j < b; j++)
                acc += mgc_ld(dy[(i * b + j) * (i64)MGC_H + c]);
            d[c] = acc;
        }
    }
}
#endif
