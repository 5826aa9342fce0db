/* schedule_sim.c - runs every pipeline rank's stream together; see
 * schedule.h and docs/schedules.md.
 *
 * Layout of this file:
 *   reporting     problems go to the diagnostics list, a few per kind
 *   static pass   fields in range, peers that are the neighbour stage, and
 *                 every send matched with its receive by (link, seq)
 *   execution     each rank runs its stream in order; a rank blocks on a
 *                 transfer or a collective until the other side allows it.
 *                 A work list holds the ranks that may be able to move: a
 *                 rank runs until it blocks, and every instruction it
 *                 completes wakes the ranks that can wait on it (its two
 *                 pipeline neighbours, and rank 0, which starts
 *                 collectives).  The times do not depend on that order:
 *                 every rank is sequential and every wait is on a named
 *                 instruction of another rank.
 *   checks        data flow per (microbatch, chunk) on each rank: input
 *                 received before the forward, forward before backward,
 *                 output gradient before backward, each exactly once
 *   deadlock      who waits on whom when nothing can move
 *   metrics       makespan, busy and idle time, bubble, in-flight peaks */
#include "schedule.h"

#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

enum { K_MALFORMED, K_UNMATCHED, K_MISMATCH, K_DEADLOCK, K_ORDER, K_INPUT, K_MISSING, K__COUNT };

static const char *const kind_names[K__COUNT] = {
    "malformed-instruction",
    "unmatched-transfer",
    "mismatched-transfer",
    "deadlock",
    "order",
    "input",
    "missing-pass",
};

/* State bits of one (microbatch, chunk) on a rank. */
#define S_IN        0x01u /* input activation received */
#define S_GRAD      0x02u /* output gradient received */
#define S_FWD       0x04u /* forward done */
#define S_BWD       0x08u /* backward done */
#define S_TOK       0x10u /* tokens loaded */
#define S_LAB       0x20u /* labels loaded */
#define S_IN_USED   0x40u /* the received input was consumed by the forward */
#define S_GRAD_USED 0x80u /* the received gradient was consumed by the backward */

typedef struct lnk {
    uint64_t link, seq; /* link = sender * pp + receiver */
    int64_t rank, idx;  /* the instruction */
} lnk;

typedef struct sim {
    const mgc_schedule *s;
    mgc_sim_result *r;
    mgc_diags *d;
    mgc_schedule_cost_fn cost;
    void *user;
    int64_t cap;     /* messages a link holds; 0 rendezvous */
    int max_reports; /* per kind */
    int64_t pp, vp, m, S;
    int64_t *pc;            /* (pp) next instruction */
    double *clk;            /* (pp) when the rank is free */
    int64_t **prank;        /* (pp)(n) partner rank of a transfer, -1 none */
    int64_t **pidx;         /* (pp)(n) partner instruction */
    int64_t **spos;         /* (pp)(n) position of a send among its link's sends */
    int64_t **lsend;        /* (pp * 2)(sends) send instruction indices per (rank, link slot) */
    int64_t *nlsend;        /* (pp * 2) */
    uint8_t **st;           /* (pp)(m * vp) S_* bits per (mb, chunk) */
    int64_t *bwd_done;      /* (pp) backwards run */
    int64_t *infl, *infl_c; /* (pp), (pp * vp) microbatches in flight */
    int64_t *pend;          /* (pp) received, not yet consumed */
    uint8_t *opt_done;      /* (pp) OPTIMIZER ran */
    uint8_t *tail_early;    /* (pp) an early step-tail op was reported */
    int64_t *work;          /* (pp) ring of ranks that may be able to move */
    int64_t work_head, work_len;
    uint8_t *queued;   /* (pp) rank is in work */
    int64_t coll_seen; /* members known to wait at rank 0's current collective */
} sim;

/* ---- reporting -------------------------------------------------------------- */

static int64_t *counter(mgc_sim_result *r, int kind) {
    switch (kind) {
    case K_MALFORMED:
        return &r->n_malformed;
    case K_UNMATCHED:
        return &r->n_unmatched;
    case K_MISMATCH:
        return &r->n_mismatch;
    case K_DEADLOCK:
        return &r->n_deadlock;
    case K_ORDER:
        return &r->n_order;
    case K_INPUT:
        return &r->n_input;
    default:
        return &r->n_missing;
    }
}

#if defined(__GNUC__)
__attribute__((format(printf, 4, 5)))
#endif
static void
report(sim *x, int kind, const char *hint, const char *fmt, ...) {
    int64_t *n = counter(x->r, kind);
    (*n)++;
    if (*n > x->max_reports) return;
    char buf[900];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    mgc_diag(x->d, MGC_SEV_ERROR, x->s->loc, hint, "schedule: %s", buf);
}

static void desc(const mgc_instr *in, char *buf, size_t n) {
    mgc_instr_format(in, buf, n);
}

static const mgc_instr *ins(const sim *x, int64_t r, int64_t i) {
    return &x->s->ranks[r].instrs[i];
}

static int is_send(int op) {
    return op == MGC_I_SEND_ACT || op == MGC_I_SEND_GRAD;
}
static int is_recv(int op) {
    return op == MGC_I_RECV_ACT || op == MGC_I_RECV_GRAD;
}
static int is_p2p(int op) {
    return is_send(op) || is_recv(op);
}
static int per_mb(int op) {
    return op <= MGC_I_RECV_GRAD; /* LOAD_BATCH .. RECV_GRAD */
}
static int slot(int64_t pp, int64_t r, int64_t peer) {
    return peer == (r + 1) % pp ? 0 : 1;
}

