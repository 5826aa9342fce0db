/* test_cuda.c - the CUDA backend against the CPU reference (label gpu; exit 77
 * without a GPU or without a CUDA build).  `test_cuda --emu` runs the same checks
 * on the CUDA emulator backend instead (emu_backend.c: the same launchers and
 * kernel source, on the CPU; label cpu, as test_cuda_emu1 and 2): fewer training steps
 * (EMU_STEPS), and no CUDA graphs, which the emulator does not record.
 *
 *  1. Every kernel, op by op: the tiny GPT, LLaMA and MoE models run one
 *     training step on the CPU backend (fp32, loss scale 2^12 so that the
 *     backward's values are in fp16's normal range); before and after every compute
 *     op a hook replays the op on the GPU with the CPU's input values (in fp32,
 *     and in bf16 and fp16 through the 16-bit plans of the same model), outputs
 *     poisoned first (the CPU's too: rows its op leaves, expert rows no token filled,
 *     are not compared), and compares each output: ||gpu - cpu|| / ||cpu|| <= 1e-5
 *     (fp32, 3e-5 for GEMM-like sums) or 1e-2 (bf16, fp16); integer outputs
 *     exactly (fp32).  A layout of several ranks (`ranks`) runs them as threads,
 *     each replaying its own ops on a GPU backend of its own with its coordinates.
 *  2. Training: 20 steps of each model on the GPU in fp32 track the CPU's
 *     losses within 1e-4 relative, in bf16 and fp16 (dynamic loss scaling from
 *     2^10, no step skipped) within 3e-2; a second GPU run gives bit-identical
 *     losses (on the emulator under other block and thread orders, MGC_EMU_SEED).
 *     Parallel layouts (tensor + sequence, interleaved pipeline, data with the
 *     distributed optimizer, context, tensor x pipeline x data, expert) run their ranks as
 *     threads on this one GPU, communication staged through host memory: the losses track
 *     the CPU backend's run of the same layout (fp32 1e-4, bf16 3e-2), and a rerun with the
 *     gradient buckets reduced in line instead of beside the backward (the transfer stream)
 *     gives the same bits.
 *  3. CUDA graphs: tiny GPT without dropout trains 6 steps in fp32 and bf16, and with
 *     hidden and attention dropout 0.1 in bf16, with graphs (recorded on the second step,
 *     replayed after, the dropout kernels reading each step from the backend's memory) to the
 *     same bits as without, and the programs do replay.
 *     Under MGC_PDL=1 (programmatic dependent launch, sm_90 and newer), MGC_ZERO_BESIDE=1 (the
 *     gradients zeroed beside the forward) and both, tiny GPT and tiny MoE train 6 steps in
 *     bf16, eagerly and with graphs, to the bits of ordinary launches.
 *     GEMM tuning (`tune`): a run under MGC_GEMM_TUNE trains as an untuned one does (within
 *     rounding), runs with its file give the same bits eagerly and with graphs, another GPU's
 *     file is ignored and a malformed one refused.
 *  5. The cross-entropy backward on its own (`ce`, check_ce_inplace): over its own logits at
 *     a row pitch and into a separate poisoned tensor, at GPT-2's vocabulary and others.
 *  4. The optimizer's multi-tensor kernels on their own (`optim`): AdamW over 300 tensors
 *     of random sizes (empty, one element, chunk edges, unaligned starts; more tensors than
 *     one launch's table) gives the CPU's weights, moments and 16-bit copies bit for bit and
 *     writes nothing between the tensors; the sum of squares matches an independent long
 *     double sum within 1e-12 and repeats bit for bit; a quarter of the tensors take
 *     AdamW's 16-byte path.  Seeded from the clock (MGC_TEST_SEED replays).
 *  6. The embedding backward on its own (`emb`): skewed token distributions against a
 *     double sum, and bit for bit against its segment-and-join order replayed on the host.
 *  7. The bias gradient on its own (`bgrad`): against double column sums.
 *  8. Hidden dropout's backward inside the norm backward (`dropnorm`): tiny GPT's ops replayed
 *     as in 1 with dropout 0.1, at a width of whole 16-byte vectors and at one without (the
 *     embedding's dropout inside the fused embedding + norm too), and the cp2 layout with
 *     dropout in fp32.
 * The kernels come from the plan (compiled here for sm_80 and sm_90 by NVRTC);
 * a GPU of another architecture JIT-compiles them. */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backend.h"
#include "compile.h"
#include "config.h"
#include "diag.h"
#include "emu_kernel.h"
#include "exec.h"
#include "gemm_tuning.h"
#include "comm.h"
#include "half.h"
#include "ir.h"
#include "kernels.h"
#include "kspec.h"
#include "plan.h"
#include "testlib.h"
#include "testplan.h"
#include "train.h"
#include "train_data.h"

#define STEPS     20
#define EMU_STEPS 4

static int emu;            /* --emu: the CUDA emulator backend instead of the GPU */
static int steps = STEPS;  /* training steps run (EMU_STEPS under --emu) */

static const char *gpu_name(void) {
    return emu ? "emu" : "cuda";
}
static int open_gpu(mgc_backend **be, char *err, size_t errsz) {
    return emu ? mgc_backend_emu_open(be, err, errsz) : mgc_backend_cuda_open(be, 0, err, errsz);
}

static mgc_plan *compile(const char *path, const char *precision, const char *const *extra) {
    char prec[64];
    snprintf(prec, sizeof prec, "training.precision=%s", precision);
    const char *sets[] = {prec, "training.iterations=20", "optimizer.warmup_iterations=2", NULL};
    /* fp16: a loss scale the tiny models' gradients do not overflow, so that no step is
     * skipped and the losses can track the CPU's step for step */
    static const char *const fp16[] = {"training.initial_loss_scale=1024", NULL};
    mgc_plan *p = t_compile(path, (const char *const *const[]){sets, extra, strcmp(precision, "fp16") ? NULL : fp16}, 3);
    if (p && !emu) { /* the emulator compiles the kernel source for the host instead */
        int archs[2] = {80, 90};
        mgc_kernel_stats st;
        char err[4096];
        if (mgc_compile_kernels(p, archs, 2, 8, &st, err, sizeof err)) {
            fprintf(stderr, "%s (%s): kernels: %s\n", path, precision, err);
            mgc_plan_free(p);
            return NULL;
        }
        printf("%s (%s): %d kernel specs, %d compiled, %d cached, max %ld registers, %ld spill "
               "bytes\n",
               path, precision, st.specs, st.compiled, st.cached, st.max_registers,
               st.max_spill_bytes);
        T_EQ_I64(st.max_spill_bytes, 0);
    }
    return p;
}

/* ---- 4. the optimizer's multi-tensor kernels ------------------------------------------ */

static uint64_t orng = 1;
static uint64_t onext(void) {
    orng ^= orng >> 12, orng ^= orng << 25, orng ^= orng >> 27;
    return orng * 2685821657736338717ull;
}
static float ofloat(double scale) { /* non-zero, either sign */
    double u = ((double)(onext() >> 11) + 0.5) * 0x1p-53;
    return (float)((onext() & 1 ? u : -u) * scale);
}

#define OPT_T 300 /* tensors: more than a table of either kernel (kspec.h SQ_LIST, AW_LIST) */

static void check_optimizer(void) {
    char err[512];
    mgc_backend *be = NULL;
    if (open_gpu(&be, err, sizeof err)) {
        fprintf(stderr, "optimizer: %s\n", err);
        T_CHECK(0);
        return;
    }
    /* the tensors' sizes and places: gaps between them (written by nobody), odd starts */
    static const int64_t edges[] = {0, 1, 3, 255, 256, 257, 8191, 8192, 8193, 16385};
    int64_t off[OPT_T], n[OPT_T], total = 0;
    int decay[OPT_T];
    for (int i = 0; i < OPT_T; i++) {
        total += 1 + (int64_t)(onext() % 5); /* the gap before */
        off[i] = total;
        uint64_t r = onext() % 16;
        n[i] = r < 10 ? edges[r] : r < 15 ? 1 + (int64_t)(onext() % 3000) : 20000 + (int64_t)(onext() % 9000);
        decay[i] = (int)(onext() & 1);
        total += n[i];
    }
    total = (total + 3 + 3) / 4 * 4; /* the arrays equally aligned: tensors at a multiple of 4
                                        take the kernel's 16-byte path, the others its elements */
    size_t fb = (size_t)total * 4, hb = (size_t)total * 2;
    float *hp = malloc(fb), *hg = malloc(fb), *hm = malloc(fb), *hv = malloc(fb);
    float *ep = malloc(fb), *em = malloc(fb), *ev = malloc(fb);
    float *rp = malloc(fb), *rm = malloc(fb), *rv = malloc(fb);
    uint16_t *ec = malloc(hb), *rc = malloc(hb);
    void *arena = NULL;
    mgc_backend *cpu = NULL; /* the reference: the CPU backend, on host arrays */
    if (!hp || !hg || !hm || !hv || !ep || !em || !ev || !rp || !rm || !rv || !ec || !rc ||
        be->iface->arena_alloc(be, 4 * (uint64_t)fb + hb + 4096, &arena)) {
        T_CHECK(0);
        goto out;
    }
    for (int64_t i = 0; i < total; i++) {
        hp[i] = ofloat(0.5), hg[i] = ofloat(2.0), hm[i] = ofloat(0.1);
        hv[i] = (float)fabs(ofloat(0.01)) + 1e-6f;
    }
    float *dp = arena, *dg = dp + total, *dm = dg + total, *dv = dm + total;
    uint16_t *dc = (uint16_t *)(dv + total);
    const float *gl[OPT_T];
    mgc_adamw_tensor t[OPT_T];
    mgc_adamw_step st = {3e-3, 0.9, 0.95, 1e-8, 0.1, 0.7, 7, MGC_DT_BF16};
    if (mgc_backend_cpu_open(&cpu, err, sizeof err)) {
        fprintf(stderr, "optimizer: %s\n", err);
        T_CHECK(0);
        goto out;
    }
    static const int copies[3] = {0, MGC_DT_BF16, MGC_DT_F16};
    static const char *const cname[3] = {"no copy", "bf16 copy", "fp16 copy"};
    for (int k = 0; k < 3; k++) {
        memcpy(ep, hp, fb), memcpy(em, hm, fb), memcpy(ev, hv, fb);
        memset(ec, 0xa5, hb); /* the poison: what the gaps (and a run without copies) keep */
        for (int i = 0; i < OPT_T; i++) {
            mgc_adamw_tensor h = {ep + off[i], hg + off[i], em + off[i], ev + off[i], NULL, n[i],
                                  decay[i]};
            T_EQ_I64(cpu->iface->adamw(cpu, &h, 1, &st), 0);
            for (int64_t j = 0; copies[k] && j < n[i]; j++) {
                float w = ep[off[i] + j];
                ec[off[i] + j] = copies[k] == MGC_DT_F16 ? mgc_f32_to_f16(w) : mgc_f32_to_bf16(w);
            }
            t[i] = (mgc_adamw_tensor){dp + off[i], dg + off[i], dm + off[i], dv + off[i],
                                      copies[k] ? dc + off[i] : NULL, n[i], decay[i]};
        }
        memset(rc, 0xa5, hb);
        st.copy_dtype = copies[k] ? copies[k] : MGC_DT_BF16;
        int bad = be->iface->upload(be, dp, hp, fb) || be->iface->upload(be, dg, hg, fb) ||
                  be->iface->upload(be, dm, hm, fb) || be->iface->upload(be, dv, hv, fb) ||
                  be->iface->upload(be, dc, rc, hb) || be->iface->adamw(be, t, OPT_T, &st) ||
                  be->iface->download(be, rp, dp, fb) || be->iface->download(be, rm, dm, fb) ||
                  be->iface->download(be, rv, dv, fb) || be->iface->download(be, rc, dc, hb);
        if (bad) fprintf(stderr, "optimizer: %s\n", be->err);
        T_CHECK(!bad);
        int same = !bad && !memcmp(rp, ep, fb) && !memcmp(rm, em, fb) && !memcmp(rv, ev, fb) &&
                   !memcmp(rc, ec, hb);
        T_CHECK(same);
        printf("optimizer: AdamW over %d tensors (%lld elements, %s): %s\n", OPT_T,
               (long long)total, cname[k], same ? "the CPU's bits" : "DIFFERS from the CPU");
    }
    /* the sum of squares: an independent long double sum; repeats bit for bit */
    long double ref = 0;
    for (int i = 0; i < OPT_T; i++) {
        gl[i] = dg + off[i];
        for (int64_t j = 0; j < n[i]; j++)
            ref += (long double)hg[off[i] + j] * hg[off[i] + j];
    }
    double s1 = -1, s2 = -2, s0 = -3;
    int64_t zeros[3] = {0, 0, 0};
    int bad = be->iface->sumsq(be, gl, n, OPT_T, &s1) || be->iface->sumsq(be, gl, n, OPT_T, &s2) ||
              be->iface->sumsq(be, gl, zeros, 3, &s0);
    if (bad) fprintf(stderr, "optimizer: %s\n", be->err);
    T_CHECK(!bad);
    double rel = fabs((double)(((long double)s1 - ref) / ref));
    T_CHECK(rel <= 1e-12);
    T_CHECK(memcmp(&s1, &s2, sizeof s1) == 0);
    T_CHECK(s0 == 0.0);
    printf("optimizer: sum of squares over %d tensors: %.17g, %.2e from a long double sum; "
           "repeat %s\n",
           OPT_T, s1, rel, memcmp(&s1, &s2, sizeof s1) ? "DIFFERS" : "bit-identical");
out:
    if (arena) be->iface->arena_free(be, arena);
    mgc_backend_close(be);
    if (cpu) mgc_backend_close(cpu);
    free(hp), free(hg), free(hm), free(hv), free(ep), free(em), free(ev);
    free(rp), free(rm), free(rv), free(ec), free(rc);
}

/* The last backward op of `kind` in ch0 (with n_out outputs unless n_out is 0), and ch, a
 * copy of ch0 whose tensor table is *tv (the caller's to free and resize): the single-op
 * checks below reshape one op's tensors without touching the plan.  NULL: none (a failed
 * check) or no memory. */
static const mgc_plan_op *bwd_op_copy(const mgc_plan_chunk *ch0, int kind, int n_out,
                                      mgc_plan_chunk *ch, mgc_plan_tensor **tv) {
    const mgc_plan_op *op0 = NULL;
    for (int64_t i = 0; i < ch0->n_bwd; i++)
        if (ch0->bwd[i].kind == kind && (!n_out || ch0->bwd[i].n_out == n_out))
            op0 = &ch0->bwd[i];
    T_CHECK(op0 != NULL);
    *tv = op0 ? malloc((size_t)ch0->n_tensors * sizeof **tv) : NULL;
    if (!*tv) return NULL;
    memcpy(*tv, ch0->tensors, (size_t)ch0->n_tensors * sizeof **tv);
    *ch = *ch0;
    ch->tensors = *tv;
    return op0;
}

/* ---- 5. the cross-entropy backward over its own logits ----------------------------------
 * cross_entropy_bwd writes the logits' gradient over the fp32 logits (MGC_POF_INPLACE): a
 * 16-bit row over the first half of its own fp32 row, at a row pitch of 2 V.  The op replays
 * see the tiny models' vocabularies (one 2048-column step a row); here the real one (50,304:
 * 25 steps, the later ones writing over columns earlier steps read), an odd one (5,003: the
 * element-by-element path), one step exactly and a few columns, in the three precisions, in
 * place and into a separate poisoned tensor, against a double-precision reference per
 * element: within the storage type's rounding, padding columns exactly 0.  In the 16-bit
 * plans also with the logits in the gradient's type (training.logits_dtype compute: dense, in
 * place column over column, the kernels' LT), the reference computed from the rounded logits. */

static void check_ce_case(mgc_backend *be, const mgc_plan *p, int64_t Vp, int inplace, int lt16) {
    const mgc_stage_program *sp = &p->stages[p->n_stages - 1];
    /* the chunk with this op's tensors resized: n rows of Vp columns */
    mgc_plan_chunk ch;
    mgc_plan_tensor *tv;
    const mgc_plan_op *op0 =
        bwd_op_copy(&sp->chunks[sp->n_chunks - 1], MGC_POP_CROSS_ENTROPY_BWD, 0, &ch, &tv);
    if (!op0) return;
    T_CHECK((op0->flags & MGC_POF_INPLACE) && op0->n_in == 5);
    if (op0->n_in != 5) {
        free(tv);
        return;
    }
    const int64_t n = 5, vocab = Vp > 8 ? Vp - 5 : Vp; /* columns [vocab, Vp) are padding */
    mgc_plan_op op = *op0;
    op.iattr[1] = Vp;
    if (!inplace) op.flags &= (uint16_t)~MGC_POF_INPLACE;
    mgc_plan_tensor *x = &tv[op.in[0]], *y = &tv[op.out[0]];
    size_t ys = mgc_dtype_size((mgc_dtype)y->dtype);
    if (lt16 && ys == 4) {
        free(tv);
        return;
    }
    if (lt16) x->dtype = y->dtype;
    size_t xs = mgc_dtype_size((mgc_dtype)x->dtype);
    x->rank = y->rank = 2;
    x->dim[0] = y->dim[0] = n;
    x->dim[1] = y->dim[1] = Vp;
    x->bytes = (uint64_t)(n * Vp) * xs;
    y->ld = inplace && ys < xs ? (uint32_t)(Vp * (int64_t)(xs / ys)) : 0;
    y->bytes = inplace ? x->bytes : (uint64_t)(n * Vp) * ys;
    for (int k = 1; k < 4; k++) {
        tv[op.in[k]].rank = 1;
        tv[op.in[k]].dim[0] = n;
        tv[op.in[k]].bytes = (uint64_t)n * mgc_dtype_size((mgc_dtype)tv[op.in[k]].dtype);
    }
    float *lg = malloc((size_t)(n * Vp) * 4), *lse = malloc((size_t)n * 4), mask[5] = {1, 0, 1, 1, 1};
    int64_t lab[5];
    float loss[2] = {3.5f, 4.0f};
    void *h = malloc(y->bytes > x->bytes ? y->bytes : x->bytes);
    void *dx = NULL, *dy = NULL, *dl = NULL, *dlab = NULL, *dm = NULL, *dloss = NULL;
    int ok = lg && lse && h;
    uint16_t *lg16 = lt16 && lg ? malloc((size_t)(n * Vp) * 2) : NULL;
    ok = ok && (!lt16 || lg16);
    for (int64_t r = 0; ok && r < n; r++) {
        double mx = -1e300, se = 0;
        for (int64_t c = 0; c < Vp; c++) {
            float v = ofloat(6.0);
            if (lt16) { /* the logit as stored, and its value */
                lg16[r * Vp + c] =
                    x->dtype == MGC_DT_BF16 ? mgc_f32_to_bf16(v) : mgc_f32_to_f16(v);
                uint16_t b = lg16[r * Vp + c];
                v = x->dtype == MGC_DT_BF16 ? mgc_bf16_to_f32(b) : mgc_f16_to_f32(b);
            }
            lg[r * Vp + c] = v;
            if (c < vocab && lg[r * Vp + c] > mx) mx = lg[r * Vp + c];
        }
        for (int64_t c = 0; c < vocab; c++)
            se += exp((double)lg[r * Vp + c] - mx);
        lse[r] = (float)(mx + log(se));
        lab[r] = (int64_t)(onext() % (uint64_t)vocab);
    }
    lab[4] = vocab - 1; /* the last real column */
    ok = ok && !be->iface->arena_alloc(be, x->bytes, &dx) &&
         (inplace || !be->iface->arena_alloc(be, y->bytes, &dy)) &&
         !be->iface->arena_alloc(be, (size_t)n * 4, &dl) &&
         !be->iface->arena_alloc(be, (size_t)n * 8, &dlab) &&
         !be->iface->arena_alloc(be, (size_t)n * 4, &dm) &&
         !be->iface->arena_alloc(be, 8, &dloss);
    if (ok && !inplace) {
        memset(h, 0xff, y->bytes); /* poison: NaN in every float format */
        ok = !be->iface->upload(be, dy, h, y->bytes);
    }
    ok = ok && !be->iface->upload(be, dx, lt16 ? (void *)lg16 : (void *)lg, x->bytes) &&
         !be->iface->upload(be, dl, lse, (size_t)n * 4) &&
         !be->iface->upload(be, dlab, lab, (size_t)n * 8) &&
         !be->iface->upload(be, dm, mask, (size_t)n * 4) && !be->iface->upload(be, dloss, loss, 8);
    mgc_op_call c;
    memset(&c, 0, sizeof c);
    c.plan = p;
    c.chunk = &ch;
    c.op = &op;
    c.in[0] = dx, c.in[1] = dl, c.in[2] = dlab, c.in[3] = dm, c.in[4] = dloss;
    c.out[0] = inplace ? dx : dy;
    c.grid_tp = c.grid_cp = 1;
    c.vocab_size = vocab;
    c.seq_length = n;
    c.dloss = 0.75;
    if (ok && be->iface->run_op(be, &c)) {
        fprintf(stderr, "cross_entropy_bwd: %s\n", be->err);
        ok = 0;
    }
    ok = ok && !be->iface->download(be, h, c.out[0], y->bytes);
    T_CHECK(ok);
    /* per element: |gpu - ref| <= rel |ref| + abs, the storage type's rounding (and its
     * subnormal step) on a float computation */
    double rel = ys == 4 ? 1e-5 : y->dtype == MGC_DT_BF16 ? 0x1p-8 : 0x1p-10;
    double abs_ = y->dtype == MGC_DT_F16 ? 0x1p-24 : 1e-37, worst = 0;
    int64_t bad = 0, ld = mgc_plan_tensor_ld(y);
    for (int64_t r = 0; ok && r < n; r++)
        for (int64_t cc = 0; cc < Vp; cc++) {
            double m = mask[r] * (0.75 / loss[1]), ref = 0;
            if (cc < vocab && m != 0)
                ref = m * (exp((double)lg[r * Vp + cc] - lse[r]) - (cc == lab[r] ? 1.0 : 0.0));
            int64_t i = r * ld + cc;
            double g = y->dtype == MGC_DT_F32    ? ((const float *)h)[i]
                       : y->dtype == MGC_DT_BF16 ? mgc_bf16_to_f32(((const uint16_t *)h)[i])
                                                 : mgc_f16_to_f32(((const uint16_t *)h)[i]);
            double e = fabs(g - ref);
            int fine = cc >= vocab || m == 0 ? g == 0 && !signbit(g) : e <= rel * fabs(ref) + abs_;
            if (!fine && bad++ < 4)
                fprintf(stderr, "  %s V %lld row %lld col %lld: %.9g, want %.9g\n",
                        mgc_dtype_name((mgc_dtype)y->dtype), (long long)Vp, (long long)r,
                        (long long)cc, g, ref);
            if (fabs(ref) >= 1e-4 && e / fabs(ref) > worst) worst = e / fabs(ref); /* normal */
        }
    T_EQ_I64(bad, 0);
    printf("cross_entropy_bwd %s V %lld, %s logits, %s: %s (worst %.2e of the value)\n",
           mgc_dtype_name((mgc_dtype)y->dtype), (long long)Vp, mgc_dtype_name((mgc_dtype)x->dtype),
           !inplace ? "separate, poisoned" : y->ld ? "in place, row pitch" : "in place",
           bad ? "DIFFERS" : "within rounding", worst);
    void *all[] = {dx, dy, dl, dlab, dm, dloss};
    for (int k = 0; k < 6; k++)
        if (all[k]) be->iface->arena_free(be, all[k]);
    free(lg), free(lg16), free(lse), free(h), free(tv);
}

