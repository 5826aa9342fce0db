/* gemm_tuning.c - the GEMM tuning file (gemm_tuning.h). */
#include "gemm_tuning.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

mgc_gemm_tuning *mgc_gemm_tuning_new(const char *device, long cublaslt, uint64_t workspace) {
    mgc_gemm_tuning *t = calloc(1, sizeof *t);
    if (!t) return NULL;
    snprintf(t->device, sizeof t->device, "%s", device ? device : "");
    t->cublaslt = cublaslt;
    t->workspace = workspace;
    return t;
}

void mgc_gemm_tuning_free(mgc_gemm_tuning *t) {
    if (!t) return;
    free(t->e);
    free(t);
}

static int same_key(const mgc_gemm_key *a, const mgc_gemm_key *b) {
    return a->ta == b->ta && a->tb == b->tb && a->m == b->m && a->n == b->n && a->k == b->k &&
           a->lda == b->lda && a->ldb == b->ldb && a->ldc == b->ldc && a->aux_ld == b->aux_ld &&
           a->atype == b->atype && a->btype == b->btype && a->ctype == b->ctype &&
           a->epilogue == b->epilogue && a->has_bias == b->has_bias && a->biastype == b->biastype &&
           a->has_aux == b->has_aux && a->auxtype == b->auxtype && a->beta1 == b->beta1;
}

const mgc_gemm_tuned *mgc_gemm_tuning_find(const mgc_gemm_tuning *t, const mgc_gemm_key *k) {
    for (int64_t i = 0; t && i < t->n; i++)
        if (same_key(&t->e[i].key, k)) return &t->e[i];
    return NULL;
}

int mgc_gemm_tuning_put(mgc_gemm_tuning *t, const mgc_gemm_key *k, int pick, int n,
                        const float *us) {
    if (n < 1 || n > MGC_GEMM_TUNING_MAX_CAND || pick < 0 || pick >= n) return -1;
    mgc_gemm_tuned *e = (mgc_gemm_tuned *)mgc_gemm_tuning_find(t, k);
    if (!e) {
        if (t->n == t->cap) {
            int64_t nc = t->cap ? 2 * t->cap : 64;
            mgc_gemm_tuned *p = realloc(t->e, (size_t)nc * sizeof *p);
            if (!p) return -1;
            t->e = p, t->cap = nc;
        }
        e = &t->e[t->n++];
    }
    memset(e, 0, sizeof *e);
    e->key = *k;
    e->pick = pick, e->n = n;
    for (int i = 0; i < n; i++)
        e->us[i] = us[i];
    return 0;
}

int mgc_gemm_tuning_choose(const float *us, int n) {
    int best = -1;
    for (int i = 0; i < n; i++)
        if (us[i] >= 0 && (best < 0 || us[i] < us[best])) best = i;
    if (best < 0) return 0;
    if (us[0] >= 0 && us[best] > 0.98f * us[0]) return 0;
    return best;
}

int mgc_gemm_tuning_matches(const mgc_gemm_tuning *t, const char *device, long cublaslt,
                            uint64_t workspace, char *why, size_t whysz) {
    if (strcmp(t->device, device))
        snprintf(why, whysz, "it was made on a %s, this is a %s", t->device, device);
    else if (t->cublaslt != cublaslt)
        snprintf(why, whysz, "it was made with cuBLASLt %ld, this is %ld", t->cublaslt, cublaslt);
    else if (t->workspace != workspace)
        snprintf(why, whysz, "it was made with a %" PRIu64 "-byte GEMM workspace, this plan's is %" PRIu64,
                 t->workspace, workspace);
    else
        return 1;
    return 0;
}

/* ---- the text format ------------------------------------------------------------------- */

#define KEY_FIELDS 18

static void key_to_fields(const mgc_gemm_key *k, int64_t f[KEY_FIELDS]) {
    int64_t v[KEY_FIELDS] = {k->ta,    k->tb,    k->m,        k->n,        k->k,       k->lda,
                             k->ldb,   k->ldc,   k->aux_ld,   k->atype,    k->btype,   k->ctype,
                             k->epilogue, k->has_bias, k->biastype, k->has_aux, k->auxtype, k->beta1};
    memcpy(f, v, sizeof v);
}

