/* plan.c - see plan.h.  Sections: name tables, allocation, the string table
 * (append-only, interned through an open-addressing index of offsets). */
#include "plan.h"

#include <stdlib.h>
#include <string.h>

/* ---- name tables ---------------------------------------------------------- */

#define COUNT_OF(a) (sizeof(a) / sizeof((a)[0]))
#define NAME_OF(table, i)                                                                          \
    ((unsigned)(i) < COUNT_OF(table) && table[(unsigned)(i)] ? table[(unsigned)(i)] : "?")

static const char *const dtype_names[] = {"fp32", "bf16", "fp16", "int64", "int32", "uint8"};
static const uint8_t dtype_sizes[] = {4, 2, 2, 8, 4, 1};
static const char *const role_names[] = {"param", "grad", "activation", "act_grad",
                                         "input", "loss", "workspace"};
static const char *const buf_names[] = {"weight", "grad",      "master",     "adam_m",
                                        "adam_v", "stash",     "activation", "recompute",
                                        "logits", "workspace", "comm",       "input"};
static const char *const op_names[MGC_POP__END] = {
    [MGC_POP_EMBEDDING] = "embedding",
    [MGC_POP_DROPOUT] = "dropout",
    [MGC_POP_NORM] = "norm",
    [MGC_POP_LINEAR] = "linear",
    [MGC_POP_QKV_SPLIT] = "qkv_split",
    [MGC_POP_ROPE] = "rope",
    [MGC_POP_ATTENTION] = "attention",
    [MGC_POP_DROPOUT_ADD] = "dropout_add",
    [MGC_POP_GELU] = "gelu",
    [MGC_POP_SWIGLU] = "swiglu",
    [MGC_POP_ADD] = "add",
    [MGC_POP_MOE_ROUTE] = "moe_route",
    [MGC_POP_MOE_DISPATCH] = "moe_dispatch",
    [MGC_POP_GROUPED_LINEAR] = "grouped_linear",
    [MGC_POP_MOE_COMBINE] = "moe_combine",
    [MGC_POP_CROSS_ENTROPY] = "cross_entropy",
    [MGC_POP_ADD_NORM] = "add_norm",
    [MGC_POP_LINEAR_GELU] = "linear_gelu",
    [MGC_POP_EMBEDDING_NORM] = "embedding_norm",
    [MGC_POP_EMBEDDING_BWD] = "embedding_bwd",
    [MGC_POP_DROPOUT_BWD] = "dropout_bwd",
    [MGC_POP_NORM_BWD] = "norm_bwd",
    [MGC_POP_LINEAR_DGRAD] = "linear_dgrad",
    [MGC_POP_LINEAR_WGRAD] = "linear_wgrad",
    [MGC_POP_QKV_SPLIT_BWD] = "qkv_split_bwd",
    [MGC_POP_ROPE_BWD] = "rope_bwd",
    [MGC_POP_ATTENTION_BWD] = "attention_bwd",
    [MGC_POP_DROPOUT_ADD_BWD] = "dropout_add_bwd",
    [MGC_POP_GELU_BWD] = "gelu_bwd",
    [MGC_POP_SWIGLU_BWD] = "swiglu_bwd",
    [MGC_POP_ADD_BWD] = "add_bwd",
    [MGC_POP_MOE_ROUTE_BWD] = "moe_route_bwd",
    [MGC_POP_MOE_DISPATCH_BWD] = "moe_dispatch_bwd",
    [MGC_POP_GROUPED_LINEAR_DGRAD] = "grouped_linear_dgrad",
    [MGC_POP_GROUPED_LINEAR_WGRAD] = "grouped_linear_wgrad",
    [MGC_POP_MOE_COMBINE_BWD] = "moe_combine_bwd",
    [MGC_POP_CROSS_ENTROPY_BWD] = "cross_entropy_bwd",
    [MGC_POP_LINEAR_DGRAD_GELU] = "linear_dgrad_gelu",
    [MGC_POP_ALL_REDUCE] = "all_reduce",
    [MGC_POP_ALL_GATHER] = "all_gather",
    [MGC_POP_REDUCE_SCATTER] = "reduce_scatter",
    [MGC_POP_ALL_TO_ALL] = "all_to_all",
    [MGC_POP_BROADCAST] = "broadcast",
};
static const char *const status_names[] = {
    "ok", "i/o error", "bad format", "other version", "out of memory", "invalid plan"};

