/* cost.c - see cost.h; docs/cost-model.md explains every formula here.
 *
 * One context per plan holds what every op's cost needs (profile numbers,
 * the compute precision, the group layout of each stage), then:
 *   1. each chunk's forward and backward programs are costed once, op by op,
 *      split by class;
 *   2. the pipeline ranks' instruction streams are simulated together with
 *      those durations (schedule.h); gradient reductions cost 0 there;
 *   3. the reductions are replayed on each rank's own communication stream
 *      from when their buckets become ready, and the optimizer waits for it. */
#include "cost.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kspec.h"
#include "schedule.h"

const char *mgc_cost_class_name(mgc_cost_class c) {
    static const char *const n[] = {"gemm", "attention", "memory", "tp_comm", "p2p", "dp_comm", "optimizer"};
    return (unsigned)c < MGC_COST__COUNT ? n[c] : "?";
}

/* ---- context -------------------------------------------------------------------------- */

typedef struct layout {
    int64_t n;     /* members */
    int64_t nodes; /* distinct nodes they sit on */
    int64_t local; /* most members on one node */
    int known;
} layout;

typedef struct chunk_cost {
    double fwd_s, bwd_s;                            /* per microbatch */
    double fwd_cls[MGC_COST__COUNT], bwd_cls[MGC_COST__COUNT];
    double fwd_flops, bwd_flops;                    /* GEMM + attention FLOPs executed */
} chunk_cost;

typedef struct ctx {
    const mgc_plan *p;
    const mgc_hw *hw;
    int64_t gpn;       /* GPUs per node */
    double peak;       /* FLOP/s of the compute dtype */
    size_t dt_bytes;   /* compute dtype size */
    double gemm_ref;   /* shape factor of an 8192^3 GEMM (the profile's gemm point) */
    double act_bytes;  /* one pipeline transfer */
    layout *groups;    /* (n_stages * MGC_GROUP__COUNT) lazily filled, may be NULL */
    double routed;     /* the part of an MGC_PT_ROUTED tensor balanced routing fills (routed_part) */
} ctx;

static double routed_part(const mgc_plan *p);

static int ctx_init(ctx *c, const mgc_plan *p, const mgc_cost_options *o, int with_cache) {
    memset(c, 0, sizeof *c);
    c->p = p;
    c->hw = o->hw;
    int64_t v = 0;
    c->gpn = o->gpus_per_node > 0 ? o->gpus_per_node
             : mgc_plan_config_int(p, "hardware.gpus_per_node", &v) && v > 0 ? v
                                                                             : o->hw->gpus_per_node;
    if (c->gpn < 1) c->gpn = 1;
    int64_t prec = 1;
    if (!mgc_plan_config_int(p, "training.precision", &prec) || prec < 0 || prec > 2) prec = 1;
    c->peak = o->hw->peak_flops[prec];
    c->dt_bytes = prec == 0 ? 4 : 2;
    for (int64_t s = 0; s < p->n_stages; s++)
        for (int64_t k = 0; k < p->stages[s].n_chunks; k++)
            if ((double)p->stages[s].chunks[k].send_bytes > c->act_bytes)
                c->act_bytes = (double)p->stages[s].chunks[k].send_bytes;
    c->routed = routed_part(p);
    if (with_cache) c->groups = calloc((size_t)(p->n_stages * MGC_GROUP__COUNT), sizeof *c->groups);
    return 0;
}

/* Where the members of stage `stage`'s first rank's group of kind k sit. */
static layout group_layout(ctx *c, int64_t stage, int kind) {
    layout *slot = c->groups && stage >= 0 && stage < c->p->n_stages && kind >= 0 && kind < MGC_GROUP__COUNT
                       ? &c->groups[stage * MGC_GROUP__COUNT + kind]
                       : NULL;
    if (slot && slot->known) return *slot;
    layout L = {1, 1, 1, 1};
    mgc_coords co;
    memset(&co, 0, sizeof co);
    co.pp = stage;
    int64_t rank = mgc_grid_rank(&c->p->grid, &co);
    int64_t n = rank >= 0 ? mgc_grid_group(&c->p->grid, (mgc_group_kind)kind, rank, NULL, 0) : 1;
    if (n > 1) {
        int64_t *m = malloc((size_t)n * sizeof *m);
        if (m && mgc_grid_group(&c->p->grid, (mgc_group_kind)kind, rank, m, n) == n) {
            /* members come in ascending rank order: count runs of one node */
            L.n = n;
            L.nodes = 0;
            L.local = 0;
            int64_t run = 0, prev = -1;
            for (int64_t i = 0; i < n; i++) {
                int64_t node = m[i] / c->gpn;
                if (node != prev) {
                    L.nodes++;
                    run = 0;
                    prev = node;
                }
                if (++run > L.local) L.local = run;
            }
        } else {
            L.n = n;
        }
        free(m);
    }
    if (slot) *slot = L;
    return L;
}

/* ---- compute ops ---------------------------------------------------------------------- */

static double ceil_div(double a, double b) { return ceil(a / b); }

/* Wave quantisation over the SMs (128 x 128 output tiles) times the depth
 * factor K / (K + k_half). */
