/* test_schedule.c - pipeline schedules (compiler/schedule*.c, timeline.c).
 *
 * The stream invariants are checked here from the instructions alone,
 * independently of the simulator: every (microbatch, chunk) forward and
 * backward exactly once per rank, every send met by one receive of the same
 * tensor with the same seq, seqs rising along each link, inputs received
 * and batches loaded before they are used, the step tail after the last
 * backward.  Megatron's warm-up counts and the bubble closed forms of
 * Narayanan et al. 2021 are written here too.  Then the simulator: it must
 * accept every generated schedule under every buffering model, measure the
 * closed-form bubble exactly with uniform costs, and report hand-corrupted
 * streams (a dropped receive, swapped transfers, a backward before its
 * forward, a forward before its input, ...) with ranks and indices. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config.h"
#include "diag.h"
#include "schedule.h"
#include "testlib.h"

/* ---- helpers ------------------------------------------------------------- */

static mgc_schedule_params params(int sched, int64_t p, int64_t v, int64_t m, int64_t g) {
    mgc_schedule_params sp;
    memset(&sp, 0, sizeof sp);
    sp.schedule = sched;
    sp.pp = p;
    sp.vp = v;
    sp.num_microbatches = m;
    sp.group = g;
    sp.grad_buckets = 3;
    sp.tied_embeddings = 1;
    return sp;
}

static void dump(const mgc_diags *d) {
    for (int i = 0; i < d->n; i++)
        fprintf(stderr, "  [%s] %s | %s\n", mgc_severity_name(d->v[i].sev), d->v[i].msg,
                d->v[i].hint ? d->v[i].hint : "");
}

/* Is there a diagnostic of severity sev whose message contains needle? */
static int has(const mgc_diags *d, mgc_severity sev, const char *needle) {
    for (int i = 0; i < d->n; i++)
        if (d->v[i].sev == sev && strstr(d->v[i].msg, needle)) return 1;
    fprintf(stderr, "  no diagnostic containing \"%s\"; have:\n", needle);
    dump(d);
    return 0;
}

/* Megatron's warm-up, written independently of schedule.c. */
static int64_t warmup(int sched, int64_t p, int64_t v, int64_t m, int64_t g, int64_t r) {
    int64_t w;
    switch (sched) {
    case MGC_SCHED_GPIPE:
        return m;
    case MGC_SCHED_1F1B:
        w = p - r - 1;
        return w < m ? w : m;
    default:
        w = (p - r - 1) * 2 + (v - 1) * g;
        return w < v * m ? w : v * m;
    }
}

static int interleave_ok(int64_t p, int64_t m, int64_t g) {
    return p <= g && g <= m && (m % g == 0 || m % g >= p);
}

/* A copy of a schedule whose streams the negative tests may edit. */
static mgc_schedule *copy(const mgc_schedule *s) {
    mgc_schedule *c = malloc(sizeof *c);
    *c = *s;
    c->ranks = calloc((size_t)s->pp, sizeof *c->ranks);
    for (int64_t r = 0; r < s->pp; r++) {
        c->ranks[r] = s->ranks[r];
        c->ranks[r].instrs = malloc((size_t)(s->ranks[r].n + 1) * sizeof(mgc_instr));
        memcpy(c->ranks[r].instrs, s->ranks[r].instrs, (size_t)s->ranks[r].n * sizeof(mgc_instr));
    }
    return c;
}

/* Index of the first instruction on rank r with op (and mb, unless -2). */
static int64_t find(const mgc_schedule *s, int64_t r, int op, int32_t mb, int64_t from) {
    for (int64_t i = from; i < s->ranks[r].n; i++)
        if (s->ranks[r].instrs[i].op == op && (mb == -2 || s->ranks[r].instrs[i].mb == mb))
            return i;
    return -1;
}

static void erase(mgc_schedule *s, int64_t r, int64_t i) {
    mgc_schedule_stream *st = &s->ranks[r];
    memmove(&st->instrs[i], &st->instrs[i + 1], (size_t)(st->n - i - 1) * sizeof(mgc_instr));
    st->n--;
}

/* Move instruction i of rank r to position j (shifting the ones between). */
static void move(mgc_schedule *s, int64_t r, int64_t i, int64_t j) {
    mgc_instr t = s->ranks[r].instrs[i];
    erase(s, r, i);
    mgc_schedule_stream *st = &s->ranks[r];
    memmove(&st->instrs[j + 1], &st->instrs[j], (size_t)(st->n - j) * sizeof(mgc_instr));
    st->instrs[j] = t;
    st->n++;
}

/* ---- stream invariants, from the instructions alone ------------------------ */

typedef struct pos {
    int64_t fwd, bwd, nf, nb;    /* index of forward / backward, and counts */
    int64_t recv_act, recv_grad; /* indices, -1 none */
    int64_t send_act, send_grad;
    int64_t tok, lab; /* LOAD_BATCH indices */
} pos;

/* Checks everything about one schedule that needs no simulation; returns
 * the number of failed checks. */
