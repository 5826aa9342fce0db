/* calibrate.c - see calibrate.h.
 *
 * The per-op fit is a fixed point per factor: with e the efficiency and P(e)
 * the predicted total of the records it governs (launch overheads and
 * roofline floors included), e <- e * P(e) / M until it settles, M the
 * measured total.  Efficiencies stay in (0, 1]. */
#include "calibrate.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "diag.h"
#include "schedule.h"

static const char *const factor_names[MGC_CALIB__COUNT] = {"gemm",   "attention_fwd", "attention_bwd",
                                                           "memory", "nvlink",        "network"};

static double *factor_ptr(mgc_hw *hw, int f) {
    switch (f) {
    case MGC_CALIB_GEMM: return &hw->eff.gemm;
    case MGC_CALIB_ATTENTION_FWD: return &hw->eff.attention_fwd;
    case MGC_CALIB_ATTENTION_BWD: return &hw->eff.attention_bwd;
    case MGC_CALIB_MEMORY: return &hw->eff.memory;
    case MGC_CALIB_NVLINK: return &hw->eff.nvlink;
    default: return &hw->eff.network;
    }
}

/* The plan op an op record names, or NULL when its position is outside the
 * plan or its recorded kind differs (a profile of another plan). */
static const mgc_plan_op *record_op(const mgc_plan *p, const mgc_calib_sample *s, const mgc_plan_chunk **chp) {
    if (s->instr || s->stage < 0 || s->stage >= p->n_stages) return NULL;
    const mgc_stage_program *sp = &p->stages[s->stage];
    if (s->chunk < 0 || s->chunk >= sp->n_chunks) return NULL;
    const mgc_plan_chunk *ch = &sp->chunks[s->chunk];
    if (s->index < 0 || s->index >= (s->bwd ? ch->n_bwd : ch->n_fwd)) return NULL;
    const mgc_plan_op *op = s->bwd ? &ch->bwd[s->index] : &ch->fwd[s->index];
    if (s->kind[0] && strcmp(s->kind, mgc_plan_op_name((mgc_plan_op_kind)op->kind))) return NULL;
    if (chp) *chp = ch;
    return op;
}

/* The first op record that does not match the plan, or -1. */
static int64_t first_mismatch(const mgc_plan *p, const mgc_calib_sample *s, int64_t n) {
    for (int64_t i = 0; i < n; i++)
        if (!s[i].instr && !record_op(p, &s[i], NULL)) return i;
    return -1;
}

/* Which factor a sample informs (-1: none) and its prediction under hw. */
static int classify(const mgc_plan *p, const mgc_calib_sample *s, const mgc_hw *hw, double *pred) {
    mgc_cost_options o;
    memset(&o, 0, sizeof o);
    o.hw = hw;
    *pred = 0;
    if (s->stage < 0 || s->stage >= p->n_stages) return -1;
    const mgc_stage_program *sp = &p->stages[s->stage];
    if (!s->instr) {
        const mgc_plan_chunk *ch = NULL;
        const mgc_plan_op *op = record_op(p, s, &ch);
        if (!op) return -1;
        mgc_cost_class cl;
        *pred = mgc_cost_op(p, s->stage, ch, op, &o, &cl);
        switch (cl) {
        case MGC_COST_GEMM: return MGC_CALIB_GEMM;
        case MGC_COST_ATTENTION: return op->kind == MGC_POP_ATTENTION ? MGC_CALIB_ATTENTION_FWD : MGC_CALIB_ATTENTION_BWD;
        case MGC_COST_MEMORY: return MGC_CALIB_MEMORY;
        case MGC_COST_TP_COMM:
            if (*pred <= 0) return -1; /* a group of one: nothing moved */
            return mgc_cost_group_spans_nodes(p, s->stage, op->group, &o) ? MGC_CALIB_NETWORK : MGC_CALIB_NVLINK;
        default: return -1;
        }
    }
    int op = s->instr - 1;
    if (op != MGC_I_REDUCE_GRADS && op != MGC_I_GATHER_PARAMS) return -1; /* not fitted */
    if (s->arg >= (uint64_t)sp->n_buckets) return -1;
    mgc_instr in;
    memset(&in, 0, sizeof in);
    in.op = (uint16_t)op;
    in.arg = s->arg;
    in.mb = -1;
    in.peer = -1;
    *pred = mgc_cost_instr(p, s->stage, &in, &o, NULL);
    if (*pred <= 0) return -1;
    return mgc_cost_group_spans_nodes(p, s->stage, sp->buckets[s->arg].group, &o) ? MGC_CALIB_NETWORK
                                                                                    : MGC_CALIB_NVLINK;
}

