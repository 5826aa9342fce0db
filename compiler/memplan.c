/* memplan.c - the stage builder of the memory planner; see memplan.h and
 * docs/memory-plan.md.  One pass indexes the instruction stream, parameters
 * are laid out flat, each chunk's transient tensors are packed into the pass
 * workspace, per-microbatch buffers are added, and every buffer is placed by
 * the assigner (memplan_assign.c) on the instruction timeline. */
#include "memplan.h"

#include <inttypes.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "kspec.h"

static uint64_t align_up(uint64_t v, uint64_t a) {
    return (v + (a - 1)) & ~(a - 1);
}

static uint64_t round_up(uint64_t v, uint64_t a) {
    return (v + (a - 1)) / a * a;
}

/* ---- the stage builder ---------------------------------------------------------
 * One pass over the instruction stream indexes every (mb, chunk)'s forward
 * and backward; the parameters are laid out flat (per chunk, a dense then an
 * expert section); each chunk's transient tensors are packed on the timeline
 * of its own forward + backward op lists; then every buffer of the rank is
 * one request on the instruction timeline for the assigner. */

/* Where a tensor goes, before buffer indices exist. */
enum { CAT_NONE = 0, CAT_WEIGHT, CAT_GRAD, CAT_ACT, CAT_INPUT, CAT_STASH };

typedef struct tplace {
    uint8_t cat;    /* CAT_* */
    int32_t over;   /* 1 + the tensor whose bytes it takes (an MGC_POF_INPLACE output, or a row
                       view, plan.h tensor.view); 0 none */
    uint64_t delta; /* a view: its bytes' start inside that tensor's */
    uint64_t off;   /* offset inside the buffer of that category */
} tplace;

/* How a chunk's ops touch a tensor. */
typedef struct use {
    int32_t first[2], last[2]; /* op index per pass (0 forward, 1 backward); -1 untouched */
    uint8_t first_read[2];     /* the first touch reads it: live from the pass start */
    uint8_t last_write[2];     /* the last touch writes it: live to the pass end */
} use;

typedef struct builder {
    const mgc_config *c;
    const mgc_grid *g;
    mgc_plan *plan;
    mgc_stage_program *sp;
    mgc_diags *d;
    mgc_loc loc;
    int64_t n;          /* instructions */
    int64_t M, V;       /* microbatches seen (max mb + 1), chunks */
    int64_t *fwd, *bwd; /* (M * V) instruction of FORWARD / BACKWARD of (mb, c); -1 none */
    int64_t *load;      /* (M) first LOAD_BATCH of mb; -1 none */
    int64_t first_compute, last_compute; /* -1 when none */
    uint64_t wsize;                      /* compute dtype bytes */
    use **uses;                          /* [chunk][tensor] */
    tplace **place;                      /* [chunk][tensor] */
    uint64_t **input_off; /* [chunk][tensor] slot of an INPUT-role tensor in the INPUT buffer */
    /* the growing buffer list and its requests */
    mgc_buffer *buf;
    mgc_memreq *req;
    int64_t nb, cap;
    mgc_memplan_cache *cache; /* may be NULL */
} builder;

#if defined(__GNUC__)
__attribute__((format(printf, 3, 4)))
#endif
static int
fail(builder *b, const char *hint, const char *fmt, ...) {
    char msg[768];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    mgc_diag(b->d, MGC_SEV_ERROR, b->loc, hint, "memory plan of pipeline rank %" PRId64 ": %s",
             b->sp->pp_rank, msg);
    return -1;
}

/* Instruction names for messages (plan.h's table is not declared there yet). */
static const char *instr_name(unsigned op) {
    static const char *const names[] = {"LOAD_BATCH",  "FORWARD",   "BACKWARD",     "SEND_ACT",
                                        "RECV_ACT",    "SEND_GRAD", "RECV_GRAD",    "REDUCE_GRADS",
                                        "EMBED_GRADS", "OPTIMIZER", "GATHER_PARAMS"};
    return op < sizeof names / sizeof *names ? names[op] : "?";
}

static int oom(builder *b) {
    return fail(b, NULL, "out of memory");
}

#define BUG_HINT                                                                                   \
    "the stage program breaks the partition/schedule contract (plan/plan.h): a compiler bug"

static uint32_t name_of(builder *b, const char *s) {
    if (!b->plan) return 0;
    uint32_t off = mgc_plan_str(b->plan, s);
    return off == UINT32_MAX ? 0 : off;
}

static const char *tensor_name(const builder *b, const mgc_plan_tensor *t) {
    const char *s = b->plan ? mgc_plan_strat(b->plan, t->name) : NULL;
    return s && s[0] ? s : "(unnamed)";
}

/* Append a buffer and its request; its index, or -1 on OOM. */
static int64_t buf_add(builder *b, mgc_buf_kind kind, int64_t chunk, int64_t mb, uint32_t name,
                       uint64_t bytes, int64_t begin, int64_t end) {
    if (b->nb == b->cap) {
        int64_t cap = b->cap ? 2 * b->cap : 64;
        mgc_buffer *v = realloc(b->buf, (size_t)cap * sizeof *v);
        if (v) b->buf = v;
        mgc_memreq *r = realloc(b->req, (size_t)cap * sizeof *r);
        if (r) b->req = r;
        if (!v || !r) return -1;
        b->cap = cap;
    }
    mgc_buffer *x = &b->buf[b->nb];
    memset(x, 0, sizeof *x);
    x->name = name;
    x->kind = (uint16_t)kind;
    x->chunk = chunk < 0 ? 0xffffu : (uint16_t)chunk;
    x->mb = (int32_t)mb;
    x->bytes = bytes;
    x->live_begin = begin;
    x->live_end = end;
    b->req[b->nb] = (mgc_memreq){bytes, begin, end, MGC_PLAN_ALIGN};
    return b->nb++;
}

uint64_t mgc_memplan_boundary_bytes(const mgc_config *c, const mgc_grid *grid) {
    uint64_t wsize = c->training.precision == MGC_PREC_FP32 ? 4 : 2;
    int64_t cp = grid->cp > 0 ? grid->cp : 1, tp = grid->tp > 0 ? grid->tp : 1;
    uint64_t v = (uint64_t)(c->model.seq_length / cp) * (uint64_t)c->training.micro_batch_size *
                 (uint64_t)c->model.hidden_size * wsize;
    if (c->derived.sequence_parallel && tp > 1) v /= (uint64_t)tp;
    return v;
}

/* ---- instruction index ---- */

