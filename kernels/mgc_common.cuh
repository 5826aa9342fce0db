/* mgc_common.cuh - what every kernel template includes: the storage type of
 * activations and weights (fp32, bf16 or fp16, from the prologue's MGC_BF16 and
 * MGC_FP16), loads and stores that compute in fp32, and deterministic block
 * reductions.
 *
 * bf16 and fp16 are handled as their bit patterns (unsigned short): bf16 through
 * PTX's cvt on sm_80 and newer (round to nearest even; written out here for the
 * emulator and older architectures), fp16 through PTX's cvt
 * (round to nearest even; overflow to infinity, which dynamic loss scaling
 * detects), so the templates need no toolkit header and NVRTC compiles them
 * with no include path.  MGC_HALF: 16-bit storage, either kind. */
#ifndef MGC_COMMON_CUH
#define MGC_COMMON_CUH

#ifndef MGC_BF16
#error "the codegen prologue defines MGC_BF16"
#endif
#ifndef MGC_FP16
#define MGC_FP16 0
#endif
#define MGC_HALF (MGC_BF16 || MGC_FP16)

typedef long long i64;

/* the launch's dynamic shared memory as an array `name` of T; mgc_dyn_bytes() its size in
 * bytes (the launch's), and mgc_trap() ends the grid with an error (a launcher that gave a
 * kernel less than it needs) */
#ifdef MGC_EMU /* the CUDA emulator (runtime/emu/cuda_emu.h) */
#define MGC_DYN_SHARED(T, name) T *name = (T *)mgc_emu_cur->dyn_shared
__device__ __forceinline__ unsigned mgc_dyn_bytes(void) {
    return mgc_emu_cur->dyn_bytes;
}
__device__ __forceinline__ void mgc_trap(void) {
    __builtin_trap();
}
#else
#define MGC_DYN_SHARED(T, name) extern __shared__ T name[]
__device__ __forceinline__ unsigned mgc_dyn_bytes(void) {
    unsigned r;
    asm("mov.u32 %0, %%dynamic_smem_size;" : "=r"(r));
    return r;
}
__device__ __forceinline__ void mgc_trap(void) {
    __trap();
}
#endif

/* Programmatic dependent launch (docs/cuda-backend.md, "Programmatic dependent launch").
 * Every kernel entry calls mgc_pdl_begin() first, before it touches global memory:
 *   griddepcontrol.wait             returns once the grids this one was launched to overlap
 *                                   (the previous kernel of the stream, launched early under
 *                                   MGC_PDL) have completed and their writes are visible: a
 *                                   no-op for a grid launched the ordinary way;
 *   griddepcontrol.launch_dependents lets the next kernel of the stream, when it too was
 *                                   launched under MGC_PDL, start its blocks (which wait in
 *                                   their own mgc_pdl_begin) once every block of this grid
 *                                   has passed here: they take the multiprocessors this
 *                                   grid's last wave leaves idle.
 * After the wait, so that at most one kernel waits at a time.  sm_90 and newer; elsewhere
 * nothing (the runtime sets the launch attribute only on such GPUs).  The CUDA emulator
 * checks that every thread of every kernel calls it before any collective. */
#ifdef MGC_EMU
#define mgc_pdl_begin() mgc_emu_pdl_begin()
#elif defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
__device__ __forceinline__ void mgc_pdl_begin() {
    asm volatile("griddepcontrol.wait;\n" ::: "memory");
    asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
}
#else
__device__ __forceinline__ void mgc_pdl_begin() {}
#endif

#ifndef INFINITY /* NVRTC has no math.h */
#define INFINITY __int_as_float(0x7f800000)
#endif

#if MGC_BF16
typedef unsigned short mgc_t; /* bf16 bits */
__device__ __forceinline__ float mgc_ld(mgc_t v) {
    return __uint_as_float(((unsigned)v) << 16);
}
/* sm_80's cvt to bf16 (one instruction for two values, where the integer rounding below takes
 * about 8 a value) rounds to nearest even as that does: the same bits, but for a NaN's payload
 * (the cvt's NaN is canonical) */
#if defined(MGC_EMU) || (defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800)
#define MGC_BF16_CVT 0
#else
#define MGC_BF16_CVT 1
#endif
__device__ __forceinline__ mgc_t mgc_st(float f) {
#if MGC_BF16_CVT
    unsigned short h;
    asm("cvt.rn.bf16.f32 %0, %1;\n" : "=h"(h) : "f"(f));
    return h;
#else
    unsigned u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (mgc_t)((u >> 16) | 0x40u); /* quiet NaN */
    u += 0x7fffu + ((u >> 16) & 1u);                                       /* nearest even */
    return (mgc_t)(u >> 16);
#endif
}
#elif MGC_FP16
typedef unsigned short mgc_t; /* fp16 bits */
/* fp16 bits -> fp32, exactly, in integer/fp32 arithmetic (an inline-asm cvt made ptxas spill
 * in the dropout kernels): normals and subnormals by rebiasing (x 2^112), then inf/NaN, sign */
