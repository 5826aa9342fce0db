/* hwprofile.h - hardware profiles: what a GPU, its node and its network can do.
 *
 * A profile is a small YAML file (the files in hardware/, docs/cost-model.md has the
 * format): dense peaks per precision, memory size and bandwidth, NVLink and
 * network bandwidth and latency, GPUs per node, power, and the efficiency
 * factors that say what fraction of each peak real kernels reach (the ones
 * `mgc calibrate` fits).  The profiles in hardware/ are built into mgc; users
 * add their own as files, found by name in the directories of
 * MGC_HARDWARE_PATH (colon-separated) before the built-in ones, or given as a
 * path ("./my-gpu.yaml": any name with a '/' or ending in .yaml is a file).
 *
 *     mgc_hw hw;
 *     mgc_diags d; mgc_diags_init(&d);
 *     if (mgc_hw_load("h100-sxm", &hw, &d) == 0)
 *         printf("%.1f TFLOP/s\n", hw.peak_flops[MGC_PREC_BF16] / 1e12);
 *
 * Units inside the struct are SI: FLOP/s, bytes, bytes/s, seconds, watts. */
#ifndef MGC_HWPROFILE_H
#define MGC_HWPROFILE_H

#include <stdint.h>
#include <stdio.h>

#include "diag.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct mgc_hw_eff {
    double gemm;          /* an 8192^3 GEMM's rate / peak, in (0, 1] */
    double gemm_k_half;   /* reduction depth K at which a GEMM runs at half rate (> 0) */
    double memory;        /* memory-bound kernels: bytes moved per second / HBM bandwidth */
    double attention_fwd; /* flash attention forward: FLOP/s / peak */
    double attention_bwd; /* flash attention backward: FLOP/s / peak */
    double nvlink;        /* collectives inside a node: bus bandwidth / NVLink bandwidth */
    double network;       /* collectives across nodes: bus bandwidth / network bandwidth */
} mgc_hw_eff;

typedef struct mgc_hw {
    char name[64];             /* "h100-sxm" */
    char description[160];     /* one line */
    char source[512];          /* the file it was read from, or "built-in:h100-sxm.yaml" */
    double peak_flops[3];      /* dense FLOP/s by mgc_precision (FP32, BF16, FP16) */
    double memory_bytes;       /* device memory one rank can use */
    double memory_bw;          /* HBM bytes/s */
    int64_t sms;               /* streaming multiprocessors (GEMM wave quantisation) */
    double power_w;            /* board power while training */
    double launch_s;           /* fixed cost of one kernel or collective launch */
    int64_t gpus_per_node;     /* GPUs that share NVLink */
    double nvlink_bw;          /* per GPU per direction, bytes/s */
    double nvlink_latency_s;   /* per hop */
    double net_bw;             /* per GPU per direction across nodes, bytes/s */
    double net_latency_s;      /* per hop */
    mgc_hw_eff eff;            /* efficiency factors */
} mgc_hw;

/* Parse a profile from YAML text; `file` names it in diagnostics (every
 * unknown key, missing key and out-of-range value is reported, file:line:col).
 * 0 when it is valid. */
int mgc_hw_parse(const char *file, const char *text, size_t len, mgc_hw *out, mgc_diags *d);

/* Find and parse a profile by name or path (see above); `at` is where a
 * "no such profile" diagnostic points (e.g. the config's hardware.gpu).  0 ok. */
int mgc_hw_load_at(const char *name_or_path, mgc_loc at, mgc_hw *out, mgc_diags *d);
int mgc_hw_load(const char *name_or_path, mgc_hw *out, mgc_diags *d);

/* The built-in profile names ("h100-sxm"): the first min(count, max) are
 * written to names; returns the count. */
int mgc_hw_builtin_names(char (*names)[64], int max);

/* Write the profile as YAML that mgc_hw_parse reads back (mgc calibrate's
 * output).  `comment` (may be NULL) goes on top, each line prefixed "# ".
 * 0 ok, -1 on a write error. */
int mgc_hw_write_yaml(const mgc_hw *hw, const char *comment, FILE *out);

#ifdef __cplusplus
}
#endif
#endif /* MGC_HWPROFILE_H */
