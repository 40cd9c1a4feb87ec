package layout

import (
	"fmt"
	"math"
	"slices"
)

// Desc is one NIXL transfer descriptor: a byte range on a device. It has exactly the field set of
// nixl.Desc, so callers convert with nixl.Desc(d), or a list with nixl.DescsOf (this package imports nothing
// of gonixl's).
type Desc struct {
	Addr, Len, DevID uint64
}

// checkBases validates region base addresses: one per region, non-zero, no region wrapping around the
// address space, no two regions overlapping.
func (g Geometry) checkBases(bases []uint64) error {
	if len(bases) != g.NumRegions() {
		return fmt.Errorf("%w: %d region base addresses, geometry %v has %d regions", ErrSizeMismatch,
			len(bases), g, g.NumRegions())
	}
	rl := uint64(g.RegionLen())
	for i, b := range bases {
		if b == 0 {
			return fmt.Errorf("%w: region %d has base address 0", ErrInvalidGeometry, i)
		}
		if b > math.MaxUint64-rl {
			return fmt.Errorf("%w: region %d at %#x + %d bytes wraps the address space", ErrInvalidGeometry, i, b, rl)
		}
	}
	if len(bases) > 1 {
		sorted := slices.Clone(bases)
		slices.Sort(sorted)
		for i := 1; i < len(sorted); i++ {
			if sorted[i] < sorted[i-1]+rl {
				return fmt.Errorf("%w: regions at %#x and %#x overlap (region length %d)", ErrInvalidGeometry,
					sorted[i-1], sorted[i], rl)
			}
		}
	}
	return nil
}

// Descs returns the full local descriptor list exactly as vLLM registers it for prep_xfer_dlist
// ("NIXL_INIT_AGENT"): for each registered region r in order, for each block b in 0..NumBlocks-1,
// (regionBases[r] + b·BlockLen, DescLen, devID). In PlanKVHalves each region is walked twice, first the K
// halves of all its blocks, then the V halves at +BlockLen/2, so descriptor region 2l is layer l's K and
// 2l+1 its V (vLLM's "virtual regions"). The result has NumDescs entries.
//
// regionBases must hold NumRegions non-zero, non-overlapping addresses (vLLM's kv_caches_base_addr).
func (g Geometry) Descs(regionBases []uint64, devID uint64) ([]Desc, error) {
	if err := g.Validate(); err != nil {
		return nil, err
	}
	return g.AppendDescs(make([]Desc, 0, g.NumDescs()), regionBases, devID)
}

// AppendDescs is Descs appending to dst (no allocation when dst has room).
func (g Geometry) AppendDescs(dst []Desc, regionBases []uint64, devID uint64) ([]Desc, error) {
	if err := g.Validate(); err != nil {
		return dst, err
	}
	if err := g.checkBases(regionBases); err != nil {
		return dst, err
	}
	return appendBlockDescs(dst, g, regionBases, 1, 0, uint64(g.DescLen()), 1, 0, devID), nil
}

// appendBlockDescs walks regions × (halves) × sub-blocks the way vLLM builds its lists:
// sub-blocks of stride BlockLen/ratio (NumBlocks·ratio of them per region), descriptor length dlen,
// each desc shifted by offset, and in PlanKVHalves the V pass at +halfLen (the region's BlockLen/2/ratio
// on the local side, P's BlockLen/2 on the remote side). chunks/chunk cut a desc into pieces (P_tp > D_tp).
func appendBlockDescs(dst []Desc, g Geometry, bases []uint64, ratio int, offset, dlen uint64, chunks, chunk int, devID uint64) []Desc {
	stride := uint64(g.BlockLen()) / uint64(ratio)
	n := g.NumBlocks * ratio
	half := stride / 2
	passes := g.Plan.info().descParts
	l := dlen / uint64(chunks)
	shift := uint64(chunk) * l
	for _, base := range bases {
		for pass := range passes {
			po := uint64(pass) * half
			for b := range n {
				dst = append(dst, Desc{Addr: base + uint64(b)*stride + po + offset + shift, Len: l, DevID: devID})
			}
		}
	}
	return dst
}

// DescIndices returns the descriptor indices of the given blocks in every descriptor region, region-major,
// exactly as vLLM's _get_block_descs_ids: for r in 0..NumDescRegions-1, for b in blockIDs: r·NumBlocks + b.
// Ids are checked first (CheckBlockIDs): an id ≥ NumBlocks would silently alias into region r+1, so it is
// refused, as are the null block 0 and duplicates. The result is appended to dst[:0]; pass a dst of
// capacity NumDescRegions·len(blockIDs) to avoid allocation.
func (g Geometry) DescIndices(blockIDs []int, dst []int) ([]int, error) {
	if err := g.Validate(); err != nil {
		return dst[:0], err
	}
	if err := g.CheckBlockIDs(blockIDs, 0); err != nil {
		return dst[:0], err
	}
	return appendIndices(dst[:0], g.NumDescRegions(), g.NumBlocks, blockIDs), nil
}

func appendIndices(dst []int, regions, stride int, ids []int) []int {
	for r := range regions {
		for _, b := range ids {
			dst = append(dst, r*stride+b)
		}
	}
	return dst
}

// DescIndex returns the index of (layer, kv, block) in the local descriptor list, or an error if any
// coordinate is out of range. In PlanPackedKV both K and V live in the same descriptor.
func (g Geometry) DescIndex(layer int, kv KV, block int) (int, error) {
	r, err := g.Region(layer, kv)
	if err != nil {
		return 0, err
	}
	if block < 0 || block >= g.NumBlocks {
		return 0, fmt.Errorf("%w: block %d, geometry has %d blocks", ErrBlockOutOfRange, block, g.NumBlocks)
	}
	if g.Plan == PlanKVHalves {
		r = 2*layer + int(kv)
	}
	return r*g.NumBlocks + block, nil
}

// CheckBlockLens compares a peer's advertised block_lens (one per region) with this geometry: count and
// every value must match (ErrBlockLenMismatch otherwise). Use it on the homogeneous-TP path, where vLLM
// requires remote block_len == local block_len; NewReadPlan covers the heterogeneous cases.
func (g Geometry) CheckBlockLens(blockLens []int64) error {
	if len(blockLens) != g.NumRegions() {
		return fmt.Errorf("%w: peer advertises %d block_lens, geometry %v has %d regions", ErrBlockLenMismatch,
			len(blockLens), g, g.NumRegions())
	}
	for i, l := range blockLens {
		if l != g.BlockLen() {
			return fmt.Errorf("%w: block_lens[%d] = %d, geometry %v has %d (check dtype, heads per rank, block size and plan)",
				ErrBlockLenMismatch, i, l, g, g.BlockLen())
		}
	}
	return nil
}

// BlockLens returns NumRegions copies of BlockLen: the handshake's block_lens.
func (g Geometry) BlockLens() []int64 {
	out := make([]int64, g.NumRegions())
	for i := range out {
		out[i] = g.BlockLen()
	}
	return out
}

// CoversScheduler checks that the geometry's NumBlocks is at least the scheduler's pool size
// (kv_cache_config.num_blocks, null block included): the decode peer may ask for any id the prefill
// scheduler can hand out.
func (g Geometry) CoversScheduler(schedulerNumBlocks int) error {
	if schedulerNumBlocks > g.NumBlocks {
		return fmt.Errorf("%w: scheduler pool has %d blocks, geometry advertises only %d; size the arena from the pool (e.g. --num-gpu-blocks-override)",
			ErrBlockOutOfRange, schedulerNumBlocks, g.NumBlocks)
	}
	return nil
}
