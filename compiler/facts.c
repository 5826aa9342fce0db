/* facts.c - see facts.h; formulas and field names are in docs/facts.md. */
#include "facts.h"

#include <inttypes.h>
#include <math.h>
#include <string.h>

/* ---- computing ------------------------------------------------------------ */

double mgc_facts_narayanan2021(const mgc_ir_dims *dm, int swiglu, double B) {
    double h = (double)dm->h, s = (double)dm->s, L = (double)dm->L, L_moe = (double)dm->L_moe;
    double phi = swiglu ? 1.5 : 1.0;
    double attn = L * (1.0 + (double)dm->g / (double)dm->a + s / h) * ((double)dm->q / h);
    double mlp = (L - L_moe) * ((double)dm->f / h) * phi +
                 L_moe * ((double)dm->f_e / h) * (double)dm->k * phi;
    double shared = L_moe * ((double)dm->f_s / h) * phi;
    double logit = (double)dm->V_pad / (2.0 * h);
    return 12.0 * B * s * h * h * (attn + mlp + shared + logit);
}

static void overflow(mgc_diags *d, const mgc_config *c, const char *what) {
    mgc_diag(d, MGC_SEV_ERROR, c->file_loc, "reduce the model or the batch", "%s overflows 64 bits",
             what);
}