static int index_stream(builder *b) {
    const mgc_stage_program *sp = b->sp;
    int64_t maxmb = -1;
    b->first_compute = b->last_compute = -1;
    for (int64_t i = 0; i < b->n; i++) {
        const mgc_instr *in = &sp->instrs[i];
        if (in->op >= MGC_I__COUNT)
            return fail(b, BUG_HINT, "instruction %" PRId64 " has unknown op %u", i, in->op);
        if (in->op <= MGC_I_RECV_GRAD) {
            if (in->mb < 0)
                return fail(b, BUG_HINT, "instruction %" PRId64 " (%s) has no microbatch", i,
                            instr_name(in->op));
            if (in->chunk >= b->V)
                return fail(b, BUG_HINT, "instruction %" PRId64 " names chunk %u of %" PRId64, i,
                            in->chunk, b->V);
            if (in->mb > maxmb) maxmb = in->mb;
        }
        if (in->op == MGC_I_FORWARD || in->op == MGC_I_BACKWARD) {
            if (b->first_compute < 0) b->first_compute = i;
            b->last_compute = i;
        }
    }
    b->M = maxmb + 1;
    size_t pairs = (size_t)(b->M * b->V);
    b->fwd = malloc((pairs ? pairs : 1) * sizeof *b->fwd);
    b->bwd = malloc((pairs ? pairs : 1) * sizeof *b->bwd);
    b->load = malloc((b->M ? (size_t)b->M : 1) * sizeof *b->load);
    if (!b->fwd || !b->bwd || !b->load) return oom(b);
    for (size_t i = 0; i < pairs; i++)
        b->fwd[i] = b->bwd[i] = -1;
    for (int64_t m = 0; m < b->M; m++)
        b->load[m] = -1;
    for (int64_t i = 0; i < b->n; i++) {
        const mgc_instr *in = &sp->instrs[i];
        int64_t k = (int64_t)in->mb * b->V + in->chunk;
        switch (in->op) {
        case MGC_I_LOAD_BATCH:
            if (b->load[in->mb] < 0) b->load[in->mb] = i;
            break;
        case MGC_I_FORWARD:
            if (b->fwd[k] >= 0)
                return fail(b, BUG_HINT,
                            "microbatch %" PRId32
                            " chunk %u is forwarded twice (instructions %" PRId64 " and %" PRId64
                            ")",
                            in->mb, in->chunk, b->fwd[k], i);
            b->fwd[k] = i;
            break;
        case MGC_I_BACKWARD:
            if (b->bwd[k] >= 0)
                return fail(b, BUG_HINT,
                            "microbatch %" PRId32
                            " chunk %u is run backward twice (instructions %" PRId64 " and %" PRId64
                            ")",
                            in->mb, in->chunk, b->bwd[k], i);
            if (b->fwd[k] < 0)
                return fail(b, BUG_HINT,
                            "instruction %" PRId64 ": backward of microbatch %" PRId32
                            " chunk %u before its forward",
                            i, in->mb, in->chunk);
            b->bwd[k] = i;
            break;
        default:
            break;
        }
    }
    for (int64_t k = 0; k < b->M * b->V; k++)
        if ((b->fwd[k] >= 0) != (b->bwd[k] >= 0))
            return fail(b, BUG_HINT,
                        "microbatch %" PRId64 " chunk %" PRId64
                        " is forwarded but never run backward",
                        k / b->V, k % b->V);
    return 0;
}

/* ---- how ops touch tensors ---- */

static void touch(use *u, int pass, int32_t op, int read) {
    if (u->first[pass] < 0) u->first[pass] = op, u->first_read[pass] = (uint8_t)read;
    u->last[pass] = op;
    u->last_write[pass] = (uint8_t)!read;
}

/* The uses of `from` become `into`'s (a tensor whose bytes `from` takes); `from` has none. */
static void merge_uses(use *into, use *from) {
    for (int q = 0; q < 2; q++) {
        if (from->first[q] < 0) continue;
        if (into->first[q] < 0 || from->first[q] < into->first[q])
            into->first[q] = from->first[q], into->first_read[q] = from->first_read[q];
        if (from->last[q] > into->last[q] || into->last[q] < 0)
            into->last[q] = from->last[q], into->last_write[q] = from->last_write[q];
        from->first[q] = from->last[q] = -1;
    }
}

static int is_grouped(uint16_t kind) {
    return kind == MGC_POP_GROUPED_LINEAR || kind == MGC_POP_GROUPED_LINEAR_DGRAD ||
           kind == MGC_POP_GROUPED_LINEAR_WGRAD;
}

static int chunk_uses(builder *b, int64_t c) {
    const mgc_plan_chunk *ch = &b->sp->chunks[c];
    size_t nt = ch->n_tensors > 0 ? (size_t)ch->n_tensors : 1;
    use *u = b->uses[c] = malloc(nt * sizeof *u);
    b->place[c] = calloc(nt, sizeof *b->place[c]);
    b->input_off[c] = calloc(nt, sizeof *b->input_off[c]);
    if (!u || !b->place[c] || !b->input_off[c]) return oom(b);
    for (int64_t t = 0; t < ch->n_tensors; t++) {
        u[t].first[0] = u[t].first[1] = u[t].last[0] = u[t].last[1] = -1;
        u[t].first_read[0] = u[t].first_read[1] = u[t].last_write[0] = u[t].last_write[1] = 0;
    }
    for (int pass = 0; pass < 2; pass++) {
        int64_t n = pass ? ch->n_bwd : ch->n_fwd;
        const mgc_plan_op *ops = pass ? ch->bwd : ch->fwd;
        if (n > INT32_MAX) return fail(b, BUG_HINT, "chunk %" PRId64 " has %" PRId64 " ops", c, n);
        for (int64_t i = 0; i < n; i++) {
            const mgc_plan_op *o = &ops[i];
            if (o->n_in > MGC_PLAN_MAX_IO || o->n_out > MGC_PLAN_MAX_IO)
                return fail(b, BUG_HINT, "chunk %" PRId64 " op %" PRId64 " has too many operands",
                            c, i);
            for (int k = 0; k < o->n_in + o->n_out; k++) {
                int read = k < o->n_in;
                int32_t t = read ? o->in[k] : o->out[k - o->n_in];
                if (t < 0 || t >= ch->n_tensors)
                    return fail(b, BUG_HINT,
                                "chunk %" PRId64 " %s op %" PRId64 " names tensor %" PRId32
                                " of %" PRId64,
                                c, pass ? "backward" : "forward", i, t, ch->n_tensors);
                touch(&u[t], pass, (int32_t)i, read);
            }
        }
    }
    /* row views (plan.h tensor.view): the viewed tensor's request covers the view's uses;
     * the view takes its place plus the view's byte offset into it, which the view's offset
     * holds relative to the tensor's (before this plan: the tensor's is 0) */
    for (int64_t t = 0; t < ch->n_tensors; t++) {
        const mgc_plan_tensor *v = &ch->tensors[t];
        if (!v->view) continue;
        int64_t w = (int64_t)v->view - 1;
        if (w < 0 || w >= ch->n_tensors || w == t || ch->tensors[w].view ||
            v->offset < ch->tensors[w].offset)
            return fail(b, BUG_HINT,
                        "chunk %" PRId64 " tensor %" PRId64 " is a view of %" PRId64
                        " that is not a tensor of its own",
                        c, t, w);
        merge_uses(&u[w], &u[t]);
        b->place[c][t].over = (int32_t)w + 1;
        b->place[c][t].delta = v->offset - ch->tensors[w].offset;
    }
    /* in-place outputs: the input's request covers both tensors' uses; the output has none
     * of its own and takes the input's place at the end (mgc_memplan_build_cached) */
    for (int pass = 0; pass < 2; pass++) {
        int64_t n = pass ? ch->n_bwd : ch->n_fwd;
        const mgc_plan_op *ops = pass ? ch->bwd : ch->fwd;
        for (int64_t i = 0; i < n; i++) {
            const mgc_plan_op *o = &ops[i];
            if (!(o->flags & MGC_POF_INPLACE)) continue;
            int32_t x = o->n_in ? o->in[0] : -1, y = o->n_out ? o->out[0] : -1;
            if (x < 0 || y < 0 || x == y || u[x].last[pass] != i || (!pass && u[x].first[1] >= 0) ||
                b->place[c][y].over)
                return fail(b, BUG_HINT,
                            "chunk %" PRId64 " %s op %" PRId64
                            " writes in place over a tensor that a later op touches",
                            c, pass ? "backward" : "forward", i);
            merge_uses(&u[x], &u[y]);
            b->place[c][y].over = x + 1;
        }
    }
    return 0;
}

/* ---- in-place outputs (memplan.h) ---- */

/* Ops whose launchers write out[0] over in[0] (plan.h MGC_POF_INPLACE). */
static int inplace_capable(uint16_t kind) {
    return kind == MGC_POP_CROSS_ENTROPY_BWD;
}

/* Ops that read in[0] at a row pitch (tensor.ld). */
static int reads_pitched(const mgc_plan_op *o, int32_t t) {
    if (o->kind != MGC_POP_LINEAR_DGRAD && (o->kind != MGC_POP_LINEAR_WGRAD || o->n_out != 1))
        return 0; /* a bias gradient's column sums take no row pitch */
    for (int k = 1; k < o->n_in; k++)
        if (o->in[k] == t) return 0;
    for (int k = 0; k < o->n_out; k++)
        if (o->out[k] == t) return 0;
    return o->in[0] == t;
}

static int touches(const mgc_plan_op *o, int32_t t) {
    for (int k = 0; k < o->n_in; k++)
        if (o->in[k] == t) return 1;
    for (int k = 0; k < o->n_out; k++)
        if (o->out[k] == t) return 1;
    return 0;
}

