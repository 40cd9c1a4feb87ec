package layout

import (
	"encoding/binary"
	"errors"
	"math"
	"math/big"
	"testing"
)

// Fuzz targets for the validators that see external input (handshake values, configuration, block ids
// from the scheduler or the wire). Seeds come from ../testdata/layout/geometries.json.

func addGeomSeeds(f *testing.F) {
	valid, invalid := geomVectors(f)
	for _, v := range append(valid, invalid...) {
		g := v.Geometry
		f.Add(int64(g.NumLayers), int64(g.NumBlocks), int64(g.BlockSize), int64(g.NumKVHeads), int64(g.HeadDim),
			uint8(g.DType), uint8(g.Order), uint8(g.Plan))
	}
}

func geomFrom(l, nb, bs, h, d int64, dt, o, p uint8) Geometry {
	return Geometry{NumLayers: int(l), NumBlocks: int(nb), BlockSize: int(bs), NumKVHeads: int(h), HeadDim: int(d),
		DType: DType(dt), Order: BlockOrder(o), Plan: RegionPlan(p)}
}

// FuzzGeometry: Validate never panics, and whenever it accepts, every derived size is exact (checked with
// big integers) and within the limits.
func FuzzGeometry(f *testing.F) {
	addGeomSeeds(f)
	f.Fuzz(func(t *testing.T, l, nb, bs, h, d int64, dt, o, p uint8) {
		g := geomFrom(l, nb, bs, h, d, dt, o, p)
		err := g.Validate()
		if err != nil {
			if !errors.Is(err, ErrInvalidGeometry) {
				t.Fatalf("Validate error does not wrap ErrInvalidGeometry: %v", err)
			}
			return
		}
		if int64(g.NumLayers) != l || int64(g.NumBlocks) != nb { // int truncation on 32-bit
			t.Skip()
		}
		factor := int64(1)
		if g.Plan != PlanSplitKV {
			factor = 2
		}
		bl := new(big.Int).SetInt64(factor)
		for _, x := range []int64{bs, h, d, int64(g.DType.Size())} {
			bl.Mul(bl, big.NewInt(x))
		}
		regions := l
		if g.Plan == PlanSplitKV {
			regions = 2 * l
		}
		total := new(big.Int).Mul(bl, big.NewInt(nb))
		total.Mul(total, big.NewInt(regions))
		if bl.Int64() != g.BlockLen() || total.Int64() != g.TotalBytes() || total.Cmp(big.NewInt(MaxTotalBytes)) > 0 {
			t.Fatalf("%v: BlockLen %d TotalBytes %d, exact %v %v", g, g.BlockLen(), g.TotalBytes(), bl, total)
		}
		if int64(g.NumRegions()) != regions || g.RegionLen()*int64(g.NumRegions()) != g.TotalBytes() {
			t.Fatalf("%v: inconsistent region sizes", g)
		}
		if g.DescLen()*int64(g.NumDescRegions()) != g.BlockLen()*int64(g.NumRegions()) {
			t.Fatalf("%v: descriptors do not tile the blocks", g)
		}
	})
}

// FuzzPeerGeometry: whatever a peer's handshake says, PeerGeometry never panics, and what it accepts is a
// valid geometry whose block_len equals the advertised one.
func FuzzPeerGeometry(f *testing.F) {
	f.Add(int64(56), int64(9), int64(32768), int64(16), "HND", int64(0))
	f.Add(int64(56), int64(100), int64(16384), int64(16), "NHD", int64(0))
	f.Add(int64(56), int64(1<<40), int64(-1), int64(0), "hnd", int64(3))
	f.Add(int64(28), int64(9), int64(65536), int64(16), "HND", int64(5))
	f.Fuzz(func(t *testing.T, regions, nb, blockLen, bs int64, layout string, skew int64) {
		local := qwen3()
		if regions < 0 || regions > 4096 {
			return
		}
		lens := make([]int64, regions)
		for i := range lens {
			lens[i] = blockLen
		}
		if regions > 0 && skew != 0 {
			lens[int(uint64(skew)%uint64(regions))] += skew
		}
		g, err := PeerGeometry(local, Peer{NumRegions: int(regions), NumBlocks: int(nb), BlockLens: lens, BlockSize: int(bs), KVCacheLayout: layout})
		if err != nil {
			if !errors.Is(err, ErrInvalidGeometry) && !errors.Is(err, ErrBlockLenMismatch) {
				t.Fatalf("unexpected error class: %v", err)
			}
			return
		}
		if g.Validate() != nil || g.BlockLen() != blockLen || int64(g.NumBlocks) != nb || g.NumRegions() != int(regions) {
			t.Fatalf("accepted inconsistent peer: %v from block_len %d nb %d", g, blockLen, nb)
		}
		if err := g.CheckBlockLens(lens); err != nil {
			t.Fatalf("accepted geometry rejects its own block_lens: %v", err)
		}
	})
}

