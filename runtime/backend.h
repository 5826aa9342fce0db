/* backend.h - the interface a compute backend implements for the executor.
 *
 * The executor (exec.h) walks a rank's instruction stream; everything that
 * touches tensor memory goes through a backend: the arena allocation, one call
 * per compute op of a chunk program (MGC_POP_* below MGC_POP_ALL_REDUCE), the
 * copies between staging buffers and boundary tensors, and the optimizer's
 * element-wise kernels.  Collectives go to the communicator (comm.h): on the
 * arena pointers when the communicator can read the backend's memory (host
 * memory for local/mpi), else through a host staging buffer (device_memory).
 *
 *     mgc_backend *be = NULL;
 *     mgc_backend_cpu_open(&be, err, sizeof err);     // or the CUDA one (issue 5)
 *     ... mgc_exec_open(&x, plan, world, be, ...) ...
 *     mgc_backend_close(be);
 *
 * A backend is { iface, context } as in ggml: the iface is a const table of
 * function pointers, the wrappers below call through it.  Every slot is
 * required except graph_begin / graph_end (NULL: no graphs), host_alloc /
 * host_free (NULL: malloc) and xfer_* (NULL: no reduction beside the compute on
 * device memory).  A slot returns 0 on
 * success, -1 with a message in be->err. */
#ifndef MGC_BACKEND_H
#define MGC_BACKEND_H

#include <stddef.h>
#include <stdint.h>

#include "plan.h"
#include "rng.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Everything one compute op needs beyond its tensors' addresses: the op and
 * its chunk (shapes, dtypes, attributes), the rank's place in the grid (shard
 * offsets: vocabulary start, positions, experts), and the step's counters. */
typedef struct mgc_op_call {
    const mgc_plan *plan;
    const mgc_plan_chunk *chunk;
    const mgc_plan_op *op;
    void *in[MGC_PLAN_MAX_IO];  /* addresses of op->in[i] for this (microbatch, chunk) */
    void *out[MGC_PLAN_MAX_IO]; /* addresses of op->out[i] */
    mgc_coords co;              /* this rank's coordinates */
    int64_t grid_tp, grid_cp;   /* tensor and context degrees */
    int32_t router_score;       /* moe.router_score (0 softmax, 1 sigmoid, 2 presoftmax) */
    int32_t drop_policy;        /* moe.drop_policy (capacity mode) */
    int64_t vocab_size;         /* model.vocab_size: logits past it are padding */
    int64_t seq_length;         /* the whole sequence (s); rows hold s / cp of it */
    uint64_t seed;              /* training.seed (dropout) */
    int64_t iteration;          /* the step being run (dropout streams) */
    int64_t microbatch;         /* global microbatch index within the step (dropout streams) */
    double dloss;               /* cross-entropy backward: d(training loss)/d(loss sum) is
                                   dloss / count, count = the microbatch's loss[1] */
    uint32_t fresh;             /* bit k: out[k] is a gradient that holds zeros, which no op of
                                   the step has written yet (exec_setup.c, "Gradients' first
                                   writes"): the op may store it instead of adding into it.
                                   A backend may ignore it: adding into zeros gives the same
                                   bits */
} mgc_op_call;

/* What every backend derives the same way from a call (backend.c), so their dropout masks
 * agree bit for bit and every parallel layout draws the one-rank masks: the dropout stream
 * of the op at this (iteration, microbatch) -- the op's name hashed, mixed with both; the
 * numbering of an element-wise site over tensor t by the global index of its elements (the
 * rank's shard of the (s, b, ...) tensor is one run of it under sequence parallelism, two
 * under context parallelism, whose rows are two chunks of the sequence); and the numbering
 * of an attention site with A local heads by the global head and positions (rng.h). */
uint64_t mgc_op_dropout_stream(const mgc_op_call *c);
mgc_dropout_rng mgc_op_drop_rng(const mgc_op_call *c, const mgc_plan_tensor *t);
mgc_dropout_rng mgc_op_attn_drop_rng(const mgc_op_call *c, int64_t A);

