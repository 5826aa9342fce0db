/* check.c - derived defaults and consistency rules; see check.h.
 *
 * Layout of this file:
 *   helpers           checked arithmetic, message pieces, reporting,
 *                     candidate lists for hints
 *   model             head_dim, query groups, FFN width, RoPE, positions
 *   parallel grid     world / data, tensor rules, context, sequence parallel
 *   moe               experts, expert grid, MoE layer map
 *   run settings      precision, optimizer, data, checkpoint, hardware
 *   derived           c->derived
 *   entry point       mgc_check_config(): every step in order
 *
 * The pipeline (layout, even split, virtual stages), the batch and the
 * schedule rules, and the stages of c->derived are in check_pipeline.c.
 * check_int.h holds the context both files share and the conventions every
 * rule follows. */
#include "check_int.h"
#include "kspec.h"
#include "losschunk.h"

#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define WORLD_MAX 16777216 /* schema maximum of parallel.world_size */

/* Known CUDA compute capabilities (major*10 + minor). */
static const int known_archs[] = {50, 52, 53, 60, 61,  62,  70,  72,  75,  80,
                                  86, 87, 89, 90, 100, 101, 103, 110, 120, 121};

/* ---- helpers ------------------------------------------------------------ */

static int64_t add(int64_t a, int64_t b) {
    if (a < 0 || b < 0 || a > INT64_MAX - b) return -1;
    return a + b;
}

static int64_t gcd(int64_t a, int64_t b) {
    while (b) {
        int64_t t = a % b;
        a = b;
        b = t;
    }
    return a;
}

/* Least common multiple of positive a, b; -1 on overflow. */
static int64_t lcm(int64_t a, int64_t b) {
    return mgc_check_mul(a / gcd(a, b), b);
}

static int64_t ceil_div(int64_t a, int64_t b) {
    return a / b + (a % b != 0);
}

mgc_key mgc_check_pick(const mgc_check_ctx *k, int n, ...) {
    va_list ap;
    va_start(ap, n);
    mgc_key first = (mgc_key)0, found = MGC_KEY__COUNT;
    for (int i = 0; i < n; i++) {
        mgc_key key = (mgc_key)va_arg(ap, int);
        if (i == 0) first = key;
        if (found == MGC_KEY__COUNT && mgc_check_given(k, key)) found = key;
    }
    va_end(ap);
    return found != MGC_KEY__COUNT ? found : first;
}

const char *mgc_check_kv(char *buf, const mgc_check_ctx *k, mgc_key key, int64_t v) {
    const char *how = mgc_check_given(k, key)                  ? ""
                      : (mgc_keys[key].flags & MGC_KF_DERIVED) ? ", derived"
                                                               : ", default";
    snprintf(buf, KV_N, "%s (%" PRId64 "%s)", mgc_keys[key].path, v, how);
    return buf;
}

/* Same as mgc_check_kv for a floating-point value. */
static const char *kvf(char *buf, const mgc_check_ctx *k, mgc_key key, double v) {
    const char *how = mgc_check_given(k, key)                  ? ""
                      : (mgc_keys[key].flags & MGC_KF_DERIVED) ? ", derived"
                                                               : ", default";
    snprintf(buf, KV_N, "%s (%g%s)", mgc_keys[key].path, v, how);
    return buf;
}

static void vreport(mgc_check_ctx *k, mgc_severity sev, mgc_loc loc, const char *hint,
                    const char *fmt, va_list ap) {
    char msg[1024];
    vsnprintf(msg, sizeof msg, fmt, ap);
    mgc_diag(k->d, sev, loc, hint && *hint ? hint : NULL, "%s", msg);
}

void mgc_check_error(mgc_check_ctx *k, mgc_loc loc, const char *hint, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vreport(k, MGC_SEV_ERROR, loc, hint, fmt, ap);
    va_end(ap);
}

void mgc_check_warning(mgc_check_ctx *k, mgc_loc loc, const char *hint, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vreport(k, MGC_SEV_WARNING, loc, hint, fmt, ap);
    va_end(ap);
}

void mgc_check_cat(char *buf, size_t n, const char *fmt, ...) {
    size_t l = strlen(buf);
    if (l + 1 >= n) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf + l, n - l, fmt, ap);
    va_end(ap);
}

/* ---- candidate lists for hints ------------------------------------------ */

/* Values v in [lo, hi] with fit(k, v), at most `max` of them, the ones
 * nearest `target`, ascending, written as "1, 2, 4, 8".  Returns how many. */
int mgc_check_candidates(const mgc_check_ctx *k, mgc_check_fit_fn fit, int64_t lo, int64_t hi,
                         int64_t target, int max, char *buf, size_t n) {
    enum { CAP = 4096 };
    int64_t *v = malloc(CAP * sizeof *v);
    buf[0] = 0;
    if (!v) return 0;
    int cnt = 0;
    for (int64_t x = lo; x <= hi && cnt < CAP; x++)
        if (fit(k, x)) v[cnt++] = x;
    int start = 0;
    if (cnt > max) {
        int p = 0;
        while (p < cnt && v[p] < target)
            p++;
        start = p - max / 2;
        if (start < 0) start = 0;
        if (start > cnt - max) start = cnt - max;
        cnt = max;
    }
    for (int i = 0; i < cnt; i++)
        mgc_check_cat(buf, n, "%s%" PRId64, i ? ", " : "", v[start + i]);
    free(v);
    return cnt;
}

/* Nearest multiples of `unit` around `x`: "504 or 528", or just the next. */
void mgc_check_multiples(int64_t unit, int64_t x, char *buf, size_t n) {
    int64_t lo = x / unit * unit, hi = add(lo, unit);
    if (lo == x) hi = -1;
    if (lo > 0 && hi > 0)
        snprintf(buf, n, "%" PRId64 " or %" PRId64, lo, hi);
    else if (hi > 0)
        snprintf(buf, n, "%" PRId64, hi);
    else
        snprintf(buf, n, "%" PRId64, lo);
}

/* Does tensor degree t satisfy every tensor-parallel rule?  Used to suggest
 * values; the rules themselves are checked one by one below. */
static int tp_fits(const mgc_check_ctx *k, int64_t t) {
    const mgc_config *c = k->c;
    int64_t g = c->model.num_query_groups;
    if (c->model.num_heads % t) return 0;
    if (k->g_ok && g % t && t % g) return 0;
    if (c->model.ffn_hidden_size % t) return 0;
    if (k->moe && c->moe.shared_experts > 0 && c->moe.shared_ffn_hidden_size % t) return 0;
    if (k->moe && !mgc_check_given(k, KEY(PAR_ETP)) && c->moe.ffn_hidden_size % t) return 0;
    if (c->parallel.sequence_parallel && t > 1 && c->model.seq_length % c->parallel.context == 0 &&
        (c->model.seq_length / c->parallel.context) % t)
        return 0;
    if (mgc_check_given(k, KEY(PAR_WORLD)) && !mgc_check_given(k, KEY(PAR_DP))) {
        int64_t mp = mgc_check_mul3(t, c->parallel.context, c->parallel.pipeline);
        if (mp <= 0 || c->parallel.world_size % mp) return 0;
    }
    return 1;
}

static void tp_hint(const mgc_check_ctx *k, const char *why, char *hint, size_t n) {
    char list[LIST_N];
    int64_t cap = k->c->hardware.gpus_per_node;
    if (cap > k->c->model.num_heads) cap = k->c->model.num_heads;
    mgc_check_candidates(k, tp_fits, 1, cap, k->c->parallel.tensor, 8, list, sizeof list);
    snprintf(hint, n,
             "choose parallel.tensor from %s (%s; these pass every tensor-parallel rule within a "
             "node of %" PRId64 " GPUs)",
             list, why, k->c->hardware.gpus_per_node);
}

static int hidden_divisor(const mgc_check_ctx *k, int64_t v) {
    return k->c->model.hidden_size % v == 0;
}

static int cp_fits(const mgc_check_ctx *k, int64_t v) {
    const mgc_config *c = k->c;
    int64_t s = c->model.seq_length;
    if (v > 1 && s % (2 * v)) return 0;
    if (s % v) return 0;
    if (k->sp && (s / v) % c->parallel.tensor) return 0;
    if (mgc_check_given(k, KEY(PAR_WORLD)) && !mgc_check_given(k, KEY(PAR_DP))) {
        int64_t mp = mgc_check_mul3(c->parallel.tensor, v, c->parallel.pipeline);
        if (mp <= 0 || c->parallel.world_size % mp) return 0;
    }
    return 1;
}

static int group_fits(const mgc_check_ctx *k, int64_t v) {
    return k->c->moe.num_experts % v == 0;
}

/* Group-limited routing: groups dividing the experts, of which a token may use group_topk,
 * each contributing its top top_k / group_topk scores to its score. */
