/* test_gemm_tuning.c - the GEMM tuning file (runtime/gemm_tuning.h), without a GPU: random
 * tables written and read back entry for entry; the choice among timed candidates; the
 * device / library / workspace check; every malformed file refused with its file and line,
 * never half-read; a failed save leaves the old file as it was. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "gemm_tuning.h"
#include "testlib.h"

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static uint64_t next(void) {
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return rng;
}

static mgc_gemm_key random_key(void) {
    mgc_gemm_key k;
    memset(&k, 0, sizeof k);
    k.ta = (int)(next() & 1), k.tb = (int)(next() & 1);
    k.m = 1 + (int64_t)(next() % 60000), k.n = 1 + (int64_t)(next() % 60000);
    k.k = 1 + (int64_t)(next() % 60000);
    k.lda = k.m + (int64_t)(next() % 3), k.ldb = k.k + (int64_t)(next() % 3), k.ldc = k.m;
    k.has_aux = (int)(next() & 1);
    k.aux_ld = k.has_aux ? k.m : 0;
    k.auxtype = k.has_aux ? 14 : 0;
    k.atype = 14, k.btype = (int)(next() % 2) ? 14 : 0, k.ctype = (int)(next() % 3) ? 14 : 0;
    k.epilogue = (int)(next() % 300);
    k.has_bias = (int)(next() & 1);
    k.biastype = k.has_bias ? 14 : 0;
    k.beta1 = (int)(next() & 1);
    return k;
}

static const char *dir;
static char path_buf[512];
static const char *file_with(const char *name, const char *text) {
    snprintf(path_buf, sizeof path_buf, "%s/%s", dir, name);
    FILE *f = fopen(path_buf, "w");
    if (f) {
        fputs(text, f);
        fclose(f);
    }
    return path_buf;
}

static void check_round_trip(void) {
    mgc_gemm_tuning *t = mgc_gemm_tuning_new("NVIDIA H200", 130100, 33554432u);
    T_CHECK(t != NULL);
    if (!t) return;
    enum { N = 200 };
    static mgc_gemm_key keys[N];
    static int picks[N], ns[N];
    static float times[N][MGC_GEMM_TUNING_MAX_CAND];
    for (int i = 0; i < N; i++) {
        keys[i] = random_key();
        ns[i] = 1 + (int)(next() % MGC_GEMM_TUNING_MAX_CAND);
        for (int j = 0; j < ns[i]; j++)
            times[i][j] = next() % 7 == 0 ? -1.0f : (float)(next() % 100000) / 100.0f;
        picks[i] = mgc_gemm_tuning_choose(times[i], ns[i]);
        T_EQ_I64(mgc_gemm_tuning_put(t, &keys[i], picks[i], ns[i], times[i]), 0);
    }
    /* a second put of the same key replaces its entry */
    float two[2] = {5.0f, 4.0f};
    T_EQ_I64(mgc_gemm_tuning_put(t, &keys[0], 1, 2, two), 0);
    picks[0] = 1, ns[0] = 2, times[0][0] = 5.0f, times[0][1] = 4.0f;
    T_EQ_I64(t->n, N);
    /* out of range: refused, nothing added */
    T_EQ_I64(mgc_gemm_tuning_put(t, &keys[1], 3, 3, two), -1);
    T_EQ_I64(mgc_gemm_tuning_put(t, &keys[1], 0, MGC_GEMM_TUNING_MAX_CAND + 1, two), -1);
    char err[512];
    const char *p = file_with("t.txt", "");
    T_EQ_I64(mgc_gemm_tuning_save(t, p, err, sizeof err), 0);
    mgc_gemm_tuning *u = NULL;
    T_EQ_I64(mgc_gemm_tuning_load(p, &u, err, sizeof err), 0);
    T_CHECK(u != NULL);
    if (u) {
        T_STREQ(u->device, "NVIDIA H200");
        T_EQ_I64(u->cublaslt, 130100);
        T_EQ_U64(u->workspace, 33554432u);
        T_EQ_I64(u->n, N);
        int same = 1;
        for (int i = 0; i < N; i++) {
            const mgc_gemm_tuned *e = mgc_gemm_tuning_find(u, &keys[i]);
            same &= e && e->pick == picks[i] && e->n == ns[i] && !memcmp(&e->key, &keys[i], sizeof e->key);
            for (int j = 0; e && j < ns[i]; j++)
                same &= times[i][j] < 0 ? e->us[j] == -1.0f : fabsf(e->us[j] - times[i][j]) <= 0.006f;
        }
        T_CHECK(same);
        /* a key one field away from a stored one is not found (unless the random keys hold it) */
        mgc_gemm_key other = keys[3];
        other.ldc++;
        int stored = 0;
        for (int i = 0; i < N; i++)
            stored |= !memcmp(&other, &keys[i], sizeof other);
        if (!stored) T_CHECK(mgc_gemm_tuning_find(u, &other) == NULL);
        char why[256];
        T_EQ_I64(mgc_gemm_tuning_matches(u, "NVIDIA H200", 130100, 33554432u, why, sizeof why), 1);
        T_EQ_I64(mgc_gemm_tuning_matches(u, "NVIDIA H100 80GB HBM3", 130100, 33554432u, why, sizeof why), 0);
        T_CHECK(strstr(why, "NVIDIA H200") && strstr(why, "NVIDIA H100 80GB HBM3"));
        T_EQ_I64(mgc_gemm_tuning_matches(u, "NVIDIA H200", 120800, 33554432u, why, sizeof why), 0);
        T_CHECK(strstr(why, "130100") && strstr(why, "120800"));
        T_EQ_I64(mgc_gemm_tuning_matches(u, "NVIDIA H200", 130100, 4096u, why, sizeof why), 0);
        T_CHECK(strstr(why, "workspace") != NULL);
    }
    /* a save that cannot happen leaves the file as it was, and says where */
    char bad[600];
    snprintf(bad, sizeof bad, "%s/no-such-dir/t.txt", dir);
    T_EQ_I64(mgc_gemm_tuning_save(t, bad, err, sizeof err), -1);
    T_CHECK(strstr(err, "no-such-dir") != NULL);
    mgc_gemm_tuning *w = mgc_gemm_tuning_new("x", 1, 1);
    if (w) {
        struct stat st0, st1;
        T_EQ_I64(stat(p, &st0), 0);
        chmod(dir, 0500); /* no new file in the directory: the temporary cannot be made */
        int rc = mgc_gemm_tuning_save(w, p, err, sizeof err);
        chmod(dir, 0700);
        if (geteuid() != 0) T_EQ_I64(rc, -1); /* root writes anyway */
        T_EQ_I64(stat(p, &st1), 0);
        if (rc) T_EQ_I64(st1.st_size, st0.st_size);
        mgc_gemm_tuning_free(w);
    }
    mgc_gemm_tuning_free(u);
    mgc_gemm_tuning_free(t);
}

