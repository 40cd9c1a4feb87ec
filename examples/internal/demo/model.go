// Package demo holds the servers and the proxy of gonixl's examples: a prefill worker whose KV cache lives on
// a Neuron device and is staged through DRAM, a decode worker with a DRAM (or CUDA) cache, and a proxy that
// runs vLLM's disaggregated request flow. The KV content is a deterministic function of the prompt, so the
// decode side verifies every byte it reads.
package demo

import (
	"encoding/binary"
	"hash/fnv"
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

// SeedIDs is the KV seed of a prompt given as token ids.
func SeedIDs(ids []int) uint64 {
	h := fnv.New64a()
	var b [8]byte
	for _, id := range ids {
		binary.LittleEndian.PutUint64(b[:], uint64(id))
		h.Write(b[:])
	}
	return h.Sum64()
}

// FillHead writes the KV of one head of one layer's K or V for positions [0, len(dst)/rowBytes): a
// deterministic function of (seed, layer, kv, head, byte offset), as if a model had computed it.
func FillHead(dst []byte, seed uint64, layer int, kv layout.KV, head int) {
	base := seed ^ uint64(layer)<<48 ^ uint64(kv)<<40 ^ uint64(head)<<32
	i := 0
	for ; i+8 <= len(dst); i += 8 {
		binary.LittleEndian.PutUint64(dst[i:], splitmix(base+uint64(i)))
	}
	if i < len(dst) {
		var tail [8]byte
		binary.LittleEndian.PutUint64(tail[:], splitmix(base+uint64(i)))
		copy(dst[i:], tail[:])
	}
}

func splitmix(x uint64) uint64 {
	x += 0x9e3779b97f4a7c15
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9
	x = (x ^ (x >> 27)) * 0x94d049bb133111eb
	return x ^ (x >> 31)
}