/* A fused add_norm call (compiler/fusion.c) as the two calls it replaces: the
 * dropout_add (same name, so the same dropout stream) and the norm of its
 * output.  The ops are written to *add_op and *norm_op, which the calls point
 * to.  The CPU backend runs an add_norm this way. */
void mgc_op_split_add_norm(const mgc_op_call *c, mgc_plan_op *add_op, mgc_op_call *add_call,
                           mgc_plan_op *norm_op, mgc_op_call *norm_call);

/* A fused embedding_norm call (compiler/fusion.c) as the calls it replaces: the embedding
 * into x, with a mask (the third output) the dropout in place over x (same name, so the same
 * dropout stream, and x's numbering), and the norm of x into y.  1 with the dropout (*drop_op,
 * *drop_call written), 0 without, -1 when the op's inputs do not fit mgc_plan_emb_norm_io.
 * The CPU backend runs an embedding_norm this way. */
int mgc_op_split_embedding_norm(const mgc_op_call *c, mgc_plan_op *emb_op, mgc_op_call *emb_call,
                                mgc_plan_op *drop_op, mgc_op_call *drop_call, mgc_plan_op *norm_op,
                                mgc_op_call *norm_call);

typedef struct mgc_backend mgc_backend;

/* One tensor of an AdamW step (the optimizer's multi-tensor call): n fp32 elements. */
typedef struct mgc_adamw_tensor {
    float *p;         /* the fp32 weights (the master copy under mixed precision) */
    const float *g;   /* the gradient */
    float *m, *v;     /* the moments */
    uint16_t *copy16; /* NULL, or the 16-bit weights to write (mgc_adamw_step copy_dtype) */
    int64_t n;
    int decay;        /* decoupled weight decay on this tensor */
} mgc_adamw_tensor;

/* What an AdamW step shares across its tensors. */
typedef struct mgc_adamw_step {
    double lr, beta1, beta2, eps, weight_decay;
    double grad_scale; /* every gradient is multiplied by it first (clipping, loss scale) */
    int64_t step;      /* 1-based */
    int copy_dtype;    /* MGC_DT_BF16 or MGC_DT_F16: the type of the copy16 arrays */
} mgc_adamw_step;

