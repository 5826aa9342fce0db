/* test_emu.c - the CUDA emulator's own checks (runtime/emu_kernel.h, docs/cuda-emulator.md):
 * test_cuda relies on the emulator to fail a kernel that a GPU would run wrongly or not at all,
 * so each of those checks is shown to fire here, on small kernels written to break one rule
 * each, next to a correct one that must pass:
 *   - barriers that the threads of a block reach at different places; warp collectives with
 *     lanes at different places, or naming a lane that returned; mgc_pdl_begin() not first;
 *   - grids and dynamic shared memory a GPU refuses;
 *   - a shared-memory read with no barrier after the write, and blocks that read what another
 *     block of the launch writes: wrong, or other bits under another seed (the orders drawn);
 *   - a cp.async tile read before its wait: the old bytes;
 *   - mgc_dyn_bytes(), the launch's dynamic shared memory, and mgc_trap() when it is short;
 *   - an index past a fixed-size array, a misaligned vector access, a shift by the width and a
 *     float converted to an int it does not fit (GCC's UBSan in the emulated kernels: the last
 *     three are where a GPU and x86 part ways): the process aborts with the template's line,
 *     checked in a child.
 * Label cpu; skipped (77) under sanitizers, as test_cuda --emu is (the fibers switch stacks). */
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "emu_kernel.h"
#include "kspec.h"
#include "testlib.h"

