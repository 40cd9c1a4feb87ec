package connector

import (
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gonixl/gonixl/internal/testenv"
	"github.com/gonixl/gonixl/nixl"
)

// KeepAlive heartbeats a request from the moment the decode side has its params (before any READ), so the
// prefill side keeps its blocks past the lease; without leases it only handshakes. stop is idempotent, bad
// params are refused before anything is sent, and Close ends a running keep-alive.
func TestKeepAlive(t *testing.T) {
	for _, p := range roleProfiles() {
		t.Run(p.Name, func(t *testing.T) {
			const hold = time.Second
			clk := newFakeClock()
			pr := newPair(t, p, pairOpts{hold: hold, clock: clk})
			ctx := testenv.Context(t, 60*time.Second)
			kv := pr.prefill(t, ctx, "waiting", 2*tinyBlock, 5)

			bad := kv
			bad.RemoteRequestID = ""
			_, err := pr.dec.KeepAlive(ctx, bad)
			require.ErrorIs(t, err, ErrBadParams)

			stop, err := pr.dec.KeepAlive(ctx, kv)
			require.NoError(t, err)
			if !p.Leases {
				stop()
				assert.Zero(t, pr.decM.Heartbeats(), "no leases: no heartbeats")
			} else {
				// The first heartbeat goes out at once; on the prefill side it extends the lease past the hold.
				require.Eventually(t, func() bool { return pr.preM.Heartbeats() >= 1 }, 30*time.Second, time.Millisecond,
					"the prefill side counted no heartbeat")
				assert.GreaterOrEqual(t, pr.decM.Heartbeats(), int64(1))
				advanceAndSettle(t, pr.pre, clk, hold/2)
				require.Equal(t, 1, pr.pre.Held(), "the request must still be held")
				stop()
				stop() // idempotent
			}
			res, err := pr.dec.Pull(ctx, "waiting", kv, localBlocks(2, 0))
			require.NoError(t, err)
			assert.Equal(t, 2, res.Blocks)
			require.Eventually(t, func() bool { return pr.pre.Held() == 0 }, 30*time.Second, time.Millisecond)
			assert.Zero(t, pr.preM.RequestsExpired())

			// Close ends a keep-alive that is still running; KeepAlive after Close is refused.
			kv2, err := pr.pre.Hold(ctx, "dropped", tinyBlock, nil)
			require.NoError(t, err)
			stop2, err := pr.dec.KeepAlive(ctx, kv2)
			require.NoError(t, err)
			closed := make(chan error, 1)
			go func() { closed <- pr.dec.Close() }()
			select {
			case err := <-closed:
				require.NoError(t, err)
			case <-time.After(30 * time.Second):
				t.Fatal("Close did not end a running keep-alive")
			}
			stop2()
			_, err = pr.dec.KeepAlive(ctx, kv2)
			assert.True(t, errors.Is(err, nixl.ErrClosed), "%v", err)
		})
	}
}
