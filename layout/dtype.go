package layout

import (
	"fmt"
	"strings"
)

// DType is the element type of a KV cache. The zero value is invalid, so a Geometry whose DType was never
// set fails Validate instead of silently using some default element size.
type DType uint8

// Element types of a KV cache. FP8 variants are one byte; vLLM's "fp8" means FP8E4M3.
const (
	BF16    DType = iota + 1 // bf16
	FP16                     // fp16
	FP32                     // fp32
	FP8E4M3                  // fp8_e4m3
	FP8E5M2                  // fp8_e5m2
)

type dtypeInfo struct {
	size  int      // bytes per element
	alias []string // other accepted spellings (vLLM / torch names)
}

// dtypes is the data table behind Size and ParseDType (the canonical names, which String returns, are the
// constants' line comments, generated into string.go).
var dtypes = [...]dtypeInfo{
	BF16:    {2, []string{"bfloat16", "torch.bfloat16"}},
	FP16:    {2, []string{"float16", "half", "torch.float16"}},
	FP32:    {4, []string{"float32", "float", "torch.float32"}},
	FP8E4M3: {1, []string{"fp8", "float8_e4m3fn", "torch.float8_e4m3fn", "fp8e4m3"}},
	FP8E5M2: {1, []string{"float8_e5m2", "torch.float8_e5m2", "fp8e5m2"}},
}

// Valid reports whether t is one of the defined element types.
func (t DType) Valid() bool { return t >= BF16 && int(t) < len(dtypes) }

// Size returns the element size in bytes, or 0 for an invalid DType.
func (t DType) Size() int {
	if !t.Valid() {
		return 0
	}
	return dtypes[t].size
}

// ParseDType accepts the canonical names and the spellings vLLM and torch use ("bfloat16", "float16",
// "half", "float32", "fp8", "fp8_e4m3", "fp8_e5m2", "torch.bfloat16", ...), case-insensitively.
//
// vLLM's "auto" is refused on purpose: it means "the model's dtype", which this package cannot know;
// resolve it (e.g. from the model config) before building a Geometry.
func ParseDType(s string) (DType, error) {
	k := strings.ToLower(strings.TrimSpace(s))
	for i := BF16; int(i) < len(dtypes); i++ {
		if k == i.String() {
			return i, nil
		}
		for _, a := range dtypes[i].alias {
			if k == a {
				return i, nil
			}
		}
	}
	if k == "auto" {
		return 0, fmt.Errorf("%w: dtype %q must be resolved to the model's dtype (e.g. \"bfloat16\") first", ErrInvalidGeometry, s)
	}
	return 0, fmt.Errorf("%w: unknown dtype %q (want bf16, fp16, fp32, fp8_e4m3 or fp8_e5m2)", ErrInvalidGeometry, s)
}

// BlockOrder is the physical element order inside one K (or V) block. The zero value is invalid: vLLM's
// connector advertises the order in the handshake, and guessing it silently garbles data, so it must be set.
type BlockOrder uint8

// Physical block orders. String gives "NHD" or "HND", vLLM's kv_cache_layout names up to 0.28; from 0.29 vLLM
// names them "LBNHC" and "LBHNC" (see protocol.Profile.LayoutName). CPUAttn and CPUAttnAMX are the block
// formats of vLLM's CPU attention backend, which vLLM publishes under its HND label (LabelOrder).
const (
	// NHD stores a block as [block_size][heads][head_dim] (token-major).
	NHD BlockOrder = iota + 1
	// HND stores a block as [heads][block_size][head_dim] (head-major); vLLM's NixlConnector asks for it.
	HND
	// CPUAttn is vLLM's CPU_ATTN block format with its vec packing (kernel ISAs "vec", "vec16" and "neon": every
	// dtype on x86 without AMX tiles and on ARM, and fp32/fp16 everywhere): heads outermost, and per head the
	// layer's K transposed, [head_dim][block_size], then its V, [block_size][head_dim]. In PlanSplitKV (vLLM
	// ≤ 0.22, cache (2, num_blocks, heads, block_size, head_dim)) the K region's block is [heads][head_dim]
	// [block_size] and the V region's [heads][block_size][head_dim]; in PlanPackedKV (vLLM ≥ 0.26, cache
	// (num_blocks, heads, block_size, 2·head_dim) viewed as (num_blocks, heads, 2·block_size, head_dim)) a
	// block is [heads][K: head_dim×block_size | V: block_size×head_dim]. Only ToPaged, FromPaged and
	// BlocksToPaged write or read it; Reorder refuses it. See doc.go for the per-release sources.
	CPUAttn // CPU_ATTN
	// CPUAttnAMX is CPU_ATTN's AMX packing (kernel ISA "amx": vLLM 0.18+ picks it for bf16 with a block size
	// that is a multiple of 32 on x86 CPUs with AMX tiles, e.g. Sapphire Rapids; vLLM's
	// csrc/cpu/cpu_attn_amx.hpp reshape_and_cache): heads outermost as in CPUAttn, and per head the layer's K
	// in groups of 16 tokens, each [head_dim/2][16 tokens][2 elements] (pairs of head elements, 4 bytes, one
	// AMX tile row per head-element pair), then its V in groups of 16 head elements, each
	// [block_size/2][16 elements][2 tokens] (pairs of tokens). bf16 only, block_size and head_dim multiples of
	// 32; the regions and plans are CPUAttn's.
	CPUAttnAMX // CPU_ATTN_AMX
)