int mgc_facts_compute(const mgc_config *c, const mgc_graph *g, mgc_facts *f, mgc_diags *d) {
    memset(f, 0, sizeof *f);
    if (!c || !g) {
        if (c)
            mgc_diag(d, MGC_SEV_ERROR, c->file_loc, NULL,
                     "internal: model facts need a model graph");
        return -1;
    }
    const mgc_ir_dims *dm = &g->dims;
    mgc_param_counts *p = &f->params;
    f->vocab_size = dm->V;
    f->padded_vocab_size = dm->V_pad;
    f->num_layers = dm->L;
    f->num_moe_layers = dm->L_moe;
    f->tokens_per_microbatch = (uint64_t)dm->T;
    f->gpt_style = dm->E == 0 && dm->g == dm->a && dm->q == dm->h && dm->f == 4 * dm->h &&
                   c->model.activation == MGC_ACT_GELU;

    /* the first dense and the first MoE layer stand for their kind */
    int64_t dense_l = -1, moe_l = -1;
    for (int64_t l = 0; l < dm->L; l++) {
        int is_moe = dm->E > 0 && c->derived.is_moe_layer && c->derived.is_moe_layer[l];
        if (is_moe && moe_l < 0) moe_l = l;
        if (!is_moe && dense_l < 0) dense_l = l;
    }

    /* parameters: one pass over the param tensors (a tied weight is one tensor) */
    int ovf = 0;
    for (int32_t i = 0; i < g->n_tensors; i++) {
        const mgc_ir_tensor *t = &g->tensors[i];
        if (t->role != MGC_IR_ROLE_PARAM) continue;
        uint64_t n = t->numel_unpadded, act = n;
        if (t->pclass == MGC_IR_PCLASS_EXPERT && dm->E > 0) {
            /* routed experts: [E, ...]; a token uses k of them */
            ovf |= mgc_ir_mul_u64(n / (uint64_t)dm->E, (uint64_t)dm->k, &act);
        }
        p->tensors++;
        ovf |= mgc_ir_add_u64(p->total, n, &p->total);
        ovf |= mgc_ir_add_u64(p->total_padded, t->numel, &p->total_padded);
        ovf |= mgc_ir_add_u64(p->active, act, &p->active);
        if ((unsigned)t->pclass < MGC_IR_PCLASS__COUNT)
            ovf |= mgc_ir_add_u64(p->by_class[t->pclass], n, &p->by_class[t->pclass]);
        if (t->pclass == MGC_IR_PCLASS_WORD_EMBEDDING || t->pclass == MGC_IR_PCLASS_POS_EMBEDDING ||
            t->pclass == MGC_IR_PCLASS_OUTPUT_LAYER)
            ovf |= mgc_ir_add_u64(p->embedding, n, &p->embedding);
        if (t->layer >= 0 && t->layer == dense_l)
            ovf |= mgc_ir_add_u64(p->dense_layer, n, &p->dense_layer);
        if (t->layer >= 0 && t->layer == moe_l) {
            ovf |= mgc_ir_add_u64(p->moe_layer, n, &p->moe_layer);
            ovf |= mgc_ir_add_u64(p->moe_layer_active, act, &p->moe_layer_active);
        }
    }
    if (ovf) {
        overflow(d, c, "the parameter count");
        return -1;
    }
    p->non_embedding = p->total - p->embedding;
    p->active_non_embedding = p->active - p->embedding;

    /* FLOPs: GEMMs of one microbatch's forward, from the ops */
    mgc_flop_counts *fl = &f->flops;
    int recompute = c->training.recompute;
    for (int32_t i = 0; i < g->n_ops; i++) {
        const mgc_ir_op *op = &g->ops[i];
        ovf |= mgc_ir_add_u64(fl->forward_per_microbatch, op->flops, &fl->forward_per_microbatch);
        ovf |= mgc_ir_add_u64(fl->model_forward_per_microbatch, op->model_flops,
                              &fl->model_forward_per_microbatch);
        if (op->kind == MGC_IR_OP_LINEAR && op->part == MGC_IR_PART_MOE && op->n_in >= 2 &&
            g->tensors[op->in[1]].pclass == MGC_IR_PCLASS_ROUTER)
            ovf |= mgc_ir_add_u64(fl->router_forward_per_microbatch, op->model_flops,
                                  &fl->router_forward_per_microbatch);
        /* full: every decoder layer re-runs its forward; selective: the
         * attention core only.  The output layer and loss are not recomputed. */
        int again = (recompute == MGC_RECOMPUTE_FULL && mgc_config_recompute_group(c, op->layer) >= 0) ||
                    (recompute == MGC_RECOMPUTE_SELECTIVE && op->kind == MGC_IR_OP_ATTENTION);
        if (again)
            ovf |= mgc_ir_add_u64(fl->recompute_forward_per_microbatch, op->flops,
                                  &fl->recompute_forward_per_microbatch);
    }
    for (int64_t l = 0; l < c->model.num_layers; l++)
        fl->recomputed_layers += mgc_config_recompute_group(c, l) >= 0;
    uint64_t B = (uint64_t)c->training.global_batch_size;
    ovf |= mgc_ir_mul_u64(B, (uint64_t)dm->s, &f->tokens_per_iteration);
    if (ovf) {
        overflow(d, c, "a FLOP or token count");
        return -1;
    }
    fl->microbatches = (double)B / (double)dm->b;
    fl->model_per_iteration = 3.0 * (double)fl->model_forward_per_microbatch * fl->microbatches;
    fl->hardware_per_iteration =
        (3.0 * (double)fl->forward_per_microbatch + (double)fl->recompute_forward_per_microbatch) *
        fl->microbatches;
    fl->router_per_iteration = 3.0 * (double)fl->router_forward_per_microbatch * fl->microbatches;
    fl->narayanan2021_per_iteration =
        mgc_facts_narayanan2021(dm, c->model.activation == MGC_ACT_SWIGLU, (double)B);
    fl->narayanan2021_full_recompute_per_iteration = fl->narayanan2021_per_iteration * 4.0 / 3.0;
    double tok = (double)f->tokens_per_iteration;
    fl->model_per_token = fl->model_per_iteration / tok;
    fl->hardware_per_token = fl->hardware_per_iteration / tok;
    return 0;
}

/* ---- text ------------------------------------------------------------------ */

/* 124439808 -> "124,439,808" */
static const char *grouped(char *buf, size_t n, uint64_t v) {
    char tmp[32];
    int len = snprintf(tmp, sizeof tmp, "%" PRIu64, v), o = 0;
    for (int i = 0; i < len && (size_t)o + 2 < n; i++) {
        if (i > 0 && (len - i) % 3 == 0) buf[o++] = ',';
        buf[o++] = tmp[i];
    }
    buf[o] = 0;
    return buf;
}

