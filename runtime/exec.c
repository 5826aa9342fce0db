/* exec.c - the executor (exec.h): a rank's instruction stream on a backend
 * and its communicators.  docs/runtime.md describes the numbers it keeps. */
#include "exec.h"

#include <inttypes.h>
#include <pthread.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cpu_ops.h" /* the LR schedule (pure arithmetic, no kernel) */
#include "half.h"
#include "profile.h"
#include "rng.h"

#define LIN_TIED     1
#define LIN_VOCAB    2
#define PCOLL_MAX      1
#define PCOLL_VARIABLE 16

typedef struct pentry {        /* one parameter of the stage */
    mgc_exec_param pub;
    int32_t tensor, grad_tensor;
    int64_t elem;              /* first element in the flat space */
    uint8_t decay;             /* weight decay applies (2-D and up: not norms, not biases) */
    uint8_t tp_dup;            /* replicated over TP: counted once (tp rank 0) in the norm */
    uint8_t shared_copy;       /* the tied embedding's copy on the last stage: not in the norm */
    uint8_t tp_partial;        /* gradient partial over TP: summed over TP before the norm */
    uint8_t vocab;             /* rows are vocabulary entries (padding rows past vocab_size) */
    uint8_t glu;               /* rows are [gate | up] halves, each split the same way */
    uint8_t expert;            /* split over EP on dim 0 (the expert grid's parameters) */
    uint8_t etp_dup;           /* an expert parameter replicated over ETP: counted once */
    uint8_t kv;                /* a QKV weight or bias whose k/v rows are replicated over the
                                  kv_share tensor ranks of their group (tensor > query groups) */
    int64_t kv_lo, kv_hi;      /* kv: those rows' flat elements [kv_lo, kv_hi) */
    uint8_t scaled;            /* output projection: std / sqrt(2 L) */
} pentry;

typedef struct seg {           /* a range of the flat space */
    int64_t elem, n;
    int64_t moment;            /* adam: offset in the moments */
    int decay;
} seg;

typedef struct chunk_rt {
    int32_t *stash;            /* (mb) buffer index of the stash of (mb, this chunk) */
    int32_t *comm[4];          /* (mb) send_act, recv_act, send_grad, recv_grad staging */
    int32_t in_act, in_grad, out_act, out_grad; /* boundary tensors, -1 when none */
    int32_t loss, aux, z;      /* tensors read after the pass (-1 none) */
    int loss_pass;             /* the pass that writes the loss: 0 forward, 1 backward (the
                                  loss chunks, compiler/losschunk.h) */
    int32_t *aux_all;          /* aux-loss and z-loss tensors (several MoE layers) */
    int n_aux_all;
} chunk_rt;

struct mgc_exec {
    const mgc_plan *plan;
    const mgc_stage_program *sp;
    mgc_backend *be;
    mgc_comm *world;
    mgc_comm *group[MGC_GROUP__COUNT];
    /* mgc_exec_set_device_comm: the device communicator's world, its groups (dgroup[k] for
     * group[k]) and key/value group; NULL without one */
    mgc_comm *dworld, *dgroup[MGC_GROUP__COUNT], *d_kv;
    mgc_comm **dev_pairs; /* (2 (MGC_GROUP__COUNT + 1)) host groups, then their device ones */
    mgc_grid grid;
    mgc_coords co;
    int64_t rank;
    unsigned char *arena;
    chunk_rt *chunks;
    int32_t *input_buf;        /* (mb) INPUT buffer index */
    int64_t slot_tokens, slot_labels, slot_mask; /* byte offsets in an input buffer, -1 none */
    int64_t slot_docs;         /* doc_start (data.reset_attention_mask, reset_position_ids), -1
                                  none */
    int32_t grad_buf, weight_buf, master_buf, m_buf, v_buf;
    int w16;                   /* weights are 16-bit (fp32 master copy in master_buf) */
    int wdt;                   /* the weights' dtype: MGC_DT_F32, MGC_DT_BF16 or MGC_DT_F16 */
    pentry *params;
    int64_t n_params;
    seg *adam, *norm, *partial, *embed, *kvsum;
    int64_t n_adam, n_norm, n_partial, n_embed, n_kvsum;
    /* key/value heads replicated over tensor ranks (tensor > query groups): kv_share consecutive
     * tensor ranks hold each group's k and v rows, and kv_comm joins them to sum those rows'
     * gradients (kvsum) once a step */
    int64_t kv_share, heads, groups;
    mgc_comm *kv_comm;
    /* the optimizer's backend calls: every segment at once (filled each step) */
    const float **norm_g;
    int64_t *norm_n;
    mgc_adamw_tensor *aw;
    /* config */
    int64_t vocab_size, seq_length, num_layers, dp, mb_count, mbs;
    uint64_t seed;
    double init_std, lr, min_lr, beta1, beta2, eps, wd, clip;
    int64_t warmup, decay_iters, iterations;
    int decay_style;
    int64_t wsd_iters;         /* optimizer.wsd_decay_iterations (decay_style wsd) */
    int wsd_style;             /* optimizer.wsd_decay_style */
    int32_t router_score, drop_policy;
    /* MoE load (mgc_step_stats.expert_counts): experts a layer, layers, top-k; this step's
     * local counts (layers x experts) from the dispatches this rank ran, and the step's global
     * ones; NULL for a dense model */
    int64_t moe_E, moe_L, moe_k;
    int64_t *moe_local, *moe_counts;
    /* moe.expert_bias_update_rate: the routers' expert biases (moe_L x moe_E, every layer's on
     * every rank: the updates come from the world's counts), the rate, and this stage's input
     * slots for them (byte offset in an input buffer and layer); the plan's bias names by
     * layer (NULL: a layer without) for checkpoints */
    double bias_rate;
    float *moe_bias;
    int64_t n_bias_slots;
    int64_t (*bias_slot)[2];
    const char **bias_name;
    int eod_mask;              /* data.eod_mask_loss: no loss on tokens predicted from eod */
    int64_t eod;               /* data.eod_token */
    /* dynamic loss scaling (fp16; tests switch it on in any precision) */
    int ls_on;                 /* 1: the losses' gradients are scaled by ls_scale */
    double ls_scale;           /* the current scale (a power of two: unscaling is exact) */
    int64_t ls_window;         /* clean steps before it doubles */
    int64_t ls_hysteresis;     /* overflowing steps tolerated before it halves */
    int64_t ls_clean, ls_left; /* clean steps since the last change; overflows left */
    /* per step */
    double loss_sum, aux_sum, z_sum;
    int64_t graph_replays;
    int64_t iteration;
    int64_t iter_base, sample_base; /* step iter_base reads sample sample_base on (resumed) */
    int eval;                  /* mgc_exec_eval: no dropout, no gradient reduction or update */
    mgc_plan_op **eval_ops;    /* (2 n_chunks) the chunks' programs with dropout off, or NULL */
    int32_t *tok;              /* (seq_length + 1) */
    mgc_exec_op_hook hook_before, hook_after;
    void *hook_ctx;
    mgc_profile *prof;         /* --profile: where the times go; NULL: no timing at all */
    struct tpend {             /* ops timed on the device, read at the next prof_clock: the op */
        int32_t c, pass;       /* (chunk, pass, index) between timers 2k and 2k + 1 */
        int64_t i;
    } *tpend;
    int64_t tpend_n, tpend_cap;
    int graphs;                /* mgc_exec_set_graphs */
    uint8_t *graph_ok;         /* (n_chunks * 2) the chunk's forward / backward qualifies */
    struct xcomm *fg;          /* this thread's communication (staging on device memory) */
    struct reducer *red;       /* the gradient reducer's thread, or NULL (reductions in line) */
    int overlap;               /* mgc_exec_set_grad_overlap */
    struct sender *snd;        /* the pipeline sender's thread, or NULL (transfers in line) */
    int send_overlap;          /* mgc_exec_set_send_overlap */
    int64_t sends_queued;      /* this step's sends handed to the sender */
    int32_t *last_bwd_mb;      /* (n_chunks) the microbatch of the chunk's last BACKWARD, -1 none */
    int32_t *first_bwd_mb;     /* (n_chunks) the microbatch of the chunk's first BACKWARD, -1 none */
    uint32_t **fresh;          /* (n_chunks) NULL, or (n_bwd) each backward op's outputs that are
                                  gradients no earlier op writes (mgc_op_call.fresh) in the
                                  chunk's first backward of a step; setup_fresh */
    int64_t n_zl;              /* the step's zeroing: -1 the whole gradient buffer, else these
                                  n_zl ranges of it, which the first writes do not store
                                  (setup_zero_list) */
    uint64_t *zl_off;          /* (n_zl) their byte offsets in the gradient buffer */
    int64_t *zl_len;           /* (n_zl) their fp32 elements */
    float **zl_p;              /* (n_zl) their addresses, set each step */
    uint64_t zl_bytes;         /* the bytes a step zeroes */
    int32_t *ready_op;         /* (n_buckets) the bucket is final after this op of its chunk's
                                  last backward (-1: before the first); INT32_MIN: at its
                                  REDUCE_GRADS only */
    int64_t overlapped;        /* this step's buckets reduced beside the backward */
    char err[2048];
};

/* the gradient reducer (below, after the gradients' helpers) */
static void reducer_stop(mgc_exec *x);
static int64_t reducer_staged(mgc_exec *x);
static int setup_overlap(mgc_exec *x);
static int setup_fresh(mgc_exec *x);
static int setup_zero_list(mgc_exec *x);
static int fwd_writes_grads(const mgc_exec *x, int c);
static int overlapping(const mgc_exec *x);
static int hand_over(mgc_exec *x, int c, int32_t op);
static int hand_one(mgc_exec *x, int64_t bi);
static int reducer_wait(mgc_exec *x, int64_t bi);
static void reducer_reset(mgc_exec *x);
/* the pipeline sender (below, after the reducer) */
static int setup_sender(mgc_exec *x);
static void sender_stop(mgc_exec *x);
static int sender_p2p(mgc_exec *x, const mgc_instr *in, int64_t i, int32_t b, const char *what);
static int sender_fence(mgc_exec *x, int64_t i);
static int sender_drain(mgc_exec *x, int report);

