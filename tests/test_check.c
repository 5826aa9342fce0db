/* test_check.c - derived defaults and c->derived (check.c, check_pipeline.c).
 *
 * Every test loads a config from YAML text, finalizes it and asserts the
 * values the checker derived, computed here by hand from Megatron's rules
 * (the comments show the arithmetic).  The golden files in tests/bad and
 * tests/good cover the wording of diagnostics; the few diagnostics here only
 * pin which key a rule points at. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "config.h"
#include "diag.h"
#include "testlib.h"

/* Load text, finalize; the diagnostics land in *d. */
static mgc_config *load(const char *text, mgc_diags *d) {
    mgc_config *c = mgc_config_new();
    mgc_diags_init(d);
    mgc_config_load_text(c, "t.yaml", text, strlen(text), d);
    mgc_config_finalize(c, d);
    return c;
}

static void dump(const mgc_diags *d) {
    for (int i = 0; i < d->n; i++)
        fprintf(stderr, "  [have] %d:%d %s | %s\n", d->v[i].loc.line, d->v[i].loc.col, d->v[i].msg,
                d->v[i].hint ? d->v[i].hint : "");
}

/* No errors; print what there is when there are. */
static int clean(const mgc_diags *d) {
    if (d->errors) dump(d);
    return d->errors == 0;
}

/* Is there a diagnostic of severity sev at line:col whose message contains
 * needle? */
static int has(const mgc_diags *d, mgc_severity sev, int line, int col, const char *needle) {
    for (int i = 0; i < d->n; i++) {
        const mgc_diag_entry *e = &d->v[i];
        if (e->sev == sev && e->loc.line == line && e->loc.col == col && strstr(e->msg, needle))
            return 1;
    }
    dump(d);
    return 0;
}

static void done(mgc_config *c, mgc_diags *d) {
    mgc_config_free(c);
    mgc_diags_free(d);
}

/* ---- model defaults ----------------------------------------------------- */