// FuzzBlockIDs: block ids from the wire are either refused with a sentinel or yield indices that stay
// inside the descriptor list, one region per stride (no aliasing).
func FuzzBlockIDs(f *testing.F) {
	f.Add(int64(9), []byte{1, 0, 2, 0})
	f.Add(int64(4), []byte{4, 0})        // C16: id == NB
	f.Add(int64(4), []byte{0, 0})        // null block
	f.Add(int64(40), []byte{3, 0, 3, 0}) // duplicate
	f.Add(int64(1000), make([]byte, 200))
	f.Fuzz(func(t *testing.T, nb int64, raw []byte) {
		g := Geometry{NumLayers: 2, NumBlocks: int(nb), BlockSize: 16, NumKVHeads: 1, HeadDim: 8, DType: FP8E4M3, Order: HND, Plan: PlanKVHalves}
		if g.Validate() != nil {
			return
		}
		ids := make([]int, len(raw)/2)
		for i := range ids {
			ids[i] = int(int16(binary.LittleEndian.Uint16(raw[2*i:])))
		}
		idx, err := g.DescIndices(ids, nil)
		if err != nil {
			if !errors.Is(err, ErrBlockOutOfRange) && !errors.Is(err, ErrNullBlock) && !errors.Is(err, ErrDuplicateBlock) {
				t.Fatalf("unexpected error class: %v", err)
			}
			return
		}
		for k, x := range idx {
			if x < 0 || x >= g.NumDescs() || x/g.NumBlocks != k/len(ids) {
				t.Fatalf("index %d = %d escapes its region (nb %d)", k, x, nb)
			}
		}
	})
}

// FuzzToPaged: with arbitrary shapes, rows, token counts, heads and ids (buffers sized from a possibly
// different shape), ToPaged either succeeds or fails without touching the region, and never panics.
func FuzzToPaged(f *testing.F) {
	f.Add(uint8(4), uint8(2), uint8(1), uint8(2), uint8(1), uint8(4), uint8(0), int16(4), int16(0), []byte{1, 2}, uint8(0))
	f.Add(uint8(6), uint8(2), uint8(2), uint8(2), uint8(2), uint8(5), uint8(1), int16(5), int16(1), []byte{5, 2, 3}, uint8(3))
	f.Add(uint8(4), uint8(2), uint8(1), uint8(2), uint8(1), uint8(4), uint8(0), int16(9), int16(0), []byte{0, 4, 4}, uint8(1))
	f.Fuzz(func(t *testing.T, nb, bs, h, d, batch, seq, row uint8, tokens, firstHead int16, rawIDs []byte, variant uint8) {
		g := Geometry{NumLayers: 1, NumBlocks: int(nb % 16), BlockSize: int(bs % 8), NumKVHeads: int(h % 4), HeadDim: int(d % 5),
			DType: BF16, Order: BlockOrder(1 + variant%2), Plan: RegionPlan(1 + (variant/2)%3)}
		s := Source{Batch: int(batch % 4), Heads: int(h%4) + int(variant/8%2), SeqLen: int(seq % 40), HeadDim: int(d % 5), Transposed: variant&16 != 0}
		ids := make([]int, len(rawIDs)%12)
		for i := range ids {
			ids[i] = int(int8(rawIDs[i]))
		}
		q := Seq{Row: int(row % 4), Tokens: int(tokens), FirstHead: int(firstHead), BlockIDs: ids}
		regLen := max(0, int(g.RegionLen()))
		if g.Validate() != nil {
			regLen = 64
		}
		srcLen := max(0, s.Batch*s.Heads*s.SeqLen*s.HeadDim*2)
		if variant&32 != 0 {
			srcLen++ // a buffer that does not match its shape
		}
		reg := filled(regLen, 0xAA)
		src := filled(srcLen, 0x11)
		if err := g.ToPaged(reg, KV(variant>>6%3), src, s, q); err != nil {
			for _, x := range reg {
				if x != 0xAA {
					t.Fatalf("region modified on error %v", err)
				}
			}
		}
	})
}

