/* fuzz_replay.c - runs the fuzz harness over files given on the command line
 * (the seed corpus and every crash ever found), for builds without
 * libFuzzer.  Prints "fuzz_replay: N inputs" and exits 0 unless a sanitizer
 * or a crash stops it. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int main(int argc, char **argv) {
    int n = 0;
    for (int i = 1; i < argc; i++) {
        FILE *f = fopen(argv[i], "rb");
        if (!f) {
            fprintf(stderr, "fuzz_replay: cannot open %s\n", argv[i]);
            return 1;
        }
        size_t cap = 1 << 16, len = 0;
        uint8_t *buf = malloc(cap);
        size_t r;
        while (buf && (r = fread(buf + len, 1, cap - len, f)) > 0) {
            len += r;
            if (len == cap) {
                uint8_t *nb = realloc(buf, cap *= 2);
                if (!nb) break;
                buf = nb;
            }
        }
        fclose(f);
        if (!buf) return 1;
        LLVMFuzzerTestOneInput(buf, len);
        free(buf);
        n++;
    }
    printf("fuzz_replay: %d inputs, 0 failed\n", n);
    return 0;
}
