/* test_facts.c - parameter counts and FLOPs against closed forms written
 * here, independently of compiler/ir.c and compiler/facts.c.
 *
 * Every model is given twice: as YAML text (what mgc reads) and as an `arch`
 * row (what the closed forms read).  Parameter counts are exact integers;
 * FLOPs are compared at relative 1e-12.  Sizes are deliberately not powers of
 * two, so a wrong term cannot hide behind a coincidence. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config.h"
#include "diag.h"
#include "facts.h"
#include "ir.h"
#include "json.h"
#include "testlib.h"

/* ---- the architecture, independently of config.h ----------------------- */

typedef struct arch {
    int64_t V, divisor, tp; /* vocabulary, padding divisor, tensor degree */
    int64_t s, P;           /* sequence; learned position rows (0: none) */
    int64_t h, L, a, g, d;  /* hidden, layers, heads, kv heads, head dim */
    int64_t f;              /* dense MLP width */
    int ln;                 /* LayerNorm (weight + bias); else RMSNorm */
    int swiglu;             /* 3 matrices; else GELU, 2 */
    int bias;               /* add_bias_linear */
    int qkv_bias;           /* bias on QKV */
    int tied;               /* output layer = embedding */
    int64_t E, k, fe;       /* experts, top-k, expert width (E = 0: dense) */
    int64_t ns, fs;         /* shared experts and each one's width */
    const int *moe;         /* (L) 1 for MoE layers; NULL: none */
    int64_t B, b;           /* global batch, microbatch (sequences) */
    double cf;              /* capacity factor; 0 dropless */
} arch;

static int64_t padded(const arch *m) {
    int64_t u = m->divisor * m->tp;
    return (m->V + u - 1) / u * u;
}

static int64_t moe_layers(const arch *m) {
    int64_t n = 0;
    for (int64_t l = 0; m->moe && l < m->L; l++)
        n += m->moe[l];
    return n;
}

/* One MLP of width f with the arch's activation and biases. */
static uint64_t mlp_params(const arch *m, int64_t f) {
    uint64_t up = (uint64_t)(m->swiglu ? 2 * f : f);
    uint64_t n = up * (uint64_t)m->h + (uint64_t)f * (uint64_t)m->h;
    if (m->bias) n += up + (uint64_t)m->h;
    return n;
}

/* Parameters with vocabulary V (unpadded or padded); active: k of E experts. */
static uint64_t closed_params(const arch *m, int64_t V, int active) {
    uint64_t h = (uint64_t)m->h, norm = m->ln ? 2 * h : h;
    uint64_t qkv = (uint64_t)((m->a + 2 * m->g) * m->d), q = (uint64_t)(m->a * m->d);
    uint64_t attn = qkv * h + q * h + (m->qkv_bias ? qkv : 0) + (m->bias ? h : 0);
    uint64_t dense = 2 * norm + attn + mlp_params(m, m->f);
    uint64_t moe = 2 * norm + attn + h * (uint64_t)m->E +
                   (uint64_t)(active ? m->k : m->E) * mlp_params(m, m->fe) +
                   (m->ns ? mlp_params(m, m->ns * m->fs) : 0);
    uint64_t n = (uint64_t)V * h * (m->tied ? 1 : 2) + (uint64_t)m->P * h + norm;
    for (int64_t l = 0; l < m->L; l++)
        n += (m->moe && m->moe[l]) ? moe : dense;
    return n;
}

static uint64_t closed_embedding(const arch *m) {
    return (uint64_t)m->V * (uint64_t)m->h * (m->tied ? 1 : 2) + (uint64_t)m->P * (uint64_t)m->h;
}

/* Megatron-LM's current formula (megatron.md 3.1), which has no router term:
 *   F = T 6 [h f phi L_dense + h (f_e k + f_s) phi L_moe + L (h (q + 2kv) + q h) + h V_pad]
 *     + S2 L 6q (1/2) 2,    T = B s, S2 = B s^2, phi = 3 (SwiGLU) or 2. */
