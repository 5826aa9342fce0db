/* test_cost.c - hardware profiles, the cost model and calibration.
 *
 * References are independent of cost.c: op times from the closed forms of
 * docs/cost-model.md computed here by hand on hand-built plans, a one-stage
 * step as the plain sum of its instructions, pipeline behaviour (more
 * microbatches or interleaving shrink the bubble), and calibration recovering
 * efficiency factors from times synthesised with a known profile. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "calibrate.h"
#include "compile.h"
#include "config.h"
#include "cost.h"
#include "facts.h"
#include "hwprofile.h"
#include "ir.h"
#include "testlib.h"

static mgc_hw load_hw(const char *name) {
    mgc_hw hw;
    mgc_diags d;
    mgc_diags_init(&d);
    int rc = mgc_hw_load(name, &hw, &d);
    T_CHECK(rc == 0);
    if (rc) mgc_diags_print(&d, stderr);
    mgc_diags_free(&d);
    return hw;
}

/* ---- profiles ----------------------------------------------------------------------- */

static int parse_errors(const char *text, const char *want) {
    mgc_hw hw;
    mgc_diags d;
    mgc_diags_init(&d);
    int rc = mgc_hw_parse("bad.yaml", text, strlen(text), &hw, &d);
    int found = 0;
    for (int i = 0; i < d.n; i++)
        if (strstr(d.v[i].msg, want)) found = 1;
    if (!found) {
        fprintf(stderr, "expected an error containing '%s'; got:\n", want);
        mgc_diags_print(&d, stderr);
    }
    int n = d.errors;
    mgc_diags_free(&d);
    return rc != 0 && found ? n : 0;
}

static void test_profiles(void) {
    char names[16][64];
    int n = mgc_hw_builtin_names(names, 16);
    T_CHECK(n >= 3);
    int h100 = 0;
    for (int i = 0; i < n && i < 16; i++) {
        mgc_hw hw = load_hw(names[i]);
        T_STREQ(hw.name, names[i]);
        T_CHECK(hw.peak_flops[1] > 1e14 && hw.memory_bytes > 1e10 && hw.eff.gemm > 0 && hw.eff.gemm <= 1);
        h100 |= !strcmp(names[i], "h100-sxm");
        /* write -> parse gives the same numbers */
        char *buf = NULL;
        size_t len = 0;
        FILE *f = open_memstream(&buf, &len);
        T_CHECK(mgc_hw_write_yaml(&hw, "round trip\nline two", f) == 0);
        fclose(f);
        mgc_hw back;
        mgc_diags d;
        mgc_diags_init(&d);
        T_CHECK(mgc_hw_parse("rt.yaml", buf, len, &back, &d) == 0);
        mgc_diags_free(&d);
        T_STREQ(back.name, hw.name);
        T_STREQ(back.description, hw.description);
        for (int k = 0; k < 3; k++) T_NEAR_REL(back.peak_flops[k], hw.peak_flops[k], 1e-5);
        T_NEAR_REL(back.memory_bytes, hw.memory_bytes, 1e-5);
        T_NEAR_REL(back.net_latency_s, hw.net_latency_s, 1e-5);
        T_NEAR_REL(back.eff.attention_bwd, hw.eff.attention_bwd, 1e-5);
        T_EQ_I64(back.gpus_per_node, hw.gpus_per_node);
        free(buf);
    }
    T_CHECK(h100);
    mgc_hw hw = load_hw("h100-sxm");
    T_NEAR_REL(hw.peak_flops[1], 989.4e12, 1e-12);
    T_NEAR_REL(hw.nvlink_bw, 450e9, 1e-12);
    T_NEAR_REL(hw.launch_s, 3e-6, 1e-12);

    /* bad profiles: every problem reported, each with its key */
    char *good = NULL;
    size_t glen = 0;
    FILE *f = open_memstream(&good, &glen);
    mgc_hw_write_yaml(&hw, NULL, f);
    fclose(f);
    T_CHECK(parse_errors("name: x\n", "missing gpu.memory_gib") > 5);
    char buf[4096];
    snprintf(buf, sizeof buf, "%.*s", (int)glen, good);
    char *p = strstr(buf, "sms: 132");
    T_CHECK(p != NULL);
    if (p) memcpy(p, "sms: 1.5", 8);
    T_CHECK(parse_errors(buf, "whole number") == 1);
    snprintf(buf, sizeof buf, "%.*s", (int)glen, good);
    p = strstr(buf, "gemm: 0.75");
    if (p) memcpy(p, "gemm: 1.75", 10);
    T_CHECK(parse_errors(buf, "out of range") == 1);
    snprintf(buf, sizeof buf, "%.*sbogus: 1\n", (int)glen, good);
    T_CHECK(parse_errors(buf, "unknown key 'bogus'") == 1);
    snprintf(buf, sizeof buf, "%.*s", (int)glen, good);
    p = strstr(buf, "bf16");
    if (p) memcpy(p, "bf17", 4);
    T_CHECK(parse_errors(buf, "unknown precision") >= 1);
    T_CHECK(parse_errors("- a\n- b\n", "is a mapping") == 1);
    T_CHECK(parse_errors("name: Big GPU\n", "not a profile name") >= 1);

    /* lookup: unknown names list the built-ins; MGC_HARDWARE_PATH comes first */
    mgc_diags d;
    mgc_diags_init(&d);
    mgc_hw x;
    T_CHECK(mgc_hw_load("no-such-gpu", &x, &d) != 0);
    T_CHECK(d.n == 1 && strstr(d.v[0].hint, "h100-sxm") != NULL);
    mgc_diags_free(&d);
    char dir[] = "/tmp/mgc-test-hw-XXXXXX";
    T_CHECK(mkdtemp(dir) != NULL);
    char path[256];
    snprintf(path, sizeof path, "%s/h100-sxm.yaml", dir);
    f = fopen(path, "w");
    mgc_hw mine = hw;
    mine.power_w = 123;
    mgc_hw_write_yaml(&mine, NULL, f);
    fclose(f);
    setenv("MGC_HARDWARE_PATH", dir, 1);
    mgc_hw y = load_hw("h100-sxm");
    T_NEAR_REL(y.power_w, 123, 1e-12);
    T_CHECK(strstr(y.source, dir) != NULL);
    mgc_hw z = load_hw(path); /* a path works too */
    T_NEAR_REL(z.power_w, 123, 1e-12);
    unsetenv("MGC_HARDWARE_PATH");
    y = load_hw("h100-sxm");
    T_NEAR_REL(y.power_w, 700, 1e-12);
    remove(path);
    rmdir(dir);
    free(good);
}

