package blockhash

import "errors"

// Sentinel errors. Every error this package returns wraps one of them, so callers can branch with errors.Is.
var (
	// ErrUnknownVersion: no row of Releases covers this vLLM version. Pick one with ReleaseByName when you know
	// which release's hashing the peers use.
	ErrUnknownVersion = errors.New("blockhash: no block-hash row for this vLLM version")
	// ErrNotReproducible: with this release, algorithm and seed, vLLM derives NONE_HASH from random bytes per
	// process, so no other process (Go or Python) can compute its block hashes. Run the vLLM engines with a
	// fixed PYTHONHASHSEED and set Config.PythonHashSeed to the same value.
	ErrNotReproducible = errors.New("blockhash: vLLM's block hashes are not reproducible with this configuration")
	// ErrUnsupported: an algorithm or input this package does not compute (the xxhash algorithms; pickle
	// payloads of 4 GiB or more). Use sha256 or sha256_cbor (vLLM's prefix_caching_hash_algo).
	ErrUnsupported = errors.New("blockhash: unsupported hash input")
	// ErrInvalid: a configuration or input vLLM would not hash (a block size below 1, an unknown algorithm name,
	// a cache salt that is not UTF-8). Fix the value.
	ErrInvalid = errors.New("blockhash: invalid value")
)
