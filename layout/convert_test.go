package layout

import (
	"bytes"
	"errors"
	"slices"
	"testing"

	"github.com/stretchr/testify/require"
)

// c1Geom is the geometry of neuron-staging.md §6.1 C1: 1 layer, H=1, D=2, bs=2, NB=4, e=2, NHD.
func c1Geom() Geometry {
	return Geometry{NumLayers: 1, NumBlocks: 4, BlockSize: 2, NumKVHeads: 1, HeadDim: 2, DType: BF16, Order: NHD, Plan: PlanSplitKV}
}

// convertKV converts K (enc c=0) and V (enc c=1) of one layer into fresh (or given) regions.
func convertKV(t *testing.T, g Geometry, s Source, q Seq, kreg, vreg []byte) ([]byte, []byte) {
	t.Helper()
	if kreg == nil {
		kreg = make([]byte, g.RegionLen())
	}
	if vreg == nil {
		vreg = make([]byte, g.RegionLen())
	}
	mustNoErr(t, g.ToPaged(kreg, K, encSource(0, s), s, q))
	mustNoErr(t, g.ToPaged(vreg, V, encSource(1, s), s, q))
	return kreg, vreg
}

func plus(v []uint16, add uint16) []uint16 {
	out := slices.Clone(v)
	for i := range out {
		if out[i] != 0 || add == 10000 {
			out[i] += add
		}
	}
	return out
}

func TestC1Identity(t *testing.T) {
	g := c1Geom()
	s := Source{Batch: 1, Heads: 1, SeqLen: 4, HeadDim: 2}
	kr, vr := convertKV(t, g, s, Seq{Row: 0, Tokens: 4, BlockIDs: []int{1, 2}}, nil, nil)
	want := [][]uint16{{0, 0, 0, 0}, {0, 1, 10, 11}, {20, 21, 30, 31}, {0, 0, 0, 0}}
	for b := range 4 {
		require.Equal(t, want[b], blockU16(g, kr, b), "K block %d", b)
		wv := want[b]
		if b == 1 || b == 2 {
			wv = plus(want[b], 10000)
		}
		require.Equal(t, wv, blockU16(g, vr, b), "V block %d", b)
	}
}

func TestC2PartialTail(t *testing.T) {
	g := c1Geom()
	s := Source{Batch: 1, Heads: 1, SeqLen: 4, HeadDim: 2} // the source holds "garbage" (real data) at p=3
	kr, _ := convertKV(t, g, s, Seq{Tokens: 3, BlockIDs: []int{1, 2}}, nil, nil)
	require.Equal(t, []uint16{20, 21, 0, 0}, blockU16(g, kr, 2))
	// The tail is zeroed even when the arena held something there before.
	kr = filled(int(g.RegionLen()), 0xAA)
	mustNoErr(t, g.ToPaged(kr, K, encSource(0, s), s, Seq{Tokens: 3, BlockIDs: []int{1, 2}}))
	require.Equal(t, []uint16{20, 21, 0, 0}, blockU16(g, kr, 2))
}

func TestC3NHDvsHND(t *testing.T) {
	s := Source{Batch: 1, Heads: 2, SeqLen: 2, HeadDim: 2}
	q := Seq{Tokens: 2, BlockIDs: []int{1}}
	for _, tc := range []struct {
		order BlockOrder
		want  []uint16
	}{
		{NHD, []uint16{0, 1, 100, 101, 10, 11, 110, 111}},
		{HND, []uint16{0, 1, 10, 11, 100, 101, 110, 111}},
	} {
		g := Geometry{NumLayers: 1, NumBlocks: 2, BlockSize: 2, NumKVHeads: 2, HeadDim: 2, DType: FP16, Order: tc.order, Plan: PlanSplitKV}
		kr, _ := convertKV(t, g, s, q, nil, nil)
		require.Equal(t, tc.want, blockU16(g, kr, 1), "%v", tc.order)
	}
}

