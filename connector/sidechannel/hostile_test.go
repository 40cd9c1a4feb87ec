package sidechannel

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/gonixl/gonixl/connector/protocol"
	"github.com/gonixl/gonixl/internal/zmtp"
)

// Hostile peers. Waits are bounded by generous deadlines and never assert that something happened fast.

const patience = 60 * time.Second

// waitFor polls cond until it holds or patience runs out.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	require.Eventually(t, cond, patience, 5*time.Millisecond, what)
}

// waitClosed reads from nc until the server closes it (or patience runs out).
func waitClosed(t *testing.T, nc net.Conn) {
	t.Helper()
	require.NoError(t, nc.SetReadDeadline(time.Now().Add(patience)))
	buf := make([]byte, 4096)
	for {
		_, err := nc.Read(buf)
		if err == nil {
			continue
		}
		var ne net.Error
		require.False(t, errors.As(err, &ne) && ne.Timeout(), "the server did not close the connection")
		return
	}
}

// readyBytes is a peer's greeting and READY of socket type st.
func readyBytes(st string) []byte {
	b := zmtp.AppendGreeting(nil, zmtp.Minor31)
	body := zmtp.AppendMetadata(zmtp.AppendCommand(nil, "READY", nil), zmtp.Metadata{{Name: "Socket-Type", Value: []byte(st)}, {Name: "Identity"}})
	b = zmtp.AppendFrameHeader(b, 0x04, len(body))
	return append(b, body...)
}

func testServer(t *testing.T, cfg ServerConfig) (*Server, protocol.Profile) {
	t.Helper()
	p, err := protocol.ProfileByName("0.33")
	require.NoError(t, err)
	if cfg.Payloads == nil {
		cfg.Payloads = servePayloads(t, p, "h", 1, 1)
	}
	srv := startServer(t, p, cfg)
	return srv, p
}

func requireServes(t *testing.T, srv *Server, p protocol.Profile) {
	t.Helper()
	res, err := Fetch(context.Background(), p, srv.Addr(), protocol.Rank{}, FetchOptions{Timeout: 10 * time.Second})
	require.NoError(t, err)
	require.NotEmpty(t, res.Payload)
}

// requireEmpty: every peer has left and nothing of them is held.
func requireEmpty(t *testing.T, srv *Server) {
	t.Helper()
	waitFor(t, "every connection released", func() bool {
		st := srv.Stats()
		return st.Open == 0 && st.Hosts == 0 && st.Queued == 0
	})
	srv.peersMu.Lock()
	defer srv.peersMu.Unlock()
	require.Empty(t, srv.peers)
	require.Empty(t, srv.hosts)
}

