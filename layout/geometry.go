package layout

import (
	"fmt"
	"math"
	"math/bits"
)

// Limits applied by Validate. They are far above any real model and exist to refuse absurd values (for
// example a garbled handshake) before they turn into huge allocations or overflowing offsets.
const (
	MaxLayers     = 1 << 12 // 4096 layers
	MaxBlockSize  = 1 << 16 // tokens per block
	MaxKVHeads    = 1 << 12 // KV heads per rank
	MaxHeadDim    = 1 << 14 // elements per head
	MaxNumBlocks  = 1 << 30 // blocks per region
	MaxTotalBytes = 1 << 50 // 1 PiB for the whole arena
	MaxDescs      = 1 << 31 // descriptors in a full local list
)

// Geometry describes one rank's paged KV cache as vLLM's NixlConnector registers it: how many regions,
// how long a block is in bytes, and what order the elements take inside a block. All byte sizes are derived
// from these fields; none is stored.
//
// NumKVHeads is the number of KV heads held by this rank (after tensor-parallel sharding).
//
// A Geometry is a small value; it is safe to copy and to use from several goroutines at once.
type Geometry struct {
	NumLayers, NumBlocks, BlockSize, NumKVHeads, HeadDim int
	DType                                                DType
	Order                                                BlockOrder
	Plan                                                 RegionPlan
}

// Validate checks every field and that all derived sizes fit the package limits without overflow. The
// error wraps ErrInvalidGeometry and names the offending field. Every other method assumes a valid Geometry.
func (g Geometry) Validate() error {
	check := func(name string, v, max int) error {
		if v <= 0 || v > max {
			return fmt.Errorf("%w: %s = %d, want 1..%d", ErrInvalidGeometry, name, v, max)
		}
		return nil
	}
	if err := check("NumLayers", g.NumLayers, MaxLayers); err != nil {
		return err
	}
	if err := check("NumBlocks", g.NumBlocks, MaxNumBlocks); err != nil {
		return err
	}
	if err := check("BlockSize", g.BlockSize, MaxBlockSize); err != nil {
		return err
	}
	if err := check("NumKVHeads", g.NumKVHeads, MaxKVHeads); err != nil {
		return err
	}
	if err := check("HeadDim", g.HeadDim, MaxHeadDim); err != nil {
		return err
	}
	if !g.DType.Valid() {
		return fmt.Errorf("%w: DType %v is not set or unknown (want BF16, FP16, FP32, FP8E4M3 or FP8E5M2)", ErrInvalidGeometry, g.DType)
	}
	if !g.Order.Valid() {
		return fmt.Errorf("%w: Order %v is not set (want NHD, HND, CPUAttn or CPUAttnAMX; vLLM's NixlConnector uses HND)", ErrInvalidGeometry, g.Order)
	}
	if !g.Plan.Valid() {
		return fmt.Errorf("%w: Plan %v is not set (want PlanSplitKV, PlanKVHalves or PlanPackedKV)", ErrInvalidGeometry, g.Plan)
	}
	if g.Order.IsCPUAttn() {
		if g.Plan == PlanKVHalves {
			return fmt.Errorf("%w: CPU_ATTN in %v: vLLM 0.23–0.25 (era B) cannot register a CPU_ATTN cache with its NixlConnector "+
				"(the cache is (num_blocks, heads, block_size, 2·head_dim) and register_kv_caches fails); use a release of era A or C", ErrUnsupportedLayout, g.Plan)
		}
		if g.DType == FP8E4M3 || g.DType == FP8E5M2 {
			return fmt.Errorf("%w: CPU_ATTN with a %v cache: its fp8 packing is not modelled (vLLM: \"FP8 KV cache is not yet "+
				"supported with KV transfer on CPU\")", ErrUnsupportedLayout, g.DType)
		}
	}
	if g.Order == CPUAttnAMX {
		if g.DType != BF16 {
			return fmt.Errorf("%w: CPU_ATTN_AMX with a %v cache: vLLM packs only bf16 caches for AMX (other dtypes are CPUAttn)",
				ErrInvalidGeometry, g.DType)
		}
		if g.BlockSize%32 != 0 || g.HeadDim%32 != 0 {
			return fmt.Errorf("%w: CPU_ATTN_AMX with BlockSize %d and HeadDim %d: AMX's packing needs multiples of 32 for both "+
				"(vLLM picks another kernel, packing CPUAttn, otherwise)", ErrInvalidGeometry, g.BlockSize, g.HeadDim)
		}
	}
	total, ok := mulChecked(int64(g.NumRegions()), int64(g.NumBlocks), g.BlockLen())
	if !ok || total > MaxTotalBytes {
		return fmt.Errorf("%w: arena of %d regions × %d blocks × %d bytes exceeds %d bytes", ErrInvalidGeometry,
			g.NumRegions(), g.NumBlocks, g.BlockLen(), int64(MaxTotalBytes))
	}
	if n, ok := mulChecked(int64(g.NumDescRegions()), int64(g.NumBlocks)); !ok || n > MaxDescs {
		return fmt.Errorf("%w: %d descriptor regions × %d blocks exceeds %d descriptors", ErrInvalidGeometry,
			g.NumDescRegions(), g.NumBlocks, MaxDescs)
	}
	return nil
}

