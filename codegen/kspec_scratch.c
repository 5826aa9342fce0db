/* kspec_scratch.c - the device scratch of each op's CUDA launchers (kspec.h): what
 * runtime/cuda_backend.c and runtime/cuda_ops_*.c ask mgc_cuda_scratch for, as functions of
 * the plan's shapes only, so that the memory plan can give it a buffer of the arena.
 * Each case names the launcher whose request it bounds; a request it does not bound still
 * runs (the backend then allocates beside the arena and says so), so keep them in step. */
#include "kspec.h"

uint64_t mgc_kspec_align(uint64_t bytes) {
    return (bytes + 255) & ~(uint64_t)255;
}

uint64_t mgc_kspec_moe_map_bytes(int64_t nk, int64_t E, int64_t cap, int probs) {
    int64_t ntiles = (nk + MGC_KSPEC_MOE_TILE - 1) / MGC_KSPEC_MOE_TILE;
    uint64_t b = 2 * mgc_kspec_align((uint64_t)(ntiles * E) * 4) + mgc_kspec_align((uint64_t)E * 4) +
                 mgc_kspec_align((uint64_t)(E + 1) * 4) + mgc_kspec_align((uint64_t)nk * 4);
    if (cap > 0 && probs) b += mgc_kspec_align((uint64_t)nk * 4) + mgc_kspec_align((uint64_t)nk);
    return b;
}

int64_t mgc_kspec_bias_grad_parts(int64_t M, int64_t *rows) {
    int64_t P = M > 0 ? (M + 31) / 32 : 1;
    if (P > MGC_KSPEC_BGRAD_PARTS) P = MGC_KSPEC_BGRAD_PARTS;
    int64_t rp = M > 0 ? (M + P - 1) / P : 8;
    rp = (rp + 7) / 8 * 8;
    *rows = rp;
    return M > 0 ? (M + rp - 1) / rp : 1;
}

uint64_t mgc_kspec_att_cs_bytes(int64_t s, int64_t b, int64_t width) {
    if (s <= 0 || b <= 0 || width <= 0) return 0;
    return (uint64_t)(b * ((s + MGC_KSPEC_ATT_CS_ROWS - 1) / MGC_KSPEC_ATT_CS_ROWS)) *
           (uint64_t)width * 4;
}

int64_t mgc_kspec_emb_sort_tiles(int64_t n, int64_t *per) {
    const int64_t most = 256 * (int64_t)MGC_KSPEC_EMB_SORT_TILES; /* keys of a round of tiles */
    int64_t p = n > most ? (n + most - 1) / most : 1;
    *per = p;
    return n > 0 ? (n + 256 * p - 1) / (256 * p) : 1;
}

uint64_t mgc_kspec_emb_sort_bytes(int64_t n, int64_t h) {
    uint64_t nn = n > 0 ? (uint64_t)n : 0, hh = h > 0 ? (uint64_t)h : 0;
    int64_t per;
    uint64_t tiles = (uint64_t)mgc_kspec_emb_sort_tiles(n, &per);
    uint64_t segs = (nn + MGC_KSPEC_EMB_SEG - 1) / MGC_KSPEC_EMB_SEG;
    return 2 * mgc_kspec_align(nn * 8) + mgc_kspec_align(tiles * 256 * 4) + segs * hh * 4;
}

uint64_t mgc_kspec_optimizer_scratch_bytes(void) {
    return (MGC_KSPEC_SUMSQ_NB + 1) * 8; /* cuda_ops_pointwise.c mgc_cuda_sumsq */
}

static int64_t numel(const mgc_plan_tensor *t) {
    int64_t n = 1;
    for (int i = 0; i < t->rank; i++) n *= t->dim[i];
    return n;
}
static int64_t last_dim(const mgc_plan_tensor *t) {
    return t->rank > 0 ? t->dim[t->rank - 1] : 0;
}
static const mgc_plan_tensor *T(const mgc_plan_chunk *ch, int32_t i) {
    static const mgc_plan_tensor none;
    return i >= 0 && i < ch->n_tensors ? &ch->tensors[i] : &none;
}
static uint64_t nonneg(int64_t v) {
    return v > 0 ? (uint64_t)v : 0;
}

/* cuda_ops_moe.c sort_rows: offsets of (chunk, local expert) blocks */
static uint64_t moe_sort_bytes(const mgc_plan_op *op) {
    uint64_t nb = nonneg(op->iattr[1]) * nonneg(op->iattr[2]);
    return mgc_kspec_align(nb * 8) + mgc_kspec_align((nb + 1) * 8);
}