func TestHostileBytes(t *testing.T) {
	srv, p := testServer(t, ServerConfig{MaxRequestSize: 256})
	long := func(n uint64) []byte { return binary.BigEndian.AppendUint64([]byte{0x02}, n) }
	plain := zmtp.AppendGreeting(nil, 1)
	copy(plain[12:], "PLAIN")
	v2 := zmtp.AppendGreeting(nil, 1)[:12]
	v2[10] = 1
	cases := []struct {
		name string
		in   []byte
	}{
		{"http", []byte("GET / HTTP/1.1\r\nHost: x\r\n\r\n")},
		{"tls hello", []byte("\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + string(make([]byte, 80)))},
		{"zmtp 2.0 greeting", v2},
		{"plain mechanism", plain},
		{"pub socket", readyBytes("PUB")},
		{"rep socket", readyBytes("REP")},
		{"message before ready", append(zmtp.AppendGreeting(nil, 1), 0x00, 0x01, 'x')},
		{"reserved flags", append(readyBytes("REQ"), 0x80, 0x00)},
		{"100 MB frame claim", append(readyBytes("REQ"), long(100<<20)...)},
		{"2^63 frame claim", append(readyBytes("REQ"), long(1<<63)...)},
		{"oversized request", append(append(readyBytes("REQ"), 0x01, 0x00), append(long(300), make([]byte, 300)...)...)},
		{"many frames", append(readyBytes("DEALER"), bytes.Repeat([]byte{0x01, 0x00}, 100)...)},
		{"huge command", append(readyBytes("REQ"), append([]byte{0x06}, binary.BigEndian.AppendUint64(nil, 100<<20)...)...)},
		{"error command", append(readyBytes("REQ"), "\x04\x09\x05ERROR\x02no"...)},
	}
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	for i, tc := range cases {
		nc, err := net.DialTimeout("tcp", srv.Addr(), 10*time.Second)
		require.NoError(t, err)
		_, err = nc.Write(tc.in)
		require.NoError(t, err, tc.name)
		waitClosed(t, nc)
		_ = nc.Close()
		waitFor(t, tc.name+": counted", func() bool { return srv.Stats().Disconnects == uint64(i+1) })
	}
	runtime.ReadMemStats(&after)
	// Nothing was allocated for the 100 MB and 2^63 claims (the whole run allocates far less than one).
	assert.Less(t, after.TotalAlloc-before.TotalAlloc, uint64(32<<20))
	requireServes(t, srv, p)
	requireEmpty(t, srv)
	st := srv.Stats()
	assert.Equal(t, uint64(5), st.Dropped, "oversized: 100 MB, 2^63, 300 bytes, 100 frames, a 100 MB command")

	// Truncated frames: the peer closes mid-frame, mid-message, mid-greeting.
	for _, in := range [][]byte{
		zmtp.AppendGreeting(nil, 1)[:30],
		append(readyBytes("REQ"), 0x00, 0x10, 'a', 'b'),
		append(readyBytes("REQ"), 0x01, 0x00, 0x00),
		append(readyBytes("REQ"), 0x02, 0x00, 0x00),
	} {
		nc, err := net.DialTimeout("tcp", srv.Addr(), 10*time.Second)
		require.NoError(t, err)
		_, err = nc.Write(in)
		require.NoError(t, err)
		require.NoError(t, nc.(*net.TCPConn).CloseWrite())
		waitClosed(t, nc)
		_ = nc.Close()
	}
	waitFor(t, "truncations counted", func() bool { return srv.Stats().Disconnects == uint64(len(cases)+4) })
	requireServes(t, srv, p)
	requireEmpty(t, srv)
}

// Slowloris: a peer that sends its greeting a byte at a time is disconnected at the handshake deadline; one
// that trickles a message after its handshake is disconnected at the idle deadline.
func TestSlowloris(t *testing.T) {
	srv, p := testServer(t, ServerConfig{HandshakeTimeout: 300 * time.Millisecond, IdleTimeout: 300 * time.Millisecond})
	ctx, cancel := context.WithTimeout(context.Background(), patience)
	defer cancel()
	trickle := func(prefix, slow []byte) {
		nc, err := net.DialTimeout("tcp", srv.Addr(), 10*time.Second)
		require.NoError(t, err)
		defer nc.Close()
		_, err = nc.Write(prefix)
		require.NoError(t, err)
		var wg sync.WaitGroup
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ctx.Err() == nil; i++ {
				if _, err := nc.Write(slow[i%len(slow) : i%len(slow)+1]); err != nil {
					return // the server closed it
				}
				time.Sleep(50 * time.Millisecond)
			}
		}()
		waitClosed(t, nc)
		_ = nc.Close()
		wg.Wait()
	}
	trickle(nil, zmtp.AppendGreeting(nil, 1))
	trickle(append(readyBytes("REQ"), 0x00, 0xff), make([]byte, 255))
	waitFor(t, "both counted", func() bool { return srv.Stats().Disconnects == 2 })
	requireServes(t, srv, p)
	requireEmpty(t, srv)
}

// Idle connections beyond MaxConnections are closed at once; the server holds nothing of a peer once it has
// left, and serves again. (The handshake deadline that frees slots held by silent peers is TestSlowloris's.)
func TestConnectionCap(t *testing.T) {
	const limit, total = 50, 1000
	srv, p := testServer(t, ServerConfig{MaxConnections: limit, MaxConnectionsPerHost: limit, HandshakeTimeout: patience, EvictIdle: -1})
	var conns []net.Conn
	defer func() {
		for _, c := range conns {
			_ = c.Close()
		}
	}()
	maxOpen := 0
	for i := 0; i < total; i++ {
		nc, err := net.DialTimeout("tcp", srv.Addr(), 10*time.Second)
		require.NoError(t, err)
		conns = append(conns, nc)
		maxOpen = max(maxOpen, srv.Stats().Open)
	}
	waitFor(t, "every connection accepted or refused", func() bool {
		st := srv.Stats()
		maxOpen = max(maxOpen, st.Open)
		return st.Accepted+st.Refused == total
	})
	st := srv.Stats()
	assert.LessOrEqual(t, maxOpen, limit)
	assert.Equal(t, limit, st.Open)
	assert.Equal(t, uint64(limit), st.Accepted)
	assert.Equal(t, uint64(total-limit), st.Refused)
	for _, c := range conns {
		_ = c.Close()
	}
	conns = nil
	requireEmpty(t, srv)
	requireServes(t, srv, p)
}

// Many peers pipeline requests and never read a reply. Each connection holds at most MaxQueuedReplies
// replies (sharing the payload, not copies of it); a peer that cannot be written to within WriteTimeout is
// disconnected; the memory is returned when they leave. (Issue 13 saw +767 MB of RSS with libzmq.)
func TestPipeliningNonReaders(t *testing.T) {
	const clients, requests, queue = 200, 400, 4
	p, err := protocol.ProfileByName("0.33")
	require.NoError(t, err)
	payload := make([]byte, 64<<10)
	srv, _ := testServer(t, ServerConfig{
		Payloads:         map[protocol.Rank][]byte{{}: payload},
		MaxQueuedReplies: queue, WriteTimeout: 500 * time.Millisecond, RequestRate: -1, MaxConnections: 1000,
		SendBufferSize: 64 << 10,
	})
	req, err := p.EncodeRequest(protocol.Rank{})
	require.NoError(t, err)
	frame := append([]byte{0x01, 0x00, 0x00, byte(len(req))}, req...)
	var burst []byte
	for i := 0; i < requests; i++ {
		burst = append(burst, frame...)
	}

	runtime.GC()
	var base runtime.MemStats
	runtime.ReadMemStats(&base)
	rssBefore := vmRSS()

	// Small receive buffers (set before connecting) so that a few replies fill them.
	d := net.Dialer{Timeout: 10 * time.Second, Control: func(_, _ string, c syscall.RawConn) error {
		var serr error
		err := c.Control(func(fd uintptr) { serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, 4096) })
		return errors.Join(err, serr)
	}}
	var conns []net.Conn
	defer func() {
		for _, c := range conns {
			_ = c.Close()
		}
	}()
	for i := 0; i < clients; i++ {
		nc, err := d.Dial("tcp", srv.Addr())
		require.NoError(t, err)
		conns = append(conns, nc)
		require.NoError(t, nc.SetDeadline(time.Now().Add(patience)))
		_, err = zmtp.Handshake(nc, zmtp.Options{Type: zmtp.DEALER})
		require.NoError(t, err)
		_, err = nc.Write(burst) // the kernel takes it: the server stops reading when the queue is full
		require.NoError(t, err)
	}
	var peak, rssPeak uint64
	waitFor(t, "every non-reading peer disconnected", func() bool {
		var m runtime.MemStats
		runtime.ReadMemStats(&m)
		peak = max(peak, m.HeapInuse)
		rssPeak = max(rssPeak, vmRSS())
		st := srv.Stats()
		assert.LessOrEqual(t, st.Queued, clients*queue)
		return st.Disconnects == clients
	})
	st := srv.Stats()
	assert.LessOrEqual(t, st.QueueHighWater, queue)
	assert.Positive(t, st.QueueHighWater)
	assert.Less(t, st.Served, uint64(clients*requests), "non-readers were not served everything they asked")
	grew := int64(peak) - int64(base.HeapInuse)
	t.Logf("heap in use: %d MB before, peak %d MB while %d peers pipelined %d requests each (%d replies served); "+
		"RSS of the test process (both ends) %d MB before, peak %d MB", base.HeapInuse>>20, peak>>20, clients, requests,
		st.Served, rssBefore>>20, rssPeak>>20)
	assert.Less(t, grew, int64(100<<20), "heap grew by %d MB", grew>>20)
	for _, c := range conns {
		_ = c.Close()
	}
	conns = nil
	requireEmpty(t, srv)
}

