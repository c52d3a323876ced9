#!/bin/bash
# Validation (2) of issue 22 on the H200 machine's host (from the repository root): k3-mini on the
# fast CPU backend (`--device cpu`, 16 threads), predicted from `bench hw`'s model-shape probes and
# checked against `bench e2e`, in two runs so that the predictions are committed before the
# measurement they are checked against:
#   bash scripts/device-planner-validate.sh hw    # bench hw -m + strata plan --bench-e2e → $OUT
#     (MODEL_COLD=MiB: the model-shape probes start on swept caches, bench hw --model-cold;
#     HW_FLAGS: more bench hw flags, e.g. --no-gpu when only the host's rates are checked)
#     (commit $OUT/h200-k3mini-hw.json to docs/hardware/ and the two prediction files to
#     docs/predictions/, then, on a fresh machine:)
#   bash scripts/device-planner-validate.sh e2e   # bench e2e --device cpu, twice → $OUT (each
#     prefill line the median of 3 prompts: one timed prompt moved 1.5x between runs)
# The e2e mode also re-predicts from the committed profile (PROFILE=file, default
# docs/hardware/h200-k3mini-hw.json, when present) so the run's log holds both sides. Each mode: build ≈ 1 min (none with STRATA=binary),
# then under 3 min.
DEVICE_OUT_DEFAULT=/tmp/planner-validate-out
source scripts/device-lib.sh
mode=${1:-}
case "$mode" in
  hw | e2e) ;;
  *) echo "usage: bash scripts/device-planner-validate.sh hw|e2e" >&2; exit 1 ;;
esac
git log --oneline -1 2>/dev/null
# STRATA=path: a strata built elsewhere for this tree (carried), instead of building here.
if [ -n "${STRATA:-}" ]; then S=$STRATA; else device_build strata; S=./build-gpu/strata; fi
[ -f /tmp/k3-mini/config.json ] || $S synth --preset k3-mini -o /tmp/k3-mini -q > "$OUT/synth.log" 2>&1 ||
  { tail -5 "$OUT/synth.log"; exit 1; }
echo "synth $(( $(date +%s) - t0 )) s"
uptime
# The bench e2e lines of (2): the planner predicts exactly these.
E2E=(--device cpu --placements "all host" --batch 1 8 --prefill 256 1024 --context 64 --steps 16)
predict() {  # predict HW_JSON OUT_BASENAME
  $S plan -m /tmp/k3-mini --hardware "$1" --bench-e2e "${E2E[@]}" --json "$OUT/$2.json" \
    > "$OUT/$2.txt" 2>&1
  echo "plan rc=$?"
  cat "$OUT/$2.txt"
}
if [ "$mode" = hw ]; then
  # The whole profile (K3-shaped probes, GPU peaks and kernels) plus the model-shape probes of
  # k3-mini; no disk (the placement is all host).
  timeout 300 $S bench hw --no-disk ${HW_FLAGS:-} -m /tmp/k3-mini ${MODEL_COLD:+--model-cold $MODEL_COLD} \
    --save "$OUT/h200-k3mini-hw.json" \
    --json "$OUT/bench-hw-lines.json" > "$OUT/bench_hw.txt" 2> "$OUT/bench_hw.err"
  echo "bench hw rc=$? $(( $(date +%s) - t0 )) s"
  grep -E "hw/model|hw/host memory" "$OUT/bench_hw.txt" | cut -c1-200
  predict "$OUT/h200-k3mini-hw.json" h200-k3-mini-cpu-probes
else
  PROFILE=${PROFILE:-docs/hardware/h200-k3mini-hw.json}
  [ -f "$PROFILE" ] && predict "$PROFILE" h200-k3-mini-cpu-probes-replay
  for run in 1 2; do
    uptime
    timeout 150 $S bench e2e -m /tmp/k3-mini "${E2E[@]}" --prefill-repeats 3 --json "$OUT/e2e-k3-mini-cpu-$run.json" \
      2> "$OUT/e2e_$run.err" | tee "$OUT/e2e_$run.txt" | cut -c1-300
    echo "e2e run $run rc=$? $(( $(date +%s) - t0 )) s"
  done
fi
echo "total $(( $(date +%s) - t0 )) s"
