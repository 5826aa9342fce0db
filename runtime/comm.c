/* comm.c - the transport-independent half of the communicators (comm.h):
 * argument checks, sequence numbers, descriptors and their comparison, error
 * text, the fixed-order reductions, and process groups from the plan grid.
 * Transports (comm_local.c, comm_mpi.c) only move bytes and rendezvous. */
#define MGC_COMM_INTERNAL
#include "comm.h"
#include "half.h"

#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define COUNT_OF(a) (sizeof(a) / sizeof((a)[0]))

/* ---- names ---------------------------------------------------------------- */

static const char *const status_names[] = {"ok",       "invalid argument", "out of memory",
                                           "mismatch", "timeout",          "aborted",
                                           "system",   "unsupported"};
_Static_assert(COUNT_OF(status_names) == MGC_COMM_ERR_UNSUPPORTED + 1, "status names");

const char *mgc_comm_status_name(mgc_comm_status s) {
    return (unsigned)s < COUNT_OF(status_names) ? status_names[(unsigned)s] : "?";
}

const char *mgc_comm_red_name(mgc_comm_red r) {
    return r == MGC_COMM_SUM ? "sum" : r == MGC_COMM_MAX ? "max" : "?";
}

static const char *const op_names[] = {"all_reduce",   "reduce_scatter", "all_gather",
                                       "all_to_all_v", "broadcast",      "barrier",
                                       "split",        "send",           "recv"};
_Static_assert(COUNT_OF(op_names) == MGC_COMM_OP__COUNT, "op names");

const char *mgc_comm_op_name(mgc_comm_op_kind k) {
    return (unsigned)k < COUNT_OF(op_names) ? op_names[(unsigned)k] : "?";
}

/* ---- descriptors ---------------------------------------------------------- */

void mgc_comm_desc_of(const mgc_comm_op *op, mgc_comm_desc *d) {
    memset(d, 0, sizeof *d);
    d->kind = (int32_t)op->kind;
    d->red = (int32_t)op->red;
    d->dt = (int32_t)op->dt;
    d->root = op->root;
    d->seq = op->seq;
    d->count = (uint64_t)op->count;
    d->color = op->color;
    d->key = op->key;
}

void mgc_comm_desc_format(const mgc_comm_desc *d, char *buf, size_t size) {
    const char *name = mgc_comm_op_name((mgc_comm_op_kind)d->kind);
    const char *dt = mgc_dtype_name((mgc_dtype)d->dt);
    switch ((mgc_comm_op_kind)d->kind) {
    case MGC_COMM_OP_ALL_REDUCE:
    case MGC_COMM_OP_REDUCE_SCATTER:
        snprintf(buf, size, "%s #%llu (%llu %s, %s)", name, (unsigned long long)d->seq,
                 (unsigned long long)d->count, dt, mgc_comm_red_name((mgc_comm_red)d->red));
        break;
    case MGC_COMM_OP_ALL_GATHER:
        snprintf(buf, size, "%s #%llu (%llu %s)", name, (unsigned long long)d->seq,
                 (unsigned long long)d->count, dt);
        break;
    case MGC_COMM_OP_ALL_TO_ALL_V:
        snprintf(buf, size, "%s #%llu (%s)", name, (unsigned long long)d->seq, dt);
        break;
    case MGC_COMM_OP_BROADCAST:
        snprintf(buf, size, "%s #%llu (%llu %s, root %d)", name, (unsigned long long)d->seq,
                 (unsigned long long)d->count, dt, (int)d->root);
        break;
    case MGC_COMM_OP_SEND:
    case MGC_COMM_OP_RECV:
        snprintf(buf, size, "%s #%llu (%llu %s, peer %d)", name, (unsigned long long)d->seq,
                 (unsigned long long)d->count, dt, (int)d->root);
        break;
    case MGC_COMM_OP_SPLIT:
        if (d->root >= 0)
            snprintf(buf, size, "group #%llu (%s)", (unsigned long long)d->seq,
                     mgc_group_name((mgc_group_kind)d->root));
        else
            snprintf(buf, size, "split #%llu", (unsigned long long)d->seq);
        break;
    default:
        snprintf(buf, size, "%s #%llu", name, (unsigned long long)d->seq);
        break;
    }
}

