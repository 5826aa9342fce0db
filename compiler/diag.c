/* diag.c - see diag.h. */
#include "diag.h"

#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

void mgc_diags_init(mgc_diags *d) {
    memset(d, 0, sizeof *d);
}

void mgc_diags_clear(mgc_diags *d) {
    for (int i = 0; i < d->n; i++) {
        free(d->v[i].file);
        free(d->v[i].msg);
        free(d->v[i].hint);
    }
    d->n = 0;
    d->errors = 0;
    d->warnings = 0;
    d->oom = 0;
}

void mgc_diags_free(mgc_diags *d) {
    if (!d) return;
    mgc_diags_clear(d);
    free(d->v);
    memset(d, 0, sizeof *d);
}

static char *dup_or_null(const char *s) {
    if (!s) return NULL;
    size_t n = strlen(s) + 1;
    char *p = malloc(n);
    if (p) memcpy(p, s, n);
    return p;
}

void mgc_diag(mgc_diags *d, mgc_severity sev, mgc_loc loc, const char *hint, const char *fmt, ...) {
    if (sev == MGC_SEV_ERROR) d->errors++;
    if (sev == MGC_SEV_WARNING) d->warnings++;
    if (d->n == d->cap) {
        int cap = d->cap ? d->cap * 2 : 16;
        mgc_diag_entry *v = realloc(d->v, (size_t)cap * sizeof *v);
        if (!v) {
            d->oom = 1;
            return;
        }
        d->v = v;
        d->cap = cap;
    }
    char buf[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    mgc_diag_entry *e = &d->v[d->n];
    e->sev = sev;
    e->file = dup_or_null(loc.file ? loc.file : "<input>");
    e->loc = loc;
    e->loc.file = e->file;
    e->msg = dup_or_null(buf);
    e->hint = dup_or_null(hint);
    e->seq = d->n;
    if (!e->file || !e->msg || (hint && !e->hint)) {
        free(e->file);
        free(e->msg);
        free(e->hint);
        d->oom = 1;
        return;
    }
    d->n++;
}

/* Insertion sort: lists are short and the sort must be stable. */
void mgc_diags_sort(mgc_diags *d) {
    /* rank each entry's file by the first arrival of that file */
    int *rank = malloc((size_t)(d->n ? d->n : 1) * sizeof *rank);
    if (!rank) return;
    for (int i = 0; i < d->n; i++) {
        int r = d->v[i].seq;
        for (int j = 0; j < d->n; j++)
            if (strcmp(d->v[j].file, d->v[i].file) == 0 && d->v[j].seq < r) r = d->v[j].seq;
        rank[i] = r;
    }
    for (int i = 1; i < d->n; i++) {
        mgc_diag_entry e = d->v[i];
        int r = rank[i];
        int j = i - 1;
        while (j >= 0) {
            const mgc_diag_entry *p = &d->v[j];
            int before = rank[j] < r ||
                         (rank[j] == r && (p->loc.line < e.loc.line ||
                                           (p->loc.line == e.loc.line &&
                                            (p->loc.col < e.loc.col ||
                                             (p->loc.col == e.loc.col && p->seq < e.seq)))));
            if (before) break;
            d->v[j + 1] = d->v[j];
            rank[j + 1] = rank[j];
            j--;
        }
        d->v[j + 1] = e;
        rank[j + 1] = r;
    }
    free(rank);
}

const char *mgc_severity_name(mgc_severity s) {
    switch (s) {
    case MGC_SEV_ERROR: return "error";
    case MGC_SEV_WARNING: return "warning";
    default: return "note";
    }
}

void mgc_diags_print(const mgc_diags *d, FILE *out) {
    for (int i = 0; i < d->n; i++) {
        const mgc_diag_entry *e = &d->v[i];
        if (e->loc.line > 0)
            fprintf(out, "%s:%d:%d: %s: %s\n", e->file, e->loc.line, e->loc.col > 0 ? e->loc.col : 1,
                    mgc_severity_name(e->sev), e->msg);
        else
            fprintf(out, "%s: %s: %s\n", e->file, mgc_severity_name(e->sev), e->msg);
        if (e->hint) fprintf(out, "  hint: %s\n", e->hint);
    }
    if (d->oom) fprintf(out, "mgc: error: out of memory while recording diagnostics\n");
}

/* GitHub workflow commands need '%', '\r', '\n' escaped in the message and
 * additionally ',' and ':' in property values. */
static void gh_escape(FILE *out, const char *s, int prop) {
    for (; *s; s++) {
        if (*s == '%') fputs("%25", out);
        else if (*s == '\r') fputs("%0D", out);
        else if (*s == '\n') fputs("%0A", out);
        else if (prop && *s == ':') fputs("%3A", out);
        else if (prop && *s == ',') fputs("%2C", out);
        else fputc(*s, out);
    }
}

void mgc_diags_print_github(const mgc_diags *d, FILE *out) {
    for (int i = 0; i < d->n; i++) {
        const mgc_diag_entry *e = &d->v[i];
        fprintf(out, "::%s file=", e->sev == MGC_SEV_ERROR ? "error" : e->sev == MGC_SEV_WARNING ? "warning" : "notice");
        gh_escape(out, e->file, 1);
        if (e->loc.line > 0) fprintf(out, ",line=%d,col=%d", e->loc.line, e->loc.col > 0 ? e->loc.col : 1);
        fputs("::", out);
        gh_escape(out, e->msg, 0);
        if (e->hint) {
            fputs(" (hint: ", out);
            gh_escape(out, e->hint, 0);
            fputs(")", out);
        }
        fputc('\n', out);
    }
}