static int check_streams(const mgc_schedule *s, const mgc_schedule_params *sp) {
    int f0 = t_failed;
    int64_t p = s->pp, v = s->vp, m = s->m, S = p * v;
    int64_t g = sp->schedule == MGC_SCHED_INTERLEAVED && sp->group ? sp->group : p;
    pos *P = malloc((size_t)(m * v) * sizeof *P);
    /* per directed link (a -> b): sends on a, receives on b, in stream order */
    int64_t nl = p * p;
    int64_t **snd = calloc((size_t)nl, sizeof *snd), **rcv = calloc((size_t)nl, sizeof *rcv);
    int64_t *ns = calloc((size_t)nl, sizeof *ns), *nr = calloc((size_t)nl, sizeof *nr);
    for (int64_t r = 0; r < p; r++) {
        const mgc_schedule_stream *st = &s->ranks[r];
        for (int64_t k = 0; k < m * v; k++)
            P[k] = (pos){-1, -1, 0, 0, -1, -1, -1, -1, -1, -1};
        int64_t last_mb = -1, first_bwd = -1, fwd_before = 0;
        for (int64_t i = 0; i < st->n; i++) {
            const mgc_instr *in = &st->instrs[i];
            if (in->op > MGC_I_RECV_GRAD) continue;
            last_mb = i;
            T_CHECK(in->mb >= 0 && in->mb < m && in->chunk < v);
            pos *q = &P[(int64_t)in->mb * v + in->chunk];
            switch (in->op) {
            case MGC_I_FORWARD:
                q->fwd = i, q->nf++;
                if (first_bwd < 0) fwd_before++;
                break;
            case MGC_I_BACKWARD:
                q->bwd = i, q->nb++;
                if (first_bwd < 0) first_bwd = i;
                break;
            case MGC_I_RECV_ACT:
                q->recv_act = i;
                break;
            case MGC_I_RECV_GRAD:
                q->recv_grad = i;
                break;
            case MGC_I_SEND_ACT:
                q->send_act = i;
                break;
            case MGC_I_SEND_GRAD:
                q->send_grad = i;
                break;
            case MGC_I_LOAD_BATCH:
                if (in->arg & MGC_SCHED_LOAD_TOKENS) q->tok = i;
                if (in->arg & MGC_SCHED_LOAD_LABELS) q->lab = i;
                break;
            }
            if (in->op >= MGC_I_SEND_ACT) {
                int out = in->op == MGC_I_SEND_ACT || in->op == MGC_I_SEND_GRAD;
                T_CHECK(in->peer >= 0 && in->peer < p && in->peer != r);
                int64_t l = out ? r * p + in->peer : in->peer * p + r;
                int64_t **lst = out ? snd : rcv, *cnt = out ? ns : nr;
                if ((cnt[l] & (cnt[l] - 1)) == 0) /* 0, 1, 2, 4, ...: grow */
                    lst[l] = realloc(lst[l], (size_t)(cnt[l] ? 2 * cnt[l] : 1) * sizeof(int64_t));
                lst[l][cnt[l]++] = i;
                T_EQ_U64(in->seq, cnt[l] - 1); /* 0, 1, 2, ... along the link */
            }
        }
        /* each (mb, chunk): forward and backward once, in data order */
        for (int64_t mb = 0; mb < m; mb++)
            for (int64_t c = 0; c < v; c++) {
                const pos *q = &P[mb * v + c];
                int64_t sg = c * p + r;
                T_EQ_I64(q->nf, 1);
                T_EQ_I64(q->nb, 1);
                T_CHECK(q->fwd < q->bwd);
                if (sg > 0) {
                    T_CHECK(q->recv_act >= 0 && q->recv_act < q->fwd);
                    T_CHECK(q->send_grad > q->bwd);
                } else {
                    T_CHECK(q->recv_act < 0 && q->send_grad < 0);
                    T_CHECK(q->tok >= 0 && q->tok < q->fwd);
                }
                if (sg < S - 1) {
                    T_CHECK(q->send_act > q->fwd);
                    T_CHECK(q->recv_grad >= 0 && q->recv_grad < q->bwd);
                } else {
                    T_CHECK(q->send_act < 0 && q->recv_grad < 0);
                    T_CHECK(q->lab >= 0 && q->lab < q->fwd);
                }
            }
        /* Megatron's warm-up; the first backward follows one more forward */
        int64_t w = warmup(sp->schedule, p, v, m, g, r);
        T_EQ_I64(st->warmup, w);
        T_EQ_I64(mgc_schedule_warmup(sp, r), w);
        T_EQ_I64(fwd_before, w + 1 < v * m ? w + 1 : v * m);
        /* the step tail, exactly, after the last per-microbatch instruction */
        int64_t nb = sp->rank_buckets ? sp->rank_buckets[r] : sp->grad_buckets, i = last_mb + 1;
        int embed = sp->tied_embeddings && p > 1 && (r == 0 || r == p - 1);
        if (embed) T_EQ_U64(st->instrs[i++].op, MGC_I_EMBED_GRADS);
        for (int64_t b = 0; b < nb; b++, i++) {
            T_EQ_U64(st->instrs[i].op, MGC_I_REDUCE_GRADS);
            T_EQ_U64(st->instrs[i].arg, b);
        }
        T_EQ_U64(st->instrs[i++].op, MGC_I_OPTIMIZER);
        if (sp->distributed_optimizer)
            for (int64_t b = 0; b < nb; b++, i++) {
                T_EQ_U64(st->instrs[i].op, MGC_I_GATHER_PARAMS);
                T_EQ_U64(st->instrs[i].arg, b);
            }
        T_EQ_I64(i, st->n);
    }
    /* every send meets one receive of the same tensor */
    for (int64_t a = 0; a < p; a++)
        for (int64_t b = 0; b < p; b++) {
            int64_t l = a * p + b;
            T_EQ_I64(ns[l], nr[l]);
            for (int64_t k = 0; k < ns[l] && k < nr[l]; k++) {
                const mgc_instr *x = &s->ranks[a].instrs[snd[l][k]];
                const mgc_instr *y = &s->ranks[b].instrs[rcv[l][k]];
                int64_t sx = (int64_t)x->chunk * p + a, sy = (int64_t)y->chunk * p + b;
                T_EQ_I64(x->mb, y->mb);
                T_EQ_U64(x->seq, y->seq);
                if (x->op == MGC_I_SEND_ACT) {
                    T_EQ_U64(y->op, MGC_I_RECV_ACT);
                    T_EQ_I64(sy, sx + 1);
                } else {
                    T_EQ_U64(y->op, MGC_I_RECV_GRAD);
                    T_EQ_I64(sy, sx - 1);
                }
            }
            free(snd[l]);
            free(rcv[l]);
        }
    free(snd);
    free(rcv);
    free(ns);
    free(nr);
    free(P);
    return t_failed - f0;
}

/* ---- the grid ---------------------------------------------------------------- */

/* Build, check the streams, simulate under three buffering models; with
 * uniform costs the bubble must be the closed form exactly. */
