/* comm_nccl.c - the NCCL transport: a moves-only communicator on CUDA device memory.
 *
 * NCCL moves the data; comm.c composes every reduction from its all-to-alls and the user's
 * fold (comm.h, "Device memory"), so the sums are in group-rank order, bit for bit those of
 * the host transports, whatever NCCL's rings and trees would have done.  Operations are
 * queued on the handle's stream (mgc_comm_set_device) and return once queued.
 *
 * A host world ("boot": mpi, tcp, or local threads with a GPU each) runs beside it:
 *  - it carries NCCL's unique id to every rank at creation;
 *  - every split splits it too, so each NCCL handle has a host twin of the same members;
 *  - the twin checks descriptors: before each of a handle's first MGC_NCCL_CHECK_OPS
 *    operations (sequence numbers, so every rank decides alike; all of them with
 *    MGC_NCCL_CHECK=all, none with MGC_NCCL_CHECK=0) the ranks exchange their operation's
 *    descriptor (and an all-to-all's counts) on the host, and a difference is
 *    MGC_COMM_ERR_MISMATCH naming both ranks' operations, as on every transport, instead of a
 *    hang or corrupted data on the device.  The sequence of a step repeats, so the first
 *    operations see every kind of call the job makes.
 *  - A watchdog thread per world polls each handle's last queued operation (an event) and
 *    NCCL's asynchronous error.  An operation not done timeout_ms after it was queued, or an
 *    NCCL error, poisons the job: every NCCL handle of the world is aborted (its kernels
 *    return), the host world too, and every later call returns MGC_COMM_ERR_ABORTED with the
 *    text naming the handle and its operation.
 * Built only with the CUDA toolkit's NCCL (MGC_HAVE_NCCL); elsewhere the world constructor
 * returns MGC_COMM_ERR_UNSUPPORTED. */
#define MGC_COMM_INTERNAL
#include "comm.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#if defined(MGC_HAVE_NCCL)

#include <cuda_runtime.h>
#include <nccl.h>
#include <pthread.h>
#include <time.h>

#define CHECK_OPS_DEFAULT 4096 /* descriptor checks: each handle's first operations */

typedef struct nccl_job nccl_job;

typedef struct nccl_ctx {
    nccl_job *job;
    ncclComm_t nc;
    mgc_comm *self; /* the handle this context belongs to (names in messages) */
    mgc_comm *boot; /* the host twin */
    int owns_boot;  /* the twin is a split of ours (the world's is the caller's) */
    cudaEvent_t ev; /* recorded after each queued operation */
    int ev_ok;
    int pending;        /* ev recorded and not seen complete (the watchdog's) */
    double t_queued;    /* when it was recorded (CLOCK_MONOTONIC s) */
    mgc_comm_desc last; /* the operation it ends */
    int aborted;        /* ncclCommAbort done: destroy nothing more */
} nccl_ctx;

struct nccl_job {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    pthread_t th;
    int th_ok, stop;
    int device;
    int64_t timeout_ms;
    uint64_t check_ops; /* descriptor checks before operations with seq below this */
    int failed;
    char msg[MGC_COMM_ERR_MAX];
    nccl_ctx **live;
    int n_live, cap_live;
    int refs; /* handles alive; the last frees the job */
};

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Aborts every live handle of the job and the host world; j->mu held. */
static void job_fail_locked(nccl_job *j, const char *text) {
    if (!j->failed) {
        j->failed = 1;
        snprintf(j->msg, sizeof j->msg, "%s", text);
    }
    for (int i = 0; i < j->n_live; i++) {
        nccl_ctx *x = j->live[i];
        if (!x->aborted) {
            ncclCommAbort(x->nc);
            x->aborted = 1;
        }
    }
    for (int i = 0; i < j->n_live; i++)
        if (j->live[i]->boot) {
            mgc_comm_abort(j->live[i]->boot, j->msg);
            break; /* one handle poisons its whole host world */
        }
}

