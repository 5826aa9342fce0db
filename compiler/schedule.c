/* schedule.c - parameters and the stream builder; see schedule.h.
 *
 * Layout of this file:
 *   names         instruction names and one-line formatting
 *   parameters    from a config, the checks, warm-up and closed forms
 *   compute order the forwards and backwards of each rank (GPipe, 1F1B,
 *                 interleaved 1F1B with Megatron's schedule table)
 *   ideal times   as-soon-as-possible times of that order with forward 1,
 *                 backward 2 and free communication
 *   messages      where each transfer goes in both streams: one global
 *                 order (time, then message id), so no wait cycle can form
 *   streams       merge, number the links, batch loads, step tail
 *
 * The simulator is schedule_sim.c, the charts timeline.c. */
#include "schedule.h"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

/* ---- names --------------------------------------------------------------- */

static const char *const op_names[MGC_I__COUNT] = {
    "LOAD_BATCH", "FORWARD",      "BACKWARD",    "SEND_ACT",  "RECV_ACT",      "SEND_GRAD",
    "RECV_GRAD",  "REDUCE_GRADS", "EMBED_GRADS", "OPTIMIZER", "GATHER_PARAMS",
};

const char *mgc_instr_op_name(int op) {
    return op >= 0 && op < MGC_I__COUNT ? op_names[op] : "?";
}

void mgc_instr_format(const mgc_instr *in, char *buf, size_t bufsz) {
    if (!bufsz) return;
    const char *name = mgc_instr_op_name(in->op);
    switch (in->op) {
    case MGC_I_LOAD_BATCH: { /* the loaded parts joined by '+' */
        static const char *const part[4] = {"tokens", "labels", "docs", "bias"};
        char what[32] = "";
        for (int b = 0; b < 4; b++)
            if (in->arg & (1u << b))
                snprintf(what + strlen(what), sizeof what - strlen(what), "%s%s",
                         *what ? "+" : "", part[b]);
        snprintf(buf, bufsz, "%s mb %" PRId32 " chunk %u %s", name, in->mb, (unsigned)in->chunk,
                 !in->arg || in->arg > 15u ? "(bad arg)" : what);
        break;
    }
    case MGC_I_FORWARD:
    case MGC_I_BACKWARD:
        snprintf(buf, bufsz, "%s mb %" PRId32 " chunk %u", name, in->mb, (unsigned)in->chunk);
        break;
    case MGC_I_SEND_ACT:
    case MGC_I_SEND_GRAD:
    case MGC_I_RECV_ACT:
    case MGC_I_RECV_GRAD:
        snprintf(buf, bufsz, "%s mb %" PRId32 " chunk %u %s rank %" PRId32 " seq %" PRIu64, name,
                 in->mb, (unsigned)in->chunk,
                 in->op == MGC_I_SEND_ACT || in->op == MGC_I_SEND_GRAD ? "to" : "from", in->peer,
                 in->seq);
        break;
    case MGC_I_REDUCE_GRADS:
    case MGC_I_GATHER_PARAMS:
        snprintf(buf, bufsz, "%s bucket %" PRIu32 " seq %" PRIu64, name, in->arg, in->seq);
        break;
    case MGC_I_EMBED_GRADS:
    case MGC_I_OPTIMIZER:
        snprintf(buf, bufsz, "%s seq %" PRIu64, name, in->seq);
        break;
    default:
        snprintf(buf, bufsz, "op %u (unknown)", (unsigned)in->op);
        break;
    }
}

/* ---- parameters ---------------------------------------------------------- */

