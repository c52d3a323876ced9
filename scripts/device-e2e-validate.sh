#!/bin/bash
# Validation run of issue 22 and the issue-18 table on the H200 (from the repository root):
# ctest -L gpu on the tree, then bench e2e on the 8-layer slice (every placement) and k3-mini on
# the CPU backends, checked against predictions committed before. Logs under $OUT.
#   bash scripts/device-e2e-validate.sh
DEVICE_OUT_DEFAULT=/tmp/e2e-validate-out
source scripts/device-lib.sh
git log --oneline -1 2>/dev/null
device_build strata test_kernels test_engine
S=./build-gpu/strata
($S synth --preset k3-slice --layers 8 --experts 64 -o /tmp/k3-slice8 -q > $OUT/synth.log 2>&1; echo "synth rc=$?" >> $OUT/synth.log; $S synth --preset k3-mini -o /tmp/k3-mini -q >> $OUT/synth.log 2>&1; echo "synth mini rc=$?" >> $OUT/synth.log) &
device_ctest_gpu 200 100
wait; cat $OUT/synth.log | grep rc
timeout 260 $S bench e2e -m /tmp/k3-slice8 --batch 1 8 --prefill 1024 4096 --context 256 --steps 16 --hardware docs/hardware/h200-measured-1202.json --json $OUT/e2e-k3-slice8.json 2>$OUT/e2e_slice.err | tee $OUT/e2e_slice.txt | cut -c1-420
echo "slice $(( $(date +%s) - t0 )) s"
for d in cpu cpu-ref; do
timeout 70 $S bench e2e -m /tmp/k3-mini --device $d --placements "all host" --batch 1 8 --prefill 256 1024 --context 64 --steps 16 --json $OUT/e2e-k3-mini-$d.json 2>$OUT/e2e_mini_$d.err | tee $OUT/e2e_mini_$d.txt | cut -c1-300
echo "mini $d $(( $(date +%s) - t0 )) s"
done
echo "total $(( $(date +%s) - t0 )) s"
