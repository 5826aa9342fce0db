/* kernels.c - see kernels.h. */
#include "kernels.h"

#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kspec.h"
#include "nvrtc.h"

int mgc_plan_cuda_archs(const mgc_plan *p, int *archs, int max) {
    int n = 0;
    for (int i = 0; i < max; i++) {
        char key[64];
        int64_t v;
        snprintf(key, sizeof key, "hardware.cuda_archs[%d]", i);
        if (!mgc_plan_config_int(p, key, &v)) break;
        archs[n++] = (int)v;
    }
    return n;
}

typedef struct job {
    mgc_kspec spec;
    char name[MGC_KSPEC_NAME_MAX];
    int arch;
    mgc_nvrtc_result res;
    int cached, rc;
    char err[2048];
} job;

typedef struct pool {
    job *jobs;
    int n, next;
    pthread_mutex_t mu;
} pool;

static void *worker(void *arg) {
    pool *P = arg;
    for (;;) {
        pthread_mutex_lock(&P->mu);
        int i = P->next++;
        pthread_mutex_unlock(&P->mu);
        if (i >= P->n) return NULL;
        job *j = &P->jobs[i];
        char *src = mgc_kspec_source(&j->spec);
        if (!src) {
            j->rc = -1;
            snprintf(j->err, sizeof j->err, "%s: no template kernels/%s", j->name, j->spec.file);
            continue;
        }
        j->rc = mgc_nvrtc_compile_cached(src, j->name, j->arch, &j->res, &j->cached, j->err,
                                         sizeof j->err);
        free(src);
    }
}

static int add_spec(mgc_kspec **specs, int *n, int *cap, const mgc_kspec *k) {
    char a[MGC_KSPEC_NAME_MAX], b[MGC_KSPEC_NAME_MAX];
    mgc_kspec_name(k, a, sizeof a);
    for (int i = 0; i < *n; i++) {
        mgc_kspec_name(&(*specs)[i], b, sizeof b);
        if (!strcmp(a, b)) return 0;
    }
    if (*n == *cap) {
        int nc = *cap ? 2 * *cap : 64;
        mgc_kspec *q = realloc(*specs, (size_t)nc * sizeof *q);
        if (!q) return -1;
        *specs = q, *cap = nc;
    }
    (*specs)[(*n)++] = *k;
    return 0;
}

