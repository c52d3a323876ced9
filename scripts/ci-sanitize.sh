#!/usr/bin/env bash
# CI: the CPU test suite under AddressSanitizer + UndefinedBehaviorSanitizer (STYLE §16, as
# llama.cpp's build-sanitize does): -DSTRATA_SANITIZE=ON -DSTRATA_CUDA=OFF, undefined behaviour
# fatal (-fno-sanitize-recover), leaks reported. Runs every CPU test case, the fuzz regression
# inputs included; GPU cases are not built. Budget: 15 minutes of CI on 2 cores (measured in
# docs/reliability.md).
# Usage: scripts/ci-sanitize.sh [build-dir]   (default build-sanitize)
set -euo pipefail
cd "$(dirname "$0")/.."
start=$(date +%s)
build=${1:-build-sanitize}
gen=()
command -v ninja >/dev/null && gen=(-G Ninja)
launcher=()
command -v ccache >/dev/null && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_C_COMPILER_LAUNCHER=ccache)
cmake -S . -B "$build" "${gen[@]}" -DCMAKE_BUILD_TYPE=Release -DSTRATA_SANITIZE=ON \
  -DSTRATA_CUDA=OFF "${launcher[@]}" >/dev/null
cmake --build "$build" -j "$(nproc)"
built=$(date +%s)
export ASAN_OPTIONS=detect_leaks=1:abort_on_error=0:halt_on_error=1:detect_stack_use_after_return=0
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
ctest --test-dir "$build" --output-on-failure -j "$(nproc)" --timeout 900
end=$(date +%s)
echo "ci-sanitize: build $((built - start)) s, tests $((end - built)) s, total $((end - start)) s"
