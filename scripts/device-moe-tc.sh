#!/bin/bash
# Device run for the grouped-GEMM MoE path (issue 19; kernels/moe/intgemm.cu), on the H200 from
# the repository root after the device tooling has been carried over:
#   bash scripts/device-moe-tc.sh [build|test|bench|all]   (default all; logs under $OUT)
# build: build-gpu (Release, Ninja if present), targets test_kernels, test_cpu and strata, -j16.
# test:  the MoE op-checks of every path (test_kernels "moe gpu*", skips fail with
#        STRATA_REQUIRE_GPU=1) and the CPU emulation of the integer method (test_cpu).
# bench: strata bench kernels --filter moe --repeats 3 (grouped lines of every path against their
#        rooflines, the decode line, the trunk GEMMs).
# Each stage fits the 10-minute limit of one device command; run them one by one if needed.
DEVICE_OUT_DEFAULT=/tmp/moe-tc-out
source scripts/device-lib.sh
stage=${1:-all}
git log --oneline -1 | sed 's/^/tree: /'

if [ "$stage" = build ] || [ "$stage" = all ]; then
  device_build test_kernels test_cpu strata
fi

if [ "$stage" = test ] || [ "$stage" = all ]; then
  ./build-gpu/test_cpu "expert int contract*" > "$OUT/test_cpu_int.log" 2>&1
  echo "test_cpu expert int contract: rc=$? $(tail -2 "$OUT/test_cpu_int.log" | tr '\n' ' ')"
  STRATA_REQUIRE_GPU=1 ./build-gpu/test_kernels "moe gpu*" -d yes > "$OUT/test_moe.log" 2>&1
  rc=$?
  echo "test_kernels moe gpu*: rc=$rc"
  grep -E "^[0-9.]+ s: moe gpu" "$OUT/test_moe.log"
  grep -E -B3 -A12 "FAILED|with expansion" "$OUT/test_moe.log" | head -80
  tail -3 "$OUT/test_moe.log"
  echo "tests $(( $(date +%s) - t0 )) s"
fi

if [ "$stage" = bench ] || [ "$stage" = all ]; then
  ./build-gpu/strata bench kernels --filter moe --repeats 3 > "$OUT/bench_moe.log" 2>&1
  echo "bench rc=$?"
  grep -E "peak|copy|moe/" "$OUT/bench_moe.log" | head -60
  echo "bench $(( $(date +%s) - t0 )) s"
fi
