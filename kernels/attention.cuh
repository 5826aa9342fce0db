/* attention.cuh - flash attention, forward and backward (SIMT, fp32 accumulation).
 *
 * Layouts as the plan has them (docs/partitioning.md, attention):
 *   q, out, dq, dout  (sq, b, A, D)  mgc_t
 *   k, v, dk, dv      (sk, b, G, D)  mgc_t; query head a reads kv head a / (A/G)
 *   lse, dsum         (sq, b, A)     fp32; lse = log sum_j exp(scale q.k_j) over the visible keys
 * Constants: MGC_D (head dim: a multiple of 8 from 8 to 256; the kernels compute over ATT_W, D
 * rounded up to a multiple of 16 (the mma k-step), its last 8 columns zero when D is an odd
 * multiple of 8: staged and loaded as 0, never stored; the tiles are ATT_W's, 48 taking those
 * of 32 or 64, 80 to 112 those of 128; past 128 "wide", below), MGC_CAUSAL (0/1), MGC_DROP (0: the op has no dropout, the
 * kernels draw nothing whatever drop_p says), MGC_ROWPOS (1: no context parallelism, rows are
 * positions and the position arguments are not read).
 *
 * Math (runtime/cpu_ops_tmpl.h mgc_cpu_attention_fwd/bwd): key j is visible from query i iff
 * !CAUSAL or kpos(j) <= qpos(i); a row with no visible key gets out 0 and lse -inf and no
 * gradient.  Dropout (p > 0) multiplies probability (bi, a, i, j) by keep / (1-p), keep =
 * (Philox word of element elem0 + ((bi*drop_heads + a)*pos_s + qpos(i))*pos_s + kpos(j) >= thr):
 * the words of runtime/rng.c (the stream's step read from `step`: mgc_step_stream), numbered by
 * the model's head (elem0 = the rank's first head x
 * pos_s^2, drop_heads = the model's heads) and the positions, so that every tensor- and
 * context-parallel layout draws the one-rank mask (runtime/rng.h mgc_dropout_rng); p = 0 draws
 * nothing.
 *
 * Positions: when the int32 arrays qpos (sq) / kpos (sk) are not NULL they are used; otherwise
 * they are computed here from (pos_s = seq_length, pos_cp, pos_rank) exactly as
 * runtime/cpu_backend.c ctx_positions / gathered_positions do: pos_cp <= 1 -> row index;
 * queries: the rank's two chunks; keys: the same (k_gathered = 0) or the all-gathered rows of
 * ranks 0..cp-1 (k_gathered = 1).
 *
 * Every kernel is a block of 128 threads.  The SIMT kernels see it as 8 x 16 (ty = tid / 16,
 * tx = tid % 16): a tile row r of a thread is ty + 8 m, a tile column tx + 16 n (conflict-free
 * shared-memory reads).  The tensor-core kernels (bf16 and fp16: the forward and the backward,
 * ATT_TC_BWD) give each warp 16 rows (the forward at D <= 64: two m-tiles of 16) whose A
 * fragments stay in registers (at D > 64 the dK/dV
 * kernel reads its K and V from shared memory instead, ATT_KV_SMEM); the other
 * side's tiles are staged row-major in shared memory and read as B fragments by ldmatrix
 * (.trans where the tile is the k side); mma.sync m16n8k16 with fp32 accumulation; P and dS
 * are rounded to the storage type as operands, as in FlashAttention.
 * Tiles live in static shared memory (< 48 KiB, no dynamic shared memory) up to D 128, but for
 * the 16-bit forward's 64-key tiles past D 64 (ATT_FWD_DYN) and the 16-bit dK/dV kernel's four
 * tiles past D 64, two buffers of Q and dO beside K and V (ATT_DKV_DYN); the tile sizes are
 * functions of D (of ATT_W: "D" below) and of the forward's variant, written below and repeated by
 * runtime/cuda_ops_attention.c:
 *   forward:  ATT_FBQ query rows per block (fp32: 64 for D <= 64, 32 to 128, 16 above; 16-bit:
 *             128 for D <= 64 (ATT_FMT = 2 m-tiles of 16 rows a warp), else 64),
 *             ATT_FBK keys per step (fp32: 64 for D <= 32, 32 to 128, 16 above; 16-bit: 64
 *             to D 128 without dropout, documents or a window, else as fp32; past D 64 its
 *             two buffers of K and V tiles then take dynamic shared memory, ATT_FWD_DYN, and
 *             its one-buffer twin static, ATT_FWD_NB_PP)
 *   backward: tensor cores (16-bit): ATT_TBR = 64 rows kept per block; rows per step
 *             ATT_TBC_KV (dK/dV: 64 for D <= 32, and for D 48 and 64 without dropout,
 *             documents or a window, else 32 there; 16 above, two buffers of them to D 128
 *             (ATT_DKV_DYN), one past it);
 *             dQ: ATT_TBR_Q query rows a block (128 at D <= 64: ATT_QMT = 2 m-tiles of 16
 *             rows a warp; 64 above, and at D 64 with dropout and context parallelism),
 *             ATT_TBC_Q key rows per step (16 at D 48 and 64, and above with dropout and
 *             context parallelism; else 32);
 *             SIMT (fp32): ATT_BR rows kept per block (64 for D <= 32, 32 for D <= 64, 16
 *             above), ATT_BC rows per step (32 for D <= 64, 16 above)
 * Wide (D past 128, to 256: ATT_WIDE, ATT_DYN): the forward fits static shared memory with 16
 * keys a step; the backward kernels take their tiles from dynamic shared memory (ATT_SHARED:
 * at D 256 84,480 bytes in 16 bits, 65,792 in fp32, under the 99 KiB every sm_80+ GPU gives a
 * block); the 16-bit dQ kernel reads Q and dO from shared memory (its dQ accumulators, 128
 * floats a thread, take the registers) and keeps one buffer of 16 keys; the 16-bit dK/dV
 * kernel runs ATT_DKV_NS = 2 blocks a key tile, each computing S and dP whole and
 * accumulating half of dK's and dV's columns (both whole would be 256 floats a thread).
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
#ifndef MGC_DROP
#define MGC_DROP 1
#endif
#ifndef MGC_ROWPOS
#define MGC_ROWPOS 0
#endif
#ifndef MGC_DOCS
#define MGC_DOCS 0
#endif
#ifndef MGC_WIN
#define MGC_WIN 0 /* a sliding window of MGC_WIN keys (causal only); 0 none */
#endif
#ifndef MGC_CS
#define MGC_CS 0 /* the backward kernels sum dqkv's columns (16-bit, fused qkv only) */
#endif
#if MGC_CS && !MGC_HALF
#error "attention.cuh: the column sums (CS) are the 16-bit backward's"
#endif
#if MGC_WIN && !MGC_CAUSAL
#error "attention.cuh: a sliding window needs the causal mask"
#endif
/* a per-row lower bound on the visible keys' positions: documents, a window or both */
#define ATT_LOWER (MGC_DOCS || MGC_WIN)
/* dropout draws happen only in kernels built with MGC_DROP (codegen/kspec_attention.c) */
#define ATT_DROPPING(p) (MGC_DROP && (p) > 0.0f)

#define ATT_D ((int)MGC_D)
/* the width the kernels compute over: D rounded up to the mma k-step of 16 (zero columns past D) */
#define ATT_W ((ATT_D + 15) / 16 * 16)
#define ATT_NT 128
/* head dims past 128 (to 256): the backward's tiles take dynamic shared memory (ATT_DYN) and
 * the 16-bit dK/dV kernel computes half of the columns a block (ATT_DKV_NS) */
#define ATT_WIDE (ATT_W > 128)
#if MGC_HALF
/* 16-bit forward: tensor cores, ATT_FMT m-tiles of 16 query rows per warp: at D <= 64 two, so
 * that every K and V fragment read from shared memory feeds two mma (shared-memory reads per
 * mma halved); at D = 128 one (the registers) */
#define ATT_FMT (ATT_W <= 64 ? 2 : 1)
#define ATT_FBQ (64 * ATT_FMT)
/* keys a step (ATT_FBK_PP, a number the preprocessor sees: D <= 64 is ATT_W <= 64, and so on):
 * 64 to D 128 (S of a warp 32 x 64 at D 64: 240 registers; 16 x 64 at D 128: 219), but 32 from
 * D 48 with dropout or a per-row lower bound (the Philox state or the bounds would spill it at
 * D 64, or leave it at 255), 16 past D 128.  Two buffers of 64 keys pass the 48 KiB of static
 * shared memory past D 64: there the K and V tiles take the launch's dynamic shared memory
 * (ATT_FWD_DYN, 69,632 bytes at D 128; runtime/cuda_ops_attention.c fwd_dyn_bytes repeats the
 * rule).  MGC_FBK (a kernel constant only under MGC_ATT_FWD_KEYS, for A/B timings: 16, 32 or
 * 64 to D 128) overrides it. */
#ifdef MGC_FBK
#define ATT_FBK_PP MGC_FBK
#if MGC_D > 128 || (MGC_FBK != 16 && MGC_FBK != 32 && MGC_FBK != 64)
#error "attention.cuh: FBK (keys a forward step) is 16, 32 or 64, and only to D 128"
#endif
#elif MGC_D <= 32 || (MGC_D <= 128 && !MGC_DROP && !MGC_DOCS && !MGC_WIN)
#define ATT_FBK_PP 64
#elif MGC_D <= 128
#define ATT_FBK_PP 32
#else
#define ATT_FBK_PP 16
#endif
#define ATT_FBK ((int)ATT_FBK_PP)
/* the forward's buffers of K and V tiles at 64 keys past D 64 to 128: two (the next tile
 * fetched while this one is computed; 69,632 bytes of dynamic shared memory at D 128, so one
 * block a multiprocessor on the GPUs with 100 KB: sm_86, sm_89, sm_120), or one (MGC_FKVB =
 * 1: 34,944 bytes of static shared memory at D 128, each tile fetched after the last was done,
 * two blocks a multiprocessor there).  The same bits either way.  The launcher takes the
 * one-buffer twin where the device's shared memory holds more blocks of it
 * (codegen/kspec_attention.c mgc_kspec_twin); MGC_ATT_FWD_BUFS sets it for A/B timings. */
#ifdef MGC_FKVB
#if !MGC_HALF || MGC_D <= 64 || MGC_D > 128 || ATT_FBK_PP != 64 || (MGC_FKVB != 1 && MGC_FKVB != 2)
#error "attention.cuh: FKVB (the 16-bit forward's K/V buffers) is 1 or 2, 64 keys, D 72 to 128"
#endif
#define ATT_FWD_NB_PP MGC_FKVB
#else
#define ATT_FWD_NB_PP 2
#endif
#define ATT_FWD_DYN (MGC_D > 64 && ATT_FBK_PP == 64 && ATT_FWD_NB_PP == 2)
#else
#define ATT_FBQ (ATT_W <= 64 ? 64 : ATT_W <= 128 ? 32 : 16)
#define ATT_FBK (ATT_W <= 32 ? 64 : ATT_W <= 128 ? 32 : 16)
#endif
#define ATT_BR (ATT_W <= 32 ? 64 : (ATT_W <= 64 ? 32 : 16))
#define ATT_BC (ATT_W <= 64 ? 32 : 16)
#define ATT_DC (ATT_W / 16) /* columns of D per thread */
/* the 16-bit backward runs on tensor cores; at D = 128 the steps are shorter so that the
 * dK/dV accumulators (128 floats a thread) fit in 255 registers without spilling */
#define ATT_TC_BWD (MGC_HALF)
#define ATT_TBR 64 /* tensor-core backward: rows owned per block (16 per warp) */
/* dropout with the positions computed (context parallelism): the Philox state and the position
 * arithmetic take the registers of a second m-tile at D 64, of 16 key rows at D > 64 */
#define ATT_DROPPOS (MGC_DROP && !MGC_ROWPOS)
/* dK/dV: query rows per step, 64 to D 64 without dropout, documents or a window (245-254
 * registers at D 64), else 32 from D 48 (with dropout D 64 spilled at 64 rows), 16 above;
 * MGC_KVR (a kernel constant only under MGC_ATT_DKV_ROWS, for A/B timings: 16, 32 or 64 to
 * D 64) overrides it.  The launcher does not depend on it. */
