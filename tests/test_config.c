/* test_config.c - the YAML front end: parsing, schema checks, overrides. */
#include <stdlib.h>
#include <string.h>

#include "config.h"
#include "testlib.h"

/* Load text (no finalize); return the config, diagnostics in *d. */
static mgc_config *load(const char *text, mgc_diags *d) {
    mgc_config *c = mgc_config_new();
    mgc_diags_init(d);
    mgc_config_load_text(c, "t.yaml", text, strlen(text), d);
    return c;
}

/* Does some diagnostic at line:col contain `needle` (in msg or hint)? */
static int has(const mgc_diags *d, int line, int col, const char *needle) {
    for (int i = 0; i < d->n; i++) {
        const mgc_diag_entry *e = &d->v[i];
        if ((line < 0 || e->loc.line == line) && (col < 0 || e->loc.col == col) &&
            (strstr(e->msg, needle) || (e->hint && strstr(e->hint, needle))))
            return 1;
    }
    for (int i = 0; i < d->n; i++)
        fprintf(stderr, "  [have] %d:%d %s | %s\n", d->v[i].loc.line, d->v[i].loc.col, d->v[i].msg,
                d->v[i].hint ? d->v[i].hint : "");
    return 0;
}

static void test_values(void) {
    mgc_diags d;
    mgc_config *c = load("model:\n"
                         "  vocab_size: 50_257\n"
                         "  hidden_size: 0x300\n"
                         "  num_layers: 1.2e1\n"
                         "  normalization: RMSNorm\n"
                         "  norm_eps: 1e-6\n"
                         "  tie_embeddings: no\n"
                         "  name: \"gpt: small\"\n"
                         "parallel:\n"
                         "  schedule: interleaved_1f1b\n"
                         "moe:\n"
                         "  layers: [1, 3, 5]\n"
                         "data:\n"
                         "  paths:\n"
                         "    - a/b\n"
                         "    - {path: c/d, weight: 0.25}\n",
                         &d);
    T_EQ_I64(d.errors, 0);
    T_EQ_I64(c->model.vocab_size, 50257);
    T_EQ_I64(c->model.hidden_size, 768);
    T_EQ_I64(c->model.num_layers, 12);
    T_EQ_I64(c->model.normalization, MGC_NORM_RMSNORM);
    T_NEAR_REL(c->model.norm_eps, 1e-6, 1e-15);
    T_EQ_I64(c->model.tie_embeddings, 0);
    T_STREQ(c->model.name, "gpt: small");
    T_EQ_I64(c->parallel.schedule, MGC_SCHED_INTERLEAVED);
    T_EQ_I64(c->moe.layers.n, 3);
    T_EQ_I64(c->moe.layers.v[2], 5);
    T_EQ_I64(c->moe.layers.loc[2].line, 12);
    T_EQ_I64(c->data.paths.n, 2);
    T_STREQ(c->data.paths.path[1], "c/d");
    T_NEAR_REL(c->data.paths.weight[1], 0.25, 0);
    T_NEAR_REL(c->data.paths.weight[0], 1.0, 0);
    /* given flags and locations */
    T_CHECK(c->given[MGC_KEY_MODEL_HIDDEN]);
    T_CHECK(!c->given[MGC_KEY_MODEL_SEQ_LENGTH]);
    T_EQ_I64(c->loc[MGC_KEY_MODEL_HIDDEN].line, 3);
    T_EQ_I64(c->loc[MGC_KEY_MODEL_HIDDEN].col, 16);
    /* defaults from the schema */
    T_EQ_I64(c->model.vocab_divisor, 128);
    T_NEAR_REL(c->optimizer.beta2, 0.95, 0);
    T_EQ_I64(c->training.precision, MGC_PREC_BF16);
    T_EQ_I64(c->hardware.cuda_archs.n, 2);
    mgc_config_free(c);
    mgc_diags_free(&d);
}

