/* schedule.h - pipeline schedules: the instruction stream of every pipeline
 * rank for one training step, a simulator that runs all streams together,
 * and a timeline chart.  docs/schedules.md is the manual; this header is the
 * reference.
 *
 * A schedule is one stream of mgc_instr (plan/plan.h) per pipeline rank:
 * forwards and backwards of (microbatch, chunk) pairs in the order of GPipe,
 * 1F1B or interleaved 1F1B, the sends and receives that move activations and
 * their gradients between neighbouring pipeline ranks, the batch loads, and
 * after the last backward the gradient reductions and the optimizer step.
 * Chunk c of pipeline rank r is virtual stage c*pp + r in model order.
 *
 * Communication model (docs/schedules.md#communication-model): every SEND
 * and RECV is a blocking point-to-point operation between two neighbouring
 * pipeline ranks, messages on a directed link are matched in order and
 * carry their position on that link in `seq`.  The builder orders every
 * rank's stream by one global order of the messages, so the streams finish
 * even with rendezvous semantics (a send returns only once the peer has
 * reached the matching receive: no buffering at all), and therefore with
 * any amount of buffering.
 *
 *     mgc_schedule_params sp;
 *     mgc_schedule_params_from_config(cfg, 4, &sp);     // 4 gradient buckets
 *     mgc_schedule *s = NULL;
 *     if (mgc_schedule_build(&sp, &s, &diags) == 0) {
 *         mgc_sim_result r;
 *         if (mgc_schedule_simulate(s, NULL, &r, &diags) == 0)
 *             printf("bubble %.3f\n", r.bubble_fraction);
 *         mgc_schedule_svg(s, &r, NULL, fopen("schedule.svg", "w"));
 *         mgc_sim_result_free(&r);
 *     }
 *     mgc_schedule_free(s);
 *
 * Nothing here touches a GPU or the plan's own functions: only plan.h's
 * types.  All functions are deterministic. */
#ifndef MGC_SCHEDULE_H
#define MGC_SCHEDULE_H

#include <stdint.h>
#include <stdio.h>

#include "config.h"
#include "diag.h"
#include "plan.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- parameters ---------------------------------------------------------- */

/* Limits that keep every index inside mgc_instr's fields and the streams in
 * memory; parameters beyond them are refused with a diagnostic. */
#define MGC_SCHED_MAX_PP      65536     /* pipeline ranks */
#define MGC_SCHED_MAX_VP      1024      /* chunks per rank (mgc_instr.chunk is 16 bits) */
#define MGC_SCHED_MAX_MB      (1 << 24) /* microbatches (mgc_instr.mb is 32 bits) */
#define MGC_SCHED_MAX_WORK    (1 << 22) /* pp * vp * m: forward passes of one step */
#define MGC_SCHED_MAX_BUCKETS (1 << 20) /* gradient buckets per rank */

/* LOAD_BATCH's `arg`: what the rank reads for the microbatch. */
#define MGC_SCHED_LOAD_TOKENS 1u /* first virtual stage: tokens (and positions) */
#define MGC_SCHED_LOAD_LABELS 2u /* last virtual stage: labels and loss mask */
#define MGC_SCHED_LOAD_DOCS   4u /* every virtual stage with data.reset_attention_mask: the
                                    documents' start positions its attention reads */
#define MGC_SCHED_LOAD_BIAS   8u /* every virtual stage with moe.expert_bias_update_rate: the
                                    routers' expert biases (the runtime keeps them) */

typedef struct mgc_schedule_params {
    int schedule;                /* mgc_sched (config.h): GPIPE, 1F1B or INTERLEAVED */
    int64_t pp;                  /* pipeline ranks (p) */
    int64_t vp;                  /* model chunks per rank (v); > 1 only when interleaved */
    int64_t num_microbatches;    /* m, per step and data-parallel rank */
    int64_t group;               /* G, interleaved: microbatches per chunk in a row; 0 = pp */
    int64_t grad_buckets;        /* gradient buckets per rank: one REDUCE_GRADS each (>= 0) */
    const int64_t *rank_buckets; /* (pp) optional per-rank bucket counts overriding grad_buckets
                                    (an empty rank has none); read while building */
    int distributed_optimizer;   /* REDUCE_GRADS is a reduce-scatter; GATHER_PARAMS per bucket
                                    follows OPTIMIZER */
    int tied_embeddings;         /* EMBED_GRADS on ranks 0 and pp-1 when pp > 1 */
    uint32_t load_every;         /* what every forward loads: MGC_SCHED_LOAD_DOCS (the document
                                    starts), MGC_SCHED_LOAD_BIAS (the expert biases), or 0 */
    mgc_loc loc;                 /* where diagnostics point (the config's schedule key) */
} mgc_schedule_params;

