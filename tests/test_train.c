/* test_train.c - every parallel layout computes the same function.
 *
 * The tiny dense GPT, the tiny LLaMA-style model and the tiny MoE (models/)
 * train 10 optimizer steps on one rank; then under each layout the plan names
 * -- tensor 2 with and without sequence parallelism, pipeline 2 with 1F1B,
 * interleaved and GPipe schedules, data 2 with and without the distributed
 * optimizer, expert 2, context 2, full and selective recompute, and tensor 2 x
 * pipeline 2 x data 2 -- with ranks as threads (the local communicator).
 * Every step's loss must be within 1e-5 relative of the single rank's, and a
 * second run of the layout must give bit-identical losses and gradient norms.
 * Each layout's rerun is on a backend whose arena the host cannot address, so all of its
 * communication is staged through host memory.  Gradient reduction beside the backward (the
 * reducer thread) gives the same bits as reduction at the step's end.
 * The same through mpirun is tests/train_mpi.sh.
 *
 * The models run at seq_length 32 and micro-batch 2 (the layouts are what is
 * tested; the shapes keep every split legal). */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <stdint.h>

#include "backend.h"
#include "compile.h"
#include "config.h"
#include "diag.h"
#include "exec.h"
#include "ir.h"
#include "plan.h"
#include "testlib.h"
#include "testexec.h"
#include "testplan.h"
#include "train.h"
#include "train_data.h"

#define STEPS 10

static const char *const common[] = {
    "training.iterations=10", "optimizer.warmup_iterations=2", "model.seq_length=32",
    "training.micro_batch_size=2", "training.global_batch_size=4", NULL};

static mgc_plan *compile(const char *path, const char *const *base, const char *const *sets) {
    return t_compile(path, (const char *const *const[]){common, base, sets}, 3);
}

/* ---- communication on device memory ------------------------------------------------------
 * A backend whose arena the host cannot address: the CPU backend's kernels, but the arena
 * address the executor holds has bit 52 flipped, which no process maps.  Each slot flips it
 * back before the CPU backend runs.  It reports device_memory, so the executor must move
 * every collective and pipeline transfer through host memory; a communicator (or the
 * executor) touching an arena address directly faults and the test dies.  The CUDA
 * backend's arena is the real case. */
#define FAR_BIT ((uintptr_t)1 << 52)
typedef struct lazy_copy lazy_copy;
typedef struct fenced {
    mgc_backend be; /* first: the handle the executor holds */
    mgc_backend *cpu;
    lazy_copy **lazy; /* the pipeline sends' download handles (made on the executor's thread) */
    int n_lazy, cap_lazy;
} fenced;

static long fenced_staged; /* bytes through upload and download, all ranks (atomic adds) */

static void *near_(const void *p) {
    return p ? (void *)((uintptr_t)p ^ FAR_BIT) : NULL;
}
#define FENCED(call)                                                                               \
    fenced *f = (fenced *)be;                                                                      \
    int rc = f->cpu->iface->call;                                                                  \
    if (rc) snprintf(be->err, sizeof be->err, "%s", f->cpu->err);                                  \
    return rc

static int f_arena_alloc(mgc_backend *be, uint64_t bytes, void **out) {
    fenced *f = (fenced *)be;
    void *p = NULL;
    if (f->cpu->iface->arena_alloc(f->cpu, bytes, &p)) return -1;
    *out = near_(p); /* far: the executor's view */
    return 0;
}
static void f_arena_free(mgc_backend *be, void *arena) {
    fenced *f = (fenced *)be;
    f->cpu->iface->arena_free(f->cpu, near_(arena));
}
static int f_bind(mgc_backend *be, const mgc_plan *p, const mgc_stage_program *sp, void *a) {
    FENCED(bind(f->cpu, p, sp, near_(a)));
}
static int f_run_op(mgc_backend *be, const mgc_op_call *c) {
    mgc_op_call n = *c;
    for (int i = 0; i < MGC_PLAN_MAX_IO; i++)
        n.in[i] = near_(c->in[i]), n.out[i] = near_(c->out[i]);
    FENCED(run_op(f->cpu, &n));
}
static int f_copy(mgc_backend *be, void *d, const void *s, size_t n) {
    FENCED(copy(f->cpu, near_(d), near_(s), n));
}
static int f_upload(mgc_backend *be, void *d, const void *h, size_t n) {
    __atomic_add_fetch(&fenced_staged, (long)n, __ATOMIC_RELAXED);
    FENCED(upload(f->cpu, near_(d), h, n));
}
static int f_download(mgc_backend *be, void *h, const void *s, size_t n) {
    __atomic_add_fetch(&fenced_staged, (long)n, __ATOMIC_RELAXED);
    FENCED(download(f->cpu, h, near_(s), n));
}
static int f_zero(mgc_backend *be, void *d, size_t n) {
    FENCED(zero(f->cpu, near_(d), n));
}
/* the optimizer's lists a tensor at a time, each address brought near (the sum in list order,
 * as the CPU backend's) */
static int f_sumsq(mgc_backend *be, const float *const *g, const int64_t *n, int64_t count,
                   double *out) {
    fenced *f = (fenced *)be;
    double s = 0;
    for (int64_t i = 0; i < count; i++) {
        const float *gi = near_(g[i]);
        double v;
        if (f->cpu->iface->sumsq(f->cpu, &gi, &n[i], 1, &v)) {
            snprintf(be->err, sizeof be->err, "%s", f->cpu->err);
            return -1;
        }
        s += v;
    }
    *out = s;
    return 0;
}
static int f_adamw(mgc_backend *be, const mgc_adamw_tensor *t, int64_t count,
                   const mgc_adamw_step *s) {
    fenced *f = (fenced *)be;
    for (int64_t i = 0; i < count; i++) {
        mgc_adamw_tensor n = t[i];
        n.p = near_(n.p), n.g = near_(n.g), n.m = near_(n.m), n.v = near_(n.v);
        n.copy16 = near_(n.copy16);
        if (f->cpu->iface->adamw(f->cpu, &n, 1, s)) {
            snprintf(be->err, sizeof be->err, "%s", f->cpu->err);
            return -1;
        }
    }
    return 0;
}
static int f_sync(mgc_backend *be) {
    FENCED(sync(f->cpu));
}
static int f_threads(mgc_backend *be, int n) {
    FENCED(set_threads(f->cpu, n));
}
/* the transfer slots of the gradient reducer: the CPU has no queue to order after, so a
 * mark is only checked for being passed along */
static long fenced_xfers; /* xfer_download calls (the reducer's), all ranks */
static int f_mark(mgc_backend *be, void **mark) {
    (void)be;
    *mark = (void *)&fenced_xfers;
    return 0;
}
static int f_xdown(mgc_backend *be, void *mark, void *h, const void *s, size_t n, char *err, size_t errsz) {
    (void)be;
    if (mark != (void *)&fenced_xfers) return snprintf(err, errsz, "no mark"), -1;
    __atomic_add_fetch(&fenced_xfers, 1, __ATOMIC_RELAXED);
    __atomic_add_fetch(&fenced_staged, (long)n, __ATOMIC_RELAXED);
    memcpy(h, near_(s), n);
    return 0;
}
static int f_xup(mgc_backend *be, void *d, const void *h, size_t n, char *err, size_t errsz) {
    (void)be, (void)err, (void)errsz;
    __atomic_add_fetch(&fenced_staged, (long)n, __ATOMIC_RELAXED);
    memcpy(near_(d), h, n);
    return 0;
}
/* Pipeline sends beside the compute.  A download happens as late as the executor allows: at
 * p2p_wait (the sender, before it sends) or p2p_fence (the executor, before the compute that
 * may reuse the bytes), whichever comes first.  A missing fence therefore sends bytes the
 * compute has overwritten since, and the rerun's bits differ. */
struct lazy_copy {
    pthread_mutex_t mu;
    void *host;
    const void *src; /* near */
    size_t n;
    int pending;
};
static long fenced_sends; /* p2p_download calls, all ranks */
static long fenced_fences; /* p2p_fence calls that found their download still pending */
static int f_pdown(mgc_backend *be, void *h, const void *s, size_t n, void **done, char *err,
                   size_t errsz) {
    fenced *f = (fenced *)be;
    lazy_copy *c = *done;
    if (!c) {
        if (f->n_lazy == f->cap_lazy) {
            int m = f->cap_lazy ? 2 * f->cap_lazy : 8;
            lazy_copy **a = realloc(f->lazy, (size_t)m * sizeof *a);
            if (!a) return snprintf(err, errsz, "out of memory"), -1;
            f->lazy = a, f->cap_lazy = m;
        }
        if (!(c = calloc(1, sizeof *c)) || pthread_mutex_init(&c->mu, NULL))
            return free(c), snprintf(err, errsz, "out of memory"), -1;
        f->lazy[f->n_lazy++] = c;
        *done = c;
    }
    pthread_mutex_lock(&c->mu);
    int again = c->pending;
    c->host = h, c->src = near_(s), c->n = n, c->pending = 1;
    pthread_mutex_unlock(&c->mu);
    if (again) return snprintf(err, errsz, "a send's handle reused before its download"), -1;
    __atomic_add_fetch(&fenced_sends, 1, __ATOMIC_RELAXED);
    __atomic_add_fetch(&fenced_staged, (long)n, __ATOMIC_RELAXED);
    return 0;
}
static int lazy_run(void *done, long *counter) {
    lazy_copy *c = done;
    if (!c) return -1;
    pthread_mutex_lock(&c->mu);
    if (c->pending) {
        memcpy(c->host, c->src, c->n);
        c->pending = 0;
        if (counter) __atomic_add_fetch(counter, 1, __ATOMIC_RELAXED);
    }
    pthread_mutex_unlock(&c->mu);
    return 0;
}
static int f_pwait(mgc_backend *be, void *done, char *err, size_t errsz) {
    (void)be;
    return lazy_run(done, NULL) ? snprintf(err, errsz, "no handle"), -1 : 0;
}
static int f_pfence(mgc_backend *be, void *done, char *err, size_t errsz) {
    (void)be;
    return lazy_run(done, &fenced_fences) ? snprintf(err, errsz, "no handle"), -1 : 0;
}
static void f_close(mgc_backend *be) {
    fenced *f = (fenced *)be;
    mgc_backend_close(f->cpu);
    for (int i = 0; i < f->n_lazy; i++) {
        pthread_mutex_destroy(&f->lazy[i]->mu);
        free(f->lazy[i]);
    }
    free(f->lazy);
    free(f);
}
static const mgc_backend_iface fenced_iface = {
    .name = "cpu", /* its kernels and precision are the CPU backend's */
    .arena_alloc = f_arena_alloc, .arena_free = f_arena_free, .bind = f_bind,
    .run_op = f_run_op, .copy = f_copy, .upload = f_upload, .download = f_download,
    .zero = f_zero, .sumsq = f_sumsq, .adamw = f_adamw,
    .sync = f_sync, .set_threads = f_threads, .close = f_close, .device_memory = 1,
    .xfer_mark = f_mark, .xfer_download = f_xdown, .xfer_upload = f_xup,
    .p2p_download = f_pdown, .p2p_wait = f_pwait, .p2p_fence = f_pfence,
};

static int fenced_open(void *ctx, int64_t rank, mgc_backend **out, char *err, size_t errsz) {
    (void)ctx, (void)rank;
    fenced *f = calloc(1, sizeof *f);
    if (!f || mgc_backend_cpu_open(&f->cpu, err, errsz)) {
        free(f);
        return -1;
    }
    f->be.iface = &fenced_iface;
    *out = &f->be;
    return 0;
}

/* A device communicator (exec.h mgc_exec_set_device_comm): train_with runs the ranks with a
 * moves-only local world beside the host one, on CPU backends whose folds are counted. */
static int g_device_comm;
static long folds;
static mgc_backend_iface folding_iface;
static int (*cpu_fold)(mgc_backend *, void *, const void *, int, size_t, size_t, int, int);
static pthread_mutex_t folding_mu = PTHREAD_MUTEX_INITIALIZER;
static int folding_ready;
static int counted_fold(mgc_backend *be, void *dst, const void *src, int parts, size_t count,
                        size_t stride, int dt, int op) {
    __atomic_add_fetch(&folds, 1, __ATOMIC_RELAXED);
    return cpu_fold(be, dst, src, parts, count, stride, dt, op);
}
static int folding_open(void *ctx, int64_t rank, mgc_backend **out, char *err, size_t errsz) {
    (void)ctx, (void)rank;
    if (mgc_backend_cpu_open(out, err, errsz)) return -1;
    pthread_mutex_lock(&folding_mu);
    if (!folding_ready) { /* the CPU backend's table (the same on every rank), fold counted */
        folding_iface = *(*out)->iface;
        cpu_fold = folding_iface.fold;
        folding_iface.fold = counted_fold;
        folding_ready = 1;
    }
    pthread_mutex_unlock(&folding_mu);
    (*out)->iface = &folding_iface;
    return 0;
}

/* Trains the plan; losses and norms out.  0 on success.  fenced_arena: on far arenas;
 * overlap: gradient buckets reduced beside the backward (else in line); overlapped: (STEPS)
 * rank 0's buckets so reduced, or NULL. */
static int train_with(const mgc_plan *p, int fenced_arena, int overlap, int64_t *overlapped,
                      double *loss, double *norm) {
    char err[4096];
    mgc_train_data *data = NULL;
    if (mgc_train_data_open(&data, p, STEPS, err, sizeof err)) {
        fprintf(stderr, "data: %s\n", err);
        return -1;
    }
    mgc_train_opts o = MGC_TRAIN_OPTS_INIT;
    o.iterations = STEPS;
    o.losses = loss;
    o.grad_norms = norm;
    o.timeout_ms = 120000;
    if (fenced_arena) o.open_backend = fenced_open;
    if (g_device_comm) o.device_comm = "local", o.open_backend = folding_open;
    o.no_grad_overlap = !overlap;
    o.overlapped = overlapped;
    for (int i = 0; i < STEPS; i++)
        loss[i] = norm[i] = NAN; /* poisoned: every step must write its own */
    int rc = mgc_train_local(p, data, (int)p->grid.world, &o, err, sizeof err);
    if (rc) fprintf(stderr, "train: %s\n", err);
    mgc_train_data_free(data);
    return rc;
}

static int train_on(const mgc_plan *p, int fenced_arena, double *loss, double *norm) {
    return train_with(p, fenced_arena, 1, NULL, loss, norm);
}

static int train(const mgc_plan *p, double *loss, double *norm) {
    return train_on(p, 0, loss, norm);
}

/* Gradient reduction beside the backward changes only when a bucket is reduced: on and off
 * give the same bits, on host and far arenas, and with it on, buckets are handed over
 * (the far arena's through the transfer slots). */
static void check_overlap(const char *path, const char *const *sets) {
    mgc_plan *p = compile(path, NULL, sets);
    T_CHECK(p != NULL);
    if (!p) return;
    double l[4][STEPS], n[4][STEPS];
    int64_t ov[4][STEPS];
    long x0 = fenced_xfers;
    for (int k = 0; k < 4; k++) {
        for (int i = 0; i < STEPS; i++)
            ov[k][i] = -1;
        T_EQ_I64(train_with(p, k >> 1, k & 1, ov[k], l[k], n[k]), 0);
    }
    long xfers = fenced_xfers - x0;
    int same = 1;
    for (int k = 1; k < 4; k++) {
        T_CHECK(memcmp(l[k], l[0], sizeof l[0]) == 0);
        T_CHECK(memcmp(n[k], n[0], sizeof n[0]) == 0);
        same = same && !memcmp(l[k], l[0], sizeof l[0]) && !memcmp(n[k], n[0], sizeof n[0]);
    }
    int64_t on = 0;
    for (int i = 0; i < STEPS; i++) {
        T_EQ_I64(ov[0][i], 0);
        T_EQ_I64(ov[2][i], 0);
        T_CHECK(ov[1][i] > 0 && ov[1][i] == ov[3][i]);
        on += ov[1][i];
    }
    T_CHECK(xfers > 0);
    printf("%s", path);
    for (int i = 0; sets[i]; i++)
        printf(" %s", sets[i]);
    printf(": %lld buckets reduced beside the backward over %d steps (%ld transfer-slot "
           "downloads on the far arena); overlap on and off, host and far arena: %s\n",
           (long long)on, STEPS, xfers, same ? "bit-identical" : "DIFFER");
    mgc_plan_free(p);
}

/* The device communicator's path (exec.h mgc_exec_set_device_comm; comm.h moves-only
 * communicators): every collective on arena memory goes to a moves-only world, reductions are
 * composed from all-to-alls and the backend's fold.  The same bits as the host communicator's,
 * and the folds run (the path was taken). */
static void check_device_comm(const char *path, const char *const *sets) {
    mgc_plan *p = compile(path, NULL, sets);
    T_CHECK(p != NULL);
    if (!p) return;
    double l[2][STEPS], n[2][STEPS];
    T_EQ_I64(train(p, l[0], n[0]), 0);
    long f0 = folds;
    g_device_comm = 1;
    T_EQ_I64(train(p, l[1], n[1]), 0);
    g_device_comm = 0;
    long f = folds - f0;
    int same = !memcmp(l[0], l[1], sizeof l[0]) && !memcmp(n[0], n[1], sizeof n[0]);
    T_CHECK(same);
    T_CHECK(f > 0);
    printf("%s", path);
    for (int i = 0; sets[i]; i++)
        printf(" %s", sets[i]);
    printf(": device communicator (moves-only, %ld folds over %d steps): %s\n", f, STEPS,
           same ? "bit-identical to the host communicator" : "DIFFERS");
    mgc_plan_free(p);
}

/* MoE load (mgc_step_stats.expert_counts): on one rank, each step's counts against the
 * router's choices read by an op hook (each route's expert ids counted per layer, capped at the
 * dispatch's capacity per microbatch in capacity mode); dropless, every MoE layer's total is the
 * step's tokens x top-k and a dense layer's is 0; with a capacity, some are dropped; and the
 * first step's counts are the same under ep2, etp2 x ep2, pp2 x vp2, tp2 + SP and cp2 (the
 * same router inputs up to rounding: the same choices). */