static void test_model_defaults(void) {
    mgc_diags d;
    /* GPT-3 2.7B shape: gelu, biases, learned positions. */
    mgc_config *c = load("model:\n"
                         "  vocab_size: 50257\n"
                         "  seq_length: 2048\n"
                         "  hidden_size: 2560\n"
                         "  num_layers: 32\n"
                         "  num_attention_heads: 32\n"
                         "training:\n"
                         "  iterations: 143051\n",
                         &d);
    T_CHECK(clean(&d));
    T_EQ_I64(c->model.head_dim, 80);           /* 2560 / 32 */
    T_EQ_I64(c->model.num_query_groups, 32);   /* MHA */
    T_EQ_I64(c->model.ffn_hidden_size, 10240); /* 4h */
    T_EQ_I64(c->model.max_position_embeddings, 2048);
    T_EQ_I64(c->model.add_qkv_bias, 1); /* follows add_bias_linear */
    T_EQ_I64(c->moe.ffn_hidden_size, 10240);
    T_EQ_I64(c->moe.shared_ffn_hidden_size, 10240);
    T_EQ_I64(c->optimizer.decay_iterations, 143051);
    T_CHECK(!c->given[MGC_KEY_MODEL_HEAD_DIM]); /* derived values stay "not given" */
    done(c, &d);

    /* LLaMA-2 70B shape: swiglu, GQA, no biases; decay given. */
    c = load("model:\n"
             "  vocab_size: 32000\n"
             "  seq_length: 4096\n"
             "  hidden_size: 8192\n"
             "  num_layers: 80\n"
             "  num_attention_heads: 64\n"
             "  num_query_groups: 8\n"
             "  activation: swiglu\n"
             "  add_bias_linear: false\n"
             "  position_embedding: rotary\n"
             "  max_position_embeddings: 8192\n"
             "training:\n"
             "  iterations: 500000\n"
             "optimizer:\n"
             "  warmup_iterations: 2000\n"
             "  decay_iterations: 430000\n",
             &d);
    T_CHECK(clean(&d));
    T_EQ_I64(c->model.head_dim, 128);
    T_EQ_I64(c->model.num_query_groups, 8);
    T_EQ_I64(c->model.ffn_hidden_size, 21824); /* floor(8 * 8192 / 3 / 64) * 64 = 341 * 64 */
    T_EQ_I64(c->model.max_position_embeddings, 8192);
    T_EQ_I64(c->model.add_qkv_bias, 0);
    T_EQ_I64(c->optimizer.decay_iterations, 430000);
    T_EQ_I64(c->optimizer.wsd_decay_iterations, 42800); /* 10% of 430000 - 2000 */
    done(c, &d);

    /* Megatron's SwiGLU default int(8h/3/64)*64 over several widths, and
     * head_dim / query groups given explicitly. */
    static const struct {
        int64_t h, heads, ffn;
    } sw[] = {
        {768, 12, 2048},    /* 4096/3 = 2048 exactly */
        {2048, 16, 5440},   /* 5461.3 -> 85 * 64 */
        {4096, 32, 10880},  /* 10922.7 -> 170 * 64 */
        {5120, 40, 13632},  /* 13653.3 -> 213 * 64 */
        {6656, 52, 17728},  /* 17749.3 -> 277 * 64 */
        {16384, 128, 43648} /* 43690.7 -> 682 * 64 */
    };
    for (size_t i = 0; i < sizeof sw / sizeof sw[0]; i++) {
        char text[512];
        snprintf(text, sizeof text,
                 "model:\n  vocab_size: 32000\n  seq_length: 4096\n  hidden_size: %lld\n"
                 "  num_layers: 4\n  num_attention_heads: %lld\n  activation: swiglu\n"
                 "  position_embedding: rotary\n",
                 (long long)sw[i].h, (long long)sw[i].heads);
        c = load(text, &d);
        T_CHECK(clean(&d));
        T_EQ_I64(c->model.ffn_hidden_size, sw[i].ffn);
        T_EQ_I64(c->model.head_dim, sw[i].h / sw[i].heads);
        T_EQ_I64(c->moe.ffn_hidden_size, sw[i].ffn);
        done(c, &d);
    }

    /* Gemma-style explicit head_dim (hidden / heads would not divide) and an
     * explicit FFN: both kept; MoE widths follow the dense one. */
    c = load("model:\n"
             "  vocab_size: 256000\n"
             "  seq_length: 8192\n"
             "  hidden_size: 3072\n"
             "  num_layers: 28\n"
             "  num_attention_heads: 16\n"
             "  num_query_groups: 16\n"
             "  head_dim: 256\n"
             "  activation: swiglu\n"
             "  ffn_hidden_size: 24576\n"
             "  position_embedding: rotary\n",
             &d);
    T_CHECK(clean(&d));
    T_EQ_I64(c->model.head_dim, 256);
    T_EQ_I64(c->model.ffn_hidden_size, 24576);
    T_EQ_I64(c->moe.ffn_hidden_size, 24576);
    done(c, &d);
}

/* ---- parallel grid, nodes ----------------------------------------------- */

#define MODEL_32L                                                                                  \
    "model:\n  vocab_size: 50257\n  seq_length: 4096\n  hidden_size: 4096\n"                       \
    "  num_layers: 32\n  num_attention_heads: 32\n"

