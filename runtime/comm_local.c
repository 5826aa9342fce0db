/* comm_local.c - the local transport: ranks are threads of one process.
 *
 * All communicators derived from one world share a "job": one mutex and one
 * condition variable (CLOCK_MONOTONIC, so timeouts ignore wall-clock jumps)
 * plus the job's failure state.  One lock for the whole job is deliberate:
 * this transport is the reference for tests and CI with a handful of ranks,
 * data is copied and reduced outside the lock, and a single condition
 * variable makes "wake every waiter when anything fails" trivially right.
 *
 * A communicator ("team") has one slot per rank.  A collective is two
 * rendezvous on the slots:
 *   1. arrive: a rank publishes its op (buffers, counts) and waits until every
 *      rank has arrived at the same sequence number; then every rank compares
 *      the descriptors (all see the same ones, so all agree on a mismatch);
 *   2. compute outside the lock: each rank reads the peers' send buffers in
 *      group-rank order and writes only its own output (zero-copy; in-place
 *      operations go through a scratch buffer allocated before arriving, so
 *      nothing can fail after step 1);
 *   3. done: a rank may return only when every rank has finished reading its
 *      buffers.
 * A rank that gives up in step 1 (failure elsewhere, timeout, a freed peer)
 * retracts its arrival under the lock, so no peer can start reading buffers
 * it is about to return; once all have arrived every rank completes.
 *
 * Point-to-point: send copies the message into the (src, dst) queue of the
 * team and returns; recv waits for the head of its queue (FIFO per pair). */
#define MGC_COMM_INTERNAL
#include "comm.h"

#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* What a world rank is doing in the job's communicators, for a timeout's report: the calls it
 * is blocked in now, on any of its threads (the executor's, the gradient reducer's, the
 * sender's), and the last it left, with when. */
#define BUSY_MAX 4
typedef struct busy_call {
    const void *team;             /* the call's team */
    char comm[MGC_COMM_NAME_MAX]; /* its communicator's name */
    mgc_comm_desc desc;
    double t; /* when the call began (or, for the last call, ended): monotonic seconds */
} busy_call;
typedef struct rank_log {
    busy_call now[BUSY_MAX];
    uint32_t used; /* bit i: now[i] in use */
    int left_any;  /* last holds a call */
    busy_call last;
} rank_log;

typedef struct job {
    pthread_mutex_t mu;
    pthread_cond_t cv;          /* broadcast on every state change */
    int teams;                  /* live teams; the last one frees the job */
    int failed;                 /* poisoned: every wait and call returns ABORTED */
    char msg[MGC_COMM_ERR_MAX]; /* the first failure */
    int world;                  /* world ranks */
    rank_log *log;              /* (world) */
} job;

typedef struct msg {
    struct msg *next;
    uint64_t seq;       /* per-link message number */
    mgc_comm_desc desc; /* the send, for mismatch reports */
    size_t bytes;
    unsigned char data[]; /* (bytes) */
} msg;

typedef struct slot {
    uint64_t arrived;    /* 1 + seq of the collective this rank arrived at; 0 none */
    uint64_t done;       /* 1 + seq of the collective it finished reading for */
    mgc_comm_op op;      /* the arrived op: peers read its buffers and counts */
    mgc_comm_desc desc;  /* its descriptor */
    mgc_comm_desc cur;   /* what the rank is blocked in now (diagnosis) */
    int in_call;         /* 1 while blocked in a call of this team */
    int left;            /* the handle was freed */
    mgc_comm *split_out; /* split: this rank's new handle (NULL: no group) */
} slot;

typedef struct team {
    job *job;
    int size;
    int live;             /* handles not freed yet */
    slot *slots;          /* (size) */
    msg **qhead, **qtail; /* (size * size), index src * size + dst */
    uint64_t split_made;  /* 1 + seq of the last split whose teams exist */
} team;

static const mgc_comm_iface local_iface;

/* ---- time ----------------------------------------------------------------- */

static struct timespec deadline_after(int64_t ms) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    t.tv_sec += (time_t)(ms / 1000);
    t.tv_nsec += (long)(ms % 1000) * 1000000L;
    if (t.tv_nsec >= 1000000000L) {
        t.tv_sec++;
        t.tv_nsec -= 1000000000L;
    }
    return t;
}

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* 0 woken (or spuriously), ETIMEDOUT past the deadline. */
static int wait_until(job *j, const struct timespec *dl) {
    int rc = pthread_cond_timedwait(&j->cv, &j->mu, dl);
    return rc == ETIMEDOUT ? ETIMEDOUT : 0;
}

