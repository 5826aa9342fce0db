/* emu_kernel.h - the CUDA emulator: runs the generated kernels of codegen/kspec.h
 * on the CPU, every GPU thread a fiber, so that CI without a GPU executes the
 * same kernel source the GPU runs (docs/cuda-emulator.md).
 *
 *     mgc_emu *e = NULL;
 *     mgc_emu_open(&e, err, sizeof err);
 *     void *args[] = {&y, &x, &n};                 // as for cudaLaunchKernel
 *     mgc_emu_launch(e, &spec, gx, gy, gz, 256, 0, args, err, sizeof err);
 *     mgc_emu_close(e);
 *
 * A kernel spec's source (mgc_kspec_source) is compiled once with the host C++
 * compiler (MGC_EMU_CXX, else `c++`) against runtime/emu/cuda_emu.h into a
 * shared object, kept in the kernel cache (MGC_KERNEL_CACHE, else
 * $XDG_CACHE_HOME/mgc/kernels) under emu/, keyed by the source, the emulator's
 * headers, the compiler and its flags; written atomically, and an object that
 * does not load is rebuilt.  Blocks run one after another on the calling
 * thread, in an order drawn from a seeded generator (mgc_emu_set_seed), and
 * within a block the threads too, so a kernel that lacks a barrier, or whose
 * blocks depend on one another, computes wrong values (or other bits under
 * another seed) instead of right ones by luck.  A barrier some threads of a
 * block never reach, or a warp collective with lanes at different places, is
 * reported as an error naming the kernel, the block and the source lines.
 *
 * One mgc_emu is used by one thread at a time; several may run at once on
 * different threads (ranks as threads). */
#ifndef MGC_EMU_KERNEL_H
#define MGC_EMU_KERNEL_H

#include <stddef.h>
#include <stdint.h>

#include "backend.h"
#include "kspec.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct mgc_emu mgc_emu;

/* 0, or -1 with a message (no host C++ compiler found, out of memory). */
int mgc_emu_open(mgc_emu **out, char *err, size_t errsz);
void mgc_emu_close(mgc_emu *e);

/* Compiles (or finds in the cache) and loads kernel k without running it: 0, or -1 with the
 * compiler's diagnostics in err. */
int mgc_emu_load(mgc_emu *e, const mgc_kspec *k, char *err, size_t errsz);

/* The same for n kernels at once, compiling those the cache lacks with up to `jobs` compilers
 * at a time (0: one per CPU). */
int mgc_emu_load_many(mgc_emu *e, const mgc_kspec *k, int n, int jobs, char *err, size_t errsz);

/* Runs kernel k over grid (gx, gy, gz) of 1-D blocks of `block` threads with smem_bytes of
 * dynamic shared memory (filled with 0xff, a NaN pattern, before every block: a kernel that
 * reads what it did not write sees garbage), args as for cudaLaunchKernel.  0, or -1 with the
 * message. */
int mgc_emu_launch(mgc_emu *e, const mgc_kspec *k, unsigned gx, unsigned gy, unsigned gz,
                   unsigned block, size_t smem_bytes, void **args, char *err, size_t errsz);

/* The byte sizes of kernel k's parameters, in order (k loaded first where it is not): their
 * count, or -1 with the message.  A launch recorded into an emulated CUDA graph
 * (emu_backend.c) copies that many bytes of each argument, as a stream capture does. */
#define MGC_EMU_MAX_PARAMS 64
int mgc_emu_param_sizes(mgc_emu *e, const mgc_kspec *k, size_t *sizes, int max, char *err,
                        size_t errsz);

/* The seed of the block and thread orders (default: MGC_EMU_SEED when open reads it, else 1);
 * launches are numbered from it. */
void mgc_emu_set_seed(mgc_emu *e, uint64_t seed);

/* Counters since open: kernels compiled, found in the cache, launches, GPU threads run, the
 * dynamic shared memory they asked for; and
 * the instructions the emulator resolves, counted as the GPU issues them: warp-wide mma.sync
 * m16n8k16, ldmatrix.x4 and shuffles, and block barriers (one per block that passes one).
 * They are facts about the kernels' code (what a change does to shared-memory reads per
 * mma, say), not a time.  MGC_EMU_TRACE prints them per launch. */
typedef struct mgc_emu_stats {
    int compiled, cached;
    int64_t launches, threads;
    int64_t mma, ldmatrix, shfl, barriers;
    int64_t dyn_bytes; /* the launches' dynamic shared memory, summed */
} mgc_emu_stats;
void mgc_emu_get_stats(const mgc_emu *e, mgc_emu_stats *st);

/* The emulator of an "emu" backend (backend.h mgc_backend_emu_open); NULL for another. */
mgc_emu *mgc_backend_emu_emulator(mgc_backend *be);

#ifdef __cplusplus
}
#endif
#endif /* MGC_EMU_KERNEL_H */
