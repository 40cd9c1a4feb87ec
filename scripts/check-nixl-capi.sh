#!/usr/bin/env bash
# Compiles nixl/testdata/capi_check.c against NIXL's own C API header (wrapper.h of NIXL's Rust binding) so
# that a gx.h prototype, struct or enum value that differs from NIXL's fails `make lint`. The header is not
# in NIXL's wheels: it is taken from $NIXL_CAPI_HEADER (a wrapper.h, e.g. of a NIXL source tree) or from the
# nixl-sys crate of the pinned NIXL version (downloaded from static.crates.io into ~/.cache/gonixl; nothing of
# NIXL is copied into this repository).
set -euo pipefail
cd "$(dirname "$0")/.."
: "${NIXL_VERSION:?NIXL_VERSION must be set (the Makefile sets it)}"

missing() {
	if [ "${CI:-}" = true ] || [ "${CI:-}" = 1 ]; then
		echo "check-nixl-capi: $1 (CI=true makes this a failure)" >&2
		exit 1
	fi
	echo "check-nixl-capi: SKIPPED: $1" >&2
	exit 0
}

header=${NIXL_CAPI_HEADER:-}
if [ -z "$header" ]; then
	# The crate is a gzipped tar from crates.io's static host; only wrapper.h is kept, outside the repo.
	cache=${GONIXL_CACHE:-$HOME/.cache/gonixl}/nixl-sys-$NIXL_VERSION
	header=$cache/wrapper.h
	if [ ! -f "$header" ]; then
		mkdir -p "$cache"
		${PYTHON:-python3} - "$NIXL_VERSION" "$header" <<'PY' || missing "could not fetch wrapper.h of the nixl-sys $NIXL_VERSION crate from static.crates.io (or set NIXL_CAPI_HEADER)"
import io, os, sys, tarfile, urllib.request
version, out = sys.argv[1], sys.argv[2]
url = f"https://static.crates.io/crates/nixl-sys/nixl-sys-{version}.crate"
data = urllib.request.urlopen(urllib.request.Request(url, headers={"User-Agent": "gonixl check-nixl-capi"}), timeout=60).read()
member = tarfile.open(fileobj=io.BytesIO(data)).extractfile(f"nixl-sys-{version}/wrapper.h")
tmp = out + ".tmp"
with open(tmp, "wb") as f:
    f.write(member.read())
os.replace(tmp, out)
PY
	fi
fi
[ -f "$header" ] || missing "NIXL_CAPI_HEADER=$header is not a file"
${CC:-gcc} -std=c11 -fsyntax-only -Wall -Werror -I"$(dirname "$header")" nixl/testdata/capi_check.c
echo "check-nixl-capi: nixl/gx.h matches $header"
