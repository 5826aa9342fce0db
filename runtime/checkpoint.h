/* checkpoint.h - saving and resuming training (docs/checkpoints.md).
 *
 * A checkpoint is one file, DIR/step-000000100.mgck: every parameter whole, as the
 * unpartitioned model has it (fp32 parameter, Adam m, Adam v), plus the state between steps
 * (mgc_exec_resume).  It does not depend on the layout that wrote it, so a run resumes under
 * any tensor, pipeline, data, expert or context layout of the same model, and the same
 * layout resumes bit for bit.
 *
 *     mgc_ckpt_save(plan, x, world, dir, step, keep, err, sizeof err);   // collective
 *     if (mgc_ckpt_latest(dir, path, sizeof path, &step, err, sizeof err) == 1)
 *         mgc_ckpt_load(plan, x, world, path, &r, err, sizeof err);      // collective
 *
 * Writing: rank 0 creates DIR/step-N.mgck.partial with its header and tensor table; every
 * rank writes the elements it owns (each element of the model has exactly one owner);
 * every rank reads back its share of the file (about 1/world of its bytes) for the CRC-32C
 * checksums, and rank 0, given all of them, completes the table, syncs the file and renames
 * it to DIR/step-N.mgck.  A crash leaves the last complete checkpoint as it was.  Reading:
 * every rank checks the header and table, and its share of the checksums, before any rank
 * reads a value. */
#ifndef MGC_CHECKPOINT_H
#define MGC_CHECKPOINT_H

#include <stddef.h>
#include <stdint.h>

#include "comm.h"
#include "exec.h"
#include "plan.h"

