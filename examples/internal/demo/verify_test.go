package demo

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gonixl/gonixl/connector"
	"github.com/gonixl/gonixl/connector/protocol"
	"github.com/gonixl/gonixl/layout"
)

// The decode worker's check of what arrived reads back only the request's blocks, wherever they lie: a
// request's KV written at scattered block ids passes; a flipped byte in one of its blocks (a token, or the
// zero padding after the last token) fails; a byte of a block the request does not use is not looked at.
func TestDecodeVerify(t *testing.T) {
	for _, v := range []string{"0.16.0", "0.33.0"} {
		t.Run(v, func(t *testing.T) {
			p, err := protocol.ProfileFor(v)
			require.NoError(t, err)
			m := connector.Model{Name: "tiny", Layers: 2, KVHeads: 2, HeadDim: 64, DType: layout.BF16, BlockSize: 16}
			g, err := m.Geometry(p, 12, 1)
			require.NoError(t, err)
			cache, err := connector.NewDRAMCache(g, false)
			require.NoError(t, err)
			defer cache.Close()
			s := &DecodeServer{cache: cache, own: cache}

			const tokens = 40 // two full blocks and half of a third
			ids := make([]int, tokens)
			for i := range ids {
				ids[i] = 1000 + 7*i
			}
			chain := KVChain(ids)
			blocks := []int{9, 3, 4}
			rowBytes := g.HeadDim * g.DType.Size()
			src := layout.Source{Batch: 1, Heads: g.NumKVHeads, SeqLen: tokens, HeadDim: g.HeadDim}
			kvBytes := make([]byte, g.NumKVHeads*tokens*rowBytes)
			for l := range g.NumLayers {
				for _, kv := range []layout.KV{layout.K, layout.V} {
					for h := range g.NumKVHeads {
						FillHead(kvBytes[h*tokens*rowBytes:(h+1)*tokens*rowBytes], rowBytes, chain, l, kv, h)
					}
					r, err := g.Region(l, kv)
					require.NoError(t, err)
					require.NoError(t, g.ToPaged(cache.Region(r), kv, kvBytes, src, layout.Seq{Tokens: tokens, BlockIDs: blocks}))
				}
			}
			want := int64(len(blocks)) * g.BlockLen() * int64(g.NumRegions())
			got, err := s.verify(chain, blocks)
			require.NoError(t, err)
			assert.Equal(t, want, got)

			bl := g.BlockLen()
			last := cache.Region(g.NumRegions() - 1)
			last[5*bl] ^= 1 // block 5: not the request's
			got, err = s.verify(chain, blocks)
			require.NoError(t, err)
			assert.Equal(t, want, got)

			last[4*bl+bl-1] ^= 1 // the last block's last byte: zero padding after token 40
			_, err = s.verify(chain, blocks)
			assert.ErrorContains(t, err, "block 4: bytes differ (zero padding included)")
			last[4*bl+bl-1] ^= 1

			first := cache.Region(0)
			first[9*bl+3] ^= 1 // the first token of the first block
			_, err = s.verify(chain, blocks)
			assert.ErrorContains(t, err, "layer 0 K: token bytes differ")
		})
	}
}
