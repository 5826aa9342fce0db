#!/bin/sh
# cli_run.sh MGC MGC_RUN - mgc-run on bad input: every case must fail before
# the first step with exit status 1 (2 for usage), a message naming the file
# and the problem, and leave no metrics file behind; a good run writes one
# JSON line per step.
set -u
mgc=$1 run=$2
tmp=$(mktemp -d) || exit 1
trap 'rm -rf "$tmp"' EXIT
fail=0
ok() { echo "ok: $1"; }
bad() { echo "FAIL: $1"; fail=1; }
small="--set training.iterations=3 --set optimizer.warmup_iterations=1 --set model.seq_length=32"
# expect NAME STATUS PATTERN -- CMD...: exit status, stderr matching PATTERN, no metrics left
expect() {
    name=$1 want=$2 pat=$3; shift 4
    rm -f "$tmp/m.jsonl" "$tmp/m.jsonl.partial"
    "$@" >"$tmp/out" 2>"$tmp/err"
    got=$?
    if [ "$got" != "$want" ]; then bad "$name: exit $got, expected $want"; cat "$tmp/err"; return; fi
    if ! grep -q -- "$pat" "$tmp/err"; then bad "$name: stderr lacks '$pat'"; cat "$tmp/err"; return; fi
    if [ -e "$tmp/m.jsonl" ] || [ -e "$tmp/m.jsonl.partial" ]; then bad "$name: a metrics file was left"; return; fi
    if grep -q "^step " "$tmp/out"; then bad "$name: a step ran"; return; fi
    ok "$name"
}
# shellcheck disable=SC2086
$mgc compile examples/tiny-gpt.yaml --no-kernels $small -o "$tmp/one.plan" >/dev/null || { echo "compile failed"; exit 1; }
# shellcheck disable=SC2086
$mgc compile examples/tiny-gpt.yaml --no-kernels $small --set parallel.tensor=2 --set parallel.world_size=2 -o "$tmp/two.plan" >/dev/null || exit 1

expect "usage: no plan" 2 "usage: mgc-run" -- "$run"
expect "usage: bad option" 2 "unknown option '--frobnicate'" -- "$run" "$tmp/one.plan" --frobnicate
expect "usage: bad integer" 2 "--local-ranks needs an integer" -- "$run" "$tmp/one.plan" --local-ranks x
expect "missing plan" 1 "nope.plan" -- "$run" "$tmp/nope.plan" --metrics "$tmp/m.jsonl"
printf 'model:\n  name: x\n' >"$tmp/yaml.plan"
expect "not a plan" 1 "not an mgc plan" -- "$run" "$tmp/yaml.plan" --metrics "$tmp/m.jsonl"
cp "$tmp/one.plan" "$tmp/corrupt.plan"
printf '\377' | dd of="$tmp/corrupt.plan" bs=1 seek=300 conv=notrunc 2>/dev/null
expect "corrupt plan" 1 "corrupt plan" -- "$run" "$tmp/corrupt.plan" --metrics "$tmp/m.jsonl"
expect "world too small" 1 "the plan is for 2 ranks" -- "$run" "$tmp/two.plan" --metrics "$tmp/m.jsonl"
expect "world too large" 1 "the plan is for 1 ranks" -- "$run" "$tmp/one.plan" --local-ranks 3 --metrics "$tmp/m.jsonl"
# shellcheck disable=SC2086
$mgc compile examples/tiny-gpt.yaml --no-kernels $small --set training.precision=bf16 -o "$tmp/bf16.plan" >/dev/null || exit 1
expect "bf16 on the cpu" 1 "CPU backend computes in fp32" -- "$run" "$tmp/bf16.plan" --metrics "$tmp/m.jsonl"
expect "metrics path unwritable" 1 "cannot write the metrics file" -- "$run" "$tmp/one.plan" --metrics "$tmp/no/such/dir/m.jsonl"

