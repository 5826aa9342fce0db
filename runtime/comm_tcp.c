/* comm_tcp.c - the TCP transport: one rank per process, launched the torchrun way.
 *
 * Each process is given RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT in its environment
 * (torchrun --no-python sets them, so does a batch script or a Kubernetes job).  No MPI.
 *
 * Rendezvous: rank 0 listens on MASTER_PORT; every other rank opens a listening socket of
 * its own on an ephemeral port, connects to rank 0 and says who it is (rank, world size,
 * port).  Rank 0 checks the ranks (each once, every world size the same) and sends everyone
 * the table of addresses; then rank j connects to every rank 0 < i < j.  One connection per
 * pair of ranks carries all traffic between them, of every communicator.
 *
 * Same contract as the other transports (comm.h, docs/communicators.md):
 *  - every message carries (communicator id, sequence number, phase); a rank takes the
 *    messages of the operation it is in and keeps the others, in arrival order, for the
 *    operation they belong to, so ranks may reach operations of different communicators in
 *    different orders as far as the program allows;
 *  - every collective first exchanges the ranks' descriptors and compares them with group
 *    rank 0's, so a mismatch is reported by every rank naming both operations;
 *  - reductions gather every contribution and fold them in group-rank order with
 *    mgc_comm_reduce_ordered_f32: the same bits as the local and MPI transports;
 *  - every wait polls all connections (reading whatever arrives, so no peer blocks on a
 *    full socket) up to the timeout, and says which peers it was still waiting for;
 *  - a peer that exits or aborts is noticed at once (end of stream, or its abort message)
 *    and poisons the job.
 * Handles are used by one thread at a time in a process (mgc_comm_concurrent is 0), so the
 * executor reduces gradients and sends pipeline activations in line.  Elements travel as
 * the host's bytes: all ranks must share a byte order. */
#define MGC_COMM_INTERNAL
#include "comm.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <time.h>
#include <unistd.h>

#define TCP_MAGIC   0x6d67636bu /* "kcgm" */
#define TCP_VERSION 1u
#define HDR_BYTES   40

enum { T_COLL = 1, T_P2P = 2, T_ABORT = 3 };
enum { PH_DESC = 0, PH_DATA = 1, PH_COUNTS = 2, PH_BAD = 3 };

/* ---- little-endian fields ------------------------------------------------- */

static void st32(unsigned char *p, uint32_t v) {
    for (int i = 0; i < 4; i++)
        p[i] = (unsigned char)(v >> (8 * i));
}
static void st64(unsigned char *p, uint64_t v) {
    for (int i = 0; i < 8; i++)
        p[i] = (unsigned char)(v >> (8 * i));
}
static uint32_t ld32(const unsigned char *p) {
    uint32_t v = 0;
    for (int i = 0; i < 4; i++)
        v |= (uint32_t)p[i] << (8 * i);
    return v;
}
static uint64_t ld64(const unsigned char *p) {
    uint64_t v = 0;
    for (int i = 0; i < 8; i++)
        v |= (uint64_t)p[i] << (8 * i);
    return v;
}

static double now_ms(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec * 1e3 + (double)t.tv_nsec / 1e6;
}

/* ---- the job: connections and received messages ---------------------------- */

typedef struct msg { /* a received message not taken yet */
    struct msg *next;
    uint32_t type, phase;
    uint64_t comm, seq;
    size_t len;
    unsigned char *data;
} msg;

typedef struct peer_link { /* the connection to one world rank */
    int fd;           /* -1: this rank */
    int closed;       /* the peer closed its end: nothing more will come */
    int dirty;        /* a write stopped inside a message (after a failure): no more frames */
    unsigned char hdr[HDR_BYTES];
    size_t hgot;      /* header bytes of the message being read */
    msg *cur;         /* its body, once the header is in */
    size_t bgot;
    msg *head, *tail; /* complete messages, in arrival order */
} peer_link;

typedef struct tcp_job {
    int n, rank;
    peer_link *links;
    int refs;
    pthread_mutex_t mu; /* failed and text: mgc_comm_abort may come from another thread */
    int failed;
    char text[MGC_COMM_ERR_MAX];
} tcp_job;

typedef struct tcp_ctx {
    tcp_job *job;
    uint64_t id; /* the communicator's id, the same on every member */
} tcp_ctx;

static const mgc_comm_iface tcp_iface;

static void job_fail(tcp_job *j, const char *text) {
    pthread_mutex_lock(&j->mu);
    if (!j->failed) {
        j->failed = 1;
        snprintf(j->text, sizeof j->text, "%s", text);
    }
    pthread_mutex_unlock(&j->mu);
}

static int job_poisoned(mgc_comm *c) {
    tcp_job *j = ((tcp_ctx *)c->context)->job;
    char text[MGC_COMM_ERR_MAX];
    pthread_mutex_lock(&j->mu);
    int failed = j->failed;
    if (failed) snprintf(text, sizeof text, "%s", j->text);
    pthread_mutex_unlock(&j->mu);
    if (failed) mgc_comm_fail(c, MGC_COMM_ERR_ABORTED, "released because the job failed: %s", text);
    return failed;
}

/* Reads what the peer has sent, without blocking, into complete messages.  0, or -1 when
 * the stream is broken (closed is set for an orderly end). */
