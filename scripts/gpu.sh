#!/bin/sh
# gpu.sh - everything mgc does on a GPU machine, in one call: build (with the
# Debian packages the GPU image lacks unpacked from .deb/), run the gpu-labelled
# tests, then the GPU benchmark.  Results go to $OUT (the lent machine's
# output folder) or build-gpu/out.
#
#   sh scripts/gpu.sh [test|bench|all]        (default all; test = gpu-labelled ctest, nccl,
#                                             sanitize)
#   sh scripts/gpu.sh 'fold nccl bench'       several parts in one call: ctest, fold (test_cuda
#                                             fold alone), sweep (random tiny configurations
#                                             replayed and trained on the GPU for SWEEP_S
#                                             seconds), nccl, sanitize, bench, kern (every
#                                             kernel of one step under ncu: device time, DRAM
#                                             bytes; NCU_MODELS), wide (attention at head dims
#                                             128 and 256 against SDPA, $OUT/wide.md; 128
#                                             also with MGC_ATT_FWD_KEYS=32, with
#                                             MGC_ATT_DKV_BUFS=1 and with MGC_ATT_FWD_BUFS=1,
#                                             the twins' buffers, and posing as a GPU with
#                                             100 KB (MGC_CUDA_SMEM_PER_SM=102400) with the
#                                             twins and with the defaults, their losses the
#                                             same bits)
#   sh scripts/gpu.sh quick                   a short check after a kernel change (about 3
#                                             minutes on the H100 on 2026-11-28, before the
#                                             dropout and fusion variants were added: not
#                                             timed since): both benchmark models' steps and losses
#                                             with the defaults, compiled without the bias
#                                             gradients in the norm backwards
#                                             (MGC_FUSION=-norm_bwd_bias), 124M without the
#                                             QKV bias gradient in the attention backward
#                                             (-attention_bwd_bias), 124M without the
#                                             MLP's first bias gradient in the
#                                             DGELU_BGRAD epilogue (-dgrad_gelu_bias; the
#                                             two MLP backward GEMMs a call too), 124M with the
#                                             attention's tiles before 2026-12-06
#                                             (MGC_ATT_FWD_KEYS=32 MGC_ATT_DKV_ROWS=32,
#                                             and the rows alone: the same bits), 124M with hidden
#                                             dropout with and without its backward in the
#                                             norm backwards (-norm_bwd_drop), without
#                                             CUDA graphs and without the fused embedding,
#                                             dropout + norm (the same bits), 124M without the
#                                             fused embedding + norm (-embedding_norm) and
#                                             with MGC_GRAD_FRESH=0, both with
#                                             MGC_ZERO_LIST=0 and with bf16 logits
#                                             (training.logits_dtype=compute; their
#                                             cross-entropy kernels under ncu too),
#                                             MGC_PDL=1, MGC_ZERO_BESIDE=1 (the same bits
#                                             checked) and a GEMM
#                                             tuning file made by
#                                             MGC_GEMM_TUNE, SDPA at their shapes, the copy curve
#                                             (bench/copy_curve.py) and the attention and
#                                             memory-bound kernels of one GPT-2 124M step under
#                                             ncu, test_cuda's pdl, tune, norm, zero and twins checks; into
#                                             $OUT/quick.txt and $OUT/kern-quick.md as it goes
#   sh scripts/gpu.sh shell 'COMMANDS'        build, then run COMMANDS in this environment
#                                             (one-off experiments within one lent call)
#   sh scripts/gpu.sh ncu                     Nsight Compute on one GPT-2 124M step's attention
#                                             kernels (NCU_KERNELS: a regex; NCU_MBS): stall
#                                             reasons, occupancy, pipes, to $OUT/ncu-*.txt
#
# SANITIZE="tiny-gpt-d64" narrows the compute-sanitizer runs (default: the three tiny
# models, tiny-gpt at head dim 64 and tiny-llama at 128 and 256, one training step each, and tiny-gpt
# with hidden and attention dropout for three steps with --cuda-graphs); bench/bench_gpu.sh
# reads BENCH_MODELS, BENCH_TORCH, BENCH_PROFILE_MODELS and STEPS.  On the lent
# H100, `test` took about 5 minutes and `bench` about 5: run them as two calls
# (one call is limited to 10 minutes).  With 15 minutes of device time a session and a
# machine that goes back 30 s after a call, `sh scripts/gpu.sh 'ctest quick'` in one call
# checks a session's kernel changes and times them; then give the machine back.  The parts
# run in this file's order (the build, ctest, quick, ...), whatever the argument's order, and
# each writes its report as it goes, and quick runs what is worth most first, so a call cut at
# its limit loses the least (on 2026-11-28 test_cuda took 3 minutes and quick about 3, with
# fewer checks than now: a cut is possible).  The device's copy of .git can be stale:
# pass MGC_COMMIT=$(git rev-parse --short HEAD) so that the reports name the
# commit that was sent.
#
# The .deb files come from `sh scripts/gpu-debs.sh` on a Debian machine
# (apt-get download; docs/testing.md): libyaml and OpenBLAS with its runtime.
set -eu
cd "$(dirname "$0")/.."
what=" ${1:-all} "
case $what in *" all "*) what="$what test bench " ;; esac
case $what in *" test "*) what="$what ctest nccl sanitize " ;; esac
has() { case $what in *" $1 "*) return 0 ;; esac; return 1; }
OUT=${OUT:-$PWD/build-gpu/out}
mkdir -p "$OUT" build-gpu/deps
for f in .deb/*.deb; do dpkg -x "$f" build-gpu/deps; done
D=$PWD/build-gpu/deps/usr
export LD_LIBRARY_PATH="$D/lib/x86_64-linux-gnu:$D/lib/x86_64-linux-gnu/openblas-pthread:${LD_LIBRARY_PATH:-}"
export MGC_KERNEL_CACHE=$PWD/build-gpu/kernel-cache
# pkg-config sees only the unpacked packages, their paths re-rooted there
export PKG_CONFIG_SYSROOT_DIR=$PWD/build-gpu/deps
export PKG_CONFIG_LIBDIR="$D/lib/x86_64-linux-gnu/pkgconfig:$D/lib/x86_64-linux-gnu/openblas-pthread/pkgconfig:$D/share/pkgconfig"
{
    echo "== device"
    nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv || true
    echo "commit ${MGC_COMMIT:-$(git describe --always --dirty 2>/dev/null || echo unknown)}"
    nvcc --version | tail -n 2 || true
} 2>&1 | tee "$OUT/device.txt"
rm -f build-gpu/CMakeCache.txt  # the environment above decides what is found
cmake -S . -B build-gpu -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH="$D" >"$OUT/configure.log" 2>&1 ||
    { tail -n 30 "$OUT/configure.log"; exit 1; }
cmake --build build-gpu -j "$(nproc)" >"$OUT/build.log" 2>&1 || { grep -E "error|Error" "$OUT/build.log" | head -n 30; exit 1; }
echo "== built"
if has shell; then
    export OUT
    exec sh -c "$2"
fi
rc=0
# the device-to-device copy bandwidth of a 512 MiB cudaMemcpy (PyTorch), in GB/s: the ceiling
# the memory-bound kernels are compared with
copy_gbps() {
    python3 -c 'import torch
n=1<<28; a=torch.empty(n,dtype=torch.uint8,device="cuda"); b=torch.empty_like(a)
for _ in range(3): b.copy_(a)
s=torch.cuda.Event(enable_timing=True); e=torch.cuda.Event(enable_timing=True)
s.record()
for _ in range(20): b.copy_(a)
e.record(); torch.cuda.synchronize(); print("%.0f" % (2*n*20/(s.elapsed_time(e)*1e-3)/1e9))' 2>/dev/null || echo 2970
}
# the gpu-labelled tests first (ctest -L gpu is test_cuda alone), run directly so that its
# unbuffered report reaches gpu-tests.log as it goes: a call cut at its limit keeps it (ctest
# would hold a test's output until it ends)
if has ctest; then
    echo "== gpu tests"
    timeout 1200 build-gpu/tests/test_cuda >"$OUT/gpu-tests.log" 2>&1 &&
        echo "100% tests passed: test_cuda" >>"$OUT/gpu-tests.log" ||
        { echo "test_cuda Failed (status $?)" >>"$OUT/gpu-tests.log"; rc=1; }
    grep -E "test_cuda|worst|Passed|Failed|failed|skipped|tests passed" "$OUT/gpu-tests.log" | tail -n 40
fi
if has quick; then
    # The plans of bench/bench_gpu.sh's rows (20 steps: their losses compare bit for bit with
    # that script's .jsonl of an earlier commit when no kernel's arithmetic changed)
    Q=$OUT/quick.txt
    qplan() { # model mbs plan [MGC_FUSION [--set KEY=VALUE ...]]
        m=$1 mb=$2 pl=$3 fu=${4:-1}
        shift 3; [ $# -gt 0 ] && shift
        # shellcheck disable=SC2068
        MGC_FUSION="$fu" build-gpu/compiler/mgc compile models/$m.yaml \
            --set model.hidden_dropout=0 --set model.attention_dropout=0 $@ --set parallel.world_size=1 \
            --set parallel.tensor=1 --set parallel.pipeline=1 --set parallel.data=1 --set parallel.context=1 \
            --set training.precision=bf16 --set training.recompute=none --set training.micro_batch_size=$mb \
            --set training.global_batch_size=$mb --set hardware.cuda_archs=[90] -o "$pl" >>"$Q" 2>&1
    }
    qrun() { # label plan [env]: 20 steps, the median of steps 9-20 and every step's loss and norm
        label=$1 plan=$2
        shift 2
        # shellcheck disable=SC2068
        # shellcheck disable=SC2086
        if env $@ build-gpu/runtime/mgc-run "$plan" --backend cuda --iterations 20 -q --metrics build-gpu/q.jsonl ${QARGS:-} >build-gpu/q.log 2>&1; then
            python3 -c 'import json,sys,statistics
r=[json.loads(l) for l in open(sys.argv[1])]
print("%s: median step %.3f ms; losses %s" % (sys.argv[2], statistics.median([x["step_ms"] for x in r][8:]),
      " ".join("%d:%.9g/%.9g" % (x["step"], x["loss"], x["grad_norm"]) for x in r)))' build-gpu/q.jsonl "$label" | tee -a "$Q"
        else
            echo "$label: FAILED: $(tail -n 2 build-gpu/q.log)" | tee -a "$Q"; rc=1
        fi
    }
    samebits() { # label-a label-b: their losses and norms, as qrun printed them
        a=$(grep "^$1: " "$Q" | tail -n 1 | sed 's/.*losses //') b=$(grep "^$2: " "$Q" | tail -n 1 | sed 's/.*losses //')
        [ -n "$a" ] && [ "$a" = "$b" ] && echo "$2: losses and norms bit-identical to $1" | tee -a "$Q" ||
            { echo "$2: losses or norms DIFFER from $1" | tee -a "$Q"; rc=1; }
    }
    echo "== quick (commit ${MGC_COMMIT:-?})" | tee "$Q"
    # In order of what is worth most when a call is cut at its limit (everything is written as
    # it goes): the defaults' steps, then the step's kernels under Nsight Compute, then the A/B
    # runs of the changes not yet timed on a GPU, then test_cuda's checks of this part, then
    # the settings already timed on 2026-11-28 (PDL, zeroing beside the forward, GEMM tuning),
    # SDPA last.
    qplan gpt2-124m 8 build-gpu/q124.plan && qplan gpt2-1.5b 4 build-gpu/q15.plan || rc=1
    qrun "gpt2-124m defaults (1)" build-gpu/q124.plan
    qrun "gpt2-1.5b defaults" build-gpu/q15.plan
    NCU=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
    NCUM=gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum
    # copies of each size and an empty kernel (bench/copy_curve.py), then the step's
    # memory-bound and attention kernels beside them
    timeout 120 "$NCU" --clock-control none --csv --metrics $NCUM python3 bench/copy_curve.py \
        >build-gpu/q-curve.csv 2>build-gpu/q-curve.err || rc=1
    timeout 120 "$NCU" --clock-control none --csv \
        --kernel-name "regex:attention|norm|bias_grad|Bgrad|embedding|ce_|adamw|sumsq" --metrics $NCUM \
        build-gpu/runtime/mgc-run build-gpu/q124.plan --backend cuda --iterations 1 -q \
        >build-gpu/q-ncu.csv 2>build-gpu/q-ncu.err || rc=1
    copy=$(copy_gbps)
    echo "copy ${copy} GB/s" | tee -a "$Q"
    python3 bench/ncu_table.py --curve build-gpu/q-curve.csv build-gpu/q-ncu.csv "$copy" >"$OUT/kern-quick.md" 2>&1 ||
        { tail -n 5 build-gpu/q-curve.err; python3 bench/ncu_table.py build-gpu/q-ncu.csv "$copy"; } >>"$OUT/kern-quick.md" 2>&1 || rc=1
    cat "$OUT/kern-quick.md"
    # the attention at its tiles before 2026-12-06: the forward at 32 keys a step (attention.cuh
    # ATT_FBK_PP) and the dK/dV kernel at 32 query rows a step (ATT_TBC_KV); the knobs name the
    # kernels at compile and run alike.  Both kernels under ncu beside the defaults' table
    # above, then the step (losses within bf16 rounding: the forward's tiles move its rounding);
    # the dK/dV kernel's rows alone change no bit (its 16-row mma steps run in the same order)
    export MGC_ATT_FWD_KEYS=32 MGC_ATT_DKV_ROWS=32
    qplan gpt2-124m 8 build-gpu/q124t32.plan || rc=1
    timeout 60 "$NCU" --clock-control none --csv --kernel-name "regex:attention_fwd|attention_bwd_dkv" \
        --metrics $NCUM build-gpu/runtime/mgc-run build-gpu/q124t32.plan --backend cuda --iterations 1 -q \
        >build-gpu/q-ncu-t32.csv 2>build-gpu/q-ncu-t32.err || rc=1
    { echo; echo "### MGC_ATT_FWD_KEYS=32 MGC_ATT_DKV_ROWS=32: the attention's tiles before 2026-12-06"; echo
      python3 bench/ncu_table.py build-gpu/q-ncu-t32.csv "$copy"; } >>"$OUT/kern-quick.md" 2>&1 || rc=1
    qrun "gpt2-124m MGC_ATT_FWD_KEYS=32 MGC_ATT_DKV_ROWS=32" build-gpu/q124t32.plan
    unset MGC_ATT_FWD_KEYS
    qplan gpt2-124m 8 build-gpu/q124r32.plan || rc=1
    qrun "gpt2-124m MGC_ATT_DKV_ROWS=32" build-gpu/q124r32.plan
    unset MGC_ATT_DKV_ROWS
    samebits "gpt2-124m defaults (1)" "gpt2-124m MGC_ATT_DKV_ROWS=32"
    # and with the QKV projection's bias gradient left to BGRADB (compiler/fusion.c
    # attention_bwd_bias; 2026-12-06): losses within bf16 rounding, the step time against the
    # defaults' (the attention backward's column sums against BGRADB's 15.9 us a layer)
    qplan gpt2-124m 8 build-gpu/q124ab.plan -attention_bwd_bias || rc=1
    qrun "gpt2-124m MGC_FUSION=-attention_bwd_bias" build-gpu/q124ab.plan
    # and with the MLP's first bias gradient left to BGRADB (compiler/fusion.c dgrad_gelu_bias;
    # 2026-12-06): losses within bf16 rounding, the step against the defaults'; then both
    # plans' MLP backward GEMMs a call under mgc-run --profile (linear_dgrad_gelu with
    # DGELU_BGRAD against DGELU alone, fc1's linear_wgrad without BGRADB against with it)
    qplan gpt2-124m 8 build-gpu/q124dg.plan -dgrad_gelu_bias || rc=1
    qrun "gpt2-124m MGC_FUSION=-dgrad_gelu_bias" build-gpu/q124dg.plan
    for p in q124 q124dg; do
        timeout 120 build-gpu/runtime/mgc-run build-gpu/$p.plan --backend cuda --iterations 4 \
            --profile-warmup 2 -q --profile build-gpu/$p.prof.jsonl >build-gpu/$p.prof.log 2>&1 &&
            python3 -c 'import json,sys
ops = [o for o in map(json.loads, filter(str.strip, open(sys.argv[1]))) if o.get("type") == "op"]
def ms(f):
    v = [o["mean_s"] * 1e3 for o in ops if f(o)]
    return "%.4f ms a call over %d ops" % (sum(v) / len(v), len(v)) if v else "none"
print("%s: linear_dgrad_gelu %s; fc1 linear_wgrad %s" % (sys.argv[2],
      ms(lambda o: o["kind"] == "linear_dgrad_gelu"),
      ms(lambda o: o["kind"] == "linear_wgrad" and o["name"].endswith("linear_fc1"))))' \
                build-gpu/$p.prof.jsonl "gpt2-124m $p.plan" | tee -a "$Q" || rc=1
    done
    # and without the bias gradients in the norm backwards (compiler/fusion.c norm_bwd_bias):
    # the same steps with cuBLASLt's BGRADB (losses within bf16 rounding, not the same bits)
    qplan gpt2-124m 8 build-gpu/q124nb.plan -norm_bwd_bias &&
        qplan gpt2-1.5b 4 build-gpu/q15nb.plan -norm_bwd_bias || rc=1
    qrun "gpt2-124m MGC_FUSION=-norm_bwd_bias" build-gpu/q124nb.plan
    qrun "gpt2-1.5b MGC_FUSION=-norm_bwd_bias" build-gpu/q15nb.plan
    # with hidden dropout 0.1 (the extra --set after the dropout-free defaults): the norm
    # backwards take the residual branches' dropout backwards and then their bias gradients
    # (compiler/fusion.c norm_bwd_drop), against the plan without that fusion (dropout_add_bwd
    # and BGRADB: losses within bf16 rounding, not the same bits)
    qplan gpt2-124m 8 build-gpu/q124d.plan 1 --set model.hidden_dropout=0.1 &&
        qplan gpt2-124m 8 build-gpu/q124dn.plan -norm_bwd_drop --set model.hidden_dropout=0.1 || rc=1
    qrun "gpt2-124m hidden_dropout=0.1" build-gpu/q124d.plan
    qrun "gpt2-124m hidden_dropout=0.1 MGC_FUSION=-norm_bwd_drop" build-gpu/q124dn.plan
    # and with the embedding, its dropout and the first norm as three kernels (compiler/fusion.c
    # embedding_norm, whose kernel draws the embedding's dropout since stop 41): the same bits
    qplan gpt2-124m 8 build-gpu/q124de.plan -embedding_norm --set model.hidden_dropout=0.1 || rc=1
    qrun "gpt2-124m hidden_dropout=0.1 MGC_FUSION=-embedding_norm" build-gpu/q124de.plan
    # and with the embedding and the first norm as two kernels (compiler/fusion.c
    # embedding_norm): the same bits as the defaults (checked below)
    qplan gpt2-124m 8 build-gpu/q124ne.plan -embedding_norm || rc=1
    # and without CUDA graphs, which record programs with dropout since stop 40 (the kernels
    # read the step from device memory): the step's gain, and the same bits
    QARGS=--no-cuda-graphs
    qrun "gpt2-124m hidden_dropout=0.1 --no-cuda-graphs" build-gpu/q124d.plan
    QARGS=
    samebits "gpt2-124m hidden_dropout=0.1" "gpt2-124m hidden_dropout=0.1 --no-cuda-graphs"
    samebits "gpt2-124m hidden_dropout=0.1" "gpt2-124m hidden_dropout=0.1 MGC_FUSION=-embedding_norm"
    qrun "gpt2-124m MGC_FUSION=-embedding_norm" build-gpu/q124ne.plan
    samebits "gpt2-124m defaults (1)" "gpt2-124m MGC_FUSION=-embedding_norm"
    # every gradient added into (the executor's first writes off, docs/runtime.md): weight
    # gradients at beta 1, bias gradients through bias_grad_finish; the same bits
    qrun "gpt2-124m MGC_GRAD_FRESH=0" build-gpu/q124.plan MGC_GRAD_FRESH=0
    samebits "gpt2-124m defaults (1)" "gpt2-124m MGC_GRAD_FRESH=0"
    # the whole gradient buffer zeroed each step, not only what the first writes do not store
    # (exec_setup.c setup_zero_list): the same bits
    qrun "gpt2-124m MGC_ZERO_LIST=0" build-gpu/q124.plan MGC_ZERO_LIST=0
    samebits "gpt2-124m defaults (1)" "gpt2-124m MGC_ZERO_LIST=0"
    qrun "gpt2-1.5b MGC_ZERO_LIST=0" build-gpu/q15.plan MGC_ZERO_LIST=0
    samebits "gpt2-1.5b defaults" "gpt2-1.5b MGC_ZERO_LIST=0"
    # the logits in bf16 (training.logits_dtype compute): half the head's logit bytes, one loss
    # chunk at 124M where fp32 takes two; the losses within bf16 rounding of the defaults'
    qplan gpt2-124m 8 build-gpu/q124lc.plan 1 --set training.logits_dtype=compute &&
        qplan gpt2-1.5b 4 build-gpu/q15lc.plan 1 --set training.logits_dtype=compute || rc=1
    qrun "gpt2-124m training.logits_dtype=compute" build-gpu/q124lc.plan
    qrun "gpt2-1.5b training.logits_dtype=compute" build-gpu/q15lc.plan
    # the cross-entropy kernels over bf16 logits (cross_entropy.cuh LT)
    timeout 60 "$NCU" --clock-control none --csv --kernel-name "regex:ce_" --metrics $NCUM \
        build-gpu/runtime/mgc-run build-gpu/q124lc.plan --backend cuda --iterations 1 -q \
        >build-gpu/q-ncu-lc.csv 2>build-gpu/q-ncu-lc.err || rc=1
    { echo; echo "### training.logits_dtype=compute: the cross-entropy kernels"; echo
      python3 bench/ncu_table.py build-gpu/q-ncu-lc.csv "$copy"; } >>"$OUT/kern-quick.md" 2>&1 || rc=1
    # the correctness checks of this part
    for t in pdl tune norm zero twins; do
        build-gpu/tests/test_cuda $t >build-gpu/q-$t.log 2>&1 && echo "test_cuda $t: passed" | tee -a "$Q" ||
            { echo "test_cuda $t: FAILED"; tail -n 20 build-gpu/q-$t.log; rc=1; } | tee -a "$Q"
    done
    # programmatic dependent launch and the zeroing beside the forward (no gain on 2026-11-28,
    # off by default): the step, and the same bits
    qrun "gpt2-124m defaults (2)" build-gpu/q124.plan
    qrun "gpt2-124m MGC_PDL=1" build-gpu/q124.plan MGC_PDL=1
    samebits "gpt2-124m defaults (1)" "gpt2-124m MGC_PDL=1"
    qrun "gpt2-124m MGC_ZERO_BESIDE=1" build-gpu/q124.plan MGC_ZERO_BESIDE=1 MGC_ZERO_LIST=0
    samebits "gpt2-124m defaults (1)" "gpt2-124m MGC_ZERO_BESIDE=1"
    qrun "gpt2-1.5b MGC_PDL=1" build-gpu/q15.plan MGC_PDL=1
    samebits "gpt2-1.5b defaults" "gpt2-1.5b MGC_PDL=1"
    qrun "gpt2-1.5b MGC_ZERO_BESIDE=1" build-gpu/q15.plan MGC_ZERO_BESIDE=1 MGC_ZERO_LIST=0
    samebits "gpt2-1.5b defaults" "gpt2-1.5b MGC_ZERO_BESIDE=1"
    # GEMM tuning: cuBLASLt's candidates timed in two steps of each plan (MGC_GEMM_TUNE), then
    # 20 steps with the file (twice for 124M: the same bits)
    for m in q124 q15; do
        MGC_GEMM_TUNE=build-gpu/$m.tune build-gpu/runtime/mgc-run build-gpu/$m.plan --backend cuda \
            --iterations 2 -q >build-gpu/$m.tune.log 2>&1 || rc=1
        { echo "== $m MGC_GEMM_TUNE"; tail -n 3 build-gpu/$m.tune.log; cat build-gpu/$m.tune || rc=1; } >>"$Q" 2>&1
    done
    qrun "gpt2-124m MGC_GEMM_TUNING (1)" build-gpu/q124.plan MGC_GEMM_TUNING=build-gpu/q124.tune
    qrun "gpt2-124m MGC_GEMM_TUNING (2)" build-gpu/q124.plan MGC_GEMM_TUNING=build-gpu/q124.tune
    samebits "gpt2-124m MGC_GEMM_TUNING (1)" "gpt2-124m MGC_GEMM_TUNING (2)"
    qrun "gpt2-1.5b MGC_GEMM_TUNING" build-gpu/q15.plan MGC_GEMM_TUNING=build-gpu/q15.tune
    # each variant's median step against the defaults' (their mean over the default runs)
    python3 -c 'import re,sys
runs=[(m.group(1),m.group(2),float(m.group(3))) for m in (re.match(r"(gpt2-\S+) (.*?): median step ([0-9.]+) ms",l) for l in open(sys.argv[1])) if m]
for model in dict.fromkeys(r[0] for r in runs):
    d=[t for mm,lab,t in runs if mm==model and lab.startswith("defaults")]
    if not d: continue
    base=sum(d)/len(d)
    for mm,lab,t in runs:
        if mm==model and not lab.startswith("defaults"):
            print("%s %s: %.3f ms, %+.2f%% against the defaults %.3f ms" % (model, lab, t, 100*(t-base)/base, base))' "$Q" 2>&1 | tee -a "$Q"
    for a in "768 12 12 3072 8" "1600 48 25 6400 4"; do
        set -- $a
        python3 bench/torch_gpt_gpu.py --hidden $1 --layers $2 --heads $3 --ffn $4 --mbs $5 --sdpa 2>&1 | tail -n 1 | tee -a "$Q"
    done
fi
if has ncu; then
    # One bf16 step of GPT-2 124M (seq 1024, no dropout), the first launch of each kernel whose
    # name the regex matches (--kernel-id ::regex:R:1) profiled with the sections that say where the time goes.  --clock-control
    # none: the lent machine's clocks stay as they are (METHOD.md).
    NCU=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
    build-gpu/compiler/mgc compile models/gpt2-124m.yaml --set training.precision=bf16 \
        --set parallel.world_size=1 --set parallel.tensor=1 --set parallel.pipeline=1 --set parallel.data=1 \
        --set training.micro_batch_size="${NCU_MBS:-8}" --set training.global_batch_size="${NCU_MBS:-8}" \
        --set model.hidden_dropout=0 --set model.attention_dropout=0 --set training.recompute=none \
        --set hardware.cuda_archs=[90] -o build-gpu/ncu.plan >"$OUT/ncu-compile.log" 2>&1 || exit 1
    for sec in "SpeedOfLight Occupancy LaunchStats" "WarpStateStats SchedulerStats" \
        "ComputeWorkloadAnalysis MemoryWorkloadAnalysis"; do
        name=$(echo "$sec" | cut -d' ' -f1)
        args=
        for x in $sec; do args="$args --section $x"; done
        # shellcheck disable=SC2086
        "$NCU" --clock-control none --kernel-id "::regex:${NCU_KERNELS:-attention}:1" \
            $args build-gpu/runtime/mgc-run build-gpu/ncu.plan --backend cuda --iterations 1 -q \
            >"$OUT/ncu-$name.txt" 2>&1 || rc=1
        grep -E "attention|Duration|Throughput|Occupancy|Registers|Stall|Issued|Eligible|Pipe|Warp Cycles|Block Limit" \
            "$OUT/ncu-$name.txt" | head -n 60
    done
    exit $rc
fi
if has kern; then
    # Every kernel of one bf16 training step (NCU_MODELS, default gpt2-124m; micro batch 8, or 4
    # for gpt2-1.5b) timed by Nsight Compute on the device with its DRAM traffic, against the
    # device-to-device copy bandwidth measured here (PyTorch): bench/ncu_table.py's table.
    NCU=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
    PY=${PY:-python3}
    copy=$(copy_gbps)
    echo "== kernels (ncu), copy ${copy} GB/s"
    rm -rf build-gpu/kern && mkdir -p build-gpu/kern
    # copies of each size and an empty kernel: each kernel beside a copy of its bytes
    "$NCU" --clock-control none --csv --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum \
        $PY bench/copy_curve.py >build-gpu/kern/curve.csv 2>build-gpu/kern/curve.err || rc=1
    for m in ${NCU_MODELS:-gpt2-124m}; do
        mbs=8
        case $m in gpt2-1.5b) mbs=4 ;; esac
        build-gpu/compiler/mgc compile models/$m.yaml --set training.precision=bf16 \
            --set parallel.world_size=1 --set parallel.tensor=1 --set parallel.pipeline=1 --set parallel.data=1 \
            --set parallel.context=1 --set training.micro_batch_size=$mbs --set training.global_batch_size=$mbs \
            --set model.hidden_dropout=0 --set model.attention_dropout=0 --set training.recompute=none \
            --set hardware.cuda_archs=[90] -o build-gpu/kern-$m.plan >build-gpu/kern/$m.compile.log 2>&1 || { rc=1; continue; }
        # (L2's sector counts were tried too: on the H100 they count a byte more than once)
        "$NCU" --clock-control none --csv \
            --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum \
            build-gpu/runtime/mgc-run build-gpu/kern-$m.plan --backend cuda --iterations 1 -q \
            >build-gpu/kern/$m.csv 2>build-gpu/kern/$m.err || rc=1
        $PY bench/ncu_table.py --curve build-gpu/kern/curve.csv build-gpu/kern/$m.csv "$copy" >build-gpu/kern/kernels-$m.md ||
            $PY bench/ncu_table.py build-gpu/kern/$m.csv "$copy" >build-gpu/kern/kernels-$m.md || rc=1
        head -n 45 build-gpu/kern/kernels-$m.md
    done
    tar czf "$OUT/kern.tgz" -C build-gpu kern || rc=1
fi
if has fold; then
    echo "== test_cuda fold"
    build-gpu/tests/test_cuda fold >"$OUT/fold.log" 2>&1 || rc=1
    tail -n 8 "$OUT/fold.log"
fi
if has sweep; then
    # random configurations of the tiny models (tests/emu_sweep.py --gpu): each draw's ops
    # replayed on the GPU against the CPU in three precisions on every rank, then trained;
    # SWEEP_S seconds (default 120), SWEEP_SEED (default the clock's); failing draws in
    # $OUT/sweep.tgz, each with the command that replays it
    echo "== sweep (GPU)"
    rm -rf build-gpu/sweep
    python3 tests/emu_sweep.py --gpu --build build-gpu --budget "${SWEEP_S:-120}" --timeout 300 \
        --seed "${SWEEP_SEED:-$(date +%s)}" --out build-gpu/sweep >"$OUT/sweep.log" 2>&1 || rc=1
    grep -E "^FAILED|^TIMEOUT|^emu_sweep" "$OUT/sweep.log" | cut -c1-300
    rm -rf build-gpu/sweep/kernel-cache build-gpu/sweep/draw.plan
    tar czf "$OUT/sweep.tgz" -C build-gpu sweep || rc=1
fi
if has wide; then
    # head dims past 128 (kernels/attention.cuh ATT_DYN: the backward's tiles in dynamic shared
    # memory, the dK/dV kernel's two column slices), never timed before: a two-layer LLaMA-style
    # model of width 2048 at head dim 128 (16 heads) and 256 (8 heads, Gemma's), seq 2048,
    # micro batch 2, bf16; the attention ops' device time a call (mgc-run --profile) against
    # SDPA at the same shapes, and 20 steps' losses and median step (the plan runs); head dim
    # 128 also with the forward at 32 keys a step (MGC_ATT_FWD_KEYS=32, "128/32": its tiles
    # before 2026-12-06) against the default 64 from dynamic shared memory, and with the dK/dV
    # kernel's one buffer of query tiles (MGC_ATT_DKV_BUFS=1, "128/b1": before 2026-12-06)
    # against its two from dynamic shared memory, and with the forward's one buffer of K and V
    # tiles (MGC_ATT_FWD_BUFS=1, "128/f1"), the two twins that GPUs with 100 KB of shared
    # memory a multiprocessor take (kspec.h mgc_kspec_twin): here two blocks a multiprocessor
    # either way, so what one buffer costs; their losses must be the defaults' bits.  Then
    # posing as a GPU with 100 KB (MGC_CUDA_SMEM_PER_SM=102400: kernels padded to its
    # occupancy), where the launcher takes the twins ("128/s100"), against the defaults forced
    # there, one block a multiprocessor ("128/s100d": MGC_ATT_FWD_BUFS=2 MGC_ATT_DKV_BUFS=2)
    echo "== wide" | tee "$OUT/wide.md"
    echo "| head dim | shape | mgc fwd ms | SDPA fwd ms | mgc bwd ms | SDPA bwd ms | mgc speed vs SDPA (fwd+bwd) |" >>"$OUT/wide.md"
    echo "|---|---|---:|---:|---:|---:|---:|" >>"$OUT/wide.md"
    for hd in 128 128/32 128/b1 128/f1 128/s100 128/s100d 256; do
        keys=${hd#*/} hd=${hd%/*}
        unset MGC_ATT_FWD_KEYS MGC_ATT_DKV_BUFS MGC_ATT_FWD_BUFS MGC_CUDA_SMEM_PER_SM
        case $keys in
        "$hd") ;;
        b*) export MGC_ATT_DKV_BUFS=${keys#b} ;;
        f*) export MGC_ATT_FWD_BUFS=${keys#f} ;;
        s100) export MGC_CUDA_SMEM_PER_SM=102400 ;;
        s100d) export MGC_CUDA_SMEM_PER_SM=102400 MGC_ATT_FWD_BUFS=2 MGC_ATT_DKV_BUFS=2 ;;
        *) export MGC_ATT_FWD_KEYS=$keys ;;
        esac
        heads=$((2048 / hd)) hd_label=$hd hd_file=$hd
        [ "$keys" = "$hd" ] || hd_label=$hd/$keys hd_file=$hd$keys
        build-gpu/compiler/mgc compile models/tiny-llama.yaml --set model.hidden_size=2048 \
            --set model.num_attention_heads=$heads --set model.num_query_groups=$heads \
            --set model.head_dim=$hd --set model.num_layers=2 --set model.ffn_hidden_size=5632 \
            --set model.seq_length=2048 --set model.max_position_embeddings=2048 \
            --set model.vocab_size=32000 --set parallel.world_size=1 --set parallel.tensor=1 \
            --set parallel.pipeline=1 --set parallel.data=1 --set parallel.context=1 \
            --set training.precision=bf16 --set training.micro_batch_size=2 \
            --set training.global_batch_size=2 --set training.recompute=none \
            --set hardware.cuda_archs=[90] -o build-gpu/wide$hd_file.plan >build-gpu/wide$hd_file.log 2>&1 || { rc=1; continue; }
        build-gpu/runtime/mgc-run build-gpu/wide$hd_file.plan --backend cuda --iterations 20 -q \
            --metrics build-gpu/wide$hd_file.jsonl >>build-gpu/wide$hd_file.log 2>&1 || { tail -n 3 build-gpu/wide$hd_file.log; rc=1; continue; }
        python3 -c 'import json,sys,statistics
r=[json.loads(l) for l in open(sys.argv[1])]
print("head dim %s: median step %.3f ms; losses %s" % (sys.argv[2], statistics.median([x["step_ms"] for x in r][8:]),
      " ".join("%d:%.6g" % (x["step"], x["loss"]) for x in r)))' build-gpu/wide$hd_file.jsonl $hd_label | tee -a "$OUT/wide.md"
        # SDPA once a shape: a variant of a head dim reuses its default's timing
        build-gpu/runtime/mgc-run build-gpu/wide$hd_file.plan --backend cuda --iterations 6 --profile-warmup 2 -q \
            --profile build-gpu/wide$hd_file.prof.jsonl >>build-gpu/wide$hd_file.log 2>&1 &&
            { { [ "$hd_file" != "$hd" ] && cp build-gpu/wide$hd.sdpa.json build-gpu/wide$hd_file.sdpa.json 2>/dev/null; } ||
              python3 bench/torch_gpt_gpu.py --hidden 2048 --heads $heads --seq 2048 --mbs 2 --sdpa \
                >build-gpu/wide$hd_file.sdpa.json 2>>build-gpu/wide$hd_file.log; } &&
            python3 bench/attn_row.py build-gpu/wide$hd_file.prof.jsonl build-gpu/wide$hd_file.sdpa.json $hd_label \
                >>"$OUT/wide.md" || rc=1
    done
    unset MGC_ATT_FWD_KEYS MGC_ATT_DKV_BUFS MGC_ATT_FWD_BUFS MGC_CUDA_SMEM_PER_SM
    # the kernels' buffers change no bit: the same losses and gradient norms, every step
    for v in b1 f1 s100 s100d; do
        python3 -c 'import json,sys
a, b = ([(x["loss"], x["grad_norm"]) for x in map(json.loads, open(f))] for f in sys.argv[1:3])
print("head dim 128/%s: losses and norms %s" % (sys.argv[3], "bit-identical to 128" if a == b else "DIFFER from 128"))
sys.exit(a != b)' build-gpu/wide128.jsonl build-gpu/wide128$v.jsonl $v | tee -a "$OUT/wide.md" || rc=1
    done
    cat "$OUT/wide.md"
fi
if has nccl; then
    # NCCL (--device-comm nccl): two ranks as two processes over TCP on the one GPU, each
    # posing as its own host (NCCL refuses two ranks on one GPU within a host; NCCL_HOSTID and
    # the socket transport over loopback are the lead of DESIGN.md, unverified before this
    # run).  The losses must equal those of the same processes communicating through host
    # memory, bit for bit (the folds are in group-rank order either way).
    echo "== nccl" | tee "$OUT/nccl.log"
    build-gpu/compiler/mgc compile examples/tiny-gpt.yaml --set training.precision=bf16 \
        --set parallel.world_size=2 --set parallel.tensor=2 --set hardware.cuda_archs=[90] \
        -o build-gpu/nccl-tp2.plan >>"$OUT/nccl.log" 2>&1 || rc=1
    for dc in none nccl; do
        port=$((29500 + $(od -An -N2 -tu2 /dev/urandom | tr -d ' ') % 1000))
        for r in 0 1; do
            RANK=$r WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port NCCL_HOSTID=mgc-rank$r \
                NCCL_SHM_DISABLE=1 NCCL_P2P_DISABLE=1 NCCL_IB_DISABLE=1 NCCL_SOCKET_IFNAME=lo \
                timeout 300 build-gpu/runtime/mgc-run build-gpu/nccl-tp2.plan --backend cuda \
                --iterations 20 --device-comm $dc --metrics "$OUT/nccl-$dc.rank$r.jsonl" -q \
                >>"$OUT/nccl.log" 2>&1 &
        done
        wait || true
        # step, loss, learning rate and gradient norm (the timings dropped)
        sed 's/, "tokens".*//' "$OUT/nccl-$dc.rank0.jsonl" >"$OUT/nccl-$dc.losses" 2>/dev/null || true
    done
    if [ -s "$OUT/nccl-nccl.losses" ] && cmp -s "$OUT/nccl-none.losses" "$OUT/nccl-nccl.losses"; then
        echo "nccl tp2 (two processes, one GPU): 20 steps' losses and norms the host path's" | tee -a "$OUT/nccl.log"
    else
        echo "nccl tp2: FAILED (see nccl.log)" | tee -a "$OUT/nccl.log"; tail -n 20 "$OUT/nccl.log"; rc=1
    fi
fi
if has sanitize; then
    # compute-sanitizer memcheck and racecheck on training steps of the tiny models, bf16
    CS=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
    if [ -x "$CS" ]; then
        echo "== compute-sanitizer" | tee "$OUT/sanitizer.log"
        # the tiny models (head dim 16), tiny-gpt at head dim 64 with attention dropout and
        # tiny-llama at head dim 128 (the tensor-core attention backward's two layouts)
        # tiny-gpt-tp2pp2: four ranks as threads on the one GPU, communication through host memory
        # tiny-llama-d256: head dim 256 (the backward's tiles in dynamic shared memory, the
        # dK/dV kernel's two column slices) with attention dropout
        for m in ${SANITIZE:-tiny-gpt tiny-llama tiny-moe tiny-gpt-d64 tiny-llama-d128 tiny-llama-d256 tiny-gpt-graphs tiny-gpt-tp2pp2}; do
            run="--iterations 1"
            case $m in
            tiny-gpt-d64) y=examples/tiny-gpt.yaml
                x="--set model.hidden_size=128 --set model.num_attention_heads=2 --set model.attention_dropout=0.1" ;;
            tiny-llama-d128) y=models/tiny-llama.yaml
                x="--set model.hidden_size=512 --set model.num_attention_heads=4" ;;
            tiny-llama-d256) y=models/tiny-llama.yaml
                x="--set model.hidden_size=512 --set model.num_attention_heads=2 --set model.attention_dropout=0.1" ;;
            tiny-gpt-graphs) y=examples/tiny-gpt.yaml # every program captured, with dropout too
                x="--set model.hidden_dropout=0.1 --set model.attention_dropout=0.1"
                run="--iterations 3 --cuda-graphs" ;;
            tiny-gpt-tp2pp2) y=examples/tiny-gpt.yaml
                x="--set parallel.world_size=4 --set parallel.tensor=2 --set parallel.pipeline=2"
                run="--iterations 1 --local-ranks 4" ;;
            *) y=models/$m.yaml x= ;;
            esac
            # shellcheck disable=SC2086
            build-gpu/compiler/mgc compile $y $x --set training.precision=bf16 \
                --set hardware.cuda_archs=[90] -o build-gpu/$m-bf16.plan >>"$OUT/sanitizer.log" 2>&1 || rc=1
            for tool in memcheck racecheck; do
                # shellcheck disable=SC2086
                if "$CS" --tool $tool --error-exitcode 9 build-gpu/runtime/mgc-run build-gpu/$m-bf16.plan \
                    --backend cuda $run -q >>"$OUT/sanitizer.log" 2>&1; then
                    echo "$m $tool: clean" | tee -a "$OUT/sanitizer.log"
                else
                    echo "$m $tool: FAILED" | tee -a "$OUT/sanitizer.log"; rc=1
                fi
            done
        done
    fi
fi
if has bench; then
    # the lent machine returns at most 8 files from $OUT: the report, and everything else but
    # the plans in one archive
    echo "== gpu bench"
    rm -rf build-gpu/bench-out
    sh bench/bench_gpu.sh build-gpu build-gpu/bench-out || rc=1
    cp build-gpu/bench-out/bench-gpu.md "$OUT/" 2>/dev/null || rc=1
    tar czf "$OUT/bench-out.tgz" -C build-gpu/bench-out --exclude='*.plan' . || rc=1
fi
exit $rc
