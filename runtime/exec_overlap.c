/* exec_overlap.c - the executor's second and third threads (exec_int.h): the gradient
 * reducer (buckets reduced beside the backward) and the pipeline sender (sends beside the
 * compute). */
#include "exec_int.h"

#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Bucket bi's data-parallel sum, on k's thread: an all-reduce, or a reduce-scatter into this
 * rank's shard (distributed optimizer). */
static int reduce_bucket(const mgc_exec *x, xcomm *k, uint32_t bi) {
    const mgc_bucket *B = &x->sp->buckets[bi];
    mgc_comm *g = x->group[B->group];
    if (mgc_comm_size(g) == 1) return 0;
    size_t count = (size_t)B->count;
    char what[96];
    snprintf(what, sizeof what, "gradient bucket %u reduction", bi);
    float *base = gptr(x, (int64_t)B->begin);
    if (B->shards > 1) {
        size_t piece = count / (size_t)B->shards;
        return mgc_exec_comm_reduce_scatter(k, g, base, base + (size_t)mgc_comm_rank(g) * piece,
                                            piece, MGC_DT_F32, what);
    }
    return mgc_exec_comm_all_reduce(k, g, base, base, count, MGC_DT_F32, MGC_COMM_SUM, what);
}

/* ---- the gradient reducer -------------------------------------------------------------
 * With grad overlap (mgc_exec_set_grad_overlap, on by default), a bucket's data-parallel
 * reduction starts as soon as its gradients are final: after the op of its chunk's last
 * backward that last writes them (x->ready_op).  A second thread per rank runs it, in the
 * order the buckets became ready, while this thread goes on with the backward; the bucket's
 * REDUCE_GRADS instruction waits for it.  Only the reduction's timing changes, never its
 * arguments, so the numbers are the in-line ones bit for bit.  It needs a communicator whose
 * handles of different groups may be used from two threads at once (mgc_comm_concurrent),
 * and, on device memory, the backend's transfer slots (xfer_*), which order the bucket's
 * download after the compute issued before it. */
typedef struct reducer {
    const mgc_exec *x;
    pthread_t th;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    uint32_t *queue;           /* (n_buckets) bucket indices in the order handed over */
    int64_t head, tail;        /* queue[head..tail) waits; reset each step */
    int8_t *state;             /* (n_buckets) R_IDLE, R_QUEUED, R_DONE, R_FAILED (under mu) */
    uint8_t *handed;           /* (n_buckets) handed over this step: the executor's thread only */
    void **marks;              /* (n_buckets) xfer_mark's marks (device memory) */
    int stop;
    xcomm k;                   /* the reducer thread's communication */
    char kerr[2048];           /* k's error text: the reducer thread's own */
    char err[2048];            /* the first failure since the step began (under mu) */
} reducer;

enum { R_IDLE = 0, R_QUEUED, R_DONE, R_FAILED };

static void *reducer_main(void *arg) {
    reducer *r = arg;
    const mgc_exec *x = r->x;
    pthread_mutex_lock(&r->mu);
    for (;;) {
        while (!r->stop && r->head == r->tail)
            pthread_cond_wait(&r->cv, &r->mu);
        if (r->stop) break;
        uint32_t bi = r->queue[r->head++];
        r->k.mark = r->marks ? r->marks[bi] : NULL;
        pthread_mutex_unlock(&r->mu);
        int rc = reduce_bucket(x, &r->k, bi);
        /* a failure poisons the job at once: the data-parallel peers must not wait for this
         * rank's executor to reach the step's tail, nor pair its next bucket with this one */
        if (rc) mgc_comm_abort(x->group[x->sp->buckets[bi].group], r->kerr);
        pthread_mutex_lock(&r->mu);
        if (rc && !r->err[0]) snprintf(r->err, sizeof r->err, "%s", r->kerr);
        r->state[bi] = rc ? R_FAILED : R_DONE;
        pthread_cond_broadcast(&r->cv);
    }
    pthread_mutex_unlock(&r->mu);
    return NULL;
}

/* Sets *stop under mu, wakes the worker thread th and joins it; then destroys mu and cv (the
 * reducer's and the sender's end). */
