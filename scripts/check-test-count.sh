#!/usr/bin/env bash
# Checks that ctest runs exactly the test cases the test binaries hold: one ctest test per Catch2
# case, with the same name. Catch2 v2's catch_discover_tests cuts a case name at ';' (CMake's list
# separator) into two ctest tests that match no case, and such tests used to pass without running
# anything; names starting with '#', '~' or a space, or containing '\' or '*', break the test spec
# ctest hands back to the binary in the same way. So: every name must avoid those characters, and
# the sorted list of "folder:case" names from `test_<folder> --list-test-names-only` must equal
# ctest's list. It also refuses the pattern that made cases pass without running: a WARN followed
# by `return;` (Catch2 counts such a case as passed; STRATA_SKIP from tests/skip.h reports it as
# skipped). Usage: scripts/check-test-count.sh [build-dir]   (after a build)
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
export LC_ALL=C
[ -f "$build/CTestTestfile.cmake" ] || { echo "check-test-count: $build is not a configured build directory" >&2; exit 1; }

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
bad=0
bins=0
for bin in "$build"/test_*; do
  [ -f "$bin" ] && [ -x "$bin" ] || continue
  bins=$((bins + 1))
  folder=${bin##*/test_}
  # --list-test-names-only exits with the number of cases listed, so the status is not an error.
  "$bin" --list-test-names-only > "$tmp/names" 2> "$tmp/err" || true
  if [ ! -s "$tmp/names" ]; then
    echo "check-test-count: $bin listed no test cases: $(head -c 500 "$tmp/err")" >&2
    bad=1
    continue
  fi
  while IFS= read -r name; do
    why=""
    case "$name" in
      *';'*) why="contains ';'" ;;
      *'\'*) why="contains '\\'" ;;
      *'*'*) why="contains '*'" ;;
      '#'* | '~'*) why="starts with '${name:0:1}'" ;;
      ' '* | *' ') why="starts or ends with a space" ;;
      '') why="is empty" ;;
    esac
    if [ -n "$why" ]; then
      echo "check-test-count: test case \"$name\" ($bin) $why: catch_discover_tests cannot run it as one ctest test; rename the case" >&2
      bad=1
    fi
    printf '%s:%s\n' "$folder" "$name" >> "$tmp/binaries"
  done < "$tmp/names"
done
if [ "$bins" -eq 0 ]; then
  echo "check-test-count: no test binaries (test_*) in $build; build first" >&2
  exit 1
fi

# ctest names are TEST_PREFIX "folder: " + the case name; CMake drops the prefix's space.
# A case (or a void helper) that WARNs and returns: passed in ctest although it did not run.
find tests -name '*.cpp' -print0 | xargs -0 awk '
  FNR == 1 { warn = 0 }
  /WARN\(/ { warn = FNR }
  /^[ \t]*return;/ && warn && FNR - warn <= 4 {
    print "check-test-count: " FILENAME ":" FNR ": returns after the WARN of line " warn \
          ": a case that cannot run must end with STRATA_SKIP (tests/skip.h), never pass" }' \
  > "$tmp/early"
if [ -s "$tmp/early" ]; then
  cat "$tmp/early" >&2
  bad=1
fi

ctest --test-dir "$build" -N | sed -n 's/^ *Test *#[0-9]*: //p' | sed 's/^\([a-z_]*\): /\1:/' > "$tmp/ctest"
sort -o "$tmp/binaries" "$tmp/binaries"
sort -o "$tmp/ctest" "$tmp/ctest"
nb=$(wc -l < "$tmp/binaries")
nc=$(wc -l < "$tmp/ctest")
if ! cmp -s "$tmp/binaries" "$tmp/ctest"; then
  echo "check-test-count: ctest has $nc tests but the $bins test binaries list $nb cases:" >&2
  comm -23 "$tmp/binaries" "$tmp/ctest" | sed 's/^/  case that ctest does not run: /' >&2
  comm -13 "$tmp/binaries" "$tmp/ctest" | sed 's/^/  ctest test that is no case: /' >&2
  bad=1
fi
if [ "$bad" -ne 0 ]; then
  echo "check-test-count: FAILED" >&2
  exit 1
fi
echo "check-test-count: ctest runs all $nc test cases of $bins test binaries, one test each"
