/* codegen.h - CUDA source generation and NVRTC compilation.
 *
 * Today: a probe of the NVRTC library the build linked, if any.  Kernel
 * generation from kernels/ templates arrives with the CUDA backend. */
#ifndef MGC_CODEGEN_H
#define MGC_CODEGEN_H

#ifdef __cplusplus
extern "C" {
#endif

/* Writes NVRTC's version and returns 1 when the build has NVRTC; returns 0
 * (and leaves the outputs 0) when mgc was built without the CUDA toolkit. */
int mgc_codegen_nvrtc_version(int *major, int *minor);

/* Number of GPU architectures NVRTC can target, and the list (e.g. 80, 90). */
int mgc_codegen_nvrtc_archs(int *archs, int max);

#ifdef __cplusplus
}
#endif
#endif