static void test_grid(void) {
    mgc_diags d;
    /* world given: data = world / (tensor * context * pipeline) */
    mgc_config *c = load(MODEL_32L "parallel:\n"
                                   "  world_size: 256\n"
                                   "  tensor: 8\n"
                                   "  pipeline: 4\n"
                                   "  context: 2\n"
                                   "training:\n"
                                   "  gradient_accumulation_steps: 16\n",
                         &d);
    T_CHECK(clean(&d));
    T_EQ_I64(c->parallel.data, 4); /* 256 / (8 * 2 * 4) */
    T_EQ_I64(c->parallel.world_size, 256);
    T_EQ_I64(c->parallel.expert_tensor, 8);      /* defaults to tensor */
    T_EQ_I64(c->hardware.nodes, 32);             /* 256 / 8 GPUs per node */
    T_EQ_I64(c->training.global_batch_size, 64); /* 1 * 4 * 16 */
    T_EQ_I64(c->derived.num_microbatches, 16);
    T_EQ_I64(c->derived.expert_data, 8); /* 256 / (8 * 1 * 4): dense models too */
    done(c, &d);

    /* world derived from the degrees; nodes rounded up */
    c = load(MODEL_32L "parallel:\n"
                       "  tensor: 4\n"
                       "  pipeline: 2\n"
                       "  data: 6\n"
                       "  expert_tensor: 2\n"
                       "training:\n"
                       "  gradient_accumulation_steps: 4\n"
                       "hardware:\n"
                       "  gpus_per_node: 5\n",
             &d);
    T_CHECK(clean(&d));
    T_EQ_I64(c->parallel.world_size, 48); /* 4 * 2 * 6 */
    T_EQ_I64(c->parallel.expert_tensor, 2);
    T_EQ_I64(c->hardware.nodes, 10); /* ceil(48 / 5) */
    done(c, &d);

    /* world and data both given, consistent: nothing changes */
    c = load(MODEL_32L "parallel:\n"
                       "  world_size: 64\n"
                       "  data: 4\n"
                       "  tensor: 4\n"
                       "  pipeline: 4\n"
                       "training:\n"
                       "  gradient_accumulation_steps: 8\n"
                       "hardware:\n"
                       "  nodes: 8\n",
             &d);
    T_CHECK(clean(&d));
    T_EQ_I64(c->parallel.data, 4);
    T_EQ_I64(c->parallel.world_size, 64);
    T_EQ_I64(c->hardware.nodes, 8);
    done(c, &d);

    /* world 12 on 8-GPU nodes: 2 nodes */
    c = load(MODEL_32L "parallel:\n  world_size: 12\n", &d);
    T_CHECK(clean(&d));
    T_EQ_I64(c->parallel.data, 12);
    T_EQ_I64(c->hardware.nodes, 2);
    T_EQ_I64(c->training.global_batch_size, 12);
    done(c, &d);
}

/* ---- batch triple ------------------------------------------------------- */

static void test_batch(void) {
    /* data = 8; each row gives a subset of (micro, global, accumulation) and
     * expects all three. -1 = not given. */
    static const struct {
        int64_t mbs, gbs, acc;  /* given */
        int64_t emb, egb, eacc; /* expected */
    } rows[] = {
        {-1, -1, -1, 1, 8, 1},        /* nothing: 1 * 8 * 1 */
        {4, -1, -1, 4, 32, 1},        /* micro only */
        {-1, 1536, -1, 1, 1536, 192}, /* global only: 1536 / (1 * 8) */
        {-1, -1, 12, 1, 96, 12},      /* accumulation only */
        {3, 1536, -1, 3, 1536, 64},   /* micro + global: 1536 / (3 * 8) */
        {6, -1, 5, 6, 240, 5},        /* micro + accumulation */
        {-1, 1536, 24, 8, 1536, 24},  /* global + accumulation: 1536 / (8 * 24) */
        {2, 1536, 96, 2, 1536, 96},   /* all three, consistent */
    };
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
        char text[1024], line[96];
        snprintf(text, sizeof text, MODEL_32L "parallel:\n  data: 8\ntraining:\n");
        if (rows[i].mbs > 0) {
            snprintf(line, sizeof line, "  micro_batch_size: %lld\n", (long long)rows[i].mbs);
            strcat(text, line);
        }
        if (rows[i].gbs > 0) {
            snprintf(line, sizeof line, "  global_batch_size: %lld\n", (long long)rows[i].gbs);
            strcat(text, line);
        }
        if (rows[i].acc > 0) {
            snprintf(line, sizeof line, "  gradient_accumulation_steps: %lld\n",
                     (long long)rows[i].acc);
            strcat(text, line);
        }
        mgc_diags d;
        mgc_config *c = load(text, &d);
        T_CHECK(clean(&d));
        T_EQ_I64(c->training.micro_batch_size, rows[i].emb);
        T_EQ_I64(c->training.global_batch_size, rows[i].egb);
        T_EQ_I64(c->training.grad_accum, rows[i].eacc);
        T_EQ_I64(c->derived.num_microbatches, rows[i].eacc);
        done(c, &d);
    }
}

/* ---- schedule and stages ------------------------------------------------ */

static void check_stage(const mgc_config *c, int64_t s, int32_t first, int32_t n, int emb,
                        int loss) {
    T_CHECK(s < c->derived.num_stages);
    if (s >= c->derived.num_stages) return;
    const mgc_stage *st = &c->derived.stages[s];
    T_EQ_I64(st->first_layer, first);
    T_EQ_I64(st->num_layers, n);
    T_EQ_I64(st->embedding, emb);
    T_EQ_I64(st->loss, loss);
}

