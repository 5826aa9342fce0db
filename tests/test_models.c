/* test_models.c - every model in models/ loads, checks clean and has its
 * published parameter count.
 *
 * Each file in models/ has one row in `expected` below: its published count
 * (from the paper / model card / Hugging Face checkpoint, see the file's header
 * and docs/models.md) and an independent description of its architecture.
 * Three things must then agree exactly:
 *   1. the published number typed into the table,
 *   2. a closed form over the table's architecture (written here, sharing no
 *      code with compiler/facts.c), and
 *   3. facts.params.total / .active that mgc computes from the YAML.
 * A typo in the YAML, in the table or in facts.c breaks at least one of them.
 * The table's architecture is also compared field by field with the loaded
 * config, so a YAML typo is reported by name.
 *
 * The directory listing must match the table both ways: a model added without
 * an expectation, or an expected model that vanished, fails the test.
 *
 * Vocabulary padding is checked against Megatron's rule
 * (ceil(V / (divisor * tensor)) * divisor * tensor) at the file's own tensor
 * degree and, through --set style overrides, at other degrees. */
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config.h"
#include "diag.h"
#include "facts.h"
#include "ir.h"
#include "testlib.h"

#ifndef MGC_SOURCE_DIR
#define MGC_SOURCE_DIR "."
#endif

/* ---- an architecture, described independently of config.h ------------- */

typedef struct arch {
    int64_t V;       /* vocabulary, unpadded */
    int64_t divisor; /* make_vocab_size_divisible_by */
    int64_t s;       /* seq_length */
    int64_t P;       /* learned position rows; 0 = rotary (no table) */
    int64_t h;       /* hidden */
    int64_t L;       /* layers */
    int64_t a;       /* query heads */
    int64_t g;       /* key/value heads */
    int64_t f;       /* dense MLP width */
    int rms;         /* 1 RMSNorm (weight only), 0 LayerNorm (weight + bias) */
    int gated;       /* 1 SwiGLU (3 matrices), 0 gelu (2 matrices) */
    int bias;        /* biases on every linear layer */
    int tied;        /* output layer shares the input embedding */
    /* mixture of experts (E == 0: dense) */
    int64_t E;           /* routed experts per MoE layer */
    int64_t k;           /* experts per token */
    int64_t fe;          /* routed expert width */
    int64_t S;           /* shared experts */
    int64_t fs;          /* shared expert width */
    int64_t first_dense; /* leading dense layers */
    int qk;              /* query and key norms: one more norm of head_dim each, twice a layer */
    int64_t d;           /* head_dim; 0: h / a */
} arch;

typedef struct counts {
    uint64_t total;  /* every weight and bias, unpadded vocabulary */
    uint64_t active; /* routed experts counted k of E */
} counts;

static uint64_t mlp_params(const arch *m, int64_t width) {
    uint64_t h = (uint64_t)m->h, w = (uint64_t)width;
    if (m->gated) return 3 * h * w + (m->bias ? 2 * w + h : 0); /* fc1 is [h, 2w], fc2 [w, h] */
    return 2 * h * w + (m->bias ? w + h : 0);
}

/* The closed form: per layer two norms, attention (q, k, v, o), an MLP or an
 * MoE block; then the embedding (+ position table), the final norm and, when
 * untied, the output layer. */
static counts closed_form(const arch *m) {
    uint64_t h = (uint64_t)m->h, d = (uint64_t)(m->d ? m->d : m->h / m->a);
    uint64_t a = (uint64_t)m->a, g = (uint64_t)m->g;
    uint64_t norm = m->rms ? h : 2 * h;
    uint64_t attn = h * a * d /* q */ + 2 * h * g * d /* k, v */ + a * d * h /* o */;
    if (m->bias) attn += a * d + 2 * g * d + h;
    if (m->qk) attn += 2 * (m->rms ? d : 2 * d);
    counts c = {0, 0};
    for (int64_t l = 0; l < m->L; l++) {
        uint64_t base = 2 * norm + attn;
        if (m->E > 0 && l >= m->first_dense) {
            uint64_t router = h * (uint64_t)m->E; /* linear, no bias */
            uint64_t shared = m->S ? (uint64_t)m->S * mlp_params(m, m->fs) : 0;
            c.total += base + router + shared + (uint64_t)m->E * mlp_params(m, m->fe);
            c.active += base + router + shared + (uint64_t)m->k * mlp_params(m, m->fe);
        } else {
            c.total += base + mlp_params(m, m->f);
            c.active += base + mlp_params(m, m->f);
        }
    }
    uint64_t emb =
        (uint64_t)m->V * h + (uint64_t)m->P * h + norm + (m->tied ? 0 : (uint64_t)m->V * h);
    c.total += emb;
    c.active += emb;
    return c;
}