/* ---- hand-built plans: one op against its closed form -------------------------------- */

static void kv(mgc_plan *p, const char *key, int64_t v) {
    p->config = realloc(p->config, (size_t)(p->n_config + 1) * sizeof *p->config);
    mgc_plan_kv *e = &p->config[p->n_config++];
    memset(e, 0, sizeof *e);
    e->key = mgc_plan_str(p, key);
    e->i = v;
}

/* A plan of one stage and one chunk holding `nt` tensors of the given byte
 * sizes and one forward op; the grid has tensor parallelism tp. */
static mgc_plan *one_op_plan(int64_t tp, int64_t gpn, mgc_plan_op op, const uint64_t *bytes, int nt) {
    mgc_plan *p = mgc_plan_new();
    p->grid = (mgc_grid){.world = tp, .tp = tp, .cp = 1, .dp = 1, .pp = 1, .vp = 1, .etp = 1, .ep = tp, .edp = 1};
    p->grid.ep = 1, p->grid.etp = tp;
    p->n_stages = 1;
    p->num_microbatches = 1;
    p->micro_batch_size = 1;
    p->seq_length = 1;
    kv(p, "training.precision", 1);
    kv(p, "hardware.gpus_per_node", gpn);
    p->stages = calloc(1, sizeof *p->stages);
    p->stages[0].n_chunks = 1;
    p->stages[0].chunks = calloc(1, sizeof(mgc_plan_chunk));
    mgc_plan_chunk *ch = &p->stages[0].chunks[0];
    ch->n_tensors = nt;
    ch->tensors = calloc((size_t)nt, sizeof *ch->tensors);
    for (int i = 0; i < nt; i++) {
        ch->tensors[i].bytes = bytes[i];
        ch->tensors[i].dtype = MGC_DT_BF16;
        ch->tensors[i].buffer = -1;
    }
    ch->n_fwd = 1;
    ch->fwd = calloc(1, sizeof *ch->fwd);
    ch->fwd[0] = op;
    return p;
}

