/* test_plan.c - the plan structure and its file format (plan/plan.c,
 * plan/plan_io.c, plan/crc32c.c): random plans through encode/decode and
 * write/read compared field by field; every single-byte corruption and every
 * truncation rejected; version, magic, hostile counts and indices in files
 * with valid checksums (rebuilt here from docs/plan-format.md); validation
 * rules one by one; the atomic write. */
#include "crc32c.h"
#include "plan.h"
#include "testlib.h"

#include <dirent.h>
#include <errno.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

/* ---- random values ------------------------------------------------------ */

static uint64_t rng = 0x9e3779b97f4a7c15u;

static uint64_t rnd(void) { /* xorshift64* */
    rng ^= rng >> 12;
    rng ^= rng << 25;
    rng ^= rng >> 27;
    return rng * 2685821657736338717u;
}
static int64_t rnd_in(int64_t lo, int64_t hi) { /* inclusive */
    return lo + (int64_t)(rnd() % (uint64_t)(hi - lo + 1));
}
static uint64_t rnd_nz(void) {
    uint64_t v;
    while ((v = rnd()) == 0) {
    }
    return v;
}
static double rnd_double(void) { /* non-zero, both signs, wide exponents */
    double m = (double)((rnd() >> 11) | 1) / 9007199254740992.0;
    int e = (int)rnd_in(-60, 60);
    return (rnd() & 1 ? -1 : 1) * ldexp(m + 0.5, e);
}

/* ---- a random valid plan -------------------------------------------------- */

static uint32_t name_of(mgc_plan *p, const char *fmt, int64_t a, int64_t b, int64_t c) {
    char s[96];
    snprintf(s, sizeof s, fmt, a, b, c);
    uint32_t off = mgc_plan_str(p, s);
    T_CHECK(off != UINT32_MAX);
    return off;
}

static uint16_t fwd_kind(void) {
    return rnd() % 4 == 0 ? (uint16_t)rnd_in(MGC_POP_ALL_REDUCE, MGC_POP__END - 1)
                          : (uint16_t)rnd_in(MGC_POP_EMBEDDING, MGC_POP_CROSS_ENTROPY);
}

static void random_op(mgc_plan *p, mgc_plan_op *o, int64_t n_tensors, int bwd, int64_t s,
                      int64_t i) {
    if (!bwd)
        o->kind = fwd_kind();
    else if (rnd() % 4 == 0)
        o->kind = fwd_kind(); /* recompute or collective */
    else
        o->kind = (uint16_t)rnd_in(MGC_POP_EMBEDDING_BWD, MGC_POP_CROSS_ENTROPY_BWD);
    o->flags = (uint16_t)rnd_in(0, 3);
    if (bwd && o->kind <= MGC_POP_LAST_FWD) o->flags |= MGC_POF_RECOMPUTE;
    o->layer = (int32_t)rnd_in(-1, 100000);
    o->name =
        name_of(p, "layers.%lld.op%lld.%lld", (long long)s, (long long)i, (long long)rnd_in(0, 3));
    o->n_in = (uint16_t)rnd_in(0, MGC_PLAN_MAX_IO);
    o->n_out = (uint16_t)rnd_in(0, MGC_PLAN_MAX_IO);
    for (int k = 0; k < MGC_PLAN_MAX_IO; k++) { /* unused slots carry noise: they must round-trip */
        o->in[k] = k < o->n_in ? (int32_t)rnd_in(0, n_tensors - 1) : (int32_t)rnd();
        o->out[k] = k < o->n_out ? (int32_t)rnd_in(0, n_tensors - 1) : (int32_t)rnd();
    }
    o->group = (uint16_t)rnd_in(0, MGC_GROUP__COUNT - 1);
    o->seq = (uint32_t)rnd_nz();
    for (int k = 0; k < 4; k++) {
        o->fattr[k] = rnd_double();
        o->iattr[k] = (int64_t)rnd_nz();
    }
    /* attention's sliding window is a whole number of keys (iattr[0], causal, is non-zero) */
    if (o->kind == MGC_POP_ATTENTION || o->kind == MGC_POP_ATTENTION_BWD) o->fattr[2] = (double)rnd_in(0, 4096);
    o->flops = rnd_nz();
}

/* Random gradient buckets for stage st: one per REDUCE_GRADS, in reverse
 * element order inside buffers 0 (GRAD) and 1 (WEIGHT); without room, the
 * bucket instructions become OPTIMIZER. */
static void random_buckets(const mgc_plan *p, mgc_stage_program *st) {
    int64_t nr = 0;
    for (int64_t i = 0; i < st->n_instrs; i++)
        nr += st->instrs[i].op == MGC_I_REDUCE_GRADS;
    uint64_t wsz = rnd() % 2 ? 2 : 4, unit = 128 * 8, need = (uint64_t)nr * 5 * unit;
    if (nr && (st->n_buffers < 2 || st->buffers[0].bytes < need * 4 ||
               st->buffers[1].bytes < need * wsz))
        nr = 0;
    for (int64_t i = 0; i < st->n_instrs; i++) {
        mgc_instr *in = &st->instrs[i];
        if (in->op != MGC_I_REDUCE_GRADS && in->op != MGC_I_GATHER_PARAMS) continue;
        if (!nr)
            in->op = MGC_I_OPTIMIZER;
        else
            in->arg = (uint32_t)rnd_in(0, nr - 1);
    }
    st->n_buckets = nr;
    if (!nr) return;
    st->buffers[0].kind = MGC_BUF_GRAD;
    st->buffers[1].kind = MGC_BUF_WEIGHT;
    st->buckets = calloc((size_t)nr, sizeof *st->buckets);
    uint64_t at = (uint64_t)rnd_in(0, 3) * unit;
    for (int64_t k = nr - 1; k >= 0; k--) { /* ascending elements, descending index */
        mgc_bucket *b = &st->buckets[k];
        b->group = rnd() % 2 ? MGC_GROUP_DPCP : MGC_GROUP_EDP;
        b->chunk = (uint16_t)rnd_in(0, st->n_chunks - 1);
        b->shards = !p->distributed_optimizer ? 1
                    : b->group == MGC_GROUP_DPCP ? p->grid.dp * p->grid.cp
                                                 : p->grid.edp;
        b->begin = at;
        b->count = (uint64_t)rnd_in(1, 4) * 128 * (uint64_t)b->shards;
        at += b->count + (uint64_t)rnd_in(0, 1) * 128;
        b->grad_buffer = 0;
        b->weight_buffer = 1;
        b->grad_offset = b->begin * 4;
        b->grad_bytes = b->count * 4;
        b->weight_offset = b->begin * wsz;
        b->weight_bytes = b->count * wsz;
    }
}

/* Stage s gets exactly two buckets (bf16, shards 1; call with the
 * distributed optimizer off or dp*cp = edp = 1) over two new buffers, GRAD
 * and WEIGHT, and two REDUCE_GRADS at the end of its stream. */
static void fixed_buckets(mgc_plan *p, int64_t s) {
    mgc_stage_program *st = &p->stages[s];
    for (int64_t i = 0; i < st->n_instrs; i++)
        if (st->instrs[i].op == MGC_I_REDUCE_GRADS || st->instrs[i].op == MGC_I_GATHER_PARAMS)
            st->instrs[i].op = MGC_I_OPTIMIZER, st->instrs[i].arg = 0;
    st->instrs = realloc(st->instrs, (size_t)(st->n_instrs + 2) * sizeof *st->instrs);
    for (int k = 0; k < 2; k++)
        st->instrs[st->n_instrs++] = (mgc_instr){MGC_I_REDUCE_GRADS, 0, -1, -1, (uint32_t)k, 0};
    st->buffers = realloc(st->buffers, (size_t)(st->n_buffers + 2) * sizeof *st->buffers);
    uint64_t at = (st->arena_bytes + MGC_PLAN_ALIGN - 1) / MGC_PLAN_ALIGN * MGC_PLAN_ALIGN;
    for (int k = 0; k < 2; k++) {
        mgc_buffer *b = &st->buffers[st->n_buffers + k];
        memset(b, 0, sizeof *b);
        b->kind = k ? MGC_BUF_WEIGHT : MGC_BUF_GRAD;
        b->chunk = 0xffffu;
        b->mb = -1;
        b->bytes = 1024 * (k ? 2 : 4);
        b->offset = at;
        b->live_end = st->n_instrs;
        at += b->bytes;
    }
    st->arena_bytes = at;
    free(st->buckets);
    st->buckets = calloc(2, sizeof *st->buckets);
    st->n_buckets = 2;
    for (int k = 0; k < 2; k++) { /* bucket 0: elements [512, 1024), bucket 1: [0, 512) */
        mgc_bucket *b = &st->buckets[k];
        b->group = k ? MGC_GROUP_DPCP : MGC_GROUP_EDP;
        b->shards = 1;
        b->begin = k ? 0 : 512;
        b->count = 512;
        b->grad_buffer = (int32_t)st->n_buffers;
        b->weight_buffer = (int32_t)st->n_buffers + 1;
        b->grad_offset = b->begin * 4;
        b->grad_bytes = b->count * 4;
        b->weight_offset = b->begin * 2;
        b->weight_bytes = b->count * 2;
    }
    st->n_buffers += 2;
}

