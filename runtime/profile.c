/* profile.c - see profile.h; the file format is in docs/runtime.md ("Profiling"). */
#include "profile.h"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#ifdef MGC_HAVE_CUDA_BACKEND
#include <cuda_runtime_api.h>
#endif

typedef struct tsum {
    int64_t calls;
    double total_s;
} tsum;

typedef struct igroup { /* instructions of one (op, chunk, arg) */
    uint16_t op, chunk;
    uint32_t arg;
    tsum t;
} igroup;

struct mgc_profile {
    const mgc_plan *plan;
    const mgc_stage_program *sp;
    int64_t rank;
    tsum **ops;           /* (n_chunks * 2): [2c] forward, [2c + 1] backward, each (n_fwd|n_bwd) */
    int64_t *instr_group; /* (n_instrs) index into groups */
    igroup *groups;       /* (n_groups) in order of first appearance */
    int64_t n_groups;
    tsum step;
    char backend[16];
    char device[256];
    int device_timing; /* the ops timed by the backend's timers */
};

/* The instruction names of the file (mgc_instr_op, upper case). */
static const char *const instr_names[] = {
    "LOAD_BATCH", "FORWARD",      "BACKWARD",    "SEND_ACT",  "RECV_ACT",     "SEND_GRAD",
    "RECV_GRAD",  "REDUCE_GRADS", "EMBED_GRADS", "OPTIMIZER", "GATHER_PARAMS"};
_Static_assert(sizeof instr_names / sizeof instr_names[0] == MGC_I__COUNT, "instruction names");

int mgc_profile_open(mgc_profile **out, const mgc_plan *plan, int64_t rank, const char *backend,
                     const char *device, char *err, size_t errsz) {
    *out = NULL;
    mgc_coords co;
    if (mgc_grid_coords(&plan->grid, rank, &co)) {
        snprintf(err, errsz, "profile: rank %" PRId64 " is outside the plan's grid", rank);
        return -1;
    }
    mgc_profile *p = calloc(1, sizeof *p);
    if (!p) goto oom;
    p->plan = plan;
    p->sp = &plan->stages[co.pp];
    p->rank = rank;
    snprintf(p->backend, sizeof p->backend, "%s", backend ? backend : "cpu");
    snprintf(p->device, sizeof p->device, "%s", device ? device : p->backend);
    const mgc_stage_program *sp = p->sp;
    p->ops = calloc((size_t)(2 * sp->n_chunks + 1), sizeof *p->ops);
    p->instr_group = calloc((size_t)(sp->n_instrs + 1), sizeof *p->instr_group);
    p->groups = calloc((size_t)(sp->n_instrs + 1), sizeof *p->groups);
    if (!p->ops || !p->instr_group || !p->groups) goto oom;
    for (int64_t c = 0; c < sp->n_chunks; c++) {
        p->ops[2 * c] = calloc((size_t)(sp->chunks[c].n_fwd + 1), sizeof(tsum));
        p->ops[2 * c + 1] = calloc((size_t)(sp->chunks[c].n_bwd + 1), sizeof(tsum));
        if (!p->ops[2 * c] || !p->ops[2 * c + 1]) goto oom;
    }
    for (int64_t i = 0; i < sp->n_instrs; i++) {
        const mgc_instr *in = &sp->instrs[i];
        /* FORWARD and BACKWARD are keyed per chunk only (their arg means nothing) */
        uint32_t arg = in->op == MGC_I_FORWARD || in->op == MGC_I_BACKWARD ? 0 : in->arg;
        int64_t g = 0;
        while (g < p->n_groups && !(p->groups[g].op == in->op && p->groups[g].chunk == in->chunk &&
                                    p->groups[g].arg == arg))
            g++;
        if (g == p->n_groups) {
            p->groups[g].op = in->op;
            p->groups[g].chunk = in->chunk;
            p->groups[g].arg = arg;
            p->n_groups++;
        }
        p->instr_group[i] = g;
    }
    *out = p;
    return 0;
oom:
    mgc_profile_free(p);
    snprintf(err, errsz, "profile: out of memory");
    return -1;
}

void mgc_profile_free(mgc_profile *p) {
    if (!p) return;
    if (p->ops)
        for (int64_t c = 0; c < 2 * p->sp->n_chunks; c++)
            free(p->ops[c]);
    free(p->ops);
    free(p->instr_group);
    free(p->groups);
    free(p);
}

void mgc_profile_add_op(mgc_profile *p, int chunk, int pass, int64_t index, double seconds) {
    if (chunk < 0 || chunk >= p->sp->n_chunks || pass < 0 || pass > 1 || index < 0) return;
    const mgc_plan_chunk *ch = &p->sp->chunks[chunk];
    if (index >= (pass ? ch->n_bwd : ch->n_fwd)) return;
    tsum *t = &p->ops[2 * chunk + pass][index];
    t->calls++;
    t->total_s += seconds;
}

void mgc_profile_add_instr(mgc_profile *p, int64_t instr, double seconds) {
    if (instr < 0 || instr >= p->sp->n_instrs) return;
    tsum *t = &p->groups[p->instr_group[instr]].t;
    t->calls++;
    t->total_s += seconds;
}

void mgc_profile_add_step(mgc_profile *p, double seconds) {
    p->step.calls++;
    p->step.total_s += seconds;
}

