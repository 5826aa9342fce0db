/* test_memplan.c - the memory planner (compiler/memplan.c) against an
 * independent checker.
 *
 * The checker here never calls the assigner: it sweeps the buffers in time
 * order and compares every newly live buffer with every buffer still live
 * (overlapping lifetimes must mean disjoint bytes), checks alignment and
 * arena bounds, and computes the live lower bound itself.  It runs on
 * thousands of random request sets and on synthetic stage programs (1F1B and
 * interleaved instruction streams written here, chunks shaped like
 * transformer layers), where it also checks stash lifetimes against the
 * stream, transient tensors against a liveness computed here from the op
 * lists, and the optimizer-state bytes against Megatron's 18 and 6 + 12/d
 * bytes per parameter (docs/memory-plan.md gives the padding rule the
 * expected values follow). */
#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "compile.h"
#include "config.h"
#include "diag.h"
#include "ir.h"
#include "memplan.h"
#include "partition.h"
#include "plan.h"
#include "schedule.h"
#include "testlib.h"

/* ---- a deterministic generator (splitmix64) ----------------------------- */

static uint64_t rng = 0x9e3779b97f4a7c15u;

static uint64_t rnd(void) {
    uint64_t z = (rng += 0x9e3779b97f4a7c15u);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9u;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebu;
    return z ^ (z >> 31);
}

static uint64_t below(uint64_t n) {
    return n ? rnd() % n : 0;
}

/* ---- the independent checker -------------------------------------------- */

typedef struct cbuf {
    uint64_t off, bytes, align;
    int64_t b, e; /* live [b, e) */
    int64_t id;   /* for messages */
} cbuf;

static int by_begin(const void *x, const void *y) {
    const cbuf *a = x, *b = y;
    if (a->b != b->b) return a->b < b->b ? -1 : 1;
    return a->id < b->id ? -1 : a->id > b->id;
}

/* 1 when every pair of buffers with overlapping lifetimes has disjoint
 * bytes, every buffer is aligned and inside the arena.  Sweep: O(n log n +
 * n * live). */
static int check_layout(const cbuf *in, size_t n, uint64_t arena, const char *what) {
    cbuf *v = malloc((n ? n : 1) * sizeof *v);
    size_t *act = malloc((n ? n : 1) * sizeof *act), na = 0;
    int ok = 1;
    memcpy(v, in, n * sizeof *v);
    for (size_t i = 0; i < n && ok; i++) {
        if (v[i].align && v[i].off % v[i].align) {
            fprintf(stderr, "%s: buffer %" PRId64 " at %" PRIu64 " not aligned to %" PRIu64 "\n",
                    what, v[i].id, v[i].off, v[i].align);
            ok = 0;
        }
        if (v[i].bytes && v[i].e > v[i].b && (v[i].off > arena || v[i].bytes > arena - v[i].off)) {
            fprintf(stderr,
                    "%s: buffer %" PRId64 " [%" PRIu64 ", +%" PRIu64 ") outside the arena %" PRIu64
                    "\n",
                    what, v[i].id, v[i].off, v[i].bytes, arena);
            ok = 0;
        }
    }
    qsort(v, n, sizeof *v, by_begin);
    for (size_t i = 0; i < n && ok; i++) {
        if (!v[i].bytes || v[i].e <= v[i].b) continue;
        size_t k = 0;
        for (size_t j = 0; j < na; j++)
            if (v[act[j]].e > v[i].b) act[k++] = act[j];
        na = k;
        for (size_t j = 0; j < na; j++) {
            const cbuf *a = &v[act[j]], *c = &v[i];
            if (a->off < c->off + c->bytes && c->off < a->off + a->bytes) {
                fprintf(stderr,
                        "%s: buffers %" PRId64 " [%" PRIu64 ", +%" PRIu64 ") live [%" PRId64
                        ", %" PRId64 ") and %" PRId64 " [%" PRIu64 ", +%" PRIu64 ") live [%" PRId64
                        ", %" PRId64 ") collide\n",
                        what, a->id, a->off, a->bytes, a->b, a->e, c->id, c->off, c->bytes, c->b,
                        c->e);
                ok = 0;
                break;
            }
        }
        act[na++] = i;
    }
    free(v);
    free(act);
    return ok;
}

/* The same by brute force over all pairs (small sets): checks the checker. */
static int check_pairs(const cbuf *v, size_t n) {
    for (size_t i = 0; i < n; i++)
        for (size_t j = i + 1; j < n; j++) {
            if (!v[i].bytes || !v[j].bytes || v[i].e <= v[i].b || v[j].e <= v[j].b) continue;
            if (!(v[i].b < v[j].e && v[j].b < v[i].e)) continue;
            if (v[i].off < v[j].off + v[j].bytes && v[j].off < v[i].off + v[i].bytes) return 0;
        }
    return 1;
}

/* Max over time of live bytes: at every begin time, sum what is live. */
static uint64_t live_peak(const cbuf *v, size_t n, int aligned) {
    uint64_t best = 0;
    for (size_t i = 0; i < n; i++) {
        if (!v[i].bytes || v[i].e <= v[i].b) continue;
        uint64_t s = 0;
        for (size_t j = 0; j < n; j++)
            if (v[j].bytes && v[j].b <= v[i].b && v[i].b < v[j].e) {
                uint64_t a = aligned && v[j].align ? v[j].align : 1;
                s += (v[j].bytes + a - 1) / a * a;
            }
        if (s > best) best = s;
    }
    return best;
}

/* The same by sorted events (large sets). */
typedef struct ev {
    int64_t t;
    int kind; /* 0 end, 1 begin: ends first at equal times */
    uint64_t bytes;
} ev;

static int ev_cmp(const void *x, const void *y) {
    const ev *a = x, *b = y;
    if (a->t != b->t) return a->t < b->t ? -1 : 1;
    return a->kind - b->kind;
}

static uint64_t live_peak_sweep(const cbuf *v, size_t n, int64_t *at) {
    ev *e = malloc((2 * n + 1) * sizeof *e);
    size_t m = 0;
    for (size_t i = 0; i < n; i++) {
        if (!v[i].bytes || v[i].e <= v[i].b) continue;
        e[m++] = (ev){v[i].b, 1, v[i].bytes};
        e[m++] = (ev){v[i].e, 0, v[i].bytes};
    }
    qsort(e, m, sizeof *e, ev_cmp);
    uint64_t cur = 0, best = 0;
    if (at) *at = -1;
    for (size_t i = 0; i < m; i++) {
        if (e[i].kind) {
            cur += e[i].bytes;
            if (cur > best) {
                best = cur;
                if (at) *at = e[i].t;
            }
        } else {
            cur -= e[i].bytes;
        }
    }
    free(e);
    return best;
}

static cbuf *from_reqs(const mgc_memreq *r, const uint64_t *off, size_t n) {
    cbuf *v = malloc((n ? n : 1) * sizeof *v);
    for (size_t i = 0; i < n; i++)
        v[i] = (cbuf){off[i],          r[i].bytes,    r[i].align ? r[i].align : MGC_PLAN_ALIGN,
                      r[i].live_begin, r[i].live_end, (int64_t)i};
    return v;
}

/* ---- the assigner on hand-made sets ---------------------------------- */

static void test_assign_basic(void) {
    uint64_t off[8], arena = 1;
    mgc_memplan_stats st;
    /* A [0,4) 1024, B [4,8) 512 may share A's bytes, C [2,6) 512 overlaps both */
    mgc_memreq r[3] = {{1024, 0, 4, 0}, {512, 4, 8, 0}, {512, 2, 6, 0}};
    T_CHECK(mgc_memplan_assign(r, 3, off, &arena, &st) == MGC_MEMPLAN_OK);
    T_EQ_U64(off[0], 0);
    T_EQ_U64(off[2], 1024); /* above A */
    T_EQ_U64(off[1], 0);    /* B reuses A's bytes (below C) */
    T_EQ_U64(arena, 1536);
    T_EQ_U64(st.lower_bound_bytes, 1536);
    T_EQ_I64(st.peak_time, 2);

    /* best fit: after t=2 two holes open between long-lived buffers, 6 KiB
     * at 8192 and 3 KiB at 18432; a 1 KiB buffer takes the smaller */
    mgc_memreq t[6] = {
        {8192, 0, 10, 0}, /* A at 0 */
        {6144, 0, 2, 0},  /* H1 at 8192 */
        {4096, 0, 10, 0}, /* B at 14336 */
        {3072, 0, 2, 0},  /* H2 at 18432 */
        {2048, 0, 10, 0}, /* C at 21504 */
        {1024, 3, 9, 0},  /* X: into H2's hole */
    };
    T_CHECK(mgc_memplan_assign(t, 6, off, &arena, NULL) == MGC_MEMPLAN_OK);
    T_EQ_U64(off[1], 8192);
    T_EQ_U64(off[3], 18432);
    T_EQ_U64(off[4], 21504);
    T_EQ_U64(off[5], 18432);
    T_EQ_U64(arena, 23552);
    /* touching lifetimes share */
    mgc_memreq tt[2] = {{4096, 0, 3, 0}, {4096, 3, 6, 0}};
    T_CHECK(mgc_memplan_assign(tt, 2, off, &arena, NULL) == MGC_MEMPLAN_OK);
    T_EQ_U64(off[0], off[1]);
    T_EQ_U64(arena, 4096);

    /* zero bytes and empty lifetimes: offset 0, no conflict, no arena */
    mgc_memreq z[3] = {{0, 0, 5, 0}, {4096, 3, 3, 0}, {100, 0, 1, 0}};
    T_CHECK(mgc_memplan_assign(z, 3, off, &arena, &st) == MGC_MEMPLAN_OK);
    T_EQ_U64(off[0], 0);
    T_EQ_U64(off[1], 0);
    T_EQ_U64(arena, 256); /* 100 bytes rounded to the plan alignment */
    T_EQ_U64(st.lower_bound_bytes, 100);
    T_CHECK(mgc_memplan_assign(NULL, 0, NULL, &arena, &st) == MGC_MEMPLAN_OK);
    T_EQ_U64(arena, 0);
    T_EQ_I64(st.peak_time, -1);

    /* alignment */
    mgc_memreq a[3] = {{100, 0, 2, 1}, {100, 0, 2, 4096}, {8, 0, 2, 8}};
    T_CHECK(mgc_memplan_assign(a, 3, off, &arena, NULL) == MGC_MEMPLAN_OK);
    T_EQ_U64(off[1] % 4096, 0);
    T_EQ_U64(off[2] % 8, 0);
    cbuf *v = from_reqs(a, off, 3);
    T_CHECK(check_pairs(v, 3));
    free(v);

    /* invalid input */
    mgc_memreq bad1[1] = {{8, 0, 2, 3}};
    T_CHECK(mgc_memplan_assign(bad1, 1, off, &arena, NULL) == MGC_MEMPLAN_ERR_INVALID);
    mgc_memreq bad2[1] = {{8, 5, 2, 0}};
    T_CHECK(mgc_memplan_assign(bad2, 1, off, &arena, NULL) == MGC_MEMPLAN_ERR_INVALID);
    mgc_memreq big[2] = {{UINT64_MAX / 2 + 1, 0, 2, 0}, {UINT64_MAX / 2 + 1, 0, 2, 0}};
    T_CHECK(mgc_memplan_assign(big, 2, off, &arena, NULL) == MGC_MEMPLAN_ERR_OVERFLOW);
    mgc_memreq one[1] = {{8, 0, 10, 0}};
    mgc_memseg ov[1] = {{0, 5, 12}}; /* overlaps the request's own interval */
    T_CHECK(mgc_memplan_assign_segs(one, 1, ov, 1, off, &arena, NULL) == MGC_MEMPLAN_ERR_INVALID);
    mgc_memseg oob[1] = {{1, 5, 12}};
    T_CHECK(mgc_memplan_assign_segs(one, 1, oob, 1, off, &arena, NULL) == MGC_MEMPLAN_ERR_INVALID);
    T_CHECK(strcmp(mgc_memplan_status_name(MGC_MEMPLAN_ERR_OVERFLOW), "?") != 0);
}

