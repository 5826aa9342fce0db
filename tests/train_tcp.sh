#!/bin/sh
# train_tcp.sh MGC MGC_RUN - mgc-run as one process per rank over TCP, started the torchrun
# way (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT): every step's loss and gradient norm the
# same bits as the same plan's ranks as threads (the reductions fold in the same order);
# checkpoints written by the processes resume bit for bit; a WORLD_SIZE that is not the
# plan's is refused with the fix.
set -u
mgc=$1 run=$2
tmp=$(mktemp -d) || exit 1
trap 'rm -rf "$tmp"' EXIT
fail=0
common="--no-kernels --set training.iterations=8 --set optimizer.warmup_iterations=2 --set model.seq_length=32 --set training.micro_batch_size=2 --set training.global_batch_size=4"
port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
# tcp N PLAN ARGS...: N processes; rank 0's output in $tmp/out, the others' in $tmp/out.R
tcp() {
    n=$1 plan=$2
    shift 2
    pt=$(port) pids="" r=0
    while [ "$r" -lt "$n" ]; do
        o="$tmp/out"; [ "$r" -gt 0 ] && o="$tmp/out.$r"
        RANK=$r WORLD_SIZE=$n MASTER_ADDR=localhost MASTER_PORT=$pt timeout 300 "$run" "$plan" "$@" >"$o" 2>&1 &
        pids="$pids $!"
        r=$((r + 1))
    done
    rc=0
    for pid in $pids; do wait "$pid" || rc=1; done
    return $rc
}
same() { # metrics files a b: loss and grad_norm lists equal, 8 steps
    python3 - "$1" "$2" <<'PY'
import json, sys
rd = lambda p: [(j["loss"], j["grad_norm"]) for j in map(json.loads, open(p))]
a, b = rd(sys.argv[1]), rd(sys.argv[2])
print("  losses %s" % " ".join("%.6f" % x for x, _ in a))
sys.exit(0 if len(a) == 8 and a == b else 1)
PY
}
check() { # name model nranks sets...
    name=$1 model=$2 n=$3
    shift 3
    # shellcheck disable=SC2086
    "$mgc" compile "$model" $common "$@" -o "$tmp/$name.plan" >/dev/null 2>"$tmp/$name.compile" || { echo "FAIL: $name: compile"; cat "$tmp/$name.compile"; fail=1; return; }
    "$run" "$tmp/$name.plan" -q --local-ranks "$n" --metrics "$tmp/$name.threads.jsonl" || { echo "FAIL: $name: threads"; fail=1; return; }
    if tcp "$n" "$tmp/$name.plan" -q --metrics "$tmp/$name.tcp.jsonl" && same "$tmp/$name.threads.jsonl" "$tmp/$name.tcp.jsonl"; then
        echo "ok: $name: $n processes over TCP, losses and norms bit-identical to $n threads"
    else
        echo "FAIL: $name"; cat "$tmp"/out*; fail=1
    fi
}
check gpt-tp2-pp2-dp2 examples/tiny-gpt.yaml 8 --set parallel.world_size=8 --set parallel.tensor=2 --set parallel.pipeline=2 --set parallel.data=2
check moe-etp2-ep2 models/tiny-moe.yaml 4 --set parallel.world_size=4 --set parallel.tensor=2 --set parallel.sequence_parallel=true --set parallel.data=2 --set parallel.expert=2
# checkpoints through TCP processes: stop after step 4, resume to 8: the unbroken run's numbers
p=$tmp/gpt-tp2-pp2-dp2.plan
if [ -f "$p" ] && tcp 8 "$p" -q --checkpoint-dir "$tmp/ck" --iterations 4 && tcp 8 "$p" -q --checkpoint-dir "$tmp/ck" --metrics "$tmp/resumed.jsonl" &&
    python3 - "$tmp/gpt-tp2-pp2-dp2.threads.jsonl" "$tmp/resumed.jsonl" <<'PY'
import json, sys
a = [json.loads(l) for l in open(sys.argv[1])][4:]
b = [json.loads(l) for l in open(sys.argv[2])]
sys.exit(0 if [(x["step"], x["loss"]) for x in a] == [(x["step"], x["loss"]) for x in b] else 1)
PY
then echo "ok: 8 TCP processes stopped at step 4 and resumed: steps 5-8 bit-identical"
else echo "FAIL: checkpoints over TCP"; cat "$tmp"/out*; fail=1; fi
# the plan's world size, not WORLD_SIZE's
if tcp 2 "$p" -q; then echo "FAIL: WORLD_SIZE 2 for an 8-rank plan ran"; fail=1
elif grep -q 'the plan is for 8 ranks but WORLD_SIZE is 2: start 8 processes with WORLD_SIZE=8' "$tmp/out"; then
    echo "ok: WORLD_SIZE 2 for an 8-rank plan refused"
else echo "FAIL: WORLD_SIZE refusal: $(cat "$tmp/out")"; fail=1; fi
[ $fail = 0 ] && echo "train_tcp: all passed"
exit $fail