static double gemm_shape(const mgc_hw *hw, double tiles_m, double n, double k, double groups) {
    double tiles = groups * ceil_div(tiles_m, 128) * ceil_div(n, 128);
    double sms = hw->sms > 0 ? (double)hw->sms : 1;
    double wave = tiles / (ceil_div(tiles, sms) * sms);
    return wave * k / (k + hw->eff.gemm_k_half);
}

/* GEMMs and attention: the compute time, floored by their operands' bytes at
 * the peak HBM bandwidth.  The floor uses the raw bandwidth, not the memory-
 * bound kernels' fitted efficiency, so calibrating one class never moves the
 * other. */
static double roofline(const ctx *c, double flops, double eff, double bytes) {
    double tc = flops / (c->peak * eff);
    double tm = bytes / c->hw->memory_bw;
    return (tc > tm ? tc : tm) + c->hw->launch_s;
}

/* Dropless expert rows received over EP are sized for the worst case (every row a rank could
 * receive, docs/memory-plan.md), but the exchanges and the kernels that sort, unsort and
 * multiply them move the routed rows only.  With balanced routing a rank receives as many rows
 * as it sends, T_l k, of a bound of ep T_l min(k, E_l) rows: such tensors (MGC_PT_ROUTED) are
 * priced at that part of their bytes. */
static double routed_part(const mgc_plan *p) {
    int64_t E = 0, k = 0;
    if (!mgc_plan_config_int(p, "moe.num_experts", &E) || E <= 0 || !mgc_plan_config_int(p, "moe.top_k", &k) ||
        k <= 0 || p->grid.ep <= 0 || E % p->grid.ep)
        return 1;
    int64_t E_l = E / p->grid.ep, per = k < E_l ? k : E_l;
    double r = (double)k / ((double)p->grid.ep * (double)per);
    return r < 1 ? r : 1;
}

/* The bytes an op moves of tensor i: its elements', not a row pitch's gaps; a routed tensor's
 * at the part `routed` (routed_part). */
static double tensor_bytes(double routed, const mgc_plan_chunk *ch, int32_t i) {
    if (i < 0 || i >= ch->n_tensors) return 0;
    double b = (double)mgc_plan_tensor_data_bytes(&ch->tensors[i]);
    return ch->tensors[i].flags & MGC_PT_ROUTED ? b * routed : b;
}

static double gemm_time(const ctx *c, const mgc_plan_chunk *ch, const mgc_plan_op *op) {
    double M = (double)op->iattr[0], N = (double)op->iattr[1], K = (double)op->iattr[2];
    double flops = (double)op->flops;
    int grouped = op->kind == MGC_POP_GROUPED_LINEAR || op->kind == MGC_POP_GROUPED_LINEAR_DGRAD ||
                  op->kind == MGC_POP_GROUPED_LINEAR_WGRAD;
    double E = 1;
    if (grouped) {
        /* the weight (experts, N, K) is the second input of every grouped op's forward */
        int32_t w = op->n_in > 1 ? op->in[1] : -1;
        if (w >= 0 && w < ch->n_tensors && ch->tensors[w].rank == 3 && ch->tensors[w].dim[0] > 0)
            E = (double)ch->tensors[w].dim[0];
    }
    /* grouped (dropless): M is the rows' bound, the FLOPs count the rows of balanced routing */
    if (grouped && flops > 0 && N > 0 && K > 0) M = flops / (2 * N * K);
    if (!(M > 0 && N > 0 && K > 0)) {
        /* no shape: a cube of the same work */
        double side = cbrt(flops / 2 > 1 ? flops / 2 : 1);
        M = N = K = side;
    }
    double m = M / E, n = N, k = K; /* forward: (m x k) (k x n) per expert */
    if (op->kind == MGC_POP_LINEAR_DGRAD || op->kind == MGC_POP_LINEAR_DGRAD_GELU ||
        op->kind == MGC_POP_GROUPED_LINEAR_DGRAD)
        n = K, k = N;
    else if (op->kind == MGC_POP_LINEAR_WGRAD || op->kind == MGC_POP_GROUPED_LINEAR_WGRAD) m = N, n = K, k = M / E;
    if (m < 1) m = 1;
    double eff = c->hw->eff.gemm * gemm_shape(c->hw, m, n, k, E) / c->gemm_ref;
    if (eff > 1) eff = 1;
    double bytes = E * (m * k + k * n + m * n) * (double)c->dt_bytes;
    /* the GELU epilogues' aux matrix: h written beside y, or read with dy W */
    if (op->kind == MGC_POP_LINEAR_GELU || op->kind == MGC_POP_LINEAR_DGRAD_GELU)
        bytes += m * n * (double)c->dt_bytes;
    return roofline(c, flops, eff, bytes);
}

/* The bytes of at most `rows` rows of table tensor i (dim 0 its rows): the rows a lookup of
 * `rows` tokens touches at most. */
static double table_bytes(const mgc_plan_chunk *ch, int32_t i, double rows) {
    if (i < 0 || i >= ch->n_tensors) return 0;
    const mgc_plan_tensor *t = &ch->tensors[i];
    double all = (double)mgc_plan_tensor_data_bytes(t), n = t->rank > 0 ? (double)t->dim[0] : 0;
    return n > 0 && rows < n ? all * rows / n : all;
}

