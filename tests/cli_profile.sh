#!/bin/sh
# cli_profile.sh MGC MGC_RUN [MPIEXEC] - mgc-run --profile FILE: the file is
# JSON lines in format mgc-profile-1 (docs/runtime.md, "Profiling") with one
# op record per (stage, chunk, pass, index) of each rank's stage program
# (checked against `mgc inspect --ops`), calls = recorded steps x
# microbatches, the ops within FORWARD + BACKWARD and those within the step
# total, and a step record per rank; local ranks all land in FILE, MPI rank
# k > 0 in FILE.rank<k> (when MPIEXEC is given).  The CUDA emulator's run
# takes the ops' times from the backend's timers (backend.h time_mark), as
# the CUDA backend does, where the CPU's syncs and reads the clock per op.  Bad input fails before the first step and leaves
# no file.  Needs python3 for the format checks (skipped without it).
set -u
mgc=$1 run=$2 mpiexec=${3:-}
tmp=$(mktemp -d) || exit 1
trap 'rm -rf "$tmp"' EXIT
fail=0
ok() { echo "ok: $1"; }
bad() { echo "FAIL: $1"; fail=1; }
small="--no-kernels --set training.iterations=3 --set optimizer.warmup_iterations=1 --set model.seq_length=32"
have_py=1
command -v python3 >/dev/null 2>&1 || { have_py=0; echo "python3 not found: the format checks are skipped"; }

compile() { # NAME SETS...
    name=$1; shift
    # shellcheck disable=SC2086
    $mgc compile examples/tiny-gpt.yaml $small "$@" -o "$tmp/$name.plan" >/dev/null || { echo "compile $name failed"; exit 1; }
    $mgc inspect "$tmp/$name.plan" --ops >"$tmp/$name.ops" || exit 1
    $mgc inspect "$tmp/$name.plan" --json >"$tmp/$name.json" || exit 1
}
compile one
compile tp2 --set parallel.tensor=2 --set parallel.world_size=2
compile pp2 --set parallel.pipeline=2 --set parallel.world_size=2

# check NAME PLAN RANKS STEPS FILE...: the profile files of one run of PLAN (.ops/.json beside
# it), on the backend named in $backend (cpu unless set)
check() {
    name=$1 plan=$2 ranks=$3 steps=$4; shift 4
    if [ "$have_py" = 0 ]; then ok "$name (ran; format not checked)"; return; fi
    if python3 - "$plan" "$ranks" "$steps" "${backend:-cpu}" "$@" <<'PY'; then ok "$name"; else bad "$name"; fi
import json, re, sys
plan, want_ranks, steps, backend, files = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5:]
mb = json.load(open(plan[:-5] + ".json"))["microbatches"]
# (stage, chunk) -> (forward ops, backward ops), from mgc inspect --ops
expect, key = {}, None
for line in open(plan[:-5] + ".ops"):
    m = re.match(r"# stage (\d+) chunk (\d+)", line)
    if m: key = (int(m.group(1)), int(m.group(2)))
    m = re.search(r"(\d+) forward ops, (\d+) backward ops", line)
    if m and line.startswith("# chunk:"): expect[key] = (int(m.group(1)), int(m.group(2)))
