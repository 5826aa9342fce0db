/* testlib.h - the tiny assertion kit every test binary uses.
 *
 *     int main(void) {
 *         T_CHECK(1 + 1 == 2);
 *         T_EQ_U64(x, 124439808u);
 *         return t_summary("test_facts");   // prints "test_facts: N checks, 0 failed"
 *     }
 * A failed check prints file:line and the values and the run goes on; the
 * exit status is 1 when any check failed. */
#ifndef MGC_TESTLIB_H
#define MGC_TESTLIB_H

#include <dirent.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

/* Counted atomically: a test may check from several threads (ranks as threads). */
static int t_checks, t_failed;
#define T_COUNT_(n) __atomic_add_fetch(&(n), 1, __ATOMIC_RELAXED)

#define T_CHECK(cond)                                                                               \
    do {                                                                                            \
        T_COUNT_(t_checks);                                                                         \
        if (!(cond)) {                                                                              \
            T_COUNT_(t_failed);                                                                     \
            fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__, #cond);                \
        }                                                                                           \
    } while (0)

#define T_EQ_U64(a, b)                                                                              \
    do {                                                                                            \
        uint64_t t_a = (uint64_t)(a), t_b = (uint64_t)(b);                                          \
        T_COUNT_(t_checks);                                                                         \
        if (t_a != t_b) {                                                                           \
            T_COUNT_(t_failed);                                                                     \
            fprintf(stderr, "%s:%d: %s == %s failed: %" PRIu64 " != %" PRIu64 "\n", __FILE__,       \
                    __LINE__, #a, #b, t_a, t_b);                                                    \
        }                                                                                           \
    } while (0)

#define T_EQ_I64(a, b)                                                                              \
    do {                                                                                            \
        int64_t t_a = (int64_t)(a), t_b = (int64_t)(b);                                             \
        T_COUNT_(t_checks);                                                                         \
        if (t_a != t_b) {                                                                           \
            T_COUNT_(t_failed);                                                                     \
            fprintf(stderr, "%s:%d: %s == %s failed: %" PRId64 " != %" PRId64 "\n", __FILE__,       \
                    __LINE__, #a, #b, t_a, t_b);                                                    \
        }                                                                                           \
    } while (0)

/* |a - b| <= rel * |b| */
#define T_NEAR_REL(a, b, rel)                                                                       \
    do {                                                                                            \
        double t_a = (double)(a), t_b = (double)(b);                                                \
        T_COUNT_(t_checks);                                                                         \
        if (!(fabs(t_a - t_b) <= (rel) * fabs(t_b))) {                                              \
            T_COUNT_(t_failed);                                                                     \
            fprintf(stderr, "%s:%d: %s ~ %s failed: %.17g vs %.17g (rel %.3g)\n", __FILE__,         \
                    __LINE__, #a, #b, t_a, t_b, fabs(t_a - t_b) / (fabs(t_b) > 0 ? fabs(t_b) : 1)); \
        }                                                                                           \
    } while (0)

#define T_STREQ(a, b)                                                                               \
    do {                                                                                            \
        const char *t_a = (a), *t_b = (b);                                                          \
        T_COUNT_(t_checks);                                                                         \
        if (!t_a || !t_b || strcmp(t_a, t_b) != 0) {                                                \
            T_COUNT_(t_failed);                                                                     \
            fprintf(stderr, "%s:%d: %s == %s failed: \"%s\" != \"%s\"\n", __FILE__, __LINE__, #a,  \
                    #b, t_a ? t_a : "(null)", t_b ? t_b : "(null)");                                \
        }                                                                                           \
    } while (0)

/* Removes a test's scratch directory and the files in it (one level). */
static inline void t_remove_dir(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return;
    char p[1024];
    for (struct dirent *e; (e = readdir(d));)
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) {
            snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
            unlink(p);
        }
    closedir(d);
    rmdir(dir);
}

/* 1 in a build with AddressSanitizer or ThreadSanitizer: the CUDA emulator's fibers switch
 * stacks under their feet, so the tests that run it skip themselves (77) there */
static inline int t_sanitized(void) {
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
    return 1;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
    return 1;
#endif
#endif
    return 0;
}

static inline int t_summary(const char *name) {
    int checks = __atomic_load_n(&t_checks, __ATOMIC_SEQ_CST);
    int failed = __atomic_load_n(&t_failed, __ATOMIC_SEQ_CST);
    printf("%s: %d checks, %d failed\n", name, checks, failed);
    return failed ? 1 : 0;
}

#endif