void mgc_profile_set_device_timing(mgc_profile *p, int device) {
    p->device_timing = device != 0;
}

void mgc_profile_device_name(const char *backend, char *buf, size_t n) {
    snprintf(buf, n, "%s", backend ? backend : "cpu");
#ifdef MGC_HAVE_CUDA_BACKEND
    /* the backend made its device current on this thread (cudaSetDevice) */
    int dev = 0;
    struct cudaDeviceProp prop;
    if (backend && !strcmp(backend, "cuda") && cudaGetDevice(&dev) == cudaSuccess &&
        cudaGetDeviceProperties(&prop, dev) == cudaSuccess)
        snprintf(buf, n, "%s", prop.name);
#endif
}

/* ---- writing ------------------------------------------------------------------------------ */

/* A JSON string: quotes, backslashes and control characters escaped; other bytes as they are. */
static void json_str(FILE *f, const char *s) {
    fputc('"', f);
    for (const unsigned char *c = (const unsigned char *)(s ? s : ""); *c; c++) {
        if (*c == '"' || *c == '\\')
            fprintf(f, "\\%c", *c);
        else if (*c == '\n')
            fputs("\\n", f);
        else if (*c == '\t')
            fputs("\\t", f);
        else if (*c < 0x20 || *c == 0x7f)
            fprintf(f, "\\u%04x", *c);
        else
            fputc(*c, f);
    }
    fputc('"', f);
}

static double mean(const tsum *t) {
    return t->calls > 0 ? t->total_s / (double)t->calls : 0.0;
}

static const char *precision_name(const mgc_plan *plan) {
    int64_t prec = 0;
    mgc_plan_config_int(plan, "training.precision", &prec);
    return prec == 1 ? "bf16" : prec == 2 ? "fp16" : "fp32";
}

static void write_ops(FILE *f, const mgc_profile *p) {
    const mgc_stage_program *sp = p->sp;
    for (int64_t c = 0; c < sp->n_chunks; c++)
        for (int pass = 0; pass < 2; pass++) {
            const mgc_plan_chunk *ch = &sp->chunks[c];
            const mgc_plan_op *ops = pass ? ch->bwd : ch->fwd;
            int64_t n = pass ? ch->n_bwd : ch->n_fwd;
            for (int64_t i = 0; i < n; i++) {
                const tsum *t = &p->ops[2 * c + pass][i];
                fprintf(f,
                        "{\"type\":\"op\",\"rank\":%" PRId64 ",\"stage\":%" PRId64
                        ",\"chunk\":%" PRId64 ",\"pass\":\"%s\",\"index\":%" PRId64 ",\"kind\":",
                        p->rank, sp->pp_rank, c, pass ? "bwd" : "fwd", i);
                json_str(f, mgc_plan_op_name((mgc_plan_op_kind)ops[i].kind));
                fputs(",\"name\":", f);
                json_str(f, mgc_plan_strat(p->plan, ops[i].name));
                fprintf(f, ",\"calls\":%" PRId64 ",\"total_s\":%.9g,\"mean_s\":%.9g}\n", t->calls,
                        t->total_s, mean(t));
            }
        }
}

static void write_instrs(FILE *f, const mgc_profile *p) {
    for (int64_t g = 0; g < p->n_groups; g++) {
        const igroup *G = &p->groups[g];
        fprintf(f,
                "{\"type\":\"instr\",\"rank\":%" PRId64 ",\"stage\":%" PRId64
                ",\"op\":\"%s\",\"chunk\":%u,\"arg\":%" PRIu32 ",\"calls\":%" PRId64
                ",\"total_s\":%.9g,\"mean_s\":%.9g}\n",
                p->rank, p->sp->pp_rank, G->op < MGC_I__COUNT ? instr_names[G->op] : "UNKNOWN",
                (unsigned)G->chunk, G->arg, G->t.calls, G->t.total_s, mean(&G->t));
    }
}

int mgc_profile_write(FILE *f, mgc_profile *const *ranks, int n, const mgc_profile_info *info) {
    if (n < 1) return 0;
    const mgc_profile *h = ranks[0];
    fputs("{\"type\":\"header\",\"format\":\"mgc-profile-1\",\"plan\":", f);
    json_str(f, info->plan_path);
    fputs(",\"backend\":", f);
    json_str(f, h->backend);
    fputs(",\"device\":", f);
    json_str(f, h->device);
    fprintf(f, ",\"op_timing\":\"%s\"", h->device_timing ? "device" : "host");
    fprintf(f,
            ",\"world_size\":%" PRId64 ",\"steps\":%" PRId64 ",\"warmup_steps\":%" PRId64
            ",\"precision\":\"%s\"}\n",
            h->plan->grid.world, h->step.calls, info->warmup_steps, precision_name(h->plan));
    for (int r = 0; r < n; r++)
        write_ops(f, ranks[r]);
    for (int r = 0; r < n; r++)
        write_instrs(f, ranks[r]);
    for (int r = 0; r < n; r++)
        fprintf(f,
                "{\"type\":\"step\",\"rank\":%" PRId64 ",\"steps\":%" PRId64
                ",\"total_s\":%.9g,\"mean_s\":%.9g}\n",
                ranks[r]->rank, ranks[r]->step.calls, ranks[r]->step.total_s,
                mean(&ranks[r]->step));
    return ferror(f) ? -1 : 0;
}