/* One rank of a plan on the CPU backend, stepped directly (mgc_exec_step), its parameters
 * initialised and `steps` steps of training data open: 1, or 0 when something failed. */
typedef struct one_rank {
    mgc_backend *be;
    mgc_comm *w;
    mgc_exec *x;
    mgc_train_data *data;
} one_rank;

static int one_rank_open(one_rank *r, const mgc_plan *p, int64_t steps) {
    char err[4096];
    memset(r, 0, sizeof *r);
    int ok = mgc_backend_cpu_open(&r->be, err, sizeof err) == 0 &&
             mgc_comm_local_world_create(1, NULL, &r->w, err, sizeof err) == MGC_COMM_OK &&
             mgc_exec_open(&r->x, p, r->w, r->be, err, sizeof err) == 0 &&
             mgc_exec_init_params(r->x) == 0 &&
             mgc_train_data_open(&r->data, p, steps, err, sizeof err) == 0;
    if (!ok) fprintf(stderr, "one rank: %s\n", err);
    return ok;
}

static void one_rank_close(one_rank *r) {
    mgc_exec_free(r->x);
    mgc_train_data_free(r->data);
    mgc_backend_close(r->be);
    mgc_comm_free(r->w);
}

typedef struct route_ref {
    int64_t L, E;
    int64_t *routed; /* (L x E) the current microbatch's routed counts */
    int64_t *kept;   /* (L x E) the step's counts, capped per microbatch */
} route_ref;

static int64_t layer_of(const mgc_op_call *c) {
    const char *p = strstr(mgc_plan_strat(c->plan, c->op->name), "layers.");
    return p ? strtoll(p + 7, NULL, 10) : -1;
}

static void route_hook(void *ctx, const mgc_op_call *c) {
    route_ref *r = ctx;
    const mgc_plan_op *op = c->op;
    int64_t l = layer_of(c);
    if (l < 0 || l >= r->L || op->iattr[0] != 0) return;
    if (op->kind == MGC_POP_MOE_ROUTE) { /* out[1]: (tokens, k) expert ids */
        const mgc_plan_tensor *t = &c->chunk->tensors[op->out[1]];
        int64_t n = 1;
        for (int d = 0; d < t->rank; d++)
            n *= t->dim[d];
        const int32_t *ids = c->out[1];
        for (int64_t e = 0; e < r->E; e++)
            r->routed[l * r->E + e] = 0;
        for (int64_t a = 0; a < n; a++)
            r->routed[l * r->E + ids[a]]++;
    } else if (op->kind == MGC_POP_MOE_DISPATCH) {
        int64_t cap = op->iattr[2];
        for (int64_t e = 0; e < r->E; e++) {
            int64_t v = r->routed[l * r->E + e];
            r->kept[l * r->E + e] += cap > 0 && v > cap ? cap : v;
        }
    }
}

static void check_expert_counts_one(const char *const *sets, int capped, int big) {
    mgc_plan *p = compile("models/tiny-moe.yaml", NULL, sets);
    T_CHECK(p != NULL);
    if (!p) return;
    one_rank o;
    int ok = one_rank_open(&o, p, 3);
    T_CHECK(ok);
    mgc_exec *x = o.x;
    int64_t L = 0, E = 0, dropped = 0, moe_layers = 0, most = 0;
    mgc_plan_config_int(p, "model.num_layers", &L);
    mgc_plan_config_int(p, "moe.num_experts", &E);
    route_ref r = {L, E, calloc((size_t)(L * E), 8), calloc((size_t)(L * E), 8)};
    if (ok) mgc_exec_set_op_hooks(x, NULL, route_hook, &r);
    int same = 1;
    for (int it = 0; ok && it < 3; it++) {
        memset(r.kept, 0, (size_t)(L * E) * 8);
        mgc_step_stats st;
        T_EQ_I64(mgc_exec_step(x, it, mgc_train_data_sample, o.data, &st), 0);
        T_CHECK(st.expert_counts != NULL && st.moe_layers == L && st.moe_experts == E);
        if (!st.expert_counts) break;
        same = same && !memcmp(st.expert_counts, r.kept, (size_t)(L * E) * 8);
        moe_layers = 0;
        for (int64_t l = 0; l < L; l++) {
            int64_t sum = 0;
            for (int64_t e = 0; e < E; e++) {
                sum += st.expert_counts[l * E + e];
                if (st.expert_counts[l * E + e] > most) most = st.expert_counts[l * E + e];
            }
            if (!sum) continue; /* a dense layer */
            moe_layers++;
            if (capped) {
                T_CHECK(sum <= st.moe_assignments);
                dropped += st.moe_assignments - sum;
            } else {
                T_EQ_I64(sum, st.moe_assignments);
            }
        }
        T_CHECK(moe_layers > 0);
    }
    T_CHECK(same);
    if (capped) T_CHECK(dropped > 0);
    if (big) T_CHECK(most > 4095); /* the all-reduce's high 12-bit digit is used */
    printf("models/tiny-moe.yaml%s: expert counts of %lld MoE layers over 3 steps %s the router's "
           "choices%s (%lld assignments dropped, busiest expert %lld)\n",
           capped ? " (capacity 1.0)"
           : big  ? " (global batch 512)"
                  : "",
           (long long)moe_layers, same ? "match" : "DIFFER from",
           capped ? " capped per microbatch" : "", (long long)dropped, (long long)most);
    one_rank_close(&o);
    mgc_plan_free(p);
    free(r.routed), free(r.kept);
}

static void check_expert_counts(void) {
    static const char *const cap[] = {"moe.capacity_factor=1.0", NULL};
    /* 16,384 tokens a step (32,768 assignments, 4,096 an expert on average): the busiest
     * expert takes more than 4,095 */
    static const char *const big[] = {"training.global_batch_size=512",
                                      "training.micro_batch_size=32", NULL};
    check_expert_counts_one(NULL, 0, 0);
    check_expert_counts_one(cap, 1, 0);
    check_expert_counts_one(big, 0, 1);
    /* the first step's counts in other layouts */
    int64_t L = 0, E = 0;
    mgc_plan *p1 = compile("models/tiny-moe.yaml", NULL, NULL);
    T_CHECK(p1 != NULL);
    if (!p1) return;
    mgc_plan_config_int(p1, "model.num_layers", &L);
    mgc_plan_config_int(p1, "moe.num_experts", &E);
    size_t n = (size_t)(L * E);
    int64_t *base = calloc(STEPS * n, 8), *got = calloc(STEPS * n, 8);
    double loss[STEPS], norm[STEPS];
    mgc_train_opts o = MGC_TRAIN_OPTS_INIT;
    char err[4096];
    mgc_train_data *data = NULL;
    T_EQ_I64(mgc_train_data_open(&data, p1, STEPS, err, sizeof err), 0);
    o.iterations = STEPS, o.losses = loss, o.grad_norms = norm, o.expert_counts = base;
    T_EQ_I64(mgc_train_local(p1, data, 1, &o, err, sizeof err), 0);
    mgc_train_data_free(data);
    mgc_plan_free(p1);
    static const struct {
        const char *name;
        const char *sets[8];
    } lays[] = {
        {"ep2", {"parallel.world_size=2", "parallel.data=2", "parallel.expert=2"}},
        {"etp2 ep2",
         {"parallel.world_size=4", "parallel.tensor=2", "parallel.sequence_parallel=true",
          "parallel.data=2", "parallel.expert=2"}},
        {"pp2 interleaved",
         {"parallel.world_size=2", "parallel.pipeline=2", "parallel.virtual_stages=2"}},
        {"tp2+sp",
         {"parallel.world_size=2", "parallel.tensor=2", "parallel.sequence_parallel=true",
          "parallel.expert_tensor=1"}},
        {"cp2", {"parallel.world_size=2", "parallel.context=2"}},
    };
    for (size_t i = 0; i < sizeof lays / sizeof lays[0]; i++) {
        mgc_plan *p = compile("models/tiny-moe.yaml", NULL, lays[i].sets);
        T_CHECK(p != NULL);
        if (!p) continue;
        memset(got, 0xff, STEPS * n * 8); /* poisoned */
        data = NULL;
        T_EQ_I64(mgc_train_data_open(&data, p, STEPS, err, sizeof err), 0);
        o.expert_counts = got;
        int rc = mgc_train_local(p, data, (int)p->grid.world, &o, err, sizeof err);
        T_EQ_I64(rc, 0);
        int same = !memcmp(base, got, n * 8);
        T_CHECK(same);
        printf("models/tiny-moe.yaml %-16s: the first step's expert counts %s one rank's\n",
               lays[i].name, same ? "equal" : "DIFFER from");
        mgc_train_data_free(data);
        mgc_plan_free(p);
    }
    free(base), free(got);
}

/* Every parameter receives a gradient: one step on one rank, then each
 * parameter's gradient must have a non-zero element.  (Equivalence across
 * layouts cannot see a gradient that is missing everywhere; this can.) */
static void check_all_grads(const char *path, const char *const *sets) {
    mgc_plan *p = compile(path, NULL, sets);
    T_CHECK(p != NULL);
    if (!p) return;
    one_rank o;
    int ok = one_rank_open(&o, p, 1);
    T_CHECK(ok);
    mgc_exec *x = o.x;
    mgc_step_stats st;
    if (ok) T_EQ_I64(mgc_exec_step(x, 0, mgc_train_data_sample, o.data, &st), 0);
    int64_t zero = 0;
    for (int64_t i = 0; ok && i < mgc_exec_param_count(x); i++) {
        const mgc_exec_param *e = mgc_exec_param_at(x, i);
        int any = 0;
        for (int64_t k = 0; k < e->numel && !any; k++)
            any = e->grad[k] != 0.0f;
        if (!any) {
            fprintf(stderr, "%s: parameter %s got no gradient\n", path, e->name);
            zero++;
        }
    }
    T_EQ_I64(zero, 0);
    printf("%s%s%s: all %lld parameters receive a gradient\n", path, sets ? " " : "",
           sets ? sets[0] : "", (long long)(x ? mgc_exec_param_count(x) : 0));
    one_rank_close(&o);
    mgc_plan_free(p);
}

/* ---- data.eod_mask_loss ------------------------------------------------------------------
 * The cross-entropy's inputs are checked against the samples read here, independently: the
 * labels are the next tokens, and the mask is 0 exactly where the input token is the
 * end-of-document token (Megatron's eod_mask_loss), 1 elsewhere. */
typedef struct eod_ctx {
    mgc_train_data *data;
    int64_t step, mbs, gbs, seen, masked, bad;
} eod_ctx;

static void eod_before(void *ctx, const mgc_op_call *c) {
    eod_ctx *e = ctx;
    const mgc_plan_op *op = c->op;
    if (op->kind != MGC_POP_CROSS_ENTROPY || op->n_in < 3) return;
    const mgc_plan_tensor *lt = &c->chunk->tensors[op->in[1]], *mt = &c->chunk->tensors[op->in[2]];
    if (lt->dtype != MGC_DT_I64 || mt->dtype != MGC_DT_F32 || lt->rank != 2) return;
    int64_t s = lt->dim[0], B = lt->dim[1];
    const int64_t *lab = c->in[1];
    const float *mask = c->in[2];
    int32_t tok[1024];
    char err[512];
    for (int64_t bi = 0; bi < B; bi++) {
        int64_t sample = e->step * e->gbs + c->microbatch * e->mbs + bi;
        if (s + 1 > 1024 || mgc_train_data_sample(e->data, sample, tok, err, sizeof err)) {
            e->bad++;
            continue;
        }
        for (int64_t i = 0; i < s; i++) {
            float want = tok[i] == 256 ? 0.0f : 1.0f;
            e->bad += lab[i * B + bi] != tok[i + 1] || mask[i * B + bi] != want;
            e->masked += want == 0.0f;
            e->seen++;
        }
    }
}

static void check_eod_mask(void) {
    static const char *const on[] = {"data.eod_mask_loss=true", NULL};
    mgc_plan *p = compile("examples/tiny-gpt.yaml", on, NULL), *q = compile("examples/tiny-gpt.yaml", NULL, NULL);
    T_CHECK(p && q);
    double lm[STEPS], l0[STEPS], n0[STEPS];
    t_rank r;
    eod_ctx e = {0};
    int ok = q && t_rank_open(&r, p, 1) == 0 &&
             mgc_train_data_open(&e.data, p, STEPS, r.err, sizeof r.err) == 0;
    T_CHECK(ok);
    if (ok) {
        e.mbs = p->micro_batch_size;
        e.gbs = p->micro_batch_size * p->num_microbatches * p->grid.dp;
        mgc_exec_set_op_hooks(r.x, eod_before, NULL, &e);
    }
    for (int it = 0; ok && it < STEPS; it++) {
        mgc_step_stats st;
        e.step = it;
        ok = mgc_exec_step(r.x, it, mgc_train_data_sample, e.data, &st) == 0;
        T_CHECK(ok);
        lm[it] = st.loss;
        T_CHECK(isfinite(st.grad_norm) && st.grad_norm > 0);
    }
    t_rank_close(&r);
    mgc_train_data_free(e.data);
    /* every token of every step seen; some masked (documents end inside samples); none wrong */
    T_EQ_I64(e.seen, (int64_t)STEPS * (p ? p->micro_batch_size * p->num_microbatches * p->seq_length : 0));
    T_CHECK(e.masked > 0);
    T_EQ_I64(e.bad, 0);
    /* the mask changes the loss (fewer tokens) and the run still learns */
    T_CHECK(q && train(q, l0, n0) == 0);
    T_CHECK(lm[0] != l0[0]);
    T_CHECK(lm[STEPS - 1] < lm[0] - 0.1);
    printf("eod_mask_loss: %lld of %lld tokens masked (input = end of document), every label and mask as "
           "the samples say; loss %.6f -> %.6f (unmasked %.6f -> %.6f)\n",
           (long long)e.masked, (long long)e.seen, lm[0], lm[STEPS - 1], l0[0], l0[STEPS - 1]);
    mgc_plan_free(p);
    mgc_plan_free(q);
}

/* ---- documents in a sample (data.reset_attention_mask) -------------------------------- */

/* Samples of documents: tokens 0 .. cut-1 (the last of them the end-of-document token) drawn
 * from `first_seed`; then document B, tokens cut .. cut+len-1 (len 0: to the end; else its last
 * is the end-of-document token) drawn from a fixed stream by their place in B; then tokens of a
 * third stream.  The sample index mixes in. */
typedef struct docs_ctx {
    int64_t s, cut, len, eod, vocab;
    uint64_t first_seed;
    int rotated;            /* capture the first layer's rotated queries, not the attention */
    float *last;            /* the last layer's attention output over B (or the first layer's
                               rotated queries), microbatch 0 */
    int64_t last_n, layer;  /* its elements; the layer it came from */
} docs_ctx;

static int docs_sample(void *ctx, int64_t sample, int32_t *tok, char *err, size_t errsz) {
    docs_ctx *d = ctx;
    (void)err, (void)errsz;
    int64_t end = d->len ? d->cut + d->len : d->s + 1;
    for (int64_t i = 0; i <= d->s; i++) {
        uint64_t seed = i < d->cut ? d->first_seed : i < end ? 99 : 77;
        uint64_t at = i >= d->cut && i < end ? (uint64_t)(i - d->cut) : (uint64_t)i;
        tok[i] = (int32_t)(mgc_rng_u32(seed, (uint64_t)sample, at) % (uint32_t)(d->vocab - 1));
    }
    if (d->cut > 0) tok[d->cut - 1] = (int32_t)d->eod;
    if (d->len) tok[end - 1] = (int32_t)d->eod;
    return 0;
}

static void docs_after(void *ctx, const mgc_op_call *c) {
    docs_ctx *d = ctx;
    const mgc_plan_op *op = c->op;
    int want = d->rotated ? op->kind == MGC_POP_QKV_SPLIT && (op->flags & MGC_POF_ROPE) && op->layer == 0
                          : op->kind == MGC_POP_ATTENTION && op->layer >= d->layer;
    if (!want || (op->flags & MGC_POF_RECOMPUTE) || c->microbatch != 0 || c->iteration != 0) return;
    const mgc_plan_tensor *o = &c->chunk->tensors[op->out[0]];
    int64_t row = (int64_t)(o->bytes / 4) / o->dim[0], n = (d->len ? d->len : d->s - d->cut) * row;
    free(d->last);
    d->last = malloc((size_t)n * sizeof *d->last);
    if (d->last) memcpy(d->last, (const float *)c->out[0] + d->cut * row, (size_t)n * sizeof *d->last);
    d->last_n = n, d->layer = op->layer;
}

/* One training step's last attention output over the second document, on one rank. */
static int docs_run(const mgc_plan *p, docs_ctx *d) {
    t_rank r;
    int ok = t_rank_open(&r, p, 1) == 0;
    if (ok) mgc_exec_set_op_hooks(r.x, NULL, docs_after, d);
    mgc_step_stats st;
    ok = ok && mgc_exec_step(r.x, 0, docs_sample, d, &st) == 0;
    if (!ok) fprintf(stderr, "docs_run: %s\n", t_rank_error(&r));
    t_rank_close(&r);
    return ok && d->last ? 0 : -1;
}

/* out[on][v]: an output of n floats for two variants of a sample (v), with an option (on = 1)
 * and without: with it the two must be the same bits, without it they must differ.  The
 * largest difference without it; -1 when an output is missing (failed). */
static double same_with_differs_without(float *out[2][2], int64_t n) {
    int ok = n > 0 && out[0][0] && out[0][1] && out[1][0] && out[1][1];
    T_CHECK(ok);
    if (!ok) return -1;
    T_CHECK(memcmp(out[1][0], out[1][1], (size_t)n * sizeof(float)) == 0);
    T_CHECK(memcmp(out[0][0], out[0][1], (size_t)n * sizeof(float)) != 0);
    double diff = 0;
    for (int64_t i = 0; i < n; i++)
        diff = fmax(diff, fabs((double)out[0][0][i] - out[0][1][i]));
    return diff;
}

/* With the documents' attention mask, the second document of a sample cannot see the first:
 * the last layer's attention output over it is the same bits whatever the first document's
 * tokens are; without the mask it changes. */