func TestC4BatchRow(t *testing.T) {
	g := c1Geom()
	s := Source{Batch: 2, Heads: 1, SeqLen: 4, HeadDim: 2}
	src := encSource(0, s)
	// Poison row 0: if it were read, 0xFFFF would show up.
	for i := range len(src) / 2 {
		src[i] = 0xFF
	}
	kr := make([]byte, g.RegionLen())
	mustNoErr(t, g.ToPaged(kr, K, src, s, Seq{Row: 1, Tokens: 4, BlockIDs: []int{1, 2}}))
	require.Equal(t, []uint16{1000, 1001, 1010, 1011}, blockU16(g, kr, 1))
	require.Equal(t, []uint16{1020, 1021, 1030, 1031}, blockU16(g, kr, 2))
}

func TestC5IDOrder(t *testing.T) {
	g := c1Geom()
	g.NumBlocks = 6
	s := Source{Batch: 1, Heads: 1, SeqLen: 4, HeadDim: 2}
	kr, _ := convertKV(t, g, s, Seq{Tokens: 4, BlockIDs: []int{5, 2}}, nil, nil)
	require.Equal(t, []uint16{0, 1, 10, 11}, blockU16(g, kr, 5))
	require.Equal(t, []uint16{20, 21, 30, 31}, blockU16(g, kr, 2))
}

func TestC6BadIDsWriteNothing(t *testing.T) {
	g := c1Geom()
	s := Source{Batch: 1, Heads: 1, SeqLen: 4, HeadDim: 2}
	src := encSource(0, s)
	long := make([]int, 40) // exercises the bitset path of the duplicate check
	gl := g
	gl.NumBlocks = 100
	for i := range long {
		long[i] = i + 1
	}
	long[39] = 17
	for _, tc := range []struct {
		name string
		g    Geometry
		ids  []int
		want error
	}{
		{"null", g, []int{0, 1}, ErrNullBlock},
		{"null-second", g, []int{1, 0}, ErrNullBlock},
		{"== NB", g, []int{1, 4}, ErrBlockOutOfRange},
		{"negative", g, []int{1, -1}, ErrBlockOutOfRange},
		{"duplicate", g, []int{2, 2}, ErrDuplicateBlock},
		{"duplicate-long", gl, long, ErrDuplicateBlock},
	} {
		t.Run(tc.name, func(t *testing.T) {
			reg := filled(int(tc.g.RegionLen()), 0xAA)
			err := tc.g.ToPaged(reg, K, src, s, Seq{Tokens: 4, BlockIDs: tc.ids})
			require.ErrorIs(t, err, tc.want)
			require.Equal(t, filled(len(reg), 0xAA), reg, "region changed on error")
			// The same ids are refused by the descriptor math.
			_, err = tc.g.DescIndices(tc.ids, nil)
			require.ErrorIs(t, err, tc.want)
		})
	}
	// The bitset path does not leak state into the next call.
	mustNoErr(t, gl.CheckBlockIDs(long[:39], 0))
}

func TestC7TooFewBlocks(t *testing.T) {
	g := c1Geom()
	s := Source{Batch: 1, Heads: 1, SeqLen: 6, HeadDim: 2}
	reg := make([]byte, g.RegionLen())
	err := g.ToPaged(reg, K, encSource(0, s), s, Seq{Tokens: 5, BlockIDs: []int{1, 2}})
	require.ErrorIs(t, err, ErrTooFewBlocks)
	require.Contains(t, err.Error(), "need 3 blocks")
}

func TestC8ExtraBlocksZeroed(t *testing.T) {
	g := c1Geom()
	s := Source{Batch: 1, Heads: 1, SeqLen: 4, HeadDim: 2}
	reg := filled(int(g.RegionLen()), 0xAA)
	mustNoErr(t, g.ToPaged(reg, K, encSource(0, s), s, Seq{Tokens: 2, BlockIDs: []int{1, 2}}))
	require.Equal(t, []uint16{0, 1, 10, 11}, blockU16(g, reg, 1))
	require.Equal(t, []uint16{0, 0, 0, 0}, blockU16(g, reg, 2))
	require.Equal(t, []uint16{0xAAAA, 0xAAAA, 0xAAAA, 0xAAAA}, blockU16(g, reg, 3))
}

