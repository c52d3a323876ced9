#!/usr/bin/env bash
# Installs everything strata needs to build and test on Debian 12 (bookworm). Used by the README
# and by .ci/run. CUDA (nvcc, cuBLASLt, NCCL) is taken from /usr/local/cuda when present; without
# it the CPU build is complete and the CUDA kernels are skipped.
set -euo pipefail
# ocl-icd-opencl-dev: oneDNN's CMake package (dnnl-config.cmake) calls find_package(OpenCL REQUIRED),
# and libdnnl-dev only recommends the OpenCL headers (we install without recommends).
# libopenmpi-dev + openmpi-bin: `strata batch` under mpirun (optional at build time, tested in CI).
pkgs=(build-essential cmake pkg-config ninja-build git
      liburing-dev libhwloc-dev libtbb-dev libdnnl-dev ocl-icd-opencl-dev catch2
      nlohmann-json3-dev libcli11-dev libpcre2-dev libxxhash-dev
      libopenmpi-dev openmpi-bin)
# --ci (.ci/run, scripts/ci-sanitize.sh, scripts/ci-fuzz.sh): clang for the sanitizer and fuzz
# builds, its libFuzzer/sanitizer runtimes (libclang-rt-14-dev) and llvm-symbolizer (llvm-14) so
# sanitizer reports name files and lines: clang's packages only recommend those two.
# --fuzz: the former name of --ci.
case "${1:-}" in
  "") ;;
  --ci | --fuzz) pkgs+=(clang libclang-rt-14-dev llvm-14) ;;
  *) echo "install-deps: unknown argument '$1' (expected nothing or --ci)" >&2; exit 1 ;;
esac
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  sudo_cmd=""
  [ "$(id -u)" -ne 0 ] && sudo_cmd="sudo"
  echo "install-deps: installing ${missing[*]}"
  $sudo_cmd apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq --no-install-recommends "${missing[@]}"
else
  echo "install-deps: all Debian packages present"
fi
if [ -x /usr/local/cuda/bin/nvcc ]; then
  echo "install-deps: CUDA found: $(/usr/local/cuda/bin/nvcc --version | tail -1)"
else
  echo "install-deps: no CUDA at /usr/local/cuda — building the CPU engine only"
fi
