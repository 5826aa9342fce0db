/* test_checkpoint.c - saving and resuming training (runtime/checkpoint.c).
 *
 * - A run stopped after step 4 and resumed to step 10 gives the losses and gradient norms of
 *   an unbroken run bit for bit, and its final checkpoint is byte-identical to the unbroken
 *   run's: one rank with dropout (the random streams continue) and evaluations (the same
 *   validation losses), tensor 2 with sequence
 *   parallelism, two virtual pipeline stages with tied embeddings (the output layer's copy),
 *   LLaMA over pipeline x data with the distributed optimizer, MoE over experts with the
 *   distributed optimizer, MoE over expert tensor x experts with the experts' biases, GPT with
 *   multi-query attention over three tensor ranks (the key/value head replicated).
 * - Across layouts: the checkpoint of step 4 written by tensor 2 x pipeline 2 x data 2 (and by
 *   expert 2, and by expert tensor 2 x expert 2, for the MoE; by tensor 6, three ranks to a
 *   key/value group, for LLaMA) holds what one rank's holds (each array of each tensor within 1e-3
 *   relative, Frobenius: a region no rank wrote would be zeros, some 6e-2 for one row of the
 *   embedding; the layouts differ by ~1e-4 in the QKV biases, most likely where Adam
 *   normalises gradients that are zero but for rounding, the key biases'), and a run resumed
 *   under another layout tracks the
 *   unbroken run of that layout within 1e-5 relative, as the layouts track each other.
 * - Retention (checkpoint.keep), unfinished files of a crashed save, and refusals: a damaged
 *   file (one flipped byte of data, a truncated file, a broken header), another model's
 *   checkpoint; each fails before the first step with the file named, and nothing in the
 *   directory is lost. */
#include <dirent.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "checkpoint.h"
#include "compile.h"
#include "config.h"
#include "diag.h"
#include "ir.h"
#include "plan.h"
#include "testlib.h"
#include "testplan.h"
#include "train.h"
#include "train_data.h"

#define STEPS 10
#define STOP 4

static const char *const common[] = {
    "training.iterations=10", "optimizer.warmup_iterations=2", "model.seq_length=32",
    "training.micro_batch_size=2", "training.global_batch_size=4", NULL};

static const char *const *model_sets; /* compile(): settings of the model every plan takes */
static mgc_plan *compile(const char *path, const char *const *sets) {
    return t_compile(path, (const char *const *const[]){common, model_sets, sets}, 3);
}

static const char *init_from; /* run(): mgc_train_opts.init_from */
static double *eval_out;       /* run(): mgc_train_opts.eval_losses */
static int async_saves;        /* run(): mgc_train_opts.async_save */
static double time_limit;      /* run(): mgc_train_opts.time_limit_s */
static int64_t stopped;        /* run(): mgc_train_opts.stopped_after */
#define W(n) "parallel.world_size=" #n

static int run(const mgc_plan *p, const char *dir, int64_t until, double *loss, double *norm,
               int64_t *resumed, char *err, size_t errsz) {
    mgc_train_data *data = NULL;
    if (mgc_train_data_open(&data, p, STEPS, err, errsz)) return -1;
    mgc_train_opts o = MGC_TRAIN_OPTS_INIT;
    o.iterations = until;
    o.losses = loss;
    o.grad_norms = norm;
    o.timeout_ms = 120000;
    o.checkpoint_dir = dir;
    o.resumed_from = resumed;
    o.init_from = init_from;
    o.eval_losses = eval_out;
    o.async_save = async_saves;
    o.time_limit_s = time_limit;
    o.stopped_after = &stopped;
    stopped = 0;
    for (int i = 0; i < STEPS; i++) {
        loss[i] = norm[i] = NAN;
        if (eval_out) eval_out[i] = NAN;
    }
    *resumed = -1;
    int rc = mgc_train_local(p, data, (int)p->grid.world, &o, err, errsz);
    mgc_train_data_free(data);
    return rc;
}

static void make_dir(char *dir) {
    snprintf(dir, 64, "/tmp/mgc-ckpt-XXXXXX");
    T_CHECK(mkdtemp(dir) != NULL);
}

static char *ckpt_path(char *buf, const char *dir, int64_t step) {
    snprintf(buf, 512, "%s/step-%09lld.mgck", dir, (long long)step);
    return buf;
}

static unsigned char *slurp(const char *path, long *n) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    *n = ftell(f);
    fseek(f, 0, SEEK_SET);
    unsigned char *b = malloc((size_t)(*n > 0 ? *n : 1));
    if (b && fread(b, 1, (size_t)*n, f) != (size_t)*n) free(b), b = NULL;
    fclose(f);
    return b;
}

static int same_file(const char *a, const char *b) {
    long na = 0, nb = 0;
    unsigned char *x = slurp(a, &na), *y = slurp(b, &nb);
    int same = x && y && na == nb && !memcmp(x, y, (size_t)na);
    free(x), free(y);
    return same;
}

