/* main.c - the `mgc` command line.
 *
 *   mgc check [--set K=V]... [--json] [--format=github] FILE...
 *   mgc info  [--set K=V]... [--json] [--ir] [--config] FILE
 *   mgc schema --json | --markdown
 *   mgc version
 *
 * Exit status: 0 success, 1 an input has errors, 2 bad usage. */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "calibrate.h"
#include "check.h"
#include "codegen.h"
#include "compile.h"
#include "config.h"
#include "cost.h"
#include "data_cmd.h"
#include "diag.h"
#include "facts.h"
#include "hwprofile.h"
#include "kernels.h"
#include "nvrtc.h"
#include "partition.h"
#include "ir.h"
#include "json.h"
#include "plan.h"
#include "plan_report.h"
#include "schedule.h"
#include "schema.h"
#include "sweep.h"

#ifndef MGC_VERSION
#define MGC_VERSION "0.0.0"
#endif

static void usage(FILE *out) {
    fputs("usage: mgc <command> [options] [FILE...]\n"
          "\n"
          "commands:\n"
          "  check FILE...     validate model configs; every problem is reported at once\n"
          "  info FILE         model facts: parameters, FLOPs per iteration, layout\n"
          "  compile FILE      partition, schedule and memory-plan the model; -o PLAN writes the plan\n"
          "  inspect PLAN      explain a plan file (--memory: arena breakdown)\n"
          "  data              build Megatron indexed datasets: data build, data synthetic, data info\n"
          "  calibrate PLAN    fit a hardware profile to measured times (mgc-run --profile, or --step-time)\n"
          "  hardware [NAME]   list the hardware profiles, or print one as YAML\n"
          "  profile PLAN PROF each kernel's measured time, GB/s and TFLOP/s against the ceilings\n"
          "  sweep FILE        rank variants (--vary KEY=V1,V2,...) by predicted throughput (sweep --help)\n"
          "  schema            print the config schema (--json: JSON Schema, --markdown: key table)\n"
          "  version           print the version and the CUDA toolchain this build found\n"
          "\n"
          "options for check and info:\n"
          "  --set KEY=VALUE   override a key, e.g. --set parallel.tensor=4 (repeatable)\n"
          "  --json            machine-readable output on stdout (docs/facts.md)\n"
          "  --format=github   check: print diagnostics as GitHub Actions annotations\n"
          "  -q, --quiet       check: print diagnostics only\n"
          "  --ir              info: print the model IR (one microbatch's forward graph)\n"
          "  --config          info: print the resolved config (every key, defaults filled in)\n"
          "  -o PLAN           compile: write the plan to PLAN (atomically)\n"
          "  --memory          compile, inspect: per-stage arena breakdown\n"
          "  --ops             inspect: list every chunk's tensors and forward/backward ops\n"
          "  --arch 80,90      compile: GPU architectures of the plan's kernels (default:\n"
          "                    hardware.cuda_archs)\n"
          "  --no-kernels      compile: no CUDA kernels in the plan (mgc-run JIT-compiles them)\n"
          "  --timeline SVG    compile, inspect: draw the pipeline schedule as an SVG Gantt chart\n"
          "  --hardware NAME   compile, inspect: predict on this profile (default: hardware.gpu)\n"
          "  --no-predict      compile, inspect: no cost-model prediction\n"
          "  --no-grad-overlap compile, inspect: predict gradient reductions after the backward\n"
          "  --target GPU:N    check: compile for N GPUs of profile GPU and check the memory fits\n"
          "  --headroom PCT    check --target: memory kept free (default 10)\n"
          "\n"
          "exit status: 0 ok, 1 an input has errors, 2 usage error\n",
          out);
}

typedef struct opts {
    const char **sets; /* --set values */
    int nsets;
    const char **files;
    int nfiles;
    int json, github, quiet, ir, config, memory, ops, no_kernels;
    const char *archs;    /* --arch */
    const char *output;   /* -o */
    const char *timeline; /* --timeline */
    const char *hardware; /* --hardware: profile name or file for the prediction */
    const char *target;   /* check --target GPU:N */
    double headroom;      /* check --headroom PCT (fraction) */
    int no_predict;       /* compile/inspect: no cost-model prediction */
    int no_grad_overlap;  /* the prediction: gradient reductions after the backward */
} opts;

