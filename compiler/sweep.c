/* sweep.c - see sweep.h.  Sections: options, the variants (one worker per
 * thread, one result slot per variant), ranking, outputs (table, CSV, JSON,
 * SVG), the command. */
#define _GNU_SOURCE /* sched_getaffinity */
#include "sweep.h"

#include "check.h"

#include <errno.h>
#include <inttypes.h>
#ifdef __GLIBC__
#include <malloc.h> /* mallopt */
#endif
#include <math.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "compile.h"
#include "config.h"
#include "cost.h"
#include "diag.h"
#include "facts.h"
#include "hwprofile.h"
#include "ir.h"
#include "json.h"
#include "plan.h"
#include "readfile.h"
#include "schedule.h"

#define GIB          1073741824.0
#define MAX_VARIANTS 10000000 /* 10^7 (about 1 GiB of results): a typo cannot ask for 10^20 */
#define MAX_THREADS  256
#define MAX_HW       16 /* distinct hardware profiles in one sweep */

/* ---- options ------------------------------------------------------------------------ */

/* One --vary: a key and its values, each pre-formatted as the assignment
 * "key=value" that mgc_config_set takes. */
typedef struct axis {
    char *key;         /* "parallel.tensor" (owned) */
    const char *label; /* column name in the table: the key's last part, or the key */
    char **values;     /* (n) as written, trimmed (owned) */
    char **assign;     /* (n) "key=value" (owned) */
    char origin[24];   /* "--vary #1" */
    int n;
} axis;

/* Why a variant was dropped; the order is the summary's. */
typedef enum category {
    CAT_FEASIBLE = 0,
    CAT_MEMORY,  /* its largest arena does not fit */
    CAT_CONFIG,  /* a consistency rule of the config fails (divisibility, ...) */
    CAT_WORLD,   /* the degrees do not fit the world size */
    CAT_KERNELS, /* valid, but mgc's CUDA kernels do not serve it (mgc_check_kernels_gap) */
    CAT_COMPILE, /* the compiler or the cost model rejected it */
    CAT__COUNT
} category;

static const char *const cat_names[CAT__COUNT] = {"feasible", "memory", "invalid config",
                                                  "world size", "no GPU kernels", "compile error"};
static const char *const cat_ids[CAT__COUNT] = {"feasible", "memory", "invalid_config",
                                                "world_size", "no_gpu_kernels", "compile_error"};

typedef struct hw_entry {
    char *name; /* as the config or --hardware gave it (owned) */
    mgc_hw hw;
    double usable_bytes; /* (1 - headroom) * memory_bytes */
} hw_entry;

/* One variant's outcome, written by exactly one worker. */
typedef struct result {
    category cat;
    char *reason;             /* NULL when feasible (owned) */
    int hw;                   /* index into sweep.hws; -1 when unknown */
    int64_t world_size;       /* 0 when the config did not check */
    int64_t data;             /* derived data-parallel degree */
    int64_t microbatches;     /* per step per data-parallel rank */
    uint64_t max_arena_bytes; /* the largest arena (0 when not compiled) */
    int64_t arena_rank;       /* the pipeline rank that has it */
    double tokens_per_s, step_s, mfu, bubble_fraction, exposed_comm_fraction;
    int64_t rank; /* 1-based position in the ranking; 0 when infeasible */
} result;

typedef struct sweep {
    /* inputs (read-only while the workers run) */
    const char *base; /* the base file name */
    char *text;       /* its contents, read once */
    size_t len;
    const char **sets; /* --set assignments */
    int nsets;
    char origins_set[64][24]; /* "--set #N" */
    char world_assign[64];    /* "parallel.world_size=N", or "" */
    int64_t world_size;       /* --world-size, 0 when not given */
    axis *axes;
    int naxes;
    const char *hw_override; /* --hardware */
    hw_entry hws[MAX_HW];
    int nhw;
    double headroom; /* fraction, 0.10 */
    int64_t n;       /* variants */
    int threads;
    /* outputs */
    result *res;          /* (n) */
    _Atomic int64_t next; /* the next variant index to take */
    int64_t *order;       /* (n_feasible) variant indices, best first */
    int64_t n_feasible;
    int64_t by_cat[CAT__COUNT];
    double seconds;
} sweep;

static void usage_sweep(FILE *out) {
    fputs("usage: mgc sweep BASE.yaml --vary KEY=V1,V2,... [--vary ...] [options]\n"
          "  --vary KEY=V1,V2,...  values of one config key (repeatable; the variants are the\n"
          "                        cartesian product); YAML scalars, or lists written whole:\n"
          "                        'training.recompute_modules=[],[norm, activation]'\n"
          "  --set KEY=VALUE       fixed override of every variant (repeatable)\n"
          "  --world-size N        every variant's parallel.world_size (data parallel is derived)\n"
          "  --hardware NAME       hardware profile (default: the config's hardware.gpu)\n"
          "  --headroom PCT        memory kept free: a variant fits when its largest arena is at\n"
          "                        most (100 - PCT)% of the device memory (default 10)\n"
          "  --top K               rows of the ranking printed (default 20; 0: all)\n"
          "  -j N                  worker threads (default: the CPUs this process may use)\n"
          "  -q, --quiet           print only the summary\n"
          "  --csv FILE            every variant, feasible or not, as CSV (written atomically)\n"
          "  --json FILE           the same as JSON\n"
          "  --plot FILE.svg       predicted tokens/s against memory of the feasible variants\n"
          "exit status: 0 some variant is feasible, 1 none is, 2 usage error (docs/sweep.md)\n",
          out);
}

static char *xstrdup(const char *s) {
    size_t n = strlen(s) + 1;
    char *d = malloc(n);
    if (d) memcpy(d, s, n);
    return d;
}

static void axis_free(axis *a) {
    for (int i = 0; i < a->n; i++) {
        free(a->values[i]);
        free(a->assign[i]);
    }
    free(a->values);
    free(a->assign);
    free(a->key);
}