static int64_t megatron_padded_vocab(int64_t V, int64_t divisor, int64_t tp) {
    int64_t multiple = divisor * tp;
    return (V + multiple - 1) / multiple * multiple;
}

/* ---- the expectations -------------------------------------------------- */

typedef struct pad_case {
    int64_t tensor; /* 0 ends the list */
    int64_t padded; /* written out by hand */
} pad_case;

typedef struct expected {
    const char *file;          /* name inside models/ */
    uint64_t published_total;  /* exact published count; 0 when only rounded */
    uint64_t published_active; /* 0: same as total (dense) */
    double rounded_total;      /* when the source gives only a rounded figure */
    double rounded_tol;        /* relative tolerance for it */
    uint64_t closed_total;     /* exact count of the architecture (== published when exact) */
    int64_t tensor;            /* the file's own tensor degree */
    int64_t data;              /* its derived data-parallel degree */
    arch m;
    pad_case pads[4]; /* padded vocabulary at other tensor degrees */
    /* MoE models whose active count is published rounded only */
    uint64_t closed_active; /* exact active count of the architecture */
    double rounded_active;  /* the rounded figure, within 2% (a card rounds 3.35B to "3.3B") */
} expected;

/* GPT-2 family: LayerNorm, gelu, biases, tied, learned 1024 positions, V 50257. */
#define GPT2(h_, L_, a_)                                                                           \
    { 50257, 128, 1024, 1024, h_, L_, a_, a_, 4 * (h_), 0, 0, 1, 1, 0, 0, 0, 0, 0, 0 }
/* LLaMA family: RMSNorm, SwiGLU, no biases, untied, rotary. */
#define LLAMA(V_, s_, h_, L_, a_, g_, f_)                                                          \
    { V_, 128, s_, 0, h_, L_, a_, g_, f_, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0 }