static double megatron_flops(const arch *m) {
    double T = (double)m->B * (double)m->s, S2 = (double)m->B * (double)m->s * (double)m->s;
    double h = (double)m->h, q = (double)(m->a * m->d), kv = (double)(m->g * m->d);
    double phi = m->swiglu ? 3 : 2, Lm = (double)moe_layers(m), Ld = (double)m->L - Lm;
    double fs = (double)(m->ns * m->fs);
    return T * 6 *
               (h * (double)m->f * phi * Ld + h * ((double)m->fe * (double)m->k + fs) * phi * Lm +
                (double)m->L * (h * (q + 2 * kv) + q * h) + h * (double)padded(m)) +
           S2 * (double)m->L * 6 * q * 0.5 * 2;
}

/* Router GEMMs over the iteration: 3 passes x 2 T h E per MoE layer. */
static double router_flops(const arch *m) {
    return 6.0 * (double)m->B * (double)m->s * (double)m->h * (double)m->E * (double)moe_layers(m);
}

/* Forward FLOPs of every decoder layer, router included (what full
 * recompute re-runs; the output layer is not recomputed). */
static double layer_forward_flops(const arch *m) {
    double T = (double)m->B * (double)m->s, S2 = (double)m->B * (double)m->s * (double)m->s;
    double h = (double)m->h, q = (double)(m->a * m->d), kv = (double)(m->g * m->d);
    double phi = m->swiglu ? 3 : 2, Lm = (double)moe_layers(m), Ld = (double)m->L - Lm;
    double fs = (double)(m->ns * m->fs);
    return 2 * T *
               (h * (double)m->f * phi * Ld + h * ((double)m->fe * (double)m->k + fs) * phi * Lm +
                h * (double)m->E * Lm + (double)m->L * (h * (q + 2 * kv) + q * h)) +
           2 * S2 * (double)m->L * q;
}

/* ---- loading -------------------------------------------------------------- */

typedef struct loaded {
    mgc_config *c;
    mgc_graph *g;
    mgc_facts f;
    mgc_diags d;
    int ok;
} loaded;

static void load(const char *yaml, loaded *L) {
    memset(L, 0, sizeof *L);
    mgc_diags_init(&L->d);
    L->c = mgc_config_new();
    mgc_config_load_text(L->c, "test.yaml", yaml, strlen(yaml), &L->d);
    if (L->d.errors == 0) mgc_config_finalize(L->c, &L->d);
    if (L->d.errors == 0) L->g = mgc_ir_build(L->c, &L->d);
    if (L->g && L->d.errors == 0) mgc_facts_compute(L->c, L->g, &L->f, &L->d);
    L->ok = L->g && L->d.errors == 0;
    if (!L->ok) mgc_diags_print(&L->d, stderr);
}

static void unload(loaded *L) {
    mgc_ir_free(L->g);
    mgc_config_free(L->c);
    mgc_diags_free(&L->d);
}

/* Parameter counts of a loaded model against the arch's closed forms. */
static void check_params(const loaded *L, const arch *m) {
    const mgc_param_counts *p = &L->f.params;
    uint64_t emb = closed_embedding(m);
    T_EQ_U64(p->total, closed_params(m, m->V, 0));
    T_EQ_U64(p->total_padded, closed_params(m, padded(m), 0));
    T_EQ_U64(p->active, closed_params(m, m->V, 1));
    T_EQ_U64(p->embedding, emb);
    T_EQ_U64(p->non_embedding, closed_params(m, m->V, 0) - emb);
    T_EQ_U64(p->active_non_embedding, closed_params(m, m->V, 1) - emb);
    T_EQ_I64(L->f.padded_vocab_size, padded(m));
    T_EQ_U64(L->f.tokens_per_iteration, (uint64_t)(m->B * m->s));
    /* the breakdown adds up */
    uint64_t sum = 0;
    for (int k = 0; k < MGC_IR_PCLASS__COUNT; k++)
        sum += p->by_class[k];
    T_EQ_U64(sum, p->total);
    T_EQ_U64(p->by_class[MGC_IR_PCLASS_ROUTER], (uint64_t)(m->h * m->E * moe_layers(m)));
    T_EQ_U64(p->by_class[MGC_IR_PCLASS_OUTPUT_LAYER], m->tied ? 0 : (uint64_t)(m->V * m->h));
    T_EQ_U64(p->by_class[MGC_IR_PCLASS_POS_EMBEDDING], (uint64_t)(m->P * m->h));
}

