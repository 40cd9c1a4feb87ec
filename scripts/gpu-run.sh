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
echo "== DRAM→VRAM benchmark (gonixl defaults; peer-pinned: the DRAM peer's buffer page-locked for CUDA, as the demo's prefill worker does)"
GONIXL_BENCH_SWEEP=1 timeout 150 ./cuda.test -test.run '^$' -test.bench "${BENCH_MAIN:-^BenchmarkDRAMToVRAM\$/^ucx=(gonixl-defaults|peer-pinned)\$/^block}" -test.benchtime "${BENCH_TIME:-5x}" -test.count "${BENCH_COUNT:-1}" -test.timeout 145s >"$out/bench-vram.log" 2>&1
grep -E 'ns/op|FAIL|panic|bench_test|ABI' "$out/bench-vram.log" | sed -E 's/ +/ /g'
for v in ${DEMO_VERSIONS-0.16.0 0.33.0}; do
  echo "== demo, vLLM $v profile, decode cache in GPU memory: ./disagg -gpu -vllm-version $v (prefill: -cuda-context auto)"
  timeout 60 ./disagg -gpu -vllm-version "$v" -nixl-lib-dir "$NIXL_LIB_DIR" >"$out/demo-gpu-$v.log" 2>&1
  drc=$?; echo "demo rc=$drc"; grep -m1 'starting prefill' "$out/demo-gpu-$v.log"; tail -n 12 "$out/demo-gpu-$v.log"
  if [ "$drc" != 0 ]; then
    echo "== demo again without page-locking the staging arena: -prefill-cuda-pin-staging=false"
    timeout 60 ./disagg -gpu -vllm-version "$v" -prefill-cuda-pin-staging=false -nixl-lib-dir "$NIXL_LIB_DIR" 2>&1 | tail -n 14
  fi
done
for v in ${DEMO_OFF_VERSIONS-0.33.0}; do
  echo "== demo, vLLM $v, prefill without a CUDA context (-prefill-cuda-context off), for comparison"
  timeout 60 ./disagg -gpu -vllm-version "$v" -prefill-cuda-context off -nixl-lib-dir "$NIXL_LIB_DIR" >"$out/demo-gpu-off-$v.log" 2>&1
  echo "demo rc=$?"; tail -n 9 "$out/demo-gpu-off-$v.log"
done
if [ -n "${BENCH_SWEEP-1}" ]; then
  echo "== 2 MiB contiguous sweep (UCX settings, pinning, descriptor splitting)"
  GONIXL_BENCH_SWEEP=1 timeout 150 ./cuda.test -test.run '^$' -test.bench '^BenchmarkDRAMToVRAM$/^ucx=/^block=2048KiB/^contiguous$' -test.benchtime "${BENCH_TIME:-5x}" -test.count 1 -test.timeout 145s >"$out/sweep-2m.log" 2>&1
  grep -E 'ns/op|FAIL|panic' "$out/sweep-2m.log" | sed -E 's/ +/ /g; s/BenchmarkDRAMToVRAM.ucx=//'
fi
echo "UCX protocols for RMA into GPU memory (UCX_PROTO_INFO=y, one pass each):"
GONIXL_BENCH_SWEEP=1 UCX_PROTO_INFO=y timeout 60 ./cuda.test -test.run '^$' -test.bench '^BenchmarkDRAMToVRAM$/^ucx=(peer-pinned|pinned\+frag16m|nocuda\+retainctx)$/^block=2048KiB/^contiguous$' -test.benchtime 1x -test.count 1 -test.timeout 55s >"$out/proto-vram.log" 2>&1
sed -E 's/^\[[^]]*\] \[[^]]*\] *//' "$out/proto-vram.log" | grep -A7 -E '^BenchmarkDRAM|remote memory (read|write) .*(into|to) cuda' | grep -E '^BenchmarkDRAM|remote memory|^\| ' | grep -vE 'Range|----' | uniq -c | head -40
echo "== DRAM→DRAM benchmark"
GONIXL_BENCH_SWEEP=${BENCH_SWEEP-1} timeout 100 ./nixl.test -test.run '^$' -test.bench DRAMToDRAM -test.benchtime "${BENCH_TIME:-5x}" -test.count 1 -test.timeout 95s >"$out/bench-dram.log" 2>&1
grep -E 'ns/op|FAIL|panic' "$out/bench-dram.log" | sed -E 's/ +/ /g; s/BenchmarkDRAMToDRAM.ucx=//'
exit "$rc"
