/* embedding.cuh - word (+ learned position) embedding, forward and backward
 * (runtime/cpu_ops_tmpl.h mgc_cpu_embedding_fwd/bwd).
 *
 * Constants: H (hidden size), T (threads per block, multiple of 32, <= 1024); a thread owns
 * columns c = k*T + tid, k < ceil(H / T); R (embedding_fwd: rows a block).  Tokens are int64
 * (s, b), rows r = i*b + j.
 * The vocabulary start v0 = tp_rank * V_l and the positions of a context-parallel shard
 * (mgc_ctx_pos(i, cp, cp_rank, seq / (2 cp))) are arguments: every rank shares the cubins.
 *
 * Entries:
 *   embedding_fwd       out[r] = wte[tok[r] - v0] (0 outside the shard) + wpe[pos(r)]
 *   embedding_bwd_join, its position blocks (constant POS)   dwpe[pos(i)] += dy[i*b + j], j
 *                       ascending (without documents; with them the rows are sorted by
 *                       position and added as the word rows are, r ascending)
 * Positions: pos(r) = mgc_ctx_pos(i) for row r = i*b + j, minus docs[r] (the row's document
 * start, data.reset_position_ids) when docs is not NULL.
 *   embedding_sort      keys = (v << 32 | r) sorted, v = tok[r] - v0 (V_l outside the shard):
 *                       each token's rows together, ascending (a radix sort over tiles)
 *   embedding_sort_block  the same keys from one block, where they fit (up to 8,192 rows)
 *   embedding_bwd_sorted  the word gradient from the sorted keys, one block per segment of
 *                       S keys (MGC_KSPEC_EMB_SEG); embedding_bwd_join adds the pieces of the
 *                       runs that cross segments, in the same launch as the position blocks
 * The backward is deterministic without atomics: each gradient row is written by one block at
 * a time, adding its contributions in a fixed order (row index ascending) starting from the
 * row's current value.  A token whose run of sorted rows lies within one segment gets the CPU
 * reference's order and rounding exactly; a longer run is summed in pieces (the rows of each
 * segment from zero), which are then added in segment order, so that a frequent token (a byte
 * tokenizer's space, say: a fifth of the rows) no longer makes one block read its rows one
 * after another (0.58 ms of a GPT-2 124M step on the H100 before).
 * The launcher sorts the rows by token (a stable radix sort, 8 bits of the id a pass: in one
 * launch where the rows and ids fit, else over tiles, two launches a pass, four for a
 * vocabulary shard of up to 65,535 ids), and embedding_bwd_sorted walks the
 * segments: every row of dy in the shard is read once, whatever the microbatch (up to 2^30
 * tokens: int indices). */
/* NVRTC has no <math.h>: INFINITY (used by mgc_common.cuh's mgc_block_max) */
#ifndef INFINITY
#define INFINITY __int_as_float(0x7f800000)
#endif
#include "mgc_common.cuh"

#ifdef MGC_H /* embedding_sort has no H, T */
#define MGC_EPER ((MGC_H + MGC_T - 1) / MGC_T)
#endif

#if defined(MGC_ENTRY_embedding_fwd)
/* The word row (NULL outside the shard) and the position row (NULL without) of row r. */
__device__ __forceinline__ void emb_rows(const i64 *__restrict__ tok, const mgc_t *__restrict__ wte,
                                         const mgc_t *__restrict__ wpe, i64 v0, i64 V_l, i64 b,
                                         i64 cp, i64 cpr, i64 half_len, const int *__restrict__ docs,
                                         i64 r, const mgc_t *&wr, const mgc_t *&pr) {
    const i64 id = tok[r] - v0;
    wr = (id >= 0 && id < V_l) ? wte + id * (i64)MGC_H : (const mgc_t *)0;
    const i64 p = mgc_ctx_pos(r / b, cp, cpr, half_len) - (docs ? docs[r] : 0);
    pr = wpe ? wpe + p * (i64)MGC_H : (const mgc_t *)0;
}
/* grid ceil(n / MGC_R) (rows r0 = MGC_R blockIdx.x .. +MGC_R-1 of the n = s*b), block T, smem
 * 0.  wpe may be NULL (no learned positions, or a tensor rank other than 0 when they are added
 * on rank 0 only).  Where H % 8 == 0 the block's R rows are R H/8 vectors of 8 columns, K a
 * thread (vector x + k T), whose loads are all issued before the first store: a row is 1.5 KB
 * at H 768, so one row a block (as before) kept too few bytes in flight. */