/* Model and hardware FLOPs against Megatron's closed form (+ our router). */
static void check_flops(const loaded *L, const arch *m, const char *recompute) {
    const mgc_flop_counts *fl = &L->f.flops;
    double meg = megatron_flops(m);
    T_NEAR_REL(fl->model_per_iteration, meg + router_flops(m), 1e-12);
    T_NEAR_REL(fl->router_per_iteration, router_flops(m), 1e-12);
    T_NEAR_REL(fl->model_per_iteration - fl->router_per_iteration, meg, 1e-12);
    T_NEAR_REL(fl->model_per_token, (meg + router_flops(m)) / (double)(m->B * m->s), 1e-12);
    double extra = 0;
    double S2 = (double)m->B * (double)m->s * (double)m->s;
    if (!strcmp(recompute, "full")) extra = layer_forward_flops(m);
    if (!strcmp(recompute, "selective")) extra = 2 * S2 * (double)m->L * (double)(m->a * m->d);
    if (m->cf > 0) {
        /* capacity: the experts run on E*C padded rows per microbatch */
        double T = (double)(m->s * m->b), Tk = T * (double)m->k;
        double C = ceil(Tk / (double)m->E * m->cf);
        double rows_extra = (double)m->E * C - Tk;
        double mb = (double)m->B / (double)m->b, phi = m->swiglu ? 3 : 2;
        double exec =
            2 * rows_extra * (double)m->h * (double)m->fe * phi * (double)moe_layers(m) * mb;
        extra += 3 * exec;
        if (!strcmp(recompute, "full")) extra += exec;
    }
    T_NEAR_REL(fl->hardware_per_iteration, meg + router_flops(m) + extra, 1e-12);
}

/* ---- models ----------------------------------------------------------------- */

static void test_gpt2_124m(void) {
    /* GPT-2 small: the published 124,439,808 */
    static const char *y =
        "model: {vocab_size: 50257, seq_length: 1024, hidden_size: 768, num_layers: 12,\n"
        "        num_attention_heads: 12}\n"
        "training: {micro_batch_size: 8, global_batch_size: 512}\n";
    arch m = {.V = 50257,
              .divisor = 128,
              .tp = 1,
              .s = 1024,
              .P = 1024,
              .h = 768,
              .L = 12,
              .a = 12,
              .g = 12,
              .d = 64,
              .f = 3072,
              .ln = 1,
              .bias = 1,
              .qkv_bias = 1,
              .tied = 1,
              .B = 512,
              .b = 8};
    loaded L;
    load(y, &L);
    T_CHECK(L.ok);
    if (L.ok) {
        T_EQ_U64(L.f.params.total, 124439808u);
        T_EQ_U64(closed_params(&m, m.V, 0), 124439808u);
        check_params(&L, &m);
        check_flops(&L, &m, "none");
        T_CHECK(L.f.gpt_style);
        /* 72 B s L h^2 (1 + s/6h + V/12hL) */
        double B = 512, s = 1024, Lh = 12, h = 768, V = 50304;
        double n = 72 * B * s * Lh * h * h * (1 + s / (6 * h) + V / (12 * h * Lh));
        T_NEAR_REL(L.f.flops.narayanan2021_per_iteration, n, 1e-12);
    }
    unload(&L);
}