static void test_ops(void) {
    mgc_hw hw = load_hw("h100-sxm");
    mgc_cost_options o;
    memset(&o, 0, sizeof o);
    o.hw = &hw;
    const double M = 8192, N = 8192, K = 8192;

    /* an 8192^3 GEMM runs at exactly the profile's gemm efficiency (compute-bound) */
    mgc_plan_op op;
    memset(&op, 0, sizeof op);
    op.kind = MGC_POP_LINEAR;
    op.n_in = 2, op.n_out = 1;
    op.in[0] = 0, op.in[1] = 1, op.out[0] = 2;
    op.iattr[0] = (int64_t)M, op.iattr[1] = (int64_t)N, op.iattr[2] = (int64_t)K;
    op.flops = (uint64_t)(2 * M * N * K);
    uint64_t gb[3] = {(uint64_t)(M * K * 2), (uint64_t)(N * K * 2), (uint64_t)(M * N * 2)};
    mgc_plan *p = one_op_plan(1, 8, op, gb, 3);
    mgc_cost_class cl;
    double t = mgc_cost_op(p, 0, &p->stages[0].chunks[0], &op, &o, &cl);
    T_CHECK(cl == MGC_COST_GEMM);
    T_NEAR_REL(t, 2 * M * N * K / (989.4e12 * hw.eff.gemm) + hw.launch_s, 1e-9);
    /* the dgrad and wgrad of a square GEMM cost the same */
    op.kind = MGC_POP_LINEAR_WGRAD;
    T_NEAR_REL(mgc_cost_op(p, 0, &p->stages[0].chunks[0], &op, &o, NULL), t, 1e-9);
    /* one wave of tiles fewer than the SMs: 132 SMs, 64 x 1 tiles of 128 -> 64/132 used */
    op.kind = MGC_POP_LINEAR;
    op.iattr[1] = 128;
    op.flops = (uint64_t)(2 * M * 128 * K);
    double t1 = mgc_cost_op(p, 0, &p->stages[0].chunks[0], &op, &o, NULL);
    double ref_shape = (4096.0 / (32 * 132)) * K / (K + 64); /* 8192^3: 4096 tiles in 32 waves */
    double shape = (64.0 / 132) * K / (K + 64);
    double eff = hw.eff.gemm * shape / ref_shape;
    double tc = 2 * M * 128 * K / (989.4e12 * eff);
    double tm = (M * K + K * 128 + M * 128) * 2 / hw.memory_bw;
    T_NEAR_REL(t1, (tc > tm ? tc : tm) + hw.launch_s, 1e-9);
    mgc_plan_free(p);

    /* a memory-bound op: bytes in + out at the memory efficiency */
    memset(&op, 0, sizeof op);
    op.kind = MGC_POP_NORM;
    op.n_in = 2, op.n_out = 1;
    op.in[0] = 0, op.in[1] = 1, op.out[0] = 2;
    uint64_t nb[3] = {100000000, 16384, 100000000};
    p = one_op_plan(1, 8, op, nb, 3);
    t = mgc_cost_op(p, 0, &p->stages[0].chunks[0], &op, &o, &cl);
    T_CHECK(cl == MGC_COST_MEMORY);
    T_NEAR_REL(t, 200016384.0 / (3350e9 * 0.87) + 3e-6, 1e-9);
    mgc_plan_free(p);

    /* a TP all-reduce of 64 MiB over 8 ranks: ring over NVLink inside a node */
    memset(&op, 0, sizeof op);
    op.kind = MGC_POP_ALL_REDUCE;
    op.group = MGC_GROUP_TP;
    op.n_in = 1, op.n_out = 1;
    op.in[0] = 0, op.out[0] = 1;
    double B = 64.0 * 1048576;
    uint64_t cb[2] = {(uint64_t)B, (uint64_t)B};
    p = one_op_plan(8, 8, op, cb, 2);
    t = mgc_cost_op(p, 0, &p->stages[0].chunks[0], &op, &o, &cl);
    T_CHECK(cl == MGC_COST_TP_COMM);
    double nv = 450e9 * 0.85;
    T_NEAR_REL(t, 2 * 7.0 / 8 * B / nv + 2 * 7 * 3e-6 + 3e-6, 1e-9);
    T_EQ_I64(mgc_cost_group_spans_nodes(p, 0, MGC_GROUP_TP, &o), 0);
    mgc_plan_free(p);
    /* the same over 4 nodes of 2 GPUs: the network, ring or tree whichever is faster */
    p = one_op_plan(8, 2, op, cb, 2);
    t = mgc_cost_op(p, 0, &p->stages[0].chunks[0], &op, &o, NULL);
    double net = 50e9 * 0.85;
    double ring = 2 * 7.0 / 8 * B / net + 2 * 7 * 8e-6;
    double tree = 2 * B / net + 2 * (2 * 8e-6 + 1 * 3e-6);
    T_NEAR_REL(t, (ring < tree ? ring : tree) + 3e-6, 1e-9);
    T_EQ_I64(mgc_cost_group_spans_nodes(p, 0, MGC_GROUP_TP, &o), 1);
    /* a small message on many nodes: the tree's log latency wins */
    mgc_plan_free(p);
    uint64_t small[2] = {4096, 4096};
    p = one_op_plan(64, 1, op, small, 2);
    t = mgc_cost_op(p, 0, &p->stages[0].chunks[0], &op, &o, NULL);
    ring = 2 * 63.0 / 64 * 4096 / net + 2 * 63 * 8e-6;
    tree = 2 * 4096 / net + 2 * (6 * 8e-6);
    T_CHECK(tree < ring);
    T_NEAR_REL(t, tree + 3e-6, 1e-9);
    mgc_plan_free(p);
}