static int count_files(const char *dir) {
    DIR *d = opendir(dir);
    int n = 0;
    if (!d) return -1;
    for (struct dirent *e; (e = readdir(d));)
        n += strcmp(e->d_name, ".") && strcmp(e->d_name, "..");
    closedir(d);
    return n;
}

/* Stopped at STOP and resumed = unbroken, bit for bit, final checkpoints byte for byte. */
static void check_resume(const char *path, const char *name, const char *const *sets) {
    mgc_plan *p = compile(path, sets);
    T_CHECK(p != NULL);
    if (!p) return;
    char a[64], b[64], pa[512], pb[512], err[4096];
    make_dir(a), make_dir(b);
    double la[STEPS], na[STEPS], lb[STEPS], nb[STEPS], l1[STEPS], n1[STEPS], ea[STEPS], eb[STEPS];
    int64_t r0 = -1, r1 = -1, r2 = -1;
    eval_out = ea;
    int rc = run(p, a, STEPS, la, na, &r0, err, sizeof err);
    eval_out = NULL;
    if (rc) fprintf(stderr, "%s unbroken: %s\n", name, err);
    T_EQ_I64(rc, 0);
    T_EQ_I64(r0, 0);
    rc = run(p, b, STOP, l1, n1, &r1, err, sizeof err);
    if (rc) fprintf(stderr, "%s to step %d: %s\n", name, STOP, err);
    T_EQ_I64(rc, 0);
    T_EQ_I64(r1, 0);
    T_CHECK(access(ckpt_path(pb, b, STOP), R_OK) == 0);
    eval_out = eb;
    rc = run(p, b, STEPS, lb, nb, &r2, err, sizeof err);
    eval_out = NULL;
    if (rc) fprintf(stderr, "%s resumed: %s\n", name, err);
    T_EQ_I64(rc, 0);
    T_EQ_I64(r2, STOP);
    /* the first part's steps are the unbroken run's; the resumed run ran only the rest */
    T_CHECK(memcmp(l1, la, STOP * sizeof *la) == 0);
    T_CHECK(isnan(lb[STOP - 1]) && !isnan(lb[STOP]));
    int same = memcmp(lb + STOP, la + STOP, (STEPS - STOP) * sizeof *la) == 0 &&
               memcmp(nb + STOP, na + STOP, (STEPS - STOP) * sizeof *na) == 0;
    T_CHECK(same);
    int files = same_file(ckpt_path(pa, a, STEPS), ckpt_path(pb, b, STEPS));
    T_CHECK(files);
    /* evaluations (where the plan has them) after the resumed steps: the unbroken run's */
    int evals = 0;
    for (int i = STOP; i < STEPS; i++) {
        T_CHECK(memcmp(&ea[i], &eb[i], sizeof ea[i]) == 0 || (isnan(ea[i]) && isnan(eb[i])));
        evals += !isnan(ea[i]);
    }
    printf("%s %-24s world %lld: resumed at step %d: steps %d-%d %s, step-%d checkpoints %s%s\n", path,
           name, (long long)p->grid.world, STOP, STOP + 1, STEPS, same ? "bit-identical" : "DIFFER",
           STEPS, files ? "byte-identical" : "DIFFER",
           evals ? ", validation losses bit-identical" : "");
    t_remove_dir(a), t_remove_dir(b);
    mgc_plan_free(p);
}

/* The worst relative difference (Frobenius) of an array of a tensor of checkpoint x from y's. */
static double compare_ckpts(const char *x, const char *y) {
    mgc_ckpt_info ix, iy;
    char err[1024];
    if (mgc_ckpt_read_info(x, &ix, err, sizeof err) || mgc_ckpt_read_info(y, &iy, err, sizeof err)) {
        fprintf(stderr, "%s\n", err);
        return INFINITY;
    }
    long nx = 0, ny = 0;
    unsigned char *bx = slurp(x, &nx), *by = slurp(y, &ny);
    double worst = bx && by && ix.model.n == iy.model.n ? 0 : INFINITY;
    T_EQ_I64(ix.resume.iteration, iy.resume.iteration);
    T_EQ_I64(ix.resume.consumed_samples, iy.resume.consumed_samples);
    for (int64_t i = 0; i < ix.model.n && worst < INFINITY; i++) {
        const mgc_ckpt_tensor *t = &ix.model.t[i], *u = &iy.model.t[i];
        /* vocabulary tensors: the rows both have (padded to a multiple of the tensor degree) */
        uint64_t rows = t->numel < u->numel ? t->numel : u->numel;
        if (strcmp(t->name, u->name) || (t->numel != u->numel && !(t->vocab && u->vocab))) {
            worst = INFINITY;
            break;
        }
        for (int a = 0; a < 3; a++) {
            const float *p = (const float *)(bx + ix.data_offset + t->offset) + (uint64_t)a * t->numel;
            const float *q = (const float *)(by + iy.data_offset + u->offset) + (uint64_t)a * u->numel;
            double d = 0, s = 0;
            for (uint64_t k = 0; k < rows; k++)
                d += ((double)p[k] - q[k]) * ((double)p[k] - q[k]), s += (double)q[k] * q[k];
            double r = s > 0 ? sqrt(d / s) : (d > 0 ? INFINITY : 0);
            if (r > worst) worst = r;
            if (r > 1e-3) printf("  %s (array %d): relative difference %.3e\n", t->name, a, r);
        }
    }
    free(bx), free(by);
    mgc_ckpt_info_free(&ix);
    mgc_ckpt_info_free(&iy);
    return worst;
}

