/* facts.h - the numbers `mgc info` prints about a model: parameter counts
 * and FLOPs per iteration.  No timing, nothing that depends on hardware.
 *
 * Parameter counts are sums over the IR's parameter tensors; FLOPs are sums
 * over the IR's ops (GEMMs only), scaled to the global batch.  The closed
 * forms of Narayanan et al. 2021 / pre-2025 Megatron-LM are computed from the
 * shapes alongside, for comparison with published numbers.  Every field, its
 * formula and its JSON name are documented in docs/facts.md: that page and
 * the JSON names are a stable interface.
 *
 *     mgc_graph *g = mgc_ir_build(cfg, &diags);
 *     mgc_facts f;
 *     if (g && mgc_facts_compute(cfg, g, &f, &diags) == 0)
 *         mgc_facts_print_text(cfg, &f, stdout);
 */
#ifndef MGC_FACTS_H
#define MGC_FACTS_H

#include <stdint.h>
#include <stdio.h>

#include "config.h"
#include "diag.h"
#include "ir.h"
#include "json.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct mgc_param_counts {
    uint64_t total; /* every weight and bias, vocabulary UNPADDED: the published convention */
    uint64_t total_padded; /* as allocated, padded vocabulary */
    uint64_t
        embedding; /* word embedding + learned position table + untied output layer (unpadded) */
    uint64_t non_embedding; /* total - embedding */
    uint64_t
        active; /* used per token: routed experts count top_k of num_experts (= total for dense) */
    uint64_t active_non_embedding;           /* active - embedding */
    uint64_t by_class[MGC_IR_PCLASS__COUNT]; /* unpadded, indexed by mgc_ir_pclass (NONE stays 0) */
    uint64_t dense_layer;                    /* one dense decoder layer; 0 when there is none */
    uint64_t moe_layer;        /* one MoE decoder layer, all experts; 0 when there is none */
    uint64_t moe_layer_active; /* one MoE decoder layer, top_k experts */
    int64_t tensors;           /* parameter tensors */
} mgc_param_counts;

typedef struct mgc_flop_counts {
    /* one microbatch (b sequences of s tokens), forward, exact */
    uint64_t forward_per_microbatch;        /* GEMM FLOPs as executed (capacity padding included) */
    uint64_t model_forward_per_microbatch;  /* by the model convention (routed rows = T*k) */
    uint64_t router_forward_per_microbatch; /* router GEMMs (in both of the above) */
    uint64_t recompute_forward_per_microbatch; /* forward FLOPs re-run in backward
                                                  (training.recompute) */
    int64_t recomputed_layers; /* decoder layers full recompute re-runs (its method picks them) */
    /* one iteration (global batch of B sequences) */
    double microbatches;           /* B / b: microbatch-equivalents per iteration */
    double model_per_iteration;    /* 3 * model_forward_per_microbatch * microbatches */
    double hardware_per_iteration; /* (3 * forward + recompute) per microbatch * microbatches */
    double
        router_per_iteration; /* 3 * router forward * microbatches; Megatron's formula omits it */
    double
        narayanan2021_per_iteration; /* 12 B s h^2 [...] pre-2025 Megatron-LM / Narayanan eq. 3 */
    double narayanan2021_full_recompute_per_iteration; /* 4/3 of it (96 instead of 72) */
    double model_per_token;    /* model_per_iteration / tokens_per_iteration */
    double hardware_per_token; /* hardware_per_iteration / tokens_per_iteration */
} mgc_flop_counts;

typedef struct mgc_facts {
    mgc_param_counts params;        /* parameter counts */
    mgc_flop_counts flops;          /* FLOPs */
    int64_t vocab_size;             /* V */
    int64_t padded_vocab_size;      /* V_pad */
    int64_t num_layers;             /* L */
    int64_t num_moe_layers;         /* L_moe */
    uint64_t tokens_per_microbatch; /* T = s * b */
    uint64_t tokens_per_iteration;  /* B * s */
    int gpt_style; /* dense, MHA, GELU, f = 4h, q = h: Narayanan eq. 3 applies as printed */
} mgc_facts;

/* Fill f from a finalized config and the graph built from it.  0 ok; -1
 * with a diagnostic on overflow or a missing graph. */
int mgc_facts_compute(const mgc_config *c, const mgc_graph *g, mgc_facts *f, mgc_diags *d);

/* A short human-readable report (`mgc info`). */
void mgc_facts_print_text(const mgc_config *c, const mgc_facts *f, FILE *out);

/* Write the facts as members of an already-open JSON object (`mgc info --json`). */
void mgc_facts_print_json(const mgc_config *c, const mgc_facts *f, mgc_json *j);

/* The closed form of Narayanan et al. 2021 eq. 3, generalised as pre-2025
 * Megatron-LM did (GQA, SwiGLU, MoE top-k, shared experts), per layer kind:
 *   12 B s h^2 [ L (1 + g/a + s/h) q/h + sum_l (f_l/h) k_l phi + L_moe (f_s/h) phi + V_pad/(2h) ]
 * with phi = 1.5 for SwiGLU else 1, f_l k_l = f for dense layers and f_e k for
 * MoE layers.  For GPT-style models it equals 72 B s L h^2 (1 + s/6h + V/12hL).
 * B is the global batch in sequences. */
double mgc_facts_narayanan2021(const mgc_ir_dims *dm, int swiglu, double B);

#ifdef __cplusplus
}
#endif
#endif /* MGC_FACTS_H */
