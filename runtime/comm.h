/* comm.h - communicators: the world and its process groups, and the
 * collective and point-to-point operations the runtime runs over them.
 *
 * A communicator (mgc_comm) is one rank's handle on a group of ranks.  The
 * world communicator comes from a transport; every process-group
 * communicator is derived from it and the plan's rank grid:
 *
 *     mgc_comm *ranks[8];                       // local transport: 8 threads
 *     mgc_comm_local_world_create(8, NULL, ranks, err, sizeof err);
 *     // ... in the thread of rank r:
 *     mgc_comm *world = ranks[r], *tp = NULL;
 *     MGC_COMM_TRY(mgc_comm_group(world, &plan->grid, MGC_GROUP_TP, &tp));
 *     mgc_comm_all_reduce(tp, x, x, n, MGC_DT_F32, MGC_COMM_SUM);   // in place
 *     mgc_comm_free(tp);
 *     mgc_comm_free(world);                     // each rank frees its own handle
 *
 * Guarantees (docs/communicators.md):
 *  - Every reduction is computed in group-rank order, ((x0 + x1) + x2) + ...,
 *    independent of arrival timing and transport, so results are bit-for-bit
 *    reproducible and equal to a serial loop over the contributions.
 *  - Every collective carries the group's sequence number and a descriptor
 *    (operation, count, dtype, root) that is compared across ranks: a
 *    mismatch returns MGC_COMM_ERR_MISMATCH naming both ranks' operations.
 *  - No call waits forever: a wait longer than the configured timeout returns
 *    MGC_COMM_ERR_TIMEOUT naming the ranks waited on and their last operation.
 *  - After any rank fails (mismatch, timeout, mgc_comm_abort, a freed peer),
 *    the job is poisoned: every waiting and later call on every communicator
 *    of that world returns MGC_COMM_ERR_ABORTED with the first failure's text
 *    (local: all threads at once; mpi: this process, peers by their timeout).
 *
 * Threads: a handle belongs to one thread at a time (its rank's); different
 * ranks' handles are used concurrently.  Collectives on one communicator are
 * called by all its ranks in the same order; creating groups is collective
 * over the parent.
 *
 * Transports: local (comm_local.c, threads of one process), mpi (comm_mpi.c,
 * when built with MPI).  Each is a const table of function pointers
 * (mgc_comm_iface, below the public API) behind the wrappers of comm.c. */
#ifndef MGC_COMM_H
#define MGC_COMM_H

#include <stddef.h>
#include <stdint.h>

#include "plan.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum mgc_comm_status {
    MGC_COMM_OK = 0,
    MGC_COMM_ERR_INVALID, /* bad argument (NULL buffer, dtype a reduction cannot take, ...) */
    MGC_COMM_ERR_NOMEM,
    MGC_COMM_ERR_MISMATCH,    /* ranks called different collectives / counts / roots */
    MGC_COMM_ERR_TIMEOUT,     /* waited longer than timeout_ms */
    MGC_COMM_ERR_ABORTED,     /* another rank failed or aborted; the job is poisoned */
    MGC_COMM_ERR_SYSTEM,      /* the transport's library failed (pthreads, MPI) */
    MGC_COMM_ERR_UNSUPPORTED, /* transport not built (no MPI) */
} mgc_comm_status;

typedef enum mgc_comm_red {
    MGC_COMM_SUM = 0,
    MGC_COMM_MAX, /* NaN propagates: max with a NaN operand is NaN */
} mgc_comm_red;

typedef struct mgc_comm mgc_comm;

/* Creation options; may grow: set size = sizeof(mgc_comm_config) (the
 * MGC_COMM_CONFIG_INIT initialiser does) and fields past `size` take defaults. */
typedef struct mgc_comm_config {
    size_t size;        /* sizeof(mgc_comm_config) */
    int64_t timeout_ms; /* longest wait for other ranks; <= 0: default (300000, 5 min) */
    int moves_only;     /* local transport: a moves-only world (below, "Device memory"): how
                           the tests run the device path on host-addressable memory */
} mgc_comm_config;
#define MGC_COMM_CONFIG_INIT                                                                       \
    { sizeof(mgc_comm_config), 0, 0 }
