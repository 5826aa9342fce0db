/* test_grid.c - the rank grid and process groups (plan/grid.c) against
 * Megatron's ordering, rebuilt here independently: for each group kind, the
 * enumeration Megatron's RankGenerator does (the ranks that differ only in the
 * kind's dimensions, groups listed with the other dimensions fastest first),
 * plus literal tables for the worked examples of docs/process-groups.md. */
#include "plan.h"
#include "testlib.h"

#include <stdlib.h>

/* ---- the reference enumeration ------------------------------------------ */

/* All groups over the mixed-radix grid `size[0..4)` (fastest first) whose
 * members vary in the dimensions of `mask`: groups[g * gsize + j] is member j
 * of group g.  Returns the number of groups; *gsize gets the group size. */
static int64_t enumerate(const int64_t size[4], int mask, int64_t **groups, int64_t *gsize) {
    int64_t stride[4], world = 1;
    for (int i = 0; i < 4; i++) {
        stride[i] = world;
        world *= size[i];
    }
    int64_t in_size[4], in_stride[4], out_size[4], out_stride[4];
    int n_in = 0, n_out = 0;
    for (int i = 0; i < 4; i++) {
        if (mask & (1 << i)) {
            in_size[n_in] = size[i];
            in_stride[n_in++] = stride[i];
        } else {
            out_size[n_out] = size[i];
            out_stride[n_out++] = stride[i];
        }
    }
    int64_t gs = 1, ng = 1;
    for (int i = 0; i < n_in; i++)
        gs *= in_size[i];
    for (int i = 0; i < n_out; i++)
        ng *= out_size[i];
    *groups = malloc((size_t)(gs * ng) * sizeof **groups);
    for (int64_t g = 0; g < ng; g++) {
        int64_t base = 0, rest = g; /* decompose g over the other dimensions */
        for (int i = 0; i < n_out; i++) {
            base += (rest % out_size[i]) * out_stride[i];
            rest /= out_size[i];
        }
        for (int64_t j = 0; j < gs; j++) {
            int64_t r = base, rj = j; /* decompose j over the group's dimensions */
            for (int i = 0; i < n_in; i++) {
                r += (rj % in_size[i]) * in_stride[i];
                rj /= in_size[i];
            }
            (*groups)[g * gs + j] = r;
        }
    }
    *gsize = gs;
    return ng;
}

/* Compare every group of kind k with the reference groups. */
static void check_kind(const mgc_grid *g, mgc_group_kind k, const int64_t *ref, int64_t ng,
                       int64_t gs) {
    int64_t *buf = malloc((size_t)(gs + 1) * sizeof *buf);
    int *seen = calloc((size_t)g->world, sizeof *seen);
    T_EQ_I64(mgc_grid_group_count(g, k), ng);
    int bad = 0;
    for (int64_t gi = 0; gi < ng; gi++) {
        for (int64_t j = 0; j < gs; j++) {
            int64_t r = ref[gi * gs + j];
            seen[r]++;
            int64_t n = mgc_grid_group(g, k, r, buf, gs + 1);
            if (n != gs || memcmp(buf, &ref[gi * gs], (size_t)gs * sizeof *buf) != 0 ||
                mgc_grid_group_rank(g, k, r) != j || mgc_grid_group_id(g, k, r) != gi) {
                if (bad++ < 3)
                    fprintf(stderr,
                            "%s group %" PRId64 " member %" PRId64 " (rank %" PRId64 ") differs\n",
                            mgc_group_name(k), gi, j, r);
            }
        }
    }
    T_EQ_I64(bad, 0);
    int64_t covered = 0; /* every rank in exactly one group of this kind */
    for (int64_t r = 0; r < g->world; r++)
        covered += seen[r] == 1;
    T_EQ_I64(covered, k != MGC_GROUP_EMBED || g->pp == 1 ? g->world : 2 * (g->world / g->pp));
    free(buf);
    free(seen);
}