static void check_docs(void) {
    static const char *const on[] = {"data.reset_attention_mask=true", NULL};
    mgc_plan *p = compile("examples/tiny-gpt.yaml", on, NULL), *q = compile("examples/tiny-gpt.yaml", NULL, NULL);
    T_CHECK(p && q);
    if (!p || !q) goto out;
    int64_t eod = 256, vocab = 257;
    float *out[2][2] = {{NULL, NULL}, {NULL, NULL}};
    int64_t n = 0;
    for (int masked = 0; masked < 2; masked++)
        for (int v = 0; v < 2; v++) {
            docs_ctx d = {p->seq_length, p->seq_length / 2 - 3, 0, eod, vocab, 1000u + (uint64_t)v,
                          0, NULL, 0, 0};
            T_EQ_I64(docs_run(masked ? p : q, &d), 0);
            out[masked][v] = d.last, n = d.last_n;
        }
    double diff = same_with_differs_without(out, n);
    if (diff >= 0)
        printf("reset_attention_mask: the second document's last attention output (%lld values) "
               "bit-identical whatever the first document holds; without the mask it moves by up to "
               "%.2e\n", (long long)n, diff);
    for (int i = 0; i < 4; i++)
        free(out[i / 2][i % 2]);
out:
    mgc_plan_free(p);
    mgc_plan_free(q);
}

/* The first layer's attention output at rows [from, s) of microbatch 0 of one step. */
typedef struct win_ctx {
    docs_ctx tokens; /* the samples (docs_sample): tokens before `cut` from their own seed */
    int64_t from;
    float *out;
    int64_t n;
} win_ctx;

static int win_sample(void *ctx, int64_t sample, int32_t *tok, char *err, size_t errsz) {
    return docs_sample(&((win_ctx *)ctx)->tokens, sample, tok, err, errsz);
}

static void win_after(void *ctx, const mgc_op_call *c) {
    win_ctx *w = ctx;
    const mgc_plan_op *op = c->op;
    if (op->kind != MGC_POP_ATTENTION || op->layer != 0 || (op->flags & MGC_POF_RECOMPUTE) ||
        c->microbatch != 0 || c->iteration != 0)
        return;
    const mgc_plan_tensor *o = &c->chunk->tensors[op->out[0]];
    int64_t row = (int64_t)(o->bytes / 4) / o->dim[0];
    w->n = (o->dim[0] - w->from) * row;
    if (w->n <= 0) return;
    free(w->out);
    w->out = malloc((size_t)w->n * sizeof *w->out);
    if (w->out) memcpy(w->out, (const float *)c->out[0] + w->from * row, (size_t)w->n * sizeof *w->out);
}

/* A sliding window of W keys: the first layer's attention output at a position depends on the
 * tokens of its window only, so rows at cut + W - 1 and later are the same bits whatever the
 * tokens before `cut` are; without the window they move. */
static void check_window(void) {
    static const char *const on[] = {"model.window_size=6", NULL};
    mgc_plan *p = compile("models/tiny-llama.yaml", on, NULL), *q = compile("models/tiny-llama.yaml", NULL, NULL);
    T_CHECK(p && q);
    float *out[2][2] = {{NULL, NULL}, {NULL, NULL}};
    int64_t n = 0, cut = 8, W = 6; /* of a 32-token sequence */
    for (int w = 0; p && q && w < 2; w++)
        for (int v = 0; v < 2; v++) {
            win_ctx x = {{p->seq_length, cut, 0, 256, 257, 3000u + (uint64_t)v, 0, NULL, 0, 0}, cut + W - 1,
                         NULL, 0};
            t_rank r;
            int ok = t_rank_open(&r, w ? p : q, 1) == 0;
            if (ok) mgc_exec_set_op_hooks(r.x, NULL, win_after, &x);
            mgc_step_stats st;
            ok = ok && mgc_exec_step(r.x, 0, win_sample, &x, &st) == 0;
            if (!ok) fprintf(stderr, "check_window: %s\n", t_rank_error(&r));
            t_rank_close(&r);
            T_CHECK(ok && x.out);
            out[w][v] = x.out, n = x.n;
        }
    double diff = same_with_differs_without(out, n);
    if (diff >= 0)
        printf("window_size %lld: the first layer's attention output from position %lld on (%lld "
               "values) bit-identical whatever the tokens before %lld are; without the window it "
               "moves by up to %.2e\n",
               (long long)W, (long long)(cut + W - 1), (long long)n, (long long)cut, diff);
    for (int i = 0; i < 4; i++)
        free(out[i / 2][i % 2]);
    mgc_plan_free(p);
    mgc_plan_free(q);
}

/* A 12-token document at the start of a sample and after another of 9 tokens, under plan `on`
 * (positions restarting) and plan `off` (positions running on): what `rotated` captures of it
 * (docs_ctx) must differ by at most `same` (relative) under `on`, and by more than 1e-2 under
 * `off`.  The worst differences out. */
static void doc_offsets(const char *path, const char *const *on, const char *const *off, int rotated,
                        double same, double worst[2]) {
    mgc_plan *p = compile(path, on, NULL), *q = compile(path, off, NULL);
    float *o[2][2] = {{NULL, NULL}, {NULL, NULL}};
    int64_t n = 0;
    worst[0] = worst[1] = NAN;
    T_CHECK(p && q);
    for (int reset = 0; p && q && reset < 2; reset++)
        for (int v = 0; v < 2; v++) {
            docs_ctx d = {p->seq_length, v ? 9 : 0, 12, 256, 257, 5000, rotated, NULL, 0, 0};
            T_EQ_I64(docs_run(reset ? p : q, &d), 0);
            o[reset][v] = d.last, n = d.last_n;
        }
    int ok = n > 0 && o[0][0] && o[0][1] && o[1][0] && o[1][1];
    T_CHECK(ok);
    if (ok) {
        double scale = 0;
        worst[0] = worst[1] = 0;
        for (int64_t i = 0; i < n; i++) {
            scale = fmax(scale, fabs((double)o[1][0][i]));
            for (int r = 0; r < 2; r++)
                worst[r] = fmax(worst[r], fabs((double)o[r][0][i] - o[r][1][i]));
        }
        T_CHECK(scale > 0);
        T_CHECK(worst[1] <= same * scale);
        T_CHECK(worst[0] > 1e-2 * scale);
        worst[0] /= scale, worst[1] /= scale;
    }
    for (int i = 0; i < 4; i++)
        free(o[i / 2][i % 2]);
    mgc_plan_free(p);
    mgc_plan_free(q);
}

/* Positions restarting (data.reset_position_ids).  Rotary (tiny LLaMA): a document's rotated
 * queries in the first layer are the same wherever it sits in the sample, to rounding (the
 * same bits where the BLAS rounds a row alike at every row index; OpenBLAS on an AMD EPYC does
 * not, 3.3e-7 relative), and move with it when positions run on (with the documents' attention mask, rotary attention would not tell:
 * it sees relative positions only).  Learned (tiny GPT, with the mask): the document computes
 * the same wherever it sits, its last attention output within rounding; not so with positions
 * running on. */
static void check_doc_positions(void) {
    static const char *const on[] = {"data.reset_position_ids=true", NULL};
    static const char *const both[] = {"data.reset_attention_mask=true", "data.reset_position_ids=true", NULL};
    static const char *const mask[] = {"data.reset_attention_mask=true", NULL};
    double w[2], l[2];
    doc_offsets("models/tiny-llama.yaml", on, NULL, 1, 1e-6, w);
    doc_offsets("examples/tiny-gpt.yaml", both, mask, 0, 1e-6, l);
    printf("reset_position_ids: a 12-token document at position 0 and at 9: rotary, its rotated "
           "queries %.2e apart (running positions %.2e); learned, its last attention output %.2e "
           "apart (running positions %.2e), relative\n",
           w[1], w[0], l[1], l[0]);
}

/* ---- dynamic loss scaling (fp16's mechanism, exercised in fp32) ---------------------- */

typedef struct poison_ctx {
    int armed; /* poison the next weight gradient written */
} poison_ctx;

static void poison_after(void *ctx, const mgc_op_call *c) {
    poison_ctx *pc = ctx;
    if (pc->armed && c->op->kind == MGC_POP_LINEAR_WGRAD && c->out[0]) {
        ((float *)c->out[0])[0] = INFINITY;
        pc->armed = 0;
    }
}

/* Runs `steps` steps of p with the given loss scaling (initial 0: off),
 * poisoning one gradient in step `poison_step` (-1: none); losses, whether
 * each step was skipped, the scale after each step, and a weight checksum
 * after each step out. */
static int run_scaled(const mgc_plan *p, double initial, int64_t window, int64_t hyst, int steps,
                      int poison_step, double *loss, int *skipped, double *scale_after, double *wsum) {
    t_rank r;
    mgc_exec *x = NULL;
    mgc_train_data *data = NULL;
    int ok = t_rank_open(&r, p, 1) == 0 && mgc_train_data_open(&data, p, 1, r.err, sizeof r.err) == 0;
    T_CHECK(ok);
    poison_ctx pc = {0};
    if (ok) {
        x = r.x;
        mgc_exec_set_loss_scaling(x, initial, window, hyst);
        mgc_exec_set_op_hooks(x, NULL, poison_after, &pc);
    }
    for (int it = 0; ok && it < steps; it++) {
        mgc_step_stats st;
        pc.armed = it == poison_step;
        ok = mgc_exec_step(x, it, mgc_train_data_sample, data, &st) == 0;
        T_CHECK(ok);
        if (!ok) fprintf(stderr, "step %d: %s\n", it, mgc_exec_error(x));
        loss[it] = st.loss;
        skipped[it] = st.skipped;
        scale_after[it] = mgc_exec_loss_scale(x);
        double sum = 0;
        for (int64_t i = 0; i < mgc_exec_param_count(x); i++) {
            const mgc_exec_param *e = mgc_exec_param_at(x, i);
            for (int64_t k = 0; k < e->numel; k++) sum += (double)e->weight[k] * (double)((k % 7) + 1);
        }
        wsum[it] = sum;
    }
    t_rank_close(&r);
    mgc_train_data_free(data);
    return ok ? 0 : -1;
}

static void check_loss_scaling(void) {
    mgc_plan *p = compile("examples/tiny-gpt.yaml", NULL, NULL);
    T_CHECK(p != NULL);
    if (!p) return;
    enum { N = 6 };
    double l0[N], l1[N], l2[N], s0[N], s1[N], s2[N], w0[N], w1[N], w2[N];
    int k0[N], k1[N], k2[N];
    /* a power-of-two scale changes nothing, bit for bit (3000 rounds down to 2048) */
    T_EQ_I64(run_scaled(p, 0, 0, 0, N, -1, l0, k0, s0, w0), 0);
    T_EQ_I64(run_scaled(p, 3000, 1000, 2, N, -1, l1, k1, s1, w1), 0);
    int same = 1;
    for (int i = 0; i < N; i++) same &= l0[i] == l1[i] && w0[i] == w1[i] && !k1[i] && s1[i] == 2048;
    T_CHECK(same);
    T_CHECK(s0[0] == 1.0);
    /* an overflow in step 2 skips it (the weights do not move), halves the scale
     * (hysteresis 1), and two clean steps double it again (window 2) */
    T_EQ_I64(run_scaled(p, 65536, 2, 1, N, 2, l2, k2, s2, w2), 0);
    T_CHECK(!k2[0] && !k2[1] && k2[2] && !k2[3] && !k2[4] && !k2[5]);
    T_CHECK(w2[2] == w2[1]);             /* skipped: no update */
    T_CHECK(w2[3] != w2[2]);             /* training goes on */
    T_CHECK(w2[1] == w0[1] && l2[1] == l0[1]); /* before the overflow: the unscaled run, exactly */
    T_CHECK(s2[0] == 65536 && s2[1] == 131072); /* two clean steps: doubled */
    T_CHECK(s2[2] == 65536);                   /* overflow: halved, the clean count reset */
    T_CHECK(s2[3] == 65536 && s2[4] == 131072); /* two clean steps again: doubled */
    printf("loss scaling: power-of-two scale bit-identical over %d steps; overflow skipped, scale "
           "%.0f -> %.0f -> %.0f\n",
           N, s2[1], s2[2], s2[4]);
    mgc_plan_free(p);
}

static int64_t fusion_dropb; /* check_fusion's last count of dropout backwards fused */

/* Whether ch->fwd[i..i+2] is an embedding, its dropout keeping a mask, and a norm of that. */
static int emb_drop_norm(const mgc_plan_chunk *ch, int64_t i) {
    const mgc_plan_op *o = &ch->fwd[i];
    return i + 2 < ch->n_fwd && o[0].kind == MGC_POP_EMBEDDING && o[1].kind == MGC_POP_DROPOUT &&
           o[1].n_out == 2 && o[1].in[0] == o[0].out[0] && o[2].kind == MGC_POP_NORM && o[2].in[0] == o[1].out[0];
}

/* Whether o is a dropout backward from a mask: a residual branch's, or the embedding's. */
static int mask_dropb(const mgc_plan_op *o) {
    return (o->kind == MGC_POP_DROPOUT_ADD_BWD || o->kind == MGC_POP_DROPOUT_BWD) && o->n_in == 2;
}

/* Fusions (compiler/fusion.c) change no number: the fused plan trains bit for bit
 * like the unfused one (MGC_FUSION=0) and like the one without in-place outputs
 * (MGC_INPLACE=0: the logits' gradient in a tensor of its own, memplan.h), and no
 * norm_bwd + add_bwd, dropout_add + norm, linear + gelu or gelu_bwd is left (GPT's MLP:
 * every gelu and gelu_bwd is fused), nor a qkv_split where no rotary embedding sits between
 * it and the attention, nor a dropout backward (a residual branch's dropout_add_bwd, the
 * embedding's dropout_bwd) that reads a norm backward's dx from a mask, nor an embedding, its
 * dropout and the norm of that side by side.
 * Returns the bias gradients moved into norm backwards (the dropout backwards: fusion_dropb). */