static double op_bytes(double routed, const mgc_plan_chunk *ch, const mgc_plan_op *op) {
    double bytes = 0;
    if ((op->kind == MGC_POP_EMBEDDING || op->kind == MGC_POP_EMBEDDING_BWD ||
         op->kind == MGC_POP_EMBEDDING_NORM) &&
        op->n_in > 1) {
        /* a lookup moves the rows its tokens name, not the table: the forward reads at most
         * a row of each table a token (the word and position tables); the backward adds into
         * at most a row of each fp32 gradient a token, read and written (out 0, 1) */
        double n = 0; /* tokens */
        if (op->in[0] >= 0 && op->in[0] < ch->n_tensors) {
            const mgc_plan_tensor *tok = &ch->tensors[op->in[0]];
            n = 1;
            for (int d = 0; d < tok->rank; d++) n *= (double)tok->dim[d];
        }
        int bwd = op->kind == MGC_POP_EMBEDDING_BWD, docs = (op->flags & MGC_POF_DOCS) != 0;
        int pos = op->n_in > 2 && !(docs && op->n_in == 3) ? 2 : -1; /* the position table */
        mgc_emb_norm_io io;
        if (op->kind == MGC_POP_EMBEDDING_NORM) pos = mgc_plan_emb_norm_io(op, &io) ? -1 : io.pos;
        for (int i = 0; i < op->n_in && i < MGC_PLAN_MAX_IO; i++) {
            int table = !bwd && (i == 1 || i == pos);
            bytes += table ? table_bytes(ch, op->in[i], n) : tensor_bytes(routed, ch, op->in[i]);
        }
        for (int i = 0; i < op->n_out && i < MGC_PLAN_MAX_IO; i++)
            bytes += bwd ? 2 * table_bytes(ch, op->out[i], n)
                         : tensor_bytes(routed, ch, op->out[i]);
        return bytes;
    }
    for (int i = 0; i < op->n_in && i < MGC_PLAN_MAX_IO; i++) bytes += tensor_bytes(routed, ch, op->in[i]);
    for (int i = 0; i < op->n_out && i < MGC_PLAN_MAX_IO; i++) bytes += tensor_bytes(routed, ch, op->out[i]);
    /* a loss chunk's cross-entropy backward that computes the forward's row statistics too
     * (MGC_POF_CE_STATS) does the unfused forward's work as well: the logits are read by the
     * statistics' pass and again by the gradient's, as the unfused pair reads them once each */
    if (op->kind == MGC_POP_CROSS_ENTROPY_BWD && (op->flags & MGC_POF_CE_STATS) && op->n_in > 0)
        bytes += tensor_bytes(routed, ch, op->in[0]);
    return bytes;
}

double mgc_cost_op_bytes(const mgc_plan *p, const mgc_plan_chunk *ch, const mgc_plan_op *op) {
    return op_bytes(routed_part(p), ch, op);
}

static double memory_time(const ctx *c, const mgc_plan_chunk *ch, const mgc_plan_op *op) {
    return op_bytes(c->routed, ch, op) / (c->hw->memory_bw * c->hw->eff.memory) + c->hw->launch_s;
}

/* ---- communication -------------------------------------------------------------------- */

typedef enum { COLL_ALL_REDUCE, COLL_GATHER, COLL_SCATTER, COLL_ALL_TO_ALL, COLL_BROADCAST } coll_kind;

/* A collective of `bytes` (the full, unsharded payload) over a group laid
 * out as L: ring or tree, whichever is faster. */
static double coll_time(const ctx *c, layout L, coll_kind k, double bytes) {
    if (L.n <= 1 || bytes <= 0) return 0;
    const mgc_hw *hw = c->hw;
    double n = (double)L.n;
    int spans = L.nodes > 1;
    double bw = spans ? hw->net_bw * hw->eff.network : hw->nvlink_bw * hw->eff.nvlink;
    double lat = spans ? hw->net_latency_s : hw->nvlink_latency_s;
    double t = 0;
    switch (k) {
    case COLL_ALL_REDUCE: {
        double ring = 2 * (n - 1) / n * bytes / bw + 2 * (n - 1) * lat;
        /* NCCL's tree: a pipelined reduce + broadcast over a binary tree of
         * nodes (and a chain inside each node) */
        double tree = 2 * bytes / bw + 2 * (ceil(log2((double)L.nodes)) * hw->net_latency_s +
                                            (double)(L.local - 1) * hw->nvlink_latency_s);
        t = spans && tree < ring ? tree : ring;
        break;
    }
    case COLL_GATHER:
    case COLL_SCATTER:
        t = (n - 1) / n * bytes / bw + (n - 1) * lat;
        break;
    case COLL_ALL_TO_ALL: {
        /* each rank keeps 1/n, sends (local-1)/n over NVLink and the rest over the network */
        double nv = hw->nvlink_bw * hw->eff.nvlink, net = hw->net_bw * hw->eff.network;
        double t_in = ((double)L.local - 1) / n * bytes / nv;
        double t_out = spans ? (n - (double)L.local) / n * bytes / net : 0;
        t = (t_in > t_out ? t_in : t_out) + (n - 1) * lat;
        break;
    }
    case COLL_BROADCAST:
        t = bytes / bw + ceil(log2(n)) * lat;
        break;
    }
    return t + hw->launch_s;
}