// The per-host rate limit delays requests beyond the burst (and never loses them); two connections of one
// host share it; the host's state goes when its last connection does.
func TestRequestRateLimit(t *testing.T) {
	const rate, burst, n = 20, 5, 25
	srv, p := testServer(t, ServerConfig{RequestRate: rate, RequestBurst: burst})
	req, err := p.EncodeRequest(protocol.Rank{})
	require.NoError(t, err)
	a := dialZMTP(t, srv, zmtp.DEALER)
	b := dialZMTP(t, srv, zmtp.DEALER)
	waitFor(t, "both open", func() bool { return srv.Stats().Open == 2 })
	assert.Equal(t, 1, srv.Stats().Hosts, "one host")
	start := time.Now()
	for i := 0; i < n; i++ {
		c := a
		if i%2 == 1 {
			c = b
		}
		require.NoError(t, c.WriteMessage([][]byte{{}, req}))
	}
	for i := 0; i < n; i++ {
		c := a
		if i%2 == 1 {
			c = b
		}
		msg, err := c.ReadMessage()
		require.NoError(t, err)
		require.Len(t, msg, 3)
		require.NotEmpty(t, msg[1])
	}
	el := time.Since(start)
	assert.GreaterOrEqual(t, el, time.Duration(float64(n-burst)/rate*float64(time.Second))*9/10, "served faster than the rate")
	assert.Positive(t, srv.Stats().Throttled)
	assert.Equal(t, uint64(n), srv.Stats().Served)
	require.NoError(t, a.Close())
	require.NoError(t, b.Close())
	requireEmpty(t, srv)
}