errs = []
ranks_seen, stages_seen = set(), set()
for path in files:
    recs = [json.loads(l) for l in open(path)]   # every line parses
    h = recs[0]
    if h.get("type") != "header" or h.get("format") != "mgc-profile-1": errs.append(path + ": no header first")
    if h.get("steps") != steps: errs.append("%s: header steps %s, expected %d" % (path, h.get("steps"), steps))
    timing = "device" if backend in ("emu", "cuda") else "host"  # backend.h time_mark
    if h.get("backend") != backend or h.get("precision") != "fp32" or h.get("plan") != plan or h.get("op_timing") != timing:
        errs.append(path + ": header fields " + json.dumps(h))
    if any(r["type"] == "header" for r in recs[1:]): errs.append(path + ": a second header")
    kinds = [r["type"] for r in recs[1:]]
    if kinds != sorted(kinds, key=["op", "instr", "step"].index): errs.append(path + ": records out of order")
    for rank in sorted({r["rank"] for r in recs[1:]}):
        ranks_seen.add(rank)
        ops = [r for r in recs if r["type"] == "op" and r["rank"] == rank]
        ins = [r for r in recs if r["type"] == "instr" and r["rank"] == rank]
        st = [r for r in recs if r["type"] == "step" and r["rank"] == rank]
        stage = {r["stage"] for r in ops + ins}
        if len(stage) != 1 or len(st) != 1: errs.append("rank %d: stages %s, %d step records" % (rank, stage, len(st))); continue
        stage = stage.pop()
        stages_seen.add(stage)
        want = set()
        for (s, c), (nf, nb) in expect.items():
            if s == stage:
                want |= {(c, "fwd", i) for i in range(nf)} | {(c, "bwd", i) for i in range(nb)}
        got = [(r["chunk"], r["pass"], r["index"]) for r in ops]
        if len(got) != len(set(got)) or set(got) != want:
            errs.append("rank %d: %d op records for %d ops of stage %d" % (rank, len(got), len(want), stage))
        for r in ops:
            if r["calls"] != steps * mb or not r["total_s"] > 0 or abs(r["mean_s"] * r["calls"] - r["total_s"]) > 1e-6 * r["total_s"] or not r["kind"] or not r["name"]:
                errs.append("rank %d: bad op record %s" % (rank, json.dumps(r))); break
        fb = [r for r in ins if r["op"] in ("FORWARD", "BACKWARD")]
        if not fb or any(r["calls"] != steps * mb or r["arg"] != 0 for r in fb):
            errs.append("rank %d: FORWARD/BACKWARD records %s" % (rank, fb))
        if sum(r["total_s"] for r in fb) > st[0]["total_s"] or st[0]["steps"] != steps or not st[0]["total_s"] > 0:
            errs.append("rank %d: forward+backward %g s beyond the step total %s" % (rank, sum(r["total_s"] for r in fb), st[0]))
        # every op runs inside a FORWARD or BACKWARD: their times hold the ops'
        if sum(r["total_s"] for r in ops) > sum(r["total_s"] for r in fb):
            errs.append("rank %d: the ops' %g s beyond forward+backward's %g s" % (rank, sum(r["total_s"] for r in ops), sum(r["total_s"] for r in fb)))
        if not any(r["op"] == "OPTIMIZER" and r["calls"] == steps for r in ins):
            errs.append("rank %d: no OPTIMIZER record" % rank)
if ranks_seen != set(range(want_ranks)): errs.append("ranks %s, expected 0..%d" % (sorted(ranks_seen), want_ranks - 1))
if stages_seen != {s for s, _ in expect}: errs.append("stages %s, expected %s" % (sorted(stages_seen), sorted({s for s, _ in expect})))
for e in errs: print("  " + e)
sys.exit(1 if errs else 0)
PY
}

# 1. one rank, 3 steps, the default warm-up of 1: 2 recorded steps
if "$run" "$tmp/one.plan" -q --iterations 3 --profile "$tmp/p1.jsonl" 2>"$tmp/err" && [ ! -e "$tmp/p1.jsonl.partial" ]; then
    check "one rank" "$tmp/one.plan" 1 2 "$tmp/p1.jsonl"
else
    bad "one rank run"; cat "$tmp/err"
fi
# 2. two local ranks (tensor 2, then pipeline 2: p2p instructions), both in one file
if "$run" "$tmp/tp2.plan" -q --local-ranks 2 --iterations 3 --profile-warmup 0 --profile "$tmp/p2.jsonl" 2>"$tmp/err"; then
    check "tensor 2, 2 local ranks, no warm-up" "$tmp/tp2.plan" 2 3 "$tmp/p2.jsonl"
else
    bad "tensor 2 run"; cat "$tmp/err"
fi
if "$run" "$tmp/pp2.plan" -q --local-ranks 2 --iterations 3 --profile-warmup 2 --profile "$tmp/p3.jsonl" 2>"$tmp/err"; then
    check "pipeline 2, 2 local ranks" "$tmp/pp2.plan" 2 1 "$tmp/p3.jsonl"
    grep -q '"op":"SEND_ACT"' "$tmp/p3.jsonl" && grep -q '"op":"RECV_GRAD"' "$tmp/p3.jsonl" ||
        bad "pipeline 2: no SEND_ACT/RECV_GRAD records"
else
    bad "pipeline 2 run"; cat "$tmp/err"
