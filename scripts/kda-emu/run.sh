#!/bin/bash
# CPU check of chunk_prep_tc2 without a GPU: the kernel's source runs on emulated threads (one
# std::thread per CUDA thread, warp shuffles and mma.sync m16n8k8 tf32 emulated, exact exp/rcp) and
# its workspace (W, U, Γ⊙Q, K̃, A_qk, e^{G_C}) is compared with a double-precision evaluation of the
# definitions (forward substitution of (I + L)) over 2 sequences (75 and 40 tokens: full, ragged,
# conv-state chunks) × 2 heads, for q/k/v row strides 3·H·K, H·K and 3·H·K + 2.
# Expected: rel L2 ≈ 2–3e-4 for the tf32-rounded W, Γ⊙Q, K̃, A_qk; ≤ 1e-5 for U and e^{G_C}.
# Usage: bash scripts/kda-emu/run.sh   (about 10 s on 2 cores)
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
python3 "$root/scripts/kda-emu/extract.py" "$tmp"
g++ -std=c++20 -O1 -I"$root" -I"$root/scripts/kda-emu" -I"$tmp" -o "$tmp/check" \
  "$root/scripts/kda-emu/check_prep_tc2.cpp" -lpthread
for stride in 768 256 770; do
  echo "q/k/v row stride $stride"
  "$tmp/check" $stride
done