/* Saved under layout `from`, resumed under layout `to`: the checkpoint holds what one rank's
 * holds, and the resumed run tracks `to`'s unbroken run. */
static void check_across(const char *path, const char *const *from, const char *const *to,
                         const char *name) {
    mgc_plan *one = compile(path, NULL), *pf = compile(path, from), *pt = compile(path, to);
    T_CHECK(one && pf && pt);
    if (!one || !pf || !pt) goto out;
    char d1[64], df[64], dt[64], p1[512], pfp[512], err[4096];
    make_dir(d1), make_dir(df), make_dir(dt);
    double l[STEPS], n[STEPS], lt[STEPS], nt[STEPS];
    int64_t r;
    T_EQ_I64(run(one, d1, STOP, l, n, &r, err, sizeof err), 0);
    int rc = run(pf, df, STOP, l, n, &r, err, sizeof err);
    if (rc) fprintf(stderr, "%s: %s\n", name, err);
    T_EQ_I64(rc, 0);
    double worst = compare_ckpts(ckpt_path(pfp, df, STOP), ckpt_path(p1, d1, STOP));
    T_CHECK(worst <= 1e-3);
    /* resumed under `to` from `from`'s checkpoint, against `to` unbroken */
    T_EQ_I64(run(pt, dt, STEPS, lt, nt, &r, err, sizeof err), 0);
    t_remove_dir(dt);
    make_dir(dt);
    char cmd[1200];
    snprintf(cmd, sizeof cmd, "cp %s %s/", pfp, dt);
    T_EQ_I64(system(cmd), 0);
    rc = run(pt, dt, STEPS, l, n, &r, err, sizeof err);
    if (rc) fprintf(stderr, "%s resumed: %s\n", name, err);
    T_EQ_I64(rc, 0);
    T_EQ_I64(r, STOP);
    double wl = 0;
    for (int i = STOP; i < STEPS && rc == 0; i++) {
        T_NEAR_REL(l[i], lt[i], 1e-5);
        double e = fabs(l[i] - lt[i]) / fabs(lt[i]);
        if (e > wl) wl = e;
    }
    printf("%s %s: step-%d checkpoints within %.2e of one rank's; resumed across layouts, "
           "losses within %.2e of the unbroken run\n",
           path, name, STOP, worst, wl);
    t_remove_dir(d1), t_remove_dir(df), t_remove_dir(dt);
out:
    mgc_plan_free(one), mgc_plan_free(pf), mgc_plan_free(pt);
}

/* checkpoint.keep, a crashed save's leftovers, and a user's file left alone */
static void check_retention(void) {
    static const char *const sets[] = {"checkpoint.interval=1", "checkpoint.keep=2", NULL};
    mgc_plan *p = compile("examples/tiny-gpt.yaml", sets);
    T_CHECK(p != NULL);
    if (!p) return;
    char d[64], f[600], err[4096];
    make_dir(d);
    snprintf(f, sizeof f, "%s/notes.txt", d);
    FILE *u = fopen(f, "w");
    T_CHECK(u != NULL);
    if (u) fputs("mine\n", u), fclose(u);
    snprintf(f, sizeof f, "%s/step-000000002.mgck.partial", d); /* a crashed save */
    u = fopen(f, "w");
    if (u) fclose(u);
    double l[STEPS], n[STEPS];
    int64_t r;
    T_EQ_I64(run(p, d, 5, l, n, &r, err, sizeof err), 0);
    T_EQ_I64(count_files(d), 3); /* notes.txt, step 4, step 5 */
    T_CHECK(access(ckpt_path(f, d, 4), R_OK) == 0 && access(ckpt_path(f, d, 5), R_OK) == 0);
    snprintf(f, sizeof f, "%s/notes.txt", d);
    T_CHECK(access(f, R_OK) == 0);
    /* resuming at or past the last step trains nothing and keeps everything */
    T_EQ_I64(run(p, d, 5, l, n, &r, err, sizeof err), 0);
    T_EQ_I64(r, 5);
    T_CHECK(isnan(l[4]));
    T_EQ_I64(count_files(d), 3);
    printf("retention: keep 2 of 5, a crashed save's file removed, the user's file kept\n");
    t_remove_dir(d);
    mgc_plan_free(p);
}

static void flip(const char *file, long at);

/* Every array's checksum in the file, read by one reader (the saves and loads share the
 * checksums out over the ranks: this checks that their shares covered every array). */
static int verified_whole(const char *path) {
    mgc_ckpt_info info;
    memset(&info, 0, sizeof info);
    char e[1024];
    int ok = mgc_ckpt_read_info(path, &info, e, sizeof e) == 0 && mgc_ckpt_verify(path, &info, e, sizeof e) == 0;
    if (!ok) fprintf(stderr, "%s: %s\n", path, e);
    mgc_ckpt_info_free(&info);
    return ok;
}