int64_t mgc_memplan_inplace(mgc_plan_chunk *ch) {
    int64_t marked = 0;
    for (int pass = 0; pass < 2; pass++) {
        int64_t n = pass ? ch->n_bwd : ch->n_fwd;
        mgc_plan_op *ops = pass ? ch->bwd : ch->fwd;
        for (int64_t i = 0; i < n; i++) {
            mgc_plan_op *o = &ops[i];
            if (!inplace_capable(o->kind) || (o->flags & MGC_POF_INPLACE) || o->n_in < 1 ||
                o->n_out < 1)
                continue;
            int32_t xi = o->in[0], yi = o->out[0];
            if (xi < 0 || yi < 0 || xi >= ch->n_tensors || yi >= ch->n_tensors || xi == yi)
                continue;
            mgc_plan_tensor *x = &ch->tensors[xi], *y = &ch->tensors[yi];
            size_t xs = mgc_dtype_size((mgc_dtype)x->dtype), ys = mgc_dtype_size((mgc_dtype)y->dtype);
            int ok = x->role == MGC_TR_ACTIVATION && y->role == MGC_TR_ACT_GRAD && !x->ld &&
                     !y->ld && y->buffer != MGC_PLAN_BUF_STASH && x->rank == y->rank &&
                     x->rank >= 1 && ys && ys <= xs && xs % ys == 0;
            for (int k = 0; ok && k < x->rank; k++)
                ok = x->dim[k] == y->dim[k];
            for (int k = 1; ok && k < o->n_in; k++)
                ok = o->in[k] != yi && o->in[k] != xi;
            for (int k = 1; ok && k < o->n_out; k++)
                ok = o->out[k] != yi && o->out[k] != xi;
            /* x: no later op touches it; y: no other op writes it, and a narrower y goes only
             * to readers that take a row pitch */
            for (int q = 0; ok && q < 2; q++) {
                int64_t m = q ? ch->n_bwd : ch->n_fwd;
                const mgc_plan_op *p = q ? ch->bwd : ch->fwd;
                for (int64_t j = 0; ok && j < m; j++) {
                    if (q == pass && j == i) continue;
                    int after = q > pass || (q == pass && j > i);
                    if (after && touches(&p[j], xi)) ok = 0;
                    for (int k = 0; ok && k < p[j].n_out; k++)
                        if (p[j].out[k] == yi) ok = 0;
                    if (ok && touches(&p[j], yi) && (!after || (xs != ys && !reads_pitched(&p[j], yi))))
                        ok = 0;
                }
            }
            if (ok && xs != ys && (uint64_t)x->dim[x->rank - 1] * (xs / ys) > UINT32_MAX) ok = 0;
            if (!ok) continue;
            o->flags |= MGC_POF_INPLACE;
            y->ld = xs == ys ? 0 : (uint32_t)((uint64_t)x->dim[x->rank - 1] * (xs / ys));
            y->bytes = x->bytes;
            marked++;
        }
    }
    return marked;
}

/* ---- parameters: the flat layout and the optimizer shards ----
 * Per chunk a dense section then an expert section; each parameter starts at
 * a multiple of MGC_MEMPLAN_PARAM_ALIGN_ELEMS elements; each section is
 * padded to a multiple of D * that, D its shard divisor (dp*cp dense, edp
 * expert; 1 without the distributed optimizer), so it reduce-scatters in
 * place into D equal, aligned shards.  Weights (compute dtype) and main
 * grads (fp32) share element positions.  flat_layout is the one statement of
 * this rule: the stage builder places tensors with it and
 * mgc_memplan_buckets cuts its sections into gradient buckets. */

typedef struct param_layout {
    uint64_t flat;  /* padded elements of the flat weight / grad layout */
    uint64_t shard; /* elements of this rank's optimizer shard (sum over sections) */
    uint64_t elems, expert_elems;
} param_layout;

/* One section of the flat layout. */
typedef struct psec {
    int64_t chunk;
    int expert;            /* 0 dense (reduced over dp x cp), 1 expert (over edp) */
    uint64_t begin, count; /* elements, padding included (count a multiple of 128 * D) */
    uint64_t D;            /* shard divisor */
} psec;

static uint64_t compute_dtype_bytes(const mgc_config *c) {
    return c->training.precision == MGC_PREC_FP32 ? 4 : 2;
}

static void shard_divisors(const mgc_config *c, const mgc_grid *grid, uint64_t *d_dense,
                           uint64_t *d_expert) {
    *d_dense = *d_expert = 1;
    if (!c->parallel.distributed_optimizer) return;
    *d_dense = (uint64_t)(grid->dp > 0 ? grid->dp : 1) * (uint64_t)(grid->cp > 0 ? grid->cp : 1);
    *d_expert = grid->edp > 0 ? (uint64_t)grid->edp : *d_dense;
}

/* flags[t] = 1 for the expert parameters of ch: split over the expert grid,
 * or touched by a grouped (expert) linear of either pass.  0; -1 on OOM. */
static int expert_flags(const mgc_plan_chunk *ch, uint8_t **flags) {
    size_t nt = ch->n_tensors > 0 ? (size_t)ch->n_tensors : 1;
    uint8_t *f = *flags = calloc(nt, 1);
    if (!f) return -1;
    for (int64_t t = 0; t < ch->n_tensors; t++) {
        uint16_t g = ch->tensors[t].split_group;
        f[t] = g == MGC_GROUP_EP || g == MGC_GROUP_ETP || g == MGC_GROUP_EDP;
    }
    for (int pass = 0; pass < 2; pass++) {
        int64_t n = pass ? ch->n_bwd : ch->n_fwd;
        const mgc_plan_op *ops = pass ? ch->bwd : ch->fwd;
        for (int64_t i = 0; i < n; i++) {
            const mgc_plan_op *o = &ops[i];
            if (!is_grouped(o->kind)) continue;
            for (int k = 0; k < o->n_in + o->n_out && k < 2 * MGC_PLAN_MAX_IO; k++) {
                int32_t t = k < o->n_in ? o->in[k] : o->out[k - o->n_in];
                if (t >= 0 && t < ch->n_tensors) f[t] = 1;
            }
        }
    }
    return 0;
}

/* Lay out the parameters of sp's chunks: secs[2c + expert] (may be NULL)
 * receives chunk c's sections (count 0 when empty), `place` (may be NULL)
 * each parameter's element position with cat CAT_WEIGHT.  0; -1 on
 * overflow; -2 out of memory. */
static int flat_layout(const mgc_stage_program *sp, uint64_t wsize, uint64_t d_dense,
                       uint64_t d_expert, tplace **place, psec *secs, param_layout *pl) {
    const uint64_t A = MGC_MEMPLAN_PARAM_ALIGN_ELEMS;
    memset(pl, 0, sizeof *pl);
    for (int64_t c = 0; c < sp->n_chunks; c++) {
        const mgc_plan_chunk *ch = &sp->chunks[c];
        uint8_t *expert;
        if (expert_flags(ch, &expert)) return -2;
        for (int grp = 0; grp < 2; grp++) {
            uint64_t start = pl->flat, D = grp ? d_expert : d_dense;
            for (int64_t t = 0; t < ch->n_tensors; t++) {
                const mgc_plan_tensor *x = &ch->tensors[t];
                if (x->role != MGC_TR_PARAM || expert[t] != grp) continue;
                uint64_t el = x->bytes / wsize;
                if (el > (UINT64_MAX >> 8) - pl->flat) {
                    free(expert);
                    return -1;
                }
                if (place) {
                    place[c][t].cat = CAT_WEIGHT;
                    place[c][t].off = pl->flat; /* elements */
                }
                pl->elems += el;
                if (grp) pl->expert_elems += el;
                pl->flat += align_up(el, A);
            }
            uint64_t sec = round_up(pl->flat - start, A * D);
            if (sec > (UINT64_MAX >> 8) - start) {
                free(expert);
                return -1;
            }
            pl->flat = start + sec;
            pl->shard += sec / D;
            if (secs) secs[2 * c + grp] = (psec){c, grp, start, sec, D};
        }
        free(expert);
    }
    return 0;
}