/* ---- teams and jobs ------------------------------------------------------- */

static void team_destroy(team *t) {
    if (!t) return;
    if (t->qhead)
        for (int i = 0; i < t->size * t->size; i++)
            for (msg *m = t->qhead[i], *n; m; m = n) {
                n = m->next;
                free(m);
            }
    free(t->qhead);
    free(t->qtail);
    free(t->slots);
    free(t);
}

static team *team_new(job *j, int size) {
    team *t = calloc(1, sizeof *t);
    if (!t) return NULL;
    t->job = j;
    t->size = size;
    t->live = size;
    t->slots = calloc((size_t)size, sizeof *t->slots);
    t->qhead = calloc((size_t)size * (size_t)size, sizeof *t->qhead);
    t->qtail = calloc((size_t)size * (size_t)size, sizeof *t->qtail);
    if (!t->slots || !t->qhead || !t->qtail) {
        team_destroy(t);
        return NULL;
    }
    return t;
}

static void handle_destroy(mgc_comm *c) {
    if (!c) return;
    mgc_comm_free_base(c);
    free(c);
}

/* n handles on team t with world ranks members[0..n-1]; under the job lock
 * for splits (allocation only, no waiting). */
static mgc_comm_status make_handles(team *t, const int *members, int64_t timeout_ms,
                                    const char *name, mgc_comm **out) {
    for (int r = 0; r < t->size; r++) {
        out[r] = calloc(1, sizeof *out[r]);
        if (!out[r] || mgc_comm_init_base(out[r], &local_iface, t, r, t->size, members[r], members,
                                          timeout_ms, name) != MGC_COMM_OK) {
            free(out[r]);
            for (int q = 0; q < r; q++)
                handle_destroy(out[q]);
            return MGC_COMM_ERR_NOMEM;
        }
    }
    return MGC_COMM_OK;
}

/* Poison the job with the first failure (call with the lock held). */
static void job_fail(job *j, const char *text) {
    if (!j->failed) {
        j->failed = 1;
        snprintf(j->msg, sizeof j->msg, "%s", text);
    }
    pthread_cond_broadcast(&j->cv);
}

static mgc_comm_status aborted(mgc_comm *c) {
    return mgc_comm_fail(c, MGC_COMM_ERR_ABORTED, "released because the job failed: %s",
                         ((team *)c->context)->job->msg);
}

