/* diag.h - diagnostics collected on a context, printed all at once.
 *
 * The compiler never stops at the first problem: every check appends a
 * diagnostic (`file:line:col: error: message` plus an optional hint) to an
 * mgc_diags list and carries on.  The caller prints the list, sorted by
 * position, and turns "any error" into exit status 1.
 *
 *     mgc_diags d;
 *     mgc_diags_init(&d);
 *     mgc_diag(&d, MGC_SEV_ERROR, loc, "choose a divisor of 32", "tensor (%d) ...", tp);
 *     mgc_diags_print(&d, stderr);
 *     mgc_diags_free(&d);
 */
#ifndef MGC_DIAG_H
#define MGC_DIAG_H

#include <stdint.h>
#include <stdio.h>

#ifdef __cplusplus
extern "C" {
#endif

/* A position in an input.  `file` points at a string owned by whoever made the
 * location (a config keeps its file names alive as long as itself).  line and
 * col are 1-based; 0 means "the whole file". */
typedef struct mgc_loc {
    const char *file; /* input name as the user gave it, or "--set #N" */
    int line;         /* 1-based; 0 when the position is unknown */
    int col;          /* 1-based; 0 when unknown */
} mgc_loc;

typedef enum mgc_severity {
    MGC_SEV_NOTE = 0,
    MGC_SEV_WARNING = 1,
    MGC_SEV_ERROR = 2,
} mgc_severity;

typedef struct mgc_diag_entry {
    mgc_severity sev; /* error, warning or note */
    mgc_loc loc;      /* where; loc.file is copied into the entry */
    char *file;       /* owned copy of loc.file */
    char *msg;        /* one line, no trailing newline */
    char *hint;       /* optional: how to fix it; NULL when none */
    int seq;          /* order of arrival, for a stable sort */
} mgc_diag_entry;

typedef struct mgc_diags {
    mgc_diag_entry *v; /* entries, in arrival order until sorted */
    int n;             /* number of entries */
    int cap;           /* allocated entries */
    int errors;        /* entries with MGC_SEV_ERROR */
    int warnings;      /* entries with MGC_SEV_WARNING */
    int oom;           /* set when an entry could not be stored */
} mgc_diags;

void mgc_diags_init(mgc_diags *d);
void mgc_diags_free(mgc_diags *d);
/* Drop all entries but keep the storage. */
void mgc_diags_clear(mgc_diags *d);

/* Append a diagnostic.  `hint` may be NULL.  Never fails visibly: when memory
 * runs out the entry is dropped and d->oom is set (errors still count). */
void mgc_diag(mgc_diags *d, mgc_severity sev, mgc_loc loc, const char *hint, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 5, 6)))
#endif
    ;

/* Sort by file (order of first appearance), line, col, arrival. */
void mgc_diags_sort(mgc_diags *d);

/* Print every entry as `file:line:col: error: msg` and `  hint: ...`. */
void mgc_diags_print(const mgc_diags *d, FILE *out);

/* Print as GitHub Actions workflow commands (::error file=..,line=..::msg). */
void mgc_diags_print_github(const mgc_diags *d, FILE *out);

const char *mgc_severity_name(mgc_severity s);

#ifdef __cplusplus
}
#endif
#endif /* MGC_DIAG_H */