int mgc_comm_desc_differ(const mgc_comm_desc *a, const mgc_comm_desc *b) {
    if (a->kind != b->kind || a->seq != b->seq) return 1;
    switch ((mgc_comm_op_kind)a->kind) {
    case MGC_COMM_OP_ALL_REDUCE:
    case MGC_COMM_OP_REDUCE_SCATTER:
        return a->red != b->red || a->dt != b->dt || a->count != b->count;
    case MGC_COMM_OP_ALL_GATHER:
        return a->dt != b->dt || a->count != b->count;
    case MGC_COMM_OP_ALL_TO_ALL_V: /* counts are checked pairwise by the transport */
        return a->dt != b->dt;
    case MGC_COMM_OP_BROADCAST:
        return a->dt != b->dt || a->count != b->count || a->root != b->root;
    case MGC_COMM_OP_SPLIT: /* root: the group kind asked for (-1: plain split) */
        return a->root != b->root;
    default:
        return 0;
    }
}

/* ---- the handle base ------------------------------------------------------ */

mgc_comm_status mgc_comm_init_base(mgc_comm *c, const mgc_comm_iface *iface, void *context,
                                   int rank, int size, int world_rank, const int *members,
                                   int64_t timeout_ms, const char *name) {
    c->iface = iface;
    c->context = context;
    c->rank = rank;
    c->size = size;
    c->world_rank = world_rank;
    c->seq = 0;
    c->moves_only = 0;
    memset(&c->dev, 0, sizeof c->dev);
    c->timeout_ms = timeout_ms > 0 ? timeout_ms : MGC_COMM_DEFAULT_TIMEOUT_MS;
    snprintf(c->name, sizeof c->name, "%s", name ? name : "world");
    c->err[0] = '\0';
    c->members = malloc((size_t)size * sizeof *c->members);
    c->send_seq = calloc((size_t)size, sizeof *c->send_seq);
    c->recv_seq = calloc((size_t)size, sizeof *c->recv_seq);
    if (!c->members || !c->send_seq || !c->recv_seq) {
        mgc_comm_free_base(c);
        return MGC_COMM_ERR_NOMEM;
    }
    memcpy(c->members, members, (size_t)size * sizeof *c->members);
    return MGC_COMM_OK;
}

void mgc_comm_free_base(mgc_comm *c) {
    free(c->members);
    free(c->send_seq);
    free(c->recv_seq);
    c->members = NULL;
    c->send_seq = c->recv_seq = NULL;
}

mgc_comm_status mgc_comm_fail(mgc_comm *c, mgc_comm_status s, const char *fmt, ...) {
    int n =
        snprintf(c->err, sizeof c->err, "%s rank %d (world %d): ", c->name, c->rank, c->world_rank);
    if (n < 0 || (size_t)n >= sizeof c->err) return s;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->err + n, sizeof c->err - (size_t)n, fmt, ap);
    va_end(ap);
    return s;
}

/* ---- fixed-order reductions ----------------------------------------------- */

void mgc_comm_reduce_ordered_f32(float *dst, const float *const *parts, int n, size_t count,
                                 mgc_comm_red op) {
    if (n <= 0) return;
    memcpy(dst, parts[0], count * sizeof *dst);
    for (int j = 1; j < n; j++) {
        const float *p = parts[j];
        if (op == MGC_COMM_SUM) {
            for (size_t i = 0; i < count; i++)
                dst[i] += p[i];
        } else {
            for (size_t i = 0; i < count; i++)
                if (p[i] > dst[i] || isnan(p[i])) dst[i] = isnan(dst[i]) ? dst[i] : p[i];
        }
    }
}

/* ---- queries -------------------------------------------------------------- */

int mgc_comm_rank(const mgc_comm *c) {
    return c ? c->rank : -1;
}
int mgc_comm_size(const mgc_comm *c) {
    return c ? c->size : 0;
}
int mgc_comm_world_rank(const mgc_comm *c) {
    return c ? c->world_rank : -1;
}
int mgc_comm_member(const mgc_comm *c, int r) {
    return c && r >= 0 && r < c->size ? c->members[r] : -1;
}
const char *mgc_comm_name(const mgc_comm *c) {
    return c ? c->name : "(null)";
}
const char *mgc_comm_transport(const mgc_comm *c) {
    return c ? c->iface->name : "(null)";
}
int mgc_comm_concurrent(const mgc_comm *c) {
    return c ? c->iface->concurrent : 0;
}
uint64_t mgc_comm_seq(const mgc_comm *c) {
    return c ? c->seq : 0;
}
const char *mgc_comm_error(const mgc_comm *c) {
    return c ? c->err : "null communicator";
}

