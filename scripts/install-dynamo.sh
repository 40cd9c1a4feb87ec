#!/usr/bin/env bash
# Installs NVIDIA Dynamo (ai-dynamo $DYNAMO_VERSION: frontend, KV router, Python backend API) from PyPI into a
# cached virtualenv outside the repository, $DYNAMO_VENV. The pinned dependency set is $DYNAMO_LOCK
# (python/dynamo-requirements.txt); ai-dynamo itself goes in last with --no-deps (see that file for why).
# Wheels only, nothing is built. Idempotent: a stamp holding the lock file's content marks a complete install;
# a changed lock or an interrupted install starts over. Prints the time it took and the size.
set -euo pipefail
version=${DYNAMO_VERSION:?}
venv=${DYNAMO_VENV:?}
lock=${DYNAMO_LOCK:?}
python=${PYTHON:-python3}
stamp="$venv/.complete"
# One installer at a time per venv: two `make test` runs on one machine share the cache; the second waits
# here and then finds the stamp.
mkdir -p "$(dirname "$venv")"
exec 9>"$venv.lock"
flock 9
if [ -f "$stamp" ] && cmp -s "$lock" "$stamp"; then
  touch "$stamp"
  exit 0
fi
echo "installing Dynamo ${version} (ai-dynamo, ai-dynamo-runtime) into ${venv}" >&2
start=$(date +%s)
rm -rf "$venv"
mkdir -p "$(dirname "$venv")"
"$python" -m venv "$venv"
pip=("$venv/bin/python" -m pip install -q --disable-pip-version-check --no-cache-dir --only-binary=:all:)
"${pip[@]}" -r "$lock"
"${pip[@]}" --no-deps "ai-dynamo==${version}"
"$venv/bin/python" -c "import dynamo.common.backend, dynamo.frontend, aiohttp, zmq, tokenizers"
cp "$lock" "$stamp"
echo "Dynamo ${version} ready in $(( $(date +%s) - start )) s, $(du -sh "$venv" | cut -f1): ${venv}" >&2
