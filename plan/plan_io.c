/* plan_io.c - the plan file: encode/decode, atomic write, read, validation.
 * The byte layout is docs/plan-format.md; every offset below is in it.
 * Sections: byte access, error text, the section table, record layouts
 * (put_* / get_* pairs), validation, encode, decode, files. */
#include "plan.h"
#include "crc32c.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#if defined(__GNUC__)
#define PRINTF_LIKE(f, a) __attribute__((format(printf, f, a)))
#else
#define PRINTF_LIKE(f, a)
#endif

/* ---- little-endian byte access -------------------------------------------- */

static void st8(uint8_t *p, uint8_t v) {
    p[0] = v;
}
static void st16(uint8_t *p, uint16_t v) {
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
}
static void st32(uint8_t *p, uint32_t v) {
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}
static void st64(uint8_t *p, uint64_t v) {
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}
static void sti32(uint8_t *p, int32_t v) {
    st32(p, (uint32_t)v);
}
static void sti64(uint8_t *p, int64_t v) {
    st64(p, (uint64_t)v);
}
static void stf64(uint8_t *p, double v) { /* IEEE-754 binary64 bits */
    uint64_t u;
    memcpy(&u, &v, sizeof u);
    st64(p, u);
}

static uint8_t ld8(const uint8_t *p) {
    return p[0];
}
static uint16_t ld16(const uint8_t *p) {
    return (uint16_t)(p[0] | (uint16_t)p[1] << 8);
}
static uint32_t ld32(const uint8_t *p) {
    uint32_t v = 0;
    for (int i = 3; i >= 0; i--)
        v = v << 8 | p[i];
    return v;
}
static uint64_t ld64(const uint8_t *p) {
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--)
        v = v << 8 | p[i];
    return v;
}
static int32_t ldi32(const uint8_t *p) { /* two's complement, without UB */
    uint32_t u = ld32(p);
    return u <= INT32_MAX ? (int32_t)u : (int32_t)(u - 2147483648u) - INT32_MAX - 1;
}
static int64_t ldi64(const uint8_t *p) {
    uint64_t u = ld64(p);
    return u <= INT64_MAX ? (int64_t)u : (int64_t)(u - 9223372036854775808u) - INT64_MAX - 1;
}
static double ldf64(const uint8_t *p) {
    uint64_t u = ld64(p);
    double v;
    memcpy(&v, &u, sizeof v);
    return v;
}

static uint64_t align8(uint64_t x) {
    return (x + 7u) & ~(uint64_t)7u;
}

/* ---- error text ----------------------------------------------------------- */

PRINTF_LIKE(3, 4)
static void set_err(char *err, size_t errsz, const char *fmt, ...) {
    if (!err || errsz == 0) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errsz, fmt, ap);
    va_end(ap);
}

/* ---- the header and the section table -------------------------------------- */

static const uint8_t plan_magic[8] = {0x89, 'M', 'G', 'C', '\r', '\n', 0x1a, '\n'};

#define HEADER_BYTES    64u         /* frozen for every format version */
#define HEADER_CRC_AT   60u         /* CRC-32C of bytes [0, 60) */
#define DIR_ENTRY_BYTES 48u         /* v1 directory entry (entries may grow at the end) */
#define NO_INDEX        0xffffffffu /* stage/chunk of plan-wide sections */
#define KERN_BYTES      24u         /* KERN record: name, arch, offset, bytes */

enum section {
    S_GRID, /* grid and plan scalars: 1 record */
    S_CONF, /* config key/values: n_config records */
    S_STRS, /* string table: strings_len bytes */
    S_STAG, /* per stage: 1 record */
    S_INST, /* per stage: instructions */
    S_BUFS, /* per stage: buffers */
    S_BCKT, /* per stage: gradient buckets (version 2) */
    S_CHNK, /* per chunk: 1 record */
    S_TENS, /* per chunk: tensors */
    S_FWDO, /* per chunk: forward ops */
    S_BWDO, /* per chunk: backward ops */
    S__COUNT
};

static const struct {
    char id[5];     /* fourcc, file order */
    uint32_t bytes; /* v1 record size */
} sections[S__COUNT] = {
    [S_GRID] = {"GRID", 144}, [S_CONF] = {"CONF", 32}, [S_STRS] = {"STRS", 1},
    [S_STAG] = {"STAG", 128}, [S_INST] = {"INST", 24}, [S_BUFS] = {"BUFS", 48},
    [S_BCKT] = {"BCKT", 72},
    [S_CHNK] = {"CHNK", 32},  [S_TENS] = {"TENS", 80}, [S_FWDO] = {"FWDO", 160},
    [S_BWDO] = {"BWDO", 160},
};

static uint32_t fourcc(const char id[4]) {
    return ld32((const uint8_t *)id);
}

static int section_of(uint32_t id) {
    for (int k = 0; k < S__COUNT; k++)
        if (fourcc(sections[k].id) == id) return k;
    return -1;
}

/* Directory entry, in memory. */
typedef struct dirent_ {
    uint32_t id;         /* fourcc */
    uint32_t flags;      /* 0 in v1 */
    uint32_t stage;      /* NO_INDEX for plan-wide sections */
    uint32_t chunk;      /* NO_INDEX for plan- and stage-wide sections */
    uint64_t offset;     /* from the start of the file, 8-aligned */
    uint64_t length;     /* bytes = count * elem_bytes */
    uint64_t count;      /* records */
    uint32_t elem_bytes; /* record size */
    uint32_t crc;        /* CRC-32C of the section's bytes */
} dirent_;

/* "TENS (stage 1, chunk 0)" */
static const char *section_label(const dirent_ *e, char *buf, size_t n) {
    char id[5];
    for (int i = 0; i < 4; i++) {
        uint8_t c = (uint8_t)(e->id >> (8 * i));
        id[i] = c >= 0x20 && c < 0x7f ? (char)c : '?';
    }
    id[4] = 0;
    if (e->stage == NO_INDEX)
        snprintf(buf, n, "%s", id);
    else if (e->chunk == NO_INDEX)
        snprintf(buf, n, "%s (stage %" PRIu32 ")", id, e->stage);
    else
        snprintf(buf, n, "%s (stage %" PRIu32 ", chunk %" PRIu32 ")", id, e->stage, e->chunk);
    return buf;
}

/* ---- record layouts --------------------------------------------------------
 * Each put_* writes one record at r, each get_* reads one; the offsets are the
 * tables of docs/plan-format.md.  Reserved bytes are written as zero and
 * ignored on reading. */

static void put_grid(uint8_t *r, const mgc_plan *p) {
    const mgc_grid *g = &p->grid;
    sti64(r + 0, g->world);
    sti64(r + 8, g->tp);
    sti64(r + 16, g->cp);
    sti64(r + 24, g->dp);
    sti64(r + 32, g->pp);
    sti64(r + 40, g->vp);
    sti64(r + 48, g->etp);
    sti64(r + 56, g->ep);
    sti64(r + 64, g->edp);
    sti64(r + 72, p->num_microbatches);
    sti64(r + 80, p->micro_batch_size);
    sti64(r + 88, p->seq_length);
    sti32(r + 96, p->schedule);
    sti32(r + 100, p->recompute);
    sti32(r + 104, p->distributed_optimizer);
    /* 108: u32 reserved */
    stf64(r + 112, p->bubble_fraction);
    stf64(r + 120, p->model_flops_per_iter);
    sti64(r + 128, p->n_stages);
    /* 136: u64 reserved */
}
static void get_grid(const uint8_t *r, mgc_plan *p) {
    mgc_grid *g = &p->grid;
    g->world = ldi64(r + 0);
    g->tp = ldi64(r + 8);
    g->cp = ldi64(r + 16);
    g->dp = ldi64(r + 24);
    g->pp = ldi64(r + 32);
    g->vp = ldi64(r + 40);
    g->etp = ldi64(r + 48);
    g->ep = ldi64(r + 56);
    g->edp = ldi64(r + 64);
    p->num_microbatches = ldi64(r + 72);
    p->micro_batch_size = ldi64(r + 80);
    p->seq_length = ldi64(r + 88);
    p->schedule = ldi32(r + 96);
    p->recompute = ldi32(r + 100);
    p->distributed_optimizer = ldi32(r + 104);
    p->bubble_fraction = ldf64(r + 112);
    p->model_flops_per_iter = ldf64(r + 120);
    p->n_stages = ldi64(r + 128);
}

static void put_kv(uint8_t *r, const mgc_plan_kv *kv) {
    st32(r + 0, kv->key);
    st16(r + 4, kv->type);
    /* 6: u16 reserved */
    sti64(r + 8, kv->i);
    stf64(r + 16, kv->f);
    st32(r + 24, kv->s);
    /* 28: u32 reserved */
}
static void get_kv(const uint8_t *r, mgc_plan_kv *kv) {
    kv->key = ld32(r + 0);
    kv->type = ld16(r + 4);
    kv->i = ldi64(r + 8);
    kv->f = ldf64(r + 16);
    kv->s = ld32(r + 24);
}

static void put_stage(uint8_t *r, const mgc_stage_program *st) {
    sti64(r + 0, st->pp_rank);
    sti64(r + 8, st->n_chunks);
    st64(r + 16, st->arena_bytes);
    sti64(r + 24, st->max_in_flight);
    for (int k = 0; k < MGC_BUF__COUNT; k++)
        st64(r + 32 + 8 * k, st->by_kind[k]);
}
static void get_stage(const uint8_t *r, mgc_stage_program *st) {
    st->pp_rank = ldi64(r + 0);
    st->n_chunks = ldi64(r + 8);
    st->arena_bytes = ld64(r + 16);
    st->max_in_flight = ldi64(r + 24);
    for (int k = 0; k < MGC_BUF__COUNT; k++)
        st->by_kind[k] = ld64(r + 32 + 8 * k);
}
_Static_assert(32 + 8 * MGC_BUF__COUNT == 128, "STAG record holds by_kind");

static void put_instr(uint8_t *r, const mgc_instr *in) {
    st16(r + 0, in->op);
    st16(r + 2, in->chunk);
    sti32(r + 4, in->mb);
    sti32(r + 8, in->peer);
    st32(r + 12, in->arg);
    st64(r + 16, in->seq);
}
static void get_instr(const uint8_t *r, mgc_instr *in) {
    in->op = ld16(r + 0);
    in->chunk = ld16(r + 2);
    in->mb = ldi32(r + 4);
    in->peer = ldi32(r + 8);
    in->arg = ld32(r + 12);
    in->seq = ld64(r + 16);
}

static void put_buffer(uint8_t *r, const mgc_buffer *b) {
    st32(r + 0, b->name);
    st16(r + 4, b->kind);
    st16(r + 6, b->chunk);
    sti32(r + 8, b->mb);
    /* 12: u32 reserved */
    st64(r + 16, b->bytes);
    st64(r + 24, b->offset);
    sti64(r + 32, b->live_begin);
    sti64(r + 40, b->live_end);
}
static void get_buffer(const uint8_t *r, mgc_buffer *b) {
    b->name = ld32(r + 0);
    b->kind = ld16(r + 4);
    b->chunk = ld16(r + 6);
    b->mb = ldi32(r + 8);
    b->bytes = ld64(r + 16);
    b->offset = ld64(r + 24);
    b->live_begin = ldi64(r + 32);
    b->live_end = ldi64(r + 40);
}