void mgc_comm_free(mgc_comm *c) {
    if (c) c->iface->free(c);
}

void mgc_comm_abort(mgc_comm *c, const char *reason) {
    if (c && c->iface->abort) c->iface->abort(c, reason ? reason : "(no reason)");
}

/* ---- argument checks and dispatch ----------------------------------------- */

/* f32 everywhere; bf16 and f16 where comm.c folds (moves-only handles, reduce_scatter_v) */
static int is_reducible(mgc_dtype dt, int folded) {
    return dt == MGC_DT_F32 || (folded && (dt == MGC_DT_BF16 || dt == MGC_DT_F16));
}

/* count * size(dt) fits in size_t, and count * mult too */
static int bytes_ok(size_t count, mgc_dtype dt, size_t mult) {
    size_t es = mgc_dtype_size(dt);
    if (es == 0) return 0;
    if (mult && count > SIZE_MAX / mult) return 0;
    return count * (mult ? mult : 1) <= SIZE_MAX / es;
}

static mgc_comm_status run_collective(mgc_comm *c, mgc_comm_op *op) {
    op->seq = c->seq++;
    return c->iface->run(c, op);
}

static mgc_comm_status check_dt(mgc_comm *c, mgc_comm_op_kind k, mgc_dtype dt, int reduce,
                                mgc_comm_red red) {
    if ((unsigned)dt >= MGC_DT__COUNT)
        return mgc_comm_fail(c, MGC_COMM_ERR_INVALID, "%s: unknown dtype %d", mgc_comm_op_name(k),
                             (int)dt);
    if (reduce && !is_reducible(dt, reduce > 1 || c->moves_only))
        return mgc_comm_fail(c, MGC_COMM_ERR_INVALID, "%s: cannot reduce %s (%s)",
                             mgc_comm_op_name(k), mgc_dtype_name(dt),
                             reduce > 1 || c->moves_only ? "f32, bf16 or f16"
                                                         : "f32 only on this transport");
    if (reduce && red != MGC_COMM_SUM && red != MGC_COMM_MAX)
        return mgc_comm_fail(c, MGC_COMM_ERR_INVALID, "%s: unknown reduction %d",
                             mgc_comm_op_name(k), (int)red);
    return MGC_COMM_OK;
}

#define CHECK_HANDLE(c)                                                                            \
    do {                                                                                           \
        if (!(c)) return MGC_COMM_ERR_INVALID;                                                     \
    } while (0)

/* ---- reductions from data movement and a fold (moves-only handles; reduce_scatter_v) ---- */

int mgc_comm_fold_host(void *ctx, void *dst, const void *src, int parts, size_t count,
                       size_t stride, mgc_dtype dt, mgc_comm_red op) {
    (void)ctx;
    size_t es = mgc_dtype_size(dt);
    if (parts < 1 || (dt != MGC_DT_F32 && dt != MGC_DT_BF16 && dt != MGC_DT_F16)) return -1;
    const unsigned char *s = src;
    unsigned char *d = dst;
    for (size_t i = 0; i < count; i++) {
        float a = 0.0f;
        for (int j = 0; j < parts; j++) {
            const unsigned char *p = s + ((size_t)j * stride + i) * es;
            float v;
            if (dt == MGC_DT_F32) {
                memcpy(&v, p, 4);
            } else {
                uint16_t u;
                memcpy(&u, p, 2);
                v = dt == MGC_DT_BF16 ? mgc_bf16_to_f32(u) : mgc_f16_to_f32(u);
            }
            if (j == 0)
                a = v;
            else if (op == MGC_COMM_SUM)
                a += v;
            else if (v > a || isnan(v))
                a = isnan(a) ? a : v; /* NaN propagates */
        }
        if (dt == MGC_DT_F32) {
            memcpy(d + i * 4, &a, 4);
        } else {
            uint16_t u = dt == MGC_DT_BF16 ? mgc_f32_to_bf16(a) : mgc_f32_to_f16(a);
            memcpy(d + i * 2, &u, 2);
        }
    }
    return 0;
}

mgc_comm_status mgc_comm_set_device(mgc_comm *c, const mgc_comm_device *d) {
    CHECK_HANDLE(c);
    if (!d) return mgc_comm_fail(c, MGC_COMM_ERR_INVALID, "set_device: NULL settings");
    c->dev = *d;
    return MGC_COMM_OK;
}

