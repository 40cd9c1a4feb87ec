package sidechannel

import (
	"context"
	"fmt"
	"net"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/gonixl/gonixl/connector/protocol"
	"github.com/gonixl/gonixl/internal/zmtp"
)

// hog opens a REQ connection to srv from source address src, handshakes and asks for rank 0 once (a peer
// that then keeps its slot with a message every IdleTimeout); closed at the end of the test.
func hog(t *testing.T, srv *Server, p protocol.Profile, src string) {
	t.Helper()
	d := net.Dialer{Timeout: 10 * time.Second, LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}}
	nc, err := d.Dial("tcp4", srv.Addr())
	require.NoError(t, err)
	t.Cleanup(func() { _ = nc.Close() })
	require.NoError(t, nc.SetDeadline(time.Now().Add(patience)))
	c, err := zmtp.Handshake(nc, zmtp.Options{Type: zmtp.REQ})
	require.NoError(t, err)
	req, err := p.EncodeRequest(protocol.Rank{})
	require.NoError(t, err)
	require.NoError(t, c.WriteMessage([][]byte{{}, req}))
	_, err = c.ReadMessage()
	require.NoError(t, err)
}

// Issue 22: peers that hold every slot of one host, or of the whole server (four source addresses), with
// idle handshaken connections cannot lock a decode worker out: a fresh client evicts the least recently
// active idle connection and is served within a bounded time. On the code before the fix it was refused
// until its timeout.
func TestFairAdmission(t *testing.T) {
	const perHost = 8
	cases := []struct {
		name    string
		sources []string
		max     int
	}{
		{"per-host cap, same host", []string{"127.0.0.1"}, 64},
		{"global cap, four other hosts", []string{"127.0.0.2", "127.0.0.3", "127.0.0.4", "127.0.0.5"}, 4 * perHost},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			srv, p := testServer(t, ServerConfig{MaxConnections: c.max, MaxConnectionsPerHost: perHost,
				HandshakeTimeout: patience, IdleTimeout: patience, RequestRate: -1})
			for _, src := range c.sources {
				for i := 0; i < perHost; i++ {
					hog(t, srv, p, src)
				}
			}
			waitFor(t, "every slot taken", func() bool { return srv.Stats().Open == len(c.sources)*perHost })
			start := time.Now()
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			res, err := Fetch(ctx, p, srv.Addr(), protocol.Rank{}, FetchOptions{Timeout: 15 * time.Second, Attempts: 1})
			require.NoError(t, err, "a fresh client locked out after %v", time.Since(start))
			require.NotEmpty(t, res.Payload)
			st := srv.Stats()
			require.GreaterOrEqual(t, st.Evicted, uint64(1))
			require.LessOrEqual(t, st.Open, c.max)
			t.Logf("served after %v; %s", time.Since(start), fmt.Sprint(st))
		})
	}
}

// With eviction off (EvictIdle < 0) the caps refuse, as before.
func TestEvictionOff(t *testing.T) {
	srv, p := testServer(t, ServerConfig{MaxConnections: 4, MaxConnectionsPerHost: 2, EvictIdle: -1,
		HandshakeTimeout: patience, IdleTimeout: patience, RequestRate: -1})
	hog(t, srv, p, "127.0.0.1")
	hog(t, srv, p, "127.0.0.1")
	time.Sleep(50 * time.Millisecond)
	_, err := Fetch(context.Background(), p, srv.Addr(), protocol.Rank{}, FetchOptions{Timeout: 500 * time.Millisecond, Attempts: 1})
	require.Error(t, err)
	require.Zero(t, srv.Stats().Evicted)
	require.Positive(t, srv.Stats().Refused)
}
