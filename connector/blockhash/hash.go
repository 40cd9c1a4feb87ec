package blockhash

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"unicode/utf8"
)

// Hash is a block hash of the sha256 algorithms: 32 bytes, vLLM's BlockHash (bytes). It is comparable, so it
// can key a map.
type Hash [sha256.Size]byte

// String returns the hash in hex, as Python's BlockHash.hex().
func (h Hash) String() string { return hex.EncodeToString(h[:]) }

// Config chooses vLLM's block hash: the engines' release, algorithm and seed, and the block size.
type Config struct {
	// Release is the engines' row (ReleaseFor, ReleaseByName).
	Release Release
	// Algo is the engines' prefix_caching_hash_algo; "" means the release's default (DefaultAlgo).
	Algo Algo
	// PythonHashSeed is the engines' PYTHONHASHSEED environment variable, nil when it is not set. With it set,
	// NONE_HASH is the hash of that string in every release.
	PythonHashSeed *string
	// BlockSize is the tokens per hashed block: vLLM's block_size (its hash_block_size where KV cache groups
	// differ).
	BlockSize int
}

// Hasher computes vLLM's block hashes for one Config. It is immutable and safe for concurrent use.
type Hasher struct {
	cfg      Config
	algo     Algo
	seed     string
	noneHash Hash
}

// New returns the Hasher for cfg. Errors: ErrInvalid (block size below 1, unknown algorithm, a release
// without a name), ErrUnsupported (xxhash, xxhash_cbor), ErrNotReproducible (vLLM would seed NONE_HASH with
// random bytes: the release has no fixed default seed and PythonHashSeed is nil).
func New(cfg Config) (*Hasher, error) {
	if cfg.Release.Name == "" {
		return nil, fmt.Errorf("%w: Config.Release is not set; use ReleaseFor(version)", ErrInvalid)
	}
	if cfg.BlockSize < 1 {
		return nil, fmt.Errorf("%w: block size %d; set Config.BlockSize to the engines' block_size", ErrInvalid, cfg.BlockSize)
	}
	algo := cfg.Algo
	if algo == "" {
		algo = cfg.Release.DefaultAlgo
	}
	switch algo {
	case SHA256, SHA256CBOR:
	case XXHash, XXHashCBOR:
		return nil, fmt.Errorf("%w: prefix_caching_hash_algo %q (XXH3-128) is not computed here; run the engines "+
			"with sha256 or sha256_cbor", ErrUnsupported, algo)
	default:
		return nil, fmt.Errorf("%w: prefix_caching_hash_algo %q (vLLM's are %s, %s, %s, %s)", ErrInvalid, algo,
			SHA256, SHA256CBOR, XXHash, XXHashCBOR)
	}
	var seed string
	switch {
	case cfg.PythonHashSeed != nil:
		seed = *cfg.PythonHashSeed
	case cfg.Release.DefaultSeed != "":
		seed = cfg.Release.DefaultSeed
	default:
		return nil, fmt.Errorf("%w: vLLM %s.x without PYTHONHASHSEED seeds NONE_HASH with os.urandom(32) in every "+
			"process; start the engines with PYTHONHASHSEED set and put the same value in Config.PythonHashSeed",
			ErrNotReproducible, cfg.Release.Name)
	}
	if !utf8.ValidString(seed) {
		return nil, fmt.Errorf("%w: PYTHONHASHSEED %q is not UTF-8", ErrInvalid, seed)
	}
	h := &Hasher{cfg: cfg, algo: algo, seed: seed}
	nh, err := h.digest(strVal(seed))
	if err != nil {
		return nil, err
	}
	h.noneHash = nh
	return h, nil
}

// Algo returns the algorithm in use (Config.Algo or the release's default).
func (h *Hasher) Algo() Algo { return h.algo }

// Seed returns the string NONE_HASH is derived from (PYTHONHASHSEED or the release's default seed).
func (h *Hasher) Seed() string { return h.seed }

// BlockSize returns the tokens per hashed block.
func (h *Hasher) BlockSize() int { return h.cfg.BlockSize }

// NoneHash returns vLLM's NONE_HASH for this configuration: the first block's parent.
func (h *Hasher) NoneHash() Hash { return h.noneHash }

// Hashes returns the hashes of the full blocks of a prompt, one per BlockSize tokens (a last partial block has
// none), as vLLM's request block hasher computes them for a request with these token ids and cache_salt ("":
// none) and no LoRA, multimodal inputs or prompt embeddings. Hash i covers tokens [0, (i+1)·BlockSize): equal
// hashes mean equal prefixes.
func (h *Hasher) Hashes(tokens []int64, cacheSalt string) ([]Hash, error) {
	return h.Append(nil, tokens, cacheSalt)
}

// Append extends hashes, the hashes of tokens' first len(hashes) full blocks, with those of the full blocks after
// them (as vLLM's request block hasher does when a request's tokens grow). ErrInvalid when tokens has fewer
// than len(hashes)·BlockSize tokens or cacheSalt is not UTF-8.
func (h *Hasher) Append(hashes []Hash, tokens []int64, cacheSalt string) ([]Hash, error) {
	bs := h.cfg.BlockSize
	if len(tokens) < len(hashes)*bs {
		return hashes, fmt.Errorf("%w: %d hashes cover %d tokens, but only %d tokens were given", ErrInvalid,
			len(hashes), len(hashes)*bs, len(tokens))
	}
	if !utf8.ValidString(cacheSalt) {
		return hashes, fmt.Errorf("%w: cache_salt %q is not UTF-8", ErrInvalid, cacheSalt)
	}
	parent := h.noneHash
	if len(hashes) > 0 {
		parent = hashes[len(hashes)-1]
	}
	for start := len(hashes) * bs; start+bs <= len(tokens); start += bs {
		extra := value{kind: kindNone}
		if start == 0 && cacheSalt != "" {
			extra = tupleVal(h.saltKey(cacheSalt))
		}
		next, err := h.digest(tupleVal(bytesVal(parent[:]), intsVal(tokens[start:start+bs]), extra))
		if err != nil {
			return hashes, err
		}
		hashes = append(hashes, next)
		parent = next
	}
	return hashes, nil
}

func (h *Hasher) saltKey(salt string) value {
	if h.cfg.Release.SaltKey == SaltTagged {
		return tupleVal(strVal("cache_salt"), strVal(salt))
	}
	return strVal(salt)
}

// digest is hash_fn(v).
func (h *Hasher) digest(v value) (Hash, error) {
	if h.algo == SHA256CBOR {
		return sha256.Sum256(cborPayload(v)), nil
	}
	b, err := picklePayload(v)
	if err != nil {
		return Hash{}, err
	}
	return sha256.Sum256(b), nil
}