static void check_choose(void) {
    float a[2] = {10.0f, 9.9f}; /* within 2% of the first choice: kept */
    T_EQ_I64(mgc_gemm_tuning_choose(a, 2), 0);
    float b[2] = {10.0f, 9.0f};
    T_EQ_I64(mgc_gemm_tuning_choose(b, 2), 1);
    float c[3] = {-1.0f, 5.0f, 4.0f}; /* the first failed: the fastest that ran */
    T_EQ_I64(mgc_gemm_tuning_choose(c, 3), 2);
    float d[2] = {-1.0f, -1.0f};
    T_EQ_I64(mgc_gemm_tuning_choose(d, 2), 0);
    float e[4] = {10.0f, -1.0f, 9.7f, 9.75f};
    T_EQ_I64(mgc_gemm_tuning_choose(e, 4), 2);
    float f[1] = {3.0f};
    T_EQ_I64(mgc_gemm_tuning_choose(f, 1), 0);
}

/* each malformed file: refused with the file's name, the line where it says so, and nothing
 * returned */
static void check_bad(void) {
    static const char head[] = "mgc-gemm-tuning 1\ndevice NVIDIA H200\ncublaslt 130100\nworkspace 4096\n";
    static const char key[] = "gemm 0 1 2304 8192 768 768 768 2304 0 14 14 14 2 1 14 0 0 0";
    static const struct {
        const char *name, *tail, *want; /* tail after the header; want: in the message */
    } cases[] = {
        {"short", "gemm 0 1 2304 8192\n", ":5:"},
        {"nopick", "gemm 0 1 2304 8192 768 768 768 2304 0 14 14 14 2 1 14 0 0 0 us 1 2\n", ":5:"},
        {"pickrange", "gemm 0 1 2304 8192 768 768 768 2304 0 14 14 14 2 1 14 0 0 0 pick 2 of 2 us 1 2\n", "pick 2 of 2"},
        {"ofrange", "gemm 0 1 2304 8192 768 768 768 2304 0 14 14 14 2 1 14 0 0 0 pick 0 of 9 us 1 2 3 4 5 6 7 8 9\n", ":5:"},
        {"fewtimes", "gemm 0 1 2304 8192 768 768 768 2304 0 14 14 14 2 1 14 0 0 0 pick 0 of 3 us 1 2\n", "time 3 of 3"},
        {"negtime", "gemm 0 1 2304 8192 768 768 768 2304 0 14 14 14 2 1 14 0 0 0 pick 0 of 2 us 1 -3\n", "time 2 of 2"},
        {"trailing", "gemm 0 1 2304 8192 768 768 768 2304 0 14 14 14 2 1 14 0 0 0 pick 0 of 1 us 1 extra\n", "unexpected"},
        {"zerosize", "gemm 0 1 0 8192 768 768 768 2304 0 14 14 14 2 1 14 0 0 0 pick 0 of 1 us 1\n", ":5:"},
        {"unknown", "algo 3\n", "unknown line"},
        {"dup", "gemm 0 1 2304 8192 768 768 768 2304 0 14 14 14 2 1 14 0 0 0 pick 0 of 1 us 1\n"
                "gemm 0 1 2304 8192 768 768 768 2304 0 14 14 14 2 1 14 0 0 0 pick 0 of 1 us 2\n", ":6:"},
    };
    char text[4096], err[512];
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        snprintf(text, sizeof text, "%s%s", head, cases[i].tail);
        const char *p = file_with(cases[i].name, text);
        mgc_gemm_tuning *t = (mgc_gemm_tuning *)1;
        err[0] = 0;
        T_EQ_I64(mgc_gemm_tuning_load(p, &t, err, sizeof err), -1);
        T_CHECK(t == NULL);
        T_CHECK(strstr(err, cases[i].name) != NULL && strstr(err, cases[i].want) != NULL);
        if (!strstr(err, cases[i].want)) fprintf(stderr, "  %s: %s\n", cases[i].name, err);
    }
    /* headers: not a tuning file, a missing header line, a bad number, a line too long */
    static const struct {
        const char *name, *text, *want;
    } heads[] = {
        {"empty", "", "empty"},
        {"other", "hello\n", ":1:"},
        {"version", "mgc-gemm-tuning 2\n", "version 1"},
        {"nodevice", "mgc-gemm-tuning 1\ncublaslt 1\nworkspace 2\n", "missing"},
        {"badver", "mgc-gemm-tuning 1\ndevice x\ncublaslt 13x\nworkspace 2\n", ":3:"},
        {"badws", "mgc-gemm-tuning 1\ndevice x\ncublaslt 13\nworkspace -\n", ":4:"},
    };
    for (size_t i = 0; i < sizeof heads / sizeof heads[0]; i++) {
        const char *p = file_with(heads[i].name, heads[i].text);
        mgc_gemm_tuning *t = NULL;
        T_EQ_I64(mgc_gemm_tuning_load(p, &t, err, sizeof err), -1);
        T_CHECK(t == NULL && strstr(err, heads[i].name) && strstr(err, heads[i].want));
        if (!strstr(err, heads[i].want)) fprintf(stderr, "  %s: %s\n", heads[i].name, err);
    }
    static char longl[5000];
    snprintf(longl, sizeof longl, "%s%s pick 0 of 1 us 1%*s\n", head, key, 4000, "");
    mgc_gemm_tuning *t = NULL;
    /* trailing blanks are allowed, but not past the line length */
    T_EQ_I64(mgc_gemm_tuning_load(file_with("long", longl), &t, err, sizeof err), -1);
    T_CHECK(strstr(err, "too long") != NULL);
    char missing[600];
    snprintf(missing, sizeof missing, "%s/absent.txt", dir);
    T_EQ_I64(mgc_gemm_tuning_load(missing, &t, err, sizeof err), -1);
    T_CHECK(strstr(err, "absent.txt") && strstr(err, "cannot read"));
    /* comments, blank lines and CRLF endings are fine */
    snprintf(text, sizeof text, "# made by hand\r\n\r\n%s%s pick 0 of 1 us 1.5\r\n", head, key);
    T_EQ_I64(mgc_gemm_tuning_load(file_with("crlf", text), &t, err, sizeof err), 0);
    T_CHECK(t && t->n == 1 && t->e[0].us[0] == 1.5f && t->e[0].key.m == 2304 && t->e[0].key.epilogue == 2);
    mgc_gemm_tuning_free(t);
}

int main(void) {
    char tmpl[] = "/tmp/mgc-gemm-tuning-XXXXXX";
    dir = mkdtemp(tmpl);
    T_CHECK(dir != NULL);
    if (!dir) return t_summary("test_gemm_tuning");
    check_choose();
    check_round_trip();
    check_bad();
    t_remove_dir(dir);
    return t_summary("test_gemm_tuning");
}