# datasets: missing, corrupt, too small
mplan() { # OUT PATH...: a megatron-format plan over the given prefixes
    out=$1; shift
    list=$(printf '%s' "$*" | sed 's/ /, /g')
    # shellcheck disable=SC2086
    $mgc compile examples/tiny-gpt.yaml --no-kernels $small --set data.format=megatron --set "data.paths=[$list]" \
        --set data.split=100,0,0 -o "$out" >/dev/null
}
mplan "$tmp/missing.plan" "$tmp/absent" || exit 1
expect "missing dataset" 1 "absent" -- "$run" "$tmp/missing.plan" --metrics "$tmp/m.jsonl"
$mgc data synthetic "$tmp/syn" --documents 50 >/dev/null || exit 1
cp "$tmp/syn.idx" "$tmp/cut.idx"
head -c 1000 "$tmp/syn.bin" >"$tmp/cut.bin"
mplan "$tmp/cut.plan" "$tmp/cut" || exit 1
expect "truncated dataset" 1 "cut" -- "$run" "$tmp/cut.plan" --metrics "$tmp/m.jsonl"
printf 'just a few words\n' >"$tmp/tiny.txt"
$mgc data build "$tmp/tiny" "$tmp/tiny.txt" >/dev/null || exit 1
mplan "$tmp/tiny.plan" "$tmp/tiny" || exit 1
expect "too few tokens" 1 "fewer than one sample" -- "$run" "$tmp/tiny.plan" --metrics "$tmp/m.jsonl"

# a good run: one JSON line per step, the .partial renamed
rm -f "$tmp/m.jsonl"
if "$run" "$tmp/one.plan" -q --metrics "$tmp/m.jsonl" >"$tmp/out" 2>"$tmp/err" &&
    [ "$(wc -l <"$tmp/m.jsonl")" -eq 3 ] && [ ! -e "$tmp/m.jsonl.partial" ] &&
    grep -q '"step": 3, "loss": ' "$tmp/m.jsonl"; then
    ok "good run writes 3 metrics lines"
else
    bad "good run"; cat "$tmp/err"
fi
# two data-parallel ranks: the same metrics with the gradient reducer and without
# shellcheck disable=SC2086
$mgc compile examples/tiny-gpt.yaml --no-kernels $small --set parallel.data=2 --set parallel.world_size=2 \
    --set parallel.grad_bucket_size=50000 -o "$tmp/dp2.plan" >/dev/null || exit 1
if "$run" "$tmp/dp2.plan" --local-ranks 2 -q --metrics "$tmp/a.jsonl" 2>"$tmp/err" &&
    "$run" "$tmp/dp2.plan" --local-ranks 2 -q --no-grad-overlap --metrics "$tmp/b.jsonl" 2>>"$tmp/err" &&
    [ "$(cut -d, -f1-4 "$tmp/a.jsonl")" = "$(cut -d, -f1-4 "$tmp/b.jsonl")" ] &&
    [ "$(wc -l <"$tmp/a.jsonl")" -eq 3 ]; then
    ok "--no-grad-overlap: the same losses and norms"
else
    bad "--no-grad-overlap"; cat "$tmp/err"
fi
# pipeline sends in line (the CPU's arena sends directly either way: the flag is accepted and
# changes nothing; tests/test_train.c checks the overlapped path on a device-memory backend)
$mgc compile examples/tiny-gpt.yaml --no-kernels $small --set parallel.pipeline=2 --set parallel.world_size=2 \
    -o "$tmp/pp2.plan" >/dev/null || exit 1
if "$run" "$tmp/pp2.plan" --local-ranks 2 -q --metrics "$tmp/c.jsonl" 2>"$tmp/err" &&
    "$run" "$tmp/pp2.plan" --local-ranks 2 -q --no-send-overlap --metrics "$tmp/d.jsonl" 2>>"$tmp/err" &&
    [ "$(cut -d, -f1-4 "$tmp/c.jsonl")" = "$(cut -d, -f1-4 "$tmp/d.jsonl")" ]; then
    ok "--no-send-overlap: the same losses and norms"
else
    bad "--no-send-overlap"; cat "$tmp/err"
fi
# a device communicator (--device-comm local: the moves-only path on the CPU's arena) changes
# no number; the names and backends it needs
if "$run" "$tmp/dp2.plan" --local-ranks 2 -q --device-comm local --metrics "$tmp/e.jsonl" 2>"$tmp/err" &&
    [ "$(cut -d, -f1-4 "$tmp/a.jsonl")" = "$(cut -d, -f1-4 "$tmp/e.jsonl")" ] &&
    "$run" "$tmp/pp2.plan" --local-ranks 2 -q --device-comm local --metrics "$tmp/f.jsonl" 2>>"$tmp/err" &&
    [ "$(cut -d, -f1-4 "$tmp/c.jsonl")" = "$(cut -d, -f1-4 "$tmp/f.jsonl")" ]; then
    ok "--device-comm local: the same losses and norms (dp2, pp2)"