/* A request with two intervals conflicts with what overlaps either. */
static void test_assign_segments(void) {
    uint64_t off[3], arena;
    mgc_memreq r[3] = {{1024, 0, 2, 0}, {1024, 3, 5, 0}, {1024, 6, 8, 0}};
    mgc_memseg x[1] = {{0, 7, 9}}; /* request 0 is live again over [7, 9): meets request 2 */
    T_CHECK(mgc_memplan_assign_segs(r, 3, x, 1, off, &arena, NULL) == MGC_MEMPLAN_OK);
    T_CHECK(off[0] != off[2]);
    T_EQ_U64(arena, 2048);
    /* random multi-interval sets against the brute-force pair checker */
    for (int round = 0; round < 300; round++) {
        size_t n = 1 + below(60), ne = below(60);
        mgc_memreq *q = malloc(n * sizeof *q);
        mgc_memseg *e = malloc((ne ? ne : 1) * sizeof *e);
        uint64_t *o = malloc(n * sizeof *o);
        for (size_t i = 0; i < n; i++) {
            int64_t b = (int64_t)below(40);
            q[i] = (mgc_memreq){1 + below(5000), b, b + 1 + (int64_t)below(10), 0};
        }
        /* extra intervals after every request's own one, disjoint from it */
        size_t k = 0;
        for (size_t i = 0; i < ne; i++) {
            size_t rq = below(n);
            int64_t b =
                q[rq].live_end + 2 + (int64_t)below(30) + 100 * (int64_t)i; /* one per slot */
            e[k++] = (mgc_memseg){(int64_t)rq, b, b + 1 + (int64_t)below(20)};
        }
        T_CHECK(mgc_memplan_assign_segs(q, n, e, k, o, &arena, NULL) == MGC_MEMPLAN_OK);
        /* expand to one checker buffer per interval, ids = request: same request never collides
         * with itself */
        size_t m = n + k;
        cbuf *v = malloc(m * sizeof *v);
        for (size_t i = 0; i < n; i++)
            v[i] = (cbuf){o[i], q[i].bytes, 256, q[i].live_begin, q[i].live_end, (int64_t)i};
        for (size_t i = 0; i < k; i++)
            v[n + i] = (cbuf){o[e[i].req], q[e[i].req].bytes, 256, e[i].begin, e[i].end, e[i].req};
        int ok = 1;
        for (size_t i = 0; i < m && ok; i++)
            for (size_t j = i + 1; j < m && ok; j++) {
                if (v[i].id == v[j].id) continue;
                if (v[i].b < v[j].e && v[j].b < v[i].e && v[i].off < v[j].off + v[j].bytes &&
                    v[j].off < v[i].off + v[i].bytes)
                    ok = 0;
            }
        T_CHECK(ok);
        free(v);
        free(q);
        free(e);
        free(o);
    }
}

/* Thousands of random sets: sizes of several shapes, random lifetimes and
 * alignments.  Valid, deterministic, at least the lower bound, and within a
 * sane factor of it. */
static void test_assign_random(void) {
    double worst = 0;
    int rounds = 3000;
    for (int round = 0; round < rounds; round++) {
        size_t n = 1 + below(round % 300 == 0 ? 2000 : 200);
        int64_t T = 1 + (int64_t)below(500);
        int shape = (int)below(4);
        mgc_memreq *r = malloc(n * sizeof *r);
        uint64_t *off = malloc(n * sizeof *off), *off2 = malloc(n * sizeof *off2);
        for (size_t i = 0; i < n; i++) {
            uint64_t bytes;
            switch (shape) {
            case 0:
                bytes = 1 + below(1 << 20);
                break; /* uniform */
            case 1:
                bytes = (uint64_t)1 << (8 + below(16));
                break; /* powers of two */
            case 2:
                bytes = below(10) ? 256 + below(4096) : 1 + below((uint64_t)1 << 30);
                break; /* a few huge */
            default:
                bytes = 1000 * (1 + below(4));
                break; /* few distinct sizes */
            }
            if (below(50) == 0) bytes = 0;
            int64_t b = (int64_t)below((uint64_t)T),
                    len = below(4) ? 1 + (int64_t)below(1 + (uint64_t)T / 8)
                                   : (int64_t)below((uint64_t)T + 1);
            if (below(30) == 0) len = 0;
            uint64_t align = below(3) ? 0 : (uint64_t)1 << below(13);
            r[i] = (mgc_memreq){bytes, b - (int64_t)below(3) * 1000000, b + len,
                                align}; /* negative times too */
            if (r[i].live_end < r[i].live_begin) r[i].live_end = r[i].live_begin;
        }
        uint64_t arena = 0, arena2 = 0;
        mgc_memplan_stats st;
        T_CHECK(mgc_memplan_assign(r, n, off, &arena, &st) == MGC_MEMPLAN_OK);
        cbuf *v = from_reqs(r, off, n);
        char what[64];
        snprintf(what, sizeof what, "random set %d", round);
        T_CHECK(check_layout(v, n, arena, what));
        if (n <= 200) T_CHECK(check_pairs(v, n));
        uint64_t lb = n <= 300 ? live_peak(v, n, 0) : live_peak_sweep(v, n, NULL);
        T_EQ_U64(st.lower_bound_bytes, lb);
        T_CHECK(arena >= lb);
        T_EQ_U64(arena % MGC_PLAN_ALIGN, 0);
        /* deterministic */
        T_CHECK(mgc_memplan_assign(r, n, off2, &arena2, NULL) == MGC_MEMPLAN_OK);
        T_EQ_U64(arena2, arena);
        T_CHECK(memcmp(off, off2, n * sizeof *off) == 0);
        /* sane: against the aligned lower bound (padding is not placement waste) */
        uint64_t lba = n <= 300 ? live_peak(v, n, 1) : lb;
        if (n <= 300 && lba >= (1 << 16)) {
            double ratio = (double)arena / (double)lba;
            if (ratio > worst) worst = ratio;
            T_CHECK(ratio <= 1.75);
        }
        free(v);
        free(r);
        free(off);
        free(off2);
    }
    printf("random sets: %d, worst arena / aligned lower bound %.3f\n", rounds, worst);
}

/* Equal sizes form an interval graph: greedy in begin order with best fit is
 * optimal, the arena is exactly the lower bound. */
static void test_assign_equal_sizes(void) {
    for (int round = 0; round < 200; round++) {
        size_t n = 1 + below(500);
        uint64_t size = 256 * (1 + below(64));
        mgc_memreq *r = malloc(n * sizeof *r);
        uint64_t *off = malloc(n * sizeof *off), arena;
        for (size_t i = 0; i < n; i++) {
            int64_t b = (int64_t)below(300);
            r[i] = (mgc_memreq){size, b, b + 1 + (int64_t)below(40), 0};
        }
        mgc_memplan_stats st;
        T_CHECK(mgc_memplan_assign(r, n, off, &arena, &st) == MGC_MEMPLAN_OK);
        cbuf *v = from_reqs(r, off, n);
        T_CHECK(check_layout(v, n, arena, "equal sizes"));
        T_EQ_U64(arena, live_peak(v, n, 0));
        free(v);
        free(r);
        free(off);
    }
}

/* 40,000 requests shaped like a deep interleaved pipeline rank (stashes of
 * two sizes live forward-to-backward, short transfer buffers, persistent
 * state) plus random noise: completes, valid, near the lower bound. */
static void test_assign_large(void) {
    size_t n = 40000, k = 0;
    mgc_memreq *r = malloc(n * sizeof *r);
    uint64_t *off = malloc(n * sizeof *off), arena;
    for (int i = 0; i < 6; i++)
        r[k++] = (mgc_memreq){((uint64_t)1 << 30) + 4096 * (uint64_t)i, 0, 1 << 20, 0};
    int64_t t = 0, inflight = 320;
    while (k + 8 < n - 2000) {
        uint64_t sz = (k & 1) ? 201326592 : 100663296;
        r[k++] = (mgc_memreq){sz, t, t + 2 * inflight + 1, 0}; /* stash */
        r[k++] = (mgc_memreq){52428800, t - 1, t + 1, 0};      /* recv act */
        r[k++] = (mgc_memreq){52428800, t, t + 2, 0};          /* send act */
        r[k++] = (mgc_memreq){52428800, t + 2 * inflight - 1, t + 2 * inflight + 1, 0}; /* grads */
        t += 2;
    }
    while (k < n) {
        int64_t b = (int64_t)below((uint64_t)t);
        r[k++] = (mgc_memreq){1 + below(1 << 24), b, b + 1 + (int64_t)below(50), 0};
    }
    mgc_memplan_stats st;
    T_CHECK(mgc_memplan_assign(r, n, off, &arena, &st) == MGC_MEMPLAN_OK);
    cbuf *v = from_reqs(r, off, n);
    T_CHECK(check_layout(v, n, arena, "40k requests"));
    uint64_t lb = live_peak_sweep(v, n, NULL);
    T_EQ_U64(st.lower_bound_bytes, lb);
    T_CHECK(arena >= lb);
    T_CHECK((double)arena <= 1.10 * (double)lb);
    printf("40,000 requests: arena %.3f x lower bound, %" PRIu64 " overlaps examined\n",
           (double)arena / (double)lb, st.overlaps);
    free(v);
    free(r);
    free(off);
}

/* ---- synthetic stage programs ----------------------------------------------
 * What the partitioner and the scheduler hand the memory planner, built here
 * by hand: per pipeline rank, chunks of transformer layers (params, fp32
 * grads, stashed activations with partitioner-chosen stash offsets,
 * transients, recompute in the backward), the embedding and the loss on the
 * first and last virtual stage, and 1F1B / interleaved streams. */

typedef struct synth {
    int64_t pp, vp, M;     /* pipeline ranks, chunks per rank, microbatches */
    int64_t layers;        /* decoder layers per chunk */
    int64_t h, f, s, b, V; /* hidden, ffn, local sequence, microbatch, local vocab */
    int64_t experts;       /* > 0: the MLP is a grouped (expert) linear */
    int recompute;         /* the GELU output is recomputed in the backward */
    mgc_dtype dt;          /* compute dtype */
} synth;

typedef struct cbuild {
    mgc_plan *plan;
    mgc_plan_chunk *ch;
    int64_t cap_t, cap_f, cap_b;
    uint64_t stash;
} cbuild;

static int32_t tens(cbuild *cb, const char *name, int role, mgc_dtype dt, int64_t d0, int64_t d1,
                    int64_t d2, int saved) {
    mgc_plan_chunk *ch = cb->ch;
    if (ch->n_tensors == cb->cap_t) {
        cb->cap_t = cb->cap_t ? 2 * cb->cap_t : 64;
        ch->tensors = realloc(ch->tensors, (size_t)cb->cap_t * sizeof *ch->tensors);
    }
    mgc_plan_tensor *t = &ch->tensors[ch->n_tensors];
    memset(t, 0, sizeof *t);
    t->name = mgc_plan_str(cb->plan, name);
    t->dtype = (uint16_t)dt;
    int64_t dims[3] = {d0, d1, d2};
    uint64_t el = 1;
    for (int i = 0; i < 3 && dims[i] > 0; i++)
        t->dim[t->rank++] = dims[i], el *= (uint64_t)dims[i];
    t->bytes = el * mgc_dtype_size(dt);
    t->role = (uint16_t)role;
    t->split_axis = MGC_PLAN_NO_SPLIT;
    t->buffer = -1;
    if (saved) { /* the partitioner's stash layout: 256-aligned, in order */
        t->buffer = MGC_PLAN_BUF_STASH;
        t->offset = cb->stash;
        cb->stash = (cb->stash + t->bytes + 255) / 256 * 256;
    }
    return (int32_t)ch->n_tensors++;
}

static void op(cbuild *cb, int bwd, int kind, int flags, int n_in, const int32_t *in, int n_out,
               const int32_t *out) {
    mgc_plan_chunk *ch = cb->ch;
    int64_t *n = bwd ? &ch->n_bwd : &ch->n_fwd, *cap = bwd ? &cb->cap_b : &cb->cap_f;
    mgc_plan_op **v = bwd ? &ch->bwd : &ch->fwd;
    if (*n == *cap) {
        *cap = *cap ? 2 * *cap : 64;
        *v = realloc(*v, (size_t)*cap * sizeof **v);
    }
    mgc_plan_op *o = &(*v)[*n];
    memset(o, 0, sizeof *o);
    o->kind = (uint16_t)kind;
    o->flags = (uint16_t)flags;
    o->layer = -1;
    o->n_in = (uint16_t)n_in;
    o->n_out = (uint16_t)n_out;
    for (int i = 0; i < n_in; i++)
        o->in[i] = in[i];
    for (int i = 0; i < n_out; i++)
        o->out[i] = out[i];
    (*n)++;
}

