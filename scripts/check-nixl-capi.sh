#!/usr/bin/env bash
# Compiles nixl/testdata/capi_check.c against NIXL's own C API header (wrapper.h of NIXL's Rust binding) so
# that a gx.h prototype, struct or enum value that differs from NIXL's fails `make lint`. The header is not
# in NIXL's wheels: it is taken from $NIXL_CAPI_HEADER (a wrapper.h, e.g. of a NIXL source tree) or from the
# nixl-sys crate of the pinned NIXL version (crates.io, fetched with cargo into cargo's own cache; nothing of
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
	cargo_home=${CARGO_HOME:-$HOME/.cargo}
	find_header() { ls "$cargo_home"/registry/src/*/nixl-sys-"$NIXL_VERSION"/wrapper.h 2>/dev/null | head -n1; }
	header=$(find_header)
	if [ -z "$header" ]; then
		command -v cargo >/dev/null || missing "no NIXL C API header: set NIXL_CAPI_HEADER to NIXL's src/bindings/rust/wrapper.h, or install cargo to fetch the nixl-sys $NIXL_VERSION crate"
		# cargo info downloads and unpacks the crate into cargo's registry cache.
		cargo info --quiet "nixl-sys@$NIXL_VERSION" >/dev/null || missing "cargo could not fetch nixl-sys $NIXL_VERSION"
		header=$(find_header)
		[ -n "$header" ] || missing "nixl-sys $NIXL_VERSION has no wrapper.h"
	fi
fi
[ -f "$header" ] || missing "NIXL_CAPI_HEADER=$header is not a file"
${CC:-gcc} -std=c11 -fsyntax-only -Wall -Werror -I"$(dirname "$header")" nixl/testdata/capi_check.c
echo "check-nixl-capi: nixl/gx.h matches $header"