func TestC9TransposedK(t *testing.T) {
	for _, order := range []BlockOrder{NHD, HND} {
		for _, plan := range []RegionPlan{PlanSplitKV, PlanKVHalves, PlanPackedKV} {
			g := Geometry{NumLayers: 1, NumBlocks: 5, BlockSize: 2, NumKVHeads: 2, HeadDim: 3, DType: BF16, Order: order, Plan: plan}
			s := Source{Batch: 2, Heads: 2, SeqLen: 5, HeadDim: 3}
			st := s
			st.Transposed = true
			q := Seq{Row: 1, Tokens: 5, BlockIDs: []int{4, 1, 3}}
			a := make([]byte, g.RegionLen())
			b := make([]byte, g.RegionLen())
			mustNoErr(t, g.ToPaged(a, K, encSource(0, s), s, q))
			mustNoErr(t, g.ToPaged(b, K, encSource(0, st), st, q))
			require.Equal(t, a, b, "%v %v", order, plan)
			// And back: the transposed source is restored.
			back := make([]byte, len(encSource(0, st)))
			mustNoErr(t, g.FromPaged(back, st, K, b, q))
			want := encSource(0, st)
			// only row 1 is restored; row 0 stays zero
			half := len(want) / 2
			require.Equal(t, want[half:], back[half:])
			require.Equal(t, make([]byte, half), back[:half])
		}
	}
}

func TestC10Tiled(t *testing.T) {
	// NxDI's tiled K (1, 1, 128, 2, D) with token p = i·2 + j is the BHSD byte order: describing it as
	// BHSD with SeqLen 256 must give the result of the element-wise reference.
	const D = 4
	g := Geometry{NumLayers: 1, NumBlocks: 20, BlockSize: 16, NumKVHeads: 1, HeadDim: D, DType: BF16, Order: HND, Plan: PlanSplitKV}
	tiled := make([]byte, 128*2*D*2)
	for i := range 128 {
		for j := range 2 {
			for d := range D {
				p := i*2 + j
				off := ((i*2+j)*D + d) * 2
				v := uint16(p*D+d+1) | 0x8000
				tiled[off], tiled[off+1] = byte(v), byte(v>>8)
			}
		}
	}
	s := Source{Batch: 1, Heads: 1, SeqLen: 256, HeadDim: D}
	ids := []int{19, 3, 5, 7, 9, 11, 13, 15, 17, 2, 4, 6, 8, 10, 12, 14}
	q := Seq{Tokens: 250, BlockIDs: ids}
	got := make([]byte, g.RegionLen())
	want := make([]byte, g.RegionLen())
	mustNoErr(t, g.ToPaged(got, K, tiled, s, q))
	refToPaged(g, want, K, tiled, s, q)
	require.Equal(t, want, got)
}

