/* export.c - a checkpoint's model as safetensors (export.h). */
#include "export.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "checkpoint.h"
#include "half.h"

static int fail_with(char *err, size_t errsz, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;
static int fail_with(char *err, size_t errsz, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errsz, fmt, ap);
    va_end(ap);
    return -1;
}
#define BAD(...) fail_with(err, errsz, __VA_ARGS__)

typedef enum { X_ROWS, X_TRANSPOSE, X_QKV, X_GPT2_QKV, X_EXPERT } xkind;

typedef struct out_t {
    char name[200];
    int rank;
    int64_t dim[4];
    const mgc_ckpt_tensor *src;
    xkind kind;
    int64_t r0, r1; /* X_ROWS: the source's rows [r0, r1) */
    int part;       /* X_QKV, X_GPT2_QKV: 0 q, 1 k, 2 v; X_EXPERT: the expert */
    uint64_t off;   /* bytes from the data's start */
} out_t;

/* The architectures of the hf format (Hugging Face transformers' class names). */
typedef enum hf_family {
    FAM_GPT2,      /* GPT2LMHeadModel */
    FAM_LLAMA,     /* LlamaForCausalLM */
    FAM_QWEN3,     /* Qwen3ForCausalLM: LLaMA with query and key norms */
    FAM_MIXTRAL,   /* MixtralForCausalLM: LLaMA's attention, every MLP routed */
    FAM_QWEN3_MOE, /* Qwen3MoeForCausalLM: Qwen3's attention, MoE layers by mlp_only_layers */
    FAM_MISTRAL,   /* MistralForCausalLM: LLaMA with a sliding window */
} hf_family;

static const char *const fam_class[] = {"GPT2LMHeadModel",    "LlamaForCausalLM",    "Qwen3ForCausalLM",
                                        "MixtralForCausalLM", "Qwen3MoeForCausalLM", "MistralForCausalLM"};
static const char *const fam_type[] = {"gpt2", "llama", "qwen3", "mixtral", "qwen3_moe", "mistral"};

typedef struct ctx {
    const mgc_plan *plan;
    mgc_ckpt_info info;
    const mgc_ckpt_model *model; /* the tensors mapped: the checkpoint's (export), the plan's (import) */
    out_t *out;
    int n, cap;
    int64_t vocab, heads, groups, head_dim, hidden, ffn, layers, seq;
    hf_family fam; /* the hf format's architecture (plan_hf) */
    char *err;
    size_t errsz;
} ctx;

static int64_t cfg_i(const mgc_plan *p, const char *k, int64_t d) {
    int64_t v;
    return mgc_plan_config_int(p, k, &v) ? v : d;
}
static double cfg_f(const mgc_plan *p, const char *k, double d) {
    double v;
    return mgc_plan_config_float(p, k, &v) ? v : d;
}

static const mgc_ckpt_tensor *find(const ctx *x, const char *name) {
    for (int64_t i = 0; i < x->model->n; i++)
        if (!strcmp(x->model->t[i].name, name)) return &x->model->t[i];
    return NULL;
}

/* Adds an output from checkpoint tensor `src` (the source's shape, vocabulary rows cut). */
static out_t *add_kind(ctx *x, const char *name, const char *src, xkind kind) {
    const mgc_ckpt_tensor *t = find(x, src);
    if (!t) {
        snprintf(x->err, x->errsz, "the checkpoint has no parameter '%s', which this model's "
                                   "export needs: export with the plan of the model it was saved for",
                 src);
        return NULL;
    }
    if (x->n == x->cap) {
        int nc = x->cap ? 2 * x->cap : 64;
        out_t *o = realloc(x->out, (size_t)nc * sizeof *o);
        if (!o) {
            snprintf(x->err, x->errsz, "out of memory");
            return NULL;
        }
        x->out = o, x->cap = nc;
    }
    out_t *o = &x->out[x->n++];
    memset(o, 0, sizeof *o);
    snprintf(o->name, sizeof o->name, "%s", name);
    o->src = t;
    o->kind = kind;
    o->rank = t->rank;
    for (int d = 0; d < t->rank; d++)
        o->dim[d] = t->dim[d];
    o->r0 = 0, o->r1 = t->dim[0];
    if (t->vocab && t->dim[0] > x->vocab) o->r1 = o->dim[0] = x->vocab; /* padding rows out */
    return o;
}

/* a copy (the vocabulary padding cut) */
static out_t *add(ctx *x, const char *name, const char *src) {
    return add_kind(x, name, src, X_ROWS);
}

static out_t *rows(ctx *x, const char *name, const char *src, int64_t r0, int64_t r1) {
    out_t *o = add_kind(x, name, src, X_ROWS);
    if (o) o->r0 = r0, o->r1 = r1, o->dim[0] = r1 - r0;
    return o;
}

static out_t *transposed(ctx *x, const char *name, const char *src) {
    out_t *o = add_kind(x, name, src, X_TRANSPOSE);
    if (o && o->rank == 2) {
        int64_t t = o->dim[0];
        o->dim[0] = o->dim[1], o->dim[1] = t;
    }
    return o;
}

/* LLaMA's q, k or v projection out of the group-major fused QKV (partitioning.md) */
static out_t *qkv_part(ctx *x, const char *name, const char *src, int part) {
    out_t *o = add_kind(x, name, src, X_QKV);
    if (o) {
        o->part = part;
        o->dim[0] = (part == 0 ? x->heads : x->groups) * x->head_dim;
    }
    return o;
}

/* GPT-2's c_attn: [q of every head | k | v], as a Conv1D (input dim first) */
static out_t *gpt2_qkv(ctx *x, const char *name, const char *src) {
    out_t *o = add_kind(x, name, src, X_GPT2_QKV);
    if (o && o->rank == 2) {
        int64_t t = o->dim[0];
        o->dim[0] = o->dim[1], o->dim[1] = t;
    }
    return o;
}

/* The plan's model's sizes into x: 0, or -1 with x->err. */
static int model_sizes(ctx *x) {
    const mgc_plan *plan = x->plan;
    x->vocab = cfg_i(plan, "model.vocab_size", 0);
    x->heads = cfg_i(plan, "model.num_attention_heads", 1);
    x->groups = cfg_i(plan, "model.num_query_groups", x->heads);
    x->hidden = cfg_i(plan, "model.hidden_size", 0);
    x->head_dim = cfg_i(plan, "model.head_dim", x->heads > 0 ? x->hidden / x->heads : 0);
    x->ffn = cfg_i(plan, "model.ffn_hidden_size", 0);
    x->layers = cfg_i(plan, "model.num_layers", 0);
    x->seq = plan->seq_length;
    if (x->heads > 0 && x->groups > 0 && x->heads % x->groups == 0 && x->head_dim > 0) return 0;
    snprintf(x->err, x->errsz,
             "the plan's model has %" PRId64 " heads in %" PRId64 " groups of %" PRId64
             " channels: a plan from another mgc?",
             x->heads, x->groups, x->head_dim);
    return -1;
}

/* one expert's matrix out of an (E, N, K) expert weight: its rows [r0, r1) */
static out_t *expert(ctx *x, const char *name, const char *src, int e, int64_t r0, int64_t r1) {
    out_t *o = add_kind(x, name, src, X_EXPERT);
    if (o && o->rank == 3) {
        o->part = e, o->r0 = r0, o->r1 = r1;
        o->rank = 2;
        o->dim[0] = r1 - r0, o->dim[1] = o->src->dim[2], o->dim[2] = 0;
    }
    return o;
}

/* ---- the model's families ----------------------------------------------------------- */

/* The sliding window the plan's attention ops have (their fattr[2]: every layer's, whichever
 * stage holds it), in *w: 0 none; -1 when layers differ (model.window_layers). */
