package layout

import (
	"encoding/binary"
	"math/rand/v2"
	"testing"
)

// enc is neuron-staging.md §6's value code: c·10000 + b·1000 + h·100 + p·10 + d (unique while b,h,p,d < 10).
func enc(c, b, h, p, d int) uint16 { return uint16(c*10000 + b*1000 + h*100 + p*10 + d) }

// encSource builds a bf16-sized (uint16) BHSD tensor (or BHDS when transposed) filled with enc values.
func encSource(c int, s Source) []byte {
	out := make([]byte, s.Batch*s.Heads*s.SeqLen*s.HeadDim*2)
	for b := range s.Batch {
		for h := range s.Heads {
			for p := range s.SeqLen {
				for d := range s.HeadDim {
					i := elemIndex(s, b, h, p, d)
					binary.LittleEndian.PutUint16(out[2*i:], enc(c, b, h, p, d))
				}
			}
		}
	}
	return out
}

// elemIndex is the element index of (b, h, p, d) in a BHSD tensor shaped by s (BHDS when transposed).
func elemIndex(s Source, b, h, p, d int) int {
	if s.Transposed {
		return ((b*s.Heads+h)*s.HeadDim+d)*s.SeqLen + p
	}
	return ((b*s.Heads+h)*s.SeqLen+p)*s.HeadDim + d
}

func u16(b []byte) []uint16 {
	out := make([]uint16, len(b)/2)
	for i := range out {
		out[i] = binary.LittleEndian.Uint16(b[2*i:])
	}
	return out
}

// blockU16 returns block b of a region as uint16 values.
func blockU16(g Geometry, region []byte, b int) []uint16 {
	bl := g.BlockLen()
	return u16(region[int64(b)*bl : int64(b+1)*bl])
}

func filled(n int, v byte) []byte {
	out := make([]byte, n)
	for i := range out {
		out[i] = v
	}
	return out
}

func randBytes(r *rand.Rand, n int) []byte {
	out := make([]byte, n)
	for i := range out {
		out[i] = byte(r.Uint32())
	}
	return out
}

// refToPaged is an independent, element-by-element implementation of neuron-staging.md §2.6 extended to
// the three region plans; property tests compare the fast converters with it.
func refToPaged(g Geometry, dst []byte, kv KV, src []byte, s Source, q Seq) {
	e := g.ElemSize()
	H, D, bs := g.NumKVHeads, g.HeadDim, g.BlockSize
	for j, blk := range q.BlockIDs {
		for t := range bs {
			p := j*bs + t
			for h := range H {
				for d := range D {
					var inner int // element index inside the block
					switch {
					case g.Order == CPUAttn:
						inner = cpuInner(g, kv, t, h, d)
					case g.Order == CPUAttnAMX:
						inner = amxInner(g, kv, t, h, d)
					case g.Plan == PlanSplitKV, g.Plan == PlanKVHalves:
						if g.Order == NHD {
							inner = (t*H+h)*D + d
						} else {
							inner = (h*bs+t)*D + d
						}
						if g.Plan == PlanKVHalves {
							inner += int(kv) * bs * H * D
						}
					case g.Plan == PlanPackedKV:
						if g.Order == NHD {
							inner = (t*H+h)*2*D + int(kv)*D + d
						} else {
							inner = (h*bs+t)*2*D + int(kv)*D + d
						}
					}
					do := int(int64(blk)*g.BlockLen()) + inner*e
					if p >= q.Tokens {
						for i := range e {
							dst[do+i] = 0
						}
						continue
					}
					si := elemIndex(s, q.Row, q.FirstHead+h, p, d)
					copy(dst[do:do+e], src[si*e:si*e+e])
				}
			}
		}
	}
}

// cpuInner is the element index of (t, h, d) of layer kv inside a CPU_ATTN block, written the way vLLM's
// cpu_attn reshape op addresses it (csrc/cpu/cpu_attn_vec.hpp: key_cache + head·head_stride + offset +
// i·block_size; value_cache + head·head_stride + offset·head_dim), the head's start as cpuHeadBase gives it.
func cpuInner(g Geometry, kv KV, t, h, d int) int {
	D, bs := g.HeadDim, g.BlockSize
	if kv == K {
		return cpuHeadBase(g, kv, h) + d*bs + t
	}
	return cpuHeadBase(g, kv, h) + t*D + d
}

// cpuHeadBase is where head h's K or V starts inside a CPU_ATTN block (either packing), in elements: the
// cache views of cpu_attn.py, (2, nb, H, bs, D) unbound into K and V (PlanSplitKV) or (nb, H, 2·bs, D)
// chunked at dim 2 (PlanPackedKV).
func cpuHeadBase(g Geometry, kv KV, h int) int {
	headStride, vOff := g.BlockSize*g.HeadDim, 0
	if g.Plan == PlanPackedKV {
		headStride, vOff = 2*headStride, headStride
	}
	if kv == K {
		return h * headStride
	}
	return h*headStride + vOff
}

// amxInner is element (t, h, d)'s index in a CPUAttnAMX block, transcribed from vLLM's
// cpu_attn_amx.hpp reshape_and_cache with its names: K as 4-byte quadwords in token groups of 16, V with
// token pairs (sub-groups of 2) inside groups of 16 head elements.
func amxInner(g Geometry, kv KV, t, h, d int) int {
	D, bs := g.HeadDim, g.BlockSize
	if kv == K {
		const tokenNumPerGroup = 16
		quadwordNum := D / 2
		quadword := (t/tokenNumPerGroup)*(tokenNumPerGroup*quadwordNum) + (t % tokenNumPerGroup) + (d/2)*tokenNumPerGroup
		return cpuHeadBase(g, kv, h) + 2*quadword + d%2
	}
	const headElemsPerGroup, tokenNumPerSubGroup = 16, 2
	groupSize := bs * headElemsPerGroup
	return cpuHeadBase(g, kv, h) + (t/tokenNumPerSubGroup)*tokenNumPerSubGroup*headElemsPerGroup + t%tokenNumPerSubGroup +
		(d/headElemsPerGroup)*groupSize + (d%headElemsPerGroup)*tokenNumPerSubGroup
}

func mustNoErr(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}
