/* hwprofile.c - see hwprofile.h.
 *
 * A profile is parsed with the config's YAML tree (yamltree.h), against one
 * table of fields: section, key, unit scale, range.  Every problem is a
 * diagnostic at its line and column; parsing goes on to report them all. */
#include "hwprofile.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "readfile.h"
#include "yamltree.h"

/* the files of hardware/, embedded at build time (codegen/embed.cmake) */
typedef struct mgc_kernel_file {
    const char *name;
    const char *text;
} mgc_kernel_file;
extern const mgc_kernel_file mgc_hardware_files[];

/* ---- the fields ----------------------------------------------------------------------- */

typedef struct field {
    const char *section; /* "gpu", "node", "network", "efficiency" */
    const char *key;     /* "memory_gib"; "peak_tflops.bf16" for the nested map */
    size_t offset;       /* of the double (or int64 when is_int) inside mgc_hw */
    double scale;        /* file unit -> SI */
    double lo, hi;       /* accepted range in file units, inclusive */
    int is_int;
    int optional;        /* 0: required */
} field;

#define F(sec, k, member, sc, l, h) {sec, k, offsetof(mgc_hw, member), sc, l, h, 0, 0}
static const field fields[] = {
    F("gpu", "peak_tflops.fp32", peak_flops[0], 1e12, 1e-3, 1e6),
    F("gpu", "peak_tflops.bf16", peak_flops[1], 1e12, 1e-3, 1e6),
    F("gpu", "peak_tflops.fp16", peak_flops[2], 1e12, 1e-3, 1e6),
    F("gpu", "memory_gib", memory_bytes, 1073741824.0, 0.001, 1e6),
    F("gpu", "memory_bandwidth_gbs", memory_bw, 1e9, 0.001, 1e7),
    {"gpu", "sms", offsetof(mgc_hw, sms), 1, 1, 100000, 1, 0},
    F("gpu", "power_w", power_w, 1, 1, 1e5),
    F("gpu", "launch_us", launch_s, 1e-6, 0, 1e4),
    {"node", "gpus", offsetof(mgc_hw, gpus_per_node), 1, 1, 1024, 1, 0},
    F("node", "nvlink_gbs", nvlink_bw, 1e9, 0.001, 1e7),
    F("node", "nvlink_latency_us", nvlink_latency_s, 1e-6, 0, 1e6),
    F("network", "gbs", net_bw, 1e9, 0.001, 1e7),
    F("network", "latency_us", net_latency_s, 1e-6, 0, 1e6),
    F("efficiency", "gemm", eff.gemm, 1, 1e-6, 1),
    F("efficiency", "gemm_k_half", eff.gemm_k_half, 1, 0, 1e6),
    F("efficiency", "memory", eff.memory, 1, 1e-6, 1),
    F("efficiency", "attention_fwd", eff.attention_fwd, 1, 1e-6, 1),
    F("efficiency", "attention_bwd", eff.attention_bwd, 1, 1e-6, 1),
    F("efficiency", "nvlink", eff.nvlink, 1, 1e-6, 1),
    F("efficiency", "network", eff.network, 1, 1e-6, 1),
};
#undef F
#define NFIELDS (sizeof fields / sizeof fields[0])

static const char *const sections[] = {"gpu", "node", "network", "efficiency"};

static int is_section(const char *k) {
    for (size_t i = 0; i < sizeof sections / sizeof sections[0]; i++)
        if (!strcmp(k, sections[i])) return 1;
    return 0;
}

/* The field of `section`.`key`, or -1. */
static int find_field(const char *section, const char *key) {
    for (size_t i = 0; i < NFIELDS; i++)
        if (!strcmp(fields[i].section, section) && !strcmp(fields[i].key, key)) return (int)i;
    return -1;
}

static void set_field(mgc_hw *hw, const field *f, double v) {
    char *base = (char *)hw + f->offset;
    if (f->is_int) *(int64_t *)base = (int64_t)v;
    else *(double *)base = v * f->scale;
}

