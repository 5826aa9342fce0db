/* train_data.c - see train_data.h. */
#include "train_data.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "gpt_dataset.h"
#include "indexed.h"
#include "synthetic.h"

#define MAX_DATASETS 64

struct mgc_train_data {
    int n;
    mgc_indexed *ds[MAX_DATASETS];
    mgc_gpt_dataset *gpt[MAX_DATASETS];
    mgc_blend *blend;      /* NULL with one dataset */
    int64_t vocab_size;
    int64_t seq_length;
    char describe[512];
};

void mgc_train_data_free(mgc_train_data *d) {
    if (!d) return;
    for (int i = 0; i < d->n; i++) {
        mgc_gpt_dataset_free(d->gpt[i]);
        mgc_indexed_free(d->ds[i]);
    }
    mgc_blend_free(d->blend);
    free(d);
}

const char *mgc_train_data_describe(const mgc_train_data *d) {
    return d->describe;
}

/* The synthetic corpus: written once into a private temporary directory,
 * mapped, and unlinked at once (the maps keep it alive; nothing is left
 * behind, even on a crash after this point). */
static int open_synthetic(mgc_train_data *d, uint64_t seed, char *err, size_t errsz) {
    const char *tmp = getenv("TMPDIR");
    char dir[4096], prefix[4200], path[4300];
    snprintf(dir, sizeof dir, "%s/mgc-synthetic-XXXXXX", tmp && *tmp ? tmp : "/tmp");
    if (!mkdtemp(dir)) {
        snprintf(err, errsz, "cannot create a temporary directory for the synthetic corpus in %s: %s "
                             "(set TMPDIR to a writable directory)",
                 tmp && *tmp ? tmp : "/tmp", strerror(errno));
        return -1;
    }
    snprintf(prefix, sizeof prefix, "%s/corpus", dir);
    mgc_data_error e = {{0}};
    int rc = -1;
    if (mgc_synthetic_write(prefix, MGC_SYNTHETIC_DEFAULT_DOCUMENTS, seed, &e) != MGC_DATA_OK) {
        snprintf(err, errsz, "writing the synthetic corpus: %s", e.message);
    } else if (mgc_indexed_open(&d->ds[0], prefix, &e) != MGC_DATA_OK) {
        snprintf(err, errsz, "reading the synthetic corpus back: %s", e.message);
    } else {
        d->n = 1;
        rc = 0;
    }
    snprintf(path, sizeof path, "%s.idx", prefix);
    unlink(path);
    snprintf(path, sizeof path, "%s.bin", prefix);
    unlink(path);
    rmdir(dir);
    return rc;
}

/* part 0: training, 1: validation; `want` samples */
static const char *const part_name[3] = {"training", "validation", "test"};

/* Split `part` of the datasets (0 training, 1 validation, 2 test): 0; 1 when the part holds
 * less than one sample (err says so); -1 with err on any other problem. */
