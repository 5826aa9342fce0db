/* fusion.h - fusions over a chunk's op programs, after partitioning and
 * autodiff and before the memory plan (docs/partitioning.md#fusions).
 *
 * A fusion replaces adjacent ops by one op that the CPU reference computes
 * exactly as the ops it replaces (so every layout still computes the same
 * function, bit for bit in fp32) and that a GPU kernel runs in one pass:
 *
 *   norm_bwd (dx1 = d norm) ; add_bwd (dx = g + dx1)
 *     -> norm_bwd with the residual gradient g as a 4th input: dx = d norm + g
 *        (the residual stream's gradient is accumulated in the norm's backward
 *        kernel instead of re-read and re-written by an add)
 *   dropout_add (h = residual + dropout(branch)) ; norm (y = norm(h))
 *     -> add_norm: h and y in one pass over the row (the forward programs;
 *        recompute copies in the backward stay unfused)
 *   linear (h = x W^T + b) ; gelu (y = gelu(h))
 *     -> linear_gelu: (y, h) from one GEMM (cuBLASLt's GELU_AUX epilogue), forward programs
 *   linear_dgrad (dg = dy W) ... gelu_bwd (dh = gelu'(h) dg)
 *     -> linear_dgrad_gelu: dh from one GEMM (cuBLASLt's DGELU epilogue, h as its aux input)
 *   qkv_split (q, k, v = split(qkv)) ; attention (q, k, v),  and in the backward
 *   attention_bwd -> (dq, dk, dv) ... qkv_split_bwd (dqkv = join(dq, dk, dv))
 *     -> attention and attention_bwd with MGC_POF_QKV: q, k, v read in place from qkv and
 *        their gradients written in place into dqkv (no split copy either way; qkv is
 *        stashed instead of q, k, v, in their slot)
 *   norm_bwd (.. -> dx) ... linear_wgrad (dx, x -> dW, dbias)
 *     -> norm_bwd with MGC_POF_COLSUM (.. -> dx, .., dbias) and linear_wgrad (dx, x -> dW): the
 *        bias gradient (dx's column sums) summed by the norm's kernel as it writes dx, not by a
 *        pass over dx after the GEMM
 *   norm_bwd (.. -> dx) ... dropout_add_bwd (dx, mask -> dbr)  (or the embedding's
 *   dropout_bwd (dx, mask -> de))
 *     -> norm_bwd with MGC_POF_DROPBWD (.., mask -> dx, .., dbr): the residual branch's
 *        dropout backward written from dx as the norm's kernel stores it (then the branch's
 *        bias gradient may follow it in, as above, summing dbr)
 *   embedding (-> e) [; dropout (e -> x, mask)] ; norm (x -> y)
 *     -> embedding_norm (-> x, y [, mask]): the rows looked up, dropped out and normalised in
 *        one pass (e no longer written)
 *   qkv_split (q, k, v = split(qkv)) ; rope (q) ; rope (k),  and in the backward
 *   rope_bwd (dq') ; rope_bwd (dk') ... qkv_split_bwd (dqkv = join(dq, dk, dv))
 *     -> qkv_split and qkv_split_bwd with MGC_POF_ROPE: q and k rotated as they leave the
 *        split, their gradients rotated back as they join (recompute copies too)
 *   attention_bwd (.. -> dqkv, MGC_POF_QKV) ... linear_wgrad (dqkv, x -> dW, dbias)
 *     -> attention_bwd with MGC_POF_COLSUM (.. -> dqkv, dbias) and linear_wgrad (dqkv, x ->
 *        dW): the QKV projection's bias gradient summed by the attention's backward kernels as
 *        they write dqkv, not by a pass over dqkv after the GEMM
 *   linear_dgrad_gelu (dy, W, h -> dh) ... linear_wgrad (dh, x -> dW, dbias)
 *     -> linear_dgrad_gelu with MGC_POF_COLSUM (dy, W, h -> dh, dbias) and linear_wgrad (dh, x
 *        -> dW): the MLP's first bias gradient summed as the GEMM writes dh (cuBLASLt's
 *        DGELU_BGRAD epilogue), not by a pass over dh after the weight gradient's GEMM
 */
#ifndef MGC_FUSION_H
#define MGC_FUSION_H

#include <stdint.h>

#include "plan.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct mgc_fusion_stats {
    int64_t norm_bwd_add; /* norm_bwd + add_bwd pairs fused */
    int64_t add_norm;     /* dropout_add + norm pairs fused */
    int64_t linear_gelu;  /* linear + gelu pairs fused */
    int64_t dgrad_gelu;   /* linear_dgrad + gelu_bwd pairs fused */
    int64_t qkv_attention; /* qkv_split + attention (and their backwards) fused */
    int64_t qkv_rope;      /* qkv_split + its two ropes, and qkv_split_bwd + its rope_bwds */
    int64_t norm_bwd_bias; /* linear bias gradients moved into the norm_bwd writing their dy */
    int64_t embedding_norm; /* embedding (+ dropout) + norm fused (the first layer's norm) */
    int64_t norm_bwd_drop;  /* dropout_add_bwd or dropout_bwd moved into the norm_bwd writing
                               its input */
    int64_t attention_bwd_bias; /* the QKV projection's bias gradient moved into attention_bwd */
    int64_t dgrad_gelu_bias; /* the MLP's first bias gradient moved into linear_dgrad_gelu */
} mgc_fusion_stats;

/* The fusions, as bits of the set to make (named as the fields of mgc_fusion_stats). */
enum {
    MGC_FUSE_NORM_BWD_ADD = 1u << 0,
    MGC_FUSE_ADD_NORM = 1u << 1,
    MGC_FUSE_LINEAR_GELU = 1u << 2,
    MGC_FUSE_DGRAD_GELU = 1u << 3,
    MGC_FUSE_QKV_ATTENTION = 1u << 4,
    MGC_FUSE_QKV_ROPE = 1u << 5,
    MGC_FUSE_NORM_BWD_BIAS = 1u << 6,
    MGC_FUSE_EMBEDDING_NORM = 1u << 7,
    MGC_FUSE_NORM_BWD_DROP = 1u << 8,
    MGC_FUSE_ATTENTION_BWD_BIAS = 1u << 9,
    MGC_FUSE_DGRAD_GELU_BIAS = 1u << 10,
    MGC_FUSE_ALL = (1u << 11) - 1
};

/* The set MGC_FUSION names (docs/partitioning.md#fusions): NULL, "" or "1" all of them, "0"
 * none, else a comma-separated list of names, each making that fusion or, with a leading
 * '-', leaving it out of all of them (a list of only '-' names starts from all).  0, or -1
 * with *bad pointing at the first name not known (its length in *bad_len). */
int mgc_fusion_parse(const char *spec, unsigned *which, const char **bad, size_t *bad_len);

/* Fuse in place what can be fused in one chunk, of the fusions in `which`; counts added to
 * *st (may be NULL).  Tensors whose only reader went away stay in the chunk's list,
 * unreferenced (the memory plan gives them no buffer).  Never fails. */
void mgc_fuse_chunk(mgc_plan_chunk *ch, unsigned which, mgc_fusion_stats *st);

#ifdef __cplusplus
}
#endif
#endif /* MGC_FUSION_H */