static int64_t check_fusion(const char *path, const char *const *sets) {
    setenv("MGC_FUSION", "0", 1);
    mgc_plan *u = compile(path, NULL, sets);
    unsetenv("MGC_FUSION");
    mgc_plan *f = compile(path, NULL, sets);
    setenv("MGC_INPLACE", "0", 1);
    mgc_plan *o = compile(path, NULL, sets);
    unsetenv("MGC_INPLACE");
    T_CHECK(u && f && o);
    if (!u || !f || !o) {
        mgc_plan_free(u);
        mgc_plan_free(f);
        mgc_plan_free(o);
        return 0;
    }
    int64_t inpl_f = 0, inpl_o = 0, qr = 0, qrb = 0, rope_f = 0, rope_u2 = 0;
    int64_t colsum = 0, bias_u = 0, bias_f = 0, bias_left = 0, embn = 0, embn_u = 0;
    int64_t dropb = 0, dab_u = 0, dab_f = 0, drop_left = 0, attb = 0, attb_left = 0, qkvb_u = 0;
    int64_t dgb = 0, dgb_left = 0, fc1b_u = 0;
    int64_t fused = 0, pairs = 0, adds_u = 0, adds_f = 0, addnorm = 0, fpairs = 0, dadd_u = 0, dadd_f = 0;
    int64_t lg = 0, dg = 0, gelu_u = 0, gelub_u = 0, gelu_f = 0, gelub_f = 0;
    int64_t qa = 0, qab = 0, split_u = 0, split_f = 0, splitb_u = 0, splitb_f = 0, rope_u = 0, att = 0;
    for (int64_t s = 0; s < f->n_stages; s++)
        for (int64_t c = 0; c < f->stages[s].n_chunks; c++) {
            const mgc_plan_chunk *ch = &f->stages[s].chunks[c], *cu = &u->stages[s].chunks[c];
            for (int64_t i = 0; i < o->stages[s].chunks[c].n_bwd; i++)
                inpl_o += (o->stages[s].chunks[c].bwd[i].flags & MGC_POF_INPLACE) != 0;
            for (int64_t i = 0; i < ch->n_bwd; i++) {
                inpl_f += (ch->bwd[i].flags & MGC_POF_INPLACE) != 0;
                qrb += ch->bwd[i].kind == MGC_POP_QKV_SPLIT_BWD && (ch->bwd[i].flags & MGC_POF_ROPE);
                rope_f += ch->bwd[i].kind == MGC_POP_ROPE || ch->bwd[i].kind == MGC_POP_ROPE_BWD;
                qab += ch->bwd[i].kind == MGC_POP_ATTENTION_BWD && (ch->bwd[i].flags & MGC_POF_QKV);
                splitb_f += ch->bwd[i].kind == MGC_POP_QKV_SPLIT_BWD;
                dg += ch->bwd[i].kind == MGC_POP_LINEAR_DGRAD_GELU;
                gelub_f += ch->bwd[i].kind == MGC_POP_GELU_BWD;
                for (int64_t j = 0; j < i && ch->bwd[i].kind == MGC_POP_GELU_BWD; j++)
                    pairs += ch->bwd[j].kind == MGC_POP_LINEAR_DGRAD && ch->bwd[j].out[0] == ch->bwd[i].in[1];
                mgc_norm_bwd_io io;
                int nbw = ch->bwd[i].kind == MGC_POP_NORM_BWD;
                T_CHECK(!nbw || mgc_plan_norm_bwd_io(&ch->bwd[i], &io) == 0);
                fused += nbw && io.res >= 0;
                dropb += nbw && io.dbr >= 0;
                int mdrop = mask_dropb(&ch->bwd[i]);
                dab_f += mdrop;
                /* a dropout backward left that reads a norm backward's dx (from the mask) */
                for (int64_t j = 0; j < i && mdrop; j++)
                    drop_left += ch->bwd[j].kind == MGC_POP_NORM_BWD && ch->bwd[j].out[0] == ch->bwd[i].in[0];
                colsum += ch->bwd[i].kind == MGC_POP_NORM_BWD && (ch->bwd[i].flags & MGC_POF_COLSUM);
                attb += ch->bwd[i].kind == MGC_POP_ATTENTION_BWD && (ch->bwd[i].flags & MGC_POF_COLSUM);
                dgb += ch->bwd[i].kind == MGC_POP_LINEAR_DGRAD_GELU && (ch->bwd[i].flags & MGC_POF_COLSUM);
                /* a bias gradient left to a linear that reads a fused dgrad's dh */
                for (int64_t j = 0; j < i && ch->bwd[i].kind == MGC_POP_LINEAR_WGRAD && ch->bwd[i].n_out == 2; j++)
                    dgb_left += ch->bwd[j].kind == MGC_POP_LINEAR_DGRAD_GELU && ch->bwd[j].out[0] == ch->bwd[i].in[0];
                /* a bias gradient left to a linear that reads a fused attention backward's dqkv */
                for (int64_t j = 0; j < i && ch->bwd[i].kind == MGC_POP_LINEAR_WGRAD && ch->bwd[i].n_out == 2; j++)
                    attb_left += ch->bwd[j].kind == MGC_POP_ATTENTION_BWD &&
                                 (ch->bwd[j].flags & MGC_POF_QKV) && ch->bwd[j].out[0] == ch->bwd[i].in[0];
                bias_f += ch->bwd[i].kind == MGC_POP_LINEAR_WGRAD && ch->bwd[i].n_out == 2;
                /* a bias gradient left to a linear that reads a norm backward's dx (or its
                 * dropout's dbr) */
                for (int64_t j = 0; j < i && ch->bwd[i].kind == MGC_POP_LINEAR_WGRAD && ch->bwd[i].n_out == 2; j++)
                    bias_left += ch->bwd[j].kind == MGC_POP_NORM_BWD &&
                                 (ch->bwd[j].out[0] == ch->bwd[i].in[0] ||
                                  ((ch->bwd[j].flags & MGC_POF_DROPBWD) &&
                                   ch->bwd[j].out[ch->bwd[j].n_out - 1] == ch->bwd[i].in[0]));
                adds_f += ch->bwd[i].kind == MGC_POP_ADD_BWD;
                if (i + 1 < ch->n_bwd && ch->bwd[i].kind == MGC_POP_NORM_BWD && ch->bwd[i + 1].kind == MGC_POP_ADD_BWD &&
                    (ch->bwd[i + 1].in[0] == ch->bwd[i].out[0] || ch->bwd[i + 1].in[1] == ch->bwd[i].out[0]))
                    pairs++;
            }
            for (int64_t i = 0; i < cu->n_bwd; i++) {
                bias_u += cu->bwd[i].kind == MGC_POP_LINEAR_WGRAD && cu->bwd[i].n_out == 2;
                /* the unfused plan's QKV projections with a bias: their wgrad reads the join */
                for (int64_t j = 0; j < i && cu->bwd[i].kind == MGC_POP_LINEAR_WGRAD && cu->bwd[i].n_out == 2; j++)
                    qkvb_u += cu->bwd[j].kind == MGC_POP_QKV_SPLIT_BWD && !(cu->bwd[j].flags & MGC_POF_ROPE) &&
                              cu->bwd[j].out[0] == cu->bwd[i].in[0];
                /* the unfused plan's first MLP linears with a bias: their wgrad reads gelu_bwd's dh */
                for (int64_t j = 0; j < i && cu->bwd[i].kind == MGC_POP_LINEAR_WGRAD && cu->bwd[i].n_out == 2; j++)
                    fc1b_u += cu->bwd[j].kind == MGC_POP_GELU_BWD && cu->bwd[j].out[0] == cu->bwd[i].in[0];
                splitb_u += cu->bwd[i].kind == MGC_POP_QKV_SPLIT_BWD;
                adds_u += cu->bwd[i].kind == MGC_POP_ADD_BWD;
                dab_u += mask_dropb(&cu->bwd[i]);
                gelub_u += cu->bwd[i].kind == MGC_POP_GELU_BWD;
            }
            for (int64_t i = 0; i < ch->n_fwd; i++) {
                qr += ch->fwd[i].kind == MGC_POP_QKV_SPLIT && (ch->fwd[i].flags & MGC_POF_ROPE);
                rope_f += ch->fwd[i].kind == MGC_POP_ROPE;
                qa += ch->fwd[i].kind == MGC_POP_ATTENTION && (ch->fwd[i].flags & MGC_POF_QKV);
                split_f += ch->fwd[i].kind == MGC_POP_QKV_SPLIT;
                lg += ch->fwd[i].kind == MGC_POP_LINEAR_GELU;
                gelu_f += ch->fwd[i].kind == MGC_POP_GELU;
                if (i + 1 < ch->n_fwd && ch->fwd[i].kind == MGC_POP_LINEAR && ch->fwd[i + 1].kind == MGC_POP_GELU &&
                    ch->fwd[i + 1].in[0] == ch->fwd[i].out[0])
                    fpairs++;
                addnorm += ch->fwd[i].kind == MGC_POP_ADD_NORM;
                embn += ch->fwd[i].kind == MGC_POP_EMBEDDING_NORM;
                if (i + 1 < ch->n_fwd && ch->fwd[i].kind == MGC_POP_EMBEDDING && ch->fwd[i + 1].kind == MGC_POP_NORM &&
                    ch->fwd[i + 1].in[0] == ch->fwd[i].out[0])
                    fpairs++;
                fpairs += emb_drop_norm(ch, i);
                dadd_f += ch->fwd[i].kind == MGC_POP_DROPOUT_ADD;
                if (i + 1 < ch->n_fwd && ch->fwd[i].kind == MGC_POP_DROPOUT_ADD && ch->fwd[i + 1].kind == MGC_POP_NORM &&
                    ch->fwd[i + 1].in[0] == ch->fwd[i].out[0])
                    fpairs++;
            }
            for (int64_t i = 0; i < cu->n_bwd; i++)
                rope_u2 += cu->bwd[i].kind == MGC_POP_ROPE_BWD;
            for (int64_t i = 0; i < cu->n_fwd; i++) {
                split_u += cu->fwd[i].kind == MGC_POP_QKV_SPLIT;
                rope_u += cu->fwd[i].kind == MGC_POP_ROPE;
                att += cu->fwd[i].kind == MGC_POP_ATTENTION;
                dadd_u += cu->fwd[i].kind == MGC_POP_DROPOUT_ADD;
                gelu_u += cu->fwd[i].kind == MGC_POP_GELU;
                embn_u += (i + 1 < cu->n_fwd && cu->fwd[i].kind == MGC_POP_EMBEDDING &&
                           cu->fwd[i + 1].kind == MGC_POP_NORM && cu->fwd[i + 1].in[0] == cu->fwd[i].out[0]) ||
                          emb_drop_norm(cu, i);
            }
        }
    T_CHECK(fused > 0 && addnorm > 0);
    T_CHECK(gelu_u == 0 || lg > 0); /* a model with GELU fuses some */
    T_EQ_I64(pairs, 0);
    T_EQ_I64(fpairs, 0);
    T_EQ_I64(adds_u - adds_f, fused);
    T_EQ_I64(dadd_u - dadd_f, addnorm);
    T_EQ_I64(gelu_u - gelu_f, lg); /* each linear_gelu replaced one gelu */
    T_EQ_I64(embn, embn_u); /* each embedding that a norm reads straight or after its dropout */
    T_EQ_I64(gelub_u - gelub_f, dg);
    /* each fused attention took its split and its backward's join; without rotary embeddings
     * (between split and attention) or context parallelism every attention is fused */
    T_EQ_I64(split_u - split_f, qa);
    T_EQ_I64(splitb_u - splitb_f, qab);
    T_EQ_I64(qa, qab);
    T_EQ_I64(qa, rope_u || f->grid.cp > 1 ? 0 : att); /* under CP: k and v all-gathered */
    /* with rotary embeddings, each split took its two ropes and each join its two rope_bwds:
     * no rope is left */
    T_EQ_I64(rope_f, 0);
    T_EQ_I64(2 * qr, rope_u);
    T_EQ_I64(2 * qrb, rope_u2);
    /* each bias gradient a norm backward took is one a linear_wgrad gave up, and none is left
     * where a linear reads a norm backward's dx */
    T_EQ_I64(bias_u - bias_f, colsum + attb + dgb);
    T_EQ_I64(bias_left, 0);
    /* and each fused attention backward took its QKV projection's bias gradient, where the
     * projection has a bias (the unfused plan's wgrad reading the join's dqkv) */
    T_CHECK(attb <= qa); /* only a fused attention backward takes one */
    if (qa == att) T_EQ_I64(attb, qkvb_u);
    T_EQ_I64(attb_left, 0);
    /* and each fused dgrad + gelu_bwd took the bias gradient of the linear reading its dh, where
     * that linear has a bias */
    T_CHECK(dgb <= dg);
    if (dg == gelub_u) T_EQ_I64(dgb, fc1b_u);
    T_EQ_I64(dgb_left, 0);
    /* each dropout backward a norm backward took is one fewer op, and none that reads a norm
     * backward's dx from a mask is left */
    T_EQ_I64(dab_u - dab_f, dropb);
    T_EQ_I64(drop_left, 0);
    T_EQ_I64(inpl_f, 1); /* the loss chunk's cross_entropy_bwd */
    T_EQ_I64(inpl_o, 0);
    double lu[STEPS], nu[STEPS], lf[STEPS], nf[STEPS], lo[STEPS], no[STEPS];
    T_EQ_I64(train(u, lu, nu), 0);
    T_EQ_I64(train(f, lf, nf), 0);
    T_EQ_I64(train(o, lo, no), 0);
    int same = 1;
    for (int i = 0; i < STEPS; i++)
        same &= lu[i] == lf[i] && nu[i] == nf[i] && lo[i] == lf[i] && no[i] == nf[i];
    T_CHECK(same);
    printf("%s: %lld norm_bwd + add_bwd, %lld dropout_add + norm, %lld linear + gelu, %lld "
           "linear_dgrad + gelu_bwd, %lld qkv_split + attention pairs, %lld + %lld qkv_split "
           "(_bwd) + ropes, %lld bias gradients and %lld dropout backwards into norm_bwd, %lld "
           "bias gradients into attention_bwd, %lld into linear_dgrad_gelu and %lld embedding + "
           "norm fused, %d steps "
           "bit-identical to the unfused plan and to the plan without in-place outputs\n",
           path, (long long)fused, (long long)addnorm, (long long)lg, (long long)dg, (long long)qa,
           (long long)qr, (long long)qrb, (long long)colsum, (long long)dropb, (long long)attb,
           (long long)dgb, (long long)embn, STEPS);
    mgc_plan_free(u);
    mgc_plan_free(f);
    mgc_plan_free(o);
    fusion_dropb = dropb;
    return colsum;
}

/* ---- graphs (backend.h graph_begin / graph_end) on the CPU ------------------------------
 * A backend that records as the CUDA one captures: a program's first run is eager; on its
 * second the executor's ops are recorded, not run, and run at graph_end; later runs replay the
 * record.  One recording is made to fail (an op refuses while recording), which the executor
 * must answer by issuing the ops again.  Training with it must match training without, bit
 * for bit.  Programs with dropout are offered only to a backend with set_step: this one then
 * replays a record with the step set last, as the CUDA backend's kernels read it from device
 * memory, so a missing or late set_step draws another step's masks and the losses differ. */
typedef struct rec_graph {
    uint64_t key;
    int runs, never, done;
    mgc_op_call *calls;
    int n, cap;
} rec_graph;

static struct {
    const mgc_backend_iface *cpu; /* the CPU backend's table */
    rec_graph g[64];
    int n;
    rec_graph *recording;
    int fail_next;                /* the next recorded op fails */
    long begins, recorded, replays, failed;
    int64_t step_replays;         /* the executor's count (mgc_step_stats.graph_replays) */
    int64_t step;                 /* set_step's, -1 before the first */
    long steps_set, stale;        /* set_step calls; ops recorded under another step */
    int frozen;                   /* replays draw the recorded step's masks (the control) */
} R;

static int rec_replay(mgc_backend *be, const rec_graph *g) {
    for (int i = 0; i < g->n; i++) {
        mgc_op_call c = g->calls[i];
        if (!R.frozen) c.iteration = R.step; /* the step the backend holds, not the recorded */
        if (R.cpu->run_op(be, &c)) return -1;
    }
    return 0;
}

static int rec_set_step(mgc_backend *be, int64_t step) {
    (void)be;
    R.step = step;
    R.steps_set++;
    return 0;
}

static int rec_run_op(mgc_backend *be, const mgc_op_call *c) {
    if (!R.recording) return R.cpu->run_op(be, c);
    if (c->iteration != R.step) R.stale++;
    if (R.fail_next) {
        R.fail_next = 0;
        snprintf(be->err, sizeof be->err, "refused while recording (injected)");
        return -1;
    }
    rec_graph *g = R.recording;
    if (g->n == g->cap) {
        int nc = g->cap ? 2 * g->cap : 64;
        mgc_op_call *p = realloc(g->calls, (size_t)nc * sizeof *p);
        if (!p) return -1;
        g->calls = p, g->cap = nc;
    }
    g->calls[g->n++] = *c; /* the op lives in the plan, the addresses in the arena */
    return 0;
}

static int rec_begin(mgc_backend *be, uint64_t key) {
    R.begins++;
    rec_graph *g = NULL;
    for (int i = 0; i < R.n && !g; i++)
        if (R.g[i].key == key) g = &R.g[i];
    if (!g) {
        if (R.n == 64) return 0;
        g = &R.g[R.n++];
        memset(g, 0, sizeof *g);
        g->key = key;
    }
    if (g->never) return 0;
    if (g->done) {
        R.replays++;
        return rec_replay(be, g) ? -1 : 1;
    }
    if (g->runs++ == 0) return 0;
    R.recording = g;
    return 0;
}

static int rec_end(mgc_backend *be, uint64_t key, int failed) {
    rec_graph *g = R.recording;
    if (!g) return 0;
    R.recording = NULL;
    if (failed || g->key != key) {
        g->never = 1;
        g->n = 0;
        R.failed++;
        return 2;
    }
    g->done = 1;
    R.recorded++;
    return rec_replay(be, g);
}

/* Trains `steps` steps on one rank of the CPU backend, through the recording backend when
 * `graphs` (with set_step when `set_step`); losses and norms out. */
static int train_graphs(const mgc_plan *p, int graphs, int set_step, int steps, double *loss,
                        double *norm) {
    char err[4096];
    mgc_backend *cpu = NULL;
    mgc_comm *w[1] = {NULL};
    mgc_exec *x = NULL;
    mgc_train_data *data = NULL;
    int rc = -1;
    static mgc_backend_iface iface;
    mgc_backend rec;
    if (mgc_backend_cpu_open(&cpu, err, sizeof err)) return -1;
    iface = *cpu->iface;
    iface.run_op = rec_run_op;
    iface.graph_begin = rec_begin;
    iface.graph_end = rec_end;
    iface.set_step = set_step ? rec_set_step : NULL;
    R.step = -1;
    memset(&rec, 0, sizeof rec);
    rec.iface = &iface;
    rec.context = cpu->context; /* the CPU's slots read only the context */
    R.cpu = cpu->iface;
    if (mgc_comm_local_world_create(1, NULL, w, err, sizeof err) != MGC_COMM_OK) goto out;
    if (mgc_exec_open(&x, p, w[0], &rec, err, sizeof err) || mgc_exec_init_params(x) ||
        mgc_train_data_open(&data, p, steps, err, sizeof err))
        goto out;
    mgc_exec_set_graphs(x, graphs);
    for (int i = 0; i < steps; i++) {
        mgc_step_stats st;
        if (mgc_exec_step(x, i, mgc_train_data_sample, data, &st)) {
            snprintf(err, sizeof err, "%s", mgc_exec_error(x));
            goto out;
        }
        loss[i] = st.loss, norm[i] = st.grad_norm;
        R.step_replays += st.graph_replays;
    }
    rc = 0;
out:
    if (rc) fprintf(stderr, "train_graphs: %s\n", err);
    mgc_exec_free(x);
    mgc_comm_free(w[0]);
    mgc_train_data_free(data);
    mgc_backend_close(cpu);
    for (int i = 0; i < R.n; i++) free(R.g[i].calls);
    R.n = 0;
    R.recording = NULL;
    return rc;
}

static void check_graphs(void) {
    static const char *const nodrop[] = {"model.hidden_dropout=0", "model.attention_dropout=0", NULL};
    static const char *const drop[] = {"model.hidden_dropout=0.1", NULL};
    mgc_plan *p = compile("examples/tiny-gpt.yaml", NULL, nodrop), *q = compile("examples/tiny-gpt.yaml", NULL, drop);
    T_CHECK(p && q);
    if (p && q) {
        enum { N = 5 };
        double l0[N], n0[N], l1[N], n1[N];
        memset(&R, 0, sizeof R);
        T_EQ_I64(train_graphs(p, 0, 0, N, l0, n0), 0);
        T_EQ_I64(R.begins, 0); /* off: never offered */
        R.fail_next = 1;       /* the first recording fails */
        T_EQ_I64(train_graphs(p, 1, 0, N, l1, n1), 0);
        int same = 1;
        for (int i = 0; i < N; i++) same &= l0[i] == l1[i] && n0[i] == n1[i];
        T_CHECK(same);
        /* 2 microbatches x (forward, backward): 4 programs; one recording failed */
        T_EQ_I64(R.failed, 1);
        T_EQ_I64(R.recorded, 3);
        T_CHECK(R.replays >= 3 * (N - 2) - 1);
        T_EQ_I64(R.step_replays, R.replays);
        printf("graphs: %ld programs recorded (1 recording failed and ran eagerly), %ld replays, %d "
               "steps bit-identical to no graphs\n",
               R.recorded, R.replays, N);
        memset(&R, 0, sizeof R);
        T_EQ_I64(train_graphs(q, 1, 0, 2, l1, n1), 0);
        T_EQ_I64(R.begins, 0); /* dropout, no set_step: the stream's step is an argument */
        /* dropout with set_step: recorded, and replayed with each step's masks */
        T_EQ_I64(train_graphs(q, 0, 1, N, l0, n0), 0);
        T_EQ_I64(R.begins, 0);
        T_EQ_I64(R.steps_set, 0); /* graphs off: the ops carry their step */
        T_EQ_I64(train_graphs(q, 1, 1, N, l1, n1), 0);
        same = 1;
        for (int i = 0; i < N; i++) same &= l0[i] == l1[i] && n0[i] == n1[i];
        T_CHECK(same);
        T_EQ_I64(R.recorded, 4);
        T_EQ_I64(R.failed, 0);
        T_EQ_I64(R.stale, 0);
        T_EQ_I64(R.steps_set, R.begins);
        T_CHECK(R.replays >= 4 * (N - 2));
        printf("graphs with dropout: %ld programs recorded, %ld replays with the step set before "
               "each, %d steps %s\n",
               R.recorded, R.replays, N, same ? "bit-identical to no graphs" : "DIFFER");
        /* the control: replays that draw the recorded step's masks train differently from
         * the first replay on (step 2) */
        memset(&R, 0, sizeof R);
        R.frozen = 1;
        double l2[N], n2[N];
        T_EQ_I64(train_graphs(q, 1, 1, N, l2, n2), 0);
        T_CHECK(l2[1] == l0[1] && l2[2] != l0[2] && l2[N - 1] != l0[N - 1]);
    }
    mgc_plan_free(p);
    mgc_plan_free(q);
}