static void *watchdog(void *arg) {
    nccl_job *j = arg;
    cudaSetDevice(j->device);
    pthread_mutex_lock(&j->mu);
    while (!j->stop && !j->failed) {
        struct timespec dl;
        clock_gettime(CLOCK_REALTIME, &dl);
        dl.tv_nsec += 200 * 1000000L;
        if (dl.tv_nsec >= 1000000000L) dl.tv_sec++, dl.tv_nsec -= 1000000000L;
        pthread_cond_timedwait(&j->cv, &j->mu, &dl);
        if (j->stop || j->failed) break;
        double t = now_s();
        for (int i = 0; i < j->n_live && !j->failed; i++) {
            nccl_ctx *x = j->live[i];
            char text[MGC_COMM_ERR_MAX], d[160];
            ncclResult_t ar = ncclSuccess;
            if (ncclCommGetAsyncError(x->nc, &ar) == ncclSuccess && ar != ncclSuccess &&
                ar != ncclInProgress) {
                mgc_comm_desc_format(&x->last, d, sizeof d);
                snprintf(text, sizeof text,
                         "%s rank %d (world %d): NCCL failed: %s (last queued: %s)", x->self->name,
                         x->self->rank, x->self->world_rank, ncclGetErrorString(ar), d);
                job_fail_locked(j, text);
                break;
            }
            if (!x->pending) continue;
            cudaError_t q = cudaEventQuery(x->ev);
            if (q == cudaSuccess) {
                x->pending = 0;
            } else if (q == cudaErrorNotReady) {
                if ((t - x->t_queued) * 1e3 > (double)j->timeout_ms) {
                    mgc_comm_desc_format(&x->last, d, sizeof d);
                    snprintf(text, sizeof text,
                             "%s rank %d (world %d): %s has not completed %lld ms after it was "
                             "queued: a peer is stuck, gone, or called something else (run with "
                             "MGC_NCCL_CHECK=all to compare every operation's descriptor)",
                             x->self->name, x->self->rank, x->self->world_rank, d,
                             (long long)j->timeout_ms);
                    job_fail_locked(j, text);
                }
            } else {
                snprintf(text, sizeof text, "%s rank %d (world %d): CUDA failed: %s", x->self->name,
                         x->self->rank, x->self->world_rank, cudaGetErrorString(q));
                job_fail_locked(j, text);
            }
        }
    }
    pthread_mutex_unlock(&j->mu);
    return NULL;
}

static mgc_comm_status aborted(mgc_comm *c) {
    nccl_ctx *x = c->context;
    return mgc_comm_fail(c, MGC_COMM_ERR_ABORTED, "released because the job failed: %s",
                         x->job->msg);
}

static mgc_comm_status nccl_fail(mgc_comm *c, ncclResult_t r, const char *what) {
    return mgc_comm_fail(c, MGC_COMM_ERR_SYSTEM, "%s: %s%s%s", what, ncclGetErrorString(r),
                         ncclGetLastError(NULL) ? ": " : "",
                         ncclGetLastError(NULL) ? ncclGetLastError(NULL) : "");
}

/* ---- descriptor checks on the host twin ---------------------------------------------------- */

