#!/bin/bash
# Device run for Kimi-Linear's bf16 routed experts on the GPU (branch kimi-bf16-gpu; issue 18
# item 11), on the H200 from the repository root:
#   bash scripts/device-kimi-bf16.sh        (logs under $OUT)
# Builds test_engine and strata, runs the new case (CPU exact oracle vs the GPU with all experts
# cached and with 10 % cached, routing replayed, logits within 0.15 relative RMS) and the Kimi-
# Linear quantized case beside it, then ctest -L gpu (skips fail).
[ -f .device/env.sh ] && source .device/env.sh
OUT=${OUT:-/tmp/kimi-bf16-out}
mkdir -p "$OUT"
set -o pipefail
t0=$(date +%s)
gen=""; command -v ninja >/dev/null && gen="-G Ninja"
cmake -S . -B build-gpu $gen -DCMAKE_BUILD_TYPE=Release > "$OUT/cfg.log" 2>&1 || { tail -30 "$OUT/cfg.log"; exit 1; }
cmake --build build-gpu -j16 --target strata test_engine test_kernels > "$OUT/build.log" 2>&1 ||
  { grep -E "error|FAILED" -A5 "$OUT/build.log" | head -60; exit 1; }
echo "build $(( $(date +%s) - t0 )) s"
export STRATA_REQUIRE_GPU=1 STRATA_SHARED_DIR=${STRATA_SHARED_DIR:-$PWD/.device/shared}
timeout 300 ./build-gpu/test_engine "cuda backend: Kimi-Linear*" -s > "$OUT/test_kimi.log" 2>&1
echo "Kimi-Linear cases rc=$? $(tail -2 "$OUT/test_kimi.log" | tr '\n' ' ')"
grep -E "^\[cuda backend kimi|FAILED|with expansion" -A3 "$OUT/test_kimi.log" | head -40
timeout 400 ctest --test-dir build-gpu -L gpu --output-on-failure -j3 > "$OUT/ctest_gpu.log" 2>&1
echo "ctest -L gpu rc=$?"; grep -E "tests passed|tests failed" "$OUT/ctest_gpu.log"
echo "total $(( $(date +%s) - t0 )) s"