/* Every group kind of grid g against the reference enumeration. */
static void check_grid(const char *label, mgc_grid g) {
    fprintf(stderr, "grid %s\n", label);
    T_EQ_I64(mgc_grid_check(&g), 0);
    const int64_t dense[4] = {g.tp, g.cp, g.dp, g.pp};
    const int64_t expert[4] = {g.etp, g.ep, g.edp, g.pp};
    static const struct {
        mgc_group_kind k;
        int expert;
        int mask; /* bits: 0 tp/etp, 1 cp/ep, 2 dp/edp, 3 pp */
    } kinds[] = {
        {MGC_GROUP_TP, 0, 1},     {MGC_GROUP_CP, 0, 2},   {MGC_GROUP_DP, 0, 4},
        {MGC_GROUP_PP, 0, 8},     {MGC_GROUP_DPCP, 0, 6}, {MGC_GROUP_TPCP, 0, 3},
        {MGC_GROUP_ETP, 1, 1},    {MGC_GROUP_EP, 1, 2},   {MGC_GROUP_EDP, 1, 4},
        {MGC_GROUP_WORLD, 0, 15},
    };
    for (size_t i = 0; i < sizeof kinds / sizeof kinds[0]; i++) {
        int64_t *ref, gs;
        int64_t ng = enumerate(kinds[i].expert ? expert : dense, kinds[i].mask, &ref, &gs);
        check_kind(&g, kinds[i].k, ref, ng, gs);
        free(ref);
    }

    /* the expert grid folds over the same pipeline groups (Megatron asserts it) */
    int64_t *pp_dense, *pp_expert, gs1, gs2;
    int64_t n1 = enumerate(dense, 8, &pp_dense, &gs1);
    int64_t n2 = enumerate(expert, 8, &pp_expert, &gs2);
    T_CHECK(n1 == n2 && gs1 == gs2 &&
            memcmp(pp_dense, pp_expert, (size_t)(n1 * gs1) * sizeof(int64_t)) == 0);

    /* EMBED: first and last member of each pipeline group; the rank alone when pp == 1 */
    int64_t emb_gs = g.pp > 1 ? 2 : 1;
    int64_t *emb = malloc((size_t)(n1 * emb_gs) * sizeof *emb);
    for (int64_t i = 0; i < n1; i++) {
        emb[i * emb_gs] = pp_dense[i * gs1];
        if (emb_gs == 2) emb[i * emb_gs + 1] = pp_dense[i * gs1 + gs1 - 1];
    }
    check_kind(&g, MGC_GROUP_EMBED, emb, n1, emb_gs);
    int64_t middle = 0, none = 0;
    for (int64_t r = 0; r < g.world; r++) {
        mgc_coords c;
        mgc_grid_coords(&g, r, &c);
        if (c.pp == 0 || c.pp == g.pp - 1) continue;
        middle++;
        int64_t m[2] = {-7, -7};
        none += mgc_grid_group(&g, MGC_GROUP_EMBED, r, m, 2) == 0 && m[0] == -7 &&
                mgc_grid_group_rank(&g, MGC_GROUP_EMBED, r) == -1 &&
                mgc_grid_group_id(&g, MGC_GROUP_EMBED, r) == -1;
    }
    T_EQ_I64(none, middle);
    T_EQ_I64(middle, g.pp > 2 ? (g.pp - 2) * (g.world / g.pp) : 0);
    free(emb);
    free(pp_dense);
    free(pp_expert);

    /* coordinates: the mixed-radix digits, and back */
    int64_t ok = 0;
    for (int64_t r = 0; r < g.world; r++) {
        mgc_coords c;
        int64_t per_stage = g.world / g.pp;
        int rc = mgc_grid_coords(&g, r, &c);
        ok += rc == 0 && c.tp == r % g.tp && c.cp == (r / g.tp) % g.cp &&
              c.dp == (r / (g.tp * g.cp)) % g.dp && c.pp == r / per_stage && c.etp == r % g.etp &&
              c.ep == (r / g.etp) % g.ep && c.edp == (r / (g.etp * g.ep)) % g.edp &&
              mgc_grid_rank(&g, &c) == r && mgc_grid_rank_expert(&g, &c) == r;
    }
    T_EQ_I64(ok, g.world);
}

/* One group as a literal: the members of `rank`'s group of kind k. */
static void expect_group(const mgc_grid *g, mgc_group_kind k, int64_t rank, const int64_t *want,
                         int64_t n) {
    int64_t got[64];
    T_EQ_I64(mgc_grid_group(g, k, rank, got, 64), n);
    T_CHECK(memcmp(got, want, (size_t)n * sizeof *got) == 0);
}

#define GROUP(g, k, rank, ...)                                                                     \
    do {                                                                                           \
        const int64_t w_[] = {__VA_ARGS__};                                                        \
        expect_group(g, k, rank, w_, (int64_t)(sizeof w_ / sizeof w_[0]));                         \
    } while (0)

