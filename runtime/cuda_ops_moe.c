/* cuda_ops_moe.c - the CUDA launcher of the mixture-of-experts ops (router,
 * dispatch map, permute, combine, the sort of received rows); the kernels are
 * kernels/moe.cuh, the specs codegen/kspec_moe.c, the reference the CPU
 * backend's op_moe (cpu_backend.c) with the math of cpu_ops_tmpl.h.
 *
 * Tensors as the plan says: activations and rows in the compute dtype (the
 * kernels' mgc_t), probabilities and their gradient fp32, expert ids int32,
 * counts int64 (int32 accepted where the CPU backend converts).  The dispatch
 * map is recomputed on the device from ids and probs by every op that needs
 * it, as on the CPU; only its row_of (the row of each assignment, -1 when
 * dropped) is used here, so the row kernels need no host-side row count.
 * Everything stays on the device: no synchronisation, no copy to the host.
 * Scalars (z-loss, aux loss) are reduced in two fixed-order passes (per-token
 * partials in scratch, then one block). */
#include <stdint.h>
#include <string.h>

#include "cuda_int.h"

#define MOE_TILE MGC_KSPEC_MOE_TILE /* kernels/moe.cuh: assignments per map block */

/* moe.router_topk_scaling_factor: the route op's fattr[2] (0, as in older plans: 1) */
static float topk_scale(const mgc_plan_op *op) {
    return op->fattr[2] > 0 ? (float)op->fattr[2] : 1.0f;
}

/* mgc_router_score (cpu_ops.h) from the plan's mgc_score: 1 sigmoid, 2 presoftmax (softmax over
 * every expert), else softmax over the chosen. */
static int score_of(int64_t s) {
    return s == 1 ? 2 : s == 2 ? 1 : 0;
}
#define DROP_PROBS 0 /* mgc_drop_policy (cpu_ops.h): keep the highest probabilities */

static const mgc_plan_tensor *tin(const mgc_op_call *c, int i) {
    return &c->chunk->tensors[c->op->in[i]];
}
static const mgc_plan_tensor *tout(const mgc_op_call *c, int i) {
    return &c->chunk->tensors[c->op->out[i]];
}
static int64_t numel(const mgc_plan_tensor *t) {
    int64_t n = 1;
    for (int i = 0; i < t->rank; i++)
        n *= t->dim[i];
    return n;
}
static int64_t last_dim(const mgc_plan_tensor *t) {
    return t->rank > 0 ? t->dim[t->rank - 1] : 0;
}

typedef struct moe_ctx {
    mgc_backend *be;
    const mgc_op_call *c;
    mgc_kspec k[MGC_KSPEC_MAX_PER_OP];
    int n;
} moe_ctx;

static const char *op_name(const moe_ctx *x) {
    return mgc_plan_strat(x->c->plan, x->c->op->name);
}

static const mgc_kspec *spec(moe_ctx *x, const char *entry) {
    for (int i = 0; i < x->n; i++)
        if (!strcmp(x->k[i].entry, entry)) return &x->k[i];
    return NULL;
}

static int launch(moe_ctx *x, const char *entry, uint64_t grid, unsigned block, size_t smem,
                  void **args) {
    if (grid == 0) return 0;
    const mgc_kspec *k = spec(x, entry);
    if (!k)
        return mgc_cuda_fail(x->be, "cuda moe: op '%s' has no kernel %s in its specs", op_name(x),
                             entry);
    if (grid > 0x7fffffffu)
        return mgc_cuda_fail(x->be, "cuda moe: op '%s': grid of %llu blocks for %s", op_name(x),
                             (unsigned long long)grid, entry);
    return mgc_cuda_launch(x->be, k, (unsigned)grid, 1, 1, block, smem, args);
}

/* Bump allocator over one scratch block (one mgc_cuda_scratch call per op:
 * a second call may move the block). */
static size_t al(size_t b) {
    return (size_t)mgc_kspec_align(b);
}
static void *carve(unsigned char **p, size_t bytes) {
    void *r = *p;
    *p += al(bytes);
    return r;
}

/* ---- the dispatch map ------------------------------------------------------------- */

