#!/bin/bash
# The `bench e2e` table of docs/performance.md "End to end" on the GPU machine (from the repository
# root): builds strata, synthesizes the 8-layer k3-slice, flushes its writeback (so the disk lines
# do not race it), then every placement at B = 1 and 8 and prefill 1024 / 4096. Logs under $OUT.
#   [HW=docs/hardware/<profile>.json] bash scripts/device-e2e-table.sh
DEVICE_OUT_DEFAULT=/tmp/e2e-table-out
source scripts/device-lib.sh
HW=${HW:-docs/hardware/h200-measured-1202.json}
git log --oneline -1 2>/dev/null
nvidia-smi --query-gpu=name --format=csv,noheader
device_build strata
S=./build-gpu/strata
device_synth_slice8 $S
tail -2 "$OUT/synth.log"
sync
echo "synced $(( $(date +%s) - t0 )) s"
left=$(( 575 - ($(date +%s) - t0) ))
timeout $left $S bench e2e -m /tmp/k3-slice8 --batch 1 8 --prefill 1024 4096 --context 256 \
  --steps 16 --host-cache --hardware "$HW" --json "$OUT/e2e.json" 2> "$OUT/e2e.err" |
  tee "$OUT/e2e.txt" | cut -c1-330
echo "e2e rc=$? total $(( $(date +%s) - t0 )) s"
tail -3 "$OUT/e2e.err"