static int open_part(mgc_train_data **out, const mgc_plan *plan, int part, int64_t want, char *err,
                     size_t errsz) {
    *out = NULL;
    int small = 0;
    mgc_train_data *d = calloc(1, sizeof *d);
    if (!d) {
        snprintf(err, errsz, "out of memory");
        return -1;
    }
    int64_t fmt = 0, seed = 1234;
    mgc_plan_config_int(plan, "data.format", &fmt);
    mgc_plan_config_int(plan, "training.seed", &seed);
    mgc_plan_config_int(plan, "model.vocab_size", &d->vocab_size);
    d->seq_length = plan->seq_length;
    double weights[MAX_DATASETS];
    if (fmt == 0) {
        if (open_synthetic(d, MGC_SYNTHETIC_DEFAULT_SEED, err, errsz)) goto fail;
        weights[0] = 1;
    } else {
        for (int i = 0; i < MAX_DATASETS; i++) {
            char key[64];
            snprintf(key, sizeof key, "data.paths[%d].path", i);
            const char *p = mgc_plan_config_str(plan, key);
            if (!p) break;
            snprintf(key, sizeof key, "data.paths[%d].weight", i);
            weights[i] = 1.0;
            mgc_plan_config_float(plan, key, &weights[i]);
            mgc_data_error e = {{0}};
            if (mgc_indexed_open(&d->ds[d->n], p, &e) != MGC_DATA_OK) {
                snprintf(err, errsz, "data.paths[%d]: %s", i, e.message);
                goto fail;
            }
            d->n++;
        }
        if (d->n == 0) {
            snprintf(err, errsz, "data.format is megatron but data.paths is empty: list the "
                                 "dataset prefixes (PATH for PATH.bin/PATH.idx), or use "
                                 "data.format: synthetic");
            goto fail;
        }
    }
    /* the training split of each dataset */
    const char *split = mgc_plan_config_str(plan, "data.split");
    double sw[3] = {1, 0, 0};
    mgc_data_error e = {{0}};
    if (split && *split && mgc_data_split_parse(split, sw, &e) != MGC_DATA_OK) {
        snprintf(err, errsz, "data.split '%s': %s", split, e.message);
        goto fail;
    }
    int64_t per[MAX_DATASETS];
    if (d->n > 1) {
        if (mgc_blend_build(&d->blend, weights, d->n, want, &e) != MGC_DATA_OK) {
            snprintf(err, errsz, "data.paths weights: %s", e.message);
            goto fail;
        }
        for (int i = 0; i < d->n; i++)
            per[i] = mgc_blend_requested(d->blend, i);
    } else {
        per[0] = want;
    }
    int64_t tokens = 0;
    for (int i = 0; i < d->n; i++) {
        int64_t bounds[4], n_seq = mgc_indexed_sequence_count(d->ds[i]);
        mgc_data_split_bounds(sw, n_seq, bounds);
        int64_t lo = bounds[part], hi = bounds[part + 1], split_tokens = 0;
        for (int64_t q = lo; q < hi; q++)
            split_tokens += mgc_indexed_sequence_length(d->ds[i], q);
        tokens += split_tokens;
        if (split_tokens < d->seq_length + 1) {
            char key[64];
            snprintf(key, sizeof key, "data.paths[%d]", i);
            snprintf(err, errsz,
                     "%s: the %s split holds %" PRId64 " tokens (%" PRId64
                     " sequences), fewer than one sample of seq_length + 1 = %" PRId64
                     ": use a larger dataset, a larger %s share in data.split, or a "
                     "shorter model.seq_length",
                     fmt == 0 ? "synthetic corpus" : key, part_name[part], split_tokens,
                     hi - lo, d->seq_length + 1, part_name[part]);
            small = 1;
            goto fail;
        }
        mgc_gpt_config gc = {d->seq_length, per[i], (uint64_t)seed, lo, hi};
        if (mgc_gpt_dataset_build(&d->gpt[i], d->ds[i], &gc, &e) != MGC_DATA_OK) {
            snprintf(err, errsz, "building the sample index: %s", e.message);
            goto fail;
        }
    }
    if (fmt == 0)
        snprintf(d->describe, sizeof d->describe,
                 "synthetic corpus (%d documents, %.2f M %s tokens), %" PRId64
                 " samples of %" PRId64 " tokens",
                 MGC_SYNTHETIC_DEFAULT_DOCUMENTS, (double)tokens / 1e6, part_name[part],
                 want, d->seq_length);
    else
        snprintf(d->describe, sizeof d->describe,
                 "%d indexed dataset%s (%.2f M %s tokens), %" PRId64 " samples of %" PRId64
                 " tokens",
                 d->n, d->n > 1 ? "s blended" : "", (double)tokens / 1e6, part_name[part],
                 want, d->seq_length);
    *out = d;
    return 0;
fail:
    mgc_train_data_free(d);
    return small ? 1 : -1;
}

int mgc_train_data_open(mgc_train_data **out, const mgc_plan *plan, int64_t iterations, char *err,
                        size_t errsz) {
    int64_t gbs = plan->micro_batch_size * plan->num_microbatches * plan->grid.dp;
    return open_part(out, plan, 0, gbs * (iterations > 0 ? iterations : 1), err, errsz) ? -1 : 0;
}

int mgc_train_data_open_validation(mgc_train_data **out, const mgc_plan *plan, int64_t samples,
                                   char *err, size_t errsz) {
    return open_part(out, plan, 1, samples > 0 ? samples : 1, err, errsz) ? -1 : 0;
}

int mgc_train_data_open_test(mgc_train_data **out, const mgc_plan *plan, int64_t samples, char *err,
                             size_t errsz) {
    *out = NULL;
    const char *split = mgc_plan_config_str(plan, "data.split");
    double sw[3] = {1, 0, 0};
    mgc_data_error e = {{0}};
    if (split && *split && mgc_data_split_parse(split, sw, &e) == MGC_DATA_OK && sw[2] <= 0) {
        snprintf(err, errsz, "data.split '%s' has no test part", split);
        return 1;
    }
    return open_part(out, plan, 2, samples > 0 ? samples : 1, err, errsz);
}

int mgc_train_data_sample(void *data, int64_t sample, int32_t *tokens, char *err, size_t errsz) {
    mgc_train_data *d = data;
    mgc_data_error e = {{0}};
    mgc_data_status s;
    if (d->blend) {
        int64_t n = mgc_blend_length(d->blend);
        s = mgc_blend_sample(d->blend, d->gpt, sample % n, tokens, &e);
    } else {
        int64_t n = mgc_gpt_dataset_length(d->gpt[0]);
        s = mgc_gpt_dataset_sample(d->gpt[0], sample % n, tokens, &e);
    }
    if (s != MGC_DATA_OK) {
        snprintf(err, errsz, "%s", e.message);
        return -1;
    }
    for (int64_t i = 0; i <= d->seq_length; i++)
        if (tokens[i] < 0 || tokens[i] >= d->vocab_size) {
            snprintf(err, errsz, "token id %d is outside the model's vocabulary (model.vocab_size "
                                 "%" PRId64 "): the dataset was tokenized for another vocabulary",
                     tokens[i], d->vocab_size);
            return -1;
        }
    return 0;
}