#define OP(cb, bwd, kind, flags, INS, OUTS)                                                        \
    do {                                                                                           \
        const int32_t in_[] = INS, out_[] = OUTS;                                                  \
        op(cb, bwd, kind, flags, (int)(sizeof in_ / sizeof *in_), in_,                             \
           (int)(sizeof out_ / sizeof *out_), out_);                                               \
    } while (0)
#define L(...)                                                                                     \
    { __VA_ARGS__ }

/* A param and its fp32 grad, named "<name>" and "<name>.grad". */
static int32_t param(cbuild *cb, const char *name, const synth *s, int64_t d0, int64_t d1,
                     int64_t d2, int32_t *grad) {
    char gn[160];
    int32_t p = tens(cb, name, MGC_TR_PARAM, s->dt, d0, d1, d2, 0);
    snprintf(gn, sizeof gn, "%.96s.grad", name);
    *grad = tens(cb, gn, MGC_TR_GRAD, MGC_DT_F32, d0, d1, d2, 0);
    return p;
}

/* Chunk of virtual stage vs (of pp*vp). */
static void build_chunk(mgc_plan *plan, mgc_plan_chunk *ch, const synth *s, int64_t vs) {
    memset(ch, 0, sizeof *ch);
    cbuild cbv = {plan, ch, 0, 0, 0, 0}, *cb = &cbv;
    int64_t last = s->pp * s->vp - 1, h = s->h, f = s->f, T = s->s * s->b;
    ch->embedding = vs == 0;
    ch->loss = vs == last;
    ch->first_layer = (int32_t)(vs * s->layers);
    ch->num_layers = (int32_t)s->layers;
    char nm[96];
    int32_t x, g_;
    /* the chunk input: embedded tokens, or the received activation (saved: layer 0 reads it back)
     */
    if (ch->embedding) {
        int32_t tok = tens(cb, "tokens", MGC_TR_INPUT, MGC_DT_I64, s->b, s->s, 0, 0);
        int32_t wte = param(cb, "embedding.word", s, s->V, h, 0, &g_);
        x = tens(cb, "embedding.out", MGC_TR_ACTIVATION, s->dt, s->s, s->b, h, 1);
        OP(cb, 0, MGC_POP_EMBEDDING, 0, L(tok, wte), L(x));
        (void)g_;
    } else {
        x = tens(cb, "input", MGC_TR_ACTIVATION, s->dt, s->s, s->b, h, 1);
    }
    int32_t *xin = malloc((size_t)(s->layers + 1) * sizeof *xin);
    int32_t(*P)[5] = malloc((size_t)(s->layers + 1) * sizeof *P),
    (*G)[5] = malloc((size_t)(s->layers + 1) * sizeof *G);
    int32_t(*A)[8] = malloc((size_t)(s->layers + 1) * sizeof *A);
    for (int64_t l = 0; l < s->layers; l++) {
        int64_t L_ = vs * s->layers + l;
        xin[l] = x;
        snprintf(nm, sizeof nm, "layers.%" PRId64 ".norm.weight", L_);
        P[l][0] = param(cb, nm, s, h, 0, 0, &G[l][0]);
        snprintf(nm, sizeof nm, "layers.%" PRId64 ".qkv.weight", L_);
        P[l][1] = param(cb, nm, s, 3 * h, h, 0, &G[l][1]);
        snprintf(nm, sizeof nm, "layers.%" PRId64 ".proj.weight", L_);
        P[l][2] = param(cb, nm, s, h, h, 0, &G[l][2]);
        snprintf(nm, sizeof nm, "layers.%" PRId64 ".fc1.weight", L_);
        P[l][3] = s->experts ? param(cb, nm, s, s->experts, f, h, &G[l][3])
                             : param(cb, nm, s, f, h, 0, &G[l][3]);
        snprintf(nm, sizeof nm, "layers.%" PRId64 ".fc2.weight", L_);
        P[l][4] = s->experts ? param(cb, nm, s, s->experts, h, f, &G[l][4])
                             : param(cb, nm, s, h, f, 0, &G[l][4]);
        int32_t n1 = tens(cb, "n1", MGC_TR_ACTIVATION, s->dt, T, h, 0, 1);
        int32_t qkv = tens(cb, "qkv", MGC_TR_ACTIVATION, s->dt, T, 3 * h, 0, 1);
        int32_t att = tens(cb, "att", MGC_TR_ACTIVATION, s->dt, T, h, 0, 1);
        int32_t o = tens(cb, "o", MGC_TR_ACTIVATION, s->dt, T, h, 0, 0);
        int32_t xm = tens(cb, "x_mid", MGC_TR_ACTIVATION, s->dt, T, h, 0, 1);
        int32_t f1 = tens(cb, "f1", MGC_TR_ACTIVATION, s->dt, T, f, 0, 1);
        int32_t g = tens(cb, "gelu", MGC_TR_ACTIVATION, s->dt, T, f, 0, !s->recompute);
        int32_t f2 = tens(cb, "f2", MGC_TR_ACTIVATION, s->dt, T, h, 0, 0);
        int last_layer = l == s->layers - 1;
        int32_t xo = tens(cb, "x_out", MGC_TR_ACTIVATION, s->dt, T, h, 0, !last_layer || ch->loss);
        int mlp = s->experts ? MGC_POP_GROUPED_LINEAR : MGC_POP_LINEAR;
        OP(cb, 0, MGC_POP_NORM, 0, L(x, P[l][0]), L(n1));
        OP(cb, 0, MGC_POP_LINEAR, 0, L(n1, P[l][1]), L(qkv));
        OP(cb, 0, MGC_POP_ATTENTION, 0, L(qkv), L(att));
        OP(cb, 0, MGC_POP_LINEAR, 0, L(att, P[l][2]), L(o));
        OP(cb, 0, MGC_POP_ADD, 0, L(x, o), L(xm));
        OP(cb, 0, mlp, 0, L(xm, P[l][3]), L(f1));
        OP(cb, 0, MGC_POP_GELU, 0, L(f1), L(g));
        OP(cb, 0, mlp, 0, L(g, P[l][4]), L(f2));
        OP(cb, 0, MGC_POP_ADD, 0, L(xm, f2), L(xo));
        int32_t a8[8] = {n1, qkv, att, xm, f1, g, xo, 0};
        memcpy(A[l], a8, sizeof a8);
        x = xo;
    }
    int32_t loss = -1, lab = -1, mask = -1, nf = -1, logits = -1, Pf = -1, Gf = -1, Po = -1,
            Go = -1;
    if (ch->loss) {
        lab = tens(cb, "labels", MGC_TR_INPUT, MGC_DT_I64, s->b, s->s, 0, 0);
        mask = tens(cb, "loss_mask", MGC_TR_INPUT, MGC_DT_F32, s->b, s->s, 0, 0);
        Pf = param(cb, "final_norm.weight", s, h, 0, 0, &Gf);
        Po = param(cb, "output.weight", s, s->V, h, 0, &Go);
        nf = tens(cb, "final_norm.out", MGC_TR_ACTIVATION, s->dt, T, h, 0, 1);
        /* recompute: the logits too, so that the in-place gradient below shares the pass
         * workspace with them rather than the stash */
        logits = tens(cb, "logits", MGC_TR_ACTIVATION, MGC_DT_F32, T, s->V, 0, !s->recompute);
        loss = tens(cb, "loss", MGC_TR_LOSS, MGC_DT_F32, 1, 0, 0, 0);
        OP(cb, 0, MGC_POP_NORM, 0, L(x, Pf), L(nf));
        OP(cb, 0, MGC_POP_LINEAR, 0, L(nf, Po), L(logits));
        OP(cb, 0, MGC_POP_CROSS_ENTROPY, 0, L(logits, lab, mask), L(loss));
    }
    /* backward */
    int32_t dy;
    if (ch->loss) {
        /* the logits' gradient in the compute dtype, as the real programs: in place
         * (mgc_memplan_inplace, run_synth), at a row pitch when 16-bit */
        int32_t dl = tens(cb, "d_logits", MGC_TR_ACT_GRAD, s->dt, T, s->V, 0, 0);
        int32_t dnf = tens(cb, "d_final_norm", MGC_TR_ACT_GRAD, s->dt, T, h, 0, 0);
        dy = tens(cb, "d_x", MGC_TR_ACT_GRAD, s->dt, T, h, 0, 0);
        if (s->recompute) OP(cb, 1, MGC_POP_LINEAR, MGC_POF_RECOMPUTE, L(nf, Po), L(logits));
        OP(cb, 1, MGC_POP_CROSS_ENTROPY_BWD, 0, L(logits, lab, mask), L(dl));
        OP(cb, 1, MGC_POP_LINEAR_DGRAD, 0, L(dl, Po), L(dnf));
        OP(cb, 1, MGC_POP_LINEAR_WGRAD, 0, L(dl, nf), L(Go));
        OP(cb, 1, MGC_POP_NORM_BWD, 0, L(dnf, x, Pf), L(dy, Gf));
    } else {
        dy = tens(cb, "d_output", MGC_TR_ACT_GRAD, s->dt, T, h, 0, 0); /* received */
    }
    (void)loss;
    for (int64_t l = s->layers - 1; l >= 0; l--) {
        int32_t n1 = A[l][0], qkv = A[l][1], att = A[l][2], xm = A[l][3], f1 = A[l][4], g = A[l][5];
        int mlpd = s->experts ? MGC_POP_GROUPED_LINEAR_DGRAD : MGC_POP_LINEAR_DGRAD;
        int mlpw = s->experts ? MGC_POP_GROUPED_LINEAR_WGRAD : MGC_POP_LINEAR_WGRAD;
        int32_t dg = tens(cb, "d_gelu", MGC_TR_ACT_GRAD, s->dt, T, f, 0, 0);
        int32_t df1 = tens(cb, "d_f1", MGC_TR_ACT_GRAD, s->dt, T, f, 0, 0);
        int32_t dxm1 = tens(cb, "d_x_mid.mlp", MGC_TR_ACT_GRAD, s->dt, T, h, 0, 0);
        int32_t dxm = tens(cb, "d_x_mid", MGC_TR_ACT_GRAD, s->dt, T, h, 0, 0);
        int32_t datt = tens(cb, "d_att", MGC_TR_ACT_GRAD, s->dt, T, h, 0, 0);
        int32_t dqkv = tens(cb, "d_qkv", MGC_TR_ACT_GRAD, s->dt, T, 3 * h, 0, 0);
        int32_t dn1 = tens(cb, "d_n1", MGC_TR_ACT_GRAD, s->dt, T, h, 0, 0);
        int32_t dxa = tens(cb, "d_x_in.attn", MGC_TR_ACT_GRAD, s->dt, T, h, 0, 0);
        int32_t dx_in = tens(cb, "d_x_in", MGC_TR_ACT_GRAD, s->dt, T, h, 0, 0);
        if (s->recompute) OP(cb, 1, MGC_POP_GELU, MGC_POF_RECOMPUTE, L(f1), L(g));
        OP(cb, 1, mlpd, 0, L(dy, P[l][4]), L(dg));
        OP(cb, 1, mlpw, 0, L(g, dy), L(G[l][4]));
        OP(cb, 1, MGC_POP_GELU_BWD, 0, L(dg, f1), L(df1));
        OP(cb, 1, mlpd, 0, L(df1, P[l][3]), L(dxm1));
        OP(cb, 1, mlpw, 0, L(xm, df1), L(G[l][3]));
        OP(cb, 1, MGC_POP_ADD_BWD, 0, L(dy, dxm1), L(dxm));
        OP(cb, 1, MGC_POP_LINEAR_DGRAD, 0, L(dxm, P[l][2]), L(datt));
        OP(cb, 1, MGC_POP_LINEAR_WGRAD, 0, L(att, dxm), L(G[l][2]));
        OP(cb, 1, MGC_POP_ATTENTION_BWD, 0, L(datt, qkv), L(dqkv));
        OP(cb, 1, MGC_POP_LINEAR_DGRAD, 0, L(dqkv, P[l][1]), L(dn1));
        OP(cb, 1, MGC_POP_LINEAR_WGRAD, 0, L(n1, dqkv), L(G[l][1]));
        OP(cb, 1, MGC_POP_NORM_BWD, 0, L(dn1, xin[l], P[l][0]), L(dxa, G[l][0]));
        OP(cb, 1, MGC_POP_ADD_BWD, 0, L(dxm, dxa), L(dx_in));
        dy = dx_in;
    }
    if (ch->embedding) {
        /* embedding backward: scatter-add into the word embedding's grad; reads the tokens */
        int32_t tok = 0, wte = 1, gwte = 2; /* created first, in this order */
        OP(cb, 1, MGC_POP_EMBEDDING_BWD, 0, L(dy, tok, wte), L(gwte));
    }
    ch->stash_bytes = cb->stash;
    ch->send_bytes = ch->loss ? 0 : (uint64_t)T * (uint64_t)h * mgc_dtype_size(s->dt);
    free(xin);
    free(P);
    free(G);
    free(A);
}