static double get_field(const mgc_hw *hw, const field *f) {
    const char *base = (const char *)hw + f->offset;
    if (f->is_int) return (double)*(const int64_t *)base;
    return *(const double *)base / f->scale;
}

static void copy_str(char *dst, size_t n, const mgc_ynode *v) {
    snprintf(dst, n, "%.*s", (int)(v->len < n ? v->len : n - 1), v->s);
}

/* One numeric value; records it as seen. */
static void parse_value(const char *file, const mgc_ynode *v, const field *f, mgc_hw *hw, uint8_t *seen,
                        mgc_diags *d) {
    seen[f - fields] = 1; /* present: a bad value is its own error, not also "missing" */
    mgc_loc at = v->loc;
    at.file = file;
    char *end = NULL;
    errno = 0;
    double x = v->kind == MGC_Y_SCALAR && !v->quoted ? strtod(v->s, &end) : NAN;
    if (!end || end == v->s || *end || errno || !isfinite(x)) {
        mgc_diag(d, MGC_SEV_ERROR, at, "write a plain number, e.g. 989.4", "%s.%s: expected a number",
                 f->section, f->key);
        return;
    }
    if (f->is_int && x != floor(x)) {
        mgc_diag(d, MGC_SEV_ERROR, at, NULL, "%s.%s: expected a whole number, got %s", f->section, f->key, v->s);
        return;
    }
    if (x < f->lo || x > f->hi) {
        mgc_diag(d, MGC_SEV_ERROR, at, NULL, "%s.%s = %s is out of range [%g, %g]", f->section, f->key, v->s,
                 f->lo, f->hi);
        return;
    }
    set_field(hw, f, x);
    seen[f - fields] = 1;
}