static int parse_opts(int argc, char **argv, opts *o, const char *cmd) {
    memset(o, 0, sizeof *o);
    o->headroom = -1; /* unset: the command's default */
    o->sets = calloc((size_t)argc, sizeof *o->sets);
    o->files = calloc((size_t)argc, sizeof *o->files);
    if (!o->sets || !o->files) return fprintf(stderr, "mgc: out of memory\n"), 0;
    int only_files = 0;
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        if (only_files || a[0] != '-' || !strcmp(a, "-")) {
            o->files[o->nfiles++] = a;
        } else if (!strcmp(a, "--")) {
            only_files = 1;
        } else if (!strcmp(a, "--set")) {
            if (i + 1 >= argc) return fprintf(stderr, "mgc %s: --set needs KEY=VALUE\n", cmd), 0;
            o->sets[o->nsets++] = argv[++i];
        } else if (!strncmp(a, "--set=", 6)) {
            o->sets[o->nsets++] = a + 6;
        } else if (!strcmp(a, "--json")) {
            o->json = 1;
        } else if (!strcmp(a, "--format=github") || !strcmp(a, "--github")) {
            o->github = 1;
        } else if (!strcmp(a, "-q") || !strcmp(a, "--quiet")) {
            o->quiet = 1;
        } else if (!strcmp(a, "--ir")) {
            o->ir = 1;
        } else if (!strcmp(a, "--config")) {
            o->config = 1;
        } else if (!strcmp(a, "--memory")) {
            o->memory = 1;
        } else if (!strcmp(a, "--ops")) {
            o->ops = 1;
        } else if (!strcmp(a, "--no-kernels")) {
            o->no_kernels = 1;
        } else if (!strcmp(a, "--no-predict")) {
            o->no_predict = 1;
        } else if (!strcmp(a, "--no-grad-overlap")) {
            o->no_grad_overlap = 1;
        } else if (!strcmp(a, "--hardware") || !strcmp(a, "--target") || !strcmp(a, "--headroom")) {
            if (i + 1 >= argc) return fprintf(stderr, "mgc %s: %s needs a value\n", cmd, a), 0;
            const char *v = argv[++i];
            if (!strcmp(a, "--hardware")) {
                o->hardware = v;
            } else if (!strcmp(a, "--target")) {
                o->target = v;
            } else {
                char *end = NULL;
                double h = strtod(v, &end);
                if (end && *end == '%') end++;
                if (!end || end == v || *end || !(h >= 0 && h < 100)) {
                    fprintf(stderr, "mgc %s: --headroom %s: expected a percentage in [0, 100), e.g. 10\n", cmd, v);
                    return 0;
                }
                o->headroom = h / 100;
            }
        } else if (!strcmp(a, "--arch")) {
            if (i + 1 >= argc) return fprintf(stderr, "mgc %s: --arch needs a list, e.g. 80,90\n", cmd), 0;
            o->archs = argv[++i];
        } else if (!strcmp(a, "-o") || !strcmp(a, "--output") || !strcmp(a, "--timeline")) {
            if (i + 1 >= argc) return fprintf(stderr, "mgc %s: %s needs a file name\n", cmd, a), 0;
            if (!strcmp(a, "--timeline")) o->timeline = argv[++i];
            else o->output = argv[++i];
        } else {
            fprintf(stderr, "mgc %s: unknown option '%s' (see mgc help)\n", cmd, a);
            return 0;
        }
    }
    return 1;
}

static void free_opts(opts *o) {
    free(o->sets);
    free(o->files);
}

/* Everything `check` and `info` need about one file. */
typedef struct loaded {
    mgc_config *cfg;
    mgc_graph *graph;
    mgc_facts facts;
    mgc_diags diags;
    int ok; /* no errors: config, IR and facts are valid */
} loaded;

static void load(const char *file, const opts *o, loaded *L) {
    memset(L, 0, sizeof *L);
    mgc_diags_init(&L->diags);
    L->cfg = mgc_config_new();
    if (!L->cfg) {
        mgc_diag(&L->diags, MGC_SEV_ERROR, (mgc_loc){file, 0, 0}, NULL, "out of memory");
        return;
    }
    if (!strcmp(file, "-")) {
        /* stdin: read it all (the YAML reader enforces the size limit) */
        size_t cap = 1 << 14, len = 0;
        char *buf = malloc(cap);
        while (buf) {
            if (len == cap) {
                char *nb = cap > (8u << 20) ? NULL : realloc(buf, cap * 2);
                if (!nb) break;
                buf = nb, cap *= 2;
            }
            size_t r = fread(buf + len, 1, cap - len, stdin);
            if (!r) break;
            len += r;
        }
        if (buf) mgc_config_load_text(L->cfg, "<stdin>", buf, len, &L->diags);
        else mgc_diag(&L->diags, MGC_SEV_ERROR, (mgc_loc){"<stdin>", 0, 0}, NULL, "out of memory");
        free(buf);
    } else {
        mgc_config_load_file(L->cfg, file, &L->diags);
    }
    /* overrides apply even when the file had errors, so all problems show */
    for (int i = 0; i < o->nsets; i++) {
        char origin[32];
        snprintf(origin, sizeof origin, "--set #%d", i + 1);
        mgc_config_set(L->cfg, o->sets[i], origin, &L->diags);
    }
    if (o->target) {
        /* --target GPU:N (checked by cmd_check): the profile and the world size */
        const char *colon = strrchr(o->target, ':');
        char set[300];
        snprintf(set, sizeof set, "hardware.gpu=\"%.*s\"", (int)(colon - o->target), o->target);
        mgc_config_set(L->cfg, set, "--target", &L->diags);
        snprintf(set, sizeof set, "parallel.world_size=%s", colon + 1);
        mgc_config_set(L->cfg, set, "--target", &L->diags);
    }
    /* consistency rules run only over a config whose keys all parsed */
    if (L->diags.errors == 0) mgc_config_finalize(L->cfg, &L->diags);
    /* the target hardware must be a profile the cost model knows */
    if (L->diags.errors == 0) {
        mgc_hw hw;
        mgc_hw_load_at(L->cfg->hardware.gpu, mgc_config_loc(L->cfg, MGC_KEY_HW_GPU), &hw, &L->diags);
    }
    if (L->diags.errors == 0) {
        L->graph = mgc_ir_build(L->cfg, &L->diags);
        if (L->graph && L->diags.errors == 0) mgc_facts_compute(L->cfg, L->graph, &L->facts, &L->diags);
    }
    L->ok = L->diags.errors == 0;
    mgc_diags_sort(&L->diags);
}

