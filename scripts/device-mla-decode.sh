#!/bin/bash
# Issue 20 item 3: the MLA decode kernels on the GPU machine, from the repository root (one call):
#   bash scripts/device-mla-decode.sh              (logs under $OUT, default /tmp/mla-decode)
#   STRATA=path/to/strata TESTS=path/to/test_kernels bash scripts/device-mla-decode.sh
#                                                  (binaries built elsewhere; no build here)
#   BASE=path/to/other/strata ...                  (that binary's decode lines interleaved with
#                                                  these, two rounds: an A/B on one machine)
# The decode op-checks (attn_tma and attn_split against the CPU reference and each other), then
# `bench kernels --filter mla/decode` with the default kernel (attn_tma) and STRATA_MLA_DECODE=mma.
# NCU=1 adds ncu (--set full and per-instruction source counters; unlocked clocks) of attn_tma at
# B = 1, 32K positions (the bench's --quick line).
DEVICE_OUT_DEFAULT=/tmp/mla-decode
source scripts/device-lib.sh
device_ops_checks "mla gpu decode*" ${LIMIT:-200}
lines() { grep -E "^peak/copy|^mla/decode" "$1" | sed -E 's/ +H=96[^,]*, absorbed, / /' | cut -c1-130; }
for r in 1 ${BASE:+2}; do
  for b in this ${BASE:+base}; do
    bin=$S; [ $b = base ] && bin=$BASE
    timeout 60 $bin bench kernels --filter mla/decode --repeats 3 > "$OUT/bench_${b}_$r.txt" 2>&1
    echo "bench ($b) rc=$? $(( $(date +%s) - t0 )) s"; lines "$OUT/bench_${b}_$r.txt"
  done
done
STRATA_MLA_DECODE=mma timeout 60 $S bench kernels --filter mla/decode --repeats 3 \
  > "$OUT/bench_mma.txt" 2>&1
echo "bench (mma) rc=$? $(( $(date +%s) - t0 )) s"; lines "$OUT/bench_mma.txt" | grep -v peak
if [ -n "${NCU:-}" ]; then
  N=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
  timeout 150 $N --clock-control none --kernel-name-base demangled -k regex:attn_tma -c 1 \
    --set full --import-source no -o "$OUT/attn_tma" \
    $S bench kernels --filter mla/decode --quick --repeats 1 > "$OUT/ncu_run.txt" 2>&1
  echo "ncu rc=$? $(( $(date +%s) - t0 )) s"
  $N -i "$OUT/attn_tma.ncu-rep" --page details > "$OUT/ncu_details.txt" 2>&1
  $N -i "$OUT/attn_tma.ncu-rep" --page source --csv --print-source sass > "$OUT/ncu_sass.csv" 2>&1
  grep -E "Duration|DRAM Throughput|L2 Cache Throughput|No Eligible|Registers Per" \
    "$OUT/ncu_details.txt"
fi