static double coll_op_time(ctx *c, int64_t stage, const mgc_plan_chunk *ch, const mgc_plan_op *op) {
    layout L = group_layout(c, stage, op->group);
    double in = op->n_in > 0 ? tensor_bytes(c->routed, ch, op->in[0]) : 0;
    double out = op->n_out > 0 ? tensor_bytes(c->routed, ch, op->out[0]) : 0;
    switch (op->kind) {
    case MGC_POP_ALL_REDUCE: return coll_time(c, L, COLL_ALL_REDUCE, in > out ? in : out);
    case MGC_POP_ALL_GATHER: return coll_time(c, L, COLL_GATHER, out);   /* gathered size */
    case MGC_POP_REDUCE_SCATTER: return coll_time(c, L, COLL_SCATTER, in); /* unscattered size */
    case MGC_POP_ALL_TO_ALL: return coll_time(c, L, COLL_ALL_TO_ALL, in > out ? in : out);
    default: return coll_time(c, L, COLL_BROADCAST, in > out ? in : out);
    }
}

/* A pipeline transfer between stage s and its neighbour t. */
static double p2p_time(const ctx *c, int64_t s, int64_t t) {
    if (t < 0 || t >= c->p->n_stages || t == s) return 0;
    mgc_coords a, b;
    memset(&a, 0, sizeof a);
    memset(&b, 0, sizeof b);
    a.pp = s;
    b.pp = t;
    int64_t ra = mgc_grid_rank(&c->p->grid, &a), rb = mgc_grid_rank(&c->p->grid, &b);
    int same = ra / c->gpn == rb / c->gpn;
    const mgc_hw *hw = c->hw;
    double bw = same ? hw->nvlink_bw * hw->eff.nvlink : hw->net_bw * hw->eff.network;
    return c->act_bytes / bw + (same ? hw->nvlink_latency_s : hw->net_latency_s) + hw->launch_s;
}

/* ---- ops and instructions ------------------------------------------------------------- */

static double op_cost(ctx *c, int64_t stage, const mgc_plan_chunk *ch, const mgc_plan_op *op, mgc_cost_class *cls,
                      double *flops) {
    mgc_cost_class k = MGC_COST_MEMORY;
    double t = 0, f = 0;
    switch (op->kind) {
    case MGC_POP_LINEAR:
    case MGC_POP_LINEAR_GELU:
    case MGC_POP_LINEAR_DGRAD:
    case MGC_POP_LINEAR_DGRAD_GELU:
    case MGC_POP_LINEAR_WGRAD:
    case MGC_POP_GROUPED_LINEAR:
    case MGC_POP_GROUPED_LINEAR_DGRAD:
    case MGC_POP_GROUPED_LINEAR_WGRAD:
        if (op->flops > 0) {
            k = MGC_COST_GEMM;
            f = (double)op->flops;
            t = gemm_time(c, ch, op);
        } else {
            t = memory_time(c, ch, op);
        }
        break;
    case MGC_POP_ATTENTION:
    case MGC_POP_ATTENTION_BWD: {
        k = MGC_COST_ATTENTION;
        f = (double)op->flops;
        double eff = op->kind == MGC_POP_ATTENTION ? c->hw->eff.attention_fwd : c->hw->eff.attention_bwd;
        /* the kernels compute over the head dim rounded up to 16 (kspec.h mgc_kspec_att_width) */
        mgc_attn_geom g;
        double pad = 1;
        if (!mgc_plan_attn_geom(ch, op, &g) && g.d > 0) {
            pad = (double)mgc_kspec_att_width(g.d) / (double)g.d;
            /* past a width of 128 the 16-bit dK/dV kernel's two column slices each compute S
             * and dP: 9 tile products where the calibrated efficiency saw 7 */
            if (op->kind == MGC_POP_ATTENTION_BWD &&
                mgc_kspec_att_dkv_slices(g.d, ch->tensors[op->in[0]].dtype != MGC_DT_F32) > 1)
                pad *= 9.0 / 7.0;
        }
        t = roofline(c, f * pad, eff, op_bytes(c->routed, ch, op));
        break;
    }
    case MGC_POP_ALL_REDUCE:
    case MGC_POP_ALL_GATHER:
    case MGC_POP_REDUCE_SCATTER:
    case MGC_POP_ALL_TO_ALL:
    case MGC_POP_BROADCAST:
        k = MGC_COST_TP_COMM;
        t = coll_op_time(c, stage, ch, op);
        break;
    default:
        t = memory_time(c, ch, op);
        break;
    }
    if (cls) *cls = k;
    if (flops) *flops = f;
    return t;
}

/* Elements of the stage's parameters this rank updates (its optimizer shard). */
static double optimizer_elems(const mgc_stage_program *sp) {
    double e = 0;
    for (int64_t b = 0; b < sp->n_buckets; b++)
        e += (double)sp->buckets[b].count / (double)(sp->buckets[b].shards > 0 ? sp->buckets[b].shards : 1);
    return e;
}

/* The tied embedding's gradient (fp32) on the stage holding the embedding. */
static double embed_grad_bytes(const mgc_stage_program *sp) {
    for (int64_t k = 0; k < sp->n_chunks; k++) {
        const mgc_plan_chunk *ch = &sp->chunks[k];
        for (int64_t i = 0; i < ch->n_fwd; i++)
            if ((ch->fwd[i].kind == MGC_POP_EMBEDDING || ch->fwd[i].kind == MGC_POP_EMBEDDING_NORM) &&
                ch->fwd[i].n_in > 1) {
                int32_t w = ch->fwd[i].in[1];
                if (w >= 0 && w < ch->n_tensors) {
                    const mgc_plan_tensor *t = &ch->tensors[w];
                    size_t es = mgc_dtype_size((mgc_dtype)t->dtype);
                    return es ? (double)t->bytes / (double)es * 4.0 : 0;
                }
            }
    }
    return 0;
}