static void unload(loaded *L) {
    mgc_ir_free(L->graph);
    mgc_config_free(L->cfg);
    mgc_diags_free(&L->diags);
}

static void diags_json(mgc_json *j, const mgc_diags *d) {
    mgc_json_arr_begin(j, "diagnostics");
    for (int i = 0; i < d->n; i++) {
        const mgc_diag_entry *e = &d->v[i];
        mgc_json_obj_begin(j, NULL);
        mgc_json_str(j, "severity", mgc_severity_name(e->sev));
        mgc_json_str(j, "file", e->file);
        mgc_json_int(j, "line", e->loc.line);
        mgc_json_int(j, "col", e->loc.col);
        mgc_json_str(j, "message", e->msg);
        mgc_json_str(j, "hint", e->hint);
        mgc_json_obj_end(j);
    }
    mgc_json_arr_end(j);
}

static void print_diags(const loaded *L, const opts *o) {
    if (o->github) mgc_diags_print_github(&L->diags, stdout);
    else mgc_diags_print(&L->diags, stderr);
}

/* The cost model's prediction for a plan on the profile `hwname`; diagnostics
 * (an unknown profile, a plan it cannot cost) point at `at`.  0 ok. */
static int predict(const mgc_plan *p, const char *hwname, mgc_loc at, int no_overlap, mgc_hw *hw,
                   mgc_cost_report *r, mgc_diags *d);

/* The largest arena of `file` compiled with the user's --set and `extra` after them; -1 when
 * it does not compile. */
static double arena_with(const char *file, const opts *o, const char *const *extra, int n_extra) {
    opts o2 = *o;
    const char **sets = malloc((size_t)(o->nsets + n_extra) * sizeof *sets);
    if (!sets) return -1;
    memcpy(sets, o->sets, (size_t)o->nsets * sizeof *sets);
    memcpy(sets + o->nsets, extra, (size_t)n_extra * sizeof *sets);
    o2.sets = sets, o2.nsets = o->nsets + n_extra;
    loaded V;
    load(file, &o2, &V);
    mgc_plan *p = V.ok ? mgc_compile(V.cfg, V.graph, &V.diags) : NULL;
    mgc_hw hw;
    mgc_cost_report cr;
    double arena = -1;
    if (p && predict(p, V.cfg->hardware.gpu, V.cfg->file_loc, o->no_grad_overlap, &hw, &cr, &V.diags) == 0)
        arena = (double)cr.max_arena_bytes;
    mgc_plan_free(p);
    unload(&V);
    free(sets);
    return arena;
}

/* The hint for a config that does not fit: the largest arena with each memory option the config
 * does not use yet, compiled as it would be ("... 61.2 GiB with training.recompute: full
 * (fits)"), then the options no compile can try for it.  When full recompute fits, the fewest
 * layers it needs to recompute (block) that still fit, found by bisection. */
