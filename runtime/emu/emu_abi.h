/* emu_abi.h - the contract between runtime/emu_kernel.c (the CUDA emulator) and a
 * kernel compiled for it (runtime/emu/cuda_emu.h, compiled into every emulated
 * kernel's shared object).  C, so both sides read the same layout; bump
 * MGC_EMU_ABI whenever it changes (it is part of the kernel cache key, and the
 * loader refuses an object of another ABI).
 *
 * Each GPU thread of a block runs the kernel as a fiber of its own.  A fiber
 * runs without interruption until it reaches a collective (a block barrier, a
 * warp shuffle, an mma or ldmatrix) or returns; the collective calls back into
 * the emulator (mgc_emu_rt.coll), which switches to the next runnable fiber and
 * completes the collective once every participant has arrived. */
#ifndef MGC_EMU_ABI_H
#define MGC_EMU_ABI_H

#define MGC_EMU_ABI 4 /* 3: mgc_emu_params (a recorded launch copies its arguments); 4: dyn_bytes */

/* the most bytes one thread hands a collective, or gets back */
#define MGC_EMU_OPND_MAX 48
/* cp.async copies a thread may have pending (beyond: the oldest complete early, as hardware
 * may) */
#define MGC_EMU_CP_MAX 64

typedef struct mgc_emu_u3 {
    unsigned x, y, z;
} mgc_emu_u3;

/* one pending cp.async: bytes from src to dst (src NULL: zeros), in commit group `group` */
typedef struct mgc_emu_cp {
    void *dst;
    const void *src;
    unsigned bytes;
    unsigned group;
} mgc_emu_cp;

/* collectives (mgc_emu_rt.coll kind) */
enum {
    MGC_EMU_SYNC = 1,     /* __syncthreads: block barrier */
    MGC_EMU_SYNC_OR,      /* __syncthreads_or: in int, out int */
    MGC_EMU_SHFL_XOR,     /* __shfl_xor_sync: in 8 bytes, param lane mask | width << 8 */
    MGC_EMU_MATCH_ANY,    /* __match_any_sync: in 8 bytes, out unsigned lane mask */
    MGC_EMU_MMA_BF16,     /* mma.sync m16n8k16 f32.bf16.bf16.f32: in a[4] b[2] (u32) c[4] (f32) */
    MGC_EMU_MMA_F16,      /* the same with f16 inputs */
    MGC_EMU_LDSM,         /* ldmatrix.x4 .b16: in the row address, out r[4] */
    MGC_EMU_LDSM_T        /* ldmatrix.x4.trans */
};

typedef struct mgc_emu_thr {
    mgc_emu_u3 tid, bid, bdim, gdim; /* threadIdx, blockIdx, blockDim, gridDim */
    void *dyn_shared;                /* the block's dynamic shared memory (launch's bytes) */
    unsigned dyn_bytes;              /* its size: the launch's (%dynamic_smem_size) */
    unsigned commits;                /* cp.async groups committed so far */
    int n_cp;                        /* pending copies in cp[] */
    mgc_emu_cp cp[MGC_EMU_CP_MAX];
    void *fiber;                     /* the emulator's own state of this thread */
    /* mgc_pdl_begin (kernels/mgc_common.cuh): calls so far, and calls that came after a
     * collective or a cp.async (the entry must call it first, once) */
    unsigned pdl, pdl_late;
} mgc_emu_thr;

typedef struct mgc_emu_rt {
    int abi; /* MGC_EMU_ABI */
    /* Thread t arrives at collective `kind` (at source line `line`, lane mask `mask` for warp
     * collectives) with in[0 .. in_bytes); returns once every participant has arrived, with
     * the thread's result in out[0 .. out_bytes). */
    void (*coll)(mgc_emu_thr *t, int kind, int line, unsigned mask, long long param, const void *in,
                 unsigned in_bytes, void *out, unsigned out_bytes);
} mgc_emu_rt;

#endif /* MGC_EMU_ABI_H */
