/* cuda_backend.c - the CUDA backend (backend.h): the arena as one device
 * allocation, GEMMs through cuBLASLt, every other op through the kernels the
 * plan carries (NVRTC cubins made at `mgc compile`, codegen/kspec.h), with an
 * NVRTC JIT fallback and an on-disk cache for GPUs the plan has no cubin for.
 * docs/cuda-backend.md is the manual.
 *
 * One compute stream; every op is queued on it, so ops never race and the
 * executor's host-side reads (the loss, the norm) synchronise through
 * download.  Built only with the CUDA toolkit (runtime/CMakeLists.txt). */
#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cublasLt.h>
#include <cuda_runtime.h>

#include "backend.h"
#include "cuda_int.h"
#include "gemm_tuning.h"
#include "kspec.h"
#include "nvrtc.h"

#define MAX_GEMM_CACHE 128

typedef struct loaded_kernel {
    char name[MGC_KSPEC_NAME_MAX];
    cudaKernel_t fn;
    size_t smem_set; /* dynamic shared memory the attribute allows */
    /* the occupancy calculator's last answer (cuda_blocks_per_sm), for occ_block threads and
     * occ_smem bytes; occ_blocks -1: none yet; occ_pad: the dynamic shared memory a launch of
     * that size takes under MGC_CUDA_SMEM_PER_SM */
    unsigned occ_block;
    size_t occ_smem, occ_pad;
    int occ_blocks;
    int static_smem; /* its static shared memory; -1: not asked yet */
} loaded_kernel;

typedef mgc_gemm_key gemm_key; /* gemm_tuning.h: the key of the tuning file too */

typedef struct gemm_entry {
    gemm_key key;
    cublasLtMatmulDesc_t op;
    cublasLtMatrixLayout_t a, b, c;
    cublasLtMatmulAlgo_t algo;
    int ok; /* the heuristic found an algorithm */
    /* MGC_GEMM_TUNE: the heuristic's candidates, timed at the first run that launches; only
     * for the shapes bind's warm-up makes (`planned`), not the expert GEMMs sized by each
     * step's routing */
    cublasLtMatmulAlgo_t cand[MGC_GEMM_TUNING_MAX_CAND];
    int n_cand, tuned, planned;
} gemm_entry;

/* A program's CUDA graph (backend.h graph_begin): recorded on its second run, replayed after. */
typedef struct graph_entry {
    uint64_t key;
    int runs;              /* runs so far, eager or recorded */
    int never;             /* its recording failed: always eager */
    cudaGraphExec_t exec;  /* NULL until recorded */
} graph_entry;

#define MAX_GRAPHS 256

typedef struct cuda_ctx {
    mgc_cuda_host host; /* first: the launchers' view (cuda_int.h) */
    int device, arch;
    cudaStream_t stream;
    cublasLtHandle_t lt;
    void *ws;        /* the plan's GEMM workspace (arena) */
    size_t ws_bytes;
    const mgc_plan *plan;
    loaded_kernel *kernels;
    int n_kernels, cap_kernels;
    cudaLibrary_t *libs;
    int n_libs, cap_libs;
    void *scratch;        /* kernel scratch: the plan's kernel_scratch buffer, or (a plan of an
                             older mgc, a request past it) an allocation beside the arena */
    size_t scratch_bytes;
    int scratch_owned;    /* scratch is cudaMalloc'd (not the arena's) */
    int scratch_warned;
    void *scratch_arena;  /* the arena that holds it when not owned */
    gemm_entry gemm[MAX_GEMM_CACHE];
    int n_gemm;
    int jit_compiled, jit_cached;
    int dry;       /* bind's warm-up: GEMMs pick their algorithm, kernels load; nothing runs */
    int pdl;       /* MGC_PDL=1 on sm_90 and newer: kernels launched to overlap the previous one */
    /* the shared memory of a multiprocessor, and the bytes it reserves a block; smem_limit:
     * MGC_CUDA_SMEM_PER_SM, a smaller multiprocessor to pose as (0: none; cuda_blocks_per_sm) */
    size_t smem_sm, smem_reserved, smem_limit;
    /* MGC_ZERO_BESIDE=1: the step's zeroing of the gradients on a stream of its own beside
     * the forward (backend.h zero_beside), after zmark, finished at zdone */
    int zero_beside;
    cudaStream_t zstream;
    cudaEvent_t zmark, zdone;
    /* GEMM tuning (gemm_tuning.h, docs/cuda-backend.md): MGC_GEMM_TUNING's table, whose
     * candidate each GEMM uses (checked against this device at the first GEMM: tuning_ok);
     * or MGC_GEMM_TUNE's, filled as GEMMs are timed and written to tune_path each time */
    mgc_gemm_tuning *tuning, *tune;
    int tuning_checked, tuning_ok;
    int64_t tuning_absent, tuning_moved;
    char tune_path[1024], tuning_path[1024], device_name[128];
    long lt_version;
    const mgc_stage_program *warm; /* the stage program warmed up last (bind again: no-op) */
    graph_entry graphs[MAX_GRAPHS];
    int n_graphs;
    graph_entry *recording; /* the graph being captured on the stream, NULL when none */
    /* the step the dropout kernels read (host.step, cuda_int.h mgc_cuda_drop_step): 8 bytes
     * of device memory, and what they hold once the work queued so far has run */
    unsigned long long *step_dev;
    unsigned long long step_val;
    /* the transfer stream of the executor's gradient reducer (xfer_*), and its marks */
    cudaStream_t xstream;
    cudaEvent_t *marks;
    int n_marks, cap_marks;
    /* the pipeline-transfer stream (p2p_*), and its handles (made on the executor's thread) */
    cudaStream_t pstream;
    struct p2p_handle **p2p;
    int n_p2p, cap_p2p;
    /* --profile's op timers (time_mark): events with timing, made once and reused */
    cudaEvent_t *timers;
    int64_t n_timers;
} cuda_ctx;

/* A pipeline send's download: `mark` on the compute stream, `done` on the pipeline stream. */
typedef struct p2p_handle {
    cudaEvent_t mark, done;
} p2p_handle;

#define CUDA_TRY(be, expr, what)                                                                   \
    do {                                                                                           \
        cudaError_t e_ = (expr);                                                                   \
        if (e_ != cudaSuccess)                                                                     \
            return mgc_cuda_fail(be, "%s: %s (%s) [%s:%d]", what, cudaGetErrorString(e_),          \
                                 cudaGetErrorName(e_), __FILE__, __LINE__);                        \
    } while (0)

#define LT_TRY(be, expr, what)                                                                     \
    do {                                                                                           \
        cublasStatus_t s_ = (expr);                                                                \
        if (s_ != CUBLAS_STATUS_SUCCESS)                                                           \
            return mgc_cuda_fail(be, "%s: cuBLASLt status %d [%s:%d]", what, (int)s_, __FILE__,    \
                                 __LINE__);                                                        \
    } while (0)

static void graphs_drop(cuda_ctx *c) {
    for (int i = 0; i < c->n_graphs; i++)
        if (c->graphs[i].exec) cudaGraphExecDestroy(c->graphs[i].exec);
    c->n_graphs = 0;
}

static void *cuda_scratch(mgc_backend *be, size_t bytes) {
    cuda_ctx *c = be->context;
    if (bytes <= c->scratch_bytes) return c->scratch;
    if (c->recording) { /* no allocation while capturing: the program runs eagerly instead */
        mgc_cuda_fail(be, "kernel scratch grows during a CUDA graph capture");
        return NULL;
    }
    /* past the plan's kernel_scratch (codegen/kspec_scratch.c does not bound this request, or
     * the plan predates it): an allocation beside the arena, said once */
    if (!c->scratch_warned) {
        fprintf(stderr, "mgc-run: warning: a kernel asks for %zu bytes of scratch, more than the "
                        "plan's kernel_scratch (%zu bytes): allocating it beside the arena "
                        "(recompile the plan with this mgc; if it persists, report it)\n",
                bytes, c->scratch_bytes);
        c->scratch_warned = 1;
    }
    size_t n = bytes + bytes / 2 + 65536;
    cudaStreamSynchronize(c->stream); /* the old scratch may be in use by queued work */
    graphs_drop(c);                   /* recorded graphs hold the old address */
    if (c->scratch_owned) cudaFree(c->scratch);
    c->scratch = NULL;
    c->scratch_bytes = 0;
    c->scratch_owned = 0;
    cudaError_t e = cudaMalloc(&c->scratch, n);
    if (e != cudaSuccess) {
        mgc_cuda_fail(be, "cannot allocate %zu bytes of kernel scratch: %s", n, cudaGetErrorString(e));
        return NULL;
    }
    c->scratch_bytes = n;
    c->scratch_owned = 1;
    return c->scratch;
}

