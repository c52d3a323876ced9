#!/usr/bin/env bash
# Proves that the README's first steps work on a minimal Debian 12 (bookworm) machine with nothing
# installed: builds a minbase root with debootstrap from the Debian mirror this machine's apt uses,
# copies the repository into it (the committed HEAD, as a fresh clone would have it) and, inside a
# chroot, runs scripts/install-deps.sh and then the README's commands up to the level asked for:
#   configure  install-deps.sh, then CMake configure as scripts/demo.sh does it (CPU build: no CUDA)
#   build      ... and build the strata binary (default; what CI runs)
#   demo       ... and the rest of `scripts/demo.sh "The quick brown fox"` (synth k3-mini, run)
#   test       ... and `scripts/test.sh` (the README's second command; ../shared is absent there
#              unless --shared lays it beside the copy, so the cases that need it skip)
# It also lists the recommends of installed packages that are not installed (install-deps.sh
# installs without them), so a package that only a recommend pulled in on a developer's machine
# shows up here.
# With --ci (what .ci/run passes) it also runs `install-deps.sh --ci`, the packages of CI's
# sanitizer and fuzz stages, and proves with three small programs that they suffice there: clang
# builds and runs an ASan + UBSan program, its ASan report names file and line (llvm-symbolizer),
# and a libFuzzer target links and runs. (The stages themselves run outside, in .ci/run.)
# CUDA is not a Debian package: without --cuda the root has none and builds the CPU engine only.
# Not here: GPU tests, anything else outside the Debian archive.
#
# CI (.ci/run) runs `--ci --level test --cuda --shared ../shared`: its one normal build and test
# run are the README's two commands on this fresh root, so a package that only CI's own machine
# has cannot hide there, and nothing is compiled twice.
#
# Usage: sudo scripts/check-fresh.sh [--level configure|build|demo|test] [--ci] [--cuda]
#                                    [--shared DIR] [--worktree] [--keep]
#   --cuda       mount this machine's CUDA toolkit (/usr/local/cuda, read-only) at the same path in
#                the root — a fresh Debian 12 on which the user installed NVIDIA's toolkit, as the
#                README's GPU build expects — so the build compiles the kernels too
#   --shared DIR mount DIR (read-only) beside the copy, where ../shared is for a checkout, and pass
#                STRATA_REQUIRE_SHARED from the environment into the chroot
#   --worktree   copy the working tree (tracked and untracked, not ignored) instead of HEAD
#   --keep       leave the root in place afterwards (its path is printed)
# Environment: STRATA_FRESH_MIRROR (default: the bookworm main URI of /etc/apt/sources.list*),
#   STRATA_FRESH_CACHE (directory for a tarball of the bare root, reused by later runs;
#   default /var/cache/strata-fresh; empty: no cache), STRATA_FRESH_TMP (where the root is built;
#   default /var/tmp).
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
args=("$@")
level=build
worktree=0
keep=0
ci=0
cuda=0
cuda_mounted=0
shared=""
while (($#)); do
  case "$1" in
    --cuda) cuda=1; shift ;;
    --shared) shared=${2:?--shared needs a directory}; shift 2 ;;
    --shared=*) shared=${1#--shared=}; shift ;;
    --level) level=${2:?--level needs configure, build, demo or test}; shift 2 ;;
    --level=*) level=${1#--level=}; shift ;;
    --ci) ci=1; shift ;;
    --worktree) worktree=1; shift ;;
    --keep) keep=1; shift ;;
    -h | --help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "check-fresh: unknown argument '$1' (see --help)" >&2; exit 1 ;;
  esac
done
case "$level" in
  configure | build | demo | test) ;;
  *) echo "check-fresh: --level must be configure, build, demo or test, not '$level'" >&2; exit 1 ;;
esac
if [ -n "$shared" ]; then
  [ -d "$shared" ] || { echo "check-fresh: --shared $shared is not a directory" >&2; exit 1; }
  shared=$(cd "$shared" && pwd)
fi

if [ "$(id -u)" -ne 0 ]; then
  if command -v sudo >/dev/null && sudo -n true 2>/dev/null; then
    exec sudo -n --preserve-env=STRATA_FRESH_MIRROR,STRATA_FRESH_CACHE,STRATA_FRESH_TMP,STRATA_REQUIRE_SHARED \
      "$0" "${args[@]}"
  fi
  echo "check-fresh: must run as root (debootstrap, mount and chroot need it): sudo $0" >&2
  exit 1
