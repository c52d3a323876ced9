#!/bin/bash
# Branch wip/mla-ss: attn_ss (the two warpgroups on alternate tiles) and attn_tma with box-by-box
# waits, on the GPU machine in one call, from the repository root with binaries built elsewhere
# (STRATA=, TESTS=; BASE= a strata of main for the A/B) or built here:
#   STRATA=… TESTS=… BASE=… bash scripts/device-mla-ss.sh        (logs under $OUT)
# The decode op-checks (mma, tma and ss against the CPU reference and each other; a hang shows as
# the LIMIT timeout), then `bench kernels --filter mla/decode`: main's binary, this tma, this ss,
# interleaved twice.
DEVICE_OUT_DEFAULT=/tmp/mla-ss
source scripts/device-lib.sh
device_ops_checks "mla gpu decode*" ${LIMIT:-150}
lines() { grep -E "^mla/decode" "$1" | sed -E 's/ +H=96[^,]*, absorbed, / /' | cut -c1-110; }
for r in 1 2; do
  for k in ${BASE:+base} tma ss; do
    bin=$S; [ $k = base ] && bin=$BASE
    STRATA_MLA_DECODE=${k/base/tma} timeout 60 $bin bench kernels --filter mla/decode --repeats 5 \
      > "$OUT/bench_${k}_$r.txt" 2>&1
    echo "bench $k round $r rc=$? $(( $(date +%s) - t0 )) s"; lines "$OUT/bench_${k}_$r.txt"
  done
done