typedef struct moe_map {
    int64_t nk, E, cap, ntiles;
    int probs; /* capacity by probability: two passes */
    int *tilecnt, *tileoff, *tot, *off, *row_of, *list;
    unsigned char *keep;
} moe_map;

static size_t map_bytes(int64_t nk, int64_t E, int64_t cap, int policy) {
    return (size_t)mgc_kspec_moe_map_bytes(nk, E, cap, policy == DROP_PROBS); /* the plan's size */
}

static void map_carve(moe_map *m, unsigned char **p, int64_t nk, int64_t E, int64_t cap,
                      int policy) {
    memset(m, 0, sizeof *m);
    m->nk = nk, m->E = E, m->cap = cap > 0 ? cap : 0;
    m->ntiles = (nk + MOE_TILE - 1) / MOE_TILE;
    m->probs = cap > 0 && policy == DROP_PROBS;
    m->tilecnt = carve(p, (size_t)(m->ntiles * E) * 4);
    m->tileoff = carve(p, (size_t)(m->ntiles * E) * 4);
    m->tot = carve(p, (size_t)E * 4);
    m->off = carve(p, (size_t)(E + 1) * 4);
    m->row_of = carve(p, (size_t)nk * 4);
    if (m->probs) {
        m->list = carve(p, (size_t)nk * 4);
        m->keep = carve(p, (size_t)nk);
    }
}

/* hist + scan over ids (kept ones only when keep), capacity cap (0: none);
 * counts out (NULL: none). */
static int map_count(moe_ctx *x, moe_map *m, const int *ids, const unsigned char *keep,
                     long long cap, void *counts, int c64) {
    int nk = (int)m->nk, E = (int)m->E, ntiles = (int)m->ntiles;
    void *ha[] = {&ids, &keep, &nk, &E, &m->tilecnt};
    if (launch(x, "moe_map_hist", (uint64_t)ntiles, MOE_TILE, (size_t)(8 * E) * 4, ha)) return -1;
    void *sa[] = {&m->tilecnt, &ntiles, &E, &cap, &m->tileoff, &m->tot, &m->off, &counts, &c64};
    return launch(x, "moe_map_scan", 1, 256, (size_t)E * 4, sa);
}

static int map_scatter(moe_ctx *x, moe_map *m, const int *ids, const unsigned char *keep,
                       long long cap, int *row_src, int *row_of) {
    int nk = (int)m->nk, E = (int)m->E;
    void *a[] = {&ids, &keep, &nk, &E, &cap, &m->tileoff, &m->off, &row_src, &row_of};
    return launch(x, "moe_map_scatter", (uint64_t)m->ntiles, MOE_TILE, (size_t)(8 * E) * 4, a);
}

/* m->row_of from ids and probs as mgc_cpu_moe_dispatch_map; counts (E) out when not NULL. */
static int map_build(moe_ctx *x, moe_map *m, const int *ids, const float *probs, void *counts,
                     int c64) {
    const unsigned char *none = NULL;
    if (!m->probs) {
        long long cap = m->cap;
        if (map_count(x, m, ids, none, cap, counts, c64)) return -1;
        return map_scatter(x, m, ids, none, cap, NULL, m->row_of);
    }
    /* pass 1: every expert's assignments (dropless), then who is kept */
    if (map_count(x, m, ids, none, 0, NULL, c64) || map_scatter(x, m, ids, none, 0, m->list, NULL))
        return -1;
    int nk = (int)m->nk;
    long long cap = m->cap;
    void *ra[] = {&ids, &probs, &nk, &cap, &m->list, &m->off, &m->tot, &m->keep};
    if (launch(x, "moe_map_rank", (uint64_t)((m->nk + 255) / 256), 256, 0, ra)) return -1;
    /* pass 2: the kept ones, in assignment order */
    const unsigned char *keep = m->keep;
    if (map_count(x, m, ids, keep, 0, counts, c64)) return -1;
    return map_scatter(x, m, ids, keep, 0, NULL, m->row_of);
}