/* The next comma of s outside brackets (a list value "[norm, activation]" is one value), or
 * NULL; *bad = 1 when a bracket is left open or closed twice. */
static const char *next_comma(const char *s, int *bad) {
    int depth = 0;
    for (; *s; s++) {
        if (*s == '[') depth++;
        else if (*s == ']' && --depth < 0) {
            *bad = 1;
            return NULL;
        }
        else if (*s == ',' && depth == 0) return s;
    }
    *bad |= depth != 0;
    return NULL;
}

/* Parse "KEY=V1,V2,..." into *a.  0 ok; -1 with a message printed. */
static int parse_vary(const char *arg, axis *a, int index) {
    memset(a, 0, sizeof *a);
    snprintf(a->origin, sizeof a->origin, "--vary #%d", index + 1);
    const char *eq = strchr(arg, '=');
    if (!eq || eq == arg || !eq[1]) {
        fprintf(
            stderr,
            "mgc sweep: --vary %s: expected KEY=V1,V2,..., e.g. --vary parallel.tensor=1,2,4,8\n",
            arg);
        return -1;
    }
    size_t klen = (size_t)(eq - arg);
    a->key = malloc(klen + 1);
    int commas = 0;
    for (const char *s = eq + 1; *s; s++)
        commas += *s == ',';
    a->values = calloc((size_t)commas + 1, sizeof *a->values);
    a->assign = calloc((size_t)commas + 1, sizeof *a->assign);
    if (!a->key || !a->values || !a->assign)
        return fprintf(stderr, "mgc sweep: out of memory\n"), -1;
    memcpy(a->key, arg, klen);
    a->key[klen] = 0;
    const char *dot = strrchr(a->key, '.');
    a->label = dot ? dot + 1 : a->key;
    const char *s = eq + 1;
    int bad = 0;
    for (const char *t = s; t && !bad;) {
        t = next_comma(t, &bad);
        if (t) t++;
    }
    if (bad) {
        fprintf(stderr,
                "mgc sweep: --vary %s: brackets do not pair up (a list value is written [a, b])\n",
                arg);
        return -1;
    }
    for (;;) {
        const char *e = next_comma(s, &bad);
        size_t n = e ? (size_t)(e - s) : strlen(s);
        while (n && (*s == ' ' || *s == '\t'))
            s++, n--;
        while (n && (s[n - 1] == ' ' || s[n - 1] == '\t'))
            n--;
        if (n == 0) {
            fprintf(stderr,
                    "mgc sweep: --vary %s: empty value (item %d); values are separated by commas\n",
                    arg, a->n + 1);
            return -1;
        }
        char *v = malloc(n + 1), *as = malloc(klen + n + 2);
        if (!v || !as) {
            free(v), free(as);
            return fprintf(stderr, "mgc sweep: out of memory\n"), -1;
        }
        memcpy(v, s, n);
        v[n] = 0;
        snprintf(as, klen + n + 2, "%s=%s", a->key, v);
        for (int i = 0; i < a->n; i++)
            if (!strcmp(a->values[i], v)) {
                fprintf(stderr, "mgc sweep: --vary %s: value '%s' is listed twice\n", arg, v);
                free(v), free(as);
                return -1;
            }
        a->values[a->n] = v;
        a->assign[a->n] = as;
        a->n++;
        if (!e) break;
        s = e + 1;
    }
    return 0;
}

/* The CPUs this process may run on (taskset/cgroup affinity), at least 1. */
static int default_threads(void) {
#ifdef CPU_COUNT
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) == 0 && CPU_COUNT(&set) > 0) return CPU_COUNT(&set);
#endif
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (int)n : 1;
}

/* ---- the variants ------------------------------------------------------------------ */

/* Index of a loaded profile by name, or -1. */
static int find_hw(const sweep *S, const char *name) {
    for (int i = 0; i < S->nhw; i++)
        if (!strcmp(S->hws[i].name, name)) return i;
    return -1;
}

/* The base text with the fixed overrides, --world-size and (when v >= 0) the
 * variant's values applied; not finalized.  NULL on OOM. */
static mgc_config *variant_config(const sweep *S, int64_t v, mgc_diags *d) {
    mgc_config *c = mgc_config_new();
    if (!c) return NULL;
    mgc_config_load_text(c, S->base, S->text, S->len, d);
    for (int i = 0; i < S->nsets; i++)
        mgc_config_set(c, S->sets[i], S->origins_set[i], d);
    if (S->world_assign[0]) mgc_config_set(c, S->world_assign, "--world-size", d);
    if (v >= 0) {
        /* mixed radix, the first --vary slowest */
        int64_t rest = v;
        int idx[64];
        for (int a = S->naxes - 1; a >= 0; a--) {
            idx[a] = (int)(rest % S->axes[a].n);
            rest /= S->axes[a].n;
        }
        for (int a = 0; a < S->naxes; a++)
            mgc_config_set(c, S->axes[a].assign[idx[a]], S->axes[a].origin, d);
    }
    return c;
}

/* The value index of axis a in variant v. */
static int value_of(const sweep *S, int64_t v, int a) {
    for (int b = S->naxes - 1; b > a; b--)
        v /= S->axes[b].n;
    return (int)(v % S->axes[a].n);
}

static void set_reason(result *r, category cat, const char *msg) {
    r->cat = cat;
    free(r->reason);
    r->reason = xstrdup(msg ? msg : "unknown");
}

/* The first error (in position order) as the reason; category from its text. */
static void reason_from_diags(result *r, mgc_diags *d, category fallback) {
    mgc_diags_sort(d);
    for (int i = 0; i < d->n; i++)
        if (d->v[i].sev == MGC_SEV_ERROR) {
            const char *m = d->v[i].msg ? d->v[i].msg : "error";
            category cat = fallback;
            if (fallback == CAT_CONFIG && strstr(m, "world_size")) cat = CAT_WORLD;
            set_reason(r, cat, m);
            return;
        }
    set_reason(r, fallback, d->oom ? "out of memory" : "rejected without a message");
}