/* A plan on grid g with up to `scale` of each list per stage/chunk. */
static mgc_plan *random_plan(mgc_grid g, int64_t scale) {
    mgc_plan *p = mgc_plan_new();
    p->grid = g;
    p->num_microbatches = rnd_in(1, 64);
    p->micro_batch_size = rnd_in(1, 16);
    p->seq_length = rnd_in(1, 1 << 20);
    p->schedule = (int32_t)rnd_in(0, 2);
    p->recompute = (int32_t)rnd_in(0, 2);
    p->distributed_optimizer = (int32_t)rnd_in(0, 1);
    p->bubble_fraction = (double)rnd_in(1, 1000) / 1001.0;
    p->model_flops_per_iter = fabs(rnd_double()) * 1e18;
    p->n_config = rnd_in(3, 3 * scale);
    p->config = calloc((size_t)p->n_config, sizeof *p->config);
    for (int64_t i = 0; i < p->n_config; i++) {
        mgc_plan_kv *kv = &p->config[i];
        kv->key = name_of(p, "section%lld.key%lld%.0lld", (long long)(i % 5), (long long)i, 0);
        kv->type = (uint16_t)(i % 3);
        kv->i = (int64_t)rnd_nz();
        kv->f = rnd_double();
        kv->s = kv->type == 2 ? name_of(p, "value %lld of %lld%.0lld", (long long)i,
                                        (long long)p->n_config, 0)
                              : (uint32_t)rnd_in(0, 5);
    }
    p->n_stages = g.pp;
    p->stages = calloc((size_t)g.pp, sizeof *p->stages);
    for (int64_t s = 0; s < g.pp; s++) {
        mgc_stage_program *st = &p->stages[s];
        st->pp_rank = s;
        st->n_chunks = g.vp;
        st->chunks = calloc((size_t)g.vp, sizeof *st->chunks);
        st->n_instrs = rnd_in(1, 4 * scale);
        st->instrs = calloc((size_t)st->n_instrs, sizeof *st->instrs);
        st->n_buffers = rnd_in(1, scale);
        st->buffers = calloc((size_t)st->n_buffers, sizeof *st->buffers);
        uint64_t at = 0;
        for (int64_t i = 0; i < st->n_buffers; i++) {
            mgc_buffer *b = &st->buffers[i];
            b->name = name_of(p, "stage%lld.buf%lld%.0lld", (long long)s, (long long)i, 0);
            b->kind = (uint16_t)rnd_in(0, MGC_BUF__COUNT - 1);
            b->chunk = rnd() % 3 == 0 ? 0xffffu : (uint16_t)rnd_in(0, g.vp - 1);
            b->mb = (int32_t)rnd_in(-1, p->num_microbatches - 1);
            b->bytes = (uint64_t)rnd_in(1, 1 << 22);
            at = (at + MGC_PLAN_ALIGN - 1) / MGC_PLAN_ALIGN * MGC_PLAN_ALIGN;
            b->offset = at;
            at += b->bytes;
            b->live_begin = rnd_in(0, st->n_instrs);
            b->live_end = rnd_in(b->live_begin, st->n_instrs);
        }
        st->arena_bytes = at + (uint64_t)rnd_in(0, 4096);
        for (int k = 0; k < MGC_BUF__COUNT; k++)
            st->by_kind[k] = rnd_nz();
        st->max_in_flight = rnd_in(1, 64);
        for (int64_t i = 0; i < st->n_instrs; i++) {
            mgc_instr *in = &st->instrs[i];
            do
                in->op = (uint16_t)rnd_in(0, MGC_I__COUNT - 1);
            while (g.pp == 1 && in->op >= MGC_I_SEND_ACT && in->op <= MGC_I_RECV_GRAD);
            in->chunk = (uint16_t)rnd_in(0, g.vp - 1);
            int per_mb = in->op <= MGC_I_RECV_GRAD;
            in->mb = (int32_t)rnd_in(per_mb ? 0 : -1, p->num_microbatches - 1);
            if (in->op >= MGC_I_SEND_ACT && in->op <= MGC_I_RECV_GRAD) {
                do
                    in->peer = (int32_t)rnd_in(0, g.pp - 1);
                while (in->peer == s);
            } else {
                in->peer = -1;
            }
            in->arg = (uint32_t)rnd_nz();
            in->seq = rnd_nz();
        }
        random_buckets(p, st);
        for (int64_t c = 0; c < g.vp; c++) {
            mgc_plan_chunk *ch = &st->chunks[c];
            ch->first_layer = (int32_t)rnd_in(0, 1000);
            ch->num_layers = (int32_t)rnd_in(1, 100);
            ch->embedding = (uint8_t)rnd_in(0, 1);
            ch->loss = (uint8_t)rnd_in(0, 1);
            ch->stash_bytes = rnd_nz();
            ch->send_bytes = rnd_nz();
            ch->n_tensors = rnd_in(1, 2 * scale);
            ch->tensors = calloc((size_t)ch->n_tensors, sizeof *ch->tensors);
            for (int64_t i = 0; i < ch->n_tensors; i++) {
                mgc_plan_tensor *t = &ch->tensors[i];
                t->name = name_of(p, "stage%lld.chunk%lld.t%lld", (long long)s, (long long)c,
                                  (long long)i);
                t->dtype = (uint16_t)rnd_in(0, MGC_DT__COUNT - 1);
                t->rank = (uint16_t)rnd_in(0, MGC_PLAN_MAX_RANK);
                uint64_t elems = 1;
                for (int d = 0; d < MGC_PLAN_MAX_RANK; d++) {
                    t->dim[d] = d < t->rank ? rnd_in(1, 64) : 0;
                    if (d < t->rank) elems *= (uint64_t)t->dim[d];
                }
                t->bytes = elems * mgc_dtype_size((mgc_dtype)t->dtype);
                t->role = (uint16_t)rnd_in(0, MGC_TR_WORKSPACE);
                t->split_axis =
                    t->rank && rnd() % 2 ? (uint16_t)rnd_in(0, t->rank - 1) : MGC_PLAN_NO_SPLIT;
                t->split_group = (uint16_t)rnd_in(0, MGC_GROUP__COUNT - 1);
                t->split2_axis = MGC_PLAN_NO_SPLIT, t->split2_group = MGC_GROUP__COUNT;
                if (t->rank > 1 && rnd() % 2) { /* a second split on another dim */
                    t->split2_axis = (uint16_t)rnd_in(0, t->rank - 1);
                    if (t->split2_axis == t->split_axis)
                        t->split2_axis = (uint16_t)((t->split2_axis + 1) % t->rank);
                    t->split2_group = (uint16_t)rnd_in(0, MGC_GROUP__COUNT - 1);
                }
                t->buffer = (int32_t)rnd_in(-1, st->n_buffers - 1);
                if (t->buffer >= 0 && st->buffers[t->buffer].bytes >= t->bytes)
                    t->offset =
                        (uint64_t)rnd_in(0, (int64_t)(st->buffers[t->buffer].bytes - t->bytes));
                else
                    t->buffer = -1, t->offset = rnd_nz();
            }
            ch->n_fwd = rnd_in(1, 2 * scale);
            ch->fwd = calloc((size_t)ch->n_fwd, sizeof *ch->fwd);
            for (int64_t i = 0; i < ch->n_fwd; i++)
                random_op(p, &ch->fwd[i], ch->n_tensors, 0, s, i);
            ch->n_bwd = rnd_in(1, 2 * scale);
            ch->bwd = calloc((size_t)ch->n_bwd, sizeof *ch->bwd);
            for (int64_t i = 0; i < ch->n_bwd; i++)
                random_op(p, &ch->bwd[i], ch->n_tensors, 1, s, i);
        }
    }
    return p;
}

/* ---- field-by-field comparison -------------------------------------------- */

