/* json.h - a small streaming JSON writer (objects, arrays, scalars) for the
 * machine-readable outputs of mgc (`--json`).  It tracks nesting and commas;
 * the caller only says what comes next.
 *
 *     mgc_json j;
 *     mgc_json_init(&j, stdout, 2);          // indent 2; 0 = compact
 *     mgc_json_obj_begin(&j, NULL);
 *     mgc_json_int(&j, "layers", 12);
 *     mgc_json_obj_begin(&j, "params");
 *     mgc_json_u64(&j, "total", 124439808);
 *     mgc_json_obj_end(&j);
 *     mgc_json_obj_end(&j);
 *     mgc_json_finish(&j);                    // final newline
 */
#ifndef MGC_JSON_H
#define MGC_JSON_H

#include <stdint.h>
#include <stdio.h>

#ifdef __cplusplus
extern "C" {
#endif

#define MGC_JSON_MAX_DEPTH 32

typedef struct mgc_json {
    FILE *out;
    int indent;                       /* spaces per level; 0 = one line */
    int depth;                        /* current nesting */
    int count[MGC_JSON_MAX_DEPTH];    /* members written at each level */
} mgc_json;

void mgc_json_init(mgc_json *j, FILE *out, int indent);
/* `key` is the member name inside an object, NULL inside an array or at top. */
void mgc_json_obj_begin(mgc_json *j, const char *key);
void mgc_json_obj_end(mgc_json *j);
void mgc_json_arr_begin(mgc_json *j, const char *key);
void mgc_json_arr_end(mgc_json *j);
void mgc_json_str(mgc_json *j, const char *key, const char *v); /* NULL writes null */
void mgc_json_int(mgc_json *j, const char *key, int64_t v);
void mgc_json_u64(mgc_json *j, const char *key, uint64_t v);
/* Doubles are written in the shortest form that reads back exactly (whole
 * numbers below 2^53 without a fraction); non-finite values become null. */
void mgc_json_num(mgc_json *j, const char *key, double v);
void mgc_json_bool(mgc_json *j, const char *key, int v);
void mgc_json_null(mgc_json *j, const char *key);
void mgc_json_finish(mgc_json *j);

/* The shortest decimal text (15-17 digits) that strtod reads back as v. */
void mgc_json_fmt_double(char *buf, size_t n, double v);

/* Write `s` as a JSON string literal (with quotes) to out. */
void mgc_json_write_string(FILE *out, const char *s);

#ifdef __cplusplus
}
#endif
#endif /* MGC_JSON_H */