else
    bad "--device-comm local"; cat "$tmp/err"
fi
expect "usage: device comm name" 2 "--device-comm mpi: choose none, nccl" -- "$run" "$tmp/dp2.plan" --local-ranks 2 --device-comm mpi
expect "usage: nccl on the cpu" 2 "--device-comm nccl needs the cuda backend" -- "$run" "$tmp/dp2.plan" --local-ranks 2 --backend cpu --device-comm nccl
expect "usage: local on cuda" 2 "--device-comm local reads the arena from the host" -- "$run" "$tmp/dp2.plan" --local-ranks 2 --backend cuda --device-comm local
# checkpoints: an unusable directory, a damaged checkpoint, then a stopped run resumed
: >"$tmp/afile"
expect "checkpoint dir is a file" 1 "afile is not a directory" -- "$run" "$tmp/one.plan" --checkpoint-dir "$tmp/afile" --metrics "$tmp/m.jsonl"
expect "usage: checkpoint dir" 2 "--checkpoint-dir needs a value" -- "$run" "$tmp/one.plan" --checkpoint-dir
expect "init-from a missing file" 1 "--init-from cannot open the checkpoint $tmp/none.mgck" -- "$run" "$tmp/one.plan" --init-from "$tmp/none.mgck" --metrics "$tmp/m.jsonl"
expect "init-from a plan file" 1 "not an mgc checkpoint" -- "$run" "$tmp/one.plan" --init-from "$tmp/one.plan" --metrics "$tmp/m.jsonl"
if "$run" "$tmp/one.plan" -q --iterations 2 --checkpoint-dir "$tmp/ck/a" 2>"$tmp/err" &&
    [ -f "$tmp/ck/a/step-000000002.mgck" ] &&
    "$run" "$tmp/one.plan" --checkpoint-dir "$tmp/ck/a" --metrics "$tmp/r.jsonl" >"$tmp/out" 2>>"$tmp/err" &&
    grep -q "resumed from $tmp/ck/a/step-000000002.mgck (step 2)" "$tmp/out" &&
    [ "$(wc -l <"$tmp/r.jsonl")" -eq 1 ] && grep -q '"step": 3, ' "$tmp/r.jsonl" &&
    "$run" "$tmp/one.plan" -q --metrics "$tmp/u.jsonl" 2>>"$tmp/err" &&
    [ "$(sed -n 3p "$tmp/u.jsonl" | cut -d, -f1-4)" = "$(cut -d, -f1-4 "$tmp/r.jsonl")" ]; then
    ok "a run stopped at step 2 resumes to step 3 with the unbroken run's loss"
else
    bad "checkpoint resume"; cat "$tmp/out" "$tmp/err"
fi
mkdir -p "$tmp/ck/b"
cp "$tmp/ck/a/step-000000003.mgck" "$tmp/ck/b/"
printf '\001' | dd of="$tmp/ck/b/step-000000003.mgck" bs=1 seek=40000 conv=notrunc 2>/dev/null
expect "damaged checkpoint" 1 "step-000000003.mgck: the parameter values of" -- "$run" "$tmp/one.plan" --iterations 5 --checkpoint-dir "$tmp/ck/b" --metrics "$tmp/m.jsonl"
[ -f "$tmp/ck/b/step-000000003.mgck" ] && ok "the damaged checkpoint is left in place" || bad "the damaged checkpoint was removed"
# SIGTERM (a batch system's notice): the step finishes, a checkpoint is saved, exit 0; the next
# run resumes after that step.  Again with --async-save and checkpoints every 5 steps (those in
# flight finish before the exit), stopped by SIGUSR1 (Slurm's --signal=USR1@...)
$mgc compile examples/tiny-gpt.yaml --no-kernels --set training.iterations=2000 --set model.seq_length=32 \
    -o "$tmp/long.plan" >/dev/null || exit 1
$mgc compile examples/tiny-gpt.yaml --no-kernels --set training.iterations=2000 --set model.seq_length=32 \
    --set checkpoint.interval=5 --set checkpoint.keep=0 -o "$tmp/long5.plan" >/dev/null || exit 1
