#!/bin/bash
# MLA decode, both attention kernels, on the GPU machine from the repository root (one call):
#   1. the binaries: .device/mla/{test_kernels,strata}.gz when present (built on the dev machine:
#      `ninja -C build strata test_kernels`, then gzip -c into .device/mla/; carry
#      [".device/env.sh", ".device/debs", ".device/mla"]), else build-gpu is built here;
#   2. `test_kernels "mla gpu decode*"` (every decode case runs the wgmma and the mma kernel
#      against the CPU reference and against each other);
#   3. `strata bench kernels --filter mla/decode --repeats 3` with STRATA_MLA_DECODE=mma, wgmma,
#      wgmma, mma (interleaved: the baseline is in the same run; the lines carry the copy peak).
# Logs straight under $OUT (default /tmp/mla-decode), so a timeout still returns what ran. A hung
# test (rc 124) skips the benches.
DEVICE_OUT_DEFAULT=/tmp/mla-decode
source scripts/device-lib.sh
if [ -f .device/mla/test_kernels.gz ] && [ -f .device/mla/strata.gz ]; then
  gunzip -c .device/mla/test_kernels.gz > /tmp/test_kernels
  gunzip -c .device/mla/strata.gz > /tmp/strata
  chmod +x /tmp/test_kernels /tmp/strata
  T=/tmp/test_kernels S=/tmp/strata
else
  device_build test_kernels strata
  T=./build-gpu/test_kernels S=./build-gpu/strata
fi
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader
STRATA_REQUIRE_GPU=1 timeout ${TEST_LIMIT:-90} $T "mla gpu decode*" -d yes > "$OUT/tests.log" 2>&1
rc=$?
echo "tests rc=$rc t=$(($(date +%s) - t0)) s"
grep -E "^All tests|^test cases|FAILED|failed" "$OUT/tests.log" | head -20
grep -E -B3 -A14 "FAILED:" "$OUT/tests.log" | head -60
[ $rc = 124 ] && ks="" || ks="mma wgmma wgmma mma"
i=0
for k in $ks; do
  i=$((i + 1))
  STRATA_MLA_DECODE=$k timeout 30 $S bench kernels --filter mla/decode --repeats 3 \
    > "$OUT/bench_${i}_$k.log" 2>&1
  echo "bench $k rc=$? t=$(($(date +%s) - t0)) s"
  grep -E "peak|mla/decode" "$OUT/bench_${i}_$k.log" | cut -c1-200
done