// mulChecked multiplies non-negative values, reporting false on int64 overflow.
func mulChecked(vs ...int64) (int64, bool) {
	p := uint64(1)
	for _, v := range vs {
		if v < 0 {
			return 0, false
		}
		hi, lo := bits.Mul64(p, uint64(v))
		if hi != 0 || lo > math.MaxInt64 {
			return 0, false
		}
		p = lo
	}
	return int64(p), true
}

// ElemSize is the element size in bytes (DType.Size()).
func (g Geometry) ElemSize() int { return g.DType.Size() }

// TokenBytes is the bytes one token occupies in one K (or V) block: NumKVHeads·HeadDim·ElemSize.
func (g Geometry) TokenBytes() int64 {
	return int64(g.NumKVHeads) * int64(g.HeadDim) * int64(g.ElemSize())
}

// RowBytes is the bytes of one (token, head) row of one K (or V): HeadDim·ElemSize.
func (g Geometry) RowBytes() int { return g.HeadDim * g.ElemSize() }

// KVBlockLen is the bytes of one block's K (or V) data: BlockSize·TokenBytes. In PlanSplitKV this is the
// whole block; in PlanKVHalves it is one half; in PlanPackedKV K and V are interleaved per row.
func (g Geometry) KVBlockLen() int64 { return int64(g.BlockSize) * g.TokenBytes() }

// NumRegions is the number of registered regions, i.e. len(kv_caches_base_addr): 2·NumLayers for
// PlanSplitKV (K0, V0, K1, V1, ...), NumLayers otherwise.
func (g Geometry) NumRegions() int { return g.Plan.info().regionsPerL * g.NumLayers }

// BlockLen is the bytes of one block in one registered region, i.e. vLLM's block_len / block_lens entry:
// KVBlockLen for PlanSplitKV, 2·KVBlockLen for PlanKVHalves and PlanPackedKV.
func (g Geometry) BlockLen() int64 { return int64(g.Plan.info().blockKVFactor) * g.KVBlockLen() }

// RegionLen is the bytes of one registered region: NumBlocks·BlockLen.
func (g Geometry) RegionLen() int64 { return int64(g.NumBlocks) * g.BlockLen() }

// TotalBytes is the bytes of all regions: NumRegions·RegionLen.
func (g Geometry) TotalBytes() int64 { return int64(g.NumRegions()) * g.RegionLen() }

// NumDescRegions is the number of "descriptor regions" in vLLM's descriptor lists: PlanKVHalves walks each
// registered region twice (K halves, then V halves), so it has 2·NumLayers; the others equal NumRegions.
func (g Geometry) NumDescRegions() int { return g.Plan.info().descParts * g.NumRegions() }

// DescLen is the length of one descriptor: BlockLen, or BlockLen/2 for PlanKVHalves.
func (g Geometry) DescLen() int64 { return g.BlockLen() / int64(g.Plan.info().descParts) }

// NumDescs is the length of the full local descriptor list: NumDescRegions·NumBlocks.
func (g Geometry) NumDescs() int { return g.NumDescRegions() * g.NumBlocks }

// Region returns the index of the registered region that holds layer's K or V (in PlanKVHalves and
// PlanPackedKV both live in region layer).
func (g Geometry) Region(layer int, kv KV) (int, error) {
	if layer < 0 || layer >= g.NumLayers {
		return 0, fmt.Errorf("%w: layer %d, geometry has %d layers", ErrOutOfBounds, layer, g.NumLayers)
	}
	if kv != K && kv != V {
		return 0, fmt.Errorf("%w: %v is neither K nor V", ErrOutOfBounds, kv)
	}
	if g.Plan == PlanSplitKV {
		return 2*layer + int(kv), nil
	}
	return layer, nil
}

// RegionOffset is the byte offset of region r inside a single contiguous arena that holds all regions
// back to back (r·RegionLen); handy when one allocation backs every region.
func (g Geometry) RegionOffset(r int) int64 { return int64(r) * g.RegionLen() }

// String summarises the geometry, e.g. "28L×2 split-kv HND bf16 nb=9 bs=16 h=8 d=128".
func (g Geometry) String() string {
	return fmt.Sprintf("%dL %v %v %v nb=%d bs=%d h=%d d=%d", g.NumLayers, g.Plan, g.Order, g.DType,
		g.NumBlocks, g.BlockSize, g.NumKVHeads, g.HeadDim)
}