/* ---- instruction streams ---- */

typedef struct stream {
    mgc_instr *v;
    int64_t n, cap;
} stream;

static void emit(stream *st, int op, int64_t chunk, int64_t mb, int64_t peer) {
    if (st->n == st->cap) {
        st->cap = st->cap ? 2 * st->cap : 256;
        st->v = realloc(st->v, (size_t)st->cap * sizeof *st->v);
    }
    st->v[st->n++] = (mgc_instr){(uint16_t)op, (uint16_t)chunk, (int32_t)mb, (int32_t)peer, 0, 0};
}

static void emit_fwd(stream *st, const synth *s, int64_t r, int64_t c, int64_t mb) {
    int64_t vs = c * s->pp + r, last = s->pp * s->vp - 1;
    if (vs == 0 || vs == last) emit(st, MGC_I_LOAD_BATCH, c, mb, -1);
    if (vs > 0) emit(st, MGC_I_RECV_ACT, c, mb, (r + s->pp - 1) % s->pp);
    emit(st, MGC_I_FORWARD, c, mb, -1);
    if (vs < last) emit(st, MGC_I_SEND_ACT, c, mb, (r + 1) % s->pp);
}

static void emit_bwd(stream *st, const synth *s, int64_t r, int64_t c, int64_t mb) {
    int64_t vs = c * s->pp + r, last = s->pp * s->vp - 1;
    if (vs < last) emit(st, MGC_I_RECV_GRAD, c, mb, (r + 1) % s->pp);
    emit(st, MGC_I_BACKWARD, c, mb, -1);
    if (vs > 0) emit(st, MGC_I_SEND_GRAD, c, mb, (r + s->pp - 1) % s->pp);
}

/* Megatron's warm-up count and virtual-microbatch order (chunk ids of the
 * k-th forward / backward); vp = 1 is plain 1F1B. */
static int64_t warmup(const synth *s, int64_t r) {
    int64_t total = s->M * s->vp;
    int64_t w = s->vp == 1 ? s->pp - r - 1 : 2 * (s->pp - r - 1) + (s->vp - 1) * s->pp;
    return w < total ? w : total;
}

static void vmb(const synth *s, int64_t k, int fwd, int64_t *chunk, int64_t *mb) {
    if (s->vp == 1) {
        *chunk = 0, *mb = k;
        return;
    }
    int64_t in_group = k % (s->pp * s->vp);
    int64_t c = in_group / s->pp;
    *chunk = fwd ? c : s->vp - 1 - c;
    *mb = k / (s->pp * s->vp) * s->pp + k % s->pp;
}

static void build_stream(stream *st, const synth *s, int64_t r) {
    int64_t total = s->M * s->vp, w = warmup(s, r), c, mb;
    for (int64_t k = 0; k < w; k++)
        vmb(s, k, 1, &c, &mb), emit_fwd(st, s, r, c, mb);
    for (int64_t k = 0; k < total - w; k++) {
        vmb(s, w + k, 1, &c, &mb), emit_fwd(st, s, r, c, mb);
        vmb(s, k, 0, &c, &mb), emit_bwd(st, s, r, c, mb);
    }
    for (int64_t k = total - w; k < total; k++)
        vmb(s, k, 0, &c, &mb), emit_bwd(st, s, r, c, mb);
    for (int64_t b = 0; b < s->vp; b++) {
        emit(st, MGC_I_REDUCE_GRADS, 0, -1, -1);
        st->v[st->n - 1].arg = (uint32_t)b;
    }
    emit(st, MGC_I_OPTIMIZER, 0, -1, -1);
}

static mgc_plan *build_plan(const synth *s) {
    mgc_plan *p = mgc_plan_new();
    p->grid = (mgc_grid){s->pp, 1, 1, 1, s->pp, s->vp, 1, 1, 1};
    p->num_microbatches = s->M;
    p->micro_batch_size = s->b;
    p->seq_length = s->s;
    p->schedule = s->vp > 1 ? MGC_SCHED_INTERLEAVED : MGC_SCHED_1F1B;
    p->n_stages = s->pp;
    p->stages = calloc((size_t)s->pp, sizeof *p->stages);
    for (int64_t r = 0; r < s->pp; r++) {
        mgc_stage_program *sp = &p->stages[r];
        sp->pp_rank = r;
        sp->n_chunks = s->vp;
        sp->chunks = calloc((size_t)s->vp, sizeof *sp->chunks);
        for (int64_t c = 0; c < s->vp; c++)
            build_chunk(p, &sp->chunks[c], s, c * s->pp + r);
        stream st = {0};
        build_stream(&st, s, r);
        sp->instrs = st.v;
        sp->n_instrs = st.n;
    }
    return p;
}

static mgc_config *synth_config(const synth *s, int precision, int distopt, int64_t cp) {
    mgc_config *c = mgc_config_new();
    c->training.precision = precision;
    c->parallel.distributed_optimizer = distopt;
    c->model.seq_length = s->s * cp; /* s is the local (per context rank) sequence */
    c->model.hidden_size = s->h;
    c->training.micro_batch_size = s->b;
    c->derived.sequence_parallel = 0;
    return c;
}

/* ---- checks of one built stage ---- */

static int64_t find_instr(const mgc_stage_program *sp, int op, int64_t c, int64_t mb) {
    for (int64_t i = 0; i < sp->n_instrs; i++)
        if (sp->instrs[i].op == op && sp->instrs[i].chunk == c && sp->instrs[i].mb == mb) return i;
    return -1;
}

/* Per pass, the tensor intervals the contract requires, recomputed here:
 * [first touch, last touch], from the pass start when first read, to the
 * pass end when last written. */
static void pass_interval(const mgc_plan_op *ops, int64_t n, int32_t t, int64_t *b, int64_t *e) {
    *b = *e = -1;
    int first_read = 0, last_write = 0;
    for (int64_t i = 0; i < n; i++) {
        for (int k = 0; k < ops[i].n_in + ops[i].n_out; k++) {
            int rd = k < ops[i].n_in;
            int32_t x = rd ? ops[i].in[k] : ops[i].out[k - ops[i].n_in];
            if (x != t) continue;
            if (*b < 0) *b = i, first_read = rd;
            *e = i;
            last_write = !rd;
        }
    }
    if (*b < 0) return;
    if (first_read) *b = 0;
    *e = last_write ? n : *e + 1;
}

/* Checks that hold for any stage program, synthetic or from the real
 * partitioner and scheduler. */
/* What a device communicator's folds need (runtime/comm.c, plan.h mgc_fold_scratch_bytes):
 * every reduction the executor may run on the stage -- the gradients (fp32, all of them or
 * any part, as one all-reduce or a reduce-scatter of shards) over a group of any size up to
 * the world, and each collective op over its group -- must fit kernel_scratch. */
static uint64_t fold_need(const mgc_plan *p, const mgc_stage_program *sp) {
    uint64_t need = 0, grads = 0;
    if (p->grid.world <= 1) return 0;
    for (int64_t i = 0; i < sp->n_buffers; i++)
        if (sp->buffers[i].kind == MGC_BUF_GRAD) grads += sp->buffers[i].bytes / 4;
#define NEED(x)                                                                                    \
    do {                                                                                           \
        uint64_t n_ = (x);                                                                         \
        if (n_ > need) need = n_;                                                                  \
    } while (0)
    for (int64_t G = 2; G <= p->grid.world; G++) {
        /* the largest parts: all the gradients, and every size just past a round's multiple */
        NEED(mgc_fold_scratch_bytes(grads, G, 4, 0));
        NEED(mgc_fold_scratch_bytes(grads / (uint64_t)G, G, 4, 1));
        for (uint64_t m = 1; m <= 64 && m <= grads; m++)
            NEED(mgc_fold_scratch_bytes(grads - m, G, 4, 0));
    }
    mgc_coords co = {0};
    co.pp = sp->pp_rank;
    int64_t rank = mgc_grid_rank(&p->grid, &co);
    for (int64_t c = 0; c < sp->n_chunks; c++) {
        const mgc_plan_chunk *ch = &sp->chunks[c];
        for (int64_t i = 0; i < ch->n_fwd + ch->n_bwd; i++) {
            const mgc_plan_op *op = i < ch->n_fwd ? &ch->fwd[i] : &ch->bwd[i - ch->n_fwd];
            if (op->kind != MGC_POP_ALL_REDUCE && op->kind != MGC_POP_REDUCE_SCATTER) continue;
            uint64_t es = op->iattr[2] == MGC_DT_F32 ? 4 : op->iattr[2] == MGC_DT_I64 ? 0 : 2;
            int64_t G = mgc_grid_group(&p->grid, (mgc_group_kind)op->group, rank, NULL, 0);
            if (!es || G < 2) continue;
            int sc = op->kind == MGC_POP_REDUCE_SCATTER;
            NEED(mgc_fold_scratch_bytes((uint64_t)(sc ? op->iattr[1] : op->iattr[0]), G, es, sc));
        }
    }
#undef NEED
    return need;
}

/* What the CUDA launchers ask their kernel scratch for, derived here from the launchers
 * (runtime/cuda_*.c), not from codegen's sizes: the plan's kernel_scratch must hold the largest. */
static uint64_t scratch_need(const mgc_stage_program *sp) {
    uint64_t need = (1024 + 1) * 8; /* the gradient norm's partials (mgc_cuda_sumsq) */
    for (int64_t c = 0; c < sp->n_chunks; c++) {
        const mgc_plan_chunk *ch = &sp->chunks[c];
        for (int64_t i = 0; i < ch->n_fwd + ch->n_bwd; i++) {
            const mgc_plan_op *o = i < ch->n_fwd ? &ch->fwd[i] : &ch->bwd[i - ch->n_fwd];
            const mgc_plan_tensor *t0 = o->n_in > 0 ? &ch->tensors[o->in[0]] : NULL;
            uint64_t b = 0;
            if (o->kind == MGC_POP_NORM_BWD) {
                uint64_t rows = (uint64_t)o->iattr[1], nb = rows < 256 ? rows : 256;
                b = nb * (uint64_t)o->iattr[2] * (o->iattr[0] != 1 && o->n_out > 2 ? 2 : 1) * 4;
            } else if (o->kind == MGC_POP_ATTENTION_BWD && t0 && t0->rank == 4) {
                b = (uint64_t)(t0->dim[0] * t0->dim[1] * t0->dim[2]) * 4; /* dsum: sq b A */
            } else if (o->kind == MGC_POP_ATTENTION_BWD && t0 && t0->rank == 3) { /* fused qkv */
                uint64_t s = (uint64_t)t0->dim[0], bb = (uint64_t)t0->dim[1];
                b = s * bb * (uint64_t)o->iattr[1] * 4; /* dsum */
                /* the 16-bit kernels' column sums of dqkv: after dsum (256-byte aligned), a row
                 * of the qkv width a batch row and 64-row tile */
                if ((o->flags & MGC_POF_COLSUM) && t0->dtype != MGC_DT_F32)
                    b = (b + 255) / 256 * 256 + bb * ((s + 63) / 64) * (uint64_t)t0->dim[2] * 4;
            } else if (o->kind == MGC_POP_LINEAR_WGRAD && o->n_out > 1) {
                b = (uint64_t)((o->iattr[0] + 255) / 256) * (uint64_t)o->iattr[1] * 4;
            } else if (o->kind == MGC_POP_LINEAR_DGRAD_GELU && o->n_out > 1) { /* dh's column sums */
                b = (uint64_t)((o->iattr[0] + 255) / 256) * (uint64_t)o->iattr[2] * 4;
            } else if (o->kind == MGC_POP_EMBEDDING_BWD && t0 && o->iattr[0] > 0) {
                uint64_t n = (uint64_t)(t0->dim[0] * (t0->rank > 1 ? t0->dim[1] : 1));
                b = n * 8; /* at least the sort keys (a vocabulary shard: iattr[0]) */
            } else if (o->kind == MGC_POP_CROSS_ENTROPY && o->n_in > 1) {
                const mgc_plan_tensor *lab = &ch->tensors[o->in[1]];
                uint64_t n = 1;
                for (int d = 0; d < lab->rank; d++) n *= (uint64_t)lab->dim[d];
                b = n * 3 * 4; /* the fused path's row max and sums */
            }
            if (b > need) need = b;
        }
    }
    return need;
}

