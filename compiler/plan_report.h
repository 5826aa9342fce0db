/* plan_report.h - human and JSON reports of a plan (`mgc compile`, `mgc inspect`).
 * Everything here reads an mgc_plan only, so `mgc inspect` explains a plan file
 * without the config that produced it. */
#ifndef MGC_PLAN_REPORT_H
#define MGC_PLAN_REPORT_H

#include <stdio.h>

#include "json.h"
#include "plan.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Grid, groups, schedule, per-stage table (layers, instructions, ops,
 * stash per microbatch, in flight, arena bytes). */
void mgc_plan_print_summary(const mgc_plan *p, FILE *out);
/* Per-stage arena breakdown by buffer kind and the largest buffers. */
void mgc_plan_print_memory(const mgc_plan *p, FILE *out);
/* The same as JSON members written into an open object; `memory` adds the
 * per-stage buffer lists. */
void mgc_plan_print_json(const mgc_plan *p, mgc_json *j, int memory);

/* Look up a config value the compiler stored (0 when absent). */

#ifdef __cplusplus
}
#endif
#endif