for mode in sync async; do
    plan="$tmp/long.plan" sig=TERM dir="$tmp/ck/s" extra=""
    [ $mode = async ] && plan="$tmp/long5.plan" sig=USR1 dir="$tmp/ck/as" extra="--async-save"
    rm -f "$tmp/s.jsonl" "$tmp/t.jsonl"
    "$run" "$plan" --checkpoint-dir "$dir" $extra --metrics "$tmp/s.jsonl" --log-interval 1000 >"$tmp/out" 2>"$tmp/err" &
    pid=$!
    n=0
    while [ "$n" -lt 200 ] && [ "$(cat "$tmp/s.jsonl.partial" 2>/dev/null | wc -l)" -lt 12 ]; do sleep 0.05; n=$((n + 1)); done
    kill -$sig $pid
    wait $pid
    st=$?
    last=$(tail -n 1 "$tmp/s.jsonl" 2>/dev/null | sed 's/{"step": \([0-9]*\),.*/\1/')
    saved=$(printf '%s/step-%09d.mgck' "$dir" "${last:-0}")
    if [ "$st" = 0 ] && [ -n "$last" ] && [ "$last" -lt 2000 ] && [ -f "$saved" ] &&
        grep -q "stopped on request after step $last: run again" "$tmp/out" &&
        ! ls "$dir" | grep -q partial &&
        { [ $mode = sync ] || { [ -f "$dir/step-000000010.mgck" ] && grep -q "saved .*step-000000005.mgck in the background" "$tmp/out"; }; } &&
        "$run" "$plan" --checkpoint-dir "$dir" $extra --iterations $((last + 2)) -q --metrics "$tmp/t.jsonl" 2>>"$tmp/err" &&
        [ "$(head -n 1 "$tmp/t.jsonl" | sed 's/{"step": \([0-9]*\),.*/\1/')" = $((last + 1)) ]; then
        ok "$mode saves, SIG$sig after step $last: saved, exit 0, resumed at step $((last + 1))"
    else
        bad "$mode saves, SIG$sig (exit $st, last step '$last')"; cat "$tmp/out" "$tmp/err"; ls "$dir"
    fi
done
expect "usage: async without checkpoints" 2 "--async-save needs checkpoints" -- "$run" "$tmp/one.plan" --async-save
# --time-limit: the run stops by itself while the limit still holds a step and a save, with a
# checkpoint of its last step, exit 0; the next run resumes after it
rm -f "$tmp/s.jsonl"
if "$run" "$tmp/long.plan" --checkpoint-dir "$tmp/ck/tl" --time-limit 2s --metrics "$tmp/s.jsonl" --log-interval 1000 >"$tmp/out" 2>"$tmp/err"; then
    last=$(tail -n 1 "$tmp/s.jsonl" | sed 's/{"step": \([0-9]*\),.*/\1/')
    if [ -n "$last" ] && [ "$last" -lt 2000 ] && [ -f "$(printf '%s/ck/tl/step-%09d.mgck' "$tmp" "$last")" ] &&
        grep -q "stopped before the time limit after step $last: run again" "$tmp/out"; then
        ok "--time-limit 2s: stopped after step $last with its checkpoint"
    else
        bad "--time-limit (last step '$last')"; cat "$tmp/out"
    fi
else
    bad "--time-limit: exit status $?"; cat "$tmp/out" "$tmp/err"
fi
expect "usage: time limit" 2 "--time-limit needs a duration above 0" -- "$run" "$tmp/one.plan" --time-limit 10x

# evaluation: the validation loss in the metrics of the steps that evaluate; a validation split
# too small for one sample is refused before the first step
# shellcheck disable=SC2086
$mgc compile examples/tiny-gpt.yaml --no-kernels $small --set training.eval_interval=2 --set training.eval_iters=2 \
    -o "$tmp/eval.plan" >/dev/null || exit 1
if "$run" "$tmp/eval.plan" --metrics "$tmp/e.jsonl" >"$tmp/out" 2>"$tmp/err" &&
    [ "$(grep -c '"eval_loss": ' "$tmp/e.jsonl")" -eq 2 ] && ! sed -n 1p "$tmp/e.jsonl" | grep -q eval_loss &&
    grep -q '^validation after step 3 | loss ' "$tmp/out" &&
    [ "$(grep -c '"test_loss": ' "$tmp/e.jsonl")" -eq 1 ] && sed -n 3p "$tmp/e.jsonl" | grep -q test_loss &&
    grep -q '^test after step 3 | loss ' "$tmp/out"; then
    ok "evaluation after steps 2 and 3 (the last), the test split after step 3"
