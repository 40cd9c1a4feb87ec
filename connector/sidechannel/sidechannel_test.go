package sidechannel

import (
	"context"
	"errors"
	"fmt"
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gonixl/gonixl/connector/protocol"
	"github.com/gonixl/gonixl/internal/zmtp"
)

func testMeta(engine string, tp int) protocol.AgentMetadata {
	m := protocol.NewAgentMetadata()
	m.EngineID = engine
	m.AgentMetadata = []byte(fmt.Sprintf("nixl-agent-blob-%d", tp))
	m.KVCachesBaseAddr = []uint64{0x7f0000000000, 0x7f0000100000}
	m.NumBlocks = 64
	m.BlockLens = []int64{32768, 32768}
	m.BlockStrides = []int64{32768, 32768}
	m.KVCacheLayout = "HND"
	m.BlockSize = 16
	m.AttnBackendName = "FLASH_ATTN"
	return m
}

// servePayloads builds payloads for ranks (pp 0..pps-1, tp 0..tps-1).
func servePayloads(t *testing.T, p protocol.Profile, hash string, pps, tps int) map[protocol.Rank][]byte {
	out := map[protocol.Rank][]byte{}
	for pp := 0; pp < pps; pp++ {
		for tp := 0; tp < tps; tp++ {
			b, err := p.EncodeHandshake(hash, testMeta(fmt.Sprintf("engine-%d", pp), tp))
			require.NoError(t, err)
			out[protocol.Rank{PP: pp, TP: tp}] = b
		}
	}
	return out
}

// fastOpts are the client options of tests that expect an answer (a payload or a rejection): no test waits
// for this timeout, so it is generous enough for a loaded machine.
func fastOpts() FetchOptions {
	return FetchOptions{Timeout: 10 * time.Second, Attempts: 2, Backoff: 10 * time.Millisecond}
}

func TestServerAndClientEveryProfile(t *testing.T) {
	for _, p := range protocol.Profiles {
		t.Run(p.Name, func(t *testing.T) {
			ctx := context.Background()
			hash := strings.Repeat("ab", 32)
			pps := 1
			if p.Framing == protocol.FramingH4 {
				pps = 2
			}
			srv := startServer(t, p, ServerConfig{Payloads: servePayloads(t, p, hash, pps, 2)})
			assert.True(t, strings.HasPrefix(srv.Endpoint(), "tcp://127.0.0.1:"), "binds loopback by default: %s", srv.Endpoint())

			var ranks []protocol.Rank
			for pp := 0; pp < pps; pp++ {
				for tp := 0; tp < 2; tp++ {
					ranks = append(ranks, protocol.Rank{PP: pp, TP: tp})
				}
			}
			res, err := FetchAll(ctx, p, srv.Addr(), ranks, fastOpts())
			require.NoError(t, err)
			require.Len(t, res, len(ranks))
			for i, r := range res {
				assert.Equal(t, ranks[i], r.Rank)
				assert.Equal(t, p.Framing == protocol.FramingH4, r.HasClock)
				m, err := p.OpenHandshake(r.Payload, protocol.HandshakeCheck{LocalHash: hash, EnforceHash: true,
					ExpectedEngineID: fmt.Sprintf("engine-%d", r.Rank.PP)})
				require.NoError(t, err)
				assert.Equal(t, fmt.Sprintf("nixl-agent-blob-%d", r.Rank.TP), string(m.AgentMetadata))
			}
			if p.Framing == protocol.FramingH4 {
				// Same process, same clock: the offset estimate must be within the round trip.
				assert.Less(t, abs(res[0].ClockOffset), res[0].RTT.Seconds()+0.01)
			}
			assert.Equal(t, uint64(len(ranks)), srv.Stats().Served)
		})
	}
}

func abs(f float64) float64 {
	if f < 0 {
		return -f
	}
	return f
}

