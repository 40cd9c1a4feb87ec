package connector

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gonixl/gonixl/connector/protocol"
	"github.com/gonixl/gonixl/internal/testenv"
	"github.com/gonixl/gonixl/nixl"
)

// A dropped handshake (after a failed transfer) keeps its descriptor lists while a pull still holds a
// reference; they are released with the last reference, and a new handshake with the same engine waits for
// that (the remote agent names are the same).
func TestRemoteEngineRefcount(t *testing.T) {
	p, _ := protocol.ProfileByName("0.33")
	pr := newPair(t, p, pairOpts{})
	ctx := testenv.Context(t, 20*time.Second)
	kv := pr.prefill(t, ctx, "a", tinyBlock, 1)
	_, err := pr.dec.Pull(ctx, "a", kv, []int{1})
	require.NoError(t, err)

	// An in-flight pull's reference.
	re, took, err := pr.dec.remote(ctx, kv.RemoteEngineID, sideAddr(kv), 1, kv.RemoteRequestID)
	require.NoError(t, err)
	assert.Zero(t, took, "the handshake is cached")
	pr.dec.forget(re) // another pull on the same engine failed
	pr.dec.hs.mu.Lock()
	assert.Equal(t, 1, re.refs)
	assert.NotContains(t, pr.dec.hs.remotes, kv.RemoteEngineID)
	assert.Same(t, re, pr.dec.hs.draining[kv.RemoteEngineID])
	pr.dec.hs.mu.Unlock()
	require.Len(t, re.sources, 1, "the lists must survive while a pull holds the engine")

	// The held lists still carry a transfer.
	kvb := pr.prefill(t, ctx, "b", tinyBlock, 2)
	notif, err := p.EncodeNotification(protocol.Notification{RequestID: kvb.RemoteRequestID, Count: 1})
	require.NoError(t, err)
	src := re.sources[0]
	li, ri, err := re.plan.Indices([]int{2}, []int{int(kvb.RemoteBlockIDs[0][0])}, nil, nil)
	require.NoError(t, err)
	x, err := pr.dec.Agent().MakeXfer(nixl.Read, src.local, li, src.remote, ri, nixl.WithNotification(notif))
	require.NoError(t, err)
	_, err = x.Post()
	require.NoError(t, err)
	require.NoError(t, x.Wait(ctx))
	require.NoError(t, x.Close())
	requirePattern(t, pr.dcache, []int{2}, kvb.RemoteBlockIDs[0], 2)

	// A new pull must wait for the old generation to be released (bounded by its context).
	kvc := pr.prefill(t, ctx, "c", tinyBlock, 3)
	short, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	_, err = pr.dec.Pull(short, "c", kvc, []int{3})
	cancel()
	require.ErrorIs(t, err, context.DeadlineExceeded)
	assert.Contains(t, err.Error(), "previous handshake")

	// The last reference releases the lists; then the handshake is redone.
	pr.dec.hs.put(re)
	select {
	case <-re.released:
	default:
		t.Fatal("the last put did not release the engine")
	}
	assert.Nil(t, re.sources)
	pr.dec.hs.mu.Lock()
	assert.Empty(t, pr.dec.hs.draining)
	pr.dec.hs.mu.Unlock()
	res, err := pr.dec.Pull(ctx, "c", kvc, []int{3})
	require.NoError(t, err)
	assert.Positive(t, res.Handshake, "a new handshake")
	requirePattern(t, pr.dcache, []int{3}, kvc.RemoteBlockIDs[0], 3)
	assert.EqualValues(t, 2, pr.decM.Handshakes())
}

// The handshake cache on its own (no NIXL): references, draining after a drop (here by a newer registration
// generation), the wait for a draining engine, release with the last reference, and close.
func TestHandshakesCache(t *testing.T) {
	var released []string
	h := newHandshakes(func(re *remoteEngine) { released = append(released, re.id) })
	ctx := testenv.Context(t, 10*time.Second)
	re, mine, err := h.acquire(ctx, "e", "tcp://a:1", 1)
	require.NoError(t, err)
	require.True(t, mine, "the first caller handshakes")
	assert.Equal(t, 2, re.refs, "the cache's reference and the caller's")
	close(re.once)
	again, mine, err := h.acquire(ctx, "e", "tcp://a:1", 1)
	require.NoError(t, err)
	assert.False(t, mine)
	assert.Same(t, re, again)
	_, _, err = h.acquire(ctx, "e", "tcp://b:1", 1)
	require.ErrorIs(t, err, ErrBadParams, "one engine id at two addresses")

	assert.False(t, h.advance("other", 0), "generation 0 (rows without it) never drops")
	assert.True(t, h.advance("e", 1), "a newer generation drops the finished handshake")
	assert.False(t, h.advance("e", 1))
	assert.Same(t, re, h.draining["e"])
	short, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	_, _, err = h.acquire(short, "e", "tcp://a:1", 1)
	cancel()
	require.ErrorIs(t, err, context.DeadlineExceeded, "a new handshake waits for the draining one")
	h.put(re)
	assert.Empty(t, released, "a pull still holds it")
	h.put(re)
	assert.Equal(t, []string{"e"}, released)
	assert.Empty(t, h.draining)
	<-re.released

	re, mine, err = h.acquire(ctx, "e", "tcp://a:1", 1)
	require.NoError(t, err)
	require.True(t, mine)
	close(re.once)
	cached := h.close()
	assert.Equal(t, map[string]*remoteEngine{"e": re}, cached)
	_, _, err = h.acquire(ctx, "e", "tcp://a:1", 1)
	require.ErrorIs(t, err, nixl.ErrClosed)
}
