#!/bin/sh
# bench_frontend.sh [MGC] - front-end speed targets (issue 2):
#   - `mgc check` and `mgc info` of any model in models/ in under 20 ms
#     (whole process, as a user or CI runs it);
#   - checking 1,000 configs in one `mgc check` call in under 2 s on one core.
# Writes a markdown report to stdout; pin to one core with taskset when present.
set -eu
cd "$(dirname "$0")/.."
mgc=${1:-build/compiler/mgc}
[ -x "$mgc" ] || { echo "bench_frontend: build first (cmake --build build), or pass the mgc path" >&2; exit 2; }
pin=""
command -v taskset >/dev/null 2>&1 && pin="taskset -c 0"
runs=${RUNS:-30}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

now_ns() { date +%s%N; }

# median and max of the per-run wall times (ms) of "$@"
time_cmd() {
  i=0
  : >"$tmp/times"
  while [ $i -lt "$runs" ]; do
    t0=$(now_ns)
    $pin "$@" >/dev/null 2>&1 || true
    t1=$(now_ns)
    echo $(( (t1 - t0) / 1000 )) >>"$tmp/times"
    i=$((i + 1))
  done
  sort -n "$tmp/times" | awk '{a[NR]=$1} END {printf "%.2f %.2f", a[int((NR+1)/2)]/1000, a[NR]/1000}'
}

echo "# Front-end benchmark"
echo
echo "- date: $(date -u +%Y-%m-%dT%H:%MZ)"
echo "- commit: $(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
echo "- machine: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//'), $(nproc) cores${pin:+, pinned to core 0}"
echo "- binary: $mgc ($(cd "$(dirname "$mgc")/.." && grep -m1 CMAKE_BUILD_TYPE CMakeCache.txt 2>/dev/null | cut -d= -f2 || echo '?') build)"
echo
echo "## Per model, whole process (target: < 20 ms), median / max of $runs runs"
echo
echo "| model | check ms | info ms |"
echo "|---|---|---|"
worst=0
for f in models/*.yaml; do
  c=$(time_cmd "$mgc" check "$f")
  i=$(time_cmd "$mgc" info "$f")
  echo "| $(basename "$f" .yaml) | ${c% *} / ${c#* } | ${i% *} / ${i#* } |"
done

# 1,000 distinct valid configs: resolved variants of the models (micro batch,
# sequence length, iterations), written by mgc itself
set -- models/*.yaml
nm=$#
n=0
i=0
while [ $n -lt 1000 ] && [ $i -lt 5000 ]; do
  k=$((i % nm + 1))
  eval "f=\${$k}"
  mbs=$((1 << (i / nm % 4)))
  seq=$((256 * (1 + i / (nm * 4) % 8)))
  "$mgc" info --config "$f" --set training.micro_batch_size=$mbs --set model.seq_length=$seq \
     --set model.max_position_embeddings=$seq --set training.global_batch_size= \
     --set training.gradient_accumulation_steps= --set training.iterations=$((1000 + i)) \
     >"$tmp/v$n.yaml" 2>/dev/null && n=$((n + 1))
  i=$((i + 1))
done
echo
echo "## $n configs in one call (target: < 2000 ms on one core), median / max of 5 runs"
echo
runs=5
r=$(time_cmd "$mgc" check -q "$tmp"/v*.yaml)
echo "| configs | ms |"
echo "|---|---|"
echo "| $n | ${r% *} / ${r#* } |"
