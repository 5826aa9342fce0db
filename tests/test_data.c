/* test_data.c - data/: indexed dataset writer and reader, byte tokenizer,
 * GPT dataset indices, blending, splits, the synthetic corpus, `mgc data`. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../compiler/data_cmd.h"
#include "gpt_dataset.h"
#include "indexed.h"
#include "synthetic.h"
#include "tokenizer.h"
#include "testlib.h"

static char tmp_dir[64];

static const char *path_of(const char *name) {
    static char buf[4][256];
    static int k;
    k = (k + 1) % 4;
    snprintf(buf[k], sizeof buf[k], "%s/%s", tmp_dir, name);
    return buf[k];
}

static int write_bytes(const char *path, const unsigned char *p, size_t n) {
    FILE *f = fopen(path, "wb");
    if (!f) return 0;
    int ok = fwrite(p, 1, n, f) == n;
    return fclose(f) == 0 && ok;
}

static unsigned char *read_bytes(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long len = ftell(f);
    fseek(f, 0, SEEK_SET);
    unsigned char *p = malloc((size_t)len + 1);
    *n = fread(p, 1, (size_t)len, f);
    fclose(f);
    return p;
}

static void remove_prefix(const char *prefix) {
    char b[300];
    snprintf(b, sizeof b, "%s.idx", prefix);
    remove(b);
    snprintf(b, sizeof b, "%s.bin", prefix);
    remove(b);
}

/* ---- the published layout, byte by byte ------------------------------------
 * Three documents of uint16 tokens: [1, 2, 3], [] and [256 (EOD)].
 *   .idx  "MMIDIDX\0\0" | version 1 (u64) | dtype 8 = uint16 (u8) | N = 3 (u64)
 *         | D = 4 (u64) | lengths 3, 0, 1 (int32) | pointers 0, 6, 6 (int64)
 *         | document_indices 0, 1, 2, 3 (int64)              = 34 + 12 + 24 + 32 = 102 bytes
 *   .bin  01 00 02 00 03 00 00 01                                                =   8 bytes */
static const unsigned char FIXTURE_IDX[] = {
    'M', 'M', 'I', 'D', 'I', 'D', 'X', 0, 0,          /* magic */
    1,   0,   0,   0,   0,   0,   0,   0,             /* version */
    8,                                                /* dtype uint16 */
    3,   0,   0,   0,   0,   0,   0,   0,             /* N */
    4,   0,   0,   0,   0,   0,   0,   0,             /* D */
    3,   0,   0,   0,   0,   0,   0,   0, 1, 0, 0, 0, /* sequence_lengths */
    0,   0,   0,   0,   0,   0,   0,   0,             /* pointers */
    6,   0,   0,   0,   0,   0,   0,   0,             /*   */
    6,   0,   0,   0,   0,   0,   0,   0,             /*   */
    0,   0,   0,   0,   0,   0,   0,   0,             /* document_indices */
    1,   0,   0,   0,   0,   0,   0,   0,             /*   */
    2,   0,   0,   0,   0,   0,   0,   0,             /*   */
    3,   0,   0,   0,   0,   0,   0,   0,             /*   */
};
static const unsigned char FIXTURE_BIN[] = {1, 0, 2, 0, 3, 0, 0, 1};