static mgc_comm_status check_desc(mgc_comm *c, const mgc_comm_op *op) {
    nccl_ctx *x = c->context;
    if (op->seq >= x->job->check_ops || !x->boot) return MGC_COMM_OK;
    mgc_comm_desc mine, theirs;
    mgc_comm_desc_of(op, &mine);
    char a[160], b[160];
    mgc_comm_status s;
    if (op->kind == MGC_COMM_OP_SEND)
        return mgc_comm_send(x->boot, &mine, sizeof mine, MGC_DT_U8, op->root) == MGC_COMM_OK
                   ? MGC_COMM_OK
                   : mgc_comm_fail(c, MGC_COMM_ERR_ABORTED, "checking a send: %s",
                                   mgc_comm_error(x->boot));
    if (op->kind == MGC_COMM_OP_RECV) {
        if ((s = mgc_comm_recv(x->boot, &theirs, sizeof theirs, MGC_DT_U8, op->root)) !=
            MGC_COMM_OK)
            return mgc_comm_fail(c, s, "checking a receive: %s", mgc_comm_error(x->boot));
        if (theirs.kind != MGC_COMM_OP_SEND || theirs.dt != mine.dt || theirs.count != mine.count) {
            mgc_comm_desc_format(&theirs, a, sizeof a);
            mgc_comm_desc_format(&mine, b, sizeof b);
            return mgc_comm_fail(c, MGC_COMM_ERR_MISMATCH,
                                 "message mismatch in %s: group rank %d called %s but group rank "
                                 "%d called %s",
                                 c->name, op->root, a, c->rank, b);
        }
        return MGC_COMM_OK;
    }
    mgc_comm_desc *all = malloc((size_t)c->size * sizeof *all);
    int64_t *sent = NULL, *got = NULL;
    if (!all) return mgc_comm_fail(c, MGC_COMM_ERR_NOMEM, "out of memory");
    s = mgc_comm_all_gather(x->boot, &mine, all, sizeof mine, MGC_DT_U8);
    if (s != MGC_COMM_OK) {
        s = mgc_comm_fail(c, s, "checking %s: %s", mgc_comm_op_name(op->kind),
                          mgc_comm_error(x->boot));
        goto out;
    }
    for (int j = 0; j < c->size; j++)
        if (mgc_comm_desc_differ(&all[j], &mine)) {
            mgc_comm_desc_format(&all[j], a, sizeof a);
            mgc_comm_desc_format(&mine, b, sizeof b);
            s = mgc_comm_fail(c, MGC_COMM_ERR_MISMATCH,
                              "collective mismatch in %s: group rank %d (world %d) called %s but "
                              "group rank %d (world %d) called %s",
                              c->name, j, c->members[j], a, c->rank, c->world_rank, b);
            goto out;
        }
    if (op->kind == MGC_COMM_OP_ALL_TO_ALL_V) { /* the pairs' counts: what j sends me */
        sent = malloc(2 * (size_t)c->size * sizeof *sent);
        size_t *ones = sent ? calloc(2 * (size_t)c->size, sizeof *ones) : NULL;
        if (!sent || !ones) {
            free(ones);
            s = mgc_comm_fail(c, MGC_COMM_ERR_NOMEM, "out of memory");
            goto out;
        }
        got = sent + c->size;
        for (int j = 0; j < c->size; j++)
            sent[j] = (int64_t)op->send_counts[j], ones[j] = ones[c->size + j] = 1;
        s = mgc_comm_all_to_all_v(x->boot, sent, ones, NULL, got, ones + c->size, NULL, MGC_DT_I64);
        free(ones);
        if (s != MGC_COMM_OK) {
            s = mgc_comm_fail(c, s, "checking an all-to-all: %s", mgc_comm_error(x->boot));
            goto out;
        }
        for (int j = 0; j < c->size; j++)
            if ((size_t)got[j] != op->recv_counts[j]) {
                s = mgc_comm_fail(c, MGC_COMM_ERR_MISMATCH,
                                  "all_to_all_v #%llu count mismatch in %s: group rank %d (world "
                                  "%d) sends %llu elements to group rank %d (world %d), which "
                                  "expects %zu",
                                  (unsigned long long)op->seq, c->name, j, c->members[j],
                                  (unsigned long long)got[j], c->rank, c->world_rank,
                                  op->recv_counts[j]);
                goto out;
            }
    }
    s = MGC_COMM_OK;
out:
    free(all);
    free(sent);
    return s;
}

/* ---- operations ------------------------------------------------------------------------------ */