/* Loss chunks (compiler/losschunk.h): the head in k row chunks at the start of the backward
 * trains as the unchunked head does.  The gradients are the same row for row; only the
 * weight gradient's and the loss's sums over rows are grouped by chunk, so the losses agree
 * to rounding, and a chunked rerun is bit-identical.  The plan has k cross-entropy
 * backwards, each in place, and its forward stashes no logits. */
static void check_loss_chunks(const char *path, const char *const *sets, int64_t k) {
    static const char *const base[] = {"training.micro_batch_size=8",
                                       "training.global_batch_size=16", NULL};
    char kv[64];
    snprintf(kv, sizeof kv, "training.loss_chunks=%lld", (long long)k);
    const char *one[10] = {"training.loss_chunks=1"}, *many[10] = {kv};
    for (int i = 0; sets && sets[i] && i < 8; i++)
        one[i + 1] = many[i + 1] = sets[i];
    mgc_plan *p = compile(path, base, one), *q = compile(path, base, many);
    T_CHECK(p && q);
    if (p && q) {
        const mgc_stage_program *sp = &q->stages[q->n_stages - 1];
        const mgc_plan_chunk *ch = &sp->chunks[sp->n_chunks - 1];
        int64_t ce = 0, inpl = 0, fwd_gemm = 0, views = 0;
        for (int64_t i = 0; i < ch->n_bwd; i++)
            if (ch->bwd[i].kind == MGC_POP_CROSS_ENTROPY_BWD)
                ce++, inpl += (ch->bwd[i].flags & MGC_POF_INPLACE) != 0;
        for (int64_t i = 0; i < ch->n_fwd; i++)
            fwd_gemm += ch->fwd[i].kind == MGC_POP_CROSS_ENTROPY;
        for (int64_t t = 0; t < ch->n_tensors; t++)
            views += ch->tensors[t].view != 0;
        T_EQ_I64(ce, k);
        T_EQ_I64(inpl, k);
        T_EQ_I64(fwd_gemm, 0);
        T_CHECK(views >= 4 * k); /* h, labels, mask, dh per chunk */
        T_CHECK(ch->stash_bytes < p->stages[q->n_stages - 1].chunks[sp->n_chunks - 1].stash_bytes);
        double a[STEPS], an[STEPS], b[STEPS], bn[STEPS], c[STEPS], cn[STEPS];
        int ra = train(p, a, an), rb = train(q, b, bn), rc = train(q, c, cn);
        T_EQ_I64(ra, 0);
        T_EQ_I64(rb, 0);
        T_EQ_I64(rc, 0);
        if (ra || rb || rc) goto done;
        double worst = 0;
        for (int i = 0; i < STEPS; i++) {
            T_NEAR_REL(b[i], a[i], i == 0 ? 1e-6 : 1e-5);
            T_NEAR_REL(bn[i], an[i], 1e-4);
            double r = fabs(b[i] - a[i]) / fabs(a[i]);
            if (r > worst) worst = r;
        }
        T_CHECK(memcmp(b, c, sizeof b) == 0 && memcmp(bn, cn, sizeof bn) == 0);
        /* at tensor parallel 1 every chunk's cross-entropy statistics are fused into its
         * backward (plan.h MGC_POF_CE_STATS): bit-identical to the two ops (MGC_CE_FUSE=0) */
        int64_t fused = 0;
        for (int64_t s = 0; s < q->n_stages; s++)
            for (int64_t cc = 0; cc < q->stages[s].n_chunks; cc++)
                for (int64_t i = 0; i < q->stages[s].chunks[cc].n_bwd; i++)
                    fused += (q->stages[s].chunks[cc].bwd[i].flags & MGC_POF_CE_STATS) != 0;
        T_EQ_I64(fused, q->grid.tp == 1 ? k : 0);
        if (fused) {
            setenv("MGC_CE_FUSE", "0", 1);
            mgc_plan *u = compile(path, base, many);
            unsetenv("MGC_CE_FUSE");
            T_CHECK(u != NULL);
            if (u) {
                int64_t left = 0;
                for (int64_t i = 0; i < u->stages[u->n_stages - 1].chunks[sp->n_chunks - 1].n_bwd; i++)
                    left += (u->stages[u->n_stages - 1].chunks[sp->n_chunks - 1].bwd[i].flags &
                             MGC_POF_CE_STATS) != 0;
                T_EQ_I64(left, 0);
                T_EQ_I64(train(u, c, cn), 0);
                T_CHECK(memcmp(b, c, sizeof b) == 0 && memcmp(bn, cn, sizeof bn) == 0);
                mgc_plan_free(u);
            }
        }
        char lay[256] = "";
        for (int i = 1; sets && sets[i] && i < 8; i++) /* sets[0] is the world size */
            snprintf(lay + strlen(lay), sizeof lay - strlen(lay), " %s", strchr(sets[i], '.') + 1);
        printf("%s%s: %lld loss chunks: worst relative loss difference %.2e to one chunk, "
               "rerun bit-identical%s, stash %.2f -> %.2f MiB per microbatch\n",
               path, lay, (long long)k, worst,
               fused ? ", the cross-entropy fused and unfused bit-identical" : "",
               (double)p->stages[q->n_stages - 1].chunks[sp->n_chunks - 1].stash_bytes / 1048576.0,
               (double)ch->stash_bytes / 1048576.0);
    }
done:
    mgc_plan_free(p);
    mgc_plan_free(q);
}

/* training.recompute_modules: the norms' and activations' outputs recomputed in the backward
 * are the forward's bits on the CPU (a fused forward op computes as the ops it replaces), so
 * training is bit-identical to stashing them, the stash is smaller, and the backward holds the
 * recompute copies. */
static void check_recompute_modules(const char *path, const char *const *sets) {
    const char *mods[10] = {"training.recompute_modules=[norm, activation, dropout]"};
    for (int i = 0; sets && sets[i] && i < 8; i++)
        mods[i + 1] = sets[i];
    mgc_plan *p = compile(path, NULL, sets), *q = compile(path, NULL, mods);
    T_CHECK(p && q);
    if (p && q) {
        int64_t norms = 0, acts = 0, masks = 0;
        uint64_t sp = 0, sq = 0;
        for (int64_t s = 0; s < q->n_stages; s++)
            for (int64_t c = 0; c < q->stages[s].n_chunks; c++) {
                const mgc_plan_chunk *ch = &q->stages[s].chunks[c];
                sp += p->stages[s].chunks[c].stash_bytes, sq += ch->stash_bytes;
                for (int64_t t = 0; t < ch->n_tensors; t++) /* no dropout mask is stashed */
                    masks += ch->tensors[t].dtype == MGC_DT_U8 && ch->tensors[t].buffer == MGC_PLAN_BUF_STASH;
                for (int64_t i = 0; i < ch->n_bwd; i++) {
                    if (!(ch->bwd[i].flags & MGC_POF_RECOMPUTE) || ch->bwd[i].layer < 0) continue;
                    norms += ch->bwd[i].kind == MGC_POP_NORM;
                    acts += ch->bwd[i].kind == MGC_POP_GELU || ch->bwd[i].kind == MGC_POP_SWIGLU;
                }
            }
        int64_t layers = q->stages[0].chunks[0].num_layers * q->n_stages * q->grid.vp;
        T_EQ_I64(norms, 2 * layers); /* the attention's and the MLP's */
        T_CHECK(acts >= layers);     /* MoE: one a layer's experts, one its shared experts */
        T_CHECK(sq < sp);
        T_EQ_I64(masks, 0);
        double a[STEPS], an[STEPS], b[STEPS], bn[STEPS];
        int ra = train(p, a, an), rb = train(q, b, bn);
        T_EQ_I64(ra, 0);
        T_EQ_I64(rb, 0);
        if (!ra && !rb) {
            T_CHECK(memcmp(a, b, sizeof a) == 0 && memcmp(an, bn, sizeof an) == 0);
            printf("%s%s: recompute_modules [norm, activation, dropout]: %lld norms and %lld "
                   "activations recomputed, no mask stashed, stash %.2f -> %.2f MiB per "
                   "microbatch, losses bit-identical\n",
                   path, sets && sets[0] ? " (with sets)" : "", (long long)norms, (long long)acts,
                   (double)sp / 1048576.0, (double)sq / 1048576.0);
        }
    }
    mgc_plan_free(p);
    mgc_plan_free(q);
}

/* training.recompute_method / recompute_num_layers: full recompute of some layers (block: the
 * first n of each pipeline chunk) or of groups of n layers re-run together (uniform).  Each
 * variant re-runs exactly the layers its method picks, stashes less the more it recomputes,
 * and trains bit-identically to keeping every activation. */
typedef struct {
    const char *label;
    const char *sets[4];
    int block;     /* 1: block, 0: uniform */
    int64_t n;     /* recompute_num_layers */
} redo_variant;

static uint64_t stash_of(const mgc_plan *p) {
    uint64_t b = 0;
    for (int64_t s = 0; s < p->n_stages; s++)
        for (int64_t c = 0; c < p->stages[s].n_chunks; c++)
            b += p->stages[s].chunks[c].stash_bytes;
    return b;
}

static void check_recompute_method(const char *path, const char *const *sets) {
    static const redo_variant v[] = {
        {"block 1", {"training.recompute=full", "training.recompute_method=block", "training.recompute_num_layers=1"}, 1, 1},
        {"block 2", {"training.recompute=full", "training.recompute_method=block", "training.recompute_num_layers=2"}, 1, 2},
        {"uniform 1", {"training.recompute=full"}, 0, 1},
        {"uniform 2", {"training.recompute=full", "training.recompute_num_layers=2"}, 0, 2},
        {"block 1 + norm, activation",
         {"training.recompute=full", "training.recompute_method=block", "training.recompute_num_layers=1",
          "training.recompute_modules=[norm, activation]"}, 1, 1},
    };
    enum { NV = sizeof v / sizeof v[0] };
    mgc_plan *base = compile(path, NULL, sets);
    T_CHECK(base != NULL);
    if (!base) return;
    double a[STEPS], an[STEPS];
    int ra = train(base, a, an);
    T_EQ_I64(ra, 0);
    uint64_t stash[NV];
    int64_t every[NV] = {0}; /* 1: the variant re-ran every layer */
    int same = 1;
    printf("%s%s: recompute none: stash %.2f MiB", path, sets && sets[0] ? " (with sets)" : "",
           (double)stash_of(base) / 1048576.0);
    for (int k = 0; k < NV; k++) {
        const char *mine[12] = {NULL};
        int m = 0;
        for (int i = 0; sets && sets[i] && m < 7; i++)
            mine[m++] = sets[i];
        for (int i = 0; i < 4 && v[k].sets[i]; i++)
            mine[m++] = v[k].sets[i];
        mgc_plan *q = compile(path, NULL, mine);
        T_CHECK(q != NULL);
        stash[k] = 0;
        if (!q) continue;
        stash[k] = stash_of(q);
        /* the layers whose GEMMs re-run in the backward, against what the method picks */
        int64_t want = 0, got = 0, norms = 0, layers = 0;
        for (int64_t s = 0; s < q->n_stages; s++)
            for (int64_t c = 0; c < q->stages[s].n_chunks; c++) {
                const mgc_plan_chunk *ch = &q->stages[s].chunks[c];
                want += v[k].block ? (ch->num_layers < v[k].n ? ch->num_layers : v[k].n) : ch->num_layers;
                layers += ch->num_layers;
                for (int64_t l = ch->first_layer; l < ch->first_layer + ch->num_layers; l++) {
                    int redone = 0;
                    for (int64_t i = 0; i < ch->n_bwd; i++)
                        if ((ch->bwd[i].flags & MGC_POF_RECOMPUTE) && ch->bwd[i].layer == l) {
                            redone |= ch->bwd[i].kind == MGC_POP_LINEAR;
                            norms += ch->bwd[i].kind == MGC_POP_NORM;
                        }
                    got += redone;
                    T_EQ_I64(redone, !v[k].block || l - ch->first_layer < v[k].n); /* the first n */
                }
            }
        T_EQ_I64(got, want);
        every[k] = got == layers;
        if (k == NV - 1) /* the modules act on the layers block leaves alone: their two norms */
            T_CHECK(norms >= 2 * want + 2 * (layers - want));
        double b[STEPS], bn[STEPS];
        int rb = train(q, b, bn);
        T_EQ_I64(rb, 0);
        int eq = !ra && !rb && !memcmp(a, b, sizeof a) && !memcmp(an, bn, sizeof an);
        T_CHECK(eq);
        same = same && eq;
        printf("; %s: %lld layers re-run, stash %.2f MiB", v[k].label, (long long)got,
               (double)stash[k] / 1048576.0);
        mgc_plan_free(q);
    }
    /* the more recomputed, the less stashed: none > block 1 > block 2 > uniform 1 > uniform 2
     * (block 2 is uniform 1 where chunks hold two layers) */
    T_CHECK(stash_of(base) > stash[0]);
    T_CHECK(stash[0] > stash[1]);
    T_CHECK(every[1] ? stash[1] == stash[2] : stash[1] > stash[2]);
    T_CHECK(stash[2] > stash[3]);
    T_CHECK(stash[4] < stash[0]);
    printf("; losses %s\n", same ? "bit-identical" : "DIFFER");
    mgc_plan_free(base);
}

/* training.recompute_modules mlp / moe: each dense (MoE) layer's second half re-runs from its
 * input in the backward: its GEMMs (the router's, the experts' and the shared experts' in MoE
 * layers) and its token exchange re-run, the attention's do not, the stash shrinks, and training
 * is bit-identical to stashing it all. */
static void check_recompute_half(const char *path, const char *const *sets, const char *module) {
    const char *mine[12] = {NULL};
    int m = 0;
    for (int i = 0; sets && sets[i] && m < 10; i++)
        mine[m++] = sets[i];
    char mod[64];
    snprintf(mod, sizeof mod, "training.recompute_modules=[%s]", module);
    mine[m++] = mod;
    mgc_plan *p = compile(path, NULL, sets), *q = compile(path, NULL, mine);
    T_CHECK(p && q);
    if (p && q) {
        /* recomputed GEMMs of second halves and of attentions, dispatches: [0] without the
         * module (full recompute may re-run some layers whole), [1] with it */
        int64_t half[2] = {0, 0}, attn[2] = {0, 0}, a2a = 0;
        for (int k = 0; k < 2; k++) {
            const mgc_plan *r = k ? q : p;
            for (int64_t s = 0; s < r->n_stages; s++)
                for (int64_t c = 0; c < r->stages[s].n_chunks; c++) {
                    const mgc_plan_chunk *ch = &r->stages[s].chunks[c];
                    for (int64_t i = 0; i < ch->n_bwd; i++) {
                        const mgc_plan_op *op = &ch->bwd[i];
                        if (!(op->flags & MGC_POF_RECOMPUTE) || op->layer < 0) continue;
                        const char *nm = mgc_plan_strat(r, op->name);
                        int gemm = op->kind == MGC_POP_LINEAR || op->kind == MGC_POP_GROUPED_LINEAR ||
                                   op->kind == MGC_POP_LINEAR_GELU;
                        half[k] += gemm && strstr(nm, ".mlp.") != NULL;
                        attn[k] += gemm && strstr(nm, "self_attention") != NULL;
                        a2a += k && op->kind == MGC_POP_MOE_DISPATCH;
                    }
                }
        }
        T_CHECK(half[1] > half[0]);
        T_EQ_I64(attn[1], attn[0]); /* the module re-runs no attention */
        if (!strcmp(module, "moe") && q->grid.ep > 1) T_CHECK(a2a > 0);
        T_CHECK(stash_of(q) < stash_of(p));
        double a[STEPS], an[STEPS], b[STEPS], bn[STEPS];
        int ra = train(p, a, an), rb = train(q, b, bn);
        T_EQ_I64(ra, 0);
        T_EQ_I64(rb, 0);
        int same = !ra && !rb && !memcmp(a, b, sizeof a) && !memcmp(an, bn, sizeof an);
        T_CHECK(same);
        printf("%s%s: recompute_modules [%s]: %lld GEMMs of second halves re-run, none of the "
               "attention's%s, stash %.2f -> %.2f MiB, losses %s\n",
               path, sets && sets[0] ? " (with sets)" : "", module, (long long)(half[1] - half[0]),
               a2a ? " (and the token dispatch)" : "", (double)stash_of(p) / 1048576.0,
               (double)stash_of(q) / 1048576.0, same ? "bit-identical" : "DIFFER");
    }
    mgc_plan_free(p);
    mgc_plan_free(q);
}

/* ---- evaluation ---------------------------------------------------------------------- */

/* Trains p STEPS steps on `data` (NULL: the plan's training data) with its evaluations:
 * training losses and validation losses (NaN where none). */
