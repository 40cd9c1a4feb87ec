package sidechannel

import (
	"net"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/gonixl/gonixl/connector/sidechannel/internal/zmtp"
)

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

// muteRouter serves ZMTP ROUTER handshakes on loopback and never answers a request; it returns its endpoint.
func muteRouter(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	require.NoError(t, err)
	var wg sync.WaitGroup
	var mu sync.Mutex
	var conns []net.Conn
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			nc, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, nc)
			mu.Unlock()
			wg.Add(1)
			go func() {
				defer wg.Done()
				c, err := zmtp.Handshake(nc, zmtp.Options{Type: zmtp.ROUTER, HandshakeTimeout: 10 * time.Second})
				if err != nil {
					return
				}
				for {
					if _, err := c.ReadMessage(); err != nil {
						return
					}
				}
			}()
		}
	}()
	t.Cleanup(func() {
		_ = ln.Close()
		mu.Lock()
		for _, c := range conns {
			_ = c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	return "tcp://" + ln.Addr().String()
}
