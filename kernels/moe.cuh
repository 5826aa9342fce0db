/* moe.cuh - mixture-of-experts kernels: the router (scores, top-k, probabilities,
 * z-loss and aux-loss partials, backward), the dispatch map (deterministic,
 * no atomics), permute / combine and their backward, and the sort of
 * received rows between (source chunk, local expert) and (local expert,
 * source chunk) order.  The math is runtime/cpu_ops_tmpl.h's (mgc_cpu_moe_*);
 * the mapping of plan ops to launches is runtime/cuda_ops_moe.c.
 *
 * Types: activations and rows are mgc_t; the router's logits and their
 * gradient are mgc_t too (the router linear's output, compute dtype);
 * probabilities and their gradient are float; expert ids are int; counts are
 * long long (a `c64` flag argument: 1 long long, 0 int).
 *
 * Score functions (argument `score`, mgc_router_score of cpu_ops.h):
 * 0 softmax over the k chosen, 1 softmax over all E (pre-softmax), 2 sigmoid
 * (normalised over the k chosen when k > 1).
 *
 * The dispatch map (mgc_cpu_moe_dispatch_map): assignment a = t*K + j goes to
 * row off[e] + pos, pos = its rank among expert e's kept assignments in
 * assignment order, so rows are ordered by expert, then token, then choice.
 * It is built by three kernels over tiles of MOE_TILE assignments:
 *   map_hist    per-tile, per-expert counts (warp match + per-warp counts),
 *   map_scan    one block: per-expert running sums over the tiles (fixed order),
 *               capacity, exclusive offsets over experts, counts out,
 *   map_scatter row of each assignment = off[e] + tile offset + rank in tile.
 * With capacity and the "probs" policy a first dropless pass writes each
 * expert's assignment list, map_rank marks the kept ones (rank by probability
 * descending, then assignment index, below the capacity), and a second
 * hist/scan/scatter pass over the kept ones gives their rows.
 *
 * Constants: MGC_E experts, MGC_K top-k, MGC_H hidden width (row length). */
#include "mgc_common.cuh"

#define MOE_TILE 256 /* assignments per map block (= its blockDim.x) */
#define MOE_NEG_INF (__int_as_float(0xff800000))

__device__ __forceinline__ float moe_warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
__device__ __forceinline__ float moe_warp_max(float v) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}
__device__ __forceinline__ float moe_sigm(float x) {
    return 1.0f / (1.0f + expf(-x));
}
__device__ __forceinline__ float moe_cnt(const void *c, int i64, int e) {
    return i64 ? (float)((const long long *)c)[e] : (float)((const int *)c)[e];
}
/* Row `row` of (rows, E) counts (the sequence-wise aux loss's: token t's sequence t mod rows). */
__device__ __forceinline__ const void *moe_cnt_row(const void *c, int wide, int row, int E) {
    return wide ? (const void *)((const long long *)c + (long long)row * E)
                : (const void *)((const int *)c + (long long)row * E);
}

/* ---- router -------------------------------------------------------------------- */

#if defined(MGC_ENTRY_moe_route_fwd) || defined(MGC_ENTRY_moe_aux_part) ||                      \
    defined(MGC_ENTRY_moe_route_bwd)
#define MOE_NE ((MGC_E + 31) / 32) /* logits per lane: e = lane + 32 i */
#if MGC_E > 1024
#error "moe router kernels: at most 1024 experts"
#endif

/* The logits' storage: the specialisation's, or fp32 beside a 16-bit gradient (MGC_LF32:
 * moe.router_dtype fp32, route backward only). */
#if defined(MGC_LF32) && MGC_LF32
typedef float moe_lt;
__device__ __forceinline__ float moe_ld(float v) { return v; }
#else
typedef mgc_t moe_lt;
__device__ __forceinline__ float moe_ld(mgc_t v) { return mgc_ld(v); }
#endif

/* v[i] = logit of e = lane + 32 i (-inf past E); returns lse (same on every lane). */
__device__ __forceinline__ float moe_load_row(float *v, const moe_lt *l, int lane) {
    float mx = MOE_NEG_INF;
#pragma unroll
    for (int i = 0; i < MOE_NE; i++) {
        int e = lane + 32 * i;
        v[i] = e < MGC_E ? moe_ld(l[e]) : MOE_NEG_INF;
        mx = fmaxf(mx, v[i]);
    }
    mx = moe_warp_max(mx);
    float s = 0.0f;
#pragma unroll
    for (int i = 0; i < MOE_NE; i++)
        if (lane + 32 * i < MGC_E) s += expf(v[i] - mx);
    s = moe_warp_sum(s);
    return mx + logf(s);
}