/* Compile and cost variant v into r.  Everything a worker touches is its own
 * (config, graph, plan, diagnostics) or read-only (sweep inputs, profiles). */
static void run_variant(const sweep *S, int64_t v, result *r, mgc_diags *d) {
    mgc_diags_clear(d);
    memset(r, 0, sizeof *r);
    r->hw = -1;
    mgc_graph *g = NULL;
    mgc_plan *p = NULL;
    mgc_config *c = variant_config(S, v, d);
    if (!c) {
        set_reason(r, CAT_COMPILE, "out of memory");
        return;
    }
    if (d->errors == 0) mgc_config_finalize(c, d);
    if (d->errors) {
        reason_from_diags(r, d, CAT_CONFIG);
        goto done;
    }
    r->world_size = c->parallel.world_size;
    r->data = c->parallel.data;
    r->microbatches = c->derived.num_microbatches;
    char why[256];
    /* every profile is a GPU */
    if (mgc_check_kernels_gap(c, why, sizeof why) != MGC_KERNELS_SERVED) {
        set_reason(r, CAT_KERNELS, why);
        goto done;
    }
    r->hw = find_hw(S, S->hw_override ? S->hw_override : c->hardware.gpu);
    mgc_facts facts;
    memset(&facts, 0, sizeof facts);
    g = mgc_ir_build(c, d);
    if (g && d->errors == 0) mgc_facts_compute(c, g, &facts, d);
    if (!g || d->errors) {
        reason_from_diags(r, d, CAT_CONFIG);
        goto done;
    }
    p = mgc_compile(c, g, d);
    if (!p) {
        reason_from_diags(r, d, CAT_COMPILE);
        goto done;
    }
    p->model_flops_per_iter = facts.flops.model_per_iteration;
    for (int64_t s = 0; s < p->n_stages; s++)
        if (p->stages[s].arena_bytes > r->max_arena_bytes || s == 0) {
            r->max_arena_bytes = p->stages[s].arena_bytes;
            r->arena_rank = s;
        }
    if (r->hw < 0) {
        /* only a profile that failed to load up front gets here */
        set_reason(r, CAT_CONFIG, "no hardware profile for this variant");
        goto done;
    }
    const hw_entry *h = &S->hws[r->hw];
    if ((double)r->max_arena_bytes > h->usable_bytes) {
        char msg[256];
        snprintf(msg, sizeof msg,
                 "does not fit: %.1f GiB arena on pipeline rank %" PRId64
                 " > %.1f GiB usable of %.1f GiB (%s, %g%% headroom)",
                 (double)r->max_arena_bytes / GIB, r->arena_rank, h->usable_bytes / GIB,
                 h->hw.memory_bytes / GIB, h->hw.name, S->headroom * 100);
        set_reason(r, CAT_MEMORY, msg);
        goto done;
    }
    mgc_cost_options o;
    memset(&o, 0, sizeof o);
    o.hw = &h->hw;
    mgc_cost_report rep;
    char err[512] = "";
    if (mgc_cost_plan(p, &o, &rep, err, sizeof err) != 0) {
        char msg[600];
        snprintf(msg, sizeof msg, "cost model: %s", err[0] ? err : "cannot cost this plan");
        set_reason(r, CAT_COMPILE, msg);
        goto done;
    }
    r->cat = CAT_FEASIBLE;
    r->tokens_per_s = rep.tokens_per_s;
    r->step_s = rep.step_s;
    r->mfu = rep.mfu;
    r->bubble_fraction = rep.bubble_fraction;
    r->exposed_comm_fraction = rep.step_s > 0 ? rep.exposed_comm_s / rep.step_s : 0;
done:
    mgc_plan_free(p);
    mgc_ir_free(g);
    mgc_config_free(c);
}

static void *worker(void *arg) {
    sweep *S = arg;
    mgc_diags d;
    mgc_diags_init(&d);
    for (;;) {
        int64_t v = atomic_fetch_add_explicit(&S->next, 1, memory_order_relaxed);
        if (v >= S->n) break;
        run_variant(S, v, &S->res[v], &d);
    }
    mgc_diags_free(&d);
    return NULL;
}

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* Run every variant on S->threads threads (the calling one included). */
static void run_all(sweep *S) {
    double t0 = now_s();
#ifdef __GLIBC__
    /* Every variant allocates and frees the same large arrays (instruction
     * streams, memory-plan indexes).  glibc would map and unmap each of them
     * and give freed heap back to the kernel, so that every variant pays its
     * page faults again; keep them in the heap instead (a process-wide
     * setting, harmless for the short-lived mgc process). */
    mallopt(M_MMAP_THRESHOLD, 256 << 20);
    mallopt(M_TRIM_THRESHOLD, 512 << 20);
#endif
    atomic_store(&S->next, 0);
    pthread_t th[MAX_THREADS];
    int started = 0;
    for (int t = 1; t < S->threads; t++)
        if (pthread_create(&th[started], NULL, worker, S) == 0) started++;
    S->threads = started + 1; /* what ran, should a thread fail to start */
    worker(S);
    for (int t = 0; t < started; t++)
        pthread_join(th[t], NULL);
    S->seconds = now_s() - t0;
}

/* ---- ranking ----------------------------------------------------------------------- */

typedef struct rank_key {
    double tps;
    uint64_t mem;
    int64_t v;
} rank_key;

/* Faster first; then less memory; then the lower variant index. */
static int cmp_rank(const void *pa, const void *pb) {
    const rank_key *a = pa, *b = pb;
    if (a->tps != b->tps) return a->tps > b->tps ? -1 : 1;
    if (a->mem != b->mem) return a->mem < b->mem ? -1 : 1;
    return a->v < b->v ? -1 : a->v > b->v;
}