static int grad_pair(builder *b, int64_t c, int64_t *params, int64_t np, int64_t *grads,
                     int64_t ng);

static int layout_params(builder *b, param_layout *pl, uint64_t d_dense, uint64_t d_expert) {
    mgc_dtype want = b->c->training.precision == MGC_PREC_FP32   ? MGC_DT_F32
                     : b->c->training.precision == MGC_PREC_FP16 ? MGC_DT_F16
                                                                 : MGC_DT_BF16;
    for (int64_t c = 0; c < b->V; c++) {
        const mgc_plan_chunk *ch = &b->sp->chunks[c];
        for (int64_t t = 0; t < ch->n_tensors; t++) {
            const mgc_plan_tensor *x = &ch->tensors[t];
            if (x->role == MGC_TR_PARAM && x->dtype != want)
                return fail(b, "the partitioner gives every parameter the training precision",
                            "parameter %s of chunk %" PRId64 " is %s, the training precision is %s",
                            tensor_name(b, x), c, mgc_dtype_name((mgc_dtype)x->dtype),
                            mgc_dtype_name(want));
        }
    }
    int lrc = flat_layout(b->sp, b->wsize, d_dense, d_expert, b->place, NULL, pl);
    if (lrc == -2) return oom(b);
    if (lrc) return fail(b, NULL, "parameter bytes overflow");
    for (int64_t c = 0; c < b->V; c++) {
        mgc_plan_chunk *ch = &b->sp->chunks[c];
        size_t nt = ch->n_tensors > 0 ? (size_t)ch->n_tensors : 1;
        int64_t *params = malloc(nt * sizeof *params), *grads = malloc(nt * sizeof *grads), np = 0,
                ng = 0;
        if (!params || !grads) {
            free(params);
            free(grads);
            return oom(b);
        }
        for (int64_t t = 0; t < ch->n_tensors; t++) {
            if (ch->tensors[t].role == MGC_TR_PARAM) params[np++] = t;
            if (ch->tensors[t].role == MGC_TR_GRAD) grads[ng++] = t;
        }
        int rc = grad_pair(b, c, params, np, grads, ng);
        free(params);
        free(grads);
        if (rc) return rc;
        for (int64_t t = 0; t < ch->n_tensors; t++)
            if (b->place[c][t].cat == CAT_WEIGHT) b->place[c][t].off *= b->wsize;
    }
    return 0;
}

/* ---- gradient buckets ----
 * Each non-empty section is cut from its start into pieces of B elements, B
 * the largest multiple of 128 * D not above bucket_elems (at least 128 * D),
 * the last piece taking the rest; sections are multiples of 128 * D, so
 * every bucket is too and reduce-scatters in place into D aligned shards.
 * Buckets are numbered in reverse layout order: bucket 0 is the last piece
 * of the last section, whose gradients the backward finishes first. */
int mgc_memplan_buckets(const mgc_config *c, const mgc_grid *grid, const mgc_stage_program *sp,
                        int64_t bucket_elems, mgc_bucket **out, int64_t *n_out) {
    *out = NULL;
    *n_out = 0;
    if (!sp || sp->n_chunks < 0 || sp->n_chunks >= 0xffff || (sp->n_chunks && !sp->chunks))
        return -1;
    uint64_t wsize = compute_dtype_bytes(c), d_dense, d_expert;
    shard_divisors(c, grid, &d_dense, &d_expert);
    size_t ns = sp->n_chunks > 0 ? 2 * (size_t)sp->n_chunks : 1;
    psec *secs = calloc(ns, sizeof *secs);
    if (!secs) return -1;
    param_layout pl;
    if (flat_layout(sp, wsize, d_dense, d_expert, NULL, secs, &pl)) {
        free(secs);
        return -1;
    }
    const uint64_t A = MGC_MEMPLAN_PARAM_ALIGN_ELEMS;
    uint64_t want = bucket_elems > 0 ? (uint64_t)bucket_elems : 1, total = 0;
    for (size_t i = 0; i < 2 * (size_t)sp->n_chunks; i++) {
        uint64_t unit = A * secs[i].D, B = want / unit * unit;
        if (!B) B = unit;
        total += (secs[i].count + B - 1) / B;
    }
    mgc_bucket *v = total ? calloc((size_t)total, sizeof *v) : NULL;
    if (total && !v) {
        free(secs);
        return -1;
    }
    uint64_t k = total;
    for (size_t i = 0; i < 2 * (size_t)sp->n_chunks; i++) {
        const psec *q = &secs[i];
        uint64_t unit = A * q->D, B = want / unit * unit;
        if (!B) B = unit;
        for (uint64_t at = 0; at < q->count; at += B) {
            mgc_bucket *x = &v[--k]; /* reverse layout order */
            x->group = q->expert ? MGC_GROUP_EDP : MGC_GROUP_DPCP;
            x->chunk = (uint16_t)q->chunk;
            x->shards = (int64_t)q->D;
            x->begin = q->begin + at;
            x->count = q->count - at < B ? q->count - at : B;
            x->grad_buffer = x->weight_buffer = -1; /* mgc_memplan_build sets them */
            x->grad_offset = x->begin * 4;
            x->grad_bytes = x->count * 4;
            x->weight_offset = x->begin * wsize;
            x->weight_bytes = x->count * wsize;
        }
    }
    free(secs);
    *out = v;
    *n_out = (int64_t)total;
    return 0;
}

/* Place each gradient at its parameter's element position (x 4 bytes).
 * Pairing: the i-th grad with the i-th param when the chunk lists as many of
 * each with matching element counts (the partitioner's order); otherwise by
 * name, "<param>.grad" and similar. */
static int grad_pair(builder *b, int64_t c, int64_t *params, int64_t np, int64_t *grads,
                     int64_t ng) {
    const mgc_plan_chunk *ch = &b->sp->chunks[c];
    static const char *const suffix[] = {".main_grad", ".grad", "_grad", "@grad", ":grad"};
    static const char *const prefix[] = {"grad.", "grad:", "grad_", "d_", "d."};
    int ordinal = np == ng;
    for (int64_t i = 0; ordinal && i < ng; i++) {
        size_t gs = mgc_dtype_size((mgc_dtype)ch->tensors[grads[i]].dtype);
        if (!gs || ch->tensors[grads[i]].bytes / gs != ch->tensors[params[i]].bytes / b->wsize)
            ordinal = 0;
    }
    for (int64_t i = 0; i < ng; i++) {
        const mgc_plan_tensor *x = &ch->tensors[grads[i]];
        int64_t p = ordinal ? params[i] : -1;
        const char *gn = b->plan ? mgc_plan_strat(b->plan, x->name) : NULL;
        size_t gl = gn ? strlen(gn) : 0;
        for (int64_t j = 0; p < 0 && gl && j < np; j++) {
            const char *pn = mgc_plan_strat(b->plan, ch->tensors[params[j]].name);
            size_t pnl = pn ? strlen(pn) : 0;
            if (!pnl || pnl >= gl) continue;
            for (size_t s = 0; p < 0 && s < sizeof suffix / sizeof *suffix; s++)
                if (gl == pnl + strlen(suffix[s]) && !strncmp(gn, pn, pnl) &&
                    !strcmp(gn + pnl, suffix[s]))
                    p = params[j];
            for (size_t s = 0; p < 0 && s < sizeof prefix / sizeof *prefix; s++) {
                size_t sl = strlen(prefix[s]);
                if (gl == pnl + sl && !strncmp(gn, prefix[s], sl) && !strcmp(gn + sl, pn))
                    p = params[j];
            }
        }
        if (p < 0)
            return fail(
                b, "name gradients \"<param>.grad\" or list them in the order of their parameters",
                "gradient %s of chunk %" PRId64 " matches no parameter", tensor_name(b, x), c);
        size_t gs = mgc_dtype_size((mgc_dtype)x->dtype);
        uint64_t el = ch->tensors[p].bytes / b->wsize;
        if (!gs || gs > 4 || x->bytes / gs != el)
            return fail(b, BUG_HINT,
                        "gradient %s of chunk %" PRId64 " (%s, %" PRIu64
                        " bytes) does not fit the fp32 main grad of %s (%" PRIu64 " elements)",
                        tensor_name(b, x), c, mgc_dtype_name((mgc_dtype)x->dtype), x->bytes,
                        tensor_name(b, &ch->tensors[p]), el);
        b->place[c][grads[i]].cat = CAT_GRAD;
        b->place[c][grads[i]].off =
            b->place[c][p].off * 4; /* param position is still in elements */
    }
    return 0;
}