static void test_fixture(void) {
    T_EQ_U64(sizeof FIXTURE_IDX, 102);
    /* the writer produces exactly these bytes */
    const char *prefix = path_of("fixture_w");
    mgc_data_error err;
    mgc_indexed_writer *w;
    T_CHECK(mgc_indexed_writer_open(&w, prefix, MGC_DTYPE_UINT16, &err) == MGC_DATA_OK);
    int32_t a[] = {1, 2, 3}, eod[] = {256};
    T_CHECK(mgc_indexed_writer_add_document(w, a, 3, &err) == MGC_DATA_OK);
    T_CHECK(mgc_indexed_writer_add_document(w, NULL, 0, &err) == MGC_DATA_OK);
    T_CHECK(mgc_indexed_writer_add_document(w, eod, 1, &err) == MGC_DATA_OK);
    T_CHECK(mgc_indexed_writer_finish(w, &err) == MGC_DATA_OK);
    char p[300];
    size_t n;
    snprintf(p, sizeof p, "%s.idx", prefix);
    unsigned char *got = read_bytes(p, &n);
    T_CHECK(got && n == sizeof FIXTURE_IDX && !memcmp(got, FIXTURE_IDX, n));
    free(got);
    snprintf(p, sizeof p, "%s.bin", prefix);
    got = read_bytes(p, &n);
    T_CHECK(got && n == sizeof FIXTURE_BIN && !memcmp(got, FIXTURE_BIN, n));
    free(got);
    snprintf(p, sizeof p, "%s.idx.tmp", prefix);
    T_CHECK(access(p, F_OK) != 0); /* temporaries renamed away */
    remove_prefix(prefix);

    /* the reader understands hand-made bytes */
    prefix = path_of("fixture_r");
    snprintf(p, sizeof p, "%s.idx", prefix);
    T_CHECK(write_bytes(p, FIXTURE_IDX, sizeof FIXTURE_IDX));
    snprintf(p, sizeof p, "%s.bin", prefix);
    T_CHECK(write_bytes(p, FIXTURE_BIN, sizeof FIXTURE_BIN));
    mgc_indexed *ds;
    T_CHECK(mgc_indexed_open(&ds, prefix, &err) == MGC_DATA_OK);
    if (ds) {
        T_EQ_U64(mgc_indexed_dtype(ds), MGC_DTYPE_UINT16);
        T_EQ_I64(mgc_indexed_sequence_count(ds), 3);
        T_EQ_I64(mgc_indexed_document_count(ds), 3);
        T_EQ_I64(mgc_indexed_token_count(ds), 4);
        T_EQ_I64(mgc_indexed_sequence_length(ds, 0), 3);
        T_EQ_I64(mgc_indexed_sequence_length(ds, 1), 0);
        T_EQ_I64(mgc_indexed_sequence_pointer(ds, 2), 6);
        T_EQ_I64(mgc_indexed_document_index(ds, 3), 3);
        int32_t t[3] = {0};
        T_CHECK(mgc_indexed_read(ds, 0, 0, 3, t, &err) == MGC_DATA_OK);
        T_CHECK(t[0] == 1 && t[1] == 2 && t[2] == 3);
        T_CHECK(mgc_indexed_read(ds, 2, 0, 1, t, &err) == MGC_DATA_OK && t[0] == 256);
        T_CHECK(mgc_indexed_read(ds, 0, 2, 2, t, &err) == MGC_DATA_ERR_INVALID);
        T_CHECK(mgc_indexed_read(ds, 3, 0, 0, t, &err) == MGC_DATA_ERR_INVALID);
        mgc_indexed_free(ds);
    }

    /* several sequences per document (--split-sentences style) */
    prefix = path_of("multi");
    T_CHECK(mgc_indexed_writer_open(&w, prefix, MGC_DTYPE_INT32, &err) == MGC_DATA_OK);
    int32_t big[] = {70000, -5};
    mgc_indexed_writer_add_sequence(w, big, 2, &err);
    mgc_indexed_writer_add_sequence(w, a, 3, &err);
    mgc_indexed_writer_end_document(w, &err);
    mgc_indexed_writer_add_sequence(w, a, 1, &err); /* closed by finish */
    T_CHECK(mgc_indexed_writer_finish(w, &err) == MGC_DATA_OK);
    T_CHECK(mgc_indexed_open(&ds, prefix, &err) == MGC_DATA_OK);
    if (ds) {
        T_EQ_I64(mgc_indexed_sequence_count(ds), 3);
        T_EQ_I64(mgc_indexed_document_count(ds), 2);
        T_EQ_I64(mgc_indexed_document_index(ds, 1), 2);
        T_EQ_I64(mgc_indexed_sequence_pointer(ds, 1), 8);
        int32_t t[2];
        T_CHECK(mgc_indexed_read(ds, 0, 0, 2, t, &err) == MGC_DATA_OK);
        T_CHECK(t[0] == 70000 && t[1] == -5);
        mgc_indexed_free(ds);
    }
    remove_prefix(prefix);

    /* a token that does not fit the dtype is refused and nothing is written */
    T_CHECK(mgc_indexed_writer_open(&w, prefix, MGC_DTYPE_UINT16, &err) == MGC_DATA_OK);
    T_CHECK(mgc_indexed_writer_add_document(w, big, 1, &err) == MGC_DATA_ERR_INVALID);
    T_CHECK(strstr(err.message, "does not fit uint16") != NULL);
    mgc_indexed_writer_free(w);
    snprintf(p, sizeof p, "%s.bin.tmp", prefix);
    T_CHECK(access(p, F_OK) != 0);
    T_CHECK(mgc_indexed_writer_open(&w, "/nonexistent-dir/x", MGC_DTYPE_UINT16, &err) ==
            MGC_DATA_ERR_IO);
    T_CHECK(strstr(err.message, "/nonexistent-dir/x.bin.tmp") != NULL);
    T_CHECK(mgc_data_dtype_for_vocab(257) == MGC_DTYPE_UINT16);
    T_CHECK(mgc_data_dtype_for_vocab(65499) == MGC_DTYPE_UINT16);
    T_CHECK(mgc_data_dtype_for_vocab(65500) == MGC_DTYPE_INT32);
}

/* ---- corrupt and truncated files are rejected -------------------------------- */

static void put64(unsigned char *p, uint64_t v) {
    for (int i = 0; i < 8; i++)
        p[i] = (unsigned char)(v >> (8 * i));
}

/* Writes idx/bin under prefix "bad" and expects open to fail with `want`
 * and a message naming the file. */
