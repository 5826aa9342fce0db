/* tokenizer.c - byte-level tokenizer (see tokenizer.h). */
#include "tokenizer.h"

int64_t mgc_byte_encode(const char *text, size_t n_bytes, int32_t *out) {
    const unsigned char *p = (const unsigned char *)text;
    for (size_t i = 0; i < n_bytes; i++)
        out[i] = p[i];
    return (int64_t)n_bytes;
}

size_t mgc_byte_decode(const int32_t *tokens, int64_t n_tokens, char *text, size_t cap,
                       int eod_as_newline) {
    size_t n = 0;
    for (int64_t i = 0; i < n_tokens; i++) {
        int32_t t = tokens[i];
        int c;
        if (t >= 0 && t < 256)
            c = t;
        else if (t == MGC_BYTE_EOD)
            c = eod_as_newline ? '\n' : -1;
        else
            c = '?';
        if (c < 0) continue;
        if (n + 1 < cap) text[n] = (char)c;
        n++;
    }
    if (cap > 0) text[n < cap ? n : cap - 1] = '\0';
    return n;
}