static int link_read(tcp_job *j, int w) {
    peer_link *l = &j->links[w];
    for (;;) {
        unsigned char *dst;
        size_t want;
        if (!l->cur) {
            dst = l->hdr + l->hgot;
            want = HDR_BYTES - l->hgot;
        } else {
            dst = l->cur->data + l->bgot;
            want = l->cur->len - l->bgot;
        }
        ssize_t got = want ? recv(l->fd, dst, want, 0) : 0;
        if (want && got == 0) {
            l->closed = 1;
            return l->hgot || l->cur ? -1 : 0; /* an end inside a message is a broken stream */
        }
        if (got < 0) {
            if (errno == EINTR) continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK) return 0;
            l->closed = 1;
            return -1;
        }
        if (!l->cur) {
            l->hgot += (size_t)got;
            if (l->hgot < HDR_BYTES) continue;
            if (ld32(l->hdr) != TCP_MAGIC) {
                l->closed = 1;
                return -1;
            }
            msg *m = calloc(1, sizeof *m);
            uint64_t len = ld64(l->hdr + 32);
            if (!m || len > (uint64_t)SIZE_MAX - 1 || !(m->data = malloc((size_t)len + 1))) {
                free(m);
                l->closed = 1;
                return -1;
            }
            m->type = ld32(l->hdr + 4);
            m->comm = ld64(l->hdr + 8);
            m->seq = ld64(l->hdr + 16);
            m->phase = ld32(l->hdr + 24);
            m->len = (size_t)len;
            l->cur = m;
            l->bgot = 0;
            l->hgot = 0;
        } else {
            l->bgot += (size_t)got;
        }
        if (l->cur && l->bgot == l->cur->len) { /* complete */
            msg *m = l->cur;
            l->cur = NULL;
            if (m->type == T_ABORT) {
                char t[MGC_COMM_ERR_MAX];
                snprintf(t, sizeof t, "%.*s", (int)(m->len < sizeof t - 1 ? m->len : sizeof t - 1),
                         (const char *)m->data);
                job_fail(j, t);
                free(m->data), free(m);
                continue;
            }
            if (l->tail) l->tail->next = m;
            else l->head = m;
            l->tail = m;
        }
    }
}

/* Takes the first message of world rank w that matches, or NULL. */
static msg *take(peer_link *l, uint32_t type, uint64_t comm, uint64_t seq, uint32_t phase) {
    for (msg **p = &l->head, *prev = NULL; *p; prev = *p, p = &(*p)->next) {
        msg *m = *p;
        if (m->type != type || m->comm != comm || m->seq != seq || m->phase != phase) continue;
        *p = m->next;
        if (l->tail == m) l->tail = prev;
        m->next = NULL;
        return m;
    }
    return NULL;
}

static void msg_free(msg *m) {
    if (m) free(m->data), free(m);
}

/* One step of an operation: messages to send and messages to receive, by group rank. */
typedef struct out_msg {
    int peer; /* group rank */
    uint32_t type, phase;
    uint64_t seq;
    const void *data;
    size_t len;
    unsigned char hdr[HDR_BYTES];
    size_t done; /* bytes of header + data written */
} out_msg;

typedef struct in_msg {
    int peer;
    uint32_t type, phase;
    uint64_t seq;
    msg *got;
} in_msg;

static void out_init(out_msg *o, const mgc_comm *c, int peer, uint32_t type, uint64_t seq,
                     uint32_t phase, const void *data, size_t len) {
    tcp_ctx *x = c->context;
    o->peer = peer, o->type = type, o->phase = phase, o->seq = seq;
    o->data = data, o->len = len, o->done = 0;
    memset(o->hdr, 0, sizeof o->hdr);
    st32(o->hdr, TCP_MAGIC);
    st32(o->hdr + 4, type);
    st64(o->hdr + 8, x->id);
    st64(o->hdr + 16, seq);
    st32(o->hdr + 24, phase);
    st64(o->hdr + 32, (uint64_t)len);
}

/* Writes what the socket takes of o.  0, or -1 when the peer is gone. */
static int out_write(peer_link *l, out_msg *o) {
    while (o->done < HDR_BYTES + o->len) {
        const unsigned char *src;
        size_t want;
        if (o->done < HDR_BYTES) {
            src = o->hdr + o->done;
            want = HDR_BYTES - o->done;
        } else {
            src = (const unsigned char *)o->data + (o->done - HDR_BYTES);
            want = o->len - (o->done - HDR_BYTES);
        }
        ssize_t put = send(l->fd, src, want, MSG_NOSIGNAL);
        if (put < 0) {
            if (errno == EINTR) continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK) return 0;
            return -1;
        }
        l->dirty = 1;
        o->done += (size_t)put;
    }
    l->dirty = 0;
    return 0;
}

/* Runs one step: every send written and every receive taken, or a failure (the job is then
 * poisoned).  what: the operation's text for messages. */
static mgc_comm_status step(mgc_comm *c, out_msg *out, int n_out, in_msg *in, int n_in,
                            const char *what) {
    tcp_ctx *x = c->context;
    tcp_job *j = x->job;
    double deadline = now_ms() + (double)c->timeout_ms;
    struct pollfd *pf = malloc((size_t)j->n * sizeof *pf);
    int *which = malloc((size_t)j->n * sizeof *which);
    mgc_comm_status s = MGC_COMM_OK;
    if (!pf || !which) {
        free(pf), free(which);
        return mgc_comm_fail(c, MGC_COMM_ERR_NOMEM, "%s: out of memory", what);
    }
    for (;;) {
        if (job_poisoned(c)) {
            s = MGC_COMM_ERR_ABORTED;
            break;
        }
        /* receives already here */
        int missing = 0;
        for (int i = 0; i < n_in; i++)
            if (!in[i].got) {
                in[i].got = take(&j->links[c->members[in[i].peer]], in[i].type, x->id, in[i].seq,
                                 in[i].phase);
                missing += !in[i].got;
            }
        int unsent = 0;
        for (int i = 0; i < n_out; i++)
            unsent += out[i].done < HDR_BYTES + out[i].len;
        if (!missing && !unsent) break;
        /* a peer we still need that is gone */
        int gone = -1;
        for (int i = 0; i < n_in && gone < 0; i++)
            if (!in[i].got && j->links[c->members[in[i].peer]].closed) gone = in[i].peer;
        for (int i = 0; i < n_out && gone < 0; i++)
            if (out[i].done < HDR_BYTES + out[i].len && j->links[c->members[out[i].peer]].closed)
                gone = out[i].peer;
        if (gone >= 0) {
            s = mgc_comm_fail(c, MGC_COMM_ERR_ABORTED,
                              "%s: group rank %d (world %d) closed its connection (its process "
                              "exited or failed)",
                              what, gone, c->members[gone]);
            break;
        }
        double left = deadline - now_ms();
        if (left <= 0) {
            char who[400] = "";
            size_t k = 0;
            for (int i = 0; i < n_in && k + 40 < sizeof who; i++)
                if (!in[i].got)
                    k += (size_t)snprintf(who + k, sizeof who - k, "%s group rank %d (world %d)",
                                          k ? "," : "", in[i].peer, c->members[in[i].peer]);
            s = mgc_comm_fail(c, MGC_COMM_ERR_TIMEOUT,
                              "timed out after %lld ms in %s: nothing from%s%s", (long long)c->timeout_ms,
                              what, who[0] ? who : " (sends not taken)", "");
            break;
        }
        /* poll every connection for input (abort messages, other operations' messages),
         * and the ones with sends pending for output */
        int np = 0;
        for (int w = 0; w < j->n; w++) {
            peer_link *l = &j->links[w];
            if (l->fd < 0 || l->closed) continue;
            short ev = POLLIN;
            for (int i = 0; i < n_out; i++)
                if (c->members[out[i].peer] == w && out[i].done < HDR_BYTES + out[i].len) ev |= POLLOUT;
            pf[np].fd = l->fd, pf[np].events = ev, pf[np].revents = 0;
            which[np++] = w;
        }
        int wait = left > 100 ? 100 : (int)left + 1;
        int pr = poll(pf, (nfds_t)np, wait);
        if (pr < 0 && errno != EINTR) {
            s = mgc_comm_fail(c, MGC_COMM_ERR_SYSTEM, "%s: poll: %s", what, strerror(errno));
            break;
        }
        for (int p = 0; p < np && pr > 0; p++) {
            int w = which[p];
            peer_link *l = &j->links[w];
            if (pf[p].revents & (POLLIN | POLLHUP | POLLERR)) {
                if (link_read(j, w) && !l->closed) l->closed = 1;
            }
            if ((pf[p].revents & POLLOUT) && !l->closed)
                for (int i = 0; i < n_out; i++) {
                    if (c->members[out[i].peer] != w || out[i].done >= HDR_BYTES + out[i].len) continue;
                    if (out_write(l, &out[i])) {
                        l->closed = 1;
                        break;
                    }
                    if (out[i].done < HDR_BYTES + out[i].len) break; /* the socket is full */
                }
        }
    }
    free(pf), free(which);
    if (s != MGC_COMM_OK) job_fail(j, c->err); /* keeps the first failure's text */
    return s;
}