fi

t_start=$(date +%s)
say() { echo "check-fresh: [$(($(date +%s) - t_start)) s] $*"; }

# The Debian mirror apt uses here: the first URI serving bookworm's main component, from either
# sources format (one-line .list or deb822 .sources); deb.debian.org if none is found.
find_mirror() {
  local f
  for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
    [ -f "$f" ] || continue
    awk '$1 == "deb" { i = 2; if ($i ~ /^\[/) { while (i < NF && $i !~ /\]$/) i++; i++ }
                       if ($(i + 1) == "bookworm") { print $i; exit } }' "$f"
  done | head -1 | grep . && return
  for f in /etc/apt/sources.list.d/*.sources; do
    [ -f "$f" ] || continue
    # deb822: stanzas separated by blank lines; take URIs of a stanza whose Suites has bookworm.
    awk 'BEGIN { RS = ""; FS = "\n" }
         { uri = ""; suite = 0; deb = 0
           for (i = 1; i <= NF; i++) {
             if ($i ~ /^URIs:/) { split($i, a, /[ \t]+/); uri = a[2] }
             if ($i ~ /^Suites:/ && $i ~ /[ \t]bookworm([ \t]|$)/) suite = 1
             if ($i ~ /^Types:/ && $i ~ /[ \t]deb([ \t]|$)/) deb = 1 }
           if (uri != "" && suite && deb) { print uri; exit } }' "$f"
  done | head -1 | grep . && return
  echo http://deb.debian.org/debian
}
mirror=${STRATA_FRESH_MIRROR:-$(find_mirror)}
cache=${STRATA_FRESH_CACHE-/var/cache/strata-fresh}
arch=$(dpkg --print-architecture 2>/dev/null || echo amd64)
tarball=${cache:+$cache/bookworm-minbase-$arch.tar}

if ! command -v debootstrap >/dev/null; then
  say "installing debootstrap"
  export DEBIAN_FRONTEND=noninteractive
  apt-get install -y -qq --no-install-recommends debootstrap >/dev/null 2>&1 ||
    { apt-get update -qq && apt-get install -y -qq --no-install-recommends debootstrap >/dev/null; }
fi

work=$(mktemp -d "${STRATA_FRESH_TMP:-/var/tmp}/strata-fresh.XXXXXX")
root=$work/root
mounts=()
# Unmounts in reverse order; the root is removed only when nothing is mounted below it any more
# (a bind mount of /dev that is still in place must never meet rm -rf).
cleanup() {
  local rc=$?
  local i
  # Whatever still runs inside the root (the check was interrupted) goes first: its files are
  # about to be removed.
  local pr
  for pr in /proc/[0-9]*; do
    [ "$(readlink "$pr/root" 2>/dev/null)" = "$root" ] && kill -9 "${pr#/proc/}" 2>/dev/null || true
  done
  for ((i = ${#mounts[@]} - 1; i >= 0; i--)); do
    umount "${mounts[i]}" 2>/dev/null || umount -l "${mounts[i]}" 2>/dev/null || true
  done
  if awk -v r="$root/" 'index($2 "/", r) == 1 { found = 1 } END { exit !found }' /proc/mounts; then
    echo "check-fresh: something is still mounted under $root; leaving $work in place" >&2
  elif ((keep)); then
    echo "check-fresh: root kept at $root"
  else
    rm -rf --one-file-system "$work"
  fi
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# 1. A minimal Debian 12 root: restored from the cache, or made by debootstrap (then cached).
mkdir -p "$root"
if [ -n "$tarball" ] && [ -s "$tarball" ]; then
  say "restoring the bare bookworm root from $tarball (delete it to rebuild from $mirror)"
  tar -xpf "$tarball" -C "$root"
else
  say "debootstrap --variant=minbase bookworm from $mirror"
  if ! debootstrap --variant=minbase --arch="$arch" bookworm "$root" "$mirror" \
    >"$work/debootstrap.log" 2>&1; then
    tail -20 "$work/debootstrap.log" >&2
    echo "check-fresh: debootstrap failed (log above; mirror $mirror)" >&2
    exit 1
  fi
  if [ -n "$tarball" ]; then
    mkdir -p "$cache"
    tar -cpf "$tarball.$$.partial" -C "$root" . && mv "$tarball.$$.partial" "$tarball"
    say "cached the bare root as $tarball"
  fi
fi

# 2. The repository, as a fresh clone has it (or the working tree with --worktree).
mkdir -p "$root/root/strata"
if ((worktree)); then
  say "copying the working tree of $repo"
  (cd "$repo" && git ls-files -z --cached --others --exclude-standard |
    tar --null -T - --ignore-failed-read -cf - 2>/dev/null) | tar -xf - -C "$root/root/strata"
else
  say "copying HEAD ($(git -C "$repo" rev-parse --short HEAD)) of $repo"
  [ -z "$(git -C "$repo" status --porcelain --untracked-files=no)" ] ||
    say "note: uncommitted changes are not part of this check (--worktree includes them)"
  git -C "$repo" archive --format=tar HEAD | tar -xf - -C "$root/root/strata"
fi

# 3. What the chroot needs from the host: processes, devices, name resolution.
mount_in_root() {  # mount ARGS... TARGET; TARGET is unmounted on exit
  mount "$@" || { echo "check-fresh: mount $* failed" >&2; exit 1; }
  mounts+=("${@: -1}")
}
mount_in_root -t proc proc "$root/proc"
mount_in_root --bind /dev "$root/dev"
[ -d /dev/pts ] && mount_in_root --bind /dev/pts "$root/dev/pts"
# hwloc (the topology cases, the engine's placement) reads the machine from /sys.
mount_in_root -t sysfs sysfs "$root/sys"
cp -L /etc/resolv.conf "$root/etc/resolv.conf" 2>/dev/null || true
if ((cuda)); then
  if [ -x /usr/local/cuda/bin/nvcc ]; then
    mkdir -p "$root/usr/local/cuda"
    mount_in_root --bind "$(readlink -f /usr/local/cuda)" "$root/usr/local/cuda"
    mount -o remount,bind,ro "$root/usr/local/cuda"
    cuda_mounted=1
    say "CUDA toolkit mounted read-only at /usr/local/cuda ($(/usr/local/cuda/bin/nvcc --version | tail -1))"
  else
    say "note: --cuda, but no CUDA toolkit at /usr/local/cuda here: the root builds the CPU engine only"
  fi
fi
if [ -n "$shared" ]; then
  mkdir -p "$root/root/shared"
  mount_in_root --bind "$shared" "$root/root/shared"
  mount -o remount,bind,ro "$root/root/shared"
  say "$shared mounted read-only at /root/shared (../shared of the copy)"
fi
# The host's apt settings for reaching this mirror (a proxy; Check-Valid-Until off for a mirror
# serving a snapshot).
for f in /etc/apt/apt.conf.d/*; do
  if grep -qs 'Check-Valid-Until\|Check-Date\|Proxy' "$f"; then cp "$f" "$root/etc/apt/apt.conf.d/"; fi
done

# 4. The README's commands, as a new user on that machine runs them (root, so no sudo).
cat >"$root/root/check.sh" <<'EOF'
set -euo pipefail
cd /root/strata
t0=$(date +%s)
step() { echo "check-fresh (chroot): [$(($(date +%s) - t0)) s] $*"; }
step "scripts/install-deps.sh (apt's output: /root/install-deps.log, shown if it fails)"
if ! scripts/install-deps.sh >/root/install-deps.log 2>&1; then
  tail -40 /root/install-deps.log
  echo "check-fresh: scripts/install-deps.sh failed on a minimal Debian 12" >&2
  exit 1
fi
grep '^install-deps:' /root/install-deps.log
if [ "$CI_EXTRAS" = 1 ]; then
  step "scripts/install-deps.sh --ci (apt's output: /root/install-deps-ci.log, shown if it fails)"
  if ! scripts/install-deps.sh --ci >/root/install-deps-ci.log 2>&1; then
    tail -40 /root/install-deps-ci.log
    echo "check-fresh: scripts/install-deps.sh --ci failed on a minimal Debian 12" >&2
    exit 1
  fi
  grep '^install-deps:' /root/install-deps-ci.log
  step "clang: an ASan + UBSan program, a symbolized ASan report, a libFuzzer target"
  tc=/root/toolchain-check
  mkdir -p "$tc"
  printf '#include <vector>\nint main() { std::vector<int> v(4, 1); return v[3] - 1; }\n' >"$tc/ok.cpp"
  clang++ -std=c++20 -O1 -fsanitize=address,undefined -fno-sanitize-recover=undefined \
    "$tc/ok.cpp" -o "$tc/ok"
  "$tc/ok"
  printf '#include <cstdlib>\nint main() {\n  volatile char* p = (char*)std::malloc(4);\n  return p[4];\n}\n' >"$tc/bad.cpp"
  clang++ -g -O1 -fsanitize=address "$tc/bad.cpp" -o "$tc/bad"
  if "$tc/bad" 2>"$tc/bad.log" || ! grep -q 'bad.cpp:4' "$tc/bad.log"; then
    cat "$tc/bad.log"
    echo "check-fresh: the ASan report does not name bad.cpp:4 (llvm-symbolizer missing?)" >&2
    exit 1
  fi
  printf '#include <cstddef>\n#include <cstdint>\nextern "C" int LLVMFuzzerTestOneInput(const uint8_t*, size_t) { return 0; }\n' >"$tc/fuzz.cpp"
  clang++ -O1 -fsanitize=fuzzer,address,undefined "$tc/fuzz.cpp" -o "$tc/fuzz"
  "$tc/fuzz" -runs=1000 2>"$tc/fuzz.log" || { cat "$tc/fuzz.log"; exit 1; }
fi
# Recommends of installed packages that are not installed (install-deps.sh installs without
# recommends): what a developer's machine may have that a fresh one lacks.
step "recommended by an installed package but not installed:"
dpkg-query -W -f='${db:Status-Abbrev}\t${Package}\t${Provides}\t${Recommends}\n' | awk -F'\t' '
  $1 ~ /^ii/ { have[$2] = 1; n = split($3, p, /, */); for (i = 1; i <= n; i++) { sub(/ .*/, "", p[i]); have[p[i]] = 1 }
               rec[$2] = $4 }
  END { for (pkg in rec) { n = split(rec[pkg], g, /, */)
          for (i = 1; i <= n; i++) { m = split(g[i], alt, / *\| */); ok = 0
            for (j = 1; j <= m; j++) { a = alt[j]; sub(/ *\(.*/, "", a); sub(/:any$/, "", a); if (a in have) ok = 1 }
            if (!ok && g[i] != "") print "    " g[i] " (recommended by " pkg ")" } } }' | sort
step "cmake configure (as scripts/demo.sh does it)"
export PATH="/usr/local/cuda/bin:$PATH"  # as demo.sh and test.sh: nvcc, where --cuda mounts it
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release
if grep -q "^CMAKE_CUDA_COMPILER:.*nvcc" build/CMakeCache.txt; then
  step "CUDA found: the kernels are built too"
elif [ "$CUDA_MOUNTED" = 1 ]; then
  grep -A8 "Looking for a CUDA compiler" build/CMakeFiles/CMakeOutput.log 2>/dev/null | head -20 || true
  echo "check-fresh: --cuda mounted the toolkit, but CMake did not find nvcc in the root" >&2
  exit 1
else
  step "no CUDA here: the CPU engine only"
fi
if [ "$LEVEL" = configure ]; then step "done"; exit 0; fi
step "cmake --build build --target strata"
cmake --build build -j "$(nproc)" --target strata
build/strata --help >/dev/null
if [ "$LEVEL" = build ]; then step "done"; exit 0; fi
step "scripts/demo.sh \"The quick brown fox\""
scripts/demo.sh "The quick brown fox"
if [ "$LEVEL" = demo ]; then step "done"; exit 0; fi
step "scripts/test.sh"
scripts/test.sh
step "done"
EOF
say "running the README's commands in the chroot (level: $level)"
chroot "$root" /usr/bin/env -i HOME=/root TERM=dumb LANG=C.UTF-8 DEBIAN_FRONTEND=noninteractive \
  LEVEL="$level" CI_EXTRAS="$ci" CUDA_MOUNTED="$cuda_mounted" STRATA_REQUIRE_SHARED="${STRATA_REQUIRE_SHARED:-}" PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin /bin/bash /root/check.sh
say "passed: a minimal Debian 12 root ran install-deps.sh$( ((ci)) && echo " (and --ci)") and the README's commands to '$level'"
