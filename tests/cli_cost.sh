#!/bin/sh
# cli_cost.sh MGC [MGC_RUN] - the cost model from the command line: the
# prediction in mgc compile / inspect (text and JSON), mgc check --target as a
# CI step (fits, does not fit, JSON, GitHub annotations, bad targets), mgc
# hardware, and mgc calibrate (from a real mgc-run --profile when MGC_RUN is
# given, from a step time, and on bad input: status, message, no file left).
# Prints "cli_cost: N passed, M failed".
set -u
mgc=$1
run=${2:-}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
pass=0
fail=0
ok() { pass=$((pass + 1)); }
bad() { fail=$((fail + 1)); echo "cli_cost: FAIL: $*"; }
py() { command -v python3 >/dev/null 2>&1 && python3 -c "$@"; }

# -- the prediction ----------------------------------------------------------------------
"$mgc" compile models/gpt2-124m.yaml >"$tmp/c" 2>&1 && ok || bad "compile failed"
grep -q "^predicted on h100-sxm" "$tmp/c" && ok || bad "compile prints no prediction"
grep -q "MFU" "$tmp/c" && ok || bad "prediction lacks MFU"
"$mgc" compile --json --hardware a100-80gb-sxm models/gpt2-124m.yaml >"$tmp/cj" && ok || bad "compile --json failed"
py 'import json,sys; p=json.load(open(sys.argv[1]))["predicted"]; assert p["hardware"]=="a100-80gb-sxm" and p["step_s"]>0 and 0<p["mfu"]<1 and p["tokens_per_s"]>0 and set(p["time_by_class_s"])>={"gemm","tp_comm","dp_comm"}' "$tmp/cj" \
  && ok || bad "compile --json: no valid predicted object"
"$mgc" compile --no-kernels -o "$tmp/g.plan" models/gpt2-124m.yaml >/dev/null 2>&1 && ok || bad "compile -o failed"
"$mgc" inspect "$tmp/g.plan" | grep "step .* tokens/s" >"$tmp/i1" && ok || bad "inspect prints no prediction"
grep "step .* tokens/s" "$tmp/c" | cmp -s - "$tmp/i1" && ok || bad "inspect and compile predict differently"
"$mgc" inspect --hardware h200-sxm "$tmp/g.plan" | grep -q "^predicted on h200-sxm" && ok || bad "inspect --hardware ignored"
"$mgc" inspect --no-predict "$tmp/g.plan" | grep -q "^predicted" && bad "--no-predict still predicts" || ok
"$mgc" compile --hardware nope-gpu models/gpt2-124m.yaml -o "$tmp/x.plan" >"$tmp/o" 2>&1 && bad "unknown profile accepted" || ok
grep -q "no hardware profile named 'nope-gpu'" "$tmp/o" && ok || bad "unknown profile: no clear message"
[ ! -e "$tmp/x.plan" ] && ok || bad "a plan was written despite the error"

# -- mgc hardware ---------------------------------------------------------------------------
"$mgc" hardware | grep -q "h100-sxm" && ok || bad "mgc hardware does not list h100-sxm"
"$mgc" hardware a100-80gb-sxm >"$tmp/a100.yaml" && ok || bad "mgc hardware NAME failed"
sed 's/^name: .*/name: my-a100/; s/power_w: 400/power_w: 300/' "$tmp/a100.yaml" >"$tmp/my-a100.yaml"
MGC_HARDWARE_PATH="$tmp" "$mgc" compile --hardware my-a100 models/gpt2-124m.yaml | grep -q "^predicted on my-a100" \
  && ok || bad "MGC_HARDWARE_PATH profile not found"
printf 'name: broken\ngpu:\n  sms: lots\n' >"$tmp/broken.yaml"
"$mgc" hardware "$tmp/broken.yaml" >"$tmp/o" 2>&1 && bad "broken profile accepted" || ok
grep -q "broken.yaml:3:[0-9]*: error: gpu.sms: expected a number" "$tmp/o" && ok || bad "broken profile: no file:line:col"