static mgc_comm_status queued(mgc_comm *c, const mgc_comm_op *op, cudaStream_t st) {
    nccl_ctx *x = c->context;
    nccl_job *j = x->job;
    pthread_mutex_lock(&j->mu);
    cudaError_t e = cudaEventRecord(x->ev, st);
    if (e == cudaSuccess) {
        x->pending = 1;
        x->t_queued = now_s();
        mgc_comm_desc_of(op, &x->last);
    }
    pthread_mutex_unlock(&j->mu);
    if (e != cudaSuccess)
        return mgc_comm_fail(c, MGC_COMM_ERR_SYSTEM, "recording %s: %s", mgc_comm_op_name(op->kind),
                             cudaGetErrorString(e));
    return MGC_COMM_OK;
}

static mgc_comm_status nccl_run(mgc_comm *c, const mgc_comm_op *op) {
    nccl_ctx *x = c->context;
    if (__atomic_load_n(&x->job->failed, __ATOMIC_ACQUIRE)) return aborted(c);
    MGC_COMM_TRY(check_desc(c, op));
    cudaStream_t st = (cudaStream_t)c->dev.stream;
    size_t es = mgc_dtype_size(op->dt);
    ncclResult_t r = ncclSuccess;
    const char *what = mgc_comm_op_name(op->kind);
    switch (op->kind) {
    case MGC_COMM_OP_ALL_GATHER: /* in place when send is recv + rank * count (NCCL's rule) */
        r = ncclAllGather(op->send, op->recv, op->count * es, ncclUint8, x->nc, st);
        break;
    case MGC_COMM_OP_BROADCAST:
        r = ncclBroadcast(op->send, op->recv, op->count * es, ncclUint8, op->root, x->nc, st);
        break;
    case MGC_COMM_OP_ALL_TO_ALL_V: {
        const unsigned char *sb = op->send;
        unsigned char *rb = op->recv;
        if (op->send_counts[c->rank]) { /* this rank's own block: a copy on the stream */
            const void *from = sb + op->send_displs[c->rank] * es;
            void *to = rb + op->recv_displs[c->rank] * es;
            cudaError_t e = from == to ? cudaSuccess
                                       : cudaMemcpyAsync(to, from, op->send_counts[c->rank] * es,
                                                         cudaMemcpyDeviceToDevice, st);
            if (e != cudaSuccess)
                return mgc_comm_fail(c, MGC_COMM_ERR_SYSTEM, "all_to_all_v: %s",
                                     cudaGetErrorString(e));
        }
        r = ncclGroupStart();
        for (int j = 0; j < c->size && r == ncclSuccess; j++) {
            if (j == c->rank) continue;
            if (op->send_counts[j])
                r = ncclSend(sb + op->send_displs[j] * es, op->send_counts[j] * es, ncclUint8, j,
                             x->nc, st);
            if (r == ncclSuccess && op->recv_counts[j])
                r = ncclRecv(rb + op->recv_displs[j] * es, op->recv_counts[j] * es, ncclUint8, j,
                             x->nc, st);
        }
        ncclResult_t e = ncclGroupEnd();
        if (r == ncclSuccess) r = e;
        break;
    }
    case MGC_COMM_OP_SEND:
        r = ncclSend(op->send, op->count * es, ncclUint8, op->root, x->nc, st);
        break;
    case MGC_COMM_OP_RECV:
        r = ncclRecv(op->recv, op->count * es, ncclUint8, op->root, x->nc, st);
        break;
    case MGC_COMM_OP_BARRIER: { /* the queued work done, then the host twin's barrier */
        cudaError_t e = cudaStreamSynchronize(st);
        if (e != cudaSuccess)
            return mgc_comm_fail(c, MGC_COMM_ERR_SYSTEM, "barrier: %s", cudaGetErrorString(e));
        mgc_comm_status s = x->boot ? mgc_comm_barrier(x->boot) : MGC_COMM_OK;
        return s == MGC_COMM_OK ? s : mgc_comm_fail(c, s, "barrier: %s", mgc_comm_error(x->boot));
    }
    default: /* reductions are composed in comm.c: none reaches a moves-only transport */
        return mgc_comm_fail(c, MGC_COMM_ERR_INVALID, "%s: not a data movement (a bug)", what);
    }
    if (r != ncclSuccess) return nccl_fail(c, r, what);
    return queued(c, op, st);
}