__device__ __forceinline__ float mgc_f16_to_f32(unsigned h) {
    unsigned a = h & 0x7fffu;
    float f = __uint_as_float(a << 13) * __uint_as_float(0x77800000u);
    if (a >= 0x7c00u) f = __uint_as_float(0x7f800000u | (a << 13));
    return __uint_as_float(__float_as_uint(f) | ((h & 0x8000u) << 16));
}
__device__ __forceinline__ float mgc_ld(mgc_t v) {
    return mgc_f16_to_f32(v);
}
__device__ __forceinline__ mgc_t mgc_st(float f) {
#ifdef MGC_EMU /* the CUDA emulator (runtime/emu/cuda_emu.h) */
    return mgc_emu_f32_to_f16(f);
#else
    unsigned r;
    asm("cvt.rn.f16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(0.0f), "f"(f));
    return (mgc_t)r;
#endif
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

#if MGC_HALF
/* the two values of a 32-bit word of 16-bit storage (lo: the lower half) */
__device__ __forceinline__ void mgc_unpack2(unsigned w, float &lo, float &hi) {
#if MGC_BF16
    lo = __uint_as_float(w << 16);
    hi = __uint_as_float(w & 0xffff0000u);
#else
    lo = mgc_f16_to_f32(w & 0xffffu);
    hi = mgc_f16_to_f32(w >> 16);
#endif
}
/* two values as a 32-bit word of 16-bit storage (lo: the lower half), rounded as mgc_st */
__device__ __forceinline__ unsigned mgc_pack2(float lo, float hi) {
#if MGC_BF16 && MGC_BF16_CVT
    unsigned r;
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
#elif MGC_BF16
    return (unsigned)mgc_st(lo) | ((unsigned)mgc_st(hi) << 16);
#elif defined(MGC_EMU)
    return (unsigned)mgc_emu_f32_to_f16(lo) | ((unsigned)mgc_emu_f32_to_f16(hi) << 16);
#else
    unsigned r;
    asm("cvt.rn.f16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
#endif
}
#endif

/* ---- 8-element vectors (16-byte accesses of bf16/fp16; two of fp32) --------------------
 * p must be 16-byte aligned (the arena aligns every tensor to 256 bytes; a row of H elements
 * stays aligned when H % 8 == 0).  Values are fp32, as mgc_ld / mgc_st. */
__device__ __forceinline__ void mgc_ld8(const mgc_t *__restrict__ p, float (&f)[8]) {
#if MGC_HALF
    uint4 u = *(const uint4 *)p;
    unsigned w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
    for (int j = 0; j < 4; j++) mgc_unpack2(w[j], f[2 * j], f[2 * j + 1]);
#else
    float4 a = ((const float4 *)p)[0], b = ((const float4 *)p)[1];
    f[0] = a.x, f[1] = a.y, f[2] = a.z, f[3] = a.w;
    f[4] = b.x, f[5] = b.y, f[6] = b.z, f[7] = b.w;
#endif
}
/* The same, element by element, for the first `nv` (<= 8; 0 past it on loads) of 8 elements
 * at any alignment. */
__device__ __forceinline__ void mgc_ld8_part(const mgc_t *__restrict__ p, int nv, float (&f)[8]) {
#pragma unroll
    for (int j = 0; j < 8; j++)
        f[j] = j < nv ? mgc_ld(p[j]) : 0.0f;
}
__device__ __forceinline__ void mgc_st8_part(mgc_t *__restrict__ p, int nv, const float (&f)[8]) {
#pragma unroll
    for (int j = 0; j < 8; j++)
        if (j < nv) p[j] = mgc_st(f[j]);
}
/* Raw 8 storage values (bits of bf16, fp16 or fp32), to copy without conversion. */
#if MGC_HALF
typedef uint4 mgc_raw8;
#else
struct mgc_raw8 {
    float4 a, b;
};
#endif
__device__ __forceinline__ mgc_raw8 mgc_ldraw8(const mgc_t *p) {
#if MGC_HALF
    return *(const uint4 *)p;
#else
    mgc_raw8 r;
    r.a = ((const float4 *)p)[0];
    r.b = ((const float4 *)p)[1];
    return r;
#endif
}
__device__ __forceinline__ void mgc_straw8(mgc_t *p, mgc_raw8 r) {
#if MGC_HALF
    *(uint4 *)p = r;
#else
    ((float4 *)p)[0] = r.a;
    ((float4 *)p)[1] = r.b;
#endif
}
/* The fp32 values of raw storage values. */
__device__ __forceinline__ void mgc_unraw8(const mgc_raw8 &r, float (&f)[8]) {
#if MGC_HALF
    unsigned w[4] = {r.x, r.y, r.z, r.w};
#pragma unroll
    for (int j = 0; j < 4; j++) mgc_unpack2(w[j], f[2 * j], f[2 * j + 1]);
#else
    f[0] = r.a.x, f[1] = r.a.y, f[2] = r.a.z, f[3] = r.a.w;
    f[4] = r.b.x, f[5] = r.b.y, f[6] = r.b.z, f[7] = r.b.w;
#endif
}
/* 8 fp32 values rounded to storage values; mgc_st8 stores them (p 16-byte aligned, as mgc_ld8). */
__device__ __forceinline__ mgc_raw8 mgc_toraw8(const float (&f)[8]) {
    mgc_raw8 r;
#if MGC_HALF
    r = make_uint4(mgc_pack2(f[0], f[1]), mgc_pack2(f[2], f[3]), mgc_pack2(f[4], f[5]),
                   mgc_pack2(f[6], f[7]));
#else
    r.a = make_float4(f[0], f[1], f[2], f[3]);
    r.b = make_float4(f[4], f[5], f[6], f[7]);
#endif
    return r;
}
__device__ __forceinline__ void mgc_st8(mgc_t *__restrict__ p, const float (&f)[8]) {
    mgc_straw8(p, mgc_toraw8(f));
}
__device__ __forceinline__ mgc_raw8 mgc_raw8_zero() {
    mgc_raw8 r;
#if MGC_HALF
    r = make_uint4(0u, 0u, 0u, 0u);
#else
    r.a = r.b = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#endif
    return r;
}
/* 16-byte alignment of a pointer (a uniform test: kernels take the vector path when it holds). */
__device__ __forceinline__ bool mgc_al16(const void *p) {
    return ((unsigned long long)p & 15ull) == 0;
}

/* Sum over the warp in a fixed butterfly order; every lane gets the same bits (each level
 * adds the same two values, commutatively). */
__device__ __forceinline__ float mgc_warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
__device__ __forceinline__ float mgc_warp_max(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

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

/* The stable rank of this thread's value e (0 <= e < E; -1: none) among the block's: the
 * threads before it in its warp with the same value; wc[w E + e] (shared memory, E ints for
 * each of the block's warps) is set to warp w's count of e, 0 for values it lacks.  With the
 * counts of the warps before this one, the rank among the whole block (a counting sort's
 * stable scatter: kernels/moe.cuh's dispatch map, embedding.cuh's radix sort).  Every thread of
 * the block calls it together; it begins and ends with a barrier, so wc may be read until the
 * next call's first barrier. */
__device__ __forceinline__ int mgc_block_rank(int e, int E, int *wc) {
    for (int i = threadIdx.x; i < (int)(blockDim.x >> 5) * E; i += blockDim.x) wc[i] = 0;
    __syncthreads();
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    const unsigned same = __match_any_sync(0xffffffffu, e);
    const int rank = __popc(same & ((1u << lane) - 1u));
    if (e >= 0 && rank == 0) wc[w * E + e] = __popc(same);
    __syncthreads();
    return rank;
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

/* Words of the 8 consecutive elements e0 .. e0 + 7 of a stream: Philox blocks e0 >> 2 and
 * the next one or two (when e0 & 3 != 0), shifted with selects (no dynamic index). */
__device__ __forceinline__ void mgc_philox_words8(unsigned long long seed, unsigned long long stream,
                                                  unsigned long long e0, unsigned (&wd)[8]) {
    unsigned long long b = e0 >> 2;
    int o = (int)(e0 & 3ull);
    unsigned a[12];
    mgc_philox4x32(seed, stream, b, a);
    mgc_philox4x32(seed, stream, b + 1, a + 4);
    a[8] = a[9] = a[10] = a[11] = 0u;
    if (o) mgc_philox4x32(seed, stream, b + 2, a + 8);
#pragma unroll
    for (int j = 0; j < 8; j++)
        wd[j] = o == 0 ? a[j] : o == 1 ? a[j + 1] : o == 2 ? a[j + 2] : a[j + 3];
}

/* A dropout stream with the step's part (runtime/backend.c mgc_op_dropout_stream: the name's
 * hash ^ the microbatch's ^ rng.h mgc_rng_step_mix(step)): the launcher passes the rest by
 * value and the step in device memory, which the backend sets before each step's work, so a
 * CUDA graph recorded once draws every step's masks (docs/runtime.md, "Graphs"). */
__device__ __forceinline__ unsigned long long mgc_step_stream(unsigned long long base,
                                                              const unsigned long long *step) {
    return base ^ (__ldg(step) * 0x9E3779B97F4A7C15ull);
}

/* Position of row i of a context-parallel shard (runtime/cpu_backend.c ctx_positions):
 * cp <= 1: i; else chunks r and 2cp-1-r of the 2cp chunks of `half` rows each. */
__device__ __forceinline__ i64 mgc_ctx_pos(i64 i, i64 cp, i64 r, i64 half) {
    if (cp <= 1) return i;
    return i < half ? r * half + i : (2 * cp - 1 - r) * half + (i - half);
}

#endif /* MGC_COMMON_CUH */