int mgc_hw_parse(const char *file, const char *text, size_t len, mgc_hw *out, mgc_diags *d) {
    int before = d->errors;
    memset(out, 0, sizeof *out);
    snprintf(out->source, sizeof out->source, "%s", file);
    mgc_ytree *t = mgc_ytree_parse(file, text, len, d);
    if (!t) return -1;
    mgc_ynode *root = mgc_ytree_root(t);
    mgc_loc top = {file, 1, 1};
    uint8_t seen[NFIELDS];
    memset(seen, 0, sizeof seen);
    if (root->kind != MGC_Y_MAP) {
        mgc_diag(d, MGC_SEV_ERROR, top, "see hardware/h100-sxm.yaml for the format",
                 "a hardware profile is a mapping of name, description, gpu, node, network, efficiency");
        mgc_ytree_free(t);
        return -1;
    }
    int have_name = 0;
    for (int i = 0; i < root->n; i++) {
        const mgc_ynode *k = root->keys[i], *v = root->kids[i];
        mgc_loc at = k->loc;
        at.file = file;
        if (!strcmp(k->s, "name") || !strcmp(k->s, "description")) {
            if (v->kind != MGC_Y_SCALAR) {
                mgc_diag(d, MGC_SEV_ERROR, at, NULL, "%s: expected a string", k->s);
                continue;
            }
            if (k->s[0] == 'n') {
                int ok = v->len > 0 && v->len < sizeof out->name;
                for (size_t c = 0; ok && c < v->len; c++) {
                    char ch = v->s[c];
                    ok = (ch >= 'a' && ch <= 'z') || (ch >= '0' && ch <= '9') || ch == '-' || ch == '_' || ch == '.';
                }
                if (!ok) {
                    mgc_loc vl = v->loc;
                    vl.file = file;
                    mgc_diag(d, MGC_SEV_ERROR, vl, "lower-case letters, digits, '-', '_' and '.', e.g. h100-sxm",
                             "name: '%s' is not a profile name", v->s);
                    continue;
                }
                copy_str(out->name, sizeof out->name, v);
                have_name = 1;
            } else {
                copy_str(out->description, sizeof out->description, v);
            }
            continue;
        }
        if (!is_section(k->s)) {
            mgc_diag(d, MGC_SEV_ERROR, at, "the sections are gpu, node, network and efficiency",
                     "unknown key '%s'", k->s);
            continue;
        }
        if (v->kind != MGC_Y_MAP) {
            mgc_diag(d, MGC_SEV_ERROR, at, NULL, "%s: expected a mapping", k->s);
            continue;
        }
        for (int j = 0; j < v->n; j++) {
            const mgc_ynode *kk = v->keys[j], *vv = v->kids[j];
            mgc_loc kat = kk->loc;
            kat.file = file;
            if (!strcmp(k->s, "gpu") && !strcmp(kk->s, "peak_tflops")) {
                if (vv->kind != MGC_Y_MAP) {
                    mgc_diag(d, MGC_SEV_ERROR, kat, "e.g. {bf16: 989.4, fp16: 989.4, fp32: 66.9}",
                             "gpu.peak_tflops: expected a mapping of precision to TFLOP/s");
                    continue;
                }
                for (int q = 0; q < vv->n; q++) {
                    char key[64];
                    snprintf(key, sizeof key, "peak_tflops.%s", vv->keys[q]->s);
                    int fi = find_field("gpu", key);
                    if (fi < 0) {
                        mgc_loc qat = vv->keys[q]->loc;
                        qat.file = file;
                        mgc_diag(d, MGC_SEV_ERROR, qat, "the precisions are bf16, fp16 and fp32",
                                 "gpu.peak_tflops: unknown precision '%s'", vv->keys[q]->s);
                        continue;
                    }
                    parse_value(file, vv->kids[q], &fields[fi], out, seen, d);
                }
                continue;
            }
            int fi = find_field(k->s, kk->s);
            if (fi < 0) {
                char hint[256];
                int n = snprintf(hint, sizeof hint, "%s has:", k->s);
                for (size_t q = 0; q < NFIELDS && n > 0 && (size_t)n < sizeof hint; q++)
                    if (!strcmp(fields[q].section, k->s) && !strchr(fields[q].key, '.'))
                        n += snprintf(hint + n, sizeof hint - (size_t)n, " %s", fields[q].key);
                mgc_diag(d, MGC_SEV_ERROR, kat, hint, "unknown key '%s.%s'", k->s, kk->s);
                continue;
            }
            parse_value(file, vv, &fields[fi], out, seen, d);
        }
    }
    if (!have_name) mgc_diag(d, MGC_SEV_ERROR, top, "e.g. name: h100-sxm", "the profile has no name");
    for (size_t i = 0; i < NFIELDS; i++)
        if (!seen[i] && !fields[i].optional)
            mgc_diag(d, MGC_SEV_ERROR, top, "every field is required: see hardware/h100-sxm.yaml",
                     "missing %s.%s", fields[i].section, fields[i].key);
    mgc_ytree_free(t);
    return d->errors == before ? 0 : -1;
}

/* ---- finding a profile ---------------------------------------------------------------- */

static int looks_like_path(const char *s) {
    size_t n = strlen(s);
    return strchr(s, '/') != NULL || (n > 5 && !strcmp(s + n - 5, ".yaml")) || (n > 4 && !strcmp(s + n - 4, ".yml"));
}

static int load_file(const char *path, mgc_loc at, mgc_hw *out, mgc_diags *d) {
    size_t len = 0;
    char *text = mgc_read_file(path, MGC_YAML_MAX_BYTES, &len);
    if (!text) {
        mgc_diag(d, MGC_SEV_ERROR, at, "give a readable profile file, or a built-in name (mgc hardware)",
                 "cannot read hardware profile %s: %s", path, strerror(errno));
        return -1;
    }
    int rc = mgc_hw_parse(path, text, len, out, d);
    free(text);
    return rc;
}

