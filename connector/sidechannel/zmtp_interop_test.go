package sidechannel

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"net"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gonixl/gonixl/connector/protocol"
	"github.com/gonixl/gonixl/internal/testenv"
	"github.com/gonixl/gonixl/internal/zmtp"
)

// Interop of the ZMTP layer with libzmq (pyzmq, python/zmtp_peer.py) beyond vLLM's own framing: heartbeats
// (PING/PONG), DEALER pipelining, multi-MB and multi-frame messages, ZMTP 3.0 from our side, REP peers.

type pyReply struct {
	Frames int      `json:"frames"`
	Sizes  []int    `json:"sizes"`
	SHA256 []string `json:"sha256"`
}

func zmtpPeer(t *testing.T) (string, string) {
	py := testenv.Python(t)
	testenv.PythonModules(t, py, "zmq")
	return py, filepath.Join(testenv.RepoRoot(), "python", "zmtp_peer.py")
}

// runPyClient runs a pyzmq client mode to completion and returns its replies.
func runPyClient(t *testing.T, args ...string) []pyReply {
	t.Helper()
	py, peer := zmtpPeer(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, py, append([]string{peer}, args...)...).Output()
	require.NoError(t, err, "pyzmq client: %s", testenv.ExitStderr(err))
	var res []pyReply
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		var r pyReply
		require.NoError(t, json.Unmarshal([]byte(line), &r), line)
		res = append(res, r)
	}
	return res
}

// startPyRouter starts a pyzmq ROUTER (or REP) and returns its endpoint; stop closes it and returns the
// number of requests it served.
func startPyRouter(t *testing.T, args ...string) (string, func() int) {
	t.Helper()
	py, peer := zmtpPeer(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	srv, ep, err := startPyServer(t, ctx, py, append([]string{peer, "router"}, args...)...)
	stopped := false
	stop := func() int {
		if stopped {
			return -1
		}
		stopped = true
		err := srv.stop()
		cancel()
		require.NoError(t, err, "pyzmq router: %s", srv.stderr.String())
		var st struct{ Served int }
		require.NoError(t, json.Unmarshal([]byte(strings.TrimSpace(srv.stderr.String())), &st), srv.stderr.String())
		return st.Served
	}
	t.Cleanup(func() { stop() })
	require.NoError(t, err, "pyzmq router did not start")
	return ep, stop
}

func sum(b []byte) string { h := sha256.Sum256(b); return hex.EncodeToString(h[:]) }

func pyPayload(n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(i % 251)
	}
	return b
}

// libzmq's heartbeats reach our ROUTER as PING commands; without PONGs libzmq would drop the connection
// after 300 ms and reconnect (Accepted would be 2 or more).
func TestInteropPyzmqHeartbeatsAndLargeReply(t *testing.T) {
	p, err := protocol.ProfileByName("0.33")
	require.NoError(t, err)
	big := pyPayload(8 << 20)
	srv := startServer(t, p, ServerConfig{Payloads: map[protocol.Rank][]byte{{}: big}})
	req, err := p.EncodeRequest(protocol.Rank{})
	require.NoError(t, err)
	res := runPyClient(t, "req", "--endpoint", srv.Endpoint(), "--heartbeat", "--sleep", "1.5",
		"--request", hex.EncodeToString(req), "--request", hex.EncodeToString(req))
	require.Len(t, res, 2)
	for _, r := range res {
		require.Equal(t, 2, r.Frames, "H4: payload and clock")
		assert.Equal(t, len(big), r.Sizes[0])
		assert.Equal(t, sum(big), r.SHA256[0])
		assert.Equal(t, 9, r.Sizes[1], "msgpack float64 clock")
	}
	st := srv.Stats()
	assert.Equal(t, uint64(1), st.Accepted, "libzmq reconnected: our PONGs did not satisfy its heartbeat")
	assert.Equal(t, uint64(0), st.Disconnects)
}