/* ---- handles -----------------------------------------------------------------------------------
 */

static void nccl_free(mgc_comm *c);
static mgc_comm_status nccl_split(mgc_comm *c, const mgc_comm_op *op, mgc_comm **out);
static void nccl_abort(mgc_comm *c, const char *reason);

static const mgc_comm_iface nccl_iface = {
    .name = "nccl",
    .run = nccl_run,
    .split = nccl_split,
    .abort = nccl_abort,
    .free = nccl_free,
    .concurrent = 0,
    .device_memory = 1,
};

/* A handle over an initialised NCCL communicator; takes the job reference. */
static mgc_comm_status make_handle(nccl_job *j, ncclComm_t nc, mgc_comm *boot, int owns_boot,
                                   int rank, int size, int world_rank, const int *members,
                                   const char *name, mgc_comm **out) {
    mgc_comm *c = calloc(1, sizeof *c);
    nccl_ctx *x = calloc(1, sizeof *x);
    if (!c || !x) goto nomem;
    x->job = j, x->nc = nc, x->self = c, x->boot = boot, x->owns_boot = owns_boot;
    if (cudaEventCreateWithFlags(&x->ev, cudaEventDisableTiming) != cudaSuccess) goto nomem;
    x->ev_ok = 1;
    if (mgc_comm_init_base(c, &nccl_iface, x, rank, size, world_rank, members, j->timeout_ms,
                           name) != MGC_COMM_OK)
        goto nomem;
    c->moves_only = 1;
    pthread_mutex_lock(&j->mu);
    if (j->n_live == j->cap_live) {
        int m = j->cap_live ? 2 * j->cap_live : 16;
        nccl_ctx **a = realloc(j->live, (size_t)m * sizeof *a);
        if (!a) {
            pthread_mutex_unlock(&j->mu);
            mgc_comm_free_base(c);
            goto nomem;
        }
        j->live = a, j->cap_live = m;
    }
    j->live[j->n_live++] = x;
    j->refs++;
    pthread_mutex_unlock(&j->mu);
    *out = c;
    return MGC_COMM_OK;
nomem:
    if (x && x->ev_ok) cudaEventDestroy(x->ev);
    free(x), free(c);
    return MGC_COMM_ERR_NOMEM;
}

static void job_release(nccl_job *j) {
    pthread_mutex_lock(&j->mu);
    int last = --j->refs == 0;
    if (last) {
        j->stop = 1;
        pthread_cond_broadcast(&j->cv);
    }
    pthread_mutex_unlock(&j->mu);
    if (!last) return;
    if (j->th_ok) pthread_join(j->th, NULL);
    pthread_cond_destroy(&j->cv);
    pthread_mutex_destroy(&j->mu);
    free(j->live);
    free(j);
}

static void nccl_free(mgc_comm *c) {
    nccl_ctx *x = c->context;
    nccl_job *j = x->job;
    pthread_mutex_lock(&j->mu);
    for (int i = 0; i < j->n_live; i++)
        if (j->live[i] == x) {
            j->live[i] = j->live[--j->n_live];
            break;
        }
    int gone = x->aborted;
    pthread_mutex_unlock(&j->mu);
    if (gone)
        ncclCommDestroy(x->nc); /* after an abort: releases what is left */
    else if (ncclCommFinalize(x->nc) == ncclSuccess)
        ncclCommDestroy(x->nc);
    else
        ncclCommAbort(x->nc);
    if (x->ev_ok) cudaEventDestroy(x->ev);
    if (x->owns_boot) mgc_comm_free(x->boot);
    mgc_comm_free_base(c);
    free(x);
    free(c);
    job_release(j);
}

static void nccl_abort(mgc_comm *c, const char *reason) {
    nccl_ctx *x = c->context;
    char text[MGC_COMM_ERR_MAX];
    snprintf(text, sizeof text, "world rank %d aborted: %s", c->world_rank, reason);
    pthread_mutex_lock(&x->job->mu);
    job_fail_locked(x->job, text);
    pthread_mutex_unlock(&x->job->mu);
}