void mgc_schedule_params_from_config(const mgc_config *c, int64_t grad_buckets,
                                     mgc_schedule_params *out) {
    memset(out, 0, sizeof *out);
    out->schedule = c->parallel.schedule;
    out->pp = c->parallel.pipeline;
    out->vp = c->parallel.virtual_stages;
    out->num_microbatches = c->derived.num_microbatches;
    out->group = c->parallel.microbatch_group_size;
    out->grad_buckets = grad_buckets;
    out->distributed_optimizer = c->parallel.distributed_optimizer;
    out->tied_embeddings = c->model.tie_embeddings;
    int docs = c->data.reset_attention_mask || c->data.reset_position_ids;
    int bias = c->moe.num_experts > 0 && c->moe.expert_bias_update_rate > 0;
    out->load_every = (docs ? MGC_SCHED_LOAD_DOCS : 0) | (bias ? MGC_SCHED_LOAD_BIAS : 0);
    out->loc = mgc_config_loc(c, MGC_KEY_PAR_SCHEDULE);
}

uint32_t mgc_schedule_plan_load_every(const mgc_plan *p) {
    int64_t docs = 0, pos = 0;
    double rate = 0;
    int d = (mgc_plan_config_int(p, "data.reset_attention_mask", &docs) && docs) ||
            (mgc_plan_config_int(p, "data.reset_position_ids", &pos) && pos);
    int b = mgc_plan_config_float(p, "moe.expert_bias_update_rate", &rate) && rate > 0;
    return (d ? MGC_SCHED_LOAD_DOCS : 0) | (b ? MGC_SCHED_LOAD_BIAS : 0);
}

static const char *sched_name(int s) {
    static const char *const n[] = {"gpipe", "1f1b", "interleaved-1f1b"};
    return s >= 0 && s < 3 ? n[s] : "?";
}

/* The group size the schedule uses: G when interleaved (0 means pp). */
static int64_t eff_group(const mgc_schedule_params *p) {
    return p->schedule == MGC_SCHED_INTERLEAVED && p->group != 0 ? p->group : p->pp;
}