#define MGC_COMM_DEFAULT_TIMEOUT_MS 300000

const char *mgc_comm_status_name(mgc_comm_status s); /* "ok", "mismatch", ... */
const char *mgc_comm_red_name(mgc_comm_red r);       /* "sum", "max" */

/* ---- creating and freeing ------------------------------------------------- */

/* The local transport: n (1..4096) ranks that are threads of this process.
 * Writes n world handles to ranks[0..n-1]; handle r is rank r and is used by
 * one thread.  cfg may be NULL.  On error nothing is allocated and err holds
 * the message. */
mgc_comm_status mgc_comm_local_world_create(int n, const mgc_comm_config *cfg, mgc_comm **ranks,
                                            char *err, size_t err_size);

/* The MPI transport: the world communicator over MPI_COMM_WORLD (calls
 * MPI_Init_thread when MPI is not initialised yet; then mgc_comm_free of the
 * last handle finalises it).  MGC_COMM_ERR_UNSUPPORTED when built without MPI. */
mgc_comm_status mgc_comm_mpi_world_create(const mgc_comm_config *cfg, mgc_comm **world, char *err,
                                          size_t err_size);

/* The TCP transport: one rank per process, started the torchrun way.  The environment gives
 * RANK, WORLD_SIZE, MASTER_ADDR (rank 0's host) and MASTER_PORT (where rank 0 listens);
 * every process calls this, and it returns when all WORLD_SIZE ranks are connected (or the
 * timeout passed: each error names what to fix).  mgc_comm_tcp_env: 1 when those four
 * variables are set. */
mgc_comm_status mgc_comm_tcp_world_create(const mgc_comm_config *cfg, mgc_comm **world, char *err,
                                          size_t err_size);
int mgc_comm_tcp_env(void);

/* The communicator of the process group of kind `kind` that holds this rank,
 * built from the plan's grid (plan.h, docs/process-groups.md): members in
 * group-rank order as mgc_grid_group lists them.  `world` must be a world
 * communicator whose size is grid->world.  Collective over world: every rank
 * calls it with the same grid and kind.  *out is NULL (and the call succeeds)
 * for a rank in no group of that kind (EMBED on a middle pipeline stage). */
mgc_comm_status mgc_comm_group(mgc_comm *world, const mgc_grid *grid, mgc_group_kind kind,
                               mgc_comm **out);

/* General split (MPI_Comm_split): ranks with the same color >= 0 form a
 * communicator, ordered by (key, parent rank); color < 0: *out = NULL.
 * Collective over parent. */
mgc_comm_status mgc_comm_split(mgc_comm *parent, int64_t color, int64_t key, mgc_comm **out);

/* Releases this rank's handle.  A peer still waiting on this rank is
 * released with an error instead of hanging.  NULL is a no-op. */
void mgc_comm_free(mgc_comm *c);

/* Poisons the job: every rank of this world waiting now or calling later gets
 * MGC_COMM_ERR_ABORTED with "rank R aborted: <reason>".  For a rank that
 * fails outside the communicator (a kernel error) so its peers do not hang.
 * The local transport releases every thread; MPI releases the peers by their
 * timeout (mgc-run's main calls MPI_Abort on error). */
void mgc_comm_abort(mgc_comm *c, const char *reason);

/* ---- queries ------------------------------------------------------------ */

int mgc_comm_rank(const mgc_comm *c); /* group rank, 0..size-1 */
int mgc_comm_size(const mgc_comm *c);
int mgc_comm_world_rank(const mgc_comm *c); /* this rank in the world */
/* World rank of group rank r; -1 when r is out of range. */
int mgc_comm_member(const mgc_comm *c, int r);
/* "tp#3" style name of the group (kind and group id), "world", or "split#<color>". */
const char *mgc_comm_name(const mgc_comm *c);
const char *mgc_comm_transport(const mgc_comm *c); /* "local", "mpi" */
/* 1 when this rank may call handles of different groups from different threads at the same
 * time (local: yes; mpi: when MPI provides MPI_THREAD_MULTIPLE).  The executor reduces
 * gradient buckets on a second thread only then. */
