/* sweep.h - the `mgc sweep` subcommand: rank layout/architecture variants of
 * one model by predicted throughput.
 *
 *   mgc sweep BASE.yaml --vary KEY=V1,V2,... [--vary ...] [--set KEY=V]...
 *             [--world-size N] [--hardware NAME] [--headroom PCT] [--top K]
 *             [-j N] [-q] [--csv FILE] [--json FILE] [--plot FILE.svg]
 *
 * Every point of the cartesian product of the --vary lists is a variant: the
 * base YAML with the --set overrides, --world-size and the variant's values
 * applied (as `--set` would), finalized, compiled in-process (compile.h) and
 * costed (cost.h).  Variants that do not check, do not compile or whose
 * largest arena does not fit in (1 - headroom) of the device memory are
 * infeasible, with the reason; the rest are ranked by predicted tokens/s.
 * Worker threads share nothing mutable but an atomic counter of variant
 * indices; results land in per-variant slots, so the output is the same for
 * any -j.
 *
 * argv holds the words after "sweep".  Returns the exit status: 0 at least one
 * variant is feasible, 1 none is (or an output file cannot be written), 2 bad
 * usage.  docs/sweep.md is the manual. */
#ifndef MGC_SWEEP_H
#define MGC_SWEEP_H

#ifdef __cplusplus
extern "C" {
#endif

int mgc_cmd_sweep(int argc, char **argv);

#ifdef __cplusplus
}
#endif

#endif /* MGC_SWEEP_H */
