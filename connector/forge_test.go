package connector

import (
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/gonixl/gonixl/connector/protocol"
	"github.com/gonixl/gonixl/internal/nixltest"
	"github.com/gonixl/gonixl/internal/testenv"
)

// forger is an agent that loaded the prefill's metadata (anyone who asks its side channel gets it) and
// sends it notifications.
func forger(t *testing.T, pr *pair) func(msg []byte) {
	t.Helper()
	md, err := pr.pre.Agent().LocalMetadata()
	require.NoError(t, err)
	evil := nixltest.Agent(t, "forger")
	name, err := evil.LoadRemoteMetadata(md)
	require.NoError(t, err)
	return func(msg []byte) { require.NoError(t, evil.SendNotification(name, msg)) }
}

// Issue 22: an agent that knows a request id (from a log line, or a guessable counter) but not the params
// cannot free the request's blocks: the remote_request_id the prefill hands out ends in an unguessable
// suffix that notifications must carry. Forgeries are counted; the real decode still reads and frees. On
// the code before the fix the first forged notification freed the victim's blocks.
func TestForgedNotificationsIgnored(t *testing.T) {
	for _, name := range []string{"0.16", "0.33"} {
		t.Run(name, func(t *testing.T) {
			p, err := protocol.ProfileByName(name)
			require.NoError(t, err)
			pr := newPair(t, p, pairOpts{})
			ctx := testenv.Context(t, 60*time.Second)
			kv := pr.prefill(t, ctx, "victim", 2*tinyBlock, 7)
			require.True(t, strings.HasPrefix(kv.RemoteRequestID, "victim"+remoteIDSep), kv.RemoteRequestID)
			require.Equal(t, "victim", LocalRequestID(kv.RemoteRequestID))
			send := forger(t, pr)
			forgeries := []string{"victim", "victim" + remoteIDSep + strings.Repeat("0", 32), LocalRequestID(kv.RemoteRequestID) + remoteIDSep}
			for _, id := range forgeries {
				msg, err := p.EncodeNotification(protocol.Notification{RequestID: id, Count: 1})
				require.NoError(t, err)
				send(msg)
			}
			require.Eventually(t, func() bool { return pr.preM.Notifications() >= int64(len(forgeries)) }, 30*time.Second, time.Millisecond)
			require.Equal(t, 1, pr.pre.Held(), "a forged notification freed the victim's blocks")
			require.EqualValues(t, 2, pr.preM.ForgedNotifications(), "the two with the victim's id and a wrong suffix")
			_, err = pr.dec.Pull(ctx, "d", kv, localBlocks(2, 0))
			require.NoError(t, err)
			requirePattern(t, pr.dcache, localBlocks(2, 0), kv.RemoteBlockIDs[0], 7)
			require.Eventually(t, func() bool { return pr.pre.Held() == 0 }, 30*time.Second, time.Millisecond)
		})
	}
}

// A forged heartbeat does not extend a lease (vLLM 0.33's leases): the request expires on time.
func TestForgedHeartbeatsIgnored(t *testing.T) {
	p, err := protocol.ProfileByName("0.33")
	require.NoError(t, err)
	clock := newFakeClock()
	pr := newPair(t, p, pairOpts{clock: clock, hold: 10 * time.Second})
	ctx := testenv.Context(t, 60*time.Second)
	kv := pr.prefill(t, ctx, "leased", tinyBlock, 1)
	send := forger(t, pr)
	advanceAndSettle(t, pr.pre, clock, 8*time.Second)
	hb, err := p.EncodeHeartbeat([]string{"leased", "leased" + remoteIDSep + strings.Repeat("f", 32)})
	require.NoError(t, err)
	send(hb)
	require.Eventually(t, func() bool { return pr.preM.Heartbeats() >= 1 }, 30*time.Second, time.Millisecond)
	advanceAndSettle(t, pr.pre, clock, 3*time.Second) // past the 10 s hold, before a forged extension's end
	require.Zero(t, pr.pre.Held(), "a forged heartbeat extended the lease")
	require.EqualValues(t, 1, pr.preM.RequestsExpired())
	require.EqualValues(t, 2, pr.preM.ForgedNotifications())
	// A real heartbeat (the params' id) does extend one.
	kv = pr.prefill(t, ctx, "leased-2", tinyBlock, 1)
	advanceAndSettle(t, pr.pre, clock, 8*time.Second)
	hb, err = p.EncodeHeartbeat([]string{kv.RemoteRequestID})
	require.NoError(t, err)
	send(hb)
	require.Eventually(t, func() bool { return pr.preM.Heartbeats() >= 2 }, 30*time.Second, time.Millisecond)
	advanceAndSettle(t, pr.pre, clock, 3*time.Second)
	require.Equal(t, 1, pr.pre.Held(), "the heartbeat with the params' id extends the lease")
}
