/* nvrtc.c - compile one kernel spec's source to a cubin with NVRTC (see nvrtc.h).
 *
 * NVRTC is opened with dlopen (nvrtc_probe.c's search), so mgc runs without
 * the CUDA toolkit and says so when asked to compile kernels. */
#include "nvrtc.h"

#include <dlfcn.h>
#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <sys/stat.h>
#include <unistd.h>

#include "crc32c.h"
#include "kspec.h"

#ifndef MGC_NVRTC_PATH
#define MGC_NVRTC_PATH "libnvrtc.so"
#endif

typedef struct nvrtc_api {
    int (*create)(void **prog, const char *src, const char *name, int n_headers,
                  const char *const *headers, const char *const *include_names);
    int (*compile)(void *prog, int n_opts, const char *const *opts);
    int (*log_size)(void *prog, size_t *n);
    int (*log)(void *prog, char *buf);
    int (*cubin_size)(void *prog, size_t *n);
    int (*cubin)(void *prog, char *buf);
    int (*destroy)(void **prog);
    const char *(*error)(int code);
    int (*version)(int *major, int *minor);
} nvrtc_api;

static int load(nvrtc_api *a) {
    static const char *const names[] = {MGC_NVRTC_PATH, "libnvrtc.so", "libnvrtc.so.13",
                                        "libnvrtc.so.12", NULL};
    void *h = NULL;
    for (int i = 0; names[i] && !h; i++)
        h = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
    if (!h) return -1;
#define SYM(field, name)                                                                           \
    *(void **)(&a->field) = dlsym(h, name);                                                        \
    if (!a->field) return -1;
    SYM(create, "nvrtcCreateProgram");
    SYM(compile, "nvrtcCompileProgram");
    SYM(log_size, "nvrtcGetProgramLogSize");
    SYM(log, "nvrtcGetProgramLog");
    SYM(cubin_size, "nvrtcGetCUBINSize");
    SYM(cubin, "nvrtcGetCUBIN");
    SYM(destroy, "nvrtcDestroyProgram");
    SYM(error, "nvrtcGetErrorString");
    SYM(version, "nvrtcVersion");
#undef SYM
    return 0;
}

int mgc_nvrtc_available(void) {
    nvrtc_api a;
    return load(&a) == 0;
}

int mgc_nvrtc_version_key(char *buf, size_t size) {
    nvrtc_api a;
    int major = 0, minor = 0;
    if (load(&a) || a.version(&major, &minor)) return -1;
    snprintf(buf, size, "nvrtc-%d.%d", major, minor);
    return 0;
}

/* Largest "N bytes spill stores/loads" and "N bytes stack frame" in ptxas's -v report. */
static void parse_report(const char *log, mgc_nvrtc_result *r) {
    /* %n is set only when the whole pattern matched (a bare number matches "%ld" alone) */
    for (const char *p = log; p && *p; p++) {
        long v;
        int n = -1;
        if (*p < '0' || *p > '9' || (p > log && p[-1] >= '0' && p[-1] <= '9')) {
            if (!strncmp(p, "Used ", 5) && sscanf(p, "Used %ld registers%n", &v, &n) == 1 && n > 0 &&
                v > r->registers)
                r->registers = v;
            continue;
        }
        if (sscanf(p, "%ld bytes spill stores%n", &v, &n) == 1 && n > 0 && v > r->spill_bytes)
            r->spill_bytes = v;
        n = -1;
        if (sscanf(p, "%ld bytes spill loads%n", &v, &n) == 1 && n > 0 && v > r->spill_bytes)
            r->spill_bytes = v;
        n = -1;
        if (sscanf(p, "%ld bytes stack frame%n", &v, &n) == 1 && n > 0 && v > r->stack_bytes)
            r->stack_bytes = v;
    }
}

int mgc_nvrtc_compile(const char *src, const char *name, int arch, mgc_nvrtc_result *out,
                      char *err, size_t errsz) {
    memset(out, 0, sizeof *out);
    nvrtc_api a;
    if (load(&a)) {
        snprintf(err, errsz, "NVRTC is not installed (libnvrtc.so not found): install the CUDA "
                             "toolkit, or compile without kernels (mgc compile --no-kernels)");
        return -1;
    }
    const char *common = mgc_kernel_template("mgc_common.cuh");
    const char *headers[1] = {common}, *hnames[1] = {"mgc_common.cuh"};
    void *prog = NULL;
    int rc = a.create(&prog, src, name, 1, headers, hnames);
    if (rc) {
        snprintf(err, errsz, "%s: nvrtcCreateProgram: %s", name, a.error(rc));
        return -1;
    }
    char archopt[64];
    snprintf(archopt, sizeof archopt, "--gpu-architecture=sm_%d", arch);
    const char *opts[] = {archopt, "--std=c++17", "--ptxas-options=-v", "-default-device"};
    rc = a.compile(prog, (int)(sizeof opts / sizeof *opts), opts);
    size_t ln = 0;
    a.log_size(prog, &ln);
    char *log = malloc(ln + 1);
    if (log) {
        log[0] = 0;
        if (ln) a.log(prog, log);
        log[ln] = 0;
    }
    if (rc) {
        snprintf(err, errsz, "%s for sm_%d: NVRTC: %s%s%.1500s", name, arch, a.error(rc),
                 log && *log ? ":\n" : "", log ? log : "");
        free(log);
        a.destroy(&prog);
        return -1;
    }
    parse_report(log, out);
    free(log);
    size_t n = 0;
    if (a.cubin_size(prog, &n) || n == 0 || !(out->cubin = malloc(n))) {
        snprintf(err, errsz, "%s for sm_%d: no cubin from NVRTC", name, arch);
        a.destroy(&prog);
        return -1;
    }
    a.cubin(prog, out->cubin);
    out->cubin_bytes = n;
    a.destroy(&prog);
    return 0;
}