static int plan_window(const mgc_plan *p, int64_t *w) {
    int64_t seen = -2;
    for (int64_t s = 0; s < p->n_stages; s++)
        for (int64_t c = 0; c < p->stages[s].n_chunks; c++) {
            const mgc_plan_chunk *ch = &p->stages[s].chunks[c];
            for (int64_t i = 0; i < ch->n_fwd; i++) {
                if (ch->fwd[i].kind != MGC_POP_ATTENTION) continue;
                int64_t v = (int64_t)ch->fwd[i].fattr[2];
                if (seen != -2 && v != seen) return -1;
                seen = v;
            }
        }
    *w = seen < 0 ? 0 : seen;
    return 0;
}

static int plan_hf(ctx *x) {
    const mgc_plan *p = x->plan;
    int64_t norm = cfg_i(p, "model.normalization", 0), act = cfg_i(p, "model.activation", 0);
    int64_t pos = cfg_i(p, "model.position_embedding", 0), bias = cfg_i(p, "model.add_bias_linear", 1);
    int64_t qkvb = cfg_i(p, "model.add_qkv_bias", bias), experts = cfg_i(p, "moe.num_experts", 0);
    double rp = cfg_f(p, "model.rotary_percent", 1.0);
    int qk = cfg_i(p, "model.qk_layernorm", 0) != 0;
    int64_t win = 0;
    int mixed = plan_window(p, &win) != 0; /* model.window_layers: some layers without */
    char *err = x->err;
    size_t errsz = x->errsz;
    const char *why = NULL;
    int gpt2 = norm == 0 && act == 0 && pos == 0, llama = norm == 1 && act == 1 && pos == 1;
    /* The mixtures of experts: LLaMA's attention, SwiGLU experts, top-k routing with softmax over
     * the chosen logits (mgc's softmax router; Qwen3-MoE's norm_topk_prob), no shared expert.
     * Mixtral routes every layer's MLP; Qwen3-MoE (with the query and key norms) lists its dense
     * layers (mlp_only_layers), so any set of MoE layers. */
    int64_t shared = cfg_i(p, "moe.shared_experts", 0), first_dense = cfg_i(p, "moe.first_dense_layers", 0);
    int64_t freq = cfg_i(p, "moe.layer_freq", 1), score = cfg_i(p, "moe.router_score", 0);
    int listed = cfg_i(p, "moe.layers[0]", -1) >= 0;
    /* the router: softmax over the chosen (0), or over every expert unnormalised (2: Qwen3-MoE's
     * norm_topk_prob false) */
    if (experts > 0 && (!llama || shared || score == 1 || (score == 2 && !qk)))
        why = "a mixture of experts other than Mixtral's or Qwen3-MoE's (which need LLaMA's layers, no "
              "shared experts and a softmax router; the pre-softmax one is Qwen3-MoE's only)";
    double topk_scale = 1.0;
    mgc_plan_config_float(p, "moe.router_topk_scaling_factor", &topk_scale);
    if (!why && experts > 0 && topk_scale != 1.0)
        why = "a top-k scaling factor (moe.router_topk_scaling_factor): Mixtral's and Qwen3-MoE's "
              "routed weights are not scaled";
    if (!why && experts > 0 && cfg_i(p, "moe.router_num_groups", 0) > 0)
        why = "group-limited routing (moe.router_num_groups): Mixtral and Qwen3-MoE choose among "
              "every expert";
    if (!why && experts > 0 && !qk && (first_dense || freq != 1 || listed))
        why = "dense layers in a mixture of experts without query and key norms (Mixtral routes every "
              "layer's MLP; Qwen3-MoE, with the norms, may keep some dense)";
    if (!why && !gpt2 && !llama)
        why = "a mix the hf format has no architecture for (GPT-2: layernorm, gelu, learned positions; "
              "LLaMA: rmsnorm, swiglu, rotary)";
    if (!why && gpt2 && (x->groups != x->heads || !bias || x->head_dim * x->heads != x->hidden))
        why = "a GPT-2 variant that GPT2LMHeadModel cannot hold (it needs every head its own key and "
              "value, biases, and head_dim x heads = hidden_size)";
    if (!why && llama && (bias || qkvb)) why = "linear biases, which LlamaForCausalLM's q/k/v/o do not all take";
    if (!why && llama && rp != 1.0) why = "partial rotary embeddings (rotary_percent < 1)";
    /* LLaMA's layers with each head's queries and keys RMS-normalised before the rotation are
     * Qwen3's (q_norm, k_norm) */
    if (!why && qk && !llama) why = "query and key norms outside LLaMA-style layers (the hf format has them as Qwen3's)";
    /* a sliding window over LLaMA's layers is Mistral's (or Mixtral's sliding_window) */
    if (!why && mixed)
        why = "a sliding window on some layers only (Mistral's and Mixtral's are on every layer)";
    if (!why && win > 0 && (!llama || qk))
        why = "a sliding window outside LLaMA- and Mixtral-style layers (the hf format has it as "
              "Mistral's and Mixtral's sliding_window)";
    if (why)
        return BAD("the hf format covers GPT-2-, LLaMA-, Mistral- (LLaMA with a sliding window), Qwen3- "
                   "(LLaMA with query and key norms), Mixtral- and Qwen3-MoE-style models; this one has %s: "
                   "export with --format mgc (every parameter under mgc's names)",
                   why);
    x->fam = gpt2          ? FAM_GPT2
             : experts > 0 ? (qk ? FAM_QWEN3_MOE : FAM_MIXTRAL)
             : qk          ? FAM_QWEN3
             : win > 0     ? FAM_MISTRAL
                           : FAM_LLAMA;
    char n[200], s[200];
    int tied = cfg_i(p, "model.tie_embeddings", 0) != 0;
    if (gpt2) {
        if (!add(x, "transformer.wte.weight", "embedding.word_embeddings.weight") ||
            !add(x, "transformer.wpe.weight", "embedding.position_embeddings.weight"))
            return -1;
    } else if (!add(x, "model.embed_tokens.weight", "embedding.word_embeddings.weight")) {
        return -1;
    }
    for (int64_t l = 0; l < x->layers; l++) {
#define N(...) (snprintf(n, sizeof n, __VA_ARGS__), n)
#define S(suffix) (snprintf(s, sizeof s, "decoder.layers.%" PRId64 ".%s", l, suffix), s)
        if (gpt2) {
            const char *h = "transformer.h";
            if (!add(x, N("%s.%" PRId64 ".ln_1.weight", h, l), S("input_layernorm.weight")) ||
                !add(x, N("%s.%" PRId64 ".ln_1.bias", h, l), S("input_layernorm.bias")) ||
                !gpt2_qkv(x, N("%s.%" PRId64 ".attn.c_attn.weight", h, l), S("self_attention.linear_qkv.weight")) ||
                !gpt2_qkv(x, N("%s.%" PRId64 ".attn.c_attn.bias", h, l), S("self_attention.linear_qkv.bias")) ||
                !transposed(x, N("%s.%" PRId64 ".attn.c_proj.weight", h, l), S("self_attention.linear_proj.weight")) ||
                !add(x, N("%s.%" PRId64 ".attn.c_proj.bias", h, l), S("self_attention.linear_proj.bias")) ||
                !add(x, N("%s.%" PRId64 ".ln_2.weight", h, l), S("pre_mlp_layernorm.weight")) ||
                !add(x, N("%s.%" PRId64 ".ln_2.bias", h, l), S("pre_mlp_layernorm.bias")) ||
                !transposed(x, N("%s.%" PRId64 ".mlp.c_fc.weight", h, l), S("mlp.linear_fc1.weight")) ||
                !add(x, N("%s.%" PRId64 ".mlp.c_fc.bias", h, l), S("mlp.linear_fc1.bias")) ||
                !transposed(x, N("%s.%" PRId64 ".mlp.c_proj.weight", h, l), S("mlp.linear_fc2.weight")) ||
                !add(x, N("%s.%" PRId64 ".mlp.c_proj.bias", h, l), S("mlp.linear_fc2.bias")))
                return -1;
        } else {
            const char *h = "model.layers";
            /* a MoE layer is one with a router (the model's tensors say which) */
            int routed = experts > 0 && find(x, S("mlp.router.weight")) != NULL;
            if (routed) { /* the MLP: router and experts; attention and norms as LLaMA's */
                int64_t E = experts, fe = cfg_i(p, "moe.ffn_hidden_size", 0);
                int qm = x->fam == FAM_QWEN3_MOE;
                const char *blk = qm ? "mlp" : "block_sparse_moe";
                const char *w1 = qm ? "gate_proj" : "w1", *w3 = qm ? "up_proj" : "w3", *w2 = qm ? "down_proj" : "w2";
                if (!add(x, N("%s.%" PRId64 ".%s.gate.weight", h, l, blk), S("mlp.router.weight")))
                    return -1;
                for (int e = 0; e < (int)E; e++)
                    if (!expert(x, N("%s.%" PRId64 ".%s.experts.%d.%s.weight", h, l, blk, e, w1),
                                S("mlp.experts.linear_fc1.weight"), e, 0, fe) ||
                        !expert(x, N("%s.%" PRId64 ".%s.experts.%d.%s.weight", h, l, blk, e, w3),
                                S("mlp.experts.linear_fc1.weight"), e, fe, 2 * fe) ||
                        !expert(x, N("%s.%" PRId64 ".%s.experts.%d.%s.weight", h, l, blk, e, w2),
                                S("mlp.experts.linear_fc2.weight"), e, 0, x->hidden))
                        return -1;
            }
            if (!add(x, N("%s.%" PRId64 ".input_layernorm.weight", h, l), S("input_layernorm.weight")) ||
                !qkv_part(x, N("%s.%" PRId64 ".self_attn.q_proj.weight", h, l), S("self_attention.linear_qkv.weight"), 0) ||
                !qkv_part(x, N("%s.%" PRId64 ".self_attn.k_proj.weight", h, l), S("self_attention.linear_qkv.weight"), 1) ||
                !qkv_part(x, N("%s.%" PRId64 ".self_attn.v_proj.weight", h, l), S("self_attention.linear_qkv.weight"), 2) ||
                !add(x, N("%s.%" PRId64 ".self_attn.o_proj.weight", h, l), S("self_attention.linear_proj.weight")) ||
                !add(x, N("%s.%" PRId64 ".post_attention_layernorm.weight", h, l), S("pre_mlp_layernorm.weight")))
                return -1;
            if (qk &&
                (!add(x, N("%s.%" PRId64 ".self_attn.q_norm.weight", h, l), S("self_attention.q_layernorm.weight")) ||
                 !add(x, N("%s.%" PRId64 ".self_attn.k_norm.weight", h, l), S("self_attention.k_layernorm.weight"))))
                return -1;
            if (!routed &&
                (!rows(x, N("%s.%" PRId64 ".mlp.gate_proj.weight", h, l), S("mlp.linear_fc1.weight"), 0, x->ffn) ||
                 !rows(x, N("%s.%" PRId64 ".mlp.up_proj.weight", h, l), S("mlp.linear_fc1.weight"), x->ffn, 2 * x->ffn) ||
                 !add(x, N("%s.%" PRId64 ".mlp.down_proj.weight", h, l), S("mlp.linear_fc2.weight"))))
                return -1;
        }
#undef N
#undef S
    }
    if (gpt2) {
        if (!add(x, "transformer.ln_f.weight", "decoder.final_layernorm.weight") ||
            !add(x, "transformer.ln_f.bias", "decoder.final_layernorm.bias"))
            return -1;
    } else if (!add(x, "model.norm.weight", "decoder.final_layernorm.weight")) {
        return -1;
    }
    if (!tied && !add(x, "lm_head.weight", "output_layer.weight")) return -1;
    return 0;
}