/* Asynchronous saves (checkpoint.async_save): every checkpoint byte for byte the synchronous
 * save's, the losses unchanged, a run stopped and resumed from its background-written
 * checkpoint bit for bit, retention as before, nothing partial left; and a save that fails in
 * the background (its final name taken by a directory) fails the run on every rank, naming the
 * cause, with the checkpoints before it intact. */
static void check_async(const char *path, const char *name, const char *const *sets) {
    const char *mine[12] = {"checkpoint.interval=2", "checkpoint.keep=0"};
    int k = 2;
    for (int i = 0; sets && sets[i] && k < 11; i++)
        mine[k++] = sets[i];
    mgc_plan *p = compile(path, mine);
    T_CHECK(p != NULL);
    if (!p) return;
    char a[64], b[64], c[64], pa[512], pb[512], err[4096];
    make_dir(a), make_dir(b), make_dir(c);
    double la[STEPS], na[STEPS], lb[STEPS], nb[STEPS], lc[STEPS], nc[STEPS];
    int64_t r;
    T_EQ_I64(run(p, a, STEPS, la, na, &r, err, sizeof err), 0);
    async_saves = 1;
    int rb = run(p, b, STEPS, lb, nb, &r, err, sizeof err);
    if (rb) fprintf(stderr, "%s async: %s\n", name, err);
    T_EQ_I64(rb, 0);
    int same = !memcmp(la, lb, sizeof la) && !memcmp(na, nb, sizeof na), files = 1;
    T_CHECK(same);
    for (int64_t s = 2; s <= STEPS; s += 2)
        files &= same_file(ckpt_path(pa, a, s), ckpt_path(pb, b, s)) && verified_whole(ckpt_path(pb, b, s));
    T_CHECK(files);
    T_EQ_I64(count_files(b), STEPS / 2); /* no .partial left */
    /* stopped after step 4, resumed from the background-written file */
    T_EQ_I64(run(p, c, STOP, lc, nc, &r, err, sizeof err), 0);
    int rc = run(p, c, STEPS, lc, nc, &r, err, sizeof err);
    if (rc) fprintf(stderr, "%s async resumed: %s\n", name, err);
    T_EQ_I64(rc, 0);
    T_EQ_I64(r, STOP);
    int resumed = !memcmp(lc + STOP, la + STOP, (STEPS - STOP) * sizeof *la) &&
                  same_file(ckpt_path(pa, a, STEPS), ckpt_path(pb, c, STEPS));
    T_CHECK(resumed);
    async_saves = 0;
    /* a flipped bit in the last array (the last rank's share of the checksums when loading):
     * refused on every rank before a step, naming the tensor */
    char d[64];
    make_dir(d);
    long bytes = 0;
    unsigned char *whole = slurp(ckpt_path(pa, a, STEPS), &bytes);
    FILE *cf = fopen(ckpt_path(pb, d, STEPS), "wb");
    T_CHECK(whole && cf && fwrite(whole, 1, (size_t)bytes, cf) == (size_t)bytes);
    if (cf) fclose(cf);
    free(whole);
    flip(ckpt_path(pb, d, STEPS), -5);
    rc = run(p, d, STEPS, lc, nc, &r, err, sizeof err);
    T_CHECK(rc != 0 && strstr(err, "values of") && strstr(err, "are damaged"));
    t_remove_dir(d);
    printf("%s %-16s world %lld: background saves at steps 2-%d byte-identical to synchronous ones, "
           "losses %s, resumed at step %d %s\n",
           path, name, (long long)p->grid.world, STEPS, same ? "bit-identical" : "DIFFER", STOP,
           resumed ? "bit for bit" : "DIFFERENTLY");
    t_remove_dir(a), t_remove_dir(b), t_remove_dir(c);
    mgc_plan_free(p);
}

/* mgc_train_opts.time_limit_s: a limit already spent stops every rank after step 1, with its
 * checkpoint, successfully; the next run resumes there. */
static void check_time_limit(void) {
    static const char *const sets[] = {W(2), "parallel.data=2", NULL};
    mgc_plan *p = compile("examples/tiny-gpt.yaml", sets);
    T_CHECK(p != NULL);
    if (!p) return;
    char d[64], f[600], err[4096];
    make_dir(d);
    double l[STEPS], n[STEPS];
    int64_t r;
    time_limit = 1e-9;
    T_EQ_I64(run(p, d, STEPS, l, n, &r, err, sizeof err), 0);
    time_limit = 0;
    T_EQ_I64(stopped, 1);
    T_CHECK(!isnan(l[0]) && isnan(l[1]));
    T_CHECK(access(ckpt_path(f, d, 1), R_OK) == 0);
    T_EQ_I64(run(p, d, STEPS, l, n, &r, err, sizeof err), 0);
    T_EQ_I64(r, 1);
    T_EQ_I64(stopped, 0);
    printf("time limit spent: both ranks stopped after step 1 with its checkpoint; resumed there to step %d\n", STEPS);
    t_remove_dir(d);
    mgc_plan_free(p);
}

