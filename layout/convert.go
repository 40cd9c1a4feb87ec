package layout

import (
	"fmt"
	"math/bits"
	"sync"
)

// Source describes one NxDI contiguous per-layer cache tensor (K or V of one layer): shape
// (Batch, Heads, SeqLen, HeadDim), row-major, elements of the Geometry's DType. Transposed marks NxDI's
// transposed-K variant (Batch, Heads, HeadDim, SeqLen). NxDI's tiled variant (B, H, 128, S/128, D) is a view
// of the same bytes as BHSD, so it is described as a plain BHSD Source with SeqLen = S.
//
// Take the shape from the actual tensor, not from the model config: NxDI pads SeqLen (e.g. +128 with
// sequence-id masking) and Batch (attention DP).
type Source struct {
	Batch, Heads, SeqLen, HeadDim int
	Transposed                    bool
}

// Seq selects what to move for one request: the NxDI batch row, how many tokens are valid, which source
// heads the geometry's rank holds, and the block ids vLLM's scheduler assigned (in request order).
type Seq struct {
	// Row is the batch row (NxDI seq_id) holding the request.
	Row int
	// Tokens is the number of valid positions [0, Tokens); positions ≥ Tokens are never shipped as data
	// (NxDI writes padding KV there) and are zeroed in the paged output.
	Tokens int
	// FirstHead is the first source head copied; the geometry's NumKVHeads consecutive heads
	// [FirstHead, FirstHead+NumKVHeads) are moved. 0 when the source holds exactly this rank's heads; see
	// RankHeads for heterogeneous tensor parallelism.
	FirstHead int
	// BlockIDs are the scheduler's block ids: BlockIDs[j] receives positions [j·BlockSize, (j+1)·BlockSize).
	// Every id must be in 1..NumBlocks-1 (0 is vLLM's null block) and distinct; there must be at least
	// ceil(Tokens/BlockSize) of them. Extra ids are zero-filled.
	BlockIDs []int
}

// Bytes is the exact byte length of a tensor of this shape with elements of elemSize bytes, or an error
// if the shape is invalid or overflows.
func (s Source) Bytes(elemSize int) (int64, error) {
	if s.Batch <= 0 || s.Heads <= 0 || s.SeqLen <= 0 || s.HeadDim <= 0 || elemSize <= 0 {
		return 0, fmt.Errorf("%w: source shape (%d, %d, %d, %d) must be positive", ErrInvalidGeometry,
			s.Batch, s.Heads, s.SeqLen, s.HeadDim)
	}
	n, ok := mulChecked(int64(s.Batch), int64(s.Heads), int64(s.SeqLen), int64(s.HeadDim), int64(elemSize))
	if !ok || n > MaxTotalBytes {
		return 0, fmt.Errorf("%w: source shape (%d, %d, %d, %d) is too large", ErrInvalidGeometry,
			s.Batch, s.Heads, s.SeqLen, s.HeadDim)
	}
	return n, nil
}

// part says where one layer's K (or V) data sits inside a block of a region, per plan:
// element (t, h) of it starts at off + idx·stride with idx = t·H+h (NHD) or h·bs+t (HND),
// and holds rowLen bytes.
type part struct {
	off    int64 // byte offset of this K or V inside a block
	stride int64 // bytes between consecutive (t,h) rows
	rowLen int64 // bytes of one row (HeadDim·e)
}

func (g Geometry) part(kv KV) part {
	row := int64(g.RowBytes())
	switch g.Plan {
	case PlanKVHalves:
		return part{off: int64(kv) * g.KVBlockLen(), stride: row, rowLen: row}
	case PlanPackedKV:
		return part{off: int64(kv) * row, stride: 2 * row, rowLen: row}
	}
	return part{off: 0, stride: row, rowLen: row}
}

// rowIndex is the (t, h) row's index inside a block in the geometry's order.
func (g Geometry) rowIndex(t, h int) int64 {
	if g.Order == HND {
		return int64(h)*int64(g.BlockSize) + int64(t)
	}
	return int64(t)*int64(g.NumKVHeads) + int64(h)
}

