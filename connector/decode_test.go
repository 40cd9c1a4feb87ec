package connector

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gonixl/gonixl/connector/protocol"
	"github.com/gonixl/gonixl/internal/testenv"
)

// kv_transfer_params that cannot be served are refused with ErrBadParams before anything is transferred:
// the local blocks stay untouched and the prefill side gets no notification.
func TestPullRejectsBadParams(t *testing.T) {
	for _, p := range roleProfiles() {
		t.Run(p.Name, func(t *testing.T) {
			pr := newPair(t, p, pairOpts{prefillBlocks: 32, decodeBlocks: 16})
			ctx := testenv.Context(t, 20*time.Second)
			good := pr.prefill(t, ctx, "r", 2*tinyBlock, 9)
			local := []int{1, 2}
			with := func(f func(k *protocol.KVTransferParams)) protocol.KVTransferParams {
				k := good
				k.RemoteBlockIDs = protocol.BlockIDs{append([]int64(nil), good.RemoteBlockIDs[0]...)}
				f(&k)
				return k
			}
			cases := []struct {
				name  string
				kv    protocol.KVTransferParams
				local []int
			}{
				{"remote id past the remote cache", with(func(k *protocol.KVTransferParams) { k.RemoteBlockIDs[0][1] = 32 }), local},
				{"remote id far out of range", with(func(k *protocol.KVTransferParams) { k.RemoteBlockIDs[0][0] = 1 << 40 }), local},
				{"negative remote id", with(func(k *protocol.KVTransferParams) { k.RemoteBlockIDs[0][0] = -1 }), local},
				{"remote null block", with(func(k *protocol.KVTransferParams) { k.RemoteBlockIDs[0][0] = 0 }), local},
				{"duplicate remote ids", with(func(k *protocol.KVTransferParams) { k.RemoteBlockIDs[0][1] = k.RemoteBlockIDs[0][0] }), local},
				{"more remote than local blocks", good, []int{1}},
				{"two KV-cache groups", with(func(k *protocol.KVTransferParams) { k.RemoteBlockIDs = append(k.RemoteBlockIDs, []int64{3}) }), local},
				{"no block ids", with(func(k *protocol.KVTransferParams) { k.RemoteBlockIDs = nil }), nil},
				{"local id past the local cache", good, []int{1, 16}},
				{"local null block", good, []int{0, 1}},
				{"duplicate local ids", good, []int{3, 3}},
				{"not a prefill response", with(func(k *protocol.KVTransferParams) { k.DoRemotePrefill = false }), local},
				{"no engine id", with(func(k *protocol.KVTransferParams) { k.RemoteEngineID = "" }), local},
				{"no request id", with(func(k *protocol.KVTransferParams) { k.RemoteRequestID = "" }), local},
				{"no host", with(func(k *protocol.KVTransferParams) { k.RemoteHost = "" }), local},
				{"port out of range", with(func(k *protocol.KVTransferParams) { k.RemotePort = 70000 }), local},
				{"heterogeneous TP", with(func(k *protocol.KVTransferParams) { k.TPSize = 2 }), local},
			}
			for _, c := range cases {
				_, err := pr.dec.Pull(ctx, "bad", c.kv, c.local)
				require.ErrorIs(t, err, ErrBadParams, c.name)
				t.Logf("%s: %v", c.name, err)
			}
			// A foreign engine id at this address: the handshake names another engine.
			_, err := pr.dec.Pull(ctx, "bad", with(func(k *protocol.KVTransferParams) { k.RemoteEngineID = "someone-else" }), local)
			require.ErrorIs(t, err, protocol.ErrEngineMismatch)

			assert.EqualValues(t, len(cases)+1, pr.decM.RequestErrors())
			assert.Zero(t, pr.decM.Requests())
			requireZero(t, pr.dcache, []int{1, 2, 3, 15})
			time.Sleep(100 * time.Millisecond)
			assert.Zero(t, pr.preM.Notifications(), "nothing was transferred, so nothing was notified")
			assert.Equal(t, 1, pr.pre.Held())

			// The good params still work afterwards.
			_, err = pr.dec.Pull(ctx, "good", good, local)
			require.NoError(t, err)
			requirePattern(t, pr.dcache, local, good.RemoteBlockIDs[0], 9)
			require.Eventually(t, func() bool { return pr.pre.Held() == 0 }, 30*time.Second, 5*time.Millisecond)
		})
	}
}