static int run_case(int sched, int64_t p, int64_t v, int64_t m, int64_t g, int full) {
    int f0 = t_failed;
    mgc_schedule_params sp = params(sched, p, v, m, g);
    sp.distributed_optimizer = (int)((p + m) % 2);
    sp.tied_embeddings = (int)(m % 3 != 0);
    mgc_diags d;
    mgc_diags_init(&d);
    mgc_schedule *s = NULL;
    T_EQ_I64(mgc_schedule_build(&sp, &s, &d), 0);
    if (!s) {
        dump(&d);
        mgc_diags_free(&d);
        return 1;
    }
    check_streams(s, &sp);

    int64_t w_last = -1;
    const int64_t bufs[3] = {0, MGC_SIM_RENDEZVOUS, MGC_SIM_UNBOUNDED};
    for (int k = 0; k < (full ? 3 : 1); k++) {
        mgc_sim_options o = {0};
        o.link_buffer = bufs[k];
        mgc_sim_result r;
        T_EQ_I64(mgc_schedule_simulate(s, &o, &r, &d), 0);
        T_CHECK(r.ok);
        T_EQ_I64(r.n_deadlock, 0);
        T_EQ_I64(d.errors, 0);
        /* the ideal: 3 v m per rank busy; the bubble (p-1)(tf+tb)/v = 3(p-1) */
        double ratio = (double)(p - 1) / ((double)v * (double)m);
        double T = 3.0 * (double)(v * m + p - 1);
        if (bufs[k] != MGC_SIM_RENDEZVOUS) {
            T_CHECK(r.bubble_ratio == ratio);
            T_CHECK(r.makespan == T);
            T_NEAR_REL(r.bubble_fraction, ratio / (1 + ratio), 1e-12);
            T_CHECK(mgc_schedule_bubble_ratio_closed_form(&sp) == ratio);
        } else {
            T_CHECK(r.makespan >= T); /* rendezvous may only be slower */
        }
        for (int64_t q = 0; q < p; q++) {
            T_CHECK(r.ranks[q].compute == 3.0 * (double)(v * m));
            /* in flight: the forwards before the first backward, at most */
            int64_t w = warmup(sched, p, v, m, sched == MGC_SCHED_INTERLEAVED ? g : p, q);
            int64_t peak = w + 1 < v * m ? w + 1 : v * m;
            T_EQ_I64(r.ranks[q].peak_in_flight, peak);
            if (sched == MGC_SCHED_1F1B) T_CHECK(r.ranks[q].peak_in_flight <= p - q);
            if (sched == MGC_SCHED_GPIPE) T_EQ_I64(r.ranks[q].peak_in_flight, m);
            int64_t sum = 0;
            for (int64_t c = 0; c < v; c++) {
                T_CHECK(r.ranks[q].peak_in_flight_chunk[c] <= m);
                sum += r.ranks[q].peak_in_flight_chunk[c];
            }
            T_CHECK(sum >= r.ranks[q].peak_in_flight);
            if (k == 0 && q == p - 1) w_last = r.ranks[q].forwards_before_first_backward;
        }
        mgc_sim_result_free(&r);
    }
    T_EQ_I64(w_last, sched == MGC_SCHED_GPIPE  ? m
                     : sched == MGC_SCHED_1F1B ? 1
                     : (v - 1) * g + 1 < v * m ? (v - 1) * g + 1
                                               : v * m);
    mgc_schedule_free(s);
    if (t_failed > f0) {
        fprintf(stderr,
                "  ^ in schedule %d p=%" PRId64 " v=%" PRId64 " m=%" PRId64 " G=%" PRId64 "\n",
                sched, p, v, m, g);
        dump(&d);
    }
    mgc_diags_free(&d);
    return t_failed - f0;
}

static void test_grid(void) {
    int cases = 0, bad = 0;
    for (int64_t p = 1; p <= 8; p++)
        for (int64_t m = 1; m <= 32; m++) {
            int full = m <= 12 || m % 8 == 0; /* every buffering model on a subset */
            bad += run_case(MGC_SCHED_GPIPE, p, 1, m, 0, full) != 0;
            bad += run_case(MGC_SCHED_1F1B, p, 1, m, 0, full) != 0;
            cases += 2;
            if (p == 1) continue;
            for (int64_t v = 2; v <= 4; v++) {
                /* G: the default (p), just above, twice, and every microbatch at once */
                int64_t gs[5] = {p, p + 1, p + 3, 2 * p, m};
                for (int k = 0; k < 5; k++) {
                    int dup = 0;
                    for (int j = 0; j < k; j++)
                        dup |= gs[j] == gs[k];
                    if (dup || !interleave_ok(p, m, gs[k])) continue;
                    bad += run_case(MGC_SCHED_INTERLEAVED, p, v, m, gs[k], full && k < 2) != 0;
                    cases++;
                }
            }
        }
    printf("grid: %d schedules, %d with failures\n", cases, bad);
    T_CHECK(cases > 1500);
}

/* pp = 1 degenerates to forward/backward pairs with no transfers. */
static void test_single_rank(void) {
    mgc_schedule_params sp = params(MGC_SCHED_1F1B, 1, 1, 3, 0);
    sp.grad_buckets = 2;
    mgc_diags d;
    mgc_diags_init(&d);
    mgc_schedule *s = NULL;
    T_EQ_I64(mgc_schedule_build(&sp, &s, &d), 0);
    const int want[] = {MGC_I_LOAD_BATCH, MGC_I_FORWARD,      MGC_I_BACKWARD,     MGC_I_LOAD_BATCH,
                        MGC_I_FORWARD,    MGC_I_BACKWARD,     MGC_I_LOAD_BATCH,   MGC_I_FORWARD,
                        MGC_I_BACKWARD,   MGC_I_REDUCE_GRADS, MGC_I_REDUCE_GRADS, MGC_I_OPTIMIZER};
    T_EQ_I64(s->ranks[0].n, 12);
    for (int i = 0; i < 12 && i < s->ranks[0].n; i++) {
        T_EQ_U64(s->ranks[0].instrs[i].op, want[i]);
        if (i < 9) T_EQ_I64(s->ranks[0].instrs[i].mb, i / 3);
    }
    T_EQ_U64(s->ranks[0].instrs[0].arg, MGC_SCHED_LOAD_TOKENS | MGC_SCHED_LOAD_LABELS);
    mgc_schedule_free(s);
    /* GPipe on one rank: all forwards first */
    sp.schedule = MGC_SCHED_GPIPE;
    T_EQ_I64(mgc_schedule_build(&sp, &s, &d), 0);
    T_EQ_U64(s->ranks[0].instrs[1].op, MGC_I_FORWARD);
    T_EQ_U64(s->ranks[0].instrs[3].op, MGC_I_FORWARD);
    T_EQ_U64(s->ranks[0].instrs[5].op, MGC_I_FORWARD);
    T_EQ_U64(s->ranks[0].instrs[6].op, MGC_I_BACKWARD);
    mgc_sim_result r;
    T_EQ_I64(mgc_schedule_simulate(s, NULL, &r, &d), 0);
    T_CHECK(r.bubble_fraction == 0 && r.makespan == 9);
    T_EQ_I64(r.peak_in_flight, 3);
    mgc_sim_result_free(&r);
    mgc_schedule_free(s);
    T_EQ_I64(d.errors, 0);
    mgc_diags_free(&d);
}