static mgc_comm_status nccl_split(mgc_comm *c, const mgc_comm_op *op, mgc_comm **out) {
    nccl_ctx *x = c->context;
    *out = NULL;
    if (__atomic_load_n(&x->job->failed, __ATOMIC_ACQUIRE)) return aborted(c);
    /* the host twin first: it checks the split's descriptor and gives the members */
    mgc_comm *tw = NULL;
    mgc_comm_status s = mgc_comm_split(x->boot, op->color, op->key, &tw);
    if (s != MGC_COMM_OK) return mgc_comm_fail(c, s, "split: %s", mgc_comm_error(x->boot));
    if (op->color > 0x7fffffff) {
        mgc_comm_free(tw);
        return mgc_comm_fail(c, MGC_COMM_ERR_INVALID, "split: colour %lld past NCCL's int",
                             (long long)op->color);
    }
    ncclComm_t nc = NULL;
    ncclResult_t r = ncclCommSplit(x->nc, op->color < 0 ? NCCL_SPLIT_NOCOLOR : (int)op->color,
                                   (int)op->key, &nc, NULL);
    if (r != ncclSuccess) {
        mgc_comm_free(tw);
        return nccl_fail(c, r, "ncclCommSplit");
    }
    if (!tw) return MGC_COMM_OK; /* no colour: no group (NCCL gave none either) */
    int *members = malloc((size_t)mgc_comm_size(tw) * sizeof *members);
    if (!members) {
        mgc_comm_free(tw);
        ncclCommDestroy(nc);
        return mgc_comm_fail(c, MGC_COMM_ERR_NOMEM, "split: out of memory");
    }
    for (int j = 0; j < mgc_comm_size(tw); j++)
        members[j] = mgc_comm_member(tw, j);
    s = make_handle(x->job, nc, tw, 1, mgc_comm_rank(tw), mgc_comm_size(tw), c->world_rank, members,
                    "split", out);
    free(members);
    if (s != MGC_COMM_OK) {
        mgc_comm_free(tw);
        ncclCommDestroy(nc);
        return mgc_comm_fail(c, s, "split: out of memory");
    }
    return MGC_COMM_OK;
}

/* A job no handle took. */
static void job_destroy_unused(nccl_job *j) {
    pthread_cond_destroy(&j->cv);
    pthread_mutex_destroy(&j->mu);
    free(j->live);
    free(j);
}