static void check_groups(mgc_check_ctx *k) {
    const mgc_moe_cfg *e = &k->c->moe;
    int64_t G = e->router_num_groups, GK = e->router_group_topk, E = e->num_experts;
    char a[KV_N], b[KV_N], hint[HINT_N], list[LIST_N];
    if (G == 0 && GK == 0) return;
    if (GK == 0) {
        mgc_check_error(k, mgc_check_at(k, KEY(MOE_GROUPS)),
                        "set moe.router_group_topk, or remove router_num_groups",
                        "%s needs moe.router_group_topk: how many of the groups a token may use",
                        mgc_check_kv(a, k, KEY(MOE_GROUPS), G));
        return;
    }
    if (G == 0) {
        mgc_check_error(k, mgc_check_at(k, KEY(MOE_GROUP_TOPK)),
                        "set moe.router_num_groups (a divisor of moe.num_experts), or remove "
                        "router_group_topk",
                        "%s needs moe.router_num_groups: the groups the experts form",
                        mgc_check_kv(a, k, KEY(MOE_GROUP_TOPK), GK));
        return;
    }
    if (E % G) {
        mgc_check_candidates(k, group_fits, 1, E, G, 8, list, sizeof list);
        snprintf(hint, sizeof hint,
                 "choose moe.router_num_groups from %s (divisors of %" PRId64 " experts)", list, E);
        mgc_check_error(k, mgc_check_at(k, mgc_check_pick(k, 2, KEY(MOE_GROUPS), KEY(MOE_EXPERTS))),
                        hint, "%s is not divisible by %s: the groups are equal",
                        mgc_check_kv(a, k, KEY(MOE_EXPERTS), E),
                        mgc_check_kv(b, k, KEY(MOE_GROUPS), G));
        return;
    }
    if (GK > G) {
        snprintf(hint, sizeof hint, "set moe.router_group_topk to at most %" PRId64, G);
        mgc_check_error(k, mgc_check_at(k, KEY(MOE_GROUP_TOPK)), hint,
                        "%s is more than %s: a token cannot use more groups than exist",
                        mgc_check_kv(a, k, KEY(MOE_GROUP_TOPK), GK),
                        mgc_check_kv(b, k, KEY(MOE_GROUPS), G));
        return;
    }
    if (GK > e->top_k) {
        snprintf(hint, sizeof hint, "set moe.router_group_topk to at most %" PRId64, e->top_k);
        mgc_check_error(
            k, mgc_check_at(k, mgc_check_pick(k, 2, KEY(MOE_GROUP_TOPK), KEY(MOE_TOPK))), hint,
            "%s is more than %s: a group's score is the sum of its top top_k / "
            "router_group_topk scores, which would be none",
            mgc_check_kv(a, k, KEY(MOE_GROUP_TOPK), GK),
            mgc_check_kv(b, k, KEY(MOE_TOPK), e->top_k));
        return;
    }
    if (e->top_k > GK * (E / G)) {
        int64_t need = (e->top_k + E / G - 1) / (E / G);
        snprintf(hint, sizeof hint,
                 "set moe.router_group_topk to at least %" PRId64 ", or lower moe.top_k", need);
        mgc_check_error(
            k, mgc_check_at(k, mgc_check_pick(k, 2, KEY(MOE_GROUP_TOPK), KEY(MOE_TOPK))), hint,
            "%s is more than the %" PRId64 " experts a token may choose from (%s "
            "groups of %" PRId64 ")",
            mgc_check_kv(a, k, KEY(MOE_TOPK), e->top_k), GK * (E / G),
            mgc_check_kv(b, k, KEY(MOE_GROUP_TOPK), GK), E / G);
    }
}

static int ep_fits(const mgc_check_ctx *k, int64_t v) {
    const mgc_config *c = k->c;
    if (c->moe.num_experts % v) return 0;
    if (k->grid_ok) {
        int64_t eg = mgc_check_mul3(c->parallel.expert_tensor, v, c->parallel.pipeline);
        if (eg <= 0 || c->parallel.world_size % eg) return 0;
    }
    return 1;
}

static int etp_fits(const mgc_check_ctx *k, int64_t v) {
    const mgc_config *c = k->c;
    if (c->moe.ffn_hidden_size % v) return 0;
    if (k->grid_ok) {
        int64_t eg = mgc_check_mul3(v, c->parallel.expert, c->parallel.pipeline);
        if (eg <= 0 || c->parallel.world_size % eg) return 0;
    }
    return 1;
}

static int groups_fit(const mgc_check_ctx *k, int64_t v) {
    return k->c->model.num_heads % v == 0 &&
           (v % k->c->parallel.tensor == 0 || k->c->parallel.tensor % v == 0);
}

/* ---- model -------------------------------------------------------------- */

static void check_model(mgc_check_ctx *k) {
    mgc_model_cfg *m = &k->c->model;
    char a[KV_N], b[KV_N], hint[HINT_N], list[LIST_N];
    k->hd_ok = 1;
    k->g_ok = 1;

    if (!mgc_check_given(k, KEY(MODEL_MAX_POS)))
        m->max_position_embeddings = m->seq_length;
    else if (m->position_embedding == MGC_POS_LEARNED &&
             m->max_position_embeddings < m->seq_length) {
        snprintf(hint, sizeof hint,
                 "set model.max_position_embeddings to at least %" PRId64
                 ", or remove it (it defaults to seq_length)",
                 m->seq_length);
        mgc_check_error(
            k, mgc_check_at(k, KEY(MODEL_MAX_POS)), hint,
            "%s is smaller than %s: the learned position table has no row for the later positions",
            mgc_check_kv(a, k, KEY(MODEL_MAX_POS), m->max_position_embeddings),
            mgc_check_kv(b, k, KEY(MODEL_SEQ_LENGTH), m->seq_length));
    }

    /* Grouped-query attention: every key/value head serves the same number
     * of query heads. */
    if (!mgc_check_given(k, KEY(MODEL_QUERY_GROUPS))) m->num_query_groups = m->num_heads;
    if (m->num_heads % m->num_query_groups) {
        k->g_ok = 0;
        mgc_check_candidates(k, groups_fit, 1, m->num_heads, m->num_query_groups, 8, list,
                             sizeof list);
        snprintf(hint, sizeof hint,
                 "choose model.num_query_groups from %s (divisors of %" PRId64 " heads)", list,
                 m->num_heads);
        mgc_check_error(
            k, mgc_check_at(k, KEY(MODEL_QUERY_GROUPS)), hint,
            "%s is not divisible by %s: every key/value head must serve the same number of query "
            "heads",
            mgc_check_kv(a, k, KEY(MODEL_HEADS), m->num_heads),
            mgc_check_kv(b, k, KEY(MODEL_QUERY_GROUPS), m->num_query_groups));
    }

    if (!mgc_check_given(k, KEY(MODEL_HEAD_DIM))) {
        if (m->hidden_size % m->num_heads) {
            k->hd_ok = 0;
            mgc_check_candidates(k, hidden_divisor, 1,
                                 m->hidden_size < 65536 ? m->hidden_size : 65536, m->num_heads, 8,
                                 list, sizeof list);
            snprintf(hint, sizeof hint,
                     "choose model.num_attention_heads from %s (divisors of %" PRId64
                     "), or set model.head_dim explicitly",
                     list, m->hidden_size);
            mgc_check_error(
                k, mgc_check_at(k, mgc_check_pick(k, 2, KEY(MODEL_HEADS), KEY(MODEL_HIDDEN))), hint,
                "%s is not divisible by %s, so model.head_dim cannot be derived",
                mgc_check_kv(a, k, KEY(MODEL_HIDDEN), m->hidden_size),
                mgc_check_kv(b, k, KEY(MODEL_HEADS), m->num_heads));
        } else {
            m->head_dim = m->hidden_size / m->num_heads;
        }
    }

    /* RoPE rotates channel pairs: the rotated width must be an even whole
     * number of channels. */
    if (m->position_embedding == MGC_POS_ROTARY && k->hd_ok) {
        double rd = (double)m->head_dim * m->rotary_percent;
        double r = floor(rd + 0.5);
        if (fabs(rd - r) > 1e-6 * (rd > 1 ? rd : 1) || (int64_t)r % 2 || r < 2) {
            if (m->rotary_percent == 1.0) {
                if (mgc_check_given(k, KEY(MODEL_HEAD_DIM)))
                    snprintf(hint, sizeof hint,
                             "choose an even model.head_dim, e.g. %" PRId64 " or %" PRId64,
                             m->head_dim - 1 > 0 ? m->head_dim - 1 : 2, m->head_dim + 1);
                else
                    snprintf(hint, sizeof hint,
                             "choose model.num_attention_heads so that hidden_size / heads is "
                             "even, or set "
                             "model.head_dim to an even value");
                mgc_check_error(
                    k,
                    mgc_check_at(k, mgc_check_pick(k, 3, KEY(MODEL_HEAD_DIM), KEY(MODEL_HEADS),
                                                   KEY(MODEL_HIDDEN))),
                    hint, "rotary position embedding rotates channel pairs, but %s is odd",
                    mgc_check_kv(a, k, KEY(MODEL_HEAD_DIM), m->head_dim));
            } else {
                /* suggest a round fraction when one works, else the nearest */
                static const double nice[] = {0.25, 0.5, 0.75, 1.0};
                int64_t even = (int64_t)floor(rd / 2) * 2;
                if (even < 2) even = m->head_dim >= 2 ? 2 : 0;
                double best = -1;
                for (int i = 0; i < 4; i++) {
                    double ch = nice[i] * (double)m->head_dim;
                    if (ch == floor(ch) && (int64_t)ch % 2 == 0 && ch >= 2 &&
                        (best < 0 ||
                         fabs(nice[i] - m->rotary_percent) < fabs(best - m->rotary_percent)))
                        best = nice[i];
                }
                if (best > 0) even = (int64_t)(best * (double)m->head_dim);
                if (even > 0)
                    snprintf(
                        hint, sizeof hint,
                        "choose model.rotary_percent so that head_dim * rotary_percent is even, "
                        "e.g. %g (%" PRId64 " channels)",
                        (double)even / (double)m->head_dim, even);
                else
                    snprintf(hint, sizeof hint, "set model.head_dim to at least 2");
                mgc_check_error(
                    k,
                    mgc_check_at(
                        k, mgc_check_pick(k, 2, KEY(MODEL_ROPE_PERCENT), KEY(MODEL_HEAD_DIM))),
                    hint,
                    "rotary position embedding rotates channel pairs, but model.head_dim * "
                    "model.rotary_percent = "
                    "%" PRId64 " * %g = %g is not an even whole number of channels",
                    m->head_dim, m->rotary_percent, rd);
            }
        }
    } else if (m->position_embedding != MGC_POS_ROTARY) {
        static const mgc_key rope_keys[] = {KEY(MODEL_ROPE_BASE), KEY(MODEL_ROPE_PERCENT)};
        for (int i = 0; i < 2; i++)
            if (mgc_check_given(k, rope_keys[i]))
                mgc_check_warning(k, mgc_check_at(k, rope_keys[i]),
                                  "remove it, or set model.position_embedding: rotary",
                                  "%s has no effect: model.position_embedding is %s",
                                  mgc_keys[rope_keys[i]].path, mgc_enum_pos[m->position_embedding]);
    }

    /* Megatron's defaults: 4h for GELU; for SwiGLU int(8h/3/64)*64, which
     * keeps the parameter count of a 4h GELU MLP. */
    if (!mgc_check_given(k, KEY(MODEL_FFN))) {
        if (m->activation == MGC_ACT_SWIGLU) {
            m->ffn_hidden_size = m->hidden_size / 24 * 64;
            if (m->ffn_hidden_size < 64) m->ffn_hidden_size = 64;
        } else {
            m->ffn_hidden_size = 4 * m->hidden_size;
        }
    }
    if (!mgc_check_given(k, KEY(MODEL_QKV_BIAS))) m->add_qkv_bias = m->add_bias_linear;
    if (mgc_check_given(k, KEY(MODEL_WINDOW_LAYERS))) {
        const mgc_int_list *wl = &m->window_layers;
        if (m->window_size <= 0)
            mgc_check_warning(k, mgc_check_at(k, KEY(MODEL_WINDOW_LAYERS)),
                              "set model.window_size, or remove model.window_layers",
                              "model.window_layers has no effect: model.window_size is 0, so no layer "
                              "has a window");
        for (int i = 0; i < wl->n; i++) {
            if (wl->v[i] >= m->num_layers) {
                snprintf(hint, sizeof hint, "layers are numbered from 0 to %" PRId64, m->num_layers - 1);
                mgc_check_error(k, wl->loc[i], hint,
                                "model.window_layers[%d] = %" PRId64
                                " is out of range: the model has %" PRId64 " layers",
                                i, wl->v[i], m->num_layers);
            } else if (i > 0 && wl->v[i] <= wl->v[i - 1]) {
                mgc_check_error(k, wl->loc[i], "list each layer once, in increasing order",
                                "model.window_layers[%d] = %" PRId64 " does not come after %" PRId64,
                                i, wl->v[i], wl->v[i - 1]);
            }
        }
    }
    if (m->window_size >= m->seq_length) {
        snprintf(hint, sizeof hint,
                 "remove it, or set it below model.seq_length (%" PRId64 ") to limit what a query sees",
                 m->seq_length);
        mgc_check_warning(k, mgc_check_at(k, KEY(MODEL_WINDOW)), hint,
                          "%s has no effect: it covers every earlier position of a %" PRId64
                          "-token sequence",
                          mgc_check_kv(a, k, KEY(MODEL_WINDOW), m->window_size), m->seq_length);
    }
    k->model_ok = k->hd_ok && k->g_ok;
}