// Valid reports whether o is a modelled order: NHD, HND, CPUAttn or CPUAttnAMX.
func (o BlockOrder) Valid() bool { return o == NHD || o == HND || o == CPUAttn || o == CPUAttnAMX }

// IsCPUAttn reports whether o is one of the CPU_ATTN block formats (CPUAttn, CPUAttnAMX).
func (o BlockOrder) IsCPUAttn() bool { return o == CPUAttn || o == CPUAttnAMX }

// LabelOrder is the order whose kv_cache_layout label vLLM publishes for bytes in order o: HND for the
// CPU_ATTN formats (vLLM's NixlConnector requires "HND", from 0.29 "LBHNC", and CPU_ATTN accepts only
// that), o itself otherwise.
func (o BlockOrder) LabelOrder() BlockOrder {
	if o.IsCPUAttn() {
		return HND
	}
	return o
}

// ParseBlockOrder accepts "NHD" or "HND" (case-insensitive), as found in vLLM ≤ 0.28's kv_cache_layout, and
// gonixl's names of the CPU_ATTN formats, "CPU_ATTN" and "CPU_ATTN_AMX" (never a vLLM label: vLLM publishes
// "HND" for them); use protocol.Profile.ParseLayoutName for a peer's label, which knows each release's names.
func ParseBlockOrder(s string) (BlockOrder, error) {
	switch strings.ToUpper(strings.TrimSpace(s)) {
	case "NHD":
		return NHD, nil
	case "HND":
		return HND, nil
	case "CPU_ATTN":
		return CPUAttn, nil
	case "CPU_ATTN_AMX":
		return CPUAttnAMX, nil
	}
	return 0, fmt.Errorf("%w: unknown block order %q (want \"NHD\", \"HND\" or \"CPU_ATTN\")", ErrInvalidGeometry, s)
}

// CPUAttnOrder returns the block format vLLM's CPU_ATTN backend writes for the kernel ISA it selected
// (vllm/v1/attention/backends/cpu_attn.py's _get_attn_isa, the layer's isa; CPUAttnISA computes it): CPUAttn
// for "vec", "vec16" and "neon", CPUAttnAMX for "amx". Any other ISA ("amx_fp8", "vxe", "vsx",
// "rvv") is refused with ErrUnsupportedLayout: its packing was not read.
func CPUAttnOrder(isa string) (BlockOrder, error) {
	switch strings.ToLower(strings.TrimSpace(isa)) {
	case "vec", "vec16", "neon":
		return CPUAttn, nil
	case "amx":
		return CPUAttnAMX, nil
	}
	return 0, fmt.Errorf("%w: CPU_ATTN kernel ISA %q: gonixl models the packing of \"vec\", \"vec16\", \"neon\" "+
		"and \"amx\"; run the vLLM CPU peer where one of those is selected", ErrUnsupportedLayout, isa)
}

// CPUAttnFor returns the block format a vLLM CPU engine's CPU_ATTN backend writes for a cache of dtype dt,
// blockSize tokens per block and headDim elements per head, on a CPU with (amxTiles) or without AMX tiles
// — what vllm/v1/attention/backends/cpu_attn.py's _get_attn_isa decides (0.16 … 0.33): "vec16" when headDim
// is a multiple of 16 but not of 32, else "amx" for bf16 with blockSize a multiple of 32 on AMX, else "vec"
// (or "neon", "vec16"): CPUAttnAMX for "amx", CPUAttn otherwise. amxTiles is the engine host's
// torch.cpu._is_amx_tile_supported() (Linux: the amx_tile and amx_bf16 flags in /proc/cpuinfo, on a kernel
// that grants the AMX state). The vLLM CPU engine's host decides, not gonixl's: state it for the peer.
func CPUAttnFor(dt DType, blockSize, headDim int, amxTiles bool) BlockOrder {
	if headDim%32 != 0 && headDim%16 == 0 {
		return CPUAttn
	}
	if amxTiles && dt == BF16 && blockSize%32 == 0 {
		return CPUAttnAMX
	}
	return CPUAttn
}

