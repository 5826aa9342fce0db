/* comm_mpi.c - the MPI transport: one rank per process, under mpirun/srun.
 *
 * Built only when CMake found MPI (it defines MGC_HAVE_MPI and links
 * MPI::MPI_C) and <mpi.h> is reachable; otherwise this file only defines
 * mgc_comm_mpi_world_create to return MGC_COMM_ERR_UNSUPPORTED.
 *
 * Same contract as the local transport (comm.h, docs/communicators.md):
 *  - every collective first all-gathers the ranks' descriptors and compares
 *    them, so a mismatch is reported by every rank, naming both operations;
 *  - reductions never use MPI_Allreduce/MPI_Reduce_scatter (their order is
 *    unspecified): contributions are gathered and folded in group-rank order
 *    by mgc_comm_reduce_ordered_f32, bit-identical to the local transport;
 *  - every wait is a nonblocking request polled with MPI_Testall and a
 *    sleep that backs off to 1 ms, up to the timeout; a timed-out MPI
 *    request cannot be cancelled, so the job is poisoned and mgc-run's main
 *    should MPI_Abort.
 * Each communicator is an MPI_Comm_dup / MPI_Comm_split of its parent, so
 * mgc traffic never matches anybody else's.  Elements travel as unsigned
 * integers of the dtype's size (bits, never arithmetic), counts up to INT_MAX
 * elements per block. */
#define MGC_COMM_INTERNAL
#include "comm.h"

#if defined(MGC_HAVE_MPI) && defined(__has_include)
#if __has_include(<mpi.h>)
#define MGC_COMM_MPI_BUILD 1
#endif
#endif

#ifdef MGC_COMM_MPI_BUILD

#include <limits.h>
#include <mpi.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* Shared by every communicator of the process: the failure that poisoned it.  With
 * MPI_THREAD_MULTIPLE two threads of the rank (the executor and its gradient reducer) may
 * use different handles at once, so `failed`, `stuck` and `msg` are under `mu`. */
typedef struct mpi_job {
    int refs;     /* handles alive (made and freed while one thread runs) */
    int finalize; /* we called MPI_Init_thread, so we finalize */
    const mgc_comm_iface *iface; /* mpi_iface, or mpi_iface_mt under MPI_THREAD_MULTIPLE */
    pthread_mutex_t mu;
    int failed;
    int stuck; /* a request timed out and is still pending */
    char msg[MGC_COMM_ERR_MAX];
} mpi_job;

typedef struct mpi_ctx {
    MPI_Comm comm; /* dup or split: mgc's private traffic */
    mpi_job *job;
} mpi_ctx;

static const mgc_comm_iface mpi_iface, mpi_iface_mt;

#define TAG_HEADER  1
#define TAG_PAYLOAD 2