static void totals(const mgc_plan *p, const mgc_calib_sample *s, int64_t n, const mgc_hw *hw, int64_t *cnt,
                   double *meas, double *pred) {
    for (int f = 0; f < MGC_CALIB__COUNT; f++) {
        if (cnt) cnt[f] = 0;
        if (meas) meas[f] = 0;
        pred[f] = 0;
    }
    for (int64_t i = 0; i < n; i++) {
        double t;
        int f = classify(p, &s[i], hw, &t);
        if (f < 0 || !(s[i].mean_s > 0) || !(s[i].calls > 0)) continue;
        if (cnt) cnt[f]++;
        if (meas) meas[f] += s[i].mean_s * s[i].calls;
        pred[f] += t * s[i].calls;
    }
}

int mgc_calibrate_ops(const mgc_plan *p, const mgc_calib_sample *s, int64_t n, mgc_hw *hw, mgc_calib_fit *fit,
                      char *err, size_t errsz) {
    memset(fit, 0, sizeof *fit);
    int64_t bad = first_mismatch(p, s, n);
    if (bad >= 0) {
        snprintf(err, errsz,
                 "op record %lld (stage %lld chunk %lld %s index %lld, '%s') is not an op of the plan: was the "
                 "profile measured on another plan?",
                 (long long)bad, (long long)s[bad].stage, (long long)s[bad].chunk, s[bad].bwd ? "bwd" : "fwd",
                 (long long)s[bad].index, s[bad].kind);
        return -1;
    }
    totals(p, s, n, hw, fit->samples, fit->measured_s, fit->before_s);
    int any = 0;
    for (int f = 0; f < MGC_CALIB__COUNT; f++) {
        fit->old_eff[f] = fit->new_eff[f] = *factor_ptr(hw, f);
        any |= fit->samples[f] > 0;
    }
    if (!any) {
        snprintf(err, errsz, "no record of the profile matches an op of the plan that the model fits "
                             "(was it measured on this plan?)");
        return -1;
    }
    for (int iter = 0; iter < 60; iter++) {
        double pred[MGC_CALIB__COUNT];
        totals(p, s, n, hw, NULL, NULL, pred);
        double worst = 0;
        for (int f = 0; f < MGC_CALIB__COUNT; f++) {
            if (!fit->samples[f] || !(fit->measured_s[f] > 0) || !(pred[f] > 0)) continue;
            double *e = factor_ptr(hw, f);
            double ne = *e * pred[f] / fit->measured_s[f];
            if (ne > 1) ne = 1;
            if (ne < 1e-6) ne = 1e-6;
            double ch = fabs(ne - *e) / *e;
            if (ch > worst) worst = ch;
            *e = ne;
        }
        if (worst < 1e-6) break;
    }
    totals(p, s, n, hw, NULL, NULL, fit->after_s);
    for (int f = 0; f < MGC_CALIB__COUNT; f++) fit->new_eff[f] = *factor_ptr(hw, f);
    return 0;
}

static void scale_compute(mgc_hw *hw, const mgc_hw *base, double k) {
    double *dst[4] = {&hw->eff.gemm, &hw->eff.attention_fwd, &hw->eff.attention_bwd, &hw->eff.memory};
    const double src[4] = {base->eff.gemm, base->eff.attention_fwd, base->eff.attention_bwd, base->eff.memory};
    for (int i = 0; i < 4; i++) {
        double v = src[i] * k;
        *dst[i] = v > 1 ? 1 : v;
    }
}

int mgc_calibrate_step(const mgc_plan *p, double step_s, mgc_hw *hw, double *factor, char *err, size_t errsz) {
    mgc_hw base = *hw;
    mgc_cost_options o;
    memset(&o, 0, sizeof o);
    o.hw = hw;
    mgc_cost_report r;
    /* predicted step time falls as k grows: bisect on log k */
    double lo = 1e-5, hi = 1.0;
    const double *e = &base.eff.gemm;
    double emax = base.eff.gemm;
    if (base.eff.attention_fwd > emax) emax = base.eff.attention_fwd;
    if (base.eff.attention_bwd > emax) emax = base.eff.attention_bwd;
    if (base.eff.memory > emax) emax = base.eff.memory;
    (void)e;
    hi = 1.0 / emax;
    scale_compute(hw, &base, hi);
    if (mgc_cost_plan(p, &o, &r, err, errsz)) return -1;
    if (r.step_s > step_s) {
        *hw = base;
        snprintf(err, errsz,
                 "even at 100%% compute efficiency the model predicts %.4g s per step, more than the measured "
                 "%.4g s: the communication or the bubble is over-predicted, or the step time is not this plan's",
                 r.step_s, step_s);
        return -1;
    }
    scale_compute(hw, &base, lo);
    if (mgc_cost_plan(p, &o, &r, err, errsz)) return -1;
    if (r.step_s < step_s) {
        *hw = base;
        snprintf(err, errsz, "the measured step (%.4g s) is over 100,000 times slower than predicted", step_s);
        return -1;
    }
    for (int i = 0; i < 80; i++) {
        double mid = sqrt(lo * hi);
        scale_compute(hw, &base, mid);
        if (mgc_cost_plan(p, &o, &r, err, errsz)) return -1;
        if (r.step_s > step_s) lo = mid;
        else hi = mid;
    }
    *factor = sqrt(lo * hi);
    scale_compute(hw, &base, *factor);
    return 0;
}