/* One template with an entry per case (kspec.h `text`: tests' own kernels). */
static const char kernels[] =
    "#include \"mgc_common.cuh\"\n"
    "#if defined(MGC_ENTRY_scale)\n" /* right: y = 2 x + the block */
    "extern \"C\" __global__ void MGC_ENTRY_NAME(float *y, const float *x, int n) {\n"
    "    mgc_pdl_begin();\n"
    "    int i = blockIdx.x * blockDim.x + threadIdx.x;\n"
    "    if (i < n) y[i] = 2.0f * x[i] + (float)blockIdx.x;\n"
    "}\n"
    "#endif\n"
    "#if defined(MGC_ENTRY_rotate)\n" /* y[t] = x[t + 1] through shared memory; SYNC: a barrier */
    "extern \"C\" __global__ void MGC_ENTRY_NAME(float *y, const float *x) {\n"
    "    mgc_pdl_begin();\n"
    "    __shared__ float s[128];\n"
    "    const int t = threadIdx.x, b = blockIdx.x * 128;\n"
    "    s[t] = x[b + t];\n"
    "#if MGC_SYNC\n"
    "    __syncthreads();\n"
    "#endif\n"
    "    y[b + t] = s[(t + 1) % 128];\n"
    "}\n"
    "#endif\n"
    "#if defined(MGC_ENTRY_chain)\n" /* block b reads what block b - 1 writes: a race */
    "extern \"C\" __global__ void MGC_ENTRY_NAME(float *y, float *z) {\n"
    "    mgc_pdl_begin();\n"
    "    if (threadIdx.x == 0) {\n"
    "        y[blockIdx.x] = (float)blockIdx.x + 1.0f;\n"
    "        z[blockIdx.x] = blockIdx.x ? y[blockIdx.x - 1] : 0.0f;\n"
    "    }\n"
    "}\n"
    "#endif\n"
    "#if defined(MGC_ENTRY_two_barriers)\n" /* half the block at one barrier, half at another */
    "extern \"C\" __global__ void MGC_ENTRY_NAME(float *y) {\n"
    "    mgc_pdl_begin();\n"
    "    if (threadIdx.x < 16) __syncthreads();\n"
    "    else __syncthreads();\n"
    "    y[threadIdx.x] = 1.0f;\n"
    "}\n"
    "#endif\n"
    "#if defined(MGC_ENTRY_lanes_apart)\n" /* even lanes shuffle, odd lanes sync the warp */
    "extern \"C\" __global__ void MGC_ENTRY_NAME(float *y) {\n"
    "    mgc_pdl_begin();\n"
    "    float v = (float)threadIdx.x;\n"
    "    if (threadIdx.x % 2 == 0) v = __shfl_xor_sync(0xffffffffu, v, 2);\n"
    "    else __syncwarp();\n"
    "    y[threadIdx.x] = v;\n"
    "}\n"
    "#endif\n"
    "#if defined(MGC_ENTRY_lane_gone)\n" /* lanes 16-31 return; 0-15 shuffle over all 32 */
    "extern \"C\" __global__ void MGC_ENTRY_NAME(float *y) {\n"
    "    mgc_pdl_begin();\n"
    "    if (threadIdx.x >= 16) return;\n"
    "    y[threadIdx.x] = __shfl_xor_sync(0xffffffffu, (float)threadIdx.x, 1);\n"
    "}\n"
    "#endif\n"
    "#if defined(MGC_ENTRY_no_pdl)\n" /* no mgc_pdl_begin() */
    "extern \"C\" __global__ void MGC_ENTRY_NAME(float *y) {\n"
    "    y[threadIdx.x] = 1.0f;\n"
    "}\n"
    "#endif\n"
    "#if defined(MGC_ENTRY_dyn_size)\n" /* every thread writes its launch's dynamic shared bytes;
                                        * NEED: traps when given fewer (attention.cuh ATT_DYN_END) */
    "extern \"C\" __global__ void MGC_ENTRY_NAME(float *y) {\n"
    "    mgc_pdl_begin();\n"
    "    if (mgc_dyn_bytes() < MGC_NEED) mgc_trap();\n"
    "    y[threadIdx.x] = (float)mgc_dyn_bytes();\n"
    "}\n"
    "#endif\n"
    "#if defined(MGC_ENTRY_staged)\n" /* x staged by cp.async; WAIT: read after its wait */
    "extern \"C\" __global__ void MGC_ENTRY_NAME(float *y, const float *x) {\n"
    "    mgc_pdl_begin();\n"
    "    MGC_DYN_SHARED(float, s);\n"
    "    mgc_emu_cp_async(&s[threadIdx.x * 4], &x[threadIdx.x * 4], 16, true);\n"
    "    mgc_emu_cp_commit();\n"
    "#if MGC_WAIT\n"
    "    mgc_emu_cp_wait(0);\n"
    "#endif\n"
    "    __syncthreads();\n"
    "    for (int k = 0; k < 4; k++) y[threadIdx.x * 4 + k] = s[threadIdx.x * 4 + k];\n"
    "}\n"
    "#endif\n"
    "#if defined(MGC_ENTRY_past_end)\n" /* a[n] of float a[4] with n = 4 */
    "extern \"C\" __global__ void MGC_ENTRY_NAME(float *y, int n) {\n"
    "    mgc_pdl_begin();\n"
    "    float a[4] = {1.0f, 2.0f, 3.0f, 4.0f};\n"
    "    y[threadIdx.x] = a[n];\n"
    "}\n"
    "#endif\n"
    "#if defined(MGC_ENTRY_wide_shift)\n" /* 1u << n with n = 32: PTX gives 0, x86 1 */
    "extern \"C\" __global__ void MGC_ENTRY_NAME(float *y, int n) {\n"
    "    mgc_pdl_begin();\n"
    "    y[threadIdx.x] = (float)(1u << n);\n"
    "}\n"
    "#endif\n"
    "#if defined(MGC_ENTRY_narrowing)\n" /* (int)3e9f: PTX saturates, x86 gives INT_MIN */
    "extern \"C\" __global__ void MGC_ENTRY_NAME(float *y, float f) {\n"
    "    mgc_pdl_begin();\n"
    "    y[threadIdx.x] = (float)(int)f;\n"
    "}\n"
    "#endif\n"
    "#if defined(MGC_ENTRY_misaligned)\n" /* a 16-byte load 4 bytes past a 16-byte boundary */
    "extern \"C\" __global__ void MGC_ENTRY_NAME(float *y, const float *x) {\n"
    "    mgc_pdl_begin();\n"
    "    float4 v = *(const float4 *)(x + 1);\n"
    "    y[threadIdx.x] = v.x + v.y + v.z + v.w;\n"
    "}\n"
    "#endif\n";

static mgc_kspec spec(const char *entry) {
    mgc_kspec k;
    mgc_kspec_init(&k, "test_emu.cuh", entry, 0);
    k.text = kernels;
    return k;
}

static int launch(mgc_emu *e, const mgc_kspec *k, unsigned gx, unsigned gy, unsigned block,
                  size_t smem, void **args, char *err, size_t n) {
    err[0] = 0;
    return mgc_emu_launch(e, k, gx, gy, 1, block, smem, args, err, n);
}