static void test_even_split(void) {
    mgc_diags d;
    /* 1F1B over 4 ranks: 32 / 4 = 8 layers each */
    mgc_config *c = load(MODEL_32L "parallel:\n"
                                   "  pipeline: 4\n"
                                   "  data: 2\n"
                                   "training:\n"
                                   "  gradient_accumulation_steps: 8\n",
                         &d);
    T_CHECK(clean(&d));
    T_EQ_I64(c->parallel.virtual_stages, 1);
    T_EQ_I64(c->parallel.schedule, MGC_SCHED_1F1B);
    T_EQ_I64(c->parallel.microbatch_group_size, 4); /* defaults to pipeline */
    T_EQ_I64(c->derived.num_stages, 4);
    check_stage(c, 0, 0, 8, 1, 0);
    check_stage(c, 1, 8, 8, 0, 0);
    check_stage(c, 2, 16, 8, 0, 0);
    check_stage(c, 3, 24, 8, 0, 1);
    done(c, &d);

    /* no pipeline: one stage with everything */
    c = load(MODEL_32L, &d);
    T_CHECK(clean(&d));
    T_EQ_I64(c->derived.num_stages, 1);
    check_stage(c, 0, 0, 32, 1, 1);
    T_EQ_I64(c->parallel.microbatch_group_size, 1);
    done(c, &d);

    /* an explicit schedule is kept */
    c = load(MODEL_32L "parallel:\n  pipeline: 2\n  schedule: gpipe\n"
                       "training:\n  gradient_accumulation_steps: 4\n",
             &d);
    T_CHECK(clean(&d));
    T_EQ_I64(c->parallel.schedule, MGC_SCHED_GPIPE);
    done(c, &d);
}

static void test_interleaved(void) {
    mgc_diags d;
    /* 48 layers, pipeline 4, virtual stages 3: 12 stages of 4 layers in
     * model order; stage s is chunk s / pp of rank s % pp, so rank r's chunk
     * v starts at layer v * (48 / 3) + r * (48 / 12) as in Megatron. */
    mgc_config *c = load("model:\n"
                         "  vocab_size: 50257\n"
                         "  seq_length: 2048\n"
                         "  hidden_size: 6144\n"
                         "  num_layers: 48\n"
                         "  num_attention_heads: 48\n"
                         "parallel:\n"
                         "  tensor: 8\n"
                         "  pipeline: 4\n"
                         "  virtual_stages: 3\n"
                         "  data: 2\n"
                         "training:\n"
                         "  micro_batch_size: 2\n"
                         "  gradient_accumulation_steps: 16\n",
                         &d);
    T_CHECK(clean(&d));
    T_EQ_I64(c->parallel.schedule, MGC_SCHED_INTERLEAVED); /* derived from virtual stages */
    T_EQ_I64(c->parallel.microbatch_group_size, 4);
    T_EQ_I64(c->training.global_batch_size, 64); /* 2 * 2 * 16 */
    T_EQ_I64(c->derived.num_stages, 12);
    for (int64_t s = 0; s < c->derived.num_stages && s < 12; s++) {
        int64_t rank = s % 4, chunk = s / 4;
        T_EQ_I64(c->derived.stages[s].first_layer, chunk * 16 + rank * 4);
        T_EQ_I64(c->derived.stages[s].num_layers, 4);
        T_EQ_I64(c->derived.stages[s].embedding, s == 0);
        T_EQ_I64(c->derived.stages[s].loss, s == 11);
    }
    check_stage(c, 6, 24, 4, 0, 0); /* rank 2, chunk 1 */
    check_stage(c, 9, 36, 4, 0, 0); /* rank 1, chunk 2 */
    done(c, &d);

    /* an explicit group size is kept: 12 microbatches in groups of 8 leave
     * a last group of 4 >= pipeline, which Megatron accepts */
    c = load(MODEL_32L "parallel:\n"
                       "  pipeline: 4\n"
                       "  virtual_stages: 2\n"
                       "  microbatch_group_size: 8\n"
                       "training:\n"
                       "  gradient_accumulation_steps: 12\n",
             &d);
    T_CHECK(clean(&d));
    T_EQ_I64(c->parallel.microbatch_group_size, 8);
    T_EQ_I64(c->derived.num_stages, 8);
    check_stage(c, 5, 20, 4, 0, 0); /* rank 1, chunk 1 */
    done(c, &d);
}