static void check_generic(const mgc_plan *p, int64_t r, const mgc_memplan_info *info) {
    const mgc_stage_program *sp = &p->stages[r];
    char what[64];
    snprintf(what, sizeof what, "stage %" PRId64 " buffers", r);
    /* 1. the arena: the independent layout check, the lower bound, the peak breakdown */
    cbuf *v = malloc((size_t)(sp->n_buffers ? sp->n_buffers : 1) * sizeof *v);
    int64_t kind_idx[MGC_BUF__COUNT];
    for (int k = 0; k < MGC_BUF__COUNT; k++)
        kind_idx[k] = -1;
    for (int64_t i = 0; i < sp->n_buffers; i++) {
        const mgc_buffer *b = &sp->buffers[i];
        v[i] = (cbuf){b->offset, b->bytes, MGC_PLAN_ALIGN, b->live_begin, b->live_end, i};
        if (kind_idx[b->kind] < 0) kind_idx[b->kind] = i;
        T_CHECK(b->live_begin >= 0 && b->live_begin <= b->live_end && b->live_end <= sp->n_instrs);
        T_CHECK(b->bytes > 0);
    }
    T_CHECK(check_layout(v, (size_t)sp->n_buffers, sp->arena_bytes, what));
    uint64_t lb = live_peak_sweep(v, (size_t)sp->n_buffers, NULL);
    T_CHECK(sp->arena_bytes >= lb);
    T_EQ_U64(info->lower_bound_bytes, lb);
    T_EQ_U64(info->arena_bytes, sp->arena_bytes);
    uint64_t sum = 0;
    for (int k = 0; k < MGC_BUF__COUNT; k++)
        sum += sp->by_kind[k];
    T_EQ_U64(sum, lb); /* by_kind is the breakdown at the peak */
    /* the workspaces: cuBLASLt's and the kernels' scratch, whole-step buffers */
    uint64_t ks = 0;
    int n_ks = 0;
    for (int64_t i = 0; i < sp->n_buffers; i++)
        if (!strcmp(mgc_plan_strat(p, sp->buffers[i].name), "kernel_scratch")) {
            ks = sp->buffers[i].bytes, n_ks++;
            T_CHECK(sp->buffers[i].kind == MGC_BUF_WORKSPACE && sp->buffers[i].live_begin == 0 &&
                    sp->buffers[i].live_end == sp->n_instrs);
        }
    T_EQ_I64(n_ks, 1);
    T_EQ_U64(sp->by_kind[MGC_BUF_WORKSPACE], MGC_MEMPLAN_GEMM_WORKSPACE_BYTES + ks);
    T_CHECK(ks >= scratch_need(sp));
    T_CHECK(ks >= fold_need(p, sp));
    free(v);

    /* 2. a stash per (mb, chunk) with stash bytes, live exactly from its forward to the end of
     * its backward; max_in_flight counted here from the stream */
    int64_t nstash = 0, pairs = 0, inflight = 0, most = 0;
    for (int64_t i = 0; i < sp->n_instrs; i++) {
        const mgc_instr *in = &sp->instrs[i];
        if (in->op == MGC_I_FORWARD) {
            pairs += sp->chunks[in->chunk].stash_bytes > 0;
            if (++inflight > most) most = inflight;
        }
        if (in->op == MGC_I_BACKWARD) inflight--;
    }
    T_EQ_I64(sp->max_in_flight, most);
    for (int64_t i = 0; i < sp->n_buffers; i++) {
        const mgc_buffer *b = &sp->buffers[i];
        if (b->kind != MGC_BUF_STASH) continue;
        nstash++;
        T_EQ_I64(b->live_begin, find_instr(sp, MGC_I_FORWARD, b->chunk, b->mb));
        T_EQ_I64(b->live_end, find_instr(sp, MGC_I_BACKWARD, b->chunk, b->mb) + 1);
        T_EQ_U64(b->bytes, sp->chunks[b->chunk].stash_bytes);
    }
    T_EQ_I64(nstash, pairs);

    /* 3. transfers live from the instruction that fills them to the one that drains them */
    for (int64_t i = 0; i < sp->n_buffers; i++) {
        const mgc_buffer *b = &sp->buffers[i];
        if (b->kind != MGC_BUF_COMM) continue;
        const mgc_instr *first = &sp->instrs[b->live_begin], *lastin = &sp->instrs[b->live_end - 1];
        T_EQ_I64(first->mb, b->mb);
        T_EQ_I64(lastin->mb, b->mb);
        int ok = (first->op == MGC_I_RECV_ACT && lastin->op == MGC_I_FORWARD) ||
                 (first->op == MGC_I_FORWARD && lastin->op == MGC_I_SEND_ACT) ||
                 (first->op == MGC_I_RECV_GRAD && lastin->op == MGC_I_BACKWARD) ||
                 (first->op == MGC_I_BACKWARD && lastin->op == MGC_I_SEND_GRAD);
        T_CHECK(ok);
    }

    /* 4. tensors: params in the weight buffer, each grad at its param's element, stashed ones
     * inside the stash, inputs in the input buffer, transients packed safely */
    int64_t wi = kind_idx[MGC_BUF_WEIGHT], gi = kind_idx[MGC_BUF_GRAD];
    uint64_t wsz = 0;
    if (wi >= 0) wsz = sp->buffers[wi].bytes / (sp->buffers[gi].bytes / 4);
    for (int64_t c = 0; c < sp->n_chunks; c++) {
        const mgc_plan_chunk *ch = &sp->chunks[c];
        for (int64_t t = 0; t < ch->n_tensors; t++) {
            const mgc_plan_tensor *x = &ch->tensors[t];
            if (x->buffer >= 0) {
                const mgc_buffer *b = &sp->buffers[x->buffer];
                T_CHECK(x->offset + x->bytes <= b->bytes);
                T_EQ_U64(x->offset % MGC_PLAN_ALIGN, 0);
            }
            if (x->role == MGC_TR_PARAM) T_EQ_I64(x->buffer, wi);
            if (x->role == MGC_TR_GRAD) {
                T_EQ_I64(x->buffer, gi);
                const char *gn = mgc_plan_strat(p, x->name);
                int found = 0;
                for (int64_t u = 0; u < ch->n_tensors; u++) {
                    const mgc_plan_tensor *y = &ch->tensors[u];
                    const char *pn = mgc_plan_strat(p, y->name);
                    size_t pl = strlen(pn);
                    if (y->role != MGC_TR_PARAM || strncmp(gn, pn, pl) || strcmp(gn + pl, ".grad"))
                        continue;
                    found = 1;
                    T_EQ_U64(x->offset, y->offset / wsz * 4);
                }
                T_CHECK(found);
            }
            if (x->role == MGC_TR_INPUT && x->buffer != MGC_PLAN_BUF_STASH)
                T_EQ_U64(sp->buffers[x->buffer].kind, MGC_BUF_INPUT);
            if (x->buffer == MGC_PLAN_BUF_STASH) T_CHECK(x->offset + x->bytes <= ch->stash_bytes);
        }
        /* params disjoint within the weight buffer */
        for (int64_t t = 0; t < ch->n_tensors; t++)
            for (int64_t u = t + 1; u < ch->n_tensors; u++) {
                const mgc_plan_tensor *x = &ch->tensors[t], *y = &ch->tensors[u];
                if (x->role != MGC_TR_PARAM || y->role != MGC_TR_PARAM) continue;
                T_CHECK(x->offset + x->bytes <= y->offset || y->offset + y->bytes <= x->offset);
            }
        /* transients: tensors in use at the same time in a pass have disjoint bytes; every
         * tensor an op touches is materialised */
        for (int pass = 0; pass < 2; pass++) {
            const mgc_plan_op *ops = pass ? ch->bwd : ch->fwd;
            int64_t n = pass ? ch->n_bwd : ch->n_fwd;
            int64_t nt = ch->n_tensors;
            int64_t *b = malloc((size_t)(nt ? nt : 1) * sizeof *b),
                    *e = malloc((size_t)(nt ? nt : 1) * sizeof *e);
            for (int64_t t = 0; t < nt; t++)
                pass_interval(ops, n, (int32_t)t, &b[t], &e[t]);
            /* an in-place op's input and output meet at that op only, on the same bytes */
            int32_t px = -1, py = -1;
            for (int64_t i = 0; i < n; i++)
                if (ops[i].flags & MGC_POF_INPLACE) {
                    px = ops[i].in[0], py = ops[i].out[0];
                    T_EQ_I64(e[px], i + 1);
                    T_EQ_I64(b[py], i);
                    T_EQ_I64(ch->tensors[px].buffer, ch->tensors[py].buffer);
                    T_EQ_U64(ch->tensors[px].offset, ch->tensors[py].offset);
                }
            int ok = 1;
            for (int64_t t = 0; t < nt && ok; t++) {
                const mgc_plan_tensor *x = &ch->tensors[t];
                if (b[t] >= 0 && x->buffer == -1) {
                    fprintf(stderr,
                            "stage %" PRId64 " chunk %" PRId64 ": tensor %" PRId64
                            " is used but has no buffer\n",
                            r, c, t);
                    ok = 0;
                }
                if (b[t] < 0 || x->buffer < 0 || sp->buffers[x->buffer].kind != MGC_BUF_ACTIVATION)
                    continue;
                for (int64_t u = t + 1; u < nt && ok; u++) {
                    const mgc_plan_tensor *y = &ch->tensors[u];
                    if (b[u] < 0 || y->buffer != x->buffer) continue;
                    if ((t == px && u == py) || (t == py && u == px)) continue;
                    if (b[t] < e[u] && b[u] < e[t] && x->offset < y->offset + y->bytes &&
                        y->offset < x->offset + x->bytes) {
                        fprintf(stderr,
                                "stage %" PRId64 " chunk %" PRId64 " pass %d: tensors %" PRId64
                                " and %" PRId64 " collide\n",
                                r, c, pass, t, u);
                        ok = 0;
                    }
                }
            }
            T_CHECK(ok);
            free(b);
            free(e);
        }
    }
    /* inputs live from their batch load */
    for (int64_t i = 0; i < sp->n_buffers; i++) {
        const mgc_buffer *b = &sp->buffers[i];
        if (b->kind != MGC_BUF_INPUT) continue;
        T_EQ_U64(sp->instrs[b->live_begin].op, MGC_I_LOAD_BATCH);
        T_EQ_I64(sp->instrs[b->live_begin].mb, b->mb);
    }
}