static int map_check(moe_ctx *x, const mgc_plan_tensor *ids, int64_t nk, int64_t E) {
    if (ids->dtype != MGC_DT_I32)
        return mgc_cuda_fail(x->be, "cuda moe: op '%s': expert ids are %s, not int32", op_name(x),
                             mgc_dtype_name((mgc_dtype)ids->dtype));
    if (nk < 0 || nk > 0x7fffffff - MOE_TILE || E < 1 || E > 1536)
        return mgc_cuda_fail(x->be,
                             "cuda moe: op '%s': %lld assignments over %lld experts are "
                             "outside the map kernels' range (E <= 1536, n*k < 2^31)",
                             op_name(x), (long long)nk, (long long)E);
    return 0;
}

/* ---- sort of received rows ----------------------------------------------------------- */

/* src -> dst between (chunk, local expert) and (local expert, chunk) order;
 * inverse 0: src chunk-major.  counts (chunks * El) int64 on the device. */
static int sort_rows(moe_ctx *x, const void *src, void *dst, const mgc_plan_tensor *cnt_t,
                     const void *counts, int64_t dst_rows, int inverse, int64_t *tpe) {
    int El = (int)x->c->op->iattr[1], chunks = (int)x->c->op->iattr[2];
    if (cnt_t->dtype != MGC_DT_I64 || El < 1 || chunks < 1 || numel(cnt_t) < (int64_t)El * chunks)
        return mgc_cuda_fail(x->be,
                             "cuda moe: op '%s': counts of %lld x %lld blocks expected as "
                             "int64",
                             op_name(x), (long long)chunks, (long long)El);
    int nb = El * chunks;
    unsigned char *w = mgc_cuda_scratch(x->be, al((size_t)nb * 8) + al((size_t)(nb + 1) * 8));
    if (!w) return -1;
    long long *cm = carve(&w, (size_t)nb * 8), *em = carve(&w, (size_t)(nb + 1) * 8);
    void *oa[] = {&counts, &chunks, &El, &cm, &em, &tpe};
    if (launch(x, "moe_sort_offsets", 1, 32, 0, oa)) return -1;
    void *ra[] = {&src, &dst, &cm, &em, &chunks, &El, &inverse};
    return launch(x, "moe_sort_rows", (uint64_t)dst_rows, 128, 0, ra);
}

/* ---- the ops ------------------------------------------------------------------------- */

/* The rows of an aux loss's counts tensor t: 1 (E counts), or the sequences of (C, E) counts
 * (moe.aux_loss_scope sequence); -1 when they do not divide the n tokens. */
static int count_rows(const mgc_plan_tensor *t, int64_t E, int64_t n) {
    int64_t C = t->rank == 2 && E > 0 ? numel(t) / E : 1;
    return C >= 1 && C <= 0x7fffffff && n % C == 0 ? (int)C : -1;
}