/* ---- reading a profile (JSON lines, flat objects) --------------------------------------- */

typedef struct jfield {
    char key[32];
    char str[256]; /* string value (truncated), or "" */
    double num;    /* number value, NAN when not a number */
} jfield;

/* Parse one flat JSON object; returns fields or -1 (syntax). */
static int parse_flat(const char *s, jfield *f, int max) {
    int n = 0;
    while (*s == ' ' || *s == '\t') s++;
    if (*s++ != '{') return -1;
    for (;;) {
        while (*s == ' ' || *s == '\t') s++;
        if (*s == '}') return n;
        if (*s != '"') return -1;
        s++;
        jfield tmp;
        memset(&tmp, 0, sizeof tmp);
        tmp.num = NAN;
        size_t k = 0;
        while (*s && *s != '"') {
            if (*s == '\\' && s[1]) s++;
            if (k + 1 < sizeof tmp.key) tmp.key[k++] = *s;
            s++;
        }
        if (*s++ != '"') return -1;
        while (*s == ' ') s++;
        if (*s++ != ':') return -1;
        while (*s == ' ') s++;
        if (*s == '"') {
            s++;
            k = 0;
            while (*s && *s != '"') {
                if (*s == '\\' && s[1]) s++;
                if (k + 1 < sizeof tmp.str) tmp.str[k++] = *s;
                s++;
            }
            if (*s++ != '"') return -1;
        } else if (*s == '{' || *s == '[') {
            return -1; /* nested values: not a profile record */
        } else {
            char *end = NULL;
            errno = 0;
            double v = strtod(s, &end);
            if (end == s) {
                /* true / false / null */
                const char *w[3] = {"true", "false", "null"};
                int m = 0;
                for (int i = 0; i < 3 && !m; i++)
                    if (!strncmp(s, w[i], strlen(w[i]))) s += strlen(w[i]), m = 1;
                if (!m) return -1;
            } else {
                tmp.num = v;
                s = end;
            }
        }
        if (n < max) f[n++] = tmp;
        while (*s == ' ') s++;
        if (*s == ',') s++;
        else if (*s != '}') return -1;
    }
}

static const jfield *get(const jfield *f, int n, const char *key) {
    for (int i = 0; i < n; i++)
        if (!strcmp(f[i].key, key)) return &f[i];
    return NULL;
}

static int instr_from_name(const char *s) {
    for (int op = 0; op < MGC_I__COUNT; op++)
        if (!strcmp(mgc_instr_op_name(op), s)) return op;
    return -1;
}

/* Read a profile file into samples; errors name the file and line. */
typedef struct prof_meta {
    double steps;       /* recorded steps (header) */
    double step_total;  /* sum over ranks of their step records' total_s */
    int64_t ranks;      /* step records */
    char device[128];   /* header's device */
    char backend[32];
    int device_timing;  /* header's op_timing is "device" (absent: "host") */
} prof_meta;

