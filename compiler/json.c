/* json.c - see json.h. */
#include "json.h"

#include <inttypes.h>
#include <math.h>
#include <stdlib.h>

void mgc_json_init(mgc_json *j, FILE *out, int indent) {
    j->out = out;
    j->indent = indent;
    j->depth = 0;
    j->count[0] = 0;
}

void mgc_json_write_string(FILE *out, const char *s) {
    fputc('"', out);
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        switch (*p) {
        case '"': fputs("\\\"", out); break;
        case '\\': fputs("\\\\", out); break;
        case '\n': fputs("\\n", out); break;
        case '\r': fputs("\\r", out); break;
        case '\t': fputs("\\t", out); break;
        default:
            if (*p < 0x20) fprintf(out, "\\u%04x", *p);
            else fputc(*p, out);
        }
    }
    fputc('"', out);
}

static void newline(mgc_json *j) {
    if (!j->indent) return;
    fputc('\n', j->out);
    for (int i = 0; i < j->depth * j->indent; i++) fputc(' ', j->out);
}

/* Comma, newline/indent and "key": before a member. */
static void member(mgc_json *j, const char *key) {
    if (j->depth > 0) {
        if (j->count[j->depth]++) fputc(',', j->out);
        newline(j);
    }
    if (key) {
        mgc_json_write_string(j->out, key);
        fputs(j->indent ? ": " : ":", j->out);
    }
}

static void open(mgc_json *j, const char *key, char c) {
    member(j, key);
    fputc(c, j->out);
    if (j->depth + 1 < MGC_JSON_MAX_DEPTH) j->depth++;
    j->count[j->depth] = 0;
}

static void close_(mgc_json *j, char c) {
    int had = j->count[j->depth];
    if (j->depth > 0) j->depth--;
    if (had) newline(j);
    fputc(c, j->out);
}

void mgc_json_obj_begin(mgc_json *j, const char *key) { open(j, key, '{'); }
void mgc_json_obj_end(mgc_json *j) { close_(j, '}'); }
void mgc_json_arr_begin(mgc_json *j, const char *key) { open(j, key, '['); }
void mgc_json_arr_end(mgc_json *j) { close_(j, ']'); }

void mgc_json_str(mgc_json *j, const char *key, const char *v) {
    member(j, key);
    if (v) mgc_json_write_string(j->out, v);
    else fputs("null", j->out);
}

void mgc_json_int(mgc_json *j, const char *key, int64_t v) {
    member(j, key);
    fprintf(j->out, "%" PRId64, v);
}

void mgc_json_u64(mgc_json *j, const char *key, uint64_t v) {
    member(j, key);
    fprintf(j->out, "%" PRIu64, v);
}

void mgc_json_fmt_double(char *buf, size_t n, double v) {
    if (fabs(v) < 9007199254740992.0 && v == floor(v)) {
        snprintf(buf, n, "%" PRId64, (int64_t)v);
        return;
    }
    for (int prec = 15; prec <= 17; prec++) {
        snprintf(buf, n, "%.*g", prec, v);
        if (strtod(buf, NULL) == v) return;
    }
}

void mgc_json_num(mgc_json *j, const char *key, double v) {
    member(j, key);
    if (!isfinite(v)) {
        fputs("null", j->out);
        return;
    }
    char buf[40];
    mgc_json_fmt_double(buf, sizeof buf, v);
    fputs(buf, j->out);
}

void mgc_json_bool(mgc_json *j, const char *key, int v) {
    member(j, key);
    fputs(v ? "true" : "false", j->out);
}

void mgc_json_null(mgc_json *j, const char *key) {
    member(j, key);
    fputs("null", j->out);
}

void mgc_json_finish(mgc_json *j) {
    fputc('\n', j->out);
}