func TestServerSurvivesBadRequests(t *testing.T) {
	p, err := protocol.ProfileByName("0.33")
	require.NoError(t, err)
	ctx := context.Background()
	srv := startServer(t, p, ServerConfig{Payloads: servePayloads(t, p, "h", 1, 1), MaxRequestSize: 256})

	// Unknown rank: answered with an empty payload, the client reports ErrRejected without retrying.
	_, err = Fetch(ctx, p, srv.Addr(), protocol.Rank{PP: 0, TP: 7}, fastOpts())
	require.ErrorIs(t, err, ErrRejected)

	// Raw requests that would kill vLLM's listener: H1 bytes, an H2 tuple sent to an H4 listener, garbage,
	// a str tag, an oversized message.
	raw := func(msg []byte) ([][]byte, error) {
		c := dialZMTP(t, srv, zmtp.REQ)
		defer c.Close()
		require.NoError(t, c.WriteMessage([][]byte{{}, msg}))
		rep, err := c.ReadMessage()
		if err != nil {
			return nil, err
		}
		require.Empty(t, rep[0], "REQ envelope")
		return rep[1:], nil
	}
	h2 := []byte{0x92, 0xc4, 0x0c, 'g', 'e', 't', '_', 'm', 'e', 't', 'a', '_', 'm', 's', 'g', 0x00}
	for name, msg := range map[string][]byte{
		"h1 raw":    []byte("get_meta_msg"),
		"h2 tuple":  h2,
		"garbage":   {0xc1, 0xff, 0x00},
		"empty":     {},
		"neg rank":  {0x93, 0xc4, 0x01, 'x', 0x00, 0xff},
		"deep nest": []byte(strings.Repeat("\x91", 200)),
	} {
		rep, err := raw(msg)
		require.NoError(t, err, name)
		require.Len(t, rep, 2, name)
		assert.Empty(t, rep[0], "%s: answered with an empty payload", name)
	}
	// A str tag is accepted like vLLM does (warning only).
	strTag := []byte{0x93, 0xac, 'g', 'e', 't', '_', 'm', 'e', 't', 'a', '_', 'm', 's', 'g', 0x00, 0x00}
	rep, err := raw(strTag)
	require.NoError(t, err)
	assert.NotEmpty(t, rep[0])
	// Oversized: libzmq drops the connection, so no reply.
	_, err = raw(make([]byte, 1000))
	require.Error(t, err)

	// A DEALER without the empty delimiter frame is dropped.
	dropped := srv.Stats().Dropped
	d := dialZMTP(t, srv, zmtp.DEALER)
	require.NoError(t, d.WriteMessage([][]byte{{0x93, 0xc4, 0x00, 0, 0}}))
	require.Eventually(t, func() bool { return srv.Stats().Dropped > dropped }, 10*time.Second, 10*time.Millisecond)
	require.NoError(t, d.Close())

	// Still serving.
	res, err := Fetch(ctx, p, srv.Addr(), protocol.Rank{}, fastOpts())
	require.NoError(t, err)
	assert.NotEmpty(t, res.Payload)
	st := srv.Stats()
	assert.GreaterOrEqual(t, st.Rejected, uint64(7))
}

func TestServerStopsOnContextCancel(t *testing.T) {
	p := protocol.Profiles[0]
	ctx, cancel := context.WithCancel(context.Background())
	srv, err := NewServer(ctx, p, ServerConfig{Payloads: servePayloads(t, p, "h", 1, 1)})
	require.NoError(t, err)
	cancel()
	select {
	case <-srv.Done():
	case <-time.After(30 * time.Second):
		t.Fatal("server did not stop after its context was cancelled")
	}
	require.NoError(t, srv.Close())
	require.NoError(t, srv.Close()) // idempotent
}

func TestServerPortInUse(t *testing.T) {
	p := protocol.Profiles[0]
	a := startServer(t, p, ServerConfig{})
	_, err := NewServer(context.Background(), p, ServerConfig{Port: a.Port()})
	require.ErrorIs(t, err, ErrConfig)
}

// A listener bound before is served as it is (Host and Port ignored), and closed at Close; one that is not TCP is
// refused.
func TestServerListener(t *testing.T) {
	p := protocol.Profiles[0]
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	require.NoError(t, err)
	port := ln.Addr().(*net.TCPAddr).Port
	srv, err := NewServer(context.Background(), p, ServerConfig{Listener: ln, Port: 1, Payloads: servePayloads(t, p, "h", 1, 1)})
	require.NoError(t, err)
	require.Equal(t, port, srv.Port())
	_, err = Fetch(context.Background(), p, srv.Addr(), protocol.Rank{}, fastOpts())
	require.NoError(t, err)
	require.NoError(t, srv.Close())
	_, err = ln.Accept()
	require.ErrorIs(t, err, net.ErrClosed, "Close closes the listener")

	u, err := net.Listen("unix", filepath.Join(t.TempDir(), "sock"))
	require.NoError(t, err)
	defer u.Close()
	_, err = NewServer(context.Background(), p, ServerConfig{Listener: u})
	require.ErrorIs(t, err, ErrConfig)
}