/* fn on tiny GPT's plan in each of the n precisions, bound on the GPU to an arena of its last
 * (only) stage: the drivers of the single-op checks below; `what` names them in errors. */
typedef void (*tiny_plan_fn)(mgc_backend *be, const mgc_plan *p);
static void on_tiny_gpt(const char *what, const char *const *prec, int n, tiny_plan_fn fn) {
    char err[512];
    mgc_backend *be = NULL;
    if (open_gpu(&be, err, sizeof err)) {
        fprintf(stderr, "%s: %s\n", what, err);
        T_CHECK(0);
        return;
    }
    for (int k = 0; k < n; k++) {
        mgc_plan *p = compile("examples/tiny-gpt.yaml", prec[k], NULL);
        T_CHECK(p != NULL);
        void *arena = NULL;
        if (!p || be->iface->arena_alloc(be, p->stages[p->n_stages - 1].arena_bytes, &arena)) {
            T_CHECK(0);
            mgc_plan_free(p);
            continue;
        }
        be->iface->bind(be, p, &p->stages[p->n_stages - 1], arena);
        fn(be, p);
        be->iface->arena_free(be, arena);
        mgc_plan_free(p);
    }
    mgc_backend_close(be);
}

static void ce_cases(mgc_backend *be, const mgc_plan *p) {
    static const int64_t V[4] = {50304, 5003, 2048, 8};
    for (int v = 0; v < 4; v++)
        for (int inplace = 1; inplace >= 0; inplace--)
            for (int lt16 = 0; lt16 < 2; lt16++)
                check_ce_case(be, p, V[v], inplace, lt16);
}

static void check_ce_inplace(void) {
    static const char *const prec[3] = {"fp32", "bf16", "fp16"};
    on_tiny_gpt("cross_entropy_bwd", prec, 3, ce_cases);
}

/* ---- 6. the embedding's sorted backward ----------------------------------------------
 * embedding_bwd sorts a microbatch's rows by token and sums each token's rows in segments of
 * MGC_KSPEC_EMB_SEG sorted keys; the runs that cross segments are joined afterwards
 * (kernels/embedding.cuh).  The op replays see the tiny models' microbatches; here the token
 * distributions that stress the segments: one token for a whole microbatch (a run over 64
 * segments), half the rows one token, runs ending exactly at segment ends, a run one row past
 * one, a vocabulary shard (tensor rank 1 of 2: tokens outside it leave the table alone), and
 * 5,000, 16,384 and 40,000 rows (the first sorted in one block, embedding_sort_block: 640
 * threads, 8 rounds of 32 keys a warp; the others by the tiled radix sort, 64 and 79 tiles, the
 * last of two chunks of 256 keys each; at 40,000 a token's run over 625 segments, whose end the
 * join finds in 20 passes of its 32 threads), a vocabulary of 70,000 (3,000 rows: the one-block
 * sort's three passes of a byte, 29 bits a key; 20,000 rows: the tiled sort's three passes; a
 * shard of it), in fp32 and bf16, against a double-precision sum onto random non-zero gradient
 * rows.  Rows no token hits must keep their bits; a rerun must give the same bits. */

