package connector

import (
	"fmt"

	"github.com/gonixl/gonixl/connector/protocol"
	"github.com/gonixl/gonixl/layout"
)

// Model describes the model whose KV cache moves, once, as vLLM's configuration knows it. With the vLLM
// release of the peers (a protocol.Profile) it yields the cache geometry of one TP rank (Geometry), the region
// plan of that release's layout era, and the compatibility-hash inputs with that release's defaults
// (CompatInputs, hashed with the profile's Version). Set it in RoleConfig.Model with
// VLLMVersion and the roles derive the rest.
type Model struct {
	// Name is vLLM's --model, exactly as the vLLM side was given it (it is hashed), e.g. "Qwen/Qwen3-0.6B".
	Name string
	// Layers is num_hidden_layers (the attention layers whose KV cache moves).
	Layers int
	// KVHeads is the number of KV heads of the whole model (num_key_value_heads); a TP rank holds
	// KVHeads/TP of them, or one when TP exceeds KVHeads (vLLM replicates them).
	KVHeads int
	// HeadDim is the head size (head_dim).
	HeadDim int
	// DType is the model's dtype (and the KV cache's, unless CacheDType is set).
	DType layout.DType
	// CacheDType is the KV cache's element type when it differs from DType (vLLM's --kv-cache-dtype); 0 = DType,
	// hashed as vLLM's "auto". FP8E4M3 and FP8E5M2 hash as "fp8_e4m3" and "fp8_e5m2": a vLLM side given plain
	// "fp8" hashes that string, so set Compat.CacheDtype = "fp8" then.
	CacheDType layout.DType
	// AttnBackend is the vLLM side's attention backend name; "" = the release's default on CUDA
	// (Profile.Defaults.AttnBackend). A vLLM side on the CPU platform hashes "CPU_ATTN"
	// (protocol.AttnBackendCPU), and its cache holds CPU_ATTN's own block format: with AttnBackend "CPU_ATTN"
	// the cache is layout.CPUAttn (see Order), the handshake publishes "CPU_ATTN" and HND's label, and the
	// compatibility hash matches a vLLM CPU engine's.
	AttnBackend string
	// BlockSize is vLLM's --block-size; 0 = 16, vLLM's default (vLLM's CPU platform wants a multiple of 32).
	BlockSize int
	// Order is the physical block order; 0 = HND, what vLLM's NixlConnector asks the attention backend for, or
	// layout.CPUAttn when AttnBackend is "CPU_ATTN" and the cache is fp32 or fp16. A bf16 CPU_ATTN cache must
	// state its packing, because vLLM picks it by the CPU: layout.CPUAttn when the vLLM CPU engine runs
	// without AMX tiles (its kernel ISA "vec"/"vec16"/"neon"), layout.CPUAttnAMX on Intel CPUs with AMX tiles
	// (Sapphire Rapids and later); layout.CPUAttnFor decides as vLLM does. With AttnBackend "CPU_ATTN" any other order is refused: a vLLM CPU engine
	// reads CPU_ATTN blocks from a peer that publishes that name.
	Order layout.BlockOrder
}

// DefaultBlockSize is vLLM's default --block-size.
const DefaultBlockSize = 16

// Geometry returns the paged KV cache geometry of one of tpSize TP ranks (tpSize ≤ 1: one rank) with
// numBlocks blocks, in the region plan of p's layout era.
func (m Model) Geometry(p protocol.Profile, numBlocks, tpSize int) (layout.Geometry, error) {
	plan, err := planFor(p)
	if err != nil {
		return layout.Geometry{}, err
	}
	if tpSize < 1 {
		tpSize = 1
	}
	heads, err := layout.HeadsPerRank(m.KVHeads, tpSize)
	if err != nil {
		return layout.Geometry{}, fmt.Errorf("connector: Model %q: %w", m.Name, err)
	}
	g := layout.Geometry{NumLayers: m.Layers, NumBlocks: numBlocks, BlockSize: m.BlockSize, NumKVHeads: heads,
		HeadDim: m.HeadDim, DType: m.DType, Order: m.Order, Plan: plan}
	if g.BlockSize == 0 {
		g.BlockSize = DefaultBlockSize
	}
	if m.CacheDType != 0 {
		g.DType = m.CacheDType
	}
	if err := m.defaultOrder(&g); err != nil {
		return layout.Geometry{}, err
	}
	return g, g.Validate()
}