/* ---- static pass ------------------------------------------------------------ */

/* Fields in range and transfers between the neighbouring stages. */
static int check_fields(sim *x, int64_t r, int64_t i) {
    const mgc_instr *in = ins(x, r, i);
    char b[160];
    int64_t pp = x->pp, S = x->S;
    if (in->op >= MGC_I__COUNT) {
        report(x, K_MALFORMED, NULL, "rank %" PRId64 " instruction %" PRId64 ": unknown op %u", r,
               i, (unsigned)in->op);
        return -1;
    }
    if (per_mb(in->op) && (in->mb < 0 || in->mb >= x->m || in->chunk >= x->vp)) {
        desc(in, b, sizeof b);
        report(x, K_MALFORMED, NULL,
               "rank %" PRId64 " instruction %" PRId64 " (%s): microbatch or chunk out of range "
               "(m=%" PRId64 ", v=%" PRId64 ")",
               r, i, b, x->m, x->vp);
        return -1;
    }
    int64_t s = (int64_t)in->chunk * pp + r, want = -1;
    switch (in->op) {
    case MGC_I_SEND_ACT:
    case MGC_I_RECV_GRAD:
        want = s < S - 1 ? (s + 1) % pp : -2;
        break;
    case MGC_I_RECV_ACT:
    case MGC_I_SEND_GRAD:
        want = s > 0 ? (s - 1) % pp : -2;
        break;
    case MGC_I_LOAD_BATCH:
        if (in->arg == 0 ||
            (in->arg & ~(MGC_SCHED_LOAD_TOKENS | MGC_SCHED_LOAD_LABELS | MGC_SCHED_LOAD_DOCS |
                         MGC_SCHED_LOAD_BIAS)) ||
            ((in->arg & MGC_SCHED_LOAD_TOKENS) && s != 0) ||
            ((in->arg & MGC_SCHED_LOAD_LABELS) && s != S - 1)) {
            desc(in, b, sizeof b);
            report(x, K_MALFORMED, "tokens go to virtual stage 0, labels to the last one",
                   "rank %" PRId64 " instruction %" PRId64 " (%s) on virtual stage %" PRId64
                   " of %" PRId64,
                   r, i, b, s, S);
            return -1;
        }
        break;
    case MGC_I_EMBED_GRADS:
        if (pp == 1 || (r != 0 && r != pp - 1)) {
            desc(in, b, sizeof b);
            report(x, K_MALFORMED, "only the first and last pipeline ranks hold the embedding",
                   "rank %" PRId64 " instruction %" PRId64 " (%s) is on no embedding group", r, i,
                   b);
            return -1;
        }
        break;
    default:
        break;
    }
    if (want == -2) {
        desc(in, b, sizeof b);
        report(x, K_MALFORMED, NULL,
               "rank %" PRId64 " instruction %" PRId64 " (%s): virtual stage %" PRId64
               " has no neighbour in that direction",
               r, i, b, s);
        return -1;
    }
    if (want >= 0 && in->peer != want) {
        desc(in, b, sizeof b);
        report(x, K_MALFORMED, NULL,
               "rank %" PRId64 " instruction %" PRId64 " (%s): the neighbouring stage is on rank "
               "%" PRId64,
               r, i, b, want);
        return -1;
    }
    return 0;
}

/* Sort by (link, seq, rank, idx).  The records are made in (rank, idx)
 * order, so a stable sort by (link, seq) alone gives that order: an LSD
 * radix sort over the bytes in which the keys differ (seq first, then link),
 * into tmp and back.  O(n) for the few bytes real streams use (a qsort was
 * O(n log n) comparator calls), and it runs for every simulation of every
 * plan (the compiler's and the cost model's). */
static void lnk_sort(lnk *v, lnk *tmp, int64_t n) {
    if (n < 2) return;
    uint64_t seq_and = ~UINT64_C(0), seq_or = 0, link_and = ~UINT64_C(0), link_or = 0;
    for (int64_t i = 0; i < n; i++) {
        seq_and &= v[i].seq, seq_or |= v[i].seq;
        link_and &= v[i].link, link_or |= v[i].link;
    }
    int passes[16], np = 0; /* byte b of seq: b; of link: 8 + b */
    for (int b = 0; b < 8; b++)
        if (((seq_and ^ seq_or) >> (8 * b)) & 0xff) passes[np++] = b;
    for (int b = 0; b < 8; b++)
        if (((link_and ^ link_or) >> (8 * b)) & 0xff) passes[np++] = 8 + b;
    lnk *src = v, *dst = tmp;
    for (int p = 0; p < np; p++) {
        int sh = 8 * (passes[p] & 7), of_link = passes[p] >= 8;
        int64_t count[257];
        memset(count, 0, sizeof count);
        for (int64_t i = 0; i < n; i++)
            count[((of_link ? src[i].link : src[i].seq) >> sh & 0xff) + 1]++;
        for (int c = 0; c < 256; c++)
            count[c + 1] += count[c];
        for (int64_t i = 0; i < n; i++)
            dst[count[(of_link ? src[i].link : src[i].seq) >> sh & 0xff]++] = src[i];
        lnk *t = src;
        src = dst;
        dst = t;
    }
    if (src != v) memcpy(v, src, (size_t)n * sizeof *v);
}

