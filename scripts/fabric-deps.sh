#!/usr/bin/env bash
# Provides, in a cache folder outside the repository and without installing anything system-wide, the
# libraries NIXL's LIBFABRIC plugin (nixl-cu12 / nixl-cu13 1.5.1: plugins/libplugin_LIBFABRIC.so) needs
# besides libfabric itself, then prints the LD_LIBRARY_PATH that makes the plugin load. Idempotent.
#
#   libcudart.so.<12|13>  the CUDA runtime of the wheel's major, from its PyPI package (pinned below)
#   libhwloc.so.15        Debian 12's libhwloc15 (apt-get download + dpkg -x, no install)
#   libcuda.so.1          only with --cuda-stub, for hosts without an NVIDIA driver: gonixl's stand-in built
#                         from scripts/cuda-stub.c (every call fails with CUDA_ERROR_STUB_LIBRARY; DRAM only)
#   libfabric.so.1        must define the symbol version FABRIC_1.10, which upstream libfabric introduced on
#                         its main branch in August 2026 (2.7.0a1; no release up to 2.6.0 has it). No package
#                         of a registry reachable here carries such a libfabric (checked: Debian 12/13/sid/
#                         experimental 1.17–2.1.0, PyPI mpich 5.0.2's bundled 2.5.1 = FABRIC_1.9, impi-rt,
#                         mooncake-transfer-engine-efa*, crates.io ofi-libfabric-sys/libfabric-sys), so it is
#                         taken from LIBFABRIC_DIR: on an EFA host the EFA installer's /opt/amazon/efa/lib(64).
#
# Usage: scripts/fabric-deps.sh [--cuda-stub]      (env: NIXL_CUDA=12|13, LIBFABRIC_DIR, FABRIC_DEPS_HOME)
#        eval "$(scripts/fabric-deps.sh --cuda-stub | tail -n 1)"   # exports LD_LIBRARY_PATH
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
case "$cuda" in
  12) cudart_pkg=nvidia-cuda-runtime-cu12==12.9.79 cudart_glob='nvidia/cuda_runtime/lib/libcudart.so.12' ;;
  13) cudart_pkg=nvidia-cuda-runtime==13.0.96 cudart_glob='nvidia/cu13/lib/libcudart.so.13' ;;
  *) echo "NIXL_CUDA must be 12 or 13" >&2; exit 2 ;;
esac
hwloc_deb=libhwloc15
home=${FABRIC_DEPS_HOME:-$HOME/.cache/gonixl/fabric-deps-cu$cuda}
lib="$home/lib"
mkdir -p "$lib" "$home/dl"
python=${PYTHON:-python3}

# CUDA runtime from PyPI (the wheel's major).
if [ ! -e "$lib/libcudart.so.$cuda" ]; then
  "$python" -m pip download -q --disable-pip-version-check --no-deps --only-binary=:all: \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 -d "$home/dl/cudart" "$cudart_pkg" >&2
  whl=$(ls "$home"/dl/cudart/*.whl | head -n 1)
  unzip -p "$whl" "$cudart_glob" >"$lib/libcudart.so.$cuda.tmp"
  mv "$lib/libcudart.so.$cuda.tmp" "$lib/libcudart.so.$cuda"
fi
# libfabric's CUDA support (FI_HMEM) dlopens the unversioned name.
ln -sfn "libcudart.so.$cuda" "$lib/libcudart.so"

# hwloc from Debian (no install: the package is only unpacked here).
if [ ! -e "$lib/libhwloc.so.15" ]; then
  rm -rf "$home/dl/hwloc" && mkdir -p "$home/dl/hwloc"
  (cd "$home/dl/hwloc" && apt-get download "$hwloc_deb" >&2) || {
    echo "apt-get download $hwloc_deb failed (run 'apt-get update' first?)" >&2; exit 1; }
  dpkg -x "$home"/dl/hwloc/*.deb "$home/dl/hwloc/root"
  cp -a "$home"/dl/hwloc/root/usr/lib/x86_64-linux-gnu/libhwloc.so.15* "$lib/"
fi

# libcuda.so.1: the driver's. Only a stand-in on hosts that have none.
if [ "$stub" = 1 ]; then
  if [ ! -e "$lib/libcuda.so.1" ] || [ "$root/scripts/cuda-stub.c" -nt "$lib/libcuda.so.1" ]; then
    ${CC:-gcc} -shared -fPIC -O2 -Wl,-soname,libcuda.so.1 -o "$lib/libcuda.so.1" "$root/scripts/cuda-stub.c"
  fi
else
  rm -f "$lib/libcuda.so.1"
fi

# libfabric: from LIBFABRIC_DIR, and only if it defines FABRIC_1.10.
path="$lib"
if [ -n "${LIBFABRIC_DIR:-}" ]; then
  lf="$LIBFABRIC_DIR/libfabric.so.1"
  [ -e "$lf" ] || { echo "$lf: no such file" >&2; exit 1; }
  if ! readelf -V "$lf" | grep -q 'Name: FABRIC_1\.10$'; then
    echo "$lf does not define FABRIC_1.10 (it has up to $(readelf -V "$lf" | grep -o 'FABRIC_1\.[0-9]*' | sort -uV | tail -n 1)); NIXL 1.5.1's plugin needs libfabric >= 2.7" >&2
    exit 1
  fi
  path="$LIBFABRIC_DIR:$path"
else
  echo "note: no LIBFABRIC_DIR; the plugin also needs libfabric.so.1 with FABRIC_1.10 (libfabric >= 2.7; EFA installer: /opt/amazon/efa/lib or lib64)" >&2
fi
ls -l "$lib" >&2
echo "export LD_LIBRARY_PATH=$path\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}"