static void check_async_failure(void) {
    static const char *const sets[] = {W(2), "parallel.data=2", "checkpoint.interval=2",
                                       "checkpoint.keep=0", NULL};
    mgc_plan *p = compile("examples/tiny-gpt.yaml", sets);
    T_CHECK(p != NULL);
    if (!p) return;
    char d[64], f[600], err[4096] = "";
    make_dir(d);
    snprintf(f, sizeof f, "%s/step-000000004.mgck", d); /* taken: a non-empty directory */
    T_CHECK(mkdir(f, 0755) == 0);
    snprintf(f, sizeof f, "%s/step-000000004.mgck/mine", d);
    FILE *u = fopen(f, "w");
    if (u) fputs("mine\n", u), fclose(u);
    double l[STEPS], n[STEPS];
    int64_t r;
    async_saves = 1;
    int rc = run(p, d, STEPS, l, n, &r, err, sizeof err);
    async_saves = 0;
    T_CHECK(rc != 0);
    T_CHECK(strstr(err, "cannot rename") != NULL && strstr(err, "step-000000004.mgck") != NULL);
    T_CHECK(!isnan(l[4]) && isnan(l[STEPS - 1])); /* noticed after a later step, not at the end */
    T_CHECK(access(ckpt_path(f, d, 2), R_OK) == 0);
    snprintf(f, sizeof f, "%s/step-000000004.mgck.partial", d);
    T_CHECK(access(f, F_OK) != 0);
    snprintf(f, sizeof f, "%s/step-000000004.mgck/mine", d);
    T_CHECK(access(f, R_OK) == 0);
    mgc_ckpt_info info;
    memset(&info, 0, sizeof info);
    char e2[1024];
    T_EQ_I64(mgc_ckpt_read_info(ckpt_path(f, d, 2), &info, e2, sizeof e2), 0);
    T_EQ_I64(mgc_ckpt_verify(ckpt_path(f, d, 2), &info, e2, sizeof e2), 0);
    mgc_ckpt_info_free(&info);
    printf("a background save that fails: the run stops on both ranks (%s), step 2 intact\n", err);
    t_remove_dir(d);
    mgc_plan_free(p);
}

/* flips byte `at` (negative: from the end) of file */
static void flip(const char *file, long at) {
    FILE *f = fopen(file, "r+b");
    T_CHECK(f != NULL);
    if (!f) return;
    fseek(f, at, at < 0 ? SEEK_END : SEEK_SET);
    int c = fgetc(f);
    fseek(f, at, at < 0 ? SEEK_END : SEEK_SET);
    fputc(c ^ 0x10, f);
    fclose(f);
}

static void expect_refused(const mgc_plan *p, const char *dir, const char *want, const char *what) {
    double l[STEPS], n[STEPS];
    int64_t r;
    char err[4096] = "";
    int rc = run(p, dir, STEPS, l, n, &r, err, sizeof err);
    T_CHECK(rc != 0);
    T_CHECK(strstr(err, want) != NULL && strstr(err, dir) != NULL);
    T_CHECK(isnan(l[STOP])); /* refused before any step */
    printf("refused (%s): %s\n", what, err);
}

static void check_refusals(void) {
    mgc_plan *p = compile("examples/tiny-gpt.yaml", NULL), *q = compile("models/tiny-llama.yaml", NULL);
    T_CHECK(p && q);
    if (!p || !q) goto out;
    char d[64], e[64], f[512], err[4096];
    make_dir(d), make_dir(e);
    double l[STEPS], n[STEPS];
    int64_t r;
    T_EQ_I64(run(p, d, STOP, l, n, &r, err, sizeof err), 0);
    ckpt_path(f, d, STOP);
    long size = 0;
    unsigned char *orig = slurp(f, &size);
    T_CHECK(orig != NULL);
    /* one bit of data (the last Adam v element written) */
    flip(f, -3);
    expect_refused(p, d, "damaged", "a flipped bit of data");
    /* the header */
    FILE *w = fopen(f, "wb");
    if (w) fwrite(orig, 1, (size_t)size, w), fclose(w);
    flip(f, 20);
    expect_refused(p, d, "header is damaged", "a flipped bit of the header");
    /* truncated */
    w = fopen(f, "wb");
    if (w) fwrite(orig, 1, (size_t)size, w), fclose(w);
    T_EQ_I64(truncate(f, size - 4096), 0);
    expect_refused(p, d, "truncated", "a truncated file");
    /* restored, it resumes; the damaged attempts changed nothing in the directory */
    w = fopen(f, "wb");
    if (w) fwrite(orig, 1, (size_t)size, w), fclose(w);
    T_EQ_I64(count_files(d), 1);
    T_EQ_I64(run(p, d, STOP + 1, l, n, &r, err, sizeof err), 0);
    T_EQ_I64(r, STOP);
    /* another model's checkpoint */
    T_EQ_I64(run(q, e, STOP, l, n, &r, err, sizeof err), 0);
    expect_refused(p, e, "has no parameter", "another model's checkpoint");
    T_EQ_I64(count_files(e), 1);
    /* another vocabulary: the padding rule would let its rows through */
    static const char *const v300[] = {"model.vocab_size=300", NULL};
    mgc_plan *v = compile("examples/tiny-gpt.yaml", v300);
    T_CHECK(v != NULL);
    if (v) expect_refused(v, d, "vocabulary of 257 tokens", "another vocabulary");
    mgc_plan_free(v);
    free(orig);
    t_remove_dir(d), t_remove_dir(e);
out:
    mgc_plan_free(p), mgc_plan_free(q);
}

