#!/usr/bin/env bash
# Issue 25's per-request passes, on the GPU machine (no Go there), from the repository root, after
# scripts/gpu-bundle.sh built $GPU_BUNDLE/bundle.tgz (default .gpu): PASSES passes (default 3), each
# BenchmarkDRAMToVRAM/ucx={gonixl-defaults,nopool}/block=32KiB/contiguous and their request= benchmarks
# (NIXL's own READ of the demo's 21- and 40-block requests' shape in both eras: the baselines of the pass),
# then `disagg -gpu` for vLLM 0.33.0 and 0.16.0, one request at a time and four in flight. Another demo
# binary put into the bundle's bin/ as disagg-NAME (e.g. main's, built with
# `go build -o .../bin/disagg-main ./examples/disagg` in a checkout of main) runs one at a time beside it,
# and four in flight too with OTHERS_C4=1. VARIANTS (e.g. "poll50:-prefill-busy-poll=50us") makes such a
# disagg-NAME of the bundle's demo with other flags (comma-separated), in the same passes.
# LENGTHS overrides the demo's -lengths. READ_AGENTS (e.g. "2 4") adds, for each count, the demo with its
# decode worker's -read-agents set to it (read agents into GPU memory), one at a time and four in flight.
# Logs go to $OUT (a logs.tgz of them), the table rows to stdout.
set -uo pipefail
out=${OUT:-/tmp/out}
bundle=${GPU_BUNDLE:-.gpu}
mkdir -p "$out"
b=/tmp/gonixl-gpu
rm -rf "$b" && mkdir -p "$b" && tar xzf "$bundle/bundle.tgz" -C "$b"
export NIXL_LIB_DIR="$b/nixl/lib"
cudart=$(find /usr/local/cuda*/ /usr/lib /opt -name 'libcudart.so.13*' 2>/dev/null | head -n 1)
[ -n "$cudart" ] && export LD_LIBRARY_PATH="$(dirname "$cudart")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
cd "$b/bin"
# host.log: what internal/measured (make measured GPU_LOGS=…) says the figures are of.
{
  echo "$(date -u '+%Y-%m-%d %H:%M UTC'), $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -n 1), $(nproc) cores, bundle of $(cat REVISION 2>/dev/null || echo 'an unknown tree'), demo -lengths ${LENGTHS:-(its default)}"
} | tee "$out/host.log"
for v in ${VARIANTS:-}; do
  flags=${v#*:}
  printf '#!/bin/sh\nexec "$(dirname "$0")/disagg" %s "$@"\n' "${flags//,/ }" >"disagg-${v%%:*}" && chmod +x "disagg-${v%%:*}"
done
others=$(ls disagg-* 2>/dev/null)
lengths=()
[ -n "${LENGTHS:-}" ] && lengths=(-lengths "$LENGTHS")
demo() { # binary version concurrency [extra demo flags...]
  local bin=$1 v=$2 c=$3; shift 3
  local f="$out/$bin-$v-c$c${1:+-ra$2}-p$p.log"
  timeout 60 "./$bin" -gpu -vllm-version "$v" -concurrency "$c" "${lengths[@]}" "$@" -nixl-lib-dir "$NIXL_LIB_DIR" >"$f" 2>&1
  echo "== $bin $v -concurrency $c $*: rc=$?"; grep -E '^ *req-|aggregate' "$f" | sed -E 's/ +/ /g' | cut -c1-110
}
for p in $(seq 1 "${PASSES:-3}"); do
  echo "#### pass $p"
  GONIXL_BENCH_SWEEP=1 timeout 150 ./cuda.test -test.run '^$' -test.bench '^BenchmarkDRAMToVRAM$/^ucx=(gonixl-defaults|nopool)$/^block=32KiB/^(contiguous|request=)' -test.benchtime 20x -test.count 1 -test.timeout 145s >"$out/bench-p$p.log" 2>&1
  grep -E '^Benchmark' "$out/bench-p$p.log" | grep -oE 'ucx=[^/]+/block=32KiB/[^ ]+|[0-9.]+ nixl_GB/s' | paste -sd' '
  for v in 0.33.0 0.16.0; do
    demo disagg "$v" 1
    for o in $others; do
      demo "$o" "$v" 1
      [ -n "${OTHERS_C4:-}" ] && demo "$o" "$v" 4
    done
    demo disagg "$v" 4
    for n in ${READ_AGENTS:-}; do
      demo disagg "$v" 1 -read-agents "$n"
      demo disagg "$v" 4 -read-agents "$n"
    done
  done
done
cd "$out" && tar czf logs.tgz ./*.log && rm ./*.log
