#!/bin/bash
# Device check of a tree (issue 18/19 work): build, ctest -L gpu (skips fail; -j3, failures
# re-run alone), then bench e2e on the 8-layer slice, all experts on the GPU (random decode
# tokens, prefill 1024) for as long as LIMIT allows. On the H200 from the repository root:
#   LIMIT=seconds bash scripts/device-gpu-check.sh        (logs under $OUT)
# Carry .device/env.sh, .device/debs and .device/shared (the Kimi-Linear GPU cases read
# .device/shared/configs: `mkdir -p .device/shared && cp -r ../shared/configs .device/shared/`
# here first; without it they skip).
DEVICE_OUT_DEFAULT=/tmp/gpu-check-out
source scripts/device-lib.sh
LIMIT=${LIMIT:-300}
git log --oneline -1 2>/dev/null
device_build strata test_kernels test_engine
S=./build-gpu/strata
device_synth_slice8 $S &
device_ctest_gpu 170 120
wait; tail -1 $OUT/synth.log
left=$(( LIMIT - ($(date +%s) - t0) ))
echo "e2e gets $left s"
[ $left -gt 20 ] && timeout $left $S bench e2e -m /tmp/k3-slice8 --placements "all GPU" --batch 1 8 --prefill 1024 --context 256 --steps 16 --hardware docs/hardware/h200-measured-gemm.json --json $OUT/e2e-k3-slice8.json 2>$OUT/e2e_slice.err | tee $OUT/e2e_slice.txt | grep -v "^  gpu engine"
echo "total $(( $(date +%s) - t0 )) s"
