/* test_ir.c - the model IR: structure, shapes, FLOPs per op, graph
 * invariants (topological order, producer/consumer links) and failures.
 *
 * Expected values are computed here from the sizes typed in each test, not
 * from the graph's own dims.  Sizes are not powers of two. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config.h"
#include "diag.h"
#include "ir.h"
#include "json.h"
#include "testlib.h"

static mgc_graph *build(const char *yaml, mgc_config **cfg) {
    mgc_diags d;
    mgc_diags_init(&d);
    mgc_config *c = mgc_config_new();
    mgc_config_load_text(c, "test.yaml", yaml, strlen(yaml), &d);
    if (d.errors == 0) mgc_config_finalize(c, &d);
    mgc_graph *g = d.errors == 0 ? mgc_ir_build(c, &d) : NULL;
    if (!g || d.errors) mgc_diags_print(&d, stderr);
    T_CHECK(g != NULL);
    T_EQ_I64(d.errors, 0);
    if (g) {
        mgc_diags v;
        mgc_diags_init(&v);
        T_EQ_I64(mgc_ir_validate(g, &v), 0);
        if (v.n) mgc_diags_print(&v, stderr);
        mgc_diags_free(&v);
    }
    mgc_diags_free(&d);
    if (cfg)
        *cfg = c;
    else
        mgc_config_free(c);
    return g;
}

static const mgc_ir_tensor *T(const mgc_graph *g, const char *name) {
    int32_t id = mgc_ir_find_tensor(g, name);
    if (id < 0) fprintf(stderr, "no tensor '%s'\n", name);
    return id >= 0 ? &g->tensors[id] : NULL;
}

/* "V=30080,h=640": a tensor's shape as axis symbols and sizes ("?" for
 * a missing tensor).  A small ring of buffers, so one check can use two. */
static const char *shp(const mgc_ir_tensor *t) {
    static char ring[4][128];
    static int next;
    char *buf = ring[next++ % 4];
    if (!t) return "?";
    int n = 0;
    buf[0] = 0;
    for (int i = 0; i < t->rank; i++)
        n += snprintf(buf + n, sizeof ring[0] - (size_t)n, "%s%s=%lld", i ? "," : "",
                      mgc_ir_axis_symbol(t->dim[i].axis), (long long)t->dim[i].size);
    return buf;
}

static const mgc_ir_op *op_named(const mgc_graph *g, const char *name) {
    for (int32_t i = 0; i < g->n_ops; i++)
        if (!strcmp(g->ops[i].name, name)) return &g->ops[i];
    fprintf(stderr, "no op '%s'\n", name);
    return NULL;
}

/* Counts of each op kind in layer l. */
static void kinds_in_layer(const mgc_graph *g, int32_t l, int *count) {
    memset(count, 0, sizeof(int) * MGC_IR_OP__COUNT);
    int32_t first = 0, end = 0;
    if (mgc_ir_layer_ops(g, l, &first, &end)) return;
    for (int32_t i = first; i < end; i++)
        count[g->ops[i].kind]++;
}

