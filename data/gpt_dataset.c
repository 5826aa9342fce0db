/* gpt_dataset.c - GPT dataset indices, splits and blending (see gpt_dataset.h). */
#include "gpt_dataset.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static mgc_data_status fail(mgc_data_error *err, mgc_data_status s, const char *fmt, ...) {
    if (err) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err->message, sizeof err->message, fmt, ap);
        va_end(ap);
    }
    return s;
}

/* ---- PRNG ------------------------------------------------------------------ */

uint64_t mgc_splitmix64(uint64_t *state) {
    uint64_t z = (*state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

void mgc_data_rng_seed(mgc_data_rng *r, uint64_t seed) {
    uint64_t sm = seed;
    for (int i = 0; i < 4; i++)
        r->s[i] = mgc_splitmix64(&sm);
    if (!(r->s[0] | r->s[1] | r->s[2] | r->s[3])) r->s[0] = 1; /* cannot happen; be safe */
}

static uint64_t rotl(uint64_t x, int k) {
    return (x << k) | (x >> (64 - k));
}

uint64_t mgc_data_rng_next(mgc_data_rng *r) {
    uint64_t *s = r->s;
    uint64_t result = rotl(s[1] * 5, 7) * 9;
    uint64_t t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return result;
}

uint64_t mgc_data_rng_below(mgc_data_rng *r, uint64_t bound) {
    uint64_t threshold = (0 - bound) % bound; /* 2^64 mod bound */
    for (;;) {
        uint64_t x = mgc_data_rng_next(r);
        if (x >= threshold) return x % bound;
    }
}

void mgc_data_rng_shuffle_i64(mgc_data_rng *r, int64_t *v, int64_t n) {
    for (int64_t i = n - 1; i > 0; i--) {
        int64_t j = (int64_t)mgc_data_rng_below(r, (uint64_t)i + 1);
        int64_t t = v[i];
        v[i] = v[j];
        v[j] = t;
    }
}

/* ---- split ----------------------------------------------------------------- */

mgc_data_status mgc_data_split_parse(const char *spec, double weights[3], mgc_data_error *err) {
    double w[3] = {0, 0, 0};
    const char *p = spec;
    int k = 0;
    for (;;) {
        if (k == 3)
            return fail(err, MGC_DATA_ERR_INVALID,
                        "split \"%s\": more than 3 parts (hint: train,valid,test e.g. 969,30,1)",
                        spec);
        char *end;
        errno = 0;
        double x = strtod(p, &end);
        if (end == p || errno || !(x >= 0) || !isfinite(x))
            return fail(err, MGC_DATA_ERR_INVALID,
                        "split \"%s\": part %d is not a non-negative number (hint: e.g. 969,30,1)",
                        spec, k + 1);
        w[k++] = x;
        if (*end == '\0') break;
        if (*end != ',')
            return fail(err, MGC_DATA_ERR_INVALID,
                        "split \"%s\": unexpected '%c' (hint: separate parts with commas)", spec,
                        *end);
        p = end + 1;
    }
    double sum = w[0] + w[1] + w[2];
    if (!(sum > 0))
        return fail(err, MGC_DATA_ERR_INVALID, "split \"%s\": the weights sum to 0", spec);
    for (int i = 0; i < 3; i++)
        weights[i] = w[i] / sum;
    return MGC_DATA_OK;
}

void mgc_data_split_bounds(const double weights[3], int64_t n, int64_t bounds[4]) {
    bounds[0] = 0;
    for (int k = 0; k < 3; k++)
        bounds[k + 1] = bounds[k] + (int64_t)nearbyint(weights[k] * (double)n);
    int64_t diff = bounds[3] - n;
    for (int k = 1; k < 4; k++) {
        bounds[k] -= diff;
        if (bounds[k] < bounds[k - 1]) bounds[k] = bounds[k - 1];
        if (bounds[k] > n) bounds[k] = n;
    }
}

/* ---- GPT dataset ----------------------------------------------------------- */

struct mgc_gpt_dataset {
    const mgc_indexed *ds;  /* token source */
    int64_t seq_length;     /* input tokens per sample */
    int64_t epochs;         /* E */
    int64_t *doc_index;     /* (n_doc_index) sequence ids, E epochs shuffled */
    int64_t n_doc_index;    /* E * documents */
    int64_t *sample_index;  /* (n_samples + 1, 2) (doc-index position, offset) */
    int64_t n_samples;      /* S */
    int64_t *shuffle_index; /* (n_samples) */
};

void mgc_gpt_dataset_free(mgc_gpt_dataset *g) {
    if (!g) return;
    free(g->doc_index);
    free(g->sample_index);
    free(g->shuffle_index);
    free(g);
}

mgc_data_status mgc_gpt_dataset_build(mgc_gpt_dataset **out, const mgc_indexed *ds,
                                      const mgc_gpt_config *cfg, mgc_data_error *err) {
    *out = NULL;
    const int64_t extra = 1; /* add_extra_token_to_sequence */
    int64_t n_seq = mgc_indexed_sequence_count(ds);
    int64_t first = cfg->first_sequence, end = cfg->end_sequence < 0 ? n_seq : cfg->end_sequence;
    if (cfg->seq_length < 1 || cfg->num_samples < 1)
        return fail(err, MGC_DATA_ERR_INVALID,
                    "gpt dataset: seq_length (%lld) and num_samples (%lld) must be positive",
                    (long long)cfg->seq_length, (long long)cfg->num_samples);
    if (first < 0 || first > end || end > n_seq)
        return fail(err, MGC_DATA_ERR_INVALID,
                    "gpt dataset: sequence range [%lld, %lld) is outside [0, %lld)",
                    (long long)first, (long long)end, (long long)n_seq);
    int64_t n_docs = end - first, tokens_per_epoch = 0;
    for (int64_t s = first; s < end; s++)
        tokens_per_epoch += mgc_indexed_sequence_length(ds, s);
    if (tokens_per_epoch <= extra)
        return fail(err, MGC_DATA_ERR_INVALID,
                    "gpt dataset: the split [%lld, %lld) holds %lld tokens, too few for one "
                    "sample (hint: a larger dataset or another --split)",
                    (long long)first, (long long)end, (long long)tokens_per_epoch);
    /* epochs: the fewest that hold num_samples * seq_length + 1 tokens */
    if (cfg->num_samples > (INT64_MAX - extra) / cfg->seq_length)
        return fail(err, MGC_DATA_ERR_INVALID, "gpt dataset: num_samples * seq_length overflows");
    int64_t want = cfg->num_samples * cfg->seq_length + extra;
    int64_t epochs = (want + tokens_per_epoch - 1) / tokens_per_epoch;
    if (epochs > INT64_MAX / (n_docs ? n_docs : 1) || epochs * n_docs > ((int64_t)1 << 40))
        return fail(err, MGC_DATA_ERR_INVALID,
                    "gpt dataset: %lld epochs of %lld documents is too many", (long long)epochs,
                    (long long)n_docs);
    /* Megatron shuffles the last epoch apart when less than 80% of it is used */
    int separate_final = 0;
    int64_t samples_sans_final = 0;
    if (epochs > 1) {
        samples_sans_final = ((epochs - 1) * tokens_per_epoch - extra) / cfg->seq_length;
        int64_t from_final = cfg->num_samples - samples_sans_final;
        int64_t per_epoch = (tokens_per_epoch - extra) / cfg->seq_length;
        separate_final = from_final < (int64_t)(0.80 * (double)per_epoch);
    }

    mgc_gpt_dataset *g = calloc(1, sizeof *g);
    if (!g) return fail(err, MGC_DATA_ERR_NOMEM, "gpt dataset: out of memory");
    g->ds = ds;
    g->seq_length = cfg->seq_length;
    g->epochs = epochs;
    g->n_doc_index = epochs * n_docs;
    g->n_samples = (epochs * tokens_per_epoch - extra) / cfg->seq_length;
    g->doc_index = malloc((size_t)(g->n_doc_index ? g->n_doc_index : 1) * sizeof(int64_t));
    g->sample_index = malloc((size_t)(g->n_samples + 1) * 2 * sizeof(int64_t));
    g->shuffle_index = malloc((size_t)(g->n_samples ? g->n_samples : 1) * sizeof(int64_t));
    if (!g->doc_index || !g->sample_index || !g->shuffle_index) {
        int64_t n_samples = g->n_samples;
        mgc_gpt_dataset_free(g);
        return fail(err, MGC_DATA_ERR_NOMEM, "gpt dataset: out of memory for %lld samples",
                    (long long)n_samples);
    }

    /* document index: E copies of the split, shuffled (last epoch apart when separate) */
    mgc_data_rng rng;
    mgc_data_rng_seed(&rng, cfg->seed);
    for (int64_t e = 0; e < epochs; e++)
        for (int64_t k = 0; k < n_docs; k++)
            g->doc_index[e * n_docs + k] = first + k;
    if (separate_final) {
        mgc_data_rng_shuffle_i64(&rng, g->doc_index, (epochs - 1) * n_docs);
        mgc_data_rng_shuffle_i64(&rng, g->doc_index + (epochs - 1) * n_docs, n_docs);
    } else {
        mgc_data_rng_shuffle_i64(&rng, g->doc_index, g->n_doc_index);
    }

    /* sample index: walk the document index seq_length tokens at a time */
    int64_t *si = g->sample_index;
    int64_t pos = 0, offset = 0;
    si[0] = si[1] = 0;
    for (int64_t s = 1; s <= g->n_samples; s++) {
        int64_t remaining = cfg->seq_length + extra;
        while (remaining != 0) {
            if (pos >= g->n_doc_index) { /* cannot happen: n_samples fits the epochs */
                mgc_gpt_dataset_free(g);
                return fail(err, MGC_DATA_ERR_FORMAT, "gpt dataset: ran out of documents");
            }
            int64_t doc_len = mgc_indexed_sequence_length(ds, g->doc_index[pos]) - offset;
            remaining -= doc_len;
            if (remaining <= 0) {
                offset += remaining + doc_len - extra; /* the last token is shared */
                remaining = 0;
            } else {
                pos++;
                offset = 0;
            }
        }
        si[2 * s] = pos;
        si[2 * s + 1] = offset;
    }

    /* shuffle index: the samples before the final epoch apart when separate */
    int64_t head = separate_final ? samples_sans_final : g->n_samples;
    for (int64_t s = 0; s < g->n_samples; s++)
        g->shuffle_index[s] = s;
    mgc_data_rng_shuffle_i64(&rng, g->shuffle_index, head);
    mgc_data_rng_shuffle_i64(&rng, g->shuffle_index + head, g->n_samples - head);
    *out = g;
    return MGC_DATA_OK;
}

int64_t mgc_gpt_dataset_length(const mgc_gpt_dataset *g) {
    return g->n_samples;
}
int64_t mgc_gpt_dataset_epochs(const mgc_gpt_dataset *g) {
    return g->epochs;
}
int64_t mgc_gpt_dataset_seq_length(const mgc_gpt_dataset *g) {
    return g->seq_length;
}

const int64_t *mgc_gpt_dataset_document_index(const mgc_gpt_dataset *g, int64_t *n) {
    *n = g->n_doc_index;
    return g->doc_index;
}
const int64_t *mgc_gpt_dataset_sample_index(const mgc_gpt_dataset *g, int64_t *n_samples) {
    *n_samples = g->n_samples;
    return g->sample_index;
}
const int64_t *mgc_gpt_dataset_shuffle_index(const mgc_gpt_dataset *g, int64_t *n) {
    *n = g->n_samples;
    return g->shuffle_index;
}

mgc_data_status mgc_gpt_dataset_sample_unshuffled(const mgc_gpt_dataset *g, int64_t j, int32_t *out,
                                                  mgc_data_error *err) {
    if (j < 0 || j >= g->n_samples)
        return fail(err, MGC_DATA_ERR_INVALID, "gpt dataset: sample %lld out of range [0, %lld)",
                    (long long)j, (long long)g->n_samples);
    const int64_t *si = g->sample_index;
    int64_t pos = si[2 * j], off = si[2 * j + 1];
    int64_t end_pos = si[2 * j + 2], end_off = si[2 * j + 3];
    int64_t n = 0;
    for (; pos <= end_pos; pos++, off = 0) {
        int64_t seq = g->doc_index[pos];
        int64_t stop = pos == end_pos ? end_off + 1 : mgc_indexed_sequence_length(g->ds, seq);
        mgc_data_status s = mgc_indexed_read(g->ds, seq, off, stop - off, out + n, err);
        if (s) return s;
        n += stop - off;
    }
    if (n != g->seq_length + 1)
        return fail(err, MGC_DATA_ERR_FORMAT, "gpt dataset: sample %lld has %lld tokens, not %lld",
                    (long long)j, (long long)n, (long long)(g->seq_length + 1));
    return MGC_DATA_OK;
}

mgc_data_status mgc_gpt_dataset_sample(const mgc_gpt_dataset *g, int64_t i, int32_t *out,
                                       mgc_data_error *err) {
    if (i < 0 || i >= g->n_samples)
        return fail(err, MGC_DATA_ERR_INVALID, "gpt dataset: sample %lld out of range [0, %lld)",
                    (long long)i, (long long)g->n_samples);
    return mgc_gpt_dataset_sample_unshuffled(g, g->shuffle_index[i], out, err);
}

/* ---- blending -------------------------------------------------------------- */

struct mgc_blend {
    int32_t n_datasets;     /* D */
    double *weights;        /* (D) normalised */
    int64_t *requested;     /* (D) ceil(ceil(n * w) * 1.005) */
    int64_t *drawn;         /* (D) samples the index takes */
    int64_t n_samples;      /* length of the blend */
    int16_t *dataset_index; /* (n_samples) which dataset; int16 as Megatron */
    int64_t *sample_index;  /* (n_samples) which sample of it */
};

void mgc_blend_free(mgc_blend *b) {
    if (!b) return;
    free(b->weights);
    free(b->requested);
    free(b->drawn);
    free(b->dataset_index);
    free(b->sample_index);
    free(b);
}

mgc_data_status mgc_blend_build(mgc_blend **out, const double *weights, int32_t n_datasets,
                                int64_t n_samples, mgc_data_error *err) {
    *out = NULL;
    if (n_datasets < 1 || n_datasets > INT16_MAX || n_samples < 0)
        return fail(err, MGC_DATA_ERR_INVALID,
                    "blend: %ld datasets and %lld samples (hint: 1 to 32767 datasets)",
                    (long)n_datasets, (long long)n_samples);
    double sum = 0;
    for (int32_t d = 0; d < n_datasets; d++) {
        if (!(weights[d] >= 0) || !isfinite(weights[d]))
            return fail(err, MGC_DATA_ERR_INVALID, "blend: weight %ld is %g, must be >= 0", (long)d,
                        weights[d]);
        sum += weights[d];
    }
    if (!(sum > 0)) return fail(err, MGC_DATA_ERR_INVALID, "blend: the weights sum to 0");
    mgc_blend *b = calloc(1, sizeof *b);
    if (!b) return fail(err, MGC_DATA_ERR_NOMEM, "blend: out of memory");
    b->n_datasets = n_datasets;
    b->n_samples = n_samples;
    b->weights = calloc((size_t)n_datasets, sizeof *b->weights);
    b->requested = calloc((size_t)n_datasets, sizeof *b->requested);
    b->drawn = calloc((size_t)n_datasets, sizeof *b->drawn);
    b->dataset_index = malloc((size_t)(n_samples ? n_samples : 1) * sizeof *b->dataset_index);
    b->sample_index = malloc((size_t)(n_samples ? n_samples : 1) * sizeof *b->sample_index);
    if (!b->weights || !b->requested || !b->drawn || !b->dataset_index || !b->sample_index) {
        mgc_blend_free(b);
        return fail(err, MGC_DATA_ERR_NOMEM, "blend: out of memory for %lld samples",
                    (long long)n_samples);
    }
    for (int32_t d = 0; d < n_datasets; d++) {
        b->weights[d] = weights[d] / sum;
        b->requested[d] =
            (int64_t)ceil(ceil((double)n_samples * b->weights[d]) * (1.0 + MGC_BLEND_SURPLUS));
    }
    for (int64_t i = 0; i < n_samples; i++) {
        double at = i > 1 ? (double)i : 1.0;
        int32_t best = 0;
        double best_err = b->weights[0] * at - (double)b->drawn[0];
        for (int32_t d = 1; d < n_datasets; d++) {
            double e = b->weights[d] * at - (double)b->drawn[d];
            if (e > best_err) {
                best_err = e;
                best = d;
            }
        }
        b->dataset_index[i] = (int16_t)best;
        b->sample_index[i] = b->drawn[best]++;
    }
    *out = b;
    return MGC_DATA_OK;
}

int32_t mgc_blend_dataset_count(const mgc_blend *b) {
    return b->n_datasets;
}
int64_t mgc_blend_length(const mgc_blend *b) {
    return b->n_samples;
}
double mgc_blend_weight(const mgc_blend *b, int32_t d) {
    return b->weights[d];
}
int64_t mgc_blend_requested(const mgc_blend *b, int32_t d) {
    return b->requested[d];
}
int64_t mgc_blend_drawn(const mgc_blend *b, int32_t d) {
    return b->drawn[d];
}
int32_t mgc_blend_dataset_index(const mgc_blend *b, int64_t i) {
    return b->dataset_index[i];
}
int64_t mgc_blend_dataset_sample_index(const mgc_blend *b, int64_t i) {
    return b->sample_index[i];
}

mgc_data_status mgc_blend_sample(const mgc_blend *b, mgc_gpt_dataset *const *datasets, int64_t i,
                                 int32_t *out, mgc_data_error *err) {
    if (i < 0 || i >= b->n_samples)
        return fail(err, MGC_DATA_ERR_INVALID, "blend: sample %lld out of range [0, %lld)",
                    (long long)i, (long long)b->n_samples);
    const mgc_gpt_dataset *g = datasets[b->dataset_index[i]];
    int64_t j = b->sample_index[i];
    if (j >= mgc_gpt_dataset_length(g))
        return fail(err, MGC_DATA_ERR_INVALID,
                    "blend: dataset %d has %lld samples, sample %lld asked (hint: build it with "
                    "num_samples = mgc_blend_requested())",
                    (int)b->dataset_index[i], (long long)mgc_gpt_dataset_length(g), (long long)j);
    return mgc_gpt_dataset_sample(g, j, out, err);
}