/* ---- stashed and input tensors ---- */

static int check_stash(builder *b, int64_t c) {
    const mgc_plan_chunk *ch = &b->sp->chunks[c];
    for (int64_t t = 0; t < ch->n_tensors; t++) {
        const mgc_plan_tensor *x = &ch->tensors[t];
        if (x->buffer != MGC_PLAN_BUF_STASH) continue;
        if (x->role == MGC_TR_PARAM || x->role == MGC_TR_GRAD)
            return fail(b, BUG_HINT, "%s %s of chunk %" PRId64 " is marked stashed",
                        x->role ? "gradient" : "parameter", tensor_name(b, x), c);
        if (x->offset > ch->stash_bytes || x->bytes > ch->stash_bytes - x->offset)
            return fail(b, BUG_HINT,
                        "stashed tensor %s of chunk %" PRId64 " at [%" PRIu64 ", +%" PRIu64
                        ") is outside the stash of %" PRIu64 " bytes",
                        tensor_name(b, x), c, x->offset, x->bytes, ch->stash_bytes);
        b->place[c][t].cat = CAT_STASH;
    }
    return 0;
}

/* Input tensors (tokens, labels, loss mask) live in the INPUT buffer of their
 * microbatch, which LOAD_BATCH fills: one slot per distinct (name, bytes),
 * in order of first appearance (chunk, then tensor order).  An input the
 * partitioner stashed keeps its stash placement; FORWARD copies it from its
 * slot.  uses_bwd[c]: chunk c's backward reads an input that is not stashed,
 * so the buffer lives until that backward.  Returns the buffer size, or
 * UINT64_MAX on overflow. */
static uint64_t layout_inputs(builder *b, uint8_t *uses_fwd, uint8_t *uses_bwd) {
    uint64_t size = 0;
    for (int64_t c = 0; c < b->V; c++) {
        const mgc_plan_chunk *ch = &b->sp->chunks[c];
        uses_fwd[c] = uses_bwd[c] = 0;
        for (int64_t t = 0; t < ch->n_tensors; t++) {
            const mgc_plan_tensor *x = &ch->tensors[t];
            if (x->role != MGC_TR_INPUT || x->view) continue; /* a view: its tensor's slot */
            int stashed = b->place[c][t].cat == CAT_STASH;
            uses_fwd[c] = 1;
            if (!stashed && b->uses[c][t].first[1] >= 0) uses_bwd[c] = 1;
            /* an earlier input with the same name and size shares the slot */
            uint64_t off = UINT64_MAX;
            for (int64_t c2 = 0; c2 <= c && off == UINT64_MAX; c2++) {
                const mgc_plan_chunk *ch2 = &b->sp->chunks[c2];
                for (int64_t t2 = 0; t2 < (c2 == c ? t : ch2->n_tensors); t2++) {
                    const mgc_plan_tensor *y = &ch2->tensors[t2];
                    if (y->role == MGC_TR_INPUT && y->name == x->name && x->name &&
                        y->bytes == x->bytes) {
                        off = b->place[c2][t2].cat == CAT_INPUT ? b->place[c2][t2].off
                                                                : b->input_off[c2][t2];
                        break;
                    }
                }
            }
            if (off == UINT64_MAX) {
                if (x->bytes > UINT64_MAX / 2 - size) return UINT64_MAX;
                off = size;
                size = align_up(size + x->bytes, MGC_PLAN_ALIGN);
            }
            b->input_off[c][t] = off;
            if (stashed) continue;
            b->place[c][t].cat = CAT_INPUT;
            b->place[c][t].off = off;
        }
    }
    return size;
}

/* ---- the pass workspace: transient tensors of one chunk ----
 * Timeline: forward ops 0..n_fwd-1, then backward ops n_fwd..n_fwd+n_bwd-1.
 * A tensor is live in a pass from its first touch to its last; from the pass
 * start when the pass reads it before writing it (the received activation or
 * gradient, copied in first), to the pass end when nothing in the pass reads
 * its last write (the output sent on, the loss).  A tensor of both passes
 * (recomputed) has one interval in each and one offset valid in both. */

/* ---- the workspace cache ----
 * A packing is a pure function of its four request arrays; chunks with the
 * same layers and shapes (every middle chunk of a uniform model, on every
 * pipeline rank) have equal arrays, so the first packing serves the rest.
 * Entries are matched by a hash and then byte for byte. */

#define CACHE_MAX 64 /* distinct packings kept per cache */

typedef struct pack_entry {
    uint64_t hash;
    size_t n, ne, nf, nbw;
    mgc_memreq *rq, *rf, *rb; /* (n), (nf), (nbw): copies, in one block with ex and off */
    mgc_memseg *ex;           /* (ne) */
    uint64_t *off;            /* (n) the offsets found */
    uint64_t ws, fwd_peak, bwd_peak;
} pack_entry;

struct mgc_memplan_cache {
    pack_entry v[CACHE_MAX];
    size_t n;
};

mgc_memplan_cache *mgc_memplan_cache_new(void) {
    return calloc(1, sizeof(mgc_memplan_cache));
}

void mgc_memplan_cache_free(mgc_memplan_cache *mc) {
    if (!mc) return;
    for (size_t i = 0; i < mc->n; i++)
        free(mc->v[i].rq);
    free(mc);
}

static uint64_t hash_bytes(uint64_t h, const void *p, size_t n) {
    const unsigned char *s = p;
    const uint64_t k = UINT64_C(0x9E3779B97F4A7C15);
    for (; n >= 8; s += 8, n -= 8) {
        uint64_t w;
        memcpy(&w, s, 8);
        h = (h ^ w) * k;
        h ^= h >> 31;
    }
    for (; n; s++, n--)
        h = (h ^ *s) * k;
    return h;
}

static pack_entry *cache_find(mgc_memplan_cache *mc, uint64_t h, const mgc_memreq *rq, size_t n,
                              const mgc_memseg *ex, size_t ne, const mgc_memreq *rf, size_t nf,
                              const mgc_memreq *rb, size_t nbw) {
    for (size_t i = 0; mc && i < mc->n; i++) {
        pack_entry *e = &mc->v[i];
        if (e->hash == h && e->n == n && e->ne == ne && e->nf == nf && e->nbw == nbw &&
            !memcmp(e->rq, rq, n * sizeof *rq) && !memcmp(e->ex, ex, ne * sizeof *ex) &&
            !memcmp(e->rf, rf, nf * sizeof *rf) && !memcmp(e->rb, rb, nbw * sizeof *rb))
            return e;
    }
    return NULL;
}

/* Remember a packing; silently skipped when the cache is full or memory is short. */
static void cache_add(mgc_memplan_cache *mc, uint64_t h, const mgc_memreq *rq, size_t n,
                      const mgc_memseg *ex, size_t ne, const mgc_memreq *rf, size_t nf,
                      const mgc_memreq *rb, size_t nbw, const uint64_t *off, uint64_t ws,
                      uint64_t fwd_peak, uint64_t bwd_peak) {
    if (!mc || mc->n == CACHE_MAX) return;
    size_t bytes = (n + nf + nbw) * sizeof *rq + ne * sizeof *ex + n * sizeof *off;
    char *blk = malloc(bytes ? bytes : 1);
    if (!blk) return;
    pack_entry *e = &mc->v[mc->n++];
    e->hash = h, e->n = n, e->ne = ne, e->nf = nf, e->nbw = nbw;
    e->rq = (mgc_memreq *)blk; /* every member is 8-byte aligned: sizes are multiples of 8 */
    e->rf = e->rq + n;
    e->rb = e->rf + nf;
    e->ex = (mgc_memseg *)(e->rb + nbw);
    e->off = (uint64_t *)(e->ex + ne);
    memcpy(e->rq, rq, n * sizeof *rq);
    memcpy(e->rf, rf, nf * sizeof *rf);
    memcpy(e->rb, rb, nbw * sizeof *rb);
    memcpy(e->ex, ex, ne * sizeof *ex);
    memcpy(e->off, off, n * sizeof *off);
    e->ws = ws, e->fwd_peak = fwd_peak, e->bwd_peak = bwd_peak;
}