// Lines about bad input are rate-limited; the suppressed count is reported.
func TestBadInputLogRateLimit(t *testing.T) {
	core, logs := observer.New(zapcore.DebugLevel)
	p, err := protocol.ProfileByName("0.33")
	require.NoError(t, err)
	srv, err := NewServer(context.Background(), p, ServerConfig{Logger: zap.New(core), LogLimit: 3, LogInterval: time.Hour, RequestRate: -1})
	require.NoError(t, err)
	c := dialZMTP(t, srv, zmtp.REQ)
	for i := 0; i < 20; i++ {
		require.NoError(t, c.WriteMessage([][]byte{{}, []byte("garbage")}))
		msg, err := c.ReadMessage()
		require.NoError(t, err)
		require.Empty(t, msg[1])
	}
	require.NoError(t, srv.Close())
	warns := logs.FilterLevelExact(zapcore.WarnLevel).All()
	require.Len(t, warns, 4, "3 lines and the summary: %v", warns)
	assert.Contains(t, warns[3].Message, "suppressed")
	assert.Equal(t, uint64(17), warns[3].ContextMap()["suppressed"])
	assert.Equal(t, uint64(20), srv.Stats().Rejected)
}

// A REQ socket whose reply arrives after the timeout must not read it as the next request's reply: our client
// reconnects after a timeout, like vLLM's fresh socket per handshake.
func TestClientTimeoutResetsConnection(t *testing.T) {
	p, err := protocol.ProfileByName("0.16")
	require.NoError(t, err)
	addr := serveLoopback(t, func(n int, nc net.Conn) {
		_ = nc.SetDeadline(time.Now().Add(patience))
		c, err := zmtp.Handshake(nc, zmtp.Options{Type: zmtp.ROUTER})
		if err != nil {
			return
		}
		for {
			msg, err := c.ReadMessage()
			if err != nil {
				return
			}
			if n == 1 {
				continue // the first connection never answers
			}
			if c.WriteMessage([][]byte{{}, []byte(fmt.Sprintf("reply-%d-%x", n, msg[1]))}) != nil {
				return
			}
		}
	})
	res, err := Fetch(context.Background(), p, addr, protocol.Rank{TP: 3},
		FetchOptions{Timeout: 300 * time.Millisecond, Attempts: 3, Backoff: time.Millisecond})
	require.NoError(t, err)
	req, _ := p.EncodeRequest(protocol.Rank{TP: 3})
	assert.Equal(t, fmt.Sprintf("reply-2-%x", req), string(res.Payload), "answered on the second connection")
}

// The client refuses a peer that is not a ZMTP ROUTER/REP, and a reply over MaxReplySize, with clear errors.
func TestClientHostileServers(t *testing.T) {
	p := protocol.Profiles[0]
	serve := func(handle func(nc net.Conn)) string {
		return serveLoopback(t, func(_ int, nc net.Conn) {
			_ = nc.SetDeadline(time.Now().Add(patience))
			handle(nc)
		})
	}
	opts := FetchOptions{Timeout: 5 * time.Second, Attempts: 1, MaxReplySize: 1 << 20}
	// An HTTP server.
	addr := serve(func(nc net.Conn) { _, _ = nc.Write([]byte("HTTP/1.1 400 Bad Request\r\n\r\n")) })
	_, err := Fetch(context.Background(), p, addr, protocol.Rank{}, opts)
	require.ErrorIs(t, err, ErrHandshake)
	// A PUB socket.
	addr = serve(func(nc net.Conn) {
		_, _ = nc.Write(readyBytes("PUB"))
		_, _ = io.Copy(io.Discard, nc)
	})
	_, err = Fetch(context.Background(), p, addr, protocol.Rank{}, opts)
	require.ErrorIs(t, err, ErrHandshake)
	require.ErrorIs(t, err, zmtp.ErrIncompatible)
	// A ROUTER that claims a 100 MB reply frame.
	addr = serve(func(nc net.Conn) {
		c, err := zmtp.Handshake(nc, zmtp.Options{Type: zmtp.ROUTER})
		if err != nil {
			return
		}
		if _, err := c.ReadMessage(); err != nil {
			return
		}
		_, _ = nc.Write(append([]byte{0x01, 0x00, 0x02}, binary.BigEndian.AppendUint64(nil, 100<<20)...))
		_, _ = io.Copy(io.Discard, nc)
	})
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	_, err = Fetch(context.Background(), p, addr, protocol.Rank{}, opts)
	runtime.ReadMemStats(&after)
	require.ErrorIs(t, err, zmtp.ErrTooLarge)
	assert.Less(t, after.TotalAlloc-before.TotalAlloc, uint64(16<<20))
}