# -- mgc check --target ---------------------------------------------------------------------
"$mgc" check --target h100-sxm:512 models/llama2-70b.yaml >"$tmp/o" 2>&1 && ok || bad "70B on 512 H100s rejected"
grep -q "fits on h100-sxm" "$tmp/o" && ok || bad "check --target: no fit line"
# 175B with no model parallelism cannot fit in 80 GB: status 1, the reason, and JSON says so
"$mgc" info --config --set parallel.tensor=1 --set parallel.pipeline=1 --set parallel.virtual_stages=1 \
  --set parallel.schedule=1f1b --set parallel.sequence_parallel=false --set parallel.world_size=64 \
  models/gpt3-175b.yaml >"$tmp/big.yaml" 2>/dev/null && ok || bad "info --config failed"
"$mgc" check --target h100-sxm:64 "$tmp/big.yaml" >"$tmp/o" 2>&1 && bad "175B on one GPU's memory accepted" || ok
grep -q "does not fit on h100-sxm" "$tmp/o" && ok || bad "no 'does not fit' message: $(cat "$tmp/o")"
# the summary names the loss chunks and recompute modules a plan has
"$mgc" compile --no-kernels --set "training.recompute_modules=[norm, dropout]" models/gpt2-124m.yaml >"$tmp/o" 2>&1 && ok || bad "GPT-2 124M compile failed"
grep -q "recompute none (and norm, dropout), distributed optimizer off, the head in 4 loss chunks" "$tmp/o" \
  && ok || bad "no loss chunks or modules in the summary: $(grep recompute "$tmp/o")"
# the hint: what each memory option would need, compiled (GPT-2 1.5B at micro batch 32 fits with
# the recompute modules or full recompute, not without)
"$mgc" check --target h100-sxm:8 --set training.micro_batch_size=32 --set training.global_batch_size=512 \
  models/gpt2-1.5b.yaml >"$tmp/o" 2>&1 && bad "GPT-2 1.5B at micro batch 32 fits" || ok
grep -q "hint: [0-9.]* GiB with training.recompute_modules: \[norm, activation, dropout\] (fits); [0-9.]* GiB with training.recompute_modules: \[mlp\] (fits); [0-9.]* GiB with training.recompute: full (fits)" "$tmp/o" \
  && ok || bad "no computed options in the hint: $(cat "$tmp/o")"
# ... and the fewest layers block recompute needs: that many fit, one fewer does not
n=$(sed -n 's/.*recompute_method: block, recompute_num_layers: \([0-9]*\) (fits.*/\1/p' "$tmp/o")
[ -n "$n" ] && [ "$n" -gt 1 ] && ok || bad "no block recompute in the hint: $(cat "$tmp/o")"
blk="--set training.micro_batch_size=32 --set training.global_batch_size=512 --set training.recompute=full --set training.recompute_method=block"
"$mgc" check --target h100-sxm:8 $blk --set training.recompute_num_layers="$n" models/gpt2-1.5b.yaml >/dev/null 2>&1 \
  && ok || bad "block recompute of $n layers does not fit"
"$mgc" check --target h100-sxm:8 $blk --set training.recompute_num_layers=$((n - 1)) models/gpt2-1.5b.yaml >/dev/null 2>&1 \
  && bad "block recompute of $((n - 1)) layers fits too: $n is not the fewest" || ok
# a head dim the CUDA kernels do not serve: valid (exit 0, a warning) without a target, but
# it cannot run on a GPU target (exit 1, saying why)
"$mgc" check --set model.head_dim=20 models/tiny-gpt.yaml >"$tmp/o" 2>&1 && grep -q "cannot train on a GPU" "$tmp/o" \
  && ok || bad "check: no warning for head dim 20"