static void fit_options(const char *file, const opts *o, const mgc_config *c, double usable,
                        char *hint, size_t n) {
    static const struct {
        const char *set, *label;
    } v[] = {
        {"training.recompute_modules=[norm, activation, dropout]",
         "training.recompute_modules: [norm, activation, dropout]"},
        {NULL, NULL}, /* the second halves: mlp and/or moe, as the model's layers are */
        {"training.recompute=selective", "training.recompute: selective"},
        {"training.recompute=full", "training.recompute: full"},
        {"training.recompute_num_layers=2", "training.recompute_num_layers: 2"},
        {"parallel.distributed_optimizer=true", "parallel.distributed_optimizer: true"},
    };
    const mgc_training_cfg *t = &c->training;
    int64_t most = 0; /* decoder layers of the fullest pipeline chunk */
    for (int64_t s = 0; s < c->derived.num_stages; s++)
        most = c->derived.stages[s].num_layers > most ? c->derived.stages[s].num_layers : most;
    int full = t->recompute == MGC_RECOMPUTE_FULL, uniform1 = full && t->recompute_method == MGC_RECOMPUTE_UNIFORM &&
                                                                    t->recompute_num_layers == 1;
    int64_t moe_layers = c->moe.num_experts > 0 ? c->derived.num_moe_layers : 0;
    const char *halves = moe_layers == 0                       ? "mlp"
                         : moe_layers == c->model.num_layers ? "moe"
                                                              : "mlp, moe";
    char hset[96], hlabel[96];
    snprintf(hset, sizeof hset, "training.recompute_modules=[%s]", halves);
    snprintf(hlabel, sizeof hlabel, "training.recompute_modules: [%s]", halves);
    size_t at = 0;
    hint[0] = 0;
    for (size_t k = 0; k < sizeof v / sizeof v[0]; k++) {
        if ((k <= 1 && t->recompute_modules.n > 0) || (k <= 2 && full) ||
            (k == 2 && t->recompute != MGC_RECOMPUTE_NONE) || (k == 3 && full) ||
            (k == 4 && (!uniform1 || most < 2)) ||
            (k == 5 && (c->parallel.distributed_optimizer || c->parallel.data * c->parallel.context == 1)))
            continue;
        const char *set = v[k].set ? v[k].set : hset, *label = v[k].label ? v[k].label : hlabel;
        double arena = arena_with(file, o, &set, 1);
        if (arena >= 0 && at < n)
            at += (size_t)snprintf(hint + at, n - at, "%s%.2f GiB with %s%s", at ? "; " : "",
                                   arena / 1073741824.0, label, arena <= usable ? " (fits)" : "");
        if (k != 3 || arena < 0 || arena > usable || most < 2) continue;
        /* full recompute fits: the fewest recomputed layers a chunk that fit (the arena falls
         * as block recomputes more of them; the whole chunk is full recompute itself) */
        int64_t lo = 1, hi = most, best = -1;
        double best_arena = arena;
        char num[64];
        const char *blk[3] = {"training.recompute=full", "training.recompute_method=block", num};
        while (lo < hi) {
            int64_t mid = lo + (hi - lo) / 2;
            snprintf(num, sizeof num, "training.recompute_num_layers=%" PRId64, mid);
            double a = arena_with(file, o, blk, 3);
            if (a >= 0 && a <= usable) hi = mid, best = mid, best_arena = a;
            else lo = mid + 1;
        }
        if (best > 0 && at < n)
            at += (size_t)snprintf(hint + at, n - at,
                                   "; %.2f GiB with training.recompute: full, recompute_method: block, "
                                   "recompute_num_layers: %" PRId64 " (fits: the fewest layers a pipeline "
                                   "chunk recomputes that do)",
                                   best_arena / 1073741824.0, best);
    }
    if (at < n)
        snprintf(hint + at, n - at,
                 "%smore pipeline or tensor parallelism or a smaller micro batch lower it too "
                 "(mgc compile --memory shows the arena)",
                 at ? "; " : "");
}

static int predict(const mgc_plan *p, const char *hwname, mgc_loc at, int no_overlap, mgc_hw *hw,
                   mgc_cost_report *r, mgc_diags *d) {
    if (mgc_hw_load_at(hwname, at, hw, d)) return -1;
    mgc_cost_options co;
    memset(&co, 0, sizeof co);
    co.hw = hw;
    co.no_grad_overlap = no_overlap;
    char err[512];
    if (mgc_cost_plan(p, &co, r, err, sizeof err)) {
        mgc_diag(d, MGC_SEV_ERROR, at, "this is a bug in mgc; please report it with the config",
                 "cannot predict the step time: %s", err);
        return -1;
    }
    return 0;
}

