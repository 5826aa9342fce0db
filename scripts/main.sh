#!/bin/sh
# main.sh - the README's first command: install what is needed, build, and run
# the main job on the embedded default model (examples/tiny-gpt.yaml).
# Until the runtime exists the main job checks the model, describes it and
# compiles its plan; later it trains it (on the CPU when there is no GPU).
set -eu
cd "$(dirname "$0")/.."
sh scripts/install-deps.sh
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j "$(nproc)"
model=${1:-examples/tiny-gpt.yaml}
./build/compiler/mgc check "$model"
./build/compiler/mgc info "$model"
./build/compiler/mgc compile "$model" -o build/main.plan