int mgc_comm_moves_only(const mgc_comm *c) {
    return c ? c->moves_only : 0;
}

/* A fold's state: the scratch (the handle's, or malloc'd for host memory) and the counts of
 * the all-to-alls (4 x size). */
typedef struct folder {
    mgc_comm *c;
    unsigned char *scratch;
    int owned;
    size_t *sc, *sd, *rc, *rd;
} folder;

static mgc_comm_status folder_open(folder *f, mgc_comm *c, size_t scratch_bytes, const char *what) {
    memset(f, 0, sizeof *f);
    f->c = c;
    if (!(f->sc = calloc(4 * (size_t)c->size, sizeof *f->sc)))
        return mgc_comm_fail(c, MGC_COMM_ERR_NOMEM, "%s: out of memory", what);
    f->sd = f->sc + c->size, f->rc = f->sd + c->size, f->rd = f->rc + c->size;
    if (c->iface->device_memory && (!c->dev.scratch || !c->dev.fold)) {
        free(f->sc);
        return mgc_comm_fail(c, MGC_COMM_ERR_INVALID,
                             "%s: a reduction on %s device memory needs a fold and a scratch "
                             "there (mgc_comm_set_device)",
                             what, c->iface->name);
    }
    if (c->dev.scratch) {
        if (scratch_bytes > c->dev.scratch_bytes) {
            free(f->sc);
            return mgc_comm_fail(c, MGC_COMM_ERR_INVALID,
                                 "%s: needs %zu bytes of fold scratch, the handle has %zu (the "
                                 "memory plan reserves mgc_fold_scratch_bytes: a plan from "
                                 "another mgc?)",
                                 what, scratch_bytes, c->dev.scratch_bytes);
        }
        f->scratch = c->dev.scratch;
    } else if (scratch_bytes) {
        if (!(f->scratch = malloc(scratch_bytes))) {
            free(f->sc);
            return mgc_comm_fail(c, MGC_COMM_ERR_NOMEM,
                                 "%s: out of memory for %zu bytes of fold "
                                 "scratch",
                                 what, scratch_bytes);
        }
        f->owned = 1;
    }
    return MGC_COMM_OK;
}

static void folder_close(folder *f) {
    if (f->owned) free(f->scratch);
    free(f->sc);
}

/* A part's place in the scratch: whole 8-element vectors (16-byte aligned parts). */
static size_t pad8(size_t n) {
    return (n + 7) / 8 * 8;
}

static mgc_comm_status fold(folder *f, void *dst, int parts, size_t count, mgc_dtype dt,
                            mgc_comm_red op, const char *what) {
    mgc_comm *c = f->c;
    if (!count) return MGC_COMM_OK;
    size_t st = pad8(count);
    int rc = c->dev.fold ? c->dev.fold(c->dev.fold_ctx, dst, f->scratch, parts, count, st, dt, op)
                         : mgc_comm_fold_host(NULL, dst, f->scratch, parts, count, st, dt, op);
    return rc ? mgc_comm_fail(c, MGC_COMM_ERR_SYSTEM, "%s: the fold of %zu %s failed", what, count,
                              mgc_dtype_name(dt))
              : MGC_COMM_OK;
}

static mgc_comm_status a2a(folder *f, const void *send, void *recv, mgc_dtype dt) {
    return mgc_comm_all_to_all_v(f->c, send, f->sc, f->sd, recv, f->rc, f->rd, dt);
}

/* recv[i] = op over ranks of send[i]: per round, rank j's slice [o + j p, o + (j+1) p) goes to
 * rank j (all-to-all), is folded there, and comes back to every rank (all-to-all). */
