#!/usr/bin/env bash
# CI: fuzzes the parsers of untrusted files (tests/fuzz: config.json, safetensors headers, the
# shard index, the tokenizer files and text, routing-replay files, batch request lines). Builds
# the libFuzzer targets with Debian's clang (`scripts/install-deps.sh --ci`) under ASan + UBSan,
# writes seed corpora from real files (../shared and a synthetic k3-tiny), and runs each target
# for FUZZ_SECONDS (-max_total_time; default 25 s, 6 targets, so the whole script stays within
# 5 minutes of CI with the build). Each run starts by replaying the target's kept regression
# inputs (tests/fuzz/regressions/<target>/, given to libFuzzer as a corpus). Any finding — a crash,
# a sanitizer report, a timeout, an exception other than strata::Error — fails the script; its
# input is left in BUILD/findings/<target>/: fix the bug and keep the input under
# tests/fuzz/regressions/<target>/ (ctest replays those in every build, the sanitized one too).
# Usage: scripts/ci-fuzz.sh [build-dir]   (default build-fuzz)
set -euo pipefail
cd "$(dirname "$0")/.."
start=$(date +%s)
build=${1:-build-fuzz}
secs=${FUZZ_SECONDS:-25}
targets=(config safetensors index tokenizer routing batch)
scripts/install-deps.sh --ci
launcher=()
command -v ccache >/dev/null && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_C_COMPILER_LAUNCHER=ccache)
CC=clang CXX=clang++ cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DSTRATA_FUZZ=ON -DSTRATA_CUDA=OFF "${launcher[@]}" >/dev/null
cmake --build "$build" -j "$(nproc)" --target fuzz_seeds "${targets[@]/#/fuzz_}"
built=$(date +%s)
shared=../shared
[ -d "$shared" ] || shared=""
rm -rf "$build/seeds"
"$build/tests/fuzz/fuzz_seeds" "$build/seeds" $shared
status=0
for t in "${targets[@]}"; do
  mkdir -p "$build/corpus/$t" "$build/findings/$t"
  # -timeout: one input slower than 10 s is a finding (a hang); -rss_limit_mb: so is 2 GB.
  if ! "$build/tests/fuzz/fuzz_$t" -max_total_time="$secs" -timeout=10 -rss_limit_mb=2048 \
      -print_final_stats=1 -artifact_prefix="$build/findings/$t/" \
      "$build/corpus/$t" "$build/seeds/$t" "tests/fuzz/regressions/$t" \
      >"$build/fuzz_$t.log" 2>&1; then
    echo "ci-fuzz: fuzz_$t found a problem (input in $build/findings/$t/):"
    tail -40 "$build/fuzz_$t.log"
    status=1
  fi
  execs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$build/fuzz_$t.log" | grep -o '[0-9]*$' || echo '?')
  cov=$(grep -o 'cov: [0-9]*' "$build/fuzz_$t.log" | tail -1 || true)
  echo "ci-fuzz: fuzz_$t: $execs inputs in ${secs} s, $cov"
done
end=$(date +%s)
echo "ci-fuzz: build $((built - start)) s, fuzzing $((end - built)) s, total $((end - start)) s" \
  "(load average $(cut -d' ' -f1-3 /proc/loadavg))"
exit $status
