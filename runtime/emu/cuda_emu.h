/* cuda_emu.h - what a kernels/ template needs from CUDA, on the host: the CUDA
 * emulator (runtime/emu_kernel.c) compiles each kernel spec's generated source
 * with the host C++ compiler and `-include cuda_emu.h`, defining MGC_EMU.
 *
 * Every GPU thread runs the kernel as a fiber; this header gives it its
 * threadIdx/blockIdx, turns __shared__ variables into per-OS-thread statics
 * (one block runs at a time on an OS thread, so its threads share them), and
 * routes every collective -- barriers, warp shuffles and matches, and the
 * tensor-core mma/ldmatrix the templates reach through inline PTX (their
 * MGC_EMU branches) -- to the emulator, which completes it once every
 * participant has arrived.  cp.async copies stay pending until the thread's
 * wait_group retires their group, as on hardware: a kernel that reads a tile
 * before waiting for it reads stale data here too.
 *
 * C++17, no CUDA header: only what the templates use.  Host arithmetic is IEEE
 * fp32/fp64 as on the GPU, but the compiler may contract a*b+c differently from
 * nvcc, so results are compared with tolerances, never bit for bit. */
#ifndef MGC_CUDA_EMU_H
#define MGC_CUDA_EMU_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#include <cstddef>
#include <type_traits>
#include <utility>

#include "emu_abi.h"

#define MGC_EMU 1

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __noinline__
#define __launch_bounds__(...)
#define __grid_constant__
#define __align__(n) __attribute__((aligned(n)))
/* block-shared: one copy per OS thread, which runs one block at a time */
#define __shared__ static thread_local

/* ---- the running thread ----------------------------------------------------------------- */

static const mgc_emu_rt *mgc_emu_rtp;
static thread_local mgc_emu_thr *mgc_emu_cur;

#define threadIdx (mgc_emu_cur->tid)
#define blockIdx  (mgc_emu_cur->bid)
#define blockDim  (mgc_emu_cur->bdim)
#define gridDim   (mgc_emu_cur->gdim)
#define warpSize  32

/* a collective: other fibers run until it completes; then this thread is current again */
static inline void mgc_emu_coll(int kind, int line, unsigned mask, long long param, const void *in,
                                unsigned in_bytes, void *out, unsigned out_bytes) {
    mgc_emu_thr *me = mgc_emu_cur;
    mgc_emu_rtp->coll(me, kind, line, mask, param, in, in_bytes, out, out_bytes);
    mgc_emu_cur = me;
}

/* ---- vector types ----------------------------------------------------------------------- */

struct alignas(8) float2 { float x, y; };
struct alignas(16) float4 { float x, y, z, w; };
struct alignas(8) uint2 { unsigned x, y; };
struct alignas(16) uint4 { unsigned x, y, z, w; };
struct alignas(8) int2 { int x, y; };
struct alignas(16) int4 { int x, y, z, w; };
static inline float2 make_float2(float x, float y) { return float2{x, y}; }
static inline float4 make_float4(float x, float y, float z, float w) { return float4{x, y, z, w}; }
static inline uint2 make_uint2(unsigned x, unsigned y) { return uint2{x, y}; }
static inline uint4 make_uint4(unsigned x, unsigned y, unsigned z, unsigned w) {
    return uint4{x, y, z, w};
}
static inline int2 make_int2(int x, int y) { return int2{x, y}; }
static inline int4 make_int4(int x, int y, int z, int w) { return int4{x, y, z, w}; }

/* ---- intrinsics ------------------------------------------------------------------------- */