/* ---- parallel grid ------------------------------------------------------ */

static void derive_grid(mgc_check_ctx *k) {
    mgc_parallel_cfg *p = &k->c->parallel;
    char a[KV_N], b[KV_N], hint[HINT_N], list[LIST_N];
    k->grid_ok = 1;
    int64_t mp = mgc_check_mul3(p->tensor, p->context, p->pipeline);
    if (mp < 0 || mp > WORLD_MAX) {
        k->grid_ok = 0;
        mgc_check_error(
            k, mgc_check_at(k, mgc_check_pick(k, 3, KEY(PAR_TP), KEY(PAR_CP), KEY(PAR_PP))),
            "lower the parallel degrees",
            "parallel.tensor * context * pipeline = %" PRId64 " * %" PRId64 " * %" PRId64
            " is more GPUs than mgc supports (%d)",
            p->tensor, p->context, p->pipeline, WORLD_MAX);
        if (!mgc_check_given(k, KEY(PAR_DP))) p->data = 1;
        return;
    }
    if (mgc_check_given(k, KEY(PAR_WORLD)) && !mgc_check_given(k, KEY(PAR_DP))) {
        if (p->world_size % mp) {
            k->grid_ok = 0;
            p->data = 1;
            mgc_check_multiples(mp, p->world_size, list, sizeof list);
            snprintf(
                hint, sizeof hint,
                "set parallel.world_size to %s, or choose degrees whose product divides %" PRId64,
                list, p->world_size);
            mgc_check_error(k, mgc_check_at(k, KEY(PAR_WORLD)), hint,
                            "%s is not divisible by tensor * context * pipeline = %" PRId64
                            " * %" PRId64 " * %" PRId64 " = %" PRId64 " (remainder %" PRId64
                            "), so parallel.data cannot be derived",
                            mgc_check_kv(a, k, KEY(PAR_WORLD), p->world_size), p->tensor,
                            p->context, p->pipeline, mp, p->world_size % mp);
        } else {
            p->data = p->world_size / mp;
        }
    } else if (mgc_check_given(k, KEY(PAR_WORLD))) {
        int64_t prod = mgc_check_mul(mp, p->data);
        if (prod != p->world_size) {
            k->grid_ok = 0;
            if (p->world_size % mp == 0)
                snprintf(hint, sizeof hint,
                         "set parallel.data to %" PRId64
                         ", or remove it (it is derived from world_size)",
                         p->world_size / mp);
            else
                snprintf(hint, sizeof hint,
                         "remove parallel.world_size (it is derived from the degrees)");
            mgc_check_error(k, mgc_check_at(k, KEY(PAR_DP)), hint,
                            "%s does not match tensor * context * pipeline * data = %" PRId64
                            " * %" PRId64 " * %" PRId64 " * %" PRId64 " = %" PRId64,
                            mgc_check_kv(b, k, KEY(PAR_WORLD), p->world_size), p->tensor,
                            p->context, p->pipeline, p->data, prod);
        }
    } else {
        if (!mgc_check_given(k, KEY(PAR_DP))) p->data = 1;
        int64_t prod = mgc_check_mul(mp, p->data);
        if (prod < 0 || prod > WORLD_MAX) {
            k->grid_ok = 0;
            mgc_check_error(k,
                            mgc_check_at(k, mgc_check_pick(k, 4, KEY(PAR_DP), KEY(PAR_TP),
                                                           KEY(PAR_CP), KEY(PAR_PP))),
                            "lower the parallel degrees",
                            "tensor * context * pipeline * data = %" PRId64 " * %" PRId64
                            " * %" PRId64 " * %" PRId64 " is more GPUs than mgc supports (%d)",
                            p->tensor, p->context, p->pipeline, p->data, WORLD_MAX);
        } else {
            p->world_size = prod;
        }
    }
    if (!mgc_check_given(k, KEY(PAR_ETP))) p->expert_tensor = p->tensor;
}

static void check_tensor(mgc_check_ctx *k) {
    const mgc_config *c = k->c;
    const mgc_model_cfg *m = &c->model;
    int64_t tp = c->parallel.tensor;
    char a[KV_N], b[KV_N], hint[HINT_N], why[128];
    if (m->num_heads % tp) {
        snprintf(why, sizeof why, "divisors of %" PRId64 " heads", m->num_heads);
        tp_hint(k, why, hint, sizeof hint);
        mgc_check_error(
            k, mgc_check_at(k, mgc_check_pick(k, 2, KEY(PAR_TP), KEY(MODEL_HEADS))), hint,
            "%s is not divisible by %s: each tensor rank computes whole attention heads",
            mgc_check_kv(a, k, KEY(MODEL_HEADS), m->num_heads),
            mgc_check_kv(b, k, KEY(PAR_TP), tp));
    }
    int64_t g = m->num_query_groups;
    if (k->g_ok && m->num_heads % tp == 0 && g % tp && tp % g) {
        snprintf(why, sizeof why, "each divides or is a multiple of %" PRId64 " query groups", g);
        tp_hint(k, why, hint, sizeof hint);
        mgc_check_error(
            k, mgc_check_at(k, mgc_check_pick(k, 2, KEY(PAR_TP), KEY(MODEL_QUERY_GROUPS))), hint,
            "%s and %s: neither divides the other, so key/value heads can be neither split nor "
            "replicated "
            "evenly over tensor ranks",
            mgc_check_kv(a, k, KEY(MODEL_QUERY_GROUPS), g), mgc_check_kv(b, k, KEY(PAR_TP), tp));
    }
    /* One wrong tensor degree is one error: the hint above already lists
     * degrees that pass every tensor rule. */
    int tp_bad = m->num_heads % tp != 0;
    if (!tp_bad && m->ffn_hidden_size % tp) {
        tp_bad = 1;
        if (mgc_check_given(k, KEY(MODEL_FFN)) && !mgc_check_given(k, KEY(PAR_TP))) {
            char list[LIST_N];
            mgc_check_multiples(tp, m->ffn_hidden_size, list, sizeof list);
            snprintf(hint, sizeof hint,
                     "set model.ffn_hidden_size to a multiple of %" PRId64 ", e.g. %s", tp, list);
        } else {
            char list[LIST_N];
            mgc_check_multiples(tp, m->ffn_hidden_size, list, sizeof list);
            tp_hint(k, "divisors of the MLP width", hint, sizeof hint);
            mgc_check_cat(hint, sizeof hint,
                          "; or set model.ffn_hidden_size to a multiple of %" PRId64 ", e.g. %s",
                          tp, list);
        }
        mgc_check_error(
            k, mgc_check_at(k, mgc_check_pick(k, 2, KEY(PAR_TP), KEY(MODEL_FFN))), hint,
            "%s is not divisible by %s: the MLP's column- and row-parallel matrices split it "
            "evenly",
            mgc_check_kv(a, k, KEY(MODEL_FFN), m->ffn_hidden_size),
            mgc_check_kv(b, k, KEY(PAR_TP), tp));
    }
    if (k->g_ok && g % tp && tp % g) tp_bad = 1;
    if (tp > 1 && k->grid_ok && !tp_bad) {
        int64_t gpn = c->hardware.gpus_per_node;
        if (tp > gpn)
            mgc_check_warning(
                k, mgc_check_at(k, KEY(PAR_TP)),
                "keep parallel.tensor within a node; use pipeline or data parallelism across nodes",
                "%s is larger than %s: the all-reduces of every layer cross the inter-node network",
                mgc_check_kv(a, k, KEY(PAR_TP), tp), mgc_check_kv(b, k, KEY(HW_GPN), gpn));
        else if (gpn % tp && c->parallel.world_size > gpn)
            mgc_check_warning(
                k, mgc_check_at(k, KEY(PAR_TP)),
                "choose a parallel.tensor that divides hardware.gpus_per_node",
                "%s is not a multiple of %s: some tensor-parallel groups straddle two nodes",
                mgc_check_kv(b, k, KEY(HW_GPN), gpn), mgc_check_kv(a, k, KEY(PAR_TP), tp));
    }
}

