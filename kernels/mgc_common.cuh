/* mgc_common.cuh - what every kernel template includes: the storage type of
 * activations and weights (fp32 or bf16, from the prologue's MGC_BF16), loads
 * and stores that compute in fp32, and deterministic block reductions.
 *
 * bf16 is handled as its bit pattern (unsigned short) with round-to-nearest-
 * even conversion written out here, so the templates need no toolkit header
 * and NVRTC compiles them with no include path. */
#ifndef MGC_COMMON_CUH
#define MGC_COMMON_CUH

#ifndef MGC_BF16
#error "the codegen prologue defines MGC_BF16"
#endif

typedef long long i64;

#ifndef INFINITY /* NVRTC has no math.h */
#define INFINITY __int_as_float(0x7f800000)
#endif

#if MGC_BF16
typedef unsigned short mgc_t; /* bf16 bits */
__device__ __forceinline__ float mgc_ld(mgc_t v) {
    return __uint_as_float(((unsigned)v) << 16);
}
__device__ __forceinline__ mgc_t mgc_st(float f) {
    unsigned u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (mgc_t)((u >> 16) | 0x40u); /* quiet NaN */
    u += 0x7fffu + ((u >> 16) & 1u);                                       /* nearest even */
    return (mgc_t)(u >> 16);
}
#else
typedef float mgc_t;
__device__ __forceinline__ float mgc_ld(mgc_t v) {
    return v;
}
__device__ __forceinline__ mgc_t mgc_st(float f) {
    return f;
}
#endif

/* Sum over a block of `blockDim.x` threads (a multiple of 32, at most 1024) in a
 * fixed order: warp shuffles, then warp 0 over the warp sums.  Every thread
 * gets the total.  `sh` holds 32 values of shared memory.  T: float or double. */
template <typename T> __device__ __forceinline__ T mgc_block_sum(T v, T *sh) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    int w = threadIdx.x >> 5, l = threadIdx.x & 31, nw = blockDim.x >> 5;
    __syncthreads();
    if (l == 0) sh[w] = v;
    __syncthreads();
    v = l < nw ? sh[l] : (T)0;
    if (w == 0)
        for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    __syncthreads(); /* every warp has read its sh[l] before sh[0] is reused */
    if (threadIdx.x == 0) sh[0] = v;
    __syncthreads();
    v = sh[0];
    __syncthreads();
    return v;
}

__device__ __forceinline__ float mgc_block_max(float v, float *sh) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    int w = threadIdx.x >> 5, l = threadIdx.x & 31, nw = blockDim.x >> 5;
    __syncthreads();
    if (l == 0) sh[w] = v;
    __syncthreads();
    v = l < nw ? sh[l] : -INFINITY;
    if (w == 0)
        for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    __syncthreads(); /* every warp has read its sh[l] before sh[0] is reused */
    if (threadIdx.x == 0) sh[0] = v;
    __syncthreads();
    v = sh[0];
    __syncthreads();
    return v;
}

/* ---- added for the pointwise family (kernels/pointwise.cuh, embedding.cuh) ------------- */

/* Philox-4x32-10 exactly as runtime/rng.c: counter (blk lo, blk hi, stream lo, stream hi),
 * key (seed lo, seed hi); element e of a stream is word e & 3 of block e >> 2.  The ten
 * rounds turn the counter c0..c3 into the block's four words in place. */
__device__ __forceinline__ void mgc_philox_rounds(unsigned &c0, unsigned &c1, unsigned &c2, unsigned &c3,
                                                  unsigned long long seed) {
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
}

__device__ __forceinline__ void mgc_philox4x32(unsigned long long seed, unsigned long long stream,
                                               unsigned long long blk, unsigned out[4]) {
    unsigned c0 = (unsigned)blk, c1 = (unsigned)(blk >> 32), c2 = (unsigned)stream,
             c3 = (unsigned)(stream >> 32);
    mgc_philox_rounds(c0, c1, c2, c3, seed);
    out[0] = c0;
    out[1] = c1;
    out[2] = c2;
    out[3] = c3;
}

/* Word of element e of stream (seed, stream): word e & 3 of Philox block e >> 2, picked
 * with selects (a dynamic index into the block would go through local memory). */
__device__ __forceinline__ unsigned mgc_philox_word(unsigned long long seed, unsigned long long stream,
                                                    unsigned long long e) {
    unsigned long long blk = e >> 2;
    unsigned c0 = (unsigned)blk, c1 = (unsigned)(blk >> 32), c2 = (unsigned)stream,
             c3 = (unsigned)(stream >> 32);
    mgc_philox_rounds(c0, c1, c2, c3, seed);
    unsigned w = e & 1 ? c1 : c0, w2 = e & 1 ? c3 : c2;
    return e & 2 ? w2 : w;
}

/* Position of row i of a context-parallel shard (runtime/cpu_backend.c ctx_positions):
 * cp <= 1: i; else chunks r and 2cp-1-r of the 2cp chunks of `half` rows each. */
__device__ __forceinline__ i64 mgc_ctx_pos(i64 i, i64 cp, i64 r, i64 half) {
    if (cp <= 1) return i;
    return i < half ? r * half + i : (2 * cp - 1 - r) * half + (i - half);
}

#endif /* MGC_COMMON_CUH */
