package connector

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/gonixl/gonixl/connector/protocol"
	"github.com/gonixl/gonixl/internal/testenv"
)

// Issue 22: remote_host / remote_port values that cannot name a side channel fail at once with ErrBadParams
// (a 400 in the example decode server), without a handshake: before the fix "not a host!!" was tried as a
// host name, retried, and failed after the handshake timeouts (15 s with vLLM's) as a 502.
func TestUnusableSideChannelAddress(t *testing.T) {
	p, err := protocol.ProfileByName("0.33")
	require.NoError(t, err)
	pr := newPair(t, p, pairOpts{})
	ctx := testenv.Context(t, 60*time.Second)
	good := pr.prefill(t, ctx, "r", tinyBlock, 2)
	for _, host := range []string{"not a host!!", "a..b", "-lead.example", "trail-.example", strings.Repeat("x", 64) + ".example",
		"host/path", "1.2.3.4:5", "[::1", "ünïcode"} {
		kv := good
		kv.RemoteHost = host
		start := time.Now()
		_, err := pr.dec.Pull(ctx, "bad", kv, localBlocks(1, 0))
		require.ErrorIs(t, err, ErrBadParams, "%q", host)
		require.Less(t, time.Since(start), 5*time.Second, "%q: refused without a handshake", host)
	}
	for _, port := range []int{0, -1, 65536} {
		kv := good
		kv.RemotePort = port
		_, err := pr.dec.Pull(ctx, "bad", kv, localBlocks(1, 0))
		require.ErrorIs(t, err, ErrBadParams, "port %d", port)
	}
	require.Zero(t, pr.decM.Handshakes())
	for _, host := range []string{"127.0.0.1", "::1", "[::1]", "localhost", "prefill-0.svc.cluster.local", "node_1", "localhost."} {
		require.True(t, validHost(host), host)
	}
	// An IPv6 address is dialled in brackets once, whether or not remote_host came with them.
	for _, host := range []string{"::1", "[::1]"} {
		kv := good
		kv.RemoteHost = host
		req, err := newPullRequest(kv)
		require.NoError(t, err, host)
		require.Equal(t, fmt.Sprintf("tcp://[::1]:%d", kv.RemotePort), req.addr, host)
	}
	_, err = pr.dec.Pull(ctx, "good", good, localBlocks(1, 0))
	require.NoError(t, err)
}

// Per-pull failure lines are sampled: 200 failed pulls in a burst write at most some 20 lines, and every
// failure is still counted.
func TestPullFailureLogsRateLimited(t *testing.T) {
	p, err := protocol.ProfileByName("0.33")
	require.NoError(t, err)
	dlog, logs := observed()
	pr := newPair(t, p, pairOpts{decodeLog: dlog})
	ctx := testenv.Context(t, 60*time.Second)
	good := pr.prefill(t, ctx, "r", tinyBlock, 2)
	const n = 200
	for i := 0; i < n; i++ {
		kv := good
		kv.RemoteBlockIDs = protocol.BlockIDs{{1 << 40}} // refused before any handshake... or after the first
		_, err := pr.dec.Pull(ctx, fmt.Sprintf("bad-%d", i), kv, localBlocks(1, 0))
		require.ErrorIs(t, err, ErrBadParams)
	}
	require.EqualValues(t, n, pr.decM.RequestErrors())
	lines := logs.FilterMessage("pull failed").Len()
	require.Positive(t, lines)
	require.LessOrEqual(t, lines, 2*failLogFirst+n/failLogThereafter+2, "one line per failed pull")
	for _, e := range logs.FilterMessage("pull failed").All() {
		require.Equal(t, "r", fieldsOf(e)["remote_request_id"], "the suffix is never logged")
	}
}
