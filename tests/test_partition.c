/* test_partition.c - partitioned forward programs: parameter shards,
 * splits, inserted collectives and their sequence numbers, the chunk
 * layout over pipeline ranks, and layouts that must be refused.
 *
 * Expected values come from the sizes typed here, not from the partitioner's
 * own arithmetic. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config.h"
#include "diag.h"
#include "ir.h"
#include "partition.h"
#include "plan.h"
#include "testlib.h"

#define NOG MGC_PARTITION_NO_GROUP

typedef struct built {
    mgc_config *c;
    mgc_graph *g;
    mgc_grid grid;
    mgc_plan *plan;
    mgc_plan_chunk *ch[8];
    mgc_partition_info *info[8];
    int ok;
    int part_diags; /* diagnostics the partitioner added (errors or not) */
} built;

static void built_free(built *b) {
    for (int r = 0; r < 8; r++) {
        if (b->ch[r]) mgc_partition_chunks_free(b->ch[r], b->grid.vp);
        if (b->info[r]) mgc_partition_info_free(b->info[r], b->grid.vp);
        free(b->ch[r]);
        free(b->info[r]);
    }
    mgc_plan_free(b->plan);
    mgc_ir_free(b->g);
    mgc_config_free(b->c);
    memset(b, 0, sizeof *b);
}

static built build_d(const char *yaml, const char *const *sets, mgc_diags *d) {
    built b;
    memset(&b, 0, sizeof b);
    b.c = mgc_config_new();
    mgc_config_load_text(b.c, "test.yaml", yaml, strlen(yaml), d);
    for (int i = 0; sets && sets[i]; i++)
        mgc_config_set(b.c, sets[i], "--set", d);
    if (!d->errors) mgc_config_finalize(b.c, d);
    if (!d->errors) b.g = mgc_ir_build(b.c, d);
    if (!d->errors && b.g) {
        int before = d->n;
        mgc_partition_grid(b.c, &b.grid);
        b.plan = mgc_plan_new();
        for (int64_t r = 0; r < b.grid.pp && r < 8 && !d->errors; r++) {
            b.ch[r] = calloc((size_t)b.grid.vp, sizeof *b.ch[r]);
            b.info[r] = calloc((size_t)b.grid.vp, sizeof *b.info[r]);
            mgc_partition_build_ex(b.c, b.g, &b.grid, r, b.plan, b.ch[r], b.info[r], d);
            for (int64_t v = 0; v < b.grid.vp && !d->errors; v++)
                mgc_partition_check(&b.ch[r][v], d);
        }
        b.part_diags = d->n - before;
    }
    b.ok = d->errors == 0;
    return b;
}

static built build(const char *yaml, const char *const *sets) {
    mgc_diags d;
    mgc_diags_init(&d);
    built b = build_d(yaml, sets, &d);
    if (!b.ok) mgc_diags_print(&d, stderr);
    mgc_diags_free(&d);
    return b;
}

static const char *GPT = "model:\n"
                         "  vocab_size: 1000\n"
                         "  make_vocab_size_divisible_by: 8\n"
                         "  seq_length: 240\n"
                         "  hidden_size: 192\n"
                         "  num_layers: 2\n"
                         "  num_attention_heads: 24\n"
                         "  hidden_dropout: 0.1\n"
                         "training:\n"
                         "  micro_batch_size: 3\n";

static const char *MOE = "model:\n"
                         "  vocab_size: 257\n"
                         "  make_vocab_size_divisible_by: 8\n"
                         "  seq_length: 96\n"
                         "  hidden_size: 96\n"
                         "  num_layers: 4\n"
                         "  num_attention_heads: 6\n"
                         "  num_query_groups: 2\n"
                         "  ffn_hidden_size: 192\n"
                         "  normalization: rmsnorm\n"
                         "  activation: swiglu\n"
                         "  position_embedding: rotary\n"
                         "  add_bias_linear: false\n"
                         "  tie_embeddings: false\n"
                         "moe:\n"
                         "  num_experts: 8\n"
                         "  top_k: 2\n"
                         "  ffn_hidden_size: 48\n"
                         "  shared_experts: 1\n"
                         "  shared_expert_ffn_hidden_size: 96\n"
                         "  first_dense_layers: 1\n"
                         "  aux_loss_coeff: 1.0e-2\n"
                         "  z_loss_coeff: 1.0e-3\n"
                         "training:\n"
                         "  micro_batch_size: 4\n";

/* ---- parameter shards ---------------------------------------------------------- */

/* Over the ranks of the groups a param is split by, the distinct elements
 * add up to the IR's global size; every IR param lives in exactly one
 * chunk (the tied word embedding in the first and the last). */