static int rank_all(sweep *S) {
    memset(S->by_cat, 0, sizeof S->by_cat);
    for (int64_t v = 0; v < S->n; v++)
        S->by_cat[S->res[v].cat]++;
    S->n_feasible = S->by_cat[CAT_FEASIBLE];
    rank_key *k = malloc(((size_t)S->n_feasible + 1) * sizeof *k);
    S->order = malloc(((size_t)S->n_feasible + 1) * sizeof *S->order);
    if (!k || !S->order) return free(k), -1;
    int64_t n = 0;
    for (int64_t v = 0; v < S->n; v++)
        if (S->res[v].cat == CAT_FEASIBLE)
            k[n++] = (rank_key){S->res[v].tokens_per_s, S->res[v].max_arena_bytes, v};
    qsort(k, (size_t)n, sizeof *k, cmp_rank);
    for (int64_t i = 0; i < n; i++) {
        S->order[i] = k[i].v;
        S->res[k[i].v].rank = i + 1;
    }
    free(k);
    return 0;
}

/* ---- outputs ----------------------------------------------------------------------- */

/* "tensor=8 pipeline=4 ..." of variant v. */
static void describe(const sweep *S, int64_t v, char *buf, size_t n) {
    size_t k = 0;
    buf[0] = 0;
    for (int a = 0; a < S->naxes && k < n; a++) {
        int w = snprintf(buf + k, n - k, "%s%s=%s", a ? " " : "", S->axes[a].label,
                         S->axes[a].values[value_of(S, v, a)]);
        if (w < 0) break;
        k += (size_t)w;
    }
}

static void print_table(const sweep *S, int64_t top, FILE *out) {
    int64_t rows = top > 0 && top < S->n_feasible ? top : S->n_feasible;
    if (rows == 0) return;
    int w[64];
    fprintf(out, "%4s", "rank");
    for (int a = 0; a < S->naxes; a++) {
        w[a] = (int)strlen(S->axes[a].label);
        for (int i = 0; i < S->axes[a].n; i++)
            if ((int)strlen(S->axes[a].values[i]) > w[a]) w[a] = (int)strlen(S->axes[a].values[i]);
        fprintf(out, "  %*s", w[a], S->axes[a].label);
    }
    fprintf(out, "  %6s  %13s  %8s  %6s  %8s  %8s  %10s\n", "data", "tokens/s", "step s", "MFU %",
            "mem GiB", "bubble %", "exp comm %");
    for (int64_t i = 0; i < rows; i++) {
        int64_t v = S->order[i];
        const result *r = &S->res[v];
        fprintf(out, "%4" PRId64, i + 1);
        for (int a = 0; a < S->naxes; a++)
            fprintf(out, "  %*s", w[a], S->axes[a].values[value_of(S, v, a)]);
        fprintf(out, "  %6" PRId64 "  %13.0f  %8.3f  %6.1f  %8.2f  %8.1f  %10.1f\n", r->data,
                r->tokens_per_s, r->step_s, 100 * r->mfu, (double)r->max_arena_bytes / GIB,
                100 * r->bubble_fraction, 100 * r->exposed_comm_fraction);
    }
    if (rows < S->n_feasible)
        fprintf(out,
                "(the best %" PRId64 " of %" PRId64 " feasible variants; --top 0 prints all)\n",
                rows, S->n_feasible);
}

static void print_summary(const sweep *S, FILE *out) {
    int64_t infeasible = S->n - S->n_feasible;
    fprintf(out,
            "mgc sweep: %" PRId64 " variant%s of %s, %" PRId64 " feasible, %" PRId64 " infeasible",
            S->n, S->n == 1 ? "" : "s", S->base, S->n_feasible, infeasible);
    if (infeasible) {
        fputs(" (", out);
        int first = 1;
        for (int c = 1; c < CAT__COUNT; c++)
            if (S->by_cat[c]) {
                fprintf(out, "%s%s %" PRId64, first ? "" : ", ", cat_names[c], S->by_cat[c]);
                first = 0;
            }
        fputs(")", out);
    }
    fprintf(out, "; %.2f s on %d thread%s\n", S->seconds, S->threads, S->threads == 1 ? "" : "s");
    if (S->n_feasible) {
        char d[1024];
        int64_t v = S->order[0];
        describe(S, v, d, sizeof d);
        fprintf(out, "best: %s: %.0f tokens/s, %.1f%% MFU, %.2f GiB (%s)\n", d,
                S->res[v].tokens_per_s, 100 * S->res[v].mfu,
                (double)S->res[v].max_arena_bytes / GIB,
                S->res[v].hw >= 0 ? S->hws[S->res[v].hw].hw.name : "?");
    }
}

/* Why nothing is feasible: the most common category and its first reason. */
static void print_none(const sweep *S, FILE *out) {
    int best = 1;
    for (int c = 2; c < CAT__COUNT; c++)
        if (S->by_cat[c] > S->by_cat[best]) best = c;
    for (int64_t v = 0; v < S->n; v++)
        if (S->res[v].cat == (category)best) {
            char d[1024];
            describe(S, v, d, sizeof d);
            fprintf(out,
                    "mgc sweep: no variant is feasible; most are rejected for %s, e.g. %s: %s\n",
                    cat_names[best], d, S->res[v].reason ? S->res[v].reason : "?");
            return;
        }
}

/* A CSV field: quoted when it holds a comma, quote or line break. */
static void csv_field(FILE *f, const char *s) {
    if (!strpbrk(s, ",\"\r\n")) {
        fputs(s, f);
        return;
    }
    fputc('"', f);
    for (; *s; s++) {
        if (*s == '"') fputc('"', f);
        fputc(*s, f);
    }
    fputc('"', f);
}

static void csv_num(FILE *f, double x) {
    char b[40];
    mgc_json_fmt_double(b, sizeof b, x);
    fprintf(f, ",%s", b);
}

