#!/bin/sh
# bench_gpu.sh BUILD OUT - GPU training throughput (scripts/gpu.sh runs it on
# the lent GPU machine): GPT-2 124M and GPT-2 1.5B, seq 1024, bf16, one GPU,
# mgc against PyTorch eager and torch.compile (SDPA flash attention) in the
# same run, with the device's measured ceilings.  Writes OUT/bench-gpu.md.
#
# MFU = model FLOPs per step / step time / 989.4e12 (H100 SXM dense bf16 peak),
# model FLOPs = 6 N T + 12 L h s T (N parameters without the position table,
# T tokens per step, L layers, h hidden, s sequence; PaLM/Megatron convention,
# causal attention counted whole as Megatron does).
set -u
BUILD=${1:-build-gpu} OUT=${2:-build-gpu/out}
MGC=$BUILD/compiler/mgc RUN=$BUILD/runtime/mgc-run
PY=${PYTHON:-python3}
STEPS=${STEPS:-30}
mkdir -p "$OUT"
T=$OUT/bench-gpu.md
ceil=$($PY bench/torch_gpt_gpu.py --ceilings 2>"$OUT/ceil.err") || ceil='{}'
echo "$ceil" >"$OUT/ceilings.json"
med() { $PY -c "import json,sys,statistics; v=[json.loads(l)[sys.argv[2]] for l in open(sys.argv[1])][8:]; print(statistics.median(v))" "$@"; }
row() { # name model-args mgc-sets mbs
    name=$1 margs=$2 model=$3 mbs=$4
    # shellcheck disable=SC2086
    $MGC compile "$model" --set parallel.world_size=1 --set parallel.tensor=1 --set parallel.pipeline=1 \
        --set parallel.data=1 --set parallel.context=1 --set training.precision=bf16 \
        --set training.recompute=none --set training.micro_batch_size=$mbs \
        --set training.global_batch_size=$mbs --set hardware.cuda_archs=[90] \
        -o "$OUT/$name.plan" >"$OUT/$name.compile.log" 2>&1 || { echo "| $name | mgc | compile failed: $(tail -n 1 "$OUT/$name.compile.log") |"; return; }
    if $RUN "$OUT/$name.plan" --backend cuda --iterations $STEPS -q --metrics "$OUT/$name.jsonl" >"$OUT/$name.run.log" 2>&1; then
        echo "| $name | mgc | $(med "$OUT/$name.jsonl" step_ms) | $(med "$OUT/$name.jsonl" tokens_per_s) | $(sed -n 's/.*"arena_bytes": \([0-9]*\).*/\1/p' "$OUT/$name.jsonl" | tail -n 1) |"
    else
        echo "| $name | mgc | failed: $(tail -n 1 "$OUT/$name.run.log") |"
    fi
    for c in "" --compile; do
        # shellcheck disable=SC2086
        j=$($PY bench/torch_gpt_gpu.py $margs --mbs $mbs --steps $STEPS $c 2>"$OUT/$name.torch$c.err") || { echo "| $name | torch$c | failed |"; continue; }
        echo "| $name | $(echo "$j" | $PY -c 'import json,sys; d=json.load(sys.stdin); print("%s | %.2f | %.0f | %d" % (d["impl"], d["median_step_ms"], d["tokens_per_s"], d["max_memory_bytes"]))') |"
    done
}
{
    echo "# GPU training throughput"
    echo
    echo "- $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null || echo 'no nvidia-smi')"
    echo "- commit $(git describe --always --dirty 2>/dev/null), $(date -u +%Y-%m-%d)"
    echo "- ceilings: $ceil"
    echo
    echo "| model | implementation | median step ms | tokens/s | memory bytes |"
    echo "|---|---|---:|---:|---:|"
    row gpt2-124m "--hidden 768 --layers 12 --heads 12 --ffn 3072" models/gpt2-124m.yaml 8
    row gpt2-1.5b "--hidden 1600 --layers 48 --heads 25 --ffn 6400" models/gpt2-1.5b.yaml 4
} | tee "$T"