int mgc_schedule_check(const mgc_schedule_params *p, mgc_diags *d) {
    int e0 = d->errors;
    char hint[256];
    mgc_loc at = p->loc;
    int shape_ok = 1;
    if (p->schedule != MGC_SCHED_GPIPE && p->schedule != MGC_SCHED_1F1B &&
        p->schedule != MGC_SCHED_INTERLEAVED) {
        mgc_diag(d, MGC_SEV_ERROR, at, "use gpipe, 1f1b or interleaved-1f1b",
                 "schedule: unknown schedule %d", p->schedule);
        shape_ok = 0;
    }
    if (p->pp < 1 || p->pp > MGC_SCHED_MAX_PP) {
        mgc_diag(d, MGC_SEV_ERROR, at, "choose a pipeline degree from 1 to 65536",
                 "schedule: pipeline degree %" PRId64 " is out of range", p->pp);
        shape_ok = 0;
    }
    if (p->vp < 1 || p->vp > MGC_SCHED_MAX_VP) {
        mgc_diag(d, MGC_SEV_ERROR, at, "choose virtual stages from 1 to 1024",
                 "schedule: %" PRId64 " virtual stages per rank is out of range", p->vp);
        shape_ok = 0;
    }
    if (p->num_microbatches < 1 || p->num_microbatches > MGC_SCHED_MAX_MB) {
        snprintf(hint, sizeof hint, "choose from 1 to %d microbatches per step", MGC_SCHED_MAX_MB);
        mgc_diag(d, MGC_SEV_ERROR, at, hint,
                 "schedule: %" PRId64 " microbatches per step is out of range",
                 p->num_microbatches);
        shape_ok = 0;
    }
    if (p->grad_buckets < 0 || p->grad_buckets > MGC_SCHED_MAX_BUCKETS)
        mgc_diag(d, MGC_SEV_ERROR, at, "use 0 to 1048576 buckets",
                 "schedule: %" PRId64 " gradient buckets is out of range", p->grad_buckets);
    if (p->rank_buckets && p->pp >= 1 && p->pp <= MGC_SCHED_MAX_PP)
        for (int64_t r = 0; r < p->pp; r++)
            if (p->rank_buckets[r] < 0 || p->rank_buckets[r] > MGC_SCHED_MAX_BUCKETS) {
                mgc_diag(d, MGC_SEV_ERROR, at, "use 0 to 1048576 buckets",
                         "schedule: pipeline rank %" PRId64 " has %" PRId64
                         " gradient buckets, out of range",
                         r, p->rank_buckets[r]);
                break;
            }
    if (!shape_ok) return -1;

    int64_t pp = p->pp, vp = p->vp, m = p->num_microbatches;
    if ((double)pp * (double)vp * (double)m > (double)MGC_SCHED_MAX_WORK) {
        mgc_diag(d, MGC_SEV_ERROR, at, "lower the pipeline degree, virtual stages or microbatches",
                 "schedule: pipeline %" PRId64 " x virtual stages %" PRId64
                 " x microbatches %" PRId64 " is more than %d forward passes per step",
                 pp, vp, m, MGC_SCHED_MAX_WORK);
        return -1;
    }
    if (vp > 1 && pp == 1) {
        mgc_diag(d, MGC_SEV_ERROR, at, "use one virtual stage, or a pipeline degree > 1",
                 "schedule: %" PRId64 " virtual stages need a pipeline to interleave over, but "
                 "the pipeline degree is 1",
                 vp);
        return -1;
    }
    if (vp > 1 && p->schedule != MGC_SCHED_INTERLEAVED) {
        mgc_diag(d, MGC_SEV_ERROR, at, "use interleaved-1f1b",
                 "schedule: %s runs one chunk per rank, but there are %" PRId64
                 " virtual stages per rank",
                 sched_name(p->schedule), vp);
        return -1;
    }
    if (p->schedule != MGC_SCHED_INTERLEAVED) return d->errors > e0 ? -1 : 0;
    if (vp == 1) {
        mgc_diag(d, MGC_SEV_ERROR, at, "use 1f1b, or two or more virtual stages",
                 "schedule: interleaved-1f1b needs more than one virtual stage per rank");
        return -1;
    }
    int64_t g = eff_group(p);
    if (g < pp) {
        snprintf(hint, sizeof hint, "use a microbatch group size of at least %" PRId64, pp);
        mgc_diag(d, MGC_SEV_ERROR, at, hint,
                 "schedule: microbatch group size %" PRId64
                 " is smaller than the pipeline degree %" PRId64
                 ": the schedule would wait on microbatches it has not started",
                 g, pp);
        return -1;
    }
    if (m < g) {
        snprintf(hint, sizeof hint, "use at least %" PRId64 " microbatches, or a smaller group", g);
        mgc_diag(d, MGC_SEV_ERROR, at, hint,
                 "schedule: interleaving in groups of %" PRId64
                 " microbatches needs at least that many, but there are %" PRId64,
                 g, m);
        return -1;
    }
    if (m % g != 0 && m % g < pp) {
        snprintf(hint, sizeof hint,
                 "use a multiple of %" PRId64 " microbatches, or a last group of at least %" PRId64,
                 g, pp);
        mgc_diag(d, MGC_SEV_ERROR, at, hint,
                 "schedule: %" PRId64 " microbatches in groups of %" PRId64
                 " leave a last group of %" PRId64 ", fewer than the pipeline degree %" PRId64
                 ": the schedule would stall on dependency bubbles",
                 m, g, m % g, pp);
        return -1;
    }
    return d->errors > e0 ? -1 : 0;
}

static int params_ok(const mgc_schedule_params *p) {
    mgc_diags tmp;
    mgc_diags_init(&tmp);
    int rc = mgc_schedule_check(p, &tmp);
    mgc_diags_free(&tmp);
    return rc == 0;
}

