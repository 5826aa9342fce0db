/* emu_kernel.c - the CUDA emulator (emu_kernel.h): kernels compiled for the host,
 * one fiber per GPU thread, collectives completed once every participant
 * arrives.  docs/cuda-emulator.md is the manual. */
#define _GNU_SOURCE
#include "emu_kernel.h"

#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <spawn.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <ucontext.h>
#include <unistd.h>

#include "emu/emu_abi.h"
#include "half.h"
#include "nvrtc.h"

extern char **environ;

/* the emulator's headers (the .h files of runtime/emu), embedded by runtime/CMakeLists.txt */
typedef struct mgc_kernel_file {
    const char *name;
    const char *text;
} mgc_kernel_file;
extern const mgc_kernel_file mgc_emu_files[];

#define MAX_BLOCK   1024
#define STACK_BYTES (256 * 1024)
/* host compiler flags: part of the cache key (mgc_emu_open adds the bounds checks: e->flags) */
#define CXX_FLAGS "-std=c++17 -O1 -fPIC -shared -fno-strict-aliasing -w"
#define CXX_BOUNDS                                                                               \
    " -fsanitize=bounds,alignment,shift,float-cast-overflow,signed-integer-overflow"                \
    " -fno-sanitize-recover=bounds,alignment,shift,float-cast-overflow,signed-integer-overflow"

/* ---- context switches ----------------------------------------------------------------------
 * A GPU thread blocks at every collective, so a kernel switches fibers millions of times a
 * step: on x86-64 a switch is a dozen instructions here (callee-saved registers, the SSE and
 * x87 control words, the stack pointer), where swapcontext makes a system call for the signal
 * mask.  Elsewhere ucontext does it. */
#if defined(__x86_64__) && !defined(MGC_EMU_UCONTEXT)
typedef struct fctx {
    void *sp;
} fctx;
void mgc_emu_swap(void **save_sp, void *load_sp);
__asm__(".text\n"
        ".globl mgc_emu_swap\n"
        ".type mgc_emu_swap,@function\n"
        "mgc_emu_swap:\n"
        "    pushq %rbp\n"
        "    pushq %rbx\n"
        "    pushq %r12\n"
        "    pushq %r13\n"
        "    pushq %r14\n"
        "    pushq %r15\n"
        "    subq $8, %rsp\n"
        "    stmxcsr (%rsp)\n"
        "    fnstcw 4(%rsp)\n"
        "    movq %rsp, (%rdi)\n"
        "    movq %rsi, %rsp\n"
        "    ldmxcsr (%rsp)\n"
        "    fldcw 4(%rsp)\n"
        "    addq $8, %rsp\n"
        "    popq %r15\n"
        "    popq %r14\n"
        "    popq %r13\n"
        "    popq %r12\n"
        "    popq %rbx\n"
        "    popq %rbp\n"
        "    ret\n"
        ".size mgc_emu_swap, .-mgc_emu_swap\n"
        ".section .note.GNU-stack,\"\",@progbits\n"
        ".text\n");
static void fiber_main(void);
/* a fresh fiber on stack [lo, lo + bytes) that starts in fiber_main */
static void fctx_make(fctx *c, void *lo, size_t bytes) {
    uintptr_t top = ((uintptr_t)lo + bytes) & ~(uintptr_t)15;
    uint64_t *sp = (uint64_t *)top;
    *--sp = 0;                        /* fiber_main's return address: never used */
    *--sp = (uint64_t)(uintptr_t)fiber_main; /* mgc_emu_swap's ret lands here */
    for (int i = 0; i < 6; i++) *--sp = 0; /* rbp rbx r12-r15 */
    uint32_t csr;
    uint16_t cw;
    __asm__ volatile("stmxcsr %0" : "=m"(csr));
    __asm__ volatile("fnstcw %0" : "=m"(cw));
    *--sp = (uint64_t)csr | ((uint64_t)cw << 32);
    c->sp = sp;
}
static void fctx_switch(fctx *save, fctx *load) {
    mgc_emu_swap(&save->sp, load->sp);
}
#else
typedef struct fctx {
    ucontext_t uc;
} fctx;
static void fiber_main(void);
static void fctx_make(fctx *c, void *lo, size_t bytes) {
    getcontext(&c->uc);
    c->uc.uc_stack.ss_sp = lo;
    c->uc.uc_stack.ss_size = bytes;
    c->uc.uc_link = NULL; /* fiber_main switches back itself */
    makecontext(&c->uc, fiber_main, 0);
}
static void fctx_switch(fctx *save, fctx *load) {
    swapcontext(&save->uc, &load->uc);
}
#endif

typedef void (*entry_fn)(mgc_emu_thr *t, void **args);

typedef int (*params_fn)(unsigned long long *sizes, int max);

typedef struct loaded {
    char name[MGC_KSPEC_NAME_MAX];
    void *dl;
    entry_fn entry;
    params_fn params;
} loaded;

enum { F_RUN, F_WAIT, F_DONE };

typedef struct fiber {
    fctx ctx;
    void *stack; /* STACK_BYTES, a guard page below */
    mgc_emu_thr t;
    int state;
    /* the collective it waits at */
    int kind, line;
    unsigned mask;
    long long param;
    unsigned char in[MGC_EMU_OPND_MAX], out[MGC_EMU_OPND_MAX];
} fiber;