static void put_bucket(uint8_t *r, const mgc_bucket *b) {
    st16(r + 0, b->group);
    st16(r + 2, b->chunk);
    /* 4: u32 reserved */
    sti64(r + 8, b->shards);
    st64(r + 16, b->begin);
    st64(r + 24, b->count);
    sti32(r + 32, b->grad_buffer);
    sti32(r + 36, b->weight_buffer);
    st64(r + 40, b->grad_offset);
    st64(r + 48, b->grad_bytes);
    st64(r + 56, b->weight_offset);
    st64(r + 64, b->weight_bytes);
}
static void get_bucket(const uint8_t *r, mgc_bucket *b) {
    b->group = ld16(r + 0);
    b->chunk = ld16(r + 2);
    b->shards = ldi64(r + 8);
    b->begin = ld64(r + 16);
    b->count = ld64(r + 24);
    b->grad_buffer = ldi32(r + 32);
    b->weight_buffer = ldi32(r + 36);
    b->grad_offset = ld64(r + 40);
    b->grad_bytes = ld64(r + 48);
    b->weight_offset = ld64(r + 56);
    b->weight_bytes = ld64(r + 64);
}

static void put_chunk(uint8_t *r, const mgc_plan_chunk *c) {
    sti32(r + 0, c->first_layer);
    sti32(r + 4, c->num_layers);
    st8(r + 8, c->embedding);
    st8(r + 9, c->loss);
    /* 10: 6 bytes reserved */
    st64(r + 16, c->stash_bytes);
    st64(r + 24, c->send_bytes);
}
static void get_chunk(const uint8_t *r, mgc_plan_chunk *c) {
    c->first_layer = ldi32(r + 0);
    c->num_layers = ldi32(r + 4);
    c->embedding = ld8(r + 8);
    c->loss = ld8(r + 9);
    c->stash_bytes = ld64(r + 16);
    c->send_bytes = ld64(r + 24);
}

static void put_tensor(uint8_t *r, const mgc_plan_tensor *t) {
    st32(r + 0, t->name);
    st16(r + 4, t->dtype);
    st16(r + 6, t->rank);
    for (int i = 0; i < MGC_PLAN_MAX_RANK; i++)
        sti64(r + 8 + 8 * i, t->dim[i]);
    st16(r + 40, t->role);
    st16(r + 42, t->split_axis);
    st16(r + 44, t->split_group);
    st16(r + 46, t->flags);
    sti32(r + 48, t->buffer);
    st32(r + 52, t->ld);
    st64(r + 56, t->offset);
    st64(r + 64, t->bytes);
    st32(r + 72, t->view);
    st16(r + 76, t->split2_axis);
    st16(r + 78, t->split2_group);
}
static void get_tensor(const uint8_t *r, mgc_plan_tensor *t) {
    t->name = ld32(r + 0);
    t->dtype = ld16(r + 4);
    t->rank = ld16(r + 6);
    for (int i = 0; i < MGC_PLAN_MAX_RANK; i++)
        t->dim[i] = ldi64(r + 8 + 8 * i);
    t->role = ld16(r + 40);
    t->split_axis = ld16(r + 42);
    t->split_group = ld16(r + 44);
    t->flags = ld16(r + 46);
    t->buffer = ldi32(r + 48);
    t->ld = ld32(r + 52);
    t->offset = ld64(r + 56);
    t->bytes = ld64(r + 64);
    t->view = ld32(r + 72);
    t->split2_axis = ld16(r + 76);
    t->split2_group = ld16(r + 78);
}
_Static_assert(MGC_PLAN_MAX_RANK == 4, "TENS record holds 4 dims");

static void put_op(uint8_t *r, const mgc_plan_op *o) {
    st16(r + 0, o->kind);
    st16(r + 2, o->flags);
    sti32(r + 4, o->layer);
    st32(r + 8, o->name);
    st16(r + 12, o->n_in);
    st16(r + 14, o->n_out);
    for (int i = 0; i < MGC_PLAN_MAX_IO; i++) {
        sti32(r + 16 + 4 * i, o->in[i]);
        sti32(r + 48 + 4 * i, o->out[i]);
    }
    st16(r + 80, o->group);
    /* 82: u16 reserved */
    st32(r + 84, o->seq);
    for (int i = 0; i < 4; i++) {
        stf64(r + 88 + 8 * i, o->fattr[i]);
        sti64(r + 120 + 8 * i, o->iattr[i]);
    }
    st64(r + 152, o->flops);
}
static void get_op(const uint8_t *r, mgc_plan_op *o) {
    o->kind = ld16(r + 0);
    o->flags = ld16(r + 2);
    o->layer = ldi32(r + 4);
    o->name = ld32(r + 8);
    o->n_in = ld16(r + 12);
    o->n_out = ld16(r + 14);
    for (int i = 0; i < MGC_PLAN_MAX_IO; i++) {
        o->in[i] = ldi32(r + 16 + 4 * i);
        o->out[i] = ldi32(r + 48 + 4 * i);
    }
    o->group = ld16(r + 80);
    o->seq = ld32(r + 84);
    for (int i = 0; i < 4; i++) {
        o->fattr[i] = ldf64(r + 88 + 8 * i);
        o->iattr[i] = ldi64(r + 120 + 8 * i);
    }
    o->flops = ld64(r + 152);
}
_Static_assert(MGC_PLAN_MAX_IO == 8, "op record holds 8 inputs and 8 outputs");

/* ---- validation ----------------------------------------------------------- */

#define INVALID(...)                                                                               \
    do {                                                                                           \
        set_err(err, errsz, __VA_ARGS__);                                                          \
        return MGC_PLAN_ERR_INVALID;                                                               \
    } while (0)

static int str_ok(const mgc_plan *p, uint32_t off) {
    return off == 0 || off < p->strings_len;
}

static int op_kind_ok(uint16_t k) {
    return k <= MGC_POP_LAST_FWD ||
           (k >= MGC_POP_EMBEDDING_BWD && k <= MGC_POP_LAST_BWD) ||
           (k >= MGC_POP_ALL_REDUCE && k < MGC_POP__END);
}

/* instruction names for messages (the compiler's schedule module has its own) */
static const char *const instr_names[] = {
    "load_batch", "forward",      "backward",    "send_act",  "recv_act",     "send_grad",
    "recv_grad",  "reduce_grads", "embed_grads", "optimizer", "gather_params"};
_Static_assert(sizeof instr_names / sizeof instr_names[0] == MGC_I__COUNT, "instruction names");

static int instr_per_mb(uint16_t op) {
    return op <= MGC_I_RECV_GRAD; /* load_batch .. recv_grad carry a microbatch */
}

static int instr_p2p(uint16_t op) {
    return op >= MGC_I_SEND_ACT && op <= MGC_I_RECV_GRAD;
}

/* Where a validation problem is: formatted only when a check fails, since
 * validation visits every record of the plan (millions for large plans). */
typedef struct wloc {
    int64_t stage;    /* pipeline stage */
    int64_t chunk;    /* chunk, -1 when the record is not inside one */
    int64_t index;    /* record index, -1 for the chunk itself */
    const char *kind; /* "buffer", "instruction", "tensor", "fwd op", ... */
} wloc;

static const char *wloc_str(const wloc *w, char *buf, size_t n) {
    if (w->chunk < 0)
        snprintf(buf, n, "stage %" PRId64 " %s %" PRId64, w->stage, w->kind, w->index);
    else if (w->index < 0)
        snprintf(buf, n, "stage %" PRId64 " chunk %" PRId64, w->stage, w->chunk);
    else
        snprintf(buf, n, "stage %" PRId64 " chunk %" PRId64 " %s %" PRId64, w->stage, w->chunk,
                 w->kind, w->index);
    return buf;
}

#define WH wloc_str(wl, wbuf, sizeof wbuf)

static mgc_plan_status check_tensor(const mgc_plan *p, const mgc_stage_program *st,
                                    const mgc_plan_chunk *c, const mgc_plan_tensor *t,
                                    const wloc *wl, char *err, size_t errsz) {
    char wbuf[96];
    if (!str_ok(p, t->name))
        INVALID("%s: name offset %" PRIu32 " outside the string table", WH, t->name);
    if (t->dtype >= MGC_DT__COUNT) INVALID("%s: dtype %u unknown", WH, t->dtype);
    if (t->rank > MGC_PLAN_MAX_RANK)
        INVALID("%s: rank %u above %d", WH, t->rank, MGC_PLAN_MAX_RANK);
    if (t->role > MGC_TR_WORKSPACE) INVALID("%s: role %u unknown", WH, t->role);
    if (t->flags & ~MGC_PT_ROUTED) INVALID("%s: flags 0x%x unknown", WH, t->flags);
    uint64_t elems = 1;
    for (int i = 0; i < t->rank; i++) {
        if (t->dim[i] < 1) INVALID("%s: dim %d is %" PRId64 ", below 1", WH, i, t->dim[i]);
        if ((uint64_t)t->dim[i] > UINT64_MAX / elems) INVALID("%s: element count overflows", WH);
        elems *= (uint64_t)t->dim[i];
    }
    uint64_t esz = mgc_dtype_size((mgc_dtype)t->dtype);
    if (t->ld) { /* a row pitch: the extent is rows x ld elements */
        uint64_t w = t->rank ? (uint64_t)t->dim[t->rank - 1] : 1;
        if (t->rank < 1 || t->ld <= w)
            INVALID("%s: row pitch %" PRIu32 " is not above its rows' %" PRIu64
                    " elements (0 means dense)",
                    WH, t->ld, w);
        uint64_t rows = elems / w;
        if (rows > UINT64_MAX / t->ld) INVALID("%s: element count overflows", WH);
        elems = rows * t->ld;
    }
    if (elems > UINT64_MAX / esz || t->bytes != elems * esz)
        INVALID("%s: bytes %" PRIu64 " != %" PRIu64 " elements x %" PRIu64 " bytes", WH,
                t->bytes, elems, esz);
    if (t->split_axis != MGC_PLAN_NO_SPLIT) {
        if (t->split_axis >= t->rank)
            INVALID("%s: split axis %u outside rank %u", WH, t->split_axis, t->rank);
        if (t->split_group >= MGC_GROUP__COUNT)
            INVALID("%s: split group %u unknown", WH, t->split_group);
    }
    if (t->split2_axis != MGC_PLAN_NO_SPLIT) {
        if (t->split2_axis >= t->rank || t->split2_axis == t->split_axis)
            INVALID("%s: second split axis %u outside rank %u or the first split's", WH,
                    t->split2_axis, t->rank);
        if (t->split2_group >= MGC_GROUP__COUNT)
            INVALID("%s: second split group %u unknown", WH, t->split2_group);
    }
    if (t->buffer < MGC_PLAN_BUF_STASH || t->buffer >= st->n_buffers)
        INVALID("%s: buffer %" PRId32 " outside %d..%" PRId64, WH, t->buffer, MGC_PLAN_BUF_STASH,
                st->n_buffers - 1);
    if (t->buffer == MGC_PLAN_BUF_STASH && (t->offset > c->stash_bytes || t->bytes > c->stash_bytes - t->offset))
        INVALID("%s: [%" PRIu64 ", +%" PRIu64 ") outside the chunk's stash of %" PRIu64 " bytes", WH,
                t->offset, t->bytes, c->stash_bytes);
    if (t->buffer >= 0) {
        const mgc_buffer *b = &st->buffers[t->buffer];
        if (t->offset > b->bytes || t->bytes > b->bytes - t->offset)
            INVALID("%s: [%" PRIu64 ", +%" PRIu64 ") outside its buffer %" PRId32 " of %" PRIu64
                    " bytes",
                    WH, t->offset, t->bytes, t->buffer, b->bytes);
    }
    if (t->view) { /* a range of whole outer rows of another tensor, in its bytes */
        if ((int64_t)t->view > c->n_tensors || &c->tensors[t->view - 1] == t)
            INVALID("%s: a view of tensor %" PRIu32 ", outside 0..%" PRId64 " or itself", WH,
                    t->view - 1, c->n_tensors - 1);
        const mgc_plan_tensor *x = &c->tensors[t->view - 1];
        int ok = !x->view && x->dtype == t->dtype && x->role == t->role && x->rank == t->rank &&
                 t->rank >= 1 && !x->ld && !t->ld && x->buffer == t->buffer && t->buffer != -1 &&
                 t->offset >= x->offset && t->bytes <= x->bytes &&
                 t->offset - x->offset <= x->bytes - t->bytes;
        for (int i = 1; ok && i < t->rank; i++)
            ok = x->dim[i] == t->dim[i];
        if (ok && t->bytes) ok = (t->offset - x->offset) % (t->bytes / (uint64_t)t->dim[0]) == 0;
        if (!ok)
            INVALID("%s: a view of tensor %" PRIu32 " that is not a range of its outer rows (the "
                    "same dtype, role, inner dims and buffer, inside its bytes, itself no view)",
                    WH, t->view - 1);
    }
    return MGC_PLAN_OK;
}