static void test_llama2_7b(void) {
    /* LLaMA-2 7B: the published 6,738,415,616 */
    static const char *y =
        "model: {vocab_size: 32000, seq_length: 4096, hidden_size: 4096, num_layers: 32,\n"
        "        num_attention_heads: 32, ffn_hidden_size: 11008, normalization: rmsnorm,\n"
        "        activation: swiglu, position_embedding: rotary, add_bias_linear: false,\n"
        "        tie_embeddings: false}\n"
        "training: {micro_batch_size: 1, global_batch_size: 1024, recompute: full}\n";
    arch m = {.V = 32000,
              .divisor = 128,
              .tp = 1,
              .s = 4096,
              .h = 4096,
              .L = 32,
              .a = 32,
              .g = 32,
              .d = 128,
              .f = 11008,
              .swiglu = 1,
              .B = 1024,
              .b = 1};
    loaded L;
    load(y, &L);
    T_CHECK(L.ok);
    if (L.ok) {
        T_EQ_U64(L.f.params.total, 6738415616u);
        T_EQ_U64(closed_params(&m, m.V, 0), 6738415616u);
        check_params(&L, &m);
        check_flops(&L, &m, "full");
        T_CHECK(!L.f.gpt_style);
    }
    unload(&L);
}

static void test_mixtral(void) {
    /* Mixtral 8x7B: 46,702,792,704 total */
    static const char *y =
        "model: {vocab_size: 32000, seq_length: 4096, hidden_size: 4096, num_layers: 32,\n"
        "        num_attention_heads: 32, num_query_groups: 8, ffn_hidden_size: 14336,\n"
        "        normalization: rmsnorm, activation: swiglu, position_embedding: rotary,\n"
        "        add_bias_linear: false, tie_embeddings: false}\n"
        "moe: {num_experts: 8, top_k: 2, aux_loss_coeff: 0.01}\n"
        "training: {micro_batch_size: 2, global_batch_size: 256, recompute: selective}\n";
    static const int all[32] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1,
                                1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1};
    arch m = {.V = 32000,
              .divisor = 128,
              .tp = 1,
              .s = 4096,
              .h = 4096,
              .L = 32,
              .a = 32,
              .g = 8,
              .d = 128,
              .f = 14336,
              .swiglu = 1,
              .E = 8,
              .k = 2,
              .fe = 14336,
              .moe = all,
              .B = 256,
              .b = 2};
    loaded L;
    load(y, &L);
    T_CHECK(L.ok);
    if (L.ok) {
        T_EQ_U64(L.f.params.total, 46702792704u);
        T_EQ_U64(closed_params(&m, m.V, 0), 46702792704u);
        check_params(&L, &m);
        check_flops(&L, &m, "selective");
        T_EQ_I64(L.f.num_moe_layers, 32);
        T_EQ_U64(L.f.params.dense_layer, 0);
    }
    unload(&L);
}

static void test_gqa_swiglu(void) {
    /* GQA (g = 4 of a = 12), explicit head_dim not h/a, QKV bias only
     * (Qwen style), SwiGLU, RMSNorm, rotary, untied; tensor 2 pads V. */
    static const char *y =
        "model: {vocab_size: 50001, seq_length: 700, hidden_size: 1320, num_layers: 7,\n"
        "        num_attention_heads: 12, num_query_groups: 4, head_dim: 104,\n"
        "        ffn_hidden_size: 3544, normalization: rmsnorm, activation: swiglu,\n"
        "        position_embedding: rotary, add_bias_linear: false, add_qkv_bias: true,\n"
        "        tie_embeddings: false, make_vocab_size_divisible_by: 96}\n"
        "parallel: {tensor: 2, world_size: 2}\n"
        "training: {micro_batch_size: 3, global_batch_size: 42}\n";
    arch m = {.V = 50001,
              .divisor = 96,
              .tp = 2,
              .s = 700,
              .h = 1320,
              .L = 7,
              .a = 12,
              .g = 4,
              .d = 104,
              .f = 3544,
              .swiglu = 1,
              .qkv_bias = 1,
              .B = 42,
              .b = 3};
    loaded L;
    load(y, &L);
    T_CHECK(L.ok);
    if (L.ok) {
        check_params(&L, &m);
        check_flops(&L, &m, "none");
        T_EQ_I64(L.f.padded_vocab_size, 50112); /* ceil(50001 / 192) * 192 */
    }
    unload(&L);
}

