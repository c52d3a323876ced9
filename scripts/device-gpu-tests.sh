#!/bin/bash
# Every `gpu` case of the test binaries (the cases of `ctest -L gpu`) on the GPU machine, with
# binaries built elsewhere, in three groups side by side — moe, mla, the rest of test_kernels, then
# test_engine — in ≈ 170 s on an H100 (no device build). From the repository root:
#   TESTS=path/to/test_kernels ENGINE=path/to/test_engine bash scripts/device-gpu-tests.sh
# or, without TESTS/ENGINE, the binaries of .device/bin.tgz (bin/test_kernels, bin/test_engine).
# A case that skips fails (STRATA_REQUIRE_GPU=1 turns a missing device into a failure; with
# REQUIRE_GPU=0, for a dry run without a GPU, the skips are reported and still fail the run).
# Logs under $OUT (default /tmp/gpu-tests). Exits 1 when a group fails or when the groups did not
# run every [gpu] case the binaries list.
DEVICE_OUT_DEFAULT=/tmp/gpu-tests
source scripts/device-lib.sh
if [ -z "${TESTS:-}" ]; then
  rm -rf .device/bin && tar -C .device -xzf .device/bin.tgz || exit 1
  TESTS=$PWD/.device/bin/test_kernels ENGINE=$PWD/.device/bin/test_engine
fi
ENGINE=${ENGINE:?ENGINE= the test_engine binary}
export STRATA_REQUIRE_GPU=${REQUIRE_GPU:-1} STRATA_SHARED_DIR=${STRATA_SHARED_DIR:-$PWD/.device/shared}
mkdir -p "$STRATA_SHARED_DIR" && cp -r ../shared/configs "$STRATA_SHARED_DIR"/ 2>/dev/null
LIMIT=${LIMIT:-300}
rest='[gpu]~"moe gpu*"~"mla gpu*"'
listed=$(( $("$TESTS" --list-test-names-only '[gpu]' | grep -c .) + \
           $("$ENGINE" --list-test-names-only '[gpu]' | grep -c .) ))
run_group() {  # NAME BINARY SPEC: the log $OUT/g_NAME.log ends with "rc=N"
  timeout "$LIMIT" "$2" "$3" > "$OUT/g_$1.log" 2>&1
  echo "rc=$?" >> "$OUT/g_$1.log"
}
run_group moe "$TESTS" 'moe gpu*' &
run_group mla "$TESTS" 'mla gpu*' &
( run_group rest "$TESTS" "$rest"; run_group engine "$ENGINE" '[gpu]' ) &
wait
fail=0 ran=0
for g in moe mla rest engine; do
  rc=$(tail -1 "$OUT/g_$g.log" | sed 's/rc=//')
  n=$(grep -E -o "in [0-9]+ test cases?|test cases: +[0-9]+" "$OUT/g_$g.log" | grep -E -o "[0-9]+" | tail -1)
  ran=$(( ran + ${n:-0} ))
  echo "$g: rc=$rc, ${n:-0} cases — $(grep -E "All tests passed|test cases:" "$OUT/g_$g.log" | tail -1)"
  if [ "$rc" != 0 ] || grep -q "^SKIPPED:" "$OUT/g_$g.log"; then  # a skip is not a pass
    fail=1
    grep -E -B3 -A25 "FAILED|SKIPPED" "$OUT/g_$g.log" | head -60
  fi
done
echo "gpu cases run: $ran of the $listed the binaries list; $(( $(date +%s) - t0 )) s"
[ "$ran" = "$listed" ] || fail=1
exit $fail