static mgc_plan_status check_op(const mgc_plan *p, const mgc_plan_chunk *c, const mgc_plan_op *o,
                                int bwd, const wloc *wl, char *err, size_t errsz) {
    char wbuf[96];
    if (!op_kind_ok(o->kind)) INVALID("%s: op kind %u unknown", WH, o->kind);
    const char *kn = mgc_plan_op_name((mgc_plan_op_kind)o->kind);
    if (o->flags &
        ~(MGC_POF_RECOMPUTE | MGC_POF_SAVED | MGC_POF_QKV | MGC_POF_INPLACE | MGC_POF_ROPE |
          MGC_POF_DOCS | MGC_POF_ROWS | MGC_POF_CE_STATS | MGC_POF_COLSUM | MGC_POF_DROPBWD))
        INVALID("%s (%s): unknown flags 0x%x", WH, kn, o->flags);
    if (o->flags & MGC_POF_ROPE) {
        if (o->kind != MGC_POP_QKV_SPLIT && o->kind != MGC_POP_QKV_SPLIT_BWD)
            INVALID("%s (%s): the rotary flag on an op that is not a qkv split", WH, kn);
        double cp = o->fattr[1];
        if (o->iattr[3] <= 0 || o->iattr[3] % 2 || o->iattr[3] > o->iattr[2] ||
            !(o->fattr[0] > 0) || !(o->fattr[0] < INFINITY) || !(cp >= 1 && cp <= 65536) ||
            cp != (double)(int64_t)cp)
            INVALID("%s (%s): rotary dim %" PRId64 " (head dim %" PRId64 "), base %g or "
                    "context-parallel degree %g out of range",
                    WH, kn, o->iattr[3], o->iattr[2], o->fattr[0], cp);
    }
    if ((o->flags & MGC_POF_QKV) && o->kind != MGC_POP_ATTENTION && o->kind != MGC_POP_ATTENTION_BWD)
        INVALID("%s (%s): the fused-qkv flag on an op that is not attention", WH, kn);
    if (o->kind == MGC_POP_ATTENTION || o->kind == MGC_POP_ATTENTION_BWD) {
        double w = o->fattr[2]; /* the sliding window in keys, 0 none (causal only) */
        if (!(w >= 0 && w <= 16777216.0) || w != (double)(int64_t)w || (w > 0 && !o->iattr[0]))
            INVALID("%s (%s): sliding window %g is not a whole number of keys from 0 to 2^24 on a "
                    "causal attention",
                    WH, kn, w);
    }
    if ((o->kind == MGC_POP_MOE_ROUTE || o->kind == MGC_POP_MOE_ROUTE_BWD) && o->iattr[0] == 0) {
        double f = o->fattr[2]; /* the routed weights' factor, 0: 1 */
        if (!(f >= 0 && f <= 1000))
            INVALID("%s (%s): top-k scaling factor %g outside 0..1000", WH, kn, f);
        int64_t a = o->iattr[3], E = o->iattr[1], K = o->iattr[2], G = MGC_ROUTE_GROUPS(a),
                GK = MGC_ROUTE_GROUP_TOPK(a);
        if (a < 0 || a != MGC_ROUTE_PACK(MGC_ROUTE_SCORE(a), G, GK) || MGC_ROUTE_SCORE(a) > 2)
            INVALID("%s (%s): router attribute %" PRId64
                    " is not a score function (0..2) with expert groups",
                    WH, kn, a);
        if (G == 0 ? GK != 0 : E < 1 || E % G || GK < 1 || GK > G || GK > K || K > GK * (E / G))
            INVALID("%s (%s): %" PRId64 " expert groups of which %" PRId64
                    " are used do not serve %" PRId64 " experts with top-%" PRId64,
                    WH, kn, G, GK, E, K);
        if (o->kind == MGC_POP_MOE_ROUTE && o->n_in > 1) { /* the expert bias */
            const mgc_plan_tensor *b = o->n_in == 2 && o->in[1] >= 0 && o->in[1] < c->n_tensors
                                           ? &c->tensors[o->in[1]]
                                           : NULL;
            if (!b || b->role != MGC_TR_INPUT || b->dtype != MGC_DT_F32 || b->rank != 1 ||
                b->dim[0] != E)
                INVALID("%s (%s): its second input must be the expert bias, an fp32 input of the "
                        "%" PRId64 " experts",
                        WH, kn, E);
        }
    }
    if (o->flags & MGC_POF_DOCS) {
        int need = (o->flags & MGC_POF_QKV ? 1 : 3) + (o->kind == MGC_POP_ATTENTION_BWD ? 3 : 0);
        if (o->kind == MGC_POP_ROPE || o->kind == MGC_POP_ROPE_BWD) need = 1;
        else if (o->kind == MGC_POP_EMBEDDING) need = 3; /* tokens, word, positions */
        else if (o->kind == MGC_POP_EMBEDDING_BWD) need = 2; /* tokens, dy */
        else if (o->kind == MGC_POP_EMBEDDING_NORM) need = o->n_in - 1; /* below */
        else if (o->kind == MGC_POP_QKV_SPLIT && (o->flags & MGC_POF_ROPE)) need = 1;
        else if (o->kind == MGC_POP_QKV_SPLIT_BWD && (o->flags & MGC_POF_ROPE)) need = 3;
        else if (o->kind != MGC_POP_ATTENTION && o->kind != MGC_POP_ATTENTION_BWD)
            INVALID("%s (%s): the document flag on an op that is not attention, a rope, a "
                    "rotating qkv split or an embedding",
                    WH, kn);
        if (o->n_in != need + 1 || o->n_in > MGC_PLAN_MAX_IO || o->in[o->n_in - 1] < 0 ||
            o->in[o->n_in - 1] >= c->n_tensors)
            INVALID("%s (%s): the document flag without the document starts as input %d", WH, kn, need);
        const mgc_plan_tensor *d = &c->tensors[o->in[o->n_in - 1]];
        if (d->dtype != MGC_DT_I32 || d->rank != 2)
            INVALID("%s (%s): the document starts are not an int32 (s, b) tensor", WH, kn);
    }
    if (o->flags & MGC_POF_ROWS) {
        int need = o->kind == MGC_POP_GELU || o->kind == MGC_POP_SWIGLU           ? 1
                   : o->kind == MGC_POP_GELU_BWD || o->kind == MGC_POP_SWIGLU_BWD ? 2
                                                                                  : -1;
        if (need < 0)
            INVALID("%s (%s): the routed-rows flag on an op that is not an activation", WH, kn);
        if (o->n_in != need + 1 || o->in[o->n_in - 1] < 0 || o->in[o->n_in - 1] >= c->n_tensors ||
            c->tensors[o->in[o->n_in - 1]].dtype != MGC_DT_I64 || c->tensors[o->in[o->n_in - 1]].rank != 1)
            INVALID("%s (%s): the routed-rows flag without the int64 tokens per expert as input %d",
                    WH, kn, need);
    }
    int fwd_kind = o->kind <= MGC_POP_LAST_FWD,
        bwd_kind = o->kind >= MGC_POP_EMBEDDING_BWD && o->kind < MGC_POP_ALL_REDUCE;
    if (!bwd && bwd_kind) INVALID("%s: backward op %s in a forward program", WH, kn);
    if (bwd && fwd_kind && !(o->flags & MGC_POF_RECOMPUTE))
        INVALID("%s: forward op %s in a backward program without the recompute flag", WH, kn);
    if (o->layer < -1) INVALID("%s (%s): layer %" PRId32 " below -1", WH, kn, o->layer);
    if (!str_ok(p, o->name))
        INVALID("%s (%s): name offset %" PRIu32 " outside the string table", WH, kn, o->name);
    if (o->n_in > MGC_PLAN_MAX_IO || o->n_out > MGC_PLAN_MAX_IO)
        INVALID("%s (%s): %u inputs, %u outputs, at most %d each", WH, kn, o->n_in, o->n_out,
                MGC_PLAN_MAX_IO);
    for (int i = 0; i < o->n_in; i++)
        if (o->in[i] < 0 || o->in[i] >= c->n_tensors)
            INVALID("%s (%s): input %d is tensor %" PRId32 ", outside 0..%" PRId64, WH, kn, i,
                    o->in[i], c->n_tensors - 1);
    for (int i = 0; i < o->n_out; i++)
        if (o->out[i] < 0 || o->out[i] >= c->n_tensors)
            INVALID("%s (%s): output %d is tensor %" PRId32 ", outside 0..%" PRId64, WH, kn, i,
                    o->out[i], c->n_tensors - 1);
    if (o->kind >= MGC_POP_ALL_REDUCE && o->group >= MGC_GROUP__COUNT)
        INVALID("%s (%s): group %u unknown", WH, kn, o->group);
    if ((o->flags & MGC_POF_CE_STATS) &&
        (o->kind != MGC_POP_CROSS_ENTROPY_BWD || o->n_in != 4 || o->n_out != 3))
        INVALID("%s (%s): the fused cross-entropy flag on an op that is not a cross_entropy_bwd "
                "of 4 inputs and 3 outputs",
                WH, kn);
    if (o->flags & (MGC_POF_COLSUM | MGC_POF_DROPBWD)) {
        /* the bias gradient fused into the norm backward: an fp32 vector of the norm's width;
         * the dropout backward: a u8 mask and the branch's gradient, each rows x h, the
         * gradient in dx's dtype, p in [0, 1) */
        mgc_norm_bwd_io io = {-1, -1, -1, -1, -1, 0};
        int ok = o->kind == MGC_POP_NORM_BWD && mgc_plan_norm_bwd_io(o, &io) == 0 && o->iattr[2] > 0;
        mgc_attn_geom ag; /* or the QKV projection's bias gradient fused into attention_bwd */
        if (o->kind == MGC_POP_ATTENTION_BWD && (o->flags & MGC_POF_QKV) &&
            !(o->flags & MGC_POF_DROPBWD) && o->n_out == 2 && !mgc_plan_attn_geom(c, o, &ag)) {
            const mgc_plan_tensor *b = &c->tensors[o->out[1]], *dx = &c->tensors[o->out[0]];
            ok = b->dtype == MGC_DT_F32 && !dx->ld &&
                 b->bytes == (uint64_t)((ag.A + 2 * ag.G) * ag.d) * 4;
        }
        /* or the bias gradient of the linear reading dh fused into linear_dgrad_gelu */
        if (o->kind == MGC_POP_LINEAR_DGRAD_GELU && !(o->flags & MGC_POF_DROPBWD) &&
            o->n_out == 2) {
            const mgc_plan_tensor *b = &c->tensors[o->out[1]], *dx = &c->tensors[o->out[0]];
            ok = b->dtype == MGC_DT_F32 && !dx->ld && o->iattr[2] > 0 &&
                 b->bytes == (uint64_t)o->iattr[2] * 4;
        }
        if (ok && io.cs >= 0) {
            const mgc_plan_tensor *b = &c->tensors[o->out[io.cs]];
            ok = b->dtype == MGC_DT_F32 && b->bytes == (uint64_t)o->iattr[2] * 4;
        }
        if (ok && io.dbr >= 0) {
            const mgc_plan_tensor *m = &c->tensors[o->in[io.mask]], *g = &c->tensors[o->out[io.dbr]],
                                  *dx = &c->tensors[o->out[0]];
            uint64_t n = (uint64_t)o->iattr[1] * (uint64_t)o->iattr[2];
            ok = m->dtype == MGC_DT_U8 && m->bytes == n && g->dtype == dx->dtype && !g->ld && !dx->ld &&
                 g->bytes == dx->bytes && o->fattr[1] >= 0 && o->fattr[1] < 1;
        }
        if (!ok)
            INVALID("%s (%s): the column-sum or dropout flag on an op that is not a norm_bwd whose "
                    "inputs and outputs fit them (a column sum: an fp32 vector of the norm's "
                    "width; the dropout: a u8 mask last in and a gradient like dx last out), "
                    "nor a fused-qkv attention_bwd with an fp32 vector of qkv's width second "
                    "out, nor a linear_dgrad_gelu with an fp32 vector of dh's width second out",
                    WH, kn);
    }
    if (o->kind == MGC_POP_EMBEDDING_NORM) {
        if (!(o->fattr[0] > 0) || !(o->fattr[0] <= 1) || (o->fattr[1] != 0 && o->fattr[1] != 1))
            INVALID("%s (%s): eps %g outside (0, 1] or norm kind %g neither 0 (LayerNorm) nor 1 "
                    "(RMSNorm)",
                    WH, kn, o->fattr[0], o->fattr[1]);
        /* the inputs' places follow from the attributes and flags (mgc_plan_emb_norm_io) */
        mgc_emb_norm_io io;
        if ((o->n_out != 2 && o->n_out != 3) ||
            !o->iattr[1] != !(o->n_in > 3 && o->in[2] >= 0 && o->in[2] < c->n_tensors &&
                              c->tensors[o->in[2]].rank == 2) ||
            mgc_plan_emb_norm_io(o, &io) != 0 || (io.docs >= 0 && !o->iattr[1]))
            INVALID("%s (%s): %u inputs and %u outputs do not fit its attributes (tokens, word, "
                    "positions when iattr[1], norm weight, a LayerNorm's bias, document starts "
                    "with learned positions; out x, y, and the dropout's mask)",
                    WH, kn, o->n_in, o->n_out);
        /* the embedding's dropout: its mask, a byte an element of x, exactly when p > 0 */
        const mgc_plan_tensor *x = &c->tensors[o->out[0]];
        if (o->n_out == 3 ? !(o->fattr[2] > 0 && o->fattr[2] < 1) ||
                                c->tensors[o->out[2]].dtype != MGC_DT_U8 ||
                                c->tensors[o->out[2]].bytes * mgc_dtype_size((mgc_dtype)x->dtype) != x->bytes ||
                                x->ld
                          : o->fattr[2] != 0)
            INVALID("%s (%s): dropout p %g with %u outputs (a mask, u8 of x's elements, exactly "
                    "when p is in (0, 1))",
                    WH, kn, o->fattr[2], o->n_out);
    }
    if (o->flags & MGC_POF_INPLACE) {
        /* the launchers that write out[0] over in[0] (cross_entropy.cuh, cpu_ops) */
        if (o->kind != MGC_POP_CROSS_ENTROPY_BWD || o->n_in < 1 || o->n_out < 1)
            INVALID("%s (%s): the in-place flag on an op that cannot write its output over its "
                    "input",
                    WH, kn);
        const mgc_plan_tensor *x = &c->tensors[o->in[0]], *y = &c->tensors[o->out[0]];
        size_t xs = mgc_dtype_size((mgc_dtype)x->dtype), ys = mgc_dtype_size((mgc_dtype)y->dtype);
        int same = x != y && x->rank == y->rank && x->rank >= 1 && x->ld == 0 && ys <= xs &&
                   xs % ys == 0 && x->buffer == y->buffer && x->offset == y->offset &&
                   x->bytes == y->bytes;
        for (int i = 0; same && i < x->rank; i++)
            same = x->dim[i] == y->dim[i];
        if (same) {
            uint64_t pitch = (uint64_t)x->dim[x->rank - 1] * (xs / ys);
            same = y->ld == (xs == ys ? 0 : pitch);
        }
        if (!same)
            INVALID("%s (%s): in place, but output %" PRId32 " is not input %" PRId32
                    "'s bytes, rows and shape at a row pitch of the two dtypes' ratio",
                    WH, kn, o->out[0], o->in[0]);
    }
    /* a tensor with a row pitch reaches only the launchers that take one */
    for (int i = 0; i < o->n_in; i++)
        if (c->tensors[o->in[i]].ld &&
            !(i == 0 && (o->kind == MGC_POP_LINEAR_DGRAD ||
                         (o->kind == MGC_POP_LINEAR_WGRAD && o->n_out == 1))))
            INVALID("%s (%s): input %d (tensor %" PRId32 ") has a row pitch, which only the "
                    "first input of linear_dgrad and of linear_wgrad without a bias may have",
                    WH, kn, i, o->in[i]);
    for (int i = 0; i < o->n_out; i++)
        if (c->tensors[o->out[i]].ld && !(i == 0 && (o->flags & MGC_POF_INPLACE)))
            INVALID("%s (%s): output %d (tensor %" PRId32 ") has a row pitch, which only the "
                    "output of an in-place op may have",
                    WH, kn, i, o->out[i]);
    return MGC_PLAN_OK;
}

