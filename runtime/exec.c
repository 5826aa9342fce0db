/* exec.c - the executor (exec.h): a rank's instruction stream on a backend
 * and its communicators.  docs/runtime.md describes the numbers it keeps.  The executor's
 * other files: exec_setup.c (opening a stage: buffers, parameters, their initialisation and
 * checkpoint layout, the gradients' first writes), exec_comm.c (communication on device
 * memory, a chunk program's collectives, the device communicator) and exec_overlap.c (the
 * gradient reducer's and the pipeline sender's threads); exec_int.h holds what they share. */
#include "exec_int.h"

#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cpu_ops.h" /* the LR schedule (pure arithmetic, no kernel) */
#include "profile.h"

int mgc_exec_fail(mgc_exec *x, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(x->err, sizeof x->err, fmt, ap);
    va_end(ap);
    return -1;
}

/* Poisons the job on both communicators, so no peer waits on this rank. */
static void job_abort(mgc_exec *x, const char *reason) {
    mgc_comm_abort(x->world, reason);
    if (x->dworld) mgc_comm_abort(x->dworld, reason);
}

int mgc_exec_fail_backend(mgc_exec *x, const char *what) {
    return mgc_exec_fail(x, "rank %" PRId64 ": %s: %s", x->rank, what, x->be->err);
}

int mgc_exec_fail_comm(mgc_exec *x, mgc_comm *c, mgc_comm_status s, const char *what) {
    const char *e = c ? mgc_comm_error(c) : "";
    return mgc_exec_fail(x, "rank %" PRId64 ": %s: %s%s%s", x->rank, what, mgc_comm_status_name(s),
                 e[0] ? ": " : "", e);
}

const char *mgc_exec_error(const mgc_exec *x) {
    return x ? x->err : "";
}
uint64_t mgc_exec_arena_bytes(const mgc_exec *x) {
    return x->sp->arena_bytes;
}
int64_t mgc_exec_rank(const mgc_exec *x) {
    return x->rank;
}
int64_t mgc_exec_param_count(const mgc_exec *x) {
    return x->n_params;
}
uint64_t mgc_exec_zeroed_bytes(const mgc_exec *x) {
    return x->zl_bytes;
}
const mgc_exec_param *mgc_exec_param_at(const mgc_exec *x, int64_t i) {
    return &x->params[i].pub;
}
void mgc_exec_set_op_hooks(mgc_exec *x, mgc_exec_op_hook before, mgc_exec_op_hook after, void *ctx) {
    x->hook_before = before;
    x->hook_after = after;
    x->hook_ctx = ctx;
}

mgc_backend *mgc_exec_backend(const mgc_exec *x) {
    return x->be;
}

/* A program whose kernels' arguments are the same every step: no collective (the
 * communicator runs on the host), no MoE op (the routed sizes come back to the host), and
 * dropout only where the backend reads the step of its Philox streams from its memory
 * (backend.h set_step; `dropout`). */
static int graphable(const mgc_plan_op *ops, int64_t n, int dropout) {
    for (int64_t i = 0; i < n; i++) {
        const mgc_plan_op *o = &ops[i];
        switch ((mgc_plan_op_kind)o->kind) {
        case MGC_POP_MOE_ROUTE:
        case MGC_POP_MOE_DISPATCH:
        case MGC_POP_MOE_COMBINE:
        case MGC_POP_GROUPED_LINEAR:
        case MGC_POP_MOE_ROUTE_BWD:
        case MGC_POP_MOE_DISPATCH_BWD:
        case MGC_POP_MOE_COMBINE_BWD:
        case MGC_POP_GROUPED_LINEAR_DGRAD:
        case MGC_POP_GROUPED_LINEAR_WGRAD: return 0;
        default: {
            int a = mgc_plan_op_dropout_attr(o);
            if (o->kind >= MGC_POP_ALL_REDUCE || (!dropout && a >= 0 && o->fattr[a] > 0)) return 0;
            break;
        }
        }
    }
    return 1;
}

void mgc_exec_set_graphs(mgc_exec *x, int on) {
    x->graphs = 0;
    if (!on || !x->be->iface->graph_begin || !x->be->iface->graph_end) return;
    if (!x->graph_ok) {
        x->graph_ok = calloc((size_t)(2 * x->sp->n_chunks + 1), 1);
        if (!x->graph_ok) return; /* no memory: no graphs, which changes no result */
        int dropout = x->be->iface->set_step != NULL;
        for (int64_t c = 0; c < x->sp->n_chunks; c++) {
            const mgc_plan_chunk *ch = &x->sp->chunks[c];
            x->graph_ok[2 * c] = (uint8_t)graphable(ch->fwd, ch->n_fwd, dropout);
            x->graph_ok[2 * c + 1] = (uint8_t)graphable(ch->bwd, ch->n_bwd, dropout);
        }
    }
    x->graphs = 1;
}

void mgc_exec_set_profile(mgc_exec *x, mgc_profile *p) {
    x->prof = p;
}

void mgc_exec_set_loss_scaling(mgc_exec *x, double initial, int64_t window, int64_t hysteresis) {
    if (!(initial > 0)) {
        x->ls_on = 0;
        x->ls_scale = 1;
        return;
    }
    /* a power of two, so scaling and unscaling are exact */
    int e = 0;
    frexp(initial, &e); /* initial = f * 2^e, f in [0.5, 1) */
    x->ls_on = 1;
    x->ls_scale = ldexp(1.0, e - 1);
    x->ls_window = window > 0 ? window : 1000;
    x->ls_hysteresis = hysteresis > 0 ? hysteresis : 2;
    x->ls_clean = 0;
    x->ls_left = x->ls_hysteresis;
}