static void test_errors(void) {
    mgc_diags d;
    mgc_config *c = load("model:\n"
                         "  hiden_size: 768\n"        /* 2:3 typo */
                         "  vocab_size: \"50257\"\n"  /* 3:15 quoted */
                         "  num_layers: -4\n"         /* 4:15 range */
                         "  normalization: rmsnrom\n" /* 5:18 enum typo */
                         "  norm_eps: .nan\n"         /* 6:13 non-finite */
                         "  tensor: 2\n"              /* 7:3 wrong section */
                         "  seq_length: 99999999999999999999999\n" /* 8:15 overflow */
                         "  tie_embeddings: 1\n"      /* 9:19 bool */
                         "paralel:\n"                 /* 10:1 section typo */
                         "  tensor: 2\n"
                         "training: 5\n"              /* 12:11 not a mapping */
                         "tensor_model_parallel_size: 2\n", /* 13:1 Megatron name */
                         &d);
    T_CHECK(has(&d, 2, 3, "did you mean 'model.hidden_size'"));
    T_CHECK(has(&d, 3, 15, "expected an integer"));
    T_CHECK(has(&d, 3, 15, "remove the quotes"));
    T_CHECK(has(&d, 4, 15, "out of range"));
    T_CHECK(has(&d, 5, 18, "did you mean 'rmsnorm'"));
    T_CHECK(has(&d, 6, 13, "out of range"));
    T_CHECK(has(&d, 7, 3, "parallel.tensor"));
    T_CHECK(has(&d, 8, 15, "out of range"));
    T_CHECK(has(&d, 9, 19, "true or false"));
    T_CHECK(has(&d, 10, 1, "did you mean 'parallel'"));
    T_CHECK(has(&d, 12, 11, "must be a mapping"));
    T_CHECK(has(&d, 13, 1, "parallel.tensor"));
    T_EQ_I64(d.errors, 11); /* line 11 sits under the unknown section */
    mgc_config_free(c);
    mgc_diags_free(&d);
}

static void test_yaml_errors(void) {
    static const struct {
        const char *text, *needle;
        int line;
    } cases[] = {
        {"model:\n  a: 1\n b: 2\n", "invalid YAML", 3},
        {"model:\n\thidden_size: 8\n", "invalid YAML", 2},
        {"model:\n  hidden_size: 8\n  hidden_size: 9\n", "duplicate key", 3},
        {"model: &m\n  hidden_size: 8\nmoe: *m\n", "anchors", 1},
        {"model: {hidden_size: 8}\n---\nmodel: {}\n", "more than one YAML document", 2},
        {"[1, 2]\n", "expected a mapping at the top level", 1},
        {"model:\n  ? [a]\n  : 1\n", "mapping keys must be names", 2},
        {"model: {name: \"a\\0b\"}\n", "NUL", 1},
        {"\x01\x02\xff\xfe junk", "invalid YAML", 1},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        mgc_diags d;
        mgc_config *c = load(cases[i].text, &d);
        T_CHECK(d.errors >= 1);
        T_CHECK(has(&d, cases[i].line, -1, cases[i].needle));
        mgc_config_free(c);
        mgc_diags_free(&d);
    }
    /* deep nesting stops at the limit instead of recursing */
    size_t n = 100000;
    char *deep = malloc(2 * n + 16);
    memcpy(deep, "model: ", 7);
    memset(deep + 7, '[', n);
    memset(deep + 7 + n, ']', n);
    deep[7 + 2 * n] = 0;
    mgc_diags d;
    mgc_config *c = load(deep, &d);
    T_CHECK(has(&d, 1, -1, "nesting deeper"));
    mgc_config_free(c);
    mgc_diags_free(&d);
    free(deep);
}

