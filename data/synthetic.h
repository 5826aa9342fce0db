/* synthetic.h - the embedded default dataset: a deterministic synthetic
 * corpus that mgc generates itself (nothing downloaded), regular enough for
 * a tiny byte-level model to learn visibly in a few hundred CPU steps.
 *
 * Each document is 6 to 12 lines of one task, chosen by the document's own
 * PRNG stream (splitmix64 of seed and document number, so any document can
 * be produced alone and the corpus does not depend on its length):
 *
 *   count   "count 7 to 13: 7 8 9 10 11 12 13"        (also "by 2"/"by 3")
 *   arith   "12+7=19"  "31-4=27"                      (operands 0..99)
 *   lookup  "let a=4 k=9 q=1" then "k? 9" "a? 4" ...  (keys are letters)
 *   bracket "([{<>}])"                                (balanced, depth <= 4)
 *   copy    "copy abc|abc"  "rev abcd|dcba"
 *
 * Written with the byte tokenizer, one document per sequence and an EOD
 * token after each (Megatron's --append-eod); about 160 bytes a document,
 * so the default 8000 documents are ~1.3 M tokens (2.6 MB as uint16). */
#ifndef MGC_DATA_SYNTHETIC_H
#define MGC_DATA_SYNTHETIC_H

#include <stddef.h>
#include <stdint.h>

#include "indexed.h"

#ifdef __cplusplus
extern "C" {
#endif

#define MGC_SYNTHETIC_DEFAULT_DOCUMENTS  8000
#define MGC_SYNTHETIC_DEFAULT_SEED       1234
#define MGC_SYNTHETIC_MAX_DOCUMENT_BYTES 2048 /* a document never exceeds this */

/* Writes document `i` of the corpus for `seed` into buf[cap] (NUL-terminated
 * when cap > 0); returns its length in bytes (excluding the NUL), at most
 * MGC_SYNTHETIC_MAX_DOCUMENT_BYTES - 1. */
size_t mgc_synthetic_document(uint64_t seed, int64_t i, char *buf, size_t cap);

/* Writes documents [0, n_documents) as PREFIX.idx/.bin (uint16, EOD appended). */
mgc_data_status mgc_synthetic_write(const char *prefix, int64_t n_documents, uint64_t seed,
                                    mgc_data_error *err);

#ifdef __cplusplus
}
#endif

#endif