static double instr_cost(ctx *c, int64_t stage, const mgc_instr *in, const chunk_cost *cc, mgc_cost_class *cls) {
    const mgc_stage_program *sp = &c->p->stages[stage];
    const mgc_hw *hw = c->hw;
    mgc_cost_class k = MGC_COST_MEMORY;
    double t = 0;
    switch (in->op) {
    case MGC_I_FORWARD:
    case MGC_I_BACKWARD: {
        if (in->chunk >= sp->n_chunks) break;
        if (cc) {
            t = in->op == MGC_I_FORWARD ? cc[in->chunk].fwd_s : cc[in->chunk].bwd_s;
        } else {
            const mgc_plan_chunk *ch = &sp->chunks[in->chunk];
            int64_t n = in->op == MGC_I_FORWARD ? ch->n_fwd : ch->n_bwd;
            const mgc_plan_op *ops = in->op == MGC_I_FORWARD ? ch->fwd : ch->bwd;
            for (int64_t i = 0; i < n; i++) t += op_cost(c, stage, ch, &ops[i], NULL, NULL);
        }
        break;
    }
    case MGC_I_LOAD_BATCH:
        t = hw->launch_s;
        break;
    case MGC_I_SEND_ACT:
    case MGC_I_RECV_ACT:
    case MGC_I_SEND_GRAD:
    case MGC_I_RECV_GRAD:
        k = MGC_COST_P2P;
        t = p2p_time(c, stage, in->peer);
        break;
    case MGC_I_REDUCE_GRADS:
    case MGC_I_GATHER_PARAMS: {
        k = MGC_COST_DP_COMM;
        if (in->arg >= (uint64_t)sp->n_buckets) break;
        const mgc_bucket *b = &sp->buckets[in->arg];
        layout L = group_layout(c, stage, b->group);
        if (in->op == MGC_I_GATHER_PARAMS) t = coll_time(c, L, COLL_GATHER, (double)b->weight_bytes);
        else t = coll_time(c, L, b->shards > 1 ? COLL_SCATTER : COLL_ALL_REDUCE, (double)b->grad_bytes);
        break;
    }
    case MGC_I_EMBED_GRADS:
        k = MGC_COST_DP_COMM;
        t = coll_time(c, group_layout(c, stage, MGC_GROUP_EMBED), COLL_ALL_REDUCE, embed_grad_bytes(sp));
        break;
    case MGC_I_OPTIMIZER: {
        k = MGC_COST_OPTIMIZER;
        /* grad norm (read grad), AdamW (read grad; read+write master, m, v;
         * write the compute-dtype copy), a handful of launches per bucket */
        double per_elem = 4 + 4 + 8 + 8 + 8 + (c->dt_bytes == 4 ? 0 : (double)c->dt_bytes);
        t = optimizer_elems(sp) * per_elem / (hw->memory_bw * hw->eff.memory) +
            (double)(2 * sp->n_buckets + 4) * hw->launch_s;
        /* the global norm's all-reduce over the world: latency-bound */
        layout W = group_layout(c, stage, MGC_GROUP_WORLD);
        t += coll_time(c, W, COLL_ALL_REDUCE, 8);
        break;
    }
    default:
        break;
    }
    if (cls) *cls = k;
    return t;
}

double mgc_cost_op(const mgc_plan *p, int64_t stage, const mgc_plan_chunk *ch, const mgc_plan_op *op,
                   const mgc_cost_options *o, mgc_cost_class *cls) {
    ctx c;
    ctx_init(&c, p, o, 0);
    c.gemm_ref = gemm_shape(o->hw, 8192, 8192, 8192, 1);
    return op_cost(&c, stage, ch, op, cls, NULL);
}

double mgc_cost_instr(const mgc_plan *p, int64_t stage, const mgc_instr *in, const mgc_cost_options *o,
                      mgc_cost_class *cls) {
    if (stage < 0 || stage >= p->n_stages) return 0;
    ctx c;
    ctx_init(&c, p, o, 0);
    c.gemm_ref = gemm_shape(o->hw, 8192, 8192, 8192, 1);
    return instr_cost(&c, stage, in, NULL, cls);
}

int mgc_cost_group_spans_nodes(const mgc_plan *p, int64_t stage, int group, const mgc_cost_options *o) {
    ctx c;
    ctx_init(&c, p, o, 0);
    return group_layout(&c, stage, group).nodes > 1;
}

/* ---- the step ------------------------------------------------------------------------- */

typedef struct sim_user {
    ctx *c;
    chunk_cost **cc; /* (pp) per rank, (vp) per chunk */
    int overlap;     /* reductions cost 0 in the streams (they run beside) */
} sim_user;

static double sim_cost(void *user, int64_t rank, const mgc_instr *in) {
    sim_user *u = user;
    if (u->overlap && in->op == MGC_I_REDUCE_GRADS) return 0;
    return instr_cost(u->c, rank, in, u->cc[rank], NULL);
}

