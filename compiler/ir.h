/* ir.h - the model IR: the op graph of one microbatch's forward pass.
 *
 * mgc_ir_build() turns a checked configuration into a graph of tensors and
 * ops.  It is the input of every later pass: autodiff appends backward ops,
 * the partitioner splits dims by their axis tag and inserts collectives,
 * fusion merges ops, recompute marks ops, pipeline assignment cuts by layer.
 * So the graph is plain data made for passes, not for printing:
 *
 *   - one owner (mgc_graph), two growable arrays: tensors and ops, which
 *     refer to each other by integer id (index), never by pointer.  Adding
 *     a tensor or an op may move the arrays: keep ids, not pointers.
 *   - ops are stored in topological order: every op input is a graph input
 *     (a param, the tokens, the labels, the loss mask) or the output of an
 *     earlier op.  mgc_ir_validate() checks this and the producer links.
 *   - layout is sequence-first like Megatron: activations are [s, b, ...];
 *     weights are [out, in] like torch.nn.Linear; every dim carries a
 *     semantic axis tag (MGC_IR_AXIS_*) the partitioner splits by.
 *   - FLOPs are per op and count GEMMs only (2*m*n*k); see docs/ir.md.
 *
 *     mgc_graph *g = mgc_ir_build(cfg, &diags);   // NULL + diagnostic on failure
 *     for (int32_t i = 0; i < g->n_ops; i++) {
 *         const mgc_ir_op *op = &g->ops[i];
 *         const mgc_ir_tensor *y = &g->tensors[op->out[0]];
 *         ...
 *     }
 *     mgc_ir_print(g, stdout);
 *     mgc_ir_free(g);
 *
 * The notation (s, b, h, a, g, d, f, V, E, k, T, C ...) is the table in
 * docs/ir.md. */
#ifndef MGC_IR_H
#define MGC_IR_H

#include <stdint.h>
#include <stdio.h>

#include "config.h"
#include "diag.h"
#include "json.h"

