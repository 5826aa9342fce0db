#!/bin/sh
# train_mpi.sh MGC MGC_RUN MPIEXEC - the layout equivalence through mpirun:
# each model trains 10 steps on one rank, then under a multi-rank layout as
# separate processes (mpiexec -n N mgc-run PLAN); every step's loss must be
# within 1e-5 relative of the single rank's, and a second mpirun must
# reproduce the losses digit for digit.  With small gradient buckets, the
# reducer thread must have run (MPI_THREAD_MULTIPLE).  Exit 77 (skipped)
# without mpiexec.
set -u
mgc=$1 run=$2 mpiexec=${3:-}
[ -n "$mpiexec" ] && command -v "$mpiexec" >/dev/null 2>&1 || { echo "no mpiexec: skipped"; exit 77; }
tmp=$(mktemp -d) || exit 1
trap 'rm -rf "$tmp"' EXIT
common="--no-kernels --set training.iterations=10 --set optimizer.warmup_iterations=2 --set model.seq_length=32 --set training.micro_batch_size=2 --set training.global_batch_size=4"
fail=0
losses() { python3 -c "import json,sys; print(' '.join(repr(json.loads(l)['loss']) for l in open(sys.argv[1])))" "$1"; }
case_() { # name model nranks sets...
    name=$1 model=$2 n=$3; shift 3
    # shellcheck disable=SC2086
    "$mgc" compile "$model" $common -o "$tmp/base.plan" >/dev/null 2>&1 || { echo "$name: base compile failed"; fail=1; return; }
    # shellcheck disable=SC2086
    "$mgc" compile "$model" $common "$@" -o "$tmp/$name.plan" >/dev/null 2>&1 || { echo "$name: compile failed"; fail=1; return; }
    "$run" "$tmp/base.plan" -q --metrics "$tmp/base.jsonl" || { echo "$name: single-rank run failed"; fail=1; return; }
    for k in 1 2; do
        "$mpiexec" -n "$n" "$run" "$tmp/$name.plan" -q --metrics "$tmp/$name.$k.jsonl" \
            || { echo "$name: mpiexec -n $n mgc-run failed"; fail=1; return; }
    done
    python3 - "$tmp/base.jsonl" "$tmp/$name.1.jsonl" "$tmp/$name.2.jsonl" "$name" <<'PY' || fail=1
import json, sys
rd = lambda p: [json.loads(l)["loss"] for l in open(p)]
base, a, b, name = rd(sys.argv[1]), rd(sys.argv[2]), rd(sys.argv[3]), sys.argv[4]
ok = len(base) == len(a) == 10 and a == b
worst = max(abs(x - y) / abs(y) for x, y in zip(a, base)) if ok else float("inf")
ok = ok and worst <= 1e-5
print("%s: worst relative loss difference %.2e, rerun %s -> %s" % (name, worst, "identical" if a == b else "DIFFERS", "ok" if ok else "FAIL"))
sys.exit(0 if ok else 1)
PY
}
case_ gpt-tp2-pp2-dp2 examples/tiny-gpt.yaml 8 --set parallel.world_size=8 --set parallel.tensor=2 --set parallel.pipeline=2 --set parallel.data=2
case_ llama-cp2-tp2 models/tiny-llama.yaml 4 --set parallel.world_size=4 --set parallel.context=2 --set parallel.tensor=2 --set parallel.sequence_parallel=true
case_ moe-ep2-dist-opt models/tiny-moe.yaml 2 --set parallel.world_size=2 --set parallel.data=2 --set parallel.expert=2 --set parallel.distributed_optimizer=true
# expert tensor parallelism (expert_tensor defaults to tensor): the rows' variable all-gather and
# reduce-scatter over ETP as MPI all-to-alls
case_ moe-etp2-ep2 models/tiny-moe.yaml 4 --set parallel.world_size=4 --set parallel.tensor=2 --set parallel.sequence_parallel=true --set parallel.data=2 --set parallel.expert=2
# small buckets: under MPI_THREAD_MULTIPLE the gradient reducer runs; the metrics count its buckets
case_ gpt-dp2-pp2-buckets examples/tiny-gpt.yaml 4 --set parallel.world_size=4 --set parallel.data=2 --set parallel.pipeline=2 --set parallel.grad_bucket_size=20000
if [ -f "$tmp/gpt-dp2-pp2-buckets.1.jsonl" ]; then
    # Debian's Open MPI provides MPI_THREAD_MULTIPLE
    if grep -q '"overlapped_buckets": [1-9]' "$tmp/gpt-dp2-pp2-buckets.1.jsonl"; then
        echo "gpt-dp2-pp2-buckets: buckets reduced beside the backward under mpirun"
    else
        echo "gpt-dp2-pp2-buckets: no bucket was reduced beside the backward (no MPI_THREAD_MULTIPLE?)"
        fail=1
    fi
fi
# checkpoints through mpirun: 8 processes stop after step 4 and resume to 10 (each rank writes
# its own elements into one file, rank 0 checks it), with the losses and the final file of an
# unbroken mpirun; then one process resumes from that file and tracks the single-rank run
if [ -f "$tmp/gpt-tp2-pp2-dp2.plan" ]; then
    p=$tmp/gpt-tp2-pp2-dp2.plan
    if "$mpiexec" -n 8 "$run" "$p" -q --checkpoint-dir "$tmp/ck-a" --metrics "$tmp/ck-a.jsonl" &&
        "$mpiexec" -n 8 "$run" "$p" -q --checkpoint-dir "$tmp/ck-b" --iterations 4 &&
        "$mpiexec" -n 8 "$run" "$p" -q --checkpoint-dir "$tmp/ck-b" --metrics "$tmp/ck-b.jsonl" &&
        cmp -s "$tmp/ck-a/step-000000010.mgck" "$tmp/ck-b/step-000000010.mgck" &&
        [ "$(sed -n '5,10p' "$tmp/ck-a.jsonl" | cut -d, -f1-4)" = "$(cut -d, -f1-4 "$tmp/ck-b.jsonl")" ]; then
        echo "checkpoints under mpirun: stopped at step 4 and resumed: steps 5-10 and the final file identical"
    else
        echo "checkpoints under mpirun: FAIL"; fail=1
    fi
    mkdir -p "$tmp/ck-c" && cp "$tmp/ck-b/step-000000004.mgck" "$tmp/ck-c/" &&
        "$run" "$tmp/base.plan" -q --checkpoint-dir "$tmp/ck-c" --metrics "$tmp/ck-c.jsonl" &&
        python3 - "$tmp/ck-c.jsonl" "$tmp/base.jsonl" <<'PY' || { echo "checkpoints across layouts under mpirun: FAIL"; fail=1; }
import json, sys
rd = lambda p: [json.loads(l)["loss"] for l in open(p)]
c, base = rd(sys.argv[1]), rd(sys.argv[2])[4:]
worst = max(abs(x - y) / abs(y) for x, y in zip(c, base)) if len(c) == len(base) == 6 else float("inf")
print("checkpoint of 8 MPI ranks resumed on one: worst relative loss difference %.2e" % worst)
sys.exit(0 if worst <= 1e-5 else 1)
PY
fi
exit $fail