int mgc_cost_plan(const mgc_plan *p, const mgc_cost_options *o, mgc_cost_report *out, char *err, size_t errsz) {
    memset(out, 0, sizeof *out);
    if (!o || !o->hw || !(o->hw->peak_flops[1] > 0) || !(o->hw->memory_bw > 0) || !(o->hw->eff.gemm > 0)) {
        snprintf(err, errsz, "the cost model needs a complete hardware profile");
        return -1;
    }
    const int64_t pp = p->n_stages;
    if (pp < 1 || pp != p->grid.pp) {
        snprintf(err, errsz, "the plan has no pipeline stages to cost");
        return -1;
    }
    ctx c;
    ctx_init(&c, p, o, 1);
    c.gemm_ref = gemm_shape(o->hw, 8192, 8192, 8192, 1);
    if (!(c.peak > 0)) {
        snprintf(err, errsz, "hardware profile %s has no peak for the plan's precision", o->hw->name);
        free(c.groups);
        return -1;
    }
    int rc = -1;
    mgc_schedule s;
    memset(&s, 0, sizeof s);
    mgc_sim_result res;
    memset(&res, 0, sizeof res);
    mgc_diags d;
    mgc_diags_init(&d);
    chunk_cost **cc = calloc((size_t)pp, sizeof *cc);
    s.ranks = calloc((size_t)pp, sizeof *s.ranks);
    if (!cc || !s.ranks || !c.groups) {
        snprintf(err, errsz, "out of memory");
        goto done;
    }

    /* 1. every chunk program, once */
    double hw_flops_per_mb_all = 0; /* summed over pipeline ranks, one microbatch */
    for (int64_t r = 0; r < pp; r++) {
        const mgc_stage_program *sp = &p->stages[r];
        cc[r] = calloc((size_t)(sp->n_chunks > 0 ? sp->n_chunks : 1), sizeof **cc);
        if (!cc[r]) {
            snprintf(err, errsz, "out of memory");
            goto done;
        }
        for (int64_t k = 0; k < sp->n_chunks; k++) {
            const mgc_plan_chunk *ch = &sp->chunks[k];
            chunk_cost *x = &cc[r][k];
            for (int64_t i = 0; i < ch->n_fwd; i++) {
                mgc_cost_class cl;
                double f = 0, t = op_cost(&c, r, ch, &ch->fwd[i], &cl, &f);
                x->fwd_s += t;
                x->fwd_cls[cl] += t;
                x->fwd_flops += f;
            }
            for (int64_t i = 0; i < ch->n_bwd; i++) {
                mgc_cost_class cl;
                double f = 0, t = op_cost(&c, r, ch, &ch->bwd[i], &cl, &f);
                x->bwd_s += t;
                x->bwd_cls[cl] += t;
                x->bwd_flops += f;
            }
            hw_flops_per_mb_all += x->fwd_flops + x->bwd_flops;
        }
    }

    /* 2. the streams, simulated together */
    int64_t g = 0, tied = 0;
    s.schedule = p->schedule;
    s.pp = pp;
    s.vp = p->grid.vp;
    s.m = p->num_microbatches;
    s.group = mgc_plan_config_int(p, "parallel.microbatch_group_size", &g) && g > 0 ? g : pp;
    s.n_stages = pp * s.vp;
    s.distributed_optimizer = p->distributed_optimizer;
    s.tied_embeddings = mgc_plan_config_int(p, "model.tie_embeddings", &tied) ? (int)tied : 0;
    s.load_every = mgc_schedule_plan_load_every(p);
    s.loc = (mgc_loc){"plan", 0, 0};
    for (int64_t r = 0; r < pp; r++) {
        s.ranks[r].n = p->stages[r].n_instrs;
        s.ranks[r].instrs = p->stages[r].instrs;
        s.ranks[r].n_buckets = p->stages[r].n_buckets;
    }
    sim_user u = {&c, cc, !o->no_grad_overlap};
    mgc_sim_options so;
    memset(&so, 0, sizeof so);
    so.cost = sim_cost;
    so.cost_user = &u;
    so.max_reports = 1;
    if (mgc_schedule_simulate(&s, &so, &res, &d) != 0 || !res.ok) {
        snprintf(err, errsz, "the plan's schedule does not run to completion: %s",
                 d.n ? d.v[0].msg : "simulator failure");
        goto done;
    }

    /* 3. per rank: the reductions beside the backward, then the tail */
    double step = 0;
    int64_t crit = 0;
    double crit_shift = 0;
    for (int64_t r = 0; r < pp; r++) {
        const mgc_stage_program *sp = &p->stages[r];
        const mgc_sim_rank *R = &res.ranks[r];
        double shift = 0;
        if (u.overlap && sp->n_buckets > 0) {
            /* each chunk's last backward and its section of the flat space */
            int64_t vp = sp->n_chunks;
            double *b0 = calloc((size_t)vp, sizeof *b0), *b1 = calloc((size_t)vp, sizeof *b1);
            double *lo = malloc((size_t)vp * sizeof *lo), *hi = calloc((size_t)vp, sizeof *hi);
            double *ready = malloc((size_t)sp->n_buckets * sizeof *ready);
            int64_t *order = malloc((size_t)sp->n_buckets * sizeof *order);
            double opt_start = -1;
            if (!b0 || !b1 || !lo || !hi || !ready || !order) {
                free(b0), free(b1), free(lo), free(hi), free(ready), free(order);
                snprintf(err, errsz, "out of memory");
                goto done;
            }
            for (int64_t k = 0; k < vp; k++) lo[k] = INFINITY;
            for (int64_t i = 0; i < sp->n_instrs; i++) {
                const mgc_instr *in = &sp->instrs[i];
                if (in->op == MGC_I_BACKWARD && in->chunk < vp && R->end[i] >= b1[in->chunk]) {
                    b0[in->chunk] = R->start[i];
                    b1[in->chunk] = R->end[i];
                }
                if (in->op == MGC_I_OPTIMIZER) opt_start = R->start[i];
            }
            for (int64_t b = 0; b < sp->n_buckets; b++) {
                const mgc_bucket *bk = &sp->buckets[b];
                int64_t k = bk->chunk < vp ? bk->chunk : 0;
                if ((double)bk->begin < lo[k]) lo[k] = (double)bk->begin;
                if ((double)(bk->begin + bk->count) > hi[k]) hi[k] = (double)(bk->begin + bk->count);
            }
            /* the backward produces the end of a chunk's section first */
            for (int64_t b = 0; b < sp->n_buckets; b++) {
                const mgc_bucket *bk = &sp->buckets[b];
                int64_t k = bk->chunk < vp ? bk->chunk : 0;
                double span = hi[k] - lo[k];
                double frac = span > 0 ? ((double)bk->begin - lo[k]) / span : 0;
                ready[b] = b0[k] + (b1[k] - b0[k]) * (1 - frac);
                order[b] = b;
            }
            /* the communication stream takes them as they become ready */
            for (int64_t i = 1; i < sp->n_buckets; i++) {
                int64_t x = order[i], j = i;
                while (j > 0 && ready[order[j - 1]] > ready[x]) order[j] = order[j - 1], j--;
                order[j] = x;
            }
            double t = 0;
            for (int64_t i = 0; i < sp->n_buckets; i++) {
                mgc_instr in;
                memset(&in, 0, sizeof in);
                in.op = MGC_I_REDUCE_GRADS;
                in.arg = (uint32_t)order[i];
                double dur = instr_cost(&c, r, &in, cc[r], NULL);
                t = (t > ready[order[i]] ? t : ready[order[i]]) + dur;
            }
            if (opt_start >= 0 && t > opt_start) shift = t - opt_start;
            free(b0), free(b1), free(lo), free(hi), free(ready), free(order);
        }
        double fin = R->finish + shift;
        if (fin > step) step = fin, crit = r, crit_shift = shift;
    }

    /* 4. the report */
    const mgc_stage_program *sp = &p->stages[crit];
    const mgc_sim_rank *R = &res.ranks[crit];
    for (int64_t i = 0; i < sp->n_instrs; i++) {
        const mgc_instr *in = &sp->instrs[i];
        if (in->op == MGC_I_FORWARD || in->op == MGC_I_BACKWARD) {
            if (in->chunk >= sp->n_chunks) continue;
            const double *v = in->op == MGC_I_FORWARD ? cc[crit][in->chunk].fwd_cls : cc[crit][in->chunk].bwd_cls;
            for (int k = 0; k < MGC_COST__COUNT; k++) out->by_class_s[k] += v[k];
        } else {
            mgc_cost_class cl;
            double t = instr_cost(&c, crit, in, cc[crit], &cl);
            out->by_class_s[cl] += t;
        }
    }
    int64_t tokens = p->grid.dp * p->num_microbatches * p->micro_batch_size * p->seq_length;
    double world = (double)p->grid.world;
    out->step_s = step;
    out->tokens_per_s = step > 0 ? (double)tokens / step : 0;
    out->model_flops = p->model_flops_per_iter;
    out->hardware_flops = hw_flops_per_mb_all * (double)p->num_microbatches * world / (double)pp;
    out->model_tflops_per_gpu = step > 0 ? out->model_flops / step / world / 1e12 : 0;
    out->hardware_tflops_per_gpu = step > 0 ? out->hardware_flops / step / world / 1e12 : 0;
    out->mfu = out->model_tflops_per_gpu * 1e12 / c.peak;
    out->hfu = out->hardware_tflops_per_gpu * 1e12 / c.peak;
    out->energy_j = o->hw->power_w * world * step;
    out->critical_rank = crit;
    double comm_all = out->by_class_s[MGC_COST_TP_COMM] + out->by_class_s[MGC_COST_P2P] +
                      out->by_class_s[MGC_COST_DP_COMM];
    out->comm_s = comm_all;
    out->compute_s = out->by_class_s[MGC_COST_GEMM] + out->by_class_s[MGC_COST_ATTENTION] +
                     out->by_class_s[MGC_COST_MEMORY] + out->by_class_s[MGC_COST_OPTIMIZER];
    /* exposed: everything in the streams (TP, P2P, embedding sum, gathers)
     * plus what the optimizer waited for beyond the backward */
    double hidden_dp = 0;
    if (u.overlap)
        for (int64_t i = 0; i < sp->n_instrs; i++)
            if (sp->instrs[i].op == MGC_I_REDUCE_GRADS) hidden_dp += instr_cost(&c, crit, &sp->instrs[i], cc[crit], NULL);
    out->exposed_comm_s = comm_all - hidden_dp + crit_shift;
    if (out->exposed_comm_s < 0) out->exposed_comm_s = 0;
    out->comm_compute_ratio = out->compute_s > 0 ? comm_all / out->compute_s : 0;
    /* idle until its own finish (the simulator's idle runs to the last rank's) */
    double idle = R->finish - R->compute - R->other - R->comm;
    out->bubble_s = idle > 0 ? idle : 0;
    out->bubble_fraction = step > 0 ? out->bubble_s / step : 0;
    for (int64_t r = 0; r < pp; r++)
        if (p->stages[r].arena_bytes > out->max_arena_bytes) out->max_arena_bytes = p->stages[r].arena_bytes;
    out->memory_fraction = o->hw->memory_bytes > 0 ? (double)out->max_arena_bytes / o->hw->memory_bytes : 0;
    out->gpus_per_node = c.gpn;
    out->nodes = (p->grid.world + c.gpn - 1) / c.gpn;
    out->grad_overlap = u.overlap;
    rc = 0;
done:
    if (cc)
        for (int64_t r = 0; r < pp; r++) free(cc[r]);
    free(cc);
    free(s.ranks);
    mgc_sim_result_free(&res);
    mgc_diags_free(&d);
    free(c.groups);
    return rc;
}