/* In-place ops: the input whose bytes the output takes is touched by no later op of the
 * chunk's programs (the forward runs before the backward). */
static mgc_plan_status check_inplace(const mgc_plan_chunk *c, const wloc *wl, char *err,
                                     size_t errsz) {
    char wbuf[96];
    for (int pass = 0; pass < 2; pass++) {
        int64_t n = pass ? c->n_bwd : c->n_fwd;
        const mgc_plan_op *ops = pass ? c->bwd : c->fwd;
        for (int64_t i = 0; i < n; i++) {
            if (!(ops[i].flags & MGC_POF_INPLACE)) continue;
            int32_t x = ops[i].in[0];
            for (int q = pass; q < 2; q++) {
                int64_t m = q ? c->n_bwd : c->n_fwd;
                const mgc_plan_op *later = q ? c->bwd : c->fwd;
                for (int64_t j = q == pass ? i + 1 : 0; j < m; j++)
                    for (int k = 0; k < later[j].n_in + later[j].n_out; k++)
                        if ((k < later[j].n_in ? later[j].in[k] : later[j].out[k - later[j].n_in]) == x)
                            INVALID("%s: %s op %" PRId64 " writes over tensor %" PRId32
                                    ", which %s op %" PRId64 " touches after it",
                                    WH, pass ? "bwd" : "fwd", i, x, q ? "bwd" : "fwd", j);
            }
        }
    }
    return MGC_PLAN_OK;
}

/* [off, off + bytes) inside buffer `buf` of kind `kind` of stage st. */
static int bucket_range_ok(const mgc_stage_program *st, int32_t buf, uint16_t kind, uint64_t off,
                           uint64_t bytes) {
    if (buf < 0 || buf >= st->n_buffers || st->buffers[buf].kind != kind) return 0;
    return off <= st->buffers[buf].bytes && bytes <= st->buffers[buf].bytes - off;
}

/* The gradient buckets of stage s (docs/plan-format.md, BCKT). */
static mgc_plan_status check_buckets(const mgc_plan *p, int64_t s, char *err, size_t errsz) {
    const mgc_stage_program *st = &p->stages[s];
    wloc wl_ = {s, -1, -1, ""};
    const wloc *wl = &wl_;
    char wbuf[96];
    if (st->n_buckets < 0 || st->n_buckets > UINT32_MAX || (st->n_buckets > 0 && !st->buckets))
        INVALID("stage %" PRId64 ": %" PRId64 " buckets without an array (at most 2^32-1)", s,
                st->n_buckets);
    const mgc_grid *g = &p->grid;
    for (int64_t i = 0; i < st->n_buckets; i++) {
        const mgc_bucket *b = &st->buckets[i];
        wl_ = (wloc){s, -1, i, "bucket"};
        if (b->group != MGC_GROUP_DPCP && b->group != MGC_GROUP_EDP)
            INVALID("%s: group %u is neither dp_cp (%d) nor edp (%d)", WH, b->group,
                    MGC_GROUP_DPCP, MGC_GROUP_EDP);
        if (b->chunk >= st->n_chunks)
            INVALID("%s: chunk %u outside 0..%" PRId64, WH, b->chunk, st->n_chunks - 1);
        int64_t want = !p->distributed_optimizer      ? 1
                       : b->group == MGC_GROUP_DPCP ? g->dp * g->cp
                                                    : g->edp;
        if (b->shards != want)
            INVALID("%s (%s): %" PRId64 " shards, expected %" PRId64
                    " (the group's size with the distributed optimizer, else 1)",
                    WH, mgc_group_name((mgc_group_kind)b->group), b->shards, want);
        if (b->count == 0 || b->count % (uint64_t)b->shards)
            INVALID("%s: %" PRIu64 " elements, not a positive multiple of its %" PRId64 " shards",
                    WH, b->count, b->shards);
        if (b->begin > UINT64_MAX / 8 || b->count > UINT64_MAX / 8 - b->begin)
            INVALID("%s: element range [%" PRIu64 ", +%" PRIu64 ") overflows", WH, b->begin,
                    b->count);
        if (i > 0 && b->begin + b->count > st->buckets[i - 1].begin)
            INVALID("%s: [%" PRIu64 ", +%" PRIu64 ") does not end at or before bucket %" PRId64
                    " (at %" PRIu64 "): buckets are disjoint, in reverse layout order",
                    WH, b->begin, b->count, i - 1, st->buckets[i - 1].begin);
        if (b->grad_offset != b->begin * 4 || b->grad_bytes != b->count * 4)
            INVALID("%s: grad bytes [%" PRIu64 ", +%" PRIu64 ") are not elements [%" PRIu64
                    ", +%" PRIu64 ") x 4",
                    WH, b->grad_offset, b->grad_bytes, b->begin, b->count);
        uint64_t wsz = b->weight_bytes / b->count;
        if ((wsz != 2 && wsz != 4) || b->weight_bytes != b->count * wsz ||
            b->weight_offset != b->begin * wsz)
            INVALID("%s: weight bytes [%" PRIu64 ", +%" PRIu64 ") are not elements [%" PRIu64
                    ", +%" PRIu64 ") x 2 or 4",
                    WH, b->weight_offset, b->weight_bytes, b->begin, b->count);
        if (!bucket_range_ok(st, b->grad_buffer, MGC_BUF_GRAD, b->grad_offset, b->grad_bytes))
            INVALID("%s: grad bytes [%" PRIu64 ", +%" PRIu64 ") outside buffer %" PRId32
                    ", or it is not a grad buffer",
                    WH, b->grad_offset, b->grad_bytes, b->grad_buffer);
        if (!bucket_range_ok(st, b->weight_buffer, MGC_BUF_WEIGHT, b->weight_offset,
                             b->weight_bytes))
            INVALID("%s: weight bytes [%" PRIu64 ", +%" PRIu64 ") outside buffer %" PRId32
                    ", or it is not a weight buffer",
                    WH, b->weight_offset, b->weight_bytes, b->weight_buffer);
    }
    return MGC_PLAN_OK;
}