static void join_worker(pthread_t th, pthread_mutex_t *mu, pthread_cond_t *cv, int *stop) {
    pthread_mutex_lock(mu);
    *stop = 1;
    pthread_cond_broadcast(cv);
    pthread_mutex_unlock(mu);
    pthread_join(th, NULL);
    pthread_cond_destroy(cv);
    pthread_mutex_destroy(mu);
}

void mgc_exec_reducer_stop(mgc_exec *x) {
    reducer *r = x->red;
    if (!r) return;
    join_worker(r->th, &r->mu, &r->cv, &r->stop);
    mgc_exec_xcomm_release(&r->k);
    free(r->queue), free(r->state), free(r->marks), free(r->handed);
    free(r);
    x->red = NULL;
}

int64_t mgc_exec_reducer_staged(mgc_exec *x) {
    pthread_mutex_lock(&x->red->mu);
    int64_t n = x->red->k.staged_bytes;
    x->red->k.staged_bytes = 0;
    pthread_mutex_unlock(&x->red->mu);
    return n;
}

/* Which op of its chunk's last backward last writes each bucket's gradients, and the
 * reducer thread when overlap can run here. */
int mgc_exec_setup_overlap(mgc_exec *x) {
    const mgc_stage_program *sp = x->sp;
    x->overlap = 1;
    x->last_bwd_mb = malloc((size_t)(sp->n_chunks ? sp->n_chunks : 1) * sizeof *x->last_bwd_mb);
    x->ready_op = malloc((size_t)(sp->n_buckets ? sp->n_buckets : 1) * sizeof *x->ready_op);
    if (!x->last_bwd_mb || !x->ready_op) return mgc_exec_fail(x, "out of memory");
    for (int64_t c = 0; c < sp->n_chunks; c++)
        x->last_bwd_mb[c] = -1;
    for (int64_t i = 0; i < sp->n_instrs; i++)
        if (sp->instrs[i].op == MGC_I_BACKWARD && sp->instrs[i].chunk < sp->n_chunks)
            x->last_bwd_mb[sp->instrs[i].chunk] = sp->instrs[i].mb;
    mgc_comm *eg = x->group[MGC_GROUP_EMBED];
    int embed_sum = eg && mgc_comm_size(eg) > 1 && x->n_embed > 0;
    int any = 0;
    for (int64_t bi = 0; bi < sp->n_buckets; bi++) {
        const mgc_bucket *B = &sp->buckets[bi];
        int64_t lo = (int64_t)B->begin, hi = lo + (int64_t)B->count;
        int32_t ready = -1;
        int eligible = B->chunk < sp->n_chunks && x->last_bwd_mb[B->chunk] >= 0 &&
                       mgc_comm_size(x->group[B->group]) > 1;
        /* the tied embedding's two copies are summed (EMBED_GRADS) before the bucket's
         * reduction: such a bucket waits for its instruction */
        for (int64_t i = 0; eligible && embed_sum && i < x->n_embed; i++)
            if (x->embed[i].elem < hi && lo < x->embed[i].elem + x->embed[i].n) eligible = 0;
        const mgc_plan_chunk *ch = eligible ? &sp->chunks[B->chunk] : NULL;
        for (int64_t p = 0; ch && p < x->n_params; p++) {
            const pentry *e = &x->params[p];
            if (e->elem >= hi || e->elem + e->pub.numel <= lo) continue;
            if (e->pub.chunk != B->chunk) { /* a gradient written by another chunk */
                eligible = 0;
                break;
            }
            for (int64_t o = 0; o < ch->n_bwd; o++)
                for (int j = 0; j < ch->bwd[o].n_out; j++)
                    if (ch->bwd[o].out[j] == e->grad_tensor && (int32_t)o > ready) ready = (int32_t)o;
            for (int64_t o = 0; o < ch->n_fwd; o++) /* none expected: keep it in line */
                for (int j = 0; j < ch->fwd[o].n_out; j++)
                    if (ch->fwd[o].out[j] == e->grad_tensor) eligible = 0;
        }
        x->ready_op[bi] = eligible ? ready : INT32_MIN;
        any |= eligible;
    }
    /* the reducer must be the only thread on the buckets' groups: no chunk program may use
     * them (none does today: their collectives are tensor, context, expert or pipeline) */
    for (int64_t c = 0; c < sp->n_chunks && any; c++) {
        const mgc_plan_chunk *ch = &sp->chunks[c];
        for (int pass = 0; pass < 2 && any; pass++)
            for (int64_t o = 0; o < (pass ? ch->n_bwd : ch->n_fwd) && any; o++) {
                const mgc_plan_op *op = pass ? &ch->bwd[o] : &ch->fwd[o];
                for (int64_t b = 0; b < sp->n_buckets && op->kind >= MGC_POP_ALL_REDUCE; b++)
                    if (op->group == sp->buckets[b].group) any = 0;
            }
    }
    const mgc_backend_iface *bi = x->be->iface;
    int xfer = bi->xfer_mark && bi->xfer_download && bi->xfer_upload;
    if (!any || !mgc_comm_concurrent(x->world) || (x->fg->staged && !xfer)) return 0;
    reducer *r = calloc(1, sizeof *r);
    if (!r) return mgc_exec_fail(x, "out of memory");
    r->queue = malloc((size_t)sp->n_buckets * sizeof *r->queue);
    r->state = calloc((size_t)sp->n_buckets, sizeof *r->state);
    r->handed = calloc((size_t)sp->n_buckets, sizeof *r->handed);
    r->marks = x->fg->staged ? calloc((size_t)sp->n_buckets, sizeof *r->marks) : NULL;
    r->x = x;
    r->k = *x->fg;
    r->k.host = NULL, r->k.host_cap = 0, r->k.staged_bytes = 0;
    r->k.xfer = x->fg->staged;
    r->k.err = r->kerr, r->k.errsz = sizeof r->kerr;
    if (!r->queue || !r->state || !r->handed || (x->fg->staged && !r->marks)) {
        free(r->queue), free(r->state), free(r->marks), free(r->handed), free(r);
        return mgc_exec_fail(x, "out of memory");
    }
    /* the reducer's staging buffer: the largest bucket, allocated here, not in a step */
    uint64_t most = 0;
    for (int64_t b = 0; b < sp->n_buckets; b++)
        if (sp->buckets[b].count * 4 > most) most = sp->buckets[b].count * 4;
    if (r->k.staged && !mgc_exec_xcomm_stage(&r->k, (size_t)most)) {
        snprintf(x->err, sizeof x->err, "%s", r->kerr);
        free(r->queue), free(r->state), free(r->marks), free(r->handed), free(r);
        return -1;
    }
    if (pthread_mutex_init(&r->mu, NULL) || pthread_cond_init(&r->cv, NULL) ||
        pthread_create(&r->th, NULL, reducer_main, r)) {
        mgc_exec_xcomm_release(&r->k);
        free(r->queue), free(r->state), free(r->marks), free(r->handed), free(r);
        return mgc_exec_fail(x, "rank %" PRId64 ": cannot start the gradient reducer thread",
                             x->rank);
    }
    x->red = r;
    return 0;
}

