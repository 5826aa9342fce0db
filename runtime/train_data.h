/* train_data.h - the training data a plan names (data.* of its config):
 * the embedded synthetic corpus, or Megatron indexed datasets blended by
 * weight, viewed as GPT samples of seq_length + 1 tokens (data/gpt_dataset.h).
 *
 *     mgc_train_data *d = NULL;
 *     if (mgc_train_data_open(&d, plan, iterations, err, sizeof err)) ... err ...;
 *     int32_t toks[s + 1];
 *     mgc_train_data_sample(d, i, toks, err, sizeof err);   // an mgc_sample_fn
 *     mgc_train_data_free(d);
 *
 * Opening checks everything a run will read -- files exist and are valid
 * indexed datasets, token ids fit the vocabulary, the split holds at least one
 * sample -- so a bad dataset fails before the first step. */
#ifndef MGC_TRAIN_DATA_H
#define MGC_TRAIN_DATA_H

#include <stddef.h>
#include <stdint.h>

#include "plan.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct mgc_train_data mgc_train_data;

/* Samples for `iterations` steps of the plan's global batch.  0, or -1 with a
 * message (file, problem, hint) in err. */
int mgc_train_data_open(mgc_train_data **out, const mgc_plan *plan, int64_t iterations, char *err,
                        size_t errsz);
/* The validation part of data.split (the second weight): `samples` samples of the same
 * datasets, blend weights and seed.  0, or -1 with err (a split without a validation part). */
int mgc_train_data_open_validation(mgc_train_data **out, const mgc_plan *plan, int64_t samples,
                                   char *err, size_t errsz);
/* The test part of data.split (the third weight), likewise: 0; 1 when there is none, or it
 * holds less than one sample (err says which); -1 with err on any other problem. */
int mgc_train_data_open_test(mgc_train_data **out, const mgc_plan *plan, int64_t samples, char *err,
                             size_t errsz);
/* Thread-safe: samples are read from read-only maps. */
int mgc_train_data_sample(void *data, int64_t sample, int32_t *tokens, char *err, size_t errsz);
/* "synthetic corpus (8000 documents, 1.31 M tokens)" style description. */
const char *mgc_train_data_describe(const mgc_train_data *d);
void mgc_train_data_free(mgc_train_data *d);

#ifdef __cplusplus
}
#endif
#endif
