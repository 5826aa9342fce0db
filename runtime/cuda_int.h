/* cuda_int.h - private interface of the CUDA backend (cuda_backend.c) for its
 * per-family launchers (cuda_ops_<family>.c).  Built only with the CUDA toolkit.
 *
 * A launcher serves the ops of one family: it reads shapes and attributes from
 * the mgc_op_call (the same fields the CPU backend reads), asks codegen for
 * the op's kernel specs (mgc_kspecs_for_op, so the kernels are exactly those
 * `mgc compile` put in the plan), and launches them in that order on the
 * backend's compute stream with mgc_cuda_launch.  All pointers in the call are
 * device addresses inside the arena.  Kernels never use atomics on floats:
 * results are bit-identical run to run. */
#ifndef MGC_CUDA_INT_H
#define MGC_CUDA_INT_H

#include <stddef.h>
#include <stdint.h>

#include "backend.h"
#include "kspec.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Launches the kernel of spec k (loaded from the plan's cubins for this GPU,
 * or JIT-compiled through NVRTC) on the compute stream; args as for
 * cudaLaunchKernel (an array of pointers to each argument).  0, or -1 with
 * the message in be->err (naming the kernel). */
int mgc_cuda_launch(mgc_backend *be, const mgc_kspec *k, unsigned grid_x, unsigned grid_y,
                    unsigned grid_z, unsigned block, size_t smem_bytes, void **args);
/* Device scratch of at least `bytes`, reused by every op (ops run one after another on one
 * stream): the plan's kernel_scratch buffer, which codegen/kspec_scratch.c sizes for every
 * request a launcher makes (a larger one is allocated beside the arena, with a warning).  One
 * call per op: a second may return the same memory.  NULL with be->err on failure. */
void *mgc_cuda_scratch(mgc_backend *be, size_t bytes);
/* Records a message in be->err; returns -1. */
int mgc_cuda_fail(mgc_backend *be, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;
/* Multiprocessors of the device (grid sizing). */
int mgc_cuda_sm_count(mgc_backend *be);

/* Family launchers: 0 on success; 1 when the op is not of their family. */
int mgc_cuda_ops_pointwise(mgc_backend *be, const mgc_op_call *c);
int mgc_cuda_ops_attention(mgc_backend *be, const mgc_op_call *c);
int mgc_cuda_ops_moe(mgc_backend *be, const mgc_op_call *c);

/* Optimizer kernels (cuda_ops_pointwise.c), on fp32 arrays of the arena:
 * out = sum of squares of g[0..n) (deterministic: fixed-shape two-pass reduction);
 * AdamW as in cpu_ops.h mgc_cpu_adamw, with an optional 16-bit copy of the updated
 * weights written to `copy` (NULL: none) as `copy_dtype` (MGC_DT_BF16 or MGC_DT_F16);
 * x *= s; and fp32 -> bf16 casts. */
int mgc_cuda_sumsq(mgc_backend *be, const float *g, int64_t n, double *out);
int mgc_cuda_adamw(mgc_backend *be, float *p, const float *g, float *m, float *v, int64_t n,
                   double lr, double beta1, double beta2, double eps, double weight_decay,
                   int decay, int64_t step, double grad_scale, uint16_t *copy, int copy_dtype);
int mgc_cuda_scale(mgc_backend *be, float *x, int64_t n, double s);
int mgc_cuda_cast_bf16(mgc_backend *be, uint16_t *dst, const float *src, int64_t n);

#ifdef __cplusplus
}
#endif
#endif /* MGC_CUDA_INT_H */
