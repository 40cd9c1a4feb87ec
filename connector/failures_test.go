package connector

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gonixl/gonixl/connector/protocol"
	"github.com/gonixl/gonixl/connector/sidechannel"
	"github.com/gonixl/gonixl/internal/testenv"
	"github.com/gonixl/gonixl/nixl"
)

// The decode side never notifies: the prefill side frees the blocks once the hold (lease / abort timeout)
// passes, never before, logs it with the request and engine ids, and counts it. A notification that arrives
// after that is logged and counted as a bad message, not double-freed. The role runs on a fake clock, so
// "before" and "after" do not depend on how fast the machine is.
func TestPrefillExpiry(t *testing.T) {
	for _, p := range roleProfiles() {
		t.Run(p.Name, func(t *testing.T) {
			const hold = 250 * time.Millisecond
			plog, plogs := observed()
			clk := newFakeClock()
			pr := newPair(t, p, pairOpts{hold: hold, prefillLog: plog, clock: clk})
			ctx := testenv.Context(t, 30*time.Second)
			kv := pr.prefill(t, ctx, "never-read", 3*tinyBlock, 3)
			assert.EqualValues(t, 3, pr.preM.BlocksHeld())
			advanceAndSettle(t, pr.pre, clk, hold-time.Millisecond)
			require.Equal(t, 1, pr.pre.Held(), "blocks must not be freed before the hold ends")
			assert.EqualValues(t, 3, pr.preM.BlocksHeld())
			advanceAndSettle(t, pr.pre, clk, 50*time.Millisecond)
			require.Zero(t, pr.pre.Held(), "blocks must be freed once the hold ended")
			assert.Zero(t, pr.pre.pool.InUse())
			assert.EqualValues(t, 3, pr.preM.BlocksExpired())
			assert.EqualValues(t, 1, pr.preM.RequestsExpired())
			assert.Zero(t, pr.preM.BlocksHeld())
			assert.Zero(t, pr.preM.BlocksFreed())
			exp := plogs.FilterMessage("decode peer never confirmed reading; blocks freed at expiry").All()
			require.Len(t, exp, 1)
			f := fieldsOf(exp[0])
			assert.Equal(t, "never-read", f["request_id"])
			assert.Equal(t, pr.pre.EngineID(), f["engine_id"])
			assert.EqualValues(t, 3, f["blocks"])

			// A decode peer that shows up late: its notification is for a request no longer held.
			_, err := pr.dec.Pull(ctx, "late", kv, localBlocks(3, 0))
			require.NoError(t, err)
			require.Eventually(t, func() bool { return pr.preM.BadMessages() == 1 }, 30*time.Second, 5*time.Millisecond)
			assert.Zero(t, pr.preM.BlocksFreed())
			assert.Zero(t, pr.pre.pool.InUse())
			late := plogs.FilterMessage("notification for a request that is not held (already freed, expired, or unknown)").All()
			require.Len(t, late, 1)
			assert.Equal(t, "never-read", fieldsOf(late[0])["request_id"])
		})
	}
}

