/* kernels.h - compile a plan's CUDA kernels ahead of time (mgc compile).
 *
 * Every kernel spec of every op of the plan (codegen/kspec.h) is compiled with
 * NVRTC for each requested architecture, through the on-disk cache, on
 * `threads` threads; the cubins are added to the plan (KERN/KBIN sections). */
#ifndef MGC_COMPILER_KERNELS_H
#define MGC_COMPILER_KERNELS_H

#include <stddef.h>

#include "plan.h"

typedef struct mgc_kernel_stats {
    int specs;        /* distinct kernel specs */
    int archs;
    int compiled;     /* NVRTC runs */
    int cached;       /* taken from the cache */
    long max_registers, max_spill_bytes, max_stack_bytes;
    int spilling;          /* cubins (a kernel for one architecture) that spill */
    char worst_spill[192]; /* the kernel with the most spill bytes */
    double seconds;
    unsigned long long cubin_bytes;
} mgc_kernel_stats;

/* 0, or -1 with the first failure in err (the plan is unchanged then). */
int mgc_compile_kernels(mgc_plan *p, const int *archs, int n_archs, int threads,
                        mgc_kernel_stats *st, char *err, size_t errsz);
/* The plan's hardware.cuda_archs (up to max). */
int mgc_plan_cuda_archs(const mgc_plan *p, int *archs, int max);

#endif