/* Every bit of the header, the table and its padding, and bits of the data spread over the
 * file: each flip refused (mgc_ckpt_read_info, then mgc_ckpt_verify), never a crash; every
 * truncation refused. */
static void check_every_flip(void) {
    mgc_plan *p = compile("examples/tiny-gpt.yaml", NULL);
    T_CHECK(p != NULL);
    if (!p) return;
    char d[64], f[512], err[1024];
    make_dir(d);
    double l[STEPS], n[STEPS];
    int64_t r;
    T_EQ_I64(run(p, d, 1, l, n, &r, err, sizeof err), 0);
    ckpt_path(f, d, 1);
    long size = 0;
    unsigned char *orig = slurp(f, &size);
    mgc_ckpt_info info;
    T_CHECK(orig && mgc_ckpt_read_info(f, &info, err, sizeof err) == 0);
    if (!orig) goto out;
    long head = (long)info.data_offset, accepted = 0, tried = 0;
    mgc_ckpt_info_free(&info);
    int fd = open(f, O_RDWR);
    T_CHECK(fd >= 0);
    for (long at = 0; at < size && fd >= 0; at += at < head ? 1 : 40009) {
        for (int bit = 0; bit < 8; bit += at < head ? 3 : 8) {
            unsigned char c = (unsigned char)(orig[at] ^ (1 << bit));
            T_CHECK(pwrite(fd, &c, 1, at) == 1);
            int ok = mgc_ckpt_read_info(f, &info, err, sizeof err) == 0;
            if (ok) ok = mgc_ckpt_verify(f, &info, err, sizeof err) == 0, mgc_ckpt_info_free(&info);
            accepted += ok, tried++;
            T_CHECK(pwrite(fd, orig + at, 1, at) == 1);
        }
    }
    if (fd >= 0) close(fd);
    T_EQ_I64(accepted, 0);
    long cut_ok = 0;
    for (long len = 0; len < size; len += len < head ? 7 : 65537) {
        FILE *w = fopen(f, "wb");
        if (w) fwrite(orig, 1, (size_t)len, w), fclose(w);
        if (mgc_ckpt_read_info(f, &info, err, sizeof err) == 0) cut_ok++, mgc_ckpt_info_free(&info);
    }
    T_EQ_I64(cut_ok, 0);
    printf("damage: %ld single-bit flips (every third bit of the first %ld bytes, then one bit "
           "every 40009 bytes) and truncations: %ld accepted\n",
           tried, head, accepted + cut_ok);
out:
    free(orig);
    t_remove_dir(d);
    mgc_plan_free(p);
}

/* The parameters of array `a` of every tensor of x equal y's, byte for byte, over the rows both
 * have: 1, else 0. */
static int same_array(const char *x, const char *y, int a) {
    mgc_ckpt_info ix, iy;
    char err[1024];
    if (mgc_ckpt_read_info(x, &ix, err, sizeof err)) return 0;
    if (mgc_ckpt_read_info(y, &iy, err, sizeof err)) {
        mgc_ckpt_info_free(&ix);
        return 0;
    }
    long nx = 0, ny = 0;
    unsigned char *bx = slurp(x, &nx), *by = slurp(y, &ny);
    int same = bx && by && ix.model.n == iy.model.n;
    for (int64_t i = 0; same && i < ix.model.n; i++) {
        const mgc_ckpt_tensor *t = &ix.model.t[i], *u = &iy.model.t[i];
        uint64_t n = t->numel < u->numel ? t->numel : u->numel;
        same = !strcmp(t->name, u->name) &&
               !memcmp(bx + ix.data_offset + t->offset + (uint64_t)a * t->numel * 4,
                       by + iy.data_offset + u->offset + (uint64_t)a * u->numel * 4, n * 4);
    }
    free(bx), free(by);
    mgc_ckpt_info_free(&ix);
    mgc_ckpt_info_free(&iy);
    return same;
}

/* --init-from: a fine-tuning run at learning rate 0 keeps the source's parameters bit for bit
 * (on one rank and on tensor 2 x data 2, whose vocabulary is padded otherwise) with a fresh
 * optimizer at step 1; its own checkpoint takes precedence when it runs again. */