int main(void) {
    /* ---- the worked examples of docs/process-groups.md, literally ---- */
    /* Megatron's own docstring example: 16 ranks, tp 2, dp 2, pp 4 */
    mgc_grid g16 = {
        .world = 16, .tp = 2, .cp = 1, .dp = 2, .pp = 4, .vp = 1, .etp = 1, .ep = 4, .edp = 1};
    T_EQ_I64(mgc_grid_check(&g16), 0);
    for (int64_t r = 0; r < 16; r += 2)
        GROUP(&g16, MGC_GROUP_TP, r + 1, r, r + 1);
    GROUP(&g16, MGC_GROUP_DP, 0, 0, 2);
    GROUP(&g16, MGC_GROUP_DP, 3, 1, 3);
    GROUP(&g16, MGC_GROUP_DP, 13, 13, 15);
    GROUP(&g16, MGC_GROUP_PP, 9, 1, 5, 9, 13);
    GROUP(&g16, MGC_GROUP_PP, 14, 2, 6, 10, 14);
    GROUP(&g16, MGC_GROUP_EMBED, 3, 3, 15);
    GROUP(&g16, MGC_GROUP_EMBED, 15, 3, 15);
    T_EQ_I64(mgc_grid_group(&g16, MGC_GROUP_EMBED, 7, NULL, 0), 0);
    GROUP(&g16, MGC_GROUP_CP, 5, 5);
    GROUP(&g16, MGC_GROUP_DPCP, 5, 5, 7);
    GROUP(&g16, MGC_GROUP_TPCP, 5, 4, 5);
    GROUP(&g16, MGC_GROUP_EP, 6, 4, 5, 6, 7);
    GROUP(&g16, MGC_GROUP_ETP, 6, 6);
    GROUP(&g16, MGC_GROUP_EDP, 6, 6);
    T_EQ_I64(mgc_grid_group_rank(&g16, MGC_GROUP_PP, 9), 2);
    T_EQ_I64(mgc_grid_group_rank(&g16, MGC_GROUP_EMBED, 15), 1);
    T_EQ_I64(mgc_grid_group_id(&g16, MGC_GROUP_DP, 13), 7);
    T_EQ_I64(mgc_grid_group_id(&g16, MGC_GROUP_EP, 13), 3);
    T_EQ_I64(mgc_grid_group_count(&g16, MGC_GROUP_TP), 8);
    T_EQ_I64(mgc_grid_group_count(&g16, MGC_GROUP_EMBED), 4);
    T_EQ_I64(mgc_grid_group_count(&g16, MGC_GROUP_WORLD), 1);
    mgc_coords c;
    T_EQ_I64(mgc_grid_coords(&g16, 11, &c), 0);
    T_CHECK(c.tp == 1 && c.cp == 0 && c.dp == 1 && c.pp == 2 && c.etp == 0 && c.ep == 3 &&
            c.edp == 0);

    /* folding: 32 ranks, tp 2 cp 2 dp 4 pp 2 with ep 4 etp 1 (edp 4) */
    mgc_grid g32 = {
        .world = 32, .tp = 2, .cp = 2, .dp = 4, .pp = 2, .vp = 1, .etp = 1, .ep = 4, .edp = 4};
    GROUP(&g32, MGC_GROUP_TP, 0, 0, 1);
    GROUP(&g32, MGC_GROUP_CP, 0, 0, 2);
    GROUP(&g32, MGC_GROUP_DP, 0, 0, 4, 8, 12);
    GROUP(&g32, MGC_GROUP_DPCP, 1, 1, 3, 5, 7, 9, 11, 13, 15);
    GROUP(&g32, MGC_GROUP_TPCP, 6, 4, 5, 6, 7);
    GROUP(&g32, MGC_GROUP_PP, 5, 5, 21);
    GROUP(&g32, MGC_GROUP_EMBED, 21, 5, 21);
    GROUP(&g32, MGC_GROUP_EP, 6, 4, 5, 6, 7);
    GROUP(&g32, MGC_GROUP_EDP, 6, 2, 6, 10, 14);
    GROUP(&g32, MGC_GROUP_ETP, 6, 6);
    T_EQ_I64(mgc_grid_group_rank(&g32, MGC_GROUP_DPCP, 11), 5);

    /* ---- every kind of several grids against the enumeration ---- */
    check_grid("16 = tp2 dp2 pp4 / ep4", g16);
    check_grid("32 = tp2 cp2 dp4 pp2 / ep4 edp4", g32);
    check_grid("1", (mgc_grid){1, 1, 1, 1, 1, 1, 1, 1, 1});
    check_grid("8 = tp8 / etp2 ep4", (mgc_grid){8, 8, 1, 1, 1, 1, 2, 4, 1});
    check_grid("8 = pp8 vp3", (mgc_grid){8, 1, 1, 1, 8, 3, 1, 1, 1});
    check_grid("30 = tp3 dp5 pp2 / etp3 ep5", (mgc_grid){30, 3, 1, 5, 2, 1, 3, 5, 1});
    check_grid("24 = tp2 cp4 pp3 / etp2 ep2 edp2", (mgc_grid){24, 2, 4, 1, 3, 2, 2, 2, 2});
    check_grid("72 = tp2 cp3 dp3 pp4 / ep9 edp2", (mgc_grid){72, 2, 3, 3, 4, 2, 1, 9, 2});
    check_grid("48 = cp2 dp6 pp4 / etp2 ep6", (mgc_grid){48, 1, 2, 6, 4, 1, 2, 6, 1});

    /* ---- partial member lists, names, bad input ---- */
    int64_t two[2] = {-1, -1};
    T_EQ_I64(mgc_grid_group(&g32, MGC_GROUP_DPCP, 0, two, 2), 8);
    T_CHECK(two[0] == 0 && two[1] == 2);
    T_EQ_I64(mgc_grid_group(&g32, MGC_GROUP_WORLD, 0, NULL, 0), 32);
    T_EQ_I64(mgc_grid_group(&g32, MGC_GROUP_TP, 0, NULL, 1), -1);
    T_EQ_I64(mgc_grid_group(&g32, MGC_GROUP_TP, 32, two, 2), -1);
    T_EQ_I64(mgc_grid_group(&g32, MGC_GROUP_TP, -1, two, 2), -1);
    T_EQ_I64(mgc_grid_group(&g32, MGC_GROUP__COUNT, 0, two, 2), -1);
    T_EQ_I64(mgc_grid_group_rank(&g32, (mgc_group_kind)99, 0), -1);
    T_EQ_I64(mgc_grid_group_count(&g32, (mgc_group_kind)-1), -1);
    T_STREQ(mgc_group_name(MGC_GROUP_DPCP), "dp_cp");
    T_STREQ(mgc_group_name(MGC_GROUP_EMBED), "embed");
    T_STREQ(mgc_group_name(MGC_GROUP__COUNT), "?");
    for (int k = 0; k < MGC_GROUP__COUNT; k++)
        T_CHECK(strcmp(mgc_group_name((mgc_group_kind)k), "?") != 0);
    T_EQ_I64(mgc_grid_coords(&g32, 32, &c), -1);
    T_EQ_I64(mgc_grid_coords(&g32, 0, NULL), -1);
    mgc_coords bad = {.tp = 2};
    T_EQ_I64(mgc_grid_rank(&g32, &bad), -1);
    bad = (mgc_coords){.ep = 4};
    T_EQ_I64(mgc_grid_rank_expert(&g32, &bad), -1);
    T_EQ_I64(mgc_grid_rank(&g32, &(mgc_coords){.tp = 1, .cp = 1, .dp = 3, .pp = 1}), 31);

    mgc_grid b = g32;
    T_EQ_I64(mgc_grid_check(NULL), -1);
    b.world = 16;
    T_EQ_I64(mgc_grid_check(&b), -1); /* world != tp*cp*dp*pp */
    b = g32;
    b.edp = 2;
    T_EQ_I64(mgc_grid_check(&b), -1); /* expert grid does not tile the world */
    b = g32;
    b.vp = 0;
    T_EQ_I64(mgc_grid_check(&b), -1);
    b.vp = 65536;
    T_EQ_I64(mgc_grid_check(&b), -1);
    b = g32;
    b.tp = 0;
    T_EQ_I64(mgc_grid_check(&b), -1);
    b = (mgc_grid){-4, -2, 1, 2, 1, 1, -2, 1, 2};
    T_EQ_I64(mgc_grid_check(&b), -1); /* negatives that multiply out */
    b = (mgc_grid){INT64_MAX, INT64_MAX, 1, 1, 1, 1, INT64_MAX, 1, 1};
    T_EQ_I64(mgc_grid_check(&b), -1); /* beyond MGC_GRID_MAX_WORLD */
    b = (mgc_grid){1, 1 << 16, 1 << 16, 1 << 16, 1 << 16, 1, 1, 1, 1};
    T_EQ_I64(mgc_grid_check(&b), -1); /* the product overflows */
    T_EQ_I64(mgc_grid_group_count(&b, MGC_GROUP_TP), -1);
    T_EQ_I64(mgc_grid_group(&b, MGC_GROUP_TP, 0, two, 2), -1);
    b = (mgc_grid){MGC_GRID_MAX_WORLD, MGC_GRID_MAX_WORLD, 1, 1, 1, 1, 1, MGC_GRID_MAX_WORLD, 1};
    T_EQ_I64(mgc_grid_check(&b), 0); /* the largest world, O(1) queries */
    T_EQ_I64(mgc_grid_group_rank(&b, MGC_GROUP_EP, MGC_GRID_MAX_WORLD - 1), MGC_GRID_MAX_WORLD - 1);
    T_EQ_I64(mgc_grid_group_count(&b, MGC_GROUP_DP), MGC_GRID_MAX_WORLD);
    return t_summary("test_grid");
}