static void test_mqa_gpt(void) {
    /* MQA (g = 1), GELU, LayerNorm, biases, learned positions beyond s, tied */
    static const char *y =
        "model: {vocab_size: 30011, seq_length: 333, max_position_embeddings: 500,\n"
        "        hidden_size: 640, num_layers: 5, num_attention_heads: 10,\n"
        "        num_query_groups: 1, ffn_hidden_size: 2500}\n"
        "training: {micro_batch_size: 5, global_batch_size: 35, recompute: full}\n";
    arch m = {.V = 30011,
              .divisor = 128,
              .tp = 1,
              .s = 333,
              .P = 500,
              .h = 640,
              .L = 5,
              .a = 10,
              .g = 1,
              .d = 64,
              .f = 2500,
              .ln = 1,
              .bias = 1,
              .qkv_bias = 1,
              .tied = 1,
              .B = 35,
              .b = 5};
    loaded L;
    load(y, &L);
    T_CHECK(L.ok);
    if (L.ok) {
        check_params(&L, &m);
        check_flops(&L, &m, "full");
    }
    unload(&L);
}

static void test_moe_shared(void) {
    /* shared experts, first dense layer, layer_freq 2, biases everywhere
     * (expert biases too), learned positions, tied, GELU: layers 1, 3, 5 */
    static const char *y =
        "model: {vocab_size: 10007, seq_length: 300, hidden_size: 392, num_layers: 7,\n"
        "        num_attention_heads: 7, ffn_hidden_size: 1200}\n"
        "moe: {num_experts: 6, top_k: 2, ffn_hidden_size: 424, shared_experts: 2,\n"
        "      shared_expert_ffn_hidden_size: 300, first_dense_layers: 1, layer_freq: 2,\n"
        "      aux_loss_coeff: 0.01, z_loss_coeff: 0.001}\n"
        "training: {micro_batch_size: 2, global_batch_size: 6}\n";
    static const int moe[7] = {0, 1, 0, 1, 0, 1, 0};
    arch m = {.V = 10007,
              .divisor = 128,
              .tp = 1,
              .s = 300,
              .P = 300,
              .h = 392,
              .L = 7,
              .a = 7,
              .g = 7,
              .d = 56,
              .f = 1200,
              .ln = 1,
              .bias = 1,
              .qkv_bias = 1,
              .tied = 1,
              .E = 6,
              .k = 2,
              .fe = 424,
              .ns = 2,
              .fs = 300,
              .moe = moe,
              .B = 6,
              .b = 2};
    loaded L;
    load(y, &L);
    T_CHECK(L.ok);
    if (L.ok) {
        check_params(&L, &m);
        check_flops(&L, &m, "none");
        T_EQ_I64(L.f.num_moe_layers, 3);
        T_EQ_U64(L.f.params.by_class[MGC_IR_PCLASS_SHARED_EXPERT], 3 * mlp_params(&m, 600));
        T_EQ_U64(L.f.params.moe_layer - L.f.params.moe_layer_active, 4 * mlp_params(&m, 424));
        T_CHECK(L.f.params.dense_layer > 0);
    }
    unload(&L);
}