// checkSeq validates everything a conversion between a Source and one region needs, before any byte moves.
func (g Geometry) checkSeq(regionLen int, kv KV, srcLen int, s Source, q Seq) error {
	if err := g.Validate(); err != nil {
		return err
	}
	if kv != K && kv != V {
		return fmt.Errorf("%w: %v is neither K nor V", ErrOutOfBounds, kv)
	}
	if int64(regionLen) != g.RegionLen() {
		return fmt.Errorf("%w: region buffer is %d bytes, geometry %v needs exactly RegionLen = %d", ErrSizeMismatch,
			regionLen, g, g.RegionLen())
	}
	want, err := s.Bytes(g.ElemSize())
	if err != nil {
		return err
	}
	if int64(srcLen) != want {
		return fmt.Errorf("%w: source buffer is %d bytes, shape (%d, %d, %d, %d) of %v needs %d", ErrSizeMismatch,
			srcLen, s.Batch, s.Heads, s.SeqLen, s.HeadDim, g.DType, want)
	}
	if s.HeadDim != g.HeadDim {
		return fmt.Errorf("%w: source head_dim %d differs from geometry head_dim %d", ErrSizeMismatch, s.HeadDim, g.HeadDim)
	}
	if q.Row < 0 || q.Row >= s.Batch {
		return fmt.Errorf("%w: batch row %d, source has %d rows", ErrOutOfBounds, q.Row, s.Batch)
	}
	if q.Tokens < 0 || q.Tokens > s.SeqLen {
		return fmt.Errorf("%w: %d tokens, source holds %d positions", ErrOutOfBounds, q.Tokens, s.SeqLen)
	}
	// Written as FirstHead > Heads-NumKVHeads so that a FirstHead near math.MaxInt cannot wrap the sum
	// (both Heads and NumKVHeads are positive and bounded here, so the difference cannot wrap either).
	if q.FirstHead < 0 || q.FirstHead > s.Heads-g.NumKVHeads {
		return fmt.Errorf("%w: %d heads from head %d requested, source has %d heads", ErrOutOfBounds,
			g.NumKVHeads, q.FirstHead, s.Heads)
	}
	return g.CheckBlockIDs(q.BlockIDs, q.Tokens)
}

// NeededBlocks is ceil(tokens/BlockSize): how many blocks hold tokens positions (0 for tokens ≤ 0). It
// cannot overflow, whatever tokens is. g must be valid (BlockSize > 0).
func (g Geometry) NeededBlocks(tokens int) int {
	if tokens <= 0 {
		return 0
	}
	n := tokens / g.BlockSize
	if tokens%g.BlockSize != 0 {
		n++
	}
	return n
}

// bitsetPool recycles the scratch used to detect duplicate block ids in long lists, so that validation
// allocates nothing in steady state.
var bitsetPool = sync.Pool{New: func() any { return new([]uint64) }}

// CheckBlockIDs validates a request's block ids against the geometry: each in 1..NumBlocks-1 (0 is the
// null block, ErrNullBlock; ≥ NumBlocks is ErrBlockOutOfRange), no duplicates (ErrDuplicateBlock), and at
// least NeededBlocks(tokens) of them (ErrTooFewBlocks). An invalid geometry is refused first
// (ErrInvalidGeometry). Pass tokens = 0 to check the ids alone; a negative
// tokens is refused (ErrOutOfBounds).
func (g Geometry) CheckBlockIDs(ids []int, tokens int) error {
	if err := g.Validate(); err != nil {
		return err
	}
	if tokens < 0 {
		return fmt.Errorf("%w: token count %d is negative", ErrOutOfBounds, tokens)
	}
	if need := g.NeededBlocks(tokens); len(ids) < need {
		return fmt.Errorf("%w: %d tokens at block size %d need %d blocks, got %d", ErrTooFewBlocks,
			tokens, g.BlockSize, need, len(ids))
	}
	for j, b := range ids {
		if b == 0 {
			return fmt.Errorf("%w: block_ids[%d] = 0", ErrNullBlock, j)
		}
		if b < 0 || b >= g.NumBlocks {
			return fmt.Errorf("%w: block_ids[%d] = %d, geometry has %d blocks (valid ids 1..%d); advertise a num_blocks ≥ the scheduler's pool",
				ErrBlockOutOfRange, j, b, g.NumBlocks, g.NumBlocks-1)
		}
	}
	return checkDistinct(ids, g.NumBlocks)
}

// checkDistinct reports the first duplicate in ids (all already in [0, n)).
func checkDistinct(ids []int, n int) error {
	if len(ids) <= 32 {
		for j := 1; j < len(ids); j++ {
			for i := 0; i < j; i++ {
				if ids[i] == ids[j] {
					return fmt.Errorf("%w: block id %d at positions %d and %d", ErrDuplicateBlock, ids[j], i, j)
				}
			}
		}
		return nil
	}
	p := bitsetPool.Get().(*[]uint64)
	words := n/64 + 1 // not (n+63)/64: cannot wrap
	if cap(*p) < words {
		*p = make([]uint64, words)
	}
	set := (*p)[:words]
	var err error
	for j, b := range ids {
		w, m := b/64, uint64(1)<<(uint(b)%64)
		if set[w]&m != 0 {
			err = fmt.Errorf("%w: block id %d repeated at position %d", ErrDuplicateBlock, b, j)
			break
		}
		set[w] |= m
	}
	for _, b := range ids { // clear only what was set, so reuse costs O(len(ids))
		set[b/64] = 0
	}
	bitsetPool.Put(p)
	return err
}