double mgc_exec_loss_scale(const mgc_exec *x) {
    return x->ls_on ? x->ls_scale : 1.0;
}

/* Profiling: wait for the backend's queued work, then read the clock, so an
 * asynchronous backend's time lands on the item that queued it.  The ops timed on the
 * device since the last call are read first (prof_op_begin). */
static int prof_clock(mgc_exec *x, double *t_s) {
    if (x->be->iface->sync(x->be)) {
        mgc_exec_fail(x, "rank %" PRId64 ": synchronizing the backend for --profile: %s", x->rank,
                      x->be->err);
        return -1;
    }
    for (int64_t k = 0; k < x->tpend_n; k++) {
        double s = 0;
        if (x->be->iface->time_between(x->be, 2 * k, 2 * k + 1, &s)) {
            x->tpend_n = 0;
            return mgc_exec_fail(x,
                                 "rank %" PRId64 ": reading an op's device time for --profile: %s",
                                 x->rank, x->be->err);
        }
        mgc_profile_add_op(x->prof, x->tpend[k].c, x->tpend[k].pass, x->tpend[k].i, s);
    }
    x->tpend_n = 0;
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    *t_s = (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
    return 0;
}

/* The start of compute op (c, pass, i) under --profile.  With device timers (backend.h
 * time_mark) it queues the op's first timer and returns 0 in *t0: prof_op_end queues the
 * second, and the next prof_clock reads the pair.  Without them it is prof_clock. */
static int prof_op_begin(mgc_exec *x, double *t0) {
    if (!x->be->iface->time_mark) return prof_clock(x, t0);
    *t0 = 0;
    if (x->tpend_n == x->tpend_cap) {
        double t;
        if (x->tpend_cap >= 4096) { /* enough ops pending: read them now, and reuse the timers */
            if (prof_clock(x, &t)) return -1;
        } else {
            int64_t n = x->tpend_cap ? 2 * x->tpend_cap : 256;
            struct tpend *p = realloc(x->tpend, (size_t)n * sizeof *p);
            if (!p)
                return mgc_exec_fail(x, "rank %" PRId64 ": out of memory for --profile's op timers",
                                     x->rank);
            x->tpend = p, x->tpend_cap = n;
        }
    }
    if (x->be->iface->time_mark(x->be, 2 * x->tpend_n))
        return mgc_exec_fail(x, "rank %" PRId64 ": an op's device timer for --profile: %s", x->rank,
                             x->be->err);
    return 0;
}

static int prof_op_end(mgc_exec *x, int c, int pass, int64_t i, double t0) {
    if (!x->be->iface->time_mark) {
        double t1;
        if (prof_clock(x, &t1)) return -1;
        mgc_profile_add_op(x->prof, c, pass, i, t1 - t0);
        return 0;
    }
    if (x->be->iface->time_mark(x->be, 2 * x->tpend_n + 1))
        return mgc_exec_fail(x, "rank %" PRId64 ": an op's device timer for --profile: %s", x->rank,
                             x->be->err);
    x->tpend[x->tpend_n++] = (struct tpend){.c = c, .pass = pass, .i = i};
    return 0;
}

/* ---- data -------------------------------------------------------------------------------- */

/* The routers' expert biases of this stage into microbatch mb's input buffer b. */
static int load_biases(mgc_exec *x, int32_t b) {
    unsigned char *base = buf_addr(x, b);
    for (int64_t i = 0; i < x->n_bias_slots; i++)
        if (x->be->iface->upload(x->be, base + x->bias_slot[i][0],
                                 x->moe_bias + x->bias_slot[i][1] * x->moe_E,
                                 (size_t)x->moe_E * sizeof *x->moe_bias))
            return mgc_exec_fail_backend(x, "loading the expert biases");
    return 0;
}

static int load_batch(mgc_exec *x, int32_t mb, uint32_t what, mgc_sample_fn fn, void *ctx) {
    int32_t b = x->input_buf[mb];
    if (!(what & 7u) && !x->n_bias_slots) return 0; /* the biases, on a stage without routers */
    if (b < 0)
        return mgc_exec_fail(x, "stage %" PRId64 ": no input buffer for microbatch %d",
                             x->sp->pp_rank, mb);
    if ((what & 8u) && load_biases(x, b)) return -1;
    if (!(what & 7u)) return 0;
    int64_t s = x->seq_length, cp = x->grid.cp, sc = s / cp, half = s / (2 * cp), B = x->mbs;
    int64_t *tok = NULL, *lab = NULL;
    float *mask = NULL;
    int32_t *docs = NULL, *ds = NULL;
    size_t n = (size_t)(sc * B);
    unsigned char *host = malloc(n * 24 + (size_t)s * 4 + 64);
    if (!host) return mgc_exec_fail(x, "out of memory");
    tok = (int64_t *)host;
    lab = tok + n;
    mask = (float *)(lab + n);
    docs = (int32_t *)(mask + n);
    ds = docs + n;
    int64_t gbs = B * x->mb_count * x->dp;
    for (int64_t bi = 0; bi < B; bi++) {
        int64_t sample = x->sample_base + (x->iteration - x->iter_base) * gbs +
                         ((int64_t)mb * x->dp + x->co.dp) * B + bi;
        char e[512] = "";
        if (fn(ctx, sample, x->tok, e, sizeof e)) {
            free(host);
            return mgc_exec_fail(x, "rank %" PRId64 ": reading sample %" PRId64 ": %s", x->rank,
                                 sample, e);
        }
        /* documents (data.reset_attention_mask, reset_position_ids): position p's document starts
         * after the last end-of-document token before it (the token itself ends its own) */
        for (int64_t p = 0; p < s; p++)
            ds[p] = p == 0 ? 0 : x->tok[p - 1] == x->eod ? (int32_t)p : ds[p - 1];
        for (int64_t i = 0; i < sc; i++) {
            int64_t p = cp <= 1 ? i : i < half ? x->co.cp * half + i : (2 * cp - 1 - x->co.cp) * half + (i - half);
            docs[i * B + bi] = ds[p];
            tok[i * B + bi] = x->tok[p];
            lab[i * B + bi] = x->tok[p + 1];
            /* Megatron's eod_mask_loss: the prediction made from an end-of-document token (the
             * next document's first token) is not trained on */
            mask[i * B + bi] = x->eod_mask && x->tok[p] == x->eod ? 0.0f : 1.0f;
        }
    }
    unsigned char *base = buf_addr(x, b);
    int rc = 0;
    if ((what & 1) && x->slot_tokens >= 0)
        rc |= x->be->iface->upload(x->be, base + x->slot_tokens, tok, n * 8);
    if ((what & 2) && x->slot_labels >= 0)
        rc |= x->be->iface->upload(x->be, base + x->slot_labels, lab, n * 8);
    if ((what & 2) && x->slot_mask >= 0)
        rc |= x->be->iface->upload(x->be, base + x->slot_mask, mask, n * 4);
    if ((what & 4) && x->slot_docs >= 0)
        rc |= x->be->iface->upload(x->be, base + x->slot_docs, docs, n * 4);
    free(host);
    return rc ? mgc_exec_fail_backend(x, "loading a microbatch") : 0;
}

/* ---- passes ------------------------------------------------------------------------------ */

static int issue_ops(mgc_exec *x, int c, int pass, const mgc_plan_op *ops, int64_t n, int32_t mb,
                     mgc_op_call *callp);

/* The graph key of a program run: the chunk, the pass, the microbatch (its stash slot: the
 * addresses) and the loss gradient's seed (the loss scale); FNV-1a. */
static uint64_t graph_key(int c, int pass, int32_t mb, double dloss) {
    uint64_t v[4] = {(uint64_t)c, (uint64_t)pass, (uint64_t)(uint32_t)mb, 0}, h = 1469598103934665603ull;
    memcpy(&v[3], &dloss, sizeof dloss);
    const unsigned char *p = (const unsigned char *)v;
    for (size_t i = 0; i < sizeof v; i++) h = (h ^ p[i]) * 1099511628211ull;
    return h;
}

/* Runs a chunk's forward (pass 0) or backward (pass 1) ops for microbatch mb: through a
 * recorded graph when the backend has one for it (mgc_exec_set_graphs), else one by one. */
static int run_ops(mgc_exec *x, int c, int pass, const mgc_plan_op *ops, int64_t n, int32_t mb) {
    mgc_op_call call;
    memset(&call, 0, sizeof call);
    call.plan = x->plan;
    call.chunk = &x->sp->chunks[c];
    call.co = x->co;
    call.grid_tp = x->grid.tp;
    call.grid_cp = x->grid.cp;
    call.router_score = x->router_score;
    call.drop_policy = x->drop_policy;
    call.vocab_size = x->vocab_size;
    call.seq_length = x->seq_length;
    call.seed = x->seed;
    call.iteration = x->iteration;
    call.microbatch = (int64_t)mb * x->dp + x->co.dp;
    /* the seed of every loss's gradient, times the loss scale when scaling */
    call.dloss = (x->ls_on ? x->ls_scale : 1.0) / (double)(x->mb_count * x->dp);
    /* the gradients the step has not yet written (issue_ops sets call.fresh per op): a
     * function of (chunk, pass, mb), which the graph key holds */
    /* the last backward of a chunk hands buckets to the reducer: never recorded */
    int hands = pass == 1 && mgc_exec_overlapping(x) && x->last_bwd_mb[c] == mb;
    if (!x->graphs || x->eval || x->prof || x->hook_before || x->hook_after || !x->graph_ok[2 * c + pass] ||
        hands)
        return issue_ops(x, c, pass, ops, n, mb, &call);
    mgc_backend *be = x->be;
    uint64_t key = graph_key(c, pass, mb, call.dloss);
    /* the step of the dropout streams, which a recorded program reads from the backend */
    if (be->iface->set_step && be->iface->set_step(be, x->iteration))
        return mgc_exec_fail_backend(x, "setting the dropout kernels' step");
    int g = be->iface->graph_begin(be, key);
    if (g < 0) return mgc_exec_fail_backend(x, "starting a CUDA graph");
    if (g == 1) { /* replayed */
        x->graph_replays++;
        return 0;
    }
    int rc = issue_ops(x, c, pass, ops, n, mb, &call);
    int e = be->iface->graph_end(be, key, rc != 0);
    if (e == 2) return issue_ops(x, c, pass, ops, n, mb, &call); /* the recording failed */
    if (e < 0 && !rc) return mgc_exec_fail_backend(x, "ending a CUDA graph");
    return rc;
}

/* After a forward dispatch (phase 0): the tokens of this microbatch each expert takes, added
 * to the rank's counts of the op's layer (its name's "layers.N"). */
static int count_experts(mgc_exec *x, const mgc_plan_op *op, const void *counts) {
    const char *nm = sname(x, op->name), *p = strstr(nm, "layers.");
    if (!p) return 0;
    char *end;
    long long layer = strtoll(p + 7, &end, 10);
    if (end == p + 7 || layer < 0 || layer >= x->moe_L) return 0;
    int64_t E = x->moe_E, tmp[256], *buf = E <= 256 ? tmp : malloc((size_t)E * sizeof *buf);
    if (!buf) return mgc_exec_fail(x, "out of memory");
    const int64_t *c = counts; /* device memory (with one rank too): a copy */
    int rc = 0;
    if (x->be->iface->device_memory) {
        c = buf;
        if (x->be->iface->download(x->be, buf, counts, (size_t)E * sizeof *buf))
            c = NULL, rc = mgc_exec_fail_backend(x, "reading the expert counts");
    }
    for (int64_t e = 0; c && e < E; e++)
        x->moe_local[layer * E + e] += c[e];
    if (buf != tmp) free(buf);
    return rc;
}

/* The step's expert counts over the world (each layer's tokens are routed by the ranks of its
 * stage, each rank its own): exact, as two fp32 sums of 12-bit digits. */
static int reduce_expert_counts(mgc_exec *x) {
    size_t n = (size_t)(x->moe_E * x->moe_L);
    float *f = malloc(2 * n * sizeof *f);
    if (!f) return mgc_exec_fail(x, "out of memory");
    for (size_t i = 0; i < n; i++)
        f[i] = (float)(x->moe_local[i] & 4095), f[n + i] = (float)(x->moe_local[i] >> 12);
    mgc_comm_status s = mgc_comm_all_reduce(x->world, f, f, 2 * n, MGC_DT_F32, MGC_COMM_SUM);
    if (s != MGC_COMM_OK) {
        free(f);
        return mgc_exec_fail_comm(x, x->world, s, "expert counts all-reduce");
    }
    for (size_t i = 0; i < n; i++)
        x->moe_counts[i] = (int64_t)f[n + i] * 4096 + (int64_t)f[i], x->moe_local[i] = 0;
    free(f);
    return 0;
}

/* Aux-loss-free balancing (moe.expert_bias_update_rate; DeepSeek-V3, Megatron's
 * get_updated_expert_bias): each MoE layer's expert biases move by the rate towards the step's
 * mean count, up for an expert below it and down above it, none at it. The counts are the
 * world's, exact, so every rank moves its copy alike; the comparison is in integers
 * (sum - E c_e against 0), so no rounding of the mean decides a sign. */
static void update_biases(mgc_exec *x) {
    int64_t E = x->moe_E;
    float rate = (float)x->bias_rate;
    for (int64_t l = 0; l < x->moe_L; l++) {
        if (!x->bias_name[l]) continue;
        const int64_t *c = x->moe_counts + l * E;
        float *b = x->moe_bias + l * E;
        int64_t sum = 0;
        for (int64_t e = 0; e < E; e++)
            sum += c[e];
        for (int64_t e = 0; e < E; e++) {
            int64_t d = sum - E * c[e];
            b[e] += d > 0 ? rate : d < 0 ? -rate : 0.0f;
        }
    }
}

/* Issues the ops one by one to the backend (collectives to the communicator). */
static int issue_ops(mgc_exec *x, int c, int pass, const mgc_plan_op *ops, int64_t n, int32_t mb,
                     mgc_op_call *callp) {
    const mgc_plan_chunk *ch = &x->sp->chunks[c];
    mgc_op_call call = *callp;
    double t0 = 0, t1 = 0;
    int hands = pass == 1 && mgc_exec_overlapping(x) && x->last_bwd_mb[c] == mb;
    if (hands && mgc_exec_hand_over(x, c, -1)) return -1;
    for (int64_t i = 0; i < n; i++) {
        const mgc_plan_op *op = &ops[i];
        if (hands && i > 0 && mgc_exec_hand_over(x, c, (int32_t)i - 1)) return -1;
        if (op->kind >= MGC_POP_ALL_REDUCE) {
            if (x->prof && prof_clock(x, &t0)) return -1;
            if (mgc_exec_run_collective(x, c, op, mb)) return -1;
            if (x->prof) {
                if (prof_clock(x, &t1)) return -1;
                mgc_profile_add_op(x->prof, c, pass, i, t1 - t0);
            }
            continue;
        }
        call.op = op;
        call.fresh = pass == 1 && !x->eval && x->fresh && x->fresh[c] && x->first_bwd_mb[c] == mb
                         ? x->fresh[c][i]
                         : 0;
        for (int k = 0; k < op->n_in; k++)
            if (!(call.in[k] = taddr(x, c, op->in[k], mb)))
                return mgc_exec_fail(x, "'%s' input %d (%s) has no memory", sname(x, op->name), k,
                             sname(x, ch->tensors[op->in[k]].name));
        for (int k = 0; k < op->n_out; k++)
            if (!(call.out[k] = taddr(x, c, op->out[k], mb)))
                return mgc_exec_fail(x, "'%s' output %d (%s) has no memory", sname(x, op->name), k,
                             sname(x, ch->tensors[op->out[k]].name));
        if (x->hook_before) x->hook_before(x->hook_ctx, &call);
        if (x->prof && prof_op_begin(x, &t0)) return -1;
        int orc = x->be->iface->run_op(x->be, &call);
        if (!orc && x->prof && prof_op_end(x, c, pass, i, t0)) return -1;
        if (!orc && x->hook_after) x->hook_after(x->hook_ctx, &call);
        if (!orc && pass == 0 && x->moe_local && !x->eval && op->kind == MGC_POP_MOE_DISPATCH &&
            op->iattr[0] == 0 && op->n_out > 1 && count_experts(x, op, call.out[1]))
            return -1;
        if (orc) {
            char what[300];
            snprintf(what, sizeof what, "%s '%s' (microbatch %d, chunk %d)",
                     mgc_plan_op_name((mgc_plan_op_kind)op->kind), sname(x, op->name), mb, c);
            return mgc_exec_fail_backend(x, what);
        }
    }
    if (hands && n > 0 && mgc_exec_hand_over(x, c, (int32_t)n - 1)) return -1;
    return 0;
}

static int copy_tensor(mgc_exec *x, int c, int32_t t, int32_t mb, int32_t staging, int into) {
    if (t < 0 || staging < 0)
        return mgc_exec_fail(x,
                             "stage %" PRId64 " chunk %d microbatch %d: no boundary staging buffer",
                             x->sp->pp_rank, c, mb);
    void *a = taddr(x, c, t, mb);
    const mgc_plan_tensor *T = &x->sp->chunks[c].tensors[t];
    if (!a) return mgc_exec_fail(x, "boundary tensor '%s' has no memory", sname(x, T->name));
    uint64_t bytes = T->bytes < x->sp->buffers[staging].bytes ? T->bytes : x->sp->buffers[staging].bytes;
    int rc = into ? x->be->iface->copy(x->be, a, buf_addr(x, staging), bytes)
                  : x->be->iface->copy(x->be, buf_addr(x, staging), a, bytes);
    return rc ? mgc_exec_fail_backend(x, "boundary copy") : 0;
}

/* Adds microbatch mb's loss (the mean over its masked tokens) to the step's, on the ranks
 * that report it. */
static int read_loss(mgc_exec *x, int c, int32_t mb) {
    float v[2];
    if (x->be->iface->download(x->be, v, taddr(x, c, x->chunks[c].loss, mb), sizeof v))
        return mgc_exec_fail_backend(x, "reading the loss");
    if (x->co.tp == 0 && x->co.cp == 0) x->loss_sum += v[1] > 0 ? v[0] / v[1] : 0.0;
    return 0;
}

static int forward(mgc_exec *x, int c, int32_t mb) {
    const mgc_plan_chunk *ch = &x->sp->chunks[c];
    chunk_rt *r = &x->chunks[c];
    if (r->in_act >= 0 && copy_tensor(x, c, r->in_act, mb, r->comm[1][mb], 1)) return -1;
    if (run_ops(x, c, 0, x->eval ? x->eval_ops[2 * c] : ch->fwd, ch->n_fwd, mb)) return -1;
    if (r->out_act >= 0 && copy_tensor(x, c, r->out_act, mb, r->comm[0][mb], 0)) return -1;
    float v[2];
    if (r->loss >= 0 && r->loss_pass == 0 && read_loss(x, c, mb)) return -1;
    for (int i = 0; i < r->n_aux_all; i++) {
        int32_t t = r->aux_all[i];
        if (x->be->iface->download(x->be, v, taddr(x, c, t, mb), sizeof v[0]))
            return mgc_exec_fail_backend(x, "reading a MoE loss");
        const char *nm = sname(x, ch->tensors[t].name);
        /* aux: per-rank terms sum to the layer's loss; z: per-rank means average */
        if (strstr(nm, "z_loss")) x->z_sum += v[0] / (double)(x->grid.tp * x->grid.cp);
        else x->aux_sum += v[0];
    }
    return 0;
}

static int backward(mgc_exec *x, int c, int32_t mb) {
    const mgc_plan_chunk *ch = &x->sp->chunks[c];
    chunk_rt *r = &x->chunks[c];
    if (r->out_grad >= 0 && copy_tensor(x, c, r->out_grad, mb, r->comm[3][mb], 1)) return -1;
    if (run_ops(x, c, 1, x->eval ? x->eval_ops[2 * c + 1] : ch->bwd, ch->n_bwd, mb)) return -1;
    if (r->loss >= 0 && r->loss_pass == 1 && read_loss(x, c, mb)) return -1;
    if (r->in_grad >= 0 && copy_tensor(x, c, r->in_grad, mb, r->comm[2][mb], 0)) return -1;
    return 0;
}

/* A pipeline transfer's staging slot (chunk_rt.comm): 0 send_act, 1 recv_act, 2 send_grad,
 * 3 recv_grad; -1 for any other instruction.  Odd: a receive. */
int mgc_exec_comm_slot(uint32_t op) {
    return op == MGC_I_SEND_ACT ? 0 : op == MGC_I_RECV_ACT ? 1 : op == MGC_I_SEND_GRAD ? 2
         : op == MGC_I_RECV_GRAD ? 3 : -1;
}

static int p2p(mgc_exec *x, const mgc_instr *in, int64_t i) {
    int k = mgc_exec_comm_slot(in->op);
    int32_t b = x->chunks[in->chunk].comm[k][in->mb];
    if (b < 0)
        return mgc_exec_fail(x, "stage %" PRId64 ": no staging buffer for a transfer",
                             x->sp->pp_rank);
    mgc_comm *g = x->group[MGC_GROUP_PP];
    size_t n = (size_t)x->sp->buffers[b].bytes;
    char what[160];
    snprintf(what, sizeof what, "%s of microbatch %d chunk %u with pipeline rank %d",
             k == 0 ? "send_act" : k == 1 ? "recv_act" : k == 2 ? "send_grad" : "recv_grad", in->mb,
             in->chunk, in->peer);
    if (x->snd && x->send_overlap && !x->prof) return mgc_exec_sender_p2p(x, in, i, b, what);
    return (k & 1) ? mgc_exec_comm_recv(x->fg, g, buf_addr(x, b), n, in->peer, what)
                   : mgc_exec_comm_send(x->fg, g, buf_addr(x, b), n, in->peer, what);
}

/* ---- gradients and the optimizer ----------------------------------------------------------- */
static int gather_params(mgc_exec *x, uint32_t bi) {
    const mgc_bucket *B = &x->sp->buckets[bi];
    if (B->shards <= 1) return 0;
    mgc_comm *g = x->group[B->group];
    if (mgc_comm_size(g) == 1) return 0;
    size_t piece = (size_t)B->count / (size_t)B->shards;
    size_t es = x->w16 ? 2 : 4;
    unsigned char *base = wptr(x, (int64_t)B->begin);
    return mgc_exec_comm_all_gather(x->fg, g, base + (size_t)mgc_comm_rank(g) * piece * es, base,
                                    piece, (mgc_dtype)x->wdt, "parameter all-gather");
}

static int embed_grads(mgc_exec *x) {
    mgc_comm *g = x->group[MGC_GROUP_EMBED];
    if (!g || mgc_comm_size(g) == 1) return 0;
    for (int64_t i = 0; i < x->n_embed; i++) {
        float *p = gptr(x, x->embed[i].elem);
        if (mgc_exec_comm_all_reduce(x->fg, g, p, p, (size_t)x->embed[i].n, MGC_DT_F32,
                                     MGC_COMM_SUM, "tied embedding gradient all-reduce"))
            return -1;
    }
    return 0;
}

static double lr_at(const mgc_exec *x, int64_t it) {
    mgc_lr_sched s;
    s.max_lr = x->lr;
    s.min_lr = x->min_lr;
    s.warmup_steps = x->warmup;
    s.decay_steps = x->decay_iters;
    s.decay = x->decay_style == 0   ? MGC_LR_COSINE
              : x->decay_style == 1 ? MGC_LR_LINEAR
              : x->decay_style == 3 ? MGC_LR_WSD
                                    : MGC_LR_CONSTANT;
    s.wsd_steps = x->wsd_iters;
    s.wsd_shape = (mgc_lr_wsd_shape)x->wsd_style;
    return mgc_cpu_lr(&s, it);
}

static int optimizer(mgc_exec *x, mgc_step_stats *st) {
    mgc_backend *be = x->be;
    /* gradients partial over TP (norms and the router under SP): sum them */
    for (int64_t i = 0; i < x->n_partial && mgc_comm_size(x->group[MGC_GROUP_TP]) > 1; i++) {
        float *p = gptr(x, x->partial[i].elem);
        if (mgc_exec_comm_all_reduce(x->fg, x->group[MGC_GROUP_TP], p, p, (size_t)x->partial[i].n,
                                     MGC_DT_F32, MGC_COMM_SUM, "partial gradient sum"))
            return -1;
    }
    /* replicated k/v rows: each rank has its own query heads' part; sum over the group's ranks */
    for (int64_t i = 0; i < x->n_kvsum; i++) {
        float *p = gptr(x, x->kvsum[i].elem);
        if (mgc_exec_comm_all_reduce(x->fg, x->kv_comm, p, p, (size_t)x->kvsum[i].n, MGC_DT_F32,
                                     MGC_COMM_SUM, "key/value gradient sum"))
            return -1;
    }
    /* global norm: each element counted on exactly one rank, summed over the world */
    double local = 0;
    for (int64_t i = 0; i < x->n_norm; i++)
        x->norm_g[i] = gptr(x, x->norm[i].elem), x->norm_n[i] = x->norm[i].n;
    if (be->iface->sumsq(be, x->norm_g, x->norm_n, x->n_norm, &local))
        return mgc_exec_fail_backend(x, "gradient norm");
    float part = (float)local, total = 0;
    mgc_comm_status s = mgc_comm_all_reduce(x->world, &part, &total, 1, MGC_DT_F32, MGC_COMM_SUM);
    if (s != MGC_COMM_OK) return mgc_exec_fail_comm(x, x->world, s, "gradient norm all-reduce");
    double norm = sqrt((double)total);
    double unscale = 1.0;
    if (x->ls_on) {
        st->loss_scale = x->ls_scale;
        if (!isfinite(norm)) {
            /* overflow: every rank saw the same world-summed norm, so every rank
             * skips; the scale halves once the hysteresis is used up */
            st->skipped = 1;
            st->grad_norm = norm;
            st->lr = lr_at(x, x->iteration);
            x->ls_clean = 0;
            if (--x->ls_left <= 0) {
                if (x->ls_scale > 1) x->ls_scale *= 0.5;
                x->ls_left = x->ls_hysteresis;
            }
            return 0;
        }
        unscale = 1.0 / x->ls_scale;
        norm *= unscale;
        if (++x->ls_clean >= x->ls_window) {
            x->ls_scale *= 2;
            x->ls_clean = 0;
            x->ls_left = x->ls_hysteresis;
        }
    }
    st->grad_norm = norm;
    double scale = ((x->clip > 0 && norm > x->clip) ? x->clip / (norm + 1e-6) : 1.0) * unscale;
    if (!isfinite(norm))
        return mgc_exec_fail(x, "rank %" PRId64 ": the gradient norm is %g at step %" PRId64
                        ": training diverged (lower optimizer.lr or check the data)",
                     x->rank, norm, x->iteration);
    double lr = lr_at(x, x->iteration);
    st->lr = lr;
    float *m = (float *)buf_addr(x, x->m_buf), *v = (float *)buf_addr(x, x->v_buf);
    for (int64_t i = 0; i < x->n_adam; i++) {
        const seg *g = &x->adam[i];
        mgc_adamw_tensor *t = &x->aw[i];
        t->p = x->w16 ? (float *)buf_addr(x, x->master_buf) + g->moment : wptr(x, g->elem);
        t->copy16 = x->w16 ? (uint16_t *)wptr(x, g->elem) : NULL;
        t->g = gptr(x, g->elem);
        t->m = m + g->moment, t->v = v + g->moment;
        t->n = g->n, t->decay = g->decay;
    }
    mgc_adamw_step as = {lr, x->beta1, x->beta2, x->eps, x->wd, scale, x->iteration + 1, x->wdt};
    if (be->iface->adamw(be, x->aw, x->n_adam, &as)) return mgc_exec_fail_backend(x, "AdamW");
    return 0;
}

/* ---- a step -------------------------------------------------------------------------------- */

/* The chunks' programs with every dropout probability 0, made at the first evaluation. */
static int make_eval_ops(mgc_exec *x) {
    const mgc_stage_program *sp = x->sp;
    x->eval_ops = calloc((size_t)(2 * sp->n_chunks), sizeof *x->eval_ops);
    if (!x->eval_ops) return mgc_exec_fail(x, "out of memory");
    for (int64_t c = 0; c < sp->n_chunks; c++)
        for (int pass = 0; pass < 2; pass++) {
            const mgc_plan_chunk *ch = &sp->chunks[c];
            int64_t n = pass ? ch->n_bwd : ch->n_fwd;
            mgc_plan_op *o = malloc((size_t)(n ? n : 1) * sizeof *o);
            if (!o) return mgc_exec_fail(x, "out of memory");
            if (n) memcpy(o, pass ? ch->bwd : ch->fwd, (size_t)n * sizeof *o);
            for (int64_t i = 0; i < n; i++) {
                int a = mgc_plan_op_dropout_attr(&o[i]);
                if (a >= 0) o[i].fattr[a] = 0;
            }
            x->eval_ops[2 * c + pass] = o;
        }
    return 0;
}

int mgc_exec_eval(mgc_exec *x, int64_t first_sample, mgc_sample_fn fn, void *ctx, mgc_step_stats *st) {
    if (!x->eval_ops && make_eval_ops(x)) {
        job_abort(x, x->err);
        return -1;
    }
    int64_t base = x->sample_base, ibase = x->iter_base, it = x->iteration;
    mgc_profile *prof = x->prof; /* a profile times training steps only */
    x->sample_base = first_sample, x->iter_base = it;
    x->eval = 1, x->prof = NULL;
    int rc = mgc_exec_step(x, it, fn, ctx, st);
    x->eval = 0, x->prof = prof;
    x->sample_base = base, x->iter_base = ibase;
    return rc;
}

/* Whether chunk c's forward program writes the gradient buffer (the zeroing queued beside the
 * forward must be done before such a program; no plan of today's compiler has one). */
int mgc_exec_fwd_writes_grads(const mgc_exec *x, int c) {
    const mgc_plan_chunk *ch = &x->sp->chunks[c];
    for (int64_t i = 0; i < ch->n_fwd; i++)
        for (int k = 0; k < ch->fwd[i].n_out; k++) {
            int32_t t = ch->fwd[i].out[k];
            if (t >= 0 && t < ch->n_tensors && ch->tensors[t].buffer == x->grad_buf) return 1;
        }
    return 0;
}

/* Instruction in may touch the gradients: everything but loading, forward programs that
 * write none, and activation transfers. */
static int touches_grads(const mgc_exec *x, const mgc_instr *in) {
    switch ((mgc_instr_op)in->op) {
    case MGC_I_LOAD_BATCH:
    case MGC_I_SEND_ACT:
    case MGC_I_RECV_ACT: return 0;
    case MGC_I_FORWARD: return mgc_exec_fwd_writes_grads(x, in->chunk);
    default: return 1;
    }
}

int mgc_exec_step(mgc_exec *x, int64_t iteration, mgc_sample_fn fn, void *ctx, mgc_step_stats *st) {
    memset(st, 0, sizeof *st);
    x->iteration = iteration;
    x->loss_sum = x->aux_sum = x->z_sum = 0;
    x->graph_replays = 0;
    x->fg->staged_bytes = 0;
    x->overlapped = 0;
    x->tpend_n = 0; /* a failed step's op timers are not this step's */
    const mgc_stage_program *sp = x->sp;
    double step_t0 = 0, t0 = 0, t1 = 0;
    if (x->prof && prof_clock(x, &step_t0)) {
        job_abort(x, x->err);
        return -1;
    }
    mgc_exec_reducer_reset(x); /* a failed step's reductions have drained */
    x->sends_queued = 0;
    if (x->snd) mgc_exec_sender_drain(x, 0); /* and a failed step's transfers; a new epoch */
    /* the gradients start the step at zero: zeroed beside the forward where the backend can
     * (docs/runtime.md), fenced before the first instruction that may touch them */
    int zpend = 0;
    if (x->n_zl >= 0) { /* only what the first writes do not store (setup_zero_list) */
        unsigned char *base = buf_addr(x, x->grad_buf);
        for (int64_t i = 0; i < x->n_zl; i++)
            x->zl_p[i] = (float *)(base + x->zl_off[i]);
        size_t bytes = sp->buffers[x->grad_buf].bytes;
        if (x->be->iface->zero_list(x->be, base, bytes, x->zl_p, x->zl_len, x->n_zl))
            return mgc_exec_fail_backend(x, "zeroing gradients");
    } else if (x->be->iface->zero_beside) {
        int zr = x->be->iface->zero_beside(x->be, buf_addr(x, x->grad_buf), sp->buffers[x->grad_buf].bytes);
        if (zr < 0) return mgc_exec_fail_backend(x, "zeroing gradients");
        zpend = zr == 0;
    } else if (x->be->iface->zero(x->be, buf_addr(x, x->grad_buf), sp->buffers[x->grad_buf].bytes)) {
        return mgc_exec_fail_backend(x, "zeroing gradients");
    }
    int did_opt = 0;
    for (int64_t i = 0; i < sp->n_instrs; i++) {
        const mgc_instr *in = &sp->instrs[i];
        int rc = 0;
        if (zpend && touches_grads(x, in)) {
            if (x->be->iface->zero_fence(x->be)) {
                mgc_exec_fail_backend(x, "ordering the backward after the gradients' zeroing");
                job_abort(x, x->err);
                return -1;
            }
            zpend = 0;
        }
        if (x->prof && prof_clock(x, &t0)) {
            job_abort(x, x->err);
            return -1;
        }
        if (x->snd &&
            mgc_exec_sender_fence(x, i)) { /* sends whose bytes this instruction may reuse */
            job_abort(x, x->err);
            return -1;
        }
        switch ((mgc_instr_op)in->op) {
        case MGC_I_LOAD_BATCH: rc = load_batch(x, in->mb, in->arg, fn, ctx); break;
        case MGC_I_FORWARD: rc = forward(x, in->chunk, in->mb); break;
        case MGC_I_BACKWARD: rc = backward(x, in->chunk, in->mb); break;
        case MGC_I_SEND_ACT:
        case MGC_I_RECV_ACT:
        case MGC_I_SEND_GRAD:
        case MGC_I_RECV_GRAD: rc = p2p(x, in, i); break;
        case MGC_I_REDUCE_GRADS: rc = x->eval ? 0 : mgc_exec_reduce_grads(x, in->arg); break;
        case MGC_I_EMBED_GRADS: rc = x->eval ? 0 : embed_grads(x); break;
        case MGC_I_OPTIMIZER:
            /* every handed-over bucket is back (each has its REDUCE_GRADS before this) */
            if (!x->eval) rc = (x->red ? mgc_exec_reducer_wait(x, -1) : 0) || optimizer(x, st);
            did_opt = 1;
            break;
        case MGC_I_GATHER_PARAMS: rc = x->eval ? 0 : gather_params(x, in->arg); break;
        default: rc = mgc_exec_fail(x, "instruction %" PRId64 ": unknown op %u", i, in->op);
        }
        if (!rc && x->prof && !(rc = prof_clock(x, &t1))) mgc_profile_add_instr(x->prof, i, t1 - t0);
        if (rc) {
            job_abort(x, x->err);
            return -1;
        }
    }
    if (!did_opt) {
        mgc_exec_fail(x, "stage %" PRId64 ": the schedule has no optimizer step", sp->pp_rank);
        job_abort(x, x->err);
        return -1;
    }
    if (x->snd && mgc_exec_sender_drain(x, 1)) { /* every send of the step has left */
        job_abort(x, x->err);
        return -1;
    }
    /* the step's losses, from the ranks that computed them, to every rank */
    float part[3] = {(float)x->loss_sum, (float)x->aux_sum, (float)x->z_sum}, tot[3];
    /* aux and z are counted on tp/cp ranks alike; keep one data-parallel copy each */
    mgc_comm_status s = mgc_comm_all_reduce(x->world, part, tot, 3, MGC_DT_F32, MGC_COMM_SUM);
    if (s != MGC_COMM_OK) return mgc_exec_fail_comm(x, x->world, s, "loss all-reduce");
    double denom = (double)(x->mb_count * x->dp);
    /* MoE losses were added on every expert-data replica of the dense grid: every rank of a
     * (dp) group computes its own tokens' terms, so the world sum covers each token once */
    st->loss = tot[0] / denom;
    st->aux_loss = tot[1] / denom;
    st->z_loss = tot[2] / denom;
    st->tokens = x->mbs * x->mb_count * x->dp * x->seq_length;
    st->graph_replays = x->graph_replays;
    st->staged_bytes = x->fg->staged_bytes + (x->red ? mgc_exec_reducer_staged(x) : 0);
    st->overlapped_buckets = x->overlapped;
    st->overlapped_sends = x->sends_queued;
    if (x->moe_local && !x->eval) {
        if (reduce_expert_counts(x)) {
            job_abort(x, x->err);
            return -1;
        }
        st->expert_counts = x->moe_counts;
        st->moe_layers = x->moe_L, st->moe_experts = x->moe_E;
        if (x->moe_bias) update_biases(x);
        st->expert_bias = x->moe_bias;
        st->moe_assignments = st->tokens * x->moe_k;
    }
    if (x->prof) {
        if (prof_clock(x, &t1)) {
            job_abort(x, x->err);
            return -1;
        }
        mgc_profile_add_step(x->prof, t1 - step_t0);
    }
    return 0;
}