static int diffs;
#define SAME(a, b)                                                                                 \
    do {                                                                                           \
        if ((a) != (b)) {                                                                          \
            if (diffs++ < 5) fprintf(stderr, "%s:%d: %s differs\n", __FILE__, __LINE__, #a);       \
        }                                                                                          \
    } while (0)
#define SAME_F(a, b)                                                                               \
    do {                                                                                           \
        double fa_ = (a), fb_ = (b);                                                               \
        if (memcmp(&fa_, &fb_, sizeof fa_) != 0) {                                                 \
            if (diffs++ < 5) fprintf(stderr, "%s:%d: %s differs\n", __FILE__, __LINE__, #a);       \
        }                                                                                          \
    } while (0)

static void compare_op(const mgc_plan_op *a, const mgc_plan_op *b) {
    SAME(a->kind, b->kind);
    SAME(a->flags, b->flags);
    SAME(a->layer, b->layer);
    SAME(a->name, b->name);
    SAME(a->n_in, b->n_in);
    SAME(a->n_out, b->n_out);
    for (int k = 0; k < MGC_PLAN_MAX_IO; k++) {
        SAME(a->in[k], b->in[k]);
        SAME(a->out[k], b->out[k]);
    }
    SAME(a->group, b->group);
    SAME(b->pad_, 0);
    SAME(a->seq, b->seq);
    for (int k = 0; k < 4; k++) {
        SAME_F(a->fattr[k], b->fattr[k]);
        SAME(a->iattr[k], b->iattr[k]);
    }
    SAME(a->flops, b->flops);
}

/* 0 when b equals a in every field (padding fields of b zero). */
static int compare_plans(const mgc_plan *a, const mgc_plan *b) {
    diffs = 0;
    SAME(a->grid.world, b->grid.world);
    SAME(a->grid.tp, b->grid.tp);
    SAME(a->grid.cp, b->grid.cp);
    SAME(a->grid.dp, b->grid.dp);
    SAME(a->grid.pp, b->grid.pp);
    SAME(a->grid.vp, b->grid.vp);
    SAME(a->grid.etp, b->grid.etp);
    SAME(a->grid.ep, b->grid.ep);
    SAME(a->grid.edp, b->grid.edp);
    SAME(a->num_microbatches, b->num_microbatches);
    SAME(a->micro_batch_size, b->micro_batch_size);
    SAME(a->seq_length, b->seq_length);
    SAME(a->schedule, b->schedule);
    SAME(a->recompute, b->recompute);
    SAME(a->distributed_optimizer, b->distributed_optimizer);
    SAME(b->pad_, 0);
    SAME_F(a->bubble_fraction, b->bubble_fraction);
    SAME_F(a->model_flops_per_iter, b->model_flops_per_iter);
    SAME(a->n_config, b->n_config);
    for (int64_t i = 0; i < a->n_config && i < b->n_config; i++) {
        const mgc_plan_kv *x = &a->config[i], *y = &b->config[i];
        SAME(x->key, y->key);
        SAME(x->type, y->type);
        SAME(x->i, y->i);
        SAME_F(x->f, y->f);
        SAME(x->s, y->s);
        SAME(y->pad_, 0);
        SAME(y->pad2_, 0);
    }
    SAME(a->strings_len, b->strings_len);
    if (a->strings_len == b->strings_len && a->strings_len)
        SAME(memcmp(a->strings, b->strings, a->strings_len), 0);
    SAME(a->n_stages, b->n_stages);
    for (int64_t s = 0; s < a->n_stages && s < b->n_stages; s++) {
        const mgc_stage_program *x = &a->stages[s], *y = &b->stages[s];
        SAME(x->pp_rank, y->pp_rank);
        SAME(x->arena_bytes, y->arena_bytes);
        for (int k = 0; k < MGC_BUF__COUNT; k++)
            SAME(x->by_kind[k], y->by_kind[k]);
        SAME(x->max_in_flight, y->max_in_flight);
        SAME(x->n_instrs, y->n_instrs);
        for (int64_t i = 0; i < x->n_instrs && i < y->n_instrs; i++) {
            const mgc_instr *u = &x->instrs[i], *v = &y->instrs[i];
            SAME(u->op, v->op);
            SAME(u->chunk, v->chunk);
            SAME(u->mb, v->mb);
            SAME(u->peer, v->peer);
            SAME(u->arg, v->arg);
            SAME(u->seq, v->seq);
        }
        SAME(x->n_buckets, y->n_buckets);
        for (int64_t i = 0; i < x->n_buckets && i < y->n_buckets; i++) {
            const mgc_bucket *u = &x->buckets[i], *v = &y->buckets[i];
            SAME(u->group, v->group);
            SAME(u->chunk, v->chunk);
            SAME(v->pad_, 0);
            SAME(u->shards, v->shards);
            SAME(u->begin, v->begin);
            SAME(u->count, v->count);
            SAME(u->grad_buffer, v->grad_buffer);
            SAME(u->weight_buffer, v->weight_buffer);
            SAME(u->grad_offset, v->grad_offset);
            SAME(u->grad_bytes, v->grad_bytes);
            SAME(u->weight_offset, v->weight_offset);
            SAME(u->weight_bytes, v->weight_bytes);
        }
        SAME(x->n_buffers, y->n_buffers);
        for (int64_t i = 0; i < x->n_buffers && i < y->n_buffers; i++) {
            const mgc_buffer *u = &x->buffers[i], *v = &y->buffers[i];
            SAME(u->name, v->name);
            SAME(u->kind, v->kind);
            SAME(u->chunk, v->chunk);
            SAME(u->mb, v->mb);
            SAME(v->pad_, 0);
            SAME(u->bytes, v->bytes);
            SAME(u->offset, v->offset);
            SAME(u->live_begin, v->live_begin);
            SAME(u->live_end, v->live_end);
        }
        SAME(x->n_chunks, y->n_chunks);
        for (int64_t c = 0; c < x->n_chunks && c < y->n_chunks; c++) {
            const mgc_plan_chunk *u = &x->chunks[c], *v = &y->chunks[c];
            SAME(u->first_layer, v->first_layer);
            SAME(u->num_layers, v->num_layers);
            SAME(u->embedding, v->embedding);
            SAME(u->loss, v->loss);
            SAME(v->pad_[0] | v->pad_[1], 0);
            SAME(u->stash_bytes, v->stash_bytes);
            SAME(u->send_bytes, v->send_bytes);
            SAME(u->n_tensors, v->n_tensors);
            for (int64_t i = 0; i < u->n_tensors && i < v->n_tensors; i++) {
                const mgc_plan_tensor *t = &u->tensors[i], *w = &v->tensors[i];
                SAME(t->name, w->name);
                SAME(t->dtype, w->dtype);
                SAME(t->rank, w->rank);
                for (int d = 0; d < MGC_PLAN_MAX_RANK; d++)
                    SAME(t->dim[d], w->dim[d]);
                SAME(t->role, w->role);
                SAME(t->split_axis, w->split_axis);
                SAME(t->split_group, w->split_group);
                SAME(t->split2_axis, w->split2_axis);
                SAME(t->split2_group, w->split2_group);
                SAME(t->flags, w->flags);
                SAME(t->buffer, w->buffer);
                SAME(t->offset, w->offset);
                SAME(t->bytes, w->bytes);
            }
            SAME(u->n_fwd, v->n_fwd);
            for (int64_t i = 0; i < u->n_fwd && i < v->n_fwd; i++)
                compare_op(&u->fwd[i], &v->fwd[i]);
            SAME(u->n_bwd, v->n_bwd);
            for (int64_t i = 0; i < u->n_bwd && i < v->n_bwd; i++)
                compare_op(&u->bwd[i], &v->bwd[i]);
        }
    }
    return diffs;
}

/* ---- the file layout, as docs/plan-format.md gives it ---------------------- */

static uint32_t rd32(const uint8_t *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}
static uint64_t rd64(const uint8_t *p) {
    return (uint64_t)rd32(p) | (uint64_t)rd32(p + 4) << 32;
}
static void wr16(uint8_t *p, uint16_t v) {
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
}
static void wr32(uint8_t *p, uint32_t v) {
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}
static void wr64(uint8_t *p, uint64_t v) {
    wr32(p, (uint32_t)v);
    wr32(p + 4, (uint32_t)(v >> 32));
}

/* Directory entry i (48 bytes at 64 + 48 i). */
static uint8_t *entry(uint8_t *buf, uint32_t i) {
    return buf + 64 + 48 * (size_t)i;
}

/* Index of the first section with this fourcc, stage and chunk (-1 = none). */
static int64_t find_section(uint8_t *buf, const char id[4], uint32_t stage, uint32_t chunk) {
    uint32_t n = rd32(buf + 24);
    for (uint32_t i = 0; i < n; i++) {
        uint8_t *e = entry(buf, i);
        if (memcmp(e, id, 4) == 0 && rd32(e + 8) == stage && rd32(e + 12) == chunk) return i;
    }
    return -1;
}

/* Recompute every checksum: each section's, the directory's, the header's
 * (within len bytes, whatever the damaged counts say). */
static void reseal(uint8_t *buf, size_t len) {
    uint64_t n = rd32(buf + 24), file = rd64(buf + 16);
    if (n > (len - 64) / 48) n = (len - 64) / 48;
    if (file > len) file = len;
    for (uint32_t i = 0; i < n; i++) {
        uint8_t *e = entry(buf, i);
        uint64_t off = rd64(e + 16), l = rd64(e + 24);
        if (off <= file && l <= file - off) /* a section made to pass the end keeps its crc */
            wr32(e + 44, mgc_crc32c(0, buf + off, (size_t)l));
    }
    wr32(buf + 32, mgc_crc32c(0, buf + 64, 48 * (size_t)n));
    wr32(buf + 60, mgc_crc32c(0, buf, 60));
}

/* A section as the directory describes it. */
typedef struct sec {
    char id[5];          /* fourcc */
    uint32_t stage;      /* 0xffffffff: plan-wide */
    uint32_t chunk;      /* 0xffffffff: stage-wide */
    uint64_t count;      /* records */
    uint32_t elem;       /* record bytes */
    const uint8_t *data; /* count * elem bytes */
} sec;

static size_t parse_sections(const uint8_t *buf, sec *out, size_t max) {
    uint32_t n = rd32(buf + 24);
    for (uint32_t i = 0; i < n && i < max; i++) {
        const uint8_t *e = buf + 64 + 48 * (size_t)i;
        memcpy(out[i].id, e, 4);
        out[i].id[4] = 0;
        out[i].stage = rd32(e + 8);
        out[i].chunk = rd32(e + 12);
        out[i].count = rd64(e + 32);
        out[i].elem = rd32(e + 40);
        out[i].data = buf + rd64(e + 16);
    }
    return n;
}

/* A v1 file from a list of sections, every field as docs/plan-format.md says. */
static uint8_t *build_file(const sec *s, size_t n, size_t *len) {
    uint64_t pos = 64 + 48 * (uint64_t)n;
    for (size_t i = 0; i < n; i++)
        pos = (pos + s[i].count * s[i].elem + 7) & ~(uint64_t)7;
    uint8_t *b = calloc(1, (size_t)pos);
    memcpy(b, "\x89MGC\r\n\x1a\n", 8);
    wr32(b + 8, MGC_PLAN_VERSION);
    wr64(b + 16, pos);
    wr32(b + 24, (uint32_t)n);
    wr32(b + 28, 48);
    uint64_t at = 64 + 48 * (uint64_t)n;
    for (size_t i = 0; i < n; i++) {
        uint8_t *e = entry(b, (uint32_t)i);
        uint64_t l = s[i].count * s[i].elem;
        memcpy(e, s[i].id, 4);
        wr32(e + 8, s[i].stage);
        wr32(e + 12, s[i].chunk);
        wr64(e + 16, at);
        wr64(e + 24, l);
        wr64(e + 32, s[i].count);
        wr32(e + 40, s[i].elem);
        memcpy(b + at, s[i].data, (size_t)l);
        at = (at + l + 7) & ~(uint64_t)7;
    }
    reseal(b, (size_t)pos);
    *len = (size_t)pos;
    return b;
}

/* Decode must fail with status `want` and a one-line message holding `frag`. */
static void expect_reject(const uint8_t *buf, size_t len, mgc_plan_status want, const char *frag) {
    char err[512] = "";
    mgc_plan *q = (mgc_plan *)(uintptr_t)1;
    mgc_plan_status rc = mgc_plan_decode(buf, len, "x.plan", &q, err, sizeof err);
    T_EQ_I64(rc, want);
    T_CHECK(q == NULL);
    T_CHECK(strncmp(err, "x.plan: ", 8) == 0 && strchr(err, '\n') == NULL);
    if (frag && !strstr(err, frag)) {
        T_CHECK(!"message");
        fprintf(stderr, "  wanted \"%s\" in: %s\n", frag, err);
    }
    mgc_plan_free(rc == MGC_PLAN_OK ? q : NULL);
}

/* A copy of buf[0..len) with `extra` zero bytes after it. */
static uint8_t *dup_buf(const uint8_t *buf, size_t len, size_t extra) {
    uint8_t *c = calloc(1, len + extra);
    memcpy(c, buf, len);
    return c;
}

/* ---- tests ---------------------------------------------------------------- */

static const mgc_grid grid_a = {
    .world = 24, .tp = 2, .cp = 2, .dp = 2, .pp = 3, .vp = 2, .etp = 1, .ep = 4, .edp = 2};
static const mgc_grid grid_small = {
    .world = 2, .tp = 1, .cp = 1, .dp = 1, .pp = 2, .vp = 1, .etp = 1, .ep = 1, .edp = 1};

static void test_crc(void) {
    T_EQ_U64(mgc_crc32c(0, "123456789", 9), 0xe3069283u); /* the standard check value */
    T_EQ_U64(mgc_crc32c(0, "", 0), 0);
    uint8_t zeros[32] = {0};
    T_EQ_U64(mgc_crc32c(0, zeros, 32), 0x8a9136aau); /* RFC 3720 B.4 test vector */
    uint8_t buf[1000];
    for (size_t i = 0; i < sizeof buf; i++)
        buf[i] = (uint8_t)rnd();
    uint32_t bitwise = 0xffffffffu; /* the definition, one bit at a time */
    for (size_t i = 0; i < sizeof buf; i++) {
        bitwise ^= buf[i];
        for (int k = 0; k < 8; k++)
            bitwise = bitwise & 1 ? (bitwise >> 1) ^ 0x82f63b78u : bitwise >> 1;
    }
    T_EQ_U64(mgc_crc32c(0, buf, sizeof buf), ~bitwise);
    T_EQ_U64(mgc_crc32c(mgc_crc32c(0, buf, 123), buf + 123, sizeof buf - 123), ~bitwise);
}

static void test_strings_and_names(void) {
    mgc_plan_free(NULL);
    mgc_plan *p = mgc_plan_new();
    T_STREQ(mgc_plan_strat(p, 0), "");
    T_CHECK(mgc_plan_strat(p, 1) == NULL);
    T_EQ_U64(mgc_plan_str(p, ""), 0);
    T_EQ_U64(mgc_plan_str(p, NULL), 0);
    uint32_t a = mgc_plan_str(p, "model.hidden_size");
    T_CHECK(a != 0 && a != UINT32_MAX);
    T_EQ_U64(mgc_plan_str(p, "model.hidden_size"), a);
    T_STREQ(mgc_plan_strat(p, a), "model.hidden_size");
    uint32_t *offs = malloc(20000 * sizeof *offs);
    char s[32];
    for (int i = 0; i < 20000; i++) { /* grows the table and the index many times */
        snprintf(s, sizeof s, "name.%d", i);
        offs[i] = mgc_plan_str(p, s);
    }
    int ok = 0;
    for (int i = 0; i < 20000; i++) {
        snprintf(s, sizeof s, "name.%d", i);
        ok += mgc_plan_str(p, s) == offs[i] && strcmp(mgc_plan_strat(p, offs[i]), s) == 0;
    }
    T_EQ_I64(ok, 20000);
    T_CHECK(mgc_plan_strat(p, (uint32_t)p->strings_len) == NULL);
    /* a pointer into the table itself (found by libFuzzer: the append moved it) */
    T_EQ_U64(mgc_plan_str(p, mgc_plan_strat(p, a) + 6), a + 6);
    T_STREQ(mgc_plan_strat(p, a + 6), "hidden_size");
    T_CHECK(mgc_plan_str(NULL, "x") == UINT32_MAX);
    free(offs);
    mgc_plan_free(p);

    T_EQ_U64(mgc_dtype_size(MGC_DT_F32), 4);
    T_EQ_U64(mgc_dtype_size(MGC_DT_BF16), 2);
    T_EQ_U64(mgc_dtype_size(MGC_DT_F16), 2);
    T_EQ_U64(mgc_dtype_size(MGC_DT_I64), 8);
    T_EQ_U64(mgc_dtype_size(MGC_DT_I32), 4);
    T_EQ_U64(mgc_dtype_size(MGC_DT_U8), 1);
    T_EQ_U64(mgc_dtype_size(MGC_DT__COUNT), 0);
    T_STREQ(mgc_dtype_name(MGC_DT_BF16), "bf16");
    T_STREQ(mgc_dtype_name((mgc_dtype)-1), "?");
    T_STREQ(mgc_buf_kind_name(MGC_BUF_ADAM_V), "adam_v");
    T_STREQ(mgc_buf_kind_name(MGC_BUF__COUNT), "?");
    for (int k = 0; k < MGC_BUF__COUNT; k++)
        T_CHECK(strcmp(mgc_buf_kind_name((mgc_buf_kind)k), "?") != 0);
    T_STREQ(mgc_plan_op_name(MGC_POP_LINEAR_WGRAD), "linear_wgrad");
    T_STREQ(mgc_plan_op_name(MGC_POP_BROADCAST), "broadcast");
    T_STREQ(mgc_plan_op_name((mgc_plan_op_kind)20), "?");
    T_STREQ(mgc_plan_op_name(MGC_POP__END), "?");
    T_STREQ(mgc_tensor_role_name(MGC_TR_ACT_GRAD), "act_grad");
    T_STREQ(mgc_plan_status_name(MGC_PLAN_ERR_VERSION), "other version");
}

static void test_round_trip(void) {
    static const mgc_grid grids[] = {
        {.world = 24, .tp = 2, .cp = 2, .dp = 2, .pp = 3, .vp = 2, .etp = 1, .ep = 4, .edp = 2},
        {.world = 1, .tp = 1, .cp = 1, .dp = 1, .pp = 1, .vp = 1, .etp = 1, .ep = 1, .edp = 1},
        {.world = 64, .tp = 4, .cp = 1, .dp = 2, .pp = 8, .vp = 3, .etp = 2, .ep = 4, .edp = 1},
    };
    for (size_t gi = 0; gi < sizeof grids / sizeof grids[0]; gi++) {
        for (int rep = 0; rep < 4; rep++) {
            mgc_plan *p = random_plan(grids[gi], 12);
            char err[512] = "";
            T_EQ_I64(mgc_plan_validate(p, err, sizeof err), MGC_PLAN_OK);
            if (err[0]) fprintf(stderr, "validate: %s\n", err);
            uint8_t *buf = NULL;
            size_t len = 0;
            T_EQ_I64(mgc_plan_encode(p, &buf, &len, err, sizeof err), MGC_PLAN_OK);
            T_EQ_U64(len % 8, 0);
            mgc_plan *q = NULL;
            T_EQ_I64(mgc_plan_decode(buf, len, "mem", &q, err, sizeof err), MGC_PLAN_OK);
            T_CHECK(q != NULL);
            if (q) T_EQ_I64(compare_plans(p, q), 0);
            /* canonical: decoding and encoding again gives the same bytes */
            uint8_t *buf2 = NULL;
            size_t len2 = 0;
            if (q) T_EQ_I64(mgc_plan_encode(q, &buf2, &len2, err, sizeof err), MGC_PLAN_OK);
            T_CHECK(len2 == len && buf2 && memcmp(buf, buf2, len) == 0);
            /* the decoded table interns: old strings found, new ones appended */
            if (q) {
                uint32_t k = q->config[0].key;
                char *key = strdup(mgc_plan_strat(q, k));
                T_EQ_U64(mgc_plan_str(q, key), k);
                uint64_t before = q->strings_len;
                uint32_t n = mgc_plan_str(q, "a new string");
                T_EQ_U64(n, before);
                T_STREQ(mgc_plan_strat(q, n), "a new string");
                free(key);
            }
            free(buf2);
            free(buf);
            mgc_plan_free(q);
            mgc_plan_free(p);
        }
    }

    /* the file does not grow with the world: same plan, dp 2 vs dp 4096 */
    mgc_plan *p = random_plan(grid_a, 6);
    uint8_t *b1, *b2;
    size_t l1, l2;
    char err[512];
    p->distributed_optimizer = 0; /* bucket shards stay 1 whatever the grid */
    for (int64_t s = 0; s < p->n_stages; s++)
        for (int64_t i = 0; i < p->stages[s].n_buckets; i++)
            p->stages[s].buckets[i].shards = 1;
    T_EQ_I64(mgc_plan_encode(p, &b1, &l1, err, sizeof err), MGC_PLAN_OK);
    p->grid.dp = 4096;
    p->grid.edp = 4096;
    p->grid.world = 2 * 2 * 4096 * 3;
    T_EQ_I64(mgc_plan_encode(p, &b2, &l2, err, sizeof err), MGC_PLAN_OK);
    T_EQ_U64(l1, l2);
    free(b1);
    free(b2);
    mgc_plan_free(p);
}

static void test_corruption(void) {
    mgc_plan *p = random_plan(grid_small, 2);
    uint8_t *buf;
    size_t len;
    char err[512];
    T_EQ_I64(mgc_plan_encode(p, &buf, &len, err, sizeof err), MGC_PLAN_OK);
    fprintf(stderr, "corruption: %zu-byte plan, every byte flipped three ways, every truncation\n",
            len);

    /* every byte is under a checksum: each single-byte change must fail */
    static const uint8_t masks[] = {0x01, 0x80, 0xff};
    int64_t accepted = 0, bad_msg = 0;
    for (size_t i = 0; i < len; i++) {
        for (size_t m = 0; m < sizeof masks; m++) {
            buf[i] ^= masks[m];
            char e[512] = "";
            mgc_plan *q = NULL;
            mgc_plan_status rc = mgc_plan_decode(buf, len, "x.plan", &q, e, sizeof e);
            if (rc == MGC_PLAN_OK) {
                if (accepted++ < 3)
                    fprintf(stderr, "flip of byte %zu by 0x%02x accepted\n", i, masks[m]);
                mgc_plan_free(q);
            } else if (q || strncmp(e, "x.plan: ", 8) || strchr(e, '\n') ||
                       !(strstr(e, "corrupt") || strstr(e, "not an mgc plan") ||
                         strstr(e, "version") || strstr(e, "truncated"))) {
                if (bad_msg++ < 3) fprintf(stderr, "flip of byte %zu: message: %s\n", i, e);
            }
            buf[i] ^= masks[m];
        }
    }
    T_EQ_I64(accepted, 0);
    T_EQ_I64(bad_msg, 0);

    /* every truncation fails, and says so */
    int64_t trunc_ok = 0;
    for (size_t n = 1; n < len; n++) {
        char e[512] = "";
        mgc_plan *q = NULL;
        trunc_ok += mgc_plan_decode(buf, n, "x.plan", &q, e, sizeof e) == MGC_PLAN_ERR_FORMAT &&
                    !q && strstr(e, "truncated") != NULL;
    }
    T_EQ_I64(trunc_ok, (int64_t)len - 1);
    expect_reject(buf, 0, MGC_PLAN_ERR_FORMAT, "empty file, not an mgc plan");
    uint8_t *longer = dup_buf(buf, len, 8);
    expect_reject(longer, len + 8, MGC_PLAN_ERR_FORMAT, "corrupt plan");
    free(longer);

    /* a denser plan, sampled: one flip every 13 bytes */
    mgc_plan *big = random_plan(grid_a, 8);
    uint8_t *bb;
    size_t bl;
    T_EQ_I64(mgc_plan_encode(big, &bb, &bl, err, sizeof err), MGC_PLAN_OK);
    int64_t big_accepted = 0;
    for (size_t i = 5; i < bl; i += 13) {
        bb[i] ^= (uint8_t)(1u << (i % 8));
        mgc_plan *q = NULL;
        if (mgc_plan_decode(bb, bl, "x.plan", &q, NULL, 0) == MGC_PLAN_OK)
            big_accepted++, mgc_plan_free(q);
        bb[i] ^= (uint8_t)(1u << (i % 8));
    }
    T_EQ_I64(big_accepted, 0);
    free(bb);
    mgc_plan_free(big);
    free(buf);
    mgc_plan_free(p);
}

/* Files with valid checksums but hostile contents. */
static void test_hostile(void) {
    mgc_plan *p = random_plan(grid_small, 3);
    fixed_buckets(p, 0);
    uint8_t *orig;
    size_t len;
    char err[512];
    T_EQ_I64(mgc_plan_encode(p, &orig, &len, err, sizeof err), MGC_PLAN_OK);
    const uint32_t NONE = 0xffffffffu;
    uint8_t *b;

    /* magic, version, flags */
    b = dup_buf(orig, len, 0);
    memcpy(b,
           "\x7f"
           "ELF",
           4);
    expect_reject(b, len, MGC_PLAN_ERR_FORMAT, "not an mgc plan (it starts with 7f 45 4c 46");
    memcpy(b, orig, len);
    wr32(b + 8, 2); /* a version-2 plan (no row pitch: its reserved word could be garbage) */
    reseal(b, len);
    expect_reject(b, len, MGC_PLAN_ERR_VERSION,
                  "plan format version 2, this mgc-run reads 10: recompile with mgc compile");
    memcpy(b, orig, len);
    wr32(b + 8, 5); /* version 5: the attention kernels it carries take other arguments */
    reseal(b, len);
    expect_reject(b, len, MGC_PLAN_ERR_VERSION,
                  "plan format version 5, this mgc-run reads 10: recompile with mgc compile");
    memcpy(b, orig, len);
    wr32(b + 8, 6); /* version 6: its router kernels take other arguments */
    reseal(b, len);
    expect_reject(b, len, MGC_PLAN_ERR_VERSION,
                  "plan format version 6, this mgc-run reads 10: recompile with mgc compile");
    memcpy(b, orig, len);
    wr32(b + 8, 7); /* version 7: no fused cross-entropy flag */
    reseal(b, len);
    expect_reject(b, len, MGC_PLAN_ERR_VERSION,
                  "plan format version 7, this mgc-run reads 10: recompile with mgc compile");
    memcpy(b, orig, len);
    wr32(b + 8, 8); /* version 8: its norm_bwd_reduce takes two destinations, not three */
    reseal(b, len);
    expect_reject(b, len, MGC_PLAN_ERR_VERSION,
                  "plan format version 8, this mgc-run reads 10: recompile with mgc compile");
    memcpy(b, orig, len);
    wr32(b + 8, 9); /* version 9: its dropout kernels take no step word */
    reseal(b, len);
    expect_reject(b, len, MGC_PLAN_ERR_VERSION,
                  "plan format version 9, this mgc-run reads 10: recompile with mgc compile");
    memcpy(b, orig, len);
    wr32(b + 8, 11);
    reseal(b, len);
    expect_reject(b, len, MGC_PLAN_ERR_VERSION, "plan format version 11, this mgc-run reads 10");
    memcpy(b, orig, len);
    wr32(b + 8, 11); /* the same change without a new checksum is damage, not a version */
    expect_reject(b, len, MGC_PLAN_ERR_FORMAT, "corrupt plan: header checksum");
    memcpy(b, orig, len);
    wr32(b + 12, 4);
    reseal(b, len);
    expect_reject(b, len, MGC_PLAN_ERR_VERSION, "flags");

    /* a length that is not a multiple of 8, consistent with the header */
    uint8_t *odd = dup_buf(orig, len, 1);
    wr64(odd + 16, len + 1);
    wr32(odd + 60, mgc_crc32c(0, odd, 60));
    expect_reject(odd, len + 1, MGC_PLAN_ERR_FORMAT, "not a multiple of 8");
    free(odd);

    /* counts no byte count can back */
    memcpy(b, orig, len);
    wr32(b + 24, 0xffffffffu); /* sections */
    wr32(b + 60, mgc_crc32c(0, b, 60));
    expect_reject(b, len, MGC_PLAN_ERR_FORMAT, "does not fit");
    memcpy(b, orig, len);
    wr32(b + 28, 8); /* directory entries smaller than v1's */
    wr32(b + 60, mgc_crc32c(0, b, 60));
    expect_reject(b, len, MGC_PLAN_ERR_FORMAT, "does not fit");
    int64_t tens = find_section(orig, "TENS", 0, 0);
    T_CHECK(tens >= 0);
    memcpy(b, orig, len);
    wr64(entry(b, (uint32_t)tens) + 32, UINT64_C(1) << 61); /* count x 80 wraps around */
    reseal(b, len);
    expect_reject(b, len, MGC_PLAN_ERR_FORMAT, "records of 80 bytes");
    memcpy(b, orig, len);
    wr64(entry(b, (uint32_t)tens) + 24, UINT64_MAX - 7); /* length past the end */
    reseal(b, len);
    expect_reject(b, len, MGC_PLAN_ERR_FORMAT, "passes the end");
    memcpy(b, orig, len);
    wr32(entry(b, (uint32_t)tens) + 40, 0); /* zero-sized records */
    reseal(b, len);
    expect_reject(b, len, MGC_PLAN_ERR_FORMAT, "records of 0 bytes");
    memcpy(b, orig, len);
    wr32(entry(b, (uint32_t)tens) + 40, 8); /* records shorter than v1's */
    wr64(entry(b, (uint32_t)tens) + 32, rd64(entry(b, (uint32_t)tens) + 24) / 8);
    reseal(b, len);
    expect_reject(b, len, MGC_PLAN_ERR_FORMAT, "this reader needs 80");
    memcpy(b, orig, len);
    wr64(entry(b, (uint32_t)tens) + 16, rd64(entry(b, (uint32_t)tens) + 16) + 8); /* a hole */
    reseal(b, len);
    expect_reject(b, len, MGC_PLAN_ERR_FORMAT, "at offset");
    int64_t grid = find_section(orig, "GRID", NONE, NONE);
    uint8_t *grid_rec = b + rd64(entry(orig, (uint32_t)grid) + 16);
    memcpy(b, orig, len);
    wr64(grid_rec + 128, UINT64_C(1) << 40); /* n_stages */
    reseal(b, len);
    expect_reject(b, len, MGC_PLAN_ERR_FORMAT, "stages but");
    memcpy(b, orig, len);
    wr64(grid_rec + 128, UINT64_MAX); /* n_stages -1 */
    reseal(b, len);
    expect_reject(b, len, MGC_PLAN_ERR_FORMAT, "stages but");
    int64_t stag = find_section(orig, "STAG", 1, NONE);
    memcpy(b, orig, len);
    wr64(b + rd64(entry(orig, (uint32_t)stag) + 16) + 8, UINT64_C(1) << 50); /* n_chunks */
    reseal(b, len);
    expect_reject(b, len, MGC_PLAN_ERR_FORMAT, "chunks but");

    /* sections out of their canonical order */
    memcpy(b, orig, len);
    int64_t fwd = find_section(orig, "FWDO", 0, 0), bwd = find_section(orig, "BWDO", 0, 0);
    memcpy(entry(b, (uint32_t)fwd), "BWDO", 4);
    memcpy(entry(b, (uint32_t)bwd), "FWDO", 4);
    reseal(b, len);
    expect_reject(b, len, MGC_PLAN_ERR_FORMAT, "expected FWDO (stage 0, chunk 0)");
    memcpy(b, orig, len);
    wr32(entry(b, (uint32_t)stag) + 8, 0); /* stage 1's header labelled stage 0 */
    reseal(b, len);
    expect_reject(b, len, MGC_PLAN_ERR_FORMAT, "expected STAG (stage 1)");
    memcpy(b, orig, len);
    memcpy(entry(b, (uint32_t)bwd), "XTRA", 4); /* a required section missing */
    reseal(b, len);
    expect_reject(b, len, MGC_PLAN_ERR_FORMAT, "expected BWDO (stage 0, chunk 0)");
    memcpy(b, orig, len);
    int64_t last = rd32(orig + 24) - 1;
    memcpy(entry(b, (uint32_t)last), "XTRA", 4); /* the very last one */
    reseal(b, len);
    expect_reject(b, len, MGC_PLAN_ERR_FORMAT, "missing");

    /* indices out of range under valid checksums: the validator speaks */
    int64_t fwdo = find_section(orig, "FWDO", 1, 0);
    uint8_t *op0 = b + rd64(entry(orig, (uint32_t)fwdo) + 16);
    memcpy(b, orig, len);
    b[op0 - b + 12] = 1;     /* n_in = 1 */
    wr32(op0 + 16, 1000000); /* in[0] */
    reseal(b, len);
    expect_reject(b, len, MGC_PLAN_ERR_FORMAT, "inconsistent plan: stage 1 chunk 0 fwd op 0");
    memcpy(b, orig, len);
    wr32(op0 + 8, 0x7fffffff); /* name */
    reseal(b, len);
    expect_reject(b, len, MGC_PLAN_ERR_FORMAT, "outside the string table");
    int64_t inst = find_section(orig, "INST", 0, NONE);
    uint8_t *in0 = b + rd64(entry(orig, (uint32_t)inst) + 16);
    memcpy(b, orig, len);
    in0[0] = MGC_I_SEND_ACT, in0[1] = 0;
    wr32(in0 + 4, 0); /* mb */
    wr32(in0 + 8, 0); /* peer: itself */
    reseal(b, len);
    expect_reject(b, len, MGC_PLAN_ERR_FORMAT, "is not another pipeline rank");
    memcpy(b, orig, len);
    in0[2] = 7; /* chunk */
    reseal(b, len);
    expect_reject(b, len, MGC_PLAN_ERR_FORMAT, "chunk 7 outside");
    int64_t bufs = find_section(orig, "BUFS", 0, NONE);
    uint8_t *bf0 = b + rd64(entry(orig, (uint32_t)bufs) + 16);
    memcpy(b, orig, len);
    wr64(bf0 + 24, UINT64_C(1) << 62); /* offset, aligned, outside the arena */
    reseal(b, len);
    expect_reject(b, len, MGC_PLAN_ERR_FORMAT, "outside the arena");
    /* the gradient buckets (BCKT), damaged with valid checksums */
    int64_t bckt = find_section(orig, "BCKT", 0, NONE);
    T_CHECK(bckt >= 0 && rd64(entry(orig, (uint32_t)bckt) + 32) == 2 &&
            rd32(entry(orig, (uint32_t)bckt) + 40) == 72);
    uint8_t *bk0 = b + rd64(entry(orig, (uint32_t)bckt) + 16);
    memcpy(b, orig, len);
    wr16(bk0 + 0, MGC_GROUP_TP);
    reseal(b, len);
    expect_reject(b, len, MGC_PLAN_ERR_FORMAT, "neither dp_cp");
    memcpy(b, orig, len);
    wr64(bk0 + 72 + 16, 512); /* bucket 1 overlaps bucket 0 */
    reseal(b, len);
    expect_reject(b, len, MGC_PLAN_ERR_FORMAT, "does not end at or before bucket 0");
    memcpy(b, orig, len);
    wr64(bk0 + 48, 1u << 20); /* grad bytes */
    reseal(b, len);
    expect_reject(b, len, MGC_PLAN_ERR_FORMAT, "grad bytes");
    memcpy(b, orig, len);
    wr32(entry(b, (uint32_t)bckt) + 40, 64); /* records shorter than version 2's */
    reseal(b, len);
    expect_reject(b, len, MGC_PLAN_ERR_FORMAT, "records of");
    int64_t tns = find_section(orig, "TENS", 1, 0);
    uint8_t *t0 = b + rd64(entry(orig, (uint32_t)tns) + 16);
    memcpy(b, orig, len);
    wr32(t0 + 48, 99); /* buffer */
    reseal(b, len);
    expect_reject(b, len, MGC_PLAN_ERR_FORMAT, "buffer 99 outside");
    int64_t strs = find_section(orig, "STRS", NONE, NONE);
    memcpy(b, orig, len);
    b[rd64(entry(orig, (uint32_t)strs) + 16) + rd64(entry(orig, (uint32_t)strs) + 24) - 1] =
        'x'; /* unterminated */
    reseal(b, len);
    expect_reject(b, len, MGC_PLAN_ERR_FORMAT, "NUL");
    memcpy(b, orig, len);
    wr64(grid_rec + 40, 3); /* vp 3, but one chunk per stage */
    reseal(b, len);
    expect_reject(b, len, MGC_PLAN_ERR_FORMAT, "inconsistent plan");
    free(b);

    /* an unknown section is skipped: one after STRS and one at the end */
    sec secs[256];
    size_t n = parse_sections(orig, secs, 250);
    memmove(&secs[4], &secs[3], (n - 3) * sizeof *secs);
    secs[3] = (sec){"XTRA", NONE, NONE, 5, 1, (const uint8_t *)"hello"};
    secs[n + 1] = (sec){"ZZZZ", 0, 0, 3, 8, (const uint8_t *)"24 bytes of a later writer"};
    size_t xl;
    uint8_t *x = build_file(secs, n + 2, &xl);
    T_EQ_U64(xl, len + 2 * 48 + 8 + 24);
    mgc_plan *q = NULL;
    T_EQ_I64(mgc_plan_decode(x, xl, "x.plan", &q, err, sizeof err), MGC_PLAN_OK);
    if (q) T_EQ_I64(compare_plans(p, q), 0);
    mgc_plan_free(q);
    free(x);

    /* longer records (a later writer's fields at their end) read as their v1 prefix */
    n = parse_sections(orig, secs, 250);
    uint8_t *wide[256] = {0};
    for (size_t i = 0; i < n; i++) {
        if (!memcmp(secs[i].id, "STRS", 4)) continue;
        uint32_t el = secs[i].elem + 16;
        wide[i] = malloc((size_t)(secs[i].count * el) + 1);
        for (uint64_t r = 0; r < secs[i].count; r++) {
            memcpy(wide[i] + r * el, secs[i].data + r * secs[i].elem, secs[i].elem);
            memset(wide[i] + r * el + secs[i].elem, 0xab, 16);
        }
        secs[i].data = wide[i];
        secs[i].elem = el;
    }
    x = build_file(secs, n, &xl);
    q = NULL;
    T_EQ_I64(mgc_plan_decode(x, xl, "x.plan", &q, err, sizeof err), MGC_PLAN_OK);
    if (q) T_EQ_I64(compare_plans(p, q), 0);
    mgc_plan_free(q);
    for (size_t i = 0; i < n; i++)
        free(wide[i]);
    free(x);
    free(orig);
    mgc_plan_free(p);
}

/* Random damage under valid checksums: whatever decodes must validate and
 * encode again; the rest must fail cleanly (the sanitizer build watches). */
static void test_resealed_fuzz(void) {
    mgc_grid g = {
        .world = 6, .tp = 1, .cp = 1, .dp = 2, .pp = 3, .vp = 2, .etp = 1, .ep = 1, .edp = 2};
    mgc_plan *p = random_plan(g, 2);
    uint8_t *orig;
    size_t len;
    char err[512];
    T_EQ_I64(mgc_plan_encode(p, &orig, &len, err, sizeof err), MGC_PLAN_OK);
    uint8_t *b = malloc(len);
    int64_t decoded = 0, bad = 0;
    for (int iter = 0; iter < 20000; iter++) {
        memcpy(b, orig, len);
        int n = (int)rnd_in(1, 8);
        for (int k = 0; k < n; k++) {
            size_t at = (size_t)rnd_in(8, (int64_t)len - 1);
            if (at >= 60 && at < 64) continue; /* the header checksum is recomputed anyway */
            b[at] = rnd() % 4 ? (uint8_t)rnd() : (uint8_t)(b[at] ^ (1u << (rnd() % 8)));
        }
        reseal(b, len);
        mgc_plan *q = NULL;
        char e[512] = "";
        mgc_plan_status rc = mgc_plan_decode(b, len, "f.plan", &q, e, sizeof e);
        if (rc == MGC_PLAN_OK) {
            decoded++;
            uint8_t *again = NULL;
            size_t al = 0;
            bad += !q || mgc_plan_validate(q, e, sizeof e) != MGC_PLAN_OK ||
                   mgc_plan_encode(q, &again, &al, e, sizeof e) != MGC_PLAN_OK;
            free(again);
        } else {
            bad += q != NULL || strncmp(e, "f.plan: ", 8) != 0 || strchr(e, '\n') != NULL;
        }
        mgc_plan_free(q);
    }
    fprintf(stderr,
            "resealed fuzz: 20000 damaged plans with valid checksums, %" PRId64
            " still consistent\n",
            decoded);
    T_EQ_I64(bad, 0);
    free(b);
    free(orig);
    mgc_plan_free(p);
}

/* Each validation rule: break one field, expect INVALID naming it, undo. */
static void test_validate(void) {
    mgc_plan *p = random_plan(grid_small, 3);
    char err[512];
    T_EQ_I64(mgc_plan_validate(p, err, sizeof err), MGC_PLAN_OK);
    T_EQ_I64(mgc_plan_validate(NULL, err, sizeof err), MGC_PLAN_ERR_INVALID);
    mgc_stage_program *st = &p->stages[1];
    mgc_plan_chunk *ch = &st->chunks[0];
    ch->fwd[0].n_in = 1;
    ch->fwd[0].in[0] = 0;
    ch->bwd[0].n_out = 1;
    ch->bwd[0].out[0] = 0;
    ch->bwd[0].kind = MGC_POP_LINEAR_DGRAD;
    ch->bwd[0].flags = 0;
    ch->tensors[0].buffer = 0;
    ch->tensors[0].offset = 0;
    ch->tensors[0].rank = 1;
    ch->tensors[0].dim[0] = 1;
    ch->tensors[0].dtype = MGC_DT_U8;
    ch->tensors[0].bytes = 1;
    ch->tensors[0].split_axis = MGC_PLAN_NO_SPLIT;
    ch->tensors[0].split2_axis = MGC_PLAN_NO_SPLIT;
    st->instrs[0].op = MGC_I_FORWARD;
    st->instrs[0].mb = 0;
    st->instrs[0].peer = -1;
    fixed_buckets(p, 1);
    T_EQ_I64(mgc_plan_validate(p, err, sizeof err), MGC_PLAN_OK);

#define BREAK(field, value, frag)                                                                  \
    do {                                                                                           \
        __typeof__(field) saved_ = (field);                                                        \
        (field) = (value);                                                                         \
        err[0] = 0;                                                                                \
        T_EQ_I64(mgc_plan_validate(p, err, sizeof err), MGC_PLAN_ERR_INVALID);                     \
        if (!strstr(err, frag)) {                                                                  \
            T_CHECK(!"validate message");                                                          \
            fprintf(stderr, "  wanted \"%s\" in: %s\n", frag, err);                                \
        }                                                                                          \
        (field) = saved_;                                                                          \
        T_EQ_I64(mgc_plan_validate(p, err, sizeof err), MGC_PLAN_OK);                              \
    } while (0)

    /* gradient buckets and the instructions naming them */
    {
        mgc_bucket *bk = st->buckets;
        int64_t last = st->n_instrs - 1;
        BREAK(bk[0].group, MGC_GROUP_DP, "group 2 is neither dp_cp (4) nor edp (8)");
        BREAK(bk[1].chunk, 1, "bucket 1: chunk 1 outside 0..0");
        BREAK(bk[0].shards, 2, "2 shards, expected 1");
        BREAK(bk[0].count, 0, "not a positive multiple");
        BREAK(bk[1].begin, 256, "does not end at or before bucket 0");
        BREAK(bk[1].count, 1024, "does not end at or before bucket 0");
        BREAK(bk[0].grad_offset, 4, "grad bytes");
        BREAK(bk[0].grad_bytes, 4, "grad bytes");
        BREAK(bk[0].weight_bytes, 512 * 3, "weight bytes");
        BREAK(bk[0].weight_offset, 0, "weight bytes");
        BREAK(bk[0].grad_buffer, bk[0].weight_buffer, "not a grad buffer");
        BREAK(bk[0].grad_buffer, -1, "not a grad buffer");
        BREAK(bk[0].weight_buffer, (int32_t)st->n_buffers, "not a weight buffer");
        BREAK(st->buffers[bk[0].grad_buffer].bytes, 2048, "outside buffer");
        BREAK(st->n_buckets, -1, "-1 buckets");
        BREAK(st->instrs[last].arg, 2, "bucket 2 outside the stage's 2 buckets");
        BREAK(st->instrs[last].op, MGC_I_OPTIMIZER, "1 reduce_grads instructions for 2");
        st->instrs[0].op = MGC_I_GATHER_PARAMS;
        st->instrs[0].mb = -1;
        st->instrs[0].arg = 0; /* random until now */
        T_EQ_I64(mgc_plan_validate(p, err, sizeof err), MGC_PLAN_OK);
        BREAK(st->instrs[0].arg, 7, "(gather_params): bucket 7 outside");
        st->instrs[0].op = MGC_I_FORWARD;
        st->instrs[0].mb = 0;
        /* a 4-byte weight dtype is also valid */
        for (int k = 0; k < 2; k++) {
            bk[k].weight_offset *= 2;
            bk[k].weight_bytes *= 2;
        }
        st->buffers[bk[0].weight_buffer].bytes *= 2;
        st->arena_bytes += 2048;
        T_EQ_I64(mgc_plan_validate(p, err, sizeof err), MGC_PLAN_OK);
    }
    BREAK(p->grid.world, 3, "grid world 3");
    BREAK(p->grid.vp, 0, "vp 0");
    BREAK(p->n_stages, 1, "1 stage programs for pp 2");
    BREAK(p->num_microbatches, 0, "num_microbatches");
    BREAK(p->micro_batch_size, 0, "micro_batch_size");
    BREAK(p->seq_length, -1, "seq_length");
    BREAK(p->schedule, 3, "schedule 3");
    BREAK(p->recompute, -1, "recompute -1");
    BREAK(p->distributed_optimizer, 2, "distributed_optimizer 2");
    BREAK(p->bubble_fraction, NAN, "bubble_fraction");
    BREAK(p->bubble_fraction, 1.5, "bubble_fraction");
    BREAK(p->model_flops_per_iter, INFINITY, "model_flops_per_iter");
    BREAK(p->strings[0], 'a', "NUL");
    BREAK(p->strings[p->strings_len - 1], 'a', "NUL");
    BREAK(p->config[0].key, 0, "key offset 0");
    BREAK(p->config[0].key, (uint32_t)p->strings_len, "not a name");
    BREAK(p->config[0].type, 3, "type 3 unknown");
    BREAK(p->config[2].s, (uint32_t)p->strings_len + 5, "string offset");
    BREAK(p->n_config, -1, "config entries");
    BREAK(st->pp_rank, 0, "pp_rank 0, expected 1");
    BREAK(st->n_chunks, 2, "2 chunks");
    BREAK(st->max_in_flight, -1, "max_in_flight");
    BREAK(st->buffers[0].kind, MGC_BUF__COUNT, "kind 12 unknown");
    BREAK(st->buffers[0].chunk, 1, "chunk 1 outside");
    BREAK(st->buffers[0].mb, (int32_t)p->num_microbatches, "microbatch");
    BREAK(st->buffers[0].mb, -2, "microbatch -2");
    BREAK(st->buffers[0].offset, 8, "not a multiple of 256");
    BREAK(st->buffers[0].bytes, st->arena_bytes + 1, "outside the arena");
    BREAK(st->buffers[0].live_end, st->n_instrs + 1, "live range");
    BREAK(st->buffers[0].live_begin, -1, "live range");
    BREAK(st->buffers[0].name, 0xfffffff0u, "name offset");
    BREAK(st->instrs[0].op, MGC_I__COUNT, "op 11 unknown");
    BREAK(st->instrs[0].chunk, 1, "chunk 1 outside");
    BREAK(st->instrs[0].mb, -1, "microbatch -1 outside 0..");
    BREAK(st->instrs[0].mb, (int32_t)p->num_microbatches, "microbatch");
    BREAK(st->instrs[0].peer, 0, "peer 0 on an instruction without a peer");
    BREAK(st->instrs[0].op, MGC_I_RECV_ACT, "peer -1 is not another pipeline rank");
    st->instrs[0].op = MGC_I_SEND_GRAD;
    st->instrs[0].peer = 0;
    T_EQ_I64(mgc_plan_validate(p, err, sizeof err), MGC_PLAN_OK);
    BREAK(st->instrs[0].peer, 1, "peer 1 is not another");
    BREAK(st->instrs[0].peer, 2, "peer 2 is not another");
    st->instrs[0].op = MGC_I_FORWARD;
    st->instrs[0].peer = -1;
    BREAK(ch->first_layer, -1, "negative");
    BREAK(ch->embedding, 2, "embedding/loss");
    BREAK(ch->n_tensors, -1, "tensors");
    BREAK(ch->tensors[0].dtype, MGC_DT__COUNT, "dtype 6 unknown");
    BREAK(ch->tensors[0].rank, 5, "rank 5");
    BREAK(ch->tensors[0].role, 7, "role 7");
    BREAK(ch->tensors[0].dim[0], 0, "dim 0 is 0");
    BREAK(ch->tensors[0].bytes, 2, "bytes 2 != 1 elements");
    BREAK(ch->tensors[0].split_axis, 1, "split axis 1 outside rank 1");
    ch->tensors[0].split_axis = 0;
    BREAK(ch->tensors[0].split_group, MGC_GROUP__COUNT, "split group");
    BREAK(ch->tensors[0].split2_axis, 0, "second split axis 0 outside rank 1 or the first split's");
    ch->tensors[0].split_axis = MGC_PLAN_NO_SPLIT;
    BREAK(ch->tensors[0].split2_axis, 1, "second split axis 1 outside rank 1");
    ch->tensors[0].split2_axis = 0;
    ch->tensors[0].split2_group = MGC_GROUP_ETP;
    T_EQ_I64(mgc_plan_validate(p, err, sizeof err), MGC_PLAN_OK);
    BREAK(ch->tensors[0].split2_group, MGC_GROUP__COUNT, "second split group");
    ch->tensors[0].split2_axis = MGC_PLAN_NO_SPLIT;
    BREAK(ch->tensors[0].buffer, -3, "buffer -3 outside");
    BREAK(ch->tensors[0].buffer, (int32_t)st->n_buffers, "outside -2..");
    {   /* a stashed tensor must lie inside the chunk's per-microbatch stash */
        uint64_t keep = ch->stash_bytes;
        ch->stash_bytes = ch->tensors[0].bytes - 1;
        BREAK(ch->tensors[0].buffer, MGC_PLAN_BUF_STASH, "outside the chunk's stash");
        ch->stash_bytes = keep;
    }
    BREAK(ch->tensors[0].offset, st->buffers[0].bytes, "outside its buffer 0");
    BREAK(ch->tensors[0].name, (uint32_t)p->strings_len, "name offset");
    /* row views (plan.h tensor.view): tensor 1 as rows [1, 3) of a 4-row tensor 0 */
    if (ch->n_tensors >= 3) {
        mgc_plan_tensor t0 = ch->tensors[0], t1 = ch->tensors[1];
        ch->tensors[0].rank = 2, ch->tensors[0].dim[0] = 4, ch->tensors[0].dim[1] = 8;
        ch->tensors[0].bytes = 32;
        ch->tensors[1] = ch->tensors[0];
        ch->tensors[1].dim[0] = 2, ch->tensors[1].bytes = 16, ch->tensors[1].offset = 8;
        ch->tensors[1].view = 1;
        T_EQ_I64(mgc_plan_validate(p, err, sizeof err), MGC_PLAN_OK);
        BREAK(ch->tensors[1].view, 2, "or itself");
        BREAK(ch->tensors[1].view, (uint32_t)ch->n_tensors + 1, "outside 0..");
        BREAK(ch->tensors[1].offset, 20, "not a range of its outer rows");  /* 12 B in */
        BREAK(ch->tensors[1].offset, 24, "not a range of its outer rows");  /* past the end */
        { /* other inner dims (its bytes still its own elements) */
            int64_t d1 = ch->tensors[1].dim[1];
            uint64_t b1 = ch->tensors[1].bytes;
            ch->tensors[1].dim[1] = 4, ch->tensors[1].bytes = b1 / 2;
            T_EQ_I64(mgc_plan_validate(p, err, sizeof err), MGC_PLAN_ERR_INVALID);
            T_CHECK(strstr(err, "not a range of its outer rows") != NULL);
            ch->tensors[1].dim[1] = d1, ch->tensors[1].bytes = b1;
        }
        BREAK(ch->tensors[1].role, ch->tensors[0].role + 1u, "not a range");
        BREAK(ch->tensors[0].view, 2, "not a range of its outer rows");     /* view of a view */
        BREAK(ch->tensors[0].buffer, MGC_PLAN_BUF_STASH, "not a range"); /* other memory */
        ch->tensors[0] = t0, ch->tensors[1] = t1;
        T_EQ_I64(mgc_plan_validate(p, err, sizeof err), MGC_PLAN_OK);
    }
    BREAK(ch->fwd[0].kind, 20, "op kind 20 unknown");
    BREAK(ch->fwd[0].kind, MGC_POP__END, "unknown");
    BREAK(ch->fwd[0].kind, MGC_POP_NORM_BWD, "backward op norm_bwd in a forward program");
    BREAK(ch->bwd[0].kind, MGC_POP_NORM, "without the recompute flag");
    ch->bwd[0].flags = MGC_POF_RECOMPUTE; /* a recompute op belongs there */
    ch->bwd[0].kind = MGC_POP_NORM;
    T_EQ_I64(mgc_plan_validate(p, err, sizeof err), MGC_PLAN_OK);
    ch->bwd[0].kind = MGC_POP_LINEAR_DGRAD;
    ch->bwd[0].flags = 0;
    {   /* attention's sliding window: a whole number of keys, on a causal attention (checked
         * before the op's other fields) */
        mgc_plan_op save = ch->fwd[0];
        static const struct {
            double w;
            int64_t causal;
            const char *frag;
        } bad[] = {{2.5, 1, "sliding window 2.5 is not a whole number"},
                   {-4.0, 1, "sliding window -4 is not"},
                   {1e9, 1, "from 0 to 2^24"},
                   {4.0, 0, "on a causal attention"}};
        for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
            ch->fwd[0].kind = MGC_POP_ATTENTION;
            ch->fwd[0].flags = 0;
            ch->fwd[0].iattr[0] = bad[i].causal;
            ch->fwd[0].fattr[2] = bad[i].w;
            err[0] = 0;
            T_EQ_I64(mgc_plan_validate(p, err, sizeof err), MGC_PLAN_ERR_INVALID);
            if (!strstr(err, bad[i].frag)) {
                T_CHECK(!"validate message");
                fprintf(stderr, "  wanted \"%s\" in: %s\n", bad[i].frag, err);
            }
            ch->fwd[0] = save;
        }
        T_EQ_I64(mgc_plan_validate(p, err, sizeof err), MGC_PLAN_OK);
    }
    {   /* the fused embedding + norm: its inputs' places follow from iattr[1], fattr[1] and the
         * document flag (mgc_plan_emb_norm_io) */
        mgc_plan_op save = ch->fwd[0];
        mgc_plan_op *o = &ch->fwd[0];
        o->kind = MGC_POP_EMBEDDING_NORM;
        o->flags = 0;
        o->n_in = 3; /* tokens, word, the norm's weight */
        o->n_out = 2;
        o->in[0] = o->in[1] = o->in[2] = o->in[3] = o->in[4] = o->out[0] = o->out[1] = 0;
        memset(o->iattr, 0, sizeof o->iattr);
        memset(o->fattr, 0, sizeof o->fattr);
        o->fattr[0] = 1e-5;
        T_EQ_I64(mgc_plan_validate(p, err, sizeof err), MGC_PLAN_OK);
        mgc_emb_norm_io io;
        T_EQ_I64(mgc_plan_emb_norm_io(o, &io), 0);
        T_CHECK(io.pos == -1 && io.w == 2 && io.b == -1 && io.docs == -1);
        o->n_in = 4; /* ... and a LayerNorm's bias */
        T_EQ_I64(mgc_plan_validate(p, err, sizeof err), MGC_PLAN_OK);
        T_EQ_I64(mgc_plan_emb_norm_io(o, &io), 0);
        T_CHECK(io.pos == -1 && io.w == 2 && io.b == 3 && io.docs == -1);
        BREAK(o->fattr[1], 1.0, "do not fit its attributes"); /* an RMSNorm has no bias */
        BREAK(o->iattr[1], 1, "do not fit its attributes");   /* in[2] is no position table */
        BREAK(o->n_in, 5, "do not fit its attributes");
        BREAK(o->n_out, 1, "do not fit its attributes");
        BREAK(o->fattr[0], 0.0, "eps 0 outside (0, 1]");
        BREAK(o->fattr[0], 2.0, "eps 2 outside (0, 1]");
        BREAK(o->fattr[1], 0.5, "norm kind 0.5 neither 0");
        BREAK(o->flags, MGC_POF_DOCS, "document"); /* documents without positions */
        o->n_in = 3;
        T_EQ_I64(mgc_plan_validate(p, err, sizeof err), MGC_PLAN_OK);
        *o = save;
    }
    {   /* the norm backward's fused column sums and dropout backward (mgc_plan_norm_bwd_io):
         * x, w, dy, g, mask -> dx, dw, db, cs, dbr over tensors 0-4 of the chunk, rows 6 x h 4 */
        mgc_plan_op save = ch->bwd[0];
        mgc_plan_tensor *ts = ch->tensors;
        int64_t nts = ch->n_tensors;
        ch->n_tensors = nts > 5 ? nts : 5;
        ch->tensors = calloc((size_t)ch->n_tensors, sizeof *ch->tensors);
        if (!ch->tensors) abort();
        memcpy(ch->tensors, ts, (size_t)nts * sizeof *ts);
        for (int i = 0; i < 5; i++) { /* rank 1, in no buffer: the dtype and size below */
            mgc_plan_tensor *t = &ch->tensors[i];
            t->rank = 1, t->buffer = -1, t->offset = 64, t->ld = 0, t->view = 0;
            t->split_axis = t->split2_axis = MGC_PLAN_NO_SPLIT;
        }
        mgc_plan_op *o = &ch->bwd[0];
        memset(o->iattr, 0, sizeof o->iattr);
        memset(o->fattr, 0, sizeof o->fattr);
        o->kind = MGC_POP_NORM_BWD;
        o->flags = MGC_POF_COLSUM | MGC_POF_DROPBWD;
        o->iattr[1] = 6, o->iattr[2] = 4;
        o->fattr[0] = 1e-5, o->fattr[1] = 0.1;
        o->n_in = 5, o->n_out = 5;
        for (int i = 0; i < 5; i++)
            o->in[i] = i;
        o->in[4] = 3; /* the mask */
        o->in[5] = o->out[5] = 0;  /* for the BREAKs of n_in, n_out below */
        o->out[0] = 0, o->out[1] = 1, o->out[2] = 1, o->out[3] = 2, o->out[4] = 4;
        static const struct {
            uint16_t dt;
            int64_t n;
        } shape[5] = {{MGC_DT_BF16, 24}, {MGC_DT_F32, 4}, {MGC_DT_F32, 4}, {MGC_DT_U8, 24}, {MGC_DT_BF16, 24}};
        for (int i = 0; i < 5; i++) { /* dx, dw, the column sums, the mask, dbr */
            ch->tensors[i].dtype = shape[i].dt, ch->tensors[i].dim[0] = shape[i].n;
            ch->tensors[i].bytes = (uint64_t)shape[i].n * mgc_dtype_size((mgc_dtype)shape[i].dt);
        }
        T_EQ_I64(mgc_plan_validate(p, err, sizeof err), MGC_PLAN_OK);
        mgc_norm_bwd_io io;
        T_EQ_I64(mgc_plan_norm_bwd_io(o, &io), 0);
        T_CHECK(io.res == 3 && io.mask == 4 && io.db == 2 && io.cs == 3 && io.dbr == 4 && io.sets == 3);
        const char *frag = "column-sum or dropout flag on an op that is not a norm_bwd whose";
        for (int k = 0; k < 2; k++) { /* a mask of int32, dbr of fp16 (unlike dx) */
            mgc_plan_tensor *t = &ch->tensors[k ? 4 : 3], keep = *t;
            t->dtype = k ? MGC_DT_F16 : MGC_DT_I32;
            t->bytes = (uint64_t)t->dim[0] * mgc_dtype_size((mgc_dtype)t->dtype);
            err[0] = 0;
            T_EQ_I64(mgc_plan_validate(p, err, sizeof err), MGC_PLAN_ERR_INVALID);
            T_CHECK(strstr(err, frag) != NULL);
            *t = keep;
        }
        BREAK(ch->bwd[0].iattr[1], 12, frag);           /* a mask not rows x h */
        BREAK(ch->bwd[0].iattr[2], 3, frag);            /* column sums not h floats */
        BREAK(o->fattr[1], 1.0, frag);                   /* p = 1 */
        BREAK(o->n_out, 6, frag);                        /* too many outputs for the flags */
        BREAK(o->n_in, 6, frag);
        BREAK(o->kind, MGC_POP_LINEAR_WGRAD, frag);
        o->flags = MGC_POF_DROPBWD; /* x, w, dy, mask -> dx, dw, dbr */
        o->n_in = 4, o->n_out = 3;
        o->in[3] = 3, o->out[2] = 4;
        T_EQ_I64(mgc_plan_validate(p, err, sizeof err), MGC_PLAN_OK);
        T_EQ_I64(mgc_plan_norm_bwd_io(o, &io), 0);
        T_CHECK(io.res == -1 && io.mask == 3 && io.db == -1 && io.cs == -1 && io.dbr == 2 && io.sets == 1);
        BREAK(o->n_in, 3, frag); /* no mask */
        *o = save;
        {   /* the fused embedding's dropout: out x (tensor 0, bf16), y (4), the mask (3, u8 of
             * x's 24 elements) with fattr[2] its p */
            mgc_plan_op fsave = ch->fwd[0];
            mgc_plan_op *e = &ch->fwd[0];
            e->kind = MGC_POP_EMBEDDING_NORM;
            e->flags = 0;
            e->n_in = 3, e->n_out = 3;
            e->in[0] = e->in[1] = e->in[2] = 0;
            e->out[0] = 0, e->out[1] = 4, e->out[2] = 3;
            memset(e->iattr, 0, sizeof e->iattr);
            memset(e->fattr, 0, sizeof e->fattr);
            e->fattr[0] = 1e-5, e->fattr[2] = 0.1;
            T_EQ_I64(mgc_plan_validate(p, err, sizeof err), MGC_PLAN_OK);
            T_EQ_I64(mgc_plan_op_dropout_attr(e), 2);
            const char *dfrag = "dropout p";
            BREAK(e->fattr[2], 0.0, dfrag);  /* a mask without a dropout */
            BREAK(e->fattr[2], 1.0, dfrag);  /* p = 1 */
            BREAK(e->out[2], 1, dfrag);      /* an fp32 mask */
            ch->tensors[3].dim[0] = 12, ch->tensors[3].bytes = 12; /* half of x's elements */
            err[0] = 0;
            T_EQ_I64(mgc_plan_validate(p, err, sizeof err), MGC_PLAN_ERR_INVALID);
            T_CHECK(strstr(err, dfrag) != NULL);
            ch->tensors[3].dim[0] = 24, ch->tensors[3].bytes = 24;
            e->n_out = 2, e->fattr[2] = 0.0;
            BREAK(e->fattr[2], 0.1, dfrag);  /* a dropout without its mask */
            T_EQ_I64(mgc_plan_validate(p, err, sizeof err), MGC_PLAN_OK);
            T_EQ_I64(mgc_plan_op_dropout_attr(e), -1);
            *e = fsave;
        }
        free(ch->tensors);
        ch->tensors = ts, ch->n_tensors = nts;
        T_EQ_I64(mgc_plan_validate(p, err, sizeof err), MGC_PLAN_OK);
    }
    BREAK(ch->fwd[0].flags, 1024, "unknown flags");
    BREAK(ch->fwd[0].flags, MGC_POF_CE_STATS, "fused cross-entropy flag on an op that is not");
    BREAK(ch->fwd[0].flags, MGC_POF_COLSUM, "column-sum or dropout flag on an op that is not a norm_bwd");
    BREAK(ch->fwd[0].flags, MGC_POF_DROPBWD, "column-sum or dropout flag on an op that is not a norm_bwd");
    BREAK(ch->fwd[0].flags, MGC_POF_ROWS, "routed-rows flag on an op that is not an activation");
    BREAK(ch->tensors[0].flags, 2, "flags 0x2 unknown");
    BREAK(ch->fwd[0].flags, MGC_POF_DOCS, "document flag on an op that is not attention, a rope");
    BREAK(ch->fwd[0].flags, MGC_POF_ROPE, "rotary flag on an op that is not a qkv split");
    BREAK(ch->fwd[0].flags, MGC_POF_INPLACE, "in-place flag on an op that cannot");
    BREAK(ch->fwd[0].flags, MGC_POF_QKV, "fused-qkv flag on an op that is not attention");
    BREAK(ch->fwd[0].layer, -2, "layer -2");
    BREAK(ch->fwd[0].n_in, 9, "at most 8");
    BREAK(ch->fwd[0].in[0], -1, "input 0 is tensor -1");
    BREAK(ch->fwd[0].in[0], (int32_t)ch->n_tensors, "input 0 is tensor");
    BREAK(ch->bwd[0].out[0], (int32_t)ch->n_tensors, "output 0 is tensor");
    BREAK(ch->fwd[0].name, (uint32_t)p->strings_len, "name offset");
    ch->fwd[0].kind = MGC_POP_ALL_GATHER;
    BREAK(ch->fwd[0].group, MGC_GROUP__COUNT, "group 11 unknown");

    /* the writer refuses, with the reason */
    uint8_t *buf = (uint8_t *)(uintptr_t)1;
    size_t len = 7;
    ch->fwd[0].in[0] = 4000;
    T_EQ_I64(mgc_plan_encode(p, &buf, &len, err, sizeof err), MGC_PLAN_ERR_INVALID);
    T_CHECK(buf == NULL && len == 0 &&
            strstr(err, "invalid plan: stage 1 chunk 0 fwd op 0 (all_gather): input 0"));
    mgc_plan_free(p);
}

/* Names in dir other than "." and ".."; returns how many, and whether `name` is one. */
static int list_dir(const char *dir, char names[][256], int max) {
    DIR *d = opendir(dir);
    int n = 0;
    struct dirent *de;
    while (d && (de = readdir(d))) {
        if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, "..")) continue;
        if (n < max) snprintf(names[n], sizeof names[n], "%s", de->d_name);
        n++;
    }
    if (d) closedir(d);
    return n;
}