static void free_ins(in_msg *in, int n) {
    for (int i = 0; i < n; i++) {
        msg_free(in[i].got);
        in[i].got = NULL;
    }
}

/* ---- descriptors ---------------------------------------------------------- */

static void desc_put(unsigned char *p, const mgc_comm_desc *d) {
    st32(p, (uint32_t)d->kind), st32(p + 4, (uint32_t)d->red), st32(p + 8, (uint32_t)d->dt);
    st32(p + 12, (uint32_t)d->root), st64(p + 16, d->seq), st64(p + 24, d->count);
    st64(p + 32, (uint64_t)d->color), st64(p + 40, (uint64_t)d->key);
}
static void desc_get(const unsigned char *p, mgc_comm_desc *d) {
    d->kind = (int32_t)ld32(p), d->red = (int32_t)ld32(p + 4), d->dt = (int32_t)ld32(p + 8);
    d->root = (int32_t)ld32(p + 12), d->seq = ld64(p + 16), d->count = ld64(p + 24);
    d->color = (int64_t)ld64(p + 32), d->key = (int64_t)ld64(p + 40);
}
#define DESC_BYTES 48

/* Every member's descriptor into all (size), compared with group rank 0's. */
static mgc_comm_status exchange_desc(mgc_comm *c, const mgc_comm_op *op, mgc_comm_desc *all,
                                     char *what, size_t what_size) {
    int n = c->size, me = c->rank;
    unsigned char mine[DESC_BYTES];
    mgc_comm_desc_of(op, &all[me]);
    mgc_comm_desc_format(&all[me], what, what_size);
    desc_put(mine, &all[me]);
    out_msg *out = calloc((size_t)(n > 1 ? n - 1 : 1), sizeof *out);
    in_msg *in = calloc((size_t)(n > 1 ? n - 1 : 1), sizeof *in);
    if (!out || !in) {
        free(out), free(in);
        return mgc_comm_fail(c, MGC_COMM_ERR_NOMEM, "%s: out of memory", what);
    }
    int k = 0;
    for (int r = 0; r < n; r++)
        if (r != me) {
            out_init(&out[k], c, r, T_COLL, op->seq, PH_DESC, mine, DESC_BYTES);
            in[k] = (in_msg){r, T_COLL, PH_DESC, op->seq, NULL};
            k++;
        }
    mgc_comm_status s = step(c, out, k, in, k, what);
    for (int i = 0; i < k && s == MGC_COMM_OK; i++) {
        if (in[i].got->len != DESC_BYTES) {
            s = mgc_comm_fail(c, MGC_COMM_ERR_SYSTEM, "%s: a descriptor of %zu bytes", what,
                              in[i].got->len);
            break;
        }
        desc_get(in[i].got->data, &all[in[i].peer]);
    }
    free_ins(in, k);
    free(out), free(in);
    if (s != MGC_COMM_OK) {
        job_fail(((tcp_ctx *)c->context)->job, c->err);
        return s;
    }
    for (int r = 1; r < n; r++) {
        if (!mgc_comm_desc_differ(&all[0], &all[r])) continue;
        char a[160], b[160];
        mgc_comm_desc_format(&all[0], a, sizeof a);
        mgc_comm_desc_format(&all[r], b, sizeof b);
        s = mgc_comm_fail(c, MGC_COMM_ERR_MISMATCH,
                          "collective mismatch in %s: group rank 0 (world %d) called %s but group "
                          "rank %d (world %d) called %s",
                          c->name, c->members[0], a, r, c->members[r], b);
        job_fail(((tcp_ctx *)c->context)->job, c->err);
        return s;
    }
    return MGC_COMM_OK;
}

/* ---- collectives ---------------------------------------------------------- */

/* Sends block(r) to every other member and receives one message from each; the received
 * messages are in in[] by group rank (in[me] empty). */