/* Invariants checked independently of mgc_ir_validate. */
static void check_invariants(const mgc_graph *g) {
    int32_t *uses = calloc((size_t)g->n_tensors, sizeof *uses);
    int32_t *prod = malloc((size_t)g->n_tensors * sizeof *prod);
    for (int32_t t = 0; t < g->n_tensors; t++)
        prod[t] = -1;
    int ok_order = 1, ok_prod = 1, ok_once = 1;
    for (int32_t i = 0; i < g->n_ops; i++) {
        const mgc_ir_op *op = &g->ops[i];
        for (int j = 0; j < op->n_in; j++) {
            const mgc_ir_tensor *t = &g->tensors[op->in[j]];
            int input = t->role == MGC_IR_ROLE_PARAM || t->role == MGC_IR_ROLE_TOKENS ||
                        t->role == MGC_IR_ROLE_LABELS || t->role == MGC_IR_ROLE_LOSS_MASK;
            /* produced earlier (seen in this very walk) or a graph input */
            if (!input && prod[op->in[j]] < 0) ok_order = 0;
            int dup = 0;
            for (int k = 0; k < j; k++)
                dup |= op->in[k] == op->in[j];
            if (!dup) uses[op->in[j]]++;
        }
        for (int j = 0; j < op->n_out; j++) {
            if (prod[op->out[j]] >= 0) ok_once = 0;
            prod[op->out[j]] = i;
        }
    }
    for (int32_t t = 0; t < g->n_tensors; t++) {
        if (g->tensors[t].producer != prod[t]) ok_prod = 0;
        T_EQ_I64(mgc_ir_producer(g, t), prod[t]);
        int32_t n = mgc_ir_consumers(g, t, NULL, 0);
        if (n != uses[t]) {
            fprintf(stderr, "consumers of '%s': %d, expected %d\n", g->tensors[t].name, (int)n,
                    (int)uses[t]);
            T_CHECK(0);
        }
        /* no dead values: everything but the losses is read by some op */
        mgc_ir_role r = g->tensors[t].role;
        if (r != MGC_IR_ROLE_LOSS && r != MGC_IR_ROLE_AUX_LOSS && uses[t] == 0) {
            fprintf(stderr, "tensor '%s' is never read\n", g->tensors[t].name);
            T_CHECK(0);
        }
    }
    T_CHECK(ok_order);
    T_CHECK(ok_prod);
    T_CHECK(ok_once);
    /* consumers lists are in op order and contain only readers */
    if (g->loss_mask >= 0) {
        int32_t ops[4];
        T_EQ_I64(mgc_ir_consumers(g, g->loss_mask, ops, 4), 1);
        T_EQ_I64(g->ops[ops[0]].kind, MGC_IR_OP_CROSS_ENTROPY);
    }
    /* a layer's ops are contiguous and in layer order */
    int32_t prev_end = 0;
    for (int32_t l = 0; l < (int32_t)g->dims.L; l++) {
        int32_t first, end;
        T_EQ_I64(mgc_ir_layer_ops(g, l, &first, &end), 0);
        T_CHECK(first >= prev_end);
        for (int32_t i = first; i < end; i++)
            T_EQ_I64(g->ops[i].layer, l);
        prev_end = end;
    }
    free(uses);
    free(prod);
}

/* ---- a dense GPT-style model --------------------------------------------------- */