static int train_eval(const mgc_plan *p, mgc_train_data *data, double *loss, double *eval) {
    char err[4096];
    mgc_train_data *own = NULL;
    if (!data && mgc_train_data_open(&own, p, STEPS, err, sizeof err)) {
        fprintf(stderr, "data: %s\n", err);
        return -1;
    }
    double norm[STEPS];
    mgc_train_opts o = MGC_TRAIN_OPTS_INIT;
    o.iterations = STEPS;
    o.losses = loss;
    o.grad_norms = norm;
    o.eval_losses = eval;
    o.timeout_ms = 120000;
    for (int i = 0; i < STEPS; i++)
        loss[i] = eval[i] = NAN;
    int rc = mgc_train_local(p, data ? data : own, (int)p->grid.world, &o, err, sizeof err);
    if (rc) fprintf(stderr, "train: %s\n", err);
    mgc_train_data_free(own);
    return rc;
}

/* Evaluation (training.eval_interval): it leaves training bit for bit alone, it is the
 * training step's loss on the same samples with dropout off and no update, dropout is off in
 * it, and every layout evaluates the same function. */
static void check_eval(void) {
    static const char *const ev[] = {"training.eval_interval=5", "training.eval_iters=2",
                                     "model.hidden_dropout=0.1", "model.attention_dropout=0.1", NULL};
    static const char *const none[] = {"model.hidden_dropout=0.1", "model.attention_dropout=0.1", NULL};
    mgc_plan *p = compile("examples/tiny-gpt.yaml", NULL, ev), *q = compile("examples/tiny-gpt.yaml", NULL, none);
    T_CHECK(p && q);
    if (!p || !q) goto out;
    double a[STEPS], ea[STEPS], b[STEPS], eb[STEPS], c[STEPS], ec[STEPS];
    T_EQ_I64(train_eval(p, NULL, a, ea), 0);
    T_EQ_I64(train_eval(q, NULL, b, eb), 0);
    T_EQ_I64(train_eval(p, NULL, c, ec), 0);
    /* training untouched; evaluations after steps 5 and 10 only; reruns bit-identical */
    T_CHECK(memcmp(a, b, sizeof a) == 0);
    T_CHECK(isnan(ea[3]) && !isnan(ea[4]) && isnan(ea[5]) && !isnan(ea[9]) && ea[9] < ea[4]);
    T_CHECK(memcmp(ea, ec, sizeof ea) == 0);
    printf("evaluation: training losses with and without it bit-identical; validation loss %.5f "
           "after step 5, %.5f after 10; rerun bit-identical\n",
           ea[4], ea[9]);
    /* the same samples as a training step's: the validation data as training data, learning
     * rate 0 and no dropout, one batch evaluated after every step = that step's loss */
    {
        static const char *const same[] = {"training.eval_interval=1", "training.eval_iters=1",
                                           "optimizer.lr=0", "optimizer.min_lr=0", NULL};
        mgc_plan *r = compile("examples/tiny-gpt.yaml", NULL, same);
        char err[4096];
        mgc_train_data *valid = NULL;
        T_CHECK(r && mgc_train_data_open_validation(&valid, r, 4, err, sizeof err) == 0);
        double l[STEPS], e[STEPS];
        if (r && valid && train_eval(r, valid, l, e) == 0) {
            T_CHECK(memcmp(&l[0], &e[0], sizeof l[0]) == 0);
            /* the weights never change: every evaluation is the first step's loss */
            T_CHECK(memcmp(&e[0], &e[STEPS - 1], sizeof e[0]) == 0);
            printf("evaluation: on the validation data as training data, learning rate 0: the "
                   "validation loss %.6f is step 1's training loss %.6f bit for bit\n", e[0], l[0]);
        } else {
            T_CHECK(0);
        }
        mgc_train_data_free(valid);
        /* the test split after the last step: on the test data as training data, step 1's
         * loss too; another split than validation's; none without a test part */
        mgc_train_data *test = NULL;
        T_CHECK(r && mgc_train_data_open_test(&test, r, 4, err, sizeof err) == 0);
        double tl = NAN, tv = NAN;
        mgc_train_opts o = MGC_TRAIN_OPTS_INIT;
        o.iterations = STEPS;
        o.losses = l;
        o.test_loss = &tl;
        o.timeout_ms = 120000;
        T_CHECK(r && test && mgc_train_local(r, test, 1, &o, err, sizeof err) == 0);
        T_CHECK(memcmp(&tl, &l[0], sizeof tl) == 0);
        mgc_train_data_free(test);
        static const char *const no_test[] = {"training.eval_interval=1", "training.eval_iters=1",
                                              "optimizer.lr=0", "optimizer.min_lr=0",
                                              "data.split=969,31,0", NULL};
        mgc_plan *nt = compile("examples/tiny-gpt.yaml", NULL, no_test);
        mgc_train_data *td = NULL;
        T_CHECK(nt && mgc_train_data_open_test(&td, nt, 4, err, sizeof err) == 1 && !td);
        T_CHECK(strstr(err, "no test part") != NULL);
        mgc_train_data *train = NULL;
        T_CHECK(nt && mgc_train_data_open(&train, nt, STEPS, err, sizeof err) == 0);
        o.test_loss = &tv;
        T_CHECK(nt && train && mgc_train_local(nt, train, 1, &o, err, sizeof err) == 0 && isnan(tv));
        double vl[STEPS];
        o.eval_losses = vl;
        T_CHECK(train && mgc_train_local(r, train, 1, &o, err, sizeof err) == 0 && !isnan(tv) &&
                tv == tl && vl[STEPS - 1] != tv);
        mgc_train_data_free(train);
        printf("test split: on the test data as training data, learning rate 0: the test loss %.6f "
               "after step %d is step 1's training loss bit for bit (validation: %.6f); none "
               "without a test part\n",
               tl, STEPS, vl[STEPS - 1]);
        mgc_plan_free(nt);
        mgc_plan_free(r);
    }
    /* dropout is off: at learning rate 0, the model with dropout 0.1 and the one without give
     * the same validation loss */
    {
        static const char *const d1[] = {"training.eval_interval=10", "optimizer.lr=0", "optimizer.min_lr=0",
                                         "model.hidden_dropout=0.1", "model.attention_dropout=0.1", NULL};
        static const char *const d0[] = {"training.eval_interval=10", "optimizer.lr=0", "optimizer.min_lr=0",
                                         "model.hidden_dropout=0", "model.attention_dropout=0", NULL};
        mgc_plan *r1 = compile("examples/tiny-gpt.yaml", NULL, d1), *r0 = compile("examples/tiny-gpt.yaml", NULL, d0);
        double l1[STEPS], e1[STEPS], l0[STEPS], e0[STEPS];
        T_CHECK(r1 && r0 && train_eval(r1, NULL, l1, e1) == 0 && train_eval(r0, NULL, l0, e0) == 0);
        T_NEAR_REL(e1[9], e0[9], 1e-6);
        T_CHECK(fabs(l1[0] - l0[0]) > 1e-4); /* while training saw dropout */
        printf("evaluation: dropout off: validation %.7f with dropout 0.1, %.7f without (training "
               "step 1: %.5f and %.5f)\n", e1[9], e0[9], l1[0], l0[0]);
        mgc_plan_free(r1);
        mgc_plan_free(r0);
    }
    /* layouts (hidden dropout on where its masks are the same in every layout: not the
     * attention's under tensor parallelism, nor any under context parallelism): the head in two loss chunks (micro batch 8: chunks of 64
     * rows), tensor 2 with SP, interleaved pipeline with tied embeddings, data 2 with the
     * distributed optimizer; LLaMA over context 2; MoE over experts */
    static const char *const evl[] = {"training.eval_interval=5", "training.eval_iters=2",
                                      "model.hidden_dropout=0.1", NULL};
    static const char *const evn[] = {"training.eval_interval=5", "training.eval_iters=2", NULL};
    static const char *const mb8[] = {"training.micro_batch_size=8", "training.global_batch_size=16",
                                      "training.eval_interval=5", "training.eval_iters=2",
                                      "model.hidden_dropout=0.1", NULL};
    static const struct {
        const char *path, *name;
        const char *const *common;
        const char *sets[10];
    } lay[] = {
        {"examples/tiny-gpt.yaml", "loss chunks 2", mb8, {"training.loss_chunks=2"}},
        {"examples/tiny-gpt.yaml", "tp2+sp", evl, {"parallel.world_size=2", "parallel.tensor=2",
                                                   "parallel.sequence_parallel=true"}},
        {"examples/tiny-gpt.yaml", "pp2 vp2 tied", evl, {"parallel.world_size=2", "parallel.pipeline=2",
                                                         "parallel.virtual_stages=2", "model.tie_embeddings=true"}},
        {"examples/tiny-gpt.yaml", "dp2 dist-opt", evl, {"parallel.world_size=2", "parallel.data=2",
                                                         "parallel.distributed_optimizer=true"}},
        {"models/tiny-llama.yaml", "cp2", evn, {"parallel.world_size=2", "parallel.context=2"}},
        {"models/tiny-moe.yaml", "ep2", evl, {"parallel.world_size=2", "parallel.data=2", "parallel.expert=2"}},
    };
    const char *prev = NULL;
    const char *const *prev_common = NULL;
    double base[STEPS], ebase[STEPS];
    for (size_t i = 0; i < sizeof lay / sizeof lay[0]; i++) {
        const char *sets[16];
        int k = 0;
        for (int j = 0; lay[i].sets[j]; j++) sets[k++] = lay[i].sets[j];
        sets[k] = NULL;
        if (!prev || strcmp(prev, lay[i].path) || prev_common != lay[i].common) { /* one rank */
            mgc_plan *one = compile(lay[i].path, lay[i].common, NULL);
            T_CHECK(one && train_eval(one, NULL, base, ebase) == 0);
            mgc_plan_free(one);
            prev = lay[i].path, prev_common = lay[i].common;
        }
        mgc_plan *r = compile(lay[i].path, lay[i].common, sets);
        double l[STEPS], e[STEPS];
        for (int j = 0; j < STEPS; j++)
            e[j] = NAN;
        T_CHECK(r && train_eval(r, NULL, l, e) == 0);
        T_NEAR_REL(e[4], ebase[4], 1e-5);
        T_NEAR_REL(e[9], ebase[9], 1e-5);
        printf("evaluation: %s %-14s validation loss after step 10 %.7f, one rank %.7f\n", lay[i].path,
               lay[i].name, e[9], ebase[9]);
        mgc_plan_free(r);
    }
out:
    mgc_plan_free(p);
    mgc_plan_free(q);
}

typedef struct layout {
    const char *name;
    const char *sets[8];
} layout;

static void check_model(const char *path, const char *const *extra, const layout *lays, int n) {
    double base[STEPS], bnorm[STEPS];
    mgc_plan *p = compile(path, extra, NULL);
    T_CHECK(p != NULL);
    if (!p) return;
    T_EQ_I64(train(p, base, bnorm), 0);
    mgc_plan_free(p);
    /* the model learns: the last step's loss is below the first */
    T_CHECK(base[STEPS - 1] < base[0] - 0.1);
    printf("%s%s%s: single rank: loss %.6f -> %.6f\n", path, extra ? " " : "", extra ? extra[0] : "", base[0],
           base[STEPS - 1]);
    for (int l = 0; l < n; l++) {
        p = compile(path, extra, lays[l].sets);
        T_CHECK(p != NULL);
        if (!p) continue;
        double a[STEPS], an[STEPS], b[STEPS], bn[STEPS];
        int rc = train(p, a, an);
        T_EQ_I64(rc, 0);
        /* the rerun on far arenas: communication staged through host memory */
        long staged0 = fenced_staged, sends0 = fenced_sends, fences0 = fenced_fences;
        int rc2 = train_on(p, 1, b, bn);
        T_EQ_I64(rc2, 0);
        long staged = fenced_staged - staged0, sends = fenced_sends - sends0;
        long fences = fenced_fences - fences0;
        /* pipeline neighbours send beside the compute there */
        if (p->grid.pp > 1) T_CHECK(sends > 0);
        double worst = 0, worst_n = 0;
        for (int i = 0; i < STEPS && rc == 0; i++) {
            T_NEAR_REL(a[i], base[i], 1e-5);
            T_NEAR_REL(an[i], bnorm[i], 1e-5); /* every gradient element counted once */
            double r = fabs(a[i] - base[i]) / fabs(base[i]), rn = fabs(an[i] - bnorm[i]) / bnorm[i];
            if (r > worst) worst = r;
            if (rn > worst_n) worst_n = rn;
        }
        if (rc == 0 && rc2 == 0) {
            T_CHECK(memcmp(a, b, sizeof a) == 0);
            T_CHECK(memcmp(an, bn, sizeof an) == 0);
        }
        printf("%s: %-18s world %2lld: worst relative loss difference %.2e, norm %.2e%s (%ld bytes "
               "up/down, %ld sends beside the compute, %ld fenced)\n",
               path, lays[l].name, (long long)p->grid.world, worst, worst_n,
               memcmp(a, b, sizeof a) ? " (rerun differs!)" : ", rerun on a far arena bit-identical", staged,
               sends, fences);
        mgc_plan_free(p);
    }
}

#define W(n) "parallel.world_size=" #n

static const layout dense[] = {
    {"tp2", {W(2), "parallel.tensor=2", "parallel.sequence_parallel=false"}},
    {"tp2+sp", {W(2), "parallel.tensor=2", "parallel.sequence_parallel=true"}},
    {"pp2 1f1b", {W(2), "parallel.pipeline=2", "parallel.schedule=1f1b"}},
    {"pp2 interleaved", {W(2), "parallel.pipeline=2", "parallel.virtual_stages=2"}},
    {"pp2 gpipe", {W(2), "parallel.pipeline=2", "parallel.schedule=gpipe"}},
    {"dp2", {W(2), "parallel.data=2"}},
    {"dp2 dist-opt", {W(2), "parallel.data=2", "parallel.distributed_optimizer=true"}},
    {"cp2", {W(2), "parallel.context=2"}},
    {"recompute full", {"training.recompute=full"}},
    {"recompute sel", {"training.recompute=selective"}},
    {"tp2 pp2 dp2", {W(8), "parallel.tensor=2", "parallel.pipeline=2", "parallel.data=2"}},
};

static const layout moe[] = {
    {"tp2+sp", {W(2), "parallel.tensor=2", "parallel.sequence_parallel=true",
                "parallel.expert_tensor=1"}},
    {"pp2 1f1b", {W(2), "parallel.pipeline=2", "parallel.schedule=1f1b"}},
    {"pp2 interleaved", {W(2), "parallel.pipeline=2", "parallel.virtual_stages=2"}},
    {"pp2 gpipe", {W(2), "parallel.pipeline=2", "parallel.schedule=gpipe"}},
    {"dp2", {W(2), "parallel.data=2"}},
    {"dp2 dist-opt", {W(2), "parallel.data=2", "parallel.distributed_optimizer=true"}},
    {"ep2", {W(2), "parallel.data=2", "parallel.expert=2"}},
    {"ep2 dist-opt", {W(2), "parallel.data=2", "parallel.expert=2",
                      "parallel.distributed_optimizer=true"}},
    {"cp2", {W(2), "parallel.context=2"}},
    {"recompute full", {"training.recompute=full"}},
    {"recompute sel", {"training.recompute=selective"}},
    {"tp2 pp2 dp2 ep2", {W(8), "parallel.tensor=2", "parallel.pipeline=2", "parallel.data=2",
                         "parallel.sequence_parallel=true", "parallel.expert_tensor=1",
                         "parallel.expert=2"}},
    /* expert tensor parallelism: expert_tensor defaults to tensor */
    {"tp2+sp etp2", {W(2), "parallel.tensor=2", "parallel.sequence_parallel=true"}},
    {"etp2 ep2", {W(4), "parallel.tensor=2", "parallel.sequence_parallel=true", "parallel.data=2",
                  "parallel.expert=2"}},
    {"etp2 edp2 dist-opt", {W(4), "parallel.tensor=2", "parallel.sequence_parallel=true",
                            "parallel.data=2", "parallel.distributed_optimizer=true"}},
    {"etp2 ep2 pp2", {W(8), "parallel.tensor=2", "parallel.sequence_parallel=true",
                      "parallel.pipeline=2", "parallel.data=2", "parallel.expert=2"}},
    {"etp4 (tp2 cp2)", {W(4), "parallel.tensor=2", "parallel.sequence_parallel=true",
                        "parallel.context=2", "parallel.expert_tensor=4"}},
};

/* Key/value heads replicated over tensor ranks (tensor > query groups): tiny LLaMA's two
 * groups over six tensor ranks, and multi-query attention (one group) in tiny GPT, whose QKV
 * has a bias, over two and three. */
static const layout kv_llama[] = {
    {"tp6 (3 a group)", {W(6), "parallel.tensor=6"}},
    {"tp6 pp2", {W(12), "parallel.tensor=6", "parallel.pipeline=2"}},
};
static const char *const mqa[] = {"model.num_query_groups=1", NULL};
static const layout kv_gpt[] = {
    {"tp2 mqa", {W(2), "parallel.tensor=2"}},
    {"tp2+sp pp2 mqa", {W(4), "parallel.tensor=2", "parallel.sequence_parallel=true",
                        "parallel.pipeline=2"}},
    {"tp3 dp2 dist-opt mqa", {W(6), "parallel.tensor=3", "parallel.data=2",
                              "parallel.distributed_optimizer=true"}},
};

/* The experts' biases (a row-parallel one added on expert-tensor rank 0 only). */
static const char *const biased[] = {"model.add_bias_linear=true", NULL};
static const layout moe_bias[] = {
    {"ep2", {W(2), "parallel.data=2", "parallel.expert=2"}},
    {"tp2+sp etp2", {W(2), "parallel.tensor=2", "parallel.sequence_parallel=true"}},
    {"etp2 ep2", {W(4), "parallel.tensor=2", "parallel.sequence_parallel=true", "parallel.data=2",
                  "parallel.expert=2"}},
};

/* Dropout in every layout (docs/runtime.md, "Dropout"): hidden and attention dropout 0.1
 * draw their masks by global element, head and position (backend.h mgc_op_drop_rng), so tensor
 * parallelism (local heads), sequence parallelism (row shards) and context parallelism (two
 * chunks of the sequence a rank; with SP on top a shard that straddles them, tp3 cp2) train
 * the one-rank function. */