static mgc_comm_status folded_all_reduce(mgc_comm *c, const void *send, void *recv, size_t n,
                                         mgc_dtype dt, mgc_comm_red op) {
    int G = c->size, me = c->rank;
    size_t es = mgc_dtype_size(dt);
    size_t p = (size_t)mgc_fold_round(n, G, es, 0);
    folder f;
    MGC_COMM_TRY(folder_open(&f, c, (size_t)mgc_fold_scratch_bytes(n, G, es, 0), "all_reduce"));
    mgc_comm_status s = MGC_COMM_OK;
    const unsigned char *in = send;
    unsigned char *out = recv;
    for (size_t o = 0; o < n && s == MGC_COMM_OK; o += (size_t)G * p) {
        size_t r = n - o < (size_t)G * p ? n - o : (size_t)G * p;
#define SLICE(j) ((size_t)(j)*p >= r ? 0 : r - (size_t)(j)*p < p ? r - (size_t)(j)*p : p)
        size_t mine = SLICE(me);
        for (int j = 0; j < G; j++) {
            f.sc[j] = SLICE(j), f.sd[j] = o + (size_t)j * p;
            f.rc[j] = mine, f.rd[j] = (size_t)j * pad8(mine);
        }
        s = a2a(&f, in, f.scratch, dt);
        if (s == MGC_COMM_OK)
            s = fold(&f, out + (o + (size_t)me * p) * es, G, mine, dt, op, "all_reduce");
        for (int j = 0; j < G; j++) { /* the slices back; this rank's is in place */
            f.sc[j] = j == me ? 0 : mine, f.sd[j] = o + (size_t)me * p;
            f.rc[j] = j == me ? 0 : SLICE(j), f.rd[j] = o + (size_t)j * p;
        }
#undef SLICE
        if (s == MGC_COMM_OK) s = a2a(&f, out, out, dt);
    }
    folder_close(&f);
    return s;
}

/* Rank r receives the fold of block r: per round, [o, o + r) of every block to its rank. */
static mgc_comm_status folded_reduce_scatter(mgc_comm *c, const void *send, void *recv, size_t n,
                                             mgc_dtype dt, mgc_comm_red op) {
    int G = c->size;
    size_t es = mgc_dtype_size(dt);
    size_t step = (size_t)mgc_fold_round(n, G, es, 1);
    folder f;
    MGC_COMM_TRY(folder_open(&f, c, (size_t)mgc_fold_scratch_bytes(n, G, es, 1), "reduce_scatter"));
    mgc_comm_status s = MGC_COMM_OK;
    for (size_t o = 0; o < n && s == MGC_COMM_OK; o += step) {
        size_t r = n - o < step ? n - o : step;
        for (int j = 0; j < G; j++)
            f.sc[j] = r, f.sd[j] = (size_t)j * n + o, f.rc[j] = r, f.rd[j] = (size_t)j * pad8(r);
        s = a2a(&f, send, f.scratch, dt);
        if (s == MGC_COMM_OK)
            s = fold(&f, (unsigned char *)recv + o * es, G, r, dt, op, "reduce_scatter");
    }
    folder_close(&f);
    return s;
}

mgc_comm_status mgc_comm_reduce_scatter_v(mgc_comm *c, const void *send, const size_t *per,
                                          void *recv, mgc_dtype dt, mgc_comm_red op) {
    CHECK_HANDLE(c);
    MGC_COMM_TRY(check_dt(c, MGC_COMM_OP_REDUCE_SCATTER, dt, 2, op));
    if (!per) return mgc_comm_fail(c, MGC_COMM_ERR_INVALID, "reduce_scatter_v: NULL counts");
    int G = c->size, me = c->rank;
    size_t es = mgc_dtype_size(dt), most = 0, total = 0;
    for (int j = 0; j < G; j++) {
        if (per[j] > SIZE_MAX - total)
            return mgc_comm_fail(c, MGC_COMM_ERR_INVALID, "reduce_scatter_v: counts overflow");
        total += per[j];
        if (per[j] > most) most = per[j];
    }
    if (!bytes_ok(total, dt, 0) || !bytes_ok(most, dt, (size_t)G))
        return mgc_comm_fail(c, MGC_COMM_ERR_INVALID, "reduce_scatter_v: counts overflow");
    if ((total && !send) || (per[me] && !recv))
        return mgc_comm_fail(c, MGC_COMM_ERR_INVALID, "reduce_scatter_v: NULL buffer");
    /* rounds over the largest block, so that every rank runs as many */
    size_t step = (size_t)mgc_fold_round(most, G, es, 1);
    folder f;
    MGC_COMM_TRY(
        folder_open(&f, c, (size_t)mgc_fold_scratch_bytes(most, G, es, 1), "reduce_scatter_v"));
    mgc_comm_status s = MGC_COMM_OK;
    for (size_t o = 0; o < most && s == MGC_COMM_OK; o += step) {
        size_t begin = 0, mine = per[me] > o ? per[me] - o : 0;
        if (mine > step) mine = step;
        for (int j = 0; j < G; j++) {
            size_t len = per[j] > o ? per[j] - o : 0;
            f.sc[j] = len > step ? step : len, f.sd[j] = begin + o;
            f.rc[j] = mine, f.rd[j] = (size_t)j * pad8(mine);
            begin += per[j];
        }
        s = a2a(&f, send, f.scratch, dt);
        if (s == MGC_COMM_OK)
            s = fold(&f, (unsigned char *)recv + o * es, G, mine, dt, op, "reduce_scatter_v");
    }
    folder_close(&f);
    return s;
}