#ifdef MGC_KVR
#if MGC_D > 64 || (MGC_KVR != 16 && MGC_KVR != 32 && MGC_KVR != 64)
#error "attention.cuh: KVR (the dK/dV kernel's query rows a step) is 16, 32 or 64, and only to D 64"
#endif
#define ATT_TBC_KV ((int)MGC_KVR)
#else
#define ATT_TBC_KV (ATT_W <= 32 || (ATT_W <= 64 && !MGC_DROP && !ATT_LOWER) ? 64 : ATT_W <= 64 ? 32 : 16)
#endif
/* dK/dV: buffers of the query-side tiles (Q, dO, lse, dsum): two, the next tile fetched while
 * this one is computed; one past D 128 (ATT_DYN: two would pass 99 KiB).  Past D 64, to 128, the
 * 16-bit kernel stages K and V in shared memory too (ATT_KV_SMEM), so two buffers pass the
 * 48 KiB of static shared memory: there the four tiles take the launch's dynamic shared memory
 * (ATT_DKV_DYN: 192 (W + 8) 2 bytes, 52,224 at D 128; runtime/cuda_ops_attention.c
 * dkv_dyn_bytes repeats the rule).  Until 2026-12-06 that kernel kept one buffer, each tile
 * fetched after the last was done.  MGC_KVB (a kernel constant only under MGC_ATT_DKV_BUFS,
 * for A/B timings: 1 or 2, 16-bit, past D 64 to 128) overrides it: the same bits either way. */
#ifdef MGC_KVB
#if MGC_D <= 64 || MGC_D > 128 || (MGC_KVB != 1 && MGC_KVB != 2)
#error "attention.cuh: KVB (the dK/dV kernel's query-tile buffers) is 1 or 2, past D 64 to 128"
#endif
#define ATT_DKV_NB_PP MGC_KVB
#elif MGC_D > 128
#define ATT_DKV_NB_PP 1
#else
#define ATT_DKV_NB_PP 2
#endif
#define ATT_DKV_DYN (MGC_HALF && MGC_D > 64 && MGC_D <= 128 && ATT_DKV_NB_PP == 2)
#define ATT_QMT (ATT_W < 64 || (ATT_W == 64 && !ATT_DROPPOS) ? 2 : 1) /* dQ: m-tiles of 16 rows */
#define ATT_TBR_Q (64 * ATT_QMT)            /* dQ: query rows a block */
#define ATT_TBC_Q ((ATT_W > 32 && ATT_W <= 64) || (ATT_W > 64 && ATT_DROPPOS) || ATT_WIDE ? 16 : 32) /* dQ: keys a step */
#define ATT_KV_SMEM (MGC_D > 64) /* dK/dV: K, V A operands from shared memory (ATT_W > 64; #if) */
/* wide (#if: MGC_D > 128, ATT_W > 128): the backward's tiles in dynamic shared memory
 * (ATT_SHARED); the 16-bit dQ kernel reads Q and dO from shared memory (its dQ accumulators
 * take the registers), and the 16-bit dK/dV kernel's ATT_DKV_NS blocks a key tile each
 * accumulate a slice of dK's and dV's columns (both whole, 256 floats a thread, would not fit
 * the registers), S and dP computed by each over the whole width */
#define ATT_DYN (MGC_D > 128)
#define ATT_DKV_NS (ATT_WIDE ? 2 : 1)
#define ATT_LOG2E 1.4426950408889634f
#define ATT_LN2 0.6931471805599453f

#if MGC_D % 8 != 0 || MGC_D < 8 || MGC_D > 256
#error "attention.cuh: D must be a multiple of 8 from 8 to 256"
#endif

/* ---- shared memory: static, or (ATT_DYN) carved from the launch's dynamic shared memory ---- */

/* ATT_SHARED(T, name, dims) declares the array `T name dims` in shared memory (ATT_SHARED16:
 * 16-byte aligned, for vector and ldmatrix access): a static one,
 * or under ATT_DYN (head dims past 128, whose backward tiles pass the 48 KiB of static shared
 * memory) a reference to the next 16-byte aligned piece of the launch's dynamic shared memory,
 * after ATT_DYN_BEGIN; ATT_DYN_END then traps when the launch gave less than the pieces
 * (runtime/cuda_ops_attention.c bwd_dyn_bytes and fwd_dyn_bytes repeat the sums). */
__device__ __forceinline__ unsigned char *att_dyn_take(unsigned char *base, unsigned &off,
                                                       unsigned bytes) {
    unsigned char *p = base + off;
    off += (bytes + 15u) & ~15u;
    return p;
}
/* the dynamic pieces themselves, for any kernel that takes them (the 16-bit forward's K and V
 * past D 64, ATT_FWD_DYN); ATT_SHARED below is one of these under ATT_DYN */
#ifdef MGC_EMU
#define ATT_DYN_BEGIN_D                                                                          \
    MGC_DYN_SHARED(unsigned char, att_dyn_);                                                     \
    unsigned att_off_ = 0
#else
#define ATT_DYN_BEGIN_D                                                                          \
    extern __shared__ __align__(16) unsigned char att_dyn_[];                                    \
    unsigned att_off_ = 0
#endif
#define ATT_SHARED_D(T, name, dims)                                                              \
    T(&name) dims = *reinterpret_cast<T(*) dims>(att_dyn_take(att_dyn_, att_off_, sizeof(T dims)))
#define ATT_DYN_END_D                                                                            \
    do {                                                                                         \
        if (att_off_ > mgc_dyn_bytes()) mgc_trap();                                              \
    } while (0)
#if ATT_DYN
#define ATT_DYN_BEGIN ATT_DYN_BEGIN_D
#define ATT_SHARED(T, name, dims) ATT_SHARED_D(T, name, dims)
#define ATT_SHARED16(T, name, dims) ATT_SHARED_D(T, name, dims)
#define ATT_DYN_END ATT_DYN_END_D
#else
#define ATT_DYN_BEGIN do {} while (0)
#define ATT_SHARED(T, name, dims) __shared__ T name dims
#define ATT_SHARED16(T, name, dims) __shared__ __align__(16) T name dims
#define ATT_DYN_END do {} while (0)
#endif

/* ---- the order of the blocks ------------------------------------------------------------ */

/* The block's tile (the grid's x), batch row (y) and head (z), dispatched tiles slowest: blocks
 * start in the order of their linear index, so the first blocks of the grid are tile 0 of
 * every (batch row, head), then every tile 1, and so on.  Under a causal mask the callers make
 * tile 0 the one with the most work (the last query tile, the first key tile), so the longest
 * blocks start first and the last to start are the shortest: longest-processing-time-first
 * order.  With the tile fastest, the last (batch row, head) started its longest tile near the
 * end, while the other multiprocessors ran out of work (a simulation of GPT-2 124M's grids put
 * the tail at about 20% of the dK/dV kernel's time and 37% of the forward's).  A permutation
 * of the blocks: each computes what it did before, so no bit changes. */
__device__ __forceinline__ void att_block_ids(int &tile, int &bi, int &h) {
    typedef unsigned long long u64;
    const u64 yz = (u64)gridDim.y * gridDim.z;
    const u64 lin = blockIdx.x + (u64)gridDim.x * (blockIdx.y + (u64)gridDim.y * blockIdx.z);
    const u64 p = lin % yz;
    tile = (int)(lin / yz), bi = (int)(p % gridDim.y), h = (int)(p / gridDim.y);
}

/* A query tile's index for att_block_ids' tile t: under a causal mask the last query tiles see
 * the most keys, so they go first. */
__device__ __forceinline__ int att_qtile(int t) {
    return MGC_CAUSAL ? (int)gridDim.x - 1 - t : t;
}

__device__ __forceinline__ float att_ninf(void) {
    return __int_as_float(0xff800000);
}

/* ---- positions (runtime/cpu_backend.c ctx_positions, gathered_positions) ---------------- */

__device__ __forceinline__ int att_ctx_pos(int row, int s, int cp, int r) {
    if (MGC_ROWPOS || cp <= 1) return row;
    int half = s / (2 * cp);
    return row < half ? r * half + row : (2 * cp - 1 - r) * half + (row - half);
}
__device__ __forceinline__ int att_qpos(const int *qpos, int i, int s, int cp, int rank) {
    if (MGC_ROWPOS) return i;
    return qpos ? qpos[i] : att_ctx_pos(i, s, cp, rank);
}
__device__ __forceinline__ int att_kpos(const int *kpos, int j, int sk, int s, int cp, int rank,
                                        int gathered) {
    if (MGC_ROWPOS) return j;
    if (kpos) return kpos[j];
    if (cp <= 1) return j;
    if (!gathered) return att_ctx_pos(j, s, cp, rank);
    int per = sk / cp, q = j / per;
    return att_ctx_pos(j - q * per, s, cp, q);
}

/* The first position query row i (at position qp) sees.  Documents (MGC_DOCS,
 * data.reset_attention_mask): docs (sq, b) holds the position each row's document starts at;
 * a sliding window (MGC_WIN, model.window_size): qp - MGC_WIN + 1; the later of the two.  A
 * key before it is invisible to the row. */
__device__ __forceinline__ int att_lo_at(int lo, int qp) { /* lo: the row's document start */
    if (MGC_WIN && qp - MGC_WIN + 1 > lo) lo = qp - MGC_WIN + 1;
    return lo;
}
__device__ __forceinline__ int att_lo(const int *docs, int i, int b, int bi, int qp) {
    return att_lo_at(MGC_DOCS ? docs[(i64)i * b + bi] : 0, qp);
}
#define ATT_DOC_OK(kp_, ds_) (!ATT_LOWER || (kp_) >= (ds_))

/* A sliding window also bounds which tiles a block visits: a key tile the block's queries see
 * holds a key at or after qlo = (the block's smallest query position) - MGC_WIN + 1, and a
 * query tile a key block is seen from holds a query at or before its largest key position +
 * MGC_WIN - 1.  Without a window qlo is INT_MIN, and the bounds test nothing. */
#define ATT_WIN_LO(qmin_) (MGC_WIN ? (qmin_) - MGC_WIN + 1 : -2147483647 - 1)

/* 2^x in one MUFU.EX2 (ex2.approx.ftz: 2 ulp, as exp2f's, with subnormal results flushed to 0;
 * exp2f adds a range test and two multiplies for them, on every element); 2^-inf = 0 */
__device__ __forceinline__ float att_exp2(float x) {
#ifdef MGC_EMU
    return exp2f(x);
#else
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
    return y;
#endif
}

/* keep / (1-p) of probability (bi, a, qp, kp) (qp, kp: positions; the Philox word of
 * mgc_common.cuh), or 1 when p = 0 */
__device__ __forceinline__ float att_keep(float p, unsigned thr, float dscale,
                                          unsigned long long seed, unsigned long long stream,
                                          unsigned long long elem0, int bi, int a, int qp, int kp,
                                          int heads, int s) {
    if (!(p > 0.0f)) return 1.0f;
    unsigned long long e =
        elem0 + (unsigned long long)((((i64)bi * heads + a) * s + qp) * (i64)s + kp);
    return mgc_philox_word(seed, stream, e) >= thr ? dscale : 0.0f;
}
/* the dropout stream with the step's part, read from `step` (mgc_step_stream): every kernel's
 * first statement after mgc_pdl_begin */
#define ATT_STEP_STREAM                                                                          \
    do {                                                                                         \
        if (ATT_DROPPING(drop_p)) stream = mgc_step_stream(stream, step);                        \
    } while (0)
/* the multiplier of query row i_ and key row j_ of head a, batch row bi (every kernel's names) */
#define ATT_KEEP(i_, j_)                                                                         \
    att_keep(drop_p, drop_thr, drop_scale, seed, stream, elem0, bi, a,                           \
             att_qpos(qpos, (i_), pos_s, pos_cp, pos_rank),                                      \
             att_kpos(kpos, (j_), sk, pos_s, pos_cp, pos_rank, k_gathered), drop_heads, pos_s)

/* Loads rows [r0, r0 + ROWS) of head h of x (n, b, H, D) for batch row bi into sh[ROWS][W+1]
 * as fp32; rows past n and columns past D are 0.  Here and below the block is ATT_NT threads
 * (every kernel's), so the trip counts are constants. */
template <int ROWS>
__device__ __forceinline__ void att_load_tile(float (*sh)[ATT_W + 1], const mgc_t *x, int r0,
                                              int n, int b, int H, int bi, int h) {
    constexpr int N = ROWS * ATT_W;
#pragma unroll 4
    for (int it = 0; it < (N + ATT_NT - 1) / ATT_NT; it++) {
        const int idx = (int)threadIdx.x + it * ATT_NT;
        const int r = idx / ATT_W, c = idx % ATT_W, i = r0 + r;
        if (N % ATT_NT == 0 || idx < N)
            sh[r][c] = i < n && (ATT_W == ATT_D || c < ATT_D)
                           ? mgc_ld(x[(((i64)i * b + bi) * H + h) * ATT_D + c])
                           : 0.0f;
    }
}