/* ---- kernels: from the plan, the disk cache, or NVRTC ------------------------------ */

static int load_cubin(mgc_backend *be, const char *name, const void *cubin, loaded_kernel *out) {
    cuda_ctx *c = be->context;
    if (c->n_libs == c->cap_libs) {
        int nc = c->cap_libs ? 2 * c->cap_libs : 64;
        cudaLibrary_t *p = realloc(c->libs, (size_t)nc * sizeof *p);
        if (!p) return mgc_cuda_fail(be, "out of memory");
        c->libs = p, c->cap_libs = nc;
    }
    cudaLibrary_t lib;
    CUDA_TRY(be, cudaLibraryLoadData(&lib, cubin, NULL, NULL, 0, NULL, NULL, 0), name);
    c->libs[c->n_libs++] = lib;
    CUDA_TRY(be, cudaLibraryGetKernel(&out->fn, lib, name), name);
    snprintf(out->name, sizeof out->name, "%s", name);
    out->smem_set = 48 * 1024;
    out->occ_blocks = -1;
    out->static_smem = -1;
    return 0;
}

/* The plan's cubin for this device: same major version, the highest minor not above ours. */
static const mgc_plan_kernel *plan_kernel(const cuda_ctx *c, const char *name) {
    const mgc_plan *p = c->plan;
    const mgc_plan_kernel *best = NULL;
    for (int64_t i = 0; p && i < p->n_kernels; i++) {
        const mgc_plan_kernel *k = &p->kernels[i];
        if ((int)k->arch / 10 != c->arch / 10 || (int)k->arch > c->arch) continue;
        if (strcmp(mgc_plan_strat(p, k->name), name)) continue;
        if (!best || k->arch > best->arch) best = k;
    }
    return best;
}

static loaded_kernel *find_kernel(mgc_backend *be, const mgc_kspec *k) {
    cuda_ctx *c = be->context;
    char name[MGC_KSPEC_NAME_MAX];
    mgc_kspec_name(k, name, sizeof name);
    for (int i = 0; i < c->n_kernels; i++)
        if (!strcmp(c->kernels[i].name, name)) return &c->kernels[i];
    if (c->n_kernels == c->cap_kernels) {
        int nc = c->cap_kernels ? 2 * c->cap_kernels : 64;
        loaded_kernel *p = realloc(c->kernels, (size_t)nc * sizeof *p);
        if (!p) {
            mgc_cuda_fail(be, "out of memory");
            return NULL;
        }
        c->kernels = p, c->cap_kernels = nc;
    }
    loaded_kernel *out = &c->kernels[c->n_kernels];
    const mgc_plan_kernel *pk = plan_kernel(c, name);
    if (pk) {
        if (load_cubin(be, name, c->plan->kbin + pk->offset, out)) return NULL;
        c->n_kernels++;
        return out;
    }
    /* JIT: the plan has no cubin for this GPU (the on-disk cache keeps it for the next run) */
    char *src = mgc_kspec_source(k);
    if (!src) {
        mgc_cuda_fail(be, "%s: no source (unknown template kernels/%s)", name, k->file);
        return NULL;
    }
    mgc_nvrtc_result r;
    char err[4096];
    int cached = 0;
    if (mgc_nvrtc_compile_cached(src, name, c->arch, &r, &cached, err, sizeof err)) {
        free(src);
        mgc_cuda_fail(be, "the plan has no kernel %s for sm_%d and JIT compilation failed: %s", name,
                      c->arch, err);
        return NULL;
    }
    free(src);
    if (cached) c->jit_cached++;
    else c->jit_compiled++;
    char *cubin = r.cubin;
    int rc = load_cubin(be, name, cubin, out);
    free(cubin);
    if (rc) return NULL;
    c->n_kernels++;
    return out;
}

/* more than the default 48 KB of dynamic shared memory (embedding_sort_block's 64 KB at 8,192
 * rows): allowed once, at bind's warm-up (dry) where the launch is planned, before any run (a
 * program's first run, eager, would do too: no capture makes the call) */
static int allow_smem(mgc_backend *be, loaded_kernel *lk, size_t smem) {
    cuda_ctx *c = be->context;
    if (smem > lk->smem_set) {
        CUDA_TRY(be,
                 cudaKernelSetAttributeForDevice(lk->fn, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                 (int)smem, c->device),
                 lk->name);
        lk->smem_set = smem;
    }
    return 0;
}

/* The occupancy of lk at `block` threads and `smem` bytes of dynamic shared memory, cached:
 * the occupancy calculator's (a cudaKernel_t passed as the function, as its documentation
 * allows).  Under MGC_CUDA_SMEM_PER_SM (c->smem_limit) no more blocks than that much shared
 * memory holds, and lk->occ_pad the dynamic shared memory a launch then asks for so that the
 * device runs no more than those: smem, or more where the real multiprocessor would hold more
 * (the kernels ignore what they do not use), so that an H100 runs a kernel at the occupancy
 * of a GPU with 100 KB.  -1 with be->err. */
static int occupancy(mgc_backend *be, loaded_kernel *lk, unsigned block, size_t smem) {
    cuda_ctx *c = be->context;
    if (lk->occ_blocks >= 0 && lk->occ_block == block && lk->occ_smem == smem)
        return lk->occ_blocks;
    if (allow_smem(be, lk, smem)) return -1;
    int n = 0;
    CUDA_TRY(be,
             cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, (const void *)lk->fn, (int)block,
                                                           smem),
             lk->name);
    size_t pad = smem;
    if (c->smem_limit) {
        if (lk->static_smem < 0) {
            struct cudaFuncAttributes fa;
            CUDA_TRY(be, cudaFuncGetAttributes(&fa, (const void *)lk->fn), lk->name);
            lk->static_smem = (int)fa.sharedSizeBytes;
        }
        size_t per = (size_t)lk->static_smem + smem + c->smem_reserved;
        int lim = (int)(c->smem_limit / per);
        if (lim < 1) lim = 1; /* a block the device takes runs */
        if (n > lim) {
            /* the smallest dynamic shared memory at which the real multiprocessor holds lim */
            size_t want = c->smem_sm / (size_t)(lim + 1) + 1;
            pad = want > (size_t)lk->static_smem + c->smem_reserved
                      ? want - (size_t)lk->static_smem - c->smem_reserved
                      : smem;
            if (pad < smem) pad = smem;
            if (allow_smem(be, lk, pad)) return -1;
            CUDA_TRY(be,
                     cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, (const void *)lk->fn,
                                                                   (int)block, pad),
                     lk->name);
        }
    }
    lk->occ_block = block, lk->occ_smem = smem, lk->occ_blocks = n, lk->occ_pad = pad;
    return n;
}

/* mgc_cuda_host.blocks_per_sm */
static int cuda_blocks_per_sm(mgc_backend *be, const mgc_kspec *k, unsigned block, size_t smem) {
    loaded_kernel *lk = find_kernel(be, k);
    return lk ? occupancy(be, lk, block, smem) : -1;
}