static void test_files(void) {
    const char *tmpdir = getenv("TMPDIR");
    char dir[256], path[300], sub[300], junk[320];
    snprintf(dir, sizeof dir, "%s/mgc-test-plan-XXXXXX", tmpdir && *tmpdir ? tmpdir : "/tmp");
    T_CHECK(mkdtemp(dir) != NULL);
    snprintf(path, sizeof path, "%s/model.plan", dir);
    char err[512], names[8][256];

    mgc_plan *p = random_plan(grid_a, 6), *q = NULL;
    T_EQ_I64(mgc_plan_write(p, path, err, sizeof err), MGC_PLAN_OK);
    T_EQ_I64(list_dir(dir, names, 8), 1); /* the plan, no temp file */
    T_STREQ(names[0], "model.plan");
    T_EQ_I64(mgc_plan_read(path, &q, err, sizeof err), MGC_PLAN_OK);
    if (q) T_EQ_I64(compare_plans(p, q), 0);
    mgc_plan_free(q);

    /* a second write replaces it */
    mgc_plan *p2 = random_plan(grid_small, 4);
    T_EQ_I64(mgc_plan_write(p2, path, err, sizeof err), MGC_PLAN_OK);
    q = NULL;
    T_EQ_I64(mgc_plan_read(path, &q, err, sizeof err), MGC_PLAN_OK);
    if (q) T_EQ_I64(compare_plans(p2, q), 0);
    mgc_plan_free(q);
    T_EQ_I64(list_dir(dir, names, 8), 1);

    /* failures leave the old file untouched and no temp file behind */
    uint8_t *before;
    size_t before_len;
    T_EQ_I64(mgc_plan_encode(p2, &before, &before_len, err, sizeof err), MGC_PLAN_OK);
    p->grid.world = 5; /* invalid: refused before any file is made */
    T_EQ_I64(mgc_plan_write(p, path, err, sizeof err), MGC_PLAN_ERR_INVALID);
    T_CHECK(strstr(err, "model.plan: cannot write plan: invalid plan: grid world 5") != NULL);
    p->grid.world = 24;
    snprintf(sub, sizeof sub, "%s/sub", dir); /* rename onto a non-empty directory fails */
    T_EQ_I64(mkdir(sub, 0755), 0);
    snprintf(junk, sizeof junk, "%s/keep", sub);
    FILE *f = fopen(junk, "w");
    T_CHECK(f != NULL);
    if (f) fclose(f);
    T_EQ_I64(mgc_plan_write(p, sub, err, sizeof err), MGC_PLAN_ERR_IO);
    T_CHECK(strstr(err, "cannot write plan: renaming") != NULL && strchr(err, '\n') == NULL);
    T_EQ_I64(list_dir(dir, names, 8), 2); /* model.plan and sub: the temp file is gone */
    snprintf(junk, sizeof junk, "%s/missing/dir/x.plan", dir);
    T_EQ_I64(mgc_plan_write(p, junk, err, sizeof err), MGC_PLAN_ERR_IO);
    T_CHECK(strstr(err, "x.plan: cannot write plan: cannot create") != NULL);
    FILE *rf = fopen(path, "rb");
    uint8_t *now = malloc(before_len + 1);
    size_t now_len = rf ? fread(now, 1, before_len + 1, rf) : 0;
    if (rf) fclose(rf);
    T_CHECK(now_len == before_len && memcmp(now, before, before_len) == 0);
    free(now);

    /* reading: missing, a directory, empty, truncated on disk */
    q = (mgc_plan *)(uintptr_t)1;
    T_EQ_I64(mgc_plan_read(junk, &q, err, sizeof err), MGC_PLAN_ERR_IO);
    T_CHECK(q == NULL && strstr(err, "x.plan: cannot open plan: No such file") != NULL);
    T_EQ_I64(mgc_plan_read(sub, &q, err, sizeof err), MGC_PLAN_ERR_IO);
    T_CHECK(strstr(err, "not a regular file") != NULL);
    snprintf(junk, sizeof junk, "%s/short.plan", dir);
    f = fopen(junk, "wb");
    T_CHECK(f != NULL);
    if (f) fclose(f);
    T_EQ_I64(mgc_plan_read(junk, &q, err, sizeof err), MGC_PLAN_ERR_FORMAT);
    T_CHECK(strstr(err, "short.plan: empty file, not an mgc plan") != NULL);
    f = fopen(junk, "wb");
    if (f) {
        fwrite(before, 1, before_len / 2, f);
        fclose(f);
    }
    T_EQ_I64(mgc_plan_read(junk, &q, err, sizeof err), MGC_PLAN_ERR_FORMAT);
    T_CHECK(strstr(err, "short.plan: truncated plan") != NULL);
    fprintf(stderr, "e.g. %s\n", err);
    free(before);

    /* clean up */
    snprintf(junk, sizeof junk, "%s/keep", sub);
    unlink(junk);
    rmdir(sub);
    snprintf(junk, sizeof junk, "%s/short.plan", dir);
    unlink(junk);
    unlink(path);
    T_EQ_I64(rmdir(dir), 0);
    mgc_plan_free(p);
    mgc_plan_free(p2);
}