static int cmd_check(int argc, char **argv) {
    opts o;
    if (!parse_opts(argc, argv, &o, "check")) return free_opts(&o), 2;
    if (o.nfiles == 0) {
        fputs("mgc check: no input files (usage: mgc check [--set K=V]... FILE...)\n", stderr);
        free_opts(&o);
        return 2;
    }
    if (o.headroom >= 0 && !o.target) {
        fputs("mgc check: --headroom needs --target GPU:N\n", stderr);
        free_opts(&o);
        return 2;
    }
    if (o.target) {
        const char *colon = strrchr(o.target, ':');
        char *end = NULL;
        long long n = colon ? strtoll(colon + 1, &end, 10) : 0;
        if (!colon || colon == o.target || colon - o.target > 250 || !end || end == colon + 1 || *end || n < 1 ||
            n > 16777216) {
            fprintf(stderr, "mgc check: --target %s: expected PROFILE:GPUS, e.g. h100-sxm:64\n", o.target);
            free_opts(&o);
            return 2;
        }
        if (o.headroom < 0) o.headroom = 0.10;
    }
    int failed = 0;
    mgc_json j;
    if (o.json) {
        mgc_json_init(&j, stdout, 2);
        mgc_json_obj_begin(&j, NULL);
        mgc_json_arr_begin(&j, "files");
    }
    for (int i = 0; i < o.nfiles; i++) {
        loaded L;
        load(o.files[i], &o, &L);
        /* --target: the plan must compile and its largest arena fit */
        mgc_hw hw;
        mgc_cost_report cr;
        int have_pred = 0, fits = 0;
        double usable = 0;
        char why[256];
        if (L.ok && o.target &&
            mgc_check_kernels_gap(L.cfg, why, sizeof why) != MGC_KERNELS_SERVED) {
            /* a GPU target needs the GPU kernels: the warning becomes the reason it fails */
            mgc_diag(&L.diags, MGC_SEV_ERROR, L.cfg->file_loc,
                     "change the setting the warning names, or train on the CPU backend",
                     "cannot run on %.*s: %s", (int)(strrchr(o.target, ':') - o.target), o.target, why);
            L.ok = 0;
        }
        if (L.ok && o.target) {
            mgc_plan *p = mgc_compile(L.cfg, L.graph, &L.diags);
            if (p) {
                p->model_flops_per_iter = L.facts.flops.model_per_iteration;
                mgc_loc at = mgc_config_loc(L.cfg, MGC_KEY_HW_GPU);
                if (predict(p, L.cfg->hardware.gpu, at, o.no_grad_overlap, &hw, &cr, &L.diags) == 0) {
                    have_pred = 1;
                    usable = hw.memory_bytes * (1 - o.headroom);
                    fits = (double)cr.max_arena_bytes <= usable;
                    if (!fits) {
                        int64_t worst = 0;
                        for (int64_t s = 0; s < p->n_stages; s++)
                            if (p->stages[s].arena_bytes > p->stages[worst].arena_bytes) worst = s;
                        char hint[2048];
                        fit_options(o.files[i], &o, L.cfg, usable, hint, sizeof hint);
                        mgc_diag(&L.diags, MGC_SEV_ERROR, L.cfg->file_loc, hint,
                                 "does not fit on %s: pipeline rank %lld needs %.2f GiB, %.2f GiB usable "
                                 "(%.2f GiB less %.0f%% headroom)",
                                 hw.name, (long long)worst, (double)cr.max_arena_bytes / 1073741824.0,
                                 usable / 1073741824.0, hw.memory_bytes / 1073741824.0, 100 * o.headroom);
                    }
                }
                mgc_plan_free(p);
            }
            mgc_diags_sort(&L.diags);
            L.ok = L.diags.errors == 0;
        }
        if (!L.ok) failed++;
        if (!o.json || L.diags.n) print_diags(&L, &o);
        if (o.json) {
            mgc_json_obj_begin(&j, NULL);
            mgc_json_str(&j, "file", o.files[i]);
            mgc_json_bool(&j, "ok", L.ok);
            mgc_json_int(&j, "errors", L.diags.errors);
            mgc_json_int(&j, "warnings", L.diags.warnings);
            if (L.ok) {
                mgc_json_str(&j, "name", L.cfg->model.name);
                mgc_json_int(&j, "padded_vocab_size", L.cfg->derived.padded_vocab_size);
                mgc_json_int(&j, "world_size", L.cfg->parallel.world_size);
                mgc_json_obj_begin(&j, "params");
                mgc_json_u64(&j, "total", L.facts.params.total);
                mgc_json_u64(&j, "active", L.facts.params.active);
                mgc_json_obj_end(&j);
            }
            if (have_pred) {
                mgc_json_obj_begin(&j, "target");
                mgc_json_str(&j, "hardware", hw.name);
                mgc_json_int(&j, "gpus", L.cfg->parallel.world_size);
                mgc_json_bool(&j, "fits", fits);
                mgc_json_u64(&j, "max_arena_bytes", cr.max_arena_bytes);
                mgc_json_num(&j, "usable_bytes", usable);
                mgc_json_num(&j, "memory_bytes", hw.memory_bytes);
                mgc_json_num(&j, "headroom", o.headroom);
                mgc_json_obj_end(&j);
                mgc_cost_print_json(&cr, &hw, &j, "predicted");
            }
            diags_json(&j, &L.diags);
            mgc_json_obj_end(&j);
        } else if (L.ok && !o.quiet && !o.github) {
            printf("%s: ok: %s%s%llu parameters, padded vocab %lld, world size %lld%s\n", o.files[i],
                   L.cfg->model.name[0] ? L.cfg->model.name : "", L.cfg->model.name[0] ? ", " : "",
                   (unsigned long long)L.facts.params.total, (long long)L.cfg->derived.padded_vocab_size,
                   (long long)L.cfg->parallel.world_size, L.diags.warnings ? " (with warnings)" : "");
            if (have_pred)
                printf("%s: fits on %s: %.2f GiB of %.2f GiB usable (%.0f%% headroom); predicted %.4g tokens/s, "
                       "MFU %.1f%%\n",
                       o.files[i], hw.name, (double)cr.max_arena_bytes / 1073741824.0, usable / 1073741824.0,
                       100 * o.headroom, cr.tokens_per_s, 100 * cr.mfu);
        }
        unload(&L);
    }
    if (o.json) {
        mgc_json_arr_end(&j);
        mgc_json_int(&j, "checked", o.nfiles);
        mgc_json_int(&j, "failed", failed);
        mgc_json_obj_end(&j);
        mgc_json_finish(&j);
    } else if (o.nfiles > 1 && !o.github) {
        fprintf(failed ? stderr : stdout, "mgc check: %d file%s, %d with errors\n", o.nfiles, o.nfiles == 1 ? "" : "s",
                failed);
    }
    free_opts(&o);
    return failed ? 1 : 0;
}

