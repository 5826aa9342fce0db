/* testexec.h - one rank of a plan on the CPU backend inside a test: the backend, a one-rank
 * local world and the executor, opened and closed together.
 *
 *     t_rank r;
 *     if (t_rank_open(&r, p, 1) == 0)        // 1: the parameters initialised
 *         rc = mgc_exec_step(r.x, 0, fn, ctx, &st);
 *     else
 *         fprintf(stderr, "%s\n", t_rank_error(&r));
 *     t_rank_close(&r);                      // also after a failed open
 */
#ifndef MGC_TESTEXEC_H
#define MGC_TESTEXEC_H

#include <string.h>

#include "backend.h"
#include "comm.h"
#include "exec.h"

typedef struct t_rank {
    mgc_backend *be;
    mgc_comm *w; /* the one-rank world */
    mgc_exec *x;
    char err[4096];
} t_rank;

static inline int t_rank_open(t_rank *r, const mgc_plan *p, int init) {
    memset(r, 0, sizeof *r);
    mgc_comm *w[1] = {NULL};
    int ok = p && mgc_backend_cpu_open(&r->be, r->err, sizeof r->err) == 0 &&
             mgc_comm_local_world_create(1, NULL, w, r->err, sizeof r->err) == MGC_COMM_OK;
    r->w = ok ? w[0] : NULL;
    ok = ok && mgc_exec_open(&r->x, p, r->w, r->be, r->err, sizeof r->err) == 0 &&
         (!init || mgc_exec_init_params(r->x) == 0);
    return ok ? 0 : -1;
}

/* The executor's message when it exists, else the opening's. */
static inline const char *t_rank_error(const t_rank *r) {
    return r->x ? mgc_exec_error(r->x) : r->err;
}

static inline void t_rank_close(t_rank *r) {
    mgc_exec_free(r->x);
    mgc_comm_free(r->w);
    mgc_backend_close(r->be);
    r->x = NULL, r->w = NULL, r->be = NULL;
}

#endif