static int route(moe_ctx *x) {
    const mgc_op_call *c = x->c;
    const mgc_plan_op *op = c->op;
    int64_t E = op->iattr[1], K = op->iattr[2];
    const mgc_plan_tensor *lg = tin(c, 0);
    int64_t n64 = E > 0 ? numel(lg) / E : 0;
    if (n64 > 0x7fffffff)
        return mgc_cuda_fail(x->be, "cuda moe: op '%s': too many tokens", op_name(x));
    int n = (int)n64;
    const void *logits = c->in[0];
    if (op->iattr[0] == 1) { /* aux loss from the global counts */
        int score = score_of(c->router_score), c64 = tin(c, 1)->dtype == MGC_DT_I64;
        int ncol = count_rows(tin(c, 1), E, n64);
        if (ncol < 0)
            return mgc_cuda_fail(x->be, "cuda moe: op '%s': its counts do not divide its tokens",
                                 op_name(x));
        const void *counts = c->in[1];
        float *part = mgc_cuda_scratch(x->be, al((size_t)(n ? n : 1) * 4));
        if (!part) return -1;
        void *pa[] = {&logits, &counts, &c64, &part, &n, &score, &ncol};
        if (launch(x, "moe_aux_part", (uint64_t)(n + 3) / 4, 128, 0, pa)) return -1;
        int64_t T = op->iattr[3];
        float mul =
            (float)(op->fattr[0] * (double)E * (double)ncol / ((double)K * (double)T * (double)T));
        float div = 1.0f;
        float *out = c->out[0];
        void *sa[] = {&part, &n, &mul, &div, &out};
        return launch(x, "moe_sum", 1, 256, 0, sa);
    }
    if (tout(c, 0)->dtype != MGC_DT_F32 || tout(c, 1)->dtype != MGC_DT_I32)
        return mgc_cuda_fail(x->be, "cuda moe: op '%s': probs must be fp32 and ids int32",
                             op_name(x));
    float *probs = c->out[0], *z = NULL;
    int *ids = c->out[1];
    void *counts = NULL;
    int c64 = 1, ncol = 1, per_seq = 0;
    for (int i = 2; i < op->n_out; i++) {
        if (tout(c, i)->dtype == MGC_DT_F32)
            z = c->out[i];
        else
            counts = c->out[i], c64 = tout(c, i)->dtype == MGC_DT_I64,
            ncol = count_rows(tout(c, i), E, n64), per_seq = tout(c, i)->rank == 2;
    }
    if (ncol < 0)
        return mgc_cuda_fail(x->be, "cuda moe: op '%s': its counts do not divide its tokens",
                             op_name(x));
    int64_t nk = n64 * K;
    if (counts && map_check(x, tout(c, 1), nk, E)) return -1;
    size_t bytes = al((size_t)(n ? n : 1) * 4) + (counts ? map_bytes(nk, E, 0, 0) : 0);
    unsigned char *w = mgc_cuda_scratch(x->be, bytes);
    if (!w) return -1;
    float *zpart = carve(&w, (size_t)(n ? n : 1) * 4), *zp = z ? zpart : NULL;
    int score = score_of(MGC_ROUTE_SCORE(op->iattr[3]));
    float scale = topk_scale(op);
    const float *bias = op->n_in > 1 ? c->in[1] : NULL; /* the expert bias (fp32, E) */
    void *ra[] = {&logits, &bias, &probs, &ids, &zp, &n, &score, &scale};
    if (launch(x, "moe_route_fwd", (uint64_t)(n + 3) / 4, 128, 0, ra)) return -1;
    if (z) { /* z_coeff * mean_t lse_t^2 */
        float mul = (float)op->fattr[1], div = n > 0 ? (float)n : 1.0f;
        void *sa[] = {&zpart, &n, &mul, &div, &z};
        if (launch(x, "moe_sum", 1, 256, 0, sa)) return -1;
    }
    if (counts && per_seq) { /* each sequence's local assignments per expert (kspec_moe.c) */
        int Ki = (int)K, Ei = (int)E;
        void *ca[] = {&ids, &n, &Ki, &ncol, &Ei, &counts, &c64};
        return launch(x, "moe_col_counts", (uint64_t)ncol * (uint64_t)((E + 31) / 32), 256, 0, ca);
    }
    if (counts) { /* local assignments per expert (dropless) */
        moe_map m;
        map_carve(&m, &w, nk, E, 0, 0);
        if (map_count(x, &m, ids, NULL, 0, counts, c64)) return -1;
    }
    return 0;
}

