/* emu_backend.c - the CUDA emulator backend ("emu"): the CUDA backend's launchers
 * (cuda_ops_*.c) and the plan's generated kernels, run on the CPU by the CUDA
 * emulator (emu_kernel.h), so that a machine without a GPU executes the very
 * kernel source and launch geometry the GPU runs, in every precision the CUDA
 * backend supports.  GEMMs, cuBLASLt's part on the GPU, are plain loops here
 * with the same epilogues (bias, GELU with aux, DGELU, bias gradient), so the
 * fused linear paths run too.  docs/cuda-emulator.md is the manual.
 *
 * The arena is host memory, but the backend says device_memory, as the CUDA
 * one does: the executor then stages collectives through host buffers and
 * hands gradient buckets to its reducer through xfer_* and pipeline sends to
 * its sender through p2p_*, the GPU's code paths.
 * Everything runs synchronously on the calling thread (sync is a no-op; a mark
 * is passed as soon as it is made).  Slow: for tests and for debugging kernels,
 * never for training. */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backend.h"
#include "cuda_int.h"
#include "emu_kernel.h"
#include "half.h"
#include "kspec.h"

/* One device operation of an emulated CUDA graph: a kernel launch, its arguments' bytes copied
 * when it was recorded (a capture takes arguments by value), or a GEMM with its arguments. */
typedef struct emu_node {
    int gemm;
    mgc_kspec k;
    unsigned gx, gy, gz, block;
    size_t smem;
    unsigned char *argv; /* the arguments' bytes, each at a 16-aligned offset */
    size_t off[MGC_EMU_MAX_PARAMS];
    int nargs;
    struct { /* host.gemm's arguments */
        int ta, tb, atype, btype, ctype, has_ep;
        int64_t m, n, k, lda, ldb, ldc;
        const void *A, *B;
        void *D;
        float beta;
        mgc_gemm_epi ep;
    } g;
} emu_node;

/* A program's emulated graph (backend.h graph_begin), as the CUDA backend keeps them: recorded
 * on the program's second run, replayed after. */
typedef struct emu_graph {
    uint64_t key;
    int runs, never, done;
    emu_node *nodes;
    int n, cap;
} emu_graph;

#define EMU_MAX_GRAPHS 256
struct emu_ctx;
static void graphs_drop(struct emu_ctx *c);

typedef struct emu_ctx {
    mgc_cuda_host host; /* first: the launchers' view (cuda_int.h) */
    mgc_emu *emu;
    void *scratch; /* the plan's kernel_scratch (arena) or our own */
    size_t scratch_bytes;
    int scratch_owned;
    void *scratch_arena;           /* the arena that holds it when not owned */
    const mgc_stage_program *warm; /* the stage whose kernels were loaded last */
    double *timers;                /* --profile's op timers: the clock when each was marked */
    int64_t n_timers;
    unsigned long long step; /* the step the dropout kernels read (host.step) */
    emu_graph graphs[EMU_MAX_GRAPHS];
    int n_graphs;
    emu_graph *recording; /* the graph being recorded: launches and GEMMs are kept, not run */
    void *zdst; /* the gradients' zeroing queued "beside" the forward (emu_zero_beside) */
    size_t zbytes;
    unsigned refuse; /* bit k: the emulated cuBLASLt has no algorithm for epilogue kind k
                        (MGC_EMU_REFUSE_EPI) */
    long smem_sm;    /* the shared memory of a multiprocessor (MGC_EMU_SMEM_PER_SM) */
} emu_ctx;

static emu_node *graph_node(mgc_backend *be, emu_graph *g) {
    if (g->n == g->cap) {
        int nc = g->cap ? 2 * g->cap : 64;
        emu_node *p = realloc(g->nodes, (size_t)nc * sizeof *p);
        if (!p) {
            mgc_cuda_fail(be, "out of memory recording a graph");
            return NULL;
        }
        g->nodes = p, g->cap = nc;
    }
    emu_node *nd = &g->nodes[g->n++];
    memset(nd, 0, sizeof *nd);
    return nd;
}