/* ---- compiled plans ------------------------------------------------------------------- */

static mgc_plan *compile_with(const char *path, const char *const *sets) {
    mgc_diags d;
    mgc_diags_init(&d);
    mgc_config *c = mgc_config_new();
    mgc_config_load_file(c, path, &d);
    for (int i = 0; sets && sets[i]; i++) mgc_config_set(c, sets[i], "--set", &d);
    if (d.errors == 0) mgc_config_finalize(c, &d);
    mgc_graph *g = d.errors == 0 ? mgc_ir_build(c, &d) : NULL;
    mgc_facts f;
    mgc_plan *p = NULL;
    if (g && mgc_facts_compute(c, g, &f, &d) == 0) {
        p = mgc_compile(c, g, &d);
        if (p) p->model_flops_per_iter = f.flops.model_per_iteration;
    }
    T_CHECK(p != NULL);
    if (!p) mgc_diags_print(&d, stderr);
    mgc_ir_free(g);
    mgc_config_free(c);
    mgc_diags_free(&d);
    return p;
}

static mgc_cost_report predict(const mgc_plan *p, const mgc_hw *hw, int no_overlap) {
    mgc_cost_options o;
    memset(&o, 0, sizeof o);
    o.hw = hw;
    o.no_grad_overlap = no_overlap;
    mgc_cost_report r;
    char err[512];
    int rc = mgc_cost_plan(p, &o, &r, err, sizeof err);
    T_CHECK(rc == 0);
    if (rc) fprintf(stderr, "mgc_cost_plan: %s\n", err);
    return r;
}

static const char *const GPT = "models/gpt2-124m.yaml";

/* A head dim that is an odd multiple of 8 is priced at the next multiple of 16, the width the
 * kernels compute over (attention.cuh ATT_W): GPT-2 124M's 12 heads at 40 and at 48 take the
 * same attention time (compute-bound), where their FLOPs differ by 40/48. */
static void test_padded_head_dim(void) {
    mgc_hw hw = load_hw("h100-sxm");
    const char *d40[] = {"parallel.world_size=1", "training.global_batch_size=4",
                         "training.micro_batch_size=4", "model.head_dim=40", NULL};
    const char *d48[] = {"parallel.world_size=1", "training.global_batch_size=4",
                         "training.micro_batch_size=4", "model.head_dim=48", NULL};
    mgc_plan *p40 = compile_with(GPT, d40), *p48 = compile_with(GPT, d48);
    if (p40 && p48) {
        mgc_cost_report a = predict(p40, &hw, 0), b = predict(p48, &hw, 0);
        T_CHECK(a.by_class_s[MGC_COST_ATTENTION] > 0);
        T_NEAR_REL(a.by_class_s[MGC_COST_ATTENTION], b.by_class_s[MGC_COST_ATTENTION], 1e-9);
    }
    mgc_plan_free(p40);
    mgc_plan_free(p48);
}

/* The seconds of chunk 0's ops of one kind (forward and backward programs), less a launch each */
static double kind_s(const mgc_plan *p, const mgc_hw *hw, mgc_plan_op_kind kind) {
    mgc_cost_options o;
    memset(&o, 0, sizeof o);
    o.hw = hw;
    const mgc_plan_chunk *ch = &p->stages[0].chunks[0];
    double t = 0;
    for (int pass = 0; pass < 2; pass++)
        for (int64_t i = 0; i < (pass ? ch->n_bwd : ch->n_fwd); i++) {
            const mgc_plan_op *op = pass ? &ch->bwd[i] : &ch->fwd[i];
            if (op->kind == kind) t += mgc_cost_op(p, 0, ch, op, &o, NULL) - hw->launch_s;
        }
    return t;
}

/* Past a head dim of 128 the 16-bit dK/dV kernel computes dK and dV in two column slices, each
 * with all of S and dP: its backward is priced at 9 tile products for 7 (kspec.h
 * mgc_kspec_att_dkv_slices).  GPT-2 124M's compute-bound attention at head dim 256 against 128:
 * the forward twice the time, the bf16 backward 2 x 9/7, the fp32 one (no slices) twice. */