static int same_key(const lnk *a, const lnk *b) {
    return a->link == b->link && a->seq == b->seq;
}

static void no_partner(sim *x, const lnk *e) {
    char b[160];
    const mgc_instr *in = ins(x, e->rank, e->idx);
    desc(in, b, sizeof b);
    const char *want = in->op == MGC_I_SEND_ACT    ? "RECV_ACT"
                       : in->op == MGC_I_SEND_GRAD ? "RECV_GRAD"
                       : in->op == MGC_I_RECV_ACT  ? "SEND_ACT"
                                                   : "SEND_GRAD";
    report(x, K_UNMATCHED, "every transfer needs both ends, with the same seq on the link",
           "rank %" PRId64 " instruction %" PRId64 " (%s) has no matching %s on rank %" PRId32,
           e->rank, e->idx, b, want, in->peer);
}

static void duplicate(sim *x, const lnk *e, const lnk *first) {
    char b[160];
    desc(ins(x, e->rank, e->idx), b, sizeof b);
    report(x, K_UNMATCHED, "sequence numbers on a link must be distinct",
           "rank %" PRId64 " instruction %" PRId64 " (%s) repeats the seq of instruction %" PRId64,
           e->rank, e->idx, b, first->idx);
}

static void pair(sim *x, const lnk *snd, const lnk *rcv) {
    const mgc_instr *a = ins(x, snd->rank, snd->idx), *b = ins(x, rcv->rank, rcv->idx);
    x->prank[snd->rank][snd->idx] = rcv->rank;
    x->pidx[snd->rank][snd->idx] = rcv->idx;
    x->prank[rcv->rank][rcv->idx] = snd->rank;
    x->pidx[rcv->rank][rcv->idx] = snd->idx;
    int64_t sa = (int64_t)a->chunk * x->pp + snd->rank, sb = (int64_t)b->chunk * x->pp + rcv->rank;
    int ok = a->op == MGC_I_SEND_ACT ? b->op == MGC_I_RECV_ACT && sb == sa + 1
                                     : b->op == MGC_I_RECV_GRAD && sb == sa - 1;
    if (ok && a->mb == b->mb) return;
    char ba[160], bb[160];
    desc(a, ba, sizeof ba);
    desc(b, bb, sizeof bb);
    report(x, K_MISMATCH, "a send and its receive must move the same tensor of one microbatch",
           "rank %" PRId64 " instruction %" PRId64 " (%s) meets rank %" PRId64
           " instruction %" PRId64 " (%s)",
           snd->rank, snd->idx, ba, rcv->rank, rcv->idx, bb);
}

/* Match every send with the receive of the same (link, seq). */
static int match(sim *x) {
    int64_t ns = 0, nr = 0;
    for (int64_t r = 0; r < x->pp; r++)
        for (int64_t i = 0; i < x->s->ranks[r].n; i++) {
            int op = ins(x, r, i)->op;
            ns += is_send(op);
            nr += is_recv(op);
        }
    lnk *sv = malloc((size_t)(ns ? ns : 1) * sizeof *sv);
    lnk *rv = malloc((size_t)(nr ? nr : 1) * sizeof *rv);
    lnk *tmp = malloc((size_t)(ns > nr ? ns : nr ? nr : 1) * sizeof *tmp);
    if (!sv || !rv || !tmp) {
        free(sv);
        free(rv);
        free(tmp);
        return -1;
    }
    ns = nr = 0;
    for (int64_t r = 0; r < x->pp; r++)
        for (int64_t i = 0; i < x->s->ranks[r].n; i++) {
            const mgc_instr *in = ins(x, r, i);
            if (is_send(in->op))
                sv[ns++] = (lnk){(uint64_t)r * (uint64_t)x->pp + (uint64_t)in->peer, in->seq, r, i};
            else if (is_recv(in->op))
                rv[nr++] = (lnk){(uint64_t)in->peer * (uint64_t)x->pp + (uint64_t)r, in->seq, r, i};
        }
    lnk_sort(sv, tmp, ns);
    lnk_sort(rv, tmp, nr);
    free(tmp);
    int64_t i = 0, j = 0;
    while (i < ns || j < nr) {
        int c = i < ns && j < nr ? (sv[i].link != rv[j].link ? (sv[i].link < rv[j].link ? -1 : 1)
                                    : sv[i].seq != rv[j].seq ? (sv[i].seq < rv[j].seq ? -1 : 1)
                                                             : 0)
                : i < ns         ? -1
                                 : 1;
        if (c == 0) {
            pair(x, &sv[i], &rv[j]);
            i++, j++;
            while (i < ns && same_key(&sv[i], &sv[i - 1]))
                duplicate(x, &sv[i], &sv[i - 1]), i++;
            while (j < nr && same_key(&rv[j], &rv[j - 1]))
                duplicate(x, &rv[j], &rv[j - 1]), j++;
        } else if (c < 0) {
            no_partner(x, &sv[i++]);
        } else {
            no_partner(x, &rv[j++]);
        }
    }
    free(sv);
    free(rv);
    return 0;
}

/* Messages on a link are matched in order by the runtime (NCCL has no
 * tags): each side's seq must rise along its stream.  Also records every
 * send's position on its link for the buffered model. */
