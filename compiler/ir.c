/* ir.c - see ir.h.  Sections: name tables, graph storage, op costs, the
 * builder (config -> forward graph), queries and validation, output. */
#include "ir.h"

#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

/* ---- name tables --------------------------------------------------------- */

static const char *const dtype_names[] = {"fp32", "bf16", "fp16", "int64", "int32"};
static const uint32_t dtype_sizes[] = {4, 2, 2, 8, 4};
static const char *const axis_names[] = {
    "seq",   "batch", "tokens",  "hidden", "heads",    "kv_heads", "head_dim", "qkv",
    "qproj", "ffn",   "ffn_glu", "vocab",  "position", "experts",  "topk",     "rows"};
static const char *const axis_symbols[] = {"s", "b", "T",  "h", "a", "g", "d", "qkv",
                                           "q", "f", "2f", "V", "P", "E", "k", "R"};
static const char *const role_names[] = {"param", "tokens",   "labels", "loss_mask", "activation",
                                         "loss",  "aux_loss", "grad",   "doc_start", "expert_bias"};
static const char *const pclass_names[] = {
    "none",   "word_embedding", "position_embedding", "norm",        "attention", "mlp",
    "router", "expert",         "shared_expert",      "output_layer"};
static const char *const init_names[] = {"none", "normal", "scaled_normal", "ones", "zeros"};
static const char *const part_names[] = {"embedding", "attention", "mlp", "moe", "head"};
static const char *const op_names[] = {
    "embedding",    "dropout",        "norm",        "linear",       "qkv_split", "rope",
    "attention",    "dropout_add",    "gelu",        "swiglu",       "add",       "moe_route",
    "moe_dispatch", "grouped_linear", "moe_combine", "cross_entropy"};

#define COUNT_OF(a) (sizeof(a) / sizeof((a)[0]))
_Static_assert(COUNT_OF(dtype_names) == MGC_IR_DTYPE__COUNT, "dtype names");
_Static_assert(COUNT_OF(dtype_sizes) == MGC_IR_DTYPE__COUNT, "dtype sizes");
_Static_assert(COUNT_OF(axis_names) == MGC_IR_AXIS__COUNT, "axis names");
_Static_assert(COUNT_OF(axis_symbols) == MGC_IR_AXIS__COUNT, "axis symbols");
_Static_assert(COUNT_OF(role_names) == MGC_IR_ROLE__COUNT, "role names");
_Static_assert(COUNT_OF(pclass_names) == MGC_IR_PCLASS__COUNT, "pclass names");
_Static_assert(COUNT_OF(init_names) == MGC_IR_INIT_ZEROS + 1, "init names");
_Static_assert(COUNT_OF(part_names) == MGC_IR_PART__COUNT, "part names");
_Static_assert(COUNT_OF(op_names) == MGC_IR_OP__COUNT, "op names");

#define NAME_OF(table, i) ((unsigned)(i) < COUNT_OF(table) ? table[(unsigned)(i)] : "?")

const char *mgc_ir_dtype_name(mgc_ir_dtype t) {
    return NAME_OF(dtype_names, t);
}
uint32_t mgc_ir_dtype_size(mgc_ir_dtype t) {
    return (unsigned)t < COUNT_OF(dtype_sizes) ? dtype_sizes[t] : 0;
}
const char *mgc_ir_axis_name(mgc_ir_axis a) {
    return NAME_OF(axis_names, a);
}
const char *mgc_ir_axis_symbol(mgc_ir_axis a) {
    return NAME_OF(axis_symbols, a);
}
const char *mgc_ir_role_name(mgc_ir_role r) {
    return NAME_OF(role_names, r);
}
const char *mgc_ir_pclass_name(mgc_ir_pclass p) {
    return NAME_OF(pclass_names, p);
}
const char *mgc_ir_init_name(mgc_ir_init i) {
    return NAME_OF(init_names, i);
}
const char *mgc_ir_part_name(mgc_ir_part p) {
    return NAME_OF(part_names, p);
}
const char *mgc_ir_op_kind_name(mgc_ir_op_kind k) {
    return NAME_OF(op_names, k);
}

int mgc_ir_role_is_input(mgc_ir_role r) {
    return r == MGC_IR_ROLE_PARAM || r == MGC_IR_ROLE_TOKENS || r == MGC_IR_ROLE_LABELS ||
           r == MGC_IR_ROLE_LOSS_MASK || r == MGC_IR_ROLE_DOC_START || r == MGC_IR_ROLE_EXPERT_BIAS;
}

/* ---- graph storage ------------------------------------------------------- */

mgc_graph *mgc_ir_new(void) {
    mgc_graph *g = calloc(1, sizeof *g);
    if (!g) return NULL;
    g->tokens = g->labels = g->loss_mask = g->loss = g->doc_start = -1;
    g->word_embedding = g->output_weight = -1;
    return g;
}

void mgc_ir_free(mgc_graph *g) {
    if (!g) return;
    free(g->tensors);
    free(g->ops);
    free(g);
}

/* Record the first failure; later adds keep failing softly (ids of -1). */
static void fail(mgc_graph *g, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;
static void fail(mgc_graph *g, const char *fmt, ...) {
    if (!g->failed) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(g->fail_what, sizeof g->fail_what, fmt, ap);
        va_end(ap);
    }
    g->failed = 1;
}

/* Make room for `need` elements of `elem` bytes; 0 ok, -1 out of memory. */
static int grow(void **p, int32_t *cap, int64_t need, size_t elem) {
    if (need <= *cap) return 0;
    if (need > INT32_MAX) return -1;
    int64_t nc = *cap ? (int64_t)*cap * 2 : 64;
    while (nc < need)
        nc *= 2;
    if (nc > INT32_MAX) nc = INT32_MAX;
    if ((uint64_t)nc > SIZE_MAX / elem) return -1;
    void *q = realloc(*p, (size_t)nc * elem);
    if (!q) return -1;
    *p = q;
    *cap = (int32_t)nc;
    return 0;
}

int32_t mgc_ir_add_tensor(mgc_graph *g, const char *name, mgc_ir_role role, mgc_ir_dtype dtype,
                          int32_t rank, const mgc_ir_dim *dims) {
    if (!g) return -1;
    if (!name) name = "";
    if (strlen(name) >= MGC_IR_NAME_MAX) {
        fail(g, "tensor name too long: %.60s...", name);
        return -1;
    }
    if (rank < 0 || rank > MGC_IR_MAX_RANK || (unsigned)dtype >= MGC_IR_DTYPE__COUNT ||
        (unsigned)role >= MGC_IR_ROLE__COUNT || (rank > 0 && !dims)) {
        fail(g, "tensor '%s': bad rank, dtype or role", name);
        return -1;
    }
    uint64_t numel = 1, numel_u = 1, bytes = 0;
    int ovf = 0;
    for (int32_t i = 0; i < rank; i++) {
        if (dims[i].size < 1 || (unsigned)dims[i].axis >= MGC_IR_AXIS__COUNT) {
            fail(g, "tensor '%s': dim %d has size %" PRId64 " or a bad axis", name, (int)i,
                 dims[i].size);
            return -1;
        }
        uint64_t n = (uint64_t)dims[i].size, nu = n;
        if (dims[i].axis == MGC_IR_AXIS_VOCAB && g->dims.V > 0 && dims[i].size == g->dims.V_pad)
            nu = (uint64_t)g->dims.V;
        ovf |= mgc_ir_mul_u64(numel, n, &numel);
        ovf |= mgc_ir_mul_u64(numel_u, nu, &numel_u);
    }
    ovf |= mgc_ir_mul_u64(numel, dtype_sizes[dtype], &bytes);
    if (ovf) {
        fail(g, "tensor '%s' has more than 2^64 bytes", name);
        return -1;
    }
    if (grow((void **)&g->tensors, &g->cap_tensors, (int64_t)g->n_tensors + 1,
             sizeof *g->tensors)) {
        fail(g, "out of memory adding tensor '%s'", name);
        return -1;
    }
    mgc_ir_tensor *t = &g->tensors[g->n_tensors];
    memset(t, 0, sizeof *t);
    memcpy(t->name, name, strlen(name) + 1);
    t->role = role;
    t->dtype = dtype;
    t->rank = rank;
    for (int32_t i = 0; i < rank; i++)
        t->dim[i] = dims[i];
    t->layer = -1;
    t->producer = -1;
    t->numel = numel;
    t->numel_unpadded = numel_u;
    t->bytes = bytes;
    return g->n_tensors++;
}

/* ---- op costs ------------------------------------------------------------ */

/* GEMM FLOPs of one op as executed and by the model convention, and bytes
 * touched.  Ops that are not GEMMs cost 0 FLOPs.  Returns -1 on overflow. */
