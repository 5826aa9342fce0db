/* grid.c - the rank grid and its process groups (see plan.h and
 * docs/process-groups.md).
 *
 * Both grids are mixed-radix numbers with the fastest digit first:
 *     dense:  rank = tp_i  + tp  * (cp_i + cp * (dp_i  + dp  * pp_i))
 *     expert: rank = etp_i + etp * (ep_i + ep * (edp_i + edp * pp_i))
 * and since pp is the slowest digit of both, pp_i = rank / (world / pp) in
 * either.  A group of a kind is the set of ranks that differ only in that
 * kind's digits (its "masked" dimensions); its members, its group rank and
 * its id follow from the digits alone, so nothing here is O(world). */
#include "plan.h"

/* ---- names ---------------------------------------------------------------- */

static const char *const group_names[] = {"tp", "cp",  "dp",  "pp",    "dp_cp", "tp_cp",
                                          "ep", "etp", "edp", "embed", "world"};

#define COUNT_OF(a) (sizeof(a) / sizeof((a)[0]))
_Static_assert(COUNT_OF(group_names) == MGC_GROUP__COUNT, "group names");

const char *mgc_group_name(mgc_group_kind k) {
    return (unsigned)k < COUNT_OF(group_names) ? group_names[(unsigned)k] : "?";
}

/* ---- the grid ------------------------------------------------------------- */

/* *acc *= f when both are >= 1 and the product stays <= MGC_GRID_MAX_WORLD. */
static int mul_world(int64_t *acc, int64_t f) {
    if (f < 1 || *acc < 1 || *acc > MGC_GRID_MAX_WORLD / f) return -1;
    *acc *= f;
    return 0;
}

int mgc_grid_check(const mgc_grid *g) {
    if (!g) return -1;
    if (g->world < 1 || g->world > MGC_GRID_MAX_WORLD) return -1;
    if (g->vp < 1 || g->vp > 0xffff) return -1;
    int64_t dense = 1, expert = 1;
    if (mul_world(&dense, g->tp) || mul_world(&dense, g->cp) || mul_world(&dense, g->dp) ||
        mul_world(&dense, g->pp))
        return -1;
    if (mul_world(&expert, g->etp) || mul_world(&expert, g->ep) || mul_world(&expert, g->edp) ||
        mul_world(&expert, g->pp))
        return -1;
    return dense == g->world && expert == g->world ? 0 : -1;
}

/* The four digits of one grid, fastest first, and the mask of a group kind. */
typedef struct digits {
    int64_t size[4]; /* radix of each digit */
    int64_t pos[4];  /* the rank's digit */
} digits;

static void split_rank(int64_t rank, const int64_t size[4], digits *d) {
    for (int i = 0; i < 4; i++) {
        d->size[i] = size[i];
        d->pos[i] = rank % size[i];
        rank /= size[i];
    }
}

enum { D_TP = 1, D_CP = 2, D_DP = 4, D_PP = 8 };   /* dense digits */
enum { E_ETP = 1, E_EP = 2, E_EDP = 4, E_PP = 8 }; /* expert digits */

/* Which grid (0 dense, 1 expert) and which digits vary within a group of
 * kind k; -1 for EMBED (derived from PP) and out-of-range kinds. */
static int kind_mask(mgc_group_kind k, int *expert) {
    *expert = 0;
    switch (k) {
    case MGC_GROUP_TP:
        return D_TP;
    case MGC_GROUP_CP:
        return D_CP;
    case MGC_GROUP_DP:
        return D_DP;
    case MGC_GROUP_PP:
        return D_PP;
    case MGC_GROUP_DPCP:
        return D_CP | D_DP;
    case MGC_GROUP_TPCP:
        return D_TP | D_CP;
    case MGC_GROUP_EP:
        *expert = 1;
        return E_EP;
    case MGC_GROUP_ETP:
        *expert = 1;
        return E_ETP;
    case MGC_GROUP_EDP:
        *expert = 1;
        return E_EDP;
    case MGC_GROUP_WORLD:
        return D_TP | D_CP | D_DP | D_PP;
    default:
        return -1;
    }
}