extern "C" __global__ void __launch_bounds__(MGC_T, 1)
    MGC_ENTRY_NAME(mgc_t *__restrict__ out, const i64 *__restrict__ tok,
                   const mgc_t *__restrict__ wte, const mgc_t *__restrict__ wpe, i64 v0,
                   i64 V_l, i64 b, i64 cp, i64 cpr, i64 half_len, const int *__restrict__ docs,
                   i64 n) {
    mgc_pdl_begin();
    const i64 r0 = (i64)blockIdx.x * MGC_R;
#if MGC_H % 8 == 0
    /* every row 16-byte aligned (the arena aligns the tables); the same arithmetic per element.
     * The block's rows' table rows first (thread d < R: row r0 + d; -1: none), so that the
     * token loads and the position arithmetic happen once a row */
    constexpr int NV = MGC_H / 8, K = (MGC_R * NV + MGC_T - 1) / MGC_T;
    __shared__ i64 wofs[MGC_R], pofs[MGC_R];
    if (threadIdx.x < MGC_R) {
        const i64 r = r0 + threadIdx.x;
        const mgc_t *wr = 0, *pr = 0;
        if (r < n) emb_rows(tok, wte, wpe, v0, V_l, b, cp, cpr, half_len, docs, r, wr, pr);
        wofs[threadIdx.x] = wr ? (i64)(wr - wte) : -1;
        pofs[threadIdx.x] = pr ? (i64)(pr - wpe) : -1;
    }
    __syncthreads();
    mgc_raw8 wv[K], pv[K];
#pragma unroll
    for (int k = 0; k < K; k++) {
        const int it = (int)threadIdx.x + k * MGC_T, d = it / NV, c = 8 * (it % NV);
        if ((K * MGC_T == MGC_R * NV || it < MGC_R * NV) && r0 + d < n) {
            const i64 w = wofs[d], q = pofs[d];
            wv[k] = w >= 0 ? mgc_ldraw8(wte + w + c) : mgc_raw8_zero();
            if (q >= 0) pv[k] = mgc_ldraw8(wpe + q + c);
        }
    }
#pragma unroll
    for (int k = 0; k < K; k++) {
        const int it = (int)threadIdx.x + k * MGC_T, d = it / NV, c = 8 * (it % NV);
        if ((K * MGC_T == MGC_R * NV || it < MGC_R * NV) && r0 + d < n) {
            float v[8], w[8];
            mgc_unraw8(wv[k], v);
            if (pofs[d] >= 0) {
                mgc_unraw8(pv[k], w);
#pragma unroll
                for (int j = 0; j < 8; j++) v[j] += w[j];
            }
            mgc_st8(out + (r0 + d) * (i64)MGC_H + c, v);
        }
    }
#else
    for (int j = 0; j < MGC_R && r0 + j < n; j++) {
        const i64 r = r0 + j;
        const mgc_t *wr, *pr;
        emb_rows(tok, wte, wpe, v0, V_l, b, cp, cpr, half_len, docs, r, wr, pr);
        mgc_t *o = out + r * (i64)MGC_H;
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
}
#endif

#if defined(MGC_ENTRY_embedding_sort)
/* A stable least-significant-digit radix sort of the rows by token, 8 bits a pass: after it,
 * keys[0..n) = (v << 32 | r) ascending, v = tok[r] - v0 the row's id in the vocabulary shard,
 * or V_l for a token outside it (all of them one "token", which the backward skips): each
 * token's rows together, in ascending r.  The launcher (cuda_ops_pointwise.c) runs passes
 * p = 0 .. P-1 (P = bytes of V_l) over tiles of `per` chunks of 256 keys (at most
 * MGC_KSPEC_EMB_SORT_TILES tiles), each pass two launches of grid ntiles, block 256:
 *   mode 0: cnt[tile * 256 + d] = the tile's keys whose digit p is d;
 *   mode 1: each key to dst[the keys of smaller digits + those of its digit in earlier tiles
 *           + its stable rank in its tile] (mgc_block_rank, chunk by chunk).
 * src: the previous pass's output, NULL in the first pass (the keys made from tok).  No
 * atomics: the counts are per warp, added in warp, chunk and tile order.
 * tok NULL: the position gradient's sort under documents (data.reset_position_ids), v = the
 * row's position pos(r) (below: mgc_ctx_pos(r / b) - docs[r]), v0 = 0, V_l = the positions. */
typedef unsigned long long u64;
__device__ __forceinline__ u64 mgc_sort_key(const u64 *__restrict__ src,
                                            const i64 *__restrict__ tok, i64 v0, i64 V_l, i64 b,
                                            i64 cp, i64 cpr, i64 half_len,
                                            const int *__restrict__ docs, int e) {
    if (src) return src[e];
    const i64 v = tok ? tok[e] - v0 : mgc_ctx_pos(e / b, cp, cpr, half_len) - docs[e];
    return (u64)(v >= 0 && v < V_l ? v : V_l) << 32 | (unsigned)e;
}
extern "C" __global__ void __launch_bounds__(256)
    MGC_ENTRY_NAME(u64 *__restrict__ dst, const u64 *__restrict__ src, const i64 *__restrict__ tok,
                   int *__restrict__ cnt, i64 v0, i64 V_l, int n, int per, int shift, int mode,
                   i64 b, i64 cp, i64 cpr, i64 half_len, const int *__restrict__ docs) {
    mgc_pdl_begin();
    __shared__ int wc[8 * 256]; /* the warps' counts of each digit in the chunk */
    __shared__ int next[256];   /* mode 1: where the next key of each digit goes */
    __shared__ int wt[8];
    const int x = threadIdx.x, nt = gridDim.x, tl = blockIdx.x, w = x >> 5;
    int mine = 0; /* mode 0: the tile's keys of digit x */
    /* the key of this thread in chunk c (d = -1 past n), loaded one chunk ahead: chunk 0's
     * before the counts are read and scanned, chunk c + 1's before chunk c is ranked (each
     * load waited for memory on its own before: a round trip a launch and a chunk) */
    u64 key = 0;
    int d = -1;
    {
        const int e = tl * per * 256 + x;
        if (per > 0 && e < n) {
            key = mgc_sort_key(src, tok, v0, V_l, b, cp, cpr, half_len, docs, e);
            d = (int)(key >> (32 + shift)) & 255;
        }
    }
    if (mode == 1) {
        int tot = 0, pre = 0; /* digit x's keys: all of them; in the tiles before this one */
        for (int q = 0; q < nt; q++) {
            const int c = cnt[q * 256 + x];
            tot += c;
            pre += q < tl ? c : 0;
        }
        /* the keys of digits below x: a scan over the warp (lane l adds the lower half's sum
         * at each level where its bit is set), then the warps before this one */
        const int lane = x & 31;
        int inc = tot, all = tot;
#pragma unroll
        for (int o = 1; o < 32; o <<= 1) {
            const int other = __shfl_xor_sync(0xffffffffu, all, o);
            inc += lane & o ? other : 0;
            all += other;
        }
        if (lane == 0) wt[w] = all;
        __syncthreads();
        for (int q = 0; q < w; q++)
            inc += wt[q];
        next[x] = inc - tot + pre; /* read after mgc_block_rank's barriers */
    }
    for (int c = 0; c < per; c++) {
        u64 nkey = 0;
        int nd = -1;
        const int en = (tl * per + c + 1) * 256 + x;
        if (c + 1 < per && en < n) {
            nkey = mgc_sort_key(src, tok, v0, V_l, b, cp, cpr, half_len, docs, en);
            nd = (int)(nkey >> (32 + shift)) & 255;
        }
        int rank = mgc_block_rank(d, 256, wc);
        if (mode == 1 && d >= 0) {
            for (int q = 0; q < w; q++)
                rank += wc[q * 256 + d];
            dst[next[d] + rank] = key;
        }
        int s = 0;
#pragma unroll
        for (int q = 0; q < 8; q++)
            s += wc[q * 256 + x];
        __syncthreads(); /* wc and next read before they change */
        if (mode == 1)
            next[x] += s;
        else
            mine += s;
        key = nkey, d = nd;
    }
    if (mode == 0) cnt[tl * 256 + x] = mine;
}
#endif

#if defined(MGC_ENTRY_embedding_sort_block)
/* The same sort in one launch of one block, where the keys fit (codegen/kspec_pointwise.c
 * emb_block_sort: n <= MGC_K * MGC_T <= MGC_KSPEC_EMB_BSORT_MAX, and v < 2^(32 - RB), RB the
 * bits of a row index): the keys as 32 bits, v << RB | r, in shared memory, sorted by v a byte
 * a pass, least significant first.  Warp w holds the keys at 32 K w .. 32 K (w + 1) - 1, taken
 * 32 at a time (round k: lane l the key at 32 K w + 32 k + l), so that each pass is stable: a
 * key's rank among its digit's keys in its round comes from __match_any_sync, the warp's
 * earlier rounds from the warp's count of each digit (cnt[d][w], which the first lane of each
 * digit's keys advances), and the keys of smaller digits and of its digit in earlier warps from
 * an exclusive scan of cnt in that order (d major).  The keys finally written are the tiled
 * sort's (v << 32 | r), bit for bit: the order of distinct keys is unique.  The tiled sort takes
 * two launches a byte of v, each waiting on its loads (4 x 4.6 us for GPT-2's 8,192 rows on the
 * H100); this takes one.
 * grid 1, block MGC_T, dynamic shared memory: n keys, then 256 x MGC_T / 32 counts (words). */
typedef unsigned long long u64;
extern "C" __global__ void __launch_bounds__(MGC_T, 1)
    MGC_ENTRY_NAME(u64 *__restrict__ keys, const i64 *__restrict__ tok, i64 v0, i64 V_l, int n,
                   i64 b, i64 cp, i64 cpr, i64 half_len, const int *__restrict__ docs) {
    mgc_pdl_begin();
    constexpr int NW = MGC_T / 32, E = 256 * NW / MGC_T; /* E = 8 counts a thread in the scan */
    MGC_DYN_SHARED(unsigned, sk);
    unsigned *cnt = sk + n; /* cnt[d * NW + w] */
    __shared__ unsigned wt[NW];
    const int x = threadIdx.x, lane = x & 31, w = x >> 5;
    const unsigned lt = (1u << lane) - 1u;
    for (int e = x; e < n; e += MGC_T) { /* the keys in row order, read coalesced */
        const i64 v = tok ? tok[e] - v0 : mgc_ctx_pos(e / b, cp, cpr, half_len) - docs[e];
        sk[e] = (unsigned)(v >= 0 && v < V_l ? v : V_l) << MGC_RB | (unsigned)e;
    }
    int vb = 0; /* the bits of v: V_l the largest */
    for (i64 m = V_l; m; m >>= 1) vb++;
    for (int shift = MGC_RB; shift < MGC_RB + vb; shift += 8) {
#pragma unroll
        for (int j = 0; j < 256 / 32; j++) cnt[(lane + 32 * j) * NW + w] = 0u;
        __syncthreads(); /* the keys (the last pass's or the first) and the counts in place */
        unsigned key[MGC_K], rank[MGC_K];
#pragma unroll
        for (int k = 0; k < MGC_K; k++) {
            const int p = (w * MGC_K + k) * 32 + lane;
            const bool in = p < n;
            key[k] = in ? sk[p] : 0u;
            const unsigned d = (key[k] >> shift) & 255u;
            const unsigned peers = __match_any_sync(0xffffffffu, in ? d : 256u);
            const unsigned base = in ? cnt[d * NW + w] : 0u;
            __syncwarp();
            if (in && lane == __ffs(peers) - 1) cnt[d * NW + w] = base + __popc(peers);
            __syncwarp();
            rank[k] = base + __popc(peers & lt);
        }
        __syncthreads();
        /* cnt scanned (exclusive), d major: thread x's E consecutive counts, the warp, the warps */
        unsigned c[E], sum = 0;
#pragma unroll
        for (int i = 0; i < E; i++) c[i] = cnt[x * E + i], sum += c[i];
        unsigned inc = sum, all = sum;
#pragma unroll
        for (int o = 1; o < 32; o <<= 1) {
            const unsigned other = __shfl_xor_sync(0xffffffffu, all, o);
            inc += lane & o ? other : 0u;
            all += other;
        }
        if (lane == 0) wt[w] = all;
        __syncthreads();
        unsigned pre = lane < w ? wt[lane] : 0u; /* the warps before this one, summed */
#pragma unroll
        for (int o = 1; o < 32; o <<= 1) pre += __shfl_xor_sync(0xffffffffu, pre, o);
        pre += inc - sum;
#pragma unroll
        for (int i = 0; i < E; i++) cnt[x * E + i] = pre, pre += c[i];
        __syncthreads();
#pragma unroll
        for (int k = 0; k < MGC_K; k++) {
            const int p = (w * MGC_K + k) * 32 + lane;
            if (p < n) sk[cnt[((key[k] >> shift) & 255u) * NW + w] + rank[k]] = key[k];
        }
        __syncthreads(); /* the keys in place; wt and cnt read */
    }
    for (int e = x; e < n; e += MGC_T) {
        const unsigned u = sk[e];
        keys[e] = (u64)(u >> MGC_RB) << 32 | (u & ((1u << MGC_RB) - 1u));
    }
}
#endif

#if defined(MGC_ENTRY_embedding_bwd_join) || defined(MGC_ENTRY_embedding_bwd_sorted)
/* A value read ahead as fp32: partial sums (fp32), or rows of dy as stored (bits), which are
 * converted only here, where they are added.  A conversion beside its load makes the compiler
 * put the load in a branch with its first use, and the warp waits for the rows one at a time
 * (embedding_bwd_sorted: 21.8 of every 25.8 cycles waiting on a load, 32.7 us for the 8192
 * rows of GPT-2 124M on the H100; 10.8 us converted here). */
__device__ __forceinline__ float mgc_emb_f(float v) { return v; }
#if MGC_HALF
__device__ __forceinline__ float mgc_emb_f(mgc_t v) { return mgc_ld(v); }
#endif
#endif

#if defined(MGC_ENTRY_embedding_bwd_join)
/* acc += x[0], x[1], .. x[nv - 1] (nv <= U rows read ahead), in that order, column by column */
template <int U, typename E>
__device__ __forceinline__ void mgc_emb_add_rows(float (&acc)[MGC_EPER], const E (&x)[U][MGC_EPER],
                                                 i64 nv) {
#pragma unroll
    for (int u = 0; u < U; u++)
        if (u < nv)
#pragma unroll
            for (int k = 0; k < MGC_EPER; k++)
                acc[k] += mgc_emb_f(x[u][k]);
}
/* The thread's columns of an fp32 gradient row d = acc. */
__device__ __forceinline__ void mgc_emb_put_row(float *__restrict__ d, const float (&acc)[MGC_EPER]) {
#pragma unroll
    for (int k = 0; k < MGC_EPER; k++) {
        int c = k * MGC_T + threadIdx.x;
        if (c < MGC_H) d[c] = acc[k];
    }
}
#endif

#if defined(MGC_ENTRY_embedding_bwd_sorted) || defined(MGC_ENTRY_embedding_bwd_join)
/* rows (or partial rows) read ahead of their additions: U * EPER registers, within the 64 a
 * thread has at T = 1024 */
#define MGC_EMB_U (MGC_EPER <= 4 ? 8 : MGC_EPER <= 24 ? 24 / MGC_EPER : 1)
/* Token of sorted key j. */
__device__ __forceinline__ unsigned mgc_emb_tok(const unsigned long long *__restrict__ keys,
                                                i64 j) {
    return (unsigned)(keys[j] >> 32);
}
#endif

#if defined(MGC_ENTRY_embedding_bwd_sorted)
/* keys a batch: U rows of dy and U gradient rows (2 U EPER registers) and U keys (2 U) within
 * what a thread of a block of T may hold beside the rest (64 registers at T = 1024) */
#define MGC_EMB_SREGS (MGC_T <= 256 ? 160 : MGC_T <= 512 ? 80 : 44)
#define MGC_EMB_SU0 (MGC_EMB_SREGS / (2 * MGC_EPER + 2))
/* a power of two (3 rows of 5 vectors at H 5120 spilled 12 bytes on sm_80) */
#define MGC_EMB_SU (MGC_EMB_SU0 >= 8 ? 8 : MGC_EMB_SU0 >= 4 ? 4 : MGC_EMB_SU0 >= 2 ? 2 : 1)
/* grid ceil(n / S) (one block per segment of S = MGC_KSPEC_EMB_SEG sorted keys), block T.
 * The segment's keys fall into pieces of one token each.  A piece that is its token's whole
 * run of rows adds them, r ascending, to the token's gradient row starting from the row's
 * value (the CPU's order and rounding).  A run that crosses segments: its first piece is
 * added to the gradient row the same way; the piece at the start of each later segment it
 * covers is summed from zero into part[g] (the segment's own row of partials), and
 * embedding_bwd_join adds those in segment order.  dwte (V_l, H) fp32, accumulated; the
 * keys' ids are the shard's (V_l: a token outside it, skipped).
 * Keys are taken U (MGC_EMB_SU) at a time: a batch's rows of dy and the gradient rows of the runs that
 * begin in it are loaded together, and the next batch's keys with them, before the batch's
 * additions, so that a batch waits for memory once (a gradient row loaded when its run began,
 * one run after another, made the kernel wait about once a run: 37 us of a GPT-2 124M step
 * on the H200).  The additions keep their order; a run's gradient row is read before this
 * block writes it, and no other block writes it in this kernel. */
extern "C" __global__ void __launch_bounds__(MGC_T, 1)
    MGC_ENTRY_NAME(float *__restrict__ dwte, float *__restrict__ part, const mgc_t *__restrict__ dy,
                   const unsigned long long *__restrict__ keys, i64 V_l, i64 n, int S) {
    mgc_pdl_begin();
    i64 g = blockIdx.x, j0 = g * S, j1 = j0 + S < n ? j0 + S : n;
    /* the token of the piece in progress, its gradient row (NULL: the head piece of a run
     * begun in an earlier segment, summed into part[g]; or a token outside the shard) */
    unsigned cur = mgc_emb_tok(keys, j0);
    if (cur >= V_l) return; /* the rows outside the shard, sorted last: all the rest */
    bool head = j0 > 0 && mgc_emb_tok(keys, j0 - 1) == cur;
    float *dst = head ? part + g * (i64)MGC_H : dwte + (i64)cur * MGC_H;
    float acc[MGC_EPER];
    unsigned long long kb[MGC_EMB_SU]; /* the next batch's keys (the last key past j1) */
#pragma unroll
    for (int u = 0; u < MGC_EMB_SU; u++)
        kb[u] = keys[j0 + u < j1 ? j0 + u : j1 - 1];
#pragma unroll
    for (int k = 0; k < MGC_EPER; k++) {
        int c = k * MGC_T + threadIdx.x;
        acc[k] = !head && c < MGC_H ? dst[c] : 0.0f;
    }
    for (i64 j = j0; j < j1; j += MGC_EMB_SU) {
        mgc_t x[MGC_EMB_SU][MGC_EPER]; /* dy as stored: converted where added (mgc_emb_f) */
        float pre[MGC_EMB_SU][MGC_EPER];
        unsigned tk[MGC_EMB_SU];
#pragma unroll
        for (int u = 0; u < MGC_EMB_SU; u++) {
            tk[u] = (unsigned)(kb[u] >> 32);
            const mgc_t *row = dy + (i64)(unsigned)kb[u] * MGC_H;
            const bool in = tk[u] < V_l; /* else a row outside the shard: not read */
            /* a run that begins at this key: its gradient row, read now */
            const bool starts = in && j + u < j1 && tk[u] != (u ? tk[u - 1] : cur);
            const float *gr = dwte + (i64)tk[u] * MGC_H;
#pragma unroll
            for (int k = 0; k < MGC_EPER; k++) {
                int c = k * MGC_T + threadIdx.x;
                x[u][k] = in && c < MGC_H ? row[c] : (mgc_t)0;
                pre[u][k] = starts && c < MGC_H ? gr[c] : 0.0f;
            }
        }
        const i64 jn = j + MGC_EMB_SU;
        if (jn < j1)
#pragma unroll
            for (int u = 0; u < MGC_EMB_SU; u++)
                kb[u] = keys[jn + u < j1 ? jn + u : j1 - 1];
#pragma unroll
        for (int u = 0; u < MGC_EMB_SU; u++) {
            if (j + u >= j1) break;
            if (tk[u] != cur) { /* the piece before ends here: a whole run, or a head piece */
#pragma unroll
                for (int k = 0; k < MGC_EPER; k++) {
                    int c = k * MGC_T + threadIdx.x;
                    if (dst && c < MGC_H) dst[c] = acc[k];
                }
                cur = tk[u];
                dst = cur < V_l ? dwte + (i64)cur * MGC_H : (float *)0;
#pragma unroll
                for (int k = 0; k < MGC_EPER; k++)
                    acc[k] = pre[u][k]; /* 0 outside the shard */
            }
#pragma unroll
            for (int k = 0; k < MGC_EPER; k++)
                acc[k] += mgc_emb_f(x[u][k]);
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
#ifndef MGC_POS
#define MGC_POS 0 /* 1: the position gradient's blocks too (below) */
#endif
/* Join block g (after embedding_bwd_sorted): block g owns the run whose first piece ends
 * segment g and goes on into segment g + 1 (when there is one): it adds part[g + 1],
 * part[g + 2], ... (each the run's piece in that segment), in segment order, to the token's
 * gradient row, up to the segment where the run ends.  U partial rows are read ahead. */
__device__ __forceinline__ void mgc_emb_join_block(i64 g, float *__restrict__ dwte,
                                                   const float *__restrict__ part,
                                                   const unsigned long long *__restrict__ keys,
                                                   i64 V_l, i64 n, int S) {
    i64 G = (n + S - 1) / S, last = (g + 1) * S - 1;
    if (last + 1 >= n) return;
    unsigned t = mgc_emb_tok(keys, last);
    if (mgc_emb_tok(keys, last + 1) != t) return; /* the segment's last run ends in it */
    if (g > 0 && mgc_emb_tok(keys, g * S - 1) == t && mgc_emb_tok(keys, g * S) == t)
        return; /* the whole segment is the middle of a run begun earlier: not the owner */
    if (t >= V_l) return; /* the rows outside the shard */
    const i64 v = t;
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
        mgc_emb_add_rows<MGC_EMB_U>(acc, x, ge - q);
    }
    mgc_emb_put_row(d, acc);
}

#if MGC_POS
/* rows read ahead of their additions: U * EPER registers, 32 (20 in blocks of 1024, whose
 * threads hold at most 64: fp16's conversions at H 12288 spilled with 24) */
#define MGC_EMB_PREGS (MGC_T <= 512 ? 32 : 20)
#define MGC_EMB_PU0 (MGC_EMB_PREGS / MGC_EPER)
#define MGC_EMB_PU (MGC_EMB_PU0 > 8 ? 8 : MGC_EMB_PU0 < 1 ? 1 : MGC_EMB_PU0)
/* Position block i (sequence row i, i.e. one distinct position): dwpe[pos(i)] += dy[i*b + j],
 * j ascending.  Without documents only: with them (data.reset_position_ids) the launcher sorts
 * the rows by position and adds them as the word gradient's rows (embedding_sort with tok NULL,
 * embedding_bwd_sorted, embedding_bwd_join).  A column's additions are j ascending; the
 * gradient row and U rows of dy (all b of them for GPT-2's micro batches) are loaded for every
 * column of the thread before the first addition (a column at a time, four rows ahead, waited
 * for memory three times a column: 11.2 us of a GPT-2 124M step on the H200). */
__device__ __forceinline__ void mgc_emb_pos_block(i64 i, float *__restrict__ dwpe,
                                                  const mgc_t *__restrict__ dy, i64 b, i64 cp,
                                                  i64 cpr, i64 half_len) {
    float *d = dwpe + mgc_ctx_pos(i, cp, cpr, half_len) * (i64)MGC_H;
    const mgc_t *y = dy + i * b * (i64)MGC_H;
    float acc[MGC_EPER];
#pragma unroll
    for (int k = 0; k < MGC_EPER; k++) {
        int c = k * MGC_T + threadIdx.x;
        acc[k] = c < MGC_H ? d[c] : 0.0f;
    }
    for (i64 j = 0; j < b; j += MGC_EMB_PU) {
        mgc_t x[MGC_EMB_PU][MGC_EPER]; /* as stored: converted where added (mgc_emb_f) */
#pragma unroll
        for (int u = 0; u < MGC_EMB_PU; u++)
#pragma unroll
            for (int k = 0; k < MGC_EPER; k++) {
                int c = k * MGC_T + threadIdx.x;
                x[u][k] = j + u < b && c < MGC_H ? y[(j + u) * (i64)MGC_H + c] : (mgc_t)0;
            }
        mgc_emb_add_rows<MGC_EMB_PU>(acc, x, b - j);
    }
    mgc_emb_put_row(d, acc);
}
#endif

/* grid G + P, block T: blocks 0 .. G-1 join the word gradient's runs that cross segments
 * (G = ceil(n / S) after embedding_bwd_sorted, or 0 when nothing needs joining); with POS = 1,
 * blocks G .. G+P-1 add the position gradient (P = the sequence rows; dwpe (P, H) fp32,
 * accumulated), which needs nothing of the word gradient's: one launch for both (they took
 * 8.3 and 9.3 us of a GPT-2 124M step on the H100 as two, each bound by its loads' latency
 * with the GPU half idle).  POS = 0: dwpe, dy, b, cp, cpr, half_len unused. */
extern "C" __global__ void __launch_bounds__(MGC_T, 1)
    MGC_ENTRY_NAME(float *__restrict__ dwte, const float *__restrict__ part,
                   const unsigned long long *__restrict__ keys, i64 V_l, i64 n, int S, i64 G,
                   float *__restrict__ dwpe, const mgc_t *__restrict__ dy, i64 b, i64 cp, i64 cpr,
                   i64 half_len) {
    mgc_pdl_begin();
    const i64 g = blockIdx.x;
    if (g < G) {
        mgc_emb_join_block(g, dwte, part, keys, V_l, n, S);
        return;
    }
#if MGC_POS
    mgc_emb_pos_block(g - G, dwpe, dy, b, cp, cpr, half_len);
#else
    (void)dwpe, (void)dy, (void)b, (void)cp, (void)cpr, (void)half_len;
#endif
}
#endif