static mgc_comm_status all_exchange(mgc_comm *c, uint64_t seq, uint32_t phase, const void *const *blk,
                                    const size_t *len, in_msg *in, const char *what) {
    int n = c->size, me = c->rank;
    out_msg *out = calloc((size_t)n, sizeof *out);
    if (!out) return mgc_comm_fail(c, MGC_COMM_ERR_NOMEM, "%s: out of memory", what);
    int k = 0;
    in_msg *want = calloc((size_t)n, sizeof *want);
    if (!want) {
        free(out);
        return mgc_comm_fail(c, MGC_COMM_ERR_NOMEM, "%s: out of memory", what);
    }
    int m = 0;
    for (int r = 0; r < n; r++) {
        in[r] = (in_msg){r, T_COLL, phase, seq, NULL};
        if (r == me) continue;
        out_init(&out[k++], c, r, T_COLL, seq, phase, blk[r], len[r]);
        want[m++] = in[r];
    }
    mgc_comm_status s = step(c, out, k, want, m, what);
    for (int i = 0; i < m; i++)
        in[want[i].peer].got = want[i].got;
    free(out), free(want);
    return s;
}

static mgc_comm_status expect_len(mgc_comm *c, const msg *m, size_t len, int peer, const char *what) {
    if (m->len == len) return MGC_COMM_OK;
    mgc_comm_status s = mgc_comm_fail(c, MGC_COMM_ERR_MISMATCH,
                                      "%s: group rank %d (world %d) sent %zu bytes, %zu expected",
                                      what, peer, c->members[peer], m->len, len);
    job_fail(((tcp_ctx *)c->context)->job, c->err);
    return s;
}

static mgc_comm_status collective(mgc_comm *c, const mgc_comm_op *op) {
    int n = c->size, me = c->rank;
    size_t es = mgc_dtype_size(op->dt), bytes = op->count * es;
    char what[160];
    mgc_comm_desc *all = calloc((size_t)n, sizeof *all);
    const void **blk = calloc((size_t)n, sizeof *blk);
    size_t *len = calloc((size_t)n, sizeof *len);
    in_msg *in = calloc((size_t)n, sizeof *in);
    const float **parts = calloc((size_t)n, sizeof *parts);
    unsigned char *own = NULL;
    mgc_comm_status s = MGC_COMM_OK;
    if (!all || !blk || !len || !in || !parts) {
        s = mgc_comm_fail(c, MGC_COMM_ERR_NOMEM, "%s: out of memory", mgc_comm_op_name(op->kind));
        goto out;
    }
    if (job_poisoned(c)) {
        s = MGC_COMM_ERR_ABORTED;
        goto out;
    }
    if ((s = exchange_desc(c, op, all, what, sizeof what)) != MGC_COMM_OK) goto out;
    switch (op->kind) {
    case MGC_COMM_OP_ALL_REDUCE:
    case MGC_COMM_OP_REDUCE_SCATTER: {
        int scatter = op->kind == MGC_COMM_OP_REDUCE_SCATTER;
        const unsigned char *src = op->send;
        for (int r = 0; r < n; r++)
            blk[r] = src + (scatter ? (size_t)r * bytes : 0), len[r] = bytes;
        /* this rank's own part, copied: recv may overlap send */
        if (!(own = malloc(bytes + 1))) {
            s = mgc_comm_fail(c, MGC_COMM_ERR_NOMEM, "%s: out of memory", what);
            goto out;
        }
        memcpy(own, blk[me], bytes);
        if ((s = all_exchange(c, op->seq, PH_DATA, blk, len, in, what)) != MGC_COMM_OK) goto out;
        for (int r = 0; r < n; r++) {
            if (r == me) {
                parts[r] = (const float *)(const void *)own;
                continue;
            }
            if ((s = expect_len(c, in[r].got, bytes, r, what)) != MGC_COMM_OK) goto out;
            parts[r] = (const float *)(const void *)in[r].got->data;
        }
        mgc_comm_reduce_ordered_f32(op->recv, parts, n, op->count, op->red);
        break;
    }
    case MGC_COMM_OP_ALL_GATHER: {
        unsigned char *dst = op->recv;
        for (int r = 0; r < n; r++)
            blk[r] = op->send, len[r] = bytes;
        if ((s = all_exchange(c, op->seq, PH_DATA, blk, len, in, what)) != MGC_COMM_OK) goto out;
        if ((const unsigned char *)op->send != dst + (size_t)me * bytes)
            memmove(dst + (size_t)me * bytes, op->send, bytes);
        for (int r = 0; r < n; r++) {
            if (r == me) continue;
            if ((s = expect_len(c, in[r].got, bytes, r, what)) != MGC_COMM_OK) goto out;
            memcpy(dst + (size_t)r * bytes, in[r].got->data, bytes);
        }
        break;
    }
    case MGC_COMM_OP_ALL_TO_ALL_V: {
        /* the counts first: each rank checks what its peers will send it, then all agree on
         * the first rank that found a difference (as the MPI transport) */
        unsigned char *cnt = malloc((size_t)n * 8 + 8);
        uint64_t *from = calloc((size_t)n, sizeof *from); /* what each peer says it sends */
        int32_t mine = -1;
        unsigned char bad[4];
        if (!cnt || !from) {
            free(cnt), free(from);
            s = mgc_comm_fail(c, MGC_COMM_ERR_NOMEM, "%s: out of memory", what);
            goto out;
        }
        for (int r = 0; r < n; r++) {
            st64(cnt + 8 * (size_t)r, (uint64_t)op->send_counts[r]);
            blk[r] = cnt + 8 * (size_t)r, len[r] = 8;
        }
        s = all_exchange(c, op->seq, PH_COUNTS, blk, len, in, what);
        for (int r = 0; r < n && s == MGC_COMM_OK; r++) {
            from[r] = r == me ? (uint64_t)op->send_counts[me]
                              : in[r].got->len == 8 ? ld64(in[r].got->data) : UINT64_MAX;
            if (mine < 0 && from[r] != (uint64_t)op->recv_counts[r]) mine = r;
        }
        for (int r = 0; r < n; r++)
            msg_free(in[r].got), in[r].got = NULL;
        if (s != MGC_COMM_OK) {
            free(cnt), free(from);
            goto out;
        }
        st32(bad, (uint32_t)mine);
        for (int r = 0; r < n; r++)
            blk[r] = bad, len[r] = 4;
        s = all_exchange(c, op->seq, PH_BAD, blk, len, in, what);
        for (int r = 0; r < n && s == MGC_COMM_OK; r++) {
            int32_t b = r == me ? mine : in[r].got->len == 4 ? (int32_t)ld32(in[r].got->data) : -1;
            if (b < 0 || b >= n) continue;
            if (r == me)
                s = mgc_comm_fail(c, MGC_COMM_ERR_MISMATCH,
                                  "%s count mismatch in %s: group rank %d (world %d) sends %llu "
                                  "elements to group rank %d (world %d), which expects %zu",
                                  what, c->name, b, c->members[b], (unsigned long long)from[b], r,
                                  c->members[r], op->recv_counts[b]);
            else
                s = mgc_comm_fail(c, MGC_COMM_ERR_MISMATCH,
                                  "%s count mismatch in %s: group rank %d (world %d) expects a "
                                  "different count from group rank %d (world %d)",
                                  what, c->name, r, c->members[r], b, c->members[b]);
            job_fail(((tcp_ctx *)c->context)->job, c->err);
            break;
        }
        for (int r = 0; r < n; r++)
            msg_free(in[r].got), in[r].got = NULL;
        free(cnt), free(from);
        if (s != MGC_COMM_OK) goto out;
        const unsigned char *src = op->send;
        unsigned char *dst = op->recv;
        for (int r = 0; r < n; r++)
            blk[r] = src + op->send_displs[r] * es, len[r] = op->send_counts[r] * es;
        if ((s = all_exchange(c, op->seq, PH_DATA, blk, len, in, what)) != MGC_COMM_OK) goto out;
        memmove(dst + op->recv_displs[me] * es, src + op->send_displs[me] * es,
                op->send_counts[me] * es);
        for (int r = 0; r < n; r++) {
            if (r == me) continue;
            if ((s = expect_len(c, in[r].got, op->recv_counts[r] * es, r, what)) != MGC_COMM_OK) goto out;
            memcpy(dst + op->recv_displs[r] * es, in[r].got->data, in[r].got->len);
        }
        break;
    }
    case MGC_COMM_OP_BROADCAST: {
        out_msg *o = calloc((size_t)n, sizeof *o);
        if (!o) {
            s = mgc_comm_fail(c, MGC_COMM_ERR_NOMEM, "%s: out of memory", what);
            goto out;
        }
        if (me == op->root) {
            int k = 0;
            for (int r = 0; r < n; r++)
                if (r != me) out_init(&o[k++], c, r, T_COLL, op->seq, PH_DATA, op->recv, bytes);
            s = step(c, o, k, NULL, 0, what);
        } else {
            in[0] = (in_msg){op->root, T_COLL, PH_DATA, op->seq, NULL};
            s = step(c, NULL, 0, in, 1, what);
            if (s == MGC_COMM_OK && (s = expect_len(c, in[0].got, bytes, op->root, what)) == MGC_COMM_OK)
                memcpy(op->recv, in[0].got->data, bytes);
        }
        free(o);
        break;
    }
    default: /* barrier: the descriptor exchange was one */
        break;
    }
out:
    if (in)
        for (int r = 0; r < n; r++)
            msg_free(in[r].got);
    free(all), free(blk), free(len), free(in), free(parts), free(own);
    return s;
}