/* The rank's digits in the grid kind k lives on; the mask, or -1. */
static int locate(const mgc_grid *g, mgc_group_kind k, int64_t rank, digits *d) {
    int expert = 0;
    int mask = kind_mask(k, &expert);
    if (mask < 0) return -1;
    const int64_t dense[4] = {g->tp, g->cp, g->dp, g->pp};
    const int64_t expt[4] = {g->etp, g->ep, g->edp, g->pp};
    split_rank(rank, expert ? expt : dense, d);
    return mask;
}

/* Mixed-radix value of the digits selected by `mask` (fastest first). */
static int64_t digit_value(const digits *d, int mask) {
    int64_t v = 0, stride = 1;
    for (int i = 0; i < 4; i++) {
        if (!(mask & (1 << i))) continue;
        v += d->pos[i] * stride;
        stride *= d->size[i];
    }
    return v;
}

static int64_t digit_count(const digits *d, int mask) {
    int64_t n = 1;
    for (int i = 0; i < 4; i++)
        if (mask & (1 << i)) n *= d->size[i];
    return n;
}

static int valid_rank(const mgc_grid *g, int64_t rank) {
    return mgc_grid_check(g) == 0 && rank >= 0 && rank < g->world;
}

int mgc_grid_coords(const mgc_grid *g, int64_t rank, mgc_coords *out) {
    if (!out || !valid_rank(g, rank)) return -1;
    const int64_t dense[4] = {g->tp, g->cp, g->dp, g->pp};
    const int64_t expt[4] = {g->etp, g->ep, g->edp, g->pp};
    digits d, e;
    split_rank(rank, dense, &d);
    split_rank(rank, expt, &e);
    out->tp = d.pos[0];
    out->cp = d.pos[1];
    out->dp = d.pos[2];
    out->pp = d.pos[3];
    out->etp = e.pos[0];
    out->ep = e.pos[1];
    out->edp = e.pos[2];
    return 0;
}

static int64_t compose(const int64_t size[4], const int64_t pos[4]) {
    int64_t r = 0;
    for (int i = 3; i >= 0; i--) {
        if (pos[i] < 0 || pos[i] >= size[i]) return -1;
        r = r * size[i] + pos[i];
    }
    return r;
}

int64_t mgc_grid_rank(const mgc_grid *g, const mgc_coords *c) {
    if (!c || mgc_grid_check(g) != 0) return -1;
    const int64_t size[4] = {g->tp, g->cp, g->dp, g->pp};
    const int64_t pos[4] = {c->tp, c->cp, c->dp, c->pp};
    return compose(size, pos);
}

int64_t mgc_grid_rank_expert(const mgc_grid *g, const mgc_coords *c) {
    if (!c || mgc_grid_check(g) != 0) return -1;
    const int64_t size[4] = {g->etp, g->ep, g->edp, g->pp};
    const int64_t pos[4] = {c->etp, c->ep, c->edp, c->pp};
    return compose(size, pos);
}

/* ---- groups --------------------------------------------------------------- */

/* EMBED is derived from the rank's pipeline group: its first and last member
 * (Megatron's embedding group), or the rank alone when pp == 1.  Sets *pos to
 * the rank's index in it, -1 when the rank is on a middle stage. */
static int64_t embed_members(const mgc_grid *g, int64_t rank, int64_t m[2], int64_t *pos) {
    int64_t stage_stride = g->world / g->pp; /* ranks per pipeline stage */
    int64_t stage = rank / stage_stride;
    int64_t first = rank % stage_stride;
    if (g->pp == 1) {
        m[0] = rank;
        *pos = 0;
        return 1;
    }
    m[0] = first;
    m[1] = first + (g->pp - 1) * stage_stride;
    *pos = stage == 0 ? 0 : stage == g->pp - 1 ? 1 : -1;
    return 2;
}