static int64_t warmup_of(int sched, int64_t pp, int64_t vp, int64_t m, int64_t g, int64_t r) {
    int64_t w;
    if (sched == MGC_SCHED_GPIPE) return m;
    if (sched == MGC_SCHED_1F1B) {
        w = pp - r - 1;
        return w < m ? w : m;
    }
    w = 2 * (pp - r - 1) + (vp - 1) * g;
    return w < vp * m ? w : vp * m;
}

int64_t mgc_schedule_warmup(const mgc_schedule_params *p, int64_t rank) {
    if (!params_ok(p) || rank < 0 || rank >= p->pp) return -1;
    return warmup_of(p->schedule, p->pp, p->vp, p->num_microbatches, eff_group(p), rank);
}

double mgc_schedule_bubble_ratio_closed_form(const mgc_schedule_params *p) {
    if (!params_ok(p)) return -1;
    return (double)(p->pp - 1) / ((double)p->vp * (double)p->num_microbatches);
}

/* ---- compute order -------------------------------------------------------- */

typedef struct cop {
    int32_t mb;     /* microbatch */
    uint16_t chunk; /* chunk on the rank */
    uint8_t bwd;    /* 0 forward, 1 backward */
} cop;

typedef struct bctx {
    int sched;
    int64_t pp, vp, m, g, S; /* S = pp * vp virtual stages */
    int64_t n;               /* compute ops per rank: 2 * vp * m */
    cop *table;              /* (vp * m) interleaved: k-th forward's (mb, chunk) */
    cop *ord;                /* (pp * n) order per rank */
    int64_t *ost;            /* (pp * n) ideal start of each op in that order */
    int64_t *fst, *bst;      /* (S * m) ideal start of forward / backward of (stage, mb) */
    mgc_diags *d;
    mgc_loc loc;
} bctx;

#define T_FWD 1 /* ideal durations the streams are ordered by */
#define T_BWD 2

static int64_t dur(const cop *o) {
    return o->bwd ? T_BWD : T_FWD;
}

/* Megatron's schedule table: microbatches go out in groups of G; within a
 * group every chunk in turn runs all of the group's microbatches.  The last
 * group takes whatever is left. */
static void fill_table(bctx *k) {
    int64_t i = 0;
    for (int64_t lo = 0; lo < k->m; lo += k->g) {
        int64_t hi = lo + k->g < k->m ? lo + k->g : k->m;
        for (int64_t c = 0; c < k->vp; c++)
            for (int64_t mb = lo; mb < hi; mb++)
                k->table[i++] = (cop){(int32_t)mb, (uint16_t)c, 0};
    }
}

static void order_rank(const bctx *k, int64_t r, cop *o) {
    int64_t w = warmup_of(k->sched, k->pp, k->vp, k->m, k->g, r);
    int64_t total = k->vp * k->m, j = 0;
    if (k->sched != MGC_SCHED_INTERLEAVED) {
        /* GPipe is 1F1B whose warm-up is every microbatch. */
        for (int64_t i = 0; i < w; i++)
            o[j++] = (cop){(int32_t)i, 0, 0};
        for (int64_t i = 0; i < total - w; i++) {
            o[j++] = (cop){(int32_t)(w + i), 0, 0};
            o[j++] = (cop){(int32_t)i, 0, 1};
        }
        for (int64_t i = total - w; i < total; i++)
            o[j++] = (cop){(int32_t)i, 0, 1};
        return;
    }
    /* Virtual microbatch i: forward k->table[i]; backward the same
     * microbatch with the chunk order reversed. */
    for (int64_t i = 0; i < w; i++)
        o[j++] = k->table[i];
    for (int64_t i = 0; i < total - w; i++) {
        o[j++] = k->table[w + i];
        cop b = k->table[i];
        o[j++] = (cop){b.mb, (uint16_t)(k->vp - 1 - b.chunk), 1};
    }
    for (int64_t i = total - w; i < total; i++) {
        cop b = k->table[i];
        o[j++] = (cop){b.mb, (uint16_t)(k->vp - 1 - b.chunk), 1};
    }
}