/* Full-distribution scores p[i] (softmax over E; sigmoid normalised over E). */
__device__ __forceinline__ void moe_full_scores(float *p, const float *v, float lse, int score,
                                                int lane) {
    if (score == 2) {
        float s = 0.0f;
#pragma unroll
        for (int i = 0; i < MOE_NE; i++) {
            p[i] = lane + 32 * i < MGC_E ? moe_sigm(v[i]) : 0.0f;
            s += p[i];
        }
        s = 1.0f / moe_warp_sum(s);
#pragma unroll
        for (int i = 0; i < MOE_NE; i++) p[i] *= s;
    } else {
#pragma unroll
        for (int i = 0; i < MOE_NE; i++) p[i] = lane + 32 * i < MGC_E ? expf(v[i] - lse) : 0.0f;
    }
}
#endif

#if defined(MGC_ENTRY_moe_route_fwd)
#ifndef MGC_G
#define MGC_G 0 /* group-limited routing: expert groups (0: none) */
#endif
#ifndef MGC_GK
#define MGC_GK 1 /* groups a token may use */
#endif
#if MGC_G > 0 && (MGC_E % MGC_G || MGC_GK < 1 || MGC_GK > MGC_G || MGC_GK > MGC_K)
#error "moe_route_fwd: MGC_G groups must divide MGC_E, 1 <= MGC_GK <= MGC_G, MGC_GK <= MGC_K"
#endif

/* The warp's largest x[i] (expert e = lane + 32 i) over lo <= e < hi outside `skip` (bit i):
 * its value in bv and expert in bi (ties to the lower expert; -1 when none), on every lane. */
__device__ __forceinline__ void moe_argmax(const float *x, unsigned skip, int lo, int hi, int lane,
                                           float &bv, int &bi) {
    bv = MOE_NEG_INF;
    bi = -1;
#pragma unroll
    for (int i = 0; i < MOE_NE; i++) {
        int e = lane + 32 * i;
        if (e >= lo && e < hi && !((skip >> i) & 1u) && (bi < 0 || x[i] > bv)) bv = x[i], bi = e;
    }
    for (int o = 16; o > 0; o >>= 1) {
        float ov = __shfl_xor_sync(0xffffffffu, bv, o);
        int oi = __shfl_xor_sync(0xffffffffu, bi, o);
        if (oi >= 0 && (bi < 0 || ov > bv || (ov == bv && oi < bi))) bv = ov, bi = oi;
    }
}

/* Router forward, one warp per token: top-k by logit (descending, ties to the
 * lower expert index), probabilities by `score` times `scale` (the top-k scaling
 * factor), zpart[t] = lse_t^2 (z-loss partial; zpart may be NULL).  logits (n, E)
 * mgc_t; probs (n, K) float; ids (n, K) int.
 * The choice of mgc_cpu_moe_route_fwd's mgc_router_choice (cpu_ops.h): MGC_G > 0 limits a
 * token to the experts of its MGC_GK best groups (a group's score: the sum of its top
 * MGC_K / MGC_GK scores, descending); `bias` (E floats, NULL: none) is added to the scores
 * top-k compares, which then orders the chosen by biased score.
 * grid: ceil(n / 4), block: 128 (4 warps); 4 MGC_G floats of static shared memory. */