/* The documented example (docs/schedules.md): 1F1B, p = 4, m = 8. */
static void test_text_chart(void) {
    static const char want[] =
        "time    0              5              10             15             20             "
        "25             30\n"
        "rank 0  F0 F1 F2 F3 .  .  .  .  .  .  B0 B0 F4 B1 B1 F5 B2 B2 F6 B3 B3 F7 B4 B4 .  B5 "
        "B5 .  B6 B6 .  B7 B7\n"
        "rank 1  .  F0 F1 F2 .  .  .  .  B0 B0 F3 B1 B1 F4 B2 B2 F5 B3 B3 F6 B4 B4 F7 B5 B5 .  "
        "B6 B6 .  B7 B7 .  .\n"
        "rank 2  .  .  F0 F1 .  .  B0 B0 F2 B1 B1 F3 B2 B2 F4 B3 B3 F5 B4 B4 F6 B5 B5 F7 B6 B6 "
        ".  B7 B7 .  .  .  .\n"
        "rank 3  .  .  .  F0 B0 B0 F1 B1 B1 F2 B2 B2 F3 B3 B3 F4 B4 B4 F5 B5 B5 F6 B6 B6 F7 B7 "
        "B7 .  .  .  .  .  .\n"
        "makespan 33, bubble fraction 0.2727 (mean idle / makespan), idle / ideal 0.3750\n";
    mgc_schedule_params sp = params(MGC_SCHED_1F1B, 4, 1, 8, 0);
    mgc_diags d;
    mgc_diags_init(&d);
    mgc_schedule *s = NULL;
    T_EQ_I64(mgc_schedule_build(&sp, &s, &d), 0);
    mgc_sim_result r;
    T_EQ_I64(mgc_schedule_simulate(s, NULL, &r, &d), 0);
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    T_EQ_I64(mgc_schedule_print_text(s, &r, f), 0);
    fclose(f);
    T_STREQ(buf, want);
    free(buf);
    mgc_sim_result_free(&r);
    mgc_schedule_free(s);
    mgc_diags_free(&d);
}

/* ---- uneven layouts and other costs --------------------------------------- */

static mgc_config *load(const char *text, mgc_diags *d) {
    mgc_config *c = mgc_config_new();
    mgc_config_load_text(c, "t.yaml", text, strlen(text), d);
    mgc_config_finalize(c, d);
    return c;
}

/* Deterministic pseudo-random costs: any positive durations. */
static double cost_random(void *user, int64_t rank, const mgc_instr *in) {
    uint64_t h = (uint64_t)(uintptr_t)user ^ ((uint64_t)rank * 0x9e3779b97f4a7c15u) ^
                 ((uint64_t)in->op << 40) ^ ((uint64_t)(uint32_t)in->mb << 8) ^ in->chunk;
    h ^= h >> 33;
    h *= 0xff51afd7ed558ccdu;
    h ^= h >> 33;
    return in->op == MGC_I_FORWARD || in->op == MGC_I_BACKWARD ? 0.25 + (double)(h % 1000) / 250.0
           : in->op <= MGC_I_RECV_GRAD                         ? (double)(h % 7) / 10.0
                                                               : (double)(h % 3);
}

static void uneven_case(const char *yaml, int64_t want_p, int64_t want_v) {
    mgc_diags d;
    mgc_diags_init(&d);
    mgc_config *c = load(yaml, &d);
    T_EQ_I64(d.errors, 0);
    if (d.errors) {
        dump(&d);
        mgc_config_free(c);
        mgc_diags_free(&d);
        return;
    }
    mgc_schedule_params sp;
    mgc_schedule_params_from_config(c, 2, &sp);
    T_EQ_I64(sp.pp, want_p);
    T_EQ_I64(sp.vp, want_v);
    /* an empty rank has no gradients to reduce */
    int64_t *nb = calloc((size_t)sp.pp, sizeof *nb);
    for (int64_t r = 0; r < sp.pp; r++)
        for (int64_t ch = 0; ch < sp.vp; ch++)
            nb[r] += c->derived.stages[ch * sp.pp + r].num_layers > 0;
    sp.rank_buckets = nb;
    mgc_schedule *s = NULL;
    T_EQ_I64(mgc_schedule_build(&sp, &s, &d), 0);
    check_streams(s, &sp);
    mgc_schedule_layer_cost lc = {c->derived.stages, sp.pp, 1.0, 0.0, 0.5, 1.5, 2.0, 0.0};
    for (int k = 0; k < 4; k++) {
        mgc_sim_options o = {0};
        o.cost = k < 3 ? mgc_schedule_cost_layers : cost_random;
        o.cost_user = &lc;
        o.link_buffer = k == 1 ? MGC_SIM_RENDEZVOUS : k == 2 ? MGC_SIM_UNBOUNDED : 0;
        mgc_sim_result r;
        T_EQ_I64(mgc_schedule_simulate(s, &o, &r, &d), 0);
        T_CHECK(r.ok);
        /* busy time is the sum of the chunks' costs; nobody beats the busiest rank */
        for (int64_t q = 0; q < sp.pp && k < 3; q++) {
            double want = 0;
            for (int64_t ch = 0; ch < sp.vp; ch++) {
                const mgc_stage *st = &c->derived.stages[ch * sp.pp + q];
                double f = st->num_layers + (st->embedding ? 0.5 : 0) + (st->loss ? 1.5 : 0);
                want += 3 * f * (double)sp.num_microbatches;
            }
            T_NEAR_REL(r.ranks[q].compute, want, 1e-12);
            T_CHECK(r.makespan >= want);
        }
        T_CHECK(r.bubble_fraction >= 0 && r.bubble_fraction < 1);
        mgc_sim_result_free(&r);
    }
    T_EQ_I64(d.errors, 0);
    if (d.errors) dump(&d);
    mgc_schedule_free(s);
    free(nb);
    mgc_config_free(c);
    mgc_diags_free(&d);
}

static void test_uneven(void) {
    /* 1F1B with an empty rank (0 layers: it still forwards activations) */
    uneven_case("model: {vocab_size: 1000, seq_length: 128, hidden_size: 64, num_layers: 10,\n"
                "        num_attention_heads: 4}\n"
                "parallel:\n"
                "  pipeline: 4\n"
                "  pipeline_layout: [\"E t*3\", \"\", \"t*5\", \"t*2 L\"]\n"
                "training: {gradient_accumulation_steps: 6}\n",
                4, 1);
    /* interleaved, uneven, the last stage holds only the loss */
    uneven_case("model: {vocab_size: 1000, seq_length: 128, hidden_size: 64, num_layers: 13,\n"
                "        num_attention_heads: 4}\n"
                "parallel:\n"
                "  pipeline: 4\n"
                "  pipeline_layout: [Et*2, t*2, t t, t*2, t*2, t*2, t, \"L\"]\n"
                "training: {gradient_accumulation_steps: 8}\n",
                4, 2);
    /* GPipe, three ranks */
    uneven_case("model: {vocab_size: 1000, seq_length: 128, hidden_size: 64, num_layers: 7,\n"
                "        num_attention_heads: 4}\n"
                "parallel:\n"
                "  pipeline: 3\n"
                "  schedule: gpipe\n"
                "  pipeline_layout: [\"E\", \"t*7\", \"L\"]\n"
                "training: {gradient_accumulation_steps: 5}\n",
                3, 1);
}