/* ---- point to point ------------------------------------------------------- */

static mgc_comm_status p2p(mgc_comm *c, const mgc_comm_op *op) {
    mgc_comm_desc mine;
    char what[160];
    if (job_poisoned(c)) return MGC_COMM_ERR_ABORTED;
    mgc_comm_desc_of(op, &mine);
    mgc_comm_desc_format(&mine, what, sizeof what);
    size_t bytes = op->count * mgc_dtype_size(op->dt);
    if (op->kind == MGC_COMM_OP_SEND) {
        /* one message: the descriptor, then the elements */
        unsigned char *buf = malloc(DESC_BYTES + bytes + 1);
        if (!buf) return mgc_comm_fail(c, MGC_COMM_ERR_NOMEM, "%s: out of memory", what);
        desc_put(buf, &mine);
        if (bytes) memcpy(buf + DESC_BYTES, op->send, bytes);
        out_msg o;
        out_init(&o, c, op->root, T_P2P, op->seq, PH_DATA, buf, DESC_BYTES + bytes);
        mgc_comm_status s = step(c, &o, 1, NULL, 0, what);
        free(buf);
        return s;
    }
    in_msg in = {op->root, T_P2P, PH_DATA, op->seq, NULL};
    mgc_comm_status s = step(c, NULL, 0, &in, 1, what);
    if (s != MGC_COMM_OK) return s;
    mgc_comm_desc theirs;
    memset(&theirs, 0, sizeof theirs);
    if (in.got->len >= DESC_BYTES) desc_get(in.got->data, &theirs);
    if (in.got->len != DESC_BYTES + bytes || theirs.count != mine.count || theirs.dt != mine.dt) {
        char sd[160];
        mgc_comm_desc_format(&theirs, sd, sizeof sd);
        s = mgc_comm_fail(c, MGC_COMM_ERR_MISMATCH,
                          "message mismatch in %s: group rank %d (world %d) called %s but group "
                          "rank %d (world %d) called %s",
                          c->name, op->root, c->members[op->root], sd, c->rank, c->world_rank, what);
        job_fail(((tcp_ctx *)c->context)->job, c->err);
    } else if (bytes) {
        memcpy(op->recv, in.got->data + DESC_BYTES, bytes);
    }
    msg_free(in.got);
    return s;
}

/* ---- communicators -------------------------------------------------------- */

static uint64_t mix(uint64_t h, uint64_t v) {
    h ^= v + 0x9E3779B97F4A7C15ull + (h << 6) + (h >> 2);
    h *= 0xff51afd7ed558ccdull;
    return h ^ (h >> 33);
}

static mgc_comm_status wrap(tcp_job *job, uint64_t id, int rank, int size, const int *members,
                            int64_t timeout_ms, const char *name, mgc_comm **out) {
    mgc_comm *c = calloc(1, sizeof *c);
    tcp_ctx *x = calloc(1, sizeof *x);
    if (!c || !x) {
        free(c), free(x);
        return MGC_COMM_ERR_NOMEM;
    }
    x->job = job;
    x->id = id;
    mgc_comm_status s = mgc_comm_init_base(c, &tcp_iface, x, rank, size, job->rank, members,
                                           timeout_ms, name);
    if (s != MGC_COMM_OK) {
        free(c), free(x);
        return s;
    }
    job->refs++;
    *out = c;
    return MGC_COMM_OK;
}

