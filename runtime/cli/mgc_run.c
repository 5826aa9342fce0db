/* mgc_run.c - mgc-run, the lean runtime: reads a plan file (never the YAML:
 * no libyaml, no compiler code is linked) and trains it.
 *
 *     mgc-run PLAN [--local-ranks N] [--backend cpu] [--threads N]
 *                  [--iterations N] [--log-interval N] [--metrics FILE]
 *                  [--profile FILE [--profile-warmup N]] [--no-cuda-graphs]
 *                  [--no-grad-overlap] [--no-send-overlap] [--checkpoint-dir DIR]
 *                  [--async-save] [--time-limit DURATION] [--init-from CKPT] [-q]
 *     mpirun -np N mgc-run PLAN ...            # one process per rank
 *     RANK=r WORLD_SIZE=N MASTER_ADDR=host MASTER_PORT=p mgc-run PLAN ...
 *                                              # the same over TCP (torchrun --no-python)
 *
 * Every check that can fail on bad input (the plan, the launch size, the
 * dataset, the metrics and profile paths, the checkpoint directory and the
 * checkpoint resumed from) runs before the first step; exit status 0 ok,
 * 1 an error, 2 a usage error.  docs/runtime.md is the manual. */
#include <errno.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "backend.h"
#include "checkpoint.h"
#include "comm.h"
#include "exec.h"
#include "plan.h"
#include "profile.h"
#include "train.h"
#include "train_data.h"

static void usage(FILE *out) {
    fputs("usage: mgc-run PLAN [options]\n"
          "       mpirun -np N mgc-run PLAN [options]\n"
          "       RANK=r WORLD_SIZE=N MASTER_ADDR=HOST MASTER_PORT=P mgc-run PLAN [options]\n"
          "                     (one process per rank over TCP, as torchrun --no-python starts)\n"
          "\n"
          "Trains the plan `mgc compile` wrote (docs/runtime.md, docs/getting-started.md).\n"
          "\n"
          "options:\n"
          "  --local-ranks N    run N ranks as threads of this process (N = the plan's world size;\n"
          "                     default 1 outside mpirun and a TCP launch)\n"
          "  --backend NAME     cpu (the fp32 reference), cuda (rank r on GPU r mod the visible\n"
          "                     GPUs; communication through host memory), auto (default: cuda\n"
          "                     when a GPU is visible and this build has CUDA, else cpu), or emu\n"
          "                     (the CUDA backend's kernels run on the CPU by the CUDA emulator:\n"
          "                     slow; for debugging kernels without a GPU, docs/cuda-emulator.md)\n"
          "  --threads N        BLAS threads per rank (default 1)\n"
          "  --iterations N     steps to run (default: the plan's training.iterations); with\n"
          "                     checkpoints, the step to stop after, counted from the job's start\n"
          "  --checkpoint-dir DIR\n"
          "                     save checkpoints in DIR and resume from its newest (default: the\n"
          "                     plan's checkpoint.directory; docs/checkpoints.md); SIGTERM,\n"
          "                     SIGINT or SIGUSR1 then saves after the current step and stops\n"
          "  --async-save       write checkpoints in the background while training goes on (as\n"
          "                     checkpoint.async_save: true; each rank holds a host copy of its\n"
          "                     share, 12 bytes a parameter, until its part is written)\n"
          "  --time-limit T     stop, with a checkpoint, while the time left since mgc-run started\n"
          "                     still holds another step and a save: T in minutes, or 90s, 30m, 4h\n"
          "                     (a batch job's wall-clock limit; run again to resume)\n"
          "  --init-from CKPT   start from the parameters of checkpoint CKPT (any layout of the\n"
          "                     model) with a fresh optimizer at step 1: fine-tuning.  A\n"
          "                     checkpoint in the checkpoint directory takes precedence\n"
          "  --log-interval N   steps between progress lines (default: training.log_interval)\n"
          "  --metrics FILE     write one JSON object per step (JSON lines, docs/runtime.md)\n"
          "  --profile FILE     time every op (on the device where the backend can) and every\n"
          "                     instruction (slower steps: the backend is synchronised around\n"
          "                     each) and write the sums to FILE as JSON lines; one process per\n"
          "                     rank: rank k > 0 writes FILE.rank<k>\n"
          "  --profile-warmup N steps not recorded by --profile (default 1; below --iterations)\n"
          "  --no-cuda-graphs   cuda backend: issue every op of every step, instead of recording\n"
          "                     each forward and backward program that qualifies as a CUDA graph\n"
          "                     on its second run and replaying it after (docs/runtime.md, the\n"
          "                     default; --cuda-graphs asks for that default explicitly)\n"
          "  --no-grad-overlap  reduce each gradient bucket at the step's end, not on a second\n"
          "                     thread as soon as the backward has finished it (the same numbers;\n"
          "                     --profile runs, and MPI without MPI_THREAD_MULTIPLE, always do)\n"
          "  --no-send-overlap  cuda backend, pipeline stages: send activations and gradients on\n"
          "                     this thread at their instruction, not from the pipeline-transfer\n"
          "                     stream and a second thread beside the compute (the same numbers)\n"
          "  --device-comm NAME collectives and pipeline transfers on device memory: none\n"
          "                     (default: through the world, staged in host memory), nccl (cuda\n"
          "                     backend: NCCL, reductions folded in group-rank order by mgc's\n"
          "                     kernel, the same numbers; not yet run on GPUs), or local\n"
          "                     (--local-ranks on the cpu or emu backend: the same path over\n"
          "                     threads, for testing).  docs/communicators.md\n"
          "  -q, --quiet        no progress lines\n"
          "\n"
          "exit status: 0 ok, 1 error, 2 usage error\n",
          out);
}

