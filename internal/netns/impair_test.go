//go:build linux

package netns

import (
	"bytes"
	"crypto/rand"
	"io"
	"net"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/gonixl/gonixl/internal/testenv"
)

// tcpAcross connects a client in the decode namespace to a listener in the prefill namespace and returns both
// ends (the server's echoes whatever it reads when echo is set).
func tcpAcross(t *testing.T, p *Pair) (client, server net.Conn) {
	t.Helper()
	var ln net.Listener
	require.NoError(t, inNamespace(p.Prefill, func() (err error) {
		ln, err = net.Listen("tcp", PrefillIP+":0")
		return err
	}))
	defer ln.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			close(accepted)
			return
		}
		accepted <- c
	}()
	require.NoError(t, inNamespace(p.Decode, func() (err error) {
		d := net.Dialer{Timeout: 5 * time.Second}
		client, err = d.Dial("tcp", ln.Addr().String())
		return err
	}))
	server, ok := <-accepted
	require.True(t, ok)
	t.Cleanup(func() { _ = client.Close(); _ = server.Close() })
	return client, server
}

// rtt is the shortest of n one-byte round trips from client through an echoing server.
func rtt(t *testing.T, client, server net.Conn, n int) (lo, hi time.Duration) {
	t.Helper()
	b := make([]byte, 1)
	for i := 0; i < n; i++ {
		start := time.Now()
		_, err := client.Write(b)
		require.NoError(t, err)
		_, err = io.ReadFull(server, b)
		require.NoError(t, err)
		_, err = server.Write(b)
		require.NoError(t, err)
		_, err = io.ReadFull(client, b)
		require.NoError(t, err)
		d := time.Since(start)
		if i == 0 || d < lo {
			lo = d
		}
		hi = max(hi, d)
	}
	return lo, hi
}

func newTestPair(t *testing.T) *Pair {
	t.Helper()
	if err := Check(); err != nil {
		testenv.Missing(t, "network namespaces", err.Error())
	}
	if err := CheckIptables(); err != nil {
		testenv.Missing(t, "iptables", err.Error())
	}
	p, err := New("gonixl-test")
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, p.Close()) })
	return p
}

// Impair's delay holds every packet leaving either end 20 ± 5 ms (a round trip 30–50 ms, from well under 30 ms
// before), and is gone again after Close; its loss drops packets (counted) while a TCP transfer still arrives
// whole.
func TestImpair(t *testing.T) {
	p := newTestPair(t)
	client, server := tcpAcross(t, p)
	lo, hi := rtt(t, client, server, 5)
	t.Logf("round trip before: %v–%v", lo, hi)

	im, err := p.Impair(Impairment{Delay: 20 * time.Millisecond, Jitter: 5 * time.Millisecond})
	require.NoError(t, err)
	lo, hi = rtt(t, client, server, 10)
	t.Logf("round trip with 20 ± 5 ms each way: %v–%v (%d packets held)", lo, hi, im.Delayed())
	require.GreaterOrEqual(t, lo, 30*time.Millisecond, "both directions held at least 15 ms")
	require.GreaterOrEqual(t, im.Delayed(), int64(20), "both packets of each round trip went through the queues")
	short, long := im.Held()
	t.Logf("packets held %v–%v", short, long)
	require.GreaterOrEqual(t, short, 15*time.Millisecond)
	require.Less(t, long, time.Second)
	require.NoError(t, im.Close())
	require.NoError(t, im.Close(), "closing twice is not an error")
	lo, _ = rtt(t, client, server, 5)
	require.Less(t, lo, 20*time.Millisecond, "the delay is gone after Close")

	im, err = p.Impair(Impairment{Loss: 0.05, Delay: time.Millisecond})
	require.NoError(t, err)
	defer func() { require.NoError(t, im.Close()) }()
	data := make([]byte, 8<<20)
	_, _ = rand.Read(data)
	start := time.Now()
	errc := make(chan error, 1)
	go func() { _, err := client.Write(data); errc <- err }()
	got := make([]byte, len(data))
	_, err = io.ReadFull(server, got)
	require.NoError(t, err)
	require.NoError(t, <-errc)
	require.True(t, bytes.Equal(data, got), "the transfer arrived whole")
	dropped, err := im.Dropped()
	require.NoError(t, err)
	t.Logf("8 MiB over 5%% loss and 1 ms each way: %v, %d packets dropped, %d held", time.Since(start), dropped, im.Delayed())
	require.Positive(t, dropped, "the loss rule dropped packets")
}

// Closing a Delayer that holds packets releases them at once (not after their delay) and leaves no goroutine
// (TestMain's goleak).
func TestDelayerCloseReleases(t *testing.T) {
	p := newTestPair(t)
	client, server := tcpAcross(t, p)
	im, err := p.Impair(Impairment{Delay: 3 * time.Second})
	require.NoError(t, err)
	_, err = client.Write([]byte("x"))
	require.NoError(t, err)
	deadline := time.Now().Add(2 * time.Second)
	for im.Delayed() == 0 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	require.Positive(t, im.Delayed(), "the byte's packet is held")
	start := time.Now()
	require.NoError(t, im.Close())
	require.Less(t, time.Since(start), time.Second, "Close does not wait out the delay")
	require.NoError(t, server.SetReadDeadline(time.Now().Add(2*time.Second)))
	b := make([]byte, 1)
	_, err = io.ReadFull(server, b)
	require.NoError(t, err, "the held packet was released, not dropped")

	_, err = NewDelayer(p.Prefill, 1, time.Millisecond, 2*time.Millisecond)
	require.ErrorContains(t, err, "jitter")
	d, err := NewDelayer(p.Prefill, 1, time.Millisecond, 0)
	require.NoError(t, err)
	_, err = NewDelayer(p.Prefill, 1, time.Millisecond, 0)
	require.ErrorContains(t, err, "bound by another process", "one queue, one Delayer")
	require.NoError(t, d.Close())
}
