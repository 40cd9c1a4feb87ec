#!/usr/bin/env bash
# Creates (or reuses) the virtualenv of one vLLM release for the real-vLLM test tier:
#   $GONIXL_VLLM_VENVS/vllm-<VERSION> (default ~/.cache/gonixl/venvs), outside the repo, reused between runs.
# It holds vllm==VERSION from PyPI with its own dependencies (torch, msgspec, pyzmq), NIXL's Python API
# (the `nixl` meta package at the version the Go side's libraries are pinned to) and, only where the release's
# PyPI wheel ignores VLLM_TARGET_DEVICE=cpu, a tiny platform plugin (python/vllm_cpu_platform_plugin) that
# returns vLLM's own CpuPlatform through vLLM's entry-point group vllm.platform_plugins.
# Idempotent: a completion stamp (.gonixl-complete) records what was installed; a half-made venv is completed.
set -euo pipefail
version=${1:?usage: scripts/vllm-venv.sh VLLM_VERSION}
. "$(dirname "$0")/venv-lib.sh"
venv_begin "vllm-$version" "vllm==$version nixl==$nixl_version plugin-v1" \
  "vllm==$version, nixl==$nixl_version; several GB, minutes"
pip=("$venv/bin/python" -m pip install -q --disable-pip-version-check)
"${pip[@]}" "vllm==$version" "nixl==$nixl_version"
# Does the wheel select vLLM's CPU platform by itself?
probe='from vllm.platforms import current_platform; print(current_platform.device_type)'
dev=$(cd / && VLLM_TARGET_DEVICE=cpu "$venv/bin/python" -c "$probe" 2>/dev/null | tail -n 1 || true)
if [ "$dev" != "cpu" ]; then
  echo "vllm $version ignores VLLM_TARGET_DEVICE=cpu (platform: '${dev}'): installing the CPU platform plugin" >&2
  tmp=$(mktemp -d)
  cp -r "$here/python/vllm_cpu_platform_plugin" "$tmp/"  # built out of the repo (setuptools writes build/ in place)
  "${pip[@]}" "$tmp/vllm_cpu_platform_plugin"
  rm -rf "$tmp"
  dev=$(cd / && VLLM_TARGET_DEVICE=cpu "$venv/bin/python" -c "$probe" 2>/dev/null | tail -n 1 || true)
  if [ "$dev" != "cpu" ]; then
    echo "vllm $version does not select its CPU platform even with the plugin (platform: '${dev}')" >&2
    exit 1
  fi
fi
venv_end "vllm $version"