static void check_sequence(mgc_check_ctx *k) {
    mgc_config *c = k->c;
    const mgc_parallel_cfg *p = &c->parallel;
    int64_t s = c->model.seq_length;
    char a[KV_N], b[KV_N], hint[HINT_N], list[LIST_N];
    int cp_ok = 1;
    if (p->context > 1 && s % (2 * p->context)) {
        cp_ok = 0;
        mgc_check_candidates(k, cp_fits, 1, p->context * 4 < s ? p->context * 4 : s, p->context, 6,
                             list, sizeof list);
        snprintf(hint, sizeof hint,
                 "choose parallel.context from %s, or model.seq_length as a multiple of %" PRId64,
                 list, 2 * p->context);
        mgc_check_error(
            k, mgc_check_at(k, mgc_check_pick(k, 2, KEY(PAR_CP), KEY(MODEL_SEQ_LENGTH))), hint,
            "%s is not divisible by 2 * %s: each context rank holds two chunks of the sequence "
            "to balance the "
            "causal mask",
            mgc_check_kv(a, k, KEY(MODEL_SEQ_LENGTH), s),
            mgc_check_kv(b, k, KEY(PAR_CP), p->context));
    }
    k->sp = p->sequence_parallel && p->tensor > 1;
    if (p->sequence_parallel && p->tensor == 1)
        mgc_check_warning(
            k, mgc_check_at(k, KEY(PAR_SP)), "remove it, or use parallel.tensor > 1",
            "parallel.sequence_parallel has no effect with %s: it shards activations within "
            "the tensor group",
            mgc_check_kv(a, k, KEY(PAR_TP), p->tensor));
    if (k->sp && cp_ok && (s / p->context) % p->tensor) {
        int64_t unit = mgc_check_mul(p->context, p->tensor);
        mgc_check_multiples(unit, s, list, sizeof list);
        snprintf(hint, sizeof hint,
                 "choose model.seq_length as a multiple of context * tensor = %" PRId64
                 " (e.g. %s), or turn "
                 "parallel.sequence_parallel off",
                 unit, list);
        mgc_check_error(
            k,
            mgc_check_at(k, mgc_check_pick(k, 3, KEY(PAR_SP), KEY(MODEL_SEQ_LENGTH), KEY(PAR_TP))),
            hint,
            "sequence parallelism splits each rank's %" PRId64
            " tokens (seq_length / context) over %s ranks, "
            "which does not divide them",
            s / p->context, mgc_check_kv(a, k, KEY(PAR_TP), p->tensor));
    }
    if (p->distributed_optimizer && k->grid_ok && mgc_check_mul(p->data, p->context) == 1)
        mgc_check_warning(
            k, mgc_check_at(k, KEY(PAR_DISTOPT)), "remove it, or add data-parallel ranks",
            "parallel.distributed_optimizer has no effect: data * context = 1, so there is "
            "nothing to shard "
            "the optimizer state over");
}

/* ---- moe ---------------------------------------------------------------- */

