#!/bin/bash
# Where validation (2) of issue 22 misses (k3-mini, fast CPU backend, 16 threads), in one run on the
# GPU machine's host: bench hw's model-shape probes and the predictions from them, the bench e2e
# lines they predict with the backend's per-kind split (telemetry), and bench cpu-trunk's split at
# 16 and 4 threads. A diagnosis, not a validation: the predictions are not committed first (that is
# scripts/device-planner-validate.sh). From the repository root:
#   bash scripts/device-planner-diagnose.sh        (logs under $OUT, also packed as $OUT/all.tgz)
DEVICE_OUT_DEFAULT=/tmp/planner-diagnose-out
source scripts/device-lib.sh
device_build strata
S=./build-gpu/strata
[ -f /tmp/k3-mini/config.json ] || $S synth --preset k3-mini -o /tmp/k3-mini -q > "$OUT/synth.log" 2>&1 ||
  { tail -5 "$OUT/synth.log"; exit 1; }
echo "synth $(( $(date +%s) - t0 )) s"; nproc; uptime
E2E=(--device cpu --placements "all host" --batch 1 8 --prefill 256 1024 --context 64 --steps 16)
timeout 170 $S bench hw --no-disk --no-gpu -m /tmp/k3-mini --save "$OUT/hw.json" \
  --json "$OUT/bench-hw-lines.json" > "$OUT/bench_hw.txt" 2> "$OUT/bench_hw.err"
echo "bench hw rc=$? $(( $(date +%s) - t0 )) s"
$S plan -m /tmp/k3-mini --hardware "$OUT/hw.json" --bench-e2e "${E2E[@]}" --json "$OUT/pred.json" \
  > "$OUT/pred.txt" 2>&1
echo "plan rc=$?"
timeout 100 $S bench e2e -m /tmp/k3-mini "${E2E[@]}" --json "$OUT/e2e.json" 2> "$OUT/e2e.err" |
  tee "$OUT/e2e.txt" | cut -c1-250
echo "e2e rc=$? $(( $(date +%s) - t0 )) s"
for th in 16 4; do
  timeout 60 $S bench cpu-trunk -m /tmp/k3-mini --no-kernels --prompt 1024 --decode 16 --threads $th \
    --json "$OUT/trunk-$th.json" > "$OUT/trunk-$th.txt" 2>&1
  echo "cpu-trunk threads $th rc=$? $(( $(date +%s) - t0 )) s"
done
(cd "$OUT" && tar -czf all.tgz ./*.json ./*.txt ./*.err)
echo "total $(( $(date +%s) - t0 )) s"