/* ---- reports -------------------------------------------------------------------------- */

void mgc_cost_print_text(const mgc_cost_report *r, const mgc_hw *hw, FILE *out) {
    double gib = 1073741824.0;
    fprintf(out, "predicted on %s, %lld node%s of %lld GPUs (cost model: docs/cost-model.md):\n", hw->name,
            (long long)r->nodes, r->nodes == 1 ? "" : "s", (long long)r->gpus_per_node);
    fprintf(out, "  step %.4g s, %.4g tokens/s, %.1f model TFLOP/s per GPU, MFU %.1f%%, HFU %.1f%%\n", r->step_s,
            r->tokens_per_s, r->model_tflops_per_gpu, 100 * r->mfu, 100 * r->hfu);
    fprintf(out, "  critical pipeline rank %lld: compute %.4g s, communication %.4g s (%.4g s exposed, "
                 "comm/compute %.2f), bubble %.4g s (%.1f%%)\n",
            (long long)r->critical_rank, r->compute_s, r->comm_s, r->exposed_comm_s, r->comm_compute_ratio,
            r->bubble_s, 100 * r->bubble_fraction);
    fprintf(out, "  time by class:");
    for (int k = 0; k < MGC_COST__COUNT; k++)
        fprintf(out, " %s %.3g s%s", mgc_cost_class_name((mgc_cost_class)k), r->by_class_s[k],
                k + 1 < MGC_COST__COUNT ? "," : "\n");
    fprintf(out, "  memory: largest arena %.2f GiB of %.2f GiB (%.0f%%); energy %.4g kJ per step (%.0f W x GPUs)\n",
            (double)r->max_arena_bytes / gib, hw->memory_bytes / gib, 100 * r->memory_fraction, r->energy_j / 1e3,
            hw->power_w);
}