static int read_profile(const char *path, mgc_calib_sample **out, int64_t *nout, prof_meta *meta, char *err,
                        size_t errsz) {
    *out = NULL;
    *nout = 0;
    memset(meta, 0, sizeof *meta);
    FILE *fp = fopen(path, "r");
    if (!fp) {
        snprintf(err, errsz, "cannot read %s: %s", path, strerror(errno));
        return -1;
    }
    char line[8192];
    int64_t lineno = 0, cap = 0, n = 0;
    mgc_calib_sample *v = NULL;
    int header = 0, rc = -1;
    while (fgets(line, sizeof line, fp)) {
        lineno++;
        size_t len = strlen(line);
        if (len == sizeof line - 1 && line[len - 1] != '\n') {
            snprintf(err, errsz, "%s:%lld: line too long for a profile record", path, (long long)lineno);
            goto done;
        }
        if (len <= 1) continue;
        jfield f[24];
        int nf = parse_flat(line, f, 24);
        const jfield *type = nf >= 0 ? get(f, nf, "type") : NULL;
        if (nf < 0 || !type) {
            snprintf(err, errsz, "%s:%lld: not a profile record (JSON object with a \"type\"); hint: give the file "
                                 "`mgc-run --profile` wrote",
                     path, (long long)lineno);
            goto done;
        }
        if (!strcmp(type->str, "header")) {
            const jfield *fmt = get(f, nf, "format");
            if (!fmt || strcmp(fmt->str, "mgc-profile-1")) {
                snprintf(err, errsz, "%s:%lld: unknown profile format '%s' (this mgc reads mgc-profile-1)", path,
                         (long long)lineno, fmt ? fmt->str : "");
                goto done;
            }
            header = 1;
            const jfield *steps = get(f, nf, "steps"), *dev = get(f, nf, "device"), *be = get(f, nf, "backend");
            if (steps && !isnan(steps->num)) meta->steps = steps->num;
            if (dev) snprintf(meta->device, sizeof meta->device, "%.127s", dev->str);
            if (be) snprintf(meta->backend, sizeof meta->backend, "%.31s", be->str);
            const jfield *tm = get(f, nf, "op_timing");
            meta->device_timing = tm && !strcmp(tm->str, "device");
            continue;
        }
        if (!strcmp(type->str, "step")) {
            const jfield *tot = get(f, nf, "total_s");
            if (tot && !isnan(tot->num)) meta->step_total += tot->num;
            meta->ranks++;
            continue;
        }
        int is_op = !strcmp(type->str, "op"), is_instr = !strcmp(type->str, "instr");
        if (!is_op && !is_instr) continue; /* future kinds */
        mgc_calib_sample s;
        memset(&s, 0, sizeof s);
        const jfield *st = get(f, nf, "stage"), *ck = get(f, nf, "chunk"), *mean = get(f, nf, "mean_s"),
                     *calls = get(f, nf, "calls");
        if (!st || !mean || !calls || isnan(st->num) || isnan(mean->num) || isnan(calls->num)) {
            snprintf(err, errsz, "%s:%lld: a %s record needs stage, mean_s and calls", path, (long long)lineno,
                     type->str);
            goto done;
        }
        s.stage = (int64_t)st->num;
        s.chunk = ck && !isnan(ck->num) ? (int64_t)ck->num : 0;
        s.mean_s = mean->num;
        s.calls = calls->num;
        if (is_op) {
            const jfield *pass = get(f, nf, "pass"), *idx = get(f, nf, "index");
            if (!pass || !idx || isnan(idx->num) || (strcmp(pass->str, "fwd") && strcmp(pass->str, "bwd"))) {
                snprintf(err, errsz, "%s:%lld: an op record needs pass (fwd|bwd) and index", path,
                         (long long)lineno);
                goto done;
            }
            s.bwd = !strcmp(pass->str, "bwd");
            s.index = (int64_t)idx->num;
            const jfield *kind = get(f, nf, "kind");
            if (kind) snprintf(s.kind, sizeof s.kind, "%.31s", kind->str);
        } else {
            const jfield *op = get(f, nf, "op"), *arg = get(f, nf, "arg");
            int k = op ? instr_from_name(op->str) : -1;
            if (k < 0) {
                snprintf(err, errsz, "%s:%lld: unknown instruction '%s'", path, (long long)lineno, op ? op->str : "");
                goto done;
            }
            s.instr = k + 1;
            s.arg = arg && !isnan(arg->num) && arg->num >= 0 ? (uint32_t)arg->num : 0;
        }
        if (n == cap) {
            int64_t nc = cap ? cap * 2 : 256;
            mgc_calib_sample *nv = realloc(v, (size_t)nc * sizeof *nv);
            if (!nv) {
                snprintf(err, errsz, "out of memory reading %s", path);
                goto done;
            }
            v = nv, cap = nc;
        }
        v[n++] = s;
    }
    if (ferror(fp)) {
        snprintf(err, errsz, "cannot read %s: %s", path, strerror(errno));
        goto done;
    }
    if (!header) {
        snprintf(err, errsz, "%s: no header record: not a file `mgc-run --profile` wrote", path);
        goto done;
    }
    rc = 0;
done:
    fclose(fp);
    if (rc) free(v);
    else *out = v, *nout = n;
    return rc;
}

/* ---- the command ---------------------------------------------------------------------- */

static int usage_err(const char *msg) {
    fprintf(stderr, "mgc calibrate: %s\nusage: mgc calibrate PLAN PROFILE.jsonl [--hardware NAME] [--name NEW] "
                    "[-o OUT.yaml]\n       mgc calibrate PLAN --step-time SECONDS [--hardware NAME] [--name NEW] "
                    "[-o OUT.yaml]\n",
            msg);
    return 2;
}