template <class To, class From> static inline To mgc_emu_bits(From f) {
    static_assert(sizeof(To) == sizeof(From), "same size");
    To t;
    memcpy(&t, &f, sizeof t);
    return t;
}
static inline float __int_as_float(int i) { return mgc_emu_bits<float>(i); }
static inline float __uint_as_float(unsigned u) { return mgc_emu_bits<float>(u); }
static inline int __float_as_int(float f) { return mgc_emu_bits<int>(f); }
static inline unsigned __float_as_uint(float f) { return mgc_emu_bits<unsigned>(f); }
static inline double __longlong_as_double(long long v) { return mgc_emu_bits<double>(v); }
static inline long long __double_as_longlong(double d) { return mgc_emu_bits<long long>(d); }
static inline double __dmul_rn(double a, double b) { return a * b; }
static inline double __dadd_rn(double a, double b) { return a + b; }
static inline double __dsub_rn(double a, double b) { return a - b; }
static inline double __ddiv_rn(double a, double b) { return a / b; }
static inline double __dsqrt_rn(double a) { return sqrt(a); }
static inline double __fma_rn(double a, double b, double c) { return fma(a, b, c); }
static inline float __fmul_rn(float a, float b) { return a * b; }
static inline float __fadd_rn(float a, float b) { return a + b; }
static inline float __fdividef(float a, float b) { return a / b; }
/* (glibc declares functions of these names: macros, so that CUDA's meaning is taken) */
#define __expf  expf
#define __logf  logf
#define __log2f log2f
static inline float __saturatef(float x) { return x < 0.0f ? 0.0f : x > 1.0f ? 1.0f : x; }
static inline float rsqrtf(float x) { return 1.0f / sqrtf(x); }
static inline double rsqrt(double x) { return 1.0 / sqrt(x); }
/* sin(pi x), cos(pi x) with x reduced exactly first (as CUDA's sincospi) */
static inline void sincospi(double x, double *s, double *c) {
    double r = remainder(x, 2.0); /* exact: |r| <= 1 */
    *s = sin(r * 3.14159265358979323846);
    *c = cos(r * 3.14159265358979323846);
}
static inline unsigned __umulhi(unsigned a, unsigned b) {
    return (unsigned)(((unsigned long long)a * b) >> 32);
}
static inline unsigned long long __umul64hi(unsigned long long a, unsigned long long b) {
    return (unsigned long long)(((unsigned __int128)a * b) >> 64);
}
static inline int __popc(unsigned x) { return __builtin_popcount(x); }
static inline int __popcll(unsigned long long x) { return __builtin_popcountll(x); }
static inline int __clz(int x) { return x ? __builtin_clz((unsigned)x) : 32; }
static inline int __ffs(int x) { return __builtin_ffs(x); }
static inline unsigned __brev(unsigned x) {
    unsigned r = 0;
    for (int i = 0; i < 32; i++) r |= ((x >> i) & 1u) << (31 - i);
    return r;
}
template <class T> static inline T __ldg(const T *p) { return *p; }
static inline size_t __cvta_generic_to_shared(const void *p) { return (size_t)p; }
static inline int min(int a, int b) { return a < b ? a : b; }
static inline int max(int a, int b) { return a > b ? a : b; }
static inline unsigned min(unsigned a, unsigned b) { return a < b ? a : b; }
static inline unsigned max(unsigned a, unsigned b) { return a > b ? a : b; }
static inline long long min(long long a, long long b) { return a < b ? a : b; }
static inline long long max(long long a, long long b) { return a > b ? a : b; }

/* fp32 -> fp16 bits, round to nearest even (PTX cvt.rn.f16.f32): overflow to infinity,
 * subnormals rounded, NaN kept quiet */
