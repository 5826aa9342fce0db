/* compile.c - see compile.h. */
#include "compile.h"

#include "fusion.h"
#include "kspec.h"
#include "losschunk.h"
#include "memplan.h"
#include "partition.h"
#include "schedule.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Append one key/value; 0 on success. */
static int kv_add(mgc_plan *p, const char *key, int type, int64_t i, double f, const char *s) {
    if (p->n_config % 64 == 0) {
        mgc_plan_kv *v = realloc(p->config, (size_t)(p->n_config + 64) * sizeof *v);
        if (!v) return -1;
        p->config = v;
    }
    mgc_plan_kv *e = &p->config[p->n_config];
    memset(e, 0, sizeof *e);
    e->key = mgc_plan_str(p, key);
    e->type = (uint16_t)type;
    e->i = i;
    e->f = f;
    e->s = s ? mgc_plan_str(p, s) : 0;
    if (e->key == UINT32_MAX || (s && e->s == UINT32_MAX)) return -1;
    p->n_config++;
    return 0;
}

int mgc_compile_config_kv(const mgc_config *c, mgc_plan *p) {
    mgc_config *cc = (mgc_config *)c; /* mgc_config_field is not const-qualified */
    for (int k = 0; k < MGC_KEY__COUNT; k++) {
        const mgc_keyinfo *ki = &mgc_keys[k];
        const void *f = mgc_config_field(cc, (mgc_key)k);
        char key[160];
        int rc = 0;
        switch (ki->type) {
        case MGC_T_INT: rc = kv_add(p, ki->path, 0, *(const int64_t *)f, 0, NULL); break;
        case MGC_T_BOOL:
        case MGC_T_ENUM: rc = kv_add(p, ki->path, 0, *(const int *)f, 0, NULL); break;
        case MGC_T_FLOAT: rc = kv_add(p, ki->path, 1, 0, *(const double *)f, NULL); break;
        case MGC_T_STRING: {
            const char *s = *(char *const *)f;
            rc = kv_add(p, ki->path, 2, 0, 0, s ? s : "");
            break;
        }
        case MGC_T_INT_LIST: {
            const mgc_int_list *l = f;
            for (int i = 0; i < l->n && !rc; i++) {
                snprintf(key, sizeof key, "%s[%d]", ki->path, i);
                rc = kv_add(p, key, 0, l->v[i], 0, NULL);
            }
            break;
        }
        case MGC_T_STRING_LIST: {
            const mgc_str_list *l = f;
            for (int i = 0; i < l->n && !rc; i++) {
                snprintf(key, sizeof key, "%s[%d]", ki->path, i);
                rc = kv_add(p, key, 2, 0, 0, l->v[i]);
            }
            break;
        }
        case MGC_T_BLEND: {
            const mgc_blend *b = f;
            for (int i = 0; i < b->n && !rc; i++) {
                snprintf(key, sizeof key, "%s[%d].path", ki->path, i);
                rc = kv_add(p, key, 2, 0, 0, b->path[i]);
                snprintf(key, sizeof key, "%s[%d].weight", ki->path, i);
                if (!rc) rc = kv_add(p, key, 1, 0, b->weight[i], NULL);
            }
            break;
        }
        }
        if (rc) return -1;
    }
    /* derived values the runtime needs and cannot recompute without the compiler */
    if (kv_add(p, "derived.padded_vocab_size", 0, c->derived.padded_vocab_size, 0, NULL)) return -1;
    if (kv_add(p, "derived.num_microbatches", 0, c->derived.num_microbatches, 0, NULL)) return -1;
    if (kv_add(p, "derived.sequence_parallel", 0, c->derived.sequence_parallel, 0, NULL)) return -1;
    return 0;
}

/* ---- the driver ------------------------------------------------------------- */

/* parallel.grad_bucket_size, or Megatron's default DDP bucket: max(40M, 1M * dp) parameters. */
static int64_t bucket_elems(const mgc_config *c) {
    if (c->parallel.grad_bucket_size > 0) return c->parallel.grad_bucket_size;
    int64_t dpcp = c->parallel.data * c->parallel.context;
    int64_t b = 1000000 * dpcp;
    return b > 40000000 ? b : 40000000;
}