int mgc_exec_overlapping(const mgc_exec *x) {
    return x->red && x->overlap && !x->prof && !x->eval;
}

/* Queues bucket bi on the reducer, its download ordered after the compute issued so far. */
static int hand_one(mgc_exec *x, int64_t bi) {
    reducer *r = x->red;
    if (r->marks && x->be->iface->xfer_mark(x->be, &r->marks[bi]))
        return mgc_exec_fail_backend(x, "marking a gradient bucket for its reduction");
    r->handed[bi] = 1;
    pthread_mutex_lock(&r->mu);
    r->state[bi] = R_QUEUED;
    r->queue[r->tail++] = (uint32_t)bi;
    pthread_cond_broadcast(&r->cv);
    pthread_mutex_unlock(&r->mu);
    return 0;
}

/* Hands the buckets that are final once op `op` of chunk c's last backward has been issued
 * (op -1: before its first) to the reducer. */
int mgc_exec_hand_over(mgc_exec *x, int c, int32_t op) {
    reducer *r = x->red;
    for (int64_t bi = 0; bi < x->sp->n_buckets; bi++) {
        if (x->ready_op[bi] != op || x->sp->buckets[bi].chunk != c || r->handed[bi]) continue;
        if (hand_one(x, bi)) return -1;
        x->overlapped++;
    }
    return 0;
}