static void test_wide_head_dim(void) {
    mgc_hw hw = load_hw("h100-sxm");
    for (int f32 = 0; f32 < 2; f32++) {
        const char *d128[] = {"parallel.world_size=1", "training.global_batch_size=4",
                              "training.micro_batch_size=4", "model.head_dim=128",
                              f32 ? "training.precision=fp32" : "training.precision=bf16", NULL};
        const char *d256[] = {"parallel.world_size=1", "training.global_batch_size=4",
                              "training.micro_batch_size=4", "model.head_dim=256",
                              f32 ? "training.precision=fp32" : "training.precision=bf16", NULL};
        mgc_plan *a = compile_with(GPT, d128), *b = compile_with(GPT, d256);
        if (a && b) {
            double fa = kind_s(a, &hw, MGC_POP_ATTENTION), fb = kind_s(b, &hw, MGC_POP_ATTENTION);
            double ba = kind_s(a, &hw, MGC_POP_ATTENTION_BWD), bb = kind_s(b, &hw, MGC_POP_ATTENTION_BWD);
            T_CHECK(fa > 0 && ba > 0);
            T_NEAR_REL(fb, 2 * fa, 1e-9);
            T_NEAR_REL(bb, f32 ? 2 * ba : 2 * ba * 9 / 7, 1e-9);
        }
        mgc_plan_free(a);
        mgc_plan_free(b);
    }
}

static void test_step(void) {
    mgc_hw hw = load_hw("h100-sxm");
    mgc_cost_options o;
    memset(&o, 0, sizeof o);
    o.hw = &hw;

    /* one GPU: the step is the plain sum of its instructions */
    const char *one[] = {"parallel.world_size=1", "training.global_batch_size=16", "training.micro_batch_size=4",
                         NULL};
    mgc_plan *p = compile_with(GPT, one);
    if (!p) return;
    mgc_cost_report r = predict(p, &hw, 0);
    double sum = 0;
    for (int64_t i = 0; i < p->stages[0].n_instrs; i++)
        sum += mgc_cost_instr(p, 0, &p->stages[0].instrs[i], &o, NULL);
    T_NEAR_REL(r.step_s, sum, 1e-9);
    T_NEAR_REL(r.bubble_s + 1, 1, 1e-9);
    T_NEAR_REL(r.tokens_per_s, 16.0 * 1024 / r.step_s, 1e-12);
    T_NEAR_REL(r.mfu, p->model_flops_per_iter / r.step_s / 989.4e12, 1e-9);
    T_NEAR_REL(r.energy_j, 700 * r.step_s, 1e-12);
    T_CHECK(r.hfu >= r.mfu * 0.99);
    /* the by-class split adds up to the step on one rank without communication */
    double cls = 0;
    for (int k = 0; k < MGC_COST__COUNT; k++) cls += r.by_class_s[k];
    T_NEAR_REL(cls, r.step_s, 1e-9);
    T_CHECK(r.by_class_s[MGC_COST_GEMM] > r.by_class_s[MGC_COST_ATTENTION]);
    /* twice the peak, less time; a plan at half the microbatches half the tokens */
    mgc_hw fast = hw;
    fast.peak_flops[1] *= 2;
    mgc_cost_report rf = predict(p, &fast, 0);
    T_CHECK(rf.step_s < r.step_s);
    T_EQ_U64(r.max_arena_bytes, p->stages[0].arena_bytes);
    mgc_plan_free(p);

    /* pipeline: more microbatches shrink the bubble; interleaving shrinks it further */
    const char *pp4[] = {"parallel.world_size=4", "parallel.pipeline=4", "training.global_batch_size=8",
                         "training.micro_batch_size=1", "model.vocab_size=1024", NULL};
    const char *pp4m[] = {"parallel.world_size=4", "parallel.pipeline=4", "training.global_batch_size=32",
                          "training.micro_batch_size=1", "model.vocab_size=1024", NULL};
    const char *pp4v[] = {"parallel.world_size=4", "parallel.pipeline=4", "training.global_batch_size=8",
                          "training.micro_batch_size=1", "parallel.schedule=interleaved-1f1b", "parallel.virtual_stages=3",
                          "model.vocab_size=1024", NULL};
    mgc_plan *a = compile_with(GPT, pp4), *b = compile_with(GPT, pp4m), *c = compile_with(GPT, pp4v);
    if (a && b && c) {
        mgc_cost_report ra = predict(a, &hw, 0), rb = predict(b, &hw, 0), rc = predict(c, &hw, 0);
        T_CHECK(ra.bubble_fraction > 0.1);
        T_CHECK(rb.bubble_fraction < ra.bubble_fraction);
        T_CHECK(rc.bubble_fraction < ra.bubble_fraction);
        /* 1F1B with m = 8, p = 4 and balanced stages (a small vocabulary: the
         * head and embedding weigh little): the bubble is near (p-1)/(m+p-1) */
        T_CHECK(fabs(ra.bubble_fraction - 3.0 / 11) < 0.03);
        T_CHECK(ra.by_class_s[MGC_COST_P2P] > 0);
    }
    mgc_plan_free(a);
    mgc_plan_free(b);
    mgc_plan_free(c);

    /* data parallel over nodes: overlapped reductions are never slower than exposed ones */
    const char *dp[] = {"parallel.world_size=16", "training.global_batch_size=64", "training.micro_batch_size=4",
                        "hardware.gpus_per_node=2", NULL};
    p = compile_with(GPT, dp);
    if (p) {
        mgc_cost_report ov = predict(p, &hw, 0), ex = predict(p, &hw, 1);
        T_CHECK(ov.step_s <= ex.step_s);
        T_CHECK(ex.by_class_s[MGC_COST_DP_COMM] > 0);
        T_CHECK(ex.exposed_comm_s >= ov.exposed_comm_s);
        T_EQ_I64(ov.nodes, 8);
        /* the same job on 8-GPU nodes: its reductions cross fewer, faster links */
        o.gpus_per_node = 16;
        mgc_cost_report one_node;
        char err[256];
        T_CHECK(mgc_cost_plan(p, &o, &one_node, err, sizeof err) == 0);
        T_CHECK(one_node.by_class_s[MGC_COST_DP_COMM] < ex.by_class_s[MGC_COST_DP_COMM]);
        o.gpus_per_node = 0;
    }
    mgc_plan_free(p);
}