static int emu_launch(mgc_backend *be, const mgc_kspec *k, unsigned gx, unsigned gy, unsigned gz,
                      unsigned block, size_t smem, void **args) {
    emu_ctx *c = be->context;
    if (gx == 0 || gy == 0 || gz == 0) return 0;
    if (!c->recording)
        return mgc_emu_launch(c->emu, k, gx, gy, gz, block, smem, args, be->err, sizeof be->err);
    /* recorded: the arguments' values now, as cudaStreamBeginCapture takes them */
    size_t sz[MGC_EMU_MAX_PARAMS], total = 0;
    int n = mgc_emu_param_sizes(c->emu, k, sz, MGC_EMU_MAX_PARAMS, be->err, sizeof be->err);
    if (n < 0) return -1;
    emu_node *nd = graph_node(be, c->recording);
    if (!nd) return -1;
    for (int i = 0; i < n; i++)
        nd->off[i] = total, total += (sz[i] + 15) & ~(size_t)15;
    if (!(nd->argv = malloc(total ? total : 1))) {
        c->recording->n--;
        return mgc_cuda_fail(be, "out of memory recording a graph");
    }
    for (int i = 0; i < n; i++)
        memcpy(nd->argv + nd->off[i], args[i], sz[i]);
    nd->nargs = n, nd->k = *k, nd->gx = gx, nd->gy = gy, nd->gz = gz, nd->block = block;
    nd->smem = smem;
    return 0;
}

/* host.blocks_per_sm (cuda_int.h): the blocks whose dynamic shared memory, and the 1 KB a
 * GPU reserves for each, fit the multiprocessor's MGC_EMU_SMEM_PER_SM, at most 2,048 threads;
 * static shared memory and registers are not counted.  The kernel is compiled as for a
 * launch. */
static int emu_blocks_per_sm(mgc_backend *be, const mgc_kspec *k, unsigned block, size_t smem) {
    emu_ctx *c = be->context;
    size_t sz[MGC_EMU_MAX_PARAMS];
    if (mgc_emu_param_sizes(c->emu, k, sz, MGC_EMU_MAX_PARAMS, be->err, sizeof be->err) < 0)
        return -1;
    long by_smem = c->smem_sm / (long)(smem + 1024), by_threads = block ? 2048 / (long)block : 0;
    return (int)(by_smem < by_threads ? by_smem : by_threads);
}

/* host.step (cuda_int.h): the kernels run at once, so the word is set at once; never while
 * recording, as on the GPU (the executor sets the step before it begins a graph) */
static const unsigned long long *emu_step(mgc_backend *be, int64_t step) {
    emu_ctx *c = be->context;
    if (c->step != (unsigned long long)step && c->recording) {
        mgc_cuda_fail(be, "the step of the dropout kernels changes during a CUDA graph capture");
        return NULL;
    }
    c->step = (unsigned long long)step;
    return &c->step;
}
static int emu_set_step(mgc_backend *be, int64_t step) {
    return emu_step(be, step) ? 0 : -1;
}

/* The scratch an op asks for holds NaN (0xff bytes) when the op gets it, outside a capture
 * (the kernels run at once): a kernel that reads partials no block of the op wrote, or a
 * launcher that asks again and overwrites what a later kernel of the op still reads, then
 * fails its replay, where stale values of an earlier op could pass. */
static void *scratch_poisoned(emu_ctx *c, size_t bytes) {
    if (c->scratch && !c->recording) memset(c->scratch, 0xff, bytes);
    return c->scratch;
}