int mgc_compile_kernels(mgc_plan *p, const int *archs, int n_archs, int threads,
                        mgc_kernel_stats *st, char *err, size_t errsz) {
    memset(st, 0, sizeof *st);
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    mgc_kspec *specs = NULL, k[MGC_KSPEC_MAX_PER_OP > 16 ? MGC_KSPEC_MAX_PER_OP : 16];
    int n = 0, cap = 0;
    /* evaluations run the ops with dropout 0 (docs/runtime.md): their kernels too */
    int64_t eval = 0;
    mgc_plan_config_int(p, "training.eval_interval", &eval);
    for (int64_t s = 0; s < p->n_stages; s++)
        for (int64_t c = 0; c < p->stages[s].n_chunks; c++) {
            const mgc_plan_chunk *ch = &p->stages[s].chunks[c];
            for (int pass = 0; pass < 2; pass++) {
                const mgc_plan_op *ops = pass ? ch->bwd : ch->fwd;
                int64_t nops = pass ? ch->n_bwd : ch->n_fwd;
                for (int64_t i = 0; i < nops; i++) {
                    mgc_plan_op op = ops[i];
                    int da = mgc_plan_op_dropout_attr(&op);
                    for (int variant = 0; variant < (eval > 0 && da >= 0 && op.fattr[da] > 0 ? 2 : 1); variant++) {
                        if (variant) op.fattr[da] = 0;
                        int m = mgc_kspecs_for_op(p, ch, &op, k, MGC_KSPEC_MAX_PER_OP, err, errsz);
                        if (m < 0 && op.kind < MGC_POP_ALL_REDUCE) {
                            free(specs);
                            return -1;
                        }
                        for (int q = 0; q < m; q++) {
                            if (add_spec(&specs, &n, &cap, &k[q])) goto oom;
                            /* and its twin for GPUs with less shared memory, which the
                             * runtime chooses at launch (kspec.h mgc_kspec_twin) */
                            mgc_kspec tw;
                            if (mgc_kspec_twin(&k[q], &tw) && add_spec(&specs, &n, &cap, &tw))
                                goto oom;
                        }
                    }
                }
            }
        }
    int m = mgc_kspecs_for_plan(p, k, 16);
    for (int q = 0; q < m; q++)
        if (add_spec(&specs, &n, &cap, &k[q])) goto oom;
    job *jobs = calloc((size_t)(n * n_archs + 1), sizeof *jobs);
    if (!jobs) goto oom;
    int nj = 0;
    for (int i = 0; i < n; i++)
        for (int a = 0; a < n_archs; a++) {
            job *j = &jobs[nj++];
            j->spec = specs[i];
            j->arch = archs[a];
            mgc_kspec_name(&specs[i], j->name, sizeof j->name);
        }
    free(specs);
    pool P = {jobs, nj, 0, PTHREAD_MUTEX_INITIALIZER};
    if (threads < 1) threads = 1;
    if (threads > 64) threads = 64;
    pthread_t th[64];
    int started = 0;
    for (int t = 0; t < threads && t < nj; t++)
        if (!pthread_create(&th[t], NULL, worker, &P)) started++;
    if (started == 0) worker(&P);
    for (int t = 0; t < started; t++)
        pthread_join(th[t], NULL);
    int rc = 0;
    for (int i = 0; i < nj && !rc; i++)
        if (jobs[i].rc) {
            snprintf(err, errsz, "%s", jobs[i].err);
            rc = -1;
        }
    /* add to the plan: names interned, cubins back to back at 8-byte offsets */
    uint64_t total = p->kbin_len;
    for (int i = 0; i < nj && !rc; i++)
        total += (jobs[i].res.cubin_bytes + 7) & ~(uint64_t)7;
    mgc_plan_kernel *kt = rc ? NULL : realloc(p->kernels, (size_t)(p->n_kernels + nj) * sizeof *kt);
    if (kt) p->kernels = kt;
    uint8_t *kb = rc || !kt ? NULL : realloc(p->kbin, (size_t)total);
    if (!rc && (!kt || !kb)) {
        snprintf(err, errsz, "out of memory adding %d kernels to the plan", nj);
        rc = -1;
    }
    if (!rc) {
        p->kbin = kb;
        for (int i = 0; i < nj; i++) {
            job *j = &jobs[i];
            uint32_t name = mgc_plan_str(p, j->name);
            if (name == UINT32_MAX) {
                snprintf(err, errsz, "out of memory naming kernels");
                rc = -1;
                break;
            }
            mgc_plan_kernel *e = &p->kernels[p->n_kernels++];
            e->name = name;
            e->arch = (uint32_t)j->arch;
            e->offset = p->kbin_len;
            e->bytes = j->res.cubin_bytes;
            memcpy(p->kbin + p->kbin_len, j->res.cubin, j->res.cubin_bytes);
            uint64_t pad = ((j->res.cubin_bytes + 7) & ~(uint64_t)7) - j->res.cubin_bytes;
            memset(p->kbin + p->kbin_len + j->res.cubin_bytes, 0, (size_t)pad);
            p->kbin_len += j->res.cubin_bytes + pad;
            st->cubin_bytes += j->res.cubin_bytes;
            if (j->cached) st->cached++;
            else st->compiled++;
            if (j->res.registers > st->max_registers) st->max_registers = j->res.registers;
            if (j->res.stack_bytes > st->max_stack_bytes) st->max_stack_bytes = j->res.stack_bytes;
            st->spilling += j->res.spill_bytes > 0;
            if (j->res.spill_bytes > st->max_spill_bytes) {
                st->max_spill_bytes = j->res.spill_bytes;
                snprintf(st->worst_spill, sizeof st->worst_spill, "%s (sm_%d)", j->name, j->arch);
            }
        }
    }
    for (int i = 0; i < nj; i++)
        free(jobs[i].res.cubin);
    free(jobs);
    st->specs = n;
    st->archs = n_archs;
    clock_gettime(CLOCK_MONOTONIC, &t1);
    st->seconds = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) * 1e-9;
    return rc;
oom:
    free(specs);
    snprintf(err, errsz, "out of memory collecting kernel specs");
    return -1;
}
