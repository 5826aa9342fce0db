/* readfile.c - see readfile.h. */
#include "readfile.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>

char *mgc_read_file(const char *path, size_t limit, size_t *len) {
    *len = 0;
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    size_t cap = 1 << 14, n = 0;
    char *buf = malloc(cap + 1);
    int e = buf ? 0 : ENOMEM;
    while (!e) {
        if (n == cap) {
            if (limit && cap >= limit) {
                e = EFBIG;
                break;
            }
            char *nb = realloc(buf, cap * 2 + 1);
            if (!nb) {
                e = ENOMEM;
                break;
            }
            buf = nb, cap *= 2;
        }
        size_t r = fread(buf + n, 1, cap - n, f);
        n += r;
        if (r == 0) {
            if (ferror(f)) e = EIO;
            break;
        }
    }
    fclose(f);
    if (!e && limit && n > limit) e = EFBIG;
    if (e) {
        free(buf);
        errno = e;
        return NULL;
    }
    buf[n] = 0;
    *len = n;
    return buf;
}