extern "C" __global__ void __launch_bounds__(128)
    MGC_ENTRY_NAME(const mgc_t *__restrict__ logits, const float *__restrict__ bias,
                   float *__restrict__ probs, int *__restrict__ ids, float *__restrict__ zpart,
                   int n, int score, float scale) {
    mgc_pdl_begin();
    int lane = threadIdx.x & 31;
    int t = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (t >= n) return; /* whole warps */
    const mgc_t *row = logits + (i64)t * MGC_E;
    float v[MOE_NE];
    float lse = moe_load_row(v, row, lane);
    unsigned taken = 0;
    /* sv: the scores groups and the bias compare (top-k too with a bias; else the logits) */
    float sv[MOE_NE];
    if (MGC_G > 0 || bias) {
#pragma unroll
        for (int i = 0; i < MOE_NE; i++) {
            int e = lane + 32 * i;
            sv[i] = e >= MGC_E ? MOE_NEG_INF
                    : score == 2 ? moe_sigm(v[i])
                    : score == 1 ? expf(v[i] - lse)
                                 : v[i];
            if (bias && e < MGC_E) sv[i] += bias[e];
        }
    }
#if MGC_G > 0
    {
        __shared__ float gsc[4][MGC_G];
        const int EG = MGC_E / MGC_G, w = threadIdx.x >> 5;
#pragma unroll 1
        for (int g = 0; g < MGC_G; g++) {
            unsigned tk = 0;
            float sum = 0.0f;
#pragma unroll
            for (int j = 0; j < MGC_K / MGC_GK; j++) {
                float bv;
                int bi;
                moe_argmax(sv, tk, g * EG, (g + 1) * EG, lane, bv, bi);
                if ((bi & 31) == lane) tk |= 1u << (bi >> 5);
                sum += bv;
            }
            if (lane == 0) gsc[w][g] = sum;
        }
        __syncwarp();
        int cg[MGC_GK];
        unsigned gt = 0;
#pragma unroll
        for (int r = 0; r < MGC_GK; r++) {
            float bv = MOE_NEG_INF;
            int bi = -1;
#pragma unroll
            for (int q = 0; q < (MGC_G + 31) / 32; q++) {
                int g = lane + 32 * q;
                if (g < MGC_G && !((gt >> q) & 1u) && (bi < 0 || gsc[w][g] > bv))
                    bv = gsc[w][g], bi = g;
            }
            for (int o = 16; o > 0; o >>= 1) {
                float ov = __shfl_xor_sync(0xffffffffu, bv, o);
                int oi = __shfl_xor_sync(0xffffffffu, bi, o);
                if (oi >= 0 && (bi < 0 || ov > bv || (ov == bv && oi < bi))) bv = ov, bi = oi;
            }
            if ((bi & 31) == lane) gt |= 1u << (bi >> 5);
            cg[r] = bi;
        }
#pragma unroll
        for (int i = 0; i < MOE_NE; i++) {
            int grp = (lane + 32 * i) / EG, ok = 0;
#pragma unroll
            for (int r = 0; r < MGC_GK; r++) ok |= cg[r] == grp;
            if (!ok) taken |= 1u << i;
        }
    }
#endif
    if (bias) { /* top-k by the biased scores; the chosen logits are read again below */
#pragma unroll
        for (int i = 0; i < MOE_NE; i++) v[i] = sv[i];
    }
    float lv[MGC_K];
    int ex[MGC_K];
#pragma unroll
    for (int j = 0; j < MGC_K; j++) {
        float bv;
        int bi;
        moe_argmax(v, taken, 0, MGC_E, lane, bv, bi);
        if (bi >= 0 && (bi & 31) == lane) taken |= 1u << (bi >> 5);
        lv[j] = bias ? mgc_ld(row[bi]) : bv; /* the chosen logit */
        ex[j] = bi;
    }
    float pr[MGC_K], ss = 0.0f, mc = lv[0];
#pragma unroll
    for (int j = 1; j < MGC_K; j++) mc = fmaxf(mc, lv[j]);
#pragma unroll
    for (int j = 0; j < MGC_K; j++) {
        if (score == 1) pr[j] = expf(lv[j] - lse);
        else if (score == 2) pr[j] = moe_sigm(lv[j]);
        else pr[j] = expf(lv[j] - mc); /* mc: the max of the chosen */
        ss += pr[j];
    }
    if (lane == 0) {
#pragma unroll
        for (int j = 0; j < MGC_K; j++) {
            float p = pr[j];
            if (score == 0 || (score == 2 && MGC_K > 1)) p /= ss;
            probs[(i64)t * MGC_K + j] = p * scale;
            ids[(i64)t * MGC_K + j] = ex[j];
        }
        if (zpart) zpart[t] = lse * lse;
    }
}
#endif

#if defined(MGC_ENTRY_moe_aux_part)
/* Aux-loss partial per token, one warp per token:
 * part[t] = sum_e p_{t,e} c_e with p the full-distribution scores.
 * counts (ncol, E): long long when c64, else int; token t reads row t mod ncol (1: the
 * microbatch's counts; the sequences': moe.aux_loss_scope sequence).
 * grid: ceil(n / 4), block: 128, no dynamic shared memory. */
extern "C" __global__ void __launch_bounds__(128)
    MGC_ENTRY_NAME(const mgc_t *__restrict__ logits, const void *__restrict__ counts, int c64,
                   float *__restrict__ part, int n, int score, int ncol) {
    mgc_pdl_begin();
    int lane = threadIdx.x & 31;
    int t = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (t >= n) return;
    counts = moe_cnt_row(counts, c64, t % ncol, MGC_E);
    float v[MOE_NE], p[MOE_NE];
    float lse = moe_load_row(v, logits + (i64)t * MGC_E, lane);
    moe_full_scores(p, v, lse, score, lane);
    float acc = 0.0f;
#pragma unroll
    for (int i = 0; i < MOE_NE; i++) {
        int e = lane + 32 * i;
        if (e < MGC_E) acc += p[i] * moe_cnt(counts, c64, e);
    }
    acc = moe_warp_sum(acc);
    if (lane == 0) part[t] = acc;
}
#endif

