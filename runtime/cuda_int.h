/* cuda_int.h - private interface of the CUDA backend (cuda_backend.c) and of the
 * CUDA emulator's backend (emu_backend.c) for the per-family launchers they share
 * (cuda_ops_<family>.c, plain C: built with or without the CUDA toolkit).
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

/* What the launchers need of the backend under them: the CUDA backend (cuda_backend.c), or
 * the CUDA emulator's (emu_backend.c), which runs the same launchers and kernels on the CPU.
 * It is the first member of the backend's context, so `be->context` points to it. */

/* A GEMM's epilogue (cuBLASLt's names): besides D = op(A) op(B) (+ beta D), a bias (length
 * m) added (BIAS); with GELU_AUX(_BIAS), gelu of the result written to D and the result
 * (with the bias) to aux (m x n, aux_ld); with DGELU, D multiplied by gelu'(aux); with
 * DGELU_BGRAD, that and the sums of D's rows (over n) written to bias (length m, fp32); with
 * BGRADB, the sums of op(B) over its k dimension written to bias (length n, fp32). */
typedef enum mgc_gemm_epi_kind {
    MGC_GEMM_EPI_NONE,
    MGC_GEMM_EPI_BIAS,
    MGC_GEMM_EPI_GELU_AUX,
    MGC_GEMM_EPI_GELU_AUX_BIAS,
    MGC_GEMM_EPI_DGELU,
    MGC_GEMM_EPI_BGRADB,
    MGC_GEMM_EPI_DGELU_BGRAD
} mgc_gemm_epi_kind;

typedef struct mgc_gemm_epi {
    int kind;         /* mgc_gemm_epi_kind */
    const void *bias; /* NULL: none */
    int bias_type;    /* mgc_dtype */
    const void *aux;
    int64_t aux_ld;
    int aux_type;     /* mgc_dtype */
    int as_beta1;     /* beta 0 into a D of zeros: the GEMM chosen (and tuned) as with beta 1,
                         so the same algorithm and the bits of adding into them */
} mgc_gemm_epi;

typedef struct mgc_cuda_host {
    /* mgc_cuda_launch below */
    int (*launch)(mgc_backend *be, const mgc_kspec *k, unsigned gx, unsigned gy, unsigned gz,
                  unsigned block, size_t smem_bytes, void **args);
    /* mgc_cuda_scratch below */
    void *(*scratch)(mgc_backend *be, size_t bytes);
    /* Column-major D (m x n, ldc) = op(A) op(B) + beta D, fp32 accumulation; types are
     * mgc_dtype; ep NULL: none.  0; -1 with be->err; 1 when a GELU/DGELU/BGRAD epilogue cannot
     * be had for this shape (nothing ran: the caller runs the unfused kernels instead). */
    int (*gemm)(mgc_backend *be, int ta, int tb, int64_t m, int64_t n, int64_t k, const void *A,
                int64_t lda, int atype, const void *B, int64_t ldb, int btype, void *D,
                int64_t ldc, int ctype, float beta, const mgc_gemm_epi *ep);
    /* mgc_cuda_drop_step below: the device word that holds `step` once the work queued so
     * far has run (set in stream order when it held another); NULL with be->err */
    const unsigned long long *(*step)(mgc_backend *be, int64_t step);
    /* mgc_cuda_blocks_per_sm below */
    int (*blocks_per_sm)(mgc_backend *be, const mgc_kspec *k, unsigned block, size_t smem_bytes);
    int sms;       /* multiprocessors (grid sizing) */
    int epilogues; /* GEMM epilogues for the fused linear ops (MGC_GEMM_EPILOGUES != 0) */
    int bgrad_epilogue; /* cuBLASLt's BGRADB and DGELU_BGRAD for 16-bit bias gradients;
                           MGC_GEMM_BGRAD=0: ours */
} mgc_cuda_host;

/* Runs one compute op (cuda_ops_linear.c): the GEMMs of the linear and grouped ops through
 * host->gemm, every other op through its family's launcher.  0, or -1 with be->err. */
int mgc_cuda_run_op(mgc_backend *be, const mgc_op_call *c);

/* Launches the kernel of spec k (loaded from the plan's cubins for this GPU,
 * or JIT-compiled through NVRTC) on the compute stream; args as for
 * cudaLaunchKernel (an array of pointers to each argument).  0, or -1 with
 * the message in be->err (naming the kernel). */