static void expect_bad(const unsigned char *idx, size_t n_idx, const unsigned char *bin,
                       size_t n_bin, mgc_data_status want, const char *what) {
    const char *prefix = path_of("bad");
    char p[300];
    snprintf(p, sizeof p, "%s.idx", prefix);
    write_bytes(p, idx, n_idx);
    snprintf(p, sizeof p, "%s.bin", prefix);
    write_bytes(p, bin, n_bin);
    mgc_indexed *ds = NULL;
    mgc_data_error err = {{0}};
    mgc_data_status s = mgc_indexed_open(&ds, prefix, &err);
    T_CHECK(s == want);
    T_CHECK(ds == NULL);
    T_CHECK(strstr(err.message, prefix) != NULL && strstr(err.message, "hint") != NULL);
    T_CHECK(strchr(err.message, '\n') == NULL);
    if (s != want) fprintf(stderr, "  case: %s -> %s\n", what, err.message);
    mgc_indexed_free(ds);
}

static void test_corrupt(void) {
    unsigned char b[sizeof FIXTURE_IDX];
    const size_t n = sizeof b;
#define MUTATE(stmt, what)                                                                         \
    do {                                                                                           \
        memcpy(b, FIXTURE_IDX, n);                                                                 \
        stmt;                                                                                      \
        expect_bad(b, n, FIXTURE_BIN, sizeof FIXTURE_BIN, MGC_DATA_ERR_FORMAT, what);              \
    } while (0)
    MUTATE(b[0] = 'X', "magic");
    MUTATE(b[8] = 1, "magic padding");
    MUTATE(b[9] = 2, "version");
    MUTATE(b[17] = 0, "dtype 0");
    MUTATE(b[17] = 9, "dtype 9");
    MUTATE(b[17] = 7, "float dtype");
    MUTATE(put64(b + 18, UINT64_MAX), "N huge");
    MUTATE(put64(b + 18, 4), "N off by one");
    MUTATE(put64(b + 18, (uint64_t)1 << 62), "N times 12 overflows");
    MUTATE(put64(b + 26, UINT64_MAX), "D huge");
    MUTATE(put64(b + 26, 3), "D short");
    MUTATE(put64(b + 26, 0), "D zero");
    MUTATE(b[34 + 3] = 0x80, "negative length");
    MUTATE(b[34] = 5, "length past the bin");
    MUTATE(b[46 + 8] = 2, "pointer inside previous sequence");
    MUTATE(b[46 + 16] = 200, "pointer past the bin");
    MUTATE(b[70] = 1, "document_indices[0] != 0");
    MUTATE(b[70 + 24] = 2, "document_indices[-1] != N");
    MUTATE((b[70 + 8] = 3, b[70 + 16] = 1), "document_indices decreasing");
#undef MUTATE
    /* every truncation of the .idx */
    for (size_t k = 0; k < n; k++)
        expect_bad(FIXTURE_IDX, k, FIXTURE_BIN, sizeof FIXTURE_BIN, MGC_DATA_ERR_FORMAT,
                   "truncated idx");
    /* a truncated .bin */
    expect_bad(FIXTURE_IDX, n, FIXTURE_BIN, sizeof FIXTURE_BIN - 1, MGC_DATA_ERR_FORMAT,
               "truncated bin");
    /* a missing file */
    mgc_indexed *ds;
    mgc_data_error err;
    T_CHECK(mgc_indexed_open(&ds, path_of("missing"), &err) == MGC_DATA_ERR_IO);
    T_CHECK(strstr(err.message, "missing.idx: cannot open") != NULL);
    remove_prefix(path_of("bad"));
}

/* ---- round trip of random documents ------------------------------------------ */

