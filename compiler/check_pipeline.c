/* check_pipeline.c - consistency rules of the pipeline and its microbatches;
 * see check.h.
 *
 * Layout of this file:
 *   candidates        pipeline and virtual-stage degrees for hints
 *   layout grammar    mgc_check_parse_stage(): one string of
 *                     parallel.pipeline_layout
 *   pipeline          the explicit layout or the even split, virtual stages,
 *                     schedule and microbatch_group_size defaults
 *   batch + schedule  micro / global / accumulation; microbatches against
 *                     the schedule (interleaving rule, pipeline bubble)
 *   stages            c->derived.stages
 *
 * check.c runs these steps from mgc_check_config(); check_int.h holds the
 * context and the helpers shared with it. */
#include "check_int.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- candidates --------------------------------------------------------- */

static int pp_fits(const mgc_check_ctx *k, int64_t v) {
    const mgc_config *c = k->c;
    int64_t s = mgc_check_mul(v, c->parallel.virtual_stages);
    if (s <= 0 || c->model.num_layers % s) return 0;
    if (v == 1 && c->parallel.virtual_stages > 1) return 0; /* virtual stages need a pipeline */
    if (mgc_check_given(k, KEY(PAR_WORLD)) && !mgc_check_given(k, KEY(PAR_DP))) {
        int64_t mp = mgc_check_mul3(c->parallel.tensor, c->parallel.context, v);
        if (mp <= 0 || c->parallel.world_size % mp) return 0;
    }
    return 1;
}

static int vp_fits(const mgc_check_ctx *k, int64_t v) {
    const mgc_config *c = k->c;
    int64_t s = mgc_check_mul(v, c->parallel.pipeline);
    return s > 0 && c->model.num_layers % s == 0;
}

/* ---- layout grammar ----------------------------------------------------- */

int mgc_check_parse_stage(const char *s, mgc_layout_stage *out, int *err_at, char *msg,
                          size_t msgsz, char *hint, size_t hintsz) {
    char m[256] = "", h[256] = "";
    int bad = -1;
    mgc_layout_stage st = {0, -1, -1};
    int seen_t = 0;
    for (int i = 0; s[i] && bad < 0;) {
        char ch = s[i];
        if (ch == ' ' || ch == '\t') {
            i++;
            continue;
        }
        if (st.loss_at >= 0) {
            bad = i;
            snprintf(m, sizeof m, "nothing may follow L (the loss closes the last stage)");
            snprintf(h, sizeof h, "move L to the end of the string");
            break;
        }
        switch (ch) {
        case 'E':
            if (st.embedding_at >= 0) {
                bad = i;
                snprintf(m, sizeof m, "E appears twice");
                snprintf(h, sizeof h, "the embedding is one stage element; keep one E");
            } else if (seen_t) {
                bad = i;
                snprintf(m, sizeof m, "E must come before the stage's layers");
                snprintf(h, sizeof h, "move E to the start of the string");
            }
            st.embedding_at = i++;
            break;
        case 'L':
            st.loss_at = i++;
            break;
        case 't': {
            int j = i + 1;
            int64_t n = 1;
            while (s[j] == ' ' || s[j] == '\t')
                j++;
            if (s[j] == '*') {
                j++;
                while (s[j] == ' ' || s[j] == '\t')
                    j++;
                if (s[j] < '0' || s[j] > '9') {
                    bad = j;
                    snprintf(m, sizeof m, "expected a layer count after '*'");
                    snprintf(h, sizeof h, "write t*N, e.g. t*4");
                    break;
                }
                int d0 = j;
                n = 0;
                while (s[j] >= '0' && s[j] <= '9') {
                    if (n < 100000000) n = n * 10 + (s[j] - '0');
                    j++;
                }
                if (n == 0) {
                    bad = d0;
                    snprintf(m, sizeof m, "a layer count must be at least 1");
                    snprintf(h, sizeof h, "drop the t*0; an empty string makes an empty stage");
                    break;
                }
                if (n > 65536) {
                    bad = d0;
                    snprintf(m, sizeof m,
                             "layer count %" PRId64
                             "%s is larger than any model (at most 65536 layers)",
                             n, n >= 100000000 ? "+" : "");
                    break;
                }
                i = j;
            } else {
                i++;
            }
            seen_t = 1;
            st.num_layers += n;
            if (st.num_layers > 65536 * 64)
                st.num_layers = 65536 * 64; /* far beyond any num_layers */
            break;
        }
        case '|':
            bad = i;
            snprintf(m, sizeof m, "'|' separates stages in Megatron's layout string");
            snprintf(h, sizeof h, "give each stage its own list item: [\"E t*4\", \"t*4 L\"]");
            break;
        case 'm':
            bad = i;
            snprintf(m, sizeof m, "multi-token prediction layers (m) are not supported");
            snprintf(h, sizeof h, "use E, t, t*N and L");
            break;
        case '(':
        case ')':
        case ',':
            bad = i;
            snprintf(m, sizeof m, "unexpected '%c': Megatron's grouping syntax is not supported",
                     ch);
            snprintf(h, sizeof h,
                     "write one string per stage using E, t, t*N and L, separated by spaces");
            break;
        case '*':
            bad = i;
            snprintf(m, sizeof m, "'*' must follow t");
            snprintf(h, sizeof h, "write t*N, e.g. t*4");
            break;
        case 'T':
        case 'e':
        case 'l':
            bad = i;
            snprintf(m, sizeof m, "unexpected '%c' (tokens are case-sensitive)", ch);
            snprintf(h, sizeof h, "use E (embedding), t (a layer), t*N (N layers) and L (loss)");
            break;
        default:
            bad = i;
            if (ch >= '0' && ch <= '9') {
                snprintf(m, sizeof m, "a layer count needs 't*' before it");
                snprintf(h, sizeof h, "write t*N, e.g. t*4");
            } else {
                if (ch > ' ' && ch < 127)
                    snprintf(m, sizeof m, "unexpected '%c'", ch);
                else
                    snprintf(m, sizeof m, "unexpected byte 0x%02x", (unsigned char)ch);
                snprintf(h, sizeof h,
                         "use E (embedding), t (a layer), t*N (N layers) and L (loss)");
            }
            break;
        }
    }
    if (bad >= 0) {
        if (err_at) *err_at = bad;
        if (msg && msgsz) snprintf(msg, msgsz, "%s", m);
        if (hint && hintsz) snprintf(hint, hintsz, "%s", h);
        return -1;
    }
    if (out) *out = st;
    return 0;
}

