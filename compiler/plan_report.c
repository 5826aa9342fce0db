/* plan_report.c - see plan_report.h. */
#include "plan_report.h"

#include <inttypes.h>
#include <string.h>

static const char *const sched_names[] = {"gpipe", "1f1b", "interleaved-1f1b"};
static const char *const recompute_names[] = {"none", "selective", "full"};

/* "12.34 GiB" style, binary units. */
static const char *bytes_h(char *buf, size_t n, uint64_t b) {
    static const char *const u[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
    double v = (double)b;
    int i = 0;
    while (v >= 1024.0 && i < 5) v /= 1024.0, i++;
    if (i == 0) snprintf(buf, n, "%" PRIu64 " B", b);
    else snprintf(buf, n, "%.2f %s", v, u[i]);
    return buf;
}

static void stage_layers(const mgc_stage_program *sp, char *buf, size_t n) {
    buf[0] = 0;
    for (int64_t c = 0; c < sp->n_chunks; c++) {
        const mgc_plan_chunk *ch = &sp->chunks[c];
        size_t l = strlen(buf);
        snprintf(buf + l, n - l, "%s%s%d%s", c ? "|" : "", ch->embedding ? "E+" : "", ch->num_layers,
                 ch->loss ? "+L" : "");
    }
}

static int64_t count_instr(const mgc_stage_program *sp, mgc_instr_op op) {
    int64_t n = 0;
    for (int64_t i = 0; i < sp->n_instrs; i++) n += sp->instrs[i].op == op;
    return n;
}

static int64_t count_ops(const mgc_stage_program *sp, int collectives) {
    int64_t n = 0;
    for (int64_t c = 0; c < sp->n_chunks; c++) {
        const mgc_plan_chunk *ch = &sp->chunks[c];
        for (int64_t i = 0; i < ch->n_fwd; i++) n += (ch->fwd[i].kind >= MGC_POP_ALL_REDUCE) == collectives;
        for (int64_t i = 0; i < ch->n_bwd; i++) n += (ch->bwd[i].kind >= MGC_POP_ALL_REDUCE) == collectives;
    }
    return n;
}

static void print_group(const mgc_plan *p, mgc_group_kind k, FILE *out) {
    int64_t members[16];
    int64_t n = mgc_grid_group(&p->grid, k, 0, members, 16);
    int64_t count = mgc_grid_group_count(&p->grid, k);
    if (n <= 0) return;
    fprintf(out, "  %-6s size %-5" PRId64 " x %-6" PRId64 " groups; rank 0's: [", mgc_group_name(k), n, count);
    for (int64_t i = 0; i < n && i < 16; i++) fprintf(out, "%s%" PRId64, i ? ", " : "", members[i]);
    fprintf(out, "%s]\n", n > 16 ? ", ..." : "");
}

void mgc_plan_print_summary(const mgc_plan *p, FILE *out) {
    const mgc_grid *g = &p->grid;
    char a[32], b[32];
    const char *name = mgc_plan_config_str(p, "model.name");
    fprintf(out, "plan: %s\n", name && name[0] ? name : "(unnamed model)");
    fprintf(out, "  world %" PRId64 " = tensor %" PRId64 " x context %" PRId64 " x data %" PRId64
                 " x pipeline %" PRId64 "  (order tp-cp-dp-pp)\n",
            g->world, g->tp, g->cp, g->dp, g->pp);
    if (g->ep > 1 || g->etp != g->tp)
        fprintf(out, "  expert grid: expert-tensor %" PRId64 " x expert %" PRId64 " x expert-data %" PRId64
                     " x pipeline %" PRId64 "\n",
                g->etp, g->ep, g->edp, g->pp);
    fprintf(out, "  schedule %s, %" PRId64 " microbatch%s of %" PRId64 " x %" PRId64
                 " tokens per data-parallel rank, %" PRId64 " chunk%s per pipeline rank\n",
            p->schedule >= 0 && p->schedule < 3 ? sched_names[p->schedule] : "?", p->num_microbatches,
            p->num_microbatches == 1 ? "" : "es", p->micro_batch_size, p->seq_length, g->vp, g->vp == 1 ? "" : "s");
    double ideal = g->pp > 1 ? (double)(g->pp - 1) / (double)(g->vp * p->num_microbatches) : 0.0;
    double ratio = p->bubble_fraction < 1.0 ? p->bubble_fraction / (1.0 - p->bubble_fraction) : 0.0;
    fprintf(out,
            "  bubble: idle %.2f%% of each rank's step, idle/compute %.4f (simulated with uniform stage\n"
            "          costs; Narayanan et al. 2021: (p-1)/(v*m) = %.4f)\n",
            100.0 * p->bubble_fraction, ratio, ideal);
    fprintf(out, "  recompute %s",
            p->recompute >= 0 && p->recompute < 3 ? recompute_names[p->recompute] : "?");
    int64_t method = 0, nl = 1; /* mgc_recompute_method: 1 block */
    mgc_plan_config_int(p, "training.recompute_method", &method);
    mgc_plan_config_int(p, "training.recompute_num_layers", &nl);
    if (p->recompute == 2 && method == 1)
        fprintf(out, " (block: the first %" PRId64 " layer%s of each chunk)", nl, nl == 1 ? "" : "s");
    else if (p->recompute == 2 && nl > 1)
        fprintf(out, " (uniform: groups of %" PRId64 " layers)", nl);
    for (int i = 0;; i++) { /* training.recompute_modules, as the plan's config lists them */
        char key[64];
        snprintf(key, sizeof key, "training.recompute_modules[%d]", i);
        const char *m = mgc_plan_config_str(p, key);
        if (!m) break;
        fprintf(out, "%s%s", i ? ", " : " (and ", m);
        snprintf(key, sizeof key, "training.recompute_modules[%d]", i + 1);
        if (!mgc_plan_config_str(p, key)) fputc(')', out);
    }
    fprintf(out, ", distributed optimizer %s", p->distributed_optimizer ? "on" : "off");
    /* the loss chunks (compiler/losschunk.h): one cross-entropy backward each */
    int64_t lc = 0;
    for (int64_t s = 0; s < p->n_stages; s++)
        for (int64_t c = 0; c < p->stages[s].n_chunks; c++)
            for (int64_t i = 0; i < p->stages[s].chunks[c].n_bwd; i++)
                lc += p->stages[s].chunks[c].bwd[i].kind == MGC_POP_CROSS_ENTROPY_BWD;
    if (lc > 1) fprintf(out, ", the head in %" PRId64 " loss chunks", lc);
    fputc('\n', out);
    if (p->model_flops_per_iter > 0)
        fprintf(out, "  model FLOPs per iteration %.6e\n", p->model_flops_per_iter);
    fputs("groups:\n", out);
    for (int k = 0; k < MGC_GROUP__COUNT; k++) print_group(p, (mgc_group_kind)k, out);
    fputs("stages (every rank of a pipeline stage runs the same program):\n", out);
    fprintf(out, "  %-5s %-16s %8s %8s %8s %6s %12s %9s %14s\n", "stage", "layers", "instrs", "ops", "colls",
            "p2p", "stash/mb", "in-flight", "arena");
    uint64_t peak = 0;
    int64_t peak_stage = 0;
    for (int64_t s = 0; s < p->n_stages; s++) {
        const mgc_stage_program *sp = &p->stages[s];
        char layers[64];
        stage_layers(sp, layers, sizeof layers);
        uint64_t stash = 0;
        for (int64_t c = 0; c < sp->n_chunks; c++) stash += sp->chunks[c].stash_bytes;
        int64_t p2p = count_instr(sp, MGC_I_SEND_ACT) + count_instr(sp, MGC_I_RECV_ACT) +
                      count_instr(sp, MGC_I_SEND_GRAD) + count_instr(sp, MGC_I_RECV_GRAD);
        fprintf(out, "  %-5" PRId64 " %-16s %8" PRId64 " %8" PRId64 " %8" PRId64 " %6" PRId64 " %12s %9" PRId64 " %14s\n",
                s, layers, sp->n_instrs, count_ops(sp, 0), count_ops(sp, 1), p2p, bytes_h(a, sizeof a, stash),
                sp->max_in_flight, bytes_h(b, sizeof b, sp->arena_bytes));
        if (sp->arena_bytes > peak) peak = sp->arena_bytes, peak_stage = s;
    }
    fprintf(out, "peak memory per GPU: %s (%" PRIu64 " bytes, stage %" PRId64 "): the arena mgc-run allocates\n",
            bytes_h(a, sizeof a, peak), peak, peak_stage);
    if (p->n_kernels > 0) {
        uint32_t archs[8];
        int na = 0;
        for (int64_t i = 0; i < p->n_kernels; i++) {
            int seen = 0;
            for (int k = 0; k < na; k++) seen |= archs[k] == p->kernels[i].arch;
            if (!seen && na < 8) archs[na++] = p->kernels[i].arch;
        }
        fprintf(out, "kernels in the plan: %" PRId64 " cubins (%s), for", p->n_kernels,
                bytes_h(a, sizeof a, p->kbin_len));
        for (int k = 0; k < na; k++) fprintf(out, "%s sm_%u", k ? "," : "", archs[k]);
        fputc('\n', out);
    } else {
        fputs("kernels in the plan: none (a GPU run JIT-compiles them through NVRTC)\n", out);
    }
}

void mgc_plan_print_memory(const mgc_plan *p, FILE *out) {
    char a[32], b[32];
    for (int64_t s = 0; s < p->n_stages; s++) {
        const mgc_stage_program *sp = &p->stages[s];
        uint64_t total = 0; /* bytes live at the peak instruction: a lower bound on any arena */
        for (int k = 0; k < MGC_BUF__COUNT; k++) total += sp->by_kind[k];
        fprintf(out, "stage %" PRId64 ": arena %s (%" PRIu64 " bytes), %" PRId64 " buffers; live at the peak %s, "
                     "placement waste %.1f%%\n",
                s, bytes_h(a, sizeof a, sp->arena_bytes), sp->arena_bytes, sp->n_buffers, bytes_h(b, sizeof b, total),
                sp->arena_bytes ? 100.0 * (double)(sp->arena_bytes - (total < sp->arena_bytes ? total : sp->arena_bytes)) /
                                      (double)sp->arena_bytes
                                : 0.0);
        for (int k = 0; k < MGC_BUF__COUNT; k++) {
            if (!sp->by_kind[k]) continue;
            fprintf(out, "  %-11s %14s  %5.1f%%\n", mgc_buf_kind_name((mgc_buf_kind)k),
                    bytes_h(a, sizeof a, sp->by_kind[k]), total ? 100.0 * (double)sp->by_kind[k] / (double)total : 0.0);
        }
        /* the five largest buffers */
        int64_t top[5] = {-1, -1, -1, -1, -1};
        for (int64_t i = 0; i < sp->n_buffers; i++) {
            for (int t = 0; t < 5; t++) {
                if (top[t] < 0 || sp->buffers[i].bytes > sp->buffers[top[t]].bytes) {
                    for (int u = 4; u > t; u--) top[u] = top[u - 1];
                    top[t] = i;
                    break;
                }
            }
        }
        if (sp->n_buckets) {
            uint64_t elems[2] = {0, 0}, largest = 0;
            int64_t count[2] = {0, 0}, shards[2] = {1, 1};
            for (int64_t i = 0; i < sp->n_buckets; i++) {
                const mgc_bucket *bk = &sp->buckets[i];
                int e = bk->group == MGC_GROUP_EDP;
                elems[e] += bk->count, count[e]++, shards[e] = bk->shards;
                if (bk->count > largest) largest = bk->count;
            }
            fprintf(out, "  gradient buckets: %" PRId64 ", largest %" PRIu64 " elements\n", sp->n_buckets, largest);
            for (int e = 0; e < 2; e++)
                if (count[e])
                    fprintf(out, "    %-6s %" PRId64 " bucket%s over %s, %" PRIu64 " elements, %" PRId64 " shard%s each\n",
                            e ? "expert" : "dense", count[e], count[e] == 1 ? "" : "s",
                            mgc_group_name(e ? MGC_GROUP_EDP : MGC_GROUP_DPCP), elems[e], shards[e],
                            shards[e] == 1 ? "" : "s");
        }
        fputs("  largest buffers:\n", out);
        for (int t = 0; t < 5 && top[t] >= 0; t++) {
            const mgc_buffer *bf = &sp->buffers[top[t]];
            char nm[96];
            if (bf->mb >= 0) /* per-microbatch buffers share a name per chunk */
                snprintf(nm, sizeof nm, "%s (mb %d)", mgc_plan_strat(p, bf->name), bf->mb);
            else
                snprintf(nm, sizeof nm, "%s", mgc_plan_strat(p, bf->name));
            fprintf(out, "    %-40s %-10s %12s at %14s  live [%" PRId64 ", %" PRId64 ")\n",
                    nm, mgc_buf_kind_name((mgc_buf_kind)bf->kind),
                    bytes_h(a, sizeof a, bf->bytes), bytes_h(b, sizeof b, bf->offset), bf->live_begin,
                    bf->live_end);
        }
    }
}

void mgc_plan_print_json(const mgc_plan *p, mgc_json *j, int memory) {
    const mgc_grid *g = &p->grid;
    mgc_json_obj_begin(j, "grid");
    mgc_json_int(j, "world_size", g->world);
    mgc_json_int(j, "tensor", g->tp);
    mgc_json_int(j, "context", g->cp);
    mgc_json_int(j, "data", g->dp);
    mgc_json_int(j, "pipeline", g->pp);
    mgc_json_int(j, "virtual_stages", g->vp);
    mgc_json_int(j, "expert_tensor", g->etp);
    mgc_json_int(j, "expert", g->ep);
    mgc_json_int(j, "expert_data", g->edp);
    mgc_json_obj_end(j);
    mgc_json_str(j, "schedule", p->schedule >= 0 && p->schedule < 3 ? sched_names[p->schedule] : "?");
    mgc_json_int(j, "microbatches", p->num_microbatches);
    mgc_json_num(j, "bubble_fraction", p->bubble_fraction);
    mgc_json_num(j, "model_flops_per_iteration", p->model_flops_per_iter);
    mgc_json_obj_begin(j, "groups");
    for (int k = 0; k < MGC_GROUP__COUNT; k++) {
        int64_t n = mgc_grid_group(&g[0], (mgc_group_kind)k, 0, NULL, 0);
        if (n <= 0) continue;
        mgc_json_obj_begin(j, mgc_group_name((mgc_group_kind)k));
        mgc_json_int(j, "size", n);
        mgc_json_int(j, "count", mgc_grid_group_count(g, (mgc_group_kind)k));
        mgc_json_obj_end(j);
    }
    mgc_json_obj_end(j);
    uint64_t peak = 0;
    mgc_json_arr_begin(j, "stages");
    for (int64_t s = 0; s < p->n_stages; s++) {
        const mgc_stage_program *sp = &p->stages[s];
        if (sp->arena_bytes > peak) peak = sp->arena_bytes;
        mgc_json_obj_begin(j, NULL);
        mgc_json_int(j, "stage", s);
        mgc_json_u64(j, "arena_bytes", sp->arena_bytes);
        mgc_json_int(j, "instructions", sp->n_instrs);
        mgc_json_int(j, "ops", count_ops(sp, 0));
        mgc_json_int(j, "collectives", count_ops(sp, 1));
        mgc_json_int(j, "max_in_flight", sp->max_in_flight);
        mgc_json_arr_begin(j, "chunks");
        for (int64_t c = 0; c < sp->n_chunks; c++) {
            const mgc_plan_chunk *ch = &sp->chunks[c];
            mgc_json_obj_begin(j, NULL);
            mgc_json_int(j, "first_layer", ch->first_layer);
            mgc_json_int(j, "num_layers", ch->num_layers);
            mgc_json_bool(j, "embedding", ch->embedding);
            mgc_json_bool(j, "loss", ch->loss);
            mgc_json_u64(j, "stash_bytes", ch->stash_bytes);
            mgc_json_u64(j, "send_bytes", ch->send_bytes);
            mgc_json_obj_end(j);
        }
        mgc_json_arr_end(j);
        mgc_json_obj_begin(j, "memory");
        for (int k = 0; k < MGC_BUF__COUNT; k++) mgc_json_u64(j, mgc_buf_kind_name((mgc_buf_kind)k), sp->by_kind[k]);
        mgc_json_obj_end(j);
        mgc_json_arr_begin(j, "buckets");
        for (int64_t i = 0; i < sp->n_buckets; i++) {
            const mgc_bucket *bk = &sp->buckets[i];
            mgc_json_obj_begin(j, NULL);
            mgc_json_str(j, "group", mgc_group_name((mgc_group_kind)bk->group));
            mgc_json_int(j, "chunk", bk->chunk);
            mgc_json_int(j, "shards", bk->shards);
            mgc_json_u64(j, "begin", bk->begin);
            mgc_json_u64(j, "count", bk->count);
            mgc_json_u64(j, "grad_offset", bk->grad_offset);
            mgc_json_u64(j, "grad_bytes", bk->grad_bytes);
            mgc_json_obj_end(j);
        }
        mgc_json_arr_end(j);
        if (memory) {
            mgc_json_arr_begin(j, "buffers");
            for (int64_t i = 0; i < sp->n_buffers; i++) {
                const mgc_buffer *bf = &sp->buffers[i];
                mgc_json_obj_begin(j, NULL);
                mgc_json_str(j, "name", mgc_plan_strat(p, bf->name));
                mgc_json_str(j, "kind", mgc_buf_kind_name((mgc_buf_kind)bf->kind));
                mgc_json_u64(j, "bytes", bf->bytes);
                mgc_json_u64(j, "offset", bf->offset);
                mgc_json_int(j, "mb", bf->mb);
                mgc_json_int(j, "live_begin", bf->live_begin);
                mgc_json_int(j, "live_end", bf->live_end);
                mgc_json_obj_end(j);
            }
            mgc_json_arr_end(j);
        }
        mgc_json_obj_end(j);
    }
    mgc_json_arr_end(j);
    mgc_json_u64(j, "peak_arena_bytes", peak);
}