static void *emu_scratch(mgc_backend *be, size_t bytes) {
    emu_ctx *c = be->context;
    if (bytes <= c->scratch_bytes) return scratch_poisoned(c, bytes);
    if (c->recording) { /* as the CUDA backend: the program runs eagerly instead */
        mgc_cuda_fail(be, "kernel scratch grows during a CUDA graph capture");
        return NULL;
    }
    graphs_drop(c); /* recorded graphs hold the old address */
    /* past the plan's kernel_scratch: the CUDA backend warns and allocates; so do we */
    fprintf(stderr, "mgc-run: warning: a kernel asks for %zu bytes of scratch, more than the "
                    "plan's kernel_scratch (%zu bytes): allocating it beside the arena\n",
            bytes, c->scratch_bytes);
    if (c->scratch_owned) free(c->scratch);
    c->scratch = malloc(bytes), c->scratch_owned = 1, c->scratch_arena = NULL;
    c->scratch_bytes = c->scratch ? bytes : 0;
    if (!c->scratch) mgc_cuda_fail(be, "out of memory for %zu bytes of kernel scratch", bytes);
    return scratch_poisoned(c, bytes);
}

/* ---- GEMMs: what cuBLASLt computes, in loops ---------------------------------------------- */

static float ld(const void *p, int64_t i, int dt) {
    if (dt == MGC_DT_BF16) return mgc_bf16_to_f32(((const uint16_t *)p)[i]);
    if (dt == MGC_DT_F16) return mgc_f16_to_f32(((const uint16_t *)p)[i]);
    return ((const float *)p)[i];
}
static void st(void *p, int64_t i, int dt, float v) {
    if (dt == MGC_DT_BF16) ((uint16_t *)p)[i] = mgc_f32_to_bf16(v);
    else if (dt == MGC_DT_F16) ((uint16_t *)p)[i] = mgc_f32_to_f16(v);
    else ((float *)p)[i] = v;
}

#define GELU_K 0.7978845608028654 /* sqrt(2 / pi): the tanh form, as cuBLASLt's and the CPU's */

static double gelu(double x) {
    return 0.5 * x * (1.0 + tanh(GELU_K * (x + 0.044715 * x * x * x)));
}
static double dgelu(double x) {
    double t = tanh(GELU_K * (x + 0.044715 * x * x * x));
    return 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * GELU_K * (1.0 + 3.0 * 0.044715 * x * x);
}

/* host.gemm (cuda_int.h): column-major D (m x n) = op(A) op(B) + beta D, accumulated in fp32
 * in k order (rounding as a tensor core's fp32 accumulator, not bit for bit) */
static int emu_gemm_run(mgc_backend *be, int ta, int tb, int64_t m, int64_t n, int64_t k, const void *A,
                        int64_t lda, int atype, const void *B, int64_t ldb, int btype, void *D,
                        int64_t ldc, int ctype, float beta, const mgc_gemm_epi *ep) {
    mgc_gemm_epi none = {MGC_GEMM_EPI_NONE, NULL, 0, NULL, 0, 0};
    if (!ep) ep = &none;
    if (m == 0 || n == 0) return 0;
    float *a = malloc((size_t)(m * k) * sizeof *a), *b = malloc((size_t)(k * n) * sizeof *b);
    if (!a || !b) {
        free(a), free(b);
        return mgc_cuda_fail(be, "out of memory for a %" PRId64 "x%" PRId64 "x%" PRId64 " GEMM", m,
                             n, k);
    }
    for (int64_t i = 0; i < m; i++) /* a: op(A) row-major (m x k) */
        for (int64_t kk = 0; kk < k; kk++)
            a[i * k + kk] = ld(A, ta ? kk + i * lda : i + kk * lda, atype);
    for (int64_t j = 0; j < n; j++) /* b: op(B) column j contiguous (n x k) */
        for (int64_t kk = 0; kk < k; kk++)
            b[j * k + kk] = ld(B, tb ? j + kk * ldb : kk + j * ldb, btype);
    int kind = ep->kind;
    if (kind == MGC_GEMM_EPI_DGELU_BGRAD) /* the sums of D's rows, added below in j order */
        for (int64_t i = 0; i < m; i++)
            ((float *)ep->bias)[i] = 0.0f;
    for (int64_t j = 0; j < n; j++) {
        if (kind == MGC_GEMM_EPI_BGRADB) { /* sums of op(B) over k */
            float s = 0.0f;
            for (int64_t kk = 0; kk < k; kk++)
                s += b[j * k + kk];
            ((float *)ep->bias)[j] = s;
        }
        for (int64_t i = 0; i < m; i++) {
            float s = 0.0f;
            const float *ai = a + i * k, *bj = b + j * k;
            for (int64_t kk = 0; kk < k; kk++)
                s += ai[kk] * bj[kk];
            int64_t o = i + j * ldc;
            if (beta != 0.0f) s += beta * ld(D, o, ctype);
            if (kind == MGC_GEMM_EPI_BIAS || kind == MGC_GEMM_EPI_GELU_AUX_BIAS)
                s += ld(ep->bias, i, ep->bias_type);
            if (kind == MGC_GEMM_EPI_GELU_AUX || kind == MGC_GEMM_EPI_GELU_AUX_BIAS) {
                st((void *)ep->aux, i + j * ep->aux_ld, ep->aux_type, s);
                s = (float)gelu(s);
            } else if (kind == MGC_GEMM_EPI_DGELU || kind == MGC_GEMM_EPI_DGELU_BGRAD) {
                s = (float)(s * dgelu(ld(ep->aux, i + j * ep->aux_ld, ep->aux_type)));
                /* cuBLASLt does not say whether its sums take D before or after the rounding
                 * to D's type: here before, in fp32 */
                if (kind == MGC_GEMM_EPI_DGELU_BGRAD) ((float *)ep->bias)[i] += s;
            }
            st(D, o, ctype, s);
        }
    }
    free(a), free(b);
    return 0;
}

