/* exec_setup.c - opening a stage's executor (exec.h mgc_exec_open): its buffers, its
 * parameters' flat space, their initialisation and checkpoint layout, and which gradients a
 * step's first writes store (exec_int.h). */
#include "exec_int.h"

#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "half.h"
#include "rng.h"

/* the gradients' first writes (below) */
static int setup_fresh(mgc_exec *x);
static int setup_zero_list(mgc_exec *x);

/* ---- setup --------------------------------------------------------------------------- */

static int64_t cfg_i(const mgc_plan *p, const char *k, int64_t dflt) {
    int64_t v;
    return mgc_plan_config_int(p, k, &v) ? v : dflt;
}
static double cfg_f(const mgc_plan *p, const char *k, double dflt) {
    double v;
    return mgc_plan_config_float(p, k, &v) ? v : dflt;
}

static int64_t group_rank_of(const mgc_exec *x, uint16_t g) {
    switch (g) {
    case MGC_GROUP_TP: return x->co.tp;
    case MGC_GROUP_CP: return x->co.cp;
    case MGC_GROUP_DP: return x->co.dp;
    case MGC_GROUP_EP: return x->co.ep;
    case MGC_GROUP_ETP: return x->co.etp;
    case MGC_GROUP_EDP: return x->co.edp;
    case MGC_GROUP_TPCP: return x->co.tp + x->co.cp * x->grid.tp;
    case MGC_GROUP_DPCP: return mgc_grid_group_rank(&x->grid, MGC_GROUP_DPCP, x->rank);
    default: return 0;
    }
}

static int64_t group_size_of(const mgc_exec *x, uint16_t g) {
    switch (g) {
    case MGC_GROUP_TP: return x->grid.tp;
    case MGC_GROUP_CP: return x->grid.cp;
    case MGC_GROUP_DP: return x->grid.dp;
    case MGC_GROUP_EP: return x->grid.ep;
    case MGC_GROUP_ETP: return x->grid.etp;
    case MGC_GROUP_EDP: return x->grid.edp;
    case MGC_GROUP_TPCP: return x->grid.tp * x->grid.cp;
    case MGC_GROUP_DPCP: return x->grid.dp * x->grid.cp;
    default: return 1;
    }
}

static int find_comm_buf(const mgc_exec *x, const char *prefix, int c, int32_t mb) {
    char want[64];
    snprintf(want, sizeof want, "%s.c%d", prefix, c);
    for (int64_t b = 0; b < x->sp->n_buffers; b++) {
        const mgc_buffer *B = &x->sp->buffers[b];
        if (B->kind == MGC_BUF_COMM && B->chunk == c && B->mb == mb && !strcmp(sname(x, B->name), want))
            return (int)b;
    }
    return -1;
}

static int setup_buffers(mgc_exec *x) {
    const mgc_stage_program *sp = x->sp;
    int64_t m = x->plan->num_microbatches;
    x->chunks = calloc((size_t)sp->n_chunks, sizeof *x->chunks);
    x->input_buf = malloc((size_t)m * sizeof *x->input_buf);
    if (!x->chunks || !x->input_buf) return mgc_exec_fail(x, "out of memory");
    x->grad_buf = x->weight_buf = x->master_buf = x->m_buf = x->v_buf = -1;
    for (int64_t i = 0; i < m; i++)
        x->input_buf[i] = -1;
    for (int64_t b = 0; b < sp->n_buffers; b++) {
        const mgc_buffer *B = &sp->buffers[b];
        if (B->kind == MGC_BUF_INPUT && B->mb >= 0) x->input_buf[B->mb] = (int32_t)b;
        if (B->kind == MGC_BUF_GRAD) x->grad_buf = (int32_t)b;
        if (B->kind == MGC_BUF_WEIGHT) x->weight_buf = (int32_t)b;
        if (B->kind == MGC_BUF_ADAM_M) x->m_buf = (int32_t)b;
        if (B->kind == MGC_BUF_MASTER) x->master_buf = (int32_t)b;
        if (B->kind == MGC_BUF_ADAM_V) x->v_buf = (int32_t)b;
    }
    static const char *const comm_names[4] = {"send_act", "recv_act", "send_grad", "recv_grad"};
    for (int64_t c = 0; c < sp->n_chunks; c++) {
        chunk_rt *r = &x->chunks[c];
        r->stash = malloc((size_t)m * sizeof *r->stash);
        for (int k = 0; k < 4; k++)
            r->comm[k] = malloc((size_t)m * sizeof *r->comm[k]);
        if (!r->stash || !r->comm[0] || !r->comm[1] || !r->comm[2] || !r->comm[3])
            return mgc_exec_fail(x, "out of memory");
        for (int64_t i = 0; i < m; i++) {
            r->stash[i] = -1;
            for (int k = 0; k < 4; k++)
                r->comm[k][i] = (int32_t)find_comm_buf(x, comm_names[k], (int)c, (int32_t)i);
        }
    }
    for (int64_t b = 0; b < sp->n_buffers; b++) {
        const mgc_buffer *B = &sp->buffers[b];
        if (B->kind == MGC_BUF_STASH && B->chunk < sp->n_chunks && B->mb >= 0)
            x->chunks[B->chunk].stash[B->mb] = (int32_t)b;
    }
    /* boundary tensors (docs/partitioning.md, "Conventions of a chunk") */
    for (int64_t c = 0; c < sp->n_chunks; c++) {
        const mgc_plan_chunk *ch = &sp->chunks[c];
        chunk_rt *r = &x->chunks[c];
        r->in_act = r->in_grad = r->out_act = r->out_grad = r->loss = r->aux = r->z = -1;
        int32_t next = 0;
        if (!ch->embedding) r->in_act = 0, r->in_grad = 1, next = 2;
        if (!ch->loss) {
            if (ch->n_fwd == 0 && ch->n_tensors == 2) /* an empty virtual stage */
                r->out_act = 0, r->out_grad = 1;
            else
                r->out_act = next, r->out_grad = next + 1;
        }
        if (ch->n_tensors < next + (ch->loss || (ch->n_fwd == 0 && ch->n_tensors == 2) ? 0 : 2))
            return mgc_exec_fail(
                x, "stage %" PRId64 " chunk %" PRId64 ": too few tensors for its boundary",
                sp->pp_rank, c);
        /* the loss: the (sum, count) pair of role loss some op writes (the cross-entropy's
         * root, its CP all-reduce, or the loss chunks' last sum in the backward) */
        r->aux_all = calloc((size_t)(ch->n_fwd + 1), sizeof *r->aux_all);
        if (!r->aux_all) return mgc_exec_fail(x, "out of memory");
        for (int64_t i = 0; i < ch->n_fwd + ch->n_bwd; i++) {
            const mgc_plan_op *op = i < ch->n_fwd ? &ch->fwd[i] : &ch->bwd[i - ch->n_fwd];
            for (int k = 0; k < op->n_out; k++) {
                const mgc_plan_tensor *t = &ch->tensors[op->out[k]];
                if (t->role == MGC_TR_LOSS && t->dtype == MGC_DT_F32 && t->rank == 1 &&
                    t->dim[0] == 2)
                    r->loss = op->out[k], r->loss_pass = i >= ch->n_fwd;
            }
            if (i >= ch->n_fwd) continue;
            if (op->kind == MGC_POP_MOE_ROUTE)
                for (int k = 0; k < op->n_out; k++) {
                    const mgc_plan_tensor *t = &ch->tensors[op->out[k]];
                    if (t->dtype == MGC_DT_F32 && t->rank == 0) r->aux_all[r->n_aux_all++] = op->out[k];
                }
        }
    }
    /* input slots: one per distinct (name, bytes) in order of first appearance */
    x->slot_tokens = x->slot_labels = x->slot_mask = x->slot_docs = -1;
    for (int64_t c = 0; c < sp->n_chunks; c++) {
        const mgc_plan_chunk *ch = &sp->chunks[c];
        for (int64_t t = 0; t < ch->n_tensors; t++) {
            const mgc_plan_tensor *T = &ch->tensors[t];
            if (T->role != MGC_TR_INPUT || T->view) continue; /* a view: its tensor's slot */
            if (T->buffer == MGC_PLAN_BUF_STASH)
                return mgc_exec_fail(x,
                                     "stage %" PRId64 ": input '%s' is stashed; this runtime reads "
                                     "inputs from their INPUT slot only (recompile with this mgc)",
                                     sp->pp_rank, sname(x, T->name));
            if (T->buffer < 0) continue;
            const char *n = sname(x, T->name);
            int64_t off = (int64_t)T->offset;
            if (!strcmp(n, "tokens")) x->slot_tokens = off;
            else if (!strcmp(n, "labels")) x->slot_labels = off;
            else if (!strcmp(n, "loss_mask")) x->slot_mask = off;
            else if (!strcmp(n, "doc_start")) x->slot_docs = off;
            else if (x->moe_bias && bias_layer(x, T) >= 0) {
                int64_t(*g)[2] = realloc(x->bias_slot, (size_t)(x->n_bias_slots + 1) * sizeof *g);
                if (!g) return mgc_exec_fail(x, "out of memory");
                x->bias_slot = g;
                g[x->n_bias_slots][0] = off, g[x->n_bias_slots++][1] = bias_layer(x, T);
            }
        }
    }
    return 0;
}