#ifdef __cplusplus
extern "C" {
#endif

#define MGC_CKPT_VERSION 1
#define MGC_CKPT_HEADER_BYTES 128

/* One tensor of a checkpoint (or of a plan's model). */
typedef struct mgc_ckpt_tensor {
    char *name;
    int rank;
    int vocab;        /* rows are vocabulary entries: the padding rows may differ */
    int64_t dim[4];   /* global (unpartitioned) shape */
    uint64_t numel;
    uint64_t offset;  /* bytes from the data section's start: param, then m, then v */
    uint32_t crc[3];  /* CRC-32C of each array */
} mgc_ckpt_tensor;

typedef struct mgc_ckpt_model {
    int64_t n;
    mgc_ckpt_tensor *t; /* (n) sorted by name */
} mgc_ckpt_model;

/* The plan's model: every parameter of every stage once, with its global shape.  0, or -1
 * with err. */
int mgc_ckpt_model_of(const mgc_plan *plan, mgc_ckpt_model *out, char *err, size_t errsz);
void mgc_ckpt_model_free(mgc_ckpt_model *m);

/* Creates dir (and its parents) when missing and checks that it is a writable directory.  0,
 * or -1 with err naming it. */
int mgc_ckpt_prepare_dir(const char *dir, char *err, size_t errsz);
/* The newest complete checkpoint in dir: 1 (path and its step filled), 0 none (dir missing or
 * without checkpoints), -1 with err. */
int mgc_ckpt_latest(const char *dir, char *path, size_t pathsz, int64_t *step, char *err, size_t errsz);

/* Saves x after `completed` steps as dir/step-<completed>.mgck, then removes all but the
 * newest `keep` checkpoints of dir (0 keeps all).  Collective over world; 0 on every rank, or
 * -1 on every rank with err. */
int mgc_ckpt_save(const mgc_plan *plan, mgc_exec *x, mgc_comm *world, const char *dir,
                  int64_t completed, int64_t keep, char *err, size_t errsz);
/* An asynchronous save (checkpoint.async_save, mgc-run --async-save).  mgc_ckpt_save_async
 * is collective: rank 0 creates the partial file as mgc_ckpt_save does, and every rank copies
 * the values it owns into host memory (12 bytes a parameter of its share) and starts a thread
 * of its own that writes them into the file and syncs it.  The thread never communicates.
 * mgc_ckpt_async_poll, collective too and called at the same point by every rank (after each
 * step), advances it with one all-reduce: once every rank has written, each rank's thread
 * checksums its share of the file; once all have, the checksums are gathered (one
 * all-gather) and rank 0's thread completes, syncs and renames the file and prunes the
 * directory as mgc_ckpt_save does.
 * The file is byte for byte the one mgc_ckpt_save writes, and a crash at any point leaves the
 * complete checkpoints as they were. */
typedef struct mgc_ckpt_async mgc_ckpt_async;
/* Begins a save of x after `completed` steps; *out is the save in flight.  0 on every rank, or
 * -1 on every rank with err (nothing left behind). */
int mgc_ckpt_save_async(const mgc_plan *plan, mgc_exec *x, mgc_comm *world, const char *dir,
                        int64_t completed, int64_t keep, mgc_ckpt_async **out, char *err, size_t errsz);
/* wait 0: 1 while the save is in flight, 0 once the file is complete (and *a freed, set NULL),
 * -1 on every rank with the lowest failing rank's err (the partial file removed, *a freed).
 * wait 1: blocks until 0 or -1.  *a NULL: 0. */
int mgc_ckpt_async_poll(mgc_ckpt_async **a, mgc_comm *world, int wait, char *err, size_t errsz);
int64_t mgc_ckpt_async_step(const mgc_ckpt_async *a);    /* the step it saves */
double mgc_ckpt_async_seconds(const mgc_ckpt_async *a);  /* since it began */
/* A failing run's way out: joins the thread and frees a, without communicating (the partial
 * file stays, and the next save in the directory removes it).  NULL: no-op. */
void mgc_ckpt_async_abandon(mgc_ckpt_async *a);

/* Loads path into x (in place of mgc_exec_init_params) and fills *r (then
 * mgc_exec_set_resume).  params_only: the parameters alone, Adam's moments zero (a run that
 * starts from a checkpoint's model: mgc-run --init-from); r is then not filled.  Collective;
 * refuses a damaged file or another model's with err. */
int mgc_ckpt_load(const mgc_plan *plan, mgc_exec *x, mgc_comm *world, const char *path,
                  int params_only, mgc_exec_resume *r, char *err, size_t errsz);

/* Writes a checkpoint of the plan's model to path (never over an existing file) from whole
 * tensors: fill(ctx, t, v, err, errsz) puts tensor t's values (t->numel floats, its global
 * shape) into v, or returns -1 with err.  Step 0, Adam's moments zero: a starting point for
 * mgc-run --init-from (mgc-import writes one).  0, or -1 with err. */
typedef int (*mgc_ckpt_fill_fn)(void *ctx, const mgc_ckpt_tensor *t, float *v, char *err, size_t errsz);
int mgc_ckpt_write_model(const mgc_plan *plan, const char *path, mgc_ckpt_fill_fn fill, void *ctx,
                         char *err, size_t errsz);

/* A checkpoint's header and table, checked (no data checksums: mgc_ckpt_verify).  For
 * tools and tests.  0, or -1 with err. */
typedef struct mgc_ckpt_info {
    mgc_exec_resume resume;
    int64_t global_batch, seq_length, seed, vocab_size;
    uint64_t data_offset, file_bytes;
    mgc_ckpt_model model;
} mgc_ckpt_info;
int mgc_ckpt_read_info(const char *path, mgc_ckpt_info *info, char *err, size_t errsz);
void mgc_ckpt_info_free(mgc_ckpt_info *info);
/* Every array's checksum.  0, or -1 with err naming the first tensor that differs. */
int mgc_ckpt_verify(const char *path, const mgc_ckpt_info *info, char *err, size_t errsz);

#ifdef __cplusplus
}
#endif
#endif /* MGC_CHECKPOINT_H */
