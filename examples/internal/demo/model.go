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
	"github.com/gonixl/gonixl/connector/protocol"
	"github.com/gonixl/gonixl/layout"
)

// Model is the attention shape of the model whose KV cache the demo moves.
type Model struct {
	Name       string
	NumLayers  int
	NumKVHeads int
	HeadDim    int
	DType      layout.DType
	BlockSize  int
}

// Qwen3_0_6B is Qwen/Qwen3-0.6B: 28 layers, 8 KV heads of 128, bf16, vLLM's block size 16.
var Qwen3_0_6B = Model{Name: "Qwen/Qwen3-0.6B", NumLayers: 28, NumKVHeads: 8, HeadDim: 128, DType: layout.BF16, BlockSize: 16}

// Geometry returns the paged cache geometry for a vLLM profile, numBlocks blocks and a block order.
func (m Model) Geometry(p protocol.Profile, numBlocks int, order layout.BlockOrder) (layout.Geometry, error) {
	plan, err := connector.PlanFor(p)
	if err != nil {
		return layout.Geometry{}, err
	}
	g := layout.Geometry{NumLayers: m.NumLayers, NumBlocks: numBlocks, BlockSize: m.BlockSize, NumKVHeads: m.NumKVHeads,
		HeadDim: m.HeadDim, DType: m.DType, Order: order, Plan: plan}
	return g, g.Validate()
}

// Compat returns the compatibility-hash inputs both demo servers use.
func (m Model) Compat(vllmVersion string) connector.Compat {
	// vLLM's defaults for the release on CUDA (HMA, FLASH_ATTN, cache dtype "auto", pull mode), then the model.
	in := protocol.CompatInputs{VLLMVersion: vllmVersion, AttnBackendName: "FLASH_ATTN", CacheDtype: "auto", HMAEnabled: true}
	if p, err := protocol.ProfileFor(vllmVersion); err == nil {
		in = p.DefaultCompatInputs(vllmVersion, protocol.PlatformCUDA)
	}
	in.Model, in.Dtype, in.NumKVHeads, in.HeadSize, in.NumHiddenLayers = m.Name, "torch.bfloat16", int64(m.NumKVHeads), int64(m.HeadDim), int64(m.NumLayers)
	return connector.Compat{CompatInputs: in}
}

// Tokens is the demo's tokenizer: one token per whitespace-separated word.
func Tokens(prompt string) int { return len(strings.Fields(prompt)) }

// Seed is the KV seed of a prompt.
func Seed(prompt string) uint64 {
	h := fnv.New64a()
	h.Write([]byte(prompt))
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
