#!/bin/sh
# bench/bench_train_cpu.sh - CPU training throughput of examples/tiny-gpt.yaml:
# mgc (build/runtime/mgc-run) against PyTorch (bench/torch_tiny_gpt.py) on
# the same machine with 1 and 2 threads.  Target: mgc at least as fast as
# PyTorch eager at each thread count.
#
# Usage: sh bench/bench_train_cpu.sh        (from the repository root)
#
# Creates build/bench-venv with torch from PyPI on first use.  Prints a
# markdown report and writes it to bench/results/train-cpu.md.
# Environment: MGC (default build/compiler/mgc), MGC_RUN (default
# build/runtime/mgc-run), STEPS (timed steps, default 60), WARMUP (default 10),
# COMPILE=0 to skip the torch.compile rows.  mgc runs STEPS iterations and
# its first WARMUP steps are left out of the medians.

cd "$(dirname "$0")/.." || exit 1

MGC=${MGC:-build/compiler/mgc}
MGC_RUN=${MGC_RUN:-build/runtime/mgc-run}
STEPS=${STEPS:-60}
WARMUP=${WARMUP:-10}
COMPILE=${COMPILE:-1}
VENV=build/bench-venv
PY=$VENV/bin/python
PLAN=build/bench-tiny-gpt.plan
PLAN_DP2=build/bench-tiny-gpt-dp2.plan
OUTDIR=bench/results
OUT=$OUTDIR/train-cpu.md
COMPILE_TIMEOUT=300

# --- PyTorch virtual environment -------------------------------------------
if ! "$PY" -c 'import torch' 2>/dev/null; then
    echo "setting up $VENV (pip install torch) ..." >&2
    mkdir -p build
    python3 -m venv "$VENV" || exit 1
    "$VENV/bin/pip" install -q --upgrade pip >&2
    if ! "$VENV/bin/pip" install -q torch numpy >&2; then
        echo "plain PyPI failed; trying the CPU wheel index" >&2
        "$VENV/bin/pip" install -q torch numpy \
            --index-url https://download.pytorch.org/whl/cpu >&2 || exit 1
    fi
fi
TORCH_VERSION=$("$PY" -c 'import torch; print(torch.__version__)' 2>/dev/null)

# field FILE KEY: one value from a one-line JSON object.
field() {
    "$PY" -c 'import json, sys; print(json.load(open(sys.argv[1]))[sys.argv[2]])' "$1" "$2"
}

# mgc_median FILE KEY: median of KEY over the metrics lines after the first
# $WARMUP steps.
mgc_median() {
    "$PY" - "$1" "$2" "$WARMUP" <<'EOF'
import json, statistics, sys
path, key, warmup = sys.argv[1], sys.argv[2], int(sys.argv[3])
rows = []
with open(path) as f:
    for line in f:
        line = line.strip()
        if line:
            obj = json.loads(line)
            if "step" in obj and key in obj:
                rows.append(obj)
vals = [r[key] for r in rows[warmup:]]
print(round(statistics.median(vals), 3) if vals else "nan")
EOF
}

# ratio A B: A / B to two decimals.
ratio() {
    "$PY" -c 'import sys; a, b = map(float, sys.argv[1:]); print(f"{a / b:.2f}" if b else "-")' "$1" "$2"
}

if command -v timeout >/dev/null 2>&1; then
    TIMEOUT="timeout $COMPILE_TIMEOUT"
else
    TIMEOUT=""
fi

TMP=$(mktemp -d) || exit 1
trap 'rm -rf "$TMP"' EXIT
NOTES=$TMP/notes
ROWS=$TMP/rows
: >"$NOTES"
: >"$ROWS"

# --- mgc plan --------------------------------------------------------------
HAVE_MGC=0
if [ -x "$MGC_RUN" ]; then
    if "$MGC" compile examples/tiny-gpt.yaml -o "$PLAN" >"$TMP/compile.log" 2>&1; then
        HAVE_MGC=1
        "$MGC" compile examples/tiny-gpt.yaml --set parallel.data=2 --set parallel.world_size=2 \
            -o "$PLAN_DP2" >"$TMP/compile.log" 2>&1 || rm -f "$PLAN_DP2"
    else
        echo "- \`$MGC compile\` failed; mgc rows skipped: $(tail -n 1 "$TMP/compile.log")" >>"$NOTES"
    fi
else
    echo "- $MGC_RUN not found: PyTorch rows only." >>"$NOTES"
fi