static const expected expected_models[] = {
    {"gpt2-124m.yaml",
     124439808u,
     0,
     0,
     0,
     124439808u,
     1,
     8,
     GPT2(768, 12, 12),
     {{1, 50304}, {2, 50432}, {4, 50688}, {0, 0}}},
    {"gpt2-355m.yaml", 354823168u, 0, 0, 0, 354823168u, 1, 8, GPT2(1024, 24, 16), {{0, 0}}},
    {"gpt2-774m.yaml", 774030080u, 0, 0, 0, 774030080u, 2, 8, GPT2(1280, 36, 20), {{0, 0}}},
    {"gpt2-1.5b.yaml",
     1557611200u,
     0,
     0,
     0,
     1557611200u,
     1,
     32,
     GPT2(1600, 48, 25),
     {{5, 50560}, {0, 0}}},
    /* Brown et al. give "175.0B"; the architecture gives 174,604,259,328. */
    {"gpt3-175b.yaml",
     0,
     0,
     175.0e9,
     0.005,
     174604259328u,
     8,
     12,
     {50257, 128, 2048, 2048, 12288, 96, 96, 96, 49152, 0, 0, 1, 1, 0, 0, 0, 0, 0, 0},
     {{1, 50304}, {4, 50688}, {0, 0}}},
    {"llama2-7b.yaml",
     6738415616u,
     0,
     0,
     0,
     6738415616u,
     2,
     64,
     LLAMA(32000, 4096, 4096, 32, 32, 32, 11008),
     {{1, 32000}, {8, 32768}, {0, 0}}},
    {"llama2-70b.yaml",
     68976648192u,
     0,
     0,
     0,
     68976648192u,
     8,
     16,
     LLAMA(32000, 4096, 8192, 80, 64, 8, 28672),
     {{2, 32000}, {4, 32256}, {0, 0}}},
    {"llama3-8b.yaml",
     8030261248u,
     0,
     0,
     0,
     8030261248u,
     2,
     64,
     LLAMA(128256, 8192, 4096, 32, 32, 8, 14336),
     {{1, 128256}, {4, 128512}, {8, 129024}, {0, 0}}},
    {"llama3-405b.yaml",
     405853388800u,
     0,
     0,
     0,
     405853388800u,
     8,
     128,
     LLAMA(128256, 8192, 16384, 126, 128, 8, 53248),
     {{1, 128256}, {2, 128256}, {4, 128512}, {0, 0}}},
    {"mistral-7b.yaml",
     7241732096u,
     0,
     0,
     0,
     7241732096u,
     2,
     32,
     LLAMA(32000, 4096, 4096, 32, 32, 8, 14336),
     {{0, 0}}},
    {"mixtral-8x7b.yaml",
     46702792704u,
     12879925248u,
     0,
     0,
     46702792704u,
     1,
     32,
     {32000, 128, 4096, 0, 4096, 32, 32, 8, 14336, 1, 1, 0, 0, 8, 2, 14336, 0, 0, 0},
     {{2, 32000}, {8, 32768}, {0, 0}}},
    /* The model card gives "8.2B" ("6.95B" non-embedding); the architecture gives
     * 8,190,735,360 (6,946,075,648). */
    {"qwen3-8b.yaml",
     0,
     0,
     8.2e9,
     0.005,
     8190735360u,
     2,
     128,
     {151936, 128, 4096, 0, 4096, 36, 32, 8, 12288, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 1},
     {{1, 151936}, {8, 152576}, {0, 0}}},
    /* The card gives "30.5B" total, "3.3B" activated; the architecture gives 30,532,122,624
     * and 3,353,032,704.  head_dim 128 with h 2048 and 32 heads (q is 2h wide). */
    {"qwen3-30b-a3b.yaml",
     0,
     0,
     30.5e9,
     0.005,
     30532122624u,
     1,
     64,
     {151936, 128, 4096, 0, 2048, 48, 32, 4, 6144, 1, 1, 0, 0, 128, 8, 768, 0, 0, 0, 1, 128},
     {{8, 152576}, {0, 0}},
     3353032704u,
     3.3e9},
    /* tiny models: their counts are ours (closed form), there is nothing to publish */
    {"tiny-gpt.yaml",
     481440u,
     0,
     0,
     0,
     481440u,
     1,
     1,
     {257, 8, 96, 96, 96, 4, 6, 6, 384, 0, 0, 1, 1, 0, 0, 0, 0, 0, 0},
     {{1, 264}, {2, 272}, {3, 264}, {6, 288}}},
    {"tiny-llama.yaml",
     369696u,
     0,
     0,
     0,
     369696u,
     1,
     1,
     {257, 8, 96, 0, 96, 4, 6, 2, 192, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0},
     {{2, 272}, {6, 288}, {0, 0}}},
    {"tiny-moe.yaml",
     620832u,
     372000u,
     0,
     0,
     620832u,
     1,
     1,
     {257, 8, 96, 0, 96, 4, 6, 2, 192, 1, 1, 0, 0, 8, 2, 48, 1, 96, 1},
     {{2, 272}, {0, 0}}},
};
#define N_EXPECTED ((int)(sizeof expected_models / sizeof expected_models[0]))

/* ---- loading ----------------------------------------------------------- */

typedef struct loaded {
    mgc_config *cfg;
    mgc_graph *graph;
    mgc_facts facts;
    mgc_diags diags;
    int ok; /* no errors anywhere */
} loaded;

/* Load, apply overrides, finalize, build the IR and compute facts - the same
 * sequence as `mgc check`. */
static void load(const char *path, const char *const *sets, int nsets, loaded *L) {
    memset(L, 0, sizeof *L);
    mgc_diags_init(&L->diags);
    L->cfg = mgc_config_new();
    if (!L->cfg) return;
    mgc_config_load_file(L->cfg, path, &L->diags);
    for (int i = 0; i < nsets; i++)
        mgc_config_set(L->cfg, sets[i], "--set", &L->diags);
    if (L->diags.errors == 0) mgc_config_finalize(L->cfg, &L->diags);
    if (L->diags.errors == 0) {
        L->graph = mgc_ir_build(L->cfg, &L->diags);
        if (L->graph && L->diags.errors == 0)
            mgc_facts_compute(L->cfg, L->graph, &L->facts, &L->diags);
    }
    L->ok = L->cfg && L->graph && L->diags.errors == 0;
    if (L->diags.n) {
        fprintf(stderr, "%s: %d diagnostic(s):\n", path, L->diags.n);
        mgc_diags_sort(&L->diags);
        mgc_diags_print(&L->diags, stderr);
    }
}