/* 124439808 -> "124.4M"; 6.7e9 -> "6.738B" (counts) */
static const char *human_count(char *buf, size_t n, double v) {
    static const char *const suf[] = {"", "K", "M", "B", "T", "Q"};
    int i = 0;
    while (v >= 999.95 && i < 5)
        v /= 1000.0, i++;
    snprintf(buf, n, "%.4g%s", v, suf[i]);
    return buf;
}

/* 4.7e17 -> "470.9 PFLOP" */
static const char *human_flops(char *buf, size_t n, double v) {
    static const char *const pre[] = {"", "k", "M", "G", "T", "P", "E", "Z", "Y"};
    int i = 0;
    while (v >= 999.95 && i < 8)
        v /= 1000.0, i++;
    snprintf(buf, n, "%.4g %sFLOP", v, pre[i]);
    return buf;
}

static void param_line(FILE *out, const char *label, uint64_t v, const char *note) {
    char a[32], b[32];
    if (note[0])
        fprintf(out, "  %-16s %17s  %-8s %s\n", label, grouped(a, sizeof a, v),
                human_count(b, sizeof b, (double)v), note);
    else
        fprintf(out, "  %-16s %17s  %s\n", label, grouped(a, sizeof a, v),
                human_count(b, sizeof b, (double)v));
}

static void flop_line(FILE *out, const char *label, double v, double tokens) {
    char a[32], b[32];
    fprintf(out, "  %s\n      %.6e  (%s; %s per token)\n", label, v, human_flops(a, sizeof a, v),
            human_flops(b, sizeof b, v / tokens));
}

/* The parallel layout: degrees, schedule and the layers of each stage. */
static void print_layout(const mgc_config *c, FILE *out) {
    const mgc_parallel_cfg *p = &c->parallel;
    const mgc_derived *dv = &c->derived;
    fprintf(out, "parallel: world %" PRId64 " = tensor %" PRId64 " x context %" PRId64
                 " x pipeline %" PRId64 " x data %" PRId64 "\n",
            p->world_size, p->tensor, p->context, p->pipeline, p->data);
    fprintf(out, "  sequence parallel %s, distributed optimizer %s",
            dv->sequence_parallel ? "on" : "off", p->distributed_optimizer ? "on" : "off");
    if (c->moe.num_experts > 0)
        fprintf(out, ", experts: expert %" PRId64 " x expert-tensor %" PRId64
                     " x expert-data %" PRId64,
                p->expert, p->expert_tensor, dv->expert_data);
    fputc('\n', out);
    fprintf(out, "  pipeline: %s schedule, %" PRId64 " stage%s", mgc_enum_sched[p->schedule],
            dv->num_stages, dv->num_stages == 1 ? "" : "s");
    if (p->virtual_stages > 1)
        fprintf(out, " (%" PRId64 " ranks x %" PRId64 " virtual)", p->pipeline, p->virtual_stages);
    fputs(", layers per stage:", out);
    for (int64_t i = 0; i < dv->num_stages && dv->stages; i++) {
        const mgc_stage *st = &dv->stages[i];
        if (i == 16 && dv->num_stages > 20) {
            fprintf(out, " ... (%" PRId64 " more)", dv->num_stages - 16);
            break;
        }
        fprintf(out, " %s%d%s", st->embedding ? "E+" : "", st->num_layers, st->loss ? "+L" : "");
    }
    fputc('\n', out);
}