static int emu_gemm(mgc_backend *be, int ta, int tb, int64_t m, int64_t n, int64_t k, const void *A,
                    int64_t lda, int atype, const void *B, int64_t ldb, int btype, void *D,
                    int64_t ldc, int ctype, float beta, const mgc_gemm_epi *ep) {
    emu_ctx *c = be->context;
    /* an epilogue cuBLASLt might not offer at some shape: the caller's fallback then (as
     * cuda_backend.c's gemm returns 1 when its heuristic finds none) */
    if (ep && ep->kind > MGC_GEMM_EPI_BIAS && (c->refuse >> ep->kind & 1u)) return 1;
    if (!c->recording)
        return emu_gemm_run(be, ta, tb, m, n, k, A, lda, atype, B, ldb, btype, D, ldc, ctype, beta, ep);
    emu_node *nd = graph_node(be, c->recording);
    if (!nd) return -1;
    nd->gemm = 1;
    nd->g.ta = ta, nd->g.tb = tb, nd->g.m = m, nd->g.n = n, nd->g.k = k;
    nd->g.A = A, nd->g.lda = lda, nd->g.atype = atype, nd->g.B = B, nd->g.ldb = ldb;
    nd->g.btype = btype, nd->g.D = D, nd->g.ldc = ldc, nd->g.ctype = ctype, nd->g.beta = beta;
    nd->g.has_ep = ep != NULL;
    if (ep) nd->g.ep = *ep;
    return 0;
}

/* ---- CUDA graphs, emulated (backend.h graph_begin / graph_end) -----------------------------
 * As the CUDA backend keeps them: a program's first run is eager, its second is recorded (the
 * launches and GEMMs kept with their arguments' values, nothing run) and run at graph_end, and
 * later runs replay the record.  So an argument that changes from step to step, which a GPU's
 * graph would replay stale, is replayed stale here too, and the tests' comparisons catch it. */

static void graphs_drop(emu_ctx *c) {
    for (int i = 0; i < c->n_graphs; i++) {
        for (int j = 0; j < c->graphs[i].n; j++)
            free(c->graphs[i].nodes[j].argv);
        free(c->graphs[i].nodes);
    }
    c->n_graphs = 0;
}