static int write_csv(FILE *f, const sweep *S) {
    fputs("variant", f);
    for (int a = 0; a < S->naxes; a++)
        fputc(',', f), csv_field(f, S->axes[a].key);
    fputs(",feasible,rank,tokens_per_s,step_s,mfu,memory_gib,max_arena_bytes,arena_rank,bubble_"
          "fraction,"
          "exposed_comm_fraction,world_size,data,microbatches,hardware,category,reason\n",
          f);
    for (int64_t v = 0; v < S->n; v++) {
        const result *r = &S->res[v];
        fprintf(f, "%" PRId64, v);
        for (int a = 0; a < S->naxes; a++)
            fputc(',', f), csv_field(f, S->axes[a].values[value_of(S, v, a)]);
        int ok = r->cat == CAT_FEASIBLE;
        fprintf(f, ",%s,", ok ? "true" : "false");
        if (ok) fprintf(f, "%" PRId64, r->rank);
        if (ok) {
            csv_num(f, r->tokens_per_s);
            csv_num(f, r->step_s);
            csv_num(f, r->mfu);
        } else {
            fputs(",,,", f);
        }
        if (r->max_arena_bytes) {
            csv_num(f, (double)r->max_arena_bytes / GIB);
            fprintf(f, ",%" PRIu64 ",%" PRId64, r->max_arena_bytes, r->arena_rank);
        } else {
            fputs(",,,", f);
        }
        if (ok) {
            csv_num(f, r->bubble_fraction);
            csv_num(f, r->exposed_comm_fraction);
        } else {
            fputs(",,", f);
        }
        if (r->world_size)
            fprintf(f, ",%" PRId64 ",%" PRId64 ",%" PRId64, r->world_size, r->data,
                    r->microbatches);
        else
            fputs(",,,", f);
        fputc(',', f);
        csv_field(f, r->hw >= 0 ? S->hws[r->hw].hw.name : "");
        fprintf(f, ",%s,", cat_ids[r->cat]);
        csv_field(f, r->reason ? r->reason : "");
        fputc('\n', f);
    }
    return 0;
}

static int write_json(FILE *f, const sweep *S) {
    mgc_json j;
    mgc_json_init(&j, f, 1);
    mgc_json_obj_begin(&j, NULL);
    mgc_json_str(&j, "base", S->base);
    if (S->world_size)
        mgc_json_int(&j, "world_size", S->world_size);
    else
        mgc_json_null(&j, "world_size");
    mgc_json_num(&j, "headroom", S->headroom);
    mgc_json_arr_begin(&j, "hardware");
    for (int i = 0; i < S->nhw; i++) {
        mgc_json_obj_begin(&j, NULL);
        mgc_json_str(&j, "name", S->hws[i].hw.name);
        mgc_json_num(&j, "memory_bytes", S->hws[i].hw.memory_bytes);
        mgc_json_num(&j, "usable_bytes", S->hws[i].usable_bytes);
        mgc_json_obj_end(&j);
    }
    mgc_json_arr_end(&j);
    mgc_json_arr_begin(&j, "set");
    for (int i = 0; i < S->nsets; i++)
        mgc_json_str(&j, NULL, S->sets[i]);
    mgc_json_arr_end(&j);
    mgc_json_arr_begin(&j, "vary");
    for (int a = 0; a < S->naxes; a++) {
        mgc_json_obj_begin(&j, NULL);
        mgc_json_str(&j, "key", S->axes[a].key);
        mgc_json_arr_begin(&j, "values");
        for (int i = 0; i < S->axes[a].n; i++)
            mgc_json_str(&j, NULL, S->axes[a].values[i]);
        mgc_json_arr_end(&j);
        mgc_json_obj_end(&j);
    }
    mgc_json_arr_end(&j);
    mgc_json_int(&j, "variants", S->n);
    mgc_json_int(&j, "feasible", S->n_feasible);
    mgc_json_obj_begin(&j, "infeasible");
    for (int c = 1; c < CAT__COUNT; c++)
        mgc_json_int(&j, cat_ids[c], S->by_cat[c]);
    mgc_json_obj_end(&j);
    mgc_json_arr_begin(&j, "results");
    for (int64_t v = 0; v < S->n; v++) {
        const result *r = &S->res[v];
        int ok = r->cat == CAT_FEASIBLE;
        mgc_json_obj_begin(&j, NULL);
        mgc_json_int(&j, "variant", v);
        mgc_json_obj_begin(&j, "values");
        for (int a = 0; a < S->naxes; a++)
            mgc_json_str(&j, S->axes[a].key, S->axes[a].values[value_of(S, v, a)]);
        mgc_json_obj_end(&j);
        mgc_json_bool(&j, "feasible", ok);
        if (ok) {
            mgc_json_int(&j, "rank", r->rank);
            mgc_json_num(&j, "tokens_per_s", r->tokens_per_s);
            mgc_json_num(&j, "step_s", r->step_s);
            mgc_json_num(&j, "mfu", r->mfu);
        }
        if (r->max_arena_bytes) {
            mgc_json_num(&j, "memory_gib", (double)r->max_arena_bytes / GIB);
            mgc_json_u64(&j, "max_arena_bytes", r->max_arena_bytes);
            mgc_json_int(&j, "arena_rank", r->arena_rank);
        }
        if (ok) {
            mgc_json_num(&j, "bubble_fraction", r->bubble_fraction);
            mgc_json_num(&j, "exposed_comm_fraction", r->exposed_comm_fraction);
        }
        if (r->world_size) {
            mgc_json_int(&j, "world_size", r->world_size);
            mgc_json_int(&j, "data", r->data);
            mgc_json_int(&j, "microbatches", r->microbatches);
        }
        if (r->hw >= 0) mgc_json_str(&j, "hardware", S->hws[r->hw].hw.name);
        if (!ok) {
            mgc_json_str(&j, "category", cat_ids[r->cat]);
            mgc_json_str(&j, "reason", r->reason);
        }
        mgc_json_obj_end(&j);
    }
    mgc_json_arr_end(&j);
    mgc_json_obj_end(&j);
    mgc_json_finish(&j);
    return 0;
}

/* A "nice" tick step (1, 2 or 5 x 10^k) for about `ticks` ticks over [0, hi]. */
static double nice_step(double hi, int ticks) {
    double raw = hi / ticks, p = pow(10, floor(log10(raw))), m = raw / p;
    return (m <= 1 ? 1 : m <= 2 ? 2 : m <= 5 ? 5 : 10) * p;
}