/* The synthetic programs' own expectations. */
static void check_stage(const synth *s, const mgc_plan *p, int64_t r, const mgc_memplan_info *info,
                        int precision, int distopt, int64_t dpcp, int64_t edp) {
    const mgc_stage_program *sp = &p->stages[r];
    check_generic(p, r, info);
    /* every (mb, chunk) stashes; in flight: Megatron's warm-up + 1 */
    int64_t nstash = 0;
    for (int64_t i = 0; i < sp->n_buffers; i++)
        nstash += sp->buffers[i].kind == MGC_BUF_STASH;
    T_EQ_I64(nstash, s->M * s->vp);
    int64_t expect_inflight = warmup(s, r) + 1;
    if (expect_inflight > s->M * s->vp) expect_inflight = s->M * s->vp;
    T_EQ_I64(sp->max_in_flight, expect_inflight);
    /* transfers carry one boundary activation [s, b, h] */
    for (int64_t i = 0; i < sp->n_buffers; i++)
        if (sp->buffers[i].kind == MGC_BUF_COMM)
            T_EQ_U64(sp->buffers[i].bytes,
                     (uint64_t)s->s * (uint64_t)s->b * (uint64_t)s->h * mgc_dtype_size(s->dt));
    /* inputs until the backward that reads them: tokens (embedding) and labels (loss) */
    for (int64_t i = 0; i < sp->n_buffers; i++)
        if (sp->buffers[i].kind == MGC_BUF_INPUT)
            T_EQ_U64(sp->instrs[sp->buffers[i].live_end - 1].op, MGC_I_BACKWARD);

    /* optimizer state: Megatron's bytes per parameter, up to the documented padding, with
     * the padded layout recomputed here by the documented rule */
    uint64_t P = 0, flat = 0, shard = 0;
    const uint64_t A = MGC_MEMPLAN_PARAM_ALIGN_ELEMS;
    uint64_t wsz = precision == MGC_PREC_FP32 ? 4 : 2;
    for (int64_t c = 0; c < sp->n_chunks; c++) {
        const mgc_plan_chunk *ch = &sp->chunks[c];
        for (int grp = 0; grp < 2; grp++) { /* dense then expert */
            uint64_t D = !distopt ? 1 : grp ? (uint64_t)edp : (uint64_t)dpcp, sec = 0;
            for (int64_t t = 0; t < ch->n_tensors; t++) {
                const mgc_plan_tensor *x = &ch->tensors[t];
                if (x->role != MGC_TR_PARAM) continue;
                int expert = s->experts && x->rank == 3 && x->dim[0] == s->experts;
                if (expert != grp) continue;
                uint64_t el = x->bytes / wsz;
                P += el;
                sec += (el + A - 1) / A * A;
            }
            sec = (sec + A * D - 1) / (A * D) * (A * D);
            flat += sec;
            shard += sec / D;
        }
    }
    uint64_t opt = 0;
    for (int64_t i = 0; i < sp->n_buffers; i++) {
        int k = sp->buffers[i].kind;
        if (k == MGC_BUF_WEIGHT || k == MGC_BUF_GRAD || k == MGC_BUF_MASTER ||
            k == MGC_BUF_ADAM_M || k == MGC_BUF_ADAM_V)
            opt += sp->buffers[i].bytes;
    }
    T_EQ_U64(info->param_elems, P);
    T_EQ_U64(info->param_elems + info->param_pad_elems, flat);
    T_EQ_U64(info->optimizer_bytes, opt);
    if (precision != MGC_PREC_FP32 && !distopt) T_EQ_U64(opt, 18 * flat); /* 18 bytes per param */
    if (precision == MGC_PREC_FP32 && !distopt) T_EQ_U64(opt, 16 * flat); /* 16: no master copy */
    if (precision != MGC_PREC_FP32 && distopt) T_EQ_U64(opt, 6 * flat + 12 * shard); /* 6 + 12/d */
    if (precision == MGC_PREC_FP32 && distopt) T_EQ_U64(opt, 8 * flat + 8 * shard);  /* 8 + 8/d */
    if (!s->experts && distopt && precision != MGC_PREC_FP32) {
        /* the per-parameter rate is 6 + 12/d up to the padding */
        double bpp = (double)opt / (double)P, want = 6.0 + 12.0 / (double)dpcp;
        T_CHECK(bpp >= want);
        T_CHECK(bpp <= want * (1.0 + (double)(flat - P) / (double)P) + 1e-9);
    }
}

/* The plan module's own invariants (buffers aligned and inside the arena,
 * tensors inside their buffers, microbatch indices in range). */
static int validate_plan(mgc_plan *p, const char *label) {
    char err[512];
    if (mgc_plan_validate(p, err, sizeof err) == MGC_PLAN_OK) return 1;
    fprintf(stderr, "%s: mgc_plan_validate: %s\n", label, err);
    return 0;
}

/* The stage's gradient buckets (mgc_memplan_buckets), and its stream's tail
 * of REDUCE_GRADS rewritten to one per bucket, as mgc_compile does. */
static void set_buckets(const mgc_config *c, const mgc_grid *g, mgc_stage_program *sp,
                        int64_t bucket_elems) {
    free(sp->buckets);
    T_CHECK(mgc_memplan_buckets(c, g, sp, bucket_elems, &sp->buckets, &sp->n_buckets) == 0);
    int64_t keep = 0;
    for (int64_t i = 0; i < sp->n_instrs; i++)
        if (sp->instrs[i].op != MGC_I_REDUCE_GRADS && sp->instrs[i].op != MGC_I_OPTIMIZER)
            sp->instrs[keep++] = sp->instrs[i];
    sp->instrs = realloc(sp->instrs, (size_t)(keep + sp->n_buckets + 1) * sizeof *sp->instrs);
    for (int64_t b = 0; b < sp->n_buckets; b++)
        sp->instrs[keep++] = (mgc_instr){MGC_I_REDUCE_GRADS, 0, -1, -1, (uint32_t)b, (uint64_t)b};
    sp->instrs[keep++] = (mgc_instr){MGC_I_OPTIMIZER, 0, -1, -1, 0, 0};
    sp->n_instrs = keep;
}

static void free_plan_stages(mgc_plan *p) {
    mgc_plan_free(p);
}

static void run_synth(const char *label, const synth *s, int precision, int distopt, int64_t dp,
                      int64_t cp, int64_t edp, int validate) {
    mgc_plan *p = build_plan(s);
    mgc_grid g = {s->pp * dp * cp, 1,  cp, dp, s->pp, s->vp, 1,
                  dp * cp / edp,   edp}; /* ep from edp */
    p->grid = g;
    mgc_config *c = synth_config(s, precision, distopt, cp);
    mgc_diags d;
    mgc_diags_init(&d);
    uint64_t peak = 0;
    p->distributed_optimizer = distopt;
    int64_t inplace = 0;
    for (int64_t r = 0; r < s->pp; r++)
        for (int64_t k = 0; k < p->stages[r].n_chunks; k++)
            inplace += mgc_memplan_inplace(&p->stages[r].chunks[k]);
    T_EQ_I64(inplace, 1); /* the loss chunk's cross_entropy_bwd */
    for (int64_t r = 0; r < s->pp; r++) {
        mgc_memplan_info info;
        set_buckets(c, &g, &p->stages[r], 1 << 20);
        int rc = mgc_memplan_build_info(c, &g, p, &p->stages[r], &d, &info);
        T_CHECK(rc == 0);
        if (rc) {
            mgc_diags_print(&d, stderr);
            break;
        }
        check_stage(s, p, r, &info, precision, distopt, dp * cp, edp);
        if (p->stages[r].arena_bytes > peak) peak = p->stages[r].arena_bytes;
        /* idempotent: building again gives the same plan */
        if (r == 0) {
            uint64_t a0 = p->stages[r].arena_bytes;
            T_CHECK(mgc_memplan_build(c, &g, p, &p->stages[r], &d) == 0);
            T_EQ_U64(p->stages[r].arena_bytes, a0);
        }
    }
    if (validate) T_CHECK(validate_plan(p, label));
    printf("%-34s pp %-3" PRId64 " vp %-2" PRId64 " m %-4" PRId64 " peak arena %10.3f MiB\n", label,
           s->pp, s->vp, s->M, (double)peak / 1048576.0);
    mgc_diags_free(&d);
    mgc_config_free(c);
    free_plan_stages(p);
}

static void test_stage_programs(void) {
    /* odd sizes so that parameter padding matters */
    synth a = {4, 1, 8, 2, 96, 384, 32, 2, 1000, 0, 0, MGC_DT_BF16};
    run_synth("1f1b bf16", &a, MGC_PREC_BF16, 0, 1, 1, 1, 1);
    run_synth("1f1b bf16 distopt d=6", &a, MGC_PREC_BF16, 1, 3, 2, 6, 1);
    a.recompute = 1;
    run_synth("1f1b bf16 recompute distopt d=4", &a, MGC_PREC_BF16, 1, 4, 1, 4, 1);
    synth f = a;
    f.dt = MGC_DT_F32;
    run_synth("1f1b fp32", &f, MGC_PREC_FP32, 0, 1, 1, 1, 1);
    run_synth("1f1b fp32 distopt d=5", &f, MGC_PREC_FP32, 1, 5, 1, 5, 1);
    synth i = {4, 2, 8, 1, 64, 256, 16, 1, 512, 0, 1, MGC_DT_BF16};
    run_synth("interleaved bf16", &i, MGC_PREC_BF16, 0, 1, 1, 1, 1);
    i.pp = 3, i.vp = 3, i.M = 9;
    run_synth("interleaved bf16 distopt d=8", &i, MGC_PREC_BF16, 1, 8, 1, 8, 1);
    synth e = {2, 1, 4, 2, 64, 128, 16, 1, 256, 8, 0, MGC_DT_BF16};
    run_synth("moe bf16 distopt d=8 edp=2", &e, MGC_PREC_BF16, 1, 4, 2, 2, 1);
    synth one = {1, 1, 3, 2, 64, 256, 16, 2, 512, 0, 0, MGC_DT_BF16};
    run_synth("no pipeline", &one, MGC_PREC_BF16, 0, 1, 1, 1, 1);
    synth w = {8,  1, 3,   1, 64, 256,
               16, 1, 512, 0, 0,  MGC_DT_F16}; /* fewer microbatches than stages */
    run_synth("1f1b fp16 m < pp", &w, MGC_PREC_FP16, 0, 1, 1, 1, 1);
}

/* Narayanan et al.'s 1T row: 64 pipeline ranks of 2 layers, 512
 * microbatches, tp 8 (local shapes), fp16, full recompute is what the stash
 * would be; here the layer shape above.  Completes and is valid. */
static void test_large_pipeline(void) {
    synth t = {64, 1, 512, 2, 25600 / 8, 4 * 25600 / 8, 2048, 1, 51200 / 8, 0, 1, MGC_DT_F16};
    run_synth("1T-shaped 1f1b (local shapes)", &t, MGC_PREC_FP16, 1, 6, 1, 6, 1);
    synth v = {16, 4, 64, 1, 512, 2048, 256, 1, 1024, 0, 1, MGC_DT_BF16};
    run_synth("interleaved pp16 vp4 m64", &v, MGC_PREC_BF16, 1, 2, 1, 2, 1);
}

/* ---- malformed stage programs are diagnosed, not planned ---- */

static void test_malformed(void) {
    synth a = {2, 1, 2, 1, 64, 128, 8, 1, 128, 0, 0, MGC_DT_BF16};
    mgc_plan *p = build_plan(&a);
    mgc_config *c = synth_config(&a, MGC_PREC_BF16, 0, 1);
    mgc_grid g = p->grid;
    mgc_diags d;
    mgc_diags_init(&d);
    mgc_stage_program *sp = &p->stages[0];
    /* a backward removed: the forward has no backward */
    int64_t bi = find_instr(sp, MGC_I_BACKWARD, 0, 1);
    sp->instrs[bi].op = MGC_I_LOAD_BATCH;
    T_CHECK(mgc_memplan_build(c, &g, p, sp, &d) == -1);
    T_CHECK(d.errors == 1 && strstr(d.v[0].msg, "never run backward"));
    sp->instrs[bi].op = MGC_I_BACKWARD;
    /* a stashed tensor outside the stash */
    mgc_diags_clear(&d);
    mgc_plan_chunk *ch = &sp->chunks[0];
    int64_t t = 0;
    while (ch->tensors[t].buffer != MGC_PLAN_BUF_STASH)
        t++;
    ch->tensors[t].offset = ch->stash_bytes;
    T_CHECK(mgc_memplan_build(c, &g, p, sp, &d) == -1);
    T_CHECK(d.errors == 1 && strstr(d.v[0].msg, "outside the stash"));
    ch->tensors[t].offset = 0;
    /* a saved activation the partitioner forgot to stash */
    mgc_diags_clear(&d);
    int32_t saved = -1;
    for (int64_t k = 0; k < ch->n_tensors; k++)
        if (ch->tensors[k].buffer == MGC_PLAN_BUF_STASH &&
            ch->tensors[k].name == mgc_plan_str(p, "f1"))
            saved = (int32_t)k;
    ch->tensors[saved].buffer = -1;
    T_CHECK(mgc_memplan_build(c, &g, p, sp, &d) == -1);
    T_CHECK(d.errors == 1 && strstr(d.v[0].msg, "neither stashed nor recomputed"));
    ch->tensors[saved].buffer = MGC_PLAN_BUF_STASH;
    /* a param in the wrong dtype */
    mgc_diags_clear(&d);
    c->training.precision = MGC_PREC_FP32;
    T_CHECK(mgc_memplan_build(c, &g, p, sp, &d) == -1);
    T_CHECK(d.errors >= 1 && strstr(d.v[0].msg, "training precision"));
    c->training.precision = MGC_PREC_BF16;
    /* a receive after its forward */
    mgc_diags_clear(&d);
    mgc_stage_program *s1 = &p->stages[1];
    int64_t ri = find_instr(s1, MGC_I_RECV_ACT, 0, 0), fi = find_instr(s1, MGC_I_FORWARD, 0, 0);
    mgc_instr tmp = s1->instrs[ri];
    s1->instrs[ri] = s1->instrs[fi];
    s1->instrs[fi] = tmp;
    T_CHECK(mgc_memplan_build(c, &g, p, s1, &d) == -1);
    T_CHECK(d.errors == 1 && strstr(d.v[0].msg, "not ordered"));
    s1->instrs[fi] = s1->instrs[ri];
    s1->instrs[ri] = tmp;
    mgc_diags_clear(&d);
    T_CHECK(mgc_memplan_build(c, &g, p, s1, &d) == 0);
    T_CHECK(mgc_memplan_build(c, &g, p, sp, &d) == 0);
    mgc_diags_free(&d);
    mgc_config_free(c);
    mgc_plan_free(p);
}