/* ---- pipeline ----------------------------------------------------------- */

/* A balanced example layout for `layers` over `stages` stages, as a YAML
 * flow list; extra layers go to the middle stages, which hold neither the
 * embedding nor the loss.  Empty when too long to be a useful hint. */
static void example_layout(int64_t layers, int64_t stages, char *buf, size_t n) {
    buf[0] = 0;
    if (stages < 2 || stages > 8 || layers < stages) return;
    int64_t cnt[16], order[16], no = 0;
    int64_t base = layers / stages, extra = layers % stages;
    /* preference for an extra layer: middle stages nearest the centre
     * first, then the two ends */
    for (int64_t dist = 0; dist <= stages; dist++)
        for (int64_t i = 1; i < stages - 1; i++)
            if ((2 * i - (stages - 1) < 0 ? (stages - 1) - 2 * i : 2 * i - (stages - 1)) == dist)
                order[no++] = i;
    order[no++] = 0;
    order[no++] = stages - 1;
    for (int64_t i = 0; i < stages; i++)
        cnt[i] = base;
    for (int64_t i = 0; i < extra; i++)
        cnt[order[i]]++;
    mgc_check_cat(buf, n, "[");
    for (int64_t i = 0; i < stages; i++) {
        mgc_check_cat(buf, n, "%s\"", i ? ", " : "");
        if (i == 0) mgc_check_cat(buf, n, "E ");
        if (cnt[i] == 1)
            mgc_check_cat(buf, n, "t");
        else
            mgc_check_cat(buf, n, "t*%" PRId64, cnt[i]);
        if (i == stages - 1) mgc_check_cat(buf, n, " L");
        mgc_check_cat(buf, n, "\"");
    }
    mgc_check_cat(buf, n, "]");
    if (strlen(buf) + 1 >= n) buf[0] = 0;
}