static int cuda_launch(mgc_backend *be, const mgc_kspec *k, unsigned gx, unsigned gy, unsigned gz,
                       unsigned block, size_t smem, void **args) {
    cuda_ctx *c = be->context;
    loaded_kernel *lk = find_kernel(be, k);
    if (!lk || allow_smem(be, lk, smem)) return -1;
    if (c->smem_limit) { /* MGC_CUDA_SMEM_PER_SM: padded to the smaller device's occupancy */
        if (occupancy(be, lk, block, smem) < 0) return -1;
        smem = lk->occ_pad;
    }
    if (c->dry) return 0;
    if (gx == 0 || gy == 0 || gz == 0) return 0; /* nothing to do */
    dim3 g = {gx, gy, gz}, b = {block, 1, 1};
    if (c->pdl) { /* programmatic dependent launch: the kernel waits in mgc_pdl_begin */
        cudaLaunchAttribute at;
        memset(&at, 0, sizeof at);
        at.id = cudaLaunchAttributeProgrammaticStreamSerialization;
        at.val.programmaticStreamSerializationAllowed = 1;
        cudaLaunchConfig_t cfg;
        memset(&cfg, 0, sizeof cfg);
        cfg.gridDim = g, cfg.blockDim = b, cfg.dynamicSmemBytes = smem, cfg.stream = c->stream;
        cfg.attrs = &at, cfg.numAttrs = 1;
        CUDA_TRY(be, cudaLaunchKernelExC(&cfg, (const void *)lk->fn, args), lk->name);
        return 0;
    }
    CUDA_TRY(be, cudaLaunchKernel((const void *)lk->fn, g, b, args, smem, c->stream), lk->name);
    return 0;
}

/* ---- GEMMs (cuBLASLt) -------------------------------------------------------------- */

static cudaDataType_t dt_of(uint16_t d) {
    return d == MGC_DT_BF16 ? CUDA_R_16BF : d == MGC_DT_F16 ? CUDA_R_16F : CUDA_R_32F;
}

static void gemm_entry_free(gemm_entry *e) {
    if (e->op) cublasLtMatmulDescDestroy(e->op);
    if (e->a) cublasLtMatrixLayoutDestroy(e->a);
    if (e->b) cublasLtMatrixLayoutDestroy(e->b);
    if (e->c) cublasLtMatrixLayoutDestroy(e->c);
    memset(e, 0, sizeof *e);
}

/* The descriptors of key k and cuBLASLt's first algorithm for them (e->ok = 0 when it has
 * none).  0, or -1 with be->err. */
static int gemm_entry_make(mgc_backend *be, gemm_entry *e, const gemm_key *k) {
    cuda_ctx *c = be->context;
    int ta = k->ta, tb = k->tb, atype = k->atype, btype = k->btype, ctype = k->ctype;
    int64_t m = k->m, n = k->n, kk = k->k, lda = k->lda, ldb = k->ldb, ldc = k->ldc;
    LT_TRY(be, cublasLtMatmulDescCreate(&e->op, CUBLAS_COMPUTE_32F, CUDA_R_32F), "matmul desc");
    cublasOperation_t oa = ta ? CUBLAS_OP_T : CUBLAS_OP_N, ob = tb ? CUBLAS_OP_T : CUBLAS_OP_N;
    LT_TRY(be, cublasLtMatmulDescSetAttribute(e->op, CUBLASLT_MATMUL_DESC_TRANSA, &oa, sizeof oa),
           "transa");
    LT_TRY(be, cublasLtMatmulDescSetAttribute(e->op, CUBLASLT_MATMUL_DESC_TRANSB, &ob, sizeof ob),
           "transb");
    cublasLtEpilogue_t epi = (cublasLtEpilogue_t)k->epilogue;
    LT_TRY(be, cublasLtMatmulDescSetAttribute(e->op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi),
           "epilogue");
    if (k->has_bias) {
        cudaDataType_t bt = (cudaDataType_t)k->biastype;
        LT_TRY(be,
               cublasLtMatmulDescSetAttribute(e->op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bt,
                                              sizeof bt),
               "bias type");
    }
    if (k->has_aux) {
        int64_t ld = k->aux_ld;
        int32_t at = k->auxtype;
        LT_TRY(be,
               cublasLtMatmulDescSetAttribute(e->op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &ld,
                                              sizeof ld),
               "aux ld");
        LT_TRY(be,
               cublasLtMatmulDescSetAttribute(e->op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_DATA_TYPE,
                                              &at, sizeof at),
               "aux type");
    }
    LT_TRY(be,
           cublasLtMatrixLayoutCreate(&e->a, (cudaDataType_t)atype, ta ? (uint64_t)kk : (uint64_t)m,
                                      ta ? (uint64_t)m : (uint64_t)kk, lda),
           "layout A");
    LT_TRY(be,
           cublasLtMatrixLayoutCreate(&e->b, (cudaDataType_t)btype, tb ? (uint64_t)n : (uint64_t)kk,
                                      tb ? (uint64_t)kk : (uint64_t)n, ldb),
           "layout B");
    LT_TRY(be, cublasLtMatrixLayoutCreate(&e->c, (cudaDataType_t)ctype, (uint64_t)m, (uint64_t)n, ldc),
           "layout C");
    cublasLtMatmulPreference_t pref;
    LT_TRY(be, cublasLtMatmulPreferenceCreate(&pref), "preference");
    uint64_t wsb = c->ws_bytes;
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &wsb,
                                         sizeof wsb);
    /* deterministic: no reductions through atomics */
    uint32_t mask = CUBLASLT_REDUCTION_SCHEME_NONE | CUBLASLT_REDUCTION_SCHEME_OUTPUT_TYPE |
                    CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE;
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, &mask,
                                         sizeof mask);
    cublasLtMatmulHeuristicResult_t res[MGC_GEMM_TUNING_MAX_CAND];
    int found = 0, want = c->tune || c->tuning ? MGC_GEMM_TUNING_MAX_CAND : 1;
    cublasStatus_t hs = cublasLtMatmulAlgoGetHeuristic(c->lt, e->op, e->a, e->b, e->c, e->c, pref,
                                                       want, res, &found);
    cublasLtMatmulPreferenceDestroy(pref);
    e->ok = hs == CUBLAS_STATUS_SUCCESS && found > 0;
    if (!e->ok) return 0;
    e->algo = res[0].algo; /* cuBLASLt's first choice */
    e->n_cand = found < MGC_GEMM_TUNING_MAX_CAND ? found : MGC_GEMM_TUNING_MAX_CAND;
    for (int i = 0; i < e->n_cand; i++)
        e->cand[i] = res[i].algo;
    if (c->tuning && !c->tuning_checked) { /* the workspace is known from the first GEMM on */
        char why[512];
        c->tuning_checked = 1;
        c->tuning_ok = mgc_gemm_tuning_matches(c->tuning, c->device_name, c->lt_version,
                                               c->ws_bytes, why, sizeof why);
        if (!c->tuning_ok)
            fprintf(stderr, "mgc-run: warning: MGC_GEMM_TUNING=%s is not for this run (%s): GEMMs "
                            "use cuBLASLt's first choice (hint: MGC_GEMM_TUNE=FILE makes one "
                            "here)\n", c->tuning_path, why);
    }
    e->planned = c->dry;
    if (c->tuning && c->tuning_ok && e->planned) {
        const mgc_gemm_tuned *t = mgc_gemm_tuning_find(c->tuning, k);
        if (!t || t->n != found)
            c->tuning_absent++; /* not in the file, or cuBLASLt offers another list */
        else
            e->algo = e->cand[t->pick], c->tuning_moved += t->pick != 0;
    }
    return 0;
}

static size_t dt_bytes(int cuda_type) {
    return cuda_type == CUDA_R_32F ? 4 : 2;
}

/* MGC_GEMM_TUNE: times each of e's candidates on this call's operands (a run's first, eager
 * call of the key), picks one (mgc_gemm_tuning_choose) and rewrites the tuning file.  The
 * timed runs write D (and aux, which DGELU reads); both are saved first and restored after,
 * so the call that follows computes what it would have.  0, or -1 with be->err. */