static int link_order(sim *x) {
    for (int64_t r = 0; r < x->pp; r++) {
        uint64_t last[2][2];
        int64_t at[2][2] = {{-1, -1}, {-1, -1}};
        int64_t cnt[2] = {0, 0};
        for (int64_t i = 0; i < x->s->ranks[r].n; i++) {
            const mgc_instr *in = ins(x, r, i);
            if (!is_p2p(in->op)) continue;
            int sl = slot(x->pp, r, in->peer), dir = is_send(in->op);
            if (at[sl][dir] >= 0 && in->seq <= last[sl][dir]) {
                char b[160];
                desc(in, b, sizeof b);
                report(x, K_MISMATCH, "the runtime matches a link's messages in stream order",
                       "rank %" PRId64 " instruction %" PRId64 " (%s) comes after seq %" PRIu64
                       " at instruction %" PRId64 " on the same link",
                       r, i, b, last[sl][dir], at[sl][dir]);
            }
            last[sl][dir] = in->seq;
            at[sl][dir] = i;
            if (dir) x->spos[r][i] = cnt[sl]++;
        }
        for (int sl = 0; sl < 2; sl++) {
            x->lsend[r * 2 + sl] = malloc((size_t)(cnt[sl] ? cnt[sl] : 1) * sizeof(int64_t));
            if (!x->lsend[r * 2 + sl]) return -1;
            x->nlsend[r * 2 + sl] = 0;
        }
        for (int64_t i = 0; i < x->s->ranks[r].n; i++) {
            const mgc_instr *in = ins(x, r, i);
            if (!is_send(in->op)) continue;
            int sl = slot(x->pp, r, in->peer);
            x->lsend[r * 2 + sl][x->nlsend[r * 2 + sl]++] = i;
        }
    }
    return 0;
}

/* ---- execution and checks --------------------------------------------------- */

static double cost_of(sim *x, int64_t r, int64_t i) {
    const mgc_instr *in = ins(x, r, i);
    double c = x->cost(x->user, r, in);
    if (!(c >= 0) || isinf(c)) {
        char b[160];
        desc(in, b, sizeof b);
        report(x, K_MALFORMED, "a cost callback must return a finite duration >= 0",
               "rank %" PRId64 " instruction %" PRId64 " (%s): cost %g", r, i, b, c);
        return 0;
    }
    return c;
}

