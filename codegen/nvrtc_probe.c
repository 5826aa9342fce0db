/* nvrtc_probe.c - see codegen.h. */
#include "codegen.h"

#ifdef MGC_HAVE_NVRTC
#include <nvrtc.h>

int mgc_codegen_nvrtc_version(int *major, int *minor) {
    *major = *minor = 0;
    return nvrtcVersion(major, minor) == NVRTC_SUCCESS;
}

int mgc_codegen_nvrtc_archs(int *archs, int max) {
    int n = 0;
    if (nvrtcGetNumSupportedArchs(&n) != NVRTC_SUCCESS || n <= 0) return 0;
    int buf[128];
    if (n > 128) n = 128;
    if (nvrtcGetSupportedArchs(buf) != NVRTC_SUCCESS) return 0;
    int k = n < max ? n : max;
    for (int i = 0; i < k; i++) archs[i] = buf[i];
    return k;
}
#else
int mgc_codegen_nvrtc_version(int *major, int *minor) {
    *major = *minor = 0;
    return 0;
}

int mgc_codegen_nvrtc_archs(int *archs, int max) {
    (void)archs;
    (void)max;
    return 0;
}
#endif
