/* test_compile.c - `mgc compile` end to end: every model in models/ and
 * examples/ under several layouts compiles, the schedule simulator accepts
 * it (mgc_compile refuses otherwise), the plan survives encode/decode
 * unchanged, and an independent checker (written here, not the planner's)
 * proves that no two simultaneously live buffers of any stage overlap. */
#include <dirent.h>
#include <stdlib.h>
#include <string.h>

#include "compile.h"
#include "config.h"
#include "facts.h"
#include "ir.h"
#include "plan.h"
#include "testlib.h"

/* Layout variants tried on every model; a variant the config rules reject
 * for a model is skipped (and counted), the others must compile. */
static const char *const variants[][6] = {
    {NULL},
    {"training.recompute=full", NULL},
    {"training.recompute=selective", "parallel.distributed_optimizer=true", NULL},
    {"parallel.pipeline=2", "parallel.world_size=", "parallel.data=1", "parallel.virtual_stages=1", "parallel.pipeline_layout=", NULL},
    {"parallel.pipeline=2", "parallel.virtual_stages=2", "parallel.world_size=", "parallel.data=1", "parallel.pipeline_layout=", NULL},
    {"parallel.tensor=2", "parallel.sequence_parallel=true", "parallel.world_size=", "parallel.data=2", "parallel.expert=1", NULL},
    {"parallel.schedule=gpipe", "parallel.virtual_stages=1", "parallel.pipeline_layout=", NULL},
};
#define NVARIANTS (sizeof variants / sizeof variants[0])

/* Independent arena check: aligned, inside the arena, and pairwise disjoint
 * when lifetimes overlap.  Returns the number of violations. */
static int64_t arena_violations(const mgc_stage_program *sp) {
    int64_t bad = 0;
    for (int64_t i = 0; i < sp->n_buffers; i++) {
        const mgc_buffer *a = &sp->buffers[i];
        if (a->offset % MGC_PLAN_ALIGN) bad++;
        if (a->offset > sp->arena_bytes || a->bytes > sp->arena_bytes - a->offset) bad++;
        if (a->live_end < a->live_begin) bad++;
        for (int64_t j = i + 1; j < sp->n_buffers; j++) {
            const mgc_buffer *b = &sp->buffers[j];
            int live = a->live_begin < b->live_end && b->live_begin < a->live_end && a->bytes && b->bytes;
            int bytes = a->offset < b->offset + b->bytes && b->offset < a->offset + a->bytes;
            if (live && bytes) {
                if (bad < 3)
                    fprintf(stderr, "  overlap: %s [%llu,+%llu) live [%lld,%lld) and %s [%llu,+%llu) live [%lld,%lld)\n",
                            "a", (unsigned long long)a->offset, (unsigned long long)a->bytes, (long long)a->live_begin,
                            (long long)a->live_end, "b", (unsigned long long)b->offset,
                            (unsigned long long)b->bytes, (long long)b->live_begin, (long long)b->live_end);
                bad++;
            }
        }
    }
    return bad;
}

/* Every tensor's bytes lie inside its buffer (or the chunk's stash). */
static int64_t tensor_violations(const mgc_stage_program *sp) {
    int64_t bad = 0;
    for (int64_t c = 0; c < sp->n_chunks; c++) {
        const mgc_plan_chunk *ch = &sp->chunks[c];
        for (int64_t t = 0; t < ch->n_tensors; t++) {
            const mgc_plan_tensor *x = &ch->tensors[t];
            uint64_t cap = x->buffer == MGC_PLAN_BUF_STASH ? ch->stash_bytes
                           : x->buffer >= 0                ? sp->buffers[x->buffer].bytes
                                                           : UINT64_MAX;
            if (x->buffer >= 0 || x->buffer == MGC_PLAN_BUF_STASH)
                if (x->offset > cap || x->bytes > cap - x->offset) bad++;
        }
    }
    return bad;
}