#if defined(MGC_ENTRY_moe_route_bwd)
/* Router backward, one warp per token (mgc_cpu_moe_route_bwd; `scale` the top-k
 * scaling factor, which multiplies dprobs first):
 * dlogits = d/dlogits [dprobs . probs] + aux term (auxk = daux * coeff * E ncol /
 * (k T^2), counts from `counts`, row t mod ncol as moe_aux_part reads them; 0: none) + z term
 * (zk = dz * z_coeff * 2 / n; 0: none).  logits, dlogits (n, E) mgc_t; ids (n, K) int; dprobs
 * (n, K) float.
 * grid: ceil(n / 4), block: 128, no dynamic shared memory. */
extern "C" __global__ void __launch_bounds__(128)
    MGC_ENTRY_NAME(const moe_lt *__restrict__ logits, const int *__restrict__ ids,
                   const float *__restrict__ dprobs, const void *__restrict__ counts, int c64,
                   mgc_t *__restrict__ dlogits, int n, int score, float auxk, float zk,
                   float scale, int ncol) {
    mgc_pdl_begin();
    int lane = threadIdx.x & 31;
    int t = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (t >= n) return;
    if (counts) counts = moe_cnt_row(counts, c64, t % ncol, MGC_E);
    const moe_lt *l = logits + (i64)t * MGC_E;
    float v[MOE_NE], dl[MOE_NE];
    float lse = moe_load_row(v, l, lane);
#pragma unroll
    for (int i = 0; i < MOE_NE; i++) dl[i] = 0.0f;
    int ex[MGC_K];
    float dp[MGC_K], lx[MGC_K];
#pragma unroll
    for (int j = 0; j < MGC_K; j++) {
        ex[j] = ids[(i64)t * MGC_K + j];
        dp[j] = scale * dprobs[(i64)t * MGC_K + j];
        lx[j] = moe_ld(l[ex[j]]);
    }
    /* the probabilities */
    if (score == 1) {
        float dot = 0.0f;
#pragma unroll
        for (int j = 0; j < MGC_K; j++) dot += expf(lx[j] - lse) * dp[j];
#pragma unroll
        for (int i = 0; i < MOE_NE; i++) {
            int e = lane + 32 * i;
            float h = 0.0f;
#pragma unroll
            for (int j = 0; j < MGC_K; j++)
                if (ex[j] == e) h = dp[j];
            if (e < MGC_E) dl[i] += expf(v[i] - lse) * (h - dot);
        }
    } else {
        float g[MGC_K], q[MGC_K], ss = 0.0f, dot = 0.0f;
#pragma unroll
        for (int j = 0; j < MGC_K; j++) {
            q[j] = score == 2 ? moe_sigm(lx[j]) : expf(lx[j] - lx[0]);
            ss += q[j];
        }
        float inv = 1.0f / ss;
        if (score == 2) {
            if (MGC_K > 1) {
#pragma unroll
                for (int j = 0; j < MGC_K; j++) dot += q[j] * inv * dp[j];
#pragma unroll
                for (int j = 0; j < MGC_K; j++) g[j] = (dp[j] - dot) * inv * q[j] * (1.0f - q[j]);
            } else {
#pragma unroll
                for (int j = 0; j < MGC_K; j++) g[j] = dp[j] * q[j] * (1.0f - q[j]);
            }
        } else {
#pragma unroll
            for (int j = 0; j < MGC_K; j++) {
                q[j] *= inv;
                dot += q[j] * dp[j];
            }
#pragma unroll
            for (int j = 0; j < MGC_K; j++) g[j] = q[j] * (dp[j] - dot);
        }
#pragma unroll
        for (int i = 0; i < MOE_NE; i++) {
            int e = lane + 32 * i;
#pragma unroll
            for (int j = 0; j < MGC_K; j++)
                if (ex[j] == e) dl[i] += g[j];
        }
    }
    /* the aux loss: d/dp_{t,e} = auxk c_e through the full-distribution scores */
    if (auxk != 0.0f) {
        float p[MOE_NE], dot = 0.0f;
        moe_full_scores(p, v, lse, score, lane);
#pragma unroll
        for (int i = 0; i < MOE_NE; i++) {
            int e = lane + 32 * i;
            if (e < MGC_E) dot += p[i] * auxk * moe_cnt(counts, c64, e);
        }
        dot = moe_warp_sum(dot);
        if (score == 2) {
            float s = 0.0f;
#pragma unroll
            for (int i = 0; i < MOE_NE; i++)
                if (lane + 32 * i < MGC_E) s += moe_sigm(v[i]);
            s = 1.0f / moe_warp_sum(s);
#pragma unroll
            for (int i = 0; i < MOE_NE; i++) {
                int e = lane + 32 * i;
                if (e < MGC_E) {
                    float se = moe_sigm(v[i]);
                    dl[i] += (auxk * moe_cnt(counts, c64, e) - dot) * s * se * (1.0f - se);
                }
            }
        } else {
#pragma unroll
            for (int i = 0; i < MOE_NE; i++) {
                int e = lane + 32 * i;
                if (e < MGC_E) dl[i] += p[i] * (auxk * moe_cnt(counts, c64, e) - dot);
            }
        }
    }
    /* the z-loss: d/dl = zk lse softmax */
    if (zk != 0.0f) {
#pragma unroll
        for (int i = 0; i < MOE_NE; i++)
            if (lane + 32 * i < MGC_E) dl[i] += zk * lse * expf(v[i] - lse);
    }
    mgc_t *o = dlogits + (i64)t * MGC_E;
#pragma unroll
    for (int i = 0; i < MOE_NE; i++) {
        int e = lane + 32 * i;
        if (e < MGC_E) o[e] = mgc_st(dl[i]);
    }
}
#endif