static void check_shards(const built *b) {
    const mgc_graph *g = b->g;
    const int64_t tp = b->grid.tp, ep = b->grid.ep, etp = b->grid.etp;
    const int64_t a = g->dims.a, kvg = g->dims.g, d = g->dims.d, h = g->dims.h;
    int *seen = calloc((size_t)g->n_tensors, sizeof *seen);
    for (int64_t r = 0; r < b->grid.pp; r++)
        for (int64_t v = 0; v < b->grid.vp; v++) {
            const mgc_plan_chunk *ch = &b->ch[r][v];
            const mgc_partition_info *in = &b->info[r][v];
            for (int64_t t = 0; t < ch->n_tensors; t++) {
                const mgc_plan_tensor *x = &ch->tensors[t];
                if (x->role != MGC_TR_PARAM) continue;
                int32_t ir = in->tensors[t].ir;
                T_CHECK(ir >= 0);
                if (ir < 0) continue;
                seen[ir]++;
                const mgc_ir_tensor *it = &g->tensors[ir];
                T_STREQ(mgc_plan_strat(b->plan, x->name), it->name);
                uint64_t local = x->bytes / mgc_dtype_size((mgc_dtype)x->dtype), total;
                if (it->pclass == MGC_IR_PCLASS_EXPERT) {
                    T_EQ_U64(x->split_axis, 0);
                    T_EQ_U64(x->split_group, MGC_GROUP_EP);
                    T_EQ_U64(in->tensors[t].split2_group, etp > 1 ? MGC_GROUP_ETP : NOG);
                    total = local * (uint64_t)ep *
                            (uint64_t)(in->tensors[t].split2_group == MGC_GROUP_ETP ? etp : 1);
                } else if (x->split_axis == MGC_PLAN_NO_SPLIT) {
                    T_EQ_U64(x->split_group, NOG);
                    total = local; /* replicated: counted once */
                } else if (it->dim[x->split_axis].axis == MGC_IR_AXIS_QKV && tp > kvg) {
                    /* kv heads replicated: each rank holds a/tp query heads
                     * and its group's k and v; g distinct groups */
                    uint64_t cols = it->rank > 1 ? (uint64_t)h : 1;
                    T_EQ_U64(local, (uint64_t)((a / tp + 2) * d) * cols);
                    total = (uint64_t)(tp * (a / tp) * d) * cols + (uint64_t)(kvg * 2 * d) * cols;
                } else {
                    T_EQ_U64(x->split_group, MGC_GROUP_TP);
                    total = local * (uint64_t)tp;
                }
                T_EQ_U64(total, it->numel);
            }
        }
    for (int32_t i = 0; i < g->n_tensors; i++) {
        const mgc_ir_tensor *it = &g->tensors[i];
        if (it->role != MGC_IR_ROLE_PARAM) continue;
        int want = i == g->word_embedding && g->output_weight == g->word_embedding &&
                           b->grid.pp * b->grid.vp > 1 && !b->c->derived.stages[0].loss
                       ? 2
                       : 1;
        if (seen[i] != want) fprintf(stderr, "param %s in %d chunks\n", it->name, seen[i]);
        T_EQ_I64(seen[i], want);
    }
    free(seen);
}

static void test_shards(void) {
    const char *mha[] = {"parallel.tensor=4", "parallel.world_size=8", "parallel.pipeline=2", NULL};
    const char *gqa_split[] = {"parallel.tensor=4", "parallel.world_size=4",
                               "model.num_query_groups=8", NULL};
    const char *gqa_repl[] = {"parallel.tensor=8", "parallel.world_size=8",
                              "model.num_query_groups=2", "model.add_qkv_bias=true", NULL};
    const char *mqa[] = {"parallel.tensor=6", "parallel.world_size=6", "model.num_query_groups=1",
                         "parallel.sequence_parallel=true", NULL};
    const char *const *cases[] = {mha, gqa_split, gqa_repl, mqa};
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        built b = build(GPT, cases[i]);
        T_CHECK(b.ok);
        if (b.ok) check_shards(&b);
        built_free(&b);
    }
    const char *moe_a[] = {"parallel.tensor=2", "parallel.sequence_parallel=true",
                           "parallel.expert=2", "parallel.world_size=4", NULL};
    const char *moe_b[] = {"parallel.tensor=2",     "parallel.sequence_parallel=true",
                           "parallel.expert=4",     "parallel.expert_tensor=1",
                           "parallel.world_size=4", NULL};
    const char *moe_c[] = {"parallel.expert=8", "parallel.world_size=16", "parallel.pipeline=2",
                           "training.global_batch_size=32", NULL};
    const char *const *moes[] = {moe_a, moe_b, moe_c};
    for (size_t i = 0; i < sizeof moes / sizeof *moes; i++) {
        built b = build(MOE, moes[i]);
        T_CHECK(b.ok);
        if (b.ok) check_shards(&b);
        built_free(&b);
    }
    /* the local shapes themselves: GQA with kv heads replicated over 8 ranks */
    built b = build(GPT, gqa_repl);
    if (b.ok) {
        const mgc_plan_chunk *ch = &b.ch[0][0];
        for (int64_t i = 0; i < ch->n_fwd; i++) {
            if (ch->fwd[i].kind != MGC_POP_QKV_SPLIT) continue;
            const mgc_plan_tensor *q = &ch->tensors[ch->fwd[i].out[0]],
                                  *k = &ch->tensors[ch->fwd[i].out[1]];
            T_EQ_I64(q->dim[2], 3); /* 24 heads / 8 */
            T_EQ_I64(k->dim[2], 1); /* one of 2 groups, shared by 4 ranks */
            T_EQ_I64(ch->fwd[i].iattr[1], 3);
        }
    }
    built_free(&b);
}