struct mgc_emu {
    char cxx[1100];
    char flags[512]; /* CXX_FLAGS, and the bounds checks unless MGC_EMU_BOUNDS=0 */
    loaded *k;
    int n_k, cap_k;
    fiber *f; /* MAX_BLOCK */
    int n_stacks;
    fctx sched;
    fiber *cur;
    void *dyn;        /* dynamic shared memory */
    size_t dyn_bytes, dyn_cap;
    entry_fn entry;
    void **args;
    uint64_t seed, launch_no;
    uint64_t rng; /* the running block's thread-order generator */
    mgc_emu_stats st;
    int64_t arrivals[MGC_EMU_LDSM_T + 1]; /* this launch's thread arrivals at each collective */
    char *err; /* the running block's error, if any */
    size_t errsz;
    int failed;
};

/* the emulator a fiber of this OS thread belongs to (makecontext passes no pointer) */
static __thread mgc_emu *tl_emu;
/* one compiler run at a time in a process: ranks as threads load the same kernels, and the
 * second finds the first's object in the cache instead of compiling it again */
static pthread_mutex_t compile_lock = PTHREAD_MUTEX_INITIALIZER;

static int fail(char *err, size_t errsz, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;
static int fail(char *err, size_t errsz, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    if (err && errsz) vsnprintf(err, errsz, fmt, ap);
    va_end(ap);
    return -1;
}

static uint64_t fnv64(const void *p, size_t n, uint64_t h) {
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++)
        h = (h ^ b[i]) * 1099511628211ull;
    return h;
}

static const char *emu_file(const char *name) {
    for (int i = 0; mgc_emu_files[i].name; i++)
        if (!strcmp(mgc_emu_files[i].name, name)) return mgc_emu_files[i].text;
    return NULL;
}

/* the compiler: MGC_EMU_CXX, else c++ (then g++, clang++) on PATH */
static int find_cxx(char *out, size_t n) {
    const char *env = getenv("MGC_EMU_CXX");
    if (env && *env) {
        snprintf(out, n, "%s", env);
        return 0;
    }
    static const char *const names[] = {"c++", "g++", "clang++"};
    const char *path = getenv("PATH");
    if (!path || !*path) path = "/usr/local/bin:/usr/bin:/bin";
    for (int i = 0; i < 3; i++) {
        const char *p = path;
        while (*p) {
            const char *e = strchr(p, ':');
            size_t len = e ? (size_t)(e - p) : strlen(p);
            char cand[1024];
            snprintf(cand, sizeof cand, "%.*s/%s", (int)(len < 900 ? len : 900), p, names[i]);
            if (len && access(cand, X_OK) == 0) {
                snprintf(out, n, "%s", cand);
                return 0;
            }
            p += len + (e != NULL);
        }
    }
    return -1;
}

int mgc_emu_open(mgc_emu **out, char *err, size_t errsz) {
    *out = NULL;
    mgc_emu *e = calloc(1, sizeof *e);
    if (!e) return fail(err, errsz, "out of memory");
    if (find_cxx(e->cxx, sizeof e->cxx)) {
        free(e);
        return fail(err, errsz, "the CUDA emulator compiles kernels with a host C++ compiler and "
                                "found none (c++, g++ or clang++ on PATH): install g++ "
                                "(apt-get install g++) or name one in MGC_EMU_CXX");
    }
    /* Array bounds checks in the emulated kernels (UBSan): an index past a fixed-size array --
     * a shared-memory tile, a fragment or accumulator array -- aborts with the template's
     * file:line, where a GPU would read a neighbour silently.  With them, what a GPU does
     * otherwise than x86: a misaligned access (the GPU faults), a shift by the width or more
     * (PTX clamps, x86 masks the count), a float converted to an integer it does not fit (PTX
     * saturates, x86 gives INT_MIN), a signed overflow (index arithmetic past int).  GCC's
     * objects load its runtime (libubsan) themselves; clang's do not (its runtime is not on
     * the loader's path), so under clang there are none.  MGC_EMU_BOUNDS=0 turns them off. */
    const char *bounds = getenv("MGC_EMU_BOUNDS"), *base = strrchr(e->cxx, '/');
    int check = !(bounds && !strcmp(bounds, "0")) && !strstr(base ? base + 1 : e->cxx, "clang");
    snprintf(e->flags, sizeof e->flags, "%s%s", CXX_FLAGS, check ? CXX_BOUNDS : "");
    e->f = calloc(MAX_BLOCK, sizeof *e->f);
    if (!e->f) {
        free(e);
        return fail(err, errsz, "out of memory");
    }
    /* MGC_EMU_SEED: the seed of the thread and block orders (default 1) */
    const char *sd = getenv("MGC_EMU_SEED");
    e->seed = sd && *sd ? strtoull(sd, NULL, 10) : 1;
    *out = e;
    return 0;
}

void mgc_emu_close(mgc_emu *e) {
    if (!e) return;
    for (int i = 0; i < e->n_k; i++)
        if (e->k[i].dl) dlclose(e->k[i].dl);
    free(e->k);
    for (int i = 0; i < e->n_stacks; i++)
        munmap((char *)e->f[i].stack - 4096, STACK_BYTES + 4096);
    free(e->f);
    free(e->dyn);
    free(e);
}

void mgc_emu_set_seed(mgc_emu *e, uint64_t seed) {
    e->seed = seed;
    e->launch_no = 0;
}

void mgc_emu_get_stats(const mgc_emu *e, mgc_emu_stats *st) {
    *st = e->st;
}

/* ---- compiling a kernel ------------------------------------------------------------------ */