/* ---- ideal times ------------------------------------------------------------ */

/* Run every rank's order as soon as its inputs allow: a forward of stage s
 * after the forward of s-1, a backward after its own forward and the
 * backward of s+1.  A work list holds the ranks that may be able to move.
 * 0 on success, -1 when the order waits forever (which the parameter rules
 * exclude). */
static int ideal_times(bctx *k) {
    int64_t pp = k->pp, m = k->m, n = k->n, S = k->S;
    int64_t *pc = calloc((size_t)pp, sizeof *pc), *clk = calloc((size_t)pp, sizeof *clk);
    int64_t *work = malloc((size_t)pp * sizeof *work); /* ring of ranks that may move */
    uint8_t *queued = malloc((size_t)pp);
    if (!pc || !clk || !work || !queued) {
        free(pc);
        free(clk);
        free(work);
        free(queued);
        mgc_diag(k->d, MGC_SEV_ERROR, k->loc, NULL, "schedule: out of memory");
        return -1;
    }
    for (int64_t i = 0; i < S * m; i++)
        k->fst[i] = k->bst[i] = -1;
    int64_t left = pp * n, head = 0, len = pp;
    for (int64_t r = 0; r < pp; r++) {
        work[r] = r;
        queued[r] = 1;
    }
    while (len) {
        int64_t r = work[head], moved = 0;
        head = (head + 1) % pp;
        len--;
        queued[r] = 0;
        for (; pc[r] < n; pc[r]++) {
            const cop *o = &k->ord[r * n + pc[r]];
            int64_t s = (int64_t)o->chunk * pp + r, ready = clk[r];
            if (!o->bwd) {
                if (s > 0) {
                    int64_t t = k->fst[(s - 1) * m + o->mb];
                    if (t < 0) break;
                    if (t + T_FWD > ready) ready = t + T_FWD;
                }
                k->fst[s * m + o->mb] = ready;
            } else {
                if (k->fst[s * m + o->mb] < 0) break;
                if (s < S - 1) {
                    int64_t t = k->bst[(s + 1) * m + o->mb];
                    if (t < 0) break;
                    if (t + T_BWD > ready) ready = t + T_BWD;
                }
                k->bst[s * m + o->mb] = ready;
            }
            k->ost[r * n + pc[r]] = ready;
            clk[r] = ready + dur(o);
            left--;
            moved = 1;
        }
        /* only the neighbouring ranks can wait on this one */
        for (int64_t dq = -1; moved && dq <= 1; dq += 2) {
            int64_t q = (r + dq + pp) % pp;
            if (!queued[q]) {
                queued[q] = 1;
                work[(head + len++) % pp] = q;
            }
        }
    }
    free(work);
    free(queued);
    free(pc);
    free(clk);
    if (left) {
        mgc_diag(k->d, MGC_SEV_ERROR, k->loc, "this is a bug in mgc: please report it",
                 "schedule: internal error: the %s order for p=%" PRId64 ", v=%" PRId64
                 ", m=%" PRId64 " waits on itself",
                 sched_name(k->sched), k->pp, k->vp, k->m);
        return -1;
    }
    return 0;
}

/* ---- messages ------------------------------------------------------------------ */

/* The earliest instant >= t at which rank r is not inside a compute op. */
static int64_t next_free(const bctx *k, int64_t r, int64_t t) {
    const int64_t *st = &k->ost[r * k->n];
    const cop *o = &k->ord[r * k->n];
    /* ops are in time order: find the last one starting before t */
    int64_t lo = 0, hi = k->n; /* invariant: ops [0, lo) start before t, [hi, n) do not */
    while (lo < hi) {
        int64_t mid = lo + (hi - lo) / 2;
        if (st[mid] < t)
            lo = mid + 1;
        else
            hi = mid;
    }
    if (lo == 0) return t;
    int64_t end = st[lo - 1] + dur(&o[lo - 1]);
    return end > t ? end : t;
}

