/* indexed.h - Megatron's indexed dataset (PREFIX.idx + PREFIX.bin), libc only.
 *
 * The format (docs/data.md has the byte table): PREFIX.bin is the raw
 * concatenation of every sequence's tokens in one dtype; PREFIX.idx is
 *
 *     "MMIDIDX\0\0" | u64 version = 1 | u8 dtype | u64 N | u64 D
 *     | int32 sequence_lengths[N] | int64 sequence_pointers[N]
 *     | int64 document_indices[D]            (D = documents + 1, ends at N)
 *
 * all little-endian, no padding, so the arrays are NOT aligned: the reader
 * decodes them through accessors instead of handing out pointers.
 *
 *     mgc_data_error err;
 *     mgc_indexed_writer *w;
 *     if (mgc_indexed_writer_open(&w, "out/corpus", MGC_DTYPE_UINT16, &err)) goto fail;
 *     mgc_indexed_writer_add_document(w, tokens, n_tokens, &err);   // one sequence + end
 *     mgc_indexed_writer_finish(w, &err);       // writes .bin/.idx atomically, frees w
 *
 *     mgc_indexed *ds;
 *     if (mgc_indexed_open(&ds, "out/corpus", &err)) fprintf(stderr, "%s\n", err.message);
 *     int32_t buf[16];
 *     mgc_indexed_read(ds, 0, 0, 16, buf, &err);  // sequence 0, tokens [0, 16)
 *     mgc_indexed_free(ds);
 *
 * Every fallible function returns an mgc_data_status and, when `err` is not
 * NULL, leaves a one-line message naming the file, what is wrong and a hint.
 */
#ifndef MGC_DATA_INDEXED_H
#define MGC_DATA_INDEXED_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum mgc_data_status {
    MGC_DATA_OK = 0,
    MGC_DATA_ERR_IO,      /* a file could not be opened, read, written or mapped */
    MGC_DATA_ERR_FORMAT,  /* a file is not a valid indexed dataset (corrupt, truncated) */
    MGC_DATA_ERR_INVALID, /* a bad argument: token out of range, index past the end, ... */
    MGC_DATA_ERR_NOMEM,   /* an allocation failed */
} mgc_data_status;

#define MGC_DATA_ERROR_LEN 512
typedef struct mgc_data_error {
    char message[MGC_DATA_ERROR_LEN]; /* one line, no trailing newline; "" when OK */
} mgc_data_error;

/* "ok", "i/o error", ... */
const char *mgc_data_status_name(mgc_data_status s);

/* Megatron's dtype codes (indexed_dataset.py DType). */
typedef enum mgc_data_dtype {
    MGC_DTYPE_UINT8 = 1,
    MGC_DTYPE_INT8 = 2,
    MGC_DTYPE_INT16 = 3,
    MGC_DTYPE_INT32 = 4,
    MGC_DTYPE_INT64 = 5,
    MGC_DTYPE_FLOAT64 = 6, /* readable header, but not token data: rejected by the reader */
    MGC_DTYPE_FLOAT32 = 7, /* likewise */
    MGC_DTYPE_UINT16 = 8,
} mgc_data_dtype;

#define MGC_INDEXED_MAGIC        "MMIDIDX\0\0"
#define MGC_INDEXED_MAGIC_BYTES  9
#define MGC_INDEXED_VERSION      1
#define MGC_INDEXED_HEADER_BYTES 34 /* magic + version + dtype + N + D */

/* Bytes per element of `dtype`; 0 for an unknown code. */
int64_t mgc_data_dtype_bytes(int dtype);
/* "uint16", ...; "unknown" for an unknown code. */
const char *mgc_data_dtype_name(int dtype);
/* Megatron's DType.optimal_dtype: uint16 when vocab_size < 65500, else int32. */
mgc_data_dtype mgc_data_dtype_for_vocab(int64_t vocab_size);

/* ---- writer ------------------------------------------------------------ */

typedef struct mgc_indexed_writer mgc_indexed_writer;

/* Starts PREFIX.bin.tmp; nothing appears under the final names until
 * finish().  `dtype` must be an integer dtype. */
mgc_data_status mgc_indexed_writer_open(mgc_indexed_writer **out, const char *prefix,
                                        mgc_data_dtype dtype, mgc_data_error *err);
/* Appends one sequence to the current document (tokens must fit the dtype;
 * an empty sequence is allowed). */
mgc_data_status mgc_indexed_writer_add_sequence(mgc_indexed_writer *w, const int32_t *tokens,
                                                int64_t n_tokens, mgc_data_error *err);
/* Closes the current document (a document may hold 0 or more sequences). */
mgc_data_status mgc_indexed_writer_end_document(mgc_indexed_writer *w, mgc_data_error *err);
/* add_sequence + end_document: Megatron's default, one sequence per document. */
mgc_data_status mgc_indexed_writer_add_document(mgc_indexed_writer *w, const int32_t *tokens,
                                                int64_t n_tokens, mgc_data_error *err);
/* Writes PREFIX.idx.tmp, then renames .bin.tmp -> .bin and .idx.tmp -> .idx
 * (the .idx last, so a reader never sees a new index over an old .bin).
 * Sequences added after the last end_document form one more document.
 * Frees `w` whatever the outcome; on failure the temporaries are removed. */
mgc_data_status mgc_indexed_writer_finish(mgc_indexed_writer *w, mgc_data_error *err);
/* Abandons the writer: removes the temporaries.  NULL is a no-op. */
void mgc_indexed_writer_free(mgc_indexed_writer *w);

/* ---- reader ------------------------------------------------------------ */

typedef struct mgc_indexed mgc_indexed;

/* Maps PREFIX.idx and PREFIX.bin and validates them fully: magic, version,
 * dtype, N and D against the .idx size, lengths >= 0, pointers increasing,
 * non-overlapping and inside the .bin, document_indices from 0 to N. */
mgc_data_status mgc_indexed_open(mgc_indexed **out, const char *prefix, mgc_data_error *err);
void mgc_indexed_free(mgc_indexed *ds);

mgc_data_dtype mgc_indexed_dtype(const mgc_indexed *ds);
int64_t mgc_indexed_sequence_count(const mgc_indexed *ds); /* N */
int64_t mgc_indexed_document_count(const mgc_indexed *ds); /* D - 1 */
int64_t mgc_indexed_token_count(const mgc_indexed *ds);    /* sum of sequence lengths */
int64_t mgc_indexed_bin_bytes(const mgc_indexed *ds);      /* size of PREFIX.bin */
/* Accessors; indices are checked by assert (programmer errors). */
int64_t mgc_indexed_sequence_length(const mgc_indexed *ds, int64_t seq);  /* tokens */
int64_t mgc_indexed_sequence_pointer(const mgc_indexed *ds, int64_t seq); /* byte offset in .bin */
int64_t mgc_indexed_document_index(const mgc_indexed *ds, int64_t j);     /* j in [0, D) */

/* Copies tokens [offset, offset + count) of sequence `seq` into out[count],
 * converting from the file's dtype; a token that does not fit int32 is an error. */
mgc_data_status mgc_indexed_read(const mgc_indexed *ds, int64_t seq, int64_t offset, int64_t count,
                                 int32_t *out, mgc_data_error *err);

#ifdef __cplusplus
}
#endif

#endif
