/* test_autodiff.c - backward programs, the saved set and the stash.
 *
 * The centre piece checks the stash of one GPT layer against Korthikanti et
 * al. 2022 (arXiv 2205.05198), Table 2, with the deliberate differences of
 * docs/partitioning.md: flash attention stores no s^2 terms (the 5as^2b/t
 * of softmax output, its dropout mask and dropout output) but one fp32
 * logsumexp per query row and head (4asb/t bytes).  Everything else is
 * their count exactly: every assertion below is an exact byte count.
 *
 * Per-layer bytes are measured two ways: as the difference of the stash of
 * a 3-layer and a 2-layer model (embedding and head cancel), and as the
 * stash of a middle pipeline stage holding only layers. */
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

/* ---- building ------------------------------------------------------------- */

typedef struct built {
    mgc_config *c;
    mgc_graph *g;
    mgc_grid grid;
    mgc_plan *plan;
    mgc_plan_chunk *ch[8]; /* [pp rank] -> vp chunks */
    mgc_partition_info *info[8];
    int ok;
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

/* Load yaml, apply the NULL-terminated overrides, partition every rank. */
static built build(const char *yaml, const char *const *sets) {
    built b;
    memset(&b, 0, sizeof b);
    mgc_diags d;
    mgc_diags_init(&d);
    b.c = mgc_config_new();
    mgc_config_load_text(b.c, "test.yaml", yaml, strlen(yaml), &d);
    for (int i = 0; sets && sets[i]; i++)
        mgc_config_set(b.c, sets[i], "--set", &d);
    if (!d.errors) mgc_config_finalize(b.c, &d);
    if (!d.errors) b.g = mgc_ir_build(b.c, &d);
    if (!d.errors && b.g) {
        mgc_partition_grid(b.c, &b.grid);
        b.plan = mgc_plan_new();
        for (int64_t r = 0; r < b.grid.pp && r < 8 && !d.errors; r++) {
            b.ch[r] = calloc((size_t)b.grid.vp, sizeof *b.ch[r]);
            b.info[r] = calloc((size_t)b.grid.vp, sizeof *b.info[r]);
            mgc_partition_build_ex(b.c, b.g, &b.grid, r, b.plan, b.ch[r], b.info[r], &d);
            for (int64_t v = 0; v < b.grid.vp && !d.errors; v++)
                mgc_partition_check(&b.ch[r][v], &d);
        }
    }
    b.ok = d.errors == 0;
    if (!b.ok) mgc_diags_print(&d, stderr);
    mgc_diags_free(&d);
    return b;
}

static const char *GPT = "model:\n"
                         "  vocab_size: 1000\n"
                         "  make_vocab_size_divisible_by: 64\n"
                         "  seq_length: 512\n"
                         "  hidden_size: 1024\n"
                         "  num_layers: 2\n"
                         "  num_attention_heads: 16\n"
                         "  hidden_dropout: 0.1\n"
                         "  attention_dropout: 0.1\n"
                         "training:\n"
                         "  micro_batch_size: 2\n"
                         "  precision: bf16\n";

enum { NONE, SELECTIVE, FULL };
static const char *const rec_names[] = {"none", "selective", "full"};

static const char *extra_set; /* one more --set for stash_of (NULL: none) */

/* Stash of a 1-chunk, 1-stage model with `layers` layers. */
static uint64_t stash_of(int64_t t, int sp, int rec, const char *prec, int64_t layers,
                         double dropout) {
    char s_tp[64], s_w[64], s_sp[64], s_rec[64], s_prec[64], s_l[64], s_d[64], s_ad[64];
    snprintf(s_tp, sizeof s_tp, "parallel.tensor=%lld", (long long)t);
    snprintf(s_w, sizeof s_w, "parallel.world_size=%lld", (long long)t);
    snprintf(s_sp, sizeof s_sp, "parallel.sequence_parallel=%s", sp ? "true" : "false");
    snprintf(s_rec, sizeof s_rec, "training.recompute=%s", rec_names[rec]);
    snprintf(s_prec, sizeof s_prec, "training.precision=%s", prec);
    snprintf(s_l, sizeof s_l, "model.num_layers=%lld", (long long)layers);
    snprintf(s_d, sizeof s_d, "model.hidden_dropout=%g", dropout);
    snprintf(s_ad, sizeof s_ad, "model.attention_dropout=%g", dropout);
    const char *sets[] = {s_tp, s_w, s_sp, s_rec, s_prec, s_l, s_d, s_ad, extra_set, NULL};
    built b = build(GPT, sets);
    T_CHECK(b.ok);
    uint64_t st = b.ok ? b.ch[0][0].stash_bytes : 0;
    built_free(&b);
    return st;
}

static uint64_t per_layer(int64_t t, int sp, int rec, const char *prec, double dropout) {
    return stash_of(t, sp, rec, prec, 3, dropout) - stash_of(t, sp, rec, prec, 2, dropout);
}

/* ---- Korthikanti et al. ------------------------------------------------------ */

static void test_korthikanti(void) {
    const uint64_t s = 512, b = 2, h = 1024, a = 16;
    const uint64_t sbh = s * b * h;
    const int64_t tps[] = {1, 2, 4, 8};
    for (size_t i = 0; i < sizeof tps / sizeof *tps; i++) {
        uint64_t t = (uint64_t)tps[i];
        /* their closed forms (bytes, 16-bit activations, dropout on) */
        uint64_t scores = 5 * a * s * s * b / t;          /* 5as^2b/t */
        uint64_t k_tp = sbh * 10 + 24 * sbh / t + scores; /* sbh(10 + 24/t + 5as/(ht)) */
        uint64_t k_tp_sp = 34 * sbh / t + scores;         /* sbh(34/t + 5as/(ht)) */
        uint64_t k_tp_sel = sbh * 10 + 24 * sbh / t;      /* selective, no SP */
        uint64_t k_tp_sp_sel = 34 * sbh / t;              /* sbh 34/t */
        /* the deliberate differences: no s^2 terms, plus the logsumexp */
        uint64_t lse = 4 * a * s * b / t;
        T_EQ_U64(per_layer((int64_t)t, 0, NONE, "bf16", 0.1), k_tp - scores + lse);
        T_EQ_U64(per_layer((int64_t)t, 0, SELECTIVE, "bf16", 0.1), k_tp_sel);
        T_EQ_U64(per_layer((int64_t)t, 0, FULL, "bf16", 0.1), 2 * sbh); /* the layer input */
        if (t > 1) {
            T_EQ_U64(per_layer((int64_t)t, 1, NONE, "bf16", 0.1), k_tp_sp - scores + lse);
            T_EQ_U64(per_layer((int64_t)t, 1, SELECTIVE, "bf16", 0.1), k_tp_sp_sel);
            /* with SP the layer input is the sequence shard */
            T_EQ_U64(per_layer((int64_t)t, 1, FULL, "bf16", 0.1), 2 * sbh / t);
        }
        if (t == 1) {
            /* no parallelism: sbh(34 + 5as/h) */
            T_EQ_U64(per_layer(1, 0, NONE, "fp16", 0.1),
                     34 * sbh + 5 * a * s * s * b - scores + lse);
        }
    }
    /* fp32: every float doubles, the two u8 masks and the fp32 logsumexp do
     * not: 2*(34-2)/t + 2/t = 66/t */
    T_EQ_U64(per_layer(4, 1, NONE, "fp32", 0.1), 66 * sbh / 4 + 4 * a * s * b / 4);
    /* dropout off: no masks (sbh/t bytes each, two per layer) */
    T_EQ_U64(per_layer(4, 1, NONE, "bf16", 0.0), 32 * sbh / 4 + 4 * a * s * b / 4);
    T_EQ_U64(per_layer(4, 0, SELECTIVE, "bf16", 0.0), sbh * 8 + 24 * sbh / 4);
    /* training.recompute_modules: the two norm outputs (QKV's and fc1's inputs, 2 + 2: the
     * sequence shard with SP, whole without), the GELU output (fc2's input, 8/t) and the two
     * hidden dropout masks (1 + 1, the same way) */
    for (size_t i = 1; i < sizeof tps / sizeof *tps; i++) {
        uint64_t t = (uint64_t)tps[i];
        extra_set = "training.recompute_modules=[norm]";
        T_EQ_U64(per_layer((int64_t)t, 1, SELECTIVE, "bf16", 0.1), 34 * sbh / t - 4 * sbh / t);
        extra_set = "training.recompute_modules=[activation]";
        T_EQ_U64(per_layer((int64_t)t, 1, SELECTIVE, "bf16", 0.1), 34 * sbh / t - 8 * sbh / t);
        extra_set = "training.recompute_modules=[dropout]"; /* the two u8 masks, 1 + 1 */
        T_EQ_U64(per_layer((int64_t)t, 1, SELECTIVE, "bf16", 0.1), 34 * sbh / t - 2 * sbh / t);
        T_EQ_U64(per_layer((int64_t)t, 0, SELECTIVE, "bf16", 0.1), sbh * 8 + 24 * sbh / t);
        extra_set = "training.recompute_modules=[norm, activation]";
        T_EQ_U64(per_layer((int64_t)t, 0, SELECTIVE, "bf16", 0.1),
                 sbh * 10 + 24 * sbh / t - 4 * sbh - 8 * sbh / t);
        T_EQ_U64(per_layer((int64_t)t, 1, FULL, "bf16", 0.1), 2 * sbh / t); /* no effect */
        extra_set = NULL;
    }
}

/* A middle pipeline stage holding only layers stashes layers x per-layer. */
static void test_middle_stage(void) {
    const uint64_t s = 512, b = 2, h = 1024, a = 16, t = 2, sbh = s * b * h;
    const char *sets[] = {"parallel.tensor=2",
                          "parallel.world_size=6",
                          "parallel.pipeline=3",
                          "parallel.sequence_parallel=true",
                          "model.num_layers=6",
                          "parallel.pipeline_layout=[\"E t*2\", \"t*3\", \"t L\"]",
                          NULL};
    built bl = build(GPT, sets);
    T_CHECK(bl.ok);
    if (!bl.ok) return;
    const mgc_plan_chunk *ch = &bl.ch[1][0];
    T_EQ_U64(ch->num_layers, 3);
    T_EQ_U64(ch->stash_bytes, 3 * (34 * sbh / t + 4 * a * s * b / t));
    T_EQ_U64(ch->send_bytes, 2 * s / t * b * h);
    T_EQ_U64(bl.ch[0][0].send_bytes, 2 * s / t * b * h);
    T_EQ_U64(bl.ch[2][0].send_bytes, 0);
    /* the received activation is stashed (the first layer's norm input) */
    T_CHECK(ch->tensors[0].buffer == MGC_PLAN_BUF_STASH && ch->tensors[0].offset == 0);
    built_free(&bl);
}

/* ---- recompute modes ------------------------------------------------------------- */

static int count_kind(const mgc_plan_op *ops, int64_t n, mgc_plan_op_kind k, int recompute_only) {
    int c = 0;
    for (int64_t i = 0; i < n; i++)
        c += ops[i].kind == k && (!recompute_only || (ops[i].flags & MGC_POF_RECOMPUTE));
    return c;
}

static void test_recompute_modes(void) {
    /* selective: one attention forward re-run per layer, right before its
     * backward; the logsumexp is not stashed, q, k, v and out are */
    {
        const char *sets[] = {"parallel.tensor=2",
                              "parallel.world_size=2",
                              "parallel.sequence_parallel=true",
                              "training.recompute=selective",
                              "model.num_layers=3",
                              NULL};
        built b = build(GPT, sets);
        T_CHECK(b.ok);
        if (b.ok) {
            const mgc_plan_chunk *ch = &b.ch[0][0];
            T_EQ_I64(count_kind(ch->bwd, ch->n_bwd, MGC_POP_ATTENTION, 1), 3);
            for (int64_t i = 0; i < ch->n_bwd; i++) {
                if (ch->bwd[i].kind != MGC_POP_ATTENTION_BWD) continue;
                T_CHECK(i > 0 && ch->bwd[i - 1].kind == MGC_POP_ATTENTION &&
                        (ch->bwd[i - 1].flags & MGC_POF_RECOMPUTE));
                for (int k = 0; k < 4; k++) /* q, k, v, out from the stash */
                    T_CHECK(ch->tensors[ch->bwd[i].in[k]].buffer == MGC_PLAN_BUF_STASH);
                /* the logsumexp from the recompute */
                T_CHECK(ch->tensors[ch->bwd[i].in[4]].buffer != MGC_PLAN_BUF_STASH);
            }
            for (int64_t i = 0; i < ch->n_fwd; i++)
                if (ch->fwd[i].kind == MGC_POP_ATTENTION)
                    T_EQ_I64(ch->fwd[i].n_out, 1); /* no lse written */
        }
        built_free(&b);
    }
    /* full: each layer's backward begins with that layer's forward ops
     * (flagged recompute), the layer input is the only stashed tensor of a
     * layer; no recompute op is dead */
    {
        const char *sets[] = {
            "parallel.tensor=2",       "parallel.world_size=2", "parallel.sequence_parallel=true",
            "training.recompute=full", "model.num_layers=3",    NULL};
        built b = build(GPT, sets);
        T_CHECK(b.ok);
        if (b.ok) {
            const mgc_plan_chunk *ch = &b.ch[0][0];
            int32_t prev = -100;
            int layers_seen = 0;
            for (int64_t i = 0; i < ch->n_bwd; i++) {
                const mgc_plan_op *o = &ch->bwd[i];
                if (o->layer >= 0 && o->layer != prev) {
                    /* the first op of a layer's backward segment is a recompute */
                    T_CHECK(o->flags & MGC_POF_RECOMPUTE);
                    layers_seen++;
                }
                prev = o->layer;
            }
            T_EQ_I64(layers_seen, 3);
            for (int64_t i = 0; i < ch->n_fwd; i++) {
                const mgc_plan_op *o = &ch->fwd[i];
                if (o->layer < 0) continue;
                for (int k = 0; k < o->n_out; k++) {
                    const mgc_plan_tensor *x = &ch->tensors[o->out[k]];
                    /* only the last layer op's output (the next layer's input) is stashed */
                    if (x->buffer == MGC_PLAN_BUF_STASH)
                        T_CHECK(o->kind == MGC_POP_DROPOUT_ADD && o->layer >= 0);
                }
            }
            /* every recomputed output is read later in the backward */
            for (int64_t i = 0; i < ch->n_bwd; i++) {
                const mgc_plan_op *o = &ch->bwd[i];
                if (!(o->flags & MGC_POF_RECOMPUTE)) continue;
                int read = 0;
                for (int64_t j = i + 1; j < ch->n_bwd && !read; j++)
                    for (int k = 0; k < ch->bwd[j].n_in; k++)
                        for (int m = 0; m < o->n_out; m++)
                            read |= ch->bwd[j].in[k] == o->out[m];
                T_CHECK(read);
            }
        }
        built_free(&b);
    }
}

/* ---- gradients ------------------------------------------------------------------- */

static int writes(const mgc_plan_chunk *ch, int32_t t, mgc_plan_op_kind *kind) {
    for (int64_t i = 0; i < ch->n_bwd; i++)
        for (int k = 0; k < ch->bwd[i].n_out; k++)
            if (ch->bwd[i].out[k] == t) {
                if (kind) *kind = (mgc_plan_op_kind)ch->bwd[i].kind;
                return 1;
            }
    return 0;
}

/* Every parameter has an fp32 accumulator written by a wgrad-type op; the
 * i-th GRAD tensor belongs to the i-th PARAM. */
static void check_grads(const built *b) {
    for (int64_t r = 0; r < b->grid.pp; r++)
        for (int64_t v = 0; v < b->grid.vp; v++) {
            const mgc_plan_chunk *ch = &b->ch[r][v];
            const mgc_partition_info *in = &b->info[r][v];
            int64_t np = 0, ng = 0;
            for (int64_t t = 0; t < ch->n_tensors; t++) {
                const mgc_plan_tensor *x = &ch->tensors[t];
                if (x->role == MGC_TR_PARAM) np++;
                if (x->role != MGC_TR_GRAD) continue;
                ng++;
                int32_t p = in->tensors[t].grad_of;
                T_CHECK(p >= 0 && ch->tensors[p].role == MGC_TR_PARAM);
                if (p < 0) continue;
                T_EQ_U64(x->dtype, MGC_DT_F32);
                T_EQ_U64(x->bytes / 4,
                         ch->tensors[p].bytes / mgc_dtype_size((mgc_dtype)ch->tensors[p].dtype));
                char want[200];
                snprintf(want, sizeof want, "%s.grad",
                         mgc_plan_strat(b->plan, ch->tensors[p].name));
                T_STREQ(mgc_plan_strat(b->plan, x->name), want);
                mgc_plan_op_kind k = MGC_POP__END;
                T_CHECK(writes(ch, (int32_t)t, &k));
                T_CHECK(k == MGC_POP_LINEAR_WGRAD || k == MGC_POP_GROUPED_LINEAR_WGRAD ||
                        k == MGC_POP_NORM_BWD || k == MGC_POP_EMBEDDING_BWD);
            }
            T_EQ_I64(np, ng);
        }
}

static void test_wgrads(void) {
    const char *dense[] = {"parallel.tensor=2",          "parallel.world_size=4",
                           "parallel.pipeline=2",        "model.num_layers=4",
                           "model.tie_embeddings=false", NULL};
    built b = build(GPT, dense);
    T_CHECK(b.ok);
    if (b.ok) check_grads(&b);
    built_free(&b);
    const char *tied[] = {"parallel.tensor=2", "parallel.world_size=2",
                          "parallel.sequence_parallel=true", NULL};
    b = build(GPT, tied);
    T_CHECK(b.ok);
    if (b.ok) {
        check_grads(&b);
        /* tied in one chunk: the output layer's wgrad and the embedding's
         * backward both accumulate into the one word-embedding grad */
        const mgc_plan_chunk *ch = &b.ch[0][0];
        int n = 0;
        for (int64_t i = 0; i < ch->n_bwd; i++)
            for (int k = 0; k < ch->bwd[i].n_out; k++)
                n += !strcmp(mgc_plan_strat(b.plan, ch->tensors[ch->bwd[i].out[k]].name),
                             "embedding.word_embeddings.weight.grad");
        T_EQ_I64(n, 2);
    }
    built_free(&b);
}

/* The backward's first op reads the received gradient (or is the loss's),
 * and the input gradient sent back is written by the backward. */
static void test_boundaries(void) {
    const char *sets[] = {"parallel.world_size=3", "parallel.pipeline=3", "model.num_layers=3",
                          NULL};
    built b = build(GPT, sets);
    T_CHECK(b.ok);
    if (b.ok) {
        for (int r = 0; r < 3; r++) {
            const mgc_plan_chunk *ch = &b.ch[r][0];
            const mgc_partition_info *in = &b.info[r][0];
            T_EQ_I64(in->in_act, r == 0 ? -1 : 0);
            T_EQ_I64(in->in_grad, r == 0 ? -1 : 1);
            T_EQ_I64(in->out_act, r == 2 ? -1 : (r == 0 ? 0 : 2));
            T_EQ_I64(in->out_grad, r == 2 ? -1 : (r == 0 ? 1 : 3));
            if (in->in_grad >= 0) {
                T_CHECK(writes(ch, in->in_grad, NULL));
                T_EQ_U64(ch->tensors[in->in_grad].role, MGC_TR_ACT_GRAD);
                T_EQ_U64(ch->tensors[in->in_grad].bytes, ch->tensors[in->in_act].bytes);
            }
            if (in->out_act >= 0) {
                T_EQ_U64(ch->send_bytes, ch->tensors[in->out_act].bytes);
                T_EQ_U64(ch->fwd[ch->n_fwd - 1].out[0], in->out_act);
                T_CHECK(ch->bwd[0].in[0] == in->out_grad);
            } else {
                T_EQ_U64(ch->bwd[0].kind, MGC_POP_CROSS_ENTROPY_BWD);
                T_CHECK(in->loss >= 0 && ch->tensors[in->loss].role == MGC_TR_LOSS);
            }
        }
    }
    built_free(&b);
}

/* Ops that differentiate to nothing leave no trace: dropout with p = 0 is
 * not even in the forward. */
static void test_no_dropout(void) {
    const char *sets[] = {"model.hidden_dropout=0", "model.attention_dropout=0", NULL};
    built b = build(GPT, sets);
    T_CHECK(b.ok);
    if (b.ok) {
        const mgc_plan_chunk *ch = &b.ch[0][0];
        T_EQ_I64(count_kind(ch->fwd, ch->n_fwd, MGC_POP_DROPOUT, 0), 0);
        T_EQ_I64(count_kind(ch->bwd, ch->n_bwd, MGC_POP_DROPOUT_BWD, 0), 0);
        T_EQ_I64(count_kind(ch->bwd, ch->n_bwd, MGC_POP_DROPOUT_ADD_BWD, 0), 0);
        for (int64_t t = 0; t < ch->n_tensors; t++)
            T_CHECK(ch->tensors[t].dtype != MGC_DT_U8);
    }
    built_free(&b);
    b = build(GPT, NULL);
    T_CHECK(b.ok);
    if (b.ok) {
        const mgc_plan_chunk *ch = &b.ch[0][0];
        int masks = 0;
        for (int64_t t = 0; t < ch->n_tensors; t++)
            if (ch->tensors[t].dtype == MGC_DT_U8) {
                masks++;
                T_CHECK(ch->tensors[t].buffer == MGC_PLAN_BUF_STASH);
            }
        T_EQ_I64(masks, 1 + 2 * 2); /* embedding + two per layer */
        T_EQ_I64(count_kind(ch->bwd, ch->n_bwd, MGC_POP_DROPOUT_ADD_BWD, 0), 4);
    }
    built_free(&b);
}

/* Cross-entropy: fp32 logits stashed, the three TP reductions as two
 * collectives, backward from the logits and the logsumexp. */
static void test_cross_entropy(void) {
    const char *sets[] = {"parallel.tensor=4", "parallel.world_size=4", NULL};
    built b = build(GPT, sets);
    T_CHECK(b.ok);
    if (b.ok) {
        const mgc_plan_chunk *ch = &b.ch[0][0];
        int ce = 0, ar_max = 0;
        for (int64_t i = 0; i < ch->n_fwd; i++) {
            const mgc_plan_op *o = &ch->fwd[i];
            ce += o->kind == MGC_POP_CROSS_ENTROPY;
            ar_max += o->kind == MGC_POP_ALL_REDUCE && (o->iattr[3] & MGC_PCOLL_MAX);
            if (o->kind == MGC_POP_LINEAR && (o->iattr[3] & 2)) { /* the output layer */
                const mgc_plan_tensor *y = &ch->tensors[o->out[0]];
                T_EQ_U64(y->dtype, MGC_DT_F32);
                T_EQ_U64(y->dim[2], 1024 / 4); /* V_pad = 1024 (multiple of 64*4) over 4 */
                T_CHECK(y->buffer == MGC_PLAN_BUF_STASH);
            }
        }
        T_EQ_I64(ce, 3);
        T_EQ_I64(ar_max, 1);
        const mgc_plan_op *cb = &ch->bwd[0];
        T_EQ_U64(cb->kind, MGC_POP_CROSS_ENTROPY_BWD);
        T_EQ_U64(ch->tensors[cb->out[0]].dtype, MGC_DT_BF16); /* into the GEMMs */
    }
    built_free(&b);
}

/* Every layout x recompute mode builds, passes mgc_partition_check (every
 * backward input is a param, an input, stashed, the received gradient or
 * produced earlier in the backward) and has a wgrad for every param. */
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
                         "  add_bias_linear: true\n"
                         "  tie_embeddings: false\n"
                         "  hidden_dropout: 0.1\n"
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
                         "  micro_batch_size: 4\n"
                         "  global_batch_size: 64\n";

static void test_sweep(void) {
    const char *layouts[][8] = {
        {"parallel.world_size=1", NULL},
        {"parallel.tensor=2", "parallel.world_size=2", NULL},
        {"parallel.tensor=2", "parallel.sequence_parallel=true", "parallel.world_size=2", NULL},
        {"parallel.context=2", "parallel.world_size=2", NULL},
        {"parallel.tensor=2", "parallel.context=2", "parallel.sequence_parallel=true",
         "parallel.world_size=8", "parallel.pipeline=2", NULL},
        {"parallel.pipeline=2", "parallel.virtual_stages=2", "parallel.world_size=2",
         "model.num_layers=4", "training.global_batch_size=8", NULL},
        {"parallel.tensor=8", "model.num_query_groups=2", "parallel.sequence_parallel=true",
         "parallel.world_size=16", "parallel.pipeline=2", NULL},
    };
    const char *moe_layouts[][8] = {
        {"parallel.world_size=1", NULL},
        {"parallel.expert=2", "parallel.world_size=2", NULL},
        {"parallel.expert=4", "parallel.world_size=4", "moe.capacity_factor=1.25", NULL},
        {"parallel.tensor=2", "parallel.sequence_parallel=true", "parallel.expert=2",
         "parallel.world_size=4", NULL},
        {"parallel.tensor=2", "parallel.sequence_parallel=true", "parallel.expert_tensor=1",
         "parallel.expert=4", "parallel.context=2", "parallel.world_size=4", NULL},
        {"parallel.tensor=2", "parallel.sequence_parallel=true", "parallel.expert=2",
         "parallel.context=2", "parallel.pipeline=2", "parallel.virtual_stages=2",
         "parallel.world_size=8", NULL},
    };
    for (int model = 0; model < 2; model++) {
        size_t n =
            model ? sizeof moe_layouts / sizeof *moe_layouts : sizeof layouts / sizeof *layouts;
        for (size_t i = 0; i < n; i++)
            for (int rec = 0; rec < 3; rec++) {
                const char *const *lay = model ? moe_layouts[i] : layouts[i];
                const char *sets[12];
                int k = 0;
                char r[64];
                snprintf(r, sizeof r, "training.recompute=%s", rec_names[rec]);
                sets[k++] = r;
                for (int j = 0; lay[j]; j++)
                    sets[k++] = lay[j];
                sets[k] = NULL;
                built b = build(model ? MOE : GPT, sets);
                if (!b.ok)
                    fprintf(stderr, "sweep: model %d layout %zu recompute %s\n", model, i,
                            rec_names[rec]);
                T_CHECK(b.ok);
                if (b.ok) check_grads(&b);
                built_free(&b);
            }
    }
}

int main(void) {
    test_korthikanti();
    test_middle_stage();
    test_recompute_modes();
    test_wgrads();
    test_boundaries();
    test_no_dropout();
    test_cross_entropy();
    test_sweep();
    return t_summary("test_autodiff");
}