static void effects(sim *x, int64_t r, int64_t i) {
    const mgc_instr *in = ins(x, r, i);
    char b[160];
    int64_t S = x->S, total = x->vp * x->m;
    int64_t s = (int64_t)in->chunk * x->pp + r;
    uint8_t *f = per_mb(in->op) ? &x->st[r][(int64_t)in->mb * x->vp + in->chunk] : NULL;
    mgc_sim_rank *R = &x->r->ranks[r];
    switch (in->op) {
    case MGC_I_LOAD_BATCH:
        if (in->arg & MGC_SCHED_LOAD_TOKENS) *f |= S_TOK;
        if (in->arg & MGC_SCHED_LOAD_LABELS) *f |= S_LAB;
        break;
    case MGC_I_FORWARD:
        if ((*f & S_FWD) || (s > 0 && !(*f & S_IN)) || (s == 0 && !(*f & S_TOK)) ||
            (s == S - 1 && !(*f & S_LAB)))
            desc(in, b, sizeof b); /* only when something is reported */
        if (*f & S_FWD)
            report(x, K_ORDER, NULL, "rank %" PRId64 " instruction %" PRId64 " (%s) runs twice", r,
                   i, b);
        if (s > 0 && !(*f & S_IN))
            report(x, K_INPUT, "receive the activation (RECV_ACT) before the forward",
                   "rank %" PRId64 " instruction %" PRId64 " (%s, virtual stage %" PRId64
                   ") runs before its input arrived",
                   r, i, b, s);
        if (s == 0 && !(*f & S_TOK))
            report(x, K_INPUT, "LOAD_BATCH the tokens before the first stage's forward",
                   "rank %" PRId64 " instruction %" PRId64 " (%s) runs before its tokens were "
                   "loaded",
                   r, i, b);
        if (s == S - 1 && !(*f & S_LAB))
            report(x, K_INPUT, "LOAD_BATCH the labels before the last stage's forward",
                   "rank %" PRId64 " instruction %" PRId64 " (%s) runs before its labels were "
                   "loaded",
                   r, i, b);
        if (!(*f & S_FWD)) {
            x->infl[r]++;
            int64_t c = ++x->infl_c[r * x->vp + in->chunk];
            if (x->infl[r] > R->peak_in_flight) R->peak_in_flight = x->infl[r];
            if (c > R->peak_in_flight_chunk[in->chunk]) R->peak_in_flight_chunk[in->chunk] = c;
        }
        if ((*f & S_IN) && !(*f & S_IN_USED)) {
            x->pend[r]--;
            *f |= S_IN_USED;
        }
        *f |= S_FWD;
        break;
    case MGC_I_BACKWARD:
        if (!(*f & S_FWD) || (*f & S_BWD) || (s < S - 1 && !(*f & S_GRAD))) desc(in, b, sizeof b);
        if (!(*f & S_FWD))
            report(x, K_ORDER, "run the forward of a microbatch's chunk before its backward",
                   "rank %" PRId64 " instruction %" PRId64 " (%s) runs before its forward", r, i,
                   b);
        if (*f & S_BWD)
            report(x, K_ORDER, NULL, "rank %" PRId64 " instruction %" PRId64 " (%s) runs twice", r,
                   i, b);
        if (s < S - 1 && !(*f & S_GRAD))
            report(x, K_INPUT, "receive the output gradient (RECV_GRAD) before the backward",
                   "rank %" PRId64 " instruction %" PRId64 " (%s, virtual stage %" PRId64
                   ") runs before its output gradient arrived",
                   r, i, b, s);
        if ((*f & S_FWD) && !(*f & S_BWD)) {
            x->infl[r]--;
            x->infl_c[r * x->vp + in->chunk]--;
        }
        if (!(*f & S_BWD)) x->bwd_done[r]++;
        if ((*f & S_GRAD) && !(*f & S_GRAD_USED)) {
            x->pend[r]--;
            *f |= S_GRAD_USED;
        }
        *f |= S_BWD;
        break;
    case MGC_I_SEND_ACT:
    case MGC_I_SEND_GRAD:
        if (!(*f & (in->op == MGC_I_SEND_ACT ? S_FWD : S_BWD))) {
            desc(in, b, sizeof b);
            report(x, K_INPUT, "send a tensor after the pass that computes it",
                   "rank %" PRId64 " instruction %" PRId64 " (%s) sends what its %s has not "
                   "computed yet",
                   r, i, b, in->op == MGC_I_SEND_ACT ? "forward" : "backward");
        }
        break;
    case MGC_I_RECV_ACT:
    case MGC_I_RECV_GRAD: {
        uint8_t bit = in->op == MGC_I_RECV_ACT ? S_IN : S_GRAD;
        if (*f & bit) {
            desc(in, b, sizeof b);
            report(x, K_ORDER, NULL, "rank %" PRId64 " instruction %" PRId64 " (%s) receives twice",
                   r, i, b);
        } else {
            *f |= bit;
            if (++x->pend[r] > R->peak_pending_recv) R->peak_pending_recv = x->pend[r];
        }
        break;
    }
    case MGC_I_GATHER_PARAMS:
        if (!x->opt_done[r] && !x->tail_early[r]) {
            x->tail_early[r] = 1;
            report(x, K_ORDER, "gather parameters after the optimizer has updated them",
                   "rank %" PRId64 " instruction %" PRId64 " (GATHER_PARAMS) runs before OPTIMIZER",
                   r, i);
        }
        /* fall through */
    case MGC_I_REDUCE_GRADS:
    case MGC_I_EMBED_GRADS:
    case MGC_I_OPTIMIZER:
        if (x->bwd_done[r] < total && !x->tail_early[r]) {
            x->tail_early[r] = 1;
            desc(in, b, sizeof b);
            report(x, K_ORDER, "reduce gradients and step only after the last backward",
                   "rank %" PRId64 " instruction %" PRId64 " (%s) runs after %" PRId64
                   " of %" PRId64 " backwards",
                   r, i, b, x->bwd_done[r], total);
        }
        if (in->op == MGC_I_OPTIMIZER) x->opt_done[r] = 1;
        break;
    default:
        break;
    }
}

static void wake(sim *x, int64_t r) {
    if (x->queued[r]) return;
    x->queued[r] = 1;
    x->work[(x->work_head + x->work_len++) % x->pp] = r;
}

static void finish(sim *x, int64_t r, int64_t i, double t0, double t1) {
    mgc_sim_rank *R = &x->r->ranks[r];
    int op = ins(x, r, i)->op;
    R->start[i] = t0;
    R->end[i] = t1;
    if (op == MGC_I_FORWARD || op == MGC_I_BACKWARD)
        R->compute += t1 - t0;
    else if (op == MGC_I_LOAD_BATCH || op == MGC_I_OPTIMIZER)
        R->other += t1 - t0;
    else
        R->comm += t1 - t0;
    x->clk[r] = t1;
    x->pc[r] = i + 1;
    effects(x, r, i);
    /* whoever may wait on this rank */
    wake(x, (r + 1) % x->pp);
    wake(x, (r + x->pp - 1) % x->pp);
    if (i + 1 < x->s->ranks[r].n) {
        int op2 = ins(x, r, i + 1)->op;
        if (op2 == MGC_I_EMBED_GRADS || op2 == MGC_I_OPTIMIZER) wake(x, 0);
    }
}

static int done(const sim *x, int64_t r, int64_t i) {
    return x->pc[r] > i;
}

/* Members of a collective's group, lowest first: the embedding group is the
 * first and last rank, the optimizer's (gradient norm) is every rank. */
static int64_t members(const sim *x, int op, int64_t k) {
    if (op == MGC_I_EMBED_GRADS) return k == 0 ? 0 : k == 1 ? x->pp - 1 : -1;
    return k < x->pp ? k : -1;
}

/* The member of the collective at rank 0's pc that is not there yet; -1
 * when all are.  Members found waiting stay blocked until the collective
 * runs, so the scan resumes where it stopped (x->coll_seen). */
static int64_t coll_missing(sim *x) {
    const mgc_instr *in = ins(x, 0, x->pc[0]);
    for (int64_t k = x->coll_seen;; k++) {
        int64_t q = members(x, in->op, k);
        if (q < 0) return -1;
        if (x->pc[q] >= x->s->ranks[q].n) return q;
        const mgc_instr *o = ins(x, q, x->pc[q]);
        if (o->op != in->op || o->seq != in->seq) return q;
        x->coll_seen = k + 1;
    }
}

