/* partition_print.c - a readable listing of a partitioned chunk (see partition.h). */
#include <inttypes.h>
#include <stdio.h>

#include "partition.h"

static const char *group_or_none(uint16_t g) {
    return g < MGC_GROUP__COUNT ? mgc_group_name((mgc_group_kind)g) : "-";
}

static void print_tensor(const mgc_plan *p, const mgc_plan_chunk *ch, int32_t id, FILE *out) {
    const mgc_plan_tensor *t = &ch->tensors[id];
    fprintf(out, "%%%d %s: %s[", (int)id, mgc_plan_strat(p, t->name),
            mgc_dtype_name((mgc_dtype)t->dtype));
    for (int i = 0; i < t->rank; i++)
        fprintf(out, "%s%" PRId64 "%s", i ? "," : "", t->dim[i], t->split_axis == i ? "*" : "");
    fputc(']', out);
    if (t->ld) fprintf(out, "~ld%" PRIu32, t->ld);
    if (t->split_axis != MGC_PLAN_NO_SPLIT)
        fprintf(out, "/%s", group_or_none(t->split_group));
    else if (t->split_group != MGC_PARTITION_NO_GROUP)
        fprintf(out, "(partial %s)", group_or_none(t->split_group));
    if (t->buffer == MGC_PLAN_BUF_STASH) fprintf(out, "@stash+%" PRIu64, t->offset);
    if (t->view && (int64_t)t->view <= ch->n_tensors) { /* rows of another tensor */
        const mgc_plan_tensor *w = &ch->tensors[t->view - 1];
        uint64_t row = t->rank && t->dim[0] ? t->bytes / (uint64_t)t->dim[0] : 0;
        uint64_t r0 = row && t->offset >= w->offset ? (t->offset - w->offset) / row : 0;
        fprintf(out, "=%%%u[%" PRIu64 ":%" PRIu64 "]", t->view - 1, r0, r0 + (uint64_t)t->dim[0]);
    }
}

static void print_ops(const mgc_plan *p, const mgc_plan_chunk *ch, const mgc_plan_op *ops,
                      int64_t n, FILE *out) {
    for (int64_t i = 0; i < n; i++) {
        const mgc_plan_op *o = &ops[i];
        fprintf(out, "  #%" PRId64 " %s%s%s%s%s%s%s%s%s %s", i,
                (o->flags & MGC_POF_RECOMPUTE) ? "recompute " : "",
                mgc_plan_op_name((mgc_plan_op_kind)o->kind),
                (o->flags & MGC_POF_QKV) ? " qkv" : "", (o->flags & MGC_POF_SAVED) ? " saves" : "",
                (o->flags & MGC_POF_INPLACE) ? " in-place" : "",
                (o->flags & MGC_POF_ROPE) ? " rope" : "",
                (o->flags & MGC_POF_CE_STATS) ? " +stats" : "",
                (o->flags & MGC_POF_COLSUM) ? " +bias" : "",
                (o->flags & MGC_POF_DROPBWD) ? " +dropout" : "", mgc_plan_strat(p, o->name));
        if (o->kind >= MGC_POP_ALL_REDUCE)
            fprintf(out, " {%s seq %u, %" PRId64 " -> %" PRId64 " %s%s%s}", group_or_none(o->group),
                    o->seq, o->iattr[0], o->iattr[1], mgc_dtype_name((mgc_dtype)o->iattr[2]),
                    (o->iattr[3] & MGC_PCOLL_MAX) ? " max" : "",
                    (o->iattr[3] & MGC_PCOLL_VARIABLE) ? " variable" : "");
        fputs(" (", out);
        for (int k = 0; k < o->n_in; k++) {
            if (k) fputs(", ", out);
            print_tensor(p, ch, o->in[k], out);
        }
        fputs(") -> (", out);
        for (int k = 0; k < o->n_out; k++) {
            if (k) fputs(", ", out);
            print_tensor(p, ch, o->out[k], out);
        }
        fputc(')', out);
        if (o->kind < MGC_POP_ALL_REDUCE) {
            fprintf(out, " i[%" PRId64 " %" PRId64 " %" PRId64 " %" PRId64 "]", o->iattr[0], o->iattr[1],
                    o->iattr[2], o->iattr[3]);
            if (o->fattr[0] || o->fattr[1] || o->fattr[2] || o->fattr[3])
                fprintf(out, " f[%g %g %g %g]", o->fattr[0], o->fattr[1], o->fattr[2], o->fattr[3]);
        }
        if (o->flops) fprintf(out, " flops=%" PRIu64, o->flops);
        fputc('\n', out);
    }
}

void mgc_partition_print(const mgc_plan *p, const mgc_plan_chunk *ch, FILE *out) {
    if (ch->num_layers > 0)
        fprintf(out, "# chunk: layers %d..%d", (int)ch->first_layer,
                (int)(ch->first_layer + ch->num_layers - 1));
    else
        fputs("# chunk: no layers", out);
    fprintf(out,
            "%s%s, %" PRId64 " tensors, %" PRId64 " forward ops, %" PRId64
            " backward ops, stash %" PRIu64 " bytes, send %" PRIu64 " bytes\n",
            ch->embedding ? ", embedding" : "", ch->loss ? ", loss" : "", ch->n_tensors, ch->n_fwd,
            ch->n_bwd, ch->stash_bytes, ch->send_bytes);
    fputs("forward:\n", out);
    print_ops(p, ch, ch->fwd, ch->n_fwd, out);
    fputs("backward:\n", out);
    print_ops(p, ch, ch->bwd, ch->n_bwd, out);
}