static int xfail(mgc_exec *x, const char *fmt, ...) {
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

static int be_fail(mgc_exec *x, const char *what) {
    return xfail(x, "rank %" PRId64 ": %s: %s", x->rank, what, x->be->err);
}

static int comm_fail(mgc_exec *x, mgc_comm *c, mgc_comm_status s, const char *what) {
    const char *e = c ? mgc_comm_error(c) : "";
    return xfail(x, "rank %" PRId64 ": %s: %s%s%s", x->rank, what, mgc_comm_status_name(s),
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
        xfail(x, "rank %" PRId64 ": synchronizing the backend for --profile: %s", x->rank, x->be->err);
        return -1;
    }
    for (int64_t k = 0; k < x->tpend_n; k++) {
        double s = 0;
        if (x->be->iface->time_between(x->be, 2 * k, 2 * k + 1, &s)) {
            x->tpend_n = 0;
            return xfail(x, "rank %" PRId64 ": reading an op's device time for --profile: %s", x->rank,
                         x->be->err);
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
            if (!p) return xfail(x, "rank %" PRId64 ": out of memory for --profile's op timers", x->rank);
            x->tpend = p, x->tpend_cap = n;
        }
    }
    if (x->be->iface->time_mark(x->be, 2 * x->tpend_n))
        return xfail(x, "rank %" PRId64 ": an op's device timer for --profile: %s", x->rank, x->be->err);
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
        return xfail(x, "rank %" PRId64 ": an op's device timer for --profile: %s", x->rank, x->be->err);
    x->tpend[x->tpend_n++] = (struct tpend){.c = c, .pass = pass, .i = i};
    return 0;
}

static uint64_t tnumel(const mgc_plan_tensor *t) {
    uint64_t n = 1;
    for (int i = 0; i < t->rank; i++)
        n *= (uint64_t)t->dim[i];
    return n;
}

static const char *sname(const mgc_exec *x, uint32_t off) {
    const char *s = mgc_plan_strat(x->plan, off);
    return s ? s : "?";
}

/* The layer of an expert-bias input (plan.h mgc_plan_expert_bias_layer), else -1. */
static int64_t bias_layer(const mgc_exec *x, const mgc_plan_tensor *T) {
    int64_t l = T->role == MGC_TR_INPUT && !T->view && T->rank == 1 && T->dim[0] == x->moe_E
                    ? mgc_plan_expert_bias_layer(sname(x, T->name))
                    : -1;
    return l < x->moe_L ? l : -1;
}

static int ends_with(const char *s, const char *suffix) {
    size_t a = strlen(s), b = strlen(suffix);
    return a >= b && !strcmp(s + a - b, suffix);
}

/* ---- addresses ---------------------------------------------------------------------- */

static unsigned char *buf_addr(const mgc_exec *x, int32_t b) {
    return x->arena + x->sp->buffers[b].offset;
}

/* Address of tensor t of chunk c while running microbatch mb (NULL: not materialised). */
static void *taddr(const mgc_exec *x, int c, int32_t t, int32_t mb) {
    const mgc_plan_tensor *T = &x->sp->chunks[c].tensors[t];
    if (T->buffer == MGC_PLAN_BUF_STASH) {
        int32_t b = mb >= 0 ? x->chunks[c].stash[mb] : -1;
        return b >= 0 ? buf_addr(x, b) + T->offset : NULL;
    }
    if (T->buffer < 0) return NULL;
    const mgc_buffer *B = &x->sp->buffers[T->buffer];
    if (B->kind == MGC_BUF_INPUT) {
        int32_t b = mb >= 0 ? x->input_buf[mb] : -1;
        return b >= 0 ? buf_addr(x, b) + T->offset : NULL;
    }
    return buf_addr(x, T->buffer) + T->offset;
}

/* ---- communication on device memory --------------------------------------------------
 * The local and mpi communicators read and write host memory.  When the backend's arena is
 * device memory (iface->device_memory), every collective and pipeline transfer goes through
 * one host buffer: the send side is downloaded, the host collective runs on the buffer, and
 * the receive side is uploaded.  The reductions are still the communicator's, in group-rank
 * order, so the numbers are those of a host arena.
 *
 * A thread that communicates has an xcomm: the executor's own thread (x->fg), and the
 * gradient reducer's (below).  The reducer's moves go through the backend's transfer slots
 * (xfer_*), ordered after the compute the executor had issued when it handed the bucket over
 * (`mark`).  The c_* functions are the communicator calls on arena pointers; they return 0, or
 * -1 with k->err set (`what` names the call). */
typedef struct xcomm {
    mgc_backend *be;
    int64_t rank;
    /* the device communicator's handle of each host group (mgc_exec_set_device_comm): the
     * collectives on arena memory go there, never through `host` */
    mgc_comm *const *hosts, *const *devs;
    int n_dev;
    int staged;                /* 1: through `host` */
    int xfer;                  /* stage through the backend's xfer slots, after `mark` */
    void *mark;
    unsigned char *host;       /* the staging buffer (backend host_alloc, or malloc) */
    size_t host_cap;
    int host_pinned;           /* `host` came from the backend's host_alloc */
    int64_t staged_bytes;      /* bytes moved between the arena and `host` */
    char *err;
    size_t errsz;
} xcomm;

static int kfail(xcomm *k, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;
static int kfail(xcomm *k, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(k->err, k->errsz, fmt, ap);
    va_end(ap);
    return -1;
}

static void host_release(xcomm *k) {
    if (!k->host) return;
    if (k->host_pinned) k->be->iface->host_free(k->be, k->host);
    else free(k->host);
    k->host = NULL;
    k->host_cap = 0;
}

/* The staging buffer, at least `bytes` long (NULL with k->err set). */
static unsigned char *stage(xcomm *k, size_t bytes) {
    if (bytes <= k->host_cap) return k->host;
    host_release(k);
    void *p = NULL;
    size_t n = bytes < 256 ? 256 : bytes;
    if (k->be->iface->host_alloc && k->be->iface->host_free) {
        if (k->be->iface->host_alloc(k->be, n, &p)) {
            kfail(k, "rank %" PRId64 ": allocating the host staging buffer for communication: %s",
                  k->rank, k->be->err);
            return NULL;
        }
        k->host_pinned = 1;
    } else {
        if (!(p = malloc(n))) {
            kfail(k, "rank %" PRId64 ": out of memory for a %zu-byte communication staging buffer",
                  k->rank, n);
            return NULL;
        }
        k->host_pinned = 0;
    }
    k->host = p;
    k->host_cap = n;
    return k->host;
}

static int stage_down(xcomm *k, void *host, const void *arena, size_t bytes) {
    k->staged_bytes += (int64_t)bytes;
    if (k->xfer) {
        char e[512];
        if (k->be->iface->xfer_download(k->be, k->mark, host, arena, bytes, e, sizeof e))
            return kfail(k, "rank %" PRId64 ": staging a gradient bucket for its reduction: %s", k->rank, e);
        return 0;
    }
    if (k->be->iface->download(k->be, host, arena, bytes))
        return kfail(k, "rank %" PRId64 ": staging for communication: %s", k->rank, k->be->err);
    return 0;
}
static int stage_up(xcomm *k, void *arena, const void *host, size_t bytes) {
    k->staged_bytes += (int64_t)bytes;
    if (k->xfer) {
        char e[512];
        if (k->be->iface->xfer_upload(k->be, arena, host, bytes, e, sizeof e))
            return kfail(k, "rank %" PRId64 ": returning a reduced gradient bucket: %s", k->rank, e);
        return 0;
    }
    if (k->be->iface->upload(k->be, arena, host, bytes))
        return kfail(k, "rank %" PRId64 ": staging for communication: %s", k->rank, k->be->err);
    return 0;
}

static int c_check(xcomm *k, mgc_comm *g, mgc_comm_status s, const char *what) {
    if (s == MGC_COMM_OK) return 0;
    const char *e = g ? mgc_comm_error(g) : "";
    return kfail(k, "rank %" PRId64 ": %s: %s%s%s", k->rank, what, mgc_comm_status_name(s),
                 e[0] ? ": " : "", e);
}

/* The device communicator's handle for host group g, or NULL (collectives through g). */
static mgc_comm *devof(const xcomm *k, const mgc_comm *g) {
    for (int i = 0; i < k->n_dev; i++)
        if (k->hosts[i] == g) return k->devs[i];
    return NULL;
}

/* 16-bit values (bf16, fp16; comm.h reduces fp32): widened to fp32, reduced in group-rank order
 * as every reduction, and rounded once to their type -- the same bits on every rank, and no
 * rounding between the addends.  scatter: a reduce-scatter of n elements a rank (in holds
 * group size * n), else an all-reduce of n. */
static int c_reduce16(xcomm *k, mgc_comm *g, const void *in, void *out, size_t n, mgc_dtype dt,
                      int scatter, mgc_comm_red red, const char *what) {
    size_t nin = scatter ? n * (size_t)mgc_comm_size(g) : n;
    uint16_t *h = malloc((nin ? nin : 1) * sizeof *h);
    float *f = malloc((nin ? nin : 1) * sizeof *f);
    int rc = -1;
    if (!h || !f) {
        kfail(k, "rank %" PRId64 ": %s: out of memory", k->rank, what);
        goto out;
    }
    if (k->staged) {
        if (stage_down(k, h, in, nin * sizeof *h)) goto out;
    } else {
        memcpy(h, in, nin * sizeof *h);
    }
    for (size_t i = 0; i < nin; i++)
        f[i] = dt == MGC_DT_BF16 ? mgc_bf16_to_f32(h[i]) : mgc_f16_to_f32(h[i]);
    float *mine = scatter ? f + (size_t)mgc_comm_rank(g) * n : f;
    mgc_comm_status st = scatter ? mgc_comm_reduce_scatter(g, f, mine, n, MGC_DT_F32, MGC_COMM_SUM)
                                 : mgc_comm_all_reduce(g, f, f, n, MGC_DT_F32, red);
    if (c_check(k, g, st, what)) goto out;
    for (size_t i = 0; i < n; i++)
        h[i] = dt == MGC_DT_BF16 ? mgc_f32_to_bf16(mine[i]) : mgc_f32_to_f16(mine[i]);
    if (k->staged) rc = stage_up(k, out, h, n * sizeof *h);
    else memcpy(out, h, n * sizeof *h), rc = 0;
out:
    free(h), free(f);
    return rc;
}

static int c_all_reduce(xcomm *k, mgc_comm *g, const void *in, void *out, size_t n, mgc_dtype dt,
                        mgc_comm_red red, const char *what) {
    mgc_comm *d = devof(k, g);
    if (d) return c_check(k, d, mgc_comm_all_reduce(d, in, out, n, dt, red), what);
    if (dt == MGC_DT_BF16 || dt == MGC_DT_F16) return c_reduce16(k, g, in, out, n, dt, 0, red, what);
    if (!k->staged) return c_check(k, g, mgc_comm_all_reduce(g, in, out, n, dt, red), what);
    size_t b = n * mgc_dtype_size(dt);
    unsigned char *h = stage(k, b);
    if (!h || stage_down(k, h, in, b)) return -1;
    if (c_check(k, g, mgc_comm_all_reduce(g, h, h, n, dt, red), what)) return -1;
    return stage_up(k, out, h, b);
}

/* in: (group size * n) elements; out: this rank's n (it may lie inside in). */
static int c_reduce_scatter(xcomm *k, mgc_comm *g, const void *in, void *out, size_t n, mgc_dtype dt,
                            const char *what) {
    mgc_comm *d = devof(k, g);
    if (d) return c_check(k, d, mgc_comm_reduce_scatter(d, in, out, n, dt, MGC_COMM_SUM), what);
    if (dt == MGC_DT_BF16 || dt == MGC_DT_F16)
        return c_reduce16(k, g, in, out, n, dt, 1, MGC_COMM_SUM, what);
    if (!k->staged) return c_check(k, g, mgc_comm_reduce_scatter(g, in, out, n, dt, MGC_COMM_SUM), what);
    size_t b = n * mgc_dtype_size(dt), all = b * (size_t)mgc_comm_size(g);
    unsigned char *h = stage(k, all);
    if (!h || stage_down(k, h, in, all)) return -1;
    unsigned char *mine = h + (size_t)mgc_comm_rank(g) * b;
    if (c_check(k, g, mgc_comm_reduce_scatter(g, h, mine, n, dt, MGC_COMM_SUM), what)) return -1;
    return stage_up(k, out, mine, b);
}

/* in: this rank's n elements (it may be out + rank * n); out: (group size * n). */
static int c_all_gather(xcomm *k, mgc_comm *g, const void *in, void *out, size_t n, mgc_dtype dt,
                        const char *what) {
    mgc_comm *d = devof(k, g);
    if (d) return c_check(k, d, mgc_comm_all_gather(d, in, out, n, dt), what);
    if (!k->staged) return c_check(k, g, mgc_comm_all_gather(g, in, out, n, dt), what);
    size_t b = n * mgc_dtype_size(dt), all = b * (size_t)mgc_comm_size(g);
    unsigned char *h = stage(k, all);
    if (!h) return -1;
    unsigned char *mine = h + (size_t)mgc_comm_rank(g) * b;
    if (stage_down(k, mine, in, b)) return -1;
    if (c_check(k, g, mgc_comm_all_gather(g, mine, h, n, dt), what)) return -1;
    return stage_up(k, out, h, all);
}

/* Packed all-to-all-v: cnt[0..size) send counts, cnt[size..2 size) receive counts. */
static int c_all_to_all(xcomm *k, mgc_comm *g, const void *in, void *out, const size_t *cnt,
                        mgc_dtype dt, const char *what) {
    int size = mgc_comm_size(g);
    mgc_comm *d = devof(k, g);
    if (d)
        return c_check(k, d, mgc_comm_all_to_all_v(d, in, cnt, NULL, out, cnt + size, NULL, dt),
                       what);
    if (!k->staged)
        return c_check(k, g, mgc_comm_all_to_all_v(g, in, cnt, NULL, out, cnt + size, NULL, dt), what);
    size_t es = mgc_dtype_size(dt), sb = 0, rb = 0;
    for (int j = 0; j < size; j++)
        sb += cnt[j] * es, rb += cnt[size + j] * es;
    unsigned char *h = stage(k, sb + rb);
    if (!h || stage_down(k, h, in, sb)) return -1;
    if (c_check(k, g, mgc_comm_all_to_all_v(g, h, cnt, NULL, h + sb, cnt + size, NULL, dt), what))
        return -1;
    return stage_up(k, out, h + sb, rb);
}

/* Variable all-gather: group rank j holds per[j] elements; out = their concatenation in
 * group-rank order (an all-to-all that sends this rank's elements to every peer). */
static int c_all_gather_v(xcomm *k, mgc_comm *g, const void *in, void *out, const size_t *per,
                          mgc_dtype dt, const char *what) {
    int size = mgc_comm_size(g), me = mgc_comm_rank(g);
    size_t es = mgc_dtype_size(dt), rb = 0;
    size_t *sc = calloc((size_t)(2 * size), sizeof *sc);
    if (!sc) return kfail(k, "rank %" PRId64 ": %s: out of memory", k->rank, what);
    size_t *sd = sc + size; /* every peer reads the same elements: displacements 0 */
    for (int j = 0; j < size; j++)
        sc[j] = per[me], rb += per[j] * es;
    int rc;
    mgc_comm *d = devof(k, g);
    if (d || !k->staged) {
        mgc_comm *on = d ? d : g;
        rc = c_check(k, on, mgc_comm_all_to_all_v(on, in, sc, sd, out, per, NULL, dt), what);
    } else {
        size_t sb = per[me] * es;
        unsigned char *h = stage(k, sb + rb);
        rc = !h || stage_down(k, h, in, sb) ||
                     c_check(k, g, mgc_comm_all_to_all_v(g, h, sc, sd, h + sb, per, NULL, dt), what)
                 ? -1
                 : stage_up(k, out, h + sb, rb);
    }
    free(sc);
    return rc;
}

/* Variable reduce-scatter: in holds, in group-rank order, per[j] elements for each group rank
 * j (partial sums); this rank receives the sum of its block over the group, added in
 * group-rank order in fp32 (16-bit types rounded once), as every reduction (comm.h
 * mgc_comm_reduce_scatter_v). */
static int c_reduce_scatter_v(xcomm *k, mgc_comm *g, const void *in, void *out, const size_t *per,
                              mgc_dtype dt, const char *what) {
    int size = mgc_comm_size(g), me = mgc_comm_rank(g);
    mgc_comm *d = devof(k, g);
    if (d || !k->staged) {
        mgc_comm *on = d ? d : g;
        return c_check(k, on, mgc_comm_reduce_scatter_v(on, in, per, out, dt, MGC_COMM_SUM), what);
    }
    size_t es = mgc_dtype_size(dt), sb = 0;
    for (int j = 0; j < size; j++)
        sb += per[j] * es;
    unsigned char *h = stage(k, sb + per[me] * es);
    if (!h || stage_down(k, h, in, sb)) return -1;
    if (c_check(k, g, mgc_comm_reduce_scatter_v(g, h, per, h + sb, dt, MGC_COMM_SUM), what))
        return -1;
    return stage_up(k, out, h + sb, per[me] * es);
}

static int c_broadcast(xcomm *k, mgc_comm *g, void *buf, size_t n, mgc_dtype dt, const char *what) {
    mgc_comm *d = devof(k, g);
    if (d) return c_check(k, d, mgc_comm_broadcast(d, buf, n, dt, 0), what);
    if (!k->staged) return c_check(k, g, mgc_comm_broadcast(g, buf, n, dt, 0), what);
    size_t b = n * mgc_dtype_size(dt);
    unsigned char *h = stage(k, b);
    if (!h || (mgc_comm_rank(g) == 0 && stage_down(k, h, buf, b))) return -1;
    if (c_check(k, g, mgc_comm_broadcast(g, h, n, dt, 0), what)) return -1;
    return mgc_comm_rank(g) == 0 ? 0 : stage_up(k, buf, h, b);
}

static int c_send(xcomm *k, mgc_comm *g, const void *buf, size_t bytes, int peer, const char *what) {
    mgc_comm *d = devof(k, g);
    if (d) return c_check(k, d, mgc_comm_send(d, buf, bytes, MGC_DT_U8, peer), what);
    if (!k->staged) return c_check(k, g, mgc_comm_send(g, buf, bytes, MGC_DT_U8, peer), what);
    unsigned char *h = stage(k, bytes);
    if (!h || stage_down(k, h, buf, bytes)) return -1;
    return c_check(k, g, mgc_comm_send(g, h, bytes, MGC_DT_U8, peer), what);
}

static int c_recv(xcomm *k, mgc_comm *g, void *buf, size_t bytes, int peer, const char *what) {
    mgc_comm *d = devof(k, g);
    if (d) return c_check(k, d, mgc_comm_recv(d, buf, bytes, MGC_DT_U8, peer), what);
    if (!k->staged) return c_check(k, g, mgc_comm_recv(g, buf, bytes, MGC_DT_U8, peer), what);
    unsigned char *h = stage(k, bytes);
    if (!h || c_check(k, g, mgc_comm_recv(g, h, bytes, MGC_DT_U8, peer), what)) return -1;
    return stage_up(k, buf, h, bytes);
}

/* A small arena array the executor reads on the host (row counts, token counts): the
 * address itself on a host arena, else a copy in `tmp`. */
static const void *host_view(xcomm *k, const void *arena, void *tmp, size_t bytes) {
    if (!k->staged) return arena;
    return stage_down(k, tmp, arena, bytes) ? NULL : tmp;
}

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
    if (!x->chunks || !x->input_buf) return xfail(x, "out of memory");
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
            return xfail(x, "out of memory");
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
            return xfail(x, "stage %" PRId64 " chunk %" PRId64 ": too few tensors for its boundary",
                         sp->pp_rank, c);
        /* the loss: the (sum, count) pair of role loss some op writes (the cross-entropy's
         * root, its CP all-reduce, or the loss chunks' last sum in the backward) */
        r->aux_all = calloc((size_t)(ch->n_fwd + 1), sizeof *r->aux_all);
        if (!r->aux_all) return xfail(x, "out of memory");
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
                return xfail(x, "stage %" PRId64 ": input '%s' is stashed; this runtime reads "
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
                if (!g) return xfail(x, "out of memory");
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
    if (!x->params) return xfail(x, "out of memory");
    for (int64_t c = 0; c < sp->n_chunks; c++) {
        const mgc_plan_chunk *ch = &sp->chunks[c];
        uint8_t *marks = calloc((size_t)(3 * ch->n_tensors + 3), 1);
        if (!marks) return xfail(x, "out of memory");
        uint8_t *glu = marks, *vocab = marks + ch->n_tensors, *tied = marks + 2 * ch->n_tensors;
        mark_param_uses(x, (int)c, glu, vocab, tied);
        for (int64_t t = 0; t < ch->n_tensors; t++) {
            const mgc_plan_tensor *T = &ch->tensors[t];
            if (T->role != MGC_TR_PARAM) continue;
            if (T->buffer < 0) continue; /* not used on this stage */
            if (T->buffer != x->weight_buf ||
                (T->dtype != MGC_DT_F32 && T->dtype != MGC_DT_BF16 && T->dtype != MGC_DT_F16)) {
                free(marks);
                return xfail(x, "stage %" PRId64 ": parameter '%s' is not an fp32, bf16 or fp16 "
                                "weight in the weights buffer",
                             sp->pp_rank, sname(x, T->name));
            }
            x->wdt = T->dtype;
            x->w16 = T->dtype != MGC_DT_F32;
            if (x->w16 && x->master_buf < 0) {
                free(marks);
                return xfail(x, "stage %" PRId64 ": %s weights without a master_weights buffer",
                             sp->pp_rank, mgc_dtype_name((mgc_dtype)T->dtype));
            }
            int32_t g = -1;
            if (t + 1 < ch->n_tensors && ch->tensors[t + 1].role == MGC_TR_GRAD) g = (int32_t)t + 1;
            if (g < 0 || ch->tensors[g].buffer != x->grad_buf) {
                free(marks);
                return xfail(x, "stage %" PRId64 ": parameter '%s' has no gradient after it",
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
                    return xfail(x, "'%s': %" PRId64 " rows are not %" PRId64 " query heads, a key and "
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
            if (seg_push(&x->adam, &x->n_adam, &ca, s)) return xfail(x, "out of memory");
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
                    return xfail(x, "out of memory");
            }
            at = end;
        }
        moment += piece;
    }
    for (int64_t i = 0; i < x->n_params; i++) {
        const pentry *e = &x->params[i];
        seg s = {e->elem, e->pub.numel, 0, 0};
        if (e->tp_partial && seg_push(&x->partial, &x->n_partial, &cpt, s))
            return xfail(x, "out of memory");
        seg kv = {e->kv_lo, e->kv_hi - e->kv_lo, 0, 0};
        if (e->kv && seg_push(&x->kvsum, &x->n_kvsum, &ckv, kv)) return xfail(x, "out of memory");
        if (e->vocab && (e->shared_copy || sp->chunks[e->pub.chunk].embedding) &&
            cfg_i(x->plan, "model.tie_embeddings", 0) &&
            seg_push(&x->embed, &x->n_embed, &ce, s))
            return xfail(x, "out of memory");
    }
    x->norm_g = calloc((size_t)(x->n_norm ? x->n_norm : 1), sizeof *x->norm_g);
    x->norm_n = calloc((size_t)(x->n_norm ? x->n_norm : 1), sizeof *x->norm_n);
    x->aw = calloc((size_t)(x->n_adam ? x->n_adam : 1), sizeof *x->aw);
    if (!x->norm_g || !x->norm_n || !x->aw) return xfail(x, "out of memory");
    if (x->m_buf >= 0 && (uint64_t)moment * 4 > sp->buffers[x->m_buf].bytes)
        return xfail(x, "stage %" PRId64 ": optimizer shard of %" PRId64
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

/* The most any one communication of the stage stages (c_* above): a gradient bucket, a
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
        xfail(x, "out of memory");
        goto done;
    }
    x->fg->be = be, x->fg->rank = x->rank, x->fg->err = x->err, x->fg->errsz = sizeof x->err;
    if (mgc_comm_size(world) != plan->grid.world) {
        xfail(x, "the plan is for %" PRId64 " ranks (world = tensor %" PRId64 " x context %" PRId64
                 " x data %" PRId64 " x pipeline %" PRId64 ") but %d were launched: run it with "
                 "--local-ranks %" PRId64 " or mpirun -np %" PRId64 ", or recompile for %d",
              plan->grid.world, plan->grid.tp, plan->grid.cp, plan->grid.dp, plan->grid.pp,
              mgc_comm_size(world), plan->grid.world, plan->grid.world, mgc_comm_size(world));
        goto done;
    }
    if (mgc_exec_check_plan(plan, be->iface->name, x->err, sizeof x->err)) goto done;
    if (mgc_grid_coords(&x->grid, x->rank, &x->co)) {
        xfail(x, "rank %" PRId64 " is outside the plan's grid", x->rank);
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
            xfail(x, "out of memory");
            goto done;
        }
        double rate = 0;
        if (mgc_plan_config_float(plan, "moe.expert_bias_update_rate", &rate) && rate > 0) {
            x->bias_rate = rate;
            x->moe_bias = calloc(n, sizeof *x->moe_bias);
            x->bias_name = calloc((size_t)x->moe_L, sizeof *x->bias_name);
            if (!x->moe_bias || !x->bias_name) {
                xfail(x, "out of memory");
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
        xfail(x, "out of memory");
        goto done;
    }
    for (int k = 0; k < MGC_GROUP__COUNT; k++) {
        mgc_comm_status s = mgc_comm_group(world, &x->grid, (mgc_group_kind)k, &x->group[k]);
        if (s != MGC_COMM_OK) {
            comm_fail(x, world, s, "creating process groups");
            goto done;
        }
    }
    if (x->kv_share > 1) { /* the tensor ranks sharing this rank's key/value group */
        mgc_comm_status s = mgc_comm_split(x->group[MGC_GROUP_TP], x->co.tp / x->kv_share, x->co.tp,
                                           &x->kv_comm);
        if (s != MGC_COMM_OK) {
            comm_fail(x, x->group[MGC_GROUP_TP], s, "joining the ranks of a key/value group");
            goto done;
        }
    }
    if (be->iface->arena_alloc(be, x->sp->arena_bytes, (void **)&x->arena)) {
        be_fail(x, "allocating the arena");
        goto done;
    }
    if (setup_buffers(x) || setup_params(x)) goto done;
    if (be->iface->bind(be, plan, x->sp, x->arena)) {
        be_fail(x, "binding the plan to the backend");
        goto done;
    }
    x->fg->staged = be->iface->device_memory && plan->grid.world > 1;
    /* sized once: no growth in a step */
    if (x->fg->staged && !stage(x->fg, stage_bytes(x))) goto done;
    if (setup_overlap(x) || setup_sender(x) || setup_fresh(x) || setup_zero_list(x)) goto done;
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
    reducer_stop(x);
    sender_stop(x);
    if (x->fg) host_release(x->fg);
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
    if (!host) return xfail(x, "out of memory");
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
            return be_fail(x, "uploading parameters");
        }
    }
    free(host);
    /* the weights are the master copy (fp32); the moments start at zero */
    if (x->m_buf >= 0 && x->be->iface->zero(x->be, buf_addr(x, x->m_buf), x->sp->buffers[x->m_buf].bytes))
        return be_fail(x, "zeroing the optimizer state");
    if (x->v_buf >= 0 && x->be->iface->zero(x->be, buf_addr(x, x->v_buf), x->sp->buffers[x->v_buf].bytes))
        return be_fail(x, "zeroing the optimizer state");
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
    if (!host) return xfail(x, "out of memory");
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
                if (x->be->iface->download(x->be, host, src, bytes)) rc = be_fail(x, "reading the state to save");
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
    if (!host) return xfail(x, "out of memory");
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
            if (bad) rc = be_fail(x, "uploading the resumed weights");
        }
    }
    /* the optimizer shard: the master copy (16-bit weights), m and v; gaps zero */
    float *master = x->w16 ? (float *)buf_addr(x, x->master_buf) : NULL;
    float *m = x->m_buf >= 0 ? (float *)buf_addr(x, x->m_buf) : NULL;
    float *v = x->v_buf >= 0 ? (float *)buf_addr(x, x->v_buf) : NULL;
    if (!rc && ((m && x->be->iface->zero(x->be, m, x->sp->buffers[x->m_buf].bytes)) ||
                (v && x->be->iface->zero(x->be, v, x->sp->buffers[x->v_buf].bytes))))
        rc = be_fail(x, "zeroing the optimizer state");
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
                    rc = be_fail(x, "uploading the resumed optimizer state");
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

/* ---- data -------------------------------------------------------------------------------- */

/* The routers' expert biases of this stage into microbatch mb's input buffer b. */
static int load_biases(mgc_exec *x, int32_t b) {
    unsigned char *base = buf_addr(x, b);
    for (int64_t i = 0; i < x->n_bias_slots; i++)
        if (x->be->iface->upload(x->be, base + x->bias_slot[i][0],
                                 x->moe_bias + x->bias_slot[i][1] * x->moe_E,
                                 (size_t)x->moe_E * sizeof *x->moe_bias))
            return be_fail(x, "loading the expert biases");
    return 0;
}

static int load_batch(mgc_exec *x, int32_t mb, uint32_t what, mgc_sample_fn fn, void *ctx) {
    int32_t b = x->input_buf[mb];
    if (!(what & 7u) && !x->n_bias_slots) return 0; /* the biases, on a stage without routers */
    if (b < 0) return xfail(x, "stage %" PRId64 ": no input buffer for microbatch %d", x->sp->pp_rank, mb);
    if ((what & 8u) && load_biases(x, b)) return -1;
    if (!(what & 7u)) return 0;
    int64_t s = x->seq_length, cp = x->grid.cp, sc = s / cp, half = s / (2 * cp), B = x->mbs;
    int64_t *tok = NULL, *lab = NULL;
    float *mask = NULL;
    int32_t *docs = NULL, *ds = NULL;
    size_t n = (size_t)(sc * B);
    unsigned char *host = malloc(n * 24 + (size_t)s * 4 + 64);
    if (!host) return xfail(x, "out of memory");
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
            return xfail(x, "rank %" PRId64 ": reading sample %" PRId64 ": %s", x->rank, sample, e);
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
    return rc ? be_fail(x, "loading a microbatch") : 0;
}

/* ---- collectives of a chunk program --------------------------------------------------- */

/* Per-peer element counts of a variable all-to-all: block j of `counts`
 * (rows per (peer, local expert)) summed, times the row width. */
static int a2a_counts(const int64_t *counts, int64_t n_counts, int peers, int64_t width,
                      size_t *out) {
    if (n_counts % peers) return -1;
    int64_t per = n_counts / peers;
    for (int j = 0; j < peers; j++) {
        int64_t s = 0;
        for (int64_t e = 0; e < per; e++)
            s += counts[j * per + e];
        out[j] = (size_t)(s * width);
    }
    return 0;
}

/* Elements each group rank holds in a variable all-gather or reduce-scatter: in[1]'s row
 * counts (size x the experts, group-rank order) summed per rank, times the row width. */
static int var_counts(mgc_exec *x, int c, const mgc_plan_op *op, int32_t mb, int size, size_t *per) {
    const mgc_plan_chunk *ch = &x->sp->chunks[c];
    if (op->n_in < 2 || op->in[1] < 0)
        return xfail(x, "'%s': a variable collective without its row counts", sname(x, op->name));
    const mgc_plan_tensor *t = &ch->tensors[op->in[0]], *ct = &ch->tensors[op->in[1]];
    if (ct->dtype != MGC_DT_I64)
        return xfail(x, "'%s': row counts are %s, not int64", sname(x, op->name),
                     mgc_dtype_name((mgc_dtype)ct->dtype));
    size_t nc = (size_t)tnumel(ct);
    int64_t *tmp = malloc((nc ? nc : 1) * sizeof *tmp);
    const void *cd = taddr(x, c, op->in[1], mb);
    if (!tmp) return xfail(x, "out of memory");
    if (!cd) {
        free(tmp);
        return xfail(x, "'%s': row counts not materialised", sname(x, op->name));
    }
    const int64_t *a = host_view(x->fg, cd, tmp, nc * sizeof *tmp);
    int rc = 0;
    if (!a) rc = -1; /* the download failed: x->err says why */
    else if (a2a_counts(a, (int64_t)nc, size, t->dim[t->rank - 1], per))
        rc = xfail(x, "'%s': %zu row counts do not split over %d ranks", sname(x, op->name), nc, size);
    else
        for (size_t i = 0; i < nc; i++)
            if (a[i] < 0) rc = xfail(x, "'%s': a negative row count", sname(x, op->name));
    free(tmp);
    return rc;
}

static int run_collective(mgc_exec *x, int c, const mgc_plan_op *op, int32_t mb) {
    const mgc_plan_chunk *ch = &x->sp->chunks[c];
    mgc_comm *g = op->group < MGC_GROUP__COUNT ? x->group[op->group] : NULL;
    if (!g) return xfail(x, "rank %" PRId64 ": '%s' needs a %s group this rank is not in", x->rank,
                         sname(x, op->name), mgc_group_name((mgc_group_kind)op->group));
    void *in = taddr(x, c, op->in[0], mb), *out = taddr(x, c, op->out[0], mb);
    if (!in || !out) return xfail(x, "'%s': tensor not materialised", sname(x, op->name));
    mgc_dtype dt = (mgc_dtype)op->iattr[2];
    size_t n_in = (size_t)op->iattr[0], n_out = (size_t)op->iattr[1];
    int size = mgc_comm_size(g);
    if (size == 1) { /* a group of one: the identity, on the backend's memory */
        size_t n = n_in < n_out ? n_in : n_out;
        if (in != out && x->be->iface->copy(x->be, out, in, n * mgc_dtype_size(dt)))
            return be_fail(x, "a one-rank collective");
        return 0;
    }
    char what[300];
    snprintf(what, sizeof what, "%s '%s' (microbatch %d, chunk %d)",
             mgc_plan_op_name((mgc_plan_op_kind)op->kind), sname(x, op->name), mb, c);
    switch (op->kind) {
    case MGC_POP_ALL_REDUCE: {
        mgc_comm_red red = (op->iattr[3] & PCOLL_MAX) ? MGC_COMM_MAX : MGC_COMM_SUM;
        if (dt == MGC_DT_F32 || dt == MGC_DT_BF16 || dt == MGC_DT_F16)
            return c_all_reduce(x->fg, g, in, out, n_in, dt, red, what);
        if (dt != MGC_DT_I64)
            return xfail(x, "'%s': all-reduce of %s is not supported", sname(x, op->name),
                         mgc_dtype_name(dt));
        /* token counts, summed on the host: exact in fp32 below 2^24 */
        int64_t *v = malloc(n_in * sizeof *v);
        float *f = malloc(n_in * sizeof *f);
        const int64_t *a = v ? host_view(x->fg, in, v, n_in * sizeof *v) : NULL;
        int rc = -1;
        if (!f || !v) xfail(x, "out of memory");
        else if (a) {
            for (size_t i = 0; i < n_in; i++)
                f[i] = (float)a[i];
            if (!c_check(x->fg, g, mgc_comm_all_reduce(g, f, f, n_in, MGC_DT_F32, red), what)) {
                for (size_t i = 0; i < n_in; i++)
                    v[i] = (int64_t)f[i];
                if (x->fg->staged) rc = stage_up(x->fg, out, v, n_in * sizeof *v);
                else memcpy(out, v, n_in * sizeof *v), rc = 0;
            }
        }
        free(f), free(v);
        return rc;
    }
    case MGC_POP_ALL_GATHER:
    case MGC_POP_REDUCE_SCATTER: {
        /* the expert rows over ETP carry every group rank's row counts in in[1], in group-rank
         * order (partitioning.md, Mixture of experts): packed by them, dropless
         * (MGC_PCOLL_VARIABLE) or not -- with a capacity factor the buffers are sized for
         * E x capacity rows but hold the kept ones, packed, as the all-to-all's */
        if (op->n_in < 2 || op->in[1] < 0)
            return op->kind == MGC_POP_ALL_GATHER ? c_all_gather(x->fg, g, in, out, n_in, dt, what)
                                                  : c_reduce_scatter(x->fg, g, in, out, n_out, dt, what);
        size_t *per = calloc((size_t)size, sizeof *per);
        int rc = per ? var_counts(x, c, op, mb, size, per) : xfail(x, "out of memory");
        size_t bound = op->kind == MGC_POP_ALL_GATHER ? n_out : n_in, tot = 0;
        for (int j = 0; j < size && !rc; j++)
            tot += per[j];
        if (!rc && (tot > bound || per[mgc_comm_rank(g)] > (op->kind == MGC_POP_ALL_GATHER ? n_in : n_out)))
            rc = xfail(x, "'%s': %zu rows' elements exceed the buffers (%zu in, %zu out)",
                       sname(x, op->name), tot, n_in, n_out);
        if (!rc)
            rc = op->kind == MGC_POP_ALL_GATHER ? c_all_gather_v(x->fg, g, in, out, per, dt, what)
                                                : c_reduce_scatter_v(x->fg, g, in, out, per, dt, what);
        free(per);
        return rc;
    }
    case MGC_POP_ALL_TO_ALL: {
        size_t *cnt = calloc((size_t)(2 * size), sizeof *cnt);
        if (!cnt) return xfail(x, "out of memory");
        int rc = 0;
        if (op->n_in > 2) {
            const mgc_plan_tensor *t = &ch->tensors[op->in[0]], *sc = &ch->tensors[op->in[1]],
                                  *rcv = &ch->tensors[op->in[2]];
            int64_t width = t->dim[t->rank - 1];
            size_t ns = (size_t)tnumel(sc), nr = (size_t)tnumel(rcv);
            int64_t *tmp = malloc((ns + nr) * sizeof *tmp);
            const void *sd = taddr(x, c, op->in[1], mb), *rd = taddr(x, c, op->in[2], mb);
            const int64_t *sa = tmp && sd ? host_view(x->fg, sd, tmp, ns * sizeof *tmp) : NULL;
            const int64_t *ra = sa && rd ? host_view(x->fg, rd, tmp + ns, nr * sizeof *tmp) : NULL;
            if (!tmp) rc = xfail(x, "out of memory");
            else if (sa && ra && (a2a_counts(sa, (int64_t)ns, size, width, cnt) ||
                                  a2a_counts(ra, (int64_t)nr, size, width, cnt + size)))
                rc = xfail(x, "'%s': bad row counts", sname(x, op->name));
            else if (!sd || !rd) rc = xfail(x, "'%s': row counts not materialised", sname(x, op->name));
            else if (!sa || !ra) rc = -1; /* the download failed: x->err says why */
            free(tmp);
        } else {
            for (int j = 0; j < size; j++)
                cnt[j] = n_in / (size_t)size, cnt[size + j] = n_out / (size_t)size;
        }
        if (!rc) rc = c_all_to_all(x->fg, g, in, out, cnt, dt, what);
        free(cnt);
        return rc;
    }
    case MGC_POP_BROADCAST:
        if (in != out && x->be->iface->copy(x->be, out, in, n_in * mgc_dtype_size(dt)))
            return be_fail(x, what);
        return c_broadcast(x->fg, g, out, n_in, dt, what);
    default:
        return xfail(x, "op kind %u is not a collective", op->kind);
    }
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
    int hands = pass == 1 && overlapping(x) && x->last_bwd_mb[c] == mb;
    if (!x->graphs || x->eval || x->prof || x->hook_before || x->hook_after || !x->graph_ok[2 * c + pass] ||
        hands)
        return issue_ops(x, c, pass, ops, n, mb, &call);
    mgc_backend *be = x->be;
    uint64_t key = graph_key(c, pass, mb, call.dloss);
    /* the step of the dropout streams, which a recorded program reads from the backend */
    if (be->iface->set_step && be->iface->set_step(be, x->iteration))
        return be_fail(x, "setting the dropout kernels' step");
    int g = be->iface->graph_begin(be, key);
    if (g < 0) return be_fail(x, "starting a CUDA graph");
    if (g == 1) { /* replayed */
        x->graph_replays++;
        return 0;
    }
    int rc = issue_ops(x, c, pass, ops, n, mb, &call);
    int e = be->iface->graph_end(be, key, rc != 0);
    if (e == 2) return issue_ops(x, c, pass, ops, n, mb, &call); /* the recording failed */
    if (e < 0 && !rc) return be_fail(x, "ending a CUDA graph");
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
    if (!buf) return xfail(x, "out of memory");
    const int64_t *c = counts; /* device memory (with one rank too): a copy */
    int rc = 0;
    if (x->be->iface->device_memory) {
        c = buf;
        if (x->be->iface->download(x->be, buf, counts, (size_t)E * sizeof *buf))
            c = NULL, rc = be_fail(x, "reading the expert counts");
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
    if (!f) return xfail(x, "out of memory");
    for (size_t i = 0; i < n; i++)
        f[i] = (float)(x->moe_local[i] & 4095), f[n + i] = (float)(x->moe_local[i] >> 12);
    mgc_comm_status s = mgc_comm_all_reduce(x->world, f, f, 2 * n, MGC_DT_F32, MGC_COMM_SUM);
    if (s != MGC_COMM_OK) {
        free(f);
        return comm_fail(x, x->world, s, "expert counts all-reduce");
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
    int hands = pass == 1 && overlapping(x) && x->last_bwd_mb[c] == mb;
    if (hands && hand_over(x, c, -1)) return -1;
    for (int64_t i = 0; i < n; i++) {
        const mgc_plan_op *op = &ops[i];
        if (hands && i > 0 && hand_over(x, c, (int32_t)i - 1)) return -1;
        if (op->kind >= MGC_POP_ALL_REDUCE) {
            if (x->prof && prof_clock(x, &t0)) return -1;
            if (run_collective(x, c, op, mb)) return -1;
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
                return xfail(x, "'%s' input %d (%s) has no memory", sname(x, op->name), k,
                             sname(x, ch->tensors[op->in[k]].name));
        for (int k = 0; k < op->n_out; k++)
            if (!(call.out[k] = taddr(x, c, op->out[k], mb)))
                return xfail(x, "'%s' output %d (%s) has no memory", sname(x, op->name), k,
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
            return be_fail(x, what);
        }
    }
    if (hands && n > 0 && hand_over(x, c, (int32_t)n - 1)) return -1;
    return 0;
}

static int copy_tensor(mgc_exec *x, int c, int32_t t, int32_t mb, int32_t staging, int into) {
    if (t < 0 || staging < 0)
        return xfail(x, "stage %" PRId64 " chunk %d microbatch %d: no boundary staging buffer",
                     x->sp->pp_rank, c, mb);
    void *a = taddr(x, c, t, mb);
    const mgc_plan_tensor *T = &x->sp->chunks[c].tensors[t];
    if (!a) return xfail(x, "boundary tensor '%s' has no memory", sname(x, T->name));
    uint64_t bytes = T->bytes < x->sp->buffers[staging].bytes ? T->bytes : x->sp->buffers[staging].bytes;
    int rc = into ? x->be->iface->copy(x->be, a, buf_addr(x, staging), bytes)
                  : x->be->iface->copy(x->be, buf_addr(x, staging), a, bytes);
    return rc ? be_fail(x, "boundary copy") : 0;
}

/* Adds microbatch mb's loss (the mean over its masked tokens) to the step's, on the ranks
 * that report it. */
static int read_loss(mgc_exec *x, int c, int32_t mb) {
    float v[2];
    if (x->be->iface->download(x->be, v, taddr(x, c, x->chunks[c].loss, mb), sizeof v))
        return be_fail(x, "reading the loss");
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
            return be_fail(x, "reading a MoE loss");
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
static int comm_slot(uint32_t op) {
    return op == MGC_I_SEND_ACT ? 0 : op == MGC_I_RECV_ACT ? 1 : op == MGC_I_SEND_GRAD ? 2
         : op == MGC_I_RECV_GRAD ? 3 : -1;
}

static int p2p(mgc_exec *x, const mgc_instr *in, int64_t i) {
    int k = comm_slot(in->op);
    int32_t b = x->chunks[in->chunk].comm[k][in->mb];
    if (b < 0) return xfail(x, "stage %" PRId64 ": no staging buffer for a transfer", x->sp->pp_rank);
    mgc_comm *g = x->group[MGC_GROUP_PP];
    size_t n = (size_t)x->sp->buffers[b].bytes;
    char what[160];
    snprintf(what, sizeof what, "%s of microbatch %d chunk %u with pipeline rank %d",
             k == 0 ? "send_act" : k == 1 ? "recv_act" : k == 2 ? "send_grad" : "recv_grad", in->mb,
             in->chunk, in->peer);
    if (x->snd && x->send_overlap && !x->prof) return sender_p2p(x, in, i, b, what);
    return (k & 1) ? c_recv(x->fg, g, buf_addr(x, b), n, in->peer, what)
                   : c_send(x->fg, g, buf_addr(x, b), n, in->peer, what);
}

/* ---- gradients and the optimizer ----------------------------------------------------------- */

static float *gptr(const mgc_exec *x, int64_t elem) {
    return (float *)buf_addr(x, x->grad_buf) + elem;
}
/* The weights of element `elem` (fp32, or bf16 bits with a master copy). */
static void *wptr(const mgc_exec *x, int64_t elem) {
    return buf_addr(x, x->weight_buf) + (size_t)elem * (x->w16 ? 2 : 4);
}

/* Bucket bi's data-parallel sum, on k's thread: an all-reduce, or a reduce-scatter into this
 * rank's shard (distributed optimizer). */
static int reduce_bucket(const mgc_exec *x, xcomm *k, uint32_t bi) {
    const mgc_bucket *B = &x->sp->buckets[bi];
    mgc_comm *g = x->group[B->group];
    if (mgc_comm_size(g) == 1) return 0;
    size_t count = (size_t)B->count;
    char what[96];
    snprintf(what, sizeof what, "gradient bucket %u reduction", bi);
    float *base = gptr(x, (int64_t)B->begin);
    if (B->shards > 1) {
        size_t piece = count / (size_t)B->shards;
        return c_reduce_scatter(k, g, base, base + (size_t)mgc_comm_rank(g) * piece, piece,
                                MGC_DT_F32, what);
    }
    return c_all_reduce(k, g, base, base, count, MGC_DT_F32, MGC_COMM_SUM, what);
}

/* ---- the gradient reducer -------------------------------------------------------------
 * With grad overlap (mgc_exec_set_grad_overlap, on by default), a bucket's data-parallel
 * reduction starts as soon as its gradients are final: after the op of its chunk's last
 * backward that last writes them (x->ready_op).  A second thread per rank runs it, in the
 * order the buckets became ready, while this thread goes on with the backward; the bucket's
 * REDUCE_GRADS instruction waits for it.  Only the reduction's timing changes, never its
 * arguments, so the numbers are the in-line ones bit for bit.  It needs a communicator whose
 * handles of different groups may be used from two threads at once (mgc_comm_concurrent),
 * and, on device memory, the backend's transfer slots (xfer_*), which order the bucket's
 * download after the compute issued before it. */
typedef struct reducer {
    const mgc_exec *x;
    pthread_t th;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    uint32_t *queue;           /* (n_buckets) bucket indices in the order handed over */
    int64_t head, tail;        /* queue[head..tail) waits; reset each step */
    int8_t *state;             /* (n_buckets) R_IDLE, R_QUEUED, R_DONE, R_FAILED (under mu) */
    uint8_t *handed;           /* (n_buckets) handed over this step: the executor's thread only */
    void **marks;              /* (n_buckets) xfer_mark's marks (device memory) */
    int stop;
    xcomm k;                   /* the reducer thread's communication */
    char kerr[2048];           /* k's error text: the reducer thread's own */
    char err[2048];            /* the first failure since the step began (under mu) */
} reducer;

enum { R_IDLE = 0, R_QUEUED, R_DONE, R_FAILED };

static void *reducer_main(void *arg) {
    reducer *r = arg;
    const mgc_exec *x = r->x;
    pthread_mutex_lock(&r->mu);
    for (;;) {
        while (!r->stop && r->head == r->tail)
            pthread_cond_wait(&r->cv, &r->mu);
        if (r->stop) break;
        uint32_t bi = r->queue[r->head++];
        r->k.mark = r->marks ? r->marks[bi] : NULL;
        pthread_mutex_unlock(&r->mu);
        int rc = reduce_bucket(x, &r->k, bi);
        /* a failure poisons the job at once: the data-parallel peers must not wait for this
         * rank's executor to reach the step's tail, nor pair its next bucket with this one */
        if (rc) mgc_comm_abort(x->group[x->sp->buckets[bi].group], r->kerr);
        pthread_mutex_lock(&r->mu);
        if (rc && !r->err[0]) snprintf(r->err, sizeof r->err, "%s", r->kerr);
        r->state[bi] = rc ? R_FAILED : R_DONE;
        pthread_cond_broadcast(&r->cv);
    }
    pthread_mutex_unlock(&r->mu);
    return NULL;
}

/* Sets *stop under mu, wakes the worker thread th and joins it; then destroys mu and cv (the
 * reducer's and the sender's end). */
static void join_worker(pthread_t th, pthread_mutex_t *mu, pthread_cond_t *cv, int *stop) {
    pthread_mutex_lock(mu);
    *stop = 1;
    pthread_cond_broadcast(cv);
    pthread_mutex_unlock(mu);
    pthread_join(th, NULL);
    pthread_cond_destroy(cv);
    pthread_mutex_destroy(mu);
}

static void reducer_stop(mgc_exec *x) {
    reducer *r = x->red;
    if (!r) return;
    join_worker(r->th, &r->mu, &r->cv, &r->stop);
    host_release(&r->k);
    free(r->queue), free(r->state), free(r->marks), free(r->handed);
    free(r);
    x->red = NULL;
}

static int64_t reducer_staged(mgc_exec *x) {
    pthread_mutex_lock(&x->red->mu);
    int64_t n = x->red->k.staged_bytes;
    x->red->k.staged_bytes = 0;
    pthread_mutex_unlock(&x->red->mu);
    return n;
}

/* Which op of its chunk's last backward last writes each bucket's gradients, and the
 * reducer thread when overlap can run here. */
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
    if (!x->first_bwd_mb || !x->fresh) return xfail(x, "out of memory");
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
        if (x->first_bwd_mb[c] < 0 || ch->n_bwd == 0 || fwd_writes_grads(x, (int)c)) continue;
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
    return rc ? xfail(x, "out of memory") : 0;
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
    if (!r) return xfail(x, "out of memory");
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
        return xfail(x, "out of memory");
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

static int setup_overlap(mgc_exec *x) {
    const mgc_stage_program *sp = x->sp;
    x->overlap = 1;
    x->last_bwd_mb = malloc((size_t)(sp->n_chunks ? sp->n_chunks : 1) * sizeof *x->last_bwd_mb);
    x->ready_op = malloc((size_t)(sp->n_buckets ? sp->n_buckets : 1) * sizeof *x->ready_op);
    if (!x->last_bwd_mb || !x->ready_op) return xfail(x, "out of memory");
    for (int64_t c = 0; c < sp->n_chunks; c++)
        x->last_bwd_mb[c] = -1;
    for (int64_t i = 0; i < sp->n_instrs; i++)
        if (sp->instrs[i].op == MGC_I_BACKWARD && sp->instrs[i].chunk < sp->n_chunks)
            x->last_bwd_mb[sp->instrs[i].chunk] = sp->instrs[i].mb;
    mgc_comm *eg = x->group[MGC_GROUP_EMBED];
    int embed_sum = eg && mgc_comm_size(eg) > 1 && x->n_embed > 0;
    int any = 0;
    for (int64_t bi = 0; bi < sp->n_buckets; bi++) {
        const mgc_bucket *B = &sp->buckets[bi];
        int64_t lo = (int64_t)B->begin, hi = lo + (int64_t)B->count;
        int32_t ready = -1;
        int eligible = B->chunk < sp->n_chunks && x->last_bwd_mb[B->chunk] >= 0 &&
                       mgc_comm_size(x->group[B->group]) > 1;
        /* the tied embedding's two copies are summed (EMBED_GRADS) before the bucket's
         * reduction: such a bucket waits for its instruction */
        for (int64_t i = 0; eligible && embed_sum && i < x->n_embed; i++)
            if (x->embed[i].elem < hi && lo < x->embed[i].elem + x->embed[i].n) eligible = 0;
        const mgc_plan_chunk *ch = eligible ? &sp->chunks[B->chunk] : NULL;
        for (int64_t p = 0; ch && p < x->n_params; p++) {
            const pentry *e = &x->params[p];
            if (e->elem >= hi || e->elem + e->pub.numel <= lo) continue;
            if (e->pub.chunk != B->chunk) { /* a gradient written by another chunk */
                eligible = 0;
                break;
            }
            for (int64_t o = 0; o < ch->n_bwd; o++)
                for (int j = 0; j < ch->bwd[o].n_out; j++)
                    if (ch->bwd[o].out[j] == e->grad_tensor && (int32_t)o > ready) ready = (int32_t)o;
            for (int64_t o = 0; o < ch->n_fwd; o++) /* none expected: keep it in line */
                for (int j = 0; j < ch->fwd[o].n_out; j++)
                    if (ch->fwd[o].out[j] == e->grad_tensor) eligible = 0;
        }
        x->ready_op[bi] = eligible ? ready : INT32_MIN;
        any |= eligible;
    }
    /* the reducer must be the only thread on the buckets' groups: no chunk program may use
     * them (none does today: their collectives are tensor, context, expert or pipeline) */
    for (int64_t c = 0; c < sp->n_chunks && any; c++) {
        const mgc_plan_chunk *ch = &sp->chunks[c];
        for (int pass = 0; pass < 2 && any; pass++)
            for (int64_t o = 0; o < (pass ? ch->n_bwd : ch->n_fwd) && any; o++) {
                const mgc_plan_op *op = pass ? &ch->bwd[o] : &ch->fwd[o];
                for (int64_t b = 0; b < sp->n_buckets && op->kind >= MGC_POP_ALL_REDUCE; b++)
                    if (op->group == sp->buckets[b].group) any = 0;
            }
    }
    const mgc_backend_iface *bi = x->be->iface;
    int xfer = bi->xfer_mark && bi->xfer_download && bi->xfer_upload;
    if (!any || !mgc_comm_concurrent(x->world) || (x->fg->staged && !xfer)) return 0;
    reducer *r = calloc(1, sizeof *r);
    if (!r) return xfail(x, "out of memory");
    r->queue = malloc((size_t)sp->n_buckets * sizeof *r->queue);
    r->state = calloc((size_t)sp->n_buckets, sizeof *r->state);
    r->handed = calloc((size_t)sp->n_buckets, sizeof *r->handed);
    r->marks = x->fg->staged ? calloc((size_t)sp->n_buckets, sizeof *r->marks) : NULL;
    r->x = x;
    r->k = *x->fg;
    r->k.host = NULL, r->k.host_cap = 0, r->k.staged_bytes = 0;
    r->k.xfer = x->fg->staged;
    r->k.err = r->kerr, r->k.errsz = sizeof r->kerr;
    if (!r->queue || !r->state || !r->handed || (x->fg->staged && !r->marks)) {
        free(r->queue), free(r->state), free(r->marks), free(r->handed), free(r);
        return xfail(x, "out of memory");
    }
    /* the reducer's staging buffer: the largest bucket, allocated here, not in a step */
    uint64_t most = 0;
    for (int64_t b = 0; b < sp->n_buckets; b++)
        if (sp->buckets[b].count * 4 > most) most = sp->buckets[b].count * 4;
    if (r->k.staged && !stage(&r->k, (size_t)most)) {
        snprintf(x->err, sizeof x->err, "%s", r->kerr);
        free(r->queue), free(r->state), free(r->marks), free(r->handed), free(r);
        return -1;
    }
    if (pthread_mutex_init(&r->mu, NULL) || pthread_cond_init(&r->cv, NULL) ||
        pthread_create(&r->th, NULL, reducer_main, r)) {
        host_release(&r->k);
        free(r->queue), free(r->state), free(r->marks), free(r->handed), free(r);
        return xfail(x, "rank %" PRId64 ": cannot start the gradient reducer thread", x->rank);
    }
    x->red = r;
    return 0;
}

static int overlapping(const mgc_exec *x) {
    return x->red && x->overlap && !x->prof && !x->eval;
}

/* Queues bucket bi on the reducer, its download ordered after the compute issued so far. */
static int hand_one(mgc_exec *x, int64_t bi) {
    reducer *r = x->red;
    if (r->marks && x->be->iface->xfer_mark(x->be, &r->marks[bi]))
        return be_fail(x, "marking a gradient bucket for its reduction");
    r->handed[bi] = 1;
    pthread_mutex_lock(&r->mu);
    r->state[bi] = R_QUEUED;
    r->queue[r->tail++] = (uint32_t)bi;
    pthread_cond_broadcast(&r->cv);
    pthread_mutex_unlock(&r->mu);
    return 0;
}

/* Hands the buckets that are final once op `op` of chunk c's last backward has been issued
 * (op -1: before its first) to the reducer. */
static int hand_over(mgc_exec *x, int c, int32_t op) {
    reducer *r = x->red;
    for (int64_t bi = 0; bi < x->sp->n_buckets; bi++) {
        if (x->ready_op[bi] != op || x->sp->buckets[bi].chunk != c || r->handed[bi]) continue;
        if (hand_one(x, bi)) return -1;
        x->overlapped++;
    }
    return 0;
}

/* Waits for bucket bi's reduction (bi < 0: every handed-over bucket). */
static int reducer_wait(mgc_exec *x, int64_t bi) {
    reducer *r = x->red;
    int rc = 0;
    pthread_mutex_lock(&r->mu);
    for (int64_t b = bi < 0 ? 0 : bi; b < (bi < 0 ? x->sp->n_buckets : bi + 1); b++) {
        while (r->state[b] == R_QUEUED)
            pthread_cond_wait(&r->cv, &r->mu);
        if (r->state[b] == R_FAILED && !rc) rc = xfail(x, "%s", r->err);
    }
    pthread_mutex_unlock(&r->mu);
    return rc;
}

/* REDUCE_GRADS.  With a reducer, every bucket goes through it, those not handed over during
 * the backward (the tied embedding's, or all of them with overlap off) at this instruction:
 * the reducer's thread is then the only one using the buckets' groups, in one order on every
 * rank (a second thread calling the same group would collide with it). */
static int reduce_grads(mgc_exec *x, uint32_t bi) {
    if (!x->red) return reduce_bucket(x, x->fg, bi);
    if (!x->red->handed[bi] && hand_one(x, bi)) return -1;
    return reducer_wait(x, bi);
}

/* Before a step: every bucket idle (after a failed step, once the reducer has drained; that
 * step reported the failure). */
static void reducer_reset(mgc_exec *x) {
    if (!x->red) return;
    char keep[sizeof x->err];
    memcpy(keep, x->err, sizeof keep);
    reducer_wait(x, -1);
    memcpy(x->err, keep, sizeof keep);
    pthread_mutex_lock(&x->red->mu);
    memset(x->red->state, 0, (size_t)x->sp->n_buckets * sizeof *x->red->state);
    memset(x->red->handed, 0, (size_t)x->sp->n_buckets);
    x->red->err[0] = '\0';
    x->red->head = x->red->tail = 0;
    pthread_mutex_unlock(&x->red->mu);
}

/* ---- a device communicator ----------------------------------------------------------------
 * mgc_exec_set_device_comm: the collectives on arena memory go to a moves-only communicator
 * (comm.h: NCCL) whose groups mirror the host groups; its reductions fold through the plan's
 * kernel_scratch (between ops: no launcher holds it then) with the backend's fold, queued on
 * the backend's compute queue.  The host communicator keeps the scalars (losses, norms, token
 * counts) and the rank's control flow. */
static int dev_fold(void *ctx, void *dst, const void *src, int parts, size_t count, size_t stride,
                    mgc_dtype dt, mgc_comm_red op) {
    mgc_backend *be = ctx;
    return be->iface->fold(be, dst, src, parts, count, stride, (int)dt, op == MGC_COMM_MAX);
}

int mgc_exec_set_device_comm(mgc_exec *x, mgc_comm *dworld) {
    const mgc_backend_iface *bi = x->be->iface;
    if (!dworld || !mgc_comm_moves_only(dworld))
        return xfail(x,
                     "rank %" PRId64 ": a device communicator must be a moves-only one "
                     "(nccl, or a local world with moves_only)",
                     x->rank);
    if (mgc_comm_size(dworld) != x->grid.world || mgc_comm_world_rank(dworld) != x->rank)
        return xfail(x,
                     "rank %" PRId64 ": the device communicator is rank %d of %d, the plan's "
                     "world is %" PRId64 " ranks",
                     x->rank, mgc_comm_world_rank(dworld), mgc_comm_size(dworld), x->grid.world);
    if (!bi->fold)
        return xfail(x,
                     "rank %" PRId64 ": the %s backend has no fold kernel for a device "
                     "communicator's reductions: run without one",
                     x->rank, bi->name);
    if (x->dworld)
        return xfail(x, "rank %" PRId64 ": a device communicator is set already", x->rank);
    int64_t sb = -1;
    for (int64_t b = 0; b < x->sp->n_buffers && sb < 0; b++)
        if (!strcmp(mgc_plan_strat(x->plan, x->sp->buffers[b].name), "kernel_scratch")) sb = b;
    if (sb < 0)
        return xfail(x,
                     "rank %" PRId64 ": the plan has no kernel_scratch buffer for the device "
                     "communicator's folds: recompile it with this mgc",
                     x->rank);
    mgc_comm_device dv = {.stream = bi->queue ? bi->queue(x->be) : NULL,
                          .fold = dev_fold,
                          .fold_ctx = x->be,
                          .scratch = buf_addr(x, (int32_t)sb),
                          .scratch_bytes = (size_t)x->sp->buffers[sb].bytes};
    /* the groups, as the host ones (collective over dworld) */
    for (int k = 0; k < MGC_GROUP__COUNT; k++) {
        mgc_comm_status s = mgc_comm_group(dworld, &x->grid, (mgc_group_kind)k, &x->dgroup[k]);
        if (s != MGC_COMM_OK) return comm_fail(x, dworld, s, "creating the device process groups");
    }
    if (x->kv_share > 1) {
        mgc_comm_status s =
            mgc_comm_split(x->dgroup[MGC_GROUP_TP], x->co.tp / x->kv_share, x->co.tp, &x->d_kv);
        if (s != MGC_COMM_OK)
            return comm_fail(x, x->dgroup[MGC_GROUP_TP], s, "joining a key/value device group");
    }
    static const int n_pairs = MGC_GROUP__COUNT + 1;
    mgc_comm **pairs = calloc(2 * (size_t)n_pairs, sizeof *pairs);
    if (!pairs) return xfail(x, "out of memory");
    for (int k = 0; k < MGC_GROUP__COUNT; k++)
        pairs[k] = x->group[k], pairs[n_pairs + k] = x->dgroup[k];
    pairs[MGC_GROUP__COUNT] = x->kv_comm, pairs[n_pairs + MGC_GROUP__COUNT] = x->d_kv;
    for (int i = 0; i < n_pairs; i++) {
        mgc_comm *d = pairs[n_pairs + i];
        if (d && mgc_comm_set_device(d, &dv) != MGC_COMM_OK) {
            free(pairs);
            return comm_fail(x, d, MGC_COMM_ERR_INVALID, "setting up a device group");
        }
    }
    /* every transfer goes in line, queued on the compute stream: no reducer or sender thread */
    reducer_stop(x);
    sender_stop(x);
    host_release(x->fg); /* the bulk staging buffer: only small host views need one now */
    x->dworld = dworld;
    x->dev_pairs = pairs;
    x->fg->hosts = pairs, x->fg->devs = pairs + n_pairs, x->fg->n_dev = n_pairs;
    return 0;
}

int mgc_exec_device_comm(const mgc_exec *x) {
    return x->dworld != NULL;
}

void mgc_exec_set_grad_overlap(mgc_exec *x, int on) {
    x->overlap = on != 0;
}

int mgc_exec_grad_overlap(const mgc_exec *x) {
    return x->red != NULL && x->overlap;
}

/* ---- pipeline sends beside the compute ----------------------------------------------------
 * On device memory with the backend's pipeline-transfer slots (backend.h p2p_*), SEND_ACT and
 * SEND_GRAD queue the download of their staging buffer (it starts once the compute issued so
 * far is done) and hand the send to a thread of the rank, the sender, which waits for the
 * download and sends; the executor goes on issuing compute at once.
 *  - The staging buffer's bytes must stay until the download is done, but the memory plan may
 *    give them to another buffer once the send's instruction is over (its liveness ends
 *    there).  So before the first instruction at which a buffer overlapping them becomes live,
 *    the executor fences the compute behind the download (p2p_fence: on the device, the host
 *    does not wait).  The fences are worked out once, at open, from the buffers' offsets and
 *    liveness (fence_at).
 *  - The sender is the only thread on the pipeline group, so receives go through it too, in
 *    instruction order: the executor queues a RECV and waits for it (it needs the data), then
 *    uploads it.  The order of every rank's transfers is the in-line one: no new pairing, no
 *    new deadlock.
 *  - Host buffers: a pool of SEND_SLOTS, each as large as the stage's largest staging buffer; a
 *    send waits for a free one.
 *  - A step ends once every send has left (the next step's compute may reuse any byte), and
 *    a failure poisons the job (mgc_comm_abort) as the reducer's does.
 * Only the transfers' timing changes, never their bytes: the numbers are the in-line ones bit
 * for bit (tests/test_train.c checks it on a backend whose downloads happen as late as
 * allowed). */
#define SEND_SLOTS 4

typedef struct p2p_item {
    int recv;                  /* 1: a receive into `host` */
    int slot;                  /* send: its pool slot */
    void *host;
    size_t bytes;
    int peer;
    void *done;                /* send: the backend's handle of its download */
    char what[160];
} p2p_item;

typedef struct sender {
    const mgc_exec *x;
    pthread_t th;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    p2p_item *q;               /* ring of `cap` items: q[n % cap] for head <= n < tail */
    int64_t cap, head, tail;   /* items handed over (tail) and finished (head), since open */
    unsigned char *pool[SEND_SLOTS];
    int busy[SEND_SLOTS];      /* the slot's send has not left yet (under mu) */
    size_t slot_bytes;
    int stop;
    int failed;                /* a transfer failed: err holds why (under mu) */
    char err[2048];
    void **done;               /* (n_instrs) each SEND's download handle (the executor's thread) */
    int64_t *queued_in;        /* (n_instrs) the epoch (step) a SEND was last queued in */
    int64_t epoch;             /* this step's */
    int64_t *fence_first;      /* (n_instrs + 1) fences before instruction i:        */
    int64_t *fence_send;       /*   fence_send[fence_first[i] .. fence_first[i + 1])  */
} sender;

static void *sender_main(void *arg) {
    sender *r = arg;
    const mgc_exec *x = r->x;
    mgc_comm *g = x->group[MGC_GROUP_PP];
    pthread_mutex_lock(&r->mu);
    for (;;) {
        while (!r->stop && r->head == r->tail)
            pthread_cond_wait(&r->cv, &r->mu);
        if (r->stop) break;
        p2p_item it = r->q[r->head % r->cap];
        int failed = r->failed;
        pthread_mutex_unlock(&r->mu);
        char e[1024] = "";
        if (!failed) { /* after a failure, only drain: the job is poisoned */
            mgc_comm_status cs = MGC_COMM_OK;
            if (it.recv) {
                cs = mgc_comm_recv(g, it.host, it.bytes, MGC_DT_U8, it.peer);
            } else if (x->be->iface->p2p_wait(x->be, it.done, e, sizeof e)) {
                failed = 1;
            } else {
                cs = mgc_comm_send(g, it.host, it.bytes, MGC_DT_U8, it.peer);
            }
            if (cs != MGC_COMM_OK) {
                snprintf(e, sizeof e, "%s: %s", mgc_comm_status_name(cs), mgc_comm_error(g));
                failed = 1;
            }
            if (failed) mgc_comm_abort(g, e);
        }
        pthread_mutex_lock(&r->mu);
        if (failed && !r->failed) {
            r->failed = 1;
            snprintf(r->err, sizeof r->err, "rank %" PRId64 ": %s: %s", x->rank, it.what,
                     e[0] ? e : "an earlier transfer failed");
        }
        if (!it.recv) r->busy[it.slot] = 0;
        r->head++;
        pthread_cond_broadcast(&r->cv);
    }
    pthread_mutex_unlock(&r->mu);
    return NULL;
}

/* Frees r's memory and pool (no thread). */
static void sender_free(const mgc_exec *x, sender *r) {
    const mgc_backend_iface *bi = x->be->iface;
    for (int k = 0; k < SEND_SLOTS; k++) {
        if (!r->pool[k]) continue;
        if (bi->host_alloc && bi->host_free) bi->host_free(x->be, r->pool[k]);
        else free(r->pool[k]);
    }
    free(r->q), free(r->done), free(r->queued_in), free(r->fence_first), free(r->fence_send);
    free(r);
}

static void sender_stop(mgc_exec *x) {
    sender *r = x->snd;
    if (!r) return;
    pthread_mutex_lock(&r->mu);
    while (r->head != r->tail) /* transfers in flight use the pool and the backend */
        pthread_cond_wait(&r->cv, &r->mu);
    pthread_mutex_unlock(&r->mu);
    join_worker(r->th, &r->mu, &r->cv, &r->stop);
    sender_free(x, r);
    x->snd = NULL;
}

/* The sender thread, where sends can go beside the compute: pipeline neighbours on device
 * memory, the backend's p2p slots, a communicator that lets two threads of a rank work at
 * once.  Also works out the fences. */
static int setup_sender(mgc_exec *x) {
    const mgc_stage_program *sp = x->sp;
    const mgc_backend_iface *bi = x->be->iface;
    x->send_overlap = 1;
    mgc_comm *pp = x->group[MGC_GROUP_PP];
    if (!x->fg->staged || !bi->p2p_download || !bi->p2p_wait || !bi->p2p_fence || !pp ||
        mgc_comm_size(pp) < 2 || !mgc_comm_concurrent(x->world))
        return 0;
    int64_t n = sp->n_instrs, sends = 0, nf = 0;
    size_t most = 0;
    for (int64_t i = 0; i < n; i++) {
        const mgc_instr *in = &sp->instrs[i];
        int k = comm_slot(in->op);
        if (k < 0) continue;
        int32_t b = in->chunk < sp->n_chunks && in->mb >= 0 && in->mb < x->mb_count
                        ? x->chunks[in->chunk].comm[k][in->mb]
                        : -1;
        if (b < 0) return 0; /* p2p() reports it, in line */
        if ((k & 1) == 0) sends++;
        if (sp->buffers[b].bytes > most) most = (size_t)sp->buffers[b].bytes;
    }
    if (!sends) return 0;
    sender *r = calloc(1, sizeof *r);
    if (!r) return xfail(x, "out of memory");
    r->x = x;
    r->cap = n + 1; /* at most every instruction queued at once */
    r->q = calloc((size_t)r->cap, sizeof *r->q);
    r->done = calloc((size_t)n + 1, sizeof *r->done);
    r->queued_in = calloc((size_t)n + 1, sizeof *r->queued_in);
    r->fence_first = calloc((size_t)n + 2, sizeof *r->fence_first);
    r->fence_send = malloc((size_t)sends * sizeof *r->fence_send);
    int64_t *at = malloc((size_t)sends * 2 * sizeof *at); /* (send, fence instruction) pairs */
    if (!r->q || !r->done || !r->queued_in || !r->fence_first || !r->fence_send || !at) {
        free(at);
        sender_free(x, r);
        return xfail(x, "out of memory");
    }
    /* each send's fence: the first instruction after it at which a buffer overlapping its
     * staging buffer becomes live (none: the step's end, where every send has left) */
    for (int64_t i = 0; i < n; i++) {
        const mgc_instr *in = &sp->instrs[i];
        int k = comm_slot(in->op);
        if (k != 0 && k != 2) continue;
        const mgc_buffer *S = &sp->buffers[x->chunks[in->chunk].comm[k][in->mb]];
        int64_t j = n;
        for (int64_t b = 0; b < sp->n_buffers; b++) {
            const mgc_buffer *B = &sp->buffers[b];
            if (B == S || B->live_begin <= i || B->live_begin >= j) continue;
            if (B->offset < S->offset + S->bytes && S->offset < B->offset + B->bytes)
                j = B->live_begin;
        }
        if (j < n) at[2 * nf] = j, at[2 * nf + 1] = i, nf++;
    }
    for (int64_t f = 0; f < nf; f++) r->fence_first[at[2 * f] + 1]++;
    for (int64_t i = 0; i < n; i++) r->fence_first[i + 1] += r->fence_first[i];
    int64_t *fill = calloc((size_t)n + 1, sizeof *fill);
    if (!fill) {
        free(at);
        sender_free(x, r);
        return xfail(x, "out of memory");
    }
    for (int64_t f = 0; f < nf; f++) {
        int64_t j = at[2 * f];
        r->fence_send[r->fence_first[j] + fill[j]++] = at[2 * f + 1];
    }
    free(fill), free(at);
    r->slot_bytes = most ? most : 1;
    for (int k = 0; k < SEND_SLOTS; k++) {
        void *p = NULL;
        if (bi->host_alloc && bi->host_free ? bi->host_alloc(x->be, r->slot_bytes, &p) != 0
                                            : (p = malloc(r->slot_bytes)) == NULL) {
            sender_free(x, r);
            return xfail(x, "rank %" PRId64 ": allocating %d host buffers of %zu bytes for "
                            "pipeline sends", x->rank, SEND_SLOTS, (size_t)(most ? most : 1));
        }
        r->pool[k] = p;
    }
    if (pthread_mutex_init(&r->mu, NULL) || pthread_cond_init(&r->cv, NULL) ||
        pthread_create(&r->th, NULL, sender_main, r)) {
        sender_free(x, r);
        return xfail(x, "rank %" PRId64 ": cannot start the pipeline sender thread", x->rank);
    }
    x->snd = r;
    return 0;
}

/* Queues it (the executor's thread); its index in the queue.  -1 with x->err set when the
 * sender has failed. */
static int64_t sender_put(mgc_exec *x, const p2p_item *it) {
    sender *r = x->snd;
    pthread_mutex_lock(&r->mu);
    if (r->failed) {
        pthread_mutex_unlock(&r->mu);
        return xfail(x, "%s", r->err);
    }
    int64_t idx = r->tail++;
    r->q[idx % r->cap] = *it;
    pthread_cond_broadcast(&r->cv);
    pthread_mutex_unlock(&r->mu);
    return idx;
}

/* Waits until the sender has finished item idx (idx < 0: every item); -1 with x->err set
 * when it failed. */
static int sender_wait(mgc_exec *x, int64_t idx) {
    sender *r = x->snd;
    pthread_mutex_lock(&r->mu);
    while (!r->failed && (idx < 0 ? r->head != r->tail : r->head <= idx))
        pthread_cond_wait(&r->cv, &r->mu);
    int rc = r->failed ? xfail(x, "%s", r->err) : 0;
    pthread_mutex_unlock(&r->mu);
    return rc;
}

/* SEND_ACT / SEND_GRAD (instruction i) and RECV_ACT / RECV_GRAD through the sender; b is the
 * staging buffer. */
static int sender_p2p(mgc_exec *x, const mgc_instr *in, int64_t i, int32_t b, const char *what) {
    sender *r = x->snd;
    size_t n = (size_t)x->sp->buffers[b].bytes;
    void *arena = buf_addr(x, b);
    p2p_item it;
    memset(&it, 0, sizeof it);
    it.recv = in->op == MGC_I_RECV_ACT || in->op == MGC_I_RECV_GRAD;
    it.bytes = n;
    it.peer = in->peer;
    snprintf(it.what, sizeof it.what, "%s", what);
    if (it.recv) { /* into the executor's own staging buffer: it waits for the data anyway */
        if (!(it.host = stage(x->fg, n))) return -1;
        int64_t idx = sender_put(x, &it);
        if (idx < 0 || sender_wait(x, idx)) return -1;
        return stage_up(x->fg, arena, it.host, n);
    }
    pthread_mutex_lock(&r->mu); /* a free host buffer */
    int k = -1;
    while (!r->failed && k < 0) {
        for (int s = 0; s < SEND_SLOTS && k < 0; s++)
            if (!r->busy[s]) k = s;
        if (k < 0) pthread_cond_wait(&r->cv, &r->mu);
    }
    if (r->failed) {
        pthread_mutex_unlock(&r->mu);
        return xfail(x, "%s", r->err);
    }
    r->busy[k] = 1;
    pthread_mutex_unlock(&r->mu);
    it.slot = k;
    it.host = r->pool[k];
    char e[1024];
    if (x->be->iface->p2p_download(x->be, it.host, arena, n, &r->done[i], e, sizeof e)) {
        pthread_mutex_lock(&r->mu);
        r->busy[k] = 0;
        pthread_mutex_unlock(&r->mu);
        return xfail(x, "rank %" PRId64 ": %s: %s", x->rank, what, e);
    }
    it.done = r->done[i];
    r->queued_in[i] = r->epoch;
    x->fg->staged_bytes += (int64_t)n;
    if (sender_put(x, &it) < 0) return -1;
    x->sends_queued++;
    return 0;
}

/* Before instruction i: the compute waits (on the device) for the downloads of this step's
 * sends whose bytes a buffer that becomes live at i may reuse. */
static int sender_fence(mgc_exec *x, int64_t i) {
    sender *r = x->snd;
    for (int64_t f = r->fence_first[i]; f < r->fence_first[i + 1]; f++) {
        int64_t s = r->fence_send[f];
        if (r->queued_in[s] != r->epoch || !r->done[s]) continue; /* sent in line */
        char e[1024];
        if (x->be->iface->p2p_fence(x->be, r->done[s], e, sizeof e))
            return xfail(x, "rank %" PRId64 ": instruction %" PRId64 ": %s", x->rank, i, e);
    }
    return 0;
}

/* The step's end (report: every transfer has left, or the first failure) or its start (a
 * failed step's transfers have drained; a new epoch). */
static int sender_drain(mgc_exec *x, int report) {
    sender *r = x->snd;
    if (report) return sender_wait(x, -1);
    pthread_mutex_lock(&r->mu);
    while (r->head != r->tail)
        pthread_cond_wait(&r->cv, &r->mu);
    r->failed = 0;
    r->err[0] = '\0';
    r->epoch++;
    pthread_mutex_unlock(&r->mu);
    return 0;
}

void mgc_exec_set_send_overlap(mgc_exec *x, int on) {
    x->send_overlap = on != 0;
}

int mgc_exec_send_overlap(const mgc_exec *x) {
    return x->snd != NULL && x->send_overlap;
}

static int gather_params(mgc_exec *x, uint32_t bi) {
    const mgc_bucket *B = &x->sp->buckets[bi];
    if (B->shards <= 1) return 0;
    mgc_comm *g = x->group[B->group];
    if (mgc_comm_size(g) == 1) return 0;
    size_t piece = (size_t)B->count / (size_t)B->shards;
    size_t es = x->w16 ? 2 : 4;
    unsigned char *base = wptr(x, (int64_t)B->begin);
    return c_all_gather(x->fg, g, base + (size_t)mgc_comm_rank(g) * piece * es, base, piece,
                        (mgc_dtype)x->wdt, "parameter all-gather");
}

static int embed_grads(mgc_exec *x) {
    mgc_comm *g = x->group[MGC_GROUP_EMBED];
    if (!g || mgc_comm_size(g) == 1) return 0;
    for (int64_t i = 0; i < x->n_embed; i++) {
        float *p = gptr(x, x->embed[i].elem);
        if (c_all_reduce(x->fg, g, p, p, (size_t)x->embed[i].n, MGC_DT_F32, MGC_COMM_SUM,
                         "tied embedding gradient all-reduce"))
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
        if (c_all_reduce(x->fg, x->group[MGC_GROUP_TP], p, p, (size_t)x->partial[i].n, MGC_DT_F32,
                         MGC_COMM_SUM, "partial gradient sum"))
            return -1;
    }
    /* replicated k/v rows: each rank has its own query heads' part; sum over the group's ranks */
    for (int64_t i = 0; i < x->n_kvsum; i++) {
        float *p = gptr(x, x->kvsum[i].elem);
        if (c_all_reduce(x->fg, x->kv_comm, p, p, (size_t)x->kvsum[i].n, MGC_DT_F32, MGC_COMM_SUM,
                         "key/value gradient sum"))
            return -1;
    }
    /* global norm: each element counted on exactly one rank, summed over the world */
    double local = 0;
    for (int64_t i = 0; i < x->n_norm; i++)
        x->norm_g[i] = gptr(x, x->norm[i].elem), x->norm_n[i] = x->norm[i].n;
    if (be->iface->sumsq(be, x->norm_g, x->norm_n, x->n_norm, &local))
        return be_fail(x, "gradient norm");
    float part = (float)local, total = 0;
    mgc_comm_status s = mgc_comm_all_reduce(x->world, &part, &total, 1, MGC_DT_F32, MGC_COMM_SUM);
    if (s != MGC_COMM_OK) return comm_fail(x, x->world, s, "gradient norm all-reduce");
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
        return xfail(x, "rank %" PRId64 ": the gradient norm is %g at step %" PRId64
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
    if (be->iface->adamw(be, x->aw, x->n_adam, &as)) return be_fail(x, "AdamW");
    return 0;
}

/* ---- a step -------------------------------------------------------------------------------- */

/* The chunks' programs with every dropout probability 0, made at the first evaluation. */
static int make_eval_ops(mgc_exec *x) {
    const mgc_stage_program *sp = x->sp;
    x->eval_ops = calloc((size_t)(2 * sp->n_chunks), sizeof *x->eval_ops);
    if (!x->eval_ops) return xfail(x, "out of memory");
    for (int64_t c = 0; c < sp->n_chunks; c++)
        for (int pass = 0; pass < 2; pass++) {
            const mgc_plan_chunk *ch = &sp->chunks[c];
            int64_t n = pass ? ch->n_bwd : ch->n_fwd;
            mgc_plan_op *o = malloc((size_t)(n ? n : 1) * sizeof *o);
            if (!o) return xfail(x, "out of memory");
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
static int fwd_writes_grads(const mgc_exec *x, int c) {
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
    case MGC_I_FORWARD: return fwd_writes_grads(x, in->chunk);
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
    reducer_reset(x); /* a failed step's reductions have drained */
    x->sends_queued = 0;
    if (x->snd) sender_drain(x, 0); /* and a failed step's transfers; a new epoch */
    /* the gradients start the step at zero: zeroed beside the forward where the backend can
     * (docs/runtime.md), fenced before the first instruction that may touch them */
    int zpend = 0;
    if (x->n_zl >= 0) { /* only what the first writes do not store (setup_zero_list) */
        unsigned char *base = buf_addr(x, x->grad_buf);
        for (int64_t i = 0; i < x->n_zl; i++)
            x->zl_p[i] = (float *)(base + x->zl_off[i]);
        size_t bytes = sp->buffers[x->grad_buf].bytes;
        if (x->be->iface->zero_list(x->be, base, bytes, x->zl_p, x->zl_len, x->n_zl))
            return be_fail(x, "zeroing gradients");
    } else if (x->be->iface->zero_beside) {
        int zr = x->be->iface->zero_beside(x->be, buf_addr(x, x->grad_buf), sp->buffers[x->grad_buf].bytes);
        if (zr < 0) return be_fail(x, "zeroing gradients");
        zpend = zr == 0;
    } else if (x->be->iface->zero(x->be, buf_addr(x, x->grad_buf), sp->buffers[x->grad_buf].bytes)) {
        return be_fail(x, "zeroing gradients");
    }
    int did_opt = 0;
    for (int64_t i = 0; i < sp->n_instrs; i++) {
        const mgc_instr *in = &sp->instrs[i];
        int rc = 0;
        if (zpend && touches_grads(x, in)) {
            if (x->be->iface->zero_fence(x->be)) {
                be_fail(x, "ordering the backward after the gradients' zeroing");
                job_abort(x, x->err);
                return -1;
            }
            zpend = 0;
        }
        if (x->prof && prof_clock(x, &t0)) {
            job_abort(x, x->err);
            return -1;
        }
        if (x->snd && sender_fence(x, i)) { /* sends whose bytes this instruction may reuse */
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
        case MGC_I_REDUCE_GRADS: rc = x->eval ? 0 : reduce_grads(x, in->arg); break;
        case MGC_I_EMBED_GRADS: rc = x->eval ? 0 : embed_grads(x); break;
        case MGC_I_OPTIMIZER:
            /* every handed-over bucket is back (each has its REDUCE_GRADS before this) */
            if (!x->eval) rc = (x->red ? reducer_wait(x, -1) : 0) || optimizer(x, st);
            did_opt = 1;
            break;
        case MGC_I_GATHER_PARAMS: rc = x->eval ? 0 : gather_params(x, in->arg); break;
        default: rc = xfail(x, "instruction %" PRId64 ": unknown op %u", i, in->op);
        }
        if (!rc && x->prof && !(rc = prof_clock(x, &t1))) mgc_profile_add_instr(x->prof, i, t1 - t0);
        if (rc) {
            job_abort(x, x->err);
            return -1;
        }
    }
    if (!did_opt) {
        xfail(x, "stage %" PRId64 ": the schedule has no optimizer step", sp->pp_rank);
        job_abort(x, x->err);
        return -1;
    }
    if (x->snd && sender_drain(x, 1)) { /* every send of the step has left */
        job_abort(x, x->err);
        return -1;
    }
    /* the step's losses, from the ranks that computed them, to every rank */
    float part[3] = {(float)x->loss_sum, (float)x->aux_sum, (float)x->z_sum}, tot[3];
    /* aux and z are counted on tp/cp ranks alike; keep one data-parallel copy each */
    mgc_comm_status s = mgc_comm_all_reduce(x->world, part, tot, 3, MGC_DT_F32, MGC_COMM_SUM);
    if (s != MGC_COMM_OK) return comm_fail(x, x->world, s, "loss all-reduce");
    double denom = (double)(x->mb_count * x->dp);
    /* MoE losses were added on every expert-data replica of the dense grid: every rank of a
     * (dp) group computes its own tokens' terms, so the world sum covers each token once */
    st->loss = tot[0] / denom;
    st->aux_loss = tot[1] / denom;
    st->z_loss = tot[2] / denom;
    st->tokens = x->mbs * x->mb_count * x->dp * x->seq_length;
    st->graph_replays = x->graph_replays;
    st->staged_bytes = x->fg->staged_bytes + (x->red ? reducer_staged(x) : 0);
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