static void unload(loaded *L) {
    mgc_ir_free(L->graph);
    mgc_config_free(L->cfg);
    mgc_diags_free(&L->diags);
}

/* ---- the checks -------------------------------------------------------- */

/* The loaded config describes the same architecture as the table row. */
static void check_arch(const expected *e, const mgc_config *c) {
    const arch *m = &e->m;
    const mgc_model_cfg *mc = &c->model;
    T_EQ_I64(mc->vocab_size, m->V);
    T_EQ_I64(mc->vocab_divisor, m->divisor);
    T_EQ_I64(mc->seq_length, m->s);
    T_EQ_I64(mc->hidden_size, m->h);
    T_EQ_I64(mc->num_layers, m->L);
    T_EQ_I64(mc->num_heads, m->a);
    T_EQ_I64(mc->num_query_groups, m->g);
    T_EQ_I64(mc->head_dim, m->d ? m->d : m->h / m->a);
    T_EQ_I64(mc->ffn_hidden_size, m->f);
    T_EQ_I64(mc->normalization, m->rms ? MGC_NORM_RMSNORM : MGC_NORM_LAYERNORM);
    T_EQ_I64(mc->activation, m->gated ? MGC_ACT_SWIGLU : MGC_ACT_GELU);
    T_EQ_I64(mc->position_embedding, m->P ? MGC_POS_LEARNED : MGC_POS_ROTARY);
    if (m->P) T_EQ_I64(mc->max_position_embeddings, m->P);
    T_EQ_I64(mc->add_bias_linear, m->bias);
    T_EQ_I64(mc->tie_embeddings, m->tied);
    T_EQ_I64(mc->qk_layernorm, m->qk);
    T_EQ_I64(c->moe.num_experts, m->E);
    if (m->E) {
        T_EQ_I64(c->moe.top_k, m->k);
        T_EQ_I64(c->moe.ffn_hidden_size, m->fe);
        T_EQ_I64(c->moe.shared_experts, m->S);
        if (m->S) T_EQ_I64(c->moe.shared_ffn_hidden_size, m->fs);
        T_EQ_I64(c->derived.num_moe_layers, m->L - m->first_dense);
    }
}