// RegionPlan is how vLLM's NixlConnector carves a model's KV cache into registered regions and
// descriptors; it changed across vLLM releases ("eras"). The zero value is invalid.
type RegionPlan uint8

// Region plans.
const (
	// PlanSplitKV (era A; FLASH_ATTN up to vLLM 0.22): per layer a K region and a V region, registered in the
	// order K0, V0, K1, V1, ...; one descriptor per block of block_len = block_size·heads·head_dim·e.
	PlanSplitKV RegionPlan = iota + 1 // split-kv
	// PlanKVHalves (era B; FLASH_ATTN in vLLM 0.23–0.25, and FLASHINFER/TRITON_ATTN blocks-first earlier): one
	// region per layer; each block holds the K half then the V half, and each half is its own descriptor.
	PlanKVHalves // kv-halves
	// PlanPackedKV (era C; FLASH_ATTN from vLLM 0.26): one region per layer; K and V are packed in the last dimension
	// ([.., 2·head_dim], K first) and one descriptor covers the whole block.
	PlanPackedKV // packed-kv
)

type planInfo struct {
	regionsPerL   int // registered regions per layer
	descParts     int // descriptors per block of one registered region
	blockKVFactor int // block_len = blockKVFactor · block_size · heads · head_dim · e
}

var plans = [...]planInfo{
	PlanSplitKV:  {2, 1, 1},
	PlanKVHalves: {1, 2, 2},
	PlanPackedKV: {1, 1, 2},
}

// info returns p's row of the plan table; an invalid plan gets a row of zero regions (and one descriptor
// part, so nothing divides by zero), which keeps every size method panic-free on an unvalidated Geometry.
func (p RegionPlan) info() planInfo {
	if !p.Valid() {
		return planInfo{descParts: 1}
	}
	return plans[p]
}

// Valid reports whether p is one of the defined plans.
func (p RegionPlan) Valid() bool { return p >= PlanSplitKV && int(p) < len(plans) }

// KV selects the K or the V cache of a layer.
type KV uint8

// K and V.
const (
	K KV = 0
	V KV = 1
)

// ParseRegionPlan accepts "split-kv", "kv-halves" or "packed-kv" (also "A", "B", "C" for the eras).
func ParseRegionPlan(s string) (RegionPlan, error) {
	k := strings.ToLower(strings.TrimSpace(s))
	for p := PlanSplitKV; p.Valid(); p++ {
		if k == p.String() || k == strings.ToLower(string(rune('A'+int(p)-1))) {
			return p, nil
		}
	}
	return 0, fmt.Errorf("%w: unknown region plan %q (want split-kv, kv-halves or packed-kv)", ErrInvalidGeometry, s)
}

// MarshalText implements encoding.TextMarshaler (the canonical name).
func (t DType) MarshalText() ([]byte, error) { return marshalEnum(t) }

// UnmarshalText implements encoding.TextUnmarshaler via ParseDType.
func (t *DType) UnmarshalText(b []byte) error { return unmarshalEnum(t, b, ParseDType) }

// MarshalText implements encoding.TextMarshaler ("NHD", "HND" or "CPU_ATTN").
func (o BlockOrder) MarshalText() ([]byte, error) { return marshalEnum(o) }

// UnmarshalText implements encoding.TextUnmarshaler via ParseBlockOrder.
func (o *BlockOrder) UnmarshalText(b []byte) error { return unmarshalEnum(o, b, ParseBlockOrder) }

// MarshalText implements encoding.TextMarshaler ("split-kv", "kv-halves", "packed-kv").
func (p RegionPlan) MarshalText() ([]byte, error) { return marshalEnum(p) }

// UnmarshalText implements encoding.TextUnmarshaler via ParseRegionPlan.
func (p *RegionPlan) UnmarshalText(b []byte) error { return unmarshalEnum(p, b, ParseRegionPlan) }

// marshalEnum is MarshalText of DType, BlockOrder and RegionPlan: the canonical name of a valid value.
func marshalEnum[T interface {
	Valid() bool
	String() string
}](v T) ([]byte, error) {
	if !v.Valid() {
		return nil, fmt.Errorf("%w: cannot marshal %v", ErrInvalidGeometry, v)
	}
	return []byte(v.String()), nil
}

// unmarshalEnum is UnmarshalText of DType, BlockOrder and RegionPlan: *dst = parse(b), also on error.
func unmarshalEnum[T any](dst *T, b []byte, parse func(string) (T, error)) error {
	v, err := parse(string(b))
	*dst = v
	return err
}
