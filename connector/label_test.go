package connector

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/gonixl/gonixl/connector/protocol"
	"github.com/gonixl/gonixl/connector/sidechannel"
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
	_, err = NewPrefill(PrefillConfig{Profile: p, Library: testLib(t), Cache: pc, Compat: tpCompat(p), KVCacheLayout: "sideways"})
	require.ErrorContains(t, err, "KVCacheLayout")
	pre, err := NewPrefill(PrefillConfig{Profile: p, Library: testLib(t), Cache: pc, Compat: tpCompat(p), KVCacheLayout: "HND"})
	require.NoError(t, err)
	defer pre.Close()

	reply, err := sidechannel.Fetch(ctx, p, "127.0.0.1:"+strconv.Itoa(pre.Port()), protocol.Rank{}, sidechannel.FetchOptions{})
	require.NoError(t, err)
	md, err := p.OpenHandshake(reply.Payload, protocol.HandshakeCheck{})
	require.NoError(t, err)
	require.Equal(t, "HND", md.KVCacheLayout, "the published label")

	const tokens = 21
	kv, err := pre.Prefill(ctx, "label-1", tokens, fillHeads(pc, 0, tokens))
	require.NoError(t, err)

	plain, err := NewDecode(DecodeConfig{Profile: p, Library: testLib(t), Cache: newCache(t, nhd), Compat: tpCompat(p)})
	require.NoError(t, err)
	defer plain.Close()
	_, err = plain.Pull(ctx, "d-plain", kv, []int{3, 4})
	require.ErrorIs(t, err, ErrBadParams, "an NHD cache cannot take bytes labelled HND unless told they are NHD")

	dc := newCache(t, nhd)
	told, err := NewDecode(DecodeConfig{Profile: p, Library: testLib(t), Cache: dc, Compat: tpCompat(p), PeerOrder: layout.NHD})
	require.NoError(t, err)
	defer told.Close()
	local := []int{7, 2}
	_, err = told.Pull(ctx, "d-told", kv, local)
	require.NoError(t, err)
	checkHeads(t, dc, 0, tokens, local)
}
