#!/bin/bash
# Device run for the wgmma form of the grouped-GEMM MoE path (issue 19; ExpertPath::wgmma in
# kernels/moe/intgemm.cu), on the H200 from the repository root after the device tooling (.device/)
# has been carried over:
#   bash scripts/device-moe-wgmma.sh [build|test|bench|all]   (default all; logs under $OUT)
# build: build-gpu (Release, Ninja if present), targets test_kernels and strata, -j16; then counts
#        the warpgroup MMAs (HGMMA) in the SASS of the wgmma kernels (0 would mean the path is not
#        what it claims).
# test:  test_kernels "moe gpu*" with STRATA_REQUIRE_GPU=1 (a skip fails): every MoE op-check on
#        every path, the wgmma path included, bit for bit against the contract; the per-case
#        times and, on a failure, the first mismatch (its path is in the INFO lines).
# bench: strata bench kernels --filter moe --repeats 3, then the wgmma and gemm lines side by side
#        (T = 64, 256, 1024, 4096 and the strict-rows line).
# Each stage fits the 10-minute limit of one device command (tests and bench run under timeouts
# of 540/560 s); `all` usually does not: run build, test and bench as three commands.
DEVICE_OUT_DEFAULT=/tmp/moe-wgmma-out
source scripts/device-lib.sh
stage=${1:-all}
git log --oneline -1 | sed 's/^/tree: /'

if [ "$stage" = build ] || [ "$stage" = all ]; then
  device_build test_kernels strata
  if command -v cuobjdump >/dev/null; then
    cuobjdump -sass ./build-gpu/strata > "$OUT/strata.sass" 2>/dev/null
    # Per kernel: HGMMA instructions (the wgmma kernels) and IMMA ones (the mma.sync kernels).
    awk '/Function :/ { f = $3 } /HGMMA/ { h[f]++ } /IMMA/ { i[f]++ }
         END { for (k in h) print "HGMMA", h[k], k; for (k in i) print "IMMA", i[k], k }' \
      "$OUT/strata.sass" | grep -E "wgmma_kernel|gemm_kernel" | sort
  fi
  echo "build $(( $(date +%s) - t0 )) s"
fi

if [ "$stage" = test ] || [ "$stage" = all ]; then
  # A wrong wgmma layout shows as mismatches, not a hang; the timeouts guard the run anyway.
  # First the quick ones (seconds): the layout probe (one wgmma on known values; its INFO lines
  # name the wrong rows/columns) and the partly-filled-tiles cases (gemm and wgmma).
  STRATA_REQUIRE_GPU=1 timeout 120 ./build-gpu/test_kernels \
    "moe gpu: wgmma operand*,moe gpu: GEMM paths with token tiles*" > "$OUT/test_quick.log" 2>&1
  echo "quick (wgmma layout probe, partly filled tiles): rc=$?" \
    "$(tail -2 "$OUT/test_quick.log" | tr '\n' ' ')"
  grep -E "N=(16|24) D\[" "$OUT/test_quick.log" | head -8
  STRATA_REQUIRE_GPU=1 timeout 540 ./build-gpu/test_kernels "moe gpu*" -d yes \
    > "$OUT/test_moe.log" 2>&1
  rc=$?
  echo "test_kernels moe gpu*: rc=$rc"
  grep -E "^[0-9.]+ s: moe gpu" "$OUT/test_moe.log"
  grep -E -B3 -A14 "FAILED|with expansion" "$OUT/test_moe.log" | head -90
  tail -3 "$OUT/test_moe.log"
  echo "tests $(( $(date +%s) - t0 )) s"
fi

if [ "$stage" = bench ] || [ "$stage" = all ]; then
  timeout 560 ./build-gpu/strata bench kernels --filter moe --repeats 3 > "$OUT/bench_moe.log" 2>&1
  echo "bench rc=$?"
  grep -E "peak|copy" "$OUT/bench_moe.log" | head -6
  grep -E "moe/" "$OUT/bench_moe.log" | head -40
  echo "-- wgmma against gemm:"
  grep -E "moe/mxfp4-grouped T=[0-9]+ (wgmma|gemm)" "$OUT/bench_moe.log"
  echo "bench $(( $(date +%s) - t0 )) s"
fi