mgc_comm_status mgc_comm_all_reduce(mgc_comm *c, const void *send, void *recv, size_t count,
                                    mgc_dtype dt, mgc_comm_red op) {
    CHECK_HANDLE(c);
    MGC_COMM_TRY(check_dt(c, MGC_COMM_OP_ALL_REDUCE, dt, 1, op));
    if (count && (!send || !recv))
        return mgc_comm_fail(c, MGC_COMM_ERR_INVALID, "all_reduce: NULL buffer");
    if (!bytes_ok(count, dt, 0))
        return mgc_comm_fail(c, MGC_COMM_ERR_INVALID, "all_reduce: count overflows");
    if (c->moves_only) return folded_all_reduce(c, send, recv, count, dt, op);
    mgc_comm_op o = {.kind = MGC_COMM_OP_ALL_REDUCE,
                     .red = op,
                     .dt = dt,
                     .count = count,
                     .send = send,
                     .recv = recv};
    return run_collective(c, &o);
}

mgc_comm_status mgc_comm_reduce_scatter(mgc_comm *c, const void *send, void *recv, size_t count,
                                        mgc_dtype dt, mgc_comm_red op) {
    CHECK_HANDLE(c);
    MGC_COMM_TRY(check_dt(c, MGC_COMM_OP_REDUCE_SCATTER, dt, 1, op));
    if (count && (!send || !recv))
        return mgc_comm_fail(c, MGC_COMM_ERR_INVALID, "reduce_scatter: NULL buffer");
    if (!bytes_ok(count, dt, (size_t)c->size))
        return mgc_comm_fail(c, MGC_COMM_ERR_INVALID, "reduce_scatter: count overflows");
    if (c->moves_only) return folded_reduce_scatter(c, send, recv, count, dt, op);
    mgc_comm_op o = {.kind = MGC_COMM_OP_REDUCE_SCATTER,
                     .red = op,
                     .dt = dt,
                     .count = count,
                     .send = send,
                     .recv = recv};
    return run_collective(c, &o);
}

mgc_comm_status mgc_comm_all_gather(mgc_comm *c, const void *send, void *recv, size_t count,
                                    mgc_dtype dt) {
    CHECK_HANDLE(c);
    MGC_COMM_TRY(check_dt(c, MGC_COMM_OP_ALL_GATHER, dt, 0, MGC_COMM_SUM));
    if (count && (!send || !recv))
        return mgc_comm_fail(c, MGC_COMM_ERR_INVALID, "all_gather: NULL buffer");
    if (!bytes_ok(count, dt, (size_t)c->size))
        return mgc_comm_fail(c, MGC_COMM_ERR_INVALID, "all_gather: count overflows");
    mgc_comm_op o = {
        .kind = MGC_COMM_OP_ALL_GATHER, .dt = dt, .count = count, .send = send, .recv = recv};
    return run_collective(c, &o);
}

/* Fills displs (packed) when the caller gave none and checks every block fits
 * in size_t; *total is the extent of the buffer in elements. */
static int vector_layout(const size_t *counts, const size_t *displs, size_t *packed, int n,
                         mgc_dtype dt, size_t *total) {
    size_t off = 0, end = 0;
    for (int j = 0; j < n; j++) {
        size_t d = displs ? displs[j] : off;
        if (packed) packed[j] = d;
        if (counts[j] > SIZE_MAX - d) return -1;
        if (d + counts[j] > end) end = d + counts[j];
        if (!displs) off = d + counts[j];
    }
    *total = end;
    return bytes_ok(end, dt, 0) ? 0 : -1;
}

