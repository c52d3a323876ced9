#!/usr/bin/env bash
# The README's main job on its embedded default: build strata, synthesize the k3-mini checkpoint
# (random weights, the released K3 layout) once, and generate text from a prompt — on the GPU when
# there is one, on the CPU otherwise.
# Usage: scripts/demo.sh ["prompt"] [extra strata run flags...]
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="/usr/local/cuda/bin:$PATH"
prompt=${1:-"The quick brown fox"}
shift || true
build=build
if [ ! -x "$build/strata" ]; then
  gen=()
  command -v ninja >/dev/null && gen=(-G Ninja)
  cmake -S . -B "$build" "${gen[@]}" -DCMAKE_BUILD_TYPE=Release
  cmake --build "$build" -j "$(nproc)" --target strata
fi
model=${STRATA_DEMO_MODEL:-models/k3-mini}
if [ ! -f "$model/config.json" ]; then
  echo "demo: synthesizing k3-mini into $model (once)"
  "$build/strata" synth --preset k3-mini -o "$model"
fi
"$build/strata" inspect "$model"
"$build/strata" run -m "$model" -p "$prompt" -n 32 "$@"