mgc_comm_status mgc_comm_local_world_create(int n, const mgc_comm_config *cfg, mgc_comm **ranks,
                                            char *err, size_t err_size) {
    char dummy[1];
    if (!err || !err_size) {
        err = dummy;
        err_size = sizeof dummy;
    }
    err[0] = '\0';
    if (n < 1 || n > 4096 || !ranks) {
        snprintf(err, err_size, "local world: %d ranks (need 1..4096 and a ranks array)", n);
        return MGC_COMM_ERR_INVALID;
    }
    int64_t timeout_ms = 0;
    if (cfg && cfg->size >= offsetof(mgc_comm_config, timeout_ms) + sizeof cfg->timeout_ms)
        timeout_ms = cfg->timeout_ms;
    int moves_only =
        cfg && cfg->size >= offsetof(mgc_comm_config, moves_only) + sizeof cfg->moves_only
            ? cfg->moves_only != 0
            : 0;
    job *j = calloc(1, sizeof *j);
    team *t = NULL;
    int *members = malloc((size_t)n * sizeof *members);
    int mu_ok = 0, cv_ok = 0;
    mgc_comm_status status;
    pthread_condattr_t ca;
    if (!j || !members || !(j->log = calloc((size_t)n, sizeof *j->log))) goto nomem;
    j->world = n;
    if (pthread_mutex_init(&j->mu, NULL) != 0) goto sys;
    mu_ok = 1;
    if (pthread_condattr_init(&ca) != 0) goto sys;
    int rc = pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    if (rc == 0) rc = pthread_cond_init(&j->cv, &ca);
    pthread_condattr_destroy(&ca);
    if (rc != 0) goto sys;
    cv_ok = 1;
    j->teams = 1;
    if (!(t = team_new(j, n))) goto nomem;
    for (int r = 0; r < n; r++)
        members[r] = r;
    if (make_handles(t, members, timeout_ms, "world", ranks) != MGC_COMM_OK) goto nomem;
    for (int r = 0; r < n; r++)
        ranks[r]->moves_only = moves_only;
    free(members);
    return MGC_COMM_OK;
nomem:
    snprintf(err, err_size, "local world: out of memory for %d ranks", n);
    status = MGC_COMM_ERR_NOMEM;
    goto fail;
sys:
    snprintf(err, err_size, "local world: pthread initialisation failed");
    status = MGC_COMM_ERR_SYSTEM;
fail:
    team_destroy(t);
    if (cv_ok) pthread_cond_destroy(&j->cv);
    if (mu_ok) pthread_mutex_destroy(&j->mu);
    if (j) free(j->log);
    free(j);
    free(members);
    for (int r = 0; r < n; r++)
        ranks[r] = NULL;
    return status;
}

static void local_free(mgc_comm *c) {
    team *t = c->context;
    job *j = t->job;
    int free_team = 0, free_job = 0;
    pthread_mutex_lock(&j->mu);
    t->slots[c->rank].left = 1;
    if (--t->live == 0) {
        free_team = 1;
        free_job = --j->teams == 0;
    }
    pthread_cond_broadcast(&j->cv);
    pthread_mutex_unlock(&j->mu);
    handle_destroy(c);
    if (free_team) team_destroy(t);
    if (free_job) {
        pthread_cond_destroy(&j->cv);
        pthread_mutex_destroy(&j->mu);
        free(j->log);
        free(j);
    }
}

static void local_abort(mgc_comm *c, const char *reason) {
    job *j = ((team *)c->context)->job;
    char text[MGC_COMM_ERR_MAX];
    snprintf(text, sizeof text, "%s rank %d (world %d) aborted: %s", c->name, c->rank,
             c->world_rank, reason);
    pthread_mutex_lock(&j->mu);
    job_fail(j, text);
    pthread_mutex_unlock(&j->mu);
    mgc_comm_fail(c, MGC_COMM_ERR_ABORTED, "aborted: %s", reason);
}

/* ---- diagnosis ------------------------------------------------------------ */

/* c's rank begins a call of descriptor d (call with the lock held); the slot to pass to
 * busy_leave, -1 when the rank has BUSY_MAX calls going already (not recorded). */
static int busy_enter(job *j, const mgc_comm *c, const mgc_comm_desc *d) {
    if (c->world_rank < 0 || c->world_rank >= j->world) return -1;
    rank_log *l = &j->log[c->world_rank];
    for (int i = 0; i < BUSY_MAX; i++)
        if (!(l->used & (1u << i))) {
            l->used |= 1u << i;
            l->now[i].team = c->context;
            snprintf(l->now[i].comm, sizeof l->now[i].comm, "%s", c->name);
            l->now[i].desc = *d;
            l->now[i].t = now_s();
            return i;
        }
    return -1;
}

/* ... and ends it (call with the lock held). */
static void busy_leave(job *j, const mgc_comm *c, int i) {
    if (i < 0) return;
    rank_log *l = &j->log[c->world_rank];
    l->used &= ~(1u << i);
    l->last = l->now[i];
    l->last.t = now_s();
    l->left_any = 1;
}