/* Waits for bucket bi's reduction (bi < 0: every handed-over bucket). */
int mgc_exec_reducer_wait(mgc_exec *x, int64_t bi) {
    reducer *r = x->red;
    int rc = 0;
    pthread_mutex_lock(&r->mu);
    for (int64_t b = bi < 0 ? 0 : bi; b < (bi < 0 ? x->sp->n_buckets : bi + 1); b++) {
        while (r->state[b] == R_QUEUED)
            pthread_cond_wait(&r->cv, &r->mu);
        if (r->state[b] == R_FAILED && !rc) rc = mgc_exec_fail(x, "%s", r->err);
    }
    pthread_mutex_unlock(&r->mu);
    return rc;
}

/* REDUCE_GRADS.  With a reducer, every bucket goes through it, those not handed over during
 * the backward (the tied embedding's, or all of them with overlap off) at this instruction:
 * the reducer's thread is then the only one using the buckets' groups, in one order on every
 * rank (a second thread calling the same group would collide with it). */
int mgc_exec_reduce_grads(mgc_exec *x, uint32_t bi) {
    if (!x->red) return reduce_bucket(x, x->fg, bi);
    if (!x->red->handed[bi] && hand_one(x, bi)) return -1;
    return mgc_exec_reducer_wait(x, bi);
}

/* Before a step: every bucket idle (after a failed step, once the reducer has drained; that
 * step reported the failure). */
void mgc_exec_reducer_reset(mgc_exec *x) {
    if (!x->red) return;
    char keep[sizeof x->err];
    memcpy(keep, x->err, sizeof keep);
    mgc_exec_reducer_wait(x, -1);
    memcpy(x->err, keep, sizeof keep);
    pthread_mutex_lock(&x->red->mu);
    memset(x->red->state, 0, (size_t)x->sp->n_buckets * sizeof *x->red->state);
    memset(x->red->handed, 0, (size_t)x->sp->n_buckets);
    x->red->err[0] = '\0';
    x->red->head = x->red->tail = 0;
    pthread_mutex_unlock(&x->red->mu);
}

/* ---- pipeline sends beside the compute ----------------------------------------------------
 * On device memory with the backend's pipeline-transfer slots (backend.h p2p_*), SEND_ACT and
 * SEND_GRAD queue the download of their staging buffer (it starts once the compute issued so
 * far is done) and hand the send to a thread of the rank, the sender, which waits for the
 * download and sends; the executor goes on issuing compute at once.
 *  - The staging buffer's bytes must stay until the download is done, but the memory plan may
 *    give them to another buffer once the send's instruction is over (its liveness ends
 *    there).  So before the first instruction at which a buffer overlapping them becomes live,
 *    the executor fences the compute behind the download (p2p_fence: on the device, the host
 *    does not wait).  The fences are worked out once, at open, from the buffers' offsets and
 *    liveness (fence_at).
 *  - The sender is the only thread on the pipeline group, so receives go through it too, in
 *    instruction order: the executor queues a RECV and waits for it (it needs the data), then
 *    uploads it.  The order of every rank's transfers is the in-line one: no new pairing, no
 *    new deadlock.
 *  - Host buffers: a pool of SEND_SLOTS, each as large as the stage's largest staging buffer; a
 *    send waits for a free one.
 *  - A step ends once every send has left (the next step's compute may reuse any byte), and
 *    a failure poisons the job (mgc_comm_abort) as the reducer's does.
 * Only the transfers' timing changes, never their bytes: the numbers are the in-line ones bit
 * for bit (tests/test_train.c checks it on a backend whose downloads happen as late as
 * allowed). */
#define SEND_SLOTS 4

typedef struct p2p_item {
    int recv;                  /* 1: a receive into `host` */
    int slot;                  /* send: its pool slot */
    void *host;
    size_t bytes;
    int peer;
    void *done;                /* send: the backend's handle of its download */
    char what[160];
} p2p_item;

typedef struct sender {
    const mgc_exec *x;
    pthread_t th;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    p2p_item *q;               /* ring of `cap` items: q[n % cap] for head <= n < tail */
    int64_t cap, head, tail;   /* items handed over (tail) and finished (head), since open */
    unsigned char *pool[SEND_SLOTS];
    int busy[SEND_SLOTS];      /* the slot's send has not left yet (under mu) */
    size_t slot_bytes;
    int stop;
    int failed;                /* a transfer failed: err holds why (under mu) */
    char err[2048];
    void **done;               /* (n_instrs) each SEND's download handle (the executor's thread) */
    int64_t *queued_in;        /* (n_instrs) the epoch (step) a SEND was last queued in */
    int64_t epoch;             /* this step's */
    int64_t *fence_first;      /* (n_instrs + 1) fences before instruction i:        */
    int64_t *fence_send;       /*   fence_send[fence_first[i] .. fence_first[i + 1])  */
} sender;