static int route_bwd(moe_ctx *x) { /* in: logits, ids, dprobs, (global counts); out: dlogits */
    const mgc_op_call *c = x->c;
    const mgc_plan_op *op = c->op;
    int64_t E = op->iattr[1], K = op->iattr[2], tp = c->grid_tp, cp = c->grid_cp;
    int64_t n64 = E > 0 ? numel(tin(c, 0)) / E : 0;
    if (n64 > 0x7fffffff)
        return mgc_cuda_fail(x->be, "cuda moe: op '%s': too many tokens", op_name(x));
    if (tin(c, 1)->dtype != MGC_DT_I32 || tin(c, 2)->dtype != MGC_DT_F32)
        return mgc_cuda_fail(x->be, "cuda moe: op '%s': ids must be int32 and dprobs fp32",
                             op_name(x));
    int n = (int)n64;
    int has_aux = op->n_in > 3;
    const void *counts = has_aux ? c->in[3] : NULL;
    int c64 = has_aux ? tin(c, 3)->dtype == MGC_DT_I64 : 1;
    int ncol = has_aux ? count_rows(tin(c, 3), E, n64) : 1;
    if (ncol < 0)
        return mgc_cuda_fail(x->be, "cuda moe: op '%s': its counts do not divide its tokens",
                             op_name(x));
    /* the training loss adds the aux loss summed over tensor x context ranks and the
     * z-loss averaged over them; both per microbatch like the LM loss (c->dloss) */
    double T = (double)(n64 * tp * cp);
    float auxk =
        has_aux && T > 0
            ? (float)(c->dloss * op->fattr[0] * (double)E * (double)ncol / ((double)K * T * T))
            : 0.0f;
    float zk =
        n > 0 ? (float)(c->dloss / (double)(tp * cp) * op->fattr[1] * 2.0 / (double)n) : 0.0f;
    int score = score_of(MGC_ROUTE_SCORE(op->iattr[3]));
    const void *logits = c->in[0], *ids = c->in[1], *dprobs = c->in[2];
    void *dlogits = c->out[0];
    float scale = topk_scale(op);
    void *a[] = {&logits, &ids,   &dprobs, &counts, &c64,   &dlogits,
                 &n,      &score, &auxk,   &zk,     &scale, &ncol};
    return launch(x, "moe_route_bwd", (uint64_t)(n + 3) / 4, 128, 0, a);
}

/* Map-based phases: dispatch (permute), its backward, combine and its backward. */
static int mapped(moe_ctx *x) {
    const mgc_op_call *c = x->c;
    const mgc_plan_op *op = c->op;
    int64_t E = op->iattr[1], n, K, cap;
    int policy, ids_in, probs_in;
    switch ((mgc_plan_op_kind)op->kind) {
    case MGC_POP_MOE_DISPATCH:
    case MGC_POP_MOE_DISPATCH_BWD: { /* in: x | drows, ids, probs */
        const mgc_plan_tensor *ids = tin(c, 1);
        n = ids->dim[0], K = ids->dim[1], cap = op->iattr[2], policy = (int)op->iattr[3];
        ids_in = 1, probs_in = 2;
        break;
    }
    case MGC_POP_MOE_COMBINE: { /* in: rows, probs, ids; out: y */
        const mgc_plan_tensor *y = tout(c, 0);
        int64_t h = last_dim(y);
        n = h > 0 ? numel(y) / h : 0, K = op->iattr[2], cap = op->iattr[3];
        policy = c->drop_policy, ids_in = 2, probs_in = 1;
        break;
    }
    default: { /* combine_bwd; in: dy, rows, probs, ids; out: drows, dprobs */
        const mgc_plan_tensor *dy = tin(c, 0);
        int64_t h = last_dim(dy);
        n = h > 0 ? numel(dy) / h : 0, K = op->iattr[2], cap = op->iattr[3];
        policy = c->drop_policy, ids_in = 3, probs_in = 2;
        break;
    }
    }
    int64_t nk = n * K;
    if (map_check(x, tin(c, ids_in), nk, E)) return -1;
    if (tin(c, probs_in)->dtype != MGC_DT_F32)
        return mgc_cuda_fail(x->be, "cuda moe: op '%s': probs must be fp32", op_name(x));
    unsigned char *w = mgc_cuda_scratch(x->be, map_bytes(nk, E, cap, policy));
    if (!w) return -1;
    moe_map m;
    map_carve(&m, &w, nk, E, cap, policy);
    const int *ids = c->in[ids_in];
    const float *probs = c->in[probs_in];
    void *counts = NULL;
    int c64 = 1;
    if (op->kind == MGC_POP_MOE_DISPATCH) counts = c->out[1], c64 = tout(c, 1)->dtype == MGC_DT_I64;
    if (map_build(x, &m, ids, probs, counts, c64)) return -1;
    int *row_of = m.row_of;
    switch ((mgc_plan_op_kind)op->kind) {
    case MGC_POP_MOE_DISPATCH: {
        const void *xs = c->in[0];
        void *rows = c->out[0];
        void *a[] = {&xs, &row_of, &rows};
        return launch(x, "moe_permute", (uint64_t)nk, 128, 0, a);
    }
    case MGC_POP_MOE_DISPATCH_BWD: {
        const void *drows = c->in[0];
        void *dx = c->out[0];
        void *a[] = {&drows, &row_of, &dx};
        return launch(x, "moe_permute_bwd", (uint64_t)n, 128, 0, a);
    }
    case MGC_POP_MOE_COMBINE: {
        const void *rows = c->in[0];
        void *y = c->out[0];
        void *a[] = {&rows, &probs, &row_of, &y};
        return launch(x, "moe_combine", (uint64_t)n, 128, 0, a);
    }
    default: {
        if (tout(c, 1)->dtype != MGC_DT_F32)
            return mgc_cuda_fail(x->be, "cuda moe: op '%s': dprobs must be fp32", op_name(x));
        /* rows past the routed ones (the buffer holds the dropless bound) stay untouched */
        const void *dy = c->in[0], *rows = c->in[1];
        void *drows = c->out[0], *dprobs = c->out[1];
        void *a[] = {&dy, &rows, &probs, &row_of, &drows, &dprobs};
        return launch(x, "moe_combine_bwd", (uint64_t)nk, 128, 0, a);
    }
    }
}