static void check_layout(mgc_check_ctx *k) {
    mgc_config *c = k->c;
    mgc_parallel_cfg *p = &c->parallel;
    const mgc_str_list *ls = &p->pipeline_layout;
    char a[KV_N], hint[HINT_N], msg[256];
    int n = ls->n;
    if (n == 0) {
        k->pipe_ok = 0;
        mgc_check_error(
            k, mgc_check_at(k, KEY(PAR_LAYOUT)),
            "give one string per pipeline stage, e.g. [\"E t*4\", \"t*4 L\"], or remove the key "
            "for an even split",
            "parallel.pipeline_layout is empty");
        return;
    }
    k->lay = calloc((size_t)n, sizeof *k->lay);
    if (!k->lay) {
        k->pipe_ok = 0;
        mgc_check_error(k, mgc_check_at(k, KEY(PAR_LAYOUT)), NULL, "out of memory");
        return;
    }
    k->nlay = n;
    int grammar_ok = 1;
    for (int i = 0; i < n; i++) {
        int off = 0;
        const char *s = ls->v[i] ? ls->v[i] : "";
        if (mgc_check_parse_stage(s, &k->lay[i], &off, msg, sizeof msg, hint, sizeof hint)) {
            grammar_ok = 0;
            mgc_check_error(k, mgc_check_inside(ls->loc[i], off), hint,
                            "parallel.pipeline_layout[%d] \"%.60s\": %s", i, s, msg);
        }
    }
    if (!grammar_ok) {
        /* the count of a malformed layout (e.g. Megatron's '|' form) is noise */
        k->pipe_ok = 0;
        return;
    }
    if (n % p->pipeline) {
        k->pipe_ok = 0;
        int64_t lo = n / p->pipeline * p->pipeline, hi = lo + p->pipeline;
        if (lo > 0)
            snprintf(hint, sizeof hint,
                     "give %" PRId64 " or %" PRId64
                     " strings (virtual_stages = strings / pipeline), or set "
                     "parallel.pipeline to a divisor of %d",
                     lo, hi, n);
        else
            snprintf(hint, sizeof hint,
                     "give %" PRId64 " strings, or set parallel.pipeline to a divisor of %d", hi,
                     n);
        mgc_check_error(
            k, mgc_check_at(k, KEY(PAR_LAYOUT)), hint,
            "parallel.pipeline_layout has %d stage%s, not a multiple of %s: each pipeline rank "
            "holds the same "
            "number of stages",
            n, n == 1 ? "" : "s", mgc_check_kv(a, k, KEY(PAR_PP), p->pipeline));
    } else {
        int64_t vp = n / p->pipeline;
        if (mgc_check_given(k, KEY(PAR_VP)) && p->virtual_stages != vp) {
            k->pipe_ok = 0;
            snprintf(hint, sizeof hint,
                     "remove parallel.virtual_stages (it is derived from the layout)");
            mgc_check_error(
                k, mgc_check_at(k, KEY(PAR_VP)), hint,
                "%s disagrees with parallel.pipeline_layout: %d stages / pipeline %" PRId64
                " = %" PRId64,
                mgc_check_kv(a, k, KEY(PAR_VP), p->virtual_stages), n, p->pipeline, vp);
        }
        p->virtual_stages = vp;
    }
    /* E exactly once, in the first stage; L exactly once, in the last. */
    int ne = 0, nl = 0;
    for (int i = 0; i < n; i++) {
        const mgc_layout_stage *st = &k->lay[i];
        if (st->embedding_at >= 0) {
            ne++;
            if (i != 0) {
                k->pipe_ok = 0;
                mgc_check_error(
                    k, mgc_check_inside(ls->loc[i], st->embedding_at),
                    "move E to the start of the first string",
                    "parallel.pipeline_layout[%d]: the embedding (E) must be in the first stage",
                    i);
            }
        }
        if (st->loss_at >= 0) {
            nl++;
            if (i != n - 1) {
                k->pipe_ok = 0;
                mgc_check_error(
                    k, mgc_check_inside(ls->loc[i], st->loss_at),
                    "move L to the end of the last string",
                    "parallel.pipeline_layout[%d]: the loss (L) must be in the last stage", i);
            }
        }
    }
    if (ne == 0) {
        k->pipe_ok = 0;
        mgc_check_error(
            k, ls->loc[0], "start the first string with E, e.g. \"E t*4\"",
            "parallel.pipeline_layout has no embedding (E): the first stage must hold it");
    }
    if (nl == 0) {
        k->pipe_ok = 0;
        mgc_check_error(k, ls->loc[n - 1], "end the last string with L, e.g. \"t*4 L\"",
                        "parallel.pipeline_layout has no loss (L): the last stage must hold it");
    }
    int64_t total = 0;
    for (int i = 0; i < n; i++)
        total += k->lay[i].num_layers;
    if (total != c->model.num_layers) {
        k->pipe_ok = 0;
        int64_t diff =
            total > c->model.num_layers ? total - c->model.num_layers : c->model.num_layers - total;
        snprintf(hint, sizeof hint,
                 "%s %" PRId64 " layer%s %s the layout, or set model.num_layers to %" PRId64,
                 total > c->model.num_layers ? "remove" : "add", diff, diff == 1 ? "" : "s",
                 total > c->model.num_layers ? "from" : "to", total);
        mgc_check_error(k, mgc_check_at(k, KEY(PAR_LAYOUT)), hint,
                        "parallel.pipeline_layout places %" PRId64
                        " layers, but model.num_layers is %" PRId64,
                        total, c->model.num_layers);
    }
    /* A pipeline rank with nothing to compute still has to be scheduled and
     * holds no parameters (Megatron #1207 hangs on exactly this). */
    if (k->pipe_ok && n % p->pipeline == 0) {
        for (int64_t r = 0; r < p->pipeline; r++) {
            int busy = 0;
            for (int64_t s = r; s < n; s += p->pipeline)
                if (k->lay[s].num_layers || k->lay[s].embedding_at >= 0 || k->lay[s].loss_at >= 0)
                    busy = 1;
            if (!busy)
                mgc_check_warning(k, mgc_check_at(k, KEY(PAR_LAYOUT)),
                                  "give every pipeline rank at least one layer",
                                  "pipeline rank %" PRId64
                                  " holds no layers: its GPUs only pass activations along and have "
                                  "no parameters to train",
                                  r);
        }
    }
}