/* Write the profile atomically (temp + rename) or to stdout for "-"/NULL.
 * An existing path that is not a regular file (/dev/null, a pipe) is
 * written in place: renaming over it would replace the device. */
static int write_profile(const mgc_hw *hw, const char *comment, const char *path) {
    if (!path || !strcmp(path, "-")) return mgc_hw_write_yaml(hw, comment, stdout) ? 1 : 0;
    if (mgc_path_is_special(path)) {
        FILE *f = fopen(path, "w");
        if (!f) {
            fprintf(stderr, "mgc calibrate: cannot write %s: %s\n", path, strerror(errno));
            return 1;
        }
        int bad = mgc_hw_write_yaml(hw, comment, f) != 0;
        bad |= fclose(f) != 0;
        if (bad) fprintf(stderr, "mgc calibrate: cannot write %s\n", path);
        return bad;
    }
    char tmp[4200];
    snprintf(tmp, sizeof tmp, "%s.partial", path);
    FILE *f = fopen(tmp, "w");
    if (!f) {
        fprintf(stderr, "mgc calibrate: cannot write %s: %s\n", tmp, strerror(errno));
        return 1;
    }
    int bad = mgc_hw_write_yaml(hw, comment, f) != 0;
    bad |= fclose(f) != 0;
    if (bad || rename(tmp, path) != 0) {
        fprintf(stderr, "mgc calibrate: cannot write %s: %s\n", path, strerror(errno));
        remove(tmp);
        return 1;
    }
    return 0;
}