/* A launch that must fail with a message containing `want`. */
static void fails(mgc_emu *e, const char *entry, unsigned gx, unsigned gy, unsigned block,
                  size_t smem, void **args, const char *want) {
    char err[2048];
    mgc_kspec k = spec(entry);
    int rc = launch(e, &k, gx, gy, block, smem, args, err, sizeof err);
    T_EQ_I64(rc, -1);
    if (rc != -1 || !strstr(err, want))
        fprintf(stderr, "%s: expected an error with \"%s\", got rc %d: %s\n", entry, want, rc, err);
    T_CHECK(strstr(err, want) != NULL);
}

/* The launch in a child process, which must die (UBSan aborts it) saying `want` on stderr
 * (need: the spec's NEED, where it has one). */
static void aborts_need(const char *entry, void **args, const char *want, int need) {
    int fd[2];
    T_CHECK(pipe(fd) == 0);
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
        dup2(fd[1], 2);
        close(fd[0]);
        char err[2048];
        mgc_emu *e = NULL;
        if (mgc_emu_open(&e, err, sizeof err)) _exit(3);
        mgc_kspec k = spec(entry);
        if (need) mgc_kspec_const(&k, "NEED", need);
        int rc = mgc_emu_launch(e, &k, 1, 1, 1, 32, 0, args, err, sizeof err);
        fprintf(stderr, "launch returned %d: %s\n", rc, err);
        _exit(0);
    }
    close(fd[1]);
    char out[8192];
    size_t got = 0;
    ssize_t r;
    while (got < sizeof out - 1 && (r = read(fd[0], out + got, sizeof out - 1 - got)) > 0)
        got += (size_t)r;
    out[got] = 0;
    close(fd[0]);
    int st = 0;
    T_CHECK(waitpid(pid, &st, 0) == pid);
    int died = WIFSIGNALED(st) || (WIFEXITED(st) && WEXITSTATUS(st) != 0 && WEXITSTATUS(st) != 3);
    T_CHECK(died);
    T_CHECK(strstr(out, want) != NULL);
    if (!died || !strstr(out, want))
        fprintf(stderr, "%s: expected the child to abort with \"%s\"; status %d, stderr:\n%s\n",
                entry, want, st, out);
}

static void aborts(const char *entry, void **args, const char *want) {
    aborts_need(entry, args, want, 0);
}