/* The instant a transfer happens, in both streams: the first instant in
 * [produced, consumed] at which neither rank is computing, so that with
 * rendezvous neither waits in the ideal timeline; if there is none, when
 * it was produced (the sender waits for the receiver to finish its op). */
static int64_t transfer_time(const bctx *k, int64_t a, int64_t produced, int64_t b,
                             int64_t consumed) {
    for (int64_t t = produced;;) {
        int64_t t1 = next_free(k, a, t);
        if (t1 > consumed) return produced;
        int64_t t2 = next_free(k, b, t1);
        if (t2 > consumed) return produced;
        if (t2 == t1) return t1;
        t = t2;
    }
}

/* ---- streams -------------------------------------------------------------------- */

/* One entry of a rank's merged order.  Ordered by (t, key): at one instant
 * transfers come before the op that starts there, and transfers among
 * themselves by message id, which both ends compute alike. */
typedef struct ev {
    int64_t t;
    uint64_t key; /* bit 63 set for compute ops; else the message id */
    mgc_instr in;
} ev;

static int ev_cmp(const void *pa, const void *pb) {
    const ev *a = pa, *b = pb;
    if (a->t != b->t) return a->t < b->t ? -1 : 1;
    if (a->key != b->key) return a->key < b->key ? -1 : 1;
    return 0;
}

#define KEY_COMPUTE (UINT64_C(1) << 63)

static mgc_instr mk(int op, int64_t chunk, int64_t mb, int64_t peer, uint64_t arg) {
    mgc_instr in;
    memset(&in, 0, sizeof in);
    in.op = (uint16_t)op;
    in.chunk = (uint16_t)chunk;
    in.mb = (int32_t)mb;
    in.peer = (int32_t)peer;
    in.arg = (uint32_t)arg;
    return in;
}

/* Link slot of a peer: 0 for the next rank (the only one when pp == 2). */
static int slot(int64_t pp, int64_t r, int64_t peer) {
    return peer == (r + 1) % pp ? 0 : 1;
}

