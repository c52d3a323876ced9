#!/bin/bash
# Disassemble one of our .cu files to SASS on a machine without cuobjdump (the dev VM has nvcc 13
# but no disassembler). Usage: scripts/sass.sh kernels/moe/gemv.cu > gemv.sass
#
# How: Debian's non-free nvidia-cuda-toolkit (11.8) carries nvdisasm. The package is fetched once
# into ~/.cache/strata-nvdisasm (apt-get download, ~84 MB; nothing is installed). CUDA 13 writes a
# newer cubin header (ELF OS/ABI 0x41, ABI version 8, new e_flags layout) that nvdisasm 11.8
# rejects, so the copy it reads gets the old header for sm_90 (OS/ABI 0x33, ABI 7, e_flags
# 0x5a055a). The instruction stream is unchanged: the decode GEMV's SASS read this way matched the
# H200's (ncu's source view of the same build) instruction for instruction where compared.
set -euo pipefail
src=${1:?usage: scripts/sass.sh file.cu}
root=$(cd "$(dirname "$0")/.." && pwd)
cache=${XDG_CACHE_HOME:-$HOME/.cache}/strata-nvdisasm
nvd=$cache/x/usr/bin/nvdisasm
if [ ! -x "$nvd" ]; then
  mkdir -p "$cache"
  list=$cache/nonfree.sources
  printf 'Types: deb\nURIs: http://deb.debian.org/debian\nSuites: bookworm\nComponents: non-free\nSigned-By: /usr/share/keyrings/debian-archive-keyring.gpg\n' >"$list"
  opts=(-o "Dir::Etc::SourceList=$list" -o Dir::Etc::SourceParts=- -o "Dir::State::Lists=$cache/lists"
        -o "Dir::Cache=$cache/apt")
  mkdir -p "$cache/lists/partial" "$cache/apt/archives/partial"
  apt-get "${opts[@]}" update -qq >&2
  (cd "$cache" && apt-get "${opts[@]}" download nvidia-cuda-toolkit >&2)
  dpkg -x "$cache"/nvidia-cuda-toolkit_*.deb "$cache/x"
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
nvcc -O3 -arch=sm_90a --expt-relaxed-constexpr -std=c++17 -DSTRATA_HAVE_CUDA=1 -I"$root" \
  -cubin -o "$tmp/k.cubin" "$src"
python3 - "$tmp/k.cubin" <<'PY'
import struct, sys
p = sys.argv[1]
b = bytearray(open(p, 'rb').read())
b[7], b[8] = 0x33, 7
struct.pack_into('<I', b, 48, 0x5a055a)
open(p, 'wb').write(b)
PY
"$nvd" -c "$tmp/k.cubin"
