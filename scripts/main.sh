#!/bin/sh
# main.sh - the README's first command: install what is needed, build, and run
# the main job on the embedded default model (examples/tiny-gpt.yaml).
# The main job checks the model, describes it, compiles its plan and trains
# it with mgc-run on the CPU (a few hundred steps of the embedded synthetic
# corpus: about 15 s on 2 cores).  docs/getting-started.md walks through it.
set -eu
cd "$(dirname "$0")/.."
sh scripts/install-deps.sh
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j "$(nproc)"
model=${1:-examples/tiny-gpt.yaml}
./build/compiler/mgc check "$model"
./build/compiler/mgc info "$model"
./build/compiler/mgc compile "$model" -o build/main.plan
./build/runtime/mgc-run build/main.plan --metrics build/main-metrics.jsonl