else
    bad "evaluation"; cat "$tmp/out" "$tmp/err"
fi
# a test split too small for one sample: said, and the run goes on without it
# shellcheck disable=SC2086
$mgc compile examples/tiny-gpt.yaml --no-kernels $small --set training.eval_interval=2 --set data.split=99000,999,1 \
    -o "$tmp/notest.plan" >/dev/null || exit 1
if "$run" "$tmp/notest.plan" --metrics "$tmp/e.jsonl" >"$tmp/out" 2>"$tmp/err" &&
    grep -q '^mgc-run: no test evaluation: synthetic corpus: the test split holds 0 tokens' "$tmp/out" &&
    ! grep -q test_loss "$tmp/e.jsonl" && grep -q '^validation after step 3' "$tmp/out"; then
    ok "a test split without a sample: no test evaluation, said once"
else
    bad "small test split"; cat "$tmp/out" "$tmp/err"
fi
# shellcheck disable=SC2086
$mgc compile examples/tiny-gpt.yaml --no-kernels $small --set training.eval_interval=2 --set data.split=99999,1,0 \
    -o "$tmp/noval.plan" >/dev/null || exit 1
expect "empty validation split" 1 "the validation split holds 0 tokens" -- "$run" "$tmp/noval.plan" --metrics "$tmp/m.jsonl"

# the same data as a megatron dataset trains too
mplan "$tmp/syn.plan" "$tmp/syn" || exit 1
if "$run" "$tmp/syn.plan" -q >/dev/null 2>"$tmp/err"; then ok "megatron dataset run"; else bad "megatron dataset run"; cat "$tmp/err"; fi

# mgc-export beside mgc-run: a checkpoint to safetensors (test_export checks the values)
exp=$(dirname "$run")/mgc-export
if [ -x "$exp" ]; then
    "$run" "$tmp/one.plan" -q --iterations 2 --checkpoint-dir "$tmp/exck" >/dev/null 2>&1 || bad "export: training"
    expect "export: usage" 2 "give a plan, a checkpoint and -o DIR" -- "$exp" "$tmp/one.plan"
    expect "export: bad format" 2 "use hf or mgc" -- "$exp" "$tmp/one.plan" "$tmp/exck/step-000000002.mgck" -o "$tmp/ex" --format onnx
    expect "export: missing checkpoint" 1 "cannot open the checkpoint" -- "$exp" "$tmp/one.plan" "$tmp/exck/nope.mgck" -o "$tmp/ex"
    if "$exp" "$tmp/one.plan" "$tmp/exck/step-000000002.mgck" -o "$tmp/ex" --dtype bf16 >"$tmp/out" 2>"$tmp/err" &&
        grep -q '"torch_dtype": "bfloat16"' "$tmp/ex/config.json" && grep -q 'GPT2LMHeadModel' "$tmp/ex/config.json" &&
        [ -s "$tmp/ex/model.safetensors" ] && ! ls "$tmp/ex" | grep -q partial; then
        ok "export: GPT-2 layout in bf16"
    else
        bad "export"; cat "$tmp/out" "$tmp/err"
    fi
    expect "export: never over an export" 1 "already holds an export" -- "$exp" "$tmp/one.plan" "$tmp/exck/step-000000002.mgck" -o "$tmp/ex"
    imp=$(dirname "$run")/mgc-import
    expect "import: usage" 2 "give a plan, a model directory and -o CKPT" -- "$imp" "$tmp/one.plan" "$tmp/ex"
    expect "import: no model" 1 "config.json" -- "$imp" "$tmp/one.plan" "$tmp/exck" -o "$tmp/imp.mgck"
    # the bf16 export back into a checkpoint, and a run that starts from it
    if "$imp" "$tmp/one.plan" "$tmp/ex" -o "$tmp/imp.mgck" >"$tmp/out" 2>"$tmp/err" &&
        "$run" "$tmp/one.plan" -q --init-from "$tmp/imp.mgck" --iterations 1 --metrics "$tmp/imp.jsonl" 2>>"$tmp/err" &&
        grep -q '"step": 1' "$tmp/imp.jsonl"; then
        ok "import: the export back, and a run from it"
    else
        bad "import"; cat "$tmp/out" "$tmp/err"
    fi
fi
exit $fail