_Static_assert(COUNT_OF(dtype_names) == MGC_DT__COUNT, "dtype names");
_Static_assert(COUNT_OF(dtype_sizes) == MGC_DT__COUNT, "dtype sizes");
_Static_assert(COUNT_OF(role_names) == MGC_TR_WORKSPACE + 1, "tensor role names");
_Static_assert(COUNT_OF(buf_names) == MGC_BUF__COUNT, "buffer kind names");
_Static_assert(COUNT_OF(status_names) == MGC_PLAN_ERR_INVALID + 1, "status names");

size_t mgc_dtype_size(mgc_dtype t) {
    return (unsigned)t < COUNT_OF(dtype_sizes) ? dtype_sizes[(unsigned)t] : 0;
}
const char *mgc_dtype_name(mgc_dtype t) {
    return NAME_OF(dtype_names, t);
}
const char *mgc_tensor_role_name(mgc_plan_tensor_role r) {
    return NAME_OF(role_names, r);
}
const char *mgc_buf_kind_name(mgc_buf_kind k) {
    return NAME_OF(buf_names, k);
}
int mgc_plan_op_dropout_attr(const mgc_plan_op *op) {
    switch ((mgc_plan_op_kind)op->kind) {
    case MGC_POP_DROPOUT:
    case MGC_POP_DROPOUT_BWD:
    case MGC_POP_DROPOUT_ADD:
    case MGC_POP_DROPOUT_ADD_BWD: return 0;
    case MGC_POP_ADD_NORM:
    case MGC_POP_ATTENTION:
    case MGC_POP_ATTENTION_BWD: return 1;
    case MGC_POP_NORM_BWD: return op->flags & MGC_POF_DROPBWD ? 1 : -1;
    case MGC_POP_EMBEDDING_NORM: return op->n_out > 2 ? 2 : -1;
    default: return -1;
    }
}

int64_t mgc_plan_expert_bias_layer(const char *name) {
    static const char suffix[] = ".mlp.router.expert_bias";
    size_t n = name ? strlen(name) : 0, k = sizeof suffix - 1;
    const char *p = n > k && !strcmp(name + n - k, suffix) ? strstr(name, "layers.") : NULL;
    char *end = NULL;
    long long l = p ? strtoll(p + 7, &end, 10) : -1;
    return p && end == name + n - k && l >= 0 ? (int64_t)l : -1;
}

const char *mgc_plan_op_name(mgc_plan_op_kind k) {
    return NAME_OF(op_names, k);
}
const char *mgc_plan_status_name(mgc_plan_status s) {
    return NAME_OF(status_names, s);
}

int64_t mgc_plan_tensor_ld(const mgc_plan_tensor *t) {
    if (t->ld) return t->ld;
    return t->rank > 0 ? t->dim[t->rank - 1] : 1;
}

uint64_t mgc_plan_tensor_data_bytes(const mgc_plan_tensor *t) {
    if (!t->ld) return t->bytes;
    uint64_t n = mgc_dtype_size((mgc_dtype)t->dtype);
    for (int i = 0; i < t->rank && i < MGC_PLAN_MAX_RANK; i++)
        n *= (uint64_t)t->dim[i];
    return n;
}