static void check_model(const expected *e, const char *dir) {
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", dir, e->file);
    printf("-- %s\n", e->file);

    /* the table is consistent with itself: published == closed form */
    counts cf = closed_form(&e->m);
    T_EQ_U64(cf.total, e->closed_total);
    if (e->published_total) {
        T_EQ_U64(cf.total, e->published_total);
    } else {
        T_NEAR_REL(cf.total, e->rounded_total, e->rounded_tol);
    }
    if (e->closed_active) {
        T_EQ_U64(cf.active, e->closed_active);
        T_NEAR_REL(cf.active, e->rounded_active, 0.02);
    } else {
        T_EQ_U64(cf.active, e->published_active ? e->published_active : e->closed_total);
    }
    if (!e->m.E) T_EQ_U64(cf.active, cf.total);

    loaded L;
    load(path, NULL, 0, &L);
    T_CHECK(L.ok);
    if (L.cfg) T_EQ_I64(L.diags.errors, 0);
    T_EQ_I64(L.diags.warnings, 0); /* a shipped model is clean */
    if (!L.ok) {
        fprintf(stderr, "%s: failed to load; skipping its value checks\n", e->file);
        unload(&L);
        return;
    }
    const mgc_config *c = L.cfg;
    check_arch(e, c);

    /* mgc's count == the closed form == the published figure */
    T_EQ_U64(L.facts.params.total, cf.total);
    T_EQ_U64(L.facts.params.active, cf.active);
    uint64_t extra_rows = (uint64_t)(c->derived.padded_vocab_size - e->m.V);
    T_EQ_U64(L.facts.params.total_padded,
             cf.total + extra_rows * (uint64_t)e->m.h * (e->m.tied ? 1u : 2u));
    printf("   total %llu, active %llu, padded vocab %lld (tensor %lld)\n",
           (unsigned long long)L.facts.params.total, (unsigned long long)L.facts.params.active,
           (long long)c->derived.padded_vocab_size, (long long)c->parallel.tensor);

    /* the layout the file meant */
    T_EQ_I64(c->parallel.tensor, e->tensor);
    T_EQ_I64(c->parallel.data, e->data);
    T_EQ_I64(c->parallel.tensor * c->parallel.context * c->parallel.pipeline * c->parallel.data,
             c->parallel.world_size);
    T_EQ_I64(c->training.global_batch_size,
             c->training.micro_batch_size * c->parallel.data * c->training.grad_accum);

    /* Megatron's padding rule at the file's own tensor degree */
    T_EQ_I64(c->derived.padded_vocab_size, megatron_padded_vocab(e->m.V, e->m.divisor, e->tensor));
    int64_t cp = c->parallel.context, pp = c->parallel.pipeline;
    int sp = c->parallel.sequence_parallel;
    unload(&L);

    /* ... and at other tensor degrees, by override: the hand-written value,
     * the rule and mgc must agree, and the published count must not move.
     * world_size follows so that data parallel stays what the file says. */
    for (int i = 0; i < 4 && e->pads[i].tensor; i++) {
        const pad_case *p = &e->pads[i];
        T_EQ_I64(p->padded, megatron_padded_vocab(e->m.V, e->m.divisor, p->tensor));
        char tp[64], world[64];
        snprintf(tp, sizeof tp, "parallel.tensor=%lld", (long long)p->tensor);
        snprintf(world, sizeof world, "parallel.world_size=%lld",
                 (long long)(p->tensor * cp * pp * e->data));
        /* sequence parallelism needs tensor > 1; a MoE model with
         * tensor > 1 requires it; otherwise keep the file's choice */
        const char *sets[3] = {tp, world, NULL};
        int nsets = 2;
        if (p->tensor == 1)
            sets[nsets++] = "parallel.sequence_parallel=false";
        else if (sp || e->m.E > 0)
            sets[nsets++] = "parallel.sequence_parallel=true";
        loaded P;
        load(path, sets, nsets, &P);
        T_CHECK(P.ok);
        if (P.ok) {
            T_EQ_I64(P.cfg->derived.padded_vocab_size, p->padded);
            T_EQ_U64(P.facts.params.total, cf.total);
            T_EQ_U64(P.facts.params.active, cf.active);
        }
        unload(&P);
    }
}

static int cmp_str(const void *a, const void *b) {
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

int main(void) {
    const char *dir = MGC_SOURCE_DIR "/models";

    /* the directory and the table list the same files */
    char *names[256];
    int n = 0;
    DIR *dp = opendir(dir);
    T_CHECK(dp != NULL);
    if (dp) {
        struct dirent *de;
        while ((de = readdir(dp)) && n < 256) {
            size_t len = strlen(de->d_name);
            if (len > 5 && !strcmp(de->d_name + len - 5, ".yaml")) names[n++] = strdup(de->d_name);
        }
        closedir(dp);
    }
    qsort(names, (size_t)n, sizeof names[0], cmp_str);
    for (int i = 0; i < n; i++) {
        int found = 0;
        for (int j = 0; j < N_EXPECTED; j++)
            found |= !strcmp(names[i], expected_models[j].file);
        if (!found) fprintf(stderr, "models/%s has no entry in test_models.c's table\n", names[i]);
        T_CHECK(found);
    }
    for (int j = 0; j < N_EXPECTED; j++) {
        int found = 0;
        for (int i = 0; i < n; i++)
            found |= !strcmp(names[i], expected_models[j].file);
        if (!found) fprintf(stderr, "models/%s is expected but missing\n", expected_models[j].file);
        T_CHECK(found);
    }
    T_EQ_I64(n, N_EXPECTED);
    for (int i = 0; i < n; i++)
        free(names[i]);

    for (int j = 0; j < N_EXPECTED; j++)
        check_model(&expected_models[j], dir);

    /* examples/tiny-gpt.yaml is models/tiny-gpt.yaml with more words */
    {
        loaded L;
        load(MGC_SOURCE_DIR "/examples/tiny-gpt.yaml", NULL, 0, &L);
        T_CHECK(L.ok);
        T_EQ_I64(L.diags.warnings, 0);
        if (L.ok) T_EQ_U64(L.facts.params.total, 481440u);
        unload(&L);
    }
    return t_summary("test_models");
}