mgc_comm_status mgc_comm_nccl_world_create(mgc_comm *boot, int device, const mgc_comm_config *cfg,
                                           mgc_comm **world, char *err, size_t err_size) {
    char dummy[1];
    if (!err || !err_size) err = dummy, err_size = sizeof dummy;
    err[0] = '\0';
    if (world) *world = NULL;
    if (!boot || !world) {
        snprintf(err, err_size, "nccl world: no host world to start from");
        return MGC_COMM_ERR_INVALID;
    }
    if (boot->world_rank != boot->rank) {
        snprintf(err, err_size, "nccl world: %s is a group, not a world", boot->name);
        return MGC_COMM_ERR_INVALID;
    }
    /* the backend's choice (mgc_backend_cuda_open): the node-local rank modulo the visible
     * GPUs, so that ranks posing as hosts of their own (NCCL_HOSTID) may share one GPU */
    int ndev = 0;
    cudaError_t ce = cudaGetDeviceCount(&ndev);
    if (ce == cudaSuccess && ndev > 0) ce = cudaSetDevice((device < 0 ? 0 : device) % ndev);
    else if (ce == cudaSuccess) ce = cudaErrorNoDevice;
    if (ce != cudaSuccess) {
        snprintf(err, err_size, "nccl world: CUDA device %d: %s", device, cudaGetErrorString(ce));
        mgc_comm_abort(boot, err);
        return MGC_COMM_ERR_SYSTEM;
    }
    /* every rank learns rank 0's outcome with the id, so none waits on a world that will not
     * form */
    struct {
        int32_t result; /* rank 0's ncclGetUniqueId */
        ncclUniqueId id;
    } msg;
    memset(&msg, 0, sizeof msg);
    if (boot->rank == 0) msg.result = (int32_t)ncclGetUniqueId(&msg.id);
    mgc_comm_status s = mgc_comm_broadcast(boot, &msg, sizeof msg, MGC_DT_U8, 0);
    ncclResult_t r = (ncclResult_t)msg.result;
    if (s != MGC_COMM_OK || r != ncclSuccess) {
        snprintf(err, err_size, "nccl world: sharing NCCL's unique id: %s%s",
                 s != MGC_COMM_OK ? mgc_comm_error(boot) : "rank 0: ",
                 s != MGC_COMM_OK ? "" : ncclGetErrorString(r));
        mgc_comm_abort(boot, err);
        return s != MGC_COMM_OK ? s : MGC_COMM_ERR_SYSTEM;
    }
    ncclUniqueId id = msg.id;
    nccl_job *j = calloc(1, sizeof *j);
    if (!j) {
        snprintf(err, err_size, "nccl world: out of memory");
        mgc_comm_abort(boot, err);
        return MGC_COMM_ERR_NOMEM;
    }
    j->device = device;
    j->timeout_ms = boot->timeout_ms;
    if (cfg && cfg->size >= offsetof(mgc_comm_config, timeout_ms) + sizeof cfg->timeout_ms &&
        cfg->timeout_ms > 0)
        j->timeout_ms = cfg->timeout_ms;
    const char *ck = getenv("MGC_NCCL_CHECK");
    j->check_ops = !ck || !*ck          ? CHECK_OPS_DEFAULT
                   : !strcmp(ck, "all") ? UINT64_MAX
                                        : (uint64_t)strtoull(ck, NULL, 10);
    pthread_mutex_init(&j->mu, NULL);
    pthread_cond_init(&j->cv, NULL);
    ncclComm_t nc = NULL;
    r = ncclCommInitRank(&nc, boot->size, id, boot->rank);
    if (r != ncclSuccess) {
        snprintf(err, err_size, "nccl world: ncclCommInitRank (rank %d of %d, device %d): %s",
                 boot->rank, boot->size, device, ncclGetErrorString(r));
        mgc_comm_abort(boot, err);
        job_destroy_unused(j);
        return MGC_COMM_ERR_SYSTEM;
    }
    s = make_handle(j, nc, boot, 0, boot->rank, boot->size, boot->world_rank, boot->members,
                    "world", world);
    if (s != MGC_COMM_OK) {
        snprintf(err, err_size, "nccl world: out of memory");
        ncclCommDestroy(nc);
        mgc_comm_abort(boot, err);
        job_destroy_unused(j);
        return MGC_COMM_ERR_NOMEM;
    }
    if (pthread_create(&j->th, NULL, watchdog, j) == 0)
        j->th_ok = 1;
    else {
        snprintf(err, err_size, "nccl world: cannot start the watchdog thread");
        mgc_comm_free(*world);
        *world = NULL;
        mgc_comm_abort(boot, err);
        return MGC_COMM_ERR_SYSTEM;
    }
    return MGC_COMM_OK;
}

#else /* no NCCL */

mgc_comm_status mgc_comm_nccl_world_create(mgc_comm *boot, int device, const mgc_comm_config *cfg,
                                           mgc_comm **world, char *err, size_t err_size) {
    (void)boot, (void)device, (void)cfg;
    if (world) *world = NULL;
    if (err && err_size)
        snprintf(err, err_size,
                 "mgc was built without NCCL (it comes with the CUDA toolkit under "
                 "/usr/local/cuda: reconfigure where nccl.h and libnccl are found)");
    return MGC_COMM_ERR_UNSUPPORTED;
}

#endif