static int op_cost(const mgc_graph *g, const mgc_ir_op *op, uint64_t *flops, uint64_t *model,
                   uint64_t *bytes) {
    const mgc_ir_tensor *T = g->tensors;
    uint64_t f = 0, mf = 0, by = 0;
    int ovf = 0;
    switch (op->kind) {
    case MGC_IR_OP_LINEAR:
        if (op->n_in >= 2 && T[op->in[1]].rank == 2) {
            const mgc_ir_tensor *x = &T[op->in[0]], *w = &T[op->in[1]];
            uint64_t n = (uint64_t)w->dim[0].size, k = (uint64_t)w->dim[1].size;
            uint64_t m = x->numel / k; /* rows: x's leading dims */
            ovf |= mgc_ir_mul_u64(2 * m, n, &f);
            ovf |= mgc_ir_mul_u64(f, k, &f);
            mf = f;
        }
        break;
    case MGC_IR_OP_GROUPED_LINEAR:
        if (op->n_in >= 2 && T[op->in[1]].rank == 3) {
            const mgc_ir_tensor *x = &T[op->in[0]], *w = &T[op->in[1]];
            uint64_t n = (uint64_t)w->dim[1].size, k = (uint64_t)w->dim[2].size;
            uint64_t rows = x->numel / k, mrows = rows, nk;
            if (op->attr.moe.tokens > 0 && op->attr.moe.top_k > 0)
                ovf |= mgc_ir_mul_u64((uint64_t)op->attr.moe.tokens, (uint64_t)op->attr.moe.top_k,
                                      &mrows);
            ovf |= mgc_ir_mul_u64(n, k, &nk);
            ovf |= mgc_ir_mul_u64(nk, 2, &nk);
            ovf |= mgc_ir_mul_u64(rows, nk, &f);
            ovf |= mgc_ir_mul_u64(mrows, nk, &mf);
        }
        break;
    case MGC_IR_OP_ATTENTION:
        /* q [s,b,a,d], k [sk,b,g,d]: q k^T and p v are 2*b*a*s*sk*d each.
         * Causal: half of the score matrix is masked and flash attention
         * skips it, so the pair counts 2*b*a*s*sk*d (Megatron's convention). */
        if (op->n_in >= 2 && T[op->in[0]].rank == 4 && T[op->in[1]].rank == 4) {
            const mgc_ir_tensor *q = &T[op->in[0]], *k = &T[op->in[1]];
            uint64_t sk = (uint64_t)k->dim[0].size, per = 0; /* per = b*a*s*sk*d */
            uint64_t s = (uint64_t)q->dim[0].size, W = (uint64_t)op->attr.attention.window;
            if (op->attr.attention.causal && W > 0 && W < s && s == sk) {
                /* a sliding window of W keys: s W - W^2/2 pairs of the s^2/2 (the same
                 * continuous count), so 2 numel(q) W (2s - W) / s */
                uint64_t t = 0;
                ovf |= mgc_ir_mul_u64(q->numel, 2 * W, &t);
                ovf |= mgc_ir_mul_u64(t, 2 * s - W, &t);
                f = t / s;
            } else {
                ovf |= mgc_ir_mul_u64(q->numel, sk, &per);
                ovf |= mgc_ir_mul_u64(per, op->attr.attention.causal ? 2 : 4, &f);
            }
            mf = f;
        }
        break;
    default:
        break;
    }
    /* Bytes: every distinct input and output once; an op whose outputs are
     * all views moves nothing. */
    int all_views = op->n_out > 0;
    for (int i = 0; i < op->n_out; i++)
        if (!(T[op->out[i]].flags & MGC_IR_TF_VIEW)) all_views = 0;
    if (!all_views) {
        int32_t seen[MGC_IR_MAX_IN + MGC_IR_MAX_OUT];
        int ns = 0;
        for (int i = 0; i < op->n_in + op->n_out; i++) {
            int32_t id = i < op->n_in ? op->in[i] : op->out[i - op->n_in];
            int dup = 0;
            for (int j = 0; j < ns; j++)
                dup |= seen[j] == id;
            if (dup || (T[id].flags & MGC_IR_TF_VIEW)) continue;
            seen[ns++] = id;
            ovf |= mgc_ir_add_u64(by, T[id].bytes, &by);
        }
    }
    *flops = f;
    *model = mf;
    *bytes = by;
    return ovf ? -1 : 0;
}

/* 0 when the op's counts and ids are usable. */
static int op_shape_ok(const mgc_graph *g, const mgc_ir_op *op) {
    if ((unsigned)op->kind >= MGC_IR_OP__COUNT) return 0;
    if (op->n_in < 0 || op->n_in > MGC_IR_MAX_IN || op->n_out < 1 || op->n_out > MGC_IR_MAX_OUT)
        return 0;
    for (int i = 0; i < op->n_in; i++)
        if (op->in[i] < 0 || op->in[i] >= g->n_tensors) return 0;
    for (int i = 0; i < op->n_out; i++)
        if (op->out[i] < 0 || op->out[i] >= g->n_tensors) return 0;
    return 1;
}

int mgc_ir_op_update_cost(mgc_graph *g, int32_t id) {
    if (!g || id < 0 || id >= g->n_ops || !op_shape_ok(g, &g->ops[id])) return -1;
    mgc_ir_op *op = &g->ops[id];
    return op_cost(g, op, &op->flops, &op->model_flops, &op->bytes);
}

int32_t mgc_ir_add_op(mgc_graph *g, const mgc_ir_op *op) {
    if (!g || !op) return -1;
    char name[MGC_IR_NAME_MAX];
    memcpy(name, op->name, sizeof name);
    name[sizeof name - 1] = 0;
    if (!op_shape_ok(g, op)) {
        fail(g, "op '%s': bad kind, input or output", name);
        return -1;
    }
    for (int i = 0; i < op->n_out; i++) {
        const mgc_ir_tensor *t = &g->tensors[op->out[i]];
        if (t->producer >= 0 || mgc_ir_role_is_input(t->role)) {
            fail(g, "op '%s': output '%s' is already produced or a graph input", name, t->name);
            return -1;
        }
    }
    uint64_t f, mf, by;
    if (op_cost(g, op, &f, &mf, &by)) {
        fail(g, "op '%s': FLOP or byte count overflows 64 bits", name);
        return -1;
    }
    if (grow((void **)&g->ops, &g->cap_ops, (int64_t)g->n_ops + 1, sizeof *g->ops)) {
        fail(g, "out of memory adding op '%s'", name);
        return -1;
    }
    int32_t id = g->n_ops++;
    mgc_ir_op *o = &g->ops[id];
    *o = *op;
    memcpy(o->name, name, sizeof name);
    o->flops = f;
    o->model_flops = mf;
    o->bytes = by;
    for (int i = 0; i < o->n_out; i++)
        g->tensors[o->out[i]].producer = id;
    return id;
}

/* ---- the builder ----------------------------------------------------------- */

typedef struct bld {
    mgc_graph *g;
    const mgc_config *c;
    mgc_ir_dtype dt;  /* compute dtype */
    int32_t layer;    /* stamped on new tensors and ops */
    mgc_ir_part part; /* likewise */
} bld;

#define D(ax, n)                                                                                   \
    { MGC_IR_AXIS_##ax, (int64_t)(n) }
/* A dims array and its length, as two arguments. */
#define DIMS(...)                                                                                  \
    (const mgc_ir_dim[]){__VA_ARGS__},                                                             \
        (int32_t)(sizeof((mgc_ir_dim[]){__VA_ARGS__}) / sizeof(mgc_ir_dim))

static int32_t tensor_v(bld *b, mgc_ir_role role, mgc_ir_dtype dt, const mgc_ir_dim *dims,
                        int32_t rank, const char *fmt, va_list ap) {
    char name[MGC_IR_NAME_MAX];
    int n = vsnprintf(name, sizeof name, fmt, ap);
    if (n < 0 || (size_t)n >= sizeof name) {
        fail(b->g, "tensor name too long: %s...", name);
        return -1;
    }
    int32_t id = mgc_ir_add_tensor(b->g, name, role, dt, rank, dims);
    if (id >= 0) {
        b->g->tensors[id].layer = b->layer;
        b->g->tensors[id].part = b->part;
    }
    return id;
}

static int32_t tensor(bld *b, mgc_ir_role role, mgc_ir_dtype dt, uint32_t flags,
                      const mgc_ir_dim *dims, int32_t rank, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 7, 8)))
#endif
    ;
static int32_t tensor(bld *b, mgc_ir_role role, mgc_ir_dtype dt, uint32_t flags,
                      const mgc_ir_dim *dims, int32_t rank, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int32_t id = tensor_v(b, role, dt, dims, rank, fmt, ap);
    va_end(ap);
    if (id >= 0) b->g->tensors[id].flags = flags;
    return id;
}

static int32_t param(bld *b, mgc_ir_pclass pc, mgc_ir_init init, uint32_t flags,
                     const mgc_ir_dim *dims, int32_t rank, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 7, 8)))
#endif
    ;
