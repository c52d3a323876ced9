#!/bin/bash
# MLA decode on wgmma (branch mla-wgmma), on the H200 from the repository root after
# `source .device/env.sh` (scripts/device-lib.sh sources it too when present):
#   1. build build-gpu (Release, -j16: test_kernels strata);
#   2. the MLA op-checks, `test_kernels "[mla]"` (every decode case runs both attention kernels
#      against the CPU reference and against each other; "64 heads (one full wgmma block)" is the
#      smallest layout check);
#   3. `strata bench kernels --filter mla/decode --repeats 3` with the wgmma kernel (default) and
#      with STRATA_MLA_DECODE=mma;
#   4. compute-sanitizer racecheck (shared memory) and memcheck on two small decode cases.
# Logs under $OUT (default /tmp/dev-mla). Each step has its own timeout, so a hung kernel shows as
# rc=124 and the later steps still run. Expected: steps 2-4 about 3 minutes after the build.
DEVICE_OUT_DEFAULT=/tmp/dev-mla
source scripts/device-lib.sh
device_build test_kernels strata
T=./build-gpu/test_kernels
S=./build-gpu/strata

STRATA_REQUIRE_GPU=1 timeout 200 $T "[mla]" -d yes > "$OUT/mla_tests.log" 2>&1
echo "[mla] tests rc=$? t $(($(date +%s) - t0)) s"
grep -E "^All tests|^test cases|FAILED|failed" "$OUT/mla_tests.log" | head -20
grep -E -B3 -A12 "FAILED:" "$OUT/mla_tests.log" | head -80
grep -E "^[0-9.]+ s: mla gpu decode" "$OUT/mla_tests.log" | head -20

for k in wgmma mma; do
  STRATA_MLA_DECODE=$k timeout 90 $S bench kernels --filter mla/decode --repeats 3 \
    --json "$OUT/bench_$k.json" > "$OUT/bench_$k.log" 2>&1
  echo "bench $k rc=$? t $(($(date +%s) - t0)) s"
  grep -E "peak/copy|mla/decode" "$OUT/bench_$k.log" | cut -c1-230
done

CS=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
STRATA_REQUIRE_GPU=1 timeout 120 $CS --tool racecheck --racecheck-report hazard \
  $T "mla gpu decode: 64 heads (one full wgmma block), one tile of 64 rows" \
  > "$OUT/racecheck.log" 2>&1
echo "racecheck rc=$? t $(($(date +%s) - t0)) s"
grep -E "ERROR SUMMARY|RACECHECK SUMMARY|Error|Warning" "$OUT/racecheck.log" | sort | uniq -c | head
STRATA_REQUIRE_GPU=1 timeout 120 $CS --tool memcheck \
  $T "mla gpu decode: odd small shapes, 3 sequences of 1, 300, 5000" > "$OUT/memcheck.log" 2>&1
echo "memcheck rc=$? t $(($(date +%s) - t0)) s"
grep -E "ERROR SUMMARY|Invalid" "$OUT/memcheck.log" | head -5