int main(void) {
    if (t_sanitized()) {
        printf("test_emu: not under a sanitizer: skipped\n");
        return 77;
    }
    char err[4096];
    mgc_emu *e = NULL;
    if (mgc_emu_open(&e, err, sizeof err)) {
        printf("test_emu: %s: skipped\n", err);
        return 77;
    }
    enum { N = 1000, B = 4 * 128 };
    float *x = malloc(B * sizeof *x), *y = malloc(B * sizeof *y), *z = malloc(B * sizeof *z);
    T_CHECK(x && y && z);
    if (!x || !y || !z) return t_summary("test_emu");
    for (int i = 0; i < B; i++) x[i] = 1.0f + (float)((i * 37) % 101);

    /* a correct kernel: every element, over a partial last block */
    {
        mgc_kspec k = spec("scale");
        int n = N < B ? N : B - 5;
        for (int i = 0; i < B; i++) y[i] = -1.0f;
        void *args[] = {&y, &x, &n};
        T_EQ_I64(launch(e, &k, (unsigned)(n + 127) / 128, 1, 128, 0, args, err, sizeof err), 0);
        int bad = 0;
        for (int i = 0; i < B; i++)
            bad += y[i] != (i < n ? 2.0f * x[i] + (float)(i / 128) : -1.0f);
        T_EQ_I64(bad, 0);
    }

    /* shared memory read with no barrier after the write: wrong in some order; with the
     * barrier, right in every order */
    for (int sync = 0; sync < 2; sync++) {
        mgc_kspec k = spec("rotate");
        mgc_kspec_const(&k, "SYNC", sync);
        int wrong_runs = 0;
        for (uint64_t seed = 1; seed <= 4; seed++) {
            mgc_emu_set_seed(e, seed);
            for (int i = 0; i < B; i++) y[i] = -1.0f;
            void *args[] = {&y, &x};
            T_EQ_I64(launch(e, &k, B / 128, 1, 128, 0, args, err, sizeof err), 0);
            int bad = 0;
            for (int i = 0; i < B; i++)
                bad += y[i] != x[i / 128 * 128 + (i % 128 + 1) % 128];
            wrong_runs += bad > 0;
        }
        if (sync) T_EQ_I64(wrong_runs, 0);
        else T_CHECK(wrong_runs > 0);
    }

    /* blocks that depend on one another: other bits under another seed */
    {
        mgc_kspec k = spec("chain");
        float first[64];
        int differ = 0;
        for (uint64_t seed = 1; seed <= 4; seed++) {
            mgc_emu_set_seed(e, seed);
            for (int i = 0; i < 64; i++) y[i] = 0.0f, z[i] = -1.0f;
            void *args[] = {&y, &z};
            T_EQ_I64(launch(e, &k, 64, 1, 32, 0, args, err, sizeof err), 0);
            if (seed == 1) memcpy(first, z, sizeof first);
            else differ += memcmp(first, z, sizeof first) != 0;
        }
        T_CHECK(differ > 0);
        mgc_emu_set_seed(e, 1);
    }

    /* cp.async: before its wait a thread reads the old bytes (the dynamic shared memory's
     * 0xff poison); after it, the copy */
    for (int wait = 0; wait < 2; wait++) {
        mgc_kspec k = spec("staged");
        mgc_kspec_const(&k, "WAIT", wait);
        for (int i = 0; i < 128; i++) y[i] = -1.0f;
        void *args[] = {&y, &x};
        int rc = launch(e, &k, 1, 1, 32, 128 * sizeof(float), args, err, sizeof err);
        if (rc) fprintf(stderr, "staged: %s\n", err);
        T_EQ_I64(rc, 0);
        int same = 0;
        for (int i = 0; i < 128; i++) same += y[i] == x[i];
        T_EQ_I64(same, wait ? 128 : 0);
    }

    /* rules a GPU enforces, or where it would hang or run wrongly: each an error */
    void *a1[] = {&y};
    fails(e, "two_barriers", 1, 1, 32, 0, a1, "wait at different barriers");
    fails(e, "lanes_apart", 1, 1, 32, 0, a1, "wait at different places");
    fails(e, "lane_gone", 1, 1, 32, 0, a1, "returned while lane");
    fails(e, "no_pdl", 1, 1, 32, 0, a1, "mgc_pdl_begin() 0 times");
    int n = 4;
    void *a3[] = {&y, &x, &n};
    fails(e, "scale", 1, 65536, 32, 0, a3, "a grid of (1, 65536, 1) blocks");
    fails(e, "scale", 1, 1, 32, 101377, a3, "bytes of dynamic shared memory");
    fails(e, "scale", 1, 1, 1025, 0, a3, "a block of 1025 threads");

    /* mgc_dyn_bytes(): the launch's dynamic shared memory, which the attention kernels past
     * head dim 128 check before carving it; given less than they need, mgc_trap() ends the
     * process (SIGILL in the emulator, the grid on a GPU) */
    {
        mgc_kspec k = spec("dyn_size");
        mgc_kspec_const(&k, "NEED", 4096);
        for (int i = 0; i < 32; i++) y[i] = -1.0f;
        void *ad[] = {&y};
        T_EQ_I64(launch(e, &k, 1, 1, 32, 4096 + 16, ad, err, sizeof err), 0);
        int bad = 0;
        for (int i = 0; i < 32; i++) bad += y[i] != 4096.0f + 16.0f;
        T_EQ_I64(bad, 0);
        aborts_need("dyn_size", ad, "", 16); /* launched with none */
    }

    /* the UBSan checks, where GCC builds the kernels (docs/cuda-emulator.md) */
    const char *cxx = getenv("MGC_EMU_CXX"), *bounds = getenv("MGC_EMU_BOUNDS");
    if ((cxx && strstr(cxx, "clang")) || (bounds && !strcmp(bounds, "0"))) {
        printf("test_emu: no bounds or alignment checks under this compiler or setting: their "
               "cases skipped\n");
    } else {
        void *ap[] = {&y, &n};
        aborts("past_end", ap, "out of bounds");
        void *am[] = {&y, &x};
        aborts("misaligned", am, "misaligned address");
        int wide = 32;
        void *as[] = {&y, &wide};
        aborts("wide_shift", as, "shift exponent 32 is too large");
        float big = 3e9f;
        void *af[] = {&y, &big};
        aborts("narrowing", af, "outside the range of representable values");
    }
    mgc_emu_close(e);
    free(x), free(y), free(z);
    return t_summary("test_emu");
}