static int plan_mgc(ctx *x) {
    for (int64_t i = 0; i < x->model->n; i++)
        if (!add(x, x->model->t[i].name, x->model->t[i].name)) return -1;
    return 0;
}

/* ---- values --------------------------------------------------------------------------- */

static int read_src(ctx *x, int fd, const mgc_ckpt_tensor *t, float *dst) {
    size_t bytes = (size_t)t->numel * 4, done = 0;
    unsigned char *b = (unsigned char *)dst; /* decoded in place: 4 bytes -> one float */
    while (done < bytes) {
        ssize_t k = pread(fd, b + done, bytes - done, (off_t)(x->info.data_offset + t->offset + done));
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) return -1;
        done += (size_t)k;
    }
    for (size_t i = 0; i < (size_t)t->numel; i++) {
        uint32_t u = (uint32_t)b[4 * i] | (uint32_t)b[4 * i + 1] << 8 | (uint32_t)b[4 * i + 2] << 16 |
                     (uint32_t)b[4 * i + 3] << 24;
        memcpy(&dst[i], &u, 4);
    }
    return 0;
}

static uint64_t out_numel(const out_t *o) {
    uint64_t n = 1;
    for (int d = 0; d < o->rank; d++)
        n *= (uint64_t)o->dim[d];
    return n;
}

/* The output's values from the source's. */
static void fill(const ctx *x, const out_t *o, const float *s, float *v) {
    const mgc_ckpt_tensor *t = o->src;
    int64_t inner = (int64_t)(t->numel / (uint64_t)t->dim[0]), d = x->head_dim;
    switch (o->kind) {
    case X_ROWS:
        memcpy(v, s + o->r0 * inner, (size_t)((o->r1 - o->r0) * inner) * sizeof *v);
        return;
    case X_TRANSPOSE: { /* [N, K] -> [K, N] */
        int64_t N = t->dim[0], K = inner;
        for (int64_t a = 0; a < N; a++)
            for (int64_t b = 0; b < K; b++)
                v[b * N + a] = s[a * K + b];
        return;
    }
    case X_QKV: { /* per group j: [per q heads | k | v] x d rows */
        int64_t per = x->heads / x->groups, at = 0;
        for (int64_t j = 0; j < x->groups; j++) {
            int64_t base = j * (per + 2) * d;
            int64_t r0 = o->part == 0 ? base : o->part == 1 ? base + per * d : base + (per + 1) * d;
            int64_t nr = o->part == 0 ? per * d : d;
            memcpy(v + at * inner, s + r0 * inner, (size_t)(nr * inner) * sizeof *v);
            at += nr;
        }
        return;
    }
    case X_EXPERT: { /* expert o->part's rows [r0, r1) of (E, N, K) */
        int64_t N = t->dim[1], K = t->dim[2];
        memcpy(v, s + ((int64_t)o->part * N + o->r0) * K, (size_t)((o->r1 - o->r0) * K) * sizeof *v);
        return;
    }
    case X_GPT2_QKV: { /* column p*a*d + h*d + e is the source's row h*3d + p*d + e */
        int64_t a = x->heads, cols = 3 * a * d, K = inner;
        for (int64_t c = 0; c < cols; c++) {
            int64_t p = c / (a * d), h = (c / d) % a, e = c % d, r = h * 3 * d + p * d + e;
            if (t->rank == 1) v[c] = s[r];
            else
                for (int64_t b = 0; b < K; b++)
                    v[b * cols + c] = s[r * K + b];
        }
        return;
    }
    }
}

/* ---- files ---------------------------------------------------------------------------- */

static int mkdirs(const char *dir) {
    char p[4096];
    snprintf(p, sizeof p, "%s", dir);
    for (char *c = p + 1; *c; c++)
        if (*c == '/') {
            *c = 0;
            if (mkdir(p, 0777) && errno != EEXIST) return -1;
            *c = '/';
        }
    return mkdir(p, 0777) && errno != EEXIST ? -1 : 0;
}

static int put_all(int fd, const void *buf, size_t len) {
    const unsigned char *p = buf;
    while (len) {
        ssize_t k = write(fd, p, len);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) return -1;
        p += k, len -= (size_t)k;
    }
    return 0;
}

