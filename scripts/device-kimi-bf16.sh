#!/bin/bash
# Device run for Kimi-Linear's bf16 routed experts on the GPU (branch kimi-bf16-gpu; issue 18
# item 11), on the H200 from the repository root:
#   bash scripts/device-kimi-bf16.sh        (logs under $OUT)
# Builds test_engine and strata, runs the new case (CPU exact oracle vs the GPU with all experts
# cached and with 10 % cached, routing replayed, logits within 0.15 relative RMS) and the Kimi-
# Linear quantized case beside it, then ctest -L gpu (skips fail).
DEVICE_OUT_DEFAULT=/tmp/kimi-bf16-out
source scripts/device-lib.sh
device_build strata test_engine test_kernels
export STRATA_REQUIRE_GPU=1 STRATA_SHARED_DIR=${STRATA_SHARED_DIR:-$PWD/.device/shared}
timeout 300 ./build-gpu/test_engine "cuda backend: Kimi-Linear*" -s > "$OUT/test_kimi.log" 2>&1
echo "Kimi-Linear cases rc=$? $(tail -2 "$OUT/test_kimi.log" | tr '\n' ' ')"
grep -E "^\[cuda backend kimi|FAILED|with expansion" -A3 "$OUT/test_kimi.log" | head -40
timeout 400 ctest --test-dir build-gpu -L gpu --output-on-failure -j3 > "$OUT/ctest_gpu.log" 2>&1
echo "ctest -L gpu rc=$?"; grep -E "tests passed|tests failed" "$OUT/ctest_gpu.log"
echo "total $(( $(date +%s) - t0 )) s"
