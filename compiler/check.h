/* check.h - derived defaults and the consistency rules of a configuration.
 *
 * The loader (config.c) checks each key on its own: its type, its range, its
 * spelling.  This module checks keys against each other, the way Megatron's
 * validate_args, TransformerConfig.__post_init__ and parallel_state asserts
 * do, but in one pass and in terms of the YAML: every problem becomes a
 * diagnostic at the key the user should change, with a concrete hint
 * ("choose parallel.tensor from 1, 2, 4, 8").  It never stops at the first
 * problem and never trusts a product not to overflow.
 *
 * It runs in three steps, all inside mgc_check_config():
 *   1. derived defaults: every MGC_KF_DERIVED key the user did not give is
 *      computed from the others (head_dim = hidden / heads, data = world /
 *      (tensor * context * pipeline), the batch triple, ...);
 *   2. rules: divisibility, ranges that depend on other keys, schedule
 *      constraints, keys that have no effect (warnings);
 *   3. c->derived: padded vocabulary, microbatches, expert data-parallel
 *      size, the MoE layer map and the pipeline stages in model order.
 *
 * docs/validation.md lists every rule with its rationale and the Megatron
 * check it corresponds to.
 *
 *     mgc_config_finalize(c, &diags);   // calls mgc_check_config(c, &diags)
 *     if (diags.errors == 0) use(c->derived.stages, c->derived.num_stages);
 */
#ifndef MGC_CHECK_H
#define MGC_CHECK_H

#include <stddef.h>
#include <stdint.h>

#include "config.h"
#include "diag.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Fill the derived defaults and c->derived, and run every consistency rule.
 * Expects a config whose keys all loaded (required keys present, values in
 * their schema ranges).  Appends errors and warnings to d.  c->derived is
 * meaningful only when no error was added; its arrays (is_moe_layer,
 * stages) are malloc'd and released by mgc_config_free.  Returns 0 when it
 * added no error. */
int mgc_check_config(mgc_config *c, mgc_diags *d);

/* What of a checked config mgc's CUDA kernels do not serve (codegen/kspec.h: the head dim, the
 * MoE router): MGC_KERNELS_SERVED (0) when they serve it all; else the first limit it passes,
 * and why in `why` (a sentence naming the key and value).  mgc check warns of it at the key;
 * mgc sweep counts such a variant infeasible ("no GPU kernels"), since every hardware profile
 * it predicts on is a GPU; mgc check --target makes it an error. */
typedef enum mgc_kernels_gap {
    MGC_KERNELS_SERVED = 0,
    MGC_KERNELS_HEAD_DIM, /* model.head_dim: not a multiple of 8 from 8 to 256 */
    MGC_KERNELS_EXPERTS,  /* moe.num_experts: more than 1024 */
    MGC_KERNELS_TOPK      /* moe.top_k: more than 64 */
} mgc_kernels_gap;
mgc_kernels_gap mgc_check_kernels_gap(const mgc_config *c, char *why, size_t n);

/* Megatron's vocabulary padding: vocab rounded up to a multiple of
 * divisor * tensor.  -1 when an argument is not positive or the result
 * would overflow. */
int64_t mgc_check_padded_vocab(int64_t vocab, int64_t divisor, int64_t tensor);

/* One string of parallel.pipeline_layout, parsed. */
typedef struct mgc_layout_stage {
    int64_t num_layers; /* decoder layers (`t` counts 1, `t*N` counts N) */
    int embedding_at;   /* byte offset of `E` in the string, -1 when absent */
    int loss_at;        /* byte offset of `L`, -1 when absent */
} mgc_layout_stage;

/* Parse one layout string: tokens `E`, `t`, `t*N`, `L`, separated by spaces
 * or nothing; `E` must open the stage and `L` close it.  Returns 0 and fills
 * out on success; on a grammar error returns -1, sets *err_at to the byte
 * offset of the problem and writes a message and a hint (either buffer may
 * be NULL). */
int mgc_check_parse_stage(const char *s, mgc_layout_stage *out, int *err_at, char *msg,
                          size_t msgsz, char *hint, size_t hintsz);

#ifdef __cplusplus
}
#endif
#endif /* MGC_CHECK_H */