static int graph_replay(mgc_backend *be, const emu_graph *g) {
    emu_ctx *c = be->context;
    for (int i = 0; i < g->n; i++) {
        const emu_node *nd = &g->nodes[i];
        int rc;
        if (nd->gemm) {
            rc = emu_gemm_run(be, nd->g.ta, nd->g.tb, nd->g.m, nd->g.n, nd->g.k, nd->g.A, nd->g.lda,
                              nd->g.atype, nd->g.B, nd->g.ldb, nd->g.btype, nd->g.D, nd->g.ldc,
                              nd->g.ctype, nd->g.beta, nd->g.has_ep ? &nd->g.ep : NULL);
        } else {
            void *args[MGC_EMU_MAX_PARAMS];
            for (int a = 0; a < nd->nargs; a++)
                args[a] = nd->argv + nd->off[a];
            rc = mgc_emu_launch(c->emu, &nd->k, nd->gx, nd->gy, nd->gz, nd->block, nd->smem, args,
                                be->err, sizeof be->err);
        }
        if (rc) return -1;
    }
    return 0;
}

static int emu_graph_begin(mgc_backend *be, uint64_t key) {
    emu_ctx *c = be->context;
    emu_graph *g = NULL;
    for (int i = 0; i < c->n_graphs && !g; i++)
        if (c->graphs[i].key == key) g = &c->graphs[i];
    if (!g) {
        if (c->n_graphs == EMU_MAX_GRAPHS) return 0; /* full: the rest run eagerly */
        g = &c->graphs[c->n_graphs++];
        memset(g, 0, sizeof *g);
        g->key = key;
    }
    if (g->never || c->recording) return 0;
    if (g->done) return graph_replay(be, g) ? -1 : 1;
    if (g->runs++ == 0) return 0; /* the first run is eager: kernels load, scratch grows */
    c->recording = g;
    return 0;
}

static int emu_graph_end(mgc_backend *be, uint64_t key, int failed) {
    emu_ctx *c = be->context;
    emu_graph *g = c->recording;
    if (!g) return 0; /* the ops ran eagerly */
    c->recording = NULL;
    if (failed || g->key != key) { /* nothing ran: the executor issues the ops again */
        for (int j = 0; j < g->n; j++)
            free(g->nodes[j].argv);
        g->n = 0;
        g->never = 1;
        return 2;
    }
    g->done = 1;
    return graph_replay(be, g);
}

/* ---- the backend interface ---------------------------------------------------------------- */

static int emu_arena_alloc(mgc_backend *be, uint64_t bytes, void **out) {
    void *p = NULL;
    size_t n = bytes ? (size_t)bytes : 256;
    if (posix_memalign(&p, 256, n))
        return mgc_cuda_fail(be, "cannot allocate the %" PRIu64 "-byte arena in host memory", bytes);
    memset(p, 0, n);
    *out = p;
    return 0;
}

static void emu_arena_free(mgc_backend *be, void *arena) {
    emu_ctx *c = be->context;
    graphs_drop(c); /* they hold addresses in the arena */
    if (!c->scratch_owned && arena && c->scratch_arena == arena)
        c->scratch = NULL, c->scratch_bytes = 0, c->scratch_arena = NULL;
    free(arena);
}

