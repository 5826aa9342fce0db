/* train.c - see train.h. */
#include "train.h"

#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backend.h"
#include "checkpoint.h"
#include "exec.h"
#include "train_data.h"

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static const char *mib(char *buf, size_t n, uint64_t b) {
    snprintf(buf, n, "%.2f MiB", (double)b / (1024.0 * 1024.0));
    return buf;
}

/* The GPU of a rank: its place among the ranks of its node, modulo the visible GPUs
 * (mgc_backend_cuda_open).  Threads of one process (local) are the node's ranks in world
 * order; under mpirun or srun the launcher names the node-local rank. */
static int device_of(mgc_comm *world) {
    if (strcmp(mgc_comm_transport(world), "local")) {
        static const char *const vars[] = {"OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID",
                                           "SLURM_LOCALID", "LOCAL_RANK"};
        for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++) {
            const char *v = getenv(vars[i]);
            char *end;
            long r = v ? strtol(v, &end, 10) : -1;
            if (v && *v && !*end && r >= 0 && r < 1 << 20) return (int)r;
        }
    }
    return mgc_comm_world_rank(world);
}

/* Rank 0 looks for the newest checkpoint in dir and tells the others: path[0] = 0 when there
 * is none.  0, or -1 with err (every rank). */
static int find_resume(mgc_comm *world, const char *dir, char *path, size_t n, char *err, size_t errsz) {
    char msg[4200] = "";
    int64_t step = 0;
    int rc = 0;
    if (mgc_comm_rank(world) == 0) {
        rc = mgc_ckpt_latest(dir, msg + 1, sizeof msg - 1, &step, err, errsz);
        if (rc < 0) snprintf(msg + 1, sizeof msg - 1, "%s", err);
        msg[0] = rc < 0 ? 'E' : rc ? 'P' : 'N';
    }
    if (mgc_comm_broadcast(world, msg, sizeof msg, MGC_DT_U8, 0) != MGC_COMM_OK) {
        snprintf(err, errsz, "looking for a checkpoint: %s", mgc_comm_error(world));
        return -1;
    }
    msg[sizeof msg - 1] = 0;
    if (msg[0] == 'E') {
        snprintf(err, errsz, "%s", msg + 1);
        return -1;
    }
    snprintf(path, n, "%s", msg[0] == 'P' ? msg + 1 : "");
    return 0;
}

/* MoE load: layer l's busiest expert over the mean expert's tokens this step (1: balanced;
 * -1 for a dense layer), and the share of the step's assignments the MoE layers dropped
 * (capacity mode; 0 dropless). */
static double expert_imbalance(const mgc_step_stats *st, int64_t l) {
    const int64_t *c = st->expert_counts + l * st->moe_experts;
    int64_t most = 0, sum = 0;
    for (int64_t e = 0; e < st->moe_experts; e++)
        sum += c[e], most = c[e] > most ? c[e] : most;
    return sum > 0 ? (double)most * (double)st->moe_experts / (double)sum : -1.0;
}
static double expert_dropped(const mgc_step_stats *st) {
    int64_t layers = 0, kept = 0;
    for (int64_t l = 0; l < st->moe_layers; l++) {
        int64_t sum = 0;
        for (int64_t e = 0; e < st->moe_experts; e++)
            sum += st->expert_counts[l * st->moe_experts + e];
        if (sum > 0) layers++, kept += sum;
    }
    int64_t all = layers * st->moe_assignments;
    return all > 0 ? (double)(all - kept) / (double)all : 0.0;
}

/* The mean loss of `iters` global batches of `data` from its first sample, and the time it took:
 * 0, or -1 (mgc_exec_error says why). */
static int evaluate(mgc_exec *x, mgc_train_data *data, int64_t iters, double *loss, double *ms) {
    double t0 = now_s(), sum = 0;
    int64_t gbs = mgc_exec_global_batch(x);
    for (int64_t j = 0; j < iters; j++) {
        mgc_step_stats es;
        if (mgc_exec_eval(x, j * gbs, mgc_train_data_sample, data, &es)) return -1;
        sum += es.loss;
    }
    *loss = sum / (double)iters;
    *ms = (now_s() - t0) * 1e3;
    return 0;
}

/* The device communicator o->device_comm asks for, set on x: *own is the handle to free
 * after x (nccl), NULL when the caller owns it (local).  0, or -1 with err. */