/* Which tensors feed which ops: GLU weights, vocabulary weights. */
static void mark_param_uses(mgc_exec *x, int c, uint8_t *glu, uint8_t *vocab, uint8_t *tied) {
    const mgc_plan_chunk *ch = &x->sp->chunks[c];
    /* the output layer's GEMM runs in the backward with loss chunks (compiler/losschunk.h) */
    for (int64_t i = 0; i < ch->n_bwd; i++) {
        const mgc_plan_op *op = &ch->bwd[i];
        if (op->kind == MGC_POP_LINEAR && (op->iattr[3] & (LIN_TIED | LIN_VOCAB))) {
            vocab[op->in[1]] = 1;
            if (op->iattr[3] & LIN_TIED) tied[op->in[1]] = 1;
        }
    }
    for (int64_t i = 0; i < ch->n_fwd; i++) {
        const mgc_plan_op *op = &ch->fwd[i];
        if ((op->kind == MGC_POP_EMBEDDING || op->kind == MGC_POP_EMBEDDING_NORM) && op->n_in > 1)
            vocab[op->in[1]] = 1;
        if (op->kind == MGC_POP_LINEAR && (op->iattr[3] & (LIN_TIED | LIN_VOCAB))) {
            vocab[op->in[1]] = 1;
            if (op->iattr[3] & LIN_TIED) tied[op->in[1]] = 1;
        }
        if (op->kind == MGC_POP_SWIGLU)
            for (int64_t j = 0; j < ch->n_fwd; j++) {
                const mgc_plan_op *l = &ch->fwd[j];
                if ((l->kind == MGC_POP_LINEAR || l->kind == MGC_POP_GROUPED_LINEAR) &&
                    l->out[0] == op->in[0]) {
                    glu[l->in[1]] = 1;
                    int bi = l->kind == MGC_POP_LINEAR ? 2 : 3;
                    if (l->n_in > bi) glu[l->in[bi]] = 1;
                }
            }
    }
}

static int seg_push(seg **a, int64_t *n, int64_t *cap, seg s) {
    if (s.n <= 0) return 0;
    if (*n == *cap) {
        int64_t nc = *cap ? *cap * 2 : 64;
        seg *p = realloc(*a, (size_t)nc * sizeof *p);
        if (!p) return -1;
        *a = p, *cap = nc;
    }
    (*a)[(*n)++] = s;
    return 0;
}

