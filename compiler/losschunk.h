/* losschunk.h - the output layer and cross-entropy in row chunks (docs/partitioning.md,
 * "Loss chunks").
 *
 * Unchunked, the loss chunk's forward ends with the output layer's GEMM, whose logits
 * [s_c, b, V_l] (fp32 unless training.logits_dtype is compute) are stashed until the backward
 * starts with the cross-entropy backward and the output layer's dgrad and wgrad.  At GPT-2's vocabulary the logits are the largest tensor of
 * the step (3 GiB at micro batch 16, sequence 1024).  Chunked in k, the whole head moves to
 * the start of the backward pass:
 *
 *   count:  loss_count = (0, sum of the loss mask)   [all-reduced over CP]
 *   for each row chunk c of s_c / k sequence positions:
 *       logits_c = h_c W^T ; the cross-entropy phases on logits_c (with their TP
 *       all-reduces) -> lse_c, loss_c ; loss sum += loss_c ;
 *       dlogits_c = ce_bwd(logits_c, ..., loss_count)  (in place over logits_c) ;
 *       dh_c = dlogits_c W ; dW += dlogits_c^T h_c
 *   loss = the loss sum   [all-reduced over CP]
 *
 * h_c, dh_c, labels_c and mask_c are row views (plan.h tensor.view) of the whole tensors; each
 * chunk's logits are a pass tensor that the next chunk's reuse, so one chunk's logits exist
 * at a time.  The gradients are the unchunked ones row for row (the cross-entropy's scale is
 * the whole microbatch's mask count, computed first); only the summation order of the
 * weight gradient over rows and of the loss sum changes.  Forward-kind ops in the backward
 * carry MGC_POF_RECOMPUTE, as recompute copies do.
 *
 * At tensor parallel 1 the cross-entropy is one op (phase 3, no collectives), and each chunk's
 * cross_entropy_bwd takes it in (plan.h MGC_POF_CE_STATS: one pass over the chunk's logits on
 * a GPU); MGC_CE_FUSE=0 in the environment keeps the two ops (tests compare them). */
#ifndef MGC_LOSSCHUNK_H
#define MGC_LOSSCHUNK_H

#include <stdint.h>

#include "config.h"
#include "plan.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Rows of a chunk must be a multiple of this (so every view starts 256-byte aligned: each
 * row of every viewed tensor is a multiple of 4 bytes). */
#define MGC_LOSS_CHUNK_ROWS 64

/* Auto (training.loss_chunks 0) keeps each chunk's logits (fp32, or 16-bit with
 * training.logits_dtype compute) at most this many bytes. */
#define MGC_LOSS_CHUNK_AUTO_BYTES (1ull << 30)

/* 1 when k chunks fit the loss chunk's rows: k divides s_c = seq_length / context and each
 * chunk's s_c / k x micro_batch_size rows are a multiple of MGC_LOSS_CHUNK_ROWS; k = 1 always
 * fits. */
int mgc_loss_chunks_fit(const mgc_config *c, int64_t k);

/* training.loss_chunks resolved: the value given, or for 0 the fewest fitting chunks whose
 * logits are at most MGC_LOSS_CHUNK_AUTO_BYTES (the most fitting chunks when none
 * are, 1 when none but 1 fits).  MGC_LOSS_CHUNKS=1 in the environment forces 1
 * (debugging, tests). */
int64_t mgc_loss_chunks(const mgc_config *c);

/* Rewrite a loss chunk's programs into k row chunks (above).  Call after partitioning and
 * before fusion; k <= 1 or a chunk without the loss: nothing.  Tensors the forward no longer
 * writes stay in the list unreferenced (the memory plan gives them no buffer); the stash is
 * packed again without them.  0 on success, -1 out of memory or a program this pass does not
 * recognise (then the chunk is unchanged). */
int mgc_loss_chunk(mgc_plan *p, mgc_plan_chunk *ch, int64_t k);

#ifdef __cplusplus
}
#endif
#endif /* MGC_LOSSCHUNK_H */