int mgc_comm_concurrent(const mgc_comm *c);
/* Collectives this handle has completed or started (its next sequence number). */
uint64_t mgc_comm_seq(const mgc_comm *c);
/* The last error on this handle: "tp#1 rank 0 (world 4): ..."; "" when none. */
const char *mgc_comm_error(const mgc_comm *c);

/* ---- collectives ----------------------------------------------------------
 * Counts are in elements of `dt`.  Reductions take MGC_DT_F32 only (others:
 * MGC_COMM_ERR_INVALID); data movement takes any dtype.  send == recv (in
 * place) is allowed for all_reduce; other operations need disjoint buffers
 * except where noted. */

/* recv[i] = op over ranks of send[i], in group-rank order.  (count) -> (count) */
mgc_comm_status mgc_comm_all_reduce(mgc_comm *c, const void *send, void *recv, size_t count,
                                    mgc_dtype dt, mgc_comm_red op);
/* Rank r receives block r of the reduction: recv[i] = sum_j send_j[r*count + i].
 * send (size*count) -> recv (count). */
mgc_comm_status mgc_comm_reduce_scatter(mgc_comm *c, const void *send, void *recv, size_t count,
                                        mgc_dtype dt, mgc_comm_red op);
/* recv = concat over ranks of send.  send (count) -> recv (size*count). */
mgc_comm_status mgc_comm_all_gather(mgc_comm *c, const void *send, void *recv, size_t count,
                                    mgc_dtype dt);
/* All-to-all with per-peer counts: this rank sends send_counts[j] elements
 * from send + send_displs[j] to rank j, and receives recv_counts[j] elements
 * from rank j at recv + recv_displs[j].  Displacements may be NULL (packed:
 * prefix sums of the counts).  recv_counts[j] here must equal rank j's
 * send_counts[this rank] (checked; a difference is a mismatch).  Zero counts
 * are fine.  Arrays have size() entries. */
mgc_comm_status mgc_comm_all_to_all_v(mgc_comm *c, const void *send, const size_t *send_counts,
                                      const size_t *send_displs, void *recv,
                                      const size_t *recv_counts, const size_t *recv_displs,
                                      mgc_dtype dt);
/* buf (count) on every rank becomes root's buf. */
mgc_comm_status mgc_comm_broadcast(mgc_comm *c, void *buf, size_t count, mgc_dtype dt, int root);
mgc_comm_status mgc_comm_barrier(mgc_comm *c);

/* ---- point to point -------------------------------------------------------
 * Blocking; messages between two ranks of a communicator are received in the
 * order they were sent.  recv's count must equal the matching send's count
 * (a difference is MGC_COMM_ERR_MISMATCH naming both).  send may return
 * before the peer receives (the local transport always buffers) or block
 * until it does (MPI): portable code must not rely on either. */
mgc_comm_status mgc_comm_send(mgc_comm *c, const void *buf, size_t count, mgc_dtype dt, int peer);
mgc_comm_status mgc_comm_recv(mgc_comm *c, void *buf, size_t count, mgc_dtype dt, int peer);

/* Variable reduce-scatter: send holds, in group-rank order, per[j] elements for each group rank
 * j; this rank receives the sum (or max) over the group of its block, per[rank] elements, added
 * in group-rank order.  Takes f32, and bf16/f16 (widened, folded in fp32, rounded once).
 * Composed from an all-to-all-v and a fold on every transport.  recv may lie inside send. */
mgc_comm_status mgc_comm_reduce_scatter_v(mgc_comm *c, const void *send, const size_t *per,
                                          void *recv, mgc_dtype dt, mgc_comm_red op);