static int compile_one(const char *path, const char *const *sets, int *skipped) {
    mgc_diags d;
    mgc_diags_init(&d);
    mgc_config *c = mgc_config_new();
    mgc_config_load_file(c, path, &d);
    for (int i = 0; sets[i]; i++) mgc_config_set(c, sets[i], "--set", &d);
    if (d.errors == 0) mgc_config_finalize(c, &d);
    if (d.errors) { /* this layout does not fit this model: not a compile failure */
        (*skipped)++;
        mgc_config_free(c);
        mgc_diags_free(&d);
        return 0;
    }
    mgc_graph *g = mgc_ir_build(c, &d);
    T_CHECK(g != NULL);
    mgc_plan *p = g ? mgc_compile(c, g, &d) : NULL;
    T_CHECK(p != NULL);
    if (!p) {
        fprintf(stderr, "%s:", path);
        for (int i = 0; sets[i]; i++) fprintf(stderr, " --set %s", sets[i]);
        fprintf(stderr, "\n");
        mgc_diags_print(&d, stderr);
    }
    if (p) {
        T_EQ_I64(p->n_stages, c->parallel.pipeline);
        for (int64_t s = 0; s < p->n_stages; s++) {
            T_EQ_I64(arena_violations(&p->stages[s]), 0);
            T_EQ_I64(tensor_violations(&p->stages[s]), 0);
            T_CHECK(p->stages[s].arena_bytes > 0);
            /* buckets tile the GRAD buffer exactly, split evenly into shards,
             * and the schedule reduces each once */
            const mgc_stage_program *sp = &p->stages[s];
            uint64_t grad = 0, tiled = 0;
            for (int64_t b = 0; b < sp->n_buffers; b++)
                if (sp->buffers[b].kind == MGC_BUF_GRAD) grad += sp->buffers[b].bytes;
            int64_t reduces = 0;
            for (int64_t i = 0; i < sp->n_instrs; i++) reduces += sp->instrs[i].op == MGC_I_REDUCE_GRADS;
            for (int64_t b = 0; b < sp->n_buckets; b++) {
                tiled += sp->buckets[b].grad_bytes;
                T_CHECK(sp->buckets[b].shards >= 1 && sp->buckets[b].count % (uint64_t)sp->buckets[b].shards == 0);
                T_CHECK(sp->buckets[b].group == MGC_GROUP_DPCP || sp->buckets[b].group == MGC_GROUP_EDP);
            }
            T_EQ_U64(tiled, grad);
            T_EQ_I64(reduces, sp->n_buckets);
            T_CHECK(p->stages[s].n_instrs > 0);
        }
        /* round trip: decode(encode(p)) encodes to the same bytes */
        uint8_t *buf = NULL, *buf2 = NULL;
        size_t len = 0, len2 = 0;
        char err[512];
        T_EQ_I64(mgc_plan_encode(p, &buf, &len, err, sizeof err), MGC_PLAN_OK);
        mgc_plan *q = NULL;
        T_EQ_I64(mgc_plan_decode(buf, len, path, &q, err, sizeof err), MGC_PLAN_OK);
        if (q) {
            T_EQ_I64(mgc_plan_encode(q, &buf2, &len2, err, sizeof err), MGC_PLAN_OK);
            T_CHECK(len == len2 && buf2 && memcmp(buf, buf2, len) == 0);
            for (int64_t s = 0; s < q->n_stages; s++) T_EQ_U64(q->stages[s].arena_bytes, p->stages[s].arena_bytes);
        }
        free(buf);
        free(buf2);
        mgc_plan_free(q);
    }
    mgc_plan_free(p);
    mgc_ir_free(g);
    mgc_config_free(c);
    mgc_diags_free(&d);
    return 1;
}

static int compile_dir(const char *dir) {
    char dpath[512];
    snprintf(dpath, sizeof dpath, "%s/%s", MGC_SOURCE_DIR, dir);
    DIR *dh = opendir(dpath);
    T_CHECK(dh != NULL);
    if (!dh) return 0;
    int files = 0;
    struct dirent *e;
    while ((e = readdir(dh))) {
        size_t n = strlen(e->d_name);
        if (n < 6 || strcmp(e->d_name + n - 5, ".yaml")) continue;
        char path[1024];
        snprintf(path, sizeof path, "%s/%s", dpath, e->d_name);
        int compiled = 0, skipped = 0;
        for (size_t v = 0; v < NVARIANTS; v++) compiled += compile_one(path, variants[v], &skipped);
        printf("  %-20s %d layouts compiled, %d not valid for this model\n", e->d_name, compiled, skipped);
        T_CHECK(compiled >= 3); /* the file's own layout and at least two variants */
        files++;
    }
    closedir(dh);
    return files;
}

int main(void) {
    int n = compile_dir("models") + compile_dir("examples");
    T_CHECK(n >= 15);
    return t_summary("test_compile");
}