void mgc_facts_print_text(const mgc_config *c, const mgc_facts *f, FILE *out) {
    const mgc_model_cfg *m = &c->model;
    const mgc_param_counts *p = &f->params;
    const mgc_flop_counts *fl = &f->flops;
    char a[32], b[32];
    int swiglu = m->activation == MGC_ACT_SWIGLU;

    fprintf(out, "model: %s\n", m->name && m->name[0] ? m->name : "(unnamed)");
    const char *attn = m->num_query_groups == m->num_heads ? "MHA"
                       : m->num_query_groups == 1          ? "MQA"
                                                           : "GQA";
    fprintf(out,
            "  %" PRId64 " layers, hidden %" PRId64 ", %" PRId64 " heads x %" PRId64
            " (%s, %" PRId64 " kv groups), ffn %" PRId64 " %s\n",
            m->num_layers, m->hidden_size, m->num_heads, m->head_dim, attn, m->num_query_groups,
            m->ffn_hidden_size, swiglu ? "swiglu" : "gelu");
    if (m->window_size > 0 && m->window_size < m->seq_length)
        fprintf(out, "  sliding-window attention: each query sees its %" PRId64 " latest positions\n",
                m->window_size);
    fprintf(out, "  %s%s, %s positions, %s embeddings, %s\n",
            m->normalization == MGC_NORM_RMSNORM ? "rmsnorm" : "layernorm",
            m->qk_layernorm ? " (also on each head's queries and keys)" : "",
            m->position_embedding == MGC_POS_LEARNED  ? "learned"
            : m->position_embedding == MGC_POS_ROTARY ? "rotary"
                                                      : "no",
            m->tie_embeddings ? "tied" : "untied",
            m->add_bias_linear ? "linear biases"
            : m->add_qkv_bias  ? "qkv bias only"
                               : "no linear biases");
    if (c->moe.num_experts > 0) {
        fprintf(out,
                "  MoE: %" PRId64 " of %" PRId64 " layers, %" PRId64 " experts top-%" PRId64
                " (expert ffn %" PRId64 ")",
                f->num_moe_layers, f->num_layers, c->moe.num_experts, c->moe.top_k,
                c->moe.ffn_hidden_size);
        if (c->moe.shared_experts > 0)
            fprintf(out, ", %" PRId64 " shared x %" PRId64, c->moe.shared_experts,
                    c->moe.shared_ffn_hidden_size);
        if (c->moe.capacity_factor > 0)
            fprintf(out, ", capacity factor %g\n", c->moe.capacity_factor);
        else
            fputs(", dropless\n", out);
        /* how it routes and balances */
        const mgc_moe_cfg *e = &c->moe;
        fprintf(out, "  router: %s",
                e->router_score == MGC_SCORE_SIGMOID      ? "sigmoid scores"
                : e->router_score == MGC_SCORE_PRESOFTMAX ? "softmax over every expert"
                                                          : "softmax over the chosen");
        if (e->router_topk_scaling_factor != 1.0)
            fprintf(out, ", weights x %g", e->router_topk_scaling_factor);
        if (e->router_num_groups > 0)
            fprintf(out, ", %" PRId64 " of %" PRId64 " expert groups a token", e->router_group_topk,
                    e->router_num_groups);
        if (e->expert_bias_update_rate > 0)
            fprintf(out, ", expert bias (rate %g)", e->expert_bias_update_rate);
        if (e->aux_loss_coeff > 0)
            fprintf(out, ", aux loss %g per %s", e->aux_loss_coeff,
                    e->aux_loss_scope == MGC_AUX_SEQUENCE ? "sequence" : "microbatch");
        if (e->z_loss_coeff > 0) fprintf(out, ", z-loss %g", e->z_loss_coeff);
        fputc('\n', out);
    }
    fprintf(out, "  vocabulary %" PRId64 ", padded to %" PRId64 "\n", f->vocab_size,
            f->padded_vocab_size);
    fprintf(out,
            "  batch: %" PRId64 " sequences x %" PRId64 " tokens = %s tokens/iteration\n"
            "         (%" PRId64 " data-parallel rank%s x %" PRId64 " microbatch%s of %" PRId64 ")\n",
            c->training.global_batch_size, m->seq_length,
            grouped(a, sizeof a, f->tokens_per_iteration), c->parallel.data,
            c->parallel.data == 1 ? "" : "s", c->derived.num_microbatches,
            c->derived.num_microbatches == 1 ? "" : "es", c->training.micro_batch_size);
    print_layout(c, out);

    fputs("parameters:\n", out);
    param_line(out, "total", p->total, "every weight and bias, vocabulary unpadded");
    param_line(out, "as allocated", p->total_padded, "padded vocabulary");
    param_line(out, "embedding", p->embedding, "word + position + untied output layer");
    param_line(out, "non-embedding", p->non_embedding, "");
    param_line(out, "active", p->active,
               c->moe.num_experts > 0 ? "used per token (top_k of the routed experts)"
                                      : "used per token");
    fputs("  by kind:", out);
    int first = 1;
    for (int k = 1; k < MGC_IR_PCLASS__COUNT; k++) {
        if (!p->by_class[k]) continue;
        fprintf(out, "%s %s %s", first ? "" : ",", mgc_ir_pclass_name((mgc_ir_pclass)k),
                grouped(a, sizeof a, p->by_class[k]));
        first = 0;
    }
    fputc('\n', out);
    if (p->dense_layer)
        fprintf(out, "  per dense layer: %s\n", grouped(a, sizeof a, p->dense_layer));
    if (p->moe_layer)
        fprintf(out, "  per MoE layer: %s (active %s)\n", grouped(a, sizeof a, p->moe_layer),
                grouped(b, sizeof b, p->moe_layer_active));

    double tok = (double)f->tokens_per_iteration;
    fputs("FLOPs per iteration:\n", out);
    flop_line(out, "model (Megatron-LM convention: 3 x forward GEMMs, causal attention halved)",
              fl->model_per_iteration, tok);
    if (fl->router_per_iteration > 0)
        fprintf(out, "      includes %.6e of router GEMMs that Megatron-LM's formula omits\n",
                fl->router_per_iteration);
    char label[160], some[96];
    snprintf(some, sizeof some, "model + full recompute of %" PRId64 " of %" PRId64 " layers",
             fl->recomputed_layers, c->model.num_layers);
    snprintf(label, sizeof label, "hardware (%s%s)",
             c->training.recompute == MGC_RECOMPUTE_FULL
                 ? (fl->recomputed_layers == c->model.num_layers ? "model + full recompute of every layer" : some)
             : c->training.recompute == MGC_RECOMPUTE_SELECTIVE
                 ? "model + selective recompute of attention cores"
                 : "no recompute",
             fl->forward_per_microbatch != fl->model_forward_per_microbatch
                 ? "; experts padded to capacity"
                 : "");
    flop_line(out, label, fl->hardware_per_iteration, tok);
    flop_line(out,
              f->gpt_style ? "Narayanan et al. 2021 eq. 3: 72 B s L h^2 (1 + s/6h + V/12hL), "
                             "attention not halved"
                           : "Narayanan et al. 2021 eq. 3, generalised as pre-2025 Megatron-LM, "
                             "attention not halved",
              fl->narayanan2021_per_iteration, tok);
    flop_line(out, "  the same with full recompute (96 instead of 72)",
              fl->narayanan2021_full_recompute_per_iteration, tok);
}