static int setup_params(mgc_exec *x) {
    const mgc_stage_program *sp = x->sp;
    int64_t total = 0;
    for (int64_t c = 0; c < sp->n_chunks; c++)
        for (int64_t t = 0; t < sp->chunks[c].n_tensors; t++)
            total += sp->chunks[c].tensors[t].role == MGC_TR_PARAM;
    x->params = calloc((size_t)(total ? total : 1), sizeof *x->params);
    if (!x->params) return mgc_exec_fail(x, "out of memory");
    for (int64_t c = 0; c < sp->n_chunks; c++) {
        const mgc_plan_chunk *ch = &sp->chunks[c];
        uint8_t *marks = calloc((size_t)(3 * ch->n_tensors + 3), 1);
        if (!marks) return mgc_exec_fail(x, "out of memory");
        uint8_t *glu = marks, *vocab = marks + ch->n_tensors, *tied = marks + 2 * ch->n_tensors;
        mark_param_uses(x, (int)c, glu, vocab, tied);
        for (int64_t t = 0; t < ch->n_tensors; t++) {
            const mgc_plan_tensor *T = &ch->tensors[t];
            if (T->role != MGC_TR_PARAM) continue;
            if (T->buffer < 0) continue; /* not used on this stage */
            if (T->buffer != x->weight_buf ||
                (T->dtype != MGC_DT_F32 && T->dtype != MGC_DT_BF16 && T->dtype != MGC_DT_F16)) {
                free(marks);
                return mgc_exec_fail(x,
                                     "stage %" PRId64
                                     ": parameter '%s' is not an fp32, bf16 or fp16 "
                                     "weight in the weights buffer",
                                     sp->pp_rank, sname(x, T->name));
            }
            x->wdt = T->dtype;
            x->w16 = T->dtype != MGC_DT_F32;
            if (x->w16 && x->master_buf < 0) {
                free(marks);
                return mgc_exec_fail(
                    x, "stage %" PRId64 ": %s weights without a master_weights buffer", sp->pp_rank,
                    mgc_dtype_name((mgc_dtype)T->dtype));
            }
            int32_t g = -1;
            if (t + 1 < ch->n_tensors && ch->tensors[t + 1].role == MGC_TR_GRAD) g = (int32_t)t + 1;
            if (g < 0 || ch->tensors[g].buffer != x->grad_buf) {
                free(marks);
                return mgc_exec_fail(x,
                                     "stage %" PRId64 ": parameter '%s' has no gradient after it",
                                     sp->pp_rank, sname(x, T->name));
            }
            pentry *e = &x->params[x->n_params++];
            const char *nm = sname(x, T->name);
            e->pub.name = nm;
            e->pub.chunk = (int)c;
            e->pub.rank = T->rank;
            for (int i = 0; i < T->rank && i < 4; i++)
                e->pub.dim[i] = T->dim[i];
            e->pub.numel = (int64_t)tnumel(T);
            e->pub.weight = (float *)taddr(x, (int)c, (int32_t)t, -1);
            e->pub.grad = (float *)taddr(x, (int)c, g, -1);
            e->tensor = (int32_t)t;
            e->grad_tensor = g;
            e->elem = (int64_t)(T->offset / mgc_dtype_size((mgc_dtype)T->dtype));
            e->decay = T->rank >= 2;
            e->expert = T->split_group == MGC_GROUP_EP && T->split_axis == 0;
            e->tp_dup = !e->expert && T->split_axis == MGC_PLAN_NO_SPLIT && x->grid.tp > 1;
            e->shared_copy = tied[t] && !ch->embedding;
            const mgc_plan_tensor *G = &ch->tensors[g];
            e->tp_partial = G->split_axis == MGC_PLAN_NO_SPLIT && G->split_group == MGC_GROUP_TP &&
                            x->grid.tp > 1;
            e->vocab = vocab[t];
            e->glu = glu[t];
            e->scaled = ends_with(nm, "linear_proj.weight") || ends_with(nm, "linear_fc2.weight");
            if (x->kv_share > 1 &&
                (ends_with(nm, "linear_qkv.weight") || ends_with(nm, "linear_qkv.bias"))) {
                /* local rows [a_l q heads | k | v] x d, group-major (partitioning.md) */
                int64_t a_l = x->heads / x->grid.tp, rows = T->dim[0], d = rows / (a_l + 2);
                int64_t K = T->rank > 1 ? e->pub.numel / rows : 1;
                if (T->split_axis != 0 || (a_l + 2) * d != rows) {
                    free(marks);
                    return mgc_exec_fail(x,
                                         "'%s': %" PRId64 " rows are not %" PRId64
                                         " query heads, a key and "
                                         "a value of one group",
                                         nm, rows, a_l);
                }
                e->kv = 1;
                e->kv_lo = e->elem + a_l * d * K;
                e->kv_hi = e->elem + rows * K;
            }
            /* replicated over the expert-tensor ranks (a row-parallel expert bias): its
             * gradient is complete on each, so the norm counts expert-tensor rank 0's */
            e->etp_dup = e->expert && T->split2_axis == MGC_PLAN_NO_SPLIT && x->grid.etp > 1;
        }
        free(marks);
    }
    /* optimizer and norm segments from the buckets, in layout order */
    int64_t ca = 0, cn = 0, cpt = 0, ce = 0, ckv = 0, moment = 0;
    for (int64_t bi = sp->n_buckets - 1; bi >= 0; bi--) {
        const mgc_bucket *B = &sp->buckets[bi];
        int64_t D = B->shards, gr = group_rank_of(x, B->group), piece = (int64_t)B->count / D;
        int64_t lo = (int64_t)B->begin + (D > 1 ? gr * piece : 0), hi = lo + piece;
        int counted = D > 1 || gr == 0; /* replicas over the group count once */
        /* split the owned range at parameter boundaries */
        int64_t at = lo;
        while (at < hi) {
            const pentry *in = NULL;
            int64_t next = hi;
            for (int64_t i = 0; i < x->n_params; i++) {
                const pentry *e = &x->params[i];
                if (e->elem <= at && at < e->elem + e->pub.numel) in = e;
                else if (e->elem > at && e->elem < next) next = e->elem;
            }
            int64_t end = in ? (in->elem + in->pub.numel < hi ? in->elem + in->pub.numel : hi) : next;
            seg s = {at, end - at, moment + (at - lo), in ? in->decay : 0};
            if (seg_push(&x->adam, &x->n_adam, &ca, s)) return mgc_exec_fail(x, "out of memory");
            if (in && counted && !(in->tp_dup && x->co.tp != 0) && !(in->etp_dup && x->co.etp != 0) &&
                !in->shared_copy) {
                /* replicated k/v rows count on the first tensor rank of their group */
                int64_t klo = in->kv && x->co.tp % x->kv_share ? in->kv_lo : end;
                int64_t khi = in->kv && x->co.tp % x->kv_share ? in->kv_hi : end;
                klo = klo < at ? at : klo > end ? end : klo;
                khi = khi < klo ? klo : khi > end ? end : khi;
                seg a = {at, klo - at, s.moment, s.decay};
                seg b = {khi, end - khi, s.moment + (khi - at), s.decay};
                if (seg_push(&x->norm, &x->n_norm, &cn, a) || seg_push(&x->norm, &x->n_norm, &cn, b))
                    return mgc_exec_fail(x, "out of memory");
            }
            at = end;
        }
        moment += piece;
    }
    for (int64_t i = 0; i < x->n_params; i++) {
        const pentry *e = &x->params[i];
        seg s = {e->elem, e->pub.numel, 0, 0};
        if (e->tp_partial && seg_push(&x->partial, &x->n_partial, &cpt, s))
            return mgc_exec_fail(x, "out of memory");
        seg kv = {e->kv_lo, e->kv_hi - e->kv_lo, 0, 0};
        if (e->kv && seg_push(&x->kvsum, &x->n_kvsum, &ckv, kv))
            return mgc_exec_fail(x, "out of memory");
        if (e->vocab && (e->shared_copy || sp->chunks[e->pub.chunk].embedding) &&
            cfg_i(x->plan, "model.tie_embeddings", 0) &&
            seg_push(&x->embed, &x->n_embed, &ce, s))
            return mgc_exec_fail(x, "out of memory");
    }
    x->norm_g = calloc((size_t)(x->n_norm ? x->n_norm : 1), sizeof *x->norm_g);
    x->norm_n = calloc((size_t)(x->n_norm ? x->n_norm : 1), sizeof *x->norm_n);
    x->aw = calloc((size_t)(x->n_adam ? x->n_adam : 1), sizeof *x->aw);
    if (!x->norm_g || !x->norm_n || !x->aw) return mgc_exec_fail(x, "out of memory");
    if (x->m_buf >= 0 && (uint64_t)moment * 4 > sp->buffers[x->m_buf].bytes)
        return mgc_exec_fail(x, "stage %" PRId64 ": optimizer shard of %" PRId64
                        " elements does not fit the adam_m buffer (%" PRIu64 " bytes)",
                     sp->pp_rank, moment, sp->buffers[x->m_buf].bytes);
    return 0;
}

int mgc_exec_check_plan(const mgc_plan *plan, const char *backend, char *err, size_t errsz) {
    int64_t prec = cfg_i(plan, "training.precision", 0);
    if (prec != 0 && !strcmp(backend, "cpu")) {
        snprintf(err, errsz,
                 "the plan computes in %s but the CPU backend computes in fp32: compile with "
                 "--set training.precision=fp32 (or run on a GPU)",
                 prec == 1 ? "bf16" : "fp16");
        return -1;
    }
    return 0;
}

/* The most any one communication of the stage stages (exec_comm.c): a gradient bucket, a
 * pipeline staging buffer, or a collective's send and receive sides together. */