static const char *st_dtype(int dt) {
    return dt == MGC_DT_BF16 ? "BF16" : dt == MGC_DT_F16 ? "F16" : "F32";
}

/* The shortest JSON number that reads back as the same double (1e-05, not 1.0000000000000001e-05). */
static void num(char *b, size_t n, double v) {
    if (v == floor(v) && fabs(v) < 1e15) { /* 10000, not 1e+04 */
        snprintf(b, n, "%.0f", v);
        return;
    }
    for (int p = 1; p <= 17; p++) {
        snprintf(b, n, "%.*g", p, v);
        if (strtod(b, NULL) == v) return;
    }
}

static int write_config(const ctx *x, int dtype, const char *path, char *err,
                        size_t errsz) {
    const mgc_plan *p = x->plan;
    char eps[40], theta[40], hd[40], ad[40];
    num(eps, sizeof eps, cfg_f(p, "model.norm_eps", 1e-5));
    num(theta, sizeof theta, cfg_f(p, "model.rotary_base", 10000));
    num(hd, sizeof hd, cfg_f(p, "model.hidden_dropout", 0));
    num(ad, sizeof ad, cfg_f(p, "model.attention_dropout", 0));
    int tied = cfg_i(p, "model.tie_embeddings", 0) != 0;
    int64_t eod = cfg_i(p, "data.eod_token", 256), pos = cfg_i(p, "model.max_position_embeddings", x->seq);
    const char *td = dtype == MGC_DT_BF16 ? "bfloat16" : dtype == MGC_DT_F16 ? "float16" : "float32";
    FILE *f = fopen(path, "wx");
    if (!f) return BAD("cannot create %s: %s", path, strerror(errno));
    int moe = x->fam == FAM_MIXTRAL || x->fam == FAM_QWEN3_MOE;
    if (x->fam == FAM_GPT2)
        fprintf(f,
                "{\n  \"architectures\": [\"GPT2LMHeadModel\"],\n  \"model_type\": \"gpt2\",\n"
                "  \"vocab_size\": %" PRId64 ",\n  \"n_embd\": %" PRId64 ",\n  \"n_layer\": %" PRId64
                ",\n  \"n_head\": %" PRId64 ",\n  \"n_inner\": %" PRId64 ",\n  \"n_positions\": %" PRId64
                ",\n  \"n_ctx\": %" PRId64 ",\n  \"activation_function\": \"gelu_new\",\n"
                "  \"layer_norm_epsilon\": %s,\n  \"resid_pdrop\": %s,\n  \"embd_pdrop\": %s,\n"
                "  \"attn_pdrop\": %s,\n  \"scale_attn_weights\": true,\n  \"tie_word_embeddings\": %s,\n",
                x->vocab, x->hidden, x->layers, x->heads, x->ffn, pos, pos, eps, hd, hd, ad,
                tied ? "true" : "false");
    else
        fprintf(f,
                "{\n  \"architectures\": [\"%s\"],\n  \"model_type\": \"%s\",\n"
                "  \"vocab_size\": %" PRId64 ",\n  \"hidden_size\": %" PRId64 ",\n  \"intermediate_size\": %" PRId64
                ",\n  \"num_hidden_layers\": %" PRId64 ",\n  \"num_attention_heads\": %" PRId64
                ",\n  \"num_key_value_heads\": %" PRId64 ",\n  \"head_dim\": %" PRId64
                ",\n  \"hidden_act\": \"silu\",\n  \"max_position_embeddings\": %" PRId64
                ",\n  \"rms_norm_eps\": %s,\n  \"rope_theta\": %s,\n  \"attention_bias\": false,\n"
                "  \"mlp_bias\": false,\n  \"attention_dropout\": %s,\n  \"tie_word_embeddings\": %s,\n",
                fam_class[x->fam], fam_type[x->fam], x->vocab, x->hidden,
                x->fam == FAM_MIXTRAL ? cfg_i(p, "moe.ffn_hidden_size", x->ffn) : x->ffn, x->layers, x->heads,
                x->groups, x->head_dim, pos, eps, theta, ad, tied ? "true" : "false");
    int64_t win = 0;
    if (!plan_window(p, &win) && win > 0 && (x->fam == FAM_MISTRAL || x->fam == FAM_MIXTRAL))
        fprintf(f, "  \"sliding_window\": %" PRId64 ",\n", win);
    if (moe) {
        char aux[40];
        num(aux, sizeof aux, cfg_f(p, "moe.aux_loss_coeff", 0));
        fprintf(f, "  \"%s\": %" PRId64 ",\n  \"num_experts_per_tok\": %" PRId64
                   ",\n  \"router_aux_loss_coef\": %s,\n  \"output_router_logits\": false,\n",
                x->fam == FAM_MIXTRAL ? "num_local_experts" : "num_experts", cfg_i(p, "moe.num_experts", 0),
                cfg_i(p, "moe.top_k", 2), aux);
    }
    if (x->fam == FAM_QWEN3_MOE) { /* the routed weights renormalised; dense layers listed */
        fprintf(f, "  \"moe_intermediate_size\": %" PRId64 ",\n  \"norm_topk_prob\": %s,\n"
                   "  \"decoder_sparse_step\": 1,\n  \"mlp_only_layers\": [",
                cfg_i(p, "moe.ffn_hidden_size", x->ffn), cfg_i(p, "moe.router_score", 0) == 2 ? "false" : "true");
        int first = 1;
        for (int64_t l = 0; l < x->layers; l++) {
            char r[96];
            snprintf(r, sizeof r, "decoder.layers.%" PRId64 ".mlp.router.weight", l);
            if (find(x, r)) continue;
            fprintf(f, "%s%" PRId64, first ? "" : ", ", l);
            first = 0;
        }
        fputs("],\n", f);
    }
    if (eod >= 0 && eod < x->vocab) fprintf(f, "  \"eos_token_id\": %" PRId64 ",\n", eod);
    fprintf(f, "  \"torch_dtype\": \"%s\"\n}\n", td);
    int bad = ferror(f) != 0;
    bad |= fflush(f) != 0 || fsync(fileno(f)) != 0;
    bad |= fclose(f) != 0;
    if (bad) {
        unlink(path);
        return BAD("cannot write %s: %s", path, strerror(errno));
    }
    return 0;
}