/* ---- splits ---------------------------------------------------------------------- */

static int32_t find(const built *b, int64_t r, const char *name) {
    const mgc_plan_chunk *ch = &b->ch[r][0];
    for (int64_t t = 0; t < ch->n_tensors; t++)
        if (!strcmp(mgc_plan_strat(b->plan, ch->tensors[t].name), name)) return (int32_t)t;
    fprintf(stderr, "no tensor %s\n", name);
    return -1;
}

static void test_splits(void) {
    const char *sets[] = {"parallel.tensor=4", "parallel.context=2",
                          "parallel.sequence_parallel=true", "parallel.world_size=8", NULL};
    built b = build(GPT, sets);
    T_CHECK(b.ok);
    if (!b.ok) return;
    const mgc_plan_chunk *ch = &b.ch[0][0];
    const mgc_partition_info *in = &b.info[0][0];
    struct {
        const char *name;
        int64_t d0, d1;
        uint16_t axis, group;
    } want[] = {
        /* V_pad: 1000 padded to a multiple of 8 * 4 = 1024, over 4 ranks */
        {"embedding.word_embeddings.weight", 256, 192, 0, MGC_GROUP_TP},
        {"decoder.layers.0.self_attention.linear_qkv.weight", 3 * 192 / 4, 192, 0, MGC_GROUP_TP},
        {"decoder.layers.0.self_attention.linear_proj.weight", 192, 192 / 4, 1, MGC_GROUP_TP},
        {"decoder.layers.0.mlp.linear_fc1.weight", 4 * 192 / 4, 192, 0, MGC_GROUP_TP},
        {"decoder.layers.0.mlp.linear_fc2.weight", 192, 4 * 192 / 4, 1, MGC_GROUP_TP},
        {"decoder.layers.0.mlp.linear_fc2.bias", 192, 0, MGC_PLAN_NO_SPLIT, NOG},
        {"decoder.layers.0.input_layernorm.weight", 192, 0, MGC_PLAN_NO_SPLIT, NOG},
        /* inputs: the context rank's two chunks of the sequence */
        {"tokens", 240 / 2, 3, 0, MGC_GROUP_CP},
        /* the residual stream: sequence over context, then tensor ranks */
        {"decoder.layers.0.self_attn_bda.out", 240 / 2 / 4, 3, 0, MGC_GROUP_TPCP},
        /* heads over TP, the sequence over CP as the second split */
        {"decoder.layers.0.self_attention.query", 240 / 2, 3, 2, MGC_GROUP_TP},
    };
    for (size_t i = 0; i < sizeof want / sizeof *want; i++) {
        int32_t t = find(&b, 0, want[i].name);
        if (t < 0) {
            T_CHECK(0);
            continue;
        }
        const mgc_plan_tensor *x = &ch->tensors[t];
        T_EQ_I64(x->dim[0], want[i].d0);
        if (want[i].d1) T_EQ_I64(x->dim[1], want[i].d1);
        T_EQ_U64(x->split_axis, want[i].axis);
        T_EQ_U64(x->split_group, want[i].group);
    }
    int32_t q = find(&b, 0, "decoder.layers.0.self_attention.query");
    if (q >= 0) {
        T_EQ_U64(in->tensors[q].split2_axis, 0);
        T_EQ_U64(in->tensors[q].split2_group, MGC_GROUP_CP);
    }
    /* norm gradients are partial over TP under sequence parallelism; the
     * row-parallel bias (added on tensor rank 0 before the reduction) is not */
    int32_t ng = find(&b, 0, "decoder.layers.0.input_layernorm.weight.grad");
    int32_t bg = find(&b, 0, "decoder.layers.0.mlp.linear_fc2.bias.grad");
    if (ng >= 0 && bg >= 0) {
        T_EQ_U64(ch->tensors[ng].split_axis, MGC_PLAN_NO_SPLIT);
        T_EQ_U64(ch->tensors[ng].split_group, MGC_GROUP_TP);
        T_CHECK(in->tensors[ng].partial);
        T_EQ_U64(ch->tensors[bg].split_group, NOG);
        T_CHECK(!in->tensors[bg].partial);
    }
    built_free(&b);
    /* query and key norms (model.qk_layernorm): a weight over head_dim that every head uses,
     * whole on each tensor rank, its gradient partial over TP without sequence parallelism
     * too (each rank holds its own heads); the input norm's gradient is complete there */
    const char *qk[] = {"parallel.tensor=4", "parallel.world_size=4", "model.qk_layernorm=true",
                        NULL};
    b = build(GPT, qk);
    T_CHECK(b.ok);
    if (!b.ok) return;
    ch = &b.ch[0][0];
    in = &b.info[0][0];
    int32_t qw = find(&b, 0, "decoder.layers.1.self_attention.q_layernorm.weight");
    int32_t kb = find(&b, 0, "decoder.layers.1.self_attention.k_layernorm.bias.grad");
    int32_t qg = find(&b, 0, "decoder.layers.1.self_attention.q_layernorm.weight.grad");
    int32_t ig = find(&b, 0, "decoder.layers.1.input_layernorm.weight.grad");
    int32_t qo = find(&b, 0, "decoder.layers.1.self_attention.q_layernorm.out");
    if (qw >= 0 && kb >= 0 && qg >= 0 && ig >= 0 && qo >= 0) {
        T_EQ_I64(ch->tensors[qw].rank, 1);
        T_EQ_I64(ch->tensors[qw].dim[0], 192 / 24); /* head_dim */
        T_EQ_U64(ch->tensors[qw].split_axis, MGC_PLAN_NO_SPLIT);
        T_CHECK(in->tensors[qg].partial && in->tensors[kb].partial);
        T_EQ_U64(ch->tensors[qg].split_group, MGC_GROUP_TP);
        T_CHECK(!in->tensors[ig].partial);
        T_EQ_I64(ch->tensors[qo].dim[2], 24 / 4); /* the rank's heads */
        T_EQ_U64(ch->tensors[qo].split_axis, 2);
    } else {
        T_CHECK(0);
    }
    built_free(&b);
}