static mgc_plan_status check_stage(const mgc_plan *p, int64_t s, char *err, size_t errsz) {
    const mgc_stage_program *st = &p->stages[s];
    wloc wl_ = {s, -1, -1, ""};
    const wloc *wl = &wl_;
    char wbuf[96];
    if (st->pp_rank != s)
        INVALID("stage %" PRId64 ": pp_rank %" PRId64 ", expected %" PRId64, s, st->pp_rank, s);
    if (st->n_chunks != p->grid.vp || !st->chunks)
        INVALID("stage %" PRId64 ": %" PRId64 " chunks, the grid has vp %" PRId64, s, st->n_chunks,
                p->grid.vp);
    if (st->n_instrs < 0 || (st->n_instrs > 0 && !st->instrs))
        INVALID("stage %" PRId64 ": %" PRId64 " instructions without an array", s, st->n_instrs);
    if (st->n_buffers < 0 || st->n_buffers > INT32_MAX || (st->n_buffers > 0 && !st->buffers))
        INVALID("stage %" PRId64 ": %" PRId64 " buffers without an array (at most 2^31-1)", s,
                st->n_buffers);
    if (st->max_in_flight < 0)
        INVALID("stage %" PRId64 ": max_in_flight %" PRId64 " below 0", s, st->max_in_flight);
    for (int64_t i = 0; i < st->n_buffers; i++) {
        const mgc_buffer *b = &st->buffers[i];
        wl_ = (wloc){s, -1, i, "buffer"};
        if (!str_ok(p, b->name))
            INVALID("%s: name offset %" PRIu32 " outside the string table", WH, b->name);
        if (b->kind >= MGC_BUF__COUNT) INVALID("%s: kind %u unknown", WH, b->kind);
        if (b->chunk != 0xffffu && b->chunk >= st->n_chunks)
            INVALID("%s: chunk %u outside 0..%" PRId64, WH, b->chunk, st->n_chunks - 1);
        if (b->mb < -1 || b->mb >= p->num_microbatches)
            INVALID("%s: microbatch %" PRId32 " outside -1..%" PRId64, WH, b->mb,
                    p->num_microbatches - 1);
        if (b->offset % MGC_PLAN_ALIGN)
            INVALID("%s: offset %" PRIu64 " not a multiple of %u", WH, b->offset,
                    MGC_PLAN_ALIGN);
        if (b->offset > st->arena_bytes || b->bytes > st->arena_bytes - b->offset)
            INVALID("%s: [%" PRIu64 ", +%" PRIu64 ") outside the arena of %" PRIu64 " bytes", WH,
                    b->offset, b->bytes, st->arena_bytes);
        if (b->live_begin < 0 || b->live_begin > b->live_end || b->live_end > st->n_instrs)
            INVALID("%s: live range [%" PRId64 ", %" PRId64 ") outside [0, %" PRId64 "]", WH,
                    b->live_begin, b->live_end, st->n_instrs);
    }
    mgc_plan_status brc = check_buckets(p, s, err, errsz);
    if (brc) return brc;
    int64_t n_reduce = 0;
    for (int64_t i = 0; i < st->n_instrs; i++) {
        const mgc_instr *in = &st->instrs[i];
        wl_ = (wloc){s, -1, i, "instruction"};
        if (in->op >= MGC_I__COUNT) INVALID("%s: op %u unknown", WH, in->op);
        if (in->op == MGC_I_REDUCE_GRADS || in->op == MGC_I_GATHER_PARAMS) {
            n_reduce += in->op == MGC_I_REDUCE_GRADS;
            if ((int64_t)in->arg >= st->n_buckets)
                INVALID("%s (%s): bucket %" PRIu32 " outside the stage's %" PRId64 " buckets",
                        WH, instr_names[in->op], in->arg, st->n_buckets);
        }
        const char *on = instr_names[in->op];
        if (in->chunk >= st->n_chunks)
            INVALID("%s (%s): chunk %u outside 0..%" PRId64, WH, on, in->chunk,
                    st->n_chunks - 1);
        if (in->mb < (instr_per_mb(in->op) ? 0 : -1) || in->mb >= p->num_microbatches)
            INVALID("%s (%s): microbatch %" PRId32 " outside %d..%" PRId64, WH, on, in->mb,
                    instr_per_mb(in->op) ? 0 : -1, p->num_microbatches - 1);
        if (instr_p2p(in->op)) {
            if (in->peer < 0 || in->peer >= p->n_stages || in->peer == s)
                INVALID("%s (%s): peer %" PRId32 " is not another pipeline rank of 0..%" PRId64,
                        WH, on, in->peer, p->n_stages - 1);
        } else if (in->peer != -1) {
            INVALID("%s (%s): peer %" PRId32 " on an instruction without a peer (must be -1)",
                    WH, on, in->peer);
        }
    }
    if (n_reduce != st->n_buckets)
        INVALID("stage %" PRId64 ": %" PRId64 " reduce_grads instructions for %" PRId64
                " gradient buckets (one each)",
                s, n_reduce, st->n_buckets);
    for (int64_t c = 0; c < st->n_chunks; c++) {
        const mgc_plan_chunk *ch = &st->chunks[c];
        wl_ = (wloc){s, c, -1, ""};
        if (ch->first_layer < 0 || ch->num_layers < 0)
            INVALID("%s: layers %" PRId32 " + %" PRId32 " negative", WH, ch->first_layer,
                    ch->num_layers);
        if (ch->embedding > 1 || ch->loss > 1)
            INVALID("%s: embedding/loss flags must be 0 or 1", WH);
        if (ch->n_tensors < 0 || ch->n_tensors > INT32_MAX || (ch->n_tensors > 0 && !ch->tensors))
            INVALID("%s: %" PRId64 " tensors without an array (at most 2^31-1)", WH,
                    ch->n_tensors);
        if (ch->n_fwd < 0 || (ch->n_fwd > 0 && !ch->fwd))
            INVALID("%s: %" PRId64 " forward ops without an array", WH, ch->n_fwd);
        if (ch->n_bwd < 0 || (ch->n_bwd > 0 && !ch->bwd))
            INVALID("%s: %" PRId64 " backward ops without an array", WH, ch->n_bwd);
        for (int64_t i = 0; i < ch->n_tensors; i++) {
            wl_ = (wloc){s, c, i, "tensor"};
            mgc_plan_status rc = check_tensor(p, st, ch, &ch->tensors[i], wl, err, errsz);
            if (rc) return rc;
        }
        for (int pass = 0; pass < 2; pass++) {
            int64_t n = pass ? ch->n_bwd : ch->n_fwd;
            const mgc_plan_op *ops = pass ? ch->bwd : ch->fwd;
            for (int64_t i = 0; i < n; i++) {
                wl_ = (wloc){s, c, i, pass ? "bwd op" : "fwd op"};
                mgc_plan_status rc = check_op(p, ch, &ops[i], pass, wl, err, errsz);
                if (rc) return rc;
            }
        }
        wl_ = (wloc){s, c, -1, ""};
        mgc_plan_status rc = check_inplace(ch, wl, err, errsz);
        if (rc) return rc;
    }
    return MGC_PLAN_OK;
}

mgc_plan_status mgc_plan_validate(const mgc_plan *p, char *err, size_t errsz) {
    if (!p) INVALID("no plan");
    const mgc_grid *g = &p->grid;
    if (mgc_grid_check(g))
        INVALID("grid world %" PRId64 " != tp %" PRId64 " x cp %" PRId64 " x dp %" PRId64
                " x pp %" PRId64 " or != etp %" PRId64 " x ep %" PRId64 " x edp %" PRId64
                " x pp, or vp %" PRId64 " outside 1..65535",
                g->world, g->tp, g->cp, g->dp, g->pp, g->etp, g->ep, g->edp, g->vp);
    if (p->n_stages != g->pp || !p->stages)
        INVALID("%" PRId64 " stage programs for pp %" PRId64, p->n_stages, g->pp);
    if (p->num_microbatches < 1 || p->num_microbatches > INT32_MAX)
        INVALID("num_microbatches %" PRId64 " outside 1..2^31-1", p->num_microbatches);
    if (p->micro_batch_size < 1)
        INVALID("micro_batch_size %" PRId64 " below 1", p->micro_batch_size);
    if (p->seq_length < 1) INVALID("seq_length %" PRId64 " below 1", p->seq_length);
    if (p->schedule < 0 || p->schedule > 2)
        INVALID("schedule %" PRId32 " unknown (0..2)", p->schedule);
    if (p->recompute < 0 || p->recompute > 2)
        INVALID("recompute %" PRId32 " unknown (0..2)", p->recompute);
    if (p->distributed_optimizer < 0 || p->distributed_optimizer > 1)
        INVALID("distributed_optimizer %" PRId32 " not 0 or 1", p->distributed_optimizer);
    if (!(p->bubble_fraction >= 0.0 && p->bubble_fraction <= 1.0))
        INVALID("bubble_fraction %g outside [0, 1]", p->bubble_fraction);
    if (!(p->model_flops_per_iter >= 0.0) || isinf(p->model_flops_per_iter))
        INVALID("model_flops_per_iter %g not a finite non-negative number",
                p->model_flops_per_iter);
    if (p->strings_len > UINT32_MAX)
        INVALID("string table of %" PRIu64 " bytes, above 4 GiB", p->strings_len);
    if (p->strings_len > 0 &&
        (!p->strings || p->strings[0] != '\0' || p->strings[p->strings_len - 1] != '\0'))
        INVALID("string table must start and end with a NUL byte");
    if (p->n_config < 0 || (p->n_config > 0 && !p->config))
        INVALID("%" PRId64 " config entries without an array", p->n_config);
    for (int64_t i = 0; i < p->n_config; i++) {
        const mgc_plan_kv *kv = &p->config[i];
        if (!str_ok(p, kv->key) || kv->key == 0 || p->strings[kv->key] == '\0')
            INVALID("config entry %" PRId64 ": key offset %" PRIu32
                    " not a name in the string table",
                    i, kv->key);
        if (kv->type > 2)
            INVALID("config entry %" PRId64 " (%s): type %u unknown (0 int, 1 float, 2 string)", i,
                    p->strings + kv->key, kv->type);
        if (kv->type == 2 && !str_ok(p, kv->s))
            INVALID("config entry %" PRId64 " (%s): string offset %" PRIu32
                    " outside the string table",
                    i, p->strings + kv->key, kv->s);
    }
    for (int64_t s = 0; s < p->n_stages; s++) {
        mgc_plan_status rc = check_stage(p, s, err, errsz);
        if (rc) return rc;
    }
    if (p->n_kernels < 0 || (p->n_kernels > 0 && (!p->kernels || !p->kbin)))
        INVALID("%" PRId64 " kernels without their arrays", p->n_kernels);
    for (int64_t i = 0; i < p->n_kernels; i++) {
        const mgc_plan_kernel *k = &p->kernels[i];
        if (!str_ok(p, k->name) || k->name == 0 || p->strings[k->name] == '\0')
            INVALID("kernel %" PRId64 ": name offset %" PRIu32 " not a name in the string table", i,
                    k->name);
        if (k->arch < 50 || k->arch > 1000)
            INVALID("kernel %" PRId64 " (%s): architecture %" PRIu32 " outside 50..1000", i,
                    p->strings + k->name, k->arch);
        if (k->bytes == 0 || k->offset > p->kbin_len || k->bytes > p->kbin_len - k->offset)
            INVALID("kernel %" PRId64 " (%s): bytes [%" PRIu64 ", +%" PRIu64
                    ") outside the %" PRIu64 "-byte kernel binaries",
                    i, p->strings + k->name, k->offset, k->bytes, p->kbin_len);
    }
    return MGC_PLAN_OK;
}