/* Deadlock freedom does not depend on costs: random durations over a grid. */
static void test_random_costs(void) {
    int runs = 0;
    for (int64_t p = 2; p <= 6; p++)
        for (int64_t v = 1; v <= 3; v++)
            for (int64_t m = p; m <= 3 * p; m += p - 1) {
                mgc_schedule_params sp =
                    params(v == 1 ? MGC_SCHED_1F1B : MGC_SCHED_INTERLEAVED, p, v, m, 0);
                if (v > 1 && !interleave_ok(p, m, p)) continue;
                mgc_diags d;
                mgc_diags_init(&d);
                mgc_schedule *s = NULL;
                T_EQ_I64(mgc_schedule_build(&sp, &s, &d), 0);
                for (uintptr_t seed = 1; seed <= 3 && s; seed++) {
                    mgc_sim_options o = {0};
                    o.cost = cost_random;
                    o.cost_user = (void *)seed;
                    o.link_buffer = seed == 1 ? MGC_SIM_RENDEZVOUS : (int64_t)seed - 1;
                    mgc_sim_result r;
                    T_EQ_I64(mgc_schedule_simulate(s, &o, &r, &d), 0);
                    T_CHECK(r.ok && r.bubble_fraction >= 0);
                    mgc_sim_result_free(&r);
                    runs++;
                }
                if (d.errors) dump(&d);
                mgc_schedule_free(s);
                mgc_diags_free(&d);
            }
    T_CHECK(runs > 50);
}

/* ---- negative tests: the simulator finds hand-made mistakes ----------------- */

static mgc_schedule *build_ok(int sched, int64_t p, int64_t v, int64_t m) {
    mgc_schedule_params sp = params(sched, p, v, m, 0);
    mgc_diags d;
    mgc_diags_init(&d);
    mgc_schedule *s = NULL;
    mgc_schedule_build(&sp, &s, &d);
    T_CHECK(s != NULL);
    mgc_diags_free(&d);
    return s;
}

static void sim_bad(const mgc_schedule *s, int64_t buffer, mgc_sim_result *r, mgc_diags *d) {
    mgc_sim_options o = {0};
    o.link_buffer = buffer;
    mgc_diags_init(d);
    T_EQ_I64(mgc_schedule_simulate(s, &o, r, d), -1);
    T_CHECK(!r->ok);
    T_CHECK(d->errors > 0);
}

static void test_dropped_receive(void) {
    mgc_schedule *s = build_ok(MGC_SCHED_1F1B, 4, 1, 8), *c = copy(s);
    /* rank 2 loses its receive of microbatch 3's activation */
    int64_t i = find(c, 2, MGC_I_RECV_ACT, 3, 0);
    int64_t j = find(c, 1, MGC_I_SEND_ACT, 3, 0);
    T_CHECK(i >= 0 && j >= 0);
    erase(c, 2, i);
    mgc_sim_result r;
    mgc_diags d;
    sim_bad(c, 0, &r, &d);
    T_EQ_I64(r.n_unmatched, 1);
    char want[160];
    snprintf(want, sizeof want,
             "rank 1 instruction %" PRId64 " (SEND_ACT mb 3 chunk 0 to rank 2 seq 3) has no "
             "matching RECV_ACT on rank 2",
             j);
    T_CHECK(has(&d, MGC_SEV_ERROR, want));
    T_CHECK(r.n_input >= 1); /* rank 2's forward of mb 3 ran without its input */
    T_CHECK(has(&d, MGC_SEV_ERROR,
                "(FORWARD mb 3 chunk 0, virtual stage 2) runs before its "
                "input arrived"));
    /* one message in flight: the next send on that link waits forever */
    T_EQ_I64(r.n_deadlock, 1);
    T_CHECK(has(&d, MGC_SEV_ERROR, "an earlier message on the link is never received"));
    mgc_sim_result_free(&r);
    mgc_diags_free(&d);
    /* the same with a dropped send, under rendezvous */
    mgc_schedule_free(c);
    c = copy(s);
    j = find(c, 1, MGC_I_SEND_GRAD, 5, 0);
    erase(c, 1, j);
    sim_bad(c, MGC_SIM_RENDEZVOUS, &r, &d);
    T_EQ_I64(r.n_unmatched, 1);
    T_CHECK(has(&d, MGC_SEV_ERROR,
                "(RECV_GRAD mb 5 chunk 0 from rank 1 seq 5) has no matching "
                "SEND_GRAD on rank 1"));
    T_EQ_I64(r.n_deadlock, 1);
    T_CHECK(has(&d, MGC_SEV_ERROR, "whose other end does not exist"));
    mgc_sim_result_free(&r);
    mgc_diags_free(&d);
    mgc_schedule_free(c);
    mgc_schedule_free(s);
}