static int32_t param(bld *b, mgc_ir_pclass pc, mgc_ir_init init, uint32_t flags,
                     const mgc_ir_dim *dims, int32_t rank, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int32_t id = tensor_v(b, MGC_IR_ROLE_PARAM, b->dt, dims, rank, fmt, ap);
    va_end(ap);
    if (id >= 0) {
        b->g->tensors[id].pclass = pc;
        b->g->tensors[id].init = init;
        b->g->tensors[id].flags = flags;
    }
    return id;
}

/* An activation shaped like tensor `src`'s first `keep` dims plus `last`. */
static int32_t like(bld *b, int32_t src, int32_t keep, mgc_ir_dim last, mgc_ir_dtype dt,
                    const char *module, const char *suffix) {
    if (src < 0) return -1;
    mgc_ir_dim dims[MGC_IR_MAX_RANK];
    const mgc_ir_tensor *t = &b->g->tensors[src];
    if (keep > t->rank) keep = t->rank;
    if (keep >= MGC_IR_MAX_RANK) {
        fail(b->g, "%s.%s: rank above %d", module, suffix, MGC_IR_MAX_RANK);
        return -1;
    }
    for (int32_t i = 0; i < keep; i++)
        dims[i] = t->dim[i];
    dims[keep] = last;
    return tensor(b, MGC_IR_ROLE_ACTIVATION, dt, 0, dims, keep + 1, "%s.%s", module, suffix);
}

/* Same shape as `src`. */
static int32_t same(bld *b, int32_t src, const char *module, const char *suffix) {
    if (src < 0) return -1;
    const mgc_ir_tensor *t = &b->g->tensors[src];
    mgc_ir_dim dims[MGC_IR_MAX_RANK];
    int32_t rank = t->rank;
    mgc_ir_dtype dt = t->dtype;
    for (int32_t i = 0; i < rank; i++)
        dims[i] = t->dim[i];
    return tensor(b, MGC_IR_ROLE_ACTIVATION, dt, 0, dims, rank, "%s.%s", module, suffix);
}

/* Append an op; -1 inputs or outputs (earlier failures) make it fail softly. */
static int32_t emit(bld *b, mgc_ir_op_kind kind, const char *module, const int32_t *in, int n_in,
                    const int32_t *out, int n_out, const mgc_ir_attrs *attr) {
    mgc_ir_op op;
    memset(&op, 0, sizeof op);
    int n = snprintf(op.name, sizeof op.name, "%s", module);
    if (n < 0 || (size_t)n >= sizeof op.name) {
        fail(b->g, "op name too long: %s...", op.name);
        return -1;
    }
    op.kind = kind;
    op.layer = b->layer;
    op.part = b->part;
    op.n_in = n_in;
    op.n_out = n_out;
    for (int i = 0; i < n_in; i++)
        op.in[i] = in[i];
    for (int i = 0; i < n_out; i++)
        op.out[i] = out[i];
    if (attr) op.attr = *attr;
    if (b->g->failed) return -1;
    return mgc_ir_add_op(b->g, &op);
}

