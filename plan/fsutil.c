/* fsutil.c - file-system helpers shared by the compiler and the runtime
 * (declared in plan.h).  libc + POSIX only. */
#include <sys/stat.h>

#include "plan.h"

int mgc_path_is_special(const char *path) {
    struct stat st;
    return path && stat(path, &st) == 0 && !S_ISREG(st.st_mode) && !S_ISDIR(st.st_mode);
}
