/* readfile.h - a whole file into memory, for the commands that read one
 * (hardware profiles, sweep bases, mgc data's text inputs).
 *
 *     size_t n;
 *     char *text = mgc_read_file("model.yaml", 4u << 20, &n);
 *     if (!text) fprintf(stderr, "%s\n", strerror(errno));
 */
#ifndef MGC_READFILE_H
#define MGC_READFILE_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* All of `path` in a malloc'd buffer with a NUL after the last byte (*len
 * excludes it).  NULL with errno set on failure: fopen's errno, EFBIG past
 * `limit` bytes (0: no limit), EIO on a read error, ENOMEM. */
char *mgc_read_file(const char *path, size_t limit, size_t *len);

#ifdef __cplusplus
}
#endif
#endif /* MGC_READFILE_H */
