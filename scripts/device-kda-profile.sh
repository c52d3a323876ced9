#!/bin/bash
# Issue 20 item 4's stretch: where KDA prefill's time goes at T = 16K (prep against scan), on the
# GPU machine from the repository root (one call, ≈ 2 min with the build):
#   bash scripts/device-kda-profile.sh        (logs under $OUT, default /tmp/kda-profile)
# ncu on the first prefill call's two kernels (chunk_prep_tc2, chunk_scan_tc; the bench's first
# line is T = 16384), speed of light, occupancy and launch statistics, unlocked clocks. Note that
# `bench kernels --filter` matches case names ("kda"), not line names.
DEVICE_OUT_DEFAULT=/tmp/kda-profile
source scripts/device-lib.sh
if [ -n "${STRATA:-}" ]; then S=$STRATA; else device_build strata; S=./build-gpu/strata; fi
NCU=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
timeout ${LIMIT:-240} $NCU --clock-control none -k regex:"chunk_(prep_tc2|scan_tc)" -c 2 \
  --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats \
  $S bench kernels --filter kda --repeats 1 > "$OUT/ncu_kda.txt" 2>&1
echo "ncu rc=$? $(( $(date +%s) - t0 )) s"
grep -E "chunk_|Duration|Throughput|Registers Per|Grid Size|Achieved Occupancy|Stall" \
  "$OUT/ncu_kda.txt" | head -40