func TestC11Bounds(t *testing.T) {
	g := c1Geom()
	s := Source{Batch: 1, Heads: 1, SeqLen: 4, HeadDim: 2}
	src := encSource(0, s)
	reg := make([]byte, g.RegionLen())
	require.ErrorIs(t, g.ToPaged(reg, K, src, s, Seq{Tokens: 5, BlockIDs: []int{1, 2, 3}}), ErrOutOfBounds)
	require.ErrorIs(t, g.ToPaged(reg, K, src, s, Seq{Row: 1, Tokens: 2, BlockIDs: []int{1}}), ErrOutOfBounds)
	require.ErrorIs(t, g.ToPaged(reg, K, src, s, Seq{Row: -1, Tokens: 2, BlockIDs: []int{1}}), ErrOutOfBounds)
	require.ErrorIs(t, g.ToPaged(reg, K, src, s, Seq{Tokens: -1, BlockIDs: []int{1}}), ErrOutOfBounds)
	require.ErrorIs(t, g.ToPaged(reg, K, src, s, Seq{FirstHead: 1, Tokens: 2, BlockIDs: []int{1}}), ErrOutOfBounds)
	require.ErrorIs(t, g.ToPaged(reg, KV(2), src, s, Seq{Tokens: 2, BlockIDs: []int{1}}), ErrOutOfBounds)
	// sizes
	require.ErrorIs(t, g.ToPaged(reg[:len(reg)-1], K, src, s, Seq{Tokens: 2, BlockIDs: []int{1}}), ErrSizeMismatch)
	require.ErrorIs(t, g.ToPaged(reg, K, src[:len(src)-2], s, Seq{Tokens: 2, BlockIDs: []int{1}}), ErrSizeMismatch)
	require.ErrorIs(t, g.ToPaged(reg, K, src, Source{Batch: 1, Heads: 1, SeqLen: 2, HeadDim: 4}, Seq{Tokens: 2, BlockIDs: []int{1}}), ErrSizeMismatch)
	require.ErrorIs(t, g.ToPaged(reg, K, src, Source{Batch: 0, Heads: 1, SeqLen: 4, HeadDim: 2}, Seq{Tokens: 2, BlockIDs: []int{1}}), ErrInvalidGeometry)
	require.ErrorIs(t, Geometry{}.ToPaged(reg, K, src, s, Seq{}), ErrInvalidGeometry)
	require.Equal(t, make([]byte, len(reg)), reg)
}

// nxdiBlocks builds an NxDI block-layout tensor (nb blocks) with enc(0, block, h, t, d) values.
func nxdiBlocks(nb, bs, H, D int, order BlockOrder) []byte {
	out := make([]byte, nb*bs*H*D*2)
	for b := range nb {
		for t := range bs {
			for h := range H {
				for d := range D {
					var i int
					if order == NHD {
						i = ((b*bs+t)*H+h)*D + d
					} else {
						i = ((b*H+h)*bs+t)*D + d
					}
					v := enc(0, b, h, t, d)
					out[2*i], out[2*i+1] = byte(v), byte(v>>8)
				}
			}
		}
	}
	return out
}

func TestC12C13NxDIBlocks(t *testing.T) {
	const nb, bs, H, D = 4, 2, 2, 2
	for _, srcOrder := range []BlockOrder{NHD, HND} { // C12 prefix-caching (NHD, nb+1), C13 chunked (HND, nb)
		srcN := nb
		if srcOrder == NHD {
			srcN = nb + 1 // reserved last block
		}
		src := nxdiBlocks(srcN, bs, H, D, srcOrder)
		for _, dstOrder := range []BlockOrder{NHD, HND} {
			g := Geometry{NumLayers: 1, NumBlocks: nb, BlockSize: bs, NumKVHeads: H, HeadDim: D, DType: BF16, Order: dstOrder, Plan: PlanSplitKV}
			reg := filled(int(g.RegionLen()), 0xAA)
			mustNoErr(t, g.BlocksToPaged(reg, K, src, BlockSource{NumBlocks: srcN, Order: srcOrder}, []int{3, 1}))
			for _, b := range []int{3, 1} {
				var want []uint16
				for i := range bs * H {
					var tt, h int
					if dstOrder == NHD {
						tt, h = i/H, i%H
					} else {
						h, tt = i/bs, i%bs
					}
					for d := range D {
						want = append(want, enc(0, b, h, tt, d))
					}
				}
				require.Equal(t, want, blockU16(g, reg, b), "src %v dst %v block %d", srcOrder, dstOrder, b)
			}
			require.Equal(t, filled(int(g.BlockLen()), 0xAA), reg[2*g.BlockLen():3*g.BlockLen()], "untouched block")
			// The reserved block (id nb) can never be requested.
			require.ErrorIs(t, g.BlocksToPaged(reg, K, src, BlockSource{NumBlocks: srcN, Order: srcOrder}, []int{nb}), ErrBlockOutOfRange)
		}
	}
}