int mgc_cmd_calibrate(int argc, char **argv) {
    const char *files[2] = {NULL, NULL}, *hwname = NULL, *newname = NULL, *out = NULL;
    double step_s = -1;
    int nfiles = 0;
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        int has = i + 1 < argc;
        if (!strcmp(a, "--hardware") && has) hwname = argv[++i];
        else if (!strcmp(a, "--name") && has) newname = argv[++i];
        else if ((!strcmp(a, "-o") || !strcmp(a, "--output")) && has) out = argv[++i];
        else if (!strcmp(a, "--step-time") && has) {
            char *end = NULL;
            step_s = strtod(argv[++i], &end);
            if (!end || *end || !(step_s > 0) || !isfinite(step_s))
                return usage_err("--step-time needs a positive number of seconds");
        } else if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage_err("fit a hardware profile's efficiency factors to measured times (docs/cost-model.md)");
            return 0;
        } else if (a[0] == '-' && a[1]) {
            char m[256];
            snprintf(m, sizeof m, "unknown option or missing value: '%s'", a);
            return usage_err(m);
        } else if (nfiles < 2) {
            files[nfiles++] = a;
        } else {
            return usage_err("too many files");
        }
    }
    if (nfiles < 1) return usage_err("give the plan");
    if ((step_s > 0) == (nfiles == 2)) return usage_err("give either a profile file or --step-time, not both");
    if (newname) {
        int ok = newname[0] && strlen(newname) < 64;
        for (const char *c = newname; ok && *c; c++)
            ok = (*c >= 'a' && *c <= 'z') || (*c >= '0' && *c <= '9') || *c == '-' || *c == '_' || *c == '.';
        if (!ok) return usage_err("--name: lower-case letters, digits, '-', '_' and '.' (at most 63)");
    }

    mgc_plan *p = NULL;
    char err[1024];
    if (mgc_plan_read(files[0], &p, err, sizeof err) != MGC_PLAN_OK) {
        fprintf(stderr, "mgc calibrate: %s\n", err);
        return 1;
    }
    int rc = 1;
    mgc_diags d;
    mgc_diags_init(&d);
    mgc_hw hw, before;
    mgc_calib_sample *samples = NULL;
    int64_t n = 0;
    const char *name = hwname ? hwname : mgc_plan_config_str(p, "hardware.gpu");
    if (mgc_hw_load_at(name ? name : "", (mgc_loc){hwname ? "--hardware" : files[0], 0, 0}, &hw, &d)) {
        mgc_diags_print(&d, stderr);
        goto done;
    }
    before = hw;
    char comment[4096];
    if (step_s > 0) {
        double k = 0;
        if (mgc_calibrate_step(p, step_s, &hw, &k, err, sizeof err)) {
            fprintf(stderr, "mgc calibrate: %s\n", err);
            goto done;
        }
        mgc_cost_options o;
        memset(&o, 0, sizeof o);
        o.hw = &before;
        mgc_cost_report r0, r1;
        if (mgc_cost_plan(p, &o, &r0, err, sizeof err)) {
            fprintf(stderr, "mgc calibrate: %s\n", err);
            goto done;
        }
        o.hw = &hw;
        if (mgc_cost_plan(p, &o, &r1, err, sizeof err)) {
            fprintf(stderr, "mgc calibrate: %s\n", err);
            goto done;
        }
        fprintf(stderr,
                "mgc calibrate: step %.4g s measured, %.4g s predicted before, %.4g s after: compute efficiencies "
                "x %.4f (gemm %.3f -> %.3f, attention %.3f/%.3f -> %.3f/%.3f, memory %.3f -> %.3f)\n",
                step_s, r0.step_s, r1.step_s, k, before.eff.gemm, hw.eff.gemm, before.eff.attention_fwd,
                before.eff.attention_bwd, hw.eff.attention_fwd, hw.eff.attention_bwd, before.eff.memory,
                hw.eff.memory);
        snprintf(comment, sizeof comment,
                 "%s fitted by `mgc calibrate %s --step-time %g`: compute efficiencies x %.4f\n"
                 "predicted step %.4g s before, %.4g s after (measured %.4g s)",
                 before.name, files[0], step_s, k, r0.step_s, r1.step_s, step_s);
    } else {
        prof_meta meta;
        if (read_profile(files[1], &samples, &n, &meta, err, sizeof err)) {
            fprintf(stderr, "mgc calibrate: %s\n", err);
            goto done;
        }
        mgc_calib_fit fit;
        if (mgc_calibrate_ops(p, samples, n, &hw, &fit, err, sizeof err)) {
            fprintf(stderr, "mgc calibrate: %s: %s\n", files[1], err);
            goto done;
        }
        int k = snprintf(comment, sizeof comment, "%s fitted by `mgc calibrate %s %s` (%lld records)\n", before.name,
                         files[0], files[1], (long long)n);
        fprintf(stderr, "%-14s %8s %12s %12s %12s %8s %8s\n", "factor", "records", "measured s", "before s", "after s",
                "old", "new");
        for (int f = 0; f < MGC_CALIB__COUNT; f++) {
            fprintf(stderr, "%-14s %8lld %12.6g %12.6g %12.6g %8.4f %8.4f%s\n", factor_names[f],
                    (long long)fit.samples[f], fit.measured_s[f], fit.before_s[f], fit.after_s[f], fit.old_eff[f],
                    fit.new_eff[f], fit.samples[f] ? "" : "  (no records: kept)");
            if (fit.samples[f] && k > 0 && (size_t)k < sizeof comment)
                k += snprintf(comment + k, sizeof comment - (size_t)k,
                              "%s: %lld records, measured %.6g s, predicted %.6g s before, %.6g s after\n",
                              factor_names[f], (long long)fit.samples[f], fit.measured_s[f], fit.before_s[f],
                              fit.after_s[f]);
        }
        if (k > 0 && (size_t)k < sizeof comment && comment[k - 1] == '\n') comment[k - 1] = 0;
    }
    if (newname) snprintf(hw.name, sizeof hw.name, "%s", newname);
    else snprintf(hw.name, sizeof hw.name, "%.50s-calibrated", before.name);
    rc = write_profile(&hw, comment, out);
    if (rc == 0 && out && strcmp(out, "-")) fprintf(stderr, "wrote %s (profile '%s')\n", out, hw.name);
done:
    free(samples);
    mgc_diags_free(&d);
    mgc_plan_free(p);
    return rc;
}

/* ---- mgc profile: achieved bandwidth and FLOP/s per kernel --------------------------------- */

typedef struct kagg {
    int kind, bwd;
    int64_t ops;          /* distinct ops */
    double calls, time_s; /* summed over records */
    double bytes, flops;  /* moved / executed, times calls */
} kagg;

/* A kind whose ops' bytes take less than this at copy bandwidth, on average a call, is bound by
 * a launch's latency (a few microseconds), not by memory: its bandwidth is shown but not judged
 * against the 80% line. */
#define LATENCY_BOUND_S 1e-6

/* A memory-bound kind's (no FLOPs, no communication) bytes per second as a percentage of
 * copy_gbs; -1 for the others and for kinds without time, -2 for latency-bound ones. */
static double mem_pct(const kagg *k, double copy_gbs) {
    if (k->flops > 0 || k->kind >= MGC_POP_ALL_REDUCE || !(k->time_s > 0)) return -1;
    if (!(k->calls > 0) || k->bytes / k->calls / (copy_gbs * 1e9) < LATENCY_BOUND_S) return -2;
    return 100 * k->bytes / k->time_s / 1e9 / copy_gbs;
}

