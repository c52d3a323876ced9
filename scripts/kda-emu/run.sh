#!/bin/bash
# CPU check of chunk_prep_tc2 and chunk_scan_tc without a GPU: the kernels' source runs on emulated
# threads (one std::thread per CUDA thread, warp shuffles and mma.sync m16n8k8 tf32 emulated,
# cp.async as a copy, exact exp2/rcp in place of the MUFU approximations). The prep's workspace (W,
# U, Γ⊙Q, K̃, A_qk, e^{G_C}) is compared with a double-precision evaluation of the definitions
# (forward substitution of (I + L)); chunk_scan_tc<true> with <false> (state bit for bit, y); and
# the pipeline's y and final state with the recurrence token by token. 2 sequences (75 and 40
# tokens: full, ragged and conv-state chunks) × 2 heads, q/k/v row strides 3·H·K, H·K, 3·H·K + 2.
# Expected: rel L2 ≈ 2–3e-4 for the tf32-rounded W, Γ⊙Q, K̃, A_qk, ≤ 1e-5 for U and e^{G_C}; no
# state difference between the scans; end to end y ≈ 1.5e-3 and state ≈ 3e-4 (test tolerances
# 5e-3 and 2e-3).
# Usage: bash scripts/kda-emu/run.sh   (about 40 s on 2 cores)
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