int mgc_cuda_launch(mgc_backend *be, const mgc_kspec *k, unsigned grid_x, unsigned grid_y,
                    unsigned grid_z, unsigned block, size_t smem_bytes, void **args);
/* The blocks of kernel k, of `block` threads and smem_bytes of dynamic shared memory, that a
 * multiprocessor of the device holds at once: the CUDA occupancy calculator's answer
 * (registers, shared memory and threads); the emulator's counts the dynamic shared memory
 * alone, against MGC_EMU_SMEM_PER_SM (docs/cuda-emulator.md).  The kernel is loaded (or
 * JIT-compiled) as for a launch.  -1 with be->err. */
int mgc_cuda_blocks_per_sm(mgc_backend *be, const mgc_kspec *k, unsigned block, size_t smem_bytes);
/* Device scratch of at least `bytes`, reused by every op (ops run one after another on one
 * stream): the plan's kernel_scratch buffer, which codegen/kspec_scratch.c sizes for every
 * request a launcher makes (a larger one is allocated beside the arena, with a warning).  One
 * call per op: a second may return the same memory.  NULL with be->err on failure. */
void *mgc_cuda_scratch(mgc_backend *be, size_t bytes);
/* A dropout kernel's randomness for call c (p > 0): *stream = the op's stream (backend.h
 * mgc_op_dropout_stream) without the step's part (rng.h mgc_rng_step_mix), and the device
 * word the kernel reads the step from (kernels/mgc_common.cuh mgc_step_stream), which holds
 * c->iteration when the kernel runs.  Nothing a kernel takes by value then changes from step
 * to step, so a CUDA graph recorded once draws each step's masks.  NULL with be->err. */
const unsigned long long *mgc_cuda_drop_step(mgc_backend *be, const mgc_op_call *c,
                                             unsigned long long *stream);
/* A deterministic bias gradient (cuda_ops_linear.c): db (N, fp32) += the column sums of dy
 * (M, N) of dtype dy_dtype, by gemm_aux.cuh bias_grad_partial and norm.cuh norm_bwd_reduce (its
 * scratch: kspec.h mgc_kspec_bias_grad_parts (M) x N floats).  0, or -1 with be->err. */
int mgc_cuda_bias_grad(mgc_backend *be, float *db, const void *dy, int dy_dtype, int64_t M,
                       int64_t N);
/* Records a message in be->err; returns -1. */
int mgc_cuda_fail(mgc_backend *be, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;
/* Multiprocessors of the device (grid sizing). */
int mgc_cuda_sm_count(mgc_backend *be);

/* Family launchers: 0 on success; 1 when the op is not of their family. */
int mgc_cuda_ops_linear(mgc_backend *be, const mgc_op_call *c);
int mgc_cuda_ops_pointwise(mgc_backend *be, const mgc_op_call *c);
int mgc_cuda_ops_attention(mgc_backend *be, const mgc_op_call *c);
int mgc_cuda_ops_moe(mgc_backend *be, const mgc_op_call *c);

/* Optimizer kernels (cuda_ops_pointwise.c), on fp32 arrays of the arena, with backend.h's
 * signatures: the sum of squares of many tensors (deterministic: fixed-shape two-pass
 * reductions, a launch pair per table of tensors, one download); AdamW over many tensors
 * (cpu_ops.h mgc_cpu_adamw's math, bit for bit). */
int mgc_cuda_sumsq(mgc_backend *be, const float *const *g, const int64_t *n, int64_t count,
                   double *out);
int mgc_cuda_adamw(mgc_backend *be, const mgc_adamw_tensor *t, int64_t count,
                   const mgc_adamw_step *s);
int mgc_cuda_zero_list(mgc_backend *be, void *base, size_t bytes, float *const *p,
                       const int64_t *n, int64_t count);
int mgc_cuda_stores_fresh(mgc_backend *be, const mgc_plan_op *op, int k);
/* The fold of a reduction (backend.h fold): the plan's comm.cuh kernel for dt. */
int mgc_cuda_fold(mgc_backend *be, void *dst, const void *src, int parts, size_t count,
                  size_t stride, int dt, int op);

#ifdef __cplusplus
}
#endif
#endif /* MGC_CUDA_INT_H */
