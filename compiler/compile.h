/* compile.h - the compile driver: checked config + IR -> execution plan.
 *
 *     config (checked) + IR --partition/autodiff--> chunks per pipeline rank
 *                          --schedule-----------> instruction streams (simulated)
 *                          --memplan------------> one arena per pipeline rank
 *                          = mgc_plan (plan/plan.h), validated, ready to write
 */
#ifndef MGC_COMPILE_H
#define MGC_COMPILE_H

#include "config.h"
#include "diag.h"
#include "ir.h"
#include "plan.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Build the plan for a finalized config and its IR.  Returns NULL and adds
 * diagnostics when any pass fails (e.g. the schedule simulator rejects the
 * streams).  The caller frees with mgc_plan_free. */
mgc_plan *mgc_compile(const mgc_config *c, const mgc_graph *g, mgc_diags *d);

/* Store every schema key of the resolved config in plan->config (lists as
 * indexed keys: "hardware.cuda_archs[0]", "data.paths[1].weight"). 0 on success. */
int mgc_compile_config_kv(const mgc_config *c, mgc_plan *plan);

#ifdef __cplusplus
}
#endif
#endif