static int pack_chunk(builder *b, int64_t c, uint64_t *ws, uint64_t *fwd_peak, uint64_t *bwd_peak) {
    const mgc_plan_chunk *ch = &b->sp->chunks[c];
    const use *u = b->uses[c];
    size_t nt = ch->n_tensors > 0 ? (size_t)ch->n_tensors : 1;
    mgc_memreq *rq = malloc(nt * sizeof *rq), *rf = malloc(nt * sizeof *rf),
               *rb = malloc(nt * sizeof *rb);
    mgc_memseg *ex = malloc(nt * sizeof *ex);
    int64_t *tid = malloc(nt * sizeof *tid);
    uint64_t *off = malloc(nt * sizeof *off);
    size_t n = 0, ne = 0, nf = 0, nbw = 0;
    int rc = 0;
    if (!rq || !rf || !rb || !ex || !tid || !off) {
        rc = oom(b);
        goto done;
    }
    for (int64_t t = 0; t < ch->n_tensors; t++) {
        const mgc_plan_tensor *x = &ch->tensors[t];
        if (b->place[c][t].cat != CAT_NONE || x->role == MGC_TR_PARAM || x->role == MGC_TR_GRAD ||
            x->role == MGC_TR_INPUT)
            continue;
        const use *v = &u[t];
        if (v->first[0] < 0 && v->first[1] < 0) continue; /* never touched: not materialised */
        if (v->first[1] >= 0 && v->first_read[1] &&
            (x->role == MGC_TR_ACTIVATION || x->role == MGC_TR_LOSS)) {
            rc = fail(b, BUG_HINT,
                      "tensor %s of chunk %" PRId64 " is read by backward op %" PRId32
                      " but is neither stashed nor recomputed before it",
                      tensor_name(b, x), c, v->first[1]);
            goto done;
        }
        int64_t seg_b[2], seg_e[2];
        int have[2] = {0, 0};
        for (int pass = 0; pass < 2; pass++) {
            if (v->first[pass] < 0) continue;
            int64_t base = pass ? ch->n_fwd : 0, len = pass ? ch->n_bwd : ch->n_fwd;
            seg_b[pass] = base + (v->first_read[pass] ? 0 : v->first[pass]);
            seg_e[pass] = base + (v->last_write[pass] ? len : v->last[pass] + 1);
            have[pass] = 1;
        }
        tid[n] = t;
        int p0 = have[0] ? 0 : 1;
        rq[n] = (mgc_memreq){x->bytes, seg_b[p0], seg_e[p0], MGC_PLAN_ALIGN};
        if (have[0] && have[1]) ex[ne++] = (mgc_memseg){(int64_t)n, seg_b[1], seg_e[1]};
        if (have[0]) rf[nf++] = (mgc_memreq){x->bytes, seg_b[0], seg_e[0], 1};
        if (have[1]) rb[nbw++] = (mgc_memreq){x->bytes, seg_b[1], seg_e[1], 1};
        n++;
    }
    uint64_t h = 0;
    const pack_entry *hit = NULL;
    if (b->cache) {
        h = hash_bytes(
            hash_bytes(hash_bytes(hash_bytes(n, rq, n * sizeof *rq), ex, ne * sizeof *ex), rf,
                       nf * sizeof *rf),
            rb, nbw * sizeof *rb);
        hit = cache_find(b->cache, h, rq, n, ex, ne, rf, nf, rb, nbw);
    }
    if (hit) {
        memcpy(off, hit->off, n * sizeof *off);
        *ws = hit->ws, *fwd_peak = hit->fwd_peak, *bwd_peak = hit->bwd_peak;
    } else {
        mgc_memplan_status st = mgc_memplan_assign_segs(rq, n, ex, ne, off, ws, NULL);
        if (st == MGC_MEMPLAN_OK) st = mgc_memplan_lower_bound(rf, nf, fwd_peak, NULL);
        if (st == MGC_MEMPLAN_OK) st = mgc_memplan_lower_bound(rb, nbw, bwd_peak, NULL);
        if (st != MGC_MEMPLAN_OK) {
            rc = fail(b, NULL, "packing the workspace of chunk %" PRId64 ": %s", c,
                      mgc_memplan_status_name(st));
            goto done;
        }
        cache_add(b->cache, h, rq, n, ex, ne, rf, nf, rb, nbw, off, *ws, *fwd_peak, *bwd_peak);
    }
    for (size_t i = 0; i < n; i++) {
        b->place[c][tid[i]].cat = CAT_ACT;
        b->place[c][tid[i]].off = off[i];
    }
done:
    free(rq);
    free(rf);
    free(rb);
    free(ex);
    free(tid);
    free(off);
    return rc;
}

/* ---- per-microbatch buffers ---- */

static int add_comm(builder *b, const uint32_t *names, uint64_t in_bytes) {
    for (int64_t i = 0; i < b->n; i++) {
        const mgc_instr *in = &b->sp->instrs[i];
        if (in->op < MGC_I_SEND_ACT || in->op > MGC_I_RECV_GRAD) continue;
        int64_t c = in->chunk, k = (int64_t)in->mb * b->V + c;
        const mgc_plan_chunk *ch = &b->sp->chunks[c];
        uint64_t out_bytes = ch->send_bytes ? ch->send_bytes : in_bytes;
        int64_t f = b->fwd[k], bw = b->bwd[k], begin, end;
        uint64_t bytes;
        const char *what = instr_name(in->op);
        switch (in->op) {
        case MGC_I_RECV_ACT: /* received before the forward that reads it */
            if (f < i) goto order;
            begin = i, end = f + 1, bytes = in_bytes;
            break;
        case MGC_I_SEND_ACT: /* written by the forward, sent after it (blocking) */
            if (f < 0 || f > i) goto order;
            begin = f, end = i + 1, bytes = out_bytes;
            break;
        case MGC_I_RECV_GRAD:
            if (bw < i) goto order;
            begin = i, end = bw + 1, bytes = out_bytes;
            break;
        default: /* MGC_I_SEND_GRAD */
            if (bw < 0 || bw > i) goto order;
            begin = bw, end = i + 1, bytes = in_bytes;
            break;
        }
        if (buf_add(b, MGC_BUF_COMM, c, in->mb, names[(in->op - MGC_I_SEND_ACT) * b->V + c], bytes,
                    begin, end) < 0)
            return oom(b);
        continue;
    order:
        return fail(b, BUG_HINT,
                    "instruction %" PRId64 " (%s of microbatch %" PRId32 " chunk %" PRId64
                    ") is not ordered around its %s",
                    i, what, in->mb, c,
                    in->op == MGC_I_RECV_ACT || in->op == MGC_I_SEND_ACT ? "forward" : "backward");
    }
    return 0;
}

/* The stage's gradient buckets (mgc_memplan_buckets, from the same layout)
 * get the grad and weight buffers; they must tile the flat layout exactly. */
static int bind_buckets(builder *b, const param_layout *pl, int64_t grad, int64_t weight) {
    mgc_stage_program *sp = b->sp;
    uint64_t covered = 0;
    if (sp->n_buckets < 0 || (sp->n_buckets > 0 && !sp->buckets))
        return fail(b, BUG_HINT, "%" PRId64 " gradient buckets without a table", sp->n_buckets);
    for (int64_t i = 0; i < sp->n_buckets; i++) {
        mgc_bucket *x = &sp->buckets[i];
        uint64_t end = i ? sp->buckets[i - 1].begin : pl->flat;
        if (x->begin > end || x->count != end - x->begin || grad < 0 || weight < 0 ||
            x->weight_bytes != x->count * b->wsize)
            return fail(b, BUG_HINT,
                        "gradient bucket %" PRId64 " [%" PRIu64 ", +%" PRIu64
                        ") does not tile the flat parameter layout of %" PRIu64
                        " elements (compute the buckets with mgc_memplan_buckets)",
                        i, x->begin, x->count, pl->flat);
        x->grad_buffer = (int32_t)grad;
        x->weight_buffer = (int32_t)weight;
        covered += x->count;
    }
    if (covered != pl->flat && sp->n_buckets > 0)
        return fail(b, BUG_HINT,
                    "the gradient buckets cover %" PRIu64 " of %" PRIu64 " parameter elements",
                    covered, pl->flat);
    return 0;
}

