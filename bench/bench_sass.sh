#!/bin/sh
# bench_sass.sh [MGC] - static SASS instruction counts of the GPU kernels of two bench plans,
# compiled by NVRTC for sm_90 exactly as `mgc compile` puts them in a plan.  No GPU needed.
#
#   sh bench/bench_sass.sh build/compiler/mgc > bench/results/sass-static.md
#
# The plans: GPT-2 124M as bench_gpu.sh trains it (bf16, micro batch 8, no dropout) and a
# LLaMA-style model at head dim 128 (llama2-7b's shapes, 2 layers).  The counts come from
# bench/sass_stats.py (cuobjdump of the CUDA toolkit, or the copy in the triton wheel of
# build/bench-venv; MGC_CUOBJDUMP names another).  They are sizes of code, not times: a kernel's
# hot loop is every path of it.  KERNELS (a grep pattern, default "attention") picks the rows.
set -eu
MGC=${1:-build/compiler/mgc}
PY=${PYTHON:-python3}
HERE=$(cd "$(dirname "$0")" && pwd)
[ -x "$MGC" ] || { echo "bench_sass: no mgc at $MGC (build it, or pass its path)" >&2; exit 2; }
# no cuobjdump: NVIDIA's cuobjdump and nvdisasm wheels from PyPI, into build/sass-venv
found="import sys; sys.path.insert(0, '$HERE'); import sass_stats
sys.exit(0 if sass_stats.find_cuobjdump() else 1)"
if [ -z "${MGC_CUOBJDUMP:-}" ] && ! "$PY" -c "$found"; then
    venv="$HERE/../build/sass-venv"
    { [ -x "$venv/bin/pip" ] || "$PY" -m venv "$venv"; } &&
        "$venv/bin/pip" install -q nvidia-cuda-cuobjdump==13.2.51 \
            nvidia-cuda-nvdisasm==13.2.51 >&2 ||
        { echo "bench_sass: no cuobjdump, and pip could not install one" \
               "(MGC_CUOBJDUMP names one)" >&2; exit 2; }
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT INT TERM
common="--set parallel.world_size=1 --set parallel.tensor=1 --set parallel.pipeline=1
 --set parallel.data=1 --set parallel.context=1 --set training.precision=bf16
 --set training.recompute=none --set model.hidden_dropout=0 --set model.attention_dropout=0
 --set hardware.cuda_archs=[90]"

echo "# Static SASS of mgc's kernels (sm_90, no GPU)"
echo
echo "- commit: $(git -C "$HERE/.." rev-parse --short HEAD 2>/dev/null || echo unknown)"
echo "- $("$MGC" version | sed -n 2p | cut -d' ' -f1-2), sm_90 cubins as \`mgc compile\` writes them"
echo "- command: \`sh bench/bench_sass.sh\` (bench/sass_stats.py: registers, instructions of the"
echo "  kernel and of its hot loop: the loop with the most mma, else the most global memory"
echo "  instructions, every path of it; LDG: global loads, LDG waits: the instructions that read"
echo "  a register one of them writes, a wait for memory each, walking the code in order)"
for m in "gpt2-124m|models/gpt2-124m.yaml|--set training.micro_batch_size=8 --set training.global_batch_size=8" \
         "llama-d128|models/llama2-7b.yaml|--set training.micro_batch_size=1 --set training.global_batch_size=1 --set model.num_layers=2"; do
    name=${m%%|*} rest=${m#*|} yaml=${rest%%|*} sets=${rest#*|}
    # shellcheck disable=SC2086
    MGC_KERNEL_CACHE="$tmp/$name" "$MGC" compile "$yaml" $common $sets -o "$tmp/$name.plan" \
        >"$tmp/$name.log" 2>&1 || { echo "bench_sass: $name: compile failed: $(tail -n 1 "$tmp/$name.log")" >&2; exit 1; }
    echo
    echo "## $name"
    echo
    # shellcheck disable=SC2046
    "$PY" "$HERE/sass_stats.py" $(ls "$tmp/$name"/*-sm90-*.cubin | grep -E "${KERNELS:-attention}") |
        sed 's/| mgc_\([a-z0-9_]*\)_bf16/| \1 bf16/'
done