#if defined(MGC_ENTRY_moe_sum)
/* out[0] = mul * (sum of part[0 .. n)) / div, in a fixed order: thread i adds
 * part[i], part[i + 256], ... in turn, then mgc_block_sum (the second pass of
 * the z-loss and aux-loss reductions).
 * grid: 1, block: 256 (fixed: the order depends on it), no dynamic shared memory. */
extern "C" __global__ void __launch_bounds__(256)
    MGC_ENTRY_NAME(const float *__restrict__ part, int n, float mul, float div,
                   float *__restrict__ out) {
    mgc_pdl_begin();
    __shared__ float sh[32];
    float s = 0.0f;
    for (int i = threadIdx.x; i < n; i += blockDim.x) s += part[i];
    s = mgc_block_sum(s, sh);
    if (threadIdx.x == 0) out[0] = mul * s / div;
}
#endif

/* ---- the sequence-wise aux loss's counts ---------------------------------------- */

#if defined(MGC_ENTRY_moe_col_counts)
/* counts[j][e] = the assignments of sequence j's tokens (t = j, j + ncol, ...: rows of ncol
 * tokens) to expert e, of n tokens' ids (n, K).  Block b takes sequence b / ceil(E / 32) and
 * the 32 experts of slice b mod ceil(E / 32), one a lane; warp w counts the tokens w, w + 8,
 * ... of the sequence (every lane reads the same ids), and warp 0 adds the warps' counts in
 * warp order.  counts: long long when c64, else int.  No atomics.
 * grid: ncol * ceil(E / 32), block: 256; 1 KiB of static shared memory. */
extern "C" __global__ void __launch_bounds__(256)
    MGC_ENTRY_NAME(const int *__restrict__ ids, int n, int K, int ncol, int E,
                   void *__restrict__ counts, int c64) {
    mgc_pdl_begin();
    __shared__ int part[8][32];
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5, eb = (E + 31) / 32;
    int j = blockIdx.x / eb, e = (blockIdx.x % eb) * 32 + lane, cnt = 0;
    for (i64 t = j + (i64)ncol * w; t < n; t += (i64)ncol * 8)
        for (int a = 0; a < K; a++) cnt += ids[t * K + a] == e;
    part[w][lane] = cnt;
    __syncthreads();
    if (w == 0 && e < E) {
        long long sum = 0;
        for (int q = 0; q < 8; q++) sum += part[q][lane];
        if (c64)
            ((long long *)counts)[(i64)j * E + e] = sum;
        else
            ((int *)counts)[(i64)j * E + e] = (int)sum;
    }
}
#endif

/* ---- the dispatch map ---------------------------------------------------------------- */

#if defined(MGC_ENTRY_moe_map_hist) || defined(MGC_ENTRY_moe_map_scatter)
/* Expert of assignment a of this block's tile (-1: past nk or not kept); the
 * per-warp counts wc[w * E + e] of the tile (dynamic shared memory, 8 E ints);
 * returns the rank of a among the earlier lanes of its warp with its expert. */