/* A duration: a number of minutes (Megatron's --exit-duration-in-mins), or with a unit: 90s,
 * 30m, 4h.  Seconds out; -1 when it is not one, or not above 0. */
static double parse_duration(const char *s) {
    char *end = NULL;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || !end || end == s || !(v > 0) || v > 1e9) return -1;
    double unit = !*end ? 60 : !strcmp(end, "s") ? 1 : !strcmp(end, "m") ? 60 : !strcmp(end, "h") ? 3600 : -1;
    return unit < 0 ? -1 : v * unit;
}

static double mono_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static int parse_int(const char *s, int64_t lo, int64_t hi, int64_t *out) {
    char *end = NULL;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno || !end || *end || end == s || v < lo || v > hi) return -1;
    *out = v;
    return 0;
}

/* Creates PATH.partial for writing (it becomes PATH when the run succeeds).
 * A PATH that is a device or a pipe (/dev/null) is written in place and
 * `partial` is left empty: renaming over it would replace the device. */
static FILE *open_partial(const char *path, char *partial, size_t n, const char *what,
                          const char *opt) {
    if (mgc_path_is_special(path)) partial[0] = 0;
    else snprintf(partial, n, "%s.partial", path);
    FILE *f = fopen(partial[0] ? partial : path, "w");
    if (!f)
        fprintf(stderr, "mgc-run: cannot write the %s file %s: %s (choose a writable path with %s)\n",
                what, partial[0] ? partial : path, strerror(errno), opt);
    return f;
}

/* PATH.partial becomes PATH (nothing to do when written in place); 0 ok. */
static int commit_partial(const char *partial, const char *path) {
    return partial[0] ? rename(partial, path) : 0;
}

/* Removes PATH.partial (never a file written in place). */
static void drop_partial(const char *partial) {
    if (partial[0]) remove(partial);
}

/* Writes the profiles to `f` (PARTIAL), makes them durable and renames PARTIAL to PATH;
 * on any failure the partial file is removed and the message names PATH. */
static int finish_profile(FILE *f, const char *partial, const char *path, mgc_profile *const *ranks,
                          int n, const mgc_profile_info *info) {
    int missing = 0;
    for (int r = 0; r < n; r++)
        missing |= !ranks[r];
    errno = missing ? EINVAL : 0;
    int bad = missing || mgc_profile_write(f, ranks, n, info) != 0 || fflush(f) != 0 ||
              fsync(fileno(f)) != 0;
    int e = errno;
    if (fclose(f) != 0 && !bad) bad = 1, e = errno;
    if (!bad && commit_partial(partial, path)) bad = 1, e = errno;
    if (bad) {
        drop_partial(partial);
        fprintf(stderr, "mgc-run: cannot write the profile file %s: %s\n", path, strerror(e));
        return -1;
    }
    return 0;
}

/* SIGTERM, SIGINT or SIGUSR1 while checkpoints are on: finish the step, save, stop (a batch
 * system's notice before preemption, or ^C).  A second one kills as usual. */