static void test_layouts(void) {
    mgc_diags d;
    /* 4 strings over pipeline 2: virtual stages 2, interleaved; stage 2
     * (rank 0, chunk 1) is empty, which is allowed. */
    mgc_config *c = load("model:\n"
                         "  vocab_size: 50257\n"
                         "  seq_length: 2048\n"
                         "  hidden_size: 2048\n"
                         "  num_layers: 12\n"
                         "  num_attention_heads: 16\n"
                         "parallel:\n"
                         "  pipeline: 2\n"
                         "  pipeline_layout: [\"E t*3\", \"t*5\", \"\", \"t*4 L\"]\n"
                         "training:\n"
                         "  gradient_accumulation_steps: 4\n",
                         &d);
    T_CHECK(clean(&d));
    T_EQ_I64(c->parallel.virtual_stages, 2);
    T_EQ_I64(c->parallel.schedule, MGC_SCHED_INTERLEAVED);
    T_EQ_I64(c->derived.num_stages, 4);
    check_stage(c, 0, 0, 3, 1, 0);
    check_stage(c, 1, 3, 5, 0, 0);
    check_stage(c, 2, 8, 0, 0, 0);
    check_stage(c, 3, 8, 4, 0, 1);
    done(c, &d);

    /* the embedding and the loss alone on the end stages, block form */
    c = load("model:\n"
             "  vocab_size: 128256\n"
             "  seq_length: 8192\n"
             "  hidden_size: 4096\n"
             "  num_layers: 30\n"
             "  num_attention_heads: 32\n"
             "  num_query_groups: 8\n"
             "  activation: swiglu\n"
             "  position_embedding: rotary\n"
             "parallel:\n"
             "  pipeline: 4\n"
             "  pipeline_layout:\n"
             "    - E\n"
             "    - t*15\n"
             "    - tt t*13\n"
             "    - L\n"
             "training:\n"
             "  gradient_accumulation_steps: 8\n",
             &d);
    T_CHECK(clean(&d));
    T_EQ_I64(c->parallel.virtual_stages, 1);
    T_EQ_I64(c->parallel.schedule, MGC_SCHED_1F1B);
    T_EQ_I64(c->derived.num_stages, 4);
    check_stage(c, 0, 0, 0, 1, 0);
    check_stage(c, 1, 0, 15, 0, 0);
    check_stage(c, 2, 15, 15, 0, 0);
    check_stage(c, 3, 30, 0, 0, 1);
    done(c, &d);

    /* E and L in the same single stage with pipeline 1 */
    c = load(MODEL_32L "parallel:\n  pipeline_layout: [\"E t*32 L\"]\n", &d);
    T_CHECK(clean(&d));
    T_EQ_I64(c->derived.num_stages, 1);
    check_stage(c, 0, 0, 32, 1, 1);
    done(c, &d);
}