static int kagg_cmp(const void *a, const void *b) {
    const kagg *x = a, *y = b;
    return x->time_s < y->time_s ? 1 : x->time_s > y->time_s ? -1 : (x->kind - y->kind) * 2 + (x->bwd - y->bwd);
}

int mgc_cmd_profile(int argc, char **argv) {
    const char *files[2] = {NULL, NULL}, *hwname = NULL;
    double copy_gbs = 0, gemm_tflops = 0;
    int nfiles = 0;
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        int has = i + 1 < argc;
        if (!strcmp(a, "--hardware") && has) {
            hwname = argv[++i];
        } else if ((!strcmp(a, "--copy-gbs") || !strcmp(a, "--gemm-tflops")) && has) {
            char *end = NULL;
            double v = strtod(argv[++i], &end);
            if (!end || *end || !(v > 0) || !isfinite(v)) {
                fprintf(stderr, "mgc profile: %s needs a positive number\n", a);
                return 2;
            }
            if (a[2] == 'c') copy_gbs = v;
            else gemm_tflops = v;
        } else if (a[0] == '-' && a[1]) {
            fprintf(stderr, "mgc profile: unknown option or missing value: '%s'\n"
                            "usage: mgc profile PLAN PROFILE.jsonl [--copy-gbs GB/s] [--gemm-tflops TFLOP/s] "
                            "[--hardware NAME]\n",
                    a);
            return 2;
        } else if (nfiles < 2) {
            files[nfiles++] = a;
        } else {
            fputs("mgc profile: too many files\n", stderr);
            return 2;
        }
    }
    if (nfiles != 2) {
        fputs("usage: mgc profile PLAN PROFILE.jsonl [--copy-gbs GB/s] [--gemm-tflops TFLOP/s] [--hardware NAME]\n",
              stderr);
        return 2;
    }
    mgc_plan *p = NULL;
    char err[1024];
    if (mgc_plan_read(files[0], &p, err, sizeof err) != MGC_PLAN_OK) {
        fprintf(stderr, "mgc profile: %s\n", err);
        return 1;
    }
    int rc = 1;
    mgc_calib_sample *s = NULL;
    int64_t n = 0;
    prof_meta meta;
    kagg *agg = NULL;
    int64_t na = 0;
    mgc_diags d;
    mgc_diags_init(&d);
    mgc_hw hw;
    if (read_profile(files[1], &s, &n, &meta, err, sizeof err)) {
        fprintf(stderr, "mgc profile: %s\n", err);
        goto done;
    }
    const char *name = hwname ? hwname : mgc_plan_config_str(p, "hardware.gpu");
    if (mgc_hw_load_at(name ? name : "", (mgc_loc){hwname ? "--hardware" : files[0], 0, 0}, &hw, &d)) {
        mgc_diags_print(&d, stderr);
        goto done;
    }
    int64_t prec = 1;
    if (!mgc_plan_config_int(p, "training.precision", &prec) || prec < 0 || prec > 2) prec = 1;
    /* ceilings: measured in the same run when given, else the profile's */
    const char *src_copy = copy_gbs > 0 ? "measured" : "profile", *src_gemm = gemm_tflops > 0 ? "measured" : "profile";
    if (!(copy_gbs > 0)) copy_gbs = hw.memory_bw * hw.eff.memory / 1e9;
    if (!(gemm_tflops > 0)) gemm_tflops = hw.peak_flops[prec] * hw.eff.gemm / 1e12;
    agg = calloc((size_t)(2 * MGC_POP__END), sizeof *agg);
    if (!agg) goto done;
    double total = 0;
    int64_t bad = first_mismatch(p, s, n);
    if (bad >= 0) {
        fprintf(stderr, "mgc profile: %s: op record %lld ('%s') is not an op of %s: was it measured on another plan?\n",
                files[1], (long long)bad, s[bad].kind, files[0]);
        goto done;
    }
    for (int64_t i = 0; i < n; i++) {
        const mgc_calib_sample *x = &s[i];
        const mgc_plan_chunk *ch = NULL;
        const mgc_plan_op *op = record_op(p, x, &ch);
        if (!op || op->kind >= MGC_POP__END) continue;
        kagg *k = &agg[op->kind * 2 + x->bwd];
        k->kind = op->kind;
        k->bwd = x->bwd;
        k->ops++;
        k->calls += x->calls;
        k->time_s += x->mean_s * x->calls;
        k->bytes += mgc_cost_op_bytes(p, ch, op) * x->calls;
        k->flops += (double)op->flops * x->calls;
        total += x->mean_s * x->calls;
    }
    qsort(agg, (size_t)(2 * MGC_POP__END), sizeof *agg, kagg_cmp);
    for (na = 0; na < 2 * MGC_POP__END && agg[na].calls > 0; na++) {
    }
    if (na == 0) {
        fprintf(stderr, "mgc profile: %s: no op record matches the plan %s\n", files[1], files[0]);
        goto done;
    }
    double per = meta.steps > 0 && meta.ranks > 0 ? meta.steps * (double)meta.ranks : 1;
    printf("# Kernels of %s measured on %s (%s backend)\n\n", files[0], meta.device[0] ? meta.device : "?",
           meta.backend[0] ? meta.backend : "?");
    printf("Ceilings: copy %.1f GB/s (%s), GEMM %.1f TFLOP/s (%s). Bytes are each op's inputs and outputs;\n"
           "FLOPs the plan's (GEMMs and attention). Time per step per rank; %s.\n\n",
           copy_gbs, src_copy, gemm_tflops, src_gemm,
           meta.device_timing ? "each op's on the device\n(mgc-run --profile: timers queued around its work, no host sync "
                                "between ops)"
                              : "ops run one at a time\n(mgc-run --profile synchronises around each)");
    printf("| kernel | pass | ops | ms/step | share | GB/s | %% of copy | TFLOP/s | %% of GEMM |\n");
    printf("|---|---|---:|---:|---:|---:|---:|---:|---:|\n");
    for (int64_t i = 0; i < na; i++) {
        const kagg *k = &agg[i];
        double gbs = k->time_s > 0 ? k->bytes / k->time_s / 1e9 : 0;
        double tfl = k->time_s > 0 ? k->flops / k->time_s / 1e12 : 0;
        int compute = k->flops > 0;
        int is_comm = k->kind >= MGC_POP_ALL_REDUCE;
        char cpy[32] = "", tf[32] = "", gm[32] = "";
        if (compute) {
            snprintf(tf, sizeof tf, "%.3g", tfl);
            snprintf(gm, sizeof gm, "%.0f%%", 100 * tfl / gemm_tflops);
        } else if (!is_comm) {
            snprintf(cpy, sizeof cpy, "%.0f%%", 100 * gbs / copy_gbs);
        }
        printf("| %s | %s | %lld | %.3f | %.1f%% | %.1f | %s | %s | %s |\n", mgc_plan_op_name((mgc_plan_op_kind)k->kind),
               k->bwd ? "bwd" : "fwd", (long long)k->ops, k->time_s / per * 1e3, 100 * k->time_s / total, gbs, cpy, tf,
               gm);
    }
    /* the memory-bound kinds against 80% of copy, in the table's order */
    double mem_t = 0, mem_ok_t = 0;
    int n_mem = 0, n_ok = 0;
    int n_lat = 0;
    for (int64_t i = 0; i < na; i++) {
        double pct = mem_pct(&agg[i], copy_gbs);
        n_lat += pct == -2;
        if (pct < 0) continue;
        n_mem++, mem_t += agg[i].time_s;
        if (pct >= 80) n_ok++, mem_ok_t += agg[i].time_s;
    }
    if (n_mem) {
        printf("\nMemory-bound kinds at 80%% of copy or more: %d of %d (%.1f%% of their time).", n_ok, n_mem,
               100 * mem_ok_t / mem_t);
        const char *sep = " Below:";
        for (int64_t i = 0; i < na; i++) {
            double pct = mem_pct(&agg[i], copy_gbs);
            if (pct < 0 || pct >= 80) continue;
            printf("%s %s %s %.0f%% (%.3f ms)", sep, mgc_plan_op_name((mgc_plan_op_kind)agg[i].kind),
                   agg[i].bwd ? "bwd" : "fwd", pct, agg[i].time_s / per * 1e3);
            sep = ",";
        }
        printf("%s\n", n_ok < n_mem ? "." : "");
    }
    if (n_lat) {
        printf("\nLatency-bound kinds, not judged (their bytes take under %.0f us a call at copy "
               "bandwidth):",
               LATENCY_BOUND_S * 1e6);
        const char *sep = "";
        for (int64_t i = 0; i < na; i++) {
            if (mem_pct(&agg[i], copy_gbs) != -2) continue;
            printf("%s %s %s (%.3f ms)", sep, mgc_plan_op_name((mgc_plan_op_kind)agg[i].kind),
                   agg[i].bwd ? "bwd" : "fwd", agg[i].time_s / per * 1e3);
            sep = ",";
        }
        printf(".\n");
    }
    printf("\nOps total %.3f ms per step per rank", total / per * 1e3);
    if (meta.step_total > 0) printf(" of a measured %.3f ms step", meta.step_total / per * 1e3);
    printf(".\n");
    rc = 0;
done:
    free(agg);
    free(s);
    mgc_diags_free(&d);
    mgc_plan_free(p);
    return rc;
}
