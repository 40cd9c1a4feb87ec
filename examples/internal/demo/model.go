// Package demo holds the servers and the proxy of gonixl's examples: a prefill worker whose KV cache lives on
// a Neuron device and is staged through DRAM, a decode worker with a DRAM (or CUDA) cache, and a proxy that
// runs vLLM's disaggregated request flow. The KV content is a deterministic, causal function of the prompt's
// tokens (KVChain), so the decode side verifies every byte it reads, blocks reused from a cached prefix included.
package demo

import (
	"encoding/binary"
	"hash/fnv"
	"strconv"
	"strings"

	"github.com/gonixl/gonixl/connector"
	"github.com/gonixl/gonixl/layout"
)

// Qwen3_0_6B is Qwen/Qwen3-0.6B: 28 layers, 8 KV heads of 128, bf16, vLLM's block size 16.
var Qwen3_0_6B = connector.Model{Name: "Qwen/Qwen3-0.6B", Layers: 28, KVHeads: 8, HeadDim: 128, DType: layout.BF16, BlockSize: 16}

// Tokens is the demo's tokenizer: one token per whitespace-separated word.
func Tokens(prompt string) int { return len(strings.Fields(prompt)) }

// Seed is the KV seed of a prompt.
func Seed(prompt string) uint64 {
	h := fnv.New64a()
	h.Write([]byte(prompt))
	return h.Sum64()
}

// The demo's vocabulary: the words "w0".."w4095" after three special tokens (<unk>, <s>, </s>), as in the
// word-level tokenizer python/dynamo_worker.py writes for Dynamo's frontend.
const (
	FirstWordID = 3
	VocabWords  = 4096
)

// TokenIDs are the token ids of a text prompt, one per whitespace-separated word: "wN" (N < VocabWords) is
// FirstWordID+N, the id Dynamo's frontend gives it with the demo model's tokenizer, so a prompt sent as text
// and the same prompt tokenized by Dynamo have the same ids (hence the same KV and block hashes); any other
// word is a hash of it, above that vocabulary.
func TokenIDs(prompt string) []int {
	words := strings.Fields(prompt)
	ids := make([]int, len(words))
	for i, w := range words {
		if rest, ok := strings.CutPrefix(w, "w"); ok {
			if n, err := strconv.Atoi(rest); err == nil && n >= 0 && n < VocabWords && strconv.Itoa(n) == rest {
				ids[i] = FirstWordID + n
				continue
			}
		}
		h := fnv.New32a()
		h.Write([]byte(w))
		ids[i] = FirstWordID + VocabWords + int(h.Sum32()>>1)
	}
	return ids
}

// KVChain returns the seed of each position's KV: chain[p] depends on ids[0..p] and nothing else, as a causal
// model's KV at position p depends only on the tokens up to p. Prompts that share their first p tokens have
// the same KV there, so a prefill worker may hand out blocks cached from an earlier prompt and the decode
// still checks every byte against this prompt's own KV.
func KVChain(ids []int) []uint64 {
	chain := make([]uint64, len(ids))
	c := uint64(0x6a09e667f3bcc908)
	for p, id := range ids {
		c = splitmix(c ^ splitmix(uint64(id)))
		chain[p] = c
	}
	return chain
}

// FillHead writes the KV of one head of one layer's K or V for len(chain) consecutive positions, rowBytes
// (head_dim × element size) each: position i's row is a deterministic function of (chain[i], layer, kv, head,
// byte offset in the row), as if a model had computed it. Pass chain[first:last] for positions first..last-1.
func FillHead(dst []byte, rowBytes int, chain []uint64, layer int, kv layout.KV, head int) {
	salt := uint64(layer)<<48 ^ uint64(kv)<<40 ^ uint64(head)<<32
	for p, seed := range chain {
		row := dst[p*rowBytes : (p+1)*rowBytes]
		base := seed ^ salt
		i := 0
		for ; i+8 <= len(row); i += 8 {
			binary.LittleEndian.PutUint64(row[i:], splitmix(base+uint64(i)))
		}
		if i < len(row) {
			var tail [8]byte
			binary.LittleEndian.PutUint64(tail[:], splitmix(base+uint64(i)))
			copy(row[i:], tail[:])
		}
	}
}

func splitmix(x uint64) uint64 {
	x += 0x9e3779b97f4a7c15
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9
	x = (x ^ (x >> 27)) * 0x94d049bb133111eb
	return x ^ (x >> 31)
}