int mgc_export(const mgc_plan *plan, const char *ckpt, const char *dir, mgc_export_format fmt,
               int dtype, char *err, size_t errsz) {
    ctx x;
    memset(&x, 0, sizeof x);
    x.plan = plan, x.err = err, x.errsz = errsz;
    int rc = -1, fd = -1, out_fd = -1;
    float *src = NULL, *val = NULL;
    unsigned char *buf = NULL;
    char *hdr = NULL;
    char st_path[4200], st_tmp[4300], cf_path[4200], cf_tmp[4300];
    st_tmp[0] = cf_tmp[0] = 0;
    if (dtype != MGC_DT_F32 && dtype != MGC_DT_BF16 && dtype != MGC_DT_F16)
        return BAD("export: dtype %s is not fp32, bf16 or fp16", mgc_dtype_name((mgc_dtype)dtype));
    if (model_sizes(&x)) return -1;
    if (mgc_ckpt_read_info(ckpt, &x.info, err, errsz) || mgc_ckpt_verify(ckpt, &x.info, err, errsz))
        goto out;
    x.model = &x.info.model;
    /* the plan's model, tensor by tensor (the vocabulary padding may differ) */
    {
        mgc_ckpt_model pm;
        if (mgc_ckpt_model_of(plan, &pm, err, errsz)) goto out;
        const char *bad = NULL;
        for (int64_t i = 0; i < pm.n && !bad; i++) {
            const mgc_ckpt_tensor *t = find(&x, pm.t[i].name);
            int same = t && t->rank == pm.t[i].rank;
            for (int d = 0; same && d < t->rank; d++)
                same = t->dim[d] == pm.t[i].dim[d] || (d == 0 && t->vocab && pm.t[i].vocab);
            if (!same) bad = pm.t[i].name;
        }
        if (bad) {
            BAD("%s: its parameter '%s' is missing or shaped otherwise than this plan's model's: "
                "export with the plan of the model it was saved for",
                ckpt, bad);
            mgc_ckpt_model_free(&pm);
            goto out;
        }
        mgc_ckpt_model_free(&pm);
        if (x.info.vocab_size != x.vocab) {
            BAD("%s was saved for a vocabulary of %" PRId64 " tokens, this plan's model has %" PRId64
                ": export with the plan of the model it was saved for",
                ckpt, x.info.vocab_size, x.vocab);
            goto out;
        }
    }
    if ((fmt == MGC_EXPORT_HF ? plan_hf(&x) : plan_mgc(&x))) goto out;
    /* where they go: never over a file that exists */
    if (mkdirs(dir)) {
        BAD("cannot create the directory %s: %s", dir, strerror(errno));
        goto out;
    }
    snprintf(st_path, sizeof st_path, "%s/model.safetensors", dir);
    snprintf(cf_path, sizeof cf_path, "%s/config.json", dir);
    if (access(st_path, F_OK) == 0 || (fmt == MGC_EXPORT_HF && access(cf_path, F_OK) == 0)) {
        BAD("%s already holds an export (%s): choose another directory, or move it away first",
            dir, access(st_path, F_OK) == 0 ? "model.safetensors" : "config.json");
        goto out;
    }
    /* the header: every tensor's dtype, shape and byte range */
    size_t es = mgc_dtype_size((mgc_dtype)dtype), cap = 256, len = 0;
    for (int i = 0; i < x.n; i++) /* the name, and room for the rest of the entry */
        cap += strlen(x.out[i].name) + 200;
    uint64_t off = 0, most = 0;
    hdr = malloc(cap);
    if (!hdr) {
        BAD("out of memory");
        goto out;
    }
    len += (size_t)snprintf(hdr + len, cap - len, "{\"__metadata__\":{\"format\":\"pt\",\"source\":\"mgc\"}");
    for (int i = 0; i < x.n; i++) {
        out_t *o = &x.out[i];
        o->off = off;
        uint64_t n = out_numel(o);
        len += (size_t)snprintf(hdr + len, cap - len, ",\"%s\":{\"dtype\":\"%s\",\"shape\":[", o->name,
                                st_dtype(dtype));
        for (int d = 0; d < o->rank; d++)
            len += (size_t)snprintf(hdr + len, cap - len, "%s%" PRId64, d ? "," : "", o->dim[d]);
        len += (size_t)snprintf(hdr + len, cap - len, "],\"data_offsets\":[%" PRIu64 ",%" PRIu64 "]}", off,
                                off + n * es);
        off += n * es;
        if (o->src->numel > most) most = o->src->numel;
    }
    len += (size_t)snprintf(hdr + len, cap - len, "}");
    while (len % 8) hdr[len++] = ' '; /* the data 8-aligned */
    fd = open(ckpt, O_RDONLY);
    src = malloc((size_t)most * 4 + 4);
    val = malloc((size_t)most * 4 + 4);
    buf = malloc((size_t)most * es + 8);
    if (fd < 0) {
        BAD("cannot open %s: %s", ckpt, strerror(errno));
        goto out;
    }
    if (!src || !val || !buf) {
        BAD("out of memory for %s's largest tensor", ckpt);
        goto out;
    }
    snprintf(st_tmp, sizeof st_tmp, "%s.partial", st_path);
    out_fd = open(st_tmp, O_WRONLY | O_CREAT | O_EXCL, 0644);
    if (out_fd < 0) {
        BAD("cannot create %s: %s", st_tmp, strerror(errno));
        st_tmp[0] = 0;
        goto out;
    }
    unsigned char n8[8];
    for (int i = 0; i < 8; i++)
        n8[i] = (unsigned char)((uint64_t)len >> (8 * i));
    if (put_all(out_fd, n8, 8) || put_all(out_fd, hdr, len)) goto wfail;
    const mgc_ckpt_tensor *loaded = NULL;
    for (int i = 0; i < x.n; i++) {
        const out_t *o = &x.out[i];
        if (o->src != loaded) {
            if (read_src(&x, fd, o->src, src)) {
                BAD("cannot read '%s' from %s", o->src->name, ckpt);
                goto out;
            }
            loaded = o->src;
        }
        fill(&x, o, src, val);
        uint64_t n = out_numel(o);
        for (uint64_t k = 0; k < n; k++) {
            uint32_t u;
            if (dtype == MGC_DT_F32) memcpy(&u, &val[k], 4);
            else u = dtype == MGC_DT_BF16 ? mgc_f32_to_bf16(val[k]) : mgc_f32_to_f16(val[k]);
            for (size_t b = 0; b < es; b++)
                buf[k * es + b] = (unsigned char)(u >> (8 * b));
        }
        if (put_all(out_fd, buf, (size_t)n * es)) goto wfail;
    }
    if (fsync(out_fd) || close(out_fd)) {
        out_fd = -1;
        goto wfail;
    }
    out_fd = -1;
    if (fmt == MGC_EXPORT_HF) {
        snprintf(cf_tmp, sizeof cf_tmp, "%s.partial", cf_path);
        if (write_config(&x, dtype, cf_tmp, err, errsz)) {
            cf_tmp[0] = 0;
            goto out;
        }
    }
    /* both complete: the weights, then the config, under their names (a config.json only ever
     * stands beside its weights; neither existed before, checked above) */
    if (rename(st_tmp, st_path)) goto wfail;
    st_tmp[0] = 0;
    if (cf_tmp[0] && rename(cf_tmp, cf_path)) {
        BAD("cannot rename %s: %s", cf_tmp, strerror(errno));
        unlink(st_path);
        goto out;
    }
    cf_tmp[0] = 0;
    rc = 0;
    goto out;
wfail:
    BAD("cannot write %s: %s", st_tmp[0] ? st_tmp : dir, strerror(errno));
out:
    if (out_fd >= 0) close(out_fd);
    if (fd >= 0) close(fd);
    if (st_tmp[0]) unlink(st_tmp);
    if (cf_tmp[0]) unlink(cf_tmp);
    free(src), free(val), free(buf), free(hdr), free(x.out);
    mgc_ckpt_info_free(&x.info);
    return rc;
}

/* ---- import: Hugging Face's layout back into a checkpoint ------------------------------------ */

typedef struct st_tensor { /* one entry of a safetensors header */
    char name[256];
    int dtype; /* MGC_DT_F32, MGC_DT_F16, MGC_DT_BF16; -1 another */
    int rank;
    int64_t dim[8];
    uint64_t a, b; /* data offsets */
    int used;
} st_tensor;

typedef struct st_file {
    unsigned char *raw; /* the whole file, mapped read-only */
    size_t len, data;   /* bytes; where the data starts */
    st_tensor *t;
    int n;
    char path[4200];
} st_file;

/* A small JSON reader for the header: {"name": {"dtype": "F32", "shape": [...],
 * "data_offsets": [a, b]}, ..., "__metadata__": {...}}.  Every value it does not need is
 * skipped whole; anything malformed is an error (never a crash). */
typedef struct jr {
    const char *p, *end;
    int bad;
} jr;