/* writes text to path unless a file of that size is there (atomically: temp + rename) */
static int put_file(const char *path, const char *text) {
    struct stat sb;
    size_t n = strlen(text);
    if (stat(path, &sb) == 0 && (size_t)sb.st_size == n) return 0;
    char tmp[1200];
    snprintf(tmp, sizeof tmp, "%.1100s.tmp.%d.%lx", path, (int)getpid(), (unsigned long)pthread_self());
    FILE *f = fopen(tmp, "wb");
    if (!f) return -1;
    int ok = fwrite(text, 1, n, f) == n;
    ok &= fclose(f) == 0;
    if (ok && rename(tmp, path) == 0) return 0;
    remove(tmp);
    return -1;
}

/* the cache directory of emulated kernels and, in it, the include directory of this build's
 * headers (named by their hash): 0, or -1 with the message */
static int prepare_dirs(const mgc_emu *e, char *dir, size_t dn, char *inc, size_t in, uint64_t *hh,
                        char *err, size_t errsz) {
    char base[1024];
    const char *b = mgc_kernel_cache_dir(base, sizeof base);
    if (b) {
        snprintf(dir, dn, "%.1000s/emu", b);
    } else { /* MGC_KERNEL_CACHE=off: this process's own directory, compiled afresh */
        const char *t = getenv("TMPDIR");
        snprintf(dir, dn, "%.900s/mgc-emu-%d", t && *t ? t : "/tmp", (int)getpid());
    }
    static const char *const heads[] = {"cuda_emu.h", "emu_abi.h"};
    const char *common = mgc_kernel_template("mgc_common.cuh");
    uint64_t h = fnv64(e->flags, strlen(e->flags), 1469598103934665603ull);
    h = fnv64(e->cxx, strlen(e->cxx), h);
    for (int i = 0; i < 2; i++) {
        const char *t = emu_file(heads[i]);
        if (!t) return fail(err, errsz, "CUDA emulator: %s is not embedded in this build", heads[i]);
        h = fnv64(t, strlen(t) + 1, h);
    }
    if (!common) return fail(err, errsz, "CUDA emulator: no kernels/mgc_common.cuh in this build");
    h = fnv64(common, strlen(common) + 1, h);
    snprintf(inc, in, "%.1000s/inc-%016" PRIx64, dir, h);
    mgc_mkdirs(inc);
    char p[1200];
    for (int i = 0; i < 3; i++) {
        const char *name = i < 2 ? heads[i] : "mgc_common.cuh";
        snprintf(p, sizeof p, "%.1100s/%s", inc, name);
        if (put_file(p, i < 2 ? emu_file(name) : common))
            return fail(err, errsz, "CUDA emulator: cannot write %s: %s", p, strerror(errno));
    }
    *hh = h;
    return 0;
}

/* the compiler's diagnostics, at most errsz bytes of them */
static void read_log(const char *path, char *buf, size_t n) {
    FILE *f = fopen(path, "rb");
    size_t got = 0;
    if (f) {
        got = fread(buf, 1, n ? n - 1 : 0, f);
        fclose(f);
    }
    if (n) buf[got] = 0;
}

/* One kernel to build: its source with the entry trampoline, and where it goes. */
typedef struct build {
    char name[MGC_KSPEC_NAME_MAX];
    char *full;                               /* the source compiled */
    char obj[1500], src[1600], tmp[1600], log[1600];
    pid_t pid;                                /* the compiler, while it runs */
} build;

static const char tramp[] = "\n/* the emulator's entry (runtime/emu_kernel.c) */\n"
                            "extern \"C\" void mgc_emu_kernel(mgc_emu_thr *t, void **args) {\n"
                            "    mgc_emu_cur = t;\n    mgc_emu_invoke(MGC_ENTRY_NAME, args);\n"
                            "    mgc_emu_cur = t;\n    mgc_emu_cp_flush();\n}\n"
                            "extern \"C\" int mgc_emu_params(unsigned long long *sz, int max) {\n"
                            "    return mgc_emu_param_sizes(MGC_ENTRY_NAME, sz, max);\n}\n";

/* b's source and paths (dir: the cache directory, h: the headers' hash); 0 or -1 */
static int build_init(build *b, const mgc_kspec *k, const char *dir, uint64_t h, char *err,
                      size_t errsz) {
    memset(b, 0, sizeof *b);
    mgc_kspec_name(k, b->name, sizeof b->name);
    char *src = mgc_kspec_source(k);
    if (!src) return fail(err, errsz, "CUDA emulator: no source for kernel %s", b->name);
    size_t sl = strlen(src);
    b->full = malloc(sl + sizeof tramp);
    if (!b->full) {
        free(src);
        return fail(err, errsz, "out of memory");
    }
    memcpy(b->full, src, sl);
    memcpy(b->full + sl, tramp, sizeof tramp);
    free(src);
    h = fnv64(b->full, strlen(b->full), h);
    snprintf(b->obj, sizeof b->obj, "%.1000s/%.200s-%016" PRIx64 ".so", dir, b->name, h);
    unsigned long tid = (unsigned long)pthread_self();
    snprintf(b->src, sizeof b->src, "%.1480s.%d.%lx.cc", b->obj, (int)getpid(), tid);
    snprintf(b->tmp, sizeof b->tmp, "%.1480s.%d.%lx.tmp", b->obj, (int)getpid(), tid);
    snprintf(b->log, sizeof b->log, "%.1480s.%d.%lx.log", b->obj, (int)getpid(), tid);
    return 0;
}