/* ---- device memory ----------------------------------------------------------
 * A moves-only communicator moves data and leaves the arithmetic to its user: the nccl
 * transport on device memory (comm_nccl.c), or a local world created with
 * mgc_comm_config.moves_only (how the tests run this path).  Its groups are moves-only too.
 * On it, all_reduce and reduce_scatter are composed in comm.c from all-to-alls and a fold:
 * each rank receives every rank's part of its slice, folds them in group-rank order and
 * (all-reduce) all-gathers the slices -- the guarantee above, bit for bit, and the traffic of
 * a ring.  They also take bf16 and f16 there (widened, folded in fp32, rounded once).  The
 * slices go in rounds of at most MGC_FOLD_ROUND_BYTES (plan.h), a pure function of the count,
 * the group size and the type, so all ranks agree on them.
 *
 * mgc_comm_set_device tells one handle where its operations run: the stream they are queued
 * on (nccl: a cudaStream_t; operations return once queued and complete in stream order), the
 * fold, and a scratch area in the same memory of at least mgc_fold_scratch_bytes for every
 * reduction it will run.  Without it: the default stream, a fold on the host, and scratch
 * from malloc (host-addressable memory only). */
typedef int (*mgc_comm_fold_fn)(void *ctx, void *dst, const void *src, int parts, size_t count,
                                size_t stride, mgc_dtype dt, mgc_comm_red op);
typedef struct mgc_comm_device {
    void *stream;          /* the transport's queue; NULL: its default */
    mgc_comm_fold_fn fold; /* dst[i] = op over j = 0..parts-1, in order, of src[j*stride + i],
                              in fp32, rounded once to dt; dst may lie inside src's part 0 */
    void *fold_ctx;
    void *scratch;
    size_t scratch_bytes;
} mgc_comm_device;
mgc_comm_status mgc_comm_set_device(mgc_comm *c, const mgc_comm_device *d);
/* 1 for a moves-only communicator. */
int mgc_comm_moves_only(const mgc_comm *c);
/* The reference fold on host memory (mgc_comm_fold_fn; ctx unused): also the CPU backend's. */
int mgc_comm_fold_host(void *ctx, void *dst, const void *src, int parts, size_t count,
                       size_t stride, mgc_dtype dt, mgc_comm_red op);

/* The NCCL transport (comm_nccl.c, built with the CUDA toolkit's NCCL): a moves-only world
 * on CUDA device `device` over the same ranks as `boot` (a host world: mpi or tcp, or local
 * threads for one GPU each), which carries NCCL's unique id and every operation's
 * descriptor check.  MGC_COMM_ERR_UNSUPPORTED when built without NCCL. */
mgc_comm_status mgc_comm_nccl_world_create(mgc_comm *boot, int device, const mgc_comm_config *cfg,
                                           mgc_comm **world, char *err, size_t err_size);

/* Returns the status of `expr` from the enclosing function when not OK. */
#define MGC_COMM_TRY(expr)                                                                         \
    do {                                                                                           \
        mgc_comm_status mgc_try_s_ = (expr);                                                       \
        if (mgc_try_s_ != MGC_COMM_OK) return mgc_try_s_;                                          \
    } while (0)

/* ==== implementing a transport =============================================
 * Only transports (comm_*.c) define MGC_COMM_INTERNAL before including this
 * header; users see mgc_comm as opaque. */
#ifdef MGC_COMM_INTERNAL

typedef enum mgc_comm_op_kind {
    MGC_COMM_OP_ALL_REDUCE = 0,
    MGC_COMM_OP_REDUCE_SCATTER,
    MGC_COMM_OP_ALL_GATHER,
    MGC_COMM_OP_ALL_TO_ALL_V,
    MGC_COMM_OP_BROADCAST,
    MGC_COMM_OP_BARRIER,
    MGC_COMM_OP_SPLIT,
    MGC_COMM_OP_SEND,
    MGC_COMM_OP_RECV,
    MGC_COMM_OP__COUNT
} mgc_comm_op_kind;

const char *mgc_comm_op_name(mgc_comm_op_kind k);

/* One operation as a transport sees it; comm.c fills and validates it. */
typedef struct mgc_comm_op {
    mgc_comm_op_kind kind;
    mgc_comm_red red; /* reductions */
    mgc_dtype dt;
    uint64_t seq;       /* collectives: this group's sequence number; p2p: per-link */
    size_t count;       /* elements: see each public function */
    int root;           /* broadcast root; send/recv peer (group rank) */
    int64_t color, key; /* split */
    const void *send;
    void *recv;                /* also broadcast's buffer */
    const size_t *send_counts; /* all_to_all_v: (size) */
    const size_t *send_displs; /* (size), never NULL here: comm.c fills packed ones */
    const size_t *recv_counts;
    const size_t *recv_displs;
} mgc_comm_op;