static int device_comm(mgc_exec *x, mgc_backend *be, mgc_comm *world, mgc_comm *dlocal,
                       const mgc_train_opts *o, mgc_comm **own, char *err, size_t errsz) {
    const char *want = o->device_comm;
    mgc_comm *d = NULL;
    *own = NULL;
    int r = mgc_comm_world_rank(world);
    if (!strcmp(want, "local")) {
        if (!strcmp(be->iface->name, "cuda")) { /* the local transport reads the arena */
            snprintf(err, errsz,
                     "rank %d: --device-comm local needs an arena the host can read "
                     "(the cpu or emu backend); on GPUs use nccl",
                     r);
            return -1;
        }
        if (!dlocal) {
            snprintf(err, errsz,
                     "rank %d: --device-comm local needs ranks that are threads of "
                     "this process (--local-ranks)",
                     r);
            return -1;
        }
        d = dlocal;
    } else if (!strcmp(want, "nccl")) {
        if (strcmp(be->iface->name, "cuda")) {
            snprintf(err, errsz, "rank %d: --device-comm nccl needs the CUDA backend, not %s", r,
                     be->iface->name);
            return -1;
        }
        mgc_comm_config cc = MGC_COMM_CONFIG_INIT;
        cc.timeout_ms = o->timeout_ms;
        char e[1024];
        if (mgc_comm_nccl_world_create(world, device_of(world), &cc, &d, e, sizeof e) !=
            MGC_COMM_OK) {
            snprintf(err, errsz, "rank %d: %s", r, e);
            return -1;
        }
        *own = d;
    } else {
        snprintf(err, errsz, "rank %d: unknown device communicator '%s' (none, nccl or local)", r,
                 want);
        return -1;
    }
    if (mgc_exec_set_device_comm(x, d)) {
        snprintf(err, errsz, "%s", mgc_exec_error(x));
        return -1;
    }
    return 0;
}

/* Waits for the checkpoint in the background, if any (collective), and says so on `log`;
 * *longest: the longest save so far, raised to this one's duration. */
static int wait_save(mgc_ckpt_async **pending, mgc_comm *world, FILE *log, const char *dir, double *longest,
                     char *err, size_t errsz) {
    if (!*pending) return 0;
    int64_t step = mgc_ckpt_async_step(*pending);
    double secs = mgc_ckpt_async_seconds(*pending), t0 = now_s();
    if (mgc_ckpt_async_poll(pending, world, 1, err, errsz)) return -1;
    if (secs + now_s() - t0 > *longest) *longest = secs + now_s() - t0;
    if (log) {
        fprintf(log, "mgc-run: saved %s/step-%09" PRId64 ".mgck in the background (%.2f s)\n", dir, step,
                secs + now_s() - t0);
        fflush(log);
    }
    return 0;
}

