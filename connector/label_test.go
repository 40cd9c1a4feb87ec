package connector

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/gonixl/gonixl/connector/protocol"
	"github.com/gonixl/gonixl/connector/sidechannel"
	"github.com/gonixl/gonixl/internal/testenv"
	"github.com/gonixl/gonixl/layout"
)

// A vLLM decode worker with kv_buffer_device="cpu" in layout era A (0.16) holds NHD bytes under the label
// "HND": the prefill role stages NHD bytes and publishes "HND"; a decode role told the peer's physical order
// reads them into an NHD cache, and one that is not refuses the mismatch before any transfer.
func TestPublishedLayoutLabelApartFromPhysicalOrder(t *testing.T) {
	p, err := protocol.ProfileByName("0.16")
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	nhd := tpGeom(t, p, 4)
	nhd.Order = layout.NHD
	pc := newCache(t, nhd)
	_, err = NewPrefill(PrefillConfig{RoleConfig: RoleConfig{Profile: p, Library: testLib(t), Cache: pc, Compat: tpCompat(p)}, KVCacheLayout: "sideways"})
	require.ErrorContains(t, err, "KVCacheLayout")
	pre, err := NewPrefill(PrefillConfig{RoleConfig: RoleConfig{Profile: p, Library: testLib(t), Cache: pc, Compat: tpCompat(p)}, KVCacheLayout: "HND"})
	require.NoError(t, err)
	defer pre.Close()

	reply, err := sidechannel.Fetch(ctx, p, "127.0.0.1:"+strconv.Itoa(pre.Port()), protocol.Rank{}, sidechannel.FetchOptions{})
	require.NoError(t, err)
	md, err := p.OpenHandshake(reply.Payload, protocol.HandshakeCheck{})
	require.NoError(t, err)
	require.Equal(t, "HND", md.KVCacheLayout, "the published label")

	const tokens = 21
	kv, err := pre.Hold(ctx, "label-1", tokens, fillHeads(pc, 0, tokens))
	require.NoError(t, err)

	plain, err := NewDecode(DecodeConfig{RoleConfig: RoleConfig{Profile: p, Library: testLib(t), Cache: newCache(t, nhd), Compat: tpCompat(p)}})
	require.NoError(t, err)
	defer plain.Close()
	_, err = plain.Pull(ctx, "d-plain", kv, []int{3, 4})
	require.ErrorIs(t, err, ErrBadParams, "an NHD cache cannot take bytes labelled HND unless told they are NHD")

	dc := newCache(t, nhd)
	told, err := NewDecode(DecodeConfig{RoleConfig: RoleConfig{Profile: p, Library: testLib(t), Cache: dc, Compat: tpCompat(p)}, PeerOrder: layout.NHD})
	require.NoError(t, err)
	defer told.Close()
	local := []int{7, 2}
	_, err = told.Pull(ctx, "d-told", kv, local)
	require.NoError(t, err)
	checkHeads(t, dc, 0, tokens, local)
}

// Each row publishes its own name for the cache's block order ("HND" up to 0.28, "LBHNC" from 0.29), the decode
// role reads it back as the physical order, PrefillConfig.KVCacheLayout takes only the row's names, and a block
// size of 32 (CPU_ATTN's minimum) moves the bytes like 16 does.
func TestLayoutNamesPerRowBlockSize32(t *testing.T) {
	for _, name := range []string{"0.16", "0.23", "0.28", "0.29", "0.33"} { // eras A, B, C; both name eras
		t.Run(name, func(t *testing.T) {
			p, err := protocol.ProfileByName(name)
			require.NoError(t, err)
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			g := tinyGeom(t, p, 16)
			g.BlockSize = 32
			for _, o := range []layout.BlockOrder{layout.HND, layout.NHD} {
				g.Order = o
				want, err := p.LayoutName(o)
				require.NoError(t, err)
				pc := newCache(t, g)
				other := "HND" // a name of the other era
				if p.Labels[0].Name == "HND" {
					other = "LBHNC"
				}
				_, err = NewPrefill(PrefillConfig{RoleConfig: RoleConfig{Profile: p, Library: testLib(t), Cache: pc, Compat: tinyCompat(p)}, KVCacheLayout: other})
				require.ErrorContains(t, err, "KVCacheLayout")
				require.ErrorContains(t, err, strconv.Quote(p.Labels[0].Name), "the error lists the row's names")
				pre, err := NewPrefill(PrefillConfig{RoleConfig: RoleConfig{Profile: p, Library: testLib(t), Cache: pc, Compat: tinyCompat(p)}})
				require.NoError(t, err)
				reply, err := sidechannel.Fetch(ctx, p, "127.0.0.1:"+strconv.Itoa(pre.Port()), protocol.Rank{}, sidechannel.FetchOptions{})
				require.NoError(t, err)
				md, err := p.OpenHandshake(reply.Payload, protocol.HandshakeCheck{})
				require.NoError(t, err)
				require.Equal(t, want, md.KVCacheLayout, "the published label")
				require.EqualValues(t, 32, md.BlockSize)

				const tokens = 70 // three blocks of 32, the last one partial
				kv, err := pre.Hold(ctx, "bs32-"+want, tokens, patternFill(pc, 3))
				require.NoError(t, err)
				require.Len(t, kv.RemoteBlockIDs[0], 3)
				dc := newCache(t, g)
				dec, err := NewDecode(DecodeConfig{RoleConfig: RoleConfig{Profile: p, Library: testLib(t), Cache: dc, Compat: tinyCompat(p)}})
				require.NoError(t, err)
				local := []int{9, 4, 11}
				_, err = dec.Pull(ctx, "d-"+want, kv, local)
				require.NoError(t, err)
				requirePattern(t, dc, local, kv.RemoteBlockIDs[0], 3)
				require.NoError(t, dec.Close())
				require.NoError(t, pre.Close())
			}
		})
	}
}

