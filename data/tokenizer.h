/* tokenizer.h - the byte-level tokenizer: token = byte value (0..255), plus
 * one end-of-document token 256.  Vocabulary 257, so datasets are uint16.
 *
 *     int32_t toks[64];
 *     int64_t n = mgc_byte_encode("hello", 5, toks);   // 5 tokens
 *     toks[n++] = MGC_BYTE_EOD;
 *     char text[64];
 *     mgc_byte_decode(toks, n, text, sizeof text);     // "hello" + EOD marker dropped
 */
#ifndef MGC_DATA_TOKENIZER_H
#define MGC_DATA_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define MGC_BYTE_VOCAB 257 /* 256 bytes + EOD */
#define MGC_BYTE_EOD   256 /* end-of-document token */

/* Writes `n_bytes` tokens to out[n_bytes]; returns n_bytes. */
int64_t mgc_byte_encode(const char *text, size_t n_bytes, int32_t *out);

/* Decodes tokens into text[cap] (always NUL-terminated when cap > 0):
 * bytes are copied, EOD is written as "\n" when `eod_as_newline`, else
 * dropped, and any token outside [0, 257) as '?'.  Returns the length the
 * full decoding needs (excluding the NUL), like snprintf. */
size_t mgc_byte_decode(const int32_t *tokens, int64_t n_tokens, char *text, size_t cap,
                       int eod_as_newline);

#ifdef __cplusplus
}
#endif

#endif