static size_t stage_bytes(const mgc_exec *x) {
    const mgc_stage_program *sp = x->sp;
    uint64_t most = 0;
    for (int64_t b = 0; b < sp->n_buckets; b++)
        if (sp->buckets[b].count * 4 > most) most = sp->buckets[b].count * 4;
    for (int64_t b = 0; b < sp->n_buffers; b++)
        if (sp->buffers[b].kind == MGC_BUF_COMM && sp->buffers[b].bytes > most) most = sp->buffers[b].bytes;
    for (int64_t i = 0; i < x->n_embed; i++)
        if ((uint64_t)x->embed[i].n * 4 > most) most = (uint64_t)x->embed[i].n * 4;
    for (int64_t i = 0; i < x->n_partial; i++)
        if ((uint64_t)x->partial[i].n * 4 > most) most = (uint64_t)x->partial[i].n * 4;
    for (int64_t i = 0; i < x->n_kvsum; i++)
        if ((uint64_t)x->kvsum[i].n * 4 > most) most = (uint64_t)x->kvsum[i].n * 4;
    for (int64_t c = 0; c < sp->n_chunks; c++) {
        const mgc_plan_chunk *ch = &sp->chunks[c];
        for (int pass = 0; pass < 2; pass++) {
            const mgc_plan_op *ops = pass ? ch->bwd : ch->fwd;
            for (int64_t i = 0; i < (pass ? ch->n_bwd : ch->n_fwd); i++) {
                const mgc_plan_op *o = &ops[i];
                if (o->kind < MGC_POP_ALL_REDUCE) continue;
                uint64_t es = mgc_dtype_size((mgc_dtype)o->iattr[2]);
                uint64_t n = ((uint64_t)o->iattr[0] + (uint64_t)o->iattr[1]) * es;
                uint64_t t = ch->tensors[o->in[0]].bytes + ch->tensors[o->out[0]].bytes;
                /* a variable reduce-scatter holds its input and every peer's block for it */
                if (o->kind == MGC_POP_REDUCE_SCATTER && o->n_in > 1)
                    n = 2 * (uint64_t)o->iattr[0] * es, t = 2 * ch->tensors[o->in[0]].bytes;
                if (n > most) most = n;
                if (t > most) most = t;
            }
        }
    }
    return (size_t)most;
}

int mgc_exec_open(mgc_exec **out, const mgc_plan *plan, mgc_comm *world, mgc_backend *be,
                  char *err, size_t errsz) {
    *out = NULL;
    mgc_exec *x = calloc(1, sizeof *x);
    if (!x) {
        snprintf(err, errsz, "out of memory");
        return -1;
    }
    x->plan = plan;
    x->be = be;
    x->world = world;
    x->grid = plan->grid;
    x->rank = mgc_comm_world_rank(world);
    int rc = -1;
    if (!(x->fg = calloc(1, sizeof *x->fg))) {
        mgc_exec_fail(x, "out of memory");
        goto done;
    }
    x->fg->be = be, x->fg->rank = x->rank, x->fg->err = x->err, x->fg->errsz = sizeof x->err;
    if (mgc_comm_size(world) != plan->grid.world) {
        mgc_exec_fail(
            x,
            "the plan is for %" PRId64 " ranks (world = tensor %" PRId64 " x context %" PRId64
            " x data %" PRId64 " x pipeline %" PRId64 ") but %d were launched: run it with "
            "--local-ranks %" PRId64 " or mpirun -np %" PRId64 ", or recompile for %d",
            plan->grid.world, plan->grid.tp, plan->grid.cp, plan->grid.dp, plan->grid.pp,
            mgc_comm_size(world), plan->grid.world, plan->grid.world, mgc_comm_size(world));
        goto done;
    }
    if (mgc_exec_check_plan(plan, be->iface->name, x->err, sizeof x->err)) goto done;
    if (mgc_grid_coords(&x->grid, x->rank, &x->co)) {
        mgc_exec_fail(x, "rank %" PRId64 " is outside the plan's grid", x->rank);
        goto done;
    }
    x->sp = &plan->stages[x->co.pp];
    x->vocab_size = cfg_i(plan, "model.vocab_size", 0);
    x->seq_length = plan->seq_length;
    x->num_layers = cfg_i(plan, "model.num_layers", 1);
    x->dp = plan->grid.dp;
    x->mb_count = plan->num_microbatches;
    x->mbs = plan->micro_batch_size;
    x->seed = (uint64_t)cfg_i(plan, "training.seed", 1234);
    x->init_std = cfg_f(plan, "model.init_method_std", 0.02);
    x->lr = cfg_f(plan, "optimizer.lr", 3e-4);
    x->min_lr = cfg_f(plan, "optimizer.min_lr", 0);
    x->beta1 = cfg_f(plan, "optimizer.beta1", 0.9);
    x->beta2 = cfg_f(plan, "optimizer.beta2", 0.95);
    x->eps = cfg_f(plan, "optimizer.eps", 1e-8);
    x->wd = cfg_f(plan, "optimizer.weight_decay", 0.1);
    x->clip = cfg_f(plan, "optimizer.clip_grad", 1.0);
    x->warmup = cfg_i(plan, "optimizer.warmup_iterations", 0);
    x->iterations = cfg_i(plan, "training.iterations", 1);
    x->decay_iters = cfg_i(plan, "optimizer.decay_iterations", x->iterations);
    x->decay_style = (int)cfg_i(plan, "optimizer.decay_style", 0);
    x->wsd_iters = cfg_i(plan, "optimizer.wsd_decay_iterations", 1);
    x->wsd_style = (int)cfg_i(plan, "optimizer.wsd_decay_style", 0);
    if (cfg_i(plan, "training.precision", 0) == 2)
        mgc_exec_set_loss_scaling(x, cfg_f(plan, "training.initial_loss_scale", 4294967296.0),
                                  cfg_i(plan, "training.loss_scale_window", 1000), cfg_i(plan, "training.hysteresis", 2));
    x->heads = cfg_i(plan, "model.num_attention_heads", 1);
    x->groups = cfg_i(plan, "model.num_query_groups", x->heads);
    x->kv_share = x->groups > 0 && plan->grid.tp > x->groups ? plan->grid.tp / x->groups : 1;
    x->eod_mask = cfg_i(plan, "data.eod_mask_loss", 0) != 0;
    x->eod = cfg_i(plan, "data.eod_token", 256);
    x->router_score = (int32_t)cfg_i(plan, "moe.router_score", 0);
    x->drop_policy = (int32_t)cfg_i(plan, "moe.drop_policy", 0);
    x->moe_E = cfg_i(plan, "moe.num_experts", 0);
    x->moe_L = cfg_i(plan, "model.num_layers", 0);
    x->moe_k = cfg_i(plan, "moe.top_k", 1);
    if (x->moe_E > 0 && x->moe_L > 0) {
        size_t n = (size_t)(x->moe_E * x->moe_L);
        x->moe_local = calloc(n, sizeof *x->moe_local);
        x->moe_counts = calloc(n, sizeof *x->moe_counts);
        if (!x->moe_local || !x->moe_counts) {
            mgc_exec_fail(x, "out of memory");
            goto done;
        }
        double rate = 0;
        if (mgc_plan_config_float(plan, "moe.expert_bias_update_rate", &rate) && rate > 0) {
            x->bias_rate = rate;
            x->moe_bias = calloc(n, sizeof *x->moe_bias);
            x->bias_name = calloc((size_t)x->moe_L, sizeof *x->bias_name);
            if (!x->moe_bias || !x->bias_name) {
                mgc_exec_fail(x, "out of memory");
                goto done;
            }
            for (int64_t s = 0; s < plan->n_stages; s++)
                for (int64_t c = 0; c < plan->stages[s].n_chunks; c++) {
                    const mgc_plan_chunk *ch = &plan->stages[s].chunks[c];
                    for (int64_t t = 0; t < ch->n_tensors; t++) {
                        int64_t l = bias_layer(x, &ch->tensors[t]);
                        if (l >= 0) x->bias_name[l] = mgc_plan_strat(plan, ch->tensors[t].name);
                    }
                }
        }
    }
    x->tok = malloc((size_t)(x->seq_length + 1) * sizeof *x->tok);
    if (!x->tok) {
        mgc_exec_fail(x, "out of memory");
        goto done;
    }
    for (int k = 0; k < MGC_GROUP__COUNT; k++) {
        mgc_comm_status s = mgc_comm_group(world, &x->grid, (mgc_group_kind)k, &x->group[k]);
        if (s != MGC_COMM_OK) {
            mgc_exec_fail_comm(x, world, s, "creating process groups");
            goto done;
        }
    }
    if (x->kv_share > 1) { /* the tensor ranks sharing this rank's key/value group */
        mgc_comm_status s = mgc_comm_split(x->group[MGC_GROUP_TP], x->co.tp / x->kv_share, x->co.tp,
                                           &x->kv_comm);
        if (s != MGC_COMM_OK) {
            mgc_exec_fail_comm(x, x->group[MGC_GROUP_TP], s,
                               "joining the ranks of a key/value group");
            goto done;
        }
    }
    if (be->iface->arena_alloc(be, x->sp->arena_bytes, (void **)&x->arena)) {
        mgc_exec_fail_backend(x, "allocating the arena");
        goto done;
    }
    if (setup_buffers(x) || setup_params(x)) goto done;
    if (be->iface->bind(be, plan, x->sp, x->arena)) {
        mgc_exec_fail_backend(x, "binding the plan to the backend");
        goto done;
    }
    x->fg->staged = be->iface->device_memory && plan->grid.world > 1;
    /* sized once: no growth in a step */
    if (x->fg->staged && !mgc_exec_xcomm_stage(x->fg, stage_bytes(x))) goto done;
    if (mgc_exec_setup_overlap(x) || mgc_exec_setup_sender(x) || setup_fresh(x) ||
        setup_zero_list(x))
        goto done;
    rc = 0;
done:
    if (rc) {
        snprintf(err, errsz, "%s", x->err);
        mgc_exec_free(x);
        return -1;
    }
    *out = x;
    return 0;
}

