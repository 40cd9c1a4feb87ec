#!/usr/bin/env bash
# Run every Fuzz target of every package in the module for FUZZTIME each (default 30s).
# Targets are discovered with `go test -list '^Fuzz'` per package, so every engineer's targets are included.
# Usage: scripts/fuzz.sh [FUZZTIME]      (make fuzz FUZZTIME=1m)
# Extra flags for `go test` can be passed in FUZZ_FLAGS (e.g. FUZZ_FLAGS="-parallel 2").
set -uo pipefail

FUZZTIME="${1:-${FUZZTIME:-30s}}"
GO="${GO:-go}"
cd "$(dirname "$0")/.."

if ! pkgs=$("$GO" list ./...); then
	echo "fuzz.sh: go list failed" >&2
	exit 1
fi

ran=0
failed=()
for pkg in $pkgs; do
	if ! out=$("$GO" test -list '^Fuzz' "$pkg" 2>&1); then
		echo "fuzz.sh: cannot list tests of $pkg:" >&2
		echo "$out" >&2
		failed+=("$pkg (build)")
		continue
	fi
	for target in $(printf '%s\n' "$out" | grep -E '^Fuzz[A-Za-z0-9_]*$' || true); do
		echo "=== fuzz $pkg $target ($FUZZTIME)"
		# shellcheck disable=SC2086
		if ! "$GO" test -run '^$' -fuzz "^${target}\$" -fuzztime "$FUZZTIME" ${FUZZ_FLAGS:-} "$pkg"; then
			failed+=("$pkg $target")
		fi
		ran=$((ran + 1))
	done
done

echo "fuzz.sh: ran $ran fuzz targets for $FUZZTIME each"
if [ "${#failed[@]}" -ne 0 ]; then
	printf 'fuzz.sh: FAILED: %s\n' "${failed[@]}" >&2
	exit 1
fi
if [ "$ran" -eq 0 ]; then
	echo "fuzz.sh: no fuzz targets found" >&2
	exit 1
fi