// ToPaged converts one layer's K or V from an NxDI contiguous tensor (src, shaped by s) into vLLM paged
// blocks inside dst, which must be exactly the region that holds this layer's kv (RegionLen bytes; use
// Region and RegionOffset to find it in an arena). For every j, BlockIDs[j] receives positions
// [j·BlockSize, (j+1)·BlockSize) of row q.Row, heads [q.FirstHead, q.FirstHead+NumKVHeads), in the
// geometry's order and plan. Positions ≥ q.Tokens in the last block, and all of any extra block, are
// zeroed. Only this kv's bytes of the listed blocks are written; the rest of dst is untouched.
//
// Everything is checked before the first byte is written: on error dst is unchanged. ToPaged does not
// allocate. It is safe to call concurrently for different (layer, kv) pairs, including K and V of one
// layer sharing a region (PlanKVHalves, PlanPackedKV): they write disjoint bytes. dst and src must not overlap.
func (g Geometry) ToPaged(dst []byte, kv KV, src []byte, s Source, q Seq) error {
	if err := g.checkSeq(len(dst), kv, len(src), s, q); err != nil {
		return err
	}
	if g.Order.IsCPUAttn() {
		g.toPagedCPU(dst, kv, src, s, q)
		return nil
	}
	pt := g.part(kv)
	e := int64(g.ElemSize())
	bs := g.BlockSize
	sD := int64(s.HeadDim) * e // bytes of one source (h, p) row
	sS := int64(s.SeqLen)
	g.eachHead(dst, q, func(blk []byte, _, h, p0, n int) {
		sh := s.headRow(q, h)
		if g.Order == HND && pt.stride == pt.rowLen {
			// One contiguous run per (block, head) in both source and destination.
			o := pt.off + int64(h)*int64(bs)*pt.rowLen
			if n > 0 && !s.Transposed {
				so := (sh*sS + int64(p0)) * sD
				copy(blk[o:o+int64(n)*pt.rowLen], src[so:so+int64(n)*sD])
			} else if n > 0 {
				gatherTransposed(blk[o:], pt.rowLen, src, s, sh, p0, n, e)
			}
			clear(blk[o+int64(n)*pt.rowLen : o+int64(bs)*pt.rowLen])
			return
		}
		for t := range bs {
			o := pt.off + g.rowIndex(t, h)*pt.stride
			row := blk[o : o+pt.rowLen]
			switch {
			case t >= n:
				clear(row)
			case s.Transposed:
				gatherTransposed(row, pt.rowLen, src, s, sh, p0+t, 1, e)
			default:
				so := (sh*sS + int64(p0+t)) * sD
				copy(row, src[so:so+sD])
			}
		}
	})
	return nil
}

// eachHead calls f for every block of q (at id b, its bytes blk inside region) and every head h of the
// geometry, with the request's first position p0 in the block and its valid tokens there, n (0 for the
// blocks past q.Tokens). It is the block walk of ToPaged, FromPaged and their CPU_ATTN forms.
func (g Geometry) eachHead(region []byte, q Seq, f func(blk []byte, b, h, p0, n int)) {
	blen, bs := g.BlockLen(), g.BlockSize
	for j, b := range q.BlockIDs {
		blk := region[int64(b)*blen : int64(b+1)*blen]
		p0 := j * bs
		n := min(max(q.Tokens-p0, 0), bs) // valid tokens in this block
		for h := range g.NumKVHeads {
			f(blk, b, h, p0, n)
		}
	}
}

// headRow is the (batch row, head) index in s of the geometry's head h of request q.
func (s Source) headRow(q Seq, h int) int64 {
	return int64(q.Row)*int64(s.Heads) + int64(q.FirstHead+h)
}

// gatherTransposed copies n consecutive positions p0.. of source head row sh from a transposed (B,H,D,S)
// tensor into dst, position i going to dst[i·step : i·step+D·e].
func gatherTransposed(dst []byte, step int64, src []byte, s Source, sh int64, p0, n int, e int64) {
	sS := int64(s.SeqLen)
	for d := range int64(s.HeadDim) {
		base := (sh*int64(s.HeadDim) + d) * sS
		for i := range int64(n) {
			so := (base + int64(p0) + i) * e
			do := i*step + d*e
			copy(dst[do:do+e], src[so:so+e])
		}
	}
}

