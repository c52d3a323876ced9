#!/usr/bin/env bash
# Branch wip/moe-rs: the register-A wgmma form's variants in one device call (run from the repo
# root on the GPU machine, binaries unpacked under .device/bin; docs/performance.md "Tried and
# dropped", grouped GEMM path). STRATA_MOE_RS picks the tiles (kernels/moe/intgemm.cu, launch_rs):
# 0 registers ring, 1/2/3 shared-memory weight rings, 4/5 256-row CTAs (smem / register ring).
source .device/env.sh
K=$PWD/.device/bin/test_kernels; S=$PWD/.device/bin/strata; t0=$(date +%s)
export STRATA_REQUIRE_GPU=1 STRATA_SHARED_DIR=$PWD/.device/shared
nvidia-smi --query-gpu=name --format=csv,noheader
for alt in 0 1 3 4 5; do
  STRATA_MOE_RS=$alt timeout 30 $K "moe gpu: GEMM paths with token tiles*" > $OUT/tiles$alt.log 2>&1
  echo "tiles alt=$alt rc=$? $(( $(date +%s) - t0 )) s"; tail -1 $OUT/tiles$alt.log
done
for alt in 0 1 3 4 5; do
  STRATA_MOE_RS=$alt timeout 40 $S bench kernels --filter moe --tokens 1024 --repeats 3 > $OUT/b1024_$alt.txt 2>&1
  echo "alt=$alt rc=$? $(( $(date +%s) - t0 )) s"; grep -E "grouped T=1024 (wgmma|gemm) " $OUT/b1024_$alt.txt | cut -c1-150
done
for alt in 0 1; do
  STRATA_MOE_RS=$alt timeout 40 $S bench kernels --filter moe --tokens 4096 --repeats 3 > $OUT/b4096_$alt.txt 2>&1
  echo "alt=$alt rc=$? $(( $(date +%s) - t0 )) s"; grep -E "grouped T=4096 (wgmma|gemm) " $OUT/b4096_$alt.txt | cut -c1-150
done
timeout 150 $K "moe gpu*" > $OUT/moe.log 2>&1; echo "moe gpu* rc=$? $(( $(date +%s) - t0 )) s"; tail -2 $OUT/moe.log