static void j_ws(jr *j) {
    while (j->p < j->end && (*j->p == ' ' || *j->p == '\t' || *j->p == '\n' || *j->p == '\r')) j->p++;
}
static int j_lit(jr *j, char c) {
    j_ws(j);
    if (j->p < j->end && *j->p == c) {
        j->p++;
        return 1;
    }
    return 0;
}
static int j_str(jr *j, char *out, size_t n) { /* ASCII and simple escapes */
    j_ws(j);
    if (j->p >= j->end || *j->p != '"') return j->bad = 1, 0;
    j->p++;
    size_t k = 0;
    while (j->p < j->end && *j->p != '"') {
        char c = *j->p++;
        if (c == '\\') {
            if (j->p >= j->end) return j->bad = 1, 0;
            c = *j->p++;
            if (c == 'u') { /* kept as '?': names here are ASCII */
                if (j->end - j->p < 4) return j->bad = 1, 0;
                j->p += 4;
                c = '?';
            } else if (c == 'n') c = '\n';
            else if (c == 't') c = '\t';
        }
        if (k + 1 < n) out[k++] = c;
    }
    if (j->p >= j->end) return j->bad = 1, 0;
    j->p++;
    if (n) out[k] = 0;
    return 1;
}
static int j_int(jr *j, int64_t *v) {
    j_ws(j);
    char *e = NULL;
    if (j->p >= j->end || !(*j->p == '-' || (*j->p >= '0' && *j->p <= '9'))) return j->bad = 1, 0;
    char buf[32];
    size_t k = 0;
    while (j->p + k < j->end && k < sizeof buf - 1 && (j->p[k] == '-' || (j->p[k] >= '0' && j->p[k] <= '9'))) {
        buf[k] = j->p[k];
        k++;
    }
    buf[k] = 0;
    long long x = strtoll(buf, &e, 10);
    if (!e || *e) return j->bad = 1, 0;
    j->p += k;
    *v = x;
    return 1;
}
static void j_skip(jr *j, int depth) { /* any value */
    j_ws(j);
    if (j->bad || j->p >= j->end || depth > 32) {
        j->bad = 1;
        return;
    }
    char c = *j->p;
    if (c == '"') {
        char tmp[2];
        j_str(j, tmp, sizeof tmp);
    } else if (c == '{' || c == '[') {
        char close = c == '{' ? '}' : ']';
        j->p++;
        if (j_lit(j, close)) return;
        do {
            if (c == '{') {
                char tmp[2];
                if (!j_str(j, tmp, sizeof tmp) || !j_lit(j, ':')) {
                    j->bad = 1;
                    return;
                }
            }
            j_skip(j, depth + 1);
        } while (!j->bad && j_lit(j, ','));
        if (!j_lit(j, close)) j->bad = 1;
    } else {
        while (j->p < j->end && *j->p != ',' && *j->p != '}' && *j->p != ']') j->p++;
    }
}

