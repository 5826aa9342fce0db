/* profile.h - measured per-op and per-instruction times of one rank (mgc-run --profile).
 *
 * A profile holds one rank's sums: per compute or collective op of each chunk
 * program (chunk, pass, index), per instruction group of the stage's stream
 * (op, chunk, arg) and per step: calls and total seconds.  The executor adds
 * to it while a profile is attached (mgc_exec_set_profile); the training loop
 * attaches it after the warm-up steps; mgc-run writes the profiles of all its
 * ranks as JSON lines (docs/runtime.md, "Profiling").
 *
 *     mgc_profile *p = NULL;
 *     if (mgc_profile_open(&p, plan, rank, "cpu", "cpu", err, sizeof err)) ...;
 *     mgc_exec_set_profile(x, p);                 // the steps that count
 *     ...
 *     mgc_profile_info info = {plan_path, warmup_steps};
 *     mgc_profile_write(f, &p, 1, &info);         // header, ops, instrs, step
 *     mgc_profile_free(p);
 *
 * A profile is written by one thread at a time: each rank owns its own. */
#ifndef MGC_PROFILE_H
#define MGC_PROFILE_H

#include <stdint.h>
#include <stdio.h>

#include "plan.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct mgc_profile mgc_profile;

/* One rank's empty profile, sized from its stage's program.  `backend` is the
 * backend's name ("cpu", "cuda"), `device` the device it runs on (NULL: the
 * backend's name).  0, or -1 with the reason in err. */
int mgc_profile_open(mgc_profile **out, const mgc_plan *plan, int64_t rank, const char *backend,
                     const char *device, char *err, size_t errsz);
void mgc_profile_free(mgc_profile *p); /* NULL is a no-op */

/* How the ops are timed, for the header's "op_timing": 1 "device" (the backend's timers,
 * backend.h time_mark), 0 "host" (a sync and the host's clock around each op; the default). */
void mgc_profile_set_device_timing(mgc_profile *p, int device);

/* Sums: op `index` of chunk `chunk`'s forward (pass 0) or backward (pass 1)
 * program; instruction `instr` of the stage's stream (grouped by op, chunk,
 * arg); a whole step.  Out-of-range indices are ignored. */
void mgc_profile_add_op(mgc_profile *p, int chunk, int pass, int64_t index, double seconds);
void mgc_profile_add_instr(mgc_profile *p, int64_t instr, double seconds);
void mgc_profile_add_step(mgc_profile *p, double seconds);

/* The device a backend runs on, for the header: the CUDA device's name, else
 * the backend's name ("cpu"). */
void mgc_profile_device_name(const char *backend, char *buf, size_t n);

typedef struct mgc_profile_info {
    const char *plan_path; /* as given on the command line */
    int64_t warmup_steps;  /* steps run before recording began */
} mgc_profile_info;

/* Writes the header line (from ranks[0]) and then every rank's op records,
 * every rank's instruction records and every rank's step record, in the
 * order given (format mgc-profile-1).  0, or -1 when a write failed (errno set). */
int mgc_profile_write(FILE *f, mgc_profile *const *ranks, int n, const mgc_profile_info *info);

#ifdef __cplusplus
}
#endif
#endif /* MGC_PROFILE_H */