static void test_dense_gpt(void) {
    /* s 333, b 5, h 640, a 10 (d 64), f 2500, V 30011 -> 30080, L 5 */
    static const char *y =
        "model: {vocab_size: 30011, seq_length: 333, max_position_embeddings: 500,\n"
        "        hidden_size: 640, num_layers: 5, num_attention_heads: 10,\n"
        "        ffn_hidden_size: 2500}\n"
        "training: {micro_batch_size: 5, global_batch_size: 35}\n";
    mgc_graph *g = build(y, NULL);
    if (!g) return;
    const int64_t s = 333, b = 5, h = 640, a = 10, d = 64, f = 2500, V = 30011, Vp = 30080, L = 5;
    check_invariants(g);
    T_EQ_I64(g->dims.T, s * b);
    T_EQ_I64(g->dtype, MGC_IR_DTYPE_BF16);
    /* embedding + dropout, 11 ops per layer, final norm + output + loss */
    T_EQ_I64(g->n_ops, 2 + 11 * L + 3);
    int k[MGC_IR_OP__COUNT];
    for (int32_t l = 0; l < L; l++) {
        kinds_in_layer(g, l, k);
        T_EQ_I64(k[MGC_IR_OP_NORM], 2);
        T_EQ_I64(k[MGC_IR_OP_LINEAR], 4);
        T_EQ_I64(k[MGC_IR_OP_QKV_SPLIT], 1);
        T_EQ_I64(k[MGC_IR_OP_ROPE], 0);
        T_EQ_I64(k[MGC_IR_OP_ATTENTION], 1);
        T_EQ_I64(k[MGC_IR_OP_DROPOUT_ADD], 2);
        T_EQ_I64(k[MGC_IR_OP_GELU], 1);
    }
    /* parameters: 2 + 12 per layer (LayerNorm w+b x2, qkv w+b, proj w+b,
     * fc1 w+b, fc2 w+b) + final norm 2; tied: no output layer tensor */
    int nparams = 0;
    for (int32_t i = 0; i < g->n_tensors; i++)
        nparams += g->tensors[i].role == MGC_IR_ROLE_PARAM;
    T_EQ_I64(nparams, 2 + 12 * L + 2);
    T_CHECK(mgc_ir_find_tensor(g, "output_layer.weight") < 0);
    T_EQ_I64(g->output_weight, g->word_embedding);

    const mgc_ir_tensor *we = T(g, "embedding.word_embeddings.weight");
    T_STREQ(shp(we), "V=30080,h=640");
    T_EQ_U64(we->numel, (uint64_t)(Vp * h));
    T_EQ_U64(we->numel_unpadded, (uint64_t)(V * h));
    T_EQ_U64(we->bytes, (uint64_t)(Vp * h * 2));
    T_STREQ(shp(T(g, "embedding.position_embeddings.weight")), "P=500,h=640");
    T_STREQ(shp(T(g, "tokens")), "s=333,b=5");
    T_EQ_I64(T(g, "tokens")->dtype, MGC_IR_DTYPE_INT64);
    T_STREQ(shp(T(g, "decoder.layers.3.self_attention.linear_qkv.weight")), "qkv=1920,h=640");
    T_CHECK(T(g, "decoder.layers.3.self_attention.linear_qkv.bias") != NULL);
    T_STREQ(shp(T(g, "decoder.layers.3.self_attention.query")), "s=333,b=5,a=10,d=64");
    T_STREQ(shp(T(g, "decoder.layers.3.mlp.linear_fc1.weight")), "f=2500,h=640");
    T_STREQ(shp(T(g, "decoder.layers.3.mlp.linear_fc2.weight")), "h=640,f=2500");
    T_EQ_I64(T(g, "decoder.layers.3.mlp.linear_fc2.weight")->init, MGC_IR_INIT_SCALED_NORMAL);
    T_CHECK(T(g, "decoder.layers.0.input_layernorm.bias")->flags & MGC_IR_TF_NORM);
    T_STREQ(shp(T(g, "output_layer.out")), "s=333,b=5,V=30080");
    T_EQ_I64(T(g, "loss")->rank, 0);
    T_EQ_I64(T(g, "loss")->dtype, MGC_IR_DTYPE_FP32);
    T_EQ_I64(g->tensors[g->loss].role, MGC_IR_ROLE_LOSS);

    /* FLOPs per op: 2mnk; the causal attention core is halved */
    const uint64_t Tk = (uint64_t)(s * b);
    T_EQ_U64(op_named(g, "decoder.layers.2.self_attention.linear_qkv")->flops, 2 * Tk * h * 3 * h);
    T_EQ_U64(op_named(g, "decoder.layers.2.self_attention.linear_proj")->flops, 2 * Tk * h * h);
    T_EQ_U64(op_named(g, "decoder.layers.2.mlp.linear_fc1")->flops, 2 * Tk * h * f);
    T_EQ_U64(op_named(g, "decoder.layers.2.self_attention.core_attention")->flops,
             (uint64_t)(4 * b * a * s * s * d / 2));
    T_EQ_U64(op_named(g, "output_layer")->flops, 2 * Tk * h * Vp);
    T_CHECK(op_named(g, "output_layer")->attr.linear.tied);
    T_EQ_U64(op_named(g, "decoder.layers.2.self_attn_bda")->flops, 0);
    /* bytes of a linear: x, w, bias, y */
    T_EQ_U64(op_named(g, "decoder.layers.2.mlp.linear_fc1")->bytes,
             2 * (Tk * h + (uint64_t)(f * h) + (uint64_t)f + Tk * f));
    /* split is a view: moves nothing */
    T_EQ_U64(op_named(g, "decoder.layers.2.self_attention.split_qkv")->bytes, 0);
    mgc_ir_free(g);
}

/* ---- GQA, rotary, untied, fp32 ------------------------------------------------------ */