/* Where world rank w is in the job besides team t: ", and is blocked in dp#0 all_reduce #5 (...)
 * for 2.1 s" for each call it is in (but one of t's, which the caller describes), or ", and in
 * no call for 118.2 s, since it left tp#0 all_reduce #11 (...)": its thread computes, or waits
 * for something else (call with the lock held). */
static void describe_elsewhere(const team *t, int w, char *buf, size_t size) {
    buf[0] = '\0';
    if (w < 0 || w >= t->job->world) return;
    const rank_log *l = &t->job->log[w];
    double now = now_s();
    size_t used = 0;
    int calls = 0;
    for (int i = 0; i < BUSY_MAX && used + 2 < size; i++) {
        if (!(l->used & (1u << i))) continue;
        calls++;
        if (l->now[i].team == t) continue;
        char d[160];
        mgc_comm_desc_format(&l->now[i].desc, d, sizeof d);
        used += (size_t)snprintf(buf + used, size - used, "%s is blocked in %s %s for %.1f s",
                                 used ? " and" : ", and", l->now[i].comm, d, now - l->now[i].t);
    }
    if (calls || used + 2 >= size) return;
    if (l->left_any && l->last.team == t) {
        snprintf(buf, size, ", and in no call since, for %.1f s", now - l->last.t);
    } else if (l->left_any) {
        char d[160];
        mgc_comm_desc_format(&l->last.desc, d, sizeof d);
        snprintf(buf, size, ", and in no call for %.1f s, since it left %s %s", now - l->last.t,
                 l->last.comm, d);
    } else {
        snprintf(buf, size, ", and in no call of any communicator yet");
    }
}

/* "group rank 2 (world 6) is blocked in recv #0 (...)" / "... last called ..." */
static void describe_rank(const mgc_comm *c, const slot *s, int r, char *buf, size_t size) {
    char d[160], more[640];
    if (s->left) {
        snprintf(buf, size, "group rank %d (world %d) freed its communicator", r, c->members[r]);
        return;
    }
    describe_elsewhere(c->context, c->members[r], more, sizeof more);
    if (s->in_call) {
        mgc_comm_desc_format(&s->cur, d, sizeof d);
        snprintf(buf, size, "group rank %d (world %d) is blocked in %s%s", r, c->members[r], d,
                 more);
    } else if (s->arrived) {
        mgc_comm_desc_format(&s->desc, d, sizeof d);
        snprintf(buf, size, "group rank %d (world %d) is outside the communicator, last in %s%s",
                 r, c->members[r], d, more);
    } else {
        snprintf(buf, size, "group rank %d (world %d) has not called a collective here yet%s", r,
                 c->members[r], more);
    }
}

/* ---- collectives ---------------------------------------------------------- */

static int overlaps(const void *a, size_t an, const void *b, size_t bn) {
    uintptr_t x = (uintptr_t)a, y = (uintptr_t)b;
    return an && bn && x < y + bn && y < x + an;
}

/* Every rank checks the same descriptors, so all agree; returns 1 and writes
 * the message on a mismatch (call with the lock held). */
static int find_mismatch(const mgc_comm *c, const team *t, char *text, size_t size) {
    char a[160], b[160];
    for (int r = 1; r < t->size; r++) {
        if (!mgc_comm_desc_differ(&t->slots[0].desc, &t->slots[r].desc)) continue;
        mgc_comm_desc_format(&t->slots[0].desc, a, sizeof a);
        mgc_comm_desc_format(&t->slots[r].desc, b, sizeof b);
        snprintf(text, size,
                 "collective mismatch in %s: group rank 0 (world %d) called %s but group rank %d "
                 "(world %d) called %s",
                 c->name, c->members[0], a, r, c->members[r], b);
        return 1;
    }
    if (t->slots[0].desc.kind != MGC_COMM_OP_ALL_TO_ALL_V) return 0;
    for (int r = 0; r < t->size; r++)
        for (int q = 0; q < t->size; q++) {
            size_t got = t->slots[r].op.recv_counts[q], sent = t->slots[q].op.send_counts[r];
            if (got == sent) continue;
            snprintf(text, size,
                     "all_to_all_v #%llu count mismatch in %s: group rank %d (world %d) sends %zu "
                     "elements to group rank %d (world %d), which expects %zu",
                     (unsigned long long)t->slots[0].desc.seq, c->name, q, c->members[q], sent, r,
                     c->members[r], got);
            return 1;
        }
    return 0;
}