void mgc_check_derive_pipeline(mgc_check_ctx *k) {
    mgc_config *c = k->c;
    mgc_parallel_cfg *p = &c->parallel;
    char a[KV_N], b[KV_N], hint[HINT_N], list[LIST_N], ex[HINT_N];
    k->pipe_ok = 1;
    if (mgc_check_given(k, KEY(PAR_LAYOUT))) {
        check_layout(k);
    } else {
        if (!mgc_check_given(k, KEY(PAR_VP))) p->virtual_stages = 1;
        int64_t stages = mgc_check_mul(p->pipeline, p->virtual_stages);
        int bad_vp = p->virtual_stages > 1 && p->pipeline == 1; /* reported below */
        if (!bad_vp && (stages < 0 || c->model.num_layers % stages)) {
            k->pipe_ok = 0;
            mgc_check_candidates(k, pp_fits, 1, c->model.num_layers, p->pipeline, 8, list,
                                 sizeof list);
            if (p->virtual_stages > 1) {
                char vlist[LIST_N];
                mgc_check_candidates(k, vp_fits, 1, c->model.num_layers, p->virtual_stages, 8,
                                     vlist, sizeof vlist);
                snprintf(hint, sizeof hint, "choose parallel.virtual_stages from %s", vlist);
                if (list[0])
                    mgc_check_cat(hint, sizeof hint, ", or parallel.pipeline from %s", list);
            } else {
                snprintf(hint, sizeof hint,
                         "choose parallel.pipeline from %s (divisors of %" PRId64 " layers)", list,
                         c->model.num_layers);
            }
            example_layout(c->model.num_layers, stages, ex, sizeof ex);
            if (ex[0])
                mgc_check_cat(hint, sizeof hint,
                              ", or split unevenly with parallel.pipeline_layout: %s", ex);
            else
                mgc_check_cat(
                    hint, sizeof hint,
                    ", or split unevenly with parallel.pipeline_layout (one string per stage)");
            if (stages > c->model.num_layers)
                mgc_check_error(k,
                                mgc_check_at(k, mgc_check_pick(k, 3, KEY(PAR_PP), KEY(PAR_VP),
                                                               KEY(MODEL_LAYERS))),
                                hint,
                                "%s is fewer than pipeline * virtual_stages = %" PRId64
                                " * %" PRId64 " = %" PRId64
                                " stages: an even split cannot give every stage a layer",
                                mgc_check_kv(a, k, KEY(MODEL_LAYERS), c->model.num_layers),
                                p->pipeline, p->virtual_stages, stages);
            else if (p->virtual_stages > 1)
                mgc_check_error(
                    k,
                    mgc_check_at(k,
                                 mgc_check_pick(k, 3, KEY(PAR_VP), KEY(PAR_PP), KEY(MODEL_LAYERS))),
                    hint,
                    "%s is not divisible by pipeline * virtual_stages = %" PRId64 " * %" PRId64
                    " = %" PRId64 ": an even split would leave %" PRId64 " layers out",
                    mgc_check_kv(a, k, KEY(MODEL_LAYERS), c->model.num_layers), p->pipeline,
                    p->virtual_stages, stages, stages > 0 ? c->model.num_layers % stages : 0);
            else
                mgc_check_error(
                    k, mgc_check_at(k, mgc_check_pick(k, 2, KEY(PAR_PP), KEY(MODEL_LAYERS))), hint,
                    "%s is not divisible by %s: an even split would leave %" PRId64 " layers out",
                    mgc_check_kv(a, k, KEY(MODEL_LAYERS), c->model.num_layers),
                    mgc_check_kv(b, k, KEY(PAR_PP), p->pipeline),
                    c->model.num_layers % p->pipeline);
        }
    }
    /* Schedule: virtual stages mean interleaving, and interleaving needs
     * virtual stages on a real pipeline. */
    if (!mgc_check_given(k, KEY(PAR_SCHEDULE)))
        p->schedule = p->virtual_stages > 1 ? MGC_SCHED_INTERLEAVED : MGC_SCHED_1F1B;
    mgc_key vp_key = mgc_check_given(k, KEY(PAR_LAYOUT)) ? KEY(PAR_LAYOUT) : KEY(PAR_VP);
    if (p->virtual_stages > 1 && p->pipeline == 1) {
        k->pipe_ok = 0;
        if (mgc_check_given(k, KEY(PAR_LAYOUT)))
            snprintf(hint, sizeof hint,
                     "set parallel.pipeline to %" PRId64 " (one string per pipeline rank)",
                     p->virtual_stages);
        else
            snprintf(hint, sizeof hint,
                     "remove parallel.virtual_stages, or set parallel.pipeline > 1");
        if (mgc_check_given(k, KEY(PAR_LAYOUT)))
            mgc_check_error(k, mgc_check_at(k, mgc_check_pick(k, 2, vp_key, KEY(PAR_PP))), hint,
                            "parallel.pipeline_layout has %" PRId64
                            " stages, but parallel.pipeline is 1: they would all "
                            "sit on one rank",
                            p->virtual_stages);
        else
            mgc_check_error(k, mgc_check_at(k, mgc_check_pick(k, 2, vp_key, KEY(PAR_PP))), hint,
                            "%s needs a pipeline to interleave over, but parallel.pipeline is 1",
                            mgc_check_kv(a, k, KEY(PAR_VP), p->virtual_stages));
    } else if (p->virtual_stages > 1 && p->schedule != MGC_SCHED_INTERLEAVED) {
        k->pipe_ok = 0;
        mgc_check_error(k, mgc_check_at(k, KEY(PAR_SCHEDULE)),
                        "set parallel.schedule: interleaved-1f1b, or remove it (it is derived)",
                        "parallel.schedule %s runs one stage per rank, but there are %" PRId64
                        " virtual stages per rank",
                        mgc_enum_sched[p->schedule], p->virtual_stages);
    } else if (p->virtual_stages == 1 && p->schedule == MGC_SCHED_INTERLEAVED) {
        k->pipe_ok = 0;
        if (p->pipeline == 1)
            snprintf(hint, sizeof hint,
                     "use parallel.schedule: 1f1b, or set parallel.pipeline and "
                     "parallel.virtual_stages > 1");
        else
            snprintf(hint, sizeof hint,
                     "set parallel.virtual_stages to 2 or more, or use parallel.schedule: 1f1b");
        mgc_check_error(
            k, mgc_check_at(k, KEY(PAR_SCHEDULE)), hint,
            "parallel.schedule interleaved-1f1b needs more than one virtual stage per rank, but "
            "parallel.virtual_stages is 1");
    }
    if (!mgc_check_given(k, KEY(PAR_MB_GROUP)))
        p->microbatch_group_size = p->pipeline;
    else if (p->schedule != MGC_SCHED_INTERLEAVED)
        mgc_check_warning(
            k, mgc_check_at(k, KEY(PAR_MB_GROUP)), "remove it",
            "parallel.microbatch_group_size has no effect: it applies to the interleaved "
            "schedule only");
}