/* ---- encode --------------------------------------------------------------- */

static void put_dirent(uint8_t *r, const dirent_ *e) {
    st32(r + 0, e->id);
    st32(r + 4, e->flags);
    st32(r + 8, e->stage);
    st32(r + 12, e->chunk);
    st64(r + 16, e->offset);
    st64(r + 24, e->length);
    st64(r + 32, e->count);
    st32(r + 40, e->elem_bytes);
    st32(r + 44, e->crc);
}
static void get_dirent(const uint8_t *r, dirent_ *e) {
    e->id = ld32(r + 0);
    e->flags = ld32(r + 4);
    e->stage = ld32(r + 8);
    e->chunk = ld32(r + 12);
    e->offset = ld64(r + 16);
    e->length = ld64(r + 24);
    e->count = ld64(r + 32);
    e->elem_bytes = ld32(r + 40);
    e->crc = ld32(r + 44);
}

static void add_section(dirent_ *d, size_t *n, int kind, uint32_t stage, uint32_t chunk,
                        uint64_t count) {
    dirent_ *e = &d[(*n)++];
    memset(e, 0, sizeof *e);
    e->id = fourcc(sections[kind].id);
    e->stage = stage;
    e->chunk = chunk;
    e->count = count;
    e->elem_bytes = sections[kind].bytes;
}

/* Serialize the section described by e (its kind, stage, chunk) at out. */
static void put_section(uint8_t *out, const dirent_ *e, const mgc_plan *p) {
    if (e->id == fourcc("KERN")) {
        for (uint64_t i = 0; i < e->count; i++) {
            const mgc_plan_kernel *k = &p->kernels[i];
            uint8_t *r = out + i * KERN_BYTES;
            st32(r + 0, k->name);
            st32(r + 4, k->arch);
            st64(r + 8, k->offset);
            st64(r + 16, k->bytes);
        }
        return;
    }
    if (e->id == fourcc("KBIN")) {
        if (e->count) memcpy(out, p->kbin, (size_t)e->count);
        return;
    }
    int kind = section_of(e->id);
    const mgc_stage_program *st = e->stage != NO_INDEX ? &p->stages[e->stage] : NULL;
    const mgc_plan_chunk *ch = st && e->chunk != NO_INDEX ? &st->chunks[e->chunk] : NULL;
    uint32_t sz = e->elem_bytes;
    switch (kind) {
    case S_GRID:
        put_grid(out, p);
        break;
    case S_CONF:
        for (uint64_t i = 0; i < e->count; i++)
            put_kv(out + i * sz, &p->config[i]);
        break;
    case S_STRS:
        if (e->count) memcpy(out, p->strings, e->count);
        break;
    case S_STAG:
        put_stage(out, st);
        break;
    case S_INST:
        for (uint64_t i = 0; i < e->count; i++)
            put_instr(out + i * sz, &st->instrs[i]);
        break;
    case S_BUFS:
        for (uint64_t i = 0; i < e->count; i++)
            put_buffer(out + i * sz, &st->buffers[i]);
        break;
    case S_BCKT:
        for (uint64_t i = 0; i < e->count; i++)
            put_bucket(out + i * sz, &st->buckets[i]);
        break;
    case S_CHNK:
        put_chunk(out, ch);
        break;
    case S_TENS:
        for (uint64_t i = 0; i < e->count; i++)
            put_tensor(out + i * sz, &ch->tensors[i]);
        break;
    case S_FWDO:
        for (uint64_t i = 0; i < e->count; i++)
            put_op(out + i * sz, &ch->fwd[i]);
        break;
    case S_BWDO:
        for (uint64_t i = 0; i < e->count; i++)
            put_op(out + i * sz, &ch->bwd[i]);
        break;
    default:
        break;
    }
}

mgc_plan_status mgc_plan_encode(const mgc_plan *p, uint8_t **out_buf, size_t *out_len, char *err,
                                size_t errsz) {
    if (!out_buf || !out_len) {
        set_err(err, errsz, "mgc_plan_encode: no output buffer");
        return MGC_PLAN_ERR_INVALID;
    }
    *out_buf = NULL;
    *out_len = 0;
    char why[256];
    if (mgc_plan_validate(p, why, sizeof why)) {
        set_err(err, errsz, "invalid plan: %s (a compiler bug: please report it)", why);
        return MGC_PLAN_ERR_INVALID;
    }
    /* the directory: plan-wide sections, then each stage's, then its chunks' */
    uint64_t n_sec = 3 + (p->n_kernels > 0 ? 2 : 0);
    for (int64_t s = 0; s < p->n_stages; s++)
        n_sec += 4 + 4 * (uint64_t)p->stages[s].n_chunks;
    if (n_sec > UINT32_MAX) {
        set_err(err, errsz, "invalid plan: %" PRIu64 " sections, above 2^32-1", n_sec);
        return MGC_PLAN_ERR_INVALID;
    }
    dirent_ *dir = calloc(n_sec, sizeof *dir);
    if (!dir) {
        set_err(err, errsz, "out of memory encoding the plan");
        return MGC_PLAN_ERR_NOMEM;
    }
    size_t n = 0;
    add_section(dir, &n, S_GRID, NO_INDEX, NO_INDEX, 1);
    add_section(dir, &n, S_CONF, NO_INDEX, NO_INDEX, (uint64_t)p->n_config);
    add_section(dir, &n, S_STRS, NO_INDEX, NO_INDEX, p->strings_len);
    for (int64_t s = 0; s < p->n_stages; s++) {
        const mgc_stage_program *st = &p->stages[s];
        uint32_t si = (uint32_t)s;
        add_section(dir, &n, S_STAG, si, NO_INDEX, 1);
        add_section(dir, &n, S_INST, si, NO_INDEX, (uint64_t)st->n_instrs);
        add_section(dir, &n, S_BUFS, si, NO_INDEX, (uint64_t)st->n_buffers);
        add_section(dir, &n, S_BCKT, si, NO_INDEX, (uint64_t)st->n_buckets);
        for (int64_t c = 0; c < st->n_chunks; c++) {
            const mgc_plan_chunk *ch = &st->chunks[c];
            uint32_t ci = (uint32_t)c;
            add_section(dir, &n, S_CHNK, si, ci, 1);
            add_section(dir, &n, S_TENS, si, ci, (uint64_t)ch->n_tensors);
            add_section(dir, &n, S_FWDO, si, ci, (uint64_t)ch->n_fwd);
            add_section(dir, &n, S_BWDO, si, ci, (uint64_t)ch->n_bwd);
        }
    }
    if (p->n_kernels > 0) { /* the optional trailing sections */
        dirent_ *e = &dir[n++];
        memset(e, 0, sizeof *e);
        e->id = fourcc("KERN");
        e->stage = e->chunk = NO_INDEX;
        e->count = (uint64_t)p->n_kernels;
        e->elem_bytes = KERN_BYTES;
        e = &dir[n++];
        memset(e, 0, sizeof *e);
        e->id = fourcc("KBIN");
        e->stage = e->chunk = NO_INDEX;
        e->count = p->kbin_len;
        e->elem_bytes = 1;
    }
    uint64_t pos = HEADER_BYTES + n * DIR_ENTRY_BYTES;
    for (size_t i = 0; i < n; i++) {
        dirent_ *e = &dir[i];
        if (e->count > (UINT64_MAX / 2) / e->elem_bytes) goto too_big;
        e->length = e->count * e->elem_bytes;
        pos = align8(pos);
        e->offset = pos;
        if (e->length > UINT64_MAX / 2 - pos) goto too_big;
        pos += e->length;
    }
    uint64_t total = align8(pos);
    if (total > SIZE_MAX) goto too_big;
    uint8_t *buf = calloc(1, (size_t)total);
    if (!buf) {
        free(dir);
        set_err(err, errsz, "out of memory encoding a plan of %" PRIu64 " bytes", total);
        return MGC_PLAN_ERR_NOMEM;
    }
    for (size_t i = 0; i < n; i++) {
        dirent_ *e = &dir[i];
        put_section(buf + e->offset, e, p);
        e->crc = mgc_crc32c(0, buf + e->offset, (size_t)e->length);
        put_dirent(buf + HEADER_BYTES + i * DIR_ENTRY_BYTES, e);
    }
    memcpy(buf, plan_magic, sizeof plan_magic);
    st32(buf + 8, MGC_PLAN_VERSION);
    st32(buf + 12, 0); /* flags */
    st64(buf + 16, total);
    st32(buf + 24, (uint32_t)n);
    st32(buf + 28, DIR_ENTRY_BYTES);
    st32(buf + 32, mgc_crc32c(0, buf + HEADER_BYTES, n * DIR_ENTRY_BYTES));
    st32(buf + HEADER_CRC_AT, mgc_crc32c(0, buf, HEADER_CRC_AT));
    free(dir);
    *out_buf = buf;
    *out_len = (size_t)total;
    return MGC_PLAN_OK;
too_big:
    free(dir);
    set_err(err, errsz, "invalid plan: too large to encode");
    return MGC_PLAN_ERR_INVALID;
}

/* ---- decode --------------------------------------------------------------- */

#define HINT_DAMAGED                                                                               \
    "the file was damaged after mgc compile wrote it: copy it again or recompile with mgc compile"

/* A corrupt-file error: "NAME: corrupt plan: WHAT: HINT". */
#define CORRUPT(...)                                                                               \
    do {                                                                                           \
        char what_[256];                                                                           \
        snprintf(what_, sizeof what_, __VA_ARGS__);                                                \
        set_err(err, errsz, "%s: corrupt plan: %s: %s", name, what_, HINT_DAMAGED);                \
        rc = MGC_PLAN_ERR_FORMAT;                                                                  \
        goto fail;                                                                                 \
    } while (0)

/* The label of directory entry e, computed only for a message. */
#define LABEL section_label(e, lab, sizeof lab)