static int train_rank(const mgc_plan *plan, mgc_train_data *data, mgc_comm *world, mgc_comm *dlocal,
                      const mgc_train_opts *o, char *err, size_t errsz) {
    double t_call = now_s();  /* the time limit counts from here */
    mgc_comm *dworld = NULL; /* a device communicator this function opened (nccl) */
    mgc_ckpt_async *pending = NULL; /* a checkpoint being written in the background */
    mgc_backend *be = NULL;
    mgc_exec *x = NULL;
    mgc_profile *prof = NULL;
    mgc_train_data *own_valid = NULL; /* the validation data, when o->valid is NULL */
    mgc_train_data *test = NULL;      /* the test split, evaluated after the last step */
    int rc = -1;
    char berr[512];
    const char *want = o->backend ? o->backend : "cpu";
    int cuda = !strcmp(want, "cuda") || (!strcmp(want, "auto") && mgc_backend_cuda_available());
    int brc = o->open_backend ? o->open_backend(o->open_ctx, mgc_comm_world_rank(world), &be, berr, sizeof berr)
              : cuda                 ? mgc_backend_cuda_open(&be, device_of(world), berr, sizeof berr)
              : !strcmp(want, "emu") ? mgc_backend_emu_open(&be, berr, sizeof berr)
                                     : mgc_backend_cpu_open(&be, berr, sizeof berr);
    if (brc) {
        snprintf(err, errsz, "rank %d: %s", mgc_comm_world_rank(world), berr);
        mgc_comm_abort(world, err);
        return -1;
    }
    be->iface->set_threads(be, o->threads > 0 ? o->threads : 1);
    if (o->profiles) {
        char device[256];
        mgc_profile_device_name(be->iface->name, device, sizeof device);
        if (mgc_profile_open(&prof, plan, mgc_comm_world_rank(world), be->iface->name, device, err,
                             errsz)) {
            mgc_comm_abort(world, err);
            goto done;
        }
        mgc_profile_set_device_timing(prof, be->iface->time_mark != NULL); /* as exec.c times */
    }
    if (mgc_exec_open(&x, plan, world, be, err, errsz)) {
        mgc_comm_abort(world, err);
        goto done;
    }
    int lead = mgc_exec_rank(x) == 0;
    if (o->device_comm && *o->device_comm && strcmp(o->device_comm, "none")) {
        if (device_comm(x, be, world, dlocal, o, &dworld, err, errsz)) {
            mgc_comm_abort(world, err);
            if (dlocal) mgc_comm_abort(dlocal, err);
            goto done;
        }
        if (lead && o->log)
            fprintf(o->log, "mgc-run: collectives on device memory through the %s communicator\n",
                    o->device_comm);
    }
    /* a checkpoint to resume from, else the seeded initial model */
    const char *cdir = o->checkpoint_dir ? o->checkpoint_dir : mgc_plan_config_str(plan, "checkpoint.directory");
    int ckpt = cdir && *cdir;
    int64_t c_every = 0, c_keep = 3, start = 0, e_every = 0, e_iters = 10;
    mgc_plan_config_int(plan, "training.eval_interval", &e_every);
    mgc_plan_config_int(plan, "training.eval_iters", &e_iters);
    mgc_train_data *valid = o->valid;
    if (e_every > 0 && !valid) {
        int64_t gbs = plan->micro_batch_size * plan->num_microbatches * plan->grid.dp;
        if (mgc_train_data_open_validation(&own_valid, plan, e_iters * gbs, err, errsz)) {
            mgc_comm_abort(world, err);
            goto done;
        }
        valid = own_valid;
    }
    if (e_every > 0) { /* the test split: Megatron's evaluation at the end of training */
        int64_t gbs = plan->micro_batch_size * plan->num_microbatches * plan->grid.dp;
        char terr[1024];
        int trc = mgc_train_data_open_test(&test, plan, e_iters * gbs, terr, sizeof terr);
        if (trc < 0) {
            snprintf(err, errsz, "the test split: %s", terr);
            mgc_comm_abort(world, err);
            goto done;
        }
        if (trc > 0 && lead && o->log) fprintf(o->log, "mgc-run: no test evaluation: %s\n", terr);
    }
    mgc_plan_config_int(plan, "checkpoint.interval", &c_every);
    mgc_plan_config_int(plan, "checkpoint.keep", &c_keep);
    int64_t async = o->async_save;
    if (!async) mgc_plan_config_int(plan, "checkpoint.async_save", &async);
    char cpath[4200] = "";
    if (ckpt && find_resume(world, cdir, cpath, sizeof cpath, err, errsz)) goto done;
    if (cpath[0]) {
        mgc_exec_resume r;
        if (mgc_ckpt_load(plan, x, world, cpath, 0, &r, err, errsz)) {
            mgc_comm_abort(world, err);
            goto done;
        }
        mgc_exec_set_resume(x, &r);
        start = r.iteration;
    } else if (o->init_from && *o->init_from) {
        if (mgc_ckpt_load(plan, x, world, o->init_from, 1, NULL, err, errsz)) {
            mgc_comm_abort(world, err);
            goto done;
        }
    } else if (mgc_exec_init_params(x)) {
        snprintf(err, errsz, "%s", mgc_exec_error(x));
        mgc_comm_abort(world, err);
        goto done;
    }
    if (o->resumed_from && (lead || strcmp(mgc_comm_transport(world), "local"))) *o->resumed_from = start;
    mgc_exec_set_graphs(x, o->graphs);
    mgc_exec_set_grad_overlap(x, !o->no_grad_overlap);
    mgc_exec_set_send_overlap(x, !o->no_send_overlap);
    int64_t iters = o->iterations, log_every = o->log_interval;
    if (iters <= 0) mgc_plan_config_int(plan, "training.iterations", &iters);
    if (log_every <= 0) mgc_plan_config_int(plan, "training.log_interval", &log_every);
    if (log_every <= 0) log_every = 10;
    /* local ranks share o's arrays (rank 0 fills them); a process of its own fills its own */
    int own_out = lead || strcmp(mgc_comm_transport(world), "local");
    char a[32];
    if (lead && o->log)
        fprintf(o->log,
                "mgc-run: %" PRId64 " rank%s (%s backend, %s communicator), arena %s per rank of "
                "stage 0 (%" PRIu64 " bytes), %" PRId64 " steps\n",
                plan->grid.world, plan->grid.world > 1 ? "s" : "", be->iface->name,
                mgc_comm_transport(world), mib(a, sizeof a, plan->stages[0].arena_bytes),
                plan->stages[0].arena_bytes, iters);
    if (lead && o->log && cpath[0])
        fprintf(o->log, "mgc-run: resumed from %s (step %" PRId64 ")%s%s\n", cpath, start,
                start >= iters ? ": at or past the last step, nothing to train" : "",
                o->init_from && *o->init_from ? " (its own checkpoint, not --init-from's)" : "");
    else if (lead && o->log && o->init_from && *o->init_from)
        fprintf(o->log, "mgc-run: the parameters of %s, a fresh optimizer, step 1\n", o->init_from);
    double t_start = now_s(), t_log = t_start, log_loss = 0;
    double longest_step = 0, longest_eval = 0, longest_save = 0; /* what the time limit must leave room for */
    int timed_out = 0;
    int64_t log_n = 0, log_tokens = 0;
    for (int64_t it = start; it < iters; it++) {
        mgc_step_stats st;
        /* the warm-up steps are not recorded (first-call costs: allocations, JIT, caches) */
        mgc_exec_set_profile(x, it - start >= o->profile_warmup ? prof : NULL);
        double t0 = now_s();
        if (mgc_exec_step(x, it, mgc_train_data_sample, data, &st)) {
            snprintf(err, errsz, "step %" PRId64 ": %s", it + 1, mgc_exec_error(x));
            goto done;
        }
        double dt = now_s() - t0;
        if (own_out) { /* every rank has the same numbers: one writes the shared arrays */
            if (o->expert_counts && st.expert_counts) {
                size_t n = (size_t)(st.moe_layers * st.moe_experts);
                memcpy(o->expert_counts + (size_t)it * n, st.expert_counts, n * sizeof(int64_t));
            }
            if (o->losses) o->losses[it] = st.loss;
            if (o->grad_norms) o->grad_norms[it] = st.grad_norm;
            if (o->overlapped) o->overlapped[it] = st.overlapped_buckets;
        }
        log_loss += st.loss;
        log_n++;
        log_tokens += st.tokens;
        /* a checkpoint in the background: every rank asks after each step (one all-reduce) */
        if (pending) {
            int64_t ps = mgc_ckpt_async_step(pending);
            double secs = mgc_ckpt_async_seconds(pending);
            int pr = mgc_ckpt_async_poll(&pending, world, 0, err, errsz);
            if (pr < 0) goto done;
            if (pr == 0 && secs > longest_save) longest_save = secs;
            if (pr == 0 && lead && o->log)
                fprintf(o->log, "mgc-run: saved %s/step-%09" PRId64 ".mgck in the background (%.2f s)\n", cdir,
                        ps, secs);
        }
        /* a stop request, or the time limit near: every rank stops after the same step */
        int stop = 0;
        longest_step = dt > longest_step ? dt : longest_step;
        int out_of_time = o->time_limit_s > 0 &&
                          now_s() - t_call + longest_step + longest_eval + longest_save > o->time_limit_s;
        if (o->stop || o->time_limit_s > 0) {
            float mine = (o->stop && *o->stop) ? 1.0f : out_of_time ? 2.0f : 0.0f, any = 0;
            if (mgc_comm_all_reduce(world, &mine, &any, 1, MGC_DT_F32, MGC_COMM_MAX) != MGC_COMM_OK) {
                snprintf(err, errsz, "step %" PRId64 ": agreeing on a stop: %s", it + 1, mgc_comm_error(world));
                goto done;
            }
            stop = any > 0;
            timed_out = any == 2.0f;
            if (stop && o->stopped_after && own_out) *o->stopped_after = it + 1;
        }
        /* the validation loss: eval_iters global batches, the same every time; and after the
         * run's last step (not a stop request's), the test split's, as many batches */
        double eval_loss = NAN, eval_ms = 0, test_loss = NAN, test_ms = 0;
        if (e_every > 0 && ((it + 1) % e_every == 0 || it + 1 == iters || stop)) {
            if (evaluate(x, valid, e_iters, &eval_loss, &eval_ms)) {
                snprintf(err, errsz, "evaluation after step %" PRId64 ": %s", it + 1, mgc_exec_error(x));
                goto done;
            }
            t_log += eval_ms / 1e3; /* not in the next line's tokens/s */
            longest_eval = eval_ms / 1e3 > longest_eval ? eval_ms / 1e3 : longest_eval;
            if (o->eval_losses && own_out) o->eval_losses[it] = eval_loss;
        }
        if (test && it + 1 == iters && !stop) {
            if (evaluate(x, test, e_iters, &test_loss, &test_ms)) {
                snprintf(err, errsz, "test evaluation after step %" PRId64 ": %s", it + 1, mgc_exec_error(x));
                goto done;
            }
            t_log += test_ms / 1e3;
            if (o->test_loss && own_out) *o->test_loss = test_loss;
        }
        if (lead && o->metrics) {
            char gn[32] = "null"; /* an overflowed (skipped) step's norm is not a JSON number */
            if (isfinite(st.grad_norm)) snprintf(gn, sizeof gn, "%.9g", st.grad_norm);
            fprintf(o->metrics,
                    "{\"step\": %" PRId64 ", \"loss\": %.9g, \"lr\": %.9g, \"grad_norm\": %s, "
                    "\"tokens\": %" PRId64 ", \"tokens_per_s\": %.6g, \"step_ms\": %.6g, "
                    "\"arena_bytes\": %" PRIu64,
                    it + 1, st.loss, st.lr, gn, st.tokens, (double)st.tokens / dt,
                    dt * 1e3, mgc_exec_arena_bytes(x));
            if (st.aux_loss != 0 || st.z_loss != 0)
                fprintf(o->metrics, ", \"aux_loss\": %.9g, \"z_loss\": %.9g", st.aux_loss, st.z_loss);
            if (st.loss_scale > 0)
                fprintf(o->metrics, ", \"loss_scale\": %.9g, \"skipped\": %s", st.loss_scale,
                        st.skipped ? "true" : "false");
            if (st.expert_counts) { /* each MoE layer's busiest expert over the mean */
                fputs(", \"moe_max_over_mean\": [", o->metrics);
                int first = 1;
                for (int64_t l = 0; l < st.moe_layers; l++) {
                    double r = expert_imbalance(&st, l);
                    if (r < 0) continue;
                    fprintf(o->metrics, "%s%.6g", first ? "" : ", ", r);
                    first = 0;
                }
                fprintf(o->metrics, "], \"moe_dropped\": %.6g", expert_dropped(&st));
                if (st.expert_bias) { /* each MoE layer's largest expert bias, in magnitude */
                    fputs(", \"moe_bias_absmax\": [", o->metrics);
                    first = 1;
                    for (int64_t l = 0; l < st.moe_layers; l++) {
                        if (expert_imbalance(&st, l) < 0) continue;
                        double m = 0;
                        for (int64_t e = 0; e < st.moe_experts; e++)
                            m = fmax(m, fabs(st.expert_bias[l * st.moe_experts + e]));
                        fprintf(o->metrics, "%s%.6g", first ? "" : ", ", m);
                        first = 0;
                    }
                    fputc(']', o->metrics);
                }
            }
            if (st.staged_bytes > 0)
                fprintf(o->metrics, ", \"staged_bytes\": %" PRId64, st.staged_bytes);
            if (st.overlapped_buckets > 0)
                fprintf(o->metrics, ", \"overlapped_buckets\": %" PRId64, st.overlapped_buckets);
            if (st.overlapped_sends > 0)
                fprintf(o->metrics, ", \"overlapped_sends\": %" PRId64, st.overlapped_sends);
            if (eval_loss == eval_loss)
                fprintf(o->metrics, ", \"eval_loss\": %.9g, \"eval_ppl\": %.9g, \"eval_ms\": %.6g", eval_loss,
                        exp(eval_loss), eval_ms);
            if (test_loss == test_loss)
                fprintf(o->metrics, ", \"test_loss\": %.9g, \"test_ppl\": %.9g, \"test_ms\": %.6g", test_loss,
                        exp(test_loss), test_ms);
            fputs("}\n", o->metrics);
            fflush(o->metrics);
        }
        if (lead && o->log && ((it + 1) % log_every == 0 || it + 1 == iters || it == 0 || stop)) {
            double t = now_s(), span = t - t_log;
            fprintf(o->log,
                    "step %6" PRId64 "/%" PRId64 " | loss %.4f | lr %.3e | grad norm %.3f | %8.0f "
                    "tokens/s | %7.1f ms/step | arena %s",
                    it + 1, iters, log_loss / (double)log_n, st.lr, st.grad_norm,
                    span > 0 ? (double)log_tokens / span : 0.0, span * 1e3 / (double)log_n,
                    mib(a, sizeof a, mgc_exec_arena_bytes(x)));
            if (st.aux_loss != 0 || st.z_loss != 0)
                fprintf(o->log, " | aux %.4f | z %.5f", st.aux_loss, st.z_loss);
            if (st.expert_counts) {
                double worst = 0, dropped = expert_dropped(&st);
                for (int64_t l = 0; l < st.moe_layers; l++) {
                    double r = expert_imbalance(&st, l);
                    if (r > worst) worst = r;
                }
                fprintf(o->log, " | experts max/mean %.2f", worst);
                if (dropped > 0) fprintf(o->log, " | dropped %.1f%%", 100 * dropped);
            }
            if (st.loss_scale > 0) fprintf(o->log, " | loss scale %.6g", st.loss_scale);
            if (st.skipped) fprintf(o->log, " | overflow: step skipped");
            fputc('\n', o->log);
            fflush(o->log);
            t_log = t, log_loss = 0, log_n = 0, log_tokens = 0;
        }
        if (lead && o->log && eval_loss == eval_loss) {
            fprintf(o->log, "validation after step %" PRId64 " | loss %.4f | perplexity %.3f | %" PRId64
                            " batches in %.1f ms\n",
                    it + 1, eval_loss, exp(eval_loss), e_iters, eval_ms);
            fflush(o->log);
        }
        if (lead && o->log && test_loss == test_loss) {
            fprintf(o->log, "test after step %" PRId64 " | loss %.4f | perplexity %.3f | %" PRId64
                            " batches in %.1f ms\n",
                    it + 1, test_loss, exp(test_loss), e_iters, test_ms);
            fflush(o->log);
        }
        if (ckpt && (stop || (c_every > 0 && (it + 1) % c_every == 0) || it + 1 == iters)) {
            double c0 = now_s();
            if (async) { /* one save in flight at a time: the one before finishes first */
                if (wait_save(&pending, world, lead ? o->log : NULL, cdir, &longest_save, err, errsz)) goto done;
                if (mgc_ckpt_save_async(plan, x, world, cdir, it + 1, c_keep, &pending, err, errsz)) goto done;
                if (lead && o->log)
                    fprintf(o->log, "mgc-run: saving %s/step-%09" PRId64 ".mgck in the background (values copied in %.2f s)\n",
                            cdir, it + 1, now_s() - c0);
            } else {
                if (mgc_ckpt_save(plan, x, world, cdir, it + 1, c_keep, err, errsz)) goto done;
                if (lead && o->log)
                    fprintf(o->log, "mgc-run: saved %s/step-%09" PRId64 ".mgck in %.2f s\n", cdir, it + 1,
                            now_s() - c0);
            }
            t_log += now_s() - c0; /* not in the next line's tokens/s */
            longest_save = now_s() - c0 > longest_save ? now_s() - c0 : longest_save;
        }
        if (stop) {
            if (lead && o->log)
                fprintf(o->log, "mgc-run: stopped %s after step %" PRId64 "%s\n",
                        timed_out ? "before the time limit" : "on request", it + 1,
                        ckpt ? ": run again to resume from its checkpoint" : " (no checkpoint directory: nothing saved)");
            iters = it + 1;
            break;
        }
    }
    if (wait_save(&pending, world, lead ? o->log : NULL, cdir, &longest_save, err, errsz)) goto done;
    if (lead && o->log) {
        double t = now_s() - t_start;
        fprintf(o->log, "mgc-run: %" PRId64 " steps in %.2f s\n", iters > start ? iters - start : 0, t);
    }
    if (prof) o->profiles[mgc_comm_world_rank(world)] = prof, prof = NULL;
    rc = 0;
done:
    mgc_ckpt_async_abandon(pending);
    mgc_train_data_free(own_valid);
    mgc_train_data_free(test);
    mgc_profile_free(prof);
    mgc_exec_free(x);
    mgc_comm_free(dworld);
    mgc_backend_close(be);
    return rc;
}