int mgc_cuda_ops_moe(mgc_backend *be, const mgc_op_call *c) {
    const mgc_plan_op *op = c->op;
    switch ((mgc_plan_op_kind)op->kind) {
    case MGC_POP_MOE_ROUTE:
    case MGC_POP_MOE_ROUTE_BWD:
    case MGC_POP_MOE_DISPATCH:
    case MGC_POP_MOE_DISPATCH_BWD:
    case MGC_POP_MOE_COMBINE:
    case MGC_POP_MOE_COMBINE_BWD:
        break;
    default:
        return 1; /* the grouped GEMMs and every other op: not this family */
    }
    moe_ctx x;
    x.be = be;
    x.c = c;
    char err[256] = "";
    x.n = mgc_kspecs_for_op(c->plan, c->chunk, op, x.k, MGC_KSPEC_MAX_PER_OP, err, sizeof err);
    if (x.n < 0)
        return mgc_cuda_fail(be, "cuda moe: op '%s': no kernels for its shapes%s%s", op_name(&x),
                             err[0] ? ": " : "", err);
    int phase = (int)op->iattr[0];
    switch ((mgc_plan_op_kind)op->kind) {
    case MGC_POP_MOE_ROUTE:
        return route(&x);
    case MGC_POP_MOE_ROUTE_BWD:
        return route_bwd(&x);
    case MGC_POP_MOE_DISPATCH:
        if (phase != 0) { /* .sort; in: rows by source chunk, counts; out: by local expert, tpe */
            if (tout(c, 1)->dtype != MGC_DT_I64)
                return mgc_cuda_fail(be, "cuda moe: op '%s': tokens per expert must be int64",
                                     op_name(&x));
            return sort_rows(&x, c->in[0], c->out[0], tin(c, 1), c->in[1], tout(c, 0)->dim[0], 0,
                             c->out[1]);
        }
        return mapped(&x);
    case MGC_POP_MOE_DISPATCH_BWD:
        if (phase != 0) /* the sort's transpose: in dy (by local expert), counts; out dx */
            return sort_rows(&x, c->in[0], c->out[0], tin(c, 1), c->in[1], tout(c, 0)->dim[0], 1,
                             NULL);
        return mapped(&x);
    case MGC_POP_MOE_COMBINE:
        if (phase == 0) /* .unsort; in: rows by local expert, counts; out: by chunk */
            return sort_rows(&x, c->in[0], c->out[0], tin(c, 1), c->in[1], tout(c, 0)->dim[0], 1,
                             NULL);
        return mapped(&x);
    default:
        if (phase == 0) /* the unsort's transpose: in dy (by chunk), counts; out by expert */
            return sort_rows(&x, c->in[0], c->out[0], tin(c, 1), c->in[1], tout(c, 0)->dim[0], 0,
                             NULL);
        return mapped(&x);
    }
}
