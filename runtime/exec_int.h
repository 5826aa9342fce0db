/* exec_int.h - what the executor's files share (exec.c, exec_setup.c, exec_comm.c,
 * exec_overlap.c): the executor's state, a thread's communication, small address helpers,
 * and the functions one file defines for another.  Private to runtime/. */
#ifndef MGC_EXEC_INT_H
#define MGC_EXEC_INT_H

#include "exec.h"

#include <stddef.h>
#include <stdint.h>
#include <string.h>

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

/* ---- communication on device memory --------------------------------------------------
 * The local and mpi communicators read and write host memory.  When the backend's arena is
 * device memory (iface->device_memory), every collective and pipeline transfer goes through
 * one host buffer: the send side is downloaded, the host collective runs on the buffer, and
 * the receive side is uploaded.  The reductions are still the communicator's, in group-rank
 * order, so the numbers are those of a host arena.
 *
 * A thread that communicates has an xcomm: the executor's own thread (x->fg), and the
 * gradient reducer's (exec_overlap.c).  The reducer's moves go through the backend's transfer
 * slots (xfer_*), ordered after the compute the executor had issued when it handed the bucket
 * over (`mark`).  The mgc_exec_comm_* functions (exec_comm.c) are the communicator calls on
 * arena pointers; they return 0, or -1 with k->err set (`what` names the call). */
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

/* ---- small helpers ---------------------------------------------------------------- */

static inline uint64_t tnumel(const mgc_plan_tensor *t) {
    uint64_t n = 1;
    for (int i = 0; i < t->rank; i++)
        n *= (uint64_t)t->dim[i];
    return n;
}

static inline const char *sname(const mgc_exec *x, uint32_t off) {
    const char *s = mgc_plan_strat(x->plan, off);
    return s ? s : "?";
}

/* The layer of an expert-bias input (plan.h mgc_plan_expert_bias_layer), else -1. */
static inline int64_t bias_layer(const mgc_exec *x, const mgc_plan_tensor *T) {
    int64_t l = T->role == MGC_TR_INPUT && !T->view && T->rank == 1 && T->dim[0] == x->moe_E
                    ? mgc_plan_expert_bias_layer(sname(x, T->name))
                    : -1;
    return l < x->moe_L ? l : -1;
}

static inline int ends_with(const char *s, const char *suffix) {
    size_t a = strlen(s), b = strlen(suffix);
    return a >= b && !strcmp(s + a - b, suffix);
}

/* ---- addresses ---------------------------------------------------------------------- */

static inline unsigned char *buf_addr(const mgc_exec *x, int32_t b) {
    return x->arena + x->sp->buffers[b].offset;
}

/* Address of tensor t of chunk c while running microbatch mb (NULL: not materialised). */
static inline void *taddr(const mgc_exec *x, int c, int32_t t, int32_t mb) {
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

/* The gradient of flat element `elem` (fp32). */
static inline float *gptr(const mgc_exec *x, int64_t elem) {
    return (float *)buf_addr(x, x->grad_buf) + elem;
}
/* The weights of element `elem` (fp32, or bf16 bits with a master copy). */
static inline void *wptr(const mgc_exec *x, int64_t elem) {
    return buf_addr(x, x->weight_buf) + (size_t)elem * (x->w16 ? 2 : 4);
}

/* ---- exec.c -------------------------------------------------------------------------- */

/* Records the executor's error (x->err); returns -1. */
int mgc_exec_fail(mgc_exec *x, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;
/* ... "rank R: what: " and the backend's error; -1 */
int mgc_exec_fail_backend(mgc_exec *x, const char *what);
/* ... "rank R: what: " the status and the communicator's error; -1 */
int mgc_exec_fail_comm(mgc_exec *x, mgc_comm *c, mgc_comm_status s, const char *what);
/* The transfer slot of a p2p instruction: 0 send_act, 1 recv_act, 2 send_grad, 3 recv_grad;
 * -1 for other ops. */
int mgc_exec_comm_slot(uint32_t op);
/* Whether chunk c's forward program writes the gradient buffer. */
int mgc_exec_fwd_writes_grads(const mgc_exec *x, int c);

/* ---- exec_comm.c: the communicator calls on arena pointers (0, or -1 with k->err) ------ */

int mgc_exec_comm_all_reduce(xcomm *k, mgc_comm *g, const void *in, void *out, size_t n,
                             mgc_dtype dt, mgc_comm_red red, const char *what);
int mgc_exec_comm_reduce_scatter(xcomm *k, mgc_comm *g, const void *in, void *out, size_t n,
                                 mgc_dtype dt, const char *what);
int mgc_exec_comm_all_gather(xcomm *k, mgc_comm *g, const void *in, void *out, size_t n,
                             mgc_dtype dt, const char *what);
int mgc_exec_comm_send(xcomm *k, mgc_comm *g, const void *buf, size_t bytes, int peer,
                       const char *what);
int mgc_exec_comm_recv(xcomm *k, mgc_comm *g, void *buf, size_t bytes, int peer,
                       const char *what);
/* k's staging buffer of at least `bytes` (NULL with k->err), its upload to the arena, and
 * its release */
unsigned char *mgc_exec_xcomm_stage(xcomm *k, size_t bytes);
int mgc_exec_xcomm_up(xcomm *k, void *arena, const void *host, size_t bytes);
void mgc_exec_xcomm_release(xcomm *k);
/* A collective op of chunk c's program for microbatch mb. */
int mgc_exec_run_collective(mgc_exec *x, int c, const mgc_plan_op *op, int32_t mb);

/* ---- exec_overlap.c: the gradient reducer ------------------------------------------------ */

int mgc_exec_setup_overlap(mgc_exec *x);
/* whether buckets are handed to the reducer in this step */
int mgc_exec_overlapping(const mgc_exec *x);
/* hands over the buckets that op `op` of chunk c's last backward makes final */
int mgc_exec_hand_over(mgc_exec *x, int c, int32_t op);
/* waits for bucket bi (-1: every bucket handed over) */
int mgc_exec_reducer_wait(mgc_exec *x, int64_t bi);
/* the REDUCE_GRADS instruction of bucket bi */
int mgc_exec_reduce_grads(mgc_exec *x, uint32_t bi);
void mgc_exec_reducer_reset(mgc_exec *x);
int64_t mgc_exec_reducer_staged(mgc_exec *x);
void mgc_exec_reducer_stop(mgc_exec *x);

/* ---- exec_overlap.c: the pipeline sender ------------------------------------------------- */

int mgc_exec_setup_sender(mgc_exec *x);
int mgc_exec_sender_p2p(mgc_exec *x, const mgc_instr *in, int64_t i, int32_t b,
                        const char *what);
int mgc_exec_sender_fence(mgc_exec *x, int64_t i);
int mgc_exec_sender_drain(mgc_exec *x, int report);
void mgc_exec_sender_stop(mgc_exec *x);

#endif