/* 1.5M, 250k, 900 */
static void fmt_si(char *b, size_t n, double x) {
    if (x >= 1e6)
        snprintf(b, n, "%gM", x / 1e6);
    else if (x >= 1e3)
        snprintf(b, n, "%gk", x / 1e3);
    else
        snprintf(b, n, "%g", x);
}

static int write_svg(FILE *f, const sweep *S) {
    const double W = 900, H = 580, L = 90, R = 30, T = 60, B = 90; /* canvas and margins, px */
    const double pw = W - L - R, ph = H - T - B;
    double xmax = 0, ymax = 0, limit = 0;
    for (int64_t i = 0; i < S->n_feasible; i++) {
        const result *r = &S->res[S->order[i]];
        xmax = fmax(xmax, (double)r->max_arena_bytes / GIB);
        ymax = fmax(ymax, r->tokens_per_s);
    }
    int one_hw = S->nhw == 1;
    if (one_hw) limit = S->hws[0].usable_bytes / GIB, xmax = fmax(xmax, limit);
    if (xmax <= 0) xmax = 1;
    if (ymax <= 0) ymax = 1;
    double xs = nice_step(xmax * 1.05, 8), ys = nice_step(ymax * 1.08, 6);
    double xhi = ceil(xmax * 1.05 / xs) * xs, yhi = ceil(ymax * 1.08 / ys) * ys;
#define PX(x) (L + (x) / xhi * pw)
#define PY(y) (T + ph - (y) / yhi * ph)
    fprintf(f,
            "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" height=\"%.0f\" viewBox=\"0 "
            "0 %.0f %.0f\" "
            "font-family=\"sans-serif\" font-size=\"12\">\n"
            "<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n",
            W, H, W, H);
    fputs("<text x=\"450\" y=\"24\" text-anchor=\"middle\" font-size=\"16\" "
          "font-weight=\"bold\">mgc sweep: ",
          f);
    mgc_svg_text(f, S->base);
    fprintf(f, " &#8212; predicted throughput vs memory</text>\n");
    fprintf(f,
            "<text x=\"450\" y=\"44\" text-anchor=\"middle\" fill=\"#555\">%" PRId64
            " feasible of %" PRId64 " variants",
            S->n_feasible, S->n);
    if (one_hw) {
        fputs(" on ", f);
        mgc_svg_text(f, S->hws[0].hw.name);
    }
    fputs("</text>\n", f);
    /* grid, ticks and tick labels */
    for (double x = 0; x <= xhi + xs / 2; x += xs) {
        fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#eee\"/>\n",
                PX(x), T, PX(x), T + ph);
        fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"black\"/>\n",
                PX(x), T + ph, PX(x), T + ph + 5);
        fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">%g</text>\n", PX(x),
                T + ph + 19, x);
    }
    for (double y = 0; y <= yhi + ys / 2; y += ys) {
        char b[32];
        fmt_si(b, sizeof b, y);
        fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#eee\"/>\n", L,
                PY(y), L + pw, PY(y));
        fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"black\"/>\n",
                L - 5, PY(y), L, PY(y));
        fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"end\">%s</text>\n", L - 8, PY(y) + 4,
                b);
    }
    fprintf(f,
            "<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" fill=\"none\" "
            "stroke=\"black\"/>\n",
            L, T, pw, ph);
    fprintf(f,
            "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">memory per GPU: largest arena "
            "(GiB)</text>\n",
            L + pw / 2, T + ph + 40);
    fprintf(f,
            "<text x=\"22\" y=\"%.1f\" text-anchor=\"middle\" transform=\"rotate(-90 22 "
            "%.1f)\">predicted tokens/s "
            "(whole job)</text>\n",
            T + ph / 2, T + ph / 2);
    if (one_hw) {
        fprintf(f,
                "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#c00\" "
                "stroke-dasharray=\"6,4\"/>\n",
                PX(limit), T, PX(limit), T + ph);
        fprintf(f,
                "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"end\" fill=\"#c00\">usable %.1f GiB "
                "(%g%% headroom)</text>\n",
                PX(limit) - 4, T + 14, limit, S->headroom * 100);
    }
    /* the points, worst first so the best are drawn on top */
    for (int64_t i = S->n_feasible - 1; i >= 1; i--) {
        const result *r = &S->res[S->order[i]];
        fprintf(f,
                "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"3\" fill=\"#1f77b4\" fill-opacity=\"0.5\"/>\n",
                PX((double)r->max_arena_bytes / GIB), PY(r->tokens_per_s));
    }
    if (S->n_feasible) {
        const result *r = &S->res[S->order[0]];
        double cx = PX((double)r->max_arena_bytes / GIB), cy = PY(r->tokens_per_s);
        char d[1024];
        describe(S, S->order[0], d, sizeof d);
        fprintf(f, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"6\" fill=\"#d62728\" stroke=\"black\"/>\n",
                cx, cy);
        int left = cx > L + pw / 2;
        fprintf(f,
                "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"%s\" font-weight=\"bold\">best</text>\n",
                cx + (left ? -10 : 10), cy + 4, left ? "end" : "start");
        /* the full description as a caption under the plot (it can be long) */
        fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" fill=\"#d62728\">best: ", L, H - 6);
        mgc_svg_text(f, d);
        fprintf(f, " (%.0f tokens/s, %.2f GiB)</text>\n", r->tokens_per_s,
                (double)r->max_arena_bytes / GIB);
    } else {
        fprintf(f,
                "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\" font-size=\"16\">no feasible "
                "variant</text>\n",
                L + pw / 2, T + ph / 2);
    }
#undef PX
#undef PY
    fputs("</svg>\n", f);
    return 0;
}

/* Write through a temporary file in the same directory and rename it into
 * place: a reader never sees half a file, a failure leaves none.  "-" is
 * stdout; an existing path that is not a regular file (/dev/null, a pipe) is
 * written in place, as every mgc output is: a rename would replace it.  0 ok. */
