#!/bin/sh
# bench_loss_chunks.sh BUILD OUT - the output layer and cross-entropy in row chunks
# (training.loss_chunks, docs/partitioning.md) on the GPU: GPT-2 124M (micro batch 8) and
# GPT-2 1.5B (micro batch 4), seq 1024, bf16, one GPU, no dropout, as bench_gpu.sh's rows;
# each at loss_chunks 1 (the fp32 logits stashed from the forward), 2, 4 and auto (0), the
# chunked ones with the cross-entropy's statistics fused into its backward (ce_fused, the
# default at tensor parallel 1) and unfused (MGC_CE_FUSE=0).  Median step ms of STEPS (after
# the first 8) and the arena.  Writes OUT/loss-chunks.md.  LC_MODELS="gpt2-124m" and
# LC_KS="1 0" narrow it.
set -u
BUILD=${1:-build-gpu} OUT=${2:-build-gpu/out}
MGC=$BUILD/compiler/mgc RUN=$BUILD/runtime/mgc-run
PY=${PYTHON:-python3}
STEPS=${STEPS:-20}
mkdir -p "$OUT"
med() { $PY -c "import json,sys,statistics; v=[json.loads(l)[sys.argv[2]] for l in open(sys.argv[1])][8:]; print('%.2f' % statistics.median(v))" "$@"; }
{
    echo "| model | loss_chunks | cross-entropy | median step ms | arena bytes |"
    echo "|---|---:|---|---:|---:|"
    for m in ${LC_MODELS:-gpt2-124m gpt2-1.5b}; do
        case $m in gpt2-1.5b) mbs=4 ;; *) mbs=8 ;; esac
        for k in ${LC_KS:-1 2 4 0}; do
            for fuse in 1 0; do
                [ $k = 1 ] && [ $fuse = 0 ] && continue # one chunk: nothing to fuse
                tag=$m.lc$k.f$fuse
                if MGC_CE_FUSE=$fuse $MGC compile "models/$m.yaml" --set parallel.world_size=1 \
                    --set parallel.tensor=1 --set parallel.pipeline=1 --set parallel.data=1 \
                    --set parallel.context=1 --set training.precision=bf16 --set training.recompute=none \
                    --set training.micro_batch_size=$mbs --set training.global_batch_size=$mbs \
                    --set model.hidden_dropout=0 --set model.attention_dropout=0 \
                    --set training.loss_chunks=$k --set hardware.cuda_archs=[90] \
                    -o "$OUT/$tag.plan" >"$OUT/$tag.compile.log" 2>&1 &&
                    $RUN "$OUT/$tag.plan" --backend cuda --iterations "$STEPS" -q \
                        --metrics "$OUT/$tag.jsonl" >"$OUT/$tag.log" 2>&1; then
                    kk=$k
                    [ $k = 0 ] && kk="auto ($(sed -n 's/.*the head in \([0-9]*\) loss chunk.*/\1/p' "$OUT/$tag.compile.log" | head -n 1))"
                    echo "| $m | $kk | $([ $k = 1 ] && echo 'forward + backward' || { [ $fuse = 1 ] && echo fused || echo unfused; }) | $(med "$OUT/$tag.jsonl" step_ms) | $(sed -n 's/.*"arena_bytes": \([0-9]*\).*/\1/p' "$OUT/$tag.jsonl" | tail -n 1) |"
                else
                    echo "| $m | $k | fuse $fuse | failed: $(tail -n 1 "$OUT/$tag.log" 2>/dev/null) |"
                fi
            done
        done
    done
} | tee "$OUT/loss-chunks.md"
