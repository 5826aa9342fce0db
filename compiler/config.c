/* config.c - YAML tree -> mgc_config through the schema table.  See config.h.
 *
 * Schema-level checks live here (unknown keys, types, ranges, enum names);
 * cross-key rules and derived defaults live in check.c. */
#include "config.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "yamltree.h"

const char *const mgc_enum_norm[] = {"layernorm", "rmsnorm", NULL};
const char *const mgc_enum_act[] = {"gelu", "swiglu", NULL};
const char *const mgc_enum_pos[] = {"learned", "rotary", "none", NULL};
const char *const mgc_enum_score[] = {"softmax", "sigmoid", "presoftmax", NULL};
const char *const mgc_enum_drop_policy[] = {"probs", "position", NULL};
const char *const mgc_enum_aux_scope[] = {"microbatch", "sequence", NULL};
const char *const mgc_enum_router_dtype[] = {"compute", "fp32", NULL};
const char *const mgc_enum_logits_dtype[] = {"fp32", "compute", NULL};
const char *const mgc_enum_sched[] = {"gpipe", "1f1b", "interleaved-1f1b", NULL};
const char *const mgc_enum_precision[] = {"fp32", "bf16", "fp16", NULL};
const char *const mgc_enum_recompute[] = {"none", "selective", "full", NULL};
const char *const mgc_enum_recompute_method[] = {"uniform", "block", NULL};
const char *const mgc_recompute_module_names[] = {"norm", "activation", "dropout", "mlp", "moe", NULL};
const char *const mgc_enum_optimizer[] = {"adamw", NULL};
const char *const mgc_enum_decay[] = {"cosine", "linear", "constant", "wsd", NULL};
const char *const mgc_enum_wsd[] = {"exponential", "linear", "cosine", "minus_sqrt", NULL};
const char *const mgc_enum_data_format[] = {"synthetic", "megatron", NULL};

const mgc_keyinfo mgc_keys[MGC_KEY__COUNT] = {
#define MGC_X_ROW(id, path, type, field, def, lo, hi, en, flags, deftext, doc)                       \
    {path, MGC_T_##type, offsetof(mgc_config, field), (double)(def), (double)(lo), (double)(hi), en, \
     flags, deftext, doc},
    MGC_CONFIG_KEYS(MGC_X_ROW)
#undef MGC_X_ROW
};

const char *const mgc_sections[] = {"model", "moe", "parallel", "training", "optimizer",
                                    "data", "checkpoint", "hardware", NULL};

#define MAX_LIST_ITEMS 65536

/* Owned allocations of a config, freed together. */
typedef struct mgc_config_priv {
    void **owned; /* every malloc'd string and list array */
    int n, cap;
    int oom;      /* an allocation failed */
    int loaded;   /* load_text was called */
    int sets;     /* --set overrides applied */
} mgc_config_priv;

static void *own(mgc_config *c, void *p) {
    mgc_config_priv *pv = c->priv;
    if (!p) {
        pv->oom = 1;
        return NULL;
    }
    if (pv->n == pv->cap) {
        int cap = pv->cap ? pv->cap * 2 : 32;
        void **o = realloc(pv->owned, (size_t)cap * sizeof *o);
        if (!o) {
            free(p);
            pv->oom = 1;
            return NULL;
        }
        pv->owned = o;
        pv->cap = cap;
    }
    pv->owned[pv->n++] = p;
    return p;
}

static char *own_strdup(mgc_config *c, const char *s) {
    size_t n = strlen(s) + 1;
    char *p = malloc(n);
    if (p) memcpy(p, s, n);
    return own(c, p);
}

void *mgc_config_field(mgc_config *c, mgc_key k) {
    return (char *)c + mgc_keys[k].offset;
}

mgc_config *mgc_config_new(void) {
    mgc_config *c = calloc(1, sizeof *c);
    if (!c) return NULL;
    c->priv = calloc(1, sizeof *c->priv);
    if (!c->priv) {
        free(c);
        return NULL;
    }
    c->file = "<defaults>";
    c->file_loc = (mgc_loc){c->file, 0, 0};
    for (int k = 0; k < MGC_KEY__COUNT; k++) {
        const mgc_keyinfo *ki = &mgc_keys[k];
        void *f = mgc_config_field(c, (mgc_key)k);
        c->loc[k] = c->file_loc;
        switch (ki->type) {
        case MGC_T_INT: *(int64_t *)f = (int64_t)ki->def; break;
        case MGC_T_FLOAT: *(double *)f = ki->def; break;
        case MGC_T_BOOL:
        case MGC_T_ENUM: *(int *)f = (int)ki->def; break;
        default: break;
        }
    }
    c->model.name = own_strdup(c, "");
    c->data.split = own_strdup(c, "969,30,1");
    c->checkpoint.directory = own_strdup(c, "");
    c->hardware.gpu = own_strdup(c, "h100-sxm");
    int64_t *archs = own(c, malloc(2 * sizeof *archs));
    mgc_loc *al = own(c, calloc(2, sizeof *al));
    if (archs && al) {
        archs[0] = 80;
        archs[1] = 90;
        al[0] = al[1] = c->file_loc;
        c->hardware.cuda_archs = (mgc_int_list){archs, al, 2};
    }
    if (c->priv->oom) {
        mgc_config_free(c);
        return NULL;
    }
    return c;
}