void mgc_cost_print_json(const mgc_cost_report *r, const mgc_hw *hw, mgc_json *j, const char *key) {
    mgc_json_obj_begin(j, key);
    mgc_json_str(j, "hardware", hw->name);
    mgc_json_str(j, "hardware_source", hw->source);
    mgc_json_int(j, "gpus_per_node", r->gpus_per_node);
    mgc_json_int(j, "nodes", r->nodes);
    mgc_json_num(j, "step_s", r->step_s);
    mgc_json_num(j, "tokens_per_s", r->tokens_per_s);
    mgc_json_num(j, "model_flops_per_step", r->model_flops);
    mgc_json_num(j, "hardware_flops_per_step", r->hardware_flops);
    mgc_json_num(j, "model_tflops_per_gpu", r->model_tflops_per_gpu);
    mgc_json_num(j, "hardware_tflops_per_gpu", r->hardware_tflops_per_gpu);
    mgc_json_num(j, "mfu", r->mfu);
    mgc_json_num(j, "hfu", r->hfu);
    mgc_json_num(j, "energy_j_per_step", r->energy_j);
    mgc_json_int(j, "critical_rank", r->critical_rank);
    mgc_json_num(j, "compute_s", r->compute_s);
    mgc_json_num(j, "comm_s", r->comm_s);
    mgc_json_num(j, "exposed_comm_s", r->exposed_comm_s);
    mgc_json_num(j, "comm_compute_ratio", r->comm_compute_ratio);
    mgc_json_num(j, "bubble_s", r->bubble_s);
    mgc_json_num(j, "bubble_fraction", r->bubble_fraction);
    mgc_json_bool(j, "grad_reduce_overlap", r->grad_overlap);
    mgc_json_obj_begin(j, "time_by_class_s");
    for (int k = 0; k < MGC_COST__COUNT; k++)
        mgc_json_num(j, mgc_cost_class_name((mgc_cost_class)k), r->by_class_s[k]);
    mgc_json_obj_end(j);
    mgc_json_u64(j, "max_arena_bytes", r->max_arena_bytes);
    mgc_json_num(j, "memory_fraction", r->memory_fraction);
    mgc_json_obj_end(j);
}