static void *sender_main(void *arg) {
    sender *r = arg;
    const mgc_exec *x = r->x;
    mgc_comm *g = x->group[MGC_GROUP_PP];
    pthread_mutex_lock(&r->mu);
    for (;;) {
        while (!r->stop && r->head == r->tail)
            pthread_cond_wait(&r->cv, &r->mu);
        if (r->stop) break;
        p2p_item it = r->q[r->head % r->cap];
        int failed = r->failed;
        pthread_mutex_unlock(&r->mu);
        char e[1024] = "";
        if (!failed) { /* after a failure, only drain: the job is poisoned */
            mgc_comm_status cs = MGC_COMM_OK;
            if (it.recv) {
                cs = mgc_comm_recv(g, it.host, it.bytes, MGC_DT_U8, it.peer);
            } else if (x->be->iface->p2p_wait(x->be, it.done, e, sizeof e)) {
                failed = 1;
            } else {
                cs = mgc_comm_send(g, it.host, it.bytes, MGC_DT_U8, it.peer);
            }
            if (cs != MGC_COMM_OK) {
                snprintf(e, sizeof e, "%s: %s", mgc_comm_status_name(cs), mgc_comm_error(g));
                failed = 1;
            }
            if (failed) mgc_comm_abort(g, e);
        }
        pthread_mutex_lock(&r->mu);
        if (failed && !r->failed) {
            r->failed = 1;
            snprintf(r->err, sizeof r->err, "rank %" PRId64 ": %s: %s", x->rank, it.what,
                     e[0] ? e : "an earlier transfer failed");
        }
        if (!it.recv) r->busy[it.slot] = 0;
        r->head++;
        pthread_cond_broadcast(&r->cv);
    }
    pthread_mutex_unlock(&r->mu);
    return NULL;
}

/* Frees r's memory and pool (no thread). */
static void sender_free(const mgc_exec *x, sender *r) {
    const mgc_backend_iface *bi = x->be->iface;
    for (int k = 0; k < SEND_SLOTS; k++) {
        if (!r->pool[k]) continue;
        if (bi->host_alloc && bi->host_free) bi->host_free(x->be, r->pool[k]);
        else free(r->pool[k]);
    }
    free(r->q), free(r->done), free(r->queued_in), free(r->fence_first), free(r->fence_send);
    free(r);
}

void mgc_exec_sender_stop(mgc_exec *x) {
    sender *r = x->snd;
    if (!r) return;
    pthread_mutex_lock(&r->mu);
    while (r->head != r->tail) /* transfers in flight use the pool and the backend */
        pthread_cond_wait(&r->cv, &r->mu);
    pthread_mutex_unlock(&r->mu);
    join_worker(r->th, &r->mu, &r->cv, &r->stop);
    sender_free(x, r);
    x->snd = NULL;
}

/* The sender thread, where sends can go beside the compute: pipeline neighbours on device
 * memory, the backend's p2p slots, a communicator that lets two threads of a rank work at
 * once.  Also works out the fences. */
