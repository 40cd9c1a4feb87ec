package connector

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gonixl/gonixl/connector/protocol"
	"github.com/gonixl/gonixl/internal/testenv"
)

// A heartbeat extends a lease by 2/3 of it, as vLLM does (30 s lease → 20 s), also for the default lease, whose
// nanosecond product overflows int64.
func TestLeaseExtension(t *testing.T) {
	p33, _ := protocol.ProfileByName("0.33")
	p16, _ := protocol.ProfileByName("0.16")
	for _, c := range []struct {
		p    protocol.Profile
		hold time.Duration
		want time.Duration
	}{
		{p33, p33.LeaseDuration, 20 * time.Second},
		{p33, 3 * time.Second, 2 * time.Second},
		{p33, 10 * time.Minute, 400 * time.Second},
		{p16, time.Second, time.Second},
	} {
		pr := &Prefill{cfg: PrefillConfig{RoleConfig: RoleConfig{Profile: c.p}}, hold: c.hold}
		assert.InDelta(t, float64(c.want), float64(pr.leaseExtension()), float64(time.Microsecond), "%s hold %v", c.p.Name, c.hold)
	}
}

// A hold wakes the prefill loop out of its idle interval: a decode peer reads as soon as it has the params,
// and the loop (which serves the READ where the transport needs the target's progress, and takes the
// notification that frees the blocks) must be running by then, not at its next idle tick. With an idle
// interval of an hour, the blocks are freed within seconds only because the hold woke the loop. So it is
// with the default BusyPoll (polls back to back while blocks are held) and with a positive one.
func TestHoldWakesLoop(t *testing.T) {
	p, _ := protocol.ProfileByName("0.33")
	for _, busy := range []time.Duration{0, 50 * time.Microsecond} {
		t.Run("busy-poll="+busy.String(), func(t *testing.T) {
			pr := newPair(t, p, pairOpts{idlePoll: time.Hour, busyPoll: busy})
			ctx := testenv.Context(t, 30*time.Second)
			for i, id := range []string{"first", "second"} { // the second finds the loop idle again
				kv := pr.prefill(t, ctx, id, 2*tinyBlock, 3+i)
				_, err := pr.dec.Pull(ctx, id, kv, localBlocks(len(kv.RemoteBlockIDs[0]), 0))
				require.NoError(t, err)
				require.Eventually(t, func() bool { return pr.pre.Held() == 0 }, 20*time.Second, time.Millisecond, "request %s", id)
			}
			assert.EqualValues(t, 2, pr.preM.Notifications())
		})
	}
}