static void test_round_trip(void) {
    mgc_data_rng r;
    mgc_data_rng_seed(&r, 42);
    for (int trial = 0; trial < 6; trial++) {
        mgc_data_dtype dt = trial % 2 ? MGC_DTYPE_INT32 : MGC_DTYPE_UINT16;
        int32_t vocab = dt == MGC_DTYPE_INT32 ? 100000 : 65535;
        int64_t n_docs = 1 + (int64_t)mgc_data_rng_below(&r, 200);
        int64_t *lens = malloc((size_t)n_docs * sizeof *lens);
        int32_t **docs = malloc((size_t)n_docs * sizeof *docs);
        const char *prefix = path_of("rt");
        mgc_data_error err;
        mgc_indexed_writer *w;
        T_CHECK(mgc_indexed_writer_open(&w, prefix, dt, &err) == MGC_DATA_OK);
        int64_t total = 0;
        for (int64_t d = 0; d < n_docs; d++) {
            /* a quarter of the documents are empty */
            lens[d] = mgc_data_rng_below(&r, 4) == 0 ? 0 : (int64_t)mgc_data_rng_below(&r, 300);
            docs[d] = malloc((size_t)(lens[d] + 1) * sizeof(int32_t));
            for (int64_t i = 0; i < lens[d]; i++)
                docs[d][i] = (int32_t)mgc_data_rng_below(&r, (uint64_t)vocab);
            T_CHECK(mgc_indexed_writer_add_document(w, docs[d], lens[d], &err) == MGC_DATA_OK);
            total += lens[d];
        }
        T_CHECK(mgc_indexed_writer_finish(w, &err) == MGC_DATA_OK);
        mgc_indexed *ds;
        T_CHECK(mgc_indexed_open(&ds, prefix, &err) == MGC_DATA_OK);
        if (!ds) continue;
        T_EQ_I64(mgc_indexed_sequence_count(ds), n_docs);
        T_EQ_I64(mgc_indexed_document_count(ds), n_docs);
        T_EQ_I64(mgc_indexed_token_count(ds), total);
        T_EQ_I64(mgc_indexed_bin_bytes(ds), total * mgc_data_dtype_bytes(dt));
        int mismatches = 0;
        int32_t *buf = malloc(301 * sizeof *buf);
        for (int64_t d = 0; d < n_docs; d++) {
            mismatches += mgc_indexed_sequence_length(ds, d) != lens[d];
            mismatches += mgc_indexed_document_index(ds, d) != d;
            if (mgc_indexed_read(ds, d, 0, lens[d], buf, &err) != MGC_DATA_OK ||
                (lens[d] && memcmp(buf, docs[d], (size_t)lens[d] * sizeof *buf)))
                mismatches++;
            free(docs[d]);
        }
        T_EQ_I64(mismatches, 0);
        free(buf);
        free(docs);
        free(lens);
        mgc_indexed_free(ds);
        remove_prefix(prefix);
    }
    /* all documents empty: an empty .bin maps as nothing */
    const char *prefix = path_of("empty");
    mgc_data_error err;
    mgc_indexed_writer *w;
    mgc_indexed_writer_open(&w, prefix, MGC_DTYPE_UINT16, &err);
    mgc_indexed_writer_add_document(w, NULL, 0, &err);
    T_CHECK(mgc_indexed_writer_finish(w, &err) == MGC_DATA_OK);
    mgc_indexed *ds;
    T_CHECK(mgc_indexed_open(&ds, prefix, &err) == MGC_DATA_OK);
    if (ds) {
        int32_t t;
        T_CHECK(mgc_indexed_read(ds, 0, 0, 0, &t, &err) == MGC_DATA_OK);
        T_EQ_I64(mgc_indexed_token_count(ds), 0);
        mgc_gpt_config c = {.seq_length = 4, .num_samples = 1, .seed = 1, .end_sequence = -1};
        mgc_gpt_dataset *g;
        T_CHECK(mgc_gpt_dataset_build(&g, ds, &c, &err) == MGC_DATA_ERR_INVALID);
        mgc_indexed_free(ds);
    }
    remove_prefix(prefix);
}

/* ---- tokenizer ------------------------------------------------------------------ */

static void test_tokenizer(void) {
    const char s[] = "hi\xff\n";
    int32_t t[8];
    T_EQ_I64(mgc_byte_encode(s, 4, t), 4);
    T_CHECK(t[0] == 'h' && t[2] == 255 && t[3] == '\n');
    t[4] = MGC_BYTE_EOD;
    t[5] = 999;
    char out[16];
    T_EQ_U64(mgc_byte_decode(t, 6, out, sizeof out, 0), 5);
    T_CHECK(!memcmp(out, "hi\xff\n?", 6));
    T_EQ_U64(mgc_byte_decode(t, 6, out, sizeof out, 1), 6);
    T_CHECK(!memcmp(out, "hi\xff\n\n?", 7));
    T_EQ_U64(mgc_byte_decode(t, 6, out, 3, 1), 6); /* truncated, still terminated */
    T_STREQ(out, "hi");
}

/* ---- GPT dataset indices ------------------------------------------------------ */

/* A dataset of `n_docs` random documents (some empty), token = (doc << 10) + i,
 * so every token says where it came from. */
static mgc_indexed *make_dataset(const char *name, int64_t n_docs, uint64_t seed) {
    mgc_data_rng r;
    mgc_data_rng_seed(&r, seed);
    mgc_data_error err;
    mgc_indexed_writer *w;
    if (mgc_indexed_writer_open(&w, path_of(name), MGC_DTYPE_INT32, &err)) return NULL;
    int32_t t[64];
    for (int64_t d = 0; d < n_docs; d++) {
        int64_t len = mgc_data_rng_below(&r, 5) == 0 ? 0 : 1 + (int64_t)mgc_data_rng_below(&r, 40);
        for (int64_t i = 0; i < len; i++)
            t[i] = (int32_t)((d << 10) + i);
        mgc_indexed_writer_add_document(w, t, len, &err);
    }
    if (mgc_indexed_writer_finish(w, &err)) return NULL;
    mgc_indexed *ds;
    return mgc_indexed_open(&ds, path_of(name), &err) ? NULL : ds;
}