static void test_overrides(void) {
    mgc_diags d;
    mgc_config *c = load("model:\n  hidden_size: 64\nparallel:\n  tensor: 1\n", &d);
    T_EQ_I64(mgc_config_set(c, "parallel.tensor=4", "--set #1", &d), 0);
    T_EQ_I64(c->parallel.tensor, 4);
    T_STREQ(c->loc[MGC_KEY_PAR_TP].file, "--set #1");
    T_EQ_I64(c->loc[MGC_KEY_PAR_TP].col, 17);
    T_EQ_I64(mgc_config_set(c, "moe.layers=[0, 2]", "--set #2", &d), 0);
    T_EQ_I64(c->moe.layers.n, 2);
    T_EQ_I64(mgc_config_set(c, "moe={num_experts: 4, top_k: 1}", "--set #3", &d), 0);
    T_EQ_I64(c->moe.num_experts, 4);
    T_EQ_I64(c->moe.top_k, 1);
    T_EQ_I64(mgc_config_set(c, "model.normalization=rmsnorm", "--set #4", &d), 0);
    T_EQ_I64(c->model.normalization, MGC_NORM_RMSNORM);
    T_EQ_I64(d.errors, 0);
    /* `key=` resets to the default */
    T_EQ_I64(mgc_config_set(c, "parallel.tensor=", "--set #5", &d), 0);
    T_EQ_I64(c->parallel.tensor, 1);
    T_CHECK(!c->given[MGC_KEY_PAR_TP]);
    /* errors name the override and the column */
    T_EQ_I64(mgc_config_set(c, "parallel.tensr=2", "--set #6", &d), 1);
    T_CHECK(has(&d, 1, 1, "did you mean 'parallel.tensor'"));
    T_EQ_I64(mgc_config_set(c, "parallel.tensor=two", "--set #7", &d), 1);
    T_CHECK(has(&d, 1, 17, "expected an integer"));
    T_EQ_I64(mgc_config_set(c, "no-equals", "--set #8", &d), 1);
    T_CHECK(has(&d, 1, 1, "expected section.key=value"));
    mgc_config_free(c);
    mgc_diags_free(&d);
}

static void test_suggest(void) {
    char out[128];
    T_CHECK(mgc_key_suggest("model", "num_heads", out, sizeof out));
    T_STREQ(out, "model.num_attention_heads");
    T_CHECK(mgc_key_suggest("parallel", "sequence_paralel", out, sizeof out));
    T_STREQ(out, "parallel.sequence_parallel");
    T_CHECK(mgc_key_suggest(NULL, "modle", out, sizeof out));
    T_STREQ(out, "model");
    T_CHECK(!mgc_key_suggest("model", "completely_unrelated_words", out, sizeof out));
    T_EQ_I64(mgc_edit_distance("kitten", "sitting", 10), 3);
    T_EQ_I64(mgc_edit_distance("ab", "ba", 10), 1);
    /* every schema path is unique and found */
    for (int k = 0; k < MGC_KEY__COUNT; k++) T_EQ_I64(mgc_key_find(mgc_keys[k].path), k);
}

/* examples/full.yaml shows every key of the schema once. */
static void test_full_example(void) {
    mgc_diags d;
    mgc_diags_init(&d);
    mgc_config *c = mgc_config_new();
    mgc_config_load_file(c, MGC_SOURCE_DIR "/examples/full.yaml", &d);
    T_EQ_I64(d.errors, 0);
    for (int k = 0; k < MGC_KEY__COUNT; k++) {
        if (k == MGC_KEY_MOE_LAYERS) continue; /* alternative to layer_freq; shown commented out */
        if (k == MGC_KEY_MODEL_WINDOW_LAYERS) continue; /* needs a window; shown commented out */
        if (!c->given[k]) fprintf(stderr, "examples/full.yaml does not set %s\n", mgc_keys[k].path);
        T_CHECK(c->given[k]);
    }
    mgc_config_free(c);
    mgc_diags_free(&d);
}

int main(void) {
    test_full_example();
    test_values();
    test_errors();
    test_yaml_errors();
    test_overrides();
    test_suggest();
    return t_summary("test_config");
}