/* Parameters of a finalized config (no errors): schedule, degrees,
 * microbatches, group size, optimizer and tied embeddings; grad_buckets as
 * given; diagnostics point at parallel.schedule. */
void mgc_schedule_params_from_config(const mgc_config *c, int64_t grad_buckets,
                                     mgc_schedule_params *out);

/* Check parameters without building: the compiler's schedule rules
 * (virtual stages need the interleaved schedule and a pipeline; pp <= G <= m
 * and m mod G in {0} u [pp, G)) plus the builder's own limits.  Any values
 * are accepted (sweeps pass arbitrary ones); every problem is one error on d.
 * 0 when none. */
int mgc_schedule_check(const mgc_schedule_params *p, mgc_diags *d);

/* Megatron's warm-up: forwards rank r runs before its steady 1F1B phase.
 * GPipe: m; 1F1B: min(pp-r-1, m); interleaved: min(2(pp-r-1) + (vp-1)G, vp*m).
 * -1 for parameters mgc_schedule_check rejects. */
int64_t mgc_schedule_warmup(const mgc_schedule_params *p, int64_t rank);

/* Narayanan et al. 2021: pipeline bubble over ideal time, (p-1)/m, and
 * (p-1)/(v m) interleaved.  -1 for rejected parameters. */
double mgc_schedule_bubble_ratio_closed_form(const mgc_schedule_params *p);

/* ---- schedules ----------------------------------------------------------- */

typedef struct mgc_schedule_stream {
    int64_t n;         /* instructions */
    mgc_instr *instrs; /* (n) the rank's program for one step */
    int64_t warmup;    /* Megatron's warm-up count for this rank (mgc_schedule_warmup) */
    int64_t n_buckets; /* REDUCE_GRADS in the stream */
} mgc_schedule_stream;

/* What every forward of a compiled plan loads (mgc_schedule_params.load_every), from the
 * config it carries: for rebuilding its schedule (the cost model, the timeline). */
uint32_t mgc_schedule_plan_load_every(const mgc_plan *p);

typedef struct mgc_schedule {
    int schedule;             /* mgc_sched */
    int64_t pp, vp, m, group; /* p, v, m, G (G = pp unless interleaved with a group set) */
    int64_t n_stages;         /* pp * vp */
    int distributed_optimizer;
    int tied_embeddings;
    uint32_t load_every;
    mgc_loc loc;                /* from the parameters */
    mgc_schedule_stream *ranks; /* (pp) */
} mgc_schedule;

/* Build the streams.  Refuses (returns -1 with diagnostics on d, *out =
 * NULL) what mgc_schedule_check refuses and out-of-memory; 0 on success. */
int mgc_schedule_build(const mgc_schedule_params *p, mgc_schedule **out, mgc_diags *d);
void mgc_schedule_free(mgc_schedule *s);

const char *mgc_instr_op_name(int op); /* "FORWARD", ...; "?" out of range */
/* One instruction as text: "RECV_ACT mb 3 chunk 1 from 2 seq 7". */
void mgc_instr_format(const mgc_instr *in, char *buf, size_t bufsz);

/* ---- simulation ---------------------------------------------------------- */

/* Duration of one instruction on pipeline rank `rank`; must be finite and
 * >= 0.  For a matched send/receive the transfer takes the larger of the
 * two sides' durations. */
typedef double (*mgc_schedule_cost_fn)(void *user, int64_t rank, const mgc_instr *in);

/* The default: FORWARD 1, BACKWARD 2, everything else 0. */
double mgc_schedule_cost_uniform(void *user, int64_t rank, const mgc_instr *in);

/* Costs from the layers of each virtual stage (uneven layouts): a chunk's
 * forward takes fwd_fixed + fwd_per_layer * its layers (+ the embedding and
 * loss terms where it holds them), its backward bwd_ratio times that. */
typedef struct mgc_schedule_layer_cost {
    const mgc_stage *stages; /* (pp * vp) in model order, e.g. config.derived.stages */
    int64_t pp;              /* to map (rank, chunk) to a stage */
    double fwd_per_layer;    /* forward time of one decoder layer */
    double fwd_fixed;        /* per chunk pass, even for an empty chunk */
    double fwd_embedding;    /* added on the stage holding the embedding */
    double fwd_loss;         /* added on the stage holding the output layer and loss */
    double bwd_ratio;        /* backward / forward */
    double comm;             /* each send and receive */
} mgc_schedule_layer_cost;
double mgc_schedule_cost_layers(void *user /* mgc_schedule_layer_cost */, int64_t rank,
                                const mgc_instr *in);

/* Transfer semantics (docs/schedules.md#communication-model).  A send
 * blocks while the directed link holds `link_buffer` messages that their
 * receiver has not taken yet; a receive blocks until its message was sent.
 * With MGC_SIM_RENDEZVOUS a send and its receive complete together, when
 * both ranks have reached them. */