// FromPaged is the inverse of ToPaged (the decode side, or Neuron as the decoder): it copies positions
// [0, q.Tokens) of the request's blocks back into row q.Row of the contiguous tensor dst (shaped by s),
// heads [q.FirstHead, q.FirstHead+NumKVHeads). Positions ≥ q.Tokens, other rows and other heads of dst are
// left untouched. src must be exactly the region that holds this layer's kv. Checks, concurrency and
// allocation behave as for ToPaged.
func (g Geometry) FromPaged(dst []byte, s Source, kv KV, src []byte, q Seq) error {
	if err := g.checkSeq(len(src), kv, len(dst), s, q); err != nil {
		return err
	}
	if g.Order.IsCPUAttn() {
		g.fromPagedCPU(dst, s, kv, src, q)
		return nil
	}
	pt := g.part(kv)
	e := int64(g.ElemSize())
	bs := g.BlockSize
	sD := int64(s.HeadDim) * e
	sS := int64(s.SeqLen)
	g.eachHead(src, q, func(blk []byte, _, h, p0, n int) {
		if n == 0 {
			return // past the request's tokens: nothing to read
		}
		sh := s.headRow(q, h)
		if g.Order == HND && pt.stride == pt.rowLen && !s.Transposed {
			o := pt.off + int64(h)*int64(bs)*pt.rowLen
			do := (sh*sS + int64(p0)) * sD
			copy(dst[do:do+int64(n)*sD], blk[o:o+int64(n)*pt.rowLen])
			return
		}
		for t := range n {
			o := pt.off + g.rowIndex(t, h)*pt.stride
			row := blk[o : o+pt.rowLen]
			if s.Transposed {
				scatterTransposed(dst, s, sh, p0+t, row, e)
				continue
			}
			do := (sh*sS + int64(p0+t)) * sD
			copy(dst[do:do+sD], row)
		}
	})
	return nil
}

// scatterTransposed writes one (h, p) row into a transposed (B,H,D,S) tensor.
func scatterTransposed(dst []byte, s Source, sh int64, p int, row []byte, e int64) {
	sS := int64(s.SeqLen)
	for d := range int64(s.HeadDim) {
		do := ((sh*int64(s.HeadDim)+d)*sS + int64(p)) * e
		copy(dst[do:do+e], row[d*e:d*e+e])
	}
}

// Reorder converts the listed blocks of a whole region (all blocks when blockIDs is nil) from the
// geometry's Order into the other order: NHD → HND or HND → NHD, writing dst. Both buffers must be exactly
// RegionLen bytes and must not overlap; blocks not listed are left untouched in dst. In PlanKVHalves each
// half is transposed on its own; in PlanPackedKV a row carries K and V together (2·HeadDim elements).
// Block ids here are physical positions, so 0 is allowed. Reorder does not allocate. A CPUAttn geometry is
// refused (ErrUnsupportedLayout).
func (g Geometry) Reorder(dst, src []byte, blockIDs []int) error {
	if err := g.Validate(); err != nil {
		return err
	}
	if g.Order.IsCPUAttn() {
		return fmt.Errorf("%w: Reorder converts NHD ↔ HND blocks; %v blocks are written and read with ToPaged/FromPaged/BlocksToPaged",
			ErrUnsupportedLayout, g.Order)
	}
	if int64(len(dst)) != g.RegionLen() || int64(len(src)) != g.RegionLen() {
		return fmt.Errorf("%w: Reorder needs two buffers of RegionLen = %d bytes, got %d and %d", ErrSizeMismatch,
			g.RegionLen(), len(dst), len(src))
	}
	for j, b := range blockIDs {
		if b < 0 || b >= g.NumBlocks {
			return fmt.Errorf("%w: block_ids[%d] = %d, geometry has %d blocks", ErrBlockOutOfRange, j, b, g.NumBlocks)
		}
	}
	if blockIDs == nil {
		for b := range g.NumBlocks {
			g.reorderBlock(dst, src, b)
		}
		return nil
	}
	for _, b := range blockIDs {
		g.reorderBlock(dst, src, b)
	}
	return nil
}