/* The plan fuzzer's seeds (tests/fuzz/plan-corpus) are plans of this format: a seed of
 * another version stops at the header's version check and reaches none of the sections'
 * checks (docs/testing.md, Fuzzing, says how to regenerate them). */
static void test_fuzz_seeds_current(void) {
    static const char *const seeds[] = {"tests/fuzz/plan-corpus/tiny-gpt.plan",
                                        "tests/fuzz/plan-corpus/tiny-gpt-dropout.plan",
                                        "tests/fuzz/plan-corpus/tiny-moe-pp2.plan"};
    for (size_t i = 0; i < sizeof seeds / sizeof seeds[0]; i++) {
        mgc_plan *q = NULL;
        char err[512] = "";
        mgc_plan_status rc = mgc_plan_read(seeds[i], &q, err, sizeof err);
        T_EQ_I64(rc, MGC_PLAN_OK);
        if (rc != MGC_PLAN_OK)
            fprintf(stderr, "  %s (regenerate the fuzz seeds: docs/testing.md, Fuzzing)\n", err);
        mgc_plan_free(q);
    }
}

/* A bias gradient fused into the op that writes the linear's output gradient (MGC_POF_COLSUM,
 * compiler/fusion.c) on an op of `kind` other than norm_bwd: the fuzz seed of tiny GPT has one a
 * layer; each rule broken once (the vector a float short or bf16, no bias gradient, the
 * dropout flag beside it, and `other`, a flag that op needs cleared or another width). */