static mgc_comm_status tcp_split(mgc_comm *c, const mgc_comm_op *op, mgc_comm **out) {
    tcp_ctx *x = c->context;
    int n = c->size;
    char what[160];
    *out = NULL;
    if (job_poisoned(c)) return MGC_COMM_ERR_ABORTED;
    mgc_comm_desc *all = calloc((size_t)n, sizeof *all);
    int *members = calloc((size_t)n, sizeof *members), *order = calloc((size_t)n, sizeof *order);
    mgc_comm_status s = MGC_COMM_OK;
    if (!all || !members || !order) {
        s = mgc_comm_fail(c, MGC_COMM_ERR_NOMEM, "split: out of memory");
        goto out;
    }
    /* every member's colour and key come with the descriptors */
    if ((s = exchange_desc(c, op, all, what, sizeof what)) != MGC_COMM_OK) goto out;
    if (op->color < 0) goto out;
    int m = 0;
    for (int r = 0; r < n; r++)
        if (all[r].color == op->color) order[m++] = r;
    /* by key, then by rank in the parent (MPI_Comm_split's order) */
    for (int a = 1; a < m; a++)
        for (int b = a; b > 0; b--) {
            int p = order[b - 1], q = order[b];
            if (all[p].key < all[q].key || (all[p].key == all[q].key && p < q)) break;
            order[b - 1] = q, order[b] = p;
        }
    int rank = -1;
    for (int i = 0; i < m; i++) {
        members[i] = c->members[order[i]];
        if (order[i] == c->rank) rank = i;
    }
    uint64_t id = mix(mix(x->id, op->seq), (uint64_t)op->color);
    if ((s = wrap(x->job, id, rank, m, members, c->timeout_ms, "split", out)) != MGC_COMM_OK)
        mgc_comm_fail(c, s, "split: %s", mgc_comm_status_name(s));
out:
    free(all), free(members), free(order);
    return s;
}

static mgc_comm_status tcp_run(mgc_comm *c, const mgc_comm_op *op) {
    if (op->kind == MGC_COMM_OP_SEND || op->kind == MGC_COMM_OP_RECV) return p2p(c, op);
    return collective(c, op);
}

/* Tells every peer (best effort, within a second) and poisons the job. */
static void tcp_abort(mgc_comm *c, const char *reason) {
    tcp_ctx *x = c->context;
    tcp_job *j = x->job;
    mgc_comm_fail(c, MGC_COMM_ERR_ABORTED, "aborted: %s", reason);
    char text[MGC_COMM_ERR_MAX];
    snprintf(text, sizeof text, "world rank %d aborted: %s", j->rank, reason);
    job_fail(j, text);
    double deadline = now_ms() + 1000;
    size_t len = strlen(text);
    for (int w = 0; w < j->n; w++) {
        peer_link *l = &j->links[w];
        if (l->fd < 0 || l->closed || l->dirty) continue;
        out_msg o;
        out_init(&o, c, 0, T_ABORT, 0, 0, text, len);
        while (o.done < HDR_BYTES + len && now_ms() < deadline) {
            if (out_write(l, &o)) break;
            if (o.done < HDR_BYTES + len) {
                struct pollfd p = {l->fd, POLLOUT, 0};
                poll(&p, 1, 10);
            }
        }
    }
}

static void job_free(tcp_job *j) {
    /* an orderly end: say we are done, and read what is still coming so the peers' last
     * messages are not lost to a reset (briefly: a peer may still be busy) */
    double deadline = now_ms() + 2000;
    for (int w = 0; w < j->n; w++)
        if (j->links[w].fd >= 0) shutdown(j->links[w].fd, SHUT_WR);
    for (int w = 0; w < j->n; w++) {
        peer_link *l = &j->links[w];
        if (l->fd < 0) continue;
        unsigned char sink[4096];
        while (!l->closed && now_ms() < deadline) {
            struct pollfd p = {l->fd, POLLIN, 0};
            if (poll(&p, 1, 50) <= 0) continue;
            ssize_t got = recv(l->fd, sink, sizeof sink, 0);
            if (got == 0 || (got < 0 && errno != EINTR && errno != EAGAIN && errno != EWOULDBLOCK))
                break;
        }
        close(l->fd);
        msg *m = l->head;
        while (m) {
            msg *nx = m->next;
            msg_free(m);
            m = nx;
        }
        msg_free(l->cur);
    }
    pthread_mutex_destroy(&j->mu);
    free(j->links);
    free(j);
}

static void tcp_free(mgc_comm *c) {
    tcp_ctx *x = c->context;
    tcp_job *j = x->job;
    mgc_comm_free_base(c);
    free(x);
    free(c);
    if (--j->refs == 0) job_free(j);
}

static const mgc_comm_iface tcp_iface = {
    .name = "tcp",
    .run = tcp_run,
    .split = tcp_split,
    .abort = tcp_abort,
    .free = tcp_free,
};

/* ---- rendezvous ------------------------------------------------------------ */

static int env_int(const char *name, long long lo, long long hi, long long *v, char *err, size_t errsz) {
    const char *s = getenv(name);
    char *end = NULL;
    if (!s || !*s) {
        snprintf(err, errsz, "%s is not set (the TCP launch needs RANK, WORLD_SIZE, MASTER_ADDR and "
                             "MASTER_PORT)", name);
        return -1;
    }
    errno = 0;
    long long x = strtoll(s, &end, 10);
    if (errno || !end || *end || x < lo || x > hi) {
        snprintf(err, errsz, "%s=%s is not an integer from %lld to %lld", name, s, lo, hi);
        return -1;
    }
    *v = x;
    return 0;
}

/* Blocking full read or write on fd until the deadline: 0, or -1. */
static int io_full(int fd, void *buf, size_t len, int writing, double deadline) {
    unsigned char *p = buf;
    size_t done = 0;
    while (done < len) {
        double left = deadline - now_ms();
        if (left <= 0) return -1;
        struct pollfd pf = {fd, writing ? POLLOUT : POLLIN, 0};
        int pr = poll(&pf, 1, left > 1000 ? 1000 : (int)left + 1);
        if (pr < 0 && errno != EINTR) return -1;
        if (pr <= 0) continue;
        ssize_t k = writing ? send(fd, p + done, len - done, MSG_NOSIGNAL) : recv(fd, p + done, len - done, 0);
        if (k == 0 && !writing) return -1;
        if (k < 0) {
            if (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK) continue;
            return -1;
        }
        done += (size_t)k;
    }
    return 0;
}