/* Make every group's team and handles for a split (lock held; runs once, by
 * the first rank that sees all arrivals). */
static mgc_comm_status make_split(mgc_comm *c, team *t) {
    int n = t->size;
    int *order = malloc((size_t)n * sizeof *order), *members = malloc((size_t)n * sizeof *members);
    char *seen = calloc((size_t)n, 1);
    mgc_comm **hs = malloc((size_t)n * sizeof *hs);
    mgc_comm_status s = MGC_COMM_OK;
    if (!order || !members || !seen || !hs) {
        s = MGC_COMM_ERR_NOMEM;
        goto done;
    }
    for (int r = 0; r < n; r++)
        t->slots[r].split_out = NULL;
    for (int r0 = 0; r0 < n; r0++) {
        int64_t color = t->slots[r0].op.color;
        if (seen[r0] || color < 0) continue;
        int m = 0;
        for (int r = r0; r < n; r++) /* ascending parent rank; stable insertion by key */
            if (!seen[r] && t->slots[r].op.color == color) {
                seen[r] = 1;
                int at = m++;
                while (at > 0 && t->slots[order[at - 1]].op.key > t->slots[r].op.key) {
                    order[at] = order[at - 1];
                    at--;
                }
                order[at] = r;
            }
        for (int i = 0; i < m; i++)
            members[i] = c->members[order[i]];
        team *nt = team_new(t->job, m);
        if (!nt || make_handles(nt, members, c->timeout_ms, "split", hs) != MGC_COMM_OK) {
            team_destroy(nt);
            s = MGC_COMM_ERR_NOMEM;
            goto done;
        }
        t->job->teams++;
        for (int i = 0; i < m; i++)
            t->slots[order[i]].split_out = hs[i];
    }
done:
    if (s != MGC_COMM_OK) /* undo the groups made so far: no rank has seen them */
        for (int r = 0; r < n; r++) {
            mgc_comm *h = t->slots[r].split_out;
            if (!h) continue;
            team *nt = h->context;
            for (int q = r; q < n; q++)
                if (t->slots[q].split_out && t->slots[q].split_out->context == nt) {
                    handle_destroy(t->slots[q].split_out);
                    t->slots[q].split_out = NULL;
                }
            team_destroy(nt);
            t->job->teams--;
        }
    free(order);
    free(members);
    free(seen);
    free(hs);
    return s;
}

/* The output this rank writes and whether it needs a scratch copy first. */
static size_t out_bytes(const mgc_comm *c, const mgc_comm_op *op) {
    size_t es = mgc_dtype_size(op->dt);
    switch (op->kind) {
    case MGC_COMM_OP_ALL_REDUCE:
        return overlaps(op->send, op->count * es, op->recv, op->count * es) ? op->count * es : 0;
    case MGC_COMM_OP_REDUCE_SCATTER:
        return overlaps(op->send, op->count * es * (size_t)c->size, op->recv, op->count * es)
                   ? op->count * es
                   : 0;
    default:
        return 0;
    }
}

/* Step 2: read the peers' buffers (published before arrival, stable until
 * every rank is done), write only this rank's output. */