#define MGC_SIM_RENDEZVOUS          (-1)
#define MGC_SIM_UNBOUNDED           INT64_MAX
#define MGC_SIM_DEFAULT_LINK_BUFFER 1 /* one send in flight per link */

typedef struct mgc_sim_options {
    mgc_schedule_cost_fn cost; /* NULL: mgc_schedule_cost_uniform */
    void *cost_user;           /* passed to cost */
    int64_t link_buffer;       /* 0: MGC_SIM_DEFAULT_LINK_BUFFER; k > 0; MGC_SIM_RENDEZVOUS;
                                  MGC_SIM_UNBOUNDED */
    int max_reports;           /* diagnostics per kind of problem; 0 means 8 */
} mgc_sim_options;

typedef struct mgc_sim_rank {
    double compute; /* time in FORWARD and BACKWARD */
    double other;   /* time in LOAD_BATCH and OPTIMIZER */
    double comm;    /* own durations of sends, receives and collectives */
    double idle;    /* makespan - compute - other - comm: waiting */
    double finish;  /* when its last instruction ended */
    int64_t forwards_before_first_backward;
    int64_t peak_in_flight;        /* most microbatch-chunks forwarded, not yet backwarded */
    int64_t *peak_in_flight_chunk; /* (vp) the same per chunk */
    int64_t peak_pending_recv;     /* most received activations/gradients not yet consumed */
    double *start, *end;           /* (n instructions) times; -1 for ones never executed */
} mgc_sim_rank;

typedef struct mgc_sim_result {
    int ok;                 /* no problem of any kind */
    double makespan;        /* when the last rank finished */
    double bubble_fraction; /* mean over ranks of idle / makespan */
    double bubble_ratio;    /* sum of idle / sum of compute: Narayanan's bubble / ideal */
    int64_t peak_in_flight; /* max over ranks */
    int64_t pp, vp;         /* shape of ranks[] */
    mgc_sim_rank *ranks;    /* (pp) */
    /* problems found, by kind (each also reported on the diagnostics list) */
    int64_t n_malformed; /* a field out of range or a peer that is not the neighbour stage */
    int64_t n_unmatched; /* a send without its receive or the reverse (or duplicate seq) */
    int64_t n_mismatch;  /* matched by seq, but kind or payload differ, or out of order */
    int64_t n_deadlock;  /* 1 when no rank could progress before all finished */
    int64_t n_order;     /* backward before forward, a pass twice, optimizer too early */
    int64_t n_input;     /* forward before its input arrived, backward before its
                            gradient, a send of something not computed, no batch loaded */
    int64_t n_missing;   /* a (microbatch, chunk) forward or backward never run */
} mgc_sim_result;

/* Run every stream together.  opt may be NULL (uniform costs, one message
 * in flight per link).
 * Fills *out (free with mgc_sim_result_free even on failure) and reports
 * every problem as an error on d, naming ranks and instruction indices.
 * Returns 0 when the schedule ran to completion without problems, -1
 * otherwise.  A malformed stream is reported but not run. */
int mgc_schedule_simulate(const mgc_schedule *s, const mgc_sim_options *opt, mgc_sim_result *out,
                          mgc_diags *d);
void mgc_sim_result_free(mgc_sim_result *r);

/* ---- timeline ------------------------------------------------------------ */

typedef struct mgc_svg_options {
    const char *title;  /* NULL: "<schedule> p=.. v=.. m=.. — bubble .." */
    int comm_marks;     /* draw a line for every activation / gradient transfer */
    double px_per_unit; /* horizontal scale; 0: fit about 1200 px */
} mgc_svg_options;

/* A standalone SVG Gantt chart of a simulated schedule: one row per pipeline
 * rank, forward and backward boxes coloured by chunk and labelled with the
 * microbatch, a legend and a title with p, v, m and the bubble fraction.
 * opt may be NULL.  0 on success, -1 on a write error. */
int mgc_schedule_svg(const mgc_schedule *s, const mgc_sim_result *r, const mgc_svg_options *opt,
                     FILE *out);

/* Writes s as SVG/XML character data: <, >, & and " escaped, control
 * characters other than tab dropped (every SVG mgc draws uses it). */
void mgc_svg_text(FILE *out, const char *s);

/* The same as text: one row per rank, one cell per time unit (costs are
 * rounded to units), "F3" forward and "B3" backward of microbatch 3 ("F3.1":
 * chunk 1 when vp > 1), "." idle. */
int mgc_schedule_print_text(const mgc_schedule *s, const mgc_sim_result *r, FILE *out);

#ifdef __cplusplus
}
#endif
#endif /* MGC_SCHEDULE_H */
