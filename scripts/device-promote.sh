#!/bin/bash
# Device run for promotions into the GPU expert cache (issue 18 item 5; engine/cuda_backend.cpp
# promote_poll and the promotion worker), on the H200 from the repository root:
#   bash scripts/device-promote.sh [build|test|all]   (default all; logs under $OUT)
# build: build-gpu (Release, Ninja if present), targets strata and test_engine, -j16.
# test:  the promotion case alone first (its printed lines: promotions, bytes, expert pairs on
#        each side, the telemetry line), then every engine GPU case (STRATA_REQUIRE_GPU=1: a skip
#        fails), which includes placement invariance and CUDA graphs with promotions on by default.
# Each stage fits the 10-minute limit of one device command; run them one by one if needed.
DEVICE_OUT_DEFAULT=/tmp/promote-out
source scripts/device-lib.sh
stage=${1:-all}
git log --oneline -1 | sed 's/^/tree: /'

if [ "$stage" = build ] || [ "$stage" = all ]; then
  device_build strata test_engine
fi

if [ "$stage" = test ] || [ "$stage" = all ]; then
  STRATA_REQUIRE_GPU=1 ./build-gpu/test_engine "cuda backend: promotions*" -d yes \
    > "$OUT/test_promote.log" 2>&1
  echo "test_engine promotions: rc=$?"
  grep -E "^\[cuda backend|gpu engine:|FAILED|with expansion" -A3 "$OUT/test_promote.log" | head -60
  tail -3 "$OUT/test_promote.log"
  STRATA_REQUIRE_GPU=1 ./build-gpu/test_engine "[gpu]" -d yes > "$OUT/test_gpu.log" 2>&1
  rc=$?
  echo "test_engine [gpu]: rc=$rc"
  grep -E "^[0-9.]+ s: |^\[cuda backend" "$OUT/test_gpu.log" | head -60
  grep -E -B3 -A12 "FAILED|with expansion" "$OUT/test_gpu.log" | head -80
  tail -3 "$OUT/test_gpu.log"
  echo "tests $(( $(date +%s) - t0 )) s"
fi