/* Where the section walk is: the next known section it expects. */
typedef struct cursor {
    int kind;      /* S_* expected next, S__COUNT when done */
    int64_t stage; /* its stage (-1 plan-wide) */
    int64_t chunk; /* its chunk (-1 stage-wide) */
} cursor;

/* The known section that follows `cur` in the canonical order. */
static void advance(cursor *cur, const mgc_plan *p) {
    switch (cur->kind) {
    case S_GRID:
        cur->kind = S_CONF;
        return;
    case S_CONF:
        cur->kind = S_STRS;
        return;
    case S_STRS:
    next_stage:
        cur->stage++;
        cur->chunk = -1;
        cur->kind = cur->stage < p->n_stages ? S_STAG : S__COUNT;
        return;
    case S_STAG:
        cur->kind = S_INST;
        return;
    case S_INST:
        cur->kind = S_BUFS;
        return;
    case S_BUFS:
        cur->kind = S_BCKT;
        return;
    case S_BCKT:
    case S_BWDO:
        cur->chunk++;
        if (cur->chunk >= p->stages[cur->stage].n_chunks) goto next_stage;
        cur->kind = S_CHNK;
        return;
    case S_CHNK:
        cur->kind = S_TENS;
        return;
    case S_TENS:
        cur->kind = S_FWDO;
        return;
    case S_FWDO:
        cur->kind = S_BWDO;
        return;
    default:
        cur->kind = S__COUNT;
        return;
    }
}

static const char *cursor_label(const cursor *cur, char *buf, size_t n) {
    dirent_ e = {0};
    e.id = fourcc(sections[cur->kind].id);
    e.stage = cur->stage < 0 ? NO_INDEX : (uint32_t)cur->stage;
    e.chunk = cur->chunk < 0 ? NO_INDEX : (uint32_t)cur->chunk;
    return section_label(&e, buf, n);
}

/* calloc for n records of `size` bytes; n was bounded by the section length. */
static void *alloc_records(uint64_t n, size_t size) {
    if (n == 0) return NULL;
    if (n > SIZE_MAX / size) return NULL;
    return calloc((size_t)n, size);
}

mgc_plan_status mgc_plan_decode(const uint8_t *buf, size_t len, const char *name, mgc_plan **out,
                                char *err, size_t errsz) {
    mgc_plan_status rc = MGC_PLAN_OK;
    mgc_plan *p = NULL;
    dirent_ *dir = NULL;
    char lab[64], lab2[64];
    if (!name) name = "<memory>";
    if (!out) {
        set_err(err, errsz, "%s: mgc_plan_decode: no output pointer", name);
        return MGC_PLAN_ERR_INVALID;
    }
    *out = NULL;
    if (!buf && len) len = 0;

    /* header: magic, checksum, version, length */
    if (len == 0) {
        set_err(err, errsz, "%s: empty file, not an mgc plan: pass the plan file mgc compile wrote",
                name);
        return MGC_PLAN_ERR_FORMAT;
    }
    size_t nm = len < sizeof plan_magic ? len : sizeof plan_magic;
    if (memcmp(buf, plan_magic, nm) != 0) {
        uint8_t b[4] = {0, 0, 0, 0};
        memcpy(b, buf, len < 4 ? len : 4);
        set_err(
            err, errsz,
            "%s: not an mgc plan (it starts with %02x %02x %02x %02x, a plan with 89 4d 47 43): "
            "pass the plan file mgc compile wrote",
            name, b[0], b[1], b[2], b[3]);
        return MGC_PLAN_ERR_FORMAT;
    }
    if (len < HEADER_BYTES) {
        set_err(err, errsz,
                "%s: truncated plan (%zu bytes, shorter than the %u-byte header): the copy or the "
                "write "
                "was cut short; copy it again or recompile with mgc compile",
                name, len, HEADER_BYTES);
        return MGC_PLAN_ERR_FORMAT;
    }
    if (ld32(buf + HEADER_CRC_AT) != mgc_crc32c(0, buf, HEADER_CRC_AT)) {
        set_err(err, errsz, "%s: corrupt plan: header checksum mismatch: %s", name, HINT_DAMAGED);
        return MGC_PLAN_ERR_FORMAT;
    }
    uint32_t version = ld32(buf + 8);
    if (version != MGC_PLAN_VERSION) {
        set_err(err, errsz,
                "%s: plan format version %" PRIu32
                ", this mgc-run reads %u: recompile with mgc compile",
                name, version, MGC_PLAN_VERSION);
        return MGC_PLAN_ERR_VERSION;
    }
    uint32_t flags = ld32(buf + 12);
    if (flags != 0) {
        set_err(err, errsz,
                "%s: plan uses format features this mgc-run lacks (flags 0x%08" PRIx32
                "): recompile with "
                "mgc compile or use the matching mgc-run",
                name, flags);
        return MGC_PLAN_ERR_VERSION;
    }
    uint64_t file_bytes = ld64(buf + 16);
    if ((uint64_t)len < file_bytes) {
        set_err(err, errsz,
                "%s: truncated plan (%zu bytes, the header says %" PRIu64
                "): the copy or the write was cut "
                "short; copy it again or recompile with mgc compile",
                name, len, file_bytes);
        return MGC_PLAN_ERR_FORMAT;
    }
    if ((uint64_t)len > file_bytes) {
        set_err(err, errsz, "%s: corrupt plan: %zu bytes, the header says %" PRIu64 ": %s", name,
                len, file_bytes, HINT_DAMAGED);
        return MGC_PLAN_ERR_FORMAT;
    }
    if (file_bytes % 8) {
        set_err(err, errsz, "%s: corrupt plan: length %" PRIu64 " not a multiple of 8: %s", name,
                file_bytes, HINT_DAMAGED);
        return MGC_PLAN_ERR_FORMAT;
    }
    uint32_t n_sec = ld32(buf + 24), entry_bytes = ld32(buf + 28);
    if (entry_bytes < DIR_ENTRY_BYTES || n_sec > (file_bytes - HEADER_BYTES) / entry_bytes) {
        set_err(err, errsz,
                "%s: corrupt plan: directory of %" PRIu32 " x %" PRIu32 " bytes does not fit: %s",
                name, n_sec, entry_bytes, HINT_DAMAGED);
        return MGC_PLAN_ERR_FORMAT;
    }
    uint64_t dir_bytes = (uint64_t)n_sec * entry_bytes;
    if (ld32(buf + 32) != mgc_crc32c(0, buf + HEADER_BYTES, (size_t)dir_bytes)) {
        set_err(err, errsz, "%s: corrupt plan: directory checksum mismatch: %s", name,
                HINT_DAMAGED);
        return MGC_PLAN_ERR_FORMAT;
    }

    /* directory: every section in bounds, back to back, checksummed */
    dir = alloc_records(n_sec, sizeof *dir);
    if (n_sec && !dir) goto nomem;
    uint64_t end = HEADER_BYTES + dir_bytes;
    for (uint32_t i = 0; i < n_sec; i++) {
        dirent_ *e = &dir[i];
        get_dirent(buf + HEADER_BYTES + (uint64_t)i * entry_bytes, e);
        if (e->offset != align8(end) || e->offset > file_bytes)
            CORRUPT("section %" PRIu32 " %s at offset %" PRIu64 ", expected %" PRIu64, i, LABEL,
                    e->offset, align8(end));
        for (uint64_t b = end; b < e->offset; b++)
            if (buf[b]) CORRUPT("non-zero padding byte at offset %" PRIu64, b);
        if (e->length > file_bytes - e->offset)
            CORRUPT("section %" PRIu32 " %s of %" PRIu64 " bytes at offset %" PRIu64
                    " passes the end of the file",
                    i, LABEL, e->length, e->offset);
        if (e->elem_bytes == 0 || e->length % e->elem_bytes ||
            e->length / e->elem_bytes != e->count)
            CORRUPT("section %" PRIu32 " %s: %" PRIu64 " records of %" PRIu32 " bytes in %" PRIu64
                    " bytes",
                    i, LABEL, e->count, e->elem_bytes, e->length);
        if (e->flags)
            CORRUPT("section %" PRIu32 " %s: unknown flags 0x%08" PRIx32, i, LABEL, e->flags);
        if (mgc_crc32c(0, buf + e->offset, (size_t)e->length) != e->crc)
            CORRUPT("section %" PRIu32 " %s: checksum mismatch", i, LABEL);
        end = e->offset + e->length;
    }
    if (align8(end) != file_bytes)
        CORRUPT("%" PRIu64 " bytes after the last section", file_bytes - end);
    for (uint64_t b = end; b < file_bytes; b++)
        if (buf[b]) CORRUPT("non-zero padding byte at offset %" PRIu64, b);

    /* sections: the known ones in canonical order, unknown ones skipped */
    p = mgc_plan_new();
    if (!p) goto nomem;
    cursor cur = {S_GRID, -1, -1};
    for (uint32_t i = 0; i < n_sec; i++) {
        const dirent_ *e = &dir[i];
        if (e->id == fourcc("KERN") || e->id == fourcc("KBIN")) { /* optional, after the stages */
            if (cur.kind != S__COUNT)
                CORRUPT("section %" PRIu32 " %s before the last stage's sections", i, LABEL);
            if (e->stage != NO_INDEX || e->chunk != NO_INDEX)
                CORRUPT("section %" PRIu32 " %s is not plan-wide", i, LABEL);
            const uint8_t *r = buf + e->offset;
            if (e->id == fourcc("KBIN")) {
                if (e->elem_bytes != 1 || p->kbin)
                    CORRUPT("section %" PRIu32 " %s: a second one, or records of %" PRIu32 " bytes", i,
                            LABEL, e->elem_bytes);
                if (e->count) {
                    p->kbin = malloc((size_t)e->count);
                    if (!p->kbin) goto nomem;
                    memcpy(p->kbin, r, (size_t)e->count);
                }
                p->kbin_len = e->count;
            } else {
                if (e->elem_bytes < KERN_BYTES || p->kernels)
                    CORRUPT("section %" PRIu32 " %s: a second one, or records of %" PRIu32 " bytes", i,
                            LABEL, e->elem_bytes);
                p->kernels = alloc_records(e->count, sizeof *p->kernels);
                if (e->count && !p->kernels) goto nomem;
                p->n_kernels = (int64_t)e->count;
                for (uint64_t k = 0; k < e->count; k++) {
                    const uint8_t *q = r + k * e->elem_bytes;
                    p->kernels[k].name = ld32(q + 0);
                    p->kernels[k].arch = ld32(q + 4);
                    p->kernels[k].offset = ld64(q + 8);
                    p->kernels[k].bytes = ld64(q + 16);
                }
            }
            continue;
        }
        int kind = section_of(e->id);
        if (kind < 0) continue; /* a later addition: skip */
        if (cur.kind == S__COUNT) CORRUPT("section %" PRIu32 " %s after the last stage", i, LABEL);
        uint32_t want_stage = cur.stage < 0 ? NO_INDEX : (uint32_t)cur.stage;
        uint32_t want_chunk = cur.chunk < 0 ? NO_INDEX : (uint32_t)cur.chunk;
        if (kind != cur.kind || e->stage != want_stage || e->chunk != want_chunk)
            CORRUPT("section %" PRIu32 " is %s, expected %s", i, LABEL,
                    cursor_label(&cur, lab2, sizeof lab2));
        if (e->elem_bytes < sections[kind].bytes || (kind == S_STRS && e->elem_bytes != 1))
            CORRUPT("section %" PRIu32 " %s: records of %" PRIu32
                    " bytes, this reader needs %" PRIu32,
                    i, LABEL, e->elem_bytes, sections[kind].bytes);
        const uint8_t *r = buf + e->offset;
        uint64_t cnt = e->count, sz = e->elem_bytes;
        uint32_t left = n_sec - i - 1; /* entries after this one */
        mgc_stage_program *st = cur.stage >= 0 ? &p->stages[cur.stage] : NULL;
        mgc_plan_chunk *ch = st && cur.chunk >= 0 ? &st->chunks[cur.chunk] : NULL;
        switch (kind) {
        case S_GRID:
            if (cnt != 1) CORRUPT("section %s holds %" PRIu64 " records, not 1", LABEL, cnt);
            get_grid(r, p);
            /* each stage needs 4 more sections: no allocation beyond the file */
            if (p->n_stages < 0 || p->n_stages > left / 4)
                CORRUPT("%" PRId64 " stages but %" PRIu32 " sections follow", p->n_stages, left);
            p->stages = alloc_records((uint64_t)p->n_stages, sizeof *p->stages);
            if (p->n_stages && !p->stages) goto nomem;
            break;
        case S_CONF:
            p->config = alloc_records(cnt, sizeof *p->config);
            if (cnt && !p->config) goto nomem;
            p->n_config = (int64_t)cnt;
            for (uint64_t k = 0; k < cnt; k++)
                get_kv(r + k * sz, &p->config[k]);
            break;
        case S_STRS:
            if (cnt) {
                p->strings = malloc((size_t)cnt);
                if (!p->strings) goto nomem;
                memcpy(p->strings, r, (size_t)cnt);
            }
            p->strings_len = p->strings_cap = cnt;
            break;
        case S_STAG:
            if (cnt != 1) CORRUPT("section %s holds %" PRIu64 " records, not 1", LABEL, cnt);
            get_stage(r, st);
            /* each chunk needs 4 more sections */
            if (st->n_chunks < 0 || st->n_chunks > left / 4)
                CORRUPT("%s: %" PRId64 " chunks but %" PRIu32 " sections follow", LABEL,
                        st->n_chunks, left);
            {
                int64_t n_chunks = st->n_chunks; /* counts are set once arrays exist (for free) */
                st->n_chunks = 0;
                st->chunks = alloc_records((uint64_t)n_chunks, sizeof *st->chunks);
                if (n_chunks && !st->chunks) goto nomem;
                st->n_chunks = n_chunks;
            }
            break;
        case S_INST:
            st->instrs = alloc_records(cnt, sizeof *st->instrs);
            if (cnt && !st->instrs) goto nomem;
            st->n_instrs = (int64_t)cnt;
            for (uint64_t k = 0; k < cnt; k++)
                get_instr(r + k * sz, &st->instrs[k]);
            break;
        case S_BUFS:
            st->buffers = alloc_records(cnt, sizeof *st->buffers);
            if (cnt && !st->buffers) goto nomem;
            st->n_buffers = (int64_t)cnt;
            for (uint64_t k = 0; k < cnt; k++)
                get_buffer(r + k * sz, &st->buffers[k]);
            break;
        case S_BCKT:
            st->buckets = alloc_records(cnt, sizeof *st->buckets);
            if (cnt && !st->buckets) goto nomem;
            st->n_buckets = (int64_t)cnt;
            for (uint64_t k = 0; k < cnt; k++)
                get_bucket(r + k * sz, &st->buckets[k]);
            break;
        case S_CHNK:
            if (cnt != 1) CORRUPT("section %s holds %" PRIu64 " records, not 1", LABEL, cnt);
            get_chunk(r, ch);
            break;
        case S_TENS:
            ch->tensors = alloc_records(cnt, sizeof *ch->tensors);
            if (cnt && !ch->tensors) goto nomem;
            ch->n_tensors = (int64_t)cnt;
            for (uint64_t k = 0; k < cnt; k++)
                get_tensor(r + k * sz, &ch->tensors[k]);
            break;
        case S_FWDO:
        case S_BWDO: {
            mgc_plan_op *ops = alloc_records(cnt, sizeof *ops);
            if (cnt && !ops) goto nomem;
            for (uint64_t k = 0; k < cnt; k++)
                get_op(r + k * sz, &ops[k]);
            if (kind == S_FWDO) {
                ch->fwd = ops;
                ch->n_fwd = (int64_t)cnt;
            } else {
                ch->bwd = ops;
                ch->n_bwd = (int64_t)cnt;
            }
            break;
        }
        default:
            break;
        }
        advance(&cur, p);
    }
    if (cur.kind != S__COUNT) CORRUPT("section %s missing", cursor_label(&cur, lab2, sizeof lab2));

    char why[256];
    if (mgc_plan_validate(p, why, sizeof why)) {
        set_err(
            err, errsz,
            "%s: inconsistent plan: %s (its checksums match, so the writer made it: recompile with "
            "mgc compile, and report the bug if it persists)",
            name, why);
        rc = MGC_PLAN_ERR_FORMAT;
        goto fail;
    }
    free(dir);
    *out = p;
    return MGC_PLAN_OK;
nomem:
    set_err(err, errsz, "%s: out of memory reading the plan", name);
    rc = MGC_PLAN_ERR_NOMEM;
fail:
    free(dir);
    mgc_plan_free(p);
    return rc;
}

