# Sourced by the scripts/device-*.sh runs on the H200 (from the repository root): the staged
# tooling (.device/env.sh where carried), pipefail, $OUT (the caller's default unless set), the
# start time t0, and device_build.
[ -f .device/env.sh ] && source .device/env.sh
set -o pipefail
OUT=${OUT:-$DEVICE_OUT_DEFAULT}
mkdir -p "$OUT"
t0=$(date +%s)

# device_build TARGET...: configure build-gpu (Release; Ninja when present) and build the targets
# with 16 jobs, logs under $OUT; on failure the errors and exit 1. Prints warnings and the time.
device_build() {
  local gen=""
  command -v ninja >/dev/null && gen="-G Ninja"
  cmake -S . -B build-gpu $gen -DCMAKE_BUILD_TYPE=Release > "$OUT/cfg.log" 2>&1 ||
    { tail -30 "$OUT/cfg.log"; exit 1; }
  cmake --build build-gpu -j16 --target "$@" > "$OUT/build.log" 2>&1 ||
    { grep -E "error|FAILED" -A5 "$OUT/build.log" | head -60; exit 1; }
  grep -E "warning" "$OUT/build.log" | head -5
  echo "build $(( $(date +%s) - t0 )) s"
}

# device_ops_checks PATTERN LIMIT: S (strata) and K (test_kernels) from STRATA= and TESTS= (built
# elsewhere) or built here, then the op-checks matching PATTERN within LIMIT seconds (skips fail),
# log $OUT/ops.log; prints the summary and any failure.
device_ops_checks() {
  if [ -n "${STRATA:-}" ]; then
    S=$STRATA; K=${TESTS:?TESTS= the test_kernels binary}
  else
    device_build strata test_kernels; S=./build-gpu/strata; K=./build-gpu/test_kernels
  fi
  STRATA_REQUIRE_GPU=1 timeout "$2" $K "$1" > "$OUT/ops.log" 2>&1
  echo "op-checks '$1' rc=$? $(( $(date +%s) - t0 )) s"; tail -2 "$OUT/ops.log"
  grep -E -B3 -A25 "FAILED" "$OUT/ops.log" | head -60
}

# device_ctest_gpu LIMIT RERUN_LIMIT: ctest -L gpu on build-gpu with STRATA_REQUIRE_GPU=1 (skips
# fail) and -j3 within LIMIT seconds, log $OUT/ctest_gpu.log; failures re-run alone within
# RERUN_LIMIT, log $OUT/ctest_rerun.log. Prints the summaries and the time; returns ctest's status.
device_ctest_gpu() {
  local rc
  STRATA_REQUIRE_GPU=1 STRATA_SHARED_DIR=$PWD/.device/shared timeout "$1" \
    ctest --test-dir build-gpu -L gpu --output-on-failure -j3 > "$OUT/ctest_gpu.log" 2>&1
  rc=$?
  echo "ctest -L gpu -j3 rc=$rc"
  grep -E "tests passed|tests failed|Total Test" "$OUT/ctest_gpu.log"
  grep -E "\*\*\*Failed|Not Run|Skipped|Timeout|Failed  " "$OUT/ctest_gpu.log" | head -20
  if [ $rc -ne 0 ]; then
    STRATA_REQUIRE_GPU=1 STRATA_SHARED_DIR=$PWD/.device/shared timeout "$2" \
      ctest --test-dir build-gpu --rerun-failed --output-on-failure -j1 > "$OUT/ctest_rerun.log" 2>&1
    echo "rerun failed alone rc=$?"
    grep -E "tests passed|tests failed" "$OUT/ctest_rerun.log"
    grep -E -A20 "FAILED" "$OUT/ctest_rerun.log" | head -60
  fi
  echo "ctest $(( $(date +%s) - t0 )) s"
  return $rc
}

# device_synth_slice8 STRATA: the 8-layer k3-slice (64 experts, K3's widths) into /tmp/k3-slice8,
# log and exit status in $OUT/synth.log (run it in the background beside the tests, then `wait`).
device_synth_slice8() {
  "$1" synth --preset k3-slice --layers 8 --experts 64 -o /tmp/k3-slice8 -q > "$OUT/synth.log" 2>&1
  echo "synth rc=$?" >> "$OUT/synth.log"
}
