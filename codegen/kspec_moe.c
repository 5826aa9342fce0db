/* kspec_moe.c - the kernels of the mixture-of-experts ops (kernels/moe.cuh).
 *
 * Specs per op, in first-launch order (runtime/cuda_ops_moe.c finds them by
 * entry and may launch a spec more than once: the dispatch map's second pass
 * with the "probs" drop policy):
 *
 *   moe_route      phase 0   moe_route_fwd{E,K[,G,GK]}, [moe_sum if a z-loss output],
 *                            [moe_map_hist, moe_map_scan if a counts output (E); moe_col_counts
 *                            if (C, E): the sequence-wise aux loss's]
 *                  phase 1   moe_aux_part{E}, moe_sum
 *   moe_route_bwd            moe_route_bwd{E,K}
 *   moe_dispatch   phase 0   map, moe_permute{H,K}
 *                  phase 1   moe_sort_offsets, moe_sort_rows{H}          (.sort)
 *   moe_dispatch_bwd 0 / 1   map, moe_permute_bwd{H,K} / the sort's two
 *   moe_combine    phase 0   moe_sort_offsets, moe_sort_rows{H}          (.unsort)
 *                  phase 1   map, moe_combine{H,K}
 *   moe_combine_bwd 0 / 1    the sort's two / map, moe_combine_bwd{H,K}
 *
 * where map = moe_map_hist, moe_map_scan, moe_map_scatter, and moe_map_rank
 * when the op has a capacity (the drop policy of the combine ops is the
 * model's, a run-time value, so the rank kernel is there for either policy).
 * The router, permute, combine and sort kernels take the storage dtype of
 * their activations; the map, sum and offset kernels touch no activation and
 * are always compiled as f32 (one cubin for every plan). */
#include <stdint.h>

#include "kspec.h"

static const mgc_plan_tensor *tin(const mgc_plan_chunk *ch, const mgc_plan_op *op, int i) {
    return i < op->n_in && op->in[i] >= 0 && op->in[i] < ch->n_tensors ? &ch->tensors[op->in[i]]
                                                                       : NULL;
}
static const mgc_plan_tensor *tout(const mgc_plan_chunk *ch, const mgc_plan_op *op, int i) {
    return i < op->n_out && op->out[i] >= 0 && op->out[i] < ch->n_tensors ? &ch->tensors[op->out[i]]
                                                                          : NULL;
}

/* The storage dtype (fp32, bf16, fp16), -1 another dtype (or no tensor). */
static int storage(const mgc_plan_tensor *t) {
    return t ? mgc_kspec_storage(t->dtype) : -1;
}

static int64_t last_dim(const mgc_plan_tensor *t) {
    return t && t->rank > 0 ? t->dim[t->rank - 1] : 0;
}

typedef struct list {
    mgc_kspec *out;
    int n, max, bad;
} list;

static mgc_kspec *add(list *l, const char *entry, int dtype) {
    if (l->n >= l->max || dtype < 0) {
        l->bad = 1;
        return NULL;
    }
    mgc_kspec *k = &l->out[l->n++];
    mgc_kspec_init(k, "moe.cuh", entry, dtype);
    return k;
}

static void add_c(list *l, const char *entry, int dtype, const char *c0, int64_t v0, const char *c1,
                  int64_t v1) {
    mgc_kspec *k = add(l, entry, dtype);
    if (!k) return;
    if (c0) mgc_kspec_const(k, c0, v0);
    if (c1) mgc_kspec_const(k, c1, v1);
}

static void add_map(list *l, int64_t capacity, int64_t E) {
    if (E < 1 || E > 1536) l->bad = 1; /* 8 E ints of shared memory per map block */
    add(l, "moe_map_hist", 0);
    add(l, "moe_map_scan", 0);
    add(l, "moe_map_scatter", 0);
    if (capacity > 0) add(l, "moe_map_rank", 0);
}

static void add_sort(list *l, const mgc_plan_tensor *x) {
    int64_t H = x && x->rank == 2 ? x->dim[1] : 0;
    if (H < 1) l->bad = 1;
    add(l, "moe_sort_offsets", 0);
    add_c(l, "moe_sort_rows", storage(x), "H", H, NULL, 0);
}

int mgc_kspec_router_ok(int64_t E, int64_t K) {
    return E >= 1 && E <= 1024 && K >= 1 && K <= E && K <= 64;
}

