/* nvrtc_probe.c - see codegen.h.
 *
 * NVRTC is loaded with dlopen rather than linked, so one `mgc` binary runs on
 * machines with and without the CUDA toolkit: the front end never needs it,
 * and kernel compilation (issue 5) reports a clear error when it is absent.
 * The path found at configure time is tried first, then the loader's search. */
#include "codegen.h"

#include <dlfcn.h>
#include <stddef.h>

#ifndef MGC_NVRTC_PATH
#define MGC_NVRTC_PATH "libnvrtc.so"
#endif

typedef int (*nvrtc_version_fn)(int *, int *);
typedef int (*nvrtc_num_archs_fn)(int *);
typedef int (*nvrtc_archs_fn)(int *);

/* Open NVRTC; NULL when it is not installed.  The handle is left open for
 * the life of the process (the library is reference-counted by the loader). */
static void *open_nvrtc(void) {
    static const char *const names[] = {MGC_NVRTC_PATH, "libnvrtc.so", "libnvrtc.so.13", "libnvrtc.so.12", NULL};
    for (int i = 0; names[i]; i++) {
        void *h = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
        if (h) return h;
    }
    return NULL;
}

int mgc_codegen_nvrtc_version(int *major, int *minor) {
    *major = *minor = 0;
    void *h = open_nvrtc();
    if (!h) return 0;
    nvrtc_version_fn fn = (nvrtc_version_fn)(size_t)dlsym(h, "nvrtcVersion");
    return fn && fn(major, minor) == 0; /* NVRTC_SUCCESS */
}

int mgc_codegen_nvrtc_archs(int *archs, int max) {
    void *h = open_nvrtc();
    if (!h) return 0;
    nvrtc_num_archs_fn num = (nvrtc_num_archs_fn)(size_t)dlsym(h, "nvrtcGetNumSupportedArchs");
    nvrtc_archs_fn get = (nvrtc_archs_fn)(size_t)dlsym(h, "nvrtcGetSupportedArchs");
    int n = 0, buf[128];
    if (!num || !get || num(&n) != 0 || n <= 0) return 0;
    if (n > 128) return 0;
    if (get(buf) != 0) return 0;
    int k = n < max ? n : max;
    for (int i = 0; i < k; i++) archs[i] = buf[i];
    return k;
}