/* The folds of reductions on device memory (runtime/comm.h, moves-only communicators) run
 * through kernel_scratch between ops: the most any reduction of this stage needs (plan.h
 * mgc_fold_scratch_bytes).  The gradient reductions (buckets, the embedding's, the partial
 * sums) each cover part of the `flat` fp32 gradients over a group of at most world ranks,
 * which needs at most min((flat + 8 world) * 4, the round cap); the collective ops, exactly. */
static uint64_t fold_scratch(const builder *b, uint64_t flat) {
    const mgc_grid *g = b->g;
    if (g->world <= 1) return 0;
    /* G slices of ceil(m / G) rounded up to 8 elements: at most (m + 8 G) elements; a round
     * at the cap: at most the round bytes (or, past 2^21 ranks, G 8-element parts) */
    uint64_t W = (uint64_t)g->world, cap = MGC_FOLD_ROUND_BYTES > W * 32 ? MGC_FOLD_ROUND_BYTES : W * 32;
    uint64_t f = flat ? (flat + 8 * W) * 4 : 0;
    if (f > cap) f = cap;
    mgc_coords co = {0};
    co.pp = b->sp->pp_rank;
    int64_t rank = mgc_grid_rank(g, &co);
    for (int64_t ch = 0; ch < b->V; ch++) {
        const mgc_plan_chunk *pc = &b->sp->chunks[ch];
        for (int64_t i = 0; i < pc->n_fwd + pc->n_bwd; i++) {
            const mgc_plan_op *op = i < pc->n_fwd ? &pc->fwd[i] : &pc->bwd[i - pc->n_fwd];
            if (op->kind != MGC_POP_ALL_REDUCE && op->kind != MGC_POP_REDUCE_SCATTER) continue;
            int dt = (int)op->iattr[2];
            uint64_t es = dt == MGC_DT_F32 ? 4 : dt == MGC_DT_BF16 || dt == MGC_DT_F16 ? 2 : 0;
            int64_t G = op->group < MGC_GROUP__COUNT && rank >= 0
                            ? mgc_grid_group(g, (mgc_group_kind)op->group, rank, NULL, 0)
                            : 0;
            if (!es || G <= 1) continue;
            int scatter = op->kind == MGC_POP_REDUCE_SCATTER;
            int64_t n = scatter ? op->iattr[1] : op->iattr[0];
            uint64_t o = n > 0 ? mgc_fold_scratch_bytes((uint64_t)n, G, es, scatter) : 0;
            if (o > f) f = o;
        }
    }
    return f;
}

static void free_builder(builder *b) {
    for (int64_t c = 0; b->uses && c < b->V; c++)
        free(b->uses[c]);
    for (int64_t c = 0; b->place && c < b->V; c++)
        free(b->place[c]);
    for (int64_t c = 0; b->input_off && c < b->V; c++)
        free(b->input_off[c]);
    free(b->uses);
    free(b->place);
    free(b->input_off);
    free(b->fwd);
    free(b->bwd);
    free(b->load);
    free(b->buf);
    free(b->req);
}

int mgc_memplan_build(const mgc_config *c, const mgc_grid *grid, mgc_plan *plan,
                      mgc_stage_program *sp, mgc_diags *d) {
    return mgc_memplan_build_info(c, grid, plan, sp, d, NULL);
}

int mgc_memplan_build_info(const mgc_config *c, const mgc_grid *grid, mgc_plan *plan,
                           mgc_stage_program *sp, mgc_diags *d, mgc_memplan_info *info) {
    return mgc_memplan_build_cached(c, grid, plan, sp, d, info, NULL);
}

