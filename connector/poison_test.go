package connector

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/gonixl/gonixl/connector/protocol"
	"github.com/gonixl/gonixl/connector/sidechannel"
	"github.com/gonixl/gonixl/internal/testenv"
)

// hostileEngine serves, on a side channel of its own, the real prefill's handshake under engine id
// engineID, with the metadata changed by edit: what a hostile kv_transfer_params can point a decode worker
// at. It returns params naming that engine and the real prefill's blocks of kv.
func hostileEngine(t *testing.T, pr *pair, engineID string, kv protocol.KVTransferParams, edit func(*protocol.AgentMetadata)) protocol.KVTransferParams {
	t.Helper()
	md, err := pr.p.OpenHandshake(pr.pre.payload, protocol.HandshakeCheck{})
	require.NoError(t, err)
	md.EngineID = engineID
	edit(&md)
	payload, err := pr.p.EncodeHandshake(pr.pre.hash, md)
	require.NoError(t, err)
	srv, err := sidechannel.NewServer(context.Background(), pr.p, sidechannel.ServerConfig{Payloads: map[protocol.Rank][]byte{{}: payload}})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, srv.Close()) })
	kv.RemoteEngineID = engineID
	kv.RemotePort = srv.Port()
	return kv
}

// Issue 22: a second engine id whose metadata claims the real prefill agent's name can neither break that
// agent (a truncated blob, loaded over it by NIXL) nor invalidate it when its own handshake is dropped (the
// real blob with moved region bases). Both are refused with ErrAgentConflict and counted; the real engine
// keeps serving, whichever handshake came first. On the code before the fix, the real engine's next pull
// failed (NIXL_CAPI_ERROR_INVALID_PARAM, or "remote agent was invalidated").
func TestAgentNameCollision(t *testing.T) {
	p, err := protocol.ProfileByName("0.33")
	require.NoError(t, err)
	variants := []struct {
		name string
		edit func(*protocol.AgentMetadata)
	}{
		// Cut in the connection info, or in the memory sections (NIXL then keeps the connection info).
		{"truncated-half", func(md *protocol.AgentMetadata) { md.AgentMetadata = md.AgentMetadata[:len(md.AgentMetadata)/2] }},
		{"truncated-tail", func(md *protocol.AgentMetadata) { md.AgentMetadata = md.AgentMetadata[:len(md.AgentMetadata)-16] }},
		{"moved-bases", func(md *protocol.AgentMetadata) {
			for i := range md.KVCachesBaseAddr {
				md.KVCachesBaseAddr[i] += 1 << 30
			}
		}},
	}
	for _, v := range variants {
		for _, hostileFirst := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/hostile-first=%v", v.name, hostileFirst), func(t *testing.T) {
				pr := newPair(t, p, pairOpts{})
				ctx := testenv.Context(t, 60*time.Second)
				seed := 3
				pull := func(id string) error {
					seed++
					kv := pr.prefill(t, ctx, id, 2*tinyBlock, seed)
					if _, err := pr.dec.Pull(ctx, id, kv, localBlocks(2, 0)); err != nil {
						return err
					}
					requirePattern(t, pr.dcache, localBlocks(2, 0), kv.RemoteBlockIDs[0], seed)
					return nil
				}
				if !hostileFirst {
					require.NoError(t, pull("before"))
				}
				kv := pr.prefill(t, ctx, "victim", 2*tinyBlock, 1)
				var errs []error
				for i := 0; i < 3; i++ {
					bad := hostileEngine(t, pr, fmt.Sprintf("evil-%d", i), kv, v.edit)
					_, err := pr.dec.Pull(ctx, "hostile", bad, localBlocks(2, 10))
					require.Error(t, err, "a pull through the hostile engine")
					errs = append(errs, err)
				}
				for i := 0; i < 3; i++ {
					// The first pull uses the cached handshake; the others handshake again, as after a failed
					// transfer or a re-registration.
					pr.dec.hs.mu.Lock()
					re := pr.dec.hs.remotes[pr.pre.EngineID()]
					pr.dec.hs.mu.Unlock()
					if re != nil && i > 0 {
						pr.dec.forget(re)
					}
					require.NoError(t, pull(fmt.Sprintf("after-%d", i)), "the real prefill engine keeps serving")
				}
				requireZero(t, pr.dcache, localBlocks(2, 10))
				// Refused before NIXL sees the blob, once the real agent is loaded; a truncated blob that
				// comes first is NIXL's to refuse (and leaves nothing behind).
				typed := !hostileFirst || v.name == "moved-bases"
				_ = typed
				if typed {
					for _, err := range errs {
						require.ErrorIs(t, err, ErrAgentConflict)
					}
					require.EqualValues(t, 3, pr.decM.AgentConflicts())
				} else {
					require.Zero(t, pr.decM.AgentConflicts())
				}
				pr.dec.agentsMu.Lock()
				defer pr.dec.agentsMu.Unlock()
				require.Len(t, pr.dec.agents, 1, "only the real agent is loaded")
			})
		}
	}
}