static void build_free(build *b) {
    free(b->full);
    b->full = NULL;
}

/* starts the compiler on b: 0, or -1 with the message */
static int build_start(const mgc_emu *e, const char *inc, build *b, char *err, size_t errsz) {
    if (put_file(b->src, b->full))
        return fail(err, errsz, "CUDA emulator: cannot write %s: %s", b->src, strerror(errno));
    char incopt[1300];
    snprintf(incopt, sizeof incopt, "-I%s", inc);
    char flags[sizeof e->flags];
    snprintf(flags, sizeof flags, "%s", e->flags);
    char *argv[32];
    int a = 0;
    argv[a++] = (char *)e->cxx;
    for (char *t = strtok(flags, " "); t && a < 20; t = strtok(NULL, " "))
        argv[a++] = t;
    argv[a++] = incopt;
    argv[a++] = (char *)"-include";
    argv[a++] = (char *)"cuda_emu.h";
    argv[a++] = (char *)"-o";
    argv[a++] = b->tmp;
    argv[a++] = b->src;
    argv[a] = NULL;
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 1, b->log, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    posix_spawn_file_actions_adddup2(&fa, 1, 2);
    int rc = posix_spawnp(&b->pid, e->cxx, &fa, NULL, argv, environ);
    posix_spawn_file_actions_destroy(&fa);
    if (rc) {
        b->pid = 0;
        remove(b->src);
        return fail(err, errsz, "CUDA emulator: cannot run %s: %s", e->cxx, strerror(rc));
    }
    return 0;
}

/* waits for b's compiler and installs its object in the cache: 0, or -1 with its diagnostics */
static int build_finish(const mgc_emu *e, build *b, char *err, size_t errsz) {
    int status = 0, rc = 0;
    while (waitpid(b->pid, &status, 0) < 0 && errno == EINTR) {
    }
    b->pid = 0;
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        char diag[3000];
        read_log(b->log, diag, sizeof diag);
        rc = fail(err, errsz, "CUDA emulator: %s failed on kernel %s (exit %d):\n%s", e->cxx,
                  b->name, WIFEXITED(status) ? WEXITSTATUS(status) : -1, diag);
    } else if (rename(b->tmp, b->obj) != 0) {
        rc = fail(err, errsz, "CUDA emulator: cannot rename %s: %s", b->tmp, strerror(errno));
    }
    remove(b->src), remove(b->tmp), remove(b->log);
    return rc;
}

static int open_obj(const char *path, loaded *l) {
    void *dl = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!dl) return -1;
    int (*abi)(void) = (int (*)(void))dlsym(dl, "mgc_emu_abi");
    void (*bind)(const mgc_emu_rt *) = (void (*)(const mgc_emu_rt *))dlsym(dl, "mgc_emu_bind");
    entry_fn entry = (entry_fn)dlsym(dl, "mgc_emu_kernel");
    params_fn params = (params_fn)dlsym(dl, "mgc_emu_params");
    if (!abi || !bind || !entry || !params || abi() != MGC_EMU_ABI) {
        dlclose(dl);
        return -1;
    }
    extern const mgc_emu_rt mgc_emu_runtime;
    bind(&mgc_emu_runtime);
    l->dl = dl;
    l->entry = entry;
    l->params = params;
    return 0;
}

static loaded *find(mgc_emu *e, const char *name) {
    for (int i = 0; i < e->n_k; i++)
        if (!strcmp(e->k[i].name, name)) return &e->k[i];
    return NULL;
}

static int cpus(void) {
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (int)(n < 64 ? n : 64) : 1;
}

int mgc_emu_load_many(mgc_emu *e, const mgc_kspec *k, int n, int jobs, char *err, size_t errsz) {
    if (jobs <= 0) jobs = cpus();
    build *b = calloc((size_t)(n > 0 ? n : 1), sizeof *b);
    if (!b) return fail(err, errsz, "out of memory");
    char dir[1100], inc[1200];
    uint64_t h = 0;
    int rc = 0, nb = 0;
    pthread_mutex_lock(&compile_lock);
    if (prepare_dirs(e, dir, sizeof dir, inc, sizeof inc, &h, err, errsz)) rc = -1;
    /* the kernels this emulator lacks, once each; from the cache where they are there */
    for (int i = 0; i < n && !rc; i++) {
        char name[MGC_KSPEC_NAME_MAX];
        mgc_kspec_name(&k[i], name, sizeof name);
        int dup = find(e, name) != NULL;
        for (int j = 0; j < nb && !dup; j++)
            dup = !strcmp(b[j].name, name);
        if (dup) continue;
        if (e->n_k + nb + 1 > e->cap_k) {
            int cap = e->cap_k ? 2 * e->cap_k : 64;
            while (cap < e->n_k + nb + 1) cap *= 2;
            loaded *nk = realloc(e->k, (size_t)cap * sizeof *nk);
            if (!nk) {
                rc = fail(err, errsz, "out of memory");
                break;
            }
            e->k = nk, e->cap_k = cap;
        }
        if (build_init(&b[nb], &k[i], dir, h, err, errsz)) {
            rc = -1;
            break;
        }
        loaded l;
        memset(&l, 0, sizeof l);
        snprintf(l.name, sizeof l.name, "%s", b[nb].name);
        if (open_obj(b[nb].obj, &l) == 0) { /* cached */
            e->k[e->n_k++] = l;
            e->st.cached++;
            build_free(&b[nb]);
            continue;
        }
        nb++; /* missing or broken: compiled again, never trusted */
    }
    /* compile them, `jobs` compilers at a time */
    int next = 0, running = 0, done = 0;
    while (!rc && done < nb) {
        while (next < nb && running < jobs && !rc) {
            if (build_start(e, inc, &b[next], err, errsz)) rc = -1;
            else next++, running++;
        }
        if (rc) break;
        for (int j = 0; j < next; j++) { /* the oldest running one */
            if (!b[j].pid) continue;
            if (build_finish(e, &b[j], err, errsz)) rc = -1;
            running--, done++;
            if (!rc) {
                loaded l;
                memset(&l, 0, sizeof l);
                snprintf(l.name, sizeof l.name, "%s", b[j].name);
                if (open_obj(b[j].obj, &l) != 0)
                    rc = fail(err, errsz, "CUDA emulator: cannot load %s: %s", b[j].obj, dlerror());
                else
                    e->k[e->n_k++] = l, e->st.compiled++;
            }
            break;
        }
    }
    for (int j = 0; j < nb; j++) { /* after a failure: the compilers still running */
        if (b[j].pid) {
            char ignore[8];
            build_finish(e, &b[j], ignore, sizeof ignore);
        }
        build_free(&b[j]);
    }
    pthread_mutex_unlock(&compile_lock);
    free(b);
    return rc;
}