static int build_rank(bctx *k, int64_t r, const mgc_schedule_params *p, ev *evs,
                      mgc_schedule_stream *out) {
    int64_t pp = k->pp, m = k->m, S = k->S, n = k->n, ne = 0;
    /* compute ops at their ideal start */
    for (int64_t i = 0; i < n; i++) {
        const cop *o = &k->ord[r * n + i];
        evs[ne].t = k->ost[r * n + i];
        evs[ne].key = KEY_COMPUTE;
        evs[ne].in = mk(o->bwd ? MGC_I_BACKWARD : MGC_I_FORWARD, o->chunk, o->mb, -1, 0);
        ne++;
    }
    /* transfers touching this rank's stages */
    for (int64_t c = 0; c < k->vp; c++) {
        int64_t s = c * pp + r;
        for (int64_t mb = 0; mb < m; mb++) {
            if (s < S - 1) { /* activation to s+1, gradient back from s+1 */
                int64_t q = (s + 1) % pp;
                int64_t pe = k->fst[s * m + mb] + T_FWD, cs = k->fst[(s + 1) * m + mb];
                evs[ne].t = transfer_time(k, r, pe, q, cs);
                evs[ne].key = (uint64_t)(s * m + mb);
                evs[ne++].in = mk(MGC_I_SEND_ACT, c, mb, q, 0);
                pe = k->bst[(s + 1) * m + mb] + T_BWD;
                cs = k->bst[s * m + mb];
                evs[ne].t = transfer_time(k, q, pe, r, cs);
                evs[ne].key = (uint64_t)((S + s + 1) * m + mb);
                evs[ne++].in = mk(MGC_I_RECV_GRAD, c, mb, q, 0);
            }
            if (s > 0) { /* activation from s-1, gradient back to s-1 */
                int64_t q = (s - 1) % pp;
                int64_t pe = k->fst[(s - 1) * m + mb] + T_FWD, cs = k->fst[s * m + mb];
                evs[ne].t = transfer_time(k, q, pe, r, cs);
                evs[ne].key = (uint64_t)((s - 1) * m + mb);
                evs[ne++].in = mk(MGC_I_RECV_ACT, c, mb, q, 0);
                pe = k->bst[s * m + mb] + T_BWD;
                cs = k->bst[(s - 1) * m + mb];
                evs[ne].t = transfer_time(k, r, pe, q, cs);
                evs[ne].key = (uint64_t)((S + s) * m + mb);
                evs[ne++].in = mk(MGC_I_SEND_GRAD, c, mb, q, 0);
            }
        }
    }
    qsort(evs, (size_t)ne, sizeof *evs, ev_cmp);

    int64_t nb = p->rank_buckets ? p->rank_buckets[r] : p->grad_buckets;
    int embed = p->tied_embeddings && pp > 1 && (r == 0 || r == pp - 1);
    int64_t loads =
        p->load_every ? S / pp * m : (r == 0 ? m : 0) + (r == (S - 1) % pp && S > 1 ? m : 0);
    int64_t cap = ne + loads + embed + nb + 1 + (p->distributed_optimizer ? nb : 0);
    mgc_instr *v = malloc((size_t)cap * sizeof *v);
    if (!v) return -1;
    int64_t j = 0;
    uint64_t sent[2] = {0, 0}, recvd[2] = {0, 0};
    for (int64_t i = 0; i < ne; i++) {
        mgc_instr in = evs[i].in;
        int64_t s = (int64_t)in.chunk * pp + r;
        switch (in.op) {
        case MGC_I_FORWARD: {
            uint32_t what = (s == 0 ? MGC_SCHED_LOAD_TOKENS : 0) |
                            (s == S - 1 ? MGC_SCHED_LOAD_LABELS : 0) | p->load_every;
            if (what) v[j++] = mk(MGC_I_LOAD_BATCH, in.chunk, in.mb, -1, what);
            break;
        }
        case MGC_I_SEND_ACT:
        case MGC_I_SEND_GRAD:
            in.seq = sent[slot(pp, r, in.peer)]++;
            break;
        case MGC_I_RECV_ACT:
        case MGC_I_RECV_GRAD:
            in.seq = recvd[slot(pp, r, in.peer)]++;
            break;
        default:
            break;
        }
        v[j++] = in;
    }
    /* Step tail.  The tied embedding's two copies are summed before the
     * data-parallel reduction: summing commutes, and after a reduce-scatter
     * only each rank's shard would be reduced, at offsets that differ
     * between the first and the last stage. */
    if (embed) v[j++] = mk(MGC_I_EMBED_GRADS, 0, -1, -1, 0);
    for (int64_t b = 0; b < nb; b++) {
        v[j] = mk(MGC_I_REDUCE_GRADS, 0, -1, -1, (uint64_t)b);
        v[j++].seq = (uint64_t)b;
    }
    v[j++] = mk(MGC_I_OPTIMIZER, 0, -1, -1, 0);
    if (p->distributed_optimizer)
        for (int64_t b = 0; b < nb; b++) {
            v[j] = mk(MGC_I_GATHER_PARAMS, 0, -1, -1, (uint64_t)b);
            v[j++].seq = (uint64_t)(nb + b);
        }
    out->n = j;
    out->instrs = v;
    out->n_buckets = nb;
    out->warmup = warmup_of(k->sched, pp, k->vp, m, k->g, r);
    return 0;
}

void mgc_schedule_free(mgc_schedule *s) {
    if (!s) return;
    if (s->ranks)
        for (int64_t r = 0; r < s->pp; r++)
            free(s->ranks[r].instrs);
    free(s->ranks);
    free(s);
}