static void compute(const mgc_comm *c, const team *t, const mgc_comm_op *op, void *scratch,
                    const float **parts) {
    int n = t->size, me = c->rank;
    size_t es = mgc_dtype_size(op->dt);
    switch (op->kind) {
    case MGC_COMM_OP_ALL_REDUCE:
    case MGC_COMM_OP_REDUCE_SCATTER: {
        size_t off = op->kind == MGC_COMM_OP_REDUCE_SCATTER ? (size_t)me * op->count : 0;
        for (int r = 0; r < n; r++)
            parts[r] = (const float *)t->slots[r].op.send + off;
        mgc_comm_reduce_ordered_f32(scratch ? scratch : op->recv, parts, n, op->count, op->red);
        break;
    }
    case MGC_COMM_OP_ALL_GATHER: {
        size_t cb = op->count * es;
        for (int r = 0; r < n; r++) {
            unsigned char *dst = (unsigned char *)op->recv + (size_t)r * cb;
            if (dst != t->slots[r].op.send) memcpy(dst, t->slots[r].op.send, cb);
        }
        break;
    }
    case MGC_COMM_OP_ALL_TO_ALL_V:
        for (int r = 0; r < n; r++) {
            const mgc_comm_op *p = &t->slots[r].op;
            size_t cnt = op->recv_counts[r];
            if (cnt)
                memcpy((unsigned char *)op->recv + op->recv_displs[r] * es,
                       (const unsigned char *)p->send + p->send_displs[me] * es, cnt * es);
        }
        break;
    case MGC_COMM_OP_BROADCAST:
        if (me != op->root && op->count)
            memcpy(op->recv, t->slots[op->root].op.send, op->count * es);
        break;
    default:
        break;
    }
}