int64_t mgc_grid_group(const mgc_grid *g, mgc_group_kind k, int64_t rank, int64_t *members,
                       int64_t max) {
    if (!valid_rank(g, rank) || max < 0 || (max > 0 && !members)) return -1;
    if (k == MGC_GROUP_EMBED) {
        int64_t m[2], pos;
        int64_t n = embed_members(g, rank, m, &pos);
        if (pos < 0) return 0;
        for (int64_t i = 0; i < n && i < max; i++)
            members[i] = m[i];
        return n;
    }
    digits d;
    int mask = locate(g, k, rank, &d);
    if (mask < 0) return -1;
    int64_t n = digit_count(&d, mask);
    /* count through the masked digits like an odometer, fastest first */
    int64_t stride[4], s = 1;
    for (int i = 0; i < 4; i++) {
        stride[i] = s;
        s *= d.size[i];
    }
    int64_t base = rank;
    for (int i = 0; i < 4; i++)
        if (mask & (1 << i)) base -= d.pos[i] * stride[i];
    int64_t idx[4] = {0, 0, 0, 0};
    for (int64_t j = 0; j < n && j < max; j++) {
        int64_t r = base;
        for (int i = 0; i < 4; i++)
            r += idx[i] * stride[i];
        members[j] = r;
        for (int i = 0; i < 4; i++) {
            if (!(mask & (1 << i))) continue;
            if (++idx[i] < d.size[i]) break;
            idx[i] = 0;
        }
    }
    return n;
}

int64_t mgc_grid_group_rank(const mgc_grid *g, mgc_group_kind k, int64_t rank) {
    if (!valid_rank(g, rank)) return -1;
    if (k == MGC_GROUP_EMBED) {
        int64_t m[2], pos;
        embed_members(g, rank, m, &pos);
        return pos;
    }
    digits d;
    int mask = locate(g, k, rank, &d);
    return mask < 0 ? -1 : digit_value(&d, mask);
}

int64_t mgc_grid_group_id(const mgc_grid *g, mgc_group_kind k, int64_t rank) {
    if (!valid_rank(g, rank)) return -1;
    if (k == MGC_GROUP_EMBED) {
        int64_t m[2], pos;
        embed_members(g, rank, m, &pos);
        return pos < 0 ? -1 : rank % (g->world / g->pp); /* = its pipeline group's id */
    }
    digits d;
    int mask = locate(g, k, rank, &d);
    return mask < 0 ? -1 : digit_value(&d, ~mask & 15);
}

int64_t mgc_grid_group_count(const mgc_grid *g, mgc_group_kind k) {
    if (mgc_grid_check(g) != 0) return -1;
    if (k == MGC_GROUP_EMBED) return g->world / g->pp;
    digits d;
    int mask = locate(g, k, 0, &d);
    return mask < 0 ? -1 : g->world / digit_count(&d, mask);
}

uint64_t mgc_fold_round(uint64_t count, int64_t group, uint64_t es, int scatter) {
    if (count == 0 || group < 1 || es == 0) return 0;
    uint64_t G = (uint64_t)group;
    /* an all-reduce's slices are whole 8-element vectors, so every slice starts 16-byte aligned */
    uint64_t slice = scatter ? count : ((count + G - 1) / G + 7) / 8 * 8;
    uint64_t cap = MGC_FOLD_ROUND_BYTES / (G * es);
    cap = cap >= 8 ? cap / 8 * 8 : cap < 1 ? 1 : cap;
    return slice < cap ? slice : cap;
}

uint64_t mgc_fold_scratch_bytes(uint64_t count, int64_t group, uint64_t es, int scatter) {
    uint64_t r = mgc_fold_round(count, group, es, scatter);
    return (r + 7) / 8 * 8 * (uint64_t)(group > 0 ? group : 0) * es; /* parts 8-element aligned */
}