/* ---- JSON ------------------------------------------------------------------ */

/* "parallel": the resolved degrees and the stages (docs/facts.md). */
static void layout_json(const mgc_config *c, mgc_json *j) {
    const mgc_parallel_cfg *p = &c->parallel;
    const mgc_derived *dv = &c->derived;
    mgc_json_obj_begin(j, "parallel");
    mgc_json_int(j, "world_size", p->world_size);
    mgc_json_int(j, "tensor", p->tensor);
    mgc_json_int(j, "context", p->context);
    mgc_json_int(j, "pipeline", p->pipeline);
    mgc_json_int(j, "virtual_stages", p->virtual_stages);
    mgc_json_int(j, "data", p->data);
    mgc_json_int(j, "expert", p->expert);
    mgc_json_int(j, "expert_tensor", p->expert_tensor);
    mgc_json_int(j, "expert_data", dv->expert_data);
    mgc_json_bool(j, "sequence_parallel", dv->sequence_parallel);
    mgc_json_bool(j, "distributed_optimizer", p->distributed_optimizer);
    mgc_json_str(j, "schedule", mgc_enum_sched[p->schedule]);
    mgc_json_int(j, "microbatches", dv->num_microbatches);
    mgc_json_arr_begin(j, "stages");
    for (int64_t i = 0; i < dv->num_stages && dv->stages; i++) {
        const mgc_stage *st = &dv->stages[i];
        mgc_json_obj_begin(j, NULL);
        mgc_json_int(j, "rank", i % p->pipeline);
        mgc_json_int(j, "chunk", i / p->pipeline);
        mgc_json_int(j, "first_layer", st->first_layer);
        mgc_json_int(j, "num_layers", st->num_layers);
        mgc_json_bool(j, "embedding", st->embedding);
        mgc_json_bool(j, "loss", st->loss);
        mgc_json_obj_end(j);
    }
    mgc_json_arr_end(j);
    mgc_json_obj_end(j);
}

