/* testplan.h - compiling a model file into a plan inside a test (the tests that train or
 * replay plans; they link the compiler).
 *
 *     static const char *const sets[] = {"parallel.tensor=2", "parallel.world_size=2", NULL};
 *     mgc_plan *p = t_compile("examples/tiny-gpt.yaml", (const char *const *[]){common, sets}, 2);
 *
 * Each list is a NULL-terminated array of --set overrides (a NULL list is skipped), applied in
 * order; on failure the diagnostics go to stderr and NULL comes back. */
#ifndef MGC_TESTPLAN_H
#define MGC_TESTPLAN_H

#include <stdio.h>

#include "compile.h"
#include "config.h"
#include "diag.h"
#include "ir.h"
#include "plan.h"

static inline mgc_plan *t_compile(const char *path, const char *const *const *lists, int n) {
    mgc_diags d;
    mgc_diags_init(&d);
    mgc_config *c = mgc_config_new();
    mgc_config_load_file(c, path, &d);
    for (int l = 0; l < n; l++)
        for (int i = 0; lists[l] && lists[l][i]; i++)
            mgc_config_set(c, lists[l][i], "--set", &d);
    if (d.errors == 0) mgc_config_finalize(c, &d);
    mgc_graph *g = d.errors == 0 ? mgc_ir_build(c, &d) : NULL;
    mgc_plan *p = g ? mgc_compile(c, g, &d) : NULL;
    if (!p) {
        fprintf(stderr, "%s: cannot compile with", path);
        for (int l = 0; l < n; l++)
            for (int i = 0; lists[l] && lists[l][i]; i++)
                fprintf(stderr, " --set %s", lists[l][i]);
        fputc('\n', stderr);
        mgc_diags_print(&d, stderr);
    }
    mgc_ir_free(g);
    mgc_config_free(c);
    mgc_diags_free(&d);
    return p;
}

#endif /* MGC_TESTPLAN_H */