/* ---- collectives ----------------------------------------------------------------- */

typedef struct counts {
    int n[2][MGC_POP__END - MGC_POP_ALL_REDUCE][MGC_GROUP__COUNT]; /* [pass][kind][group] */
    int recompute[2];
} counts;

static void count_layer(const mgc_plan_chunk *ch, int32_t layer, counts *c) {
    memset(c, 0, sizeof *c);
    for (int pass = 0; pass < 2; pass++) {
        const mgc_plan_op *ops = pass ? ch->bwd : ch->fwd;
        int64_t n = pass ? ch->n_bwd : ch->n_fwd;
        for (int64_t i = 0; i < n; i++) {
            if (ops[i].layer != layer || ops[i].kind < MGC_POP_ALL_REDUCE ||
                ops[i].group >= MGC_GROUP__COUNT)
                continue;
            c->n[pass][ops[i].kind - MGC_POP_ALL_REDUCE][ops[i].group]++;
            c->recompute[pass] += (ops[i].flags & MGC_POF_RECOMPUTE) != 0;
        }
    }
}

#define N(c, pass, kind, grp) ((c).n[pass][MGC_POP_##kind - MGC_POP_ALL_REDUCE][MGC_GROUP_##grp])

static void test_collectives(void) {
    counts c;
    /* TP without SP: the two all-reduces per layer after the row-parallel
     * GEMMs; in the backward the two of Megatron's f (column-parallel inputs) */
    const char *tp[] = {"parallel.tensor=4", "parallel.world_size=4", NULL};
    built b = build(GPT, tp);
    T_CHECK(b.ok);
    if (b.ok) {
        for (int32_t l = 0; l < 2; l++) {
            count_layer(&b.ch[0][0], l, &c);
            T_EQ_I64(N(c, 0, ALL_REDUCE, TP), 2);
            T_EQ_I64(N(c, 0, ALL_GATHER, TP) + N(c, 0, REDUCE_SCATTER, TP), 0);
            T_EQ_I64(N(c, 1, ALL_REDUCE, TP), 2);
            T_EQ_I64(N(c, 1, ALL_GATHER, TP) + N(c, 1, REDUCE_SCATTER, TP), 0);
        }
        count_layer(&b.ch[0][0], -1, &c);         /* embedding and head */
        T_EQ_I64(N(c, 0, ALL_REDUCE, TP), 1 + 2); /* vocabulary-parallel embedding; CE max, sums */
        T_EQ_I64(N(c, 1, ALL_REDUCE, TP), 1);     /* f before the output layer */
        const mgc_plan_chunk *ch = &b.ch[0][0];
        T_EQ_I64(mgc_partition_count_collectives(ch, 0, MGC_GROUP_TP), 2 * 2 + 3);
        /* element counts and dtypes */
        for (int64_t i = 0; i < ch->n_fwd; i++) {
            const mgc_plan_op *o = &ch->fwd[i];
            if (o->kind != MGC_POP_ALL_REDUCE || o->layer < 0) continue;
            T_EQ_I64(o->iattr[0], 240 * 3 * 192);
            T_EQ_I64(o->iattr[1], 240 * 3 * 192);
            T_EQ_I64(o->iattr[2], MGC_DT_BF16);
        }
    }
    built_free(&b);
    /* TP + SP: all-gather before each column-parallel GEMM, reduce-scatter
     * after each row-parallel one; the backward transposes them and
     * re-gathers the two GEMM inputs it stashed as shards */
    const char *sp[] = {"parallel.tensor=4", "parallel.world_size=4",
                        "parallel.sequence_parallel=true", NULL};
    b = build(GPT, sp);
    T_CHECK(b.ok);
    if (b.ok) {
        for (int32_t l = 0; l < 2; l++) {
            count_layer(&b.ch[0][0], l, &c);
            T_EQ_I64(N(c, 0, ALL_GATHER, TP), 2);
            T_EQ_I64(N(c, 0, REDUCE_SCATTER, TP), 2);
            T_EQ_I64(N(c, 0, ALL_REDUCE, TP), 0);
            T_EQ_I64(N(c, 1, ALL_GATHER, TP), 2 + 2);
            T_EQ_I64(N(c, 1, REDUCE_SCATTER, TP), 2);
            T_EQ_I64(N(c, 1, ALL_REDUCE, TP), 0);
            T_EQ_I64(c.recompute[1], 2);
        }
        const mgc_plan_chunk *ch = &b.ch[0][0];
        for (int64_t i = 0; i < ch->n_fwd; i++) {
            const mgc_plan_op *o = &ch->fwd[i];
            if (o->kind == MGC_POP_ALL_GATHER) {
                T_EQ_I64(o->iattr[0], 240 / 4 * 3 * 192);
                T_EQ_I64(o->iattr[1], 240 * 3 * 192);
            }
        }
    }
    built_free(&b);
    /* CP: keys and values all-gathered over the context group; the
     * backward re-gathers them and reduce-scatters their gradients */
    const char *cp[] = {"parallel.context=2", "parallel.world_size=2", NULL};
    b = build(GPT, cp);
    T_CHECK(b.ok);
    if (b.ok) {
        for (int32_t l = 0; l < 2; l++) {
            count_layer(&b.ch[0][0], l, &c);
            T_EQ_I64(N(c, 0, ALL_GATHER, CP), 2);
            T_EQ_I64(N(c, 1, ALL_GATHER, CP), 2);
            T_EQ_I64(N(c, 1, REDUCE_SCATTER, CP), 2);
        }
        count_layer(&b.ch[0][0], -1, &c);
        T_EQ_I64(N(c, 0, ALL_REDUCE, CP), 1); /* the loss (sum, count) */
        /* attention sees the whole sequence as keys: 2*q_elems*s FLOPs */
        const mgc_plan_chunk *ch = &b.ch[0][0];
        for (int64_t i = 0; i < ch->n_fwd; i++)
            if (ch->fwd[i].kind == MGC_POP_ATTENTION) {
                T_EQ_I64(ch->fwd[i].iattr[3], 2);
                T_EQ_U64(ch->fwd[i].flops, 2ull * (240 / 2) * 3 * 24 * 8 * 240);
            }
    }
    built_free(&b);
}