int mgc_memplan_build_cached(const mgc_config *c, const mgc_grid *grid, mgc_plan *plan,
                             mgc_stage_program *sp, mgc_diags *d, mgc_memplan_info *info,
                             mgc_memplan_cache *cache) {
    builder bb, *b = &bb;
    memset(b, 0, sizeof *b);
    b->cache = cache;
    b->c = c;
    b->g = grid;
    b->plan = plan;
    b->sp = sp;
    b->d = d;
    b->loc = c->file_loc;
    b->n = sp->n_instrs;
    b->V = sp->n_chunks;
    b->wsize = compute_dtype_bytes(c);
    if (info) memset(info, 0, sizeof *info);
    int rc = -1;
    uint8_t *in_fwd = NULL, *in_bwd = NULL;
    uint32_t *names = NULL;
    uint64_t *offsets = NULL;

    if (b->V < 1 || !sp->chunks || b->n < 1 || !sp->instrs || b->V >= 0xffff) {
        fail(b, BUG_HINT, "%" PRId64 " chunks and %" PRId64 " instructions", b->V, b->n);
        goto out;
    }
    if (index_stream(b)) goto out;
    b->uses = calloc((size_t)b->V, sizeof *b->uses);
    b->place = calloc((size_t)b->V, sizeof *b->place);
    b->input_off = calloc((size_t)b->V, sizeof *b->input_off);
    in_fwd = calloc((size_t)b->V, 1);
    in_bwd = calloc((size_t)b->V, 1);
    names = calloc((size_t)b->V * 5, sizeof *names);
    if (!b->uses || !b->place || !b->input_off || !in_fwd || !in_bwd || !names) {
        oom(b);
        goto out;
    }
    for (int64_t ch = 0; ch < b->V; ch++)
        if (chunk_uses(b, ch) || check_stash(b, ch)) goto out;

    /* parameters and optimizer state */
    uint64_t d_dense, d_expert;
    shard_divisors(c, grid, &d_dense, &d_expert);
    param_layout pl;
    if (layout_params(b, &pl, d_dense, d_expert)) goto out;

    /* inputs, then the pass workspace (everything else that ops touch) */
    uint64_t input_bytes = layout_inputs(b, in_fwd, in_bwd);
    if (input_bytes == UINT64_MAX) {
        fail(b, NULL, "input bytes overflow");
        goto out;
    }
    uint64_t ws = 0, fwd_peak = 0, bwd_peak = 0;
    for (int64_t ch = 0; ch < b->V; ch++) {
        uint64_t w, fp, bp;
        if (pack_chunk(b, ch, &w, &fp, &bp)) goto out;
        if (w > ws) ws = w;
        if (fp > fwd_peak) fwd_peak = fp;
        if (bp > bwd_peak) bwd_peak = bp;
    }

    /* the buffers: persistent first, then per microbatch in stream order */
    int64_t idx[CAT_STASH + 1] = {-1, -1, -1, -1, -1, -1};
    int64_t n = b->n;
    uint64_t master = c->training.precision == MGC_PREC_FP32 ? 0 : pl.shard * 4;
    if (pl.flat) {
        idx[CAT_WEIGHT] =
            buf_add(b, MGC_BUF_WEIGHT, -1, -1, name_of(b, "weights"), pl.flat * b->wsize, 0, n);
        idx[CAT_GRAD] =
            buf_add(b, MGC_BUF_GRAD, -1, -1, name_of(b, "main_grads"), pl.flat * 4, 0, n);
        if (master &&
            buf_add(b, MGC_BUF_MASTER, -1, -1, name_of(b, "master_weights"), master, 0, n) < 0)
            goto nomem;
        if (buf_add(b, MGC_BUF_ADAM_M, -1, -1, name_of(b, "adam_m"), pl.shard * 4, 0, n) < 0)
            goto nomem;
        if (buf_add(b, MGC_BUF_ADAM_V, -1, -1, name_of(b, "adam_v"), pl.shard * 4, 0, n) < 0)
            goto nomem;
        if (idx[CAT_WEIGHT] < 0 || idx[CAT_GRAD] < 0) goto nomem;
    }
    if (buf_add(b, MGC_BUF_WORKSPACE, -1, -1, name_of(b, "gemm_workspace"),
                MGC_MEMPLAN_GEMM_WORKSPACE_BYTES, 0, n) < 0)
        goto nomem;
    {
        /* the CUDA kernels' scratch: the most any one op (or the optimizer) asks for, so that
         * the arena stays the rank's one device allocation (codegen/kspec_scratch.c) */
        uint64_t ks = mgc_kspec_optimizer_scratch_bytes();
        for (int64_t ch = 0; ch < b->V; ch++) {
            const mgc_plan_chunk *pc = &sp->chunks[ch];
            for (int64_t i = 0; i < pc->n_fwd + pc->n_bwd; i++) {
                uint64_t o = mgc_kspec_op_scratch_bytes(pc, i < pc->n_fwd ? &pc->fwd[i]
                                                                          : &pc->bwd[i - pc->n_fwd]);
                if (o > ks) ks = o;
            }
        }
        uint64_t fs = fold_scratch(b, pl.flat);
        if (fs > ks) ks = fs;
        if (buf_add(b, MGC_BUF_WORKSPACE, -1, -1, name_of(b, "kernel_scratch"), mgc_kspec_align(ks),
                    0, n) < 0)
            goto nomem;
    }
    if (ws && b->first_compute >= 0) {
        idx[CAT_ACT] = buf_add(b, MGC_BUF_ACTIVATION, -1, -1, name_of(b, "pass_workspace"), ws,
                               b->first_compute, b->last_compute + 1);
        if (idx[CAT_ACT] < 0) goto nomem;
    }
    {
        static const char *const comm[4] = {"send_act", "recv_act", "send_grad", "recv_grad"};
        char nm[64];
        for (int64_t ch = 0; ch < b->V; ch++) {
            snprintf(nm, sizeof nm, "stash.c%" PRId64, ch);
            names[4 * b->V + ch] = name_of(b, nm);
            for (int k = 0; k < 4; k++) {
                snprintf(nm, sizeof nm, "%s.c%" PRId64, comm[k], ch);
                names[k * b->V + ch] = name_of(b, nm);
            }
        }
    }
    for (int64_t m = 0; m < b->M; m++) {
        for (int64_t ch = 0; ch < b->V; ch++) {
            int64_t k = m * b->V + ch;
            if (b->fwd[k] < 0 || !sp->chunks[ch].stash_bytes) continue;
            if (buf_add(b, MGC_BUF_STASH, ch, m, names[4 * b->V + ch], sp->chunks[ch].stash_bytes,
                        b->fwd[k], b->bwd[k] + 1) < 0)
                goto nomem;
        }
        if (!input_bytes) continue;
        int64_t first = -1, last = -1;
        for (int64_t ch = 0; ch < b->V; ch++) {
            int64_t k = m * b->V + ch;
            if (!in_fwd[ch] || b->fwd[k] < 0) continue;
            if (first < 0 || b->fwd[k] < first) first = b->fwd[k];
            int64_t e = in_bwd[ch] ? b->bwd[k] : b->fwd[k];
            if (e > last) last = e;
        }
        if (first < 0) continue; /* this rank runs no input-reading pass of mb */
        int64_t begin = b->load[m] >= 0 && b->load[m] < first ? b->load[m] : first;
        int64_t id =
            buf_add(b, MGC_BUF_INPUT, -1, m, name_of(b, "input"), input_bytes, begin, last + 1);
        if (id < 0) goto nomem;
        if (idx[CAT_INPUT] < 0) idx[CAT_INPUT] = id; /* tensors name the first; see docs */
    }
    {
        uint64_t in_bytes = 0;
        for (int64_t ch = 0; ch < b->V; ch++)
            if (sp->chunks[ch].send_bytes > in_bytes) in_bytes = sp->chunks[ch].send_bytes;
        if (!in_bytes) in_bytes = mgc_memplan_boundary_bytes(c, grid);
        if (add_comm(b, names, in_bytes)) goto out;
    }

    /* place */
    offsets = malloc((size_t)b->nb * sizeof *offsets);
    if (!offsets) goto nomem;
    mgc_memplan_stats st;
    uint64_t arena = 0;
    mgc_memplan_status ms = mgc_memplan_assign(b->req, (size_t)b->nb, offsets, &arena, &st);
    if (ms != MGC_MEMPLAN_OK) {
        fail(b, NULL, "placing %" PRId64 " buffers: %s", b->nb, mgc_memplan_status_name(ms));
        goto out;
    }
    for (int64_t i = 0; i < b->nb; i++)
        b->buf[i].offset = offsets[i];
    if (bind_buckets(b, &pl, idx[CAT_GRAD], idx[CAT_WEIGHT])) goto out;

    /* tensors */
    for (int64_t ch = 0; ch < b->V; ch++) {
        mgc_plan_chunk *chk = &sp->chunks[ch];
        for (int64_t t = 0; t < chk->n_tensors; t++) {
            const tplace *p = &b->place[ch][t];
            mgc_plan_tensor *x = &chk->tensors[t];
            if (p->cat == CAT_STASH) continue;
            if (p->cat == CAT_NONE || idx[p->cat] < 0) {
                x->buffer = -1;
                x->offset = 0;
            } else {
                x->buffer = (int32_t)idx[p->cat];
                x->offset = p->off;
            }
        }
    }

    /* in-place outputs take their input's place, views theirs plus the view's offset
     * (stashed or packed) */
    for (int64_t ch = 0; ch < b->V; ch++) {
        mgc_plan_chunk *chk = &sp->chunks[ch];
        for (int64_t t = 0; t < chk->n_tensors; t++)
            if (b->place[ch][t].over) {
                const mgc_plan_tensor *x = &chk->tensors[b->place[ch][t].over - 1];
                chk->tensors[t].buffer = x->buffer;
                chk->tensors[t].offset = x->offset + b->place[ch][t].delta;
            }
    }

    /* the breakdown at the peak, and the most stashes at once */
    memset(sp->by_kind, 0, sizeof sp->by_kind);
    for (int64_t i = 0; st.peak_time >= 0 && i < b->nb; i++)
        if (b->buf[i].live_begin <= st.peak_time && st.peak_time < b->buf[i].live_end)
            sp->by_kind[b->buf[i].kind] += b->buf[i].bytes;
    {
        int64_t *delta = calloc((size_t)b->n + 1, sizeof *delta), cur = 0, best = 0;
        if (!delta) goto nomem;
        for (int64_t k = 0; k < b->M * b->V; k++)
            if (b->fwd[k] >= 0) delta[b->fwd[k]]++, delta[b->bwd[k] + 1]--;
        for (int64_t i = 0; i <= b->n; i++) {
            cur += delta[i];
            if (cur > best) best = cur;
        }
        free(delta);
        sp->max_in_flight = best;
    }
    free(sp->buffers);
    sp->buffers = b->buf;
    sp->n_buffers = b->nb;
    sp->arena_bytes = arena;
    b->buf = NULL;
    if (info) {
        info->arena_bytes = arena;
        info->lower_bound_bytes = st.lower_bound_bytes;
        info->peak_instr = st.peak_time;
        info->param_elems = pl.elems;
        info->expert_param_elems = pl.expert_elems;
        info->param_pad_elems = pl.flat - pl.elems;
        info->optimizer_bytes = pl.flat * (b->wsize + 4) + master + 2 * pl.shard * 4;
        info->shard_dense = (int64_t)d_dense;
        info->shard_expert = (int64_t)d_expert;
        info->workspace_bytes = ws;
        info->fwd_peak_bytes = fwd_peak;
        info->bwd_peak_bytes = bwd_peak;
        info->n_buffers = sp->n_buffers;
        info->assign_overlaps = st.overlaps;
    }
    rc = 0;
    goto out;
nomem:
    oom(b);
out:
    free(in_fwd);
    free(in_bwd);
    free(names);
    free(offsets);
    free_builder(b);
    return rc;
}