__device__ __forceinline__ int moe_tile_counts(const int *__restrict__ ids,
                                               const unsigned char *__restrict__ keep, int nk,
                                               int E, int *wc, int *e_out) {
    int a = blockIdx.x * MOE_TILE + threadIdx.x;
    int e = a < nk && (!keep || keep[a]) ? ids[a] : -1;
    *e_out = e;
    return mgc_block_rank(e, E, wc);
}
#endif

#if defined(MGC_ENTRY_moe_map_hist)
/* tilecnt[tile * E + e] = assignments of tile `tile` (MOE_TILE of them) going to
 * expert e, counting only the kept ones when keep is not NULL.
 * grid: ceil(nk / 256), block: 256, dynamic shared memory: 8 * E * 4 bytes. */
extern "C" __global__ void __launch_bounds__(MOE_TILE)
    MGC_ENTRY_NAME(const int *__restrict__ ids, const unsigned char *__restrict__ keep, int nk,
                   int E, int *__restrict__ tilecnt) {
    mgc_pdl_begin();
    MGC_DYN_SHARED(int, wc);
    int e;
    moe_tile_counts(ids, keep, nk, E, wc, &e);
    for (int x = threadIdx.x; x < E; x += blockDim.x) {
        int c = 0;
        for (int w = 0; w < MOE_TILE / 32; w++) c += wc[w * E + x];
        tilecnt[(i64)blockIdx.x * E + x] = c;
    }
}
#endif

#if defined(MGC_ENTRY_moe_map_scan)
/* Per expert e (serially over the tiles, in order): tileoff[tile * E + e] = the
 * assignments to e in earlier tiles; tot[e] = all of them; kept_e = tot[e],
 * or min(tot[e], cap) when cap > 0; off[e] = sum of kept_e' for e' < e, off[E]
 * = the rows R; counts[e] = kept_e (long long when c64, else int; NULL: none).
 * grid: 1, block: 256, dynamic shared memory: E * 4 bytes. */
extern "C" __global__ void __launch_bounds__(256)
    MGC_ENTRY_NAME(const int *__restrict__ tilecnt, int ntiles, int E, long long cap,
                   int *__restrict__ tileoff, int *__restrict__ tot, int *__restrict__ off,
                   void *__restrict__ counts, int c64) {
    mgc_pdl_begin();
    MGC_DYN_SHARED(int, kept);
    for (int e = threadIdx.x; e < E; e += blockDim.x) {
        int run = 0;
        for (int b = 0; b < ntiles; b++) {
            int c = tilecnt[(long long)b * E + e];
            tileoff[(long long)b * E + e] = run;
            run += c;
        }
        tot[e] = run;
        int k = cap > 0 && run > cap ? (int)cap : run;
        kept[e] = k;
        if (counts) {
            if (c64) ((long long *)counts)[e] = k;
            else ((int *)counts)[e] = k;
        }
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        int run = 0;
        for (int e = 0; e < E; e++) {
            off[e] = run;
            run += kept[e];
        }
        off[E] = run;
    }
}
#endif

#if defined(MGC_ENTRY_moe_map_scatter)
/* Rows of the assignments: pos = tileoff[tile * E + e] + rank in the tile
 * among e's (kept) assignments; kept when keep says so (keep not NULL), else
 * when cap <= 0 or pos < cap; row = off[e] + pos.  row_of[a] = row or -1
 * (NULL: not written); row_src[row] = a (NULL: not written).
 * grid: ceil(nk / 256), block: 256, dynamic shared memory: 8 * E * 4 bytes. */
extern "C" __global__ void __launch_bounds__(MOE_TILE)
    MGC_ENTRY_NAME(const int *__restrict__ ids, const unsigned char *__restrict__ keep, int nk,
                   int E, long long cap, const int *__restrict__ tileoff,
                   const int *__restrict__ off, int *__restrict__ row_src,
                   int *__restrict__ row_of) {
    mgc_pdl_begin();
    MGC_DYN_SHARED(int, wc);
    int e;
    int rank = moe_tile_counts(ids, keep, nk, E, wc, &e);
    int a = blockIdx.x * MOE_TILE + threadIdx.x;
    if (a >= nk) return;
    int row = -1;
    if (e >= 0) {
        for (int w = 0; w < (int)(threadIdx.x >> 5); w++) rank += wc[w * E + e];
        int pos = tileoff[(i64)blockIdx.x * E + e] + rank;
        if (keep || cap <= 0 || pos < cap) row = off[e] + pos;
    }
    if (row >= 0 && row_src) row_src[row] = a;
    if (row_of) row_of[a] = row;
}
#endif