static void test_gqa_rotary(void) {
    static const char *y =
        "model: {vocab_size: 50001, seq_length: 700, hidden_size: 1320, num_layers: 3,\n"
        "        num_attention_heads: 12, num_query_groups: 4, head_dim: 104,\n"
        "        ffn_hidden_size: 3544, normalization: rmsnorm, activation: swiglu,\n"
        "        position_embedding: rotary, rotary_percent: 0.5, add_bias_linear: false,\n"
        "        tie_embeddings: false}\n"
        "training: {micro_batch_size: 3, global_batch_size: 6, precision: fp32}\n";
    mgc_graph *g = build(y, NULL);
    if (!g) return;
    const int64_t s = 700, b = 3, h = 1320, a = 12, gq = 4, d = 104, f = 3544;
    check_invariants(g);
    T_EQ_I64(g->dtype, MGC_IR_DTYPE_FP32);
    T_EQ_I64(g->n_ops, 2 + 13 * 3 + 3);
    int k[MGC_IR_OP__COUNT];
    kinds_in_layer(g, 1, k);
    T_EQ_I64(k[MGC_IR_OP_ROPE], 2);
    T_EQ_I64(k[MGC_IR_OP_SWIGLU], 1);
    T_EQ_I64(k[MGC_IR_OP_GELU], 0);
    T_CHECK(mgc_ir_find_tensor(g, "embedding.position_embeddings.weight") < 0);
    T_CHECK(mgc_ir_find_tensor(g, "decoder.layers.1.input_layernorm.bias") < 0);
    T_CHECK(mgc_ir_find_tensor(g, "decoder.layers.1.self_attention.linear_qkv.bias") < 0);
    T_STREQ(shp(T(g, "decoder.layers.1.self_attention.linear_qkv.weight")), "qkv=2080,h=1320");
    T_STREQ(shp(T(g, "decoder.layers.1.self_attention.key")), "s=700,b=3,g=4,d=104");
    T_STREQ(shp(T(g, "decoder.layers.1.self_attention.linear_proj.weight")), "h=1320,q=1248");
    T_STREQ(shp(T(g, "decoder.layers.1.mlp.linear_fc1.weight")), "2f=7088,h=1320");
    T_STREQ(shp(T(g, "decoder.layers.1.mlp.activation.out")), "s=700,b=3,f=3544");
    T_STREQ(shp(T(g, "output_layer.weight")), "V=50048,h=1320");
    T_CHECK(g->output_weight != g->word_embedding);
    T_EQ_I64(g->tensors[g->output_weight].pclass, MGC_IR_PCLASS_OUTPUT_LAYER);

    const mgc_ir_op *rq = op_named(g, "decoder.layers.1.self_attention.rotary_q");
    T_EQ_I64(rq->attr.rope.rotary_dim, 52);
    const mgc_ir_op *at = op_named(g, "decoder.layers.1.self_attention.core_attention");
    T_EQ_I64(at->attr.attention.groups, gq);
    T_CHECK(at->attr.attention.causal);
    /* attention reads the rotated q and k and the unrotated v */
    T_STREQ(g->tensors[at->in[0]].name, "decoder.layers.1.self_attention.rotary_q.out");
    T_STREQ(g->tensors[at->in[2]].name, "decoder.layers.1.self_attention.value");
    T_EQ_U64(at->flops, (uint64_t)(2 * b * a * s * s * d));
    const uint64_t Tk = (uint64_t)(s * b);
    T_EQ_U64(op_named(g, "decoder.layers.1.self_attention.linear_qkv")->flops,
             2 * Tk * h * (uint64_t)((a + 2 * gq) * d));
    T_EQ_U64(op_named(g, "decoder.layers.1.self_attention.linear_proj")->flops,
             2 * Tk * (uint64_t)(a * d) * h);
    T_EQ_U64(op_named(g, "decoder.layers.1.mlp.linear_fc1")->flops, 2 * Tk * h * 2 * f);
    T_EQ_U64(op_named(g, "decoder.layers.1.mlp.linear_fc2")->flops, 2 * Tk * f * h);
    T_EQ_U64(T(g, "decoder.layers.1.mlp.linear_fc2.out")->bytes, Tk * h * 4);
    mgc_ir_free(g);
}