void mgc_config_free(mgc_config *c) {
    if (!c) return;
    if (c->priv) {
        for (int i = 0; i < c->priv->n; i++) free(c->priv->owned[i]);
        free(c->priv->owned);
        free(c->priv);
    }
    free(c->derived.is_moe_layer);
    free(c->derived.stages);
    free(c);
}

uint32_t mgc_config_recompute_modules(const mgc_config *c) {
    uint32_t m = 0;
    const mgc_str_list *l = &c->training.recompute_modules;
    for (int i = 0; i < l->n; i++)
        for (int j = 0; mgc_recompute_module_names[j]; j++)
            if (l->v[i] && !strcmp(l->v[i], mgc_recompute_module_names[j])) m |= 1u << j;
    return m;
}

int32_t mgc_config_recompute_group(const mgc_config *c, int64_t layer) {
    if (c->training.recompute != MGC_RECOMPUTE_FULL || layer < 0 || layer >= c->model.num_layers) return -1;
    int64_t n = c->training.recompute_num_layers > 0 ? c->training.recompute_num_layers : 1;
    mgc_stage whole = {0, (int32_t)c->model.num_layers, 1, 1}; /* no stages derived: one chunk */
    const mgc_stage *st = c->derived.stages ? NULL : &whole;
    for (int64_t s = 0; !st && s < c->derived.num_stages; s++)
        if (layer >= c->derived.stages[s].first_layer &&
            layer < c->derived.stages[s].first_layer + c->derived.stages[s].num_layers)
            st = &c->derived.stages[s];
    if (!st) return -1;
    int64_t i = layer - st->first_layer; /* its place in the chunk */
    if (c->training.recompute_method == MGC_RECOMPUTE_BLOCK) return i < n ? (int32_t)layer : -1;
    return (int32_t)(st->first_layer + i / n * n);
}

mgc_loc mgc_config_loc(const mgc_config *c, mgc_key k) {
    return c->given[k] ? c->loc[k] : c->file_loc;
}

/* ---- schema lookups and "did you mean" ---------------------------------- */

int mgc_key_find(const char *path) {
    for (int k = 0; k < MGC_KEY__COUNT; k++)
        if (strcmp(mgc_keys[k].path, path) == 0) return k;
    return -1;
}

static int is_section(const char *s) {
    for (int i = 0; mgc_sections[i]; i++)
        if (strcmp(mgc_sections[i], s) == 0) return 1;
    return 0;
}

int mgc_edit_distance(const char *a, const char *b, int cap) {
    size_t la = strlen(a), lb = strlen(b);
    if (la > 64 || lb > 64) return cap + 1;
    int d[65][65];
    for (size_t i = 0; i <= la; i++) d[i][0] = (int)i;
    for (size_t j = 0; j <= lb; j++) d[0][j] = (int)j;
    for (size_t i = 1; i <= la; i++) {
        for (size_t j = 1; j <= lb; j++) {
            int cost = tolower((unsigned char)a[i - 1]) != tolower((unsigned char)b[j - 1]);
            int v = d[i - 1][j] + 1;
            if (d[i][j - 1] + 1 < v) v = d[i][j - 1] + 1;
            if (d[i - 1][j - 1] + cost < v) v = d[i - 1][j - 1] + cost;
            if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] && d[i - 2][j - 2] + 1 < v)
                v = d[i - 2][j - 2] + 1;
            d[i][j] = v;
        }
    }
    return d[la][lb] > cap ? cap + 1 : d[la][lb];
}

static const char *leaf(const char *path) {
    const char *dot = strchr(path, '.');
    return dot ? dot + 1 : path;
}

static int in_section(const char *path, const char *section) {
    size_t n = strlen(section);
    return strncmp(path, section, n) == 0 && path[n] == '.';
}

/* Common aliases from other trainers' vocabularies, so their users land on
 * our key.  Only consulted for suggestions. */
static const struct { const char *from, *to; } aliases[] = {
    {"tensor_model_parallel_size", "parallel.tensor"},
    {"tensor_parallel", "parallel.tensor"},
    {"tp", "parallel.tensor"},
    {"pipeline_model_parallel_size", "parallel.pipeline"},
    {"pipeline_parallel", "parallel.pipeline"},
    {"pp", "parallel.pipeline"},
    {"context_parallel_size", "parallel.context"},
    {"cp", "parallel.context"},
    {"expert_model_parallel_size", "parallel.expert"},
    {"ep", "parallel.expert"},
    {"dp", "parallel.data"},
    {"data_parallel_size", "parallel.data"},
    {"virtual_pipeline_model_parallel_size", "parallel.virtual_stages"},
    {"num_key_value_heads", "model.num_query_groups"},
    {"n_kv_heads", "model.num_query_groups"},
    {"kv_channels", "model.head_dim"},
    {"intermediate_size", "model.ffn_hidden_size"},
    {"n_layer", "model.num_layers"},
    {"n_head", "model.num_attention_heads"},
    {"n_embd", "model.hidden_size"},
    {"max_seq_len", "model.seq_length"},
    {"encoder_seq_length", "model.seq_length"},
    {"rope_theta", "model.rotary_base"},
    {"rms_norm_eps", "model.norm_eps"},
    {"layernorm_epsilon", "model.norm_eps"},
    {"tie_word_embeddings", "model.tie_embeddings"},
    {"untie_embeddings_and_output_weights", "model.tie_embeddings"},
    {"swiglu", "model.activation"},
    {"moe_router_topk", "moe.top_k"},
    {"num_experts_per_tok", "moe.top_k"},
    {"learning_rate", "optimizer.lr"},
    {"train_iters", "training.iterations"},
    {"seed", "training.seed"},
    {"bf16", "training.precision"},
    {"fp16", "training.precision"},
    {"recompute_granularity", "training.recompute"},
    {"recompute_method", "training.recompute_method"},
    {"moe_router_dtype", "moe.router_dtype"},
    {"recompute_num_layers", "training.recompute_num_layers"},
    {"use_distributed_optimizer", "parallel.distributed_optimizer"},
    {"lr_warmup_iters", "optimizer.warmup_iterations"},
    {"lr_decay_style", "optimizer.decay_style"},
    {"clip_grad", "optimizer.clip_grad"},
};

