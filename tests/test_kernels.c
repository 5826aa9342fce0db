/* test_kernels.c - every CUDA kernel of every model compiles through NVRTC for
 * sm_80 and sm_90 with no local-memory spill and no stack frame (ptxas's
 * report), and the plan carries the cubins through its file format.  Each model
 * in its own precision and in the 16-bit ones it does not use: fp16 for the bf16
 * models, bf16 and fp16 for the fp32 ones (the tiny models).
 * Needs no GPU; exits 77 (skipped) where NVRTC is not installed.  The on-disk
 * kernel cache makes reruns fast (MGC_KERNEL_CACHE=off compiles everything). */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "compile.h"
#include "config.h"
#include "diag.h"
#include "ir.h"
#include "kernels.h"
#include "nvrtc.h"
#include "plan.h"
#include "testlib.h"
#include "testplan.h"

static int by_name(const void *a, const void *b) {
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* precision: NULL for the file's, else "bf16" / "fp16"; extra: NULL or one more setting;
 * returns the file's precision (mgc_precision; -1 when it does not load) */
static int check_file(const char *path, const char *precision, const char *extra) {
    mgc_diags d;
    mgc_diags_init(&d);
    mgc_config *c = mgc_config_new();
    mgc_config_load_file(c, path, &d);
    char set[64];
    if (precision && d.errors == 0) {
        snprintf(set, sizeof set, "training.precision=%s", precision);
        mgc_config_set(c, set, "--set", &d);
    }
    /* extra: settings separated by spaces */
    for (const char *x = extra; x && *x && d.errors == 0;) {
        size_t len = strcspn(x, " ");
        snprintf(set, sizeof set, "%.*s", (int)len, x);
        mgc_config_set(c, set, "--set", &d);
        x += len + (x[len] == ' ');
    }
    if (d.errors == 0) mgc_config_finalize(c, &d);
    int own = d.errors == 0 ? c->training.precision : -1;
    mgc_graph *g = d.errors == 0 ? mgc_ir_build(c, &d) : NULL;
    mgc_plan *p = g ? mgc_compile(c, g, &d) : NULL;
    T_CHECK(p != NULL);
    if (!p) mgc_diags_print(&d, stderr);
    if (p) {
        int archs[2] = {80, 90};
        mgc_kernel_stats st;
        char err[4096];
        int rc = mgc_compile_kernels(p, archs, 2, 4, &st, err, sizeof err);
        T_EQ_I64(rc, 0);
        if (rc) fprintf(stderr, "%s: %s\n", path, err);
        T_EQ_I64(st.max_spill_bytes, 0);
        T_EQ_I64(st.max_stack_bytes, 0);
        if (st.max_spill_bytes)
            fprintf(stderr, "%s (%s): %s spills\n", path, precision ? precision : "its precision",
                    st.worst_spill);
        T_EQ_I64(p->n_kernels, (int64_t)st.specs * 2);
        /* the cubins survive the file format */
        uint8_t *buf = NULL;
        size_t len = 0;
        mgc_plan *q = NULL;
        T_EQ_I64(mgc_plan_encode(p, &buf, &len, err, sizeof err), MGC_PLAN_OK);
        T_EQ_I64(mgc_plan_decode(buf, len, path, &q, err, sizeof err), MGC_PLAN_OK);
        if (q) {
            T_EQ_I64(q->n_kernels, p->n_kernels);
            T_CHECK(q->kbin_len == p->kbin_len && !memcmp(q->kbin, p->kbin, p->kbin_len));
        }
        printf("%-28s %-5s%s%s %3d kernel specs x 2 archs: %d compiled, %d cached, %.1f s, %.2f MiB, "
               "max %ld registers, %ld spill bytes\n",
               path, precision ? precision : "", extra ? " " : "", extra ? extra : "", st.specs, st.compiled, st.cached, st.seconds, st.cubin_bytes / 1048576.0,
               st.max_registers, st.max_spill_bytes);
        mgc_plan_free(q);
        free(buf);
    }
    mgc_plan_free(p);
    mgc_ir_free(g);
    mgc_config_free(c);
    mgc_diags_free(&d);
    return own;
}

/* A plan that evaluates (training.eval_interval) carries the kernels of its dropout ops
 * without dropout too: the attention's and add-norm's DROP0 variants, and no other kernel
 * more. */
static mgc_plan *compile_drop(int eval) {
    static const char *const sets[] = {"training.precision=bf16", "model.hidden_dropout=0.1",
                                       "model.attention_dropout=0.1", NULL};
    static const char *const ev[] = {"training.eval_interval=10", NULL};
    mgc_plan *p = t_compile("examples/tiny-gpt.yaml", (const char *const *const[]){sets, eval ? ev : NULL}, 2);
    if (p) {
        int archs[1] = {90};
        mgc_kernel_stats st;
        char err[4096];
        T_EQ_I64(mgc_compile_kernels(p, archs, 1, 4, &st, err, sizeof err), 0);
    }
    return p;
}

static int has_kernel(const mgc_plan *p, const char *a, const char *b) {
    for (int64_t i = 0; i < p->n_kernels; i++) {
        const char *nm = mgc_plan_strat(p, p->kernels[i].name);
        if (nm && strstr(nm, a) && strstr(nm, b)) return 1;
    }
    return 0;
}

static void check_eval_kernels(void) {
    mgc_plan *p = compile_drop(0), *q = compile_drop(1);
    T_CHECK(p && q);
    if (p && q) {
        T_CHECK(has_kernel(p, "attention_fwd", "DROP1") && !has_kernel(p, "attention_fwd", "DROP0"));
        T_CHECK(has_kernel(q, "attention_fwd", "DROP1") && has_kernel(q, "attention_fwd", "DROP0"));
        T_CHECK(has_kernel(q, "add_layernorm_fwd", "DROP0") && !has_kernel(p, "add_layernorm_fwd", "DROP0"));
        for (int64_t i = 0; i < p->n_kernels; i++) /* every kernel of the plan that trains only */
            T_CHECK(has_kernel(q, mgc_plan_strat(p, p->kernels[i].name), ""));
        printf("evaluation kernels: %lld cubins with training.eval_interval, %lld without (the "
               "dropout-free variants of the dropout ops' kernels)\n",
               (long long)q->n_kernels, (long long)p->n_kernels);
    }
    mgc_plan_free(p);
    mgc_plan_free(q);
}

/* A plan at head dim 128 in 16 bits carries the attention forward's and dK/dV kernel's
 * one-buffer twins beside them (kspec.h mgc_kspec_twin), which the launcher takes on GPUs with
 * 100 KB of shared memory a multiprocessor; at head dim 64 there are none. */
static void check_twins(void) {
    static const char *const d128[] = {"training.precision=bf16", "model.hidden_size=256",
                                       "model.num_attention_heads=2", NULL};
    static const char *const d64[] = {"training.precision=bf16", "model.hidden_size=128",
                                      "model.num_attention_heads=2", NULL};
    for (int k = 0; k < 2; k++) {
        mgc_plan *p =
            t_compile("models/tiny-llama.yaml", (const char *const *const[]){k ? d64 : d128}, 1);
        T_CHECK(p != NULL);
        if (!p) continue;
        int archs[1] = {90};
        mgc_kernel_stats st;
        char err[4096];
        T_EQ_I64(mgc_compile_kernels(p, archs, 1, 4, &st, err, sizeof err), 0);
        int fwd = has_kernel(p, "attention_fwd", "_FKVB1");
        int dkv = has_kernel(p, "attention_bwd_dkv", "_KVB1");
        T_CHECK(k ? !fwd && !dkv : fwd && dkv);
        printf("twins at head dim %d: %s\n", k ? 64 : 128,
               fwd && dkv ? "forward and dK/dV" : "none");
        mgc_plan_free(p);
    }
}

/* kspec.c's embedded templates (kernels/ *.cuh) */
typedef struct mgc_kernel_file {
    const char *name;
    const char *text;
} mgc_kernel_file;
extern const mgc_kernel_file mgc_kernel_files[];

/* Every kernel entry calls mgc_pdl_begin() as its first statement (kernels/mgc_common.cuh):
 * launched under MGC_PDL it may start while the previous kernel of the stream still runs, and
 * must not touch global memory before the wait.  Entries: "__global__" up to the next
 * "MGC_ENTRY_NAME(", its parameters, then the body.  Returns the entries checked. */
static int check_pdl_first(const char *file, const char *text) {
    int n = 0;
    for (const char *g = strstr(text, "__global__"); g; g = strstr(g + 1, "__global__")) {
        const char *e = strstr(g, "MGC_ENTRY_NAME(");
        if (!e) break;
        const char *q = e + strlen("MGC_ENTRY_NAME(");
        for (int depth = 1; *q && depth; q++)
            depth += *q == '(' ? 1 : *q == ')' ? -1 : 0;
        while (*q == ' ' || *q == '\n')
            q++;
        int ok = *q == '{';
        if (ok) {
            q++;
            while (*q == ' ' || *q == '\n')
                q++;
            ok = !strncmp(q, "mgc_pdl_begin();", 16);
        }
        int line = 1;
        for (const char *c = text; c < e; c++)
            line += *c == '\n';
        if (!ok) fprintf(stderr, "%s:%d: the kernel entry does not begin with mgc_pdl_begin();\n", file, line);
        T_CHECK(ok);
        n++;
        g = e;
    }
    return n;
}

static void check_pdl(void) {
    int files = 0, entries = 0;
    for (int i = 0; mgc_kernel_files[i].name; i++, files++)
        entries += check_pdl_first(mgc_kernel_files[i].name, mgc_kernel_files[i].text);
    printf("%d kernel entries in %d templates begin with mgc_pdl_begin()\n", entries, files);
    T_CHECK(entries >= 50); /* 52 when this was written: the parse finds them */
}

/* Model widths that no model file has, in each precision.  The row kernels' shapes (norm.cuh's
 * threads T and row slots R, the embedding's T and R) and the registers their blocks leave a
 * thread change with the width, and spills appeared between the models' widths: GPT-2 355M's
 * H 1024 norm backward with the bias column sums (CS) in bf16 (68 bytes), fp32's embedding
 * forward at H 4096 (180), fp16's at H 5120, fp16's norm backward at H 7680 (16); and the
 * embedding + RMSNorm forward of Llama 3 405B's H 16384 in bf16 (144: models/llama3-405b.yaml
 * covers it).  GPT-2 (LayerNorm, biases: CS without dropout, learned positions) and tiny
 * LLaMA (RMSNorm, rotary) at heads of 64. */
static void check_widths(void) {
    static const struct {
        const char *file, *prec;
        int h, nodrop;
    } w[] = {
        {"models/gpt2-124m.yaml", "bf16", 256, 1}, {"models/gpt2-124m.yaml", "bf16", 512, 1},
        {"models/gpt2-124m.yaml", "bf16", 1024, 1}, {"models/gpt2-124m.yaml", "bf16", 2048, 1},
        {"models/gpt2-124m.yaml", "bf16", 4096, 1}, {"models/gpt2-124m.yaml", "bf16", 7680, 1},
        {"models/gpt2-124m.yaml", "bf16", 8192, 1}, {"models/gpt2-124m.yaml", "bf16", 12288, 1},
        {"models/gpt2-124m.yaml", "fp16", 1024, 1}, {"models/gpt2-124m.yaml", "fp16", 8192, 1},
        {"models/gpt2-124m.yaml", "fp16", 5120, 0}, {"models/gpt2-124m.yaml", "fp16", 7680, 0},
        {"models/gpt2-124m.yaml", "fp32", 768, 1}, {"models/gpt2-124m.yaml", "fp32", 1024, 1},
        {"models/gpt2-124m.yaml", "fp32", 3072, 1}, {"models/gpt2-124m.yaml", "fp32", 6144, 1},
        {"models/gpt2-124m.yaml", "fp32", 8192, 1}, {"models/gpt2-124m.yaml", "fp32", 4096, 0},
        {"models/tiny-llama.yaml", "fp16", 12288, 0},
        /* with dropout at the widest column sums: the norm backward with the dropout's
         * backward and the sums of dbr (DROP1 CS1) */
        {"models/gpt2-124m.yaml", "bf16", 7168, 0}, {"models/gpt2-124m.yaml", "fp32", 5120, 0},
    };
    for (size_t i = 0; i < sizeof w / sizeof w[0]; i++) {
        char extra[512];
        snprintf(extra, sizeof extra,
                 "model.hidden_size=%d model.num_attention_heads=%d model.head_dim=64 "
                 "model.ffn_hidden_size=%d parallel.tensor=1%s%s",
                 w[i].h, w[i].h / 64, 4 * w[i].h,
                 strstr(w[i].file, "llama") ? " model.num_query_groups=1" : "",
                 w[i].nodrop ? " model.hidden_dropout=0 model.attention_dropout=0" : "");
        check_file(w[i].file, w[i].prec, extra);
    }
}

/* The norm backward sums the bias gradient's columns (MGC_POF_COLSUM) only where its kernel
 * leaves the registers for them (mgc_kspec_norm_colsum_fits): GPT-2 without dropout has 24
 * such norms (two a layer) at H 768 in bf16 and fp32 and at H 7168 in bf16, none at H 7680 in
 * bf16 (44 bytes spilled at blocks of 960), at H 8192 in fp32 (44 at 1024) nor at H 12288
 * (several vectors a thread). */
static int colsum_norms(const char *prec, int h) {
    char s0[64], s1[64], s2[64], s3[64], s4[64];
    snprintf(s0, sizeof s0, "training.precision=%s", prec);
    snprintf(s1, sizeof s1, "model.hidden_size=%d", h);
    snprintf(s2, sizeof s2, "model.num_attention_heads=%d", h / 64);
    snprintf(s3, sizeof s3, "model.ffn_hidden_size=%d", 4 * h);
    snprintf(s4, sizeof s4, "parallel.tensor=1");
    const char *const sets[] = {s0, s1, s2, s3, s4, "model.head_dim=64", "model.hidden_dropout=0",
                                "model.attention_dropout=0", NULL};
    mgc_plan *p = t_compile("models/gpt2-124m.yaml", (const char *const *const[]){sets}, 1);
    int n = -1;
    if (p) {
        n = 0;
        for (int64_t s = 0; s < p->n_stages; s++)
            for (int64_t c = 0; c < p->stages[s].n_chunks; c++) {
                const mgc_plan_chunk *ch = &p->stages[s].chunks[c];
                for (int64_t i = 0; i < ch->n_bwd; i++)
                    n += ch->bwd[i].kind == MGC_POP_NORM_BWD && (ch->bwd[i].flags & MGC_POF_COLSUM);
            }
    }
    mgc_plan_free(p);
    return n;
}

static void check_colsum_widths(void) {
    int a = colsum_norms("bf16", 768), b = colsum_norms("fp32", 768);
    int c = colsum_norms("bf16", 7168), d = colsum_norms("fp32", 8192);
    int e = colsum_norms("bf16", 12288), f = colsum_norms("bf16", 7680);
    printf("norm backwards with bias column sums: bf16 H 768 %d, fp32 H 768 %d, bf16 H 7168 %d, "
           "bf16 H 7680 %d, fp32 H 8192 %d, bf16 H 12288 %d\n", a, b, c, f, d, e);
    T_CHECK(a > 0 && a == b && a == c);
    T_EQ_I64(d, 0);
    T_EQ_I64(e, 0);
    T_EQ_I64(f, 0);
}

int main(void) {
    check_pdl();
    check_colsum_widths();
    if (!mgc_nvrtc_available()) {
        printf("test_kernels: NVRTC not found: skipped (after the templates' checks)\n");
        return t_failed ? 1 : 77;
    }
    setvbuf(stdout, NULL, _IONBF, 0);
    check_eval_kernels();
    check_twins();
    const char *dirs[] = {"models", "examples"};
    for (int k = 0; k < 2; k++) {
        DIR *dir = opendir(dirs[k]);
        T_CHECK(dir != NULL);
        if (!dir) continue;
        char *names[256];
        int n = 0;
        struct dirent *e;
        while ((e = readdir(dir)) && n < 256) {
            size_t l = strlen(e->d_name);
            if (l > 5 && !strcmp(e->d_name + l - 5, ".yaml")) {
                names[n] = malloc(strlen(dirs[k]) + l + 2);
                sprintf(names[n], "%s/%s", dirs[k], e->d_name);
                n++;
            }
        }
        closedir(dir);
        qsort(names, (size_t)n, sizeof *names, by_name);
        for (int i = 0; i < n; i++) {
            if (strstr(names[i], "full.yaml") == NULL) {
                int own = check_file(names[i], NULL, NULL);
                if (own == MGC_PREC_FP32) check_file(names[i], "bf16", NULL);
                if (own == MGC_PREC_FP32 || own == MGC_PREC_BF16) check_file(names[i], "fp16", NULL);
            }
            free(names[i]);
        }
    }
    /* rows of a width that is no multiple of 8 (the norms' and the embedding's element-by-element
     * paths), in each 16-bit precision: test_cuda's norm check at H 100, whose bf16 norm
     * backward spilled at two blocks of 512 threads */
    static const char *const h100 = "model.hidden_size=100 model.head_dim=16 "
                                    "model.num_attention_heads=4 model.ffn_hidden_size=200";
    check_file("examples/tiny-gpt.yaml", "bf16", h100);
    check_file("examples/tiny-gpt.yaml", "fp16", h100);
    check_file("models/tiny-llama.yaml", "bf16", h100);
    check_widths();
    /* the benchmark's GPT-2 without dropout: its norm backwards sum the residual branches'
     * bias gradients too (CS, compiler/fusion.c), at H 768 and 1600 */
    static const char *const nodrop = "model.hidden_dropout=0 model.attention_dropout=0";
    check_file("models/gpt2-124m.yaml", "bf16", nodrop);
    check_file("models/gpt2-1.5b.yaml", "bf16", nodrop);
    /* 16-bit logits (training.logits_dtype compute: the cross-entropy kernels' LT), in each
     * 16-bit precision: the loss chunks' fused pass, and at tp 2 the vocabulary-parallel
     * phases */
    check_file("models/gpt2-124m.yaml", "bf16", "training.logits_dtype=compute");
    check_file("models/gpt2-124m.yaml", "fp16", "training.logits_dtype=compute parallel.tensor=2");
    /* the attention kernels with documents (DOCS: data.reset_attention_mask), which no model
     * file uses: SIMT at head dim 16, tensor cores at 16, 64 and 128 */
    const char *docs = "data.reset_attention_mask=true";
    check_file("models/tiny-llama.yaml", NULL, docs);
    check_file("models/tiny-llama.yaml", "bf16", docs);
    check_file("models/gpt2-124m.yaml", NULL, docs);
    check_file("models/llama2-7b.yaml", NULL, docs);
    /* and with a sliding window (WIN: model.window_size), which no model file uses either */
    check_file("models/tiny-llama.yaml", NULL, "model.window_size=40");
    check_file("models/tiny-llama.yaml", "bf16", "model.window_size=40");
    check_file("models/gpt2-124m.yaml", NULL, "model.window_size=256");
    check_file("models/llama2-7b.yaml", NULL, "model.window_size=1024");
    /* head dims that are no power of two (attention.cuh: 48 on the tiles of 32 and 64, 80 to
     * 112 on those of 128), at the widest of each class, with attention dropout (the Philox
     * code's registers), in the three precisions; and odd multiples of 8, computed over ATT_W
     * (D rounded up to 16: the guards of the last 8 columns), 8, 56 and 120 */
    static const char *const prec3[] = {"fp32", "bf16", "fp16"};
    for (int i = 0; i < 3; i++) {
        check_file("models/tiny-llama.yaml", prec3[i],
                   "model.num_attention_heads=2 model.num_query_groups=1 model.head_dim=48 "
                   "model.hidden_size=96 model.attention_dropout=0.1");
        check_file("models/tiny-llama.yaml", prec3[i],
                   "model.num_attention_heads=2 model.num_query_groups=1 model.head_dim=112 "
                   "model.hidden_size=224 model.attention_dropout=0.1");
        static const char *const odd8[] = {
            "model.num_attention_heads=4 model.num_query_groups=2 model.head_dim=8 "
            "model.hidden_size=32 model.attention_dropout=0.1",
            "model.num_attention_heads=2 model.num_query_groups=1 model.head_dim=56 "
            "model.hidden_size=112 model.attention_dropout=0.1",
            "model.num_attention_heads=2 model.num_query_groups=1 model.head_dim=120 "
            "model.hidden_size=240 model.attention_dropout=0.1"};
        for (int j = 0; j < 3; j++)
            check_file("models/tiny-llama.yaml", prec3[i], odd8[j]);
    }
    /* wide head dims (past 128, attention.cuh ATT_DYN: the backward's tiles in dynamic shared
     * memory, the 16-bit dQ kernel's Q and dO from it, the dK/dV kernel's two column slices),
     * with attention dropout, in the three precisions: 136 (ATT_W 144: slices of 80 and 64
     * columns) and 256, whose forward holds 255 registers; and 256 with documents, with a
     * window, and over cp2 (the positions computed) with dropout */
    for (int i = 0; i < 3; i++) {
        check_file("models/tiny-llama.yaml", prec3[i],
                   "model.num_attention_heads=2 model.num_query_groups=1 model.head_dim=136 "
                   "model.hidden_size=128 model.attention_dropout=0.1");
        check_file("models/tiny-llama.yaml", prec3[i],
                   "model.num_attention_heads=2 model.num_query_groups=1 model.head_dim=256 "
                   "model.hidden_size=256 model.attention_dropout=0.1");
    }
    check_file("models/tiny-llama.yaml", "bf16",
               "model.num_attention_heads=2 model.head_dim=256 model.hidden_size=256 "
               "data.reset_attention_mask=true");
    check_file("models/tiny-llama.yaml", "bf16",
               "model.num_attention_heads=2 model.head_dim=256 model.hidden_size=256 "
               "model.window_size=40");
    check_file("models/llama2-7b.yaml", "bf16",
               "parallel.world_size=2 parallel.context=2 parallel.tensor=1 parallel.pipeline=1 "
               "model.attention_dropout=0.1 model.num_attention_heads=16 model.num_query_groups=16 "
               "model.head_dim=256");
    /* context parallelism with attention dropout (ROWPOS 0 with DROP: the position arithmetic
     * and the Philox state together), which no model file's layout has: GPT-2's dropout 0.1
     * at cp2 spilled 24 bytes in dQ at D 64, LLaMA at D 128 8 (emu_sweep.py found it) */
    check_file("models/gpt2-124m.yaml", "bf16", "parallel.world_size=2 parallel.context=2");
    check_file("models/gpt2-124m.yaml", "fp16", "parallel.world_size=2 parallel.context=2");
    check_file("models/llama2-7b.yaml", "bf16",
               "parallel.world_size=2 parallel.context=2 parallel.tensor=1 parallel.pipeline=1 "
               "model.attention_dropout=0.1");
    check_file("models/llama2-7b.yaml", "fp16",
               "parallel.world_size=2 parallel.context=2 parallel.tensor=1 parallel.pipeline=1 "
               "model.attention_dropout=0.1");
    check_file("models/llama2-7b.yaml", "bf16",
               "parallel.world_size=2 parallel.context=2 parallel.tensor=1 parallel.pipeline=1 "
               "model.attention_dropout=0.1 model.num_attention_heads=32 model.head_dim=120");
    /* hidden dropout on rows that are no whole 16-byte vectors (H % 8 != 0): the fused add +
     * norm's element path with the Philox words spilled 4 bytes at H 260 on sm_90 in bf16
     * (emu_sweep.py found it; now one block a multiprocessor asked for) */
    for (int i = 0; i < 3; i++)
        check_file("examples/tiny-gpt.yaml", prec3[i],
                   "model.hidden_size=260 model.num_attention_heads=4 model.head_dim=16 "
                   "model.hidden_dropout=0.1");
    /* a fractional top-k scaling factor on the router (its fattr[2], which the attention specs
     * once read as a window and refused) */
    check_file("models/qwen3-30b-a3b.yaml", NULL, "moe.router_topk_scaling_factor=2.5");
    /* group-limited routing (moe_route_fwd's G and GK: 8 groups of 16 experts, 4 used) with
     * sigmoid scores, as DeepSeek-V3 routes */
    check_file("models/qwen3-30b-a3b.yaml", NULL,
               "moe.router_num_groups=8 moe.router_group_topk=4 moe.router_score=sigmoid");
    /* and the rest of DeepSeek-V3's routing: the expert bias (the route kernel's bias input)
     * and the sequence-wise aux loss (moe_col_counts; its aux and backward kernels' rows) */
    check_file("models/qwen3-30b-a3b.yaml", NULL,
               "moe.router_num_groups=8 moe.router_group_topk=4 moe.router_score=sigmoid "
               "moe.expert_bias_update_rate=1e-3 moe.aux_loss_scope=sequence "
               "training.micro_batch_size=2 training.global_batch_size=256");
    return t_summary("test_kernels");
}