/* The SIMT kernels' tile products over the head dim, tile row r = ty + 8 m against tile column
 * tx + 16 n: s[m][n] = a[r] . b[col] and, when TWO, t[m][n] = c[r] . d[col] in the same loop
 * (the backward's S and dP, each side's two tiles read together). */
template <int RM, int RN, bool TWO>
__device__ __forceinline__ void att_simt_dots(float (&s)[RM][RN], float (&t)[RM][RN],
                                              const float (*a)[ATT_W + 1], const float (*b)[ATT_W + 1],
                                              const float (*c)[ATT_W + 1], const float (*d)[ATT_W + 1],
                                              int ty, int tx) {
#pragma unroll
    for (int m = 0; m < RM; m++)
#pragma unroll
        for (int n = 0; n < RN; n++) {
            s[m][n] = 0.0f;
            if (TWO) t[m][n] = 0.0f;
        }
#pragma unroll 4
    for (int k = 0; k < ATT_D; k++) {
        float ar[RM], br[RN], cr[RM], dr[RN];
#pragma unroll
        for (int m = 0; m < RM; m++) {
            ar[m] = a[ty + 8 * m][k];
            if (TWO) cr[m] = c[ty + 8 * m][k];
        }
#pragma unroll
        for (int n = 0; n < RN; n++) {
            br[n] = b[tx + 16 * n][k];
            if (TWO) dr[n] = d[tx + 16 * n][k];
        }
#pragma unroll
        for (int m = 0; m < RM; m++)
#pragma unroll
            for (int n = 0; n < RN; n++) {
                s[m][n] = fmaf(ar[m], br[n], s[m][n]);
                if (TWO) t[m][n] = fmaf(cr[m], dr[n], t[m][n]);
            }
    }
}

/* Where q, k, v (and dq, dk, dv) live (the kernels' `qkv` argument).  qkv = 0: their own
 * tensors q (s, b, A, D), k and v (s, b, G, D).  qkv = 1: the fused projection (s, b, G (PER +
 * 2) D), PER = A / G, group g's PER query heads then its key then its value: q points at it, k
 * at it + PER D, v at it + (PER + 1) D (the launcher's), and the row of (i, bi) is A + 2G head
 * widths long.  The tile helpers address ((i b + bi) H + h) D: these give H and h. */
__device__ __forceinline__ int att_qH(int qkv, int A, int G) {
    return qkv ? A + 2 * G : A;
}
__device__ __forceinline__ int att_qh(int qkv, int A, int G, int a) {
    const int per = A / G;
    return qkv ? (a / per) * (per + 2) + a % per : a;
}
__device__ __forceinline__ int att_kH(int qkv, int A, int G) {
    return qkv ? A + 2 * G : G;
}
__device__ __forceinline__ int att_kh(int qkv, int A, int G, int g) {
    return qkv ? g * (A / G + 2) : g;
}
#define ATT_KV_VIEWS                                                                             \
    const int qH = att_qH(qkv, A, G), kH = att_kH(qkv, A, G), kh = att_kh(qkv, A, G, g)
#define ATT_QKV_VIEWS                                                                            \
    ATT_KV_VIEWS;                                                                                \
    const int qh = att_qh(qkv, A, G, a)

/* block-wide max of an int held by threads tid < n (others pass anything); all get it */
__device__ __forceinline__ int att_block_max_int(int v, int valid, float *red) {
    float f = valid ? (float)v : att_ninf();
    f = mgc_block_max(f, red);
    return f == att_ninf() ? -2147483647 - 1 : (int)f;
}

#if MGC_HALF
#if MGC_BF16
#define ATT_MMA_TYPES "bf16.bf16"
#else
#define ATT_MMA_TYPES "f16.f16"
#endif
/* c += a (16x16, row) * b (16x8, col): bf16 (fp16) inputs, fp32 accumulators.  Fragments (lane =
 * 4 grp + tig): a0 (row grp, k 2tig..+1), a1 (row grp+8, same k), a2/a3 (k + 8); b0 (k 2tig..+1,
 * col grp), b1 (k + 8); c0,c1 (row grp, cols 2tig..+1), c2,c3 (row grp+8). */
__device__ __forceinline__ void att_mma(float c[4], const unsigned a[4], unsigned b0,
                                        unsigned b1) {
#ifdef MGC_EMU
    mgc_emu_mma(__LINE__, MGC_FP16, c, a, b0, b1);
#else
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32." ATT_MMA_TYPES ".f32 {%0,%1,%2,%3}, "
                 "{%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#endif
}
/* four 8x8 16-bit matrices from shared memory: lane l gives the address of row l % 8 of matrix
 * l / 8; r[m] is matrix m's fragment: lane 4 grp + tig holds (row grp, cols 2tig..+1), or with
 * TRANS (rows 2tig..+1, col grp) */
template <bool TRANS>
__device__ __forceinline__ void att_ldsm4(unsigned (&r)[4], const unsigned short *p) {
#ifdef MGC_EMU
    mgc_emu_ldsm4(__LINE__, TRANS, r, p);
#else
    unsigned a = (unsigned)__cvta_generic_to_shared(p);
    if (TRANS)
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                     : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                     : "r"(a));
    else
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                     : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                     : "r"(a));
#endif
}

/* Stages rows [r0, r0 + ROWS) of head h of x (n, b, H, D) for batch row bi into
 * sh[ROWS][W + 8] (16-bit storage, row-major); rows past n and columns past D are 0.  16-byte
 * loads, W / 8 consecutive lanes per row (coalesced; rows are 16-byte aligned: the arena is
 * 256-aligned, D a multiple of 8).
 * The 8-element pad keeps ldmatrix's eight row addresses in distinct banks. */
template <int ROWS>
__device__ __forceinline__ void att_stage(unsigned short (*sh)[ATT_W + 8], const mgc_t *x,
                                          int r0, int n, int b, int H, int bi, int h) {
    constexpr int N = ROWS * (ATT_W / 8);
#pragma unroll
    for (int it = 0; it < (N + ATT_NT - 1) / ATT_NT; it++) {
        const int idx = (int)threadIdx.x + it * ATT_NT;
        if (N % ATT_NT != 0 && idx >= N) break;
        int rr = idx / (ATT_W / 8), c8 = idx % (ATT_W / 8), i = r0 + rr;
        uint4 v = make_uint4(0u, 0u, 0u, 0u);
        if (i < n && (ATT_W == ATT_D || c8 < ATT_D / 8))
            v = ((const uint4 *)(x + (((i64)i * b + bi) * H + h) * ATT_D))[c8];
        *(uint4 *)&sh[rr][8 * c8] = v;
    }
}

/* att_stage through cp.async (sm_80+): the copies land without passing through registers while
 * the block computes; att_cp_wait<N> waits until at most N of this thread's committed groups
 * are in flight (a barrier then makes every thread's copies visible).  Rows past n are
 * zero-filled (source size 0; the address is row 0's, which exists). */
__device__ __forceinline__ void att_cp16(void *dst, const void *src, bool ok) {
#ifdef MGC_EMU
    mgc_emu_cp_async(dst, src, 16, ok);
#else
    unsigned d = (unsigned)__cvta_generic_to_shared(dst);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(d), "l"(src),
                 "r"(ok ? 16 : 0));
#endif
}
__device__ __forceinline__ void att_cp4(void *dst, const void *src, bool ok) {
#ifdef MGC_EMU
    mgc_emu_cp_async(dst, src, 4, ok);
#else
    unsigned d = (unsigned)__cvta_generic_to_shared(dst);
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(d), "l"(src),
                 "r"(ok ? 4 : 0));
#endif
}
__device__ __forceinline__ void att_cp_commit(void) {
#ifdef MGC_EMU
    mgc_emu_cp_commit();
#else
    asm volatile("cp.async.commit_group;\n" ::);
#endif
}
template <int N>
__device__ __forceinline__ void att_cp_wait(void) {
#ifdef MGC_EMU
    mgc_emu_cp_wait(N);
#else
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
#endif
}
template <int ROWS>
__device__ __forceinline__ void att_stage_async(unsigned short (*sh)[ATT_W + 8], const mgc_t *x,
                                                int r0, int n, int b, int H, int bi, int h) {
    constexpr int N = ROWS * (ATT_W / 8);
#pragma unroll
    for (int it = 0; it < (N + ATT_NT - 1) / ATT_NT; it++) {
        const int idx = (int)threadIdx.x + it * ATT_NT;
        if (N % ATT_NT != 0 && idx >= N) break;
        int rr = idx / (ATT_W / 8), c8 = idx % (ATT_W / 8), i = r0 + rr;
        const bool ok = i < n && (ATT_W == ATT_D || c8 < ATT_D / 8); /* else zero-filled */
        const mgc_t *row = x + (((i64)(i < n ? i : 0) * b + bi) * H + h) * ATT_D;
        att_cp16(&sh[rr][8 * c8], row + 8 * (ATT_W == ATT_D || ok ? c8 : 0), ok);
    }
}

/* The A fragments (mma m16n8k16, see att_mma) of rows r[0], r[1] (grp, grp + 8 of the warp's
 * 16) of head h of x (n, b, H, D), straight from global memory; rows past n and columns past D
 * (the upper 8 of the last k-step when D is an odd multiple of 8) are 0. */
__device__ __forceinline__ void att_load_afrag(unsigned (&f)[ATT_W / 16][4], const mgc_t *x,
                                               const int r[2], int n, int b, int H, int bi,
                                               int h, int tig) {
#pragma unroll
    for (int hh = 0; hh < 2; hh++) {
        bool ok = r[hh] < n;
        const unsigned *row =
            (const unsigned *)(x + (((i64)(ok ? r[hh] : 0) * b + bi) * H + h) * ATT_D);
#pragma unroll
        for (int ks = 0; ks < ATT_W / 16; ks++) {
            f[ks][hh] = ok ? row[8 * ks + tig] : 0u;
            f[ks][hh + 2] =
                ok && (ATT_W == ATT_D || 16 * ks + 8 < ATT_D) ? row[8 * ks + tig + 4] : 0u;
        }
    }
}

/* acc[mt][dt] += A_mt (16 x NK: accumulator-layout fp32 values x[mt][NK/8][4], rounded to the
 * storage type) times B (NK x D) = the staged tile t[NK][D] itself (ldmatrix.trans), for MT
 * m-tiles: each B fragment read once feeds MT mma.  Per m-tile the sums and their order are
 * MT = 1's.  DTN < ATT_W / 8: the n-tiles of columns c0 .. c0 + 8 DTN - 1 only, those before
 * ATT_W (ATT_DKV_NS: DTN is even and c0 a multiple of 16, so pairs of n-tiles are whole). */
template <int NK, int MT, int DTN = ATT_W / 8>
__device__ __forceinline__ void att_mma_acc_mt(float (&acc)[MT][DTN][4],
                                               const float (&x)[MT][NK / 8][4],
                                               const unsigned short (*t)[ATT_W + 8], int lane,
                                               int c0 = 0) {
    const int m = lane >> 3, rr = lane & 7;
#pragma unroll
    for (int pk = 0; pk < NK / 16; pk++) {
        unsigned pa[MT][4];
#pragma unroll
        for (int mt = 0; mt < MT; mt++) {
            pa[mt][0] = mgc_pack2(x[mt][2 * pk][0], x[mt][2 * pk][1]);
            pa[mt][1] = mgc_pack2(x[mt][2 * pk][2], x[mt][2 * pk][3]);
            pa[mt][2] = mgc_pack2(x[mt][2 * pk + 1][0], x[mt][2 * pk + 1][1]);
            pa[mt][3] = mgc_pack2(x[mt][2 * pk + 1][2], x[mt][2 * pk + 1][3]);
        }
#pragma unroll
        for (int dt = 0; dt < DTN; dt += 2) { /* matrices: (k lo, dt) (k hi, dt) (.., dt+1) */
            if (c0 + 8 * dt >= ATT_W) break; /* never with the whole width (c0 = 0) */
            unsigned bf[4];
            att_ldsm4<true>(bf, &t[16 * pk + 8 * (m & 1) + rr][c0 + 8 * (dt + (m >> 1))]);
#pragma unroll
            for (int mt = 0; mt < MT; mt++) {
                att_mma(acc[mt][dt], pa[mt], bf[0], bf[1]);
                att_mma(acc[mt][dt + 1], pa[mt], bf[2], bf[3]);
            }
        }
    }
}
template <int NK, int DTN = ATT_W / 8>
__device__ __forceinline__ void att_mma_acc(float (&acc)[DTN][4], const float (&x)[NK / 8][4],
                                            const unsigned short (*t)[ATT_W + 8], int lane,
                                            int c0 = 0) {
    att_mma_acc_mt<NK, 1, DTN>(reinterpret_cast<float(&)[1][DTN][4]>(acc),
                               reinterpret_cast<const float(&)[1][NK / 8][4]>(x), t, lane, c0);
}

