#!/bin/bash
# A/B of a kernels/moe change on the H200 (issue 19) with binaries built on the dev VM, in one
# short device command (no build there):
#   here:  build strata and test_kernels of the change (build/); copy them to
#          .device/bin/strata-new and .device/bin/test_kernels-new; swap the changed files for
#          `git show BASE:FILE`, rebuild strata, copy it to .device/bin/strata-base, swap back.
#   there: bash scripts/device-moe-ab.sh [TOKENS...]      (carry .device; logs under $OUT)
# Runs the MoE op-checks of the new binary (test_kernels "moe gpu*", skips fail), then `strata
# bench kernels --filter moe --tokens TOKENS --repeats 3` (default 256 1024 4096) with the new
# binary, then the base one.
DEVICE_OUT_DEFAULT=/tmp/moe-ab-out
source scripts/device-lib.sh
tokens=${*:-256 1024 4096}
bin=.device/bin
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader
STRATA_REQUIRE_GPU=1 timeout 120 $bin/test_kernels-new "moe gpu*" > "$OUT/test_moe.log" 2>&1
echo "test rc=$? $(( $(date +%s) - t0 )) s"
grep -E "test cases|assertions|FAILED" "$OUT/test_moe.log" | head
for b in new base; do
  [ -x $bin/strata-$b ] || continue
  timeout 100 $bin/strata-$b bench kernels --filter moe --tokens $tokens --repeats 3 \
    > "$OUT/bench_$b.log" 2>&1
  echo "$b rc=$? $(( $(date +%s) - t0 )) s"
  grep -E "grouped.*gemm|peak|copy" "$OUT/bench_$b.log" | head -12
done