int mgc_schedule_build(const mgc_schedule_params *p, mgc_schedule **out, mgc_diags *d) {
    *out = NULL;
    if (mgc_schedule_check(p, d)) return -1;
    bctx k;
    memset(&k, 0, sizeof k);
    k.sched = p->schedule;
    k.pp = p->pp;
    k.vp = p->vp;
    k.m = p->num_microbatches;
    k.g = eff_group(p);
    k.S = k.pp * k.vp;
    k.n = 2 * k.vp * k.m;
    k.d = d;
    k.loc = p->loc;
    size_t work = (size_t)(k.S * k.m);
    mgc_schedule *s = calloc(1, sizeof *s);
    k.table = malloc((size_t)(k.vp * k.m) * sizeof *k.table);
    k.ord = malloc((size_t)(k.pp * k.n) * sizeof *k.ord);
    k.ost = malloc((size_t)(k.pp * k.n) * sizeof *k.ost);
    k.fst = malloc(work * sizeof *k.fst);
    k.bst = malloc(work * sizeof *k.bst);
    /* n compute ops and, with a pipeline, at most 2n transfers per rank */
    ev *evs = malloc((size_t)(k.pp > 1 ? 3 * k.n : k.n) * sizeof *evs);
    int rc = -1;
    if (!s || !k.table || !k.ord || !k.ost || !k.fst || !k.bst || !evs) goto oom;
    s->ranks = calloc((size_t)k.pp, sizeof *s->ranks);
    if (!s->ranks) goto oom;
    s->schedule = p->schedule;
    s->pp = k.pp;
    s->vp = k.vp;
    s->m = k.m;
    s->group = k.g;
    s->n_stages = k.S;
    s->distributed_optimizer = p->distributed_optimizer != 0;
    s->tied_embeddings = p->tied_embeddings != 0;
    s->load_every = p->load_every;
    s->loc = p->loc;

    fill_table(&k);
    for (int64_t r = 0; r < k.pp; r++)
        order_rank(&k, r, &k.ord[r * k.n]);
    if (ideal_times(&k)) goto fail;
    for (int64_t r = 0; r < k.pp; r++)
        if (build_rank(&k, r, p, evs, &s->ranks[r])) goto oom;
    rc = 0;
    *out = s;
    s = NULL;
    goto done;
oom:
    mgc_diag(d, MGC_SEV_ERROR, p->loc, "lower the pipeline degree, virtual stages or microbatches",
             "schedule: out of memory building %" PRId64 " x %" PRId64 " x %" PRId64
             " forward passes",
             k.pp, k.vp, k.m);
fail:
done:
    mgc_schedule_free(s);
    free(k.table);
    free(k.ord);
    free(k.ost);
    free(k.fst);
    free(k.bst);
    free(evs);
    return rc;
}

/* ---- costs ------------------------------------------------------------------------ */

double mgc_schedule_cost_uniform(void *user, int64_t rank, const mgc_instr *in) {
    (void)user;
    (void)rank;
    return in->op == MGC_I_FORWARD ? 1.0 : in->op == MGC_I_BACKWARD ? 2.0 : 0.0;
}

double mgc_schedule_cost_layers(void *user, int64_t rank, const mgc_instr *in) {
    const mgc_schedule_layer_cost *lc = user;
    switch (in->op) {
    case MGC_I_FORWARD:
    case MGC_I_BACKWARD: {
        const mgc_stage *st = &lc->stages[(int64_t)in->chunk * lc->pp + rank];
        double f = lc->fwd_fixed + lc->fwd_per_layer * st->num_layers +
                   (st->embedding ? lc->fwd_embedding : 0) + (st->loss ? lc->fwd_loss : 0);
        return in->op == MGC_I_FORWARD ? f : f * lc->bwd_ratio;
    }
    case MGC_I_SEND_ACT:
    case MGC_I_SEND_GRAD:
    case MGC_I_RECV_ACT:
    case MGC_I_RECV_GRAD:
        return lc->comm;
    default:
        return 0.0;
    }
}
