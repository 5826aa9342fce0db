/* test_comm.c - communicators (runtime/comm.h) on the local transport.
 *
 * Every operation on every process-group kind of several grids, run by N
 * threads with random sleeps and yields, against a serial reference computed
 * here in group-rank order: results must match bit for bit on every run.
 * Then the failure paths: mismatched collectives and messages are reported
 * (naming both ranks' operations), a peer that never comes times out with a
 * diagnosis, an aborting or vanishing rank releases the others. */
#include <pthread.h>
#include <sched.h>
#include <stdint.h>
#include <stdlib.h>
#include <time.h>

#include "comm.h"
#include "half.h"
#include "testlib.h"

/* testlib's counters are not thread safe: checks inside rank threads go here */
static pthread_mutex_t check_mu = PTHREAD_MUTEX_INITIALIZER;
#define TC(cond)                                                                                   \
    do {                                                                                           \
        int tc_ok_ = !!(cond);                                                                     \
        pthread_mutex_lock(&check_mu);                                                             \
        T_CHECK(tc_ok_ &&#cond);                                                                   \
        pthread_mutex_unlock(&check_mu);                                                           \
    } while (0)
#define TC_OK(expr)                                                                                \
    do {                                                                                           \
        mgc_comm_status tc_s_ = (expr);                                                            \
        if (tc_s_ != MGC_COMM_OK) fprintf(stderr, "%s: %s\n", #expr, mgc_comm_error(c_for_err));   \
        TC(tc_s_ == MGC_COMM_OK);                                                                  \
    } while (0)

/* ---- deterministic data ---------------------------------------------------- */

static uint64_t mix(uint64_t x) {
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ull;
    x ^= x >> 33;
    return x;
}
static uint64_t h3(uint64_t a, uint64_t b, uint64_t c) {
    return mix(a * 1000003u ^ mix(b * 7919u ^ mix(c)));
}

/* Values spread over 2^-12..2^12 with both signs: float sums depend on order. */
static float value(int64_t world_rank, uint64_t tag, uint64_t i) {
    uint64_t x = h3((uint64_t)world_rank, tag, i);
    float m = 1.0f + (float)(x & 0xffffff) / 16777216.0f;
    int e = (int)((x >> 24) % 25) - 12;
    return ldexpf((x >> 60) & 1 ? -m : m, e);
}

static int same_bits(const float *a, const float *b, size_t n) {
    return memcmp(a, b, n * sizeof *a) == 0;
}

/* random sleeps and yields so arrival order differs run to run */
static void jitter(unsigned *seed) {
    unsigned r = (unsigned)rand_r(seed) % 8;
    if (r < 3) {
        struct timespec ts = {0, (long)(rand_r(seed) % 200) * 1000L};
        nanosleep(&ts, NULL);
    } else if (r < 6) {
        sched_yield();
    }
}

/* ---- running N ranks ------------------------------------------------------ */

typedef struct rank_arg {
    mgc_comm *comm;
    int rank;
    const void *user;
    unsigned seed;
    mgc_comm_status result;
    char err[1024];
} rank_arg;

typedef void (*rank_fn)(rank_arg *a);

typedef struct thread_box {
    rank_fn fn;
    rank_arg *arg;
} thread_box;

static void *thread_main(void *p) {
    thread_box *b = p;
    b->fn(b->arg);
    return NULL;
}

/* Runs fn on n ranks of a fresh local world; the world handles are freed by
 * this function after the threads join unless fn freed them (comm = NULL). */
static int g_moves_only; /* run_ranks makes moves-only worlds (reductions folded in comm.c) */

static void run_ranks(int n, int64_t timeout_ms, rank_fn fn, const void *user, unsigned seed,
                      rank_arg *args) {
    mgc_comm *ranks[8];
    char err[256];
    mgc_comm_config cfg = MGC_COMM_CONFIG_INIT;
    cfg.timeout_ms = timeout_ms;
    cfg.moves_only = g_moves_only;
    mgc_comm_status s = mgc_comm_local_world_create(n, &cfg, ranks, err, sizeof err);
    T_CHECK(s == MGC_COMM_OK);
    if (s != MGC_COMM_OK) return;
    pthread_t th[8];
    thread_box box[8];
    for (int r = 0; r < n; r++) {
        args[r] = (rank_arg){
            .comm = ranks[r], .rank = r, .user = user, .seed = seed * 131u + (unsigned)r};
        box[r] = (thread_box){fn, &args[r]};
        pthread_create(&th[r], NULL, thread_main, &box[r]);
    }
    for (int r = 0; r < n; r++)
        pthread_join(th[r], NULL);
    for (int r = 0; r < n; r++)
        mgc_comm_free(args[r].comm);
}

/* ---- every operation against the serial reference ------------------------- */

/* Runs every collective on communicator c (group of members[0..n-1], this
 * rank at group rank me) and checks the results bit for bit. */
static void exercise(mgc_comm *c, const int64_t *members, int n, int me, uint64_t tag,
                     unsigned *seed) {
    mgc_comm *c_for_err = c;
    int64_t w = members[me];
    uint64_t shape = h3(tag, (uint64_t)members[0], 17);
    size_t count = (size_t)(shape % 67) + (shape % 5 == 0 ? 0 : 1); /* sometimes 0 */
    size_t big = count * (size_t)n;
    float *x = malloc((big + 1) * sizeof *x), *y = malloc((big + 1) * sizeof *y);
    float *ref = malloc((big + 1) * sizeof *ref);

    /* all-reduce sum and max, out of place and in place */
    for (int red = 0; red < 2; red++) {
        for (size_t i = 0; i < count; i++)
            x[i] = value(w, tag + (uint64_t)red, i);
        if (red == 1 && count > 3) x[3] = w == members[n - 1] ? NAN : x[3]; /* NaN propagates */
        jitter(seed);
        TC_OK(mgc_comm_all_reduce(c, x, y, count, MGC_DT_F32, (mgc_comm_red)red));
        for (size_t i = 0; i < count; i++) {
            float acc = value(members[0], tag + (uint64_t)red, i);
            if (red == 1 && i == 3 && n == 1 && count > 3) acc = NAN;
            for (int j = 1; j < n; j++) {
                float v = value(members[j], tag + (uint64_t)red, i);
                if (red == 1 && i == 3 && j == n - 1) v = NAN;
                if (red == 0)
                    acc += v;
                else if (v > acc || isnan(v))
                    acc = isnan(acc) ? acc : v;
            }
            ref[i] = acc;
        }
        TC(same_bits(y, ref, count));
        jitter(seed);
        TC_OK(mgc_comm_all_reduce(c, x, x, count, MGC_DT_F32, (mgc_comm_red)red));
        TC(same_bits(x, ref, count));
    }

    /* reduce-scatter: out of place, then in place (recv inside send) */
    for (size_t i = 0; i < big; i++)
        x[i] = value(w, tag + 2, i);
    jitter(seed);
    TC_OK(mgc_comm_reduce_scatter(c, x, y, count, MGC_DT_F32, MGC_COMM_SUM));
    for (size_t i = 0; i < count; i++) {
        size_t k = (size_t)me * count + i;
        float acc = value(members[0], tag + 2, k);
        for (int j = 1; j < n; j++)
            acc += value(members[j], tag + 2, k);
        ref[i] = acc;
    }
    TC(same_bits(y, ref, count));
    jitter(seed);
    TC_OK(mgc_comm_reduce_scatter(c, x, x + (size_t)me * count, count, MGC_DT_F32, MGC_COMM_SUM));
    TC(same_bits(x + (size_t)me * count, ref, count));

    /* variable reduce-scatter (every transport folds it in comm.c): block j has per[j]
     * elements, some empty; then in place, this rank's block inside the send side */
    {
        size_t per[8], tot = 0, off = 0;
        for (int j = 0; j < n; j++)
            per[j] = (size_t)(h3(tag, 31, (uint64_t)j) % (count + 2)), tot += per[j];
        for (int j = 0; j < me; j++)
            off += per[j];
        float *xv = malloc((tot + 1) * sizeof *xv), *yv = malloc((per[me] + 1) * sizeof *yv);
        float *rv = malloc((per[me] + 1) * sizeof *rv);
        for (size_t i = 0; i < tot; i++)
            xv[i] = value(w, tag + 7, i);
        jitter(seed);
        TC_OK(mgc_comm_reduce_scatter_v(c, xv, per, yv, MGC_DT_F32, MGC_COMM_SUM));
        for (size_t i = 0; i < per[me]; i++) {
            float acc = value(members[0], tag + 7, off + i);
            for (int j = 1; j < n; j++)
                acc += value(members[j], tag + 7, off + i);
            rv[i] = acc;
        }
        TC(same_bits(yv, rv, per[me]));
        jitter(seed);
        TC_OK(mgc_comm_reduce_scatter_v(c, xv, per, xv + off, MGC_DT_F32, MGC_COMM_SUM));
        TC(same_bits(xv + off, rv, per[me]));
        free(xv), free(yv), free(rv);
    }

    /* bf16 and f16: folded (moves-only handles) in fp32 in group-rank order, rounded once;
     * refused elsewhere */
    for (int dt16 = 0; dt16 < 2; dt16++) {
        mgc_dtype dt = dt16 ? MGC_DT_F16 : MGC_DT_BF16;
        uint16_t *hx = malloc((big + 1) * 2), *hy = malloc((big + 1) * 2),
                 *hr = malloc((big + 1) * 2);
#define TO16(v) (dt16 ? mgc_f32_to_f16(v) : mgc_f32_to_bf16(v))
#define OF16(u) (dt16 ? mgc_f16_to_f32(u) : mgc_bf16_to_f32(u))
        for (size_t i = 0; i < big; i++)
            hx[i] = TO16(value(w, tag + 8 + (uint64_t)dt16, i));
        for (size_t i = 0; i < big; i++) {
            float acc = OF16(TO16(value(members[0], tag + 8 + (uint64_t)dt16, i)));
            for (int j = 1; j < n; j++)
                acc += OF16(TO16(value(members[j], tag + 8 + (uint64_t)dt16, i)));
            hr[i] = TO16(acc);
        }
        jitter(seed);
        mgc_comm_status st = mgc_comm_all_reduce(c, hx, hy, big, dt, MGC_COMM_SUM);
        if (!mgc_comm_moves_only(c)) {
            TC(st == MGC_COMM_ERR_INVALID);
        } else {
            TC_OK(st);
            TC(memcmp(hy, hr, big * 2) == 0);
            jitter(seed);
            TC_OK(mgc_comm_reduce_scatter(c, hx, hx + (size_t)me * count, count, dt, MGC_COMM_SUM));
            TC(memcmp(hx + (size_t)me * count, hr + (size_t)me * count, count * 2) == 0);
        }
#undef TO16
#undef OF16
        free(hx), free(hy), free(hr);
    }

    /* all-gather of fp32, then of bytes in place */
    for (size_t i = 0; i < count; i++)
        x[i] = value(w, tag + 3, i);
    jitter(seed);
    TC_OK(mgc_comm_all_gather(c, x, y, count, MGC_DT_F32));
    for (int j = 0; j < n; j++)
        for (size_t i = 0; i < count; i++)
            ref[(size_t)j * count + i] = value(members[j], tag + 3, i);
    TC(same_bits(y, ref, big));
    unsigned char *bx = (unsigned char *)y;
    memset(bx, 0xee, big);
    for (size_t i = 0; i < count; i++)
        bx[(size_t)me * count + i] = (unsigned char)(w * 31 + (int64_t)i);
    jitter(seed);
    TC_OK(mgc_comm_all_gather(c, bx + (size_t)me * count, bx, count, MGC_DT_U8));
    int bytes_ok = 1;
    for (int j = 0; j < n; j++)
        for (size_t i = 0; i < count; i++)
            bytes_ok &= bx[(size_t)j * count + i] == (unsigned char)(members[j] * 31 + (int64_t)i);
    TC(bytes_ok);

    /* broadcast from every root */
    for (int root = 0; root < n; root++) {
        for (size_t i = 0; i < count; i++)
            x[i] = value(w, tag + 4 + (uint64_t)root, i);
        jitter(seed);
        TC_OK(mgc_comm_broadcast(c, x, count, MGC_DT_F32, root));
        for (size_t i = 0; i < count; i++)
            ref[i] = value(members[root], tag + 4 + (uint64_t)root, i);
        TC(same_bits(x, ref, count));
    }

    /* all-to-all-v, counts 0..4 per pair (all zero for some tags) */
    int none = h3(tag, 99, 0) % 4 == 0;
    size_t sc[8], rc[8], stot = 0, rtot = 0;
    for (int j = 0; j < n; j++) {
        sc[j] = none ? 0 : (size_t)(h3(tag, (uint64_t)w, (uint64_t)members[j]) % 5);
        rc[j] = none ? 0 : (size_t)(h3(tag, (uint64_t)members[j], (uint64_t)w) % 5);
        stot += sc[j];
        rtot += rc[j];
    }
    float *sa = malloc((stot + 1) * sizeof *sa), *ra = malloc((rtot + 1) * sizeof *ra);
    for (size_t o = 0, j = 0; j < (size_t)n; j++)
        for (size_t i = 0; i < sc[j]; i++)
            sa[o++] = value(w, tag + 50, (uint64_t)members[j] * 1000 + i);
    jitter(seed);
    TC_OK(mgc_comm_all_to_all_v(c, sa, sc, NULL, ra, rc, NULL, MGC_DT_F32));
    int a2a_ok = 1;
    for (size_t o = 0, j = 0; j < (size_t)n; j++)
        for (size_t i = 0; i < rc[j]; i++) {
            float v = value(members[j], tag + 50, (uint64_t)w * 1000 + i);
            a2a_ok &= memcmp(&ra[o++], &v, sizeof v) == 0;
        }
    TC(a2a_ok);
    free(sa);
    free(ra);

    /* send/recv around the ring: three messages per link, sizes 0, 1, count */
    if (n > 1) {
        int next = (me + 1) % n, prev = (me + n - 1) % n;
        size_t sizes[3] = {0, 1, count};
        for (int k = 0; k < 3; k++) {
            for (size_t i = 0; i < sizes[k]; i++)
                x[i] = value(w, tag + 60 + (uint64_t)k, i);
            TC_OK(mgc_comm_send(c, x, sizes[k], MGC_DT_F32, next));
        }
        for (int k = 0; k < 3; k++) {
            jitter(seed);
            TC_OK(mgc_comm_recv(c, y, sizes[k], MGC_DT_F32, prev));
            for (size_t i = 0; i < sizes[k]; i++)
                ref[i] = value(members[prev], tag + 60 + (uint64_t)k, i);
            TC(same_bits(y, ref, sizes[k]));
        }
    }
    jitter(seed);
    TC_OK(mgc_comm_barrier(c));
    free(x);
    free(y);
    free(ref);
}

typedef struct grid_case {
    mgc_grid grid;
    int rounds;
} grid_case;

static void grid_rank(rank_arg *a) {
    const grid_case *gc = a->user;
    const mgc_grid *g = &gc->grid;
    mgc_comm *c_for_err = a->comm;
    for (int round = 0; round < gc->rounds; round++) {
        for (int k = 0; k < MGC_GROUP__COUNT; k++) {
            mgc_comm *sub = NULL;
            jitter(&a->seed);
            TC_OK(mgc_comm_group(a->comm, g, (mgc_group_kind)k, &sub));
            int64_t members[8];
            int64_t n = mgc_grid_group(g, (mgc_group_kind)k, a->rank, members, 8);
            if (n == 0) {
                TC(sub == NULL);
                continue;
            }
            TC(sub != NULL);
            if (!sub) continue;
            TC(mgc_comm_size(sub) == n);
            TC(mgc_comm_rank(sub) == mgc_grid_group_rank(g, (mgc_group_kind)k, a->rank));
            TC(mgc_comm_world_rank(sub) == a->rank);
            for (int j = 0; j < n; j++)
                TC(mgc_comm_member(sub, j) == members[j]);
            TC(strcmp(mgc_comm_transport(sub), mgc_comm_transport(a->comm)) == 0);
            exercise(sub, members, (int)n, mgc_comm_rank(sub),
                     (uint64_t)(k * 1000 + round * 100000), &a->seed);
            mgc_comm_free(sub);
        }
        int64_t all[8];
        for (int j = 0; j < g->world; j++)
            all[j] = j;
        exercise(a->comm, all, (int)g->world, a->rank, 777777 + (uint64_t)round, &a->seed);
    }
}

static mgc_grid mk(int64_t tp, int64_t cp, int64_t dp, int64_t pp, int64_t etp, int64_t ep) {
    int64_t world = tp * cp * dp * pp;
    mgc_grid g = {.world = world,
                  .tp = tp,
                  .cp = cp,
                  .dp = dp,
                  .pp = pp,
                  .vp = 1,
                  .etp = etp,
                  .ep = ep,
                  .edp = world / (etp * ep * pp)};
    return g;
}

static void test_grids(void) {
    mgc_grid grids[] = {
        mk(1, 1, 1, 1, 1, 1), mk(2, 1, 1, 1, 1, 1), mk(1, 1, 3, 1, 1, 3), mk(2, 1, 2, 1, 1, 2),
        mk(1, 1, 1, 4, 1, 1), mk(1, 1, 5, 1, 1, 5), mk(3, 1, 2, 1, 1, 2), mk(1, 1, 7, 1, 1, 7),
        mk(2, 1, 2, 2, 1, 2), /* world 8 = tp 2 x dp 2 x pp 2, ep 2 */
        mk(2, 2, 1, 2, 1, 4), /* cp 2, experts ep 4 folded over tp x cp */
        mk(1, 2, 2, 2, 2, 1), /* etp 2 over cp, edp 2 */
        mk(1, 1, 2, 4, 1, 2), /* pp 4: embed groups skip the middle stages */
    };
    for (int moves = 0; moves < 2; moves++) {
        g_moves_only = moves; /* the same bits with reductions folded in comm.c */
        for (size_t i = 0; i < sizeof grids / sizeof grids[0]; i++) {
            T_CHECK(mgc_grid_check(&grids[i]) == 0);
            grid_case gc = {grids[i], 2};
            rank_arg args[8];
            for (unsigned run = 0; run < 3; run++) /* different jitter each run, same bits */
                run_ranks((int)grids[i].world, 20000, grid_rank, &gc, (unsigned)i * 7u + run, args);
        }
    }
    g_moves_only = 0;
}

/* Folded reductions longer than one round (MGC_FOLD_ROUND_BYTES over the group), the last
 * round ragged, on three ranks of a moves-only world: all-reduce out of place and in place,
 * reduce-scatter in place, variable reduce-scatter; and the handle's own scratch and fold
 * (mgc_comm_set_device): a scratch one byte short is refused, a failing fold reported. */
typedef struct fold_case {
    size_t n;       /* all-reduce elements */
    float *ref[3];  /* the three sums over the ranks, in rank order */
    int fold_calls; /* counted by counting_fold */
} fold_case;

static int counting_fold(void *ctx, void *dst, const void *src, int parts, size_t count,
                         size_t stride, mgc_dtype dt, mgc_comm_red op) {
    int *calls = ctx;
    __atomic_add_fetch(calls, 1, __ATOMIC_RELAXED);
    return mgc_comm_fold_host(NULL, dst, src, parts, count, stride, dt, op);
}
static int failing_fold(void *ctx, void *dst, const void *src, int parts, size_t count,
                        size_t stride, mgc_dtype dt, mgc_comm_red op) {
    (void)ctx, (void)dst, (void)src, (void)parts, (void)count, (void)stride, (void)dt, (void)op;
    return -1;
}

static void rounds_rank(rank_arg *a) {
    fold_case *fc = (fold_case *)a->user;
    mgc_comm *c = a->comm, *c_for_err = c;
    int n = mgc_comm_size(c), me = mgc_comm_rank(c);
    size_t N = fc->n, blk = N / (size_t)n;
    float *x = malloc(N * sizeof *x), *y = malloc(N * sizeof *y);
    size_t sb = (size_t)mgc_fold_scratch_bytes(N, n, 4, 0);
    unsigned char *scratch = malloc(sb);
    if (!x || !y || !scratch) {
        TC(0);
        free(x), free(y), free(scratch);
        return;
    }
    mgc_comm_device d = {.fold = counting_fold,
                         .fold_ctx = &fc->fold_calls,
                         .scratch = scratch,
                         .scratch_bytes = sb};
    TC_OK(mgc_comm_set_device(c, &d));
    for (size_t i = 0; i < N; i++)
        x[i] = value(me, 901, i);
    TC_OK(mgc_comm_all_reduce(c, x, y, N, MGC_DT_F32, MGC_COMM_SUM));
    TC(memcmp(y, fc->ref[0], N * 4) == 0);
    TC_OK(mgc_comm_all_reduce(c, x, x, N, MGC_DT_F32, MGC_COMM_SUM));
    TC(memcmp(x, fc->ref[0], N * 4) == 0);
    /* reduce-scatter of blocks of blk, this rank's inside the send side */
    for (size_t i = 0; i < N; i++)
        x[i] = value(me, 902, i);
    TC_OK(mgc_comm_reduce_scatter(c, x, x + (size_t)me * blk, blk, MGC_DT_F32, MGC_COMM_SUM));
    TC(memcmp(x + (size_t)me * blk, fc->ref[1] + (size_t)me * blk, blk * 4) == 0);
    /* variable: blocks blk, blk / 3, 0 (rounds over the largest) */
    size_t per[3] = {blk, blk / 3, 0}, off = me == 0 ? 0 : me == 1 ? blk : blk + blk / 3;
    for (size_t i = 0; i < N; i++)
        x[i] = value(me, 903, i);
    TC_OK(mgc_comm_reduce_scatter_v(c, x, per, y, MGC_DT_F32, MGC_COMM_SUM));
    TC(memcmp(y, fc->ref[2] + off, per[me] * 4) == 0);
    /* a scratch one byte short of the rounds' need: refused before any data moves */
    d.scratch_bytes = sb - 1;
    TC_OK(mgc_comm_set_device(c, &d));
    TC(mgc_comm_all_reduce(c, x, y, N, MGC_DT_F32, MGC_COMM_SUM) == MGC_COMM_ERR_INVALID);
    TC(strstr(mgc_comm_error(c), "fold scratch") != NULL);
    /* a fold that fails: reported on every rank (each folds its own slice of 8) */
    d.scratch_bytes = sb, d.fold = failing_fold;
    TC_OK(mgc_comm_set_device(c, &d));
    TC(mgc_comm_all_reduce(c, x, y, 24, MGC_DT_F32, MGC_COMM_SUM) == MGC_COMM_ERR_SYSTEM);
    TC(strstr(mgc_comm_error(c), "fold") != NULL);
    free(x), free(y), free(scratch);
}

static void test_fold_rounds(void) {
    enum { G = 3 };
    uint64_t p = mgc_fold_round(UINT64_MAX / 8, G, 4, 0); /* a round's slice at its cap */
    T_CHECK(p == MGC_FOLD_ROUND_BYTES / (3 * 4) / 8 * 8); /* whole 8-element vectors */
    T_CHECK(mgc_fold_round(10, G, 4, 0) == 8 && mgc_fold_round(10, G, 4, 1) == 10);
    T_CHECK(mgc_fold_scratch_bytes(10, G, 2, 0) == 3 * 8 * 2 && mgc_fold_round(0, G, 4, 0) == 0);
    T_CHECK(mgc_fold_scratch_bytes(10, G, 2, 1) == 3 * 16 * 2); /* parts padded to 8 */
    /* two all-reduce rounds, the second of 21 elements (only rank 0's slice non-empty);
     * reduce-scatter blocks of p + 7: two rounds */
    fold_case fc = {.n = (size_t)(G * p + 21), .fold_calls = 0};
    for (int k = 0; k < 3; k++) {
        if (!(fc.ref[k] = malloc(fc.n * sizeof(float)))) {
            T_CHECK(0);
            return;
        }
        for (size_t i = 0; i < fc.n; i++) {
            float acc = value(0, 901 + (uint64_t)k, i);
            for (int j = 1; j < G; j++)
                acc += value(j, 901 + (uint64_t)k, i);
            fc.ref[k][i] = acc;
        }
    }
    rank_arg args[8];
    g_moves_only = 1;
    run_ranks(G, 120000, rounds_rank, &fc, 5, args);
    g_moves_only = 0;
    /* folds of non-empty slices: all-reduce 2 + 1 + 1, twice; reduce-scatter 2 a rank; the
     * variable one 2 (rank 0) + 1 (rank 1, blk / 3 < p) + 0 */
    T_CHECK(fc.fold_calls == 2 * 4 + 3 * 2 + 3);
    for (int k = 0; k < 3; k++)
        free(fc.ref[k]);
}

/* The test is only meaningful if order matters: the reference in reverse
 * order differs for these inputs. */
static void test_order_matters(void) {
    int differ = 0;
    for (uint64_t i = 0; i < 64; i++) {
        float f = 0, b = 0;
        f = value(0, 5, i);
        for (int j = 1; j < 8; j++)
            f += value(j, 5, i);
        b = value(7, 5, i);
        for (int j = 6; j >= 0; j--)
            b += value(j, 5, i);
        differ += memcmp(&f, &b, sizeof f) != 0;
    }
    T_CHECK(differ > 0);
}

/* ---- failures ------------------------------------------------------------- */

static void mismatch_rank(rank_arg *a) {
    float x[8] = {0}, y[64];
    int mode = *(const int *)a->user;
    if (mode == 0) /* different operations */
        a->result = a->rank == 1 ? mgc_comm_all_gather(a->comm, x, y, 8, MGC_DT_F32)
                                 : mgc_comm_all_reduce(a->comm, x, y, 8, MGC_DT_F32, MGC_COMM_SUM);
    else if (mode == 1) /* different counts */
        a->result =
            mgc_comm_all_reduce(a->comm, x, y, a->rank == 2 ? 4 : 8, MGC_DT_F32, MGC_COMM_SUM);
    else if (mode == 2) { /* all-to-all-v counts that do not pair up */
        size_t sc[4] = {1, 1, 1, 1}, rc[4] = {1, 1, 1, 1};
        if (a->rank == 3) rc[0] = 2;
        a->result = mgc_comm_all_to_all_v(a->comm, x, sc, NULL, y, rc, NULL, MGC_DT_F32);
    } else if (mode == 3) { /* different group kinds */
        mgc_grid g = mk(2, 1, 2, 1, 1, 2);
        mgc_comm *sub = NULL;
        a->result = mgc_comm_group(a->comm, &g, a->rank == 0 ? MGC_GROUP_DP : MGC_GROUP_TP, &sub);
        mgc_comm_free(sub);
    } else { /* message size mismatch */
        if (a->rank == 0)
            a->result = mgc_comm_send(a->comm, x, 8, MGC_DT_F32, 1);
        else if (a->rank == 1)
            a->result = mgc_comm_recv(a->comm, y, 4, MGC_DT_F32, 0);
        else
            a->result = MGC_COMM_ERR_MISMATCH;
    }
    snprintf(a->err, sizeof a->err, "%s", mgc_comm_error(a->comm));
    /* the job is poisoned: a later call fails at once */
    mgc_comm_status later = mgc_comm_barrier(a->comm);
    TC(later == MGC_COMM_ERR_ABORTED || a->result == MGC_COMM_OK);
}

static void test_mismatch(void) {
    for (int mode = 0; mode < 5; mode++) {
        rank_arg args[8];
        run_ranks(4, 20000, mismatch_rank, &mode, 1, args);
        for (int r = 0; r < 4; r++) {
            if (mode == 4 && r == 0) continue; /* the send was buffered: it succeeded */
            T_CHECK(args[r].result == MGC_COMM_ERR_MISMATCH);
            if (args[r].result != MGC_COMM_ERR_MISMATCH)
                fprintf(stderr, "mode %d: %s\n", mode, args[r].err);
        }
        const char *e = mode == 4 ? args[1].err : args[0].err;
        if (mode == 0) {
            T_CHECK(strstr(e, "all_reduce #0 (8 fp32, sum)") != NULL);
            T_CHECK(strstr(e, "group rank 1 (world 1) called all_gather #0 (8 fp32)") != NULL);
        } else if (mode == 1) {
            T_CHECK(strstr(e, "(4 fp32, sum)") && strstr(e, "(8 fp32, sum)"));
        } else if (mode == 2) {
            T_CHECK(strstr(e, "sends 1 elements to group rank 3 (world 3), which expects 2") !=
                    NULL);
        } else if (mode == 3) {
            T_CHECK(strstr(e, "group #0 (dp)") && strstr(e, "group #0 (tp)"));
        } else {
            T_CHECK(strstr(e, "send #0 (8 fp32, peer 1)") && strstr(e, "recv #0 (4 fp32, peer 0)"));
        }
        printf("mismatch report %d: %s\n", mode, e);
    }
}

static void timeout_rank(rank_arg *a) {
    float x = 1;
    if (a->rank == 1) /* waits for a message nobody sends */
        a->result = mgc_comm_recv(a->comm, &x, 1, MGC_DT_F32, 2);
    else
        a->result = mgc_comm_all_reduce(a->comm, &x, &x, 1, MGC_DT_F32, MGC_COMM_SUM);
    snprintf(a->err, sizeof a->err, "%s", mgc_comm_error(a->comm));
}

static void test_timeout(void) {
    rank_arg args[8];
    run_ranks(3, 300, timeout_rank, NULL, 1, args);
    int timeouts = 0;
    for (int r = 0; r < 3; r++) {
        T_CHECK(args[r].result == MGC_COMM_ERR_TIMEOUT || args[r].result == MGC_COMM_ERR_ABORTED);
        timeouts += args[r].result == MGC_COMM_ERR_TIMEOUT;
    }
    T_CHECK(timeouts >= 1);
    /* ranks 0 and 2 wait for rank 1, which is stuck in a recv from rank 2 */
    const char *e = args[0].result == MGC_COMM_ERR_TIMEOUT ? args[0].err : args[2].err;
    if (args[0].result == MGC_COMM_ERR_TIMEOUT || args[2].result == MGC_COMM_ERR_TIMEOUT) {
        T_CHECK(strstr(e, "timed out after 300 ms in all_reduce #0") != NULL);
        T_CHECK(strstr(e, "group rank 1 (world 1) is blocked in recv #0 (1 fp32, peer 2)") != NULL);
        printf("timeout report: %s\n", e);
    } else {
        T_CHECK(strstr(args[1].err, "timed out after 300 ms in recv #0") != NULL);
    }
}

/* Where a rank that never arrives is, across the job's communicators: mode 0, blocked in a
 * collective of another group (its pair {0, 1}, which rank 0 never joins); mode 1, in no call,
 * computing (a sleep of 2.5 s, past the 1 s timeout) after a collective of its pair. */
static void elsewhere_rank(rank_arg *a) {
    int mode = *(const int *)a->user;
    float x = 1;
    mgc_comm *pair = NULL;
    a->result = mgc_comm_split(a->comm, a->rank / 2, a->rank, &pair);
    if (a->result == MGC_COMM_OK && mode == 1)
        a->result = mgc_comm_all_reduce(pair, &x, &x, 1, MGC_DT_F32, MGC_COMM_SUM);
    if (a->result == MGC_COMM_OK) {
        if (a->rank == 1 && mode == 0) {
            a->result = mgc_comm_all_reduce(pair, &x, &x, 1, MGC_DT_F32, MGC_COMM_SUM);
        } else if (a->rank == 1) {
            struct timespec ts = {2, 500 * 1000000L};
            nanosleep(&ts, NULL);
            a->result = mgc_comm_all_reduce(a->comm, &x, &x, 1, MGC_DT_F32, MGC_COMM_SUM);
        } else {
            a->result = mgc_comm_all_reduce(a->comm, &x, &x, 1, MGC_DT_F32, MGC_COMM_SUM);
        }
    }
    mgc_comm *last = a->rank == 1 && mode == 0 ? pair : a->comm;
    snprintf(a->err, sizeof a->err, "%s", mgc_comm_error(last));
    mgc_comm_free(pair);
}

static void test_elsewhere(void) {
    for (int mode = 0; mode < 2; mode++) {
        rank_arg args[8];
        run_ranks(4, mode ? 1000 : 300, elsewhere_rank, &mode, 1, args);
        /* the first timeout's report, from whichever rank timed out first */
        const char *e = NULL;
        for (int r = 0; r < 4; r++)
            if (args[r].result == MGC_COMM_ERR_TIMEOUT && !e) e = args[r].err;
        T_CHECK(e != NULL);
        if (!e) continue;
        if (mode == 0) {
            /* rank 1 in its pair's all-reduce waits for rank 0, rank 0 in the world's for rank
             * 1: either report names the other's call in the other group */
            T_CHECK((strstr(e, "group rank 1 (world 1) is outside the communicator, last in split "
                               "#0, and is blocked in split#0 all_reduce #0 (1 fp32, sum) for") !=
                     NULL) ||
                    (strstr(e, "group rank 0 (world 0) has not called a collective here yet, and "
                               "is blocked in world all_reduce #1 (1 fp32, sum) for") != NULL));
        } else {
            T_CHECK(strstr(e, "group rank 1 (world 1) is outside the communicator, last in split "
                              "#0, and in no call for ") != NULL);
            T_CHECK(strstr(e, " s, since it left split#0 all_reduce #0 (1 fp32, sum)") != NULL);
        }
        printf("timeout report, rank elsewhere %d: %s\n", mode, e);
    }
}

static void abort_rank(rank_arg *a) {
    float x[4] = {1, 2, 3, 4};
    if (a->rank == 2) {
        struct timespec ts = {0, 20 * 1000000L};
        nanosleep(&ts, NULL);
        mgc_comm_abort(a->comm, "kernel failed");
        a->result = MGC_COMM_ERR_ABORTED;
    } else {
        a->result = mgc_comm_all_reduce(a->comm, x, x, 4, MGC_DT_F32, MGC_COMM_SUM);
    }
    snprintf(a->err, sizeof a->err, "%s", mgc_comm_error(a->comm));
}

static void vanish_rank(rank_arg *a) {
    float x = 1;
    if (a->rank == 1) { /* leaves without taking part */
        mgc_comm_free(a->comm);
        a->comm = NULL;
        a->result = MGC_COMM_ERR_ABORTED;
        return;
    }
    a->result =
        a->rank == 0 ? mgc_comm_barrier(a->comm) : mgc_comm_recv(a->comm, &x, 1, MGC_DT_F32, 1);
    snprintf(a->err, sizeof a->err, "%s", mgc_comm_error(a->comm));
}

static void test_release(void) {
    rank_arg args[8];
    /* the long timeout would fail the test by time only: release must be prompt */
    run_ranks(4, 60000, abort_rank, NULL, 1, args);
    for (int r = 0; r < 4; r++) {
        T_CHECK(args[r].result == MGC_COMM_ERR_ABORTED);
        T_CHECK(strstr(args[r].err, r == 2 ? "aborted: kernel failed"
                                           : "released because the job failed: world rank 2 "
                                             "(world 2) aborted: kernel failed") != NULL);
    }
    printf("abort report: %s\n", args[0].err);
    run_ranks(3, 60000, vanish_rank, NULL, 1, args);
    for (int r = 0; r < 3; r++)
        T_CHECK(args[r].result == MGC_COMM_ERR_ABORTED);
    T_CHECK(strstr(args[0].err, "freed its communicator") != NULL);
    T_CHECK(strstr(args[2].err, "freed its communicator") != NULL);
}

static void test_invalid(void) {
    mgc_comm *c[1];
    char err[256];
    T_CHECK(mgc_comm_local_world_create(0, NULL, c, err, sizeof err) == MGC_COMM_ERR_INVALID);
    T_CHECK(mgc_comm_local_world_create(1, NULL, c, err, sizeof err) == MGC_COMM_OK);
    uint16_t h[2] = {0};
    T_CHECK(mgc_comm_all_reduce(c[0], h, h, 2, MGC_DT_BF16, MGC_COMM_SUM) == MGC_COMM_ERR_INVALID);
    T_CHECK(strstr(mgc_comm_error(c[0]), "cannot reduce bf16") != NULL);
    T_CHECK(mgc_comm_broadcast(c[0], h, 1, MGC_DT_F32, 1) == MGC_COMM_ERR_INVALID);
    T_CHECK(mgc_comm_send(c[0], h, 1, MGC_DT_F32, 0) == MGC_COMM_ERR_INVALID);
    mgc_grid g = mk(2, 1, 1, 1, 1, 1);
    mgc_comm *sub = NULL;
    T_CHECK(mgc_comm_group(c[0], &g, MGC_GROUP_TP, &sub) == MGC_COMM_ERR_INVALID);
    T_CHECK(sub == NULL);
    /* nothing failed across ranks: the world still works */
    float x = 2;
    T_CHECK(mgc_comm_all_reduce(c[0], &x, &x, 1, MGC_DT_F32, MGC_COMM_SUM) == MGC_COMM_OK &&
            x == 2);
    mgc_comm_free(c[0]);
    mgc_comm_free(NULL);
}

/* ---- one rank per process (MPI, TCP) ---------------------------------------- */

/* Every grid of the world's size through every operation, against the serial reference;
 * returns how many grids ran. */
static int grids_of_world(mgc_comm *world) {
    int n = mgc_comm_size(world), me = mgc_comm_rank(world), ran = 0;
    mgc_grid grids[] = {mk(n, 1, 1, 1, 1, 1), mk(1, 1, n, 1, 1, n), mk(1, 1, 1, n, 1, 1),
                        mk(2, 1, 2, 2, 1, 2), mk(2, 2, 1, 2, 1, 4), mk(1, 2, 2, 2, 2, 1),
                        mk(1, 1, 2, 4, 1, 2), mk(2, 1, 2, 1, 1, 2), mk(3, 1, 2, 1, 1, 2)};
    for (size_t i = 0; i < sizeof grids / sizeof grids[0]; i++) {
        if (grids[i].world != n || mgc_grid_check(&grids[i]) != 0) continue;
        grid_case gc = {grids[i], 2};
        rank_arg a = {.comm = world, .rank = me, .user = &gc, .seed = 1234u + (unsigned)me};
        grid_rank(&a);
        ran++;
    }
    return ran;
}

/* Rank 1 gathers where the others reduce: a mismatch every rank reports alike, and the job
 * poisoned after it (so: last). */
static void mismatch_of_world(mgc_comm *world, const char *transport) {
    int n = mgc_comm_size(world), me = mgc_comm_rank(world);
    if (n < 2) return;
    float x[8] = {0}, y[64];
    mgc_comm_status s = me == 1 ? mgc_comm_all_gather(world, x, y, 8, MGC_DT_F32)
                                : mgc_comm_all_reduce(world, x, y, 8, MGC_DT_F32, MGC_COMM_SUM);
    T_CHECK(s == MGC_COMM_ERR_MISMATCH);
    T_CHECK(strstr(mgc_comm_error(world), "group rank 0 (world 0) called all_reduce #") &&
            strstr(mgc_comm_error(world), "but group rank 1 (world 1) called all_gather #"));
    if (me == 0) printf("%s mismatch report: %s\n", transport, mgc_comm_error(world));
    T_CHECK(mgc_comm_barrier(world) == MGC_COMM_ERR_ABORTED);
}

/* ---- the MPI transport: `mpirun -n N test_comm --mpi` ----------------------- */

static int test_mpi(void) {
    mgc_comm *world = NULL;
    char err[256];
    mgc_comm_config cfg = MGC_COMM_CONFIG_INIT;
    cfg.timeout_ms = 60000;
    mgc_comm_status s = mgc_comm_mpi_world_create(&cfg, &world, err, sizeof err);
    if (s == MGC_COMM_ERR_UNSUPPORTED) {
        printf("test_comm --mpi: skipped (%s)\n", err);
        return 77;
    }
    T_CHECK(s == MGC_COMM_OK);
    if (s != MGC_COMM_OK) return t_summary("test_comm --mpi");
    int n = mgc_comm_size(world), me = mgc_comm_rank(world);
    T_CHECK(strcmp(mgc_comm_transport(world), "mpi") == 0);
    grids_of_world(world);
    mismatch_of_world(world, "mpi");
    mgc_comm_free(world);
    char name[64];
    snprintf(name, sizeof name, "test_comm --mpi rank %d/%d", me, n);
    return t_summary(name);
}

/* ---- the TCP transport: tests/comm_tcp.sh starts N processes of `test_comm --tcp MODE`
 * with RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT set ------------------------------- */

static int test_tcp(const char *mode) {
    mgc_comm *world = NULL;
    char err[512];
    mgc_comm_config cfg = MGC_COMM_CONFIG_INIT;
    cfg.timeout_ms = 60000;
    mgc_comm_status s = mgc_comm_tcp_world_create(&cfg, &world, err, sizeof err);
    if (s != MGC_COMM_OK) fprintf(stderr, "test_comm --tcp: %s\n", err);
    T_CHECK(s == MGC_COMM_OK);
    if (s != MGC_COMM_OK) return t_summary("test_comm --tcp");
    int n = mgc_comm_size(world), me = mgc_comm_rank(world);
    T_CHECK(strcmp(mgc_comm_transport(world), "tcp") == 0);
    T_CHECK(mgc_comm_concurrent(world) == 0);
    if (!strcmp(mode, "grids")) {
        T_CHECK(grids_of_world(world) > 0);
        /* a large all-reduce: megabytes each way, the sockets fill and drain in turn */
        size_t big = (size_t)1 << 20;
        float *x = malloc(big * sizeof *x), *y = malloc(big * sizeof *y);
        for (size_t i = 0; x && i < big; i++)
            x[i] = (float)((i * 7 + (size_t)me * 13) % 1000) / 8.0f;
        T_CHECK(x && y && mgc_comm_all_reduce(world, x, y, big, MGC_DT_F32, MGC_COMM_SUM) == MGC_COMM_OK);
        size_t wrong = 0;
        for (size_t i = 0; x && y && i < big; i++) {
            float want = 0;
            for (int r = 0; r < n; r++)
                want = r ? want + (float)((i * 7 + (size_t)r * 13) % 1000) / 8.0f
                         : (float)((i * 7) % 1000) / 8.0f;
            wrong += y[i] != want;
        }
        T_EQ_I64((int64_t)wrong, 0);
        free(x), free(y);
        mismatch_of_world(world, "tcp");
    } else if (!strcmp(mode, "abort")) {
        /* rank 1 fails elsewhere and aborts: the others, in an all-reduce with a minute's
         * timeout, are released at once with its reason */
        float x[4] = {1, 2, 3, 4};
        if (me == 1) {
            struct timespec ts = {0, 100 * 1000000L};
            nanosleep(&ts, NULL);
            mgc_comm_abort(world, "kernel failed");
        } else {
            struct timespec t0, t1;
            clock_gettime(CLOCK_MONOTONIC, &t0);
            s = mgc_comm_all_reduce(world, x, x, 4, MGC_DT_F32, MGC_COMM_SUM);
            clock_gettime(CLOCK_MONOTONIC, &t1);
            T_CHECK(s == MGC_COMM_ERR_ABORTED);
            T_CHECK(strstr(mgc_comm_error(world), "world rank 1 aborted: kernel failed") != NULL);
            T_CHECK((double)(t1.tv_sec - t0.tv_sec) < 10.0);
            if (me == 0) printf("tcp abort report: %s\n", mgc_comm_error(world));
        }
    } else if (!strcmp(mode, "vanish")) {
        /* rank 1 exits without taking part: the others learn it from the closed connection,
         * or from a survivor that learnt it first.  Each survivor aborts with its reason before
         * it exits, as the runtime does (exec.c), so no one blames a survivor that merely left:
         * the abort precedes the survivor's end on its stream. */
        if (me == 1) {
            mgc_comm_free(world);
            return 0;
        }
        float x = 1;
        s = mgc_comm_all_reduce(world, &x, &x, 1, MGC_DT_F32, MGC_COMM_SUM);
        char why[1024];
        snprintf(why, sizeof why, "%s", mgc_comm_error(world));
        mgc_comm_abort(world, why);
        T_CHECK(s == MGC_COMM_ERR_ABORTED);
        if (!strstr(why, "group rank 1 (world 1) closed its connection"))
            fprintf(stderr, "test_comm --tcp vanish rank %d: %s\n", me, why);
        T_CHECK(strstr(why, "group rank 1 (world 1) closed its connection") != NULL);
        if (me == 0) printf("tcp vanish report: %s\n", why);
    }
    mgc_comm_free(world);
    char name[64];
    snprintf(name, sizeof name, "test_comm --tcp %s rank %d/%d", mode, me, n);
    return t_summary(name);
}

int main(int argc, char **argv) {
    if (argc > 1 && strcmp(argv[1], "--mpi") == 0) return test_mpi();
    if (argc > 1 && strcmp(argv[1], "--tcp") == 0) return test_tcp(argc > 2 ? argv[2] : "grids");
    test_order_matters();
    test_invalid();
    test_grids();
    test_fold_rounds();
    test_mismatch();
    test_timeout();
    test_elsewhere();
    test_release();
    return t_summary("test_comm");
}