int mgc_hw_load_at(const char *name, mgc_loc at, mgc_hw *out, mgc_diags *d) {
    memset(out, 0, sizeof *out);
    if (!name || !name[0]) {
        mgc_diag(d, MGC_SEV_ERROR, at, "e.g. h100-sxm", "no hardware profile named");
        return -1;
    }
    if (looks_like_path(name)) return load_file(name, at, out, d);
    int ok_name = 1;
    for (const char *c = name; *c; c++)
        ok_name &= (*c >= 'a' && *c <= 'z') || (*c >= '0' && *c <= '9') || *c == '-' || *c == '_' || *c == '.';
    if (ok_name) {
        /* the user's directories first */
        const char *path = getenv("MGC_HARDWARE_PATH");
        while (path && *path) {
            const char *colon = strchr(path, ':');
            size_t n = colon ? (size_t)(colon - path) : strlen(path);
            if (n > 0 && n < 3500) {
                char file[4096];
                snprintf(file, sizeof file, "%.*s/%s.yaml", (int)n, path, name);
                FILE *f = fopen(file, "rb");
                if (f) {
                    fclose(f);
                    return load_file(file, at, out, d);
                }
            }
            path = colon ? colon + 1 : NULL;
        }
        char want[96];
        snprintf(want, sizeof want, "%s.yaml", name);
        for (const mgc_kernel_file *h = mgc_hardware_files; h->name; h++)
            if (!strcmp(h->name, want)) {
                char src[128];
                snprintf(src, sizeof src, "built-in:%s", h->name);
                int rc = mgc_hw_parse(src, h->text, strlen(h->text), out, d);
                return rc;
            }
    }
    char hint[512];
    int n = snprintf(hint, sizeof hint, "built-in profiles:");
    for (const mgc_kernel_file *h = mgc_hardware_files; h->name && n > 0 && (size_t)n < sizeof hint; h++)
        n += snprintf(hint + n, sizeof hint - (size_t)n, " %.*s", (int)(strlen(h->name) - 5), h->name);
    if (n > 0 && (size_t)n < sizeof hint)
        snprintf(hint + n, sizeof hint - (size_t)n, "; add your own with MGC_HARDWARE_PATH or a file path");
    mgc_diag(d, MGC_SEV_ERROR, at, hint, "no hardware profile named '%s'", name);
    return -1;
}

int mgc_hw_load(const char *name, mgc_hw *out, mgc_diags *d) {
    return mgc_hw_load_at(name, (mgc_loc){name ? name : "", 0, 0}, out, d);
}

int mgc_hw_builtin_names(char (*names)[64], int max) {
    int n = 0;
    for (const mgc_kernel_file *h = mgc_hardware_files; h->name; h++, n++)
        if (n < max) snprintf(names[n], 64, "%.*s", (int)(strlen(h->name) - 5), h->name);
    return n;
}

/* ---- writing -------------------------------------------------------------------------- */

int mgc_hw_write_yaml(const mgc_hw *hw, const char *comment, FILE *out) {
    if (comment) {
        const char *s = comment;
        while (*s) {
            const char *nl = strchr(s, '\n');
            size_t n = nl ? (size_t)(nl - s) : strlen(s);
            fprintf(out, "# %.*s\n", (int)n, s);
            s += n + (nl ? 1 : 0);
        }
    }
    fprintf(out, "name: %s\n", hw->name);
    fputs("description: \"", out);
    for (const char *c = hw->description; *c; c++) {
        if (*c == '"' || *c == '\\') fputc('\\', out);
        fputc(*c, out);
    }
    fputs("\"\n", out);
    const char *sec = "";
    int in_peak = 0;
    for (size_t i = 0; i < NFIELDS; i++) {
        const field *f = &fields[i];
        if (strcmp(sec, f->section)) {
            if (in_peak) fputs("}\n", out), in_peak = 0;
            fprintf(out, "%s:\n", f->section);
            sec = f->section;
        }
        double v = get_field(hw, f);
        if (!strncmp(f->key, "peak_tflops.", 12)) {
            fprintf(out, "%s%s: %.6g", in_peak ? ", " : "  peak_tflops: {", f->key + 12, v);
            in_peak = 1;
            continue;
        }
        if (in_peak) fputs("}\n", out), in_peak = 0;
        if (f->is_int) fprintf(out, "  %s: %.0f\n", f->key, v);
        else fprintf(out, "  %s: %.6g\n", f->key, v);
    }
    if (in_peak) fputs("}\n", out);
    return ferror(out) ? -1 : 0;
}
