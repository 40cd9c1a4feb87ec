package layout

import (
	"bytes"
	"math/rand/v2"
	"testing"
)

// randCase draws a random small geometry, source and request (ids: a random subset of 1..NB-1 in random
// order, possibly more than needed, possibly a partial last block).
func randCase(r *rand.Rand) (Geometry, Source, Seq) {
	dts := []DType{BF16, FP16, FP32, FP8E4M3, FP8E5M2}
	g := Geometry{
		NumLayers:  1,
		NumBlocks:  2 + r.IntN(12),
		BlockSize:  1 + r.IntN(6),
		NumKVHeads: 1 + r.IntN(4),
		HeadDim:    1 + r.IntN(6),
		DType:      dts[r.IntN(len(dts))],
		Order:      BlockOrder(1 + r.IntN(4)),
		Plan:       RegionPlan(1 + r.IntN(3)),
	}
	if g.Order.IsCPUAttn() { // CPU_ATTN exists in eras A and C only, without fp8
		g.Plan = []RegionPlan{PlanSplitKV, PlanPackedKV}[r.IntN(2)]
		g.DType = dts[r.IntN(3)]
	}
	if g.Order == CPUAttnAMX { // bf16, blocks and heads of 32·k
		g.NumBlocks, g.BlockSize, g.HeadDim, g.DType = 2+r.IntN(4), 32*(1+r.IntN(2)), 32*(1+r.IntN(2)), BF16
	}
	s := Source{
		Batch:      1 + r.IntN(3),
		Heads:      g.NumKVHeads + r.IntN(3),
		HeadDim:    g.HeadDim,
		Transposed: r.IntN(4) == 0,
	}
	maxTok := (g.NumBlocks - 1) * g.BlockSize
	s.SeqLen = 1 + r.IntN(maxTok)
	q := Seq{Row: r.IntN(s.Batch), Tokens: r.IntN(s.SeqLen + 1), FirstHead: r.IntN(s.Heads - g.NumKVHeads + 1)}
	need := g.NeededBlocks(q.Tokens)
	m := need + r.IntN(g.NumBlocks-1-need+1)
	perm := r.Perm(g.NumBlocks - 1)
	for _, p := range perm[:m] {
		q.BlockIDs = append(q.BlockIDs, p+1)
	}
	return g, s, q
}

// TestPropertyToPagedMatchesReference: the fast converter equals the element-wise §2.6 formula, writes
// only the request's blocks, and FromPaged restores exactly positions < Tokens of the selected heads.
func TestPropertyToPagedMatchesReference(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for i := range 3000 {
		g, s, q := randCase(r)
		kv := KV(r.IntN(2))
		srcLen, err := s.Bytes(g.ElemSize())
		mustNoErr(t, err)
		src := randBytes(r, int(srcLen))
		prior := randBytes(r, int(g.RegionLen()))
		got := bytes.Clone(prior)
		want := bytes.Clone(prior)
		if err := g.ToPaged(got, kv, src, s, q); err != nil {
			t.Fatalf("case %d %v %+v %+v: %v", i, g, s, q, err)
		}
		refToPaged(g, want, kv, src, s, q)
		if !bytes.Equal(got, want) {
			t.Fatalf("case %d: %v kv=%v src=%+v seq=%+v: ToPaged differs from the reference", i, g, kv, s, q)
		}

		// Round trip: restore into a buffer of random bytes; only (row, heads, p < Tokens) may change,
		// and those must equal the source.
		back := randBytes(r, int(srcLen))
		before := bytes.Clone(back)
		mustNoErr(t, g.FromPaged(back, s, kv, got, q))
		e := g.ElemSize()
		for b := range s.Batch {
			for h := range s.Heads {
				for p := range s.SeqLen {
					for d := range s.HeadDim {
						o := elemIndex(s, b, h, p, d) * e
						in := b == q.Row && h >= q.FirstHead && h < q.FirstHead+g.NumKVHeads && p < q.Tokens
						ref := before
						if in {
							ref = src
						}
						if !bytes.Equal(back[o:o+e], ref[o:o+e]) {
							t.Fatalf("case %d: %v %+v %+v: FromPaged element (b%d h%d p%d d%d) in=%v wrong", i, g, s, q, b, h, p, d, in)
						}
					}
				}
			}
		}

		// NHD ↔ HND: converting with the other order equals reordering this result (for these blocks).
		if g.Order.IsCPUAttn() {
			continue
		}
		other := make([]byte, g.RegionLen())
		mustNoErr(t, g.Swapped().ToPaged(other, kv, src, s, q))
		re := make([]byte, g.RegionLen())
		mustNoErr(t, g.Reorder(re, got, q.BlockIDs))
		bl := g.BlockLen()
		p := g.part(kv)
		for _, b := range q.BlockIDs {
			ob := other[int64(b)*bl : int64(b+1)*bl]
			rb := re[int64(b)*bl : int64(b+1)*bl]
			// compare only this kv's rows (the other kv's bytes came from the random prior)
			for tt := range g.BlockSize {
				for h := range g.NumKVHeads {
					o := p.off + g.Swapped().rowIndex(tt, h)*p.stride
					if !bytes.Equal(ob[o:o+p.rowLen], rb[o:o+p.rowLen]) {
						t.Fatalf("case %d: %v: Reorder(ToPaged) != ToPaged(swapped) at block %d t%d h%d", i, g, b, tt, h)
					}
				}
			}
		}
	}
}