// Profiles with leases: "HB:<id>" heartbeats from the decode peer keep a request's blocks past its lease;
// once they stop, the blocks are freed a lease extension (2/3 of the lease) later, not before. In 0.16, which
// has no leases, the same message is a malformed notification and changes nothing. The prefill role runs on a
// fake clock; each heartbeat is sent and seen processed before the clock moves on.
func TestPrefillLeaseHeartbeats(t *testing.T) {
	for _, p := range roleProfiles() {
		t.Run(p.Name, func(t *testing.T) {
			const hold, step = time.Second, 100 * time.Millisecond
			clk := newFakeClock()
			pr := newPair(t, p, pairOpts{hold: hold, clock: clk})
			ctx := testenv.Context(t, 60*time.Second)
			// Handshake with a first request, so the decode agent knows the prefill agent.
			kv0, err := pr.pre.Hold(ctx, "warm", tinyBlock, nil)
			require.NoError(t, err)
			_, err = pr.dec.Pull(ctx, "warm", kv0, localBlocks(1, 0))
			require.NoError(t, err)
			require.Eventually(t, func() bool { return pr.pre.Held() == 0 }, 30*time.Second, time.Millisecond)
			pr.dec.hs.mu.Lock()
			remote := pr.dec.hs.remotes[pr.pre.EngineID()].sources[0].agent
			pr.dec.hs.mu.Unlock()

			kv, err := pr.pre.Hold(ctx, "leased", 2*tinyBlock, nil)
			require.NoError(t, err)
			msg := []byte(protocol.HeartbeatPrefix + kv.RemoteRequestID + ",unknown-id")
			seen := func() int64 { return pr.preM.Heartbeats() + pr.preM.BadMessages() }
			for range 2 * hold / step {
				n := seen()
				require.NoError(t, pr.dec.Agent().SendNotification(remote, msg))
				require.Eventually(t, func() bool { return seen() > n }, 30*time.Second, time.Millisecond, "heartbeat not processed")
				advanceAndSettle(t, pr.pre, clk, step)
			}
			if !p.Leases {
				assert.Zero(t, pr.pre.Held(), "no leases: freed at the hold, heartbeats or not")
				assert.Positive(t, pr.preM.BadMessages(), "0.16 reads HB: as a malformed notification")
				assert.Zero(t, pr.preM.Heartbeats())
				assert.EqualValues(t, 1, pr.preM.RequestsExpired())
				return
			}
			// Leases: heartbeats kept it past 2× the lease.
			// At least ours: the decode role's own heartbeats during the warm-up pull count too when that READ
			// outlasts a heartbeat interval (a loaded machine).
			assert.GreaterOrEqual(t, pr.preM.Heartbeats(), int64(2*hold/step))
			require.Equal(t, 1, pr.pre.Held(), "heartbeats must keep the lease alive")
			// The last heartbeat was processed one step ago; its extension ends ext after it.
			ext := hold * 2 / 3
			advanceAndSettle(t, pr.pre, clk, ext-step-time.Millisecond)
			require.Equal(t, 1, pr.pre.Held(), "not freed before a lease extension after the last heartbeat")
			advanceAndSettle(t, pr.pre, clk, 50*time.Millisecond)
			require.Zero(t, pr.pre.Held(), "freed a lease extension after the last heartbeat (a shortened lease is extended by 2/3 of itself, not the default 20 s)")
			assert.EqualValues(t, 1, pr.preM.RequestsExpired())
			assert.Zero(t, pr.preM.BadMessages())
			assert.Zero(t, pr.pre.pool.InUse())
		})
	}
}

// A decode peer whose compatibility hash differs (another model) is refused at the handshake with a clear
// error naming both hashes; nothing is read, so the prefill side frees the blocks at expiry and says so.
// With the check disabled (vLLM's enforce_handshake_compat=false) the same pair works.
func TestHandshakeHashMismatch(t *testing.T) {
	for _, p := range roleProfiles() {
		t.Run(p.Name, func(t *testing.T) {
			other := tinyCompat(p)
			other.Model = "gonixl/another-model"
			plog, plogs := observed()
			pr := newPair(t, p, pairOpts{decodeCompat: &other, hold: 300 * time.Millisecond, prefillLog: plog})
			ctx := testenv.Context(t, 10*time.Second)
			kv, err := pr.pre.Hold(ctx, "h", tinyBlock, nil)
			require.NoError(t, err)
			_, err = pr.dec.Pull(ctx, "h", kv, []int{1})
			require.ErrorIs(t, err, protocol.ErrHashMismatch)
			want, _ := p.CompatHash(tinyCompat(p).CompatInputs)
			mine, _ := p.CompatHash(other.CompatInputs)
			assert.Contains(t, err.Error(), want)
			assert.Contains(t, err.Error(), mine)
			assert.Contains(t, err.Error(), "enforce_handshake_compat")
			assert.Zero(t, pr.decM.Handshakes())
			require.Eventually(t, func() bool { return pr.pre.Held() == 0 }, 30*time.Second, 5*time.Millisecond)
			assert.EqualValues(t, 1, pr.preM.RequestsExpired())
			// The warning is written after the blocks are back (outside the role's lock): wait for it too.
			const expired = "decode peer never confirmed reading; blocks freed at expiry"
			require.Eventually(t, func() bool { return plogs.FilterMessage(expired).Len() > 0 }, 10*time.Second, 5*time.Millisecond)
			require.Len(t, plogs.FilterMessage(expired).All(), 1)

			// Opt-out.
			skip := other
			skip.SkipCheck = true
			pr2 := newPair(t, p, pairOpts{decodeCompat: &skip})
			kv, err = pr2.pre.Hold(ctx, "h2", tinyBlock, patternFill(pr2.pcache, 4))
			require.NoError(t, err)
			_, err = pr2.dec.Pull(ctx, "h2", kv, []int{1})
			require.NoError(t, err)
			requirePattern(t, pr2.dcache, []int{1}, kv.RemoteBlockIDs[0], 4)
		})
	}
}