/* ---- the on-disk cache -------------------------------------------------------------------- */

static uint64_t fnv64(const void *p, size_t n, uint64_t h) {
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++)
        h = (h ^ b[i]) * 1099511628211ull;
    return h;
}

const char *mgc_kernel_cache_dir(char *buf, size_t n) {
    const char *d = getenv("MGC_KERNEL_CACHE");
    if (d && !strcmp(d, "off")) return NULL;
    if (d && *d) return d;
    const char *x = getenv("XDG_CACHE_HOME"), *home = getenv("HOME");
    if (x && *x) snprintf(buf, n, "%s/mgc/kernels", x);
    else if (home && *home) snprintf(buf, n, "%s/.cache/mgc/kernels", home);
    else snprintf(buf, n, "/tmp/mgc-kernels-%d", (int)getuid());
    return buf;
}

void mgc_mkdirs(const char *path) {
    char tmp[1300];
    snprintf(tmp, sizeof tmp, "%s", path);
    for (char *p = tmp + 1; *p; p++)
        if (*p == '/') {
            *p = 0;
            mkdir(tmp, 0755);
            *p = '/';
        }
    mkdir(tmp, 0755);
}

/* Entry: "MGCK" | u32 crc32c(rest) | u64 cubin bytes | i64 registers, spills, stack | cubin. */
#define CACHE_HEAD 40

static int cache_read(const char *path, mgc_nvrtc_result *r) {
    FILE *f = fopen(path, "rb");
    if (!f) return -1;
    unsigned char h[CACHE_HEAD];
    int ok = 0;
    if (fread(h, 1, CACHE_HEAD, f) == CACHE_HEAD && !memcmp(h, "MGCK", 4)) {
        uint32_t crc;
        uint64_t n;
        int64_t v[3];
        memcpy(&crc, h + 4, 4);
        memcpy(&n, h + 8, 8);
        memcpy(v, h + 16, 24);
        char *buf = n > 0 && n < ((uint64_t)1 << 30) ? malloc((size_t)n) : NULL;
        if (buf && fread(buf, 1, (size_t)n, f) == n &&
            mgc_crc32c(mgc_crc32c(0, h + 8, CACHE_HEAD - 8), buf, (size_t)n) == crc) {
            r->cubin = buf;
            r->cubin_bytes = (size_t)n;
            r->registers = (long)v[0], r->spill_bytes = (long)v[1], r->stack_bytes = (long)v[2];
            ok = 1;
        } else {
            free(buf); /* damaged or short: recompiled, never trusted */
        }
    }
    fclose(f);
    return ok ? 0 : -1;
}

static void cache_write(const char *path, const mgc_nvrtc_result *r) {
    char tmp[1600];
    snprintf(tmp, sizeof tmp, "%.1400s.tmp.%d", path, (int)getpid());
    FILE *f = fopen(tmp, "wb");
    if (!f) return;
    unsigned char h[CACHE_HEAD];
    uint64_t n = r->cubin_bytes;
    int64_t v[3] = {r->registers, r->spill_bytes, r->stack_bytes};
    memcpy(h, "MGCK", 4);
    memcpy(h + 8, &n, 8);
    memcpy(h + 16, v, 24);
    uint32_t crc = mgc_crc32c(mgc_crc32c(0, h + 8, CACHE_HEAD - 8), r->cubin, r->cubin_bytes);
    memcpy(h + 4, &crc, 4);
    int ok = fwrite(h, 1, CACHE_HEAD, f) == CACHE_HEAD &&
             fwrite(r->cubin, 1, r->cubin_bytes, f) == r->cubin_bytes;
    ok &= fclose(f) == 0;
    if (ok) rename(tmp, path);
    else remove(tmp);
}

int mgc_nvrtc_compile_cached(const char *src, const char *name, int arch, mgc_nvrtc_result *out,
                             int *cached, char *err, size_t errsz) {
    *cached = 0;
    const char *off = getenv("MGC_KERNEL_CACHE");
    if (off && !strcmp(off, "off")) return mgc_nvrtc_compile(src, name, arch, out, err, errsz);
    char ver[64] = "nvrtc-none", dir[1024], path[1400];
    if (mgc_nvrtc_version_key(ver, sizeof ver))
        return mgc_nvrtc_compile(src, name, arch, out, err, errsz); /* reports the absence */
    uint64_t h = fnv64(src, strlen(src), 1469598103934665603ull);
    const char *common = mgc_kernel_template("mgc_common.cuh"); /* the included header too */
    if (common) h = fnv64(common, strlen(common), h);
    h = fnv64(ver, strlen(ver), h);
    h = fnv64(&arch, sizeof arch, h);
    h = fnv64("cache-v2", 8, h); /* bumped when an entry's meaning changes */
    const char *d = mgc_kernel_cache_dir(dir, sizeof dir);
    snprintf(path, sizeof path, "%.900s/%.200s-sm%d-%016" PRIx64 ".cubin", d, name, arch, h);
    memset(out, 0, sizeof *out);
    if (cache_read(path, out) == 0) {
        *cached = 1;
        return 0;
    }
    if (mgc_nvrtc_compile(src, name, arch, out, err, errsz)) return -1;
    mgc_mkdirs(d);
    cache_write(path, out);
    return 0;
}
