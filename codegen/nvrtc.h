/* nvrtc.h - compiling kernel sources to cubins with NVRTC (no GPU needed).
 *
 *     mgc_nvrtc_result r;
 *     if (mgc_nvrtc_compile(src, name, 90, &r, err, sizeof err) == 0) {
 *         ... r.cubin (r.cubin_bytes), r.registers, r.spill_bytes ...
 *         free(r.cubin);
 *     }
 *
 * Options: --gpu-architecture=sm_<arch> --std=c++17, and ptxas -v, whose
 * report gives the registers, spill and stack bytes checked by the tests. */
#ifndef MGC_NVRTC_H
#define MGC_NVRTC_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct mgc_nvrtc_result {
    char *cubin;        /* malloc'd */
    size_t cubin_bytes;
    long registers;     /* most registers any kernel of the program uses */
    long spill_bytes;   /* largest spill store or load count in ptxas's report */
    long stack_bytes;   /* largest stack frame */
} mgc_nvrtc_result;

/* 1 when NVRTC can be loaded. */
int mgc_nvrtc_available(void);
/* "nvrtc-13.0": part of the JIT cache key.  0, or -1 without NVRTC. */
int mgc_nvrtc_version_key(char *buf, size_t size);
/* Compile `src` (program name `name`, the kernel symbol) for sm_<arch>.  0, or
 * -1 with NVRTC's log in err. */
int mgc_nvrtc_compile(const char *src, const char *name, int arch, mgc_nvrtc_result *out,
                      char *err, size_t errsz);

/* The same through the on-disk cache: $MGC_KERNEL_CACHE, else $XDG_CACHE_HOME/mgc/kernels,
 * else ~/.cache/mgc/kernels.  An entry is keyed by a hash of the source, the headers it
 * includes (mgc_common.cuh), the NVRTC version and the architecture; it holds the cubin and ptxas's numbers behind a CRC-32C, is written
 * atomically (temporary file + rename) and is recompiled, never trusted, when damaged.
 * *cached says whether it came from the cache.  MGC_KERNEL_CACHE=off disables it. */
/* That cache's directory, written to buf (or MGC_KERNEL_CACHE itself); NULL when
 * MGC_KERNEL_CACHE=off. */
const char *mgc_kernel_cache_dir(char *buf, size_t n);
/* mkdir -p path (mode 0755); failures show up when the caller writes there. */
void mgc_mkdirs(const char *path);
int mgc_nvrtc_compile_cached(const char *src, const char *name, int arch, mgc_nvrtc_result *out,
                             int *cached, char *err, size_t errsz);

#ifdef __cplusplus
}
#endif
#endif