/* ---- MQA --------------------------------------------------------------------- */

static void test_mqa(void) {
    static const char *y =
        "model: {vocab_size: 777, seq_length: 90, hidden_size: 210, num_layers: 2,\n"
        "        num_attention_heads: 7, num_query_groups: 1}\n"
        "training: {micro_batch_size: 2, global_batch_size: 2}\n";
    mgc_graph *g = build(y, NULL);
    if (!g) return;
    check_invariants(g);
    T_STREQ(shp(T(g, "decoder.layers.0.self_attention.linear_qkv.weight")), "qkv=270,h=210");
    T_STREQ(shp(T(g, "decoder.layers.0.self_attention.value")), "s=90,b=2,g=1,d=30");
    mgc_ir_free(g);

    /* 100 * 0.58 is 57.99999999999999 in binary: 58 channels rotate, not 57 */
    static const char *r =
        "model: {vocab_size: 777, seq_length: 90, hidden_size: 400, num_layers: 1,\n"
        "        num_attention_heads: 4, position_embedding: rotary,\n"
        "        rotary_percent: 0.58}\n";
    g = build(r, NULL);
    if (!g) return;
    T_EQ_I64(op_named(g, "decoder.layers.0.self_attention.rotary_k")->attr.rope.rotary_dim, 58);
    mgc_ir_free(g);
}

/* ---- MoE: dropless with shared experts, explicit layer list ---------------------- */

