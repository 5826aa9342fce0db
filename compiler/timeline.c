/* timeline.c - charts of a simulated schedule: a standalone SVG Gantt chart
 * and a plain-text one; see schedule.h.
 *
 * Both are deterministic: the same schedule and simulation give the same
 * bytes (fixed number formats, no dates, no locale-dependent output). */
#include "schedule.h"

#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

static const char *sched_title(int s) {
    static const char *const n[] = {"GPipe", "1F1B", "interleaved 1F1B"};
    return s >= 0 && s < 3 ? n[s] : "?";
}

/* ---- SVG --------------------------------------------------------------------- */

/* Forward (light) and backward (dark) fill per chunk; chunks beyond 8 reuse. */
static const char *const fwd_fill[8] = {"#9ecae1", "#fdae6b", "#a1d99b", "#bcbddc",
                                        "#fc9272", "#d9c39a", "#f7b6d2", "#80cdc1"};
static const char *const bwd_fill[8] = {"#3182bd", "#e6550d", "#31a354", "#756bb1",
                                        "#de2d26", "#8c6d31", "#c51b7d", "#01665e"};

void mgc_svg_text(FILE *f, const char *s) {
    for (; *s; s++) {
        switch (*s) {
        case '<':
            fputs("&lt;", f);
            break;
        case '>':
            fputs("&gt;", f);
            break;
        case '&':
            fputs("&amp;", f);
            break;
        case '"':
            fputs("&quot;", f);
            break;
        default:
            if ((unsigned char)*s >= 0x20 || *s == '\t') fputc(*s, f);
            break;
        }
    }
}

static const char *short_name(int op) {
    switch (op) {
    case MGC_I_REDUCE_GRADS:
        return "rs";
    case MGC_I_EMBED_GRADS:
        return "emb";
    case MGC_I_OPTIMIZER:
        return "opt";
    case MGC_I_GATHER_PARAMS:
        return "ag";
    case MGC_I_LOAD_BATCH:
        return "ld";
    default:
        return "";
    }
}

/* Index of rank r's receive with `seq` from `peer`, or -1.  A link's
 * sends and receives both come in rising seq order, so the search for a
 * sender's next message starts where the last one was found (*cursor):
 * linear over a whole stream; a corrupt stream falls back to a full scan. */
static int64_t find_recv(const mgc_schedule *s, int64_t r, int64_t peer, uint64_t seq,
                         int64_t *cursor) {
    const mgc_schedule_stream *st = &s->ranks[r];
    for (int pass = 0; pass < 2; pass++) {
        for (int64_t i = pass ? 0 : *cursor; i < st->n; i++) {
            const mgc_instr *in = &st->instrs[i];
            if ((in->op == MGC_I_RECV_ACT || in->op == MGC_I_RECV_GRAD) && in->peer == peer &&
                in->seq == seq) {
                *cursor = i + 1;
                return i;
            }
        }
    }
    return -1;
}

