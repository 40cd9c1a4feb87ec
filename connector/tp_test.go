package connector

import (
	"bytes"
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/gonixl/gonixl/connector/protocol"
	"github.com/gonixl/gonixl/connector/sidechannel"
	"github.com/gonixl/gonixl/layout"
)

const tpTotalHeads = 4

// tpGeom is the tiny model's cache on a rank holding `heads` of the model's tpTotalHeads KV heads.
func tpGeom(t *testing.T, p protocol.Profile, heads int) layout.Geometry {
	g := tinyGeom(t, p, 32)
	g.NumKVHeads = heads
	require.NoError(t, g.Validate())
	return g
}

func tpCompat(p protocol.Profile) Compat {
	c := tinyCompat(p)
	c.NumKVHeads = tpTotalHeads
	return c
}

// tpKV is the whole model's K or V of one layer for a request: (1, tpTotalHeads, tokens, head_dim).
func tpKV(layer int, kv layout.KV, tokens int) []byte {
	b := make([]byte, tpTotalHeads*tokens*tinyHeadDim*2)
	for i := range b {
		b[i] = byte(i*7+layer*31+int(kv)*101) ^ byte(i>>9)
	}
	return b
}

// fillHeads writes heads [first, first+g.NumKVHeads) of every layer's tpKV into blocks of cache c.
func fillHeads(c *DRAMCache, first, tokens int) FillFunc {
	return func(_ context.Context, blocks []int) error {
		g := c.Geometry()
		src := layout.Source{Batch: 1, Heads: tpTotalHeads, SeqLen: tokens, HeadDim: g.HeadDim}
		for l := 0; l < g.NumLayers; l++ {
			for _, kv := range []layout.KV{layout.K, layout.V} {
				r, err := g.Region(l, kv)
				if err != nil {
					return err
				}
				if err := g.ToPaged(c.Region(r), kv, tpKV(l, kv, tokens), src, layout.Seq{Tokens: tokens, FirstHead: first, BlockIDs: blocks}); err != nil {
					return err
				}
			}
		}
		return nil
	}
}

// checkHeads verifies that blocks of c hold heads [first, first+g.NumKVHeads) of tpKV.
func checkHeads(t *testing.T, c *DRAMCache, first, tokens int, blocks []int) {
	t.Helper()
	g := c.Geometry()
	rowBytes := g.HeadDim * 2
	got := make([]byte, g.NumKVHeads*tokens*rowBytes)
	src := layout.Source{Batch: 1, Heads: g.NumKVHeads, SeqLen: tokens, HeadDim: g.HeadDim}
	for l := 0; l < g.NumLayers; l++ {
		for _, kv := range []layout.KV{layout.K, layout.V} {
			r, err := g.Region(l, kv)
			require.NoError(t, err)
			require.NoError(t, g.FromPaged(got, src, kv, c.Region(r), layout.Seq{Tokens: tokens, BlockIDs: blocks}))
			want := tpKV(l, kv, tokens)[first*tokens*rowBytes : (first+g.NumKVHeads)*tokens*rowBytes]
			require.True(t, bytes.Equal(want, got), "layer %d %v: heads %d..%d differ", l, kv, first, first+g.NumKVHeads-1)
		}
	}
}

// TestHeterogeneousTPDecodeWider: two decode ranks of two heads each read their halves of one prefill rank's
// four-head blocks; the prefill side frees the blocks only after both notifications.
func TestHeterogeneousTPDecodeWider(t *testing.T) {
	for _, p := range roleProfiles() {
		t.Run(p.Name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			pc := newCache(t, tpGeom(t, p, 4))
			pre, err := NewPrefill(PrefillConfig{RoleConfig: RoleConfig{Profile: p, Library: testLib(t), Cache: pc, Compat: tpCompat(p)}})
			require.NoError(t, err)
			defer pre.Close()
			const tokens = 37
			kv, err := pre.Hold(ctx, "wide-1", tokens, fillHeads(pc, 0, tokens))
			require.NoError(t, err)
			for rank := 0; rank < 2; rank++ {
				dc := newCache(t, tpGeom(t, p, 2))
				dec, err := NewDecode(DecodeConfig{RoleConfig: RoleConfig{Profile: p, Library: testLib(t), Cache: dc, Rank: protocol.Rank{TP: rank}, TPSize: 2, Compat: tpCompat(p)}})
				require.NoError(t, err)
				local := []int{9, 4, 7}
				res, err := dec.Pull(ctx, fmt.Sprintf("d%d", rank), kv, local)
				require.NoError(t, err)
				require.EqualValues(t, 3*dc.Geometry().NumDescRegions()*int(dc.Geometry().DescLen()), res.Bytes)
				checkHeads(t, dc, 2*rank, tokens, local)
				require.NoError(t, dec.Close())
				if rank == 0 {
					time.Sleep(50 * time.Millisecond)
					require.Equal(t, 1, pre.Held(), "the prefill side must wait for the second decode rank")
				}
			}
			require.Eventually(t, func() bool { return pre.Held() == 0 }, 30*time.Second, 5*time.Millisecond)
			require.EqualValues(t, 2, pre.Metrics().Notifications())
		})
	}
}