static mgc_comm_status collective(mgc_comm *c, const mgc_comm_op *op, mgc_comm **split_out) {
    team *t = c->context;
    job *j = t->job;
    slot *me = &t->slots[c->rank];
    int n = t->size;
    size_t sbytes = out_bytes(c, op);
    void *scratch = sbytes ? malloc(sbytes) : NULL;
    const float **parts = malloc((size_t)n * sizeof *parts);
    mgc_comm_status s = MGC_COMM_OK;
    char text[MGC_COMM_ERR_MAX];
    if ((sbytes && !scratch) || !parts) {
        free(scratch);
        free(parts);
        return mgc_comm_fail(c, MGC_COMM_ERR_NOMEM, "%s: out of memory",
                             mgc_comm_op_name(op->kind));
    }
    uint64_t want = op->seq + 1;
    struct timespec dl = deadline_after(c->timeout_ms);
    int busy = -1;

    pthread_mutex_lock(&j->mu);
    if (j->failed) {
        s = aborted(c);
        goto unlock;
    }
    uint64_t before = me->arrived;
    me->op = *op;
    mgc_comm_desc_of(op, &me->desc);
    me->cur = me->desc;
    me->in_call = 1;
    busy = busy_enter(j, c, &me->desc);
    me->arrived = want;
    pthread_cond_broadcast(&j->cv);
    /* 1. arrive */
    for (;;) {
        int all = 1, gone = -1;
        for (int r = 0; r < n && all; r++)
            if (t->slots[r].arrived != want) {
                all = 0;
                if (t->slots[r].left) gone = r;
            }
        if (all) break;
        if (!j->failed && gone >= 0) {
            char d[160], who[768];
            mgc_comm_desc_format(&me->desc, d, sizeof d);
            describe_rank(c, &t->slots[gone], gone, who, sizeof who);
            snprintf(text, sizeof text, "%s rank %d (world %d): in %s: %s", c->name, c->rank,
                     c->world_rank, d, who);
            job_fail(j, text);
        }
        if (j->failed) {
            me->arrived = before; /* retract: nobody may read our buffers now */
            s = aborted(c);
            goto leave;
        }
        if (wait_until(j, &dl) == ETIMEDOUT) {
            all = 1;
            for (int r = 0; r < n && all; r++)
                all = t->slots[r].arrived == want;
            if (all) break;
            if (j->failed) continue; /* another rank failed first: report theirs */
            char d[160], who[MGC_COMM_ERR_MAX] = "";
            size_t used = 0;
            mgc_comm_desc_format(&me->desc, d, sizeof d);
            for (int r = 0; r < n && used + 2 < sizeof who; r++) {
                if (t->slots[r].arrived == want) continue;
                char one[768];
                describe_rank(c, &t->slots[r], r, one, sizeof one);
                used +=
                    (size_t)snprintf(who + used, sizeof who - used, "%s%s", used ? "; " : "", one);
            }
            snprintf(text, sizeof text, "%s rank %d (world %d): timed out after %lld ms in %s: %s",
                     c->name, c->rank, c->world_rank, (long long)c->timeout_ms, d, who);
            job_fail(j, text);
            me->arrived = before;
            s = mgc_comm_fail(c, MGC_COMM_ERR_TIMEOUT, "timed out after %lld ms in %s: %s",
                              (long long)c->timeout_ms, d, who);
            goto leave;
        }
    }
    /* every rank sees the same descriptors here; a rank that finds a mismatch
     * still goes through step 3, since peers may be reading its counts */
    int skip = 0;
    if (find_mismatch(c, t, text, sizeof text)) {
        job_fail(j, text);
        s = mgc_comm_fail(c, MGC_COMM_ERR_MISMATCH, "%s", text);
        skip = 1;
    } else if (op->kind == MGC_COMM_OP_SPLIT) {
        if (t->split_made != want) {
            t->split_made = want;
            if (make_split(c, t) != MGC_COMM_OK) {
                snprintf(text, sizeof text, "%s: out of memory creating sub-communicators",
                         c->name);
                job_fail(j, text);
            }
        }
        if (op->color >= 0 && !me->split_out) {
            s = aborted(c); /* make_split ran out of memory and undid everything */
        } else {
            *split_out = me->split_out;
            me->split_out = NULL;
        }
        skip = 1;
    }
    pthread_mutex_unlock(&j->mu);

    /* 2. compute */
    if (!skip) compute(c, t, op, scratch, parts);

    /* 3. done */
    pthread_mutex_lock(&j->mu);
    me->done = want;
    pthread_cond_broadcast(&j->cv);
    for (;;) {
        int all = 1;
        for (int r = 0; r < n && all; r++)
            all = t->slots[r].done == want;
        if (all) break;
        pthread_cond_wait(&j->cv, &j->mu); /* bounded: every arrived rank computes and marks */
    }
leave:
    me->in_call = 0;
    busy_leave(j, c, busy);
unlock:
    pthread_mutex_unlock(&j->mu);
    if (s == MGC_COMM_OK && scratch) memcpy(op->recv, scratch, sbytes);
    free(scratch);
    free(parts);
    return s;
}

/* ---- point to point ------------------------------------------------------- */

static mgc_comm_status local_send(mgc_comm *c, const mgc_comm_op *op) {
    team *t = c->context;
    job *j = t->job;
    size_t bytes = op->count * mgc_dtype_size(op->dt);
    msg *m = malloc(sizeof *m + bytes);
    if (!m) return mgc_comm_fail(c, MGC_COMM_ERR_NOMEM, "send: out of memory (%zu bytes)", bytes);
    m->next = NULL;
    m->seq = op->seq;
    mgc_comm_desc_of(op, &m->desc);
    m->bytes = bytes;
    if (bytes) memcpy(m->data, op->send, bytes);
    mgc_comm_status s = MGC_COMM_OK;
    pthread_mutex_lock(&j->mu);
    if (j->failed) {
        s = aborted(c);
    } else if (t->slots[op->root].left) {
        char text[MGC_COMM_ERR_MAX];
        snprintf(text, sizeof text,
                 "%s rank %d (world %d): send #%llu to group rank %d (world %d), "
                 "which freed its communicator",
                 c->name, c->rank, c->world_rank, (unsigned long long)op->seq, op->root,
                 c->members[op->root]);
        job_fail(j, text);
        s = aborted(c);
    } else {
        size_t q = (size_t)c->rank * (size_t)t->size + (size_t)op->root;
        if (t->qtail[q])
            t->qtail[q]->next = m;
        else
            t->qhead[q] = m;
        t->qtail[q] = m;
        m = NULL;
        pthread_cond_broadcast(&j->cv);
    }
    pthread_mutex_unlock(&j->mu);
    free(m);
    return s;
}