/* ---- mixture of experts ----------------------------------------------------------------- */

static void test_moe(void) {
    counts c;
    const char *sets[] = {"parallel.tensor=2", "parallel.sequence_parallel=true",
                          "parallel.expert=2", "parallel.world_size=4", NULL};
    built b = build(MOE, sets);
    T_CHECK(b.ok);
    if (b.ok) {
        const mgc_plan_chunk *ch = &b.ch[0][0];
        count_layer(ch, 0, &c); /* dense */
        T_EQ_I64(N(c, 0, ALL_TO_ALL, EP), 0);
        count_layer(ch, 1, &c);                    /* MoE */
        T_EQ_I64(N(c, 0, ALL_TO_ALL, EP), 3);      /* counts, rows out, rows back */
        T_EQ_I64(N(c, 0, ALL_GATHER, ETP), 2);     /* counts, rows (etp = tp = 2) */
        T_EQ_I64(N(c, 0, REDUCE_SCATTER, ETP), 1); /* rows back */
        T_EQ_I64(N(c, 0, ALL_REDUCE, TPCP), 1);    /* token counts of the aux loss */
        T_EQ_I64(N(c, 0, ALL_GATHER, TP), 2); /* QKV, shared fc1: the routed path is SP-native */
        T_EQ_I64(N(c, 1, ALL_TO_ALL, EP), 2);
        T_EQ_I64(N(c, 1, ALL_GATHER, ETP), 1);
        T_EQ_I64(N(c, 1, REDUCE_SCATTER, ETP), 1);
        /* local experts 8/2, expert ffn 48 (swiglu 96) over etp 2 */
        int32_t w = find(&b, 0, "decoder.layers.1.mlp.experts.linear_fc1.weight");
        if (w >= 0) {
            T_EQ_I64(ch->tensors[w].dim[0], 4);
            T_EQ_I64(ch->tensors[w].dim[1], 48);
            T_EQ_I64(ch->tensors[w].dim[2], 96);
        }
        /* dropless: the exchanges are sized for the worst case and marked
         * variable; tokens per rank 96/2 * 4 = 192, top-2 */
        for (int64_t i = 0; i < ch->n_fwd; i++) {
            const mgc_plan_op *o = &ch->fwd[i];
            if (o->kind == MGC_POP_ALL_TO_ALL && o->iattr[2] != MGC_DT_I64 && o->layer == 1 &&
                strstr(mgc_plan_strat(b.plan, o->name), "dispatch.all_to_all")) {
                T_CHECK(o->iattr[3] & MGC_PCOLL_VARIABLE);
                T_EQ_I64(o->iattr[0], 192 * 2 * 96);     /* R_l rows x h */
                T_EQ_I64(o->iattr[1], 2 * 192 * 2 * 96); /* ep * T_l * min(k, E/ep) rows */
                T_EQ_I64(o->n_in, 3);
            }
        }
    }
    built_free(&b);
    /* capacity factor: static sizes, C from the rank's own tokens */
    const char *cap[] = {"parallel.expert=4", "parallel.world_size=4", "moe.capacity_factor=1.5",
                         NULL};
    b = build(MOE, cap);
    T_CHECK(b.ok);
    if (b.ok) {
        const mgc_plan_chunk *ch = &b.ch[0][0];
        for (int64_t i = 0; i < ch->n_fwd; i++) {
            const mgc_plan_op *o = &ch->fwd[i];
            if (o->kind == MGC_POP_MOE_DISPATCH && o->iattr[0] == 0)
                T_EQ_I64(o->iattr[2], 144); /* ceil(384*2/8*1.5) */
            if (o->kind == MGC_POP_ALL_TO_ALL && o->iattr[2] != MGC_DT_I64) {
                T_CHECK(!(o->iattr[3] & MGC_PCOLL_VARIABLE));
                T_EQ_I64(o->iattr[0], 8 * 144 * 96); /* E*C rows */
            }
        }
    }
    built_free(&b);
    /* experts with tensor parallelism need sequence parallelism */
    mgc_diags d;
    mgc_diags_init(&d);
    const char *nosp[] = {"parallel.tensor=2", "parallel.world_size=2", NULL};
    b = build_d(MOE, nosp, &d);
    T_CHECK(!b.ok);
    int found = 0;
    for (int i = 0; i < d.n; i++)
        found |= strstr(d.v[i].msg, "sequence parallelism") != NULL; /* check.c reports it first */
    T_CHECK(found);
    built_free(&b);
    mgc_diags_free(&d);
}

