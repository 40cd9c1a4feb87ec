#!/usr/bin/env bash
# `make measured`: one run of the bench commands on this machine — `make bench` (every benchmark),
# `make bench-vllm` and the disagg demo (`make demo`'s program), PASSES passes each (default 3) — with their
# logs in MEASURED_DIR (default ~/.cache/gonixl/measured/<UTC time>), then internal/measured writes README's
# Measured section (between its markers) and docs/bench.md (every benchmark metric) from those logs, each
# figure with its spread over the passes. GPU_LOGS: a folder of scripts/gpu-perreq.sh logs from a GPU host
# (the logs.tgz it leaves in $OUT, unpacked), stated beside them. Run it on a quiet machine.
set -euo pipefail
cd "$(dirname "$0")/.."
passes=${PASSES:-3}
go=${GO:-go}
dir=${MEASURED_DIR:-$HOME/.cache/gonixl/measured/$(date -u +%Y%m%dT%H%M%SZ)}
mkdir -p "$dir"
echo "measured: logs in $dir"
cpu=$(grep -m1 'model name' /proc/cpuinfo 2>/dev/null | sed 's/.*: //' || true)
title="This machine: $(date -u '+%Y-%m-%d %H:%M UTC'), $(nproc) cores (${cpu:-unknown CPU}), tree $(git describe --always --dirty --abbrev=7), load average $(cut -d' ' -f1-3 /proc/loadavg) at the start; $passes passes of each command (\`make measured\`)."
echo "$title" >"$dir/title.txt"
step() { # name log command...
  local name=$1 log=$2; shift 2
  echo "measured: $name"
  if ! "$@" >"$log" 2>&1; then
    tail -n 40 "$log" >&2
    echo "measured: $name failed (log: $log)" >&2
    exit 1
  fi
}
step "make bench ($passes passes)" "$dir/bench.bench" \
  "$go" test -run '^$' -bench . -benchtime "${BENCHTIME:-1x}" -count "$passes" ./...
step "make bench-vllm ($passes passes)" "$dir/bench-vllm.bench" make --no-print-directory bench-vllm PASSES="$passes" RUNS="${RUNS:-6}"
"$go" build -o "$dir/disagg" ./examples/disagg
for p in $(seq 1 "$passes"); do
  step "demo, pass $p" "$dir/demo-p$p.log" "$dir/disagg"
done
"$go" run ./internal/measured -cpu "$dir" ${GPU_LOGS:+-gpu "$GPU_LOGS"} -readme README.md -full docs/bench.md
echo "measured: README.md's Measured section and docs/bench.md rewritten"