/* Each '_'-separated word of `name` (at least two words) is a word of `key`. */
static int words_within(const char *name, const char *key) {
    int words = 0;
    const char *p = name;
    while (*p) {
        const char *e = strchr(p, '_');
        size_t n = e ? (size_t)(e - p) : strlen(p);
        if (n == 0) return 0;
        int found = 0;
        for (const char *q = key; *q;) {
            const char *qe = strchr(q, '_');
            size_t m = qe ? (size_t)(qe - q) : strlen(q);
            if (m == n && !strncmp(p, q, n)) found = 1;
            q += m + (qe != NULL);
        }
        if (!found) return 0;
        words++;
        p += n + (e != NULL);
    }
    return words >= 2;
}

int mgc_key_suggest(const char *section, const char *name, char *out, size_t outsz) {
    /* 1. a known alias */
    for (size_t i = 0; i < sizeof aliases / sizeof aliases[0]; i++) {
        if (strcmp(aliases[i].from, name) == 0) {
            snprintf(out, outsz, "%s", aliases[i].to);
            return 1;
        }
    }
    /* 2. the same leaf name in another section */
    for (int k = 0; k < MGC_KEY__COUNT; k++) {
        if (strcmp(leaf(mgc_keys[k].path), name) == 0 && !(section && in_section(mgc_keys[k].path, section))) {
            snprintf(out, outsz, "%s", mgc_keys[k].path);
            return 1;
        }
    }
    /* 3. every '_'-separated word of the name appears in a key's name
     *    (num_heads -> num_attention_heads), own section first */
    for (int pass = 0; pass < 2; pass++) {
        for (int k = 0; k < MGC_KEY__COUNT; k++) {
            int local = section && in_section(mgc_keys[k].path, section);
            if ((pass == 0) != local || !words_within(name, leaf(mgc_keys[k].path))) continue;
            snprintf(out, outsz, "%s", mgc_keys[k].path);
            return 1;
        }
    }
    /* 4. the closest name: keys of this section (or sections at top level),
     *    then keys anywhere, by edit distance */
    int cap = (int)strlen(name) / 3 + 1;
    if (cap > 4) cap = 4;
    int best = cap + 1;
    const char *bestp = NULL;
    if (!section) {
        for (int i = 0; mgc_sections[i]; i++) {
            int dd = mgc_edit_distance(name, mgc_sections[i], cap);
            if (dd < best) best = dd, bestp = mgc_sections[i];
        }
    }
    for (int pass = 0; pass < 2; pass++) {
        for (int k = 0; k < MGC_KEY__COUNT; k++) {
            int local = section && in_section(mgc_keys[k].path, section);
            if ((pass == 0) != local) continue;
            int dd = mgc_edit_distance(name, leaf(mgc_keys[k].path), cap) + pass; /* prefer own section */
            if (dd < best) best = dd, bestp = mgc_keys[k].path;
        }
    }
    if (!bestp) return 0;
    snprintf(out, outsz, "%s", bestp);
    return 1;
}

static void unknown_key(mgc_diags *d, mgc_loc loc, const char *section, const char *name) {
    char sug[160], hint[320];
    if (mgc_key_suggest(section, name, sug, sizeof sug)) {
        snprintf(hint, sizeof hint, "did you mean '%s'?", sug);
    } else if (section) {
        snprintf(hint, sizeof hint, "see docs/model-yaml.md for the keys of '%s'", section);
    } else {
        snprintf(hint, sizeof hint, "top-level sections are model, moe, parallel, training, optimizer, data, checkpoint, hardware");
    }
    if (section)
        mgc_diag(d, MGC_SEV_ERROR, loc, hint, "unknown key '%.80s' in section '%s'", name, section);
    else
        mgc_diag(d, MGC_SEV_ERROR, loc, hint, "unknown top-level key '%.80s'", name);
}

/* ---- scalar conversion -------------------------------------------------- */

static const char *kind_name(const mgc_ynode *n) {
    switch (n->kind) {
    case MGC_Y_NULL: return "an empty value";
    case MGC_Y_SEQ: return "a list";
    case MGC_Y_MAP: return "a mapping";
    default: return n->quoted ? "a quoted string" : "a plain scalar";
    }
}