/* s[mt][nt] = A_mt (16 x D, fragments f[mt]) times B (D x NN) = the staged tile t[NN][D]
 * transposed (ldmatrix), for MT m-tiles sharing each B fragment. */
template <int NN, int MT>
__device__ __forceinline__ void att_mma_rows_mt(float (&s)[MT][NN / 8][4],
                                                const unsigned (&f)[MT][ATT_W / 16][4],
                                                const unsigned short (*t)[ATT_W + 8], int lane) {
    const int m = lane >> 3, rr = lane & 7;
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int nt = 0; nt < NN / 8; nt++)
            s[mt][nt][0] = s[mt][nt][1] = s[mt][nt][2] = s[mt][nt][3] = 0.0f;
#pragma unroll
    for (int nt = 0; nt < NN / 8; nt += 2) /* matrices: (nt, k lo) (nt, k hi) (nt+1, ..) */
#pragma unroll
        for (int ks = 0; ks < ATT_W / 16; ks++) {
            unsigned bf[4];
            att_ldsm4<false>(bf, &t[8 * (nt + (m >> 1)) + rr][16 * ks + 8 * (m & 1)]);
#pragma unroll
            for (int mt = 0; mt < MT; mt++) {
                att_mma(s[mt][nt], f[mt][ks], bf[0], bf[1]);
                att_mma(s[mt][nt + 1], f[mt][ks], bf[2], bf[3]);
            }
        }
}
template <int NN>
__device__ __forceinline__ void att_mma_rows(float (&s)[NN / 8][4], const unsigned (&f)[ATT_W / 16][4],
                                             const unsigned short (*t)[ATT_W + 8], int lane) {
    att_mma_rows_mt<NN, 1>(reinterpret_cast<float(&)[1][NN / 8][4]>(s),
                           reinterpret_cast<const unsigned(&)[1][ATT_W / 16][4]>(f), t, lane);
}

/* att_mma_rows with A read from shared memory too: rows arow .. arow + 15 of the staged tile
 * at[.][D] (ldmatrix: matrices (rows lo, k lo) (rows hi, k lo) (rows lo, k hi) (rows hi, k hi)
 * are a0..a3).  The same sums in the same order; 4 registers of A live instead of 2 D. */
template <int NN>
__device__ __forceinline__ void att_mma_rows_sa(float (&s)[NN / 8][4],
                                                const unsigned short (*at)[ATT_W + 8], int arow,
                                                const unsigned short (*t)[ATT_W + 8], int lane) {
    const int m = lane >> 3, rr = lane & 7;
#pragma unroll
    for (int nt = 0; nt < NN / 8; nt++) s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.0f;
#pragma unroll
    for (int ks = 0; ks < ATT_W / 16; ks++) {
        unsigned af[4];
        att_ldsm4<false>(af, &at[arow + 8 * (m & 1) + rr][16 * ks + 8 * (m >> 1)]);
#pragma unroll
        for (int nt = 0; nt < NN / 8; nt += 2) {
            unsigned bf[4];
            att_ldsm4<false>(bf, &t[8 * (nt + (m >> 1)) + rr][16 * ks + 8 * (m & 1)]);
            att_mma(s[nt], af, bf[0], bf[1]);
            att_mma(s[nt + 1], af, bf[2], bf[3]);
        }
    }
}

/* Stores the warp's 16 x D accumulator rows r[0], r[1] of head h into y (n, b, H, D), rounded
 * (its columns past D, ATT_W's zero padding, are not stored); DTN < ATT_W / 8: the columns c0
 * .. c0 + 8 DTN - 1 (ATT_DKV_NS). */
template <int DTN = ATT_W / 8>
__device__ __forceinline__ void att_store_acc(mgc_t *y, const float (&acc)[DTN][4],
                                              const int r[2], int n, int b, int H, int bi, int h,
                                              int tig, int c0 = 0) {
#pragma unroll
    for (int hh = 0; hh < 2; hh++) {
        if (r[hh] >= n) continue;
        unsigned *row = (unsigned *)(y + (((i64)r[hh] * b + bi) * H + h) * ATT_D + c0);
#pragma unroll
        for (int dt = 0; dt < DTN; dt++)
            if (c0 + 8 * dt < ATT_D)
                row[4 * dt + tig] = mgc_pack2(acc[dt][2 * hh], acc[dt][2 * hh + 1]);
    }
}

#if MGC_CS
/* The QKV projection's bias gradient, summed where the backward stores dqkv (MGC_CS, fused qkv
 * only; runtime/cuda_ops_attention.c adds the partials with norm.cuh norm_bwd_reduce): the
 * block's 64-row tile of rows r (16 a warp: acc as att_store_acc's, columns c0 .. c0 + 8 DTN -
 * 1 of the head) summed into part[c0 ..] (the tile's row of partials, at the head's first
 * column), the values as stored (rounded to the storage type), rows past n as 0.  Order: a
 * thread's rows grp, grp + 8, then the 8 row groups by xor-shuffles 4, 8, 16, then the warps 0
 * to 3.  red: 4 x 8 DTN floats of shared memory no thread reads or writes any more (the
 * kernel's last tile buffer; a call's first barrier also ends the reads of a call before);
 * every thread of the block calls it. */
template <int DTN>
__device__ __forceinline__ void att_colsum(float *__restrict__ part, const float (&acc)[DTN][4],
                                           const int r[2], int n, int c0, float *red) {
    constexpr int NC = 8 * DTN;
    const int tid = threadIdx.x, w = tid >> 5, grp = (tid & 31) >> 2, tig = tid & 3;
    __syncthreads(); /* every warp is done with red: the last tile's, or a call before's */
#pragma unroll
    for (int dt = 0; dt < DTN; dt++)
#pragma unroll
        for (int e = 0; e < 2; e++) {
            float x = r[0] < n ? mgc_ld(mgc_st(acc[dt][e])) : 0.0f;
            float y = r[1] < n ? mgc_ld(mgc_st(acc[dt][2 + e])) : 0.0f;
            float t = x + y;
            t += __shfl_xor_sync(0xffffffffu, t, 4);
            t += __shfl_xor_sync(0xffffffffu, t, 8);
            t += __shfl_xor_sync(0xffffffffu, t, 16);
            if (grp == 0) red[w * NC + 8 * dt + 2 * tig + e] = t;
        }
    __syncthreads();
    for (int c = tid; c < NC; c += ATT_NT)
        if (c0 + c < ATT_D)
            part[c0 + c] = ((red[c] + red[NC + c]) + red[2 * NC + c]) + red[3 * NC + c];
}
/* the row of partials of (batch row bi, 64-row tile at row r0), at the first column of head h
 * of a qkv row (H heads of D) */
__device__ __forceinline__ float *att_cs_row(float *cs, int bi, int r0, int n, int H, int h) {
    static_assert(ATT_TBR == 64 && ATT_TBR_Q % 64 == 0, "att_cs_row: tiles of 64 rows (kspec.h "
                                                        "MGC_KSPEC_ATT_CS_ROWS)");
    const int tiles = (n + 63) / 64;
    return cs + ((i64)bi * tiles + r0 / 64) * H * ATT_D + (i64)h * ATT_D;
}
#endif
#endif

#if defined(MGC_ENTRY_attention_fwd) && !MGC_HALF
/* attention_fwd (fp32, SIMT): out = softmax(scale q k^T, masked) (dropout) v, lse per row.
 * grid (ceil(sq / ATT_FBQ), b, A), block 128, dynamic shared memory 0.
 * lse must not be NULL (the launcher passes scratch when the plan does not keep it). */