static int cmd_info(int argc, char **argv) {
    opts o;
    if (!parse_opts(argc, argv, &o, "info")) return free_opts(&o), 2;
    if (o.nfiles != 1) {
        fputs("mgc info: give exactly one config (usage: mgc info [--json] [--ir] [--config] FILE)\n", stderr);
        free_opts(&o);
        return 2;
    }
    loaded L;
    load(o.files[0], &o, &L);
    mgc_diags_print(&L.diags, stderr);
    int rc = L.ok ? 0 : 1;
    if (L.ok) {
        if (o.json) {
            mgc_json j;
            mgc_json_init(&j, stdout, 2);
            mgc_json_obj_begin(&j, NULL);
            mgc_json_str(&j, "file", o.files[0]);
            mgc_json_str(&j, "name", L.cfg->model.name);
            mgc_facts_print_json(L.cfg, &L.facts, &j);
            if (o.config) mgc_config_print_json(L.cfg, &j, "config");
            if (o.ir) mgc_ir_print_json(L.graph, &j);
            mgc_json_obj_end(&j);
            mgc_json_finish(&j);
        } else if (o.config) {
            mgc_config_print_yaml(L.cfg, stdout);
        } else if (o.ir) {
            mgc_ir_print(L.graph, stdout);
        } else {
            mgc_facts_print_text(L.cfg, &L.facts, stdout);
        }
    }
    unload(&L);
    free_opts(&o);
    return rc;
}

/* Draw the plan's schedule: the streams are simulated again with uniform
 * costs, so the chart shows the schedule's shape independent of a cost model. */
static int write_timeline(const mgc_plan *p, const char *path) {
    mgc_schedule s;
    memset(&s, 0, sizeof s);
    int64_t g = 0, tied = 0;
    s.schedule = p->schedule;
    s.pp = p->grid.pp;
    s.vp = p->grid.vp;
    s.m = p->num_microbatches;
    s.group = mgc_plan_config_int(p, "parallel.microbatch_group_size", &g) ? g : p->grid.pp;
    s.n_stages = s.pp * s.vp;
    s.distributed_optimizer = p->distributed_optimizer;
    s.tied_embeddings = mgc_plan_config_int(p, "model.tie_embeddings", &tied) ? (int)tied : 0;
    s.load_every = mgc_schedule_plan_load_every(p);
    s.loc = (mgc_loc){path, 0, 0};
    s.ranks = calloc((size_t)s.pp, sizeof *s.ranks);
    if (!s.ranks) return fprintf(stderr, "mgc: out of memory\n"), 1;
    for (int64_t r = 0; r < s.pp; r++) {
        s.ranks[r].n = p->stages[r].n_instrs;
        s.ranks[r].instrs = p->stages[r].instrs;
        for (int64_t i = 0; i < s.ranks[r].n; i++) s.ranks[r].n_buckets += s.ranks[r].instrs[i].op == MGC_I_REDUCE_GRADS;
    }
    mgc_diags d;
    mgc_diags_init(&d);
    mgc_sim_result res;
    memset(&res, 0, sizeof res);
    int rc = 1;
    if (mgc_schedule_simulate(&s, NULL, &res, &d) == 0) {
        char tmp[4096];
        int direct = mgc_path_is_special(path); /* /dev/null: in place, never renamed over */
        snprintf(tmp, sizeof tmp, "%s%s", path, direct ? "" : ".tmp");
        FILE *f = fopen(tmp, "w");
        if (!f) {
            fprintf(stderr, "mgc: cannot write %s: %s\n", tmp, strerror(errno));
        } else {
            int bad = mgc_schedule_svg(&s, &res, NULL, f) != 0;
            bad |= fclose(f) != 0;
            if (bad || (!direct && rename(tmp, path) != 0)) {
                fprintf(stderr, "mgc: cannot write %s\n", path);
                if (!direct) remove(tmp);
            } else {
                rc = 0;
            }
        }
    }
    mgc_diags_print(&d, stderr);
    mgc_diags_free(&d);
    mgc_sim_result_free(&res);
    free(s.ranks);
    return rc;
}

static void plan_report(const mgc_plan *p, const opts *o, const char *file, const mgc_hw *hw,
                        const mgc_cost_report *r) {
    if (o->json) {
        mgc_json j;
        mgc_json_init(&j, stdout, 2);
        mgc_json_obj_begin(&j, NULL);
        mgc_json_str(&j, "file", file);
        mgc_plan_print_json(p, &j, o->memory);
        if (hw && r) mgc_cost_print_json(r, hw, &j, "predicted");
        mgc_json_obj_end(&j);
        mgc_json_finish(&j);
        return;
    }
    mgc_plan_print_summary(p, stdout);
    if (o->memory) mgc_plan_print_memory(p, stdout);
    if (hw && r) mgc_cost_print_text(r, hw, stdout);
}

/* The plan's CUDA kernels, compiled with NVRTC (when it is installed) for the
 * architectures of --arch or hardware.cuda_archs; a one-line report in line. */