static int is_bool_text(const char *s, int *v) {
    static const char *const t[] = {"true", "True", "TRUE", "yes", "Yes", "YES", "on", "On", "ON", NULL};
    static const char *const f[] = {"false", "False", "FALSE", "no", "No", "NO", "off", "Off", "OFF", NULL};
    for (int i = 0; t[i]; i++)
        if (strcmp(s, t[i]) == 0) return *v = 1, 1;
    for (int i = 0; f[i]; i++)
        if (strcmp(s, f[i]) == 0) return *v = 0, 1;
    return 0;
}

/* Copy s without '_' digit separators (YAML 1.1 allows 1_000_000). */
static int strip_underscores(const char *s, char *buf, size_t bufsz) {
    size_t j = 0;
    for (size_t i = 0; s[i]; i++) {
        if (s[i] == '_') continue;
        if (j + 1 >= bufsz) return 0;
        buf[j++] = s[i];
    }
    buf[j] = 0;
    return j > 0;
}

static int parse_double(const char *s, double *out) {
    char buf[128];
    if (!strip_underscores(s, buf, sizeof buf)) return 0;
    if (isspace((unsigned char)buf[0])) return 0;
    /* YAML spellings of infinity and NaN (.inf, -.Inf, .NaN): not finite */
    const char *q = buf + (buf[0] == '-' || buf[0] == '+');
    if (q[0] == '.' && (!strcmp(q + 1, "inf") || !strcmp(q + 1, "Inf") || !strcmp(q + 1, "INF") ||
                        !strcmp(q + 1, "nan") || !strcmp(q + 1, "NaN") || !strcmp(q + 1, "NAN")))
        return -1;
    char *end;
    errno = 0;
    double v = strtod(buf, &end);
    if (end == buf || *end) return 0;
    if (!isfinite(v)) return -1;
    if (errno == ERANGE && fabs(v) > 1.0) return -1;
    *out = v;
    return 1;
}

static void fmt_num(char *buf, size_t n, double v) {
    if (v == floor(v) && fabs(v) < 1e16) snprintf(buf, n, "%.0f", v);
    else snprintf(buf, n, "%g", v);
}

static void range_error(mgc_diags *d, const mgc_keyinfo *ki, mgc_loc loc, const char *what, double lo, double hi) {
    char a[48], b[48], hint[160];
    fmt_num(a, sizeof a, lo);
    fmt_num(b, sizeof b, hi);
    snprintf(hint, sizeof hint, "use a value from %s to %s", a, b);
    mgc_diag(d, MGC_SEV_ERROR, loc, hint, "%s: %s is out of range", ki->path, what);
}

/* Integer from a scalar node; reports and returns 0 on failure. */
static int to_int(const mgc_keyinfo *ki, const mgc_ynode *n, int64_t *out, mgc_diags *d) {
    int b;
    if (n->kind != MGC_Y_SCALAR || n->quoted || is_bool_text(n->s, &b)) {
        mgc_diag(d, MGC_SEV_ERROR, n->loc, n->quoted ? "remove the quotes" : "write a whole number, e.g. 8",
                 "%s: expected an integer, got %s%s%.40s%s", ki->path, kind_name(n),
                 n->kind == MGC_Y_SCALAR ? " '" : "", n->kind == MGC_Y_SCALAR ? n->s : "",
                 n->kind == MGC_Y_SCALAR ? "'" : "");
        return 0;
    }
    char buf[128];
    int ok = strip_underscores(n->s, buf, sizeof buf);
    char *end = buf;
    errno = 0;
    long long v = 0;
    if (ok) {
        const char *p = buf;
        int neg = 0;
        if (*p == '+' || *p == '-') neg = *p++ == '-';
        if (p[0] == '0' && (p[1] == 'x' || p[1] == 'X') && isxdigit((unsigned char)p[2])) {
            unsigned long long u = strtoull(p + 2, &end, 16);
            if (errno == ERANGE || u > (unsigned long long)INT64_MAX) errno = ERANGE;
            v = neg ? -(long long)u : (long long)u;
        } else if (isdigit((unsigned char)p[0])) {
            v = strtoll(buf, &end, 10);
        } else {
            end = buf; /* not a number */
        }
    }
    if (ok && end != buf && *end && errno == 0) {
        /* 1e6 or 4096.0: accept when it is an exact integer */
        double dv;
        int r = parse_double(n->s, &dv);
        if (r == 1 && dv == floor(dv) && fabs(dv) <= 9.2e18) {
            v = (long long)dv;
            end = buf + strlen(buf);
        } else if (r == 1) {
            mgc_diag(d, MGC_SEV_ERROR, n->loc, "write a whole number", "%s: expected an integer, got '%.40s'",
                     ki->path, n->s);
            return 0;
        }
    }
    if (!ok || end == buf || *end) {
        mgc_diag(d, MGC_SEV_ERROR, n->loc, "write a whole number, e.g. 8", "%s: expected an integer, got '%.40s'",
                 ki->path, n->s);
        return 0;
    }
    if (errno == ERANGE || (double)v < ki->lo || (double)v > ki->hi) {
        char what[96];
        snprintf(what, sizeof what, "%.40s", n->s);
        range_error(d, ki, n->loc, what, ki->lo, ki->hi);
        return 0;
    }
    *out = v;
    return 1;
}

