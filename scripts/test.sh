#!/usr/bin/env bash
# Builds strata and runs the test suite (GPU tests skip themselves without a GPU).
# Usage: scripts/test.sh [build-dir]   (env STRATA_CMAKE_ARGS adds configure flags)
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
export PATH="/usr/local/cuda/bin:$PATH"
jobs=$(nproc)
gen=()
command -v ninja >/dev/null && gen=(-G Ninja)
cmake -S . -B "$build" "${gen[@]}" -DCMAKE_BUILD_TYPE=Release ${STRATA_CMAKE_ARGS:-}
cmake --build "$build" -j "$jobs"
ctest --test-dir "$build" --output-on-failure -j "$jobs" --timeout 900