typedef struct mgc_backend_iface {
    const char *name; /* "cpu", "cuda" */
    /* One allocation of `bytes` (256-aligned), zeroed. */
    int (*arena_alloc)(mgc_backend *be, uint64_t bytes, void **out);
    void (*arena_free)(mgc_backend *be, void *arena);
    /* Called once the arena exists: the plan and the rank's stage program, so a backend can
     * load the plan's kernels and find its GEMM workspace (the stage's WORKSPACE buffer). */
    int (*bind)(mgc_backend *be, const mgc_plan *plan, const mgc_stage_program *stage,
                void *arena);
    /* Run one compute op of a chunk program. */
    int (*run_op)(mgc_backend *be, const mgc_op_call *call);
    /* Byte copies: arena to arena, host to arena, arena to host; and zeroing. */
    int (*copy)(mgc_backend *be, void *dst, const void *src, size_t bytes);
    int (*upload)(mgc_backend *be, void *dst, const void *host, size_t bytes);
    int (*download)(mgc_backend *be, void *host, const void *src, size_t bytes);
    int (*zero)(mgc_backend *be, void *dst, size_t bytes);
    /* Optimizer kernels on fp32 arena arrays.  sumsq and adamw take every tensor of the step
     * at once (a GPU backend covers many tensors a launch; the order of the sum is fixed by
     * the list, never by the device).  sumsq: *out = the sum over the count tensors g[i] of
     * n[i] elements of the sum of their squares, in fp64. */
    int (*sumsq)(mgc_backend *be, const float *const *g, const int64_t *n, int64_t count,
                 double *out);
    /* One AdamW step of each of the count tensors (cpu_ops.h mgc_cpu_adamw's math, bit for
     * bit); the 16-bit copy-outs are rounded to s->copy_dtype. */
    int (*adamw)(mgc_backend *be, const mgc_adamw_tensor *t, int64_t count,
                 const mgc_adamw_step *s);
    /* Wait for the backend's queued work (the step's end; timing). */
    int (*sync)(mgc_backend *be);
    /* Graphs (optional; the CUDA backend's CUDA graphs): the executor brackets a program
     * whose ops depend on nothing that changes between steps (docs/runtime.md) with
     * graph_begin and graph_end, `key` naming the program and its arguments.
     * graph_begin returns 1 when it replayed the program's recorded work (the executor then
     * issues no op), 0 when the executor must issue the ops (the backend may be recording
     * them), -1 on error.  graph_end(failed: an op of the program failed) returns 0 when
     * the work is done or queued, 2 when a recording failed and nothing ran (the executor
     * issues the ops again, not recorded), -1 on error. */
    int (*graph_begin)(mgc_backend *be, uint64_t key);
    int (*graph_end)(mgc_backend *be, uint64_t key, int failed);
    /* Optional, with the graphs (NULL: programs with dropout are never recorded): the step
     * whose programs come next, set before each graph_begin.  A backend with it takes
     * everything of a dropout stream but the step's part (rng.h mgc_rng_step_mix) as a
     * kernel argument and the step from memory this sets in order with its work, so a
     * program recorded once draws every step's masks.  0, or -1 with be->err. */
    int (*set_step)(mgc_backend *be, int64_t step);
    /* Set the compute threads (CPU); 0 = the backend's default. */
    int (*set_threads)(mgc_backend *be, int threads);
    void (*close)(mgc_backend *be);
    /* 1: the arena is device memory the host cannot address (CUDA).  The executor then
     * moves every collective and pipeline transfer through host memory, since the local
     * and mpi communicators read and write host memory (docs/runtime.md, "Communication
     * on device memory"). */
    int device_memory;
    /* Optional (NULL: malloc and free): host memory for that staging, page-locked where
     * the backend can (fast transfers). */
    int (*host_alloc)(mgc_backend *be, size_t bytes, void **out);
    void (*host_free)(mgc_backend *be, void *p);
    /* Optional, all three or none (device memory): transfers beside the compute, for the
     * executor's gradient reducer thread (exec.h mgc_exec_set_grad_overlap).
     * xfer_mark (the executor's thread) records how far the compute issued so far has got,
     * in a mark the backend owns (*mark NULL: make one; else reuse it).  xfer_download
     * copies arena to host once the compute has passed `mark`, xfer_upload host to arena;
     * both run on the backend's transfer queue, are finished when they return, may be
     * called from the reducer thread while the executor's thread issues compute, and
     * report failures in err (not be->err). */
    int (*xfer_mark)(mgc_backend *be, void **mark);
    int (*xfer_download)(mgc_backend *be, void *mark, void *host, const void *src, size_t bytes,
                         char *err, size_t errsz);
    int (*xfer_upload)(mgc_backend *be, void *dst, const void *host, size_t bytes, char *err,
                       size_t errsz);
    /* Optional, all three or none (device memory): pipeline sends beside the compute, on the
     * backend's pipeline-transfer queue (exec.h mgc_exec_set_send_overlap).
     * p2p_download (the executor's thread) queues a copy of arena `src` to `host` that starts
     * once the compute issued so far is done, and returns at once; *done (the backend's
     * handle: *done NULL makes one, else it is reused) completes with the copy.  p2p_wait
     * (any thread) returns once `done` has completed.  p2p_fence (the executor's thread) holds
     * the compute issued after it until `done` has completed, without waiting on the host.
     * err: the failure (not be->err: p2p_wait runs on another thread). */
    int (*p2p_download)(mgc_backend *be, void *host, const void *src, size_t bytes, void **done,
                        char *err, size_t errsz);
    int (*p2p_wait)(mgc_backend *be, void *done, char *err, size_t errsz);
    int (*p2p_fence)(mgc_backend *be, void *done, char *err, size_t errsz);
    /* Optional (device memory): the step's zeroing of the gradients beside the forward, which
     * writes none.  zero_beside queues the zeroing of dst on a queue of its own, after the
     * compute issued so far, and returns 0 at once; or zeroes in line, as `zero`, and returns
     * 1 (the backend's choice: the CUDA backend's MGC_ZERO_BESIDE).  zero_fence holds the
     * compute issued after it until the zeroing queued last is done, without waiting on the
     * host.  -1 with be->err on failure. */
    int (*zero_beside)(mgc_backend *be, void *dst, size_t bytes);
    int (*zero_fence)(mgc_backend *be);
    /* Optional, both or none: the step's zeroing of only the gradients that their first
     * writes do not store (exec_setup.c, "Gradients' first writes").  stores_fresh(op, k): 1 when
     * the backend, given mgc_op_call.fresh bit k, writes every element of op's out[k] without
     * reading it (the CUDA backend: the dW of linear_wgrad and grouped_linear_wgrad, by GEMMs
     * at beta 0), whatever the memory held.  zero_list zeroes the count fp32 ranges p[i]
     * (n[i] elements each; sorted, disjoint) of the gradients [base, base + bytes), in line
     * with the compute; the rest of it is left as it is (the CUDA emulator poisons it first).
     * -1 with be->err. */
    int (*stores_fresh)(mgc_backend *be, const mgc_plan_op *op, int k);
    int (*zero_list)(mgc_backend *be, void *base, size_t bytes, float *const *p,
                     const int64_t *n, int64_t count);
    /* Optional, for a device communicator (exec.h mgc_exec_set_device_comm): the fold of a
     * reduction on arena memory, queued in order with the compute -- dst[i] = op (0 sum,
     * 1 max) over j = 0 .. parts-1, in order, of src[j * stride + i], in fp32, rounded once
     * to dt (f32, bf16, f16); comm.h mgc_comm_fold_host's bits. */
    int (*fold)(mgc_backend *be, void *dst, const void *src, int parts, size_t count, size_t stride,
                int dt, int op);
    /* Optional: the compute queue a device communicator's operations join (CUDA: the compute
     * stream, a cudaStream_t); NULL: the backend runs everything at once (CPU, emulator). */
    void *(*queue)(mgc_backend *be);
    /* Optional, both or none: --profile's op times taken on the device's own clock (CUDA
     * events), so that profiling waits for the device once an instruction, not once an op
     * (docs/runtime.md, "Profiling").  time_mark records timer `i` (0, 1, ...; the backend
     * keeps as many as it is asked for) on the compute queue, where it completes when the
     * work queued before it has; time_between, once `sync` has returned, gives the seconds
     * from timer a to timer b.  NULL: the executor syncs and reads the host clock around
     * each op instead. */
    int (*time_mark)(mgc_backend *be, int64_t i);
    int (*time_between)(mgc_backend *be, int64_t a, int64_t b, double *seconds);
} mgc_backend_iface;