static void test_moe_dropless(void) {
    static const char *y =
        "model: {vocab_size: 10007, seq_length: 300, hidden_size: 392, num_layers: 6,\n"
        "        num_attention_heads: 7, ffn_hidden_size: 1200, activation: swiglu,\n"
        "        normalization: rmsnorm, position_embedding: rotary, add_bias_linear: false}\n"
        "moe: {num_experts: 6, top_k: 2, ffn_hidden_size: 424, shared_experts: 2,\n"
        "      shared_expert_ffn_hidden_size: 300, layers: [1, 4, 5], aux_loss_coeff: 0.01,\n"
        "      z_loss_coeff: 0.001, router_score: sigmoid}\n"
        "training: {micro_batch_size: 2, global_batch_size: 4}\n";
    mgc_graph *g = build(y, NULL);
    if (!g) return;
    const int64_t s = 300, b = 2, h = 392, E = 6, kk = 2, fe = 424, Tn = s * b;
    check_invariants(g);
    T_EQ_I64(g->dims.L_moe, 3);
    T_EQ_I64(g->dims.R, Tn * kk);
    T_EQ_I64(g->dims.C, 0);
    /* dense layers 0, 2, 3: 13 ops (rotary); MoE layers 1, 4, 5: 6 + 2 rope +
     * norm, router, route, dispatch, fc1, act, fc2, combine, 3 shared, add, bda */
    int per_moe = 8 + 1 + 7 + 3 + 1 + 1;
    T_EQ_I64(g->n_ops, 2 + 3 * 13 + 3 * per_moe + 3);
    int k[MGC_IR_OP__COUNT];
    for (int32_t l = 0; l < 6; l++) {
        int moe = l == 1 || l == 4 || l == 5;
        kinds_in_layer(g, l, k);
        T_EQ_I64(k[MGC_IR_OP_MOE_ROUTE], moe);
        T_EQ_I64(k[MGC_IR_OP_MOE_DISPATCH], moe);
        T_EQ_I64(k[MGC_IR_OP_GROUPED_LINEAR], 2 * moe);
        T_EQ_I64(k[MGC_IR_OP_MOE_COMBINE], moe);
        T_EQ_I64(k[MGC_IR_OP_ADD], moe);
        T_EQ_I64(k[MGC_IR_OP_LINEAR], moe ? 2 + 1 + 2 : 4); /* qkv, proj, router, shared fc1/fc2 */
        T_EQ_I64(k[MGC_IR_OP_SWIGLU], moe ? 2 : 1);
        int32_t first, end;
        mgc_ir_layer_ops(g, l, &first, &end);
        T_EQ_I64(g->ops[end - 1].part, moe ? MGC_IR_PART_MOE : MGC_IR_PART_MLP);
    }
    T_STREQ(shp(T(g, "decoder.layers.4.mlp.router.weight")), "E=6,h=392");
    T_CHECK(mgc_ir_find_tensor(g, "decoder.layers.4.mlp.router.bias") < 0);
    T_STREQ(shp(T(g, "decoder.layers.4.mlp.router.route.probs")), "T=600,k=2");
    T_EQ_I64(T(g, "decoder.layers.4.mlp.router.route.probs")->dtype, MGC_IR_DTYPE_FP32);
    T_EQ_I64(T(g, "decoder.layers.4.mlp.router.route.experts")->dtype, MGC_IR_DTYPE_INT32);
    T_EQ_I64(T(g, "decoder.layers.4.mlp.router.route.aux_loss")->role, MGC_IR_ROLE_AUX_LOSS);
    T_EQ_I64(T(g, "decoder.layers.4.mlp.router.route.z_loss")->role, MGC_IR_ROLE_AUX_LOSS);
    /* dropless: exactly T*k token rows in total */
    T_STREQ(shp(T(g, "decoder.layers.4.mlp.token_dispatcher.dispatch.rows")), "R=1200,h=392");
    T_STREQ(shp(T(g, "decoder.layers.4.mlp.token_dispatcher.dispatch.tokens_per_expert")), "E=6");
    T_STREQ(shp(T(g, "decoder.layers.4.mlp.experts.linear_fc1.weight")), "E=6,2f=848,h=392");
    T_STREQ(shp(T(g, "decoder.layers.4.mlp.experts.linear_fc2.weight")), "E=6,h=392,f=424");
    T_STREQ(shp(T(g, "decoder.layers.4.mlp.shared_experts.linear_fc1.weight")), "2f=1200,h=392");
    T_STREQ(shp(T(g, "decoder.layers.4.mlp.token_dispatcher.combine.out")), "s=300,b=2,h=392");
    const mgc_ir_op *route = op_named(g, "decoder.layers.4.mlp.router.route");
    T_EQ_I64(route->n_out, 4);
    T_EQ_I64(route->attr.moe.score, MGC_SCORE_SIGMOID);
    T_EQ_I64(route->attr.moe.max_rows_per_expert, Tn);
    const mgc_ir_op *fc1 = op_named(g, "decoder.layers.4.mlp.experts.linear_fc1");
    T_EQ_U64(fc1->flops, (uint64_t)(2 * Tn * kk * 2 * fe * h));
    T_EQ_U64(fc1->model_flops, fc1->flops);
    T_EQ_U64(op_named(g, "decoder.layers.4.mlp.router")->flops, (uint64_t)(2 * Tn * h * E));
    /* the combine reads the expert output, the probabilities and the ids */
    const mgc_ir_op *comb = op_named(g, "decoder.layers.4.mlp.token_dispatcher.combine");
    T_EQ_I64(comb->in[1], route->out[0]);
    T_EQ_I64(comb->in[2], route->out[1]);
    mgc_ir_free(g);
}

