#!/bin/sh
# bench_gpu.sh BUILD OUT - GPU training throughput (scripts/gpu.sh runs it on
# the lent GPU machine): GPT-2 124M and GPT-2 1.5B, seq 1024, bf16, one GPU,
# mgc against PyTorch eager and torch.compile (SDPA flash attention) in the
# same run, with the device's measured ceilings.  Writes OUT/bench-gpu.md.
#
# Both sides train without dropout (the PyTorch model has none; mgc's models
# set 0.1, overridden here), so the two compute the same function.
# BENCH_MODELS="gpt2-124m" (default both), BENCH_TORCH=0 (mgc rows only) and
# BENCH_PROFILE_MODELS="gpt2-124m" (per-kernel profile and fitted cost model only for
# these; default every model) and BENCH_AB=0 (no extra mgc rows: without cuBLASLt's
# epilogues, without CUDA graphs; BENCH_AB_MODELS, default gpt2-124m, says for which; and the
# two-ranks-on-one-GPU rows), BENCH_TUNE=0 (no row with a GEMM tuning file) and BENCH_LOGITS=0
# (no row with bf16 logits, training.logits_dtype: compute) shorten a run.
#
# MFU = model FLOPs per step / step time / 989.4e12 (H100 SXM dense bf16 peak),
# model FLOPs = 6 N T + 12 L h s T (N parameters without the position table,
# T tokens per step, L layers, h hidden, s sequence; PaLM/Megatron convention,
# causal attention counted whole as Megatron does).
#
# Cost model (issue 6): each mgc row also gets its predicted step time with the
# built-in profile of the device (h100-sxm) and with a profile fitted from a
# profiled run of the same plan (mgc-run --profile + mgc calibrate), against
# the measured median; written to OUT/cost-model.md and appended to the report.
# Last, bench/targets.py judges the report against the CUDA backend's targets
# (docs/cuda-backend.md) and appends its table.
set -u
BUILD=${1:-build-gpu} OUT=${2:-build-gpu/out}
MGC=$BUILD/compiler/mgc RUN=$BUILD/runtime/mgc-run
PY=${PYTHON:-python3}
STEPS=${STEPS:-30}
mkdir -p "$OUT"
T=$OUT/bench-gpu.md
rm -f "$OUT/cost-model.md" "$OUT/attention.md" "$OUT"/kernels-*.md
ceil=$($PY bench/torch_gpt_gpu.py --ceilings 2>"$OUT/ceil.err") || ceil='{}'
echo "$ceil" >"$OUT/ceilings.json"
med() { $PY -c "import json,sys,statistics; v=[json.loads(l)[sys.argv[2]] for l in open(sys.argv[1])][8:]; m=statistics.median(v); print(\"%.2f\" % m if m < 1e4 else \"%.0f\" % m)" "$@"; }
predict_row() { # name measured-step-ms model-args mbs: the cost model against the measurement
    name=$1 meas=$2 margs=$3 mbs=$4
    pb=$($MGC inspect --json --hardware h100-sxm "$OUT/$name.plan" 2>/dev/null | $PY -c 'import json,sys; print(json.load(sys.stdin)["predicted"]["step_s"]*1e3)') || pb=nan
    pf=nan
    prof=1
    case " ${BENCH_PROFILE_MODELS:-$name} " in *" $name "*) ;; *) prof=0 ;; esac
    if [ $prof = 1 ] && $RUN "$OUT/$name.plan" --backend cuda --iterations 6 --profile-warmup 2 -q --profile "$OUT/$name.prof.jsonl" >"$OUT/$name.prof.log" 2>&1 &&
       $MGC calibrate "$OUT/$name.plan" "$OUT/$name.prof.jsonl" -o "$OUT/$name.fit.yaml" >"$OUT/$name.fit.log" 2>&1; then
        # each kernel kind against the ceilings measured in this run (issue 5's per-kernel figures)
        cg=$($PY -c 'import json,sys; print(json.load(open(sys.argv[1]))["copy_bytes_per_s"]/1e9)' "$OUT/ceilings.json" 2>/dev/null) && cg="--copy-gbs $cg" || cg=
        gt=$($PY -c 'import json,sys; print(json.load(open(sys.argv[1]))["bf16_gemm_flops"]/1e12)' "$OUT/ceilings.json" 2>/dev/null) && gt="--gemm-tflops $gt" || gt=
        # shellcheck disable=SC2086
        $MGC profile "$OUT/$name.plan" "$OUT/$name.prof.jsonl" $cg $gt >"$OUT/kernels-$name.md" 2>&1
        pf=$($MGC inspect --json --hardware "$OUT/$name.fit.yaml" "$OUT/$name.plan" 2>/dev/null | $PY -c 'import json,sys; print(json.load(sys.stdin)["predicted"]["step_s"]*1e3)') || pf=nan
        # attention alone against PyTorch's SDPA (flash) at the same shape, in this run
        # shellcheck disable=SC2086
        $PY bench/torch_gpt_gpu.py $margs --mbs $mbs --sdpa >"$OUT/$name.sdpa.json" 2>"$OUT/$name.sdpa.err" &&
            $PY bench/attn_row.py "$OUT/$name.prof.jsonl" "$OUT/$name.sdpa.json" "$name" >>"$OUT/attention.md"
    fi
    $PY -c 'import sys; m,b,f=map(float,sys.argv[2:5]); e=lambda p: "%+.1f%%" % (100*(p-m)/m) if p==p else "n/a"; print("| %s | %.2f | %.2f | %s | %.2f | %s |" % (sys.argv[1], m, b, e(b), f, e(f)))' \
        "$name" "$meas" "$pb" "$pf" >>"$OUT/cost-model.md"
}
row() { # name model-args mgc-sets mbs
    name=$1 margs=$2 model=$3 mbs=$4
    # shellcheck disable=SC2086
    $MGC compile "$model" --set parallel.world_size=1 --set parallel.tensor=1 --set parallel.pipeline=1 \
        --set parallel.data=1 --set parallel.context=1 --set training.precision=bf16 \
        --set training.recompute=none --set training.micro_batch_size=$mbs \
        --set model.hidden_dropout=0 --set model.attention_dropout=0 \
        --set training.global_batch_size=$mbs --set hardware.cuda_archs=[90] \
        -o "$OUT/$name.plan" >"$OUT/$name.compile.log" 2>&1 || { echo "| $name | mgc | compile failed: $(tail -n 1 "$OUT/$name.compile.log") |"; return; }
    if $RUN "$OUT/$name.plan" --backend cuda --iterations $STEPS -q --metrics "$OUT/$name.jsonl" >"$OUT/$name.run.log" 2>&1; then
        echo "| $name | mgc | $(med "$OUT/$name.jsonl" step_ms) | $(med "$OUT/$name.jsonl" tokens_per_s) | $(sed -n 's/.*"arena_bytes": \([0-9]*\).*/\1/p' "$OUT/$name.jsonl" | tail -n 1) |"
        predict_row "$name" "$(med "$OUT/$name.jsonl" step_ms)" "$margs" "$mbs"
    else
        echo "| $name | mgc | failed: $(tail -n 1 "$OUT/$name.run.log") |"
    fi
    # GEMM tuning (docs/cuda-backend.md): cuBLASLt's candidates timed in two steps
    # (MGC_GEMM_TUNE), then the plan run with the file (MGC_GEMM_TUNING); BENCH_TUNE=0 skips it
    if [ "${BENCH_TUNE:-1}" = 1 ]; then
        if MGC_GEMM_TUNE="$OUT/$name.tune" $RUN "$OUT/$name.plan" --backend cuda --iterations 2 -q \
            >"$OUT/$name.tune.log" 2>&1 &&
            MGC_GEMM_TUNING="$OUT/$name.tune" $RUN "$OUT/$name.plan" --backend cuda --iterations $STEPS -q \
                --metrics "$OUT/$name.tuned.jsonl" >>"$OUT/$name.tune.log" 2>&1; then
            echo "| $name | mgc, MGC_GEMM_TUNING (its file made by MGC_GEMM_TUNE) | $(med "$OUT/$name.tuned.jsonl" step_ms) | $(med "$OUT/$name.tuned.jsonl" tokens_per_s) | $(sed -n 's/.*"arena_bytes": \([0-9]*\).*/\1/p' "$OUT/$name.tuned.jsonl" | tail -n 1) |"
        else
            echo "| $name | mgc, MGC_GEMM_TUNING | failed: $(tail -n 1 "$OUT/$name.tune.log") |"
        fi
    fi
    # the logits in bf16 (training.logits_dtype: compute), as PyTorch's autocast keeps them: the
    # like-for-like row against torch.compile; BENCH_LOGITS=0 skips it
    if [ "${BENCH_LOGITS:-1}" = 1 ]; then
        # shellcheck disable=SC2086
        if $MGC compile "$model" --set parallel.world_size=1 --set parallel.tensor=1 --set parallel.pipeline=1 \
            --set parallel.data=1 --set parallel.context=1 --set training.precision=bf16 \
            --set training.recompute=none --set training.micro_batch_size=$mbs \
            --set model.hidden_dropout=0 --set model.attention_dropout=0 \
            --set training.global_batch_size=$mbs --set hardware.cuda_archs=[90] \
            --set training.logits_dtype=compute -o "$OUT/$name.lc.plan" >"$OUT/$name.lc.log" 2>&1 &&
            $RUN "$OUT/$name.lc.plan" --backend cuda --iterations $STEPS -q \
                --metrics "$OUT/$name.lc.jsonl" >>"$OUT/$name.lc.log" 2>&1; then
            echo "| $name | mgc, training.logits_dtype: compute (bf16 logits) | $(med "$OUT/$name.lc.jsonl" step_ms) | $(med "$OUT/$name.lc.jsonl" tokens_per_s) | $(sed -n 's/.*"arena_bytes": \([0-9]*\).*/\1/p' "$OUT/$name.lc.jsonl" | tail -n 1) |"
        else
            echo "| $name | mgc, training.logits_dtype: compute | failed: $(tail -n 1 "$OUT/$name.lc.log") |"
        fi
    fi
    # the same plan without cuBLASLt's epilogues (the fused linear ops on element-wise kernels,
    # docs/cuda-backend.md), and without CUDA graphs (the default has them): what each buys
    ab=0
    case " ${BENCH_AB_MODELS:-gpt2-124m} " in *" $name "*) ab=1 ;; esac
    if [ "${BENCH_AB:-1}" = 1 ] && [ $ab = 1 ]; then
        for v in "noepi|mgc, MGC_GEMM_EPILOGUES=0|env MGC_GEMM_EPILOGUES=0 $RUN" "nographs|mgc --no-cuda-graphs|$RUN --no-cuda-graphs"; do
            tag=${v%%|*} rest=${v#*|} label=${rest%%|*} cmd=${rest#*|}
            # shellcheck disable=SC2086
            if $cmd "$OUT/$name.plan" --backend cuda --iterations $STEPS -q --metrics "$OUT/$name.$tag.jsonl" >"$OUT/$name.$tag.log" 2>&1; then
                echo "| $name | $label | $(med "$OUT/$name.$tag.jsonl" step_ms) | $(med "$OUT/$name.$tag.jsonl" tokens_per_s) | $(sed -n 's/.*"arena_bytes": \([0-9]*\).*/\1/p' "$OUT/$name.$tag.jsonl" | tail -n 1) |"
            else
                echo "| $name | $label | failed: $(tail -n 1 "$OUT/$name.$tag.log") |"
            fi
        done
        # memory options against the default plan (docs/partitioning.md): the head in one piece
        # (loss chunks off) and the recompute modules; their time and the arena they change.
        # Then two model options: a sliding window of a quarter of the 1024 tokens (the attention
        # kernels skip the tiles outside it: its FLOPs fall to 7/16 of causal's) and the
        # query/key norms (their cost: two norms over head-dim rows a layer)
        for v in "lc1|loss_chunks 1|training.loss_chunks=1" \
            "rcm|recompute_modules all|training.recompute_modules=[norm, activation, dropout]" \
            "win|window_size 256|model.window_size=256" \
            "qkn|qk_layernorm|model.qk_layernorm=true"; do
            tag=${v%%|*} rest=${v#*|} label=${rest%%|*} set=${rest#*|}
            # shellcheck disable=SC2086
            if $MGC compile "$model" --set parallel.world_size=1 --set parallel.tensor=1 --set parallel.pipeline=1 \
                --set parallel.data=1 --set parallel.context=1 --set training.precision=bf16 \
                --set training.recompute=none --set training.micro_batch_size=$mbs \
                --set model.hidden_dropout=0 --set model.attention_dropout=0 \
                --set training.global_batch_size=$mbs --set hardware.cuda_archs=[90] \
                --set "$set" -o "$OUT/$name.$tag.plan" >"$OUT/$name.$tag.compile.log" 2>&1 &&
                $RUN "$OUT/$name.$tag.plan" --backend cuda --iterations $STEPS -q --metrics "$OUT/$name.$tag.jsonl" >"$OUT/$name.$tag.log" 2>&1; then
                echo "| $name | mgc, $label | $(med "$OUT/$name.$tag.jsonl" step_ms) | $(med "$OUT/$name.$tag.jsonl" tokens_per_s) | $(sed -n 's/.*"arena_bytes": \([0-9]*\).*/\1/p' "$OUT/$name.$tag.jsonl" | tail -n 1) |"
            else
                echo "| $name | mgc, $label | failed |"
            fi
        done
    fi
    [ "${BENCH_TORCH:-1}" = 1 ] || return 0
    for c in "" --compile; do
        # shellcheck disable=SC2086
        j=$($PY bench/torch_gpt_gpu.py $margs --mbs $mbs --steps $STEPS $c 2>"$OUT/$name.torch$c.err") || { echo "| $name | torch$c | failed |"; continue; }
        echo "| $name | $(echo "$j" | $PY -c 'import json,sys; d=json.load(sys.stdin); print("%s | %.2f | %.0f | %d" % (d["impl"], d["median_step_ms"], d["tokens_per_s"], d["max_memory_bytes"]))') |"
    done
}
# Two data-parallel ranks as threads sharing the one GPU (GPT-2 124M, 4 sequences each: the
# same global batch as the one-rank row): communication staged through page-locked host memory,
# with the gradient buckets reduced beside the backward (the transfer stream) and in line; then
# two pipeline stages, with the sends beside the compute (the pipeline-transfer stream) and in
# line.  What it shows is the staging's cost and what the overlap hides, not multi-GPU speed.
ranks_rows() {
    $MGC compile models/gpt2-124m.yaml --set parallel.world_size=2 --set parallel.data=2 \
        --set parallel.tensor=1 --set parallel.pipeline=1 --set parallel.context=1 \
        --set training.precision=bf16 --set training.recompute=none --set training.micro_batch_size=4 \
        --set training.global_batch_size=8 --set model.hidden_dropout=0 --set model.attention_dropout=0 \
        --set parallel.grad_bucket_size=20000000 --set hardware.cuda_archs=[90] \
        -o "$OUT/gpt2-124m-dp2.plan" >"$OUT/gpt2-124m-dp2.compile.log" 2>&1 ||
        { echo "| gpt2-124m | mgc, 2 ranks on 1 GPU | compile failed |"; return; }
    for v in "ov|mgc, 2 ranks on 1 GPU, buckets beside the backward|" "inl|mgc, 2 ranks on 1 GPU, buckets in line|--no-grad-overlap"; do
        ranks_run gpt2-124m-dp2 "$v"
    done
    # two pipeline stages (4 microbatches of 2, 1F1B), sends beside the compute and in line
    $MGC compile models/gpt2-124m.yaml --set parallel.world_size=2 --set parallel.pipeline=2 \
        --set parallel.tensor=1 --set parallel.data=1 --set parallel.context=1 \
        --set training.precision=bf16 --set training.recompute=none --set training.micro_batch_size=2 \
        --set training.global_batch_size=8 --set model.hidden_dropout=0 --set model.attention_dropout=0 \
        --set hardware.cuda_archs=[90] \
        -o "$OUT/gpt2-124m-pp2.plan" >"$OUT/gpt2-124m-pp2.compile.log" 2>&1 ||
        { echo "| gpt2-124m | mgc, 2 stages on 1 GPU | compile failed |"; return; }
    for v in "ov|mgc, 2 stages on 1 GPU, sends beside the compute|" "inl|mgc, 2 stages on 1 GPU, sends in line|--no-send-overlap"; do
        ranks_run gpt2-124m-pp2 "$v"
    done
}
ranks_run() { # plan-name "tag|label|flag"
    name=$1 tag=${2%%|*} rest=${2#*|} label=${rest%%|*} flag=${rest#*|}
    # shellcheck disable=SC2086
    if $RUN "$OUT/$name.plan" --backend cuda --local-ranks 2 --iterations $STEPS -q $flag \
        --metrics "$OUT/$name.$tag.jsonl" >"$OUT/$name.$tag.log" 2>&1; then
        echo "| gpt2-124m | $label | $(med "$OUT/$name.$tag.jsonl" step_ms) | $(med "$OUT/$name.$tag.jsonl" tokens_per_s) | $(sed -n 's/.*"arena_bytes": \([0-9]*\).*/\1/p' "$OUT/$name.$tag.jsonl" | tail -n 1) per rank, $(sed -n 's/.*"staged_bytes": \([0-9]*\).*/\1/p' "$OUT/$name.$tag.jsonl" | tail -n 1) staged |"
    else
        echo "| gpt2-124m | $label | failed: $(tail -n 1 "$OUT/$name.$tag.log") |"
    fi
}
{
    echo "# GPU training throughput"
    echo
    echo "- $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null || echo 'no nvidia-smi')"
    echo "- commit ${MGC_COMMIT:-$(git describe --always --dirty 2>/dev/null)}, $(date -u +%Y-%m-%d)"
    echo "- ceilings: $ceil"
    echo
    echo "| model | implementation | median step ms | tokens/s | memory bytes |"
    echo "|---|---|---:|---:|---:|"
    case " ${BENCH_MODELS:-gpt2-124m gpt2-1.5b} " in *" gpt2-124m "*)
        row gpt2-124m "--hidden 768 --layers 12 --heads 12 --ffn 3072" models/gpt2-124m.yaml 8 ;; esac
    case " ${BENCH_MODELS:-gpt2-124m gpt2-1.5b} " in *" gpt2-1.5b "*)
        row gpt2-1.5b "--hidden 1600 --layers 48 --heads 25 --ffn 6400" models/gpt2-1.5b.yaml 4 ;; esac
    if [ "${BENCH_AB:-1}" = 1 ]; then ranks_rows; fi
    echo
    echo "Cost model (docs/cost-model.md): predicted step ms with the built-in h100-sxm profile, and with the"
    echo "profile fitted per op from a profiled run of the same plan (mgc-run --profile, mgc calibrate)."
    echo
    echo "| model | measured ms | built-in profile ms | error | fitted profile ms | error |"
    echo "|---|---:|---:|---:|---:|---:|"
    cat "$OUT/cost-model.md" 2>/dev/null
    echo
    echo "Attention alone (one layer's op, ms per call): mgc's kernels from the profile above against PyTorch's"
    echo "scaled_dot_product_attention (causal, bf16, flash) timed with CUDA events at the same shape (b x heads x s x d)."
    echo
    echo "| model | shape | mgc fwd | SDPA fwd | mgc bwd | SDPA bwd | mgc speed vs SDPA (fwd+bwd) |"
    echo "|---|---|---:|---:|---:|---:|---:|"
    cat "$OUT/attention.md" 2>/dev/null
    for k in "$OUT"/kernels-*.md; do [ -f "$k" ] && { echo; sed 's/^# /## /' "$k"; }; done
} | tee "$T"
# the targets, judged from the tables above (bench/targets.py)
$PY bench/targets.py "$T" >"$OUT/targets.md" && { echo; cat "$OUT/targets.md"; } | tee -a "$T"