#if defined(MGC_ENTRY_moe_map_rank)
/* Capacity by probability: keep[a] = 1 when expert e = ids[a] has at most cap
 * assignments (tot[e]), or fewer than cap of them come before a (higher
 * probability, then lower assignment index); list + off[e] holds e's tot[e]
 * assignments (the dropless map's row_src).
 * grid: ceil(nk / 256), block: 256, no dynamic shared memory. */
extern "C" __global__ void __launch_bounds__(256)
    MGC_ENTRY_NAME(const int *__restrict__ ids, const float *__restrict__ probs, int nk,
                   long long cap, const int *__restrict__ list, const int *__restrict__ off,
                   const int *__restrict__ tot, unsigned char *__restrict__ keep) {
    mgc_pdl_begin();
    int a = blockIdx.x * blockDim.x + threadIdx.x;
    if (a >= nk) return;
    int e = ids[a], c = tot[e];
    unsigned char k = 1;
    if (cap > 0 && c > cap) {
        const int *seg = list + off[e];
        float pa = probs[a];
        long long before = 0;
        for (int u = 0; u < c && before < cap; u++) {
            int b = seg[u];
            float pb = probs[b];
            before += pb > pa || (pb == pa && b < a);
        }
        k = before < cap;
    }
    keep[a] = k;
}
#endif

/* ---- rows ------------------------------------------------------------------------------ */

#if defined(MGC_ENTRY_moe_permute)
/* rows[row_of[a]] = x[a / K] for each routed assignment a (rows past the routed
 * ones are not written).  x (n, H), rows (R, H) mgc_t.
 * grid: n * K (one block per assignment), block: 128, no dynamic shared memory. */
extern "C" __global__ void __launch_bounds__(128)
    MGC_ENTRY_NAME(const mgc_t *__restrict__ x, const int *__restrict__ row_of,
                   mgc_t *__restrict__ rows) {
    mgc_pdl_begin();
    i64 a = blockIdx.x;
    int r = row_of[a];
    if (r < 0) return;
    const mgc_t *src = x + (a / MGC_K) * MGC_H;
    mgc_t *dst = rows + (i64)r * MGC_H;
    for (int c = threadIdx.x; c < MGC_H; c += blockDim.x) dst[c] = src[c];
}
#endif

#if defined(MGC_ENTRY_moe_permute_bwd)
/* dx[t] = sum_j drows[row_of[t K + j]] (j ascending; dropped add nothing).
 * grid: n (one block per token), block: 128, no dynamic shared memory. */
extern "C" __global__ void __launch_bounds__(128)
    MGC_ENTRY_NAME(const mgc_t *__restrict__ drows, const int *__restrict__ row_of,
                   mgc_t *__restrict__ dx) {
    mgc_pdl_begin();
    i64 t = blockIdx.x;
    int r[MGC_K];
#pragma unroll
    for (int j = 0; j < MGC_K; j++) r[j] = row_of[t * MGC_K + j];
    for (int c = threadIdx.x; c < MGC_H; c += blockDim.x) {
        float acc = 0.0f;
#pragma unroll
        for (int j = 0; j < MGC_K; j++)
            if (r[j] >= 0) acc += mgc_ld(drows[(i64)r[j] * MGC_H + c]);
        dx[t * MGC_H + c] = mgc_st(acc);
    }
}
#endif

#if defined(MGC_ENTRY_moe_combine)
/* y[t] = sum_j probs[t K + j] rows[row_of[t K + j]] (j ascending; dropped: 0).
 * grid: n (one block per token), block: 128, no dynamic shared memory. */
extern "C" __global__ void __launch_bounds__(128)
    MGC_ENTRY_NAME(const mgc_t *__restrict__ rows, const float *__restrict__ probs,
                   const int *__restrict__ row_of, mgc_t *__restrict__ y) {
    mgc_pdl_begin();
    i64 t = blockIdx.x;
    int r[MGC_K];
    float p[MGC_K];
#pragma unroll
    for (int j = 0; j < MGC_K; j++) {
        r[j] = row_of[t * MGC_K + j];
        p[j] = probs[t * MGC_K + j];
    }
    for (int c = threadIdx.x; c < MGC_H; c += blockDim.x) {
        float acc = 0.0f;
#pragma unroll
        for (int j = 0; j < MGC_K; j++)
            if (r[j] >= 0) acc += p[j] * mgc_ld(rows[(i64)r[j] * MGC_H + c]);
        y[t * MGC_H + c] = mgc_st(acc);
    }
}
#endif