for t in 1 2; do
    echo "threads $t: pytorch-eager ..." >&2
    eager_tps=""
    if "$PY" bench/torch_tiny_gpt.py --threads "$t" --steps "$STEPS" --warmup "$WARMUP" \
            >"$TMP/eager-$t.json" 2>"$TMP/eager-$t.err"; then
        eager_ms=$(field "$TMP/eager-$t.json" median_step_ms)
        eager_tps=$(field "$TMP/eager-$t.json" tokens_per_s)
    else
        echo "- pytorch-eager, $t threads failed: $(tail -n 1 "$TMP/eager-$t.err")" >>"$NOTES"
    fi

    compile_tps=""
    if [ "$COMPILE" = 1 ]; then
        echo "threads $t: pytorch-compile ..." >&2
        if $TIMEOUT "$PY" bench/torch_tiny_gpt.py --compile --threads "$t" --steps "$STEPS" \
                --warmup "$WARMUP" >"$TMP/compile-$t.json" 2>"$TMP/compile-$t.err"; then
            compile_ms=$(field "$TMP/compile-$t.json" median_step_ms)
            compile_tps=$(field "$TMP/compile-$t.json" tokens_per_s)
        else
            rc=$?
            if [ "$rc" = 124 ]; then
                why="took over $COMPILE_TIMEOUT s"
            else
                why=$(grep -v '^ ' "$TMP/compile-$t.err" | tail -n 1 | cut -c 1-200)
            fi
            echo "- pytorch-compile, $t threads skipped: $why" >>"$NOTES"
        fi
    fi

    # mgc: one rank with t BLAS threads; and at t = 2 also two data-parallel ranks
    # (threads of one process, one BLAS thread each) on the same global batch
    : >"$TMP/mgc-rows"
    if [ "$HAVE_MGC" = 1 ]; then
        for variant in rank ranks; do
            if [ "$variant" = rank ]; then
                plan=$PLAN ranks=1 name="mgc, 1 rank x $t BLAS threads"
                if [ "$t" = 1 ]; then name="mgc, 1 rank"; fi
            else
                [ "$t" = 2 ] && [ -s "$PLAN_DP2" ] || continue
                plan=$PLAN_DP2 ranks=2 name="mgc, 2 data-parallel ranks x 1 thread"
            fi
            echo "threads $t: $name ..." >&2
            metrics=build/bench-mgc-$t-$variant.jsonl
            rm -f "$metrics"
            bt=$t
            [ "$variant" = ranks ] && bt=1
            if OPENBLAS_NUM_THREADS=$bt "$MGC_RUN" "$plan" --local-ranks "$ranks" --threads "$bt" \
                    --iterations "$STEPS" --metrics "$metrics" >"$TMP/mgc-$t.log" 2>&1 &&
                    [ -s "$metrics" ]; then
                echo "$name|$(mgc_median "$metrics" step_ms)|$(mgc_median "$metrics" tokens_per_s)" >>"$TMP/mgc-rows"
            else
                echo "- $name failed: $(tail -n 1 "$TMP/mgc-$t.log")" >>"$NOTES"
            fi
        done
    fi

    # Rows; the last column is an mgc row's tokens/s divided by pytorch-eager's.
    while IFS='|' read -r name ms tps; do
        r=-
        [ -n "$eager_tps" ] && r=$(ratio "$tps" "$eager_tps")
        echo "| $name | $t | $ms | $tps | $r |" >>"$ROWS"
    done <"$TMP/mgc-rows"
    if [ -n "$eager_tps" ]; then
        echo "| pytorch-eager | $t | $eager_ms | $eager_tps | - |" >>"$ROWS"
    fi
    if [ -n "$compile_tps" ]; then
        echo "| pytorch-compile | $t | $compile_ms | $compile_tps | - |" >>"$ROWS"
    fi
done

CPU=$(grep -m 1 'model name' /proc/cpuinfo 2>/dev/null | sed 's/.*: *//')
mkdir -p "$OUTDIR"
{
    echo "# CPU training throughput: examples/tiny-gpt.yaml"
    echo
    echo "- date: $(date -u '+%Y-%m-%d %H:%M UTC')"
    echo "- machine: $(uname -m), ${CPU:-unknown CPU}, nproc $(nproc)"
    echo "- commit: $(git describe --always --dirty 2>/dev/null || echo unknown)"
    echo "- torch: ${TORCH_VERSION:-not installed}"
    echo "- step: global batch 8 = 2 microbatches of 4 x 96 tokens (768 tokens), fp32,"
    echo "  AdamW + grad clip; median over $STEPS steps after $WARMUP warmup steps"
    echo
    echo "| implementation | threads | median step ms | tokens/s | mgc / pytorch-eager |"
    echo "|---|---:|---:|---:|---:|"
    cat "$ROWS"
    if [ -s "$NOTES" ]; then
        echo
        cat "$NOTES"
    fi
    echo
    echo "Target: mgc tokens/s >= pytorch-eager tokens/s at 1 and 2 threads (last column >= 1)."
} >"$OUT"
cat "$OUT"