static void test_swapped_order(void) {
    mgc_schedule *s = build_ok(MGC_SCHED_1F1B, 2, 1, 4), *c = copy(s);
    /* Rank 0 posts the receive of gradient 0 before its send of
     * activation 0: it waits for a gradient rank 1 cannot compute. */
    int64_t i = find(c, 0, MGC_I_RECV_GRAD, 0, 0), j = find(c, 0, MGC_I_SEND_ACT, 0, 0);
    T_CHECK(j >= 0 && i > j);
    move(c, 0, i, j);
    for (int k = 0; k < 2; k++) {
        mgc_sim_result r;
        mgc_diags d;
        sim_bad(c, k ? MGC_SIM_UNBOUNDED : MGC_SIM_RENDEZVOUS, &r, &d);
        T_EQ_I64(r.n_deadlock, 1);
        T_EQ_I64(r.n_unmatched, 0);
        char want[200];
        snprintf(want, sizeof want,
                 "rank 0 waits at instruction %" PRId64
                 " (RECV_GRAD mb 0 chunk 0 from rank 1 seq 0) on rank 1; rank 1 waits at "
                 "instruction 0 (RECV_ACT mb 0 chunk 0 from rank 0 seq 0) on rank 0 (a cycle)",
                 j);
        T_CHECK(has(&d, MGC_SEV_ERROR, want));
        mgc_sim_result_free(&r);
        mgc_diags_free(&d);
    }
    mgc_schedule_free(c);
    /* Two adjacent transfers in opposite directions swapped on one side:
     * a deadlock with rendezvous; with buffering the send goes through. */
    c = copy(s);
    const mgc_schedule_stream *st = &c->ranks[1];
    int64_t a = -1;
    for (int64_t k = 0; k + 1 < st->n && a < 0; k++)
        if (st->instrs[k].op == MGC_I_RECV_ACT && st->instrs[k + 1].op == MGC_I_SEND_GRAD) a = k;
    T_CHECK(a >= 0);
    if (a >= 0) {
        move(c, 1, a + 1, a);
        mgc_sim_result r;
        mgc_diags d;
        sim_bad(c, MGC_SIM_RENDEZVOUS, &r, &d);
        T_EQ_I64(r.n_deadlock, 1);
        T_CHECK(has(&d, MGC_SEV_ERROR, "(a cycle)"));
        mgc_sim_result_free(&r);
        mgc_diags_free(&d);
        mgc_diags_init(&d);
        mgc_sim_options o = {0};
        T_EQ_I64(mgc_schedule_simulate(c, &o, &r, &d), 0);
        mgc_sim_result_free(&r);
        mgc_diags_free(&d);
    }
    mgc_schedule_free(c);
    mgc_schedule_free(s);
}

static void test_data_order(void) {
    /* a backward before its forward (one rank) */
    mgc_schedule *s = build_ok(MGC_SCHED_1F1B, 1, 1, 2), *c = copy(s);
    int64_t f = find(c, 0, MGC_I_FORWARD, 1, 0), b = find(c, 0, MGC_I_BACKWARD, 1, 0);
    move(c, 0, b, f);
    mgc_sim_result r;
    mgc_diags d;
    sim_bad(c, 0, &r, &d);
    T_EQ_I64(r.n_order, 1);
    char want[160];
    snprintf(want, sizeof want,
             "rank 0 instruction %" PRId64 " (BACKWARD mb 1 chunk 0) runs before its forward", f);
    T_CHECK(has(&d, MGC_SEV_ERROR, want));
    mgc_sim_result_free(&r);
    mgc_diags_free(&d);
    mgc_schedule_free(c);
    mgc_schedule_free(s);

    /* a forward before its input: rank 1 receives after computing */
    s = build_ok(MGC_SCHED_1F1B, 3, 1, 4);
    c = copy(s);
    int64_t i = find(c, 1, MGC_I_RECV_ACT, 2, 0);
    f = find(c, 1, MGC_I_FORWARD, 2, i);
    move(c, 1, i, f); /* now right after the forward */
    sim_bad(c, 0, &r, &d);
    T_EQ_I64(r.n_input, 1);
    T_EQ_I64(r.n_deadlock, 0);
    snprintf(want, sizeof want,
             "rank 1 instruction %" PRId64 " (FORWARD mb 2 chunk 0, virtual stage 1) runs before "
             "its input arrived",
             f - 1);
    T_CHECK(has(&d, MGC_SEV_ERROR, want));
    mgc_sim_result_free(&r);
    mgc_diags_free(&d);
    mgc_schedule_free(c);
    mgc_schedule_free(s);

    /* the step tail before the last backward */
    s = build_ok(MGC_SCHED_INTERLEAVED, 2, 2, 4);
    c = copy(s);
    i = find(c, 0, MGC_I_OPTIMIZER, -2, 0);
    T_CHECK(i > 0);
    /* REDUCE_GRADS early (a collective would wait for the other ranks) */
    int64_t red = find(c, 0, MGC_I_REDUCE_GRADS, -2, 0);
    move(c, 0, red, 3);
    sim_bad(c, 0, &r, &d);
    T_EQ_I64(r.n_order, 1);
    T_CHECK(has(&d, MGC_SEV_ERROR,
                "rank 0 instruction 3 (REDUCE_GRADS bucket 0 seq 0) runs after 0 of 8 backwards"));
    mgc_sim_result_free(&r);
    mgc_diags_free(&d);
    mgc_schedule_free(c);
    mgc_schedule_free(s);
}

static void test_malformed(void) {
    mgc_schedule *s = build_ok(MGC_SCHED_1F1B, 3, 1, 3), *c = copy(s);
    mgc_sim_result r;
    mgc_diags d;
    /* a send to the wrong neighbour: reported, not run */
    int64_t i = find(c, 1, MGC_I_SEND_ACT, 0, 0);
    c->ranks[1].instrs[i].peer = 0;
    sim_bad(c, 0, &r, &d);
    T_EQ_I64(r.n_malformed, 1);
    T_CHECK(has(&d, MGC_SEV_ERROR, "the neighbouring stage is on rank 2"));
    mgc_sim_result_free(&r);
    mgc_diags_free(&d);
    c->ranks[1].instrs[i].peer = 2;
    /* a microbatch out of range */
    c->ranks[0].instrs[1].mb = 7;
    sim_bad(c, 0, &r, &d);
    T_EQ_I64(r.n_malformed, 1);
    T_CHECK(has(&d, MGC_SEV_ERROR, "microbatch or chunk out of range"));
    mgc_sim_result_free(&r);
    mgc_diags_free(&d);
    c->ranks[0].instrs[1].mb = s->ranks[0].instrs[1].mb;
    /* a receive that names another microbatch than its send */
    i = find(c, 2, MGC_I_RECV_ACT, 1, 0);
    c->ranks[2].instrs[i].mb = 2;
    sim_bad(c, 0, &r, &d);
    T_CHECK(r.n_mismatch >= 1);
    T_CHECK(has(&d, MGC_SEV_ERROR, "(SEND_ACT mb 1 chunk 0 to rank 2 seq 1) meets rank 2"));
    mgc_sim_result_free(&r);
    mgc_diags_free(&d);
    mgc_schedule_free(c);
    /* two receives with one seq */
    c = copy(s);
    i = find(c, 2, MGC_I_RECV_ACT, 1, 0);
    c->ranks[2].instrs[i].seq = 0;
    sim_bad(c, 0, &r, &d);
    T_CHECK(r.n_unmatched >= 1);
    T_CHECK(has(&d, MGC_SEV_ERROR, "repeats the seq of instruction"));
    mgc_sim_result_free(&r);
    mgc_diags_free(&d);
    mgc_schedule_free(c);
    /* a missing backward: nothing waits for it on the last rank's last microbatch */
    c = copy(s);
    i = find(c, 2, MGC_I_BACKWARD, 2, 0);
    c->ranks[2].instrs[i].op = MGC_I_LOAD_BATCH;
    c->ranks[2].instrs[i].arg = MGC_SCHED_LOAD_LABELS;
    sim_bad(c, 0, &r, &d);
    T_CHECK(r.n_missing >= 1 || r.n_deadlock == 1);
    mgc_sim_result_free(&r);
    mgc_diags_free(&d);
    mgc_schedule_free(c);
    mgc_schedule_free(s);
}