mgc_comm_status mgc_comm_all_to_all_v(mgc_comm *c, const void *send, const size_t *send_counts,
                                      const size_t *send_displs, void *recv,
                                      const size_t *recv_counts, const size_t *recv_displs,
                                      mgc_dtype dt) {
    CHECK_HANDLE(c);
    MGC_COMM_TRY(check_dt(c, MGC_COMM_OP_ALL_TO_ALL_V, dt, 0, MGC_COMM_SUM));
    if (!send_counts || !recv_counts)
        return mgc_comm_fail(c, MGC_COMM_ERR_INVALID, "all_to_all_v: NULL counts");
    size_t *sd = malloc(2 * (size_t)c->size * sizeof *sd);
    if (!sd) return mgc_comm_fail(c, MGC_COMM_ERR_NOMEM, "all_to_all_v: out of memory");
    size_t *rd = sd + c->size, stotal, rtotal;
    mgc_comm_status s = MGC_COMM_OK;
    if (vector_layout(send_counts, send_displs, sd, c->size, dt, &stotal) ||
        vector_layout(recv_counts, recv_displs, rd, c->size, dt, &rtotal)) {
        s = mgc_comm_fail(c, MGC_COMM_ERR_INVALID, "all_to_all_v: counts overflow");
        goto fail;
    }
    if ((stotal && !send) || (rtotal && !recv)) {
        s = mgc_comm_fail(c, MGC_COMM_ERR_INVALID, "all_to_all_v: NULL buffer");
        goto fail;
    }
    mgc_comm_op o = {.kind = MGC_COMM_OP_ALL_TO_ALL_V,
                     .dt = dt,
                     .send = send,
                     .recv = recv,
                     .send_counts = send_counts,
                     .send_displs = sd,
                     .recv_counts = recv_counts,
                     .recv_displs = rd};
    s = run_collective(c, &o);
fail:
    free(sd);
    return s;
}

mgc_comm_status mgc_comm_broadcast(mgc_comm *c, void *buf, size_t count, mgc_dtype dt, int root) {
    CHECK_HANDLE(c);
    MGC_COMM_TRY(check_dt(c, MGC_COMM_OP_BROADCAST, dt, 0, MGC_COMM_SUM));
    if (root < 0 || root >= c->size)
        return mgc_comm_fail(c, MGC_COMM_ERR_INVALID, "broadcast: root %d outside 0..%d", root,
                             c->size - 1);
    if (count && !buf) return mgc_comm_fail(c, MGC_COMM_ERR_INVALID, "broadcast: NULL buffer");
    if (!bytes_ok(count, dt, 0))
        return mgc_comm_fail(c, MGC_COMM_ERR_INVALID, "broadcast: count overflows");
    mgc_comm_op o = {.kind = MGC_COMM_OP_BROADCAST,
                     .dt = dt,
                     .count = count,
                     .root = root,
                     .send = buf,
                     .recv = buf};
    return run_collective(c, &o);
}

mgc_comm_status mgc_comm_barrier(mgc_comm *c) {
    CHECK_HANDLE(c);
    mgc_comm_op o = {.kind = MGC_COMM_OP_BARRIER, .dt = MGC_DT_U8};
    return run_collective(c, &o);
}

static mgc_comm_status p2p(mgc_comm *c, mgc_comm_op_kind k, const void *send, void *recv,
                           size_t count, mgc_dtype dt, int peer) {
    CHECK_HANDLE(c);
    MGC_COMM_TRY(check_dt(c, k, dt, 0, MGC_COMM_SUM));
    if (peer < 0 || peer >= c->size || peer == c->rank)
        return mgc_comm_fail(c, MGC_COMM_ERR_INVALID, "%s: peer %d is not another rank of 0..%d",
                             mgc_comm_op_name(k), peer, c->size - 1);
    if (count && !send && !recv)
        return mgc_comm_fail(c, MGC_COMM_ERR_INVALID, "%s: NULL buffer", mgc_comm_op_name(k));
    if (!bytes_ok(count, dt, 0))
        return mgc_comm_fail(c, MGC_COMM_ERR_INVALID, "%s: count overflows", mgc_comm_op_name(k));
    uint64_t *seq = k == MGC_COMM_OP_SEND ? &c->send_seq[peer] : &c->recv_seq[peer];
    mgc_comm_op o = {.kind = k,
                     .dt = dt,
                     .count = count,
                     .root = peer,
                     .seq = (*seq)++,
                     .send = send,
                     .recv = recv};
    return c->iface->run(c, &o);
}