/* ---- batch and schedule ------------------------------------------------- */

/* " (data derived from world_size)" when the user set world_size, not data:
 * batch messages quote data, which they may never have written. */
static const char *data_note(const mgc_check_ctx *k) {
    return !mgc_check_given(k, KEY(PAR_DP)) && mgc_check_given(k, KEY(PAR_WORLD))
               ? " (data derived from world_size)"
               : "";
}

void mgc_check_derive_batch(mgc_check_ctx *k) {
    mgc_config *c = k->c;
    mgc_training_cfg *t = &c->training;
    int64_t dp = c->parallel.data;
    char a[KV_N], hint[HINT_N], list[LIST_N];
    int gg = mgc_check_given(k, KEY(TRAIN_GBS)), ga = mgc_check_given(k, KEY(TRAIN_ACCUM)),
        gm = mgc_check_given(k, KEY(TRAIN_MBS));
    k->batch_ok = 0;
    if (!k->grid_ok) return; /* data is unknown: nothing sensible to say */
    if (gg && ga && !gm) {
        int64_t denom = mgc_check_mul(dp, t->grad_accum);
        if (denom < 0 || t->global_batch_size % denom) {
            mgc_check_multiples(denom, t->global_batch_size, list, sizeof list);
            snprintf(hint, sizeof hint, "set training.global_batch_size to %s", list);
            mgc_check_error(k, mgc_check_at(k, KEY(TRAIN_GBS)), hint,
                            "%s is not divisible by data * gradient_accumulation_steps = %" PRId64
                            " * %" PRId64 ", so micro_batch_size cannot be derived",
                            mgc_check_kv(a, k, KEY(TRAIN_GBS), t->global_batch_size), dp,
                            t->grad_accum);
            return;
        }
        t->micro_batch_size = t->global_batch_size / denom;
        if (t->micro_batch_size > (int64_t)mgc_keys[KEY(TRAIN_MBS)].hi) {
            mgc_check_error(
                k, mgc_check_at(k, KEY(TRAIN_GBS)), "give training.micro_batch_size as well",
                "the derived micro_batch_size %" PRId64 " is too large", t->micro_batch_size);
            return;
        }
    } else {
        int64_t unit = mgc_check_mul(t->micro_batch_size, dp);
        if (unit < 0) {
            mgc_check_error(k, mgc_check_at(k, KEY(TRAIN_MBS)), "lower training.micro_batch_size",
                            "micro_batch_size * data overflows");
            return;
        }
        if (gg && ga) {
            int64_t prod = mgc_check_mul(unit, t->grad_accum);
            if (prod != t->global_batch_size) {
                if (t->global_batch_size % unit == 0)
                    snprintf(hint, sizeof hint,
                             "give only two of the three (the third is derived); with these two "
                             "batch sizes "
                             "gradient_accumulation_steps would be %" PRId64,
                             t->global_batch_size / unit);
                else
                    snprintf(hint, sizeof hint,
                             "give only two of the three (the third is derived)");
                mgc_check_error(
                    k, mgc_check_at(k, KEY(TRAIN_GBS)), hint,
                    "%s does not equal micro_batch_size * data * gradient_accumulation_steps = "
                    "%" PRId64 " * %" PRId64 " * %" PRId64 " = %" PRId64,
                    mgc_check_kv(a, k, KEY(TRAIN_GBS), t->global_batch_size), t->micro_batch_size,
                    dp, t->grad_accum, prod);
                return;
            }
        } else if (gg) {
            if (t->global_batch_size < unit) {
                snprintf(hint, sizeof hint,
                         "set training.global_batch_size to a multiple of %" PRId64 "%s", unit,
                         t->micro_batch_size > 1 ? ", or lower training.micro_batch_size"
                                                 : ", or use fewer data-parallel ranks");
                mgc_check_error(k, mgc_check_at(k, KEY(TRAIN_GBS)), hint,
                                "%s is smaller than micro_batch_size * data = %" PRId64
                                " * %" PRId64 " = %" PRId64
                                "%s: every data-parallel rank needs at least one microbatch",
                                mgc_check_kv(a, k, KEY(TRAIN_GBS), t->global_batch_size),
                                t->micro_batch_size, dp, unit, data_note(k));
                return;
            }
            if (t->global_batch_size % unit) {
                mgc_check_multiples(unit, t->global_batch_size, list, sizeof list);
                snprintf(hint, sizeof hint, "set training.global_batch_size to %s", list);
                mgc_check_error(k, mgc_check_at(k, KEY(TRAIN_GBS)), hint,
                                "%s is not divisible by micro_batch_size * data = %" PRId64
                                " * %" PRId64 " = %" PRId64 "%s",
                                mgc_check_kv(a, k, KEY(TRAIN_GBS), t->global_batch_size),
                                t->micro_batch_size, dp, unit, data_note(k));
                return;
            }
            t->grad_accum = t->global_batch_size / unit;
            if (t->grad_accum > (int64_t)mgc_keys[KEY(TRAIN_ACCUM)].hi) {
                mgc_check_error(
                    k, mgc_check_at(k, KEY(TRAIN_GBS)), "raise training.micro_batch_size",
                    "%" PRId64 " microbatches per step is more than mgc supports", t->grad_accum);
                return;
            }
        } else {
            if (!ga) t->grad_accum = 1;
            int64_t gbs = mgc_check_mul(unit, t->grad_accum);
            if (gbs < 0 || gbs > (int64_t)mgc_keys[KEY(TRAIN_GBS)].hi) {
                mgc_check_error(
                    k, mgc_check_at(k, mgc_check_pick(k, 2, KEY(TRAIN_ACCUM), KEY(TRAIN_MBS))),
                    "lower the batch sizes",
                    "micro_batch_size * data * gradient_accumulation_steps is too large");
                return;
            }
            t->global_batch_size = gbs;
        }
    }
    k->batch_ok = 1;
}