/* the kernel's object: from this emulator, the cache, or the compiler */
static loaded *load(mgc_emu *e, const mgc_kspec *k, char *err, size_t errsz) {
    char name[MGC_KSPEC_NAME_MAX];
    mgc_kspec_name(k, name, sizeof name);
    loaded *l = find(e, name);
    if (l) return l;
    if (mgc_emu_load_many(e, k, 1, 1, err, errsz)) return NULL;
    return find(e, name);
}

int mgc_emu_load(mgc_emu *e, const mgc_kspec *k, char *err, size_t errsz) {
    return load(e, k, err, errsz) ? 0 : -1;
}

/* ---- fibers and collectives ---------------------------------------------------------------- */

static const char *kind_name(int kind) {
    switch (kind) {
    case MGC_EMU_SYNC: return "__syncthreads";
    case MGC_EMU_SYNC_OR: return "__syncthreads_or";
    case MGC_EMU_SHFL_XOR: return "__shfl_xor_sync";
    case MGC_EMU_MATCH_ANY: return "__match_any_sync";
    case MGC_EMU_MMA_BF16:
    case MGC_EMU_MMA_F16: return "mma.sync";
    case MGC_EMU_LDSM:
    case MGC_EMU_LDSM_T: return "ldmatrix";
    default: return "?";
    }
}

static int is_block_kind(int kind) {
    return kind == MGC_EMU_SYNC || kind == MGC_EMU_SYNC_OR;
}

static void coll(mgc_emu_thr *t, int kind, int line, unsigned mask, long long param,
                 const void *in, unsigned in_bytes, void *out, unsigned out_bytes) {
    fiber *f = t->fiber;
    mgc_emu *e = tl_emu;
    if (kind > 0 && kind <= MGC_EMU_LDSM_T) e->arrivals[kind]++;
    if (!t->pdl) t->pdl_late = 1; /* a collective before mgc_pdl_begin */
    f->kind = kind, f->line = line, f->mask = mask, f->param = param;
    if (in_bytes > MGC_EMU_OPND_MAX) in_bytes = MGC_EMU_OPND_MAX;
    if (in_bytes) memcpy(f->in, in, in_bytes);
    f->state = F_WAIT;
    fctx_switch(&f->ctx, &e->sched);
    if (out_bytes) memcpy(out, f->out, out_bytes > MGC_EMU_OPND_MAX ? MGC_EMU_OPND_MAX : out_bytes);
}

const mgc_emu_rt mgc_emu_runtime = {MGC_EMU_ABI, coll};

static void fiber_main(void) {
    mgc_emu *e = tl_emu;
    fiber *f = e->cur;
    e->entry(&f->t, e->args);
    f->state = F_DONE;
    fctx_switch(&f->ctx, &e->sched); /* never resumed */
    abort();
}

static float bf16f(unsigned h) {
    return mgc_bf16_to_f32((uint16_t)h);
}
static float f16f(unsigned h) {
    return mgc_f16_to_f32((uint16_t)h);
}

/* mma m16n8k16: every lane's a[4], b[2] (16-bit pairs) and c[4] (fp32) -> d[4] */
static void do_mma(fiber *w, int f16) {
    float A[16][16], B[16][8], C[16][8];
    for (int l = 0; l < 32; l++) {
        unsigned r[6];
        float c[4];
        memcpy(r, w[l].in, 24);
        memcpy(c, w[l].in + 24, 16);
        int g = l >> 2, q = l & 3;
        for (int i = 0; i < 4; i++) {
            int row = g + 8 * (i & 1), col = 2 * q + 8 * (i >> 1);
            A[row][col] = f16 ? f16f(r[i]) : bf16f(r[i]);
            A[row][col + 1] = f16 ? f16f(r[i] >> 16) : bf16f(r[i] >> 16);
        }
        for (int i = 0; i < 2; i++) {
            int kr = 2 * q + 8 * i;
            B[kr][g] = f16 ? f16f(r[4 + i]) : bf16f(r[4 + i]);
            B[kr + 1][g] = f16 ? f16f(r[4 + i] >> 16) : bf16f(r[4 + i] >> 16);
        }
        C[g][2 * q] = c[0], C[g][2 * q + 1] = c[1];
        C[g + 8][2 * q] = c[2], C[g + 8][2 * q + 1] = c[3];
    }
    for (int l = 0; l < 32; l++) {
        int g = l >> 2, q = l & 3;
        float d[4];
        for (int i = 0; i < 4; i++) {
            int row = g + 8 * (i >> 1), col = 2 * q + (i & 1);
            double s = 0; /* the products are exact; the sum rounds once */
            for (int kk = 0; kk < 16; kk++)
                s += (double)A[row][kk] * (double)B[kk][col];
            d[i] = (float)(s + (double)C[row][col]);
        }
        memcpy(w[l].out, d, 16);
    }
}