static int write_atomic(const char *path, int (*fn)(FILE *, const sweep *), const sweep *S) {
    if (!strcmp(path, "-") || mgc_path_is_special(path)) {
        FILE *f = strcmp(path, "-") ? fopen(path, "w") : stdout;
        if (!f) {
            fprintf(stderr, "mgc sweep: cannot write %s: %s\n", path, strerror(errno));
            return -1;
        }
        int bad = fn(f, S) != 0;
        bad |= f == stdout ? fflush(f) != 0 || ferror(f) : fclose(f) != 0;
        if (bad) fprintf(stderr, "mgc sweep: cannot write %s\n", path);
        return bad ? -1 : 0;
    }
    size_t n = strlen(path) + 32;
    char *tmp = malloc(n);
    if (!tmp) return fprintf(stderr, "mgc sweep: out of memory\n"), -1;
    snprintf(tmp, n, "%s.tmp%ld", path, (long)getpid());
    FILE *f = fopen(tmp, "w");
    if (!f) {
        fprintf(stderr, "mgc sweep: cannot write %s: %s\n", path, strerror(errno));
        free(tmp);
        return -1;
    }
    int bad = fn(f, S) != 0;
    bad |= ferror(f) != 0;
    int e = errno;
    bad |= fclose(f) != 0;
    if (bad || rename(tmp, path) != 0) {
        if (!bad) e = errno;
        fprintf(stderr, "mgc sweep: cannot write %s: %s\n", path, strerror(e ? e : EIO));
        remove(tmp);
        free(tmp);
        return -1;
    }
    free(tmp);
    return 0;
}

/* ---- the command ------------------------------------------------------------------- */

/* Load a hardware profile into the table (once per name).  0 ok. */
static int add_hw(sweep *S, const char *name, mgc_loc at, mgc_diags *d) {
    if (find_hw(S, name) >= 0) return 0;
    if (S->nhw == MAX_HW) {
        fprintf(stderr, "mgc sweep: more than %d hardware profiles in one sweep\n", MAX_HW);
        return -1;
    }
    hw_entry *h = &S->hws[S->nhw];
    if (mgc_hw_load_at(name, at, &h->hw, d) != 0) return -1;
    if (!(h->name = xstrdup(name))) return fprintf(stderr, "mgc sweep: out of memory\n"), -1;
    h->usable_bytes = (1 - S->headroom) * h->hw.memory_bytes;
    S->nhw++;
    return 0;
}

/* Check the base, the overrides and every --vary value once, before any
 * variant runs, and load the hardware profiles.  0 ok, else the exit status. */
static int prepare(sweep *S) {
    mgc_diags d;
    mgc_diags_init(&d);
    int rc = 0;
    /* the base alone: its own errors are the input's (exit 1) */
    mgc_config *c = mgc_config_new();
    if (!c) return fprintf(stderr, "mgc sweep: out of memory\n"), 1;
    mgc_config_load_text(c, S->base, S->text, S->len, &d);
    if (d.errors) {
        rc = 1;
        goto out;
    }
    for (int i = 0; i < S->nsets; i++)
        mgc_config_set(c, S->sets[i], S->origins_set[i], &d);
    if (S->world_assign[0]) mgc_config_set(c, S->world_assign, "--world-size", &d);
    if (d.errors) {
        rc = 2;
        goto out;
    }
    if (S->hw_override) {
        if (add_hw(S, S->hw_override, (mgc_loc){"--hardware", 0, 0}, &d)) rc = 2;
    } else if (add_hw(S, c->hardware.gpu ? c->hardware.gpu : "", mgc_config_loc(c, MGC_KEY_HW_GPU),
                      &d)) {
        rc = 2;
    }
    if (rc) goto out;
    /* every value of every axis, each on a fresh copy of the base */
    for (int a = 0; a < S->naxes && !rc; a++) {
        for (int i = 0; i < S->axes[a].n; i++) {
            mgc_config *x = mgc_config_new();
            if (!x) {
                rc = 2;
                break;
            }
            mgc_config_load_text(x, S->base, S->text, S->len, &d);
            mgc_config_set(x, S->axes[a].assign[i], S->axes[a].origin, &d);
            if (d.errors) {
                mgc_config_free(x);
                rc = 2;
                break;
            }
            if (!S->hw_override && !strcmp(S->axes[a].key, "hardware.gpu") &&
                add_hw(S, x->hardware.gpu ? x->hardware.gpu : "", mgc_config_loc(x, MGC_KEY_HW_GPU),
                       &d))
                rc = 2;
            mgc_config_free(x);
            if (rc) break;
        }
    }
out:
    mgc_diags_sort(&d);
    mgc_diags_print(&d, stderr);
    mgc_diags_free(&d);
    mgc_config_free(c);
    return rc;
}

/* A whole number option value in [lo, hi]; -1 when malformed. */
static long long parse_count(const char *opt, const char *s, long long lo, long long hi) {
    char *end = NULL;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (end == s || *end || errno || v < lo || v > hi) {
        fprintf(stderr, "mgc sweep: %s %s: expected a whole number from %lld to %lld\n", opt, s, lo,
                hi);
        return -1;
    }
    return v;
}