func TestC18NoGlobalClear(t *testing.T) {
	for _, plan := range []RegionPlan{PlanSplitKV, PlanKVHalves, PlanPackedKV} {
		for _, order := range []BlockOrder{NHD, HND} {
			g := Geometry{NumLayers: 1, NumBlocks: 8, BlockSize: 4, NumKVHeads: 2, HeadDim: 2, DType: BF16, Order: order, Plan: plan}
			s := Source{Batch: 1, Heads: 2, SeqLen: 8, HeadDim: 2}
			reg := filled(int(g.RegionLen()), 0xAA)
			mustNoErr(t, g.ToPaged(reg, K, encSource(0, s), s, Seq{Tokens: 6, BlockIDs: []int{6, 2}}))
			for b := range g.NumBlocks {
				blk := reg[int64(b)*g.BlockLen() : int64(b+1)*g.BlockLen()]
				if b != 6 && b != 2 {
					require.Equal(t, filled(len(blk), 0xAA), blk, "block %d", b)
					continue
				}
				if plan != PlanSplitKV { // V's bytes of the written blocks are untouched too
					n := 0
					for _, x := range blk {
						if x == 0xAA {
							n++
						}
					}
					require.Equal(t, len(blk)/2, n, "%v %v block %d: exactly the V half keeps 0xAA", plan, order, b)
				}
			}
		}
	}
}

func TestC19RoundTrip(t *testing.T) {
	g := Geometry{NumLayers: 1, NumBlocks: 6, BlockSize: 2, NumKVHeads: 2, HeadDim: 2, DType: BF16, Order: HND, Plan: PlanSplitKV}
	s := Source{Batch: 2, Heads: 2, SeqLen: 6, HeadDim: 2}
	q := Seq{Row: 1, Tokens: 5, BlockIDs: []int{4, 1, 5}}
	reg := make([]byte, g.RegionLen())
	src := encSource(0, s)
	mustNoErr(t, g.ToPaged(reg, K, src, s, q))
	back := filled(len(src), 0x55)
	mustNoErr(t, g.FromPaged(back, s, K, reg, q))
	sv, bv := u16(src), u16(back)
	for b := range 2 {
		for h := range 2 {
			for p := range 6 {
				for d := range 2 {
					i := ((b*2+h)*6+p)*2 + d
					if b == 1 && p < 5 {
						require.Equal(t, sv[i], bv[i])
					} else {
						require.Equal(t, uint16(0x5555), bv[i], "b%d h%d p%d must stay untouched", b, h, p)
					}
				}
			}
		}
	}
}

func TestC20TPSlicing(t *testing.T) {
	const total, D, bs = 8, 2, 2
	s := Source{Batch: 1, Heads: total, SeqLen: 4, HeadDim: D}
	src := encSource(0, s)
	q := Seq{Tokens: 4, BlockIDs: []int{1, 2}}
	g1 := Geometry{NumLayers: 1, NumBlocks: 3, BlockSize: bs, NumKVHeads: total, HeadDim: D, DType: BF16, Order: HND, Plan: PlanSplitKV}
	tp1 := make([]byte, g1.RegionLen())
	mustNoErr(t, g1.ToPaged(tp1, K, src, s, q))
	g2 := g1
	g2.NumKVHeads = 4
	var ranks [2][]byte
	for r := range 2 {
		first, n, err := RankHeads(total, 2, r)
		mustNoErr(t, err)
		require.Equal(t, []int{4 * r, 4}, []int{first, n})
		ranks[r] = make([]byte, g2.RegionLen())
		qr := q
		qr.FirstHead = first
		mustNoErr(t, g2.ToPaged(ranks[r], K, src, s, qr))
		// rank r holds heads 4r..4r+3
		for h := range 4 {
			require.Equal(t, enc(0, 0, 4*r+h, 0, 0), blockU16(g2, ranks[r], 1)[h*bs*D])
		}
	}
	for _, b := range []int{1, 2} {
		cat := slices.Concat(blockU16(g2, ranks[0], b), blockU16(g2, ranks[1], b))
		require.Equal(t, blockU16(g1, tp1, b), cat, "block %d: HND concat of rank blocks = TP1 block", b)
	}
	// What a D with TP1 reads from P with TP2: chunk slot i of its local desc from P rank i.
	plan, err := NewReadPlan(g1, 1, 0, g2, 2, total)
	mustNoErr(t, err)
	require.Equal(t, []int{0, 1}, plan.SourceRanks())
	ld, err := plan.LocalDescs([]uint64{1 << 20, 1 << 21}, 0, 1)
	mustNoErr(t, err)
	require.Equal(t, Desc{Addr: 1<<20 + 2*uint64(g1.BlockLen()) + uint64(g1.BlockLen())/2, Len: uint64(g1.BlockLen()) / 2}, ld[2])
}