/* ---- pipeline ranks and chunks ------------------------------------------------------------ */

/* Every layout feature at once: each pipeline rank builds without a
 * diagnostic, chunk v of rank r is stage v*pp + r, collectives are numbered
 * per group and pass. */
/* moe.router_dtype fp32 in a bf16 plan: each router GEMM writes fp32 logits (without the
 * output layer's flag: its weight is no vocabulary's), the route reads them, and the route's
 * backward hands the router a bf16 gradient; by default the logits are bf16. */
static void test_router_dtype(void) {
    for (int fp32 = 0; fp32 < 2; fp32++) {
        const char *sets[] = {"training.precision=bf16", fp32 ? "moe.router_dtype=fp32" : NULL, NULL};
        built b = build(MOE, sets);
        T_CHECK(b.ok);
        if (!b.ok) continue;
        const mgc_plan_chunk *ch = &b.ch[0][0];
        int routers = 0, routes = 0, bwds = 0;
        for (int64_t i = 0; i < ch->n_fwd; i++) {
            const mgc_plan_op *op = &ch->fwd[i];
            const char *nm = mgc_plan_strat(b.plan, op->name);
            if (op->kind == MGC_POP_LINEAR && strstr(nm, ".mlp.router")) {
                routers++;
                T_EQ_I64(ch->tensors[op->out[0]].dtype, fp32 ? MGC_DT_F32 : MGC_DT_BF16);
                T_EQ_I64(op->iattr[3] & 2, 0);
            }
            if (op->kind == MGC_POP_MOE_ROUTE && op->iattr[0] == 0) {
                routes++;
                T_EQ_I64(ch->tensors[op->in[0]].dtype, fp32 ? MGC_DT_F32 : MGC_DT_BF16);
            }
        }
        for (int64_t i = 0; i < ch->n_bwd; i++) {
            const mgc_plan_op *op = &ch->bwd[i];
            if (op->kind != MGC_POP_MOE_ROUTE_BWD) continue;
            bwds++;
            T_EQ_I64(ch->tensors[op->in[0]].dtype, fp32 ? MGC_DT_F32 : MGC_DT_BF16);
            T_EQ_I64(ch->tensors[op->out[0]].dtype, MGC_DT_BF16);
        }
        T_CHECK(routers > 0 && routers == routes && routes == bwds);
        built_free(&b);
    }
}