int mgc_cmd_sweep(int argc, char **argv) {
    sweep S;
    memset(&S, 0, sizeof S);
    S.headroom = 0.10; /* the same default as mgc check --target */
    S.threads = default_threads();
    const char *csv = NULL, *json = NULL, *plot = NULL;
    int quiet = 0, rc = 2;
    long long top = 20;
    S.sets = calloc((size_t)argc + 1, sizeof *S.sets);
    S.axes = calloc((size_t)argc + 1, sizeof *S.axes);
    if (!S.sets || !S.axes) {
        fprintf(stderr, "mgc sweep: out of memory\n");
        goto done;
    }
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        /* options that take a value: "--opt VALUE" or "--opt=VALUE" */
        static const char *const valued[] = {
            "--vary", "--set", "--world-size", "--hardware", "--headroom", "--top",
            "-j",     "--csv", "--json",       "--plot",     NULL};
        const char *val = NULL;
        int which = -1;
        for (int k = 0; valued[k]; k++) {
            size_t n = strlen(valued[k]);
            if (!strncmp(a, valued[k], n) &&
                (a[n] == 0 || a[n] == '=' || (k == 6 && a[n] >= '0' && a[n] <= '9'))) {
                which = k;
                if (a[n] == '=')
                    val = a + n + 1;
                else if (a[n])
                    val = a + n; /* -j2 */
                else if (i + 1 < argc)
                    val = argv[++i];
                else {
                    fprintf(stderr, "mgc sweep: %s needs a value (mgc sweep --help)\n", a);
                    goto done;
                }
                break;
            }
        }
        if (which < 0) {
            if (!strcmp(a, "-q") || !strcmp(a, "--quiet")) {
                quiet = 1;
            } else if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
                usage_sweep(stdout);
                rc = 0;
                goto done;
            } else if (a[0] == '-' && a[1]) {
                fprintf(stderr, "mgc sweep: unknown option '%s'\n", a);
                usage_sweep(stderr);
                goto done;
            } else if (S.base) {
                fprintf(stderr, "mgc sweep: one base config only (got '%s' and '%s')\n", S.base, a);
                goto done;
            } else {
                S.base = a;
            }
            continue;
        }
        long long v;
        switch (which) {
        case 0:
            if (S.naxes == 64) {
                fprintf(stderr, "mgc sweep: at most 64 --vary options\n");
                goto done;
            }
            if (parse_vary(val, &S.axes[S.naxes], S.naxes)) {
                S.naxes++; /* so it is freed */
                goto done;
            }
            for (int b = 0; b < S.naxes; b++)
                if (!strcmp(S.axes[b].key, S.axes[S.naxes].key)) {
                    fprintf(
                        stderr,
                        "mgc sweep: --vary %s is given twice; list all its values in one --vary\n",
                        S.axes[b].key);
                    S.naxes++;
                    goto done;
                }
            S.naxes++;
            break;
        case 1:
            if (S.nsets == 64) {
                fprintf(stderr, "mgc sweep: at most 64 --set options\n");
                goto done;
            }
            snprintf(S.origins_set[S.nsets], sizeof S.origins_set[0], "--set #%d", S.nsets + 1);
            S.sets[S.nsets++] = val;
            break;
        case 2:
            if ((v = parse_count("--world-size", val, 1, 16777216)) < 0) goto done;
            snprintf(S.world_assign, sizeof S.world_assign, "parallel.world_size=%lld", v);
            S.world_size = v;
            break;
        case 3:
            S.hw_override = val;
            break;
        case 4: {
            char *end = NULL;
            double h = strtod(val, &end);
            if (end == val || *end || !(h >= 0 && h < 100)) {
                fprintf(stderr,
                        "mgc sweep: --headroom %s: expected a percentage in [0, 100), e.g. 5\n",
                        val);
                goto done;
            }
            S.headroom = h / 100;
            break;
        }
        case 5:
            if ((top = parse_count("--top", val, 0, INT64_MAX)) < 0) goto done;
            break;
        case 6:
            if ((v = parse_count("-j", val, 1, MAX_THREADS)) < 0) goto done;
            S.threads = (int)v;
            break;
        case 7:
            csv = val;
            break;
        case 8:
            json = val;
            break;
        case 9:
            plot = val;
            break;
        }
    }
    if (!S.base) {
        fputs("mgc sweep: no base config\n", stderr);
        usage_sweep(stderr);
        goto done;
    }
    if (S.naxes == 0) {
        fputs("mgc sweep: nothing to vary: give at least one --vary KEY=V1,V2,...\n", stderr);
        goto done;
    }
    S.n = 1;
    for (int a = 0; a < S.naxes; a++) {
        if (S.world_assign[0] && !strcmp(S.axes[a].key, "parallel.world_size")) {
            fputs("mgc sweep: --world-size and --vary parallel.world_size=... conflict; give one\n",
                  stderr);
            goto done;
        }
        if (S.n > MAX_VARIANTS / S.axes[a].n) {
            fprintf(stderr, "mgc sweep: the --vary lists make more than %d variants\n",
                    MAX_VARIANTS);
            goto done;
        }
        S.n *= S.axes[a].n;
    }
    S.text = mgc_read_file(S.base, (size_t)64 << 20, &S.len); /* read once for every variant */
    if (!S.text) {
        fprintf(stderr, "mgc sweep: cannot read %s: %s\n", S.base, strerror(errno));
        goto done;
    }
    rc = prepare(&S);
    if (rc) goto done;
    S.res = calloc((size_t)S.n, sizeof *S.res);
    if (!S.res) {
        fprintf(stderr, "mgc sweep: out of memory for %" PRId64 " results\n", S.n);
        rc = 1;
        goto done;
    }
    if (S.threads > S.n) S.threads = (int)S.n;
    run_all(&S);
    if (rank_all(&S)) {
        fprintf(stderr, "mgc sweep: out of memory\n");
        rc = 1;
        goto done;
    }
    if (!quiet) print_table(&S, top, stdout);
    print_summary(&S, stdout);
    rc = S.n_feasible ? 0 : 1;
    if (!S.n_feasible) print_none(&S, stderr);
    if (csv && write_atomic(csv, write_csv, &S)) rc = 1;
    if (json && write_atomic(json, write_json, &S)) rc = 1;
    if (plot && write_atomic(plot, write_svg, &S)) rc = 1;
done:
    for (int64_t v = 0; S.res && v < S.n; v++)
        free(S.res[v].reason);
    free(S.res);
    free(S.order);
    for (int a = 0; a < S.naxes; a++)
        axis_free(&S.axes[a]);
    free(S.axes);
    free(S.sets);
    free(S.text);
    for (int i = 0; i < S.nhw; i++)
        free(S.hws[i].name);
    return rc;
}
