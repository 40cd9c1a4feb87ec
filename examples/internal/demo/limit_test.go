package demo

import (
	"bufio"
	"errors"
	"io"
	"net"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// keepAlive connects to addr, asks GET /health on a keep-alive connection, reads the answer and returns the
// connection, left idle (what a hostile client holds by the thousand).
func keepAlive(t *testing.T, addr string) net.Conn {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, 10*time.Second)
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close() })
	require.NoError(t, c.SetDeadline(time.Now().Add(30*time.Second)))
	require.Equal(t, http.StatusOK, getOn(t, c, "/health"))
	return c
}

// getOn asks GET path on the open connection c (keep-alive), reads the whole answer and returns its status.
func getOn(t *testing.T, c net.Conn, path string) int {
	t.Helper()
	_, err := io.WriteString(c, "GET "+path+" HTTP/1.1\r\nHost: x\r\n\r\n")
	require.NoError(t, err)
	res, err := http.ReadResponse(bufio.NewReader(c), nil)
	require.NoError(t, err)
	_, _ = io.Copy(io.Discard, res.Body)
	res.Body.Close()
	return res.StatusCode
}

// stillOpen reports whether the server has kept c open (a read times out instead of ending).
func stillOpen(c net.Conn) bool {
	_ = c.SetReadDeadline(time.Now().Add(20 * time.Millisecond))
	_, err := c.Read(make([]byte, 1))
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// Issue 22: idle keep-alive connections are capped (here 20; by default 1024, or a quarter of the fd limit
// after a reserve): 300 clients each holding one idle keep-alive connection leave at most 20 open, the server
// having closed those idle the longest, and a fresh client still gets /health. Before the fix all 300 stayed
// open (19,500 of them exhausted the fds: /health and the side channel stopped answering).
func TestHTTPConnectionCap(t *testing.T) {
	const limit, n = 20, 300
	health := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { _, _ = io.WriteString(w, "ok") })
	addr := serveShort(t, health, HTTPTimeouts{ReadHeader: time.Minute, Read: time.Minute, Write: time.Minute, Idle: time.Hour, MaxConns: limit})
	conns := make([]net.Conn, 0, n)
	for i := 0; i < n; i++ {
		conns = append(conns, keepAlive(t, addr))
	}
	open := 0
	for _, c := range conns {
		if stillOpen(c) {
			open++
		}
	}
	require.LessOrEqual(t, open, limit, "idle keep-alive connections left open")
	start := time.Now()
	keepAlive(t, addr)
	require.Less(t, time.Since(start), 10*time.Second)
	t.Logf("%d of %d idle keep-alive connections left open (cap %d)", open, n, limit)
}

// The default cap leaves room in the fd limit.
func TestMaxHTTPConnsDefault(t *testing.T) {
	m := maxHTTPConns()
	require.GreaterOrEqual(t, m, minHTTPConns)
	require.LessOrEqual(t, m, DefaultMaxHTTPConns)
}

// -notify-from's value: comma-separated, blanks dropped.
func TestSplitList(t *testing.T) {
	require.Nil(t, splitList(""))
	require.Equal(t, []string{"gonixl-d-1-tp0", "dec-*"}, splitList(" gonixl-d-1-tp0, ,dec-* "))
}