static void check_moe(mgc_check_ctx *k) {
    mgc_config *c = k->c;
    mgc_moe_cfg *e = &c->moe;
    const mgc_parallel_cfg *p = &c->parallel;
    char a[KV_N], b[KV_N], hint[HINT_N], list[LIST_N];
    k->moe = e->num_experts > 0;
    if (!mgc_check_given(k, KEY(MOE_FFN))) e->ffn_hidden_size = c->model.ffn_hidden_size;
    if (!mgc_check_given(k, KEY(MOE_SHARED_FFN))) e->shared_ffn_hidden_size = e->ffn_hidden_size;
    if (!k->moe) {
        for (int key = KEY(MOE_EXPERTS) + 1; key <= KEY(MOE_DROP_POLICY); key++)
            if (mgc_check_given(k, (mgc_key)key))
                mgc_check_warning(
                    k, mgc_check_at(k, (mgc_key)key),
                    "set moe.num_experts to build a mixture of experts, or remove this key",
                    "%s has no effect: moe.num_experts is 0, so the model is dense",
                    mgc_keys[key].path);
        if (p->expert > 1) {
            snprintf(hint, sizeof hint,
                     "set moe.num_experts (a multiple of %" PRId64 "), or remove parallel.expert",
                     p->expert);
            mgc_check_error(k, mgc_check_at(k, KEY(PAR_EP)), hint,
                            "%s needs a mixture-of-experts model, but moe.num_experts is 0",
                            mgc_check_kv(a, k, KEY(PAR_EP), p->expert));
        }
        if (mgc_check_given(k, KEY(PAR_ETP)))
            mgc_check_warning(k, mgc_check_at(k, KEY(PAR_ETP)), "remove it",
                              "parallel.expert_tensor has no effect: the model has no experts");
        return;
    }
    if (mgc_check_given(k, KEY(MOE_ROUTER_DTYPE)) && e->router_dtype == MGC_ROUTER_DT_FP32 &&
        c->training.precision == MGC_PREC_FP32)
        mgc_check_warning(k, mgc_check_at(k, KEY(MOE_ROUTER_DTYPE)), "remove it, or train in bf16 or fp16",
                          "moe.router_dtype fp32 has no effect: training.precision is fp32, so the "
                          "router's logits are fp32 already");
    if (e->top_k > e->num_experts) {
        snprintf(hint, sizeof hint, "set moe.top_k to at most %" PRId64, e->num_experts);
        mgc_check_error(
            k, mgc_check_at(k, mgc_check_pick(k, 2, KEY(MOE_TOPK), KEY(MOE_EXPERTS))), hint,
            "%s is larger than %s: a token cannot be routed to more distinct experts than exist",
            mgc_check_kv(a, k, KEY(MOE_TOPK), e->top_k),
            mgc_check_kv(b, k, KEY(MOE_EXPERTS), e->num_experts));
    }
    if (e->top_k <= e->num_experts) check_groups(k);
    if (mgc_check_given(k, KEY(MOE_AUX_SCOPE)) && e->aux_loss_coeff == 0)
        mgc_check_warning(k, mgc_check_at(k, KEY(MOE_AUX_SCOPE)),
                          "set moe.aux_loss_coeff (DeepSeek-V3's sequence-wise loss: 1e-4), or "
                          "remove aux_loss_scope",
                          "moe.aux_loss_scope has no effect: moe.aux_loss_coeff is 0, so there is "
                          "no load-balancing loss");
    if (e->expert_bias_update_rate > 0 && e->router_score != MGC_SCORE_SIGMOID)
        mgc_check_error(k,
                        mgc_check_at(k, mgc_check_pick(k, 2, KEY(MOE_SCORE), KEY(MOE_BIAS_RATE))),
                        "set moe.router_score: sigmoid (DeepSeek-V3's router), or "
                        "moe.expert_bias_update_rate: 0",
                        "%s needs the sigmoid router, but moe.router_score is %s%s: the bias is "
                        "added to each expert's sigmoid score, which does not depend on the other "
                        "experts' scores as a softmax does",
                        kvf(a, k, KEY(MOE_BIAS_RATE), e->expert_bias_update_rate),
                        mgc_enum_score[e->router_score],
                        mgc_check_given(k, KEY(MOE_SCORE)) ? "" : " (default)");
    if (e->num_experts % p->expert) {
        mgc_check_candidates(k, ep_fits, 1, e->num_experts, p->expert, 8, list, sizeof list);
        snprintf(hint, sizeof hint,
                 "choose parallel.expert from %s (divisors of %" PRId64 " experts)", list,
                 e->num_experts);
        mgc_check_error(
            k, mgc_check_at(k, mgc_check_pick(k, 2, KEY(PAR_EP), KEY(MOE_EXPERTS))), hint,
            "%s is not divisible by %s: every expert-parallel rank holds the same number of "
            "experts",
            mgc_check_kv(a, k, KEY(MOE_EXPERTS), e->num_experts),
            mgc_check_kv(b, k, KEY(PAR_EP), p->expert));
    } else if (k->grid_ok) {
        int64_t eg = mgc_check_mul3(p->expert_tensor, p->expert, p->pipeline);
        if (eg < 0 || p->world_size % eg) {
            /* MoE folding carves the expert grid out of the same GPUs: the
             * world must be a multiple of both grids' model-parallel sizes. */
            int64_t mp = mgc_check_mul3(p->tensor, p->context, p->pipeline),
                    l = eg > 0 ? lcm(mp, eg) : -1;
            hint[0] = 0;
            if (l > 0 && mgc_check_given(k, KEY(PAR_WORLD)))
                snprintf(hint, sizeof hint, "set parallel.world_size to a multiple of %" PRId64, l);
            else if (l > 0)
                snprintf(hint, sizeof hint, "set parallel.data to a multiple of %" PRId64, l / mp);
            mgc_check_candidates(k, ep_fits, 1, e->num_experts, p->expert, 8, list, sizeof list);
            if (list[0] && strcmp(list, "1") != 0)
                mgc_check_cat(hint, sizeof hint, "%schoose parallel.expert from %s",
                              hint[0] ? ", or " : "", list);
            mgc_check_error(
                k, mgc_check_at(k, mgc_check_pick(k, 3, KEY(PAR_EP), KEY(PAR_ETP), KEY(PAR_WORLD))),
                hint,
                "the expert grid does not fit: %s is not divisible by expert_tensor * expert * "
                "pipeline = %" PRId64 " * %" PRId64 " * %" PRId64,
                mgc_check_kv(a, k, KEY(PAR_WORLD), p->world_size), p->expert_tensor, p->expert,
                p->pipeline);
        }
    }
    if (e->ffn_hidden_size % p->expert_tensor) {
        mgc_check_candidates(k, etp_fits, 1, p->expert_tensor * 2, p->expert_tensor, 8, list,
                             sizeof list);
        snprintf(hint, sizeof hint, "choose parallel.expert_tensor from %s%s", list,
                 mgc_check_given(k, KEY(PAR_ETP)) ? "" : " (it defaults to parallel.tensor)");
        mgc_check_error(
            k, mgc_check_at(k, mgc_check_pick(k, 3, KEY(PAR_ETP), KEY(MOE_FFN), KEY(PAR_TP))), hint,
            "%s is not divisible by %s: each expert's matrices split evenly over expert-tensor "
            "ranks",
            mgc_check_kv(a, k, KEY(MOE_FFN), e->ffn_hidden_size),
            mgc_check_kv(b, k, KEY(PAR_ETP), p->expert_tensor));
    }
    if (e->shared_experts > 0) {
        if (e->shared_ffn_hidden_size % p->tensor) {
            mgc_check_multiples(p->tensor, e->shared_ffn_hidden_size, list, sizeof list);
            snprintf(hint, sizeof hint,
                     "set moe.shared_expert_ffn_hidden_size to a multiple of %" PRId64 ", e.g. %s",
                     p->tensor, list);
            mgc_check_error(
                k,
                mgc_check_at(k,
                             mgc_check_pick(k, 3, KEY(MOE_SHARED_FFN), KEY(PAR_TP), KEY(MOE_FFN))),
                hint, "%s is not divisible by %s: shared experts are split like the dense MLP",
                mgc_check_kv(a, k, KEY(MOE_SHARED_FFN), e->shared_ffn_hidden_size),
                mgc_check_kv(b, k, KEY(PAR_TP), p->tensor));
        }
    } else if (mgc_check_given(k, KEY(MOE_SHARED_FFN))) {
        mgc_check_warning(
            k, mgc_check_at(k, KEY(MOE_SHARED_FFN)), "set moe.shared_experts, or remove this key",
            "moe.shared_expert_ffn_hidden_size has no effect: moe.shared_experts is 0");
    }
    /* Which layers are MoE: an explicit list, or first_dense + layer_freq. */
    int64_t L = c->model.num_layers;
    if (mgc_check_given(k, KEY(MOE_LAYERS))) {
        const mgc_int_list *ll = &e->layers;
        mgc_key other = mgc_check_given(k, KEY(MOE_LAYER_FREQ))    ? KEY(MOE_LAYER_FREQ)
                        : mgc_check_given(k, KEY(MOE_FIRST_DENSE)) ? KEY(MOE_FIRST_DENSE)
                                                                   : MGC_KEY__COUNT;
        if (other != MGC_KEY__COUNT) {
            mgc_loc ol = mgc_check_at(k, other);
            snprintf(hint, sizeof hint, "remove %s (line %d) or moe.layers", mgc_keys[other].path,
                     ol.line);
            mgc_check_error(
                k, mgc_check_at(k, KEY(MOE_LAYERS)), hint,
                "moe.layers and %s are both given: the explicit list replaces layer_freq and "
                "first_dense_layers",
                mgc_keys[other].path);
        }
        if (ll->n == 0)
            mgc_check_warning(k, mgc_check_at(k, KEY(MOE_LAYERS)),
                              "list the MoE layers, or set moe.num_experts: 0",
                              "moe.layers is empty: no layer has experts, so the model is dense");
        for (int i = 0; i < ll->n; i++) {
            if (ll->v[i] >= L) {
                snprintf(hint, sizeof hint, "layers are numbered from 0 to %" PRId64, L - 1);
                mgc_check_error(k, ll->loc[i], hint,
                                "moe.layers[%d] = %" PRId64
                                " is out of range: the model has %" PRId64 " layers",
                                i, ll->v[i], L);
            } else if (i > 0 && ll->v[i] == ll->v[i - 1]) {
                mgc_check_error(k, ll->loc[i], "list each MoE layer once",
                                "moe.layers[%d] = %" PRId64 " repeats the previous entry", i,
                                ll->v[i]);
            } else if (i > 0 && ll->v[i] < ll->v[i - 1]) {
                mgc_check_error(k, ll->loc[i], "list the layers in increasing order",
                                "moe.layers[%d] = %" PRId64 " comes after %" PRId64
                                ": the list must be sorted",
                                i, ll->v[i], ll->v[i - 1]);
            }
        }
    } else if (e->first_dense_layers >= L) {
        snprintf(hint, sizeof hint,
                 "set moe.first_dense_layers below %" PRId64
                 ", or moe.num_experts: 0 for a dense model",
                 L);
        mgc_check_error(k, mgc_check_at(k, KEY(MOE_FIRST_DENSE)), hint,
                        "%s leaves no MoE layer: the model has %" PRId64 " layers",
                        mgc_check_kv(a, k, KEY(MOE_FIRST_DENSE), e->first_dense_layers), L);
    }
    /* Token dropping. */
    if (mgc_check_given(k, KEY(MOE_DROP_POLICY)) && !mgc_check_given(k, KEY(MOE_CAPACITY)))
        mgc_check_warning(
            k, mgc_check_at(k, KEY(MOE_DROP_POLICY)),
            "set moe.capacity_factor to drop tokens, or remove drop_policy",
            "moe.drop_policy has no effect: without moe.capacity_factor the experts are dropless");
    if (mgc_check_given(k, KEY(MOE_CAPACITY)) && e->aux_loss_coeff == 0)
        mgc_check_warning(k, mgc_check_at(k, KEY(MOE_CAPACITY)),
                          "set moe.aux_loss_coeff, e.g. 1e-2",
                          "moe.capacity_factor drops tokens, but no load-balancing loss is on "
                          "(moe.aux_loss_coeff is 0): "
                          "unbalanced routing will drop many of them");
    if (p->tensor > 1 && !p->sequence_parallel)
        mgc_check_error(
            k, mgc_check_at(k, mgc_check_pick(k, 3, KEY(PAR_SP), KEY(PAR_TP), KEY(MOE_EXPERTS))),
            "set parallel.sequence_parallel: true",
            "a mixture-of-experts model with %s needs sequence parallelism: the router and the "
            "token dispatch work on each tensor rank's slice of the sequence (Megatron requires it too)",
            mgc_check_kv(a, k, KEY(PAR_TP), p->tensor));
}

/* ---- run settings ------------------------------------------------------- */

static int loss_chunks_fit(const mgc_check_ctx *k, int64_t v) {
    return mgc_loss_chunks_fit(k->c, v);
}

