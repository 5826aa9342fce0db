#!/bin/sh
# comm_tcp.sh TEST_COMM - the TCP transport as separate processes, launched the torchrun way
# (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT): every grid of 8 ranks through every operation
# against the serial reference (test_comm --tcp grids), a rank's abort releasing the others
# at once, a rank that exits noticed by the others, and the rendezvous' refusals (a world
# size that differs, a rank twice, a port that is taken), each a clear error, never a hang.
set -u
bin=$1
tmp=$(mktemp -d) || exit 1
trap 'rm -rf "$tmp"' EXIT
fail=0
port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
# run N MODE: N processes of test_comm --tcp MODE; each one's output in $tmp/MODE.R
run() {
    n=$1 mode=$2 p=$(port) pids=""
    r=0
    while [ "$r" -lt "$n" ]; do
        RANK=$r WORLD_SIZE=$n MASTER_ADDR=127.0.0.1 MASTER_PORT=$p timeout 120 "$bin" --tcp "$mode" \
            >"$tmp/$mode.$r" 2>&1 &
        pids="$pids $!"
        r=$((r + 1))
    done
    rc=0
    for pid in $pids; do wait "$pid" || rc=1; done
    return $rc
}
ok() { echo "ok: $1"; }
bad() { echo "FAIL: $1"; fail=1; }
if run 8 grids; then ok "8 ranks: every grid and operation, a 4 MB all-reduce, a mismatch reported"
else bad "8 ranks"; cat "$tmp"/grids.*; fi
grep -h 'tcp mismatch report' "$tmp"/grids.0
if run 4 abort; then ok "an abort releases the others with its reason"; else bad "abort"; cat "$tmp"/abort.*; fi
grep -h 'tcp abort report' "$tmp"/abort.0
if run 3 vanish; then ok "a rank that exits is noticed"; else bad "vanish"; cat "$tmp"/vanish.*; fi
grep -h 'tcp vanish report' "$tmp"/vanish.0
# refusals at the rendezvous: rank 0 names the problem, everyone exits non-zero
p=$(port)
RANK=0 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$p timeout 60 "$bin" --tcp grids >"$tmp/ws.0" 2>&1 &
a=$!
RANK=1 WORLD_SIZE=3 MASTER_ADDR=127.0.0.1 MASTER_PORT=$p timeout 60 "$bin" --tcp grids >"$tmp/ws.1" 2>&1 &
b=$!
wait $a; ra=$?
wait $b; rb=$?
if [ $ra -ne 0 ] && [ $rb -ne 0 ] && grep -q 'joined by a process with RANK=1 and WORLD_SIZE=3' "$tmp/ws.0"; then
    ok "different world sizes refused: $(grep -o 'tcp world:.*' "$tmp/ws.0" | head -1)"
else bad "different world sizes ($ra $rb)"; cat "$tmp"/ws.*; fi
p=$(port)
RANK=0 WORLD_SIZE=3 MASTER_ADDR=127.0.0.1 MASTER_PORT=$p timeout 60 "$bin" --tcp grids >"$tmp/tw.0" 2>&1 &
a=$!
RANK=1 WORLD_SIZE=3 MASTER_ADDR=127.0.0.1 MASTER_PORT=$p timeout 60 "$bin" --tcp grids >"$tmp/tw.1" 2>&1 &
b=$!
RANK=1 WORLD_SIZE=3 MASTER_ADDR=127.0.0.1 MASTER_PORT=$p timeout 60 "$bin" --tcp grids >"$tmp/tw.2" 2>&1 &
c=$!
wait $a; ra=$?
wait $b; rb=$?
wait $c; rc=$?
if [ $ra -ne 0 ] && [ $rb -ne 0 ] && [ $rc -ne 0 ] && grep -q 'RANK=1 and WORLD_SIZE=3 a second time' "$tmp/tw.0"; then
    ok "a rank given twice refused"
else bad "a rank twice ($ra $rb $rc)"; cat "$tmp"/tw.*; fi
# the port is taken (by a listener of our own)
python3 -c 'import socket,sys,time; s=socket.socket(); s.bind(("0.0.0.0",0)); s.listen(1); print(s.getsockname()[1], flush=True); time.sleep(30)' >"$tmp/held" &
holder=$!
sleep 0.5
p=$(cat "$tmp/held")
if RANK=0 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$p timeout 60 "$bin" --tcp grids >"$tmp/pt" 2>&1; then
    bad "a taken port"
elif grep -q "MASTER_PORT is taken" "$tmp/pt"; then ok "a taken port refused"
else bad "a taken port: $(cat "$tmp/pt")"; fi
kill $holder 2>/dev/null
# a bad environment
if RANK=5 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=1 "$bin" --tcp grids >"$tmp/env" 2>&1; then bad "RANK past WORLD_SIZE"
elif grep -q 'RANK=5 is not an integer from 0 to 1' "$tmp/env"; then ok "RANK past WORLD_SIZE refused"
else bad "RANK past WORLD_SIZE: $(cat "$tmp/env")"; fi
[ $fail = 0 ] && echo "comm_tcp: all passed"
exit $fail