static int emu_bind(mgc_backend *be, const mgc_plan *plan, const mgc_stage_program *st, void *arena) {
    emu_ctx *c = be->context;
    for (int64_t b = 0; b < st->n_buffers; b++) {
        if (st->buffers[b].kind != MGC_BUF_WORKSPACE) continue;
        if (!strcmp(mgc_plan_strat(plan, st->buffers[b].name), "kernel_scratch")) {
            if ((char *)arena + st->buffers[b].offset != c->scratch)
                graphs_drop(c); /* recorded graphs hold the old address */
            if (c->scratch_owned) free(c->scratch);
            c->scratch = (char *)arena + st->buffers[b].offset;
            c->scratch_bytes = (size_t)st->buffers[b].bytes, c->scratch_owned = 0;
            c->scratch_arena = arena;
        }
    }
    if (c->warm == st) return 0;
    /* every kernel of the stage compiled (or found in the cache) now, not mid-step */
    mgc_kspec *k = NULL;
    int n = 0, cap = 0;
    for (int64_t ci = 0; ci < st->n_chunks; ci++) {
        const mgc_plan_chunk *ch = &st->chunks[ci];
        for (int64_t i = 0; i < ch->n_fwd + ch->n_bwd; i++) {
            const mgc_plan_op *op = i < ch->n_fwd ? &ch->fwd[i] : &ch->bwd[i - ch->n_fwd];
            if (n + MGC_KSPEC_MAX_PER_OP > cap) {
                cap = cap ? 2 * cap : 256;
                mgc_kspec *nk = realloc(k, (size_t)cap * sizeof *nk);
                if (!nk) {
                    free(k);
                    return mgc_cuda_fail(be, "out of memory");
                }
                k = nk;
            }
            int r = mgc_kspecs_for_op(plan, ch, op, k + n, MGC_KSPEC_MAX_PER_OP, be->err,
                                      sizeof be->err);
            if (r < 0) {
                free(k);
                return -1;
            }
            n += r;
        }
    }
    mgc_kspec opt[MGC_KSPEC_MAX_PER_OP * 2];
    int no = mgc_kspecs_for_plan(plan, opt, MGC_KSPEC_MAX_PER_OP * 2);
    int rc = mgc_emu_load_many(c->emu, k, n, 0, be->err, sizeof be->err);
    if (!rc) rc = mgc_emu_load_many(c->emu, opt, no, 0, be->err, sizeof be->err);
    free(k);
    if (!rc) c->warm = st;
    return rc;
}

static int emu_copy(mgc_backend *be, void *dst, const void *src, size_t n) {
    (void)be;
    if (n && dst != src) memmove(dst, src, n);
    return 0;
}
static int emu_zero(mgc_backend *be, void *dst, size_t n) {
    (void)be;
    if (n) memset(dst, 0, n);
    return 0;
}
/* The gradients' zeroing beside the forward (backend.h zero_beside), as a GPU may leave it
 * until the fence: the bytes are poisoned now (0xff: a NaN in every float type, what a
 * zeroing still running may look like) and zeroed only by zero_fence.  So an executor that
 * touched the gradients before the fence computes NaNs or loses its writes, and the tests'
 * comparisons with the CPU fail. */
static int emu_zero_beside(mgc_backend *be, void *dst, size_t n) {
    emu_ctx *c = be->context;
    /* one pending at a time: a failed step's, never fenced, is replaced (the next step zeroes
     * the same gradients, and its arena may be gone) */
    if (n) memset(dst, 0xff, n);
    c->zdst = dst, c->zbytes = n;
    return 0;
}
static int emu_zero_fence(mgc_backend *be) {
    emu_ctx *c = be->context;
    if (c->zdst && c->zbytes) memset(c->zdst, 0, c->zbytes);
    c->zdst = NULL, c->zbytes = 0;
    return 0;
}
/* backend.h zero_list: the gradients the step's first writes store hold NaN (0xff) before
 * them, as a GPU's memory may hold anything, so a write that reads its output, or leaves part
 * of it, makes NaNs the tests' comparisons with the CPU catch; the ranges are zeroed by the
 * CUDA backend's kernel. */
static int emu_zero_list(mgc_backend *be, void *base, size_t bytes, float *const *p,
                         const int64_t *n, int64_t count) {
    if (bytes) memset(base, 0xff, bytes);
    return mgc_cuda_zero_list(be, base, bytes, p, n, count);
}
static int emu_sync(mgc_backend *be) {
    (void)be;
    return 0;
}
static int emu_set_threads(mgc_backend *be, int threads) {
    (void)be, (void)threads;
    return 0;
}