static void check_training(mgc_check_ctx *k) {
    mgc_config *c = k->c;
    const mgc_training_cfg *t = &c->training;
    mgc_optimizer_cfg *o = &c->optimizer;
    char a[KV_N], b[KV_N], hint[HINT_N];
    static const mgc_key fp16_keys[] = {KEY(TRAIN_LOSS_SCALE), KEY(TRAIN_LS_WINDOW),
                                        KEY(TRAIN_HYSTERESIS)};
    if (t->precision != MGC_PREC_FP16)
        for (int i = 0; i < 3; i++)
            if (mgc_check_given(k, fp16_keys[i]))
                mgc_check_warning(
                    k, mgc_check_at(k, fp16_keys[i]), "remove it, or set training.precision: fp16",
                    "%s has no effect: loss scaling applies to fp16 only (training.precision "
                    "is %s)",
                    mgc_keys[fp16_keys[i]].path, mgc_enum_precision[t->precision]);

    const mgc_str_list *rm = &t->recompute_modules;
    for (int i = 0; i < rm->n; i++) {
        const char *s = rm->v[i] ? rm->v[i] : "";
        mgc_loc at = rm->loc ? rm->loc[i] : mgc_check_at(k, KEY(TRAIN_RECOMPUTE_MODULES));
        int known = 0, dup = 0;
        for (int j = 0; mgc_recompute_module_names[j]; j++)
            known |= !strcmp(s, mgc_recompute_module_names[j]);
        for (int j = 0; j < i; j++)
            dup |= rm->v[j] && !strcmp(s, rm->v[j]);
        if (!known)
            mgc_check_error(k, at,
                            "the modules are norm, activation, dropout, mlp and moe (Megatron's "
                            "layernorm and moe_act are the first two)",
                            "training.recompute_modules[%d] \"%.60s\" is not a module mgc "
                            "recomputes",
                            i, s);
        else if (dup)
            mgc_check_warning(k, at, "remove the repeat",
                              "training.recompute_modules[%d] \"%s\" is listed twice", i, s);
        else if (!strcmp(s, "moe") && c->moe.num_experts == 0)
            mgc_check_warning(k, at, "remove it, or use mlp for a dense model's MLPs",
                              "training.recompute_modules[%d] moe has no effect: the model has no "
                              "MoE layers (moe.num_experts is 0)",
                              i);
    }
    if (mgc_check_given(k, KEY(TRAIN_LOGITS_DTYPE)) && t->logits_dtype == MGC_LOGITS_DT_COMPUTE &&
        t->precision == MGC_PREC_FP32)
        mgc_check_warning(k, mgc_check_at(k, KEY(TRAIN_LOGITS_DTYPE)),
                          "remove it, or train in bf16 or fp16",
                          "training.logits_dtype compute has no effect: training.precision is "
                          "fp32, so the logits are fp32 either way");
    if (t->loss_chunks > 1 && c->parallel.context >= 1 &&
        c->model.seq_length % c->parallel.context == 0 && !mgc_loss_chunks_fit(c, t->loss_chunks)) {
        int64_t s_c = c->model.seq_length / c->parallel.context;
        char cand[160];
        mgc_check_candidates(k, loss_chunks_fit, 1, s_c, t->loss_chunks, 6, cand, sizeof cand);
        snprintf(hint, sizeof hint, "set training.loss_chunks to one of %s, or 0 (auto)", cand);
        mgc_check_error(k, mgc_check_at(k, KEY(TRAIN_LOSS_CHUNKS)), hint,
                        "%s does not split the loss rank's %" PRId64 " sequence positions x "
                        "micro batch %" PRId64 " into equal chunks of a multiple of %d rows",
                        mgc_check_kv(a, k, KEY(TRAIN_LOSS_CHUNKS), t->loss_chunks), s_c,
                        t->micro_batch_size, MGC_LOSS_CHUNK_ROWS);
    }
    if (!mgc_check_given(k, KEY(OPT_DECAY_ITERS))) o->decay_iterations = t->iterations;
    if (o->min_lr > o->lr) {
        snprintf(hint, sizeof hint, "set optimizer.min_lr at most %g (commonly lr / 10)", o->lr);
        mgc_check_error(
            k, mgc_check_at(k, mgc_check_pick(k, 2, KEY(OPT_MIN_LR), KEY(OPT_LR))), hint,
            "%s is larger than %s: the schedule would raise the learning rate while decaying",
            kvf(a, k, KEY(OPT_MIN_LR), o->min_lr), kvf(b, k, KEY(OPT_LR), o->lr));
    }
    if (o->lr == 0)
        mgc_check_warning(k, mgc_check_at(k, KEY(OPT_LR)), "set optimizer.lr, e.g. 3e-4",
                          "optimizer.lr is 0: the weights never change");
    if (o->warmup_iterations > 0 && o->warmup_iterations >= t->iterations) {
        snprintf(hint, sizeof hint,
                 "set optimizer.warmup_iterations below %" PRId64
                 " (commonly 1%% to 10%% of the run)",
                 t->iterations);
        mgc_check_error(k, mgc_check_at(k, mgc_check_pick(k, 2, KEY(OPT_WARMUP), KEY(TRAIN_ITERS))),
                        hint, "%s is not below %s: training ends before warmup does",
                        mgc_check_kv(a, k, KEY(OPT_WARMUP), o->warmup_iterations),
                        mgc_check_kv(b, k, KEY(TRAIN_ITERS), t->iterations));
    } else if (mgc_check_given(k, KEY(OPT_DECAY_ITERS)) &&
               o->decay_iterations < o->warmup_iterations) {
        snprintf(hint, sizeof hint, "set optimizer.decay_iterations to at least %" PRId64,
                 o->warmup_iterations);
        mgc_check_error(k, mgc_check_at(k, KEY(OPT_DECAY_ITERS)), hint,
                        "%s is smaller than %s: decay would end before warmup does",
                        mgc_check_kv(a, k, KEY(OPT_DECAY_ITERS), o->decay_iterations),
                        mgc_check_kv(b, k, KEY(OPT_WARMUP), o->warmup_iterations));
    }
    /* wsd: lr held after warmup, then the last wsd_decay_iterations of decay_iterations anneal */
    int64_t span = o->decay_iterations - o->warmup_iterations;
    if (!mgc_check_given(k, KEY(OPT_WSD_ITERS)))
        o->wsd_decay_iterations = span > 0 ? (span + 9) / 10 : 1;
    if (o->decay_style == MGC_DECAY_WSD && mgc_check_given(k, KEY(OPT_WSD_ITERS)) &&
        o->wsd_decay_iterations > span) {
        snprintf(hint, sizeof hint, "set optimizer.wsd_decay_iterations at most %" PRId64 " (commonly 10%% to 20%% of it)",
                 span > 0 ? span : 0);
        mgc_check_error(k, mgc_check_at(k, KEY(OPT_WSD_ITERS)), hint,
                        "%s is longer than the %" PRId64 " steps between warmup and %s: the anneal "
                        "would start before warmup ends",
                        mgc_check_kv(a, k, KEY(OPT_WSD_ITERS), o->wsd_decay_iterations), span,
                        mgc_keys[KEY(OPT_DECAY_ITERS)].path);
    }
    if (o->decay_style != MGC_DECAY_WSD) {
        static const mgc_key wk[] = {KEY(OPT_WSD_ITERS), KEY(OPT_WSD_STYLE)};
        for (int i = 0; i < 2; i++)
            if (mgc_check_given(k, wk[i]))
                mgc_check_warning(k, mgc_check_at(k, wk[i]), "remove it, or set optimizer.decay_style: wsd",
                                  "%s has no effect: optimizer.decay_style is not wsd",
                                  mgc_keys[wk[i]].path);
    }
    if (o->decay_style == MGC_DECAY_CONSTANT) {
        static const mgc_key dk[] = {KEY(OPT_MIN_LR), KEY(OPT_DECAY_ITERS)};
        for (int i = 0; i < 2; i++)
            if (mgc_check_given(k, dk[i]))
                mgc_check_warning(k, mgc_check_at(k, dk[i]),
                                  "remove it, or choose optimizer.decay_style cosine, linear or wsd",
                                  "%s has no effect: optimizer.decay_style is constant",
                                  mgc_keys[dk[i]].path);
    }
}

/* data.split: three non-negative numbers separated by ',' or '/'. */
static void check_split(mgc_check_ctx *k) {
    const char *s = k->c->data.split ? k->c->data.split : "";
    mgc_loc loc = mgc_check_at(k, KEY(DATA_SPLIT));
    const char *hint =
        "write three non-negative weights for train, validation and test, e.g. \"969,30,1\"";
    double w[3] = {0, 0, 0};
    int n = 0, i = 0;
    for (;;) {
        while (s[i] == ' ' || s[i] == '\t')
            i++;
        if (!s[i]) break;
        if (n == 3) {
            mgc_check_error(k, mgc_check_inside(loc, i), hint,
                            "data.split \"%.40s\": more than three parts", s);
            return;
        }
        char *end;
        double v = strtod(s + i, &end);
        int len = (int)(end - (s + i));
        if (len == 0 || !isfinite(v) || s[i] == '+' || s[i] == '-') {
            if (len > 0 && v < 0)
                mgc_check_error(k, mgc_check_inside(loc, i), hint,
                                "data.split \"%.40s\": weights cannot be negative", s);
            else
                mgc_check_error(k, mgc_check_inside(loc, i), hint,
                                "data.split \"%.40s\": expected a number at character %d", s,
                                i + 1);
            return;
        }
        w[n++] = v;
        i += len;
        while (s[i] == ' ' || s[i] == '\t')
            i++;
        if (s[i] == ',' || s[i] == '/')
            i++;
        else if (s[i]) {
            mgc_check_error(k, mgc_check_inside(loc, i), hint,
                            "data.split \"%.40s\": unexpected '%c'; separate the parts with commas",
                            s, s[i]);
            return;
        }
    }
    if (n != 3) {
        mgc_check_error(
            k, loc, hint,
            "data.split \"%.40s\": expected three parts (train, validation, test), got %d", s, n);
        return;
    }
    if (w[0] == 0)
        mgc_check_error(
            k, loc, w[1] + w[2] > 0 ? "give the first (train) part a positive weight" : hint,
            "data.split \"%.40s\": the training part is 0, so there is nothing to train on", s);
    const mgc_training_cfg *t = &k->c->training;
    if (t->eval_interval > 0 && w[1] == 0) {
        char a[KV_N];
        mgc_check_error(k, mgc_check_at(k, mgc_check_pick(k, 2, KEY(TRAIN_EVAL_INTERVAL), KEY(DATA_SPLIT))),
                        "give data.split a validation part (e.g. \"969,30,1\"), or set "
                        "training.eval_interval: 0",
                        "%s asks for evaluations, but data.split \"%.40s\" has no validation part",
                        mgc_check_kv(a, k, KEY(TRAIN_EVAL_INTERVAL), t->eval_interval), s);
    }
}

