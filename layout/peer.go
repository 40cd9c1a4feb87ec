package layout

import "fmt"

// Peer is what a vLLM NixlConnector handshake (NixlAgentMetadata) says about the other side's KV cache:
// len(kv_caches_base_addr), num_blocks, block_lens, block_size and kv_cache_layout. It is external input.
type Peer struct {
	NumRegions    int
	NumBlocks     int
	BlockLens     []int64
	BlockSize     int
	KVCacheLayout string
	// Order, when set, is the physical block order of the peer's bytes and KVCacheLayout is not parsed: vLLM
	// 0.29+ names its layouts "LBHNC"/"LBNHC" (protocol.Profile.ParseLayoutName maps a release's names), and
	// some peers publish a label that is not their bytes' order.
	Order BlockOrder
}

// PeerGeometry derives the peer's Geometry from its handshake, taking what the handshake does not carry
// (plan, dtype, head_dim, layer count) from local. It refuses anything inconsistent: a region count other
// than local's, unequal block_lens, a block_len that is not a whole number of heads for the given block
// size, dtype and plan, or values beyond the package limits. Errors wrap ErrInvalidGeometry or
// ErrBlockLenMismatch; it never panics, whatever the input.
func PeerGeometry(local Geometry, p Peer) (Geometry, error) {
	if err := local.Validate(); err != nil {
		return Geometry{}, fmt.Errorf("local: %w", err)
	}
	order := p.Order
	if order == 0 {
		var err error
		if order, err = ParseBlockOrder(p.KVCacheLayout); err != nil {
			return Geometry{}, err
		}
	} else if !order.Valid() {
		return Geometry{}, fmt.Errorf("%w: peer block order %v (want NHD or HND)", ErrInvalidGeometry, order)
	}
	if p.NumRegions != local.NumRegions() {
		return Geometry{}, fmt.Errorf("%w: peer has %d regions, local %v has %d (different model, layer count or plan)",
			ErrBlockLenMismatch, p.NumRegions, local, local.NumRegions())
	}
	if len(p.BlockLens) != p.NumRegions {
		return Geometry{}, fmt.Errorf("%w: peer sends %d block_lens for %d regions", ErrBlockLenMismatch, len(p.BlockLens), p.NumRegions)
	}
	if p.BlockSize <= 0 || p.BlockSize > MaxBlockSize {
		return Geometry{}, fmt.Errorf("%w: peer block_size %d, want 1..%d", ErrInvalidGeometry, p.BlockSize, MaxBlockSize)
	}
	bl := p.BlockLens[0]
	for i, l := range p.BlockLens {
		if l != bl {
			return Geometry{}, fmt.Errorf("%w: peer block_lens[%d] = %d differs from block_lens[0] = %d", ErrBlockLenMismatch, i, l, bl)
		}
	}
	perHead := int64(local.Plan.info().blockKVFactor) * int64(p.BlockSize) * int64(local.HeadDim) * int64(local.ElemSize())
	if bl <= 0 || bl%perHead != 0 || bl/perHead > MaxKVHeads {
		return Geometry{}, fmt.Errorf("%w: peer block_len %d is not a whole number of heads of %d bytes (block_size %d, head_dim %d, %v, %v)",
			ErrBlockLenMismatch, bl, perHead, p.BlockSize, local.HeadDim, local.DType, local.Plan)
	}
	g := Geometry{
		NumLayers: local.NumLayers, NumBlocks: p.NumBlocks, BlockSize: p.BlockSize, NumKVHeads: int(bl / perHead),
		HeadDim: local.HeadDim, DType: local.DType, Order: order, Plan: local.Plan,
	}
	if err := g.Validate(); err != nil {
		return Geometry{}, fmt.Errorf("peer: %w", err)
	}
	return g, nil
}