/* The one MPI check: converts an MPI error into our status with MPI's text. */
#define MPI_TRY(c, call)                                                                           \
    do {                                                                                           \
        int mpi_rc_ = (call);                                                                      \
        if (mpi_rc_ != MPI_SUCCESS) {                                                              \
            char mpi_txt_[MPI_MAX_ERROR_STRING];                                                   \
            int mpi_len_ = 0;                                                                      \
            MPI_Error_string(mpi_rc_, mpi_txt_, &mpi_len_);                                        \
            s = mgc_comm_fail((c), MGC_COMM_ERR_SYSTEM, "%s:%d: %s: %s", __FILE__, __LINE__,       \
                              #call, mpi_txt_);                                                    \
            goto fail;                                                                             \
        }                                                                                          \
    } while (0)

static void job_fail(mpi_job *j, const char *text) {
    pthread_mutex_lock(&j->mu);
    if (!j->failed) {
        j->failed = 1;
        snprintf(j->msg, sizeof j->msg, "%s", text);
    }
    pthread_mutex_unlock(&j->mu);
}

/* 1 when the job failed earlier; the handle's error then says so. */
static int job_poisoned(mgc_comm *c) {
    mpi_job *j = ((mpi_ctx *)c->context)->job;
    char msg[MGC_COMM_ERR_MAX];
    pthread_mutex_lock(&j->mu);
    int failed = j->failed;
    if (failed) snprintf(msg, sizeof msg, "%s", j->msg);
    pthread_mutex_unlock(&j->mu);
    if (failed) mgc_comm_fail(c, MGC_COMM_ERR_ABORTED, "released because the job failed: %s", msg);
    return failed;
}

static MPI_Datatype elem_type(mgc_dtype dt) {
    switch (mgc_dtype_size(dt)) {
    case 1:
        return MPI_UINT8_T;
    case 2:
        return MPI_UINT16_T;
    case 4:
        return MPI_UINT32_T;
    default:
        return MPI_UINT64_T;
    }
}

static double now_ms(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec * 1e3 + (double)t.tv_nsec / 1e6;
}

/* Polls the requests until done or the timeout; what: the operation's text. */
static mgc_comm_status wait_all(mgc_comm *c, int n, MPI_Request *req, const char *what) {
    mpi_ctx *x = c->context;
    double deadline = now_ms() + (double)c->timeout_ms;
    long sleep_ns = 1000;
    mgc_comm_status s = MGC_COMM_OK;
    for (;;) {
        int flag = 0;
        MPI_TRY(c, MPI_Testall(n, req, &flag, MPI_STATUSES_IGNORE));
        if (flag) return MGC_COMM_OK;
        if (now_ms() > deadline) {
            s = mgc_comm_fail(c, MGC_COMM_ERR_TIMEOUT,
                              "timed out after %lld ms in %s: a peer of %s did not take part "
                              "(the MPI requests cannot be cancelled: abort the job)",
                              (long long)c->timeout_ms, what, c->name);
            job_fail(x->job, c->err);
            pthread_mutex_lock(&x->job->mu);
            x->job->stuck = 1;
            pthread_mutex_unlock(&x->job->mu);
            return s;
        }
        struct timespec ts = {0, sleep_ns};
        nanosleep(&ts, NULL);
        if (sleep_ns < 1000000L) sleep_ns *= 2;
    }
fail:
    job_fail(x->job, c->err);
    return s;
}

static int fits_int(size_t v) {
    return v <= (size_t)INT_MAX;
}

/* ---- descriptors ---------------------------------------------------------- */

/* All-gathers the descriptors and compares them with group rank 0's. */
static mgc_comm_status exchange_desc(mgc_comm *c, const mgc_comm_op *op, char *what,
                                     size_t what_size) {
    mpi_ctx *x = c->context;
    mgc_comm_desc mine, *all = malloc((size_t)c->size * sizeof *all);
    mgc_comm_status s = MGC_COMM_OK;
    MPI_Request req = MPI_REQUEST_NULL;
    mgc_comm_desc_of(op, &mine);
    mgc_comm_desc_format(&mine, what, what_size);
    if (!all) return mgc_comm_fail(c, MGC_COMM_ERR_NOMEM, "%s: out of memory", what);
    MPI_TRY(c, MPI_Iallgather(&mine, (int)sizeof mine, MPI_BYTE, all, (int)sizeof mine, MPI_BYTE,
                              x->comm, &req));
    if ((s = wait_all(c, 1, &req, what)) != MGC_COMM_OK) goto out;
    for (int r = 1; r < c->size; r++) {
        if (!mgc_comm_desc_differ(&all[0], &all[r])) continue;
        char a[160], b[160];
        mgc_comm_desc_format(&all[0], a, sizeof a);
        mgc_comm_desc_format(&all[r], b, sizeof b);
        s = mgc_comm_fail(c, MGC_COMM_ERR_MISMATCH,
                          "collective mismatch in %s: group rank 0 (world %d) called %s but group "
                          "rank %d (world %d) called %s",
                          c->name, c->members[0], a, r, c->members[r], b);
        job_fail(x->job, c->err);
        goto out;
    }
    goto out;
fail:
    job_fail(x->job, c->err);
out:
    free(all);
    return s;
}

/* all_to_all_v: each rank checks what its peers send it against its
 * recv_counts, then all agree on the first rank that found a difference. */
static mgc_comm_status check_a2a_counts(mgc_comm *c, const mgc_comm_op *op, const char *what) {
    mpi_ctx *x = c->context;
    int n = c->size;
    uint64_t *sc = malloc(2 * (size_t)n * sizeof *sc);
    int *bad = malloc((size_t)n * sizeof *bad);
    mgc_comm_status s = MGC_COMM_OK;
    MPI_Request req = MPI_REQUEST_NULL;
    if (!sc || !bad) {
        s = mgc_comm_fail(c, MGC_COMM_ERR_NOMEM, "%s: out of memory", what);
        goto out;
    }
    uint64_t *got = sc + n;
    for (int r = 0; r < n; r++)
        sc[r] = op->send_counts[r];
    MPI_TRY(c, MPI_Ialltoall(sc, 1, MPI_UINT64_T, got, 1, MPI_UINT64_T, x->comm, &req));
    if ((s = wait_all(c, 1, &req, what)) != MGC_COMM_OK) goto out;
    int mine = -1; /* the first peer whose count differs */
    for (int r = 0; r < n && mine < 0; r++)
        if (got[r] != op->recv_counts[r]) mine = r;
    MPI_TRY(c, MPI_Iallgather(&mine, 1, MPI_INT, bad, 1, MPI_INT, x->comm, &req));
    if ((s = wait_all(c, 1, &req, what)) != MGC_COMM_OK) goto out;
    for (int r = 0; r < n; r++) {
        if (bad[r] < 0) continue;
        if (r == c->rank)
            s = mgc_comm_fail(c, MGC_COMM_ERR_MISMATCH,
                              "%s count mismatch in %s: group rank %d (world %d) sends %llu "
                              "elements to group rank %d (world %d), which expects %zu",
                              what, c->name, bad[r], c->members[bad[r]],
                              (unsigned long long)got[bad[r]], r, c->members[r],
                              op->recv_counts[bad[r]]);
        else
            s = mgc_comm_fail(c, MGC_COMM_ERR_MISMATCH,
                              "%s count mismatch in %s: group rank %d (world %d) expects a "
                              "different count from group rank %d (world %d)",
                              what, c->name, r, c->members[r], bad[r], c->members[bad[r]]);
        job_fail(x->job, c->err);
        break;
    }
    goto out;
fail:
    job_fail(x->job, c->err);
out:
    free(sc);
    free(bad);
    return s;
}

/* ---- collectives ---------------------------------------------------------- */

static mgc_comm_status collective(mgc_comm *c, const mgc_comm_op *op) {
    mpi_ctx *x = c->context;
    int n = c->size, me = c->rank;
    size_t es = mgc_dtype_size(op->dt);
    MPI_Datatype T = elem_type(op->dt);
    char what[160];
    void *tmp = NULL;
    const float **parts = NULL;
    int *ic = NULL;
    MPI_Request req = MPI_REQUEST_NULL;
    mgc_comm_status s = MGC_COMM_OK;
    if (job_poisoned(c)) return MGC_COMM_ERR_ABORTED;
    if ((s = exchange_desc(c, op, what, sizeof what)) != MGC_COMM_OK) return s;
    if (op->kind == MGC_COMM_OP_ALL_TO_ALL_V && (s = check_a2a_counts(c, op, what)) != MGC_COMM_OK)
        return s;
    if (!fits_int(op->count))
        return mgc_comm_fail(c, MGC_COMM_ERR_INVALID, "%s: more than INT_MAX elements per block",
                             what);
    int cnt = (int)op->count;
    switch (op->kind) {
    case MGC_COMM_OP_ALL_REDUCE:
    case MGC_COMM_OP_REDUCE_SCATTER:
        /* gather every contribution (of this rank's block), fold in rank order */
        tmp = malloc((size_t)n * op->count * es + 1);
        parts = malloc((size_t)n * sizeof *parts);
        if (!tmp || !parts) {
            s = mgc_comm_fail(c, MGC_COMM_ERR_NOMEM, "%s: out of memory", what);
            goto out;
        }
        if (op->kind == MGC_COMM_OP_ALL_REDUCE)
            MPI_TRY(c, MPI_Iallgather(op->send, cnt, T, tmp, cnt, T, x->comm, &req));
        else
            MPI_TRY(c, MPI_Ialltoall(op->send, cnt, T, tmp, cnt, T, x->comm, &req));
        if ((s = wait_all(c, 1, &req, what)) != MGC_COMM_OK) goto out;
        for (int r = 0; r < n; r++)
            parts[r] = (const float *)tmp + (size_t)r * op->count;
        mgc_comm_reduce_ordered_f32(op->recv, parts, n, op->count, op->red);
        break;
    case MGC_COMM_OP_ALL_GATHER: {
        const void *src = (const unsigned char *)op->recv + (size_t)me * op->count * es == op->send
                              ? MPI_IN_PLACE
                              : op->send;
        MPI_TRY(c, MPI_Iallgather(src, cnt, T, op->recv, cnt, T, x->comm, &req));
        s = wait_all(c, 1, &req, what);
        break;
    }
    case MGC_COMM_OP_ALL_TO_ALL_V:
        ic = malloc(4 * (size_t)n * sizeof *ic);
        if (!ic) {
            s = mgc_comm_fail(c, MGC_COMM_ERR_NOMEM, "%s: out of memory", what);
            goto out;
        }
        for (int r = 0; r < n; r++) {
            if (!fits_int(op->send_counts[r]) || !fits_int(op->send_displs[r]) ||
                !fits_int(op->recv_counts[r]) || !fits_int(op->recv_displs[r])) {
                s = mgc_comm_fail(c, MGC_COMM_ERR_INVALID, "%s: counts past INT_MAX", what);
                goto out;
            }
            ic[r] = (int)op->send_counts[r];
            ic[n + r] = (int)op->send_displs[r];
            ic[2 * n + r] = (int)op->recv_counts[r];
            ic[3 * n + r] = (int)op->recv_displs[r];
        }
        MPI_TRY(c, MPI_Ialltoallv(op->send, ic, ic + n, T, op->recv, ic + 2 * n, ic + 3 * n, T,
                                  x->comm, &req));
        s = wait_all(c, 1, &req, what);
        break;
    case MGC_COMM_OP_BROADCAST:
        MPI_TRY(c, MPI_Ibcast(op->recv, cnt, T, op->root, x->comm, &req));
        s = wait_all(c, 1, &req, what);
        break;
    default: /* barrier: the descriptor exchange was one */
        break;
    }
    goto out;
fail:
    job_fail(x->job, c->err);
out:
    free(tmp);
    free(parts);
    free(ic);
    return s;
}

/* ---- point to point ------------------------------------------------------- */

static mgc_comm_status p2p(mgc_comm *c, const mgc_comm_op *op) {
    mpi_ctx *x = c->context;
    mgc_comm_desc mine, theirs;
    char what[160];
    MPI_Request req[2] = {MPI_REQUEST_NULL, MPI_REQUEST_NULL};
    mgc_comm_status s = MGC_COMM_OK;
    void *drain = NULL;
    if (job_poisoned(c)) return MGC_COMM_ERR_ABORTED;
    mgc_comm_desc_of(op, &mine);
    mgc_comm_desc_format(&mine, what, sizeof what);
    if (!fits_int(op->count))
        return mgc_comm_fail(c, MGC_COMM_ERR_INVALID, "%s: more than INT_MAX elements", what);
    MPI_Datatype T = elem_type(op->dt);
    if (op->kind == MGC_COMM_OP_SEND) {
        MPI_TRY(c, MPI_Isend(&mine, (int)sizeof mine, MPI_BYTE, op->root, TAG_HEADER, x->comm,
                             &req[0]));
        MPI_TRY(c, MPI_Isend(op->send, (int)op->count, T, op->root, TAG_PAYLOAD, x->comm, &req[1]));
        return wait_all(c, 2, req, what);
    }
    MPI_TRY(c, MPI_Irecv(&theirs, (int)sizeof theirs, MPI_BYTE, op->root, TAG_HEADER, x->comm,
                         &req[0]));
    if ((s = wait_all(c, 1, req, what)) != MGC_COMM_OK) return s;
    if (theirs.count != mine.count || theirs.dt != mine.dt || theirs.seq != mine.seq) {
        char sd[160];
        mgc_comm_desc_format(&theirs, sd, sizeof sd);
        /* take the payload anyway so the sender is not left blocked */
        size_t bytes = (size_t)theirs.count * mgc_dtype_size((mgc_dtype)theirs.dt);
        drain = malloc(bytes + 1);
        if (drain && fits_int((size_t)theirs.count)) {
            MPI_TRY(c, MPI_Irecv(drain, (int)theirs.count, elem_type((mgc_dtype)theirs.dt),
                                 op->root, TAG_PAYLOAD, x->comm, &req[1]));
            wait_all(c, 1, &req[1], what);
        }
        s = mgc_comm_fail(c, MGC_COMM_ERR_MISMATCH,
                          "message mismatch in %s: group rank %d (world %d) called %s but group "
                          "rank %d (world %d) called %s",
                          c->name, op->root, c->members[op->root], sd, c->rank, c->world_rank,
                          what);
        job_fail(x->job, c->err);
        free(drain);
        return s;
    }
    MPI_TRY(c, MPI_Irecv(op->recv, (int)op->count, T, op->root, TAG_PAYLOAD, x->comm, &req[1]));
    return wait_all(c, 1, &req[1], what);
fail:
    job_fail(x->job, c->err);
    free(drain);
    return s;
}

/* ---- creation ------------------------------------------------------------- */

static mgc_comm_status wrap(MPI_Comm comm, mpi_job *job, int64_t timeout_ms, mgc_comm **out,
                            mgc_comm *err_on) {
    int rank = 0, size = 0, wrank = 0;
    mgc_comm_status s = MGC_COMM_OK;
    mgc_comm *c = calloc(1, sizeof *c);
    mpi_ctx *x = calloc(1, sizeof *x);
    int *members = NULL;
    MPI_Comm_rank(comm, &rank);
    MPI_Comm_size(comm, &size);
    MPI_Comm_rank(MPI_COMM_WORLD, &wrank);
    members = malloc((size_t)size * sizeof *members);
    if (!c || !x || !members) {
        s = MGC_COMM_ERR_NOMEM;
        goto out;
    }
    /* world ranks of the members, in group-rank order (blocking: every member
     * is already here, the split or dup returned) */
    if (MPI_Allgather(&wrank, 1, MPI_INT, members, 1, MPI_INT, comm) != MPI_SUCCESS) {
        s = MGC_COMM_ERR_SYSTEM;
        goto out;
    }
    x->comm = comm;
    x->job = job;
    if ((s = mgc_comm_init_base(c, job->iface, x, rank, size, wrank, members, timeout_ms,
                                "world")) != MGC_COMM_OK)
        goto out;
    job->refs++;
    *out = c;
    c = NULL;
    x = NULL;
out:
    if (s != MGC_COMM_OK && err_on)
        mgc_comm_fail(err_on, s, "creating a communicator: %s", mgc_comm_status_name(s));
    free(c);
    free(x);
    free(members);
    return s;
}

mgc_comm_status mgc_comm_mpi_world_create(const mgc_comm_config *cfg, mgc_comm **world, char *err,
                                          size_t err_size) {
    char dummy[1];
    if (!err || !err_size) {
        err = dummy;
        err_size = sizeof dummy;
    }
    err[0] = '\0';
    if (!world) return MGC_COMM_ERR_INVALID;
    *world = NULL;
    int64_t timeout_ms = 0;
    if (cfg && cfg->size >= offsetof(mgc_comm_config, timeout_ms) + sizeof cfg->timeout_ms)
        timeout_ms = cfg->timeout_ms;
    int inited = 0, provided = 0;
    MPI_Initialized(&inited);
    mpi_job *job = calloc(1, sizeof *job);
    if (!job) {
        snprintf(err, err_size, "mpi world: out of memory");
        return MGC_COMM_ERR_NOMEM;
    }
    if (pthread_mutex_init(&job->mu, NULL)) {
        snprintf(err, err_size, "mpi world: cannot make a mutex");
        free(job);
        return MGC_COMM_ERR_SYSTEM;
    }
    if (!inited) {
        /* MULTIPLE where the library has it: the executor's gradient reducer then runs on
         * a second thread (mgc_comm_concurrent); with less, the reductions stay in line */
        if (MPI_Init_thread(NULL, NULL, MPI_THREAD_MULTIPLE, &provided) != MPI_SUCCESS) {
            snprintf(err, err_size, "mpi world: MPI_Init_thread failed");
            pthread_mutex_destroy(&job->mu);
            free(job);
            return MGC_COMM_ERR_SYSTEM;
        }
        job->finalize = 1;
    } else if (MPI_Query_thread(&provided) != MPI_SUCCESS) {
        provided = MPI_THREAD_SINGLE;
    }
    job->iface = provided == MPI_THREAD_MULTIPLE ? &mpi_iface_mt : &mpi_iface;
    MPI_Comm dup;
    if (MPI_Comm_dup(MPI_COMM_WORLD, &dup) != MPI_SUCCESS) {
        snprintf(err, err_size, "mpi world: MPI_Comm_dup failed");
        if (job->finalize) MPI_Finalize();
        pthread_mutex_destroy(&job->mu);
        free(job);
        return MGC_COMM_ERR_SYSTEM;
    }
    mgc_comm_status s = wrap(dup, job, timeout_ms, world, NULL);
    if (s != MGC_COMM_OK) {
        snprintf(err, err_size, "mpi world: %s", mgc_comm_status_name(s));
        MPI_Comm_free(&dup);
        if (job->finalize) MPI_Finalize();
        pthread_mutex_destroy(&job->mu);
        free(job);
    }
    return s;
}

static mgc_comm_status mpi_split(mgc_comm *c, const mgc_comm_op *op, mgc_comm **out) {
    mpi_ctx *x = c->context;
    char what[160];
    mgc_comm_status s;
    *out = NULL;
    if (job_poisoned(c)) return MGC_COMM_ERR_ABORTED;
    if ((s = exchange_desc(c, op, what, sizeof what)) != MGC_COMM_OK) return s;
    MPI_Comm nc = MPI_COMM_NULL;
    int color = op->color < 0 ? MPI_UNDEFINED : (int)op->color;
    if (op->color > INT_MAX || op->key > INT_MAX || op->key < INT_MIN)
        return mgc_comm_fail(c, MGC_COMM_ERR_INVALID, "%s: color or key past INT_MAX", what);
    MPI_TRY(c, MPI_Comm_split(x->comm, color, (int)op->key, &nc));
    if (nc == MPI_COMM_NULL) return MGC_COMM_OK;
    if ((s = wrap(nc, x->job, c->timeout_ms, out, c)) != MGC_COMM_OK) MPI_Comm_free(&nc);
    return s;
fail:
    job_fail(x->job, c->err);
    return s;
}

/* ---- the table ------------------------------------------------------------ */

static mgc_comm_status mpi_run(mgc_comm *c, const mgc_comm_op *op) {
    if (op->kind == MGC_COMM_OP_SEND || op->kind == MGC_COMM_OP_RECV) return p2p(c, op);
    return collective(c, op);
}

static void mpi_abort(mgc_comm *c, const char *reason) {
    mpi_ctx *x = c->context;
    mgc_comm_fail(c, MGC_COMM_ERR_ABORTED, "aborted: %s", reason);
    job_fail(x->job, c->err);
}

static void mpi_free(mgc_comm *c) {
    mpi_ctx *x = c->context;
    mpi_job *job = x->job;
    /* after a timeout requests are in flight: freeing would block */
    if (!job->stuck) MPI_Comm_free(&x->comm);
    mgc_comm_free_base(c);
    free(x);
    free(c);
    if (--job->refs == 0) {
        if (job->finalize && !job->stuck) MPI_Finalize();
        pthread_mutex_destroy(&job->mu);
        free(job);
    }
}

static const mgc_comm_iface mpi_iface = {
    .name = "mpi",
    .run = mpi_run,
    .split = mpi_split,
    .abort = mpi_abort,
    .free = mpi_free,
};

/* the same, where MPI provides MPI_THREAD_MULTIPLE: handles of different groups may be used
 * from different threads at once (each is its own MPI communicator) */
static const mgc_comm_iface mpi_iface_mt = {
    .name = "mpi",
    .run = mpi_run,
    .split = mpi_split,
    .abort = mpi_abort,
    .free = mpi_free,
    .concurrent = 1,
};

#else /* no MPI */

#include <stdio.h>

mgc_comm_status mgc_comm_mpi_world_create(const mgc_comm_config *cfg, mgc_comm **world, char *err,
                                          size_t err_size) {
    (void)cfg;
    if (world) *world = NULL;
    if (err && err_size)
        snprintf(err, err_size,
                 "mgc was built without MPI (install libopenmpi-dev and "
                 "openmpi-bin, then reconfigure)");
    return MGC_COMM_ERR_UNSUPPORTED;
}

#endif