"$mgc" check --target h100-sxm:1 --set model.head_dim=20 models/tiny-gpt.yaml >"$tmp/o" 2>&1 \
  && bad "check --target: head dim 20 accepted" || { grep -q "error: cannot run on h100-sxm: model.head_dim (20)" "$tmp/o" \
  && ok || bad "check --target: head dim 20: $(cat "$tmp/o")"; }
"$mgc" check --json --target h100-sxm:64 "$tmp/big.yaml" models/llama2-7b.yaml >"$tmp/j" 2>/dev/null \
  && bad "check --json: status 0 with a failure" || ok
py 'import json,sys; d=json.load(open(sys.argv[1])); f=d["files"]; assert d["failed"]==1 and not f[0]["ok"] and f[0]["target"]["fits"] is False and f[1]["ok"] and f[1]["target"]["fits"] is True and f[1]["target"]["usable_bytes"] < f[1]["target"]["memory_bytes"] and f[1]["predicted"]["tokens_per_s"] > 0' "$tmp/j" \
  && ok || bad "check --json --target: wrong JSON"
"$mgc" check --format=github --target h100-sxm:64 "$tmp/big.yaml" >"$tmp/o" 2>&1
grep -q "^::error file=$tmp/big.yaml.*does not fit" "$tmp/o" && ok || bad "no GitHub annotation: $(cat "$tmp/o")"
# headroom: the same plan fails once almost nothing is usable
"$mgc" check --target h100-sxm:8 --headroom 99 models/gpt2-124m.yaml >/dev/null 2>&1 && bad "99% headroom still fits" || ok
# the world size comes from the target: a divisibility problem is reported as such
"$mgc" check --target h100-sxm:12 models/llama2-70b.yaml >"$tmp/o" 2>&1 && bad "70B on 12 GPUs accepted" || ok
grep -q "world_size" "$tmp/o" && ok || bad "world-size problem not named"
for t in h100-sxm h100-sxm:0 :8 h100-sxm:x; do
    "$mgc" check --target "$t" models/gpt2-124m.yaml >/dev/null 2>"$tmp/o"; st=$?
    [ $st -eq 2 ] && grep -q "expected PROFILE:GPUS" "$tmp/o" && ok || bad "--target $t: status $st"
done
"$mgc" check --target nope:8 models/gpt2-124m.yaml >"$tmp/o" 2>&1 && bad "unknown target profile accepted" || ok
grep -q "no hardware profile named 'nope'" "$tmp/o" && ok || bad "unknown target: no message"
"$mgc" check --headroom 10 models/gpt2-124m.yaml >/dev/null 2>&1; [ $? -eq 2 ] && ok || bad "--headroom without --target"