void mgc_exec_free(mgc_exec *x) {
    if (!x) return;
    mgc_exec_reducer_stop(x);
    mgc_exec_sender_stop(x);
    if (x->fg) mgc_exec_xcomm_release(x->fg);
    free(x->fg);
    free(x->last_bwd_mb);
    free(x->first_bwd_mb);
    for (int64_t c = 0; x->fresh && c < x->sp->n_chunks; c++) free(x->fresh[c]);
    free(x->fresh);
    free(x->zl_off);
    free(x->zl_len);
    free(x->zl_p);
    free(x->ready_op);
    free(x->tpend);
    free(x->moe_local);
    free(x->moe_counts);
    free(x->moe_bias);
    free(x->bias_slot);
    free(x->bias_name);
    for (int k = 0; k < MGC_GROUP__COUNT; k++)
        mgc_comm_free(x->group[k]), mgc_comm_free(x->dgroup[k]);
    mgc_comm_free(x->kv_comm);
    mgc_comm_free(x->d_kv);
    free(x->dev_pairs);
    if (x->arena) x->be->iface->arena_free(x->be, x->arena);
    if (x->chunks)
        for (int64_t c = 0; c < x->sp->n_chunks; c++) {
            free(x->chunks[c].stash);
            for (int k = 0; k < 4; k++)
                free(x->chunks[c].comm[k]);
            free(x->chunks[c].aux_all);
        }
    free(x->chunks);
    free(x->input_buf);
    free(x->params);
    free(x->adam), free(x->norm), free(x->partial), free(x->embed), free(x->kvsum);
    free(x->norm_g), free(x->norm_n), free(x->aw);
    free(x->tok);
    free(x->graph_ok);
    if (x->eval_ops)
        for (int64_t i = 0; i < 2 * x->sp->n_chunks; i++)
            free(x->eval_ops[i]);
    free(x->eval_ops);
    free(x);
}

/* ---- parameter initialisation -------------------------------------------------------- */