static int st_open(const char *path, st_file *f, char *err, size_t errsz) {
    memset(f, 0, sizeof *f);
    snprintf(f->path, sizeof f->path, "%s", path);
    int fd = open(path, O_RDONLY);
    if (fd < 0) return BAD("cannot open %s: %s", path, strerror(errno));
    struct stat sb;
    if (fstat(fd, &sb) || sb.st_size < 8) {
        close(fd);
        return BAD("%s: not a safetensors file (shorter than its 8-byte header length)", path);
    }
    f->len = (size_t)sb.st_size;
    /* mapped, not read: a published model's shard is gigabytes */
    void *m = mmap(NULL, f->len, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (m == MAP_FAILED) return BAD("cannot map %s: %s", path, strerror(errno));
    f->raw = m;
    uint64_t hl = 0;
    for (int i = 0; i < 8; i++)
        hl |= (uint64_t)f->raw[i] << (8 * i);
    if (hl > f->len - 8) return BAD("%s: not a safetensors file (a header of %" PRIu64 " bytes in %zu)", path, hl, f->len);
    f->data = 8 + (size_t)hl;
    jr j = {(const char *)f->raw + 8, (const char *)f->raw + 8 + hl, 0};
    int cap = 0;
    if (!j_lit(&j, '{')) return BAD("%s: the header is not a JSON object", path);
    if (!j_lit(&j, '}'))
        do {
            char key[256];
            if (!j_str(&j, key, sizeof key) || !j_lit(&j, ':')) break;
            if (!strcmp(key, "__metadata__")) {
                j_skip(&j, 0);
                continue;
            }
            if (f->n == cap) {
                cap = cap ? 2 * cap : 64;
                st_tensor *t = realloc(f->t, (size_t)cap * sizeof *t);
                if (!t) return BAD("out of memory");
                f->t = t;
            }
            st_tensor *t = &f->t[f->n++];
            memset(t, 0, sizeof *t);
            snprintf(t->name, sizeof t->name, "%s", key);
            t->dtype = -1;
            int got = 0;
            if (!j_lit(&j, '{')) {
                j.bad = 1;
                break;
            }
            if (!j_lit(&j, '}'))
                do {
                    char k2[64], dt[16];
                    if (!j_str(&j, k2, sizeof k2) || !j_lit(&j, ':')) break;
                    if (!strcmp(k2, "dtype")) {
                        if (!j_str(&j, dt, sizeof dt)) break;
                        t->dtype = !strcmp(dt, "F32") ? MGC_DT_F32 : !strcmp(dt, "F16") ? MGC_DT_F16
                                 : !strcmp(dt, "BF16") ? MGC_DT_BF16 : -1;
                        got |= 1;
                    } else if (!strcmp(k2, "shape") || !strcmp(k2, "data_offsets")) {
                        int shape = k2[0] == 's', k = 0;
                        int64_t v[8];
                        if (!j_lit(&j, '[')) {
                            j.bad = 1;
                            break;
                        }
                        if (!j_lit(&j, ']')) {
                            do {
                                if (k == 8 || !j_int(&j, &v[k]) || v[k] < 0) {
                                    j.bad = 1;
                                    break;
                                }
                                k++;
                            } while (j_lit(&j, ','));
                            if (!j.bad && !j_lit(&j, ']')) j.bad = 1;
                        }
                        if (shape) {
                            t->rank = k;
                            memcpy(t->dim, v, (size_t)k * sizeof *v);
                            got |= 2;
                        } else if (k == 2) {
                            t->a = (uint64_t)v[0], t->b = (uint64_t)v[1];
                            got |= 4;
                        } else {
                            j.bad = 1;
                        }
                    } else {
                        j_skip(&j, 1);
                    }
                } while (!j.bad && j_lit(&j, ','));
            if (!j.bad && !j_lit(&j, '}')) j.bad = 1;
            if (j.bad) break;
            if (got != 7) return BAD("%s: tensor '%s' lacks its dtype, shape or data_offsets", path, t->name);
            uint64_t n = 1;
            for (int d = 0; d < t->rank; d++)
                n = t->dim[d] && n > UINT64_MAX / (uint64_t)t->dim[d] ? UINT64_MAX : n * (uint64_t)t->dim[d];
            size_t es = t->dtype < 0 ? 0 : mgc_dtype_size((mgc_dtype)t->dtype);
            if (t->a > t->b || t->b > f->len - f->data || (es && n != UINT64_MAX && t->b - t->a != n * es))
                return BAD("%s: tensor '%s' has data_offsets [%" PRIu64 ", %" PRIu64 ") that do not fit its "
                           "shape or the file",
                           path, t->name, t->a, t->b);
        } while (!j.bad && j_lit(&j, ','));
    if (j.bad || !j_lit(&j, '}')) return BAD("%s: its JSON header is malformed near byte %zu", path,
                                             (size_t)(j.p - (const char *)f->raw));
    return 0;
}

static void st_close(st_file *f) {
    if (f->raw) munmap(f->raw, f->len);
    free(f->t);
    memset(f, 0, sizeof *f);
}

/* The safetensors files of a model directory: model.safetensors, or the shards that
 * model.safetensors.index.json's weight_map names (each once).  0, or -1 with err. */
static int st_open_dir(const char *dir, st_file **files, int *n, char *err, size_t errsz) {
    char path[4200];
    *files = NULL, *n = 0;
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    if (access(path, F_OK) == 0) {
        if (!(*files = calloc(1, sizeof **files))) return BAD("out of memory");
        *n = 1;
        return st_open(path, &(*files)[0], err, errsz);
    }
    snprintf(path, sizeof path, "%s/model.safetensors.index.json", dir);
    FILE *fp = fopen(path, "rb");
    if (!fp) return BAD("%s has neither model.safetensors nor model.safetensors.index.json", dir);
    char *json = calloc(1, 16 << 20);
    size_t jl = json ? fread(json, 1, (16 << 20) - 1, fp) : 0;
    fclose(fp);
    jr j = {json, json + jl, 0};
    char names[64][256];
    int nn = 0, found = 0;
    if (json && j_lit(&j, '{') && !j_lit(&j, '}'))
        do {
            char key[64];
            if (!j_str(&j, key, sizeof key) || !j_lit(&j, ':')) break;
            if (strcmp(key, "weight_map")) {
                j_skip(&j, 0);
                continue;
            }
            found = 1;
            if (!j_lit(&j, '{')) {
                j.bad = 1;
                break;
            }
            if (!j_lit(&j, '}'))
                do {
                    char tn[256], fn[256];
                    if (!j_str(&j, tn, sizeof tn) || !j_lit(&j, ':') || !j_str(&j, fn, sizeof fn)) break;
                    int seen = 0;
                    for (int i = 0; i < nn && !seen; i++)
                        seen = !strcmp(names[i], fn);
                    if (seen) continue;
                    if (nn == 64 || strchr(fn, '/')) {
                        j.bad = 1;
                        break;
                    }
                    snprintf(names[nn++], sizeof names[0], "%s", fn);
                } while (!j.bad && j_lit(&j, ','));
            if (!j.bad && !j_lit(&j, '}')) j.bad = 1;
        } while (!j.bad && j_lit(&j, ','));
    free(json);
    if (j.bad || !found || nn == 0)
        return BAD("%s: no weight_map of shard files (at most 64, in the same directory)", path);
    if (!(*files = calloc((size_t)nn, sizeof **files))) return BAD("out of memory");
    *n = nn;
    for (int i = 0; i < nn; i++) {
        snprintf(path, sizeof path, "%s/%s", dir, names[i]);
        if (st_open(path, &(*files)[i], err, errsz)) return -1;
    }
    return 0;
}

/* The value of "key" in a flat JSON object (config.json), as text; 0 when absent. */
static int cfg_json(const char *json, const char *key, char *out, size_t n) {
    char pat[80];
    snprintf(pat, sizeof pat, "\"%s\"", key);
    const char *p = strstr(json, pat);
    if (!p) return 0;
    p += strlen(pat);
    while (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r') p++;
    if (*p++ != ':') return 0;
    while (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r') p++;
    size_t k = 0;
    if (*p == '"') {
        p++;
        while (*p && *p != '"' && k + 1 < n) out[k++] = *p++;
    } else {
        while (*p && *p != ',' && *p != '}' && *p != '\n' && *p != ' ' && k + 1 < n) out[k++] = *p++;
    }
    out[k] = 0;
    return 1;
}

static int ends(const char *s, const char *suffix) {
    size_t a = strlen(s), b = strlen(suffix);
    return a >= b && !strcmp(s + a - b, suffix);
}

typedef struct imp {
    ctx *x;
    st_file *f; /* the model's files (shards) */
    int nf;
    const char *dir;
} imp;

/* The inverse of fill(): an HF tensor's values v back into the source tensor's s. */
static void unfill(const ctx *x, const out_t *o, const float *v, float *s) {
    const mgc_ckpt_tensor *t = o->src;
    int64_t inner = (int64_t)(t->numel / (uint64_t)t->dim[0]), d = x->head_dim;
    switch (o->kind) {
    case X_ROWS:
        memcpy(s + o->r0 * inner, v, (size_t)((o->r1 - o->r0) * inner) * sizeof *v);
        return;
    case X_TRANSPOSE: {
        int64_t N = t->dim[0], K = inner;
        for (int64_t a = 0; a < N; a++)
            for (int64_t b = 0; b < K; b++)
                s[a * K + b] = v[b * N + a];
        return;
    }
    case X_QKV: {
        int64_t per = x->heads / x->groups, at = 0;
        for (int64_t j = 0; j < x->groups; j++) {
            int64_t base = j * (per + 2) * d;
            int64_t r0 = o->part == 0 ? base : o->part == 1 ? base + per * d : base + (per + 1) * d;
            int64_t nr = o->part == 0 ? per * d : d;
            memcpy(s + r0 * inner, v + at * inner, (size_t)(nr * inner) * sizeof *v);
            at += nr;
        }
        return;
    }
    case X_EXPERT: {
        int64_t N = t->dim[1], K = t->dim[2];
        memcpy(s + ((int64_t)o->part * N + o->r0) * K, v, (size_t)((o->r1 - o->r0) * K) * sizeof *v);
        return;
    }
    case X_GPT2_QKV: {
        int64_t a = x->heads, cols = 3 * a * d, K = inner;
        for (int64_t c = 0; c < cols; c++) {
            int64_t p = c / (a * d), h = (c / d) % a, e = c % d, r = h * 3 * d + p * d + e;
            if (t->rank == 1) s[r] = v[c];
            else
                for (int64_t b = 0; b < K; b++)
                    s[r * K + b] = v[b * cols + c];
        }
        return;
    }
    }
}

/* mgc_ckpt_fill_fn: tensor t from every HF tensor that maps into it */
static int imp_fill(void *c, const mgc_ckpt_tensor *t, float *s, char *err, size_t errsz) {
    imp *im = c;
    ctx *x = im->x;
    memset(s, 0, (size_t)t->numel * sizeof *s); /* vocabulary padding rows: zero */
    int any = 0;
    for (int i = 0; i < x->n; i++) {
        const out_t *o = &x->out[i];
        if (strcmp(o->src->name, t->name)) continue;
        st_tensor *h = NULL;
        const st_file *hf = NULL;
        for (int q = 0; q < im->nf && !h; q++)
            for (int k = 0; k < im->f[q].n && !h; k++)
                if (!strcmp(im->f[q].t[k].name, o->name)) h = &im->f[q].t[k], hf = &im->f[q];
        if (!h) return BAD("%s has no tensor '%s', which this plan's model needs: import a model of the "
                           "plan's architecture and sizes",
                           im->dir, o->name);
        int same = h->rank == o->rank;
        for (int d = 0; same && d < o->rank; d++)
            same = h->dim[d] == o->dim[d];
        if (!same || h->dtype < 0) {
            char want[80] = "", got[80] = "";
            for (int d = 0, k = 0; d < o->rank; d++)
                k += snprintf(want + k, sizeof want - (size_t)k, "%s%" PRId64, d ? "x" : "", o->dim[d]);
            for (int d = 0, k = 0; d < h->rank && d < 8; d++)
                k += snprintf(got + k, sizeof got - (size_t)k, "%s%" PRId64, d ? "x" : "", h->dim[d]);
            return BAD("%s: tensor '%s' is %s%s, this plan's model needs %s: import a model of the "
                       "plan's sizes",
                       hf->path, o->name, h->dtype < 0 ? "of an unsupported dtype, " : "", got, want);
        }
        uint64_t n = out_numel(o);
        float *v = malloc((size_t)n * sizeof *v + 4);
        if (!v) return BAD("out of memory");
        const unsigned char *b = hf->raw + hf->data + h->a;
        for (uint64_t k = 0; k < n; k++) {
            if (h->dtype == MGC_DT_F32) {
                uint32_t u = (uint32_t)b[4 * k] | (uint32_t)b[4 * k + 1] << 8 | (uint32_t)b[4 * k + 2] << 16 |
                             (uint32_t)b[4 * k + 3] << 24;
                memcpy(&v[k], &u, 4);
            } else {
                uint16_t u = (uint16_t)(b[2 * k] | b[2 * k + 1] << 8);
                v[k] = h->dtype == MGC_DT_BF16 ? mgc_bf16_to_f32(u) : mgc_f16_to_f32(u);
            }
        }
        unfill(x, o, v, s);
        free(v);
        h->used = 1;
        any = 1;
    }
    if (!any) return BAD("this plan's model's parameter '%s' has no counterpart in the hf layout", t->name);
    return 0;
}

int mgc_import(const mgc_plan *plan, const char *dir, const char *ckpt, char *err, size_t errsz) {
    ctx x;
    memset(&x, 0, sizeof x);
    x.plan = plan, x.err = err, x.errsz = errsz;
    mgc_ckpt_model pm;
    memset(&pm, 0, sizeof pm);
    st_file *f = NULL;
    int nf = 0;
    char cpath[4200], *json = NULL;
    int rc = -1;
    if (model_sizes(&x) || mgc_ckpt_model_of(plan, &pm, err, errsz)) goto out;
    x.model = &pm;
    if (plan_hf(&x)) goto out;
    int gpt2 = x.fam == FAM_GPT2, moe = x.fam == FAM_MIXTRAL || x.fam == FAM_QWEN3_MOE;
    /* config.json: the architecture and what the tensors' shapes cannot show */
    snprintf(cpath, sizeof cpath, "%s/config.json", dir);
    FILE *cf = fopen(cpath, "rb");
    if (!cf) {
        BAD("cannot open %s: %s (mgc-import reads a Hugging Face model directory: config.json and "
            "model.safetensors)",
            cpath, strerror(errno));
        goto out;
    }
    json = calloc(1, 1 << 20);
    size_t jl = json ? fread(json, 1, (1 << 20) - 1, cf) : 0;
    fclose(cf);
    if (!json || !jl) {
        BAD("cannot read %s", cpath);
        goto out;
    }
    char v[64];
    const char *want_type = fam_type[x.fam];
    /* LLaMA and Mistral are one architecture but for the window, compared below (Mistral 7B's
     * window of 4096 is no window at 4096 tokens) */
    int llamaish = x.fam == FAM_LLAMA || x.fam == FAM_MISTRAL;
    if (!cfg_json(json, "model_type", v, sizeof v) ||
        (strcmp(v, want_type) && !(llamaish && (!strcmp(v, "llama") || !strcmp(v, "mistral"))))) {
        int got = cfg_json(json, "model_type", v, sizeof v);
        /* Qwen3 is LLaMA with query and key norms, Qwen3-MoE Mixtral's MoE with them: the one
         * setting that tells them apart */
        int with = (x.fam == FAM_LLAMA && !strcmp(v, "qwen3")) || (x.fam == FAM_MIXTRAL && !strcmp(v, "qwen3_moe"));
        int without = (x.fam == FAM_QWEN3 && !strcmp(v, "llama")) || (x.fam == FAM_QWEN3_MOE && !strcmp(v, "mixtral"));
        const char *hint = got && with      ? " (it has query and key norms: compile with --set model.qk_layernorm=true)"
                           : got && without ? " (it has no query and key norms: compile with --set model.qk_layernorm=false)"
                                            : "";
        BAD("%s: model_type is \"%s\" but this plan's model is %s-style: import a %s model, or "
            "compile a plan of this one's architecture%s",
            cpath, got ? v : "(none)", want_type, want_type, hint);
        goto out;
    }
    if (x.fam == FAM_QWEN3_MOE) { /* the routed weights renormalised (softmax) or not (presoftmax) */
        int want_norm = cfg_i(plan, "moe.router_score", 0) != 2;
        int got_norm = !cfg_json(json, "norm_topk_prob", v, sizeof v) || strcmp(v, "false");
        if (got_norm != want_norm) {
            BAD("%s: norm_topk_prob is %s but this plan's router is %s: compile the plan with --set "
                "moe.router_score=%s",
                cpath, got_norm ? "true" : "false", want_norm ? "softmax" : "presoftmax",
                got_norm ? "softmax" : "presoftmax");
            goto out;
        }
    }
    if (llamaish || x.fam == FAM_MIXTRAL) { /* the sliding window: absent or null is none */
        int64_t want_w = 0, got_w = 0;
        plan_window(plan, &want_w); /* uniform: plan_hf refused a mixed one */
        if (cfg_json(json, "sliding_window", v, sizeof v) && strcmp(v, "null")) got_w = strtoll(v, NULL, 10);
        if (want_w >= x.seq) want_w = 0;
        if (got_w >= x.seq || got_w < 0) got_w = 0;
        if (got_w != want_w) {
            BAD("%s: its sliding window is %" PRId64 " keys at this plan's %" PRId64 " tokens, this "
                "plan's model has %" PRId64 " (0: none): compile the plan with --set "
                "model.window_size=%" PRId64,
                cpath, got_w, x.seq, want_w, got_w);
            goto out;
        }
    }
    struct {
        const char *key;
        double want;
        int is_int;
    } checks[] = {
        {gpt2 ? "n_head" : "num_attention_heads", (double)x.heads, 1},
        {gpt2 ? "n_head" : "num_key_value_heads", (double)x.groups, 1},
        {gpt2 ? "layer_norm_epsilon" : "rms_norm_eps", cfg_f(plan, "model.norm_eps", 1e-5), 0},
        {gpt2 ? "n_layer" : "rope_theta", gpt2 ? (double)x.layers : cfg_f(plan, "model.rotary_base", 10000), 0},
        {x.fam == FAM_MIXTRAL ? "num_local_experts" : moe ? "num_experts" : gpt2 ? "n_head" : "num_attention_heads",
         moe ? (double)cfg_i(plan, "moe.num_experts", 0) : (double)x.heads, 1},
        {moe ? "num_experts_per_tok" : gpt2 ? "n_head" : "num_attention_heads",
         moe ? (double)cfg_i(plan, "moe.top_k", 0) : (double)x.heads, 1},
    };
    for (size_t i = 0; i < sizeof checks / sizeof checks[0]; i++) {
        if (!cfg_json(json, checks[i].key, v, sizeof v)) {
            if (!gpt2 && !strcmp(checks[i].key, "num_key_value_heads") && x.groups == x.heads) continue;
            BAD("%s: no %s: is it a transformers config.json?", cpath, checks[i].key);
            goto out;
        }
        double got = strtod(v, NULL);
        if (checks[i].is_int ? got != checks[i].want : fabs(got - checks[i].want) > 1e-6 * fabs(checks[i].want)) {
            BAD("%s: %s is %s but this plan's model has %.9g: compile the plan with the model's own "
                "settings",
                cpath, checks[i].key, v, checks[i].want);
            goto out;
        }
    }
    if (cfg_json(json, "tie_word_embeddings", v, sizeof v) &&
        (strcmp(v, "true") == 0) != (cfg_i(plan, "model.tie_embeddings", 0) != 0)) {
        BAD("%s: tie_word_embeddings is %s but this plan's model has tie_embeddings %s: compile the "
            "plan with --set model.tie_embeddings=%s",
            cpath, v, cfg_i(plan, "model.tie_embeddings", 0) ? "true" : "false", v);
        goto out;
    }
    if (st_open_dir(dir, &f, &nf, err, errsz)) goto out;
    imp im = {&x, f, nf, dir};
    if (mgc_ckpt_write_model(plan, ckpt, imp_fill, &im, err, errsz)) goto out;
    /* everything read belongs to the model (but GPT-2's causal-mask buffers) */
    for (int q = 0; q < nf; q++)
        for (int k = 0; k < f[q].n; k++) {
            const char *nm = f[q].t[k].name;
            int buffer = ends(nm, ".attn.bias") || ends(nm, ".attn.masked_bias") || ends(nm, "rotary_emb.inv_freq");
            if (!f[q].t[k].used && !buffer) {
                BAD("%s: tensor '%s' has no place in this plan's model: import a model of the plan's "
                    "architecture (the checkpoint was not kept)",
                    f[q].path, nm);
                unlink(ckpt);
                goto out;
            }
        }
    rc = 0;
out:
    for (int q = 0; q < nf; q++)
        st_close(&f[q]);
    free(f);
    free(json), free(x.out);
    mgc_ckpt_model_free(&pm);
    return rc;
}