static int gemm_tune(mgc_backend *be, gemm_entry *e, const void *A, const void *B, void *D,
                     float beta, const mgc_gemm_epi *ep) {
    cuda_ctx *c = be->context;
    const gemm_key *k = &e->key;
    e->tuned = 1;
    float us[MGC_GEMM_TUNING_MAX_CAND];
    int n = e->n_cand;
    /* column-major m x n at a leading dimension: the last column ends m elements in (a view
     * at a row pitch, such as the logits', may end its tensor there) */
    size_t dbytes = ((size_t)(k->n - 1) * (size_t)k->ldc + (size_t)k->m) * dt_bytes(k->ctype);
    size_t abytes =
        ep->aux ? ((size_t)(k->n - 1) * (size_t)k->aux_ld + (size_t)k->m) * dt_bytes(k->auxtype) : 0;
    void *sd = NULL, *sa = NULL;
    if (cudaMalloc(&sd, dbytes) != cudaSuccess || (abytes && cudaMalloc(&sa, abytes) != cudaSuccess)) {
        cudaGetLastError();
        cudaFree(sd);
        fprintf(stderr, "mgc-run: warning: MGC_GEMM_TUNE: no memory to save a %" PRId64 "x%" PRId64
                        "x%" PRId64 " GEMM's output: cuBLASLt's first choice, untimed\n",
                k->m, k->n, k->k);
        return 0;
    }
    CUDA_TRY(be, cudaMemcpyAsync(sd, D, dbytes, cudaMemcpyDeviceToDevice, c->stream), "MGC_GEMM_TUNE");
    if (sa) CUDA_TRY(be, cudaMemcpyAsync(sa, ep->aux, abytes, cudaMemcpyDeviceToDevice, c->stream), "MGC_GEMM_TUNE");
    cudaEvent_t t0, t1;
    CUDA_TRY(be, cudaEventCreate(&t0), "MGC_GEMM_TUNE");
    CUDA_TRY(be, cudaEventCreate(&t1), "MGC_GEMM_TUNE");
    const float alpha = 1.0f;
    enum { REPS = 5 };
    for (int i = 0; i < n; i++) {
        us[i] = -1.0f;
        cublasStatus_t ms = cublasLtMatmul(c->lt, e->op, &alpha, A, e->a, B, e->b, &beta, D, e->c, D,
                                           e->c, &e->cand[i], c->ws, c->ws_bytes, c->stream);
        if (ms != CUBLAS_STATUS_SUCCESS) continue; /* this candidate refuses the call */
        cudaEventRecord(t0, c->stream);
        for (int r = 0; r < REPS && ms == CUBLAS_STATUS_SUCCESS; r++)
            ms = cublasLtMatmul(c->lt, e->op, &alpha, A, e->a, B, e->b, &beta, D, e->c, D, e->c,
                                &e->cand[i], c->ws, c->ws_bytes, c->stream);
        cudaEventRecord(t1, c->stream);
        float ms_t = 0;
        if (cudaEventSynchronize(t1) == cudaSuccess && ms == CUBLAS_STATUS_SUCCESS &&
            cudaEventElapsedTime(&ms_t, t0, t1) == cudaSuccess)
            us[i] = ms_t * 1000.0f / REPS;
    }
    cudaEventDestroy(t0);
    cudaEventDestroy(t1);
    CUDA_TRY(be, cudaGetLastError(), "MGC_GEMM_TUNE: timing cuBLASLt's candidates");
    CUDA_TRY(be, cudaMemcpyAsync(D, sd, dbytes, cudaMemcpyDeviceToDevice, c->stream), "MGC_GEMM_TUNE");
    if (sa) CUDA_TRY(be, cudaMemcpyAsync((void *)ep->aux, sa, abytes, cudaMemcpyDeviceToDevice, c->stream), "MGC_GEMM_TUNE");
    CUDA_TRY(be, cudaStreamSynchronize(c->stream), "MGC_GEMM_TUNE");
    cudaFree(sd);
    cudaFree(sa);
    int pick = mgc_gemm_tuning_choose(us, n);
    e->algo = e->cand[pick];
    c->tuning_moved += pick != 0;
    char err[1200];
    if (!c->tune->n) c->tune->workspace = c->ws_bytes;
    if (mgc_gemm_tuning_put(c->tune, k, pick, n, us) ||
        mgc_gemm_tuning_save(c->tune, c->tune_path, err, sizeof err))
        return mgc_cuda_fail(be, "MGC_GEMM_TUNE: %s", c->tune->n ? err : "out of memory");
    return 0;
}

static int lt_epilogue(int kind) {
    switch ((mgc_gemm_epi_kind)kind) {
    case MGC_GEMM_EPI_BIAS: return CUBLASLT_EPILOGUE_BIAS;
    case MGC_GEMM_EPI_GELU_AUX: return CUBLASLT_EPILOGUE_GELU_AUX;
    case MGC_GEMM_EPI_GELU_AUX_BIAS: return CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
    case MGC_GEMM_EPI_DGELU: return CUBLASLT_EPILOGUE_DGELU;
    case MGC_GEMM_EPI_BGRADB: return CUBLASLT_EPILOGUE_BGRADB;
    case MGC_GEMM_EPI_DGELU_BGRAD: return CUBLASLT_EPILOGUE_DGELU_BGRAD;
    default: return CUBLASLT_EPILOGUE_DEFAULT;
    }
}

/* a cuBLASLt epilogue beyond the bias: the caller has unfused kernels for it */
static int fused_epilogue(int kind) {
    return kind != CUBLASLT_EPILOGUE_DEFAULT && kind != CUBLASLT_EPILOGUE_BIAS;
}

/* host.gemm (cuda_int.h): cuBLASLt.  The descriptors and the algorithm are made once per key
 * (bind's warm-up makes them for every GEMM of the plan) and cached. */
static int gemm(mgc_backend *be, int ta, int tb, int64_t m, int64_t n, int64_t k, const void *A,
                int64_t lda, int atype, const void *B, int64_t ldb, int btype, void *D,
                int64_t ldc, int ctype, float beta, const mgc_gemm_epi *ep) {
    cuda_ctx *c = be->context;
    mgc_gemm_epi none = {MGC_GEMM_EPI_NONE, NULL, 0, NULL, 0, 0};
    if (!ep) ep = &none;
    atype = dt_of((uint16_t)atype), btype = dt_of((uint16_t)btype), ctype = dt_of((uint16_t)ctype);
    if (m == 0 || n == 0) return 0;
    gemm_key key;
    memset(&key, 0, sizeof key);
    key.ta = ta, key.tb = tb, key.m = m, key.n = n, key.k = k, key.lda = lda, key.ldb = ldb;
    key.ldc = ldc, key.atype = atype, key.btype = btype, key.ctype = ctype;
    key.epilogue = lt_epilogue(ep->kind);
    key.has_bias = ep->bias != NULL;
    key.biastype = ep->bias ? dt_of((uint16_t)ep->bias_type) : 0;
    key.has_aux = ep->aux != NULL;
    key.aux_ld = ep->aux ? ep->aux_ld : 0;
    key.auxtype = ep->aux ? dt_of((uint16_t)ep->aux_type) : 0;
    key.beta1 = beta != 0.0f || ep->as_beta1;
    gemm_entry *e = NULL;
    for (int i = 0; i < c->n_gemm; i++)
        if (!memcmp(&c->gemm[i].key, &key, sizeof key)) e = &c->gemm[i];
    if (!e) {
        if (c->n_gemm == MAX_GEMM_CACHE) { /* evict the oldest: shapes are few in practice */
            gemm_entry_free(&c->gemm[0]);
            memmove(c->gemm, c->gemm + 1, (MAX_GEMM_CACHE - 1) * sizeof *c->gemm);
            c->n_gemm--;
        }
        e = &c->gemm[c->n_gemm++];
        memset(e, 0, sizeof *e);
        e->key = key;
        if (gemm_entry_make(be, e, &key)) {
            e->ok = 0;
            if (!fused_epilogue(key.epilogue)) return -1;
        }
    }
    if (!e->ok) {
        if (fused_epilogue(key.epilogue)) return 1;
        return mgc_cuda_fail(be,
                             "cuBLASLt has no algorithm for a %" PRId64 "x%" PRId64 "x%" PRId64
                             " GEMM (types %d/%d/%d%s)",
                             m, n, k, atype, btype, ctype, ep->bias ? ", bias epilogue" : "");
    }
    if (c->dry) return 0;
    if (ep->bias)
        LT_TRY(be,
               cublasLtMatmulDescSetAttribute(e->op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &ep->bias,
                                              sizeof ep->bias),
               "bias pointer");
    if (ep->aux)
        LT_TRY(be,
               cublasLtMatmulDescSetAttribute(e->op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &ep->aux,
                                              sizeof ep->aux),
               "aux pointer");
    if (c->tune && !e->tuned && e->planned && !c->recording && gemm_tune(be, e, A, B, D, beta, ep))
        return -1;
    float alpha = 1.0f;
    cublasStatus_t ms = cublasLtMatmul(c->lt, e->op, &alpha, A, e->a, B, e->b, &beta, D, e->c, D,
                                       e->c, &e->algo, c->ws, c->ws_bytes, c->stream);
    if (ms != CUBLAS_STATUS_SUCCESS && fused_epilogue(key.epilogue) &&
        (ms == CUBLAS_STATUS_NOT_SUPPORTED || ms == CUBLAS_STATUS_INVALID_VALUE)) {
        e->ok = 0; /* refused at the call, not by the heuristic: unfused from now on */
        return 1;
    }
    LT_TRY(be, ms, "cublasLtMatmul");
    return 0;
}