mgc_plan *mgc_compile(const mgc_config *c, const mgc_graph *g, mgc_diags *d) {
    int before = d->errors;
    mgc_loc at = c->file_loc;
    mgc_schedule *sched = NULL;
    mgc_sim_result sim;
    memset(&sim, 0, sizeof sim);
    int64_t *buckets = NULL;
    mgc_memplan_cache *mcache = NULL;
    mgc_plan *p = mgc_plan_new();
    if (!p) goto oom;
    mgc_partition_grid(c, &p->grid);
    p->num_microbatches = c->derived.num_microbatches;
    p->micro_batch_size = c->training.micro_batch_size;
    p->seq_length = c->model.seq_length;
    p->schedule = c->parallel.schedule;
    p->recompute = c->training.recompute;
    p->distributed_optimizer = c->parallel.distributed_optimizer;
    if (mgc_compile_config_kv(c, p)) goto oom;

    const int64_t pp = p->grid.pp, loss_chunks = mgc_loss_chunks(c);
    p->n_stages = pp;
    p->stages = calloc((size_t)pp, sizeof *p->stages);
    buckets = calloc((size_t)pp, sizeof *buckets);
    if (!p->stages || !buckets) goto oom;

    /* 1. partition + autodiff: each pipeline rank's chunks */
    for (int64_t r = 0; r < pp; r++) {
        mgc_stage_program *sp = &p->stages[r];
        sp->pp_rank = r;
        sp->n_chunks = p->grid.vp;
        sp->chunks = calloc((size_t)sp->n_chunks, sizeof *sp->chunks);
        if (!sp->chunks) goto oom;
        if (mgc_partition_build(c, g, &p->grid, r, p, sp->chunks, d) || d->errors != before) goto fail;
        /* the head in row chunks (losschunk.h), before the fusions see the programs */
        for (int64_t k = 0; k < sp->n_chunks && loss_chunks > 1; k++)
            if (sp->chunks[k].loss && mgc_loss_chunk(p, &sp->chunks[k], loss_chunks)) {
                mgc_diag(d, MGC_SEV_ERROR, c->loc[MGC_KEY_TRAIN_LOSS_CHUNKS],
                         "set training.loss_chunks: 1, and please report it with the config",
                         "cannot split the output layer and cross-entropy into %" PRId64
                         " row chunks (out of memory, or a head this mgc does not recognise)",
                         loss_chunks);
                goto fail;
            }
        /* fusions (fusion.h): before the memory plan, which sees the fused programs;
         * MGC_FUSION in the environment chooses them (debugging, tests, A/B timings) */
        unsigned fuse;
        const char *bad = NULL;
        size_t bad_len = 0;
        if (mgc_fusion_parse(getenv("MGC_FUSION"), &fuse, &bad, &bad_len)) {
            mgc_diag(d, MGC_SEV_ERROR, at,
                     "MGC_FUSION takes 0, 1 or a comma-separated list of norm_bwd_add, add_norm, "
                     "linear_gelu, dgrad_gelu, qkv_attention, qkv_rope, norm_bwd_bias, "
                     "embedding_norm, norm_bwd_drop, attention_bwd_bias, dgrad_gelu_bias, each with "
                     "an optional leading '-' "
                     "(docs/partitioning.md#fusions)",
                     "the environment's MGC_FUSION names no fusion '%.*s'", (int)bad_len, bad);
            goto fail;
        }
        for (int e = 0; e < MGC_KSPEC_ATT_TILE_ENVS; e++) {
            const char *env = mgc_kspec_att_tile_envs[e];
            if (mgc_kspec_att_tile_env(env) >= 0) continue;
            char hint[96];
            snprintf(hint, sizeof hint, "it takes %s (docs/cuda-backend.md), or unset it",
                     mgc_kspec_att_tile_values(env));
            mgc_diag(d, MGC_SEV_ERROR, at, hint,
                     "the environment's %s='%s' is no attention tile size", env, getenv(env));
            goto fail;
        }
        for (int64_t k = 0; k < sp->n_chunks; k++) mgc_fuse_chunk(&sp->chunks[k], fuse, NULL);
        /* in-place outputs (memplan.h), on the fused programs; MGC_INPLACE=0 turns them off */
        const char *ip = getenv("MGC_INPLACE");
        if (!(ip && !strcmp(ip, "0")))
            for (int64_t k = 0; k < sp->n_chunks; k++) mgc_memplan_inplace(&sp->chunks[k]);
        /* the gradient buckets, from the flat parameter layout (memplan.h) */
        if (mgc_memplan_buckets(c, &p->grid, sp, bucket_elems(c), &sp->buckets, &sp->n_buckets)) {
            mgc_diag(d, MGC_SEV_ERROR, at, "out of memory, or a bug in mgc: please report it with the config",
                     "cannot lay out the gradient buckets of pipeline rank %lld", (long long)r);
            goto fail;
        }
        buckets[r] = sp->n_buckets;
    }

    /* 2. the schedule, checked by the simulator before anything is written */
    mgc_schedule_params sprm;
    mgc_schedule_params_from_config(c, 1, &sprm);
    sprm.rank_buckets = buckets;
    if (mgc_schedule_build(&sprm, &sched, d) || !sched) goto fail;
    if (mgc_schedule_simulate(sched, NULL, &sim, d) || !sim.ok) {
        if (d->errors == before)
            mgc_diag(d, MGC_SEV_ERROR, at, "this is a bug in mgc's scheduler; please report it with the config",
                     "the schedule simulator rejected the pipeline schedule");
        goto fail;
    }
    p->bubble_fraction = sim.bubble_fraction;
    for (int64_t r = 0; r < pp; r++) {
        /* move the stream into the plan */
        p->stages[r].n_instrs = sched->ranks[r].n;
        p->stages[r].instrs = sched->ranks[r].instrs;
        sched->ranks[r].instrs = NULL;
        sched->ranks[r].n = 0;
    }

    /* 3. the static memory plan of every pipeline rank (ranks share the
     * workspace packings of their equal chunks through the cache) */
    mcache = mgc_memplan_cache_new(); /* NULL on OOM: works uncached */
    for (int64_t r = 0; r < pp; r++)
        if (mgc_memplan_build_cached(c, &p->grid, p, &p->stages[r], d, NULL, mcache) ||
            d->errors != before)
            goto fail;
    mgc_memplan_cache_free(mcache);
    mcache = NULL;

    char err[512];
    if (mgc_plan_validate(p, err, sizeof err) != MGC_PLAN_OK) {
        mgc_diag(d, MGC_SEV_ERROR, at, "this is a bug in mgc; please report it with the config",
                 "the compiled plan is inconsistent: %s", err);
        goto fail;
    }
    mgc_sim_result_free(&sim);
    mgc_schedule_free(sched);
    free(buckets);
    return p;
oom:
    mgc_diag(d, MGC_SEV_ERROR, at, NULL, "out of memory while compiling the plan");
fail:
    mgc_memplan_cache_free(mcache);
    mgc_sim_result_free(&sim);
    mgc_schedule_free(sched);
    free(buckets);
    mgc_plan_free(p);
    return NULL;
}