/* Try to run rank r's next instruction; 1 when it (and maybe a partner) ran. */
static int step(sim *x, int64_t r) {
    int64_t i = x->pc[r];
    if (i >= x->s->ranks[r].n) return 0;
    const mgc_instr *in = ins(x, r, i);
    double t = x->clk[r];
    if (is_p2p(in->op)) {
        int64_t q = x->prank[r][i], j = x->pidx[r][i];
        if (x->cap == 0) { /* rendezvous: both ends at the transfer */
            if (q < 0 || x->pc[q] != j) return 0;
            double t0 = t > x->clk[q] ? t : x->clk[q];
            double ca = cost_of(x, r, i), cb = cost_of(x, q, j);
            double t1 = t0 + (ca > cb ? ca : cb);
            finish(x, r, i, t0, t1);
            finish(x, q, j, t0, t1);
            return 1;
        }
        if (is_send(in->op)) { /* room on the link once message pos - cap was received */
            int64_t pos = x->spos[r][i];
            if (x->cap != MGC_SIM_UNBOUNDED && pos >= x->cap) {
                int sl = slot(x->pp, r, in->peer);
                int64_t i2 = x->lsend[r * 2 + sl][pos - x->cap];
                int64_t q2 = x->prank[r][i2], j2 = x->pidx[r][i2];
                if (q2 < 0 || !done(x, q2, j2)) return 0;
                if (x->r->ranks[q2].end[j2] > t) t = x->r->ranks[q2].end[j2];
            }
        } else { /* a receive waits for the message */
            if (q < 0 || !done(x, q, j)) return 0;
            if (x->r->ranks[q].end[j] > t) t = x->r->ranks[q].end[j];
        }
        finish(x, r, i, t, t + cost_of(x, r, i));
        return 1;
    }
    if (in->op == MGC_I_EMBED_GRADS || in->op == MGC_I_OPTIMIZER) {
        /* the lowest member starts the collective once all are there */
        if (r != 0 || coll_missing(x) >= 0) return 0;
        x->coll_seen = 0;
        double t0 = t, du = 0;
        for (int64_t k = 0, q; (q = members(x, in->op, k)) >= 0; k++) {
            if (x->clk[q] > t0) t0 = x->clk[q];
            double c = cost_of(x, q, x->pc[q]);
            if (c > du) du = c;
        }
        for (int64_t k = 0, q; (q = members(x, in->op, k)) >= 0; k++)
            finish(x, q, x->pc[q], t0, t0 + du);
        return 1;
    }
    finish(x, r, i, t, t + cost_of(x, r, i));
    return 1;
}

/* ---- deadlock --------------------------------------------------------------- */

/* Whom rank r (blocked) waits on: a rank, or -1 when the instruction it
 * waits for does not exist; *why gets the reason. */
static int64_t waits_on(sim *x, int64_t r, const char **why) {
    int64_t i = x->pc[r];
    const mgc_instr *in = ins(x, r, i);
    *why = "";
    if (in->op == MGC_I_EMBED_GRADS || in->op == MGC_I_OPTIMIZER) {
        /* rank 0 starts collectives: others wait for it; it waits for the
         * first member that has not arrived */
        int64_t q = 0;
        if (r == 0) {
            const mgc_instr *o = ins(x, 0, x->pc[0]);
            q = -1;
            for (int64_t k = 0, m; q < 0 && (m = members(x, o->op, k)) >= 0; k++)
                if (x->pc[m] >= x->s->ranks[m].n || ins(x, m, x->pc[m])->op != o->op ||
                    ins(x, m, x->pc[m])->seq != o->seq)
                    q = m;
        }
        *why = " to join the collective";
        return q;
    }
    int64_t q = x->prank[r][i];
    if (q < 0) {
        *why = ", whose other end does not exist";
        return -1;
    }
    if (x->cap != 0 && is_send(in->op) && x->cap != MGC_SIM_UNBOUNDED) {
        int sl = slot(x->pp, r, in->peer);
        int64_t i2 = x->lsend[r * 2 + sl][x->spos[r][i] - x->cap];
        *why = " to take an earlier message off the full link";
        if (x->prank[r][i2] < 0) {
            *why = ": an earlier message on the link is never received";
            return -1;
        }
        return x->prank[r][i2];
    }
    return q;
}