static void test_gpt(void) {
    mgc_indexed *ds = make_dataset("gpt", 50, 7);
    T_CHECK(ds != NULL);
    if (!ds) return;
    mgc_data_error err;
    const int64_t seq = 7;
    /* several epochs; a final epoch below 80% is shuffled apart */
    int64_t tokens = mgc_indexed_token_count(ds);
    int64_t want = (int64_t)(2.3 * (double)tokens) / seq;
    mgc_gpt_config c = {.seq_length = seq, .num_samples = want, .seed = 1234, .end_sequence = -1};
    mgc_gpt_dataset *g;
    T_CHECK(mgc_gpt_dataset_build(&g, ds, &c, &err) == MGC_DATA_OK);
    if (!g) return;
    T_EQ_I64(mgc_gpt_dataset_epochs(g), 3);
    int64_t n_samples, n_doc;
    const int64_t *si = mgc_gpt_dataset_sample_index(g, &n_samples);
    const int64_t *di = mgc_gpt_dataset_document_index(g, &n_doc);
    T_CHECK(n_samples >= want);
    T_EQ_I64(n_samples, (3 * tokens - 1) / seq);
    T_EQ_I64(n_doc, 150);
    /* 2.3 epochs: the final one is < 80% used, so it is shuffled apart: the
     * first two epochs hold every document twice, the last one once */
    int bad = 0, seen_head[50] = {0}, seen_tail[50] = {0};
    for (int64_t k = 0; k < 100; k++)
        seen_head[di[k]]++;
    for (int64_t k = 100; k < 150; k++)
        seen_tail[di[k]]++;
    for (int k = 0; k < 50; k++)
        bad += seen_head[k] != 2 || seen_tail[k] != 1;
    T_EQ_I64(bad, 0);
    /* and the samples of the first two epochs are shuffled apart from the rest */
    int64_t n_sh, head = (2 * tokens - 1) / seq, bad_head = 0;
    const int64_t *shf = mgc_gpt_dataset_shuffle_index(g, &n_sh);
    for (int64_t i = 0; i < n_sh; i++)
        bad_head += (i < head) != (shf[i] < head);
    T_EQ_I64(bad_head, 0);
    /* the token stream the document index spells */
    int32_t *stream = malloc((size_t)(3 * tokens) * sizeof *stream);
    int64_t *doc_pos = malloc((size_t)(3 * tokens) * sizeof *doc_pos);
    int64_t *doc_off = malloc((size_t)(3 * tokens) * sizeof *doc_off);
    int64_t m = 0;
    for (int64_t k = 0; k < n_doc; k++) {
        int64_t len = mgc_indexed_sequence_length(ds, di[k]);
        mgc_indexed_read(ds, di[k], 0, len, stream + m, &err);
        for (int64_t i = 0; i < len; i++, m++) {
            doc_pos[m] = k;
            doc_off[m] = i;
        }
    }
    T_EQ_I64(m, 3 * tokens);
    /* sample j holds stream[j*seq .. j*seq + seq]: every token covered, one shared */
    int32_t *s = malloc((size_t)(seq + 1) * sizeof *s),
            *prev = malloc((size_t)(seq + 1) * sizeof *s);
    int bad_index = 0, bad_tokens = 0, bad_overlap = 0;
    for (int64_t j = 0; j <= n_samples; j++) {
        int64_t p = j * seq; /* Megatron's entry names the token at p */
        bad_index += si[2 * j] != doc_pos[p] || si[2 * j + 1] != doc_off[p];
        if (j == n_samples) break;
        T_CHECK(mgc_gpt_dataset_sample_unshuffled(g, j, s, &err) == MGC_DATA_OK);
        bad_tokens += memcmp(s, stream + p, (size_t)(seq + 1) * sizeof *s) != 0;
        if (j > 0) bad_overlap += prev[seq] != s[0];
        memcpy(prev, s, (size_t)(seq + 1) * sizeof *s);
    }
    T_EQ_I64(bad_index, 0);
    T_EQ_I64(bad_tokens, 0);
    T_EQ_I64(bad_overlap, 0);
    /* the shuffle index is a permutation, and served samples follow it */
    int64_t n_shuf;
    const int64_t *sh = mgc_gpt_dataset_shuffle_index(g, &n_shuf);
    T_EQ_I64(n_shuf, n_samples);
    char *seen = calloc((size_t)n_shuf, 1);
    int bad_perm = 0;
    for (int64_t i = 0; i < n_shuf; i++) {
        if (sh[i] < 0 || sh[i] >= n_shuf || seen[sh[i]])
            bad_perm++;
        else
            seen[sh[i]] = 1;
    }
    T_EQ_I64(bad_perm, 0);
    free(seen);
    T_CHECK(mgc_gpt_dataset_sample(g, 5, s, &err) == MGC_DATA_OK);
    T_CHECK(!memcmp(s, stream + sh[5] * seq, (size_t)(seq + 1) * sizeof *s));
    T_CHECK(mgc_gpt_dataset_sample(g, n_samples, s, &err) == MGC_DATA_ERR_INVALID);

    /* determinism: same seed, same indices; another seed, another order */
    mgc_gpt_dataset *g2, *g3;
    T_CHECK(mgc_gpt_dataset_build(&g2, ds, &c, &err) == MGC_DATA_OK);
    c.seed = 1235;
    T_CHECK(mgc_gpt_dataset_build(&g3, ds, &c, &err) == MGC_DATA_OK);
    if (g2 && g3) {
        int64_t n2, n3;
        const int64_t *d2 = mgc_gpt_dataset_document_index(g2, &n2);
        const int64_t *d3 = mgc_gpt_dataset_document_index(g3, &n3);
        T_CHECK(n2 == n_doc && !memcmp(d2, di, (size_t)n_doc * sizeof *di));
        T_CHECK(n3 == n_doc && memcmp(d3, di, (size_t)n_doc * sizeof *di) != 0);
        const int64_t *s2 = mgc_gpt_dataset_shuffle_index(g2, &n2);
        const int64_t *s3 = mgc_gpt_dataset_shuffle_index(g3, &n3);
        T_CHECK(!memcmp(s2, sh, (size_t)n_shuf * sizeof *sh));
        T_CHECK(memcmp(s3, sh, (size_t)(n3 < n_shuf ? n3 : n_shuf) * sizeof *sh) != 0);
    }
    mgc_gpt_dataset_free(g2);
    mgc_gpt_dataset_free(g3);

    /* a split: only its documents appear */
    c.first_sequence = 10;
    c.end_sequence = 20;
    c.num_samples = 3;
    mgc_gpt_dataset *gs;
    T_CHECK(mgc_gpt_dataset_build(&gs, ds, &c, &err) == MGC_DATA_OK);
    if (gs) {
        int64_t nd;
        const int64_t *d = mgc_gpt_dataset_document_index(gs, &nd);
        int outside = 0;
        for (int64_t k = 0; k < nd; k++)
            outside += d[k] < 10 || d[k] >= 20;
        T_EQ_I64(outside, 0);
        T_EQ_I64(mgc_gpt_dataset_epochs(gs), 1);
    }
    mgc_gpt_dataset_free(gs);
    c.end_sequence = 51;
    T_CHECK(mgc_gpt_dataset_build(&gs, ds, &c, &err) == MGC_DATA_ERR_INVALID);

    free(stream);
    free(doc_pos);
    free(doc_off);
    free(s);
    free(prev);
    mgc_gpt_dataset_free(g);
    mgc_indexed_free(ds);
    remove_prefix(path_of("gpt"));

    /* PRNG reference values (splitmix64 from 0: the published first output) */
    uint64_t st = 0;
    T_EQ_U64(mgc_splitmix64(&st), 0xe220a8397b1dcdafull);
    mgc_data_rng r1, r2;
    mgc_data_rng_seed(&r1, 99);
    mgc_data_rng_seed(&r2, 99);
    T_EQ_U64(mgc_data_rng_next(&r1), mgc_data_rng_next(&r2));
}