// One host cannot take every slot: MaxConnectionsPerHost refuses its connections beyond the cap.
func TestConnectionCapPerHost(t *testing.T) {
	srv, p := testServer(t, ServerConfig{MaxConnections: 100, MaxConnectionsPerHost: 5, HandshakeTimeout: patience, EvictIdle: -1})
	var conns []net.Conn
	defer func() {
		for _, c := range conns {
			_ = c.Close()
		}
	}()
	for i := 0; i < 20; i++ {
		nc, err := net.DialTimeout("tcp", srv.Addr(), 10*time.Second)
		require.NoError(t, err)
		conns = append(conns, nc)
	}
	waitFor(t, "every connection accepted or refused", func() bool {
		st := srv.Stats()
		return st.Accepted+st.Refused == 20
	})
	st := srv.Stats()
	assert.Equal(t, uint64(5), st.Accepted)
	assert.Equal(t, 1, st.Hosts)
	for _, c := range conns {
		_ = c.Close()
	}
	conns = nil
	requireEmpty(t, srv)
	requireServes(t, srv, p)
}

// vmRSS returns this process's resident set size (0 where /proc is missing); for logging only.
func vmRSS() uint64 {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			var kb uint64
			_, _ = fmt.Sscanf(strings.TrimSpace(rest), "%d", &kb)
			return kb << 10
		}
	}
	return 0
}

// A client refused at the connection cap dials again within its attempt (libzmq's REQ reconnects too) and is
// served once a slot frees.
func TestClientRetriesAtConnectionCap(t *testing.T) {
	srv, p := testServer(t, ServerConfig{MaxConnections: 2, HandshakeTimeout: patience, EvictIdle: -1})
	var hogs []net.Conn
	for i := 0; i < 2; i++ {
		nc, err := net.DialTimeout("tcp", srv.Addr(), 10*time.Second)
		require.NoError(t, err)
		defer nc.Close()
		hogs = append(hogs, nc)
	}
	waitFor(t, "slots taken", func() bool { return srv.Stats().Open == 2 })
	type result struct {
		res Result
		err error
	}
	done := make(chan result, 1)
	go func() {
		r, err := Fetch(context.Background(), p, srv.Addr(), protocol.Rank{}, FetchOptions{Timeout: patience, Attempts: 1})
		done <- result{r, err}
	}()
	waitFor(t, "the client was refused at least once", func() bool { return srv.Stats().Refused > 0 })
	require.NoError(t, hogs[0].Close())
	r := <-done
	require.NoError(t, r.err)
	assert.NotEmpty(t, r.res.Payload)
}

// Close does not wait for a peer's write deadline: it closes every connection, blocked writers included.
func TestCloseWithBlockedWriters(t *testing.T) {
	p, err := protocol.ProfileByName("0.33")
	require.NoError(t, err)
	srv, err := NewServer(context.Background(), p, ServerConfig{
		Payloads:         map[protocol.Rank][]byte{{}: make([]byte, 1<<20)},
		WriteTimeout:     time.Hour,
		SendBufferSize:   64 << 10,
		RequestRate:      -1,
		MaxQueuedReplies: 2,
	})
	require.NoError(t, err)
	req, err := p.EncodeRequest(protocol.Rank{})
	require.NoError(t, err)
	var burst []byte
	for i := 0; i < 20; i++ {
		burst = append(burst, 0x01, 0x00, 0x00, byte(len(req)))
		burst = append(burst, req...)
	}
	for i := 0; i < 5; i++ {
		c := dialZMTP(t, srv, zmtp.DEALER)
		_, err := c.NetConn().Write(burst)
		require.NoError(t, err)
	}
	waitFor(t, "queues full", func() bool { return srv.Stats().Queued == 5*2 })
	start := time.Now()
	require.NoError(t, srv.Close())
	assert.Less(t, time.Since(start), patience, "Close waited for the write deadline")
	st := srv.Stats()
	assert.Equal(t, 0, st.Open)
	assert.Equal(t, 0, st.Queued)
	assert.Equal(t, uint64(0), st.Disconnects, "closing is not the peers' fault")
}