int mgc_plan_attn_geom(const mgc_plan_chunk *ch, const mgc_plan_op *op, mgc_attn_geom *g) {
    memset(g, 0, sizeof *g);
    if (op->kind != MGC_POP_ATTENTION && op->kind != MGC_POP_ATTENTION_BWD) return -1;
    g->fused = (op->flags & MGC_POF_QKV) != 0;
    int need = g->fused ? 1 : 3;
    if (op->kind == MGC_POP_ATTENTION_BWD) need += 3;
    if (op->n_in < need) return -1;
    for (int i = 0; i < need; i++)
        if (op->in[i] < 0 || op->in[i] >= ch->n_tensors) return -1;
    const mgc_plan_tensor *x = &ch->tensors[op->in[0]];
    if (g->fused) {
        int64_t A = op->iattr[1], G = op->iattr[2];
        if (x->rank != 3 || A <= 0 || G <= 0 || A % G || x->dim[2] % (A + 2 * G)) return -1;
        g->sq = g->sk = x->dim[0], g->b = x->dim[1], g->A = A, g->G = G;
        g->d = x->dim[2] / (A + 2 * G);
        g->in_out = 1;
        return 0;
    }
    const mgc_plan_tensor *k = &ch->tensors[op->in[1]];
    if (x->rank != 4 || k->rank != 4) return -1;
    g->sq = x->dim[0], g->b = x->dim[1], g->A = x->dim[2], g->d = x->dim[3];
    g->sk = k->dim[0], g->G = k->dim[2];
    g->in_out = 3;
    return g->G > 0 && g->A % g->G == 0 ? 0 : -1;
}

/* ---- allocation ----------------------------------------------------------- */

mgc_plan *mgc_plan_new(void) {
    return calloc(1, sizeof(mgc_plan));
}

void mgc_plan_free(mgc_plan *p) {
    if (!p) return;
    if (p->stages) {
        for (int64_t s = 0; s < p->n_stages; s++) {
            mgc_stage_program *st = &p->stages[s];
            if (st->chunks) {
                for (int64_t c = 0; c < st->n_chunks; c++) {
                    free(st->chunks[c].tensors);
                    free(st->chunks[c].fwd);
                    free(st->chunks[c].bwd);
                }
            }
            free(st->chunks);
            free(st->instrs);
            free(st->buffers);
            free(st->buckets);
        }
    }
    free(p->stages);
    free(p->kernels);
    free(p->kbin);
    free(p->config);
    free(p->strings);
    free(p->str_index);
    free(p);
}

/* ---- the string table -----------------------------------------------------
 * The index is private to this file: str_index_cap slots of two words each,
 * (offset + 1, hash); 0 marks an empty slot.  Keeping the hash in the slot
 * makes growing the index a copy (no string is hashed twice) and lets a probe
 * skip other strings without touching them.  The hash only decides slots, so
 * it is free to change: offsets depend on insertion order alone. */

/* A multiplicative hash over 8-byte words of the n bytes of s (n = strlen). */
static uint32_t str_hash(const char *s, size_t n) {
    const uint64_t k = UINT64_C(0x9E3779B97F4A7C15);
    uint64_t h = (uint64_t)n * k;
    while (n >= 8) {
        uint64_t w;
        memcpy(&w, s, 8);
        h = (h ^ w) * k;
        h ^= h >> 29;
        s += 8, n -= 8;
    }
    if (n) {
        uint64_t w = 0;
        memcpy(&w, s, n);
        h = (h ^ w) * k;
    }
    h ^= h >> 32;
    return (uint32_t)h;
}

/* Index slot holding s (n bytes, hash h), or the empty slot where it goes. */
static uint64_t index_find(const mgc_plan *p, const char *s, size_t n, uint32_t h) {
    uint64_t mask = p->str_index_cap - 1;
    for (uint64_t i = h & mask;; i = (i + 1) & mask) {
        uint32_t v = p->str_index[2 * i];
        if (v == 0) return i;
        if (p->str_index[2 * i + 1] == h && v - 1 < p->strings_len && p->strings_len - (v - 1) > n &&
            memcmp(p->strings + (v - 1), s, n + 1) == 0)
            return i;
    }
}

/* Make room for one more entry; moves the entries already indexed. */
static int index_reserve(mgc_plan *p) {
    if (p->str_index && (p->str_index_used + 1) * 4 <= p->str_index_cap * 3) return 0;
    uint64_t cap = p->str_index_cap ? p->str_index_cap * 2 : 256;
    uint32_t *old = p->str_index;
    uint64_t old_cap = p->str_index_cap;
    uint32_t *slots = calloc(cap, 2 * sizeof *slots);
    if (!slots) return -1;
    uint64_t mask = cap - 1;
    for (uint64_t i = 0; i < old_cap; i++) {
        uint32_t v = old[2 * i], h = old[2 * i + 1];
        if (v == 0) continue;
        uint64_t j = h & mask;
        while (slots[2 * j])
            j = (j + 1) & mask;
        slots[2 * j] = v;
        slots[2 * j + 1] = h;
    }
    free(old);
    p->str_index = slots;
    p->str_index_cap = cap;
    return 0;
}

