#!/bin/sh
# bench_sweep.sh [MGC] - the sweep-speed target (issue: mgc sweep):
#   10,000 variants of a 70B model ranked in under 10 s on 2 cores.
# The sweep: models/llama2-70b.yaml at a fixed world of 1024 GPUs over
#   tensor {1,2,4,8} x pipeline {1,2,4,5,8,10,16,20,40} x virtual_stages
#   {1,2,4,5,10} x micro_batch_size {1,2,4,8,16} x recompute {none,
#   selective, full} x distributed_optimizer x sequence_parallel
#   = 10,800 variants (the smallest product of these natural lists above
#   10,000), each compiled in-process, memory-checked and costed.
# Whole `mgc sweep` process with -j 2, pinned to cores 0 and 1 when taskset
# exists; median wall time of RUNS (3) runs, plus one -j 1 run for the
# parallel speed-up.  Prints a markdown report (bench/results/sweep-cpu.md).
set -eu
cd "$(dirname "$0")/.."
mgc=${1:-build-rel/compiler/mgc}
[ -x "$mgc" ] || { echo "bench_sweep: build first, or pass the mgc path" >&2; exit 2; }
pin=""
command -v taskset >/dev/null 2>&1 && pin="taskset -c 0,1"
runs=${RUNS:-3}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

vary="--vary parallel.tensor=1,2,4,8 --vary parallel.pipeline=1,2,4,5,8,10,16,20,40
      --vary parallel.virtual_stages=1,2,4,5,10 --vary training.micro_batch_size=1,2,4,8,16
      --vary training.recompute=none,selective,full --vary parallel.distributed_optimizer=true,false
      --vary parallel.sequence_parallel=true,false"

now_ns() { date +%s%N; }

# one run: wall ms and the summary line, into $tmp/run.$1
sweep() { # THREADS TAG
  t0=$(now_ns)
  timer=""
  [ -x /usr/bin/time ] && timer="/usr/bin/time -f %U+%S -o $tmp/$2.cpu"
  # shellcheck disable=SC2086
  $pin $timer "$mgc" sweep models/llama2-70b.yaml --world-size 1024 $vary -j "$1" -q --csv "$tmp/$2.csv" \
    >"$tmp/$2.out" 2>"$tmp/$2.err" || { cat "$tmp/$2.err" >&2; exit 1; }
  t1=$(now_ns)
  echo $(( (t1 - t0) / 1000000 )) >"$tmp/$2.ms"
  if [ -f "$tmp/$2.cpu" ]; then tail -1 "$tmp/$2.cpu" | awk -F+ '{printf "%.2f\n", $1 + $2}' >>"$tmp/cpu"; fi
}

load0=$(cut -d' ' -f1-3 /proc/loadavg 2>/dev/null || echo "?")
: >"$tmp/ms"
: >"$tmp/cpu"
i=0
while [ $i -lt "$runs" ]; do
  sweep 2 "r$i"
  cat "$tmp/r$i.ms" >>"$tmp/ms"
  [ $i -eq 0 ] || cmp -s "$tmp/r0.csv" "$tmp/r$i.csv" || { echo "bench_sweep: runs differ" >&2; exit 1; }
  i=$((i + 1))
done
sweep 1 one
cmp -s "$tmp/r0.csv" "$tmp/one.csv" || { echo "bench_sweep: -j 1 and -j 2 differ" >&2; exit 1; }
med=$(sort -n "$tmp/ms" | awk '{a[NR]=$1} END {printf "%.2f", a[int((NR+1)/2)]/1000}')
all=$(sort -n "$tmp/ms" | awk '{printf "%s%.2f", (NR > 1 ? ", " : ""), $1/1000}')
one=$(awk '{printf "%.2f", $1/1000}' "$tmp/one.ms")
# CPU seconds (user + sys) of the median -j 2 run, and of the -j 1 run (last line)
cpu2=$(head -n "$runs" "$tmp/cpu" | sort -n | awk '{a[NR]=$1} END {if (NR) print a[int((NR+1)/2)]; else print "?"}')
cpu1=$(sed -n "$((runs + 1))p" "$tmp/cpu")
load1=$(cut -d' ' -f1-3 /proc/loadavg 2>/dev/null || echo "?")
summary=$(head -1 "$tmp/r0.out")
best=$(sed -n 2p "$tmp/r0.out")
# counts from the summary line: "N variants of F, X feasible, Y infeasible (memory a, ...)"
count() { echo "$summary" | grep -o "$1 [0-9]*" | head -1 | awk '{print $NF}'; }
n=$(echo "$summary" | awk '{print $3}')
feas=$(echo "$summary" | grep -o "[0-9]* feasible" | awk '{print $1}')
cat_count() { c=$(count "$1"); echo "${c:-0}"; }
pass=$(awk -v m="$med" 'BEGIN {print (m < 10) ? "yes" : "no"}')

echo "# Sweep benchmark"
echo
echo "- date: $(date -u +%Y-%m-%dT%H:%MZ)"
dirty=""
git diff --quiet HEAD -- 2>/dev/null || dirty=" (with uncommitted changes)"
echo "- commit: $(git rev-parse --short HEAD 2>/dev/null || echo unknown)$dirty"
echo "- machine: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//'), $(nproc) cores${pin:+, pinned to cores 0,1}"
echo "- binary: $mgc"
echo "- load average (1, 5, 15 min) before / after: $load0 / $load1 (other work on the machine slows the wall times; the CPU seconds show the sweep's own work)"
echo "- command: \`mgc sweep models/llama2-70b.yaml --world-size 1024 $(echo $vary) -j 2 -q --csv FILE\`"
echo
echo "| variants | feasible | infeasible: memory | invalid config | world size | compile error |"
echo "|---|---|---|---|---|---|"
echo "| $n | $feas | $(cat_count memory) | $(cat_count "invalid config") | $(cat_count "world size") | $(cat_count "compile error") |"
echo
echo "| threads | wall s (median of $runs) | every run | CPU s (user + sys) | target |"
echo "|---|---|---|---|---|"
echo "| 2 | $med | $all | ${cpu2:-?} | < 10 s: $pass |"
echo "| 1 | $one | $one | ${cpu1:-?} | |"
echo
echo "Every variant is parsed from the base text, checked, and -- when it checks -- compiled to a"
echo "full plan (partition, schedule, memory plan: the arena \`mgc compile\` would report) and"
echo "costed; the infeasible-by-divisibility ones stop at the config check.  The CSV of every run"
echo "is byte-identical (and identical to the -j 1 run)."
echo
echo '```'
echo "$summary"
echo "$best"
echo '```'