static void test_moe_capacity(void) {
    /* capacity factor 1.3: C = ceil(T*k / E * 1.3) rows per expert, padded */
    static const char *y =
        "model: {vocab_size: 9001, seq_length: 250, hidden_size: 360, num_layers: 3,\n"
        "        num_attention_heads: 9, ffn_hidden_size: 1000}\n"
        "moe: {num_experts: 7, top_k: 3, ffn_hidden_size: 280, capacity_factor: 1.3,\n"
        "      aux_loss_coeff: 0.01, drop_policy: position}\n"
        "training: {micro_batch_size: 3, global_batch_size: 9}\n";
    mgc_graph *g = build(y, NULL);
    if (!g) return;
    check_invariants(g);
    const int64_t Tn = 750, kk = 3, E = 7, h = 360, fe = 280;
    const int64_t C = 418; /* ceil(2250 / 7 * 1.3) = ceil(417.857...) */
    T_EQ_I64(g->dims.C, C);
    T_EQ_I64(g->dims.R, E * C);
    T_STREQ(shp(T(g, "decoder.layers.2.mlp.token_dispatcher.dispatch.rows")), "R=2926,h=360");
    const mgc_ir_op *fc1 = op_named(g, "decoder.layers.2.mlp.experts.linear_fc1");
    T_EQ_U64(fc1->flops, (uint64_t)(2 * E * C * fe * h));
    T_EQ_U64(fc1->model_flops, (uint64_t)(2 * Tn * kk * fe * h));
    T_EQ_I64(fc1->attr.moe.capacity, C);
    T_EQ_I64(fc1->attr.moe.max_rows_per_expert, C);
    T_EQ_I64(fc1->attr.moe.drop_policy, MGC_DROP_POSITION);
    T_CHECK(T(g, "decoder.layers.2.mlp.experts.linear_fc1.bias") != NULL); /* add_bias_linear */
    T_CHECK(mgc_ir_find_tensor(g, "decoder.layers.2.mlp.router.route.z_loss") < 0);
    mgc_ir_free(g);
}

/* ---- validation, failures, output ------------------------------------------------- */

static void test_validate_catches(void) {
    static const char *y =
        "model: {vocab_size: 500, seq_length: 40, hidden_size: 96, num_layers: 2,\n"
        "        num_attention_heads: 6}\n";
    mgc_graph *g = build(y, NULL);
    if (!g) return;
    mgc_diags d;
    mgc_diags_init(&d);
    /* swap two dependent ops: the order is no longer topological */
    mgc_ir_op tmp = g->ops[3];
    g->ops[3] = g->ops[4];
    g->ops[4] = tmp;
    T_CHECK(mgc_ir_validate(g, &d) != 0);
    T_CHECK(d.errors > 0);
    g->ops[4] = g->ops[3];
    g->ops[3] = tmp;
    mgc_diags_clear(&d);
    /* a second tensor of the same name */
    int32_t dup = mgc_ir_add_tensor(g, "tokens", MGC_IR_ROLE_TOKENS, MGC_IR_DTYPE_INT64, 0, NULL);
    T_CHECK(dup >= 0);
    T_CHECK(mgc_ir_validate(g, &d) != 0);
    mgc_diags_free(&d);
    mgc_ir_free(g);
}

static void test_overflow(void) {
    /* adds on a fresh graph: 2^40 x 2^40 elements do not fit 64 bits */
    mgc_graph *g = mgc_ir_new();
    T_CHECK(g != NULL);
    if (!g) return;
    mgc_ir_dim dims[2] = {{MGC_IR_AXIS_SEQ, (int64_t)1 << 40},
                          {MGC_IR_AXIS_HIDDEN, (int64_t)1 << 40}};
    T_EQ_I64(mgc_ir_add_tensor(g, "huge", MGC_IR_ROLE_ACTIVATION, MGC_IR_DTYPE_FP32, 2, dims), -1);
    T_CHECK(g->failed);
    T_CHECK(strstr(g->fail_what, "huge") != NULL);
    mgc_ir_free(g);

    /* an op with a bad id or an output already produced fails softly */
    g = mgc_ir_new();
    mgc_ir_dim d1[1] = {{MGC_IR_AXIS_HIDDEN, 3}};
    int32_t x = mgc_ir_add_tensor(g, "x", MGC_IR_ROLE_TOKENS, MGC_IR_DTYPE_FP32, 1, d1);
    int32_t yv = mgc_ir_add_tensor(g, "y", MGC_IR_ROLE_ACTIVATION, MGC_IR_DTYPE_FP32, 1, d1);
    mgc_ir_op op;
    memset(&op, 0, sizeof op);
    op.kind = MGC_IR_OP_GELU;
    op.n_in = 1;
    op.in[0] = x;
    op.n_out = 1;
    op.out[0] = yv;
    T_EQ_I64(mgc_ir_add_op(g, &op), 0);
    T_EQ_I64(g->tensors[yv].producer, 0);
    T_EQ_I64(mgc_ir_add_op(g, &op), -1); /* y is already produced */
    op.out[0] = 99;
    T_EQ_I64(mgc_ir_add_op(g, &op), -1);
    mgc_ir_free(g);
    mgc_ir_free(NULL);

    /* a config whose logits [s, b, V] overflow 64 bits: NULL + a diagnostic */
    static const char *y =
        "model: {vocab_size: 2000000000, seq_length: 16000000, hidden_size: 64,\n"
        "        num_layers: 1, num_attention_heads: 1}\n"
        "training: {micro_batch_size: 60000000, global_batch_size: 60000000}\n";
    mgc_diags dg;
    mgc_diags_init(&dg);
    mgc_config *c = mgc_config_new();
    mgc_config_load_text(c, "big.yaml", y, strlen(y), &dg);
    if (dg.errors == 0) mgc_config_finalize(c, &dg);
    if (dg.errors == 0) {
        mgc_graph *big = mgc_ir_build(c, &dg);
        T_CHECK(big == NULL);
        T_CHECK(dg.errors == 1);
        T_CHECK(dg.n > 0 && strstr(dg.v[dg.n - 1].msg, "64 bits") != NULL);
        mgc_ir_free(big);
    } else {
        mgc_diags_print(&dg, stderr); /* the config checks refused it first: also fine */
    }
    mgc_config_free(c);
    mgc_diags_free(&dg);

    /* an unfinalized config is refused, not crashed on */
    mgc_diags_init(&dg);
    c = mgc_config_new();
    T_CHECK(mgc_ir_build(c, &dg) == NULL);
    T_CHECK(dg.errors == 1);
    mgc_config_free(c);
    mgc_diags_free(&dg);
}