/* Megatron's interleaving rule: microbatches go out in groups of G per model
 * chunk; a trailing group smaller than the pipeline stalls on dependencies. */
static int interleave_ok(int64_t m, int64_t g, int64_t pp) {
    return m >= g && (m % g == 0 || m % g >= pp);
}

void mgc_check_schedule(mgc_check_ctx *k) {
    mgc_config *c = k->c;
    const mgc_parallel_cfg *p = &c->parallel;
    const mgc_training_cfg *t = &c->training;
    char a[KV_N], b[KV_N], hint[HINT_N];
    if (!k->batch_ok || !k->pipe_ok || p->pipeline == 1) return;
    int64_t m = t->grad_accum, pp = p->pipeline, g = p->microbatch_group_size;
    int64_t unit = mgc_check_mul(t->micro_batch_size, p->data);
    mgc_key bkey = mgc_check_pick(k, 2, KEY(TRAIN_GBS), KEY(TRAIN_ACCUM));
    if (p->schedule == MGC_SCHED_INTERLEAVED) {
        if (g < pp) {
            snprintf(hint, sizeof hint,
                     "set parallel.microbatch_group_size to at least %" PRId64
                     ", or remove it (it defaults to pipeline)",
                     pp);
            mgc_check_error(
                k, mgc_check_at(k, KEY(PAR_MB_GROUP)), hint,
                "%s is smaller than %s: the interleaved schedule would wait on microbatches it "
                "has not started",
                mgc_check_kv(a, k, KEY(PAR_MB_GROUP), g), mgc_check_kv(b, k, KEY(PAR_PP), pp));
            return;
        }
        if (interleave_ok(m, g, pp)) return;
        /* nearest valid microbatch counts below and above */
        int64_t lo = 0, hi = 0;
        for (int64_t x = m - 1; x >= g && x > m - 2 * g - 1; x--)
            if (interleave_ok(x, g, pp)) {
                lo = x;
                break;
            }
        for (int64_t x = m + 1; x <= m + 2 * g + 1; x++)
            if (interleave_ok(x, g, pp)) {
                hi = x;
                break;
            }
        if (!mgc_check_given(k, KEY(TRAIN_GBS)) && mgc_check_given(k, KEY(TRAIN_ACCUM))) {
            if (lo)
                snprintf(hint, sizeof hint,
                         "set training.gradient_accumulation_steps to %" PRId64 " or %" PRId64, lo,
                         hi);
            else
                snprintf(hint, sizeof hint, "set training.gradient_accumulation_steps to %" PRId64,
                         hi);
        } else if (unit > 0 && mgc_check_mul(hi, unit) > 0) {
            if (lo)
                snprintf(hint, sizeof hint,
                         "set training.global_batch_size to %" PRId64 " or %" PRId64, lo * unit,
                         hi * unit);
            else
                snprintf(hint, sizeof hint, "set training.global_batch_size to %" PRId64,
                         hi * unit);
        } else {
            hint[0] = 0;
        }
        if (mgc_check_given(k, KEY(PAR_MB_GROUP)))
            mgc_check_cat(hint, sizeof hint, "%schange parallel.microbatch_group_size",
                          hint[0] ? ", or " : "");
        if (m < g)
            mgc_check_error(
                k, mgc_check_at(k, mgc_check_pick(k, 3, bkey, KEY(PAR_MB_GROUP), KEY(PAR_PP))),
                hint,
                "the interleaved schedule needs at least %s microbatches per step; %s gives fewer",
                mgc_check_kv(a, k, KEY(PAR_MB_GROUP), g), mgc_check_kv(b, k, KEY(TRAIN_ACCUM), m));
        else
            mgc_check_error(
                k, mgc_check_at(k, mgc_check_pick(k, 3, bkey, KEY(PAR_MB_GROUP), KEY(PAR_PP))),
                hint,
                "%" PRId64 " microbatches per step in groups of %s leave a last group of %" PRId64
                ", fewer than %s: the interleaved schedule would stall on dependency bubbles",
                m, mgc_check_kv(a, k, KEY(PAR_MB_GROUP), g), m % g,
                mgc_check_kv(b, k, KEY(PAR_PP), pp));
        return;
    }
    if (m < pp) {
        int pct = (int)((100 * (pp - 1)) / (m + pp - 1));
        int pct4 = (int)((100 * (pp - 1)) / (4 * pp + pp - 1));
        if (!mgc_check_given(k, KEY(TRAIN_GBS)) && mgc_check_given(k, KEY(TRAIN_ACCUM)))
            snprintf(hint, sizeof hint,
                     "raise training.gradient_accumulation_steps to at least %" PRId64 "; %" PRId64
                     " brings the idle time down to %d%%",
                     pp, 4 * pp, pct4);
        else if (unit > 0 && mgc_check_mul3(unit, pp, 4) > 0)
            snprintf(hint, sizeof hint,
                     "raise training.global_batch_size to at least %" PRId64 "; %" PRId64
                     " brings the idle time down to %d%%",
                     unit * pp, unit * pp * 4, pct4);
        else
            hint[0] = 0;
        mgc_check_warning(
            k, mgc_check_at(k, mgc_check_pick(k, 3, bkey, KEY(PAR_PP), KEY(TRAIN_MBS))), hint,
            "only %" PRId64 " microbatch%s per step for %" PRId64
            " pipeline stages: each rank idles about %d%% of every step",
            m, m == 1 ? "" : "es", pp, pct);
    }
}