int mgc_schedule_svg(const mgc_schedule *s, const mgc_sim_result *r, const mgc_svg_options *opt,
                     FILE *out) {
    if (!out || !s || !r || !r->ranks || r->pp != s->pp) return -1;
    double T = r->makespan > 0 ? r->makespan : 1;
    double px = opt && opt->px_per_unit > 0 ? opt->px_per_unit : 1200.0 / T;
    if (px > 60) px = 60;
    const double left = 70, right = 90, top = 58, row_h = 34, box_h = 26;
    double chart_w = px * T, W = left + chart_w + right;
    int64_t pp = s->pp, vp = s->vp;
    int comm_marks = opt && opt->comm_marks;
    double axis_y = top + row_h * (double)pp + 4;
    int other = 0; /* any tail instruction with a duration */
    for (int64_t k = 0; k < pp; k++)
        for (int64_t i = 0; i < s->ranks[k].n; i++) {
            int op = s->ranks[k].instrs[i].op;
            if (op != MGC_I_FORWARD && op != MGC_I_BACKWARD && op != MGC_I_SEND_ACT &&
                op != MGC_I_RECV_ACT && op != MGC_I_SEND_GRAD && op != MGC_I_RECV_GRAD &&
                r->ranks[k].end[i] > r->ranks[k].start[i])
                other = 1;
        }
    int64_t legend_items = 2 * vp + 1 + other + 2 * comm_marks;
    int64_t per_line = (int64_t)((W - 20) / 190);
    if (per_line < 1) per_line = 1;
    int64_t legend_lines = (legend_items + per_line - 1) / per_line;
    double H = axis_y + 40 + 22 * (double)legend_lines + 10;

    fprintf(out, "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n");
    fprintf(out,
            "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" height=\"%.0f\" "
            "viewBox=\"0 0 %.0f %.0f\" font-family=\"Helvetica, Arial, sans-serif\">\n",
            W, H, W, H);
    fprintf(out, "<rect x=\"0\" y=\"0\" width=\"%.0f\" height=\"%.0f\" fill=\"#ffffff\"/>\n", W, H);
    if (comm_marks)
        fprintf(out, "<defs>\n"
                     "<marker id=\"act\" viewBox=\"0 0 6 6\" refX=\"6\" refY=\"3\" "
                     "markerWidth=\"5\" markerHeight=\"5\" orient=\"auto\"><path d=\"M0,0 L6,3 "
                     "L0,6 z\" fill=\"#444444\"/></marker>\n"
                     "<marker id=\"grad\" viewBox=\"0 0 6 6\" refX=\"6\" refY=\"3\" "
                     "markerWidth=\"5\" markerHeight=\"5\" orient=\"auto\"><path d=\"M0,0 L6,3 "
                     "L0,6 z\" fill=\"#b30000\"/></marker>\n"
                     "</defs>\n");
    /* title */
    fprintf(out, "<text x=\"%.1f\" y=\"24\" font-size=\"16\" font-weight=\"bold\">", left);
    if (opt && opt->title) {
        mgc_svg_text(out, opt->title);
    } else {
        fprintf(out, "%s schedule: p=%" PRId64 ", v=%" PRId64 ", m=%" PRId64,
                sched_title(s->schedule), pp, vp, s->m);
        if (s->schedule == MGC_SCHED_INTERLEAVED) fprintf(out, ", G=%" PRId64, s->group);
        fprintf(out, " \xe2\x80\x94 bubble fraction %.3f", r->bubble_fraction);
    }
    fprintf(out, "</text>\n");
    fprintf(out,
            "<text x=\"%.1f\" y=\"44\" font-size=\"12\" fill=\"#333333\">bubble fraction %.4f "
            "(mean idle / makespan); idle / ideal %.4f; makespan %.6g; most microbatches in "
            "flight %" PRId64 "%s</text>\n",
            left, r->bubble_fraction, r->bubble_ratio, r->makespan, r->peak_in_flight,
            r->ok ? "" : "; SIMULATION REPORTED PROBLEMS");

    /* rows: idle background, boxes, labels */
    for (int64_t k = 0; k < pp; k++) {
        double y = top + row_h * (double)k;
        double by = y + (row_h - box_h) / 2;
        fprintf(out,
                "<text x=\"%.1f\" y=\"%.1f\" font-size=\"12\" text-anchor=\"end\">rank %" PRId64
                "</text>\n",
                left - 8, by + box_h / 2 + 4, k);
        fprintf(out,
                "<rect x=\"%.2f\" y=\"%.2f\" width=\"%.2f\" height=\"%.2f\" fill=\"#f2f2f2\"/>\n",
                left, by, chart_w, box_h);
        const mgc_sim_rank *R = &r->ranks[k];
        for (int64_t i = 0; i < s->ranks[k].n; i++) {
            const mgc_instr *in = &s->ranks[k].instrs[i];
            double t0 = R->start[i], t1 = R->end[i];
            if (t0 < 0 || !(t1 > t0)) continue;
            int fb = in->op == MGC_I_FORWARD || in->op == MGC_I_BACKWARD;
            int comm = in->op == MGC_I_SEND_ACT || in->op == MGC_I_RECV_ACT ||
                       in->op == MGC_I_SEND_GRAD || in->op == MGC_I_RECV_GRAD;
            double x0 = left + px * t0, w = px * (t1 - t0);
            if (comm) { /* a transfer with a duration: thin bar under the row */
                fprintf(out,
                        "<rect x=\"%.2f\" y=\"%.2f\" width=\"%.2f\" height=\"3\" "
                        "fill=\"#555555\"/>\n",
                        x0, by + box_h + 1, w);
                continue;
            }
            const char *fill = !fb                       ? "#bdbdbd"
                               : in->op == MGC_I_FORWARD ? fwd_fill[in->chunk % 8]
                                                         : bwd_fill[in->chunk % 8];
            fprintf(out,
                    "<rect x=\"%.2f\" y=\"%.2f\" width=\"%.2f\" height=\"%.2f\" fill=\"%s\" "
                    "stroke=\"#ffffff\" stroke-width=\"1\"><title>",
                    x0, by, w, box_h, fill);
            char b[160];
            mgc_instr_format(in, b, sizeof b);
            mgc_svg_text(out, b);
            fprintf(out, " [%.6g, %.6g)</title></rect>\n", t0, t1);
            char lab[32];
            if (fb)
                snprintf(lab, sizeof lab, "%" PRId32, in->mb);
            else
                snprintf(lab, sizeof lab, "%s", short_name(in->op));
            double fs = box_h * 0.5 < 12 ? box_h * 0.5 : 12;
            if (w >= fs * 0.62 * (double)strlen(lab) + 2)
                fprintf(out,
                        "<text x=\"%.2f\" y=\"%.2f\" font-size=\"%.0f\" text-anchor=\"middle\" "
                        "fill=\"%s\">%s</text>\n",
                        x0 + w / 2, by + box_h / 2 + fs * 0.36, fs,
                        in->op == MGC_I_BACKWARD ? "#ffffff" : "#000000", lab);
        }
        fprintf(out,
                "<text x=\"%.2f\" y=\"%.1f\" font-size=\"11\" fill=\"#555555\">idle %.6g</text>\n",
                left + chart_w + 8, by + box_h / 2 + 4, R->idle);
    }

    /* transfers: a line from the sender's row to the receiver's */
    if (comm_marks) {
        for (int64_t k = 0; k < pp; k++) {
            int64_t cursor[2] = {0, 0}; /* on the next rank's stream, on the previous one's */
            for (int64_t i = 0; i < s->ranks[k].n; i++) {
                const mgc_instr *in = &s->ranks[k].instrs[i];
                if (in->op != MGC_I_SEND_ACT && in->op != MGC_I_SEND_GRAD) continue;
                if (in->peer < 0 || in->peer >= pp || r->ranks[k].end[i] < 0) continue;
                int64_t j = find_recv(s, in->peer, k, in->seq, &cursor[in->peer != (k + 1) % pp]);
                if (j < 0 || r->ranks[in->peer].end[j] < 0) continue;
                /* from the sender's box edge to the receiver's, facing each other */
                int down = in->peer > k;
                double edge = (row_h - box_h) / 2;
                double ya = top + row_h * (double)(k + down) - (down ? edge : -edge);
                double yb = top + row_h * (double)(in->peer + !down) + (down ? edge : -edge);
                int act = in->op == MGC_I_SEND_ACT;
                fprintf(out,
                        "<line x1=\"%.2f\" y1=\"%.2f\" x2=\"%.2f\" y2=\"%.2f\" stroke=\"%s\" "
                        "stroke-width=\"1\" stroke-opacity=\"0.8\" marker-end=\"url(#%s)\"/>\n",
                        left + px * r->ranks[k].start[i], ya, left + px * r->ranks[in->peer].end[j],
                        yb, act ? "#444444" : "#b30000", act ? "act" : "grad");
            }
        }
    }

    /* time axis */
    double step = 1; /* 1, 2, 5, 10, 20, 50, ... at least 40 px apart */
    for (int i = 0; step * px < 40; i++)
        step *= i % 3 == 1 ? 2.5 : 2;
    fprintf(out,
            "<line x1=\"%.2f\" y1=\"%.2f\" x2=\"%.2f\" y2=\"%.2f\" stroke=\"#000000\" "
            "stroke-width=\"1\"/>\n",
            left, axis_y, left + chart_w, axis_y);
    for (double t = 0; t <= T + 1e-9; t += step) {
        fprintf(out, "<line x1=\"%.2f\" y1=\"%.2f\" x2=\"%.2f\" y2=\"%.2f\" stroke=\"#000000\"/>\n",
                left + px * t, axis_y, left + px * t, axis_y + 4);
        fprintf(out,
                "<text x=\"%.2f\" y=\"%.2f\" font-size=\"10\" text-anchor=\"middle\">%.6g</text>\n",
                left + px * t, axis_y + 15, t);
    }
    fprintf(out, "<text x=\"%.2f\" y=\"%.2f\" font-size=\"10\" fill=\"#555555\">time</text>\n",
            left + chart_w + 8, axis_y + 15);

    /* legend */
    double ly = axis_y + 32;
    int64_t item = 0;
    for (int64_t c = 0; c < legend_items; c++) {
        const char *fill, *what;
        char lab[64];
        if (c < 2 * vp) {
            int64_t ch = c / 2;
            fill = c % 2 ? bwd_fill[ch % 8] : fwd_fill[ch % 8];
            what = c % 2 ? "backward" : "forward";
            if (vp > 1)
                snprintf(lab, sizeof lab, "chunk %" PRId64 " %s", ch, what);
            else
                snprintf(lab, sizeof lab, "%s", what);
        } else if (c == 2 * vp) {
            fill = "#f2f2f2";
            snprintf(lab, sizeof lab, "idle");
        } else if (comm_marks && c > 2 * vp + other) {
            int act = c == 2 * vp + other + 1;
            double lx = 20 + 190 * (double)(item % per_line);
            double y = ly + 22 * (double)(item / per_line);
            fprintf(out,
                    "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"%s\" "
                    "stroke-width=\"1\" marker-end=\"url(#%s)\"/>\n",
                    lx, y - 4, lx + 14, y - 4, act ? "#444444" : "#b30000", act ? "act" : "grad");
            fprintf(out, "<text x=\"%.1f\" y=\"%.1f\" font-size=\"12\">%s</text>\n", lx + 20, y,
                    act ? "activation transfer" : "gradient transfer");
            item++;
            continue;
        } else {
            fill = "#bdbdbd";
            snprintf(lab, sizeof lab, "step tail (rs, emb, opt, ag)");
        }
        double lx = 20 + 190 * (double)(item % per_line);
        double y = ly + 22 * (double)(item / per_line);
        fprintf(out,
                "<rect x=\"%.1f\" y=\"%.1f\" width=\"14\" height=\"14\" fill=\"%s\" "
                "stroke=\"#999999\" stroke-width=\"0.5\"/>\n",
                lx, y - 11, fill);
        fprintf(out, "<text x=\"%.1f\" y=\"%.1f\" font-size=\"12\">%s</text>\n", lx + 20, y, lab);
        item++;
    }
    fprintf(out, "</svg>\n");
    return ferror(out) ? -1 : 0;
}

