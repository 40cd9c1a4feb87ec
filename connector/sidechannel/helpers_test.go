package sidechannel

import (
	"context"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/gonixl/gonixl/connector/protocol"
	"github.com/gonixl/gonixl/internal/zmtp"
)

// startServer starts a Server of profile p, closed at the end of the test.
func startServer(t *testing.T, p protocol.Profile, cfg ServerConfig) *Server {
	t.Helper()
	srv, err := NewServer(context.Background(), p, cfg)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, srv.Close()) })
	return srv
}

// dialZMTP opens a raw ZMTP connection of type st to srv (closed at the end of the test).
func dialZMTP(t *testing.T, srv *Server, st zmtp.SocketType) *zmtp.Conn {
	t.Helper()
	nc, err := net.DialTimeout("tcp", srv.Addr(), 10*time.Second)
	require.NoError(t, err)
	t.Cleanup(func() { _ = nc.Close() })
	_ = nc.SetDeadline(time.Now().Add(30 * time.Second))
	c, err := zmtp.Handshake(nc, zmtp.Options{Type: st})
	require.NoError(t, err)
	return c
}

// serveLoopback accepts TCP connections on a loopback port and serves the n-th (from 1) with handle in its own
// goroutine, closing the connection when handle returns. At the end of the test it closes the listener and
// every open connection, and waits for the handlers. It returns the address ("127.0.0.1:port").
func serveLoopback(t *testing.T, handle func(n int, nc net.Conn)) string {
	t.Helper()
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	require.NoError(t, err)
	var (
		wg     sync.WaitGroup
		mu     sync.Mutex
		conns  []net.Conn
		closed bool
	)
	wg.Add(1)
	go func() {
		defer wg.Done()
		for n := 1; ; n++ {
			nc, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			if closed {
				mu.Unlock()
				_ = nc.Close()
				return
			}
			conns = append(conns, nc)
			wg.Add(1)
			mu.Unlock()
			go func() {
				defer wg.Done()
				defer nc.Close()
				handle(n, nc)
			}()
		}
	}()
	t.Cleanup(func() {
		_ = ln.Close()
		mu.Lock()
		closed = true
		for _, c := range conns {
			_ = c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	return ln.Addr().String()
}

// muteRouter serves ZMTP ROUTER handshakes on loopback and never answers a request; it returns its endpoint.
func muteRouter(t *testing.T) string {
	t.Helper()
	return "tcp://" + serveLoopback(t, func(_ int, nc net.Conn) {
		c, err := zmtp.Handshake(nc, zmtp.Options{Type: zmtp.ROUTER, HandshakeTimeout: 10 * time.Second})
		if err != nil {
			return
		}
		for {
			if _, err := c.ReadMessage(); err != nil {
				return
			}
		}
	})
}