/* ---- the real partitioner and scheduler ---------------------------------------
 * Models from models/ with parallel layouts set over them, partitioned and
 * scheduled by compiler/partition.c and compiler/schedule.c as mgc compile
 * does, then planned: the generic checks must hold on every pipeline rank. */

/* The config of a file under the source tree with `sets` applied, finalized; problems in d. */
static mgc_config *real_config(const char *file, const char *const *sets, int nsets,
                               mgc_diags *d) {
    char path[512];
    snprintf(path, sizeof path, "%s/%s", MGC_SOURCE_DIR, file);
    mgc_config *c = mgc_config_new();
    mgc_config_load_file(c, path, d);
    for (int i = 0; i < nsets; i++)
        mgc_config_set(c, sets[i], "test", d);
    mgc_config_finalize(c, d);
    return c;
}

static void run_real(const char *file, const char *const *sets, int nsets) {
    mgc_diags d;
    mgc_diags_init(&d);
    mgc_config *c = real_config(file, sets, nsets, &d);
    mgc_graph *g = d.errors ? NULL : mgc_ir_build(c, &d);
    mgc_plan *p = mgc_plan_new();
    mgc_schedule *sched = NULL;
    T_CHECK(g != NULL);
    if (!g) goto out;
    mgc_partition_grid(c, &p->grid);
    p->num_microbatches = c->derived.num_microbatches;
    p->micro_batch_size = c->training.micro_batch_size;
    p->seq_length = c->model.seq_length;
    p->schedule = c->parallel.schedule;
    p->recompute = c->training.recompute;
    p->distributed_optimizer = c->parallel.distributed_optimizer;
    p->n_stages = p->grid.pp;
    p->stages = calloc((size_t)p->grid.pp, sizeof *p->stages);
    for (int64_t r = 0; r < p->grid.pp; r++) {
        mgc_stage_program *sp = &p->stages[r];
        sp->pp_rank = r;
        sp->n_chunks = p->grid.vp;
        sp->chunks = calloc((size_t)sp->n_chunks, sizeof *sp->chunks);
        T_CHECK(mgc_partition_build(c, g, &p->grid, r, p, sp->chunks, &d) == 0);
    }
    int64_t *nb = calloc((size_t)p->grid.pp, sizeof *nb);
    for (int64_t r = 0; r < p->grid.pp; r++) {
        mgc_stage_program *sp = &p->stages[r];
        T_CHECK(mgc_memplan_buckets(c, &p->grid, sp, 40000000, &sp->buckets, &sp->n_buckets) == 0);
        nb[r] = sp->n_buckets;
    }
    mgc_schedule_params prm;
    mgc_schedule_params_from_config(c, 2, &prm);
    prm.rank_buckets = nb;
    T_CHECK(mgc_schedule_build(&prm, &sched, &d) == 0);
    free(nb);
    if (d.errors || !sched) goto out;
    uint64_t peak = 0;
    for (int64_t r = 0; r < p->grid.pp; r++) {
        mgc_stage_program *sp = &p->stages[r];
        sp->instrs = sched->ranks[r].instrs;
        sp->n_instrs = sched->ranks[r].n;
        sched->ranks[r].instrs = NULL;
        sched->ranks[r].n = 0;
        mgc_memplan_info info;
        int rc = mgc_memplan_build_info(c, &p->grid, p, sp, &d, &info);
        T_CHECK(rc == 0);
        if (rc) break;
        check_generic(p, r, &info);
        if (sp->arena_bytes > peak) peak = sp->arena_bytes;
        /* the optimizer state by Megatron's rate, up to the padding */
        uint64_t P = info.param_elems, flat = P + info.param_pad_elems;
        double bpp = (double)info.optimizer_bytes / (double)P;
        double d_ = (double)info.shard_dense;
        double want = c->training.precision == MGC_PREC_FP32 ? 8.0 + 8.0 / d_ : 6.0 + 12.0 / d_;
        if (info.expert_param_elems == 0) {
            T_CHECK(bpp >= want - 1e-9);
            T_CHECK(bpp <= want * (double)flat / (double)P + 1e-9);
        }
    }
    if (!d.errors) T_CHECK(validate_plan(p, file));
    printf("%-34s pp %-3" PRId64 " vp %-2" PRId64 " m %-4" PRId64 " peak arena %10.3f MiB\n", file,
           p->grid.pp, p->grid.vp, p->num_microbatches, (double)peak / 1048576.0);
out:
    if (d.errors) mgc_diags_print(&d, stderr);
    T_EQ_I64(d.errors, 0);
    mgc_schedule_free(sched);
    mgc_plan_free(p);
    mgc_ir_free(g);
    mgc_config_free(c);
    mgc_diags_free(&d);
}

static void test_real_programs(void) {
    const char *gpt[] = {"parallel.pipeline=2",
                         "parallel.tensor=2",
                         "parallel.sequence_parallel=true",
                         "parallel.world_size=8",
                         "training.precision=bf16",
                         "parallel.distributed_optimizer=true",
                         "training.global_batch_size=16"};
    run_real("models/tiny-gpt.yaml", gpt, 7);
    const char *vpp[] = {"parallel.pipeline=2", "parallel.virtual_stages=2",
                         "parallel.world_size=2", "training.global_batch_size=16",
                         "training.recompute=selective"};
    run_real("models/tiny-gpt.yaml", vpp, 5);
    const char *full[] = {"parallel.pipeline=4", "parallel.world_size=4", "training.recompute=full",
                          "training.precision=fp16", "training.global_batch_size=24"};
    run_real("models/tiny-llama.yaml", full, 5);
    const char *moe[] = {"parallel.pipeline=2", "parallel.expert=2", "parallel.world_size=4",
                         "parallel.distributed_optimizer=true", "training.precision=bf16"};
    run_real("models/tiny-moe.yaml", moe, 5);
    const char *cp[] = {"parallel.context=2", "parallel.world_size=4", "parallel.pipeline=2"};
    run_real("models/tiny-llama.yaml", cp, 3);
}

/* ---- in-place outputs (mgc_memplan_inplace) ---- */

static mgc_plan *compile_real(const char *file, const char *const *sets, int nsets, int inplace) {
    mgc_diags d;
    mgc_diags_init(&d);
    mgc_config *c = real_config(file, sets, nsets, &d);
    mgc_graph *g = d.errors ? NULL : mgc_ir_build(c, &d);
    if (!inplace) setenv("MGC_INPLACE", "0", 1);
    mgc_plan *p = g ? mgc_compile(c, g, &d) : NULL;
    unsetenv("MGC_INPLACE");
    if (!p) mgc_diags_print(&d, stderr);
    T_CHECK(p != NULL);
    mgc_ir_free(g);
    mgc_config_free(c);
    mgc_diags_free(&d);
    return p;
}

/* Per pass, the interval of t when it is placed in a pass buffer, the whole of both passes
 * when it is stashed (it lives from its forward to its backward) -- unless it is an in-place
 * output, which lives from its op on.  A row view (plan.h tensor.view) and the tensor it views
 * share one interval: the union of the tensor's and all its views' (the view's bytes are the
 * tensor's, written through the view and read through either). */
static void live_in(const mgc_plan_chunk *ch, int32_t t, int pass, const uint8_t *inplace_out,
                    int64_t *b, int64_t *e) {
    int32_t root = ch->tensors[t].view ? (int32_t)ch->tensors[t].view - 1 : t;
    const mgc_plan_op *ops = pass ? ch->bwd : ch->fwd;
    int64_t n = pass ? ch->n_bwd : ch->n_fwd;
    *b = *e = -1;
    if (ch->tensors[t].buffer == MGC_PLAN_BUF_STASH && !inplace_out[t]) {
        *b = 0, *e = n; /* it takes a stashed input's bytes */
        return;
    }
    /* as pass_interval, a touch of any member of the set being a touch of the bytes */
    int first_read = 0, last_write = 0;
    for (int64_t i = 0; i < n; i++)
        for (int k = 0; k < ops[i].n_in + ops[i].n_out; k++) {
            int rd = k < ops[i].n_in;
            int32_t x = rd ? ops[i].in[k] : ops[i].out[k - ops[i].n_in];
            if (x != root && ch->tensors[x].view != (uint32_t)root + 1) continue;
            if (*b < 0) *b = i, first_read = rd;
            *e = i;
            last_write = !rd;
        }
    if (*b < 0) return;
    if (first_read) *b = 0;
    *e = last_write ? n : *e + 1;
}

/* Independently of the planner: two tensors of a chunk that share bytes of one buffer are
 * never live in the same op of a pass, except an in-place op's input and output at that op
 * (the input's last touch, the output's first) and a row view with its tensor.  Returns the
 * in-place ops seen. */
static int64_t check_disjoint(const mgc_plan *p) {
    int64_t inplace = 0;
    for (int64_t r = 0; r < p->n_stages; r++)
        for (int64_t c = 0; c < p->stages[r].n_chunks; c++) {
            const mgc_plan_chunk *ch = &p->stages[r].chunks[c];
            int64_t *op_of = malloc((size_t)ch->n_tensors * sizeof *op_of); /* in-place op */
            uint8_t *is_out = calloc((size_t)ch->n_tensors, 1);
            T_CHECK(op_of && is_out);
            if (!op_of || !is_out) {
                free(op_of), free(is_out);
                continue;
            }
            for (int32_t t = 0; t < ch->n_tensors; t++)
                op_of[t] = -1;
            for (int64_t i = 0; i < ch->n_bwd; i++)
                if (ch->bwd[i].flags & MGC_POF_INPLACE) {
                    op_of[ch->bwd[i].in[0]] = op_of[ch->bwd[i].out[0]] = i;
                    is_out[ch->bwd[i].out[0]] = 1;
                    inplace++;
                }
            for (int32_t a = 0; a < ch->n_tensors; a++)
                for (int32_t bb = a + 1; bb < ch->n_tensors; bb++) {
                    const mgc_plan_tensor *x = &ch->tensors[a], *y = &ch->tensors[bb];
                    if (x->buffer == -1 || x->buffer != y->buffer) continue;
                    if (x->role == MGC_TR_PARAM || x->role == MGC_TR_GRAD || x->role == MGC_TR_INPUT)
                        continue;
                    if (x->offset >= y->offset + y->bytes || y->offset >= x->offset + x->bytes)
                        continue;
                    if (x->view == (uint32_t)bb + 1 || y->view == (uint32_t)a + 1) continue;
                    for (int pass = 0; pass < 2; pass++) {
                        int64_t xb, xe, yb, ye;
                        live_in(ch, a, pass, is_out, &xb, &xe);
                        live_in(ch, bb, pass, is_out, &yb, &ye);
                        if (xb < 0 || yb < 0 || xe <= yb || ye <= xb) continue;
                        int64_t pop = op_of[a];
                        if (pass == 1 && pop >= 0 && pop == op_of[bb]) {
                            /* the in-place pair meets at its op only */
                            int32_t px = ch->bwd[pop].in[0], py = ch->bwd[pop].out[0];
                            int64_t xl, xr, yl, yr;
                            pass_interval(ch->bwd, ch->n_bwd, px, &xl, &xr);
                            pass_interval(ch->bwd, ch->n_bwd, py, &yl, &yr);
                            T_EQ_I64(yl, pop);
                            if (ch->tensors[px].buffer != MGC_PLAN_BUF_STASH) T_EQ_I64(xr, pop + 1);
                            continue;
                        }
                        fprintf(stderr, "stage %" PRId64 " chunk %" PRId64 ": %s [%" PRIu64 ", +%"
                                PRIu64 ") ops [%" PRId64 ", %" PRId64 ") and %s [%" PRIu64 ", +%"
                                PRIu64 ") ops [%" PRId64 ", %" PRId64 ") of buffer %d share bytes "
                                "while both live in the %s\n", r, c, mgc_plan_strat(p, x->name),
                                x->offset, x->bytes, xb, xe, mgc_plan_strat(p, y->name), y->offset,
                                y->bytes, yb, ye, (int)x->buffer, pass ? "backward" : "forward");
                        T_CHECK(0);
                    }
                }
            free(op_of);
            free(is_out);
        }
    return inplace;
}