/* ---- lookups and the fused cross-entropy ------------------------------------------------- */

static double tbytes(const mgc_plan_chunk *ch, int32_t i) {
    return (double)mgc_plan_tensor_data_bytes(&ch->tensors[i]);
}

/* The bytes an op must move, as `mgc profile` and the memory-bound ops' time count them.  An
 * embedding moves the rows its tokens name: GPT-2 124M at micro batch 8 looks up 8,192 of the
 * 50,304 word rows and (8,192 tokens, 1,024 positions) all of the position rows (fused with
 * the embedding's dropout and the first norm, whose other tensors move whole), and its
 * backward reads and writes as many rows of each fp32 gradient.  A loss chunk's cross-entropy
 * backward with the statistics fused in (MGC_POF_CE_STATS) reads the logits twice, as the
 * unfused forward and backward do between them. */
static void test_lookup_bytes(void) {
    static const char *const sets[] = {"parallel.world_size=1", "parallel.data=1", "parallel.tensor=1",
                                       "parallel.pipeline=1", "training.micro_batch_size=8",
                                       "training.global_batch_size=8", "training.precision=bf16",
                                       "training.loss_chunks=2", NULL};
    mgc_plan *p = compile_with(GPT, sets);
    if (!p) return;
    const mgc_plan_chunk *ch = &p->stages[0].chunks[0];
    int seen_fwd = 0, seen_bwd = 0, seen_ce = 0;
    for (int pass = 0; pass < 2; pass++) {
        const mgc_plan_op *ops = pass ? ch->bwd : ch->fwd;
        int64_t n = pass ? ch->n_bwd : ch->n_fwd;
        for (int64_t i = 0; i < n; i++) {
            const mgc_plan_op *op = &ops[i];
            if (op->kind == MGC_POP_EMBEDDING || op->kind == MGC_POP_EMBEDDING_NORM) {
                /* GPT-2's file has embedding dropout: fused with it and the first norm, whose
                 * weight, bias, output and the mask move as whole tensors */
                int fused = op->kind == MGC_POP_EMBEDDING_NORM;
                T_EQ_I64(op->n_in, fused ? 5 : 3);
                T_EQ_I64(op->n_out, fused ? 3 : 1);
                const mgc_plan_tensor *word = &ch->tensors[op->in[1]], *pos = &ch->tensors[op->in[2]];
                T_EQ_I64(word->dim[0], 50304);
                T_EQ_I64(pos->dim[0], 1024);
                double want = 8192 * 8.0 + 8192 * 768 * 2.0 + 1024 * 768 * 2.0;
                for (int k = 3; k < op->n_in; k++) want += tbytes(ch, op->in[k]);
                for (int k = 0; k < op->n_out; k++) want += tbytes(ch, op->out[k]);
                T_EQ_I64((int64_t)tbytes(ch, op->out[0]), 8192 * 768 * 2);
                if (fused) T_EQ_I64((int64_t)tbytes(ch, op->out[2]), 8192 * 768);
                T_NEAR_REL(mgc_cost_op_bytes(p, ch, op), want, 1e-12);
                seen_fwd++;
            } else if (op->kind == MGC_POP_EMBEDDING_BWD) {
                T_EQ_I64(op->n_out, 2);
                double want = 8192 * 8.0 + tbytes(ch, op->in[1]) + 2 * (8192 * 768 * 4.0) + 2 * (1024 * 768 * 4.0);
                T_NEAR_REL(mgc_cost_op_bytes(p, ch, op), want, 1e-12);
                seen_bwd++;
            } else if (op->kind == MGC_POP_CROSS_ENTROPY_BWD) {
                T_CHECK(op->flags & MGC_POF_CE_STATS);
                double io = 0;
                for (int k = 0; k < op->n_in; k++) io += tbytes(ch, op->in[k]);
                for (int k = 0; k < op->n_out; k++) io += tbytes(ch, op->out[k]);
                T_EQ_I64((int64_t)tbytes(ch, op->in[0]), 4096 * 50304 * 4LL); /* a chunk's fp32 logits */
                T_NEAR_REL(mgc_cost_op_bytes(p, ch, op), io + tbytes(ch, op->in[0]), 1e-12);
                seen_ce++;
            }
        }
    }
    T_EQ_I64(seen_fwd, 1);
    T_EQ_I64(seen_bwd, 1);
    T_EQ_I64(seen_ce, 2);
    printf("test_lookup_bytes: embedding %d + %d, fused cross-entropy %d ops checked\n", seen_fwd, seen_bwd, seen_ce);
    mgc_plan_free(p);
}