static void check_data(mgc_check_ctx *k) {
    mgc_config *c = k->c;
    const mgc_data_cfg *dt = &c->data;
    if (dt->format == MGC_DATA_MEGATRON && dt->paths.n == 0)
        mgc_check_error(
            k, mgc_check_at(k, mgc_check_pick(k, 2, KEY(DATA_PATHS), KEY(DATA_FORMAT))),
            "add data.paths: [PREFIX] (the .bin/.idx pair without the extension), or use "
            "data.format: synthetic",
            "data.format megatron needs data.paths");
    if (dt->format == MGC_DATA_SYNTHETIC && dt->paths.n > 0)
        mgc_check_warning(k, mgc_check_at(k, KEY(DATA_PATHS)),
                          "set data.format: megatron to train on these files, or remove data.paths",
                          "data.paths is ignored: data.format is synthetic");
    for (int i = 0; i < dt->paths.n; i++) {
        const char *pth = dt->paths.path[i] ? dt->paths.path[i] : "";
        if (!pth[0]) {
            mgc_check_error(k, dt->paths.loc[i],
                            "give the dataset prefix (the .bin/.idx pair without the extension)",
                            "data.paths[%d] is empty", i);
            continue;
        }
        for (int j = 0; j < i; j++)
            if (dt->paths.path[j] && strcmp(dt->paths.path[j], pth) == 0) {
                mgc_check_warning(k, dt->paths.loc[i],
                                  "list each dataset once and give it the combined weight",
                                  "data.paths[%d] repeats data.paths[%d] (\"%.80s\")", i, j, pth);
                break;
            }
    }
    check_split(k);
    /* the end-of-document mask */
    const mgc_data_cfg *dc = &c->data;
    int docs = dc->reset_attention_mask || dc->reset_position_ids;
    if ((dc->eod_mask_loss || docs) && dc->eod_token >= c->model.vocab_size) {
        char a[KV_N], b[KV_N], hint[HINT_N];
        snprintf(hint, sizeof hint,
                 "set data.eod_token to your tokenizer's end-of-document id, below %" PRId64
                 " (256 for mgc's byte tokenizer)",
                 c->model.vocab_size);
        mgc_check_error(k, mgc_check_at(k, KEY(DATA_EOD)), hint,
                        "%s is not a token of the vocabulary (%s): no document would end",
                        mgc_check_kv(a, k, KEY(DATA_EOD), dc->eod_token),
                        mgc_check_kv(b, k, KEY(MODEL_VOCAB_SIZE), c->model.vocab_size));
    }
    if (!dc->eod_mask_loss && !docs && mgc_check_given(k, KEY(DATA_EOD)))
        mgc_check_warning(k, mgc_check_at(k, KEY(DATA_EOD)),
                          "set data.eod_mask_loss, data.reset_attention_mask or "
                          "data.reset_position_ids: true to use it",
                          "data.eod_token has no effect unless a document option is on");
    if (dc->reset_position_ids && c->model.position_embedding == MGC_POS_NONE)
        mgc_check_warning(k, mgc_check_at(k, KEY(DATA_RESET_POS)),
                          "remove it, or use model.position_embedding: learned or rotary",
                          "data.reset_position_ids has no effect with model.position_embedding: "
                          "none");
    /* checkpoint */
    const mgc_checkpoint_cfg *cp = &c->checkpoint;
    if (cp->directory && cp->directory[0] && cp->interval > c->training.iterations) {
        char a[KV_N], b[KV_N];
        mgc_check_warning(k, mgc_check_at(k, KEY(CKPT_INTERVAL)),
                          "lower checkpoint.interval to checkpoint during the run",
                          "%s is longer than %s: only the final checkpoint is written",
                          mgc_check_kv(a, k, KEY(CKPT_INTERVAL), cp->interval),
                          mgc_check_kv(b, k, KEY(TRAIN_ITERS), c->training.iterations));
    }
    if (!cp->directory || !cp->directory[0]) {
        static const mgc_key ck_keys[] = {KEY(CKPT_INTERVAL), KEY(CKPT_KEEP)};
        for (int i = 0; i < 2; i++)
            if (mgc_check_given(k, ck_keys[i]))
                mgc_check_warning(
                    k, mgc_check_at(k, ck_keys[i]),
                    "set checkpoint.directory (or give mgc-run --checkpoint-dir)",
                    "%s has no effect unless mgc-run is given --checkpoint-dir: "
                    "checkpoint.directory is empty",
                    mgc_keys[ck_keys[i]].path);
    }
}

static int arch_known(int64_t a) {
    for (size_t i = 0; i < sizeof known_archs / sizeof known_archs[0]; i++)
        if (known_archs[i] == a) return 1;
    return 0;
}

static void check_hardware(mgc_check_ctx *k) {
    mgc_config *c = k->c;
    mgc_hardware_cfg *h = &c->hardware;
    int64_t world = c->parallel.world_size;
    char a[KV_N], b[KV_N], e[KV_N], hint[HINT_N];
    if (!mgc_check_given(k, KEY(HW_NODES))) {
        if (k->grid_ok) h->nodes = ceil_div(world, h->gpus_per_node);
    } else if (k->grid_ok) {
        int64_t gpus = mgc_check_mul(h->nodes, h->gpus_per_node);
        if (gpus < world) {
            snprintf(hint, sizeof hint,
                     "set hardware.nodes to %" PRId64
                     ", or remove it (it is derived from world_size)",
                     ceil_div(world, h->gpus_per_node));
            mgc_check_error(k, mgc_check_at(k, KEY(HW_NODES)), hint,
                            "%s * %s = %" PRId64 " GPUs, fewer than %s",
                            mgc_check_kv(a, k, KEY(HW_NODES), h->nodes),
                            mgc_check_kv(b, k, KEY(HW_GPN), h->gpus_per_node), gpus,
                            mgc_check_kv(e, k, KEY(PAR_WORLD), world));
        } else if (gpus - world >= h->gpus_per_node) {
            snprintf(hint, sizeof hint,
                     "set hardware.nodes to %" PRId64 ", or raise parallel.data to use them",
                     ceil_div(world, h->gpus_per_node));
            mgc_check_warning(k, mgc_check_at(k, KEY(HW_NODES)), hint,
                              "%s * %s = %" PRId64 " GPUs, but the job has only %" PRId64
                              " ranks (parallel.world_size): %" PRId64 " GPUs sit idle",
                              mgc_check_kv(a, k, KEY(HW_NODES), h->nodes),
                              mgc_check_kv(b, k, KEY(HW_GPN), h->gpus_per_node), gpus, world,
                              gpus - world);
        }
    }
    const mgc_int_list *al = &h->cuda_archs;
    if (mgc_check_given(k, KEY(HW_ARCHS)) && al->n == 0)
        mgc_check_error(
            k, mgc_check_at(k, KEY(HW_ARCHS)), "list at least one, e.g. [80, 90]",
            "hardware.cuda_archs is empty: there is no architecture to compile kernels for");
    for (int i = 0; i < al->n; i++) {
        int64_t v = al->v[i];
        if (!arch_known(v)) {
            snprintf(hint, sizeof hint, "known: ");
            for (size_t j = 0; j < sizeof known_archs / sizeof known_archs[0]; j++)
                mgc_check_cat(hint, sizeof hint, "%s%d", j ? " " : "", known_archs[j]);
            mgc_check_cat(hint, sizeof hint,
                          " (80 = A100, 89 = L40S, 90 = H100/H200, 100 = B200, 120 = RTX 50xx)");
            mgc_check_error(k, al->loc[i], hint,
                            "hardware.cuda_archs[%d]: unknown CUDA architecture %" PRId64
                            " (sm_%" PRId64 ")",
                            i, v, v);
            continue;
        }
        for (int j = 0; j < i; j++)
            if (al->v[j] == v) {
                mgc_check_warning(k, al->loc[i], "list each architecture once",
                                  "hardware.cuda_archs[%d] repeats %" PRId64, i, v);
                break;
            }
        if (c->training.precision == MGC_PREC_BF16 && v < 80) {
            snprintf(hint, sizeof hint,
                     "remove %" PRId64 " from hardware.cuda_archs, or use training.precision fp32",
                     v);
            mgc_check_error(
                k, al->loc[i], hint,
                "training.precision bf16 needs compute capability 8.0 or newer, but sm_%" PRId64
                " has no bf16 tensor cores",
                v);
        } else if (c->training.precision == MGC_PREC_FP16 && v < 80) {
            snprintf(hint, sizeof hint,
                     "remove %" PRId64 " from hardware.cuda_archs, or use training.precision fp32",
                     v);
            mgc_check_error(k, al->loc[i], hint,
                            "training.precision fp16 needs compute capability 8.0 or newer for "
                            "mgc's kernels (m16n8k16 tensor-core and packed-conversion "
                            "instructions), but this entry is sm_%" PRId64,
                            v);
        }
    }
}

mgc_kernels_gap mgc_check_kernels_gap(const mgc_config *c, char *why, size_t n) {
    const mgc_model_cfg *m = &c->model;
    const mgc_moe_cfg *e = &c->moe;
    if (m->head_dim >= 1 && !mgc_kspec_head_dim_ok(m->head_dim)) {
        snprintf(why, n,
                 "model.head_dim (%" PRId64 "): mgc's CUDA attention kernels take a head dim that is a "
                 "multiple of 8 from 8 to 256",
                 m->head_dim);
        return MGC_KERNELS_HEAD_DIM;
    }
    if (e->num_experts > 0 && e->top_k >= 1 && e->top_k <= e->num_experts &&
        !mgc_kspec_router_ok(e->num_experts, e->top_k)) {
        if (e->num_experts > 1024) {
            snprintf(why, n, "moe.num_experts (%" PRId64 "): mgc's CUDA router kernels take up to 1024 experts",
                     e->num_experts);
            return MGC_KERNELS_EXPERTS;
        }
        snprintf(why, n,
                 "moe.top_k (%" PRId64 "): mgc's CUDA router kernels take a top-k of at most 64",
                 e->top_k);
        return MGC_KERNELS_TOPK;
    }
    return MGC_KERNELS_SERVED;
}

/* What mgc's CUDA kernels serve: a model beyond it is still valid and trains on the CPU
 * backend, but `mgc compile` cannot build its kernels (it refuses, or writes the plan under
 * --no-kernels, whose JIT-compile on a GPU then fails), so say so here, at the key. */
static void check_kernels(mgc_check_ctx *k) {
    char hint[HINT_N], why[256];
    if (k->d->errors != k->errors0 || !k->hd_ok) return; /* an invalid model needs no word on GPUs */
    mgc_kernels_gap gap = mgc_check_kernels_gap(k->c, why, sizeof why);
    mgc_key key;
    switch (gap) {
    case MGC_KERNELS_SERVED: return;
    case MGC_KERNELS_HEAD_DIM: {
        int64_t d = k->c->model.head_dim, lo = d / 8 * 8, up = lo + 8;
        if (d > 256)
            snprintf(hint, sizeof hint, "use heads of at most 256 channels (more heads of 256 or 128)");
        else if (lo < 8)
            snprintf(hint, sizeof hint, "use heads of 8 channels or more");
        else
            snprintf(hint, sizeof hint, "use heads of %" PRId64 " or %" PRId64 " channels", lo, up);
        key = mgc_check_pick(k, 3, KEY(MODEL_HEAD_DIM), KEY(MODEL_HEADS), KEY(MODEL_HIDDEN));
        break;
    }
    case MGC_KERNELS_EXPERTS:
        snprintf(hint, sizeof hint, "use at most 1024 experts");
        key = KEY(MOE_EXPERTS);
        break;
    default:
        snprintf(hint, sizeof hint, "route each token to at most 64 experts");
        key = KEY(MOE_TOPK);
        break;
    }
    mgc_check_cat(hint, sizeof hint, ", or train this model on the CPU backend (mgc compile --no-kernels)");
    mgc_check_warning(k, mgc_check_at(k, key), hint, "%s, so this model cannot train on a GPU", why);
}