static void test_parse_stage(void) {
    mgc_layout_stage st;
    int at = -1;
    char msg[128], hint[128];
    T_EQ_I64(mgc_check_parse_stage("E t*4", &st, &at, msg, sizeof msg, hint, sizeof hint), 0);
    T_EQ_I64(st.num_layers, 4);
    T_EQ_I64(st.embedding_at, 0);
    T_EQ_I64(st.loss_at, -1);
    T_EQ_I64(mgc_check_parse_stage("tt*3t\tt * 2 L", &st, &at, msg, sizeof msg, hint, sizeof hint),
             0);
    T_EQ_I64(st.num_layers, 7);
    T_EQ_I64(st.embedding_at, -1);
    T_EQ_I64(st.loss_at, 12);
    T_EQ_I64(mgc_check_parse_stage("", &st, &at, msg, sizeof msg, hint, sizeof hint), 0);
    T_EQ_I64(st.num_layers, 0);
    T_EQ_I64(mgc_check_parse_stage("t*65536", &st, NULL, NULL, 0, NULL, 0), 0);
    T_EQ_I64(st.num_layers, 65536);
    static const struct {
        const char *s;
        int at;
        const char *needle;
    } bad[] = {
        {"t*0", 2, "at least 1"},
        {"t*65537", 2, "larger than any model"},
        {"E t*2 | t", 6, "'|'"},
        {"t L t", 4, "nothing may follow L"},
        {"t E", 2, "before the stage's layers"},
        {"E E", 2, "twice"},
        {"t*", 2, "expected a layer count"},
        {"4", 0, "'t*' before"},
        {"(t*2)*2", 0, "grouping"},
        {"e t", 0, "case-sensitive"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        at = -1;
        msg[0] = 0;
        T_EQ_I64(mgc_check_parse_stage(bad[i].s, &st, &at, msg, sizeof msg, hint, sizeof hint), -1);
        T_EQ_I64(at, bad[i].at);
        T_CHECK(strstr(msg, bad[i].needle) != NULL);
    }
    /* every output buffer is optional */
    T_EQ_I64(mgc_check_parse_stage("x", NULL, NULL, NULL, 0, NULL, 0), -1);
}

/* ---- vocabulary --------------------------------------------------------- */

static void test_padded_vocab(void) {
    /* Megatron's examples: GPT-2's 50257 at tensor 1, 2, 4, 8 */
    T_EQ_I64(mgc_check_padded_vocab(50257, 128, 1), 50304);
    T_EQ_I64(mgc_check_padded_vocab(50257, 128, 2), 50432);
    T_EQ_I64(mgc_check_padded_vocab(50257, 128, 4), 50688);
    T_EQ_I64(mgc_check_padded_vocab(50257, 128, 8), 51200);
    T_EQ_I64(mgc_check_padded_vocab(128256, 128, 8), 129024); /* LLaMA 3 */
    T_EQ_I64(mgc_check_padded_vocab(32000, 128, 1), 32000);   /* already a multiple */
    T_EQ_I64(mgc_check_padded_vocab(32000, 128, 3), 32256);   /* 384 * 84 */
    T_EQ_I64(mgc_check_padded_vocab(1, 128, 1), 128);
    T_EQ_I64(mgc_check_padded_vocab(50257, 1, 1), 50257);
    /* not positive */
    T_EQ_I64(mgc_check_padded_vocab(0, 128, 1), -1);
    T_EQ_I64(mgc_check_padded_vocab(50257, 0, 1), -1);
    T_EQ_I64(mgc_check_padded_vocab(50257, 128, 0), -1);
    T_EQ_I64(mgc_check_padded_vocab(-5, 128, 1), -1);
    /* overflow: divisor * tensor, and the rounded-up result */
    T_EQ_I64(mgc_check_padded_vocab(10, INT64_MAX, 2), -1);
    T_EQ_I64(mgc_check_padded_vocab(10, (int64_t)1 << 32, (int64_t)1 << 31), -1);
    T_EQ_I64(mgc_check_padded_vocab(INT64_MAX - 5, 128, 1), -1);
    T_EQ_I64(mgc_check_padded_vocab(INT64_MAX, 1, 1), INT64_MAX); /* no rounding: fits */
    T_EQ_I64(mgc_check_padded_vocab((int64_t)1 << 62, 1 << 20, 1 << 10), (int64_t)1 << 62);

    /* through the config, at the config's tensor degree */
    mgc_diags d;
    mgc_config *c = load("model:\n"
                         "  vocab_size: 128256\n"
                         "  seq_length: 8192\n"
                         "  hidden_size: 4096\n"
                         "  num_layers: 32\n"
                         "  num_attention_heads: 32\n"
                         "  num_query_groups: 8\n"
                         "  activation: swiglu\n"
                         "  ffn_hidden_size: 14336\n"
                         "  position_embedding: rotary\n"
                         "parallel:\n"
                         "  tensor: 8\n",
                         &d);
    T_CHECK(clean(&d));
    T_EQ_I64(c->derived.padded_vocab_size, 129024);
    done(c, &d);
    c = load(MODEL_32L "parallel:\n  tensor: 4\n", &d);
    T_CHECK(clean(&d));
    T_EQ_I64(c->derived.padded_vocab_size, 50688);
    done(c, &d);
}

/* ---- mixture of experts ------------------------------------------------- */

#define MOE_MODEL(layers)                                                                          \
    "model:\n  vocab_size: 32000\n  seq_length: 4096\n  hidden_size: 4096\n"                       \
    "  num_layers: " layers "\n  num_attention_heads: 32\n  num_query_groups: 8\n"                 \
    "  activation: swiglu\n  ffn_hidden_size: 14336\n  position_embedding: rotary\n"

static void test_moe_layers(void) {
    mgc_diags d;
    /* layer_freq 2 after one dense layer: 1, 3, 5, 7, 9, 11 */
    mgc_config *c = load(MOE_MODEL("12") "moe:\n"
                                         "  num_experts: 8\n"
                                         "  layer_freq: 2\n"
                                         "  first_dense_layers: 1\n",
                         &d);
    T_CHECK(clean(&d));
    T_EQ_I64(c->derived.num_moe_layers, 6);
    T_CHECK(c->derived.is_moe_layer != NULL);
    for (int i = 0; i < 12 && c->derived.is_moe_layer; i++)
        T_EQ_I64(c->derived.is_moe_layer[i], i % 2 == 1);
    done(c, &d);

    /* three dense layers, then every fourth: 3, 7, 11, 15 */
    c = load(MOE_MODEL("16") "moe:\n  num_experts: 16\n  layer_freq: 4\n"
                             "  first_dense_layers: 3\n",
             &d);
    T_CHECK(clean(&d));
    T_EQ_I64(c->derived.num_moe_layers, 4);
    for (int i = 0; i < 16 && c->derived.is_moe_layer; i++)
        T_EQ_I64(c->derived.is_moe_layer[i], i >= 3 && (i - 3) % 4 == 0);
    done(c, &d);

    /* an explicit list */
    c = load(MOE_MODEL("16") "moe:\n  num_experts: 16\n  layers: [0, 5, 6, 15]\n", &d);
    T_CHECK(clean(&d));
    T_EQ_I64(c->derived.num_moe_layers, 4);
    for (int i = 0; i < 16 && c->derived.is_moe_layer; i++)
        T_EQ_I64(c->derived.is_moe_layer[i], i == 0 || i == 5 || i == 6 || i == 15);
    done(c, &d);

    /* defaults: every layer */
    c = load(MOE_MODEL("24") "moe:\n  num_experts: 8\n", &d);
    T_CHECK(clean(&d));
    T_EQ_I64(c->derived.num_moe_layers, 24);
    T_EQ_I64(c->moe.ffn_hidden_size, 14336); /* follows the dense width */
    done(c, &d);

    /* dense: the map exists and is all zero */
    c = load(MOE_MODEL("24"), &d);
    T_CHECK(clean(&d));
    T_EQ_I64(c->derived.num_moe_layers, 0);
    T_CHECK(c->derived.is_moe_layer != NULL);
    int any = 0;
    for (int i = 0; i < 24 && c->derived.is_moe_layer; i++)
        any |= c->derived.is_moe_layer[i];
    T_EQ_I64(any, 0);
    done(c, &d);
}

static void test_expert_grid(void) {
    mgc_diags d;
    /* Mixtral-like on 64 GPUs: tensor 4, pipeline 2 -> data 8; expert 4 with
     * expert_tensor defaulting to tensor: EDP = 64 / (4 * 4 * 2) = 2. */
    mgc_config *c = load(MOE_MODEL("32") "moe:\n"
                                         "  num_experts: 8\n"
                                         "parallel:\n"
                                         "  world_size: 64\n"
                                         "  tensor: 4\n"
                                         "  sequence_parallel: true\n"
                                         "  pipeline: 2\n"
                                         "  expert: 4\n"
                                         "training:\n"
                                         "  gradient_accumulation_steps: 4\n",
                         &d);
    T_CHECK(clean(&d));
    T_EQ_I64(c->parallel.data, 8);
    T_EQ_I64(c->parallel.expert_tensor, 4);
    T_EQ_I64(c->derived.expert_data, 2);
    T_EQ_I64(c->derived.sequence_parallel, 1);
    T_EQ_I64(c->derived.padded_vocab_size, 32256); /* 32000 -> multiple of 512 */
    T_EQ_I64(c->training.global_batch_size, 32);   /* 1 * 8 * 4 */
    T_EQ_I64(c->derived.num_stages, 2);
    check_stage(c, 1, 16, 16, 0, 1);
    done(c, &d);

    /* expert_tensor 1 folds the expert grid: EDP = 64 / (1 * 4 * 2) = 8 */
    c = load(MOE_MODEL("32") "moe:\n  num_experts: 8\n"
                             "parallel:\n  world_size: 64\n  tensor: 4\n"
                             "  sequence_parallel: true\n  pipeline: 2\n  expert: 4\n"
                             "  expert_tensor: 1\n"
                             "training:\n  gradient_accumulation_steps: 4\n",
             &d);
    T_CHECK(clean(&d));
    T_EQ_I64(c->derived.expert_data, 8);
    done(c, &d);
}

/* ---- sequence parallelism ----------------------------------------------- */

static void test_sequence_parallel(void) {
    static const struct {
        int tp, sp, expect;
    } rows[] = {{1, 1, 0}, {8, 1, 1}, {8, 0, 0}, {2, 1, 1}};
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
        char text[512];
        snprintf(text, sizeof text, MODEL_32L "parallel:\n  tensor: %d\n  sequence_parallel: %s\n",
                 rows[i].tp, rows[i].sp ? "true" : "false");
        mgc_diags d;
        mgc_config *c = load(text, &d);
        T_CHECK(clean(&d));
        T_EQ_I64(c->derived.sequence_parallel, rows[i].expect);
        T_EQ_I64(c->parallel.sequence_parallel, rows[i].sp); /* the key itself is untouched */
        T_EQ_I64(d.warnings, rows[i].tp == 1 && rows[i].sp); /* "has no effect" */
        done(c, &d);
    }
}