#ifdef __cplusplus
extern "C" {
#endif

#define MGC_IR_MAX_RANK 4  /* dims per tensor; rank 0 is a scalar */
#define MGC_IR_MAX_IN   8  /* inputs per op (fusion may merge several ops) */
#define MGC_IR_MAX_OUT  4  /* outputs per op */
#define MGC_IR_NAME_MAX 80 /* bytes of a tensor or op name, with the NUL */

/* ---- enumerations ------------------------------------------------------ */

typedef enum mgc_ir_dtype {
    MGC_IR_DTYPE_FP32,
    MGC_IR_DTYPE_BF16,
    MGC_IR_DTYPE_FP16,
    MGC_IR_DTYPE_INT64,
    MGC_IR_DTYPE_INT32,
    MGC_IR_DTYPE__COUNT
} mgc_ir_dtype;

/* Semantic axis of a dim.  The partitioner splits by tag: TP splits HEADS,
 * KV_HEADS, QKV, QPROJ, FFN, FFN_GLU and VOCAB; SP and CP split SEQ (and
 * TOKENS, which is s-major); EP splits EXPERTS. */
typedef enum mgc_ir_axis {
    MGC_IR_AXIS_SEQ,      /* s: sequence positions */
    MGC_IR_AXIS_BATCH,    /* b: sequences in the microbatch */
    MGC_IR_AXIS_TOKENS,   /* T = s*b flattened, s-major (index = si*b + bi) */
    MGC_IR_AXIS_HIDDEN,   /* h: residual stream width */
    MGC_IR_AXIS_HEADS,    /* a: query heads */
    MGC_IR_AXIS_KV_HEADS, /* g: key/value heads (query groups) */
    MGC_IR_AXIS_HEAD_DIM, /* d: channels per head */
    MGC_IR_AXIS_QKV,      /* (a + 2g)*d fused projection, group-major: [g][a/g q, k, v][d] */
    MGC_IR_AXIS_QPROJ,    /* q = a*d, head-major: the attention output width */
    MGC_IR_AXIS_FFN,      /* f (dense), f_e (routed expert) or f_s (shared, all of them) */
    MGC_IR_AXIS_FFN_GLU,  /* 2f: SwiGLU gate half then up half */
    MGC_IR_AXIS_VOCAB,    /* V_pad: padded vocabulary */
    MGC_IR_AXIS_POSITION, /* P: rows of the learned position table */
    MGC_IR_AXIS_EXPERTS,  /* E: routed experts */
    MGC_IR_AXIS_TOPK,     /* k: experts chosen per token */
    MGC_IR_AXIS_ROWS,     /* R: dispatched token rows, grouped by expert */
    MGC_IR_AXIS__COUNT
} mgc_ir_axis;

typedef enum mgc_ir_role {
    MGC_IR_ROLE_PARAM,       /* trainable weight or bias: a graph input */
    MGC_IR_ROLE_TOKENS,      /* input token ids: a graph input */
    MGC_IR_ROLE_LABELS,      /* target token ids: a graph input */
    MGC_IR_ROLE_LOSS_MASK,   /* 1 for tokens that count in the loss: a graph input */
    MGC_IR_ROLE_ACTIVATION,  /* produced by an op */
    MGC_IR_ROLE_LOSS,        /* the training loss (scalar, fp32) */
    MGC_IR_ROLE_AUX_LOSS,    /* an extra loss term (MoE load balancing, z-loss) */
    MGC_IR_ROLE_GRAD,        /* reserved for autodiff: a gradient */
    MGC_IR_ROLE_DOC_START,   /* per token, the position its document starts at (int32 [s,b]):
                                a graph input (data.reset_attention_mask) */
    MGC_IR_ROLE_EXPERT_BIAS, /* a router's aux-loss-free expert bias (fp32 [E]): a graph input the
                                runtime keeps and moves after every step, not trained */
    MGC_IR_ROLE__COUNT
} mgc_ir_role;

/* What a parameter is, for breakdowns, optimizer groups and sharding rules. */
typedef enum mgc_ir_pclass {
    MGC_IR_PCLASS_NONE,           /* not a parameter */
    MGC_IR_PCLASS_WORD_EMBEDDING, /* [V_pad, h] */
    MGC_IR_PCLASS_POS_EMBEDDING,  /* [P, h] learned positions */
    MGC_IR_PCLASS_NORM,           /* every norm weight and bias, final norm included */
    MGC_IR_PCLASS_ATTENTION,      /* QKV and output projections */
    MGC_IR_PCLASS_MLP,            /* dense MLP */
    MGC_IR_PCLASS_ROUTER,         /* MoE router [E, h] */
    MGC_IR_PCLASS_EXPERT,         /* routed experts: leading dim EXPERTS */
    MGC_IR_PCLASS_SHARED_EXPERT,  /* shared experts, fused into one MLP */
    MGC_IR_PCLASS_OUTPUT_LAYER,   /* untied output layer [V_pad, h] */
    MGC_IR_PCLASS__COUNT
} mgc_ir_pclass;

/* How a parameter is initialised (Megatron's rules). */
typedef enum mgc_ir_init {
    MGC_IR_INIT_NONE,          /* not a parameter */
    MGC_IR_INIT_NORMAL,        /* N(0, init_method_std) */
    MGC_IR_INIT_SCALED_NORMAL, /* N(0, init_method_std / sqrt(2 L)): output projections, fc2 */
    MGC_IR_INIT_ONES,          /* norm weights */
    MGC_IR_INIT_ZEROS,         /* biases */
} mgc_ir_init;

/* Where an op or tensor sits inside the model. */
typedef enum mgc_ir_part {
    MGC_IR_PART_EMBEDDING, /* embedding and its dropout (layer -1) */
    MGC_IR_PART_ATTENTION, /* input norm .. attention residual */
    MGC_IR_PART_MLP,       /* pre-MLP norm .. MLP residual, dense layer */
    MGC_IR_PART_MOE,       /* pre-MLP norm .. MoE residual */
    MGC_IR_PART_HEAD,      /* final norm, output layer, loss (layer -1) */
    MGC_IR_PART__COUNT
} mgc_ir_part;

/* Tensor flags. */
#define MGC_IR_TF_BIAS   1u /* a bias vector (no weight decay) */
#define MGC_IR_TF_NORM   2u /* a norm weight or bias (no weight decay) */
#define MGC_IR_TF_NODIFF 4u /* not differentiable (integer ids, routing) */
#define MGC_IR_TF_VIEW   8u /* a view of its op's first input: no storage of its own */

/* Op kinds.  Inputs and outputs, in order, are documented in docs/ir.md. */
typedef enum mgc_ir_op_kind {
    MGC_IR_OP_EMBEDDING,      /* (tokens, word_emb[, pos_emb]) -> x [s,b,h] */
    MGC_IR_OP_DROPOUT,        /* (x) -> y */
    MGC_IR_OP_NORM,           /* (x, w[, bias]) -> y: LayerNorm or RMSNorm over h */
    MGC_IR_OP_LINEAR,         /* (x, w [n,k][, bias [n]]) -> y: y = x w^T + bias */
    MGC_IR_OP_QKV_SPLIT,      /* (qkv [s,b,(a+2g)d]) -> q [s,b,a,d], k [s,b,g,d], v [s,b,g,d] */
    MGC_IR_OP_ROPE,           /* (x [s,b,heads,d] [, doc_start]) -> y: rotary embedding; with
                                 doc_start the positions count from each document's start */
    MGC_IR_OP_ATTENTION,      /* (q, k, v [, doc_start]) -> ctx [s,b,a,d]: softmax(q k^T / sqrt d) v,
                                 GQA; with doc_start a query sees no key before its document */
    MGC_IR_OP_DROPOUT_ADD,    /* (x, residual) -> dropout(x) + residual */
    MGC_IR_OP_GELU,           /* (x) -> gelu(x), tanh approximation */
    MGC_IR_OP_SWIGLU,         /* (x [.., 2f]) -> silu(gate) * up [.., f] */
    MGC_IR_OP_ADD,            /* (x, y) -> x + y */
    MGC_IR_OP_MOE_ROUTE,      /* (logits [s,b,E]) -> probs [T,k], experts [T,k][, aux][, z] */
    MGC_IR_OP_MOE_DISPATCH,   /* (x [s,b,h], experts [T,k]) -> rows [R,h], tokens_per_expert [E] */
    MGC_IR_OP_GROUPED_LINEAR, /* (x [R,k], w [E,n,k], tokens_per_expert[, bias [E,n]]) -> [R,n] */
    MGC_IR_OP_MOE_COMBINE,    /* (rows [R,h], probs [T,k], experts [T,k]) -> y [s,b,h] */
    MGC_IR_OP_CROSS_ENTROPY,  /* (logits [s,b,V_pad], labels, loss_mask) -> loss (mean) */
    MGC_IR_OP__COUNT
} mgc_ir_op_kind;

/* ---- tensors and ops ----------------------------------------------------- */

typedef struct mgc_ir_dim {
    mgc_ir_axis axis; /* semantic tag */
    int64_t size;     /* elements along it, >= 1 */
} mgc_ir_dim;

typedef struct mgc_ir_tensor {
    char name[MGC_IR_NAME_MAX]; /* unique; params use Megatron-core state-dict names */
    mgc_ir_role role;           /* param, tokens, activation, loss, ... */
    mgc_ir_dtype dtype;         /* element type (params: the compute copy; master dtype is fp32) */
    int32_t rank;               /* 0..MGC_IR_MAX_RANK; 0 is a scalar */
    mgc_ir_dim dim[MGC_IR_MAX_RANK]; /* outermost first */
    int32_t layer;                   /* decoder layer, -1 for embedding and head */
    mgc_ir_part part;                /* block the tensor belongs to */
    mgc_ir_pclass pclass;            /* params: what it is; NONE otherwise */
    mgc_ir_init init;                /* params: initialisation rule */
    uint32_t flags;                  /* MGC_IR_TF_* */
    int32_t producer;                /* op id writing it; -1 for graph inputs */
    uint64_t numel;                  /* product of dims (vocabulary padded) */
    uint64_t numel_unpadded;         /* the same with VOCAB dims at the real vocabulary */
    uint64_t bytes;                  /* numel * dtype size */
} mgc_ir_tensor;

/* Per-kind attributes; read the member named after the op kind. */
typedef union mgc_ir_attrs {
    struct {
        int32_t learned_positions; /* 1: adds pos_emb[position] */
    } embedding;
    struct {
        double p; /* drop probability (p = 0 kept; fusion removes it) */
    } dropout;    /* DROPOUT, DROPOUT_ADD */
    struct {
        int32_t kind; /* mgc_norm */
        double eps;
    } norm;
    struct {
        int32_t tied; /* 1: the weight is the word embedding (output layer) */
    } linear;         /* LINEAR (a bias is present when n_in == 3) */
    struct {
        int32_t rotary_dim; /* channels rotated per head: d * rotary_percent, rounded */
        double base;        /* theta */
    } rope;
    struct {
        int32_t causal;   /* 1: lower-triangular mask */
        int32_t heads;    /* a */
        int32_t groups;   /* g */
        int32_t head_dim; /* d */
        double scale;     /* 1/sqrt(d) */
        double dropout;   /* attention-probability dropout */
        int64_t window;   /* causal: a query sees its `window` latest positions; 0 all */
    } attention;
    struct {
        int32_t experts;             /* E */
        int32_t top_k;               /* k */
        int32_t score;               /* mgc_score: softmax or sigmoid */
        int32_t drop_policy;         /* mgc_drop_policy (capacity mode) */
        int64_t tokens;              /* T routed */
        int64_t capacity;            /* C rows per expert; 0 = dropless */
        int64_t rows;                /* R: T*k (dropless) or E*C (capacity, padded) */
        int64_t max_rows_per_expert; /* T (dropless) or C */
        double aux_coeff;            /* load-balancing loss coefficient (0: no aux output) */
        int32_t aux_scope;           /* mgc_aux_scope: what it balances (microbatch, sequence) */
        double z_coeff;              /* z-loss coefficient (0: no z output) */
        double topk_scale;           /* routed weights times it: moe.router_topk_scaling_factor */
        int32_t groups;              /* group-limited routing: expert groups (0 off) */
        int32_t group_topk;          /* groups a token may use */
        double bias_rate;            /* moe.expert_bias_update_rate (0: no bias input) */
    } moe; /* MOE_ROUTE, MOE_DISPATCH, GROUPED_LINEAR (bias present when n_in == 4), MOE_COMBINE */
} mgc_ir_attrs;

/* Op flags (owned by passes; 0 after build). */
#define MGC_IR_OF_RECOMPUTE 1u /* the recompute pass marks ops re-run in backward */

typedef struct mgc_ir_op {
    char name[MGC_IR_NAME_MAX];  /* module path, e.g. "decoder.layers.3.mlp.linear_fc1" */
    mgc_ir_op_kind kind;         /* what it computes */
    int32_t layer;               /* decoder layer, -1 for embedding and head */
    mgc_ir_part part;            /* block */
    uint32_t flags;              /* MGC_IR_OF_* */
    int32_t n_in;                /* inputs used */
    int32_t n_out;               /* outputs used */
    int32_t in[MGC_IR_MAX_IN];   /* tensor ids */
    int32_t out[MGC_IR_MAX_OUT]; /* tensor ids */
    uint64_t flops;       /* forward GEMM FLOPs as executed (2mnk; causal attention halved) */
    uint64_t model_flops; /* the same by the model-FLOPs convention (routed rows = T*k) */
    uint64_t bytes;       /* bytes of distinct inputs + outputs (views excluded) */
    mgc_ir_attrs attr;    /* per-kind attributes */
} mgc_ir_op;

/* Sizes the graph was built with (notation of docs/ir.md). */
typedef struct mgc_ir_dims {
    int64_t s, b, h;    /* sequence, microbatch, hidden */
    int64_t a, g, d;    /* query heads, kv heads, head dim */
    int64_t q, kv;      /* a*d, g*d */
    int64_t f;          /* dense FFN width */
    int64_t V, V_pad;   /* vocabulary, padded */
    int64_t P;          /* learned position rows (0 without) */
    int64_t L, L_moe;   /* layers, MoE layers */
    int64_t T;          /* s*b tokens in the microbatch */
    int64_t E, k;       /* routed experts, top-k (0 dense) */
    int64_t f_e;        /* routed expert FFN width */
    int64_t f_s;        /* all shared experts together: shared_experts * shared width */
    int64_t C;          /* capacity per expert; 0 dropless */
    int64_t R;          /* dispatched rows: T*k or E*C */
    int64_t rotary_dim; /* 0 without rotary */
} mgc_ir_dims;

typedef struct mgc_graph {
    mgc_ir_tensor *tensors; /* (n_tensors) */
    int32_t n_tensors;      /* used */
    int32_t cap_tensors;    /* allocated */
    mgc_ir_op *ops;         /* (n_ops) in topological order */
    int32_t n_ops;          /* used */
    int32_t cap_ops;        /* allocated */
    mgc_ir_dims dims;       /* sizes it was built with */
    mgc_ir_dtype dtype;     /* activation and parameter compute dtype */
    int32_t tokens;         /* tensor id of the input tokens [s,b] */
    int32_t labels;         /* tensor id of the labels [s,b] */
    int32_t loss_mask;      /* tensor id of the loss mask [s,b] */
    int32_t doc_start;      /* tensor id of the documents' start positions [s,b], or -1 */
    int32_t loss;           /* tensor id of the loss (scalar) */
    int32_t word_embedding; /* tensor id of the word embedding */
    int32_t
        output_weight; /* tensor id the output layer multiplies by (= word_embedding when tied) */
    int failed;        /* set when an add ran out of memory or overflowed 64 bits */
    char fail_what[MGC_IR_NAME_MAX + 64]; /* first failure, for the diagnostic */
} mgc_graph;

/* ---- building ------------------------------------------------------------ */

/* Build the forward graph of one microbatch from a finalized config.  NULL
 * with a diagnostic when the config is unusable (not finalized) or a size
 * overflows 64 bits. */
mgc_graph *mgc_ir_build(const mgc_config *c, mgc_diags *d);
/* An empty graph, for passes and tests.  NULL when out of memory. */
mgc_graph *mgc_ir_new(void);
void mgc_ir_free(mgc_graph *g); /* NULL is a no-op */

/* Append a tensor; computes numel/bytes with checked arithmetic.  For
 * numel_unpadded, a VOCAB dim of size g->dims.V_pad counts as g->dims.V
 * (when those are set).  Returns the id, or -1 (and sets g->failed) on a bad
 * rank or size, overflow or out of memory.  role, dtype and dims come from
 * the arguments; layer -1, producer -1, the other fields zero. */
int32_t mgc_ir_add_tensor(mgc_graph *g, const char *name, mgc_ir_role role, mgc_ir_dtype dtype,
                          int32_t rank, const mgc_ir_dim *dims);
/* Append a copy of `op` (name, kind, layer, part, in/out, attrs); sets each
 * output's producer and computes flops/model_flops/bytes from the shapes
 * (mgc_ir_op_update_cost).  Returns the op id, or -1 (g->failed set) on a bad
 * id, an output that already has a producer, overflow or out of memory. */
int32_t mgc_ir_add_op(mgc_graph *g, const mgc_ir_op *op);
/* Recompute an op's flops, model_flops and bytes from its current shapes and
 * attrs (after a pass changed them).  0 ok, -1 on overflow. */
int mgc_ir_op_update_cost(mgc_graph *g, int32_t op);

/* ---- queries -------------------------------------------------------------- */

/* Op that writes tensor t, or -1 for graph inputs. */
int32_t mgc_ir_producer(const mgc_graph *g, int32_t t);
/* Ops reading tensor t, in order, each once: writes up to `max` ids to `ops` (may be
 * NULL when max is 0) and returns how many there are in all. */
int32_t mgc_ir_consumers(const mgc_graph *g, int32_t t, int32_t *ops, int32_t max);
/* Tensor id by name, or -1. */
int32_t mgc_ir_find_tensor(const mgc_graph *g, const char *name);
/* First op of decoder layer `layer` (>= 0) and one past its last (a layer's
 * ops are contiguous after build).  0 when found, -1 when it has no ops. */
int mgc_ir_layer_ops(const mgc_graph *g, int32_t layer, int32_t *first, int32_t *end);
/* 1 for roles that are graph inputs (no producer): params, tokens, labels, mask. */
int mgc_ir_role_is_input(mgc_ir_role r);

/* Structural check: ids in range, ranks and sizes sane, topological order,
 * producer links, graph inputs never produced, every activation produced,
 * names unique.  Appends errors at location "<ir>"; 0 when none. */
int mgc_ir_validate(const mgc_graph *g, mgc_diags *d);

/* Names (JSON and docs use these). */
const char *mgc_ir_dtype_name(mgc_ir_dtype t);     /* "bf16" */
uint32_t mgc_ir_dtype_size(mgc_ir_dtype t);        /* bytes per element */
const char *mgc_ir_axis_name(mgc_ir_axis a);       /* "hidden" */
const char *mgc_ir_axis_symbol(mgc_ir_axis a);     /* "h" (the notation table) */
const char *mgc_ir_role_name(mgc_ir_role r);       /* "param" */
const char *mgc_ir_pclass_name(mgc_ir_pclass p);   /* "attention" */
const char *mgc_ir_init_name(mgc_ir_init i);       /* "scaled_normal" */
const char *mgc_ir_part_name(mgc_ir_part p);       /* "moe" */
const char *mgc_ir_op_kind_name(mgc_ir_op_kind k); /* "linear" */

/* ---- output --------------------------------------------------------------- */

/* Readable text: a header, the graph inputs, then one line per op with its
 * inputs and outputs (name, dtype, shape) and FLOPs. */
void mgc_ir_print(const mgc_graph *g, FILE *out);
/* Write one member "ir" (an object: dtype, dims, loss, tensors, ops; see
 * docs/ir.md) into an already-open object. */
void mgc_ir_print_json(const mgc_graph *g, mgc_json *j);

/* ---- checked arithmetic (shared with facts.c) ------------------------------ */

/* *r = a * b; returns 1 on overflow (and leaves *r = UINT64_MAX). */
static inline int mgc_ir_mul_u64(uint64_t a, uint64_t b, uint64_t *r) {
    if (a != 0 && b > UINT64_MAX / a) {
        *r = UINT64_MAX;
        return 1;
    }
    *r = a * b;
    return 0;
}
/* *r = a + b; returns 1 on overflow (and leaves *r = UINT64_MAX). */
static inline int mgc_ir_add_u64(uint64_t a, uint64_t b, uint64_t *r) {
    if (b > UINT64_MAX - a) {
        *r = UINT64_MAX;
        return 1;
    }
    *r = a + b;
    return 0;
}

#ifdef __cplusplus
}
#endif
#endif /* MGC_IR_H */