static void check_init_from(void) {
    static const char *const lr0[] = {"optimizer.lr=0", "optimizer.min_lr=0", NULL};
    static const char *const lr0_tp[] = {"optimizer.lr=0", "optimizer.min_lr=0", W(4), "parallel.tensor=2",
                                         "parallel.data=2", "parallel.distributed_optimizer=true", NULL};
    mgc_plan *p = compile("examples/tiny-gpt.yaml", NULL), *f[2] = {compile("examples/tiny-gpt.yaml", lr0),
                                                                    compile("examples/tiny-gpt.yaml", lr0_tp)};
    T_CHECK(p && f[0] && f[1]);
    if (!p || !f[0] || !f[1]) goto out;
    char a[64], src[512], got[512], err[4096];
    make_dir(a);
    double l[STEPS], n[STEPS], l0[STEPS];
    int64_t r;
    T_EQ_I64(run(p, a, STOP, l0, n, &r, err, sizeof err), 0);
    ckpt_path(src, a, STOP);
    for (int k = 0; k < 2; k++) {
        char b[64];
        make_dir(b);
        init_from = src;
        int rc = run(f[k], b, 2, l, n, &r, err, sizeof err);
        if (rc) fprintf(stderr, "--init-from: %s\n", err);
        T_EQ_I64(rc, 0);
        T_EQ_I64(r, 0);                   /* step 1 of its own */
        T_CHECK(!isnan(l[0]) && l[0] < l0[0] - 0.05); /* the trained model, not the initial one */
        double first = l[0];
        ckpt_path(got, b, 2);
        int params = same_array(got, src, 0), moments = same_array(got, src, 1);
        T_CHECK(params && !moments);
        mgc_ckpt_info info;
        T_CHECK(mgc_ckpt_read_info(got, &info, err, sizeof err) == 0);
        T_EQ_I64(info.resume.iteration, 2);
        T_EQ_I64(info.resume.consumed_samples, 2 * 4);
        mgc_ckpt_info_free(&info);
        /* again: its own checkpoint wins */
        rc = run(f[k], b, 3, l, n, &r, err, sizeof err);
        T_EQ_I64(rc, 0);
        T_EQ_I64(r, 2);
        init_from = NULL;
        printf("--init-from (world %lld): step 1 loss %.4f (a fresh model: %.4f), parameters kept bit "
               "for bit at learning rate 0, fresh moments; run again: resumed its own step 2\n",
               (long long)f[k]->grid.world, first, l0[0]);
        t_remove_dir(b);
    }
    /* a damaged --init-from is refused before any step */
    init_from = "/nonexistent/step-000000001.mgck";
    char c[64];
    make_dir(c);
    T_CHECK(run(f[0], c, 2, l, n, &r, err, sizeof err) != 0 && strstr(err, "/nonexistent/") != NULL);
    init_from = NULL;
    t_remove_dir(c);
    t_remove_dir(a);
out:
    mgc_plan_free(p), mgc_plan_free(f[0]), mgc_plan_free(f[1]);
}

/* --init-from between models with and without the routers' expert biases: the biases start at
 * zero when the source has none and are left out when the plan has none; resuming (not
 * --init-from) a checkpoint without them is refused. */
static void check_init_bias(void) {
    static const char *const plain[] = {"moe.router_score=sigmoid", NULL};
    static const char *const biased[] = {"moe.router_score=sigmoid",
                                         "moe.expert_bias_update_rate=0.01", NULL};
    mgc_plan *p[2] = {compile("models/tiny-moe.yaml", plain),
                      compile("models/tiny-moe.yaml", biased)};
    T_CHECK(p[0] && p[1]);
    char dir[2][64], src[2][512], err[4096];
    double l[STEPS], n[STEPS];
    int64_t r;
    for (int k = 0; k < 2 && p[0] && p[1]; k++) {
        make_dir(dir[k]);
        T_EQ_I64(run(p[k], dir[k], STOP, l, n, &r, err, sizeof err), 0);
        ckpt_path(src[k], dir[k], STOP);
    }
    for (int k = 0; k < 2 && p[0] && p[1]; k++) { /* source k into plan 1 - k */
        char d[64];
        make_dir(d);
        init_from = src[k];
        int rc = run(p[1 - k], d, 2, l, n, &r, err, sizeof err);
        init_from = NULL;
        if (rc) fprintf(stderr, "--init-from %s: %s\n", k ? "biased" : "plain", err);
        T_EQ_I64(rc, 0);
        T_EQ_I64(r, 0);
        t_remove_dir(d);
    }
    if (p[0] && p[1]) { /* resuming the plain model's checkpoint with the biases: refused */
        char d[64], cmd[1200];
        make_dir(d);
        snprintf(cmd, sizeof cmd, "cp %s %s/", src[0], d);
        T_EQ_I64(system(cmd), 0);
        T_CHECK(run(p[1], d, STEPS, l, n, &r, err, sizeof err) != 0 &&
                strstr(err, "expert_bias") != NULL);
        printf("--init-from across the expert biases: both ways; resumed without them: %s\n", err);
        t_remove_dir(d);
        t_remove_dir(dir[0]), t_remove_dir(dir[1]);
    }
    mgc_plan_free(p[0]), mgc_plan_free(p[1]);
}