static int add_kernels(mgc_plan *p, const opts *o, char *line, size_t n) {
    int archs[16], na = 0;
    if (o->archs) {
        const char *s = o->archs;
        while (*s && na < 16) {
            char *end = NULL;
            long v = strtol(s, &end, 10);
            if (end == s || v < 50 || v > 1000) {
                fprintf(stderr, "mgc compile: --arch %s: expected numbers like 80,90 (sm_80, sm_90)\n",
                        o->archs);
                return 2;
            }
            archs[na++] = (int)v;
            s = *end == ',' ? end + 1 : end;
            if (*end && *end != ',') {
                fprintf(stderr, "mgc compile: --arch %s: expected numbers like 80,90\n", o->archs);
                return 2;
            }
        }
    } else {
        na = mgc_plan_cuda_archs(p, archs, 16);
    }
    if (na == 0) return 0;
    if (!mgc_nvrtc_available()) {
        snprintf(line, n, "kernels: none (NVRTC not found: install the CUDA toolkit, or let mgc-run "
                          "JIT-compile them on the GPU machine)");
        return 0;
    }
    mgc_kernel_stats st;
    char err[4096];
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    if (mgc_compile_kernels(p, archs, na, cpus > 0 ? (int)cpus : 1, &st, err, sizeof err)) {
        fprintf(stderr, "mgc compile: CUDA kernels: %s\n  hint: `mgc check` names the setting mgc's "
                        "kernels do not serve; --no-kernels writes the plan for the CPU backend\n",
                err);
        return 1;
    }
    int k = snprintf(line, n, "kernels: %d specs x %d archs (", st.specs, st.archs);
    for (int i = 0; i < na && k > 0 && (size_t)k < n; i++)
        k += snprintf(line + k, n - (size_t)k, "%ssm_%d", i ? ", " : "", archs[i]);
    if (k > 0 && (size_t)k < n)
        snprintf(line + k, n - (size_t)k,
                 "), %d compiled + %d cached in %.1f s, %.2f MiB of cubins, max %ld registers, %ld "
                 "spill bytes",
                 st.compiled, st.cached, st.seconds, (double)st.cubin_bytes / 1048576.0,
                 st.max_registers, st.max_spill_bytes);
    if (st.max_spill_bytes > 0)
        fprintf(stderr,
                "mgc compile: warning: %d cubin%s spill to local memory, the most %s: %ld bytes (a "
                "slower kernel, not a wrong one)\n",
                st.spilling, st.spilling == 1 ? "" : "s", st.worst_spill, st.max_spill_bytes);
    return 0;
}

static int cmd_compile(int argc, char **argv) {
    opts o;
    if (!parse_opts(argc, argv, &o, "compile")) return free_opts(&o), 2;
    if (o.nfiles != 1) {
        fputs("mgc compile: give exactly one config (usage: mgc compile FILE [-o PLAN] [--json] [--memory] "
              "[--timeline SVG] [--arch 80,90] [--no-kernels] [--set K=V]...)\n",
              stderr);
        free_opts(&o);
        return 2;
    }
    loaded L;
    load(o.files[0], &o, &L);
    mgc_plan *p = NULL;
    if (L.ok) {
        p = mgc_compile(L.cfg, L.graph, &L.diags);
        if (p) p->model_flops_per_iter = L.facts.flops.model_per_iteration;
        mgc_diags_sort(&L.diags);
    }
    mgc_hw hw;
    mgc_cost_report cr;
    int have_pred = 0;
    if (p && !o.no_predict) {
        mgc_loc at = o.hardware ? (mgc_loc){"--hardware", 0, 0} : mgc_config_loc(L.cfg, MGC_KEY_HW_GPU);
        if (predict(p, o.hardware ? o.hardware : L.cfg->hardware.gpu, at, o.no_grad_overlap, &hw, &cr, &L.diags) == 0) have_pred = 1;
        else mgc_plan_free(p), p = NULL;
    }
    mgc_diags_print(&L.diags, stderr);
    int rc = p ? 0 : 1;
    char kline[512] = "";
    if (p && o.output && !o.no_kernels) rc = add_kernels(p, &o, kline, sizeof kline);
    if (p && o.output && rc == 0) {
        char err[1024];
        if (mgc_plan_write(p, o.output, err, sizeof err) != MGC_PLAN_OK) {
            fprintf(stderr, "mgc compile: %s\n", err);
            rc = 1;
        }
    }
    if (p && rc == 0) {
        plan_report(p, &o, o.files[0], have_pred ? &hw : NULL, have_pred ? &cr : NULL);
        if (kline[0] && !o.json) printf("%s\n", kline);
        if (o.output && !o.json) printf("wrote %s\n", o.output);
        if (o.timeline) rc = write_timeline(p, o.timeline);
    }
    mgc_plan_free(p);
    unload(&L);
    free_opts(&o);
    return rc;
}