/* ---- dropless expert rows ---------------------------------------------------------------- */

/* Expert rows received over EP are sized for the worst case; the exchanges, the sort and the
 * experts' kernels move the routed ones, which balanced routing makes as many as a rank sends:
 * T_l k of ep T_l min(k, E_l) (plan.h MGC_PT_ROUTED).  Tiny MoE: E 8, k 2, ep 2: half. */
static void test_routed(void) {
    mgc_hw hw = load_hw("h100-sxm");
    mgc_cost_options o;
    memset(&o, 0, sizeof o);
    o.hw = &hw;
    static const char *const ep2[] = {"parallel.world_size=2", "parallel.data=2", "parallel.expert=2", NULL};
    static const char *const cap[] = {"parallel.world_size=2", "parallel.data=2", "parallel.expert=2",
                                      "moe.capacity_factor=1.0", NULL};
    static const char *const ep1[] = {"parallel.world_size=2", "parallel.data=2", NULL};
    const char *const *sets[3] = {ep2, cap, ep1};
    for (int v = 0; v < 3; v++) {
        mgc_plan *p = compile_with("models/tiny-moe.yaml", sets[v]);
        if (!p) continue;
        const mgc_plan_chunk *ch = &p->stages[0].chunks[0];
        int64_t routed = 0, rows_ops = 0, a2a = 0;
        double t_dispatch = 0, t_combine = 0;
        for (int64_t t = 0; t < ch->n_tensors; t++)
            routed += (ch->tensors[t].flags & MGC_PT_ROUTED) != 0;
        for (int pass = 0; pass < 2; pass++) {
            const mgc_plan_op *ops = pass ? ch->bwd : ch->fwd;
            int64_t n = pass ? ch->n_bwd : ch->n_fwd;
            for (int64_t i = 0; i < n; i++) {
                const mgc_plan_op *op = &ops[i];
                const char *nm = mgc_plan_strat(p, op->name);
                if (op->flags & MGC_POF_ROWS) {
                    rows_ops++;
                    /* the activation's rows are routed; the counts, last, are the local experts' */
                    T_CHECK(ch->tensors[op->in[0]].flags & MGC_PT_ROUTED);
                    T_EQ_I64(ch->tensors[op->in[op->n_in - 1]].dim[0], 4);
                }
                if (v == 0 && op->kind == MGC_POP_MOE_DISPATCH && op->iattr[0] == 1 && op->layer == 1 &&
                    pass == 0) {
                    /* the sort: rows received (bound R_ep) in, sorted rows (R_x) out, at half */
                    const mgc_plan_tensor *x = &ch->tensors[op->in[0]], *y = &ch->tensors[op->out[0]];
                    double want = 0.5 * (double)(x->bytes + y->bytes) + (double)ch->tensors[op->in[1]].bytes +
                                  (double)ch->tensors[op->out[1]].bytes;
                    T_NEAR_REL(mgc_cost_op_bytes(p, ch, op), want, 1e-12);
                }
                if (op->kind == MGC_POP_ALL_TO_ALL && op->layer == 1 && pass == 0 &&
                    ch->tensors[op->in[0]].rank == 2) {
                    a2a++;
                    double t = mgc_cost_op(p, 0, ch, op, &o, NULL);
                    if (strstr(nm, ".dispatch.")) t_dispatch = t;
                    else t_combine = t;
                }
            }
        }
        if (v == 0) {
            /* rows.ep, the sorted rows, fc1 and activation outputs, the unsorted rows, their
             * gradients and copies; the activations and their backwards count routed rows */
            T_CHECK(routed >= 5 * 3);
            T_EQ_I64(rows_ops, 2 * 3); /* three MoE layers, forward and backward */
            /* balanced: the exchange back moves what the exchange out moved */
            T_EQ_I64(a2a, 2);
            T_CHECK(t_dispatch > 0);
            T_NEAR_REL(t_dispatch, t_combine, 1e-12);
            printf("test_routed: dropless ep2: %lld routed tensors, %lld activations over routed rows, "
                   "the two exchanges %.3g s each\n",
                   (long long)routed, (long long)rows_ops, t_dispatch);
        } else {
            /* capacity mode: static shapes; no EP: every row count exact */
            T_EQ_I64(routed, 0);
            T_EQ_I64(rows_ops, 0);
        }
        mgc_plan_free(p);
    }
}