/* ---- files ---------------------------------------------------------------- */

/* Write all of buf to fd, through short writes and EINTR; 0 or -1 (errno). */
static int write_all(int fd, const uint8_t *buf, size_t len) {
    while (len) {
        ssize_t w = write(fd, buf, len);
        if (w < 0) {
            if (errno == EINTR) continue;
            return -1;
        }
        buf += w;
        len -= (size_t)w;
    }
    return 0;
}

/* fsync the directory holding path, so the rename survives a crash.  Best
 * effort: some file systems refuse fsync on directories. */
static void sync_parent(const char *path) {
    const char *slash = strrchr(path, '/');
    char *dir = NULL;
    if (!slash) {
        dir = strdup(".");
    } else {
        size_t n = slash == path ? 1 : (size_t)(slash - path);
        dir = malloc(n + 1);
        if (dir) {
            memcpy(dir, path, n);
            dir[n] = 0;
        }
    }
    if (!dir) return;
    int fd = open(dir, O_RDONLY);
    if (fd >= 0) {
        (void)fsync(fd);
        close(fd);
    }
    free(dir);
}

mgc_plan_status mgc_plan_write(const mgc_plan *p, const char *path, char *err, size_t errsz) {
    uint8_t *buf = NULL;
    size_t len = 0;
    char *tmp = NULL;
    int fd = -1;
    char why[512];
    mgc_plan_status rc;
    if (!path) {
        set_err(err, errsz, "mgc_plan_write: no path");
        return MGC_PLAN_ERR_IO;
    }
    rc = mgc_plan_encode(p, &buf, &len, why, sizeof why);
    if (rc) {
        set_err(err, errsz, "%s: cannot write plan: %s", path, why);
        return rc;
    }
    if (mgc_path_is_special(path)) {
        /* /dev/null, a pipe: written in place (a rename would replace it) */
        fd = open(path, O_WRONLY | O_CLOEXEC);
        int bad = fd < 0 || write_all(fd, buf, len);
        int e = errno;
        if (fd >= 0 && close(fd)) bad = 1, e = errno;
        fd = -1;
        free(buf);
        if (bad) {
            set_err(err, errsz, "%s: cannot write plan: %s", path, strerror(e));
            return MGC_PLAN_ERR_IO;
        }
        return MGC_PLAN_OK;
    }
    size_t tn = strlen(path) + 32;
    tmp = malloc(tn);
    if (!tmp) {
        set_err(err, errsz, "%s: cannot write plan: out of memory", path);
        rc = MGC_PLAN_ERR_NOMEM;
        goto fail;
    }
    snprintf(tmp, tn, "%s.tmp.%ld", path, (long)getpid());
    fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0666);
    if (fd < 0) {
        set_err(err, errsz,
                "%s: cannot write plan: cannot create %s: %s (check the directory exists and is "
                "writable)",
                path, tmp, strerror(errno));
        rc = MGC_PLAN_ERR_IO;
        goto fail;
    }
    if (write_all(fd, buf, len) || fsync(fd)) {
        set_err(err, errsz, "%s: cannot write plan: %s: %s (check free space and quotas)", path,
                tmp, strerror(errno));
        rc = MGC_PLAN_ERR_IO;
        goto fail_unlink;
    }
    int cfd = fd;
    fd = -1;
    if (close(cfd)) {
        set_err(err, errsz, "%s: cannot write plan: closing %s: %s (check free space and quotas)",
                path, tmp, strerror(errno));
        rc = MGC_PLAN_ERR_IO;
        goto fail_unlink;
    }
    if (rename(tmp, path)) {
        set_err(err, errsz, "%s: cannot write plan: renaming %s over it: %s", path, tmp,
                strerror(errno));
        rc = MGC_PLAN_ERR_IO;
        goto fail_unlink;
    }
    sync_parent(path);
    free(tmp);
    free(buf);
    return MGC_PLAN_OK;
fail_unlink:
    if (fd >= 0) close(fd);
    fd = -1;
    unlink(tmp);
fail:
    if (fd >= 0) close(fd);
    free(tmp);
    free(buf);
    return rc;
}

mgc_plan_status mgc_plan_read(const char *path, mgc_plan **out, char *err, size_t errsz) {
    if (out) *out = NULL;
    if (!path || !out) {
        set_err(err, errsz, "mgc_plan_read: no path or output pointer");
        return MGC_PLAN_ERR_IO;
    }
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        set_err(err, errsz, "%s: cannot open plan: %s (write it with mgc compile)", path,
                strerror(errno));
        return MGC_PLAN_ERR_IO;
    }
    struct stat sb;
    if (fstat(fd, &sb)) {
        set_err(err, errsz, "%s: cannot read plan: %s", path, strerror(errno));
        close(fd);
        return MGC_PLAN_ERR_IO;
    }
    if (!S_ISREG(sb.st_mode)) {
        set_err(err, errsz,
                "%s: cannot read plan: not a regular file (pass the plan file mgc compile wrote)",
                path);
        close(fd);
        return MGC_PLAN_ERR_IO;
    }
    if ((uint64_t)sb.st_size > SIZE_MAX - 1) {
        set_err(err, errsz, "%s: cannot read plan: %lld bytes do not fit in memory", path,
                (long long)sb.st_size);
        close(fd);
        return MGC_PLAN_ERR_NOMEM;
    }
    size_t cap = (size_t)sb.st_size, len = 0;
    uint8_t *buf = malloc(cap ? cap : 1);
    if (!buf) {
        set_err(err, errsz, "%s: cannot read plan: out of memory for %zu bytes", path, cap);
        close(fd);
        return MGC_PLAN_ERR_NOMEM;
    }
    while (len < cap) {
        ssize_t r = read(fd, buf + len, cap - len);
        if (r < 0) {
            if (errno == EINTR) continue;
            set_err(err, errsz, "%s: cannot read plan: %s", path, strerror(errno));
            free(buf);
            close(fd);
            return MGC_PLAN_ERR_IO;
        }
        if (r == 0) break; /* shrank while reading: decode reports the truncation */
        len += (size_t)r;
    }
    close(fd);
    mgc_plan_status rc = mgc_plan_decode(buf, len, path, out, err, errsz);
    free(buf);
    return rc;
}