extern "C" __global__ void __launch_bounds__(ATT_NT, 2)
    MGC_ENTRY_NAME(mgc_t *__restrict__ out, float *__restrict__ lse, const mgc_t *__restrict__ q,
                   const mgc_t *__restrict__ k, const mgc_t *__restrict__ v, int sq, int sk, int b,
                   int A, int G, float scale, float drop_p, unsigned drop_thr, float drop_scale,
                   unsigned long long seed, unsigned long long stream,
                   const unsigned long long *__restrict__ step, unsigned long long elem0,
                   int drop_heads, const int *__restrict__ qpos, const int *__restrict__ kpos,
                   const int *__restrict__ docs, int pos_s, int pos_cp, int pos_rank,
                   int k_gathered, int qkv) {
    mgc_pdl_begin();
    ATT_STEP_STREAM;
    constexpr int BQ = ATT_FBQ, BK = ATT_FBK, RM = BQ / 8, RN = BK / 16;
    __shared__ float Qs[BQ][ATT_W + 1];
    __shared__ float KVs[BK][ATT_W + 1];
    __shared__ float Ps[BQ][BK + 1];
    __shared__ float red[32];
    const int tid = threadIdx.x, ty = tid >> 4, tx = tid & 15;
    int tile, bi, a;
    att_block_ids(tile, bi, a);
    const int q0 = att_qtile(tile) * BQ, g = a / (A / G);
    ATT_QKV_VIEWS;
    const float sl2 = scale * ATT_LOG2E;

    att_load_tile<BQ>(Qs, q, q0, sq, b, qH, bi, qh);
    int qp[RM], ds[RM];
#pragma unroll
    for (int m = 0; m < RM; m++) {
        int i = q0 + ty + 8 * m;
        qp[m] = i < sq ? att_qpos(qpos, i, pos_s, pos_cp, pos_rank) : -2147483647 - 1;
        ds[m] = i < sq ? att_lo(docs, i, b, bi, qp[m]) : 0;
    }
    int qmax = 0, qlo = -2147483647 - 1;
    if (MGC_CAUSAL) {
        int i = q0 + tid;
        int ok = tid < BQ && i < sq;
        int p = ok ? att_qpos(qpos, i, pos_s, pos_cp, pos_rank) : 0;
        qmax = att_block_max_int(p, ok, red);
        if (MGC_WIN) qlo = ATT_WIN_LO(-att_block_max_int(-p, ok, red));
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
            int kq = tid < BK && j < sk ? att_kpos(kpos, j, sk, pos_s, pos_cp, pos_rank, k_gathered) : 0;
            int vis = tid < BK && j < sk && kq <= qmax && kq >= qlo;
            if (!__syncthreads_or(vis)) continue;
        }
        att_load_tile<BK>(KVs, k, k0, sk, b, kH, bi, kh);
        __syncthreads();
        float s[RM][RN];
        att_simt_dots<RM, RN, false>(s, s, Qs, KVs, Qs, KVs, ty, tx);
        int kp[RN];
#pragma unroll
        for (int n = 0; n < RN; n++) {
            int j = k0 + tx + 16 * n;
            kp[n] = j < sk ? (MGC_CAUSAL || ATT_LOWER
                                  ? att_kpos(kpos, j, sk, pos_s, pos_cp, pos_rank, k_gathered)
                                  : 0)
                           : 2147483647;
        }
#pragma unroll
        for (int m = 0; m < RM; m++) {
            float mx = att_ninf();
#pragma unroll
            for (int n = 0; n < RN; n++) {
                int j = k0 + tx + 16 * n;
                bool visible =
                    j < sk && (!MGC_CAUSAL || kp[n] <= qp[m]) && ATT_DOC_OK(kp[n], ds[m]);
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
                    if (ATT_DROPPING(drop_p) && p != 0.0f)
                        p *= ATT_KEEP(i, k0 + tx + 16 * n);
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
        att_load_tile<BK>(KVs, v, k0, sk, b, kH, bi, kh);
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
        for (int c = 0; c < ATT_DC; c++)
            if (ATT_W == ATT_D || tx + 16 * c < ATT_D)
                out[base + tx + 16 * c] = mgc_st(acc[m][c] * inv);
        if (tx == 0)
            lse[((i64)i * b + bi) * A + a] =
                none ? att_ninf() : (mrow[m] + __log2f(lrow[m])) * ATT_LN2;
    }
}
#endif

#if (defined(MGC_ENTRY_attention_fwd) || defined(MGC_ENTRY_attention_bwd_dq)) && MGC_HALF
/* Whether any query of the block sees a key of the TK-key tile at k0 < sk (block-uniform: a
 * barrier unless keys are rows; TK <= the block's 128 threads).  qmax is the block's largest
 * query position, qlo the window's bound (ATT_WIN_LO). */
template <int TK>
__device__ __forceinline__ bool att_keys_seen(int k0, int qmax, int qlo, int sk, const int *kpos,
                                              int pos_s, int pos_cp, int pos_rank, int k_gathered) {
    if (!MGC_CAUSAL) return true;
    if (MGC_ROWPOS || (!kpos && pos_cp <= 1)) /* keys are rows (att_kpos): no barrier */
        return k0 <= qmax && min(k0 + TK, sk) - 1 >= qlo;
    int j = k0 + (int)threadIdx.x;
    int kq = threadIdx.x < TK && j < sk ? att_kpos(kpos, j, sk, pos_s, pos_cp, pos_rank, k_gathered) : 0;
    int vis = threadIdx.x < TK && j < sk && kq <= qmax && kq >= qlo;
    return __syncthreads_or(vis) != 0;
}
#endif

#if defined(MGC_ENTRY_attention_fwd) && MGC_HALF

/* attention_fwd (bf16/fp16, tensor cores): out = softmax(scale q k^T, masked) (dropout) v, lse.
 * Warp w owns ATT_FMT m-tiles of 16 query rows, mt's rows q0 + 16 (w + 4 mt) .. +15 (q
 * fragments in registers); K and V tiles are staged row-major in shared memory, two buffers
 * deep: cp.async fetches the next tile the block sees while this one is computed (one buffer
 * in the twin of ATT_FWD_NB_PP: the next tile fetched once every warp is done with this
 * one).  They are
 * read by ldmatrix (V transposed), each fragment feeding every m-tile; S = Q K^T and O += P V
 * on mma.sync.  A tile every query of the block sees whole (rows are positions and the tile
 * ends at or before the block's first query) skips the per-element mask.
 * grid (ceil(sq / ATT_FBQ), b, A), block 128, dynamic shared memory 0 (ATT_FWD_DYN: the two
 * buffers of K and V, 2 x 2 x 64 x (ATT_W + 8) halves; the kernel traps when given less).
 * lse must not be NULL (the launcher passes scratch when the plan does not keep it).
 * Two blocks per multiprocessor (8 warps of 32 rows at D <= 64; at D = 128 16 rows). */
extern "C" __global__ void __launch_bounds__(ATT_NT, 2)
    MGC_ENTRY_NAME(mgc_t *__restrict__ out, float *__restrict__ lse, const mgc_t *__restrict__ q,
                   const mgc_t *__restrict__ k, const mgc_t *__restrict__ v, int sq, int sk, int b,
                   int A, int G, float scale, float drop_p, unsigned drop_thr, float drop_scale,
                   unsigned long long seed, unsigned long long stream,
                   const unsigned long long *__restrict__ step, unsigned long long elem0,
                   int drop_heads, const int *__restrict__ qpos, const int *__restrict__ kpos,
                   const int *__restrict__ docs, int pos_s, int pos_cp, int pos_rank,
                   int k_gathered, int qkv) {
    mgc_pdl_begin();
    ATT_STEP_STREAM;
    constexpr int BQ = ATT_FBQ, BK = ATT_FBK, NT = BK / 8, KS = ATT_W / 16, DT = ATT_W / 8;
    constexpr int MT = ATT_FMT;
    constexpr int NB = ATT_FWD_NB_PP; /* buffers of K and V */
#if ATT_FWD_DYN
    ATT_DYN_BEGIN_D;
    ATT_SHARED_D(unsigned short, Ks, [NB][BK][ATT_W + 8]);
    ATT_SHARED_D(unsigned short, Vs, [NB][BK][ATT_W + 8]);
    ATT_DYN_END_D;
#else
    __shared__ __align__(16) unsigned short Ks[NB][BK][ATT_W + 8];
    __shared__ __align__(16) unsigned short Vs[NB][BK][ATT_W + 8];
#endif
    __shared__ float red[32];
    const int tid = threadIdx.x, w = tid >> 5, lane = tid & 31, grp = lane >> 2, tig = lane & 3;
    int tile, bi, a; /* the longest tiles first (att_block_ids) */
    att_block_ids(tile, bi, a);
    const int q0 = att_qtile(tile) * BQ, g = a / (A / G);
    ATT_QKV_VIEWS;
    const float sl2 = scale * ATT_LOG2E;
    int r[MT][2];
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
        r[mt][0] = q0 + 16 * (w + 4 * mt) + grp, r[mt][1] = r[mt][0] + 8;
    /* rows are positions: a tile that ends at or before q0 is seen whole by every row */
    const bool rows_are_pos = MGC_ROWPOS || (!qpos && !kpos && pos_cp <= 1);

    unsigned qf[MT][KS][4];
    int qp[MT][2], ds[MT][2];
#pragma unroll
    for (int mt = 0; mt < MT; mt++) {
        att_load_afrag(qf[mt], q, r[mt], sq, b, qH, bi, qh, tig);
#pragma unroll
        for (int h = 0; h < 2; h++) {
            qp[mt][h] = r[mt][h] < sq ? att_qpos(qpos, r[mt][h], pos_s, pos_cp, pos_rank)
                                      : -2147483647 - 1;
            ds[mt][h] = r[mt][h] < sq ? att_lo(docs, r[mt][h], b, bi, qp[mt][h]) : 0;
        }
    }
    int qmax = 0, qlo = -2147483647 - 1;
    if (MGC_CAUSAL) { /* BQ <= the block's 128 threads */
        int i = q0 + tid;
        int ok = tid < BQ && i < sq;
        int p = ok ? att_qpos(qpos, i, pos_s, pos_cp, pos_rank) : 0;
        qmax = att_block_max_int(p, ok, red);
        if (MGC_WIN) qlo = ATT_WIN_LO(-att_block_max_int(-p, ok, red));
    }
    float o[MT][DT][4], mrow[MT][2], lrow[MT][2];
#pragma unroll
    for (int mt = 0; mt < MT; mt++) {
#pragma unroll
        for (int dt = 0; dt < DT; dt++)
            o[mt][dt][0] = o[mt][dt][1] = o[mt][dt][2] = o[mt][dt][3] = 0.0f;
        mrow[mt][0] = mrow[mt][1] = att_ninf();
        lrow[mt][0] = lrow[mt][1] = 0.0f;
    }

    /* the first tile the block sees, fetched before the loop */
    int k0 = 0;
    while (k0 < sk && !att_keys_seen<BK>(k0, qmax, qlo, sk, kpos, pos_s, pos_cp, pos_rank, k_gathered))
        k0 += BK;
    if (k0 < sk) {
        att_stage_async<BK>(Ks[0], k, k0, sk, b, kH, bi, kh);
        att_stage_async<BK>(Vs[0], v, k0, sk, b, kH, bi, kh);
    }
    att_cp_commit();
    for (int buf = 0; k0 < sk; buf = NB == 2 ? buf ^ 1 : 0) {
        int kn = k0 + BK; /* the next tile the block sees: with two buffers its copies start now */
        while (kn < sk && !att_keys_seen<BK>(kn, qmax, qlo, sk, kpos, pos_s, pos_cp, pos_rank, k_gathered))
            kn += BK;
        if (NB == 2) {
            if (kn < sk) {
                att_stage_async<BK>(Ks[(buf + 1) % NB], k, kn, sk, b, kH, bi, kh);
                att_stage_async<BK>(Vs[(buf + 1) % NB], v, kn, sk, b, kH, bi, kh);
            }
            att_cp_commit();
            att_cp_wait<1>(); /* this tile's copies (all but the group just committed) */
        } else {
            att_cp_wait<0>(); /* this tile's copies */
        }
        __syncthreads();
        float s[MT][NT][4];
        att_mma_rows_mt<BK, MT>(s, qf, Ks[buf], lane);
        const bool whole =
            !ATT_LOWER && rows_are_pos && k0 + BK <= sk && (!MGC_CAUSAL || k0 + BK - 1 <= q0);
        /* S stays unscaled: the row max is taken on it (scale > 0, and rounding is monotonic, so
         * max(S) sl2 is max(S sl2) exactly) and p = 2^(S sl2 - m) is one FFMA and one MUFU.
         * Invisible entries are -inf: 2^-inf = 0 while m is finite. */
#pragma unroll
        for (int mt = 0; mt < MT; mt++) {
            float mx[2] = {att_ninf(), att_ninf()};
            if (whole) {
#pragma unroll
                for (int nt = 0; nt < NT; nt++)
#pragma unroll
                    for (int e = 0; e < 4; e++) mx[e >> 1] = fmaxf(mx[e >> 1], s[mt][nt][e]);
            } else {
#pragma unroll
                for (int nt = 0; nt < NT; nt++)
#pragma unroll
                    for (int e = 0; e < 2; e++) {
                        int j = k0 + nt * 8 + 2 * tig + e;
                        int kpj = 0;
                        if ((MGC_CAUSAL || ATT_LOWER) && j < sk)
                            kpj = att_kpos(kpos, j, sk, pos_s, pos_cp, pos_rank, k_gathered);
#pragma unroll
                        for (int h = 0; h < 2; h++) {
                            bool visible = j < sk && (!MGC_CAUSAL || kpj <= qp[mt][h]) &&
                                           ATT_DOC_OK(kpj, ds[mt][h]);
                            float x = visible ? s[mt][nt][2 * h + e] : att_ninf();
                            s[mt][nt][2 * h + e] = x;
                            mx[h] = fmaxf(mx[h], x);
                        }
                    }
            }
            float alpha[2];
#pragma unroll
            for (int h = 0; h < 2; h++) {
                mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 1));
                mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 2));
                float mnew = fmaxf(mrow[mt][h], mx[h] * sl2), sum = 0.0f;
                alpha[h] = 1.0f;
                if (mnew != att_ninf()) {
                    alpha[h] = att_exp2(mrow[mt][h] - mnew); /* 0 when mrow is -inf */
                    const float nm = -mnew;
#pragma unroll
                    for (int nt = 0; nt < NT; nt++)
#pragma unroll
                        for (int e = 0; e < 2; e++) {
                            float p = att_exp2(fmaf(s[mt][nt][2 * h + e], sl2, nm));
                            sum += p;
                            if (ATT_DROPPING(drop_p) && p != 0.0f)
                                p *= ATT_KEEP(r[mt][h], k0 + nt * 8 + 2 * tig + e);
                            s[mt][nt][2 * h + e] = p;
                        }
                } else {
#pragma unroll
                    for (int nt = 0; nt < NT; nt++) s[mt][nt][2 * h] = s[mt][nt][2 * h + 1] = 0.0f;
                }
                sum += __shfl_xor_sync(0xffffffffu, sum, 1);
                sum += __shfl_xor_sync(0xffffffffu, sum, 2);
                mrow[mt][h] = mnew;
                lrow[mt][h] = lrow[mt][h] * alpha[h] + sum;
            }
#pragma unroll
            for (int dt = 0; dt < DT; dt++) {
                o[mt][dt][0] *= alpha[0];
                o[mt][dt][1] *= alpha[0];
                o[mt][dt][2] *= alpha[1];
                o[mt][dt][3] *= alpha[1];
            }
        }
        att_mma_acc_mt<BK, MT>(o, s, Vs[buf], lane);
        __syncthreads(); /* every warp is done with this buffer before it is refilled */
        if (NB == 1) { /* one buffer: the next tile's copies start now */
            if (kn < sk) {
                att_stage_async<BK>(Ks[0], k, kn, sk, b, kH, bi, kh);
                att_stage_async<BK>(Vs[0], v, kn, sk, b, kH, bi, kh);
            }
            att_cp_commit();
        }
        k0 = kn;
    }
    att_cp_wait<0>();

#pragma unroll
    for (int mt = 0; mt < MT; mt++) {
        float inv[2];
#pragma unroll
        for (int h = 0; h < 2; h++) {
            inv[h] = lrow[mt][h] == 0.0f ? 0.0f : 1.0f / lrow[mt][h];
            if (r[mt][h] < sq && tig == 0)
                lse[((i64)r[mt][h] * b + bi) * A + a] =
                    lrow[mt][h] == 0.0f ? att_ninf()
                                        : (mrow[mt][h] + __log2f(lrow[mt][h])) * ATT_LN2;
        }
#pragma unroll
        for (int dt = 0; dt < DT; dt++) {
            o[mt][dt][0] *= inv[0];
            o[mt][dt][1] *= inv[0];
            o[mt][dt][2] *= inv[1];
            o[mt][dt][3] *= inv[1];
        }
        att_store_acc(out, o[mt], r[mt], sq, b, A, bi, a, tig);
    }
}
#endif

/* the inputs and arguments the dQ and dK/dV kernels share (after their outputs and dsum), in
 * the launcher's order (runtime/cuda_ops_attention.c) */
#define ATT_BWD_PARAMS                                                                           \
    const mgc_t *__restrict__ q, const mgc_t *__restrict__ k, const mgc_t *__restrict__ v,       \
        const mgc_t *__restrict__ dout, const float *__restrict__ lse, int sq, int sk, int b,   \
        int A, int G, float scale,                                                               \
        float drop_p, unsigned drop_thr, float drop_scale, unsigned long long seed,              \
        unsigned long long stream, const unsigned long long *__restrict__ step,                  \
        unsigned long long elem0, int drop_heads,                                                \
        const int *__restrict__ qpos, const int *__restrict__ kpos,                              \
        const int *__restrict__ docs, int pos_s, int pos_cp, int pos_rank, int k_gathered,       \
        int qkv, float *__restrict__ cs