static int to_float(const mgc_keyinfo *ki, const mgc_ynode *n, double *out, mgc_diags *d) {
    int b;
    if (n->kind != MGC_Y_SCALAR || n->quoted || is_bool_text(n->s, &b)) {
        mgc_diag(d, MGC_SEV_ERROR, n->loc, n->quoted ? "remove the quotes" : "write a number, e.g. 0.1 or 3e-4",
                 "%s: expected a number, got %s%s%.40s%s", ki->path, kind_name(n),
                 n->kind == MGC_Y_SCALAR ? " '" : "", n->kind == MGC_Y_SCALAR ? n->s : "",
                 n->kind == MGC_Y_SCALAR ? "'" : "");
        return 0;
    }
    double v;
    int r = parse_double(n->s, &v);
    if (r == 0) {
        mgc_diag(d, MGC_SEV_ERROR, n->loc, "write a number, e.g. 0.1 or 3e-4", "%s: expected a number, got '%.40s'",
                 ki->path, n->s);
        return 0;
    }
    if (r < 0 || v < ki->lo || v > ki->hi) {
        char what[96];
        snprintf(what, sizeof what, "%.40s", n->s);
        range_error(d, ki, n->loc, what, ki->lo, ki->hi);
        return 0;
    }
    *out = v;
    return 1;
}

static int to_bool(const mgc_keyinfo *ki, const mgc_ynode *n, int *out, mgc_diags *d) {
    if (n->kind != MGC_Y_SCALAR || n->quoted || !is_bool_text(n->s, out)) {
        mgc_diag(d, MGC_SEV_ERROR, n->loc, "write true or false", "%s: expected true or false, got %s%s%.40s%s",
                 ki->path, kind_name(n), n->kind == MGC_Y_SCALAR ? " '" : "", n->kind == MGC_Y_SCALAR ? n->s : "",
                 n->kind == MGC_Y_SCALAR ? "'" : "");
        return 0;
    }
    return 1;
}

/* Enum names compare case-insensitively with '_' == '-', so `RMSNorm` and
 * `interleaved_1f1b` are accepted. */
static int enum_eq(const char *a, const char *b) {
    for (; *a && *b; a++, b++) {
        char x = (char)tolower((unsigned char)*a), y = (char)tolower((unsigned char)*b);
        if (x == '_') x = '-';
        if (y == '_') y = '-';
        if (x != y) return 0;
    }
    return *a == *b;
}

static int to_enum(const mgc_keyinfo *ki, const mgc_ynode *n, int *out, mgc_diags *d) {
    char opts[256] = "";
    for (int i = 0; ki->enums[i]; i++) {
        if (n->kind == MGC_Y_SCALAR && enum_eq(n->s, ki->enums[i])) {
            *out = i;
            return 1;
        }
        size_t l = strlen(opts);
        snprintf(opts + l, sizeof opts - l, "%s%s", i ? ", " : "", ki->enums[i]);
    }
    char hint[400];
    const char *best = NULL;
    int bestd = 3;
    for (int i = 0; n->kind == MGC_Y_SCALAR && ki->enums[i]; i++) {
        int dd = mgc_edit_distance(n->s, ki->enums[i], 2);
        if (dd < bestd) bestd = dd, best = ki->enums[i];
    }
    if (best) snprintf(hint, sizeof hint, "did you mean '%s'? (one of: %s)", best, opts);
    else snprintf(hint, sizeof hint, "use one of: %s", opts);
    if (n->kind == MGC_Y_SCALAR)
        mgc_diag(d, MGC_SEV_ERROR, n->loc, hint, "%s: unknown value '%.40s'", ki->path, n->s);
    else
        mgc_diag(d, MGC_SEV_ERROR, n->loc, hint, "%s: expected a name, got %s", ki->path, kind_name(n));
    return 0;
}

static int to_string(mgc_config *c, const mgc_keyinfo *ki, const mgc_ynode *n, char **out, mgc_diags *d) {
    if (n->kind == MGC_Y_NULL) {
        *out = own_strdup(c, "");
        return *out != NULL;
    }
    if (n->kind != MGC_Y_SCALAR) {
        mgc_diag(d, MGC_SEV_ERROR, n->loc, "write a single string value", "%s: expected a string, got %s", ki->path,
                 kind_name(n));
        return 0;
    }
    *out = own_strdup(c, n->s);
    return *out != NULL;
}

/* Where a string's text starts: past the opening quote of a quoted scalar, so
 * checks can point at a column inside it. */
static mgc_loc text_loc(const mgc_ynode *n) {
    mgc_loc l = n->loc;
    if (n->kind == MGC_Y_SCALAR && n->quoted == 1) l.col++;
    return l;
}

/* ---- applying one key ---------------------------------------------------- */

static int list_items(const mgc_keyinfo *ki, const mgc_ynode *n, mgc_diags *d) {
    if (n->kind != MGC_Y_SEQ) {
        mgc_diag(d, MGC_SEV_ERROR, n->loc, "write a list, e.g. [1, 3, 5] or one `- item` per line",
                 "%s: expected a list, got %s", ki->path, kind_name(n));
        return -1;
    }
    if (n->n > MAX_LIST_ITEMS) {
        mgc_diag(d, MGC_SEV_ERROR, n->loc, NULL, "%s: more than %d items", ki->path, MAX_LIST_ITEMS);
        return -1;
    }
    return n->n;
}