static int cuda_run_op(mgc_backend *be, const mgc_op_call *c) {
    int r = mgc_cuda_run_op(be, c);
    if (r) return r;
    if (getenv("MGC_CUDA_SYNC_CHECK")) { /* debugging: find the op that faults */
        cuda_ctx *cx = be->context;
        cudaError_t e = cudaStreamSynchronize(cx->stream);
        if (e != cudaSuccess)
            return mgc_cuda_fail(be, "after op %s '%s': %s", mgc_plan_op_name((mgc_plan_op_kind)c->op->kind),
                                 mgc_plan_strat(c->plan, c->op->name), cudaGetErrorString(e));
    }
    return 0;
}

/* ---- memory and the rest of the interface -------------------------------------------- */

static int cuda_arena_alloc(mgc_backend *be, uint64_t bytes, void **out) {
    cuda_ctx *c = be->context;
    size_t fr = 0, tot = 0;
    cudaMemGetInfo(&fr, &tot);
    cudaError_t e = cudaMalloc(out, bytes ? (size_t)bytes : 256);
    if (e != cudaSuccess)
        return mgc_cuda_fail(be,
                             "cannot allocate the %" PRIu64 "-byte arena on GPU %d (%zu bytes free of "
                             "%zu): %s: use more pipeline/tensor parallelism, recompute, or a "
                             "smaller micro batch",
                             bytes, c->device, fr, tot, cudaGetErrorString(e));
    CUDA_TRY(be, cudaMemsetAsync(*out, 0, bytes ? (size_t)bytes : 256, c->stream), "zeroing the arena");
    return 0;
}

static void cuda_arena_free(mgc_backend *be, void *arena) {
    cuda_ctx *c = be->context;
    cudaStreamSynchronize(c->stream);
    graphs_drop(c); /* they hold addresses in the arena */
    if (!c->scratch_owned && c->scratch_arena == arena && arena) {
        c->scratch = NULL, c->scratch_bytes = 0, c->scratch_arena = NULL;
    }
    cudaFree(arena);
}

/* Page-locked host memory for the executor's communication staging (backend.h). */
static int cuda_host_alloc(mgc_backend *be, size_t bytes, void **out) {
    cuda_ctx *c = be->context;
    cudaError_t e = cudaHostAlloc(out, bytes ? bytes : 256, cudaHostAllocPortable);
    if (e != cudaSuccess)
        return mgc_cuda_fail(be, "cannot allocate %zu bytes of page-locked host memory for GPU %d's "
                                 "communication: %s",
                             bytes, c->device, cudaGetErrorString(e));
    return 0;
}

static void cuda_host_free(mgc_backend *be, void *p) {
    (void)be;
    cudaFreeHost(p);
}

/* The gradient reducer's transfers (backend.h xfer_*): a mark is an event recorded on the
 * compute stream; the reducer thread's copies run on the transfer stream behind it, so the
 * compute queued after the mark goes on beside them. */
static int cuda_xfer_mark(mgc_backend *be, void **mark) {
    cuda_ctx *c = be->context;
    if (!*mark) {
        if (c->n_marks == c->cap_marks) {
            int n = c->cap_marks ? 2 * c->cap_marks : 16;
            cudaEvent_t *m = realloc(c->marks, (size_t)n * sizeof *m);
            if (!m) return mgc_cuda_fail(be, "out of memory for transfer marks");
            c->marks = m, c->cap_marks = n;
        }
        CUDA_TRY(be, cudaEventCreateWithFlags(&c->marks[c->n_marks], cudaEventDisableTiming),
                 "creating a transfer mark");
        *mark = c->marks[c->n_marks++];
    }
    CUDA_TRY(be, cudaEventRecord((cudaEvent_t)*mark, c->stream), "recording a transfer mark");
    return 0;
}

/* --profile's op timers (backend.h time_mark, time_between): timer i is an event recorded on
 * the compute stream, so the time between two is the device's, whatever the host did. */
static int cuda_time_mark(mgc_backend *be, int64_t i) {
    cuda_ctx *c = be->context;
    if (i < 0 || i >= (1 << 20)) return mgc_cuda_fail(be, "op timer %lld out of range", (long long)i);
    if (i >= c->n_timers) {
        int64_t n = c->n_timers ? c->n_timers : 256;
        while (n <= i)
            n *= 2;
        cudaEvent_t *t = realloc(c->timers, (size_t)n * sizeof *t);
        if (!t) return mgc_cuda_fail(be, "out of memory for op timers");
        c->timers = t;
        for (; c->n_timers < n; c->n_timers++)
            CUDA_TRY(be, cudaEventCreate(&c->timers[c->n_timers]), "creating an op timer");
    }
    CUDA_TRY(be, cudaEventRecord(c->timers[i], c->stream), "recording an op timer");
    return 0;
}

static int cuda_time_between(mgc_backend *be, int64_t a, int64_t b, double *seconds) {
    cuda_ctx *c = be->context;
    if (a < 0 || b < 0 || a >= c->n_timers || b >= c->n_timers)
        return mgc_cuda_fail(be, "op timers %lld and %lld were never recorded", (long long)a, (long long)b);
    float ms = 0;
    CUDA_TRY(be, cudaEventElapsedTime(&ms, c->timers[a], c->timers[b]), "reading an op timer");
    *seconds = ms * 1e-3;
    return 0;
}

static int xfer_fail(char *err, size_t errsz, const char *what, cudaError_t e, int device) {
    snprintf(err, errsz, "GPU %d: %s: %s", device, what, cudaGetErrorString(e));
    return -1;
}

static int cuda_xfer_download(mgc_backend *be, void *mark, void *host, const void *src, size_t n,
                              char *err, size_t errsz) {
    cuda_ctx *c = be->context;
    cudaError_t e;
    if ((e = cudaSetDevice(c->device)) != cudaSuccess || /* the reducer's own thread */
        (e = cudaStreamWaitEvent(c->xstream, (cudaEvent_t)mark, 0)) != cudaSuccess ||
        (e = cudaMemcpyAsync(host, src, n, cudaMemcpyDeviceToHost, c->xstream)) != cudaSuccess ||
        (e = cudaStreamSynchronize(c->xstream)) != cudaSuccess)
        return xfer_fail(err, errsz, "downloading a gradient bucket", e, c->device);
    return 0;
}

static int cuda_xfer_upload(mgc_backend *be, void *dst, const void *host, size_t n, char *err,
                            size_t errsz) {
    cuda_ctx *c = be->context;
    cudaError_t e;
    if ((e = cudaSetDevice(c->device)) != cudaSuccess ||
        (e = cudaMemcpyAsync(dst, host, n, cudaMemcpyHostToDevice, c->xstream)) != cudaSuccess ||
        (e = cudaStreamSynchronize(c->xstream)) != cudaSuccess)
        return xfer_fail(err, errsz, "uploading a reduced gradient bucket", e, c->device);
    return 0;
}

