#!/bin/bash
# Device check of a tree (issue 18/19 work): build, ctest -L gpu (skips fail; -j3, failures
# re-run alone), then bench e2e on the 8-layer slice, all experts on the GPU (random decode
# tokens, prefill 1024) for as long as LIMIT allows. On the H200 from the repository root:
#   LIMIT=seconds bash scripts/device-gpu-check.sh        (logs under $OUT)
DEVICE_OUT_DEFAULT=/tmp/gpu-check-out
source scripts/device-lib.sh
LIMIT=${LIMIT:-300}
git log --oneline -1 2>/dev/null
device_build strata test_kernels test_engine
S=./build-gpu/strata
($S synth --preset k3-slice --layers 8 --experts 64 -o /tmp/k3-slice8 -q > $OUT/synth.log 2>&1; echo "synth rc=$?" >> $OUT/synth.log) &
export STRATA_REQUIRE_GPU=1 STRATA_SHARED_DIR=$PWD/.device/shared
timeout 170 ctest --test-dir build-gpu -L gpu --output-on-failure -j3 > $OUT/ctest_gpu.log 2>&1; rc=$?
echo "ctest -L gpu -j3 rc=$rc"
grep -E "tests passed|tests failed|Total Test" $OUT/ctest_gpu.log; grep -E "\*\*\*Failed|Not Run|Skipped|Timeout|Failed  " $OUT/ctest_gpu.log | head -20
if [ $rc -ne 0 ]; then
  timeout 120 ctest --test-dir build-gpu --rerun-failed --output-on-failure -j1 > $OUT/ctest_rerun.log 2>&1
  echo "rerun failed alone rc=$?"; grep -E "tests passed|tests failed" $OUT/ctest_rerun.log
  grep -E -A20 "FAILED" $OUT/ctest_rerun.log | head -60
fi
echo "ctest $(( $(date +%s) - t0 )) s"
wait; tail -1 $OUT/synth.log
left=$(( LIMIT - ($(date +%s) - t0) ))
echo "e2e gets $left s"
[ $left -gt 20 ] && timeout $left $S bench e2e -m /tmp/k3-slice8 --placements "all GPU" --batch 1 8 --prefill 1024 --context 256 --steps 16 --hardware docs/hardware/h200-measured-gemm.json --json $OUT/e2e-k3-slice8.json 2>$OUT/e2e_slice.err | tee $OUT/e2e_slice.txt | grep -v "^  gpu engine"
echo "total $(( $(date +%s) - t0 )) s"