/* A standard normal from two counter-based words (Box-Muller). */
static double normal_at(uint64_t seed, uint64_t stream, uint64_t i) {
    uint32_t a = mgc_rng_u32(seed, stream, 2 * i), b = mgc_rng_u32(seed, stream, 2 * i + 1);
    double u1 = ((double)a + 1.0) / 4294967296.0, u2 = (double)b / 4294967296.0;
    return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

/* A tensor's sharded dims: its split and its second split (plan.h), those over a group of
 * more than one rank; returns how many (0..2), axes in a[], groups in g[]. */
static int splits_of(const mgc_exec *x, const mgc_plan_tensor *T, int a[2], uint16_t g[2]) {
    int n = 0;
    if (T->split_axis != MGC_PLAN_NO_SPLIT && T->split_axis < T->rank &&
        group_size_of(x, T->split_group) > 1)
        a[n] = T->split_axis, g[n++] = T->split_group;
    if (T->split2_axis != MGC_PLAN_NO_SPLIT && T->split2_axis < T->rank &&
        group_size_of(x, T->split2_group) > 1)
        a[n] = T->split2_axis, g[n++] = T->split2_group;
    return n;
}

/* A GLU weight's [gate | up] dim (fc1's output: dim 0, an expert's dim 1): each half is split
 * alike over the ranks. */
static int glu_axis(const pentry *e, int a) {
    return e->glu && a == (e->expert ? 1 : 0);
}

/* The global (unpartitioned) row-major index of local element `li` of param e,
 * and its global row along dim 0 (for vocabulary padding). */
static uint64_t global_index(const mgc_exec *x, const pentry *e, const mgc_plan_tensor *T,
                             int64_t li, int64_t *row0) {
    int64_t idx[4] = {0, 0, 0, 0}, gdim[4] = {1, 1, 1, 1};
    int r = T->rank;
    for (int d = r - 1; d >= 0; d--) {
        idx[d] = li % T->dim[d];
        li /= T->dim[d];
        gdim[d] = T->dim[d];
    }
    int ax[2];
    uint16_t grp[2];
    if (e->kv) { /* rows [q of this rank's heads | k | v] of group j = tp / kv_share */
        int64_t a_l = x->heads / x->grid.tp, d = T->dim[0] / (a_l + 2), per = x->heads / x->groups;
        int64_t j = x->co.tp / x->kv_share, in_g = x->co.tp % x->kv_share, i = idx[0];
        gdim[0] = (x->heads + 2 * x->groups) * d;
        idx[0] = j * (per + 2) * d + (i < a_l * d ? in_g * a_l * d + i : per * d + (i - a_l * d));
    }
    for (int s = 0, n = e->kv ? 0 : splits_of(x, T, ax, grp); s < n; s++) {
        int a = ax[s];
        int64_t size = group_size_of(x, grp[s]), g = group_rank_of(x, grp[s]);
        int64_t L = T->dim[a];
        gdim[a] = L * size;
        if (glu_axis(e, a)) {
            int64_t half = L / 2;
            idx[a] = idx[a] < half ? g * half + idx[a] : size * half + g * half + (idx[a] - half);
        } else {
            idx[a] += g * L;
        }
    }
    *row0 = idx[0];
    uint64_t gi = 0;
    for (int d = 0; d < r; d++)
        gi = gi * (uint64_t)gdim[d] + (uint64_t)idx[d];
    return gi;
}

/* Initial values of elements [lo, hi) of param e into host[lo..hi): each element is a pure
 * function of (seed, name, global index), so any split over threads gives the same bits. */
typedef struct {
    const mgc_exec *x;
    const pentry *e;
    const mgc_plan_tensor *T;
    float *host;
    int64_t lo, hi;
} init_job;

static void *init_range(void *arg) {
    const init_job *j = arg;
    const pentry *e = j->e;
    uint64_t stream = mgc_rng_name_hash(e->pub.name);
    double std = j->x->init_std * (e->scaled ? 1.0 / sqrt(2.0 * (double)j->x->num_layers) : 1.0);
    float one = ends_with(e->pub.name, ".weight") ? 1.0f : 0.0f;
    for (int64_t li = j->lo; li < j->hi; li++) {
        if (j->T->rank < 2) { /* norms 1, biases 0 */
            j->host[li] = one;
            continue;
        }
        int64_t row;
        uint64_t gi = global_index(j->x, e, j->T, li, &row);
        if (e->vocab && row >= j->x->vocab_size) j->host[li] = 0.0f;
        else j->host[li] = (float)(std * normal_at(j->x->seed, stream, gi));
    }
    return NULL;
}

/* init_range over all of param e on up to the machine's cores (a 1.5B-parameter model
 * takes minutes on one); a thread that cannot be started leaves its range to this one. */
static void init_fill(const mgc_exec *x, const pentry *e, const mgc_plan_tensor *T, float *host) {
    enum { MAXT = 64 };
    long nc = sysconf(_SC_NPROCESSORS_ONLN);
    int64_t n = e->pub.numel, nt = nc < 1 ? 1 : (nc > MAXT ? MAXT : nc);
    if (nt > n / 65536) nt = n / 65536 > 0 ? n / 65536 : 1;
    init_job jobs[MAXT];
    pthread_t tid[MAXT];
    int started[MAXT] = {0};
    for (int64_t t = 0; t < nt; t++) {
        jobs[t] = (init_job){x, e, T, host, n * t / nt, n * (t + 1) / nt};
        if (t > 0) started[t] = pthread_create(&tid[t], NULL, init_range, &jobs[t]) == 0;
    }
    init_range(&jobs[0]);
    for (int64_t t = 1; t < nt; t++) {
        if (started[t]) pthread_join(tid[t], NULL);
        else init_range(&jobs[t]);
    }
}

int mgc_exec_init_params(mgc_exec *x) {
    int64_t maxn = 0;
    for (int64_t i = 0; i < x->n_params; i++)
        if (x->params[i].pub.numel > maxn) maxn = x->params[i].pub.numel;
    float *host = malloc((size_t)(maxn ? maxn : 1) * sizeof *host);
    if (!host) return mgc_exec_fail(x, "out of memory");
    for (int64_t i = 0; i < x->n_params; i++) {
        const pentry *e = &x->params[i];
        const mgc_plan_tensor *T = &x->sp->chunks[e->pub.chunk].tensors[e->tensor];
        init_fill(x, e, T, host);
        int bad = 0;
        if (!x->w16) {
            bad = x->be->iface->upload(x->be, e->pub.weight, host, (size_t)e->pub.numel * 4);
        } else {
            /* the fp32 master copy of the owned ranges, then 16-bit weights everywhere */
            float *master = (float *)buf_addr(x, x->master_buf);
            for (int64_t si = 0; si < x->n_adam && !bad; si++) {
                const seg *g = &x->adam[si];
                int64_t lo = g->elem > e->elem ? g->elem : e->elem;
                int64_t hi = g->elem + g->n < e->elem + e->pub.numel ? g->elem + g->n : e->elem + e->pub.numel;
                if (lo < hi)
                    bad = x->be->iface->upload(x->be, master + g->moment + (lo - g->elem),
                                               host + (lo - e->elem), (size_t)(hi - lo) * 4);
            }
            uint16_t *h16 = (uint16_t *)host; /* in place: element i only reads i */
            for (int64_t li = 0; li < e->pub.numel; li++)
                h16[li] = x->wdt == MGC_DT_F16 ? mgc_f32_to_f16(host[li]) : mgc_f32_to_bf16(host[li]);
            if (!bad) bad = x->be->iface->upload(x->be, e->pub.weight, h16, (size_t)e->pub.numel * 2);
        }
        if (bad) {
            free(host);
            return mgc_exec_fail_backend(x, "uploading parameters");
        }
    }
    free(host);
    /* the weights are the master copy (fp32); the moments start at zero */
    if (x->m_buf >= 0 && x->be->iface->zero(x->be, buf_addr(x, x->m_buf), x->sp->buffers[x->m_buf].bytes))
        return mgc_exec_fail_backend(x, "zeroing the optimizer state");
    if (x->v_buf >= 0 && x->be->iface->zero(x->be, buf_addr(x, x->v_buf), x->sp->buffers[x->v_buf].bytes))
        return mgc_exec_fail_backend(x, "zeroing the optimizer state");
    return 0;
}

/* ---- checkpoints (exec.h; the file is runtime/checkpoint.c's) ------------------------------- */

/* Local elements from `li` on whose global indices follow one another: to the end of the
 * innermost split axis' block (of the half, in a [gate | up] split), the whole tensor when
 * unsplit. */
static int64_t run_len(const mgc_exec *x, const pentry *e, const mgc_plan_tensor *T, int64_t li) {
    int r = T->rank, ax[2];
    uint16_t grp[2];
    if (e->kv) { /* the query rows, then the key and value rows */
        int64_t q = e->kv_lo - e->elem;
        return li < q ? q - li : e->pub.numel - li;
    }
    int n = splits_of(x, T, ax, grp);
    if (n == 0) return e->pub.numel - li;
    int a = n == 2 && ax[1] > ax[0] ? ax[1] : ax[0];
    int64_t inner = 1;
    for (int d = a + 1; d < r; d++)
        inner *= T->dim[d];
    int64_t L = T->dim[a], ia = (li / inner) % L, end = L;
    if (glu_axis(e, a) && ia < L / 2) end = L / 2;
    return (end - ia) * inner - li % inner;
}

/* The parameter holding flat element `elem` of the weights, or NULL. */
static const pentry *param_at(const mgc_exec *x, int64_t elem) {
    for (int64_t i = 0; i < x->n_params; i++)
        if (x->params[i].elem <= elem && elem < x->params[i].elem + x->params[i].pub.numel)
            return &x->params[i];
    return NULL;
}

/* put (dir 0) or get (dir 1) local elements [lo, hi) of e to / from host[0 ..), run by run */
static int ckpt_runs(const mgc_exec *x, const pentry *e, int array, int64_t lo, int64_t hi, float *host,
                     const mgc_exec_ckpt_io *io, int dir) {
    const mgc_plan_tensor *T = &x->sp->chunks[e->pub.chunk].tensors[e->tensor];
    for (int64_t li = lo; li < hi;) {
        int64_t n = run_len(x, e, T, li), row;
        if (n > hi - li) n = hi - li;
        uint64_t gi = global_index(x, e, T, li, &row);
        int rc = dir == 0 ? io->put(io->ctx, e->pub.name, array, gi, host + (li - lo), n)
                          : io->get(io->ctx, e->pub.name, array, gi, host + (li - lo), n);
        if (rc) return -1;
        li += n;
    }
    return 0;
}

enum { CKPT_PIECE = 1 << 22 }; /* elements moved through host memory at a time */

int mgc_exec_ckpt_save(mgc_exec *x, const mgc_exec_ckpt_io *io) {
    float *host = malloc((size_t)CKPT_PIECE * sizeof *host);
    if (!host) return mgc_exec_fail(x, "out of memory");
    float *master = x->w16 ? (float *)buf_addr(x, x->master_buf) : NULL;
    float *m = x->m_buf >= 0 ? (float *)buf_addr(x, x->m_buf) : NULL;
    float *v = x->v_buf >= 0 ? (float *)buf_addr(x, x->v_buf) : NULL;
    int rc = 0;
    for (int64_t i = 0; i < x->n_norm && !rc; i++) {
        const seg *s = &x->norm[i];
        const pentry *e = param_at(x, s->elem);
        if (!e) continue;
        for (int64_t lo = s->elem; lo < s->elem + s->n && !rc; lo += CKPT_PIECE) {
            int64_t hi = lo + CKPT_PIECE < s->elem + s->n ? lo + CKPT_PIECE : s->elem + s->n;
            size_t bytes = (size_t)(hi - lo) * 4;
            int64_t mo = s->moment + (lo - s->elem);
            for (int a = 0; a < 3 && !rc; a++) {
                if ((a == 1 && !m) || (a == 2 && !v)) continue;
                const float *src = a == 1 ? m + mo : a == 2 ? v + mo
                                   : master ? master + mo : e->pub.weight + (lo - e->elem);
                if (x->be->iface->download(x->be, host, src, bytes))
                    rc = mgc_exec_fail_backend(x, "reading the state to save");
                else if (ckpt_runs(x, e, a, lo - e->elem, hi - e->elem, host, io, 0)) rc = -1;
            }
        }
    }
    /* the expert biases: every rank holds them all, the world's rank 0 writes them */
    for (int64_t l = 0; x->rank == 0 && x->bias_name && l < x->moe_L && !rc; l++)
        if (x->bias_name[l] && io->put(io->ctx, x->bias_name[l], MGC_CKPT_PARAM, 0,
                                       x->moe_bias + l * x->moe_E, x->moe_E))
            rc = -1;
    free(host);
    return rc;
}

int mgc_exec_ckpt_load(mgc_exec *x, const mgc_exec_ckpt_io *io, int params_only) {
    float *host = malloc((size_t)CKPT_PIECE * sizeof *host);
    if (!host) return mgc_exec_fail(x, "out of memory");
    int rc = 0;
    /* the weights, every local element */
    for (int64_t i = 0; i < x->n_params && !rc; i++) {
        const pentry *e = &x->params[i];
        for (int64_t lo = 0; lo < e->pub.numel && !rc; lo += CKPT_PIECE) {
            int64_t hi = lo + CKPT_PIECE < e->pub.numel ? lo + CKPT_PIECE : e->pub.numel;
            if (ckpt_runs(x, e, MGC_CKPT_PARAM, lo, hi, host, io, 1)) {
                rc = -1;
                break;
            }
            int bad;
            if (!x->w16) {
                bad = x->be->iface->upload(x->be, e->pub.weight + lo, host, (size_t)(hi - lo) * 4);
            } else {
                uint16_t *h16 = (uint16_t *)host; /* in place: element j only reads j */
                for (int64_t j = 0; j < hi - lo; j++)
                    h16[j] = x->wdt == MGC_DT_F16 ? mgc_f32_to_f16(host[j]) : mgc_f32_to_bf16(host[j]);
                bad = x->be->iface->upload(x->be, (uint16_t *)e->pub.weight + lo, h16, (size_t)(hi - lo) * 2);
            }
            if (bad) rc = mgc_exec_fail_backend(x, "uploading the resumed weights");
        }
    }
    /* the optimizer shard: the master copy (16-bit weights), m and v; gaps zero */
    float *master = x->w16 ? (float *)buf_addr(x, x->master_buf) : NULL;
    float *m = x->m_buf >= 0 ? (float *)buf_addr(x, x->m_buf) : NULL;
    float *v = x->v_buf >= 0 ? (float *)buf_addr(x, x->v_buf) : NULL;
    if (!rc && ((m && x->be->iface->zero(x->be, m, x->sp->buffers[x->m_buf].bytes)) ||
                (v && x->be->iface->zero(x->be, v, x->sp->buffers[x->v_buf].bytes))))
        rc = mgc_exec_fail_backend(x, "zeroing the optimizer state");
    for (int64_t i = 0; i < x->n_adam && !rc; i++) {
        const seg *s = &x->adam[i];
        const pentry *e = param_at(x, s->elem);
        if (!e) continue;
        for (int64_t lo = s->elem; lo < s->elem + s->n && !rc; lo += CKPT_PIECE) {
            int64_t hi = lo + CKPT_PIECE < s->elem + s->n ? lo + CKPT_PIECE : s->elem + s->n;
            int64_t mo = s->moment + (lo - s->elem);
            for (int a = master ? 0 : 1; a < (params_only ? 1 : 3) && !rc; a++) {
                float *dst = a == 0 ? master + mo : a == 1 ? (m ? m + mo : NULL) : (v ? v + mo : NULL);
                if (!dst) continue;
                if (ckpt_runs(x, e, a, lo - e->elem, hi - e->elem, host, io, 1)) rc = -1;
                else if (x->be->iface->upload(x->be, dst, host, (size_t)(hi - lo) * 4))
                    rc = mgc_exec_fail_backend(x, "uploading the resumed optimizer state");
            }
        }
    }
    /* the expert biases, every layer's on every rank (model state: --init-from takes them too) */
    for (int64_t l = 0; x->bias_name && l < x->moe_L && !rc; l++)
        if (x->bias_name[l] && io->get(io->ctx, x->bias_name[l], MGC_CKPT_PARAM, 0,
                                       x->moe_bias + l * x->moe_E, x->moe_E))
            rc = -1;
    free(host);
    return rc;
}

int64_t mgc_exec_global_batch(const mgc_exec *x) {
    return x->mbs * x->mb_count * x->dp;
}

void mgc_exec_get_resume(const mgc_exec *x, int64_t completed, mgc_exec_resume *r) {
    memset(r, 0, sizeof *r);
    r->iteration = completed;
    r->consumed_samples = x->sample_base + (completed - x->iter_base) * mgc_exec_global_batch(x);
    if (x->ls_on) r->loss_scale = x->ls_scale, r->ls_clean = x->ls_clean, r->ls_left = x->ls_left;
}

void mgc_exec_set_resume(mgc_exec *x, const mgc_exec_resume *r) {
    x->iter_base = r->iteration;
    x->sample_base = r->consumed_samples;
    if (x->ls_on && r->loss_scale > 0)
        x->ls_scale = r->loss_scale, x->ls_clean = r->ls_clean, x->ls_left = r->ls_left;
}

/* ---- gradients' first writes ----------------------------------------------------------
 * The step zeroes the gradient buffer before its first instruction that may touch it.  In a
 * chunk's first backward of the step, an op that is the first of the backward program to touch
 * a gradient tensor finds it zero, and may store the gradient instead of adding into it
 * (mgc_op_call.fresh): the CUDA backend's weight-gradient GEMM then has cuBLASLt's BGRADB
 * write the bias gradient itself, without bias_grad_finish's pass.  Only for a tensor no
 * other gradient tensor of the rank overlaps (the tied embedding's copies, views), of a chunk
 * whose forward writes no gradient.  MGC_GRAD_FRESH=0 turns it off (a debugging switch,
 * docs/runtime.md). */
static int cmp_range(const void *a, const void *b) {
    const uint64_t *p = a, *q = b; /* (offset, end, chunk, tensor) */
    return p[0] < q[0] ? -1 : p[0] > q[0];
}

static int setup_fresh(mgc_exec *x) {
    const mgc_stage_program *sp = x->sp;
    int64_t C = sp->n_chunks;
    x->first_bwd_mb = malloc((size_t)(C ? C : 1) * sizeof *x->first_bwd_mb);
    x->fresh = calloc((size_t)(C ? C : 1), sizeof *x->fresh);
    if (!x->first_bwd_mb || !x->fresh) return mgc_exec_fail(x, "out of memory");
    for (int64_t c = 0; c < C; c++) x->first_bwd_mb[c] = -1;
    for (int64_t i = sp->n_instrs - 1; i >= 0; i--)
        if (sp->instrs[i].op == MGC_I_BACKWARD && sp->instrs[i].chunk < C)
            x->first_bwd_mb[sp->instrs[i].chunk] = sp->instrs[i].mb;
    const char *e = getenv("MGC_GRAD_FRESH");
    if (x->grad_buf < 0 || (e && !strcmp(e, "0"))) return 0;
    /* the gradient tensors' byte ranges, sorted: a tensor that overlaps another is never fresh */
    int64_t n = 0;
    for (int64_t c = 0; c < C; c++)
        for (int64_t t = 0; t < sp->chunks[c].n_tensors; t++)
            n += sp->chunks[c].tensors[t].buffer == x->grad_buf;
    uint64_t *r = malloc((size_t)(n ? n : 1) * 4 * sizeof *r);
    uint8_t **shared = calloc((size_t)(C ? C : 1), sizeof *shared);
    int rc = !r || !shared;
    for (int64_t c = 0; !rc && c < C; c++)
        rc = !(shared[c] = calloc((size_t)(sp->chunks[c].n_tensors ? sp->chunks[c].n_tensors : 1), 1));
    int64_t j = 0;
    for (int64_t c = 0; !rc && c < C; c++)
        for (int64_t t = 0; t < sp->chunks[c].n_tensors; t++) {
            const mgc_plan_tensor *T = &sp->chunks[c].tensors[t];
            if (T->buffer != x->grad_buf) continue;
            uint64_t *q = r + 4 * j++;
            q[0] = T->offset, q[1] = T->offset + T->bytes, q[2] = (uint64_t)c, q[3] = (uint64_t)t;
        }
    if (!rc) qsort(r, (size_t)n, 4 * sizeof *r, cmp_range);
    uint64_t end = 0;
    for (int64_t i = 0; !rc && i < n; i++) { /* overlaps its predecessors' furthest end */
        if (i > 0 && r[4 * i] < end) {
            shared[r[4 * i + 2]][r[4 * i + 3]] = 1;
            for (int64_t k = i - 1; k >= 0 && r[4 * k + 1] > r[4 * i]; k--) shared[r[4 * k + 2]][r[4 * k + 3]] = 1;
        }
        if (r[4 * i + 1] > end) end = r[4 * i + 1];
    }
    for (int64_t c = 0; !rc && c < C; c++) {
        const mgc_plan_chunk *ch = &sp->chunks[c];
        if (x->first_bwd_mb[c] < 0 || ch->n_bwd == 0 || mgc_exec_fwd_writes_grads(x, (int)c))
            continue;
        uint8_t *touched = calloc((size_t)(ch->n_tensors ? ch->n_tensors : 1), 1);
        x->fresh[c] = calloc((size_t)ch->n_bwd, sizeof **x->fresh);
        if (!touched || !x->fresh[c]) {
            free(touched);
            rc = 1;
            break;
        }
        for (int64_t i = 0; i < ch->n_bwd; i++) {
            const mgc_plan_op *op = &ch->bwd[i];
            for (int k = 0; k < op->n_out && k < 32; k++) {
                int32_t t = op->out[k];
                if (t >= 0 && t < ch->n_tensors && ch->tensors[t].buffer == x->grad_buf && !shared[c][t] &&
                    !touched[t])
                    x->fresh[c][i] |= 1u << k;
            }
            for (int k = 0; k < op->n_in; k++)
                if (op->in[k] >= 0 && op->in[k] < ch->n_tensors) touched[op->in[k]] = 1;
            for (int k = 0; k < op->n_out; k++)
                if (op->out[k] >= 0 && op->out[k] < ch->n_tensors) touched[op->out[k]] = 1;
        }
        free(touched);
    }
    for (int64_t c = 0; shared && c < C; c++) free(shared[c]);
    free(shared);
    free(r);
    return rc ? mgc_exec_fail(x, "out of memory") : 0;
}

/* The step's zeroing of the gradients, where the backend stores some first writes whole
 * (backend.h stores_fresh, zero_list): only the complement of those outputs' bytes in the
 * gradient buffer is zeroed, padding between tensors included; the stored ones hold whatever
 * the last step left until their first write of this step overwrites them without reading
 * them.  MGC_ZERO_LIST=0 zeroes the whole buffer (as do backends without the two). */
static int setup_zero_list(mgc_exec *x) {
    const mgc_stage_program *sp = x->sp;
    x->n_zl = -1;
    x->zl_bytes = x->grad_buf >= 0 ? sp->buffers[x->grad_buf].bytes : 0;
    const char *e = getenv("MGC_ZERO_LIST");
    if (!x->fresh || x->grad_buf < 0 || !x->be->iface->stores_fresh || !x->be->iface->zero_list ||
        (e && !strcmp(e, "0")))
        return 0;
    const uint64_t B = sp->buffers[x->grad_buf].bytes;
    int64_t n = 0;
    for (int64_t c = 0; c < sp->n_chunks; c++)
        n += x->fresh[c] ? sp->chunks[c].n_bwd : 0;
    uint64_t *r = malloc((size_t)(2 * (n ? n : 1) * MGC_PLAN_MAX_IO) * sizeof *r);
    if (!r) return mgc_exec_fail(x, "out of memory");
    int64_t m = 0; /* stored ranges (offset, end) */
    for (int64_t c = 0; c < sp->n_chunks; c++) {
        const mgc_plan_chunk *ch = &sp->chunks[c];
        for (int64_t i = 0; x->fresh[c] && i < ch->n_bwd; i++)
            for (int k = 0; k < ch->bwd[i].n_out && k < MGC_PLAN_MAX_IO; k++) {
                if (!(x->fresh[c][i] >> k & 1u) ||
                    !x->be->iface->stores_fresh(x->be, &ch->bwd[i], k))
                    continue;
                const mgc_plan_tensor *T = &ch->tensors[ch->bwd[i].out[k]];
                r[2 * m] = T->offset, r[2 * m + 1] = T->offset + T->bytes;
                m++;
            }
    }
    if (m == 0) {
        free(r);
        return 0;
    }
    qsort(r, (size_t)m, 2 * sizeof *r, cmp_range);
    /* the complement, in fp32 elements (every gradient tensor is fp32 and 4-byte aligned) */
    uint64_t *off = malloc((size_t)(m + 1) * sizeof *off);
    int64_t *len = malloc((size_t)(m + 1) * sizeof *len);
    float **p = malloc((size_t)(m + 1) * sizeof *p);
    if (!off || !len || !p) {
        free(r), free(off), free(len), free(p);
        return mgc_exec_fail(x, "out of memory");
    }
    uint64_t at = 0, zb = 0;
    int64_t z = 0;
    int ok = 1;
    for (int64_t i = 0; i <= m && ok; i++) {
        uint64_t lo = i < m ? r[2 * i] : B, hi = i < m ? r[2 * i + 1] : B;
        ok = lo >= at && hi <= B && lo % 4 == 0 && hi % 4 == 0; /* disjoint, inside, aligned */
        if (ok && lo > at) {
            off[z] = at, len[z] = (int64_t)((lo - at) / 4), zb += lo - at;
            z++;
        }
        at = hi;
    }
    free(r);
    if (!ok) { /* not what setup_fresh hands out: zero everything */
        free(off), free(len), free(p);
        return 0;
    }
    x->zl_off = off, x->zl_len = len, x->zl_p = p, x->n_zl = z, x->zl_bytes = zb;
    return 0;
}