static int apply_blend(mgc_config *c, const mgc_keyinfo *ki, const mgc_ynode *n, mgc_blend *out, mgc_diags *d) {
    int cnt = list_items(ki, n, d);
    if (cnt < 0) return 0;
    mgc_blend b = {0};
    b.path = own(c, calloc((size_t)cnt + 1, sizeof *b.path));
    b.weight = own(c, calloc((size_t)cnt + 1, sizeof *b.weight));
    b.loc = own(c, calloc((size_t)cnt + 1, sizeof *b.loc));
    if (!b.path || !b.weight || !b.loc) return 0;
    int ok = 1;
    for (int i = 0; i < cnt; i++) {
        const mgc_ynode *it = n->kids[i];
        b.loc[i] = it->loc;
        b.weight[i] = 1.0;
        if (it->kind == MGC_Y_SCALAR) {
            b.path[i] = own_strdup(c, it->s);
        } else if (it->kind == MGC_Y_MAP) {
            for (int j = 0; j < it->n; j++) {
                const char *k = it->keys[j]->s;
                const mgc_ynode *v = it->kids[j];
                if (strcmp(k, "path") == 0) {
                    if (v->kind != MGC_Y_SCALAR) {
                        mgc_diag(d, MGC_SEV_ERROR, v->loc, "write the dataset prefix, e.g. data/corpus_text_document",
                                 "%s[%d].path: expected a string, got %s", ki->path, i, kind_name(v));
                        ok = 0;
                    } else {
                        b.path[i] = own_strdup(c, v->s);
                    }
                } else if (strcmp(k, "weight") == 0) {
                    mgc_keyinfo wk = {"data.paths[].weight", MGC_T_FLOAT, 0, 1, 1e-12, 1e12, NULL, 0, NULL, NULL};
                    if (!to_float(&wk, v, &b.weight[i], d)) ok = 0;
                } else {
                    char hint[96];
                    snprintf(hint, sizeof hint, "each entry has `path` and optional `weight`%s",
                             mgc_edit_distance(k, "weight", 2) <= 2 ? "; did you mean 'weight'?"
                             : mgc_edit_distance(k, "path", 2) <= 2 ? "; did you mean 'path'?" : "");
                    mgc_diag(d, MGC_SEV_ERROR, it->keys[j]->loc, hint, "unknown key '%.40s' in %s[%d]", k, ki->path, i);
                    ok = 0;
                }
            }
            if (!b.path[i] && ok) {
                mgc_diag(d, MGC_SEV_ERROR, it->loc, "add `path: PREFIX`", "%s[%d]: missing `path`", ki->path, i);
                ok = 0;
            }
        } else {
            mgc_diag(d, MGC_SEV_ERROR, it->loc, "write `- PREFIX` or `- {path: PREFIX, weight: 0.3}`",
                     "%s[%d]: expected a path or a {path, weight} mapping, got %s", ki->path, i, kind_name(it));
            ok = 0;
        }
    }
    if (!ok) return 0;
    b.n = cnt;
    *out = b;
    return 1;
}

/* Convert node n for key k and store it.  Returns 1 when stored. */
static int apply_key(mgc_config *c, mgc_key k, const mgc_ynode *n, mgc_diags *d) {
    const mgc_keyinfo *ki = &mgc_keys[k];
    void *f = mgc_config_field(c, k);
    if (n->kind == MGC_Y_NULL && ki->type != MGC_T_STRING) {
        /* `key: ~` or `key:` means "the default" */
        c->given[k] = 0;
        c->loc[k] = n->loc;
        mgc_config *fresh = mgc_config_new();
        if (!fresh) return 0;
        switch (ki->type) {
        case MGC_T_INT: *(int64_t *)f = *(int64_t *)mgc_config_field(fresh, k); break;
        case MGC_T_FLOAT: *(double *)f = *(double *)mgc_config_field(fresh, k); break;
        case MGC_T_BOOL:
        case MGC_T_ENUM: *(int *)f = *(int *)mgc_config_field(fresh, k); break;
        case MGC_T_INT_LIST:
            if (k == MGC_KEY_HW_ARCHS) {
                /* keep our own copy of the default list */
                int64_t *v = own(c, malloc(2 * sizeof *v));
                mgc_loc *l = own(c, calloc(2, sizeof *l));
                if (v && l) {
                    v[0] = 80, v[1] = 90;
                    *(mgc_int_list *)f = (mgc_int_list){v, l, 2};
                }
            } else {
                memset(f, 0, sizeof(mgc_int_list));
            }
            break;
        case MGC_T_STRING_LIST: memset(f, 0, sizeof(mgc_str_list)); break;
        case MGC_T_BLEND: memset(f, 0, sizeof(mgc_blend)); break;
        default: break;
        }
        mgc_config_free(fresh);
        return 1;
    }
    int ok = 0;
    switch (ki->type) {
    case MGC_T_INT: {
        int64_t v;
        if ((ok = to_int(ki, n, &v, d))) *(int64_t *)f = v;
        break;
    }
    case MGC_T_FLOAT: {
        double v;
        if ((ok = to_float(ki, n, &v, d))) *(double *)f = v;
        break;
    }
    case MGC_T_BOOL: {
        int v;
        if ((ok = to_bool(ki, n, &v, d))) *(int *)f = v;
        break;
    }
    case MGC_T_ENUM: {
        int v;
        if ((ok = to_enum(ki, n, &v, d))) *(int *)f = v;
        break;
    }
    case MGC_T_STRING: {
        char *v;
        if ((ok = to_string(c, ki, n, &v, d))) *(char **)f = v;
        break;
    }
    case MGC_T_INT_LIST: {
        const mgc_ynode *one[1] = {n};
        const mgc_ynode *const *items = one;
        int cnt = 1;
        if (n->kind == MGC_Y_SEQ) {
            cnt = list_items(ki, n, d);
            items = (const mgc_ynode *const *)n->kids;
        }
        if (cnt < 0) break;
        int64_t *v = own(c, calloc((size_t)cnt + 1, sizeof *v));
        mgc_loc *l = own(c, calloc((size_t)cnt + 1, sizeof *l));
        if (!v || !l) break;
        ok = 1;
        for (int i = 0; i < cnt; i++) {
            l[i] = items[i]->loc;
            if (!to_int(ki, items[i], &v[i], d)) ok = 0;
        }
        if (ok) *(mgc_int_list *)f = (mgc_int_list){v, l, cnt};
        break;
    }
    case MGC_T_STRING_LIST: {
        int cnt = list_items(ki, n, d);
        if (cnt < 0) break;
        char **v = own(c, calloc((size_t)cnt + 1, sizeof *v));
        mgc_loc *l = own(c, calloc((size_t)cnt + 1, sizeof *l));
        if (!v || !l) break;
        ok = 1;
        for (int i = 0; i < cnt; i++) {
            l[i] = text_loc(n->kids[i]);
            if (!to_string(c, ki, n->kids[i], &v[i], d)) ok = 0;
        }
        if (ok) *(mgc_str_list *)f = (mgc_str_list){v, l, cnt};
        break;
    }
    case MGC_T_BLEND: ok = apply_blend(c, ki, n, (mgc_blend *)f, d); break;
    }
    if (ok) {
        c->given[k] = 1;
        c->loc[k] = ki->type == MGC_T_STRING ? text_loc(n) : n->loc;
    }
    return ok;
}