static const char *const dropped[] = {"model.hidden_dropout=0.1", "model.attention_dropout=0.1", NULL};
static const layout drop_gpt[] = {
    {"tp2", {W(2), "parallel.tensor=2", "parallel.sequence_parallel=false"}},
    {"tp2+sp", {W(2), "parallel.tensor=2", "parallel.sequence_parallel=true"}},
    {"cp2", {W(2), "parallel.context=2"}},
    {"tp2+sp cp2", {W(4), "parallel.tensor=2", "parallel.sequence_parallel=true", "parallel.context=2"}},
    {"tp2 cp2 pp2 dp2", {W(16), "parallel.tensor=2", "parallel.context=2", "parallel.pipeline=2",
                         "parallel.data=2"}},
    {"recompute full cp2", {W(2), "parallel.context=2", "training.recompute=full"}},
};
/* seq 48: tp3 cp2 shards the 24 rows of a context rank's two chunks of 12 by 8, the middle
 * shard 4 of each */
static const char *const dropped48[] = {"model.hidden_dropout=0.1", "model.attention_dropout=0.1",
                                        "model.seq_length=48", NULL};
static const layout drop_gpt48[] = {
    {"tp3+sp cp2", {W(6), "parallel.tensor=3", "parallel.sequence_parallel=true", "parallel.context=2"}},
};
static const layout drop_llama[] = {
    {"cp2", {W(2), "parallel.context=2"}},
    {"tp2+sp cp2", {W(4), "parallel.tensor=2", "parallel.sequence_parallel=true", "parallel.context=2"}},
    {"tp6 (kv replicated)", {W(6), "parallel.tensor=6"}},
};
static const layout drop_moe[] = {
    {"etp2 ep2", {W(4), "parallel.tensor=2", "parallel.sequence_parallel=true", "parallel.data=2",
                  "parallel.expert=2"}},
    {"tp2+sp cp2", {W(4), "parallel.tensor=2", "parallel.sequence_parallel=true", "parallel.context=2"}},
};

/* Documents (data.reset_attention_mask): the document starts loaded on every stage, masked in
 * the attention of every layout (context parallelism: by the key positions). */
static const char *const docs_on[] = {"data.reset_attention_mask=true", "data.reset_position_ids=true", NULL};
static const char *const docs_pos[] = {"data.reset_attention_mask=true", "data.reset_position_ids=true", NULL};
static const layout docs_gpt[] = {
    {"tp2+sp", {W(2), "parallel.tensor=2", "parallel.sequence_parallel=true"}},
    {"cp2", {W(2), "parallel.context=2"}},
    {"pp2 interleaved", {W(2), "parallel.pipeline=2", "parallel.virtual_stages=2"}},
    {"recompute full", {"training.recompute=full"}},
    {"tp2 cp2 pp2 dp2", {W(16), "parallel.tensor=2", "parallel.context=2", "parallel.pipeline=2",
                         "parallel.data=2"}},
};
static const layout docs_llama[] = {
    {"cp2 recompute sel", {W(2), "parallel.context=2", "training.recompute=selective"}},
    {"tp2+sp cp2", {W(4), "parallel.tensor=2", "parallel.sequence_parallel=true", "parallel.context=2"}},
};
static const char *const pos_only[] = {"data.reset_position_ids=true", NULL};
static const layout pos_llama[] = {
    {"cp2", {W(2), "parallel.context=2"}},
    {"tp2 pp2", {W(4), "parallel.tensor=2", "parallel.pipeline=2"}},
};
static const layout docs_moe[] = {
    {"ep2 pp2", {W(4), "parallel.data=2", "parallel.expert=2", "parallel.pipeline=2"}},
};

/* Query and key norms (model.qk_layernorm): one weight over d shared by the heads, so each
 * tensor rank's gradient is partial over TP with or without SP (compiler/partition.c), also
 * when key/value heads are replicated over tensor ranks. */
static const char *const qk[] = {"model.qk_layernorm=true", NULL};
static const layout qk_llama[] = {
    {"tp2", {W(2), "parallel.tensor=2", "parallel.sequence_parallel=false"}},
    {"tp2+sp", {W(2), "parallel.tensor=2", "parallel.sequence_parallel=true"}},
    {"cp2", {W(2), "parallel.context=2"}},
    {"pp2 interleaved", {W(2), "parallel.pipeline=2", "parallel.virtual_stages=2"}},
    {"dp2 dist-opt", {W(2), "parallel.data=2", "parallel.distributed_optimizer=true"}},
    {"recompute full", {"training.recompute=full"}},
    {"recompute sel", {"training.recompute=selective"}},
    {"tp6 (kv replicated)", {W(6), "parallel.tensor=6"}},
    {"tp2+sp cp2 pp2", {W(8), "parallel.tensor=2", "parallel.sequence_parallel=true",
                        "parallel.context=2", "parallel.pipeline=2"}},
};
/* LayerNorm (weight and bias) in tiny GPT, its QKV with a bias */
static const layout qk_gpt[] = {
    {"tp2", {W(2), "parallel.tensor=2", "parallel.sequence_parallel=false"}},
    {"tp3 dp2 dist-opt", {W(6), "parallel.tensor=3", "parallel.data=2",
                          "parallel.distributed_optimizer=true"}},
};
static const layout qk_moe[] = {
    {"etp2 ep2", {W(4), "parallel.tensor=2", "parallel.sequence_parallel=true", "parallel.data=2",
                  "parallel.expert=2"}},
};

/* The pre-softmax router (moe.router_score: presoftmax): softmax over every expert, the chosen
 * probabilities unnormalised. */
static const char *const presoftmax[] = {"moe.router_score=presoftmax", NULL};
static const layout moe_pre[] = {
    {"ep2", {W(2), "parallel.data=2", "parallel.expert=2"}},
    {"etp2 ep2", {W(4), "parallel.tensor=2", "parallel.sequence_parallel=true", "parallel.data=2",
                  "parallel.expert=2"}},
};

/* The top-k scaling factor (moe.router_topk_scaling_factor, DeepSeek's routed_scaling_factor):
 * the routed experts' weights times 2.5 with the sigmoid router, under expert and expert-tensor
 * parallelism; and it changes the model (the first step's loss moves). */
static const char *const scaled[] = {"moe.router_topk_scaling_factor=2.5",
                                     "moe.router_score=sigmoid", NULL};
static const layout moe_scaled[] = {
    {"ep2", {W(2), "parallel.data=2", "parallel.expert=2"}},
    {"etp2 ep2",
     {W(4), "parallel.tensor=2", "parallel.sequence_parallel=true", "parallel.data=2",
      "parallel.expert=2"}},
    {"pp2 interleaved", {W(2), "parallel.pipeline=2", "parallel.virtual_stages=2"}},
};
/* A router option changes the model: tiny MoE's first step with `base` and with `changed`
 * differ, in its loss or its gradient norm (`what` names the change). */
static void check_moves(const char *const *base, const char *const *changed, const char *what) {
    mgc_plan *a = compile("models/tiny-moe.yaml", base, NULL),
             *b = compile("models/tiny-moe.yaml", changed, NULL);
    T_CHECK(a && b);
    double la[STEPS], na[STEPS], lb[STEPS], nb[STEPS];
    if (a && b) {
        T_EQ_I64(train(a, la, na), 0);
        T_EQ_I64(train(b, lb, nb), 0);
        T_CHECK(fabs(la[0] - lb[0]) > 1e-4 || fabs(na[0] - nb[0]) > 1e-4 * na[0]);
        printf("models/tiny-moe.yaml: first loss %.6f, %.6f, gradient norm %.6f, %.6f %s\n", la[0],
               lb[0], na[0], nb[0], what);
    }
    mgc_plan_free(a);
    mgc_plan_free(b);
}
static void check_topk_scale(void) {
    static const char *const sig[] = {"moe.router_score=sigmoid", NULL};
    check_moves(sig, scaled, "with the sigmoid router's top-k weights x 2.5");
}

/* Group-limited routing (moe.router_num_groups, moe.router_group_topk: DeepSeek-V3's): two
 * groups of four experts, each token choosing within the one whose top two probabilities sum
 * highest (pre-softmax router: groups compare probabilities, not logits). Every layout routes
 * alike, and the grouped choice differs from the plain top-k. */
static const char *const grouped[] = {"moe.router_num_groups=2", "moe.router_group_topk=1",
                                      "moe.router_score=presoftmax", NULL};
static const layout moe_grouped[] = {
    {"ep2", {W(2), "parallel.data=2", "parallel.expert=2"}},
    {"etp2 ep2",
     {W(4), "parallel.tensor=2", "parallel.sequence_parallel=true", "parallel.data=2",
      "parallel.expert=2"}},
    {"cp2 pp2", {W(4), "parallel.context=2", "parallel.pipeline=2"}},
};
static void check_groups(void) {
    check_moves(presoftmax, grouped, "with the experts in two groups of which a token uses one");
}

/* The sequence-wise aux loss (moe.aux_loss_scope: sequence; Megatron's seq_aux_loss): each
 * sequence's counts, summed over the tensor and context ranks that hold parts of it, weigh that
 * sequence's tokens; the loss differs from the microbatch's (step 1's gradient norm moves), and
 * every layout computes it alike (the CPU kernels against Megatron's form: test_cpu_ops). Seed
 * 7: with the default seed one router's near tie (logits equal to about 1e-7) falls the other
 * way under context parallelism's rounding at step 4, which moves the later norms by 3e-4. */
static const char *const seq_aux[] = {"moe.aux_loss_scope=sequence", "training.seed=7", NULL};
static const char *const seq_aux_base[] = {"training.seed=7", NULL};
static const layout moe_seq_aux[] = {
    {"tp2+sp cp2",
     {W(4), "parallel.tensor=2", "parallel.sequence_parallel=true", "parallel.context=2"}},
    {"etp2 ep2",
     {W(4), "parallel.tensor=2", "parallel.sequence_parallel=true", "parallel.data=2",
      "parallel.expert=2"}},
    {"pp2 interleaved", {W(2), "parallel.pipeline=2", "parallel.virtual_stages=2"}},
    {"recompute full", {"training.recompute=full"}},
};

/* Aux-loss-free balancing (moe.expert_bias_update_rate, DeepSeek-V3's): on one rank, an op hook
 * reads every router's bias input and its choices. Each step the bias is what the steps before
 * made of it (starting at 0: rate x sign(mean - count) per expert, from the step's counts
 * summed), the same in every microbatch; each token's experts are the top k of sigmoid(logit) +
 * bias; some choice differs from the unbiased top k (the bias acts); and the biases spread the
 * load: the busiest expert over the mean, averaged over the later steps, is lower than without
 * them (at this rate; 0.05 overshoots on this model and spreads nothing). */
static const char *const biased_router[] = {"moe.router_score=sigmoid",
                                            "moe.expert_bias_update_rate=0.01", NULL};
static const layout moe_biased[] = {
    {"ep2", {W(2), "parallel.data=2", "parallel.expert=2"}},
    {"etp2 ep2",
     {W(4), "parallel.tensor=2", "parallel.sequence_parallel=true", "parallel.data=2",
      "parallel.expert=2"}},
    {"pp2 interleaved", {W(2), "parallel.pipeline=2", "parallel.virtual_stages=2"}},
    {"cp2 dp2 dist-opt",
     {W(4), "parallel.context=2", "parallel.data=2", "parallel.distributed_optimizer=true"}},
    {"recompute full", {"training.recompute=full"}},
};
typedef struct bias_ref {
    int64_t L, E, k;
    double rate;
    double *want; /* (L x E) the bias the step routes with */
    int64_t bad_bias, bad_choice, changed, routes;
} bias_ref;
static void bias_hook(void *ctx, const mgc_op_call *c) {
    bias_ref *r = ctx;
    const mgc_plan_op *op = c->op;
    int64_t l = layer_of(c);
    if (op->kind != MGC_POP_MOE_ROUTE || op->iattr[0] != 0 || l < 0 || l >= r->L) return;
    r->routes++;
    if (op->n_in < 2) {
        r->bad_bias++;
        return;
    }
    const float *b = c->in[1], *lg = c->in[0];
    const int32_t *ids = c->out[1];
    for (int64_t e = 0; e < r->E; e++)
        r->bad_bias += fabs(b[e] - r->want[l * r->E + e]) > 1e-6;
    const mgc_plan_tensor *t = &c->chunk->tensors[op->out[1]];
    int64_t n = t->dim[0], E = r->E, k = r->k;
    for (int64_t i = 0; i < n; i++) {
        double s[64], u[64];
        for (int64_t e = 0; e < E; e++)
            u[e] = 1 / (1 + exp(-(double)lg[i * E + e])), s[e] = u[e] + b[e];
        for (int64_t j = 0; j < k; j++) { /* the j-th largest biased score, ties to lower */
            int64_t best = -1, plain = -1;
            for (int64_t e = 0; e < E; e++) {
                int above = 0, above_u = 0;
                for (int64_t f = 0; f < E; f++) {
                    above += s[f] > s[e] || (s[f] == s[e] && f < e);
                    above_u += u[f] > u[e] || (u[f] == u[e] && f < e);
                }
                if (above == j) best = e;
                if (above_u == j) plain = e;
            }
            r->bad_choice += ids[i * k + j] != best;
            r->changed += best != plain;
        }
    }
}
static double busiest(const int64_t *c, int64_t L, int64_t E) {
    double worst = 0;
    for (int64_t l = 0; l < L; l++) {
        int64_t sum = 0, most = 0;
        for (int64_t e = 0; e < E; e++)
            sum += c[l * E + e], most = c[l * E + e] > most ? c[l * E + e] : most;
        if (sum) worst = fmax(worst, (double)most * (double)E / (double)sum);
    }
    return worst;
}
static void check_expert_bias(void) {
    enum { N = 12 };
    static const char *const unbiased[] = {"moe.router_score=sigmoid", NULL};
    double worst[2] = {0, 0};
    for (int with = 0; with < 2; with++) {
        mgc_plan *p = compile("models/tiny-moe.yaml", with ? biased_router : unbiased, NULL);
        T_CHECK(p != NULL);
        if (!p) return;
        one_rank o;
        int ok = one_rank_open(&o, p, N);
        T_CHECK(ok);
        bias_ref r = {0, 0, 0, 0.01, NULL, 0, 0, 0, 0};
        mgc_plan_config_int(p, "model.num_layers", &r.L);
        mgc_plan_config_int(p, "moe.num_experts", &r.E);
        mgc_plan_config_int(p, "moe.top_k", &r.k);
        r.want = calloc((size_t)(r.L * r.E), sizeof *r.want);
        if (ok && with) mgc_exec_set_op_hooks(o.x, NULL, bias_hook, &r);
        for (int it = 0; ok && it < N; it++) {
            mgc_step_stats st;
            T_EQ_I64(mgc_exec_step(o.x, it, mgc_train_data_sample, o.data, &st), 0);
            if (!st.expert_counts) break;
            T_CHECK(with ? st.expert_bias != NULL : st.expert_bias == NULL);
            if (it >= N / 2) worst[with] += busiest(st.expert_counts, r.L, r.E) / (N - N / 2);
            if (!with || !st.expert_bias) continue;
            for (int64_t l = 0; l < r.L; l++) { /* the update, from its definition */
                double sum = 0;
                for (int64_t e = 0; e < r.E; e++)
                    sum += (double)st.expert_counts[l * r.E + e];
                for (int64_t e = 0; e < r.E && sum > 0; e++) {
                    double off = sum / (double)r.E - (double)st.expert_counts[l * r.E + e];
                    r.want[l * r.E + e] += off > 0 ? r.rate : off < 0 ? -r.rate : 0;
                    r.bad_bias += fabs(st.expert_bias[l * r.E + e] - r.want[l * r.E + e]) > 1e-6;
                }
            }
        }
        if (with) {
            T_EQ_I64(r.bad_bias, 0);
            T_EQ_I64(r.bad_choice, 0);
            T_CHECK(r.changed > 0);
            T_CHECK(r.routes > 0);
            printf("models/tiny-moe.yaml expert bias (rate 0.01): %lld routes over %d steps with "
                   "the bias expected, every choice the biased top-k (%lld differ from the "
                   "unbiased)\n",
                   (long long)r.routes, N, (long long)r.changed);
        }
        one_rank_close(&o);
        mgc_plan_free(p);
        free(r.want);
    }
    T_CHECK(worst[1] < worst[0]);
    printf("models/tiny-moe.yaml: busiest expert over the mean in steps %d-%d %.2f without the "
           "bias, %.2f with it\n",
           N / 2 + 1, N, worst[0], worst[1]);
}

/* Sliding-window attention (model.window_size): every layout masks by the keys' positions
 * (context parallelism: the load-balanced chunks and the gathered keys), with documents too. */
static const char *const win[] = {"model.window_size=12", NULL}; /* of 32 tokens */
static const layout win_llama[] = {
    {"tp2+sp", {W(2), "parallel.tensor=2", "parallel.sequence_parallel=true"}},
    {"cp2", {W(2), "parallel.context=2"}},
    {"pp2 interleaved", {W(2), "parallel.pipeline=2", "parallel.virtual_stages=2"}},
    {"recompute full", {"training.recompute=full"}},
    {"tp2 cp2 pp2 dp2", {W(16), "parallel.tensor=2", "parallel.context=2", "parallel.pipeline=2",
                         "parallel.data=2"}},
};
/* local and global layers interleaved (model.window_layers): the two pipeline stages and the
 * context ranks each hold both kinds */
static const char *const win_odd[] = {"model.window_size=8", "model.window_layers=[1, 3]", NULL};
static const layout win_mixed[] = {
    {"pp2", {W(2), "parallel.pipeline=2"}},
    {"tp2 cp2", {W(4), "parallel.tensor=2", "parallel.context=2"}},
};
static const char *const win_docs[] = {"model.window_size=20", "data.reset_attention_mask=true",
                                       "model.attention_dropout=0.1", NULL};
static const layout win_gpt[] = {
    {"tp2", {W(2), "parallel.tensor=2", "parallel.sequence_parallel=false"}},
    {"cp2", {W(2), "parallel.context=2"}},
    {"recompute sel", {"training.recompute=selective"}},
};

/* Two layouts that must train alike (where neither matches one rank exactly): every step's
 * loss and gradient norm within 1e-5 relative. */