/* The reducer's transfers: the compute before a mark has finished when the mark is made. */
static int emu_xfer_mark(mgc_backend *be, void **mark) {
    (void)be;
    *mark = (void *)1;
    return 0;
}
static int emu_xfer_download(mgc_backend *be, void *mark, void *host, const void *src, size_t n,
                             char *err, size_t errsz) {
    (void)be, (void)mark, (void)err, (void)errsz;
    if (n) memcpy(host, src, n);
    return 0;
}
static int emu_xfer_upload(mgc_backend *be, void *dst, const void *host, size_t n, char *err,
                           size_t errsz) {
    (void)be, (void)err, (void)errsz;
    if (n) memcpy(dst, host, n);
    return 0;
}

/* Pipeline sends: the compute issued so far has finished, so the copy is done at once. */
static int emu_p2p_download(mgc_backend *be, void *host, const void *src, size_t n, void **done,
                            char *err, size_t errsz) {
    (void)be, (void)err, (void)errsz;
    if (n) memcpy(host, src, n);
    *done = (void *)1;
    return 0;
}
static int emu_p2p_wait(mgc_backend *be, void *done, char *err, size_t errsz) {
    (void)be, (void)done, (void)err, (void)errsz;
    return 0;
}

/* --profile's op timers: every launch has finished when it returns, so a timer is the host's
 * clock when it is marked (the CUDA backend's are events on its stream). */