// FuzzSeqExtremes: ToPaged and FromPaged with Seq fields (and the block ids) over the whole int64 range,
// seeded with math.MaxInt, math.MinInt, -1 and 0, against small valid shapes: they never panic, refuse with
// a sentinel, and touch nothing on error; on success the fields are in range.
func FuzzSeqExtremes(f *testing.F) {
	for _, v := range []int64{math.MaxInt64, math.MaxInt64 - 1, math.MaxInt64 - 3, math.MinInt64, -1, 0, 1, 3} {
		f.Add(uint8(3), uint8(2), v, int64(3), int64(0), int64(1), int64(2), uint8(0))
		f.Add(uint8(3), uint8(2), int64(1), v, int64(0), int64(1), int64(2), uint8(5))
		f.Add(uint8(3), uint8(2), int64(1), int64(3), v, int64(1), int64(2), uint8(17))
		f.Add(uint8(3), uint8(2), int64(1), int64(3), int64(1), v, int64(2), uint8(3))
		f.Add(uint8(3), uint8(2), int64(1), int64(3), int64(1), int64(1), v, uint8(30))
	}
	f.Fuzz(func(t *testing.T, heads, nh uint8, row, tokens, firstHead, id0, id1 int64, variant uint8) {
		g := Geometry{NumLayers: 1, NumBlocks: 6, BlockSize: 2, NumKVHeads: 1 + int(nh%3), HeadDim: 2, DType: BF16,
			Order: BlockOrder(1 + variant%2), Plan: RegionPlan(1 + (variant/2)%3)}
		s := Source{Batch: 2, Heads: 1 + int(heads%4), SeqLen: 6, HeadDim: 2, Transposed: variant&16 != 0}
		q := Seq{Row: int(row), Tokens: int(tokens), FirstHead: int(firstHead), BlockIDs: []int{int(id0), int(id1), 5}}
		reg := filled(int(g.RegionLen()), 0xAA)
		n, _ := s.Bytes(2)
		src := filled(int(n), 0x11)
		check := func(what string, err error, buf []byte, fill byte) {
			if err == nil {
				if q.Row < 0 || q.Row >= s.Batch || q.Tokens < 0 || q.Tokens > s.SeqLen || q.FirstHead < 0 ||
					q.FirstHead > s.Heads-g.NumKVHeads {
					t.Fatalf("%s accepted %+v for %+v", what, q, s)
				}
				return
			}
			if !errors.Is(err, ErrOutOfBounds) && !errors.Is(err, ErrBlockOutOfRange) && !errors.Is(err, ErrNullBlock) &&
				!errors.Is(err, ErrDuplicateBlock) && !errors.Is(err, ErrTooFewBlocks) {
				t.Fatalf("%s: unexpected error class: %v", what, err)
			}
			for _, x := range buf {
				if x != fill {
					t.Fatalf("%s modified its destination on error %v", what, err)
				}
			}
		}
		check("ToPaged", g.ToPaged(reg, K, src, s, q), reg, 0xAA)
		reg = filled(int(g.RegionLen()), 0xAA)
		check("FromPaged", g.FromPaged(src, s, V, reg, q), src, 0x11)
	})
}

// FuzzTP: the tensor-parallel helpers and NewReadPlan with arbitrary (including extreme) heads, degrees
// and ranks never panic, and what they accept is in range.
func FuzzTP(f *testing.F) {
	for _, v := range []int64{math.MaxInt64, math.MinInt64, -1, 0, 1, 8, 1 << 40} {
		f.Add(v, int64(2), int64(1), int64(4))
		f.Add(int64(8), v, int64(1), int64(4))
		f.Add(int64(8), int64(2), v, int64(4))
		f.Add(int64(8), int64(2), int64(1), v)
	}
	f.Fuzz(func(t *testing.T, heads, tp, rank, remoteTP int64) {
		first, n, err := RankHeads(int(heads), int(tp), int(rank))
		if err == nil && (n <= 0 || n > MaxKVHeads || first < 0 || int64(first) >= max(heads, 1) || tp > MaxTP) {
			t.Fatalf("RankHeads(%d, %d, %d) = %d, %d", heads, tp, rank, first, n)
		}
		hl, err1 := HeadsPerRank(int(heads), int(tp))
		hr, err2 := HeadsPerRank(int(heads), int(remoteTP))
		if err1 != nil || err2 != nil {
			return
		}
		mk := func(h int) Geometry {
			return Geometry{NumLayers: 1, NumBlocks: 4, BlockSize: 16, NumKVHeads: h, HeadDim: 8, DType: BF16, Order: HND, Plan: PlanSplitKV}
		}
		p, err := NewReadPlan(mk(hl), int(tp), int(rank), mk(hr), int(remoteTP), int(heads))
		if err != nil {
			return
		}
		for _, r := range p.SourceRanks() {
			if r < 0 || int64(r) >= remoteTP {
				t.Fatalf("source rank %d of remote TP %d", r, remoteTP)
			}
		}
		if p.HeadOffset() >= uint64(p.Remote.DescLen()) {
			t.Fatalf("head offset %d outside the remote descriptor (%d)", p.HeadOffset(), p.Remote.DescLen())
		}
	})
}