// TestHeterogeneousTPPrefillWider: one decode rank of four heads fills its blocks from two prefill ranks of two
// heads each, which share one side channel; each prefill rank gets its notification.
func TestHeterogeneousTPPrefillWider(t *testing.T) {
	for _, p := range roleProfiles() {
		t.Run(p.Name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			srv, err := sidechannel.NewServer(ctx, p, sidechannel.ServerConfig{})
			require.NoError(t, err)
			defer srv.Close()
			const tokens = 50
			var kvs []protocol.KVTransferParams
			var pres []*Prefill
			for rank := 0; rank < 2; rank++ {
				pc := newCache(t, tpGeom(t, p, 2))
				pre, err := NewPrefill(PrefillConfig{RoleConfig: RoleConfig{Profile: p, Library: testLib(t), Cache: pc, Compat: tpCompat(p), EngineID: "p-engine", Rank: protocol.Rank{TP: rank}, TPSize: 2}, SideChannel: srv})
				require.NoError(t, err)
				defer pre.Close()
				kv, err := pre.Hold(ctx, "narrow-1", tokens, fillHeads(pc, 2*rank, tokens))
				require.NoError(t, err)
				kvs = append(kvs, kv)
				pres = append(pres, pre)
			}
			// One engine, one scheduler: every rank holds the request at the same block ids.
			require.Equal(t, kvs[0].RemoteBlockIDs, kvs[1].RemoteBlockIDs)
			require.Equal(t, srv.Port(), kvs[0].RemotePort)

			dc := newCache(t, tpGeom(t, p, 4))
			dec, err := NewDecode(DecodeConfig{RoleConfig: RoleConfig{Profile: p, Library: testLib(t), Cache: dc, Compat: tpCompat(p)}})
			require.NoError(t, err)
			defer dec.Close()
			local := []int{3, 1, 30, 12}
			res, err := dec.Pull(ctx, "d", kvs[0], local)
			require.NoError(t, err)
			require.EqualValues(t, 4*dc.Geometry().NumDescRegions()*int(dc.Geometry().DescLen()), res.Bytes)
			checkHeads(t, dc, 0, tokens, local)
			for _, pre := range pres {
				require.Eventually(t, func() bool { return pre.Held() == 0 }, 30*time.Second, 5*time.Millisecond)
			}
		})
	}
}

// TestHeterogeneousTPRefusesNHD: slicing blocks by heads needs HND on both sides.
func TestHeterogeneousTPRefusesNHD(t *testing.T) {
	p := protocol.Profiles[0]
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	gp, gd := tpGeom(t, p, 4), tpGeom(t, p, 2)
	gp.Order, gd.Order = layout.NHD, layout.NHD
	pc := newCache(t, gp)
	pre, err := NewPrefill(PrefillConfig{RoleConfig: RoleConfig{Profile: p, Library: testLib(t), Cache: pc, Compat: tpCompat(p)}})
	require.NoError(t, err)
	defer pre.Close()
	kv, err := pre.Hold(ctx, "nhd", 20, fillHeads(pc, 0, 20))
	require.NoError(t, err)
	dec, err := NewDecode(DecodeConfig{RoleConfig: RoleConfig{Profile: p, Library: testLib(t), Cache: newCache(t, gd), Rank: protocol.Rank{TP: 1}, TPSize: 2, Compat: tpCompat(p)}})
	require.NoError(t, err)
	defer dec.Close()
	_, err = dec.Pull(ctx, "d", kv, []int{5, 6})
	require.ErrorIs(t, err, ErrBadParams)
	require.ErrorContains(t, err, "cannot read prefill engine")
}