func TestSetPayloads(t *testing.T) {
	p := protocol.Profiles[0]
	srv := startServer(t, p, ServerConfig{})
	_, err := Fetch(context.Background(), p, srv.Addr(), protocol.Rank{}, fastOpts())
	require.ErrorIs(t, err, ErrRejected)
	srv.SetPayloads(servePayloads(t, p, "h", 1, 1))
	_, err = Fetch(context.Background(), p, srv.Addr(), protocol.Rank{}, fastOpts())
	require.NoError(t, err)
}

func TestFetchTimeoutIsBounded(t *testing.T) {
	p := protocol.Profiles[1]
	// A ROUTER that never answers.
	ep := muteRouter(t)

	start := time.Now()
	_, err := Fetch(context.Background(), p, ep, protocol.Rank{}, FetchOptions{Timeout: 100 * time.Millisecond, Attempts: 3, Backoff: 10 * time.Millisecond})
	el := time.Since(start)
	require.ErrorIs(t, err, ErrTimeout)
	assert.GreaterOrEqual(t, el, 300*time.Millisecond, "three attempts of 100 ms")
	assert.Less(t, el, 30*time.Second, "bounded (three attempts of 100 ms; generous for a loaded machine)")

	// The context bounds it too.
	ctx, cancel := context.WithTimeout(context.Background(), 150*time.Millisecond)
	defer cancel()
	start = time.Now()
	_, err = Fetch(ctx, p, ep, protocol.Rank{}, FetchOptions{Timeout: time.Minute})
	require.True(t, errors.Is(err, context.DeadlineExceeded), "%v", err)
	assert.Less(t, time.Since(start), 30*time.Second, "the context, not the one-minute timeout, ended it")
}

func TestFetchBadAddress(t *testing.T) {
	for _, a := range []string{"", "nohost", "host:", ":5600"} {
		_, err := Fetch(context.Background(), protocol.Profiles[0], a, protocol.Rank{}, FetchOptions{})
		require.ErrorIs(t, err, ErrConfig, a)
	}
	// H2 has no pp rank.
	_, err := Fetch(context.Background(), protocol.Profiles[0], "127.0.0.1:1", protocol.Rank{PP: 1}, FetchOptions{})
	require.ErrorIs(t, err, protocol.ErrUnsupported)
}

func TestIPv6Loopback(t *testing.T) {
	p := protocol.Profiles[1]
	srv, err := NewServer(context.Background(), p, ServerConfig{Host: "::1", Payloads: servePayloads(t, p, "h", 1, 1)})
	if err != nil {
		t.Skipf("no IPv6 loopback here: %v", err)
	}
	defer srv.Close()
	res, err := Fetch(context.Background(), p, srv.Addr(), protocol.Rank{}, fastOpts())
	require.NoError(t, err)
	assert.NotEmpty(t, res.Payload)
}

// ServerConfig's zero values take the defaults; a negative RequestRate, IdleTimeout, EvictIdle or SendBufferSize keeps its
// meaning (no limit, none, the kernel's autotuning), other negative values take the default too.
func TestServerConfigDefaults(t *testing.T) {
	d := ServerConfig{}.withDefaults()
	assert.NotNil(t, d.Clock)
	d.Clock = nil // funcs do not compare
	assert.Equal(t, ServerConfig{Host: DefaultHost, MaxRequestSize: DefaultMaxRequestSize, MaxConnections: DefaultMaxConnections,
		MaxConnectionsPerHost: DefaultMaxConnectionsPerHost, MaxQueuedReplies: DefaultMaxQueuedReplies, RequestRate: DefaultRequestRate,
		RequestBurst: DefaultRequestBurst, HandshakeTimeout: DefaultHandshakeTimeout, IdleTimeout: DefaultIdleTimeout,
		EvictIdle: DefaultEvictIdle, WriteTimeout: DefaultWriteTimeout, SendBufferSize: DefaultSendBufferSize, LogLimit: DefaultLogLimit,
		LogInterval: DefaultLogInterval}, d)

	n := ServerConfig{RequestRate: -1, IdleTimeout: -1, SendBufferSize: -1, MaxQueuedReplies: -1, WriteTimeout: -1, EvictIdle: -1}.withDefaults()
	assert.Equal(t, []any{-1.0, time.Duration(-1), -1, DefaultMaxQueuedReplies, DefaultWriteTimeout, time.Duration(-1)},
		[]any{n.RequestRate, n.IdleTimeout, n.SendBufferSize, n.MaxQueuedReplies, n.WriteTimeout, n.EvictIdle})

	assert.Equal(t, 3, ServerConfig{MaxConnections: 3}.withDefaults().MaxConnectionsPerHost, "at most MaxConnections")
}