static void tune(int fd) {
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
}

static int listen_on(uint16_t port, uint16_t *bound, char *err, size_t errsz) {
    int fd = socket(AF_INET, SOCK_STREAM, 0), one = 1;
    if (fd < 0) {
        snprintf(err, errsz, "socket: %s", strerror(errno));
        return -1;
    }
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    struct sockaddr_in a;
    memset(&a, 0, sizeof a);
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_ANY);
    a.sin_port = htons(port);
    if (bind(fd, (struct sockaddr *)&a, sizeof a) || listen(fd, SOMAXCONN)) {
        snprintf(err, errsz, "cannot listen on port %u: %s", (unsigned)port, strerror(errno));
        close(fd);
        return -1;
    }
    socklen_t al = sizeof a;
    getsockname(fd, (struct sockaddr *)&a, &al);
    *bound = ntohs(a.sin_port);
    fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
    return fd;
}

/* Connects to addr:port, retrying while nobody listens yet, until the deadline. */
static int connect_to(uint32_t addr_be, uint16_t port, double deadline) {
    for (;;) {
        int fd = socket(AF_INET, SOCK_STREAM, 0);
        if (fd < 0) return -1;
        struct sockaddr_in a;
        memset(&a, 0, sizeof a);
        a.sin_family = AF_INET;
        a.sin_addr.s_addr = addr_be;
        a.sin_port = htons(port);
        if (connect(fd, (struct sockaddr *)&a, sizeof a) == 0) return fd;
        int e = errno;
        close(fd);
        if ((e != ECONNREFUSED && e != ETIMEDOUT && e != EHOSTUNREACH && e != ENETUNREACH &&
             e != EINTR && e != EAGAIN) ||
            now_ms() > deadline)
            return -1;
        struct timespec ts = {0, 50 * 1000000L};
        nanosleep(&ts, NULL);
    }
}

static int accept_one(int lfd, double deadline, uint32_t *peer_be) {
    while (now_ms() < deadline) {
        struct pollfd pf = {lfd, POLLIN, 0};
        if (poll(&pf, 1, 100) <= 0) continue;
        struct sockaddr_in a;
        socklen_t al = sizeof a;
        int fd = accept(lfd, (struct sockaddr *)&a, &al);
        if (fd >= 0) {
            fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK);
            if (peer_be) *peer_be = a.sin_addr.s_addr;
            return fd;
        }
    }
    return -1;
}

int mgc_comm_tcp_env(void) {
    return getenv("RANK") && getenv("WORLD_SIZE") && getenv("MASTER_ADDR") && getenv("MASTER_PORT");
}

#define HELLO_BYTES 20 /* magic, version, rank, world size, listening port */

