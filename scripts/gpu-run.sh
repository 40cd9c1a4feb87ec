#!/usr/bin/env bash
# Runs on the GPU machine (no Go there), from the repository root, after scripts/gpu-bundle.sh built
# $GPU_BUNDLE/bundle.tgz (default .gpu): unpacks it, runs the cuda package's tests (race-enabled binary), the
# benchmarks (DRAM→VRAM and DRAM→DRAM, each with its DRAM agent in a separate process) and the disagg demo
# with its decode cache in GPU memory, and writes logs to $OUT. BENCH_COUNT / BENCH_TIME tune the benchmarks.
set -uo pipefail
out=${OUT:-/tmp/out}
bundle=${GPU_BUNDLE:-.gpu}
mkdir -p "$out"
b=/tmp/gonixl-gpu
rm -rf "$b" && mkdir -p "$b" && tar xzf "$bundle/bundle.tgz" -C "$b"
export NIXL_LIB_DIR="$b/nixl/lib" GONIXL_REQUIRE_GPU=1
# UCX's CUDA memory hooks (libucm_cuda) need the CUDA runtime; use the one the image has.
cudart=$(find /usr/local/cuda*/ /usr/lib /opt -name 'libcudart.so.13*' 2>/dev/null | head -n 1)
[ -n "$cudart" ] && export LD_LIBRARY_PATH="$(dirname "$cudart")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
{
  echo "== host"; uname -a; nproc; ldd --version | head -n 1
  nvidia-smi --query-gpu=name,uuid,pci.bus_id,memory.total,compute_cap,driver_version --format=csv
  echo "cudart: ${cudart:-none}"; command -v cc gcc || true
} >"$out/env.log" 2>&1
cat "$out/env.log"

cd "$b/bin"
rc=0
if [ -z "${SKIP_TESTS:-}" ]; then
  echo "== tests (race detector on)"
  timeout 240 ./cuda-race.test -test.count=1 -test.timeout 230s >"$out/test.log" 2>&1
  rc=$?
  grep -E '^(--- FAIL|FAIL|ok|PASS)' "$out/test.log" | head -20; echo "cuda tests rc=$rc"
fi
echo "== DRAM→VRAM benchmark"
GONIXL_BENCH_SWEEP=${BENCH_SWEEP-1} timeout 200 ./cuda.test -test.run '^$' -test.bench '^BenchmarkDRAMToVRAM$' -test.benchtime "${BENCH_TIME:-5x}" -test.count "${BENCH_COUNT:-2}" -test.timeout 190s >"$out/bench-vram.log" 2>&1
grep -E 'ns/op|FAIL|panic|bench_test|ABI' "$out/bench-vram.log" | sed -E 's/ +/ /g'
echo "UCX protocols for RMA into GPU memory (UCX_PROTO_INFO=y, every variant, one pass each):"
GONIXL_BENCH_SWEEP=1 UCX_PROTO_INFO=y timeout 90 ./cuda.test -test.run '^$' -test.bench '^BenchmarkDRAMToVRAM$' -test.benchtime 1x -test.count 1 -test.timeout 85s >"$out/proto-vram.log" 2>&1
sed -E 's/^\[[^]]*\] \[[^]]*\] *//' "$out/proto-vram.log" | grep -A7 -E 'remote memory (read|write) .*(into|to) cuda' | grep -E '^\| ' | grep -vE 'Range|----' | sort | uniq -c | sort -rn | head -12
echo "== DRAM→DRAM benchmark"
GONIXL_BENCH_SWEEP=${BENCH_SWEEP-1} timeout 150 ./nixl.test -test.run '^$' -test.bench DRAMToDRAM -test.benchtime "${BENCH_TIME:-5x}" -test.count 1 -test.timeout 140s >"$out/bench-dram.log" 2>&1
grep -E 'ns/op|FAIL|panic' "$out/bench-dram.log" | sed -E 's/ +/ /g; s/BenchmarkDRAMToDRAM.ucx=//'
for v in ${DEMO_VERSIONS-0.16.0 0.33.0}; do
  echo "== demo, vLLM $v profile, decode cache in GPU memory: ./disagg -gpu -vllm-version $v"
  timeout 100 ./disagg -gpu -vllm-version "$v" -nixl-lib-dir "$NIXL_LIB_DIR" >"$out/demo-gpu-$v.log" 2>"$out/demo-gpu-$v.err"
  echo "demo rc=$?"; tail -n 11 "$out/demo-gpu-$v.log"; tail -n 3 "$out/demo-gpu-$v.err"
done
exit "$rc"
