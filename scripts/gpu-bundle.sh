#!/usr/bin/env bash
# Builds what the GPU machine needs to run the cuda and nixl packages' tests and benchmarks and the disagg
# demo, where there is no Go and no network: the test binaries and the demo (cgo; they dlopen libcuda.so.1
# and libnixl_capi.so at run time) and the part of the nixl-cu13 wheel they load (libnixl_capi.so and its
# dependency closure, the UCX plugin, UCX's transport modules incl. CUDA), in the wheel's relative layout
# (the RPATHs are $ORIGIN-relative).
# Output: $GPU_BUNDLE_DIR/bundle.tgz and $GPU_BUNDLE_DIR/run.sh (default folder .gpu, ignored through
# .git/info/exclude of the repository it lies in).
# Usage: [GPU_BUNDLE_DIR=/path] scripts/gpu-bundle.sh   (needs .nixl/cu13-<version>: `make nixl NIXL_CUDA=13`,
# then `make nixl` to point .nixl/current back at cu12)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
version=${NIXL_VERSION:-1.5.0}
src=$(cd "$root/.nixl/cu13-$version" 2>/dev/null && pwd -P || true)
out=${GPU_BUNDLE_DIR:-$root/.gpu}
[ -n "$src" ] && [ -f "$src/.complete" ] || { echo "missing $root/.nixl/cu13-$version: run 'make nixl NIXL_CUDA=13' (then 'make nixl' to point .nixl/current back at cu12)" >&2; exit 1; }
if [ -z "${GPU_BUNDLE_DIR:-}" ]; then
  grep -qx '/.gpu/' "$root/.git/info/exclude" 2>/dev/null || echo '/.gpu/' >>"$root/.git/info/exclude"
fi
mkdir -p "$out"
out=$(cd "$out" && pwd)
rm -rf "$out/stage" && mkdir -p "$out/stage/bin" "$out/stage/nixl"

cd "$root"
go test -c -race=false -o "$out/stage/bin/cuda.test" ./cuda
go test -c -race -o "$out/stage/bin/cuda-race.test" ./cuda
go test -c -race=false -o "$out/stage/bin/nixl.test" ./nixl
go build -o "$out/stage/bin/disagg" ./examples/disagg
# What was built: scripts/gpu-perreq.sh names it in its host.log (internal/measured's source line).
echo "$(git describe --always --dirty --abbrev=7) ($(git log -1 --format=%cs))" >"$out/stage/bin/REVISION"

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
