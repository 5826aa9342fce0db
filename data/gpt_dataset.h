/* gpt_dataset.h - Megatron-style GPT dataset indices, blending and splits.
 *
 * A GPT dataset views the sequences [first_sequence, end_sequence) of an
 * indexed dataset (one sequence per document, Megatron's default) as one long
 * token stream cut into samples of seq_length + 1 tokens; labels are the
 * inputs shifted by one, so consecutive samples share one token.  Three
 * indices are built deterministically from the seed (docs/data.md):
 *
 *   document index  (E * documents)  the split's documents, E epochs, shuffled
 *   sample index    (S + 1, 2)       (document-index position, token offset)
 *                                    where sample i starts; sample i ends at
 *                                    entry i + 1 (inclusive of that token)
 *   shuffle index   (S)              the order samples are served in
 *
 *     mgc_gpt_config c = {.seq_length = 256, .num_samples = 10000, .seed = 1234,
 *                         .first_sequence = 0, .end_sequence = -1};
 *     mgc_gpt_dataset *g;
 *     if (mgc_gpt_dataset_build(&g, ds, &c, &err)) ...;
 *     int32_t toks[257];                   // (seq_length + 1)
 *     mgc_gpt_dataset_sample(g, 0, toks, &err);
 *
 * Blending (mgc_blend) follows Megatron's greedy rule; the PRNG is our own
 * xoshiro256** seeded by splitmix64, so orders are deterministic across
 * platforms but not numpy's.
 */
#ifndef MGC_DATA_GPT_DATASET_H
#define MGC_DATA_GPT_DATASET_H

#include <stdint.h>

#include "indexed.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- PRNG: xoshiro256** (Blackman & Vigna), state seeded by splitmix64 ---- */

typedef struct mgc_data_rng {
    uint64_t s[4]; /* xoshiro256** state, never all zero */
} mgc_data_rng;

uint64_t mgc_splitmix64(uint64_t *state); /* advances *state, returns the next output */
void mgc_data_rng_seed(mgc_data_rng *r, uint64_t seed);
uint64_t mgc_data_rng_next(mgc_data_rng *r);
/* Uniform in [0, bound), bound >= 1, unbiased (rejection). */
uint64_t mgc_data_rng_below(mgc_data_rng *r, uint64_t bound);
/* Fisher-Yates: for i = n-1 .. 1 swap v[i] with v[below(i + 1)]. */
void mgc_data_rng_shuffle_i64(mgc_data_rng *r, int64_t *v, int64_t n);

/* ---- train / valid / test split ------------------------------------------ */

/* Parses "969,30,1" (1 to 3 non-negative numbers, missing ones are 0, sum > 0)
 * into weights normalised to sum 1. */
mgc_data_status mgc_data_split_parse(const char *spec, double weights[3], mgc_data_error *err);
/* Megatron's rule: bounds[0] = 0, bounds[k+1] = bounds[k] + round(w_k * n)
 * (round half to even), then all shifted so bounds[3] == n.  Split k is the
 * sequences [bounds[k], bounds[k+1]). */
void mgc_data_split_bounds(const double weights[3], int64_t n, int64_t bounds[4]);

/* ---- GPT dataset ----------------------------------------------------------- */

typedef struct mgc_gpt_config {
    int64_t seq_length;     /* input tokens per sample; a sample holds seq_length + 1 */
    int64_t num_samples;    /* samples wanted; epochs are added until they fit */
    uint64_t seed;          /* shuffle seed */
    int64_t first_sequence; /* the split: sequences [first_sequence, end_sequence) */
    int64_t end_sequence;   /* -1: up to the last sequence */
} mgc_gpt_config;

typedef struct mgc_gpt_dataset mgc_gpt_dataset;

/* Builds the three indices; `ds` must outlive the dataset. */
mgc_data_status mgc_gpt_dataset_build(mgc_gpt_dataset **out, const mgc_indexed *ds,
                                      const mgc_gpt_config *cfg, mgc_data_error *err);
void mgc_gpt_dataset_free(mgc_gpt_dataset *g);

/* Samples available (>= num_samples): every full sample over the epochs. */
int64_t mgc_gpt_dataset_length(const mgc_gpt_dataset *g);
int64_t mgc_gpt_dataset_epochs(const mgc_gpt_dataset *g);
int64_t mgc_gpt_dataset_seq_length(const mgc_gpt_dataset *g);
/* Sample i in served order (through the shuffle index): out[seq_length + 1]. */
mgc_data_status mgc_gpt_dataset_sample(const mgc_gpt_dataset *g, int64_t i, int32_t *out,
                                       mgc_data_error *err);
/* The same, by position in the sample index (no shuffle). */
mgc_data_status mgc_gpt_dataset_sample_unshuffled(const mgc_gpt_dataset *g, int64_t j, int32_t *out,
                                                  mgc_data_error *err);

/* The indices, for tests and tools (owned by g). */
const int64_t *mgc_gpt_dataset_document_index(const mgc_gpt_dataset *g, int64_t *n);
const int64_t *mgc_gpt_dataset_sample_index(const mgc_gpt_dataset *g, int64_t *n_samples);
const int64_t *mgc_gpt_dataset_shuffle_index(const mgc_gpt_dataset *g, int64_t *n);

/* ---- blending -------------------------------------------------------------- */

#define MGC_BLEND_SURPLUS 0.005 /* Megatron's mid_level_dataset_surplus */

typedef struct mgc_blend mgc_blend;

/* Normalises weights[n_datasets] (>= 0, sum > 0) and builds the blend index
 * of n_samples entries: sample i comes from the dataset d maximising
 * w_d * max(i, 1) - drawn_d (first on ties), as its drawn_d-th sample. */
mgc_data_status mgc_blend_build(mgc_blend **out, const double *weights, int32_t n_datasets,
                                int64_t n_samples, mgc_data_error *err);
void mgc_blend_free(mgc_blend *b);

int32_t mgc_blend_dataset_count(const mgc_blend *b);
int64_t mgc_blend_length(const mgc_blend *b);
double mgc_blend_weight(const mgc_blend *b, int32_t d); /* normalised */
/* Samples to ask dataset d for: ceil(ceil(n_samples * w_d) * (1 + 0.005)). */
int64_t mgc_blend_requested(const mgc_blend *b, int32_t d);
int64_t mgc_blend_drawn(const mgc_blend *b, int32_t d); /* samples the index takes from d */
int32_t mgc_blend_dataset_index(const mgc_blend *b, int64_t i);
int64_t mgc_blend_dataset_sample_index(const mgc_blend *b, int64_t i);
/* Sample i of the blend from datasets[n_datasets]: out[seq_length + 1]. */
mgc_data_status mgc_blend_sample(const mgc_blend *b, mgc_gpt_dataset *const *datasets, int64_t i,
                                 int32_t *out, mgc_data_error *err);

#ifdef __cplusplus
}
#endif

#endif