static void test_moe_explicit_capacity(void) {
    /* explicit MoE layer list, SwiGLU experts, capacity factor 1.3 (the
     * experts run on E*C padded rows: hardware FLOPs exceed model FLOPs) */
    static const char *y =
        "model: {vocab_size: 9001, seq_length: 250, hidden_size: 360, num_layers: 6,\n"
        "        num_attention_heads: 9, num_query_groups: 3, ffn_hidden_size: 1000,\n"
        "        normalization: rmsnorm, activation: swiglu, position_embedding: rotary,\n"
        "        add_bias_linear: false, tie_embeddings: false}\n"
        "moe: {num_experts: 5, top_k: 3, ffn_hidden_size: 280, layers: [1, 4, 5],\n"
        "      capacity_factor: 1.3, aux_loss_coeff: 0.01}\n"
        "training: {micro_batch_size: 3, global_batch_size: 9, recompute: full}\n";
    static const int moe[6] = {0, 1, 0, 0, 1, 1};
    arch m = {.V = 9001,
              .divisor = 128,
              .tp = 1,
              .s = 250,
              .h = 360,
              .L = 6,
              .a = 9,
              .g = 3,
              .d = 40,
              .f = 1000,
              .swiglu = 1,
              .E = 5,
              .k = 3,
              .fe = 280,
              .moe = moe,
              .B = 9,
              .b = 3,
              .cf = 1.3};
    loaded L;
    load(y, &L);
    T_CHECK(L.ok);
    if (L.ok) {
        check_params(&L, &m);
        check_flops(&L, &m, "full");
        T_CHECK(L.f.flops.forward_per_microbatch > L.f.flops.model_forward_per_microbatch);
    }
    unload(&L);
}

static void test_narayanan_gpt_style(void) {
    /* a fresh GPT-style shape: f = 4h, MHA, GELU; eq. 3 exactly, and its
     * full-recompute version is 96/72 of it */
    static const char *y =
        "model: {vocab_size: 30001, seq_length: 1000, hidden_size: 840, num_layers: 9,\n"
        "        num_attention_heads: 12}\n"
        "training: {micro_batch_size: 3, global_batch_size: 48, recompute: full}\n";
    arch m = {.V = 30001,
              .divisor = 128,
              .tp = 1,
              .s = 1000,
              .P = 1000,
              .h = 840,
              .L = 9,
              .a = 12,
              .g = 12,
              .d = 70,
              .f = 3360,
              .ln = 1,
              .bias = 1,
              .qkv_bias = 1,
              .tied = 1,
              .B = 48,
              .b = 3};
    loaded L;
    load(y, &L);
    T_CHECK(L.ok);
    if (L.ok) {
        T_CHECK(L.f.gpt_style);
        double B = 48, s = 1000, Ll = 9, h = 840, V = (double)padded(&m);
        double n = 72 * B * s * Ll * h * h * (1 + s / (6 * h) + V / (12 * h * Ll));
        T_NEAR_REL(L.f.flops.narayanan2021_per_iteration, n, 1e-12);
        double n96 = 96 * B * s * Ll * h * h * (1 + s / (6 * h) + V / (12 * h * Ll));
        T_NEAR_REL(L.f.flops.narayanan2021_full_recompute_per_iteration, n96, 1e-12);
        check_params(&L, &m);
        check_flops(&L, &m, "full");
        /* eq. 3 counts attention unhalved: it exceeds the model FLOPs by
         * exactly 3 x 2 x B s^2 L q (the masked half of QK^T and PV) */
        double q = 840;
        T_NEAR_REL(L.f.flops.narayanan2021_per_iteration - L.f.flops.model_per_iteration,
                   6 * B * s * s * Ll * q, 1e-9);
    }
    unload(&L);
}

