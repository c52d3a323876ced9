#!/bin/bash
# The wgmma form's multicast planes (issue 19; STRATA_WGMMA_PLANES=mc2|mc4, kernels/moe/intgemm.cu)
# on the GPU machine in one short device command, with binaries built on the dev VM (no build
# there):
#   here:  configure with -DCMAKE_DISABLE_FIND_PACKAGE_MPI=ON (the machine has no libmpi), build
#          strata and test_kernels, strip them into .device/moe/bin, `git log --oneline -1` into
#          .device/moe/commit.txt; copy this script to .device/moe/run.sh.
#   there: OUT=$OUT bash .device/moe/run.sh   (carry .device/debs, .device/env.sh, .device/moe)
# Runs the layout probe and the partly-filled-tile op-checks (with STRATA_WGMMA_PLANES set, the
# wgmma form per CTA and in clusters of 2 and 4), the MoE bench of the three arms (planes per CTA,
# mc2, mc4: `strata bench kernels --filter moe --tokens 1024 4096 --repeats 3 --paths wgmma gemm`),
# the full `test_kernels "moe gpu*"`, then ncu of the mc2 gate|up kernel at T = 4096 if time is
# left. A hang of the multicast form in the quick op-checks skips its bench and the full checks.
DEVICE_OUT_DEFAULT=/tmp/moe-mc-out
source scripts/device-lib.sh
bin=.device/moe/bin
cat .device/moe/commit.txt
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader
export STRATA_REQUIRE_GPU=1
# Any mc value makes the op-checks run the wgmma form per CTA and in clusters of 2 and 4.
export STRATA_WGMMA_PLANES=mc2
timeout 60 $bin/test_kernels "moe gpu: wgmma operand*,moe gpu: GEMM paths with token tiles*" > "$OUT/test_quick.log" 2>&1
qrc=$?
echo "quick rc=$qrc $(( $(date +%s) - t0 )) s: $(grep -E 'test cases|assertions' "$OUT/test_quick.log" | tr '\n' ' ')"
arms="base mc2 mc4"
[ $qrc -eq 124 ] && arms="base"  # a hang in the multicast form: no bench of it
grep -E "N=(16|24|16sw) D\[|FAILED|first mismatch|wgmma planes|launch status" "$OUT/test_quick.log" | sort | uniq -c | head -20
for round in 1; do
  for arm in $arms; do
    env_arm=""; [ $arm != base ] && env_arm=$arm
    STRATA_WGMMA_PLANES=$env_arm timeout 70 $bin/strata bench kernels --filter moe --tokens 1024 4096 \
      --repeats 3 --paths wgmma gemm > "$OUT/bench_${arm}_$round.log" 2>&1
    echo "bench $arm rc=$? $(( $(date +%s) - t0 )) s"
    grep -E "peak/|grouped" "$OUT/bench_${arm}_$round.log" | cut -c1-230
  done
done
[ $qrc -ne 124 ] && timeout 120 $bin/test_kernels "moe gpu*" > "$OUT/test_moe.log" 2>&1
echo "test moe gpu* rc=$? $(( $(date +%s) - t0 )) s"
grep -E "test cases|assertions" "$OUT/test_moe.log"
grep -E -B2 -A12 "FAILED" "$OUT/test_moe.log" | head -60
left=$(( 250 - ($(date +%s) - t0) ))
if [ $left -gt 40 ] && command -v ncu >/dev/null; then
  STRATA_WGMMA_PLANES=mc2 timeout $left ncu --clock-control none -k regex:wgmma_kernel -c 1 \
    --section SpeedOfLight --section MemoryWorkloadAnalysis \
    $bin/strata bench kernels --filter moe --tokens 4096 --repeats 1 --paths wgmma > "$OUT/ncu_mc2.log" 2>&1
  echo "ncu rc=$? $(( $(date +%s) - t0 )) s"
  grep -E "Duration|Throughput|Busy|Hit Rate|L2 |DRAM" "$OUT/ncu_mc2.log" | head -30
fi
echo "total $(( $(date +%s) - t0 )) s"