/* Guards for downstream arithmetic (parameter counts, FLOPs, memory): no
 * product the planner forms may overflow. */
static void check_sizes(mgc_check_ctx *k) {
    const mgc_config *c = k->c;
    const mgc_model_cfg *m = &c->model;
    if (!k->hd_ok) return;
    int64_t h = m->hidden_size, q = mgc_check_mul(m->num_heads, m->head_dim),
            kvw = mgc_check_mul(m->num_query_groups, m->head_dim);
    int64_t att = mgc_check_mul(h, add(add(q, q), mgc_check_mul(2, kvw)));
    int64_t mlp = mgc_check_mul3(3, h, m->ffn_hidden_size);
    int64_t moe = 0;
    if (k->moe)
        moe = mgc_check_mul3(add(c->moe.num_experts, c->moe.shared_experts), 3,
                             mgc_check_mul(h, c->moe.ffn_hidden_size > c->moe.shared_ffn_hidden_size
                                                  ? c->moe.ffn_hidden_size
                                                  : c->moe.shared_ffn_hidden_size));
    int64_t layer = add(att, add(mlp, moe));
    int64_t total =
        add(mgc_check_mul(layer, m->num_layers),
            mgc_check_mul3(
                2, h, add(m->vocab_size, mgc_check_mul(m->vocab_divisor, c->parallel.tensor))));
    int64_t tokens = mgc_check_mul(c->training.global_batch_size, m->seq_length);
    const int64_t limit = (int64_t)1 << 53;
    if (total < 0 || total > limit)
        mgc_check_error(k,
                        mgc_check_at(k, mgc_check_pick(k, 3, KEY(MODEL_LAYERS), KEY(MODEL_HIDDEN),
                                                       KEY(MOE_EXPERTS))),
                        "shrink the model; mgc counts parameters exactly in 53 bits",
                        "the model has more than 2^53 parameters: too large to plan");
    if (k->batch_ok && (tokens < 0 || tokens > limit))
        mgc_check_error(
            k, mgc_check_at(k, mgc_check_pick(k, 2, KEY(TRAIN_GBS), KEY(MODEL_SEQ_LENGTH))),
            "lower training.global_batch_size",
            "global_batch_size * seq_length exceeds 2^53 tokens per step: too large to plan");
}

/* ---- derived ------------------------------------------------------------ */

int64_t mgc_check_padded_vocab(int64_t vocab, int64_t divisor, int64_t tensor) {
    if (vocab <= 0 || divisor <= 0 || tensor <= 0) return -1;
    int64_t mult = mgc_check_mul(divisor, tensor);
    if (mult < 0) return -1;
    int64_t padded = mgc_check_mul(ceil_div(vocab, mult), mult);
    return padded;
}

static void fill_derived(mgc_check_ctx *k) {
    mgc_config *c = k->c;
    mgc_derived *dv = &c->derived;
    const mgc_parallel_cfg *p = &c->parallel;
    free(dv->is_moe_layer);
    free(dv->stages);
    memset(dv, 0, sizeof *dv);

    dv->padded_vocab_size =
        mgc_check_padded_vocab(c->model.vocab_size, c->model.vocab_divisor, p->tensor);
    if (dv->padded_vocab_size < 0)
        mgc_check_error(
            k, mgc_check_at(k, mgc_check_pick(k, 2, KEY(MODEL_VOCAB_DIVISOR), KEY(PAR_TP))),
            "lower model.make_vocab_size_divisible_by", "the padded vocabulary size overflows");
    dv->num_microbatches = k->batch_ok ? c->training.grad_accum : 0;
    dv->sequence_parallel = k->sp;
    if (k->grid_ok) {
        int64_t eg = mgc_check_mul3(p->expert_tensor, p->expert, p->pipeline);
        dv->expert_data = eg > 0 && p->world_size % eg == 0 ? p->world_size / eg : 0;
    }

    int64_t L = c->model.num_layers;
    dv->is_moe_layer = calloc((size_t)L, 1);
    if (!dv->is_moe_layer) {
        mgc_check_error(k, c->file_loc, NULL, "out of memory");
        return;
    }
    if (k->moe) {
        const mgc_moe_cfg *e = &c->moe;
        if (mgc_check_given(k, KEY(MOE_LAYERS))) {
            for (int i = 0; i < e->layers.n; i++)
                if (e->layers.v[i] >= 0 && e->layers.v[i] < L) dv->is_moe_layer[e->layers.v[i]] = 1;
        } else {
            for (int64_t i = e->first_dense_layers; i < L; i++)
                if ((i - e->first_dense_layers) % e->layer_freq == 0) dv->is_moe_layer[i] = 1;
        }
        for (int64_t i = 0; i < L; i++)
            dv->num_moe_layers += dv->is_moe_layer[i];
    }

    mgc_check_fill_stages(k);
}

/* Full recompute's method and layer count, against the pipeline chunks (after fill_derived). */
static void check_recompute(mgc_check_ctx *k) {
    mgc_config *c = k->c;
    const mgc_training_cfg *t = &c->training;
    static const mgc_key keys[] = {KEY(TRAIN_RECOMPUTE_METHOD), KEY(TRAIN_RECOMPUTE_NUM_LAYERS)};
    if ((mgc_config_recompute_modules(c) & MGC_RECOMPUTE_MOD_MLP) && c->derived.is_moe_layer &&
        c->derived.num_moe_layers == c->model.num_layers)
        mgc_check_warning(k, mgc_check_at(k, KEY(TRAIN_RECOMPUTE_MODULES)), "remove it, or use moe for MoE layers",
                          "training.recompute_modules mlp has no effect: every layer of the model is an "
                          "MoE layer");
    if (t->recompute != MGC_RECOMPUTE_FULL) {
        for (int i = 0; i < 2; i++)
            if (mgc_check_given(k, keys[i]))
                mgc_check_warning(k, mgc_check_at(k, keys[i]),
                                  "remove it, or set training.recompute: full",
                                  "%s has no effect: it shapes full recompute, and "
                                  "training.recompute is %s",
                                  mgc_keys[keys[i]].path, mgc_enum_recompute[t->recompute]);
        return;
    }
    const mgc_derived *dv = &c->derived;
    if (!dv->stages) return; /* the pipeline rules failed: reported there */
    int64_t most = 0; /* decoder layers of the fullest chunk */
    for (int64_t s = 0; s < dv->num_stages; s++)
        most = dv->stages[s].num_layers > most ? dv->stages[s].num_layers : most;
    int block = t->recompute_method == MGC_RECOMPUTE_BLOCK;
    if (most > 0 && t->recompute_num_layers > most) {
        char hint[HINT_N];
        snprintf(hint, sizeof hint, "choose 1 ... %" PRId64 " (the layers of the fullest pipeline chunk)%s",
                 most, block ? "; block with that many recomputes every layer, as uniform with 1 does" : "");
        mgc_check_error(k, mgc_check_at(k, KEY(TRAIN_RECOMPUTE_NUM_LAYERS)), hint,
                        "training.recompute_num_layers (%" PRId64 ") is more than the decoder "
                        "layers of the fullest pipeline chunk (%" PRId64 "; %" PRId64
                        " layers over %" PRId64 " chunk%s)",
                        t->recompute_num_layers, most, c->model.num_layers, dv->num_stages,
                        dv->num_stages == 1 ? "" : "s");
    }
    /* the modules norm, activation, mlp and moe act on the layers full recompute leaves alone */
    uint32_t redone = MGC_RECOMPUTE_MOD_NORM | MGC_RECOMPUTE_MOD_ACTIVATION | MGC_RECOMPUTE_MOD_MLP |
                      MGC_RECOMPUTE_MOD_MOE;
    uint32_t idle = mgc_config_recompute_modules(c) & redone;
    if (idle && (!block || t->recompute_num_layers >= most)) {
        char names[64] = "";
        int n = 0;
        for (int j = 0; mgc_recompute_module_names[j]; j++)
            if (idle & (1u << j))
                mgc_check_cat(names, sizeof names, "%s%s", n++ ? ", " : "", mgc_recompute_module_names[j]);
        mgc_check_warning(k, mgc_check_at(k, KEY(TRAIN_RECOMPUTE_MODULES)),
                          "remove them, set training.recompute to none or selective, or recompute fewer "
                          "layers with training.recompute_method: block",
                          "training.recompute_modules %s: no effect, training.recompute is full and re-runs "
                          "every layer from its input",
                          names);
    }
}

/* ---- entry point -------------------------------------------------------- */

int mgc_check_config(mgc_config *c, mgc_diags *d) {
    mgc_check_ctx k;
    memset(&k, 0, sizeof k);
    k.c = c;
    k.d = d;
    k.errors0 = d->errors;
    k.moe = c->moe.num_experts > 0;

    check_model(&k);
    derive_grid(&k);
    check_moe(&k); /* before the tensor rules: they suggest degrees that also fit the experts */
    check_tensor(&k);
    check_sequence(&k);
    mgc_check_derive_pipeline(&k);
    mgc_check_derive_batch(&k);
    mgc_check_schedule(&k);
    check_training(&k);
    check_data(&k);
    check_hardware(&k);
    check_sizes(&k);
    fill_derived(&k);
    check_recompute(&k);
    check_kernels(&k); /* last: only a model with no error hears about GPUs */

    free(k.lay);
    return d->errors != k.errors0;
}