static inline unsigned short mgc_emu_f32_to_f16(float f) {
    unsigned u = __float_as_uint(f), sign = (u >> 16) & 0x8000u, a = u & 0x7fffffffu;
    if (a > 0x7f800000u) return (unsigned short)(sign | 0x7e00u | ((a >> 13) & 0x3ffu));
    if (a >= 0x477ff000u) return (unsigned short)(sign | 0x7c00u); /* rounds past 65504 */
    if (a < 0x38800000u) {                                          /* subnormal or zero */
        float m = __uint_as_float(a) * 16777216.0f;                 /* x 2^24: exact */
        unsigned q = (unsigned)m;                                   /* units of 2^-24 */
        float rem = m - (float)q;
        if (rem > 0.5f || (rem == 0.5f && (q & 1u))) q++;
        return (unsigned short)(sign | q);
    }
    unsigned e = (a >> 23) - 112, mant = a & 0x7fffffu;
    unsigned h = (e << 10) | (mant >> 13), rest = mant & 0x1fffu;
    if (rest > 0x1000u || (rest == 0x1000u && (h & 1u))) h++;
    return (unsigned short)(sign | h);
}
static inline unsigned short mgc_emu_f32_to_bf16(float f) {
    unsigned u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (unsigned short)((u >> 16) | 0x40u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (unsigned short)(u >> 16);
}

/* ---- block and warp collectives ----------------------------------------------------------- */

static inline void mgc_emu_syncthreads(int line) {
    mgc_emu_coll(MGC_EMU_SYNC, line, 0, 0, nullptr, 0, nullptr, 0);
}
static inline int mgc_emu_syncthreads_or(int line, int p) {
    int in = p != 0, out = 0;
    mgc_emu_coll(MGC_EMU_SYNC_OR, line, 0, 0, &in, sizeof in, &out, sizeof out);
    return out;
}
template <class T>
static inline T mgc_emu_shfl_xor(int line, unsigned mask, T v, int lane_mask, int width = 32) {
    static_assert(sizeof(T) <= 8, "shuffle of at most 8 bytes");
    unsigned long long in = 0, out = 0;
    memcpy(&in, &v, sizeof v);
    mgc_emu_coll(MGC_EMU_SHFL_XOR, line, mask, (long long)(lane_mask & 31) | ((long long)width << 8),
                 &in, 8, &out, 8);
    T r;
    memcpy(&r, &out, sizeof r);
    return r;
}
template <class T> static inline unsigned mgc_emu_match_any(int line, unsigned mask, T v) {
    static_assert(sizeof(T) <= 8, "match of at most 8 bytes");
    unsigned long long in = 0;
    unsigned out = 0;
    memcpy(&in, &v, sizeof v);
    mgc_emu_coll(MGC_EMU_MATCH_ANY, line, mask, 0, &in, 8, &out, sizeof out);
    return out;
}
/* __syncwarp(mask): every lane of the mask arrives (a shuffle no value rides on) */
struct mgc_emu_syncwarp_at {
    int line;
    void operator()(unsigned mask = 0xffffffffu) const { (void)mgc_emu_shfl_xor(line, mask, 0, 0); }
};
#define __syncwarp            mgc_emu_syncwarp_at{__LINE__}
#define __syncthreads()       mgc_emu_syncthreads(__LINE__)
#define __syncthreads_or(p)   mgc_emu_syncthreads_or(__LINE__, (p))
#define __shfl_xor_sync(...)  mgc_emu_shfl_xor(__LINE__, __VA_ARGS__)
#define __match_any_sync(...) mgc_emu_match_any(__LINE__, __VA_ARGS__)

/* mma.sync.aligned.m16n8k16.row.col.f32.{bf16,f16}.f32: c += a b over the warp (fragments as
 * in the PTX ISA; kernels/attention.cuh att_mma) */
static inline void mgc_emu_mma(int line, int f16, float c[4], const unsigned a[4], unsigned b0,
                               unsigned b1) {
    unsigned in[10];
    for (int i = 0; i < 4; i++) in[i] = a[i];
    in[4] = b0, in[5] = b1;
    memcpy(in + 6, c, 16);
    mgc_emu_coll(f16 ? MGC_EMU_MMA_F16 : MGC_EMU_MMA_BF16, line, 0xffffffffu, 0, in, sizeof in, c,
                 16);
}
/* ldmatrix.sync.aligned.m8n8.x4[.trans].shared.b16 */
static inline void mgc_emu_ldsm4(int line, bool trans, unsigned r[4], const unsigned short *p) {
    mgc_emu_coll(trans ? MGC_EMU_LDSM_T : MGC_EMU_LDSM, line, 0xffffffffu, 0, &p, sizeof p, r, 16);
}

/* ---- programmatic dependent launch (kernels/mgc_common.cuh's mgc_pdl_begin) ------------ */

/* Nothing to wait for here (launches run one after another), but the contract is checked: the
 * emulator fails a launch where a thread did not call it exactly once, before its first
 * collective (the emulator's side) and its first cp.async (here). */
static inline void mgc_emu_pdl_begin() {
    mgc_emu_thr *t = mgc_emu_cur;
    if (t->pdl || t->n_cp || t->commits) t->pdl_late = 1;
    t->pdl++;
}

/* ---- cp.async: pending until wait_group retires the group --------------------------------- */

static inline void mgc_emu_cp_done(mgc_emu_cp *c) {
    if (c->src) memcpy(c->dst, c->src, c->bytes);
    else memset(c->dst, 0, c->bytes);
}
/* cp.async.{ca,cg}.shared.global [dst], [src], bytes, src-size (ok ? bytes : 0: zero-fill) */
static inline void mgc_emu_cp_async(void *dst, const void *src, unsigned bytes, bool ok) {
    mgc_emu_thr *t = mgc_emu_cur;
    if (t->n_cp == MGC_EMU_CP_MAX) { /* full: the oldest lands now, as hardware may */
        mgc_emu_cp_done(&t->cp[0]);
        memmove(t->cp, t->cp + 1, (MGC_EMU_CP_MAX - 1) * sizeof t->cp[0]);
        t->n_cp--;
    }
    t->cp[t->n_cp++] = mgc_emu_cp{dst, ok ? src : nullptr, bytes, t->commits};
}
static inline void mgc_emu_cp_commit() {
    mgc_emu_cur->commits++;
}
/* cp.async.wait_group n: every committed group but the n most recent has landed */
static inline void mgc_emu_cp_wait(int n) {
    mgc_emu_thr *t = mgc_emu_cur;
    int k = 0;
    for (int i = 0; i < t->n_cp; i++) {
        if (t->cp[i].group + (unsigned)n < t->commits) mgc_emu_cp_done(&t->cp[i]);
        else t->cp[k++] = t->cp[i];
    }
    t->n_cp = k;
}

/* at the thread's exit: what is still pending lands */
static inline void mgc_emu_cp_flush() {
    mgc_emu_thr *t = mgc_emu_cur;
    for (int i = 0; i < t->n_cp; i++) mgc_emu_cp_done(&t->cp[i]);
    t->n_cp = 0;
}

/* ---- the entry the emulator calls for every thread ---------------------------------------- */

template <class... A, size_t... I>
static inline void mgc_emu_invoke_(void (*f)(A...), void **args, std::index_sequence<I...>) {
    f(*static_cast<typename std::remove_cv<typename std::remove_reference<A>::type>::type *>(
        args[I])...);
}
/* args as cudaLaunchKernel's: a pointer to each argument */
template <class... A> static inline void mgc_emu_invoke(void (*f)(A...), void **args) {
    mgc_emu_invoke_(f, args, std::index_sequence_for<A...>{});
}

/* the byte sizes of a kernel's parameters, in order: an emulated CUDA graph (emu_backend.c)
 * copies that many bytes of each argument when it records a launch, as a capture does */
template <class... A> static inline int mgc_emu_param_sizes(void (*)(A...), unsigned long long *sz, int max) {
    const unsigned long long s[] = {
        (unsigned long long)sizeof(typename std::remove_cv<typename std::remove_reference<A>::type>::type)...,
        0ull};
    int n = (int)sizeof...(A);
    for (int i = 0; i < n && i < max; i++)
        sz[i] = s[i];
    return n;
}

extern "C" int mgc_emu_abi(void) {
    return MGC_EMU_ABI;
}
extern "C" void mgc_emu_bind(const mgc_emu_rt *rt) {
    mgc_emu_rtp = rt;
}

#endif /* MGC_CUDA_EMU_H */