# -- mgc calibrate ----------------------------------------------------------------------------
"$mgc" compile --no-kernels -o "$tmp/t.plan" examples/tiny-gpt.yaml >/dev/null 2>&1 && ok || bad "tiny compile"
"$mgc" calibrate "$tmp/t.plan" --step-time 0.05 --name tiny-fit -o "$tmp/fit.yaml" 2>"$tmp/o" && ok || bad "calibrate --step-time failed: $(cat "$tmp/o")"
"$mgc" compile --hardware "$tmp/fit.yaml" examples/tiny-gpt.yaml | grep -q "step 0.05 s" && ok || bad "fitted profile does not predict 0.05 s"
"$mgc" calibrate "$tmp/t.plan" --step-time 1e-12 -o "$tmp/f2.yaml" >/dev/null 2>"$tmp/o" && bad "impossible step accepted" || ok
grep -q "100% compute efficiency" "$tmp/o" && ok || bad "impossible step: no reason"
[ ! -e "$tmp/f2.yaml" ] && ok || bad "a profile was written despite the error"
printf '{"type":"header","format":"mgc-profile-1"}\n{"type":"op","stage":0}\n' >"$tmp/bad.jsonl"
"$mgc" calibrate "$tmp/t.plan" "$tmp/bad.jsonl" >/dev/null 2>"$tmp/o" && bad "bad profile accepted" || ok
grep -q "bad.jsonl:2: a op record needs" "$tmp/o" && ok || bad "bad profile: no line number: $(cat "$tmp/o")"
printf 'hello\n' >"$tmp/bad2.jsonl"
"$mgc" calibrate "$tmp/t.plan" "$tmp/bad2.jsonl" >/dev/null 2>"$tmp/o" && bad "non-JSON accepted" || ok
grep -q "bad2.jsonl:1: not a profile record" "$tmp/o" && ok || bad "non-JSON: no message"
"$mgc" calibrate "$tmp/t.plan" "$tmp/nonexistent.jsonl" >/dev/null 2>&1 && bad "missing profile accepted" || ok
"$mgc" calibrate "$tmp/t.plan" >/dev/null 2>&1; [ $? -eq 2 ] && ok || bad "calibrate without input: not a usage error"
"$mgc" calibrate "$tmp/t.plan" --step-time 0.05 -o "$tmp/no/such/dir/f.yaml" >/dev/null 2>"$tmp/o" && bad "unwritable output accepted" || ok
[ ! -e "$tmp/no" ] && ok || bad "unwritable output left something"
if [ -n "$run" ] && [ -x "$run" ]; then
    "$run" "$tmp/t.plan" --iterations 3 --profile "$tmp/t.jsonl" --log-interval 100 >/dev/null 2>&1 && ok || bad "mgc-run --profile failed"
    "$mgc" calibrate "$tmp/t.plan" "$tmp/t.jsonl" --name cpu-fit -o "$tmp/cpu.yaml" 2>"$tmp/o" && ok || bad "calibrate from a profile failed: $(cat "$tmp/o")"
    grep -q "^gemm .* [0-9]" "$tmp/o" && ok || bad "calibrate prints no fit table"
    # the fitted profile predicts the compute the profile measured (its FORWARD and BACKWARD
    # instructions) within 25%, and the whole step within a factor of 2 (the optimizer and
    # host work are not fitted; sanitizer builds distort them most)
    "$mgc" compile --json --hardware "$tmp/cpu.yaml" examples/tiny-gpt.yaml >"$tmp/cj2"
    py 'import json,sys