/* training.logits_dtype: the output layer's GEMM writes fp32 logits by default and bf16 ones
 * with compute, flagged as the output layer (iattr[3] bit 2) either way; every cross-entropy
 * phase that reads them (tp 2: max and sums; tp 1: the fused phase) and the backward take that
 * dtype, and the backward's gradient is bf16 both ways. */
static void test_logits_dtype(void) {
    for (int tp = 1; tp <= 2; tp++)
        for (int lc = 0; lc < 2; lc++) {
            const char *sets[] = {"training.precision=bf16",
                                  tp == 2 ? "parallel.tensor=2" : "parallel.tensor=1",
                                  tp == 2 ? "parallel.world_size=2" : "parallel.world_size=1",
                                  lc ? "training.logits_dtype=compute" : NULL, NULL};
            built b = build(GPT, sets);
            T_CHECK(b.ok);
            if (!b.ok) continue;
            const mgc_plan_chunk *ch = &b.ch[0][0];
            int want = lc ? MGC_DT_BF16 : MGC_DT_F32, heads = 0, reads = 0, bwds = 0;
            int32_t logits = -1;
            for (int64_t i = 0; i < ch->n_fwd; i++) {
                const mgc_plan_op *op = &ch->fwd[i];
                if (op->kind == MGC_POP_LINEAR && (op->iattr[3] & 2)) {
                    heads++;
                    logits = op->out[0];
                    T_EQ_I64(ch->tensors[logits].dtype, want);
                }
                if (op->kind == MGC_POP_CROSS_ENTROPY && op->in[0] == logits) {
                    reads++;
                    T_CHECK(op->iattr[0] == (tp == 1 ? 3 : reads - 1));
                }
            }
            for (int64_t i = 0; i < ch->n_bwd; i++) {
                const mgc_plan_op *op = &ch->bwd[i];
                if (op->kind != MGC_POP_CROSS_ENTROPY_BWD) continue;
                bwds++;
                T_EQ_I64(ch->tensors[op->in[0]].dtype, want);
                T_EQ_I64(ch->tensors[op->out[0]].dtype, MGC_DT_BF16);
            }
            T_EQ_I64(heads, 1);
            T_EQ_I64(reads, tp == 1 ? 1 : 2);
            T_EQ_I64(bwds, 1);
            built_free(&b);
        }
}