static void colsum_rules(int kind, const char *frag, void (*other)(mgc_plan *p, mgc_plan_op *o)) {
    mgc_plan *p = NULL;
    char err[512] = "";
    const char *seed = "tests/fuzz/plan-corpus/tiny-gpt.plan";
    T_EQ_I64(mgc_plan_read(seed, &p, err, sizeof err), MGC_PLAN_OK);
    if (!p) return;
    int64_t seen = 0;
    for (int64_t s = 0; s < p->n_stages; s++)
        for (int64_t c = 0; c < p->stages[s].n_chunks; c++) {
            mgc_plan_chunk *ch = &p->stages[s].chunks[c];
            for (int64_t i = 0; i < ch->n_bwd; i++) {
                mgc_plan_op *o = &ch->bwd[i];
                if (o->kind != kind || !(o->flags & MGC_POF_COLSUM)) continue;
                T_CHECK(o->n_out == 2);
                if (seen++) continue;
                mgc_plan_tensor *db = &ch->tensors[o->out[1]];
                mgc_plan_tensor keep = *db;
                for (int k = 0; k < 2; k++) { /* a float short; bf16 (each a tensor that fits) */
                    if (k) db->dtype = MGC_DT_BF16, db->bytes = (uint64_t)db->dim[0] * 2;
                    else db->dim[0]--, db->bytes -= 4;
                    err[0] = 0;
                    T_EQ_I64(mgc_plan_validate(p, err, sizeof err), MGC_PLAN_ERR_INVALID);
                    T_CHECK(strstr(err, frag) != NULL);
                    *db = keep;
                }
                T_EQ_I64(mgc_plan_validate(p, err, sizeof err), MGC_PLAN_OK);
                BREAK(o->n_out, 1, frag); /* no bias gradient */
                BREAK(o->flags, o->flags | MGC_POF_DROPBWD, frag);
                other(p, o);
            }
        }
    T_CHECK(seen == 4); /* tiny GPT's four layers */
    mgc_plan_free(p);
}

