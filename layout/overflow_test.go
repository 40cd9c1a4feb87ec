package layout

import (
	"errors"
	"math"
	"math/big"
	"slices"
	"testing"
)

// Overflow regressions: every bound check on caller or wire input must hold for values near the ends of
// the int range, where a written-out a+b > c would wrap and pass.

// extremes are the values each integer field is tried with (the fuzz targets seed from them too).
var extremes = []int{math.MinInt, math.MinInt + 1, -1 << 32, -2, -1, 0, 1, 2, 3, 1 << 31, 1 << 32,
	math.MaxInt32, math.MaxInt - MaxKVHeads, math.MaxInt - 2, math.MaxInt - 1, math.MaxInt}

// TestFirstHeadNearMaxInt: a FirstHead that makes FirstHead+NumKVHeads wrap used to pass checkSeq; ToPaged
// and FromPaged then panicked ("slice bounds out of range") or, for other shapes, read/wrote another batch
// row. Now both refuse it with ErrOutOfBounds and touch nothing.
func TestFirstHeadNearMaxInt(t *testing.T) {
	for _, plan := range []RegionPlan{PlanSplitKV, PlanKVHalves, PlanPackedKV} {
		for _, order := range []BlockOrder{NHD, HND} {
			for _, transposed := range []bool{false, true} {
				g := Geometry{NumLayers: 1, NumBlocks: 4, BlockSize: 2, NumKVHeads: 2, HeadDim: 2, DType: BF16, Order: order, Plan: plan}
				s := Source{Batch: 3, Heads: 4, SeqLen: 4, HeadDim: 2, Transposed: transposed}
				for _, fh := range []int{math.MaxInt, math.MaxInt - 1, math.MaxInt - g.NumKVHeads + 1, math.MaxInt - 2*g.NumKVHeads, math.MaxInt/2 + 1, 3, -1, math.MinInt} {
					q := Seq{Row: 1, Tokens: 3, FirstHead: fh, BlockIDs: []int{1, 2}}
					reg := filled(int(g.RegionLen()), 0xAA)
					src := filled(int(mustBytes(t, s)), 0x11)
					if err := g.ToPaged(reg, K, src, s, q); !errors.Is(err, ErrOutOfBounds) {
						t.Fatalf("%v transposed=%v FirstHead=%d: ToPaged err = %v, want ErrOutOfBounds", g, transposed, fh, err)
					}
					if slices.ContainsFunc(reg, func(b byte) bool { return b != 0xAA }) {
						t.Fatalf("%v FirstHead=%d: ToPaged wrote the region on error", g, fh)
					}
					if err := g.FromPaged(src, s, V, reg, q); !errors.Is(err, ErrOutOfBounds) {
						t.Fatalf("%v transposed=%v FirstHead=%d: FromPaged err = %v, want ErrOutOfBounds", g, transposed, fh, err)
					}
					if slices.ContainsFunc(src, func(b byte) bool { return b != 0x11 }) {
						t.Fatalf("%v FirstHead=%d: FromPaged wrote the source on error", g, fh)
					}
				}
				// The last valid slice still works.
				q := Seq{Row: 2, Tokens: 4, FirstHead: s.Heads - g.NumKVHeads, BlockIDs: []int{3, 1}}
				if err := g.ToPaged(make([]byte, g.RegionLen()), K, make([]byte, mustBytes(t, s)), s, q); err != nil {
					t.Fatalf("%v: last head slice refused: %v", g, err)
				}
			}
		}
	}
}

