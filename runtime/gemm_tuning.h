/* gemm_tuning.h - the GEMM tuning file: which of cuBLASLt's candidate algorithms each GEMM
 * shape of a run uses (docs/cuda-backend.md, "GEMM tuning").
 *
 * cuBLASLt's heuristic ranks its algorithms for a GEMM by an estimate; its first choice is
 * not always the fastest.  Timing the candidates at every start would pick by noise, and two
 * runs could then round differently.  So the choice is recorded once, on the GPU, and read
 * back by later runs, which then use the same algorithms and give the same bits:
 *
 *     MGC_GEMM_TUNE=t.txt mgc-run PLAN --iterations 1     # time the candidates, write t.txt
 *     MGC_GEMM_TUNING=t.txt mgc-run PLAN                  # use them
 *
 * The file is text, one GEMM shape a line, valid for one GPU model, one cuBLASLt version and
 * one workspace size (the heuristic's list depends on all three; a file made under others is
 * ignored with a warning).  This module reads and writes it; it needs no GPU (the CUDA
 * backend times the candidates).
 *
 *     mgc-gemm-tuning 1
 *     device NVIDIA H200
 *     cublaslt 130100
 *     workspace 33554432
 *     gemm 0 1 2304 8192 768 768 768 2304 0 14 14 14 2 1 14 0 0 0 pick 3 of 8 us 41.2 40.1 ...
 *
 * A gemm line is the key's 18 numbers in mgc_gemm_key's order, then the candidate used
 * (0-based, in the heuristic's order), how many there were, and each one's time in
 * microseconds (a failed candidate: -1). */
#ifndef MGC_GEMM_TUNING_H
#define MGC_GEMM_TUNING_H

#include <stddef.h>
#include <stdint.h>

#define MGC_GEMM_TUNING_VERSION 1
#define MGC_GEMM_TUNING_MAX_CAND 8 /* candidates asked of the heuristic and timed */

/* A GEMM as the CUDA backend caches it: transposes, sizes, leading dimensions, and the
 * cuBLASLt data types and epilogue as their enum values. */
typedef struct mgc_gemm_key {
    int ta, tb;
    int64_t m, n, k, lda, ldb, ldc, aux_ld;
    int atype, btype, ctype, epilogue, has_bias, biastype, has_aux, auxtype, beta1;
} mgc_gemm_key;

typedef struct mgc_gemm_tuned {
    mgc_gemm_key key;
    int pick, n;                             /* the candidate used, of n */
    float us[MGC_GEMM_TUNING_MAX_CAND];      /* each one's time; -1: it failed */
} mgc_gemm_tuned;

typedef struct mgc_gemm_tuning {
    char device[128];
    long cublaslt;       /* cublasLtGetVersion() */
    uint64_t workspace;  /* the workspace bytes the heuristic was given */
    mgc_gemm_tuned *e;
    int64_t n, cap;
} mgc_gemm_tuning;

/* An empty table for this device, library version and workspace; NULL when out of memory. */
mgc_gemm_tuning *mgc_gemm_tuning_new(const char *device, long cublaslt, uint64_t workspace);
void mgc_gemm_tuning_free(mgc_gemm_tuning *t);

/* Reads `path`.  0 with *out, or -1 with a message naming the file, the line and what is
 * wrong (unreadable, not a tuning file, a malformed or duplicate line).  The table keeps the
 * file's device, version and workspace: mgc_gemm_tuning_matches says whether they are this
 * run's. */
int mgc_gemm_tuning_load(const char *path, mgc_gemm_tuning **out, char *err, size_t errsz);

/* 1 when t was made for this device, library version and workspace; else 0 with what
 * differs in why (for the warning). */
int mgc_gemm_tuning_matches(const mgc_gemm_tuning *t, const char *device, long cublaslt,
                            uint64_t workspace, char *why, size_t whysz);

/* The entry for key k, or NULL. */
const mgc_gemm_tuned *mgc_gemm_tuning_find(const mgc_gemm_tuning *t, const mgc_gemm_key *k);

/* Adds (or replaces) key k's entry: candidate `pick` of n, their times us[0..n).  0, or -1
 * when out of memory or the numbers are out of range. */
int mgc_gemm_tuning_put(mgc_gemm_tuning *t, const mgc_gemm_key *k, int pick, int n,
                        const float *us);

/* The candidate to use from their times us[0..n) (-1: failed): the fastest, unless it is
 * within 2% of the heuristic's first choice (candidate 0), which is then kept, so that timing
 * noise does not move a GEMM to another algorithm for nothing; 0 when all failed. */
int mgc_gemm_tuning_choose(const float *us, int n);

/* Writes t to `path` atomically (a temporary file beside it, then rename): 0, or -1 with the
 * message; `path` is untouched on failure. */
int mgc_gemm_tuning_save(const mgc_gemm_tuning *t, const char *path, char *err, size_t errsz);

#endif /* MGC_GEMM_TUNING_H */