/* the QKV projection's, in attention_bwd: q, k, v unfused */
static void attention_colsum_other(mgc_plan *p, mgc_plan_op *o) {
    char err[512];
    BREAK(o->flags, o->flags & ~MGC_POF_QKV, "nor a fused-qkv attention_bwd with an fp32 vector");
}

/* the MLP's first, in linear_dgrad_gelu: dh's width not the vector's */
static void dgrad_gelu_colsum_other(mgc_plan *p, mgc_plan_op *o) {
    char err[512];
    BREAK(o->iattr[2], o->iattr[2] + 1, "nor a linear_dgrad_gelu with an fp32 vector of dh's width");
}

int main(void) {
    test_crc();
    test_strings_and_names();
    test_round_trip();
    test_corruption();
    test_hostile();
    test_resealed_fuzz();
    test_validate();
    test_files();
    test_fuzz_seeds_current();
    colsum_rules(MGC_POP_ATTENTION_BWD, "nor a fused-qkv attention_bwd with an fp32 vector of qkv's width",
                 attention_colsum_other);
    colsum_rules(MGC_POP_LINEAR_DGRAD_GELU, "nor a linear_dgrad_gelu with an fp32 vector of dh's width",
                 dgrad_gelu_colsum_other);
    return t_summary("test_plan");
}
