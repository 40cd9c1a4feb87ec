#!/usr/bin/env bash
# Builds what the GPU machine needs to run the cuda package's tests and benchmark, where there is no Go and
# no network: the test binaries (cgo; they dlopen libcuda.so.1 and libnixl_capi.so at run time) and the part
# of the nixl-cu13 wheel they load (libnixl_capi.so and its dependency closure, the UCX plugin, UCX's
# transport modules incl. CUDA), in the wheel's relative layout (the RPATHs are $ORIGIN-relative).
# Output: .gpu/bundle.tgz and .gpu/run.sh (the folder is ignored through .git/info/exclude).
# Usage: scripts/gpu-bundle.sh   (needs .nixl/cu13-<version>, e.g. from `make nixl NIXL_CUDA=13`)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
version=${NIXL_VERSION:-1.5.1}
src="$root/.nixl/cu13-$version"
out="$root/.gpu"
[ -f "$src/.complete" ] || { echo "missing $src: run 'make nixl NIXL_CUDA=13' (then 'make nixl' to point .nixl/current back at cu12)" >&2; exit 1; }
grep -qx '/.gpu/' "$root/.git/info/exclude" 2>/dev/null || echo '/.gpu/' >>"$root/.git/info/exclude"
rm -rf "$out/stage" && mkdir -p "$out/stage/bin" "$out/stage/nixl"

cd "$root"
go test -c -race=false -o "$out/stage/bin/cuda.test" ./cuda
go test -c -race -o "$out/stage/bin/cuda-race.test" ./cuda

# The wheel's files to carry: roots plus their dependency closure inside the wheel (system libraries and
# the driver's libcuda / libnvidia-ml stay on the GPU machine).
cd "$src"
roots=(lib/libnixl_capi.so lib/plugins/libplugin_UCX.so)
for m in nixl_cu13.libs/ucx/*.so.*; do roots+=("$m"); done
{
  printf '%s\n' "${roots[@]}"
  ldd "${roots[@]}" 2>/dev/null | grep -o "$src/[^ ]*" | while read -r p; do realpath --relative-to=. "$p"; done
} | sort -u >"$out/stage/files.txt"
tar cf - -T "$out/stage/files.txt" | tar xf - -C "$out/stage/nixl"
cp "$root/scripts/gpu-run.sh" "$out/run.sh"
tar czf "$out/bundle.tgz" -C "$out/stage" bin nixl
rm -rf "$out/stage"
ls -la "$out"