/* The cross-rank summary of an op that transports exchange and compare.
 * Plain integers, so transports can ship it as bytes. */
typedef struct mgc_comm_desc {
    int32_t kind, red, dt, root;
    uint64_t seq;
    uint64_t count;
    int64_t color, key;
} mgc_comm_desc;

void mgc_comm_desc_of(const mgc_comm_op *op, mgc_comm_desc *d);
/* "all_reduce #7 (1024 f32, sum)" into buf. */
void mgc_comm_desc_format(const mgc_comm_desc *d, char *buf, size_t size);
/* 0 when a and b describe the same collective (split: color/key may differ). */
int mgc_comm_desc_differ(const mgc_comm_desc *a, const mgc_comm_desc *b);

/* The transport's table.  Every slot is required unless marked optional. */
typedef struct mgc_comm_iface {
    const char *name;
    /* Run a collective (op->kind < MGC_COMM_OP_SPLIT) or send/recv.  Checks the
     * descriptor across ranks first. */
    mgc_comm_status (*run)(mgc_comm *c, const mgc_comm_op *op);
    /* Collective split; *out NULL when color < 0.  The transport fills the new
     * handle's base fields with mgc_comm_init_base. */
    mgc_comm_status (*split)(mgc_comm *c, const mgc_comm_op *op, mgc_comm **out);
    /* Optional: poison the job (mgc_comm_abort). */
    void (*abort)(mgc_comm *c, const char *reason);
    /* Release this rank's handle and its context. */
    void (*free)(mgc_comm *c);
    /* 1: one rank may use handles of different groups from different threads at the same
     * time (mgc_comm_concurrent). */
    int concurrent;
    /* 1: buffers are device memory the host cannot read (nccl): comm.c never folds there on
     * the host, so a reduction needs mgc_comm_set_device's fold and scratch. */
    int device_memory;
} mgc_comm_iface;

#define MGC_COMM_NAME_MAX 48
#define MGC_COMM_ERR_MAX  1024

struct mgc_comm {
    const mgc_comm_iface *iface; /* the transport */
    void *context;               /* transport state of this rank's handle */
    int rank, size;              /* group rank and size */
    int world_rank;
    int *members;       /* (size) world rank of each group rank */
    uint64_t seq;       /* next collective sequence number */
    uint64_t *send_seq; /* (size) next message number to each peer */
    uint64_t *recv_seq; /* (size) next message number from each peer */
    int64_t timeout_ms;
    int moves_only;      /* reductions composed in comm.c (set by the transport; splits copy it) */
    mgc_comm_device dev; /* mgc_comm_set_device */
    char name[MGC_COMM_NAME_MAX];
    char err[MGC_COMM_ERR_MAX]; /* last error */
};

/* Fills the base of a new handle (allocates members and the p2p counters;
 * `members` is copied).  Returns NOMEM. */
mgc_comm_status mgc_comm_init_base(mgc_comm *c, const mgc_comm_iface *iface, void *context,
                                   int rank, int size, int world_rank, const int *members,
                                   int64_t timeout_ms, const char *name);
void mgc_comm_free_base(mgc_comm *c);
/* Records "<name> rank R (world W): <fmt>" as c's last error; returns s. */
mgc_comm_status mgc_comm_fail(mgc_comm *c, mgc_comm_status s, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;

/* The fixed-order reductions every transport uses: dst[i] = op(parts[0][i],
 * parts[1][i], ..., parts[n-1][i]) folded left in part order.  dst may alias
 * no part. */
void mgc_comm_reduce_ordered_f32(float *dst, const float *const *parts, int n, size_t count,
                                 mgc_comm_red op);

#endif /* MGC_COMM_INTERNAL */

#ifdef __cplusplus
}
#endif

#endif