int mgc_kspecs_moe(const mgc_plan *p, const mgc_plan_chunk *ch, const mgc_plan_op *op,
                   mgc_kspec *out, int max) {
    (void)p;
    list l = {out, 0, max, 0};
    int phase = (int)op->iattr[0];
    switch ((mgc_plan_op_kind)op->kind) {
    case MGC_POP_MOE_ROUTE: {
        const mgc_plan_tensor *lg = tin(ch, op, 0);
        int64_t E = op->iattr[1], K = op->iattr[2];
        if (!lg || !mgc_kspec_router_ok(E, K)) return -1;
        if (phase == 1) {
            add_c(&l, "moe_aux_part", storage(lg), "E", E, NULL, 0);
            add(&l, "moe_sum", 0);
            break;
        }
        add_c(&l, "moe_route_fwd", storage(lg), "E", E, "K", K);
        int64_t G = MGC_ROUTE_GROUPS(op->iattr[3]), GK = MGC_ROUTE_GROUP_TOPK(op->iattr[3]);
        if (G > 0 && l.n > 0 && !l.bad) { /* group-limited routing */
            if (G > 1024 || E % G || GK < 1 || GK > G || GK > K) return -1;
            mgc_kspec_const(&l.out[l.n - 1], "G", G);
            mgc_kspec_const(&l.out[l.n - 1], "GK", GK);
        }
        int z = 0, counts = 0, per_seq = 0;
        for (int i = 2; i < op->n_out; i++) {
            const mgc_plan_tensor *t = tout(ch, op, i);
            if (!t) return -1;
            if (t->dtype == MGC_DT_F32)
                z = 1;
            else
                counts = 1, per_seq = t->rank == 2; /* the sequence-wise aux loss's (C, E) */
        }
        if (z) add(&l, "moe_sum", 0);
        if (counts && per_seq) {
            add(&l, "moe_col_counts", 0);
        } else if (counts) {
            add(&l, "moe_map_hist", 0);
            add(&l, "moe_map_scan", 0);
        }
        break;
    }
    case MGC_POP_MOE_ROUTE_BWD: { /* specialised on the gradient's storage; LF32: fp32 logits */
        const mgc_plan_tensor *lg = tin(ch, op, 0), *dlg = tout(ch, op, 0);
        int64_t E = op->iattr[1], K = op->iattr[2];
        if (!lg || !dlg || !mgc_kspec_router_ok(E, K)) return -1;
        int lf32 = storage(lg) != storage(dlg);
        if (lf32 && storage(lg) != MGC_DT_F32) return -1;
        add_c(&l, "moe_route_bwd", storage(dlg), "E", E, "K", K);
        if (lf32 && l.n > 0 && !l.bad) mgc_kspec_const(&l.out[l.n - 1], "LF32", 1);
        break;
    }
    case MGC_POP_MOE_DISPATCH: {
        if (phase != 0) {
            add_sort(&l, tin(ch, op, 0));
            break;
        }
        const mgc_plan_tensor *x = tin(ch, op, 0), *ids = tin(ch, op, 1);
        if (!x || !ids || ids->rank != 2) return -1;
        add_map(&l, op->iattr[2], op->iattr[1]);
        add_c(&l, "moe_permute", storage(x), "H", last_dim(x), "K", ids->dim[1]);
        break;
    }
    case MGC_POP_MOE_DISPATCH_BWD: {
        if (phase != 0) {
            add_sort(&l, tin(ch, op, 0));
            break;
        }
        const mgc_plan_tensor *dx = tout(ch, op, 0), *ids = tin(ch, op, 1);
        if (!dx || !ids || ids->rank != 2) return -1;
        add_map(&l, op->iattr[2], op->iattr[1]);
        add_c(&l, "moe_permute_bwd", storage(dx), "H", last_dim(dx), "K", ids->dim[1]);
        break;
    }
    case MGC_POP_MOE_COMBINE: {
        if (phase == 0) {
            add_sort(&l, tin(ch, op, 0));
            break;
        }
        const mgc_plan_tensor *y = tout(ch, op, 0);
        if (!y) return -1;
        add_map(&l, op->iattr[3], op->iattr[1]);
        add_c(&l, "moe_combine", storage(y), "H", last_dim(y), "K", op->iattr[2]);
        break;
    }
    case MGC_POP_MOE_COMBINE_BWD: {
        if (phase == 0) {
            add_sort(&l, tin(ch, op, 0));
            break;
        }
        const mgc_plan_tensor *dy = tin(ch, op, 0);
        if (!dy) return -1;
        add_map(&l, op->iattr[3], op->iattr[1]);
        add_c(&l, "moe_combine_bwd", storage(dy), "H", last_dim(dy), "K", op->iattr[2]);
        break;
    }
    default:
        return 0; /* not a MoE op (the grouped GEMMs are not kernels of this family) */
    }
    if (l.bad) return -1;
    /* shapes the row kernels take as constants */
    for (int i = 0; i < l.n; i++)
        for (int c = 0; c < out[i].n_const; c++)
            if (out[i].const_val[c] < 1) return -1;
    return l.n;
}
