#!/usr/bin/env bash
# Runs on the GPU machine (no Go there), from the repository root, after scripts/gpu-bundle.sh built
# .gpu/bundle.tgz here: unpacks it, runs the cuda package's tests (race-enabled binary) and its benchmark,
# and writes logs to $OUT. BENCH_COUNT / BENCH_TIME tune the benchmark.
set -uo pipefail
out=${OUT:-/tmp/out}
mkdir -p "$out"
b=/tmp/gonixl-gpu
rm -rf "$b" && mkdir -p "$b" && tar xzf .gpu/bundle.tgz -C "$b"
export NIXL_LIB_DIR="$b/nixl/lib" GONIXL_REQUIRE_GPU=1
# UCX's CUDA memory hooks (libucm_cuda) need the CUDA runtime; use the one the image has.
cudart=$(find /usr/local/cuda*/ /usr/lib /opt -name 'libcudart.so.13*' 2>/dev/null | head -n 1)
[ -n "$cudart" ] && export LD_LIBRARY_PATH="$(dirname "$cudart")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
{
  echo "== host"; uname -a; ldd --version | head -n 1
  nvidia-smi --query-gpu=name,uuid,pci.bus_id,memory.total,compute_cap,driver_version --format=csv
  echo "cudart: ${cudart:-none}"
  echo "== ldd of UCX's CUDA modules"
  ldd "$b"/nixl/nixl_cu13.libs/ucx/libuct_cuda.so.* "$b"/nixl/nixl_cu13.libs/ucx/libucm_cuda.so.* | grep -E 'not found|cuda|nvidia'
} >"$out/env.log" 2>&1
cat "$out/env.log"

cd "$b/bin"
echo "== tests (race detector on)"
timeout 300 ./cuda-race.test -test.v -test.count=1 -test.timeout 280s 2>&1 | tee "$out/test.log"
rc=${PIPESTATUS[0]}
if ! grep -q -- '--- PASS: TestNIXLTransferIntoVRAM' "$out/test.log"; then
  echo "== NIXL test again with UCX/NIXL debug logs"
  UCX_LOG_LEVEL=info NIXL_LOG_LEVEL=DEBUG timeout 90 ./cuda.test -test.v -test.run NIXL -test.timeout 80s >"$out/nixl-debug.log" 2>&1
  tail -n 80 "$out/nixl-debug.log"
fi
echo "== benchmark"
timeout 200 ./cuda.test -test.run '^$' -test.bench . -test.benchtime "${BENCH_TIME:-20x}" -test.count "${BENCH_COUNT:-3}" -test.timeout 190s 2>&1 | tee "$out/bench.log"
exit "$rc"