/* ---- calibration ---------------------------------------------------------------------- */

static void test_calibrate(void) {
    mgc_hw base = load_hw("h100-sxm");
    /* the "true" device: slower GEMMs and memory, faster attention */
    mgc_hw truth = base;
    truth.eff.gemm = 0.41;
    truth.eff.memory = 0.63;
    truth.eff.attention_fwd = 0.52;
    truth.eff.attention_bwd = 0.21;
    truth.eff.nvlink = 0.55;
    const char *tp2[] = {"parallel.world_size=2", "parallel.tensor=2", "training.global_batch_size=8",
                         "training.micro_batch_size=2", NULL};
    mgc_plan *p = compile_with(GPT, tp2);
    if (!p) return;
    mgc_cost_options o;
    memset(&o, 0, sizeof o);
    o.hw = &truth;
    /* "measured" samples: every op of every chunk, timed under the truth */
    mgc_calib_sample *s = NULL;
    int64_t n = 0, cap = 0;
    for (int64_t st = 0; st < p->n_stages; st++)
        for (int64_t c = 0; c < p->stages[st].n_chunks; c++)
            for (int pass = 0; pass < 2; pass++) {
                const mgc_plan_chunk *ch = &p->stages[st].chunks[c];
                int64_t m = pass ? ch->n_bwd : ch->n_fwd;
                for (int64_t i = 0; i < m; i++) {
                    if (n == cap) s = realloc(s, (size_t)(cap = cap ? 2 * cap : 256) * sizeof *s);
                    memset(&s[n], 0, sizeof s[n]);
                    s[n].stage = st, s[n].chunk = c, s[n].index = i, s[n].bwd = pass;
                    s[n].calls = 3;
                    s[n].mean_s = mgc_cost_op(p, st, ch, pass ? &ch->bwd[i] : &ch->fwd[i], &o, NULL);
                    n++;
                }
            }
    mgc_hw fit = base;
    mgc_calib_fit rep;
    char err[512];
    T_CHECK(mgc_calibrate_ops(p, s, n, &fit, &rep, err, sizeof err) == 0);
    T_NEAR_REL(fit.eff.gemm, truth.eff.gemm, 1e-4);
    T_NEAR_REL(fit.eff.memory, truth.eff.memory, 1e-4);
    T_NEAR_REL(fit.eff.attention_fwd, truth.eff.attention_fwd, 1e-4);
    T_NEAR_REL(fit.eff.attention_bwd, truth.eff.attention_bwd, 1e-4);
    T_NEAR_REL(fit.eff.nvlink, truth.eff.nvlink, 1e-4);
    T_NEAR_REL(fit.eff.network, base.eff.network, 1e-12); /* no samples: kept */
    T_CHECK(rep.samples[MGC_CALIB_GEMM] > 0 && rep.samples[MGC_CALIB_NETWORK] == 0);
    T_NEAR_REL(rep.after_s[MGC_CALIB_GEMM], rep.measured_s[MGC_CALIB_GEMM], 1e-4);
    /* samples that match nothing are refused */
    mgc_calib_sample junk = {.stage = 7, .chunk = 0, .index = 0, .mean_s = 1, .calls = 1};
    fit = base;
    T_CHECK(mgc_calibrate_ops(p, &junk, 1, &fit, &rep, err, sizeof err) != 0);
    free(s);

    /* from a step time: one factor on the compute efficiencies */
    mgc_hw slow = base;
    slow.eff.gemm *= 0.6, slow.eff.memory *= 0.6, slow.eff.attention_fwd *= 0.6, slow.eff.attention_bwd *= 0.6;
    mgc_cost_report r = predict(p, &slow, 0);
    fit = base;
    double k = 0;
    T_CHECK(mgc_calibrate_step(p, r.step_s, &fit, &k, err, sizeof err) == 0);
    T_NEAR_REL(k, 0.6, 1e-6);
    T_NEAR_REL(fit.eff.gemm, slow.eff.gemm, 1e-6);
    /* a step faster than any efficiency allows is refused, the profile untouched */
    fit = base;
    T_CHECK(mgc_calibrate_step(p, r.step_s * 1e-4, &fit, &k, err, sizeof err) != 0);
    T_NEAR_REL(fit.eff.gemm, base.eff.gemm, 1e-12);
    mgc_plan_free(p);
}

int main(void) {
    test_profiles();
    test_ops();
    test_step();
    test_padded_head_dim();
    test_wide_head_dim();
    test_routed();
    test_lookup_bytes();
    test_calibrate();
    return t_summary("test_cost");
}
