#!/bin/bash
# Device run for the clustered row ops (KimiRMSNorm, AttnRes mix; kernels/ops/row_cluster.cuh), on
# the H200 from the repository root after the device tooling has been carried over:
#   bash scripts/device-rowops.sh [build|test|bench|engine|e2e|all]   (default all = build test
#   bench; logs under $OUT)
# build:  build-gpu (Release, Ninja if present), targets test_kernels, test_engine and strata, -j16.
# test:   the op-checks of kernels/ops (test_kernels "ops gpu*", skips fail with
#         STRATA_REQUIRE_GPU=1), among them the clustered rows at T = 1..16 against the oracle,
#         a row alone bitwise equal to the same row among 16, and the one-CTA fallback.
# bench:  strata bench kernels --filter ops: each line twice, the clustered form and "row-blocks"
#         (the one-CTA-per-row kernels, unchanged from main: the before numbers, same run).
# engine: the CUDA backend against the CPU reference on k3-mini (test_engine "cuda backend*":
#         layers, replayed routing, placement invariance bit for bit, graphs = eager).
# e2e:    bench e2e --profile on the 8-layer k3-slice, all experts on the GPU (the profile of
#         docs/performance.md "End to end": AttnRes mix 0.639 ms / 17 calls, RMSNorm 0.349 ms /
#         17 calls per decode step before); synthesizes /tmp/k3-slice8 (22.8 GB) if absent.
# Each stage fits the 10-minute limit of one device command; run them one by one if needed.
DEVICE_OUT_DEFAULT=/tmp/rowops-out
source scripts/device-lib.sh
stage=${1:-all}
git log --oneline -1 2>/dev/null | sed 's/^/tree: /'
want() { [ "$stage" = "$1" ] || { [ "$stage" = all ] && [ "$2" = default ]; }; }

if want build default; then
  device_build test_kernels test_engine strata
fi

if want test default; then
  STRATA_REQUIRE_GPU=1 ./build-gpu/test_kernels "ops gpu*" -d yes > "$OUT/test_ops.log" 2>&1
  echo "test_kernels ops gpu*: rc=$?"
  grep -E "^[0-9.]+ s: ops gpu" "$OUT/test_ops.log"
  grep -E -B3 -A12 "FAILED|with expansion" "$OUT/test_ops.log" | head -80
  tail -3 "$OUT/test_ops.log"
  echo "tests $(( $(date +%s) - t0 )) s"
fi

if want bench default; then
  ./build-gpu/strata bench kernels --filter ops --repeats 10 --json "$OUT/bench_ops.json" \
    > "$OUT/bench_ops.log" 2>&1
  echo "bench rc=$?"
  grep -E "peak|copy|ops/" "$OUT/bench_ops.log" | head -60
  echo "bench $(( $(date +%s) - t0 )) s"
fi

if want engine; then
  STRATA_REQUIRE_GPU=1 ./build-gpu/test_engine "cuda backend*" -d yes > "$OUT/test_engine.log" 2>&1
  echo "test_engine cuda backend*: rc=$?"
  grep -E "^[0-9.]+ s: cuda backend|\[cuda backend" "$OUT/test_engine.log" | head -40
  grep -E -B3 -A12 "FAILED|with expansion" "$OUT/test_engine.log" | head -80
  tail -3 "$OUT/test_engine.log"
  echo "engine $(( $(date +%s) - t0 )) s"
fi

if want e2e; then
  [ -d /tmp/k3-slice8 ] ||
    ./build-gpu/strata synth --preset k3-slice --layers 8 --experts 64 -o /tmp/k3-slice8 \
      > "$OUT/synth.log" 2>&1 || { tail -5 "$OUT/synth.log"; exit 1; }
  ./build-gpu/strata bench e2e -m /tmp/k3-slice8 --placements "all GPU" --batch 1 --prefill 1024 \
    --context 256 --steps 16 --profile > "$OUT/e2e.log" 2>&1
  echo "bench e2e rc=$?"
  cat "$OUT/e2e.log" | tail -40
  echo "e2e $(( $(date +%s) - t0 )) s"
fi