/* ---- where rules point -------------------------------------------------- */

static void test_locations(void) {
    mgc_diags d;
    mgc_config *c = load(MODEL_32L                    /* lines 1-6 */
                         "parallel:\n"                /* 7 */
                         "  tensor: 3\n"              /* 8:11 */
                         "  pipeline: 2\n"            /* 9 */
                         "  pipeline_layout:\n"       /* 10 */
                         "    - \"E t*16 | t\"\n"     /* 11: '|' at col 8 + 7 */
                         "    - t*16 L\n"             /* 12 */
                         "moe:\n"                     /* 13 */
                         "  num_experts: 4\n"         /* 14 */
                         "  layers: [1, 4, 40]\n"     /* 15: 40 at col 18 */
                         "training:\n"                /* 16 */
                         "  global_batch_size: 100\n" /* 17:22 */
                         "  micro_batch_size: 3\n",   /* 18 */
                         &d);
    T_CHECK(has(&d, MGC_SEV_ERROR, 8, 11, "is not divisible by parallel.tensor (3)"));
    T_CHECK(has(&d, MGC_SEV_ERROR, 11, 15, "'|' separates stages"));
    T_CHECK(has(&d, MGC_SEV_ERROR, 15, 18, "moe.layers[2] = 40 is out of range"));
    T_CHECK(has(&d, MGC_SEV_ERROR, 17, 22, "not divisible by micro_batch_size * data"));
    done(c, &d);

    /* a warning points at the key that has no effect */
    c = load(MODEL_32L "parallel:\n"                  /* 7 */
                       "  pipeline: 2\n"              /* 8 */
                       "  microbatch_group_size: 4\n" /* 9:26 */
                       "training:\n"
                       "  gradient_accumulation_steps: 4\n",
             &d);
    T_CHECK(clean(&d));
    T_CHECK(has(&d, MGC_SEV_WARNING, 9, 26, "microbatch_group_size has no effect"));
    T_EQ_I64(c->parallel.microbatch_group_size, 4); /* given: kept */
    done(c, &d);

    /* 16-bit logits in an fp32 plan: fp32 either way; in bf16 no warning */
    for (int prec = 0; prec < 2; prec++) {
        c = load(prec ? MODEL_32L "training:\n"            /* 7 */
                        "  precision: bf16\n"              /* 8 */
                        "  logits_dtype: compute\n"        /* 9:17 */
                      : MODEL_32L "training:\n"
                        "  precision: fp32\n"
                        "  logits_dtype: compute\n",
                 &d);
        T_CHECK(clean(&d));
        if (prec) T_EQ_I64(d.warnings, 0);
        else
            T_CHECK(has(&d, MGC_SEV_WARNING, 9, 17, "training.logits_dtype compute has no effect"));
        T_EQ_I64(c->training.logits_dtype, MGC_LOGITS_DT_COMPUTE);
        done(c, &d);
    }
}

int main(void) {
    test_model_defaults();
    test_grid();
    test_batch();
    test_even_split();
    test_interleaved();
    test_layouts();
    test_parse_stage();
    test_padded_vocab();
    test_moe_layers();
    test_expert_grid();
    test_sequence_parallel();
    test_locations();
    return t_summary("test_check");
}