int mgc_exec_setup_sender(mgc_exec *x) {
    const mgc_stage_program *sp = x->sp;
    const mgc_backend_iface *bi = x->be->iface;
    x->send_overlap = 1;
    mgc_comm *pp = x->group[MGC_GROUP_PP];
    if (!x->fg->staged || !bi->p2p_download || !bi->p2p_wait || !bi->p2p_fence || !pp ||
        mgc_comm_size(pp) < 2 || !mgc_comm_concurrent(x->world))
        return 0;
    int64_t n = sp->n_instrs, sends = 0, nf = 0;
    size_t most = 0;
    for (int64_t i = 0; i < n; i++) {
        const mgc_instr *in = &sp->instrs[i];
        int k = mgc_exec_comm_slot(in->op);
        if (k < 0) continue;
        int32_t b = in->chunk < sp->n_chunks && in->mb >= 0 && in->mb < x->mb_count
                        ? x->chunks[in->chunk].comm[k][in->mb]
                        : -1;
        if (b < 0) return 0; /* p2p() reports it, in line */
        if ((k & 1) == 0) sends++;
        if (sp->buffers[b].bytes > most) most = (size_t)sp->buffers[b].bytes;
    }
    if (!sends) return 0;
    sender *r = calloc(1, sizeof *r);
    if (!r) return mgc_exec_fail(x, "out of memory");
    r->x = x;
    r->cap = n + 1; /* at most every instruction queued at once */
    r->q = calloc((size_t)r->cap, sizeof *r->q);
    r->done = calloc((size_t)n + 1, sizeof *r->done);
    r->queued_in = calloc((size_t)n + 1, sizeof *r->queued_in);
    r->fence_first = calloc((size_t)n + 2, sizeof *r->fence_first);
    r->fence_send = malloc((size_t)sends * sizeof *r->fence_send);
    int64_t *at = malloc((size_t)sends * 2 * sizeof *at); /* (send, fence instruction) pairs */
    if (!r->q || !r->done || !r->queued_in || !r->fence_first || !r->fence_send || !at) {
        free(at);
        sender_free(x, r);
        return mgc_exec_fail(x, "out of memory");
    }
    /* each send's fence: the first instruction after it at which a buffer overlapping its
     * staging buffer becomes live (none: the step's end, where every send has left) */
    for (int64_t i = 0; i < n; i++) {
        const mgc_instr *in = &sp->instrs[i];
        int k = mgc_exec_comm_slot(in->op);
        if (k != 0 && k != 2) continue;
        const mgc_buffer *S = &sp->buffers[x->chunks[in->chunk].comm[k][in->mb]];
        int64_t j = n;
        for (int64_t b = 0; b < sp->n_buffers; b++) {
            const mgc_buffer *B = &sp->buffers[b];
            if (B == S || B->live_begin <= i || B->live_begin >= j) continue;
            if (B->offset < S->offset + S->bytes && S->offset < B->offset + B->bytes)
                j = B->live_begin;
        }
        if (j < n) at[2 * nf] = j, at[2 * nf + 1] = i, nf++;
    }
    for (int64_t f = 0; f < nf; f++) r->fence_first[at[2 * f] + 1]++;
    for (int64_t i = 0; i < n; i++) r->fence_first[i + 1] += r->fence_first[i];
    int64_t *fill = calloc((size_t)n + 1, sizeof *fill);
    if (!fill) {
        free(at);
        sender_free(x, r);
        return mgc_exec_fail(x, "out of memory");
    }
    for (int64_t f = 0; f < nf; f++) {
        int64_t j = at[2 * f];
        r->fence_send[r->fence_first[j] + fill[j]++] = at[2 * f + 1];
    }
    free(fill), free(at);
    r->slot_bytes = most ? most : 1;
    for (int k = 0; k < SEND_SLOTS; k++) {
        void *p = NULL;
        if (bi->host_alloc && bi->host_free ? bi->host_alloc(x->be, r->slot_bytes, &p) != 0
                                            : (p = malloc(r->slot_bytes)) == NULL) {
            sender_free(x, r);
            return mgc_exec_fail(x, "rank %" PRId64 ": allocating %d host buffers of %zu bytes for "
                            "pipeline sends", x->rank, SEND_SLOTS, (size_t)(most ? most : 1));
        }
        r->pool[k] = p;
    }
    if (pthread_mutex_init(&r->mu, NULL) || pthread_cond_init(&r->cv, NULL) ||
        pthread_create(&r->th, NULL, sender_main, r)) {
        sender_free(x, r);
        return mgc_exec_fail(x, "rank %" PRId64 ": cannot start the pipeline sender thread",
                             x->rank);
    }
    x->snd = r;
    return 0;
}

/* Queues it (the executor's thread); its index in the queue.  -1 with x->err set when the
 * sender has failed. */
static int64_t sender_put(mgc_exec *x, const p2p_item *it) {
    sender *r = x->snd;
    pthread_mutex_lock(&r->mu);
    if (r->failed) {
        pthread_mutex_unlock(&r->mu);
        return mgc_exec_fail(x, "%s", r->err);
    }
    int64_t idx = r->tail++;
    r->q[idx % r->cap] = *it;
    pthread_cond_broadcast(&r->cv);
    pthread_mutex_unlock(&r->mu);
    return idx;
}

/* Waits until the sender has finished item idx (idx < 0: every item); -1 with x->err set
 * when it failed. */