func TestC21ReplicatedHeads(t *testing.T) {
	hr, err := HeadsPerRank(8, 32)
	mustNoErr(t, err)
	require.Equal(t, 1, hr)
	for r := range 32 {
		first, n, err := RankHeads(8, 32, r)
		mustNoErr(t, err)
		require.Equal(t, r/4, first)
		require.Equal(t, 1, n)
	}
	_, err = HeadsPerRank(8, 3)
	require.ErrorIs(t, err, ErrIncompatible)
	_, err = HeadsPerRank(8, 12)
	require.ErrorIs(t, err, ErrIncompatible)
	_, _, err = RankHeads(8, 4, 4)
	require.ErrorIs(t, err, ErrOutOfBounds)
}

func TestReorderRoundTrip(t *testing.T) {
	for _, plan := range []RegionPlan{PlanSplitKV, PlanKVHalves, PlanPackedKV} {
		g := Geometry{NumLayers: 1, NumBlocks: 4, BlockSize: 3, NumKVHeads: 2, HeadDim: 2, DType: BF16, Order: NHD, Plan: plan}
		s := Source{Batch: 1, Heads: 2, SeqLen: 9, HeadDim: 2}
		q := Seq{Tokens: 8, BlockIDs: []int{3, 1, 2}}
		nhd := make([]byte, g.RegionLen())
		hnd := make([]byte, g.RegionLen())
		mustNoErr(t, g.ToPaged(nhd, K, encSource(0, s), s, q))
		mustNoErr(t, g.ToPaged(nhd, V, encSource(1, s), s, q))
		gh := g.Swapped()
		mustNoErr(t, gh.ToPaged(hnd, K, encSource(0, s), s, q))
		mustNoErr(t, gh.ToPaged(hnd, V, encSource(1, s), s, q))
		got := make([]byte, g.RegionLen())
		mustNoErr(t, g.Reorder(got, nhd, nil))
		require.Equal(t, hnd, got, "%v NHD→HND", plan)
		back := filled(int(g.RegionLen()), 0xAA)
		mustNoErr(t, gh.Reorder(back, hnd, []int{2}))
		require.Equal(t, nhd[2*g.BlockLen():3*g.BlockLen()], back[2*g.BlockLen():3*g.BlockLen()], "%v HND→NHD", plan)
		require.Equal(t, filled(int(g.BlockLen()), 0xAA), back[:g.BlockLen()])
		require.ErrorIs(t, g.Reorder(got, nhd, []int{4}), ErrBlockOutOfRange)
		require.ErrorIs(t, g.Reorder(got[1:], nhd, nil), ErrSizeMismatch)
	}
}

func TestErrorsAreDistinct(t *testing.T) {
	all := []error{ErrInvalidGeometry, ErrBlockOutOfRange, ErrNullBlock, ErrDuplicateBlock, ErrTooFewBlocks,
		ErrSizeMismatch, ErrOutOfBounds, ErrBlockLenMismatch, ErrIncompatible}
	for i, a := range all {
		for j, b := range all {
			require.Equal(t, i == j, errors.Is(a, b))
		}
	}
	require.True(t, bytes.HasPrefix([]byte(ErrNullBlock.Error()), []byte("layout: ")))
}