int main(void) {
    static const char *const one_drop[] = {"model.hidden_dropout=0.1", "model.attention_dropout=0.1",
                                           "training.eval_interval=3", "training.eval_iters=2", NULL};
    static const char *const tpsp[] = {W(2), "parallel.tensor=2", "parallel.sequence_parallel=true", NULL};
    static const char *const vpp_tied[] = {W(2), "parallel.pipeline=2", "parallel.virtual_stages=2",
                                           "model.tie_embeddings=true", NULL};
    static const char *const llama[] = {W(4), "parallel.pipeline=2", "parallel.data=2",
                                        "parallel.distributed_optimizer=true", NULL};
    static const char *const moe[] = {W(2), "parallel.data=2", "parallel.expert=2",
                                      "parallel.distributed_optimizer=true", NULL};
    check_resume("examples/tiny-gpt.yaml", "one rank, dropout", one_drop);
    check_resume("examples/tiny-gpt.yaml", "tp2+sp", tpsp);
    check_resume("examples/tiny-gpt.yaml", "pp2 vp2 tied", vpp_tied);
    check_resume("models/tiny-llama.yaml", "pp2 dp2 dist-opt", llama);
    check_resume("models/tiny-moe.yaml", "ep2 dist-opt", moe);
    /* expert tensor 2 (fc1 split over ETP on its [gate | up] dim, fc2 on its input dim, fc2's
     * bias replicated over ETP and written by expert-tensor rank 0) */
    static const char *const etp[] = {W(4), "parallel.tensor=2", "parallel.sequence_parallel=true",
                                      "parallel.data=2", "parallel.expert=2",
                                      "parallel.distributed_optimizer=true", NULL};
    static const char *const etp_bias[] = {W(4), "parallel.tensor=2", "parallel.sequence_parallel=true",
                                           "parallel.data=2", "parallel.expert=2",
                                           "model.add_bias_linear=true", NULL};
    check_resume("models/tiny-moe.yaml", "etp2 ep2 biases", etp_bias);
    /* multi-query attention over three tensor ranks: each holds the one key/value head (and its
     * bias) whole; tensor rank 0 writes it */
    static const char *const mqa3[] = {W(3), "parallel.tensor=3", "model.num_query_groups=1", NULL};
    check_resume("examples/tiny-gpt.yaml", "tp3 mqa", mqa3);
    static const char *const t8[] = {W(8), "parallel.tensor=2", "parallel.pipeline=2", "parallel.data=2",
                                     "parallel.sequence_parallel=true", "parallel.distributed_optimizer=true",
                                     NULL};
    static const char *const tp2[] = {W(2), "parallel.tensor=2", NULL};
    static const char *const moe1[] = {W(2), "parallel.data=2", "parallel.expert=2", NULL};
    /* the vocabulary is padded to a multiple of 8 x the tensor degree: from tensor 2 to one
     * rank the checkpoint's padding rows past the plan's are left out, from one to two the
     * plan's extra rows start at zero */
    check_across("examples/tiny-gpt.yaml", t8, NULL, "tp2 pp2 dp2 dist-opt -> one rank");
    check_across("models/tiny-llama.yaml", llama, tp2, "pp2 dp2 dist-opt -> tp2");
    check_across("models/tiny-moe.yaml", moe, moe1, "ep2 dist-opt -> ep2");
    check_across("models/tiny-moe.yaml", etp, moe1, "etp2 ep2 dist-opt -> ep2");
    /* tiny LLaMA's two key/value groups over six tensor ranks (three a group) and back */
    static const char *const kv6[] = {W(6), "parallel.tensor=6", NULL};
    check_across("models/tiny-llama.yaml", kv6, tp2, "tp6 (kv replicated) -> tp2");
    check_across("models/tiny-llama.yaml", tp2, kv6, "tp2 -> tp6 (kv replicated)");
    /* the routers' expert biases (moe.expert_bias_update_rate): state beside the parameters,
     * every layer's on every rank, written once; resumed bit for bit (a resume that restarted
     * them at zero would route differently) and across layouts */
    static const char *const biased[] = {"moe.router_score=sigmoid",
                                         "moe.expert_bias_update_rate=0.01", NULL};
    static const char *const pp2[] = {W(2), "parallel.pipeline=2", NULL};
    model_sets = biased;
    check_resume("models/tiny-moe.yaml", "pp2 expert bias", pp2);
    check_resume("models/tiny-moe.yaml", "ep2 dist-opt expert bias", moe);
    check_across("models/tiny-moe.yaml", moe, pp2, "expert bias ep2 dist-opt -> pp2");
    model_sets = NULL;
    check_retention();
    check_async("examples/tiny-gpt.yaml", "one rank", NULL);
    check_async("examples/tiny-gpt.yaml", "tp2 pp2 dp2", t8);
    check_async("models/tiny-moe.yaml", "ep2 dist-opt", moe);
    check_async_failure();
    check_time_limit();
    check_refusals();
    check_every_flip();
    check_init_from();
    check_init_bias();
    return t_summary("test_checkpoint");
}