/* ---- stages ------------------------------------------------------------- */

void mgc_check_fill_stages(mgc_check_ctx *k) {
    mgc_config *c = k->c;
    mgc_derived *dv = &c->derived;
    const mgc_parallel_cfg *p = &c->parallel;
    int64_t L = c->model.num_layers;
    if (!k->pipe_ok) return;
    int64_t S = mgc_check_mul(p->pipeline, p->virtual_stages);
    if (S <= 0 || S > 65536 * 64) {
        mgc_check_error(k, mgc_check_at(k, mgc_check_pick(k, 2, KEY(PAR_PP), KEY(PAR_VP))),
                        "lower parallel.pipeline or parallel.virtual_stages",
                        "pipeline * virtual_stages = %" PRId64 " stages is too many", S);
        return;
    }
    dv->stages = calloc((size_t)S, sizeof *dv->stages);
    if (!dv->stages) {
        mgc_check_error(k, c->file_loc, NULL, "out of memory");
        return;
    }
    dv->num_stages = S;
    int64_t first = 0;
    for (int64_t s = 0; s < S; s++) {
        mgc_stage *st = &dv->stages[s];
        int64_t n = k->lay ? k->lay[s].num_layers : L / S;
        st->first_layer = (int32_t)first;
        st->num_layers = (int32_t)n;
        st->embedding = (uint8_t)(k->lay ? k->lay[s].embedding_at >= 0 : s == 0);
        st->loss = (uint8_t)(k->lay ? k->lay[s].loss_at >= 0 : s == S - 1);
        first += n;
    }
}