mgc_comm_status mgc_comm_tcp_world_create(const mgc_comm_config *cfg, mgc_comm **world, char *err,
                                          size_t errsz) {
    char dummy[1];
    if (!err || !errsz) err = dummy, errsz = sizeof dummy;
    err[0] = 0;
    if (!world) return MGC_COMM_ERR_INVALID;
    *world = NULL;
    int64_t timeout_ms = 0;
    if (cfg && cfg->size >= offsetof(mgc_comm_config, timeout_ms) + sizeof cfg->timeout_ms)
        timeout_ms = cfg->timeout_ms;
    if (timeout_ms <= 0) timeout_ms = MGC_COMM_DEFAULT_TIMEOUT_MS;
    long long rank, size, port;
    char e[512];
    if (env_int("WORLD_SIZE", 1, 65536, &size, e, sizeof e) || env_int("RANK", 0, size - 1, &rank, e, sizeof e) ||
        env_int("MASTER_PORT", 1, 65535, &port, e, sizeof e)) {
        snprintf(err, errsz, "tcp world: %s", e);
        return MGC_COMM_ERR_INVALID;
    }
    const char *host = getenv("MASTER_ADDR");
    if (!host || !*host) {
        snprintf(err, errsz, "tcp world: MASTER_ADDR is not set (the host of rank 0)");
        return MGC_COMM_ERR_INVALID;
    }
    struct addrinfo hints, *ai = NULL;
    memset(&hints, 0, sizeof hints);
    hints.ai_family = AF_INET;
    hints.ai_socktype = SOCK_STREAM;
    int gai = getaddrinfo(host, NULL, &hints, &ai);
    if (gai || !ai) {
        snprintf(err, errsz, "tcp world: MASTER_ADDR=%s: %s (give rank 0's host name or IPv4 address)",
                 host, gai ? gai_strerror(gai) : "no address");
        if (ai) freeaddrinfo(ai);
        return MGC_COMM_ERR_INVALID;
    }
    uint32_t master_be = ((struct sockaddr_in *)ai->ai_addr)->sin_addr.s_addr;
    freeaddrinfo(ai);

    int n = (int)size, me = (int)rank;
    tcp_job *j = calloc(1, sizeof *j);
    uint32_t *addr = calloc((size_t)n, sizeof *addr);
    uint16_t *ports = calloc((size_t)n, sizeof *ports);
    int lfd = -1;
    mgc_comm_status s = MGC_COMM_ERR_SYSTEM;
    if (!j || !addr || !ports || !(j->links = calloc((size_t)n, sizeof *j->links))) {
        snprintf(err, errsz, "tcp world: out of memory");
        s = MGC_COMM_ERR_NOMEM;
        goto fail;
    }
    pthread_mutex_init(&j->mu, NULL);
    j->n = n, j->rank = me;
    for (int w = 0; w < n; w++)
        j->links[w].fd = -1;
    double deadline = now_ms() + (double)timeout_ms;
    uint16_t myport = 0;
    if ((lfd = listen_on(me == 0 ? (uint16_t)port : 0, &myport, e, sizeof e)) < 0) {
        snprintf(err, errsz, "tcp world: rank %d: %s%s", me, e,
                 me == 0 ? " (MASTER_PORT is taken: choose another)" : "");
        goto fail;
    }
    unsigned char hello[HELLO_BYTES];
    if (me == 0) {
        /* everyone says who they are; then everyone gets the table */
        int got = 0;
        while (got < n - 1) {
            uint32_t peer_be = 0;
            int fd = accept_one(lfd, deadline, &peer_be);
            if (fd < 0) {
                snprintf(err, errsz, "tcp world: rank 0 waited %lld ms on port %lld for %d of the %d "
                                     "other ranks: start all WORLD_SIZE=%d processes with the same "
                                     "MASTER_ADDR and MASTER_PORT",
                         (long long)timeout_ms, port, n - 1 - got, n - 1, n);
                s = MGC_COMM_ERR_TIMEOUT;
                goto fail;
            }
            if (io_full(fd, hello, sizeof hello, 0, deadline) || ld32(hello) != TCP_MAGIC) {
                close(fd); /* not one of ours (a port scan, a stale client): ignore it */
                continue;
            }
            int r = (int)ld32(hello + 8), ws = (int)ld32(hello + 12);
            if (ld32(hello + 4) != TCP_VERSION) {
                snprintf(err, errsz, "tcp world: rank %d runs another mgc-run release (TCP protocol "
                                     "%u, this one %u): start every rank from the same build",
                         r, ld32(hello + 4), TCP_VERSION);
                close(fd);
                goto fail;
            }
            if (ws != n || r <= 0 || r >= n || j->links[r].fd >= 0) {
                snprintf(err, errsz,
                         "tcp world: rank 0 (WORLD_SIZE=%d) was joined by a process with RANK=%d "
                         "and WORLD_SIZE=%d%s: give every process the same WORLD_SIZE and each a "
                         "different RANK from 0 to %d",
                         n, r, ws, r > 0 && r < n && j->links[r].fd >= 0 ? " a second time" : "",
                         n - 1);
                close(fd);
                goto fail;
            }
            j->links[r].fd = fd;
            addr[r] = peer_be;
            ports[r] = (uint16_t)ld32(hello + 16);
            got++;
        }
        unsigned char *table = malloc((size_t)n * 6 + 1);
        if (!table) goto fail;
        for (int w = 0; w < n; w++) {
            memcpy(table + 6 * w, &addr[w], 4);
            table[6 * w + 4] = (unsigned char)(ports[w] & 0xff);
            table[6 * w + 5] = (unsigned char)(ports[w] >> 8);
        }
        for (int w = 1; w < n; w++)
            if (io_full(j->links[w].fd, table, (size_t)n * 6, 1, deadline)) {
                snprintf(err, errsz, "tcp world: rank 0 could not send the rank table to rank %d", w);
                free(table);
                goto fail;
            }
        free(table);
    } else {
        int fd = connect_to(master_be, (uint16_t)port, deadline);
        if (fd < 0) {
            snprintf(err, errsz, "tcp world: rank %d could not reach rank 0 at %s:%lld within %lld ms: "
                                 "is rank 0 running, and MASTER_ADDR its address?",
                     me, host, port, (long long)timeout_ms);
            s = MGC_COMM_ERR_TIMEOUT;
            goto fail;
        }
        j->links[0].fd = fd;
        st32(hello, TCP_MAGIC), st32(hello + 4, TCP_VERSION), st32(hello + 8, (uint32_t)me);
        st32(hello + 12, (uint32_t)n), st32(hello + 16, myport);
        unsigned char *table = malloc((size_t)n * 6 + 1);
        if (!table || io_full(fd, hello, sizeof hello, 1, deadline) ||
            io_full(fd, table, (size_t)n * 6, 0, deadline)) {
            snprintf(err, errsz, "tcp world: rank %d joined rank 0 but got no rank table (rank 0 "
                                 "refused this process or failed: see its error)", me);
            free(table);
            goto fail;
        }
        for (int w = 0; w < n; w++) {
            memcpy(&addr[w], table + 6 * w, 4);
            ports[w] = (uint16_t)(table[6 * w + 4] | (table[6 * w + 5] << 8));
        }
        free(table);
        /* the ranks between: this rank connects to those below it, and accepts those above */
        for (int w = 1; w < me; w++) {
            int cfd = connect_to(addr[w], ports[w], deadline);
            unsigned char h[8];
            st32(h, TCP_MAGIC), st32(h + 4, (uint32_t)me);
            if (cfd < 0 || io_full(cfd, h, sizeof h, 1, deadline)) {
                if (cfd >= 0) close(cfd);
                snprintf(err, errsz, "tcp world: rank %d could not connect to rank %d", me, w);
                goto fail;
            }
            j->links[w].fd = cfd;
        }
        for (int k = me + 1; k < n; k++) {
            int afd = accept_one(lfd, deadline, NULL);
            unsigned char h[8];
            if (afd < 0 || io_full(afd, h, sizeof h, 0, deadline) || ld32(h) != TCP_MAGIC) {
                if (afd >= 0) close(afd);
                snprintf(err, errsz, "tcp world: rank %d waited for the ranks above it in vain", me);
                s = MGC_COMM_ERR_TIMEOUT;
                goto fail;
            }
            int r = (int)ld32(h + 4);
            if (r <= me || r >= n || j->links[r].fd >= 0) {
                close(afd);
                snprintf(err, errsz, "tcp world: rank %d was joined by an unexpected rank %d", me, r);
                goto fail;
            }
            j->links[r].fd = afd;
        }
    }
    close(lfd);
    lfd = -1;
    for (int w = 0; w < n; w++)
        if (j->links[w].fd >= 0) tune(j->links[w].fd);
    int *members = malloc((size_t)n * sizeof *members);
    if (!members) goto fail;
    for (int w = 0; w < n; w++)
        members[w] = w;
    s = wrap(j, 1, me, n, members, timeout_ms, "world", world);
    free(members);
    if (s != MGC_COMM_OK) {
        snprintf(err, errsz, "tcp world: %s", mgc_comm_status_name(s));
        goto fail;
    }
    free(addr), free(ports);
    return MGC_COMM_OK;
fail:
    if (s == MGC_COMM_OK) s = MGC_COMM_ERR_SYSTEM;
    if (lfd >= 0) close(lfd);
    if (j && j->links) {
        for (int w = 0; w < n; w++)
            if (j->links[w].fd >= 0) close(j->links[w].fd);
        pthread_mutex_destroy(&j->mu);
        free(j->links);
    }
    free(j), free(addr), free(ports);
    return s;
}