// A pyzmq DEALER pipelines requests (with the REQ envelope) and reads the replies after.
func TestInteropPyzmqDealerPipeline(t *testing.T) {
	p, err := protocol.ProfileByName("0.16")
	require.NoError(t, err)
	srv := startServer(t, p, ServerConfig{Payloads: servePayloads(t, p, "h", 1, 1)})
	req, err := p.EncodeRequest(protocol.Rank{})
	require.NoError(t, err)
	res := runPyClient(t, "dealer", "--endpoint", srv.Endpoint(), "--pipeline", "50", "--request", hex.EncodeToString(req))
	require.Len(t, res, 50)
	for _, r := range res {
		require.Equal(t, 2, r.Frames, "DEALER sees the empty delimiter and the payload")
		assert.Equal(t, 0, r.Sizes[0])
	}
	assert.Equal(t, uint64(50), srv.Stats().Served)
}

// Our REQ against pyzmq ROUTER and REP peers: multi-MB replies of several frames, as ZMTP 3.1 and 3.0.
func TestInteropGoREQPyzmqPeers(t *testing.T) {
	const size = 6<<20 + 7
	for _, tc := range []struct {
		name string
		args []string
	}{
		{"router", nil},
		{"rep", []string{"--rep"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ep, stop := startPyRouter(t, append([]string{"--payload-size", strconv.Itoa(size), "--extra-frames", "3"}, tc.args...)...)
			for _, v30 := range []bool{false, true} {
				nc, err := net.DialTimeout("tcp", strings.TrimPrefix(ep, "tcp://"), 10*time.Second)
				require.NoError(t, err)
				require.NoError(t, nc.SetDeadline(time.Now().Add(30*time.Second)))
				c, err := zmtp.Handshake(nc, zmtp.Options{Type: zmtp.REQ, ZMTP30: v30})
				require.NoError(t, err)
				assert.Equal(t, byte(1), c.PeerGreeting().Minor, "libzmq 4.3 announces 3.1")
				want := zmtp.ROUTER
				if tc.name == "rep" {
					want = zmtp.REP
				}
				assert.Equal(t, want, c.PeerType())
				for i := 0; i < 2; i++ {
					require.NoError(t, c.WriteMessage([][]byte{{}, []byte("request")}))
					msg, err := c.ReadMessage()
					require.NoError(t, err)
					require.Len(t, msg, 5)
					assert.Empty(t, msg[0])
					assert.Equal(t, sum(pyPayload(size)), sum(msg[1]))
					assert.Equal(t, "extra-2", string(msg[4]))
				}
				require.NoError(t, c.Close())
			}
			// And through Fetch (H2: one frame) against a REP socket and a ROUTER alike.
			ep2, stop2 := startPyRouter(t, append([]string{"--payload-size", strconv.Itoa(size)}, tc.args...)...)
			p, err := protocol.ProfileByName("0.16")
			require.NoError(t, err)
			res, err := FetchAll(context.Background(), p, ep2, []protocol.Rank{{}, {TP: 1}}, FetchOptions{Timeout: 20 * time.Second})
			require.NoError(t, err)
			for _, r := range res {
				assert.Equal(t, sum(pyPayload(size)), sum(r.Payload))
			}
			assert.Equal(t, 4, stop())
			assert.Equal(t, 2, stop2())
		})
	}
}

// Our ROUTER accepts a ZMTP 3.0 peer (ours, announcing 3.0) as libzmq does.
func TestServerAcceptsZMTP30(t *testing.T) {
	p, err := protocol.ProfileByName("0.33")
	require.NoError(t, err)
	srv := startServer(t, p, ServerConfig{Payloads: servePayloads(t, p, "h", 1, 1)})
	nc, err := net.DialTimeout("tcp", srv.Addr(), 10*time.Second)
	require.NoError(t, err)
	defer nc.Close()
	require.NoError(t, nc.SetDeadline(time.Now().Add(30*time.Second)))
	c, err := zmtp.Handshake(nc, zmtp.Options{Type: zmtp.REQ, ZMTP30: true})
	require.NoError(t, err)
	req, err := p.EncodeRequest(protocol.Rank{})
	require.NoError(t, err)
	require.NoError(t, c.WriteMessage([][]byte{{}, req}))
	msg, err := c.ReadMessage()
	require.NoError(t, err)
	require.Len(t, msg, 3)
	assert.NotEmpty(t, msg[1])
}