static int cmd_inspect(int argc, char **argv) {
    opts o;
    if (!parse_opts(argc, argv, &o, "inspect")) return free_opts(&o), 2;
    if (o.nfiles != 1 || o.nsets) {
        fputs("mgc inspect: give exactly one plan (usage: mgc inspect PLAN [--json] [--memory] [--ops] [--timeline SVG])\n",
              stderr);
        free_opts(&o);
        return 2;
    }
    mgc_plan *p = NULL;
    char err[1024];
    int rc = 0;
    if (mgc_plan_read(o.files[0], &p, err, sizeof err) != MGC_PLAN_OK) {
        fprintf(stderr, "mgc inspect: %s\n", err);
        rc = 1;
    } else {
        mgc_hw hw;
        mgc_cost_report cr;
        int have_pred = 0;
        if (!o.no_predict) {
            mgc_diags d;
            mgc_diags_init(&d);
            const char *name = o.hardware ? o.hardware : mgc_plan_config_str(p, "hardware.gpu");
            if (name && name[0]) {
                mgc_loc at = {o.hardware ? "--hardware" : o.files[0], 0, 0};
                if (predict(p, name, at, o.no_grad_overlap, &hw, &cr, &d) == 0) have_pred = 1;
                else rc = 1;
            }
            mgc_diags_print(&d, stderr);
            mgc_diags_free(&d);
        }
        if (rc == 0) plan_report(p, &o, o.files[0], have_pred ? &hw : NULL, have_pred ? &cr : NULL);
        if (o.ops && rc == 0)
            for (int64_t s = 0; s < p->n_stages; s++)
                for (int64_t c = 0; c < p->stages[s].n_chunks; c++) {
                    printf("# stage %" PRId64 " chunk %" PRId64 "\n", s, c);
                    mgc_partition_print(p, &p->stages[s].chunks[c], stdout);
                }
        if (o.timeline && rc == 0) rc = write_timeline(p, o.timeline);
    }
    mgc_plan_free(p);
    free_opts(&o);
    return rc;
}

static int cmd_schema(int argc, char **argv) {
    if (argc == 1 && !strcmp(argv[0], "--json")) return mgc_schema_print_json(stdout), 0;
    if (argc == 1 && !strcmp(argv[0], "--markdown")) return mgc_schema_print_markdown(stdout), 0;
    fputs("usage: mgc schema --json | --markdown\n", stderr);
    return 2;
}

static int cmd_hardware(int argc, char **argv) {
    if (argc > 1) {
        fputs("usage: mgc hardware [NAME|FILE]\n", stderr);
        return 2;
    }
    if (argc == 0) {
        char names[64][64];
        int n = mgc_hw_builtin_names(names, 64);
        printf("built-in hardware profiles (mgc hardware NAME prints one):\n");
        for (int i = 0; i < n && i < 64; i++) {
            mgc_hw hw;
            mgc_diags d;
            mgc_diags_init(&d);
            if (mgc_hw_load(names[i], &hw, &d) == 0)
                printf("  %-16s %s\n", hw.name, hw.description);
            mgc_diags_free(&d);
        }
        const char *path = getenv("MGC_HARDWARE_PATH");
        printf("user profiles: NAME.yaml in the directories of MGC_HARDWARE_PATH (%s), or a file path\n",
               path && path[0] ? path : "not set");
        return 0;
    }
    mgc_hw hw;
    mgc_diags d;
    mgc_diags_init(&d);
    int rc = mgc_hw_load(argv[0], &hw, &d);
    mgc_diags_print(&d, stderr);
    mgc_diags_free(&d);
    if (rc) return 1;
    char comment[700];
    snprintf(comment, sizeof comment, "%s (from %s)", hw.name, hw.source);
    return mgc_hw_write_yaml(&hw, comment, stdout) ? 1 : 0;
}

static int cmd_version(void) {
    printf("mgc %s\n", MGC_VERSION);
    int maj, min;
    if (mgc_codegen_nvrtc_version(&maj, &min)) {
        int archs[64];
        int n = mgc_codegen_nvrtc_archs(archs, 64);
        printf("NVRTC %d.%d (targets:", maj, min);
        for (int i = 0; i < n; i++) printf(" sm_%d", archs[i]);
        printf(")\n");
    } else {
        printf("NVRTC: not built (CUDA toolkit not found at configure time)\n");
    }
    return 0;
}

int main(int argc, char **argv) {
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    const char *cmd = argv[1];
    if (!strcmp(cmd, "check")) return cmd_check(argc - 2, argv + 2);
    if (!strcmp(cmd, "info")) return cmd_info(argc - 2, argv + 2);
    if (!strcmp(cmd, "compile")) return cmd_compile(argc - 2, argv + 2);
    if (!strcmp(cmd, "inspect")) return cmd_inspect(argc - 2, argv + 2);
    if (!strcmp(cmd, "schema")) return cmd_schema(argc - 2, argv + 2);
    if (!strcmp(cmd, "data")) return mgc_cmd_data(argc - 2, argv + 2);
    if (!strcmp(cmd, "calibrate")) return mgc_cmd_calibrate(argc - 2, argv + 2);
    if (!strcmp(cmd, "profile")) return mgc_cmd_profile(argc - 2, argv + 2);
    if (!strcmp(cmd, "hardware")) return cmd_hardware(argc - 2, argv + 2);
    if (!strcmp(cmd, "sweep")) return mgc_cmd_sweep(argc - 2, argv + 2);
    if (!strcmp(cmd, "version") || !strcmp(cmd, "--version")) return cmd_version();
    if (!strcmp(cmd, "help") || !strcmp(cmd, "--help") || !strcmp(cmd, "-h")) return usage(stdout), 0;
    fprintf(stderr, "mgc: unknown command '%s'\n", cmd);
    usage(stderr);
    return 2;
}