static void deadlock(sim *x) {
    int64_t pp = x->pp, r0 = -1, nstuck = 0;
    for (int64_t r = 0; r < pp; r++)
        if (x->pc[r] < x->s->ranks[r].n) {
            if (r0 < 0) r0 = r;
            nstuck++;
        }
    if (r0 < 0) return;
    int64_t *seen = calloc((size_t)pp, sizeof *seen); /* 1 + position in the chain */
    char msg[900], b[160];
    size_t len = 0;
    len += (size_t)snprintf(
        msg + len, sizeof msg - len,
        "deadlock: no rank can progress (%" PRId64 " of %" PRId64 " blocked): ", nstuck, pp);
    int64_t r = r0, hops = 0, cycle = 0;
    while (len < sizeof msg - 200) {
        if (seen) seen[r] = ++hops;
        const char *why;
        int64_t q = waits_on(x, r, &why);
        desc(ins(x, r, x->pc[r]), b, sizeof b);
        len += (size_t)snprintf(msg + len, sizeof msg - len,
                                "%srank %" PRId64 " waits at instruction %" PRId64 " (%s)",
                                hops > 1 ? "; " : "", r, x->pc[r], b);
        if (q < 0) {
            len += (size_t)snprintf(msg + len, sizeof msg - len, "%s", why);
            break;
        }
        len += (size_t)snprintf(msg + len, sizeof msg - len, " on rank %" PRId64 "%s", q, why);
        if (x->pc[q] >= x->s->ranks[q].n) {
            len += (size_t)snprintf(msg + len, sizeof msg - len, ", which has finished its stream");
            break;
        }
        if (seen && seen[q]) {
            cycle = 1;
            len += (size_t)snprintf(msg + len, sizeof msg - len, " (a cycle)");
            break;
        }
        if (hops > 8) {
            snprintf(msg + len, sizeof msg - len, "; ...");
            break;
        }
        r = q;
    }
    report(x, K_DEADLOCK,
           cycle ? "both ends of each link must list their transfers in the same order"
                 : "every blocking instruction needs its counterpart on the other rank",
           "%s", msg);
    x->r->n_deadlock = 1;
    int notes = 0;
    for (int64_t q = 0; q < pp && notes < x->max_reports; q++)
        if (x->pc[q] < x->s->ranks[q].n && !(seen && seen[q])) {
            desc(ins(x, q, x->pc[q]), b, sizeof b);
            mgc_diag(x->d, MGC_SEV_NOTE, x->s->loc, NULL,
                     "schedule: rank %" PRId64 " is also blocked at instruction %" PRId64 " (%s)",
                     q, x->pc[q], b);
            notes++;
        }
    free(seen);
}

/* ---- metrics and the driver -------------------------------------------------- */

static void missing(sim *x) {
    for (int64_t r = 0; r < x->pp; r++)
        for (int64_t mb = 0; mb < x->m; mb++)
            for (int64_t c = 0; c < x->vp; c++) {
                uint8_t f = x->st[r][mb * x->vp + c];
                if (!(f & S_FWD))
                    report(x, K_MISSING, "every rank runs each (microbatch, chunk) once",
                           "rank %" PRId64 " never runs the forward of microbatch %" PRId64
                           " chunk %" PRId64,
                           r, mb, c);
                if (!(f & S_BWD))
                    report(x, K_MISSING, "every rank runs each (microbatch, chunk) once",
                           "rank %" PRId64 " never runs the backward of microbatch %" PRId64
                           " chunk %" PRId64,
                           r, mb, c);
            }
}

static void metrics(sim *x) {
    mgc_sim_result *res = x->r;
    double T = 0, idle = 0, comp = 0, frac = 0;
    for (int64_t r = 0; r < x->pp; r++) {
        res->ranks[r].finish = x->clk[r];
        if (x->clk[r] > T) T = x->clk[r];
    }
    for (int64_t r = 0; r < x->pp; r++) {
        mgc_sim_rank *R = &res->ranks[r];
        R->idle = T - R->compute - R->other - R->comm;
        if (R->idle < 0) R->idle = 0;
        idle += R->idle;
        comp += R->compute;
        frac += T > 0 ? R->idle / T : 0;
        if (R->peak_in_flight > res->peak_in_flight) res->peak_in_flight = R->peak_in_flight;
    }
    res->makespan = T;
    res->bubble_fraction = frac / (double)x->pp;
    res->bubble_ratio = comp > 0 ? idle / comp : 0;
}

void mgc_sim_result_free(mgc_sim_result *r) {
    if (!r) return;
    if (r->ranks)
        for (int64_t i = 0; i < r->pp; i++) {
            free(r->ranks[i].peak_in_flight_chunk);
            free(r->ranks[i].start);
            free(r->ranks[i].end);
        }
    free(r->ranks);
    memset(r, 0, sizeof *r);
}

static void sim_free(sim *x) {
    for (int64_t r = 0; r < x->pp; r++) {
        if (x->prank) free(x->prank[r]);
        if (x->pidx) free(x->pidx[r]);
        if (x->spos) free(x->spos[r]);
        if (x->st) free(x->st[r]);
        if (x->lsend) free(x->lsend[2 * r]), free(x->lsend[2 * r + 1]);
    }
    free(x->prank);
    free(x->pidx);
    free(x->spos);
    free(x->st);
    free(x->lsend);
    free(x->nlsend);
    free(x->pc);
    free(x->clk);
    free(x->bwd_done);
    free(x->infl);
    free(x->infl_c);
    free(x->pend);
    free(x->opt_done);
    free(x->tail_early);
    free(x->work);
    free(x->queued);
}

