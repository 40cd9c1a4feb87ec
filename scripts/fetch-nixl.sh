#!/usr/bin/env bash
# Downloads the pinned NIXL wheel from PyPI and unpacks its native libraries (libnixl_capi.so, the plugins,
# UCX) into $NIXL_HOME/<cuXX>-<version>/. It does not build anything. Idempotent and quiet when done.
set -euo pipefail
version=${NIXL_VERSION:?}
cuda=${NIXL_CUDA:?}
home=${NIXL_HOME:?}
python=${PYTHON:-python3}
pkg="nixl-cu${cuda}"
mod="nixl_cu${cuda}"
dest="$home/cu${cuda}-${version}"
stamp="$dest/.complete"
if [ -f "$stamp" ]; then
  ln -sfn "cu${cuda}-${version}" "$home/current"
  exit 0
fi
echo "fetching NIXL ${version} (${pkg}) from PyPI into ${dest}" >&2
rm -rf "$dest"
mkdir -p "$dest/wheel"
"$python" -m pip download -q --no-deps --only-binary=:all: --dest "$dest/wheel" "${pkg}==${version}"
whl=$(ls "$dest"/wheel/*.whl | head -n 1)
# Only the native libraries are used; their RPATHs ($ORIGIN/../${mod}.libs) need the wheel's folder layout.
(cd "$dest" && "$python" -m zipfile -e "$whl" unpacked >/dev/null)
mv "$dest/unpacked/.${mod}.mesonpy.libs" "$dest/lib"
mv "$dest/unpacked/${mod}.libs" "$dest/${mod}.libs"
rm -rf "$dest/unpacked"
# The RPATH of the libraries is $ORIGIN/../${mod}.libs, and lib/ sits beside it: keep both names.
chmod -R u+rwX,go+rX "$dest"
touch "$stamp"
ln -sfn "cu${cuda}-${version}" "$home/current"
echo "NIXL ${version} ready: NIXL_LIB_DIR=${home}/current/lib" >&2