func mustBytes(t *testing.T, s Source) int64 {
	t.Helper()
	n, err := s.Bytes(2)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// TestSeqExtremes: every Seq field at every extreme value is either accepted and in range, or refused
// with a sentinel; nothing panics and nothing is written on error.
func TestSeqExtremes(t *testing.T) {
	g := Geometry{NumLayers: 1, NumBlocks: 8, BlockSize: 4, NumKVHeads: 1, HeadDim: 2, DType: BF16, Order: HND, Plan: PlanSplitKV}
	s := Source{Batch: 2, Heads: 2, SeqLen: 8, HeadDim: 2}
	for _, row := range extremes {
		for _, tokens := range extremes {
			for _, fh := range extremes {
				for _, id := range extremes {
					q := Seq{Row: row, Tokens: tokens, FirstHead: fh, BlockIDs: []int{1, id}}
					reg := filled(int(g.RegionLen()), 0xAA)
					err := g.ToPaged(reg, K, make([]byte, mustBytes(t, s)), s, q)
					if err == nil {
						if row < 0 || row >= s.Batch || tokens < 0 || tokens > s.SeqLen || fh < 0 || fh >= s.Heads || id < 2 || id >= g.NumBlocks {
							t.Fatalf("accepted %+v", q)
						}
						continue
					}
					if !errors.Is(err, ErrOutOfBounds) && !errors.Is(err, ErrBlockOutOfRange) && !errors.Is(err, ErrNullBlock) &&
						!errors.Is(err, ErrDuplicateBlock) && !errors.Is(err, ErrTooFewBlocks) {
						t.Fatalf("%+v: unexpected error class: %v", q, err)
					}
					if slices.ContainsFunc(reg, func(b byte) bool { return b != 0xAA }) {
						t.Fatalf("%+v: region written on error %v", q, err)
					}
				}
			}
		}
	}
}

// TestNeededBlocksExtremes: NeededBlocks is exact ceil(tokens/BlockSize) for every tokens ≥ 0 (it used to
// wrap to a negative count near math.MaxInt, so CheckBlockIDs accepted zero ids for such a request), 0
// below; CheckBlockIDs refuses negative token counts.
func TestNeededBlocksExtremes(t *testing.T) {
	for _, bs := range []int{1, 2, 3, 16, MaxBlockSize} {
		g := Geometry{NumLayers: 1, NumBlocks: 8, BlockSize: bs, NumKVHeads: 1, HeadDim: 1, DType: FP8E4M3, Order: HND, Plan: PlanSplitKV}
		for _, tok := range extremes {
			n := g.NeededBlocks(tok)
			switch {
			case tok <= 0 && n != 0:
				t.Fatalf("bs %d: NeededBlocks(%d) = %d, want 0", bs, tok, n)
			case tok > 0 && !exactCeil(tok, bs, n):
				t.Fatalf("bs %d: NeededBlocks(%d) = %d is not ceil", bs, tok, n)
			}
			err := g.CheckBlockIDs([]int{1, 2}, tok)
			switch {
			case tok < 0 && !errors.Is(err, ErrOutOfBounds):
				t.Fatalf("bs %d: CheckBlockIDs with %d tokens: %v, want ErrOutOfBounds", bs, tok, err)
			case tok >= 0 && n <= 2 && err != nil:
				t.Fatalf("bs %d: CheckBlockIDs with %d tokens: %v", bs, tok, err)
			case tok >= 0 && n > 2 && !errors.Is(err, ErrTooFewBlocks):
				t.Fatalf("bs %d: CheckBlockIDs with %d tokens (%d blocks): %v, want ErrTooFewBlocks", bs, tok, n, err)
			}
		}
	}
	// An invalid geometry is refused instead of dividing by zero or sizing a bitset from NumBlocks.
	for _, g := range []Geometry{{}, {NumLayers: 1, NumBlocks: math.MaxInt, BlockSize: 1, NumKVHeads: 1, HeadDim: 1, DType: BF16, Order: HND, Plan: PlanSplitKV}} {
		ids := make([]int, 40)
		for i := range ids {
			ids[i] = i + 1
		}
		if err := g.CheckBlockIDs(ids, 5); !errors.Is(err, ErrInvalidGeometry) {
			t.Fatalf("%v: CheckBlockIDs = %v, want ErrInvalidGeometry", g, err)
		}
	}
}

// exactCeil reports whether n = ceil(tok/bs), computed with big integers.
func exactCeil(tok, bs, n int) bool {
	num := new(big.Int).Add(big.NewInt(int64(tok)), big.NewInt(int64(bs-1)))
	return num.Div(num, big.NewInt(int64(bs))).Cmp(big.NewInt(int64(n))) == 0
}

// TestTPExtremes: the tensor-parallel helpers refuse degrees and head counts whose products would wrap
// (MaxKVHeads·tp and rank·heads used to overflow), and agree with the plain formula where it is exact.
func TestTPExtremes(t *testing.T) {
	for _, heads := range extremes {
		for _, tp := range extremes {
			n, err := HeadsPerRank(heads, tp)
			if err != nil {
				if !errors.Is(err, ErrInvalidGeometry) && !errors.Is(err, ErrIncompatible) {
					t.Fatalf("HeadsPerRank(%d, %d): unexpected error class: %v", heads, tp, err)
				}
				continue
			}
			if tp <= 0 || tp > MaxTP || heads <= 0 || n <= 0 || n > MaxKVHeads {
				t.Fatalf("HeadsPerRank(%d, %d) = %d accepted", heads, tp, n)
			}
			for _, rank := range []int{0, 1, tp - 1, tp, math.MaxInt, -1} {
				first, m, err := RankHeads(heads, tp, rank)
				if rank < 0 || rank >= tp {
					if !errors.Is(err, ErrOutOfBounds) {
						t.Fatalf("RankHeads(%d, %d, %d): %v, want ErrOutOfBounds", heads, tp, rank, err)
					}
					continue
				}
				if err != nil || m != n || first < 0 || first+m > max(heads, 1) {
					t.Fatalf("RankHeads(%d, %d, %d) = %d, %d, %v", heads, tp, rank, first, m, err)
				}
			}
		}
	}
	// Products that used to wrap: MaxKVHeads·tp for a huge tp made any head count pass.
	if _, err := HeadsPerRank(1<<40, 1<<51); err == nil {
		t.Fatal("HeadsPerRank accepted tp = 2^51")
	}
	if _, err := HeadsPerRank(MaxKVHeads*4+1, 4); !errors.Is(err, ErrInvalidGeometry) {
		t.Fatalf("HeadsPerRank(MaxKVHeads·4+1, 4) = %v, want ErrInvalidGeometry", err)
	}
	if n, err := HeadsPerRank(MaxKVHeads*4, 4); err != nil || n != MaxKVHeads {
		t.Fatalf("HeadsPerRank(MaxKVHeads·4, 4) = %d, %v", n, err)
	}
	// RankHeads equals rank·H/tp wherever that is exact.
	for _, c := range [][2]int{{8, 2}, {8, 8}, {2, 8}, {1, 16}, {32, 4}, {4, 32}} {
		for rank := range c[1] {
			if first, _, _ := RankHeads(c[0], c[1], rank); first != rank*c[0]/c[1] {
				t.Fatalf("RankHeads(%d, %d, %d) = %d, want %d", c[0], c[1], rank, first, rank*c[0]/c[1])
			}
		}
	}
}

// TestReadPlanDescriptorBound: a tiny remote block size cannot make the local descriptor list (NumDescs ×
// block size ratio) exceed MaxDescs.
func TestReadPlanDescriptorBound(t *testing.T) {
	local := Geometry{NumLayers: 64, NumBlocks: 1 << 24, BlockSize: 256, NumKVHeads: 1, HeadDim: 1, DType: FP8E4M3, Order: HND, Plan: PlanSplitKV}
	if err := local.Validate(); err != nil {
		t.Fatal(err)
	}
	remote := local
	remote.BlockSize = 1
	if _, err := NewReadPlan(local, 1, 0, remote, 1, 1); !errors.Is(err, ErrIncompatible) {
		t.Fatalf("NewReadPlan = %v, want ErrIncompatible", err)
	}
	remote.BlockSize = 256
	if _, err := NewReadPlan(local, 1, 0, remote, 1, 1); err != nil {
		t.Fatalf("NewReadPlan with equal block sizes: %v", err)
	}
}
