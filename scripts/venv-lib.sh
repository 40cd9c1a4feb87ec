# Sourced by scripts/vllm-venv.sh and scripts/vllm-cpu-venv.sh: the part of making a cached vLLM virtualenv
# that both share. The caller sets version; this file sets root, nixl_version, python and here.
root=${GONIXL_VLLM_VENVS:-$HOME/.cache/gonixl/venvs}
nixl_version=${NIXL_VERSION:-1.5.0}
python=${PYTHON:-python3}
here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)

# venv_begin NAME WANT WHAT: venv=$root/NAME. One installer at a time per venv: two `make test` runs on one
# machine share the cache; the second waits here (the lock is held until the script exits) and then finds
# the stamp. When the completion stamp (.gonixl-complete) records WANT, the script exits 0 here. Otherwise
# it says it is creating the venv (WHAT: what goes in) and makes it; a venv left by an interrupted run is
# reused: pip skips what is already installed.
venv_begin() {
  venv="$root/$1"
  stamp="$venv/.gonixl-complete"
  want=$2
  mkdir -p "$root"
  exec 9>"$root/.$1.lock"
  flock 9
  if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
    exit 0
  fi
  start=$(date +%s)
  echo "creating $venv ($3)" >&2
  [ -x "$venv/bin/python" ] || "$python" -m venv "$venv"
}

# venv_end WHAT: records the stamp and says that WHAT's venv is ready and how long it took.
venv_end() {
  echo "$want" > "$stamp"
  echo "$1 venv ready in $(( $(date +%s) - start )) s: $venv" >&2
}