// reorderBlock transposes the (t, h) grid of one block, per part.
func (g Geometry) reorderBlock(dst, src []byte, b int) {
	blen := g.BlockLen()
	d := dst[int64(b)*blen : int64(b+1)*blen]
	s := src[int64(b)*blen : int64(b+1)*blen]
	parts, row := 1, int64(g.RowBytes())
	switch g.Plan {
	case PlanKVHalves:
		parts = 2
	case PlanPackedKV:
		row *= 2
	}
	plen := blen / int64(parts)
	bs, nh := int64(g.BlockSize), int64(g.NumKVHeads)
	for p := range int64(parts) {
		for t := range bs {
			for h := range nh {
				var so, do int64
				if g.Order == NHD { // src NHD → dst HND
					so, do = (t*nh+h)*row, (h*bs+t)*row
				} else {
					so, do = (h*bs+t)*row, (t*nh+h)*row
				}
				copy(d[p*plen+do:p*plen+do+row], s[p*plen+so:p*plen+so+row])
			}
		}
	}
}

// Swapped returns g with the other block order (NHD ↔ HND); any other order is returned unchanged.
func (g Geometry) Swapped() Geometry {
	if g.Order == NHD {
		g.Order = HND
	} else if g.Order == HND {
		g.Order = NHD
	}
	return g
}

// BlockSource describes an NxDI block-layout cache tensor of one layer's K or V: NumBlocks blocks of
// BlockSize tokens, in Order (NHD for NxDI's prefix-caching layout (nb+1, bs, H, D), HND for its
// chunked-prefill layout (nb, H, bs, D)). In NxDI's block mode block ids equal vLLM's, so blocks move
// by identity.
type BlockSource struct {
	NumBlocks int
	Order     BlockOrder
}

// BlocksToPaged copies the listed blocks of an NxDI block-layout tensor src into the same block ids of
// the region dst (this layer's kv), converting the intra-block order if it differs from the geometry's.
// The source's heads, head_dim, block size and dtype must equal the geometry's. Block id checks are those
// of CheckBlockIDs (ids must also be < src.NumBlocks); nothing is written on error. No allocation. Into a
// CPUAttn geometry the rows are repacked (K transposed per head).
func (g Geometry) BlocksToPaged(dst []byte, kv KV, src []byte, s BlockSource, blockIDs []int) error {
	if err := g.Validate(); err != nil {
		return err
	}
	if kv != K && kv != V {
		return fmt.Errorf("%w: %v is neither K nor V", ErrOutOfBounds, kv)
	}
	if (s.Order != NHD && s.Order != HND) || s.NumBlocks <= 0 || s.NumBlocks > MaxNumBlocks {
		return fmt.Errorf("%w: block source needs an order and 1..%d blocks, got %v and %d", ErrInvalidGeometry,
			MaxNumBlocks, s.Order, s.NumBlocks)
	}
	if int64(len(dst)) != g.RegionLen() {
		return fmt.Errorf("%w: region buffer is %d bytes, want RegionLen = %d", ErrSizeMismatch, len(dst), g.RegionLen())
	}
	kvb := g.KVBlockLen()
	if hi, lo := bits.Mul64(uint64(s.NumBlocks), uint64(kvb)); hi != 0 || lo != uint64(len(src)) {
		return fmt.Errorf("%w: block source is %d bytes, %d blocks of %d bytes need %d", ErrSizeMismatch,
			len(src), s.NumBlocks, kvb, int64(s.NumBlocks)*kvb)
	}
	if err := g.CheckBlockIDs(blockIDs, 0); err != nil {
		return err
	}
	for j, b := range blockIDs {
		if b >= s.NumBlocks {
			return fmt.Errorf("%w: block_ids[%d] = %d, source has %d blocks", ErrBlockOutOfRange, j, b, s.NumBlocks)
		}
	}
	if g.Order.IsCPUAttn() {
		g.blocksToPagedCPU(dst, kv, src, s, blockIDs)
		return nil
	}
	pt := g.part(kv)
	blen := g.BlockLen()
	bs, nh := g.BlockSize, g.NumKVHeads
	for _, b := range blockIDs {
		sb := src[int64(b)*kvb : int64(b+1)*kvb]
		db := dst[int64(b)*blen : int64(b+1)*blen]
		if s.Order == g.Order && pt.stride == pt.rowLen {
			copy(db[pt.off:pt.off+kvb], sb)
			continue
		}
		for t := range bs {
			for h := range nh {
				var si int64
				if s.Order == HND {
					si = int64(h)*int64(bs) + int64(t)
				} else {
					si = int64(t)*int64(nh) + int64(h)
				}
				o := pt.off + g.rowIndex(t, h)*pt.stride
				copy(db[o:o+pt.rowLen], sb[si*pt.rowLen:(si+1)*pt.rowLen])
			}
		}
	}
	return nil
}