static void test_tiny_everything(void) {
    const char *sets[] = {"parallel.tensor=2",
                          "parallel.sequence_parallel=true",
                          "parallel.context=2",
                          "parallel.expert=2",
                          "parallel.pipeline=2",
                          "parallel.virtual_stages=2",
                          "parallel.world_size=8",
                          "training.global_batch_size=8",
                          NULL};
    mgc_diags d;
    mgc_diags_init(&d);
    built b = build_d(MOE, sets, &d);
    if (!b.ok) mgc_diags_print(&d, stderr);
    T_CHECK(b.ok);
    T_EQ_I64(b.part_diags, 0);
    if (b.ok) {
        T_EQ_I64(b.grid.vp, 2);
        for (int64_t r = 0; r < 2; r++)
            for (int64_t v = 0; v < 2; v++) {
                const mgc_plan_chunk *ch = &b.ch[r][v];
                const mgc_stage *st = &b.c->derived.stages[v * 2 + r];
                T_EQ_I64(ch->first_layer, st->first_layer);
                T_EQ_I64(ch->num_layers, st->num_layers);
                T_EQ_I64(ch->embedding, st->embedding);
                T_EQ_I64(ch->loss, st->loss);
                T_CHECK(ch->n_fwd > 0 && ch->n_bwd > 0 && ch->stash_bytes > 0);
                /* residual stream: 96/2/2 rows x 4 x 96 fp32 (tiny precision default bf16) */
                if (!ch->loss) T_EQ_U64(ch->send_bytes, 24 * 4 * 96 * 2);
                for (int pass = 0; pass < 2; pass++) {
                    uint32_t next[MGC_GROUP__COUNT];
                    memset(next, 0, sizeof next);
                    const mgc_plan_op *ops = pass ? ch->bwd : ch->fwd;
                    int64_t n = pass ? ch->n_bwd : ch->n_fwd;
                    for (int64_t i = 0; i < n; i++) {
                        if (ops[i].kind < MGC_POP_ALL_REDUCE) continue;
                        T_CHECK(ops[i].group < MGC_GROUP__COUNT);
                        if (ops[i].group >= MGC_GROUP__COUNT) continue;
                        T_EQ_U64(ops[i].seq, next[ops[i].group]++);
                        T_CHECK(ops[i].iattr[0] > 0 && ops[i].iattr[1] > 0 &&
                                ops[i].iattr[2] < MGC_DT__COUNT);
                    }
                    for (int k = 0; k < MGC_GROUP__COUNT; k++)
                        T_EQ_I64(mgc_partition_count_collectives(ch, pass, (mgc_group_kind)k),
                                 next[k]);
                }
            }
        check_shards(&b);
    }
    built_free(&b);
    mgc_diags_free(&d);
}

/* An empty virtual stage passes its input on. */
static void test_empty_stage(void) {
    const char *sets[] = {"parallel.pipeline=3", "parallel.world_size=3", "model.num_layers=4",
                          "parallel.pipeline_layout=[\"E t*2\", \"\", \"t*2 L\"]", NULL};
    built b = build(GPT, sets);
    T_CHECK(b.ok);
    if (b.ok) {
        const mgc_plan_chunk *ch = &b.ch[1][0];
        T_EQ_I64(ch->n_fwd, 0);
        T_EQ_I64(ch->n_bwd, 0);
        T_EQ_I64(ch->n_tensors, 2);
        T_EQ_U64(ch->stash_bytes, 0);
        T_EQ_U64(ch->send_bytes, 240 * 3 * 192 * 2);
        T_EQ_I64(b.info[1][0].out_act, 0);
        T_EQ_I64(b.info[1][0].out_grad, 1);
        /* the last stage holds its own copy of the tied word embedding */
        T_CHECK(find(&b, 2, "embedding.word_embeddings.weight") >= 0);
        T_CHECK(find(&b, 2, "embedding.word_embeddings.weight.grad") >= 0);
    }
    built_free(&b);
}

/* A grid that does not match the config is refused. */
static void test_bad_grid(void) {
    built b = build(GPT, NULL);
    T_CHECK(b.ok);
    if (b.ok) {
        mgc_grid g = b.grid;
        g.tp = 2;
        g.world = 2;
        mgc_diags d;
        mgc_diags_init(&d);
        mgc_plan_chunk ch[1];
        T_EQ_I64(mgc_partition_build(b.c, b.g, &g, 0, b.plan, ch, &d), -1);
        T_CHECK(d.errors == 1);
        mgc_diags_clear(&d);
        T_EQ_I64(mgc_partition_build(b.c, b.g, &b.grid, 1, b.plan, ch, &d), -1);
        T_CHECK(d.errors == 1);
        mgc_diags_free(&d);
    }
    built_free(&b);
}

int main(void) {
    test_shards();
    test_splits();
    test_collectives();
    test_moe();
    test_router_dtype();
    test_logits_dtype();
    test_tiny_everything();
    test_empty_stage();
    test_bad_grid();
    return t_summary("test_partition");
}