/* ---- text --------------------------------------------------------------------- */

static void put_line(FILE *out, const char *s, size_t len) {
    while (len && s[len - 1] == ' ')
        len--;
    fwrite(s, 1, len, out);
    fputc('\n', out);
}

int mgc_schedule_print_text(const mgc_schedule *s, const mgc_sim_result *r, FILE *out) {
    if (!out || !s || !r || !r->ranks || r->pp != s->pp) return -1;
    int64_t units = (int64_t)ceil(r->makespan - 1e-9);
    if (units > 4000) {
        fprintf(out, "(timeline of %" PRId64 " time units: too long to print)\n", units);
        return ferror(out) ? -1 : 0;
    }
    /* cell width: the longest label plus a space */
    int w = 2;
    char lab[48];
    for (int64_t k = 0; k < s->pp; k++)
        for (int64_t i = 0; i < s->ranks[k].n; i++) {
            const mgc_instr *in = &s->ranks[k].instrs[i];
            if (in->op != MGC_I_FORWARD && in->op != MGC_I_BACKWARD) continue;
            int n = s->vp > 1
                        ? snprintf(lab, sizeof lab, "F%" PRId32 ".%u", in->mb, (unsigned)in->chunk)
                        : snprintf(lab, sizeof lab, "F%" PRId32, in->mb);
            if (n > w) w = n;
        }
    /* one line at a time, without trailing blanks */
    size_t cap = 16 + (size_t)(units + 1) * (size_t)(w + 1) + 1;
    char *line = malloc(cap);
    const mgc_instr **cell = calloc((size_t)(units ? units : 1), sizeof *cell);
    if (!cell || !line) {
        free(cell);
        free(line);
        return -1;
    }
    size_t len = (size_t)snprintf(line, cap, "%-8s", "time");
    for (int64_t t = 0; t < units; t++)
        len += (size_t)(t % 5 == 0 ? snprintf(line + len, cap - len, "%-*" PRId64, w + 1, t)
                                   : snprintf(line + len, cap - len, "%*s", w + 1, ""));
    put_line(out, line, len);
    for (int64_t k = 0; k < s->pp; k++) {
        len = (size_t)snprintf(line, cap, "rank %-3" PRId64, k);
        const mgc_sim_rank *R = &r->ranks[k];
        memset(cell, 0, (size_t)(units ? units : 1) * sizeof *cell);
        /* paint each pass over the cells whose middle it covers */
        for (int64_t i = 0; i < s->ranks[k].n; i++) {
            const mgc_instr *in = &s->ranks[k].instrs[i];
            if ((in->op != MGC_I_FORWARD && in->op != MGC_I_BACKWARD) || R->start[i] < 0) continue;
            for (int64_t t = (int64_t)floor(R->start[i]); t < units && t + 0.5 < R->end[i]; t++)
                if (t >= 0 && t + 0.5 >= R->start[i]) cell[t] = in;
        }
        for (int64_t t = 0; t < units; t++) {
            const mgc_instr *hit = cell[t];
            if (!hit) {
                len += (size_t)snprintf(line + len, cap - len, "%-*s", w + 1, ".");
                continue;
            }
            char c = hit->op == MGC_I_FORWARD ? 'F' : 'B';
            if (s->vp > 1)
                snprintf(lab, sizeof lab, "%c%" PRId32 ".%u", c, hit->mb, (unsigned)hit->chunk);
            else
                snprintf(lab, sizeof lab, "%c%" PRId32, c, hit->mb);
            len += (size_t)snprintf(line + len, cap - len, "%-*s", w + 1, lab);
        }
        put_line(out, line, len);
    }
    free(cell);
    free(line);
    fprintf(out, "makespan %.6g, bubble fraction %.4f (mean idle / makespan), idle / ideal %.4f\n",
            r->makespan, r->bubble_fraction, r->bubble_ratio);
    return ferror(out) ? -1 : 0;
}
