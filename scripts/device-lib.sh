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