/* The validator's side of the contract, on a real plan's loss chunk. */
#define BREAK_INPLACE(field, value, frag)                                                          \
    do {                                                                                           \
        __typeof__(field) keep_ = (field);                                                         \
        (field) = (value);                                                                         \
        char err_[512] = "";                                                                       \
        T_EQ_I64(mgc_plan_validate(p, err_, sizeof err_), MGC_PLAN_ERR_INVALID);                   \
        if (!strstr(err_, frag)) {                                                                 \
            T_CHECK(!"validate message");                                                          \
            fprintf(stderr, "  wanted \"%s\" in: %s\n", frag, err_);                             \
        }                                                                                          \
        (field) = keep_;                                                                           \
    } while (0)

static void test_inplace(void) {
    const char *sets[][4] = {
        {"training.precision=bf16", "parallel.pipeline=2", "parallel.world_size=2", NULL},
        {"training.precision=fp32", "parallel.tensor=2", "parallel.world_size=2", NULL},
        {"training.precision=fp16", "training.recompute=full", NULL, NULL},
        {"training.precision=bf16", "training.loss_chunks=1", NULL, NULL},
        /* 16-bit logits: the gradient over them, dense */
        {"training.precision=bf16", "training.loss_chunks=1", "training.logits_dtype=compute",
         NULL},
    };
    const char *files[] = {"models/tiny-gpt.yaml", "models/tiny-llama.yaml", "models/tiny-moe.yaml",
                           "models/gpt2-124m.yaml", "models/gpt2-124m.yaml"};
    for (int m = 0; m < 5; m++) {
        int ns = 0;
        while (ns < 4 && sets[m][ns]) ns++;
        mgc_plan *p = compile_real(files[m], sets[m], ns, 1), *q = compile_real(files[m], sets[m], ns, 0);
        if (!p || !q) {
            mgc_plan_free(p);
            mgc_plan_free(q);
            continue;
        }
        T_EQ_I64(check_disjoint(q), 0);
        T_EQ_I64(check_disjoint(p), 1); /* the one loss chunk's cross_entropy_bwd */
        const mgc_stage_program *sp = &p->stages[p->n_stages - 1];
        const mgc_plan_chunk *ch = &sp->chunks[sp->n_chunks - 1];
        const mgc_plan_op *ce = NULL;
        for (int64_t i = 0; i < ch->n_bwd; i++)
            if (ch->bwd[i].kind == MGC_POP_CROSS_ENTROPY_BWD) ce = &ch->bwd[i];
        T_CHECK(ce && (ce->flags & MGC_POF_INPLACE));
        if (!ce) goto next;
        const mgc_plan_tensor *x = &ch->tensors[ce->in[0]], *y = &ch->tensors[ce->out[0]];
        int lt16 = m == 4, narrow = y->dtype != MGC_DT_F32 && !lt16;
        T_EQ_I64(x->dtype, lt16 ? MGC_DT_BF16 : MGC_DT_F32);
        if (lt16) T_EQ_I64(y->dtype, MGC_DT_BF16);
        T_EQ_I64((int64_t)y->ld, narrow ? 2 * x->dim[x->rank - 1] : 0);
        T_EQ_I64(y->buffer, x->buffer);
        T_EQ_U64(y->offset, x->offset);
        T_EQ_U64(y->bytes, x->bytes);
        T_EQ_U64(mgc_plan_tensor_data_bytes(y), x->bytes / (narrow ? 2 : 1));
        /* the gradient's readers take its row pitch */
        for (int64_t i = 0; i < ch->n_bwd; i++)
            for (int k = 0; k < ch->bwd[i].n_in; k++)
                if (ch->bwd[i].in[k] == ce->out[0] && &ch->bwd[i] != ce)
                    T_CHECK(k == 0 && (ch->bwd[i].kind == MGC_POP_LINEAR_DGRAD ||
                                       ch->bwd[i].kind == MGC_POP_LINEAR_WGRAD));
        /* the saving: never more memory; GPT-2's arena peaks in the loss's backward, where the
         * gradient had bytes of its own (the tiny models peak elsewhere) */
        uint64_t with = sp->arena_bytes, without = q->stages[q->n_stages - 1].arena_bytes;
        printf("%-26s %s: loss stage arena %.3f MiB in place, %.3f MiB without (gradient "
               "%.3f MiB)\n",
               files[m], sets[m][0], (double)with / 1048576.0, (double)without / 1048576.0,
               (double)mgc_plan_tensor_data_bytes(y) / 1048576.0);
        T_CHECK(with <= without);
        if (m >= 3) T_CHECK(without - with >= mgc_plan_tensor_data_bytes(y) * 9 / 10);
        {
            mgc_plan_chunk *wch = &p->stages[p->n_stages - 1].chunks[sp->n_chunks - 1];
            mgc_plan_op *wce = (mgc_plan_op *)ce;
            mgc_plan_tensor *wy = &wch->tensors[ce->out[0]];
            BREAK_INPLACE(wy->offset, wy->offset + 256, "in place, but output");
            uint16_t wrong = narrow || lt16 ? MGC_DT_F32 : MGC_DT_BF16;
            BREAK_INPLACE(wy->dtype, wrong, "bytes");
            if (narrow) {
                BREAK_INPLACE(wy->ld, (uint32_t)wy->dim[wy->rank - 1], "not above");
                BREAK_INPLACE(wce->flags, (uint16_t)(wce->flags & ~MGC_POF_INPLACE),
                              "only the output of an in-place op");
            }
            /* a later reader of the logits */
            for (int64_t i = 0; i < wch->n_bwd; i++)
                if (wch->bwd[i].kind == MGC_POP_LINEAR_DGRAD && wch->bwd[i].in[0] == ce->out[0]) {
                    BREAK_INPLACE(wch->bwd[i].in[0], ce->in[0], "touches after it");
                    if (narrow)
                        BREAK_INPLACE(wch->bwd[i].in[1], ce->out[0], "has a row pitch");
                }
            BREAK_INPLACE(wce->kind, MGC_POP_ROPE_BWD, "cannot write its output over its input");
        }
        T_EQ_I64(mgc_plan_validate(p, NULL, 0), MGC_PLAN_OK);
    next:
        mgc_plan_free(p);
        mgc_plan_free(q);
    }
}

/* The fused split's rotary attributes (fusion.c, plan.h MGC_POF_ROPE) as the validator sees
 * them: a compiled LLaMA plan carries them, and each broken one is refused. */
static void test_rope_attrs(void) {
    const char *sets[] = {"training.precision=bf16"};
    mgc_plan *p = compile_real("models/tiny-llama.yaml", sets, 1, 1);
    if (!p) return;
    mgc_plan_op *sp = NULL, *jn = NULL;
    mgc_plan_chunk *ch = &p->stages[0].chunks[0];
    for (int64_t i = 0; i < ch->n_fwd && !sp; i++)
        if (ch->fwd[i].kind == MGC_POP_QKV_SPLIT && (ch->fwd[i].flags & MGC_POF_ROPE)) sp = &ch->fwd[i];
    for (int64_t i = 0; i < ch->n_bwd && !jn; i++)
        if (ch->bwd[i].kind == MGC_POP_QKV_SPLIT_BWD && (ch->bwd[i].flags & MGC_POF_ROPE))
            jn = &ch->bwd[i];
    T_CHECK(sp && jn);
    if (sp && jn) {
        T_EQ_I64(sp->iattr[3], 16); /* tiny-llama: head dim 16, all of it rotated */
        T_CHECK(sp->fattr[0] == 10000.0 && sp->fattr[1] == 1.0);
        T_CHECK(jn->iattr[3] == sp->iattr[3] && jn->fattr[0] == sp->fattr[0]);
        BREAK_INPLACE(sp->iattr[3], 15, "rotary dim 15");
        BREAK_INPLACE(sp->iattr[3], sp->iattr[2] + 2, "out of range");
        BREAK_INPLACE(jn->iattr[3], 0, "out of range");
        BREAK_INPLACE(sp->fattr[0], 0.0, "out of range");
        BREAK_INPLACE(sp->fattr[1], 1.5, "out of range");
        BREAK_INPLACE(sp->kind, MGC_POP_ROPE, "rotary flag on an op that is not a qkv split");
        T_EQ_I64(mgc_plan_validate(p, NULL, 0), MGC_PLAN_OK);
    }
    mgc_plan_free(p);
}

/* Loss chunks (compiler/losschunk.h) as the memory plan sees them: views share their tensor's
 * bytes and nothing else's while live (check_disjoint), each chunk's logits are in place, and
 * GPT-2 124M's arena shrinks by about the logits the chunks no longer hold at once. */
static void test_loss_chunks(void) {
    struct {
        const char *file;
        const char *sets[5];
        int64_t k;
    } cases[] = {
        {"models/gpt2-124m.yaml", {"training.precision=bf16", NULL}, 4}, /* auto: 1 GiB chunks */
        /* 16-bit logits: half the chunks of at most 1 GiB */
        {"models/gpt2-124m.yaml",
         {"training.precision=bf16", "training.logits_dtype=compute", NULL},
         2},
        {"models/tiny-gpt.yaml", {"training.loss_chunks=3", "parallel.tensor=2",
                                  "parallel.world_size=2", NULL}, 3},
        {"models/tiny-llama.yaml", {"training.loss_chunks=3", "parallel.context=2",
                                    "parallel.pipeline=2", "parallel.world_size=4", NULL}, 3},
        {"models/tiny-moe.yaml", {"training.loss_chunks=6", "training.recompute=full", NULL}, 6},
    };
    for (size_t m = 0; m < sizeof cases / sizeof cases[0]; m++) {
        int ns = 0;
        while (cases[m].sets[ns]) ns++;
        const char *one[6];
        memcpy(one, cases[m].sets, sizeof cases[m].sets);
        one[ns] = "training.loss_chunks=1";
        mgc_plan *p = compile_real(cases[m].file, cases[m].sets, ns, 1);
        mgc_plan *q = compile_real(cases[m].file, one, ns + 1, 1);
        if (!p || !q) goto next;
        T_EQ_I64(check_disjoint(p), cases[m].k);
        T_EQ_I64(check_disjoint(q), 1);
        T_EQ_I64(mgc_plan_validate(p, NULL, 0), MGC_PLAN_OK);
        const mgc_stage_program *sp = &p->stages[p->n_stages - 1], *sq = &q->stages[q->n_stages - 1];
        const mgc_plan_chunk *ch = &sq->chunks[sq->n_chunks - 1];
        uint64_t logits = 0;
        for (int64_t i = 0; i < ch->n_bwd; i++)
            if (ch->bwd[i].kind == MGC_POP_CROSS_ENTROPY_BWD) logits = ch->tensors[ch->bwd[i].in[0]].bytes;
        printf("%-24s %lld loss chunks: loss stage arena %.2f MiB, %.2f MiB with one (logits %.2f "
               "MiB)\n",
               cases[m].file, (long long)cases[m].k, (double)sp->arena_bytes / 1048576.0,
               (double)sq->arena_bytes / 1048576.0, (double)logits / 1048576.0);
        T_CHECK(sp->arena_bytes <= sq->arena_bytes);
        /* GPT-2 peaks with the logits stashed: the chunks save all but one chunk's worth */
        if (m <= 1)
            T_CHECK(sq->arena_bytes - sp->arena_bytes >=
                    (logits - logits / (uint64_t)cases[m].k) * 9 / 10);
        /* the validator refuses a view that leaves its tensor's rows */
        {
            mgc_plan_chunk *w = &p->stages[p->n_stages - 1].chunks[sp->n_chunks - 1];
            for (int64_t t = 0; t < w->n_tensors; t++)
                if (w->tensors[t].view && w->tensors[t].buffer >= 0) {
                    const mgc_plan_tensor *x = &w->tensors[w->tensors[t].view - 1];
                    BREAK_INPLACE(w->tensors[t].offset, x->offset + x->bytes - 8, "not a range");
                    BREAK_INPLACE(w->tensors[t].dtype, MGC_DT_U8, "bytes");
                    break;
                }
            T_EQ_I64(mgc_plan_validate(p, NULL, 0), MGC_PLAN_OK);
        }
    next:
        mgc_plan_free(p);
        mgc_plan_free(q);
    }
}

int main(void) {
    test_assign_basic();
    test_assign_segments();
    test_assign_random();
    test_assign_equal_sizes();
    test_assign_large();
    test_stage_programs();
    test_large_pipeline();
    test_malformed();
    test_real_programs();
    test_inplace();
    test_rope_attrs();
    test_loss_chunks();
    return t_summary("test_memplan");
}