int mgc_train_rank(const mgc_plan *plan, mgc_train_data *data, mgc_comm *world,
                   const mgc_train_opts *o, char *err, size_t errsz) {
    return train_rank(plan, data, world, NULL, o, err, errsz);
}

typedef struct job {
    const mgc_plan *plan;
    mgc_train_data *data;
    mgc_comm *world;
    mgc_comm *dworld; /* o->device_comm "local": this rank's moves-only world, else NULL */
    const mgc_train_opts *o;
    int rc;
    char err[2048];
} job;

static void *rank_main(void *arg) {
    job *j = arg;
    j->rc = train_rank(j->plan, j->data, j->world, j->dworld, j->o, j->err, sizeof j->err);
    mgc_comm_free(j->world);
    mgc_comm_free(j->dworld);
    return NULL;
}

int mgc_train_local(const mgc_plan *plan, mgc_train_data *data, int n, const mgc_train_opts *o,
                    char *err, size_t errsz) {
    if (n != plan->grid.world) {
        snprintf(err, errsz,
                 "the plan is for %" PRId64 " ranks but --local-ranks is %d: use --local-ranks "
                 "%" PRId64 " (or recompile with parallel.world_size %d)",
                 plan->grid.world, n, plan->grid.world, n);
        return -1;
    }
    mgc_comm **ranks = calloc(2 * (size_t)n, sizeof *ranks), **dranks = ranks ? ranks + n : NULL;
    int dlocal = o->device_comm && !strcmp(o->device_comm, "local");
    job *jobs = calloc((size_t)n, sizeof *jobs);
    pthread_t *th = calloc((size_t)n, sizeof *th);
    if (!ranks || !jobs || !th) {
        free(ranks), free(jobs), free(th);
        snprintf(err, errsz, "out of memory");
        return -1;
    }
    mgc_comm_config cc = MGC_COMM_CONFIG_INIT;
    cc.timeout_ms = o->timeout_ms;
    if (mgc_comm_local_world_create(n, &cc, ranks, err, errsz) != MGC_COMM_OK) {
        free(ranks), free(jobs), free(th);
        return -1;
    }
    if (dlocal) { /* the device communicator's world: moves-only, on the same threads */
        cc.moves_only = 1;
        if (mgc_comm_local_world_create(n, &cc, dranks, err, errsz) != MGC_COMM_OK) {
            for (int r = 0; r < n; r++)
                mgc_comm_free(ranks[r]);
            free(ranks), free(jobs), free(th);
            return -1;
        }
    }
    int started = 0;
    for (int r = 0; r < n; r++) {
        jobs[r] = (job){plan, data, ranks[r], dlocal ? dranks[r] : NULL, o, -1, ""};
        /* rank 0 reports; the others compute silently */
        if (pthread_create(&th[r], NULL, rank_main, &jobs[r])) {
            mgc_comm_abort(ranks[r], "cannot start a rank thread");
            if (dlocal) mgc_comm_abort(dranks[r], "cannot start a rank thread");
            for (int q = r; q < n; q++)
                mgc_comm_free(ranks[q]), mgc_comm_free(dlocal ? dranks[q] : NULL);
            break;
        }
        started++;
    }
    int rc = started == n ? 0 : -1;
    if (rc) snprintf(err, errsz, "cannot start %d rank threads", n);
    for (int r = 0; r < started; r++)
        pthread_join(th[r], NULL);
    /* the first failure names the cause; later ones are usually "aborted" echoes */
    for (int r = 0; r < started && rc == 0; r++)
        if (jobs[r].rc) {
            rc = -1;
            int pick = r;
            for (int q = 0; q < started; q++)
                if (jobs[q].rc && !strstr(jobs[q].err, "aborted")) {
                    pick = q;
                    break;
                }
            snprintf(err, errsz, "%s", jobs[pick].err);
        }
    free(ranks), free(jobs), free(th);
    return rc;
}
