package connector

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gonixl/gonixl/connector/protocol"
	"github.com/gonixl/gonixl/connector/sidechannel"
	"github.com/gonixl/gonixl/internal/testenv"
	"github.com/gonixl/gonixl/nixl"
)

// patternErr is requirePattern for goroutines: it returns the first mismatch instead of failing the test.
func patternErr(c *DRAMCache, local []int, remote []int64, seed int) error {
	for r := 0; r < c.Geometry().NumRegions(); r++ {
		for j, b := range local {
			got := blockBytes(c, r, b)
			for i := range got {
				if want := patternByte(seed, r, int(remote[j]), i); got[i] != want {
					return fmt.Errorf("region %d, local block %d (remote %d), byte %d: got %#x, want %#x", r, b, remote[j], i, got[i], want)
				}
			}
		}
	}
	return nil
}

func sideAddr(kv protocol.KVTransferParams) string {
	return "tcp://" + net.JoinHostPort(kv.RemoteHost, strconv.Itoa(kv.RemotePort))
}

// Concurrent pulls on one prefill engine while other pulls on the same engine fail (their context ends
// mid-transfer, so the handshake is dropped), pulls to a dead prefill engine fail, and finally Close runs
// while pulls are in flight: no healthy pull ever sees its descriptor lists closed under it, every pull
// returns, and every error after Close wraps nixl.ErrClosed.
func TestDecodeConcurrentPullsFailuresAndClose(t *testing.T) {
	p, _ := protocol.ProfileByName("0.33")
	const rounds, healthy, failing = 3, 6, 3
	perRound := healthy + failing
	plog, _ := observed()
	dlog, dlogs := observed()
	pr := newPair(t, p, pairOpts{prefillBlocks: 4 * rounds * perRound, decodeBlocks: 4 * rounds * perRound, hold: time.Second, prefillLog: plog, decodeLog: dlog})
	ctx := testenv.Context(t, 60*time.Second)

	// A second prefill engine that dies after its handshake.
	deadCache := newCache(t, tinyGeom(t, p, 8))
	dead, err := NewPrefill(PrefillConfig{RoleConfig: RoleConfig{Profile: p, Library: testLib(t), Cache: deadCache, Compat: tinyCompat(p), EngineID: fmt.Sprintf("dead-%d", time.Now().UnixNano())}})
	require.NoError(t, err)
	kvDead, err := dead.Hold(ctx, "d0", tinyBlock, nil)
	require.NoError(t, err)
	_, err = pr.dec.Pull(ctx, "d0", kvDead, []int{4*rounds*perRound - 1})
	require.NoError(t, err)
	kvDead, err = dead.Hold(ctx, "d1", tinyBlock, nil)
	require.NoError(t, err)
	require.NoError(t, dead.Close())

	local := atomic.Int64{}
	next := func() int { return int(local.Add(1)) }
	var failed atomic.Int64
	for round := range rounds {
		var wg sync.WaitGroup
		errs := make(chan error, perRound+1)
		for i := range healthy {
			kv := pr.prefill(t, ctx, fmt.Sprintf("h%d-%d", round, i), tinyBlock, round*16+i)
			wg.Go(func() {
				l := []int{next()}
				if _, err := pr.dec.Pull(ctx, kv.RemoteRequestID, kv, l); err != nil {
					errs <- fmt.Errorf("healthy pull %d/%d: %w", round, i, err)
					return
				}
				if err := patternErr(pr.dcache, l, kv.RemoteBlockIDs[0], round*16+i); err != nil {
					errs <- err
				}
			})
		}
		for i := range failing {
			kv, err := pr.pre.Hold(ctx, fmt.Sprintf("f%d-%d", round, i), tinyBlock, nil)
			require.NoError(t, err)
			wg.Go(func() {
				// A context that ends at once: the pull fails once its READ is posted (or before), and drops
				// the handshake that the healthy pulls are using.
				c, cancel := context.WithCancel(ctx)
				cancel()
				if _, err := pr.dec.Pull(c, kv.RemoteRequestID, kv, []int{next()}); err == nil {
					t.Log("a pull with a cancelled context completed (the READ finished before the first status check)")
				} else {
					failed.Add(1)
				}
			})
		}
		wg.Go(func() {
			c, cancel := context.WithTimeout(ctx, 2*time.Second)
			defer cancel()
			if _, err := pr.dec.Pull(c, "d1", kvDead, []int{next()}); err == nil {
				errs <- errors.New("a pull from a closed prefill engine succeeded")
			}
		})
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Error(err)
		}
	}
	assert.Positive(t, failed.Load())
	assert.NotEmpty(t, dlogs.FilterMessage("dropped handshake after a failure; it is redone on the next request").All(),
		"the scenario needs dropped handshakes")

	// Close with pulls in flight: each returns (nil, or an error wrapping nixl.ErrClosed), and Close waits.
	var wg sync.WaitGroup
	var closedErrs, okPulls atomic.Int64
	errs := make(chan error, 2*healthy)
	for i := range 2 * healthy {
		kv := pr.prefill(t, ctx, fmt.Sprintf("c-%d", i), tinyBlock, 200+i)
		wg.Go(func() {
			_, err := pr.dec.Pull(ctx, kv.RemoteRequestID, kv, []int{next()})
			switch {
			case err == nil:
				okPulls.Add(1)
			case errors.Is(err, nixl.ErrClosed):
				closedErrs.Add(1)
			default:
				errs <- fmt.Errorf("pull during Close: %w", err)
			}
		})
	}
	require.NoError(t, pr.dec.Close())
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-ctx.Done():
		t.Fatal("pulls did not return after Close")
	}
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	t.Logf("during Close: %d pulls completed, %d refused or cancelled", okPulls.Load(), closedErrs.Load())
	pr.dec.hs.mu.Lock()
	assert.Empty(t, pr.dec.hs.remotes)
	assert.Empty(t, pr.dec.hs.draining)
	pr.dec.hs.mu.Unlock()
	_, err = pr.dec.Pull(ctx, "after", kvDead, []int{1})
	require.ErrorIs(t, err, nixl.ErrClosed)
}

// One Close contract for the roles and the side channel (doc.go): a second Close, also one racing the first,
// returns nil after the first has finished, and a role is unusable after it.
func TestCloseContract(t *testing.T) {
	p, _ := protocol.ProfileByName("0.33")
	pr := newPair(t, p, pairOpts{})
	ctx := testenv.Context(t, 20*time.Second)
	kv := pr.prefill(t, ctx, "a", tinyBlock, 1)
	for _, c := range []interface{ Close() error }{pr.dec, pr.pre} {
		var wg sync.WaitGroup
		errs := make([]error, 4)
		for i := range errs {
			wg.Add(1)
			go func() { defer wg.Done(); errs[i] = c.Close() }()
		}
		wg.Wait()
		for i, err := range errs {
			require.NoError(t, err, "Close %d of %T", i, c)
		}
		require.NoError(t, c.Close(), "a later Close of %T", c)
	}
	_, err := pr.dec.Pull(ctx, "a", kv, []int{1})
	require.ErrorIs(t, err, nixl.ErrClosed)
	_, err = pr.pre.Hold(ctx, "b", tinyBlock, nil)
	require.ErrorIs(t, err, nixl.ErrClosed)

	srv, err := sidechannel.NewServer(ctx, p, sidechannel.ServerConfig{})
	require.NoError(t, err)
	require.NoError(t, srv.Close())
	require.NoError(t, srv.Close())
}
