#!/bin/sh
# test.sh - the README's second command (and .ci/run): install what is
# needed, then build and run the whole test suite twice:
#   1. gcc, warnings as errors, every ctest test;
#   2. clang with AddressSanitizer + UndefinedBehaviorSanitizer (+ leak
#      checking), warnings as errors, every test again plus a bounded
#      libFuzzer run over the front end (MGC_FUZZ_SECONDS, default 60); at -O1
#      with assertions (test_train took 2084 s at -O0 on a 2-core CI-like machine,
#      457 s at -O1);
#   3. clang with ThreadSanitizer: test_comm, test_train (its two halves side by
#      side) and test_checkpoint, the tests whose ranks (and gradient reducers) are
#      threads.
# GPU tests (label gpu) skip themselves with status 77 where no GPU exists.
set -eu
cd "$(dirname "$0")/.."
sh scripts/install-deps.sh
jobs=$(nproc)

echo "== build 1: gcc, -Werror"
CC=gcc cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo -DMGC_WERROR=ON >/dev/null
cmake --build build -j "$jobs"
ctest --test-dir build --output-on-failure -j "$jobs"

echo "== build 2: clang, -Werror, address+undefined sanitizers, fuzzing"
CC=clang cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=Debug -DMGC_WERROR=ON \
  -DCMAKE_C_FLAGS_DEBUG="-g -O1" -DMGC_SANITIZE=address,undefined -DMGC_FUZZ=ON \
  -DMGC_FUZZ_SECONDS="${MGC_FUZZ_SECONDS:-60}" >/dev/null
cmake --build build-asan -j "$jobs"
ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
  ctest --test-dir build-asan --output-on-failure -j "$jobs"

echo "== build 3: clang, ThreadSanitizer: the tests with threads (local ranks, gradient reducer)"
CC=clang cmake -S . -B build-tsan -DCMAKE_BUILD_TYPE=RelWithDebInfo -DMGC_WERROR=ON \
  -DMGC_SANITIZE=thread >/dev/null
cmake --build build-tsan -j "$jobs" --target test_comm test_train test_checkpoint
# OpenBLAS runs its GEMMs on threads of its own that ThreadSanitizer cannot see synchronise
# (uninstrumented spin-waits): with more than one, every GEMM the main thread reads back is
# reported as a race (OpenBLAS 0.3.21, Debian 12).  Our threads are what this build checks.
# test_comm runs alone (its timeout checks measure time); then test_train's two halves and
# test_checkpoint side by side (test_train alone took about 16 minutes on a 2-core CI machine).
tsan() { # NAME ARGS...: one test, its output in build-tsan/NAME.log
  name=$1; shift
  OPENBLAS_NUM_THREADS=1 TSAN_OPTIONS=halt_on_error=1 "$@" >build-tsan/$name.log 2>&1
}
tsan_report() { # NAME STATUS
  if [ "$2" -ne 0 ]; then
    tail -n 60 build-tsan/$1.log; echo "test.sh: $1 failed under ThreadSanitizer"; return 1
  fi
  tail -n 1 build-tsan/$1.log
}
tsan test_comm build-tsan/tests/test_comm && rc=0 || rc=$?
tsan_report test_comm $rc
tsan test_train1 build-tsan/tests/test_train ci1 & p1=$!
tsan test_train2 build-tsan/tests/test_train ci2 & p2=$!
tsan test_checkpoint build-tsan/tests/test_checkpoint & p3=$!
fail=0
wait $p1 && rc=0 || rc=$?; tsan_report test_train1 $rc || fail=1
wait $p2 && rc=0 || rc=$?; tsan_report test_train2 $rc || fail=1
wait $p3 && rc=0 || rc=$?; tsan_report test_checkpoint $rc || fail=1
[ $fail -eq 0 ] || exit 1
echo "test.sh: all tests passed (gcc, clang+address/undefined, clang+thread)"