/* ---- validation ----------------------------------------------------------------- */

static void refused(mgc_schedule_params sp, const char *needle) {
    mgc_diags d;
    mgc_diags_init(&d);
    mgc_schedule *s = (mgc_schedule *)&d; /* must be reset to NULL */
    T_EQ_I64(mgc_schedule_build(&sp, &s, &d), -1);
    T_CHECK(s == NULL);
    T_CHECK(d.errors >= 1);
    T_CHECK(has(&d, MGC_SEV_ERROR, needle));
    T_EQ_I64(mgc_schedule_warmup(&sp, 0), -1);
    T_CHECK(mgc_schedule_bubble_ratio_closed_form(&sp) == -1);
    mgc_diags_free(&d);
}

static void test_validation(void) {
    refused(params(MGC_SCHED_INTERLEAVED, 4, 2, 10, 4),
            "leave a last group of 2, fewer than the pipeline degree 4");
    refused(params(MGC_SCHED_INTERLEAVED, 4, 2, 8, 3),
            "group size 3 is smaller than the pipeline degree 4");
    refused(params(MGC_SCHED_INTERLEAVED, 4, 2, 3, 0), "needs at least that many, but there are 3");
    refused(params(MGC_SCHED_INTERLEAVED, 4, 1, 8, 0), "needs more than one virtual stage");
    refused(params(MGC_SCHED_1F1B, 4, 2, 8, 0), "1f1b runs one chunk per rank");
    refused(params(MGC_SCHED_GPIPE, 4, 2, 8, 0), "gpipe runs one chunk per rank");
    refused(params(MGC_SCHED_INTERLEAVED, 1, 2, 8, 0), "need a pipeline to interleave over");
    refused(params(MGC_SCHED_1F1B, 0, 1, 8, 0), "pipeline degree 0 is out of range");
    refused(params(MGC_SCHED_1F1B, -3, 1, 8, 0), "pipeline degree -3 is out of range");
    refused(params(MGC_SCHED_1F1B, 4, 0, 8, 0), "0 virtual stages per rank is out of range");
    refused(params(MGC_SCHED_1F1B, 4, 1, 0, 0), "0 microbatches per step is out of range");
    refused(params(MGC_SCHED_1F1B, 4, 1, INT64_MAX, 0), "microbatches per step is out of range");
    refused(params(MGC_SCHED_1F1B, INT64_MAX, 1, 1, 0), "is out of range");
    refused(params(MGC_SCHED_INTERLEAVED, 4096, 1024, 4096, 0), "forward passes per step");
    refused(params(7, 4, 1, 8, 0), "unknown schedule 7");
    refused(params(-1, 4, 1, 8, 0), "unknown schedule -1");
    mgc_schedule_params sp = params(MGC_SCHED_1F1B, 2, 1, 2, 0);
    sp.grad_buckets = -1;
    refused(sp, "-1 gradient buckets is out of range");
    int64_t nb[2] = {1, 1 << 30};
    sp.grad_buckets = 0;
    sp.rank_buckets = nb;
    refused(sp, "pipeline rank 1 has 1073741824 gradient buckets");
    /* several problems at once are all reported */
    mgc_diags d;
    mgc_diags_init(&d);
    sp = params(9, 0, 0, 0, 0);
    T_EQ_I64(mgc_schedule_check(&sp, &d), -1);
    T_EQ_I64(d.errors, 4);
    mgc_diags_free(&d);
    /* allowed: 1F1B with fewer microbatches than stages, interleaved groups */
    mgc_diags_init(&d);
    sp = params(MGC_SCHED_1F1B, 8, 1, 3, 0);
    T_EQ_I64(mgc_schedule_check(&sp, &d), 0);
    sp = params(MGC_SCHED_INTERLEAVED, 4, 2, 14, 5); /* 14 mod 5 = 4 >= 4 */
    T_EQ_I64(mgc_schedule_check(&sp, &d), 0);
    sp = params(MGC_SCHED_INTERLEAVED, 4, 2, 12, 0); /* G defaults to pp */
    T_EQ_I64(mgc_schedule_check(&sp, &d), 0);
    T_EQ_I64(mgc_schedule_warmup(&sp, 0), 2 * 3 + 4);
    T_EQ_I64(d.errors, 0);
    mgc_diags_free(&d);
}

/* Arbitrary values, as a sweep might pass them: a diagnostic or a schedule
 * the simulator accepts, never a crash. */
static void test_arbitrary(void) {
    uint64_t x = 88172645463325252u;
    int built = 0, refused_n = 0;
    static const int64_t odd[] = {INT64_MIN, -1000000, -1,   0,         1,       2,
                                  3,         4,        1025, INT64_MAX, 1 << 30, (1 << 24) + 1};
    for (int it = 0; it < 4000; it++) {
        int64_t v5[5];
        for (int k = 0; k < 5; k++) {
            x ^= x << 13, x ^= x >> 7, x ^= x << 17;
            v5[k] = x % 10 == 0 ? odd[(x >> 8) % 12] : (int64_t)((x >> 16) % 14) - 2;
        }
        mgc_schedule_params sp =
            params((int)(v5[0] % 5) - 1, v5[1], x % 3 ? v5[2] % 5 : 1, v5[3], v5[4]);
        sp.grad_buckets = (int64_t)((x >> 3) % 4) - 1;
        sp.distributed_optimizer = (int)(x & 1);
        mgc_diags d;
        mgc_diags_init(&d);
        mgc_schedule *s = NULL;
        if (mgc_schedule_build(&sp, &s, &d) == 0) {
            built++;
            T_CHECK(s != NULL && d.errors == 0);
            mgc_sim_result r;
            T_EQ_I64(mgc_schedule_simulate(s, NULL, &r, &d), 0);
            mgc_sim_result_free(&r);
            mgc_schedule_free(s);
        } else {
            refused_n++;
            T_CHECK(s == NULL && d.errors >= 1);
        }
        mgc_diags_free(&d);
    }
    printf("arbitrary parameters: %d built, %d refused\n", built, refused_n);
    T_CHECK(built > 100 && refused_n > 100);
}