static volatile int stop_requested;
static void on_stop(int sig) {
    (void)sig;
    stop_requested = 1;
}

static int under_mpi(void) {
    return getenv("OMPI_COMM_WORLD_SIZE") || getenv("PMI_SIZE") || getenv("PMIX_RANK");
}

int main(int argc, char **argv) {
    const char *plan_path = NULL, *metrics_path = NULL, *profile_path = NULL, *backend = "auto";
    double t_main = mono_s(), time_limit = 0;
    const char *ckpt_dir = NULL, *init_from = NULL, *device_comm = "none";
    int64_t local = 0, threads = 1, iters = 0, log_every = 0, warmup = -1;
    int quiet = 0, graphs = 1, no_overlap = 0, no_send_overlap = 0, async_save = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        int64_t *target = NULL, lo = 1, hi = 4096;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) return usage(stdout), 0;
        if (!strcmp(a, "-q") || !strcmp(a, "--quiet")) {
            quiet = 1;
            continue;
        }
        if (!strcmp(a, "--cuda-graphs") || !strcmp(a, "--no-cuda-graphs")) {
            graphs = !strcmp(a, "--cuda-graphs");
            continue;
        }
        if (!strcmp(a, "--no-grad-overlap")) {
            no_overlap = 1;
            continue;
        }
        if (!strcmp(a, "--no-send-overlap")) {
            no_send_overlap = 1;
            continue;
        }
        if (!strcmp(a, "--async-save")) {
            async_save = 1;
            continue;
        }
        if (!strcmp(a, "--time-limit")) {
            if (i + 1 >= argc || (time_limit = parse_duration(argv[i + 1])) < 0) {
                fprintf(stderr, "mgc-run: --time-limit needs a duration above 0: minutes, or with a unit "
                                "(90s, 30m, 4h)%s%s%s\n",
                        i + 1 < argc ? " (got '" : "", i + 1 < argc ? argv[i + 1] : "", i + 1 < argc ? "')" : "");
                return 2;
            }
            i++;
            continue;
        }
        if (!strcmp(a, "--local-ranks")) target = &local;
        else if (!strcmp(a, "--threads")) target = &threads, hi = 1024;
        else if (!strcmp(a, "--iterations")) target = &iters, hi = INT64_MAX / 2;
        else if (!strcmp(a, "--log-interval")) target = &log_every, hi = INT64_MAX / 2;
        else if (!strcmp(a, "--profile-warmup")) target = &warmup, lo = 0, hi = INT64_MAX / 2;
        else if (!strcmp(a, "--metrics") || !strcmp(a, "--backend") || !strcmp(a, "--profile") ||
                 !strcmp(a, "--checkpoint-dir") || !strcmp(a, "--init-from") ||
                 !strcmp(a, "--device-comm")) {
            if (i + 1 >= argc) {
                fprintf(stderr, "mgc-run: %s needs a value (see mgc-run --help)\n", a);
                return 2;
            }
            if (!strcmp(a, "--metrics")) metrics_path = argv[++i];
            else if (!strcmp(a, "--profile")) profile_path = argv[++i];
            else if (!strcmp(a, "--checkpoint-dir")) ckpt_dir = argv[++i];
            else if (!strcmp(a, "--init-from")) init_from = argv[++i];
            else if (!strcmp(a, "--device-comm")) device_comm = argv[++i];
            else backend = argv[++i];
            continue;
        } else if (a[0] == '-' && a[1]) {
            fprintf(stderr, "mgc-run: unknown option '%s' (see mgc-run --help)\n", a);
            return 2;
        } else {
            if (plan_path) {
                fprintf(stderr, "mgc-run: give one plan file (got '%s' and '%s')\n", plan_path, a);
                return 2;
            }
            plan_path = a;
            continue;
        }
        if (i + 1 >= argc || parse_int(argv[i + 1], lo, hi, target)) {
            fprintf(stderr, "mgc-run: %s needs an integer in %" PRId64 "..%" PRId64 "%s%s%s\n", a, lo,
                    hi, i + 1 < argc ? " (got '" : "", i + 1 < argc ? argv[i + 1] : "",
                    i + 1 < argc ? "')" : "");
            return 2;
        }
        i++;
    }
    if (!plan_path) {
        usage(stderr);
        return 2;
    }
    if (warmup >= 0 && !profile_path) {
        fprintf(stderr, "mgc-run: --profile-warmup needs --profile FILE (see mgc-run --help)\n");
        return 2;
    }
    if (warmup < 0) warmup = 1;
    if (strcmp(backend, "cpu") && strcmp(backend, "auto") && strcmp(backend, "cuda") &&
        strcmp(backend, "emu")) {
        fprintf(stderr, "mgc-run: --backend %s: choose cpu, cuda, auto (cuda when a GPU is "
                        "visible, else cpu) or emu (the CUDA emulator)\n",
                backend);
        return 2;
    }
    if (!strcmp(backend, "auto")) backend = mgc_backend_cuda_available() ? "cuda" : "cpu";
    if (strcmp(device_comm, "none") && strcmp(device_comm, "nccl") &&
        strcmp(device_comm, "local")) {
        fprintf(stderr, "mgc-run: --device-comm %s: choose none, nccl (cuda backend) or local "
                        "(--local-ranks on the cpu or emu backend)\n",
                device_comm);
        return 2;
    }
    if (!strcmp(device_comm, "nccl") && strcmp(backend, "cuda")) {
        fprintf(stderr, "mgc-run: --device-comm nccl needs the cuda backend (this run's is %s)\n",
                backend);
        return 2;
    }
    if (!strcmp(device_comm, "local") && strcmp(backend, "cpu") && strcmp(backend, "emu")) {
        fprintf(stderr, "mgc-run: --device-comm local reads the arena from the host: the cpu or "
                        "emu backend only (this run's is %s; on GPUs use nccl)\n",
                backend);
        return 2;
    }
    char err[4096];
    mgc_plan *plan = NULL;
    if (mgc_plan_read(plan_path, &plan, err, sizeof err) != MGC_PLAN_OK) {
        fprintf(stderr, "mgc-run: %s\n", err);
        return 1;
    }
    if (mgc_exec_check_plan(plan, backend, err, sizeof err)) {
        fprintf(stderr, "mgc-run: %s: %s\n", plan_path, err);
        mgc_plan_free(plan);
        return 1;
    }
    if (!ckpt_dir) ckpt_dir = mgc_plan_config_str(plan, "checkpoint.directory");
    if (ckpt_dir && !*ckpt_dir) ckpt_dir = NULL;
    if (async_save && !ckpt_dir) {
        fprintf(stderr, "mgc-run: --async-save needs checkpoints: give --checkpoint-dir DIR (or compile with "
                        "checkpoint.directory)\n");
        mgc_plan_free(plan);
        return 2;
    }
    /* one rank per process: under mpirun, or started the torchrun way over TCP */
    int use_mpi = !local && under_mpi();
    int use_tcp = !local && !use_mpi && mgc_comm_tcp_env();
    int procs = use_mpi || use_tcp;
    mgc_comm *world = NULL;
    int rank = 0;
    if (procs) {
        mgc_comm_config cc = MGC_COMM_CONFIG_INIT;
        if ((use_mpi ? mgc_comm_mpi_world_create(&cc, &world, err, sizeof err)
                     : mgc_comm_tcp_world_create(&cc, &world, err, sizeof err)) != MGC_COMM_OK) {
            fprintf(stderr, "mgc-run: %s\n", err);
            mgc_plan_free(plan);
            return 1;
        }
        rank = mgc_comm_world_rank(world);
        if (mgc_comm_size(world) != plan->grid.world) {
            if (rank == 0 && use_mpi)
                fprintf(stderr,
                        "mgc-run: %s: the plan is for %" PRId64 " ranks but mpirun started %d: "
                        "run mpirun -np %" PRId64 " (or recompile with parallel.world_size %d)\n",
                        plan_path, plan->grid.world, mgc_comm_size(world), plan->grid.world,
                        mgc_comm_size(world));
            else if (rank == 0)
                fprintf(stderr,
                        "mgc-run: %s: the plan is for %" PRId64 " ranks but WORLD_SIZE is %d: "
                        "start %" PRId64 " processes with WORLD_SIZE=%" PRId64
                        " (or recompile with parallel.world_size %d)\n",
                        plan_path, plan->grid.world, mgc_comm_size(world), plan->grid.world,
                        plan->grid.world, mgc_comm_size(world));
            mgc_comm_free(world);
            mgc_plan_free(plan);
            return 1;
        }
    } else {
        if (!local) local = 1;
        if (local != plan->grid.world) {
            fprintf(stderr,
                    "mgc-run: %s: the plan is for %" PRId64 " ranks (tensor %" PRId64
                    " x context %" PRId64 " x data %" PRId64 " x pipeline %" PRId64
                    ") but %" PRId64 " %s launched: run --local-ranks %" PRId64
                    " or mpirun -np %" PRId64 ", or recompile with parallel.world_size %" PRId64 "\n",
                    plan_path, plan->grid.world, plan->grid.tp, plan->grid.cp, plan->grid.dp,
                    plan->grid.pp, local, local == 1 ? "was" : "were", plan->grid.world,
                    plan->grid.world, local);
            mgc_plan_free(plan);
            return 1;
        }
    }
    int64_t run_iters = iters;
    if (run_iters <= 0) mgc_plan_config_int(plan, "training.iterations", &run_iters);
    if (profile_path && warmup >= run_iters) {
        if (rank == 0)
            fprintf(stderr, "mgc-run: --profile-warmup %" PRId64 " leaves no step to record of the %" PRId64
                            " steps: give a warm-up below the iterations (--iterations N, default "
                            "training.iterations)\n",
                    warmup, run_iters);
        mgc_comm_free(world);
        mgc_plan_free(plan);
        return 2;
    }
    /* checkpoints: a writable directory before the first step; the data is the job's
     * (training.iterations), so a resumed run reads the samples an unbroken one would */
    int64_t data_iters = run_iters;
    if (ckpt_dir) {
        int64_t job = 0;
        mgc_plan_config_int(plan, "training.iterations", &job);
        if (job > data_iters) data_iters = job;
        if (mgc_ckpt_prepare_dir(ckpt_dir, err, sizeof err)) { /* every process: none waits alone */
            if (rank == 0) fprintf(stderr, "mgc-run: %s: %s\n", plan_path, err);
            mgc_comm_free(world);
            mgc_plan_free(plan);
            return 1;
        }
    }
    /* --init-from: a readable checkpoint before the data is built (every value is checked
     * against the plan's model when the ranks load it) */
    if (init_from) {
        mgc_ckpt_info info;
        if (mgc_ckpt_read_info(init_from, &info, err, sizeof err)) {
            if (rank == 0) fprintf(stderr, "mgc-run: %s: --init-from %s\n", plan_path, err);
            mgc_comm_free(world);
            mgc_plan_free(plan);
            return 1;
        }
        mgc_ckpt_info_free(&info);
    }
    mgc_train_data *data = NULL;
    if (mgc_train_data_open(&data, plan, data_iters, err, sizeof err)) {
        if (rank == 0) fprintf(stderr, "mgc-run: %s: %s\n", plan_path, err);
        mgc_comm_free(world);
        mgc_plan_free(plan);
        return 1;
    }
    /* the metrics go to FILE.partial and become FILE when the run succeeds */
    FILE *metrics = NULL;
    char partial[4200] = "";
    if (metrics_path && rank == 0) {
        metrics = open_partial(metrics_path, partial, sizeof partial, "metrics", "--metrics");
        if (!metrics) {
            mgc_train_data_free(data);
            mgc_comm_free(world);
            mgc_plan_free(plan);
            return 1;
        }
    }
    /* the profile too: rank 0 writes FILE (all local ranks), MPI rank k > 0 FILE.rank<k> */
    FILE *prof_f = NULL;
    char prof_path[4200] = "", prof_partial[4300] = "";
    mgc_profile **profiles = NULL;
    if (profile_path) {
        if (rank == 0) snprintf(prof_path, sizeof prof_path, "%s", profile_path);
        else snprintf(prof_path, sizeof prof_path, "%s.rank%d", profile_path, rank);
        profiles = calloc((size_t)plan->grid.world, sizeof *profiles);
        if (profiles)
            prof_f = open_partial(prof_path, prof_partial, sizeof prof_partial, "profile", "--profile");
        else fprintf(stderr, "mgc-run: out of memory\n");
        if (!prof_f) {
            free(profiles);
            if (metrics) fclose(metrics), drop_partial(partial);
            mgc_train_data_free(data);
            mgc_comm_free(world);
            mgc_plan_free(plan);
            return 1;
        }
    }
    /* evaluation: the validation part of data.split, opened before the first step */
    mgc_train_data *valid = NULL;
    int64_t e_every = 0, e_iters = 10;
    mgc_plan_config_int(plan, "training.eval_interval", &e_every);
    mgc_plan_config_int(plan, "training.eval_iters", &e_iters);
    if (e_every > 0 &&
        mgc_train_data_open_validation(&valid, plan,
                                       e_iters * plan->micro_batch_size * plan->num_microbatches * plan->grid.dp,
                                       err, sizeof err)) {
        if (rank == 0) fprintf(stderr, "mgc-run: %s: %s\n", plan_path, err);
        if (metrics) fclose(metrics), drop_partial(partial);
        if (prof_f) fclose(prof_f), drop_partial(prof_partial);
        free(profiles);
        mgc_train_data_free(data);
        mgc_comm_free(world);
        mgc_plan_free(plan);
        return 1;
    }
    if (rank == 0 && !quiet)
        printf("mgc-run: %s: data: %s\n", plan_path, mgc_train_data_describe(data));
    if (rank == 0 && !quiet && valid)
        printf("mgc-run: %s: validation: %s, every %" PRId64 " steps\n", plan_path,
               mgc_train_data_describe(valid), e_every);
    mgc_train_opts o = MGC_TRAIN_OPTS_INIT;
    o.iterations = iters;
    o.log_interval = log_every;
    o.threads = (int)threads;
    o.log = quiet ? NULL : stdout;
    o.metrics = metrics;
    o.backend = backend;
    o.profiles = profiles;
    o.profile_warmup = warmup;
    o.graphs = graphs;
    o.no_grad_overlap = no_overlap;
    o.no_send_overlap = no_send_overlap;
    o.device_comm = device_comm;
    o.checkpoint_dir = ckpt_dir ? ckpt_dir : "";
    o.async_save = async_save;
    if (time_limit > 0) { /* what is left of it once the run starts its steps' setup */
        o.time_limit_s = time_limit - (mono_s() - t_main);
        if (o.time_limit_s <= 0) o.time_limit_s = 1e-9; /* spent already: one step, then stop */
    }
    o.init_from = init_from;
    o.valid = valid;
    if (ckpt_dir) {
        struct sigaction sa;
        memset(&sa, 0, sizeof sa);
        sa.sa_handler = on_stop;
        sa.sa_flags = SA_RESETHAND | SA_RESTART;
        sigemptyset(&sa.sa_mask);
        sigaction(SIGTERM, &sa, NULL);
        sigaction(SIGINT, &sa, NULL);
        sigaction(SIGUSR1, &sa, NULL);
        o.stop = &stop_requested;
    }
    int rc = procs ? mgc_train_rank(plan, data, world, &o, err, sizeof err)
                   : mgc_train_local(plan, data, (int)local, &o, err, sizeof err);
    if (rc && (rank == 0 || procs)) fprintf(stderr, "mgc-run: %s: %s\n", plan_path, err);
    if (metrics) {
        long written = ftell(metrics);
        int bad = fclose(metrics) != 0;
        if (!rc && !bad && commit_partial(partial, metrics_path)) bad = 1;
        if (!rc && bad) {
            fprintf(stderr, "mgc-run: cannot finish the metrics file %s: %s\n", metrics_path,
                    strerror(errno));
            rc = -1;
        } else if (rc && written <= 0) {
            drop_partial(partial); /* nothing was trained: leave nothing behind */
        } else if (rc) {
            fprintf(stderr, "mgc-run: the steps that completed are in %s\n", partial[0] ? partial : metrics_path);
        }
    }
    if (prof_f) {
        if (rc) {
            fclose(prof_f); /* no profile from a failed run */
            drop_partial(prof_partial);
        } else {
            mgc_profile_info info = {plan_path, warmup};
            /* local ranks: every slot, in rank order; under MPI: this rank's own */
            int n = procs ? 1 : (int)plan->grid.world;
            if (finish_profile(prof_f, prof_partial, prof_path, procs ? &profiles[rank] : profiles,
                               n, &info))
                rc = -1;
        }
        for (int64_t r = 0; r < plan->grid.world; r++)
            mgc_profile_free(profiles[r]);
        free(profiles);
    }
    mgc_train_data_free(valid);
    mgc_train_data_free(data);
    if (world) mgc_comm_free(world);
    mgc_plan_free(plan);
    return rc ? 1 : 0;
}