#if defined(MGC_ENTRY_attention_bwd_dkv) && !ATT_TC_BWD
/* attention_bwd_dkv: dk, dv of ATT_BR keys of kv head g for batch row bi, summed over the
 * group's query heads a = g*(A/G) .. in order and over query tiles of ATT_BC rows in order:
 *   P = exp(scale q k^T - lse) (0 where invisible or lse = -inf), Z = dropout multiplier,
 *   dV += (P Z)^T dO,  dS = P (Z (dO v^T) - dsum) scale,  dK += dS^T q.
 * grid (ceil(sk / ATT_BR), b, G), block 128, dynamic shared memory 0 (wide: ATT_SHARED's). */
extern "C" __global__ void __launch_bounds__(ATT_NT, 2)
    MGC_ENTRY_NAME(mgc_t *__restrict__ dk, mgc_t *__restrict__ dv,
                   const float *__restrict__ dsum, ATT_BWD_PARAMS) {
    mgc_pdl_begin();
    ATT_STEP_STREAM;
    constexpr int BR = ATT_BR, BC = ATT_BC, RM = BR / 8, RN = BC / 16;
    ATT_DYN_BEGIN;
    ATT_SHARED(float, Ks, [BR][ATT_W + 1]);
    ATT_SHARED(float, Vs, [BR][ATT_W + 1]);
    ATT_SHARED(float, Qs, [BC][ATT_W + 1]);
    ATT_SHARED(float, dOs, [BC][ATT_W + 1]);
    ATT_DYN_END;
    __shared__ float PTs[BR][BC + 1];  /* (P Z)^T */
    __shared__ float dSTs[BR][BC + 1]; /* dS^T */
    __shared__ float lses[BC], dsums[BC];
    __shared__ float red[32];
    const int tid = threadIdx.x, ty = tid >> 4, tx = tid & 15;
    int tile, bi, g; /* key tile 0 sees the most queries: it goes first (att_block_ids) */
    att_block_ids(tile, bi, g);
    const int k0 = tile * BR, per = A / G;
    ATT_KV_VIEWS;
    const float sl2 = scale * ATT_LOG2E;

    att_load_tile<BR>(Ks, k, k0, sk, b, kH, bi, kh);
    att_load_tile<BR>(Vs, v, k0, sk, b, kH, bi, kh);
    int kp[RM];
#pragma unroll
    for (int m = 0; m < RM; m++) {
        int j = k0 + ty + 8 * m;
        kp[m] = j < sk ? att_kpos(kpos, j, sk, pos_s, pos_cp, pos_rank, k_gathered) : 2147483647;
    }
    int kmin = 0, qhi = 2147483647; /* with a window: the last query position any key sees */
    if (MGC_CAUSAL) {
        int j = k0 + tid;
        int ok = tid < BR && j < sk;
        int p = ok ? att_kpos(kpos, j, sk, pos_s, pos_cp, pos_rank, k_gathered) : 0;
        kmin = -att_block_max_int(ok ? -p : 0, ok, red);
        if (MGC_WIN) qhi = att_block_max_int(p, ok, red) + MGC_WIN - 1;
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
                int qq = tid < BC && i < sq ? att_qpos(qpos, i, pos_s, pos_cp, pos_rank) : 0;
                int vis = tid < BC && i < sq && qq >= kmin && qq <= qhi;
                if (!__syncthreads_or(vis)) continue;
            }
            att_load_tile<BC>(Qs, q, q0, sq, b, qH, bi, att_qh(qkv, A, G, a));
            att_load_tile<BC>(dOs, dout, q0, sq, b, A, bi, a);
            if (tid < BC) {
                int i = q0 + tid;
                i64 r = ((i64)i * b + bi) * A + a;
                lses[tid] = i < sq ? lse[r] * ATT_LOG2E : att_ninf();
                dsums[tid] = i < sq ? dsum[r] : 0.0f;
            }
            __syncthreads();
            float s[RM][RN], dp[RM][RN];
            att_simt_dots<RM, RN, true>(s, dp, Ks, Qs, Vs, dOs, ty, tx);
#pragma unroll
            for (int n = 0; n < RN; n++) {
                int ql = tx + 16 * n, i = q0 + ql;
                float l2 = lses[ql], D = dsums[ql];
                int qpi = 0, dsi = 0;
                if (MGC_CAUSAL && i < sq) qpi = att_qpos(qpos, i, pos_s, pos_cp, pos_rank);
                if (ATT_LOWER && i < sq) dsi = att_lo(docs, i, b, bi, qpi);
#pragma unroll
                for (int m = 0; m < RM; m++) {
                    int j = k0 + ty + 8 * m;
                    bool visible = i < sq && j < sk && l2 != att_ninf() &&
                                   (!MGC_CAUSAL || kp[m] <= qpi) && ATT_DOC_OK(kp[m], dsi);
                    float p = visible ? exp2f(s[m][n] * sl2 - l2) : 0.0f;
                    float z = 1.0f;
                    if (ATT_DROPPING(drop_p) && visible)
                        z = ATT_KEEP(i, j);
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
        i64 base = (((i64)j * b + bi) * kH + kh) * ATT_D;
#pragma unroll
        for (int c = 0; c < ATT_DC; c++) {
            if (ATT_W != ATT_D && tx + 16 * c >= ATT_D) continue;
            dk[base + tx + 16 * c] = mgc_st(dka[m][c]);
            dv[base + tx + 16 * c] = mgc_st(dva[m][c]);
        }
    }
}
#endif

#if defined(MGC_ENTRY_attention_bwd_dq) && !ATT_TC_BWD
/* attention_bwd_dq: dq of ATT_BR query rows of head a for batch row bi, over key tiles of
 * ATT_BC rows in order: dS = P (Z (dO v^T) - dsum) scale, dQ += dS k; first writes the rows'
 * dsum = rowsum(dO o O) (o: the forward's out), which the dK/dV kernel reads.
 * grid (ceil(sq / ATT_BR), b, A), block 128, dynamic shared memory 0 (wide: ATT_SHARED's). */
extern "C" __global__ void __launch_bounds__(ATT_NT, 2)
    MGC_ENTRY_NAME(mgc_t *__restrict__ dq, float *__restrict__ dsum,
                   const mgc_t *__restrict__ o, ATT_BWD_PARAMS) {
    mgc_pdl_begin();
    ATT_STEP_STREAM;
    constexpr int BR = ATT_BR, BC = ATT_BC, RM = BR / 8, RN = BC / 16;
    ATT_DYN_BEGIN;
    ATT_SHARED(float, Qs, [BR][ATT_W + 1]);
    ATT_SHARED(float, dOs, [BR][ATT_W + 1]);
    ATT_SHARED(float, Ks, [BC][ATT_W + 1]);
    ATT_SHARED(float, Vs, [BC][ATT_W + 1]);
    ATT_DYN_END;
    __shared__ float dSs[BR][BC + 1];
    __shared__ float red[32];
    const int tid = threadIdx.x, ty = tid >> 4, tx = tid & 15;
    int tile, bi, a;
    att_block_ids(tile, bi, a);
    const int q0 = att_qtile(tile) * BR, g = a / (A / G);
    ATT_QKV_VIEWS;
    const float sl2 = scale * ATT_LOG2E;

    att_load_tile<BR>(Qs, q, q0, sq, b, qH, bi, qh);
    att_load_tile<BR>(dOs, dout, q0, sq, b, A, bi, a);
    int qp[RM], ds[RM];
    float l2[RM], Dm[RM];
#pragma unroll
    for (int m = 0; m < RM; m++) {
        int i = q0 + ty + 8 * m;
        i64 r = ((i64)i * b + bi) * A + a;
        qp[m] = i < sq ? att_qpos(qpos, i, pos_s, pos_cp, pos_rank) : -2147483647 - 1;
        ds[m] = i < sq ? att_lo(docs, i, b, bi, qp[m]) : 0;
        l2[m] = i < sq ? lse[r] * ATT_LOG2E : att_ninf();
    }
    int qmax = 0, qlo = -2147483647 - 1;
    if (MGC_CAUSAL) {
        int i = q0 + tid;
        int ok = tid < BR && i < sq;
        int p = ok ? att_qpos(qpos, i, pos_s, pos_cp, pos_rank) : 0;
        qmax = att_block_max_int(p, ok, red);
        if (MGC_WIN) qlo = ATT_WIN_LO(-att_block_max_int(-p, ok, red));
    }
    float dqa[RM][ATT_DC];
#pragma unroll
    for (int m = 0; m < RM; m++)
#pragma unroll
        for (int c = 0; c < ATT_DC; c++) dqa[m][c] = 0.0f;
    __syncthreads();
    /* dsum = rowsum(dO o O) of the block's rows, for dS here and for the dK/dV kernel, which
     * the launcher runs after this one: a row's 16 lanes (tx) each add columns tx + 16 c in
     * order, then a butterfly over the 16 */
#pragma unroll
    for (int m = 0; m < RM; m++) {
        const int i = q0 + ty + 8 * m;
        const i64 r = ((i64)i * b + bi) * A + a;
        float s = 0.0f;
        if (i < sq)
#pragma unroll
            for (int c = 0; c < ATT_DC; c++)
                if (ATT_W == ATT_D || tx + 16 * c < ATT_D)
                    s = fmaf(dOs[ty + 8 * m][tx + 16 * c], mgc_ld(o[r * ATT_D + tx + 16 * c]), s);
#pragma unroll
        for (int x = 8; x > 0; x >>= 1) s += __shfl_xor_sync(0xffffffffu, s, x);
        Dm[m] = s;
        if (tx == 0 && i < sq) dsum[r] = s;
    }

    for (int k0 = 0; k0 < sk; k0 += BC) {
        if (MGC_CAUSAL) {
            int j = k0 + tid;
            int kq = tid < BC && j < sk ? att_kpos(kpos, j, sk, pos_s, pos_cp, pos_rank, k_gathered) : 0;
            int vis = tid < BC && j < sk && kq <= qmax && kq >= qlo;
            if (!__syncthreads_or(vis)) continue;
        }
        att_load_tile<BC>(Ks, k, k0, sk, b, kH, bi, kh);
        att_load_tile<BC>(Vs, v, k0, sk, b, kH, bi, kh);
        __syncthreads();
        float s[RM][RN], dp[RM][RN];
        att_simt_dots<RM, RN, true>(s, dp, Qs, Ks, dOs, Vs, ty, tx);
#pragma unroll
        for (int n = 0; n < RN; n++) {
            int kl = tx + 16 * n, j = k0 + kl;
            int kpj = 0;
            if ((MGC_CAUSAL || ATT_LOWER) && j < sk)
                kpj = att_kpos(kpos, j, sk, pos_s, pos_cp, pos_rank, k_gathered);
#pragma unroll
            for (int m = 0; m < RM; m++) {
                int i = q0 + ty + 8 * m;
                bool visible = i < sq && j < sk && l2[m] != att_ninf() &&
                               (!MGC_CAUSAL || kpj <= qp[m]) && ATT_DOC_OK(kpj, ds[m]);
                float p = visible ? exp2f(s[m][n] * sl2 - l2[m]) : 0.0f;
                float z = 1.0f;
                if (ATT_DROPPING(drop_p) && visible)
                    z = ATT_KEEP(i, j);
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
        i64 base = (((i64)i * b + bi) * qH + qh) * ATT_D;
#pragma unroll
        for (int c = 0; c < ATT_DC; c++)
            if (ATT_W == ATT_D || tx + 16 * c < ATT_D) dq[base + tx + 16 * c] = mgc_st(dqa[m][c]);
    }
}
#endif

#if defined(MGC_ENTRY_attention_bwd_dkv) && ATT_TC_BWD
/* attention_bwd_dkv (bf16/fp16, tensor cores): the SIMT kernel's math with warp w owning
 * keys k0 + 16 w .. +15 (their K and V fragments in registers; at D = 128 the block's K and V
 * are staged in shared memory instead and read by ldmatrix, ATT_KV_SMEM, so that the dK/dV
 * accumulators fit in registers).  Per query tile of ATT_TBC_KV rows (Q, dO and the rows' lse
 * and dsum staged, two buffers deep, one past D 128: cp.async fetches the next tile the block
 * sees while this one is computed; ldmatrix reads Q and dO either way): S^T = K Q^T and
 * dP^T = V dO^T on mma.sync, then P^T Z and dS^T in registers, rounded to the storage type as
 * the A operand of dV += (P Z)^T dO and dK += dS^T Q (fp32 accumulation).  Query heads of the
 * group, then query tiles, in order.  A tile whose queries all see every key of the block skips
 * the mask.
 * grid (ceil(sk / ATT_TBR) ATT_DKV_NS, b, G), block 128, dynamic shared memory 0 (past D 64,
 * to 128: ATT_DKV_DYN's four tiles; wide: ATT_SHARED's, a key tile's ATT_DKV_NS column slices
 * neighbouring blocks). */
extern "C" __global__ void __launch_bounds__(ATT_NT, 2)
    MGC_ENTRY_NAME(mgc_t *__restrict__ dk, mgc_t *__restrict__ dv,
                   const float *__restrict__ dsum, ATT_BWD_PARAMS) {
    mgc_pdl_begin();
    ATT_STEP_STREAM;
    constexpr int BR = ATT_TBR, BC = ATT_TBC_KV, NT = BC / 8, KS = ATT_W / 16, DT = ATT_W / 8;
    /* the block's slice of the columns of dK and dV: DTN n-tiles from column c0, those before
     * ATT_W (all of them unless wide: ATT_DKV_NS; an even number, pairs of n-tiles being
     * att_mma_acc's step: at ATT_W 144 80 columns and 64) */
    constexpr int NS = ATT_DKV_NS, DTN = NS > 1 ? 2 * ((DT + 2 * NS - 1) / (2 * NS)) : DT;
    /* buffers of the query-side tiles (ATT_DKV_NB_PP): two, but one past D 128 (the next tile
     * is then fetched after this one is done) */
    constexpr int NB = ATT_DKV_NB_PP;
#if ATT_DKV_DYN /* past D 64, to 128: the four tiles from dynamic shared memory */
    ATT_DYN_BEGIN_D;
    ATT_SHARED_D(unsigned short, Qs, [NB][BC][ATT_W + 8]);
    ATT_SHARED_D(unsigned short, dOs, [NB][BC][ATT_W + 8]);
    ATT_SHARED_D(unsigned short, Ks, [BR][ATT_W + 8]);
    ATT_SHARED_D(unsigned short, Vs, [BR][ATT_W + 8]);
    ATT_DYN_END_D;
#else
    ATT_DYN_BEGIN;
    ATT_SHARED16(unsigned short, Qs, [NB][BC][ATT_W + 8]);
    ATT_SHARED16(unsigned short, dOs, [NB][BC][ATT_W + 8]);
#if ATT_KV_SMEM
    ATT_SHARED16(unsigned short, Ks, [BR][ATT_W + 8]);
    ATT_SHARED16(unsigned short, Vs, [BR][ATT_W + 8]);
#endif
    ATT_DYN_END;
#endif
    __shared__ float lses[NB][BC], dsums[NB][BC]; /* raw: lse, dsum; 0 past sq */
#if MGC_DOCS /* the query tile's document starts, fetched with it (D 256's registers) */
    __shared__ int dss[NB][BC];
#define ATT_DKV_DOCS_CP(bf_, i_) att_cp4(&dss[bf_][tid], docs + ((i64)((i_) < sq ? (i_) : 0) * b + bi), (i_) < sq)
#define ATT_DKV_DOC(bf_, ql_) dss[bf_][ql_]
#else
#define ATT_DKV_DOCS_CP(bf_, i_) ((void)0)
#define ATT_DKV_DOC(bf_, ql_) 0
#endif
    __shared__ float red[32];
    const int tid = threadIdx.x, w = tid >> 5, lane = tid & 31, grp = lane >> 2, tig = lane & 3;
    int tile, bi, g; /* key tile 0 sees the most queries: it goes first (att_block_ids) */
    att_block_ids(tile, bi, g);
    const int c0 = NS > 1 ? tile % NS * (8 * DTN) : 0;
    if (NS > 1) tile /= NS; /* a key tile's slices are neighbours in the order */
    const int k0 = tile * BR, per = A / G;
    ATT_KV_VIEWS;
    const float sl2 = scale * ATT_LOG2E;
    const int r[2] = {k0 + 16 * w + grp, k0 + 16 * w + grp + 8};
    const bool rows_are_pos = MGC_ROWPOS || (!qpos && !kpos && pos_cp <= 1);

#if ATT_KV_SMEM
    att_stage<BR>(Ks, k, k0, sk, b, kH, bi, kh);
    att_stage<BR>(Vs, v, k0, sk, b, kH, bi, kh);
    __syncthreads();
#else
    unsigned kf[KS][4], vf[KS][4];
    att_load_afrag(kf, k, r, sk, b, kH, bi, kh, tig);
    att_load_afrag(vf, v, r, sk, b, kH, bi, kh, tig);
#endif
    int kp[2];
#pragma unroll
    for (int h = 0; h < 2; h++)
        kp[h] = r[h] < sk ? att_kpos(kpos, r[h], sk, pos_s, pos_cp, pos_rank, k_gathered)
                          : 2147483647;
    int kmin = 0, qhi = 2147483647; /* with a window: the last query position any key sees */
    if (MGC_CAUSAL) {
        int j = k0 + tid;
        int ok = tid < BR && j < sk;
        int p = ok ? att_kpos(kpos, j, sk, pos_s, pos_cp, pos_rank, k_gathered) : 0;
        kmin = -att_block_max_int(ok ? -p : 0, ok, red);
        if (MGC_WIN) qhi = att_block_max_int(p, ok, red) + MGC_WIN - 1;
    }
    float dka[DTN][4], dva[DTN][4];
#pragma unroll
    for (int dt = 0; dt < DTN; dt++)
#pragma unroll
        for (int e = 0; e < 4; e++) dka[dt][e] = dva[dt][e] = 0.0f;

    /* the (head, query tile) steps in order, skipping tiles that see no key of the block
     * (block-uniform: a barrier each unless queries are rows); the next step's tiles are
     * fetched during this one's */
#define ATT_DKV_SEEN(q0_)                                                                        \
    (!MGC_CAUSAL ||                                                                              \
     (MGC_ROWPOS || (!qpos && pos_cp <= 1) /* queries are rows: the first and last decide */   \
          ? min((q0_) + BC, sq) - 1 >= kmin && (q0_) <= qhi                                      \
          : __syncthreads_or(tid < BC && (q0_) + tid < sq &&                                     \
                             att_qpos(qpos, (q0_) + tid, pos_s, pos_cp, pos_rank) >= kmin &&     \
                             att_qpos(qpos, (q0_) + tid, pos_s, pos_cp, pos_rank) <= qhi)))
#define ATT_DKV_NEXT(a_, q0_)                                                                    \
    do {                                                                                         \
        for (;;) {                                                                               \
            if ((q0_) >= sq) (a_)++, (q0_) = 0;                                                  \
            if ((a_) >= (g + 1) * per || ATT_DKV_SEEN(q0_)) break;                               \
            (q0_) += BC;                                                                         \
        }                                                                                        \
    } while (0)
#define ATT_DKV_FETCH(bf_, a_, q0_)                                                              \
    do {                                                                                         \
        att_stage_async<BC>(Qs[bf_], q, (q0_), sq, b, qH, bi, att_qh(qkv, A, G, (a_)));        \
        att_stage_async<BC>(dOs[bf_], dout, (q0_), sq, b, A, bi, (a_));                          \
        if (tid < BC) {                                                                          \
            int i_ = (q0_) + tid;                                                                \
            i64 rw_ = ((i64)(i_ < sq ? i_ : 0) * b + bi) * A + (a_);                             \
            att_cp4(&lses[bf_][tid], lse + rw_, i_ < sq);                                        \
            att_cp4(&dsums[bf_][tid], dsum + rw_, i_ < sq);                                      \
            ATT_DKV_DOCS_CP(bf_, i_);                                                            \
        }                                                                                        \
    } while (0)
    int a = g * per, q0 = 0;
    ATT_DKV_NEXT(a, q0);
    if (a < (g + 1) * per) ATT_DKV_FETCH(0, a, q0);
    att_cp_commit();
    for (int buf = 0; a < (g + 1) * per; buf ^= NB - 1) {
        int an = a, qn = q0 + BC;
        if (NB == 2) {
            ATT_DKV_NEXT(an, qn);
            if (an < (g + 1) * per) ATT_DKV_FETCH(buf ^ 1, an, qn);
            att_cp_commit();
            att_cp_wait<1>();
        } else {
            att_cp_wait<0>();
        }
        __syncthreads();
        float s[NT][4], dp[NT][4]; /* S^T and dP^T: rows keys r[h], columns queries */
#if ATT_KV_SMEM
        att_mma_rows_sa<BC>(s, Ks, 16 * w, Qs[buf], lane);
        att_mma_rows_sa<BC>(dp, Vs, 16 * w, dOs[buf], lane);
#else
        att_mma_rows<BC>(s, kf, Qs[buf], lane);
        att_mma_rows<BC>(dp, vf, dOs[buf], lane);
#endif
        /* every query of the tile sees every key of the block (and has a finite lse) */
        const bool whole =
            !ATT_LOWER && rows_are_pos && q0 + BC <= sq && (!MGC_CAUSAL || k0 + BR - 1 <= q0);
        /* P^T = 2^(S^T sl2 - lse log2 e): one FFMA and one MUFU.  dS^T leaves out the softmax
         * scale: dK is scaled once, at the end.  Rows past sk compute values never stored. */
        if (whole) {
#pragma unroll
            for (int nt = 0; nt < NT; nt++)
#pragma unroll
                for (int e = 0; e < 2; e++) {
                    const int ql = nt * 8 + 2 * tig + e;
                    const float nl2 = -lses[buf][ql] * ATT_LOG2E, Dv = dsums[buf][ql];
#pragma unroll
                    for (int h = 0; h < 2; h++) {
                        float p = att_exp2(fmaf(s[nt][2 * h + e], sl2, nl2)), z = 1.0f;
                        if (ATT_DROPPING(drop_p))
                            z = ATT_KEEP(q0 + ql, r[h]);
                        dp[nt][2 * h + e] = p * (dp[nt][2 * h + e] * z - Dv); /* dS^T / scale */
                        s[nt][2 * h + e] = p * z;                             /* P^T Z */
                    }
                }
        } else {
#pragma unroll
            for (int nt = 0; nt < NT; nt++)
#pragma unroll
                for (int e = 0; e < 2; e++) {
                    int ql = nt * 8 + 2 * tig + e, i = q0 + ql;
                    float l2 = i < sq ? lses[buf][ql] * ATT_LOG2E : att_ninf(), Dv = dsums[buf][ql];
                    int qpi = 0, dsi = 0;
                    if (MGC_CAUSAL && i < sq) qpi = att_qpos(qpos, i, pos_s, pos_cp, pos_rank);
                    if (ATT_LOWER && i < sq) dsi = att_lo_at(ATT_DKV_DOC(buf, ql), qpi);
#pragma unroll
                    for (int h = 0; h < 2; h++) {
                        bool visible = i < sq && r[h] < sk && l2 != att_ninf() &&
                                       (!MGC_CAUSAL || kp[h] <= qpi) && ATT_DOC_OK(kp[h], dsi);
                        float p = visible ? att_exp2(fmaf(s[nt][2 * h + e], sl2, -l2)) : 0.0f;
                        float z = 1.0f;
                        if (ATT_DROPPING(drop_p) && visible)
                            z = ATT_KEEP(i, r[h]);
                        dp[nt][2 * h + e] = p * (dp[nt][2 * h + e] * z - Dv); /* dS^T / scale */
                        s[nt][2 * h + e] = p * z;                             /* P^T Z */
                    }
                }
        }
        att_mma_acc<BC, DTN>(dva, s, dOs[buf], lane, c0);
        att_mma_acc<BC, DTN>(dka, dp, Qs[buf], lane, c0);
        __syncthreads(); /* every warp is done with this buffer before it is refilled */
        if (NB == 1) {
            ATT_DKV_NEXT(an, qn);
            if (an < (g + 1) * per) ATT_DKV_FETCH(0, an, qn);
            att_cp_commit();
        }
        a = an, q0 = qn;
    }
#undef ATT_DKV_FETCH
#undef ATT_DKV_NEXT
#undef ATT_DKV_SEEN
#undef ATT_DKV_DOCS_CP
#undef ATT_DKV_DOC
    att_cp_wait<0>();
#pragma unroll
    for (int dt = 0; dt < DTN; dt++)
#pragma unroll
        for (int e = 0; e < 4; e++) dka[dt][e] *= scale;
    att_store_acc<DTN>(dk, dka, r, sk, b, kH, bi, kh, tig, c0);
    att_store_acc<DTN>(dv, dva, r, sk, b, kH, bi, kh, tig, c0);
#if MGC_CS /* dk, dv: heads PER + kh and PER + 1 + kh of the qkv row (att_kh) */
    static_assert(sizeof(Qs) >= 4 * 8 * DTN * sizeof(float), "attention_bwd_dkv: red in Qs");
    float *csr = reinterpret_cast<float *>(&Qs[0][0][0]);
    att_colsum<DTN>(att_cs_row(cs, bi, k0, sk, kH, per + kh), dka, r, sk, c0, csr);
    att_colsum<DTN>(att_cs_row(cs, bi, k0, sk, kH, per + 1 + kh), dva, r, sk, c0, csr);
#endif
}
#endif

#if defined(MGC_ENTRY_attention_bwd_dq) && ATT_TC_BWD
/* attention_bwd_dq (bf16/fp16, tensor cores): warp w owns ATT_QMT m-tiles of 16 query rows,
 * mt's rows q0 + 16 (w + 4 mt) .. +15 (Q and dO fragments in registers; first the rows' dsum =
 * rowsum(dO o O), written for the dK/dV kernel, which runs after this one); per key tile of
 * ATT_TBC_Q rows (K and V staged row-major, two buffers deep: cp.async fetches the next tile
 * the block sees while this one is computed; ldmatrix reads K transposed for dS K, each
 * fragment feeding every m-tile): S = Q K^T, dP = dO V^T, dS in registers, dQ += dS K.
 * A tile every query of the block sees whole skips the per-element mask (as the forward).
 * grid (ceil(sq / ATT_TBR_Q), b, A), block 128, dynamic shared memory 0 (wide: ATT_SHARED's). */
extern "C" __global__ void __launch_bounds__(ATT_NT, 2)
    MGC_ENTRY_NAME(mgc_t *__restrict__ dq, float *__restrict__ dsum,
                   const mgc_t *__restrict__ o, ATT_BWD_PARAMS) {
    mgc_pdl_begin();
    ATT_STEP_STREAM;
    constexpr int MT = ATT_QMT, BR = ATT_TBR_Q, BC = ATT_TBC_Q, NT = BC / 8, KS = ATT_W / 16,
                  DT = ATT_W / 8;
    /* wide (ATT_DYN): Q and dO staged, their A fragments read by ldmatrix (MT = 1: warp w's
     * rows 16 w ..), and one buffer of K and V (the next tile fetched after this one is done):
     * the dQ accumulators take the registers, and two buffers would pass 99 KiB */
    constexpr int NB = ATT_DYN ? 1 : 2;
    static_assert(!ATT_DYN || MT == 1, "attention_bwd_dq: wide rows are one m-tile a warp");
    ATT_DYN_BEGIN;
    ATT_SHARED16(unsigned short, Ks, [NB][BC][ATT_W + 8]);
    ATT_SHARED16(unsigned short, Vs, [NB][BC][ATT_W + 8]);
#if ATT_DYN
    ATT_SHARED16(unsigned short, Qs, [BR][ATT_W + 8]);
    ATT_SHARED16(unsigned short, dOs, [BR][ATT_W + 8]);
#endif
    ATT_DYN_END;
    __shared__ float red[32];
    const int tid = threadIdx.x, w = tid >> 5, lane = tid & 31, grp = lane >> 2, tig = lane & 3;
    int tile, bi, a; /* the longest tiles first (att_block_ids) */
    att_block_ids(tile, bi, a);
    const int q0 = att_qtile(tile) * BR, g = a / (A / G);
    ATT_QKV_VIEWS;
    const float sl2 = scale * ATT_LOG2E;
    int r[MT][2];
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
        r[mt][0] = q0 + 16 * (w + 4 * mt) + grp, r[mt][1] = r[mt][0] + 8;
    const bool rows_are_pos = MGC_ROWPOS || (!qpos && !kpos && pos_cp <= 1);

#if ATT_DYN /* read after the barrier before the loop */
    att_stage<BR>(Qs, q, q0, sq, b, qH, bi, qh);
    att_stage<BR>(dOs, dout, q0, sq, b, A, bi, a);
#else
    unsigned qf[MT][KS][4];
#endif
    unsigned of[MT][KS][4];
    int qp[MT][2], ds[MT][2];
    float nl2[MT][2], Dm[MT][2]; /* -lse log2 e (+inf past sq or without a visible key) */
    bool rowok[MT][2];
#pragma unroll
    for (int mt = 0; mt < MT; mt++) {
#if !ATT_DYN
        att_load_afrag(qf[mt], q, r[mt], sq, b, qH, bi, qh, tig);
#endif
        att_load_afrag(of[mt], dout, r[mt], sq, b, A, bi, a, tig);
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const int rr = r[mt][h];
            i64 rw = ((i64)rr * b + bi) * A + a;
            qp[mt][h] = rr < sq ? att_qpos(qpos, rr, pos_s, pos_cp, pos_rank) : -2147483647 - 1;
            ds[mt][h] = rr < sq ? att_lo(docs, rr, b, bi, qp[mt][h]) : 0;
            nl2[mt][h] = rr < sq ? -lse[rw] * ATT_LOG2E : -att_ninf();
            rowok[mt][h] = rr < sq && nl2[mt][h] != -att_ninf();
        }
    }
    /* dsum = rowsum(dO o O) of the block's rows, for dS here and for the dK/dV kernel, which
     * the launcher runs after this one: each of a row's 4 lanes (tig) adds its 4 columns of
     * each 16 (the A fragments' 2 tig, +1, +8, +9) in order, then a butterfly over the 4 */
#pragma unroll
    for (int mt = 0; mt < MT; mt++) {
        unsigned oa[KS][4];
        att_load_afrag(oa, o, r[mt], sq, b, A, bi, a, tig);
#pragma unroll
        for (int h = 0; h < 2; h++) {
            float s = 0.0f;
#pragma unroll
            for (int ks = 0; ks < KS; ks++)
#pragma unroll
                for (int hh = h; hh < 4; hh += 2) {
                    float x0, x1, y0, y1;
                    mgc_unpack2(of[mt][ks][hh], x0, x1);
                    mgc_unpack2(oa[ks][hh], y0, y1);
                    s = fmaf(x1, y1, fmaf(x0, y0, s));
                }
            s += __shfl_xor_sync(0xffffffffu, s, 1);
            s += __shfl_xor_sync(0xffffffffu, s, 2);
            Dm[mt][h] = s; /* 0 past sq: the fragments are */
            if (tig == 0 && r[mt][h] < sq) dsum[((i64)r[mt][h] * b + bi) * A + a] = s;
        }
    }
    int qmax = 0, qlo = -2147483647 - 1;
    if (MGC_CAUSAL) { /* BR <= the block's 128 threads */
        int i = q0 + tid;
        int ok = tid < BR && i < sq;
        int p = ok ? att_qpos(qpos, i, pos_s, pos_cp, pos_rank) : 0;
        qmax = att_block_max_int(p, ok, red);
        if (MGC_WIN) qlo = ATT_WIN_LO(-att_block_max_int(-p, ok, red));
    }
    float dqa[MT][DT][4];
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int dt = 0; dt < DT; dt++)
            dqa[mt][dt][0] = dqa[mt][dt][1] = dqa[mt][dt][2] = dqa[mt][dt][3] = 0.0f;
    __syncthreads();

    /* key tiles no query of the block sees are skipped (block-uniform) */
#define ATT_DQ_SEEN(k0_) att_keys_seen<BC>((k0_), qmax, qlo, sk, kpos, pos_s, pos_cp, pos_rank, k_gathered)
    int k0 = 0;
    while (k0 < sk && !ATT_DQ_SEEN(k0)) k0 += BC;
    if (k0 < sk) {
        att_stage_async<BC>(Ks[0], k, k0, sk, b, kH, bi, kh);
        att_stage_async<BC>(Vs[0], v, k0, sk, b, kH, bi, kh);
    }
    att_cp_commit();
    for (int buf = 0; k0 < sk; buf ^= NB - 1) {
        int kn = k0 + BC;
        if (NB == 2) {
            while (kn < sk && !ATT_DQ_SEEN(kn)) kn += BC;
            if (kn < sk) {
                att_stage_async<BC>(Ks[buf ^ 1], k, kn, sk, b, kH, bi, kh);
                att_stage_async<BC>(Vs[buf ^ 1], v, kn, sk, b, kH, bi, kh);
            }
            att_cp_commit();
            att_cp_wait<1>();
        } else {
            att_cp_wait<0>();
        }
        __syncthreads();
        float s[MT][NT][4], dp[MT][NT][4];
#if ATT_DYN
        att_mma_rows_sa<BC>(s[0], Qs, 16 * w, Ks[buf], lane);
        att_mma_rows_sa<BC>(dp[0], dOs, 16 * w, Vs[buf], lane);
#else
        att_mma_rows_mt<BC, MT>(s, qf, Ks[buf], lane);
        att_mma_rows_mt<BC, MT>(dp, of, Vs[buf], lane);
#endif
        const bool whole =
            !ATT_LOWER && rows_are_pos && k0 + BC <= sk && (!MGC_CAUSAL || k0 + BC - 1 <= q0);
        /* P = 2^(S sl2 - lse log2 e) (one FFMA, one MUFU); dS leaves out the softmax scale: dQ
         * is scaled once, at the end.  Rows past sq compute values never stored. */
        if (whole) {
#pragma unroll
            for (int nt = 0; nt < NT; nt++)
#pragma unroll
                for (int e = 0; e < 2; e++)
#pragma unroll
                    for (int mt = 0; mt < MT; mt++)
#pragma unroll
                        for (int h = 0; h < 2; h++) {
                            float p = att_exp2(fmaf(s[mt][nt][2 * h + e], sl2, nl2[mt][h]));
                            float z = 1.0f;
                            if (ATT_DROPPING(drop_p))
                                z = ATT_KEEP(r[mt][h], k0 + nt * 8 + 2 * tig + e);
                            dp[mt][nt][2 * h + e] = p * (dp[mt][nt][2 * h + e] * z - Dm[mt][h]);
                        }
        } else {
#pragma unroll
            for (int nt = 0; nt < NT; nt++)
#pragma unroll
                for (int e = 0; e < 2; e++) {
                    int j = k0 + nt * 8 + 2 * tig + e;
                    int kpj = 0;
                    if ((MGC_CAUSAL || ATT_LOWER) && j < sk)
                        kpj = att_kpos(kpos, j, sk, pos_s, pos_cp, pos_rank, k_gathered);
#pragma unroll
                    for (int mt = 0; mt < MT; mt++)
#pragma unroll
                        for (int h = 0; h < 2; h++) {
                            bool visible = rowok[mt][h] && j < sk &&
                                           (!MGC_CAUSAL || kpj <= qp[mt][h]) &&
                                           ATT_DOC_OK(kpj, ds[mt][h]);
                            float x = fmaf(s[mt][nt][2 * h + e], sl2, nl2[mt][h]);
                            float p = visible ? att_exp2(x) : 0.0f;
                            float z = 1.0f;
                            if (ATT_DROPPING(drop_p) && visible)
                                z = ATT_KEEP(r[mt][h], j);
                            dp[mt][nt][2 * h + e] = p * (dp[mt][nt][2 * h + e] * z - Dm[mt][h]);
                        }
                }
        }
        att_mma_acc_mt<BC, MT>(dqa, dp, Ks[buf], lane);
        __syncthreads(); /* every warp is done with this buffer before it is refilled */
        if (NB == 1) {
            while (kn < sk && !ATT_DQ_SEEN(kn)) kn += BC;
            if (kn < sk) {
                att_stage_async<BC>(Ks[0], k, kn, sk, b, kH, bi, kh);
                att_stage_async<BC>(Vs[0], v, kn, sk, b, kH, bi, kh);
            }
            att_cp_commit();
        }
        k0 = kn;
    }
#undef ATT_DQ_SEEN
    att_cp_wait<0>();
#pragma unroll
    for (int mt = 0; mt < MT; mt++) {
#pragma unroll
        for (int dt = 0; dt < DT; dt++)
#pragma unroll
            for (int e = 0; e < 4; e++) dqa[mt][dt][e] *= scale;
        att_store_acc(dq, dqa[mt], r[mt], sq, b, qH, bi, qh, tig);
#if MGC_CS /* m-tile mt: the rows q0 + 64 mt .. + 63, a tile of partials when it holds rows
            * (the block's second m-tile may lie past sq: its row would be another's) */
        static_assert(sizeof(Ks) >= 4 * 8 * DT * sizeof(float), "attention_bwd_dq: red in Ks");
        if (q0 + 64 * mt < sq)
            att_colsum<DT>(att_cs_row(cs, bi, q0 + 64 * mt, sq, qH, qh), dqa[mt], r[mt], sq, 0,
                           reinterpret_cast<float *>(&Ks[0][0][0]));
#endif
    }
}
#endif