/* Sizes at the edges: the widest pipeline, the longest step on one rank. */
static void test_large(void) {
    const int64_t shapes[3][4] = {{MGC_SCHED_1F1B, 65536, 1, 2},
                                  {MGC_SCHED_1F1B, 1, 1, 100000},
                                  {MGC_SCHED_INTERLEAVED, 64, 4, 256}};
    for (int k = 0; k < 3; k++) {
        mgc_schedule_params sp =
            params((int)shapes[k][0], shapes[k][1], shapes[k][2], shapes[k][3], 0);
        mgc_diags d;
        mgc_diags_init(&d);
        mgc_schedule *s = NULL;
        T_EQ_I64(mgc_schedule_build(&sp, &s, &d), 0);
        mgc_sim_result r;
        T_EQ_I64(mgc_schedule_simulate(s, NULL, &r, &d), 0);
        T_CHECK(r.bubble_ratio == mgc_schedule_bubble_ratio_closed_form(&sp));
        mgc_sim_result_free(&r);
        mgc_schedule_free(s);
        mgc_diags_free(&d);
    }
}

/* From a config: the compiler's values, diagnostics at parallel.schedule. */
static void test_from_config(void) {
    mgc_diags d;
    mgc_diags_init(&d);
    mgc_config *c = load("model: {vocab_size: 1000, seq_length: 128, hidden_size: 64,\n"
                         "        num_layers: 24, num_attention_heads: 4, tie_embeddings: false}\n"
                         "parallel:\n"
                         "  pipeline: 4\n"
                         "  virtual_stages: 3\n"
                         "  microbatch_group_size: 5\n"
                         "  distributed_optimizer: true\n"
                         "  data: 2\n"
                         "training: {gradient_accumulation_steps: 10}\n",
                         &d);
    T_EQ_I64(d.errors, 0);
    mgc_schedule_params sp;
    mgc_schedule_params_from_config(c, 2, &sp);
    T_EQ_I64(sp.schedule, MGC_SCHED_INTERLEAVED);
    T_EQ_I64(sp.pp, 4);
    T_EQ_I64(sp.vp, 3);
    T_EQ_I64(sp.num_microbatches, 10);
    T_EQ_I64(sp.group, 5);
    T_EQ_I64(sp.distributed_optimizer, 1);
    T_EQ_I64(sp.tied_embeddings, 0);
    mgc_schedule *s = NULL;
    T_EQ_I64(mgc_schedule_build(&sp, &s, &d), 0);
    check_streams(s, &sp);
    T_EQ_I64(s->ranks[0].warmup, 2 * 3 + 2 * 5); /* 2(p-1) + (v-1)G */
    mgc_schedule_free(s);
    /* a sweep's arbitrary override is refused at the config's key */
    sp.num_microbatches = 7; /* 7 mod 5 = 2 < 4 */
    T_EQ_I64(mgc_schedule_build(&sp, &s, &d), -1);
    T_CHECK(has(&d, MGC_SEV_ERROR, "last group of 2"));
    T_STREQ(d.v[d.n - 1].loc.file, "t.yaml");
    mgc_config_free(c);
    mgc_diags_free(&d);
}

/* ---- SVG ------------------------------------------------------------------------ */

static char *svg_of(const mgc_schedule *s, const mgc_sim_result *r, const mgc_svg_options *o) {
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    T_EQ_I64(mgc_schedule_svg(s, r, o, f), 0);
    fclose(f);
    return buf;
}

static int count(const char *hay, const char *needle) {
    int n = 0;
    for (const char *p = strstr(hay, needle); p; p = strstr(p + 1, needle))
        n++;
    return n;
}

static void test_svg(void) {
    mgc_schedule_params sp = params(MGC_SCHED_INTERLEAVED, 4, 2, 8, 0);
    mgc_diags d;
    mgc_diags_init(&d);
    mgc_schedule *s = NULL;
    T_EQ_I64(mgc_schedule_build(&sp, &s, &d), 0);
    mgc_sim_result r;
    T_EQ_I64(mgc_schedule_simulate(s, NULL, &r, &d), 0);
    mgc_svg_options o = {NULL, 0, 0};
    char *plain = svg_of(s, &r, &o);
    o.comm_marks = 1;
    char *a = svg_of(s, &r, &o), *b = svg_of(s, &r, &o);
    T_STREQ(a, b); /* deterministic */
    T_CHECK(strncmp(a, "<?xml version=\"1.0\"", 19) == 0);
    T_CHECK(strstr(a, "<svg xmlns=\"http://www.w3.org/2000/svg\"") != NULL);
    T_CHECK(strlen(a) > 7 && strcmp(a + strlen(a) - 7, "</svg>\n") == 0);
    T_CHECK(
        strstr(
            a,
            "interleaved 1F1B schedule: p=4, v=2, m=8, G=4 \xe2\x80\x94 bubble fraction 0.158") !=
        NULL);
    T_CHECK(strstr(a, "bubble fraction 0.1579") != NULL); /* 9 / 57 */
    T_EQ_I64(count(a, "<title>FORWARD"), 4 * 2 * 8);
    T_EQ_I64(count(a, "<title>BACKWARD"), 4 * 2 * 8);
    T_EQ_I64(count(a, ">rank "), 4);
    T_CHECK(strstr(a, "chunk 1 backward") != NULL); /* legend */
    /* one line per transfer: activations and gradients over 7 stage borders */
    T_EQ_I64(count(a, "<line x1") - count(plain, "<line x1"), 2 * 7 * 8 + 2); /* + legend */
    free(plain);
    T_EQ_I64(count(a, "<"), count(a, ">"));
    free(a);
    free(b);
    /* titles are escaped */
    o.title = "a <b> & \"c\"";
    o.comm_marks = 0;
    a = svg_of(s, &r, &o);
    T_CHECK(strstr(a, "a &lt;b&gt; &amp; &quot;c&quot;") != NULL);
    T_CHECK(strstr(a, "stroke=\"#b30000\"") == NULL); /* no transfer marks */
    free(a);
    mgc_sim_result_free(&r);
    mgc_schedule_free(s);
    mgc_diags_free(&d);
}

int main(void) {
    test_single_rank();
    test_text_chart();
    test_grid();
    test_uneven();
    test_random_costs();
    test_dropped_receive();
    test_swapped_order();
    test_data_order();
    test_malformed();
    test_validation();
    test_arbitrary();
    test_large();
    test_from_config();
    test_svg();
    return t_summary("test_schedule");
}