/* ---- splits and blending --------------------------------------------------------- */

static void test_split(void) {
    double w[3];
    mgc_data_error err;
    T_CHECK(mgc_data_split_parse("969,30,1", w, &err) == MGC_DATA_OK);
    T_NEAR_REL(w[0], 0.969, 1e-12);
    int64_t b[4];
    mgc_data_split_bounds(w, 1000, b);
    T_CHECK(b[0] == 0 && b[1] == 969 && b[2] == 999 && b[3] == 1000);
    mgc_data_split_bounds(w, 10, b); /* 9.69 -> 10, 0.3 -> 0, 0.01 -> 0 */
    T_CHECK(b[0] == 0 && b[1] == 10 && b[2] == 10 && b[3] == 10);
    T_CHECK(mgc_data_split_parse("1", w, &err) == MGC_DATA_OK && w[0] == 1 && w[2] == 0);
    T_CHECK(mgc_data_split_parse("98,2", w, &err) == MGC_DATA_OK);
    mgc_data_split_bounds(w, 7, b); /* 6.86 -> 7, 0.14 -> 0 */
    T_CHECK(b[1] == 7 && b[3] == 7);
    T_CHECK(mgc_data_split_parse("1,2,3,4", w, &err) == MGC_DATA_ERR_INVALID);
    T_CHECK(mgc_data_split_parse("a", w, &err) == MGC_DATA_ERR_INVALID);
    T_CHECK(mgc_data_split_parse("1;2", w, &err) == MGC_DATA_ERR_INVALID);
    T_CHECK(mgc_data_split_parse("0,0", w, &err) == MGC_DATA_ERR_INVALID);
    T_CHECK(mgc_data_split_parse("-1,2", w, &err) == MGC_DATA_ERR_INVALID);
}

