#!/usr/bin/env bash
# Builds what the GPU machine (no Go, no network) needs to run gonixl over NIXL's LIBFABRIC backend beside
# UCX: the connector test binary (race detector on), the gonixl CLI (bench, env) and the disaggregated demo;
# the nixl-cu13 wheel's libraries they load (libnixl_capi.so, the UCX and LIBFABRIC plugins and their
# closure inside the wheel, in the wheel's relative layout); and the LIBFABRIC plugin's other libraries
# from scripts/fabric-deps.sh (CUDA 13 runtime from PyPI, hwloc from Debian) plus libfabric from
# LIBFABRIC_DIR (it must define FABRIC_1.10; see fabric-deps.sh). The driver's libcuda.so.1 is the GPU
# machine's own: no stand-in travels.
# Output: $OUT_DIR/bundle.tgz and $OUT_DIR/run.sh (default OUT_DIR: .gpu-fabric, git-ignored through
# .git/info/exclude).
# Usage: LIBFABRIC_DIR=/path/to/libfabric/lib scripts/gpu-fabric-bundle.sh
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
version=${NIXL_VERSION:-1.5.0}
src=$(realpath -m "$root/.nixl/cu13-$version")
out=${OUT_DIR:-$root/.gpu-fabric}
[ -d "$src/lib" ] || { echo "missing $src: run 'make nixl NIXL_CUDA=13' (then 'make nixl' to point .nixl/current back at cu12)" >&2; exit 1; }
: "${LIBFABRIC_DIR:?set LIBFABRIC_DIR to a folder with libfabric.so.1 (FABRIC_1.10, libfabric >= 2.7)}"
stage="$out/stage"
rm -rf "$stage" && mkdir -p "$stage/bin" "$stage/nixl/cu13-$version" "$stage/fabric"

cd "$root"
go test -c -race -o "$stage/bin/connector.test" ./connector
go build -trimpath -ldflags=-s -o "$stage/bin/gonixl" ./cmd/gonixl
go build -trimpath -ldflags=-s -o "$stage/bin/disagg" ./examples/disagg

# The wheel's files: roots plus their dependency closure inside the wheel.
cd "$src"
roots=(lib/libnixl_capi.so lib/plugins/libplugin_UCX.so lib/plugins/libplugin_LIBFABRIC.so)
for m in nixl_cu13.libs/ucx/*.so.*; do roots+=("$m"); done
{
  printf '%s\n' "${roots[@]}"
  { ldd "${roots[@]}" 2>/dev/null || true; } | { grep -o "$src/[^ ]*" || true; } | while read -r p; do realpath --relative-to=. "$p"; done
} | sort -u >"$stage/files.txt"
tar cf - -T "$stage/files.txt" | tar xf - -C "$stage/nixl/cu13-$version"

# The LIBFABRIC plugin's other libraries.
deps=$(NIXL_CUDA=13 "$root/scripts/fabric-deps.sh" | tail -n 1)
depdir=$(echo "$deps" | sed -E 's/^export LD_LIBRARY_PATH=([^$]*).*/\1/' | tr ':' '\n' | grep fabric-deps | head -n 1)
cp -a "$depdir"/libcudart.so* "$depdir"/libhwloc.so.15* "$stage/fabric/"
cp -a "$LIBFABRIC_DIR"/libfabric.so* "$stage/fabric/"
readelf -V "$stage/fabric/libfabric.so.1" | grep -q 'Name: FABRIC_1\.10$' || { echo "$LIBFABRIC_DIR/libfabric.so.1 lacks FABRIC_1.10" >&2; exit 1; }

cp "$root/scripts/gpu-fabric-run.sh" "$out/run.sh"
tar czf "$out/bundle.tgz" -C "$stage" bin nixl fabric
rm -rf "$stage"
ls -la "$out"