static mgc_comm_status local_recv(mgc_comm *c, const mgc_comm_op *op) {
    team *t = c->context;
    job *j = t->job;
    slot *me = &t->slots[c->rank];
    int peer = op->root;
    size_t q = (size_t)peer * (size_t)t->size + (size_t)c->rank;
    size_t bytes = op->count * mgc_dtype_size(op->dt);
    struct timespec dl = deadline_after(c->timeout_ms);
    char text[MGC_COMM_ERR_MAX], d[160], who[768];
    mgc_comm_status s = MGC_COMM_OK;
    msg *m = NULL;
    mgc_comm_desc mine;
    mgc_comm_desc_of(op, &mine);
    mgc_comm_desc_format(&mine, d, sizeof d);

    pthread_mutex_lock(&j->mu);
    me->cur = mine;
    me->in_call = 1;
    int busy = busy_enter(j, c, &mine);
    while (!t->qhead[q]) {
        if (!j->failed && t->slots[peer].left) {
            snprintf(text, sizeof text,
                     "%s rank %d (world %d): %s: group rank %d (world %d) freed its communicator "
                     "without sending it",
                     c->name, c->rank, c->world_rank, d, peer, c->members[peer]);
            job_fail(j, text);
        }
        if (j->failed) {
            s = aborted(c);
            goto leave;
        }
        if (wait_until(j, &dl) == ETIMEDOUT && !t->qhead[q] && !j->failed) {
            describe_rank(c, &t->slots[peer], peer, who, sizeof who);
            snprintf(text, sizeof text, "%s rank %d (world %d): timed out after %lld ms in %s: %s",
                     c->name, c->rank, c->world_rank, (long long)c->timeout_ms, d, who);
            job_fail(j, text);
            s = mgc_comm_fail(c, MGC_COMM_ERR_TIMEOUT, "timed out after %lld ms in %s: %s",
                              (long long)c->timeout_ms, d, who);
            goto leave;
        }
    }
    m = t->qhead[q];
    if (m->bytes != bytes || m->desc.dt != mine.dt || m->seq != op->seq) {
        char sd[160];
        mgc_comm_desc_format(&m->desc, sd, sizeof sd);
        snprintf(text, sizeof text,
                 "message mismatch in %s: group rank %d (world %d) called %s but group rank %d "
                 "(world %d) called %s",
                 c->name, peer, c->members[peer], sd, c->rank, c->world_rank, d);
        job_fail(j, text);
        s = mgc_comm_fail(c, MGC_COMM_ERR_MISMATCH, "%s", text);
        m = NULL;
        goto leave;
    }
    t->qhead[q] = m->next;
    if (!t->qhead[q]) t->qtail[q] = NULL;
leave:
    me->in_call = 0;
    busy_leave(j, c, busy);
    pthread_mutex_unlock(&j->mu);
    if (m) {
        if (bytes) memcpy(op->recv, m->data, bytes);
        free(m);
    }
    return s;
}

/* ---- the table ------------------------------------------------------------ */

static mgc_comm_status local_run(mgc_comm *c, const mgc_comm_op *op) {
    if (op->kind == MGC_COMM_OP_SEND) return local_send(c, op);
    if (op->kind == MGC_COMM_OP_RECV) return local_recv(c, op);
    return collective(c, op, NULL);
}

static mgc_comm_status local_split(mgc_comm *c, const mgc_comm_op *op, mgc_comm **out) {
    *out = NULL;
    return collective(c, op, out);
}

static const mgc_comm_iface local_iface = {
    .name = "local",
    .run = local_run,
    .split = local_split,
    .abort = local_abort,
    .free = local_free,
    .concurrent = 1, /* a team per group: handles share only the job's lock */
};
