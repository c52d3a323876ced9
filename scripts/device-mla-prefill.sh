#!/bin/bash
# Issue 20 item 2: the MLA prefill kernels on the GPU machine, from the repository root (one call):
#   bash scripts/device-mla-prefill.sh              (logs under $OUT, default /tmp/mla-prefill)
#   STRATA=path/to/strata TESTS=path/to/test_kernels bash scripts/device-mla-prefill.sh
#                                                   (binaries built elsewhere; no build here)
# The prefill op-checks (every kernel against the CPU reference and bitwise equal to the others),
# then `bench kernels --filter mla/prefill` (the fresh-prompt lines of every kernel, the long-cache
# lines of the default) and the long-cache lines again with STRATA_MLA_PREFILL set to each of
# $KERNELS (default cpasync). NCU=1 adds
# ncu (speed of light, memory, warp state, scheduler; unlocked clocks) of tma_fa3_pp and of cp.async
# at T = 2048.
DEVICE_OUT_DEFAULT=/tmp/mla-prefill
source scripts/device-lib.sh
device_ops_checks "mla gpu prefill*" ${LIMIT:-240}
lines() { grep -E "^peak/bf16|^mla/prefill" "$1" | sed -E 's/ +H=96[^0-9]*kernel +/  /' | cut -c1-140; }
timeout 120 $S bench kernels --filter mla/prefill --repeats 3 > "$OUT/bench.txt" 2>&1
echo "bench rc=$? $(( $(date +%s) - t0 )) s"; lines "$OUT/bench.txt"
for k in ${KERNELS:-cpasync}; do
  STRATA_MLA_PREFILL=$k timeout 120 $S bench kernels --filter mla/prefill --repeats 3 \
    > "$OUT/bench_$k.txt" 2>&1
  echo "bench ($k default) rc=$? $(( $(date +%s) - t0 )) s"; lines "$OUT/bench_$k.txt" | grep "S="
done
if [ -n "${NCU:-}" ]; then
  N=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
  # The first launch of each kernel in the bench's fresh-prompt lines.
  for k in tma_fa3_pp cpasync; do
    r="attn_prefill_tma<true, true, true>"; [ $k = cpasync ] && r="attn_prefill<"
    timeout 120 $N --clock-control none --kernel-name-base demangled \
      -k regex:"$r" -c 1 --section SpeedOfLight --section MemoryWorkloadAnalysis \
      --section WarpStateStats --section SchedulerStats --section Occupancy \
      $S bench kernels --filter mla/prefill --quick --repeats 1 > "$OUT/ncu_$k.txt" 2>&1
    echo "ncu $k rc=$? $(( $(date +%s) - t0 )) s"
    grep -E "attn_prefill|Duration|L2 Cache Throughput|No Eligible|Registers Per" "$OUT/ncu_$k.txt"
  done
fi
