#!/bin/bash
# A/B of the engine on the H200 (from the repository root): builds this tree (strata, test_kernels,
# test_engine), runs `ctest -L gpu`, synthesizes the 8-layer k3-slice, then `bench e2e` with the
# new binary and with BASE (a strata built for another tree, carried), interleaved, two rounds:
#   BASE=.device/bin/strata-base [PLACEMENTS="all GPU"] bash scripts/device-e2e-ab.sh
DEVICE_OUT_DEFAULT=/tmp/e2e-ab-out
source scripts/device-lib.sh
: "${BASE:?BASE=path of the strata to compare against}"
PLACEMENTS=${PLACEMENTS:-all GPU}
device_build strata test_kernels test_engine
S=./build-gpu/strata
device_synth_slice8 $S &
device_ctest_gpu 200 100
wait
tail -1 "$OUT/synth.log"
for r in 1 2; do
  for b in new base; do
    B=$S
    [ $b = base ] && B=$BASE
    echo "== $b round $r"
    timeout 100 "$B" bench e2e -m /tmp/k3-slice8 --placements "$PLACEMENTS" --batch 1 8 \
      --prefill 16 --context 256 --steps 16 --hardware docs/hardware/h200-measured-1202.json \
      2> /dev/null | grep -E "^all|^10|gpu engine" | cut -c1-260
    echo "t $(( $(date +%s) - t0 )) s"
  done
done