/* Pipeline sends (backend.h p2p_*): the download waits on the pipeline stream for a mark of
 * the compute issued so far; the compute stream waits for `done` only where the executor
 * fences, before the first compute that may overwrite the send's buffer. */
static int cuda_p2p_download(mgc_backend *be, void *host, const void *src, size_t n, void **done,
                             char *err, size_t errsz) {
    cuda_ctx *c = be->context;
    cudaError_t e = cudaSuccess;
    p2p_handle *h = *done;
    if (!h) {
        if (c->n_p2p == c->cap_p2p) {
            int m = c->cap_p2p ? 2 * c->cap_p2p : 16;
            p2p_handle **a = realloc(c->p2p, (size_t)m * sizeof *a);
            if (!a) return snprintf(err, errsz, "out of memory for pipeline-send handles"), -1;
            c->p2p = a, c->cap_p2p = m;
        }
        if (!(h = calloc(1, sizeof *h)))
            return snprintf(err, errsz, "out of memory for a pipeline-send handle"), -1;
        if ((e = cudaEventCreateWithFlags(&h->mark, cudaEventDisableTiming)) != cudaSuccess ||
            (e = cudaEventCreateWithFlags(&h->done, cudaEventDisableTiming)) != cudaSuccess) {
            if (h->mark) cudaEventDestroy(h->mark);
            free(h);
            return xfer_fail(err, errsz, "creating a pipeline-send event", e, c->device);
        }
        c->p2p[c->n_p2p++] = h;
        *done = h;
    }
    if ((e = cudaEventRecord(h->mark, c->stream)) != cudaSuccess ||
        (e = cudaStreamWaitEvent(c->pstream, h->mark, 0)) != cudaSuccess ||
        (e = cudaMemcpyAsync(host, src, n, cudaMemcpyDeviceToHost, c->pstream)) != cudaSuccess ||
        (e = cudaEventRecord(h->done, c->pstream)) != cudaSuccess)
        return xfer_fail(err, errsz, "queueing a pipeline send's download", e, c->device);
    return 0;
}

static int cuda_p2p_wait(mgc_backend *be, void *done, char *err, size_t errsz) {
    cuda_ctx *c = be->context;
    cudaError_t e;
    if ((e = cudaSetDevice(c->device)) != cudaSuccess || /* the sender's own thread */
        (e = cudaEventSynchronize(((p2p_handle *)done)->done)) != cudaSuccess)
        return xfer_fail(err, errsz, "downloading a pipeline send", e, c->device);
    return 0;
}

static int cuda_p2p_fence(mgc_backend *be, void *done, char *err, size_t errsz) {
    cuda_ctx *c = be->context;
    cudaError_t e = cudaStreamWaitEvent(c->stream, ((p2p_handle *)done)->done, 0);
    if (e != cudaSuccess)
        return xfer_fail(err, errsz, "ordering the compute after a pipeline send", e, c->device);
    return 0;
}

static int is_linear(uint16_t kind) {
    return kind == MGC_POP_LINEAR || kind == MGC_POP_LINEAR_GELU || kind == MGC_POP_LINEAR_DGRAD ||
           kind == MGC_POP_LINEAR_DGRAD_GELU || kind == MGC_POP_LINEAR_WGRAD;
}

/* Before the first step: every kernel the stage's ops and the optimizer launch is loaded
 * (or JIT-compiled), and every GEMM of the stage has its descriptors and algorithm, so a
 * missing kernel or an unsupported GEMM fails here, not mid-step.  The ops run `dry`:
 * launchers and GEMMs stop before queueing work.  (Grouped GEMMs size their calls by the
 * routed counts: theirs are made at first use.) */
static int warm_up(mgc_backend *be, const mgc_stage_program *st, void *arena) {
    cuda_ctx *c = be->context;
    mgc_kspec ks[MGC_KSPEC_MAX_PER_OP > 16 ? MGC_KSPEC_MAX_PER_OP : 16];
    char err[256];
    int rc = 0;
    c->dry = 1;
    int64_t eval = 0; /* evaluations run the ops with dropout 0: their kernels too */
    mgc_plan_config_int(c->plan, "training.eval_interval", &eval);
    for (int64_t k = 0; k < st->n_chunks && !rc; k++) {
        const mgc_plan_chunk *ch = &st->chunks[k];
        for (int64_t i = 0; i < ch->n_fwd + ch->n_bwd && !rc; i++) {
            const mgc_plan_op *op = i < ch->n_fwd ? &ch->fwd[i] : &ch->bwd[i - ch->n_fwd];
            int n = mgc_kspecs_for_op(c->plan, ch, op, ks, MGC_KSPEC_MAX_PER_OP, err, sizeof err);
            if (n < 0) {
                rc = mgc_cuda_fail(be, "%s", err);
                break;
            }
            for (int j = 0; j < n && !rc; j++)
                if (!find_kernel(be, &ks[j])) rc = -1;
            mgc_plan_op ev = *op;
            int da = mgc_plan_op_dropout_attr(&ev);
            if (!rc && eval > 0 && da >= 0 && ev.fattr[da] > 0) {
                ev.fattr[da] = 0;
                n = mgc_kspecs_for_op(c->plan, ch, &ev, ks, MGC_KSPEC_MAX_PER_OP, err, sizeof err);
                for (int j = 0; j < n && !rc; j++)
                    if (!find_kernel(be, &ks[j])) rc = -1;
            }
            if (rc || !is_linear(op->kind)) continue;
            mgc_op_call call;
            memset(&call, 0, sizeof call);
            call.plan = c->plan, call.chunk = ch, call.op = op;
            for (int j = 0; j < MGC_PLAN_MAX_IO; j++) call.in[j] = call.out[j] = arena;
            rc = mgc_cuda_ops_linear(be, &call);
        }
    }
    int n = rc ? 0 : mgc_kspecs_for_plan(c->plan, ks, (int)(sizeof ks / sizeof ks[0]));
    for (int j = 0; j < n && !rc; j++)
        if (!find_kernel(be, &ks[j])) rc = -1;
    c->dry = 0;
    return rc;
}

static int cuda_bind(mgc_backend *be, const mgc_plan *plan, const mgc_stage_program *st, void *arena) {
    cuda_ctx *c = be->context;
    c->plan = plan;
    c->ws = NULL;
    c->ws_bytes = 0;
    void *ks = NULL;
    size_t ks_bytes = 0;
    for (int64_t b = 0; b < st->n_buffers; b++) {
        if (st->buffers[b].kind != MGC_BUF_WORKSPACE) continue;
        if (!strcmp(mgc_plan_strat(plan, st->buffers[b].name), "kernel_scratch")) {
            ks = (char *)arena + st->buffers[b].offset;
            ks_bytes = (size_t)st->buffers[b].bytes;
        } else if (!c->ws) { /* gemm_workspace */
            c->ws = (char *)arena + st->buffers[b].offset;
            c->ws_bytes = (size_t)st->buffers[b].bytes;
        }
    }
    if (ks && ks != c->scratch) { /* the plan's, in the arena */
        cudaStreamSynchronize(c->stream); /* queued work may still use the old one */
        graphs_drop(c);
        if (c->scratch_owned) cudaFree(c->scratch);
        c->scratch = ks, c->scratch_bytes = ks_bytes, c->scratch_owned = 0;
        c->scratch_arena = arena;
    }
    if (c->warm == st) return 0;
    if (warm_up(be, st, arena)) return -1;
    c->warm = st;
    return 0;
}

static int cuda_copy(mgc_backend *be, void *dst, const void *src, size_t n) {
    cuda_ctx *c = be->context;
    if (n && dst != src)
        CUDA_TRY(be, cudaMemcpyAsync(dst, src, n, cudaMemcpyDeviceToDevice, c->stream), "device copy");
    return 0;
}

static int cuda_upload(mgc_backend *be, void *dst, const void *host, size_t n) {
    cuda_ctx *c = be->context;
    if (!n) return 0;
    CUDA_TRY(be, cudaMemcpyAsync(dst, host, n, cudaMemcpyHostToDevice, c->stream), "upload");
    CUDA_TRY(be, cudaStreamSynchronize(c->stream), "upload"); /* the host buffer may be reused */
    return 0;
}