static void test_blend(void) {
    mgc_data_error err;
    const double w[3] = {5, 3, 2}; /* normalised to 0.5, 0.3, 0.2 */
    const int64_t n = 10000;
    mgc_blend *b;
    T_CHECK(mgc_blend_build(&b, w, 3, n, &err) == MGC_DATA_OK);
    if (!b) return;
    int64_t drawn[3] = {0, 0, 0};
    int bad_prefix = 0, bad_order = 0;
    for (int64_t i = 0; i < n; i++) {
        int32_t d = mgc_blend_dataset_index(b, i);
        bad_order += mgc_blend_dataset_sample_index(b, i) != drawn[d];
        drawn[d]++;
        /* the greedy rule keeps every prefix within a sample of its share */
        for (int k = 0; k < 3; k++)
            bad_prefix += fabs((double)drawn[k] - mgc_blend_weight(b, k) * (double)(i + 1)) > 1.0;
    }
    T_EQ_I64(bad_order, 0);
    T_EQ_I64(bad_prefix, 0);
    for (int k = 0; k < 3; k++) {
        T_EQ_I64(mgc_blend_drawn(b, k), drawn[k]);
        T_NEAR_REL(drawn[k], mgc_blend_weight(b, k) * n, 0.001);
        T_CHECK(drawn[k] <= mgc_blend_requested(b, k));
    }
    T_EQ_I64(mgc_blend_requested(b, 0), 5025); /* ceil(5000 * 1.005) */
    T_EQ_I64(mgc_blend_requested(b, 1), 3015);
    T_EQ_I64(mgc_blend_requested(b, 2), 2010);
    /* Megatron's first picks: i = 0 and 1 both measure at max(i, 1) = 1 */
    T_EQ_I64(mgc_blend_dataset_index(b, 0), 0);
    T_EQ_I64(mgc_blend_dataset_index(b, 1), 1);
    mgc_blend_free(b);

    /* end to end: three GPT datasets asked for their requested counts */
    const int64_t n_small = 300;
    T_CHECK(mgc_blend_build(&b, w, 3, n_small, &err) == MGC_DATA_OK);
    mgc_indexed *ds[3];
    mgc_gpt_dataset *g[3] = {NULL, NULL, NULL};
    const char *names[3] = {"blend0", "blend1", "blend2"};
    int ok = 1;
    for (int k = 0; k < 3; k++) {
        ds[k] = make_dataset(names[k], 30 + 10 * k, 100 + (uint64_t)k);
        mgc_gpt_config c = {.seq_length = 16,
                            .num_samples = mgc_blend_requested(b, k),
                            .seed = 5,
                            .end_sequence = -1};
        ok &= ds[k] && mgc_gpt_dataset_build(&g[k], ds[k], &c, &err) == MGC_DATA_OK;
    }
    T_CHECK(ok);
    if (ok) {
        int32_t s[17];
        int bad = 0;
        for (int64_t i = 0; i < n_small; i++)
            bad += mgc_blend_sample(b, g, i, s, &err) != 0;
        T_EQ_I64(bad, 0);
    }
    for (int k = 0; k < 3; k++) {
        mgc_gpt_dataset_free(g[k]);
        mgc_indexed_free(ds[k]);
        remove_prefix(path_of(names[k]));
    }
    mgc_blend_free(b);
    const double zero[2] = {0, 0};
    T_CHECK(mgc_blend_build(&b, zero, 2, 10, &err) == MGC_DATA_ERR_INVALID);
}

/* ---- the synthetic corpus ----------------------------------------------------------- */

static void test_synthetic(void) {
    char a[MGC_SYNTHETIC_MAX_DOCUMENT_BYTES], b[MGC_SYNTHETIC_MAX_DOCUMENT_BYTES];
    int same = 0, differ = 0, bad_sum = 0, sums = 0;
    int64_t total = 0;
    for (int64_t i = 0; i < 400; i++) {
        size_t na = mgc_synthetic_document(1234, i, a, sizeof a);
        size_t nb = mgc_synthetic_document(1234, i, b, sizeof b);
        same += na == nb && !memcmp(a, b, na);
        nb = mgc_synthetic_document(99, i, b, sizeof b);
        differ += na != nb || memcmp(a, b, na) != 0;
        T_CHECK(na > 20 && na < MGC_SYNTHETIC_MAX_DOCUMENT_BYTES);
        total += (int64_t)na;
        /* arithmetic facts are true */
        for (char *line = a; *line; line = strchr(line, '\n') + 1) {
            long x, y, z;
            char op;
            if (sscanf(line, "%ld%c%ld=%ld", &x, &op, &y, &z) == 4 && (op == '+' || op == '-')) {
                sums++;
                bad_sum += (op == '+' ? x + y : x - y) != z;
            }
            if (!strchr(line, '\n')) break;
        }
    }
    T_EQ_I64(same, 400);
    T_CHECK(differ > 390);
    T_CHECK(sums > 100);
    T_EQ_I64(bad_sum, 0);
    T_CHECK(total / 400 > 100 && total / 400 < 600);

    /* the written corpus is byte-for-byte deterministic */
    mgc_data_error err;
    T_CHECK(mgc_synthetic_write(path_of("syn1"), 300, 7, &err) == MGC_DATA_OK);
    T_CHECK(mgc_synthetic_write(path_of("syn2"), 300, 7, &err) == MGC_DATA_OK);
    const char *ext[2] = {".idx", ".bin"};
    for (int k = 0; k < 2; k++) {
        char p1[300], p2[300];
        snprintf(p1, sizeof p1, "%s%s", path_of("syn1"), ext[k]);
        snprintf(p2, sizeof p2, "%s%s", path_of("syn2"), ext[k]);
        size_t n1 = 0, n2 = 0;
        unsigned char *b1 = read_bytes(p1, &n1), *b2 = read_bytes(p2, &n2);
        T_CHECK(b1 && b2 && n1 == n2 && n1 > 0 && !memcmp(b1, b2, n1));
        free(b1);
        free(b2);
    }
    mgc_indexed *ds;
    T_CHECK(mgc_indexed_open(&ds, path_of("syn1"), &err) == MGC_DATA_OK);
    if (ds) {
        T_EQ_U64(mgc_indexed_dtype(ds), MGC_DTYPE_UINT16);
        T_EQ_I64(mgc_indexed_document_count(ds), 300);
        int32_t t[MGC_SYNTHETIC_MAX_DOCUMENT_BYTES + 1];
        int64_t len = mgc_indexed_sequence_length(ds, 3);
        mgc_indexed_read(ds, 3, 0, len, t, &err);
        size_t n = mgc_synthetic_document(7, 3, a, sizeof a);
        T_EQ_I64(len, (int64_t)n + 1);
        T_EQ_I64(t[len - 1], MGC_BYTE_EOD);
        mgc_byte_decode(t, len, b, sizeof b, 0);
        T_STREQ(b, a);
        mgc_indexed_free(ds);
    }
    remove_prefix(path_of("syn1"));
    remove_prefix(path_of("syn2"));
}