// TestPropertyDescIndicesNoAliasing: for random valid ids, every index lies inside the local list, maps
// back to (region, id), and no two (region, id) pairs share an index.
func TestPropertyDescIndicesNoAliasing(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	for range 500 {
		g, _, q := randCase(r)
		g.NumLayers = 1 + r.IntN(4)
		idx, err := g.DescIndices(q.BlockIDs, nil)
		mustNoErr(t, err)
		if len(idx) != g.NumDescRegions()*len(q.BlockIDs) {
			t.Fatalf("%v: %d indices", g, len(idx))
		}
		seen := map[int]bool{}
		for k, x := range idx {
			reg, j := k/max(1, len(q.BlockIDs)), k%max(1, len(q.BlockIDs))
			if x < 0 || x >= g.NumDescs() || x/g.NumBlocks != reg || x%g.NumBlocks != q.BlockIDs[j] || seen[x] {
				t.Fatalf("%v ids %v: index %d = %d is wrong or repeated", g, q.BlockIDs, k, x)
			}
			seen[x] = true
		}
	}
}

// TestPropertyBlocksToPaged: an NxDI block-layout cache (NHD or HND blocks, identity block ids) copied with
// BlocksToPaged equals converting the same tokens from BHSD with ToPaged, for every plan and order.
func TestPropertyBlocksToPaged(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	for i := range 500 {
		g, s, q := randCase(r)
		s.Transposed = false
		q.Tokens = len(q.BlockIDs) * g.BlockSize // whole blocks: NxDI block caches carry no token count
		if q.Tokens > s.SeqLen {
			s.SeqLen = q.Tokens
		}
		if len(q.BlockIDs) == 0 {
			continue
		}
		kv := KV(r.IntN(2))
		srcLen, _ := s.Bytes(g.ElemSize())
		src := randBytes(r, int(srcLen))
		want := make([]byte, g.RegionLen())
		mustNoErr(t, g.ToPaged(want, kv, src, s, q))
		// Build NxDI's block cache in srcOrder with the split-K/V geometry (one K-or-V block per id).
		srcOrder := BlockOrder(1 + r.IntN(2))
		bg := g
		bg.Plan, bg.Order = PlanSplitKV, srcOrder
		blocks := make([]byte, bg.RegionLen())
		mustNoErr(t, bg.ToPaged(blocks, K, src, s, q))
		got := make([]byte, g.RegionLen())
		if err := g.BlocksToPaged(got, kv, blocks, BlockSource{NumBlocks: g.NumBlocks, Order: srcOrder}, q.BlockIDs); err != nil {
			t.Fatalf("case %d: %v", i, err)
		}
		if !bytes.Equal(got, want) {
			t.Fatalf("case %d: %v from %v blocks: BlocksToPaged differs from ToPaged", i, g, srcOrder)
		}
	}
}