static void fields_to_key(const int64_t f[KEY_FIELDS], mgc_gemm_key *k) {
    memset(k, 0, sizeof *k);
    k->ta = (int)f[0], k->tb = (int)f[1], k->m = f[2], k->n = f[3], k->k = f[4];
    k->lda = f[5], k->ldb = f[6], k->ldc = f[7], k->aux_ld = f[8];
    k->atype = (int)f[9], k->btype = (int)f[10], k->ctype = (int)f[11], k->epilogue = (int)f[12];
    k->has_bias = (int)f[13], k->biastype = (int)f[14], k->has_aux = (int)f[15];
    k->auxtype = (int)f[16], k->beta1 = (int)f[17];
}

int mgc_gemm_tuning_save(const mgc_gemm_tuning *t, const char *path, char *err, size_t errsz) {
    char tmp[4200];
    snprintf(tmp, sizeof tmp, "%.4000s.tmp.%d", path, (int)getpid());
    FILE *f = fopen(tmp, "w");
    if (!f) {
        snprintf(err, errsz, "%s: cannot write: %s (hint: a directory that exists and is writable)",
                 tmp, strerror(errno));
        return -1;
    }
    fprintf(f, "# mgc GEMM tuning: the cuBLASLt candidate each GEMM shape uses (docs/cuda-backend.md,\n"
               "# \"GEMM tuning\"); key: ta tb m n k lda ldb ldc aux_ld atype btype ctype epilogue\n"
               "# has_bias biastype has_aux auxtype beta1, then the candidate used of how many, and\n"
               "# each candidate's microseconds (-1: it failed)\n");
    fprintf(f, "mgc-gemm-tuning %d\ndevice %s\ncublaslt %ld\nworkspace %" PRIu64 "\n",
            MGC_GEMM_TUNING_VERSION, t->device, t->cublaslt, t->workspace);
    for (int64_t i = 0; i < t->n; i++) {
        const mgc_gemm_tuned *e = &t->e[i];
        int64_t v[KEY_FIELDS];
        key_to_fields(&e->key, v);
        fprintf(f, "gemm");
        for (int j = 0; j < KEY_FIELDS; j++)
            fprintf(f, " %" PRId64, v[j]);
        fprintf(f, " pick %d of %d us", e->pick, e->n);
        for (int j = 0; j < e->n; j++)
            fprintf(f, e->us[j] < 0 ? " -1" : " %.2f", (double)e->us[j]);
        fprintf(f, "\n");
    }
    int ok = !ferror(f);
    ok &= fclose(f) == 0;
    if (!ok || rename(tmp, path) != 0) {
        snprintf(err, errsz, "%s: cannot write: %s", path, strerror(errno));
        remove(tmp);
        return -1;
    }
    return 0;
}

/* one gemm line's numbers after "gemm": 0, or -1 with what is wrong in err */
static int parse_gemm(const char *s, mgc_gemm_key *k, int *pick, int *n, float *us, char *err,
                      size_t errsz) {
    int64_t v[KEY_FIELDS];
    char *end;
    for (int j = 0; j < KEY_FIELDS; j++) {
        errno = 0;
        long long x = strtoll(s, &end, 10);
        if (end == s || errno) {
            snprintf(err, errsz, "number %d of the GEMM key is missing or not an integer", j + 1);
            return -1;
        }
        v[j] = x;
        s = end;
    }
    for (int j = 2; j <= 8; j++)
        if (v[j] < 0 || (j <= 7 && v[j] == 0)) { /* m .. ldc positive, aux_ld not negative */
            snprintf(err, errsz, "the GEMM key's size %d is %" PRId64, j + 1, v[j]);
            return -1;
        }
    fields_to_key(v, k);
    int used = 0;
    if (sscanf(s, " pick %d of %d us%n", pick, n, &used) != 2 || used == 0) {
        snprintf(err, errsz, "expected \"pick P of N us T1 .. TN\" after the key");
        return -1;
    }
    if (*n < 1 || *n > MGC_GEMM_TUNING_MAX_CAND || *pick < 0 || *pick >= *n) {
        snprintf(err, errsz, "pick %d of %d: need 0 <= pick < of <= %d", *pick, *n,
                 MGC_GEMM_TUNING_MAX_CAND);
        return -1;
    }
    s += used;
    for (int j = 0; j < *n; j++) {
        errno = 0;
        double x = strtod(s, &end);
        if (end == s || errno || !(x == -1.0 || x >= 0.0)) {
            snprintf(err, errsz, "time %d of %d is missing or not a number of microseconds", j + 1, *n);
            return -1;
        }
        us[j] = (float)x;
        s = end;
    }
    while (*s == ' ' || *s == '\t')
        s++;
    if (*s) {
        snprintf(err, errsz, "unexpected text after the times: \"%.40s\"", s);
        return -1;
    }
    return 0;
}