void mgc_facts_print_json(const mgc_config *c, const mgc_facts *f, mgc_json *j) {
    const mgc_param_counts *p = &f->params;
    const mgc_flop_counts *fl = &f->flops;
    mgc_json_int(j, "vocab_size", f->vocab_size);
    mgc_json_int(j, "padded_vocab_size", f->padded_vocab_size);
    mgc_json_int(j, "num_layers", f->num_layers);
    mgc_json_int(j, "num_moe_layers", f->num_moe_layers);
    mgc_json_u64(j, "tokens_per_microbatch", f->tokens_per_microbatch);
    mgc_json_u64(j, "tokens_per_iteration", f->tokens_per_iteration);
    mgc_json_num(j, "microbatches_per_iteration", fl->microbatches);
    layout_json(c, j);

    mgc_json_obj_begin(j, "params");
    mgc_json_u64(j, "total", p->total);
    mgc_json_u64(j, "total_padded", p->total_padded);
    mgc_json_u64(j, "embedding", p->embedding);
    mgc_json_u64(j, "non_embedding", p->non_embedding);
    mgc_json_u64(j, "active", p->active);
    mgc_json_u64(j, "active_non_embedding", p->active_non_embedding);
    mgc_json_u64(j, "dense_layer", p->dense_layer);
    mgc_json_u64(j, "moe_layer", p->moe_layer);
    mgc_json_u64(j, "moe_layer_active", p->moe_layer_active);
    mgc_json_int(j, "tensors", p->tensors);
    mgc_json_obj_begin(j, "by_kind");
    for (int k = 1; k < MGC_IR_PCLASS__COUNT; k++)
        mgc_json_u64(j, mgc_ir_pclass_name((mgc_ir_pclass)k), p->by_class[k]);
    mgc_json_obj_end(j);
    mgc_json_obj_end(j);

    mgc_json_obj_begin(j, "flops");
    mgc_json_str(j, "recompute",
                 c->training.recompute == MGC_RECOMPUTE_FULL        ? "full"
                 : c->training.recompute == MGC_RECOMPUTE_SELECTIVE ? "selective"
                                                                    : "none");
    mgc_json_int(j, "recomputed_layers", fl->recomputed_layers);
    mgc_json_num(j, "model_per_iteration", fl->model_per_iteration);
    mgc_json_num(j, "model_per_token", fl->model_per_token);
    mgc_json_num(j, "hardware_per_iteration", fl->hardware_per_iteration);
    mgc_json_num(j, "hardware_per_token", fl->hardware_per_token);
    mgc_json_num(j, "router_per_iteration", fl->router_per_iteration);
    mgc_json_num(j, "narayanan2021_per_iteration", fl->narayanan2021_per_iteration);
    mgc_json_num(j, "narayanan2021_full_recompute_per_iteration",
                 fl->narayanan2021_full_recompute_per_iteration);
    mgc_json_bool(j, "gpt_style", f->gpt_style);
    mgc_json_u64(j, "forward_per_microbatch", fl->forward_per_microbatch);
    mgc_json_u64(j, "model_forward_per_microbatch", fl->model_forward_per_microbatch);
    mgc_json_u64(j, "router_forward_per_microbatch", fl->router_forward_per_microbatch);
    mgc_json_u64(j, "recompute_forward_per_microbatch", fl->recompute_forward_per_microbatch);
    mgc_json_obj_end(j);
}