p = json.load(open(sys.argv[1]))["predicted"]
recs = [json.loads(l) for l in open(sys.argv[2])]
steps = [r for r in recs if r["type"] == "step"][0]["steps"]
fb = sum(r["total_s"] for r in recs if r["type"] == "instr" and r["op"] in ("FORWARD", "BACKWARD")) / steps
step = [r for r in recs if r["type"] == "step"][0]["mean_s"]
c = sum(p["time_by_class_s"][k] for k in ("gemm", "attention", "memory"))
assert abs(c - fb) / fb < 0.25, ("compute", c, fb)
assert 0.5 < p["step_s"] / step < 2, ("step", p["step_s"], step)' "$tmp/cj2" "$tmp/t.jsonl" \
      && ok || bad "the fitted profile does not reproduce the measured run"
    # mgc profile: each kernel kind's time and achieved rate against the ceilings
    "$mgc" profile "$tmp/t.plan" "$tmp/t.jsonl" --copy-gbs 10 --gemm-tflops 1 >"$tmp/k.md" 2>&1 && ok || bad "mgc profile failed"
    grep -q "^| linear | fwd | [0-9]" "$tmp/k.md" && ok || bad "mgc profile: no linear row"
    grep -q "^| embedding_norm | fwd | .*%" "$tmp/k.md" && ok || bad "mgc profile: no bandwidth share for embedding_norm"
    grep -q "copy 10.0 GB/s (measured), GEMM 1.0 TFLOP/s (measured)" "$tmp/k.md" && ok || bad "mgc profile: ceilings not shown"
    # the memory-bound kinds against 80% of copy: all of them under a ceiling of 1 kB/s, none under 1 PB/s
    "$mgc" profile "$tmp/t.plan" "$tmp/t.jsonl" --copy-gbs 0.000001 >"$tmp/k1.md" 2>&1 &&
        grep -q "^Memory-bound kinds at 80% of copy or more: \([1-9][0-9]*\) of \1 (100.0% of their time)\.$" "$tmp/k1.md" &&
        ok || bad "mgc profile: not every kind at 80% of a 1 kB/s copy: $(grep Memory-bound "$tmp/k1.md")"
    # none under 100 GB/s (the CPU backend moves a few GB/s; tiny GPT's ops take over 1 us
    # at that rate, so they are judged)
    "$mgc" profile "$tmp/t.plan" "$tmp/t.jsonl" --copy-gbs 100 >"$tmp/k2.md" 2>&1 &&
        grep -q "^Memory-bound kinds at 80% of copy or more: 0 of [1-9][0-9]* (0.0% of their time)\. Below: .*norm fwd [0-9]\{1,2\}% ([0-9.]* ms)" "$tmp/k2.md" &&
        ! grep -q "^Latency-bound" "$tmp/k2.md" &&
        ok || bad "mgc profile: kinds at 80% of a 100 GB/s copy: $(grep -e Memory-bound -e Latency-bound "$tmp/k2.md")"
    # under 1 PB/s every op's bytes take under 1 us: latency-bound, listed, not judged
    "$mgc" profile "$tmp/t.plan" "$tmp/t.jsonl" --copy-gbs 1000000 >"$tmp/k3.md" 2>&1 &&
        grep -q "^Latency-bound kinds, not judged (their bytes take under 1 us a call at copy bandwidth): .*norm fwd ([0-9.]* ms)" "$tmp/k3.md" &&
        ! grep -q "^Memory-bound" "$tmp/k3.md" &&
        ok || bad "mgc profile: kinds under a 1 PB/s copy: $(grep -e Memory-bound -e Latency-bound "$tmp/k3.md")"
    "$mgc" profile "$tmp/t.plan" "$tmp/t.jsonl" --copy-gbs -1 >/dev/null 2>&1; [ $? -eq 2 ] && ok || bad "bad --copy-gbs accepted"
    "$mgc" profile "$tmp/g.plan" "$tmp/t.jsonl" >/dev/null 2>"$tmp/o" && bad "profile of another plan accepted" || ok
fi

# -- outputs that are devices or pipes are written in place, never renamed over ----------------
if command -v mkfifo >/dev/null 2>&1; then
    for what in plan timeline calibrate metrics; do
        rm -f "$tmp/fifo" "$tmp/got"
        mkfifo "$tmp/fifo"
        timeout 30 cat "$tmp/fifo" >"$tmp/got" &
        reader=$!
        case $what in
        plan) "$mgc" compile --no-kernels --no-predict -o "$tmp/fifo" examples/tiny-gpt.yaml >/dev/null 2>&1 ;;
        timeline) "$mgc" compile --no-predict --timeline "$tmp/fifo" examples/tiny-gpt.yaml >/dev/null 2>&1 ;;
        calibrate) "$mgc" calibrate "$tmp/t.plan" --step-time 0.05 -o "$tmp/fifo" >/dev/null 2>&1 ;;
        metrics) if [ -n "$run" ] && [ -x "$run" ]; then
                     "$run" "$tmp/t.plan" --iterations 1 -q --metrics "$tmp/fifo" >/dev/null 2>&1
                 else : >"$tmp/fifo"; fi ;;
        esac
        wait $reader
        [ -p "$tmp/fifo" ] && ok || bad "$what: the FIFO was replaced by a file"
        [ -s "$tmp/got" ] || [ "$what" = metrics ] && ok || bad "$what: nothing written through the FIFO"
        [ ! -e "$tmp/fifo.partial" ] && [ ! -e "$tmp/fifo.tmp" ] && ok || bad "$what: a temporary file was left"
    done
fi

echo "cli_cost: $pass passed, $fail failed"
[ $fail -eq 0 ]
