/* exec_comm.c - the executor's communication (exec_int.h): collectives and transfers on
 * device memory staged through host memory, the collectives of a chunk program, and the
 * device communicator. */
#include "exec_int.h"

#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "half.h"

static int kfail(xcomm *k, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;
static int kfail(xcomm *k, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(k->err, k->errsz, fmt, ap);
    va_end(ap);
    return -1;
}

void mgc_exec_xcomm_release(xcomm *k) {
    if (!k->host) return;
    if (k->host_pinned) k->be->iface->host_free(k->be, k->host);
    else free(k->host);
    k->host = NULL;
    k->host_cap = 0;
}

/* The staging buffer, at least `bytes` long (NULL with k->err set). */
unsigned char *mgc_exec_xcomm_stage(xcomm *k, size_t bytes) {
    if (bytes <= k->host_cap) return k->host;
    mgc_exec_xcomm_release(k);
    void *p = NULL;
    size_t n = bytes < 256 ? 256 : bytes;
    if (k->be->iface->host_alloc && k->be->iface->host_free) {
        if (k->be->iface->host_alloc(k->be, n, &p)) {
            kfail(k, "rank %" PRId64 ": allocating the host staging buffer for communication: %s",
                  k->rank, k->be->err);
            return NULL;
        }
        k->host_pinned = 1;
    } else {
        if (!(p = malloc(n))) {
            kfail(k, "rank %" PRId64 ": out of memory for a %zu-byte communication staging buffer",
                  k->rank, n);
            return NULL;
        }
        k->host_pinned = 0;
    }
    k->host = p;
    k->host_cap = n;
    return k->host;
}

static int stage_down(xcomm *k, void *host, const void *arena, size_t bytes) {
    k->staged_bytes += (int64_t)bytes;
    if (k->xfer) {
        char e[512];
        if (k->be->iface->xfer_download(k->be, k->mark, host, arena, bytes, e, sizeof e))
            return kfail(k, "rank %" PRId64 ": staging a gradient bucket for its reduction: %s", k->rank, e);
        return 0;
    }
    if (k->be->iface->download(k->be, host, arena, bytes))
        return kfail(k, "rank %" PRId64 ": staging for communication: %s", k->rank, k->be->err);
    return 0;
}
int mgc_exec_xcomm_up(xcomm *k, void *arena, const void *host, size_t bytes) {
    k->staged_bytes += (int64_t)bytes;
    if (k->xfer) {
        char e[512];
        if (k->be->iface->xfer_upload(k->be, arena, host, bytes, e, sizeof e))
            return kfail(k, "rank %" PRId64 ": returning a reduced gradient bucket: %s", k->rank, e);
        return 0;
    }
    if (k->be->iface->upload(k->be, arena, host, bytes))
        return kfail(k, "rank %" PRId64 ": staging for communication: %s", k->rank, k->be->err);
    return 0;
}

static int c_check(xcomm *k, mgc_comm *g, mgc_comm_status s, const char *what) {
    if (s == MGC_COMM_OK) return 0;
    const char *e = g ? mgc_comm_error(g) : "";
    return kfail(k, "rank %" PRId64 ": %s: %s%s%s", k->rank, what, mgc_comm_status_name(s),
                 e[0] ? ": " : "", e);
}

/* The device communicator's handle for host group g, or NULL (collectives through g). */
static mgc_comm *devof(const xcomm *k, const mgc_comm *g) {
    for (int i = 0; i < k->n_dev; i++)
        if (k->hosts[i] == g) return k->devs[i];
    return NULL;
}

/* 16-bit values (bf16, fp16; comm.h reduces fp32): widened to fp32, reduced in group-rank order
 * as every reduction, and rounded once to their type -- the same bits on every rank, and no
 * rounding between the addends.  scatter: a reduce-scatter of n elements a rank (in holds
 * group size * n), else an all-reduce of n. */
static int c_reduce16(xcomm *k, mgc_comm *g, const void *in, void *out, size_t n, mgc_dtype dt,
                      int scatter, mgc_comm_red red, const char *what) {
    size_t nin = scatter ? n * (size_t)mgc_comm_size(g) : n;
    uint16_t *h = malloc((nin ? nin : 1) * sizeof *h);
    float *f = malloc((nin ? nin : 1) * sizeof *f);
    int rc = -1;
    if (!h || !f) {
        kfail(k, "rank %" PRId64 ": %s: out of memory", k->rank, what);
        goto out;
    }
    if (k->staged) {
        if (stage_down(k, h, in, nin * sizeof *h)) goto out;
    } else {
        memcpy(h, in, nin * sizeof *h);
    }
    for (size_t i = 0; i < nin; i++)
        f[i] = dt == MGC_DT_BF16 ? mgc_bf16_to_f32(h[i]) : mgc_f16_to_f32(h[i]);
    float *mine = scatter ? f + (size_t)mgc_comm_rank(g) * n : f;
    mgc_comm_status st = scatter ? mgc_comm_reduce_scatter(g, f, mine, n, MGC_DT_F32, MGC_COMM_SUM)
                                 : mgc_comm_all_reduce(g, f, f, n, MGC_DT_F32, red);
    if (c_check(k, g, st, what)) goto out;
    for (size_t i = 0; i < n; i++)
        h[i] = dt == MGC_DT_BF16 ? mgc_f32_to_bf16(mine[i]) : mgc_f32_to_f16(mine[i]);
    if (k->staged) rc = mgc_exec_xcomm_up(k, out, h, n * sizeof *h);
    else memcpy(out, h, n * sizeof *h), rc = 0;
out:
    free(h), free(f);
    return rc;
}

int mgc_exec_comm_all_reduce(xcomm *k, mgc_comm *g, const void *in, void *out, size_t n,
                             mgc_dtype dt, mgc_comm_red red, const char *what) {
    mgc_comm *d = devof(k, g);
    if (d) return c_check(k, d, mgc_comm_all_reduce(d, in, out, n, dt, red), what);
    if (dt == MGC_DT_BF16 || dt == MGC_DT_F16) return c_reduce16(k, g, in, out, n, dt, 0, red, what);
    if (!k->staged) return c_check(k, g, mgc_comm_all_reduce(g, in, out, n, dt, red), what);
    size_t b = n * mgc_dtype_size(dt);
    unsigned char *h = mgc_exec_xcomm_stage(k, b);
    if (!h || stage_down(k, h, in, b)) return -1;
    if (c_check(k, g, mgc_comm_all_reduce(g, h, h, n, dt, red), what)) return -1;
    return mgc_exec_xcomm_up(k, out, h, b);
}

/* in: (group size * n) elements; out: this rank's n (it may lie inside in). */
int mgc_exec_comm_reduce_scatter(xcomm *k, mgc_comm *g, const void *in, void *out, size_t n,
                                 mgc_dtype dt, const char *what) {
    mgc_comm *d = devof(k, g);
    if (d) return c_check(k, d, mgc_comm_reduce_scatter(d, in, out, n, dt, MGC_COMM_SUM), what);
    if (dt == MGC_DT_BF16 || dt == MGC_DT_F16)
        return c_reduce16(k, g, in, out, n, dt, 1, MGC_COMM_SUM, what);
    if (!k->staged) return c_check(k, g, mgc_comm_reduce_scatter(g, in, out, n, dt, MGC_COMM_SUM), what);
    size_t b = n * mgc_dtype_size(dt), all = b * (size_t)mgc_comm_size(g);
    unsigned char *h = mgc_exec_xcomm_stage(k, all);
    if (!h || stage_down(k, h, in, all)) return -1;
    unsigned char *mine = h + (size_t)mgc_comm_rank(g) * b;
    if (c_check(k, g, mgc_comm_reduce_scatter(g, h, mine, n, dt, MGC_COMM_SUM), what)) return -1;
    return mgc_exec_xcomm_up(k, out, mine, b);
}

/* in: this rank's n elements (it may be out + rank * n); out: (group size * n). */
int mgc_exec_comm_all_gather(xcomm *k, mgc_comm *g, const void *in, void *out, size_t n,
                             mgc_dtype dt, const char *what) {
    mgc_comm *d = devof(k, g);
    if (d) return c_check(k, d, mgc_comm_all_gather(d, in, out, n, dt), what);
    if (!k->staged) return c_check(k, g, mgc_comm_all_gather(g, in, out, n, dt), what);
    size_t b = n * mgc_dtype_size(dt), all = b * (size_t)mgc_comm_size(g);
    unsigned char *h = mgc_exec_xcomm_stage(k, all);
    if (!h) return -1;
    unsigned char *mine = h + (size_t)mgc_comm_rank(g) * b;
    if (stage_down(k, mine, in, b)) return -1;
    if (c_check(k, g, mgc_comm_all_gather(g, mine, h, n, dt), what)) return -1;
    return mgc_exec_xcomm_up(k, out, h, all);
}

/* Packed all-to-all-v: cnt[0..size) send counts, cnt[size..2 size) receive counts. */
static int c_all_to_all(xcomm *k, mgc_comm *g, const void *in, void *out, const size_t *cnt,
                        mgc_dtype dt, const char *what) {
    int size = mgc_comm_size(g);
    mgc_comm *d = devof(k, g);
    if (d)
        return c_check(k, d, mgc_comm_all_to_all_v(d, in, cnt, NULL, out, cnt + size, NULL, dt),
                       what);
    if (!k->staged)
        return c_check(k, g, mgc_comm_all_to_all_v(g, in, cnt, NULL, out, cnt + size, NULL, dt), what);
    size_t es = mgc_dtype_size(dt), sb = 0, rb = 0;
    for (int j = 0; j < size; j++)
        sb += cnt[j] * es, rb += cnt[size + j] * es;
    unsigned char *h = mgc_exec_xcomm_stage(k, sb + rb);
    if (!h || stage_down(k, h, in, sb)) return -1;
    if (c_check(k, g, mgc_comm_all_to_all_v(g, h, cnt, NULL, h + sb, cnt + size, NULL, dt), what))
        return -1;
    return mgc_exec_xcomm_up(k, out, h + sb, rb);
}

/* Variable all-gather: group rank j holds per[j] elements; out = their concatenation in
 * group-rank order (an all-to-all that sends this rank's elements to every peer). */
static int c_all_gather_v(xcomm *k, mgc_comm *g, const void *in, void *out, const size_t *per,
                          mgc_dtype dt, const char *what) {
    int size = mgc_comm_size(g), me = mgc_comm_rank(g);
    size_t es = mgc_dtype_size(dt), rb = 0;
    size_t *sc = calloc((size_t)(2 * size), sizeof *sc);
    if (!sc) return kfail(k, "rank %" PRId64 ": %s: out of memory", k->rank, what);
    size_t *sd = sc + size; /* every peer reads the same elements: displacements 0 */
    for (int j = 0; j < size; j++)
        sc[j] = per[me], rb += per[j] * es;
    int rc;
    mgc_comm *d = devof(k, g);
    if (d || !k->staged) {
        mgc_comm *on = d ? d : g;
        rc = c_check(k, on, mgc_comm_all_to_all_v(on, in, sc, sd, out, per, NULL, dt), what);
    } else {
        size_t sb = per[me] * es;
        unsigned char *h = mgc_exec_xcomm_stage(k, sb + rb);
        rc = !h || stage_down(k, h, in, sb) ||
                     c_check(k, g, mgc_comm_all_to_all_v(g, h, sc, sd, h + sb, per, NULL, dt), what)
                 ? -1
                 : mgc_exec_xcomm_up(k, out, h + sb, rb);
    }
    free(sc);
    return rc;
}

/* Variable reduce-scatter: in holds, in group-rank order, per[j] elements for each group rank
 * j (partial sums); this rank receives the sum of its block over the group, added in
 * group-rank order in fp32 (16-bit types rounded once), as every reduction (comm.h
 * mgc_comm_reduce_scatter_v). */
static int c_reduce_scatter_v(xcomm *k, mgc_comm *g, const void *in, void *out, const size_t *per,
                              mgc_dtype dt, const char *what) {
    int size = mgc_comm_size(g), me = mgc_comm_rank(g);
    mgc_comm *d = devof(k, g);
    if (d || !k->staged) {
        mgc_comm *on = d ? d : g;
        return c_check(k, on, mgc_comm_reduce_scatter_v(on, in, per, out, dt, MGC_COMM_SUM), what);
    }
    size_t es = mgc_dtype_size(dt), sb = 0;
    for (int j = 0; j < size; j++)
        sb += per[j] * es;
    unsigned char *h = mgc_exec_xcomm_stage(k, sb + per[me] * es);
    if (!h || stage_down(k, h, in, sb)) return -1;
    if (c_check(k, g, mgc_comm_reduce_scatter_v(g, h, per, h + sb, dt, MGC_COMM_SUM), what))
        return -1;
    return mgc_exec_xcomm_up(k, out, h + sb, per[me] * es);
}

static int c_broadcast(xcomm *k, mgc_comm *g, void *buf, size_t n, mgc_dtype dt, const char *what) {
    mgc_comm *d = devof(k, g);
    if (d) return c_check(k, d, mgc_comm_broadcast(d, buf, n, dt, 0), what);
    if (!k->staged) return c_check(k, g, mgc_comm_broadcast(g, buf, n, dt, 0), what);
    size_t b = n * mgc_dtype_size(dt);
    unsigned char *h = mgc_exec_xcomm_stage(k, b);
    if (!h || (mgc_comm_rank(g) == 0 && stage_down(k, h, buf, b))) return -1;
    if (c_check(k, g, mgc_comm_broadcast(g, h, n, dt, 0), what)) return -1;
    return mgc_comm_rank(g) == 0 ? 0 : mgc_exec_xcomm_up(k, buf, h, b);
}

int mgc_exec_comm_send(xcomm *k, mgc_comm *g, const void *buf, size_t bytes, int peer,
                       const char *what) {
    mgc_comm *d = devof(k, g);
    if (d) return c_check(k, d, mgc_comm_send(d, buf, bytes, MGC_DT_U8, peer), what);
    if (!k->staged) return c_check(k, g, mgc_comm_send(g, buf, bytes, MGC_DT_U8, peer), what);
    unsigned char *h = mgc_exec_xcomm_stage(k, bytes);
    if (!h || stage_down(k, h, buf, bytes)) return -1;
    return c_check(k, g, mgc_comm_send(g, h, bytes, MGC_DT_U8, peer), what);
}

int mgc_exec_comm_recv(xcomm *k, mgc_comm *g, void *buf, size_t bytes, int peer, const char *what) {
    mgc_comm *d = devof(k, g);
    if (d) return c_check(k, d, mgc_comm_recv(d, buf, bytes, MGC_DT_U8, peer), what);
    if (!k->staged) return c_check(k, g, mgc_comm_recv(g, buf, bytes, MGC_DT_U8, peer), what);
    unsigned char *h = mgc_exec_xcomm_stage(k, bytes);
    if (!h || c_check(k, g, mgc_comm_recv(g, h, bytes, MGC_DT_U8, peer), what)) return -1;
    return mgc_exec_xcomm_up(k, buf, h, bytes);
}

/* A small arena array the executor reads on the host (row counts, token counts): the
 * address itself on a host arena, else a copy in `tmp`. */
static const void *host_view(xcomm *k, const void *arena, void *tmp, size_t bytes) {
    if (!k->staged) return arena;
    return stage_down(k, tmp, arena, bytes) ? NULL : tmp;
}

/* ---- collectives of a chunk program --------------------------------------------------- */

/* Per-peer element counts of a variable all-to-all: block j of `counts`
 * (rows per (peer, local expert)) summed, times the row width. */
static int a2a_counts(const int64_t *counts, int64_t n_counts, int peers, int64_t width,
                      size_t *out) {
    if (n_counts % peers) return -1;
    int64_t per = n_counts / peers;
    for (int j = 0; j < peers; j++) {
        int64_t s = 0;
        for (int64_t e = 0; e < per; e++)
            s += counts[j * per + e];
        out[j] = (size_t)(s * width);
    }
    return 0;
}

/* Elements each group rank holds in a variable all-gather or reduce-scatter: in[1]'s row
 * counts (size x the experts, group-rank order) summed per rank, times the row width. */
static int var_counts(mgc_exec *x, int c, const mgc_plan_op *op, int32_t mb, int size, size_t *per) {
    const mgc_plan_chunk *ch = &x->sp->chunks[c];
    if (op->n_in < 2 || op->in[1] < 0)
        return mgc_exec_fail(x, "'%s': a variable collective without its row counts",
                             sname(x, op->name));
    const mgc_plan_tensor *t = &ch->tensors[op->in[0]], *ct = &ch->tensors[op->in[1]];
    if (ct->dtype != MGC_DT_I64)
        return mgc_exec_fail(x, "'%s': row counts are %s, not int64", sname(x, op->name),
                     mgc_dtype_name((mgc_dtype)ct->dtype));
    size_t nc = (size_t)tnumel(ct);
    int64_t *tmp = malloc((nc ? nc : 1) * sizeof *tmp);
    const void *cd = taddr(x, c, op->in[1], mb);
    if (!tmp) return mgc_exec_fail(x, "out of memory");
    if (!cd) {
        free(tmp);
        return mgc_exec_fail(x, "'%s': row counts not materialised", sname(x, op->name));
    }
    const int64_t *a = host_view(x->fg, cd, tmp, nc * sizeof *tmp);
    int rc = 0;
    if (!a) rc = -1; /* the download failed: x->err says why */
    else if (a2a_counts(a, (int64_t)nc, size, t->dim[t->rank - 1], per))
        rc = mgc_exec_fail(x, "'%s': %zu row counts do not split over %d ranks", sname(x, op->name),
                           nc, size);
    else
        for (size_t i = 0; i < nc; i++)
            if (a[i] < 0) rc = mgc_exec_fail(x, "'%s': a negative row count", sname(x, op->name));
    free(tmp);
    return rc;
}

int mgc_exec_run_collective(mgc_exec *x, int c, const mgc_plan_op *op, int32_t mb) {
    const mgc_plan_chunk *ch = &x->sp->chunks[c];
    mgc_comm *g = op->group < MGC_GROUP__COUNT ? x->group[op->group] : NULL;
    if (!g)
        return mgc_exec_fail(x, "rank %" PRId64 ": '%s' needs a %s group this rank is not in",
                             x->rank, sname(x, op->name),
                             mgc_group_name((mgc_group_kind)op->group));
    void *in = taddr(x, c, op->in[0], mb), *out = taddr(x, c, op->out[0], mb);
    if (!in || !out) return mgc_exec_fail(x, "'%s': tensor not materialised", sname(x, op->name));
    mgc_dtype dt = (mgc_dtype)op->iattr[2];
    size_t n_in = (size_t)op->iattr[0], n_out = (size_t)op->iattr[1];
    int size = mgc_comm_size(g);
    if (size == 1) { /* a group of one: the identity, on the backend's memory */
        size_t n = n_in < n_out ? n_in : n_out;
        if (in != out && x->be->iface->copy(x->be, out, in, n * mgc_dtype_size(dt)))
            return mgc_exec_fail_backend(x, "a one-rank collective");
        return 0;
    }
    char what[300];
    snprintf(what, sizeof what, "%s '%s' (microbatch %d, chunk %d)",
             mgc_plan_op_name((mgc_plan_op_kind)op->kind), sname(x, op->name), mb, c);
    switch (op->kind) {
    case MGC_POP_ALL_REDUCE: {
        mgc_comm_red red = (op->iattr[3] & PCOLL_MAX) ? MGC_COMM_MAX : MGC_COMM_SUM;
        if (dt == MGC_DT_F32 || dt == MGC_DT_BF16 || dt == MGC_DT_F16)
            return mgc_exec_comm_all_reduce(x->fg, g, in, out, n_in, dt, red, what);
        if (dt != MGC_DT_I64)
            return mgc_exec_fail(x, "'%s': all-reduce of %s is not supported", sname(x, op->name),
                         mgc_dtype_name(dt));
        /* token counts, summed on the host: exact in fp32 below 2^24 */
        int64_t *v = malloc(n_in * sizeof *v);
        float *f = malloc(n_in * sizeof *f);
        const int64_t *a = v ? host_view(x->fg, in, v, n_in * sizeof *v) : NULL;
        int rc = -1;
        if (!f || !v) mgc_exec_fail(x, "out of memory");
        else if (a) {
            for (size_t i = 0; i < n_in; i++)
                f[i] = (float)a[i];
            if (!c_check(x->fg, g, mgc_comm_all_reduce(g, f, f, n_in, MGC_DT_F32, red), what)) {
                for (size_t i = 0; i < n_in; i++)
                    v[i] = (int64_t)f[i];
                if (x->fg->staged) rc = mgc_exec_xcomm_up(x->fg, out, v, n_in * sizeof *v);
                else memcpy(out, v, n_in * sizeof *v), rc = 0;
            }
        }
        free(f), free(v);
        return rc;
    }
    case MGC_POP_ALL_GATHER:
    case MGC_POP_REDUCE_SCATTER: {
        /* the expert rows over ETP carry every group rank's row counts in in[1], in group-rank
         * order (partitioning.md, Mixture of experts): packed by them, dropless
         * (MGC_PCOLL_VARIABLE) or not -- with a capacity factor the buffers are sized for
         * E x capacity rows but hold the kept ones, packed, as the all-to-all's */
        if (op->n_in < 2 || op->in[1] < 0)
            return op->kind == MGC_POP_ALL_GATHER
                       ? mgc_exec_comm_all_gather(x->fg, g, in, out, n_in, dt, what)
                       : mgc_exec_comm_reduce_scatter(x->fg, g, in, out, n_out, dt, what);
        size_t *per = calloc((size_t)size, sizeof *per);
        int rc = per ? var_counts(x, c, op, mb, size, per) : mgc_exec_fail(x, "out of memory");
        size_t bound = op->kind == MGC_POP_ALL_GATHER ? n_out : n_in, tot = 0;
        for (int j = 0; j < size && !rc; j++)
            tot += per[j];
        if (!rc && (tot > bound || per[mgc_comm_rank(g)] > (op->kind == MGC_POP_ALL_GATHER ? n_in : n_out)))
            rc = mgc_exec_fail(x, "'%s': %zu rows' elements exceed the buffers (%zu in, %zu out)",
                       sname(x, op->name), tot, n_in, n_out);
        if (!rc)
            rc = op->kind == MGC_POP_ALL_GATHER ? c_all_gather_v(x->fg, g, in, out, per, dt, what)
                                                : c_reduce_scatter_v(x->fg, g, in, out, per, dt, what);
        free(per);
        return rc;
    }
    case MGC_POP_ALL_TO_ALL: {
        size_t *cnt = calloc((size_t)(2 * size), sizeof *cnt);
        if (!cnt) return mgc_exec_fail(x, "out of memory");
        int rc = 0;
        if (op->n_in > 2) {
            const mgc_plan_tensor *t = &ch->tensors[op->in[0]], *sc = &ch->tensors[op->in[1]],
                                  *rcv = &ch->tensors[op->in[2]];
            int64_t width = t->dim[t->rank - 1];
            size_t ns = (size_t)tnumel(sc), nr = (size_t)tnumel(rcv);
            int64_t *tmp = malloc((ns + nr) * sizeof *tmp);
            const void *sd = taddr(x, c, op->in[1], mb), *rd = taddr(x, c, op->in[2], mb);
            const int64_t *sa = tmp && sd ? host_view(x->fg, sd, tmp, ns * sizeof *tmp) : NULL;
            const int64_t *ra = sa && rd ? host_view(x->fg, rd, tmp + ns, nr * sizeof *tmp) : NULL;
            if (!tmp) rc = mgc_exec_fail(x, "out of memory");
            else if (sa && ra && (a2a_counts(sa, (int64_t)ns, size, width, cnt) ||
                                  a2a_counts(ra, (int64_t)nr, size, width, cnt + size)))
                rc = mgc_exec_fail(x, "'%s': bad row counts", sname(x, op->name));
            else if (!sd || !rd)
                rc = mgc_exec_fail(x, "'%s': row counts not materialised", sname(x, op->name));
            else if (!sa || !ra) rc = -1; /* the download failed: x->err says why */
            free(tmp);
        } else {
            for (int j = 0; j < size; j++)
                cnt[j] = n_in / (size_t)size, cnt[size + j] = n_out / (size_t)size;
        }
        if (!rc) rc = c_all_to_all(x->fg, g, in, out, cnt, dt, what);
        free(cnt);
        return rc;
    }
    case MGC_POP_BROADCAST:
        if (in != out && x->be->iface->copy(x->be, out, in, n_in * mgc_dtype_size(dt)))
            return mgc_exec_fail_backend(x, what);
        return c_broadcast(x->fg, g, out, n_in, dt, what);
    default:
        return mgc_exec_fail(x, "op kind %u is not a collective", op->kind);
    }
}

/* ---- a device communicator ----------------------------------------------------------------
 * mgc_exec_set_device_comm: the collectives on arena memory go to a moves-only communicator
 * (comm.h: NCCL) whose groups mirror the host groups; its reductions fold through the plan's
 * kernel_scratch (between ops: no launcher holds it then) with the backend's fold, queued on
 * the backend's compute queue.  The host communicator keeps the scalars (losses, norms, token
 * counts) and the rank's control flow. */
static int dev_fold(void *ctx, void *dst, const void *src, int parts, size_t count, size_t stride,
                    mgc_dtype dt, mgc_comm_red op) {
    mgc_backend *be = ctx;
    return be->iface->fold(be, dst, src, parts, count, stride, (int)dt, op == MGC_COMM_MAX);
}

int mgc_exec_set_device_comm(mgc_exec *x, mgc_comm *dworld) {
    const mgc_backend_iface *bi = x->be->iface;
    if (!dworld || !mgc_comm_moves_only(dworld))
        return mgc_exec_fail(x,
                     "rank %" PRId64 ": a device communicator must be a moves-only one "
                     "(nccl, or a local world with moves_only)",
                     x->rank);
    if (mgc_comm_size(dworld) != x->grid.world || mgc_comm_world_rank(dworld) != x->rank)
        return mgc_exec_fail(x,
                     "rank %" PRId64 ": the device communicator is rank %d of %d, the plan's "
                     "world is %" PRId64 " ranks",
                     x->rank, mgc_comm_world_rank(dworld), mgc_comm_size(dworld), x->grid.world);
    if (!bi->fold)
        return mgc_exec_fail(x,
                     "rank %" PRId64 ": the %s backend has no fold kernel for a device "
                     "communicator's reductions: run without one",
                     x->rank, bi->name);
    if (x->dworld)
        return mgc_exec_fail(x, "rank %" PRId64 ": a device communicator is set already", x->rank);
    int64_t sb = -1;
    for (int64_t b = 0; b < x->sp->n_buffers && sb < 0; b++)
        if (!strcmp(mgc_plan_strat(x->plan, x->sp->buffers[b].name), "kernel_scratch")) sb = b;
    if (sb < 0)
        return mgc_exec_fail(x,
                     "rank %" PRId64 ": the plan has no kernel_scratch buffer for the device "
                     "communicator's folds: recompile it with this mgc",
                     x->rank);
    mgc_comm_device dv = {.stream = bi->queue ? bi->queue(x->be) : NULL,
                          .fold = dev_fold,
                          .fold_ctx = x->be,
                          .scratch = buf_addr(x, (int32_t)sb),
                          .scratch_bytes = (size_t)x->sp->buffers[sb].bytes};
    /* the groups, as the host ones (collective over dworld) */
    for (int k = 0; k < MGC_GROUP__COUNT; k++) {
        mgc_comm_status s = mgc_comm_group(dworld, &x->grid, (mgc_group_kind)k, &x->dgroup[k]);
        if (s != MGC_COMM_OK)
            return mgc_exec_fail_comm(x, dworld, s, "creating the device process groups");
    }
    if (x->kv_share > 1) {
        mgc_comm_status s =
            mgc_comm_split(x->dgroup[MGC_GROUP_TP], x->co.tp / x->kv_share, x->co.tp, &x->d_kv);
        if (s != MGC_COMM_OK)
            return mgc_exec_fail_comm(x, x->dgroup[MGC_GROUP_TP], s,
                                      "joining a key/value device group");
    }
    static const int n_pairs = MGC_GROUP__COUNT + 1;
    mgc_comm **pairs = calloc(2 * (size_t)n_pairs, sizeof *pairs);
    if (!pairs) return mgc_exec_fail(x, "out of memory");
    for (int k = 0; k < MGC_GROUP__COUNT; k++)
        pairs[k] = x->group[k], pairs[n_pairs + k] = x->dgroup[k];
    pairs[MGC_GROUP__COUNT] = x->kv_comm, pairs[n_pairs + MGC_GROUP__COUNT] = x->d_kv;
    for (int i = 0; i < n_pairs; i++) {
        mgc_comm *d = pairs[n_pairs + i];
        if (d && mgc_comm_set_device(d, &dv) != MGC_COMM_OK) {
            free(pairs);
            return mgc_exec_fail_comm(x, d, MGC_COMM_ERR_INVALID, "setting up a device group");
        }
    }
    /* every transfer goes in line, queued on the compute stream: no reducer or sender thread */
    mgc_exec_reducer_stop(x);
    mgc_exec_sender_stop(x);
    mgc_exec_xcomm_release(x->fg); /* the bulk staging buffer: only small host views need one now */
    x->dworld = dworld;
    x->dev_pairs = pairs;
    x->fg->hosts = pairs, x->fg->devs = pairs + n_pairs, x->fg->n_dev = n_pairs;
    return 0;
}

int mgc_exec_device_comm(const mgc_exec *x) {
    return x->dworld != NULL;
}

void mgc_exec_set_grad_overlap(mgc_exec *x, int on) {
    x->overlap = on != 0;
}

int mgc_exec_grad_overlap(const mgc_exec *x) {
    return x->red != NULL && x->overlap;
}