static void apply_section(mgc_config *c, const char *section, const mgc_ynode *map, mgc_diags *d) {
    if (map->kind == MGC_Y_NULL) return; /* `moe:` with nothing under it */
    if (map->kind != MGC_Y_MAP) {
        char hint[128];
        snprintf(hint, sizeof hint, "write the keys of '%s' indented under it, e.g. `%s:\\n  key: value`", section, section);
        mgc_diag(d, MGC_SEV_ERROR, map->loc, hint, "section '%s' must be a mapping, got %s", section, kind_name(map));
        return;
    }
    for (int i = 0; i < map->n; i++) {
        char path[256];
        snprintf(path, sizeof path, "%s.%s", section, map->keys[i]->s);
        int k = strlen(map->keys[i]->s) < 128 ? mgc_key_find(path) : -1;
        if (k < 0) {
            unknown_key(d, map->keys[i]->loc, section, map->keys[i]->s);
            continue;
        }
        apply_key(c, (mgc_key)k, map->kids[i], d);
    }
}

static int apply_tree(mgc_config *c, const mgc_ynode *root, mgc_diags *d) {
    int before = d->errors;
    if (root->kind != MGC_Y_MAP) {
        mgc_diag(d, MGC_SEV_ERROR, root->loc, "a config is a mapping of sections: model:, parallel:, training: ...",
                 "expected a mapping at the top level, got %s", kind_name(root));
        return 1;
    }
    for (int i = 0; i < root->n; i++) {
        const char *name = root->keys[i]->s;
        if (is_section(name)) apply_section(c, name, root->kids[i], d);
        else unknown_key(d, root->keys[i]->loc, NULL, name);
    }
    return d->errors != before;
}

/* ---- public loading entry points -------------------------------------- */

int mgc_config_load_text(mgc_config *c, const char *name, const char *text, size_t len, mgc_diags *d) {
    int before = d->errors;
    char *file = own_strdup(c, name);
    if (!file) {
        mgc_diag(d, MGC_SEV_ERROR, (mgc_loc){name, 0, 0}, NULL, "out of memory");
        return 1;
    }
    c->file = file;
    c->file_loc = (mgc_loc){file, 0, 0};
    for (int k = 0; k < MGC_KEY__COUNT; k++)
        if (!c->given[k]) c->loc[k] = c->file_loc;
    c->priv->loaded = 1;
    mgc_ytree *t = mgc_ytree_parse(file, text, len, d);
    if (!t) return 1;
    /* node locations point at the tree's copy of the name; repoint to ours */
    apply_tree(c, mgc_ytree_root(t), d);
    /* strings were copied into the config, but locations still point into
     * the tree's arena: rebase them onto the config-owned file name */
    for (int k = 0; k < MGC_KEY__COUNT; k++) {
        if (c->loc[k].file == mgc_ytree_file(t)) c->loc[k].file = file;
        mgc_loc *locs = NULL;
        int cnt = 0;
        void *f = mgc_config_field(c, (mgc_key)k);
        if (mgc_keys[k].type == MGC_T_INT_LIST) locs = ((mgc_int_list *)f)->loc, cnt = ((mgc_int_list *)f)->n;
        if (mgc_keys[k].type == MGC_T_STRING_LIST) locs = ((mgc_str_list *)f)->loc, cnt = ((mgc_str_list *)f)->n;
        if (mgc_keys[k].type == MGC_T_BLEND) locs = ((mgc_blend *)f)->loc, cnt = ((mgc_blend *)f)->n;
        for (int i = 0; i < cnt; i++)
            if (locs[i].file == mgc_ytree_file(t)) locs[i].file = file;
    }
    mgc_ytree_free(t);
    if (c->priv->oom) mgc_diag(d, MGC_SEV_ERROR, c->file_loc, NULL, "out of memory while loading the config");
    return d->errors != before;
}

