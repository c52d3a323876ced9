#!/bin/bash
# Branch wip/mla-tail-trace (DIAGNOSTIC build): the MLA decode chain's timeline and two startup/merge
# experiments, one device call, from the repository root with a `strata` built from this branch:
#   STRATA=path/to/strata bash scripts/device-mla-trace.sh        (logs under $OUT)
# STRATA_MLA_EXP: 0 as main; 1 the first tiles issued after q_lat's copy; 2 merge_ctx_x (every
# load first, one barrier); 3 both. Each: `bench kernels --filter mla/decode` untraced (the
# timing; every variant carries the same trace stores), then traced (the timeline per chain).
DEVICE_OUT_DEFAULT=/tmp/mla-trace
source scripts/device-lib.sh
S=${STRATA:?STRATA= a strata built from wip/mla-tail-trace}
nvidia-smi --query-gpu=name --format=csv,noheader
for r in 1 2; do
  for x in 0 1 2 3; do
    STRATA_MLA_EXP=$x timeout 60 $S bench kernels --filter mla/decode --repeats 5 > "$OUT/b_${x}_$r.txt" 2>&1
    echo "exp=$x round $r rc=$?"; grep -E "^mla/decode" "$OUT/b_${x}_$r.txt" | sed -E 's/ +H=96[^,]*, absorbed, / /' | cut -c1-100
  done
done
for x in 0 1 2 3; do
  STRATA_MLA_TRACE=1 STRATA_MLA_EXP=$x timeout 60 $S bench kernels --filter mla/decode --repeats 5 > "$OUT/t_$x.txt" 2>&1
  echo "traced exp=$x rc=$?"
  grep "mla-trace" "$OUT/t_$x.txt" | awk '{k=$2" "$3; c[k]++; if (c[k]>2 && c[k]<=4) print}' | cut -c1-460
done
echo "total $(( $(date +%s) - t0 )) s"