/* ldmatrix.x4: lane 8m + r names row r of matrix m */
static void do_ldsm(fiber *w, int trans) {
    const unsigned short *row[32];
    for (int l = 0; l < 32; l++)
        memcpy(&row[l], w[l].in, sizeof row[l]);
    for (int l = 0; l < 32; l++) {
        int g = l >> 2, q = l & 3;
        unsigned r[4];
        for (int m = 0; m < 4; m++) {
            unsigned lo, hi;
            if (!trans) {
                lo = row[8 * m + g][2 * q], hi = row[8 * m + g][2 * q + 1];
            } else {
                lo = row[8 * m + 2 * q][g], hi = row[8 * m + 2 * q + 1][g];
            }
            r[m] = lo | (hi << 16);
        }
        memcpy(w[l].out, r, 16);
    }
}

static int block_fail(mgc_emu *e, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;
static int block_fail(mgc_emu *e, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    if (e->err && e->errsz) vsnprintf(e->err, e->errsz, fmt, ap);
    va_end(ap);
    e->failed = 1;
    return -1;
}

/* Completes the warp collective the lanes [w0, w0 + nl) of a warp wait at, once none of them can
 * run: the number of lanes released (0: none waits at a warp collective), or -1 when they
 * never can (lanes at different places; the message in e->err). */
static int resolve_warp(mgc_emu *e, int w0, int nl) {
    fiber *f = e->f;
    int released = 0, lead = -1;
    for (int l = 0; l < nl && lead < 0; l++)
        if (f[w0 + l].state == F_WAIT && !is_block_kind(f[w0 + l].kind)) lead = l;
    if (lead < 0) return 0;
    fiber *L = &f[w0 + lead];
    for (int l = 0; l < nl; l++) {
        fiber *x = &f[w0 + l];
        if (!(L->mask >> l & 1u)) continue;
        if (x->state == F_DONE)
            return block_fail(e, "lane %d of warp %d returned while lane %d waits at %s "
                                 "(line %d) with it in the mask",
                              l, w0 / 32, lead, kind_name(L->kind), L->line);
        if (x->kind != L->kind || x->line != L->line || x->mask != L->mask)
            return block_fail(e, "the lanes of warp %d wait at different places: lane %d at "
                                 "%s (line %d), lane %d at %s (line %d)",
                              w0 / 32, lead, kind_name(L->kind), L->line, l,
                              kind_name(x->kind), x->line);
    }
    fiber *w = &f[w0];
    switch (L->kind) {
    case MGC_EMU_SHFL_XOR: {
        int lm = (int)(L->param & 31), width = (int)(L->param >> 8);
        if (width <= 0 || width > 32) width = 32;
        for (int l = 0; l < nl; l++) {
            if (!(L->mask >> l & 1u)) continue;
            int src = l ^ lm;
            if (src >= (l / width + 1) * width || src >= nl || !(L->mask >> src & 1u)) src = l;
            memcpy(w[l].out, w[src].in, 8);
        }
        break;
    }
    case MGC_EMU_MATCH_ANY:
        for (int l = 0; l < nl; l++) {
            if (!(L->mask >> l & 1u)) continue;
            unsigned m = 0;
            for (int j = 0; j < nl; j++)
                if ((L->mask >> j & 1u) && !memcmp(w[j].in, w[l].in, 8)) m |= 1u << j;
            memcpy(w[l].out, &m, sizeof m);
        }
        break;
    case MGC_EMU_MMA_BF16:
    case MGC_EMU_MMA_F16:
    case MGC_EMU_LDSM:
    case MGC_EMU_LDSM_T:
        if (nl != 32 || L->mask != 0xffffffffu)
            return block_fail(e, "%s (line %d) needs the whole warp: warp %d has %d lanes",
                              kind_name(L->kind), L->line, w0 / 32, nl);
        if (L->kind == MGC_EMU_MMA_BF16 || L->kind == MGC_EMU_MMA_F16)
            do_mma(w, L->kind == MGC_EMU_MMA_F16);
        else
            do_ldsm(w, L->kind == MGC_EMU_LDSM_T);
        break;
    default: return block_fail(e, "unknown collective %d (line %d)", L->kind, L->line);
    }
    for (int l = 0; l < nl; l++)
        if (L->mask >> l & 1u) w[l].state = F_RUN, released++;
    return released;
}

/* Completes the block barrier once no thread can run and no warp collective is pending: the
 * number of threads released (0: all returned), or -1 (threads at different barriers). */
static int resolve_block(mgc_emu *e, int n) {
    fiber *f = e->f;
    int released = 0;
    /* the block barrier: every thread still running waits at the same one */
    int lead = -1, any = 0;
    for (int i = 0; i < n; i++) {
        if (f[i].state == F_DONE) continue;
        if (lead < 0) lead = i;
        if (f[i].kind != f[lead].kind || f[i].line != f[lead].line)
            return block_fail(e, "the threads of the block wait at different barriers: thread %d "
                                 "at %s (line %d), thread %d at %s (line %d)",
                              lead, kind_name(f[lead].kind), f[lead].line, i,
                              kind_name(f[i].kind), f[i].line);
        if (f[i].kind == MGC_EMU_SYNC_OR) {
            int p;
            memcpy(&p, f[i].in, sizeof p);
            any |= p != 0;
        }
    }
    if (lead < 0) return 0;
    for (int i = 0; i < n; i++) {
        if (f[i].state == F_DONE) continue;
        memcpy(f[i].out, &any, sizeof any);
        f[i].state = F_RUN, released++;
    }
    return released;
}

static uint64_t mix(uint64_t x) {
    x ^= x >> 30;
    x *= 0xbf58476d1ce4e5b9ull;
    x ^= x >> 27;
    x *= 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

/* After a block: each thread called mgc_pdl_begin once, before anything else the emulator
 * sees (kernels/mgc_common.cuh: the kernel may not touch global memory before it). */
static int pdl_check(mgc_emu *e, int n) {
    for (int i = 0; i < n; i++) {
        const mgc_emu_thr *t = &e->f[i].t;
        if (t->pdl != 1 || t->pdl_late)
            return block_fail(e,
                              "thread %d called mgc_pdl_begin() %u times%s: every kernel entry "
                              "calls it once, first (kernels/mgc_common.cuh)",
                              i, t->pdl, t->pdl_late ? ", after a collective or cp.async" : "");
    }
    return 0;
}
static int run_block(mgc_emu *e, const loaded *l, mgc_emu_u3 bid, mgc_emu_u3 gdim, int n) {
    if (e->dyn_bytes) memset(e->dyn, 0xff, e->dyn_bytes);
    for (int i = 0; i < n; i++) {
        fiber *f = &e->f[i];
        f->t.commits = 0, f->t.n_cp = 0; /* (not the whole struct: cp[] is large) */
        f->t.pdl = 0, f->t.pdl_late = 0;
        f->t.tid.x = (unsigned)i, f->t.tid.y = 0, f->t.tid.z = 0;
        f->t.bid = bid;
        f->t.bdim.x = (unsigned)n, f->t.bdim.y = 1, f->t.bdim.z = 1;
        f->t.gdim = gdim;
        f->t.dyn_shared = e->dyn;
        f->t.dyn_bytes = (unsigned)e->dyn_bytes;
        f->t.fiber = f;
        f->state = F_RUN;
        fctx_make(&f->ctx, f->stack, STACK_BYTES);
    }
    e->entry = l->entry;
    int nw = (n + 31) / 32, worder[MAX_BLOCK / 32];
    for (int w = 0; w < nw; w++)
        worder[w] = w;
    /* Warp by warp, in an order drawn afresh every round: a warp's lanes run (from a random lane,
     * forwards or backwards) until all of them wait at a block barrier or return, its warp
     * collectives completing as they go; then the block barrier completes. */
    for (;;) {
        for (int i = nw - 1; i > 0; i--) {
            e->rng = mix(e->rng + 0x9e3779b97f4a7c15ull);
            int j = (int)(e->rng % (uint64_t)(i + 1)), t = worder[i];
            worder[i] = worder[j], worder[j] = t;
        }
        for (int wi = 0; wi < nw; wi++) {
            int w0 = 32 * worder[wi], nl = n - w0 < 32 ? n - w0 : 32;
            for (;;) {
                e->rng = mix(e->rng + 0x9e3779b97f4a7c15ull);
                int r0 = (int)(e->rng % (uint64_t)nl), back = (int)(e->rng >> 63);
                for (int j = 0; j < nl; j++) {
                    fiber *f = &e->f[w0 + (back ? (r0 + nl - j) % nl : (r0 + j) % nl)];
                    if (f->state != F_RUN) continue;
                    e->cur = f;
                    fctx_switch(&e->sched, &f->ctx);
                }
                int r = resolve_warp(e, w0, nl);
                if (r < 0) return -1;
                if (r == 0) break;
            }
        }
        int r = resolve_block(e, n);
        if (r < 0) return -1;
        if (r == 0) return pdl_check(e, n); /* every thread returned */
    }
}

int mgc_emu_param_sizes(mgc_emu *e, const mgc_kspec *k, size_t *sizes, int max, char *err,
                        size_t errsz) {
    loaded *l = load(e, k, err, errsz);
    if (!l) return -1;
    unsigned long long sz[MGC_EMU_MAX_PARAMS];
    int n = l->params(sz, MGC_EMU_MAX_PARAMS);
    if (n < 0 || n > MGC_EMU_MAX_PARAMS || n > max)
        return fail(err, errsz, "kernel %s: %d parameters (at most %d)", l->name, n,
                    max < MGC_EMU_MAX_PARAMS ? max : MGC_EMU_MAX_PARAMS);
    for (int i = 0; i < n; i++)
        sizes[i] = (size_t)sz[i];
    return n;
}

int mgc_emu_launch(mgc_emu *e, const mgc_kspec *k, unsigned gx, unsigned gy, unsigned gz,
                   unsigned block, size_t smem_bytes, void **args, char *err, size_t errsz) {
    loaded *l = load(e, k, err, errsz);
    if (!l) return -1;
    if (block == 0 || block > MAX_BLOCK)
        return fail(err, errsz, "kernel %s: a block of %u threads (1 to %d)", l->name, block,
                    MAX_BLOCK);
    /* a grid a GPU launches: x below 2^31, y and z at most 65,535 */
    if (gx > 0x7fffffffu || gy > 65535u || gz > 65535u)
        return fail(err, errsz, "kernel %s: a grid of (%u, %u, %u) blocks (x below 2^31, y and z "
                    "at most 65,535)", l->name, gx, gy, gz);
    /* the most dynamic shared memory a block of every sm_80+ GPU may ask for (99 KB on sm_86
     * and sm_89; 163 KB on sm_80, 227 KB on sm_90): a launch that a GPU would refuse fails here */
    if (smem_bytes > 101376)
        return fail(err, errsz, "kernel %s: %zu bytes of dynamic shared memory, more than the "
                    "101,376 every sm_80+ GPU allows a block", l->name, smem_bytes);
    while (e->n_stacks < (int)block) { /* stacks stay for later launches */
        size_t len = STACK_BYTES + 4096;
        char *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                       -1, 0);
        if (p == MAP_FAILED) return fail(err, errsz, "CUDA emulator: no memory for thread stacks");
        mprotect(p, 4096, PROT_NONE); /* a guard page: an overflow faults */
        e->f[e->n_stacks++].stack = p + 4096;
    }
    if (smem_bytes > e->dyn_cap) {
        void *p = NULL;
        if (posix_memalign(&p, 256, smem_bytes))
            return fail(err, errsz, "CUDA emulator: no memory for %zu bytes of shared memory",
                        smem_bytes);
        free(e->dyn);
        e->dyn = p, e->dyn_cap = smem_bytes;
    }
    e->dyn_bytes = smem_bytes;
    e->st.launches++;
    e->st.dyn_bytes += (int64_t)smem_bytes;
    memset(e->arrivals, 0, sizeof e->arrivals);
    int trace = getenv("MGC_EMU_TRACE") != NULL;
    struct timespec t0, t1;
    if (trace) clock_gettime(CLOCK_MONOTONIC, &t0);
    uint64_t seed = mix(e->seed ^ mix(++e->launch_no));
    mgc_emu_u3 gdim = {gx, gy, gz};
    mgc_emu *prev = tl_emu;
    tl_emu = e;
    e->args = args;
    e->err = err, e->errsz = errsz, e->failed = 0;
    int rc = 0;
    /* the blocks in an order drawn from the launch's seed, as a GPU runs them in none: a
     * bijection of the linear block index over the next power of two, the indices past the
     * grid skipped.  A kernel whose result depends on the order of its blocks (one reading what
     * another writes in the same launch, two writing one element differently) gives other
     * bits under another seed (MGC_EMU_SEED), instead of the same ones by luck */
    uint64_t nb = (uint64_t)gx * gy * gz, span = 1;
    int bits = 0;
    while (span < nb) span <<= 1, bits++;
    const uint64_t mask = span - 1, mul = (mix(seed ^ 0x5bd1e995u) | 1) & mask,
                   add = mix(seed ^ 0x27d4eb2fu) & mask;
    for (uint64_t i = 0; i < span && !rc; i++) {
        uint64_t j = i; /* xor-shifts and an odd multiplier: a bijection of [0, span) */
        if (bits > 1) j ^= j >> (bits / 2);
        j = (j * mul + add) & mask;
        if (bits > 1) j ^= j >> ((bits + 1) / 2);
        if (j >= nb) continue;
        unsigned x = (unsigned)(j % gx), y = (unsigned)(j / gx % gy), z = (unsigned)(j / gx / gy);
        mgc_emu_u3 bid = {x, y, z};
        e->rng = mix(seed ^ j);
        if (run_block(e, l, bid, gdim, (int)block)) {
            char what[600];
            snprintf(what, sizeof what, "%s", err && errsz ? err : "");
            fail(err, errsz, "kernel %s, block (%u,%u,%u) of (%u,%u,%u), %u threads: %s",
                 l->name, x, y, z, gx, gy, gz, block, what);
            rc = -1;
        }
        e->st.threads += block;
    }
    tl_emu = prev;
    /* arrivals to instructions: a warp's 32 lanes issue one mma, ldmatrix or (full-warp)
     * shuffle; a block's threads pass one barrier */
    const int64_t *a = e->arrivals;
    int64_t mma = (a[MGC_EMU_MMA_BF16] + a[MGC_EMU_MMA_F16]) / 32;
    int64_t ldsm = (a[MGC_EMU_LDSM] + a[MGC_EMU_LDSM_T]) / 32, shfl = a[MGC_EMU_SHFL_XOR] / 32;
    int64_t bars = block ? (a[MGC_EMU_SYNC] + a[MGC_EMU_SYNC_OR]) / block : 0;
    e->st.mma += mma, e->st.ldmatrix += ldsm, e->st.shfl += shfl, e->st.barriers += bars;
    if (trace) {
        clock_gettime(CLOCK_MONOTONIC, &t1);
        fprintf(stderr,
                "emu: %s grid (%u,%u,%u) block %u smem %zu: %.3f ms; mma %" PRId64
                ", ldmatrix %" PRId64 ", shfl %" PRId64 ", barriers %" PRId64 "\n",
                l->name, gx, gy, gz, block, smem_bytes,
                (t1.tv_sec - t0.tv_sec) * 1e3 + (t1.tv_nsec - t0.tv_nsec) * 1e-6, mma, ldsm, shfl,
                bars);
    }
    return rc;
}