fi
# the CUDA emulator: the ops timed by the backend's timers, read once an instruction
if "$run" "$tmp/one.plan" -q --backend emu --iterations 2 --profile "$tmp/pe.jsonl" 2>"$tmp/err"; then
    backend=emu check "one rank on the CUDA emulator (the backend's op timers)" "$tmp/one.plan" 1 1 "$tmp/pe.jsonl"
    if "$mgc" profile "$tmp/one.plan" "$tmp/pe.jsonl" 2>&1 | grep -q "each op's on the device"; then
        ok "mgc profile says the emulator's ops were timed on the device"
    else
        bad "mgc profile on the emulator's profile"; "$mgc" profile "$tmp/one.plan" "$tmp/pe.jsonl"
    fi
    if "$mgc" profile "$tmp/one.plan" "$tmp/p1.jsonl" 2>&1 | grep -q "synchronises around each"; then
        ok "mgc profile says the CPU's ops were timed by the host"
    else
        bad "mgc profile on the CPU's profile"; "$mgc" profile "$tmp/one.plan" "$tmp/p1.jsonl"
    fi
elif grep -q "C++ compiler" "$tmp/err"; then
    echo "no C++ compiler: the emulator's case is skipped"
else
    bad "emulator run"; cat "$tmp/err"
fi
# under mpirun: rank 0 writes FILE, rank 1 FILE.rank1
if [ -n "$mpiexec" ] && command -v "$mpiexec" >/dev/null 2>&1; then
    if "$mpiexec" -n 2 "$run" "$tmp/pp2.plan" -q --iterations 3 --profile "$tmp/pm.jsonl" 2>"$tmp/err" &&
        [ -e "$tmp/pm.jsonl" ] && [ -e "$tmp/pm.jsonl.rank1" ] && [ ! -e "$tmp/pm.jsonl.rank0" ]; then
        check "pipeline 2 under mpirun: FILE and FILE.rank1" "$tmp/pp2.plan" 2 2 "$tmp/pm.jsonl" "$tmp/pm.jsonl.rank1"
    else
        bad "mpirun profile"; cat "$tmp/err"; ls "$tmp"
    fi
else
    echo "no mpiexec: the MPI case is skipped"
fi

# 3. bad input: fails before the first step (or at the end for an unrenamable path), no file left
expect() { # NAME STATUS PATTERN FILE -- CMD...
    name=$1 want=$2 pat=$3 file=$4; shift 5
    "$@" >"$tmp/out" 2>"$tmp/err"
    got=$?
    if [ "$got" != "$want" ]; then bad "$name: exit $got, expected $want"; cat "$tmp/err"; return; fi
    if ! grep -q -- "$pat" "$tmp/err"; then bad "$name: stderr lacks '$pat'"; cat "$tmp/err"; return; fi
    if [ -f "$file" ] || [ -e "$file.partial" ]; then bad "$name: a profile file was left"; return; fi
    ok "$name"
}
expect "profile path unwritable" 1 "$tmp/no/such/dir/p.jsonl" "$tmp/no/such/dir/p.jsonl" -- \
    "$run" "$tmp/one.plan" -q --profile "$tmp/no/such/dir/p.jsonl"
expect "warm-up beyond the iterations" 2 "profile-warmup 5" "$tmp/w.jsonl" -- \
    "$run" "$tmp/one.plan" -q --iterations 3 --profile-warmup 5 --profile "$tmp/w.jsonl"
expect "warm-up equal to the iterations" 2 "profile-warmup 3" "$tmp/w.jsonl" -- \
    "$run" "$tmp/one.plan" -q --profile-warmup 3 --profile "$tmp/w.jsonl"
expect "negative warm-up" 2 "profile-warmup needs an integer" "$tmp/w.jsonl" -- \
    "$run" "$tmp/one.plan" -q --profile-warmup -1 --profile "$tmp/w.jsonl"
expect "warm-up without --profile" 2 "needs --profile" "$tmp/w.jsonl" -- \
    "$run" "$tmp/one.plan" -q --profile-warmup 1
expect "--profile without a value" 2 "needs a value" "$tmp/w.jsonl" -- "$run" "$tmp/one.plan" --profile
mkdir -p "$tmp/isdir/x"
expect "profile path is a directory" 1 "cannot write the profile file $tmp/isdir" "$tmp/isdir" -- \
    "$run" "$tmp/one.plan" -q --profile "$tmp/isdir"
exit $fail