#define MGC_BACKEND_ERR_MAX 1024

struct mgc_backend {
    const mgc_backend_iface *iface;
    void *context;
    char err[MGC_BACKEND_ERR_MAX]; /* the last failure: what, where, a hint */
};

/* The CPU reference backend (cpu_backend.c): fp32 kernels of cpu_ops.h,
 * OpenBLAS GEMMs.  Plans in bf16/fp16 are refused by mgc_exec_open. */
int mgc_backend_cpu_open(mgc_backend **out, char *err, size_t err_size);
/* The CUDA backend (cuda_backend.c, built with the CUDA toolkit): device
 * `device` (-1: local rank modulo the visible devices, chosen by the caller).
 * Fails with a clear message where there is no GPU or no CUDA build. */
int mgc_backend_cuda_open(mgc_backend **out, int device, char *err, size_t err_size);
/* The CUDA emulator backend (emu_backend.c, every build): the CUDA backend's launchers and
 * the plan's generated kernels run on the CPU, compiled with the host C++ compiler
 * (docs/cuda-emulator.md).  For tests and kernel debugging; slow.  Fails with a clear message
 * where no C++ compiler is found. */
int mgc_backend_emu_open(mgc_backend **out, char *err, size_t err_size);
/* 1 when this build has the CUDA backend and a CUDA device is visible. */
int mgc_backend_cuda_available(void);
/* The CUDA devices visible to this process (0: none, or no CUDA build). */
int mgc_backend_cuda_devices(void);
/* Closes any backend; NULL is a no-op. */
void mgc_backend_close(mgc_backend *be);

#ifdef __cplusplus
}
#endif
#endif /* MGC_BACKEND_H */