uint64_t mgc_kspec_op_scratch_bytes(const mgc_plan_chunk *ch, const mgc_plan_op *op) {
    if (op->n_in < 1 && op->n_out < 1) return 0;
    const mgc_plan_tensor *in0 = T(ch, op->n_in > 0 ? op->in[0] : -1);
    switch ((mgc_plan_op_kind)op->kind) {
    case MGC_POP_LINEAR_WGRAD: /* cuda_ops_linear.c: bias_grad's partials (BGRADB's column
                                  sums are fewer) */
    case MGC_POP_LINEAR_DGRAD_GELU: { /* the same for dh's (MGC_POF_COLSUM; DGELU_BGRAD's) */
        if (op->n_out < 2) return 0;
        int64_t RP;
        uint64_t M = nonneg(op->iattr[0]),
                 N = nonneg(op->iattr[op->kind == MGC_POP_LINEAR_WGRAD ? 1 : 2]);
        return (uint64_t)mgc_kspec_bias_grad_parts((int64_t)M, &RP) * N * 4;
    }
    case MGC_POP_GROUPED_LINEAR_WGRAD: { /* cuda_ops_linear.c op_grouped: an expert's bias
                                            gradient at a time, its rows data dependent */
        if (op->n_out < 2) return 0;
        return (uint64_t)MGC_KSPEC_BGRAD_PARTS * nonneg(last_dim(T(ch, op->out[1]))) * 4;
    }
    case MGC_POP_ATTENTION: /* cuda_ops_attention.c: lse when the plan keeps none */
    case MGC_POP_ATTENTION_BWD: { /* dsum, a float a query row (of every head); with the
                                      fused bias gradient its partials (mgc_kspec_att_cs_bytes),
                                      or in fp32 the bias-gradient kernels' */
        mgc_attn_geom g;
        if (mgc_plan_attn_geom(ch, op, &g)) return 0;
        if (op->kind == MGC_POP_ATTENTION && op->n_out > 1) return 0;
        uint64_t dsum = nonneg(g.sq) * nonneg(g.b) * nonneg(g.A) * 4;
        if (op->kind != MGC_POP_ATTENTION_BWD || !(op->flags & MGC_POF_COLSUM) || op->n_out < 2)
            return dsum;
        int64_t RP, M = g.sq * g.b, N = (g.A + 2 * g.G) * g.d;
        if (mgc_kspec_att_colsum(op, ch->tensors[op->in[0]].dtype))
            return mgc_kspec_align(dsum) + mgc_kspec_att_cs_bytes(g.sq, g.b, N);
        uint64_t bg = (uint64_t)mgc_kspec_bias_grad_parts(M, &RP) * nonneg(N) * 4;
        return dsum > bg ? dsum : bg;
    }
    case MGC_POP_NORM_BWD: { /* cuda_ops_pointwise.c op_norm: dw (, db, dx's column sums)
                                 partials */
        uint64_t rows = nonneg(op->iattr[1]), h = nonneg(op->iattr[2]);
        uint64_t nb = rows < MGC_KSPEC_NORM_NB ? rows : MGC_KSPEC_NORM_NB;
        return nb * h * (uint64_t)mgc_plan_norm_bwd_sets(op) * 4;
    }
    case MGC_POP_EMBEDDING_BWD: { /* cuda_ops_pointwise.c op_embedding: the sort keys, then
                                      a row of fp32 partials a segment of them */
        uint64_t n = nonneg(in0->dim[0]) * (in0->rank > 1 ? nonneg(in0->dim[1]) : 1);
        const mgc_plan_tensor *dy = T(ch, op->n_in > 1 ? op->in[1] : -1);
        /* the word rows' sort, and under documents the position rows' (learned positions:
         * a second output), one after the other */
        if (op->iattr[0] <= 0 && !(op->n_out > 1 && (op->flags & MGC_POF_DOCS))) return 0;
        return mgc_kspec_emb_sort_bytes((int64_t)n, last_dim(dy));
    }
    case MGC_POP_CROSS_ENTROPY: { /* op_cross_entropy, the fused path: max and sums per row */
        uint64_t n = op->n_in > 1 ? (uint64_t)numel(T(ch, op->in[1])) : 0;
        return (n > 0 ? n : 1) * 3 * 4;
    }
    case MGC_POP_CROSS_ENTROPY_BWD: { /* the statistics fused in (MGC_POF_CE_STATS): the same */
        if (!(op->flags & MGC_POF_CE_STATS) || op->n_in < 2) return 0;
        uint64_t n = (uint64_t)numel(T(ch, op->in[1]));
        return (n > 0 ? n : 1) * 3 * 4;
    }
    case MGC_POP_MOE_ROUTE: { /* cuda_ops_moe.c route: z (or aux) partials, the count map */
        int64_t E = op->iattr[1], K = op->iattr[2];
        int64_t n = E > 0 ? numel(in0) / E : 0;
        uint64_t part = mgc_kspec_align((uint64_t)(n > 0 ? n : 1) * 4);
        if (op->iattr[0] == 1) return part;
        return part + mgc_kspec_moe_map_bytes(n * K, E, 0, 0);
    }
    case MGC_POP_MOE_DISPATCH:
    case MGC_POP_MOE_DISPATCH_BWD:
    case MGC_POP_MOE_COMBINE:
    case MGC_POP_MOE_COMBINE_BWD: { /* cuda_ops_moe.c: sort_rows, or the dispatch map */
        int dispatch = op->kind == MGC_POP_MOE_DISPATCH || op->kind == MGC_POP_MOE_DISPATCH_BWD;
        int sort = dispatch ? op->iattr[0] != 0 : op->iattr[0] == 0;
        if (sort) return moe_sort_bytes(op);
        int64_t E = op->iattr[1], n, K, cap;
        if (dispatch) { /* in: x | drows, ids (n, K), probs */
            const mgc_plan_tensor *ids = T(ch, op->n_in > 1 ? op->in[1] : -1);
            n = ids->dim[0], K = ids->dim[1], cap = op->iattr[2];
        } else { /* y (combine) or dy (combine_bwd): (n, h) */
            const mgc_plan_tensor *y = op->kind == MGC_POP_MOE_COMBINE ? T(ch, op->out[0]) : in0;
            int64_t h = last_dim(y);
            n = h > 0 ? numel(y) / h : 0, K = op->iattr[2], cap = op->iattr[3];
        }
        /* capacity by probability or not is the run's moe.drop_policy: the larger */
        return mgc_kspec_moe_map_bytes(n * K, E, cap, 1);
    }
    default:
        return 0;
    }
}