mgc_comm_status mgc_comm_send(mgc_comm *c, const void *buf, size_t count, mgc_dtype dt, int peer) {
    return p2p(c, MGC_COMM_OP_SEND, buf, NULL, count, dt, peer);
}

mgc_comm_status mgc_comm_recv(mgc_comm *c, void *buf, size_t count, mgc_dtype dt, int peer) {
    return p2p(c, MGC_COMM_OP_RECV, NULL, buf, count, dt, peer);
}

/* ---- sub-communicators ---------------------------------------------------- */

/* tag: the group kind for mgc_comm_group, -1 for a plain split; it is part of
 * the compared descriptor, so ranks asking for different kinds are a mismatch. */
static mgc_comm_status split(mgc_comm *parent, int64_t color, int64_t key, int tag,
                             mgc_comm **out) {
    mgc_comm_op o = {.kind = MGC_COMM_OP_SPLIT,
                     .dt = MGC_DT_U8,
                     .color = color < 0 ? -1 : color,
                     .key = key,
                     .root = tag,
                     .seq = parent->seq++};
    mgc_comm_status s = parent->iface->split(parent, &o, out);
    if (s == MGC_COMM_OK && *out) {
        snprintf((*out)->name, sizeof(*out)->name, "split#%lld", (long long)color);
        (*out)->moves_only = parent->moves_only;
    }
    return s;
}

mgc_comm_status mgc_comm_split(mgc_comm *parent, int64_t color, int64_t key, mgc_comm **out) {
    CHECK_HANDLE(parent);
    if (!out) return mgc_comm_fail(parent, MGC_COMM_ERR_INVALID, "split: NULL out");
    *out = NULL;
    return split(parent, color, key, -1, out);
}

mgc_comm_status mgc_comm_group(mgc_comm *world, const mgc_grid *grid, mgc_group_kind kind,
                               mgc_comm **out) {
    CHECK_HANDLE(world);
    if (!out) return mgc_comm_fail(world, MGC_COMM_ERR_INVALID, "group: NULL out");
    *out = NULL;
    if (!grid || mgc_grid_check(grid) != 0)
        return mgc_comm_fail(world, MGC_COMM_ERR_INVALID, "group: inconsistent grid");
    if ((unsigned)kind >= MGC_GROUP__COUNT)
        return mgc_comm_fail(world, MGC_COMM_ERR_INVALID, "group: unknown kind %d", (int)kind);
    if (grid->world != world->size || world->world_rank != world->rank)
        return mgc_comm_fail(world, MGC_COMM_ERR_INVALID,
                             "group %s: the grid's world is %lld ranks but this communicator "
                             "(%s) is not that world (%d ranks)",
                             mgc_group_name(kind), (long long)grid->world, world->name,
                             world->size);
    int64_t me = world->rank;
    int64_t id = mgc_grid_group_id(grid, kind, me);
    int64_t grank = mgc_grid_group_rank(grid, kind, me);
    /* colour: the group id; key: the group rank (docs/process-groups.md) */
    mgc_comm *c = NULL;
    mgc_comm_status s = split(world, id < 0 ? -1 : id, grank, (int)kind, &c);
    if (s != MGC_COMM_OK) return s;
    if (!c) return MGC_COMM_OK;
    /* the transport's members must be the grid's */
    int64_t n = mgc_grid_group(grid, kind, me, NULL, 0);
    int64_t *m = n > 0 ? malloc((size_t)n * sizeof *m) : NULL;
    if (!m) {
        mgc_comm_free(c);
        return mgc_comm_fail(world, MGC_COMM_ERR_NOMEM, "group: out of memory");
    }
    mgc_grid_group(grid, kind, me, m, n);
    int ok = n == c->size && grank == c->rank;
    for (int64_t j = 0; ok && j < n; j++)
        ok = m[j] == c->members[j];
    free(m);
    if (!ok) {
        mgc_comm_free(c);
        return mgc_comm_fail(world, MGC_COMM_ERR_MISMATCH,
                             "group %s: ranks disagree on the group (different grids or kinds?)",
                             mgc_group_name(kind));
    }
    if (kind == MGC_GROUP_WORLD)
        snprintf(c->name, sizeof c->name, "world");
    else
        snprintf(c->name, sizeof c->name, "%s#%lld", mgc_group_name(kind), (long long)id);
    *out = c;
    return MGC_COMM_OK;
}