static int sim_alloc(sim *x) {
    int64_t pp = x->pp;
    size_t P = (size_t)pp;
    mgc_sim_result *res = x->r;
    res->ranks = calloc(P, sizeof *res->ranks);
    x->prank = calloc(P, sizeof *x->prank);
    x->pidx = calloc(P, sizeof *x->pidx);
    x->spos = calloc(P, sizeof *x->spos);
    x->st = calloc(P, sizeof *x->st);
    x->lsend = calloc(2 * P, sizeof *x->lsend);
    x->nlsend = calloc(2 * P, sizeof *x->nlsend);
    x->pc = calloc(P, sizeof *x->pc);
    x->clk = calloc(P, sizeof *x->clk);
    x->bwd_done = calloc(P, sizeof *x->bwd_done);
    x->infl = calloc(P, sizeof *x->infl);
    x->infl_c = calloc(P * (size_t)x->vp, sizeof *x->infl_c);
    x->pend = calloc(P, sizeof *x->pend);
    x->opt_done = calloc(P, 1);
    x->tail_early = calloc(P, 1);
    x->work = calloc(P, sizeof *x->work);
    x->queued = calloc(P, 1);
    if (!x->work || !x->queued || !res->ranks || !x->prank || !x->pidx || !x->spos || !x->st ||
        !x->lsend || !x->nlsend || !x->pc || !x->clk || !x->bwd_done || !x->infl || !x->infl_c ||
        !x->pend || !x->opt_done || !x->tail_early)
        return -1;
    res->pp = pp;
    res->vp = x->vp;
    for (int64_t r = 0; r < pp; r++) {
        size_t n = (size_t)(x->s->ranks[r].n ? x->s->ranks[r].n : 1);
        mgc_sim_rank *R = &res->ranks[r];
        R->peak_in_flight_chunk = calloc((size_t)x->vp, sizeof *R->peak_in_flight_chunk);
        R->start = malloc(n * sizeof *R->start);
        R->end = malloc(n * sizeof *R->end);
        x->prank[r] = malloc(n * sizeof **x->prank);
        x->pidx[r] = malloc(n * sizeof **x->pidx);
        x->spos[r] = malloc(n * sizeof **x->spos);
        x->st[r] = calloc((size_t)(x->m * x->vp), 1);
        if (!R->peak_in_flight_chunk || !R->start || !R->end || !x->prank[r] || !x->pidx[r] ||
            !x->spos[r] || !x->st[r])
            return -1;
        for (int64_t i = 0; i < x->s->ranks[r].n; i++) {
            R->start[i] = R->end[i] = -1;
            x->prank[r][i] = x->pidx[r][i] = x->spos[r][i] = -1;
        }
        /* forwards before the first backward, from the stream */
        for (int64_t i = 0; i < x->s->ranks[r].n; i++) {
            int op = x->s->ranks[r].instrs[i].op;
            if (op == MGC_I_BACKWARD) break;
            R->forwards_before_first_backward += op == MGC_I_FORWARD;
        }
    }
    return 0;
}

int mgc_schedule_simulate(const mgc_schedule *s, const mgc_sim_options *opt, mgc_sim_result *out,
                          mgc_diags *d) {
    memset(out, 0, sizeof *out);
    sim x;
    memset(&x, 0, sizeof x);
    x.s = s;
    x.r = out;
    x.d = d;
    x.cost = opt && opt->cost ? opt->cost : mgc_schedule_cost_uniform;
    x.user = opt ? opt->cost_user : NULL;
    x.cap = !opt || opt->link_buffer == 0            ? MGC_SIM_DEFAULT_LINK_BUFFER
            : opt->link_buffer == MGC_SIM_RENDEZVOUS ? 0
                                                     : opt->link_buffer;
    x.max_reports = opt && opt->max_reports > 0 ? opt->max_reports : 8;
    x.pp = s->pp;
    x.vp = s->vp;
    x.m = s->m;
    x.S = s->pp * s->vp;
    if (x.pp < 1 || x.vp < 1 || x.m < 1 || x.cap < 0 || !s->ranks) {
        mgc_diag(d, MGC_SEV_ERROR, s->loc, NULL,
                 "schedule: cannot simulate p=%" PRId64 ", v=%" PRId64 ", m=%" PRId64
                 " with link buffer %" PRId64,
                 x.pp, x.vp, x.m, opt ? opt->link_buffer : 0);
        out->n_malformed = 1;
        return -1;
    }
    int rc = -1;
    if (sim_alloc(&x)) goto oom;
    for (int64_t r = 0; r < x.pp; r++)
        for (int64_t i = 0; i < s->ranks[r].n; i++)
            check_fields(&x, r, i);
    if (out->n_malformed) goto end; /* indices are not to be trusted */
    if (match(&x) || link_order(&x)) goto oom;

    for (int64_t r = 0; r < x.pp; r++)
        wake(&x, r);
    while (x.work_len) {
        int64_t r = x.work[x.work_head];
        x.work_head = (x.work_head + 1) % x.pp;
        x.work_len--;
        x.queued[r] = 0;
        while (step(&x, r)) {
        }
    }
    deadlock(&x);
    if (!out->n_deadlock) missing(&x);
    metrics(&x);
    goto end;
oom:
    mgc_diag(d, MGC_SEV_ERROR, s->loc, NULL, "schedule: out of memory in the simulator");
    out->n_malformed++;
end:
    for (int k = 0; k < K__COUNT; k++) {
        int64_t n = *counter(out, k);
        if (n > x.max_reports)
            mgc_diag(d, MGC_SEV_NOTE, s->loc, NULL,
                     "schedule: %" PRId64 " more %s problems not shown", n - x.max_reports,
                     kind_names[k]);
    }
    out->ok = !out->n_malformed && !out->n_unmatched && !out->n_mismatch && !out->n_deadlock &&
              !out->n_order && !out->n_input && !out->n_missing;
    rc = out->ok ? 0 : -1;
    sim_free(&x);
    return rc;
}