static void check_pair(const char *path, const char *const *extra, const layout *a, const layout *b) {
    mgc_plan *p = compile(path, extra, a->sets), *q = compile(path, extra, b->sets);
    double la[STEPS], na[STEPS], lb[STEPS], nb[STEPS];
    T_CHECK(p && q && train(p, la, na) == 0 && train(q, lb, nb) == 0);
    double worst = 0;
    for (int i = 0; p && q && i < STEPS; i++) {
        T_NEAR_REL(la[i], lb[i], 1e-5);
        T_NEAR_REL(na[i], nb[i], 1e-5);
        if (fabs(la[i] - lb[i]) / fabs(lb[i]) > worst) worst = fabs(la[i] - lb[i]) / fabs(lb[i]);
    }
    printf("%s%s%s: %s against %s: worst relative loss difference %.2e\n", path, extra ? " " : "",
           extra ? extra[0] : "", a->name, b->name, worst);
    mgc_plan_free(p);
    mgc_plan_free(q);
}

/* Capacity mode with expert tensor parallelism: the kept rows, packed, gathered over ETP by
 * their counts (the buffers hold E x capacity rows), against the same layout without ETP. */
static const layout cap_etp[] = {
    {"etp2 ep2", {W(4), "parallel.tensor=2", "parallel.sequence_parallel=true", "parallel.data=2",
                  "parallel.expert=2"}},
    {"etp1 ep2", {W(4), "parallel.tensor=2", "parallel.sequence_parallel=true", "parallel.data=2",
                  "parallel.expert=2", "parallel.expert_tensor=1"}},
};

/* Capacity mode: drops are decided per source rank over its microbatch's tokens, so layouts
 * that keep a microbatch's tokens together (data, expert, pipeline) drop the same ones. */
static const char *const capacity[] = {"moe.capacity_factor=1.0", NULL};
static const layout moe_capacity[] = {
    {"ep2", {W(2), "parallel.data=2", "parallel.expert=2"}},
    {"pp2 1f1b", {W(2), "parallel.pipeline=2"}},
};

/* main's sections: `test_train NAME` runs one of them (and `eval` or `eod` one check of
 * `basics`), no argument all of them.  ci1 and ci2 are the two halves that ctest runs side by
 * side as test_train1 and test_train2 (tests/CMakeLists.txt), and that scripts/test.sh runs
 * side by side under ThreadSanitizer; the halves are balanced by the sections' seconds on a
 * 2-core machine (gcc, docs/testing.md). */
static const struct {
    const char *name;
    int half;
} sections[] = {
    /* ci1: about 93 s of 187 (gcc, one 2-core machine, 2026-11-29) */
    {"grads", 1}, {"basics", 1}, {"overlap", 1}, {"fusion", 1}, {"chunks", 1}, {"modules", 1},
    {"moe", 1},
    /* ci2: about 93 s */
    {"devcomm", 2}, {"recompute", 2}, {"moeload", 2}, {"docs", 2}, {"gpt", 2}, {"llama", 2},
    {"kv", 2}, {"dropout", 2}, {"qk", 2}, {"window", 2},
};
static const char *only; /* main's argument: a section, a half, or NULL (everything) */

static int half_of(const char *arg) {
    return !strcmp(arg, "ci1") ? 1 : !strcmp(arg, "ci2") ? 2 : 0;
}

static int part_known(const char *arg) {
    if (half_of(arg) || !strcmp(arg, "eval") || !strcmp(arg, "eod")) return 1;
    for (size_t i = 0; i < sizeof sections / sizeof *sections; i++)
        if (!strcmp(sections[i].name, arg)) return 1;
    return 0;
}

/* Whether main runs the section NAME (which must be in sections[]). */
static int part(const char *name) {
    for (size_t i = 0; i < sizeof sections / sizeof *sections; i++)
        if (!strcmp(sections[i].name, name)) {
            int half = only ? half_of(only) : 0;
            return !only || (half ? sections[i].half == half : !strcmp(only, name));
        }
    fprintf(stderr, "test_train: section '%s' is missing from sections[]\n", name);
    exit(1);
}

int main(int argc, char **argv) {
    only = argc > 1 ? argv[1] : NULL;
    if (only && !part_known(only)) {
        fprintf(stderr, "test_train: no section '%s'; the sections are ci1, ci2 (the two halves "
                        "ctest runs side by side), eval, eod and", only);
        for (size_t i = 0; i < sizeof sections / sizeof *sections; i++)
            fprintf(stderr, " %s", sections[i].name);
        fprintf(stderr, "\n");
        return 2;
    }
    if (part("grads")) {
        static const char *const bias[] = {"model.add_bias_linear=true", NULL};
        check_all_grads("examples/tiny-gpt.yaml", NULL);
        check_all_grads("models/tiny-llama.yaml", NULL);
        check_all_grads("models/tiny-moe.yaml", NULL);
        check_all_grads("models/tiny-moe.yaml", bias); /* the experts' biases too */
        check_all_grads("models/tiny-llama.yaml", qk); /* the query and key norms */
        check_all_grads("models/tiny-moe.yaml", presoftmax);
        check_all_grads("examples/tiny-gpt.yaml", qk);
    }
    if (part("basics")) {
        check_eod_mask();
        check_loss_scaling();
        check_graphs();
        check_eval();
    }
    if (part("overlap")) {
        /* tiny-gpt: about ten buckets; tiny-llama: interleaved, sharded optimizer */
        static const char *const dp2[] = {"parallel.world_size=2", "parallel.data=2",
                                          "parallel.grad_bucket_size=50000", NULL};
        static const char *const dpo[] = {"parallel.world_size=4", "parallel.data=2",
                                          "parallel.pipeline=2", "parallel.virtual_stages=2",
                                          "parallel.distributed_optimizer=true",
                                          "training.global_batch_size=8",
                                          "parallel.grad_bucket_size=20000", NULL};
        static const char *const ep2[] = {"parallel.world_size=2", "parallel.data=2",
                                          "parallel.expert=2", NULL};
        /* pipeline x data with tied embeddings: the output layer's copy waits for
         * EMBED_GRADS, and its bucket shares the group with the buckets handed over */
        static const char *const tied[] = {"parallel.world_size=4", "parallel.data=2",
                                           "parallel.pipeline=2", "parallel.grad_bucket_size=20000",
                                           NULL};
        check_overlap("examples/tiny-gpt.yaml", dp2);
        check_overlap("examples/tiny-gpt.yaml", tied);
        check_overlap("models/tiny-llama.yaml", dpo);
        check_overlap("models/tiny-moe.yaml", ep2);
    }
    if (part("devcomm")) {
        /* the device communicator: tensor (+SP) and pipeline with the tied embedding's group;
         * context and tensor; pipeline x data with a sharded optimizer (reduce-scatter and
         * all-gather buckets); replicated key/value heads (their own group); experts with
         * expert tensor parallelism (all-to-alls, variable gather and reduce-scatter) */
        static const char *const d1[] = {"parallel.world_size=4",           "parallel.tensor=2",
                                         "parallel.sequence_parallel=true", "parallel.pipeline=2",
                                         "parallel.grad_bucket_size=20000", NULL};
        static const char *const d2[] = {"parallel.world_size=4", "parallel.tensor=2",
                                         "parallel.context=2", NULL};
        static const char *const d3[] = {"parallel.world_size=4",
                                         "parallel.data=2",
                                         "parallel.pipeline=2",
                                         "parallel.virtual_stages=2",
                                         "parallel.distributed_optimizer=true",
                                         "training.global_batch_size=8",
                                         "parallel.grad_bucket_size=20000",
                                         NULL};
        static const char *const d4[] = {"parallel.world_size=6", "parallel.tensor=6", NULL};
        static const char *const d5[] = {
            "parallel.world_size=4", "parallel.tensor=2", "parallel.sequence_parallel=true",
            "parallel.data=2",       "parallel.expert=2", NULL};
        check_device_comm("examples/tiny-gpt.yaml", d1);
        check_device_comm("models/tiny-llama.yaml", d2);
        check_device_comm("models/tiny-llama.yaml", d3);
        check_device_comm("models/tiny-llama.yaml", d4);
        check_device_comm("models/tiny-moe.yaml", d5);
    }
    if (part("fusion")) {
        /* dropout on: the fused op must draw the same dropout stream; tp2 + SP: sharded rows */
        static const char *const drop[] = {"model.hidden_dropout=0.1", NULL};
        static const char *const drop_tp[] = {"model.hidden_dropout=0.1", "parallel.world_size=2", "parallel.tensor=2",
                                              "parallel.sequence_parallel=true", NULL};
        /* without dropout, the residual branches' bias gradients go into the norm backwards:
         * two a layer (the attention's output projection, the MLP's second layer), also under
         * tp2, where every rank has the whole residual gradient (not under SP: there the
         * linears read it all-gathered) */
        static const char *const tp2[] = {"parallel.world_size=2", "parallel.tensor=2", NULL};
        T_CHECK(check_fusion("examples/tiny-gpt.yaml", NULL) > 0);
        T_CHECK(check_fusion("examples/tiny-gpt.yaml", tp2) > 0);
        /* the embedding + first norm fused with learned positions restarting at documents, and
         * with the context-parallel positions */
        static const char *const gpt_docs[] = {"data.reset_position_ids=true", NULL};
        static const char *const gpt_cp2[] = {"parallel.world_size=2", "parallel.context=2", NULL};
        check_fusion("examples/tiny-gpt.yaml", gpt_docs);
        check_fusion("examples/tiny-gpt.yaml", gpt_cp2);
        /* with dropout the norm backwards take the residual branches' dropout backwards (two
         * a layer) and then their bias gradients too, and the first layer's takes the
         * embedding's (the embedding, its dropout and that norm are one op in the forward,
         * at tp1) */
        T_CHECK(check_fusion("examples/tiny-gpt.yaml", drop) == 8 && fusion_dropb == 9);
        T_CHECK(check_fusion("examples/tiny-gpt.yaml", drop_tp) >= 0 && fusion_dropb == 9);
        /* selective recompute re-runs the attention in the backward: it reads qkv too */
        static const char *const sel[] = {"training.recompute=selective", NULL};
        check_fusion("examples/tiny-gpt.yaml", sel);
        check_fusion("models/tiny-llama.yaml", NULL);
        /* RMSNorm's backward takes the bias gradients too */
        static const char *const llama_bias[] = {"model.add_bias_linear=true", NULL};
        T_CHECK(check_fusion("models/tiny-llama.yaml", llama_bias) > 0);
        /* full recompute re-runs the split and its ropes in the backward: they fuse too; with
         * context parallelism the rotation takes the load-balanced positions */
        static const char *const full[] = {"training.recompute=full", NULL};
        static const char *const cp2[] = {"parallel.world_size=2", "parallel.context=2", NULL};
        check_fusion("models/tiny-llama.yaml", full);
        check_fusion("models/tiny-llama.yaml", cp2);
        check_fusion("models/tiny-moe.yaml", NULL);
    }
    if (part("chunks")) {
        /* loss chunks: one rank, then each way the head is partitioned (vocabulary over TP
         * with and without SP, the sequence over CP, the loss chunk on the last of two
         * virtual stages, experts beside it) */
        static const char *const tpsp[] = {"parallel.world_size=2", "parallel.tensor=2",
                                           "parallel.sequence_parallel=true", NULL};
        static const char *const tp[] = {"parallel.world_size=2", "parallel.tensor=2",
                                         "parallel.sequence_parallel=false", NULL};
        static const char *const cpl[] = {"parallel.world_size=2", "parallel.context=2", NULL};
        static const char *const vpp[] = {"parallel.world_size=2", "parallel.pipeline=2",
                                          "parallel.virtual_stages=2", NULL};
        static const char *const moep[] = {"parallel.world_size=2", "parallel.data=2",
                                           "parallel.expert=2", "training.recompute=full", NULL};
        check_loss_chunks("examples/tiny-gpt.yaml", NULL, 4);
        check_loss_chunks("examples/tiny-gpt.yaml", tpsp, 2);
        check_loss_chunks("models/tiny-llama.yaml", tp, 4);
        check_loss_chunks("models/tiny-llama.yaml", cpl, 2);
        check_loss_chunks("examples/tiny-gpt.yaml", vpp, 2);
        check_loss_chunks("models/tiny-moe.yaml", moep, 2);
    }
    if (part("modules")) {
        static const char *const drop[] = {"model.hidden_dropout=0.1", NULL};
        /* recompute modules: GELU and LayerNorm (tp 2 + SP: the norm output re-gathered from
         * its recomputed shard), SwiGLU and RMSNorm over two pipeline stages, MoE experts */
        static const char *const pp2[] = {"parallel.world_size=2", "parallel.pipeline=2", NULL};
        static const char *const drop_sp[] = {"model.hidden_dropout=0.1", "parallel.world_size=2",
                                              "parallel.tensor=2",
                                              "parallel.sequence_parallel=true", NULL};
        check_recompute_modules("examples/tiny-gpt.yaml", drop);
        check_recompute_modules("examples/tiny-gpt.yaml", drop_sp);
        check_recompute_modules("models/tiny-llama.yaml", pp2);
        check_recompute_modules("models/tiny-moe.yaml", NULL);
    }
    if (part("recompute")) {
        /* one chunk of four layers; two chunks of two (tp2 + SP: the regathered norm outputs
         * re-run with their groups); MoE (the router and its counts re-run) */
        static const char *const tp_pp[] = {"parallel.world_size=4", "parallel.pipeline=2", "parallel.tensor=2",
                                            "parallel.sequence_parallel=true", NULL};
        check_recompute_method("examples/tiny-gpt.yaml", NULL);
        check_recompute_method("models/tiny-llama.yaml", tp_pp);
        check_recompute_method("models/tiny-moe.yaml", NULL);
        /* the second halves: GPT with dropout at tp2 + SP (the regathered norm output inside
         * the half), LLaMA over two stages, MoE over ep2 (the dispatch re-run) and with its
         * dense first layer's MLP too, and beside block recompute of each chunk's first layer */
        static const char *const drop_sp[] = {"model.hidden_dropout=0.1", "parallel.world_size=2", "parallel.tensor=2",
                                              "parallel.sequence_parallel=true", NULL};
        static const char *const pp2[] = {"parallel.world_size=2", "parallel.pipeline=2", NULL};
        static const char *const ep2[] = {"parallel.world_size=2", "parallel.data=2", "parallel.expert=2", NULL};
        static const char *const blk[] = {"training.recompute=full", "training.recompute_method=block",
                                          "training.recompute_num_layers=1", NULL};
        check_recompute_half("examples/tiny-gpt.yaml", drop_sp, "mlp");
        check_recompute_half("models/tiny-llama.yaml", pp2, "mlp");
        check_recompute_half("models/tiny-moe.yaml", ep2, "moe");
        check_recompute_half("models/tiny-moe.yaml", NULL, "mlp, moe");
        check_recompute_half("models/tiny-llama.yaml", blk, "mlp");
    }
    if (only && !strcmp(only, "eval")) check_eval();
    if (part("moeload")) check_expert_counts();
    if (only && !strcmp(only, "eod")) check_eod_mask();
    if (part("docs")) check_docs();
    if (part("docs")) check_doc_positions();
    if (part("gpt")) check_model("examples/tiny-gpt.yaml", NULL, dense, 11);
    if (part("llama")) check_model("models/tiny-llama.yaml", NULL, dense, 11);
    if (part("kv")) check_model("models/tiny-llama.yaml", NULL, kv_llama, 2);
    if (part("kv")) check_model("examples/tiny-gpt.yaml", mqa, kv_gpt, 3);
    if (part("moe")) check_model("models/tiny-moe.yaml", NULL, moe, 17);
    if (part("moe")) check_model("models/tiny-moe.yaml", biased, moe_bias, 3);
    if (part("moe")) check_model("models/tiny-moe.yaml", capacity, moe_capacity, 2);
    if (part("dropout")) check_model("examples/tiny-gpt.yaml", dropped, drop_gpt, 6);
    if (part("dropout")) check_model("examples/tiny-gpt.yaml", dropped48, drop_gpt48, 1);
    if (part("dropout")) check_model("models/tiny-llama.yaml", dropped, drop_llama, 3);
    if (part("dropout")) check_model("models/tiny-moe.yaml", dropped, drop_moe, 2);
    if (part("docs")) check_model("examples/tiny-gpt.yaml", docs_on, docs_gpt, 5);
    if (part("docs")) check_model("models/tiny-llama.yaml", docs_pos, docs_llama, 2);
    if (part("docs")) check_model("models/tiny-llama.yaml", pos_only, pos_llama, 2);
    if (part("docs")) check_model("models/tiny-moe.yaml", docs_on, docs_moe, 1);
    if (part("qk")) check_model("models/tiny-llama.yaml", qk, qk_llama, 9);
    if (part("qk")) check_model("examples/tiny-gpt.yaml", qk, qk_gpt, 2);
    if (part("qk")) check_model("models/tiny-moe.yaml", qk, qk_moe, 1);
    if (part("window")) check_window();
    if (part("window")) check_model("models/tiny-llama.yaml", win, win_llama, 5);
    if (part("window")) check_model("examples/tiny-gpt.yaml", win_docs, win_gpt, 3);
    if (part("window")) check_model("models/tiny-llama.yaml", win_odd, win_mixed, 2);
    if (part("moe")) check_model("models/tiny-moe.yaml", presoftmax, moe_pre, 2);
    if (part("moe")) check_topk_scale();
    if (part("moe")) check_model("models/tiny-moe.yaml", scaled, moe_scaled, 3);
    if (part("moe")) check_groups();
    if (part("moe")) check_model("models/tiny-moe.yaml", grouped, moe_grouped, 3);
    if (part("moe")) check_expert_bias();
    if (part("moe"))
        check_moves(seq_aux_base, seq_aux, "with the aux loss balancing each sequence");
    if (part("moe")) check_model("models/tiny-moe.yaml", seq_aux, moe_seq_aux, 4);
    if (part("moe"))
        check_model("models/tiny-moe.yaml", biased_router, moe_biased, 5);
    if (part("moe")) check_pair("models/tiny-moe.yaml", capacity, &cap_etp[0], &cap_etp[1]);
    return t_summary("test_train");
}