static int sender_wait(mgc_exec *x, int64_t idx) {
    sender *r = x->snd;
    pthread_mutex_lock(&r->mu);
    while (!r->failed && (idx < 0 ? r->head != r->tail : r->head <= idx))
        pthread_cond_wait(&r->cv, &r->mu);
    int rc = r->failed ? mgc_exec_fail(x, "%s", r->err) : 0;
    pthread_mutex_unlock(&r->mu);
    return rc;
}

/* SEND_ACT / SEND_GRAD (instruction i) and RECV_ACT / RECV_GRAD through the sender; b is the
 * staging buffer. */
int mgc_exec_sender_p2p(mgc_exec *x, const mgc_instr *in, int64_t i, int32_t b, const char *what) {
    sender *r = x->snd;
    size_t n = (size_t)x->sp->buffers[b].bytes;
    void *arena = buf_addr(x, b);
    p2p_item it;
    memset(&it, 0, sizeof it);
    it.recv = in->op == MGC_I_RECV_ACT || in->op == MGC_I_RECV_GRAD;
    it.bytes = n;
    it.peer = in->peer;
    snprintf(it.what, sizeof it.what, "%s", what);
    if (it.recv) { /* into the executor's own staging buffer: it waits for the data anyway */
        if (!(it.host = mgc_exec_xcomm_stage(x->fg, n))) return -1;
        int64_t idx = sender_put(x, &it);
        if (idx < 0 || sender_wait(x, idx)) return -1;
        return mgc_exec_xcomm_up(x->fg, arena, it.host, n);
    }
    pthread_mutex_lock(&r->mu); /* a free host buffer */
    int k = -1;
    while (!r->failed && k < 0) {
        for (int s = 0; s < SEND_SLOTS && k < 0; s++)
            if (!r->busy[s]) k = s;
        if (k < 0) pthread_cond_wait(&r->cv, &r->mu);
    }
    if (r->failed) {
        pthread_mutex_unlock(&r->mu);
        return mgc_exec_fail(x, "%s", r->err);
    }
    r->busy[k] = 1;
    pthread_mutex_unlock(&r->mu);
    it.slot = k;
    it.host = r->pool[k];
    char e[1024];
    if (x->be->iface->p2p_download(x->be, it.host, arena, n, &r->done[i], e, sizeof e)) {
        pthread_mutex_lock(&r->mu);
        r->busy[k] = 0;
        pthread_mutex_unlock(&r->mu);
        return mgc_exec_fail(x, "rank %" PRId64 ": %s: %s", x->rank, what, e);
    }
    it.done = r->done[i];
    r->queued_in[i] = r->epoch;
    x->fg->staged_bytes += (int64_t)n;
    if (sender_put(x, &it) < 0) return -1;
    x->sends_queued++;
    return 0;
}

/* Before instruction i: the compute waits (on the device) for the downloads of this step's
 * sends whose bytes a buffer that becomes live at i may reuse. */
int mgc_exec_sender_fence(mgc_exec *x, int64_t i) {
    sender *r = x->snd;
    for (int64_t f = r->fence_first[i]; f < r->fence_first[i + 1]; f++) {
        int64_t s = r->fence_send[f];
        if (r->queued_in[s] != r->epoch || !r->done[s]) continue; /* sent in line */
        char e[1024];
        if (x->be->iface->p2p_fence(x->be, r->done[s], e, sizeof e))
            return mgc_exec_fail(x, "rank %" PRId64 ": instruction %" PRId64 ": %s", x->rank, i, e);
    }
    return 0;
}

/* The step's end (report: every transfer has left, or the first failure) or its start (a
 * failed step's transfers have drained; a new epoch). */
int mgc_exec_sender_drain(mgc_exec *x, int report) {
    sender *r = x->snd;
    if (report) return sender_wait(x, -1);
    pthread_mutex_lock(&r->mu);
    while (r->head != r->tail)
        pthread_cond_wait(&r->cv, &r->mu);
    r->failed = 0;
    r->err[0] = '\0';
    r->epoch++;
    pthread_mutex_unlock(&r->mu);
    return 0;
}

void mgc_exec_set_send_overlap(mgc_exec *x, int on) {
    x->send_overlap = on != 0;
}

int mgc_exec_send_overlap(const mgc_exec *x) {
    return x->snd != NULL && x->send_overlap;
}