int mgc_config_load_file(mgc_config *c, const char *path, mgc_diags *d) {
    mgc_loc whole = {path, 0, 0};
    FILE *f = fopen(path, "rb");
    if (!f) {
        mgc_diag(d, MGC_SEV_ERROR, whole, "check the path; mgc reads YAML model configs such as models/gpt2-124m.yaml",
                 "cannot open: %s", strerror(errno));
        return 1;
    }
    size_t cap = 1 << 14, len = 0;
    char *buf = malloc(cap);
    int err = 0;
    while (buf) {
        if (len == cap) {
            if (cap > MGC_YAML_MAX_BYTES) break; /* yamltree reports the size */
            char *nb = realloc(buf, cap * 2);
            if (!nb) {
                free(buf);
                buf = NULL;
                break;
            }
            buf = nb;
            cap *= 2;
        }
        size_t r = fread(buf + len, 1, cap - len, f);
        len += r;
        if (r == 0) {
            err = ferror(f);
            break;
        }
    }
    fclose(f);
    if (!buf || err) {
        free(buf);
        mgc_diag(d, MGC_SEV_ERROR, whole, "is it a directory or unreadable?", "cannot read: %s",
                 buf ? "read error" : "out of memory");
        return 1;
    }
    int r = mgc_config_load_text(c, path, buf, len, d);
    free(buf);
    return r;
}

int mgc_config_set(mgc_config *c, const char *assignment, const char *origin, mgc_diags *d) {
    int before = d->errors;
    char *file = own_strdup(c, origin);
    if (!file) return 1;
    mgc_loc at = {file, 1, 1};
    const char *eq = strchr(assignment, '=');
    if (!eq || eq == assignment) {
        mgc_diag(d, MGC_SEV_ERROR, at, "write --set section.key=value, e.g. --set parallel.tensor=2",
                 "expected section.key=value, got '%.80s'", assignment);
        return 1;
    }
    size_t plen = (size_t)(eq - assignment);
    char path[256];
    if (plen >= sizeof path) {
        mgc_diag(d, MGC_SEV_ERROR, at, NULL, "key path is too long");
        return 1;
    }
    memcpy(path, assignment, plen);
    path[plen] = 0;
    int k = mgc_key_find(path);
    const char *dot = strchr(path, '.');
    if (k < 0 && !is_section(path)) {
        char section[64] = "";
        if (dot && (size_t)(dot - path) < sizeof section) {
            memcpy(section, path, (size_t)(dot - path));
            section[dot - path] = 0;
        }
        if (dot && is_section(section)) unknown_key(d, at, section, dot + 1);
        else unknown_key(d, at, NULL, path);
        return 1;
    }
    /* The value is YAML text; its positions are shifted past "path=". */
    mgc_ytree *t = mgc_ytree_parse(file, eq + 1, strlen(eq + 1), d);
    if (!t) return 1;
    mgc_ynode *v = mgc_ytree_root(t);
    if (v->kind == MGC_Y_MAP && v->n == 0 && eq[1] == 0) v->kind = MGC_Y_NULL; /* `key=` means default */
    /* shift locations: the value starts at column plen + 2 of the argument */
    mgc_ynode *stack[MGC_YAML_MAX_DEPTH * 2 + 8];
    int sp = 0;
    stack[sp++] = v;
    while (sp) {
        mgc_ynode *n = stack[--sp];
        if (n->loc.line == 1) n->loc.col += (int)plen + 1;
        n->loc.file = file;
        for (int i = 0; i < n->n && sp < (int)(sizeof stack / sizeof stack[0]) - 2; i++) {
            stack[sp++] = n->kids[i];
            if (n->keys) stack[sp++] = n->keys[i];
        }
    }
    if (k >= 0) apply_key(c, (mgc_key)k, v, d);
    else apply_section(c, path, v, d);
    mgc_ytree_free(t);
    c->priv->sets++;
    return d->errors != before;
}

int mgc_config_finalize(mgc_config *c, mgc_diags *d) {
    int before = d->errors;
    if (c->priv->oom) {
        mgc_diag(d, MGC_SEV_ERROR, c->file_loc, NULL, "out of memory while loading the config");
        return 1;
    }
    /* required keys */
    for (int k = 0; k < MGC_KEY__COUNT; k++) {
        if ((mgc_keys[k].flags & MGC_KF_REQUIRED) && !c->given[k]) {
            char hint[128];
            snprintf(hint, sizeof hint, "add `%s: VALUE` under `%.*s:` or pass --set %s=VALUE", leaf(mgc_keys[k].path),
                     (int)(leaf(mgc_keys[k].path) - mgc_keys[k].path - 1), mgc_keys[k].path, mgc_keys[k].path);
            mgc_diag(d, MGC_SEV_ERROR, c->file_loc, hint, "missing required key '%s'", mgc_keys[k].path);
        }
    }
    if (d->errors != before) return 1; /* consistency rules need the required keys */
    mgc_check_config(c, d);
    return d->errors != before;
}