static int cuda_download(mgc_backend *be, void *host, const void *src, size_t n) {
    cuda_ctx *c = be->context;
    if (!n) return 0;
    CUDA_TRY(be, cudaMemcpyAsync(host, src, n, cudaMemcpyDeviceToHost, c->stream), "download");
    CUDA_TRY(be, cudaStreamSynchronize(c->stream), "download");
    return 0;
}

static int cuda_zero(mgc_backend *be, void *dst, size_t n) {
    cuda_ctx *c = be->context;
    if (n) CUDA_TRY(be, cudaMemsetAsync(dst, 0, n, c->stream), "memset");
    return 0;
}

/* backend.h zero_beside / zero_fence */
static int cuda_zero_beside(mgc_backend *be, void *dst, size_t n) {
    cuda_ctx *c = be->context;
    if (!c->zero_beside) return cuda_zero(be, dst, n) ? -1 : 1;
    CUDA_TRY(be, cudaEventRecord(c->zmark, c->stream), "zeroing the gradients beside the forward");
    CUDA_TRY(be, cudaStreamWaitEvent(c->zstream, c->zmark, 0), "zeroing the gradients beside the forward");
    if (n) CUDA_TRY(be, cudaMemsetAsync(dst, 0, n, c->zstream), "zeroing the gradients beside the forward");
    CUDA_TRY(be, cudaEventRecord(c->zdone, c->zstream), "zeroing the gradients beside the forward");
    return 0;
}

static int cuda_zero_fence(mgc_backend *be) {
    cuda_ctx *c = be->context;
    CUDA_TRY(be, cudaStreamWaitEvent(c->stream, c->zdone, 0), "waiting for the gradients' zeroing");
    return 0;
}

static int cuda_sync(mgc_backend *be) {
    cuda_ctx *c = be->context;
    CUDA_TRY(be, cudaStreamSynchronize(c->stream), "stream synchronize");
    return 0;
}
static int cuda_set_threads(mgc_backend *be, int threads) {
    (void)be, (void)threads;
    return 0;
}

/* ---- CUDA graphs (backend.h graph_begin / graph_end) ------------------------------------- */

static graph_entry *graph_find(cuda_ctx *c, uint64_t key) {
    for (int i = 0; i < c->n_graphs; i++)
        if (c->graphs[i].key == key) return &c->graphs[i];
    if (c->n_graphs == MAX_GRAPHS) return NULL; /* full: the rest run eagerly */
    graph_entry *e = &c->graphs[c->n_graphs++];
    memset(e, 0, sizeof *e);
    e->key = key;
    return e;
}

/* host.step (cuda_int.h): the word that holds `step` once the work queued so far has run.
 * A new value is written in stream order, one byte memset for each byte that changes (the
 * low byte alone for 255 steps of 256), never inside a capture: the executor sets the step
 * before it begins one (cuda_set_step), so a recorded graph only reads the word. */
static const unsigned long long *cuda_step(mgc_backend *be, int64_t step) {
    cuda_ctx *c = be->context;
    unsigned long long v = (unsigned long long)step;
    if (v == c->step_val) return c->step_dev;
    if (c->recording) {
        mgc_cuda_fail(be, "the step of the dropout kernels changes during a CUDA graph capture");
        return NULL;
    }
    for (int i = 0; i < 8; i++) {
        int nb = (int)((v >> (8 * i)) & 0xff), ob = (int)((c->step_val >> (8 * i)) & 0xff);
        if (nb == ob) continue;
        cudaError_t e = cudaMemsetAsync((unsigned char *)c->step_dev + i, nb, 1, c->stream);
        if (e != cudaSuccess) {
            mgc_cuda_fail(be, "setting the dropout kernels' step: %s", cudaGetErrorString(e));
            return NULL;
        }
    }
    c->step_val = v;
    return c->step_dev;
}

static int cuda_set_step(mgc_backend *be, int64_t step) {
    return cuda_step(be, step) ? 0 : -1;
}

static int cuda_graph_begin(mgc_backend *be, uint64_t key) {
    cuda_ctx *c = be->context;
    graph_entry *e = graph_find(c, key);
    if (!e || e->never || c->recording || getenv("MGC_CUDA_SYNC_CHECK")) return 0;
    if (e->exec) {
        CUDA_TRY(be, cudaGraphLaunch(e->exec, c->stream), "replaying a CUDA graph");
        return 1;
    }
    if (e->runs++ == 0) return 0; /* the first run is eager: kernels load, scratch grows */
    CUDA_TRY(be, cudaStreamBeginCapture(c->stream, cudaStreamCaptureModeThreadLocal),
             "starting a CUDA graph capture");
    c->recording = e;
    return 0;
}

static int cuda_graph_end(mgc_backend *be, uint64_t key, int failed) {
    cuda_ctx *c = be->context;
    graph_entry *e = c->recording;
    if (!e) return 0; /* the ops ran eagerly */
    c->recording = NULL;
    cudaGraph_t g = NULL;
    cudaError_t err = cudaStreamEndCapture(c->stream, &g);
    cudaGraphExec_t ex = NULL;
    if (!failed && err == cudaSuccess && g && e->key == key)
        err = cudaGraphInstantiate(&ex, g, 0);
    else if (err == cudaSuccess)
        err = cudaErrorStreamCaptureInvalidated;
    if (g) cudaGraphDestroy(g);
    if (err != cudaSuccess || !ex) {
        (void)cudaGetLastError(); /* a failed capture leaves no sticky error */
        e->never = 1;
        return 2; /* nothing ran: the executor issues the ops again, eagerly */
    }
    e->exec = ex;
    CUDA_TRY(be, cudaGraphLaunch(ex, c->stream), "launching a CUDA graph");
    return 0;
}

static void cuda_close(mgc_backend *be) {
    cuda_ctx *c = be->context;
    if (c) {
        if (c->recording) {
            cudaGraph_t g = NULL;
            cudaStreamEndCapture(c->stream, &g);
            if (g) cudaGraphDestroy(g);
        }
        cudaStreamSynchronize(c->stream);
        graphs_drop(c);
        if (c->tune && c->tune->n)
            fprintf(stderr, "mgc-run: MGC_GEMM_TUNE: %" PRId64 " GEMM shapes timed, %" PRId64
                            " of them faster on another candidate than cuBLASLt's first: %s\n",
                    c->tune->n, c->tuning_moved, c->tune_path);
        if (c->tuning && c->tuning_ok && c->tuning_absent)
            fprintf(stderr, "mgc-run: warning: MGC_GEMM_TUNING=%s: %" PRId64 " GEMM shapes of this "
                            "run were not in it (cuBLASLt's first choice used; hint: tune this plan)\n",
                    c->tuning_path, c->tuning_absent);
        mgc_gemm_tuning_free(c->tune);
        mgc_gemm_tuning_free(c->tuning);
        for (int i = 0; i < c->n_gemm; i++) gemm_entry_free(&c->gemm[i]);
        for (int i = 0; i < c->n_libs; i++)
            cudaLibraryUnload(c->libs[i]);
        free(c->libs);
        free(c->kernels);
        if (c->scratch_owned) cudaFree(c->scratch);
        if (c->step_dev) cudaFree(c->step_dev);
        if (c->lt) cublasLtDestroy(c->lt);
        if (c->xstream) {
            cudaStreamSynchronize(c->xstream);
            cudaStreamDestroy(c->xstream);
        }
        for (int i = 0; i < c->n_marks; i++)
            cudaEventDestroy(c->marks[i]);
        free(c->marks);
        if (c->pstream) {
            cudaStreamSynchronize(c->pstream);
            cudaStreamDestroy(c->pstream);
        }
        if (c->zstream) {
            cudaStreamSynchronize(c->zstream);
            cudaStreamDestroy(c->zstream);
        }
        if (c->zmark) cudaEventDestroy(c->zmark);
        if (c->zdone) cudaEventDestroy(c->zdone);
        for (int i = 0; i < c->n_p2p; i++) {
            cudaEventDestroy(c->p2p[i]->mark);
            cudaEventDestroy(c->p2p[i]->done);
            free(c->p2p[i]);
        }
        free(c->p2p);
        for (int64_t i = 0; i < c->n_timers; i++)
            cudaEventDestroy(c->timers[i]);
        free(c->timers);
        if (c->stream) cudaStreamDestroy(c->stream);
        free(c);
    }
    free(be);
}