#if defined(MGC_ENTRY_moe_combine_bwd)
/* For assignment a = t K + j with row r = row_of[a]: drows[r] = probs[a] dy[t],
 * dprobs[a] = dy[t] . rows[r] (mgc_block_sum: fixed order); dropped: dprobs[a]
 * = 0 and no row written.
 * grid: n * K (one block per assignment), block: 128, no dynamic shared memory. */
extern "C" __global__ void __launch_bounds__(128)
    MGC_ENTRY_NAME(const mgc_t *__restrict__ dy, const mgc_t *__restrict__ rows,
                   const float *__restrict__ probs, const int *__restrict__ row_of,
                   mgc_t *__restrict__ drows, float *__restrict__ dprobs) {
    mgc_pdl_begin();
    __shared__ float sh[32];
    i64 a = blockIdx.x, t = a / MGC_K;
    int r = row_of[a];
    if (r < 0) {
        if (threadIdx.x == 0) dprobs[a] = 0.0f;
        return;
    }
    float p = probs[a], dot = 0.0f;
    const mgc_t *g = dy + t * MGC_H;
    const mgc_t *x = rows + (i64)r * MGC_H;
    mgc_t *o = drows + (i64)r * MGC_H;
    for (int c = threadIdx.x; c < MGC_H; c += blockDim.x) {
        float d = mgc_ld(g[c]);
        dot += d * mgc_ld(x[c]);
        o[c] = mgc_st(p * d);
    }
    dot = mgc_block_sum(dot, sh);
    if (threadIdx.x == 0) dprobs[a] = dot;
}
#endif

/* ---- sort of received rows: (chunk, local expert) <-> (local expert, chunk) ------------ */

#if defined(MGC_ENTRY_moe_sort_offsets)
/* From counts[ch * El + e] (long long, on the device): cm[ch * El + e] = the
 * block's first row in chunk-major order, em[e * chunks + ch] = in
 * expert-major order, em[chunks * El] = the rows; tpe[e] = sum over the
 * chunks (NULL: not written).
 * grid: 1, block: 32, no dynamic shared memory. */
extern "C" __global__ void __launch_bounds__(32)
    MGC_ENTRY_NAME(const long long *__restrict__ counts, int chunks, int El,
                   long long *__restrict__ cm, long long *__restrict__ em,
                   long long *__restrict__ tpe) {
    mgc_pdl_begin();
    if (threadIdx.x != 0) return;
    long long run = 0;
    for (int q = 0; q < chunks * El; q++) {
        cm[q] = run;
        run += counts[q];
    }
    run = 0;
    for (int e = 0; e < El; e++) {
        long long s = 0;
        for (int ch = 0; ch < chunks; ch++) {
            em[e * chunks + ch] = run;
            run += counts[ch * El + e];
            s += counts[ch * El + e];
        }
        if (tpe) tpe[e] = s;
    }
    em[chunks * El] = run;
}
#endif

#if defined(MGC_ENTRY_moe_sort_rows)
/* One destination row per block: inverse = 0 sorts chunk-major src into
 * expert-major dst, inverse = 1 the transpose; rows past the total are not
 * written.  cm, em from moe_sort_offsets.
 * grid: the rows of the destination buffer, block: 128, no dynamic shared memory. */
extern "C" __global__ void __launch_bounds__(128)
    MGC_ENTRY_NAME(const mgc_t *__restrict__ src, mgc_t *__restrict__ dst,
                   const long long *__restrict__ cm, const long long *__restrict__ em, int chunks,
                   int El, int inverse) {
    mgc_pdl_begin();
    i64 r = blockIdx.x;
    int nb = chunks * El;
    if (r >= em[nb]) return;
    const long long *doff = inverse ? cm : em;
    /* the last block whose first row is <= r (empty blocks share the next one's) */
    int lo = 0, hi = nb - 1;
    while (lo < hi) {
        int mid = (lo + hi + 1) >> 1;
        if (doff[mid] <= r) lo = mid;
        else hi = mid - 1;
    }
    i64 s;
    if (inverse) { /* lo = ch * El + e */
        int ch = lo / El, e = lo % El;
        s = em[e * chunks + ch] + (r - cm[lo]);
    } else { /* lo = e * chunks + ch */
        int e = lo / chunks, ch = lo % chunks;
        s = cm[ch * El + e] + (r - em[lo]);
    }
    const mgc_t *in = src + s * MGC_H;
    mgc_t *out = dst + r * MGC_H;
    for (int c = threadIdx.x; c < MGC_H; c += blockDim.x) out[c] = in[c];
}
#endif