// defaultOrder sets g.Order when the model leaves it to the attention backend, and refuses a CPU_ATTN model
// whose order is not a CPU_ATTN format.
func (m Model) defaultOrder(g *layout.Geometry) error {
	cpu := m.AttnBackend == protocol.AttnBackendCPU
	switch {
	case g.Order == 0 && !cpu:
		g.Order = layout.HND
	case g.Order == 0 && g.DType == layout.BF16:
		return fmt.Errorf("%w: Model %q: a bf16 CPU_ATTN cache is packed by the vLLM CPU engine's kernel ISA: set Model.Order "+
			"to layout.CPUAttn for a vLLM CPU engine without AMX tiles (AVX2/AVX512 without AMX, ARM), layout.CPUAttnAMX "+
			"on CPUs with AMX tiles (layout.CPUAttnFor(dtype, block size, head_dim, amx) decides as vLLM does)", layout.ErrInvalidGeometry, m.Name)
	case g.Order == 0:
		g.Order = layout.CPUAttn
	case cpu && !g.Order.IsCPUAttn():
		return fmt.Errorf("%w: Model %q: AttnBackend %q with Order %v: a vLLM CPU decode engine reads CPU_ATTN blocks from a "+
			"peer that publishes %q; leave Order unset (layout.CPUAttn), or stage %v for a backend whose layout it is "+
			"(AttnBackend \"FLASH_ATTN\") and have the vLLM decode set enforce_handshake_compat=false, so that it repacks",
			layout.ErrInvalidGeometry, m.Name, m.AttnBackend, g.Order, protocol.AttnBackendCPU, g.Order)
	case !cpu && g.Order.IsCPUAttn():
		return fmt.Errorf("%w: Model %q: Order %v needs AttnBackend %q (the hash and the handshake name the backend whose "+
			"layout the cache holds)", layout.ErrInvalidGeometry, m.Name, g.Order, protocol.AttnBackendCPU)
	}
	return nil
}

// torchNames are str(torch dtype) of the model dtypes, as vLLM hashes them.
var torchNames = map[layout.DType]string{layout.BF16: "torch.bfloat16", layout.FP16: "torch.float16", layout.FP32: "torch.float32"}

// cacheDtypeNames are vLLM's --kv-cache-dtype spellings of the cache element types.
var cacheDtypeNames = map[layout.DType]string{layout.FP8E4M3: "fp8_e4m3", layout.FP8E5M2: "fp8_e5m2"}

// CompatInputs returns the compatibility-hash inputs of the model under p's release: the vLLM side's version
// string is p.Version (protocol.ProfileFor sets it), and that release's defaults fill in everything the model
// does not say (Profile.DefaultCompatInputs). Change a field of the result only where the vLLM side changed its
// defaults, and pass it as Compat.
func (m Model) CompatInputs(p protocol.Profile) (protocol.CompatInputs, error) {
	if p.Version == "" {
		return protocol.CompatInputs{}, fmt.Errorf("connector: Model %q: profile %s has no Version (it is hashed): use protocol.ProfileFor(the peers' version string), or set Profile.Version",
			m.Name, p.Name)
	}
	in := p.DefaultCompatInputs("")
	in.Model = m.Name
	in.NumKVHeads, in.HeadSize, in.NumHiddenLayers = int64(m.KVHeads), int64(m.HeadDim), int64(m.Layers)
	var ok bool
	if in.Dtype, ok = torchNames[m.DType]; !ok {
		return protocol.CompatInputs{}, fmt.Errorf("%w: Model %q: DType %v is not a model dtype (want BF16, FP16 or FP32; an fp8 KV cache is CacheDType)",
			layout.ErrInvalidGeometry, m.Name, m.DType)
	}
	if m.CacheDType != 0 && m.CacheDType != m.DType {
		if in.CacheDtype, ok = cacheDtypeNames[m.CacheDType]; !ok {
			in.CacheDtype = m.CacheDType.String()
		}
	}
	if m.AttnBackend != "" {
		in.AttnBackendName = m.AttnBackend
	}
	return in, nil
}