/* Build the index over a table that was filled without it (a decoded plan). */
static int index_build(mgc_plan *p) {
    p->str_index_used = 0;
    for (uint64_t off = 1; off < p->strings_len;) {
        const char *s = p->strings + off;
        size_t n = strlen(s);
        if (index_reserve(p)) return -1;
        uint32_t h = str_hash(s, n);
        uint64_t slot = index_find(p, s, n, h);
        if (p->str_index[2 * slot] == 0) {
            p->str_index[2 * slot] = (uint32_t)off + 1;
            p->str_index[2 * slot + 1] = h;
            p->str_index_used++;
        }
        off += n + 1;
    }
    return 0;
}

static int table_append(mgc_plan *p, const char *s, size_t n) {
    if (p->strings_len + n > p->strings_cap) {
        uint64_t cap = p->strings_cap ? p->strings_cap : 4096;
        while (cap < p->strings_len + n)
            cap *= 2;
        if (cap > UINT32_MAX) cap = UINT32_MAX;
        char *t = realloc(p->strings, cap);
        if (!t) return -1;
        p->strings = t;
        p->strings_cap = cap;
    }
    memcpy(p->strings + p->strings_len, s, n);
    p->strings_len += n;
    return 0;
}

uint32_t mgc_plan_str(mgc_plan *p, const char *s) {
    if (!p) return UINT32_MAX;
    if (p->strings_len == 0 && table_append(p, "", 1)) return UINT32_MAX;
    if (p->strings[p->strings_len - 1] != '\0') return UINT32_MAX; /* not a table */
    if (!s || !*s) return 0;
    /* a string of the table itself (from mgc_plan_strat) is its own offset; it
     * must not be copied from a buffer the append may move */
    uintptr_t at = (uintptr_t)s, base = (uintptr_t)p->strings;
    if (at >= base && at - base < p->strings_len) return (uint32_t)(at - base);
    if (!p->str_index && index_build(p)) return UINT32_MAX;
    if (index_reserve(p)) return UINT32_MAX;
    size_t n = strlen(s);
    uint32_t h = str_hash(s, n);
    uint64_t slot = index_find(p, s, n, h);
    if (p->str_index[2 * slot]) return p->str_index[2 * slot] - 1;
    n++;
    if (n > UINT32_MAX || p->strings_len + n > UINT32_MAX) return UINT32_MAX;
    uint32_t off = (uint32_t)p->strings_len;
    if (table_append(p, s, n)) return UINT32_MAX;
    p->str_index[2 * slot] = off + 1;
    p->str_index[2 * slot + 1] = h;
    p->str_index_used++;
    return off;
}

const char *mgc_plan_strat(const mgc_plan *p, uint32_t off) {
    if (!p) return NULL;
    if (off == 0 && p->strings_len == 0) return "";
    if (!p->strings || off >= p->strings_len) return NULL;
    return p->strings + off;
}

/* ---- config lookups ---------------------------------------------------------- */

static const mgc_plan_kv *config_find(const mgc_plan *p, const char *key) {
    for (int64_t i = 0; i < p->n_config; i++) {
        const char *k = mgc_plan_strat(p, p->config[i].key);
        if (k && !strcmp(k, key)) return &p->config[i];
    }
    return NULL;
}

int mgc_plan_config_int(const mgc_plan *p, const char *key, int64_t *out) {
    const mgc_plan_kv *v = config_find(p, key);
    if (!v || v->type != 0) return 0;
    *out = v->i;
    return 1;
}

int mgc_plan_config_float(const mgc_plan *p, const char *key, double *out) {
    const mgc_plan_kv *v = config_find(p, key);
    if (!v || v->type > 1) return 0;
    *out = v->type == 1 ? v->f : (double)v->i;
    return 1;
}

const char *mgc_plan_config_str(const mgc_plan *p, const char *key) {
    const mgc_plan_kv *v = config_find(p, key);
    return v && v->type == 2 ? mgc_plan_strat(p, v->s) : NULL;
}