static char *slurp(FILE *f) {
    long n = ftell(f);
    char *buf = n >= 0 ? malloc((size_t)n + 1) : NULL;
    if (buf) {
        rewind(f);
        size_t r = fread(buf, 1, (size_t)n, f);
        buf[r] = 0;
    }
    return buf;
}

static void test_print(void) {
    static const char *y =
        "model: {vocab_size: 500, seq_length: 40, hidden_size: 96, num_layers: 2,\n"
        "        num_attention_heads: 6}\n"
        "moe: {num_experts: 4, top_k: 2}\n";
    mgc_graph *g = build(y, NULL);
    if (!g) return;
    FILE *f = tmpfile();
    mgc_ir_print(g, f);
    char *t = slurp(f);
    fclose(f);
    int lines = 0;
    for (const char *p = t; p && (p = strstr(p, "\n  #")); p++)
        lines++;
    T_EQ_I64(lines, g->n_ops);
    T_CHECK(t &&
            strstr(t, "decoder.layers.1.mlp.experts.linear_fc1.weight: bf16[E=4, f=384, h=96]"));
    T_CHECK(t && strstr(t, "cross_entropy"));
    free(t);

    f = tmpfile();
    mgc_json j;
    mgc_json_init(&j, f, 0);
    mgc_json_obj_begin(&j, NULL);
    mgc_ir_print_json(g, &j);
    mgc_json_obj_end(&j);
    mgc_json_finish(&j);
    t = slurp(f);
    fclose(f);
    T_CHECK(t && strstr(t, "\"ir\":{"));
    T_CHECK(t && strstr(t, "\"kind\":\"moe_dispatch\""));
    T_CHECK(t && strstr(t, "\"axes\":[\"experts\",\"ffn\",\"hidden\"]"));
    /* brackets balance (strings here hold none) */
    int depth = 0, bad = 0;
    for (const char *p = t; p && *p; p++) {
        if (*p == '{' || *p == '[') depth++;
        if (*p == '}' || *p == ']') bad |= --depth < 0;
    }
    T_CHECK(!bad && depth == 0);
    free(t);
    mgc_ir_free(g);
}

int main(void) {
    test_dense_gpt();
    test_gqa_rotary();
    test_mqa();
    test_moe_dropless();
    test_moe_capacity();
    test_validate_catches();
    test_overflow();
    test_print();
    return t_summary("test_ir");
}
