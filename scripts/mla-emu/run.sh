#!/bin/bash
# CPU check of MLA decode's attn_wgmma without a GPU: the kernel's source (extract.py) runs on
# emulated threads (emu.h: one std::thread per CUDA thread; named barriers, mbarriers and the
# wgmmas with their shared-memory descriptors emulated; a copy lands at issue, a wgmma runs at the
# wait_group that retires it), and its merged split states are compared with a double-precision
# softmax attention (check_decode.cpp). Checks the layouts, descriptors, fragment maps, masking,
# the two warpgroups' hand-offs and the ring's refill order against the wgmmas still in flight (a
# deadlock hangs it); not the proxy fences or late copies. Expected: rel L2 ≈ 1e-3 (P rounded to
# bf16), "all ok". Usage: bash scripts/mla-emu/run.sh   (about 10 s on 2 cores)
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
python3 "$root/scripts/mla-emu/extract.py" "$tmp"
g++ -std=c++20 -O1 -I"$root" -I"$root/scripts/mla-emu" -I"$tmp" -o "$tmp/check" \
  "$root/scripts/mla-emu/check_decode.cpp" -lpthread
timeout 600 "$tmp/check"