static int cmp_u64(const void *a, const void *b) {
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

static void check_emb_case(mgc_backend *be, const mgc_plan *p, int kase) {
    mgc_plan_chunk ch;
    mgc_plan_tensor *tv;
    const mgc_plan_op *op0 =
        bwd_op_copy(&p->stages[0].chunks[0], MGC_POP_EMBEDDING_BWD, 0, &ch, &tv);
    if (!op0) return;
    static const int64_t N[11] = {1000, 2048, 96, 33, 1000, 5000, 16384, 40000, 3000, 3000, 20000};
    /* cases 8-10: a vocabulary of 70,000 (case 9 the shard of 35,000); case 10 past the one-block
     * sort's 8,192 keys, the tiled sort's three passes */
    const int64_t n = N[kase], V = kase >= 8 ? 70000 : 300, tp = kase == 4 || kase == 9;
    const int64_t Vl = tp ? V / 2 : V;
    /* cases 0, 5, 6: the position gradient too, in the join's launch (embedding.cuh POS): the
     * rows as n/4 positions of 4 sequences, each position's rows added j ascending */
    const int pos = (kase == 0 || kase == 5 || kase == 6) && op0->n_out > 1, B = pos ? 4 : 1;
    const int64_t S_ = n / B;
    mgc_plan_op op = *op0;
    op.n_out = pos ? 2 : 1; /* the word table (and the positions') */
    op.n_in = 2;
    op.flags &= (uint16_t)~MGC_POF_DOCS;
    op.iattr[0] = Vl;
    mgc_plan_tensor *tk = &tv[op.in[0]], *dy = &tv[op.in[1]], *dw = &tv[op.out[0]];
    mgc_plan_tensor *dpt = pos ? &tv[op.out[1]] : NULL;
    const int64_t h = dy->dim[dy->rank - 1];
    size_t es = mgc_dtype_size((mgc_dtype)dy->dtype);
    tk->rank = 2, tk->dim[0] = S_, tk->dim[1] = B, tk->bytes = (uint64_t)n * 8;
    if (dpt) dpt->rank = 2, dpt->dim[0] = S_, dpt->dim[1] = h, dpt->ld = 0, dpt->bytes = (uint64_t)(S_ * h) * 4;
    dy->rank = 3, dy->dim[0] = S_, dy->dim[1] = B, dy->dim[2] = h, dy->ld = 0;
    dy->bytes = (uint64_t)(n * h) * es;
    dw->rank = 2, dw->dim[0] = Vl, dw->dim[1] = h, dw->ld = 0, dw->bytes = (uint64_t)(Vl * h) * 4;
    int64_t *tok = malloc((size_t)n * 8);
    float *y = malloc((size_t)(n * h) * 4), *w0 = malloc((size_t)(Vl * h) * 4);
    float *g1 = malloc((size_t)(Vl * h) * 4), *g2 = malloc((size_t)(Vl * h) * 4);
    void *hy = malloc((size_t)(n * h) * es);
    double *ref = calloc((size_t)(Vl * h), sizeof *ref), *mag = calloc((size_t)(Vl * h), sizeof *mag);
    int ok = tok && y && w0 && g1 && g2 && hy && ref && mag;
    for (int64_t r = 0; ok && r < n; r++) {
        uint64_t u = onext() % 100;
        switch (kase) {
        case 1: tok[r] = 5; break;                            /* one run, 64 segments */
        case 2: tok[r] = 1 + r / MGC_KSPEC_EMB_SEG; break;    /* runs of exactly a segment */
        case 3: tok[r] = 4; break;                            /* one row past a segment */
        default: tok[r] = u < 50 ? 7 : u < 70 ? 158 : (int64_t)(onext() % (uint64_t)V); break;
        }
    }
    for (int64_t i = 0; ok && i < n * h; i++) {
        float v = ofloat(1.0);
        if (es == 2) {
            uint16_t b = mgc_f32_to_bf16(v);
            ((uint16_t *)hy)[i] = b;
            v = mgc_bf16_to_f32(b);
        } else {
            ((float *)hy)[i] = v;
        }
        y[i] = v;
    }
    for (int64_t i = 0; ok && i < Vl * h; i++)
        w0[i] = ofloat(4.0), ref[i] = w0[i], mag[i] = fabs(w0[i]);
    for (int64_t r = 0; ok && r < n; r++) {
        int64_t v = tok[r] - tp * Vl;
        if (v < 0 || v >= Vl) continue;
        for (int64_t c = 0; c < h; c++)
            ref[v * h + c] += y[r * h + c], mag[v * h + c] += fabs(y[r * h + c]);
    }
    void *dtk = NULL, *ddy = NULL, *ddw = NULL;
    ok = ok && !be->iface->arena_alloc(be, tk->bytes, &dtk) &&
         !be->iface->arena_alloc(be, dy->bytes, &ddy) && !be->iface->arena_alloc(be, dw->bytes, &ddw) &&
         !be->iface->upload(be, dtk, tok, tk->bytes) && !be->iface->upload(be, ddy, hy, dy->bytes);
    mgc_op_call c;
    memset(&c, 0, sizeof c);
    c.plan = p;
    c.chunk = &ch;
    c.op = &op;
    c.in[0] = dtk, c.in[1] = ddy, c.out[0] = ddw;
    c.co.tp = (int32_t)tp;
    c.grid_tp = tp + 1, c.grid_cp = 1;
    c.seq_length = S_;
    /* the position gradient: random rows, each plus its 4 rows of dy in order (float) */
    float *p0 = pos ? malloc((size_t)(S_ * h) * 4) : NULL, *p1 = pos ? malloc((size_t)(S_ * h) * 4) : NULL;
    void *ddp = NULL;
    if (pos) {
        ok = ok && p0 && p1 && !be->iface->arena_alloc(be, dpt->bytes, &ddp);
        c.out[1] = ddp;
    }
    for (int rep = 0; rep < 2 && ok; rep++) {
        ok = !be->iface->upload(be, ddw, w0, dw->bytes);
        if (pos && ok) {
            for (int64_t i = 0; i < S_ * h; i++) p0[i] = ofloat(2.0);
            ok = !be->iface->upload(be, ddp, p0, dpt->bytes);
        }
        if (ok && be->iface->run_op(be, &c)) {
            fprintf(stderr, "embedding_bwd: %s\n", be->err);
            ok = 0;
        }
        ok = ok && !be->iface->download(be, rep ? g2 : g1, ddw, dw->bytes);
        ok = ok && (!pos || !be->iface->download(be, p1, ddp, dpt->bytes));
    }
    T_CHECK(ok);
    int pos_exact = 1;
    for (int64_t i = 0; pos && ok && i < S_; i++)
        for (int64_t col = 0; col < h; col++) {
            float acc = p0[i * h + col];
            for (int j = 0; j < B; j++) acc += y[(i * B + j) * h + col];
            pos_exact &= memcmp(&acc, &p1[i * h + col], 4) == 0;
        }
    T_CHECK(pos_exact);
    if (pos)
        printf("embedding_bwd %s, %lld positions of %d rows: the position gradient %s\n",
               mgc_dtype_name((mgc_dtype)dy->dtype), (long long)S_, B,
               pos_exact ? "bit-identical to the rows added in order" : "DIFFERS");
    if (ddp) be->iface->arena_free(be, ddp);
    free(p0), free(p1);
    int64_t bad = 0;
    double worst = 0;
    for (int64_t i = 0; ok && i < Vl * h; i++) {
        double e = fabs(g1[i] - ref[i]);
        int fine = mag[i] == fabs(w0[i]) ? memcmp(&g1[i], &w0[i], 4) == 0 : e <= 1e-6 * mag[i];
        if (!fine && bad++ < 4)
            fprintf(stderr, "  case %d row %lld col %lld: %.9g, want %.9g\n", kase,
                    (long long)(i / h), (long long)(i % h), g1[i], ref[i]);
        if (mag[i] > 0 && e / mag[i] > worst) worst = e / mag[i];
    }
    T_EQ_I64(bad, 0);
    T_CHECK(ok && memcmp(g1, g2, (size_t)dw->bytes) == 0);
    /* The kernels' order, in float on the host: the rows sorted by (the token's id in the
     * shard, a token outside it as id Vl; row), each segment's pieces summed in order (a run's
     * first piece onto its gradient row, a later segment's head piece from zero), then each
     * crossing run's pieces added in segment order.  The result must be the GPU's bit for bit:
     * a missorted key changes the order, so the bits. */
    int exact = ok;
    {
        const int64_t S = MGC_KSPEC_EMB_SEG, G = (n + S - 1) / S;
        uint64_t *key = malloc((size_t)n * 8);
        float *sim = malloc((size_t)(Vl * h) * 4), *part = calloc((size_t)(G * h), 4);
        exact = exact && key && sim && part;
        for (int64_t r = 0; exact && r < n; r++) {
            int64_t v = tok[r] - tp * Vl;
            key[r] = (uint64_t)(v >= 0 && v < Vl ? v : Vl) << 32 | (uint64_t)r;
        }
        if (exact) {
            qsort(key, (size_t)n, 8, cmp_u64);
            memcpy(sim, w0, (size_t)(Vl * h) * 4);
        }
#define EMB_TOK(j) ((int64_t)(key[j] >> 32))
#define EMB_ROW(j) ((int64_t)(key[j] & 0xffffffffu))
        for (int64_t g = 0; exact && g < G; g++) {
            int64_t j0 = g * S, j1 = j0 + S < n ? j0 + S : n;
            int64_t cur = EMB_TOK(j0), v = cur;
            int head = j0 > 0 && EMB_TOK(j0 - 1) == cur;
            float *dst = head ? part + g * h : v >= 0 && v < Vl ? sim + v * h : NULL;
            for (int64_t col = 0; col < h; col++) {
                float acc = !head && dst ? dst[col] : 0.0f;
                int64_t t = cur;
                float *d = dst;
                for (int64_t j = j0; j < j1; j++) {
                    if (EMB_TOK(j) != t) {
                        if (d) d[col] = acc;
                        t = EMB_TOK(j);
                        int64_t u = t;
                        d = u >= 0 && u < Vl ? sim + u * h : NULL;
                        acc = d ? d[col] : 0.0f;
                    }
                    acc += y[EMB_ROW(j) * h + col];
                }
                if (d) d[col] = acc;
            }
        }
        for (int64_t g = 0; exact && g + 1 < G; g++) {
            int64_t last = (g + 1) * S - 1, t = EMB_TOK(last), v = t;
            if (EMB_TOK(last + 1) != t || (g > 0 && EMB_TOK(g * S - 1) == t && EMB_TOK(g * S) == t) ||
                v < 0 || v >= Vl)
                continue;
            for (int64_t q = g + 1; q < G && EMB_TOK(q * S) == t; q++)
                for (int64_t col = 0; col < h; col++) sim[v * h + col] += part[q * h + col];
        }
#undef EMB_TOK
#undef EMB_ROW
        exact = exact && memcmp(sim, g1, (size_t)(Vl * h) * 4) == 0;
        free(key), free(sim), free(part);
    }
    T_CHECK(exact);
    printf("embedding_bwd %s, %lld rows, case %d: %s (worst %.2e of the magnitudes), the kernels' "
           "order on the host %s, rerun %s\n",
           mgc_dtype_name((mgc_dtype)dy->dtype), (long long)n, kase, bad ? "DIFFERS" : "within rounding",
           worst, exact ? "bit-identical" : "DIFFERS",
           ok && memcmp(g1, g2, (size_t)dw->bytes) == 0 ? "bit-identical" : "DIFFERS");
    void *all[] = {dtk, ddy, ddw};
    for (int k = 0; k < 3; k++)
        if (all[k]) be->iface->arena_free(be, all[k]);
    free(tok), free(y), free(w0), free(g1), free(g2), free(hy), free(ref), free(mag), free(tv);
}

static void emb_cases(mgc_backend *be, const mgc_plan *p) {
    for (int kase = 0; kase < 11; kase++)
        check_emb_case(be, p, kase);
}

static void check_embedding_bwd(void) {
    static const char *const prec[2] = {"fp32", "bf16"};
    on_tiny_gpt("embedding_bwd", prec, 2, emb_cases);
}

/* ---- 7. the bias gradient -----------------------------------------------------------------
 * linear_wgrad's bias gradient: in 16-bit plans cuBLASLt's BGRADB (emulated on the CPU) into
 * scratch, added by bias_grad_finish, or stored into the gradient itself when it is the step's
 * first write (mgc_op_call.fresh); in fp32 and under MGC_GEMM_BGRAD=0 ours
 * (kernels/gemm_aux.cuh bias_grad_partial: row partitions of 8 lanes, 16-byte rows when
 * N % 8 == 0, their sums added by norm.cuh's norm_bwd_reduce).  Shapes: 256 partitions of 32 rows, a ragged last partition, columns past a
 * multiple of 8 (element by element) and past a 256-column block, a few rows; fp32 and bf16, onto random non-zero gradients, against
 * double-precision column sums; the weight gradient alongside. */

static void check_bgrad_case(mgc_backend *be, const mgc_plan *p, int64_t M, int64_t N) {
    mgc_plan_chunk ch;
    mgc_plan_tensor *tv;
    const mgc_plan_op *op0 =
        bwd_op_copy(&p->stages[0].chunks[0], MGC_POP_LINEAR_WGRAD, 2, &ch, &tv);
    if (!op0) return;
    const int64_t K = 16;
    mgc_plan_op op = *op0;
    op.iattr[0] = M, op.iattr[1] = N, op.iattr[2] = K;
    mgc_plan_tensor *ty = &tv[op.in[0]], *tx = &tv[op.in[1]], *tw = &tv[op.out[0]], *tb = &tv[op.out[1]];
    size_t es = mgc_dtype_size((mgc_dtype)ty->dtype);
    T_CHECK(tw->dtype == MGC_DT_F32 && tb->dtype == MGC_DT_F32 && tx->dtype == ty->dtype);
    ty->rank = tx->rank = tw->rank = 2, tb->rank = 1;
    ty->dim[0] = M, ty->dim[1] = N, tx->dim[0] = M, tx->dim[1] = K, tw->dim[0] = N, tw->dim[1] = K;
    tb->dim[0] = N;
    ty->ld = tx->ld = tw->ld = tb->ld = 0;
    ty->bytes = (uint64_t)(M * N) * es, tx->bytes = (uint64_t)(M * K) * es;
    tw->bytes = (uint64_t)(N * K) * 4, tb->bytes = (uint64_t)N * 4;
    float *y = malloc((size_t)(M * N) * 4), *x = malloc((size_t)(M * K) * 4);
    float *b0 = malloc((size_t)N * 4), *b1 = malloc((size_t)N * 4), *w0 = calloc((size_t)(N * K), 4);
    void *hy = malloc(ty->bytes), *hx = malloc(tx->bytes);
    int ok = y && x && b0 && b1 && w0 && hy && hx;
    for (int64_t i = 0; ok && i < M * N + M * K; i++) {
        float v = ofloat(1.0);
        int isy = i < M * N;
        void *h = isy ? hy : hx;
        int64_t j = isy ? i : i - M * N;
        if (es == 2) {
            uint16_t u = mgc_f32_to_bf16(v);
            ((uint16_t *)h)[j] = u;
            v = mgc_bf16_to_f32(u);
        } else {
            ((float *)h)[j] = v;
        }
        (isy ? y : x)[j] = v;
    }
    for (int64_t c = 0; ok && c < N; c++) b0[c] = ofloat(2.0);
    void *dy = NULL, *dx = NULL, *dw = NULL, *db = NULL;
    ok = ok && !be->iface->arena_alloc(be, ty->bytes, &dy) && !be->iface->arena_alloc(be, tx->bytes, &dx) &&
         !be->iface->arena_alloc(be, tw->bytes, &dw) && !be->iface->arena_alloc(be, tb->bytes, &db) &&
         !be->iface->upload(be, dy, hy, ty->bytes) && !be->iface->upload(be, dx, hx, tx->bytes) &&
         !be->iface->upload(be, dw, w0, tw->bytes) && !be->iface->upload(be, db, b0, tb->bytes);
    mgc_op_call c;
    memset(&c, 0, sizeof c);
    c.plan = p, c.chunk = &ch, c.op = &op;
    c.in[0] = dy, c.in[1] = dx, c.out[0] = dw, c.out[1] = db;
    c.grid_tp = c.grid_cp = 1;
    if (ok && be->iface->run_op(be, &c)) {
        fprintf(stderr, "linear_wgrad: %s\n", be->err);
        ok = 0;
    }
    ok = ok && !be->iface->download(be, b1, db, tb->bytes) && !be->iface->download(be, w0, dw, tw->bytes);
    T_CHECK(ok);
    int64_t bad = 0;
    double worst = 0;
    for (int64_t col = 0; ok && col < N; col++) {
        double ref = b0[col], mag = fabs(b0[col]);
        for (int64_t r = 0; r < M; r++) ref += y[r * N + col], mag += fabs(y[r * N + col]);
        double e = fabs(b1[col] - ref);
        if (!(e <= 2e-6 * mag) && bad++ < 4)
            fprintf(stderr, "  bias gradient M %lld N %lld col %lld: %.9g, want %.9g\n", (long long)M,
                    (long long)N, (long long)col, b1[col], ref);
        if (e / mag > worst) worst = e / mag;
    }
    for (int64_t i = 0; ok && i < N * K; i += 7) { /* the GEMM beside it, sampled */
        int64_t n = i / K, k = i % K;
        double ref = 0, mag = 0;
        for (int64_t r = 0; r < M; r++) ref += (double)y[r * N + n] * x[r * K + k], mag += fabs(y[r * N + n] * x[r * K + k]);
        if (!(fabs(w0[i] - ref) <= 1e-5 * mag + 1e-30) && bad++ < 4)
            fprintf(stderr, "  weight gradient M %lld N %lld (%lld,%lld): %.9g, want %.9g\n", (long long)M,
                    (long long)N, (long long)n, (long long)k, w0[i], ref);
    }
    T_EQ_I64(bad, 0);
    /* a first write (mgc_op_call.fresh: dW and db hold zeros): stored where the backend can
     * (the GEMM at beta 0 by beta 1's algorithm; in 16 bits BGRADB into db, no
     * bias_grad_finish), the bits of adding into zeros */
    float *b2 = calloc((size_t)N, 4), *b3 = calloc((size_t)N, 4);
    float *w2 = calloc((size_t)(N * K), 4), *w3 = calloc((size_t)(N * K), 4), *zero = calloc((size_t)(N * K), 4);
    int same = ok && b2 && b3 && w2 && w3 && zero;
    for (int fresh = 0; same && fresh < 2; fresh++) {
        c.fresh = fresh ? 3u : 0u;
        same = !be->iface->upload(be, db, zero, tb->bytes) && !be->iface->upload(be, dw, zero, tw->bytes) &&
               !be->iface->run_op(be, &c) && !be->iface->download(be, fresh ? b2 : b3, db, tb->bytes) &&
               !be->iface->download(be, fresh ? w2 : w3, dw, tw->bytes);
    }
    same = same && memcmp(b2, b3, (size_t)N * 4) == 0 && memcmp(w2, w3, (size_t)(N * K) * 4) == 0;
    for (int64_t col = 0; same && col < N; col++) same = b2[col] != 0.0f || y[col] == 0.0f;
    T_CHECK(same);
    free(b2), free(b3), free(w2), free(w3), free(zero);
    printf("linear_wgrad %s M %lld N %lld: bias gradient %s (worst %.2e of the magnitudes); as a "
           "first write %s\n",
           mgc_dtype_name((mgc_dtype)ty->dtype), (long long)M, (long long)N,
           bad ? "DIFFERS" : "within rounding", worst, same ? "bit-identical" : "DIFFERS");
    void *all[] = {dy, dx, dw, db};
    for (int k = 0; k < 4; k++)
        if (all[k]) be->iface->arena_free(be, all[k]);
    free(y), free(x), free(b0), free(b1), free(w0), free(hy), free(hx), free(tv);
}

static void bgrad_cases(mgc_backend *be, const mgc_plan *p) {
    static const int64_t shapes[5][2] = {{8192, 264}, {1000, 200}, {4096, 100}, {13, 24}, {300, 7}};
    for (int i = 0; i < 5; i++)
        check_bgrad_case(be, p, shapes[i][0], shapes[i][1]);
}

static void check_bias_grad(void) {
    static const char *const prec[2] = {"fp32", "bf16"};
    /* the op of the MLP's first linear, which keeps its bias gradient without that fusion
     * (tiny GPT's others go into the norm and attention backwards) */
    setenv("MGC_FUSION", "-dgrad_gelu_bias", 1);
    on_tiny_gpt("bias gradient", prec, 2, bgrad_cases);
    unsetenv("MGC_FUSION");
}

/* linear_dgrad_gelu with the MLP's first bias gradient (MGC_POF_COLSUM, fusion.c
 * dgrad_gelu_bias): dh (M, K) = gelu'(h) (dy W) and db (K) += the column sums of dh, on fresh
 * random inputs at shapes of their own (the bias width K from 7 to 200), against a double
 * reference from the inputs as stored: dh within the storage type's rounding of the products'
 * magnitudes, db within it of its terms' magnitudes; as a first write (mgc_op_call.fresh: db
 * holds zeros, the epilogue's sums stored in it) the bits of adding into zeros.  16-bit plans
 * take cuBLASLt's DGELU_BGRAD epilogue, or with MGC_GEMM_BGRAD=0 mgc's bias-gradient kernels
 * over dh; fp32 plans the plain GEMM, gelu_bwd and those kernels. */
static double dgelu_ref(double x) {
    const double c = 0.7978845608028654;
    double t = tanh(c * (x + 0.044715 * x * x * x));
    return 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * c * (1.0 + 3.0 * 0.044715 * x * x);
}

static float stored(void *h, int64_t i, size_t es, float v) { /* v as stored at h[i] */
    if (es == 4) return ((float *)h)[i] = v;
    uint16_t u = mgc_f32_to_bf16(v);
    ((uint16_t *)h)[i] = u;
    return mgc_bf16_to_f32(u);
}

static void check_dgelu_bgrad_case(mgc_backend *be, const mgc_plan *p, int64_t M, int64_t N,
                                   int64_t K) {
    mgc_plan_chunk ch;
    mgc_plan_tensor *tv;
    const mgc_plan_op *op0 =
        bwd_op_copy(&p->stages[0].chunks[0], MGC_POP_LINEAR_DGRAD_GELU, 2, &ch, &tv);
    if (!op0) return;
    mgc_plan_op op = *op0;
    T_CHECK((op.flags & MGC_POF_COLSUM) != 0);
    op.iattr[0] = M, op.iattr[1] = N, op.iattr[2] = K;
    mgc_plan_tensor *ty = &tv[op.in[0]], *tw = &tv[op.in[1]], *th = &tv[op.in[2]],
                    *td = &tv[op.out[0]], *tb = &tv[op.out[1]];
    size_t es = mgc_dtype_size((mgc_dtype)ty->dtype);
    T_CHECK(tb->dtype == MGC_DT_F32 && tw->dtype == ty->dtype && th->dtype == ty->dtype &&
            td->dtype == ty->dtype);
    ty->rank = tw->rank = th->rank = td->rank = 2, tb->rank = 1;
    ty->dim[0] = M, ty->dim[1] = N, tw->dim[0] = N, tw->dim[1] = K;
    th->dim[0] = td->dim[0] = M, th->dim[1] = td->dim[1] = K, tb->dim[0] = K;
    ty->ld = tw->ld = th->ld = td->ld = tb->ld = 0;
    ty->bytes = (uint64_t)(M * N) * es, tw->bytes = (uint64_t)(N * K) * es;
    th->bytes = td->bytes = (uint64_t)(M * K) * es, tb->bytes = (uint64_t)K * 4;
    float *y = malloc((size_t)(M * N) * 4), *w = malloc((size_t)(N * K) * 4),
          *h = malloc((size_t)(M * K) * 4), *b0 = malloc((size_t)K * 4), *b1 = malloc((size_t)K * 4);
    void *hy = malloc(ty->bytes), *hw = malloc(tw->bytes), *hh = malloc(th->bytes),
         *hd = malloc(td->bytes), *hd2 = malloc(td->bytes), *poison = malloc(td->bytes);
    int ok = y && w && h && b0 && b1 && hy && hw && hh && hd && hd2 && poison;
    /* dy and W of mean 0.5: dh's columns then sum to about half their magnitudes, so that a
     * bias gradient a few percent off shows beyond the rounding of dh's terms */
    for (int64_t i = 0; ok && i < M * N; i++) y[i] = stored(hy, i, es, 0.5f + ofloat(1.0));
    for (int64_t i = 0; ok && i < N * K; i++) w[i] = stored(hw, i, es, 0.5f + ofloat(1.0));
    for (int64_t i = 0; ok && i < M * K; i++) h[i] = stored(hh, i, es, ofloat(3.0));
    for (int64_t k = 0; ok && k < K; k++) b0[k] = ofloat(2.0);
    if (ok) memset(poison, 0xff, td->bytes);
    void *dy = NULL, *dw = NULL, *dh = NULL, *dd = NULL, *db = NULL;
    ok = ok && !be->iface->arena_alloc(be, ty->bytes, &dy) && !be->iface->arena_alloc(be, tw->bytes, &dw) &&
         !be->iface->arena_alloc(be, th->bytes, &dh) && !be->iface->arena_alloc(be, td->bytes, &dd) &&
         !be->iface->arena_alloc(be, tb->bytes, &db) && !be->iface->upload(be, dy, hy, ty->bytes) &&
         !be->iface->upload(be, dw, hw, tw->bytes) && !be->iface->upload(be, dh, hh, th->bytes) &&
         !be->iface->upload(be, dd, poison, td->bytes) && !be->iface->upload(be, db, b0, tb->bytes);
    mgc_op_call c;
    memset(&c, 0, sizeof c);
    c.plan = p, c.chunk = &ch, c.op = &op;
    c.in[0] = dy, c.in[1] = dw, c.in[2] = dh, c.out[0] = dd, c.out[1] = db;
    c.grid_tp = c.grid_cp = 1;
    if (ok && be->iface->run_op(be, &c)) {
        fprintf(stderr, "linear_dgrad_gelu: %s\n", be->err);
        ok = 0;
    }
    ok = ok && !be->iface->download(be, b1, db, tb->bytes) && !be->iface->download(be, hd, dd, td->bytes);
    T_CHECK(ok);
    const double tol = es == 2 ? 8e-3 : 1e-4;
    int64_t bad = 0;
    double worst = 0;
    double *ref = calloc((size_t)K, sizeof *ref), *mag = calloc((size_t)K, sizeof *mag);
    ok = ok && ref && mag;
    for (int64_t k = 0; ok && k < K; k++) ref[k] = b0[k], mag[k] = fabs(b0[k]);
    for (int64_t r = 0; ok && r < M; r++)
        for (int64_t k = 0; k < K; k++) {
            double g = 0, gm = 0, d = dgelu_ref(h[r * K + k]);
            for (int64_t n = 0; n < N; n++)
                g += (double)y[r * N + n] * w[n * K + k], gm += fabs((double)y[r * N + n] * w[n * K + k]);
            double want = g * d, got = es == 2 ? mgc_bf16_to_f32(((uint16_t *)hd)[r * K + k])
                                                : ((float *)hd)[r * K + k];
            ref[k] += want, mag[k] += fabs(want);
            if (!(fabs(got - want) <= tol * gm * (fabs(d) + 1e-3) + 1e-30) && bad++ < 4)
                fprintf(stderr, "  dh M %lld N %lld K %lld (%lld,%lld): %.9g, want %.9g\n",
                        (long long)M, (long long)N, (long long)K, (long long)r, (long long)k, got, want);
        }
    for (int64_t k = 0; ok && k < K; k++) {
        double e = fabs(b1[k] - ref[k]);
        if (!(e <= tol * mag[k]) && bad++ < 4)
            fprintf(stderr, "  bias gradient M %lld N %lld K %lld col %lld: %.9g, want %.9g\n",
                    (long long)M, (long long)N, (long long)K, (long long)k, b1[k], ref[k]);
        if (e / mag[k] > worst) worst = e / mag[k];
    }
    T_EQ_I64(bad, 0);
    /* a first write of db: the same bits as adding into zeros, in db and dh */
    float *b2 = calloc((size_t)K, 4), *b3 = calloc((size_t)K, 4), *zero = calloc((size_t)K, 4);
    int same = ok && b2 && b3 && zero;
    for (int fresh = 0; same && fresh < 2; fresh++) {
        c.fresh = fresh ? 2u : 0u;
        same = !be->iface->upload(be, db, zero, tb->bytes) && !be->iface->upload(be, dd, poison, td->bytes) &&
               !be->iface->run_op(be, &c) && !be->iface->download(be, fresh ? b2 : b3, db, tb->bytes) &&
               !be->iface->download(be, fresh ? hd2 : hd, dd, td->bytes);
    }
    same = same && memcmp(b2, b3, (size_t)K * 4) == 0 && memcmp(hd, hd2, td->bytes) == 0;
    for (int64_t k = 0; same && k < K; k++) same = b2[k] != 0.0f;
    T_CHECK(same);
    const char *bg = getenv("MGC_GEMM_BGRAD"), *rf = getenv("MGC_EMU_REFUSE_EPI");
    printf("linear_dgrad_gelu %s M %lld N %lld K %lld%s%s%s%s: dh and the bias gradient %s (worst "
           "%.2e of the magnitudes); as a first write %s\n",
           mgc_dtype_name((mgc_dtype)ty->dtype), (long long)M, (long long)N, (long long)K,
           bg && !strcmp(bg, "0") ? " (MGC_GEMM_BGRAD=0)" : "", rf ? " (refused: " : "",
           rf ? rf : "", rf ? ")" : "", bad ? "DIFFER" : "within rounding", worst,
           same ? "bit-identical" : "DIFFERS");
    void *all[] = {dy, dw, dh, dd, db};
    for (int k = 0; k < 5; k++)
        if (all[k]) be->iface->arena_free(be, all[k]);
    free(y), free(w), free(h), free(b0), free(b1), free(hy), free(hw), free(hh), free(hd);
    free(hd2), free(poison), free(ref), free(mag), free(b2), free(b3), free(zero), free(tv);
}

static void dgelu_bgrad_cases(mgc_backend *be, const mgc_plan *p) {
    static const int64_t shapes[4][3] = {{1000, 48, 200}, {4096, 32, 96}, {300, 16, 7}, {13, 24, 40}};
    for (int i = 0; i < 4; i++)
        check_dgelu_bgrad_case(be, p, shapes[i][0], shapes[i][1], shapes[i][2]);
}

static void check_dgelu_bias_grad(void) {
    static const char *const prec[2] = {"fp32", "bf16"};
    on_tiny_gpt("dgelu bias gradient", prec, 2, dgelu_bgrad_cases);
    /* 16 bits without the epilogue: mgc's kernels over dh as stored */
    static const char *const bf16[1] = {"bf16"};
    setenv("MGC_GEMM_BGRAD", "0", 1);
    on_tiny_gpt("dgelu bias gradient (MGC_GEMM_BGRAD=0)", bf16, 1, dgelu_bgrad_cases);
    unsetenv("MGC_GEMM_BGRAD");
    if (!emu) return;
    /* the fallbacks of a cuBLASLt without DGELU_BGRAD at these shapes (DGELU, then mgc's
     * kernels over dh), and without DGELU too (the plain GEMM, gelu_bwd, the kernels): the
     * emulated cuBLASLt refuses them as cuda_backend.c's does when its heuristic finds none */
    static const char *const refuse[2] = {"DGELU_BGRAD", "DGELU_BGRAD,DGELU"};
    for (int r = 0; r < 2; r++) {
        setenv("MGC_EMU_REFUSE_EPI", refuse[r], 1);
        on_tiny_gpt("dgelu bias gradient (MGC_EMU_REFUSE_EPI)", bf16, 1, dgelu_bgrad_cases);
    }
    /* a name it does not know: the backend does not open, and says which */
    setenv("MGC_EMU_REFUSE_EPI", "DGELU,BGRAD", 1);
    mgc_backend *be = NULL;
    char err[512] = "";
    T_CHECK(mgc_backend_emu_open(&be, err, sizeof err) != 0 && !be &&
            strstr(err, "MGC_EMU_REFUSE_EPI names no epilogue 'BGRAD'") != NULL);
    unsetenv("MGC_EMU_REFUSE_EPI");
}

/* ---- 1. op by op ------------------------------------------------------------------ */

/* the 16-bit twins: [0] bf16, [1] fp16 */
static const char *const half_name[2] = {"bf16", "fp16"};

typedef struct replay {
    const mgc_plan *plan16[2]; /* the same model in bf16 and fp16 (NULL: not replayed) */
    mgc_backend *gpu;
    void *arena32, *arena16[2]; /* bound workspaces of the plans */
    int stage;
    void *snap[MGC_PLAN_MAX_IO]; /* host copies of accumulating outputs before the op */
    void *in0;                   /* an in-place op's input before the op (the CPU's op
                                    overwrites it) */
    int64_t inplace;             /* in-place ops replayed */
    int ops, worst_op, unmatched;
    double worst32, worst16[2];
    char worst_name[256];
} replay;

static uint64_t tbytes(const mgc_plan_tensor *t) {
    return t->bytes;
}

static int accumulates(const mgc_plan_tensor *t) {
    return t->role == MGC_TR_GRAD;
}

static void before_op(void *ctx, const mgc_op_call *c) {
    replay *r = ctx;
    r->in0 = NULL;
    if (c->op->flags & MGC_POF_INPLACE) {
        const mgc_plan_tensor *t = &c->chunk->tensors[c->op->in[0]];
        r->in0 = malloc(tbytes(t));
        if (r->in0) memcpy(r->in0, c->in[0], tbytes(t));
    }
    for (int k = 0; k < c->op->n_out; k++) {
        r->snap[k] = NULL;
        const mgc_plan_tensor *t = &c->chunk->tensors[c->op->out[k]];
        /* poisoned on the CPU too, as on the GPU: rows the CPU's op leaves are then poison on
         * both sides, and compare() leaves them out.  Those are the rows of expert routing
         * past the live prefix over EP (MGC_PT_ROUTED, and capacity mode's blocks), whose
         * length is the step's counts; no op may read them, and a CPU op that read them (or
         * any output's stale bytes) would compute NaN */
        if (!accumulates(t) && !(k == 0 && r->in0)) memset(c->out[k], 0xff, tbytes(t));
        if (!accumulates(t)) continue;
        r->snap[k] = malloc(tbytes(t));
        if (r->snap[k]) memcpy(r->snap[k], c->out[k], tbytes(t));
    }
}

/* Host fp32 values of a tensor whose CPU twin is fp32 -> the device layout of `dt`. */
static void *to_device_layout(const void *cpu, const mgc_plan_tensor *tc, const mgc_plan_tensor *tg) {
    void *h = malloc(tg->bytes ? tg->bytes : 1);
    if (!h) return NULL;
    if ((tg->dtype == MGC_DT_BF16 || tg->dtype == MGC_DT_F16) && tc->dtype == MGC_DT_F32) {
        /* at tg's row pitch (plan.h ld), the gaps poisoned */
        const float *s = cpu;
        uint16_t *d = h;
        uint64_t w = (uint64_t)(tg->rank ? tg->dim[tg->rank - 1] : 1);
        uint64_t ld = (uint64_t)mgc_plan_tensor_ld(tg), n = mgc_plan_tensor_data_bytes(tg) / 2;
        if (ld != w) memset(h, 0xff, tg->bytes);
        for (uint64_t i = 0; i < n; i++)
            d[i / w * ld + i % w] =
                tg->dtype == MGC_DT_F16 ? mgc_f32_to_f16(s[i]) : mgc_f32_to_bf16(s[i]);
    } else {
        memcpy(h, cpu, tg->bytes < tc->bytes ? tg->bytes : tc->bytes);
    }
    return h;
}

/* 1 when the w floats at row are all NaN on the CPU: its op did not write the row (before_op's
 * poison), or computed it from such rows only (capacity mode's activations run over the
 * expert rows no token filled) */
static int dead_row(const float *row, uint64_t w) {
    for (uint64_t j = 0; j < w; j++)
        if (!isnan(row[j])) return 0;
    return 1;
}

/* The GPU tensor may have a row pitch (an in-place output, plan.h ld); the CPU's (fp32) has
 * none. */
/* The relative error of the GPU's output against the CPU's, in the 2-norm; `floor` (0: none)
 * is the 2-norm of what a reduction's result would be without cancellation: where the CPU's
 * result is below a thousandth of it, the terms cancelled and it is rounding noise of that
 * size, so the error is taken relative to the floor instead. */
static double compare(const void *gpu_host, const mgc_plan_tensor *tg, const void *cpu,
                      const mgc_plan_tensor *tc, double floor, int *bad_int, uint64_t *live) {
    uint64_t n = tc->bytes / mgc_dtype_size((mgc_dtype)tc->dtype);
    T_EQ_I64(tc->ld, 0);
    uint64_t w = (uint64_t)(tg->rank ? tg->dim[tg->rank - 1] : 1), ld = (uint64_t)mgc_plan_tensor_ld(tg);
    if (tc->dtype == MGC_DT_F32) {
        const float *b = cpu;
        double num = 0, den = 0;
        for (uint64_t i = 0; i < n; i++) {
            if (i % w == 0 && dead_row(b + i, w)) { /* a row the CPU did not write */
                i += w - 1;
                continue;
            }
            *live += i % w == 0;
            const uint16_t *h16 = gpu_host;
            uint64_t gi = i / w * ld + i % w;
            double a = tg->dtype == MGC_DT_BF16  ? mgc_bf16_to_f32(h16[gi])
                       : tg->dtype == MGC_DT_F16 ? mgc_f16_to_f32(h16[gi])
                                                 : ((const float *)gpu_host)[gi];
            if (!isfinite(a) && isfinite(b[i])) return INFINITY;
            num += (a - b[i]) * (a - b[i]);
            den += (double)b[i] * b[i];
        }
        /* a sum of rounded terms errs in proportion to the terms' magnitudes (floor), whatever
         * their cancellation leaves of the sum: measured against an eighth of those when the sum
         * is smaller. The rounding of 16-bit terms stays inside (4.4e-4 of the magnitudes at one
         * key head in bf16); a dropped row or a wrong column does not */
        if (den < floor * floor / 64) den = floor * floor / 64;
        return den > 0 ? sqrt(num / den) : sqrt(num);
    }
    if (memcmp(gpu_host, cpu, tc->bytes)) *bad_int = 1;
    *live = n > 0;
    return 0;
}

/* The op of plan gp's chunk that is c's op: the same kind, name and flags, and the same
 * occurrence among those in the same pass (the fp32 and bf16 plans of a model need not list
 * the same ops at the same indices).  NULL when gp has no such op. */
static const mgc_plan_op *same_op(const mgc_op_call *c, const mgc_plan *gp,
                                  const mgc_plan_chunk *gch) {
    const mgc_plan_chunk *ch = c->chunk;
    int fwd = c->op >= ch->fwd && c->op < ch->fwd + ch->n_fwd;
    const mgc_plan_op *ops = fwd ? ch->fwd : ch->bwd, *gops = fwd ? gch->fwd : gch->bwd;
    int64_t n = fwd ? ch->n_fwd : ch->n_bwd, gn = fwd ? gch->n_fwd : gch->n_bwd;
    const char *name = mgc_plan_strat(c->plan, c->op->name);
    int64_t nth = 0;
    for (int64_t i = 0; i < n && &ops[i] != c->op; i++)
        nth += ops[i].kind == c->op->kind && ops[i].flags == c->op->flags &&
               !strcmp(mgc_plan_strat(c->plan, ops[i].name), name);
    for (int64_t i = 0; i < gn; i++) {
        const mgc_plan_op *o = &gops[i];
        if (o->kind == c->op->kind && o->flags == c->op->flags &&
            !strcmp(mgc_plan_strat(gp, o->name), name) && nth-- == 0)
            return o;
    }
    return NULL;
}

/* half: -1 the fp32 plan, else the index of the 16-bit twin (half_name) */
static void run_on_gpu(replay *r, const mgc_op_call *c, const mgc_plan *gp, void *arena, int half) {
    const mgc_plan_chunk *gch = &gp->stages[r->stage].chunks[c->chunk - c->plan->stages[r->stage].chunks];
    const mgc_plan_op *gop = same_op(c, gp, gch);
    if (!gop || gop->n_in != c->op->n_in || gop->n_out != c->op->n_out) {
        r->unmatched++;
        return;
    }
    mgc_backend *be = r->gpu;
    be->iface->bind(be, gp, &gp->stages[r->stage], arena);
    mgc_op_call g = *c;
    g.plan = gp;
    g.chunk = gch;
    g.op = gop;
    void *dev[2 * MGC_PLAN_MAX_IO] = {0};
    int ok = 1;
    for (int k = 0; k < gop->n_in && ok; k++) {
        const mgc_plan_tensor *tg = &gch->tensors[gop->in[k]], *tc = &c->chunk->tensors[c->op->in[k]];
        ok = be->iface->arena_alloc(be, tg->bytes, &dev[k]) == 0;
        const void *v = k == 0 && r->in0 ? r->in0 : c->in[k]; /* before an in-place op */
        void *h = ok ? to_device_layout(v, tc, tg) : NULL;
        ok = ok && h && be->iface->upload(be, dev[k], h, tg->bytes) == 0;
        free(h);
        g.in[k] = dev[k];
    }
    for (int k = 0; k < gop->n_out && ok; k++) {
        const mgc_plan_tensor *tg = &gch->tensors[gop->out[k]], *tc = &c->chunk->tensors[c->op->out[k]];
        void *d = NULL;
        if (k == 0 && (gop->flags & MGC_POF_INPLACE)) {
            /* over the input's bytes, as in the arena: no poison can go there, but a column
             * the kernel did not write keeps half of an fp32 logit, far from its gradient */
            T_CHECK(tg->bytes == gch->tensors[gop->in[0]].bytes && r->in0);
            g.out[0] = dev[0];
            r->inplace++;
            continue;
        }
        ok = be->iface->arena_alloc(be, tg->bytes, &d) == 0;
        dev[MGC_PLAN_MAX_IO + k] = d;
        g.out[k] = d;
        void *h = malloc(tg->bytes ? tg->bytes : 1);
        ok = ok && h;
        if (ok) {
            if (r->snap[k] && tc->dtype == MGC_DT_F32) { /* accumulator: its value before the op */
                void *conv = to_device_layout(r->snap[k], tc, tg);
                memcpy(h, conv, tg->bytes);
                free(conv);
            } else {
                memset(h, 0xff, tg->bytes); /* poison: NaN in every float format */
            }
            ok = be->iface->upload(be, d, h, tg->bytes) == 0;
        }
        free(h);
    }
    char what[200];
    snprintf(what, sizeof what, "%s %s '%s'", half >= 0 ? half_name[half] : "fp32",
             mgc_plan_op_name((mgc_plan_op_kind)gop->kind), mgc_plan_strat(gp, gop->name));
    if (ok && be->iface->run_op(be, &g)) {
        fprintf(stderr, "%s: %s\n", what, be->err);
        ok = 0;
    }
    T_CHECK(ok);
    int kind = gop->kind;
    int gemmish = kind == MGC_POP_LINEAR || kind == MGC_POP_LINEAR_DGRAD || kind == MGC_POP_LINEAR_WGRAD ||
                  kind == MGC_POP_LINEAR_GELU || kind == MGC_POP_LINEAR_DGRAD_GELU ||
                  kind == MGC_POP_ATTENTION || kind == MGC_POP_ATTENTION_BWD ||
                  (kind >= MGC_POP_GROUPED_LINEAR && kind <= MGC_POP_GROUPED_LINEAR_WGRAD) ||
                  kind == MGC_POP_GROUPED_LINEAR_DGRAD || kind == MGC_POP_GROUPED_LINEAR_WGRAD ||
                  kind == MGC_POP_EMBEDDING_BWD || kind == MGC_POP_NORM_BWD;
    double tol = half >= 0 ? 1e-2 : gemmish ? 3e-5 : 1e-5;
    /* bf16 attention backward: P and dS are rounded to bf16 before the tensor-core products,
     * and dQ sums rows of them, after dS's cancellation (P (dP - rowsum(dO o O))).  Measured on
     * the emulator: 1.37e-2 at head dim 128 where fp16 (3 more mantissa bits) gives 1.70e-3;
     * 2.03e-2 at head dim 64 over 8 tokens with query/key norms and attention dropout (the
     * sweep's seed 12061, draw 0) where fp16 gives 1.82e-3: the 8x of rounding, not of a wrong
     * index (a wrong one gives O(1), a missing row of 24 about 0.2). */
    if (half == 0 && kind == MGC_POP_ATTENTION_BWD) tol = 3e-2;
    for (int k = 0; k < gop->n_out && ok; k++) {
        const mgc_plan_tensor *tg = &gch->tensors[gop->out[k]], *tc = &c->chunk->tensors[c->op->out[k]];
        void *h = malloc(tg->bytes ? tg->bytes : 1);
        if (!h || be->iface->download(be, h, g.out[k], tg->bytes)) {
            T_CHECK(0);
            free(h);
            continue;
        }
        int bad_int = 0;
        /* a norm's bias gradient sums the rows of dy; a key norm's cancel (softmax ignores a
         * shift every key shares, so the exact gradient is 0, and what is left is rounding):
         * its floor is the rows' sum of |dy| a channel.  Likewise a linear's bias gradient
         * fused in (MGC_POF_COLSUM): the rows of dx (or of the dropout's dbr), which the GPU
         * sums as rounded to 16 bits */
        double floor = 0;
        mgc_norm_bwd_io io;
        int nbw = kind == MGC_POP_NORM_BWD && mgc_plan_norm_bwd_io(gop, &io) == 0;
        int colsum = nbw && k == io.cs;
        if (nbw && (k == io.db || colsum)) {
            const float *dy = colsum ? c->out[io.dbr >= 0 ? io.dbr : 0] : c->in[2];
            int64_t rows = c->op->iattr[1], w = c->op->iattr[2];
            for (int64_t j = 0; j < w; j++) {
                double col = 0;
                for (int64_t i = 0; i < rows; i++)
                    col += fabs(dy[i * w + j]);
                floor += col * col;
            }
            floor = sqrt(floor);
        }
        uint64_t live = 0;
        double e = compare(h, tg, c->out[k], tc, floor, &bad_int, &live);
        /* some row compared: a CPU output left all poison (or NaN) would make the check empty */
        T_CHECK(live > 0 || tc->bytes == 0);
        if (!(e <= tol) && tg->dtype == MGC_DT_F32 && tc->dtype == MGC_DT_F32) {
            /* the first elements that differ, with the value the output held before */
            const float *a = h, *b = c->out[k], *s0 = r->snap[k];
            int shown = 0;
            for (uint64_t i = 0; i < tc->bytes / 4 && shown < 4; i++)
                if (fabs(a[i] - b[i]) > 1e-4 * (fabs(b[i]) + 1e-3)) {
                    fprintf(stderr, "  [%llu] gpu %.6g cpu %.6g before %.6g\n", (unsigned long long)i,
                            a[i], b[i], s0 ? s0[i] : 0.0f);
                    shown++;
                }
        }
        free(h);
        if (half >= 0 && bad_int) bad_int = 0; /* 16-bit rounding may flip a router's near tie */
        if (!(e <= tol) || bad_int) {
            fprintf(stderr, "%s output %d (%s): relative error %.3g > %.0e%s\n", what, k,
                    mgc_plan_strat(gp, tg->name), e, tol, bad_int ? " (integers differ)" : "");
        }
        T_CHECK(e <= tol);
        T_CHECK(!bad_int);
        if (half >= 0 ? e > r->worst16[half] : e > r->worst32) {
            if (half >= 0) r->worst16[half] = e;
            else r->worst32 = e;
            snprintf(r->worst_name, sizeof r->worst_name, "%s", what);
        }
    }
    for (int k = 0; k < 2 * MGC_PLAN_MAX_IO; k++)
        if (dev[k]) be->iface->arena_free(be, dev[k]);
}

static void after_op(void *ctx, const mgc_op_call *c) {
    replay *r = ctx;
    r->ops++;
    run_on_gpu(r, c, c->plan, r->arena32, -1);
    for (int h = 0; h < 2; h++)
        if (r->plan16[h]) run_on_gpu(r, c, r->plan16[h], r->arena16[h], h);
    for (int k = 0; k < MGC_PLAN_MAX_IO; k++) {
        free(r->snap[k]);
        r->snap[k] = NULL;
    }
    free(r->in0);
    r->in0 = NULL;
}

/* One rank's replay of one training step (a thread of its own when the plan has several
 * ranks): the CPU backend runs the step over `world`, the hooks replay each of its ops on this
 * rank's own GPU backend, with this rank's coordinates (the vocabulary shard, the context
 * positions, the dropout numbering), in fp32 and the 16-bit twins. */
typedef struct rank_replay {
    const char *path;
    const mgc_plan *p32, *p16[2];
    mgc_comm *world;
    int64_t rank;
    mgc_coords co;
    replay r;
    int64_t prog_ops; /* the ops of the rank's stage's programs */
    int ok;           /* the step ran */
} rank_replay;

static void *replay_rank(void *arg) {
    rank_replay *rr = arg;
    replay *r = &rr->r;
    const mgc_plan *p32 = rr->p32;
    char err[4096];
    mgc_backend *cpu = NULL, *gpu = NULL;
    mgc_exec *x = NULL;
    mgc_train_data *data = NULL;
    int64_t pp = rr->co.pp;
    r->stage = (int)pp;
    r->plan16[0] = getenv("MGC_TEST_NO_BF16_OPS") ? NULL : rr->p16[0];
    r->plan16[1] = getenv("MGC_TEST_NO_FP16_OPS") ? NULL : rr->p16[1];
    if (mgc_backend_cpu_open(&cpu, err, sizeof err) || open_gpu(&gpu, err, sizeof err) || !gpu) {
        fprintf(stderr, "%s rank %lld: %s\n", rr->path, (long long)rr->rank, err);
        mgc_comm_abort(rr->world, "cannot open a backend");
        goto done;
    }
    r->gpu = gpu;
    if (gpu->iface->arena_alloc(gpu, p32->stages[pp].arena_bytes, &r->arena32) ||
        gpu->iface->arena_alloc(gpu, rr->p16[0]->stages[pp].arena_bytes, &r->arena16[0]) ||
        gpu->iface->arena_alloc(gpu, rr->p16[1]->stages[pp].arena_bytes, &r->arena16[1])) {
        mgc_comm_abort(rr->world, "cannot allocate the arenas");
        goto done;
    }
    if (mgc_exec_open(&x, p32, rr->world, cpu, err, sizeof err) || mgc_exec_init_params(x) ||
        mgc_train_data_open(&data, p32, 1, err, sizeof err)) {
        fprintf(stderr, "%s rank %lld: %s%s\n", rr->path, (long long)rr->rank, err,
                x ? mgc_exec_error(x) : "");
        mgc_comm_abort(rr->world, "cannot open the step");
        goto done;
    }
    /* the backward's values scaled by 2^12, as fp16 training scales them: unscaled, the tiny
     * models' gradients (~1e-6) would sit in fp16's subnormals and the fp16 replay would
     * measure fp16's range, not the kernels (a power of two: exact in fp32 and bf16) */
    mgc_exec_set_loss_scaling(x, 4096, 1000, 2);
    mgc_exec_set_op_hooks(x, before_op, after_op, r);
    mgc_step_stats st;
    if (mgc_exec_step(x, 0, mgc_train_data_sample, data, &st)) {
        fprintf(stderr, "%s rank %lld: %s\n", rr->path, (long long)rr->rank, mgc_exec_error(x));
        mgc_comm_abort(rr->world, "the step failed"); /* the other ranks stop waiting */
    } else
        rr->ok = 1;
    for (int64_t ci = 0; ci < p32->stages[pp].n_chunks; ci++) { /* the compute ops */
        const mgc_plan_chunk *ch = &p32->stages[pp].chunks[ci];
        for (int64_t i = 0; i < ch->n_fwd + ch->n_bwd; i++)
            rr->prog_ops +=
                (i < ch->n_fwd ? ch->fwd[i] : ch->bwd[i - ch->n_fwd]).kind < MGC_POP_ALL_REDUCE;
    }
done:
    mgc_exec_free(x);
    mgc_train_data_free(data);
    if (r->arena32) gpu->iface->arena_free(gpu, r->arena32);
    for (int h = 0; h < 2; h++)
        if (r->arena16[h]) gpu->iface->arena_free(gpu, r->arena16[h]);
    mgc_backend_close(gpu);
    mgc_backend_close(cpu);
    return NULL;
}

/* Every op of one training step of the model at `path` (with `extra` set), replayed on the GPU
 * and compared with the CPU's (section 1).  A layout of several ranks runs them as threads over
 * a local world, each replaying its own ops: the kernels that depend on a rank's place (the
 * embedding's and the cross-entropy's vocabulary shard, the context positions of the embedding
 * and the attention, every dropout's numbering, a bias only tensor rank 0 adds, the experts a
 * rank holds) are compared there, op by op, which a layout's losses see only in sum. */
static void check_ops(const char *path, const char *const *extra) {
    mgc_plan *p32 = compile(path, "fp32", extra), *p16[2] = {compile(path, "bf16", extra),
                                                             compile(path, "fp16", extra)};
    T_CHECK(p32 && p16[0] && p16[1]);
    int64_t n = p32 ? p32->grid.world : 0;
    rank_replay *rr = n > 0 ? calloc((size_t)n, sizeof *rr) : NULL;
    mgc_comm **world = n > 0 ? calloc((size_t)n, sizeof *world) : NULL;
    pthread_t *th = n > 0 ? calloc((size_t)n, sizeof *th) : NULL;
    char err[4096];
    if (!p32 || !p16[0] || !p16[1] || !rr || !world || !th) goto out;
    T_EQ_I64(p16[0]->grid.world, n);
    T_EQ_I64(p16[1]->grid.world, n);
    if (mgc_comm_local_world_create((int)n, NULL, world, err, sizeof err) != MGC_COMM_OK) {
        fprintf(stderr, "%s: %s\n", path, err);
        T_CHECK(0);
        goto out;
    }
    int started = 0;
    for (int64_t k = 0; k < n; k++) {
        rr[k] = (rank_replay){.path = path, .p32 = p32, .p16 = {p16[0], p16[1]}, .world = world[k],
                              .rank = k};
        T_EQ_I64(mgc_grid_coords(&p32->grid, k, &rr[k].co), 0);
        if (n == 1) {
            replay_rank(&rr[0]);
            started = 1;
        } else if (pthread_create(&th[k], NULL, replay_rank, &rr[k]) == 0) {
            started++;
        } else {
            mgc_comm_abort(world[k], "cannot start a rank thread");
            break;
        }
    }
    for (int k = 0; n > 1 && k < started; k++)
        pthread_join(th[k], NULL);
    T_EQ_I64(started, n);
    int64_t last_pp = p32->grid.pp - 1;
    for (int k = 0; k < started; k++) {
        const replay *r = &rr[k].r;
        char who[96] = "";
        if (n > 1)
            snprintf(who, sizeof who, " rank %d (tp %lld cp %lld dp %lld pp %lld ep %lld)", k,
                     (long long)rr[k].co.tp, (long long)rr[k].co.cp, (long long)rr[k].co.dp,
                     (long long)rr[k].co.pp, (long long)rr[k].co.ep);
        printf("%s%s: %d ops replayed on the %s (%d twins not found); worst relative error fp32 "
               "%.2e, bf16 %.2e, fp16 %.2e (%s)\n",
               path, who, r->ops, emu ? "CUDA emulator" : "GPU", r->unmatched, r->worst32,
               r->worst16[0], r->worst16[1], r->worst_name);
        T_CHECK(rr[k].ok);
        /* every op of the step's programs went through the hooks, once a microbatch at least
         * (a stage of an explicit pipeline_layout may hold only the loss: a few ops) */
        T_CHECK(rr[k].prog_ops > 0 && r->ops >= rr[k].prog_ops);
        /* cross_entropy_bwd over the logits, on the last stage */
        if (rr[k].co.pp == last_pp) T_CHECK(r->inplace > 0);
    }
out:
    if (world)
        for (int64_t k = 0; k < n; k++)
            mgc_comm_free(world[k]);
    free(world);
    free(rr);
    free(th);
    mgc_plan_free(p32);
    mgc_plan_free(p16[0]);
    mgc_plan_free(p16[1]);
}

/* ---- 1b. the fold of a device communicator's reductions (kernels/comm.cuh) ------------- */

/* The backend's fold against comm.c's host fold, bit for bit: fp32, bf16 and fp16; 1 to 5
 * parts; counts around the 8-element vectors; parts a padded stride apart (the vector path),
 * packed, or at an odd stride, and dst/src at odd element offsets (the element path); sums,
 * and maxima with NaN and infinities among the operands; dst poisoned first, and the element
 * past it must keep its poison. */
/* Bit for bit, except that two NaNs are the same: a sum of +inf and -inf makes the processor's
 * default NaN (x86: 0xffc00000; a GPU: 0x7fffffff), and the conversions to 16 bits keep a NaN's
 * payload on the host and write the canonical NaN on a GPU (bf16 0x7fff, fp16 0x7fff). */
static int fold_same(const unsigned char *a, const unsigned char *b, size_t bytes, mgc_dtype dt) {
    size_t es = mgc_dtype_size(dt);
    for (size_t i = 0; i + es <= bytes; i += es) {
        if (!memcmp(a + i, b + i, es)) continue;
        float x, y;
        if (dt == MGC_DT_F32) {
            memcpy(&x, a + i, 4), memcpy(&y, b + i, 4);
        } else {
            uint16_t u, v;
            memcpy(&u, a + i, 2), memcpy(&v, b + i, 2);
            x = dt == MGC_DT_BF16 ? mgc_bf16_to_f32(u) : mgc_f16_to_f32(u);
            y = dt == MGC_DT_BF16 ? mgc_bf16_to_f32(v) : mgc_f16_to_f32(v);
        }
        if (!(isnan(x) && isnan(y))) return 0;
    }
    return 1;
}

static void check_fold(void) {
    char err[512];
    mgc_backend *be = NULL;
    if (open_gpu(&be, err, sizeof err)) {
        fprintf(stderr, "fold: %s\n", err);
        T_CHECK(0);
        return;
    }
    enum { MAXN = 4099, MAXP = 5, ROOM = MAXP * (MAXN + 16) + 64 };
    static const size_t counts[] = {1, 7, 8, 9, 37, 1000, MAXN};
    static const mgc_dtype dts[] = {MGC_DT_F32, MGC_DT_BF16, MGC_DT_F16};
    unsigned char *hs = malloc(ROOM * 4), *hd = malloc(ROOM * 4), *hr = malloc(ROOM * 4);
    void *arena = NULL;
    int cases = 0, bad = 0;
    if (!hs || !hd || !hr || be->iface->arena_alloc(be, 2 * (uint64_t)ROOM * 4 + 4096, &arena)) {
        T_CHECK(0);
        goto out;
    }
    unsigned char *ds = arena, *dd = ds + ((size_t)ROOM * 4 + 255) / 256 * 256; /* 256-aligned */
    for (int t = 0; t < 3; t++) {
        mgc_dtype dt = dts[t];
        size_t es = mgc_dtype_size(dt);
        for (int parts = 1; parts <= MAXP; parts++)
            for (size_t ci = 0; ci < sizeof counts / sizeof counts[0]; ci++)
                for (int layout = 0; layout < 4; layout++)
                    for (int op = 0; op < 2; op++) {
                        size_t n = counts[ci], pad = (n + 7) / 8 * 8;
                        /* 0 padded (vectors), 1 packed, 2 odd stride, 3 odd offsets */
                        size_t stride = layout == 0 || layout == 3 ? pad : layout == 1 ? n : n + 3;
                        size_t off = layout == 3 ? 1 : 0;
                        size_t m = (size_t)parts * stride + off;
                        for (size_t i = 0; i < m; i++) {
                            float v = ofloat(4.0);
                            uint64_t r = onext() % 97;
                            if (op && r == 0)
                                v = NAN;
                            else if (r == 1)
                                v = INFINITY;
                            else if (r == 2)
                                v = -INFINITY;
                            if (dt == MGC_DT_F32)
                                memcpy(hs + i * 4, &v, 4);
                            else {
                                uint16_t u =
                                    dt == MGC_DT_BF16 ? mgc_f32_to_bf16(v) : mgc_f32_to_f16(v);
                                memcpy(hs + i * 2, &u, 2);
                            }
                        }
                        memset(hr, 0x5a, (n + off + 1) * es); /* the poison */
                        T_EQ_I64(mgc_comm_fold_host(NULL, hr + off * es, hs + off * es, parts, n,
                                                    stride, dt, op ? MGC_COMM_MAX : MGC_COMM_SUM),
                                 0);
                        memset(hd, 0x5a, (n + off + 1) * es);
                        if (be->iface->upload(be, ds, hs, m * es) ||
                            be->iface->upload(be, dd, hd, (n + off + 1) * es) ||
                            be->iface->fold(be, dd + off * es, ds + off * es, parts, n, stride,
                                            (int)dt, op) ||
                            be->iface->download(be, hd, dd, (n + off + 1) * es)) {
                            fprintf(stderr, "fold: %s\n", be->err);
                            T_CHECK(0);
                            goto out;
                        }
                        cases++;
                        if (!fold_same(hd, hr, (n + off + 1) * es, dt)) {
                            if (bad++ < 5)
                                fprintf(stderr,
                                        "fold %s parts %d count %zu stride %zu offset %zu "
                                        "%s: differs from the host fold\n",
                                        mgc_dtype_name(dt), parts, n, stride, off,
                                        op ? "max" : "sum");
                        }
                    }
    }
    T_EQ_I64(bad, 0);
    printf("fold (kernels/comm.cuh) on %s: %d cases (3 types, 1-5 parts, vector and element "
           "paths, sums and NaN maxima) bit-identical to the host fold\n",
           gpu_name(), cases);
out:
    if (arena) be->iface->arena_free(be, arena);
    mgc_backend_close(be);
    free(hs), free(hd), free(hr);
}

/* ---- 2. training ------------------------------------------------------------------- */

static int no_overlap;        /* 1: gradient buckets reduced in line (check_layout) */
static int devcomm;           /* 1: a device communicator (train: a moves-only local world) */
static int64_t overlapped[STEPS]; /* rank 0's buckets reduced beside the backward, last run */

static int train(const mgc_plan *p, const char *backend, double *loss, double *norms) {
    char err[4096];
    mgc_train_data *data = NULL;
    if (mgc_train_data_open(&data, p, steps, err, sizeof err)) {
        fprintf(stderr, "data: %s\n", err);
        return -1;
    }
    mgc_train_opts o = MGC_TRAIN_OPTS_INIT;
    o.iterations = steps;
    o.losses = loss;
    o.grad_norms = norms;
    o.backend = backend;
    o.no_grad_overlap = no_overlap;
    o.overlapped = overlapped;
    if (devcomm) o.device_comm = emu ? "local" : "nccl";
    memset(overlapped, 0, sizeof overlapped);
    for (int i = 0; i < STEPS; i++)
        loss[i] = norms[i] = NAN;
    int rc = mgc_train_local(p, data, (int)p->grid.world, &o, err, sizeof err);
    if (rc) fprintf(stderr, "train (%s): %s\n", backend, err);
    mgc_train_data_free(data);
    return rc;
}

static void check_training(const char *path, const char *const *extra) {
    static const char *const prec[3] = {"fp32", "bf16", "fp16"};
    static const double tol[3] = {1e-4, 3e-2, 3e-2};
    mgc_plan *p[3];
    for (int k = 0; k < 3; k++)
        p[k] = compile(path, prec[k], extra);
    T_CHECK(p[0] && p[1] && p[2]);
    if (!p[0] || !p[1] || !p[2]) goto out;
    double cpu[STEPS], cn[STEPS], g[3][STEPS], gb[3][STEPS], gn[3][STEPS], w[3] = {0, 0, 0};
    T_EQ_I64(train(p[0], "cpu", cpu, cn), 0);
    int same = 1;
    for (int k = 0; k < 3; k++) {
        T_EQ_I64(train(p[k], gpu_name(), g[k], gn[k]), 0);
        setenv("MGC_EMU_SEED", "2", 1); /* on the emulator, blocks and threads in other orders */
        T_EQ_I64(train(p[k], gpu_name(), gb[k], cn), 0);
        unsetenv("MGC_EMU_SEED");
        for (int i = 0; i < steps; i++) {
            double e = fabs(g[k][i] - cpu[i]) / fabs(cpu[i]);
            T_NEAR_REL(g[k][i], cpu[i], tol[k]);
            T_CHECK(isfinite(gn[k][i])); /* fp16: no step skipped by loss scaling */
            if (e > w[k] || !(e == e)) w[k] = e;
        }
        T_CHECK(memcmp(g[k], gb[k], (size_t)steps * sizeof g[k][0]) == 0);
        same = same && !memcmp(g[k], gb[k], (size_t)steps * sizeof g[k][0]);
        if (k > 0 && steps == STEPS) T_CHECK(g[k][steps - 1] < g[k][0] - 0.3);
        if (k == 0) continue;
        /* the logits' gradient in a tensor of its own (MGC_INPLACE=0) instead of over the
         * logits at a row pitch: the same kernel arithmetic and, on the emulator, the same
         * GEMM loops, so the same bits; cuBLASLt may pick another algorithm for another
         * leading dimension, so on a GPU only the CPU's tolerance */
        setenv("MGC_INPLACE", "0", 1);
        mgc_plan *o = compile(path, prec[k], extra);
        unsetenv("MGC_INPLACE");
        double go[STEPS];
        T_CHECK(o && train(o, gpu_name(), go, cn) == 0);
        for (int i = 0; o && i < steps; i++) T_NEAR_REL(go[i], cpu[i], tol[k]);
        int ident = o && !memcmp(go, g[k], (size_t)steps * sizeof go[0]);
        if (emu) T_CHECK(ident);
        printf("%s %s: the logits' gradient in place and in its own tensor: %s\n", path,
               prec[k], ident ? "bit-identical losses" : "losses differ (within tolerance)");
        mgc_plan_free(o);
        if (k != 1) continue;
        /* the embedding and the first norm as two kernels (MGC_FUSION=-embedding_norm): the
         * fused kernel rounds x as embedding_fwd stores it and normalises it as the plain norm
         * does, so the same bits, on the GPU too (no GEMM changes) */
        setenv("MGC_FUSION", "-embedding_norm", 1);
        mgc_plan *e = compile(path, prec[k], extra);
        unsetenv("MGC_FUSION");
        double ge[STEPS];
        T_CHECK(e && train(e, gpu_name(), ge, cn) == 0);
        int eq = e && !memcmp(ge, g[k], (size_t)steps * sizeof ge[0]);
        T_CHECK(eq);
        printf("%s %s: the embedding and first norm fused and as two kernels: %s\n", path, prec[k],
               eq ? "bit-identical losses" : "losses DIFFER");
        mgc_plan_free(e);
        /* every gradient added into, none stored by its first writer (MGC_GRAD_FRESH=0: the
         * bias gradients through bias_grad_finish in the first microbatch too): the same
         * losses and gradient norms (two microbatches a step: a first write stored in the
         * second would lose the first's share) */
        setenv("MGC_GRAD_FRESH", "0", 1);
        double gf[STEPS], nf[STEPS];
        T_CHECK(train(p[k], gpu_name(), gf, nf) == 0);
        unsetenv("MGC_GRAD_FRESH");
        int fr = !memcmp(gf, g[k], (size_t)steps * sizeof gf[0]) && !memcmp(nf, gn[k], (size_t)steps * sizeof nf[0]);
        T_CHECK(fr);
        printf("%s %s: the gradients' first writes stored and added (MGC_GRAD_FRESH=0): %s\n", path,
               prec[k], fr ? "bit-identical losses and norms" : "losses or norms DIFFER");
    }
    printf("%s: %d steps: cpu %.5f -> %.5f; %s worst rel fp32 %.2e, bf16 %.2e (%.5f -> %.5f), "
           "fp16 %.2e (%.5f -> %.5f); reruns %s\n",
           path, steps, cpu[0], cpu[steps - 1], gpu_name(), w[0], w[1], g[1][0], g[1][steps - 1],
           w[2], g[2][0], g[2][steps - 1], same ? "bit-identical" : "DIFFER");
out:
    for (int k = 0; k < 3; k++)
        mgc_plan_free(p[k]);
}

/* ---- 2a. checkpoints of 16-bit plans ----------------------------------------------- */

/* Trains p on `backend` to step `until` with checkpoints in dir (docs/checkpoints.md). */
static int train_ckpt(const mgc_plan *p, const char *backend, const char *dir, int64_t until, double *loss,
                      int64_t *resumed) {
    char err[4096];
    mgc_train_data *data = NULL;
    if (mgc_train_data_open(&data, p, steps, err, sizeof err)) return -1;
    double norms[STEPS];
    mgc_train_opts o = MGC_TRAIN_OPTS_INIT;
    o.iterations = until;
    o.losses = loss;
    o.grad_norms = norms;
    o.backend = backend;
    o.checkpoint_dir = dir;
    o.resumed_from = resumed;
    for (int i = 0; i < STEPS; i++)
        loss[i] = NAN;
    int rc = mgc_train_local(p, data, (int)p->grid.world, &o, err, sizeof err);
    if (rc) fprintf(stderr, "train (%s, checkpoints in %s): %s\n", backend, dir, err);
    mgc_train_data_free(data);
    return rc;
}

static int same_bytes(const char *a, const char *b) {
    FILE *f = fopen(a, "rb"), *g = fopen(b, "rb");
    int same = f && g;
    while (same) {
        int ca = fgetc(f), cb = fgetc(g);
        same = ca == cb;
        if (ca == EOF || cb == EOF) break;
    }
    if (f) fclose(f);
    if (g) fclose(g);
    return same;
}

/* bf16 and fp16 plans (the master copy, the weights rounded from it, fp16's loss-scale state):
 * stopped half way and resumed = unbroken, bit for bit and byte for byte; and a checkpoint of
 * the CPU's fp32 run resumed in bf16 tracks the bf16 run. */
static void check_checkpoints(const char *path) {
    int half = steps / 2;
    char a[64], b[64], c[64], fa[256], fb[256], cmd[300];
    mgc_plan *fp32 = compile(path, "fp32", NULL);
    T_CHECK(fp32 != NULL);
    for (int k = 0; k < 2 && fp32; k++) {
        mgc_plan *p = compile(path, half_name[k], NULL);
        T_CHECK(p != NULL);
        if (!p) continue;
        snprintf(a, sizeof a, "/tmp/mgc-ck-XXXXXX"), snprintf(b, sizeof b, "/tmp/mgc-ck-XXXXXX");
        T_CHECK(mkdtemp(a) && mkdtemp(b));
        double la[STEPS], lb[STEPS], l1[STEPS];
        int64_t r = -1;
        T_EQ_I64(train_ckpt(p, gpu_name(), a, steps, la, &r), 0);
        T_EQ_I64(train_ckpt(p, gpu_name(), b, half, l1, &r), 0);
        T_EQ_I64(train_ckpt(p, gpu_name(), b, steps, lb, &r), 0);
        T_EQ_I64(r, half);
        int same = !memcmp(la + half, lb + half, (size_t)(steps - half) * sizeof *la);
        snprintf(fa, sizeof fa, "%s/step-%09d.mgck", a, steps), snprintf(fb, sizeof fb, "%s/step-%09d.mgck", b, steps);
        int bytes = same_bytes(fa, fb);
        T_CHECK(same && bytes);
        /* fp32 (the CPU) to step `half`, resumed here in this precision */
        snprintf(c, sizeof c, "/tmp/mgc-ck-XXXXXX");
        T_CHECK(mkdtemp(c) != NULL);
        double lc[STEPS], lr[STEPS];
        T_EQ_I64(train_ckpt(fp32, "cpu", c, half, lc, &r), 0);
        T_EQ_I64(train_ckpt(p, gpu_name(), c, steps, lr, &r), 0);
        T_EQ_I64(r, half);
        double worst = 0;
        for (int i = half; i < steps; i++) {
            T_NEAR_REL(lr[i], la[i], 3e-2);
            double e = fabs(lr[i] - la[i]) / fabs(la[i]);
            if (e > worst || e != e) worst = e;
        }
        printf("%s %s checkpoints: resumed at step %d, steps %d-%d %s, final files %s; resumed "
               "from the CPU's fp32 checkpoint: within %.2e of the %s run\n",
               path, half_name[k], half, half + 1, steps, same ? "bit-identical" : "DIFFER",
               bytes ? "byte-identical" : "DIFFER", worst, half_name[k]);
        snprintf(cmd, sizeof cmd, "rm -rf %s %s %s", a, b, c);
        T_EQ_I64(system(cmd), 0);
        mgc_plan_free(p);
    }
    mgc_plan_free(fp32);
}

/* Evaluation (docs/runtime.md) on this backend: dropout off through the kernels without it
 * (compiled on first use: the plan has the dropout ones), no update; against the CPU's fp32
 * evaluation of the same model within the precision's tolerance. */
static void check_eval(const char *path) {
    static const char *const ev[] = {"training.eval_interval=1", "training.eval_iters=1",
                                     "model.hidden_dropout=0.1", "model.attention_dropout=0.1", NULL};
    static const double tol[3] = {1e-4, 3e-2, 3e-2};
    mgc_plan *cpu = compile(path, "fp32", ev);
    T_CHECK(cpu != NULL);
    double lc[STEPS], ec[STEPS];
    char err[4096];
    for (int k = 0; k < 3 && cpu; k++) {
        static const char *const prec[3] = {"fp32", "bf16", "fp16"};
        mgc_plan *p = compile(path, prec[k], ev);
        T_CHECK(p != NULL);
        if (!p) continue;
        double l[STEPS], e[STEPS], norms[STEPS];
        for (int pass = 0; pass < (k == 0 ? 2 : 1); pass++) {
            const mgc_plan *q = pass ? cpu : p;
            mgc_train_data *data = NULL;
            T_CHECK(mgc_train_data_open(&data, q, 2, err, sizeof err) == 0);
            mgc_train_opts o = MGC_TRAIN_OPTS_INIT;
            o.iterations = 2;
            o.losses = pass ? lc : l;
            o.grad_norms = norms;
            o.eval_losses = pass ? ec : e;
            o.backend = pass ? "cpu" : gpu_name();
            int rc = data ? mgc_train_local(q, data, 1, &o, err, sizeof err) : -1;
            if (rc) fprintf(stderr, "evaluation (%s): %s\n", o.backend, err);
            T_EQ_I64(rc, 0);
            mgc_train_data_free(data);
        }
        if (k == 0) /* the CPU's reference ran second, in the same loop */
            printf("%s: evaluation on the CPU: %.6f, %.6f\n", path, ec[0], ec[1]);
        for (int i = 0; i < 2; i++)
            T_NEAR_REL(e[i], ec[i], tol[k]);
        printf("%s %s evaluation on %s: %.6f, %.6f (CPU fp32 %.6f, %.6f)\n", path, prec[k], gpu_name(), e[0],
               e[1], ec[0], ec[1]);
        mgc_plan_free(p);
    }
    mgc_plan_free(cpu);
}

/* ---- 2b. several ranks on the GPU ---------------------------------------------------- */

/* Parallel layouts on the CUDA backend, every rank a thread on this GPU (local ranks): the
 * communication is staged through host memory (docs/runtime.md), so the losses must track
 * the CPU backend's run of the same layout; the gradient buckets go through the transfer
 * stream beside the backward, and a rerun that reduces them in line must give the same bits. */
static void check_layout(const char *path, const char *precision, const char *const *sets, double tol,
                         int hands) {
    mgc_plan *gp = compile(path, precision, sets), *cp = compile(path, "fp32", sets);
    T_CHECK(gp && cp);
    if (gp && cp) {
        double cpu[STEPS], cn[STEPS], g[STEPS], gn[STEPS], g2[STEPS], gn2[STEPS], worst = 0;
        T_EQ_I64(train(cp, "cpu", cpu, cn), 0);
        T_EQ_I64(train(gp, gpu_name(), g, gn), 0);
        int64_t handed = 0;
        for (int i = 0; i < steps; i++)
            handed += overlapped[i];
        if (hands) T_CHECK(handed > 0); /* buckets went through the transfer stream */
        /* the rerun reduces the buckets in line: the same bits; on the emulator its kernels'
         * blocks and threads in other orders too (MGC_EMU_SEED), as a GPU's schedule varies */
        no_overlap = 1;
        setenv("MGC_EMU_SEED", "2", 1);
        T_EQ_I64(train(gp, gpu_name(), g2, gn2), 0);
        unsetenv("MGC_EMU_SEED");
        no_overlap = 0;
        for (int i = 0; i < steps; i++) {
            T_NEAR_REL(g[i], cpu[i], tol);
            double e = fabs(g[i] - cpu[i]) / fabs(cpu[i]);
            if (e > worst || !(e == e)) worst = e;
        }
        size_t nb = (size_t)steps * sizeof g[0];
        T_CHECK(memcmp(g, g2, nb) == 0 && memcmp(gn, gn2, nb) == 0);
        /* every gradient added into (MGC_GRAD_FRESH=0): the same bits, whatever chunk's first
         * backward of the step comes where in the layout's schedule */
        double g3[STEPS], gn3[STEPS];
        setenv("MGC_GRAD_FRESH", "0", 1);
        T_EQ_I64(train(gp, gpu_name(), g3, gn3), 0);
        unsetenv("MGC_GRAD_FRESH");
        int fr = !memcmp(g, g3, nb) && !memcmp(gn, gn3, nb);
        T_CHECK(fr);
        printf("%s (%s), world %lld:", path, precision, (long long)gp->grid.world);
        for (int i = 0; sets[i]; i++)
            printf(" %s", sets[i]);
        printf(": %s vs cpu worst rel %.2e; %lld buckets beside the backward; rerun without "
               "grad overlap %s; without first writes stored %s\n", gpu_name(), worst, (long long)handed,
               memcmp(g, g2, nb) ? "DIFFERS" : "bit-identical", fr ? "bit-identical" : "DIFFERS");
    }
    mgc_plan_free(gp);
    mgc_plan_free(cp);
}

/* context parallelism on the 16-bit tensor-core attention (head dim 32): positions computed in
 * the kernels (ROWPOS = 0), keys all-gathered from both ranks */
static const char *const cp2d32[] = {"parallel.world_size=2", "parallel.context=2",
                                     "model.hidden_size=128", "model.num_attention_heads=4", NULL};

/* expert tensor parallelism (expert_tensor defaults to tensor) beside expert parallelism, with
 * the experts' biases: the rows all-gathered and reduce-scattered over ETP in variable sizes,
 * fc2's bias added on expert-tensor rank 0 */
static const char *const etp2ep2[] = {"parallel.world_size=4", "parallel.tensor=2",
                                      "parallel.sequence_parallel=true", "parallel.data=2",
                                      "parallel.expert=2", "model.add_bias_linear=true", NULL};
static const char *const moe_bias[] = {"model.add_bias_linear=true", NULL};
/* multi-query attention over two tensor ranks: the key/value head (and its bias) replicated,
 * its gradient summed over the ranks sharing it */
static const char *const mqa_tp2[] = {"parallel.world_size=2", "parallel.tensor=2",
                                      "model.num_query_groups=1", NULL};

/* dropout in a tensor x context layout (runtime/rng.h): the attention kernels number the
 * probabilities by the model's head and the positions, and the hidden dropout runs in two
 * launches where a shard straddles the context rank's two chunks (tp3: the middle shard);
 * fp32, so that a mask differing from the CPU's (about 1e-3 in the loss) cannot hide */
static const char *const drop_tp3cp2[] = {"parallel.world_size=6", "parallel.tensor=3",
                                          "parallel.sequence_parallel=true", "parallel.context=2",
                                          "model.hidden_dropout=0.1", "model.attention_dropout=0.1",
                                          NULL};

/* documents (data.reset_attention_mask): the attention kernels mask the keys before each
 * query's document start (MGC_DOCS), over the context-parallel positions too */
static const char *const docs_cp2[] = {"parallel.world_size=2", "parallel.context=2",
                                       "data.reset_attention_mask=true",
                                       "data.reset_position_ids=true", NULL};

/* the query and key norms (model.qk_layernorm): the norm kernels over head_dim rows, their
 * weights' gradients partial over the tensor ranks (summed through host memory) */
static const char *const qk_tp2[] = {"parallel.world_size=2", "parallel.tensor=2",
                                     "model.qk_layernorm=true", NULL};

static void check_layouts(void) {
    static const char *const tp2sp[] = {"parallel.world_size=2", "parallel.tensor=2",
                                        "parallel.sequence_parallel=true", NULL};
    static const char *const pp2i[] = {"parallel.world_size=2", "parallel.pipeline=2",
                                       "parallel.virtual_stages=2", NULL};
    static const char *const dp2d[] = {"parallel.world_size=2", "parallel.data=2",
                                       "parallel.distributed_optimizer=true",
                                       "parallel.grad_bucket_size=50000", NULL};
    static const char *const cp2[] = {"parallel.world_size=2", "parallel.context=2", NULL};
    static const char *const all8[] = {"parallel.world_size=8", "parallel.tensor=2",
                                       "parallel.pipeline=2", "parallel.data=2",
                                       "parallel.grad_bucket_size=20000", NULL};
    static const char *const ep2[] = {"parallel.world_size=2", "parallel.data=2",
                                      "parallel.expert=2", NULL};
    check_layout("examples/tiny-gpt.yaml", "fp32", tp2sp, 1e-4, 0);
    check_layout("examples/tiny-gpt.yaml", "fp32", pp2i, 1e-4, 0);
    check_layout("examples/tiny-gpt.yaml", "fp32", dp2d, 1e-4, 1);
    check_layout("examples/tiny-gpt.yaml", "fp32", cp2, 1e-4, 0);
    check_layout("examples/tiny-gpt.yaml", "fp32", all8, 1e-4, 1);
    check_layout("examples/tiny-gpt.yaml", "bf16", all8, 3e-2, 1);
    check_layout("models/tiny-llama.yaml", "bf16", tp2sp, 3e-2, 0);
    check_layout("models/tiny-moe.yaml", "fp32", ep2, 1e-4, 1);
    check_layout("models/tiny-moe.yaml", "bf16", etp2ep2, 3e-2, 1);
    check_layout("examples/tiny-gpt.yaml", "bf16", mqa_tp2, 3e-2, 0);
    check_layout("examples/tiny-gpt.yaml", "bf16", cp2d32, 3e-2, 0);
    check_layout("examples/tiny-gpt.yaml", "fp32", drop_tp3cp2, 1e-5, 0);
    check_layout("models/tiny-llama.yaml", "fp32", docs_cp2, 1e-5, 0);
    check_layout("examples/tiny-gpt.yaml", "fp32", docs_cp2, 1e-5, 0);
    check_layout("models/tiny-llama.yaml", "bf16", qk_tp2, 3e-2, 0);
}

/* ---- 3. CUDA graphs ------------------------------------------------------------------ */

/* Trains `n` steps of p on the GPU (or the emulator, whose graphs record the launches'
 * arguments as a capture does: emu_backend.c), with graphs or not; losses and norms out, the programs replayed from graphs over the run, and in
 * exec_zeroed the gradient bytes a step zeroed (mgc_exec_zeroed_bytes); on the emulator, in
 * exec_dyn the dynamic shared memory its launches asked for (mgc_emu_stats). */
static uint64_t exec_zeroed;
static int64_t exec_dyn;
static int train_exec(const mgc_plan *p, int graphs, int n, double *loss, double *norm,
                      int64_t *replays) {
    char err[4096];
    mgc_backend *gpu = NULL;
    mgc_comm *w[1] = {NULL};
    mgc_exec *x = NULL;
    mgc_train_data *data = NULL;
    int rc = -1;
    *replays = 0;
    if (open_gpu(&gpu, err, sizeof err) ||
        mgc_comm_local_world_create(1, NULL, w, err, sizeof err) != MGC_COMM_OK ||
        mgc_exec_open(&x, p, w[0], gpu, err, sizeof err) || mgc_exec_init_params(x) ||
        mgc_train_data_open(&data, p, n, err, sizeof err))
        goto out;
    mgc_exec_set_graphs(x, graphs);
    for (int i = 0; i < n; i++) {
        mgc_step_stats st;
        if (mgc_exec_step(x, i, mgc_train_data_sample, data, &st)) {
            snprintf(err, sizeof err, "%s", mgc_exec_error(x));
            goto out;
        }
        loss[i] = st.loss, norm[i] = st.grad_norm;
        *replays += st.graph_replays;
    }
    exec_zeroed = mgc_exec_zeroed_bytes(x);
    mgc_emu *em = mgc_backend_emu_emulator(gpu);
    if (em) {
        mgc_emu_stats es;
        mgc_emu_get_stats(em, &es);
        exec_dyn = es.dyn_bytes;
    }
    rc = 0;
out:
    if (rc) fprintf(stderr, "train_exec: %s\n", err);
    mgc_exec_free(x);
    mgc_comm_free(w[0]);
    mgc_train_data_free(data);
    mgc_backend_close(gpu);
    return rc;
}

/* --cuda-graphs: the recorded programs replay to the same bits as eager runs, and they do
 * replay (every tiny-gpt program qualifies, with dropout too). */
/* The device communicator (exec.h mgc_exec_set_device_comm): the collectives on the GPU's
 * memory through NCCL (on the emulator: a moves-only local world on its host-addressable
 * arena), reductions folded by kernels/comm.cuh in group-rank order -- bf16 activations
 * widened and rounded once, as the host path does -- so the losses are the host
 * communicator's bit for bit.  On a GPU this needs a GPU per rank (NCCL refuses two ranks on
 * one device in a process). */
static void check_device_comm(const char *path, const char *const *sets) {
    mgc_plan *p = compile(path, "bf16", sets);
    T_CHECK(p != NULL);
    if (!p) return;
    int n = mgc_backend_cuda_devices();
    if (!emu && n < p->grid.world) {
        printf("%s: device communicator: %d GPUs for %lld ranks: skipped\n", path, n,
               (long long)p->grid.world);
        mgc_plan_free(p);
        return;
    }
    double a[STEPS], an[STEPS], b[STEPS], bn[STEPS];
    T_EQ_I64(train(p, gpu_name(), a, an), 0);
    devcomm = 1;
    T_EQ_I64(train(p, gpu_name(), b, bn), 0);
    devcomm = 0;
    int same =
        !memcmp(a, b, (size_t)steps * sizeof a[0]) && !memcmp(an, bn, (size_t)steps * sizeof an[0]);
    T_CHECK(same);
    printf("%s bf16 world %lld: device communicator on %s: %d steps %s the host communicator's "
           "(loss %.5f -> %.5f)\n",
           path, (long long)p->grid.world, gpu_name(), steps,
           same ? "bit-identical to" : "DIFFER from", b[0], b[steps - 1]);
    mgc_plan_free(p);
}

static void check_graphs(void) {
    static const char *const nodrop[] = {"model.hidden_dropout=0", "model.attention_dropout=0", NULL};
    /* with dropout: the kernels read the step from the backend's memory (set before each
     * program), so the programs are recorded and draw each step's masks when replayed */
    static const char *const drop[] = {"model.hidden_dropout=0.1", "model.attention_dropout=0.1", NULL};
    static const char *const names[3] = {"fp32", "bf16", "bf16 with dropout 0.1"};
    for (int k = 0; k < 3; k++) {
        mgc_plan *p = compile("examples/tiny-gpt.yaml", k ? "bf16" : "fp32", k == 2 ? drop : nodrop);
        T_CHECK(p != NULL);
        if (!p) continue;
        enum { N = 6 };
        double l0[N], n0[N], l1[N], n1[N];
        int64_t r0 = 0, r1 = 0;
        int n = emu ? 4 : N; /* on the emulator: recorded at step 1, replayed at 2 and 3 */
        memset(l1, 0, sizeof l1), memset(n1, 0, sizeof n1);
        memcpy(l0, l1, sizeof l0), memcpy(n0, n1, sizeof n0);
        T_EQ_I64(train_exec(p, 0, n, l0, n0, &r0), 0);
        T_EQ_I64(train_exec(p, 1, n, l1, n1, &r1), 0);
        T_EQ_I64(r0, 0);
        T_EQ_I64(r1, 4 * (n - 2)); /* 2 microbatches x (forward, backward), from step 2 on */
        T_CHECK(memcmp(l0, l1, sizeof l0) == 0 && memcmp(n0, n1, sizeof n0) == 0);
        printf("cuda graphs (%s) on %s: %lld programs replayed over %d steps, losses and norms %s\n",
               names[k], gpu_name(), (long long)r1, n,
               memcmp(l0, l1, sizeof l0) || memcmp(n0, n1, sizeof n0) ? "DIFFER" : "bit-identical");
        mgc_plan_free(p);
    }
}

/* The attention kernels' twins for GPUs with 100 KB of shared memory a multiprocessor
 * (kspec.h mgc_kspec_twin: one buffer of tiles where the default has two in dynamic shared
 * memory, past head dim 64 to 128): the plan carries them, and they train to the defaults'
 * bits, eagerly and from graphs, chosen by the knobs (MGC_ATT_FWD_BUFS=1 MGC_ATT_DKV_BUFS=1,
 * on a GPU too) and by the launcher on a device of 100 KB (a GPU posing as one,
 * MGC_CUDA_SMEM_PER_SM=102400, its launches padded to that occupancy; the emulator's
 * MGC_EMU_SMEM_PER_SM=102400), which on the emulator must launch what the knobs do at head
 * dim 128 (the same dynamic shared memory, less than the defaults') and at 96 the forward's
 * twin alone.
 * LLaMA at head dim 128 with two query heads a key head, and GPT at 96 with the QKV bias's
 * column sums in the dK/dV kernel. */
static void check_twins(void) {
    static const char *const llama[] = {"model.hidden_size=256", "model.num_attention_heads=2",
                                        "model.num_query_groups=1", "model.num_layers=2", NULL};
    static const char *const gpt[] = {"model.hidden_size=192", "model.num_attention_heads=2",
                                      "model.num_layers=2", "model.hidden_dropout=0",
                                      "model.attention_dropout=0", NULL};
    static const char *const files[2] = {"models/tiny-llama.yaml", "examples/tiny-gpt.yaml"};
    const char *const *sets[2] = {llama, gpt};
    for (int m = 0; m < 2; m++) {
        mgc_plan *p = compile(files[m], "bf16", sets[m]);
        T_CHECK(p != NULL);
        if (!p) continue;
        int twins = 0;
        for (int64_t i = 0; i < p->n_kernels; i++) {
            const char *nm = mgc_plan_strat(p, p->kernels[i].name);
            size_t n = strlen(nm);
            twins += (n > 6 && !strcmp(nm + n - 6, "_FKVB1")) ||
                     (n > 5 && !strcmp(nm + n - 5, "_KVB1"));
        }
        if (!emu) T_EQ_I64(twins, 2 * 2); /* forward and dK/dV, sm_80 and sm_90 */
        enum { N = 3 }; /* eager, recorded, replayed */
        double l0[N], n0[N], l1[N], n1[N];
        int64_t r0 = 0, r1 = 0, dyn0 = 0, dyn1 = 0;
        T_EQ_I64(train_exec(p, 1, N, l0, n0, &r0), 0);
        dyn0 = exec_dyn;
        T_CHECK(isfinite(l0[N - 1]) && l0[N - 1] < l0[0]);
        for (int v = 0; v < 2; v++) {
            if (v == 0) setenv("MGC_ATT_FWD_BUFS", "1", 1), setenv("MGC_ATT_DKV_BUFS", "1", 1);
            else setenv(emu ? "MGC_EMU_SMEM_PER_SM" : "MGC_CUDA_SMEM_PER_SM", "102400", 1);
            mgc_plan *q = v == 0 ? compile(files[m], "bf16", sets[m]) : NULL; /* its kernels */
            T_EQ_I64(train_exec(q ? q : p, 1, N, l1, n1, &r1), 0);
            mgc_plan_free(q);
            unsetenv("MGC_ATT_FWD_BUFS"), unsetenv("MGC_ATT_DKV_BUFS");
            unsetenv("MGC_EMU_SMEM_PER_SM"), unsetenv("MGC_CUDA_SMEM_PER_SM");
            int same = !memcmp(l0, l1, sizeof l0) && !memcmp(n0, n1, sizeof n0);
            T_CHECK(same);
            T_EQ_I64(r1, r0);
            if (emu) {
                T_CHECK(exec_dyn < dyn0); /* the twins' tiles are static */
                if (v == 0) dyn1 = exec_dyn;
                else if (m == 0) T_EQ_I64(exec_dyn, dyn1); /* the knobs' kernels */
                else T_CHECK(exec_dyn > dyn1); /* D 96: the forward's twin only (53,248
                                                  bytes, one block in 100 KB), not the
                                                  dK/dV kernel's (39,936: two blocks) */
            }
            printf("twins (%s bf16, %s): %d steps, %lld programs replayed, %s the defaults (loss "
                   "%.5f -> %.5f)\n",
                   files[m], v ? "a device of 100 KB a multiprocessor" : "MGC_ATT_*_BUFS=1", N,
                   (long long)r1, same ? "bit-identical to" : "DIFFER from", l0[0], l0[N - 1]);
        }
        mgc_plan_free(p);
    }
    if (!emu) return;
    /* a size no multiprocessor has: the emulator's backend does not open, and says why */
    static const char *const bad[3] = {"100k", "8192", ""};
    for (int i = 0; i < 3; i++) {
        setenv("MGC_EMU_SMEM_PER_SM", bad[i], 1);
        mgc_backend *be = NULL;
        char err[512] = "";
        int rc = mgc_backend_emu_open(&be, err, sizeof err);
        unsetenv("MGC_EMU_SMEM_PER_SM");
        if (i < 2)
            T_CHECK(rc != 0 && !be && strstr(err, "MGC_EMU_SMEM_PER_SM=") && strstr(err, "102400"));
        else /* empty: the default */
            T_CHECK(rc == 0 && be);
        mgc_backend_close(be);
    }
}

/* Programmatic dependent launch (MGC_PDL=1; docs/cuda-backend.md): every kernel launched to
 * start while the one before it still runs, waiting in mgc_pdl_begin before it touches
 * memory; and the gradients zeroed on a stream of their own beside the forward
 * (MGC_ZERO_BESIDE=1, with MGC_ZERO_LIST=0: the whole buffer, as zero_beside takes it), the
 * backward fenced after it; and both.  The same kernels in the same
 * order, so the bits of ordinary launches, eagerly and replayed from graphs; tiny MoE adds
 * the host's reads of the experts' row counts between kernels.  A GPU before sm_90 launches
 * the ordinary way (the backend ignores MGC_PDL). */
static void check_pdl(void) {
    static const char *const nodrop[] = {"model.hidden_dropout=0", "model.attention_dropout=0", NULL};
    static const char *const files[2] = {"examples/tiny-gpt.yaml", "models/tiny-moe.yaml"};
    static const char *const envs[3][2] = {{"MGC_PDL", NULL}, {"MGC_ZERO_BESIDE", NULL},
                                           {"MGC_PDL", "MGC_ZERO_BESIDE"}};
    for (int k = 0; k < 2; k++) {
        mgc_plan *p = compile(files[k], "bf16", nodrop);
        T_CHECK(p != NULL);
        if (!p) continue;
        enum { N = 6 };
        double l0[N], n0[N], l1[N], n1[N], l2[N], n2[N];
        int64_t r0 = 0, r1 = 0, r2 = 0;
        T_EQ_I64(train_exec(p, 0, N, l0, n0, &r0), 0);
        T_CHECK(isfinite(l0[N - 1]) && l0[N - 1] < l0[0]);
        for (int v = 0; v < 3; v++) {
            for (int j = 0; j < 2; j++)
                if (envs[v][j]) setenv(envs[v][j], "1", 1);
            if (v > 0) setenv("MGC_ZERO_LIST", "0", 1);
            T_EQ_I64(train_exec(p, 0, N, l1, n1, &r1), 0);
            T_EQ_I64(train_exec(p, 1, N, l2, n2, &r2), 0);
            for (int j = 0; j < 2; j++)
                if (envs[v][j]) unsetenv(envs[v][j]);
            unsetenv("MGC_ZERO_LIST");
            int same = !memcmp(l0, l1, sizeof l0) && !memcmp(n0, n1, sizeof n0) &&
                       !memcmp(l0, l2, sizeof l0) && !memcmp(n0, n2, sizeof n0);
            T_CHECK(same);
            printf("%s=1%s%s%s (%s bf16): %d steps eager and with graphs (%lld programs replayed) %s "
                   "ordinary launches (loss %.5f -> %.5f)\n",
                   envs[v][0], envs[v][1] ? " " : "", envs[v][1] ? envs[v][1] : "",
                   envs[v][1] ? "=1" : "", files[k], N,
                   (long long)r2, same ? "bit-identical to" : "DIFFER from", l0[0], l0[N - 1]);
        }
        mgc_plan_free(p);
    }
}

/* GEMM tuning (runtime/gemm_tuning.h): MGC_GEMM_TUNE times cuBLASLt's candidates in a run
 * and writes the file, saving and restoring each GEMM's outputs around the timing (so that
 * run trains as an untuned one does: its losses and gradient norms within bf16's rounding of
 * one, where timed GEMMs accumulating into the gradients would multiply the norms); runs under
 * MGC_GEMM_TUNING use the file's choices, eagerly and with graphs to the same bits, within
 * rounding of the untuned run; a file for another GPU is ignored (the untuned bits); a
 * malformed one stops the backend from opening, with the file's name. */
static void check_tune(void) {
    static const char *const nodrop[] = {"model.hidden_dropout=0", "model.attention_dropout=0", NULL};
    mgc_plan *p = compile("examples/tiny-gpt.yaml", "bf16", nodrop);
    T_CHECK(p != NULL);
    if (!p) return;
    char dir[] = "/tmp/mgc-tune-XXXXXX", path[256], other[256], bad[256], err[4096];
    T_CHECK(mkdtemp(dir) != NULL);
    snprintf(path, sizeof path, "%s/t.txt", dir);
    snprintf(other, sizeof other, "%s/other.txt", dir);
    snprintf(bad, sizeof bad, "%s/bad.txt", dir);
    enum { N = 6 };
    double l0[N], n0[N], lt[N], nt[N], l1[N], n1[N], l2[N], n2[N], l3[N], n3[N];
    int64_t r = 0;
    T_EQ_I64(train_exec(p, 0, N, l0, n0, &r), 0);
    setenv("MGC_GEMM_TUNE", path, 1);
    T_EQ_I64(train_exec(p, 0, N, lt, nt, &r), 0);
    unsetenv("MGC_GEMM_TUNE");
    mgc_gemm_tuning *t = NULL;
    T_EQ_I64(mgc_gemm_tuning_load(path, &t, err, sizeof err), 0);
    int64_t shapes = t ? t->n : 0, moved = 0;
    for (int64_t i = 0; t && i < t->n; i++)
        moved += t->e[i].pick != 0;
    T_CHECK(shapes > 0);
    setenv("MGC_GEMM_TUNING", path, 1);
    T_EQ_I64(train_exec(p, 0, N, l1, n1, &r), 0);
    T_EQ_I64(train_exec(p, 1, N, l2, n2, &r), 0);
    unsetenv("MGC_GEMM_TUNING");
    int same = !memcmp(l1, l2, sizeof l1) && !memcmp(n1, n2, sizeof n1);
    T_CHECK(same);
    for (int i = 0; i < N; i++) {
        T_NEAR_REL(lt[i], l0[i], 3e-2);
        T_NEAR_REL(nt[i], n0[i], 5e-2);
        T_NEAR_REL(l1[i], l0[i], 3e-2);
        T_NEAR_REL(n1[i], n0[i], 5e-2);
    }
    /* the same file said to be another GPU's: ignored, cuBLASLt's first choices, their bits */
    if (t) {
        snprintf(t->device, sizeof t->device, "Another GPU");
        T_EQ_I64(mgc_gemm_tuning_save(t, other, err, sizeof err), 0);
    }
    setenv("MGC_GEMM_TUNING", other, 1);
    T_EQ_I64(train_exec(p, 0, N, l3, n3, &r), 0);
    T_CHECK(!memcmp(l3, l0, sizeof l0) && !memcmp(n3, n0, sizeof n0));
    /* a malformed file: the backend does not open, and says which file */
    FILE *f = fopen(bad, "w");
    if (f) {
        fputs("mgc-gemm-tuning 1\ndevice x\ncublaslt 1\nworkspace 1\ngemm 1 2 3\n", f);
        fclose(f);
    }
    setenv("MGC_GEMM_TUNING", bad, 1);
    mgc_backend *be = NULL;
    err[0] = 0;
    T_CHECK(mgc_backend_cuda_open(&be, 0, err, sizeof err) != 0 && strstr(err, "bad.txt:5:"));
    if (be) mgc_backend_close(be);
    unsetenv("MGC_GEMM_TUNING");
    printf("GEMM tuning (tiny GPT bf16): %lld shapes timed, %lld on another candidate than "
           "cuBLASLt's first; the tuning run within rounding of an untuned one; runs with the "
           "file %s eagerly and with graphs (loss %.5f -> %.5f, untuned %.5f -> %.5f); another "
           "GPU's file ignored; a malformed one refused\n",
           (long long)shapes, (long long)moved, same ? "bit-identical" : "DIFFER", l1[0], l1[N - 1],
           l0[0], l0[N - 1]);
    mgc_gemm_tuning_free(t);
    unlink(path), unlink(other), unlink(bad);
    rmdir(dir);
    mgc_plan_free(p);
}

/* The head in three row chunks (compiler/losschunk.h): the mask count (ce_count), and each
 * chunk's GEMMs and cross-entropy on row views -- at tensor parallel 1 the statistics fused
 * into the backward (ce_fused); the norms and GELUs recomputed in the backward by their
 * unfused kernels, the dropout masks drawn again there.  `all` adds a vocabulary of 60,000 (15
 * steps of ce_fused's in-place pass a row, the later ones writing over columns earlier steps
 * read) and the two ops unfused (MGC_CE_FUSE=0): test_cuda chunks (and the GPU run) takes
 * them, CI's emulator run (ci) only the first, for time. */
static const char *const chunks3[] = {"training.loss_chunks=3", "model.hidden_dropout=0.1",
                                      "training.recompute_modules=[norm, activation, dropout]",
                                      NULL};
static void check_chunks(int all) {
    static const char *const wide[] = {"training.loss_chunks=2", "model.vocab_size=60000", NULL};
    check_ops("examples/tiny-gpt.yaml", chunks3);
    if (!all) return;
    check_ops("examples/tiny-gpt.yaml", wide);
    setenv("MGC_CE_FUSE", "0", 1);
    check_ops("examples/tiny-gpt.yaml", chunks3);
    unsetenv("MGC_CE_FUSE");
}

/* ---- 2f. the step's zeroing of the gradients their first writes do not store ------------
 * (exec_setup.c setup_zero_list; backend.h stores_fresh, zero_list).  Tiny GPT in bf16 with dropout
 * off, and tiny MoE with 32 experts, top 1, over 16 tokens a microbatch (experts that receive
 * no row: their dW written as zeros), 3 steps on one rank, through the executor: with the
 * defaults only the complement of the weight gradients' bytes is zeroed (less than a quarter
 * of the buffer: the tied word embedding is the output layer's dW), and the losses and
 * gradient norms are the bits of zeroing everything (MGC_ZERO_LIST=0), which zeroes the whole
 * buffer (train_exec).  On the emulator the stored gradients hold NaN before their first
 * writes (emu_zero_list), so a first write that read its output, or missed part of it, shows as
 * NaN losses. */
static void check_zero_list1(const char *path, const char *const *sets) {
    mgc_plan *p = compile(path, "bf16", sets);
    T_CHECK(p != NULL);
    if (!p) return;
    uint64_t B = 0;
    for (int64_t b = 0; b < p->stages[0].n_buffers; b++)
        if (p->stages[0].buffers[b].kind == MGC_BUF_GRAD) B = p->stages[0].buffers[b].bytes;
    double l[2][3], g[2][3];
    uint64_t z[2] = {0, 0};
    int64_t replays;
    for (int k = 0; k < 2; k++) {
        if (k) setenv("MGC_ZERO_LIST", "0", 1);
        exec_zeroed = 0;
        T_EQ_I64(train_exec(p, 0, 3, l[k], g[k], &replays), 0);
        z[k] = exec_zeroed;
    }
    unsetenv("MGC_ZERO_LIST");
    T_CHECK(B > 0 && z[0] > 0 && 4 * z[0] < B);
    T_EQ_U64(z[1], B);
    int same = !memcmp(l[0], l[1], sizeof l[0]) && !memcmp(g[0], g[1], sizeof g[0]);
    T_CHECK(same);
    T_CHECK(isfinite(l[0][2]) && isfinite(g[0][2]));
    printf("%s: the gradients' zeroing: %llu of %llu bytes a step (%.1f%%), the rest stored by "
           "the weight gradients' first writes; losses and norms %s zeroing everything\n", path,
           (unsigned long long)z[0], (unsigned long long)B,
           100.0 * (double)z[0] / (double)(B ? B : 1),
           same ? "bit-identical to" : "DIFFER from");
    mgc_plan_free(p);
}

static void check_zero_list(void) {
    static const char *const nodrop[] = {"model.hidden_dropout=0", "model.attention_dropout=0", NULL};
    static const char *const sparse[] = {"moe.num_experts=32", "moe.top_k=1",
                                         "model.seq_length=16", "training.micro_batch_size=1",
                                         "training.global_batch_size=2", NULL};
    check_zero_list1("examples/tiny-gpt.yaml", nodrop);
    check_zero_list1("models/tiny-moe.yaml", sparse);
}

/* ---- 2e. logits in the compute dtype (training.logits_dtype compute) -------------------
 * The output layer's GEMM writes 16-bit logits and the cross-entropy kernels read them (LT):
 * the fused backward of three loss chunks, over a vocabulary that is no multiple of 8 (60,000:
 * the element-by-element tail) in two; the unchunked forward and backward at tp 1, and
 * trained against the CPU (whose plan has fp32 logits: the 16-bit logits' rounding is within
 * the 16-bit tolerances); the vocabulary-parallel phases (ce_max, ce_sums) over tp2 with
 * sequence parallelism.  CI's emulator run (ci2) takes the first and the last. */
static void check_logits(int all) {
    static const char *const lc3[] = {"training.logits_dtype=compute", "training.loss_chunks=3",
                                      NULL};
    static const char *const tp2[] = {"parallel.world_size=2", "parallel.tensor=2",
                                      "parallel.sequence_parallel=true",
                                      "training.logits_dtype=compute", NULL};
    check_ops("examples/tiny-gpt.yaml", lc3);
    check_layout("examples/tiny-gpt.yaml", "bf16", tp2, 3e-2, 0);
    if (!all) return;
    static const char *const wide[] = {"training.logits_dtype=compute", "training.loss_chunks=2",
                                       "model.vocab_size=60000", NULL};
    static const char *const lc[] = {"training.logits_dtype=compute", NULL};
    check_ops("examples/tiny-gpt.yaml", wide);
    check_ops("examples/tiny-gpt.yaml", lc);
    check_training("examples/tiny-gpt.yaml", lc);
}

/* One configuration from the environment, for sweeps over the config space (tests/emu_sweep.py):
 * MGC_TEST_MODEL (default examples/tiny-gpt.yaml), MGC_TEST_SETS ("key=value;key=value"),
 * MGC_TEST_PRECISION (the layout's training, default bf16). On one rank every op is replayed
 * against the CPU in the three precisions (check_ops); on any world the layout trains against
 * the CPU's run of it (check_layout: 3e-2 in 16 bits, 1e-4 in fp32). */
static void check_env_sets(void) {
    const char *path = getenv("MGC_TEST_MODEL"), *prec = getenv("MGC_TEST_PRECISION");
    const char *env = getenv("MGC_TEST_SETS");
    static char buf[4096];
    const char *sets[65];
    int n = 0;
    snprintf(buf, sizeof buf, "%s", env ? env : "");
    for (char *save = NULL, *t = strtok_r(buf, ";", &save); t && n < 64; t = strtok_r(NULL, ";", &save))
        if (*t) sets[n++] = t;
    sets[n] = NULL;
    if (!path) path = "examples/tiny-gpt.yaml";
    if (!prec) prec = "bf16";
    printf("sets: %s with %s (%s)\n", path, env ? env : "(none)", prec);
    mgc_plan *p = compile(path, prec, sets);
    T_CHECK(p != NULL);
    if (!p) return;
    mgc_plan_free(p);
    check_ops(path, sets); /* on every rank of a layout */
    check_layout(path, prec, sets, strcmp(prec, "fp32") ? 3e-2 : 1e-4, 0);
}

int main(int argc, char **argv) {
    if (argc > 1 && !strcmp(argv[1], "--emu")) {
        emu = 1, steps = EMU_STEPS;
        argc--, argv++;
        if (t_sanitized()) { /* the gcc build runs it */
            printf("test_cuda --emu: not under a sanitizer: skipped\n");
            return 77;
        }
    } else if (!mgc_backend_cuda_available()) {
        printf("test_cuda: no CUDA device (or a build without CUDA): skipped\n");
        return 77;
    }
    setvbuf(stdout, NULL, _IONBF, 0);
    const char *only = argc > 1 ? argv[1] : NULL;
    const char *seed_env = getenv("MGC_TEST_SEED");
    uint64_t seed = seed_env ? strtoull(seed_env, NULL, 10) : (uint64_t)time(NULL);
    printf("test_cuda: seed %llu (MGC_TEST_SEED=%llu replays)\n", (unsigned long long)seed,
           (unsigned long long)seed);
    orng = seed * 2654435761u + 1u;
    /* CI's test_cuda_emu: "ci", every kernel family in minutes, as two halves that ctest runs
     * side by side (ci1, ci2) */
    const int ci1 = only && (!strcmp(only, "ci") || !strcmp(only, "ci1"));
    const int ci2 = only && (!strcmp(only, "ci") || !strcmp(only, "ci2"));
    if (!only || !strcmp(only, "optim") || ci1) check_optimizer();
    if (!only || !strcmp(only, "ce") || ci1) check_ce_inplace();
    if (!only || !strcmp(only, "emb") || ci1) check_embedding_bwd();
    if (!only || !strcmp(only, "bgrad") || ci1) {
        check_bias_grad();
        check_dgelu_bias_grad();
        /* the QKV projection's bias gradient summed by the fused attention backward
         * (attention_bwd_bias, attention.cuh CS): 160 tokens of 3 sequences at D 64, where the
         * dQ kernel's 128-row blocks end in an m-tile past the tokens, whose row of partials
         * would be the next sequence's first (a write there raced that tile's own: the layout's
         * rerun in other block orders differed); replayed op by op, and trained with the
         * rerun */
        static const char *const cs160[] = {"model.num_attention_heads=2", "model.head_dim=64",
                                            "model.hidden_size=128", "model.num_layers=1",
                                            "model.seq_length=160", "model.max_position_embeddings=160",
                                            "training.micro_batch_size=3",
                                            "training.global_batch_size=3", NULL};
        check_ops("examples/tiny-gpt.yaml", cs160);
        check_layout("examples/tiny-gpt.yaml", "bf16", cs160, 3e-2, 0);
    }
    if (!only || !strcmp(only, "fold") || ci1 || !strcmp(only, "devcomm"))
        check_fold();
    if (!only || !strcmp(only, "train")) {
        check_training("examples/tiny-gpt.yaml", NULL);
        check_training("models/tiny-llama.yaml", NULL);
        check_training("models/tiny-moe.yaml", NULL);
    }
    if (!only || !strcmp(only, "train") || ci1 || !strcmp(only, "ckpt"))
        check_checkpoints("examples/tiny-gpt.yaml");
    if (!only || !strcmp(only, "train") || ci1 || !strcmp(only, "eval"))
        check_eval("examples/tiny-gpt.yaml");
    if (!only || !strcmp(only, "layouts")) check_layouts();
    if (!only || ci1 || !strcmp(only, "graphs")) check_graphs();
    if (!only || ci2 || !strcmp(only, "twins")) check_twins();
    if (!emu && (!only || !strcmp(only, "graphs") || !strcmp(only, "pdl"))) check_pdl();
    if (!emu && (!only || !strcmp(only, "graphs") || !strcmp(only, "tune"))) check_tune();
    if (!only || !strcmp(only, "chunks")) check_chunks(1);
    if (!only || ci2 || !strcmp(only, "logits")) check_logits(!ci2);
    if (!only || ci1 || !strcmp(only, "zero")) check_zero_list();
    if (only && !strcmp(only, "fresh")) {
        /* the gradients' first writes (check_layout: MGC_GRAD_FRESH=0 gives the same bits)
         * where chunks' first backwards come at different places of the schedule: interleaved
         * pipeline stages over data ranks with the distributed optimizer, and tp2·pp2·dp2 */
        static const char *const pp2id2[] = {"parallel.world_size=4", "parallel.pipeline=2",
                                             "parallel.virtual_stages=2", "parallel.data=2",
                                             "parallel.distributed_optimizer=true",
                                             "training.global_batch_size=16", NULL};
        static const char *const all8f[] = {"parallel.world_size=8", "parallel.tensor=2",
                                            "parallel.pipeline=2", "parallel.data=2",
                                            "parallel.grad_bucket_size=20000", NULL};
        check_layout("examples/tiny-gpt.yaml", "bf16", pp2id2, 3e-2, 0);
        check_layout("examples/tiny-gpt.yaml", "bf16", all8f, 3e-2, 1);
    }
    if (ci1) { /* the op replays and layouts of CI's first half */
        static const char *const d64[] = {"model.hidden_size=128", "model.num_attention_heads=2",
                                          "model.attention_dropout=0.1", NULL};
        static const char *const d128[] = {"model.hidden_size=512", "model.num_attention_heads=4",
                                           NULL};
        static const char *const all8[] = {"parallel.world_size=8", "parallel.tensor=2",
                                           "parallel.pipeline=2", "parallel.data=2",
                                           "parallel.grad_bucket_size=20000", NULL};
        /* LLaMA's split rotates q and k (fusion.c MGC_POF_ROPE): half of each head rotated, at
         * head dim 32 with 16-byte accesses and columns passed through, at 16 element by
         * element (4 pairs) */
        static const char *const r32[] = {"model.hidden_size=128", "model.num_attention_heads=4",
                                          "model.rotary_percent=0.5", NULL};
        static const char *const r16[] = {"model.rotary_percent=0.5", NULL};
        /* GPT's attention reads q, k, v in place from the fused projection (fusion.c); with
         * grouped queries a group's heads sit between its key and value offsets; selective
         * recompute re-runs that attention in the backward */
        static const char *const gqa[] = {"model.hidden_size=128", "model.num_attention_heads=4",
                                          "model.num_query_groups=2",
                                          "training.recompute=selective", NULL};
        /* the head in three row chunks (compiler/losschunk.h): the mask count (ce_count), and
         * each chunk's GEMMs and cross-entropy on row views; the norms and GELUs recomputed in
         * the backward by their unfused kernels, the dropout masks drawn again there */
        check_chunks(0);
        check_ops("examples/tiny-gpt.yaml", d64);
        check_ops("examples/tiny-gpt.yaml", gqa);
        check_ops("models/tiny-llama.yaml", r32);
        check_ops("models/tiny-llama.yaml", r16);
        check_ops("models/tiny-llama.yaml", d128);
        check_ops("models/tiny-moe.yaml", moe_bias); /* the experts' GEMMs with biases */
        check_training("examples/tiny-gpt.yaml", NULL);
        static const char *const tp2sp[] = {"parallel.world_size=2", "parallel.tensor=2",
                                            "parallel.sequence_parallel=true",
                                            "training.loss_chunks=3", NULL};
        check_layout("examples/tiny-gpt.yaml", "bf16", all8, 3e-2, 1);
        check_layout("models/tiny-llama.yaml", "bf16", tp2sp, 3e-2, 0);
        check_layout("examples/tiny-gpt.yaml", "bf16", cp2d32, 3e-2, 0);
    }
    if (!only || ci1 || !strcmp(only, "dropnorm")) {
        /* hidden dropout: the norm backwards take the residual branches' dropout backwards
         * from the masks (compiler/fusion.c, MGC_POF_DROPBWD) and then their bias gradients
         * (the column sums of dbr), and the first layer's the embedding's; the embedding, its
         * dropout and the first norm are one kernel; at H 96 in 16-byte vectors and at H 100
         * element by element */
        static const char *const hd96[] = {"model.hidden_dropout=0.1", NULL};
        static const char *const hd100[] = {"model.hidden_dropout=0.1", "model.hidden_size=100",
                                            "model.head_dim=16", "model.num_attention_heads=4",
                                            "model.ffn_hidden_size=200", "model.num_layers=3",
                                            "model.seq_length=32", "training.micro_batch_size=3",
                                            "training.global_batch_size=3", NULL};
        const char *const *hd[2] = {hd96, hd100};
        for (int i = 0; i < 2; i++) {
            mgc_plan *p = compile("examples/tiny-gpt.yaml", "bf16", hd[i]);
            int64_t both = 0, drops = 0, embd = 0, firstb = 0;
            const mgc_plan_chunk *ch = p ? &p->stages[0].chunks[0] : NULL;
            for (int64_t j = 0; ch && j < ch->n_bwd; j++) {
                const mgc_plan_op *o = &ch->bwd[j];
                int f = o->kind == MGC_POP_NORM_BWD ? o->flags & (MGC_POF_DROPBWD | MGC_POF_COLSUM) : 0;
                both += f == (MGC_POF_DROPBWD | MGC_POF_COLSUM);
                firstb += f == MGC_POF_DROPBWD; /* the first layer's, with the embedding's dropout */
                drops += o->kind == MGC_POP_DROPOUT_BWD || o->kind == MGC_POP_DROPOUT_ADD_BWD;
            }
            /* the embedding, its dropout and the first norm: one kernel (norm.cuh, DROP) */
            for (int64_t j = 0; ch && j < ch->n_fwd; j++) {
                embd += ch->fwd[j].kind == MGC_POP_EMBEDDING_NORM && ch->fwd[j].n_out == 3;
                drops += ch->fwd[j].kind == MGC_POP_DROPOUT || ch->fwd[j].kind == MGC_POP_DROPOUT_ADD;
            }
            T_EQ_I64(both, i ? 6 : 8); /* two a layer */
            T_EQ_I64(firstb, 1);
            T_EQ_I64(embd, 1);
            T_EQ_I64(drops, 0); /* every dropout inside a norm's kernel, either way */
            mgc_plan_free(p);
            check_ops("examples/tiny-gpt.yaml", hd[i]);
        }
        /* over cp2 a rank's rows are two runs of the sequence's dropout numbering, which the
         * fused embedding's kernel numbers in one launch; fp32, so that a mask differing from
         * the CPU's cannot hide */
        static const char *const hd_cp2[] = {"parallel.world_size=2", "parallel.context=2",
                                             "model.hidden_dropout=0.1", NULL};
        check_layout("examples/tiny-gpt.yaml", "fp32", hd_cp2, 1e-5, 0);
    }
    if (!only || ci1 || !strcmp(only, "devcomm")) {
        /* tensor (bf16 activations' all-reduce) x data (fp32 gradient buckets) */
        static const char *const tpdp[] = {"parallel.world_size=4", "parallel.tensor=2",
                                           "parallel.data=2", "parallel.grad_bucket_size=20000",
                                           NULL};
        check_device_comm("examples/tiny-gpt.yaml", tpdp);
    }
    if (!only || !strcmp(only, "devcomm")) check_device_comm("models/tiny-moe.yaml", etp2ep2);
    if (!only || ci2 || !strcmp(only, "moe")) {
        check_layout("models/tiny-moe.yaml", "bf16", etp2ep2, 3e-2, 1);
        /* the pre-softmax router: the route kernels' softmax over every expert (score 1); the
         * second halves re-run in the backward (recompute modules mlp and moe): the router,
         * dispatch, experts and combine kernels as recompute copies */
        static const char *const pre[] = {"moe.router_score=presoftmax", "training.recompute_modules=[mlp, moe]",
                                          NULL};
        check_ops("models/tiny-moe.yaml", pre);
        /* the top-k scaling factor: the route kernels scale the weights and their gradient; the
         * router's logits in fp32 (moe.router_dtype): the route backward reads them beside its
         * 16-bit gradient (LF32) */
        static const char *const scaled[] = {"moe.router_topk_scaling_factor=2.5",
                                             "moe.router_score=sigmoid", "moe.router_dtype=fp32", NULL};
        check_ops("models/tiny-moe.yaml", scaled);
        /* group-limited routing: the route kernel's group scores (shared memory) and masks,
         * with probabilities (pre-softmax) and sigmoid scores compared */
        static const char *const grouped[] = {"moe.router_num_groups=2", "moe.router_group_topk=1",
                                              "moe.router_score=presoftmax", NULL};
        static const char *const grouped_sig[] = {"moe.router_num_groups=4",
                                                  "moe.router_group_topk=2",
                                                  "moe.router_score=sigmoid", "moe.top_k=4", NULL};
        check_ops("models/tiny-moe.yaml", grouped);
        check_ops("models/tiny-moe.yaml", grouped_sig);
        /* DeepSeek-V3's routing: sigmoid scores, the expert bias (zero at the first step, moved
         * after each: the kernel compares biased scores from the second on) and groups whose
         * scores include it, trained over ep2 against the CPU */
        static const char *const biased_ep2[] = {"parallel.world_size=2",
                                                 "parallel.data=2",
                                                 "parallel.expert=2",
                                                 "moe.router_score=sigmoid",
                                                 "moe.expert_bias_update_rate=0.05",
                                                 "moe.router_num_groups=2",
                                                 "moe.router_group_topk=1",
                                                 NULL};
        /* within 1e-5: the kernel ignoring the bias misses by 2e-4 */
        check_layout("models/tiny-moe.yaml", "fp32", biased_ep2, 1e-5, 0);
        /* the sequence-wise aux loss: each sequence's counts (moe_col_counts), the aux and
         * backward kernels reading the token's sequence's row */
        static const char *const seq_aux[] = {"moe.aux_loss_scope=sequence", NULL};
        check_ops("models/tiny-moe.yaml", seq_aux);
    }
    if (!only || ci2 || !strcmp(only, "docs")) {
        /* documents: GPT's attention on the fused projection at head dim 32 (tensor cores in
         * 16 bits) with its learned positions restarting (the embedding and its positions'
         * gradient by document), LLaMA's unfused one (its backward's seventh input) at 16 with
         * the rotary positions restarting (the split's rope: 16-byte and element paths), and
         * the unfused rope kernels (MGC_FUSION=0); then both models over cp2 */
        static const char *const docs_d32[] = {"data.reset_attention_mask=true",
                                               "data.reset_position_ids=true",
                                               "model.hidden_size=128",
                                               "model.num_attention_heads=4", NULL};
        static const char *const docs[] = {"data.reset_attention_mask=true",
                                           "data.reset_position_ids=true", NULL};
        static const char *const docs_r6[] = {"data.reset_position_ids=true",
                                              "model.rotary_percent=0.75", NULL};
        check_ops("examples/tiny-gpt.yaml", docs_d32);
        check_ops("models/tiny-llama.yaml", docs);
        check_ops("models/tiny-llama.yaml", docs_r6);
        setenv("MGC_FUSION", "0", 1);
        check_ops("models/tiny-llama.yaml", docs);
        unsetenv("MGC_FUSION");
        check_layout("models/tiny-llama.yaml", "fp32", docs_cp2, 1e-5, 0);
        check_layout("examples/tiny-gpt.yaml", "fp32", docs_cp2, 1e-5, 0);
    }
    if (ci2 || (only && !strcmp(only, "dropout")))
        check_layout("examples/tiny-gpt.yaml", "fp32", drop_tp3cp2, 1e-5, 0);
    if (ci2 || (only && !strcmp(only, "kv")))
        check_layout("examples/tiny-gpt.yaml", "bf16", mqa_tp2, 3e-2, 0);
    if (!only || ci2 || !strcmp(only, "window")) {
        /* sliding windows (model.window_size): LLaMA's unfused attention at head dim 16 (40 keys
         * of 96 on layers 0 and 2, none on 1 and 3: whole key tiles before the window, inside it
         * and across its edge), GPT's on the
         * fused projection at head dim 32 (tensor cores in 16 bits) with attention dropout and
         * documents (the later of the two bounds), and LLaMA over cp2 in fp32 (the bound on the
         * load-balanced positions and the gathered keys) */
        static const char *const w16[] = {"model.window_size=40", "model.window_layers=[0, 2]", NULL};
        static const char *const w32[] = {"model.window_size=24", "model.hidden_size=128",
                                          "model.num_attention_heads=4", "model.attention_dropout=0.1",
                                          "data.reset_attention_mask=true", NULL};
        static const char *const wcp2[] = {"parallel.world_size=2", "parallel.context=2",
                                           "model.window_size=30", NULL};
        /* 256 tokens, a window of 16: whole tiles before every query's window are skipped
         * (key tiles by the forward and dQ kernels, query tiles past the keys' reach by dK/dV);
         * over cp2 by the gathered positions */
        static const char *const wskip[] = {"model.seq_length=256", "model.window_size=16", NULL};
        static const char *const wskip_cp2[] = {"parallel.world_size=2", "parallel.context=2",
                                                "model.seq_length=256", "model.window_size=16", NULL};
        check_ops("models/tiny-llama.yaml", w16);
        check_ops("examples/tiny-gpt.yaml", w32);
        check_ops("models/tiny-llama.yaml", wskip);
        check_layout("models/tiny-llama.yaml", "bf16", wskip_cp2, 3e-2, 0);
        if (!only || !strcmp(only, "window")) { /* head dim 128 (its own tensor-core paths) */
            check_layout("models/tiny-llama.yaml", "fp32", wcp2, 1e-5, 0);
            static const char *const w128[] = {"model.window_size=50", "model.hidden_size=512",
                                               "model.num_attention_heads=4", NULL};
            check_ops("models/tiny-llama.yaml", w128);
        }
    }
    if (!only || ci2 || !strcmp(only, "qk")) {
        /* RMSNorm over 16 channels a head (LLaMA), LayerNorm with its bias over 32 (GPT) */
        static const char *const qk_llama[] = {"model.qk_layernorm=true", NULL};
        static const char *const qk_gpt[] = {"model.qk_layernorm=true", "model.hidden_size=128",
                                             "model.num_attention_heads=4", NULL};
        check_ops("models/tiny-llama.yaml", qk_llama);
        check_ops("examples/tiny-gpt.yaml", qk_gpt);
        check_layout("models/tiny-llama.yaml", "bf16", qk_tp2, 3e-2, 0);
    }
    if (!only || ci2 || !strcmp(only, "hd")) {
        /* head dims that are no power of two (attention.cuh): 80 on the
         * tiles of 128, GPT's attention on the fused projection with attention dropout and its
         * selective recompute; 48 on the tiles of 32 and 64, LLaMA's with grouped queries over
         * 80 tokens (a partial tile); and 96 over cp2 in bf16 */
        static const char *const hd80[] = {"model.num_attention_heads=2", "model.head_dim=80",
                                           "model.hidden_size=160", "model.num_layers=2",
                                           "model.attention_dropout=0.1", "training.recompute=selective",
                                           "training.micro_batch_size=2", "training.global_batch_size=2",
                                           NULL};
        static const char *const hd48[] = {"model.num_attention_heads=4", "model.num_query_groups=2",
                                           "model.head_dim=48", "model.hidden_size=192",
                                           "model.num_layers=2", "model.seq_length=80",
                                           "model.max_position_embeddings=80",
                                           "training.micro_batch_size=2", "training.global_batch_size=2",
                                           NULL};
        static const char *const hd96cp2[] = {"model.num_attention_heads=2", "model.head_dim=96",
                                              "model.hidden_size=192", "model.num_layers=2",
                                              "parallel.world_size=2", "parallel.context=2",
                                              "training.micro_batch_size=2", "training.global_batch_size=2",
                                              NULL};
        check_ops("examples/tiny-gpt.yaml", hd80);
        check_ops("models/tiny-llama.yaml", hd48);
        check_layout("examples/tiny-gpt.yaml", "bf16", hd96cp2, 3e-2, 0);
        /* odd multiples of 8, computed over ATT_W (D rounded up to 16, the last 8 columns zero:
         * staged and loaded as 0, never stored): 40 on the tiles of 48 with attention dropout,
         * on the fused projection (selective recompute), whose next head's first columns a
         * store past D would overwrite; 8 on the tiles of 16 with grouped queries */
        static const char *const hd40[] = {"model.num_attention_heads=2", "model.head_dim=40",
                                           "model.hidden_size=80", "model.num_layers=2",
                                           "model.seq_length=80", "model.max_position_embeddings=80",
                                           "model.attention_dropout=0.1", "training.recompute=selective",
                                           "training.micro_batch_size=2", "training.global_batch_size=2",
                                           NULL};
        static const char *const hd8[] = {"model.num_attention_heads=4", "model.num_query_groups=2",
                                          "model.head_dim=8", "model.hidden_size=32",
                                          "model.num_layers=2", NULL};
        check_ops("examples/tiny-gpt.yaml", hd40);
        check_ops("models/tiny-llama.yaml", hd8);
        /* wide (D past 128, attention.cuh ATT_DYN): the backward's tiles in dynamic shared
         * memory, the 16-bit dQ kernel's Q and dO from shared memory, the dK/dV kernel's two
         * column slices a key tile (a slice that stored the other's columns, or no slice
         * offset, fails): 256 on GPT's fused projection with attention dropout, 136 (an odd
         * multiple of 8: ATT_W 144) with grouped queries over 80 tokens */
        static const char *const hd256[] = {"model.num_attention_heads=2", "model.head_dim=256",
                                            "model.hidden_size=128", "model.num_layers=1",
                                            "model.attention_dropout=0.1",
                                            "training.micro_batch_size=2", "training.global_batch_size=2",
                                            NULL};
        static const char *const hd136[] = {"model.num_attention_heads=4", "model.num_query_groups=2",
                                            "model.head_dim=136", "model.hidden_size=96",
                                            "model.num_layers=1", "model.seq_length=80",
                                            "model.max_position_embeddings=80",
                                            "training.micro_batch_size=1", "training.global_batch_size=1",
                                            NULL};
        check_ops("examples/tiny-gpt.yaml", hd256);
        check_ops("models/tiny-llama.yaml", hd136);
        /* the kernels that compute positions (ROWPOS 0, context parallelism's) with attention
         * dropout, replayed op by op on one rank (MGC_ATT_POSITIONS=1), where a layout's losses
         * would not see a dQ row missing: at D 64 the dQ kernel takes one m-tile a warp (64
         * rows a block, and the launcher's grid alike; 160 tokens, three tiles), at D 128 16
         * keys a step */
        static const char *const pos64[] = {"model.num_attention_heads=2", "model.head_dim=64",
                                            "model.hidden_size=128", "model.num_layers=2",
                                            "model.seq_length=160", "model.max_position_embeddings=160",
                                            "model.attention_dropout=0.1", "training.micro_batch_size=1",
                                            "training.global_batch_size=1", NULL};
        static const char *const pos128[] = {"model.num_attention_heads=2", "model.num_query_groups=1",
                                             "model.head_dim=128", "model.hidden_size=256",
                                             "model.num_layers=1", "model.seq_length=80",
                                             "model.max_position_embeddings=80", "model.attention_dropout=0.1",
                                             "training.micro_batch_size=1", "training.global_batch_size=1",
                                             NULL};
        /* and at D 72 (ATT_W 80: K and V from shared memory in dK/dV, 16 keys a dQ step) */
        static const char *const pos72[] = {"model.num_attention_heads=2", "model.num_query_groups=1",
                                            "model.head_dim=72", "model.hidden_size=144",
                                            "model.num_layers=1", "model.seq_length=80",
                                            "model.max_position_embeddings=80", "model.attention_dropout=0.1",
                                            "training.micro_batch_size=1", "training.global_batch_size=1",
                                            NULL};
        /* and wide, at D 200 (ATT_W 208) */
        static const char *const pos200[] = {"model.num_attention_heads=2", "model.num_query_groups=1",
                                             "model.head_dim=200", "model.hidden_size=64",
                                             "model.num_layers=1", "model.seq_length=80",
                                             "model.max_position_embeddings=80", "model.attention_dropout=0.1",
                                             "training.micro_batch_size=1", "training.global_batch_size=1",
                                             NULL};
        setenv("MGC_ATT_POSITIONS", "1", 1);
        check_ops("examples/tiny-gpt.yaml", pos64);
        check_ops("models/tiny-llama.yaml", pos128);
        check_ops("models/tiny-llama.yaml", pos72);
        check_ops("models/tiny-llama.yaml", pos200);
        unsetenv("MGC_ATT_POSITIONS");
    }
    if (!only || ci2 || !strcmp(only, "norm")) {
        /* 560 rows, and with query and key norms 3,360 head rows: the norm forwards' last
         * blocks (16 row slots of 2 rows each at H 96, 32 rows a block) partly past the rows,
         * and the backward's 35 and 210 blocks of partial sums (norm_bwd_reduce: more than its
         * 32 thread rows); LLaMA's RMSNorm over 1,200 rows likewise (75 blocks) */
        static const char *const rows560[] = {"model.seq_length=80", "training.micro_batch_size=7",
                                              "training.global_batch_size=7",
                                              "model.qk_layernorm=true", NULL};
        check_ops("examples/tiny-gpt.yaml", rows560);
        static const char *const rows1200[] = {"model.seq_length=80",
                                               "training.micro_batch_size=15",
                                               "training.global_batch_size=15", NULL};
        check_ops("models/tiny-llama.yaml", rows1200);
        /* H 768 (GPT-2 124M's rows: 96 threads a row, 3 warps) and 1,600 (GPT-2 1.5B's: 7):
         * a slot's warp sums added as the lanes' butterfly would, read from shared memory
         * (up to 12 of them) or by the butterfly itself, three layers of each */
        static const char *const h768[] = {"model.hidden_size=768", "model.num_attention_heads=12",
                                           "model.ffn_hidden_size=768", "model.num_layers=3",
                                           "model.seq_length=32", "training.micro_batch_size=2",
                                           "training.global_batch_size=2", NULL};
        static const char *const h1600[] = {"model.hidden_size=1600",
                                            "model.num_attention_heads=25",
                                            "model.ffn_hidden_size=1600", "model.num_layers=3",
                                            "model.seq_length=32", "training.micro_batch_size=2",
                                            "training.global_batch_size=2", NULL};
        check_ops("examples/tiny-gpt.yaml", h768);
        check_ops("models/tiny-llama.yaml", h768);
        check_ops("examples/tiny-gpt.yaml", h1600);
        /* H 100 (heads of 16 apart from it): no 16-byte rows, so the norms' and the embedding's
         * element-by-element paths, and the embedding forward one row a block */
        static const char *const h100[] = {"model.hidden_size=100", "model.head_dim=16",
                                           "model.num_attention_heads=4",
                                           "model.ffn_hidden_size=200", "model.num_layers=3",
                                           "model.seq_length=32", "training.micro_batch_size=3",
                                           "training.global_batch_size=3", NULL};
        check_ops("examples/tiny-gpt.yaml", h100);
    }
    if (!only || ci2 || !strcmp(only, "ranks")) {
        /* op by op on every rank of a layout (check_ops' threads): tp2 x cp2 with sequence
         * parallelism and hidden and attention dropout (the vocabulary's last shard padded:
         * 257 of 272) */
        static const char *const tp2cp2[] = {"parallel.world_size=4", "parallel.tensor=2",
                                             "parallel.context=2",
                                             "parallel.sequence_parallel=true",
                                             "model.hidden_dropout=0.1",
                                             "model.attention_dropout=0.1", NULL};
        check_ops("examples/tiny-gpt.yaml", tp2cp2);
        /* head dim 64 over cp2 with attention dropout: the kernels that compute positions, dQ
         * one m-tile a warp (80 rows a rank, two tiles of 64) */
        static const char *const d64cp2[] = {"parallel.world_size=2", "parallel.context=2",
                                             "model.hidden_size=128", "model.num_attention_heads=2",
                                             "model.num_layers=2", "model.seq_length=160",
                                             "model.max_position_embeddings=160",
                                             "model.attention_dropout=0.1",
                                             "training.micro_batch_size=1",
                                             "training.global_batch_size=2", NULL};
        check_ops("examples/tiny-gpt.yaml", d64cp2);
        /* LLaMA over two pipeline stages of two virtual stages each x cp2: the rotary
         * positions of a context rank, the later stages' ops */
        static const char *const pp2cp2[] = {"parallel.world_size=4", "parallel.pipeline=2",
                                             "parallel.virtual_stages=2", "parallel.context=2",
                                             NULL};
        check_ops("models/tiny-llama.yaml", pp2cp2);
        /* MoE: expert x tensor (sequence parallel) x data, biases: the experts a rank holds,
         * the router over a rank's tokens */
        check_ops("models/tiny-moe.yaml", etp2ep2);
    }
    if (only && !strcmp(only, "moe")) check_ops("models/tiny-moe.yaml", moe_bias);
    if (only && !strcmp(only, "sets")) check_env_sets();
    if (!only || !strcmp(only, "ops")) {
        check_ops("examples/tiny-gpt.yaml", NULL);
        check_ops("models/tiny-llama.yaml", NULL);
        /* RMSNorm's backward with a linear's bias gradient (norm.cuh CS, MGC_POF_COLSUM) */
        static const char *const llama_bias[] = {"model.add_bias_linear=true", NULL};
        check_ops("models/tiny-llama.yaml", llama_bias);
        check_ops("models/tiny-moe.yaml", NULL);
        check_ops("models/tiny-moe.yaml", moe_bias);
        /* head dims 32, 64 and 128 (the 16-bit tensor-core attention; the tiny models have
         * 16), with attention dropout at 64, and grouped queries at 32 and 128 */
        static const char *const d64[] = {"model.hidden_size=128", "model.num_attention_heads=2",
                                          "model.attention_dropout=0.1", NULL};
        static const char *const d32[] = {"model.hidden_size=128", "model.num_attention_heads=4",
                                          NULL};
        check_ops("examples/tiny-gpt.yaml", d64);
        check_ops("models/tiny-llama.yaml", d32);
        static const char *const d128[] = {"model.hidden_size=512", "model.num_attention_heads=4",
                                           NULL};
        check_ops("models/tiny-llama.yaml", d128);
        /* half of each head rotated by the split (MGC_POF_ROPE): 16-byte and element paths */
        static const char *const r32[] = {"model.hidden_size=128", "model.num_attention_heads=4",
                                          "model.rotary_percent=0.5", NULL};
        static const char *const r16[] = {"model.rotary_percent=0.5", NULL};
        check_ops("models/tiny-llama.yaml", r32);
        check_ops("models/tiny-llama.yaml", r16);
    }
    return t_summary(emu ? "test_cuda --emu" : "test_cuda");
}