// A decode peer of another vLLM profile (0.16 against 0.33 and back) gets a clear handshake error, and the
// prefill side logs the request it could not understand, with its engine id, and counts it.
func TestHandshakeProfileMismatch(t *testing.T) {
	p16, _ := protocol.ProfileByName("0.16")
	p33, _ := protocol.ProfileByName("0.33")
	for _, c := range []struct{ pre, dec protocol.Profile }{{p33, p16}, {p16, p33}} {
		t.Run(fmt.Sprintf("prefill %s, decode %s", c.pre.Name, c.dec.Name), func(t *testing.T) {
			plog, plogs := observed()
			dec := c.dec
			pr := newPair(t, c.pre, pairOpts{decodeProfile: &dec, prefillLog: plog})
			ctx := testenv.Context(t, 10*time.Second)
			kv, err := pr.pre.Hold(ctx, "m", tinyBlock, nil)
			require.NoError(t, err)
			_, err = pr.dec.Pull(ctx, "m", kv, []int{1})
			require.Error(t, err)
			// A clear refusal, not a timeout (no reply, or the context running out).
			assert.NotErrorIs(t, err, sidechannel.ErrTimeout)
			assert.NotErrorIs(t, err, context.DeadlineExceeded)
			assert.Contains(t, err.Error(), "handshake with "+pr.pre.EngineID())
			t.Logf("decode side: %v", err)
			assert.Zero(t, pr.decM.Handshakes())
			rejected := plogs.FilterMessage("malformed metadata request; answering with an empty payload").All()
			require.NotEmpty(t, rejected, "the prefill side must log the request it cannot serve")
			assert.Equal(t, pr.pre.EngineID(), fieldsOf(rejected[0])["engine_id"])
			assert.Equal(t, c.pre.Name, fieldsOf(rejected[0])["profile"])
			assert.Positive(t, pr.pre.server.Stats().Rejected)
			assert.Zero(t, pr.pre.server.Stats().Served)
		})
	}
}

// The NIXL backend list is per agent: "UCX" explicitly (as ParseBackends reads vLLM's extra config) works like
// the default, and an unknown backend is a clear error at construction.
func TestBackendsConfig(t *testing.T) {
	p, _ := protocol.ProfileByName("0.33")
	pr := newPair(t, p, pairOpts{backends: ParseBackends([]string{"ucx"})})
	ctx := testenv.Context(t, 10*time.Second)
	kv := pr.prefill(t, ctx, "b", tinyBlock, 2)
	_, err := pr.dec.Pull(ctx, "b", kv, []int{1})
	require.NoError(t, err)
	requirePattern(t, pr.dcache, []int{1}, kv.RemoteBlockIDs[0], 2)
	names := []string{}
	for _, b := range pr.pre.Agent().Backends() {
		names = append(names, b.Plugin())
	}
	assert.Equal(t, []string{"UCX"}, names)

	c := newCache(t, tinyGeom(t, p, 4))
	_, err = NewPrefill(PrefillConfig{RoleConfig: RoleConfig{Profile: p, Library: testLib(t), Cache: c, Compat: tinyCompat(p), Backends: []nixl.BackendSpec{{Plugin: "NO_SUCH_PLUGIN"}}}})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "NO_SUCH_PLUGIN")
	t.Logf("unknown backend: %v", err)
}