int mgc_gemm_tuning_load(const char *path, mgc_gemm_tuning **out, char *err, size_t errsz) {
    *out = NULL;
    FILE *f = fopen(path, "r");
    if (!f) {
        snprintf(err, errsz, "%s: cannot read: %s (hint: MGC_GEMM_TUNING names a file that "
                 "MGC_GEMM_TUNE wrote)", path, strerror(errno));
        return -1;
    }
    mgc_gemm_tuning *t = mgc_gemm_tuning_new("", 0, 0);
    char line[2048], what[256];
    int ln = 0, have[4] = {0, 0, 0, 0}, rc = 0;
    if (!t) {
        snprintf(err, errsz, "out of memory");
        rc = -1;
    }
    while (!rc && fgets(line, sizeof line, f)) {
        ln++;
        size_t len = strlen(line);
        if (len + 1 == sizeof line && line[len - 1] != '\n') {
            snprintf(err, errsz, "%s:%d: line too long (hint: a file MGC_GEMM_TUNE wrote)", path, ln);
            rc = -1;
            break;
        }
        while (len && (line[len - 1] == '\n' || line[len - 1] == '\r' || line[len - 1] == ' '))
            line[--len] = 0;
        if (!len || line[0] == '#') continue;
        int ver;
        if (!have[0]) {
            if (sscanf(line, "mgc-gemm-tuning %d", &ver) != 1 || ver != MGC_GEMM_TUNING_VERSION) {
                snprintf(err, errsz, "%s:%d: not an mgc GEMM tuning file of version %d (hint: "
                         "MGC_GEMM_TUNE=FILE mgc-run PLAN writes one)", path, ln, MGC_GEMM_TUNING_VERSION);
                rc = -1;
            }
            have[0] = 1;
        } else if (!strncmp(line, "device ", 7)) {
            snprintf(t->device, sizeof t->device, "%.127s", line + 7);
            have[1] = 1;
        } else if (!strncmp(line, "cublaslt ", 9) || !strncmp(line, "workspace ", 10)) {
            int ws = line[0] == 'w';
            const char *v = line + (ws ? 10 : 9);
            char *end;
            unsigned long long x = strtoull(v, &end, 10);
            if (end == v || *end || *v == '-') {
                snprintf(err, errsz, "%s:%d: %s", path, ln,
                         ws ? "workspace: expected a number of bytes"
                            : "cublaslt: expected the library's version number");
                rc = -1;
            }
            if (ws) t->workspace = x;
            else t->cublaslt = (long)x;
            have[ws ? 3 : 2] = 1;
        } else if (!strncmp(line, "gemm ", 5)) {
            mgc_gemm_key k;
            int pick, n;
            float us[MGC_GEMM_TUNING_MAX_CAND];
            if (parse_gemm(line + 5, &k, &pick, &n, us, what, sizeof what)) {
                snprintf(err, errsz, "%s:%d: %s", path, ln, what);
                rc = -1;
            } else if (mgc_gemm_tuning_find(t, &k)) {
                snprintf(err, errsz, "%s:%d: a second line for the same GEMM", path, ln);
                rc = -1;
            } else if (mgc_gemm_tuning_put(t, &k, pick, n, us)) {
                snprintf(err, errsz, "out of memory");
                rc = -1;
            }
        } else {
            snprintf(err, errsz, "%s:%d: unknown line \"%.40s\" (expected device, cublaslt, "
                     "workspace or gemm)", path, ln, line);
            rc = -1;
        }
    }
    if (!rc && ferror(f)) {
        snprintf(err, errsz, "%s: read error", path);
        rc = -1;
    }
    fclose(f);
    if (!rc && !(have[0] && have[1] && have[2] && have[3])) {
        snprintf(err, errsz, "%s: %s (hint: a file MGC_GEMM_TUNE wrote)", path,
                 !have[0] ? "empty, not a GEMM tuning file" : "a header line (device, cublaslt or workspace) is missing");
        rc = -1;
    }
    if (rc) {
        mgc_gemm_tuning_free(t);
        return -1;
    }
    *out = t;
    return 0;
}