static const char *fmt(char *buf, size_t n, const char *f, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;
static const char *fmt(char *buf, size_t n, const char *f, ...) {
    va_list ap;
    va_start(ap, f);
    vsnprintf(buf, n, f, ap);
    va_end(ap);
    return buf;
}

/* <module>: norm over h of x [.., h]: params <module>.weight (and .bias for
 * LayerNorm), output <module>.out. */
static int32_t norm_over(bld *b, const char *module, int32_t x, mgc_ir_dim over) {
    const mgc_model_cfg *m = &b->c->model;
    int32_t w = param(b, MGC_IR_PCLASS_NORM, MGC_IR_INIT_ONES, MGC_IR_TF_NORM, DIMS(over),
                      "%s.weight", module);
    int32_t in[3] = {x, w, -1};
    int n_in = 2;
    if (m->normalization == MGC_NORM_LAYERNORM)
        in[n_in++] = param(b, MGC_IR_PCLASS_NORM, MGC_IR_INIT_ZEROS,
                           MGC_IR_TF_NORM | MGC_IR_TF_BIAS, DIMS(over), "%s.bias", module);
    int32_t y = same(b, x, module, "out");
    mgc_ir_attrs at;
    memset(&at, 0, sizeof at);
    at.norm.kind = m->normalization;
    at.norm.eps = m->norm_eps;
    emit(b, MGC_IR_OP_NORM, module, in, n_in, &y, 1, &at);
    return y;
}

/* The model's norm over the residual stream's h channels. */
static int32_t norm(bld *b, const char *module, int32_t x) {
    return norm_over(b, module, x, (mgc_ir_dim)D(HIDDEN, b->g->dims.h));
}

/* <module>: y = x w^T (+ bias), contracting x's dims after the first `lead`;
 * the weight is [outd, ind] (created unless `shared_w` >= 0). */
static int32_t linear(bld *b, const char *module, int32_t x, int32_t lead, mgc_ir_pclass pc,
                      mgc_ir_init init, mgc_ir_dim outd, mgc_ir_dim ind, int with_bias,
                      int32_t shared_w) {
    int32_t w =
        shared_w >= 0 ? shared_w : param(b, pc, init, 0, DIMS(outd, ind), "%s.weight", module);
    int32_t in[3] = {x, w, -1};
    int n_in = 2;
    if (with_bias)
        in[n_in++] = param(b, pc, MGC_IR_INIT_ZEROS, MGC_IR_TF_BIAS, DIMS(outd), "%s.bias", module);
    int32_t y = like(b, x, lead, outd, b->dt, module, "out");
    mgc_ir_attrs at;
    memset(&at, 0, sizeof at);
    at.linear.tied = shared_w >= 0;
    emit(b, MGC_IR_OP_LINEAR, module, in, n_in, &y, 1, &at);
    return y;
}

/* <module>: per-expert y_e = x_e w_e^T (+ bias_e) over rows grouped by expert. */
static int32_t grouped_linear(bld *b, const char *module, int32_t x, int32_t tpe, mgc_ir_init init,
                              mgc_ir_dim outd, mgc_ir_dim ind, int with_bias,
                              const mgc_ir_attrs *moe) {
    int64_t E = b->g->dims.E;
    int32_t w = param(b, MGC_IR_PCLASS_EXPERT, init, 0, DIMS(D(EXPERTS, E), outd, ind), "%s.weight",
                      module);
    int32_t in[4] = {x, w, tpe, -1};
    int n_in = 3;
    if (with_bias)
        in[n_in++] = param(b, MGC_IR_PCLASS_EXPERT, MGC_IR_INIT_ZEROS, MGC_IR_TF_BIAS,
                           DIMS(D(EXPERTS, E), outd), "%s.bias", module);
    int32_t y = like(b, x, 1, outd, b->dt, module, "out");
    emit(b, MGC_IR_OP_GROUPED_LINEAR, module, in, n_in, &y, 1, moe);
    return y;
}

/* <module>: gelu(x) or swiglu(x): [.., f or 2f] -> [.., f]. */
static int32_t activation(bld *b, const char *module, int32_t x, int64_t f) {
    int swiglu = b->c->model.activation == MGC_ACT_SWIGLU;
    int32_t rank = x >= 0 ? b->g->tensors[x].rank : 1;
    int32_t y = like(b, x, rank - 1, (mgc_ir_dim)D(FFN, f), b->dt, module, "out");
    emit(b, swiglu ? MGC_IR_OP_SWIGLU : MGC_IR_OP_GELU, module, &x, 1, &y, 1, NULL);
    return y;
}

/* <module>: the dense MLP fc1 -> activation -> fc2 of width f on x [s,b,h]. */
static int32_t mlp(bld *b, const char *module, int32_t x, int64_t f, mgc_ir_pclass pc) {
    const mgc_model_cfg *m = &b->c->model;
    int64_t h = b->g->dims.h;
    int swiglu = m->activation == MGC_ACT_SWIGLU;
    char mod[MGC_IR_NAME_MAX];
    mgc_ir_dim up = swiglu ? (mgc_ir_dim)D(FFN_GLU, 2 * f) : (mgc_ir_dim)D(FFN, f);
    int32_t y = linear(b, fmt(mod, sizeof mod, "%s.linear_fc1", module), x, 2, pc,
                       MGC_IR_INIT_NORMAL, up, (mgc_ir_dim)D(HIDDEN, h), m->add_bias_linear, -1);
    y = activation(b, fmt(mod, sizeof mod, "%s.activation", module), y, f);
    return linear(b, fmt(mod, sizeof mod, "%s.linear_fc2", module), y, 2, pc,
                  MGC_IR_INIT_SCALED_NORMAL, (mgc_ir_dim)D(HIDDEN, h), (mgc_ir_dim)D(FFN, f),
                  m->add_bias_linear, -1);
}

static int32_t dropout_add(bld *b, const char *module, int32_t x, int32_t residual) {
    int32_t y = same(b, residual, module, "out");
    int32_t in[2] = {x, residual};
    mgc_ir_attrs at;
    memset(&at, 0, sizeof at);
    at.dropout.p = b->c->model.hidden_dropout;
    emit(b, MGC_IR_OP_DROPOUT_ADD, module, in, 2, &y, 1, &at);
    return y;
}

/* The MoE block on the normed input xn [s,b,h] of layer prefix P. */
static int32_t moe_block(bld *b, const char *P, int32_t xn) {
    const mgc_config *c = b->c;
    const mgc_ir_dims *dm = &b->g->dims;
    int swiglu = c->model.activation == MGC_ACT_SWIGLU;
    int bias = c->model.add_bias_linear;
    char mod[MGC_IR_NAME_MAX];
    mgc_ir_attrs at;
    memset(&at, 0, sizeof at);
    at.moe.experts = (int32_t)dm->E;
    at.moe.top_k = (int32_t)dm->k;
    at.moe.score = c->moe.router_score;
    at.moe.drop_policy = c->moe.drop_policy;
    at.moe.tokens = dm->T;
    at.moe.capacity = dm->C;
    at.moe.rows = dm->R;
    at.moe.max_rows_per_expert = dm->C > 0 ? dm->C : dm->T;
    at.moe.aux_coeff = c->moe.aux_loss_coeff;
    at.moe.aux_scope = c->moe.aux_loss_scope;
    at.moe.z_coeff = c->moe.z_loss_coeff;
    at.moe.topk_scale = c->moe.router_topk_scaling_factor;
    at.moe.groups = (int32_t)c->moe.router_num_groups;
    at.moe.group_topk = (int32_t)c->moe.router_group_topk;
    at.moe.bias_rate = c->moe.expert_bias_update_rate;

    /* router: logits [s,b,E] -> top-k probs and expert ids [T,k] */
    int32_t logits = linear(b, fmt(mod, sizeof mod, "%s.mlp.router", P), xn, 2,
                            MGC_IR_PCLASS_ROUTER, MGC_IR_INIT_NORMAL, (mgc_ir_dim)D(EXPERTS, dm->E),
                            (mgc_ir_dim)D(HIDDEN, dm->h), 0, -1);
    fmt(mod, sizeof mod, "%s.mlp.router.route", P);
    int32_t out[4];
    int n_out = 0;
    int32_t probs = out[n_out++] = tensor(b, MGC_IR_ROLE_ACTIVATION, MGC_IR_DTYPE_FP32, 0,
                                          DIMS(D(TOKENS, dm->T), D(TOPK, dm->k)), "%s.probs", mod);
    int32_t ids = out[n_out++] =
        tensor(b, MGC_IR_ROLE_ACTIVATION, MGC_IR_DTYPE_INT32, MGC_IR_TF_NODIFF,
               DIMS(D(TOKENS, dm->T), D(TOPK, dm->k)), "%s.experts", mod);
    if (at.moe.aux_coeff > 0)
        out[n_out++] =
            tensor(b, MGC_IR_ROLE_AUX_LOSS, MGC_IR_DTYPE_FP32, 0, NULL, 0, "%s.aux_loss", mod);
    if (at.moe.z_coeff > 0)
        out[n_out++] =
            tensor(b, MGC_IR_ROLE_AUX_LOSS, MGC_IR_DTYPE_FP32, 0, NULL, 0, "%s.z_loss", mod);
    /* the aux-loss-free expert bias: an input the runtime keeps (not a parameter) */
    int32_t rin[2] = {logits, -1};
    if (at.moe.bias_rate > 0)
        rin[1] = tensor(b, MGC_IR_ROLE_EXPERT_BIAS, MGC_IR_DTYPE_FP32, MGC_IR_TF_NODIFF,
                        DIMS(D(EXPERTS, dm->E)), "%s.mlp.router.expert_bias", P);
    emit(b, MGC_IR_OP_MOE_ROUTE, mod, rin, rin[1] >= 0 ? 2 : 1, out, n_out, &at);

    /* dispatch: token rows grouped by expert [R,h] and rows per expert [E] */
    fmt(mod, sizeof mod, "%s.mlp.token_dispatcher.dispatch", P);
    int32_t rows = tensor(b, MGC_IR_ROLE_ACTIVATION, b->dt, 0,
                          DIMS(D(ROWS, dm->R), D(HIDDEN, dm->h)), "%s.rows", mod);
    int32_t tpe = tensor(b, MGC_IR_ROLE_ACTIVATION, MGC_IR_DTYPE_INT64, MGC_IR_TF_NODIFF,
                         DIMS(D(EXPERTS, dm->E)), "%s.tokens_per_expert", mod);
    int32_t din[2] = {xn, ids}, dout[2] = {rows, tpe};
    emit(b, MGC_IR_OP_MOE_DISPATCH, mod, din, 2, dout, 2, &at);

    /* experts: grouped fc1 -> activation -> grouped fc2 */
    mgc_ir_dim up = swiglu ? (mgc_ir_dim)D(FFN_GLU, 2 * dm->f_e) : (mgc_ir_dim)D(FFN, dm->f_e);
    int32_t y = grouped_linear(b, fmt(mod, sizeof mod, "%s.mlp.experts.linear_fc1", P), rows, tpe,
                               MGC_IR_INIT_NORMAL, up, (mgc_ir_dim)D(HIDDEN, dm->h), bias, &at);
    y = activation(b, fmt(mod, sizeof mod, "%s.mlp.experts.activation", P), y, dm->f_e);
    y = grouped_linear(b, fmt(mod, sizeof mod, "%s.mlp.experts.linear_fc2", P), y, tpe,
                       MGC_IR_INIT_SCALED_NORMAL, (mgc_ir_dim)D(HIDDEN, dm->h),
                       (mgc_ir_dim)D(FFN, dm->f_e), bias, &at);

    /* combine: weighted sum of each token's k rows back to [s,b,h] */
    fmt(mod, sizeof mod, "%s.mlp.token_dispatcher.combine", P);
    int32_t comb = same(b, xn, mod, "out");
    int32_t cin[3] = {y, probs, ids};
    emit(b, MGC_IR_OP_MOE_COMBINE, mod, cin, 3, &comb, 1, &at);

    if (dm->f_s > 0) {
        int32_t sh = mlp(b, fmt(mod, sizeof mod, "%s.mlp.shared_experts", P), xn, dm->f_s,
                         MGC_IR_PCLASS_SHARED_EXPERT);
        fmt(mod, sizeof mod, "%s.mlp.add_shared", P);
        int32_t sum = same(b, comb, mod, "out");
        int32_t ain[2] = {comb, sh};
        emit(b, MGC_IR_OP_ADD, mod, ain, 2, &sum, 1, NULL);
        comb = sum;
    }
    return comb;
}

/* Rotary embedding on x [s,b,heads,d]. */
static int32_t rope(bld *b, const char *module, int32_t x) {
    int32_t y = same(b, x, module, "out");
    mgc_ir_attrs at;
    memset(&at, 0, sizeof at);
    at.rope.rotary_dim = (int32_t)b->g->dims.rotary_dim;
    at.rope.base = b->c->model.rotary_base;
    /* data.reset_position_ids: positions counted from each token's document start */
    int32_t in[2] = {x, b->g->doc_start};
    emit(b, MGC_IR_OP_ROPE, module, in, b->c->data.reset_position_ids ? 2 : 1, &y, 1, &at);
    return y;
}

/* Decoder layer l on the residual stream x [s,b,h]; returns its output. */
static int32_t decoder_layer(bld *b, int32_t l, int32_t x, int is_moe) {
    const mgc_model_cfg *m = &b->c->model;
    const mgc_ir_dims *dm = &b->g->dims;
    char P[40], mod[MGC_IR_NAME_MAX];
    snprintf(P, sizeof P, "decoder.layers.%d", (int)l);
    b->layer = l;
    b->part = MGC_IR_PART_ATTENTION;

    int32_t xn = norm(b, fmt(mod, sizeof mod, "%s.input_layernorm", P), x);
    int32_t qkv =
        linear(b, fmt(mod, sizeof mod, "%s.self_attention.linear_qkv", P), xn, 2,
               MGC_IR_PCLASS_ATTENTION, MGC_IR_INIT_NORMAL, (mgc_ir_dim)D(QKV, dm->q + 2 * dm->kv),
               (mgc_ir_dim)D(HIDDEN, dm->h), m->add_qkv_bias, -1);
    /* q, k, v are strided views of the fused projection */
    fmt(mod, sizeof mod, "%s.self_attention", P);
    int32_t qkv3[3];
    qkv3[0] = tensor(b, MGC_IR_ROLE_ACTIVATION, b->dt, MGC_IR_TF_VIEW,
                     DIMS(D(SEQ, dm->s), D(BATCH, dm->b), D(HEADS, dm->a), D(HEAD_DIM, dm->d)),
                     "%s.query", mod);
    qkv3[1] = tensor(b, MGC_IR_ROLE_ACTIVATION, b->dt, MGC_IR_TF_VIEW,
                     DIMS(D(SEQ, dm->s), D(BATCH, dm->b), D(KV_HEADS, dm->g), D(HEAD_DIM, dm->d)),
                     "%s.key", mod);
    qkv3[2] = tensor(b, MGC_IR_ROLE_ACTIVATION, b->dt, MGC_IR_TF_VIEW,
                     DIMS(D(SEQ, dm->s), D(BATCH, dm->b), D(KV_HEADS, dm->g), D(HEAD_DIM, dm->d)),
                     "%s.value", mod);
    emit(b, MGC_IR_OP_QKV_SPLIT, fmt(mod, sizeof mod, "%s.self_attention.split_qkv", P), &qkv, 1,
         qkv3, 3, NULL);
    if (m->qk_layernorm) { /* each head's d channels, before the rotation (Qwen3) */
        qkv3[0] = norm_over(b, fmt(mod, sizeof mod, "%s.self_attention.q_layernorm", P), qkv3[0],
                            (mgc_ir_dim)D(HEAD_DIM, dm->d));
        qkv3[1] = norm_over(b, fmt(mod, sizeof mod, "%s.self_attention.k_layernorm", P), qkv3[1],
                            (mgc_ir_dim)D(HEAD_DIM, dm->d));
    }
    if (m->position_embedding == MGC_POS_ROTARY) {
        qkv3[0] = rope(b, fmt(mod, sizeof mod, "%s.self_attention.rotary_q", P), qkv3[0]);
        qkv3[1] = rope(b, fmt(mod, sizeof mod, "%s.self_attention.rotary_k", P), qkv3[1]);
    }
    fmt(mod, sizeof mod, "%s.self_attention.core_attention", P);
    int32_t ctx = same(b, qkv3[0], mod, "out");
    mgc_ir_attrs at;
    memset(&at, 0, sizeof at);
    at.attention.causal = 1;
    at.attention.heads = (int32_t)dm->a;
    at.attention.groups = (int32_t)dm->g;
    at.attention.head_dim = (int32_t)dm->d;
    at.attention.scale = 1.0 / sqrt((double)dm->d);
    at.attention.dropout = m->attention_dropout;
    /* the sliding window (at s or more keys: none), on the listed layers when there is a list */
    at.attention.window = m->window_size < dm->s ? m->window_size : 0;
    if (b->c->given[MGC_KEY_MODEL_WINDOW_LAYERS]) {
        int listed = 0;
        for (int i = 0; i < m->window_layers.n; i++)
            listed |= m->window_layers.v[i] == l;
        if (!listed) at.attention.window = 0;
    }
    int32_t ain[4] = {qkv3[0], qkv3[1], qkv3[2], b->g->doc_start};
    emit(b, MGC_IR_OP_ATTENTION, mod, ain, b->c->data.reset_attention_mask ? 4 : 3, &ctx, 1, &at);
    int32_t o =
        linear(b, fmt(mod, sizeof mod, "%s.self_attention.linear_proj", P), ctx, 2,
               MGC_IR_PCLASS_ATTENTION, MGC_IR_INIT_SCALED_NORMAL, (mgc_ir_dim)D(HIDDEN, dm->h),
               (mgc_ir_dim)D(QPROJ, dm->q), m->add_bias_linear, -1);
    x = dropout_add(b, fmt(mod, sizeof mod, "%s.self_attn_bda", P), o, x);

    b->part = is_moe ? MGC_IR_PART_MOE : MGC_IR_PART_MLP;
    xn = norm(b, fmt(mod, sizeof mod, "%s.pre_mlp_layernorm", P), x);
    int32_t y = is_moe ? moe_block(b, P, xn)
                       : mlp(b, fmt(mod, sizeof mod, "%s.mlp", P), xn, dm->f, MGC_IR_PCLASS_MLP);
    return dropout_add(b, fmt(mod, sizeof mod, "%s.mlp_bda", P), y, x);
}

/* Fill g->dims from the config; 0 ok, else writes what overflowed. */
static int fill_dims(const mgc_config *c, mgc_ir_dims *dm, const char **what) {
    const mgc_model_cfg *m = &c->model;
    uint64_t t;
    memset(dm, 0, sizeof *dm);
    dm->s = m->seq_length;
    dm->b = c->training.micro_batch_size;
    dm->h = m->hidden_size;
    dm->a = m->num_heads;
    dm->g = m->num_query_groups;
    dm->d = m->head_dim;
    dm->q = dm->a * dm->d;  /* <= 2^32: schema ranges */
    dm->kv = dm->g * dm->d; /* likewise */
    dm->f = m->ffn_hidden_size;
    dm->V = m->vocab_size;
    dm->V_pad = c->derived.padded_vocab_size;
    dm->P = m->position_embedding == MGC_POS_LEARNED ? m->max_position_embeddings : 0;
    dm->L = m->num_layers;
    if (mgc_ir_mul_u64((uint64_t)dm->s, (uint64_t)dm->b, &t) || t > INT64_MAX) {
        *what = "tokens per microbatch (seq_length * micro_batch_size)";
        return -1;
    }
    dm->T = (int64_t)t;
    if (m->position_embedding == MGC_POS_ROTARY) {
        /* Megatron: int(kv_channels * rotary_percent).  Rounded to nearest
         * here: check.c accepts products within 1e-6 of an even integer
         * (0.58 * 100 is 57.99999999999999 in binary: truncation gives 57). */
        dm->rotary_dim = (int64_t)floor((double)dm->d * m->rotary_percent + 0.5);
    }
    if (c->moe.num_experts > 0) {
        dm->E = c->moe.num_experts;
        dm->k = c->moe.top_k;
        dm->f_e = c->moe.ffn_hidden_size;
        for (int64_t l = 0; l < dm->L; l++)
            dm->L_moe += c->derived.is_moe_layer[l] != 0;
        if (mgc_ir_mul_u64((uint64_t)c->moe.shared_experts, (uint64_t)c->moe.shared_ffn_hidden_size,
                           &t) ||
            t > INT64_MAX / 2) {
            *what = "shared expert width (shared_experts * shared_expert_ffn_hidden_size)";
            return -1;
        }
        dm->f_s = (int64_t)t;
        uint64_t tk;
        if (mgc_ir_mul_u64((uint64_t)dm->T, (uint64_t)dm->k, &tk) || tk > INT64_MAX) {
            *what = "routed token rows (tokens * top_k)";
            return -1;
        }
        if (c->moe.capacity_factor > 0) {
            /* Megatron's get_capacity: ceil(num_tokens * topk / E * capacity_factor). */
            double cap = ceil((double)tk / (double)dm->E * c->moe.capacity_factor);
            if (!(cap < 9.0e18)) {
                *what = "expert capacity";
                return -1;
            }
            dm->C = cap < 1 ? 1 : (int64_t)cap;
            if (mgc_ir_mul_u64((uint64_t)dm->E, (uint64_t)dm->C, &t) || t > INT64_MAX) {
                *what = "padded expert rows (experts * capacity)";
                return -1;
            }
            dm->R = (int64_t)t;
        } else {
            dm->R = (int64_t)tk;
        }
    }
    return 0;
}

static mgc_ir_dtype compute_dtype(int precision) {
    switch (precision) {
    case MGC_PREC_FP32:
        return MGC_IR_DTYPE_FP32;
    case MGC_PREC_FP16:
        return MGC_IR_DTYPE_FP16;
    default:
        return MGC_IR_DTYPE_BF16;
    }
}

mgc_graph *mgc_ir_build(const mgc_config *c, mgc_diags *d) {
    if (!c) return NULL;
    const mgc_model_cfg *m = &c->model;
    if (c->derived.padded_vocab_size < m->vocab_size || m->vocab_size < 1 ||
        (c->moe.num_experts > 0 && !c->derived.is_moe_layer) || m->head_dim < 1 ||
        m->num_query_groups < 1 || m->ffn_hidden_size < 1) {
        mgc_diag(d, MGC_SEV_ERROR, c->file_loc,
                 "call mgc_config_finalize() first and check its errors",
                 "internal: the model graph needs a finalized configuration");
        return NULL;
    }
    mgc_graph *g = mgc_ir_new();
    if (!g) {
        mgc_diag(d, MGC_SEV_ERROR, c->file_loc, NULL, "out of memory building the model graph");
        return NULL;
    }
    const char *what = NULL;
    if (fill_dims(c, &g->dims, &what)) {
        mgc_diag(d, MGC_SEV_ERROR, c->file_loc,
                 "reduce model.seq_length, training.micro_batch_size or the model widths",
                 "the model is too large to describe: %s overflows 64 bits", what);
        mgc_ir_free(g);
        return NULL;
    }
    const mgc_ir_dims *dm = &g->dims;
    bld b = {g, c, compute_dtype(c->training.precision), -1, MGC_IR_PART_EMBEDDING};
    g->dtype = b.dt;

    /* graph inputs */
    g->tokens = tensor(&b, MGC_IR_ROLE_TOKENS, MGC_IR_DTYPE_INT64, MGC_IR_TF_NODIFF,
                       DIMS(D(SEQ, dm->s), D(BATCH, dm->b)), "tokens");
    b.part = MGC_IR_PART_HEAD;
    g->labels = tensor(&b, MGC_IR_ROLE_LABELS, MGC_IR_DTYPE_INT64, MGC_IR_TF_NODIFF,
                       DIMS(D(SEQ, dm->s), D(BATCH, dm->b)), "labels");
    g->loss_mask = tensor(&b, MGC_IR_ROLE_LOSS_MASK, MGC_IR_DTYPE_FP32, MGC_IR_TF_NODIFF,
                          DIMS(D(SEQ, dm->s), D(BATCH, dm->b)), "loss_mask");
    if (c->data.reset_attention_mask || c->data.reset_position_ids) { /* attention, rope */
        b.part = MGC_IR_PART_ATTENTION;
        g->doc_start = tensor(&b, MGC_IR_ROLE_DOC_START, MGC_IR_DTYPE_INT32, MGC_IR_TF_NODIFF,
                              DIMS(D(SEQ, dm->s), D(BATCH, dm->b)), "doc_start");
    }

    /* embedding */
    b.part = MGC_IR_PART_EMBEDDING;
    g->word_embedding =
        param(&b, MGC_IR_PCLASS_WORD_EMBEDDING, MGC_IR_INIT_NORMAL, 0,
              DIMS(D(VOCAB, dm->V_pad), D(HIDDEN, dm->h)), "embedding.word_embeddings.weight");
    int32_t ein[4] = {g->tokens, g->word_embedding, -1, -1};
    int n_ein = 2;
    if (dm->P > 0)
        ein[n_ein++] = param(&b, MGC_IR_PCLASS_POS_EMBEDDING, MGC_IR_INIT_NORMAL, 0,
                             DIMS(D(POSITION, dm->P), D(HIDDEN, dm->h)),
                             "embedding.position_embeddings.weight");
    if (dm->P > 0 && c->data.reset_position_ids) /* positions from each document's start */
        ein[n_ein++] = g->doc_start;
    int32_t x = tensor(&b, MGC_IR_ROLE_ACTIVATION, b.dt, 0,
                       DIMS(D(SEQ, dm->s), D(BATCH, dm->b), D(HIDDEN, dm->h)), "embedding.out");
    mgc_ir_attrs at;
    memset(&at, 0, sizeof at);
    at.embedding.learned_positions = dm->P > 0;
    emit(&b, MGC_IR_OP_EMBEDDING, "embedding", ein, n_ein, &x, 1, &at);
    int32_t y = same(&b, x, "embedding.dropout", "out");
    memset(&at, 0, sizeof at);
    at.dropout.p = m->hidden_dropout;
    emit(&b, MGC_IR_OP_DROPOUT, "embedding.dropout", &x, 1, &y, 1, &at);
    x = y;

    /* decoder */
    for (int64_t l = 0; l < dm->L && !g->failed; l++) {
        int is_moe = dm->E > 0 && c->derived.is_moe_layer[l];
        x = decoder_layer(&b, (int32_t)l, x, is_moe);
    }

    /* head */
    b.layer = -1;
    b.part = MGC_IR_PART_HEAD;
    x = norm(&b, "decoder.final_layernorm", x);
    int32_t logits =
        linear(&b, "output_layer", x, 2, MGC_IR_PCLASS_OUTPUT_LAYER, MGC_IR_INIT_NORMAL,
               (mgc_ir_dim)D(VOCAB, dm->V_pad), (mgc_ir_dim)D(HIDDEN, dm->h), 0,
               m->tie_embeddings ? g->word_embedding : -1);
    if (logits >= 0 && g->n_ops > 0) g->output_weight = g->ops[g->n_ops - 1].in[1];
    g->loss = tensor(&b, MGC_IR_ROLE_LOSS, MGC_IR_DTYPE_FP32, 0, NULL, 0, "loss");
    int32_t lin[3] = {logits, g->labels, g->loss_mask};
    emit(&b, MGC_IR_OP_CROSS_ENTROPY, "cross_entropy", lin, 3, &g->loss, 1, NULL);

    if (g->failed) {
        mgc_diag(d, MGC_SEV_ERROR, c->file_loc,
                 "reduce model.seq_length, training.micro_batch_size or the model widths",
                 "cannot build the model graph: %s", g->fail_what);
        mgc_ir_free(g);
        return NULL;
    }
    return g;
}

/* ---- queries and validation ------------------------------------------------ */

int32_t mgc_ir_producer(const mgc_graph *g, int32_t t) {
    if (!g || t < 0 || t >= g->n_tensors) return -1;
    return g->tensors[t].producer;
}

int32_t mgc_ir_consumers(const mgc_graph *g, int32_t t, int32_t *ops, int32_t max) {
    int32_t n = 0;
    if (!g) return 0;
    for (int32_t i = 0; i < g->n_ops; i++) {
        const mgc_ir_op *op = &g->ops[i];
        for (int j = 0; j < op->n_in; j++) {
            if (op->in[j] != t) continue;
            if (n < max && ops) ops[n] = i;
            n++;
            break; /* an op reading t twice counts once */
        }
    }
    return n;
}

int32_t mgc_ir_find_tensor(const mgc_graph *g, const char *name) {
    if (!g || !name) return -1;
    for (int32_t i = 0; i < g->n_tensors; i++)
        if (strcmp(g->tensors[i].name, name) == 0) return i;
    return -1;
}

int mgc_ir_layer_ops(const mgc_graph *g, int32_t layer, int32_t *first, int32_t *end) {
    int32_t f = -1, e = -1;
    if (!g || layer < 0) return -1;
    for (int32_t i = 0; i < g->n_ops; i++) {
        if (g->ops[i].layer != layer) continue;
        if (f < 0) f = i;
        e = i + 1;
    }
    if (f < 0) return -1;
    if (first) *first = f;
    if (end) *end = e;
    return 0;
}

/* LINEAR: x [.., k] (trailing dims multiply to k), w [n, k], y [.., n] with
 * the same rows.  GROUPED_LINEAR: x [R, k], w [E, n, k], y [R, n]. */
static int gemm_shapes_ok(const mgc_graph *g, const mgc_ir_op *op) {
    if (op->n_in < 2) return 0;
    const mgc_ir_tensor *x = &g->tensors[op->in[0]], *w = &g->tensors[op->in[1]];
    const mgc_ir_tensor *y = &g->tensors[op->out[0]];
    int grouped = op->kind == MGC_IR_OP_GROUPED_LINEAR;
    if (w->rank != (grouped ? 3 : 2) || y->rank < 1) return 0;
    uint64_t n = (uint64_t)w->dim[w->rank - 2].size, k = (uint64_t)w->dim[w->rank - 1].size;
    if (x->numel % k != 0 || (uint64_t)y->dim[y->rank - 1].size != n) return 0;
    if (y->numel / n != x->numel / k) return 0;
    if (grouped && (x->rank != 2 || (uint64_t)x->dim[1].size != k)) return 0;
    return 1;
}

static int cmp_names(const void *a, const void *b) {
    const mgc_ir_tensor *x = *(const mgc_ir_tensor *const *)a,
                        *y = *(const mgc_ir_tensor *const *)b;
    return strcmp(x->name, y->name);
}

int mgc_ir_validate(const mgc_graph *g, mgc_diags *d) {
    const mgc_loc loc = {"<ir>", 0, 0};
    int before = d->errors;
    if (!g) {
        mgc_diag(d, MGC_SEV_ERROR, loc, NULL, "no graph");
        return -1;
    }
    for (int32_t i = 0; i < g->n_tensors; i++) {
        const mgc_ir_tensor *t = &g->tensors[i];
        uint64_t n = 1;
        int bad = t->rank < 0 || t->rank > MGC_IR_MAX_RANK;
        for (int32_t j = 0; !bad && j < t->rank; j++) {
            bad |= t->dim[j].size < 1 || (unsigned)t->dim[j].axis >= MGC_IR_AXIS__COUNT;
            bad |= mgc_ir_mul_u64(n, (uint64_t)t->dim[j].size, &n);
        }
        if (bad || n != t->numel)
            mgc_diag(d, MGC_SEV_ERROR, loc, NULL, "tensor %d '%s': bad rank, dims or numel", (int)i,
                     t->name);
        int input = mgc_ir_role_is_input(t->role);
        if (input && t->producer >= 0)
            mgc_diag(d, MGC_SEV_ERROR, loc, NULL, "graph input %d '%s' has a producer (op %d)",
                     (int)i, t->name, (int)t->producer);
        if (!input && (t->producer < 0 || t->producer >= g->n_ops))
            mgc_diag(d, MGC_SEV_ERROR, loc, NULL, "tensor %d '%s' (%s) has no producer", (int)i,
                     t->name, mgc_ir_role_name(t->role));
    }
    for (int32_t i = 0; i < g->n_ops; i++) {
        const mgc_ir_op *op = &g->ops[i];
        if (!op_shape_ok(g, op)) {
            mgc_diag(d, MGC_SEV_ERROR, loc, NULL, "op %d '%s': bad kind, counts or tensor ids",
                     (int)i, op->name);
            continue;
        }
        for (int j = 0; j < op->n_in; j++) {
            const mgc_ir_tensor *t = &g->tensors[op->in[j]];
            if (mgc_ir_role_is_input(t->role)) continue;
            if (t->producer < 0 || t->producer >= i)
                mgc_diag(d, MGC_SEV_ERROR, loc, NULL,
                         "op %d '%s': input '%s' is not produced by an earlier op", (int)i,
                         op->name, t->name);
        }
        if ((op->kind == MGC_IR_OP_LINEAR || op->kind == MGC_IR_OP_GROUPED_LINEAR) &&
            !gemm_shapes_ok(g, op))
            mgc_diag(d, MGC_SEV_ERROR, loc, NULL,
                     "op %d '%s': input, weight and output shapes do not match", (int)i, op->name);
        for (int j = 0; j < op->n_out; j++) {
            const mgc_ir_tensor *t = &g->tensors[op->out[j]];
            if (t->producer != i)
                mgc_diag(d, MGC_SEV_ERROR, loc, NULL,
                         "op %d '%s': output '%s' names op %d as its producer", (int)i, op->name,
                         t->name, (int)t->producer);
        }
    }
    /* unique names */
    if (g->n_tensors > 1) {
        const mgc_ir_tensor **v = malloc((size_t)g->n_tensors * sizeof *v);
        if (!v) {
            mgc_diag(d, MGC_SEV_ERROR, loc, NULL, "out of memory validating the graph");
        } else {
            for (int32_t i = 0; i < g->n_tensors; i++)
                v[i] = &g->tensors[i];
            qsort(v, (size_t)g->n_tensors, sizeof *v, cmp_names);
            for (int32_t i = 1; i < g->n_tensors; i++)
                if (strcmp(v[i - 1]->name, v[i]->name) == 0)
                    mgc_diag(d, MGC_SEV_ERROR, loc, NULL, "two tensors are named '%s'", v[i]->name);
            free(v);
        }
    }
    return d->errors > before ? -1 : 0;
}

/* ---- output ------------------------------------------------------------------ */

static void print_shape(FILE *out, const mgc_ir_tensor *t) {
    fprintf(out, "%s[", mgc_ir_dtype_name(t->dtype));
    for (int32_t i = 0; i < t->rank; i++)
        fprintf(out, "%s%s=%" PRId64, i ? ", " : "", mgc_ir_axis_symbol(t->dim[i].axis),
                t->dim[i].size);
    fputc(']', out);
}

static void print_ref(FILE *out, const mgc_graph *g, int32_t id) {
    const mgc_ir_tensor *t = &g->tensors[id];
    fprintf(out, "%%%d %s: ", (int)id, t->name);
    print_shape(out, t);
}

static void print_attrs(FILE *out, const mgc_graph *g, const mgc_ir_op *op) {
    const mgc_ir_attrs *a = &op->attr;
    (void)g;
    switch (op->kind) {
    case MGC_IR_OP_EMBEDDING:
        if (a->embedding.learned_positions) fputs(" {learned positions}", out);
        break;
    case MGC_IR_OP_DROPOUT:
    case MGC_IR_OP_DROPOUT_ADD:
        fprintf(out, " {p=%g}", a->dropout.p);
        break;
    case MGC_IR_OP_NORM:
        fprintf(out, " {%s eps=%g}", a->norm.kind == MGC_NORM_RMSNORM ? "rmsnorm" : "layernorm",
                a->norm.eps);
        break;
    case MGC_IR_OP_LINEAR:
        if (a->linear.tied) fputs(" {tied}", out);
        break;
    case MGC_IR_OP_ROPE:
        fprintf(out, " {rotary_dim=%d base=%g}", (int)a->rope.rotary_dim, a->rope.base);
        break;
    case MGC_IR_OP_ATTENTION:
        fprintf(out, " {%sa=%d g=%d d=%d scale=%g dropout=%g",
                a->attention.causal ? "causal " : "", (int)a->attention.heads,
                (int)a->attention.groups, (int)a->attention.head_dim, a->attention.scale,
                a->attention.dropout);
        if (a->attention.window > 0) fprintf(out, " window=%lld", (long long)a->attention.window);
        fputc('}', out);
        break;
    case MGC_IR_OP_MOE_ROUTE:
    case MGC_IR_OP_MOE_DISPATCH:
    case MGC_IR_OP_GROUPED_LINEAR:
    case MGC_IR_OP_MOE_COMBINE:
        fprintf(out, " {E=%d k=%d T=%" PRId64 " R=%" PRId64, (int)a->moe.experts, (int)a->moe.top_k,
                a->moe.tokens, a->moe.rows);
        if (a->moe.capacity > 0)
            fprintf(out, " C=%" PRId64, a->moe.capacity);
        else
            fputs(" dropless", out);
        if (op->kind == MGC_IR_OP_MOE_ROUTE) {
            fprintf(out, " %s aux=%g z=%g", mgc_enum_score[a->moe.score], a->moe.aux_coeff,
                    a->moe.z_coeff);
            if (a->moe.groups > 0)
                fprintf(out, " groups=%d/%d", (int)a->moe.group_topk, (int)a->moe.groups);
            if (a->moe.bias_rate > 0) fprintf(out, " bias_rate=%g", a->moe.bias_rate);
            if (a->moe.aux_scope != MGC_AUX_MICROBATCH)
                fprintf(out, " aux_scope=%s", mgc_enum_aux_scope[a->moe.aux_scope]);
        }
        fputc('}', out);
        break;
    default:
        break;
    }
}

static const char *layer_tag(char *buf, size_t n, int32_t layer, mgc_ir_part part) {
    if (layer >= 0)
        snprintf(buf, n, "L%d", (int)layer);
    else
        snprintf(buf, n, "%s", part == MGC_IR_PART_HEAD ? "head" : "emb");
    return buf;
}

void mgc_ir_print(const mgc_graph *g, FILE *out) {
    if (!g) return;
    const mgc_ir_dims *dm = &g->dims;
    uint64_t flops = 0, pnumel = 0;
    int32_t nparams = 0;
    for (int32_t i = 0; i < g->n_ops; i++)
        mgc_ir_add_u64(flops, g->ops[i].flops, &flops);
    for (int32_t i = 0; i < g->n_tensors; i++)
        if (g->tensors[i].role == MGC_IR_ROLE_PARAM) {
            nparams++;
            mgc_ir_add_u64(pnumel, g->tensors[i].numel, &pnumel);
        }
    fprintf(out, "# model IR: forward pass of one microbatch (%s)\n", mgc_ir_dtype_name(g->dtype));
    fprintf(out,
            "# s=%" PRId64 " b=%" PRId64 " h=%" PRId64 " a=%" PRId64 " g=%" PRId64 " d=%" PRId64
            " f=%" PRId64 " V=%" PRId64 " V_pad=%" PRId64 " P=%" PRId64 " L=%" PRId64 "\n",
            dm->s, dm->b, dm->h, dm->a, dm->g, dm->d, dm->f, dm->V, dm->V_pad, dm->P, dm->L);
    if (dm->E > 0)
        fprintf(out,
                "# MoE: L_moe=%" PRId64 " E=%" PRId64 " k=%" PRId64 " f_e=%" PRId64 " f_s=%" PRId64
                " T=%" PRId64 " R=%" PRId64 " C=%" PRId64 "%s\n",
                dm->L_moe, dm->E, dm->k, dm->f_e, dm->f_s, dm->T, dm->R, dm->C,
                dm->C ? "" : " (dropless)");
    fprintf(out,
            "# %d tensors (%d params, %" PRIu64 " elements), %d ops, %" PRIu64
            " forward GEMM FLOPs\n",
            (int)g->n_tensors, (int)nparams, pnumel, (int)g->n_ops, flops);
    fputs("inputs:\n", out);
    for (int32_t i = 0; i < g->n_tensors; i++) {
        const mgc_ir_tensor *t = &g->tensors[i];
        if (!mgc_ir_role_is_input(t->role)) continue;
        fputs("  ", out);
        print_ref(out, g, i);
        if (t->role == MGC_IR_ROLE_PARAM)
            fprintf(out, " (%s, init %s%s)\n", mgc_ir_pclass_name(t->pclass),
                    mgc_ir_init_name(t->init),
                    t->numel != t->numel_unpadded ? ", vocabulary padded" : "");
        else
            fprintf(out, " (%s)\n", mgc_ir_role_name(t->role));
    }
    fputs("ops:\n", out);
    for (int32_t i = 0; i < g->n_ops; i++) {
        const mgc_ir_op *op = &g->ops[i];
        char tag[16];
        fprintf(out, "  #%d %s %s %s", (int)i, layer_tag(tag, sizeof tag, op->layer, op->part),
                mgc_ir_op_kind_name(op->kind), op->name);
        print_attrs(out, g, op);
        fputs(" (", out);
        for (int j = 0; j < op->n_in; j++) {
            if (j) fputs(", ", out);
            print_ref(out, g, op->in[j]);
        }
        fputs(") -> (", out);
        for (int j = 0; j < op->n_out; j++) {
            if (j) fputs(", ", out);
            print_ref(out, g, op->out[j]);
        }
        fputc(')', out);
        if (op->flops) fprintf(out, " flops=%" PRIu64, op->flops);
        if (op->model_flops != op->flops) fprintf(out, " model_flops=%" PRIu64, op->model_flops);
        fputc('\n', out);
    }
}

static void json_attrs(mgc_json *j, const mgc_ir_op *op) {
    const mgc_ir_attrs *a = &op->attr;
    mgc_json_obj_begin(j, "attrs");
    switch (op->kind) {
    case MGC_IR_OP_EMBEDDING:
        mgc_json_bool(j, "learned_positions", a->embedding.learned_positions);
        break;
    case MGC_IR_OP_DROPOUT:
    case MGC_IR_OP_DROPOUT_ADD:
        mgc_json_num(j, "p", a->dropout.p);
        break;
    case MGC_IR_OP_NORM:
        mgc_json_str(j, "norm", a->norm.kind == MGC_NORM_RMSNORM ? "rmsnorm" : "layernorm");
        mgc_json_num(j, "eps", a->norm.eps);
        break;
    case MGC_IR_OP_LINEAR:
        mgc_json_bool(j, "tied", a->linear.tied);
        break;
    case MGC_IR_OP_ROPE:
        mgc_json_int(j, "rotary_dim", a->rope.rotary_dim);
        mgc_json_num(j, "base", a->rope.base);
        break;
    case MGC_IR_OP_ATTENTION:
        mgc_json_bool(j, "causal", a->attention.causal);
        mgc_json_int(j, "heads", a->attention.heads);
        mgc_json_int(j, "groups", a->attention.groups);
        mgc_json_int(j, "head_dim", a->attention.head_dim);
        mgc_json_num(j, "scale", a->attention.scale);
        mgc_json_num(j, "dropout", a->attention.dropout);
        if (a->attention.window > 0) mgc_json_int(j, "window", a->attention.window);
        break;
    case MGC_IR_OP_MOE_ROUTE:
    case MGC_IR_OP_MOE_DISPATCH:
    case MGC_IR_OP_GROUPED_LINEAR:
    case MGC_IR_OP_MOE_COMBINE:
        mgc_json_int(j, "experts", a->moe.experts);
        mgc_json_int(j, "top_k", a->moe.top_k);
        mgc_json_str(j, "score", mgc_enum_score[a->moe.score]);
        mgc_json_str(j, "drop_policy",
                     a->moe.drop_policy == MGC_DROP_POSITION ? "position" : "probs");
        mgc_json_int(j, "tokens", a->moe.tokens);
        mgc_json_int(j, "capacity", a->moe.capacity);
        mgc_json_int(j, "rows", a->moe.rows);
        mgc_json_int(j, "max_rows_per_expert", a->moe.max_rows_per_expert);
        mgc_json_num(j, "aux_loss_coeff", a->moe.aux_coeff);
        if (a->moe.aux_scope != MGC_AUX_MICROBATCH)
            mgc_json_str(j, "aux_loss_scope", mgc_enum_aux_scope[a->moe.aux_scope]);
        mgc_json_num(j, "z_loss_coeff", a->moe.z_coeff);
        if (a->moe.topk_scale != 1.0) mgc_json_num(j, "topk_scaling_factor", a->moe.topk_scale);
        if (a->moe.groups > 0) {
            mgc_json_int(j, "groups", a->moe.groups);
            mgc_json_int(j, "group_topk", a->moe.group_topk);
        }
        if (a->moe.bias_rate > 0) mgc_json_num(j, "expert_bias_update_rate", a->moe.bias_rate);
        break;
    default:
        break;
    }
    mgc_json_obj_end(j);
}

void mgc_ir_print_json(const mgc_graph *g, mgc_json *j) {
    if (!g) return;
    const mgc_ir_dims *dm = &g->dims;
    mgc_json_obj_begin(j, "ir");
    mgc_json_str(j, "dtype", mgc_ir_dtype_name(g->dtype));
    mgc_json_obj_begin(j, "dims");
    const struct {
        const char *k;
        int64_t v;
    } dv[] = {{"s", dm->s},         {"b", dm->b},
              {"h", dm->h},         {"a", dm->a},
              {"g", dm->g},         {"d", dm->d},
              {"q", dm->q},         {"kv", dm->kv},
              {"f", dm->f},         {"V", dm->V},
              {"V_pad", dm->V_pad}, {"P", dm->P},
              {"L", dm->L},         {"L_moe", dm->L_moe},
              {"T", dm->T},         {"E", dm->E},
              {"k", dm->k},         {"f_e", dm->f_e},
              {"f_s", dm->f_s},     {"C", dm->C},
              {"R", dm->R},         {"rotary_dim", dm->rotary_dim}};
    for (size_t i = 0; i < COUNT_OF(dv); i++)
        mgc_json_int(j, dv[i].k, dv[i].v);
    mgc_json_obj_end(j);
    mgc_json_int(j, "loss", g->loss);
    mgc_json_arr_begin(j, "tensors");
    for (int32_t i = 0; i < g->n_tensors; i++) {
        const mgc_ir_tensor *t = &g->tensors[i];
        mgc_json_obj_begin(j, NULL);
        mgc_json_int(j, "id", i);
        mgc_json_str(j, "name", t->name);
        mgc_json_str(j, "role", mgc_ir_role_name(t->role));
        mgc_json_str(j, "dtype", mgc_ir_dtype_name(t->dtype));
        mgc_json_arr_begin(j, "shape");
        for (int32_t k = 0; k < t->rank; k++)
            mgc_json_int(j, NULL, t->dim[k].size);
        mgc_json_arr_end(j);
        mgc_json_arr_begin(j, "axes");
        for (int32_t k = 0; k < t->rank; k++)
            mgc_json_str(j, NULL, mgc_ir_axis_name(t->dim[k].axis));
        mgc_json_arr_end(j);
        mgc_json_int(j, "layer", t->layer);
        mgc_json_str(j, "part", mgc_ir_part_name(t->part));
        if (t->role == MGC_IR_ROLE_PARAM) {
            mgc_json_str(j, "pclass", mgc_ir_pclass_name(t->pclass));
            mgc_json_str(j, "init", mgc_ir_init_name(t->init));
        }
        mgc_json_arr_begin(j, "flags");
        if (t->flags & MGC_IR_TF_BIAS) mgc_json_str(j, NULL, "bias");
        if (t->flags & MGC_IR_TF_NORM) mgc_json_str(j, NULL, "norm");
        if (t->flags & MGC_IR_TF_NODIFF) mgc_json_str(j, NULL, "nodiff");
        if (t->flags & MGC_IR_TF_VIEW) mgc_json_str(j, NULL, "view");
        mgc_json_arr_end(j);
        mgc_json_int(j, "producer", t->producer);
        mgc_json_u64(j, "numel", t->numel);
        mgc_json_u64(j, "numel_unpadded", t->numel_unpadded);
        mgc_json_u64(j, "bytes", t->bytes);
        mgc_json_obj_end(j);
    }
    mgc_json_arr_end(j);
    mgc_json_arr_begin(j, "ops");
    for (int32_t i = 0; i < g->n_ops; i++) {
        const mgc_ir_op *op = &g->ops[i];
        mgc_json_obj_begin(j, NULL);
        mgc_json_int(j, "id", i);
        mgc_json_str(j, "name", op->name);
        mgc_json_str(j, "kind", mgc_ir_op_kind_name(op->kind));
        mgc_json_int(j, "layer", op->layer);
        mgc_json_str(j, "part", mgc_ir_part_name(op->part));
        mgc_json_arr_begin(j, "inputs");
        for (int k = 0; k < op->n_in; k++)
            mgc_json_int(j, NULL, op->in[k]);
        mgc_json_arr_end(j);
        mgc_json_arr_begin(j, "outputs");
        for (int k = 0; k < op->n_out; k++)
            mgc_json_int(j, NULL, op->out[k]);
        mgc_json_arr_end(j);
        mgc_json_u64(j, "flops", op->flops);
        mgc_json_u64(j, "model_flops", op->model_flops);
        mgc_json_u64(j, "bytes", op->bytes);
        json_attrs(j, op);
        mgc_json_obj_end(j);
    }
    mgc_json_arr_end(j);
    mgc_json_obj_end(j);
}
