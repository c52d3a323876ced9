#!/bin/bash
# Branch wip/mla-dec-t: attn_tma_t (MLA decode with S transposed) on the GPU machine, one call, from
# the repository root with binaries built elsewhere (STRATA=, TESTS=) or built here:
#   bash scripts/device-mla-dec-t.sh              (logs under $OUT, default /tmp/mla-dec-t)
# The decode op-checks (mma, tma and tma_t against the CPU reference and each other), then
# `bench kernels --filter mla/decode` with STRATA_MLA_DECODE=tma and =tma_t interleaved twice.
DEVICE_OUT_DEFAULT=/tmp/mla-dec-t
source scripts/device-lib.sh
device_ops_checks "mla gpu decode*" ${LIMIT:-120}
for r in 1 2; do
  for k in tma tma_t; do
    STRATA_MLA_DECODE=$k timeout 60 $S bench kernels --filter mla/decode --repeats 5 \
      > "$OUT/bench_${k}_$r.txt" 2>&1
    echo "bench $k round $r rc=$? $(( $(date +%s) - t0 )) s"
    grep -E "^mla/decode" "$OUT/bench_${k}_$r.txt" | sed -E 's/ +H=96[^,]*, absorbed, / /' | cut -c1-110
  done
done