// The prefill role sends vLLM's remote_registration_generation (1 for its first registration); the decode
// role keeps its handshake while the generation stays and handshakes again when it grows.
func TestRegistrationGenerationRehandshake(t *testing.T) {
	p, err := protocol.ProfileByName("0.33")
	require.NoError(t, err)
	pr := newPair(t, p, pairOpts{})
	ctx := testenv.Context(t, 30*time.Second)
	pull := func(id string, gen int64, local []int) {
		t.Helper()
		kv := pr.prefill(t, ctx, id, tinyBlock, 5)
		require.EqualValues(t, 1, kv.RemoteRegistrationGeneration, "vLLM's first registration is generation 1")
		b, err := p.EncodeParams(kv)
		require.NoError(t, err)
		require.Contains(t, string(b), `"remote_registration_generation": 1`)
		require.Contains(t, string(b), `"remote_prefill_cached_tokens": 0}`)
		kv.RemoteRegistrationGeneration = gen
		_, err = pr.dec.Pull(ctx, "d-"+id, kv, local)
		require.NoError(t, err)
		requirePattern(t, pr.dcache, local, kv.RemoteBlockIDs[0], 5)
	}
	pull("g1", 1, []int{1})
	pull("g1b", 1, []int{2})
	require.EqualValues(t, 1, pr.decM.Handshakes(), "same generation: the cached handshake is used")
	pull("g2", 2, []int{3})
	require.EqualValues(t, 2, pr.decM.Handshakes(), "a larger generation: handshake again")
	pull("g2b", 2, []int{4})
	pull("g1c", 1, []int{5}) // an older generation (a late request) does not go back
	require.EqualValues(t, 2, pr.decM.Handshakes())
}

// movingCache is a DRAM cache whose memory can be replaced (a reallocated staging arena).
type movingCache struct{ *DRAMCache }

// Reregister after the cache moved: the new generation goes out in kv_transfer_params, the decode role drops
// its handshake with the old addresses and reads the new memory; held requests block it.
func TestPrefillReregister(t *testing.T) {
	p, err := protocol.ProfileByName("0.33")
	require.NoError(t, err)
	ctx := testenv.Context(t, 30*time.Second)
	g := tinyGeom(t, p, 16)
	first, err := NewDRAMCache(g, false)
	require.NoError(t, err)
	mc := &movingCache{first}
	pre, err := NewPrefill(PrefillConfig{RoleConfig: RoleConfig{Profile: p, Library: testLib(t), Cache: mc, Compat: tinyCompat(p)}})
	require.NoError(t, err)
	defer pre.Close()
	dc := newCache(t, g)
	dm := &Metrics{}
	dec, err := NewDecode(DecodeConfig{RoleConfig: RoleConfig{Profile: p, Library: testLib(t), Cache: dc, Compat: tinyCompat(p), Metrics: dm}})
	require.NoError(t, err)
	defer dec.Close()

	kv, err := pre.Hold(ctx, "before", tinyBlock, func(_ context.Context, b []int) error { fillPattern(mc.DRAMCache, b, 1); return nil })
	require.NoError(t, err)
	_, err = pre.Reregister()
	require.ErrorIs(t, err, ErrBusy, "a held request blocks re-registration")
	_, err = dec.Pull(ctx, "d-before", kv, []int{1})
	require.NoError(t, err)
	requirePattern(t, dc, []int{1}, kv.RemoteBlockIDs[0], 1)
	require.Eventually(t, func() bool { return pre.Held() == 0 }, 10*time.Second, 5*time.Millisecond)

	// The arena moves: register the new one.
	second, err := NewDRAMCache(g, false)
	require.NoError(t, err)
	mc.DRAMCache = second
	gen, err := pre.Reregister()
	require.NoError(t, err)
	require.EqualValues(t, 2, gen)
	require.NoError(t, first.Close())
	t.Cleanup(func() { require.NoError(t, second.Close()) }) // cleanups run after the deferred role Closes

	kv, err = pre.Hold(ctx, "after", tinyBlock, func(_ context.Context, b []int) error { fillPattern(second, b, 2); return nil })
	require.NoError(t, err)
	require.EqualValues(t, 2, kv.RemoteRegistrationGeneration)
	_, err = dec.Pull(ctx, "d-after", kv, []int{2})
	require.NoError(t, err)
	requirePattern(t, dc, []int{2}, kv.RemoteBlockIDs[0], 2)
	require.EqualValues(t, 2, dm.Handshakes(), "the larger generation made the decode role handshake again")
}