static int emu_time_mark(mgc_backend *be, int64_t i) {
    emu_ctx *c = be->context;
    if (i < 0 || i >= (1 << 20)) {
        snprintf(be->err, sizeof be->err, "op timer %" PRId64 " out of range", i);
        return -1;
    }
    if (i >= c->n_timers) {
        int64_t n = c->n_timers ? c->n_timers : 256;
        while (n <= i)
            n *= 2;
        double *t = realloc(c->timers, (size_t)n * sizeof *t);
        if (!t) {
            snprintf(be->err, sizeof be->err, "out of memory for op timers");
            return -1;
        }
        for (int64_t k = c->n_timers; k < n; k++)
            t[k] = NAN;
        c->timers = t, c->n_timers = n;
    }
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    c->timers[i] = (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
    return 0;
}

static int emu_time_between(mgc_backend *be, int64_t a, int64_t b, double *seconds) {
    emu_ctx *c = be->context;
    if (a < 0 || b < 0 || a >= c->n_timers || b >= c->n_timers || isnan(c->timers[a]) || isnan(c->timers[b])) {
        snprintf(be->err, sizeof be->err, "op timers %" PRId64 " and %" PRId64 " were never marked", a, b);
        return -1;
    }
    *seconds = c->timers[b] - c->timers[a];
    return 0;
}

static void emu_close(mgc_backend *be) {
    emu_ctx *c = be->context;
    if (c) {
        graphs_drop(c);
        free(c->timers);
        mgc_emu_close(c->emu);
        if (c->scratch_owned) free(c->scratch);
        free(c);
    }
    free(be);
}

static const mgc_backend_iface emu_iface = {
    .name = "emu",
    .arena_alloc = emu_arena_alloc,
    .arena_free = emu_arena_free,
    .bind = emu_bind,
    .run_op = mgc_cuda_run_op,
    .copy = emu_copy,
    .upload = emu_copy,
    .download = emu_copy,
    .zero = emu_zero,
    .sumsq = mgc_cuda_sumsq,
    .adamw = mgc_cuda_adamw,
    .sync = emu_sync,
    .graph_begin = emu_graph_begin,
    .graph_end = emu_graph_end,
    .set_step = emu_set_step,
    .set_threads = emu_set_threads,
    .close = emu_close,
    .device_memory = 1,
    .xfer_mark = emu_xfer_mark,
    .xfer_download = emu_xfer_download,
    .xfer_upload = emu_xfer_upload,
    .p2p_download = emu_p2p_download,
    .p2p_wait = emu_p2p_wait,
    .p2p_fence = emu_p2p_wait,
    .zero_beside = emu_zero_beside,
    .zero_fence = emu_zero_fence,
    .stores_fresh = mgc_cuda_stores_fresh,
    .zero_list = emu_zero_list,
    .fold = mgc_cuda_fold,
    .time_mark = emu_time_mark,
    .time_between = emu_time_between,
};

int mgc_backend_emu_open(mgc_backend **out, char *err, size_t err_size) {
    *out = NULL;
    mgc_backend *be = calloc(1, sizeof *be);
    emu_ctx *c = calloc(1, sizeof *c);
    if (!be || !c) {
        free(be), free(c);
        snprintf(err, err_size, "out of memory");
        return -1;
    }
    if (mgc_emu_open(&c->emu, err, err_size)) {
        free(be), free(c);
        return -1;
    }
    be->iface = &emu_iface;
    be->context = c;
    c->host.launch = emu_launch;
    c->host.scratch = emu_scratch;
    c->host.step = emu_step;
    c->host.blocks_per_sm = emu_blocks_per_sm;
    c->host.gemm = emu_gemm;
    c->host.sms = 4; /* a small GPU: grid-stride kernels take several rounds */
    const char *epi = getenv("MGC_GEMM_EPILOGUES");
    c->host.epilogues = !(epi && !strcmp(epi, "0"));
    /* the bias gradient's epilogue (BGRADB) as on the GPU, MGC_GEMM_BGRAD=0: mgc's kernels */
    const char *bg = getenv("MGC_GEMM_BGRAD");
    c->host.bgrad_epilogue = !(bg && !strcmp(bg, "0"));
    /* MGC_EMU_REFUSE_EPI: a comma-separated list of the GELU and bias-gradient epilogues (by
     * cuBLASLt's names) the emulated cuBLASLt has no algorithm for, so that the launchers'
     * fallbacks run (test_cuda bgrad) */
    static const char *const epi_names[] = {
        [MGC_GEMM_EPI_GELU_AUX] = "GELU_AUX", [MGC_GEMM_EPI_GELU_AUX_BIAS] = "GELU_AUX_BIAS",
        [MGC_GEMM_EPI_DGELU] = "DGELU",       [MGC_GEMM_EPI_BGRADB] = "BGRADB",
        [MGC_GEMM_EPI_DGELU_BGRAD] = "DGELU_BGRAD"};
    const char *rf = getenv("MGC_EMU_REFUSE_EPI");
    for (const char *p = rf; p && *p;) {
        size_t n = strcspn(p, ",");
        int found = 0;
        for (unsigned k = 0; k < sizeof epi_names / sizeof *epi_names; k++)
            if (epi_names[k] && strlen(epi_names[k]) == n && !strncmp(epi_names[k], p, n))
                c->refuse |= 1u << k, found = 1;
        if (!found) {
            snprintf(err, err_size,
                     "MGC_EMU_REFUSE_EPI names no epilogue '%.*s' (it takes GELU_AUX, "
                     "GELU_AUX_BIAS, DGELU, BGRADB or DGELU_BGRAD, comma-separated)",
                     (int)n, p);
            mgc_backend_close(be);
            return -1;
        }
        p += n + (p[n] == ',');
    }
    /* MGC_EMU_SMEM_PER_SM: the shared memory of the emulated GPU's multiprocessor, in bytes
     * (default 233,472: sm_90's 228 KB; 102,400 for sm_86 and sm_89), which the launchers
     * ask about where a kernel has a twin with less (test_cuda twins) */
    const char *sm = getenv("MGC_EMU_SMEM_PER_SM");
    c->smem_sm = 233472;
    if (sm && *sm) {
        char *end = NULL;
        long v = strtol(sm, &end, 10);
        if (*end || v < 16384 || v > 1048576) {
            snprintf(err, err_size,
                     "MGC_EMU_SMEM_PER_SM='%s' is no multiprocessor's shared memory (it takes "
                     "bytes from 16384 to 1048576, e.g. 102400 for an sm_86 or sm_89 GPU)",
                     sm);
            mgc_backend_close(be);
            return -1;
        }
        c->smem_sm = v;
    }
    *out = be;
    return 0;
}

mgc_emu *mgc_backend_emu_emulator(mgc_backend *be) {
    return be && be->iface == &emu_iface ? ((emu_ctx *)be->context)->emu : NULL;
}
