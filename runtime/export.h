/* export.h - a checkpoint's model as a safetensors file (docs/checkpoints.md, "Exporting").
 *
 *     mgc_export(plan, "runs/a/step-000000200.mgck", "out/", MGC_EXPORT_HF, MGC_DT_BF16,
 *                err, sizeof err);
 *
 * MGC_EXPORT_HF writes DIR/model.safetensors and DIR/config.json as Hugging Face
 * transformers reads them (GPT2LMHeadModel for GPT-2-style models, LlamaForCausalLM for
 * LLaMA-style ones, MixtralForCausalLM for LLaMA-style mixtures of experts without shared
 * experts): the fused QKV split into q, k and v (or reordered into GPT-2's c_attn), fc1's
 * [gate | up] halves split (per expert), GPT-2's Conv1D weights transposed, the vocabulary
 * padding left out.  MGC_EXPORT_MGC writes every parameter whole under mgc's own names (any model,
 * MoE included), with the vocabulary padding left out.  The checkpoint is checked (every
 * checksum) and matched against the plan's model first; the files are written beside their
 * final names and renamed, and existing files are never replaced. */
#ifndef MGC_EXPORT_H
#define MGC_EXPORT_H

#include <stddef.h>

#include "plan.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum mgc_export_format { MGC_EXPORT_HF = 0, MGC_EXPORT_MGC = 1 } mgc_export_format;

/* dtype: MGC_DT_F32, MGC_DT_BF16 or MGC_DT_F16 (rounded to nearest even from the fp32 master
 * weights).  0, or -1 with err naming the file, the problem and the fix. */
int mgc_export(const mgc_plan *plan, const char *ckpt, const char *dir, mgc_export_format fmt,
               int dtype, char *err, size_t errsz);

/* The inverse: a Hugging Face model directory (config.json and model.safetensors, fp32, fp16 or
 * bf16) of the plan's architecture and sizes as a new checkpoint at ckpt (step 0, Adam's moments
 * zero; never over an existing file), for mgc-run --init-from.  config.json must agree with the
 * plan (model type, heads, key/value heads, norm epsilon, rotary base or layers, tying), every
 * tensor's shape with the plan's model, and every tensor must have a place in it.  0, or -1
 * with err. */
int mgc_import(const mgc_plan *plan, const char *dir, const char *ckpt, char *err, size_t errsz);

#ifdef __cplusplus
}
#endif
#endif /* MGC_EXPORT_H */