static void test_narayanan_general(void) {
    /* the generalised pre-2025 formula on a GQA + SwiGLU + MoE + shared
     * model, against the formula typed out from megatron.md 3.1 */
    static const char *y =
        "model: {vocab_size: 10007, seq_length: 300, hidden_size: 392, num_layers: 7,\n"
        "        num_attention_heads: 14, num_query_groups: 2, head_dim: 30,\n"
        "        ffn_hidden_size: 1100, activation: swiglu, normalization: rmsnorm,\n"
        "        position_embedding: rotary, add_bias_linear: false}\n"
        "moe: {num_experts: 6, top_k: 2, ffn_hidden_size: 424, shared_experts: 1,\n"
        "      shared_expert_ffn_hidden_size: 212, layers: [0, 2, 3, 6]}\n"
        "training: {micro_batch_size: 2, global_batch_size: 10}\n";
    loaded L;
    load(y, &L);
    T_CHECK(L.ok);
    if (L.ok) {
        double B = 10, s = 300, h = 392, Ll = 7, Lm = 4, a = 14, g = 2, q = 14 * 30;
        double V = 10112; /* ceil(10007 / 128) * 128 */
        double n = 12 * B * s * h * h *
                   (Ll * (1 + g / a + s / h) * q / h + (Ll - Lm) * (1100 / h) * 1.5 +
                    Lm * (424 / h) * 2 * 1.5 + Lm * (212 / h) * 1.5 + V / (2 * h));
        T_NEAR_REL(L.f.flops.narayanan2021_per_iteration, n, 1e-12);
        T_CHECK(!L.f.gpt_style);
        static const int moe[7] = {1, 0, 1, 1, 0, 0, 1};
        arch m = {.V = 10007,
                  .divisor = 128,
                  .tp = 1,
                  .s = 300,
                  .h = 392,
                  .L = 7,
                  .a = 14,
                  .g = 2,
                  .d = 30,
                  .f = 1100,
                  .swiglu = 1,
                  .tied = 1,
                  .E = 6,
                  .k = 2,
                  .fe = 424,
                  .ns = 1,
                  .fs = 212,
                  .moe = moe,
                  .B = 10,
                  .b = 2};
        check_params(&L, &m);
        check_flops(&L, &m, "none");
    }
    unload(&L);
}

/* ---- output ----------------------------------------------------------------- */

static char *capture_text(const loaded *L, int json) {
    FILE *f = tmpfile();
    if (!f) return NULL;
    if (json) {
        mgc_json j;
        mgc_json_init(&j, f, 2);
        mgc_json_obj_begin(&j, NULL);
        mgc_facts_print_json(L->c, &L->f, &j);
        mgc_json_obj_end(&j);
        mgc_json_finish(&j);
    } else {
        mgc_facts_print_text(L->c, &L->f, f);
    }
    long n = ftell(f);
    char *buf = n >= 0 ? malloc((size_t)n + 1) : NULL;
    if (buf) {
        rewind(f);
        size_t r = fread(buf, 1, (size_t)n, f);
        buf[r] = 0;
    }
    fclose(f);
    return buf;
}

static void test_output(void) {
    static const char *y =
        "model: {name: out-test, vocab_size: 50257, seq_length: 1024, hidden_size: 768,\n"
        "        num_layers: 12, num_attention_heads: 12}\n"
        "training: {micro_batch_size: 8, global_batch_size: 512}\n";
    loaded L;
    load(y, &L);
    T_CHECK(L.ok);
    if (!L.ok) return unload(&L);
    char *t = capture_text(&L, 0);
    T_CHECK(t && strstr(t, "124,439,808"));
    T_CHECK(t && strstr(t, "124.4M"));
    T_CHECK(t && strstr(t, "padded to 50304"));
    T_CHECK(t && strstr(t, "Megatron-LM"));
    T_CHECK(t && strstr(t, "Narayanan et al. 2021"));
    T_CHECK(t && strstr(t, "96 instead of 72"));
    free(t);
    char *j = capture_text(&L, 1);
    const char *keys[] = {"\"padded_vocab_size\": 50304",
                          "\"tokens_per_iteration\": 524288",
                          "\"total\": 124439808",
                          "\"active\": 124439808",
                          "\"total_padded\": 124475904",
                          "\"embedding\": 39383808",
                          "\"non_embedding\": 85056000",
                          "\"model_per_iteration\"",
                          "\"hardware_per_iteration\"",
                          "\"narayanan2021_per_iteration\"",
                          "\"narayanan2021_full_recompute_per_iteration\""};
    for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++) {
        int found = j && strstr(j, keys[i]);
        if (!found) fprintf(stderr, "missing in JSON: %s\n", keys[i]);
        T_CHECK(found);
    }
    free(j);
    unload(&L);
}

int main(void) {
    test_gpt2_124m();
    test_llama2_7b();
    test_mixtral();
    test_gqa_swiglu();
    test_mqa_gpt();
    test_moe_shared();
    test_moe_explicit_capacity();
    test_narayanan_gpt_style();
    test_narayanan_general();
    test_output();
    return t_summary("test_facts");
}