/* The compute stream: where a device communicator (NCCL) queues its operations. */
static void *cuda_queue(mgc_backend *be) {
    return ((cuda_ctx *)be->context)->stream;
}

static const mgc_backend_iface cuda_iface = {
    .name = "cuda",
    .arena_alloc = cuda_arena_alloc,
    .arena_free = cuda_arena_free,
    .bind = cuda_bind,
    .run_op = cuda_run_op,
    .copy = cuda_copy,
    .upload = cuda_upload,
    .download = cuda_download,
    .zero = cuda_zero,
    .sumsq = mgc_cuda_sumsq,
    .adamw = mgc_cuda_adamw,
    .sync = cuda_sync,
    .graph_begin = cuda_graph_begin,
    .graph_end = cuda_graph_end,
    .set_step = cuda_set_step,
    .set_threads = cuda_set_threads,
    .close = cuda_close,
    .device_memory = 1,
    .host_alloc = cuda_host_alloc,
    .host_free = cuda_host_free,
    .xfer_mark = cuda_xfer_mark,
    .xfer_download = cuda_xfer_download,
    .xfer_upload = cuda_xfer_upload,
    .p2p_download = cuda_p2p_download,
    .p2p_wait = cuda_p2p_wait,
    .p2p_fence = cuda_p2p_fence,
    .zero_beside = cuda_zero_beside,
    .zero_fence = cuda_zero_fence,
    .stores_fresh = mgc_cuda_stores_fresh,
    .zero_list = mgc_cuda_zero_list,
    .fold = mgc_cuda_fold,
    .queue = cuda_queue,
    .time_mark = cuda_time_mark,
    .time_between = cuda_time_between,
};

int mgc_backend_cuda_devices(void) {
    int n = 0;
    return cudaGetDeviceCount(&n) == cudaSuccess ? n : 0;
}

int mgc_backend_cuda_available(void) {
    return mgc_backend_cuda_devices() > 0;
}

int mgc_backend_cuda_open(mgc_backend **out, int device, char *err, size_t err_size) {
    *out = NULL;
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess || n == 0) {
        snprintf(err, err_size, "no CUDA device is visible (%s): run on a machine with a GPU, or "
                                "use --backend cpu",
                 e != cudaSuccess ? cudaGetErrorString(e) : "0 devices");
        return -1;
    }
    if (device < 0) device = 0;
    device %= n;
    mgc_backend *be = calloc(1, sizeof *be);
    cuda_ctx *c = calloc(1, sizeof *c);
    if (!be || !c) {
        free(be), free(c);
        snprintf(err, err_size, "out of memory");
        return -1;
    }
    be->iface = &cuda_iface;
    be->context = c;
    c->device = device;
    struct cudaDeviceProp prop;
    if ((e = cudaSetDevice(device)) != cudaSuccess ||
        (e = cudaGetDeviceProperties(&prop, device)) != cudaSuccess ||
        (e = cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking)) != cudaSuccess ||
        (e = cudaStreamCreateWithFlags(&c->xstream, cudaStreamNonBlocking)) != cudaSuccess ||
        (e = cudaStreamCreateWithFlags(&c->pstream, cudaStreamNonBlocking)) != cudaSuccess ||
        (e = cudaStreamCreateWithFlags(&c->zstream, cudaStreamNonBlocking)) != cudaSuccess ||
        (e = cudaEventCreateWithFlags(&c->zmark, cudaEventDisableTiming)) != cudaSuccess ||
        (e = cudaEventCreateWithFlags(&c->zdone, cudaEventDisableTiming)) != cudaSuccess ||
        (e = cudaMalloc((void **)&c->step_dev, sizeof *c->step_dev)) != cudaSuccess ||
        (e = cudaMemsetAsync(c->step_dev, 0, sizeof *c->step_dev, c->stream)) != cudaSuccess) {
        snprintf(err, err_size, "CUDA device %d: %s", device, cudaGetErrorString(e));
        cuda_close(be);
        return -1;
    }
    c->arch = prop.major * 10 + prop.minor;
    c->smem_sm = prop.sharedMemPerMultiprocessor;
    c->smem_reserved = prop.reservedSharedMemPerBlock;
    /* MGC_CUDA_SMEM_PER_SM (docs/cuda-backend.md, "Twins for GPUs with 100 KB"): pose as a GPU
     * whose multiprocessors have that much shared memory, for timing what runs there */
    const char *lim = getenv("MGC_CUDA_SMEM_PER_SM");
    if (lim && *lim) {
        char *end = NULL;
        long v = strtol(lim, &end, 10);
        if (*end || v < 16384 || (size_t)v > c->smem_sm) {
            snprintf(err, err_size,
                     "MGC_CUDA_SMEM_PER_SM='%s': this GPU's multiprocessors have %zu bytes of "
                     "shared memory; it takes fewer, from 16384 (e.g. 102400 to run as an sm_86 "
                     "or sm_89 GPU does), or unset it",
                     lim, c->smem_sm);
            cuda_close(be);
            return -1;
        }
        c->smem_limit = (size_t)v;
    }
    c->host.launch = cuda_launch;
    c->host.scratch = cuda_scratch;
    c->host.step = cuda_step;
    c->host.blocks_per_sm = cuda_blocks_per_sm;
    c->host.gemm = gemm;
    c->host.sms = prop.multiProcessorCount;
    const char *epi = getenv("MGC_GEMM_EPILOGUES"); /* docs/cuda-backend.md */
    c->host.epilogues = !(epi && !strcmp(epi, "0"));
    const char *bg = getenv("MGC_GEMM_BGRAD"); /* docs/cuda-backend.md: 0 = ours */
    c->host.bgrad_epilogue = !(bg && !strcmp(bg, "0"));
    /* docs/cuda-backend.md, "Programmatic dependent launch": off (no gain on the H100) */
    const char *pdl = getenv("MGC_PDL");
    c->pdl = pdl && !strcmp(pdl, "1") && c->arch >= 90;
    /* docs/cuda-backend.md, "The gradients' zeroing beside the forward": off (no gain on the
     * H100) */
    const char *zb = getenv("MGC_ZERO_BESIDE");
    c->zero_beside = zb && !strcmp(zb, "1");
    snprintf(c->device_name, sizeof c->device_name, "%.127s", prop.name);
    c->lt_version = (long)cublasLtGetVersion();
    /* docs/cuda-backend.md, "GEMM tuning" */
    const char *tn = getenv("MGC_GEMM_TUNE"), *tg = getenv("MGC_GEMM_TUNING");
    if (tn && *tn && tg && *tg) {
        snprintf(err, err_size, "MGC_GEMM_TUNE and MGC_GEMM_TUNING are both set: set one (TUNE "
                                "times cuBLASLt's candidates and writes the file, TUNING reads it)");
        cuda_close(be);
        return -1;
    }
    if (tn && *tn) {
        snprintf(c->tune_path, sizeof c->tune_path, "%s", tn);
        if (!(c->tune = mgc_gemm_tuning_new(c->device_name, c->lt_version, 0))) {
            snprintf(err, err_size, "out of memory");
            cuda_close(be);
            return -1;
        }
    }
    if (tg && *tg) {
        snprintf(c->tuning_path, sizeof c->tuning_path, "%s", tg);
        if (mgc_gemm_tuning_load(tg, &c->tuning, err, err_size)) {
            cuda_close(be);
            return -1;
        }
    }
    if (cublasLtCreate(&c->lt) != CUBLAS_STATUS_SUCCESS) {
        snprintf(err, err_size, "CUDA device %d: cublasLtCreate failed", device);
        cuda_close(be);
        return -1;
    }
    *out = be;
    return 0;
}
