#!/bin/sh
# bench_compile.sh [MGC] - compile-speed targets (issue 3):
#   - the 1-trillion-parameter row of Narayanan et al. 2021
#     (bench/configs/narayanan-1t.yaml: 64 stages, 512 microbatches) compiles
#     in under 1 s and 1 GiB of RAM on one core;
#   - a GPT-2 124M plan in under 50 ms.
# Whole `mgc compile -o` process, pinned to one core; wall time and peak RSS
# from the kernel (getrusage via /usr/bin/time when present, else /proc).
set -eu
cd "$(dirname "$0")/.."
mgc=${1:-build/compiler/mgc}
[ -x "$mgc" ] || { echo "bench_compile: build first, or pass the mgc path" >&2; exit 2; }
pin=""
command -v taskset >/dev/null 2>&1 && pin="taskset -c 0"
runs=${RUNS:-5}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

now_ns() { date +%s%N; }

# median wall ms and max RSS (KiB) over $runs runs of: mgc compile ARGS -o plan
measure() {
  : >"$tmp/t"
  : >"$tmp/m"
  i=0
  while [ $i -lt "$runs" ]; do
    t0=$(now_ns)
    if [ -x /usr/bin/time ]; then
      $pin /usr/bin/time -f %M -o "$tmp/rss" "$mgc" compile "$@" -o "$tmp/p.plan" >/dev/null 2>"$tmp/err" || { cat "$tmp/err" >&2; exit 1; }
      cat "$tmp/rss" >>"$tmp/m"
    else
      $pin "$mgc" compile "$@" -o "$tmp/p.plan" >/dev/null 2>"$tmp/err" || { cat "$tmp/err" >&2; exit 1; }
      echo 0 >>"$tmp/m"
    fi
    t1=$(now_ns)
    echo $(( (t1 - t0) / 1000 )) >>"$tmp/t"
    i=$((i + 1))
  done
  ms=$(sort -n "$tmp/t" | awk '{a[NR]=$1} END {printf "%.1f", a[int((NR+1)/2)]/1000}')
  rss=$(sort -n "$tmp/m" | tail -1)
  size=$(wc -c <"$tmp/p.plan")
  echo "$ms $rss $size"
}

echo "# Compile benchmark"
echo
echo "- date: $(date -u +%Y-%m-%dT%H:%MZ)"
echo "- commit: $(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
echo "- machine: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//'), $(nproc) cores${pin:+, pinned to core 0}"
echo "- binary: $mgc"
echo
echo "| config | layout | wall ms (median of $runs) | peak RSS MiB | plan bytes | target |"
echo "|---|---|---|---|---|---|"
row() {
  name=$1; layout=$2; target=$3; shift 3
  r=$(measure "$@")
  set -- $r
  echo "| $name | $layout | $1 | $(awk "BEGIN {printf \"%.1f\", $2/1024}") | $3 | $target |"
}
row narayanan-1t "t8 p64 d6, m=512, 1f1b" "< 1000 ms, < 1024 MiB" bench/configs/narayanan-1t.yaml
row narayanan-1t "t8 p64 d6, m=512, interleaved v=2" "(same)" bench/configs/narayanan-1t.yaml --set parallel.virtual_stages=2
row gpt2-124m "d8, m=4" "< 50 ms" models/gpt2-124m.yaml
row gpt3-175b "t8 p16 v2 d12, m=128" "" models/gpt3-175b.yaml
row llama2-70b "t8 p4 v4 d16" "" models/llama2-70b.yaml
row mixtral-8x7b "e8 p4" "" models/mixtral-8x7b.yaml