/* ---- `mgc data` ---------------------------------------------------------------- */

static int run_cli(const char *a0, const char *a1, const char *a2, const char *a3, const char *a4,
                   const char *a5) {
    char *argv[7] = {(char *)a0, (char *)a1, (char *)a2, (char *)a3, (char *)a4, (char *)a5, NULL};
    int argc = 0;
    while (argc < 6 && argv[argc])
        argc++;
    fflush(stdout);
    return mgc_cmd_data(argc, argv);
}

static void test_cli(void) {
    const char *text = path_of("input.txt");
    const char doc[] = "first para\nline two\n\n  \nsecond para\n\n\nthird\n";
    write_bytes(text, (const unsigned char *)doc, sizeof doc - 1);
    char prefix[300];
    snprintf(prefix, sizeof prefix, "%s", path_of("cli"));
    mgc_indexed *ds;
    mgc_data_error err;
    const int64_t want_docs[3] = {3, 4, 1}; /* blank, line, file */
    const char *modes[3] = {"blank", "line", "file"};
    for (int k = 0; k < 3; k++) {
        T_EQ_I64(run_cli("build", prefix, text, "--append-eod", "--split", modes[k]), 0);
        T_CHECK(mgc_indexed_open(&ds, prefix, &err) == MGC_DATA_OK);
        if (!ds) continue;
        T_EQ_I64(mgc_indexed_document_count(ds), want_docs[k]);
        int32_t t[64];
        int64_t len = mgc_indexed_sequence_length(ds, 0);
        mgc_indexed_read(ds, 0, 0, len, t, &err);
        char s[64];
        mgc_byte_decode(t, len, s, sizeof s, 1);
        T_STREQ(s, k == 0   ? "first para\nline two\n\n"
                   : k == 1 ? "first para\n"
                            : "first para\nline two\n\n  \nsecond para\n\n\nthird\n\n");
        mgc_indexed_free(ds);
    }
    T_EQ_I64(run_cli("info", prefix, NULL, NULL, NULL, NULL), 0);
    T_EQ_I64(run_cli("synthetic", prefix, "--documents", "50", "--seed", "3"), 0);
    T_EQ_I64(run_cli("info", prefix, NULL, NULL, NULL, NULL), 0);
    remove_prefix(prefix);
    /* errors */
    T_EQ_I64(run_cli("info", prefix, NULL, NULL, NULL, NULL), 1);
    T_EQ_I64(run_cli("build", prefix, path_of("no-such.txt"), NULL, NULL, NULL), 1);
    char p[320];
    snprintf(p, sizeof p, "%s.bin", prefix);
    T_CHECK(access(p, F_OK) != 0); /* nothing half-written */
    T_EQ_I64(run_cli("build", prefix, NULL, NULL, NULL, NULL), 2);
    T_EQ_I64(run_cli("build", prefix, text, "--split", "words", NULL), 2);
    T_EQ_I64(run_cli("synthetic", prefix, "--documents", "0", NULL, NULL), 2);
    T_EQ_I64(run_cli("synthetic", NULL, NULL, NULL, NULL, NULL), 2);
    T_EQ_I64(run_cli("frobnicate", NULL, NULL, NULL, NULL, NULL), 2);
    remove(text);
}

int main(void) {
    snprintf(tmp_dir, sizeof tmp_dir, "/tmp/mgc_test_data_XXXXXX");
    if (!mkdtemp(tmp_dir)) {
        perror("mkdtemp");
        return 1;
    }
    test_fixture();
    test_corrupt();
    test_round_trip();
    test_tokenizer();
    test_gpt();
    test_split();
    test_blend();
    test_synthetic();
    test_cli();
    remove_prefix(path_of("fixture_r"));
    rmdir(tmp_dir);
    return t_summary("test_data");
}
